//! Local events for changes made in the sandbox: editors' file watchers (inotify) and
//! `sbxfs watch` learn of what the agent does inside the sandbox.
//!
//! The kernel raises inotify events only for operations that pass through its VFS, and gives a
//! FUSE daemon no call that posts one. So one thread of the daemon's own (the *echo thread*)
//! repeats each sandbox-side change on the mountpoint — a create, an `open(O_WRONLY)` with a
//! same-size `ftruncate` and `close`, an unlink, a rename — and the filesystem, recognising
//! that thread's requests by their pid ([`Echoes::is_echo`]), answers them from what it already
//! knows ([`Plan`]), with no remote call and no change to any file, its times or the push queue.
//! The VFS raises the events on the way.
//!
//! Bounded: at most one echo per path per [`SPACING`] (later changes wait and merge), at most
//! [`MAX_QUEUED`] paths waiting (beyond, a change is folded into one attribute event on its
//! directory), and a change whose directory the kernel does not hold (nobody can be watching
//! it) is not echoed at all. The echo thread never holds a lock the FUSE workers need.
//!
//! The same changes, numbered, feed `sbxfs watch` ([`Echoes::subscribe`]): a ring of the last
//! [`KEPT`] lets a watcher resume with `--since`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::inode::NodeId;
use crate::remote::RemotePath;

/// The file handle of the echo thread's opens: never one of the handle table's.
pub const ECHO_FH: u64 = u64::MAX - 7;
/// Least time between two echoes of one path.
pub const SPACING: Duration = Duration::from_secs(1);
/// Most paths waiting for an echo.
pub const MAX_QUEUED: usize = 4096;
/// How long a removal waits for the rename it may be the first half of.
pub const MOVE_WAIT: Duration = Duration::from_millis(250);
/// Changes kept for `sbxfs watch --since`.
pub const KEPT: usize = 65_536;

/// What changed in the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Created,
    Modified,
    Deleted,
    Renamed,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::Created => "created",
            Kind::Modified => "modified",
            Kind::Deleted => "deleted",
            Kind::Renamed => "renamed",
        }
    }
}

/// One sandbox-side change, as `sbxfs watch` prints it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Seen {
    pub seq: u64,
    pub kind: Kind,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// A change to echo on the mountpoint. `node`: for a removal or a rename, the node the name
/// led to when the change was reported (the caches forget the name before the echo runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Job {
    Created(RemotePath),
    Modified(RemotePath),
    Removed(RemotePath, Option<NodeId>),
    Renamed(RemotePath, RemotePath, Option<NodeId>),
    /// An attribute event on this path: only its attributes changed (a chmod, a chown), or
    /// (a directory) too many changes at once, for which one event stands.
    Touched(RemotePath),
}

impl Job {
    /// The node reference a removal or rename holds.
    fn node(&self) -> Option<NodeId> {
        match self {
            Job::Removed(_, n) | Job::Renamed(_, _, n) => *n,
            _ => None,
        }
    }

    fn path(&self) -> &RemotePath {
        match self {
            Job::Created(p)
            | Job::Modified(p)
            | Job::Removed(p, _)
            | Job::Renamed(p, _, _)
            | Job::Touched(p) => p,
        }
    }
}

/// What the echo thread's current operation may be answered, name by name.
#[derive(Default)]
pub struct Plan {
    names: Vec<PlannedName>,
}

/// A name in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    /// It leads to the node (a lookup answers it).
    Present(NodeId),
    /// A lookup answers ENOENT.
    Absent,
    /// A lookup answers ENOENT, and the create (mkdir, symlink) that follows answers the node.
    ToMake(NodeId),
}

struct PlannedName {
    parent: NodeId,
    name: Vec<u8>,
    is: Name,
    /// The lookup reference taken for the plan has been handed to the kernel.
    handed: bool,
}

/// How the echo thread's request about a name is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Planned {
    /// Not planned: answered from the caches, or absent.
    No,
    Absent,
    /// The node; `counted`: its lookup reference is already taken.
    Node {
        node: NodeId,
        counted: bool,
    },
}

#[derive(Default)]
struct Queue {
    /// Waiting jobs by path, each with when it may run.
    waiting: BTreeMap<RemotePath, (Instant, Job)>,
    /// Node references of jobs merged or dropped, for the echo thread to give back.
    released: Vec<NodeId>,
    /// When each path was last echoed (pruned past [`SPACING`]).
    last: HashMap<RemotePath, Instant>,
    /// Where renames echoed lately moved their names to (pruned past [`SPACING`]).
    moved_to: HashMap<RemotePath, Instant>,
    stopped: bool,
}

#[derive(Default)]
struct Ring {
    next: u64,
    kept: VecDeque<Seen>,
}

