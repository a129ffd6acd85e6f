//! What is checked before a mount starts, so that a mistake gets one clear line and an exit
//! code ([`super::exit`]) before anything is created: the mountpoint, FUSE itself, and
//! `allow_other`; and how a refusal by the kernel or `fusermount3` is told.

use std::path::{Path, PathBuf};

use super::exit::{Failure, Refused};
use super::{kernel, mounts, options};

/// Refuse a mountpoint that is missing, not a directory, not empty (unless `nonempty`) or
/// already mounted (an sbxfs mount, a FUSE mount whose daemon died, any other filesystem), before
/// anything is created, without touching what is there. Returns the canonical path.
pub fn check_mountpoint(mountpoint: &Path, nonempty: bool) -> anyhow::Result<PathBuf> {
    let shown = mountpoint.display();
    let refuse = |message: String| Err(Refused::error(Failure::Mountpoint, message));
    let canonical = match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return refuse(format!(
                "{shown} is a FUSE mount whose daemon is gone; unmount it first (fusermount3 -u {shown})"
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return refuse(format!(
                "mountpoint {shown} does not exist; create it first (mkdir -p {shown})"
            ))
        }
        Err(e) => return refuse(format!("mountpoint {shown}: {e}")),
        // The workspace's root is a directory; so must the mountpoint be.
        Ok(m) if !m.is_dir() => return refuse(format!("mountpoint {shown} is not a directory")),
        Ok(_) => match std::fs::canonicalize(mountpoint) {
            Ok(c) => c,
            Err(e) => return refuse(format!("mountpoint {shown}: {e}")),
        },
    };
    let entries = mounts::current();
    let top = mounts::top_at(&entries, &canonical);
    if let Some(top) = top.filter(|e| e.is_sbxfs()) {
        return refuse(format!(
            "{shown} is already an sbxfs mount (of {}); unmount it first (sbxfs umount {shown})",
            top.source.trim_start_matches(mounts::SOURCE_PREFIX)
        ));
    }
    // An automount point (`x-systemd.automount`) is where systemd wants this mount: it is
    // neither "already mounted" nor read (reading it would wait for this very mount).
    if top.is_some_and(|e| e.fstype == "autofs") {
        return Ok(canonical);
    }
    if let Some(top) = top {
        return refuse(format!(
            "{shown} is already a mount point ({} {}); unmount it first or choose another directory",
            top.fstype, top.source
        ));
    }
    if !nonempty {
        let has_entries = std::fs::read_dir(&canonical).is_ok_and(|mut d| d.next().is_some());
        if has_entries {
            return refuse(format!(
                "mountpoint {shown} is not empty (the mount would hide what is there); use an empty directory, or -o nonempty"
            ));
        }
    }
    Ok(canonical)
}

/// FUSE must be there before anything is created: `/dev/fuse`, and `fusermount3` unless this
/// process mounts itself.
pub fn check_fuse() -> anyhow::Result<()> {
    let refuse = |message: &str| Err(Refused::error(Failure::Fuse, message));
    if !Path::new("/dev/fuse").exists() {
        return refuse(
            "/dev/fuse is missing: the fuse kernel module is not loaded (modprobe fuse)",
        );
    }
    if kernel::uses_fusermount() && kernel::find_fusermount().is_none() {
        return refuse(
            "fusermount3 is not on PATH: install FUSE 3 (Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3)",
        );
    }
    Ok(())
}

/// Why the kernel or `fusermount3` refused the mount, as one line.
pub fn mount_refused(mountpoint: &Path, allow_other: bool, e: std::io::Error) -> anyhow::Error {
    let reason = e.to_string();
    let reason = reason.trim().trim_start_matches("fusermount3: ");
    let shown = mountpoint.display();
    let message = if allow_other && reason.contains("user_allow_other") {
        format!(
            "not permitted to mount on {shown}: allow_other needs `user_allow_other` in /etc/fuse.conf"
        )
    } else if e.kind() == std::io::ErrorKind::PermissionDenied
        || [
            "Permission denied",
            "not permitted",
            "no write access",
            "not allowed",
        ]
        .iter()
        .any(|p| reason.contains(p))
    {
        format!("not permitted to mount on {shown}: {reason}")
    } else {
        format!("cannot mount on {shown}: {reason}")
    };
    Refused::error(Failure::Fuse, message)
}

/// `allow_other` for a user other than root needs the administrator's consent in fuse.conf.
pub fn check_allow_other() -> anyhow::Result<()> {
    if rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    anyhow::ensure!(
        options::fuse_conf_allows_other(&conf),
        "allow_other needs the line `user_allow_other` in /etc/fuse.conf when not mounting as root"
    );
    Ok(())
}
