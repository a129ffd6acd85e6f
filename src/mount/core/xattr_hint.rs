//! Extended attributes answered without a round trip: the sandbox's stat, listings and trees
//! say whether each file has any ([`crate::remote::Attr::has_xattrs`]). While a node's
//! attributes are trusted, one known to have none answers `getxattr` with `ENODATA` and
//! `listxattr` with an empty list locally (`ls -l` asks every file for its ACL and security
//! label: a round trip each otherwise). Unknown (an older agent) or stale: ask the sandbox.

use super::FsCore;
use crate::mount::inode::NodeId;
use crate::remote::Attr;

impl FsCore {
    /// The node's attributes when they are trusted and say it has no extended attribute: a
    /// `getxattr` is then answered without waiting for anything (not even a task).
    pub(in crate::mount) fn attr_without_xattrs(&self, node: NodeId) -> Option<Attr> {
        let n = self.inodes.get(node)?;
        (n.attr.has_xattrs == Some(false) && self.fresh(n.fetched))
            .then(|| self.with_staged(node, n.attr))
    }

    /// Whether `node` has no extended attribute, by attributes still trusted.
    pub(in crate::mount) fn known_without_xattrs(&self, node: NodeId) -> bool {
        self.inodes
            .get(node)
            .is_some_and(|n| n.attr.has_xattrs == Some(false) && self.fresh(n.fetched))
    }

    /// While the sandbox does not answer, a node not known to carry attributes answers
    /// "none": `ls -l` asks every file for its ACL, and an `EIO` there fails the listing
    /// that the mount otherwise serves from what it knows.
    pub(in crate::mount) fn offline_without_xattrs(&self, node: NodeId) -> bool {
        self.offline()
            && self
                .inodes
                .get(node)
                .is_some_and(|n| n.attr.has_xattrs != Some(true))
    }

    /// An attribute was set (`Some(true)`) or removed (unknown: others may remain) through
    /// the mount, or the call failed (unknown): the node and its directory's cached listing
    /// say so, so neither answers "none" from before the change.
    pub(in crate::mount) fn xattrs_changed(&self, node: NodeId, has: Option<bool>) {
        self.bump();
        self.inodes.set_has_xattrs(node, has);
        let Some(path) = self.inodes.path_of(node) else {
            return;
        };
        if let Some((dir, name)) = path.split_last() {
            if let Some(dir) = self.inodes.resolve(&dir) {
                self.meta.set_has_xattrs(dir, name, has);
            }
        }
    }
}
