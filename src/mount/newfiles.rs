//! Files created through the mount that the sandbox does not have yet.
//!
//! `creat()` of a name a lookup has just found absent makes no remote call: the file exists
//! in the mount at once (its node, a staged image with no base), and its first push creates
//! it in the sandbox with its mode and whole content in one commit. So a sandbox-side reader
//! never sees it empty or partial, and `tar -x` pays no round trip per `creat()`. Until then
//! lookups and listings of its directory show it from here; unlinking or renaming it stays
//! local (the push goes to the new name, or never happens); a hard link pushes it first. Once a
//! commit of it was sent without an answer it may be in the sandbox: unlink and rename then go
//! to the sandbox, and a "not found" there means it never landed.
//!
//! A name counts as absent only when a lookup answered so within [`ABSENT_FOR`] (the kernel
//! looks a name up just before it creates it) or a fresh listing lacks it; anything else is
//! created in the sandbox as before, so `O_EXCL` still fails on a file made there.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::inode::NodeId;

/// How long a lookup's "absent" stands for a following `creat()`: the kernel's LOOKUP comes
/// right before its CREATE, and a sandbox-side creation in this window is as likely as in the
/// round trip a remote create would take.
pub const ABSENT_FOR: Duration = Duration::from_secs(1);
/// Absent names remembered at most (oldest dropped first): bounded whatever a walk looks up.
const MAX_ABSENT: usize = 4096;
/// Device number of a file not yet in the sandbox: no real device has it, so its identity
/// never matches a sandbox file's.
pub const UNPUSHED_DEV: u64 = u64::MAX;

#[derive(Default)]
pub struct NewFiles {
    /// Each new file, and whether a commit of it was sent (then it may be in the sandbox
    /// even though no answer said so).
    nodes: Mutex<HashMap<NodeId, bool>>,
    /// New files renamed over a name the sandbox may have: that file is replaced by the push,
    /// or must be removed if the new file moves on before it.
    covers: Mutex<HashSet<NodeId>>,
    absent: Mutex<HashMap<(NodeId, Vec<u8>), Instant>>,
    next_ino: AtomicU64,
}

impl NewFiles {
    /// A lookup found `name` absent in `parent` just now.
    pub fn note_absent(&self, parent: NodeId, name: &[u8]) {
        let mut m = self.absent.lock().expect("absent lock");
        if m.len() >= MAX_ABSENT {
            let now = Instant::now();
            m.retain(|_, at| now.duration_since(*at) < ABSENT_FOR);
            if m.len() >= MAX_ABSENT {
                m.clear();
            }
        }
        m.insert((parent, name.to_vec()), Instant::now());
    }

    /// Was `name` found absent within [`ABSENT_FOR`]? (Used once: a create consumes it.)
    pub fn take_absent(&self, parent: NodeId, name: &[u8]) -> bool {
        let mut m = self.absent.lock().expect("absent lock");
        m.remove(&(parent, name.to_vec()))
            .is_some_and(|at| at.elapsed() < ABSENT_FOR)
    }

    /// Forget an absent name (something made it).
    pub fn made(&self, parent: NodeId, name: &[u8]) {
        self.absent
            .lock()
            .expect("absent lock")
            .remove(&(parent, name.to_vec()));
    }

    /// An inode number for a file not yet pushed: its `st_ino` for the life of its node (see
    /// [`super::inode::Node::st_ino`]). Counted down from 2^32 - 1, so a 32-bit program's
    /// `stat` never fails with EOVERFLOW, in a range real inode tables rarely reach.
    pub fn next_ino(&self) -> u64 {
        const TOP: u64 = u32::MAX as u64 - 1;
        const SPAN: u64 = 1 << 28;
        TOP - self.next_ino.fetch_add(1, Ordering::Relaxed) % SPAN
    }

    pub fn add(&self, node: NodeId) {
        self.nodes
            .lock()
            .expect("new files lock")
            .insert(node, false);
    }

    /// A commit of it is on its way: from now on it may be in the sandbox.
    pub fn sent(&self, node: NodeId) {
        if let Some(s) = self.nodes.lock().expect("new files lock").get_mut(&node) {
            *s = true;
        }
    }

    /// New, and certainly not in the sandbox (no commit of it was ever sent).
    pub fn unsent(&self, node: NodeId) -> bool {
        self.nodes.lock().expect("new files lock").get(&node) == Some(&false)
    }

    /// Pushed (or dropped): the sandbox's listing speaks for it now.
    pub fn remove(&self, node: NodeId) {
        self.nodes.lock().expect("new files lock").remove(&node);
        self.covers.lock().expect("covers lock").remove(&node);
    }

    /// Whether the new file's name may hide a sandbox file (set by a rename over one).
    pub(in crate::mount) fn set_covers(&self, node: NodeId, covers: bool) -> bool {
        let mut c = self.covers.lock().expect("covers lock");
        if covers {
            !c.insert(node)
        } else {
            c.remove(&node)
        }
    }

    /// Whether this new file was renamed over a name the sandbox may have a file at (its push
    /// replaces that file, as the rename did).
    pub fn covers(&self, node: NodeId) -> bool {
        self.covers.lock().expect("covers lock").contains(&node)
    }

    pub fn contains(&self, node: NodeId) -> bool {
        self.nodes
            .lock()
            .expect("new files lock")
            .contains_key(&node)
    }

    pub fn all(&self) -> Vec<NodeId> {
        self.nodes
            .lock()
            .expect("new files lock")
            .keys()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_name_is_used_once() {
        let f = NewFiles::default();
        assert!(!f.take_absent(NodeId(1), b"a"), "never looked up");
        f.note_absent(NodeId(1), b"a");
        assert!(f.take_absent(NodeId(1), b"a"));
        assert!(!f.take_absent(NodeId(1), b"a"), "consumed");
        f.note_absent(NodeId(1), b"b");
        f.made(NodeId(1), b"b");
        assert!(!f.take_absent(NodeId(1), b"b"), "made meanwhile");
    }

    #[test]
    fn absent_names_stay_bounded() {
        let f = NewFiles::default();
        for i in 0..(MAX_ABSENT as u64 * 3) {
            f.note_absent(NodeId(i), b"x");
        }
        assert!(f.absent.lock().unwrap().len() <= MAX_ABSENT);
    }
}
