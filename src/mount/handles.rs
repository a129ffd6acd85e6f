//! Open handles. A file handle is bound to its node (never to a path), so it keeps working
//! across renames and after an unlink. A directory handle lists once, on its first read, and
//! serves every continuation from that snapshot: offsets stay meaningful however the
//! directory changes meanwhile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::inode::{NodeId, RemoteId};
use crate::remote::{FileKind, RemoteError, Result, Version};

pub struct OpenFile {
    pub node: NodeId,
    /// The file's version as this handle knows it: seen at open, moved by every change made
    /// through the mount (pages of an unstaged file are read at it, never at another).
    pub version: Mutex<Version>,
    /// The sandbox file this handle reads (device and inode).
    pub remote: Mutex<RemoteId>,
    pub writable: bool,
    /// Written (or truncated) through this handle since its last flush.
    pub wrote: AtomicBool,
    /// Sequential reads fetch ahead ([`super::readahead`]).
    pub readahead: super::readahead::ReadAhead,
    /// The processes that wrote through this handle.
    writers: Mutex<WritingProcesses>,
}

/// Which processes wrote through a handle, so that a close by one that never wrote (a child
/// that inherited the descriptor, closing it at `exec`) does not publish a file its writer is
/// still writing. Unknown when a writer could not be seen (gone, or in another pid namespace):
/// then every close counts as the writer's, as before.
#[derive(Default)]
struct WritingProcesses {
    last_thread: u32,
    processes: Vec<u32>,
    unknown: bool,
}

/// More writers than this on one handle: stop telling them apart.
const MAX_WRITING_PROCESSES: usize = 16;

impl OpenFile {
    pub fn new(node: NodeId, attr: &crate::remote::Attr, writable: bool) -> Self {
        OpenFile {
            node,
            version: Mutex::new(attr.version.clone()),
            remote: Mutex::new(RemoteId::of(attr)),
            writable,
            wrote: AtomicBool::new(false),
            readahead: super::readahead::ReadAhead::new(attr.size),
            writers: Mutex::new(WritingProcesses::default()),
        }
    }

    /// A WRITE through this handle came from thread `tid`.
    pub fn written_by(&self, tid: u32) {
        let mut w = self.writers.lock().expect("handle lock");
        if w.unknown || (tid == w.last_thread && tid != 0) {
            return;
        }
        w.last_thread = tid;
        match super::caller::process_of(tid) {
            Some(p) if w.processes.contains(&p) => {}
            Some(p) if w.processes.len() < MAX_WRITING_PROCESSES => w.processes.push(p),
            _ => w.unknown = true,
        }
    }

    /// Whether a close by thread `tid` may be a writer's (so its FLUSH publishes the file).
    pub fn closed_by_a_writer(&self, tid: u32) -> bool {
        let w = self.writers.lock().expect("handle lock");
        if w.unknown || w.processes.is_empty() {
            return true;
        }
        super::caller::process_of(tid).is_none_or(|p| w.processes.contains(&p))
    }

    pub fn version(&self) -> Version {
        self.version.lock().expect("handle lock").clone()
    }

    pub fn remote(&self) -> RemoteId {
        *self.remote.lock().expect("handle lock")
    }

    /// The file is now at `attr` (a change made through the mount, or in place in the sandbox).
    pub fn follow(&self, attr: &crate::remote::Attr) {
        *self.version.lock().expect("handle lock") = attr.version.clone();
        *self.remote.lock().expect("handle lock") = RemoteId::of(attr);
        self.readahead.set_file_size(attr.size);
    }
}

/// One entry of a directory snapshot (`ino` is the sandbox's, for `d_ino`).
#[derive(Clone, Debug)]
pub struct DirEntryOut {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
}

struct OpenDir {
    node: NodeId,
    snapshot: Option<Arc<Vec<DirEntryOut>>>,
}

#[derive(Default)]
pub struct Handles {
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, OpenDir>>,
    next: AtomicU64,
}

impl Handles {
    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn open_file(&self, f: OpenFile) -> u64 {
        let fh = self.next();
        self.files
            .lock()
            .expect("handles lock")
            .insert(fh, Arc::new(f));
        fh
    }

    pub fn file(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.files
            .lock()
            .expect("handles lock")
            .get(&fh)
            .cloned()
            .ok_or_else(|| RemoteError::Invalid(format!("bad file handle {fh}")))
    }

    pub fn close_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.files.lock().expect("handles lock").remove(&fh)
    }

    /// Every handle on `node` follows it to `attr` (our own change: a push, a truncate).
    pub fn follow(&self, node: NodeId, attr: &crate::remote::Attr) {
        for f in self
            .files
            .lock()
            .expect("handles lock")
            .values()
            .filter(|f| f.node == node)
        {
            f.follow(attr);
        }
    }

    /// Handles open on a node.
    pub fn open_on(&self, node: NodeId) -> usize {
        self.files
            .lock()
            .expect("handles lock")
            .values()
            .filter(|f| f.node == node)
            .count()
    }

    pub fn open_dir(&self, node: NodeId) -> u64 {
        let fh = self.next();
        self.dirs.lock().expect("handles lock").insert(
            fh,
            OpenDir {
                node,
                snapshot: None,
            },
        );
        fh
    }

    pub fn dir(&self, fh: u64) -> Result<(NodeId, Option<Arc<Vec<DirEntryOut>>>)> {
        self.dirs
            .lock()
            .expect("handles lock")
            .get(&fh)
            .map(|d| (d.node, d.snapshot.clone()))
            .ok_or_else(|| RemoteError::Invalid(format!("bad directory handle {fh}")))
    }

    pub fn set_snapshot(&self, fh: u64, s: Arc<Vec<DirEntryOut>>) {
        if let Some(d) = self.dirs.lock().expect("handles lock").get_mut(&fh) {
            d.snapshot = Some(s);
        }
    }

    pub fn close_dir(&self, fh: u64) {
        self.dirs.lock().expect("handles lock").remove(&fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_distinct_and_bound_to_their_node() {
        let h = Handles::default();
        let attr = crate::remote::Attr {
            kind: FileKind::File,
            size: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 1,
            ino: 9,
            born_ns: 0,
            nlink: 1,
            rdev: 0,
            symlink_target: None,
            version: Version("v".into()),
            has_xattrs: None,
        };
        let mk = |n| OpenFile::new(NodeId(n), &attr, false);
        let a = h.open_file(mk(5));
        let b = h.open_file(mk(5));
        let d = h.open_dir(NodeId(1));
        assert!(a != b && b != d);
        assert_eq!(h.open_on(NodeId(5)), 2);
        assert_eq!(h.file(a).unwrap().node, NodeId(5));
        h.close_file(a);
        assert!(h.file(a).is_err());
        assert_eq!(h.dir(d).unwrap().0, NodeId(1));
    }
}
