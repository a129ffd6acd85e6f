//! The echo thread's work ([`crate::mount::echo`]): each sandbox-side change repeated on the
//! mountpoint so the kernel raises its inotify events, and the answers the filesystem gives
//! that thread's requests — from the caches alone, changing no file.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{FsCore, NodeAttr};
use crate::mount::echo::{Echoes, Job, Name, Planned};
use crate::mount::inode::{NodeId, ROOT};
use crate::remote::{FileKind, RemoteError, RemotePath, Result};

/// A name whose directory the kernel holds: (directory, name).
type Held = (NodeId, Vec<u8>);

impl FsCore {
    pub(in crate::mount) fn echoes(&self) -> &Echoes {
        &self.echoes
    }

    /// Whether the kernel holds the node (so a watch may be on it).
    fn kernel_holds(&self, node: NodeId) -> bool {
        node == ROOT || self.inodes.get(node).is_some_and(|n| n.lookups > 0)
    }

    /// `path`'s directory and name, if the kernel holds that directory.
    fn held(&self, path: &RemotePath) -> Option<Held> {
        let (dir, name) = path.split_last()?;
        let parent = self.inodes.resolve(&dir)?;
        // A directory still (the sandbox may have put a symlink in its place: the kernel
        // would follow it to another directory's names).
        let is_dir = self
            .inodes
            .get(parent)
            .is_some_and(|n| n.attr.kind == FileKind::Dir);
        (is_dir && self.kernel_holds(parent)).then(|| (parent, name.to_vec()))
    }

    /// The node a change reported at `path` concerns, held (one lookup reference) before
    /// the caches forget the name, for its echo.
    pub(in crate::mount) fn hold_node_at(&self, path: &RemotePath) -> Option<NodeId> {
        if let Some(node) = self.inodes.resolve(path) {
            self.inodes.looked_up(node);
            return Some(node);
        }
        // A name only its directory's listing knows (listed, never looked up: `fs.watch`
        // reads no entry): a node made from that entry, for the kernel to remove.
        let (dir, name) = path.split_last()?;
        let parent = self
            .inodes
            .resolve(&dir)
            .filter(|p| self.kernel_holds(*p))?;
        let attr = self.meta.entry(parent, name, self.ttl(), true)??;
        Some(self.inodes.remember(parent, name, attr, true, None))
    }

    /// What is cached for `path`: its file, data version, size, and change time (a change of
    /// attributes only moves the last).
    pub(in crate::mount) fn content_at(
        &self,
        path: &RemotePath,
    ) -> Option<(u64, String, u64, i64)> {
        let n = self.inodes.get(self.inodes.resolve(path)?)?;
        Some((n.attr.ino, n.attr.version.0, n.attr.size, n.attr.ctime_ns))
    }

