//! Names the sandbox changed lately (its own change feed said so). A file the sandbox keeps
//! replacing (git's index while git runs there, a build's output, an agent's edits) may be
//! replaced again between the feed's last word and a local `open`: such an open asks the
//! sandbox first ([`crate::mount::core::FsCore::open`]) instead of trusting what the feed
//! said.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::remote::RemotePath;

/// Names remembered at once (the oldest go first).
const MAX_NAMES: usize = 4096;
/// How long a name counts as changing.
pub const RECENT: Duration = Duration::from_secs(5);

pub struct RecentChanges {
    names: Mutex<lru::LruCache<RemotePath, Instant>>,
}

impl Default for RecentChanges {
    fn default() -> Self {
        RecentChanges {
            names: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(MAX_NAMES).expect("not zero"),
            )),
        }
    }
}

impl RecentChanges {
    /// The sandbox changed `path` at `now`.
    pub fn note(&self, path: &RemotePath, now: Instant) {
        self.lock().put(path.clone(), now);
    }

    /// Whether the sandbox changed `path` within [`RECENT`] before `now`.
    pub fn changing(&self, path: &RemotePath, now: Instant) -> bool {
        self.lock()
            .peek(path)
            .is_some_and(|at| now.saturating_duration_since(*at) < RECENT)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<RemotePath, Instant>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_changing_for_a_while_after_its_change() {
        let r = RecentChanges::default();
        let p = RemotePath::new(b"a/b".to_vec()).unwrap();
        let t0 = Instant::now();
        assert!(!r.changing(&p, t0));
        r.note(&p, t0);
        assert!(r.changing(&p, t0 + RECENT / 2));
        assert!(!r.changing(&p, t0 + RECENT));
        assert!(!r.changing(&RemotePath::new(b"a".to_vec()).unwrap(), t0));
    }
}
