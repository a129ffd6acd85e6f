//! Pushing a staged file to the sandbox as one atomic commit, and what happens when a push
//! fails: the write-back operations of the core, over the write-back state it owns
//! ([`crate::mount::writeback`]: staged images, their lifecycle, failures kept).

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use super::capture::MAX_CAPTURE_BYTES;
use super::{local_io, unreachable, FsCore};
use crate::mount::inode::{NodeId, RemoteId};
use crate::mount::lifecycle::{Stage, Step};
use crate::mount::pages::PageIndex;
use crate::mount::staging::{Journal, JournalMeta, Staged, PAGE};
use crate::remote::{
    Attr, CommitContent, CommitOptions, RemoteError, RemotePath, Result, SetAttr, WireBytes,
};

use crate::mount::writeback::*;

impl FsCore {
    /// The staged state of a node, created over `attr` (its current version) if there is none.
    pub(in crate::mount) fn stage(
        &self,
        node: NodeId,
        attr: &Attr,
        writer: bool,
    ) -> Result<Arc<StagedEntry>> {
        let make = || {
            let path = self
                .inodes
                .path_of(node)
                .or_else(|| self.inodes.get(node).map(|n| n.last_path))
                .unwrap_or_default();
            // The node's attributes as they are now: `attr` may have been read before a
            // queued push of an earlier image ended (and that image was dropped), and its
            // version would make the next push a false conflict.
            let current = self.inodes.get(node).map(|n| n.attr);
            let attr = current.as_ref().unwrap_or(attr);
            let (journal, file) = Journal::create(
                &self.cfg.staging_dir,
                JournalMeta {
                    path: WireBytes(path.as_bytes().to_vec()),
                    base: Some(attr.version.clone()),
                    base_size: attr.size,
                    mode: Some(attr.mode),
                    sandbox: Some(self.sandbox_id()),
                },
            )
            .map_err(|e| local_io(&e))?;
            let mut s = Staged::new(file, Some(attr.version.clone()), attr.size);
            s.journal = Some(journal);
            Ok(s)
        };
        let (e, made) = self.staged.get_or_make(node, writer, make)?;
        if made {
            self.inodes.pin(node, true);
        }
        Ok(e)
    }

    /// The staged state of a file created here and not in the sandbox yet (no base: its first
    /// push creates it, with its mode, in one commit), open for writing once.
    pub(in crate::mount) fn stage_new(&self, node: NodeId) -> Result<Arc<StagedEntry>> {
        let n = self
            .inodes
            .get(node)
            .ok_or_else(|| RemoteError::NotFound(format!("node {}", node.0)))?;
        let (journal, file) = Journal::create(
            &self.cfg.staging_dir,
            JournalMeta {
                path: WireBytes(n.last_path.as_bytes().to_vec()),
                base: None,
                base_size: 0,
                mode: Some(n.attr.mode),
                sandbox: Some(self.sandbox_id()),
            },
        )
        .map_err(|e| local_io(&e))?;
        let mut s = Staged::new(file, None, 0);
        s.journal = Some(journal);
        // Its first push gives it the time it was made (what the mount shows until then), not
        // the push's, even if nothing is ever written to it.
        s.mtime_ns = Some(n.attr.mtime_ns);
        let (e, _) = self.staged.get_or_make(node, true, || Ok(s))?;
        self.inodes.pin(node, true);
        Ok(e)
    }

    /// This sandbox's identity: the id it keeps for its workspace, else (a transport without
    /// one) its workspace root's device and inode.
    pub(in crate::mount) fn sandbox_id(&self) -> String {
        if let Some(id) = self.sandbox.workspace_id() {
            return format!("id:{id}");
        }
        let root = self
            .inodes
            .get(crate::mount::inode::ROOT)
            .map(|n| n.remote)
            .unwrap_or(crate::mount::inode::RemoteId::NONE);
        format!("{:x}:{:x}", root.dev, root.ino)
    }

    /// Keep pages on disk in `dir` too ([`crate::mount::disk_pages`]), bounded by `cap` bytes.
    pub fn attach_disk_cache(&self, dir: &Path, cap: u64) {
        if let Some(d) = super::super::disk_pages::DiskPages::open(dir, cap) {
            tracing::info!(dir = %dir.display(), cap, "disk cache");
            self.pages.attach_disk(d);
        }
    }

    /// Forget what is staged for a node (and its journal).
    pub(in crate::mount) fn drop_staged(&self, node: NodeId) {
        let e = self.staged.remove(node);
        self.inodes.pin(node, false);
        if let Some(e) = e {
            if let Some(mut g) = e.try_lock() {
                if let Some(j) = g.journal.take() {
                    j.remove();
                }
            }
        }
        self.failures.clear(node);
        self.newfiles.remove(node);
        self.staging_ended(node);
    }

    /// Drop a node's staged state once nothing is open on it and all of it is pushed.
    pub(in crate::mount) async fn drop_staged_if_clean(&self, node: NodeId) {
        // Decided under the map's lock: an open taking this entry counts itself first.
        let dropped = self
            .staged
            .remove_if_idle(node, || self.inodes.get(node).is_none_or(|n| n.open <= 1));
        if let Some(e) = dropped {
            self.inodes.pin(node, false);
            self.staging_ended(node);
            let mut g = e.lock().await;
            if let Some(j) = g.journal.take() {
                j.remove();
            }
        }
    }

    /// Push a node's staged writes (flush, fsync, release, retries).
    pub async fn push(&self, node: NodeId) -> Result<()> {
        let Some(staged) = self.staged_of(node) else {
            return Ok(());
        };
        let mut s = staged.lock().await;
        if !s.is_dirty() {
            // An earlier push took it all (a queued push finds nothing left).
            staged.step(Step::Landed { dirty: false });
            return Ok(());
        }
        staged.push_begins();
        let pushed = self.push_locked(node, &staged, &mut s).await;
        let late = staged.push_ends();
        if late != SetAttr::default() {
            self.apply_late(node, &staged, &mut s, late).await;
        }
        pushed
    }

