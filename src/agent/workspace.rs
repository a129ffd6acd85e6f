//! The agent's view of its workspace: every file operation confined to the root.
//!
//! Confinement is the kernel's, not string checks: every path is resolved from the root's file
//! descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, which refuses `..` above
//! the root, absolute paths, and symlinks that lead outside it, race-free. Operations on a name
//! (stat, unlink, mkdir, rename, symlink) open its parent that way and then act on the last
//! component with the `*at` calls, so a final symlink is never followed out of the root.
//!
//! Paths longer than one `openat2` may take (PATH_MAX) are walked in chunks of whole
//! components, each chunk resolved with the same flags from the directory the previous one
//! opened, so a tree deeper than PATH_MAX below the root works and every step stays confined.
//! (A symlink met inside such a long path resolves beneath its chunk's directory: a target
//! climbing above it with `..` is refused even where it would stay inside the root.)
//!
//! Commits write a temp file in the target's own directory (unnamed, `O_TMPFILE`, where the
//! filesystem allows: a crash leaves nothing behind), give it the target's mode and owner,
//! fsync it, check the base version once more, and rename it over the target. Named temps (the
//! fallback, and `edit` from the CLI) follow `.NAME.sbxfs-*.tmp`; the agent sweeps stale ones
//! at start-up. A target with other hard links is the exception: a rename would cut it off
//! from them, so its new content (assembled in the temp file all the same) is copied into the
//! existing inode after the base check. That keeps the links but gives up atomicity: readers
//! may see the file empty or half copied while the copy runs, and a crash during it leaves it
//! so. An upload that fails still never touches the file.
//!
//! Files are read (read, scan, edit, copies) only when they are regular: the path is opened
//! `O_PATH` first, checked with `fstat`, and only then reopened for reading, so a FIFO or a
//! device in the workspace is never opened (a FIFO would block a worker thread forever).
//!
//! Modes are exact: the agent runs with umask 0 ([`set_exact_modes`]), and every call that
//! creates something sets the mode it was asked for afterwards if the kernel changed it (a
//! set-group-ID directory passes its bit on).

use std::ffi::OsStr;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{
    self as rfs, AtFlags, FallocateFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags,
    StatxFlags, Timespec, Timestamps,
};

use crate::remote::{
    Attr, DirEntry, FileKind, RemoteError, RemotePath, RenameMode, Result, SetAttr, SpecialKind,
    StatFs, TreeEntry, Version, WireBytes, XattrFlags, MAX_XATTR_NAME_BYTES, MAX_XATTR_VALUE_BYTES,
};

use crate::search::beneath::path_chunks;

/// Make the process's umask 0, so that `create`, `mkdir`, `mknod` and commits give exactly the
/// mode asked for (the modes the mount sends already carry the caller's umask). Called once
/// at agent start, before any request is served; the agent creates nothing else.
pub fn set_exact_modes() {
    rustix::process::umask(Mode::empty());
}

/// Stripes of the per-target commit lock: commits to one file are serialised in the agent (so
/// its own base-version check cannot race itself); different files rarely share a stripe.
const COMMIT_LOCK_STRIPES: usize = 64;

pub struct Workspace {
    root: OwnedFd,
    root_path: PathBuf,
    commit_locks: Vec<tokio::sync::Mutex<()>>,
    /// Keep set-user-ID and set-group-ID bits on files ([`Workspace::allow_setid`]).
    allow_setid: bool,
    /// Whose commit each named temp carries, for the change feed ([`super::watch::Authors`]).
    authors: std::sync::Arc<super::watch::Authors>,
    /// Files kept open for the mounts reading them ([`Workspace::read_held`]).
    held: super::held::HeldFiles,
}

/// The set-user-ID and set-group-ID bits.
const SETID_BITS: u32 = 0o6000;

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
    // Saturating: a file dated past the year 2262 must not overflow (and panic) here.
    t.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(i64::from(t.tv_nsec))
}

fn is_kind(st: &rfs::Statx, fmt: u32) -> bool {
    u32::from(st.stx_mode) & libc::S_IFMT == fmt
}

fn not_regular(path: &RemotePath) -> RemoteError {
    RemoteError::Invalid(format!("{}: not a regular file", path.display()))
}

/// `/proc/self/fd/N`: names an open descriptor's inode for the calls that only take a path.
fn proc_fd(fd: &impl std::os::fd::AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The birth time, 0 where the filesystem keeps none.
fn born_ns(st: &rfs::Statx) -> i64 {
    if StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::BTIME) {
        ts_ns(st.stx_btime)
    } else {
        0
    }
}

fn version_of(st: &rfs::Statx) -> Version {
    // Not the ctime: a rename, chmod or link changes it but not the content, and a file
    // renamed while open must keep its base version. The birth time tells apart two files
    // that had the same inode number in turn (the same form as `treepack::derived_version`).
    crate::remote::treepack::version_from(
        libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
        st.stx_size,
        ts_ns(st.stx_mtime),
        born_ns(st),
    )
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
        born_ns: born_ns(st),
        nlink: u64::from(st.stx_nlink),
        rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
        symlink_target: symlink_target.map(WireBytes),
        version: version_of(st),
        has_xattrs: None,
    }
}

/// Whether a list of attribute names this long has any; an error (a filesystem without
/// xattrs answers `EOPNOTSUPP`, not "none") leaves it unknown, for the mount to ask.
fn any_xattrs(listed: rustix::io::Result<usize>) -> Option<bool> {
    listed.ok().map(|len| len > 0)
}

const STATX_MASK: StatxFlags = StatxFlags::BASIC_STATS.union(StatxFlags::BTIME);

fn statx_fd(fd: impl AsFd) -> rustix::io::Result<rfs::Statx> {
    rfs::statx(fd, "", AtFlags::EMPTY_PATH, STATX_MASK)
}

fn statx_at(dir: impl AsFd, name: &[u8]) -> rustix::io::Result<rfs::Statx> {
    rfs::statx(dir, os(name), AtFlags::SYMLINK_NOFOLLOW, STATX_MASK)
}

