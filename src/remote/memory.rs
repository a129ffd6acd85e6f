//! `MemoryRemote`: a whole sandbox in memory, the reference backend of the `Remote` trait.
//!
//! It answers every operation the way the agent over ext4 does (the conformance suite holds
//! both to the same checks), so the mount's core can be tested without processes, sockets or a
//! real directory, and a test can act "inside the sandbox" through [`MemorySandbox`] while the
//! mount holds state.
//!
//! The model: inodes in a map keyed by inode number, directories mapping names (raw bytes,
//! sorted) to inode numbers, so hard links are several names of one inode and `nlink` counts
//! them. Paths resolve one component at a time from the root, following symlinks except where
//! the operation says not to (a final symlink for `stat`, `setattr`, xattrs, `link`, `unlink`);
//! an absolute symlink, or `..` above the root, is refused with `Access`, as the agent's
//! `openat2(RESOLVE_BENEATH)` refuses it.
//!
//! Times follow Linux: creating or removing a name changes the directory's mtime and ctime; a
//! content change the file's mtime and ctime; a rename, chmod, chown, link or xattr change only
//! the ctime. The clock never repeats a nanosecond, and a [`Version`] also carries a content
//! generation, so two changes within one clock tick still give two versions.
//!
//! A commit, as on the agent, writes a new inode and puts it in place of the old one (the
//! temp-then-rename the agent does): the name gets a new inode number and a hard link to the old
//! file keeps the old content. One lock guards the whole state; it is never held across an
//! `.await` (a commit body is read before the lock is taken).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::io::AsyncReadExt;
use tokio::sync::broadcast;

use super::wire::MAX_READ_BYTES;
use super::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{LineWindow, ScanRequest, ScanResult};
use crate::search::walk::{SourceEntry, SourceKind, TreeSource};
use crate::search::SearchError;

/// The device number every inode reports: any fixed value works, as long as it is the same
/// for every file of one sandbox (the version and the mount's identity use it).
pub const MEMORY_DEV: u64 = 0x5b_f5;
/// The root's inode number, as on ext4.
const ROOT_INO: u64 = 2;
/// First inode number handed out (ext4 reserves the first eleven).
const FIRST_INO: u64 = 12;
/// Largest file size by default: ext4's 16 TiB with 4 KiB blocks. Tests lower it with
/// [`MemoryRemote::set_max_file_size`] to reach `FileTooBig` without allocating.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 16 << 40;
/// Change events kept for reconnecting watchers: the agent's ring size, so the same
/// "too old a `since`" test overflows both.
pub const RING_EVENTS: usize = 8192;
/// Longest symlink target, as Linux's PATH_MAX (`ENAMETOOLONG` past it).
const SYMLINK_MAX: usize = 4096;
/// Symlinks followed in one resolution before `ELOOP`, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// The block size `statfs` reports and `blocks` counts in.
const BLOCK_SIZE: u64 = 4096;
/// The capacity `statfs` reports (blocks of [`BLOCK_SIZE`]): 64 GiB, plenty for any test.
const CAPACITY_BLOCKS: u64 = 16 << 20;
/// The inode capacity `statfs` reports.
const CAPACITY_FILES: u64 = 1 << 22;
/// Largest whole-file commit body read into memory, as the agent's `MAX_COMMIT_BYTES` bounds
/// its temp file (here it is memory, so the bound is lower: tests, not workloads).
pub const MAX_MEMORY_COMMIT_BYTES: u64 = 1 << 30;

#[derive(Clone, Debug)]
enum Data {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
    Special,
}

#[derive(Clone, Debug)]
struct Node {
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    atime: i64,
    mtime: i64,
    ctime: i64,
    nlink: u64,
    rdev: u64,
    /// A directory's parent (the root's is itself); a directory has exactly one name.
    parent: u64,
    /// Bumped on every content change, so the version changes within one clock tick too.
    generation: u64,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    data: Data,
}

impl Node {
    fn size(&self) -> u64 {
        match &self.data {
            Data::File(b) => b.len() as u64,
            // ext4 reports a directory's block size; the exact value matters to no one.
            Data::Dir(_) => BLOCK_SIZE,
            Data::Symlink(t) => t.len() as u64,
            Data::Special => 0,
        }
    }

    fn dir(&self) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.data {
            Data::Dir(d) => Some(d),
            _ => None,
        }
    }
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    last_ns: i64,
    next_generation: u64,
    max_file_size: u64,
    uid: u32,
    gid: u32,
    next_seq: u64,
    events: VecDeque<ChangeEvent>,
    ring: usize,
    /// What it says it does ([`MemoryRemote::set_capabilities`]); what it says it lacks, it
    /// refuses (`Unsupported`), as such a transport would.
    capabilities: super::Capabilities,
}

struct Inner {
    state: Mutex<State>,
    feed: broadcast::Sender<ChangeEvent>,
}

/// An in-memory sandbox implementing [`Remote`]. Clones share the same sandbox.
#[derive(Clone)]
pub struct MemoryRemote {
    inner: Arc<Inner>,
}

/// What a process inside the sandbox does, bypassing the `Remote` (see [`MemoryRemote::sandbox`]).
#[derive(Clone)]
pub struct MemorySandbox {
    inner: Arc<Inner>,
}

