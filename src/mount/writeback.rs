//! Write-back: staging a file's writes ([`super::staging`]), pushing them to the sandbox as
//! one atomic commit, and what happens when a push fails.
//!
//! - A push names the base version; the sandbox applies it with an atomic rename or refuses it
//!   as a conflict, and then the user's version is saved beside the file as
//!   `NAME.sbxfs-conflict-<time>-<n>` (created exclusively: two copies never overwrite each
//!   other) and the file follows the sandbox's version.
//! - Failures are classified: **transient** (the sandbox did not answer, timed out, or failed
//!   on its side) are retried with backoff; **permanent** (refused, no space, too large) stay
//!   staged, are reported once (on the file's next `fsync`/`close`, in the log and in
//!   `ctl status`) and are tried again only when asked (a new write, `fsync`, `ctl flush`).
//! - Nothing staged is dropped until the sandbox has it — except the data of a file unlinked
//!   through the mount, which goes on its last close, as on ext4.
//! - Staging is durable ([`super::staging::Journal`]): at start-up the mount pushes what a
//!   previous daemon of the same remote left unpushed, or saves it as a conflict copy.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::core::unreachable;
use super::inode::NodeId;
use super::lifecycle::{Stage, Step};
use super::staging::Staged;
use crate::remote::{Attr, RemoteError, RemotePath, Result};

/// Unanswered commits remembered per file: enough for a link that keeps dropping.
const MAX_ATTEMPTS: usize = 8;
/// Largest pushed image kept in the page cache after its push ([`FsCore::keep_pushed_pages`]).
pub(in crate::mount) const MAX_KEPT_PUSHED_BYTES: u64 = 16 * 1024 * 1024;
/// Longest wait between retries of a transient failure.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A staged file: its image behind an async lock (held across a push, so writes to the file
/// wait for it), and the facts `stat` needs without waiting for that lock.
pub struct StagedEntry {
    inner: tokio::sync::Mutex<Staged>,
    /// Handles open for writing on it (counted under the staged map's lock, so it is never
    /// dropped while an open is taking it).
    writers: std::sync::atomic::AtomicUsize,
    len: AtomicU64,
    mtime_ns: AtomicI64,
    dirty: AtomicBool,
    /// Where it is on its way to the sandbox ([`super::lifecycle`]).
    stage: Mutex<Stage>,
    /// The image being committed, complete and unchanging while its commit is on the way
    /// (writes wait for the lock the push holds): reads are served from it meanwhile, as a
    /// local disk serves reads during write-back, instead of waiting for the whole upload.
    /// Readers hold the read side while they read; the push takes the write side before it
    /// changes the image again.
    pushing: std::sync::RwLock<Option<Arc<std::fs::File>>>,
    /// Mode, owner and times set while a push holds the image (`Some` while one does): the
    /// push applies them when it lands, so a `utimensat` right after a close (`tar -x`, `git
    /// clone`, `cp -p`) answers at once instead of waiting for the upload.
    late: Mutex<Option<crate::remote::SetAttr>>,
}

/// Shows a staged image to readers for as long as it lives ([`StagedEntry::show_while_pushing`]).
pub struct Shown<'a>(&'a StagedEntry);

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        // Waits for reads under way: the image may change once this returns.
        *self.0.pushing.write().expect("pushing lock") = None;
    }
}

impl StagedEntry {
    fn new(s: Staged) -> Self {
        StagedEntry {
            writers: std::sync::atomic::AtomicUsize::new(0),
            len: AtomicU64::new(s.len),
            mtime_ns: AtomicI64::new(i64::MIN),
            dirty: AtomicBool::new(s.is_dirty()),
            stage: Mutex::new(if s.is_dirty() {
                Stage::Dirty
            } else {
                Stage::Clean
            }),
            inner: tokio::sync::Mutex::new(s),
            pushing: std::sync::RwLock::new(None),
            late: Mutex::new(None),
        }
    }

    /// A push took the image (call with its lock held): attributes set from now on wait
    /// for it in [`StagedEntry::set_late`].
    pub fn push_begins(&self) {
        *self.late.lock().expect("late lock") = Some(Default::default());
    }

