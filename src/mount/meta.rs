//! The metadata cache: directory listings (every entry with its attributes, from one round
//! trip), keyed by the directory's node so a renamed directory keeps its listing. Trusted for
//! the attribute TTL, served past it only while the sandbox does not answer. Bounded by a
//! count of directories and of entries over all; a node's own attributes live in the inode
//! table.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;

use super::inode::NodeId;
use crate::remote::Attr;

/// Directories whose listings are kept: a large source tree's worth.
const MAX_LISTINGS: usize = 4096;
/// Entries kept over all listings: a sandbox answering every directory with a huge listing
/// costs the laptop this much, never more. The oldest listings go first; the one just fetched
/// stays (one listing is bounded on its own, by entries and by [`MAX_BYTES`]).
const MAX_ENTRIES: usize = 1_000_000;
/// Bytes the kept listings take together, as [`entry_cost`] counts them: a million entries of
/// ordinary names fit, a hostile sandbox's million 255-byte names (about 700 MB) do not. A
/// listing costing more than this on its own is used for the call that fetched it and not
/// kept (its directory's names are then looked up one by one).
const MAX_BYTES: usize = 256 * 1024 * 1024;

/// What one entry holds in memory: its name twice (the entry and the index by name), its
/// attributes and their strings, and the index's slot.
fn entry_cost(name: &[u8], attr: &Attr) -> usize {
    2 * name.len()
        + std::mem::size_of::<(Vec<u8>, Attr)>()
        + std::mem::size_of::<(Vec<u8>, usize)>()
        + attr.version.0.len()
        + attr.symlink_target.as_ref().map_or(0, |t| t.0.len())
}

/// A directory's entries (name, attributes), sorted by name.
pub type Entries = Arc<Vec<(Vec<u8>, Attr)>>;

struct Listing {
    entries: Entries,
    by_name: BTreeMap<Vec<u8>, usize>,
    fetched: Instant,
    /// What its entries hold in memory ([`entry_cost`]).
    bytes: usize,
    /// Names the change feed reported made, removed or renamed since it was fetched: past its
    /// TTL (a sandbox out of reach) it says nothing of them, rather than the opposite of what
    /// the sandbox was seen doing.
    doubted: BTreeSet<Vec<u8>>,
}

pub struct MetaCache {
    listings: Mutex<LruCache<NodeId, Listing>>,
    /// What listing ages are read from ([`super::clock`]).
    clock: super::clock::Clock,
}

impl Default for MetaCache {
    fn default() -> Self {
        Self::new()
    }
}

impl MetaCache {
    pub fn new() -> Self {
        Self::with_clock(super::clock::Clock::system())
    }