fn shown(p: &[u8]) -> String {
    if p.is_empty() {
        ".".into()
    } else {
        String::from_utf8_lossy(p).into_owned()
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        let mut p = dir.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

fn root_invalid() -> RemoteError {
    RemoteError::Invalid("the workspace root itself cannot be changed".into())
}

fn escapes(path: &[u8]) -> RemoteError {
    RemoteError::Access(format!("{}: resolves outside the workspace", shown(path)))
}

/// Where a name resolved: its directory, its name there and (if it exists) its inode.
struct Slot {
    dir: u64,
    name: Vec<u8>,
    ino: Option<u64>,
}

impl State {
    fn new() -> Self {
        let mut s = State {
            nodes: HashMap::new(),
            next_ino: FIRST_INO,
            last_ns: 0,
            next_generation: 1,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            // The sandbox's user: the agent usually runs as the workspace's owner.
            uid: 1000,
            gid: 1000,
            next_seq: 1,
            events: VecDeque::new(),
            ring: RING_EVENTS,
            capabilities: Default::default(),
        };
        let now = s.now();
        let root = Node {
            kind: FileKind::Dir,
            mode: 0o755,
            uid: s.uid,
            gid: s.gid,
            atime: now,
            mtime: now,
            ctime: now,
            nlink: 2,
            rdev: 0,
            parent: ROOT_INO,
            generation: 0,
            xattrs: BTreeMap::new(),
            data: Data::Dir(BTreeMap::new()),
        };
        s.nodes.insert(ROOT_INO, root);
        s
    }

    /// The clock: wall time, but never the same nanosecond twice.
    fn now(&mut self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        self.last_ns = wall.max(self.last_ns + 1);
        self.last_ns
    }

    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    fn node(&self, ino: u64) -> &Node {
        self.nodes.get(&ino).expect("a linked inode exists")
    }

    fn node_mut(&mut self, ino: u64) -> &mut Node {
        self.nodes.get_mut(&ino).expect("a linked inode exists")
    }

    fn new_node(&mut self, kind: FileKind, mode: u32, data: Data) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        let now = self.now();
        let generation = self.generation();
        let nlink = if kind == FileKind::Dir { 2 } else { 1 };
        self.nodes.insert(
            ino,
            Node {
                kind,
                mode: mode & 0o7777,
                uid: self.uid,
                gid: self.gid,
                atime: now,
                mtime: now,
                ctime: now,
                nlink,
                rdev: 0,
                parent: 0,
                generation,
                xattrs: BTreeMap::new(),
                data,
            },
        );
        ino
    }

    fn version(&self, ino: u64) -> Version {
        let n = self.node(ino);
        Version(format!(
            "{MEMORY_DEV:x}:{ino:x}-{:x}-{:x}-{:x}",
            n.size(),
            n.mtime,
            n.generation
        ))
    }

    fn attr(&self, ino: u64) -> Attr {
        let n = self.node(ino);
        Attr {
            kind: n.kind,
            size: n.size(),
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            atime_ns: n.atime,
            mtime_ns: n.mtime,
            ctime_ns: n.ctime,
            dev: MEMORY_DEV,
            ino,
            born_ns: 0,
            nlink: n.nlink,
            rdev: n.rdev,
            symlink_target: match &n.data {
                Data::Symlink(t) => Some(WireBytes(t.clone())),
                _ => None,
            },
            version: self.version(ino),
            has_xattrs: Some(!n.xattrs.is_empty()),
        }
    }

    /// Resolve `path`, following every symlink on the way, and the final one if `follow`.
    /// Answers the slot the path names (its inode `None` if only the last name is missing).
    fn resolve(&self, path: &[u8], follow: bool) -> Result<Slot> {
        // The directories walked so far (for `..` in symlink targets) and what is left.
        let mut stack: Vec<u64> = vec![ROOT_INO];
        let mut rest: VecDeque<Vec<u8>> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        let mut links = 0;
        if rest.is_empty() {
            return Ok(Slot {
                dir: ROOT_INO,
                name: Vec::new(),
                ino: Some(ROOT_INO),
            });
        }
        loop {
            let comp = rest.pop_front().expect("a component is left");
            let dir = *stack.last().expect("the root is never popped");
            let last = rest.is_empty();
            if comp == b"." {
                if last {
                    return Ok(self.slot_of_dir(&stack));
                }
                continue;
            }
            if comp == b".." {
                if stack.len() == 1 {
                    return Err(escapes(path));
                }
                stack.pop();
                if last {
                    return Ok(self.slot_of_dir(&stack));
                }
                continue;
            }
            let Some(entries) = self.node(dir).dir() else {
                return Err(RemoteError::NotDir(shown(path)));
            };
            let Some(&ino) = entries.get(&comp) else {
                if last {
                    return Ok(Slot {
                        dir,
                        name: comp,
                        ino: None,
                    });
                }
                return Err(RemoteError::NotFound(shown(path)));
            };
            let node = self.node(ino);
            match &node.data {
                Data::Symlink(target) if !last || follow => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(RemoteError::Invalid(format!(
                            "{}: too many levels of symbolic links",
                            shown(path)
                        )));
                    }
                    if target.first() == Some(&b'/') {
                        return Err(escapes(path));
                    }
                    for c in target.split(|&b| b == b'/').rev() {
                        if !c.is_empty() {
                            rest.push_front(c.to_vec());
                        }
                    }
                    if rest.is_empty() {
                        return Ok(self.slot_of_dir(&stack));
                    }
                }
                _ if last => {
                    return Ok(Slot {
                        dir,
                        name: comp,
                        ino: Some(ino),
                    })
                }
                Data::Dir(_) => stack.push(ino),
                _ => return Err(RemoteError::NotDir(shown(path))),
            }
        }
    }

    /// The slot of the directory on top of a resolution stack.
    fn slot_of_dir(&self, stack: &[u64]) -> Slot {
        let ino = *stack.last().expect("the root is never popped");
        if stack.len() == 1 {
            return Slot {
                dir: ROOT_INO,
                name: Vec::new(),
                ino: Some(ROOT_INO),
            };
        }
        let parent = stack[stack.len() - 2];
        let name = self
            .node(parent)
            .dir()
            .and_then(|d| d.iter().find(|(_, &i)| i == ino).map(|(n, _)| n.clone()))
            .unwrap_or_default();
        Slot {
            dir: parent,
            name,
            ino: Some(ino),
        }
    }

    /// An existing inode at `path`.
    fn lookup(&self, path: &[u8], follow: bool) -> Result<u64> {
        self.resolve(path, follow)?
            .ino
            .ok_or_else(|| RemoteError::NotFound(shown(path)))
    }

    /// The parent directory and last name of a path that is not the root (the final name is
    /// not followed).
    fn parent_slot(&self, path: &[u8]) -> Result<Slot> {
        if path.is_empty() {
            return Err(root_invalid());
        }
        self.resolve(path, false)
    }

    fn dir_entries_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.node_mut(dir).data {
            Data::Dir(d) => d,
            _ => panic!("a parent slot is a directory"),
        }
    }

    fn touch_dir(&mut self, dir: u64) {
        let now = self.now();
        let n = self.node_mut(dir);
        n.mtime = now;
        n.ctime = now;
    }

    fn touch_ctime(&mut self, ino: u64) {
        let now = self.now();
        self.node_mut(ino).ctime = now;
    }

    /// A content change: new bytes, mtime and ctime now, a new generation.
    fn set_content(&mut self, ino: u64, bytes: Vec<u8>) {
        let now = self.now();
        let generation = self.generation();
        let n = self.node_mut(ino);
        n.data = Data::File(bytes);
        n.mtime = now;
        n.ctime = now;
        n.generation = generation;
    }

    /// Link `ino` under `dir` as `name` (the name must be free).
    fn add_entry(&mut self, dir: u64, name: Vec<u8>, ino: u64) {
        self.dir_entries_mut(dir).insert(name, ino);
        if self.node(ino).kind == FileKind::Dir {
            self.node_mut(dir).nlink += 1;
            self.node_mut(ino).parent = dir;
        }
        self.touch_dir(dir);
    }

    /// Unlink `name` from `dir`; an inode with no name left is freed.
    fn remove_entry(&mut self, dir: u64, name: &[u8]) -> Option<u64> {
        let ino = self.dir_entries_mut(dir).remove(name)?;
        self.touch_dir(dir);
        let is_dir = self.node(ino).kind == FileKind::Dir;
        if is_dir {
            self.node_mut(dir).nlink -= 1;
            self.nodes.remove(&ino);
        } else {
            let n = self.node_mut(ino);
            n.nlink -= 1;
            if n.nlink == 0 {
                self.nodes.remove(&ino);
            } else {
                self.touch_ctime(ino);
            }
        }
        Some(ino)
    }

    fn check_size(&self, size: u64, path: &[u8]) -> Result<()> {
        if size > self.max_file_size {
            return Err(RemoteError::FileTooBig(shown(path)));
        }
        Ok(())
    }

    fn publish(&mut self, feed: &broadcast::Sender<ChangeEvent>, path: &[u8], kind: ChangeKind) {
        let ev = ChangeEvent::new(self.next_seq, path.to_vec(), kind);
        self.next_seq += 1;
        if self.events.len() >= self.ring {
            self.events.pop_front();
        }
        self.events.push_back(ev.clone());
        // Sent under the lock, so every subscriber sees events in sequence order.
        let _ = feed.send(ev);
    }

    /// Is `ancestor` on the way from the root to `dir` (or `dir` itself)?
    fn is_within(&self, dir: u64, ancestor: u64) -> bool {
        let mut cur = dir;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            match self.parent_of(cur) {
                Some(p) => cur = p,
                None => return false,
            }
        }
    }

    fn parent_of(&self, dir: u64) -> Option<u64> {
        self.nodes.get(&dir).map(|n| n.parent)
    }

    /// The file a commit to `path` replaces: the path's own slot, or a symlink's target's.
    fn commit_slot(&self, path: &[u8]) -> Result<Slot> {
        let own = self.parent_slot(path)?;
        match own.ino {
            Some(ino) if self.node(ino).kind == FileKind::Symlink => {
                match self.resolve(path, true) {
                    Ok(slot) if slot.ino.is_some() => Ok(slot),
                    // A dangling link is its own target: not a regular file, refused later.
                    Ok(_) | Err(RemoteError::NotFound(_)) => Ok(own),
                    Err(e) => Err(e),
                }
            }
            _ => Ok(own),
        }
    }

    /// A commit's target must be a regular file: a directory is `IsDir`, anything else (a
    /// dangling symlink, a FIFO) `Invalid`, as the agent answers.
    fn check_regular(&self, ino: u64, path: &[u8]) -> Result<()> {
        match self.node(ino).kind {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(RemoteError::IsDir(shown(path))),
            _ => Err(RemoteError::Invalid(format!(
                "{}: not a regular file",
                shown(path)
            ))),
        }
    }

    fn check_base(&self, path: &[u8], base: Option<&Version>, ino: Option<u64>) -> Result<()> {
        let Some(base) = base else { return Ok(()) };
        let now = ino.map(|i| self.version(i));
        let ok = if base.is_absent() {
            now.is_none()
        } else {
            now.as_ref() == Some(base)
        };
        if !ok {
            return Err(RemoteError::Conflict {
                path: shown(path),
                base: base.0.clone(),
                current: now.map_or_else(|| "(removed)".to_string(), |v| v.0),
            });
        }
        Ok(())
    }

    /// The path of a slot, relative to the root (for events about a symlink's target).
    fn path_of(&self, slot: &Slot) -> Vec<u8> {
        let mut parts = vec![slot.name.clone()];
        let mut cur = slot.dir;
        while cur != ROOT_INO {
            let Some(parent) = self.parent_of(cur) else {
                break;
            };
            let name = self
                .node(parent)
                .dir()
                .and_then(|d| d.iter().find(|(_, &i)| i == cur).map(|(n, _)| n.clone()))
                .unwrap_or_default();
            parts.push(name);
            cur = parent;
        }
        parts.reverse();
        parts.join(&b'/')
    }

    /// Put new content in place of the slot's file, as the agent's temp-then-rename does: a new
    /// inode with the old one's mode and owner (or `create_mode` for a new file). A file with
    /// several names is written in place instead, as the agent does, so its links stay one file.
    fn replace_file(&mut self, slot: &Slot, bytes: Vec<u8>, create_mode: Option<u32>) -> u64 {
        if let Some(old) = slot.ino.filter(|&i| self.node(i).nlink > 1) {
            self.set_content(old, bytes);
            return old;
        }
        let (mode, owner) = match slot.ino {
            Some(old) => {
                let n = self.node(old);
                (n.mode, Some((n.uid, n.gid)))
            }
            None => (create_mode.unwrap_or(0o644), None),
        };
        let xattrs = slot
            .ino
            .map(|old| self.node(old).xattrs.clone())
            .unwrap_or_default();
        let ino = self.new_node(FileKind::File, mode, Data::File(bytes));
        // The new content keeps the file's extended attributes, as the agent's commit does.
        self.node_mut(ino).xattrs = xattrs;
        if let Some((uid, gid)) = owner {
            let n = self.node_mut(ino);
            n.uid = uid;
            n.gid = gid;
        }
        if slot.ino.is_some() {
            self.remove_entry(slot.dir, &slot.name);
        }
        self.add_entry(slot.dir, slot.name.clone(), ino);
        ino
    }

    fn file_bytes(&self, ino: u64, path: &[u8]) -> Result<&Vec<u8>> {
        match &self.node(ino).data {
            Data::File(b) => Ok(b),
            Data::Dir(_) => Err(RemoteError::IsDir(shown(path))),
            _ => Err(RemoteError::Invalid(format!(
                "{}: not a regular file",
                shown(path)
            ))),
        }
    }

    /// Where a query runs: the path with its symlinks followed (inside the workspace only).
    fn query_root(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let slot = self.resolve(path.as_bytes(), true)?;
        if slot.ino.is_none() {
            return Err(RemoteError::NotFound(path.display()));
        }
        Ok(self.path_of(&slot))
    }

    fn tree_from(&self, path: &[u8], dir: u64, out: &mut Vec<TreeEntry>) {
        let mut stack = vec![(path.to_vec(), dir)];
        while let Some((p, d)) = stack.pop() {
            let Some(entries) = self.node(d).dir() else {
                continue;
            };
            let mut subdirs = Vec::new();
            for (name, &ino) in entries {
                let child = join(&p, name);
                if self.node(ino).kind == FileKind::Dir {
                    subdirs.push((child.clone(), ino));
                }
                out.push(TreeEntry {
                    path: WireBytes(child),
                    attr: self.attr(ino),
                });
            }
            stack.extend(subdirs.into_iter().rev());
        }
    }
}

