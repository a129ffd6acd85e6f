//! Retries for every transport: an idempotent call (reads, metadata, queries) whose transport
//! failed is tried again after a short backoff. Never a call that changes the workspace (a lost
//! answer does not tell whether the change happened), and never after a timeout (the caller
//! has waited long enough; a dead link would otherwise cost a timeout per attempt). Streams are
//! retried only while opening: items already delivered are never replayed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;

use super::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};

/// Attempts of an idempotent call whose transport failed.
pub const ATTEMPTS: u32 = 3;
/// Wait before the second attempt; each later one waits three times as long.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

pub struct Retrying {
    inner: Arc<dyn Remote>,
}

impl Retrying {
    pub fn new(inner: Arc<dyn Remote>) -> Self {
        Retrying { inner }
    }
}

/// Whether a failure may be tried again: the transport failed before an answer (a timeout is
/// not retried).
fn retryable(e: &RemoteError) -> bool {
    matches!(e, RemoteError::Transport(_))
}

/// `call` up to [`ATTEMPTS`] times while it fails retryably.
async fn again<T, F, Fut>(call: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut wait = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if retryable(&e) && attempt < ATTEMPTS => {
                tracing::debug!("retrying after a transport failure: {e}");
                tokio::time::sleep(wait).await;
                wait *= 3;
                attempt += 1;
            }
            r => return r,
        }
    }
}

#[async_trait]
impl Remote for Retrying {
    async fn info(&self) -> Result<RemoteInfo> {
        again(|| self.inner.info()).await
    }
    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        again(|| self.inner.stat(path)).await
    }
    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        again(|| self.inner.stat_many(paths)).await
    }
    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        again(|| self.inner.list(path)).await
    }
    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        again(|| self.inner.tree(path)).await
    }
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<TreeListing>>> {
        again(|| self.inner.tree_listings(path, max_entries)).await
    }
    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        again(|| self.inner.read(path, offset, len)).await
    }
    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        self.inner.commit(path, content, opts).await
    }
    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.inner.create(path, mode).await
    }
    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.inner.mkdir(path, mode).await
    }
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        self.inner.mknod(path, kind, mode, rdev).await
    }
    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        self.inner.unlink(path).await
    }
    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        self.inner.rmdir(path).await
    }
    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        self.inner.rename(from, to, mode).await
    }
    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        self.inner.link(existing, new).await
    }
    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        self.inner.symlink(path, target).await
    }
    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        again(|| self.inner.readlink(path)).await
    }
    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        self.inner.setattr(path, attr).await
    }
    async fn statfs(&self) -> Result<StatFs> {
        again(|| self.inner.statfs()).await
    }
    async fn stop_agent(&self) -> Result<String> {
        self.inner.stop_agent().await
    }
    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        again(|| self.inner.getxattr(path, name)).await
    }
    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        again(|| self.inner.listxattr(path)).await
    }
    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        self.inner.setxattr(path, name, value, flags).await
    }
    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        self.inner.removexattr(path, name).await
    }
    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        self.inner.fallocate(path, offset, len, keep_size).await
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
        self.inner
            .copy_range(src, src_offset, dst, dst_offset, len, dst_base)
            .await
    }
    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        again(|| self.inner.scan(path, req)).await
    }
    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        again(|| self.inner.grep(path, opts.clone())).await
    }
    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        again(|| self.inner.glob(path, pattern)).await
    }
    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        again(|| self.inner.fuzzy(path, req.clone())).await
    }
    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        self.inner.edit(path, old, new, replace_all).await
    }
    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        again(|| self.inner.watch(since)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_transport_failure_is_retried_and_a_timeout_is_not() {
        let calls = AtomicU32::new(0);
        let r = again(|| async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(RemoteError::Transport("reset".into())),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!((r.unwrap(), calls.load(Ordering::SeqCst)), (7, 2));

        let calls = AtomicU32::new(0);
        let r: Result<()> = again(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(RemoteError::TimedOut("slow".into()))
        })
        .await;
        assert!(matches!(r, Err(RemoteError::TimedOut(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let calls = AtomicU32::new(0);
        let r: Result<()> = again(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(RemoteError::Transport("down".into()))
        })
        .await;
        assert!(matches!(r, Err(RemoteError::Transport(_))));
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
    }

    #[tokio::test]
    async fn a_read_is_retried_and_a_call_that_changes_the_workspace_is_not() {
        use faulty::{FaultyRemote, Op};
        let faulty = FaultyRemote::new(memory::MemoryRemote::new());
        let control = faulty.control();
        let remote = Retrying::new(Arc::new(faulty));
        let down = || RemoteError::Transport("connection reset".into());
        control.fail_once(Op::Stat, down());
        assert!(remote.stat(&RemotePath::root()).await.is_ok());
        assert_eq!(control.calls(Op::Stat), 2);
        control.fail_once(Op::Create, down());
        let a = RemotePath::new("a").unwrap();
        assert!(matches!(
            remote.create(&a, 0o644).await,
            Err(RemoteError::Transport(_))
        ));
        assert_eq!(control.calls(Op::Create), 1);
    }
}
