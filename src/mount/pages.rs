//! The page cache: file data in fixed pages keyed by (version, page index), in an LRU bounded
//! by bytes. A version names content, so a changed file never serves stale pages, and nothing
//! has to be invalidated when it changes: old pages simply age out.
//!
//! Concurrent readers of one missing page share one fetch (the kernel's read-ahead and a
//! reader racing it would otherwise each make a remote call).
//!
//! Behind the memory sits an optional disk tier ([`DiskPages`], attached once the sandbox's
//! identity is known): a page missing in memory is looked for there, and every page kept in
//! memory is kept there too, so a remount serves unchanged files without fetching them.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::FutureExt;
use lru::LruCache;

use super::disk_pages::DiskPages;
use crate::remote::{RemoteError, Version};

/// Size of a page: the unit fetched from the sandbox and staged locally.
pub const PAGE: u64 = 128 * 1024;

/// The index of a page within a file.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct PageIndex(pub u64);

impl PageIndex {
    pub fn containing(offset: u64) -> Self {
        PageIndex(offset / PAGE)
    }

    pub fn start(self) -> u64 {
        self.0 * PAGE
    }
}

type Key = (Version, PageIndex);
type Fetch = tokio::sync::OnceCell<Result<(Bytes, Version), RemoteError>>;

pub struct PageCache {
    lru: Mutex<Lru>,
    inflight: Mutex<HashMap<Key, Arc<Fetch>>>,
    forgotten: Mutex<Forgotten>,
    disk: std::sync::OnceLock<DiskPages>,
    disk_hits: std::sync::atomic::AtomicU64,
}

/// Versions whose pages were dropped lately ([`PageCache::forget_version`]), numbered: a
/// fetch that started before a version was forgotten does not file its bytes under it (they
/// may be the bytes the file held before it was rewritten under the same version, and would
/// then be served for good).
#[derive(Default)]
struct Forgotten {
    count: u64,
    recent: VecDeque<(Version, u64)>,
}

/// Forgotten versions remembered: far more than fetches in flight can span.
const FORGOTTEN_KEPT: usize = 1024;

struct Lru {
    map: LruCache<Key, Bytes>,
    bytes: u64,
    cap: u64,
}

impl PageCache {
    pub fn new(cap_bytes: u64) -> Self {
        PageCache {
            lru: Mutex::new(Lru {
                map: LruCache::unbounded(),
                bytes: 0,
                cap: cap_bytes.max(PAGE),
            }),
            inflight: Mutex::new(HashMap::new()),
            forgotten: Mutex::new(Forgotten::default()),
            disk: std::sync::OnceLock::new(),
            disk_hits: Default::default(),
        }
    }

    /// Keep pages on disk too, from now on (once: a second tier is ignored).
    pub fn attach_disk(&self, disk: DiskPages) {
        let _ = self.disk.set(disk);
    }

