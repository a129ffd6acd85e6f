//! Queued pushes: `close` hands a file's push to this queue and returns; pushes run many at
//! once, in order per file.
//!
//! The model, and why it holds:
//! - **Many in flight.** Each queued push is a task that waits for one of [`MAX_IN_FLIGHT`]
//!   permits, so a `tar -x` of many small files keeps the link busy instead of paying one
//!   round trip per `close`.
//! - **Ordered per file.** A push takes the file's staged image lock for its whole commit, so
//!   two pushes of one file never overlap, and each sends the image as it is when it starts
//!   (a push queued while another of the same file still waits is merged into it).
//! - **Namespace operations wait.** A rename or unlink of a file, or a rename or rmdir of a
//!   directory, first waits for the queued pushes it could overtake (the file's own; all of
//!   them for a directory), so the sandbox sees the operations in the order the program made
//!   them. A link pushes the file first; a chmod or utimens of a file with unpushed writes is
//!   applied after its push (under the same staged lock). Waiting is simpler than moving a queued push with a rename, and costs
//!   only the time of pushes that were already on their way.
//! - **A new file's first push settles first.** A file the sandbox does not have yet waits
//!   [`NEW_FILE_SETTLE`] before its push starts, and a rename or unlink of it in that time
//!   withdraws the queued push ([`PushQueue::withdraw`]) and is done here alone, the push then
//!   going to the new name (or nowhere): a save by rename (`pip`'s `.pyc`, editors, git's
//!   lock files) then costs one commit instead of a commit, a wait and a rename. Anyone
//!   waiting for pushes cuts the settling short.
//! - **Barriers.** `fsync`, `sbxfs ctl flush`, queries and unmount wait for what is queued.
//! - **Failures are kept.** A failed push leaves the data staged and is recorded
//!   ([`super::writeback::Failures`]): retried with backoff, reported by the file's next
//!   `close`/`fsync` (EIO) and in `ctl status`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Semaphore};

use super::inode::NodeId;

/// Pushes running at once: enough to cover an 80 ms round trip with small files (16 commits
/// per RTT), few enough that a burst does not open hundreds of connections to the agent.
pub const MAX_IN_FLIGHT: usize = 16;
/// How long a new file's queued push waits for a rename or unlink that would make it
/// needless (a program renames its temporary file right after closing it).
pub const NEW_FILE_SETTLE: std::time::Duration = std::time::Duration::from_millis(25);

pub struct PushQueue {
    state: Mutex<State>,
    /// Bumped whenever a push ends: waiters look again.
    ended: watch::Sender<u64>,
    /// Bumped whenever someone waits for pushes: settling ones start at once.
    hurry: watch::Sender<u64>,
    permits: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// Nodes with a push queued that has not started yet (a new request merges into it),
    /// and its ticket.
    waiting: HashMap<NodeId, u64>,
    /// Tickets whose push was withdrawn before it started.
    withdrawn: HashSet<u64>,
    next_ticket: u64,
    /// Pushes queued or running, per node.
    active: HashMap<NodeId, usize>,
}

impl Default for PushQueue {
    fn default() -> Self {
        PushQueue {
            state: Mutex::new(State::default()),
            ended: watch::channel(0).0,
            hurry: watch::channel(0).0,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        }
    }
}

/// A queued push that holds its place; [`PushQueue::start`] waits for its turn.
pub struct Ticket {
    node: NodeId,
    id: u64,
    /// Subscribed when queued: a wait that began since then cuts the settling short.
    hurry: watch::Receiver<u64>,
}

impl Ticket {
    /// Wait [`NEW_FILE_SETTLE`], or less if someone waits for pushes meanwhile.
    pub async fn settle(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep(NEW_FILE_SETTLE) => {}
            _ = self.hurry.changed() => {}
        }
    }
}

impl PushQueue {
    /// Queue a push of `node`; `None` when one is already waiting to start (it will send the
    /// latest image, this request's included).
    pub fn enqueue(&self, node: NodeId) -> Option<Ticket> {
        let mut st = self.state.lock().expect("push queue lock");
        if st.waiting.contains_key(&node) {
            return None;
        }
        st.next_ticket += 1;
        let id = st.next_ticket;
        st.waiting.insert(node, id);
        *st.active.entry(node).or_default() += 1;
        Some(Ticket {
            node,
            id,
            hurry: self.hurry.subscribe(),
        })
    }

