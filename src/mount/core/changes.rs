//! The one way what the sandbox reports changes the mount's caches: the change feed's events,
//! its revalidation answers and the end of its trust are each a [`Change`] given to
//! [`FsCore::apply`], which alone touches the inode table, listings, listings fetched ahead,
//! handles and the kernel's caches for them. The feed ([`crate::mount::feed`]) only follows the
//! stream and batches the questions.
//!
//! A report never undoes the mount's own work: an answer asked before the mount's own change
//! of a node is not applied ([`crate::mount::inode::InodeTable::rebind_answer`]), and one that a
//! local change raced drops what it touched instead of recording it.

use super::FsCore;
use crate::mount::inode::{NodeId, RemoteId};
use crate::remote::{Attr, FileKind, RemotePath, Result};

/// What the sandbox reported.
pub(in crate::mount) enum Change<'a> {
    /// `path` changed in the sandbox; `namespace`: a name was made, removed or renamed.
    Reported {
        path: &'a RemotePath,
        namespace: bool,
    },
    /// Anything cached may be stale (events were lost): no listing is trusted any more.
    AllStale,
    /// The feed no longer vouches for what is cached: the kernel forgets the attributes it
    /// was told to keep long.
    Distrusted,
    /// A revalidation's answer about a node at `path`, asked at epoch `asked`; `raced`: a
    /// local change happened while it was on its way; `children_reported`: the change feed
    /// reports what happens to a directory's names itself (an event's check), so a change of
    /// its own attributes leaves its listing (a re-check, which looks for what inotify missed,
    /// drops it).
    Answered {
        node: NodeId,
        path: &'a RemotePath,
        answer: Result<Attr>,
        raced: bool,
        asked: u64,
        children_reported: bool,
    },
}

/// What applying a change found.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::mount) enum Applied {
    Nothing,
    /// The mount has a node for the reported path: ask the sandbox whether it changed.
    Check(NodeId),
    /// The node's file changed or went: dropped here and in the kernel.
    Changed,
    /// The node is as the mount knew it: trusted afresh.
    Unchanged,
}

impl FsCore {
    pub(in crate::mount) fn apply(&self, change: Change<'_>) -> Applied {
        match change {
            Change::Reported { path, namespace } => {
                self.recent.note(path, self.cfg.clock.now());
                self.reported(path, namespace)
            }
            Change::AllStale => {
                self.meta.expire_all();
                self.prefetched.forget_under(&RemotePath::root());
                Applied::Nothing
            }
            Change::Distrusted => {
                if let Some(k) = self.kernel() {
                    for (node, _) in self.inodes.known_paths() {
                        match self.inodes.get(node) {
                            Some(n) if n.attr.kind == FileKind::Dir => {
                                self.kernel_listing_stale(node)
                            }
                            _ => k.invalidate_attr(node),
                        }
                    }
                }
                Applied::Nothing
            }
            Change::Answered {
                node,
                path,
                answer,
                raced,
                asked,
                children_reported,
            } => self.answered(node, path, answer, raced, asked, children_reported),
        }
    }

    /// The kernel forgets the names it keeps directly in `dir`.
    pub fn forget_kernel_entries_in(&self, dir: NodeId) {
        if let Some(k) = self.kernel() {
            for name in self.inodes.links_in(dir) {
                k.invalidate_entry(dir, &name);
            }
        }
    }

    /// Every node with a path, for a revalidation.
    pub(in crate::mount) fn known_paths(&self) -> Vec<(NodeId, RemotePath)> {
        self.inodes.known_paths()
    }

    /// Every node with a path, in path order, for the feed's re-check of what inotify does
    /// not report ([`crate::mount::feed`]): directories too (a name moved in or out, a link
    /// count), as the feed's paths can go stale under directory renames.
    pub(in crate::mount) fn known_paths_in_order(&self) -> Vec<(NodeId, RemotePath)> {
        let mut known = self.inodes.known_paths();
        known.sort_by(|a, b| a.1.cmp(&b.1));
        known
    }

    /// Whether the mount has a directory at `path`.
    pub(in crate::mount) fn is_directory_at(&self, path: &RemotePath) -> bool {
        self.inodes
            .resolve(path)
            .and_then(|n| self.inodes.get(n))
            .is_some_and(|n| n.attr.kind == FileKind::Dir)
    }

    /// The node the mount has at `path`, if any.
    pub(in crate::mount) fn node_at(&self, path: &RemotePath) -> Option<NodeId> {
        self.inodes.resolve(path)
    }

    /// Whether a reported node is left to its staged image (which answers for it; its push
    /// and conflict check deal with the sandbox's version). Marked first, so that an image
    /// dropped at any moment after has the sandbox asked again
    /// ([`Self::staging_ended`]); a node with no image is checked by the caller.
    pub(in crate::mount) fn left_to_staging(&self, node: NodeId) -> bool {
        self.inodes.set_reported_while_staged(node, true);
        if self.staged_of(node).is_some() {
            return true;
        }
        self.inodes.set_reported_while_staged(node, false);
        false
    }

    /// A node's staged image went with nothing left to push: if the sandbox reported the
    /// file meanwhile, what is cached of it (here and in the kernel) is asked for again.
    pub(in crate::mount) fn staging_ended(&self, node: NodeId) {
        if !self.inodes.take_reported_while_staged(node) {
            return;
        }
        self.inodes.mark_stale(node);
        if let Some(k) = self.kernel() {
            k.invalidate_data(node);
        }
    }

