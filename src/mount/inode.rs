//! The inode table: which node the kernel knows stands for which sandbox file, and under which
//! names.
//!
//! Assumptions, and why:
//! - **Node ids are ours.** A counter, never reused: the kernel may hold a node id long after the
//!   file is gone (an unlinked file kept open), and a sandbox inode number can come back for
//!   another file at any time. `st_ino` still shows the sandbox's inode number (the adapter puts
//!   [`Attr::ino`] in attribute replies).
//! - **A node is a sandbox file** (device + inode), not a path. Its names are links
//!   `(parent node, name)`; a path is found by walking the links up to the root, so renaming a
//!   directory moves everything below it at once. Hard links are several links of one node.
//! - **A node without links is an orphan**: unlinked or replaced while the kernel (or an open
//!   handle) still holds it. It keeps serving its handles from local state and is dropped when
//!   the kernel forgets it and no handle is open.
//! - Our own saves give the file a new sandbox inode (the atomic rename): [`InodeTable::rebind`]
//!   moves the node to it, keeping the node id the kernel knows and the `st_ino` it showed
//!   ([`Node::st_ino`]), so a program holding the file never sees it "moved".

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use super::core::stale_instant;
use crate::remote::{Attr, FileKind, RemotePath, Version};

/// The kernel's name for a node (FUSE node id). Ours, never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize)]
pub struct NodeId(pub u64);

pub const ROOT: NodeId = NodeId(1);

/// A file's identity in the sandbox: device, inode number and birth time (a file made later
/// under a freed inode number is another file; a hard link or a rename is the same one).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RemoteId {
    pub dev: u64,
    pub ino: u64,
    /// 0 where the sandbox does not say.
    pub born: i64,
}

impl RemoteId {
    /// No file's identity: what a node has once the sandbox gave its identity to another.
    pub const NONE: RemoteId = RemoteId {
        dev: 0,
        ino: 0,
        born: 0,
    };

    pub fn of(a: &Attr) -> Self {
        RemoteId {
            dev: a.dev,
            ino: a.ino,
            born: a.born_ns,
        }
    }
}

/// Where spare `st_ino` numbers start (counted down): below the range of numbers for files
/// not pushed yet ([`super::newfiles::NewFiles::next_ino`]).
const SPARE_INO_TOP: u64 = (u32::MAX as u64) - (1 << 28) - 1;

/// Deepest path walked up from a node (a cycle would be a bug; this bounds it).
const MAX_DEPTH: usize = 8192;

#[derive(Clone, Debug)]
pub struct Node {
    pub remote: RemoteId,
    /// The inode number `stat` shows: the sandbox's when the node was first seen (a placeholder
    /// for a file made here), kept across the mount's own saves, whose atomic rename gives
    /// the sandbox file a new inode: SQLite, `tail -F` and editors take a changed `st_ino`
    /// for a file replaced by another program.
    pub st_ino: u64,
    /// The mount's epoch at its last own change of this node (a push, a setattr's answer):
    /// an answer asked for before that is older than what the mount knows, and is not
    /// applied ([`InodeTable::rebind_answer`], [`InodeTable::remember`]).
    pub own_change: u64,
    /// Names of this node: `(parent, name)`. Empty for an orphan.
    pub links: Vec<(NodeId, Vec<u8>)>,
    pub attr: Attr,
    /// When `attr` was fetched (the TTL counts from here).
    pub fetched: Instant,
    /// The kernel's lookup count.
    pub lookups: u64,
    /// Open handles on the node (they keep it alive after the kernel forgets it).
    pub open: u32,
    /// The version whose data the kernel may hold in its page cache.
    pub kernel_version: Option<Version>,
    /// The path it had when it was last linked (for messages, and a conflict copy's place).
    pub last_path: RemotePath,
    /// Unlinked through the mount: what is staged for it is dropped on the last close.
    pub removed_locally: bool,
    /// Has staged state: kept even when the kernel forgets it and no handle is open, until its
    /// writes are in the sandbox (the retries need its name).
    pub pinned: bool,
    /// The change feed reported the file while its staged image answered for it (the check
    /// is left to the push): once that image goes with nothing left to push, the sandbox is
    /// asked again.
    pub reported_while_staged: bool,
}

