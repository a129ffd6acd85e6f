//! Deadlines for every remote call: a wrapper any backend gets, so no call can hang forever
//! (a sandbox that stopped answering holds no `close()`, lock or query for longer than its
//! deadline). A call past its deadline fails with [`RemoteError::TimedOut`], which the mount
//! treats as transient: data stays staged and the push is retried.
//!
//! Deadlines scale with the work: reads and patch commits get time per byte; a whole-file
//! commit is given [`IDLE`] after the last byte it read from its body, so a large upload on a
//! slow link is never cut while it is moving.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::stream::BoxStream;

use super::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};

/// A metadata call (stat, list, create, rename, …): one round trip, however far the sandbox.
pub const CALL: Duration = Duration::from_secs(10);
/// Queries walk and read in the sandbox: more time, still bounded.
pub const QUERY: Duration = Duration::from_secs(60);
/// A transfer that stops moving for this long has failed.
pub const IDLE: Duration = Duration::from_secs(30);
/// Time given per byte of a read or patch: 1 MiB/s is slower than any link worth mounting.
const BYTES_PER_SEC: u64 = 1024 * 1024;
/// The slowest a whole-file upload may be on average, after its first idle period: a peer that
/// takes a chunk now and then keeps it "moving" but would hold an `fsync` (which the kernel
/// cannot interrupt) for hours.
const MIN_UPLOAD_BYTES_PER_SEC: u64 = 64 * 1024;
/// How often a whole-file upload's progress is looked at.
const UPLOAD_CHECK: Duration = Duration::from_secs(5);

pub struct Deadlines<R> {
    inner: R,
    call: Duration,
    query: Duration,
    idle: Duration,
}

impl<R> Deadlines<R> {
    pub fn new(inner: R) -> Self {
        Self::with_call_deadline(inner, CALL)
    }

    /// Deadlines scaled from one call's (queries get 6×, an idle transfer 3×).
    pub fn with_call_deadline(inner: R, call: Duration) -> Self {
        Deadlines {
            inner,
            call,
            query: call * (QUERY.as_secs() / CALL.as_secs()) as u32,
            idle: call * (IDLE.as_secs() / CALL.as_secs()) as u32,
        }
    }
}

async fn within<T>(
    op: &str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(RemoteError::TimedOut(format!(
            "{op}: the sandbox did not answer within {} s",
            limit.as_secs()
        ))),
    }
}

/// A stream whose next item must come within `limit`; one that does not ends it with
/// [`RemoteError::TimedOut`].
fn idle_bounded<T: Send + 'static>(
    op: &'static str,
    limit: Duration,
    s: BoxStream<'static, Result<T>>,
) -> BoxStream<'static, Result<T>> {
    use futures_util::StreamExt;
    futures_util::stream::unfold(Some(s), move |s| async move {
        let mut s = s?;
        match tokio::time::timeout(limit, s.next()).await {
            Ok(Some(item)) => Some((item, Some(s))),
            Ok(None) => None,
            Err(_) => Some((
                Err(RemoteError::TimedOut(format!(
                    "{op}: the sandbox's answer stopped for {} s",
                    limit.as_secs()
                ))),
                None,
            )),
        }
    })
    .boxed()
}

fn for_bytes(base: Duration, bytes: u64) -> Duration {
    base + Duration::from_secs(bytes / BYTES_PER_SEC)
}

/// A body reader that notes when it last moved.
struct Progress<R> {
    inner: R,
    last: Arc<AtomicU64>,
    /// Bytes read so far.
    bytes: Arc<AtomicU64>,
    start: Instant,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Progress<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let ms = self.start.elapsed().as_millis() as u64;
            self.last.store(ms, Ordering::Relaxed);
            self.bytes
                .fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        }
        r
    }
}

