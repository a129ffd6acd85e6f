//! The filesystem operations, over the inode table ([`super::inode`]), the metadata cache
//! ([`super::meta`]), the page cache ([`super::pages`]), open handles ([`super::handles`]) and
//! write-back ([`super::writeback`], staging in [`super::staging`]). Every operation is async,
//! returns `RemoteError` (mapped to errno by the adapter, in one place), and is testable without
//! FUSE.
//!
//! What holds, and why:
//! - **Open files follow the file.** A handle is bound to its node; a rename moves the node's
//!   name, so its writes are pushed to the new name; an unlinked (or replaced) file keeps
//!   serving its handles from a complete local copy and is dropped on the last close.
//! - **Attributes agree with local state**: a file with staged changes reports its staged size
//!   and mtime; every namespace change marks the parent's attributes stale here and in the
//!   kernel.
//! - **Faults keep serving**: when the sandbox does not answer, cached attributes, listings and
//!   pages are served past their TTL, and opens for writing stage locally.

use std::path::PathBuf;

mod capture;
mod changes;
mod echo;
mod first_push;
mod push;
mod read_ahead;
pub mod subtree;
mod xattr_hint;

pub(super) use changes::{Applied, Change};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::handles::{DirEntryOut, Handles, OpenFile};
use super::inode::{InodeTable, Node, NodeId, RemoteId, ROOT};
use super::meta::MetaCache;
use super::newfiles::NewFiles;
use super::pages::{PageCache, PageIndex};
use super::pushq::PushQueue;
use super::staging::{Staged, PAGE};
use super::writeback::{Failures, StagedEntry};
use crate::remote::{
    Attr, FileKind, Remote, RemoteError, RemotePath, RenameMode, Result, SetAttr, SpecialKind,
    StatFs, XattrFlags,
};
use capture::CAPTURE_AT_OPEN_BYTES;

/// How many times one read follows a file that changed in place before it takes the bytes as
/// they come: a file rewritten faster than a round trip is never at one version for a whole
/// read.
const SETTLE_AFTER_FOLLOWS: u32 = 3;
/// How many times one read follows before it gives up (a sandbox that answers every read
/// "stale").
const MAX_READ_FOLLOWS: u32 = 8;

/// How long a `statfs` answer is reused.
pub const STATFS_TTL: Duration = Duration::from_secs(5);

/// Largest file the mount writes: the agent's commit limit (a larger write is EFBIG).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024 * 1024;

#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// How long attributes and listings are trusted.
    pub attr_ttl: Duration,
    /// Bytes of file data kept in the page cache.
    pub cache_bytes: u64,
    /// Where staged writes live (private to the user, one directory per remote).
    pub staging_dir: PathBuf,
    /// Entries a directory's first look fetches with its subtree ([`super::subtree`]); 0:
    /// list directory by directory.
    pub tree_max: usize,
    /// What the TTLs count in ([`super::clock`]): the system's clock, or a test's.
    pub clock: super::clock::Clock,
}

/// What the kernel should forget (the adapter sends these through the FUSE notifier).
pub trait KernelCache: Send + Sync {
    /// Drop the node's cached pages and attributes.
    fn invalidate_data(&self, node: NodeId);
    /// Drop the node's cached attributes only.
    fn invalidate_attr(&self, node: NodeId);
    /// Drop the kernel's entry for `name` in `parent` (a name made, removed or renamed).
    fn invalidate_entry(&self, parent: NodeId, name: &[u8]);
    /// Tell `done` once every invalidation asked before this one reached the kernel (they
    /// may be sent asynchronously).
    fn barrier(&self, done: tokio::sync::oneshot::Sender<()>) {
        let _ = done.send(());
    }
}

/// What the kernel may do with a file's pages for an open handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPages {
    /// Keep the pages it has: the version is the one they were read from.
    Keep,
    /// Drop the pages it has, then cache as it reads.
    Drop,
    /// Cache nothing for this handle (`FOPEN_DIRECT_IO`): the sandbox is rewriting the file in
    /// place, and a read the rewrite cut short must end there. Through the page cache the
    /// kernel pads such a read with zeros up to the size it last knew whenever the change feed
    /// told it of the change while the read was on its way, bytes no local disk ever shows.
    Bypass,
}

#[derive(Default, Debug, serde::Serialize)]
pub struct CoreStats {
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_pushed: AtomicU64,
    pub commits: AtomicU64,
    pub failed_commits: AtomicU64,
    pub conflicts: AtomicU64,
    /// Requests the kernel sent, by operation: what a warm command still costs the daemon.
    pub kernel_requests: KernelRequests,
}

/// A count per kernel request type (the adapter names them).
#[derive(Default, Debug)]
pub struct KernelRequests(Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl KernelRequests {
    pub fn count(&self, op: &'static str) {
        *self
            .0
            .lock()
            .expect("kernel request counts")
            .entry(op)
            .or_default() += 1;
    }
}

impl serde::Serialize for KernelRequests {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.0.lock().expect("kernel request counts").serialize(s)
    }
}

pub struct FsCore {
    /// The sandbox as the mount reaches it ([`super::sandbox`]).
    sandbox: super::sandbox::Sandbox,
    cfg: CoreConfig,
    inodes: InodeTable,
    meta: MetaCache,
    /// Subdirectories' listings from a subtree fetch, until their nodes exist.
    prefetched: super::prefetch::Prefetched,
    /// Names the sandbox changed lately: opens of them ask it first.
    recent: super::recent::RecentChanges,
    flights: subtree::Flights,
    /// Stale listings fetched again, by directory ([`Self::relist_stale`]).
    /// Stale listings are fetched one directory at a time: the tree call was too slow.
    relist_trees_off: AtomicBool,
    relists: subtree::Flights,
    /// The agent answers no packed trees: list directory by directory.
    tree_unsupported: AtomicBool,
    pages: PageCache,
    /// Read-ahead's remote reads in flight, over all handles.
    prefetchers: super::readahead::Prefetchers,
    handles: Handles,
    /// Bumped by every change made through the mount. An answer fetched while it moved may
    /// predate that change, so it is fetched again rather than cached (a stat racing a push
    /// would otherwise cache the old size for a whole TTL).
    epoch: AtomicU64,
    staged: super::writeback::StagedFiles,
    failures: Failures,
    /// Pushes queued by `close` ([`super::pushq`]).
    pushq: PushQueue,
    /// Files created here and not yet in the sandbox ([`super::newfiles`]).
    newfiles: NewFiles,
    /// `close` pushes and waits (`-o sync_close`) instead of queueing.
    sync_close: AtomicBool,
    /// This core, for the tasks that run queued pushes.
    me: Weak<FsCore>,
    kernel: Mutex<Option<Arc<dyn KernelCache>>>,
    /// Symlinks made through the mount, shown as written ([`super::made_links`]).
    made_links: super::made_links::MadeLinks,
    /// Whether the change feed vouches for what is cached ([`super::feed`]).
    feed: super::feed::FeedState,
    /// Sandbox-side changes repeated on the mountpoint for inotify, and `sbxfs watch`'s
    /// stream ([`super::echo`]).
    echoes: super::echo::Echoes,
    pub stats: CoreStats,
}

/// A file's attributes as the adapter reports them.
#[derive(Clone, Debug)]
pub struct NodeAttr {
    pub node: NodeId,
    pub attr: Attr,
}

/// Most entries a stale listing may have to be fetched again for one name's sake
/// ([`FsCore::relist_stale`]).
const RELIST_MAX: usize = 4096;

/// Times a stat is asked again when each answer came back older than a change the mount made
/// to the node meanwhile (a push making names in a directory, in a burst).
const STAT_AGAIN: usize = 3;

pub(super) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

pub(super) use super::sandbox::unreachable;

impl FsCore {
    pub fn new(remote: Arc<dyn Remote>, cfg: CoreConfig, root: Attr) -> Arc<Self> {
        let made_links = super::made_links::MadeLinks::open(Some(&cfg.staging_dir));
        Arc::new_cyclic(|me| FsCore {
            sandbox: super::sandbox::Sandbox::new(remote),
            inodes: InodeTable::with_clock(root, cfg.clock.clone()),
            meta: MetaCache::with_clock(cfg.clock.clone()),
            prefetched: Default::default(),
            recent: Default::default(),
            flights: Default::default(),
            relists: Default::default(),
            relist_trees_off: AtomicBool::new(false),
            tree_unsupported: AtomicBool::new(false),
            pages: PageCache::new(cfg.cache_bytes),
            prefetchers: Default::default(),
            handles: Handles::default(),
            cfg,
            epoch: AtomicU64::new(0),
            staged: Default::default(),
            failures: Failures::default(),
            pushq: PushQueue::default(),
            newfiles: NewFiles::default(),
            sync_close: AtomicBool::new(false),
            me: me.clone(),
            kernel: Mutex::new(None),
            made_links,
            feed: super::feed::FeedState::default(),
            echoes: super::echo::Echoes::default(),
            stats: CoreStats::default(),
        })
    }

    /// What the sandbox's `info` said of itself: its workspace, what its transport takes.
    pub fn learn(&self, info: &crate::remote::RemoteInfo) {
        self.sandbox.learn(info);
    }

    /// A transport taken as one without patch commits (tests of the whole-file path).
    pub fn set_patch_commits(&self, yes: bool) {
        self.sandbox.set_patch_commits(yes);
    }

    /// `close` waits for its push (`-o sync_close`) instead of queueing it.
    pub fn set_sync_close(&self, on: bool) {
        self.sync_close.store(on, Ordering::Relaxed);
    }

    pub(super) fn sync_close(&self) -> bool {
        self.sync_close.load(Ordering::Relaxed)
    }

    /// This core as an `Arc` (for a task that outlives the call).
    pub(super) fn arc(&self) -> Option<Arc<FsCore>> {
        self.me.upgrade()
    }

    pub fn set_kernel_cache(&self, k: Arc<dyn KernelCache>) {
        *self.kernel.lock().expect("kernel lock") = Some(k);
    }

    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    pub fn remote(&self) -> &Arc<dyn Remote> {
        self.sandbox.remote()
    }

    pub fn is_reachable(&self) -> bool {
        self.sandbox.is_reachable()
    }

    /// While the sandbox does not answer, what is known is served at once instead of waiting
    /// for each call's deadline; [`FsCore::probe`] notices when it answers again.
    pub(super) fn offline(&self) -> bool {
        !self.is_reachable()
    }

    /// Ask the sandbox whether it answers (while it does not, nothing else asks); when it is
    /// back, failed pushes are retried at once. Answers whether it is reachable.
    pub async fn probe(&self) -> bool {
        let (ok, back) = self.sandbox.probe().await;
        if back {
            tracing::info!("the sandbox answers again");
            self.failures.all_due();
        }
        ok
    }

    /// A remote call that may be answered from what the mount knows ([`super::sandbox::Sandbox::ask`]).
    pub(super) async fn ask<T>(
        &self,
        call: impl std::future::Future<Output = Result<T>>,
        known: impl FnOnce() -> bool,
    ) -> Result<T> {
        self.sandbox.ask(call, known).await
    }

    /// Does the sandbox answer a probe within the time its pace allows?
    pub(super) async fn answers_within_pace(&self) -> bool {
        tokio::time::timeout(self.sandbox.probe_wait(), self.probe())
            .await
            .unwrap_or(false)
    }

    /// The time one `info` answer took (the sandbox's pace).
    pub fn note_pace(&self, took: Duration) {
        self.sandbox.note_pace(took);
    }

    pub(super) fn kernel(&self) -> Option<Arc<dyn KernelCache>> {
        self.kernel.lock().expect("kernel lock").clone()
    }

    /// Count a remote call and note whether the sandbox answered.
    pub(super) fn note<T>(&self, r: Result<T>) -> Result<T> {
        self.sandbox.note(r)
    }