    /// Record `set` for the push under way; false when none is (take the lock instead).
    pub fn set_late(&self, set: &crate::remote::SetAttr) -> bool {
        let mut late = self.late.lock().expect("late lock");
        let Some(l) = late.as_mut() else {
            return false;
        };
        l.then(set);
        if let Some(m) = set.mtime_ns {
            // Shown from now on, as a write's time is.
            self.mtime_ns.store(m, Ordering::SeqCst);
        }
        true
    }

    /// The push ends (lock still held): what was set meanwhile, for it to apply.
    pub fn push_ends(&self) -> crate::remote::SetAttr {
        self.late
            .lock()
            .expect("late lock")
            .take()
            .unwrap_or_default()
    }

    /// Let reads use `s`'s file until the guard drops (call with the lock held, the image
    /// complete: nothing needs fetching to read it).
    pub fn show_while_pushing(&self, s: &Staged) -> Option<Shown<'_>> {
        if !s.complete() {
            return None;
        }
        let file = s.file.try_clone().ok()?;
        *self.pushing.write().expect("pushing lock") = Some(Arc::new(file));
        Some(Shown(self))
    }

    /// Bytes of the image a push is committing, if one is (else `None`: take the lock).
    pub fn read_while_pushing(&self, offset: u64, len: u64) -> Option<std::io::Result<Vec<u8>>> {
        let shown = self.pushing.read().expect("pushing lock");
        let file = shown.as_ref()?;
        let size = self.len.load(Ordering::SeqCst);
        Some(super::staging::read_image(file, size, offset, len))
    }

    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Staged> {
        self.inner.lock().await
    }

    /// The image if nobody holds it now.
    pub fn try_lock(&self) -> Option<tokio::sync::MutexGuard<'_, Staged>> {
        self.inner.try_lock().ok()
    }

    /// Publish the image's size and times (call after every change, lock held).
    pub fn sync(&self, s: &Staged) {
        self.len.store(s.len, Ordering::SeqCst);
        self.mtime_ns
            .store(s.mtime_ns.unwrap_or(i64::MIN), Ordering::SeqCst);
        self.dirty.store(s.is_dirty(), Ordering::SeqCst);
        self.step(Step::Changed {
            dirty: s.is_dirty(),
        });
    }

    /// Record what happened to the file; answers its state now.
    pub fn step(&self, step: Step) -> Stage {
        let mut stage = self.stage.lock().expect("stage lock");
        *stage = stage.after(step);
        *stage
    }

    pub fn stage(&self) -> Stage {
        *self.stage.lock().expect("stage lock")
    }

    /// Report the staged size and mtime in `attr`.
    pub fn overlay(&self, attr: &mut Attr) {
        attr.size = self.len.load(Ordering::SeqCst);
        let m = self.mtime_ns.load(Ordering::SeqCst);
        if m != i64::MIN {
            attr.mtime_ns = m;
            attr.ctime_ns = attr.ctime_ns.max(m);
        }
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::SeqCst)
    }

    /// A handle open for writing on it closed.
    pub fn writer_closed(&self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The files with a staged image, by node: the one owner of which files are staged and of
/// how many writers each has, counted under the map's lock so an image is never dropped while
/// an open is taking it.
#[derive(Default)]
pub struct StagedFiles(Mutex<HashMap<NodeId, Arc<StagedEntry>>>);

impl StagedFiles {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Arc<StagedEntry>>> {
        self.0.lock().expect("staged lock")
    }

    pub fn get(&self, node: NodeId) -> Option<Arc<StagedEntry>> {
        self.map().get(&node).cloned()
    }

    /// The node's image, made by `make` if it has none; a writer is counted on it either way
    /// when `writer`. `Ok((entry, made))`.
    pub(in crate::mount) fn get_or_make(
        &self,
        node: NodeId,
        writer: bool,
        make: impl FnOnce() -> Result<Staged>,
    ) -> Result<(Arc<StagedEntry>, bool)> {
        let mut map = self.map();
        let (e, made) = match map.get(&node) {
            Some(e) => (e.clone(), false),
            None => {
                let e = Arc::new(StagedEntry::new(make()?));
                map.insert(node, e.clone());
                (e, true)
            }
        };
        if writer {
            e.writers.fetch_add(1, Ordering::SeqCst);
        }
        Ok((e, made))
    }

    pub(in crate::mount) fn remove(&self, node: NodeId) -> Option<Arc<StagedEntry>> {
        self.map().remove(&node)
    }

    /// Removes the node's image if nothing writes it, nothing in it is unpushed and `idle`
    /// says nothing else holds it (decided under the map's lock).
    pub(in crate::mount) fn remove_if_idle(
        &self,
        node: NodeId,
        idle: impl FnOnce() -> bool,
    ) -> Option<Arc<StagedEntry>> {
        let mut map = self.map();
        let e = map.get(&node)?;
        (e.writers.load(Ordering::SeqCst) == 0 && !e.is_dirty() && idle())
            .then(|| map.remove(&node))
            .flatten()
    }

    /// Every staged entry now, taken out of the map's lock (each is then locked on its own).
    pub(in crate::mount) fn all(&self) -> Vec<(NodeId, Arc<StagedEntry>)> {
        self.map().iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// Some file has staged changes not yet in the sandbox.
    pub fn any_dirty(&self) -> bool {
        self.map().values().any(|e| e.is_dirty())
    }
}

/// A push that failed and is kept.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PushFailure {
    pub path: String,
    pub error: String,
    pub attempts: u32,
    /// Not retried on its own (refused by the sandbox, not a fault of the link).
    pub permanent: bool,
    #[serde(skip)]
    next_try: Option<Instant>,
    #[serde(skip)]
    reported: bool,
    #[serde(skip)]
    cause: Option<RemoteError>,
}

/// A conflict met by a push: the user's version was saved beside the file.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConflictCopy {
    pub path: String,
    pub saved_as: String,
}

