//! The FUSE adapter: decodes each request, runs the core's async operation on the runtime, and
//! turns its result into a reply. A callback never waits on the network: it hands the request to
//! a task (with a tracing span naming the operation and node) and returns, so a slow remote
//! call never blocks unrelated operations. Every error reply goes through [`fail`], the one
//! place a core error becomes an errno (and is logged).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;
use tracing::Instrument;

use super::access::XattrUse;
use super::core::{FsCore, KernelCache, NodeAttr};
use super::gate::{Caller, Gate, Owners};
use super::inode::NodeId;
use crate::remote::{FileKind, RemoteError, RenameMode, SpecialKind, XattrFlags};

pub struct SbxFs {
    pub core: Arc<FsCore>,
    pub rt: Handle,
    /// What the INFO ioctl reports about this mount.
    pub mountpoint: String,
    pub socket: String,
    pub remote: String,
    /// Who files show as owned by, and whether the daemon checks permissions.
    pub owners: Arc<Owners>,
    /// Other users may use the mount (`allow_other`).
    pub allow_other: bool,
}

/// The one place a core error becomes an errno. Expected answers (a name that is not there,
/// an attribute that is not set) are logged at debug; failures of the sandbox at warn.
fn fail(op: &str, e: &RemoteError) -> Errno {
    let errno = e.errno();
    match errno {
        libc::EIO | libc::ENOSPC | libc::EFBIG => warn_rate_limited(op, e),
        _ => tracing::debug!(op, errno, "{e}"),
    }
    Errno::from_i32(errno)
}

/// A failure of the sandbox, logged once a minute per operation and message (a file failing on
/// every access would otherwise fill the log).
fn warn_rate_limited(op: &str, e: &RemoteError) {
    static REPEATS: std::sync::LazyLock<crate::lograte::RateLimit> =
        std::sync::LazyLock::new(crate::lograte::RateLimit::new);
    let m = e.to_string();
    match REPEATS.check(&format!("{op} {m}"), std::time::Instant::now()) {
        crate::lograte::Verdict::Log { repeats: 0 } => tracing::warn!(op, "{m}"),
        crate::lograte::Verdict::Log { repeats } => tracing::warn!(
            op,
            "{m} (and {repeats} more {op} failures like it in the last {} s)",
            crate::lograte::WINDOW.as_secs()
        ),
        crate::lograte::Verdict::Quiet => tracing::debug!(op, "{m}"),
    }
}

fn reply_empty(reply: ReplyEmpty, op: &str, r: crate::remote::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn reply_data(reply: ReplyData, op: &str, r: crate::remote::Result<Vec<u8>>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(fail(op, &e)),
    }
}