impl Default for MemoryRemote {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRemote {
    /// An empty sandbox.
    pub fn new() -> Self {
        let (feed, _) = broadcast::channel(RING_EVENTS);
        MemoryRemote {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new()),
                feed,
            }),
        }
    }

    /// The sandbox side: what processes in the sandbox do, bypassing the `Remote`.
    pub fn sandbox(&self) -> MemorySandbox {
        MemorySandbox {
            inner: self.inner.clone(),
        }
    }

    /// Lower (or raise) the largest file size, past which writes fail with `FileTooBig`.
    pub fn set_max_file_size(&self, bytes: u64) {
        self.inner.lock().max_file_size = bytes;
    }

    /// Act as a transport with these capabilities: without `patch_commits` a patch commit is
    /// refused, without `feed` a watch is.
    pub fn set_capabilities(&self, capabilities: super::Capabilities) {
        self.inner.lock().capabilities = capabilities;
    }

    /// Keep only this many change events for reconnecting watchers.
    pub fn set_ring_events(&self, events: usize) {
        let mut s = self.inner.lock();
        s.ring = events.max(1);
        while s.events.len() > s.ring {
            s.events.pop_front();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory sandbox lock")
    }

    fn publish(&self, s: &mut State, path: &[u8], kind: ChangeKind) {
        s.publish(&self.feed, path, kind);
    }

    fn create_node(
        &self,
        path: &RemotePath,
        kind: FileKind,
        mode: u32,
        data: Data,
        rdev: u64,
    ) -> Result<Attr> {
        let p = path.as_bytes();
        let mut s = self.lock();
        let slot = s.parent_slot(p)?;
        if slot.ino.is_some() {
            return Err(RemoteError::Exists(shown(p)));
        }
        let ino = s.new_node(kind, mode, data);
        s.node_mut(ino).rdev = rdev;
        // A set-group-ID directory gives new entries its group, and new directories the bit.
        let parent = s.node(slot.dir);
        if parent.mode & 0o2000 != 0 {
            let gid = parent.gid;
            let n = s.node_mut(ino);
            n.gid = gid;
            if kind == FileKind::Dir {
                n.mode |= 0o2000;
            }
        }
        s.add_entry(slot.dir, slot.name, ino);
        self.publish(&mut s, p, ChangeKind::Created);
        Ok(s.attr(ino))
    }

    fn rename(&self, from: &[u8], to: &[u8], mode: RenameMode) -> Result<()> {
        let mut s = self.lock();
        if from.is_empty() || to.is_empty() {
            return Err(root_invalid());
        }
        let src = s.parent_slot(from)?;
        let dst = s.parent_slot(to)?;
        let Some(src_ino) = src.ino else {
            return Err(RemoteError::NotFound(shown(from)));
        };
        let src_dir = s.node(src_ino).kind == FileKind::Dir;
        match (mode, dst.ino) {
            (RenameMode::NoReplace, Some(_)) => return Err(RemoteError::Exists(shown(to))),
            (RenameMode::Exchange, None) => return Err(RemoteError::NotFound(shown(to))),
            _ => {}
        }
        // A directory cannot move into its own subtree (the target's parent would be inside).
        if src_dir && s.is_within(dst.dir, src_ino) {
            return Err(RemoteError::Invalid(format!(
                "{}: cannot move a directory into itself ({})",
                shown(from),
                shown(to)
            )));
        }
        if mode == RenameMode::Exchange {
            let dst_ino = dst.ino.expect("checked above");
            if s.node(dst_ino).kind == FileKind::Dir && s.is_within(src.dir, dst_ino) {
                return Err(RemoteError::Invalid(format!(
                    "{}: cannot move a directory into itself ({})",
                    shown(to),
                    shown(from)
                )));
            }
            if src_ino == dst_ino {
                return Ok(());
            }
            s.dir_entries_mut(src.dir).insert(src.name.clone(), dst_ino);
            s.dir_entries_mut(dst.dir).insert(dst.name.clone(), src_ino);
            for (ino, dir) in [(dst_ino, src.dir), (src_ino, dst.dir)] {
                if s.node(ino).kind == FileKind::Dir {
                    s.node_mut(ino).parent = dir;
                }
            }
            let (a_dir, b_dir) = (src_dir, s.node(dst_ino).kind == FileKind::Dir);
            if src.dir != dst.dir && a_dir != b_dir {
                let (gains, loses) = if a_dir {
                    (dst.dir, src.dir)
                } else {
                    (src.dir, dst.dir)
                };
                s.node_mut(gains).nlink += 1;
                s.node_mut(loses).nlink -= 1;
            }
            s.touch_dir(src.dir);
            s.touch_dir(dst.dir);
            s.touch_ctime(src_ino);
            s.touch_ctime(dst_ino);
            self.publish(
                &mut s,
                from,
                ChangeKind::Renamed {
                    to: WireBytes(to.to_vec()),
                },
            );
            self.publish(
                &mut s,
                to,
                ChangeKind::Renamed {
                    to: WireBytes(from.to_vec()),
                },
            );
            return Ok(());
        }
        if let Some(dst_ino) = dst.ino {
            if dst_ino == src_ino {
                // Two names of one inode (or one name twice): rename(2) does nothing.
                return Ok(());
            }
            let dst_is_dir = s.node(dst_ino).kind == FileKind::Dir;
            match (src_dir, dst_is_dir) {
                (false, true) => return Err(RemoteError::IsDir(shown(to))),
                (true, false) => return Err(RemoteError::NotDir(shown(to))),
                (true, true) => {
                    if s.node(dst_ino).dir().is_some_and(|d| !d.is_empty()) {
                        return Err(RemoteError::NotEmpty(shown(to)));
                    }
                    // The subtree check above covered dst inside src; src inside dst is only
                    // possible when dst is not empty.
                }
                (false, false) => {}
            }
            s.remove_entry(dst.dir, &dst.name);
        }
        // Move the name: the inode's link count does not change, its directories' may.
        s.dir_entries_mut(src.dir).remove(&src.name);
        s.dir_entries_mut(dst.dir).insert(dst.name.clone(), src_ino);
        if src_dir {
            s.node_mut(src.dir).nlink -= 1;
            s.node_mut(dst.dir).nlink += 1;
            s.node_mut(src_ino).parent = dst.dir;
        }
        s.touch_dir(src.dir);
        s.touch_dir(dst.dir);
        s.touch_ctime(src_ino);
        self.publish(
            &mut s,
            from,
            ChangeKind::Renamed {
                to: WireBytes(to.to_vec()),
            },
        );
        Ok(())
    }
}

impl MemoryRemote {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// A regular file's content for a query (symlinks inside followed).
    fn file_for_query(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), true)?;
        s.file_bytes(ino, path.as_bytes()).cloned()
    }
}

