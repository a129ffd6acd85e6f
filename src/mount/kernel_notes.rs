//! Kernel cache invalidations, sent from one thread of their own and never from a request's:
//! the kernel may need a lock held by the very request that caused one, and that request can
//! only finish once we reply. One thread, fed by a queue, so a burst of changes in the sandbox
//! does not start a thread per change.
//!
//! The kernel ends a file at a short READ only if the node's attributes did not change while
//! the READ was out; otherwise the rest is zero-filled up to the size the kernel knew, bytes
//! that were never in the file. A file the sandbox rewrites in place is read short exactly
//! when the change feed reports it, and one `read()` is several READs, each of which may meet
//! another length. So, at most [`MAX_HOLD`] each: a node's invalidation, and an answer with
//! its attributes (GETATTR, LOOKUP), wait for the READs of it that are out, and a short
//! answer waits for the READs of the node below its offset (the first
//! end the kernel is told of is then the lowest; a higher one, told after it changed the
//! attributes, cannot shrink the file, and is past its new end anyway).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::INodeNo;

use super::core::KernelCache;
use super::inode::NodeId;

/// Longest an invalidation waits for reads of its node.
pub const MAX_HOLD: Duration = Duration::from_millis(200);

pub enum Note {
    Data(NodeId),
    Attr(NodeId),
    Entry(NodeId, Vec<u8>),
    /// The last READ of this node was answered: what waited for it may go.
    Released(NodeId),
    /// Everything queued before it was sent.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// What waits for a node's reads: its pages too, or its attributes only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    Attr,
    Data,
}

#[derive(Default)]
struct Reading {
    /// The READs out, by number, with their offsets.
    out: Vec<(u64, u64)>,
    held: Option<(Held, Instant)>,
}

/// The queue of notes, and the READs the kernel waits for, by node.
pub struct KernelNotes {
    queue: Mutex<Sender<Note>>,
    reading: Mutex<HashMap<u64, Reading>>,
    next_read: std::sync::atomic::AtomicU64,
    /// Told each time a READ is answered.
    answered: tokio::sync::Notify,
}

/// A READ the kernel waits for; dropped once it is answered.
pub struct ReadInFlight {
    notes: Arc<KernelNotes>,
    node: u64,
    number: u64,
    offset: u64,
}

impl ReadInFlight {
    /// Wait (at most [`MAX_HOLD`]) until no READ of this node below this one's offset is out.
    pub async fn after_lower_reads(&self) {
        self.notes
            .wait_until(self.node, |&(n, o)| n != self.number && o < self.offset)
            .await
    }
}

impl Drop for ReadInFlight {
    fn drop(&mut self) {
        let mut reading = self.notes.lock();
        let Some(r) = reading.get_mut(&self.node) else {
            return;
        };
        r.out.retain(|&(n, _)| n != self.number);
        if r.out.is_empty() {
            if r.held.is_some() {
                // Kept until the thread takes what waits ([`KernelNotes::release`]).
                drop(reading);
                self.notes.send(Note::Released(NodeId(self.node)));
            } else {
                reading.remove(&self.node);
            }
        }
        self.notes.answered.notify_waiters();
    }
}

impl KernelNotes {
    /// The notes, and the end the sending thread ([`start`]) reads.
    pub fn new() -> (Arc<KernelNotes>, Receiver<Note>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let notes = KernelNotes {
            queue: Mutex::new(tx),
            reading: Mutex::new(HashMap::new()),
            next_read: Default::default(),
            answered: tokio::sync::Notify::new(),
        };
        (Arc::new(notes), rx)
    }

    /// The kernel sent a READ of `node` at `offset`; its invalidations wait until the guard
    /// is dropped.
    pub fn reading(self: &Arc<Self>, node: u64, offset: u64) -> ReadInFlight {
        let number = self
            .next_read
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock()
            .entry(node)
            .or_default()
            .out
            .push((number, offset));
        ReadInFlight {
            notes: self.clone(),
            node,
            number,
            offset,
        }
    }

