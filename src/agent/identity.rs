//! The workspace's identity: a random id the agent makes the first time it serves a workspace
//! and keeps in the sandbox, beside the tree (never in it: a copy of the tree must not carry
//! it), reported by `info`. A mount ties the edits it stages to this id, so edits left by a
//! killed mount go only to the sandbox they were made in: not to another sandbox that answers
//! at the same address later, whatever device and inode numbers it reports, nor to a new
//! directory that took the old one's inode number.
//!
//! Kept in `$XDG_STATE_HOME/sbxfs/workspaces/` (else `~/.local/state/…`), one file per
//! workspace root, named by the root's device, inode and birth time.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Random bytes in an id (shown as twice as many hex digits).
const ID_BYTES: usize = 16;

/// The workspace's id, made and kept on first use; `None` (logged) when no private state
/// directory can be had, and the mount then falls back to the root's device and inode.
/// Called before Landlock confines the agent to the workspace.
pub fn workspace_id(root: &Path) -> Option<String> {
    // A root that cannot be looked at is reported by the agent itself, a moment later.
    let meta = std::fs::metadata(root).ok()?;
    let found = state_dir()
        .ok_or_else(|| "no HOME or XDG_STATE_HOME".to_string())
        .and_then(|dir| {
            load_or_make(&dir, &key(&meta)).map_err(|e| format!("{}: {e}", dir.display()))
        });
    match found {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(
                "no workspace id ({e}): mounts tie unpushed edits to the root's device and inode"
            );
            None
        }
    }
}

fn state_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => {
            PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".local/state")
        }
    };
    Some(base.join("sbxfs/workspaces"))
}

/// The file name for a workspace root: device, inode and birth time (a directory made later
/// with the same inode number is another workspace).
fn key(meta: &std::fs::Metadata) -> String {
    let born = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}-{born:x}", meta.dev(), meta.ino())
}

fn is_id(s: &str) -> bool {
    s.len() == 2 * ID_BYTES && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The id kept in `dir/key`, or a new one put there (atomically: two agents starting at once
/// agree on the first one written).
fn load_or_make(dir: &Path, key: &str) -> std::io::Result<String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let path = dir.join(key);
    if let Ok(kept) = std::fs::read_to_string(&path) {
        if is_id(kept.trim()) {
            return Ok(kept.trim().to_string());
        }
    }
    let mut bytes = [0u8; ID_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let temp = dir.join(format!(".{key}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    f.write_all(id.as_bytes())?;
    f.sync_all()?;
    let linked = std::fs::hard_link(&temp, &path);
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let kept = std::fs::read_to_string(&path)?;
            if is_id(kept.trim()) {
                Ok(kept.trim().to_string())
            } else {
                // Not an id (damaged): replaced, as nothing else could use it.
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&path)?;
                f.write_all(id.as_bytes())?;
                Ok(id)
            }
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_made_once_per_workspace_and_kept() {
        let state = tempfile::tempdir().unwrap();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let dir = state.path().join("sbxfs/workspaces");
        let ka = key(&std::fs::metadata(a.path()).unwrap());
        let kb = key(&std::fs::metadata(b.path()).unwrap());
        assert_ne!(ka, kb);
        let first = load_or_make(&dir, &ka).unwrap();
        assert!(is_id(&first), "{first}");
        assert_eq!(load_or_make(&dir, &ka).unwrap(), first, "kept");
        assert_ne!(load_or_make(&dir, &kb).unwrap(), first, "another workspace");
        let mode = std::fs::metadata(dir.join(&ka)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A damaged file is replaced by a fresh id.
        std::fs::write(dir.join(&ka), "not an id").unwrap();
        let again = load_or_make(&dir, &ka).unwrap();
        assert!(is_id(&again) && again != first);
    }
}
