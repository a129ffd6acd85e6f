//! Files the agent keeps open for the mounts reading them, by path and version: a file the
//! sandbox replaces by rename (or removes) while a program on the laptop reads it stays
//! readable, as it does on a local disk and over sshfs (whose server holds a handle per open
//! file). Without it a reader met `ESTALE` halfway through, and git's mmap of its index died
//! of `SIGBUS` when the sandbox's git rewrote it.
//!
//! Bounded in count and in time: a removed file's blocks stay taken while it is held, so an
//! entry goes after [`HELD_IDLE`] without a read, and the oldest goes past [`HELD_MAX`].

use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::remote::{RemotePath, Version};

/// Files held at once.
pub const HELD_MAX: usize = 64;
/// How long a file is held after its last read.
pub const HELD_IDLE: Duration = Duration::from_secs(30);

struct Held {
    file: Arc<File>,
    used: Instant,
}

pub struct HeldFiles {
    files: Mutex<lru::LruCache<(RemotePath, Version), Held>>,
}

impl Default for HeldFiles {
    fn default() -> Self {
        HeldFiles {
            files: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(HELD_MAX).expect("not zero"),
            )),
        }
    }
}

impl HeldFiles {
    /// The file read as `path` at `version`, if still held (and marked as just used).
    pub fn get(&self, path: &RemotePath, version: &Version, now: Instant) -> Option<Arc<File>> {
        let mut files = self.lock();
        Self::prune_locked(&mut files, now);
        let held = files.get_mut(&(path.clone(), version.clone()))?;
        held.used = now;
        Some(held.file.clone())
    }

    /// Hold `file`, just read as `path` at `version`.
    pub fn keep(&self, path: RemotePath, version: Version, file: Arc<File>, now: Instant) {
        let mut files = self.lock();
        Self::prune_locked(&mut files, now);
        files.put((path, version), Held { file, used: now });
    }

    /// The file at `path` is no longer at `version` (changed in place): not held under it.
    pub fn forget(&self, path: &RemotePath, version: &Version) {
        self.lock().pop(&(path.clone(), version.clone()));
    }

    /// Let go of every file not read for [`HELD_IDLE`].
    pub fn prune(&self, now: Instant) {
        Self::prune_locked(&mut self.lock(), now);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn prune_locked(files: &mut lru::LruCache<(RemotePath, Version), Held>, now: Instant) {
        while files
            .peek_lru()
            .is_some_and(|(_, h)| now.saturating_duration_since(h.used) >= HELD_IDLE)
        {
            files.pop_lru();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<(RemotePath, Version), Held>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Arc<File> {
        Arc::new(tempfile::tempfile().unwrap())
    }

    #[test]
    fn held_files_go_when_idle_or_past_the_bound() {
        let held = HeldFiles::default();
        let t0 = Instant::now();
        let p = |s: &str| RemotePath::new(s.as_bytes().to_vec()).unwrap();
        let v = |s: &str| Version(s.into());
        held.keep(p("a"), v("1"), file(), t0);
        assert!(held.get(&p("a"), &v("1"), t0).is_some());
        assert!(held.get(&p("a"), &v("2"), t0).is_none(), "another version");
        assert!(held.get(&p("b"), &v("1"), t0).is_none(), "another path");
        // A read keeps it; idle for HELD_IDLE, it goes.
        let later = t0 + HELD_IDLE / 2;
        assert!(held.get(&p("a"), &v("1"), later).is_some());
        assert!(held.get(&p("a"), &v("1"), later + HELD_IDLE / 2).is_some());
        held.prune(later + HELD_IDLE * 2);
        assert!(held.is_empty());
        for i in 0..HELD_MAX + 5 {
            held.keep(p(&format!("f{i}")), v("1"), file(), t0);
        }
        assert_eq!(held.len(), HELD_MAX);
        assert!(held.get(&p("f0"), &v("1"), t0).is_none(), "the oldest went");
        held.forget(&p("f10"), &v("1"));
        assert!(held.get(&p("f10"), &v("1"), t0).is_none());
    }
}