    pub fn with_clock(clock: super::clock::Clock) -> Self {
        MetaCache {
            listings: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_LISTINGS).expect("non-zero"),
            )),
            clock,
        }
    }

    pub fn put(&self, dir: NodeId, entries: Entries) {
        self.put_at(dir, entries, self.clock.now());
    }

    /// A listing fetched at `fetched` (a prefetched one: its TTL counts from its fetch).
    pub fn put_at(&self, dir: NodeId, entries: Entries, fetched: Instant) {
        let bytes = entries.iter().map(|(n, a)| entry_cost(n, a)).sum();
        if bytes > MAX_BYTES {
            // Too large to keep: what was kept of the directory is older than this answer.
            self.invalidate(dir);
            return;
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        let mut l = self.listings.lock().expect("listings lock");
        l.put(
            dir,
            Listing {
                entries,
                by_name,
                fetched,
                bytes,
                doubted: BTreeSet::new(),
            },
        );
        let mut entries: usize = l.iter().map(|(_, x)| x.entries.len()).sum();
        let mut bytes: usize = l.iter().map(|(_, x)| x.bytes).sum();
        while (entries > MAX_ENTRIES || bytes > MAX_BYTES) && l.len() > 1 {
            match l.pop_lru() {
                Some((_, x)) => {
                    entries -= x.entries.len();
                    bytes -= x.bytes;
                }
                None => break,
            }
        }
    }

    /// The listing, if fresh (or at any age with `stale_ok`).
    pub fn listing(&self, dir: NodeId, ttl: Duration, stale_ok: bool) -> Option<Entries> {
        let mut l = self.listings.lock().expect("listings lock");
        let x = l.get(&dir)?;
        (stale_ok || self.clock.since(x.fetched) < ttl).then(|| x.entries.clone())
    }

    /// What the listing says of one name: `Some(Some(attr))`, `Some(None)` (not there: a brief
    /// negative answer), or `None` (no usable listing).
    pub fn entry(
        &self,
        dir: NodeId,
        name: &[u8],
        ttl: Duration,
        stale_ok: bool,
    ) -> Option<Option<Attr>> {
        let mut l = self.listings.lock().expect("listings lock");
        let x = l.get(&dir)?;
        if x.doubted.contains(name) || (self.clock.since(x.fetched) >= ttl && !stale_ok) {
            return None;
        }
        Some(x.by_name.get(name).map(|&i| x.entries[i].1.clone()))
    }

    /// One entry's has-xattrs bit, changed through the mount (the rest of the listing stands).
    pub fn set_has_xattrs(&self, dir: NodeId, name: &[u8], has: Option<bool>) {
        let mut l = self.listings.lock().expect("listings lock");
        if let Some(x) = l.get_mut(&dir) {
            if let Some(&i) = x.by_name.get(name) {
                Arc::make_mut(&mut x.entries)[i].1.has_xattrs = has;
            }
        }
    }

    /// One name made or changed through the mount: a cached listing takes it in place and keeps
    /// its age, so lookups of other names there stay local (`tar -x` asks for each name it
    /// makes just before making it).
    pub fn upsert(&self, dir: NodeId, name: &[u8], attr: Attr) {
        let mut l = self.listings.lock().expect("listings lock");
        if let Some(x) = l.get_mut(&dir) {
            x.doubted.remove(name);
            match x.by_name.get(name) {
                Some(&i) => Arc::make_mut(&mut x.entries)[i].1 = attr,
                None => {
                    x.bytes += entry_cost(name, &attr);
                    let entries = Arc::make_mut(&mut x.entries);
                    x.by_name.insert(name.to_vec(), entries.len());
                    entries.push((name.to_vec(), attr));
                }
            }
        }
    }

    /// A name's attributes changed through the mount: a cached listing that has the name
    /// takes them in place (a name it lacks is not added).
    pub fn update_existing(&self, dir: NodeId, name: &[u8], attr: Attr) {
        let mut l = self.listings.lock().expect("listings lock");
        if let Some(x) = l.get_mut(&dir) {
            if let Some(&i) = x.by_name.get(name) {
                Arc::make_mut(&mut x.entries)[i].1 = attr;
            }
        }
    }

    /// One name removed through the mount: a cached listing drops it in place and keeps its
    /// age, as [`Self::upsert`] does for a name made.
    pub fn remove(&self, dir: NodeId, name: &[u8]) {
        let mut l = self.listings.lock().expect("listings lock");
        if let Some(x) = l.get_mut(&dir) {
            if let Some(i) = x.by_name.remove(name) {
                let entries = Arc::make_mut(&mut x.entries);
                let (n, a) = entries.remove(i);
                x.bytes = x.bytes.saturating_sub(entry_cost(&n, &a));
                for (n, at) in x.by_name.iter_mut() {
                    if *at > i {
                        *at -= 1;
                    }
                    debug_assert_eq!(&entries[*at].0, n);
                }
            }
        }
    }

    /// The listing is no longer trusted, but kept to be served while the sandbox does not
    /// answer (as one past its TTL is).
    pub fn expire(&self, dir: NodeId) {
        if let Some(x) = self.listings.lock().expect("listings lock").get_mut(&dir) {
            x.fetched = x.fetched.min(long_ago());
        }
    }

    /// The sandbox made, removed or renamed `name` in `dir` (the change feed said so): the
    /// listing is expired ([`Self::expire`]) and says nothing of that name any more.
    pub fn doubt(&self, dir: NodeId, name: &[u8]) {
        if let Some(x) = self.listings.lock().expect("listings lock").get_mut(&dir) {
            x.fetched = x.fetched.min(long_ago());
            x.doubted.insert(name.to_vec());
        }
    }

    /// The mount changed what `name` in `dir` is (a name made in that directory moved its
    /// times) without knowing its new attributes: the listing, kept and as old as it was,
    /// says nothing of that name any more until it is fetched again.
    pub fn doubt_entry(&self, dir: NodeId, name: &[u8]) {
        if let Some(x) = self.listings.lock().expect("listings lock").get_mut(&dir) {
            x.doubted.insert(name.to_vec());
        }
    }

    pub fn invalidate(&self, dir: NodeId) {
        self.listings.lock().expect("listings lock").pop(&dir);
    }

    /// Every listing may be stale (the change feed missed events): none is trusted again,
    /// but each is kept, to be served while the sandbox does not answer, as any listing past
    /// its TTL is. (Forgetting them would leave `ls` of a directory listed a minute ago with
    /// nothing to show when the revalidation that follows finds the sandbox gone.)
    pub fn expire_all(&self) {
        let long_ago = long_ago();
        for (_, x) in self.listings.lock().expect("listings lock").iter_mut() {
            x.fetched = x.fetched.min(long_ago);
        }
    }
}