#[async_trait]
impl Remote for MemoryRemote {
    async fn info(&self) -> Result<RemoteInfo> {
        let (uid, gid) = {
            let s = self.lock();
            (s.uid, s.gid)
        };
        Ok(RemoteInfo {
            protocol: super::wire::PROTOCOL_VERSION,
            agent_version: format!("memory {}", env!("CARGO_PKG_VERSION")),
            workspace_id: None,
            root: "memory:".into(),
            // The owner of what it creates.
            user: Some(super::Identity {
                uid,
                gid,
                groups: vec![gid],
            }),
            landlock: None,
            tree_formats: Vec::new(),
            commit_absent: true,
            capabilities: self.lock().capabilities,
        })
    }

    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), false)?;
        Ok(s.attr(ino))
    }

    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        super::check_stat_many(paths)?;
        let s = self.lock();
        Ok(paths
            .iter()
            .map(|p| s.lookup(p.as_bytes(), false).map(|ino| s.attr(ino)))
            .collect())
    }

    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), true)?;
        let entries = s
            .node(ino)
            .dir()
            .ok_or_else(|| RemoteError::NotDir(path.display()))?;
        Ok(entries
            .iter()
            .map(|(name, &i)| DirEntry {
                name: WireBytes(name.clone()),
                attr: s.attr(i),
            })
            .collect())
    }

    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), true)?;
        if s.node(ino).dir().is_none() {
            return Err(RemoteError::NotDir(path.display()));
        }
        let mut out = Vec::new();
        s.tree_from(path.as_bytes(), ino, &mut out);
        Ok(stream::iter(out.into_iter().map(Ok)).boxed())
    }

    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        if len > MAX_READ_BYTES {
            return Err(RemoteError::TooLarge(format!(
                "reads are limited to {MAX_READ_BYTES} bytes"
            )));
        }
        let mut s = self.lock();
        let ino = s.lookup(path.as_bytes(), true)?;
        let bytes = s.file_bytes(ino, path.as_bytes())?;
        let start = (offset.min(bytes.len() as u64)) as usize;
        let end = (start + len as usize).min(bytes.len());
        let data = Bytes::copy_from_slice(&bytes[start..end]);
        let version = s.version(ino);
        let now = s.now();
        s.node_mut(ino).atime = now;
        Ok(ReadResult { data, version })
    }

    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        if matches!(content, CommitContent::Patch { .. }) && !self.lock().capabilities.patch_commits
        {
            return Err(RemoteError::Unsupported(format!(
                "{}: patch commits (this sandbox takes whole files)",
                path.display()
            )));
        }
        let p = path.as_bytes();
        // Check first (a stale base or a bad target is answered without reading the body,
        // though the body is still drained, as the agent does), then again when applying.
        let precheck = {
            let s = self.lock();
            s.commit_slot(p).and_then(|slot| {
                if let Some(ino) = slot.ino {
                    s.check_regular(ino, p)?;
                }
                s.check_base(p, opts.base.as_ref(), slot.ino)
            })
        };
        let body = match content {
            CommitContent::Whole(mut reader) => {
                let mut buf = Vec::new();
                let mut limited = (&mut reader).take(MAX_MEMORY_COMMIT_BYTES + 1);
                let read = limited.read_to_end(&mut buf).await;
                precheck?;
                read.map_err(|e| RemoteError::Transport(format!("commit body: {e}")))?;
                if buf.len() as u64 > MAX_MEMORY_COMMIT_BYTES {
                    return Err(RemoteError::TooLarge(format!(
                        "commits are limited to {MAX_MEMORY_COMMIT_BYTES} bytes"
                    )));
                }
                Ok(buf)
            }
            CommitContent::Patch {
                cut,
                new_len,
                ranges,
            } => {
                precheck?;
                Err((cut, new_len, ranges))
            }
        };
        let mut s = self.lock();
        let slot = s.commit_slot(p)?;
        if let Some(ino) = slot.ino {
            s.check_regular(ino, p)?;
        }
        s.check_base(p, opts.base.as_ref(), slot.ino)?;
        let bytes = match body {
            Ok(bytes) => {
                s.check_size(bytes.len() as u64, p)?;
                bytes
            }
            Err((cut, new_len, ranges)) => {
                // A patch needs its base file (the agent says ENOENT too), unless it cuts it
                // to nothing (a new sparse file).
                let base = match slot.ino {
                    Some(ino) if cut > 0 => Some(ino),
                    None if cut > 0 => return Err(RemoteError::NotFound(shown(p))),
                    _ => None,
                };
                let mut end = new_len;
                for (off, data) in &ranges {
                    let e = off
                        .checked_add(data.len() as u64)
                        .ok_or_else(|| RemoteError::FileTooBig(shown(p)))?;
                    end = end.max(e);
                }
                s.check_size(end, p)?;
                if end > MAX_MEMORY_COMMIT_BYTES {
                    return Err(RemoteError::TooLarge(format!(
                        "commits are limited to {MAX_MEMORY_COMMIT_BYTES} bytes"
                    )));
                }
                let nothing = Vec::new();
                let base = match base {
                    Some(ino) => s.file_bytes(ino, p)?,
                    None => &nothing,
                };
                apply_patch(base, cut, new_len, &ranges)
            }
        };
        let created = slot.ino.is_none();
        let ino = s.replace_file(&slot, bytes, opts.create_mode);
        if let Some(t) = opts.mtime_ns {
            s.node_mut(ino).mtime = t;
        }
        if let Some(t) = opts.atime_ns {
            s.node_mut(ino).atime = t;
        }
        let target = s.path_of(&slot);
        let kind = if created {
            ChangeKind::Created
        } else {
            ChangeKind::Modified
        };
        self.inner.publish(&mut s, &target, kind);
        Ok(s.attr(ino))
    }

    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.inner
            .create_node(path, FileKind::File, mode, Data::File(Vec::new()), 0)
    }

    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.inner
            .create_node(path, FileKind::Dir, mode, Data::Dir(BTreeMap::new()), 0)
    }

    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let (kind, rdev) = match kind {
            SpecialKind::Fifo => (FileKind::Fifo, 0),
            SpecialKind::Socket => (FileKind::Socket, 0),
            SpecialKind::CharDevice => (FileKind::CharDevice, rdev),
            SpecialKind::BlockDevice => (FileKind::BlockDevice, rdev),
        };
        self.inner
            .create_node(path, kind, mode, Data::Special, rdev)
    }

    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        let p = path.as_bytes();
        let mut s = self.lock();
        let slot = s.parent_slot(p)?;
        let ino = slot.ino.ok_or_else(|| RemoteError::NotFound(shown(p)))?;
        if s.node(ino).kind == FileKind::Dir {
            return Err(RemoteError::IsDir(shown(p)));
        }
        s.remove_entry(slot.dir, &slot.name);
        self.inner.publish(&mut s, p, ChangeKind::Removed);
        Ok(())
    }

    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        let p = path.as_bytes();
        let mut s = self.lock();
        let slot = s.parent_slot(p)?;
        let ino = slot.ino.ok_or_else(|| RemoteError::NotFound(shown(p)))?;
        match s.node(ino).dir() {
            None => return Err(RemoteError::NotDir(shown(p))),
            Some(d) if !d.is_empty() => return Err(RemoteError::NotEmpty(shown(p))),
            Some(_) => {}
        }
        s.remove_entry(slot.dir, &slot.name);
        self.inner.publish(&mut s, p, ChangeKind::Removed);
        Ok(())
    }

    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        self.inner.rename(from.as_bytes(), to.as_bytes(), mode)
    }

    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        let (e, n) = (existing.as_bytes(), new.as_bytes());
        let mut s = self.lock();
        // Both parents first, then the names, as the agent opens both parents before linkat.
        let src = s.parent_slot(e)?;
        let dst = s.parent_slot(n)?;
        // Then linkat's order: the old name, the new one, and last what the old one is.
        let ino = src.ino.ok_or_else(|| RemoteError::NotFound(shown(e)))?;
        if dst.ino.is_some() {
            return Err(RemoteError::Exists(shown(n)));
        }
        if s.node(ino).kind == FileKind::Dir {
            return Err(RemoteError::Perm(format!(
                "{}: hard links to directories are not allowed",
                shown(e)
            )));
        }
        s.node_mut(ino).nlink += 1;
        s.touch_ctime(ino);
        s.add_entry(dst.dir, dst.name, ino);
        self.inner.publish(&mut s, n, ChangeKind::Created);
        Ok(s.attr(ino))
    }

    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(RemoteError::Invalid(
                "symlink target is empty or has a NUL".into(),
            ));
        }
        if target.len() > SYMLINK_MAX {
            return Err(RemoteError::NameTooLong(shown(target)));
        }
        self.inner.create_node(
            path,
            FileKind::Symlink,
            0o777,
            Data::Symlink(target.to_vec()),
            0,
        )
    }

    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), false)?;
        match &s.node(ino).data {
            Data::Symlink(t) => Ok(t.clone()),
            _ => Err(RemoteError::Invalid(format!(
                "{}: not a symbolic link",
                path.display()
            ))),
        }
    }

    async fn setattr(&self, path: &RemotePath, set: SetAttr) -> Result<Attr> {
        let p = path.as_bytes();
        let mut s = self.lock();
        let ino = s.lookup(p, false)?;
        let kind = s.node(ino).kind;
        // Check everything before changing anything.
        if kind == FileKind::Symlink && set.mode.is_some() {
            return Err(RemoteError::Unsupported(format!(
                "{}: a symbolic link has no mode of its own",
                shown(p)
            )));
        }
        // The file a size applies to: truncate(2) follows a final symlink, as the agent does.
        let sized = match set.size {
            None => None,
            Some(size) => {
                let target = if kind == FileKind::Symlink {
                    s.lookup(p, true)?
                } else {
                    ino
                };
                match s.node(target).kind {
                    FileKind::File => s.check_size(size, p)?,
                    FileKind::Dir => return Err(RemoteError::IsDir(shown(p))),
                    _ => {
                        return Err(RemoteError::Invalid(format!(
                            "{}: not a regular file",
                            shown(p)
                        )))
                    }
                }
                Some((target, size))
            }
        };
        let mut changed = false;
        if let Some(mode) = set.mode {
            s.node_mut(ino).mode = mode & 0o7777;
            changed = true;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let n = s.node_mut(ino);
            if let Some(uid) = set.uid {
                n.uid = uid;
            }
            if let Some(gid) = set.gid {
                n.gid = gid;
            }
            // chown clears set-user-ID, and set-group-ID on a group-executable file.
            if kind == FileKind::File {
                n.mode &= !0o4000;
                if n.mode & 0o010 != 0 {
                    n.mode &= !0o2000;
                }
            }
            changed = true;
        }
        if let Some((target, size)) = sized {
            let mut bytes = s.file_bytes(target, p)?.clone();
            bytes.resize(size as usize, 0);
            s.set_content(target, bytes);
            changed = true;
        }
        if set.atime_ns.is_some() || set.mtime_ns.is_some() {
            let n = s.node_mut(ino);
            if let Some(t) = set.atime_ns {
                n.atime = t;
            }
            if let Some(t) = set.mtime_ns {
                n.mtime = t;
            }
            changed = true;
        }
        if changed {
            let now = s.now();
            s.node_mut(ino).ctime = now;
            // inotify's IN_ATTRIB and IN_MODIFY both reach the feed as a modification.
            self.inner.publish(&mut s, p, ChangeKind::Modified);
        }
        Ok(s.attr(ino))
    }

    async fn statfs(&self) -> Result<StatFs> {
        let s = self.lock();
        let used: u64 = s
            .nodes
            .values()
            .map(|n| n.size().div_ceil(BLOCK_SIZE))
            .sum();
        let files = s.nodes.len() as u64;
        Ok(StatFs {
            block_size: BLOCK_SIZE,
            blocks: CAPACITY_BLOCKS,
            blocks_free: CAPACITY_BLOCKS.saturating_sub(used),
            blocks_available: CAPACITY_BLOCKS.saturating_sub(used),
            files: CAPACITY_FILES,
            files_free: CAPACITY_FILES.saturating_sub(files),
            name_max: MAX_NAME_BYTES as u64,
        })
    }

    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), false)?;
        s.node(ino)
            .xattrs
            .get(name)
            .cloned()
            .ok_or_else(|| RemoteError::NoAttr(format!("{}: {}", path.display(), shown(name))))
    }

    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        let s = self.lock();
        let ino = s.lookup(path.as_bytes(), false)?;
        Ok(s.node(ino).xattrs.keys().cloned().collect())
    }

    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        check_xattr_name(name)?;
        if flags.create && flags.replace {
            return Err(RemoteError::Invalid(
                "setxattr: create and replace together".into(),
            ));
        }
        if value.len() > MAX_XATTR_VALUE_BYTES {
            return Err(RemoteError::TooLarge(format!(
                "xattr values are limited to {MAX_XATTR_VALUE_BYTES} bytes"
            )));
        }
        let p = path.as_bytes();
        let mut s = self.lock();
        let ino = s.lookup(p, false)?;
        check_user_xattr_kind(s.node(ino).kind, name, p)?;
        let exists = s.node(ino).xattrs.contains_key(name);
        if flags.create && exists {
            return Err(RemoteError::Exists(format!(
                "{}: {}",
                shown(p),
                shown(name)
            )));
        }
        if flags.replace && !exists {
            return Err(RemoteError::NoAttr(format!(
                "{}: {}",
                shown(p),
                shown(name)
            )));
        }
        s.node_mut(ino).xattrs.insert(name.to_vec(), value.to_vec());
        s.touch_ctime(ino);
        self.inner.publish(&mut s, p, ChangeKind::Modified);
        Ok(())
    }

    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        let p = path.as_bytes();
        let mut s = self.lock();
        let ino = s.lookup(p, false)?;
        check_user_xattr_kind(s.node(ino).kind, name, p)?;
        if s.node_mut(ino).xattrs.remove(name).is_none() {
            return Err(RemoteError::NoAttr(format!(
                "{}: {}",
                shown(p),
                shown(name)
            )));
        }
        s.touch_ctime(ino);
        self.inner.publish(&mut s, p, ChangeKind::Modified);
        Ok(())
    }

    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        let p = path.as_bytes();
        if len == 0 {
            return Err(RemoteError::Invalid("fallocate: zero length".into()));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| RemoteError::FileTooBig(shown(p)))?;
        let mut s = self.lock();
        let ino = s.lookup(p, true)?;
        let size = s.file_bytes(ino, p)?.len() as u64;
        s.check_size(end, p)?;
        if !keep_size && end > size {
            let mut bytes = s.file_bytes(ino, p)?.clone();
            bytes.resize(end as usize, 0);
            s.set_content(ino, bytes);
            self.inner.publish(&mut s, p, ChangeKind::Modified);
        }
        Ok(s.attr(ino))
    }

    async fn copy_range(
        &self,
        src: &RemotePath,
        src_offset: u64,
        dst: &RemotePath,
        dst_offset: u64,
        len: u64,
        dst_base: Option<Version>,
    ) -> Result<(u64, Attr)> {
        let (sp, dp) = (src.as_bytes(), dst.as_bytes());
        let mut s = self.lock();
        // The destination first, as the agent prepares its commit before it reads the source.
        let slot = s.commit_slot(dp)?;
        let dst_ino = slot.ino.ok_or_else(|| RemoteError::NotFound(shown(dp)))?;
        s.check_regular(dst_ino, dp)?;
        s.check_base(dp, dst_base.as_ref(), Some(dst_ino))?;
        let mut bytes = s.file_bytes(dst_ino, dp)?.clone();
        let src_ino = s.lookup(sp, true)?;
        let src_bytes = s.file_bytes(src_ino, sp)?;
        let start = (src_offset.min(src_bytes.len() as u64)) as usize;
        let end = (start as u64 + len).min(src_bytes.len() as u64) as usize;
        let piece = src_bytes[start..end].to_vec();
        let copied = piece.len() as u64;
        if copied > 0 {
            let new_end = dst_offset
                .checked_add(copied)
                .ok_or_else(|| RemoteError::FileTooBig(shown(dp)))?;
            s.check_size(new_end, dp)?;
            if bytes.len() < new_end as usize {
                bytes.resize(new_end as usize, 0);
            }
            bytes[dst_offset as usize..new_end as usize].copy_from_slice(&piece);
        }
        let ino = s.replace_file(&slot, bytes, None);
        let target = s.path_of(&slot);
        self.inner.publish(&mut s, &target, ChangeKind::Modified);
        Ok((copied, s.attr(ino)))
    }

    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        req.validate()?;
        let bytes = self.file_for_query(path)?;
        let mut window = LineWindow::new(req);
        window.feed(&bytes);
        Ok(window.finish())
    }

    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        // Matches are collected under the lock (no `.await` in between): the agent's caps
        // bound them, and a test's tree is small. A path that cannot be searched says why
        // first, as the agent's does.
        let s = self.lock();
        s.query_root(path)?;
        super::source_query::grep(&*s, path, opts)
    }

    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        let s = self.lock();
        s.query_root(path)?;
        super::source_query::glob(&*s, path, pattern)
    }

    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        let s = self.lock();
        s.query_root(path)?;
        super::source_query::fuzzy(&*s, path, req)
    }

    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        let p = path.as_bytes();
        let mut s = self.lock();
        let slot = match s.commit_slot(p) {
            // A dangling symlink is its own commit target, but there is no file to edit.
            Ok(slot)
                if slot
                    .ino
                    .is_some_and(|i| s.node(i).kind != FileKind::Symlink) =>
            {
                slot
            }
            Ok(_) | Err(RemoteError::NotFound(_)) => {
                return Err(SearchError::NotFound(shown(p)).into())
            }
            Err(e) => return Err(e),
        };
        let ino = slot.ino.expect("checked above");
        let bytes = s.file_bytes(ino, p)?;
        if bytes.len() as u64 > crate::search::edit::MAX_EDIT_FILE_BYTES {
            return Err(SearchError::ReadFailed(shown(p), "too large".into()).into());
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| SearchError::ReadFailed(shown(p), "not valid UTF-8".into()))?;
        let (updated, count) = crate::search::edit::replace_in(text, old, new, replace_all)?;
        s.replace_file(&slot, updated.into_bytes(), None);
        let target = s.path_of(&slot);
        self.inner.publish(&mut s, &target, ChangeKind::Modified);
        Ok(count)
    }

    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        if !self.lock().capabilities.feed {
            return Err(RemoteError::Unsupported("no change feed".into()));
        }
        let (backlog, rx) = {
            let s = self.lock();
            let rx = self.inner.feed.subscribe();
            let mut backlog = Vec::new();
            if let Some(since) = since {
                let oldest = s.events.front().map_or(s.next_seq, |e| e.seq);
                if since + 1 < oldest {
                    backlog.push(ChangeEvent::lost(since));
                }
                backlog.extend(s.events.iter().filter(|e| e.seq > since).cloned());
            }
            (backlog, rx)
        };
        let last = since.unwrap_or(0);
        let live = stream::unfold((rx, last), |(mut rx, mut last)| async move {
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) if ev.seq <= last => continue,
                    Ok(ev) => ev,
                    Err(broadcast::error::RecvError::Lagged(_)) => ChangeEvent::lost(last),
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                last = last.max(ev.seq);
                return Some((Ok(ev), (rx, last)));
            }
        });
        let backlog_last = backlog.iter().map(|e| e.seq).max().unwrap_or(last);
        let live = live.filter(move |ev| {
            let keep = !matches!(ev, Ok(e) if e.seq <= backlog_last && e.kind != ChangeKind::Lost);
            async move { keep }
        });
        Ok(stream::iter(backlog.into_iter().map(Ok))
            .chain(live)
            .boxed())
    }
}