/// An entry reply. fuser puts the attributes' `ino` in the entry's node id, so the entry
/// carries our node id with attributes valid for no time: the kernel asks GETATTR before the
/// next `stat`, and that answer carries the sandbox's inode number as `st_ino`.
fn reply_entry(reply: ReplyEntry, s: &Shared, op: &str, r: crate::remote::Result<NodeAttr>) {
    match r {
        Ok(na) => reply.entry_with_ttls(
            &Duration::ZERO,
            &s.entry_ttl,
            &s.attr(&na, na.node.0),
            Generation(0),
        ),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn reply_xattr(reply: ReplyXattr, size: u32, op: &str, r: crate::remote::Result<Vec<u8>>) {
    match r {
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn kind(k: FileKind) -> FileType {
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

fn time_ns(t: TimeOrNow, now: i64) -> i64 {
    match t {
        TimeOrNow::Now => now,
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        },
    }
}

/// What a reply task needs to build attributes without borrowing the adapter.
pub struct Shared {
    ttl: Duration,
    /// How long the kernel may reuse a name's lookup without asking again.
    entry_ttl: Duration,
    owners: Arc<Owners>,
}

impl Shared {
    /// Attributes as the kernel sees them, with `ino` as given (our node id in entry replies,
    /// the sandbox's inode number in attribute replies).
    fn attr(&self, na: &NodeAttr, ino: u64) -> FileAttr {
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
            kind: kind(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink.min(u32::MAX as u64) as u32,
            uid,
            gid,
            rdev: a.rdev as u32,
            blksize: 128 * 1024,
            flags: 0,
        }
    }

    /// The permission gate for one request's caller.
    fn gate<'a>(&'a self, core: &'a FsCore, caller: &'a Caller) -> Gate<'a> {
        Gate {
            core,
            owners: &self.owners,
            caller,
        }
    }

    /// Attributes for a GETATTR/SETATTR reply: `st_ino` is the sandbox's.
    fn stat(&self, na: &NodeAttr) -> FileAttr {
        self.attr(na, na.attr.ino)
    }
}

fn name_bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

impl SbxFs {
    /// The QUERY ioctl: decode, run the query about this node on the runtime, reply.
    fn ioctl_query(&self, node: NodeId, in_data: &[u8], out_size: u32, reply: fuser::ReplyIoctl) {
        use crate::control::IOC_QUERY_SIZE;
        if (out_size as usize) != IOC_QUERY_SIZE {
            reply.error(Errno::EINVAL);
            return;
        }
        let parsed = crate::control::decode_query(in_data);
        let (Some(request), Ok(path)) = (parsed, self.core.path_of(node)) else {
            reply.error(Errno::EINVAL);
            return;
        };
        let request = request.at(path.as_bytes().to_vec());
        let info = serde_json::json!({ "mountpoint": self.mountpoint, "socket": self.socket, "remote": self.remote });
        self.spawn("ioctl", node.0, move |core, _| async move {
            let answer = match crate::control::server::answer_one(&core, &info, request).await {
                Ok(v) => v,
                Err(e) => serde_json::json!(crate::remote::wire::ErrorBody::from_error(&e)),
            };
            let mut out = serde_json::to_vec(&answer).expect("serialisable");
            if out.len() >= IOC_QUERY_SIZE {
                reply.error(Errno::from_i32(libc::E2BIG));
                return;
            }
            out.push(0);
            reply.ioctl(0, &out);
        });
    }

    /// Who is asking, as the permission checks see them.
    fn caller(&self, req: &Request) -> Caller {
        self.owners.caller(req.uid(), req.gid(), req.pid())
    }

    /// Long while the change feed vouches for the caches ([`super::feed`]), else the TTL.
    fn ttl(&self) -> Duration {
        self.core.ttl()
    }

    /// Run `op` on the runtime, in a span naming the request, and reply from there.
    fn spawn<F>(
        &self,
        op: &'static str,
        node: u64,
        f: impl FnOnce(Arc<FsCore>, Arc<Shared>) -> F + Send + 'static,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            ttl: self.ttl(),
            // With the daemon checking and other users in, every path walk must reach it: the
            // kernel reuses a cached name without checking search permission on its directory.
            // The configured TTL even while the change feed vouches for the caches: a name
            // the kernel asks again about costs no round trip then, and one the kernel kept
            // longer would outlive a feed that drops.
            entry_ttl: if self.owners.checks && self.allow_other {
                Duration::ZERO
            } else {
                self.core.config().attr_ttl
            },
            owners: self.owners.clone(),
        });
        let core = self.core.clone();
        let span = tracing::debug_span!("fuse", op, node);
        self.rt.spawn(f(core, shared).instrument(span));
    }
}

