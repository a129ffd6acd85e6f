//! The agent's accept loop: HTTP/1.1 connections with bounds a hostile peer cannot stretch.
//!
//! - **Header-read timeout** ([`HEADER_READ_TIMEOUT`]): a new connection's first request head
//!   must arrive in full within it, so a client trickling a request line holds nothing for long.
//! - **Idle timeout** ([`IDLE_TIMEOUT`]): a connection with no request in flight is closed
//!   after it (hyper's own header timer says the same for a later request's head). Not the
//!   10 s of the first head: hyper's timer also runs while a keep-alive connection waits, and a
//!   client's pooled connection closed after 10 s idle would race its next request.
//! - **Bodies under a deadline** ([`ReceivedBody`]): a request's body must arrive at
//!   [`MIN_BODY_RATE`] on average after [`BODY_GRACE`], or the request fails ("too slow") and
//!   its connection closes, so a client trickling a body holds its slot for seconds, not
//!   for as long as it likes.
//! - **A cap on connections** ([`connection_cap`]: [`MAX_CONNECTIONS`], at most half the
//!   descriptors the process may open, so files always have some). At the cap a new
//!   connection evicts the longest-idle one (a slowloris connection never has a request in
//!   flight, so it is the one to go, while clients mid-request are kept); with none idle, the
//!   one whose request body has been silent longest (a trickle; a real upload retries); when
//!   every connection is being answered the new one is closed at once.
//! - **Accept errors are survived**: a connection aborted before `accept` is skipped; running
//!   out of descriptors or memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) gives up the
//!   longest-idle connection and tries again (after [`ACCEPT_BACKOFF`] when none is idle),
//!   logged at most once a minute.
//!
//! A request is "in flight" from its head until its answer's body has been sent or dropped
//! ([`AnswerBody`]): a long stream (grep, watch) keeps its connection from being evicted,
//! unless its client stops reading: a piece not taken for 2 s makes it evictable at the cap,
//! for [`SEND_STALL_LIMIT`] ends it.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Notify;
use tower::ServiceExt;

use crate::lograte::{RateLimit, Verdict};

/// Time a client has to send a request's head (and, on a new connection, to start one).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A keep-alive connection with nothing in flight is closed after this: the mount reconnects
/// in a round trip, and an idle socket costs a descriptor.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once, at most: the mount uses a handful, the CLI one per query.
pub const MAX_CONNECTIONS: usize = 256;
/// An answer whose client has not taken a piece of it for this long may make room at the cap.
const STALL_EVICTABLE: Duration = Duration::from_secs(2);
/// An answer whose client has not taken a piece of it for this long ends, and its connection.
pub const SEND_STALL_LIMIT: Duration = Duration::from_secs(60);
/// Time a request body may take before [`MIN_BODY_RATE`] applies to it.
pub const BODY_GRACE: Duration = Duration::from_secs(10);
/// The slowest average rate a request body may arrive at after [`BODY_GRACE`], in bytes per
/// second: far below any link a mount pushes over, far above a trickle.
pub const MIN_BODY_RATE: u64 = 4096;
/// Wait after an accept error that says the process or the system is out of something.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Wait after an accept error for which an idle connection was given up (its task closes it).
const EVICTION_PAUSE: Duration = Duration::from_millis(2);
/// How often an idle connection checks its idle time: the timeouts are approximate by this.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long a shutdown waits for answers in flight before the process exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The cap on connections given the descriptor limit `nofile` and the descriptors already
/// `in_use`: at most half of what is left, so the files the requests open always find
/// descriptors (and at least a few connections).
pub fn connection_cap(nofile: u64, in_use: u64) -> usize {
    (nofile.saturating_sub(in_use) / 2).clamp(4, MAX_CONNECTIONS as u64) as usize
}