/// The base cut to `cut`, each range written at its offset, then cut or extended to `new_len`.
fn apply_patch(base: &[u8], cut: u64, new_len: u64, ranges: &[(u64, Bytes)]) -> Vec<u8> {
    let mut out = base[..(cut.min(base.len() as u64) as usize)].to_vec();
    for (off, data) in ranges {
        let (start, end) = (*off as usize, *off as usize + data.len());
        if out.len() < end {
            out.resize(end, 0);
        }
        out[start..end].copy_from_slice(data);
    }
    out.resize(new_len as usize, 0);
    out
}

/// The search core walks the sandbox through this view: paths are workspace-relative, and the
/// walk itself never follows a symlink (only `resolve` does).
impl TreeSource for State {
    fn kind(&self, path: &[u8]) -> Option<SourceKind> {
        let ino = self.lookup(path, false).ok()?;
        Some(source_kind(self.node(ino).kind))
    }

    fn entries(&self, dir: &[u8]) -> Vec<SourceEntry> {
        let Ok(ino) = self.lookup(dir, true) else {
            return Vec::new();
        };
        let Some(entries) = self.node(ino).dir() else {
            return Vec::new();
        };
        entries
            .iter()
            .map(|(name, &i)| {
                let n = self.node(i);
                SourceEntry {
                    name: name.clone(),
                    kind: source_kind(n.kind),
                    size: n.size(),
                }
            })
            .collect()
    }