impl Filesystem for SbxFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1024 * 1024);
        // The kernel's largest read-ahead (it says how large: the error is its limit), and many
        // of its reads in flight at once; the mount's own read-ahead covers the distance.
        if let Err(kernel_max) = config.set_max_readahead(super::readahead::MAX_WINDOW as u32) {
            let _ = config.set_max_readahead(kernel_max);
        }
        let _ = config.set_max_background(64);
        // Lookups and listings in one directory run in parallel (the kernel still serialises
        // changes to it); asked for alone, as a kernel without it refuses the whole set.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS);
        // ioctls on directories too: `sbxfs grep` asks the directory it stands in. O_TRUNC in
        // OPEN itself: a SETATTR of the size is then always an explicit truncate.
        let _ = config.add_capabilities(
            fuser::InitFlags::FUSE_HAS_IOCTL_DIR | fuser::InitFlags::FUSE_ATOMIC_O_TRUNC,
        );
        Ok(())
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // A query runs in the sandbox as its user: like the control socket, only for the
        // mount's owner and root, never for another user let in by allow_other.
        let owner_or_root = req.uid() == self.owners.mount_uid || req.uid() == 0;
        let ours = cmd == crate::control::IOC_QUERY || cmd == crate::control::IOC_INFO;
        if ours && !owner_or_root {
            reply.error(Errno::from_i32(libc::EACCES));
            return;
        }
        if cmd == crate::control::IOC_QUERY {
            self.ioctl_query(NodeId(ino.0), in_data, out_size, reply);
            return;
        }
        if cmd != crate::control::IOC_INFO {
            reply.error(Errno::from_i32(libc::ENOTTY));
            return;
        }
        if !in_data.is_empty() || (out_size as usize) < crate::control::IOC_INFO_SIZE {
            reply.error(Errno::EINVAL);
            return;
        }
        let Ok(path) = self.core.path_of(NodeId(ino.0)) else {
            reply.error(Errno::ENOENT);
            return;
        };
        let info = crate::control::MountInfo {
            v: crate::control::PROTOCOL_VERSION,
            mountpoint: self.mountpoint.clone(),
            socket: self.socket.clone(),
            remote: self.remote.clone(),
            path: crate::remote::WireBytes(path.as_bytes().to_vec()),
            version: self.core.cached_version(NodeId(ino.0)),
        };
        let mut out = serde_json::to_vec(&info).expect("serialisable");
        if out.len() >= crate::control::IOC_INFO_SIZE {
            reply.error(Errno::from_i32(libc::E2BIG));
            return;
        }
        out.push(0);
        reply.ioctl(0, &out);
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_bytes(name);
        let caller = self.caller(req);
        self.spawn("lookup", parent.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller).lookup(NodeId(parent.0)).await?;
                core.lookup(NodeId(parent.0), &name).await
            }
            .await;
            reply_entry(reply, &s, "lookup", r)
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(NodeId(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn("getattr", ino.0, move |core, s| async move {
            match core.getattr(NodeId(ino.0)).await {
                Ok(na) => reply.attr(&s.ttl, &s.stat(&na)),
                Err(e) => reply.error(fail("getattr", &e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let caller = self.caller(req);
        self.spawn("setattr", ino.0, move |core, s| async move {
            let now = core.now_ns();
            let at = atime.map(|t| time_ns(t, now));
            let mt = mtime.map(|t| time_ns(t, now));
            let explicit_times = [atime, mtime]
                .iter()
                .flatten()
                .any(|t| matches!(t, TimeOrNow::SpecificTime(_)));
            let times = (atime.is_some() || mtime.is_some()).then_some(explicit_times);
            // The mounting user acts as the sandbox's user: its chown is in the sandbox's
            // numbers once mapped; anyone else's is checked in the numbers they see.
            let (to_uid, to_gid) = s.owners.to_sandbox(uid, gid);
            let (ask_uid, ask_gid) = match &caller {
                Caller::Checked { raw: true, .. } => (to_uid, to_gid),
                _ => (uid, gid),
            };
            let r = async {
                let mode = s
                    .gate(&core, &caller)
                    .setattr(
                        NodeId(ino.0),
                        mode.map(|m| m & 0o7777),
                        ask_uid,
                        ask_gid,
                        size.is_some() && fh.is_none(),
                        times,
                    )
                    .await?;
                core.setattr(
                    NodeId(ino.0),
                    fh.map(|f| f.0),
                    mode,
                    (to_uid, to_gid),
                    size,
                    at,
                    mt,
                )
                .await
            }
            .await;
            match r {
                Ok(na) => reply.attr(&s.ttl, &s.stat(&na)),
                Err(e) => reply.error(fail("setattr", &e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn("readlink", ino.0, move |core, _| async move {
            reply_data(reply, "readlink", core.readlink(NodeId(ino.0)).await)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(name);
        let caller = self.caller(req);
        self.spawn("mkdir", parent.0, move |core, s| async move {
            let r = async {
                let gate = s.gate(&core, &caller);
                gate.add(NodeId(parent.0)).await?;
                let owner = gate.new_owner(NodeId(parent.0)).await;
                let made = core.mkdir(NodeId(parent.0), &name, mode & !umask).await?;
                core.give_to(made, owner).await
            }
            .await;
            reply_entry(reply, &s, "mkdir", r)
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(name);
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => Some(SpecialKind::Fifo),
            libc::S_IFSOCK => Some(SpecialKind::Socket),
            libc::S_IFCHR => Some(SpecialKind::CharDevice),
            libc::S_IFBLK => Some(SpecialKind::BlockDevice),
            _ => None,
        };
        let perm = mode & !umask & 0o7777;
        let caller = self.caller(req);
        self.spawn("mknod", parent.0, move |core, s| async move {
            let gate = s.gate(&core, &caller);
            if let Err(e) = gate.add(NodeId(parent.0)).await {
                reply.error(fail("mknod", &e));
                return;
            }
            let owner = gate.new_owner(NodeId(parent.0)).await;
            let r = match kind {
                Some(k) => {
                    core.mknod(NodeId(parent.0), &name, k, perm, u64::from(rdev))
                        .await
                }
                // A regular file made by mknod: created, not opened.
                None => core.make_file(NodeId(parent.0), &name, perm).await,
            };
            let r = match r {
                Ok(made) => core.give_to(made, owner).await,
                Err(e) => Err(e),
            };
            reply_entry(reply, &s, "mknod", r)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        let caller = self.caller(req);
        self.spawn("unlink", parent.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .delete(NodeId(parent.0), &name)
                    .await?;
                core.unlink(NodeId(parent.0), &name).await
            }
            .await;
            reply_empty(reply, "unlink", r)
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        let caller = self.caller(req);
        self.spawn("rmdir", parent.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .delete(NodeId(parent.0), &name)
                    .await?;
                core.rmdir(NodeId(parent.0), &name).await
            }
            .await;
            reply_empty(reply, "rmdir", r)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let (name, target) = (
            name_bytes(link_name),
            target.as_os_str().as_bytes().to_vec(),
        );
        let caller = self.caller(req);
        self.spawn("symlink", parent.0, move |core, s| async move {
            let r = async {
                let gate = s.gate(&core, &caller);
                gate.add(NodeId(parent.0)).await?;
                let owner = gate.new_owner(NodeId(parent.0)).await;
                let made = core.symlink(NodeId(parent.0), &name, &target).await?;
                core.give_to(made, owner).await
            }
            .await;
            reply_entry(reply, &s, "symlink", r)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let mode = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else {
            RenameMode::Replace
        };
        let (name, newname) = (name_bytes(name), name_bytes(newname));
        let caller = self.caller(req);
        self.spawn("rename", parent.0, move |core, s| async move {
            let (from, to) = (NodeId(parent.0), NodeId(newparent.0));
            let r = async {
                s.gate(&core, &caller)
                    .rename(from, &name, to, &newname, mode == RenameMode::Exchange)
                    .await?;
                core.rename(from, &name, to, &newname, mode).await
            }
            .await;
            reply_empty(reply, "rename", r)
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(newname);
        let caller = self.caller(req);
        self.spawn("link", ino.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .link(NodeId(ino.0), NodeId(newparent.0))
                    .await?;
                core.link(NodeId(ino.0), NodeId(newparent.0), &name).await
            }
            .await;
            reply_entry(reply, &s, "link", r)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writable = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let caller = self.caller(req);
        self.spawn("open", ino.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller).open(NodeId(ino.0), flags.0).await?;
                core.open(NodeId(ino.0), writable, truncate).await
            }
            .await;
            match r {
                Ok((fh, keep)) => {
                    let f = if keep {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    reply.opened(FileHandle(fh), f)
                }
                Err(e) => reply.error(fail("open", &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The kernel's read sizes show whether max_readahead/max_pages took (SBXFS_LOG=trace).
        tracing::trace!(offset, size, "read");
        self.spawn("read", ino.0, move |core, _| async move {
            reply_data(reply, "read", core.read(fh.0, offset, size).await)
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn("write", ino.0, move |core, _| async move {
            match core.write(fh.0, offset, &data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(fail("write", &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn("flush", ino.0, move |core, _| async move {
            reply_empty(reply, "flush", core.flush(fh.0).await)
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn("release", ino.0, move |core, _| async move {
            // release cannot report an error to close(): a failed push is kept, retried, and
            // reported by the file's next fsync/close and in `ctl status`.
            let _ = core.release(fh.0).await;
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn("fsync", ino.0, move |core, _| async move {
            reply_empty(reply, "fsync", core.fsync(fh.0).await)
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let caller = self.caller(req);
        self.spawn("opendir", ino.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .may(NodeId(ino.0), super::access::READ)
                    .await?;
                core.opendir(NodeId(ino.0))
            }
            .await;
            match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(fail("opendir", &e)),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let want =
            mask.bits() as u32 & (super::access::READ | super::access::WRITE | super::access::EXEC);
        let caller = self.caller(req);
        self.spawn("access", ino.0, move |core, s| async move {
            let r = async {
                // Existence (F_OK) is settled by the lookup that found the node.
                s.gate(&core, &caller).access(NodeId(ino.0), want).await
            }
            .await;
            reply_empty(reply, "access", r)
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn("readdir", ino.0, move |core, _| async move {
            match core.readdir(fh.0, offset).await {
                Ok(entries) => {
                    for (i, e) in entries.iter().enumerate().skip(offset as usize) {
                        if reply.add(
                            INodeNo(e.ino),
                            (i + 1) as u64,
                            kind(e.kind),
                            OsStr::from_bytes(&e.name),
                        ) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(fail("readdir", &e)),
            }
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are made in the sandbox as they happen.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.spawn("statfs", ino.0, move |core, _| async move {
            match core.statfs().await {
                Ok(s) => reply.statfs(
                    s.blocks,
                    s.blocks_free,
                    s.blocks_available,
                    s.files,
                    s.files_free,
                    s.block_size as u32,
                    s.name_max as u32,
                    s.block_size as u32,
                ),
                Err(e) => reply.error(fail("statfs", &e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (name, value) = (name_bytes(name), value.to_vec());
        let flags = XattrFlags {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        let caller = self.caller(req);
        self.spawn("setxattr", ino.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .xattr(NodeId(ino.0), &name, XattrUse::Set)
                    .await?;
                core.setxattr(NodeId(ino.0), &name, &value, flags).await
            }
            .await;
            reply_empty(reply, "setxattr", r)
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name_bytes(name);
        // The kernel asks for file capabilities before every write (to drop them). The mount
        // is nosuid, so capabilities never apply: answered here, not by a round trip per write.
        if name == b"security.capability" {
            reply.error(Errno::from_i32(libc::ENODATA));
            return;
        }
        let caller = self.caller(req);
        self.spawn("getxattr", ino.0, move |core, s| async move {
            let r = async {
                let gate = s.gate(&core, &caller);
                if !gate.xattr(NodeId(ino.0), &name, XattrUse::Get).await? {
                    return Err(RemoteError::NoAttr(String::from_utf8_lossy(&name).into()));
                }
                core.getxattr(NodeId(ino.0), &name).await
            }
            .await;
            reply_xattr(reply, size, "getxattr", r)
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let caller = self.caller(req);
        self.spawn("listxattr", ino.0, move |core, s| async move {
            let gate = s.gate(&core, &caller);
            let r = core.listxattr(NodeId(ino.0)).await.map(|names| {
                let mut out = Vec::new();
                for n in names.into_iter().filter(|n| gate.lists_xattr(n)) {
                    out.extend_from_slice(&n);
                    out.push(0);
                }
                out
            });
            reply_xattr(reply, size, "listxattr", r)
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        let caller = self.caller(req);
        self.spawn("removexattr", ino.0, move |core, s| async move {
            let r = async {
                s.gate(&core, &caller)
                    .xattr(NodeId(ino.0), &name, XattrUse::Set)
                    .await?;
                core.removexattr(NodeId(ino.0), &name).await
            }
            .await;
            reply_empty(reply, "removexattr", r)
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            // Punching holes and the like change content: not done in place in the sandbox.
            reply.error(Errno::from_i32(libc::EOPNOTSUPP));
            return;
        }
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        self.spawn("fallocate", ino.0, move |core, _| async move {
            let r = core
                .fallocate(NodeId(ino.0), Some(fh.0), offset, length, keep_size)
                .await;
            reply_empty(reply, "fallocate", r)
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.spawn("copy_file_range", ino_in.0, move |core, _| async move {
            let r = core
                .copy_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
                .await;
            match r {
                Ok(n) => reply.written(n.min(u32::MAX as u64) as u32),
                Err(e) => reply.error(fail("copy_file_range", &e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_bytes(name);
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let kernel = self.core.clone();
        let caller = self.caller(req);
        self.spawn("create", parent.0, move |core, s| async move {
            let r = async {
                let gate = s.gate(&core, &caller);
                gate.create(NodeId(parent.0), &name, exclusive, flags)
                    .await?;
                let owner = gate.new_owner(NodeId(parent.0)).await;
                // Given to the caller only if this call made it: an existing file opened
                // with O_CREAT (one that appeared since the lookup, too) keeps its owner.
                core.create_as(
                    NodeId(parent.0),
                    &name,
                    mode & !umask,
                    exclusive,
                    truncate,
                    owner,
                )
                .await
            }
            .await;
            match r {
                Ok((na, fh)) => {
                    // One TTL for the entry and its attributes, and fuser puts our node id in
                    // the attributes' `ino`: valid for no time, so the next `fstat` asks for
                    // the file's own st_ino (SQLite records it at open and takes a change for
                    // a moved database). The name is looked up again locally, at no cost.
                    reply.created(
                        &Duration::ZERO,
                        &s.attr(&na, na.node.0),
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    );
                    // The reply's attributes carry our node id as st_ino: have the kernel ask
                    // again, for the sandbox's.
                    kernel.invalidate_kernel_attr(na.node);
                }
                Err(e) => reply.error(fail("create", &e)),
            }
        });
    }
}

/// Kernel cache invalidation through the session's notifier. Notifications are sent from a
/// thread of their own, never from a request's: the kernel may need a lock held by the very
/// request that caused one, and that request can only finish once we reply. One thread, fed
/// by a queue, so a burst of changes in the sandbox does not start a thread per change.
pub struct Notifier {
    queue: std::sync::Mutex<std::sync::mpsc::Sender<Note>>,
}

enum Note {
    Data(NodeId),
    Attr(NodeId),
    Entry(NodeId, Vec<u8>),
}

impl Notifier {
    pub fn new(kernel: Arc<fuser::Notifier>) -> Notifier {
        let (tx, rx) = std::sync::mpsc::channel::<Note>();
        let spawned = std::thread::Builder::new()
            .name("sbxfs-notify".into())
            .spawn(move || {
                // Errors say the kernel did not have that node or name cached: nothing to drop.
                for note in rx {
                    let _ = match note {
                        Note::Data(n) => kernel.inval_inode(INodeNo(n.0), 0, 0),
                        Note::Attr(n) => kernel.inval_inode(INodeNo(n.0), -1, 0),
                        Note::Entry(p, name) => {
                            kernel.inval_entry(INodeNo(p.0), OsStr::from_bytes(&name))
                        }
                    };
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the kernel notification thread: {e}");
        }
        Notifier {
            queue: std::sync::Mutex::new(tx),
        }
    }

    fn send(&self, note: Note) {
        let _ = self.queue.lock().expect("notifier lock").send(note);
    }
}

impl KernelCache for Notifier {
    fn invalidate_data(&self, node: NodeId) {
        self.send(Note::Data(node));
    }

    fn invalidate_attr(&self, node: NodeId) {
        self.send(Note::Attr(node));
    }

    fn invalidate_entry(&self, parent: NodeId, name: &[u8]) {
        self.send(Note::Entry(parent, name.to_vec()));
    }
}