    /// Wait for a free slot; from then on, a new request for the node queues another push.
    /// `None`: the push was withdrawn ([`Self::withdraw`]); the ticket is to be given back
    /// ([`Self::done`]) with nothing pushed.
    pub async fn start(&self, t: &Ticket) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.take_withdrawn(t) {
            return None;
        }
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the push semaphore is never closed");
        if self.take_withdrawn(t) {
            return None;
        }
        let mut st = self.state.lock().expect("push queue lock");
        if st.waiting.get(&t.node) == Some(&t.id) {
            st.waiting.remove(&t.node);
        }
        Some(permit)
    }

    fn take_withdrawn(&self, t: &Ticket) -> bool {
        self.state
            .lock()
            .expect("push queue lock")
            .withdrawn
            .remove(&t.id)
    }

    /// Withdraw the node's push that has not started yet: whether there was one. The caller
    /// queues the node again once it has done what made the push needless.
    pub fn withdraw(&self, node: NodeId) -> bool {
        let mut st = self.state.lock().expect("push queue lock");
        match st.waiting.remove(&node) {
            Some(id) => {
                st.withdrawn.insert(id);
                true
            }
            None => false,
        }
    }

    /// The push of a ticket ended (pushed or failed).
    pub fn done(&self, t: Ticket) {
        let mut st = self.state.lock().expect("push queue lock");
        if let Some(n) = st.active.get_mut(&t.node) {
            *n -= 1;
            if *n == 0 {
                st.active.remove(&t.node);
            }
        }
        drop(st);
        self.ended.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Pushes queued or running.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .expect("push queue lock")
            .active
            .values()
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nodes with pushes queued or running.
    pub fn nodes(&self) -> Vec<NodeId> {
        let st = self.state.lock().expect("push queue lock");
        st.active.keys().copied().collect()
    }

    /// Wait until none of `nodes` has a push queued or running.
    pub async fn wait_for(&self, nodes: &[NodeId]) {
        let mut rx = self.ended.subscribe();
        self.hurry.send_modify(|v| *v = v.wrapping_add(1));
        loop {
            {
                let st = self.state.lock().expect("push queue lock");
                if nodes.iter().all(|n| !st.active.contains_key(n)) {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Wait for every push queued now (not for ones queued later: a busy writer never holds a
    /// barrier for ever).
    pub async fn wait_all(&self) {
        let nodes = self.nodes();
        self.wait_for(&nodes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_request_merges_into_a_waiting_push() {
        let q = PushQueue::default();
        let t = q.enqueue(NodeId(5)).expect("queued");
        assert!(q.enqueue(NodeId(5)).is_none(), "merged while waiting");
        let p = q.start(&t).await;
        let t2 = q
            .enqueue(NodeId(5))
            .expect("a new push once the first started");
        assert_eq!(q.len(), 2);
        drop(p);
        q.done(t);
        assert_eq!(q.len(), 1);
        let _p2 = q.start(&t2).await;
        q.done(t2);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_withdrawn_push_does_not_start_and_the_next_one_does() {
        let q = PushQueue::default();
        let t = q.enqueue(NodeId(3)).unwrap();
        assert!(q.withdraw(NodeId(3)));
        assert!(!q.withdraw(NodeId(3)), "nothing left to withdraw");
        // Queued again (by whoever withdrew it) before the withdrawn one woke up.
        let t2 = q.enqueue(NodeId(3)).expect("a new push");
        assert!(q.start(&t).await.is_none());
        q.done(t);
        let p = q.start(&t2).await.expect("the new push starts");
        assert!(!q.withdraw(NodeId(3)), "a started push is not withdrawn");
        drop(p);
        q.done(t2);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_cuts_the_settling_short() {
        let q = Arc::new(PushQueue::default());
        let mut t = q.enqueue(NodeId(9)).unwrap();
        let settled = tokio::spawn(async move {
            let at = tokio::time::Instant::now();
            t.settle().await;
            at.elapsed()
        });
        tokio::task::yield_now().await;
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.wait_for(&[NodeId(9)]).await });
        let took = settled.await.unwrap();
        assert!(took < NEW_FILE_SETTLE, "settled for {took:?}");
        waiter.abort();
        // Alone, it settles for the whole time.
        let mut t = q.enqueue(NodeId(10)).unwrap();
        let at = tokio::time::Instant::now();
        t.settle().await;
        assert!(at.elapsed() >= NEW_FILE_SETTLE);
    }

    #[tokio::test]
    async fn waiters_wake_when_the_push_ends() {
        let q = Arc::new(PushQueue::default());
        let t = q.enqueue(NodeId(7)).unwrap();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.wait_for(&[NodeId(7)]).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.done(t);
        waiter.await.unwrap();
        // Nothing queued: no wait at all.
        q.wait_all().await;
    }
}