    /// An event about `path`. A node the mount has for it is to be checked (and dropped only
    /// if it changed: an atime or our own push changes nothing). A namespace change makes the
    /// parent's listing and attributes stale; so does any change to a name the mount has no
    /// node for (the parent's listing holds its attributes). A name with no node has no entry
    /// in the kernel either (a failed lookup is not cached), so none is dropped: dropping the
    /// entry of a directory that is some process's working directory would cut it off
    /// (`getcwd` fails).
    fn reported(&self, path: &RemotePath, namespace: bool) -> Applied {
        let node = self.inodes.resolve(path);
        // Listings fetched ahead for directories not entered yet: the parent's is stale, and
        // so is everything beneath a name made, removed or renamed.
        if namespace {
            self.prefetched.forget_under(path);
        }
        if let Some((parent_path, name)) = path.split_last() {
            self.prefetched.forget(&parent_path);
            if let Some(parent) = self.inodes.resolve(&parent_path) {
                if namespace {
                    self.dir_stale(parent);
                    self.meta.doubt(parent, name);
                } else if node.is_none() {
                    self.bump();
                    self.meta.expire(parent);
                }
            }
        }
        node.map_or(Applied::Nothing, Applied::Check)
    }

    /// One node's answer about `path`: unchanged is trusted afresh; changed or gone is
    /// dropped. The kernel's entry goes only for a name that now leads elsewhere or nowhere,
    /// and never on an answer a local change raced.
    fn answered(
        &self,
        node: NodeId,
        path: &RemotePath,
        answer: Result<Attr>,
        raced: bool,
        asked: u64,
        children_reported: bool,
    ) -> Applied {
        let Some(n) = self.inodes.get(node) else {
            return Applied::Nothing;
        };
        let same = |a: &Attr| {
            RemoteId::of(a) == n.remote
                && a.version == n.attr.version
                && a.ctime_ns == n.attr.ctime_ns
                && a.kind == n.attr.kind
        };
        let gone_there = matches!(&answer, Err(crate::remote::RemoteError::NotFound(_)));
        let name_went = match &answer {
            Ok(a) if same(a) => {
                if !raced {
                    let now = self.cfg.clock.now();
                    self.inodes.mark_fetched(node, now);
                }
                return Applied::Unchanged;
            }
            Ok(a) => RemoteId::of(a) != n.remote,
            Err(_) => true,
        };
        if let Ok(a) = &answer {
            // Pages cached under the version the file has now may be of an earlier content
            // that had it: new bytes under the old size and mtime (`cp -p`, `rsync -t
            // --inplace`), or a file whose mtime was put back after a write the mount saw.
            // Read again. Only then: a forward mtime names a version never cached, and the
            // page cache is searched whole (a burst of changes must not pay that each).
            let may_be_cached = a.version == n.attr.version || a.mtime_ns < n.attr.mtime_ns;
            if a.kind == FileKind::File && !name_went && may_be_cached {
                self.forget_pages_of(node, &a.version);
            }
        }
        // The same directory with new attributes (`rsync -a` or `tar -x` setting the times
        // of one it just made, the change reported back before its answer): its names are
        // as the listing has them, each change of them being an event of its own.
        let listing_holds = children_reported
            && !name_went
            && n.attr.kind == FileKind::Dir
            && answer.as_ref().is_ok_and(|a| a.kind == FileKind::Dir);
        match answer {
            Ok(a) if !raced && !name_went => {
                if a.kind == FileKind::Dir
                    && (a.mode, a.uid, a.gid) != (n.attr.mode, n.attr.uid, n.attr.gid)
                {
                    // Who may search it changed: the kernel's names below it would skip
                    // the daemon's check.
                    self.forget_kernel_entries_in(node);
                }
                // Changed in place (the same file): open handles read its new bytes, as on a
                // local disk, not pages of the old version (read ahead before the change).
                if self.inodes.rebind_answer(node, &a, asked) {
                    self.handles.follow(node, &a);
                }
            }
            // Asked again on next use.
            _ => {
                self.inodes.mark_stale(node);
                if gone_there && !raced && n.links.len() > 1 {
                    // A hard-linked file lost this name (git writes each object as a temp,
                    // links it to its name and removes the temp): it is asked for through
                    // its other names from now on, not through the one that is gone.
                    if let Some((parent_path, name)) = path.split_last() {
                        if let Some(p) = self.inodes.resolve(&parent_path) {
                            if self.inodes.child(p, name) == Some(node) {
                                self.inodes.unlink(p, name);
                            }
                        }
                    }
                }
            }
        }
        if !listing_holds {
            self.meta.expire(node);
        }
        for (parent, _) in &n.links {
            self.meta.expire(*parent);
        }
        let Some(k) = self.kernel() else {
            return Applied::Changed;
        };
        // A directory's data is its listing the kernel keeps ([`FsCore::opendir`]).
        if !listing_holds {
            k.invalidate_data(node);
        }
        if name_went && !raced {
            // Also when the name already leads elsewhere here (a listing fetched meanwhile
            // took the new file): the kernel may still hold it for the old node, as long as
            // the feed lets it keep names. Dropping a name the kernel holds for the right
            // node costs one lookup.
            if let Some((parent_path, name)) = path.split_last() {
                if let Some(p) = self.inodes.resolve(&parent_path) {
                    k.invalidate_entry(p, name);
                }
            }
        }
        Applied::Changed
    }
}