/// Counters for `ctl stats`.
#[derive(Default, Debug, serde::Serialize)]
pub struct EchoStats {
    pub echoed: AtomicU64,
    pub folded: AtomicU64,
    pub skipped: AtomicU64,
    pub failed: AtomicU64,
}

/// The echo thread's state: one owner for the queue, the plan and the watchers' ring.
pub struct Echoes {
    tid: AtomicU32,
    plan: Mutex<Plan>,
    queue: Mutex<Queue>,
    wake: Condvar,
    ring: Mutex<Ring>,
    watchers: tokio::sync::broadcast::Sender<Seen>,
    /// Files whose creation was echoed with their content (their version then): a change
    /// reported after it that leaves them so raises nothing more.
    made: Mutex<std::collections::HashMap<RemotePath, crate::remote::Version>>,
    pub stats: EchoStats,
}

/// Most created files remembered for [`Echoes::made_as`]: past it, the memory starts again
/// (a forgotten one raises one more modify).
const MAX_MADE: usize = 4096;

impl Default for Echoes {
    fn default() -> Self {
        Echoes {
            tid: AtomicU32::new(0),
            plan: Mutex::new(Plan::default()),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            ring: Mutex::new(Ring::default()),
            watchers: tokio::sync::broadcast::channel(4096).0,
            made: Default::default(),
            stats: EchoStats::default(),
        }
    }
}

impl Echoes {
    /// The echo made `path` holding its content at `version`.
    pub(in crate::mount) fn note_made(&self, path: &RemotePath, version: crate::remote::Version) {
        let mut m = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_MADE {
            m.clear();
        }
        m.insert(path.clone(), version);
    }

    /// Whether `path` is as its echoed creation made it (then a modify adds nothing).
    pub(in crate::mount) fn made_as(
        &self,
        path: &RemotePath,
        version: &crate::remote::Version,
    ) -> bool {
        let mut m = self.made.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(path).is_some_and(|v| &v == version)
    }

    /// Whether a request comes from the echo thread.
    pub fn is_echo(&self, pid: u32) -> bool {
        pid != 0 && self.tid.load(Ordering::Relaxed) == pid
    }

    /// The calling thread is the echo thread from now on.
    pub fn claim_thread(&self) {
        // SAFETY: gettid has no preconditions.
        self.tid
            .store(unsafe { libc::gettid() } as u32, Ordering::SeqCst);
    }

    /// A change the sandbox reported, queued for its echo (and numbered for watchers when it
    /// is taken: what a later report cancels is never shown).
    pub fn sandbox_changed(&self, job: Job) {
        let now = Instant::now();
        let mut q = self.queue.lock().expect("echo queue");
        if q.stopped {
            q.released.extend(job.node());
            return;
        }
        // A rename's target is often reported as created as well: the move said it.
        if let Job::Created(p) = &job {
            let moved_here = |j: &Job| matches!(j, Job::Renamed(_, to, _) if to == p);
            let recent = q
                .moved_to
                .get(p)
                .is_some_and(|t| now.duration_since(*t) < SPACING);
            if recent || q.waiting.values().any(|(_, j)| moved_here(j)) {
                return;
            }
        }
        // And its halves, still waiting, are said by the move.
        if let Job::Renamed(from, to, _) = &job {
            if matches!(q.waiting.get(from), Some((_, Job::Removed(..)))) {
                let half = q.waiting.remove(from).and_then(|(_, j)| j.node());
                q.released.extend(half);
            }
            if matches!(q.waiting.get(to), Some((_, Job::Created(_)))) {
                q.waiting.remove(to);
            }
        }
        let path = job.path().clone();
        // A removal may be the first half of a rename whose whole follows at once.
        let soonest = match job {
            Job::Removed(..) => now + MOVE_WAIT,
            _ => now,
        };
        let due = q
            .last
            .get(&path)
            .map_or(soonest, |t| (*t + SPACING).max(soonest));
        if let Some((_, waiting)) = q.waiting.get_mut(&path) {
            // The later job is what happened last; the earlier one's reference goes.
            let before = std::mem::replace(waiting, Job::Touched(RemotePath::root()));
            *waiting = merged(&before, job);
            q.released.extend(before.node());
        } else if q.waiting.len() >= MAX_QUEUED {
            self.stats.folded.fetch_add(1, Ordering::Relaxed);
            q.released.extend(job.node());
            let dir = path
                .split_last()
                .map(|(d, _)| d)
                .unwrap_or_else(RemotePath::root);
            if !q.waiting.contains_key(&dir) {
                q.waiting.insert(dir.clone(), (due, Job::Touched(dir)));
            }
        } else {
            q.waiting.insert(path, (due, job));
        }
        drop(q);
        self.wake.notify_one();
    }