/// An edit an earlier mount left that this one could not push (staged for another sandbox at
/// this address, or the sandbox still refuses it): kept in the staging directory, and named by
/// `ctl status`, `flush` and `umount` so it is not forgotten there.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KeptEdit {
    pub path: String,
    pub why: String,
}

/// Conflict copies remembered for `ctl status`, `flush` and `umount` (the oldest forgotten).
const MAX_CONFLICTS: usize = 1000;

/// The conflict copies made (the latest [`MAX_CONFLICTS`]), counted, with how many of them a
/// `flush` has reported already: each flush names the conflicts that are new to it.
#[derive(Default)]
struct ConflictLog {
    latest: std::collections::VecDeque<ConflictCopy>,
    made: u64,
    reported: u64,
}

#[derive(Default)]
pub struct Failures {
    map: Mutex<HashMap<NodeId, PushFailure>>,
    /// Every conflict copy this mount made, oldest first.
    conflicts: Mutex<ConflictLog>,
    /// What the unanswered commits of a node sent (any of them may have landed).
    attempts: Mutex<HashMap<NodeId, Vec<Attempt>>>,
    kept: Mutex<Vec<KeptEdit>>,
    /// A conflict met by a push nobody waited for (a close's), while a handle was open on
    /// the file: what that handle wrote went to the copy, and its next `fsync` or `close`
    /// says so, even after pushes to the copy succeeded.
    conflict_reports: Mutex<HashMap<NodeId, RemoteError>>,
}

/// A fingerprint of what a commit sent: the resulting length and a keyed hash of the bytes
/// of every range it wrote (keyed at random, so the sandbox cannot forge a match).
#[derive(Clone)]
pub struct Attempt {
    pub(in crate::mount) len: u64,
    pub(in crate::mount) ranges: Vec<(u64, u64)>,
    pub(in crate::mount) hasher: std::collections::hash_map::RandomState,
    pub(in crate::mount) digest: u64,
}