#[derive(Default)]
struct Table {
    nodes: HashMap<NodeId, Node>,
    by_remote: HashMap<RemoteId, NodeId>,
    /// Which live node shows each `st_ino`: a number kept across our saves must never be
    /// shown for another file the sandbox later gave the freed number (`tar`, `rsync -H`,
    /// `cp` and `du` take equal numbers for one file).
    by_st_ino: HashMap<u64, NodeId>,
    /// Numbers handed out when a sandbox number is taken here, counted down from this.
    next_spare: u64,
    children: HashMap<NodeId, BTreeMap<Vec<u8>, NodeId>>,
    next: u64,
}

pub struct InodeTable {
    t: Mutex<Table>,
    /// What `fetched` times are read from ([`super::clock`]).
    clock: super::clock::Clock,
}

impl Table {
    fn path_of(&self, mut id: NodeId) -> Option<RemotePath> {
        let mut parts: Vec<&[u8]> = Vec::new();
        for _ in 0..MAX_DEPTH {
            if id == ROOT {
                parts.reverse();
                return RemotePath::new(parts.join(&b'/')).ok();
            }
            let n = self.nodes.get(&id)?;
            let (parent, name) = n.links.first()?;
            parts.push(name);
            id = *parent;
        }
        None
    }

    /// Remove the link `(parent, name)` from whatever node holds it.
    fn unlink(&mut self, parent: NodeId, name: &[u8]) -> Option<NodeId> {
        let id = self.children.get_mut(&parent)?.remove(name)?;
        let path = self.path_of_link(parent, name);
        if let Some(n) = self.nodes.get_mut(&id) {
            if let Some(p) = path {
                n.last_path = p;
            }
            n.links.retain(|(p, nm)| !(*p == parent && nm == name));
        }
        Some(id)
    }

    fn path_of_link(&self, parent: NodeId, name: &[u8]) -> Option<RemotePath> {
        self.path_of(parent)?.join(name).ok()
    }

    fn link(&mut self, id: NodeId, parent: NodeId, name: &[u8]) {
        if let Some(old) = self
            .children
            .get(&parent)
            .and_then(|c| c.get(name))
            .copied()
        {
            if old == id {
                return;
            }
            self.unlink(parent, name);
        }
        self.children
            .entry(parent)
            .or_default()
            .insert(name.to_vec(), id);
        let path = self.path_of_link(parent, name);
        if let Some(n) = self.nodes.get_mut(&id) {
            n.links.push((parent, name.to_vec()));
            if let Some(p) = path {
                n.last_path = p;
            }
        }
    }

    /// The `st_ino` node `id` shows for sandbox number `ino`: that number unless another live
    /// node shows it already, then one no live node shows.
    fn claim_st_ino(&mut self, id: NodeId, ino: u64) -> u64 {
        let mut n = ino;
        while self
            .by_st_ino
            .get(&n)
            .is_some_and(|o| *o != id && self.nodes.contains_key(o))
        {
            if self.next_spare == 0 {
                self.next_spare = SPARE_INO_TOP;
            }
            n = self.next_spare;
            self.next_spare -= 1;
        }
        if let Some(old) = self.nodes.get(&id).map(|x| x.st_ino) {
            if old != n && self.by_st_ino.get(&old) == Some(&id) {
                self.by_st_ino.remove(&old);
            }
        }
        self.by_st_ino.insert(n, id);
        n
    }

    fn drop_if_unused(&mut self, id: NodeId) {
        let Some(n) = self.nodes.get(&id) else { return };
        if id == ROOT || n.lookups > 0 || n.open > 0 || n.pinned {
            return;
        }
        // A directory still holding a kept node (a file with staged writes the kernel has
        // forgotten) stays, or that file would lose its path and its push its place.
        let kept_child = self
            .children
            .get(&id)
            .is_some_and(|c| c.values().any(|k| self.nodes.contains_key(k)));
        if kept_child {
            return;
        }
        let n = self.nodes.remove(&id).expect("present");
        for (p, name) in &n.links {
            if let Some(c) = self.children.get_mut(p) {
                if c.get(name) == Some(&id) {
                    c.remove(name);
                }
            }
        }
        if self.by_remote.get(&n.remote) == Some(&id) {
            self.by_remote.remove(&n.remote);
        }
        if self.by_st_ino.get(&n.st_ino) == Some(&id) {
            self.by_st_ino.remove(&n.st_ino);
        }
        // Its parents may have been kept for it alone.
        for (p, _) in &n.links {
            self.drop_if_unused(*p);
        }
        // Children of a forgotten directory were forgotten first (the kernel's dentries hold
        // their parents); what is left here are names we never handed out.
        if let Some(kids) = self.children.remove(&id) {
            for (name, kid) in kids {
                if let Some(k) = self.nodes.get_mut(&kid) {
                    k.links.retain(|(p, nm)| !(*p == id && *nm == name));
                }
            }
        }
    }
}

