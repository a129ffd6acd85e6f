//! The mount's private local state: one directory per user (`$XDG_CACHE_HOME/sbxfs`, else
//! `~/.cache/sbxfs`), created 0700 and used only if it is ours and not open to others (as ssh
//! and tmux check theirs), with one staging directory per remote inside. Staged files there
//! outlive the daemon, so the next mount of the same remote pushes them. A start that fails
//! removes the directories it made ([`Created`]).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Create `dir` 0700 if missing; refuse it unless it is a real directory (not a link), owned
/// by us, and closed to group and others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    create_private_dir(dir).map(drop)
}

/// [`ensure_private_dir`], telling whether this call made the directory.
fn create_private_dir(dir: &Path) -> io::Result<bool> {
    let made = match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    let m = std::fs::symlink_metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if !m.file_type().is_dir() {
        return Err(io::Error::other(format!(
            "{}: not a directory (refusing to keep private state there)",
            dir.display()
        )));
    }
    if m.uid() != me {
        return Err(io::Error::other(format!(
            "{}: owned by uid {}, not by you (uid {me}); refusing to use it",
            dir.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "{}: open to other users (mode {:o}); refusing to use it (chmod 700 it)",
            dir.display(),
            m.mode() & 0o7777
        )));
    }
    Ok(made)
}

/// The directories one start of the daemon made, removed again (newest first, each only if
/// empty: staged edits are never lost) unless the start succeeds and calls [`Created::keep`].
#[derive(Debug, Default)]
pub struct Created {
    dirs: Vec<PathBuf>,
    kept: bool,
}

impl Created {
    /// [`ensure_private_dir`], remembering `dir` if this call made it.
    pub fn private_dir(&mut self, dir: &Path) -> io::Result<()> {
        if create_private_dir(dir)? {
            self.dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    /// A plain directory (the cache base, `~/.cache`), made with its parents if missing.
    fn plain_dir(&mut self, dir: &Path) -> io::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        std::fs::create_dir_all(dir)?;
        self.dirs.push(dir.to_path_buf());
        Ok(())
    }

    /// The mount is up: what was made stays, whatever happens next.
    pub fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if !self.kept {
            for d in self.dirs.iter().rev() {
                // `remove_dir` removes only an empty directory.
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

/// The user's private sbxfs directory (created if needed).
pub fn private_root(created: &mut Created) -> io::Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    created.plain_dir(&base)?;
    let root = base.join("sbxfs");
    created.private_dir(&root)?;
    Ok(root)
}

/// The staging directory for one remote: `<private root>/staging/<hash of the URL>`.
pub fn staging_dir_for(remote_url: &str, created: &mut Created) -> io::Result<PathBuf> {
    let root = private_root(created)?;
    let staging = root.join("staging");
    created.private_dir(&staging)?;
    let dir = staging.join(format!("{:016x}", fnv1a(remote_url.as_bytes())));
    created.private_dir(&dir)?;
    Ok(dir)
}

/// A stable hash (the directory name must not change between runs or builds).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_open_to_others_or_a_link_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        ensure_private_dir(&d).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(ensure_private_dir(&d).is_err());
        let l = t.path().join("l");
        std::os::unix::fs::symlink(t.path(), &l).unwrap();
        assert!(ensure_private_dir(&l).is_err());
    }

    #[test]
    fn what_a_failed_start_made_is_removed_and_what_was_there_or_kept_stays() {
        let t = tempfile::tempdir().unwrap();
        let old = t.path().join("old");
        ensure_private_dir(&old).unwrap();
        let new = old.join("new");
        let full = t.path().join("full");
        {
            let mut c = Created::default();
            c.private_dir(&old).unwrap();
            c.private_dir(&new).unwrap();
            c.private_dir(&full).unwrap();
            std::fs::write(full.join("staged"), "edit").unwrap();
        }
        assert!(old.is_dir() && !new.exists(), "made by the start: removed");
        assert!(
            full.join("staged").exists(),
            "a directory with content stays"
        );
        let mut c = Created::default();
        c.private_dir(&new).unwrap();
        c.keep();
        drop(c);
        assert!(new.is_dir());
    }

    #[test]
    fn each_remote_has_its_own_stable_staging_name() {
        assert_eq!(fnv1a(b"http://a"), fnv1a(b"http://a"));
        assert_ne!(fnv1a(b"http://a"), fnv1a(b"http://b"));
    }
}