/// What marks the agent's own named temps: `.NAME` + this + 32 hex digits + `.tmp`. Long and
/// exact, so that the start-up sweep never takes a user's file (`.x.sbxfs-1.tmp`) for one.
const TEMP_MARK: &[u8] = b".sbxfs-agent-";
const TEMP_TAG_HEX: usize = 32;
const TEMP_SUFFIX: &[u8] = b".tmp";

fn unique_temp_name(name: &[u8]) -> Vec<u8> {
    use std::hash::BuildHasher;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS per process: two agents never share a tag.
    let seed = std::collections::hash_map::RandomState::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tag = (
        seed.hash_one((std::process::id(), n, 1u8)),
        seed.hash_one((std::time::SystemTime::now(), n, 2u8)),
    );
    // Keep the temp's name within NAME_MAX whatever the target's name.
    let stem = &name[..name.len().min(200)];
    let mut out = b".".to_vec();
    out.extend_from_slice(stem);
    out.extend_from_slice(TEMP_MARK);
    out.extend_from_slice(format!("{:016x}{:016x}", tag.0, tag.1).as_bytes());
    out.extend_from_slice(TEMP_SUFFIX);
    out
}

/// Is this exactly a temp file name the agent writes (`.NAME.sbxfs-agent-<32 hex>.tmp`)?
pub fn is_temp_name(name: &[u8]) -> bool {
    let tail = TEMP_MARK.len() + TEMP_TAG_HEX + TEMP_SUFFIX.len();
    if name.len() < 2 + tail || name[0] != b'.' || !name.ends_with(TEMP_SUFFIX) {
        return false;
    }
    let rest = &name[name.len() - tail..];
    let hex = &rest[TEMP_MARK.len()..TEMP_MARK.len() + TEMP_TAG_HEX];
    rest.starts_with(TEMP_MARK)
        && hex
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
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
    /// The modification time the content gets (else the commit's time).
    mtime_ns: Option<i64>,
    /// The access time it gets (else the sandbox's).
    atime_ns: Option<i64>,
    /// The client the commit is for ([`crate::remote::wire::CLIENT_HEADER`]).
    author: Option<u64>,
    done: bool,
}

impl PreparedCommit {
    /// The commit is for this client: the change feed tells that client it is its own.
    pub fn set_author(&mut self, client: Option<u64>) {
        self.author = client;
    }

    /// Give the new content these access and modification times (ns since the epoch).
    pub fn set_times(&mut self, atime_ns: Option<i64>, mtime_ns: Option<i64>) {
        self.atime_ns = atime_ns;
        self.mtime_ns = mtime_ns;
    }
}

/// Set the times given of an open file (the others left as they are); nothing when none is.
fn set_times(
    fd: &impl rustix::fd::AsFd,
    atime_ns: Option<i64>,
    mtime_ns: Option<i64>,
) -> rustix::io::Result<()> {
    if atime_ns.is_none() && mtime_ns.is_none() {
        return Ok(());
    }
    rfs::futimens(fd, &timestamps(atime_ns, mtime_ns))
}

