//! The agent's view of its workspace: every file operation confined to the root.
//!
//! Confinement is the kernel's, not string checks: every path is resolved from the root's file
//! descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, which refuses `..` above
//! the root, absolute paths, and symlinks that lead outside it, race-free. Operations on a name
//! (stat, unlink, mkdir, rename, symlink) open its parent that way and then act on the last
//! component with the `*at` calls, so a final symlink is never followed out of the root.
//!
//! Commits write a temp file in the target's own directory (unnamed, `O_TMPFILE`, where the
//! filesystem allows: a crash leaves nothing behind), give it the target's mode and owner,
//! fsync it, check the base version once more, and rename it over the target. Named temps (the
//! fallback, and `edit` from the CLI) follow `.NAME.sbxfs-*.tmp`; the agent sweeps stale ones
//! at start-up.

use std::ffi::OsStr;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{
    self as rfs, AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, StatxFlags, Timespec, Timestamps,
};

use crate::remote::{
    Attr, DirEntry, FileKind, RemoteError, RemotePath, Result, StatFs, TreeEntry, Version,
    WireBytes,
};

/// Stripes of the per-target commit lock: commits to one file are serialised in the agent (so
/// its own base-version check cannot race itself); different files rarely share a stripe.
const COMMIT_LOCK_STRIPES: usize = 64;

pub struct Workspace {
    root: OwnedFd,
    root_path: PathBuf,
    commit_locks: Vec<tokio::sync::Mutex<()>>,
}

fn errno(e: rustix::io::Errno, path: &RemotePath) -> RemoteError {
    if e == rustix::io::Errno::XDEV {
        // openat2 says EXDEV when resolution would leave the root.
        return RemoteError::Access(format!(
            "{}: resolves outside the workspace",
            path.display()
        ));
    }
    RemoteError::from_errno(e.raw_os_error(), &path.display())
}

fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

fn ts_ns(t: rfs::StatxTimestamp) -> i64 {
    t.tv_sec.saturating_mul(1_000_000_000) + i64::from(t.tv_nsec)
}

fn version_of(st: &rfs::Statx) -> Version {
    // Not the ctime: a rename, chmod or link changes it but not the content, and a file
    // renamed while open must keep its base version.
    Version(format!(
        "{:x}:{:x}-{:x}-{:x}-{:x}",
        st.stx_dev_major,
        st.stx_dev_minor,
        st.stx_ino,
        st.stx_size,
        ts_ns(st.stx_mtime),
    ))
}

fn attr_of(st: &rfs::Statx, symlink_target: Option<Vec<u8>>) -> Attr {
    let fmt = u32::from(st.stx_mode) & libc::S_IFMT;
    let kind = match fmt {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Other,
    };
    Attr {
        kind,
        size: st.stx_size,
        mode: u32::from(st.stx_mode) & 0o7777,
        uid: st.stx_uid,
        gid: st.stx_gid,
        atime_ns: ts_ns(st.stx_atime),
        mtime_ns: ts_ns(st.stx_mtime),
        ctime_ns: ts_ns(st.stx_ctime),
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        nlink: u64::from(st.stx_nlink),
        rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
        symlink_target: symlink_target.map(WireBytes),
        version: version_of(st),
    }
}

const STATX_MASK: StatxFlags = StatxFlags::BASIC_STATS;

fn statx_fd(fd: impl AsFd) -> rustix::io::Result<rfs::Statx> {
    rfs::statx(fd, "", AtFlags::EMPTY_PATH, STATX_MASK)
}

fn statx_at(dir: impl AsFd, name: &[u8]) -> rustix::io::Result<rfs::Statx> {
    rfs::statx(dir, os(name), AtFlags::SYMLINK_NOFOLLOW, STATX_MASK)
}

fn unique_temp_name(name: &[u8]) -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    // Keep the temp's name within NAME_MAX whatever the target's name.
    let stem = &name[..name.len().min(200)];
    let mut out = b".".to_vec();
    out.extend_from_slice(stem);
    out.extend_from_slice(format!(".sbxfs-{:016x}.tmp", h.finish()).as_bytes());
    out
}

