//! The filesystem core behind the FUSE adapter: inodes, caches, write staging, pushes. Every
//! operation is async, returns `RemoteError` (mapped to errno by the adapter, in one place), and
//! is testable without FUSE.
//!
//! Inodes: a node's id is the sandbox's own inode number (so `stat` shows it and tools that
//! recorded stat data inside the sandbox see no change); the root is 1. Paths follow renames.
//! Lookup counts are kept and `forget` drops a node when the kernel no longer holds it.
//!
//! Caches: attributes and directory listings live for a TTL (`attr_ttl`); a name missing from
//! a fresh listing is answered `ENOENT` without asking (a brief negative cache). File data sits
//! in fixed pages keyed by (version, page), in an LRU bounded by bytes, so a changed file never
//! serves stale pages. Close-to-open: `open` asks the remote for the current version, like NFS.
//!
//! Writes: see [`super::staging`]. A push happens on flush, fsync and release; a failed push
//! reports EIO, keeps the staged data and is retried in the background; a conflict saves the
//! user's version beside the file as `NAME.sbxfs-conflict-<timestamp>`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use lru::LruCache;

use super::staging::{Staged, PAGE};
use crate::remote::{
    Attr, CommitContent, CommitOptions, FileKind, Remote, RemoteError, RemotePath, Result, SetAttr,
    StatFs, Version,
};

pub type NodeId = u64;
pub const ROOT: NodeId = 1;
/// Node ids handed out when a sandbox inode number cannot be used as the id (it is 1, or the
/// kernel still holds that id for another file): from here up, never a real inode number.
const SYNTHETIC_BASE: NodeId = 1 << 62;

#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// How long attributes and listings are trusted.
    pub attr_ttl: Duration,
    /// Bytes of file data kept in the page cache.
    pub cache_bytes: u64,
    /// Where staged writes live.
    pub staging_dir: PathBuf,
    /// Owner every file appears to have (the mounting user).
    pub uid: u32,
    pub gid: u32,
}

/// What the kernel should forget (the adapter sends these through the FUSE notifier).
pub trait KernelCache: Send + Sync {
    fn invalidate_data(&self, node: NodeId);
}

#[derive(Clone, Debug)]
struct Node {
    path: RemotePath,
    /// The sandbox inode this node stands for now (0: gone). A save through the mount gives the
    /// file a new sandbox inode while the kernel keeps its node; the number it left may be reused
    /// by the sandbox for another file, which then gets another node id.
    remote_ino: u64,
    attr: Attr,
    fetched: Instant,
    lookups: u64,
    /// The version whose data the kernel may hold in its page cache.
    kernel_version: Option<Version>,
}

struct Listing {
    entries: BTreeMap<Vec<u8>, Attr>,
    fetched: Instant,
}

struct Handle {
    node: NodeId,
    version: Version,
    writable: bool,
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
    pub remote_calls: AtomicU64,
}

struct PageCache {
    lru: LruCache<(Version, u64), Bytes>,
    bytes: u64,
    cap: u64,
}

impl PageCache {
    fn get(&mut self, key: &(Version, u64)) -> Option<Bytes> {
        self.lru.get(key).cloned()
    }

    fn put(&mut self, key: (Version, u64), data: Bytes) {
        self.bytes += data.len() as u64;
        if let Some(old) = self.lru.put(key, data) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > self.cap {
            match self.lru.pop_lru() {
                Some((_, d)) => self.bytes -= d.len() as u64,
                None => break,
            }
        }
    }
}

/// One page fetch that several readers may wait on.
type PageFetch = tokio::sync::OnceCell<std::result::Result<Bytes, RemoteError>>;

pub struct FsCore {
    remote: Arc<dyn Remote>,
    cfg: CoreConfig,
    nodes: Mutex<HashMap<NodeId, Node>>,
    /// Sandbox inode number -> node id, for the nodes that currently stand for one.
    by_ino: Mutex<HashMap<u64, NodeId>>,
    next_synthetic: AtomicU64,
    /// Bumped by every change made through the mount. An answer fetched while it moved may
    /// predate that change, so it is fetched again rather than cached (a stat racing a push
    /// would otherwise cache the old size for a whole TTL).
    epoch: AtomicU64,
    listings: Mutex<HashMap<RemotePath, Listing>>,
    pages: Mutex<PageCache>,
    /// Page fetches under way: concurrent reads of one page (the kernel's read-ahead and a
    /// read racing it) share one remote call instead of each making theirs.
    inflight: Mutex<HashMap<(Version, u64), Arc<PageFetch>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    staged: Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<Staged>>>>,
    /// Nodes whose last push failed: retried in the background.
    pending: Mutex<HashSet<NodeId>>,
    kernel: Mutex<Option<Arc<dyn KernelCache>>>,
    pub stats: CoreStats,
}