    /// The next job due, waiting for one; `None` once stopped.
    pub fn next_job(&self) -> Option<Job> {
        let mut q = self.queue.lock().expect("echo queue");
        loop {
            if q.stopped {
                return None;
            }
            let now = Instant::now();
            q.last.retain(|_, t| now.duration_since(*t) < SPACING);
            q.moved_to.retain(|_, t| now.duration_since(*t) < SPACING);
            let due = q
                .waiting
                .iter()
                .filter(|(_, (at, _))| *at <= now)
                .map(|(p, _)| p.clone())
                .next();
            if let Some(path) = due {
                let (_, job) = q.waiting.remove(&path).expect("just seen");
                if let Job::Renamed(_, to, _) = &job {
                    q.moved_to.insert(to.clone(), now);
                }
                q.last.insert(path, now);
                return Some(job);
            }
            let wait = q
                .waiting
                .values()
                .map(|(at, _)| at.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(3600));
            q = self.wake.wait_timeout(q, wait).expect("echo queue").0;
        }
    }

    /// Node references of jobs merged or dropped, to give back.
    pub fn released(&self) -> Vec<NodeId> {
        std::mem::take(&mut self.queue.lock().expect("echo queue").released)
    }

    /// No more echoes (the mount is ending).
    pub fn stop(&self) {
        self.queue.lock().expect("echo queue").stopped = true;
        self.wake.notify_all();
    }

    /// Set the plan for the echo thread's next operation. Each node in it holds one lookup
    /// reference taken for the plan.
    pub fn set_plan(&self, names: Vec<(NodeId, Vec<u8>, Name)>) {
        self.plan.lock().expect("echo plan").names = names
            .into_iter()
            .map(|(parent, name, is)| PlannedName {
                parent,
                name,
                is,
                handed: false,
            })
            .collect();
    }

    /// End the plan: the nodes whose reference was never handed to the kernel (to give back).
    pub fn end_plan(&self) -> Vec<NodeId> {
        let names = std::mem::take(&mut self.plan.lock().expect("echo plan").names);
        names
            .into_iter()
            .filter(|n| !n.handed)
            .filter_map(|n| match n.is {
                Name::Present(node) | Name::ToMake(node) => Some(node),
                Name::Absent => None,
            })
            .collect()
    }

    /// How the echo thread's lookup (`making`: false) or create, mkdir or symlink (`making`:
    /// true) of `name` in `parent` is answered.
    pub fn planned(&self, parent: NodeId, name: &[u8], making: bool) -> Planned {
        let mut plan = self.plan.lock().expect("echo plan");
        let Some(p) = plan
            .names
            .iter_mut()
            .find(|n| n.parent == parent && n.name == name)
        else {
            return Planned::No;
        };
        match (p.is, making) {
            (Name::Present(node), false) | (Name::ToMake(node), true) => {
                let counted = !p.handed;
                p.handed = true;
                Planned::Node { node, counted }
            }
            _ => Planned::Absent,
        }
    }

    /// What the plan says of a name, changing nothing.
    pub fn peek(&self, parent: NodeId, name: &[u8]) -> Option<Name> {
        let plan = self.plan.lock().expect("echo plan");
        plan.names
            .iter()
            .find(|n| n.parent == parent && n.name == name)
            .map(|n| n.is)
    }

    /// Number a change for watchers, as the echo thread settled it.
    pub fn publish(&self, job: &Job) {
        let (kind, path, to) = match job {
            Job::Created(p) => (Kind::Created, p, None),
            Job::Modified(p) => (Kind::Modified, p, None),
            Job::Removed(p, _) => (Kind::Deleted, p, None),
            Job::Renamed(p, to, _) => (Kind::Renamed, p, Some(to.display())),
            Job::Touched(p) => (Kind::Modified, p, None),
        };
        let mut ring = self.ring.lock().expect("echo ring");
        ring.next += 1;
        let seen = Seen {
            seq: ring.next,
            kind,
            path: path.display(),
            to,
        };
        if ring.kept.len() == KEPT {
            ring.kept.pop_front();
        }
        ring.kept.push_back(seen.clone());
        // No watcher: nothing to do.
        let _ = self.watchers.send(seen);
    }

    /// A watcher: the kept changes after `since` (`None`: none), then a stream of new ones.
    /// `Err(first)`: changes after `since` are no longer kept (the first kept is `first`).
    pub fn subscribe(
        &self,
        since: Option<u64>,
    ) -> (
        std::result::Result<Vec<Seen>, u64>,
        tokio::sync::broadcast::Receiver<Seen>,
    ) {
        let ring = self.ring.lock().expect("echo ring");
        let rx = self.watchers.subscribe();
        let Some(since) = since else {
            return (Ok(Vec::new()), rx);
        };
        let first = ring.kept.front().map_or(ring.next + 1, |s| s.seq);
        // A number from before a remount (numbering starts again at each mount), or changes
        // no longer kept.
        if since > ring.next || (since + 1 < first && since < ring.next) {
            return (Err(first), rx);
        }
        let after = ring
            .kept
            .iter()
            .filter(|s| s.seq > since)
            .cloned()
            .collect();
        (Ok(after), rx)
    }