    fn content(&self, path: &[u8]) -> Option<Vec<u8>> {
        let ino = self.lookup(path, true).ok()?;
        match &self.node(ino).data {
            Data::File(b) => Some(b.clone()),
            _ => None,
        }
    }

    fn resolve(&self, path: &[u8]) -> Option<Vec<u8>> {
        let slot = State::resolve(self, path, true).ok()?;
        slot.ino.map(|_| self.path_of(&slot))
    }
}

fn source_kind(kind: FileKind) -> SourceKind {
    match kind {
        FileKind::File => SourceKind::File,
        FileKind::Dir => SourceKind::Dir,
        FileKind::Symlink => SourceKind::Symlink,
        _ => SourceKind::Other,
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(RemoteError::Invalid("empty attribute name".into()));
    }
    if name.len() > MAX_XATTR_NAME_BYTES {
        return Err(RemoteError::NameTooLong(shown(name)));
    }
    const NAMESPACES: [&[u8]; 4] = [b"user.", b"trusted.", b"security.", b"system."];
    if !NAMESPACES.iter().any(|ns| name.starts_with(ns)) {
        return Err(RemoteError::Unsupported(format!(
            "{}: attribute names need a namespace (user., trusted., security., system.)",
            shown(name)
        )));
    }
    Ok(())
}

/// Linux allows `user.` attributes only on regular files and directories: setting or removing
/// one elsewhere is `EPERM` (reading one finds none, `ENODATA`).
fn check_user_xattr_kind(kind: FileKind, name: &[u8], path: &[u8]) -> Result<()> {
    if name.starts_with(b"user.") && !matches!(kind, FileKind::File | FileKind::Dir) {
        return Err(RemoteError::Perm(format!(
            "{}: user attributes only on files and directories",
            shown(path)
        )));
    }
    Ok(())
}

/// Run one of the memory backend's operations to completion: none of them waits for anything
/// (the only `.await` reads a commit body, and the sandbox side passes an in-memory one).
fn done<T>(f: impl std::future::Future<Output = T>) -> T {
    futures_util::FutureExt::now_or_never(f).expect("memory operations never wait")
}

fn rpath(path: impl AsRef<[u8]>) -> Result<RemotePath> {
    RemotePath::new(path.as_ref().to_vec())
}

/// The sandbox side: what a process inside the sandbox does, bypassing the `Remote` (and any
/// wrapper around it), so a test can change files while the mount holds state. Paths are
/// workspace-relative; symlinks inside are followed where the system call would follow them.
impl MemorySandbox {
    fn remote(&self) -> MemoryRemote {
        MemoryRemote {
            inner: self.inner.clone(),
        }
    }

    /// The number of the last change-feed event published (none yet: 0).
    pub fn last_seq(&self) -> u64 {
        self.remote().lock().next_seq - 1
    }

    /// `open(O_WRONLY|O_CREAT|O_TRUNC)` + `write`: the content replaced in place (same inode),
    /// the file created (mode 0644) if missing.
    pub fn write(&self, path: impl AsRef<[u8]>, data: &[u8]) -> Result<()> {
        self.write_with(path, |bytes| {
            bytes.clear();
            bytes.extend_from_slice(data);
        })
    }

    /// `pwrite` at `offset` in place (zeros fill a gap), the file created if missing.
    pub fn write_at(&self, path: impl AsRef<[u8]>, offset: u64, data: &[u8]) -> Result<()> {
        self.write_with(path, |bytes| {
            let (start, end) = (offset as usize, offset as usize + data.len());
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[start..end].copy_from_slice(data);
        })
    }

    /// `truncate(2)` in place.
    pub fn truncate(&self, path: impl AsRef<[u8]>, len: u64) -> Result<()> {
        let p = rpath(&path)?;
        let mut s = self.inner.lock();
        let ino = s.lookup(p.as_bytes(), true)?;
        s.check_size(len, p.as_bytes())?;
        let mut bytes = s.file_bytes(ino, p.as_bytes())?.clone();
        bytes.resize(len as usize, 0);
        s.set_content(ino, bytes);
        self.inner
            .publish(&mut s, p.as_bytes(), ChangeKind::Modified);
        Ok(())
    }

    fn write_with(&self, path: impl AsRef<[u8]>, change: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let p = rpath(&path)?;
        let mut s = self.inner.lock();
        let slot = s.resolve(p.as_bytes(), true)?;
        let ino = match slot.ino {
            Some(ino) => ino,
            None => {
                let ino = s.new_node(FileKind::File, 0o644, Data::File(Vec::new()));
                s.add_entry(slot.dir, slot.name.clone(), ino);
                let created = s.path_of(&slot);
                self.inner.publish(&mut s, &created, ChangeKind::Created);
                ino
            }
        };
        let mut bytes = s.file_bytes(ino, p.as_bytes())?.clone();
        change(&mut bytes);
        s.check_size(bytes.len() as u64, p.as_bytes())?;
        s.set_content(ino, bytes);
        let target = s.path_of(&slot);
        self.inner.publish(&mut s, &target, ChangeKind::Modified);
        Ok(())
    }

    /// An editor's save: write a temp file beside `path`, then rename it over `path` (the
    /// name gets a new inode; the feed sees the temp created, written and renamed).
    pub fn replace(&self, path: impl AsRef<[u8]>, data: &[u8]) -> Result<()> {
        let p = rpath(&path)?;
        let (parent, name) = p.split_last().ok_or_else(root_invalid)?;
        let mut temp_name = b".".to_vec();
        temp_name.extend_from_slice(&name[..name.len().min(200)]);
        temp_name.extend_from_slice(b".save~");
        let temp = parent.join(&temp_name)?;
        self.write(temp.as_bytes(), data)?;
        self.rename(temp.as_bytes(), p.as_bytes())
    }