impl InodeTable {
    pub fn new(root: Attr) -> Self {
        Self::with_clock(root, super::clock::Clock::system())
    }

    pub fn with_clock(root: Attr, clock: super::clock::Clock) -> Self {
        let mut t = Table {
            next: ROOT.0 + 1,
            ..Table::default()
        };
        t.by_remote.insert(RemoteId::of(&root), ROOT);
        t.by_st_ino.insert(root.ino, ROOT);
        t.nodes.insert(
            ROOT,
            Node {
                remote: RemoteId::of(&root),
                st_ino: root.ino,
                own_change: 0,
                links: Vec::new(),
                attr: root,
                fetched: clock.now(),
                lookups: 1,
                open: 0,
                kernel_version: None,
                last_path: RemotePath::root(),
                removed_locally: false,
                pinned: false,
                reported_while_staged: false,
            },
        );
        InodeTable {
            t: Mutex::new(t),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.t.lock().expect("inode table lock")
    }

    /// The node's current path (`None`: unknown node, or an orphan).
    pub fn path_of(&self, id: NodeId) -> Option<RemotePath> {
        self.lock().path_of(id)
    }

    /// Every name of a node as a path (a hard-linked file has several).
    pub fn paths_of(&self, id: NodeId) -> Vec<RemotePath> {
        let t = self.lock();
        t.nodes.get(&id).map_or_else(Vec::new, |n| {
            n.links
                .iter()
                .filter_map(|(parent, name)| t.path_of_link(*parent, name))
                .collect()
        })
    }

    pub fn get(&self, id: NodeId) -> Option<Node> {
        self.lock().nodes.get(&id).cloned()
    }

    /// Change a node in place (no-op for an unknown node). Private: every change of a node
    /// from outside is one of the named transitions below.
    fn update<T>(&self, id: NodeId, f: impl FnOnce(&mut Node) -> T) -> Option<T> {
        self.lock().nodes.get_mut(&id).map(f)
    }

    /// The node's attributes are to be asked for again (its TTL has run out).
    pub fn mark_stale(&self, id: NodeId) {
        self.update(id, |n| n.fetched = stale_instant());
    }

    /// The mount changed the node at `epoch` without knowing its new attributes (a name made
    /// or removed in a directory): stale, and an answer asked for before then is older than
    /// the change and is not applied (a stat in flight while a push made a name in the
    /// directory brought back its old mtime, kept for a TTL: `rsync -a` then skipped setting
    /// the directory's times).
    pub fn changed_here(&self, id: NodeId, epoch: u64) {
        self.update(id, |n| {
            n.fetched = stale_instant();
            n.own_change = n.own_change.max(epoch);
        });
    }

    /// The node's attributes are trusted afresh from `at` (a revalidation found no change).
    pub fn mark_fetched(&self, id: NodeId, at: Instant) {
        self.update(id, |n| n.fetched = at);
    }

    /// The kernel took one more reference to the node (a lookup answered with it).
    pub fn looked_up(&self, id: NodeId) {
        self.update(id, |n| n.lookups += 1);
    }

    /// The mount changed the node's attributes here (a setattr of a file not pushed yet).
    pub fn set_attr(&self, id: NodeId, attr: &Attr) {
        self.update(id, |n| n.attr = attr.clone());
    }

    /// A hard link made through the mount: the sandbox's answer, fetched at `at`, and the
    /// kernel's reference for the new name.
    pub fn linked(&self, id: NodeId, attr: &Attr, at: Instant) {
        self.update(id, |n| {
            n.attr = attr.clone();
            n.fetched = at;
            n.lookups += 1;
        });
    }

    /// One of the node's names went (unlinked, or renamed over): one link fewer, a new
    /// ctime, as the other names show on ext4.
    pub fn lost_name(&self, id: NodeId, ctime_ns: i64) {
        self.update(id, |n| {
            n.attr.nlink = n.attr.nlink.saturating_sub(1);
            n.attr.ctime_ns = ctime_ns;
        });
    }

    /// The node's inode changed here (its link count or owner): a new ctime.
    pub fn touched(&self, id: NodeId, ctime_ns: i64) {
        self.update(id, |n| n.attr.ctime_ns = ctime_ns);
    }

    /// Unlinked through the mount: what is staged for it goes on its last close.
    pub fn mark_removed_locally(&self, id: NodeId) {
        self.update(id, |n| n.removed_locally = true);
    }

    /// Whether the file has extended attributes, as the mount last learned.
    pub fn set_has_xattrs(&self, id: NodeId, has: Option<bool>) {
        self.update(id, |n| n.attr.has_xattrs = has);
    }

    /// The kernel holds no page of the node worth keeping (its data was dropped there).
    pub fn kernel_pages_dropped(&self, id: NodeId) {
        self.update(id, |n| n.kernel_version = None);
    }

    /// The kernel is about to be given the node's data at `version`: whether the pages it
    /// may hold are of that version already (so it keeps them).
    pub fn kernel_pages_of(&self, id: NodeId, version: &Version) -> bool {
        self.update(id, |n| {
            n.kernel_version.replace(version.clone()).as_ref() == Some(version)
        })
        .unwrap_or(false)
    }

    /// The change feed reported the file while its staged image answered for it (or, with
    /// `false`, that mark withdrawn).
    pub fn set_reported_while_staged(&self, id: NodeId, yes: bool) {
        self.update(id, |n| n.reported_while_staged = yes);
    }

    /// Whether the feed reported the file while it was staged, clearing the mark.
    pub fn take_reported_while_staged(&self, id: NodeId) -> bool {
        self.update(id, |n| std::mem::take(&mut n.reported_while_staged))
            .unwrap_or(false)
    }

    pub fn child(&self, parent: NodeId, name: &[u8]) -> Option<NodeId> {
        self.lock().children.get(&parent)?.get(name).copied()
    }

    /// The node for the file `attr` found at `(parent, name)`, created or updated; one more
    /// kernel lookup if `lookup`. The node already at that name is kept if it is the same
    /// sandbox file; a file with several links joins the node of its other names; anything
    /// else is a new node (the name's previous node loses that name).
    ///
    /// `asked`: the epoch at which the answer was asked for. If the node at that name changed
    /// through the mount since (its push landed while the answer was on its way), the answer
    /// is older than what the mount knows: the node stays as it is.
    pub fn remember(
        &self,
        parent: NodeId,
        name: &[u8],
        attr: Attr,
        lookup: bool,
        asked: Option<u64>,
    ) -> NodeId {
        let mut t = self.lock();
        let rid = RemoteId::of(&attr);
        let at_name = t.children.get(&parent).and_then(|c| c.get(name)).copied();
        if let (Some(id), Some(asked)) = (at_name, asked) {
            if let Some(n) = t.nodes.get_mut(&id).filter(|n| n.own_change > asked) {
                if lookup {
                    n.lookups += 1;
                }
                return id;
            }
        }
        let id = match at_name {
            Some(id) if t.nodes.get(&id).is_some_and(|n| n.remote == rid) => id,
            _ => {
                // One node for a hard-linked file's names. Never for symlinks: a target is
                // judged from the link's own place ([`super::links`]), and a hostile agent can
                // claim any dev/ino.
                let linked = t.by_remote.get(&rid).copied().filter(|id| {
                    !matches!(attr.kind, FileKind::Dir | FileKind::Symlink)
                        && attr.nlink > 1
                        && t.nodes
                            .get(id)
                            .is_some_and(|n| !n.links.is_empty() && n.attr.kind == attr.kind)
                });
                match linked {
                    Some(id) => id,
                    None => {
                        let id = NodeId(t.next);
                        t.next += 1;
                        t.nodes.insert(
                            id,
                            Node {
                                remote: rid,
                                st_ino: attr.ino,
                                own_change: 0,
                                links: Vec::new(),
                                attr: attr.clone(),
                                fetched: self.clock.now(),
                                lookups: 0,
                                open: 0,
                                kernel_version: None,
                                last_path: RemotePath::root(),
                                removed_locally: false,
                                pinned: false,
                                reported_while_staged: false,
                            },
                        );
                        t.by_remote.insert(rid, id);
                        let st_ino = t.claim_st_ino(id, attr.ino);
                        t.nodes.get_mut(&id).expect("just made").st_ino = st_ino;
                        id
                    }
                }
            }
        };
        t.link(id, parent, name);
        let n = t.nodes.get_mut(&id).expect("just linked");
        n.attr = attr;
        n.fetched = self.clock.now();
        if lookup {
            n.lookups += 1;
        }
        let stale = t.by_remote.insert(rid, id);
        if let Some(old) = stale.filter(|old| *old != id) {
            // The sandbox reused an inode number: the old node no longer stands for it.
            if let Some(n) = t.nodes.get_mut(&old) {
                if n.remote == rid {
                    n.remote = RemoteId::NONE;
                }
            }
        }
        id
    }

    /// The mount's own change gave the node these attributes (our save replaced the file by
    /// rename: another sandbox file now), at `epoch`.
    pub fn rebind_own(&self, id: NodeId, attr: &Attr, epoch: u64) {
        let mut t = self.lock();
        if let Some(n) = t.nodes.get_mut(&id) {
            n.own_change = n.own_change.max(epoch);
        }
        Self::rebind_locked(&mut t, id, attr, self.clock.now());
    }

    /// The sandbox's answer, asked for at epoch `asked`, about the node: applied unless the
    /// mount changed the node since (then it is older than what the mount knows). Answers
    /// whether it was applied.
    pub fn rebind_answer(&self, id: NodeId, attr: &Attr, asked: u64) -> bool {
        let mut t = self.lock();
        let Some(n) = t.nodes.get(&id).filter(|n| n.own_change <= asked) else {
            return false;
        };
        if n.remote != RemoteId::of(attr) {
            // Another file at its name, put there by someone else: its number, not ours.
            let st_ino = t.claim_st_ino(id, attr.ino);
            t.nodes.get_mut(&id).expect("checked").st_ino = st_ino;
        }
        Self::rebind_locked(&mut t, id, attr, self.clock.now());
        true
    }

    fn rebind_locked(t: &mut Table, id: NodeId, attr: &Attr, now: Instant) {
        let rid = RemoteId::of(attr);
        let Some(old) = t.nodes.get(&id).map(|n| n.remote) else {
            return;
        };
        if t.by_remote.get(&old) == Some(&id) {
            t.by_remote.remove(&old);
        }
        t.by_remote.insert(rid, id);
        let n = t.nodes.get_mut(&id).expect("checked");
        n.remote = rid;
        n.attr = attr.clone();
        n.fetched = now;
    }

    /// Remove the name; answers the node that had it (now an orphan if it was its last name).
    pub fn unlink(&self, parent: NodeId, name: &[u8]) -> Option<NodeId> {
        let mut t = self.lock();
        let id = t.unlink(parent, name)?;
        t.drop_if_unused(id);
        Some(id)
    }

    /// Add a name to a node (a hard link made through the mount).
    pub fn link(&self, id: NodeId, parent: NodeId, name: &[u8]) {
        self.lock().link(id, parent, name);
    }

    /// Move a name. The node at the target name, if any, loses it and is answered.
    pub fn rename(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
    ) -> Option<NodeId> {
        let mut t = self.lock();
        let moving = t.children.get(&parent).and_then(|c| c.get(name)).copied();
        let at_target = t
            .children
            .get(&new_parent)
            .and_then(|c| c.get(new_name))
            .copied();
        if moving.is_some() && moving == at_target {
            // Two names of one file: rename(2) does nothing.
            return None;
        }
        let replaced = t
            .children
            .get(&new_parent)
            .and_then(|c| c.get(new_name))
            .copied()
            .filter(|r| Some(*r) != moving);
        if replaced.is_some() {
            t.unlink(new_parent, new_name);
        }
        if let Some(id) = moving {
            t.unlink(parent, name);
            t.link(id, new_parent, new_name);
        }
        if let Some(r) = replaced {
            t.drop_if_unused(r);
        }
        replaced
    }

    /// Swap two names (RENAME_EXCHANGE).
    pub fn exchange(&self, a_parent: NodeId, a: &[u8], b_parent: NodeId, b: &[u8]) {
        let mut t = self.lock();
        let na = t.unlink(a_parent, a);
        let nb = t.unlink(b_parent, b);
        if let Some(id) = nb {
            t.link(id, a_parent, a);
        }
        if let Some(id) = na {
            t.link(id, b_parent, b);
        }
    }

    /// The kernel dropped `n` lookups.
    pub fn forget(&self, id: NodeId, n: u64) {
        let mut t = self.lock();
        if let Some(node) = t.nodes.get_mut(&id) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        t.drop_if_unused(id);
    }

    /// Keep the node (staged state) or let it go once nothing else holds it.
    pub fn pin(&self, id: NodeId, pinned: bool) {
        let mut t = self.lock();
        if let Some(node) = t.nodes.get_mut(&id) {
            node.pinned = pinned;
        }
        t.drop_if_unused(id);
    }

    /// A handle opened (`+1`) or closed (`-1`) on the node.
    pub fn opened(&self, id: NodeId, delta: i32) {
        let mut t = self.lock();
        if let Some(node) = t.nodes.get_mut(&id) {
            node.open = node.open.saturating_add_signed(delta);
        }
        t.drop_if_unused(id);
    }

    /// Every node whose path is at or below `path` (for invalidation).
    pub fn nodes_at(&self, path: &RemotePath) -> Vec<NodeId> {
        let t = self.lock();
        let prefix = [path.as_bytes(), b"/"].concat();
        t.nodes
            .keys()
            .filter(|id| {
                t.path_of(**id).is_some_and(|p| {
                    p == *path || path.is_root() || p.as_bytes().starts_with(&prefix)
                })
            })
            .copied()
            .collect()
    }

    /// Every node that has a name, with its path (what a revalidation checks).
    pub fn known_paths(&self) -> Vec<(NodeId, RemotePath)> {
        let t = self.lock();
        t.nodes
            .keys()
            .filter_map(|id| t.path_of(*id).map(|p| (*id, p)))
            .collect()
    }

    /// The names directly in `dir`.
    pub fn links_in(&self, dir: NodeId) -> Vec<Vec<u8>> {
        let t = self.lock();
        t.children
            .get(&dir)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The node at a path, walking names from the root (`None` if some name is not known).
    pub fn resolve(&self, path: &RemotePath) -> Option<NodeId> {
        let t = self.lock();
        let mut id = ROOT;
        if path.is_root() {
            return Some(id);
        }
        for part in path.as_bytes().split(|&b| b == b'/') {
            id = *t.children.get(&id)?.get(part)?;
        }
        Some(id)
    }

    pub fn len(&self) -> usize {
        self.lock().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, kind: FileKind, nlink: u64) -> Attr {
        Attr {
            kind,
            size: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 7,
            ino,
            born_ns: 0,
            nlink,
            rdev: 0,
            symlink_target: None,
            version: Version(format!("v{ino}")),
            has_xattrs: None,
        }
    }

    fn table() -> InodeTable {
        InodeTable::new(attr(2, FileKind::Dir, 3))
    }

    #[test]
    fn paths_follow_directory_renames() {
        let t = table();
        let d = t.remember(ROOT, b"d", attr(10, FileKind::Dir, 2), true, None);
        let f = t.remember(d, b"f", attr(11, FileKind::File, 1), true, None);
        assert_eq!(t.path_of(f).unwrap().as_bytes(), b"d/f");
        t.rename(ROOT, b"d", ROOT, b"e");
        assert_eq!(t.path_of(f).unwrap().as_bytes(), b"e/f");
        assert_eq!(
            t.resolve(&RemotePath::new(b"e/f".to_vec()).unwrap()),
            Some(f)
        );
    }

    #[test]
    fn node_ids_are_never_reused_and_differ_from_inode_numbers() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        t.unlink(ROOT, b"a");
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        // The sandbox reuses inode 5 for another file: a new node.
        let b = t.remember(ROOT, b"b", attr(5, FileKind::File, 1), true, None);
        assert_ne!(a, b);
    }

    #[test]
    fn an_unlinked_open_node_stays_until_closed_and_forgotten() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        t.opened(a, 1);
        assert_eq!(t.unlink(ROOT, b"a"), Some(a));
        assert!(t.path_of(a).is_none(), "an orphan has no path");
        assert_eq!(t.get(a).unwrap().last_path.as_bytes(), b"a");
        t.forget(a, 1);
        assert!(t.get(a).is_some(), "still open");
        t.opened(a, -1);
        assert!(t.get(a).is_none());
        // A new file at the old name is a different node.
        let b = t.remember(ROOT, b"a", attr(6, FileKind::File, 1), true, None);
        assert_ne!(a, b);
    }