/// The times to set, each left as it is where `None` (`UTIME_OMIT`).
fn timestamps(atime_ns: Option<i64>, mtime_ns: Option<i64>) -> Timestamps {
    let at = |ns: Option<i64>| match ns {
        Some(ns) => Timespec {
            tv_sec: ns.div_euclid(1_000_000_000),
            tv_nsec: ns.rem_euclid(1_000_000_000) as _,
        },
        None => Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_OMIT as _,
        },
    };
    Timestamps {
        last_access: at(atime_ns),
        last_modification: at(mtime_ns),
    }
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
            allow_setid: false,
            authors: Default::default(),
            held: Default::default(),
        })
    }

    /// Where commits record their client, for the change feed to read.
    pub fn authors(&self) -> std::sync::Arc<super::watch::Authors> {
        self.authors.clone()
    }

    /// Keep set-user-ID and set-group-ID bits that requests ask for (`--allow-setid`). Off by
    /// default: whoever holds the token must not be able to make a setuid-root program when
    /// the agent runs as root.
    pub fn allow_setid(mut self, allow: bool) -> Self {
        self.allow_setid = allow;
        self
    }

    /// The permission bits a request may set: `mode & 0o7777`, less the set-ID bits unless
    /// allowed. A directory keeps set-group-ID (it only makes new entries inherit the group;
    /// nothing runs with it).
    fn permitted_mode(&self, mode: u32, dir: bool) -> u32 {
        let mode = mode & 0o7777;
        match (self.allow_setid, dir) {
            (true, _) => mode,
            (false, true) => mode & !0o4000,
            (false, false) => mode & !SETID_BITS,
        }
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Open `path` beneath the root (following symlinks that stay inside it). A path longer
    /// than one call may take is opened chunk by chunk ([`path_chunks`]), each chunk's
    /// directory held open and the next resolved beneath it.
    pub fn open_beneath(&self, path: &RemotePath, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if path.is_root() {
            return rfs::openat2(&self.root, ".", flags | OFlags::CLOEXEC, mode, how)
                .map_err(|e| errno(e, path));
        }
        let chunks = path_chunks(path.as_bytes());
        let (last, dirs) = chunks.split_last().expect("at least one chunk");
        let mut held: Option<OwnedFd> = None;
        for chunk in dirs {
            let from = held.as_ref().unwrap_or(&self.root);
            let next = rfs::openat2(
                from,
                os(chunk),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                how,
            )
            .map_err(|e| errno(e, path))?;
            held = Some(next);
        }
        let from = held.as_ref().unwrap_or(&self.root);
        rfs::openat2(from, os(last), flags | OFlags::CLOEXEC, mode, how).map_err(|e| errno(e, path))
    }

    /// Open a regular file for reading or writing without ever opening anything else: the
    /// path is opened `O_PATH` and checked first, so a FIFO (which would block) or a device
    /// is refused with "not a regular file", a directory with `IsDir`.
    pub fn open_regular(&self, path: &RemotePath, flags: OFlags) -> Result<(File, rfs::Statx)> {
        let fd = self.open_beneath(path, OFlags::PATH, Mode::empty())?;
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        if is_kind(&st, libc::S_IFDIR) {
            return Err(RemoteError::IsDir(path.display()));
        }
        if !is_kind(&st, libc::S_IFREG) {
            return Err(not_regular(path));
        }
        // Reopening the O_PATH descriptor's inode cannot reach another file; O_NONBLOCK and
        // O_NOCTTY are no-ops for a regular file, kept as a second guard.
        let file = rfs::open(
            proc_fd(&fd).as_str(),
            flags | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno(e, path))?;
        Ok((File::from(file), st))
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

    /// Where a search starts: `path` with its symlinks followed (inside the root), as a path
    /// relative to the root for [`crate::search::beneath::Beneath`]; a directory or a regular
    /// file, nothing else (a FIFO would block the search that opened it).
    pub fn search_root(&self, path: &RemotePath) -> Result<RemotePath> {
        let fd = self.open_beneath(path, OFlags::PATH, Mode::empty())?;
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        if !is_kind(&st, libc::S_IFDIR) && !is_kind(&st, libc::S_IFREG) {
            return Err(not_regular(path));
        }
        let real = self.real_path(&fd, path)?;
        self.relative(&real, path)
    }

    /// `path` with its symlinks followed (inside the root), relative to the root.
    pub fn resolve_relative(&self, path: &RemotePath) -> Result<RemotePath> {
        let real = self.resolve(path)?;
        self.relative(&real, path)
    }

    /// The root's descriptor: the searches open everything beneath it.
    pub fn root_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.root.as_fd()
    }

    pub fn stat(&self, path: &RemotePath) -> Result<Attr> {
        if path.is_root() {
            let st = statx_fd(&self.root).map_err(|e| errno(e, path))?;
            let mut attr = attr_of(&st, None);
            attr.has_xattrs = any_xattrs(rfs::flistxattr_query(&self.root));
            return Ok(attr);
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
        let mut attr = attr_of(&st, target);
        // The name's own attributes (never followed), through its parent's descriptor; a
        // size query only, one syscall.
        let mut p = proc_fd(dir).into_bytes();
        p.push(b'/');
        p.extend_from_slice(name);
        let p = PathBuf::from(std::ffi::OsString::from_vec(p));
        attr.has_xattrs = any_xattrs(rfs::llistxattr_query(&p));
        Ok(attr)
    }

    pub fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        self.list_each(path, &mut |e| {
            out.push(e);
            true
        })?;
        Ok(out)
    }

    /// Open the directory `path` (to fail with the right error before an answer streams).
    pub fn open_dir(&self, path: &RemotePath) -> Result<OwnedFd> {
        self.open_beneath(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    }

    /// The entries of `path` in name order, each handed to `emit` (with its attributes) until
    /// it says stop: only the names are held, never the whole listing.
    pub fn list_each(
        &self,
        path: &RemotePath,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let dir = self.open_dir(path)?;
        let mut names = Vec::new();
        for entry in rfs::Dir::read_from(&dir).map_err(|e| errno(e, path))? {
            let entry = entry.map_err(|e| errno(e, path))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        names.sort();
        for name in names {
            let child = path.join(&name)?;
            match self.stat_at(&dir, &name, &child) {
                Ok(attr) => {
                    let entry = DirEntry {
                        name: WireBytes(name),
                        attr,
                    };
                    if !emit(entry) {
                        return Ok(());
                    }
                }
                // Removed between readdir and stat: it is simply gone.
                Err(RemoteError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every entry under `path`, depth first and sorted, handed to `emit` until it says stop.
    pub fn tree(&self, path: &RemotePath, emit: &mut dyn FnMut(TreeEntry) -> bool) -> Result<()> {
        let mut stack = vec![path.clone()];
        while let Some(dir) = stack.pop() {
            let mut subdirs = Vec::new();
            let mut stopped = false;
            let mut bad_name = None;
            let listed = self.list_each(&dir, &mut |e| {
                let child = match dir.join(&e.name.0) {
                    Ok(c) => c,
                    Err(err) => {
                        bad_name = Some(err);
                        return false;
                    }
                };
                if e.attr.kind == FileKind::Dir {
                    subdirs.push(child.clone());
                }
                stopped = !emit(TreeEntry {
                    path: WireBytes(child.as_bytes().to_vec()),
                    attr: e.attr,
                });
                !stopped
            });
            match listed {
                Ok(()) => {}
                // A directory removed while we walk: skip it.
                Err(RemoteError::NotFound(_)) if dir != *path => continue,
                Err(e) => return Err(e),
            }
            if let Some(e) = bad_name {
                return Err(e);
            }
            if stopped {
                return Ok(());
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// Read up to `len` bytes at `offset`, with the version they came from.
    pub fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<(Vec<u8>, Version)> {
        let (file, _) = self.open_regular(path, OFlags::RDONLY)?;
        read_versioned(&file, path, offset, len)
    }

    /// Read as [`Workspace::read`], from the file that was at `path` at `version` if it is
    /// still held (even if renamed over or removed since); the file read is held for the
    /// next read.
    pub fn read_held(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
        version: &Version,
    ) -> Result<(Vec<u8>, Version)> {
        if let Some(file) = self.held.get(path, version, Instant::now()) {
            let (data, now) = read_versioned(&file, path, offset, len)?;
            if &now == version {
                return Ok((data, now));
            }
            // Changed in place since: what the path holds now is the answer.
            self.held.forget(path, version);
        }
        let (file, _) = self.open_regular(path, OFlags::RDONLY)?;
        let (data, now) = read_versioned(&file, path, offset, len)?;
        self.held
            .keep(path.clone(), now.clone(), Arc::new(file), Instant::now());
        Ok((data, now))
    }

    /// Let go of the files no mount has read for a while ([`super::held::HELD_IDLE`]).
    pub fn prune_held(&self) {
        self.held.prune(Instant::now());
    }
}

/// Tries of [`read_versioned`] before it answers bytes that may mix versions.
const READ_TRIES: u32 = 6;

/// Up to `len` bytes of `file` at `offset`, with their version. A file changed in place during
/// the read is read again, so bytes and version agree; a writer that keeps at it (a program
/// rewriting the file chunk by chunk while this thread waits for a CPU) is given a few
/// milliseconds more each time. If it never holds still, the last bytes read are answered, as
/// a local disk answers a reader racing a writer, under a version no stat names
/// ([`Version::unsettled`]), so no cache keeps them as the file's.
fn read_versioned(
    file: &File,
    path: &RemotePath,
    offset: u64,
    len: u32,
) -> Result<(Vec<u8>, Version)> {
    let mut attempt = 0;
    loop {
        let before = statx_fd(file).map_err(|e| errno(e, path))?;
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
        let after = statx_fd(file).map_err(|e| errno(e, path))?;
        if version_of(&before) == version_of(&after) {
            return Ok((buf, version_of(&after)));
        }
        attempt += 1;
        if attempt == READ_TRIES {
            return Ok((buf, Version::unsettled(&version_of(&after))));
        }
        if attempt >= 2 {
            std::thread::sleep(Duration::from_millis(1 << (attempt - 2)));
        }
    }
}

impl Workspace {
    /// The lock serialising commits to one target.
    pub fn commit_lock(&self, path: &RemotePath) -> &tokio::sync::Mutex<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        path.hash(&mut h);
        &self.commit_locks[(h.finish() as usize) % COMMIT_LOCK_STRIPES]
    }

    /// The file a commit to `path` replaces: `path` itself, or a symlink's target (the link
    /// stays a link), as a workspace path.
    pub fn commit_target(&self, path: &RemotePath) -> Result<RemotePath> {
        let fd = match self.open_beneath(path, OFlags::PATH, Mode::empty()) {
            Ok(fd) => fd,
            Err(RemoteError::NotFound(_)) => return Ok(path.clone()),
            Err(e) => return Err(e),
        };
        match self
            .real_path(&fd, path)
            .and_then(|real| self.relative(&real, path))
        {
            Ok(target) => Ok(target),
            // Deeper than the kernel can name (/proc answers ENAMETOOLONG past PATH_MAX): a
            // path whose last component is not a symlink is its own target.
            Err(RemoteError::NameTooLong(_)) if self.stat(path)?.kind != FileKind::Symlink => {
                Ok(path.clone())
            }
            Err(e) => Err(e),
        }
    }

    /// Start a commit to `target` (from [`Workspace::commit_target`]): check the base version,
    /// create the temp file; with `copy_base = Some(cut)`, fill it with the base's first
    /// `min(cut, size)` bytes (holes stay holes; reflinked where the filesystem can).
    pub fn prepare_commit(
        &self,
        target: &RemotePath,
        base: Option<Version>,
        create_mode: Option<u32>,
        copy_base: Option<u64>,
    ) -> Result<PreparedCommit> {
        let (dir, name) = self.parent(target)?;
        let current = match statx_at(&dir, name) {
            Ok(st) => Some(st),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(errno(e, target)),
        };
        if let Some(st) = &current {
            if is_kind(st, libc::S_IFDIR) {
                return Err(RemoteError::IsDir(target.display()));
            }
            if !is_kind(st, libc::S_IFREG) {
                return Err(not_regular(target));
            }
        }
        check_base(target, base.as_ref(), current.as_ref())?;
        // A patch cut to nothing (a new sparse file's) starts from an empty temp instead.
        let copy_base = copy_base.filter(|&cut| cut > 0);
        if copy_base.is_some() && current.is_none() {
            return Err(RemoteError::NotFound(format!(
                "{}: a patch needs an existing base file",
                target.display()
            )));
        }
        let mode = self.permitted_mode(
            current
                .as_ref()
                .map_or(create_mode.unwrap_or(0o644), |st| u32::from(st.stx_mode)),
            false,
        );
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
            mtime_ns: None,
            atime_ns: None,
            author: None,
            done: false,
        };
        if let Some(cut) = copy_base {
            let src = rfs::openat(
                &prepared.dir,
                os(name),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| errno(e, target))?;
            let st = statx_fd(&src).map_err(|e| errno(e, target))?;
            // The copy must be of the base version (checked once more after it is made).
            check_base(target, prepared.base.as_ref(), Some(&st))?;
            if !is_kind(&st, libc::S_IFREG) {
                return Err(not_regular(target));
            }
            copy_sparse(&src, &prepared.temp, st.stx_size.min(cut))
                .map_err(|e| RemoteError::from_io(&e, &target.display()))?;
            let st = statx_fd(&src).map_err(|e| errno(e, target))?;
            check_base(target, prepared.base.as_ref(), Some(&st))?;
        }
        Ok(prepared)
    }

    /// Copy `len` bytes of `src` at `src_offset` into a prepared commit's temp file at
    /// `dst_offset` (in the sandbox: no bytes cross the network). Answers the bytes copied,
    /// fewer when `src` ends first.
    pub fn copy_into(
        &self,
        c: &PreparedCommit,
        src: &RemotePath,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let (src_file, _) = self.open_regular(src, OFlags::RDONLY)?;
        let copied = copy_range_keeping_holes(&src_file, src_offset, &c.temp, dst_offset, len)
            .map_err(|e| RemoteError::from_io(&e, &c.target.display()))?;
        Ok(copied)
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

    /// Finish a commit: mode, owner, fsync, the last base check, then the rename; or, for a
    /// target with other hard links, the last base check and a copy into the target itself
    /// (see the module notes for what that trades away).
    pub fn finish_commit(&self, mut c: PreparedCommit) -> Result<Attr> {
        let t = c.target.clone();
        let io_err = |e: rustix::io::Errno| errno(e, &t);
        let current = match statx_at(&c.dir, &c.name) {
            Ok(st) => Some(st),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(io_err(e)),
        };
        if let Some(st) = current.as_ref().filter(|st| st.stx_nlink > 1) {
            return self.finish_in_place(&c, st);
        }
        if let Some((uid, gid)) = c.owner {
            // Only root can give a file away; otherwise it becomes ours, like an editor's save.
            // The owner first: a chown clears set-ID bits, so the mode is set after it.
            let _ = rfs::fchown(
                &c.temp,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            );
        }
        if current.is_some() {
            // The new content keeps the file's extended attributes (and ACLs: before the
            // mode, which then sets the same bits again), as a write in place would.
            self.copy_xattrs(&c.dir, &c.name, &c.temp);
        }
        rfs::fchmod(&c.temp, Mode::from_raw_mode(c.mode)).map_err(io_err)?;
        set_times(&c.temp, c.atime_ns, c.mtime_ns).map_err(io_err)?;
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
                rfs::linkat(
                    rfs::CWD,
                    proc_fd(&c.temp).as_str(),
                    &c.dir,
                    os(&n),
                    AtFlags::SYMLINK_FOLLOW,
                )
                .map_err(io_err)?;
                c.named_temp = Some(n.clone());
                n
            }
        };
        if let Some(client) = c.author {
            self.authors.record(&temp_name, client);
        }
        if c.base.as_ref().is_some_and(Version::is_absent) {
            // Create only: a file made in the sandbox since the check above is not replaced.
            rfs::renameat_with(
                &c.dir,
                os(&temp_name),
                &c.dir,
                os(&c.name),
                rfs::RenameFlags::NOREPLACE,
            )
            .map_err(|e| match e {
                rustix::io::Errno::EXIST => RemoteError::Conflict {
                    path: c.target.display(),
                    base: Version::absent().0,
                    current: "(created in the sandbox meanwhile)".into(),
                },
                e => io_err(e),
            })?;
        } else {
            rfs::renameat(&c.dir, os(&temp_name), &c.dir, os(&c.name)).map_err(io_err)?;
        }
        c.done = true;
        let _ = rfs::fsync(&c.dir);
        self.stat_at(&c.dir, &c.name, &c.target)
    }

    /// Copy the extended attributes of `dir/name` onto `to`, each as far as the sandbox lets
    /// the agent (one it may not set is left out). File capabilities are not kept unless
    /// set-ID bits are, as the kernel drops them on a write.
    fn copy_xattrs(&self, dir: &OwnedFd, name: &[u8], to: &File) {
        let mut p = proc_fd(dir).into_bytes();
        p.push(b'/');
        p.extend_from_slice(name);
        let from = PathBuf::from(std::ffi::OsString::from_vec(p));
        let mut names = vec![0u8; MAX_XATTR_VALUE_BYTES];
        let Ok(n) = rfs::llistxattr(&from, &mut names[..]) else {
            return;
        };
        let mut value = vec![0u8; MAX_XATTR_VALUE_BYTES];
        for attr in names[..n].split(|&b| b == 0).filter(|a| !a.is_empty()) {
            if attr == b"security.capability" && !self.allow_setid {
                continue;
            }
            if let Ok(len) = rfs::lgetxattr(&from, attr, &mut value[..]) {
                let _ = rfs::fsetxattr(to, attr, &value[..len], rfs::XattrFlags::empty());
            }
        }
    }

    /// The hard-linked target's commit: check the base on the very inode about to be written,
    /// then replace its content with the temp file's (holes kept). The temp is dropped after.
    fn finish_in_place(&self, c: &PreparedCommit, seen: &rfs::Statx) -> Result<Attr> {
        let t = &c.target;
        let io_err = |e: io::Error| RemoteError::from_io(&e, &t.display());
        let target = rfs::openat(
            &c.dir,
            os(&c.name),
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno(e, t))?;
        let st = statx_fd(&target).map_err(|e| errno(e, t))?;
        if (st.stx_ino, st.stx_dev_major, st.stx_dev_minor)
            != (seen.stx_ino, seen.stx_dev_major, seen.stx_dev_minor)
            || !is_kind(&st, libc::S_IFREG)
        {
            return Err(RemoteError::Conflict {
                path: t.display(),
                base: c.base.as_ref().map_or_else(String::new, |b| b.0.clone()),
                current: version_of(&st).0,
            });
        }
        check_base(t, c.base.as_ref(), Some(&st))?;
        let len = statx_fd(&c.temp).map_err(|e| errno(e, t))?.stx_size;
        let target = File::from(target);
        target.set_len(0).map_err(io_err)?;
        copy_sparse(&c.temp, &target, len).map_err(io_err)?;
        if u32::from(st.stx_mode) & 0o7777 != c.mode {
            // New content does not keep set-ID bits unless allowed (as the kernel does for a
            // write by anyone but root).
            rfs::fchmod(&target, Mode::from_raw_mode(c.mode)).map_err(|e| errno(e, t))?;
        }
        set_times(&target, c.atime_ns, c.mtime_ns).map_err(|e| errno(e, t))?;
        rfs::fsync(&target).map_err(|e| errno(e, t))?;
        self.stat_at(&c.dir, &c.name, t)
    }

    /// Create an empty file with exactly `mode`.
    pub fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        let mode = Mode::from_raw_mode(self.permitted_mode(mode, false));
        let fd = rfs::openat(
            &dir,
            os(name),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )
        .map_err(|e| errno(e, path))?;
        rfs::fchmod(&fd, mode).map_err(|e| errno(e, path))?;
        self.stat_at(&dir, name, path)
    }

    pub fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        let mode = self.permitted_mode(mode, true);
        rfs::mkdirat(&dir, os(name), Mode::from_raw_mode(mode)).map_err(|e| errno(e, path))?;
        // A directory made in a set-group-ID directory inherits that bit (and its group), as
        // the kernel gives it: the exact mode keeps it.
        let inherited = match statx_at(&dir, name) {
            Ok(st) if is_kind(&st, libc::S_IFDIR) => u32::from(st.stx_mode) & 0o2000,
            _ => 0,
        };
        self.exact_mode_at(&dir, name, path, mode | inherited)
    }

    /// Make a FIFO, a socket, or (when the agent may: `CAP_MKNOD`) a device, with exactly
    /// `mode`. A device the agent may not make is refused by the kernel with `EPERM`.
    pub fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        let mode = self.permitted_mode(mode, false);
        let (file_type, dev) = match kind {
            SpecialKind::Fifo => (FileType::Fifo, 0),
            SpecialKind::Socket => (FileType::Socket, 0),
            SpecialKind::CharDevice => (FileType::CharacterDevice, rdev),
            SpecialKind::BlockDevice => (FileType::BlockDevice, rdev),
        };
        rfs::mknodat(
            &dir,
            os(name),
            file_type,
            Mode::from_raw_mode(mode & 0o7777),
            dev as rfs::Dev,
        )
        .map_err(|e| errno(e, path))?;
        self.exact_mode_at(&dir, name, path, mode)
    }

    /// Give a just-made entry exactly `mode` if the kernel changed it (umask, or a set-group-ID
    /// parent), through an `O_PATH` descriptor of the entry itself (never a symlink in its
    /// place), and answer its attributes.
    fn exact_mode_at(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        path: &RemotePath,
        mode: u32,
    ) -> Result<Attr> {
        let fd = rfs::openat(
            dir,
            os(name),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno(e, path))?;
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        if u32::from(st.stx_mode) & 0o7777 != mode & 0o7777 && !is_kind(&st, libc::S_IFLNK) {
            rfs::chmodat(
                rfs::CWD,
                proc_fd(&fd).as_str(),
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(|e| errno(e, path))?;
        }
        self.stat_at(dir, name, path)
    }

    pub fn unlink(&self, path: &RemotePath) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        rfs::unlinkat(&dir, os(name), AtFlags::empty()).map_err(|e| errno(e, path))
    }

    pub fn rmdir(&self, path: &RemotePath) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        rfs::unlinkat(&dir, os(name), AtFlags::REMOVEDIR).map_err(|e| errno(e, path))
    }

    /// `renameat2`: replace, refuse an existing target, or swap the two names.
    pub fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        let (from_dir, from_name) = self.parent(from)?;
        let (to_dir, to_name) = self.parent(to)?;
        let flags = match mode {
            RenameMode::Replace => RenameFlags::empty(),
            RenameMode::NoReplace => RenameFlags::NOREPLACE,
            RenameMode::Exchange => RenameFlags::EXCHANGE,
        };
        rfs::renameat_with(&from_dir, os(from_name), &to_dir, os(to_name), flags).map_err(|e| {
            let to_missing = mode == RenameMode::Exchange
                && e == rustix::io::Errno::NOENT
                && statx_at(&to_dir, to_name).is_err();
            if e == rustix::io::Errno::EXIST || e == rustix::io::Errno::NOTEMPTY || to_missing {
                errno(e, to)
            } else {
                errno(e, from)
            }
        })
    }

    /// A hard link `new` to `existing` (the name itself: a final symlink is linked, not
    /// followed). Answers the attributes through the new name.
    pub fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        let (from_dir, from_name) = self.parent(existing)?;
        let (to_dir, to_name) = self.parent(new)?;
        rfs::linkat(
            &from_dir,
            os(from_name),
            &to_dir,
            os(to_name),
            AtFlags::empty(),
        )
        .map_err(|e| {
            if e == rustix::io::Errno::EXIST {
                errno(e, new)
            } else {
                errno(e, existing)
            }
        })?;
        self.stat_at(&to_dir, to_name, new)
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

    /// Change attributes of `path` itself (a final symlink is not followed: its own owner and
    /// times change; a mode on it is `Unsupported`, as Linux has no lchmod).
    pub fn setattr(&self, path: &RemotePath, set: &SetAttr) -> Result<Attr> {
        // The entry itself, held: for the root its descriptor, else the parent and the name.
        let held = if path.is_root() {
            None
        } else {
            Some(self.parent(path)?)
        };
        let fd = match &held {
            None => self.open_beneath(path, OFlags::PATH, Mode::empty())?,
            Some((dir, name)) => rfs::openat(
                dir,
                os(name),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| errno(e, path))?,
        };
        let st = statx_fd(&fd).map_err(|e| errno(e, path))?;
        let symlink = is_kind(&st, libc::S_IFLNK);
        // /proc/self/fd/N reaches the O_PATH descriptor's inode for the calls that need a path
        // (chmod, reopening to truncate) without resolving the user's path a second time.
        let proc_path = proc_fd(&fd);
        if set.uid.is_some() || set.gid.is_some() {
            // AT_EMPTY_PATH on the O_PATH descriptor: the entry itself, symlink or not. Before
            // any chmod: the kernel clears set-ID bits on a chown.
            rfs::chownat(
                &fd,
                "",
                set.uid.map(rustix::fs::Uid::from_raw),
                set.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::EMPTY_PATH,
            )
            .map_err(|e| errno(e, path))?;
        }
        if let Some(mode) = set.mode {
            if symlink {
                return Err(RemoteError::Unsupported(format!(
                    "{}: a symlink has no mode of its own",
                    path.display()
                )));
            }
            rfs::chmodat(
                rfs::CWD,
                proc_path.as_str(),
                Mode::from_raw_mode(self.permitted_mode(mode, is_kind(&st, libc::S_IFDIR))),
                AtFlags::empty(),
            )
            .map_err(|e| errno(e, path))?;
        }
        if let Some(size) = set.size {
            if size > i64::MAX as u64 {
                return Err(RemoteError::FileTooBig(path.display()));
            }
            let (w, _) = if symlink {
                // truncate(2) follows a symlink: so does this.
                self.open_regular(path, OFlags::WRONLY)?
            } else {
                if is_kind(&st, libc::S_IFDIR) {
                    return Err(RemoteError::IsDir(path.display()));
                }
                if !is_kind(&st, libc::S_IFREG) {
                    return Err(not_regular(path));
                }
                let w = rfs::open(
                    proc_path.as_str(),
                    OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| errno(e, path))?;
                (File::from(w), st)
            };
            rfs::ftruncate(&w, size).map_err(|e| errno(e, path))?;
        }
        if set.atime_ns.is_some() || set.mtime_ns.is_some() {
            let times = timestamps(set.atime_ns, set.mtime_ns);
            match &held {
                Some((dir, name)) => {
                    rfs::utimensat(dir, os(name), &times, AtFlags::SYMLINK_NOFOLLOW)
                }
                None => rfs::utimensat(rfs::CWD, proc_path.as_str(), &times, AtFlags::empty()),
            }
            .map_err(|e| errno(e, path))?;
        }
        match &held {
            Some((dir, name)) => self.stat_at(dir, name, path),
            None => self.stat(path),
        }
    }

    /// The directory-relative name of `path` for the `l*xattr` calls: its parent held open
    /// and reached through `/proc/self/fd/N/NAME`, so only the last name is looked up (never
    /// followed); the root, which has no parent, through a descriptor of its own.
    fn xattr_target(&self, path: &RemotePath) -> Result<XattrTarget> {
        if path.is_root() {
            let fd = self.open_beneath(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            return Ok(XattrTarget::Fd(fd));
        }
        let (dir, name) = self.parent(path)?;
        let mut p = proc_fd(&dir).into_bytes();
        p.push(b'/');
        p.extend_from_slice(name);
        Ok(XattrTarget::Path(
            dir,
            PathBuf::from(std::ffi::OsString::from_vec(p)),
        ))
    }

    pub fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        let name = xattr_name(name)?;
        let mut buf = vec![0u8; MAX_XATTR_VALUE_BYTES];
        let n = match self.xattr_target(path)? {
            XattrTarget::Fd(fd) => rfs::fgetxattr(&fd, name, &mut buf[..]),
            XattrTarget::Path(_dir, p) => rfs::lgetxattr(&p, name, &mut buf[..]),
        }
        .map_err(|e| xattr_errno(e, path, name))?;
        buf.truncate(n);
        Ok(buf)
    }

    pub fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; MAX_XATTR_VALUE_BYTES];
        let n = match self.xattr_target(path)? {
            XattrTarget::Fd(fd) => rfs::flistxattr(&fd, &mut buf[..]),
            XattrTarget::Path(_dir, p) => rfs::llistxattr(&p, &mut buf[..]),
        }
        .map_err(|e| errno(e, path))?;
        Ok(buf[..n]
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(<[u8]>::to_vec)
            .collect())
    }

    pub fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        let name = xattr_name(name)?;
        if value.len() > MAX_XATTR_VALUE_BYTES {
            return Err(RemoteError::TooLarge(format!(
                "extended attribute values are limited to {MAX_XATTR_VALUE_BYTES} bytes"
            )));
        }
        let f = match (flags.create, flags.replace) {
            (true, true) => {
                return Err(RemoteError::Invalid(
                    "setxattr: create and replace are exclusive".into(),
                ))
            }
            (true, false) => rfs::XattrFlags::CREATE,
            (false, true) => rfs::XattrFlags::REPLACE,
            (false, false) => rfs::XattrFlags::empty(),
        };
        match self.xattr_target(path)? {
            XattrTarget::Fd(fd) => rfs::fsetxattr(&fd, name, value, f),
            XattrTarget::Path(_dir, p) => rfs::lsetxattr(&p, name, value, f),
        }
        .map_err(|e| xattr_errno(e, path, name))
    }

    pub fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        let name = xattr_name(name)?;
        match self.xattr_target(path)? {
            XattrTarget::Fd(fd) => rfs::fremovexattr(&fd, name),
            XattrTarget::Path(_dir, p) => rfs::lremovexattr(&p, name),
        }
        .map_err(|e| xattr_errno(e, path, name))
    }

    /// `fallocate(2)` mode 0 or `KEEP_SIZE`, in place, on a regular file.
    pub fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(RemoteError::FileTooBig(path.display()));
        }
        let (file, _) = self.open_regular(path, OFlags::WRONLY)?;
        let flags = if keep_size {
            FallocateFlags::KEEP_SIZE
        } else {
            FallocateFlags::empty()
        };
        rfs::fallocate(&file, flags, offset, len).map_err(|e| errno(e, path))?;
        let st = statx_fd(&file).map_err(|e| errno(e, path))?;
        Ok(attr_of(&st, None))
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

    /// Open a regular file for a query (scan, edit), with its attributes. Anything else is
    /// refused without being opened ([`Workspace::open_regular`]).
    pub fn open_file(&self, path: &RemotePath) -> Result<(File, Attr)> {
        let (file, st) = self.open_regular(path, OFlags::RDONLY)?;
        Ok((file, attr_of(&st, None)))
    }

    /// Remove stale named temp files left by a crash: regular files with exactly the agent's
    /// temp name ([`is_temp_name`]) owned by the agent's user. Returns how many were removed.
    pub fn sweep_stale_temps(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let me = rustix::process::geteuid().as_raw();
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
                    && e.metadata().is_ok_and(|m| m.uid() == me)
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
    let ok = if base.is_absent() {
        now.is_none()
    } else {
        now.as_ref() == Some(base)
    };
    if !ok {
        return Err(RemoteError::Conflict {
            path: path.display(),
            base: base.0.clone(),
            current: now.map_or_else(|| "(removed)".to_string(), |v| v.0),
        });
    }
    Ok(())
}