/// A file's attributes as the adapter reports them.
#[derive(Clone, Debug)]
pub struct NodeAttr {
    pub node: NodeId,
    pub attr: Attr,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl FsCore {
    pub fn new(remote: Arc<dyn Remote>, cfg: CoreConfig, root: Attr) -> Arc<Self> {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                path: RemotePath::root(),
                remote_ino: root.ino,
                attr: root,
                fetched: Instant::now(),
                lookups: 1,
                kernel_version: None,
            },
        );
        let cap = cfg.cache_bytes.max(PAGE);
        Arc::new(FsCore {
            remote,
            cfg,
            nodes: Mutex::new(nodes),
            by_ino: Mutex::new(HashMap::new()),
            next_synthetic: AtomicU64::new(SYNTHETIC_BASE),
            epoch: AtomicU64::new(0),
            listings: Mutex::new(HashMap::new()),
            pages: Mutex::new(PageCache {
                lru: LruCache::unbounded(),
                bytes: 0,
                cap,
            }),
            inflight: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            staged: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashSet::new()),
            kernel: Mutex::new(None),
            stats: CoreStats::default(),
        })
    }

    pub fn set_kernel_cache(&self, k: Arc<dyn KernelCache>) {
        *self.kernel.lock().expect("kernel lock") = Some(k);
    }

    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    pub fn remote(&self) -> &Arc<dyn Remote> {
        &self.remote
    }

    fn kernel(&self) -> Option<Arc<dyn KernelCache>> {
        self.kernel.lock().expect("kernel lock").clone()
    }

    fn call(&self) {
        self.stats.remote_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The version last seen for a node (for the INFO ioctl).
    pub fn cached_version(&self, node: NodeId) -> Option<String> {
        self.nodes
            .lock()
            .expect("nodes lock")
            .get(&node)
            .map(|n| n.attr.version.0.clone())
    }

    pub fn path_of(&self, node: NodeId) -> Result<RemotePath> {
        self.nodes
            .lock()
            .expect("nodes lock")
            .get(&node)
            .map(|n| n.path.clone())
            .ok_or_else(|| RemoteError::NotFound(format!("inode {node}")))
    }

    /// The node id for a sandbox file: the node already standing for its inode, else the inode
    /// number itself (so `stat` shows it), else a synthetic id when that number is taken.
    fn id_for(
        &self,
        nodes: &HashMap<NodeId, Node>,
        by_ino: &mut HashMap<u64, NodeId>,
        path: &RemotePath,
        ino: u64,
        assign: bool,
    ) -> NodeId {
        if path.is_root() {
            return ROOT;
        }
        // The node standing for this inode is reused only for the same path: a sandbox inode
        // number freed by a save can be handed to a new file before the save's answer reaches
        // us, and two files must never share a node (their writes would share a staging file).
        if let Some(&id) = by_ino.get(&ino) {
            if nodes
                .get(&id)
                .is_some_and(|n| n.remote_ino == ino && &n.path == path)
            {
                return id;
            }
        }
        let id = if ino > ROOT && ino < SYNTHETIC_BASE && !nodes.contains_key(&ino) {
            ino
        } else if assign {
            self.next_synthetic.fetch_add(1, Ordering::Relaxed)
        } else {
            ino
        };
        if assign {
            by_ino.insert(ino, id);
        }
        id
    }

    /// Remember `path` with `attr` as known to the kernel (one more lookup if `lookup`).
    fn remember(&self, path: &RemotePath, attr: Attr, lookup: bool) -> NodeId {
        let mut nodes = self.nodes.lock().expect("nodes lock");
        let mut by_ino = self.by_ino.lock().expect("by_ino lock");
        let id = self.id_for(&nodes, &mut by_ino, path, attr.ino, true);
        let n = nodes.entry(id).or_insert_with(|| Node {
            path: path.clone(),
            remote_ino: attr.ino,
            attr: attr.clone(),
            fetched: Instant::now(),
            lookups: 0,
            kernel_version: None,
        });
        n.path = path.clone();
        n.remote_ino = attr.ino;
        n.attr = attr;
        n.fetched = Instant::now();
        if lookup {
            n.lookups += 1;
        }
        id
    }

    /// A node now stands for another sandbox inode (its file was replaced by a commit, or in
    /// the sandbox) — or for none (`ino` 0: removed).
    fn rebind(&self, node: NodeId, ino: u64) {
        let mut nodes = self.nodes.lock().expect("nodes lock");
        let mut by_ino = self.by_ino.lock().expect("by_ino lock");
        if let Some(n) = nodes.get_mut(&node) {
            if by_ino.get(&n.remote_ino) == Some(&node) {
                by_ino.remove(&n.remote_ino);
            }
            n.remote_ino = ino;
            if ino != 0 {
                by_ino.insert(ino, node);
            }
        }
    }

    fn invalidate_listing(&self, dir: &RemotePath) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.listings.lock().expect("listings lock").remove(dir);
    }

    /// A remote stat that no local change raced: retried while the epoch moves under it.
    async fn stable_stat(&self, path: &RemotePath) -> Result<Attr> {
        for _ in 0..4 {
            let before = self.epoch.load(Ordering::SeqCst);
            self.call();
            let a = self.remote.stat(path).await?;
            if self.epoch.load(Ordering::SeqCst) == before {
                return Ok(a);
            }
        }
        self.call();
        self.remote.stat(path).await
    }

    fn parent_of(path: &RemotePath) -> RemotePath {
        path.split_last().map(|(p, _)| p).unwrap_or_default()
    }

    fn staged_of(&self, node: NodeId) -> Option<Arc<tokio::sync::Mutex<Staged>>> {
        self.staged.lock().expect("staged lock").get(&node).cloned()
    }

    /// The attributes to report for a node: the staged length while writes are pending.
    fn with_staged(&self, node: NodeId, mut attr: Attr) -> Attr {
        let staged = self.staged_of(node);
        if let Some(s) = staged {
            if let Ok(s) = s.try_lock() {
                if s.is_dirty() {
                    attr.size = s.len;
                }
            }
        }
        attr
    }

    pub async fn lookup(&self, parent: NodeId, name: &[u8]) -> Result<NodeAttr> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        let cached = {
            let listings = self.listings.lock().expect("listings lock");
            listings.get(&dir).and_then(|l| {
                (l.fetched.elapsed() < self.cfg.attr_ttl).then(|| l.entries.get(name).cloned())
            })
        };
        let attr = match cached {
            Some(Some(attr)) => attr,
            Some(None) => return Err(RemoteError::NotFound(path.display())),
            None => self.stable_stat(&path).await?,
        };
        let node = self.remember(&path, attr.clone(), true);
        let attr = self.with_staged(node, attr);
        tracing::debug!(path = %path.display(), node, size = attr.size, "lookup");
        Ok(NodeAttr { node, attr })
    }

    pub fn forget(&self, node: NodeId, n: u64) {
        if node == ROOT {
            return;
        }
        let mut nodes = self.nodes.lock().expect("nodes lock");
        if let Some(entry) = nodes.get_mut(&node) {
            entry.lookups = entry.lookups.saturating_sub(n);
            let busy = self.staged.lock().expect("staged lock").contains_key(&node);
            if entry.lookups == 0 && !busy {
                let ino = entry.remote_ino;
                nodes.remove(&node);
                let mut by_ino = self.by_ino.lock().expect("by_ino lock");
                if by_ino.get(&ino) == Some(&node) {
                    by_ino.remove(&ino);
                }
            }
        }
    }

    pub async fn getattr(&self, node: NodeId) -> Result<NodeAttr> {
        let (path, fresh) = {
            let nodes = self.nodes.lock().expect("nodes lock");
            let n = nodes
                .get(&node)
                .ok_or_else(|| RemoteError::NotFound(format!("inode {node}")))?;
            let fresh = (n.fetched.elapsed() < self.cfg.attr_ttl).then(|| n.attr.clone());
            (n.path.clone(), fresh)
        };
        let attr = match fresh {
            Some(a) => a,
            None => {
                let a = self.stable_stat(&path).await?;
                self.rebind(node, a.ino);
                if let Some(n) = self.nodes.lock().expect("nodes lock").get_mut(&node) {
                    n.attr = a.clone();
                    n.fetched = Instant::now();
                }
                a
            }
        };
        let attr = self.with_staged(node, attr);
        tracing::debug!(node, size = attr.size, "getattr");
        Ok(NodeAttr { node, attr })
    }

    /// A fresh stat, bypassing the attribute cache.
    async fn refresh(&self, node: NodeId) -> Result<Attr> {
        let path = self.path_of(node)?;
        let a = self.stable_stat(&path).await?;
        self.rebind(node, a.ino);
        if let Some(n) = self.nodes.lock().expect("nodes lock").get_mut(&node) {
            n.attr = a.clone();
            n.fetched = Instant::now();
        }
        Ok(a)
    }

    pub async fn setattr(
        &self,
        node: NodeId,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
        atime_ns: Option<i64>,
        mtime_ns: Option<i64>,
    ) -> Result<NodeAttr> {
        // Files belong to the mounting user: a chown that keeps them so succeeds (editors check
        // it before choosing their save path), any other is refused.
        if owner.0.is_some_and(|u| u != self.cfg.uid) || owner.1.is_some_and(|g| g != self.cfg.gid)
        {
            return Err(RemoteError::Perm(
                "files in an sbxfs mount belong to the mounting user".into(),
            ));
        }
        let path = self.path_of(node)?;
        let mut remote_set = SetAttr {
            mode,
            size: None,
            atime_ns,
            mtime_ns,
            ..SetAttr::default()
        };
        let staged = self.staged_of(node);
        let mut local_override = None;
        if let Some(s) = staged {
            let mut s = s.lock().await;
            if let Some(size) = size {
                s.truncate(size)
                    .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
            }
            if s.is_dirty() {
                // Applied after the push, or the commit's rename would undo them.
                let p = &mut s.pending_attr;
                p.mode = mode.or(p.mode);
                p.atime_ns = atime_ns.or(p.atime_ns);
                p.mtime_ns = mtime_ns.or(p.mtime_ns);
                local_override = Some(s.pending_attr.clone());
                remote_set = SetAttr::default();
            }
        } else if let Some(size) = size {
            remote_set.size = Some(size);
        }
        let mut attr = if remote_set == SetAttr::default() {
            self.getattr(node).await?.attr
        } else {
            self.call();
            let a = self.remote.setattr(&path, remote_set).await?;
            // Our own metadata change gives the file a new version; a staged file (opened for
            // writing, nothing written) follows it rather than calling it a conflict later.
            let staged = self.staged_of(node);
            if let Some(s) = staged {
                let mut s = s.lock().await;
                if !s.is_dirty() {
                    s.base = Some(a.version.clone());
                    s.base_size = a.size;
                }
            }
            if let Some(n) = self.nodes.lock().expect("nodes lock").get_mut(&node) {
                n.attr = a.clone();
                n.fetched = Instant::now();
            }
            a
        };
        if let Some(p) = local_override {
            attr.mode = p.mode.unwrap_or(attr.mode);
            attr.atime_ns = p.atime_ns.unwrap_or(attr.atime_ns);
            attr.mtime_ns = p.mtime_ns.unwrap_or(attr.mtime_ns);
        }
        self.invalidate_listing(&Self::parent_of(&path));
        Ok(NodeAttr {
            node,
            attr: self.with_staged(node, attr),
        })
    }

    /// A directory's entries, fetched in one round trip (with every entry's attributes, which
    /// then answer lookups for the TTL). Always fetched: a listing is what `ls` trusts.
    pub async fn readdir(&self, node: NodeId) -> Result<Vec<(Vec<u8>, NodeId, FileKind)>> {
        let path = self.path_of(node)?;
        let before = self.epoch.load(Ordering::SeqCst);
        self.call();
        let fetched = self.remote.list(&path).await?;
        let entries: Vec<(Vec<u8>, Attr)> =
            fetched.into_iter().map(|e| (e.name.0, e.attr)).collect();
        if self.epoch.load(Ordering::SeqCst) == before {
            self.listings.lock().expect("listings lock").insert(
                path.clone(),
                Listing {
                    entries: entries.iter().cloned().collect(),
                    fetched: Instant::now(),
                },
            );
        }
        let mut out = Vec::with_capacity(entries.len());
        for (name, attr) in entries {
            let child = path.join(&name)?;
            let id = {
                let nodes = self.nodes.lock().expect("nodes lock");
                let mut by_ino = self.by_ino.lock().expect("by_ino lock");
                self.id_for(&nodes, &mut by_ino, &child, attr.ino, false)
            };
            out.push((name, id, attr.kind));
        }
        Ok(out)
    }

    /// Open: revalidate (close-to-open), stage for writing if asked. Returns the handle and
    /// whether the kernel may keep its cached pages (same version as its last open).
    pub async fn open(&self, node: NodeId, writable: bool, truncate: bool) -> Result<(u64, bool)> {
        let attr = match self.refresh(node).await {
            Ok(a) => a,
            // The sandbox is unreachable: an open still works from what we knew — cached pages
            // can be read, and an edit can be staged now and pushed (against that version)
            // when the sandbox is back.
            Err(RemoteError::Transport(_) | RemoteError::TimedOut(_)) => self
                .nodes
                .lock()
                .expect("nodes lock")
                .get(&node)
                .map(|n| n.attr.clone())
                .ok_or_else(|| RemoteError::Transport("the sandbox is unreachable".into()))?,
            Err(e) => return Err(e),
        };
        if attr.kind == FileKind::Dir && writable {
            return Err(RemoteError::IsDir(self.path_of(node)?.display()));
        }
        let keep = {
            let mut nodes = self.nodes.lock().expect("nodes lock");
            let n = nodes.get_mut(&node).expect("refreshed node");
            let keep = n.kernel_version.as_ref() == Some(&attr.version);
            n.kernel_version = Some(attr.version.clone());
            keep
        };
        if writable {
            let staged = self.stage(node, &attr)?;
            let mut s = staged.lock().await;
            s.handles += 1;
            if truncate {
                let p = self.path_of(node)?;
                s.truncate(0)
                    .map_err(|e| RemoteError::from_io(&e, &p.display()))?;
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().expect("handles lock").insert(
            fh,
            Handle {
                node,
                version: attr.version,
                writable,
            },
        );
        Ok((fh, keep && !truncate))
    }

    /// The staged state of a node, created over its current version if there is none.
    fn stage(&self, node: NodeId, attr: &Attr) -> Result<Arc<tokio::sync::Mutex<Staged>>> {
        let mut staged = self.staged.lock().expect("staged lock");
        if let Some(s) = staged.get(&node) {
            return Ok(s.clone());
        }
        let file = tempfile::tempfile_in(&self.cfg.staging_dir)
            .map_err(|e| RemoteError::from_io(&e, "staging directory"))?;
        let s = Arc::new(tokio::sync::Mutex::new(Staged::new(
            file,
            Some(attr.version.clone()),
            attr.size,
        )));
        staged.insert(node, s.clone());
        Ok(s)
    }

    fn handle(&self, fh: u64) -> Result<(NodeId, Version, bool)> {
        self.handles
            .lock()
            .expect("handles lock")
            .get(&fh)
            .map(|h| (h.node, h.version.clone(), h.writable))
            .ok_or_else(|| RemoteError::Invalid(format!("bad file handle {fh}")))
    }

    /// One page of remote data at `version` (from the cache, or fetched once however many
    /// readers want it at the same time).
    async fn page(&self, path: &RemotePath, version: &Version, page: u64) -> Result<Bytes> {
        let key = (version.clone(), page);
        if let Some(d) = self.pages.lock().expect("pages lock").get(&key) {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(d);
        }
        let cell = self
            .inflight
            .lock()
            .expect("inflight lock")
            .entry(key.clone())
            .or_default()
            .clone();
        let result = cell
            .get_or_init(|| async {
                self.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
                self.call();
                let r = self.remote.read(path, page * PAGE, PAGE as u32).await?;
                self.stats
                    .bytes_read
                    .fetch_add(r.data.len() as u64, Ordering::Relaxed);
                // Filed under the version the bytes came from (newer than the handle's if the
                // file changed since its open), never under one they are not.
                self.pages
                    .lock()
                    .expect("pages lock")
                    .put((r.version.clone(), page), r.data.clone());
                Ok(r.data)
            })
            .await
            .clone();
        self.inflight.lock().expect("inflight lock").remove(&key);
        result
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (node, version, _) = self.handle(fh)?;
        let path = self.path_of(node)?;
        let staged = self.staged_of(node);
        if let Some(s) = staged {
            return self.read_staged(&path, &s, offset, size as u64).await;
        }
        let end = offset + size as u64;
        let mut out = Vec::with_capacity(size as usize);
        let mut page = offset / PAGE;
        while page * PAGE < end {
            let data = self.page(&path, &version, page).await?;
            let start = page * PAGE;
            let from = offset.saturating_sub(start) as usize;
            if from >= data.len() {
                break;
            }
            let to = ((end - start) as usize).min(data.len());
            out.extend_from_slice(&data[from..to]);
            if data.len() < PAGE as usize {
                break; // end of file
            }
            page += 1;
        }
        Ok(out)
    }

    async fn read_staged(
        &self,
        path: &RemotePath,
        s: &Arc<tokio::sync::Mutex<Staged>>,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>> {
        let mut s = s.lock().await;
        let end = (offset + size).min(s.len);
        let first = offset / PAGE;
        let last = if end == 0 { 0 } else { (end - 1) / PAGE };
        for page in first..=last {
            if !s.page_present(page) {
                let base = s
                    .base
                    .clone()
                    .expect("a file with missing pages has a base");
                let data = self.page(path, &base, page).await?;
                s.fill_page(page, &data)
                    .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
            }
        }
        s.read_local(offset, size)
            .map_err(|e| RemoteError::from_io(&e, &path.display()))
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let (node, _, writable) = self.handle(fh)?;
        if !writable {
            return Err(RemoteError::Invalid("file not open for writing".into()));
        }
        let path = self.path_of(node)?;
        let s = self
            .staged_of(node)
            .ok_or_else(|| RemoteError::Invalid("no staged state for an open file".into()))?;
        let mut s = s.lock().await;
        for page in s.pages_to_fill(offset, data.len() as u64) {
            let base = s.base.clone().expect("pages to fill come from a base");
            let bytes = self.page(&path, &base, page).await?;
            s.fill_page(page, &bytes)
                .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        }
        s.write(offset, data)
            .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        Ok(data.len() as u32)
    }

    /// Push a node's staged writes (flush, fsync, release, retries).
    pub async fn push(&self, node: NodeId) -> Result<()> {
        let Some(staged) = self.staged_of(node) else {
            return Ok(());
        };
        let mut s = staged.lock().await;
        if !s.is_dirty() {
            return Ok(());
        }
        let path = self.path_of(node)?;
        let mode = self
            .nodes
            .lock()
            .expect("nodes lock")
            .get(&node)
            .map(|n| n.attr.mode);
        let (content, bytes) = s
            .content()
            .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        self.call();
        let result = self
            .remote
            .commit(
                &path,
                content,
                CommitOptions {
                    base: s.base.clone(),
                    create_mode: mode,
                },
            )
            .await;
        match result {
            Ok(mut attr) => {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_pushed.fetch_add(bytes, Ordering::Relaxed);
                let pending = std::mem::take(&mut s.pending_attr);
                if pending != SetAttr::default() {
                    self.call();
                    match self.remote.setattr(&path, pending).await {
                        Ok(a) => attr = a,
                        Err(e) => {
                            tracing::warn!(file = %path.display(), "mode/times not applied after push: {e}")
                        }
                    }
                }
                s.pushed(attr.version.clone(), attr.size);
                self.pending.lock().expect("pending lock").remove(&node);
                // The atomic rename gave the file a new sandbox inode: this node now stands for it.
                self.rebind(node, attr.ino);
                if let Some(n) = self.nodes.lock().expect("nodes lock").get_mut(&node) {
                    n.attr = attr.clone();
                    n.fetched = Instant::now();
                    // What the kernel cached was written piecemeal: never trust it as a version.
                    n.kernel_version = None;
                }
                self.invalidate_listing(&Self::parent_of(&path));
                Ok(())
            }
            Err(RemoteError::Conflict { current, .. }) => {
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                let copy = self.save_conflict_copy(&path, &mut s).await;
                // The user's bytes are safe in the copy (or still staged if that failed too).
                match copy {
                    Ok(copy) => {
                        tracing::error!(
                            file = %path.display(),
                            saved_as = %copy.display(),
                            "conflict: the file changed in the sandbox since it was opened; your version was saved beside it"
                        );
                        // Follow the sandbox's version from now on.
                        let current_attr = self.refresh(node).await.ok();
                        let file = tempfile::tempfile_in(&self.cfg.staging_dir)
                            .map_err(|e| RemoteError::from_io(&e, "staging directory"))?;
                        let handles = s.handles;
                        *s = Staged::new(
                            file,
                            current_attr.as_ref().map(|a| a.version.clone()),
                            current_attr.map_or(0, |a| a.size),
                        );
                        s.handles = handles;
                        if let Some(k) = self.kernel() {
                            k.invalidate_data(node);
                        }
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), "conflict, and the conflict copy failed ({e}); your data stays staged");
                        s.failed = true;
                        self.pending.lock().expect("pending lock").insert(node);
                    }
                }
                Err(RemoteError::Io(
                    path.display(),
                    format!("conflict: changed in the sandbox (now {current}); your version was saved as a conflict copy"),
                ))
            }
            Err(e) => {
                self.stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                s.failed = true;
                self.pending.lock().expect("pending lock").insert(node);
                tracing::warn!(file = %path.display(), "push failed, kept locally and retried: {e}");
                Err(e)
            }
        }
    }

    fn node_of_path(&self, path: &RemotePath) -> Result<NodeId> {
        if path.is_root() {
            return Ok(ROOT);
        }
        self.nodes
            .lock()
            .expect("nodes lock")
            .iter()
            .find(|(_, n)| &n.path == path && n.remote_ino != 0)
            .map(|(id, _)| *id)
            .ok_or_else(|| RemoteError::NotFound(path.display()))
    }

    /// Write the staged content beside `path` as `NAME.sbxfs-conflict-<timestamp>`.
    async fn save_conflict_copy(&self, path: &RemotePath, s: &mut Staged) -> Result<RemotePath> {
        // Pages the user never touched come from the sandbox's current version: the user's own
        // bytes are what must not be lost.
        for page in s.missing_pages() {
            let r = self.remote.read(path, page * PAGE, PAGE as u32).await?;
            s.fill_page(page, &r.data)
                .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        }
        let stamp = chrono_like_stamp();
        let (parent, name) = path.split_last().expect("a file has a name");
        let mut copy_name = name.to_vec();
        copy_name.extend_from_slice(format!(".sbxfs-conflict-{stamp}").as_bytes());
        let copy = parent.join(&copy_name)?;
        let reader = s
            .reader()
            .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
        self.remote
            .commit(
                &copy,
                CommitContent::Whole(Box::new(reader)),
                CommitOptions {
                    base: None,
                    create_mode: Some(0o644),
                },
            )
            .await?;
        self.invalidate_listing(&parent);
        Ok(copy)
    }

    pub async fn flush(&self, fh: u64) -> Result<()> {
        let (node, _, writable) = self.handle(fh)?;
        if writable {
            self.push(node).await?;
        }
        Ok(())
    }

    pub async fn release(&self, fh: u64) -> Result<()> {
        let Some(h) = self.handles.lock().expect("handles lock").remove(&fh) else {
            return Ok(());
        };
        if !h.writable {
            return Ok(());
        }
        let result = self.push(h.node).await;
        let staged = self
            .staged
            .lock()
            .expect("staged lock")
            .get(&h.node)
            .cloned();
        if let Some(s) = staged {
            let mut g = s.lock().await;
            g.handles = g.handles.saturating_sub(1);
            if g.handles == 0 && !g.is_dirty() {
                drop(g);
                self.staged.lock().expect("staged lock").remove(&h.node);
            }
        }
        result
    }

    /// Retry failed pushes; returns how many nodes still have unpushed data.
    pub async fn retry_pending(&self) -> usize {
        let nodes: Vec<NodeId> = self
            .pending
            .lock()
            .expect("pending lock")
            .iter()
            .copied()
            .collect();
        for node in nodes {
            if self.push(node).await.is_ok() {
                let staged = self.staged_of(node);
                if let Some(s) = staged {
                    let g = s.lock().await;
                    if g.handles == 0 && !g.is_dirty() {
                        drop(g);
                        self.staged.lock().expect("staged lock").remove(&node);
                    }
                }
            }
        }
        self.pending.lock().expect("pending lock").len()
    }

    /// Push every node with staged changes (at unmount, or `sbxfs ctl flush`).
    pub async fn flush_all(&self) -> Vec<(String, RemoteError)> {
        let nodes: Vec<NodeId> = self
            .staged
            .lock()
            .expect("staged lock")
            .keys()
            .copied()
            .collect();
        let mut failures = Vec::new();
        for node in nodes {
            if let Err(e) = self.push(node).await {
                failures.push((
                    self.path_of(node).map(|p| p.display()).unwrap_or_default(),
                    e,
                ));
            }
        }
        failures
    }

    /// Copy every staged file that still has unpushed changes into `dir` (named after its
    /// path), so nothing the user wrote is lost when the daemon exits without reaching the
    /// sandbox. Returns the files written.
    pub async fn save_unpushed(&self, dir: &std::path::Path) -> Vec<PathBuf> {
        let staged: Vec<(NodeId, Arc<tokio::sync::Mutex<Staged>>)> = self
            .staged
            .lock()
            .expect("staged lock")
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut saved = Vec::new();
        for (node, s) in staged {
            let mut s = s.lock().await;
            if !s.is_dirty() {
                continue;
            }
            let path = self
                .path_of(node)
                .map(|p| p.display())
                .unwrap_or_else(|_| format!("inode-{node}"));
            let path_rp = self.path_of(node).ok();
            if let Some(p) = &path_rp {
                for page in s.missing_pages() {
                    if let Ok(r) = self.remote.read(p, page * PAGE, PAGE as u32).await {
                        let _ = s.fill_page(page, &r.data);
                    }
                }
            }
            let name = path.replace('/', "%2F");
            let out = dir.join(format!("unpushed-{name}"));
            let len = s.len;
            let copied = s
                .read_local(0, len)
                .and_then(|data| std::fs::write(&out, data));
            if copied.is_ok() {
                saved.push(out);
            }
        }
        saved
    }

    /// Share of page reads served from the cache (`None` before any read).
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        let hits = self.stats.cache_hits.load(Ordering::Relaxed) as f64;
        let misses = self.stats.cache_misses.load(Ordering::Relaxed) as f64;
        (hits + misses > 0.0).then(|| hits / (hits + misses))
    }

    pub fn pending_count(&self) -> usize {
        self.pending.lock().expect("pending lock").len()
    }

    pub async fn create(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        exclusive: bool,
    ) -> Result<(NodeAttr, u64)> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        self.call();
        let attr = match self.remote.create(&path, mode & 0o7777).await {
            Ok(a) => a,
            Err(RemoteError::Exists(_)) if !exclusive => self.remote.stat(&path).await?,
            Err(e) => return Err(e),
        };
        self.invalidate_listing(&dir);
        let node = self.remember(&path, attr.clone(), true);
        let (fh, _) = self.open(node, true, false).await?;
        Ok((NodeAttr { node, attr }, fh))
    }

    pub async fn mkdir(&self, parent: NodeId, name: &[u8], mode: u32) -> Result<NodeAttr> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        self.call();
        let attr = self.remote.mkdir(&path, mode & 0o7777).await?;
        self.invalidate_listing(&dir);
        let node = self.remember(&path, attr.clone(), true);
        Ok(NodeAttr { node, attr })
    }

    pub async fn unlink(&self, parent: NodeId, name: &[u8]) -> Result<()> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        self.call();
        let r = self.remote.unlink(&path).await;
        self.invalidate_listing(&dir);
        if r.is_ok() {
            if let Ok(n) = self.node_of_path(&path) {
                self.rebind(n, 0);
            }
        }
        r
    }

    pub async fn rmdir(&self, parent: NodeId, name: &[u8]) -> Result<()> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        self.call();
        let r = self.remote.rmdir(&path).await;
        self.invalidate_listing(&dir);
        self.invalidate_listing(&path);
        if r.is_ok() {
            if let Ok(n) = self.node_of_path(&path) {
                self.rebind(n, 0);
            }
        }
        r
    }

    pub async fn rename(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
        no_replace: bool,
    ) -> Result<()> {
        let from_dir = self.path_of(parent)?;
        let to_dir = self.path_of(new_parent)?;
        let from = from_dir.join(name)?;
        let to = to_dir.join(new_name)?;
        // Pending writes go to the old name first, so the rename moves the pushed content.
        if let Ok(n) = self.node_of_path(&from) {
            let _ = self.push(n).await;
        }
        let replaced = self.node_of_path(&to).ok();
        self.call();
        let r = self
            .remote
            .rename(
                &from,
                &to,
                if no_replace {
                    crate::remote::RenameMode::NoReplace
                } else {
                    crate::remote::RenameMode::Replace
                },
            )
            .await;
        self.invalidate_listing(&from_dir);
        self.invalidate_listing(&to_dir);
        r?;
        if let Some(n) = replaced {
            // The file that was at `to` is gone; its inode number may come back for another.
            self.rebind(n, 0);
            if let Some(node) = self.nodes.lock().expect("nodes lock").get_mut(&n) {
                node.path = RemotePath::new(b".sbxfs-replaced".to_vec()).unwrap_or_default();
            }
        }
        // Paths follow the rename: the node and everything under it.
        let mut nodes = self.nodes.lock().expect("nodes lock");
        let prefix = {
            let mut p = from.as_bytes().to_vec();
            p.push(b'/');
            p
        };
        for n in nodes.values_mut() {
            let b = n.path.as_bytes();
            if b == from.as_bytes() {
                n.path = to.clone();
            } else if b.starts_with(&prefix) {
                let mut np = to.as_bytes().to_vec();
                np.extend_from_slice(&b[from.as_bytes().len()..]);
                if let Ok(p) = RemotePath::new(np) {
                    n.path = p;
                }
            }
        }
        drop(nodes);
        self.listings
            .lock()
            .expect("listings lock")
            .retain(|p, _| !p.as_bytes().starts_with(from.as_bytes()));
        Ok(())
    }

    pub async fn symlink(&self, parent: NodeId, name: &[u8], target: &[u8]) -> Result<NodeAttr> {
        let dir = self.path_of(parent)?;
        let path = dir.join(name)?;
        self.call();
        let attr = self.remote.symlink(&path, target).await?;
        self.invalidate_listing(&dir);
        let node = self.remember(&path, attr.clone(), true);
        Ok(NodeAttr { node, attr })
    }

    pub async fn readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        let path = self.path_of(node)?;
        if let Some(t) = self
            .nodes
            .lock()
            .expect("nodes lock")
            .get(&node)
            .filter(|n| n.fetched.elapsed() < self.cfg.attr_ttl)
            .and_then(|n| n.attr.symlink_target.clone())
        {
            return Ok(t.0);
        }
        self.call();
        self.remote.readlink(&path).await
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        self.call();
        self.remote.statfs().await
    }

    /// Forget cached data and attributes of a path (the change feed, `sbxfs ctl invalidate`).
    pub fn invalidate_path(&self, path: &RemotePath) {
        self.invalidate_listing(&Self::parent_of(path));
        self.invalidate_listing(path);
        let mut nodes = self.nodes.lock().expect("nodes lock");
        for (id, n) in nodes.iter_mut() {
            if &n.path == path {
                n.fetched = Instant::now() - self.cfg.attr_ttl * 2;
                if let Some(k) = self.kernel() {
                    k.invalidate_data(*id);
                }
            }
        }
    }

    pub fn now_ns(&self) -> i64 {
        now_ns()
    }
}

/// `YYYYMMDD-HHMMSS` in UTC, for conflict copy names.
fn chrono_like_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
