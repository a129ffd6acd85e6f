//! The FUSE adapter: decodes each request, calls the gated filesystem ([`super::gated`]) on
//! the runtime, and turns its answer into a reply. A callback never waits on the network: it
//! hands the request to a task (with a tracing span naming the operation and node) and
//! returns, so a slow remote call never blocks unrelated operations. Every error reply goes
//! through [`fail`], the one place a core error becomes an errno (and is logged). Permission
//! checks, owners as shown and TTLs are the gated filesystem's: nothing here decides them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;
use tracing::Instrument;

use super::core::KernelPages;
use super::echo::ECHO_FH;
use super::gate::Caller;
use super::gated::{Attributes, Entry, GatedFs, Opened, SetAttrs};
use super::inode::NodeId;
use super::kernel_notes::KernelNotes;
use crate::remote::{RemoteError, RenameMode};

pub struct SbxFs {
    pub fs: Arc<GatedFs>,
    pub rt: Handle,
    /// Told of each READ until it is answered ([`super::kernel_notes`]).
    pub notes: Arc<KernelNotes>,
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

fn reply_entry(reply: ReplyEntry, op: &str, r: crate::remote::Result<Entry>) {
    match r {
        Ok(e) => reply.entry_with_ttls(&e.attr_ttl, &e.entry_ttl, &e.attr, Generation(0)),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn reply_attr(reply: ReplyAttr, op: &str, r: crate::remote::Result<Attributes>) {
    match r {
        Ok(a) => reply.attr(&a.ttl, &a.attr),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn reply_opened(reply: ReplyOpen, op: &str, r: crate::remote::Result<Opened>) {
    match r {
        Ok(o) => reply.opened(
            FileHandle(o.fh),
            match o.pages {
                KernelPages::Keep => FopenFlags::FOPEN_KEEP_CACHE,
                KernelPages::Drop => FopenFlags::empty(),
                KernelPages::Bypass => FopenFlags::FOPEN_DIRECT_IO,
            },
        ),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn reply_written(reply: ReplyWrite, op: &str, r: crate::remote::Result<u32>) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(fail(op, &e)),
    }
}

/// An xattr value or name list, or its size when the caller asks with no buffer.
fn reply_xattr(reply: ReplyXattr, size: u32, op: &str, r: crate::remote::Result<Vec<u8>>) {
    match r {
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(fail(op, &e)),
    }
}

fn name_bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

fn node(ino: INodeNo) -> NodeId {
    NodeId(ino.0)
}

impl SbxFs {
    /// Who is asking, as the permission checks see them.
    fn caller(&self, req: &Request) -> Caller {
        self.fs.caller(req.uid(), req.gid(), req.pid())
    }

    /// Run `op` on the runtime, in a span naming the request, and reply from there.
    fn spawn<F>(&self, op: &'static str, node: u64, f: impl FnOnce(Arc<GatedFs>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.fs.count_request(op);
        let span = tracing::debug_span!("fuse", op, node);
        self.rt.spawn(f(self.fs.clone()).instrument(span));
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
        // A file opened while the sandbox rewrites it bypasses the page cache
        // (`KernelPages::Bypass`); mapping it must still work (`MAP_SHARED` too: Python's mmap).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // ioctls on directories too: `sbxfs grep` asks the directory it stands in. O_TRUNC in
        // OPEN itself: a SETATTR of the size is then always an explicit truncate.
        let _ = config.add_capabilities(
            fuser::InitFlags::FUSE_HAS_IOCTL_DIR | fuser::InitFlags::FUSE_ATOMIC_O_TRUNC,
        );
        // The sandbox drops setuid/setgid bits itself (new content, truncate, chown there),
        // and the mount is nosuid: the kernel then marks a file it found without them
        // `S_NOSEC` and stops asking for `security.capability` before every write (a request
        // to the daemon each, eleven per SQLite transaction).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2);
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
        use crate::control::{IOC_INFO, IOC_INFO_SIZE, IOC_QUERY, IOC_QUERY_SIZE};
        let reply_out = |reply: fuser::ReplyIoctl, r: crate::remote::Result<Vec<u8>>| match r {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(fail("ioctl", &e)),
        };
        if cmd != IOC_QUERY && cmd != IOC_INFO {
            reply.error(Errno::from_i32(libc::ENOTTY));
            return;
        }
        if let Err(e) = self.fs.may_query(req.uid()) {
            reply.error(fail("ioctl", &e));
            return;
        }
        if cmd == IOC_INFO {
            if !in_data.is_empty() || (out_size as usize) < IOC_INFO_SIZE {
                reply.error(Errno::EINVAL);
                return;
            }
            reply_out(reply, self.fs.info(node(ino)));
            return;
        }
        if (out_size as usize) != IOC_QUERY_SIZE {
            reply.error(Errno::EINVAL);
            return;
        }
        let (in_data, caller) = (in_data.to_vec(), req.pid());
        self.spawn("ioctl", ino.0, move |fs| async move {
            reply_out(reply, fs.query(node(ino), &in_data, caller).await)
        });
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if self.fs.is_echo(req.pid()) {
            let r = self.fs.echo_entry(node(parent), name.as_bytes(), false);
            return reply_entry(reply, "lookup", r);
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        let notes = self.notes.clone();
        self.spawn("lookup", parent.0, move |fs| async move {
            let r = fs.lookup(&caller, node(parent), &name).await;
            if let Ok(e) = &r {
                notes.after_reads_out(e.attr.ino.0).await;
            }
            reply_entry(reply, "lookup", r)
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(node(ino), nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if self.fs.is_echo(req.pid()) {
            return reply_attr(reply, "getattr", self.fs.echo_attributes(node(ino)));
        }
        let notes = self.notes.clone();
        self.spawn("getattr", ino.0, move |fs| async move {
            let r = fs.getattr(node(ino)).await;
            notes.after_reads_out(ino.0).await;
            reply_attr(reply, "getattr", r)
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
        if self.fs.is_echo(req.pid()) {
            return reply_attr(reply, "setattr", self.fs.echo_attributes(node(ino)));
        }
        let caller = self.caller(req);
        let set = SetAttrs {
            fh: fh.map(|f| f.0),
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        self.spawn("setattr", ino.0, move |fs| async move {
            reply_attr(reply, "setattr", fs.setattr(&caller, node(ino), set).await)
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        // The echo thread never follows a symlink: the sandbox chooses where it leads.
        if self.fs.is_echo(req.pid()) {
            let e = crate::remote::RemoteError::Perm("the echo thread follows no symlink".into());
            return reply_data(reply, "readlink", Err(e));
        }
        self.spawn("readlink", ino.0, move |fs| async move {
            reply_data(reply, "readlink", fs.readlink(node(ino)).await)
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
        if self.fs.is_echo(req.pid()) {
            let r = self.fs.echo_entry(node(parent), name.as_bytes(), true);
            return reply_entry(reply, "mkdir", r);
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("mkdir", parent.0, move |fs| async move {
            let r = fs.mkdir(&caller, node(parent), &name, mode & !umask).await;
            reply_entry(reply, "mkdir", r)
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
        if self.fs.is_echo(req.pid()) {
            let r = self.fs.echo_entry(node(parent), name.as_bytes(), true);
            return reply_entry(reply, "mknod", r);
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("mknod", parent.0, move |fs| async move {
            let r = fs
                .mknod(&caller, node(parent), &name, mode, umask, rdev)
                .await;
            reply_entry(reply, "mknod", r)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.fs.is_echo(req.pid()) {
            return match self.fs.echo_may_change(node(parent), name.as_bytes()) {
                true => reply.ok(),
                false => reply.error(Errno::EPERM),
            };
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("unlink", parent.0, move |fs| async move {
            reply_empty(
                reply,
                "unlink",
                fs.unlink(&caller, node(parent), &name).await,
            )
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.fs.is_echo(req.pid()) {
            return match self.fs.echo_may_change(node(parent), name.as_bytes()) {
                true => reply.ok(),
                false => reply.error(Errno::EPERM),
            };
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("rmdir", parent.0, move |fs| async move {
            reply_empty(reply, "rmdir", fs.rmdir(&caller, node(parent), &name).await)
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
        if self.fs.is_echo(req.pid()) {
            let r = self.fs.echo_entry(node(parent), link_name.as_bytes(), true);
            return reply_entry(reply, "symlink", r);
        }
        let (name, caller) = (name_bytes(link_name), self.caller(req));
        let target = target.as_os_str().as_bytes().to_vec();
        self.spawn("symlink", parent.0, move |fs| async move {
            let r = fs.symlink(&caller, node(parent), &name, &target).await;
            reply_entry(reply, "symlink", r)
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
        if self.fs.is_echo(req.pid()) {
            if !self.fs.echo_may_change(node(parent), name.as_bytes()) {
                return reply.error(Errno::EPERM);
            }
            self.fs.echo_renamed(
                (node(parent), name.as_bytes()),
                (node(newparent), newname.as_bytes()),
            );
            return reply.ok();
        }
        let (name, newname) = (name_bytes(name), name_bytes(newname));
        let caller = self.caller(req);
        self.spawn("rename", parent.0, move |fs| async move {
            let r = fs
                .rename(
                    &caller,
                    (node(parent), &name),
                    (node(newparent), &newname),
                    mode,
                )
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
        let (name, caller) = (name_bytes(newname), self.caller(req));
        self.spawn("link", ino.0, move |fs| async move {
            let r = fs.link(&caller, node(ino), node(newparent), &name).await;
            reply_entry(reply, "link", r)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.fs.is_echo(req.pid()) {
            return reply.opened(FileHandle(ECHO_FH), FopenFlags::FOPEN_KEEP_CACHE);
        }
        let caller = self.caller(req);
        self.spawn("open", ino.0, move |fs| async move {
            reply_opened(reply, "open", fs.open(&caller, node(ino), flags.0).await)
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
        let in_flight = self.notes.reading(ino.0, offset);
        self.spawn("read", ino.0, move |fs| async move {
            let r = fs.read(fh.0, offset, size).await;
            if r.as_ref().is_ok_and(|d| d.len() < size as usize) {
                // An end of file: told to the kernel in offset order (`kernel_notes`).
                in_flight.after_lower_reads().await;
            }
            reply_data(reply, "read", r);
            drop(in_flight);
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (data, tid) = (data.to_vec(), req.pid());
        self.spawn("write", ino.0, move |fs| async move {
            reply_written(reply, "write", fs.write(fh.0, offset, &data, tid).await)
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if fh.0 == ECHO_FH {
            return reply.ok();
        }
        let tid = req.pid();
        self.spawn("flush", ino.0, move |fs| async move {
            reply_empty(reply, "flush", fs.flush(fh.0, tid).await)
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
        if fh.0 == ECHO_FH {
            return reply.ok();
        }
        self.spawn("release", ino.0, move |fs| async move {
            fs.release(fh.0).await;
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
        if fh.0 == ECHO_FH {
            return reply.ok();
        }
        self.spawn("fsync", ino.0, move |fs| async move {
            reply_empty(reply, "fsync", fs.fsync(fh.0).await)
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let caller = self.caller(req);
        self.spawn("opendir", ino.0, move |fs| async move {
            match fs.opendir(&caller, node(ino)).await {
                // The listing the kernel keeps (its entries) stays until dropped.
                Ok(o) if o.pages == KernelPages::Keep => reply.opened(
                    FileHandle(o.fh),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
                ),
                r => reply_opened(reply, "opendir", r),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let caller = self.caller(req);
        let mask = mask.bits() as u32;
        self.spawn("access", ino.0, move |fs| async move {
            reply_empty(reply, "access", fs.access(&caller, node(ino), mask).await)
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
        self.fs.releasedir(fh.0);
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
        self.spawn("readdir", ino.0, move |fs| async move {
            match fs.readdir(fh.0, offset).await {
                Ok(listing) => {
                    for (ino, next, kind, name) in listing.iter() {
                        if reply.add(INodeNo(ino), next, kind, OsStr::from_bytes(name)) {
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
        self.spawn("statfs", ino.0, move |fs| async move {
            match fs.statfs().await {
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
        let (name, value, caller) = (name_bytes(name), value.to_vec(), self.caller(req));
        self.spawn("setxattr", ino.0, move |fs| async move {
            let r = fs.setxattr(&caller, node(ino), &name, &value, flags).await;
            reply_empty(reply, "setxattr", r)
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // The kernel asks for `security.capability` before the echo's truncate.
        if self.fs.is_echo(req.pid()) {
            return reply.error(Errno::from_i32(libc::ENODATA));
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        if let Some(r) = self.fs.getxattr_at_once(&caller, node(ino), &name) {
            self.fs.count_request("getxattr_at_once");
            return reply_xattr(reply, size, "getxattr", r);
        }
        self.spawn("getxattr", ino.0, move |fs| async move {
            let r = fs.getxattr(&caller, node(ino), &name).await;
            reply_xattr(reply, size, "getxattr", r)
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let caller = self.caller(req);
        self.spawn("listxattr", ino.0, move |fs| async move {
            let r = fs.listxattr(&caller, node(ino)).await;
            reply_xattr(reply, size, "listxattr", r)
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("removexattr", ino.0, move |fs| async move {
            let r = fs.removexattr(&caller, node(ino), &name).await;
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
        self.spawn("fallocate", ino.0, move |fs| async move {
            let r = fs.fallocate(node(ino), fh.0, (offset, length), mode).await;
            reply_empty(reply, "fallocate", r)
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.spawn("copy_file_range", ino_in.0, move |fs| async move {
            let r = fs
                .copy_file_range((fh_in.0, offset_in), (fh_out.0, offset_out), len)
                .await;
            let copied = r.is_ok();
            reply_written(reply, "copy_file_range", r);
            if copied {
                fs.copied_replied(node(ino_out));
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
        if self.fs.is_echo(req.pid()) {
            return match self.fs.echo_entry(node(parent), name.as_bytes(), true) {
                Ok(e) => reply.created(
                    &e.attr_ttl,
                    &e.attr,
                    Generation(0),
                    FileHandle(ECHO_FH),
                    FopenFlags::FOPEN_KEEP_CACHE,
                ),
                Err(e) => reply.error(fail("create", &e)),
            };
        }
        let (name, caller) = (name_bytes(name), self.caller(req));
        self.spawn("create", parent.0, move |fs| async move {
            match fs
                .create(&caller, node(parent), &name, (mode, umask), flags)
                .await
            {
                Ok(c) => {
                    reply.created(
                        &c.entry.attr_ttl,
                        &c.entry.attr,
                        Generation(0),
                        FileHandle(c.fh),
                        FopenFlags::empty(),
                    );
                    fs.created_replied(c.node);
                }
                Err(e) => reply.error(fail("create", &e)),
            }
        });
    }
}
