//! The gated filesystem: what the FUSE adapter ([`super::fuse`]) calls. Each operation takes
//! who asks ([`Caller`]) and the decoded arguments, runs the permission gate ([`super::gate`])
//! and then the core, and returns what the reply needs: attributes as shown (owners mapped,
//! the right `st_ino`), with the TTLs the kernel may keep them for. So the gate, the TTL and
//! the owner policy are reachable from unit and model tests without a kernel, and the adapter
//! only decodes, calls one method here, and replies.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

use super::access::{self, XattrUse};
use super::core::{FsCore, KernelPages, NodeAttr};
use super::gate::{Caller, Gate, Owners};
use super::handles::DirEntryOut;
use super::inode::NodeId;
use crate::remote::{FileKind, RemoteError, RenameMode, Result, SpecialKind, StatFs, XattrFlags};

/// A name's entry: our node id in `attr.ino`, so its attributes are valid for no time (the
/// kernel asks GETATTR before the next `stat`, and that answer carries the sandbox's inode
/// number); the name itself is kept for `entry_ttl`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub attr: FileAttr,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
}

/// A GETATTR/SETATTR answer: `st_ino` is the sandbox's.
#[derive(Clone, Debug)]
pub struct Attributes {
    pub attr: FileAttr,
    pub ttl: Duration,
}

/// An open file or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// What the kernel may do with the file's cached pages.
    pub pages: KernelPages,
}

/// A file made and opened by CREATE.
#[derive(Clone, Debug)]
pub struct Created {
    pub entry: Entry,
    pub fh: u64,
    /// Whose kernel attributes to drop once the reply is out ([`GatedFs::created_replied`]).
    pub node: NodeId,
}

/// A directory listing from an offset on; the kernel takes as many names as fit its buffer.
pub struct Listing {
    entries: Arc<Vec<DirEntryOut>>,
    from: usize,
}

impl Listing {
    /// Each name with its node, kind, and the offset the kernel passes back to continue
    /// after it.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, FileType, &[u8])> {
        self.entries
            .iter()
            .enumerate()
            .skip(self.from)
            .map(|(i, e)| (e.ino, (i + 1) as u64, file_type(e.kind), e.name.as_slice()))
    }
}

/// A SETATTR's decoded fields.
#[derive(Clone, Debug, Default)]
pub struct SetAttrs {
    pub fh: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

/// What the INFO and QUERY ioctls report about this mount.
#[derive(Clone, Debug, Default)]
pub struct MountLabel {
    pub mountpoint: String,
    pub socket: String,
    pub remote: String,
}

pub struct GatedFs {
    core: Arc<FsCore>,
    owners: Arc<Owners>,
    /// Other users may use the mount (`allow_other`).
    allow_other: bool,
    label: MountLabel,
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: TimeOrNow, now: i64) -> i64 {
    match t {
        TimeOrNow::Now => now,
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        },
    }
}

pub fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File | FileKind::Other => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

impl GatedFs {
    pub fn new(
        core: Arc<FsCore>,
        owners: Arc<Owners>,
        allow_other: bool,
        label: MountLabel,
    ) -> GatedFs {
        GatedFs {
            core,
            owners,
            allow_other,
            label,
        }
    }

    /// Who is asking, as the permission checks see them.
    pub fn caller(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        self.owners.caller(uid, gid, pid)
    }

    fn gate<'a>(&'a self, caller: &'a Caller) -> Gate<'a> {
        Gate {
            core: &self.core,
            owners: &self.owners,
            caller,
        }
    }

    /// Long while the change feed vouches for the caches ([`super::feed`]), else the TTL.
    pub fn attr_ttl(&self) -> Duration {
        self.core.ttl()
    }

    /// How long the kernel may reuse a name's lookup without asking again
    /// ([`FsCore::entry_ttl`]). With the daemon checking and other users in, every path walk
    /// must reach it: the kernel reuses a cached name without checking search permission on
    /// its directory.
    pub fn entry_ttl(&self) -> Duration {
        if self.owners.checks && self.allow_other {
            Duration::ZERO
        } else {
            self.core.entry_ttl()
        }
    }

