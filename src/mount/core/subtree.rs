//! The first look at a directory fetches its subtree's metadata in one round trip
//! ([`crate::remote::Remote::tree_listings`], up to `-o tree_max=N` entries): the directory's
//! own listing goes to the metadata cache ([`crate::mount::meta`]), its subdirectories' to the
//! prefetched listings ([`crate::mount::prefetch`]) until their nodes exist. So a cold `find`,
//! `ls -lR` or `git status` costs a handful of round trips instead of one per directory, and
//! every entry's attributes arrive with it. Directories beyond the cap are listed when first
//! entered, by a further bounded fetch.
//!
//! One fetch per directory at a time: lookups racing into the same cold directory (git's
//! parallel `lstat`s) wait for the first one's answer instead of each asking.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;

use super::{unreachable, FsCore};
use crate::mount::inode::{NodeId, RemoteId};
use crate::mount::meta::Entries;
use crate::remote::{Attr, RemoteError, RemotePath, Result};

/// Default `-o tree_max`: a large repository's tree (about 4 MB of metadata in memory, a
/// few hundred kB on the link) in one answer; `0` turns prefetching off.
pub const DEFAULT_TREE_MAX: usize = 20_000;
/// The whole subtree answer arrives within this, or what came is used (the directory's own
/// listing at least) and the rest is listed when entered. A kernel request waiting on it cannot
/// be interrupted, so an answer that keeps trickling must never hold a first look for long.
pub const SUBTREE_DEADLINE: Duration = Duration::from_secs(5);
/// Most entries beneath a stale directory fetched again with it when there is no change feed
/// ([`FsCore::relist_tree`]): a repository's or a project's tree in one call, small enough that
/// one name looked at past the TTL does not cost the whole workspace (a few hundred kB).
pub const RELIST_TREE_MAX: usize = 4096;
/// A stale tree fetched again in longer than this (or the TTL, if longer) is not fetched that
/// way again: it would cost each stale look more than the directories one at a time.
pub const RELIST_TREE_SLOW: Duration = Duration::from_secs(1);

/// Fetches in flight, by directory.
#[derive(Default)]
pub struct Flights(Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>>);

impl Flights {
    pub(super) async fn enter(&self, dir: NodeId) -> FlightGuard<'_> {
        let lock = self
            .0
            .lock()
            .expect("flights lock")
            .entry(dir)
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        FlightGuard {
            flights: self,
            dir,
            lock,
            _guard: guard,
        }
    }
}

pub(super) struct FlightGuard<'a> {
    flights: &'a Flights,
    dir: NodeId,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.flights.0.lock().expect("flights lock");
        // Ours, the map's and the guard's: nobody else waits.
        if Arc::strong_count(&self.lock) <= 3 {
            m.remove(&self.dir);
        }
    }
}

/// Whether a failed tree call falls back to a plain listing rather than fail the operation:
/// `Some(true)` for an agent that cannot answer packed trees (never asked again), `Some(false)`
/// for this once (not found: an agent without the route says so too, and a plain listing
/// gives the real answer).
fn falls_back(e: &RemoteError) -> Option<bool> {
    match e {
        RemoteError::Unsupported(_) | RemoteError::Invalid(_) => Some(true),
        RemoteError::NotFound(_) => Some(false),
        _ => None,
    }
}

impl FsCore {
    /// A listing prefetched for `dir`, moved into the metadata cache if it is still fresh
    /// (at any age while the sandbox does not answer).
    pub(in crate::mount) fn adopt_prefetched(
        &self,
        dir: NodeId,
        stale_ok: bool,
    ) -> Option<Entries> {
        if self.prefetched.is_empty() {
            return None;
        }
        let node = self.inodes.get(dir)?;
        let path = self.inodes.path_of(dir)?;
        let (entries, fetched) = self.prefetched.take(&path, RemoteId::of(&node.attr))?;
        if !stale_ok && self.cfg.clock.since(fetched) >= self.cfg.attr_ttl {
            return None;
        }
        self.meta.put_at(dir, entries.clone(), fetched);
        self.prefetched.mark_looked(dir);
        Some(entries)
    }