/// Descriptors the process has open now.
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Raise the soft descriptor limit to the hard one (as most servers do: the soft default of
/// 1024 is a relic of `select`), and answer the limit in force.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// One connection's state, shared between its task and the accept loop.
struct Conn {
    /// Requests whose answers are not finished yet.
    in_flight: AtomicUsize,
    /// Requests started on this connection.
    started: AtomicU64,
    /// When the last request finished (or the connection was accepted), as ms since `epoch`.
    idle_since_ms: AtomicU64,
    /// Requests whose body has not arrived in full yet.
    receiving: AtomicUsize,
    /// When an answer last handed hyper a piece that it has not come back for (the client
    /// is not reading), as ms since `epoch`; 0 while the answer waits for its own producer.
    sending_since_ms: AtomicU64,
    /// When a request body last brought bytes (or began), as ms since `epoch`.
    body_progress_ms: AtomicU64,
    /// Tells the connection's task to drop it now (it has no request in flight).
    evict: Notify,
}

/// The connections being served, by accept order.
struct Registry {
    epoch: Instant,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    /// Signalled whenever a connection ends (for the shutdown wait).
    ended: Notify,
    /// Cancelled at shutdown: each connection ends once its answer in flight is sent.
    stopping: tokio_util::sync::CancellationToken,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Make room for one more connection under `cap`: answers false when every connection
    /// has a request in flight (the new one is then refused).
    fn make_room(&self, cap: usize) -> bool {
        if self.conns.lock().expect("connection registry").len() < cap {
            return true;
        }
        self.evict_idlest()
    }

    /// Close the connection idle the longest (none in flight); false when there is none.
    /// A connection ended: out of the registry.
    fn forget(&self, id: u64) {
        self.conns.lock().expect("connection registry").remove(&id);
        self.ended.notify_waiters();
    }

    /// With none idle, the one whose request bodies have been silent longest (every request
    /// on it still waiting for its body: nothing answered is cut short).
    fn evict_idlest(&self) -> bool {
        let mut conns = self.conns.lock().expect("connection registry");
        let idle = conns
            .iter()
            .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|(_, c)| c.idle_since_ms.load(Ordering::Relaxed))
            .map(|(id, _)| *id);
        let receiving = || {
            conns
                .iter()
                .filter(|(_, c)| {
                    let in_flight = c.in_flight.load(Ordering::Acquire);
                    in_flight > 0 && c.receiving.load(Ordering::Acquire) >= in_flight
                })
                .min_by_key(|(_, c)| c.body_progress_ms.load(Ordering::Relaxed))
                .map(|(id, _)| *id)
        };
        let now = self.now_ms();
        let stalled = || {
            conns
                .iter()
                .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) > 0)
                .filter_map(|(id, c)| {
                    let since = c.sending_since_ms.load(Ordering::Relaxed);
                    (since != 0 && now.saturating_sub(since) >= STALL_EVICTABLE.as_millis() as u64)
                        .then_some((since, *id))
                })
                .min()
                .map(|(_, id)| id)
        };
        let victim = idle.or_else(receiving).or_else(stalled);
        match victim.and_then(|id| conns.remove(&id)) {
            Some(c) => {
                c.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Ends the request it stands for when dropped: the answer's body was sent or abandoned.
struct InFlight {
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds something (an [`InFlight`], a memory reservation) until it
/// has been sent in full or dropped. Frames, size and end pass through unchanged, so a
/// `Content-Length` answer stays one.
pub struct TrackedBody<G> {
    inner: Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> TrackedBody<G> {
    pub fn wrap(resp: Response, guard: G) -> Response {
        resp.map(|inner| {
            Body::new(TrackedBody {
                inner,
                _guard: guard,
            })
        })
    }
}

impl<G: Unpin> http_body::Body for TrackedBody<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request's body as it arrives, under [`BODY_GRACE`] and [`MIN_BODY_RATE`]: one that
/// falls behind ends in an error (the handler fails, hyper closes the connection). Counted in
/// its connection's `receiving` until it ends or is dropped.
pub struct ReceivedBody {
    inner: hyper::body::Incoming,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    started: tokio::time::Instant,
    received: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
    receiving: bool,
}

impl ReceivedBody {
    fn new(inner: hyper::body::Incoming, conn: Arc<Conn>, registry: Arc<Registry>) -> Self {
        let receiving = !http_body::Body::is_end_stream(&inner);
        if receiving {
            conn.receiving.fetch_add(1, Ordering::AcqRel);
            conn.body_progress_ms
                .store(registry.now_ms(), Ordering::Relaxed);
        }
        let started = tokio::time::Instant::now();
        ReceivedBody {
            inner,
            conn,
            registry,
            started,
            received: 0,
            deadline: Box::pin(tokio::time::sleep_until(started + BODY_GRACE)),
            receiving,
        }
    }

    /// When the next byte is due for the body to keep [`MIN_BODY_RATE`].
    fn due(&self) -> tokio::time::Instant {
        self.started
            + BODY_GRACE
            + Duration::from_millis((self.received + 1).saturating_mul(1000) / MIN_BODY_RATE)
    }

    fn done(&mut self) {
        if std::mem::take(&mut self.receiving) {
            self.conn.receiving.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for ReceivedBody {
    fn drop(&mut self) {
        self.done();
    }
}

impl http_body::Body for ReceivedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    this.conn
                        .body_progress_ms
                        .store(this.registry.now_ms(), Ordering::Relaxed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done();
                Poll::Ready(Some(Err(axum::Error::new(e))))
            }
            Poll::Ready(None) => {
                this.done();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let due = this.due();
                if this.deadline.deadline() != due {
                    this.deadline.as_mut().reset(due);
                }
                if std::future::Future::poll(this.deadline.as_mut(), cx).is_pending() {
                    return Poll::Pending;
                }
                this.done();
                tracing::debug!(received = this.received, "request body too slow: dropped");
                Poll::Ready(Some(Err(axum::Error::new(format!(
                    "the request body arrived slower than {MIN_BODY_RATE} bytes/s"
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body as hyper takes it: notes on its connection whether a piece waits for the
/// client ([`Conn::sending_since_ms`]), and ends its request ([`InFlight`]) when dropped.
struct AnswerBody {
    inner: Body,
    flight: InFlight,
}

impl Drop for AnswerBody {
    fn drop(&mut self) {
        self.flight
            .conn
            .sending_since_ms
            .store(0, Ordering::Relaxed);
    }
}

impl http_body::Body for AnswerBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let sending = &this.flight.conn.sending_since_ms;
        sending.store(0, Ordering::Relaxed);
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            sending.store(this.flight.registry.now_ms().max(1), Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Bytes handed to hyper at once from a [`paced_body`]: it polls for more only once it has
/// written what it holds, so an answer nobody reads pins its reservation, not more.
const PACED_FRAME_BYTES: usize = 256 * 1024;

/// A body of `data` given out [`PACED_FRAME_BYTES`] at a time, holding `guard` until the last
/// piece is taken (by then at most one piece waits in hyper's buffer). Its length is exact, so
/// the answer keeps its `Content-Length`.
pub fn paced_body<G: Send + Unpin + 'static>(data: bytes::Bytes, guard: G) -> Body {
    Body::new(PacedBody {
        data,
        guard: Some(guard),
    })
}

struct PacedBody<G> {
    data: bytes::Bytes,
    guard: Option<G>,
}

impl<G: Unpin> http_body::Body for PacedBody<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.data.is_empty() {
            self.guard = None;
            return Poll::Ready(None);
        }
        let n = self.data.len().min(PACED_FRAME_BYTES);
        let piece = self.data.split_to(n);
        if self.data.is_empty() {
            self.guard = None;
        }
        Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.len() as u64)
    }
}

/// Where the agent accepts connections: a TCP address, or a Unix socket (the ssh transport's
/// deployed agent, reached only through the ssh channel).
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// An accepted connection of either kind.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

impl Listener {
    async fn accept(&self) -> std::io::Result<Box<dyn Stream>> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            }
            Listener::Unix(l) => Ok(Box::new(l.accept().await?.0)),
        }
    }
}

/// Serve `router` on `listener` until `shutdown` resolves, or until no connection has been
/// open for `idle_exit` (when given: a deployed agent outlives its mount for reuse, not forever).
pub async fn serve(
    listener: Listener,
    router: Router,
    cap: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
    idle_exit: Option<Duration>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let registry = Arc::new(Registry {
        epoch: Instant::now(),
        conns: Mutex::new(BTreeMap::new()),
        ended: Notify::new(),
        stopping: tokio_util::sync::CancellationToken::new(),
    });
    let errors = RateLimit::new();
    let mut next_id = 0u64;
    let mut unused_since = Instant::now();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(IDLE_CHECK), if idle_exit.is_some() => {
                if !registry.conns.lock().expect("connection registry").is_empty() {
                    unused_since = Instant::now();
                } else if idle_exit.is_some_and(|limit| unused_since.elapsed() >= limit) {
                    tracing::info!("no client for {:?}: exiting", idle_exit.unwrap_or_default());
                    break;
                }
                continue;
            }
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                accept_failed(&e, &errors, &registry).await;
                continue;
            }
        };
        if !registry.make_room(cap) {
            tracing::debug!("connection refused: every connection has a request in flight");
            drop(stream);
            continue;
        }
        unused_since = Instant::now();
        let conn = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(registry.now_ms()),
            receiving: AtomicUsize::new(0),
            sending_since_ms: AtomicU64::new(0),
            body_progress_ms: AtomicU64::new(registry.now_ms()),
            evict: Notify::new(),
        });
        next_id += 1;
        registry
            .conns
            .lock()
            .expect("connection registry")
            .insert(next_id, conn.clone());
        let (router, registry, id) = (router.clone(), registry.clone(), next_id);
        let Some(tls) = tls.clone() else {
            tokio::spawn(serve_connection(stream, router, conn, registry, id));
            continue;
        };
        // The handshake in the connection's task: a slow or silent peer holds up no other,
        // and one that does not finish it in time is dropped like a silent HTTP one.
        tokio::spawn(async move {
            match tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, router, conn, registry, id).await,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    registry.forget(id);
                }
                Err(_) => {
                    tracing::debug!("TLS handshake not finished in time");
                    registry.forget(id);
                }
            }
        });
    }
    // Stop every connection once its answer in flight is sent; wait a little for them.
    registry.stopping.cancel();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        loop {
            let ended = registry.ended.notified();
            if registry
                .conns
                .lock()
                .expect("connection registry")
                .is_empty()
            {
                break;
            }
            ended.await;
        }
    })
    .await;
}

