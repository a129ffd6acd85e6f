//! The FUSE adapter: decodes each request, runs the core's async operation on the runtime, and
//! turns its result into a reply. A callback never waits on the network: it hands the request to
//! a task and returns, so a slow remote call never blocks unrelated operations.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;

use super::core::{FsCore, KernelCache, NodeAttr, NodeId};
use crate::remote::{FileKind, RemoteError};

pub struct SbxFs {
    pub core: Arc<FsCore>,
    pub rt: Handle,
    /// What the INFO ioctl reports about this mount.
    pub mountpoint: String,
    pub socket: String,
    pub remote: String,
}

/// The one place a core error becomes an errno.
fn errno(e: &RemoteError) -> Errno {
    Errno::from_i32(e.errno())
}

fn reply_empty(reply: ReplyEmpty, r: crate::remote::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_data(reply: ReplyData, r: crate::remote::Result<Vec<u8>>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_entry(reply: ReplyEntry, s: &SbxFsShared, r: crate::remote::Result<NodeAttr>) {
    match r {
        Ok(na) => reply.entry(&s.ttl, &s.attr(&na), Generation(0)),
        Err(e) => reply.error(errno(&e)),
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
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
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

impl SbxFs {
    /// The QUERY ioctl: decode, run the query about this node on the runtime, reply.
    fn ioctl_query(&self, node: NodeId, in_data: &[u8], out_size: u32, reply: fuser::ReplyIoctl) {
        use crate::control::{Request as Q, IOC_QUERY_SIZE, PROTOCOL_VERSION};
        if in_data.len() != IOC_QUERY_SIZE || (out_size as usize) != IOC_QUERY_SIZE {
            reply.error(Errno::EINVAL);
            return;
        }
        let end = in_data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(in_data.len());
        // Paths are optional in an ioctl request: fill one in before decoding.
        let parsed = serde_json::from_slice::<serde_json::Value>(&in_data[..end])
            .ok()
            .and_then(|mut v| {
                if v.get("v")?.as_u64()? != u64::from(PROTOCOL_VERSION) {
                    return None;
                }
                if v.get("path").is_none() {
                    v["path"] = serde_json::json!("");
                }
                serde_json::from_value::<Q>(v).ok()
            });
        let (Some(request), Ok(path)) = (parsed, self.core.path_of(node)) else {
            reply.error(Errno::EINVAL);
            return;
        };
        let request = request.at(path.as_bytes().to_vec());
        let info = serde_json::json!({ "mountpoint": self.mountpoint, "socket": self.socket, "remote": self.remote });
        self.spawn(move |core, _| async move {
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

    fn ttl(&self) -> Duration {
        self.core.config().attr_ttl
    }

    /// Run `op` on the runtime and reply from there.
    fn spawn<F>(&self, f: impl FnOnce(Arc<FsCore>, Arc<SbxFsShared>) -> F + Send + 'static)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::new(SbxFsShared {
            ttl: self.ttl(),
            uid: self.core.config().uid,
            gid: self.core.config().gid,
        });
        let core = self.core.clone();
        self.rt.spawn(f(core, shared));
    }
}

/// What a reply task needs to build attributes without borrowing the adapter.
pub struct SbxFsShared {
    ttl: Duration,
    uid: u32,
    gid: u32,
}

impl SbxFsShared {
    fn attr(&self, na: &NodeAttr) -> FileAttr {
        let a = &na.attr;
        FileAttr {
            ino: INodeNo(na.node),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: time(a.atime_ns),
            mtime: time(a.mtime_ns),
            ctime: time(a.ctime_ns),
            crtime: time(a.ctime_ns),
            kind: kind(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink.max(1) as u32,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 128 * 1024,
            flags: 0,
        }
    }
}

fn name_bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

impl Filesystem for SbxFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1024 * 1024);
        let _ = config.set_max_readahead(1024 * 1024);
        // ioctls on directories too: `sbxfs grep` asks the directory it stands in.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_HAS_IOCTL_DIR);
        Ok(())
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        if cmd == crate::control::IOC_QUERY {
            self.ioctl_query(ino.0, in_data, out_size, reply);
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
        let Ok(path) = self.core.path_of(ino.0) else {
            reply.error(Errno::ENOENT);
            return;
        };
        let info = crate::control::MountInfo {
            v: crate::control::PROTOCOL_VERSION,
            mountpoint: self.mountpoint.clone(),
            socket: self.socket.clone(),
            remote: self.remote.clone(),
            path: crate::remote::WireBytes(path.as_bytes().to_vec()),
            version: self.core.cached_version(ino.0),
        };
        let mut out = serde_json::to_vec(&info).expect("serialisable");
        if out.len() >= crate::control::IOC_INFO_SIZE {
            reply.error(Errno::from_i32(libc::E2BIG));
            return;
        }
        out.push(0);
        reply.ioctl(0, &out);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_bytes(name);
        self.spawn(move |core, s| async move {
            reply_entry(reply, &s, core.lookup(parent.0, &name).await)
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(move |core, s| async move {
            match core.getattr(ino.0).await {
                Ok(mut na) => {
                    na.node = ino.0;
                    reply.attr(&s.ttl, &s.attr(&na))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.spawn(move |core, s| async move {
            let now = core.now_ns();
            let at = atime.map(|t| time_ns(t, now));
            let mt = mtime.map(|t| time_ns(t, now));
            match core
                .setattr(ino.0, mode.map(|m| m & 0o7777), (uid, gid), size, at, mt)
                .await
            {
                Ok(mut na) => {
                    na.node = ino.0;
                    reply.attr(&s.ttl, &s.attr(&na))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(move |core, _| async move { reply_data(reply, core.readlink(ino.0).await) });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(name);
        self.spawn(move |core, s| async move {
            reply_entry(reply, &s, core.mkdir(parent.0, &name, mode & !umask).await)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        self.spawn(
            move |core, _| async move { reply_empty(reply, core.unlink(parent.0, &name).await) },
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        self.spawn(
            move |core, _| async move { reply_empty(reply, core.rmdir(parent.0, &name).await) },
        );
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let (name, target) = (
            name_bytes(link_name),
            target.as_os_str().as_bytes().to_vec(),
        );
        self.spawn(move |core, s| async move {
            reply_entry(reply, &s, core.symlink(parent.0, &name, &target).await)
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            reply.error(Errno::EINVAL);
            return;
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (name, newname) = (name_bytes(name), name_bytes(newname));
        self.spawn(move |core, _| async move {
            match core
                .rename(parent.0, &name, newparent.0, &newname, no_replace)
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // Hard links would make a path-keyed remote ambiguous: refused, as on many network mounts.
        reply.error(Errno::EPERM);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Devices, FIFOs and sockets do not cross to a sandbox.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writable = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let truncate = flags.0 & libc::O_TRUNC != 0;
        self.spawn(move |core, _| async move {
            match core.open(ino.0, writable, truncate).await {
                Ok((fh, keep)) => {
                    let f = if keep {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    reply.opened(FileHandle(fh), f)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(
            move |core, _| async move { reply_data(reply, core.read(fh.0, offset, size).await) },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn(move |core, _| async move {
            match core.write(fh.0, offset, &data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core, _| async move { reply_empty(reply, core.flush(fh.0).await) });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core, _| async move {
            // release cannot report an error to close(): a failed push is kept and retried.
            let _ = core.release(fh.0).await;
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core, _| async move { reply_empty(reply, core.flush(fh.0).await) });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn(move |core, _| async move {
            match core.readdir(ino.0).await {
                Ok(entries) => {
                    let dots = [
                        (b".".to_vec(), ino.0, FileKind::Dir),
                        (b"..".to_vec(), ino.0, FileKind::Dir),
                    ];
                    for (i, (name, node, k)) in dots
                        .into_iter()
                        .chain(entries)
                        .enumerate()
                        .skip(offset as usize)
                    {
                        if reply.add(
                            INodeNo(node),
                            (i + 1) as u64,
                            kind(k),
                            OsStr::from_bytes(&name),
                        ) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |core, _| async move {
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
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_bytes(name);
        let exclusive = flags & libc::O_EXCL != 0;
        self.spawn(move |core, s| async move {
            match core.create(parent.0, &name, mode & !umask, exclusive).await {
                Ok((na, fh)) => reply.created(
                    &s.ttl,
                    &s.attr(&na),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

/// Kernel cache invalidation through the session's notifier. Each notification is sent from a
/// thread of its own: the kernel may need a lock held by the very request that caused it, and
/// that request can only finish once we reply.
pub struct Notifier(pub Arc<fuser::Notifier>);

impl KernelCache for Notifier {
    fn invalidate_data(&self, node: NodeId) {
        let n = self.0.clone();
        std::thread::spawn(move || {
            let _ = n.inval_inode(INodeNo(node), 0, 0);
        });
    }
}