    /// Prefetching is on: a cap above zero, an agent that answers packed trees, and
    /// attributes trusted for some time (with a zero TTL nothing fetched ahead is ever used).
    fn prefetching(&self) -> bool {
        self.cfg.tree_max > 0
            && !self.cfg.attr_ttl.is_zero()
            && !self.tree_unsupported.load(Ordering::Relaxed)
    }

    /// Nothing is known of `dir`'s entries, not even stale: its first look (a listing kept
    /// ahead and still fresh counts as known, and is adopted here). Later looks past the TTL
    /// refresh one directory at a time, as before.
    pub(in crate::mount) fn first_look(&self, dir: NodeId) -> bool {
        self.prefetching()
            && !self.offline()
            && self.meta.listing(dir, self.cfg.attr_ttl, true).is_none()
            && self.adopt_prefetched(dir, false).is_none()
            // A listing dropped by a change made through the mount is not a first look: one
            // file created in a directory must not cost its whole subtree again.
            && !self.prefetched.looked(dir)
    }

    /// `dir`'s listing from a subtree fetch if this is its first look, else `None` (a plain
    /// listing is in order; so too when the agent cannot answer a subtree).
    pub(in crate::mount) async fn fetch_subtree(
        &self,
        dir: NodeId,
        path: &RemotePath,
    ) -> Option<Result<Entries>> {
        if !self.first_look(dir) {
            return None;
        }
        let _flight = self.flights.enter(dir).await;
        // Fetched by the flight we waited for.
        if let Some(l) = self.meta.listing(dir, self.cfg.attr_ttl, false) {
            return Some(Ok(l));
        }
        self.prefetched.mark_looked(dir);
        self.fetch_tree(dir, path, self.cfg.tree_max).await
    }

    /// A stale listing of `dir` fetched again with the listings beneath it, up to
    /// [`RELIST_TREE_MAX`] entries, when there is no change feed: the names below go stale
    /// together (one TTL), so a `git status` or `ls -lR` past the TTL costs one call for the
    /// tree instead of one per directory (a program each over the exec-only scripts). `None`
    /// when prefetching is off or the tree call did not answer; a plain listing is in order.
    pub(in crate::mount) async fn relist_tree(&self, dir: NodeId) -> Option<Entries> {
        if !self.prefetching() || self.relist_trees_off.load(Ordering::Relaxed) {
            return None;
        }
        let path = self.path_of(dir).ok()?;
        let started = std::time::Instant::now();
        let fetched = self
            .fetch_tree(dir, &path, self.cfg.tree_max.min(RELIST_TREE_MAX))
            .await;
        // Slower than the TTL it refreshes (the exec-only `sh` scripts walk a tree with a
        // program per directory), or not answered in time: every stale look would wait for it
        // again, so stale directories are listed one at a time from now on.
        let slow = match &fetched {
            Some(Ok(_)) => started.elapsed() > self.cfg.attr_ttl.max(RELIST_TREE_SLOW),
            Some(Err(_)) => false,
            None => self.is_reachable(),
        };
        if slow && !self.relist_trees_off.swap(true, Ordering::Relaxed) {
            tracing::info!(path = %path.display(), secs = started.elapsed().as_secs_f64(), "the tree call is too slow to refresh stale listings: listing them one at a time");
        }
        fetched.and_then(Result::ok)
    }

