//! Atomic replacement of a file's content: the one way sbxfs writes a file that others may be
//! reading. A uniquely named temp file is written beside the target (same directory, so the
//! rename cannot cross filesystems), given the target's mode (and owner, where permitted),
//! fsynced, then renamed over the target, and the directory is fsynced. Readers see the old
//! content or the new, never a mix; on any failure the temp file is removed and the target is
//! byte-for-byte unchanged. A symlink is resolved first, so the link stays a link.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Resolve `path` to the file that holds the content (following symlinks).
pub fn resolve_target(path: &Path) -> io::Result<PathBuf> {
    fs::canonicalize(path)
}

/// Replace the content of the existing file `target` (already resolved) with what `fill`
/// writes into the temp file.
pub fn replace_with(
    target: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let meta = fs::metadata(target)?;
    let dir = target
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "target has no directory"))?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.sbxfs-"))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    fill(tmp.as_file_mut())?;
    let file = tmp.as_file();
    file.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    // Keep the owner when we can (running as root); otherwise the file becomes ours, as any
    // editor's save-by-rename would make it.
    let _ = std::os::unix::fs::fchown(file, Some(meta.uid()), Some(meta.gid()));
    file.sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Replace `target`'s content with `data`.
pub fn replace_bytes(target: &Path, data: &[u8]) -> io::Result<()> {
    replace_with(target, |f| f.write_all(data))
}