    #[test]
    fn a_pinned_node_outlives_forget_until_unpinned() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        t.pin(a, true);
        t.forget(a, 1);
        assert_eq!(t.path_of(a).unwrap().as_bytes(), b"a");
        t.pin(a, false);
        assert!(t.get(a).is_none());
    }

    #[test]
    fn hard_links_are_names_of_one_node() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 2), true, None);
        let b = t.remember(ROOT, b"b", attr(5, FileKind::File, 2), true, None);
        assert_eq!(a, b);
        t.unlink(ROOT, b"a");
        assert_eq!(t.path_of(a).unwrap().as_bytes(), b"b");
    }

    #[test]
    fn a_replaced_name_gets_a_new_node_and_the_old_one_is_orphaned() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        let b = t.remember(ROOT, b"a", attr(9, FileKind::File, 1), true, None);
        assert_ne!(a, b);
        assert!(t.path_of(a).is_none());
        assert_eq!(t.child(ROOT, b"a"), Some(b));
    }

    #[test]
    fn rename_over_answers_the_replaced_node_and_exchange_swaps() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        let b = t.remember(ROOT, b"b", attr(6, FileKind::File, 1), true, None);
        t.exchange(ROOT, b"a", ROOT, b"b");
        assert_eq!(t.path_of(a).unwrap().as_bytes(), b"b");
        assert_eq!(t.path_of(b).unwrap().as_bytes(), b"a");
        assert_eq!(t.rename(ROOT, b"a", ROOT, b"b"), Some(a));
        assert_eq!(t.path_of(b).unwrap().as_bytes(), b"b");
        assert!(t.path_of(a).is_none());
    }

    #[test]
    fn rebind_keeps_the_node_id_for_a_new_sandbox_inode() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        t.rebind_own(a, &attr(50, FileKind::File, 1), 1);
        assert_eq!(t.get(a).unwrap().attr.ino, 50);
        // A lookup of the same name with the new inode finds the same node.
        assert_eq!(
            t.remember(ROOT, b"a", attr(50, FileKind::File, 1), true, None),
            a
        );
        // What `stat` shows stays what it was (SQLite takes a new st_ino for a moved file).
        assert_eq!(t.get(a).unwrap().st_ino, 5);
    }

    #[test]
    fn an_answer_asked_before_the_mounts_own_change_does_not_undo_it() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        // A stat is asked at epoch 3; meanwhile our push lands (epoch 4, inode 50); then
        // the stat's answer arrives, still showing inode 5.
        t.rebind_own(a, &attr(50, FileKind::File, 1), 4);
        assert!(!t.rebind_answer(a, &attr(5, FileKind::File, 1), 3));
        assert_eq!(t.get(a).unwrap().attr.ino, 50);
        // A lookup's answer from before the push neither replaces the node nor orphans it.
        assert_eq!(
            t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, Some(3)),
            a
        );
        assert_eq!(t.path_of(a).unwrap().as_bytes(), b"a");
        // Asked after the push, the sandbox's word counts: a file replaced there is a new node.
        assert!(t.rebind_answer(a, &attr(50, FileKind::File, 1), 4));
        let b = t.remember(ROOT, b"a", attr(77, FileKind::File, 1), true, Some(5));
        assert_ne!(b, a);
        assert!(t.path_of(a).is_none());
    }

    #[test]
    fn a_kept_st_ino_is_never_shown_for_another_file() {
        let t = table();
        let a = t.remember(ROOT, b"a", attr(5, FileKind::File, 1), true, None);
        // Our save moved a to sandbox inode 50; it keeps showing 5. The sandbox then gives
        // the freed 5 to a new file b: b must show another number.
        t.rebind_own(a, &attr(50, FileKind::File, 1), 1);
        let b = t.remember(ROOT, b"b", attr(5, FileKind::File, 1), true, None);
        let (sa, sb) = (t.get(a).unwrap().st_ino, t.get(b).unwrap().st_ino);
        assert_eq!(sa, 5);
        assert_ne!(sb, sa);
        // Once a is gone, its number is free for the sandbox's file of that number.
        t.unlink(ROOT, b"a");
        t.forget(a, u64::MAX);
        let c = t.remember(ROOT, b"c", attr(5, FileKind::File, 1), true, None);
        assert_eq!(t.get(c).unwrap().st_ino, 5);
    }
}
