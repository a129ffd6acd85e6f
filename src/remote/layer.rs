//! Wrappers as layers. Retries ([`super::retry`]), deadlines ([`super::deadline`]), injected
//! faults ([`super::faulty`]) and the ssh relink ([`super::ssh::relink`]) each change how a
//! call reaches the remote beneath, never what it asks. Each is a [`Layer`]: a few hooks that
//! see one call described by its [`Op`] (which method, whether it may be repeated, what bounds
//! its time), and [`Layered`] is the one `Remote` implementation that routes every method
//! through them. A new method is added once here and once in the table, not once per wrapper.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::BoxStream;

use super::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};

/// The operations of [`Remote`], one per method (`tree` and `tree_listings` are one: a
/// subtree's call, whatever its encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Info,
    Stat,
    StatMany,
    List,
    Tree,
    Read,
    Commit,
    Create,
    Mkdir,
    Mknod,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Symlink,
    Readlink,
    Setattr,
    Statfs,
    Getxattr,
    Listxattr,
    Setxattr,
    Removexattr,
    Fallocate,
    CopyRange,
    Scan,
    Grep,
    Glob,
    Fuzzy,
    Edit,
    Watch,
    StopAgent,
}

/// What bounds a call's time ([`super::deadline`] turns each into a deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// One round trip, however far the sandbox.
    Call,
    /// Work done in the sandbox (a walk, a query, an allocation, a copy).
    Query,
    /// A transfer: a round trip plus time per byte it moves.
    PerByte,
    /// An upload: a patch gets time per byte; a whole file, as long as its body keeps moving.
    Upload,
    /// A stream: it starts within a round trip, then each item comes within the idle time.
    Stream,
    /// The change feed: it starts within a round trip, then lasts as long as the mount.
    Feed,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Description {
    /// The name errors and logs use.
    pub name: &'static str,
    /// Whether doing it twice is doing it once: only such a call is tried again after its
    /// answer was lost (a lost answer does not tell whether a change happened).
    pub idempotent: bool,
    pub bound: Bound,
}

const fn row(name: &'static str, idempotent: bool, bound: Bound) -> Description {
    Description {
        name,
        idempotent,
        bound,
    }
}

/// Reads the workspace; may be repeated.
const READS: bool = true;
/// Changes the workspace (or the agent); never repeated.
const CHANGES: bool = false;

impl Op {
    pub const ALL: [Op; 31] = [
        Op::Info,
        Op::Stat,
        Op::StatMany,
        Op::List,
        Op::Tree,
        Op::Read,
        Op::Commit,
        Op::Create,
        Op::Mkdir,
        Op::Mknod,
        Op::Unlink,
        Op::Rmdir,
        Op::Rename,
        Op::Link,
        Op::Symlink,
        Op::Readlink,
        Op::Setattr,
        Op::Statfs,
        Op::Getxattr,
        Op::Listxattr,
        Op::Setxattr,
        Op::Removexattr,
        Op::Fallocate,
        Op::CopyRange,
        Op::Scan,
        Op::Grep,
        Op::Glob,
        Op::Fuzzy,
        Op::Edit,
        Op::Watch,
        Op::StopAgent,
    ];

    /// The table, written once (the match is exhaustive: a new operation needs its row).
    pub const fn describe(self) -> Description {
        use Bound::*;
        match self {
            Op::Info => row("info", READS, Call),
            Op::Stat => row("stat", READS, Call),
            Op::StatMany => row("stat_many", READS, Call),
            // A directory can be large: listing it is work in the sandbox.
            Op::List => row("list", READS, Query),
            Op::Tree => row("tree", READS, Stream),
            Op::Read => row("read", READS, PerByte),
            Op::Commit => row("commit", CHANGES, Upload),
            Op::Create => row("create", CHANGES, Call),
            Op::Mkdir => row("mkdir", CHANGES, Call),
            Op::Mknod => row("mknod", CHANGES, Call),
            Op::Unlink => row("unlink", CHANGES, Call),
            Op::Rmdir => row("rmdir", CHANGES, Call),
            Op::Rename => row("rename", CHANGES, Call),
            Op::Link => row("link", CHANGES, Call),
            Op::Symlink => row("symlink", CHANGES, Call),
            Op::Readlink => row("readlink", READS, Call),
            Op::Setattr => row("setattr", CHANGES, Call),
            Op::Statfs => row("statfs", READS, Call),
            Op::Getxattr => row("getxattr", READS, Call),
            Op::Listxattr => row("listxattr", READS, Call),
            Op::Setxattr => row("setxattr", CHANGES, Call),
            Op::Removexattr => row("removexattr", CHANGES, Call),
            Op::Fallocate => row("fallocate", CHANGES, Query),
            Op::CopyRange => row("copy_range", CHANGES, Query),
            Op::Scan => row("scan", READS, Query),
            Op::Grep => row("grep", READS, Query),
            Op::Glob => row("glob", READS, Query),
            Op::Fuzzy => row("fuzzy", READS, Query),
            // An edit reads, replaces and commits in one call: a repeat could apply it twice.
            Op::Edit => row("edit", CHANGES, Query),
            Op::Watch => row("watch", READS, Feed),
            Op::StopAgent => row("stop_agent", CHANGES, Call),
        }
    }

