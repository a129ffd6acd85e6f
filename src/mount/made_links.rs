//! Symlinks made through the mount, remembered so they read back as written. A target the
//! sandbox chose is judged by [`super::links`] (it must never lead to a laptop file); one the
//! user wrote here is the user's own choice, as on a local disk: `python3 -m venv` makes
//! `bin/python3 → /usr/bin/python3` and runs it at once. Such a link is shown as written while
//! the sandbox still holds exactly that target at exactly that path; the sandbox changing the
//! target, moving the link or giving it another name brings back the judging.
//!
//! Kept in the staging directory (one per remote URL, private to the user), one JSON line
//! per link, tied to the sandbox's identity like the staged edits; bounded to
//! [`MAX_LINKS`] (the oldest go first, and are then judged like any other link).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::wirebytes::WireBytes;

/// Links remembered at most (a `node_modules` tree has a few thousand).
pub const MAX_LINKS: usize = 100_000;
const FILE: &str = "made-links";

#[derive(Serialize, Deserialize)]
struct Record {
    /// The sandbox's identity ([`super::core::FsCore::sandbox_id`]).
    s: String,
    /// The link's workspace path.
    p: WireBytes,
    /// Its target, as written; none: the link was removed (or moved away) through the mount.
    t: Option<WireBytes>,
}

type Key = (String, Vec<u8>);

#[derive(Default)]
struct Known {
    targets: HashMap<Key, Vec<u8>>,
    /// Keys in the order they were made, for the bound.
    order: VecDeque<Key>,
}

impl Known {
    fn remove(&mut self, key: &Key) {
        // Its place in `order` goes when the bound or a rewrite reaches it.
        self.targets.remove(key);
    }

    fn insert(&mut self, key: Key, target: Vec<u8>) {
        if self.targets.insert(key.clone(), target).is_none() {
            self.order.push_back(key);
        }
        while self.targets.len() > MAX_LINKS {
            if let Some(old) = self.order.pop_front() {
                self.targets.remove(&old);
            }
        }
    }
}

pub struct MadeLinks {
    file: Option<PathBuf>,
    known: Mutex<Known>,
}

