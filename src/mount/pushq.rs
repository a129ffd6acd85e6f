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

pub struct PushQueue {
    state: Mutex<State>,
    /// Bumped whenever a push ends: waiters look again.
    ended: watch::Sender<u64>,
    permits: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// Nodes with a push queued that has not started yet (a new request merges into it).
    waiting: HashSet<NodeId>,
    /// Pushes queued or running, per node.
    active: HashMap<NodeId, usize>,
}

impl Default for PushQueue {
    fn default() -> Self {
        PushQueue {
            state: Mutex::new(State::default()),
            ended: watch::channel(0).0,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        }
    }
}

/// A queued push that holds its place; [`PushQueue::start`] waits for its turn.
pub struct Ticket {
    node: NodeId,
}

impl PushQueue {
    /// Queue a push of `node`; `None` when one is already waiting to start (it will send the
    /// latest image, this request's included).
    pub fn enqueue(&self, node: NodeId) -> Option<Ticket> {
        let mut st = self.state.lock().expect("push queue lock");
        if !st.waiting.insert(node) {
            return None;
        }
        *st.active.entry(node).or_default() += 1;
        Some(Ticket { node })
    }

    /// Wait for a free slot; from then on, a new request for the node queues another push.
    pub async fn start(&self, t: &Ticket) -> tokio::sync::OwnedSemaphorePermit {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the push semaphore is never closed");
        self.state
            .lock()
            .expect("push queue lock")
            .waiting
            .remove(&t.node);
        permit
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
