//! Asking the kernel for the mount, with the type `fuse.sbxfs` and the remote as the source, so
//! that `/proc/mounts` and `findmnt -t fuse.sbxfs` name it (fuser's own direct mount always says
//! plain `fuse`, which is why the daemon mounts and hands fuser the device). As root the daemon
//! calls `mount(2)` itself; anyone else asks the setuid `fusermount3` (`subtype=sbxfs`), which
//! mounts and passes the device back over a socket (`_FUSE_COMMFD`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The filesystem type every sbxfs mount carries.
pub const FSTYPE: &str = "fuse.sbxfs";

/// What the mount shows and allows; always `nosuid,nodev,noatime`.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    /// The mount's source (the remote's URL).
    pub source: String,
    pub read_only: bool,
    pub no_exec: bool,
    pub default_permissions: bool,
    pub allow_other: bool,
}

/// Tests set this to take the `fusermount3` path as root too.
const FORCE_FUSERMOUNT: &str = "SBXFS_MOUNT_WITH_FUSERMOUNT";

/// Whether this process mounts through `fusermount3` rather than `mount(2)`.
pub fn uses_fusermount() -> bool {
    !rustix::process::geteuid().is_root() || std::env::var_os(FORCE_FUSERMOUNT).is_some()
}

/// Mount `/dev/fuse` on `mountpoint` directly: the device, once mounted; `None` when this
/// process may not (not root, or root without the capability, e.g. in a user namespace), so
/// `fusermount3` must do it.
pub fn mount_direct(mountpoint: &Path, o: &KernelOptions) -> io::Result<Option<OwnedFd>> {
    use rustix::mount::MountFlags as F;
    if uses_fusermount() {
        return Ok(None);
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    // stat, never open: opening an automount point (x-systemd.automount) would wait for the
    // very mount being made.
    let root_mode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    if o.default_permissions {
        data.push_str(",default_permissions");
    }
    if o.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = F::NOSUID | F::NODEV | F::NOATIME;
    if o.read_only {
        flags |= F::RDONLY;
    }
    if o.no_exec {
        flags |= F::NOEXEC;
    }
    let data = std::ffi::CString::new(data).map_err(io::Error::other)?;
    match rustix::mount::mount(
        o.source.as_str(),
        mountpoint,
        FSTYPE,
        flags,
        data.as_c_str(),
    ) {
        Ok(()) => Ok(Some(dev.into())),
        Err(rustix::io::Errno::PERM) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Mount through `fusermount3`: the device, once mounted, or its error message.
pub fn mount_with_fusermount(mountpoint: &Path, o: &KernelOptions) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let fusermount = find_fusermount()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "fusermount3 is not on PATH"))?;
    // `theirs` is inherited by fusermount3 (no CLOEXEC); `ours` is not. Nothing else in this
    // process starts programs during start-up, so no other child inherits `theirs`.
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::empty(),
        None,
    )?;
    rustix::io::fcntl_setfd(&ours, rustix::io::FdFlags::CLOEXEC)?;
    let mut options = format!(
        "fsname={},subtype=sbxfs,nosuid,nodev,noatime",
        escape_fsname(&o.source)
    );
    for (on, name) in [
        (o.default_permissions, "default_permissions"),
        (o.allow_other, "allow_other"),
        (o.read_only, "ro"),
        (o.no_exec, "noexec"),
    ] {
        if on {
            options.push(',');
            options.push_str(name);
        }
    }
    let child = std::process::Command::new(&fusermount)
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    drop(theirs);
    let child = child?;
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match received {
        Some(dev) => Ok(dev),
        None if said.is_empty() => Err(io::Error::other(format!(
            "{} ended ({}) without mounting",
            fusermount.display(),
            out.status
        ))),
        None => Err(io::Error::other(said)),
    }
}

/// The descriptor fusermount3 sends (`SCM_RIGHTS`), if it sends one before closing.
fn receive_fd(socket: &OwnedFd) -> Option<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    loop {
        match rustix::net::recvmsg(
            socket,
            &mut [io::IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
            Ok(_) => break,
        }
    }
    let fd = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    fd
}

/// Why an unmount did not happen.
#[derive(Debug)]
pub enum UnmountError {
    /// Programs still use the mount.
    Busy,
    /// The kernel or `fusermount3` refused, with its reason.
    Refused(String),
    /// `fusermount3` could not be run (not installed, for a user who is not root).
    NoFusermount(io::Error),
}

impl std::fmt::Display for UnmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmountError::Busy => f.write_str("busy: programs are using it"),
            UnmountError::Refused(why) => f.write_str(why),
            UnmountError::NoFusermount(e) => write!(f, "fusermount3: {e}"),
        }
    }
}

/// Unmount `mountpoint` (`lazy`: detach it now, as `umount -l`). Root calls `umount2(2)`
/// itself, as it mounted with `mount(2)`, so it needs no `fusermount3`; anyone else asks it.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), UnmountError> {
    if !uses_fusermount() {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        return match rustix::mount::unmount(mountpoint, flags) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::BUSY) => Err(UnmountError::Busy),
            Err(e) => Err(UnmountError::Refused(io::Error::from(e).to_string())),
        };
    }
    let mut fusermount = std::process::Command::new("fusermount3");
    fusermount.arg("-u");
    if lazy {
        fusermount.arg("-z");
    }
    let out = fusermount
        .arg(mountpoint)
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(UnmountError::NoFusermount)?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr);
    if why.contains("busy") {
        return Err(UnmountError::Busy);
    }
    // fusermount3 prefixes its own name and the path; the reason is the last part.
    Err(UnmountError::Refused(
        why.trim().rsplit(": ").next().unwrap_or("").to_string(),
    ))
}

/// `fusermount3` as the user's `PATH` finds it.
pub fn find_fusermount() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join("fusermount3"))
        .find(|p| p.is_file())
}

/// `fsname=` for fusermount3, whose option list is comma-separated: commas and backslashes in
/// the URL are escaped as libfuse does.
pub fn escape_fsname(source: &str) -> String {
    source.replace('\\', "\\\\").replace(',', "\\,")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_in_a_source_are_escaped_for_fusermount() {
        assert_eq!(escape_fsname("http://h:1/a,b"), "http://h:1/a\\,b");
        assert_eq!(escape_fsname("http://h:1"), "http://h:1");
    }
}