/// HTTP/2 flow-control windows of a stdio connection: large enough that a read of many
/// megabytes is not paced by window updates crossing a slow exec channel.
pub const STDIO_STREAM_WINDOW: u32 = 8 * 1024 * 1024;
pub const STDIO_CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;

/// Serve `router` as one HTTP/2 connection over standard input and output (`agent --stdio`)
/// until the input closes or `shutdown` resolves. Requests run concurrently, as streams.
pub async fn serve_stdio(router: Router, shutdown: impl std::future::Future<Output = ()>) {
    let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        router.clone().oneshot(req.map(Body::new))
    });
    let mut builder =
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STDIO_STREAM_WINDOW)
        .initial_connection_window_size(STDIO_CONNECTION_WINDOW)
        .max_frame_size(1024 * 1024)
        .max_concurrent_streams(1024)
        // A client that vanished without closing the channel ends the agent too.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(60));
    let http = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(http);
    tokio::pin!(shutdown);
    tokio::select! {
        r = http.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "the stdio connection ended");
            }
        }
        _ = &mut shutdown => {
            http.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, http).await;
        }
    }
}

/// After an accept error: skip a connection that went away; when out of resources, give up
/// the longest-idle connection (its descriptor is what the next one needs) and back off.
async fn accept_failed(e: &std::io::Error, errors: &RateLimit, registry: &Registry) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    ) {
        return;
    }
    let evicted = registry.evict_idlest();
    if let Verdict::Log { repeats } = errors.check("accept", Instant::now()) {
        tracing::warn!(
            error = %e,
            repeats,
            "cannot accept connections for now; retrying"
        );
    }
    // A descriptor is being freed: a moment is enough. Otherwise wait for one to be.
    tokio::time::sleep(if evicted {
        EVICTION_PAUSE
    } else {
        ACCEPT_BACKOFF
    })
    .await;
}