    /// Attributes as the kernel sees them, with `ino` as given.
    fn shown(&self, na: &NodeAttr, ino: u64) -> FileAttr {
        let a = &na.attr;
        let (uid, gid) = self.owners.shown(a.uid, a.gid);
        FileAttr {
            ino: INodeNo(ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: time(a.atime_ns),
            mtime: time(a.mtime_ns),
            ctime: time(a.ctime_ns),
            crtime: time(a.ctime_ns),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink.min(u32::MAX as u64) as u32,
            uid,
            gid,
            rdev: a.rdev as u32,
            blksize: 128 * 1024,
            flags: 0,
        }
    }

    fn entry(&self, na: &NodeAttr) -> Entry {
        Entry {
            attr: self.shown(na, na.node.0),
            attr_ttl: Duration::ZERO,
            entry_ttl: self.entry_ttl(),
        }
    }

    fn attributes(&self, na: &NodeAttr) -> Attributes {
        Attributes {
            attr: self.shown(na, na.attr.ino),
            ttl: self.attr_ttl(),
        }
    }

    pub async fn lookup(&self, caller: &Caller, parent: NodeId, name: &[u8]) -> Result<Entry> {
        self.gate(caller).lookup(parent).await?;
        Ok(self.entry(&self.core.lookup(parent, name).await?))
    }

    /// Whether a request comes from the echo thread ([`super::echo`]); such requests are
    /// answered by the `echo_*` methods, from the caches alone.
    pub fn is_echo(&self, pid: u32) -> bool {
        self.core.echoes().is_echo(pid)
    }

    /// The echo thread's lookup (`making`: false) or create, mkdir, symlink (true).
    pub fn echo_entry(&self, parent: NodeId, name: &[u8], making: bool) -> Result<Entry> {
        // Kept for the configured TTL only, however long the feed lets other names live: the
        // echo makes names from the caches, a step behind the sandbox.
        Ok(Entry {
            entry_ttl: self.entry_ttl().min(self.core.config().attr_ttl),
            ..self.entry(&self.core.echo_entry(parent, name, making)?)
        })
    }

    /// The echo thread's getattr or setattr: the attributes as cached, nothing set.
    pub fn echo_attributes(&self, node: NodeId) -> Result<Attributes> {
        // Valid for no time: the kernel must not keep what the caches had for the echo (a
        // directory's link count may be due for a refetch).
        Ok(Attributes {
            ttl: Duration::ZERO,
            ..self.attributes(&self.core.echo_attr(node)?)
        })
    }

    /// Whether the echo thread's unlink, rmdir or rename of the name is one it planned.
    pub fn echo_may_change(&self, parent: NodeId, name: &[u8]) -> bool {
        self.core.echo_may_change(parent, name)
    }

    /// The echo thread renamed what the sandbox renamed.
    pub fn echo_renamed(&self, from: (NodeId, &[u8]), to: (NodeId, &[u8])) {
        self.core.echo_renamed(from, to);
    }

    /// One more request of this type from the kernel (`ctl stats`).
    pub fn count_request(&self, op: &'static str) {
        self.core.stats.kernel_requests.count(op);
    }

    pub fn forget(&self, node: NodeId, nlookup: u64) {
        self.core.forget(node, nlookup);
    }

    pub async fn getattr(&self, node: NodeId) -> Result<Attributes> {
        Ok(self.attributes(&self.core.getattr(node).await?))
    }

    pub async fn setattr(
        &self,
        caller: &Caller,
        node: NodeId,
        set: SetAttrs,
    ) -> Result<Attributes> {
        let now = self.core.now_ns();
        let explicit_times = [set.atime, set.mtime]
            .iter()
            .flatten()
            .any(|t| matches!(t, TimeOrNow::SpecificTime(_)));
        let times = (set.atime.is_some() || set.mtime.is_some()).then_some(explicit_times);
        // The mounting user acts as the sandbox's user: its chown is in the sandbox's numbers
        // once mapped; anyone else's is checked in the numbers they see.
        let (to_uid, to_gid) = self.owners.to_sandbox(set.uid, set.gid);
        let (ask_uid, ask_gid) = match caller {
            Caller::Checked { raw: true, .. } => (to_uid, to_gid),
            _ => (set.uid, set.gid),
        };
        let mode = self
            .gate(caller)
            .setattr(
                node,
                set.mode.map(|m| m & 0o7777),
                ask_uid,
                ask_gid,
                set.size.is_some() && set.fh.is_none(),
                times,
            )
            .await?;
        let na = self
            .core
            .setattr(
                node,
                set.fh,
                mode,
                (to_uid, to_gid),
                set.size,
                set.atime.map(|t| time_ns(t, now)),
                set.mtime.map(|t| time_ns(t, now)),
            )
            .await?;
        if na.attr.kind == FileKind::Dir
            && (mode.is_some() || set.uid.is_some() || set.gid.is_some())
        {
            // Who may search it changed: names the kernel keeps below it would skip the check.
            self.core.forget_kernel_entries_in(node);
        }
        Ok(self.attributes(&na))
    }

    pub async fn readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        self.core.readlink(node).await
    }

