//! What `/proc/self/mountinfo` says is mounted where: how `sbxfs mount` sees that a mountpoint
//! already holds an sbxfs mount (without touching that mount, whose daemon may be hung), and
//! how the daemon tells whether its own mount is still there.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The source name sbxfs mounts carried before they had their own type (`sbxfs:URL`, type
/// `fuse`); still recognised, so a mount made by an older daemon is not mounted over.
pub const SOURCE_PREFIX: &str = "sbxfs:";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem.
    pub dev: String,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    pub fn is_sbxfs(&self) -> bool {
        self.fstype == super::kernel::FSTYPE
            || (self.fstype == "fuse" && self.source.starts_with(SOURCE_PREFIX))
    }
}

/// Parse mountinfo text: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL…] - FSTYPE SOURCE …`.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            Some(MountEntry {
                dev: left.get(2)?.to_string(),
                mountpoint: PathBuf::from(OsString::from_vec(unescape(left.get(4)?))),
                fstype: right.next()?.to_string(),
                source: String::from_utf8_lossy(&unescape(right.next()?)).into_owned(),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: &u8| (b'0'..=b'7').contains(c);
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(octal) {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, &c| v * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// This process's view of the mounts.
pub fn current() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// The topmost mount at `mountpoint` (the last one listed there), if any.
pub fn top_at<'a>(entries: &'a [MountEntry], mountpoint: &Path) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mountpoint == mountpoint)
}

/// Is our mount (device `dev`) gone from this namespace while another mount namespace still
/// has a copy of it? A process started after the mount in a namespace of its own (an exec
/// channel run through `unshare -m`, a container runtime) copies every mount, ours included,
/// and that copy keeps the FUSE session alive after the unmount here: nothing would ever end
/// it. A mount detached lazily and still in use is in no namespace at all.
pub fn left_only_elsewhere(mountpoint: &Path, dev: &str) -> bool {
    let here = current();
    if top_at(&here, mountpoint).is_some_and(|e| e.dev == dev) {
        return false;
    }
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(ns) = std::fs::read_link(p.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == ours.as_ref() || !seen.insert(ns) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(p.path().join("mountinfo")) else {
            continue;
        };
        if parse(&text).iter().any(|e| e.dev == dev && e.is_sbxfs()) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
42 22 0:39 / /tmp/a\\040b/mnt rw,nosuid,nodev,noatime shared:5 - fuse sbxfs:http://127.0.0.1:7070 rw,user_id=0
43 22 0:40 / /tmp/other rw - fuse.sshfs me@host: rw
44 42 0:41 / /tmp/a\\040b/mnt rw - tmpfs tmpfs rw
45 22 0:42 / /tmp/new rw,nosuid,nodev,noatime - fuse.sbxfs http://127.0.0.1:7070 rw,user_id=0
";

    #[test]
    fn entries_are_read_with_escaped_paths() {
        let e = parse(SAMPLE);
        assert_eq!(e.len(), 5);
        assert_eq!(e[1].mountpoint, Path::new("/tmp/a b/mnt"));
        assert_eq!(e[1].dev, "0:39");
        assert!(e[1].is_sbxfs());
        assert!(!e[2].is_sbxfs(), "another FUSE filesystem");
        assert!(!e[0].is_sbxfs());
        assert!(e[4].is_sbxfs(), "the type says so");
    }

    #[test]
    fn the_topmost_mount_at_a_path_is_the_last_listed() {
        let e = parse(SAMPLE);
        let top = top_at(&e, Path::new("/tmp/a b/mnt")).unwrap();
        assert_eq!(top.fstype, "tmpfs");
        assert!(top_at(&e, Path::new("/nowhere")).is_none());
    }
}