    /// Mode, owner and times set while the push ran: applied now when it left the file clean,
    /// else kept with the image for its next push.
    async fn apply_late(&self, node: NodeId, staged: &StagedEntry, s: &mut Staged, late: SetAttr) {
        let path = match self.inodes.path_of(node) {
            Some(path) if !s.is_dirty() => path,
            _ => {
                s.pending_attr.then(&late);
                s.mtime_ns = late.mtime_ns.or(s.mtime_ns);
                staged.sync(s);
                return;
            }
        };
        if late.mtime_ns.is_some() {
            // Shown until the sandbox's answer carries it.
            s.mtime_ns = late.mtime_ns;
            staged.sync(s);
        }
        let pushed_as = self.inodes.get(node).map(|n| n.remote);
        match self.note(self.remote().setattr(&path, late).await) {
            // Still the file the push made: its new times are ours.
            Ok(a) if pushed_as == Some(RemoteId::of(&a)) => {
                s.pushed(a.version.clone(), a.size);
                self.own_change(node, &a);
                self.handles.follow(node, &a);
            }
            // The sandbox replaced it meanwhile: that file is the feed's to report, not ours.
            Ok(_) => {
                tracing::debug!(file = %path.display(), "replaced in the sandbox right after its push")
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), "mode/times not applied after push: {e}")
            }
        }
        s.mtime_ns = None;
        staged.sync(s);
    }

    async fn push_locked(
        &self,
        node: NodeId,
        staged: &Arc<StagedEntry>,
        s: &mut Staged,
    ) -> Result<()> {
        let Some(n) = self.inodes.get(node) else {
            return Ok(());
        };
        let path = match self.inodes.path_of(node) {
            Some(p) => p,
            // Unlinked through the mount: nothing to push, ever.
            None if n.removed_locally => return Ok(()),
            // Its name now leads to another file (replaced in the sandbox): keep the user's
            // bytes beside it.
            None => {
                let r = self.save_conflict_copy(node, &n.last_path, s).await;
                return match r {
                    Ok((copy, attr)) => {
                        tracing::error!(file = %n.last_path.display(), saved_as = %copy.display(),
                            "the file was replaced in the sandbox while open; your version was saved beside it");
                        self.failures.note_conflict(&n.last_path, &copy);
                        if !self.follow_copy(node, &n.last_path, &copy, &attr, s) {
                            let len = s.len;
                            s.pushed(crate::remote::Version(String::new()), len);
                            self.removed_for_good(node);
                        }
                        staged.sync(s);
                        staged.step(Step::Conflicted);
                        self.failures.clear(node);
                        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        // As any conflict: the fsync or close that pushed it hears of it.
                        Err(RemoteError::Io(
                            n.last_path.display(),
                            format!(
                                "conflict: replaced in the sandbox; your version was saved as {}",
                                copy.display()
                            ),
                        ))
                    }
                    Err(e) => {
                        self.push_failed(staged, node, &n.last_path.display(), &e);
                        Err(e)
                    }
                };
            }
        };
        if !self.is_reachable() && !self.answers_within_pace().await {
            // Not even tried: a sandbox that does not answer would hold this close for a
            // whole deadline. Kept, and pushed as soon as it answers again. (Asked first: a
            // sandbox taken for gone may only have been slow.)
            let e = RemoteError::Transport("the sandbox is not answering; kept locally".into());
            self.push_failed(staged, node, &path.display(), &e);
            return Err(e);
        }
        let mut path = path;
        // A file created here: the commit creates it, with the mode it has now (a chmod since
        // its creation included), so no setattr follows for the mode.
        let was_new = s.base.is_none();
        // A file made here over a name found absent is created only if still absent: one the
        // sandbox made meanwhile is not overwritten (a conflict: ours is saved beside it).
        // A new file renamed over a sandbox file replaces it by this commit, which keeps
        // that file's mode: its own is set right after (a 0600 save over a 0644 file).
        let covering = was_new && self.newfiles.covers(node);
        let create_only =
            was_new && self.sandbox.commit_absent() && self.newfiles.contains(node) && !covering;
        if was_new {
            self.newfiles.sent(node);
        }
        staged.step(Step::Started);
        let mut result;
        let mut bytes;
        let mut rebased = false;
        let mut followed = false;
        loop {
            // The base's pages not here yet are fetched first ([`super::capture`]): what a
            // conflict copy needs, and all a transport without patch commits can send. A base
            // replaced meanwhile (`Stale`) is left to the commit's base check, which fails
            // with the conflict handled below; a patch goes without its capture otherwise.
            let whole_only = !self.sandbox.patch_commits();
            if !s.complete() && (whole_only || Self::wants_capture(s)) {
                match self.capture_base(&path, s).await {
                    Ok(()) | Err(RemoteError::Stale(_)) => {}
                    Err(e) if !whole_only => {
                        tracing::debug!(file = %path.display(), "base not captured before the push: {e}")
                    }
                    Err(e) => {
                        self.push_failed(staged, node, &path.display(), &e);
                        return Err(e);
                    }
                }
            }
            let content = match s.content_for(
                self.sandbox.patch_commits() || !s.complete(),
                self.sandbox.patch_new(),
            ) {
                Ok(c) => c,
                Err(e) => {
                    let e = local_io(&e);
                    self.push_failed(staged, node, &path.display(), &e);
                    return Err(e);
                }
            };
            let content_of;
            (content_of, bytes) = content;
            let shown = staged.show_while_pushing(s);
            result = self.note(
                self.remote()
                    .commit(
                        &path,
                        content_of,
                        CommitOptions {
                            base: match &s.base {
                                None if create_only => Some(crate::remote::Version::absent()),
                                b => b.clone(),
                            },
                            create_mode: Some(n.attr.mode),
                            // The time the mount showed for the last write, kept.
                            mtime_ns: s.mtime_ns,
                            // An access time set before the push goes with it.
                            atime_ns: s
                                .pending_attr
                                .atime_ns
                                .filter(|_| self.sandbox.commit_atime()),
                        },
                    )
                    .await,
            );
            drop(shown);
            tracing::debug!(file = %path.display(), ok = result.is_ok(), "commit");
            if let Err(e) = &result {
                if unreachable(e) {
                    // The commit may have reached the sandbox: remember what it sent, to
                    // recognise it if the next attempt meets it as a "conflict".
                    self.failures.note_attempt(node, Attempt::of(s));
                }
            }
            if !rebased && matches!(result, Err(RemoteError::Conflict { .. })) {
                let mut found = None;
                for a in self.failures.attempts(node) {
                    if let Some(v) = self.landed(&path, &a).await {
                        found = Some(v);
                        break;
                    }
                }
                if let Some(landed) = found {
                    // An earlier attempt landed and only its answer was lost: the sandbox
                    // holds our own content. Push what came since over it.
                    s.base = Some(landed);
                    rebased = true;
                    continue;
                }
            }
            if !followed && matches!(result, Err(RemoteError::Conflict { .. })) {
                followed = true;
                if let Some(moved) = self.renamed_in_sandbox(&n, s.base.as_ref()).await {
                    // Renamed in the sandbox while open: the writes follow the file.
                    tracing::info!(from = %path.display(), to = %moved.display(),
                        "the file was renamed in the sandbox while open; pushing to its new name");
                    if let Some(j) = &mut s.journal {
                        let _ = j.moved(&moved);
                    }
                    path = moved;
                    continue;
                }
            }
            break;
        }
        if let (
            Err(RemoteError::IsDir(_) | RemoteError::Invalid(_) | RemoteError::NotDir(_)),
            Some(base),
        ) = (&result, &s.base)
        {
            // The sandbox put a directory, a FIFO or a socket where the file was: a conflict
            // (the user's version is saved beside it), not a refusal to keep retrying.
            if let Ok(a) = self.note(self.remote().stat(&path).await) {
                if a.kind != crate::remote::FileKind::File {
                    result = Err(RemoteError::Conflict {
                        path: path.display(),
                        base: base.0.clone(),
                        current: format!("a {:?} now", a.kind).to_lowercase(),
                    });
                }
            }
        }
        match result {
            Ok(mut attr) => {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_pushed.fetch_add(bytes, Ordering::Relaxed);
                let mut pending = std::mem::take(&mut s.pending_attr);
                if covering && attr.mode & 0o7777 != n.attr.mode & 0o7777 {
                    pending.mode = Some(n.attr.mode & 0o7777);
                } else if was_new {
                    pending.mode = None;
                }
                // A time set before the push (`tar -x` sets each file's mtime right after
                // closing it) went with the commit: no second call for it.
                if pending.mtime_ns.is_some()
                    && pending.mtime_ns == s.mtime_ns
                    && Some(attr.mtime_ns) == pending.mtime_ns
                {
                    pending.mtime_ns = None;
                }
                if pending.atime_ns.is_some() && Some(attr.atime_ns) == pending.atime_ns {
                    pending.atime_ns = None;
                }
                if pending != SetAttr::default() {
                    match self.note(self.remote().setattr(&path, pending).await) {
                        Ok(a) if RemoteId::of(&a) == RemoteId::of(&attr) => attr = a,
                        // Replaced in the sandbox right after the commit: the feed reports it.
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(file = %path.display(), "mode/times not applied after push: {e}")
                        }
                    }
                }
                self.keep_pushed_pages(s, &attr);
                s.pushed(attr.version.clone(), attr.size);
                s.mtime_ns = None;
                staged.sync(s);
                staged.step(Step::Landed {
                    dirty: s.is_dirty(),
                });
                self.failures.clear(node);
                // The atomic rename gave the file a new sandbox inode: this node now stands
                // for it. What the kernel cached was written piecemeal: never a version.
                self.own_change(node, &attr);
                self.newfiles.remove(node);
                self.handles.follow(node, &attr);
                self.inodes.kernel_pages_dropped(node);
                match n.links.as_slice() {
                    [(parent, name)] => self.entry_made(*parent, name, attr.clone()),
                    links => {
                        for (parent, _) in links {
                            self.dir_changed(*parent);
                        }
                    }
                }
                Ok(())
            }
            Err(RemoteError::Conflict { current, .. }) => {
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                match self.save_conflict_copy(node, &path, s).await {
                    Ok((copy, copy_attr)) => {
                        let what = if s.base.is_none() {
                            "the sandbox made a file of that name after you did"
                        } else {
                            "the file changed in the sandbox since it was opened"
                        };
                        tracing::error!(
                            file = %path.display(),
                            saved_as = %copy.display(),
                            "conflict: {what}; your version was saved beside it"
                        );
                        self.failures.note_conflict(&path, &copy);
                        if self.follow_copy(node, &path, &copy, &copy_attr, s) {
                            if self.handles.open_on(node) > 0 {
                                tracing::warn!(file = %path.display(), saved_as = %copy.display(),
                                    "the file is still open: what is written to it from now on goes to the copy");
                            }
                        } else {
                            // Follow the sandbox's version from now on.
                            match self.note(self.remote().stat(&path).await) {
                                Ok(a) => {
                                    s.rebase_remote(a.version.clone(), a.size)
                                        .map_err(|e| local_io(&e))?;
                                    self.own_change(node, &a);
                                    self.handles.follow(node, &a);
                                }
                                Err(_) => {
                                    let len = s.len;
                                    s.pushed(crate::remote::Version(String::new()), len);
                                }
                            }
                            if let Some(k) = self.kernel() {
                                k.invalidate_data(node);
                            }
                        }
                        s.mtime_ns = None;
                        staged.sync(s);
                        staged.step(Step::Conflicted);
                        self.failures.clear(node);
                        let e = RemoteError::Io(
                            path.display(),
                            format!("conflict: changed in the sandbox (now {current}); your version was saved as {}", copy.display()),
                        );
                        // A handle still open (a program saving again at once, its open
                        // reaching this node before the close that queued this push was
                        // done) wrote into the copy: its next fsync or close hears of it.
                        // A caller of this push hears it here ([`FsCore::push_reported`]).
                        // (Counted from the start of an open, before its handle exists.)
                        if self.inodes.get(node).is_some_and(|n| n.open > 0) {
                            self.failures.conflict_unheard(node, e.clone());
                        }
                        Err(e)
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), "conflict, and the conflict copy failed ({e}); your data stays staged");
                        self.push_failed(staged, node, &path.display(), &e);
                        Err(e)
                    }
                }
            }
            Err(e) => {
                self.stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                self.push_failed(staged, node, &path.display(), &e);
                Err(e)
            }
        }
    }

    /// What was just pushed is the sandbox's file at `version`: a small image held whole
    /// goes into the page cache under it, so reading back what was written costs no fetch
    /// (and works while the sandbox does not answer).
    fn keep_pushed_pages(&self, s: &Staged, attr: &crate::remote::Attr) {
        if s.len > MAX_KEPT_PUSHED_BYTES || !(s.base.is_none() || s.complete()) {
            return;
        }
        for page in 0..s.len.div_ceil(PAGE) {
            match s.read_local(page * PAGE, PAGE.min(s.len - page * PAGE)) {
                Ok(data) => self.pages.put(
                    attr.version.clone(),
                    Some(attr.ctime_ns),
                    PageIndex(page),
                    bytes::Bytes::from(data),
                ),
                Err(_) => return,
            }
        }
    }

    /// A push of `node` failed: kept, retried if worth it, and shown so.
    fn push_failed(&self, staged: &StagedEntry, node: NodeId, path: &str, e: &RemoteError) {
        self.failures.record(node, path, e);
        staged.step(Step::Failed {
            transient: transient(e),
        });
    }

    /// Does the sandbox's file hold exactly what an earlier attempt sent (a push whose answer
    /// was lost landed)? Compares the size and the bytes of every range it wrote; answers the
    /// file's version if so.
    async fn landed(&self, path: &RemotePath, a: &Attempt) -> Option<crate::remote::Version> {
        let st = self.note(self.remote().stat(path).await).ok()?;
        if st.size != a.len {
            return None;
        }
        let mut h = a.hasher.build_hasher();
        for &(start, end) in &a.ranges {
            let mut at = start;
            while at < end {
                let n = (end - at).min(crate::remote::wire::MAX_READ_BYTES as u64) as u32;
                let r = self.note(self.remote().read(path, at, n).await).ok()?;
                if r.version != st.version || r.data.is_empty() {
                    return None;
                }
                h.write(&r.data);
                at += r.data.len() as u64;
            }
        }
        (h.finish() == a.digest).then_some(st.version)
    }

    /// Where the node's file went if the sandbox renamed it within its directory: the entry
    /// that is the same sandbox file (device and inode) at the base version. The inode table
    /// moves the node's name there.
    async fn renamed_in_sandbox(
        &self,
        n: &crate::mount::inode::Node,
        base: Option<&crate::remote::Version>,
    ) -> Option<RemotePath> {
        let base = base?;
        let (parent, old_name) = n.links.first()?.clone();
        let dir = self.inodes.path_of(parent)?;
        let entries = self.note(self.remote().list(&dir).await).ok()?;
        let e = entries.into_iter().find(|e| {
            e.name.0 != old_name
                && crate::mount::inode::RemoteId::of(&e.attr) == n.remote
                && &e.attr.version == base
        })?;
        self.inodes.rename(parent, &old_name, parent, &e.name.0);
        self.dir_changed(parent);
        // The kernel still leads both names where they led: an open of the old name would
        // reach this file at its new one.
        if let Some(k) = self.kernel() {
            k.invalidate_entry(parent, &old_name);
            k.invalidate_entry(parent, &e.name.0);
        }
        dir.join(&e.name.0).ok()
    }

    fn removed_for_good(&self, node: NodeId) {
        self.inodes.mark_removed_locally(node);
    }

    /// Write the staged content beside `path` as `NAME.sbxfs-conflict-<time>-<n>`, a name
    /// created exclusively (never overwriting anything). Pages the user never read or wrote
    /// come from the page cache at the base version when it has them, else from the sandbox's
    /// current file: the user's own bytes are what must not be lost.
    async fn save_conflict_copy(
        &self,
        node: NodeId,
        path: &RemotePath,
        s: &mut Staged,
    ) -> Result<(RemotePath, Attr)> {
        // Base pages still in the page cache are the user's version exactly; the rest can only
        // come from what the sandbox has now.
        let known = s.base.clone();
        // The copy gets the file's permission bits (a script stays runnable), never its
        // set-ID bits nor write access for others (a mode the sandbox chose last).
        let mode = s
            .pending_attr
            .mode
            .or(self.inodes.get(node).map(|n| n.attr.mode))
            .map_or(0o600, |m| m & 0o755);
        let copy = self.write_conflict_copy(path, s, known, mode).await?;
        if let Some((parent, _)) = self.inodes.get(node).and_then(|n| n.links.first().cloned()) {
            self.dir_changed(parent);
        }
        Ok(copy)
    }

    /// After a conflict the node becomes its conflict copy (`attr`, just written from the
    /// image): the user's version, which a handle still open goes on writing — an appending
    /// log's next line lands after its last one in the copy, never at that offset of the
    /// sandbox's new file. Its names (every hard link) are the sandbox's file again: a new node
    /// at the next lookup. Answers false for a node it cannot move (its directory unknown):
    /// that one follows the sandbox's version.
    fn follow_copy(
        &self,
        node: NodeId,
        path: &RemotePath,
        copy: &RemotePath,
        attr: &Attr,
        s: &mut Staged,
    ) -> bool {
        let (Some(n), Some((dir, name)), Some((_, copy_name))) =
            (self.inodes.get(node), path.split_last(), copy.split_last())
        else {
            return false;
        };
        let dir_node = self.inodes.resolve(&dir);
        let mut named = false;
        for (parent, linked) in &n.links {
            if !named && Some(*parent) == dir_node && linked.as_slice() == name {
                self.inodes.rename(*parent, name, *parent, copy_name);
                named = true;
            } else {
                // Its other names (hard links, made here or by the sandbox) lead to the
                // sandbox's file too: from the next lookup on.
                self.inodes.unlink(*parent, linked);
            }
            if let Some(k) = self.kernel() {
                k.invalidate_entry(*parent, linked);
            }
        }
        if !named {
            // Its name already leads to another file (the sandbox replaced or moved it while
            // open): the kernel may still hold that name as this node, and a save by that
            // name right after the conflict would open the copy.
            if let (Some(k), Some(parent)) = (self.kernel(), dir_node) {
                k.invalidate_entry(parent, name);
            }
            match dir_node {
                Some(parent) => self.inodes.link(node, parent, copy_name),
                None => return false,
            }
        }
        self.own_change(node, attr);
        self.handles.follow(node, attr);
        s.pushed(attr.version.clone(), attr.size);
        if let Some(j) = &mut s.journal {
            let _ = j.moved(copy);
        }
        if let Some(parent) = self.inodes.resolve(&dir) {
            self.entry_made(parent, copy_name, attr.clone());
            self.dir_changed(parent);
        }
        true
    }

    /// Fill what is not local from the sandbox (from the page cache at `known` if it has the
    /// pages), then write the whole image to a new conflict name beside `path`.
    async fn write_conflict_copy(
        &self,
        path: &RemotePath,
        s: &mut Staged,
        known: Option<crate::remote::Version>,
        mode: u32,
    ) -> Result<(RemotePath, Attr)> {
        if !s.complete() && s.base_size > MAX_CAPTURE_BYTES && self.sandbox.patch_commits() {
            return self.write_large_conflict_copy(path, s, mode).await;
        }
        let mut from_current = 0u64;
        for page in s.missing_in(0, s.len) {
            let cached = match &known {
                Some(v) => self.page_at(path, v, PageIndex(page)).await.ok(),
                None => None,
            };
            let data = match cached {
                Some(d) => d,
                None => {
                    from_current += 1;
                    let current = self.remote().read(path, page * PAGE, PAGE as u32).await;
                    match self.note(current) {
                        Ok(r) => r.data,
                        // The file is gone from the sandbox (or another kind of thing took
                        // its name): the user's own bytes are what is left.
                        Err(
                            RemoteError::NotFound(_)
                            | RemoteError::IsDir(_)
                            | RemoteError::Invalid(_),
                        ) => bytes::Bytes::new(),
                        Err(e) => return Err(e),
                    }
                }
            };
            s.fill_page(page, &data).map_err(|e| local_io(&e))?;
        }
        if from_current > 0 {
            tracing::warn!(file = %path.display(), pages = from_current,
                "the conflict copy holds the sandbox's new bytes where you did not write: the old ones were replaced before they could be kept");
        }
        let (copy, version) = self.create_conflict_name(path, mode).await?;
        let reader = s.reader().map_err(|e| local_io(&e))?;
        let committed = self.note(
            self.remote()
                .commit(
                    &copy,
                    CommitContent::Whole(Box::new(reader)),
                    CommitOptions {
                        base: Some(version),
                        create_mode: None,
                        mtime_ns: None,
                        atime_ns: None,
                    },
                )
                .await,
        );
        let attr = self.kept_or_discarded(path, &copy, committed).await?;
        self.keep_conflict_locally(path, &copy, s, "a copy of your version is kept locally too");
        Ok((copy, attr))
    }

    /// A conflict copy's commit ended: on failure its (empty) name is removed again, so each
    /// retry of a push the sandbox keeps failing leaves nothing behind there (nor here: the
    /// local copy is made only once the sandbox has the copy; until then the staged image is
    /// the user's version).
    async fn kept_or_discarded(
        &self,
        path: &RemotePath,
        copy: &RemotePath,
        committed: Result<Attr>,
    ) -> Result<Attr> {
        if let Err(e) = &committed {
            tracing::warn!(file = %path.display(), copy = %copy.display(), "the conflict copy could not be written: {e}");
            let _ = self.note(self.remote().unlink(copy).await);
        }
        committed
    }

    /// The sandbox's copy is the sandbox's to delete (`git clean`, or a hostile sandbox forcing
    /// the conflict): one is kept here too, holes kept as holes.
    fn keep_conflict_locally(&self, path: &RemotePath, copy: &RemotePath, s: &Staged, what: &str) {
        let saved = s.image().and_then(|mut image| {
            write_unique(
                &self.cfg.staging_dir.join("conflicts"),
                copy,
                &mut image,
                s.len,
            )
        });
        match saved {
            Ok(local) => tracing::info!(file = %path.display(), kept = %local.display(), "{what}"),
            Err(e) => {
                tracing::error!(file = %path.display(), "could not keep a local copy of your version: {e}")
            }
        }
    }

    /// The conflict copy of a file too large to be kept whole here (its base was not
    /// captured): the sandbox copies its file as it is now into the copy, and the user's
    /// writes are patched over that. No untouched byte crosses the link, none is written
    /// here: the local copy holds the user's writes, with holes elsewhere.
    async fn write_large_conflict_copy(
        &self,
        path: &RemotePath,
        s: &mut Staged,
        mode: u32,
    ) -> Result<(RemotePath, Attr)> {
        let (copy, created) = self.create_conflict_name(path, mode).await?;
        let committed = self.patch_large_copy(path, &copy, created, s).await;
        let attr = self.kept_or_discarded(path, &copy, committed).await?;
        self.keep_conflict_locally(
            path,
            &copy,
            s,
            "what you wrote is kept locally too (holes where the file was not read)",
        );
        Ok((copy, attr))
    }

    /// The sandbox's file as it is now copied into `copy` (made empty at `created`), then the
    /// user's writes patched over it.
    async fn patch_large_copy(
        &self,
        path: &RemotePath,
        copy: &RemotePath,
        created: crate::remote::Version,
        s: &Staged,
    ) -> Result<Attr> {
        let copied = self
            .remote()
            .copy_range(path, 0, copy, 0, s.base_size, Some(created.clone()))
            .await;
        let base = match self.note(copied) {
            Ok((_, attr)) => {
                tracing::warn!(file = %path.display(),
                    "the conflict copy holds the sandbox's new bytes where you did not write: a file this large is not kept whole locally");
                attr.version
            }
            Err(RemoteError::NotFound(_) | RemoteError::IsDir(_) | RemoteError::Invalid(_)) => {
                tracing::warn!(file = %path.display(),
                    "the file is no longer a file in the sandbox: its conflict copy holds only what you wrote (zeros elsewhere)");
                created
            }
            Err(e) => return Err(e),
        };
        // Every byte held here goes over the sandbox's: what was written before an earlier
        // push too (it is no longer in the sandbox's file), not only what is unpushed.
        let (content, _) = match s
            .local_patch(MAX_LOCAL_PATCH_BYTES)
            .map_err(|e| local_io(&e))?
        {
            Some(patch) => patch,
            None => s
                .content_for(true, self.sandbox.patch_new())
                .map_err(|e| local_io(&e))?,
        };
        self.note(
            self.remote()
                .commit(
                    copy,
                    content,
                    CommitOptions {
                        base: Some(base),
                        create_mode: None,
                        mtime_ns: None,
                        atime_ns: None,
                    },
                )
                .await,
        )
    }

    /// Create an empty file named after `path` that did not exist: answers it and its version.
    async fn create_conflict_name(
        &self,
        path: &RemotePath,
        mode: u32,
    ) -> Result<(RemotePath, crate::remote::Version)> {
        let (parent, name) = path.split_last().expect("a file has a name");
        let stamp = stamp();
        for n in 0..CONFLICT_NAME_TRIES {
            // `-0` first; then a random tail: names a sandbox cannot take ahead of time.
            let tail = match n {
                0 => "0".to_string(),
                _ => {
                    let mut r = [0u8; 4];
                    let _ = getrandom::fill(&mut r);
                    format!("{:08x}", u32::from_le_bytes(r))
                }
            };
            let copy = parent.join(&conflict_name(name, &format!("{stamp}-{tail}")))?;
            match self.note(self.remote().create(&copy, mode).await) {
                Ok(a) => return Ok((copy, a.version)),
                Err(RemoteError::Exists(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(RemoteError::Exists(format!(
            "{}: no free conflict copy name",
            path.display()
        )))
    }

    /// Retry the failed pushes that are due (transient failures, with backoff); answers how
    /// many files still have unpushed data.
    pub async fn retry_pending(&self) -> usize {
        for node in self.failures.due() {
            if self.push(node).await.is_ok() {
                self.drop_staged_if_clean(node).await;
            }
        }
        self.failures.len()
    }

    /// Queue a push of the node (`close`): a task runs it when one of the queue's slots is
    /// free, and drops the staged image once it is pushed and nothing has the file open.
    pub(in crate::mount) fn queue_push(&self, node: NodeId) {
        let Some(core) = self.arc() else {
            return;
        };
        let Some(mut ticket) = self.pushq.enqueue(node) else {
            return;
        };
        if let Some(e) = self.staged_of(node) {
            e.step(Step::Queued);
        }
        let new = self.newfiles.unsent(node);
        tokio::spawn(async move {
            if new {
                ticket.settle().await;
            }
            let Some(permit) = core.pushq.start(&ticket).await else {
                core.pushq.done(ticket);
                return;
            };
            let pushed = core.push(node).await.is_ok();
            drop(permit);
            if pushed && core.inodes.get(node).is_none_or(|n| n.open == 0) {
                core.drop_staged_if_clean(node).await;
            }
            core.pushq.done(ticket);
        });
    }

    /// Pushes queued by `close` and not yet ended.
    pub fn queued_pushes(&self) -> usize {
        self.pushq.len()
    }

    /// Push every node with staged changes (at unmount, `sbxfs ctl flush`, before a query):
    /// the queued pushes are waited for, then whatever is still unpushed (a failed push) is
    /// tried once more.
    pub async fn flush_all(&self) -> Vec<(String, RemoteError)> {
        self.pushq.wait_all().await;
        let nodes: Vec<NodeId> = self
            .staged_entries()
            .into_iter()
            .filter(|(_, e)| e.is_dirty())
            .map(|(n, _)| n)
            .collect();
        let mut failures = Vec::new();
        for node in nodes {
            // A conflict: the user's version was saved beside the file and nothing is left
            // unpushed (`flush` and `umount` name the copy among the conflicts).
            let saved = || self.staged_of(node).is_none_or(|e| !e.is_dirty());
            let pushed = match self.push(node).await {
                Err(_) if saved() => Ok(()),
                r => r,
            };
            if let Err(e) = pushed {
                let path = self
                    .inodes
                    .get(node)
                    .map(|n| n.last_path.display())
                    .unwrap_or_default();
                failures.push((path, e));
            }
        }
        failures
    }

    pub fn pending_count(&self) -> usize {
        self.failures.len()
    }

    pub fn push_failures(&self) -> Vec<PushFailure> {
        self.failures.list()
    }

    fn staged_entries(&self) -> Vec<(NodeId, Arc<StagedEntry>)> {
        self.staged.all()
    }

    /// Every conflict copy this mount made (`ctl status`, `flush`, `umount`).
    /// Edits left by an earlier mount that are kept, not pushed ([`KeptEdit`]).
    pub fn kept_from_earlier(&self) -> Vec<KeptEdit> {
        self.failures.kept()
    }

    pub fn conflict_copies(&self) -> Vec<ConflictCopy> {
        self.failures.conflicts()
    }

    /// The conflict copies made since the last flush answered (each is named to one flush).
    pub fn conflict_copies_unreported(&self) -> Vec<ConflictCopy> {
        self.failures.conflicts_unreported()
    }

    /// Each staged file that is not clean, with its state ([`crate::mount::lifecycle`]).
    pub fn file_stages(&self) -> Vec<(String, Stage)> {
        let staged = self.staged_entries();
        let mut out: Vec<(String, Stage)> = staged
            .into_iter()
            .map(|(node, e)| (node, e.stage()))
            .filter(|(_, stage)| *stage != Stage::Clean)
            .filter_map(|(node, stage)| {
                let n = self.inodes.get(node)?;
                (!n.removed_locally).then(|| (n.last_path.display(), stage))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Copy every staged file that still has unpushed changes into `dir/unpushed/`, at its
    /// sandbox path (directories mirrored, so two paths never share a name; an existing file
    /// is never overwritten: a numbered name is taken instead). The journals stay too, for
    /// the next mount of the same remote. Returns the files written.
    pub async fn save_unpushed(&self, dir: &Path) -> Vec<PathBuf> {
        let staged = self.staged_entries();
        let mut saved = Vec::new();
        for (node, s) in staged {
            let mut g = s.lock().await;
            if !g.is_dirty() {
                continue;
            }
            let Some(n) = self.inodes.get(node) else {
                continue;
            };
            if n.removed_locally {
                continue;
            }
            let len = g.len;
            let _ = self.fill(node, &mut g, 0, len).await;
            match g.image().and_then(|mut image| {
                write_unique(&dir.join("unpushed"), &n.last_path, &mut image, len)
            }) {
                Ok(p) => saved.push(p),
                Err(e) => {
                    tracing::error!(file = %n.last_path.display(), "could not save a copy: {e}")
                }
            }
        }
        saved
    }

    /// Push what a previous daemon of this remote left staged (it was killed, or the sandbox
    /// was unreachable when it stopped). Each file is pushed over the base it was staged
    /// against, or saved as a conflict copy if the sandbox changed it meanwhile. Answers how
    /// many went each way, and how many remain (kept for the next mount).
    pub async fn recover_staged(&self) -> RecoveredEdits {
        let found = Journal::recover(&self.cfg.staging_dir);
        let mut done = RecoveredEdits::default();
        let here = self.sandbox_id();
        for (journal, file, ops) in found {
            let meta = journal.meta().clone();
            if meta.sandbox.as_ref().is_some_and(|s| *s != here) {
                // Staged against another sandbox that answered at this URL before: never
                // pushed here (it would put one sandbox's edits, maybe secrets, in another).
                done.kept += 1;
                self.failures
                    .note_kept(&meta.path.0, "staged for another sandbox at this address");
                tracing::warn!(
                    file = %String::from_utf8_lossy(&meta.path.0),
                    kept_in = %self.cfg.staging_dir.display(),
                    staged_for = %meta.sandbox.as_deref().unwrap_or_default(),
                    this_sandbox = %here,
                    "an unpushed edit staged for another sandbox at this address is kept, not pushed here"
                );
                continue;
            }
            let Ok(path) = RemotePath::new(meta.path.0.clone()) else {
                journal.remove();
                continue;
            };
            let mut s = Staged::new(file, meta.base.clone(), meta.base_size);
            s.replay(&ops);
            if !s.is_dirty() {
                journal.remove();
                continue;
            }
            s.journal = Some(journal);
            match self.push_recovered(&path, &mut s, meta.mode).await {
                Ok(landed) => {
                    match landed {
                        Recovered::Pushed => done.pushed += 1,
                        Recovered::Conflict => done.conflicts += 1,
                    }
                    if let Some(j) = s.journal.take() {
                        j.remove();
                    }
                }
                Err(e) if !unreachable(&e) && s.complete() => {
                    // Refused for good (its directory is gone, no permission, too large): a
                    // journal kept for ever would be retried by no one and shown nowhere. The
                    // bytes go where a stop while unreachable puts them, and the log says where.
                    let saved = s.image().and_then(|mut image| {
                        write_unique(
                            &self.cfg.staging_dir.join("unpushed"),
                            &path,
                            &mut image,
                            s.len,
                        )
                    });
                    match saved {
                        Ok(copy) => {
                            tracing::error!(file = %path.display(), saved_as = %copy.display(),
                                "an unpushed edit from an earlier mount cannot be pushed ({e}); saved a copy");
                            if let Some(j) = s.journal.take() {
                                j.remove();
                            }
                        }
                        Err(io) => {
                            done.kept += 1;
                            self.failures.note_kept(path.as_bytes(), &e);
                            tracing::error!(file = %path.display(), "unpushed edit from an earlier mount still not pushed (kept): {e}; no copy either: {io}");
                        }
                    }
                }
                Err(e) => {
                    done.kept += 1;
                    self.failures.note_kept(path.as_bytes(), &e);
                    tracing::error!(file = %path.display(), "unpushed edit from an earlier mount still not pushed (kept): {e}");
                }
            }
        }
        done
    }

    async fn push_recovered(
        &self,
        path: &RemotePath,
        s: &mut Staged,
        mode: Option<u32>,
    ) -> Result<Recovered> {
        let (content, _) = s
            .content_for(true, self.sandbox.patch_new())
            .map_err(|e| local_io(&e))?;
        let r = self.note(
            self.remote()
                .commit(
                    path,
                    content,
                    CommitOptions {
                        base: s.base.clone(),
                        create_mode: mode,
                        mtime_ns: None,
                        atime_ns: None,
                    },
                )
                .await,
        );
        match r {
            Ok(_) => {
                tracing::info!(file = %path.display(), "pushed an unpushed edit left by an earlier mount");
                Ok(Recovered::Pushed)
            }
            Err(RemoteError::Conflict { .. }) | Err(RemoteError::NotFound(_)) => {
                // The sandbox changed it meanwhile: the user's bytes go beside it.
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                // A file of an earlier mount: its mode is known only if it set one.
                let mode = mode.or(s.pending_attr.mode).map_or(0o600, |m| m & 0o755);
                let (copy, _) = self.write_conflict_copy(path, s, None, mode).await?;
                tracing::error!(file = %path.display(), saved_as = %copy.display(),
                    "an unpushed edit from an earlier mount conflicts with the sandbox; saved beside it");
                self.failures.note_conflict(path, &copy);
                Ok(Recovered::Conflict)
            }
            Err(e) => Err(e),
        }
    }
}

/// Most bytes a large file's conflict copy sends of what is held locally (past it, only what
/// is unpushed).
const MAX_LOCAL_PATCH_BYTES: u64 = 64 * 1024 * 1024;
/// Names tried for one conflict copy (the first predictable, the rest random).
const CONFLICT_NAME_TRIES: u32 = 16;
/// Longest file name the sandbox's filesystems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `NAME.sbxfs-conflict-TAIL` for the file `name`: a copy of a copy is named after the
/// original (no chain of suffixes), and a long name is shortened (at a character boundary)
/// so the whole stays within [`NAME_MAX`].
fn conflict_name(name: &[u8], tail: &str) -> Vec<u8> {
    const MARK: &[u8] = b".sbxfs-conflict-";
    let base = match name.windows(MARK.len()).position(|w| w == MARK) {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    };
    let suffix_len = MARK.len() + tail.len();
    let mut keep = base.len().min(NAME_MAX.saturating_sub(suffix_len));
    if let Ok(text) = std::str::from_utf8(base) {
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
    }
    [&base[..keep], MARK, tail.as_bytes()].concat()
}

/// Where an edit left by an earlier mount went.
enum Recovered {
    Pushed,
    /// The sandbox had changed the file: the edit was saved beside it.
    Conflict,
}

/// What [`FsCore::recover_staged`] did with the edits an earlier mount left.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveredEdits {
    pub pushed: usize,
    /// Saved beside a file the sandbox had changed meanwhile.
    pub conflicts: usize,
    /// Still unpushed (kept for the next mount).
    pub kept: usize,
}

/// Write `data` at `root/path` (directories made as needed, 0700; files 0600, never
/// overwriting: `name.1`, `name.2`, … when taken). Answers the file written.
fn write_unique(
    root: &Path,
    path: &RemotePath,
    data: &mut dyn std::io::Read,
    len: u64,
) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let rel = std::ffi::OsStr::from_bytes(path.as_bytes());
    let mut target = root.join(rel);
    if let Some(parent) = target.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .or_else(|_| {
                // A file stands where a directory of the path should be: flatten the name.
                let flat = path
                    .as_bytes()
                    .iter()
                    .map(|&b| if b == b'/' { b'_' } else { b })
                    .collect::<Vec<u8>>();
                target = root.join(std::ffi::OsStr::from_bytes(&flat));
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(root)
            })?;
    }
    for n in 0..10_000u32 {
        let candidate = if n == 0 {
            target.clone()
        } else {
            let mut s = target.clone().into_os_string();
            s.push(format!(".{n}"));
            PathBuf::from(s)
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&candidate)
        {
            Ok(mut f) => {
                copy_keeping_holes(data, &mut f, len)?;
                return Ok(candidate);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free name"))
}

/// Copy `data` into `f`, leaving a hole for every block of zeros: a sparse file of gigabytes
/// (a disk image, a `truncate -s 3G` the user wrote a byte into) takes only its data's space.
fn copy_keeping_holes(
    data: &mut dyn std::io::Read,
    f: &mut std::fs::File,
    len: u64,
) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    const BLOCK: usize = 64 * 1024;
    let mut buf = vec![0u8; BLOCK];
    loop {
        let mut n = 0;
        while n < BLOCK {
            match data.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        if buf[..n].iter().all(|&b| b == 0) {
            f.seek(std::io::SeekFrom::Current(n as i64))?;
        } else {
            f.write_all(&buf[..n])?;
        }
    }
    // The image's file may end early (a hole at the end is no bytes there).
    f.set_len(len)?;
    f.flush()
}

/// `YYYYMMDD-HHMMSS` in UTC, for conflict copy names.
fn stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn conflict_names_stay_within_name_max_and_never_chain() {
        let tail = "20261206-021600-0";
        assert_eq!(
            conflict_name(b"log", tail),
            b"log.sbxfs-conflict-20261206-021600-0"
        );
        // A conflict on a copy (the node became it) is named after the original.
        assert_eq!(
            conflict_name(b"log.sbxfs-conflict-20261206-020000-0", tail),
            b"log.sbxfs-conflict-20261206-021600-0"
        );
        let long = "é".repeat(120); // 240 bytes
        let n = conflict_name(long.as_bytes(), tail);
        assert!(n.len() <= NAME_MAX, "{}", n.len());
        assert!(std::str::from_utf8(&n).is_ok(), "cut inside a character");
        assert!(n.ends_with(b".sbxfs-conflict-20261206-021600-0"));
        let bytes = vec![0xffu8; 255];
        assert_eq!(conflict_name(&bytes, tail).len(), NAME_MAX);
    }

    #[test]
    fn saved_copies_never_collide_or_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let a = RemotePath::new(b"a/b.txt".to_vec()).unwrap();
        let b = RemotePath::new(b"a%2Fb.txt".to_vec()).unwrap();
        let p1 = write_unique(dir.path(), &a, &mut &b"one"[..], 3).unwrap();
        let p2 = write_unique(dir.path(), &b, &mut &b"two"[..], 3).unwrap();
        let p3 = write_unique(dir.path(), &a, &mut &b"three"[..], 5).unwrap();
        assert_ne!(p1, p2);
        assert_ne!(p1, p3);
        assert_eq!(std::fs::read(&p1).unwrap(), b"one");
        assert_eq!(std::fs::read(&p2).unwrap(), b"two");
        assert_eq!(std::fs::read(&p3).unwrap(), b"three");
        // Deep paths are directories, not one long name.
        let deep: Vec<u8> = (0..15)
            .flat_map(|i| format!("d{i:03}{}/", "x".repeat(200)).into_bytes())
            .chain(*b"f")
            .collect();
        let deep = RemotePath::new(deep).unwrap();
        let p4 = write_unique(dir.path(), &deep, &mut &b"deep"[..], 4).unwrap();
        assert_eq!(std::fs::read(p4).unwrap(), b"deep");
    }

    #[test]
    fn failures_are_classified_and_reported_once() {
        let f = Failures::default();
        f.record(NodeId(3), "x", &RemoteError::Transport("down".into()));
        assert!(!f.list()[0].permanent);
        assert!(f.take_report(NodeId(3)).is_err());
        assert!(f.take_report(NodeId(3)).is_ok(), "reported once");
        f.record(NodeId(4), "y", &RemoteError::NoSpace("full".into()));
        assert!(f.list().iter().any(|x| x.path == "y" && x.permanent));
        assert!(f.due().is_empty(), "nothing due at once, permanent never");
    }

    /// A core over `memory`, attributes trusted for ten minutes, and its staging directory.
    async fn core_over(
        memory: &crate::remote::memory::MemoryRemote,
    ) -> (Arc<FsCore>, tempfile::TempDir) {
        use crate::remote::Remote;
        let root = memory.stat(&RemotePath::root()).await.unwrap();
        let staging = tempfile::tempdir().unwrap();
        let core = FsCore::new(
            Arc::new(memory.clone()),
            crate::mount::core::CoreConfig {
                attr_ttl: Duration::from_secs(600),
                cache_bytes: 1 << 20,
                staging_dir: staging.path().to_path_buf(),
                tree_max: 0,
                clock: Default::default(),
            },
            root,
        );
        (core, staging)
    }

    /// `open(O_CREAT)` and `close()` with nothing written, under `-o sync_close`: the file is
    /// in the sandbox when close returns, before the RELEASE that follows it.
    #[tokio::test]
    async fn with_sync_close_a_file_made_here_is_in_the_sandbox_at_its_first_close() {
        use crate::mount::inode::ROOT;
        use crate::remote::memory::MemoryRemote;
        let memory = MemoryRemote::new();
        let (core, _staging) = core_over(&memory).await;
        core.set_sync_close(true);
        // The kernel looks the name up (absent) right before it creates it: made here.
        assert!(core.lookup(ROOT, b"m").await.is_err());
        let (made, fh) = core.create(ROOT, b"m", 0o666, true, false).await.unwrap();
        assert!(!memory.sandbox().exists("m"), "made here, not pushed yet");
        core.flush(fh).await.unwrap();
        assert!(memory.sandbox().exists("m"), "in the sandbox at close");
        assert_eq!(memory.sandbox().read("m").unwrap(), b"");
        core.release(fh).await.unwrap();
        assert_eq!(core.getattr(made.node).await.unwrap().attr.size, 0);
        // A second descriptor's close with nothing written pushes nothing more.
        let commits = core.stats.commits.load(Ordering::Relaxed);
        let (fh, _) = core.open(made.node, true, false).await.unwrap();
        core.flush(fh).await.unwrap();
        core.release(fh).await.unwrap();
        assert_eq!(core.stats.commits.load(Ordering::Relaxed), commits);
    }

    /// A transport whose info says `patch_commits: false` (the memory sandbox set so refuses
    /// patches) gets whole files: a write into the middle of a large file, most of it never
    /// read here, lands whole and right.
    #[tokio::test]
    async fn without_patch_commits_a_push_sends_the_whole_file() {
        use crate::remote::memory::MemoryRemote;
        use crate::remote::{Capabilities, Remote};
        let memory = MemoryRemote::new();
        let base: Vec<u8> = (0..3 * PAGE as usize + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        memory.sandbox().write("big", &base).unwrap();
        let caps = Capabilities {
            patch_commits: false,
            ..Default::default()
        };
        memory.set_capabilities(caps);
        assert_eq!(memory.info().await.unwrap().capabilities, caps);
        let (core, _staging) = core_over(&memory).await;
        core.set_patch_commits(false);
        core.set_sync_close(true);
        let node = core
            .lookup(crate::mount::inode::ROOT, b"big")
            .await
            .unwrap()
            .node;
        let (fh, _) = core.open(node, true, false).await.unwrap();
        let at = PAGE + 10;
        core.write(fh, at, b"HELLO").await.unwrap();
        core.flush(fh).await.unwrap();
        core.release(fh).await.unwrap();
        let mut want = base.clone();
        want[at as usize..at as usize + 5].copy_from_slice(b"HELLO");
        let got = memory.sandbox().read("big").unwrap();
        assert!(got == want, "the sandbox's file is not the written one");
    }
}