enum XattrTarget {
    /// The root: its own descriptor (the `f*xattr` calls).
    Fd(OwnedFd),
    /// `/proc/self/fd/DIR/NAME`, valid while the parent descriptor is held.
    Path(OwnedFd, PathBuf),
}

/// A checked attribute name: non-empty, at most [`MAX_XATTR_NAME_BYTES`], no NUL.
fn xattr_name(name: &[u8]) -> Result<&OsStr> {
    if name.is_empty() || name.contains(&0) {
        return Err(RemoteError::Invalid(
            "an extended attribute name is empty or has a NUL".into(),
        ));
    }
    if name.len() > MAX_XATTR_NAME_BYTES {
        return Err(RemoteError::NameTooLong(
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    Ok(os(name))
}

fn xattr_errno(e: rustix::io::Errno, path: &RemotePath, name: &OsStr) -> RemoteError {
    let shown = format!("{} ({})", path.display(), name.to_string_lossy());
    RemoteError::from_errno(e.raw_os_error(), &shown)
}

/// Largest piece one `copy_file_range` call is asked for: big enough that a large copy takes
/// few calls, small enough that each call returns soon.
const COPY_CHUNK: u64 = 1 << 30;

/// Copy up to `len` bytes from `src` at `off_in` to `dst` at `off_out`, with `copy_file_range`
/// (a reflink where the filesystem shares extents), falling back to reads and writes between
/// filesystems. Answers the bytes copied: fewer than `len` when `src` ends first.
fn copy_plain(src: &impl AsFd, off_in: u64, dst: &File, off_out: u64, len: u64) -> io::Result<u64> {
    let (mut i, mut o, mut left) = (off_in, off_out, len);
    while left > 0 {
        match rfs::copy_file_range(
            src,
            Some(&mut i),
            dst,
            Some(&mut o),
            left.min(COPY_CHUNK) as usize,
        ) {
            Ok(0) => break,
            Ok(n) => left -= n as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(
                rustix::io::Errno::XDEV
                | rustix::io::Errno::NOSYS
                | rustix::io::Errno::OPNOTSUPP
                | rustix::io::Errno::INVAL,
            ) => {
                let mut buf = vec![0u8; 256 * 1024];
                let src = File::from(src.as_fd().try_clone_to_owned()?);
                while left > 0 {
                    let want = (left as usize).min(buf.len());
                    let n = match src.read_at(&mut buf[..want], i) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    dst.write_all_at(&buf[..n], o)?;
                    (i, o, left) = (i + n as u64, o + n as u64, left - n as u64);
                }
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(len - left)
}

/// Copy the first `len` bytes of `src` into the empty `dst` at the same offsets, copying only
/// the data segments (`SEEK_DATA`/`SEEK_HOLE`), so a sparse file stays sparse; then `dst` is
/// exactly `len` long.
/// Copy up to `len` bytes of `src` from `off_in` into `dst` at `off_out`, holes kept as
/// holes (a copy of a 3 GiB sparse file takes its data's space, not 3 GiB of zeros): a hole
/// of `src` is punched into `dst` (which may hold bytes there), zeros written where it cannot
/// be. `dst` grows to cover what was copied. Answers the bytes copied (fewer at `src`'s end).
fn copy_range_keeping_holes(
    src: &impl AsFd,
    off_in: u64,
    dst: &File,
    off_out: u64,
    len: u64,
) -> io::Result<u64> {
    let size = rfs::fstat(src).map_err(io::Error::from)?.st_size as u64;
    let mut end = off_in.saturating_add(len).min(size);
    let mut pos = off_in;
    while pos < end {
        let data = match rfs::seek(src, rfs::SeekFrom::Data(pos)) {
            Ok(d) => d.min(end),
            // Only a hole remains.
            Err(rustix::io::Errno::NXIO) => end,
            // No hole support: copy the rest whole.
            Err(_) => {
                let n = copy_plain(src, pos, dst, off_out + (pos - off_in), end - pos)?;
                end = pos + n;
                break;
            }
        };
        if data > pos {
            zero_range(dst, off_out + (pos - off_in), data - pos)?;
        }
        if data >= end {
            break;
        }
        let hole = rfs::seek(src, rfs::SeekFrom::Hole(data))
            .unwrap_or(end)
            .min(end);
        let n = copy_plain(src, data, dst, off_out + (data - off_in), hole - data)?;
        if n < hole - data {
            // The source shrank under us.
            end = data + n;
            break;
        }
        pos = hole;
    }
    let copied = end.saturating_sub(off_in);
    if copied > 0 && dst.metadata()?.len() < off_out + copied {
        dst.set_len(off_out + copied)?;
    }
    Ok(copied)
}

/// Make `[off, off+len)` of `dst` zeros: a hole punched where the filesystem can, else
/// zeros written (within its current length; past it a later `set_len` gives zeros).
fn zero_range(dst: &File, off: u64, len: u64) -> io::Result<()> {
    let flags = rfs::FallocateFlags::PUNCH_HOLE | rfs::FallocateFlags::KEEP_SIZE;
    if rfs::fallocate(dst, flags, off, len).is_ok() {
        return Ok(());
    }
    let until = dst.metadata()?.len().min(off.saturating_add(len));
    let zeros = vec![0u8; 256 * 1024];
    let mut at = off;
    while at < until {
        let n = (until - at).min(zeros.len() as u64) as usize;
        dst.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn copy_sparse(src: &impl AsFd, dst: &File, len: u64) -> io::Result<()> {
    let mut pos = 0u64;
    while pos < len {
        let data = match rfs::seek(src, rfs::SeekFrom::Data(pos)) {
            Ok(d) => d,
            // Only a hole remains.
            Err(rustix::io::Errno::NXIO) => break,
            // No hole support: copy the rest whole.
            Err(_) => {
                copy_plain(src, pos, dst, pos, len - pos)?;
                break;
            }
        };
        if data >= len {
            break;
        }
        let hole = rfs::seek(src, rfs::SeekFrom::Hole(data))
            .unwrap_or(len)
            .min(len);
        let want = hole - data;
        if copy_plain(src, data, dst, data, want)? < want {
            break; // the source shrank under us; the base check after the copy will say so
        }
        pos = hole;
    }
    dst.set_len(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::beneath::PATH_CHUNK_BYTES;

    #[test]
    fn only_the_agents_own_temp_names_count_as_temps() {
        let made = unique_temp_name(b"notes.txt");
        assert!(is_temp_name(&made), "{}", String::from_utf8_lossy(&made));
        assert_ne!(made, unique_temp_name(b"notes.txt"));
        assert!(is_temp_name(&unique_temp_name(&[b'n'; 255])));
        for user in [
            &b".x.sbxfs-1.tmp"[..],
            b".a.sbxfs-0123456789abcdef.tmp",
            b".x.sbxfs-agent-0123.tmp",
            b"x.sbxfs-agent-0123456789abcdef0123456789abcdef.tmp",
            b".x.sbxfs-agent-0123456789ABCDEF0123456789abcdef.tmp",
            b".sbxfs-agent-0123456789abcdef0123456789abcdef.tmp",
        ] {
            assert!(!is_temp_name(user), "{}", String::from_utf8_lossy(user));
        }
    }

    #[test]
    fn long_paths_split_into_chunks_of_whole_components_under_path_max() {
        let name = "n".repeat(255);
        for count in [1, 11, 12, 13, 40] {
            let path = vec![name.as_str(); count].join("/");
            let chunks = path_chunks(path.as_bytes());
            assert_eq!(chunks.join(&b'/'), path.as_bytes());
            for c in &chunks {
                assert!(c.len() <= PATH_CHUNK_BYTES && !c.is_empty());
                assert!(!c.starts_with(b"/") && !c.ends_with(b"/"));
            }
            assert_eq!(chunks.len() > 1, path.len() > PATH_CHUNK_BYTES);
        }
        assert_eq!(path_chunks(b"a/b/c"), vec![&b"a/b/c"[..]]);
    }
}
