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

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::BoxStream;

use super::layer::{Bound, CallFn, CommitFn, Inner, Items, Layer, Layered, Op};
use super::*;

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

/// The deadline [`Layer`]: each [`Op`]'s [`Bound`] made a time limit.
pub struct Deadlines {
    inner: Inner,
    call: Duration,
    query: Duration,
    idle: Duration,
}

impl Deadlines {
    /// `inner` with the default deadlines.
    pub fn new(inner: Inner) -> Layered<Deadlines> {
        Self::with_call_deadline(inner, CALL)
    }

    /// Deadlines scaled from one call's (queries get 6×, an idle transfer 3×).
    pub fn with_call_deadline(inner: Inner, call: Duration) -> Layered<Deadlines> {
        Layered::of(Deadlines {
            inner,
            call,
            query: call * (QUERY.as_secs() / CALL.as_secs()) as u32,
            idle: call * (IDLE.as_secs() / CALL.as_secs()) as u32,
        })
    }

    /// The time a call of `op` moving `bytes` may take to answer (a stream: to start).
    fn limit(&self, op: Op, bytes: u64) -> Duration {
        match op.bound() {
            Bound::Query => self.query,
            Bound::PerByte => for_bytes(self.call, bytes),
            Bound::Upload => for_bytes(self.idle, bytes),
            Bound::Call | Bound::Stream | Bound::Feed => self.call,
        }
    }

    /// A whole-file upload: given [`IDLE`] after the last byte it read from its body, and
    /// failed when it averages less than [`MIN_UPLOAD_BYTES_PER_SEC`] after that.
    async fn upload(
        &self,
        path: &RemotePath,
        reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
        call: CommitFn<'_>,
    ) -> Result<Attr> {
        let last = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let body = Progress {
            inner: reader,
            last: last.clone(),
            bytes: bytes.clone(),
            start,
        };
        let call = call(self.inner.clone(), CommitContent::Whole(Box::new(body)));
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

impl Layer for Deadlines {
    fn inner(&self) -> Result<Inner> {
        Ok(self.inner.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        within(op.name(), self.limit(op, bytes), call(self.inner.clone())).boxed()
    }

    /// The answer must start within its limit; a [`Bound::Stream`] must then keep moving:
    /// each item within [`IDLE`]'s share of the last.
    fn stream<'a, T: Send + 'static>(
        &'a self,
        op: Op,
        call: CallFn<'a, Items<T>>,
    ) -> BoxFuture<'a, Result<Items<T>>> {
        async move {
            let s = within(op.name(), self.limit(op, 0), call(self.inner.clone())).await?;
            Ok(match op.bound() {
                Bound::Stream => idle_bounded(op.name(), self.idle, s),
                _ => s,
            })
        }
        .boxed()
    }

    fn commit<'a>(
        &'a self,
        path: &'a RemotePath,
        content: CommitContent,
        call: CommitFn<'a>,
    ) -> BoxFuture<'a, Result<Attr>> {
        async move {
            match content {
                CommitContent::Patch { ref ranges, .. } => {
                    let bytes: u64 = ranges.iter().map(|(_, b)| b.len() as u64).sum();
                    let limit = self.limit(Op::Commit, bytes);
                    within("commit", limit, call(self.inner.clone(), content)).await
                }
                CommitContent::Whole(reader) => self.upload(path, reader, call).await,
            }
        }
        .boxed()
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
        let r = Deadlines::new(Arc::new(memory));
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