    pub async fn mkdir(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &[u8],
        mode: u32,
    ) -> Result<Entry> {
        self.add(caller, parent, || self.core.mkdir(parent, name, mode))
            .await
    }

    /// A new name in `parent`, made by `make` once the caller may add one there, and given
    /// to the caller where the agent may give files away ([`Gate::new_owner`]).
    async fn add<F>(
        &self,
        caller: &Caller,
        parent: NodeId,
        make: impl FnOnce() -> F,
    ) -> Result<Entry>
    where
        F: std::future::Future<Output = Result<NodeAttr>>,
    {
        let gate = self.gate(caller);
        gate.add(parent).await?;
        let owner = gate.new_owner(parent).await;
        let made = make().await?;
        Ok(self.entry(&self.core.give_to(made, owner).await?))
    }

    /// MKNOD: a special file of the kind `mode` names, or a regular file (made, not opened).
    pub async fn mknod(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => Some(SpecialKind::Fifo),
            libc::S_IFSOCK => Some(SpecialKind::Socket),
            libc::S_IFCHR => Some(SpecialKind::CharDevice),
            libc::S_IFBLK => Some(SpecialKind::BlockDevice),
            _ => None,
        };
        let perm = mode & !umask & 0o7777;
        self.add(caller, parent, || async move {
            match kind {
                Some(k) => {
                    self.core
                        .mknod(parent, name, k, perm, u64::from(rdev))
                        .await
                }
                None => self.core.make_file(parent, name, perm).await,
            }
        })
        .await
    }

    pub async fn unlink(&self, caller: &Caller, parent: NodeId, name: &[u8]) -> Result<()> {
        self.gate(caller).delete(parent, name).await?;
        self.core.unlink(parent, name).await
    }

    pub async fn rmdir(&self, caller: &Caller, parent: NodeId, name: &[u8]) -> Result<()> {
        self.gate(caller).delete(parent, name).await?;
        self.core.rmdir(parent, name).await
    }

    pub async fn symlink(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &[u8],
        target: &[u8],
    ) -> Result<Entry> {
        self.add(caller, parent, || self.core.symlink(parent, name, target))
            .await
    }

    pub async fn rename(
        &self,
        caller: &Caller,
        (from, name): (NodeId, &[u8]),
        (to, newname): (NodeId, &[u8]),
        mode: RenameMode,
    ) -> Result<()> {
        self.gate(caller)
            .rename(from, name, to, newname, mode == RenameMode::Exchange)
            .await?;
        self.core.rename(from, name, to, newname, mode).await
    }

    pub async fn link(
        &self,
        caller: &Caller,
        node: NodeId,
        parent: NodeId,
        name: &[u8],
    ) -> Result<Entry> {
        self.gate(caller).link(node, parent).await?;
        Ok(self.entry(&self.core.link(node, parent, name).await?))
    }

    /// OPEN with the open(2) flags.
    pub async fn open(&self, caller: &Caller, node: NodeId, flags: i32) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let truncate = flags & libc::O_TRUNC != 0;
        self.gate(caller).open(node, flags).await?;
        let (fh, pages) = self.core.open(node, writable, truncate).await?;
        Ok(Opened { fh, pages })
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.core.read(fh, offset, size).await
    }

    /// WRITE from thread `tid`.
    pub async fn write(&self, fh: u64, offset: u64, data: &[u8], tid: u32) -> Result<u32> {
        self.core.written_by(fh, tid);
        self.core.write(fh, offset, data).await
    }

    /// FLUSH (a `close` of one descriptor) from thread `tid`: a process that never wrote
    /// through the handle publishes nothing ([`FsCore::closed_by_a_writer`]).
    pub async fn flush(&self, fh: u64, tid: u32) -> Result<()> {
        if !self.core.closed_by_a_writer(fh, tid) {
            return Ok(());
        }
        self.core.flush(fh).await
    }

    /// RELEASE cannot report an error to close(): a failed push is kept, retried, and
    /// reported by the file's next fsync/close and in `ctl status`.
    pub async fn release(&self, fh: u64) {
        let _ = self.core.release(fh).await;
    }

    pub async fn fsync(&self, fh: u64) -> Result<()> {
        self.core.fsync(fh).await
    }

    pub async fn opendir(&self, caller: &Caller, node: NodeId) -> Result<Opened> {
        self.gate(caller).may(node, access::READ).await?;
        let (fh, pages) = self.core.opendir(node)?;
        Ok(Opened { fh, pages })
    }

    pub fn releasedir(&self, fh: u64) {
        self.core.releasedir(fh);
    }

    pub async fn readdir(&self, fh: u64, offset: u64) -> Result<Listing> {
        Ok(Listing {
            entries: self.core.readdir(fh, offset).await?,
            from: offset as usize,
        })
    }

    /// ACCESS with the access(2) mask; existence (F_OK) is settled by the lookup that found
    /// the node.
    pub async fn access(&self, caller: &Caller, node: NodeId, mask: u32) -> Result<()> {
        let want = mask & (access::READ | access::WRITE | access::EXEC);
        self.gate(caller).access(node, want).await
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        self.core.statfs().await
    }

    pub async fn setxattr(
        &self,
        caller: &Caller,
        node: NodeId,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let flags = XattrFlags {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        self.gate(caller).xattr(node, name, XattrUse::Set).await?;
        // `cp -a` sets every file's access ACL, most often a minimal one: a chmod by other
        // means. On a file known to hold no ACL it is one (a new file's then rides its first
        // push, instead of a push, a setxattr and a setattr of its times, each waited for).
        if name == access::ACL_ACCESS {
            if let (Some(bits), Some(attr)) = (
                access::minimal_acl_mode(value),
                self.core.attr_without_xattrs(node),
            ) {
                let set = SetAttrs {
                    mode: Some(attr.mode & 0o7000 | bits),
                    ..SetAttrs::default()
                };
                let r = self.setattr(caller, node, set).await.map(|_| ());
                // The kernel took no attributes from this reply, as it does from a chmod's.
                self.core.invalidate_kernel_attr(node);
                return r;
            }
        }
        self.core.setxattr(node, name, value, flags).await
    }

    /// GETXATTR answered at once from trusted attributes (`ls -l` asks each file for its
    /// security label and ACL: two requests per name); `None`: [`Self::getxattr`] must ask.
    pub fn getxattr_at_once(
        &self,
        caller: &Caller,
        node: NodeId,
        name: &[u8],
    ) -> Option<Result<Vec<u8>>> {
        let absent = || RemoteError::NoAttr(String::from_utf8_lossy(name).into());
        // The kernel asks for file capabilities before every write (to drop them). The mount
        // is nosuid, so capabilities never apply: answered here, not by a round trip per write.
        if name == b"security.capability" {
            return Some(Err(absent()));
        }
        match self.gate(caller).xattr_known(node, name, XattrUse::Get)? {
            Err(e) => Some(Err(e)),
            Ok(_) => Some(Err(absent())),
        }
    }

    pub async fn getxattr(&self, caller: &Caller, node: NodeId, name: &[u8]) -> Result<Vec<u8>> {
        if let Some(answer) = self.getxattr_at_once(caller, node, name) {
            return answer;
        }
        let absent = || RemoteError::NoAttr(String::from_utf8_lossy(name).into());
        if !self.gate(caller).xattr(node, name, XattrUse::Get).await? {
            return Err(absent());
        }
        self.core.getxattr(node, name).await
    }

    /// The names the caller may see, each ended by a NUL (the listxattr(2) format).
    pub async fn listxattr(&self, caller: &Caller, node: NodeId) -> Result<Vec<u8>> {
        let gate = self.gate(caller);
        let names = self.core.listxattr(node).await?;
        let mut out = Vec::new();
        for n in names.into_iter().filter(|n| gate.lists_xattr(n)) {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub async fn removexattr(&self, caller: &Caller, node: NodeId, name: &[u8]) -> Result<()> {
        self.gate(caller).xattr(node, name, XattrUse::Set).await?;
        // Removing an ACL a file does not have succeeds, as on a local disk (`cp -a` removes
        // every directory's default ACL).
        if (name == access::ACL_ACCESS || name == access::ACL_DEFAULT)
            && self.core.attr_without_xattrs(node).is_some()
        {
            return Ok(());
        }
        self.core.removexattr(node, name).await
    }

    /// FALLOCATE: reserving space only. Punching holes and the like change content, which is
    /// not done in place in the sandbox.
    pub async fn fallocate(
        &self,
        node: NodeId,
        fh: u64,
        (offset, length): (u64, u64),
        mode: i32,
    ) -> Result<()> {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(RemoteError::Unsupported(format!(
                "fallocate mode {mode:#x}"
            )));
        }
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        self.core
            .fallocate(node, Some(fh), offset, length, keep_size)
            .await
    }

    pub async fn copy_file_range(
        &self,
        (fh_in, offset_in): (u64, u64),
        (fh_out, offset_out): (u64, u64),
        len: u64,
    ) -> Result<u32> {
        let n = self
            .core
            .copy_range(fh_in, offset_in, fh_out, offset_out, len)
            .await?;
        Ok(n.min(u32::MAX as u64) as u32)
    }

    /// CREATE with the open(2) flags. The file is given to the caller only if this call made
    /// it: an existing file opened with O_CREAT (one that appeared since the lookup, too)
    /// keeps its owner.
    pub async fn create(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &[u8],
        (mode, umask): (u32, u32),
        flags: i32,
    ) -> Result<Created> {
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let gate = self.gate(caller);
        gate.create(parent, name, exclusive, flags).await?;
        let owner = gate.new_owner(parent).await;
        let (na, fh) = self
            .core
            .create_as(parent, name, mode & !umask, exclusive, truncate, owner)
            .await?;
        // One TTL for the entry and its attributes, and fuser puts our node id in the
        // attributes' `ino`: valid for no time, so the next `fstat` asks for the file's own
        // st_ino (SQLite records it at open and takes a change for a moved database).
        Ok(Created {
            entry: Entry {
                attr: self.shown(&na, na.node.0),
                attr_ttl: Duration::ZERO,
                entry_ttl: Duration::ZERO,
            },
            fh,
            node: na.node,
        })
    }

    /// After CREATE's reply: its attributes carried our node id as st_ino, so the kernel is
    /// told to ask again, for the sandbox's.
    pub fn created_replied(&self, node: NodeId) {
        self.core.invalidate_kernel_attr(node);
    }

    /// A `copy_file_range` into the node was answered: what the kernel set from its own
    /// reckoning as it took the reply (the size, pages) goes, so the next `stat` asks.
    pub fn copied_replied(&self, node: NodeId) {
        self.core.invalidate_kernel_data(node);
    }

    /// A query (grep, glob, fuzzy, scan, edit) and INFO run in the sandbox as its user: like
    /// the control socket, only for the mount's owner and root, never for another user let
    /// in by allow_other.
    pub fn may_query(&self, uid: u32) -> Result<()> {
        if uid == self.owners.mount_uid || uid == 0 {
            Ok(())
        } else {
            Err(RemoteError::Access(
                "queries are for the mount's owner".into(),
            ))
        }
    }

    /// The QUERY ioctl's answer (a JSON document, NUL-ended, shorter than the ioctl's buffer).
    /// A QUERY ioctl from thread `caller`: cancelled (the sandbox's work dropped, `EINTR`)
    /// once a signal interrupts the caller ([`super::caller`]), since the kernel's interrupt
    /// does not reach us.
    pub async fn query(&self, node: NodeId, in_data: &[u8], caller: u32) -> Result<Vec<u8>> {
        tokio::select! {
            answer = self.answer_query(node, in_data) => answer,
            _ = super::caller::interrupted(caller) => {
                tracing::debug!(caller, "query cancelled: its caller was interrupted");
                Err(RemoteError::Interrupted("query".into()))
            }
        }
    }

    async fn answer_query(&self, node: NodeId, in_data: &[u8]) -> Result<Vec<u8>> {
        use crate::control::IOC_QUERY_SIZE;
        let bad = || RemoteError::Invalid("not a query".into());
        let request = crate::control::decode_query(in_data).ok_or_else(bad)?;
        let path = self.core.path_of(node).map_err(|_| bad())?;
        let request = request.at(path.as_bytes().to_vec());
        let info = serde_json::json!({
            "mountpoint": self.label.mountpoint,
            "socket": self.label.socket,
            "remote": self.label.remote,
        });
        let answer = match crate::control::server::answer_one(&self.core, &info, request).await {
            Ok(v) => v,
            Err(e) => serde_json::json!(crate::remote::wire::ErrorBody::from_error(&e)),
        };
        nul_ended(
            serde_json::to_vec(&answer).expect("serialisable"),
            IOC_QUERY_SIZE,
        )
    }

    /// The INFO ioctl's answer: this mount, and the node's path and version in the sandbox.
    pub fn info(&self, node: NodeId) -> Result<Vec<u8>> {
        let path = self.core.path_of(node)?;
        let info = crate::control::MountInfo {
            v: crate::control::PROTOCOL_VERSION,
            mountpoint: self.label.mountpoint.clone(),
            socket: self.label.socket.clone(),
            remote: self.label.remote.clone(),
            path: crate::remote::WireBytes(path.as_bytes().to_vec()),
            version: self.core.cached_version(node),
        };
        nul_ended(
            serde_json::to_vec(&info).expect("serialisable"),
            crate::control::IOC_INFO_SIZE,
        )
    }
}

/// `out` with a NUL after it, if that fits in `room` bytes (E2BIG otherwise).
fn nul_ended(mut out: Vec<u8>, room: usize) -> Result<Vec<u8>> {
    if out.len() >= room {
        return Err(RemoteError::TooLarge(format!(
            "answer of {} bytes (room for {room})",
            out.len()
        )));
    }
    out.push(0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::clock::Clock;
    use crate::mount::core::CoreConfig;
    use crate::mount::inode::ROOT;
    use crate::mount::options::IdMap;
    use crate::remote::memory::{MemoryRemote, MemorySandbox};
    use crate::remote::{Identity, Remote, RemotePath};

    /// The memory sandbox's user is 1000:1000; the mounting user here is 501:501.
    const YOU: (u32, u32) = (501, 501);
    const SANDBOX_TTL: Duration = Duration::from_secs(600);

    async fn rig(idmap: IdMap, allow_other: bool) -> (GatedFs, MemorySandbox, tempfile::TempDir) {
        let memory = MemoryRemote::new();
        let sb = memory.sandbox();
        sb.write("f", b"shared").unwrap();
        let root = memory.stat(&RemotePath::root()).await.unwrap();
        let staging = tempfile::tempdir().unwrap();
        let core = FsCore::new(
            Arc::new(memory),
            CoreConfig {
                attr_ttl: SANDBOX_TTL,
                cache_bytes: 1 << 20,
                staging_dir: staging.path().to_path_buf(),
                tree_max: 0,
                clock: Clock::system(),
            },
            root,
        );
        let owners = Owners {
            idmap,
            mount_uid: YOU.0,
            mount_gid: YOU.1,
            sandbox: Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![1000],
            },
            checks: true,
        };
        let fs = GatedFs::new(core, Arc::new(owners), allow_other, MountLabel::default());
        (fs, sb, staging)
    }

    fn you(fs: &GatedFs) -> Caller {
        fs.caller(YOU.0, YOU.1, std::process::id())
    }

    /// Another local user, let in by allow_other (with this process's supplementary groups,
    /// which are root's here: none of the sandbox's).
    fn stranger(fs: &GatedFs) -> Caller {
        fs.caller(2000, 2000, std::process::id())
    }

    #[tokio::test]
    async fn an_entry_carries_the_node_and_a_stat_the_sandboxs_inode_number() {
        let (fs, sb, _s) = rig(IdMap::None, false).await;
        let entry = fs.lookup(&you(&fs), ROOT, b"f").await.unwrap();
        // The entry's attributes are valid for no time: the next stat asks GETATTR.
        assert_eq!(entry.attr_ttl, Duration::ZERO);
        assert_eq!(entry.entry_ttl, SANDBOX_TTL);
        let node = NodeId(entry.attr.ino.0);
        let stat = fs.getattr(node).await.unwrap();
        assert_eq!(stat.attr.ino.0, sb.metadata("f").unwrap().ino);
        assert_ne!(
            stat.attr.ino.0, node.0,
            "st_ino is the sandbox's, not the node id"
        );
        assert_eq!(stat.ttl, SANDBOX_TTL);
        assert_eq!((stat.attr.uid, stat.attr.gid), (1000, 1000));
        assert_eq!(stat.attr.size, 6);
    }

    #[tokio::test]
    async fn with_other_users_let_in_every_name_is_asked_again() {
        // The kernel reuses a cached name without checking search permission on its
        // directory: with the daemon checking for other users, names are kept for no time.
        let (fs, _sb, _s) = rig(IdMap::None, true).await;
        let entry = fs.lookup(&you(&fs), ROOT, b"f").await.unwrap();
        assert_eq!(entry.entry_ttl, Duration::ZERO);
        assert_eq!(fs.entry_ttl(), Duration::ZERO);
    }

    #[tokio::test]
    async fn idmap_user_shows_the_sandbox_user_as_you_and_maps_your_chown_back() {
        let (fs, sb, _s) = rig(IdMap::User, false).await;
        let me = you(&fs);
        let entry = fs.lookup(&me, ROOT, b"f").await.unwrap();
        assert_eq!((entry.attr.uid, entry.attr.gid), YOU);
        let node = NodeId(entry.attr.ino.0);
        // `chown you:you` is "the sandbox's user" once mapped, not uid 501 in the sandbox.
        let set = SetAttrs {
            uid: Some(YOU.0),
            gid: Some(YOU.1),
            ..Default::default()
        };
        let after = fs.setattr(&me, node, set).await.unwrap();
        assert_eq!((after.attr.uid, after.attr.gid), YOU);
        let there = sb.metadata("f").unwrap();
        assert_eq!((there.uid, there.gid), (1000, 1000));
        // A file you make is the sandbox user's there, and yours here.
        let made = fs.mkdir(&me, ROOT, b"d", 0o755).await.unwrap();
        assert_eq!((made.attr.uid, made.attr.gid), YOU);
        assert_eq!(sb.metadata("d").unwrap().uid, 1000);
    }

    #[tokio::test]
    async fn another_user_is_checked_as_themselves_against_the_owners_shown() {
        let (fs, sb, _s) = rig(IdMap::None, true).await;
        let them = stranger(&fs);
        let f = NodeId(fs.lookup(&them, ROOT, b"f").await.unwrap().attr.ino.0);
        // 0644, not theirs: readable, not writable, not theirs to chmod.
        let opened = fs.open(&them, f, libc::O_RDONLY).await.unwrap();
        assert_eq!(fs.read(opened.fh, 0, 100).await.unwrap(), b"shared");
        fs.release(opened.fh).await;
        let e = fs.open(&them, f, libc::O_WRONLY).await.unwrap_err();
        assert_eq!(e.errno(), libc::EACCES);
        let chmod = SetAttrs {
            mode: Some(0o777),
            ..Default::default()
        };
        let e = fs.setattr(&them, f, chmod.clone()).await.unwrap_err();
        assert_eq!(e.errno(), libc::EPERM);
        // The root directory is 0755 and the sandbox user's: no new names from them.
        let e = fs.mkdir(&them, ROOT, b"theirs", 0o755).await.unwrap_err();
        assert_eq!(e.errno(), libc::EACCES);
        let e = fs.unlink(&them, ROOT, b"f").await.unwrap_err();
        assert_eq!(e.errno(), libc::EACCES);
        assert_eq!(sb.read("f").unwrap(), b"shared");
        assert_eq!(sb.metadata("f").unwrap().mode & 0o7777, 0o644);
        assert!(!sb.exists("theirs"));
        // The mounting user, acting as the sandbox's user, may.
        fs.setattr(&you(&fs), f, chmod).await.unwrap();
        assert_eq!(sb.metadata("f").unwrap().mode & 0o7777, 0o777);
    }

    #[tokio::test]
    async fn file_capabilities_are_never_asked_of_the_sandbox() {
        let (fs, _sb, _s) = rig(IdMap::None, false).await;
        let me = you(&fs);
        let f = NodeId(fs.lookup(&me, ROOT, b"f").await.unwrap().attr.ino.0);
        fs.setxattr(&me, f, b"user.note", b"kept", 0).await.unwrap();
        assert_eq!(fs.getxattr(&me, f, b"user.note").await.unwrap(), b"kept");
        let e = fs
            .getxattr(&me, f, b"security.capability")
            .await
            .unwrap_err();
        assert_eq!(e.errno(), libc::ENODATA);
        assert_eq!(fs.listxattr(&me, f).await.unwrap(), b"user.note\0");
    }

    #[tokio::test]
    async fn queries_are_for_the_mounts_owner_and_root_only() {
        let (fs, _sb, _s) = rig(IdMap::None, true).await;
        assert!(fs.may_query(YOU.0).is_ok());
        assert!(fs.may_query(0).is_ok());
        assert_eq!(fs.may_query(2000).unwrap_err().errno(), libc::EACCES);
    }

    #[tokio::test]
    async fn create_and_fallocate_answer_as_the_kernel_expects() {
        let (fs, sb, _s) = rig(IdMap::None, false).await;
        let me = you(&fs);
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        let made = fs
            .create(&me, ROOT, b"n", (0o666, 0o022), flags)
            .await
            .unwrap();
        // Attributes and name valid for no time: the next fstat asks for the file's st_ino.
        assert_eq!(made.entry.attr_ttl, Duration::ZERO);
        assert_eq!(made.entry.attr.perm, 0o644);
        assert_eq!(made.entry.attr.ino.0, made.node.0);
        assert_eq!(fs.write(made.fh, 0, b"abc", 0).await.unwrap(), 3);
        // Reserving space is done; punching a hole is not (it would change content in place).
        fs.fallocate(made.node, made.fh, (0, 4096), libc::FALLOC_FL_KEEP_SIZE)
            .await
            .unwrap();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let e = fs
            .fallocate(made.node, made.fh, (0, 2), punch)
            .await
            .unwrap_err();
        assert_eq!(e.errno(), libc::EOPNOTSUPP);
        fs.flush(made.fh, 0).await.unwrap();
        fs.release(made.fh).await;
        let e = fs
            .create(&me, ROOT, b"n", (0o666, 0), flags)
            .await
            .unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST);
        assert!(fs.core.flush_all().await.is_empty());
        assert_eq!(sb.read("n").unwrap(), b"abc");
    }
}