impl Attempt {
    pub(in crate::mount) fn of(s: &Staged) -> Option<Attempt> {
        let ranges: Vec<(u64, u64)> = if s.base.is_none() || s.complete() {
            vec![(0, s.len)]
        } else {
            s.dirty_ranges().to_vec()
        };
        let hasher = std::collections::hash_map::RandomState::new();
        let mut h = hasher.build_hasher();
        for &(a, b) in &ranges {
            let mut at = a;
            while at < b {
                let n = (b - at).min(1 << 20);
                let chunk = s.read_local(at, n).ok()?;
                if chunk.is_empty() {
                    break;
                }
                h.write(&chunk);
                at += chunk.len() as u64;
            }
        }
        Some(Attempt {
            len: s.len,
            ranges,
            hasher,
            digest: h.finish(),
        })
    }
}

/// A transient failure is worth retrying by itself.
pub fn transient(e: &RemoteError) -> bool {
    unreachable(e) || matches!(e, RemoteError::Io(..))
}

impl Failures {
    pub(in crate::mount) fn record(&self, node: NodeId, path: &str, e: &RemoteError) {
        let mut m = self.map.lock().expect("failures lock");
        let f = m.entry(node).or_insert_with(|| PushFailure {
            path: path.to_string(),
            error: String::new(),
            attempts: 0,
            permanent: false,
            next_try: None,
            reported: false,
            cause: None,
        });
        f.attempts += 1;
        f.path = path.to_string();
        f.error = e.to_string();
        f.permanent = !transient(e);
        f.cause = Some(e.clone());
        let first = f.attempts == 1;
        f.next_try = (!f.permanent)
            .then(|| Instant::now() + MAX_BACKOFF.min(Duration::from_secs(1 << f.attempts.min(6))));
        drop(m);
        // Logged once, then only when it changes kind: a file failing every retry does not
        // fill the log.
        if first {
            if transient(e) {
                tracing::warn!(file = %path, "push failed, kept locally and retried: {e}");
            } else {
                tracing::error!(file = %path, "push refused by the sandbox, kept locally: {e}");
            }
        }
    }

    pub(in crate::mount) fn note_attempt(&self, node: NodeId, a: Option<Attempt>) {
        if let Some(a) = a {
            let mut m = self.attempts.lock().expect("attempts lock");
            let list = m.entry(node).or_default();
            if list.len() == MAX_ATTEMPTS {
                list.remove(0);
            }
            list.push(a);
        }
    }