/// A fetch time past any TTL: the listing is kept, and trusted only by a sandbox out of reach.
fn long_ago() -> Instant {
    Instant::now()
        .checked_sub(Duration::from_secs(86_400 * 365))
        .unwrap_or_else(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{FileKind, Version};

    fn attr() -> Attr {
        Attr {
            kind: FileKind::File,
            size: 1,
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 0,
            ino: 3,
            born_ns: 0,
            nlink: 1,
            rdev: 0,
            symlink_target: None,
            version: Version("v".into()),
            has_xattrs: None,
        }
    }

    #[test]
    fn expired_listings_are_kept_for_when_the_sandbox_does_not_answer() {
        let m = MetaCache::new();
        m.put(NodeId(7), Arc::new(vec![(b"a".to_vec(), attr())]));
        m.expire_all();
        let year = Duration::from_secs(86_400 * 300);
        assert!(m.listing(NodeId(7), year, false).is_none(), "not trusted");
        assert_eq!(m.listing(NodeId(7), year, true).unwrap().len(), 1, "kept");
    }

    #[test]
    fn a_listing_is_trusted_for_its_ttl_and_not_a_moment_longer() {
        let clock = crate::mount::clock::Clock::manual();
        let m = MetaCache::with_clock(clock.clone());
        m.put(NodeId(1), Arc::new(vec![(b"a".to_vec(), attr())]));
        let ttl = Duration::from_secs(1);
        clock.advance(Duration::from_millis(999));
        assert!(m.listing(NodeId(1), ttl, false).is_some());
        clock.advance(Duration::from_millis(1));
        assert!(m.listing(NodeId(1), ttl, false).is_none());
        assert!(m.entry(NodeId(1), b"a", ttl, false).is_none());
        assert!(
            m.listing(NodeId(1), ttl, true).is_some(),
            "kept, served when stale is ok"
        );
    }

    #[test]
    fn a_stale_listing_is_served_only_when_asked_for() {
        let m = MetaCache::new();
        m.put(NodeId(1), Arc::new(vec![(b"a".to_vec(), attr())]));
        let ttl = Duration::from_millis(0);
        assert!(m.entry(NodeId(1), b"a", ttl, false).is_none());
        assert!(matches!(m.entry(NodeId(1), b"a", ttl, true), Some(Some(_))));
        assert!(matches!(m.entry(NodeId(1), b"b", ttl, true), Some(None)));
        m.invalidate(NodeId(1));
        assert!(m.entry(NodeId(1), b"a", ttl, true).is_none());
    }

    #[test]
    fn an_entrys_xattr_bit_changes_alone() {
        let m = MetaCache::new();
        let none = Attr {
            has_xattrs: Some(false),
            ..attr()
        };
        let held = Arc::new(vec![(b"a".to_vec(), none.clone()), (b"b".to_vec(), none)]);
        m.put(NodeId(1), held.clone());
        m.set_has_xattrs(NodeId(1), b"a", Some(true));
        m.set_has_xattrs(NodeId(1), b"gone", Some(true));
        let ttl = Duration::from_secs(60);
        let got = |n: &[u8]| m.entry(NodeId(1), n, ttl, false).unwrap().unwrap();
        assert_eq!(got(b"a").has_xattrs, Some(true));
        assert_eq!(got(b"b").has_xattrs, Some(false));
        // A listing already handed out is not changed under its reader.
        assert_eq!(held[0].1.has_xattrs, Some(false));
    }

    #[test]
    fn a_name_removed_leaves_the_rest_of_the_listing_and_its_age() {
        let m = MetaCache::new();
        let names: Vec<(Vec<u8>, Attr)> = [&b"a"[..], b"b", b"c", b"d"]
            .iter()
            .map(|n| (n.to_vec(), attr()))
            .collect();
        m.put(NodeId(1), Arc::new(names));
        m.remove(NodeId(1), b"b");
        m.remove(NodeId(1), b"never");
        m.remove(NodeId(2), b"a");
        let ttl = Duration::from_secs(60);
        let listed: Vec<Vec<u8>> = m
            .listing(NodeId(1), ttl, false)
            .expect("still trusted")
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        assert_eq!(listed, [b"a".to_vec(), b"c".to_vec(), b"d".to_vec()]);
        for n in [&b"a"[..], b"c", b"d"] {
            assert!(m.entry(NodeId(1), n, ttl, false).unwrap().is_some());
        }
        assert_eq!(m.entry(NodeId(1), b"b", ttl, false), Some(None));
        // Removed then made again: one entry.
        m.upsert(NodeId(1), b"b", attr());
        assert_eq!(m.listing(NodeId(1), ttl, false).unwrap().len(), 4);
    }

    #[test]
    fn listings_are_bounded_by_their_entries_over_all_oldest_first() {
        let m = MetaCache::new();
        let big = |n: usize| -> Entries {
            Arc::new(
                (0..n)
                    .map(|i| (format!("f{i}").into_bytes(), attr()))
                    .collect(),
            )
        };
        m.put(NodeId(1), big(MAX_ENTRIES / 2));
        m.put(NodeId(2), big(MAX_ENTRIES / 2));
        let ttl = Duration::from_secs(60);
        // A third pushes the total past the bound: the least recently used goes.
        m.put(NodeId(3), big(10));
        assert!(m.listing(NodeId(1), ttl, false).is_none());
        assert!(m.listing(NodeId(2), ttl, false).is_some());
        assert!(m.listing(NodeId(3), ttl, false).is_some());
        // One listing past the bound on its own stays, alone.
        m.put(NodeId(4), big(MAX_ENTRIES + 1));
        assert!(m.listing(NodeId(4), ttl, false).is_some());
        assert!(m.listing(NodeId(2), ttl, false).is_none());
        assert!(m.listing(NodeId(3), ttl, false).is_none());
    }

    #[test]
    fn listings_are_bounded_by_their_bytes_and_a_hostile_one_is_not_kept() {
        let m = MetaCache::new();
        let ttl = Duration::from_secs(60);
        let long = |n: usize, tag: u8| -> Entries {
            Arc::new(
                (0..n)
                    .map(|i| {
                        let mut name = vec![tag; 240];
                        name.extend_from_slice(format!("{i:09}").as_bytes());
                        (name, attr())
                    })
                    .collect(),
            )
        };
        let per = entry_cost(&[0; 249], &attr());
        // Two listings of 255-byte names that fit alone but not together.
        let n = MAX_BYTES / per * 2 / 3;
        m.put(NodeId(1), long(n, b'a'));
        m.put(NodeId(2), long(n, b'b'));
        assert!(
            m.listing(NodeId(1), ttl, false).is_none(),
            "evicted by bytes"
        );
        assert!(m.listing(NodeId(2), ttl, false).is_some());
        // A million of them (a hostile sandbox) is used once and never kept, and what was
        // kept of that directory goes too (it is older than the answer).
        m.put(NodeId(2), long(MAX_BYTES / per + 1, b'c'));
        assert!(m.listing(NodeId(2), ttl, true).is_none());
        // Ordinary listings are kept as before.
        m.put(NodeId(3), long(10, b'd'));
        assert!(m.listing(NodeId(3), ttl, false).is_some());
    }

    #[test]
    fn a_name_the_feed_reported_is_never_answered_from_a_stale_listing() {
        let m = MetaCache::new();
        let dir = NodeId(1);
        m.put(dir, Arc::new(vec![(b"a".to_vec(), attr())]));
        let ttl = Duration::from_secs(60);
        assert_eq!(m.entry(dir, b"c", ttl, false), Some(None));
        m.doubt(dir, b"c");
        // Not trusted; served while the sandbox is out of reach, except for the name reported.
        assert_eq!(m.entry(dir, b"c", ttl, false), None);
        assert_eq!(m.entry(dir, b"c", ttl, true), None);
        assert!(m.entry(dir, b"a", ttl, true).unwrap().is_some());
        assert_eq!(m.entry(dir, b"b", ttl, true), Some(None));
        // A listing fetched again knows every name.
        m.put(dir, Arc::new(vec![(b"c".to_vec(), attr())]));
        assert!(m.entry(dir, b"c", ttl, false).unwrap().is_some());
    }
}
