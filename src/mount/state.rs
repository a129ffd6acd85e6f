//! The mount's private local state: one directory per user (`$XDG_CACHE_HOME/sbxfs`, else
//! `~/.cache/sbxfs`, the home taken from `/etc/passwd` when `HOME` is unset, and with no home
//! at all `$TMPDIR/sbxfs-cache-UID`, never a name all users share), created 0700 and used only if it is ours and not open to others (as ssh
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
    check_private(dir)?;
    Ok(made)
}

/// Refuse `dir` if it exists and is not private ([`ensure_private_dir`]'s checks), creating
/// nothing: a mistake is named before the sandbox is contacted (or an agent uploaded to it).
pub fn check_private_if_there(dir: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        _ => check_private(dir),
    }
}

fn check_private(dir: &Path) -> io::Result<()> {
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
    Ok(())
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

    /// A directory made elsewhere for this start (a fresh one with a random name).
    pub fn made(&mut self, dir: &Path) {
        self.dirs.push(dir.to_path_buf());
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
    let uid = rustix::process::getuid().as_raw();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| passwd_home(&std::fs::read("/etc/passwd").unwrap_or_default(), uid));
    let root = match std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".cache")))
    {
        Some(base) => {
            created.plain_dir(&base)?;
            base.join("sbxfs")
        }
        // No home at all: a name of this user's own in /tmp, never one shared by all users.
        None => return private_tmp_root(&std::env::temp_dir(), uid, created),
    };
    created.private_dir(&root)?;
    Ok(root)
}

/// With no home: `$TMPDIR/sbxfs-cache-UID`, or, when another user took that name (a shared
/// `/tmp`), the first of `…-1` to `…-8` that is this user's own (the next mount looks in the
/// same order, so it finds the edits a killed one left), else a fresh directory of a random
/// name (logged: the next mount will not find what this one leaves staged).
fn private_tmp_root(base: &Path, uid: u32, created: &mut Created) -> io::Result<PathBuf> {
    let usual = base.join(format!("sbxfs-cache-{uid}"));
    let first_refusal = match created.private_dir(&usual) {
        Ok(()) => return Ok(usual),
        Err(e) => e,
    };
    for n in 1..=8 {
        let alt = base.join(format!("sbxfs-cache-{uid}-{n}"));
        if created.private_dir(&alt).is_ok() {
            tracing::warn!(
                "staging directory {}: {first_refusal}; using {} instead",
                usual.display(),
                alt.display()
            );
            return Ok(alt);
        }
    }
    let fresh = tempfile::Builder::new()
        .prefix(&format!("sbxfs-cache-{uid}-"))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(base)?
        .keep();
    created.made(&fresh);
    tracing::warn!(
        "staging directory {}: {first_refusal}, and its alternatives are taken; using {} \
         (a later mount will not find edits this one leaves unpushed)",
        usual.display(),
        fresh.display()
    );
    Ok(fresh)
}

/// The home directory `/etc/passwd` gives `uid` (a daemon started with no `HOME`), if it is
/// an existing directory (`/nonexistent` is not made).
fn passwd_home(passwd: &[u8], uid: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let uid = uid.to_string();
    passwd
        .split(|&b| b == b'\n')
        .map(|line| line.split(|&b| b == b':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && f[2] == uid.as_bytes())
        .map(|f| PathBuf::from(std::ffi::OsStr::from_bytes(f[5])))
        .filter(|p| p.is_absolute() && p.is_dir())
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

/// The disk cache of one sandbox: `<private root>/pages/<hash of the URL>-<hash of the
/// sandbox's identity>` (another sandbox answering at the same URL gets its own).
pub fn pages_dir_for(
    remote_url: &str,
    sandbox: &str,
    created: &mut Created,
) -> io::Result<PathBuf> {
    let root = private_root(created)?;
    let pages = root.join("pages");
    created.private_dir(&pages)?;
    let name = format!(
        "{:016x}-{:016x}",
        fnv1a(remote_url.as_bytes()),
        fnv1a(sandbox.as_bytes())
    );
    Ok(pages.join(name))
}

/// A stable hash (the directory name must not change between runs or builds).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn with_no_home_set_the_password_databases_is_used_if_it_exists() {
        let t = tempfile::tempdir().unwrap();
        let passwd = format!(
            "root:x:0:0:root:/root:/bin/bash\nme:x:1234:1234::{}:/bin/sh\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n",
            t.path().display()
        );
        assert_eq!(
            passwd_home(passwd.as_bytes(), 1234).as_deref(),
            Some(t.path())
        );
        assert_eq!(passwd_home(passwd.as_bytes(), 65534), None, "not made");
        assert_eq!(passwd_home(passwd.as_bytes(), 4321), None);
        assert_eq!(passwd_home(b"junk", 0), None);
    }

    #[test]
    fn with_no_home_a_taken_tmp_name_gives_way_to_an_alternative_then_a_fresh_one() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Created::default();
        let first = private_tmp_root(t.path(), 77, &mut c).unwrap();
        assert_eq!(first, t.path().join("sbxfs-cache-77"));
        // Taken (open to all, as another user's would be): the first alternative, and the
        // same one again next time.
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(&first, open.clone()).unwrap();
        let alt = private_tmp_root(t.path(), 77, &mut c).unwrap();
        assert_eq!(alt, t.path().join("sbxfs-cache-77-1"));
        assert_eq!(private_tmp_root(t.path(), 77, &mut c).unwrap(), alt);
        for n in 1..=8 {
            let d = t.path().join(format!("sbxfs-cache-77-{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::set_permissions(&d, open.clone()).unwrap();
        }
        let fresh = private_tmp_root(t.path(), 77, &mut c).unwrap();
        assert!(fresh.starts_with(t.path()) && !fresh.ends_with("sbxfs-cache-77"));
        assert_eq!(
            std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

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