    /// Unanswered attempts since the last push that is known to have landed, newest first.
    pub(in crate::mount) fn attempts(&self, node: NodeId) -> Vec<Attempt> {
        let m = self.attempts.lock().expect("attempts lock");
        m.get(&node)
            .map(|l| l.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    pub fn clear(&self, node: NodeId) {
        self.map.lock().expect("failures lock").remove(&node);
        self.attempts.lock().expect("attempts lock").remove(&node);
    }

    /// A conflict that handles still open on `node` have not heard of ([`Self::take_report`]).
    pub(in crate::mount) fn conflict_unheard(&self, node: NodeId, e: RemoteError) {
        self.conflict_reports
            .lock()
            .expect("conflict reports lock")
            .insert(node, e);
    }

    /// A failure not yet reported to the program: reported now, once.
    pub fn take_report(&self, node: NodeId) -> Result<()> {
        let unheard = self
            .conflict_reports
            .lock()
            .expect("conflict reports lock")
            .remove(&node);
        let mut m = self.map.lock().expect("failures lock");
        if let Some(e) = unheard {
            if let Some(f) = m.get_mut(&node) {
                f.reported = true;
            }
            return Err(e);
        }
        match m.get_mut(&node) {
            Some(f) if !f.reported => {
                f.reported = true;
                Err(f.cause.clone().unwrap_or_else(|| {
                    RemoteError::Io(f.path.clone(), "an earlier push failed".into())
                }))
            }
            _ => Ok(()),
        }
    }

    /// Every transient failure is due now (the sandbox answers again).
    pub(super) fn all_due(&self) {
        let now = Instant::now();
        for f in self.map.lock().expect("failures lock").values_mut() {
            if !f.permanent {
                f.next_try = Some(now);
            }
        }
    }

    pub(in crate::mount) fn due(&self) -> Vec<NodeId> {
        let now = Instant::now();
        self.map
            .lock()
            .expect("failures lock")
            .iter()
            .filter(|(_, f)| f.next_try.is_some_and(|t| t <= now))
            .map(|(n, _)| *n)
            .collect()
    }

    pub(in crate::mount) fn note_conflict(&self, path: &RemotePath, copy: &RemotePath) {
        let mut c = self.conflicts.lock().expect("conflicts lock");
        if c.latest.len() == MAX_CONFLICTS {
            c.latest.pop_front();
        }
        c.latest.push_back(ConflictCopy {
            path: path.display(),
            saved_as: copy.display(),
        });
        c.made += 1;
    }

    /// A conflict copy removed through the mount: the user dealt with it, and `ctl status`
    /// no longer lists it.
    pub(in crate::mount) fn conflict_copy_gone(&self, copy: &RemotePath) {
        let shown = copy.display();
        let mut c = self.conflicts.lock().expect("conflicts lock");
        // The last `made - reported` entries are not reported yet: the counts keep saying
        // which are, whichever entry goes.
        let unreported = usize::try_from(c.made - c.reported).unwrap_or(usize::MAX);
        let first_unreported = c.latest.len().saturating_sub(unreported);
        let gone: Vec<usize> = (0..c.latest.len())
            .filter(|&i| c.latest[i].saved_as == shown)
            .collect();
        for i in gone.into_iter().rev() {
            c.latest.remove(i);
            c.made -= 1;
            if i < first_unreported {
                c.reported -= 1;
            }
        }
    }

    pub fn conflicts(&self) -> Vec<ConflictCopy> {
        let c = self.conflicts.lock().expect("conflicts lock");
        c.latest.iter().cloned().collect()
    }

    /// The conflict copies made since the last call (those still remembered), and marks
    /// them reported.
    pub fn conflicts_unreported(&self) -> Vec<ConflictCopy> {
        let mut c = self.conflicts.lock().expect("conflicts lock");
        let new = usize::try_from(c.made - c.reported).unwrap_or(usize::MAX);
        c.reported = c.made;
        let skip = c.latest.len().saturating_sub(new);
        c.latest.iter().skip(skip).cloned().collect()
    }

    pub(in crate::mount) fn note_kept(&self, path: &[u8], why: impl std::fmt::Display) {
        let mut k = self.kept.lock().expect("kept lock");
        if k.len() < MAX_CONFLICTS {
            k.push(KeptEdit {
                path: String::from_utf8_lossy(path).into_owned(),
                why: why.to_string(),
            });
        }
    }

    pub fn kept(&self) -> Vec<KeptEdit> {
        self.kept.lock().expect("kept lock").clone()
    }

    pub fn list(&self) -> Vec<PushFailure> {
        self.map
            .lock()
            .expect("failures lock")
            .values()
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.map.lock().expect("failures lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(s: &str) -> RemotePath {
        RemotePath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn a_conflict_copy_removed_is_no_longer_listed_nor_reported() {
        let f = Failures::default();
        for n in 1..=3 {
            f.note_conflict(&rp(&format!("f{n}")), &rp(&format!("f{n}.copy")));
        }
        assert_eq!(f.conflicts_unreported().len(), 3);
        f.note_conflict(&rp("f4"), &rp("f4.copy"));
        f.note_conflict(&rp("f5"), &rp("f5.copy"));
        // One reported and one not yet, removed by the user through the mount.
        f.conflict_copy_gone(&rp("f1.copy"));
        f.conflict_copy_gone(&rp("f4.copy"));
        let listed: Vec<String> = f.conflicts().into_iter().map(|c| c.saved_as).collect();
        assert_eq!(listed, ["f2.copy", "f3.copy", "f5.copy"]);
        let unreported: Vec<String> = f
            .conflicts_unreported()
            .into_iter()
            .map(|c| c.saved_as)
            .collect();
        assert_eq!(unreported, ["f5.copy"]);
        assert!(f.conflicts_unreported().is_empty());
    }
}
