//! A directory tree reached only through one descriptor: the searches' view of the agent's
//! workspace. Every open is `openat2` relative to the root descriptor with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS`, and, unless symlinks are followed (`-L`, and glob's literal
//! segments), `RESOLVE_NO_SYMLINKS` too: a directory swapped for a symlink during a walk makes
//! that one open fail (it is skipped) instead of leading the walk out of the tree. With symlinks
//! followed, they are resolved by the kernel beneath the root, so `/` or `../..` lead nowhere.
//! Files are opened `O_PATH`, checked with `fstat` to be regular, then reopened for reading, so
//! a FIFO or a device is never opened.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};

use super::cancel::Cancel;
use super::walk::{SourceEntry, SourceKind, TreeSource};

/// Longest path resolved by one `openat2`: comfortably under PATH_MAX (4096, counting the NUL),
/// so a chunk of whole components (each at most 255 bytes) always fits.
pub const PATH_CHUNK_BYTES: usize = 3072;
/// Largest ignore file read (`.gitignore`, `.ignore`, `.rgignore`, `.git/info/exclude`): a
/// hostile one cannot fill memory.
pub const MAX_IGNORE_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Split a path into chunks of whole components, each short enough for one `openat2`.
pub fn path_chunks(path: &[u8]) -> Vec<&[u8]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut end = 0; // end of the last component that fits the current chunk
    for (i, _) in path.iter().enumerate().filter(|(_, &b)| b == b'/') {
        if i - start > PATH_CHUNK_BYTES {
            chunks.push(&path[start..end]);
            start = end + 1;
        }
        end = i;
    }
    if path.len() - start > PATH_CHUNK_BYTES {
        chunks.push(&path[start..end]);
        start = end + 1;
    }
    chunks.push(&path[start..]);
    chunks
}

/// The tree below one directory descriptor, for the walks of grep, glob and fuzzy.
/// Paths are `/`-separated bytes relative to the root; the empty path is the root.
pub struct Beneath {
    root: OwnedFd,
    /// The root's real path, to tell where a followed symlink leads.
    root_real: PathBuf,
    follow: bool,
    /// Stat regular files for their size (only `max_filesize` needs it).
    sizes: bool,
    cancel: Cancel,
}

fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

