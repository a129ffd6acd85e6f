//! Retries for every transport: an idempotent call (reads, metadata, queries) whose transport
//! failed is tried again after a short backoff. Never a call that changes the workspace (a lost
//! answer does not tell whether the change happened), and never after a timeout (the caller
//! has waited long enough; a dead link would otherwise cost a timeout per attempt). Streams are
//! retried only while opening: items already delivered are never replayed.

use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};

use super::layer::{CallFn, Inner, Layer, Layered, Op};
use super::*;

/// Attempts of an idempotent call whose transport failed.
pub const ATTEMPTS: u32 = 3;
/// Wait before the second attempt; each later one waits three times as long.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The retry [`Layer`]: an idempotent [`Op`] whose transport failed is made again.
pub struct Retry {
    inner: Inner,
}

/// `inner` with its idempotent calls retried.
pub fn retrying(inner: Inner) -> Layered<Retry> {
    Layered::of(Retry { inner })
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

/// Streams are retried only while opening (the hook's default: a stream is a call answering
/// one); commits never (the default commit hook makes it once).
impl Layer for Retry {
    fn inner(&self) -> Result<Inner> {
        Ok(self.inner.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        _bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        if op.idempotent() {
            again(move || call(self.inner.clone())).boxed()
        } else {
            call(self.inner.clone())
        }
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
        use faulty::FaultyRemote;
        let faulty = FaultyRemote::new(memory::MemoryRemote::new());
        let control = faulty.control();
        let remote = retrying(std::sync::Arc::new(faulty));
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