impl MadeLinks {
    /// What is remembered in `dir` (nothing for a mount without a staging directory, or
    /// when the file cannot be read: those links are then judged).
    pub fn open(dir: Option<&Path>) -> MadeLinks {
        let mut known = Known::default();
        let file = dir.map(|d| d.join(FILE));
        if let Some(text) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
            for line in text.split(|&b| b == b'\n') {
                if let Ok(r) = serde_json::from_slice::<Record>(line) {
                    match r.t {
                        Some(t) => known.insert((r.s, r.p.0), t.0),
                        None => known.remove(&(r.s, r.p.0)),
                    }
                }
            }
            // Rewritten once when it grew past the bound, so it never grows without end.
            if known.targets.len() < text.split(|&b| b == b'\n').count() / 2 {
                let _ = Self::rewrite(file.as_deref(), &known);
            }
        }
        MadeLinks {
            file,
            known: Mutex::new(known),
        }
    }

    fn rewrite(file: Option<&Path>, known: &Known) -> std::io::Result<()> {
        let Some(file) = file else { return Ok(()) };
        let temp = file.with_extension("new");
        let mut out = Vec::new();
        for key in &known.order {
            if let Some(t) = known.targets.get(key) {
                out.extend(Self::line(&key.0, &key.1, Some(t)));
            }
        }
        std::fs::write(&temp, out)?;
        std::fs::rename(&temp, file)
    }

    fn line(sandbox: &str, path: &[u8], target: Option<&[u8]>) -> Vec<u8> {
        let mut l = serde_json::to_vec(&Record {
            s: sandbox.to_string(),
            p: WireBytes(path.to_vec()),
            t: target.map(|t| WireBytes(t.to_vec())),
        })
        .expect("serialisable");
        l.push(b'\n');
        l
    }

    /// The mount made a link at `path` to `target` in sandbox `sandbox`.
    pub fn made(&self, sandbox: &str, path: &[u8], target: &[u8]) {
        self.known
            .lock()
            .expect("made links lock")
            .insert((sandbox.to_string(), path.to_vec()), target.to_vec());
        self.append(&Self::line(sandbox, path, Some(target)));
    }

    /// The name at `path` was removed through the mount: a link the sandbox puts there later
    /// is the sandbox's.
    pub fn forget(&self, sandbox: &str, path: &[u8]) {
        let key = (sandbox.to_string(), path.to_vec());
        let had = {
            let mut k = self.known.lock().expect("made links lock");
            let had = k.targets.contains_key(&key);
            k.remove(&key);
            had
        };
        if had {
            self.append(&Self::line(sandbox, path, None));
        }
    }

    /// A rename through the mount: a link made here follows its name (`exchange`: both do);
    /// whatever the target name held is forgotten.
    pub fn renamed(&self, sandbox: &str, from: &[u8], to: &[u8], exchange: bool) {
        let key = |p: &[u8]| (sandbox.to_string(), p.to_vec());
        let (moving, replaced) = {
            let k = self.known.lock().expect("made links lock");
            (
                k.targets.get(&key(from)).cloned(),
                k.targets.get(&key(to)).cloned(),
            )
        };
        if moving.is_none() && replaced.is_none() {
            return;
        }
        self.forget(sandbox, from);
        self.forget(sandbox, to);
        if let Some(t) = moving {
            self.made(sandbox, to, &t);
        }
        if let (true, Some(t)) = (exchange, replaced) {
            self.made(sandbox, from, &t);
        }
    }

    fn append(&self, line: &[u8]) {
        let Some(file) = &self.file else { return };
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(file)
            .and_then(|mut f| f.write_all(line));
        if let Err(e) = appended {
            tracing::warn!(
                file = %file.display(),
                "cannot remember a link made through the mount ({e}): after a remount it is \
                 judged like the sandbox's own links"
            );
        }
    }

    /// Whether the mount made the link at `path` in `sandbox` with exactly `target`.
    pub fn is_made(&self, sandbox: &str, path: &[u8], target: &[u8]) -> bool {
        self.known
            .lock()
            .expect("made links lock")
            .targets
            .get(&(sandbox.to_string(), path.to_vec()))
            .is_some_and(|t| t == target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_link_is_known_by_sandbox_path_and_exact_target_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let links = MadeLinks::open(Some(dir.path()));
        links.made("id:a", b"venv/bin/python3", b"/usr/bin/python3");
        assert!(links.is_made("id:a", b"venv/bin/python3", b"/usr/bin/python3"));
        assert!(
            !links.is_made("id:a", b"venv/bin/python3", b"/etc/passwd"),
            "another target"
        );
        assert!(
            !links.is_made("id:a", b"python3", b"/usr/bin/python3"),
            "another path"
        );
        assert!(
            !links.is_made("id:b", b"venv/bin/python3", b"/usr/bin/python3"),
            "another sandbox"
        );
        let again = MadeLinks::open(Some(dir.path()));
        assert!(
            again.is_made("id:a", b"venv/bin/python3", b"/usr/bin/python3"),
            "durable"
        );
        // Made again with another target: the latest counts.
        again.made("id:a", b"venv/bin/python3", b"/opt/python3");
        let third = MadeLinks::open(Some(dir.path()));
        assert!(third.is_made("id:a", b"venv/bin/python3", b"/opt/python3"));
        assert!(!third.is_made("id:a", b"venv/bin/python3", b"/usr/bin/python3"));
        let mode = std::os::unix::fs::MetadataExt::mode(
            &std::fs::metadata(dir.path().join(FILE)).unwrap(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_link_removed_or_renamed_through_the_mount_is_forgotten_or_follows_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let links = MadeLinks::open(Some(dir.path()));
        links.made("s", b"a", b"/t");
        links.made("s", b"b", b"/u");
        links.renamed("s", b"a", b"c", false);
        assert!(!links.is_made("s", b"a", b"/t"));
        assert!(links.is_made("s", b"c", b"/t"));
        links.forget("s", b"b");
        let again = MadeLinks::open(Some(dir.path()));
        assert!(!again.is_made("s", b"b", b"/u"), "forgotten durably");
        assert!(again.is_made("s", b"c", b"/t"));
        assert!(!again.is_made("s", b"a", b"/t"));
    }

    #[test]
    fn without_a_directory_links_are_known_for_the_mount_only() {
        let links = MadeLinks::open(None);
        links.made("s", b"l", b"/t");
        assert!(links.is_made("s", b"l", b"/t"));
    }
}
