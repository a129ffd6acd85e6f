//! A new file's names before and after its first push: unlinking or renaming a file the
//! sandbox does not have yet stays local, and one whose commit went unanswered is looked for
//! in the sandbox (the rules are [`crate::mount::newfiles`]'s).

use std::sync::Arc;

use super::{now_ns, FsCore};
use crate::mount::inode::NodeId;
use crate::mount::writeback::StagedEntry;
use crate::remote::{RemoteError, RenameMode, Result};

impl FsCore {
    /// Unlink a file the sandbox does not have yet: here only, no remote call (its push
    /// never happens). Answers false when it may have reached the sandbox meanwhile.
    pub(in crate::mount) async fn unlink_new(
        &self,
        parent: NodeId,
        name: &[u8],
        node: NodeId,
    ) -> bool {
        // (A name it was renamed over is unlinked in the sandbox too: that file was replaced.)
        let Some((s, _requeue)) = self.claim_new(node).await else {
            return false;
        };
        let g = s.lock().await;
        if !self.newfiles.unsent(node) {
            return false;
        }
        if self.newfiles.set_covers(node, false) && !self.unlink_covered(parent, name).await {
            self.newfiles.set_covers(node, true);
            return false;
        }
        self.bump();
        tracing::debug!(name = %String::from_utf8_lossy(name), "a new file removed here, never pushed");
        self.inodes.unlink(parent, name);
        // Marked under the image's lock: a push waiting for it finds nothing to send.
        self.inodes.lost_name(node, now_ns());
        self.inodes.mark_removed_locally(node);
        drop(g);
        self.removed(node);
        self.entry_removed(parent, name);
        if let Some(k) = self.kernel() {
            k.invalidate_attr(node);
        }
        true
    }

    /// Rename a file the sandbox does not have yet: here only; its push creates the new name
    /// (replacing what the sandbox has there, as the rename would). Answers false when it
    /// may have reached the sandbox meanwhile.
    pub(in crate::mount) async fn rename_new(
        &self,
        (parent, name): (NodeId, &[u8]),
        (new_parent, new_name): (NodeId, &[u8]),
        mode: RenameMode,
        node: NodeId,
    ) -> Result<bool> {
        if mode == RenameMode::Exchange {
            return Ok(false);
        }
        let Some((s, _requeue)) = self.claim_new(node).await else {
            return Ok(false);
        };
        let mut g = s.lock().await;
        if !self.newfiles.unsent(node) {
            return Ok(false);
        }
        let target = self.inodes.child(new_parent, new_name);
        if target == Some(node) {
            tracing::debug!("a new file renamed over another name of itself: nothing to do");
            return Ok(true);
        }
        if let Some(t) = target {
            // A push of the file this replaces may be on its way: it lands first, or it would
            // land after the rename (and after any removal of that name this file's moving on
            // makes), leaving the replaced file in the sandbox.
            self.pushq.wait_for(&[t]).await;
        }
        // The target may be a sandbox file (anything but a new file of ours): the push will
        // replace it, as the rename would have.
        let mut covers = target.is_some_and(|t| !self.newfiles.unsent(t));
        if let Some(t) = target {
            if mode == RenameMode::NoReplace {
                return Err(RemoteError::Exists(new_name_display(new_name)));
            }
            self.keep_open_copy(t).await?;
            if covers && self.take_linked_name(t, (new_parent, new_name)).await? {
                covers = false;
            }
        }
        // Leaving a name it was renamed over: the file there was replaced, so it goes.
        if self.newfiles.set_covers(node, covers) && !self.unlink_covered(parent, name).await {
            self.newfiles.set_covers(node, true);
            return Err(RemoteError::Transport(
                "the sandbox did not remove the file this one replaced".into(),
            ));
        }
        self.bump();
        let replaced = self.inodes.rename(parent, name, new_parent, new_name);
        if let (Some(j), Some(p)) = (&mut g.journal, self.inodes.path_of(node)) {
            let _ = j.moved(&p);
        }
        drop(g);
        if let Some(r) = replaced {
            self.removed(r);
        }
        self.inodes.touched(node, now_ns());
        self.entries_renamed((parent, name), (new_parent, new_name));
        tracing::debug!(to = ?self.inodes.path_of(node).map(|p| p.display()), "a new file renamed here, not pushed yet");
        Ok(true)
    }

    /// A new file takes the name of `target`, a sandbox file with other names: a commit to
    /// this name would write into it (commits keep hard links), changing the other names
    /// too. The rename only takes this name from it, so that is done now, and the new file's
    /// push creates the name anew. Answers whether it did so.
    pub(in crate::mount) async fn take_linked_name(
        &self,
        target: NodeId,
        (parent, name): (NodeId, &[u8]),
    ) -> Result<bool> {
        let linked = self
            .inodes
            .get(target)
            .is_some_and(|n| n.links.len() > 1 || n.attr.nlink > 1);
        if !linked {
            return Ok(false);
        }
        if !self.unlink_covered(parent, name).await {
            return Err(RemoteError::Transport(
                "the sandbox did not remove the name this file replaces".into(),
            ));
        }
        Ok(true)
    }

    /// Remove the sandbox's file at a name a new file was renamed over (gone already is fine).
    async fn unlink_covered(&self, parent: NodeId, name: &[u8]) -> bool {
        let Ok(path) = self.path_of(parent).and_then(|p| p.join(name)) else {
            return false;
        };
        matches!(
            self.removed_once(|| self.remote().unlink(&path)).await,
            Ok(()) | Err(RemoteError::NotFound(_))
        )
    }

    /// The staged image of a new file, its queued push withdrawn if it had not started (a
    /// guard queues it again when the caller is done: to the name the file then has, or to
    /// nothing if it was removed), else once its queued pushes ended (`None`: not new).
    async fn claim_new(&self, node: NodeId) -> Option<(Arc<StagedEntry>, Option<Requeue<'_>>)> {
        if !self.newfiles.unsent(node) {
            return None;
        }
        if self.pushq.withdraw(node) {
            // A push of it already running holds the image's lock, which the caller takes.
            let requeue = Requeue { core: self, node };
            return self.staged_of(node).map(|s| (s, Some(requeue)));
        }
        self.pushq.wait_for(&[node]).await;
        self.staged_of(node).map(|s| (s, None))
    }
}

/// A withdrawn push queued again when the operation that withdrew it ends, however it ends.
struct Requeue<'a> {
    core: &'a FsCore,
    node: NodeId,
}

impl Drop for Requeue<'_> {
    fn drop(&mut self) {
        let removed = self
            .core
            .inodes
            .get(self.node)
            .is_none_or(|n| n.removed_locally);
        if !removed {
            self.core.queue_push(self.node);
        }
    }
}

fn new_name_display(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