    /// The counters `ctl stats` and `ctl status` show.
    pub fn stats_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.stats).unwrap_or_default();
        v["remote_calls"] = self.sandbox.calls().into();
        v["remote_calls_by_op"] = serde_json::json!(self.sandbox.calls_by_op());
        v["disk_cache_hits"] = self.pages.disk_hits().into();
        v
    }

    /// The node an open file handle is bound to.
    pub fn handle_node(&self, fh: u64) -> Result<NodeId> {
        Ok(self.handles.file(fh)?.node)
    }

    /// Some file has staged changes not yet in the sandbox.
    pub fn has_unpushed(&self) -> bool {
        self.staged.any_dirty()
    }

    /// The version last seen for a node (for the INFO ioctl).
    pub fn cached_version(&self, node: NodeId) -> Option<String> {
        self.inodes.get(node).map(|n| n.attr.version.0)
    }

    pub fn path_of(&self, node: NodeId) -> Result<RemotePath> {
        self.inodes.path_of(node).ok_or_else(|| {
            RemoteError::NotFound(match self.inodes.get(node) {
                Some(n) => format!("{} (deleted)", n.last_path.display()),
                None => format!("node {}", node.0),
            })
        })
    }

    fn node(&self, node: NodeId) -> Result<Node> {
        self.inodes
            .get(node)
            .ok_or_else(|| RemoteError::NotFound(format!("node {}", node.0)))
    }

    /// Moves with every local change ([`Self::bump`]).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// A local change is being made: answers racing it are not cached.
    pub(super) fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// A namespace change in `dir`: its listing and attributes (nlink, mtime) are stale here
    /// and in the kernel.
    pub(super) fn dir_changed(&self, dir: NodeId) {
        // Bumped before the listing goes: a fetch ending in between is not cached.
        self.bump();
        self.meta.invalidate(dir);
        self.dir_untrusted(dir);
    }

    /// The sandbox changed something in `dir` (the change feed says so): its listing and
    /// attributes are no longer trusted, but the listing is kept for a sandbox that stops
    /// answering before it is fetched again.
    pub(super) fn dir_stale(&self, dir: NodeId) {
        self.bump();
        self.meta.expire(dir);
        self.dir_untrusted(dir);
    }

    /// What both of those do besides the listing itself (bumped again: nothing fetched
    /// before this point is cached).
    fn dir_untrusted(&self, dir: NodeId) {
        self.bump();
        if let Some(p) = self.inodes.path_of(dir) {
            self.prefetched.forget_under(&p);
        }
        self.inodes.changed_here(dir, self.epoch());
        self.kernel_listing_stale(dir);
    }

    /// The kernel drops the directory's attributes and the listing it keeps across opens
    /// ([`Self::opendir`]; a directory's "pages" are its cached entries).
    pub(super) fn kernel_listing_stale(&self, dir: NodeId) {
        if let Some(k) = self.kernel() {
            k.invalidate_data(dir);
        }
    }

    /// A listing of `dir` fetched ahead predates a change the mount made in it: never adopted
    /// (it would hide a name made since, until its TTL ran out).
    fn forget_prefetched(&self, dir: NodeId) {
        if let Some(p) = self.inodes.path_of(dir) {
            self.prefetched.forget(&p);
        }
    }

    /// `name` was made (or pushed) in `dir` through the mount: its listing takes it in place
    /// instead of being fetched again; the directory's own attributes (mtime, nlink) are stale.
    pub(super) fn entry_made(&self, dir: NodeId, name: &[u8], attr: Attr) {
        self.bump();
        self.meta.upsert(dir, name, attr);
        self.dir_attrs_stale(dir);
    }

    /// `name` was removed from `dir` through the mount: its listing drops it in place instead
    /// of being fetched again; the directory's own attributes are stale.
    pub(super) fn entry_removed(&self, dir: NodeId, name: &[u8]) {
        self.bump();
        self.meta.remove(dir, name);
        self.dir_attrs_stale(dir);
    }

    /// A rename through the mount: the listings take it in place (as [`Self::entry_made`] and
    /// [`Self::entry_removed`] do) instead of being fetched again, so names looked up next
    /// there stay local: with the change feed vouching, a directory with no listing answers an
    /// absent name only by a stat, and a save's next temporary name, `pip`'s next `.pyc` or
    /// `tar -x`'s next file is exactly that. Each name's entry is the node now under it.
    /// (A rename of a name the mount has no node for, which the kernel never asks, leaves
    /// the listings to be fetched again.)
    pub(super) fn entries_renamed(&self, from: (NodeId, &[u8]), to: (NodeId, &[u8])) {
        let entry = |(dir, name): (NodeId, &[u8])| {
            self.inodes
                .child(dir, name)
                .and_then(|n| self.inodes.get(n))
                .map(|n| n.attr)
        };
        let Some(moved) = entry(to) else {
            self.dir_changed(from.0);
            self.dir_changed(to.0);
            return;
        };
        self.entry_made(to.0, to.1, moved);
        match entry(from) {
            Some(a) => self.entry_made(from.0, from.1, a),
            None => self.entry_removed(from.0, from.1),
        }
    }

    /// A name made or removed in `dir` through the mount: what was fetched ahead for it, and
    /// its own attributes (mtime, nlink), are stale, here and in the kernel.
    fn dir_attrs_stale(&self, dir: NodeId) {
        self.forget_prefetched(dir);
        self.bump();
        self.inodes.changed_here(dir, self.epoch());
        // Its entry in its parent's listing holds the times from before: not an answer.
        if let Some(n) = self.inodes.get(dir) {
            for (parent, name) in &n.links {
                self.meta.doubt_entry(*parent, name);
            }
        }
        // Its listing too: not every name the mount makes passes through the kernel (a
        // conflict copy, a name made by a query).
        self.kernel_listing_stale(dir);
    }

    /// The sandbox's attributes of a node, applied to it unless the mount changed the node
    /// while the answer was on its way (then the node's own, newer, attributes).
    /// Without a change feed, a stale listing of `dir` is fetched again, once for all who ask
    /// meanwhile, rather than a stat per name, and with it the listings beneath it
    /// ([`Self::relist_tree`]): a `git status` past the TTL then costs a call or two for the
    /// repository, not one per file or directory (a program each over the exec-only scripts).
    /// Directories of more than [`RELIST_MAX`] entries are left to stats.
    /// Whether the listing now answers for the directory's names (else a stat is in order).
    async fn relist_stale(&self, dir: NodeId) -> bool {
        // With no TTL a listing is stale at once: stats are all there is.
        if self.feed.trusted() || self.ttl().is_zero() || self.offline() {
            return false;
        }
        match self.meta.listing(dir, self.ttl(), true) {
            Some(l) if l.len() <= RELIST_MAX => {}
            _ => return false,
        }
        let _flight = self.relists.enter(dir).await;
        // Fetched by the flight we waited for, or with an ancestor's tree, or still to fetch:
        // with the listings beneath it, which are as stale.
        // (`listing` adopts one kept ahead, else fetches it with its tree, else alone.)
        if self.meta.listing(dir, self.ttl(), false).is_none() {
            let _ = self.listing(dir).await;
        }
        true
    }

    /// A stale node's attributes from its directory's listing fetched again
    /// ([`Self::relist_stale`]): whether that answered it (else a stat is in order).
    async fn relisted(&self, node: NodeId) -> bool {
        let asked = self.epoch();
        let Some((parent, name)) = self.node(node).ok().and_then(|n| n.links.first().cloned())
        else {
            return false;
        };
        // With a feed, the entry is what the mount last put there, no newer than the node.
        if !self.relist_stale(parent).await {
            return false;
        }
        match self.meta.entry(parent, &name, self.ttl(), false) {
            Some(Some(a)) => self.rebind_at_name(node, &a, asked),
            _ => false,
        }
    }

    async fn stat_node(&self, node: NodeId, path: &RemotePath) -> Result<Attr> {
        for _ in 0..STAT_AGAIN {
            let asked = self.epoch();
            // The node's own attributes are the answer while the sandbox gives none.
            let a = match self.ask(self.remote().stat(path), || true).await {
                Ok(a) => a,
                // Removed in the sandbox while open here: the open file is still what it was
                // (as an unlinked file is on a local disk), and its readers read it to its end.
                Err(RemoteError::NotFound(_)) if self.open_for_reading(node) => {
                    self.name_leaves(node);
                    return Ok(self.node(node)?.attr);
                }
                Err(e) => return Err(e),
            };
            if self.rebind_at_name(node, &a, asked) {
                return Ok(a);
            }
            // Older than a change the mount made meanwhile. The node's own attributes answer
            // when that change gave them; a name made in a directory did not (its times are
            // the sandbox's to say): asked again.
            if self.fresh(self.node(node)?.fetched) {
                break;
            }
        }
        Ok(self.node(node)?.attr)
    }

    /// A node whose answer was refused as older than the mount's own change to it, and whose
    /// attributes that change did not give: asked again ([`Self::stat_node`]).
    async fn restat_if_refused(&self, node: NodeId, path: &RemotePath, asked: u64) {
        let Ok(n) = self.node(node) else { return };
        if n.own_change > asked && !self.fresh(n.fetched) && !self.offline() {
            let _ = self.stat_node(node, path).await;
        }
    }

    /// The sandbox's answer about the node's name, asked for at epoch `asked`: applied to the
    /// node ([`InodeTable::rebind_answer`]), unless it is another file while this one is open
    /// for reading here. Then the open file stays what it was, size included (its readers go on
    /// reading it, as the agent holds it: were the kernel told the new file's size, they would
    /// read the old bytes cut or padded to it), and the name leaves it, for the next lookup to
    /// make the new file a node of its own. Answers whether the answer was applied.
    fn rebind_at_name(&self, node: NodeId, a: &Attr, asked: u64) -> bool {
        let Some(n) = self.inodes.get(node) else {
            return false;
        };
        if RemoteId::of(a) != n.remote && n.own_change <= asked && self.open_for_reading(node) {
            self.name_leaves(node);
            return false;
        }
        let applied = self.inodes.rebind_answer(node, a, asked);
        if applied {
            self.touched_in_place(node, &n.attr, a);
        }
        applied
    }

    /// The sandbox's new answer `now` for a file known as `before`: the same version but
    /// another change time means it was written in place with its size and mtime put back
    /// (which the version cannot tell), or only had its mode or owner changed. With no feed to
    /// say which, its cached pages go (here and in the kernel).
    fn touched_in_place(&self, node: NodeId, before: &Attr, now: &Attr) {
        if now.kind == FileKind::File
            && RemoteId::of(now) == RemoteId::of(before)
            && now.version == before.version
            && now.ctime_ns != before.ctime_ns
            && !self.feed.trusted()
            && self.staged_of(node).is_none()
        {
            self.forget_pages_of(node, &now.version);
            if let Some(k) = self.kernel() {
                k.invalidate_data(node);
            }
        }
    }

    /// Whether the node is a file open here with nothing staged (its handles read the
    /// sandbox's file).
    fn open_for_reading(&self, node: NodeId) -> bool {
        self.inodes
            .get(node)
            .is_some_and(|n| n.open > 0 && n.attr.kind == FileKind::File)
            && self.staged_of(node).is_none()
    }

    /// Another file has the node's name in the sandbox: the name leaves the node (here and
    /// in the kernel), whose open handles keep it as it was.
    fn name_leaves(&self, node: NodeId) {
        let Some(n) = self.inodes.get(node) else {
            return;
        };
        if let Some((parent, name)) = n.links.first() {
            self.inodes.unlink(*parent, name);
            self.meta.expire(*parent);
            if let Some(k) = self.kernel() {
                k.invalidate_entry(*parent, name);
            }
        }
    }

    /// An open for reading of a file the sandbox changed lately, made from what the feed last
    /// said (which a replacement made since may not have reached yet): one byte read of the
    /// version opened makes the agent hold that file for this reader, or finds it replaced
    /// already. Then the name leaves the node and the open answers ESTALE, which makes the
    /// kernel look the name up again and open the file that is there now.
    async fn hold_at_open(&self, node: NodeId, path: &RemotePath, attr: &Attr) -> Result<()> {
        let replaced = match self.read_checked(path, &attr.version, 0, 1).await {
            Ok((_, v)) if v == attr.version => false,
            Ok(_) => match self.stable_stat(path, || false).await {
                // Changed in place: the same file, whose handles follow it.
                Ok(a) => RemoteId::of(&a) != RemoteId::of(attr),
                Err(RemoteError::NotFound(_)) => true,
                Err(e) => return Err(e),
            },
            Err(RemoteError::NotFound(_)) => true,
            // Unreachable, or whatever else: the first read meets it and says so.
            Err(_) => false,
        };
        if replaced {
            self.name_leaves(node);
            return Err(RemoteError::Stale(path.display()));
        }
        Ok(())
    }

    /// The mount itself changed the node: it now has `attr`, and answers asked for before
    /// are older than that.
    pub(super) fn own_change(&self, node: NodeId, attr: &Attr) {
        self.bump();
        self.inodes.rebind_own(node, attr, self.epoch());
        // Its names' entries in the listings too: a lookup answered from a listing must
        // find the file as it now is (a server-side copy gives it another sandbox inode; a
        // stale entry would make the name another node, of the old size).
        // (A directory's own entry is refetched: its link count and times follow what is
        // made in it, which `dir_attrs_stale` handles.)
        if let Some(n) = self
            .inodes
            .get(node)
            .filter(|n| n.attr.kind != FileKind::Dir)
        {
            for (dir, name) in &n.links {
                self.meta.update_existing(*dir, name, attr.clone());
            }
        }
    }

    /// A remote stat that no local change raced: retried while the epoch moves under it.
    /// `known`: the caller has an answer of its own if the sandbox gives none
    /// ([`Self::ask`]).
    async fn stable_stat(&self, path: &RemotePath, known: impl Fn() -> bool) -> Result<Attr> {
        for _ in 0..4 {
            let before = self.epoch.load(Ordering::SeqCst);
            let a = self.ask(self.remote().stat(path), &known).await?;
            if self.epoch.load(Ordering::SeqCst) == before {
                return Ok(a);
            }
        }
        self.ask(self.remote().stat(path), &known).await
    }

    pub(super) fn staged_of(&self, node: NodeId) -> Option<Arc<StagedEntry>> {
        self.staged.get(node)
    }

    /// The attributes to report for a node: staged size and mtime while writes are staged; a
    /// symlink's size is that of the target shown ([`Self::readlink`]).
    pub(super) fn with_staged(&self, node: NodeId, mut attr: Attr) -> Attr {
        if let Some(s) = self.staged_of(node) {
            s.overlay(&mut attr);
        }
        if attr.kind == FileKind::Dir {
            // Names made here and not pushed yet changed the directory as a local disk's
            // would: its times are at least theirs (`rsync -a` compares them to decide
            // whether to set the directory's times; the sandbox's were from before).
            if let Some(t) = self.newest_unpushed_in(node) {
                attr.mtime_ns = attr.mtime_ns.max(t);
                attr.ctime_ns = attr.ctime_ns.max(t);
            }
        }
        if let Some(n) = self.inodes.get(node) {
            attr.ino = n.st_ino;
        }
        if let Some(t) = &attr.symlink_target {
            attr.size = self.shown_target_of(node, &t.0).len() as u64;
        }
        if self.inodes.path_of(node).is_none() && node != ROOT {
            attr.nlink = 0;
        }
        attr
    }

    pub(super) fn fresh(&self, fetched: Instant) -> bool {
        self.cfg.clock.since(fetched) < self.ttl()
    }

    /// How long attributes and listings are trusted (here and by the kernel): indefinitely
    /// while the change feed is connected and caught up, else the configured TTL.
    pub fn ttl(&self) -> Duration {
        if self.feed.trusted() {
            super::feed::TRUSTED_TTL
        } else {
            self.cfg.attr_ttl
        }
    }

    /// How long the kernel may keep a name without asking: a minute while the change feed
    /// vouches for the caches (it drops each name that changes), else the TTL. Not
    /// indefinitely, as attributes are: the kernel drops a name it is told to forget, with
    /// the node, whose listings an unreachable sandbox must still be served from, so names
    /// are not dropped when the feed stops vouching, only left to expire.
    pub fn entry_ttl(&self) -> Duration {
        if self.feed.trusted() {
            self.cfg.attr_ttl.max(super::feed::TRUSTED_ENTRY_TTL)
        } else {
            self.cfg.attr_ttl
        }
    }

    pub async fn lookup(&self, parent: NodeId, name: &[u8]) -> Result<NodeAttr> {
        let asked = self.epoch();
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        if let Some(id) = self
            .inodes
            .child(parent, name)
            .filter(|id| self.newfiles.contains(*id))
        {
            // Created here, not pushed yet: the sandbox does not know it.
            self.inodes.looked_up(id);
            let attr = self.with_staged(id, self.node(id)?.attr);
            return Ok(NodeAttr { node: id, attr });
        }
        if self.first_look(parent) {
            // The first look into a directory lists it with its subtree ([`super::subtree`]);
            // if that fails, the stat below says why.
            let _ = self.listing(parent).await;
        }
        if self.meta.entry(parent, name, self.ttl(), false).is_none()
            && self.vouched_child(parent, name).is_none()
        {
            self.relist_stale(parent).await;
        }
        let offline = self.offline();
        let known = self.inodes.child(parent, name);
        let attr = match self.meta.entry(parent, name, self.ttl(), offline) {
            Some(Some(a)) => a,
            // A stale listing (served while the sandbox does not answer) may predate a name
            // the mount holds a node for: the node wins.
            Some(None) if offline && known.is_some() => self.node(known.expect("checked"))?.attr,
            Some(None) => return Err(RemoteError::NotFound(path.display())),
            // Asked once each (the table can change between two asks: a second ask once
            // found nothing and panicked).
            None => match (
                offline.then(|| self.inodes.child(parent, name)).flatten(),
                self.vouched_child(parent, name),
            ) {
                (Some(id), _) => self.node(id)?.attr,
                // The change feed vouches for a node it has not reported changed.
                (None, Some(a)) => a,
                (None, None) => self.lookup_remote(parent, name, &path, known).await?,
            },
        };
        let node = self.remember_entry(parent, name, attr, asked);
        self.restat_if_refused(node, &path, asked).await;
        let attr = self.with_staged(node, self.node(node)?.attr);
        Ok(NodeAttr { node, attr })
    }

    /// A lookup's answer from the sandbox (what the caches could not say), or, while it does
    /// not answer, what was known of the name, however old.
    async fn lookup_remote(
        &self,
        parent: NodeId,
        name: &[u8],
        path: &RemotePath,
        known: Option<NodeId>,
    ) -> Result<Attr> {
        Ok(
            match self
                .stable_stat(path, || {
                    self.meta.entry(parent, name, self.ttl(), true).is_some()
                        || self.inodes.child(parent, name).is_some()
                })
                .await
            {
                Ok(a) => a,
                Err(e) if unreachable(&e) => {
                    // Offline: what we knew, however old.
                    match self.meta.entry(parent, name, self.ttl(), true) {
                        Some(Some(a)) => a,
                        Some(None) if known.is_some() => self.node(known.expect("checked"))?.attr,
                        Some(None) => return Err(RemoteError::NotFound(path.display())),
                        None => match self.inodes.child(parent, name) {
                            Some(id) => self.node(id)?.attr,
                            None => return Err(e),
                        },
                    }
                }
                Err(e) => {
                    if matches!(e, RemoteError::NotFound(_)) {
                        self.newfiles.note_absent(parent, name);
                    }
                    return Err(e);
                }
            },
        )
    }

    /// The attributes of a known child while the change feed vouches for them.
    fn vouched_child(&self, parent: NodeId, name: &[u8]) -> Option<Attr> {
        if !self.feed.trusted() {
            return None;
        }
        let n = self.inodes.get(self.inodes.child(parent, name)?)?;
        self.fresh(n.fetched).then_some(n.attr)
    }

    /// Record what a lookup found; a node with staged writes keeps its own identity (our
    /// push, not the sandbox's listing, moves it to a new inode).
    fn remember_entry(&self, parent: NodeId, name: &[u8], attr: Attr, asked: u64) -> NodeId {
        let known = self.inodes.child(parent, name);
        if let Some(id) = known {
            if self.staged_of(id).is_some() {
                self.inodes.looked_up(id);
                return id;
            }
        }
        let before = known.and_then(|id| self.inodes.get(id)).map(|n| n.attr);
        let id = self.inodes.remember(parent, name, attr, true, Some(asked));
        if let (Some(before), Some(now)) = (before, self.inodes.get(id)) {
            if Some(id) == known {
                self.touched_in_place(id, &before, &now.attr);
            }
        }
        id
    }

    /// Attributes of `name` in `parent`, for a permission check: not a lookup (the kernel's
    /// count of references is left alone).
    pub async fn child_attr(&self, parent: NodeId, name: &[u8]) -> Result<Attr> {
        match self.inodes.child(parent, name) {
            Some(id) => Ok(self.getattr(id).await?.attr),
            None => {
                let path = self.path_of(parent)?.join(name)?;
                self.stable_stat(&path, || false).await
            }
        }
    }

    pub fn forget(&self, node: NodeId, n: u64) {
        if node != ROOT {
            self.inodes.forget(node, n);
        }
    }

    pub async fn getattr(&self, node: NodeId) -> Result<NodeAttr> {
        let n = self.node(node)?;
        let staged = self.staged_of(node).is_some();
        let attr = match self.inodes.path_of(node) {
            // Staged or orphaned files answer from local state.
            _ if staged => n.attr,
            None => n.attr,
            Some(_) if self.fresh(n.fetched) || self.offline() => n.attr,
            Some(_) if self.relisted(node).await => self.node(node)?.attr,
            Some(path) => match self.stat_node(node, &path).await {
                Ok(a) => a,
                Err(e) if unreachable(&e) => n.attr,
                Err(e) => return Err(e),
            },
        };
        Ok(NodeAttr {
            node,
            attr: self.with_staged(node, attr),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn setattr(
        &self,
        node: NodeId,
        fh: Option<u64>,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
        atime_ns: Option<i64>,
        mtime_ns: Option<i64>,
    ) -> Result<NodeAttr> {
        // A chown to the owner a file already has is a no-op (editors do it before choosing
        // their save path); any other is passed to the sandbox. Owners are the sandbox's here.
        let current = self.node(node)?.attr;
        let uid = owner.0.filter(|u| *u != current.uid);
        let gid = owner.1.filter(|g| *g != current.gid);
        if let Some(size) = size {
            if size > MAX_FILE_BYTES {
                return Err(RemoteError::FileTooBig(self.path_of(node)?.display()));
            }
        }
        if let (Some(fh), Some(_)) = (fh, size) {
            if let Ok(h) = self.handles.file(fh) {
                h.wrote.store(true, Ordering::Relaxed);
            }
        }
        if (atime_ns.is_some() || mtime_ns.is_some()) && current.kind == FileKind::Dir {
            // `tar -x` and `rsync -a` set a directory's times after filling it: the pushes of
            // its files land first, or they would move its mtime to the push time.
            self.push_children(node).await;
        }
        if size.is_none() {
            if let Some(s) = self.staged_of(node) {
                let set = SetAttr {
                    mode,
                    size: None,
                    atime_ns,
                    mtime_ns,
                    uid,
                    gid,
                };
                if s.set_late(&set) {
                    // A push holds the image: it applies these when it lands.
                    let mut attr = self.node(node)?.attr;
                    attr.mode = mode.unwrap_or(attr.mode);
                    attr.uid = uid.unwrap_or(attr.uid);
                    attr.gid = gid.unwrap_or(attr.gid);
                    attr.atime_ns = atime_ns.unwrap_or(attr.atime_ns);
                    attr.ctime_ns = now_ns();
                    self.inodes.set_attr(node, &attr);
                    return Ok(NodeAttr {
                        node,
                        attr: self.with_staged(node, attr),
                    });
                }
            }
        }
        let unopened = self.inodes.get(node).is_some_and(|n| n.open == 0);
        if unopened && size.is_some() {
            // truncate(2) on a closed file: its queued push lands first, and then its staged
            // image is gone (pushed) or still holds a failed push this change joins. Times,
            // mode and owner need no wait: a push still queued takes them along (`tar -x`
            // sets each file's times right after closing it).
            self.pushq.wait_for(&[node]).await;
        }
        while let Some(s) = self.staged_of(node) {
            let mut g = s.lock().await;
            if !self
                .staged_of(node)
                .is_some_and(|now| Arc::ptr_eq(&now, &s))
            {
                // Dropped (pushed and idle) while we waited for it: what it held is in the
                // sandbox, and a change made to it now would be lost.
                continue;
            }
            if let Some(size) = size {
                g.truncate(size).map_err(|e| local_io(&e))?;
                g.mtime_ns = Some(now_ns());
            }
            if g.is_dirty() || self.inodes.path_of(node).is_none() {
                // Applied after the push, or the commit's rename would undo them.
                let p = &mut g.pending_attr;
                p.mode = mode.or(p.mode);
                p.atime_ns = atime_ns.or(p.atime_ns);
                p.uid = uid.or(p.uid);
                p.gid = gid.or(p.gid);
                if mtime_ns.is_some() {
                    p.mtime_ns = mtime_ns;
                    g.mtime_ns = mtime_ns;
                }
                s.sync(&g);
                let dirty = g.is_dirty();
                drop(g);
                if dirty && unopened && self.inodes.get(node).is_some_and(|n| n.open == 0) {
                    // No close will push it: push it now (a failure is kept and reported).
                    if self.sync_close() {
                        let _ = self.push(node).await;
                    } else {
                        self.queue_push(node);
                    }
                }
                let mut attr = self.node(node)?.attr;
                if let Some(m) = mode {
                    attr.mode = m;
                }
                if let Some(u) = uid {
                    attr.uid = u;
                }
                if let Some(g) = gid {
                    attr.gid = g;
                }
                if let Some(a) = atime_ns {
                    attr.atime_ns = a;
                }
                attr.ctime_ns = now_ns();
                self.inodes.set_attr(node, &attr);
                return Ok(NodeAttr {
                    node,
                    attr: self.with_staged(node, attr),
                });
            }
            s.sync(&g);
            break;
        }
        let path = self.path_of(node)?;
        let set = SetAttr {
            mode,
            size,
            atime_ns,
            mtime_ns,
            uid,
            gid,
        };
        let attr = if set == SetAttr::default() {
            self.getattr(node).await?.attr
        } else {
            self.bump();
            let a = self.note(self.remote().setattr(&path, set).await)?;
            // Our own change gives the file a new version; a staged file (opened for writing,
            // nothing written) follows it rather than calling it a conflict later.
            if let Some(s) = self.staged_of(node) {
                let mut g = s.lock().await;
                if !g.is_dirty() {
                    g.pushed(a.version.clone(), a.size);
                    s.sync(&g);
                }
            }
            self.own_change(node, &a);
            self.handles.follow(node, &a);
            if size.is_some() {
                if let Some(k) = self.kernel() {
                    k.invalidate_data(node);
                }
            }
            a
        };
        if let Some((parent, _)) = self.node(node)?.links.first() {
            self.meta.invalidate(*parent);
            self.forget_prefetched(*parent);
        }
        Ok(NodeAttr {
            node,
            attr: self.with_staged(node, attr),
        })
    }

    /// A directory's entries with their attributes: fresh from the cache, else fetched in one
    /// round trip (and served stale when the sandbox does not answer).
    async fn listing(&self, dir: NodeId) -> Result<super::meta::Entries> {
        if let Some(l) = self.meta.listing(dir, self.ttl(), self.offline()) {
            return Ok(l);
        }
        if let Some(l) = self.adopt_prefetched(dir, self.offline()) {
            return Ok(l);
        }
        let path = self.path_of(dir)?;
        match self.fetch_subtree(dir, &path).await {
            None => {}
            Some(Ok(l)) => return Ok(l),
            Some(Err(e)) if unreachable(&e) => {
                return self.meta.listing(dir, self.cfg.attr_ttl, true).ok_or(e)
            }
            Some(Err(e)) => return Err(e),
        }
        // Stale with no feed: read again with the listings beneath it, as stale (a walk past
        // the TTL then costs a call per subtree, not per directory).
        if !self.feed.trusted()
            && !self.offline()
            && self.meta.listing(dir, self.cfg.attr_ttl, true).is_some()
        {
            if let Some(l) = self.relist_tree(dir).await {
                return Ok(l);
            }
        }
        let before = self.epoch.load(Ordering::SeqCst);
        let listed = self.ask(self.remote().list(&path), || {
            self.meta.listing(dir, self.ttl(), true).is_some()
        });
        match listed.await {
            Ok(fetched) => {
                let entries: Vec<(Vec<u8>, Attr)> =
                    fetched.into_iter().map(|e| (e.name.0, e.attr)).collect();
                let entries = Arc::new(entries);
                if self.epoch.load(Ordering::SeqCst) == before {
                    self.meta.put(dir, entries.clone());
                }
                Ok(entries)
            }
            Err(e) if unreachable(&e) => self.meta.listing(dir, self.ttl(), true).ok_or(e),
            Err(e) => Err(e),
        }
    }

    /// Open a directory, and say whether the kernel may keep its listing across opens
    /// (`FOPEN_CACHE_DIR`): while the change feed vouches for the caches, as for a file's
    /// pages. Every change to the listing from the sandbox drops the kernel's copy
    /// ([`Self::kernel_listing_stale`]); the kernel drops it itself on changes made through
    /// it.
    pub fn opendir(&self, node: NodeId) -> Result<(u64, KernelPages)> {
        self.node(node)?;
        let pages = if self.feed.trusted() {
            KernelPages::Keep
        } else {
            KernelPages::Drop
        };
        Ok((self.handles.open_dir(node), pages))
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.close_dir(fh);
    }

    /// Entries of an open directory from `offset` on. The first call takes a snapshot that
    /// every continuation of this handle serves, so entries never shift or repeat however the
    /// directory changes meanwhile.
    pub async fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<DirEntryOut>>> {
        let (node, snapshot) = self.handles.dir(fh)?;
        if let Some(s) = snapshot.filter(|_| offset > 0) {
            return Ok(s);
        }
        let listing = self.listing(node).await?;
        let parent_ino = self
            .node(node)?
            .links
            .first()
            .and_then(|(p, _)| self.inodes.get(*p))
            .map_or(self.node(node)?.st_ino, |p| p.st_ino);
        let mut out = vec![
            DirEntryOut {
                name: b".".to_vec(),
                ino: self.node(node)?.st_ino,
                kind: FileKind::Dir,
            },
            DirEntryOut {
                name: b"..".to_vec(),
                ino: parent_ino,
                kind: FileKind::Dir,
            },
        ];
        // A name the mount has a node for shows that node's `st_ino` (kept across our saves).
        out.extend(listing.iter().map(|(name, a)| {
            DirEntryOut {
                name: name.clone(),
                ino: self
                    .inodes
                    .child(node, name)
                    .and_then(|id| self.inodes.get(id))
                    .filter(|n| RemoteId::of(a) == n.remote)
                    .map_or(a.ino, |n| n.st_ino),
                kind: a.kind,
            }
        }));
        self.add_new_files(node, &mut out);
        let out = Arc::new(out);
        self.handles.set_snapshot(fh, out.clone());
        Ok(out)
    }

    /// Open: revalidate (close-to-open; while the change feed vouches for the cached version,
    /// no round trip), stage for writing if asked. Returns the handle and what the kernel may
    /// do with its cached pages.
    pub async fn open(
        &self,
        node: NodeId,
        writable: bool,
        truncate: bool,
    ) -> Result<(u64, KernelPages)> {
        let staged = self.staged_of(node).is_some();
        let n = self.node(node)?;
        let unnamed = self.inodes.path_of(node).is_none();
        if unnamed && !n.removed_locally && !self.newfiles.contains(node) {
            // The kernel reached, by a name it still holds, a node the sandbox has since
            // moved away or removed (the feed said so first): ESTALE has the VFS look the
            // name up again, as below.
            return Err(RemoteError::Stale(format!(
                "{} (moved in the sandbox)",
                n.last_path.display()
            )));
        }
        let vouched = self.feed.trusted() && self.fresh(n.fetched);
        let attr = if staged || vouched || unnamed || self.offline() {
            n.attr
        } else {
            let path = self.path_of(node)?;
            match self.stat_node(node, &path).await {
                Ok(a) => a,
                // The sandbox is unreachable: an open still works from what we knew — cached
                // pages can be read, and an edit can be staged now and pushed (against that
                // version) when the sandbox is back.
                Err(e) if unreachable(&e) => self.node(node)?.attr,
                // The kernel reached this node by a name the sandbox has since given to
                // another file, or removed (`mv new x` there while `open("x")` here): ESTALE
                // has the VFS look the name up again once and open what it names now (or
                // make it, with O_CREAT), as an open by name on a local disk would.
                Err(RemoteError::NotFound(p)) => return Err(RemoteError::Stale(p)),
                Err(e) => return Err(e),
            }
        };
        if attr.kind == FileKind::Dir && writable {
            return Err(RemoteError::IsDir(self.path_of(node)?.display()));
        }
        let mut changing = false;
        if !writable && !staged && attr.kind == FileKind::File && !self.offline() {
            if let Some(path) = self.inodes.path_of(node) {
                changing = self.recent.changing(&path, self.cfg.clock.now());
                if changing && vouched {
                    self.hold_at_open(node, &path, &attr).await?;
                }
            }
        }
        // Counted open before any staging, so a release racing this open never drops the
        // staged state it is about to use.
        self.inodes.opened(node, 1);
        if writable {
            if let Err(e) = self.stage_for_open(node, &attr, staged, truncate).await {
                self.inodes.opened(node, -1);
                return Err(e);
            }
        }
        let keep = self.inodes.kernel_pages_of(node, &attr.version) && !staged;
        let fh = self.handles.open_file(OpenFile::new(node, &attr, writable));
        // A push that landed while this open waited (for the image's lock, or the stat) made
        // the node another sandbox file and followed the handles it knew: not this one yet.
        let mut followed = false;
        if let (Ok(now), Ok(h)) = (self.node(node), self.handles.file(fh)) {
            if RemoteId::of(&now.attr) != RemoteId::of(&attr) || now.attr.version != attr.version {
                h.follow(&now.attr);
                followed = true;
            }
        }
        let pages = if changing {
            KernelPages::Bypass
        } else if keep && !truncate && !followed {
            KernelPages::Keep
        } else {
            KernelPages::Drop
        };
        Ok((fh, pages))
    }

    /// One remote read for the page cache, of the file at `version` if the sandbox still holds
    /// it (a file replaced while being read keeps its bytes): never longer than asked,
    /// counted in the stats.
    pub(super) async fn read_checked(
        &self,
        path: &RemotePath,
        version: &crate::remote::Version,
        offset: u64,
        len: u32,
    ) -> Result<(Bytes, crate::remote::Version)> {
        // Nothing else to serve: a hung sandbox's read ends at its deadline, and a slow one's
        // answer is taken when it comes.
        let r = self
            .ask(self.remote().read_held(path, offset, len, version), || {
                false
            })
            .await?;
        if r.data.len() as u64 > u64::from(len) {
            return Err(RemoteError::Io(
                path.display(),
                "the sandbox answered more bytes than asked".into(),
            ));
        }
        self.stats
            .bytes_read
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        Ok((r.data, r.version))
    }

    pub(super) async fn page_at(
        &self,
        path: &RemotePath,
        version: &crate::remote::Version,
        page: PageIndex,
    ) -> Result<Bytes> {
        match self.page_of_any_version(path, version, page).await? {
            (data, None) => Ok(data),
            // The bytes are of another version (filed under it): not the ones asked for.
            (_, Some(_)) => Err(RemoteError::Stale(path.display())),
        }
    }

    /// The ctime the file at `path` has at `version`, as the mount knows it: with the version
    /// it names a page on disk ([`crate::mount::disk_pages`]); `None` (memory only) when the
    /// mount knows the file at another version.
    pub(super) fn disk_ctime(
        &self,
        path: &RemotePath,
        version: &crate::remote::Version,
    ) -> Option<i64> {
        let n = self.inodes.get(self.inodes.resolve(path)?)?;
        (n.attr.version == *version).then_some(n.attr.ctime_ns)
    }

    /// A page of `version`, or, if the sandbox's file is no longer at it, of the version it
    /// is at now (named).
    async fn page_of_any_version(
        &self,
        path: &RemotePath,
        version: &crate::remote::Version,
        page: PageIndex,
    ) -> Result<(Bytes, Option<crate::remote::Version>)> {
        let (data, other, hit) = self
            .pages
            .get_or_fetch(version, self.disk_ctime(path, version), page, || async {
                self.read_checked(path, version, page.start(), PAGE as u32)
                    .await
            })
            .await?;
        let counter = if hit {
            &self.stats.cache_hits
        } else {
            &self.stats.cache_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok((data, other))
    }

    pub async fn read(self: &Arc<Self>, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handles.file(fh)?;
        if let Some(s) = self.staged_of(h.node) {
            return self.read_staged(h.node, &s, offset, size as u64).await;
        }
        // A file that lost its name to another (replaced in the sandbox, and the name since
        // looked up) is asked for by its last name: the sandbox may still hold it for us
        // (`read_held`); if not, the answer is of another file, and ESTALE below.
        let (path, lost) = match self.inodes.path_of(h.node) {
            Some(p) => (p, false),
            None => (self.node(h.node)?.last_path, true),
        };
        if h.remote().dev == super::newfiles::UNPUSHED_DEV {
            // Opened while the file was new; pushed since: it is the sandbox's file now.
            h.follow(&self.node(h.node)?.attr);
        }
        let mut follows = 0;
        'again: loop {
            let mut version = h.version();
            self.read_ahead(&h, &path, &version, offset, size as u64);
            let end = offset + size as u64;
            let mut out = Vec::with_capacity(size as usize);
            let mut page = PageIndex::containing(offset);
            while page.start() < end {
                let data = match self.page_of_any_version(&path, &version, page).await {
                    Ok((d, None)) => d,
                    Ok((d, Some(now))) if follows >= SETTLE_AFTER_FOLLOWS => {
                        // Still this file (checked by the follows before), rewritten in
                        // place faster than a round trip: its bytes as they come, page by
                        // page, as a local disk gives a reader racing a writer. Each page is
                        // of one version, filed under it; nothing else is claimed.
                        version = now;
                        d
                    }
                    Ok((_, Some(_))) | Err(RemoteError::Stale(_)) => {
                        // The sandbox's file changed since this handle last knew it. Changed
                        // in place, it is still this handle's file: its new bytes are what a
                        // local disk would show. Replaced by another file, its old bytes are
                        // gone: answer that, never a mix of two files.
                        let a = match self.stable_stat(&path, || false).await {
                            Ok(a) => a,
                            // Removed: a read cannot say ENOENT, and its bytes are gone.
                            Err(RemoteError::NotFound(_)) => {
                                return Err(RemoteError::Stale(path.display()))
                            }
                            Err(e) => return Err(e),
                        };
                        if RemoteId::of(&a) != h.remote() {
                            return Err(RemoteError::Stale(path.display()));
                        }
                        // A file that changes on every read is followed a few times, then
                        // read as it comes (above).
                        follows += 1;
                        if follows > MAX_READ_FOLLOWS {
                            return Err(RemoteError::Io(
                                path.display(),
                                format!("changed in the sandbox {follows} times during one read"),
                            ));
                        }
                        h.follow(&a);
                        continue 'again;
                    }
                    // Whatever holds the lost name now (nothing, a directory) is not this file.
                    Err(
                        RemoteError::NotFound(_) | RemoteError::IsDir(_) | RemoteError::Invalid(_),
                    ) if lost => return Err(RemoteError::Stale(path.display())),
                    Err(e) => return Err(e),
                };
                let start = page.start();
                let from = offset.saturating_sub(start) as usize;
                if from >= data.len() {
                    break;
                }
                let to = ((end - start) as usize).min(data.len());
                out.extend_from_slice(&data[from..to]);
                if data.len() < PAGE as usize {
                    break; // end of file
                }
                page.0 += 1;
            }
            return Ok(out);
        }
    }

    async fn read_staged(
        &self,
        node: NodeId,
        s: &Arc<StagedEntry>,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>> {
        // While its push holds the image, a read is served from it, not after the upload.
        let mut g = match s.try_lock() {
            Some(g) => g,
            None => match s.read_while_pushing(offset, size) {
                Some(read) => return read.map_err(|e| local_io(&e)),
                None => s.lock().await,
            },
        };
        self.fill(node, &mut g, offset, size).await?;
        g.read_local(offset, size).map_err(|e| local_io(&e))
    }

    async fn stage_for_open(
        &self,
        node: NodeId,
        attr: &crate::remote::Attr,
        staged: bool,
        truncate: bool,
    ) -> Result<()> {
        if self.inodes.path_of(node).is_none() && !staged {
            return Err(RemoteError::NotFound(self.path_of(node)?.display()));
        }
        // Staging tracks the file page by page: a size past the write limit (or a sandbox
        // claiming 2^63 - 1 bytes) is refused before anything is sized by it.
        if !staged && attr.size > MAX_FILE_BYTES {
            return Err(RemoteError::FileTooBig(format!(
                "{}: files in the mount are limited to {MAX_FILE_BYTES} bytes",
                self.path_of(node)?.display()
            )));
        }
        let named = self.inodes.path_of(node);
        let s = self.stage(node, attr, true)?;
        let mut g = s.lock().await;
        // A push this open waited for gave the node another name (it met a conflict and the
        // node is its copy now, or it followed a sandbox-side move): the name the kernel
        // opened leads elsewhere. ESTALE has it look the name up again, before a truncation
        // here would cut the copy.
        if named.is_some() && self.inodes.path_of(node) != named {
            return Err(RemoteError::Stale(format!(
                "{} (renamed while opening)",
                named.map(|p| p.display()).unwrap_or_default()
            )));
        }
        if truncate && g.len > 0 {
            g.truncate(0).map_err(|e| local_io(&e))?;
            g.mtime_ns = Some(now_ns());
        }
        // Opened to write over its base: the base is kept from now on, so a sandbox that
        // replaces or deletes the file before the first write (or right after it) cannot
        // take the bytes the user's version is made of. A small one is taken before the open
        // answers (one read); a larger one in the background.
        if !g.capture_started && Self::wants_capture(&g) {
            g.capture_started = true;
            self.capture_cached(&mut g);
            let now = g.base_size <= CAPTURE_AT_OPEN_BYTES && self.is_reachable();
            let captured = match self.inodes.path_of(node) {
                _ if g.complete() => true,
                Some(path) if now => self.capture_base(&path, &mut g).await.is_ok(),
                _ => false,
            };
            if !captured {
                self.capture_in_background(node);
            }
        }
        s.sync(&g);
        Ok(())
    }

    /// Fetch the base pages a read of the range needs into the staged file.
    pub(super) async fn fill(
        &self,
        node: NodeId,
        g: &mut Staged,
        offset: u64,
        size: u64,
    ) -> Result<()> {
        let missing = g.missing_in(offset, size);
        if missing.is_empty() {
            return Ok(());
        }
        let base = g
            .base
            .clone()
            .expect("a file with missing pages has a base");
        let path = match self.inodes.path_of(node) {
            Some(p) => p,
            None => self.node(node)?.last_path,
        };
        for page in missing {
            let data = self.page_at(&path, &base, PageIndex(page)).await?;
            g.fill_page(page, &data).map_err(|e| local_io(&e))?;
        }
        Ok(())
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handles.file(fh)?;
        if !h.writable {
            return Err(RemoteError::Invalid("file not open for writing".into()));
        }
        let end = offset.saturating_add(data.len() as u64);
        if end > MAX_FILE_BYTES {
            return Err(RemoteError::FileTooBig(format!(
                "{}: files in the mount are limited to {MAX_FILE_BYTES} bytes",
                self.node(h.node)?.last_path.display()
            )));
        }
        let s = self
            .staged_of(h.node)
            .ok_or_else(|| RemoteError::Invalid("no staged state for an open file".into()))?;
        let mut g = s.lock().await;
        g.write(offset, data).map_err(|e| local_io(&e))?;
        g.mtime_ns = Some(now_ns());
        s.sync(&g);
        if !g.capture_started && Self::wants_capture(&g) {
            // Staged before this handle opened it for writing (a setattr, a read-write open
            // of a file staged for reading).
            g.capture_started = true;
            self.capture_in_background(h.node);
        }
        h.wrote.store(true, Ordering::Relaxed);
        Ok(data.len() as u32)
    }

    /// A WRITE on `fh` came from thread `tid` ([`super::handles::OpenFile::written_by`]).
    pub fn written_by(&self, fh: u64, tid: u32) {
        if let Ok(h) = self.handles.file(fh) {
            h.written_by(tid);
        }
    }

    /// Whether a FLUSH of `fh` from thread `tid` may be its writer's close: one from a process
    /// that never wrote through it (a child closing an inherited descriptor at `exec`) leaves
    /// the push to the writer's own close or the last one (RELEASE).
    pub fn closed_by_a_writer(&self, fh: u64, tid: u32) -> bool {
        self.handles
            .file(fh)
            .map_or(true, |h| h.closed_by_a_writer(tid))
    }

    /// `close()` of one descriptor. A flush pushes only what this handle wrote since its last
    /// flush: bash's `echo x > f` closes a duplicate before writing, and that must not commit
    /// an empty file over the one there (a file made here and not in the sandbox yet is
    /// pushed by its first flush under `-o sync_close`: nothing is there to be replaced). The last close (release) pushes whatever is left. The push is queued
    /// ([`super::pushq`]) unless `-o sync_close`; an earlier failed push of the file is
    /// reported here.
    pub async fn flush(&self, fh: u64) -> Result<()> {
        let h = self.handles.file(fh)?;
        // With `-o sync_close` a file made here is in the sandbox when the close that made
        // it returns, written to or not: the last close (RELEASE) that would push it comes
        // after close(2) has returned, too late for a program that looks in the sandbox next.
        let made_here = self.sync_close() && h.writable && self.newfiles.unsent(h.node);
        if h.writable && (h.wrote.swap(false, Ordering::Relaxed) || made_here) {
            if self.sync_close() {
                let r = self.push(h.node).await;
                return self.push_reported(h.node, r).await;
            }
            self.queue_push(h.node);
        }
        if !h.writable {
            // A reader's close (`cat`'s) is not where a writer's failed push is reported:
            // the data is kept and the next writer's close or fsync says so.
            return Ok(());
        }
        self.push_reported(h.node, Ok(())).await
    }

    /// `fsync`: everything staged for the file reaches the sandbox, or an error says why (a
    /// queued push of it is waited for: the push takes the file's staged lock).
    pub async fn fsync(&self, fh: u64) -> Result<()> {
        let h = self.handles.file(fh)?;
        h.wrote.store(false, Ordering::Relaxed);
        let r = self.push(h.node).await;
        self.push_reported(h.node, r).await
    }

    /// A push's result as `fsync`/`close` return it ([`write_report`]). A failure may have
    /// moved the file's node to its conflict copy: the kernel forgets the old name's entry
    /// before the program hears of it, so that the save it makes next by that name opens
    /// the sandbox's file, not the copy (a save right after a conflict once went into the
    /// copy, over the first save's bytes, and its `fsync` said 0). `r` is the result of the
    /// push made for this call, if any: its failure is the report; else one an earlier push
    /// left unheard ([`super::writeback::Failures::take_report`]).
    async fn push_reported(&self, node: NodeId, r: Result<()>) -> Result<()> {
        let r = match r {
            Err(e) => {
                let _ = self.failures.take_report(node);
                Err(e)
            }
            Ok(()) => self.failures.take_report(node),
        };
        // (A conflict is an I/O error; a refusal such as ENOSPC moves nothing.)
        if matches!(r, Err(RemoteError::Io(..))) {
            self.kernel_settled().await;
        }
        r.map_err(write_report)
    }

    pub async fn release(&self, fh: u64) -> Result<()> {
        let Some(h) = self.handles.close_file(fh) else {
            return Ok(());
        };
        let result = if let Some(s) = self.staged_of(h.node) {
            let removed = self.inodes.get(h.node).is_some_and(|n| n.removed_locally);
            if h.writable {
                s.writer_closed();
            }
            // This is the last handle open on the node.
            let last = self.inodes.get(h.node).is_some_and(|n| n.open <= 1);
            if removed && last {
                // Unlinked while open: on the last close its data goes, as on ext4.
                self.drop_staged(h.node);
                Ok(())
            } else if removed {
                Ok(())
            } else {
                let r = if h.writable && self.sync_close() {
                    self.push(h.node).await
                } else {
                    if h.writable {
                        self.queue_push(h.node);
                    }
                    Ok(())
                };
                if last {
                    self.drop_staged_if_clean(h.node).await;
                }
                r
            }
        } else {
            Ok(())
        };
        self.inodes.opened(h.node, -1);
        result
    }

    pub async fn create(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(NodeAttr, u64)> {
        self.create_as(parent, name, mode, exclusive, truncate, None)
            .await
    }

    /// `create`, the file going to `owner` ([`Self::give_to`]) only if this call made it: a
    /// file that appeared meanwhile (opened, not made) keeps its owner.
    pub async fn create_as(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        truncate: bool,
        owner: Option<(u32, u32)>,
    ) -> Result<(NodeAttr, u64)> {
        let (made, fh, created) = self
            .create_inner(parent, name, mode, exclusive, truncate)
            .await?;
        if !created || owner.is_none() {
            return Ok((made, fh));
        }
        match self.give_to(made, owner).await {
            Ok(made) => Ok((made, fh)),
            Err(e) => {
                let _ = self.release(fh).await;
                Err(e)
            }
        }
    }

    /// Answers whether the file was made by this call (not an existing one opened).
    async fn create_inner(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(NodeAttr, u64, bool)> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        let absent = self.meta.entry(parent, name, self.ttl(), false) == Some(None);
        let known_absent = self.newfiles.take_absent(parent, name) || absent;
        // A lock file (git's `index.lock`: any `NAME.lock` made exclusively) is made in the
        // sandbox at once, so that a lock taken here is taken there too: made here only, it
        // would not stop a program in the sandbox from taking the same lock (git on both
        // sides then wrote the same index at once).
        let lock = exclusive && is_lock_name(name) && !self.offline();
        if known_absent && !lock && self.inodes.child(parent, name).is_none() {
            return self.made_new(parent, name, mode).await;
        }
        // Not known to be absent: ask, rather than create it empty in the sandbox (a reader
        // there would see an empty file before its content). A file the sandbox makes after
        // this answer is not overwritten: the first push is create-only.
        // A sandbox out of reach: made here too, and pushed when it answers (create-only, so
        // nothing there is overwritten), as writes to existing files are kept.
        if self.inodes.child(parent, name).is_none() && !lock {
            if self.offline() {
                return self.made_new(parent, name, mode).await;
            }
            if self.sandbox.commit_absent() {
                // Out of reach, the file is made here (below).
                match self.stable_stat(&path, || true).await {
                    Err(RemoteError::NotFound(_)) => {
                        return self.made_new(parent, name, mode).await
                    }
                    Err(e) if unreachable(&e) => return self.made_new(parent, name, mode).await,
                    _ => {}
                }
            }
        }
        self.bump();
        let (attr, created) = match self.note(self.remote().create(&path, mode & 0o7777).await) {
            Ok(a) => (a, true),
            Err(e) if unreachable(&e) && self.inodes.child(parent, name).is_none() => {
                return self.made_new(parent, name, mode).await
            }
            Err(RemoteError::Exists(_)) if !exclusive => {
                (self.stable_stat(&path, || false).await?, false)
            }
            Err(e) => return Err(e),
        };
        let node = self.made_in_sandbox(parent, name, &attr);
        let (fh, _) = self.open(node, true, truncate).await?;
        let attr = self.with_staged(node, self.node(node)?.attr);
        Ok((NodeAttr { node, attr }, fh, created))
    }

    async fn made_new(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
    ) -> Result<(NodeAttr, u64, bool)> {
        let (made, fh) = self.create_new(parent, name, mode).await?;
        Ok((made, fh, true))
    }

    /// Create a file the sandbox does not have, locally only: its first push creates it
    /// ([`super::newfiles`]).
    async fn create_new(&self, parent: NodeId, name: &[u8], mode: u32) -> Result<(NodeAttr, u64)> {
        let now = now_ns();
        let owner = self.node(ROOT)?.attr;
        let attr = Attr {
            kind: FileKind::File,
            size: 0,
            mode: mode & 0o7777,
            uid: owner.uid,
            gid: owner.gid,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            dev: super::newfiles::UNPUSHED_DEV,
            ino: self.newfiles.next_ino(),
            born_ns: 0,
            nlink: 1,
            rdev: 0,
            symlink_target: None,
            version: crate::remote::Version(String::new()),
            // Nothing set yet: xattr calls are answered here until its push.
            has_xattrs: Some(false),
        };
        self.bump();
        let node = self.inodes.remember(parent, name, attr, true, None);
        self.stage_new(node)?;
        self.newfiles.add(node);
        self.entry_made(parent, name, self.node(node)?.attr);
        self.inodes.opened(node, 1);
        let fh = self
            .handles
            .open_file(OpenFile::new(node, &self.node(node)?.attr, true));
        let attr = self.with_staged(node, self.node(node)?.attr);
        Ok((NodeAttr { node, attr }, fh))
    }

    /// A regular file made by `mknod` (created, not opened).
    pub async fn make_file(&self, parent: NodeId, name: &[u8], mode: u32) -> Result<NodeAttr> {
        let path = self.path_of(parent)?.join(name)?;
        self.bump();
        let attr = self.note(self.remote().create(&path, mode & 0o7777).await)?;
        let node = self.made_in_sandbox(parent, name, &attr);
        Ok(NodeAttr { node, attr })
    }

    /// A file just made here goes to `owner` (uid, gid in the sandbox's numbers), if given:
    /// [`super::gate::Gate::new_owner`]. For a file not pushed yet the chown is applied
    /// after its push.
    pub async fn give_to(&self, made: NodeAttr, owner: Option<(u32, u32)>) -> Result<NodeAttr> {
        match owner {
            Some((uid, gid)) if (uid, gid) != (made.attr.uid, made.attr.gid) => {
                self.setattr(
                    made.node,
                    None,
                    None,
                    (Some(uid), Some(gid)),
                    None,
                    None,
                    None,
                )
                .await
            }
            _ => Ok(made),
        }
    }

    /// `name` was made in `parent` by a call of the mount's own that the sandbox answered with
    /// `attr`: the listing takes it in place, the kernel's new node is remembered, and answers
    /// asked before are older than it.
    fn made_in_sandbox(&self, parent: NodeId, name: &[u8], attr: &Attr) -> NodeId {
        self.entry_made(parent, name, attr.clone());
        let node = self.inodes.remember(parent, name, attr.clone(), true, None);
        self.own_change(node, attr);
        node
    }

    /// Have the kernel fetch a node's attributes again.
    pub fn invalidate_kernel_attr(&self, node: NodeId) {
        if let Some(k) = self.kernel() {
            k.invalidate_attr(node);
        }
    }

    /// Drop the kernel's pages and attributes of the node (after a reply that changed them).
    pub fn invalidate_kernel_data(&self, node: NodeId) {
        if let Some(k) = self.kernel() {
            k.invalidate_data(node);
        }
    }

    pub async fn mkdir(&self, parent: NodeId, name: &[u8], mode: u32) -> Result<NodeAttr> {
        let path = self.path_of(parent)?.join(name)?;
        self.bump();
        let attr = match self.note(self.remote().mkdir(&path, mode & 0o7777).await) {
            // The answer was lost (a session cut on its way back): a directory there now was
            // made by this request (the kernel looked the name up as absent just before).
            Err(RemoteError::Transport(e)) => match self.note(self.remote().stat(&path).await) {
                Ok(a) if a.kind == FileKind::Dir => {
                    tracing::debug!("a mkdir got no answer ({e}); the directory is there");
                    a
                }
                _ => return Err(RemoteError::Transport(e)),
            },
            r => r?,
        };
        let node = self.made_in_sandbox(parent, name, &attr);
        // Made just now, by us: empty (names looked up in it are absent without asking).
        self.meta.put(node, Default::default());
        Ok(NodeAttr { node, attr })
    }

    pub async fn mknod(
        &self,
        parent: NodeId,
        name: &[u8],
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<NodeAttr> {
        let path = self.path_of(parent)?.join(name)?;
        self.bump();
        let attr = self.note(self.remote().mknod(&path, kind, mode & 0o7777, rdev).await)?;
        let node = self.made_in_sandbox(parent, name, &attr);
        Ok(NodeAttr { node, attr })
    }

    pub async fn symlink(&self, parent: NodeId, name: &[u8], target: &[u8]) -> Result<NodeAttr> {
        let path = self.path_of(parent)?.join(name)?;
        self.bump();
        let attr = self.note(self.remote().symlink(&path, target).await)?;
        self.made_links
            .made(&self.sandbox_id(), path.as_bytes(), target);
        let node = self.made_in_sandbox(parent, name, &attr);
        let attr = self.with_staged(node, attr);
        Ok(NodeAttr { node, attr })
    }

    pub async fn link(&self, node: NodeId, parent: NodeId, name: &[u8]) -> Result<NodeAttr> {
        let existing = self.path_of(node)?;
        let path = self.path_of(parent)?.join(name)?;
        // The new name must see what is staged: push it first.
        self.push(node).await?;
        self.bump();
        let attr = self.note(self.remote().link(&existing, &path).await)?;
        self.inodes.link(node, parent, name);
        self.inodes.linked(node, &attr, self.cfg.clock.now());
        // Every name of the file shows its new link count: in place where the mount knows
        // them all, else its directory is listed again.
        let names = self.inodes.get(node).map(|n| n.links).unwrap_or_default();
        if names.len() as u64 == attr.nlink {
            for (dir, other) in &names {
                self.meta.upsert(*dir, other, attr.clone());
            }
            self.entry_made(parent, name, attr.clone());
        } else {
            self.dir_changed(parent);
        }
        Ok(NodeAttr {
            node,
            attr: self.with_staged(node, attr),
        })
    }

    /// Before a name goes away (unlink, or a rename over it): a node still open keeps a
    /// complete local copy, so its handles go on reading after the sandbox's file is gone.
    pub(super) async fn keep_open_copy(&self, node: NodeId) -> Result<()> {
        let Some(n) = self.inodes.get(node) else {
            return Ok(());
        };
        if n.open == 0 || n.links.len() > 1 || n.attr.kind != FileKind::File {
            return Ok(());
        }
        let s = self.stage(node, &n.attr, false)?;
        let mut g = s.lock().await;
        let len = g.len;
        self.fill(node, &mut g, 0, len).await?;
        s.sync(&g);
        Ok(())
    }

    /// The node lost its last name through the mount: nothing staged for it is pushed.
    pub(super) fn removed(&self, node: NodeId) {
        let orphan = self.inodes.path_of(node).is_none();
        if !orphan {
            return;
        }
        self.inodes.mark_removed_locally(node);
        self.failures.clear(node);
        if let Some(s) = self.staged_of(node) {
            if let Some(mut g) = s.try_lock() {
                if let Some(j) = g.journal.take() {
                    j.remove();
                }
            }
        }
        if self.inodes.get(node).is_none_or(|n| n.open == 0) {
            self.drop_staged(node);
        }
    }

    /// A removal (unlink, rmdir) whose answer the transport lost (a session cut while it was
    /// on its way) is made once more: a name gone by then was removed by the first attempt
    /// (or by someone else: gone either way), which is success, not an error.
    async fn removed_once<F, Fut>(&self, remove: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        match self.note(remove().await) {
            Err(RemoteError::Transport(e)) => {
                tracing::debug!("a removal got no answer ({e}); asked again");
                match self.note(remove().await) {
                    Err(RemoteError::NotFound(_)) => Ok(()),
                    r => r,
                }
            }
            r => r,
        }
    }

    pub async fn unlink(&self, parent: NodeId, name: &[u8]) -> Result<()> {
        let path = self.path_of(parent)?.join(name)?;
        let node = self.inodes.child(parent, name);
        if let Some(n) = node {
            if self.unlink_new(parent, name, n).await {
                return Ok(());
            }
            // A queued push of it lands first: the sandbox sees write, then unlink.
            self.wait_pushes_under(&[Some(n)]).await?;
            self.keep_open_copy(n).await?;
        }
        self.bump();
        let answer = self.removed_once(|| self.remote().unlink(&path)).await;
        tracing::debug!(file = %path.display(), ok = answer.is_ok(), "unlink in the sandbox");
        let r = match answer {
            // A new file whose commit got no answer and did not land: gone all the same.
            Err(RemoteError::NotFound(_)) if node.is_some_and(|n| self.newfiles.contains(n)) => {
                Ok(())
            }
            r => r,
        };
        // A name of a file with others: their entries' link counts change too (and a failure
        // says the listing was wrong): listed again.
        let linked = node
            .and_then(|n| self.inodes.get(n))
            .is_none_or(|n| n.attr.nlink != 1);
        if r.is_ok() && !linked {
            self.entry_removed(parent, name);
        } else {
            self.dir_changed(parent);
        }
        if matches!(r, Err(RemoteError::NotFound(_))) {
            self.name_gone(parent, name);
        }
        r?;
        self.failures.conflict_copy_gone(&path);
        self.made_links.forget(&self.sandbox_id(), path.as_bytes());
        if let Some(n) = self.inodes.unlink(parent, name) {
            self.inodes.lost_name(n, now_ns());
            self.removed(n);
            if let Some(k) = self.kernel() {
                k.invalidate_attr(n);
            }
        }
        Ok(())
    }

    /// The sandbox answered that `name` is not in `parent` (moved or removed there, the
    /// feed not having said so yet): the mount forgets the name, so that the next lookup
    /// asks instead of answering from the node the feed still vouches for (`unlink` said
    /// ENOENT and the `open(O_CREAT|O_EXCL)` right after said EEXIST: `tar -x` failed).
    /// The node itself is not removed: the file lives on under another name.
    /// A file only the mount has (made here, or with writes not pushed) keeps its name.
    fn name_gone(&self, parent: NodeId, name: &[u8]) {
        let Some(n) = self.inodes.child(parent, name) else {
            return;
        };
        if self.newfiles.contains(n) || self.staged_of(n).is_some() {
            return;
        }
        if let Some(n) = self.inodes.unlink(parent, name) {
            self.meta.invalidate(n);
            if let Some(k) = self.kernel() {
                k.invalidate_attr(n);
            }
        }
    }

    pub async fn rmdir(&self, parent: NodeId, name: &[u8]) -> Result<()> {
        let path = self.path_of(parent)?.join(name)?;
        // A file made in it here and not pushed yet (its push may wait for a RELEASE the
        // kernel sends after `close` returned): the sandbox would call it empty.
        if let Some(dir) = self.inodes.child(parent, name) {
            if self.has_unpushed_child(dir) {
                return Err(RemoteError::NotEmpty(path.display()));
            }
        }
        self.pushq.wait_all().await;
        self.bump();
        let r = self.removed_once(|| self.remote().rmdir(&path)).await;
        if r.is_ok() {
            self.entry_removed(parent, name);
        } else {
            self.dir_changed(parent);
        }
        if matches!(r, Err(RemoteError::NotFound(_))) {
            self.name_gone(parent, name);
        }
        r?;
        if let Some(n) = self.inodes.unlink(parent, name) {
            self.meta.invalidate(n);
        }
        Ok(())
    }

    pub async fn rename(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        let from = self.path_of(parent)?.join(name)?;
        let to = self.path_of(new_parent)?.join(new_name)?;
        let replaced = match mode {
            RenameMode::Replace => self.inodes.child(new_parent, new_name),
            _ => None,
        };
        // Over a directory holding a file not pushed yet: not empty, as rmdir says.
        if replaced.is_some_and(|r| self.has_unpushed_child(r)) {
            return Err(RemoteError::NotEmpty(to.display()));
        }
        if let Some(n) = self.inodes.child(parent, name) {
            let (from, to) = ((parent, name), (new_parent, new_name));
            if self.rename_new(from, to, mode, n).await? {
                // Its push, withdrawn for the rename, was queued again to the new name: the
                // rename returns once the sandbox has the file there (or the push failed and
                // is kept), as a rename in the sandbox would; a sandbox-side change of the
                // name right after then finds the new file.
                self.pushq.wait_for(&[n]).await;
                return Ok(());
            }
        }
        self.wait_pushes_under(&[
            self.inodes.child(parent, name),
            self.inodes.child(new_parent, new_name),
        ])
        .await?;
        if let Some(r) = replaced.filter(|r| Some(*r) != self.inodes.child(parent, name)) {
            self.keep_open_copy(r).await?;
        }
        self.bump();
        let source = self.inodes.child(parent, name);
        let answer = self.note(self.remote().rename(&from, &to, mode).await);
        tracing::debug!(from = %from.display(), to = %to.display(), ok = answer.is_ok(), "rename in the sandbox");
        let r = match answer {
            // A new file whose commit got no answer and did not land: renamed here, and its
            // push goes to the new name (taking it from a linked file there first, as the
            // rename would have).
            Err(RemoteError::NotFound(_))
                if mode != RenameMode::Exchange
                    && source.is_some_and(|n| self.newfiles.contains(n)) =>
            {
                match replaced.filter(|r| Some(*r) != source && !self.newfiles.unsent(*r)) {
                    Some(r) => self
                        .take_linked_name(r, (new_parent, new_name))
                        .await
                        .map(|_| ()),
                    None => Ok(()),
                }
            }
            r => r,
        };
        // A replaced file with other names: their entries' link counts change too (and a
        // rename between two names of one file changes nothing): listed again.
        let replaced_linked = replaced.is_some_and(|r| {
            Some(r) == source || self.inodes.get(r).is_some_and(|n| n.attr.nlink != 1)
        });
        if r.is_err() || replaced_linked {
            self.dir_changed(parent);
            self.dir_changed(new_parent);
        }
        if matches!(r, Err(RemoteError::NotFound(_))) {
            // Which name was missing is not said: both are asked again.
            self.name_gone(parent, name);
            self.name_gone(new_parent, new_name);
        }
        r?;
        if mode != RenameMode::Exchange {
            // The old name leaves the listing first: the change feed may report this rename
            // meanwhile, and a name neither the node table (moved below) nor the listing
            // still held would be made again from the listing's stale entry.
            self.meta.remove(parent, name);
        }
        self.made_links.renamed(
            &self.sandbox_id(),
            from.as_bytes(),
            to.as_bytes(),
            mode == RenameMode::Exchange,
        );
        let moved: Vec<NodeId> = match mode {
            RenameMode::Exchange => {
                self.inodes.exchange(parent, name, new_parent, new_name);
                [
                    self.inodes.child(parent, name),
                    self.inodes.child(new_parent, new_name),
                ]
                .into_iter()
                .flatten()
                .collect()
            }
            // The change feed reported this very rename and its check found the file under
            // the new name before this call got here: both names lead to it now, which
            // `inodes.rename` would take for two links of one file and leave alone. Only
            // the old name goes (it stayed, a name the sandbox no longer has).
            _ if source.is_some()
                && replaced != source
                && self.inodes.child(new_parent, new_name) == source =>
            {
                self.inodes.unlink(parent, name);
                source.into_iter().collect()
            }
            _ => {
                if let Some(r) = self.inodes.rename(parent, name, new_parent, new_name) {
                    // The replaced file lost a name: its other names show one link fewer
                    // and a new ctime, as an unlink would leave them.
                    if Some(r) != self.inodes.child(new_parent, new_name) {
                        self.inodes.lost_name(r, now_ns());
                        if let Some(k) = self.kernel() {
                            k.invalidate_attr(r);
                        }
                    }
                    self.removed(r);
                }
                self.inodes
                    .child(new_parent, new_name)
                    .into_iter()
                    .collect()
            }
        };
        if !replaced_linked {
            self.entries_renamed((parent, name), (new_parent, new_name));
        }
        // Staged files record where they live now.
        for n in moved {
            if let (Some(s), Some(p)) = (self.staged_of(n), self.inodes.path_of(n)) {
                let mut g = s.lock().await;
                if let Some(j) = &mut g.journal {
                    let _ = j.moved(&p);
                }
            }
            self.inodes.touched(n, now_ns());
        }
        Ok(())
    }

    /// Wait for the queued pushes a namespace operation on these nodes could overtake: their
    /// own, or every one when a directory is involved (files beneath it may be queued).
    /// (A file created here and not pushed yet needs no push first: unlink and rename of it
    /// stay local, [`super::newfiles`], and a rename over it makes the name.)
    async fn wait_pushes_under(&self, nodes: &[Option<NodeId>]) -> Result<()> {
        let nodes: Vec<NodeId> = nodes.iter().flatten().copied().collect();
        let dir = nodes.iter().any(|n| {
            self.inodes
                .get(*n)
                .is_some_and(|x| x.attr.kind == FileKind::Dir)
        });
        if dir {
            self.pushq.wait_all().await;
        } else {
            self.pushq.wait_for(&nodes).await;
        }
        Ok(())
    }

    /// Land every push that would change `dir`: queued ones, and files made in it here whose
    /// push waits for a close still to come (a failure stays kept and reported as usual).
    async fn push_children(&self, dir: NodeId) {
        self.pushq.wait_all().await;
        for id in self.unpushed_children(dir) {
            let _ = self.push(id).await;
        }
    }

    /// The files created here in `dir` that the sandbox does not have yet.
    fn unpushed_children(&self, dir: NodeId) -> Vec<NodeId> {
        let mut kids = self.newfiles.all();
        kids.retain(|id| {
            self.inodes
                .get(*id)
                .is_some_and(|n| n.links.iter().any(|(p, _)| *p == dir))
        });
        kids
    }

    fn has_unpushed_child(&self, dir: NodeId) -> bool {
        !self.unpushed_children(dir).is_empty()
    }

    /// Entries for the files created in `dir` and not yet pushed (the sandbox's listing
    /// lacks them).
    /// The change time of the newest file made in `dir` and not pushed yet.
    fn newest_unpushed_in(&self, dir: NodeId) -> Option<i64> {
        self.newfiles
            .all()
            .into_iter()
            .filter_map(|id| self.inodes.get(id))
            .filter(|n| n.links.iter().any(|(p, _)| *p == dir))
            .map(|n| n.attr.ctime_ns)
            .max()
    }

    fn add_new_files(&self, dir: NodeId, out: &mut Vec<DirEntryOut>) {
        for id in self.newfiles.all() {
            let Some(n) = self.inodes.get(id) else {
                continue;
            };
            for (p, name) in &n.links {
                if *p == dir && !out.iter().any(|e| &e.name == name) {
                    out.push(DirEntryOut {
                        name: name.clone(),
                        ino: n.st_ino,
                        kind: n.attr.kind,
                    });
                }
            }
        }
    }

    /// The target as the laptop sees it: never a way out of the mount ([`super::links`]).
    pub async fn readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        self.path_of(node)?;
        let raw = self.raw_readlink(node).await?;
        Ok(self.shown_target_of(node, &raw))
    }

    /// What the mount shows for the link `node` whose sandbox target is `raw`: safe from every
    /// name it has (a hard link of a symlink made through the mount gives it two).
    /// A link made through the mount, every name of it made so with this very target, is
    /// shown as written ([`super::made_links`]).
    fn shown_target_of(&self, node: NodeId, raw: &[u8]) -> Vec<u8> {
        let root = self.sandbox.workspace_root();
        let paths = self.inodes.paths_of(node);
        let sandbox = self.sandbox_id();
        if !paths.is_empty()
            && paths
                .iter()
                .all(|p| self.made_links.is_made(&sandbox, p.as_bytes(), raw))
        {
            return raw.to_vec();
        }
        let links: Vec<&[u8]> = paths.iter().map(|p| p.as_bytes()).collect();
        super::links::present_target_from_all(root.as_deref(), &links, raw)
    }

    /// The sandbox's own target, unaltered (for `sbxfs ctl readlink`).
    pub async fn raw_readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        let n = self.node(node)?;
        if let Some(t) = n.attr.symlink_target.clone() {
            return Ok(t.0);
        }
        let path = self.path_of(node)?;
        self.note(self.remote().readlink(&path).await)
    }

    /// What the mount shows for a link at `link` whose sandbox target is `raw`: as
    /// [`Self::readlink`] does for the node there (safe from all its names), or from this
    /// path alone for a link the mount has no node for.
    pub fn shown_target(&self, link: &RemotePath, raw: &[u8]) -> Vec<u8> {
        if let Some(node) = self.inodes.resolve(link) {
            return self.shown_target_of(node, raw);
        }
        if self
            .made_links
            .is_made(&self.sandbox_id(), link.as_bytes(), raw)
        {
            return raw.to_vec();
        }
        let root = self.sandbox.workspace_root();
        super::links::present_target(root.as_deref(), link.as_bytes(), raw)
    }

    /// Free space as of at most [`STATFS_TTL`] ago: `find` and `df` ask on every run, and no
    /// feed reports free space.
    pub async fn statfs(&self) -> Result<StatFs> {
        self.sandbox.statfs(&self.cfg.clock, STATFS_TTL).await
    }

    pub async fn getxattr(&self, node: NodeId, name: &[u8]) -> Result<Vec<u8>> {
        let path = self.path_of(node)?;
        if self.known_without_xattrs(node) || self.offline_without_xattrs(node) {
            return Err(RemoteError::NoAttr(path.display()));
        }
        let known = || self.offline_without_xattrs(node);
        match self.ask(self.remote().getxattr(&path, name), known).await {
            Err(e) if unreachable(&e) && self.offline_without_xattrs(node) => {
                Err(RemoteError::NoAttr(path.display()))
            }
            Err(RemoteError::NotFound(_)) if self.only_here(node) => {
                Err(RemoteError::NoAttr(path.display()))
            }
            r => r,
        }
    }

    pub async fn listxattr(&self, node: NodeId) -> Result<Vec<Vec<u8>>> {
        let path = self.path_of(node)?;
        if self.known_without_xattrs(node) || self.offline_without_xattrs(node) {
            return Ok(Vec::new());
        }
        let known = || self.offline_without_xattrs(node);
        match self.ask(self.remote().listxattr(&path), known).await {
            Err(e) if unreachable(&e) && self.offline_without_xattrs(node) => Ok(Vec::new()),
            Err(RemoteError::NotFound(_)) if self.only_here(node) => Ok(Vec::new()),
            r => r,
        }
    }

    /// The file has unpushed content the sandbox may not have at all yet (a new file whose
    /// push waits or was refused): it exists here, with no extended attributes.
    fn only_here(&self, node: NodeId) -> bool {
        self.staged_of(node).is_some_and(|s| s.is_dirty())
    }

    pub async fn setxattr(
        &self,
        node: NodeId,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        let path = self.path_of(node)?;
        // An attribute set on the sandbox's file would be lost to the next push's rename.
        self.push(node).await?;
        self.bump();
        let r = self.note(self.remote().setxattr(&path, name, value, flags).await);
        // A failed call may still have landed (a lost answer): unknown, ask next time.
        self.xattrs_changed(node, r.is_ok().then_some(true));
        self.after_acl(node, &path, name).await;
        r
    }

    /// An access ACL set or removed is a mode change too (`cp -a` and `setfacl` set modes
    /// so): the node takes the sandbox's attributes again, as after a chmod, here and in the
    /// kernel.
    async fn after_acl(&self, node: NodeId, path: &RemotePath, name: &[u8]) {
        if name != b"system.posix_acl_access" {
            return;
        }
        if let Ok(a) = self.remote().stat(path).await {
            self.own_change(node, &a);
            self.handles.follow(node, &a);
        }
        if let Some((parent, _)) = self.node(node).ok().and_then(|n| n.links.first().cloned()) {
            self.meta.invalidate(parent);
            self.forget_prefetched(parent);
        }
        self.invalidate_kernel_attr(node);
    }

    pub async fn removexattr(&self, node: NodeId, name: &[u8]) -> Result<()> {
        let path = self.path_of(node)?;
        self.push(node).await?;
        self.bump();
        let r = self.note(self.remote().removexattr(&path, name).await);
        self.xattrs_changed(node, None);
        self.after_acl(node, &path, name).await;
        r
    }

    /// `fallocate` mode 0 / KEEP_SIZE: a staged file grows locally (zeros); otherwise the
    /// sandbox allocates in place.
    pub async fn fallocate(
        &self,
        node: NodeId,
        fh: Option<u64>,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<()> {
        let end = offset.saturating_add(len);
        // Growing a file through a handle is a change its close must push.
        if let Some(h) = fh.and_then(|fh| self.handles.file(fh).ok()) {
            h.wrote.store(true, Ordering::Relaxed);
        }
        if end > MAX_FILE_BYTES {
            return Err(RemoteError::FileTooBig(
                self.node(node)?.last_path.display(),
            ));
        }
        if let Some(s) = self.staged_of(node) {
            if !keep_size && end > s.lock().await.len {
                self.room_for(node, end).await?;
            }
            let mut g = s.lock().await;
            if !keep_size && end > g.len {
                g.truncate(end).map_err(|e| local_io(&e))?;
                s.sync(&g);
            }
            return Ok(());
        }
        let path = self.path_of(node)?;
        let a = self.note(self.remote().fallocate(&path, offset, len, keep_size).await)?;
        self.own_change(node, &a);
        self.handles.follow(node, &a);
        Ok(())
    }

    /// A staged file grown to `len` bytes by `fallocate` is allocated here only; its push
    /// writes that many bytes beside the sandbox's file. What `posix_fallocate` promises (the
    /// writes after it find room) is checked against the sandbox's free space now, not at
    /// the push: too little is ENOSPC at once. A sandbox that does not answer is not asked.
    async fn room_for(&self, node: NodeId, len: u64) -> Result<()> {
        let free = match self.sandbox.statfs(&self.cfg.clock, Duration::ZERO).await {
            Ok(fs) => fs.blocks_available.saturating_mul(fs.block_size),
            Err(_) => return Ok(()),
        };
        if free < len {
            return Err(RemoteError::NoSpace(format!(
                "{}: {len} bytes asked, {free} free in the sandbox",
                self.node(node)?.last_path.display()
            )));
        }
        Ok(())
    }

    /// `copy_file_range` inside the mount: done by the sandbox, no bytes cross.
    pub async fn copy_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (src, dst) = (self.handles.file(fh_in)?, self.handles.file(fh_out)?);
        if !dst.writable {
            return Err(RemoteError::Invalid("not open for writing".into()));
        }
        self.push(src.node).await?;
        self.push(dst.node).await?;
        let (src_path, dst_path) = (self.path_of(src.node)?, self.path_of(dst.node)?);
        let base = match self.staged_of(dst.node) {
            Some(s) => s.lock().await.base.clone(),
            None => Some(self.node(dst.node)?.attr.version),
        };
        self.bump();
        let (n, attr) = self.note(
            self.remote()
                .copy_range(&src_path, off_in, &dst_path, off_out, len, base)
                .await,
        )?;
        if let Some(s) = self.staged_of(dst.node) {
            let mut g = s.lock().await;
            g.rebase_remote(attr.version.clone(), attr.size)
                .map_err(|e| local_io(&e))?;
            s.sync(&g);
        }
        self.own_change(dst.node, &attr);
        self.handles.follow(dst.node, &attr);
        if let Some(k) = self.kernel() {
            k.invalidate_data(dst.node);
        }
        Ok(n)
    }

    /// Forget cached data and attributes of a path (the change feed, `sbxfs ctl invalidate`).
    /// Waits (a little, at most) until the kernel has been told of every invalidation asked so
    /// far: a command that changed the sandbox through the mount's socket (`sbxfs edit`) answers
    /// after it, so a `cat` right after never meets the kernel's entry for the replaced file.
    /// Never called from a FUSE request (the kernel may wait for that request to end).
    pub async fn kernel_settled(&self) {
        if let Some(k) = self.kernel() {
            let (done, settled) = tokio::sync::oneshot::channel();
            k.barrier(done);
            let _ = tokio::time::timeout(Duration::from_secs(2), settled).await;
        }
    }

    /// Drop the pages cached for `node` at `version`, here and in the kernel.
    pub(super) fn forget_pages_of(&self, node: NodeId, version: &crate::remote::Version) {
        self.pages.forget_version(version);
        self.inodes.kernel_pages_dropped(node);
    }

    pub fn invalidate_path(&self, path: &RemotePath) {
        self.bump();
        self.prefetched.forget_under(path);
        for id in self.inodes.nodes_at(path) {
            // Its bytes too, not only what the version names (`ctl invalidate` is the remedy
            // for a change the sandbox hid from the version and the feed).
            if let Some(n) = self.inodes.get(id) {
                self.forget_pages_of(id, &n.attr.version);
            }
            self.meta.invalidate(id);
            self.inodes.mark_stale(id);
            if let Some(k) = self.kernel() {
                k.invalidate_data(id);
            }
        }
        if let Some((parent, name)) = path.split_last() {
            if let Some(p) = self.inodes.resolve(&parent) {
                self.meta.invalidate(p);
                // The kernel's entry too: the name may lead to another file now (an edit in
                // the sandbox replaces it), which only a new lookup finds.
                if let Some(k) = self.kernel() {
                    k.invalidate_entry(p, name);
                }
            }
        }
    }

    /// Whether the change feed vouches for what is cached: the follower's state ([`super::feed`]).
    pub(super) fn feed(&self) -> &super::feed::FeedState {
        &self.feed
    }

    /// The change feed's state, for `ctl status`.
    pub fn feed_status(&self) -> serde_json::Value {
        self.feed.snapshot()
    }

    /// The last change-feed event applied while the feed vouches for the caches
    /// ([`super::feed::FeedState::caught_up_to`]).
    pub fn feed_caught_up_to(&self) -> Option<u64> {
        self.feed.caught_up_to()
    }

    pub fn now_ns(&self) -> i64 {
        now_ns()
    }

    /// Share of page reads served from the cache (`None` before any read).
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        let hits = self.stats.cache_hits.load(Ordering::Relaxed) as f64;
        let misses = self.stats.cache_misses.load(Ordering::Relaxed) as f64;
        (hits + misses > 0.0).then(|| hits / (hits + misses))
    }
}

/// An instant old enough that any TTL has passed.
pub(super) fn stale_instant() -> Instant {
    Instant::now()
        .checked_sub(Duration::from_secs(86_400 * 365))
        .unwrap_or_else(Instant::now)
}

/// A local (staging) I/O error: an error of this machine, not of the sandbox.
pub(super) fn local_io(e: &std::io::Error) -> RemoteError {
    RemoteError::from_io(e, "staging directory")
}

/// A name programs take as a lock by making it exclusively (`O_EXCL`): git's lock files.
fn is_lock_name(name: &[u8]) -> bool {
    name.len() > b".lock".len() && name.ends_with(b".lock")
}

/// A push's failure as `fsync` or `close` report it: a file the sandbox moved or removed
/// under an open handle (ENOENT, ESTALE) is an I/O error of that handle's data, never "no
/// such file", which `fsync` cannot mean to a program.
fn write_report(e: RemoteError) -> RemoteError {
    match e {
        RemoteError::NotFound(p) | RemoteError::Stale(p) => {
            RemoteError::Io(p, "the file was moved or removed in the sandbox".into())
        }
        e => e,
    }
}