#[async_trait]
impl<R: Remote> Remote for Deadlines<R> {
    async fn info(&self) -> Result<RemoteInfo> {
        within("info", self.call, self.inner.info()).await
    }
    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        within("stat", self.call, self.inner.stat(path)).await
    }
    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        within("stat_many", self.call, self.inner.stat_many(paths)).await
    }
    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        within("list", self.query, self.inner.list(path)).await
    }
    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        within("tree", self.call, self.inner.tree(path)).await
    }
    /// The answer must start within a call's deadline and keep moving: each listing within
    /// [`IDLE`]'s share of the last.
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<TreeListing>>> {
        let s = within(
            "tree",
            self.call,
            self.inner.tree_listings(path, max_entries),
        )
        .await?;
        Ok(idle_bounded("tree", self.idle, s))
    }
    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        let limit = for_bytes(self.call, u64::from(len));
        within("read", limit, self.inner.read(path, offset, len)).await
    }
    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        match content {
            CommitContent::Patch {
                cut,
                new_len,
                ranges,
            } => {
                let bytes: u64 = ranges.iter().map(|(_, b)| b.len() as u64).sum();
                let content = CommitContent::Patch {
                    cut,
                    new_len,
                    ranges,
                };
                within(
                    "commit",
                    for_bytes(self.idle, bytes),
                    self.inner.commit(path, content, opts),
                )
                .await
            }
            CommitContent::Whole(reader) => {
                let last = Arc::new(AtomicU64::new(0));
                let bytes = Arc::new(AtomicU64::new(0));
                let start = Instant::now();
                let body = Progress {
                    inner: reader,
                    last: last.clone(),
                    bytes: bytes.clone(),
                    start,
                };
                let call = self
                    .inner
                    .commit(path, CommitContent::Whole(Box::new(body)), opts);
                tokio::pin!(call);
                loop {
                    let moved = Duration::from_millis(last.load(Ordering::Relaxed));
                    let idle_until = start + moved + self.idle;
                    let wake = idle_until.min(Instant::now() + UPLOAD_CHECK);
                    tokio::select! {
                        r = &mut call => return r,
                        _ = tokio::time::sleep_until(wake.into()) => {
                            let moved_now = Duration::from_millis(last.load(Ordering::Relaxed));
                            if moved_now == moved && Instant::now() >= idle_until {
                                return Err(RemoteError::TimedOut(format!(
                                    "commit of {}: nothing moved for {} s",
                                    path.display(),
                                    self.idle.as_secs()
                                )));
                            }
                            let due = start.elapsed().saturating_sub(self.idle).as_secs()
                                * MIN_UPLOAD_BYTES_PER_SEC;
                            if bytes.load(Ordering::Relaxed) < due {
                                return Err(RemoteError::TimedOut(format!(
                                    "commit of {}: the sandbox takes the upload slower than {} KiB/s",
                                    path.display(),
                                    MIN_UPLOAD_BYTES_PER_SEC / 1024
                                )));
                            }
                        }
                    }
                }
            }
        }
    }
    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        within("create", self.call, self.inner.create(path, mode)).await
    }
    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        within("mkdir", self.call, self.inner.mkdir(path, mode)).await
    }
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        within("mknod", self.call, self.inner.mknod(path, kind, mode, rdev)).await
    }
    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        within("unlink", self.call, self.inner.unlink(path)).await
    }
    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        within("rmdir", self.call, self.inner.rmdir(path)).await
    }
    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        within("rename", self.call, self.inner.rename(from, to, mode)).await
    }
    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        within("link", self.call, self.inner.link(existing, new)).await
    }
    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        within("symlink", self.call, self.inner.symlink(path, target)).await
    }
    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        within("readlink", self.call, self.inner.readlink(path)).await
    }
    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        within("setattr", self.call, self.inner.setattr(path, attr)).await
    }
    async fn statfs(&self) -> Result<StatFs> {
        within("statfs", self.call, self.inner.statfs()).await
    }
    async fn stop_agent(&self) -> Result<String> {
        within("stop_agent", self.call, self.inner.stop_agent()).await
    }
    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        within("getxattr", self.call, self.inner.getxattr(path, name)).await
    }
    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        within("listxattr", self.call, self.inner.listxattr(path)).await
    }
    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        within(
            "setxattr",
            self.call,
            self.inner.setxattr(path, name, value, flags),
        )
        .await
    }
    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        within("removexattr", self.call, self.inner.removexattr(path, name)).await
    }
    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        within(
            "fallocate",
            self.query,
            self.inner.fallocate(path, offset, len, keep_size),
        )
        .await
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
        within(
            "copy_range",
            self.query,
            self.inner
                .copy_range(src, src_offset, dst, dst_offset, len, dst_base),
        )
        .await
    }
    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        within("scan", self.query, self.inner.scan(path, req)).await
    }
    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        within("grep", self.query, self.inner.grep(path, opts)).await
    }
    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        within("glob", self.query, self.inner.glob(path, pattern)).await
    }
    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        within("fuzzy", self.query, self.inner.fuzzy(path, req)).await
    }
    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        within(
            "edit",
            self.query,
            self.inner.edit(path, old, new, replace_all),
        )
        .await
    }
    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        within("watch", self.call, self.inner.watch(since)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_its_deadline_times_out() {
        let r = within("stat", Duration::from_millis(50), async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await;
        assert!(matches!(r, Err(RemoteError::TimedOut(_))));
        let r = within("stat", CALL, async { Ok(5) }).await;
        assert_eq!(r.unwrap(), 5);
    }

    /// A body that gives 1 KiB now and then, each read 20 s after the last: always moving,
    /// never done.
    struct Dribble {
        nap: Option<Pin<Box<tokio::time::Sleep>>>,
    }

    impl tokio::io::AsyncRead for Dribble {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let nap = self
                .nap
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_secs(20))));
            match std::future::Future::poll(nap.as_mut(), cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    self.nap = None;
                    let n = buf.remaining().min(1024);
                    buf.put_slice(&vec![b'x'; n]);
                    Poll::Ready(Ok(()))
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_upload_that_barely_moves_times_out() {
        let memory = crate::remote::memory::MemoryRemote::new();
        let r = Deadlines::new(memory);
        let path = RemotePath::new(b"f".to_vec()).unwrap();
        let started = Instant::now();
        let e = r
            .commit(
                &path,
                CommitContent::Whole(Box::new(Dribble { nap: None })),
                CommitOptions::default(),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, RemoteError::TimedOut(_)), "{e}");
        assert!(e.to_string().contains("slower than"), "{e}");
        // One idle period, then the first check that finds it below the floor.
        assert!(
            started.elapsed() <= IDLE + UPLOAD_CHECK * 2,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn reads_get_time_per_byte() {
        assert_eq!(
            for_bytes(CALL, 16 * 1024 * 1024),
            CALL + Duration::from_secs(16)
        );
    }
}