    pub const fn name(self) -> &'static str {
        self.describe().name
    }

    pub const fn idempotent(self) -> bool {
        self.describe().idempotent
    }

    pub const fn bound(self) -> Bound {
        self.describe().bound
    }
}

/// The remote beneath a layer.
pub type Inner = Arc<dyn Remote>;
/// A call's answer when it is a stream.
pub type Items<T> = BoxStream<'static, Result<T>>;
/// One call of the remote beneath, made as often as the layer asks (more than once only for
/// an idempotent [`Op`]).
pub type CallFn<'a, T> = &'a (dyn Fn(Inner) -> BoxFuture<'a, Result<T>> + Send + Sync + 'a);
/// A commit of the remote beneath: made at most once, its content handed through the layer
/// (a whole file's body is a reader a layer may watch or cut).
pub type CommitFn<'a> =
    Box<dyn FnOnce(Inner, CommitContent) -> BoxFuture<'a, Result<Attr>> + Send + 'a>;

/// A wrapper around a remote: how a call reaches it. Each hook has the plain way as its
/// default (the call made once on [`Layer::inner`]).
pub trait Layer: Send + Sync + 'static {
    /// The remote a call goes to now (a relinking layer's changes; a broken link fails here).
    fn inner(&self) -> Result<Inner>;

    /// A call answering a value; `bytes` is what it moves (a read's length), for bounds that
    /// scale with it.
    fn call<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        let _ = (op, bytes);
        async move { call(self.inner()?).await }.boxed()
    }

    /// A call answering a stream (`tree`, `grep`, `watch`).
    fn stream<'a, T: Send + 'static>(
        &'a self,
        op: Op,
        call: CallFn<'a, Items<T>>,
    ) -> BoxFuture<'a, Result<Items<T>>> {
        self.call(op, 0, call)
    }

    /// A commit ([`Op::Commit`]) of `path`.
    fn commit<'a>(
        &'a self,
        path: &'a RemotePath,
        content: CommitContent,
        call: CommitFn<'a>,
    ) -> BoxFuture<'a, Result<Attr>> {
        let _ = path;
        async move { call(self.inner()?, content).await }.boxed()
    }

    /// Stopping the agent ([`Op::StopAgent`]).
    fn stop_agent(&self) -> BoxFuture<'_, Result<String>> {
        self.call(Op::StopAgent, 0, &|r: Inner| {
            async move { r.stop_agent().await }.boxed()
        })
    }
}

/// A [`Remote`] made of a layer over the remote beneath it.
pub struct Layered<L> {
    layer: L,
}

impl<L: Layer> Layered<L> {
    pub fn of(layer: L) -> Self {
        Layered { layer }
    }

    pub fn layer(&self) -> &L {
        &self.layer
    }
}