    /// Pages served from the disk tier.
    pub fn disk_hits(&self) -> u64 {
        self.disk_hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a page is in memory or on disk (read-ahead leaves such pages alone).
    fn holds(&self, key: &Key, ctime: Option<i64>) -> bool {
        self.lru.lock().expect("page cache lock").map.contains(key)
            || ctime.is_some_and(|c| self.disk.get().is_some_and(|d| d.has(&key.0, c, key.1)))
    }

    /// Where the count of forgotten versions stands (taken before a fetch).
    fn mark(&self) -> u64 {
        self.forgotten.lock().expect("forgotten lock").count
    }

    /// File fetched bytes, unless their version was forgotten since `mark`; on disk too if
    /// they are of the version asked for, whose ctime is `ctime`.
    fn put_fetched(
        &self,
        mark: u64,
        (version, asked): (Version, &Version),
        ctime: Option<i64>,
        page: PageIndex,
        data: Bytes,
    ) {
        let forgotten = {
            let f = self.forgotten.lock().expect("forgotten lock");
            f.recent
                .iter()
                .rev()
                .take_while(|(_, at)| *at > mark)
                .any(|(v, _)| *v == version)
        };
        if !forgotten {
            let ctime = ctime.filter(|_| version == *asked);
            self.put(version, ctime, page, data);
        }
    }

    /// The page of `version`: from memory, else (given the ctime the file has at that version,
    /// as the mount knows it) from disk.
    pub fn get(&self, version: &Version, ctime: Option<i64>, page: PageIndex) -> Option<Bytes> {
        let found = {
            let mut l = self.lru.lock().expect("page cache lock");
            l.map.get(&(version.clone(), page)).cloned()
        };
        found.or_else(|| {
            let data = self.disk.get()?.get(version, ctime?, page)?;
            self.disk_hits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.keep_in_memory(version.clone(), page, data.clone());
            Some(data)
        })
    }

    /// Keep a page of `version` in memory, and on disk too given the file's ctime at it.
    pub fn put(&self, version: Version, ctime: Option<i64>, page: PageIndex, data: Bytes) {
        if let (Some(d), Some(c)) = (self.disk.get(), ctime) {
            d.put(version.clone(), c, page, data.clone());
        }
        self.keep_in_memory(version, page, data);
    }

    fn keep_in_memory(&self, version: Version, page: PageIndex, data: Bytes) {
        let mut l = self.lru.lock().expect("page cache lock");
        l.bytes += data.len() as u64;
        if let Some(old) = l.map.put((version, page), data) {
            l.bytes -= old.len() as u64;
        }
        while l.bytes > l.cap {
            match l.map.pop_lru() {
                Some((_, d)) => l.bytes -= d.len() as u64,
                None => break,
            }
        }
    }

    /// Drop every page of `version`: the file may hold other bytes under it (rewritten in
    /// place with its size and mtime put back, as `cp -p` and `rsync -t --inplace` do).
    pub fn forget_version(&self, version: &Version) {
        {
            let mut f = self.forgotten.lock().expect("forgotten lock");
            f.count += 1;
            let at = f.count;
            f.recent.push_back((version.clone(), at));
            if f.recent.len() > FORGOTTEN_KEPT {
                f.recent.pop_front();
            }
        }
        if let Some(d) = self.disk.get() {
            d.forget(version);
        }
        let mut l = self.lru.lock().expect("page cache lock");
        let keys: Vec<Key> = l
            .map
            .iter()
            .filter(|((v, _), _)| v == version)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(d) = l.map.pop(&k) {
                l.bytes -= d.len() as u64;
            }
        }
    }

    pub fn bytes(&self) -> u64 {
        self.lru.lock().expect("page cache lock").bytes
    }

    /// The page from the cache, or from `fetch` run once however many callers want it at the
    /// same time. `fetch` answers the bytes and the version they came from; they are filed
    /// under that version (never under one they are not from), which is answered too when it
    /// is not the one asked for. The last field says whether it was a cache hit.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        version: &Version,
        ctime: Option<i64>,
        page: PageIndex,
        fetch: F,
    ) -> Result<(Bytes, Option<Version>, bool), RemoteError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Bytes, Version), RemoteError>>,
    {
        if let Some(d) = self.get(version, ctime, page) {
            return Ok((d, None, true));
        }
        let key = (version.clone(), page);
        let cell = self
            .inflight
            .lock()
            .expect("inflight lock")
            .entry(key.clone())
            .or_default()
            .clone();
        let mark = self.mark();
        let result = cell
            .get_or_init(|| async {
                let (data, from) = fetch().await?;
                self.put_fetched(mark, (from.clone(), version), ctime, page, data.clone());
                Ok((data, from))
            })
            .await
            .clone();
        self.inflight.lock().expect("inflight lock").remove(&key);
        // Bytes of another version than asked are filed under theirs, and said to be other.
        result.map(|(d, from)| {
            let other = (&from != version).then_some(from);
            (d, other, false)
        })
    }
}