    /// `dir`'s listing and its subdirectories' (up to `budget` entries beyond its own) in one
    /// call: its own into the metadata cache, the rest kept ahead. `None` when a plain listing
    /// should answer instead (the tree call is unsupported, slow or did not begin in time).
    async fn fetch_tree(
        &self,
        dir: NodeId,
        path: &RemotePath,
        budget: usize,
    ) -> Option<Result<Entries>> {
        let before = self.epoch();
        let fetched = self.cfg.clock.now();
        let deadline = tokio::time::Instant::now() + SUBTREE_DEADLINE;
        let started = tokio::time::timeout_at(
            deadline,
            // Given up offline, the directory is listed on its own, which serves what is known.
            self.ask(self.remote().tree_listings(path, budget), || true),
        );
        let collected = match started.await {
            Ok(Ok(stream)) => self.collect(path, stream, deadline, budget).await,
            Ok(Err(e)) => Err(e),
            // Not even begun in time: listed on its own (that listing has its own deadline).
            Err(_) => {
                tracing::info!(path = %path.display(), "the subtree answer did not begin in time: listing the directory alone");
                return None;
            }
        };
        let (first, rest) = match collected {
            Ok(c) => c,
            // Too slow to be worth it (the sandbox answers: it keeps the stream moving):
            // listed on its own.
            Err(RemoteError::TimedOut(m)) if self.is_reachable() => {
                tracing::info!("{m}: listing the directory alone");
                return None;
            }
            Err(e) if falls_back(&e).is_some() => {
                if falls_back(&e) == Some(true) {
                    tracing::info!(error = %e, "no subtree prefetch from this agent: listing by directory");
                    self.tree_unsupported.store(true, Ordering::Relaxed);
                }
                return None;
            }
            Err(e) => return Some(Err(e)),
        };
        // An answer that raced a change made through the mount may predate it: used once,
        // not kept.
        if self.epoch() == before {
            self.meta.put_at(dir, first.clone(), fetched);
            for (p, id, entries) in rest {
                self.prefetched.put(p, id, entries, fetched);
            }
        }
        Some(Ok(first))
    }

    /// The first listing (the directory's own) and every other one with its directory's
    /// identity; directories not descended are simply absent.
    #[allow(clippy::type_complexity)]
    async fn collect(
        &self,
        path: &RemotePath,
        mut stream: futures_util::stream::BoxStream<'static, Result<crate::remote::TreeListing>>,
        deadline: tokio::time::Instant,
        budget: usize,
    ) -> Result<(Entries, Vec<(RemotePath, RemoteId, Entries)>)> {
        let mut first: Option<Entries> = None;
        let mut ids: HashMap<RemotePath, RemoteId> = HashMap::new();
        let mut rest = Vec::new();
        // Entries taken beyond the directory's own listing: no more than were asked for,
        // whatever the sandbox sends (the rest is listed when entered).
        let mut taken = 0usize;
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, stream.next()).await else {
                // Past the deadline: what came is used, the rest is listed when entered.
                if first.is_none() {
                    return Err(RemoteError::TimedOut(format!(
                        "{}: the subtree answer did not bring the directory's listing in time",
                        path.display()
                    )));
                }
                tracing::info!(path = %path.display(), listings = rest.len(), "the subtree answer is too slow: keeping what came");
                break;
            };
            let Some(item) = next else { break };
            let l = match item {
                Ok(l) => l,
                Err(e) if unreachable(&e) => return self.note(Err(e)),
                Err(e) => return Err(e),
            };
            let Some(entries) = l.entries else { continue };
            if first.is_some() {
                taken += entries.len();
                if taken > budget {
                    tracing::info!(path = %path.display(), listings = rest.len(), "the subtree answer passed the entries asked for: keeping what came");
                    break;
                }
            }
            for e in entries.iter().filter(|e| is_dir(&e.attr)) {
                ids.insert(l.path.join(&e.name.0)?, RemoteId::of(&e.attr));
            }
            let entries: Entries =
                Arc::new(entries.into_iter().map(|e| (e.name.0, e.attr)).collect());
            if first.is_none() && l.path == *path {
                first = Some(entries);
            } else if let Some(id) = ids.get(&l.path) {
                rest.push((l.path, *id, entries));
            }
        }
        let first = first.ok_or_else(|| {
            RemoteError::Io(
                path.display(),
                "the sandbox's tree answer lacks the directory's own listing".into(),
            )
        })?;
        Ok((first, rest))
    }
}