    /// The whole content of a file (symlinks followed).
    pub fn read(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>> {
        let p = rpath(&path)?;
        let s = self.inner.lock();
        let ino = s.lookup(p.as_bytes(), true)?;
        s.file_bytes(ino, p.as_bytes()).cloned()
    }

    /// `mkdir` with mode 0755.
    pub fn mkdir(&self, path: impl AsRef<[u8]>) -> Result<()> {
        done(self.remote().mkdir(&rpath(path)?, 0o755)).map(drop)
    }

    /// `mkdir -p`.
    pub fn mkdir_all(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let p = rpath(&path)?;
        let mut at = RemotePath::root();
        for part in p.as_bytes().split(|&b| b == b'/') {
            at = at.join(part)?;
            match self.mkdir(at.as_bytes()) {
                Ok(()) => {}
                Err(RemoteError::Exists(_)) if self.is_dir(at.as_bytes()) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn is_dir(&self, path: &[u8]) -> bool {
        let s = self.inner.lock();
        s.lookup(path, true)
            .is_ok_and(|ino| s.node(ino).kind == FileKind::Dir)
    }

    /// `symlink(target, path)`.
    pub fn symlink(&self, target: impl AsRef<[u8]>, path: impl AsRef<[u8]>) -> Result<()> {
        done(self.remote().symlink(&rpath(path)?, target.as_ref())).map(drop)
    }

    /// `link(existing, new)`.
    pub fn hard_link(&self, existing: impl AsRef<[u8]>, new: impl AsRef<[u8]>) -> Result<()> {
        done(self.remote().link(&rpath(existing)?, &rpath(new)?)).map(drop)
    }

    /// `remove(3)`: unlink a file or symlink, or remove an empty directory.
    pub fn remove(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let p = rpath(&path)?;
        let r = self.remote();
        match done(r.unlink(&p)) {
            Err(RemoteError::IsDir(_)) => done(r.rmdir(&p)),
            other => other,
        }
    }

    /// `rm -r` (never of the workspace root).
    pub fn remove_all(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let p = rpath(&path)?;
        if p.is_root() {
            return Err(root_invalid());
        }
        if self.metadata(p.as_bytes())?.kind == FileKind::Dir {
            for name in self.list(p.as_bytes())? {
                self.remove_all(p.join(&name)?.as_bytes())?;
            }
        }
        self.remove(p.as_bytes())
    }

    /// `rename(from, to)`, replacing `to`.
    pub fn rename(&self, from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Result<()> {
        self.inner.rename(
            rpath(from)?.as_bytes(),
            rpath(to)?.as_bytes(),
            RenameMode::Replace,
        )
    }

    /// `chmod` (a symlink is followed).
    pub fn chmod(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<()> {
        let p = self.followed(path)?;
        let set = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        done(self.remote().setattr(&p, set)).map(drop)
    }

    /// `utimensat` of the mtime (a symlink is followed).
    pub fn set_mtime(&self, path: impl AsRef<[u8]>, mtime_ns: i64) -> Result<()> {
        let p = self.followed(path)?;
        let set = SetAttr {
            mtime_ns: Some(mtime_ns),
            ..Default::default()
        };
        done(self.remote().setattr(&p, set)).map(drop)
    }

    /// The path a symlink chain leads to (the path itself otherwise).
    fn followed(&self, path: impl AsRef<[u8]>) -> Result<RemotePath> {
        let p = rpath(&path)?;
        let s = self.inner.lock();
        let slot = s.resolve(p.as_bytes(), true)?;
        if slot.ino.is_none() {
            return Err(RemoteError::NotFound(p.display()));
        }
        RemotePath::new(s.path_of(&slot))
    }

    /// `lstat`: the attributes of the path itself (a symlink is not followed).
    pub fn metadata(&self, path: impl AsRef<[u8]>) -> Result<Attr> {
        let p = rpath(&path)?;
        let s = self.inner.lock();
        let ino = s.lookup(p.as_bytes(), false)?;
        Ok(s.attr(ino))
    }

    /// Does the path exist (a dangling symlink does)?
    pub fn exists(&self, path: impl AsRef<[u8]>) -> bool {
        self.metadata(path).is_ok()
    }

    /// A directory's names, sorted (symlinks followed).
    pub fn list(&self, path: impl AsRef<[u8]>) -> Result<Vec<Vec<u8>>> {
        let p = rpath(&path)?;
        let s = self.inner.lock();
        let ino = s.lookup(p.as_bytes(), true)?;
        let entries = s
            .node(ino)
            .dir()
            .ok_or_else(|| RemoteError::NotDir(p.display()))?;
        Ok(entries.keys().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(s: &str) -> RemotePath {
        RemotePath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn whole(data: &[u8]) -> CommitContent {
        CommitContent::Whole(Box::new(std::io::Cursor::new(data.to_vec())))
    }

    fn based(v: &Version) -> CommitOptions {
        CommitOptions {
            base: Some(v.clone()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn hard_links_are_one_inode_with_a_link_count() {
        let m = MemoryRemote::new();
        m.sandbox().write("a", b"one").unwrap();
        let a = m.stat(&rp("a")).await.unwrap();
        let linked = m.link(&rp("a"), &rp("b")).await.unwrap();
        assert_eq!((linked.ino, linked.nlink), (a.ino, 2));
        assert_eq!(linked.version, a.version, "a link is not a content change");
        assert!(linked.ctime_ns > a.ctime_ns, "a link changes the ctime");
        // Written through one name, read through the other.
        m.sandbox().write("b", b"two").unwrap();
        assert_eq!(&m.read(&rp("a"), 0, 10).await.unwrap().data[..], b"two");
        m.unlink(&rp("a")).await.unwrap();
        assert_eq!(m.stat(&rp("b")).await.unwrap().nlink, 1);
        assert!(matches!(
            m.link(&rp("b"), &rp("b")).await,
            Err(RemoteError::Exists(_))
        ));
        m.mkdir(&rp("d"), 0o755).await.unwrap();
        assert!(matches!(
            m.link(&rp("d"), &rp("d2")).await,
            Err(RemoteError::Perm(_))
        ));
    }

    #[tokio::test]
    async fn a_commit_to_a_hard_linked_file_writes_in_place_and_keeps_the_links() {
        let m = MemoryRemote::new();
        m.sandbox().write("a", b"old").unwrap();
        let single = m.stat(&rp("a")).await.unwrap();
        let after = m
            .commit(&rp("a"), whole(b"one"), based(&single.version))
            .await
            .unwrap();
        assert_ne!(
            after.ino, single.ino,
            "one name: temp then rename, a new inode"
        );
        m.sandbox().hard_link("a", "b").unwrap();
        let before = m.stat(&rp("a")).await.unwrap();
        let after = m
            .commit(&rp("a"), whole(b"new"), based(&before.version))
            .await
            .unwrap();
        assert_eq!(
            (after.ino, after.nlink),
            (before.ino, 2),
            "written in place"
        );
        assert_ne!(after.version, before.version);
        assert_eq!(m.sandbox().read("b").unwrap(), b"new");
    }

    #[tokio::test]
    async fn exchange_swaps_two_names_and_directory_link_counts() {
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        sb.mkdir_all("x/sub").unwrap();
        sb.mkdir_all("y").unwrap();
        sb.write("y/file", b"f").unwrap();
        let (sub, file) = (
            m.stat(&rp("x/sub")).await.unwrap(),
            m.stat(&rp("y/file")).await.unwrap(),
        );
        m.rename(&rp("x/sub"), &rp("y/file"), RenameMode::Exchange)
            .await
            .unwrap();
        assert_eq!(m.stat(&rp("x/sub")).await.unwrap().ino, file.ino);
        assert_eq!(m.stat(&rp("y/file")).await.unwrap().ino, sub.ino);
        // The directory moved from x to y: x lost a subdirectory's `..`, y gained one.
        assert_eq!(m.stat(&rp("x")).await.unwrap().nlink, 2);
        assert_eq!(m.stat(&rp("y")).await.unwrap().nlink, 3);
        assert!(matches!(
            m.rename(&rp("x/sub"), &rp("nope"), RenameMode::Exchange)
                .await,
            Err(RemoteError::NotFound(_))
        ));
        // A directory cannot be swapped into its own subtree.
        sb.mkdir_all("y/file/inner").unwrap();
        assert!(matches!(
            m.rename(&rp("y/file"), &rp("y/file/inner"), RenameMode::Exchange)
                .await,
            Err(RemoteError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn rename_follows_linux_rules() {
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        sb.mkdir_all("a/b").unwrap();
        sb.mkdir_all("empty").unwrap();
        sb.write("f", b"x").unwrap();
        let into_itself = m.rename(&rp("a"), &rp("a/b/c"), RenameMode::Replace).await;
        assert!(matches!(into_itself, Err(RemoteError::Invalid(_))));
        assert!(matches!(
            m.rename(&rp("f"), &rp("empty"), RenameMode::Replace).await,
            Err(RemoteError::IsDir(_))
        ));
        assert!(matches!(
            m.rename(&rp("empty"), &rp("f"), RenameMode::Replace).await,
            Err(RemoteError::NotDir(_))
        ));
        assert!(matches!(
            m.rename(&rp("empty"), &rp("a"), RenameMode::Replace).await,
            Err(RemoteError::NotEmpty(_))
        ));
        let a = m.stat(&rp("a")).await.unwrap();
        // A directory over an empty one replaces it.
        m.rename(&rp("a"), &rp("empty"), RenameMode::Replace)
            .await
            .unwrap();
        let moved = m.stat(&rp("empty")).await.unwrap();
        assert_eq!(moved.ino, a.ino);
        assert_eq!(moved.version, a.version, "a rename keeps the version");
        assert!(moved.ctime_ns > a.ctime_ns, "a rename changes the ctime");
        assert_eq!(m.stat(&RemotePath::root()).await.unwrap().nlink, 3);
        assert!(matches!(
            m.rename(&RemotePath::root(), &rp("x"), RenameMode::Replace)
                .await,
            Err(RemoteError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn a_patch_cuts_then_writes_then_sets_the_length() {
        let m = MemoryRemote::new();
        m.sandbox().write("p", b"0123456789").unwrap();
        let v = m.stat(&rp("p")).await.unwrap().version;
        // Cut to 4 (bytes 4.. are gone), write at 6 (a gap of zeros), grow to 10.
        let patch = CommitContent::Patch {
            cut: 4,
            new_len: 10,
            ranges: vec![(6, Bytes::from_static(b"AB"))],
        };
        let a = m.commit(&rp("p"), patch, based(&v)).await.unwrap();
        assert_eq!(a.size, 10);
        assert_eq!(m.sandbox().read("p").unwrap(), b"0123\0\0AB\0\0");
        // Versions differ, so the old base is now stale.
        let stale = CommitContent::Patch {
            cut: u64::MAX,
            new_len: 1,
            ranges: vec![],
        };
        assert!(matches!(
            m.commit(&rp("p"), stale, based(&v)).await,
            Err(RemoteError::Conflict { .. })
        ));
    }

    #[tokio::test]
    async fn versions_change_with_content_only() {
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        sb.write("f", b"same").unwrap();
        let v0 = m.stat(&rp("f")).await.unwrap().version;
        sb.chmod("f", 0o600).unwrap();
        sb.hard_link("f", "g").unwrap();
        sb.rename("f", "h").unwrap();
        m.setxattr(&rp("h"), b"user.k", b"v", XattrFlags::default())
            .await
            .unwrap();
        assert_eq!(m.stat(&rp("h")).await.unwrap().version, v0);
        // The same bytes written again, within the same clock tick or not, are a new version.
        sb.write("h", b"same").unwrap();
        let v1 = m.stat(&rp("h")).await.unwrap().version;
        assert_ne!(v1, v0);
        sb.write_at("h", 0, b"S").unwrap();
        assert_ne!(m.stat(&rp("h")).await.unwrap().version, v1);
        assert_eq!(sb.read("g").unwrap(), b"Same");
    }

    #[tokio::test]
    async fn times_move_like_linux() {
        let m = MemoryRemote::new();
        m.mkdir(&rp("d"), 0o755).await.unwrap();
        let d0 = m.stat(&rp("d")).await.unwrap();
        let f = m.create(&rp("d/f"), 0o644).await.unwrap();
        let d1 = m.stat(&rp("d")).await.unwrap();
        assert!(d1.mtime_ns > d0.mtime_ns && d1.ctime_ns > d0.ctime_ns);
        assert!(f.mtime_ns > d0.mtime_ns);
        let f1 = m
            .setattr(
                &rp("d/f"),
                SetAttr {
                    mode: Some(0o600),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(f1.mtime_ns, f.mtime_ns, "chmod leaves the mtime");
        assert!(f1.ctime_ns > f.ctime_ns);
        let f2 = m
            .setattr(
                &rp("d/f"),
                SetAttr {
                    size: Some(3),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(f2.mtime_ns > f1.mtime_ns && f2.ctime_ns > f1.ctime_ns);
        let t = 1_600_000_000_000_000_001;
        let f3 = m
            .setattr(
                &rp("d/f"),
                SetAttr {
                    mtime_ns: Some(t),
                    atime_ns: Some(t),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((f3.mtime_ns, f3.atime_ns), (t, t));
        assert!(f3.ctime_ns > f2.ctime_ns, "setting times changes the ctime");
    }

    #[tokio::test]
    async fn setattr_never_follows_a_final_symlink_and_sets_owners() {
        let m = MemoryRemote::new();
        m.sandbox().write("t", b"x").unwrap();
        m.sandbox().chmod("t", 0o4755).unwrap();
        m.symlink(&rp("l"), b"t").await.unwrap();
        assert!(matches!(
            m.setattr(
                &rp("l"),
                SetAttr {
                    mode: Some(0o600),
                    ..Default::default()
                }
            )
            .await,
            Err(RemoteError::Unsupported(_))
        ));
        let t = 1_000_000_000;
        let l = m
            .setattr(
                &rp("l"),
                SetAttr {
                    mtime_ns: Some(t),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((l.kind, l.mtime_ns), (FileKind::Symlink, t));
        assert_ne!(m.stat(&rp("t")).await.unwrap().mtime_ns, t);
        let owned = m
            .setattr(
                &rp("t"),
                SetAttr {
                    uid: Some(0),
                    gid: Some(42),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((owned.uid, owned.gid), (0, 42));
        assert_eq!(owned.mode, 0o755, "chown clears set-user-ID");
    }

    #[tokio::test]
    async fn sizes_past_the_limit_are_file_too_big() {
        let m = MemoryRemote::new();
        m.set_max_file_size(100);
        m.sandbox().write("f", b"small").unwrap();
        let grow = SetAttr {
            size: Some(101),
            ..Default::default()
        };
        assert!(matches!(
            m.setattr(&rp("f"), grow).await,
            Err(RemoteError::FileTooBig(_))
        ));
        assert!(matches!(
            m.fallocate(&rp("f"), 50, 51, false).await,
            Err(RemoteError::FileTooBig(_))
        ));
        assert!(matches!(
            m.commit(&rp("f"), whole(&[0; 101]), CommitOptions::default())
                .await,
            Err(RemoteError::FileTooBig(_))
        ));
        assert_eq!(m.sandbox().read("f").unwrap(), b"small");
    }

    #[tokio::test]
    async fn xattrs_follow_their_flags() {
        let m = MemoryRemote::new();
        m.sandbox().write("f", b"").unwrap();
        let (f, k) = (rp("f"), b"user.k".as_slice());
        let create = XattrFlags {
            create: true,
            replace: false,
        };
        let replace = XattrFlags {
            create: false,
            replace: true,
        };
        assert!(matches!(
            m.setxattr(&f, k, b"v", replace).await,
            Err(RemoteError::NoAttr(_))
        ));
        m.setxattr(&f, k, b"v1", create).await.unwrap();
        assert!(matches!(
            m.setxattr(&f, k, b"v", create).await,
            Err(RemoteError::Exists(_))
        ));
        m.setxattr(&f, k, b"v2", replace).await.unwrap();
        assert_eq!(m.getxattr(&f, k).await.unwrap(), b"v2");
        assert_eq!(m.listxattr(&f).await.unwrap(), vec![k.to_vec()]);
        m.removexattr(&f, k).await.unwrap();
        assert!(matches!(
            m.getxattr(&f, k).await,
            Err(RemoteError::NoAttr(_))
        ));
        assert!(matches!(
            m.removexattr(&f, k).await,
            Err(RemoteError::NoAttr(_))
        ));
        assert!(matches!(
            m.setxattr(&f, b"nonamespace", b"v", XattrFlags::default())
                .await,
            Err(RemoteError::Unsupported(_))
        ));
    }

    #[tokio::test]
    async fn fallocate_and_copy_range_change_what_they_should() {
        let m = MemoryRemote::new();
        m.sandbox().write("src", b"0123456789").unwrap();
        m.sandbox().write("dst", b"abc").unwrap();
        let kept = m.fallocate(&rp("dst"), 0, 100, true).await.unwrap();
        assert_eq!(kept.size, 3, "KEEP_SIZE");
        let grown = m.fallocate(&rp("dst"), 0, 5, false).await.unwrap();
        assert_eq!(grown.size, 5);
        assert_eq!(m.sandbox().read("dst").unwrap(), b"abc\0\0");
        let (copied, a) = m
            .copy_range(
                &rp("src"),
                8,
                &rp("dst"),
                4,
                10,
                Some(grown.version.clone()),
            )
            .await
            .unwrap();
        assert_eq!((copied, a.size), (2, 6), "fewer at the source's end");
        assert_eq!(m.sandbox().read("dst").unwrap(), b"abc\x0089");
        assert!(matches!(
            m.copy_range(&rp("src"), 0, &rp("dst"), 0, 1, Some(grown.version))
                .await,
            Err(RemoteError::Conflict { .. })
        ));
    }

    #[tokio::test]
    async fn symlinks_resolve_inside_and_never_out() {
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        sb.mkdir_all("a/b").unwrap();
        sb.write("a/b/f", b"deep").unwrap();
        sb.symlink("a/b", "short").unwrap();
        sb.symlink("../b/f", "a/b/up").unwrap();
        sb.symlink("../../..", "a/b/out").unwrap();
        sb.symlink("loop", "loop").unwrap();
        assert_eq!(
            &m.read(&rp("short/f"), 0, 9).await.unwrap().data[..],
            b"deep"
        );
        assert_eq!(
            &m.read(&rp("short/up"), 0, 9).await.unwrap().data[..],
            b"deep"
        );
        assert!(matches!(
            m.list(&rp("a/b/out")).await,
            Err(RemoteError::Access(_))
        ));
        assert!(matches!(
            m.read(&rp("loop"), 0, 1).await,
            Err(RemoteError::Invalid(_))
        ));
        assert_eq!(m.glob(&rp("short"), "*").await.unwrap(), ["f", "out", "up"]);
    }

    #[tokio::test]
    async fn the_sandbox_side_replace_makes_a_new_inode() {
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        sb.write("f", b"one").unwrap();
        let before = sb.metadata("f").unwrap();
        sb.write("f", b"two").unwrap();
        assert_eq!(sb.metadata("f").unwrap().ino, before.ino, "in place");
        sb.replace("f", b"three").unwrap();
        assert_ne!(sb.metadata("f").unwrap().ino, before.ino);
        assert_eq!(sb.list("").unwrap(), vec![b"f".to_vec()], "no temp left");
        assert!(matches!(sb.remove_all(""), Err(RemoteError::Invalid(_))));
        assert!(sb.exists("f"), "refused before anything was removed");
        sb.mkdir_all("d/e").unwrap();
        sb.write("d/e/x", b"").unwrap();
        sb.remove_all("d").unwrap();
        assert!(!sb.exists("d"));
    }

    #[tokio::test]
    async fn the_feed_reports_every_change_in_order_and_loss_when_too_old() {
        let m = MemoryRemote::new();
        m.set_ring_events(4);
        let mut feed = m.watch(None).await.unwrap();
        let sb = m.sandbox();
        sb.write("a", b"1").unwrap();
        sb.rename("a", "b").unwrap();
        m.unlink(&rp("b")).await.unwrap();
        let kinds: Vec<(Vec<u8>, ChangeKind)> = (0..4)
            .map(|_| {
                let ev = done(feed.next()).unwrap().unwrap();
                (ev.path.0, ev.kind)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (b"a".to_vec(), ChangeKind::Created),
                (b"a".to_vec(), ChangeKind::Modified),
                (
                    b"a".to_vec(),
                    ChangeKind::Renamed {
                        to: WireBytes(b"b".to_vec())
                    }
                ),
                (b"b".to_vec(), ChangeKind::Removed),
            ]
        );
        for i in 0..5 {
            sb.write(format!("f{i}"), b"x").unwrap();
        }
        let mut late = m.watch(Some(1)).await.unwrap();
        assert_eq!(done(late.next()).unwrap().unwrap().kind, ChangeKind::Lost);
        let mut recent = m.watch(Some(12)).await.unwrap();
        assert_eq!(done(recent.next()).unwrap().unwrap().seq, 13);
    }
}