impl PageCache {
    /// Fetch `count` pages from `first` with one call of `fetch` (given the first page of the
    /// run it should read and how many pages), for read-ahead. Pages already cached or being
    /// fetched are left alone: the run is the free pages from the first free one on, up to the
    /// next busy one. Readers of these pages meanwhile wait for this fetch rather than making
    /// their own; if it is dropped half-way they fetch for themselves.
    pub async fn fetch_run<F, Fut>(
        &self,
        (version, ctime): (&Version, Option<i64>),
        first: PageIndex,
        count: u64,
        fetch: F,
    ) where
        F: FnOnce(PageIndex, u64) -> Fut,
        Fut: Future<Output = Result<(Bytes, Version), RemoteError>>,
    {
        let claim = Claim {
            cache: self,
            version,
            cells: self.claim_run((version, ctime), first, count),
        };
        let Some((start, _)) = claim.cells.first() else {
            return;
        };
        let start = *start;
        let mark = self.mark();
        let run = fetch(start, claim.cells.len() as u64).shared();
        let fills = claim.cells.iter().map(|(page, cell)| {
            let run = run.clone();
            let page = *page;
            cell.get_or_init(move || async move {
                let (data, from) = run.await?;
                let at = ((page.0 - start.0) * PAGE) as usize;
                let slice = data.slice(at.min(data.len())..(at + PAGE as usize).min(data.len()));
                self.put_fetched(mark, (from.clone(), version), ctime, page, slice.clone());
                Ok((slice, from))
            })
        });
        futures_util::future::join_all(fills).await;
    }

    /// Register fetches for the free pages of a run (see [`PageCache::fetch_run`]).
    fn claim_run(
        &self,
        (version, ctime): (&Version, Option<i64>),
        first: PageIndex,
        count: u64,
    ) -> Vec<(PageIndex, Arc<Fetch>)> {
        let mut cells = Vec::new();
        let mut inflight = self.inflight.lock().expect("inflight lock");
        for i in first.0..first.0 + count {
            let key = (version.clone(), PageIndex(i));
            let busy = inflight.contains_key(&key) || self.holds(&key, ctime);
            match (busy, cells.is_empty()) {
                (true, true) => continue,
                (true, false) => break,
                (false, _) => {
                    let cell = Arc::new(Fetch::default());
                    inflight.insert(key, cell.clone());
                    cells.push((PageIndex(i), cell));
                }
            }
        }
        cells
    }
}