    /// Wait (at most [`MAX_HOLD`]) until the READs of `node` out now are answered: an answer
    /// carrying its attributes goes after them.
    pub async fn after_reads_out(&self, node: u64) {
        let reads: Vec<u64> = match self.lock().get(&node) {
            Some(r) => r.out.iter().map(|&(n, _)| n).collect(),
            None => return,
        };
        self.wait_until(node, |(n, _)| reads.contains(n)).await
    }

    /// Wait (at most [`MAX_HOLD`]) until no READ of `node` out is one that `blocks`.
    async fn wait_until(&self, node: u64, blocks: impl Fn(&(u64, u64)) -> bool) {
        let _ = tokio::time::timeout(MAX_HOLD, async {
            loop {
                let answered = self.answered.notified();
                if !self
                    .lock()
                    .get(&node)
                    .is_some_and(|r| r.out.iter().any(&blocks))
                {
                    return;
                }
                answered.await;
            }
        })
        .await;
    }

    fn send(&self, note: Note) {
        let _ = self.queue.lock().expect("notes queue").send(note);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Reading>> {
        self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `what` for `node` must wait for reads (then it is kept, merged with what
    /// already waits).
    fn hold(&self, node: u64, what: Held, now: Instant) -> bool {
        let mut reading = self.lock();
        let Some(r) = reading.get_mut(&node).filter(|r| !r.out.is_empty()) else {
            return false;
        };
        r.held = Some(match r.held {
            Some((was, since)) => (was.max_with(what), since),
            None => (what, now),
        });
        true
    }

    /// What waited for `node`'s reads, now that none is out.
    fn release(&self, node: u64) -> Option<Held> {
        let mut reading = self.lock();
        let r = reading.get_mut(&node)?;
        if !r.out.is_empty() {
            return None;
        }
        let held = r.held.take().map(|(h, _)| h);
        reading.remove(&node);
        held
    }

    /// What waited past `MAX_HOLD` at `now` (everything, with `all`): it goes now.
    fn due(&self, now: Instant, all: bool) -> Vec<(u64, Held)> {
        let mut out = Vec::new();
        let mut reading = self.lock();
        for (node, r) in reading.iter_mut() {
            if let Some((h, since)) = r.held {
                if all || now.saturating_duration_since(since) >= MAX_HOLD {
                    r.held = None;
                    out.push((*node, h));
                }
            }
        }
        reading.retain(|_, r| !r.out.is_empty() || r.held.is_some());
        out
    }
}

impl Held {
    fn max_with(self, other: Held) -> Held {
        if self == Held::Data || other == Held::Data {
            Held::Data
        } else {
            Held::Attr
        }
    }
}

/// Start the thread that sends `notes` to the kernel. Errors say the kernel did not have that
/// node or name cached: nothing to drop.
pub fn start(notes: Arc<KernelNotes>, rx: Receiver<Note>, kernel: Arc<fuser::Notifier>) {
    let inval = move |kernel: &fuser::Notifier, node: u64, what: Held| {
        let offset = if what == Held::Data { 0 } else { -1 };
        let _ = kernel.inval_inode(INodeNo(node), offset, 0);
    };
    let spawned = std::thread::Builder::new()
        .name("sbxfs-notify".into())
        .spawn(move || loop {
            let note = match rx.recv_timeout(MAX_HOLD / 4) {
                Ok(note) => Some(note),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let now = Instant::now();
            let mut barrier = None;
            match note {
                Some(Note::Data(n)) if !notes.hold(n.0, Held::Data, now) => {
                    inval(&kernel, n.0, Held::Data)
                }
                Some(Note::Attr(n)) if !notes.hold(n.0, Held::Attr, now) => {
                    inval(&kernel, n.0, Held::Attr)
                }
                Some(Note::Data(_) | Note::Attr(_)) | None => {}
                Some(Note::Released(n)) => {
                    if let Some(h) = notes.release(n.0) {
                        inval(&kernel, n.0, h);
                    }
                }
                Some(Note::Entry(p, name)) => {
                    let _ = kernel.inval_entry(INodeNo(p.0), OsStr::from_bytes(&name));
                }
                Some(Note::Barrier(done)) => barrier = Some(done),
            }
            // A barrier promises everything asked before it: what still waits goes too.
            for (node, h) in notes.due(now, barrier.is_some()) {
                inval(&kernel, node, h);
            }
            if let Some(done) = barrier {
                let _ = done.send(());
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the kernel notification thread: {e}");
    }
}

/// The core's way to the kernel's caches: notes on the queue.
pub struct Notifier(pub Arc<KernelNotes>);

impl KernelCache for Notifier {
    fn invalidate_data(&self, node: NodeId) {
        self.0.send(Note::Data(node));
    }

    fn invalidate_attr(&self, node: NodeId) {
        self.0.send(Note::Attr(node));
    }

    fn invalidate_entry(&self, parent: NodeId, name: &[u8]) {
        self.0.send(Note::Entry(parent, name.to_vec()));
    }

    fn barrier(&self, done: tokio::sync::oneshot::Sender<()>) {
        self.0.send(Note::Barrier(done));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidation_waits_for_the_reads_of_its_node_and_no_longer() {
        let (notes, rx) = KernelNotes::new();
        let t0 = Instant::now();
        // No read out: nothing waits.
        assert!(!notes.hold(7, Held::Attr, t0));
        let first = notes.reading(7, 0);
        let second = notes.reading(7, 4096);
        assert!(notes.hold(7, Held::Attr, t0));
        assert!(notes.hold(7, Held::Data, t0));
        assert!(!notes.hold(8, Held::Data, t0), "another node's reads");
        drop(first);
        assert_eq!(notes.release(7), None, "a read is still out");
        assert!(rx.try_recv().is_err());
        drop(second);
        // The last answer wakes the thread, which sends the merged note once.
        assert!(matches!(rx.try_recv(), Ok(Note::Released(NodeId(7)))));
        assert_eq!(notes.release(7), Some(Held::Data));
        assert_eq!(notes.release(7), None);
        assert!(
            notes.lock().is_empty(),
            "nothing is kept for a node no one reads"
        );
    }

    #[test]
    fn a_held_invalidation_goes_after_max_hold_or_at_a_barrier() {
        let (notes, _rx) = KernelNotes::new();
        let t0 = Instant::now();
        let _read = notes.reading(3, 0);
        assert!(notes.hold(3, Held::Attr, t0));
        assert!(notes.due(t0 + MAX_HOLD / 2, false).is_empty());
        assert_eq!(notes.due(t0 + MAX_HOLD, false), vec![(3, Held::Attr)]);
        assert!(notes.due(t0 + MAX_HOLD * 2, false).is_empty(), "sent once");
        assert!(notes.hold(3, Held::Data, t0));
        assert_eq!(notes.due(t0, true), vec![(3, Held::Data)]);
    }

    #[tokio::test]
    async fn a_short_answer_waits_for_the_reads_below_it() {
        let (notes, _rx) = KernelNotes::new();
        let low = notes.reading(5, 0);
        let high = notes.reading(5, 1 << 20);
        let other = notes.reading(6, 0);
        // The low read's answer need not wait for the high one.
        tokio::time::timeout(MAX_HOLD / 4, low.after_lower_reads())
            .await
            .expect("nothing below the lowest read");
        let waiting = tokio::spawn(async move {
            high.after_lower_reads().await;
            Instant::now()
        });
        tokio::time::sleep(MAX_HOLD / 10).await;
        assert!(!waiting.is_finished(), "the low read is still out");
        drop(other);
        tokio::time::sleep(MAX_HOLD / 10).await;
        assert!(
            !waiting.is_finished(),
            "another node's answer is not the low read's"
        );
        let answered = Instant::now();
        drop(low);
        let done = waiting.await.unwrap();
        assert!(done >= answered);
        assert!(done - answered < MAX_HOLD / 2);
    }
}