    /// A job not echoed (the mountpoint is not this mount any more): its node reference goes.
    pub(in crate::mount) fn echo_dropped(&self, job: Job) {
        if let Job::Removed(_, node) | Job::Renamed(_, _, node) = job {
            self.give_back(node);
        }
        self.echoes
            .stats
            .skipped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn give_back(&self, node: Option<NodeId>) {
        if let Some(node) = node {
            self.forget(node, 1);
        }
    }

    /// Repeat one change on the mountpoint `mnt` (on the echo thread; `rt` runs the lookups
    /// that learn a new name's node, `kernel` drops a name the kernel must ask about again).
    pub(in crate::mount) fn echo(
        &self,
        job: Job,
        mnt: &Path,
        kernel: &fuser::Notifier,
        rt: &tokio::runtime::Handle,
    ) {
        let at = |p: &RemotePath| -> PathBuf { mnt.join(OsStr::from_bytes(p.as_bytes())) };
        let forget_name = |(parent, name): &Held| {
            let _ = kernel.inval_entry(fuser::INodeNo(parent.0), OsStr::from_bytes(name));
        };
        // A node learnt here holds one lookup reference, which the kernel takes over if its
        // request is answered with it ([`Echoes::planned`]) and is given back otherwise.
        let learn = |(parent, name): &Held| -> Option<NodeAttr> {
            rt.block_on(self.lookup(*parent, name)).ok()
        };
        // A removed or renamed name's node: held since the change was reported (the
        // reference [`Self::hold_node_at`] took), so the kernel's forgetting it meanwhile
        // did not drop it; that reference is the plan's.
        let hold = |node: Option<NodeId>| node.and_then(|n| self.echo_attr(n).ok());
        for node in self.echoes.released() {
            self.forget(node, 1);
        }
        let job = self.settled(job, rt);
        tracing::debug!(?job, "echoing a sandbox-side change");
        if let Some(job) = &job {
            self.echoes.publish(job);
        }
        let Some(job) = job else { return };
        // A move that cannot be repeated here: raised as the creation of its new name.
        let mut made_instead = None;
        let done: Option<std::io::Result<()>> = match job {
            Job::Created(path) => self.held(&path).and_then(|h| {
                let na = learn(&h)?;
                forget_name(&h);
                let (parent, name) = h;
                self.echoes
                    .set_plan(vec![(parent, name, Name::ToMake(na.node))]);
                let made = make(&at(&path), na.attr.kind, na.attr.size);
                if made.is_ok() && na.attr.kind == FileKind::File {
                    self.echoes.note_made(&path, na.attr.version.clone());
                }
                Some(made)
            }),
            Job::Modified(path) => self.held(&path).and_then(|h| {
                let na = learn(&h)?;
                let (parent, name) = h;
                self.echoes
                    .set_plan(vec![(parent, name, Name::Present(na.node))]);
                // A file with staged writes: the local writer's events were raised, and
                // the sandbox's change meets its push.
                if na.attr.kind != FileKind::File || self.staged_of(na.node).is_some() {
                    return None;
                }
                // Its creation was echoed with this very content (a file written right
                // after it was made): raised once, as a local writer's would be.
                if self.echoes.made_as(&path, &na.attr.version) {
                    return None;
                }
                Some(modify(&at(&path), na.attr.size))
            }),
            Job::Removed(path, node) => match (self.held(&path), hold(node)) {
                (Some((parent, name)), Some(na)) => {
                    self.echoes
                        .set_plan(vec![(parent, name, Name::Present(na.node))]);
                    Some(match na.attr.kind {
                        FileKind::Dir => std::fs::remove_dir(at(&path)),
                        _ => std::fs::remove_file(at(&path)),
                    })
                }
                _ => {
                    self.give_back(node);
                    None
                }
            },
            Job::Renamed(from, to, node) => match (self.held(&from), self.held(&to), hold(node)) {
                // The file now at the new name is not the one the old name leads to here: not
                // a move of it (an exchange made here is reported as two renames, nobody's;
                // the table already shows it). Nothing to raise.
                (Some(h1), Some(h2), Some(na)) if !self.moved_there(na.node, &to, rt) => {
                    // Both names lead elsewhere now: the kernel asks for each again (it kept
                    // `x` as the file the sandbox swapped away, and an open of `x` reached
                    // that file, wherever it went).
                    forget_name(&h1);
                    forget_name(&h2);
                    self.give_back(node);
                    None
                }
                // The move of a file the mount shows, or of a name it never saw (an editor's
                // temp file) over one it shows: the file now at the new name stands for it,
                // so the move is raised as a local save's would be (and the old file's own
                // watch sees it replaced). A move that cannot be repeated here (a name never
                // shown at all, made and moved at once, its creation settled to nothing) is
                // raised as the creation of its new name.
                (Some((p1, n1)), Some(h2), held) => {
                    let na = match held {
                        Some(na) => {
                            forget_name(&h2);
                            Some(na)
                        }
                        None => learn(&h2),
                    };
                    match na {
                        None => {
                            made_instead = Some(to);
                            None
                        }
                        Some(na) => {
                            let (p2, n2) = h2;
                            self.echoes.set_plan(vec![
                                (p1, n1, Name::Present(na.node)),
                                (p2, n2, Name::Absent),
                            ]);
                            match std::fs::rename(at(&from), at(&to)) {
                                Err(e) => {
                                    tracing::debug!("the move could not be echoed ({e}): its new name is raised as created");
                                    made_instead = Some(to);
                                    None
                                }
                                r => Some(r),
                            }
                        }
                    }
                }
                (Some(_), None, _) => return self.echo(Job::Removed(from, node), mnt, kernel, rt),
                (_, Some(_), _) => {
                    self.give_back(node);
                    return self.echo(Job::Created(to), mnt, kernel, rt);
                }
                _ => {
                    self.give_back(node);
                    None
                }
            },
            Job::Touched(path) if path.is_root() => Some(touch(mnt)),
            Job::Touched(path) => match (self.held(&path), self.hold_node_at(&path)) {
                (Some((parent, name)), Some(node)) => {
                    self.echoes
                        .set_plan(vec![(parent, name, Name::Present(node))]);
                    Some(touch(&at(&path)))
                }
                (_, node) => {
                    self.give_back(node);
                    None
                }
            },
        };
        for node in self.echoes.end_plan() {
            self.forget(node, 1);
        }
        if let Some(to) = made_instead {
            return self.echo(Job::Created(to), mnt, kernel, rt);
        }
        let stats = &self.echoes.stats;
        let counter = match done {
            None => {
                tracing::debug!("not echoed: nobody holds its directory, or its node is gone");
                &stats.skipped
            }
            Some(Ok(())) => &stats.echoed,
            Some(Err(e)) => {
                tracing::debug!("a sandbox-side change could not be echoed: {e}");
                &stats.failed
            }
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A change as the sandbox has it now (reports of a name removed and made again may
    /// arrive in either order, and a burst merges them): a removal of a name that is there
    /// again is its re-creation, and a creation of one gone again is nothing.
    fn settled(&self, job: Job, rt: &tokio::runtime::Handle) -> Option<Job> {
        let there = |p: &RemotePath| {
            !matches!(
                rt.block_on(self.remote().stat(p)),
                Err(RemoteError::NotFound(_))
            )
        };
        match job {
            Job::Removed(path, node) if there(&path) => {
                self.give_back(node);
                Some(Job::Created(path))
            }
            Job::Created(path) if !there(&path) => None,
            job => Some(job),
        }
    }

    /// The echo thread's lookup (`making`: false) or create (true) of `name` in `parent`:
    /// as planned, else a name the caches hold, else absent. Never a remote call.
    pub(in crate::mount) fn echo_entry(
        &self,
        parent: NodeId,
        name: &[u8],
        making: bool,
    ) -> Result<NodeAttr> {
        let absent = || RemoteError::NotFound(String::from_utf8_lossy(name).into_owned());
        // A planned name that leads to another file here now (git's next `index.lock`, made
        // here while the sandbox's rename of its own was being echoed): answered absent. The
        // kernel would keep the planned node for that name, and the local program's own
        // rename of it would then be a rename of a file over itself, which the kernel
        // completes without asking: its lock file left in the sandbox.
        if let (false, Some(Name::Present(planned))) = (making, self.echoes.peek(parent, name)) {
            if self
                .inodes
                .child(parent, name)
                .is_some_and(|n| n != planned)
            {
                return Err(absent());
            }
        }
        let node = match self.echoes.planned(parent, name, making) {
            Planned::Node { node, counted } => {
                if !counted {
                    self.inodes.looked_up(node);
                }
                node
            }
            Planned::Absent => return Err(absent()),
            Planned::No if making => {
                return Err(RemoteError::Perm(
                    "the echo thread makes only what it planned".into(),
                ))
            }
            // A directory on the way to a planned name; nothing else (a symlink put in a
            // directory's place would lead the walk elsewhere).
            Planned::No => {
                let node = self
                    .inodes
                    .child(parent, name)
                    .filter(|n| {
                        self.inodes
                            .get(*n)
                            .is_some_and(|n| n.attr.kind == FileKind::Dir)
                    })
                    .ok_or_else(absent)?;
                self.inodes.looked_up(node);
                node
            }
        };
        self.echo_attr(node)
    }

    /// Is the sandbox's file at `to` the one `node` stands for?
    fn moved_there(&self, node: NodeId, to: &RemotePath, rt: &tokio::runtime::Handle) -> bool {
        let Some(n) = self.inodes.get(node) else {
            return false;
        };
        match rt.block_on(self.remote().stat(to)) {
            Ok(a) => crate::mount::inode::RemoteId::of(&a) == n.remote,
            Err(_) => false,
        }
    }

    /// A node's attributes as cached, for the echo thread (its getattr and setattr).
    pub(in crate::mount) fn echo_attr(&self, node: NodeId) -> Result<NodeAttr> {
        let n = self.node(node)?;
        Ok(NodeAttr {
            node,
            attr: self.with_staged(node, n.attr),
        })
    }

    /// Whether the echo thread may remove or move `name` in `parent`: only a planned name.
    /// The name must still lead to the planned node: a file the mount made at that name
    /// since the sandbox's change (git's next `index.lock`, made here right after the
    /// sandbox's git renamed its own away) is not the sandbox's to move or remove.
    pub(in crate::mount) fn echo_may_change(&self, parent: NodeId, name: &[u8]) -> bool {
        match self.echoes.peek(parent, name) {
            Some(Name::Present(node)) => self.inodes.child(parent, name) == Some(node),
            _ => false,
        }
    }

    /// The echo thread renamed a name the sandbox renamed: the table follows, if the name
    /// still leads where it did.
    pub(in crate::mount) fn echo_renamed(
        &self,
        (p1, n1): (NodeId, &[u8]),
        (p2, n2): (NodeId, &[u8]),
    ) {
        if self.echo_may_change(p1, n1) {
            self.inodes.rename(p1, n1, p2, n2);
        }
    }
}

/// The create that raises `IN_CREATE` for a name of this kind; a file with content also
/// `IN_MODIFY` (a truncate to its size) before its `IN_CLOSE_WRITE`, as its writer raised.
fn make(path: &Path, kind: FileKind, size: u64) -> std::io::Result<()> {
    match kind {
        FileKind::Dir => std::fs::create_dir(path),
        FileKind::Symlink => std::os::unix::fs::symlink("echo", path),
        FileKind::File => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)?;
            if size > 0 {
                f.set_len(size)?;
            }
            Ok(())
        }
        _ => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
    }
}

/// `IN_MODIFY` (a truncate to the size it has) and `IN_CLOSE_WRITE`.
fn modify(path: &Path, size: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    f.set_len(size)
}

/// `IN_ATTRIB`: the name's times set to now (answered with the times it has). Never through
/// a symlink: the sandbox chooses its target, which the kernel would resolve on this machine.
fn touch(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a valid C string; NULL times means now.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            std::ptr::null(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
