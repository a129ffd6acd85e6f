//! Listings fetched ahead by a subtree prefetch ([`crate::remote::Remote::tree_listings`]) for
//! directories the kernel has not looked up yet, so they have no node to key the metadata
//! cache ([`super::meta`]) by. Kept by path with the directory's identity (device, inode) as
//! the prefetch saw it, and adopted into the metadata cache when the directory's node first
//! needs its listing: a listing is only ever adopted by the same directory, so a path that
//! now names another one (renamed, removed and made again) never gets a listing not its own.
//! Each keeps its fetch time, so the attribute TTL counts from the fetch, as for any listing.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::Instant;

use lru::LruCache;

use super::inode::{NodeId, RemoteId};
use super::meta::Entries;
use crate::remote::RemotePath;

/// Directories kept ahead: a large source tree's directories (the benchmark tree has 300);
/// beyond it the least recently fetched are listed again when entered.
const MAX_PREFETCHED: usize = 8192;

/// Directories remembered as looked at: forgetting one costs one more subtree fetch, no more
/// (8 bytes each).
const MAX_LOOKED: usize = 1 << 16;

struct Held {
    dir: RemoteId,
    entries: Entries,
    fetched: Instant,
}

pub struct Prefetched {
    by_path: Mutex<LruCache<RemotePath, Held>>,
    /// Directories whose first look is done (listed, or given a listing fetched ahead).
    looked: Mutex<LruCache<NodeId, ()>>,
}

impl Default for Prefetched {
    fn default() -> Self {
        Prefetched {
            by_path: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_PREFETCHED).expect("non-zero"),
            )),
            looked: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_LOOKED).expect("non-zero"),
            )),
        }
    }
}

impl Prefetched {
    pub fn put(&self, path: RemotePath, dir: RemoteId, entries: Entries, fetched: Instant) {
        self.by_path.lock().expect("prefetch lock").put(
            path,
            Held {
                dir,
                entries,
                fetched,
            },
        );
    }

    /// The listing kept for `path` if it is `dir`'s (removed either way).
    pub fn take(&self, path: &RemotePath, dir: RemoteId) -> Option<(Entries, Instant)> {
        let held = self.by_path.lock().expect("prefetch lock").pop(path)?;
        (held.dir == dir).then_some((held.entries, held.fetched))
    }

    /// Forget `path`'s listing (a change in that directory).
    pub fn forget(&self, path: &RemotePath) {
        self.by_path.lock().expect("prefetch lock").pop(path);
    }

    /// Forget `path` and everything beneath it (a change made through the mount there).
    pub fn forget_under(&self, path: &RemotePath) {
        let mut m = self.by_path.lock().expect("prefetch lock");
        if path.is_root() {
            m.clear();
            return;
        }
        let p = path.as_bytes();
        let gone: Vec<RemotePath> = m
            .iter()
            .map(|(k, _)| k)
            .filter(|k| {
                let k = k.as_bytes();
                k.starts_with(p) && (k.len() == p.len() || k[p.len()] == b'/')
            })
            .cloned()
            .collect();
        for k in gone {
            m.pop(&k);
        }
    }

    /// `dir`'s first look is done.
    pub fn mark_looked(&self, dir: NodeId) {
        self.looked.lock().expect("prefetch lock").put(dir, ());
    }

    pub fn looked(&self, dir: NodeId) -> bool {
        self.looked.lock().expect("prefetch lock").contains(&dir)
    }

    pub fn len(&self) -> usize {
        self.by_path.lock().expect("prefetch lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rp(s: &str) -> RemotePath {
        RemotePath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn id(ino: u64) -> RemoteId {
        RemoteId {
            dev: 1,
            ino,
            born: 0,
        }
    }

    #[test]
    fn a_listing_is_adopted_only_by_the_directory_it_was_fetched_for() {
        let p = Prefetched::default();
        p.put(rp("a"), id(5), Arc::new(Vec::new()), Instant::now());
        assert!(
            p.take(&rp("a"), id(6)).is_none(),
            "another directory at that path"
        );
        assert!(p.take(&rp("a"), id(5)).is_none(), "dropped by the mismatch");
        p.put(rp("a"), id(5), Arc::new(Vec::new()), Instant::now());
        assert!(p.take(&rp("a"), id(5)).is_some());
    }

    #[test]
    fn forgetting_a_path_forgets_its_subtree_and_nothing_else() {
        let p = Prefetched::default();
        for (path, ino) in [("a", 1), ("a/b", 2), ("a/b/c", 3), ("ab", 4), ("z", 5)] {
            p.put(rp(path), id(ino), Arc::new(Vec::new()), Instant::now());
        }
        p.forget_under(&rp("a/b"));
        assert!(p.take(&rp("a/b"), id(2)).is_none());
        assert!(p.take(&rp("a/b/c"), id(3)).is_none());
        assert!(p.take(&rp("a"), id(1)).is_some());
        assert!(p.take(&rp("ab"), id(4)).is_some());
        p.forget_under(&RemotePath::root());
        assert!(p.is_empty());
    }
}