async fn serve_connection<S>(
    stream: S,
    router: Router,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    id: u64,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let (conn, registry) = (conn.clone(), registry.clone());
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            conn.in_flight.fetch_add(1, Ordering::AcqRel);
            conn.started.fetch_add(1, Ordering::Relaxed);
            let guard = InFlight {
                conn: conn.clone(),
                registry: registry.clone(),
            };
            let router = router.clone();
            let req = req.map(|b| Body::new(ReceivedBody::new(b, conn.clone(), registry.clone())));
            async move {
                let resp = router.oneshot(req).await;
                resp.map(|r| {
                    r.map(|inner| {
                        Body::new(AnswerBody {
                            inner,
                            flight: guard,
                        })
                    })
                })
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(IDLE_TIMEOUT)
        .keep_alive(true);
    let http = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(http);
    let mut closing = false;
    loop {
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended");
                }
                break;
            }
            // Evicted: nothing is in flight, or only requests still waiting for their bodies
            // (nothing answered is cut short).
            _ = conn.evict.notified() => break,
            _ = registry.stopping.cancelled(), if !closing => {
                closing = true;
                http.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep(IDLE_CHECK), if !closing => {
                let since = conn.sending_since_ms.load(Ordering::Relaxed);
                if since != 0
                    && conn.in_flight.load(Ordering::Acquire) > 0
                    && registry.now_ms().saturating_sub(since) >= SEND_STALL_LIMIT.as_millis() as u64
                {
                    tracing::debug!("a client stopped reading its answer: connection closed");
                    break;
                }
                if conn.in_flight.load(Ordering::Acquire) == 0 {
                    let idle = Duration::from_millis(
                        registry.now_ms().saturating_sub(conn.idle_since_ms.load(Ordering::Relaxed)),
                    );
                    let limit = if conn.started.load(Ordering::Relaxed) == 0 {
                        HEADER_READ_TIMEOUT
                    } else {
                        IDLE_TIMEOUT
                    };
                    if idle >= limit {
                        break;
                    }
                }
            }
        }
    }
    registry.forget(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_half_the_free_descriptors_to_files() {
        assert_eq!(connection_cap(1_048_576, 20), MAX_CONNECTIONS);
        assert_eq!(connection_cap(1024, 20), MAX_CONNECTIONS);
        assert_eq!(connection_cap(64, 0), 32);
        assert_eq!(connection_cap(64, 16), 24);
        assert_eq!(connection_cap(3, 10), 4);
    }

    fn conn(in_flight: usize, idle_since_ms: u64) -> Arc<Conn> {
        Arc::new(Conn {
            in_flight: AtomicUsize::new(in_flight),
            started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(idle_since_ms),
            receiving: AtomicUsize::new(0),
            sending_since_ms: AtomicU64::new(0),
            body_progress_ms: AtomicU64::new(0),
            evict: Notify::new(),
        })
    }

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_stay() {
        let r = Registry {
            epoch: Instant::now(),
            conns: Mutex::new(BTreeMap::new()),
            ended: Notify::new(),
            stopping: Default::default(),
        };
        {
            let mut c = r.conns.lock().unwrap();
            c.insert(1, conn(1, 0));
            c.insert(2, conn(0, 50));
            c.insert(3, conn(0, 10));
        }
        assert!(r.make_room(4), "under the cap");
        assert!(r.make_room(3));
        let left: Vec<u64> = r.conns.lock().unwrap().keys().copied().collect();
        assert_eq!(left, vec![1, 2], "the longest idle (3) went");
        r.conns.lock().unwrap().insert(2, conn(2, 0));
        assert!(!r.make_room(2), "every connection busy: refused");
        assert_eq!(r.conns.lock().unwrap().len(), 2);
    }
}