    /// The last change's number (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.ring.lock().expect("echo ring").next
    }
}

/// Two changes to one path waiting together: a create then a change is still a create; a
/// removal or rename is what happened last.
fn merged(first: &Job, then: Job) -> Job {
    match (first, &then) {
        (Job::Created(p), Job::Modified(_) | Job::Touched(_)) => Job::Created(p.clone()),
        _ => then,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RemotePath {
        RemotePath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn a_path_changing_again_within_a_second_waits_and_merges() {
        let e = Echoes::default();
        e.sandbox_changed(Job::Created(p("a")));
        assert_eq!(e.next_job(), Some(Job::Created(p("a"))));
        let started = Instant::now();
        e.sandbox_changed(Job::Modified(p("a")));
        e.sandbox_changed(Job::Modified(p("a")));
        e.sandbox_changed(Job::Created(p("b")));
        assert_eq!(e.next_job(), Some(Job::Created(p("b"))));
        assert_eq!(e.next_job(), Some(Job::Modified(p("a"))));
        assert!(started.elapsed() >= SPACING - Duration::from_millis(50));
    }

    #[test]
    fn a_burst_beyond_the_bound_folds_into_its_directories() {
        let e = Echoes::default();
        for i in 0..MAX_QUEUED + 100 {
            e.sandbox_changed(Job::Created(p(&format!("d/f{i}"))));
        }
        let q = e.queue.lock().unwrap();
        assert_eq!(q.waiting.len(), MAX_QUEUED + 1);
        assert!(matches!(q.waiting.get(&p("d")), Some((_, Job::Touched(_)))));
        drop(q);
        assert_eq!(e.stats.folded.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn a_rename_cancels_its_halves_still_waiting() {
        let e = Echoes::default();
        e.sandbox_changed(Job::Removed(p("a"), Some(NodeId(4))));
        e.sandbox_changed(Job::Created(p("b")));
        e.sandbox_changed(Job::Renamed(p("a"), p("b"), Some(NodeId(4))));
        e.sandbox_changed(Job::Created(p("b")));
        assert_eq!(
            e.next_job(),
            Some(Job::Renamed(p("a"), p("b"), Some(NodeId(4))))
        );
        assert_eq!(e.released(), vec![NodeId(4)], "the removal's reference");
        assert!(e.queue.lock().unwrap().waiting.is_empty());
    }

    #[test]
    fn a_plan_hands_its_reference_once_and_returns_the_rest() {
        let e = Echoes::default();
        e.set_plan(vec![
            (NodeId(1), b"a".to_vec(), Name::Present(NodeId(5))),
            (NodeId(1), b"b".to_vec(), Name::Absent),
            (NodeId(1), b"c".to_vec(), Name::Present(NodeId(6))),
            (NodeId(1), b"d".to_vec(), Name::ToMake(NodeId(7))),
        ]);
        let node = |n, counted| Planned::Node {
            node: NodeId(n),
            counted,
        };
        assert_eq!(e.planned(NodeId(1), b"a", false), node(5, true));
        assert_eq!(e.planned(NodeId(1), b"a", false), node(5, false));
        assert_eq!(e.planned(NodeId(1), b"b", false), Planned::Absent);
        assert_eq!(e.planned(NodeId(1), b"d", false), Planned::Absent);
        assert_eq!(e.planned(NodeId(1), b"d", true), node(7, true));
        assert_eq!(e.planned(NodeId(2), b"a", false), Planned::No);
        assert_eq!(e.end_plan(), vec![NodeId(6)]);
        assert_eq!(e.planned(NodeId(1), b"a", false), Planned::No);
    }

    #[test]
    fn a_watcher_resumes_after_its_last_change_or_hears_what_was_dropped() {
        let e = Echoes::default();
        for i in 0..5 {
            e.publish(&Job::Modified(p(&format!("f{i}"))));
        }
        let (after, _) = e.subscribe(Some(3));
        let seqs: Vec<u64> = after.unwrap().iter().map(|s| s.seq).collect();
        assert_eq!(seqs, [4, 5]);
        assert!(e.subscribe(None).0.unwrap().is_empty());
        let mut ring = e.ring.lock().unwrap();
        ring.kept.pop_front();
        ring.kept.pop_front();
        drop(ring);
        assert_eq!(e.subscribe(Some(0)).0.unwrap_err(), 3);
        assert_eq!(e.subscribe(Some(2)).0.unwrap().len(), 3);
        assert!(
            e.subscribe(Some(99)).0.is_err(),
            "a number this mount never gave"
        );
    }
}