fn proc_fd(fd: &impl std::os::fd::AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn kind_of(t: FileType) -> SourceKind {
    match t {
        FileType::RegularFile => SourceKind::File,
        FileType::Directory => SourceKind::Dir,
        FileType::Symlink => SourceKind::Symlink,
        _ => SourceKind::Other,
    }
}

impl Beneath {
    /// The tree below `root` (a directory descriptor, duplicated here). `follow`: symlinks are
    /// followed, beneath the root only. Once `cancel` fires every read answers "nothing", so a
    /// walk over this tree unwinds at once.
    pub fn new(root: impl AsFd, follow: bool, cancel: Cancel) -> io::Result<Self> {
        let root = root.as_fd().try_clone_to_owned()?;
        let root_real = std::fs::read_link(proc_fd(&root))?;
        Ok(Beneath {
            root,
            root_real,
            follow,
            sizes: false,
            cancel,
        })
    }

    /// Report regular files' sizes in [`TreeSource::entries`] (one `statx` per file).
    pub fn with_sizes(mut self, sizes: bool) -> Self {
        self.sizes = sizes;
        self
    }

    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    fn how(&self) -> ResolveFlags {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if self.follow {
            how
        } else {
            how | ResolveFlags::NO_SYMLINKS
        }
    }

    /// Open `path` beneath the root, chunk by chunk for paths longer than one call may take.
    pub fn open(&self, path: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC;
        if path.is_empty() {
            return Ok(rfs::openat2(
                &self.root,
                ".",
                flags,
                Mode::empty(),
                self.how(),
            )?);
        }
        let chunks = path_chunks(path);
        let (last, dirs) = chunks.split_last().expect("at least one chunk");
        let mut held: Option<OwnedFd> = None;
        for chunk in dirs {
            let from = held.as_ref().unwrap_or(&self.root);
            let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            held = Some(rfs::openat2(
                from,
                os(chunk),
                dir_flags,
                Mode::empty(),
                self.how(),
            )?);
        }
        let from = held.as_ref().unwrap_or(&self.root);
        Ok(rfs::openat2(
            from,
            os(last),
            flags,
            Mode::empty(),
            self.how(),
        )?)
    }

    /// Open a regular file for reading; anything else is refused before it is opened for
    /// reading (`ErrorKind::InvalidInput`, "not a regular file"; a directory is `IsADirectory`).
    pub fn open_file(&self, path: &[u8]) -> io::Result<File> {
        let nofollow = if self.follow {
            OFlags::empty()
        } else {
            OFlags::NOFOLLOW
        };
        let fd = self.open(path, OFlags::PATH | nofollow)?;
        let st = rfs::fstat(&fd)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(io::ErrorKind::IsADirectory.into()),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file",
                ))
            }
        }
        // Reopening the O_PATH descriptor's own inode cannot reach another file.
        let file = rfs::open(
            proc_fd(&fd).as_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(file))
    }

    fn stat_nofollow(&self, path: &[u8]) -> Option<rfs::Stat> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let fd = self.open(path, OFlags::PATH | OFlags::NOFOLLOW).ok()?;
        rfs::fstat(&fd).ok()
    }

    fn read_entries(&self, dir: &[u8]) -> io::Result<Vec<SourceEntry>> {
        let fd = self.open(dir, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let mut kind = kind_of(entry.file_type());
            let mut size = 0;
            if entry.file_type() == FileType::Unknown || (self.sizes && kind == SourceKind::File) {
                // The directory's own descriptor and one name: nothing to resolve.
                match rfs::statx(
                    &fd,
                    entry.file_name(),
                    AtFlags::SYMLINK_NOFOLLOW,
                    StatxFlags::TYPE | StatxFlags::SIZE,
                ) {
                    Ok(st) => {
                        kind = kind_of(FileType::from_raw_mode(st.stx_mode.into()));
                        size = st.stx_size;
                    }
                    Err(_) => continue,
                }
            }
            out.push(SourceEntry {
                name: name.to_vec(),
                kind,
                size,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl TreeSource for Beneath {
    fn kind(&self, path: &[u8]) -> Option<SourceKind> {
        let st = self.stat_nofollow(path)?;
        Some(kind_of(FileType::from_raw_mode(st.st_mode)))
    }

    fn entries(&self, dir: &[u8]) -> Vec<SourceEntry> {
        if self.cancel.is_cancelled() {
            return Vec::new();
        }
        self.read_entries(dir).unwrap_or_default()
    }

    fn content(&self, path: &[u8]) -> Option<Vec<u8>> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let file = self.open_file(path).ok()?;
        let mut bytes = Vec::new();
        file.take(MAX_IGNORE_FILE_BYTES)
            .read_to_end(&mut bytes)
            .ok()?;
        Some(bytes)
    }

    fn resolve(&self, path: &[u8]) -> Option<Vec<u8>> {
        if self.cancel.is_cancelled() {
            return None;
        }
        // Followed beneath the root whatever `follow` says: this is the question "where does it
        // lead", asked only when following.
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        let fd = if path.is_empty() {
            rfs::openat2(
                &self.root,
                ".",
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                how,
            )
        } else if path.len() <= PATH_CHUNK_BYTES {
            rfs::openat2(
                &self.root,
                os(path),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                how,
            )
        } else {
            return None;
        }
        .ok()?;
        let real = std::fs::read_link(proc_fd(&fd)).ok()?;
        let rel = real.strip_prefix(&self.root_real).ok()?;
        Some(rel.as_os_str().as_bytes().to_vec())
    }
}