fn is_dir(a: &Attr) -> bool {
    a.kind == crate::remote::FileKind::Dir
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mount::clock::Clock;
    use crate::mount::core::CoreConfig;
    use crate::mount::inode::ROOT;
    use crate::remote::faulty::{FaultControl, FaultyRemote, Op};
    use crate::remote::memory::{MemoryRemote, MemorySandbox};
    use crate::remote::{Remote, RenameMode};

    async fn core(
        tree_max: usize,
    ) -> (Arc<FsCore>, MemorySandbox, FaultControl, tempfile::TempDir) {
        core_on(tree_max, Clock::system()).await
    }

    async fn core_on(
        tree_max: usize,
        clock: Clock,
    ) -> (Arc<FsCore>, MemorySandbox, FaultControl, tempfile::TempDir) {
        let memory = MemoryRemote::new();
        let sb = memory.sandbox();
        for d in ["a/b/c", "a/d", "e"] {
            sb.mkdir_all(d).unwrap();
        }
        for f in ["a/1", "a/b/2", "a/b/c/3", "a/d/4", "e/5"] {
            sb.write(f, f.as_bytes()).unwrap();
        }
        // Before the counting wrapper: the calls counted are the mount's.
        let root = memory.stat(&RemotePath::root()).await.unwrap();
        let faulty = FaultyRemote::new(memory);
        let faults = faulty.control();
        let remote: Arc<dyn Remote> = Arc::new(faulty);
        let staging = tempfile::tempdir().unwrap();
        let core = FsCore::new(
            remote,
            CoreConfig {
                attr_ttl: Duration::from_secs(600),
                cache_bytes: 1 << 20,
                staging_dir: staging.path().to_path_buf(),
                tree_max,
                clock,
            },
            root,
        );
        (core, sb, faults, staging)
    }

    async fn names(core: &FsCore, dir: NodeId) -> Vec<Vec<u8>> {
        let (fh, _) = core.opendir(dir).unwrap();
        let out = core.readdir(fh, 0).await.unwrap();
        core.releasedir(fh);
        out.iter().skip(2).map(|e| e.name.clone()).collect()
    }

    async fn walk(core: &FsCore, path: &[&str]) -> NodeId {
        let mut node = ROOT;
        for name in path {
            node = core.lookup(node, name.as_bytes()).await.unwrap().node;
        }
        node
    }

    #[tokio::test]
    async fn the_first_look_fetches_the_subtree_and_the_rest_asks_nothing() {
        let (core, _sb, faults, _s) = core(DEFAULT_TREE_MAX).await;
        assert_eq!(names(&core, ROOT).await, [b"a".to_vec(), b"e".to_vec()]);
        let c = walk(&core, &["a", "b", "c"]).await;
        assert_eq!(names(&core, c).await, [b"3".to_vec()]);
        let d = walk(&core, &["a", "d"]).await;
        assert_eq!(names(&core, d).await, [b"4".to_vec()]);
        assert_eq!(core.lookup(d, b"4").await.unwrap().attr.size, 5);
        assert_eq!(faults.calls(Op::Tree), 1);
        assert_eq!(faults.calls(Op::List) + faults.calls(Op::Stat), 0);
        // A name made through the mount goes into `a`'s cached listing in place: not a first
        // look again (one directory made must not cost the subtree), and the next lookup there
        // is answered from the listing.
        let a = walk(&core, &["a"]).await;
        core.mkdir(a, b"new", 0o755).await.unwrap();
        assert!(core.lookup(a, b"absent").await.is_err());
        assert!(core.lookup(a, b"new").await.is_ok());
        assert_eq!(faults.calls(Op::Tree), 1);
        assert_eq!(faults.calls(Op::Stat), 0);
        // A listing the mount had to drop is not a first look either: one stat.
        core.invalidate_path(&RemotePath::new(b"a/absent".to_vec()).unwrap());
        assert!(core.lookup(a, b"absent").await.is_err());
        assert_eq!(faults.calls(Op::Tree), 1);
        assert_eq!(faults.calls(Op::Stat), 1);
    }

    #[tokio::test]
    async fn with_tree_max_0_every_directory_is_listed_on_its_own() {
        let (core, _sb, faults, _s) = core(0).await;
        let c = walk(&core, &["a", "b", "c"]).await;
        assert_eq!(names(&core, c).await, [b"3".to_vec()]);
        assert_eq!(faults.calls(Op::Tree), 0);
    }

    #[tokio::test]
    async fn a_directory_beyond_the_cap_is_fetched_when_entered() {
        // Two entries past the root's: `a`'s four do not fit, so nothing below the root comes.
        let (core, _sb, faults, _s) = core(2).await;
        let c = walk(&core, &["a", "b", "c"]).await;
        assert_eq!(names(&core, c).await, [b"3".to_vec()]);
        assert!(faults.calls(Op::Tree) >= 2, "{}", faults.calls(Op::Tree));
    }

    #[tokio::test]
    async fn a_listing_fetched_ahead_is_never_given_to_another_directory_at_its_path() {
        let (core, sb, _faults, _s) = core(DEFAULT_TREE_MAX).await;
        assert_eq!(names(&core, ROOT).await.len(), 2);
        // `a/b` is known ahead; `a` moves away and a new `a/b` is made, through the mount.
        core.rename(ROOT, b"a", ROOT, b"moved", RenameMode::Replace)
            .await
            .unwrap();
        let a = core.mkdir(ROOT, b"a", 0o755).await.unwrap().node;
        let b = core.mkdir(a, b"b", 0o755).await.unwrap().node;
        assert!(names(&core, b).await.is_empty(), "the new a/b is empty");
        let old = walk(&core, &["moved", "b"]).await;
        assert_eq!(names(&core, old).await, [b"2".to_vec(), b"c".to_vec()]);
        // Made behind the mount's back, in the sandbox: found by a lookup (a stat).
        sb.write("moved/b/late", b"x").unwrap();
        assert!(
            core.lookup(old, b"late").await.is_err(),
            "listing trusted for the TTL"
        );
    }

    #[tokio::test]
    async fn what_was_fetched_is_trusted_for_the_ttl_then_asked_again() {
        let clock = Clock::manual();
        let (core, sb, faults, _s) = core_on(DEFAULT_TREE_MAX, clock.clone()).await;
        let d = walk(&core, &["a", "d"]).await;
        sb.write("a/d/late", b"x").unwrap();
        sb.write("a/d/4", b"longer").unwrap();
        // Within the TTL (600 s): the listings and attributes fetched ahead answer.
        clock.advance(Duration::from_secs(599));
        assert!(core.lookup(d, b"late").await.is_err());
        assert_eq!(core.lookup(d, b"4").await.unwrap().attr.size, 5);
        assert_eq!(faults.calls(Op::List) + faults.calls(Op::Stat), 0);
        // Past it, the sandbox is asked again and its changes are seen.
        clock.advance(Duration::from_secs(1));
        assert!(core.lookup(d, b"late").await.is_ok());
        assert_eq!(core.lookup(d, b"4").await.unwrap().attr.size, 6);
        assert!(faults.calls(Op::List) + faults.calls(Op::Stat) + faults.calls(Op::Tree) > 0);
    }

    /// Without a feed, names past the TTL are asked again by whole trees: the first stale look
    /// fetches its directory's tree, and every directory beneath answers from that one call
    /// (a `git status` over the exec-only scripts paid a program per directory), changes made
    /// in the sandbox meanwhile included.
    #[tokio::test]
    async fn past_the_ttl_a_stale_tree_is_fetched_again_in_one_call() {
        let clock = Clock::manual();
        let (core, sb, faults, _s) = core_on(DEFAULT_TREE_MAX, clock.clone()).await;
        let c = walk(&core, &["a", "b", "c"]).await;
        let d = walk(&core, &["a", "d"]).await;
        assert!(core.lookup(c, b"late").await.is_err());
        sb.write("a/b/c/late", b"x").unwrap();
        sb.write("a/d/4", b"longer").unwrap();
        sb.remove("a/b/2").unwrap();
        clock.advance(Duration::from_secs(600));
        faults.reset_counts();
        let a = core.lookup(ROOT, b"a").await.unwrap().node;
        let b = core.lookup(a, b"b").await.unwrap().node;
        assert!(
            core.lookup(b, b"2").await.is_err(),
            "removed in the sandbox"
        );
        assert_eq!(core.lookup(b, b"c").await.unwrap().node, c);
        assert!(core.lookup(c, b"late").await.is_ok(), "made in the sandbox");
        assert_eq!(core.lookup(d, b"4").await.unwrap().attr.size, 6);
        assert_eq!(core.getattr(d).await.unwrap().node, d);
        assert_eq!(
            faults.calls(Op::Tree),
            1,
            "one tree call for the whole stale tree"
        );
        for op in [Op::List, Op::Stat, Op::StatMany] {
            assert_eq!(faults.calls(op), 0, "{op:?} asked past the TTL");
        }
    }

    /// pjdfstest's chmod/07 over `shell:`: a listing of `x/y` fetched ahead with `x`'s subtree,
    /// before `f` was made in `y`, was adopted after a chmod of `f` dropped `y`'s own listing,
    /// and `f` vanished for the TTL.
    #[tokio::test]
    async fn a_listing_fetched_ahead_never_hides_a_name_made_since() {
        let (core, _sb, _faults, _s) = core(DEFAULT_TREE_MAX).await;
        let x = core.mkdir(ROOT, b"x", 0o755).await.unwrap().node;
        let y = core.mkdir(x, b"y", 0o755).await.unwrap().node;
        // A chmod of `y` drops `x`'s listing; the next look into `x` fetches its subtree,
        // `y`'s (empty) listing with it.
        core.setattr(y, None, Some(0o750), (None, None), None, None, None)
            .await
            .unwrap();
        assert_eq!(core.lookup(x, b"y").await.unwrap().node, y);
        let (made, fh) = core.create(y, b"f", 0o644, true, false).await.unwrap();
        core.release(fh).await.unwrap();
        assert!(core.flush_all().await.is_empty());
        core.setattr(made.node, None, Some(0o642), (None, None), None, None, None)
            .await
            .unwrap();
        let found = core.lookup(y, b"f").await.unwrap();
        assert_eq!(found.attr.mode & 0o7777, 0o642);
    }

    /// The attacker trial: a hostile agent sent its packed tree one listing every 20 s, and
    /// `ls` of the mount's root sat in the kernel (unkillable) for 18 minutes. Now the whole
    /// answer has [`SUBTREE_DEADLINE`]; what came is used and the rest listed when entered.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_subtree_answer_never_holds_a_first_look_past_its_deadline() {
        let (core, _sb, faults, _s) = core(DEFAULT_TREE_MAX).await;
        // The root's own listing comes in time, the rest does not.
        faults.trickle(Op::Tree, Duration::from_secs(3));
        let started = tokio::time::Instant::now();
        assert_eq!(names(&core, ROOT).await, [b"a".to_vec(), b"e".to_vec()]);
        // Without the deadline: six listings, 18 s.
        assert!(
            started.elapsed() <= Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        faults.clear(Op::Tree);
        let c = walk(&core, &["a", "b", "c"]).await;
        assert_eq!(names(&core, c).await, [b"3".to_vec()]);
        // A directory whose own listing never comes in time is listed alone.
        faults.trickle(Op::Tree, Duration::from_secs(20));
        let started = tokio::time::Instant::now();
        let e = walk(&core, &["e"]).await;
        assert_eq!(names(&core, e).await, [b"5".to_vec()]);
        assert!(
            started.elapsed() <= Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn an_agent_without_packed_trees_is_listed_directory_by_directory() {
        let (core, _sb, faults, _s) = core(DEFAULT_TREE_MAX).await;
        faults.fail_always(Op::Tree, RemoteError::Unsupported("old agent".into()));
        let c = walk(&core, &["a", "b", "c"]).await;
        assert_eq!(names(&core, c).await, [b"3".to_vec()]);
        let _ = walk(&core, &["e"]).await;
        assert_eq!(faults.calls(Op::Tree), 1, "asked once, then never again");
    }
}