/// Is this a temp file name sbxfs writes (`.NAME.sbxfs-XXXX.tmp`)?
pub fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(b".") && name.ends_with(b".tmp") && name.windows(7).any(|w| w == b".sbxfs-")
}

/// A commit under way: the temp file being filled, and where it will go.
pub struct PreparedCommit {
    dir: OwnedFd,
    name: Vec<u8>,
    pub temp: File,
    /// `Some` for a named temp (to remove on failure); `None` for an unnamed `O_TMPFILE`.
    named_temp: Option<Vec<u8>>,
    target: RemotePath,
    base: Option<Version>,
    mode: u32,
    owner: Option<(u32, u32)>,
    done: bool,
}

impl Drop for PreparedCommit {
    fn drop(&mut self) {
        if !self.done {
            if let Some(t) = &self.named_temp {
                let _ = rfs::unlinkat(&self.dir, os(t), AtFlags::empty());
            }
        }
    }
}

impl Workspace {
    pub fn open(root: &Path) -> io::Result<Self> {
        let root_path = std::fs::canonicalize(root)?;
        let fd = rfs::open(
            &root_path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Workspace {
            root: fd,
            root_path,
            commit_locks: (0..COMMIT_LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        })
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Open `path` beneath the root (following symlinks that stay inside it).
    pub fn open_beneath(&self, path: &RemotePath, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        let p: &OsStr = if path.is_root() {
            OsStr::new(".")
        } else {
            os(path.as_bytes())
        };
        rfs::openat2(
            &self.root,
            p,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| errno(e, path))
    }

    /// The parent directory (opened for reading, so it can be fsynced) and the last name.
    fn parent<'p>(&self, path: &'p RemotePath) -> Result<(OwnedFd, &'p [u8])> {
        let (parent, name) = path.split_last().ok_or_else(|| {
            RemoteError::Invalid("the workspace root itself cannot be changed".into())
        })?;
        let dir = self.open_beneath(&parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok((dir, name))
    }

    /// The real path of an open file, checked to lie inside the root.
    pub fn real_path(&self, fd: &OwnedFd, path: &RemotePath) -> Result<PathBuf> {
        let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
        let real =
            std::fs::read_link(link).map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        if !real.starts_with(&self.root_path) {
            return Err(RemoteError::Access(format!(
                "{}: resolves outside the workspace",
                path.display()
            )));
        }
        Ok(real)
    }

    /// The workspace-relative path of a real path inside the root.
    fn relative(&self, real: &Path, path: &RemotePath) -> Result<RemotePath> {
        let rel = real.strip_prefix(&self.root_path).map_err(|_| {
            RemoteError::Access(format!("{}: outside the workspace", path.display()))
        })?;
        RemotePath::new(rel.as_os_str().as_bytes().to_vec())
    }

    /// Resolve `path` (following symlinks inside the root) to a real path for the search core.
    pub fn resolve(&self, path: &RemotePath) -> Result<PathBuf> {
        let fd = self.open_beneath(path, OFlags::PATH, Mode::empty())?;
        self.real_path(&fd, path)
    }

    pub fn stat(&self, path: &RemotePath) -> Result<Attr> {
        if path.is_root() {
            let st = statx_fd(&self.root).map_err(|e| errno(e, path))?;
            return Ok(attr_of(&st, None));
        }
        let (dir, name) = self.parent(path)?;
        self.stat_at(&dir, name, path)
    }

    fn stat_at(&self, dir: &OwnedFd, name: &[u8], path: &RemotePath) -> Result<Attr> {
        let st = statx_at(dir, name).map_err(|e| errno(e, path))?;
        let target = if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFLNK {
            Some(
                rfs::readlinkat(dir, os(name), Vec::new())
                    .map_err(|e| errno(e, path))?
                    .into_bytes(),
            )
        } else {
            None
        };
        Ok(attr_of(&st, target))
    }

    pub fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        let dir = self.open_beneath(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut names = Vec::new();
        for entry in rfs::Dir::read_from(&dir).map_err(|e| errno(e, path))? {
            let entry = entry.map_err(|e| errno(e, path))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let child = path.join(&name)?;
            match self.stat_at(&dir, &name, &child) {
                Ok(attr) => out.push(DirEntry {
                    name: WireBytes(name),
                    attr,
                }),
                // Removed between readdir and stat: it is simply gone.
                Err(RemoteError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Every entry under `path`, depth first and sorted, handed to `emit` until it says stop.
    pub fn tree(&self, path: &RemotePath, emit: &mut dyn FnMut(TreeEntry) -> bool) -> Result<()> {
        let mut stack = vec![path.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match self.list(&dir) {
                Ok(e) => e,
                // A directory removed while we walk: skip it.
                Err(RemoteError::NotFound(_)) if dir != *path => continue,
                Err(e) => return Err(e),
            };
            let mut subdirs = Vec::new();
            for e in entries {
                let child = dir.join(&e.name.0)?;
                if e.attr.kind == FileKind::Dir {
                    subdirs.push(child.clone());
                }
                if !emit(TreeEntry {
                    path: WireBytes(child.as_bytes().to_vec()),
                    attr: e.attr,
                }) {
                    return Ok(());
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// Read up to `len` bytes at `offset`, with the version they came from. A file changed in
    /// place during the read is read again, so bytes and version agree.
    pub fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<(Vec<u8>, Version)> {
        let fd = self.open_beneath(path, OFlags::RDONLY, Mode::empty())?;
        let file = File::from(fd);
        for _ in 0..3 {
            let before = statx_fd(&file).map_err(|e| errno(e, path))?;
            if u32::from(before.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
                return Err(RemoteError::IsDir(path.display()));
            }
            let want = (len as u64).min(before.stx_size.saturating_sub(offset)) as usize;
            let mut buf = vec![0u8; want];
            let mut got = 0;
            while got < want {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(RemoteError::from_io(&e, &path.display())),
                }
            }
            buf.truncate(got);
            let after = statx_fd(&file).map_err(|e| errno(e, path))?;
            if version_of(&before) == version_of(&after) {
                return Ok((buf, version_of(&after)));
            }
        }
        Err(RemoteError::Io(
            path.display(),
            "the file kept changing while it was read".into(),
        ))
    }

    /// The lock serialising commits to one target.
    pub fn commit_lock(&self, path: &RemotePath) -> &tokio::sync::Mutex<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        path.hash(&mut h);
        &self.commit_locks[(h.finish() as usize) % COMMIT_LOCK_STRIPES]
    }

    /// The file a commit to `path` replaces: `path` itself, or a symlink's target (the link
    /// stays a link), as a workspace path.
    pub fn commit_target(&self, path: &RemotePath) -> Result<RemotePath> {
        match self.open_beneath(path, OFlags::PATH, Mode::empty()) {
            Ok(fd) => {
                let real = self.real_path(&fd, path)?;
                self.relative(&real, path)
            }
            Err(RemoteError::NotFound(_)) => Ok(path.clone()),
            Err(e) => Err(e),
        }
    }

    /// Start a commit to `target` (from [`Workspace::commit_target`]): check the base version,
    /// create the temp file; for a patch, fill it with a copy of the base (reflinked where the
    /// filesystem can).
    pub fn prepare_commit(
        &self,
        target: &RemotePath,
        base: Option<Version>,
        create_mode: Option<u32>,
        copy_base: bool,
    ) -> Result<PreparedCommit> {
        let (dir, name) = self.parent(target)?;
        let current = match statx_at(&dir, name) {
            Ok(st) => Some(st),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(errno(e, target)),
        };
        if let Some(st) = &current {
            if u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFREG {
                return Err(RemoteError::IsDir(format!(
                    "{}: not a regular file",
                    target.display()
                )));
            }
        }
        check_base(target, base.as_ref(), current.as_ref())?;
        if copy_base && current.is_none() {
            return Err(RemoteError::Invalid(format!(
                "{}: a patch needs an existing base file",
                target.display()
            )));
        }
        let mode = current.as_ref().map_or(create_mode.unwrap_or(0o644), |st| {
            u32::from(st.stx_mode) & 0o7777
        });
        let owner = current.as_ref().map(|st| (st.stx_uid, st.stx_gid));
        let (temp, named_temp) = self.create_temp(&dir, name, target)?;
        let temp = File::from(temp);
        let prepared = PreparedCommit {
            dir,
            name: name.to_vec(),
            temp,
            named_temp,
            target: target.clone(),
            base,
            mode,
            owner,
            done: false,
        };
        if copy_base {
            let src = rfs::openat(
                &prepared.dir,
                os(name),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| errno(e, target))?;
            copy_all(&src, &prepared.temp)
                .map_err(|e| RemoteError::from_io(&e, &target.display()))?;
            // The copy must be of the base version: check again now that it is made.
            let st = statx_fd(&src).map_err(|e| errno(e, target))?;
            check_base(target, prepared.base.as_ref(), Some(&st))?;
        }
        Ok(prepared)
    }

    fn create_temp(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        target: &RemotePath,
    ) -> Result<(OwnedFd, Option<Vec<u8>>)> {
        match rfs::openat(
            dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => return Ok((fd, None)),
            Err(
                rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL | rustix::io::Errno::ISDIR,
            ) => {}
            Err(e) => return Err(errno(e, target)),
        }
        loop {
            let temp = unique_temp_name(name);
            match rfs::openat(
                dir,
                os(&temp),
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => return Ok((fd, Some(temp))),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(errno(e, target)),
            }
        }
    }

    /// Finish a commit: mode, owner, fsync, the last base check, then the rename.
    pub fn finish_commit(&self, mut c: PreparedCommit) -> Result<Attr> {
        let t = c.target.clone();
        let io_err = |e: rustix::io::Errno| errno(e, &t);
        rfs::fchmod(&c.temp, Mode::from_raw_mode(c.mode)).map_err(io_err)?;
        if let Some((uid, gid)) = c.owner {
            // Only root can give a file away; otherwise it becomes ours, like an editor's save.
            let _ = rfs::fchown(
                &c.temp,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            );
        }
        rfs::fsync(&c.temp).map_err(io_err)?;
        let current = match statx_at(&c.dir, &c.name) {
            Ok(st) => Some(st),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(io_err(e)),
        };
        check_base(&c.target, c.base.as_ref(), current.as_ref())?;
        let temp_name = match &c.named_temp {
            Some(n) => n.clone(),
            None => {
                let n = unique_temp_name(&c.name);
                let proc_path =
                    format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&c.temp));
                rfs::linkat(
                    rfs::CWD,
                    proc_path.as_str(),
                    &c.dir,
                    os(&n),
                    AtFlags::SYMLINK_FOLLOW,
                )
                .map_err(io_err)?;
                c.named_temp = Some(n.clone());
                n
            }
        };
        rfs::renameat(&c.dir, os(&temp_name), &c.dir, os(&c.name)).map_err(io_err)?;
        c.done = true;
        let _ = rfs::fsync(&c.dir);
        self.stat_at(&c.dir, &c.name, &c.target)
    }

    pub fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        rfs::openat(
            &dir,
            os(name),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode & 0o7777),
        )
        .map_err(|e| errno(e, path))?;
        self.stat_at(&dir, name, path)
    }

    pub fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        rfs::mkdirat(&dir, os(name), Mode::from_raw_mode(mode & 0o7777))
            .map_err(|e| errno(e, path))?;
        self.stat_at(&dir, name, path)
    }

    pub fn unlink(&self, path: &RemotePath) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        rfs::unlinkat(&dir, os(name), AtFlags::empty()).map_err(|e| errno(e, path))
    }

    pub fn rmdir(&self, path: &RemotePath) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        rfs::unlinkat(&dir, os(name), AtFlags::REMOVEDIR).map_err(|e| errno(e, path))
    }

    pub fn rename(&self, from: &RemotePath, to: &RemotePath, no_replace: bool) -> Result<()> {
        let (from_dir, from_name) = self.parent(from)?;
        let (to_dir, to_name) = self.parent(to)?;
        let flags = if no_replace {
            RenameFlags::NOREPLACE
        } else {
            RenameFlags::empty()
        };
        rfs::renameat_with(&from_dir, os(from_name), &to_dir, os(to_name), flags).map_err(|e| {
            if e == rustix::io::Errno::EXIST || e == rustix::io::Errno::NOTEMPTY {
                errno(e, to)
            } else {
                errno(e, from)
            }
        })
    }

    pub fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(RemoteError::Invalid(
                "symlink target is empty or has a NUL".into(),
            ));
        }
        let (dir, name) = self.parent(path)?;
        rfs::symlinkat(os(target), &dir, os(name)).map_err(|e| errno(e, path))?;
        self.stat_at(&dir, name, path)
    }

    pub fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let (dir, name) = self.parent(path)?;
        rfs::readlinkat(&dir, os(name), Vec::new())
            .map(|t| t.into_bytes())
            .map_err(|e| errno(e, path))
    }

    pub fn setattr(&self, path: &RemotePath, set: &crate::remote::SetAttr) -> Result<Attr> {
        let fd = self.open_beneath(path, OFlags::PATH, Mode::empty())?;
        // An O_PATH descriptor names the inode; /proc/self/fd/N reaches it for the calls that
        // need a path (chmod, utimens) without resolving the user's path a second time.
        let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        if let Some(mode) = set.mode {
            rfs::chmodat(
                rfs::CWD,
                proc_path.as_str(),
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(|e| errno(e, path))?;
        }
        if let Some(size) = set.size {
            let w = self.open_beneath(path, OFlags::WRONLY, Mode::empty())?;
            rfs::ftruncate(&w, size).map_err(|e| errno(e, path))?;
        }
        if set.atime_ns.is_some() || set.mtime_ns.is_some() {
            let ts = |ns: Option<i64>| match ns {
                Some(ns) => Timespec {
                    tv_sec: ns.div_euclid(1_000_000_000),
                    tv_nsec: ns.rem_euclid(1_000_000_000) as _,
                },
                None => Timespec {
                    tv_sec: 0,
                    tv_nsec: rfs::UTIME_OMIT as _,
                },
            };
            let times = Timestamps {
                last_access: ts(set.atime_ns),
                last_modification: ts(set.mtime_ns),
            };
            rfs::utimensat(rfs::CWD, proc_path.as_str(), &times, AtFlags::empty())
                .map_err(|e| errno(e, path))?;
        }
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        let target = if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFLNK {
            Some(self.readlink(path)?)
        } else {
            None
        };
        Ok(attr_of(&st, target))
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let s = rfs::fstatvfs(&self.root).map_err(|e| errno(e, &RemotePath::root()))?;
        Ok(StatFs {
            block_size: s.f_frsize,
            blocks: s.f_blocks,
            blocks_free: s.f_bfree,
            blocks_available: s.f_bavail,
            files: s.f_files,
            files_free: s.f_ffree,
            name_max: s.f_namemax,
        })
    }

    /// Open a regular file for a query (scan, edit), with its version.
    pub fn open_file(&self, path: &RemotePath) -> Result<(File, Attr)> {
        let fd = self.open_beneath(path, OFlags::RDONLY, Mode::empty())?;
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
            return Err(RemoteError::IsDir(path.display()));
        }
        Ok((File::from(fd), attr_of(&st, None)))
    }

    /// Remove stale named temp files left by a crash. Returns how many were removed.
    pub fn sweep_stale_temps(&self) -> usize {
        let mut removed = 0;
        let mut stack = vec![self.root_path.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let Ok(ft) = e.file_type() else { continue };
                let name = e.file_name().into_vec();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file()
                    && is_temp_name(&name)
                    && std::fs::remove_file(e.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }
}

fn check_base(
    path: &RemotePath,
    base: Option<&Version>,
    current: Option<&rfs::Statx>,
) -> Result<()> {
    let Some(base) = base else { return Ok(()) };
    let now = current.map(version_of);
    if now.as_ref() != Some(base) {
        return Err(RemoteError::Conflict {
            path: path.display(),
            base: base.0.clone(),
            current: now.map_or_else(|| "(removed)".to_string(), |v| v.0),
        });
    }
    Ok(())
}

/// Copy a whole file, with `copy_file_range` (a reflink on filesystems that share extents).
fn copy_all(src: &OwnedFd, dst: &File) -> io::Result<()> {
    let mut off_in = 0u64;
    let mut off_out = 0u64;
    loop {
        match rfs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), 1 << 30) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(
                rustix::io::Errno::XDEV | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP,
            ) if off_in == 0 => {
                let mut r = File::from(src.try_clone()?);
                let mut w = dst.try_clone()?;
                io::copy(&mut r.by_ref(), &mut w)?;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}