/// A run's pages registered as being fetched; unregistered when the run ends or is dropped
/// half-way (its handle closed), so no entry outlives its fetch.
struct Claim<'a> {
    cache: &'a PageCache,
    version: &'a Version,
    cells: Vec<(PageIndex, Arc<Fetch>)>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut inflight = self.cache.inflight.lock().expect("inflight lock");
        for (page, cell) in &self.cells {
            let key = (self.version.clone(), *page);
            if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                inflight.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_fetched_across_a_forget_of_their_version_are_not_kept() {
        let cache = PageCache::new(1 << 20);
        let v = Version("same size and mtime".into());
        // The file is rewritten (its version unchanged) while the old bytes are on their
        // way: the feed forgets the version before they land.
        let (data, _, hit) = cache
            .get_or_fetch(&v, None, PageIndex(0), || async {
                cache.forget_version(&v);
                Ok((Bytes::from_static(b"old"), v.clone()))
            })
            .await
            .unwrap();
        assert_eq!((&data[..], hit), (&b"old"[..], false));
        assert!(
            cache.get(&v, None, PageIndex(0)).is_none(),
            "old bytes kept for good"
        );
        // A fetch that starts after the forget is kept.
        cache
            .get_or_fetch(&v, None, PageIndex(0), || async {
                Ok((Bytes::from_static(b"new"), v.clone()))
            })
            .await
            .unwrap();
        assert_eq!(&cache.get(&v, None, PageIndex(0)).unwrap()[..], b"new");
        // So does a run of read-ahead.
        cache
            .fetch_run((&v, None), PageIndex(1), 2, |_, _| async {
                cache.forget_version(&v);
                Ok((Bytes::from(vec![7u8; 2 * PAGE as usize]), v.clone()))
            })
            .await;
        assert!(cache.get(&v, None, PageIndex(1)).is_none());
        assert!(cache.get(&v, None, PageIndex(2)).is_none());
    }

    #[tokio::test]
    async fn concurrent_readers_share_one_fetch() {
        let cache = Arc::new(PageCache::new(1 << 20));
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let v = Version("v".into());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (cache, calls, v) = (cache.clone(), calls.clone(), v.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(&v, None, PageIndex(0), || async {
                        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok((Bytes::from_static(b"data"), v.clone()))
                    })
                    .await
                    .unwrap()
                    .0
            }));
        }
        for t in tasks {
            assert_eq!(&t.await.unwrap()[..], b"data");
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let cache = PageCache::new(PAGE * 2);
        for i in 0..10 {
            cache.put(
                Version("v".into()),
                None,
                PageIndex(i),
                Bytes::from(vec![0u8; PAGE as usize]),
            );
        }
        assert_eq!(cache.bytes(), PAGE * 2);
        assert!(cache
            .get(&Version("v".into()), None, PageIndex(9))
            .is_some());
        assert!(cache
            .get(&Version("v".into()), None, PageIndex(0))
            .is_none());
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_run_fetching_its_page() {
        let cache = Arc::new(PageCache::new(1 << 30));
        let v = Version("v".into());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run = {
            let (cache, v) = (cache.clone(), v.clone());
            tokio::spawn(async move {
                cache
                    .fetch_run((&v, None), PageIndex(2), 4, |from, n| {
                        assert_eq!((from, n), (PageIndex(2), 4));
                        let v = v.clone();
                        async move {
                            rx.await.unwrap();
                            let data: Vec<u8> = (0..4 * PAGE).map(|i| (i / PAGE) as u8).collect();
                            Ok((Bytes::from(data), v))
                        }
                    })
                    .await
            })
        };
        tokio::task::yield_now().await;
        while !cache
            .inflight
            .lock()
            .unwrap()
            .contains_key(&(v.clone(), PageIndex(4)))
        {
            tokio::task::yield_now().await;
        }
        let reader = {
            let (cache, v) = (cache.clone(), v.clone());
            tokio::spawn(async move {
                cache
                    .get_or_fetch(&v, None, PageIndex(4), || async {
                        panic!("the page is being fetched by the run")
                    })
                    .await
                    .unwrap()
            })
        };
        tx.send(()).unwrap();
        let (data, other, _) = reader.await.unwrap();
        assert_eq!((data.len() as u64, data[0], other), (PAGE, 2, None));
        run.await.unwrap();
        assert!(cache.inflight.lock().unwrap().is_empty());
        assert_eq!(cache.bytes(), 4 * PAGE);
    }

    #[tokio::test]
    async fn a_run_dropped_half_way_leaves_nothing_registered() {
        let cache = Arc::new(PageCache::new(1 << 30));
        let v = Version("v".into());
        let run = {
            let (cache, v) = (cache.clone(), v.clone());
            tokio::spawn(async move {
                cache
                    .fetch_run((&v, None), PageIndex(0), 8, |_, _| std::future::pending())
                    .await
            })
        };
        while cache.inflight.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        run.abort();
        let _ = run.await;
        assert!(cache.inflight.lock().unwrap().is_empty());
        // A reader then fetches the page itself.
        let (d, _, hit) = cache
            .get_or_fetch(&v, None, PageIndex(3), || async {
                Ok((Bytes::from_static(b"x"), v.clone()))
            })
            .await
            .unwrap();
        assert_eq!((&d[..], hit), (&b"x"[..], false));
    }

    #[tokio::test]
    async fn a_run_skips_cached_pages_and_stops_at_a_busy_one() {
        let cache = PageCache::new(1 << 30);
        let v = Version("v".into());
        cache.put(v.clone(), None, PageIndex(0), Bytes::from_static(b"cached"));
        cache.put(v.clone(), None, PageIndex(3), Bytes::from_static(b"cached"));
        let asked = std::sync::Mutex::new(None);
        cache
            .fetch_run((&v, None), PageIndex(0), 6, |from, n| {
                *asked.lock().unwrap() = Some((from, n));
                let v = v.clone();
                async move { Ok((Bytes::from(vec![7u8; (n * PAGE) as usize]), v)) }
            })
            .await;
        assert_eq!(*asked.lock().unwrap(), Some((PageIndex(1), 2)));
        assert_eq!(&cache.get(&v, None, PageIndex(0)).unwrap()[..], b"cached");
        assert_eq!(
            cache.get(&v, None, PageIndex(2)).unwrap().len() as u64,
            PAGE
        );
    }
}