#[async_trait]
impl<L: Layer> Remote for Layered<L> {
    async fn info(&self) -> Result<RemoteInfo> {
        let f = |r: Inner| async move { r.info().await }.boxed();
        self.layer.call(Op::Info, 0, &f).await
    }
    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        let f = |r: Inner| async move { r.stat(path).await }.boxed();
        self.layer.call(Op::Stat, 0, &f).await
    }
    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        let f = |r: Inner| async move { r.stat_many(paths).await }.boxed();
        self.layer.call(Op::StatMany, 0, &f).await
    }
    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        let f = |r: Inner| async move { r.list(path).await }.boxed();
        self.layer.call(Op::List, 0, &f).await
    }
    async fn tree(&self, path: &RemotePath) -> Result<Items<TreeEntry>> {
        let f = |r: Inner| async move { r.tree(path).await }.boxed();
        self.layer.stream(Op::Tree, &f).await
    }
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<Items<TreeListing>> {
        let f = |r: Inner| async move { r.tree_listings(path, max_entries).await }.boxed();
        self.layer.stream(Op::Tree, &f).await
    }
    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        let f = |r: Inner| async move { r.read(path, offset, len).await }.boxed();
        self.layer.call(Op::Read, u64::from(len), &f).await
    }
    async fn read_held(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
        version: &Version,
    ) -> Result<ReadResult> {
        let f = |r: Inner| async move { r.read_held(path, offset, len, version).await }.boxed();
        self.layer.call(Op::Read, u64::from(len), &f).await
    }
    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        let f = Box::new(move |r: Inner, content: CommitContent| {
            async move { r.commit(path, content, opts).await }.boxed()
        });
        self.layer.commit(path, content, f).await
    }
    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let f = |r: Inner| async move { r.create(path, mode).await }.boxed();
        self.layer.call(Op::Create, 0, &f).await
    }
    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let f = |r: Inner| async move { r.mkdir(path, mode).await }.boxed();
        self.layer.call(Op::Mkdir, 0, &f).await
    }
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let f = |r: Inner| async move { r.mknod(path, kind, mode, rdev).await }.boxed();
        self.layer.call(Op::Mknod, 0, &f).await
    }
    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        let f = |r: Inner| async move { r.unlink(path).await }.boxed();
        self.layer.call(Op::Unlink, 0, &f).await
    }
    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        let f = |r: Inner| async move { r.rmdir(path).await }.boxed();
        self.layer.call(Op::Rmdir, 0, &f).await
    }
    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        let f = |r: Inner| async move { r.rename(from, to, mode).await }.boxed();
        self.layer.call(Op::Rename, 0, &f).await
    }
    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        let f = |r: Inner| async move { r.link(existing, new).await }.boxed();
        self.layer.call(Op::Link, 0, &f).await
    }
    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        let f = |r: Inner| async move { r.symlink(path, target).await }.boxed();
        self.layer.call(Op::Symlink, 0, &f).await
    }
    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let f = |r: Inner| async move { r.readlink(path).await }.boxed();
        self.layer.call(Op::Readlink, 0, &f).await
    }
    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        let f = |r: Inner| {
            let attr = attr.clone();
            async move { r.setattr(path, attr).await }.boxed()
        };
        self.layer.call(Op::Setattr, 0, &f).await
    }
    async fn statfs(&self) -> Result<StatFs> {
        let f = |r: Inner| async move { r.statfs().await }.boxed();
        self.layer.call(Op::Statfs, 0, &f).await
    }
    async fn stop_agent(&self) -> Result<String> {
        self.layer.stop_agent().await
    }
    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        let f = |r: Inner| async move { r.getxattr(path, name).await }.boxed();
        self.layer.call(Op::Getxattr, 0, &f).await
    }
    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        let f = |r: Inner| async move { r.listxattr(path).await }.boxed();
        self.layer.call(Op::Listxattr, 0, &f).await
    }
    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        let f = |r: Inner| async move { r.setxattr(path, name, value, flags).await }.boxed();
        self.layer.call(Op::Setxattr, 0, &f).await
    }
    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        let f = |r: Inner| async move { r.removexattr(path, name).await }.boxed();
        self.layer.call(Op::Removexattr, 0, &f).await
    }
    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        let f = |r: Inner| async move { r.fallocate(path, offset, len, keep_size).await }.boxed();
        self.layer.call(Op::Fallocate, 0, &f).await
    }
    async fn copy_range(
        &self,
        src: &RemotePath,
        src_offset: u64,
        dst: &RemotePath,
        dst_offset: u64,
        len: u64,
        dst_base: Option<Version>,
    ) -> Result<(u64, Attr)> {
        let f = |r: Inner| {
            let dst_base = dst_base.clone();
            async move {
                r.copy_range(src, src_offset, dst, dst_offset, len, dst_base)
                    .await
            }
            .boxed()
        };
        self.layer.call(Op::CopyRange, 0, &f).await
    }
    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        let f = |r: Inner| async move { r.scan(path, req).await }.boxed();
        self.layer.call(Op::Scan, 0, &f).await
    }
    async fn grep(&self, path: &RemotePath, opts: GrepOptions) -> Result<Items<GrepEvent>> {
        let f = |r: Inner| {
            let opts = opts.clone();
            async move { r.grep(path, opts).await }.boxed()
        };
        self.layer.stream(Op::Grep, &f).await
    }
    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        let f = |r: Inner| async move { r.glob(path, pattern).await }.boxed();
        self.layer.call(Op::Glob, 0, &f).await
    }
    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        let f = |r: Inner| {
            let req = req.clone();
            async move { r.fuzzy(path, req).await }.boxed()
        };
        self.layer.call(Op::Fuzzy, 0, &f).await
    }
    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        let f = |r: Inner| async move { r.edit(path, old, new, replace_all).await }.boxed();
        self.layer.call(Op::Edit, 0, &f).await
    }
    async fn watch(&self, since: Option<u64>) -> Result<Items<ChangeEvent>> {
        let f = |r: Inner| async move { r.watch(since).await }.boxed();
        self.layer.stream(Op::Watch, &f).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_one_row_and_a_distinct_name() {
        let mut names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
        // Nothing that changes the workspace may be repeated.
        for op in [Op::Commit, Op::Create, Op::Rename, Op::Unlink, Op::Edit] {
            assert!(!op.idempotent(), "{op:?}");
        }
    }
}
