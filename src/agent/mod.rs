//! `sbxfs agent`: serves one workspace over HTTP (protocol: [`crate::remote::wire`]).
//!
//! Every request must carry the bearer token (compared in constant time; any path, known or
//! not, gets 401 without it and touches nothing). Every path is confined to the root by
//! [`workspace::Workspace`]. Requests are bounded: JSON bodies, read sizes, search results and
//! search time. File work runs on tokio's blocking pool so slow disks never stall the server.
//!
//! No request can take the agent down: a panic in a handler answers 500 with an error body
//! ([`harden`]) and the next request is served; recursive parsing of user input is bounded
//! (glob braces); FIFOs and devices are never opened for reading (they would block a worker).
//! Connections are bounded by [`server`] (header-read and idle timeouts, a cap); threads by
//! the cores (a grep's threads, greps at once, the blocking pool); memory per request by the
//! caps below (grep's line buffer, scan windows, read bytes in flight, streamed listings).
//! Set-ID bits are dropped from requested modes unless `--allow-setid`.

pub mod confine;
pub mod held;
pub mod identity;
pub mod server;
pub mod tls;
mod tree;
pub mod watch;
pub mod workspace;

use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::remote::wire::{
    self, ErrorBody, PatchHeader, QueryArgs, MAX_JSON_BODY_BYTES, MAX_READ_BYTES, PROTOCOL_VERSION,
    VERSION_HEADER,
};
use crate::remote::{
    FuzzyRequest, RemoteError, RemoteInfo, RemotePath, RenameMode, SetAttr, SpecialKind, WireBytes,
    XattrFlags,
};
use crate::search::beneath::Beneath;
use crate::search::cancel::Cancel;
use crate::search::grep::GrepOptions;
use crate::search::scan::ScanRequest;
use workspace::Workspace;

/// Caps on what one search may return, whatever the client asks: results stream over the
/// network, so the cap bounds the agent's work, not only the client's memory.
pub const MAX_GREP_RESULTS: u64 = 100_000;
pub const MAX_GREP_BYTES: u64 = 64 * 1024 * 1024;
pub const MAX_FUZZY_RESULTS: usize = 10_000;
pub const MAX_GLOB_RESULTS: usize = 100_000;
/// A search that runs longer than this is stopped (`truncated`) or refused (`ETIMEDOUT`);
/// `sbxfs agent --search-timeout SECS` changes it.
pub const SEARCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest file a commit may write (the body is streamed to disk, never held in memory).
pub const MAX_COMMIT_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Bytes of file data read for answers not yet sent, at most: many undrained 16 MiB reads
/// wait for earlier ones instead of each pinning 16 MiB (4 full-size reads; the mount reads
/// 128 KiB to 1 MiB at a time, so hundreds of its reads fit).
pub const MAX_READ_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;
/// Granularity of that budget (a semaphore permit is one of these).
const READ_BUDGET_UNIT: usize = 1024;
/// Largest window one `scan` answers (larger asks are clamped: the answer says where it ended,
/// so the caller pages on).
pub const MAX_SCAN_BYTES: u64 = 16 * 1024 * 1024;
/// Searches (grep) running at full width at once, per core: each runs up to a thread per core;
/// more run with one worker each (a walker, a worker and a producer: bounded by the
/// connection cap).
const SEARCHES_PER_CORE: usize = 2;
/// Bytes of a listing gathered before they are sent: a 200,000-entry directory streams in
/// pieces of this size instead of becoming one 50 MB answer.
const LISTING_CHUNK_BYTES: usize = 64 * 1024;
/// Streamed answers (grep, tree, watch) queue this many lines before the producer waits for the
/// network: enough to keep a fast link busy, small enough to stop soon after a cancel.
const STREAM_QUEUE: usize = 256;

/// Where the agent listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    /// A Unix socket (made 0600; keep it in a 0700 directory): the ssh transport's agent, which
    /// opens no TCP port in the sandbox.
    Unix(PathBuf),
    /// Standard input and output (`--stdio`): one HTTP/2 connection over the exec channel that
    /// started the agent, which is its authentication; the agent exits when its input closes.
    Stdio,
}

/// The token of an agent on its standard input and output: whoever holds the pipe started the
/// agent and is its one client, so the channel authenticates, and the token only satisfies
/// the router's check.
pub const STDIO_TOKEN: &str = "stdio-channel";

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "http://{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Stdio => write!(f, "stdio"),
        }
    }
}

pub struct AgentConfig {
    pub root: PathBuf,
    pub listen: ListenAddr,
    pub token: Vec<u8>,
    /// Exit once no client has been connected for this long (a deployed agent outlives its
    /// mount so the next one reuses it, but not forever).
    pub idle_exit: Option<Duration>,
    /// How long one grep, glob, fuzzy or scan may run ([`SEARCH_TIMEOUT`] by default).
    pub search_timeout: Duration,
    /// How far Landlock confines the process ([`confine::confine`], applied before the
    /// runtime's threads start): logged at start and reported by `/v1/info`.
    pub confinement: confine::Confinement,
    /// Keep set-ID bits requests ask for ([`Workspace::allow_setid`]).
    pub allow_setid: bool,
    /// Serve https with this ([`tls::acceptor`], loaded before Landlock applies).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The workspace's id ([`identity::workspace_id`], read before Landlock applies).
    pub workspace_id: Option<String>,
}

/// Blocking-pool threads per core: file work waits on disks, so a few per core keep them
/// busy; the bound keeps a flood of requests from growing threads until the pids limit.
const BLOCKING_THREADS_PER_CORE: usize = 4;

/// Cores the agent uses: the cap on a search's threads and the unit of the thread bounds.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The agent's tokio runtime: the blocking pool bounded ([`BLOCKING_THREADS_PER_CORE`]);
/// work beyond it queues.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS_PER_CORE * cores())
        .build()
}

/// Counters the agent keeps (GET /v1/stats): tests and operators see what it did.
#[derive(Default, Serialize)]
pub struct AgentStats {
    pub requests: AtomicU64,
    /// Authorised requests about the workspace: all but `info`, `stats` and `watch` (what a
    /// mount's warm commands must not cost).
    pub workspace_requests: AtomicU64,
    /// Of which metadata reads: `stat`, `list` and `tree` (what browsing a tree costs).
    pub metadata_requests: AtomicU64,
    pub unauthorized: AtomicU64,
    pub commits: AtomicU64,
    pub conflicts: AtomicU64,
    pub greps_started: AtomicU64,
    pub greps_completed: AtomicU64,
    /// Searches stopped because the client went away (or cancelled) before the end.
    pub greps_cancelled: AtomicU64,
    /// Globs, fuzzy searches and scans stopped because the client went away or their
    /// deadline passed.
    pub searches_cancelled: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_committed: AtomicU64,
}

struct App {
    ws: Arc<Workspace>,
    feed: Option<watch::ChangeFeed>,
    token: Vec<u8>,
    stats: AgentStats,
    search_timeout: Duration,
    confinement: confine::Confinement,
    workspace_id: Option<String>,
    /// Rate-limits the log line of refused requests.
    refusals: crate::lograte::RateLimit,
    /// [`MAX_READ_BYTES_IN_FLIGHT`], in [`READ_BUDGET_UNIT`]s.
    read_budget: Arc<tokio::sync::Semaphore>,
    /// [`SEARCHES_PER_CORE`] × cores.
    searches: Arc<tokio::sync::Semaphore>,
    /// [`MAX_WATCHES`]: change-feed streams at once.
    watches: Arc<tokio::sync::Semaphore>,
}

/// Change-feed streams served at once: a mount holds one; more would let one client fill the
/// connection cap with quiet streams nobody may evict.
pub const MAX_WATCHES: usize = 32;

/// Cancels a search when the request that started it is dropped: hyper drops a handler's
/// future when its client disconnects, so the blocking work it started stops too.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl App {
    /// A search's stop signal: the agent's deadline from now; the caller ties it to its client.
    fn search_cancel(&self) -> Cancel {
        Cancel::within(self.search_timeout)
    }

    /// After a glob, fuzzy search or scan stopped by `cancel`: count it, and say why.
    fn stopped(&self, what: &str, cancel: &Cancel) -> RemoteError {
        self.stats
            .searches_cancelled
            .fetch_add(1, Ordering::Relaxed);
        if cancel.timed_out() {
            RemoteError::TimedOut(format!(
                "{what} took longer than {} s (sbxfs agent --search-timeout)",
                self.search_timeout.as_secs()
            ))
        } else {
            tracing::info!("{what} ended early: the client went away");
            RemoteError::Io(String::new(), format!("{what} cancelled"))
        }
    }
}

type Shared = Arc<App>;

/// An error answer: the status code and `{"error", "message"}` body of the protocol.
struct ApiError(RemoteError);

impl From<RemoteError> for ApiError {
    fn from(e: RemoteError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(wire::status_for(&self.0))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(ErrorBody::from_error(&self.0))).into_response()
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

/// Run blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::remote::Result<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RemoteError::Io(String::new(), format!("worker failed: {e}")))?
        .map_err(ApiError)
}

/// `op` (a namespace change: `made`), for the request's client: recorded first, so the feed
/// reports its events as that client's own ([`watch::Authors`]), and withdrawn if it fails.
async fn as_author<T: Send + 'static>(
    app: &Shared,
    headers: &HeaderMap,
    made: Vec<watch::Made>,
    op: impl FnOnce() -> crate::remote::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let Some(client) = client_of(headers) else {
        return blocking(op).await;
    };
    let authors = app.ws.authors();
    for m in &made {
        authors.record_made(m.clone(), client);
    }
    let r = blocking(op).await;
    if r.is_err() {
        for m in &made {
            authors.take_made(m);
        }
    }
    r
}

async fn require_token(State(app): State<Shared>, req: Request, next: Next) -> Response {
    app.stats.requests.fetch_add(1, Ordering::Relaxed);
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if bool::from(presented.ct_eq(&app.token)) && !app.token.is_empty() {
        if !matches!(req.uri().path(), "/v1/info" | "/v1/stats" | "/v1/watch") {
            app.stats.workspace_requests.fetch_add(1, Ordering::Relaxed);
        }
        return next.run(req).await;
    }
    app.stats.unauthorized.fetch_add(1, Ordering::Relaxed);
    // Debug, once a minute with a count: a probe must not flood the log (nor fill the disk).
    if let crate::lograte::Verdict::Log { repeats } = app
        .refusals
        .check("unauthorized", std::time::Instant::now())
    {
        tracing::debug!(
            path = %req.uri().path(),
            repeats,
            "refused a request without a valid token"
        );
    }
    let mut resp = ApiError(RemoteError::Unauthorized(
        "a valid bearer token is required".into(),
    ))
    .into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// Build the agent's HTTP service over a workspace.
pub fn router(
    ws: Arc<Workspace>,
    feed: Option<watch::ChangeFeed>,
    token: Vec<u8>,
    search_timeout: Duration,
    confinement: confine::Confinement,
    workspace_id: Option<String>,
) -> Router {
    let app: Shared = Arc::new(App {
        ws,
        feed,
        token,
        stats: AgentStats::default(),
        search_timeout,
        confinement,
        workspace_id,
        refusals: crate::lograte::RateLimit::new(),
        read_budget: Arc::new(tokio::sync::Semaphore::new(
            MAX_READ_BYTES_IN_FLIGHT / READ_BUDGET_UNIT,
        )),
        searches: Arc::new(tokio::sync::Semaphore::new(SEARCHES_PER_CORE * cores())),
        watches: Arc::new(tokio::sync::Semaphore::new(MAX_WATCHES)),
    });
    let json_limit = DefaultBodyLimit::max(MAX_JSON_BODY_BYTES);
    let router = Router::new()
        .route("/v1/info", get(info))
        .route("/v1/stats", get(stats))
        .route("/v1/stat", get(stat))
        .route("/v1/stat_many", post(stat_many).layer(json_limit))
        .route("/v1/list", get(list))
        .route("/v1/tree", get(tree))
        .route("/v1/read", get(read))
        .route("/v1/commit", put(commit).layer(DefaultBodyLimit::disable()))
        .route("/v1/create", post(create))
        .route("/v1/mkdir", post(mkdir))
        .route("/v1/unlink", post(unlink))
        .route("/v1/rmdir", post(rmdir))
        .route("/v1/rename", post(rename))
        .route("/v1/symlink", post(symlink))
        .route("/v1/readlink", get(readlink))
        .route("/v1/setattr", post(setattr).layer(json_limit))
        .route("/v1/statfs", get(statfs))
        .route("/v1/scan", post(scan).layer(json_limit))
        .route("/v1/grep", post(grep).layer(json_limit))
        .route("/v1/glob", post(glob).layer(json_limit))
        .route("/v1/fuzzy", post(fuzzy).layer(json_limit))
        .route("/v1/edit", post(edit).layer(json_limit))
        .route("/v1/mknod", post(mknod))
        .route("/v1/link", post(link))
        .route("/v1/getxattr", get(getxattr))
        .route("/v1/listxattr", get(listxattr))
        .route("/v1/setxattr", post(setxattr).layer(json_limit))
        .route("/v1/removexattr", post(removexattr))
        .route("/v1/fallocate", post(fallocate))
        .route("/v1/copy_range", post(copy_range))
        .route("/v1/watch", get(watch_feed))
        .fallback(|| async { ApiError(RemoteError::NotFound("no such endpoint".into())) })
        .layer(middleware::from_fn_with_state(app.clone(), require_token));
    harden(router).with_state(app)
}

/// The outermost layer: a panic anywhere below answers 500 with the protocol's error body
/// (token `EIO`) instead of dropping the connection, and the agent goes on serving. (Work on
/// the blocking pool is already caught by its join handle; this covers the async side.)
fn harden<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router.layer(middleware::from_fn(catch_panics))
}

async fn catch_panics(req: Request, next: Next) -> Response {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(panic) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(ErrorBody::from_error(&panic_error(panic.as_ref()))),
        )
            .into_response(),
    }
}

/// The error a panic answers (logged: it is a bug).
fn panic_error(panic: &(dyn std::any::Any + Send)) -> RemoteError {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!(
        panic = what,
        "a request handler panicked; the agent goes on"
    );
    RemoteError::Io(
        String::new(),
        format!("the agent failed on this request (a bug): {what}"),
    )
}

/// Run a streamed answer's producer so that a panic in it ends the stream with an error line
/// like any other failure (the client would otherwise see the stream stop early).
fn unpanic<T>(f: impl FnOnce() -> crate::remote::Result<T>) -> crate::remote::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(panic_error(panic.as_ref())))
}

/// Serve until SIGTERM or SIGINT; prints one line when ready.
pub async fn serve(cfg: AgentConfig) -> anyhow::Result<()> {
    workspace::set_exact_modes();
    let nofile = server::raise_nofile_limit();
    let ws = Arc::new(
        Workspace::open(&cfg.root)
            .with_context(|| format!("--root {}", cfg.root.display()))?
            .allow_setid(cfg.allow_setid),
    );
    let sweeper = ws.clone();
    tokio::task::spawn_blocking(move || {
        let n = sweeper.sweep_stale_temps();
        if n > 0 {
            tracing::info!(
                removed = n,
                "removed stale temp files left by an interrupted commit"
            );
        }
    });
    // Files held for readers are let go once idle, even when no read comes to prune them.
    let held = Arc::downgrade(&ws);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(held::HELD_IDLE / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match held.upgrade() {
                Some(ws) => ws.prune_held(),
                None => return,
            }
        }
    });
    let feed = match watch::ChangeFeed::start(ws.root_path(), ws.authors()) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!("change feed unavailable: {e}");
            None
        }
    };
    let root_shown = ws.root_path().display().to_string();
    let router = router(
        ws,
        feed,
        cfg.token,
        cfg.search_timeout,
        cfg.confinement,
        cfg.workspace_id,
    );
    if let ListenAddr::Stdio = cfg.listen {
        // Standard output is the channel: nothing else may be printed on it.
        let shutdown = shutdown_signal()?;
        tracing::info!(root = %root_shown, landlock = cfg.confinement.as_str(), "agent ready on stdio");
        server::serve_stdio(router, shutdown).await;
        tracing::info!("agent stopped");
        return Ok(());
    }
    let (listener, addr) = listen(&cfg.listen)
        .await
        .with_context(|| match &cfg.listen {
            ListenAddr::Tcp(a) => format!("cannot listen on {a}"),
            unix => format!("cannot listen on {unix}"),
        })?;
    // Signals are caught before the ready line: a SIGTERM right after it stops the agent cleanly.
    let shutdown = shutdown_signal()?;
    let shown = match (&cfg.tls, addr.to_string()) {
        (Some(_), a) if a.starts_with("http://") => a.replacen("http://", "https://", 1),
        (_, a) => a,
    };
    tracing::info!(
        addr = %shown,
        root = %root_shown,
        landlock = cfg.confinement.as_str(),
        "agent ready"
    );
    println!("sbxfs agent listening on {} root={}", shown, root_shown);
    use std::io::Write;
    std::io::stdout().flush()?;
    let cap = server::connection_cap(nofile, server::open_descriptors());
    server::serve(listener, router, cap, cfg.tls, cfg.idle_exit, shutdown).await;
    if let ListenAddr::Unix(path) = &cfg.listen {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// Bind `at`; answers the listener and the address it ended up on (port 0 picks one). A Unix
/// socket left by an agent that is gone is replaced; one another agent answers on is not.
async fn listen(at: &ListenAddr) -> std::io::Result<(server::Listener, ListenAddr)> {
    match at {
        ListenAddr::Tcp(a) => {
            let l = tokio::net::TcpListener::bind(a).await?;
            let addr = ListenAddr::Tcp(l.local_addr()?);
            Ok((server::Listener::Tcp(l), addr))
        }
        ListenAddr::Stdio => Err(std::io::Error::other("stdio is not a socket")),
        ListenAddr::Unix(path) => {
            use std::os::unix::fs::{FileTypeExt, PermissionsExt};
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if !meta.file_type().is_socket() {
                    return Err(std::io::Error::other("exists and is not a socket"));
                }
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(std::io::Error::other("another agent answers on it"));
                }
                std::fs::remove_file(path)?;
            }
            let l = tokio::net::UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok((server::Listener::Unix(l), at.clone()))
        }
    }
}

/// Resolves on SIGTERM or SIGINT; the handlers are installed when this is called.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

fn args(q: &Option<String>) -> QueryArgs {
    QueryArgs::parse(q.as_deref())
}

async fn info(State(app): State<Shared>) -> Json<RemoteInfo> {
    Json(RemoteInfo {
        protocol: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        root: app.ws.root_path().display().to_string(),
        user: Some(crate::remote::Identity::of_this_process()),
        landlock: Some(app.confinement.as_str().to_string()),
        tree_formats: vec![crate::remote::treepack::FORMAT.to_string()],
        commit_absent: true,
        capabilities: Default::default(),
        workspace_id: app.workspace_id.clone(),
    })
}

async fn stats(State(app): State<Shared>) -> Json<serde_json::Value> {
    Json(serde_json::to_value(&app.stats).unwrap_or_default())
}

async fn stat(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    app.stats.metadata_requests.fetch_add(1, Ordering::Relaxed);
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    Ok(Json(blocking(move || ws.stat(&path)).await?).into_response())
}

/// Several paths' attributes in one answer, each path's outcome in order (a bad or missing
/// path is its own error, not the request's).
async fn stat_many(
    State(app): State<Shared>,
    Json(body): Json<wire::StatManyBody>,
) -> ApiResult<Response> {
    let paths: Vec<crate::remote::Result<RemotePath>> = body
        .paths
        .into_iter()
        .map(|p| RemotePath::new(p.0))
        .collect();
    if paths.len() > crate::remote::MAX_STAT_MANY {
        return Err(RemoteError::Invalid(format!(
            "{} paths in one batched stat: at most {}",
            paths.len(),
            crate::remote::MAX_STAT_MANY
        ))
        .into());
    }
    let ws = app.ws.clone();
    let results = blocking(move || {
        Ok(paths
            .into_iter()
            .map(|p| match p.and_then(|p| ws.stat(&p)) {
                Ok(attr) => wire::StatOutcome::Attr { attr },
                Err(e) => wire::StatOutcome::Error(ErrorBody::from_error(&e)),
            })
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(Json(json!({ "results": results })).into_response())
}

/// A directory's entries as `{"entries": [...]}`, streamed in pieces of about
/// [`LISTING_CHUNK_BYTES`] as they are read (the answer is the same JSON as one built whole).
/// An error after the first piece ends the body short, so the client sees a broken answer,
/// never a listing silently cut.
async fn list(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    app.stats.metadata_requests.fetch_add(1, Ordering::Relaxed);
    let path = args(&q).path("path")?;
    // Fail before streaming when the directory itself is wrong, so the status says so.
    let ws = app.ws.clone();
    let p = path.clone();
    blocking(move || ws.open_dir(&p).map(|_| ())).await?;
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
    let ws = app.ws.clone();
    producer(move || {
        let mut piece = b"{\"entries\":[".to_vec();
        let mut first = true;
        let result = unpanic(|| {
            ws.list_each(&path, &mut |e| {
                if !first {
                    piece.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut piece, &e).expect("serialisable");
                if piece.len() < LISTING_CHUNK_BYTES {
                    return true;
                }
                tx.blocking_send(Ok(Bytes::from(std::mem::take(&mut piece))))
                    .is_ok()
            })
        });
        let last = match result {
            Ok(()) => {
                piece.extend_from_slice(b"]}");
                Ok(Bytes::from(piece))
            }
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let _ = tx.blocking_send(last);
    })?;
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Start a streamed answer's producer on a thread of its own, not the bounded blocking pool:
/// a client that stops reading parks its producer, and parked producers must not starve every
/// other request of workers (their number is bounded by the connection cap instead). A thread
/// the system refuses answers an error.
fn producer(f: impl FnOnce() + Send + 'static) -> ApiResult<()> {
    std::thread::Builder::new()
        .name("sbxfs-stream".into())
        .spawn(f)
        .map(drop)
        .map_err(|e| {
            ApiError(RemoteError::Io(
                String::new(),
                format!("the agent cannot start a thread now ({e}); try again later"),
            ))
        })
}

/// A streamed answer of JSON lines fed by a blocking producer; the producer sees `false` from
/// `send` once the client has gone away.
fn line_stream(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

fn json_line<T: Serialize>(v: &T) -> Bytes {
    let mut line = serde_json::to_vec(v).expect("serialisable");
    line.push(b'\n');
    Bytes::from(line)
}

async fn tree(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    app.stats.metadata_requests.fetch_add(1, Ordering::Relaxed);
    let a = args(&q);
    let path = a.path("path")?;
    // Fail before streaming when the directory itself is wrong, so the status says so.
    let ws = app.ws.clone();
    let p = path.clone();
    blocking(move || ws.open_dir(&p).map(|_| ())).await?;
    if a.bytes("format") == Some(crate::remote::treepack::FORMAT.as_bytes()) {
        let most = crate::remote::listings::MAX_TREE_ENTRIES;
        let max = a.number::<usize>("max")?.unwrap_or(most).min(most);
        let asked = |param| a.bytes(param) == Some(&b"1"[..]);
        let trailer = crate::remote::treepack::Trailer {
            xattrs: asked(crate::remote::treepack::XATTRS_PARAM),
            born: asked(crate::remote::treepack::BORN_PARAM),
        };
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let ws = app.ws.clone();
        producer(move || {
            let _ = unpanic(|| {
                tree::packed(&ws, &path, max, trailer, &mut |chunk| {
                    tx.blocking_send(Bytes::from(chunk)).is_ok()
                });
                Ok(())
            });
        })?;
        let mut resp = line_stream(rx);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::remote::treepack::CONTENT_TYPE),
        );
        return Ok(resp);
    }
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let ws = app.ws.clone();
    producer(move || {
        let mut count = 0u64;
        let result = unpanic(|| {
            ws.tree(&path, &mut |e| {
                count += 1;
                tx.blocking_send(json_line(&e)).is_ok()
            })
        });
        let end = match result {
            Ok(()) => json!({ "end": count }),
            Err(e) => json!({ "end": count, "error": ErrorBody::from_error(&e) }),
        };
        let _ = tx.blocking_send(json_line(&end));
    })?;
    Ok(line_stream(rx))
}

async fn read(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let a = args(&q);
    let path = a.path("path")?;
    let offset: u64 = a.number("offset")?.unwrap_or(0);
    let len: u32 = a.number("len")?.unwrap_or(MAX_READ_BYTES);
    if len > MAX_READ_BYTES {
        return Err(
            RemoteError::TooLarge(format!("reads are limited to {MAX_READ_BYTES} bytes")).into(),
        );
    }
    // The answer's bytes are reserved before they are read and released once sent (or
    // dropped): reads whose answers are not taken wait instead of piling up in memory.
    let units = (len as usize).div_ceil(READ_BUDGET_UNIT).max(1) as u32;
    let reserved = app
        .read_budget
        .clone()
        .acquire_many_owned(units)
        .await
        .map_err(|_| RemoteError::Io(String::new(), "the agent is stopping".into()))?;
    let held = a.text("held")?.map(crate::remote::Version);
    let ws = app.ws.clone();
    let (data, version) = blocking(move || match held {
        Some(v) => ws.read_held(&path, offset, len, &v),
        None => ws.read(&path, offset, len),
    })
    .await?;
    app.stats
        .bytes_read
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    let mut resp = Response::new(server::paced_body(Bytes::from(data), reserved));
    resp.headers_mut().insert(
        VERSION_HEADER,
        HeaderValue::from_str(&version.0).expect("versions are ASCII"),
    );
    Ok(resp)
}

/// The client a request names ([`wire::CLIENT_HEADER`]); none, or one not in its form: nobody.
fn client_of(headers: &HeaderMap) -> Option<u64> {
    wire::parse_client_id(headers.get(wire::CLIENT_HEADER)?.as_bytes())
}

async fn commit(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let a = args(&q);
    let path = a.path("path")?;
    let base = a.text("base")?.map(crate::remote::Version);
    let create_mode: Option<u32> = a.number("mode")?;
    let mtime_ns: Option<i64> = a.number("mtime")?;
    let atime_ns: Option<i64> = a.number("atime")?;
    let patch = a.flag("patch");
    let mut stream = body.into_data_stream();
    // A patch's header says how much of the base to copy (its cut): read it first.
    let header = if patch {
        Some(read_patch_header(&mut stream).await?)
    } else {
        None
    };
    let ws = app.ws.clone();
    let target = {
        let (ws, p) = (ws.clone(), path.clone());
        blocking(move || ws.commit_target(&p)).await?
    };
    let _serial = app.ws.commit_lock(&target).lock().await;
    let prepared = {
        let (ws, t, b) = (ws.clone(), target.clone(), base.clone());
        let copy_base = header.as_ref().map(|(h, _)| h.cut);
        blocking(move || ws.prepare_commit(&t, b, create_mode, copy_base)).await
    };
    let mut prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            if matches!(e.0, RemoteError::Conflict { .. }) {
                app.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            // Drained with the file's commit lock released: a refused commit never holds up
            // the others.
            drop(_serial);
            drain_body(&mut stream).await;
            return Err(e);
        }
    };
    prepared.set_times(atime_ns, mtime_ns);
    prepared.set_author(client_of(&headers));
    let temp = prepared
        .temp
        .try_clone()
        .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
    let written = match header {
        Some((header, rest)) => write_patch(temp, header, rest, &mut stream, &path).await,
        None => write_whole(temp, &mut stream, &path).await,
    };
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            // A full disk (or any failure while writing) is answered as itself, not as a
            // connection reset the client would call "did not answer".
            drop(prepared);
            drop(_serial);
            drain_body(&mut stream).await;
            return Err(e);
        }
    };
    app.stats
        .bytes_committed
        .fetch_add(written, Ordering::Relaxed);
    let result = blocking(move || ws.finish_commit(prepared)).await;
    count_commit(&app, &result);
    Ok(Json(result?).into_response())
}

fn count_commit<T>(app: &App, result: &ApiResult<T>) {
    match result {
        Ok(_) => {
            app.stats.commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(ApiError(RemoteError::Conflict { .. })) => {
            app.stats.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {}
    }
}

type BodyStream = axum::body::BodyDataStream;

/// Longest a refused commit's body is read (and dropped) before its answer goes out.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Read the rest of a refused commit's body before answering: a client still sending would
/// otherwise see its connection reset instead of the answer (and take a conflict or a full
/// disk for a network error). Bounded by the commit size cap and [`DRAIN_FOR`].
async fn drain_body(stream: &mut BodyStream) {
    let mut read = 0u64;
    let drain = async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len() as u64;
            if read > MAX_COMMIT_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
}

/// Stream a whole-file body into the temp file.
async fn write_whole(
    temp: std::fs::File,
    stream: &mut BodyStream,
    path: &RemotePath,
) -> ApiResult<u64> {
    let mut out = tokio::fs::File::from_std(temp);
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| RemoteError::Transport(format!("commit body: {e}")))?;
        written += chunk.len() as u64;
        if written > MAX_COMMIT_BYTES {
            return Err(RemoteError::TooLarge(format!(
                "commits are limited to {MAX_COMMIT_BYTES} bytes"
            ))
            .into());
        }
        out.write_all(&chunk)
            .await
            .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
    }
    out.flush()
        .await
        .map_err(|e| RemoteError::from_io(&e, &path.display()))?;
    Ok(written)
}

/// Read a patch body's first line, its [`PatchHeader`]; answers it with the bytes read past it.
async fn read_patch_header(stream: &mut BodyStream) -> ApiResult<(PatchHeader, Vec<u8>)> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let h = serde_json::from_slice(&buf[..nl])
                .map_err(|e| RemoteError::Invalid(format!("patch header: {e}")))?;
            buf.drain(..=nl);
            return Ok((h, buf));
        }
        if buf.len() > MAX_JSON_BODY_BYTES {
            return Err(RemoteError::TooLarge("patch header too long".into()).into());
        }
        match stream.next().await {
            Some(chunk) => {
                buf.extend_from_slice(&chunk.map_err(|e| RemoteError::Transport(e.to_string()))?)
            }
            None => {
                return Err(RemoteError::Invalid("patch body ends before its header".into()).into())
            }
        }
    }
}

/// Apply a patch (its header read, then each range's bytes) to the temp copy of the base,
/// which [`Workspace::prepare_commit`] already cut to `header.cut`.
async fn write_patch(
    temp: std::fs::File,
    header: PatchHeader,
    mut buf: Vec<u8>,
    stream: &mut BodyStream,
    path: &RemotePath,
) -> ApiResult<u64> {
    use std::os::unix::fs::FileExt;
    let io_err = |e: std::io::Error| ApiError(RemoteError::from_io(&e, &path.display()));
    if header.new_len > MAX_COMMIT_BYTES {
        return Err(RemoteError::TooLarge(format!(
            "commits are limited to {MAX_COMMIT_BYTES} bytes"
        ))
        .into());
    }
    for [offset, len] in &header.ranges {
        if offset
            .checked_add(*len)
            .is_none_or(|end| end > MAX_COMMIT_BYTES)
        {
            return Err(RemoteError::TooLarge(format!(
                "a patch range ends past {MAX_COMMIT_BYTES} bytes"
            ))
            .into());
        }
    }
    let temp = Arc::new(temp);
    let mut written = 0u64;
    for [offset, len] in header.ranges {
        let mut at = offset;
        let mut left = len;
        while left > 0 {
            if buf.is_empty() {
                match stream.next().await {
                    Some(chunk) => buf.extend_from_slice(
                        &chunk.map_err(|e| RemoteError::Transport(e.to_string()))?,
                    ),
                    None => {
                        return Err(RemoteError::Invalid(
                            "patch body shorter than its ranges".into(),
                        )
                        .into())
                    }
                }
            }
            let n = (left as usize).min(buf.len());
            let piece: Vec<u8> = buf.drain(..n).collect();
            let t = temp.clone();
            tokio::task::spawn_blocking(move || t.write_all_at(&piece, at))
                .await
                .map_err(|e| RemoteError::Io(String::new(), e.to_string()))?
                .map_err(io_err)?;
            at += n as u64;
            left -= n as u64;
            written += n as u64;
        }
    }
    // (An HTTP/2 body may end with an empty frame.)
    let mut more = !buf.is_empty();
    while !more {
        match stream.next().await {
            Some(Ok(chunk)) => more = !chunk.is_empty(),
            Some(Err(e)) => return Err(RemoteError::Transport(e.to_string()).into()),
            None => break,
        }
    }
    if more {
        return Err(RemoteError::Invalid("patch body longer than its ranges".into()).into());
    }
    let t = temp.clone();
    tokio::task::spawn_blocking(move || t.set_len(header.new_len))
        .await
        .map_err(|e| RemoteError::Io(String::new(), e.to_string()))?
        .map_err(io_err)?;
    Ok(written)
}

async fn create(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let (path, mode) = (a.path("path")?, a.number("mode")?.unwrap_or(0o644));
    let ws = app.ws.clone();
    let made = vec![watch::Made::Created(path.as_bytes().to_vec())];
    let attr = as_author(&app, &headers, made, move || ws.create(&path, mode)).await?;
    Ok(Json(attr).into_response())
}

async fn mkdir(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let (path, mode) = (a.path("path")?, a.number("mode")?.unwrap_or(0o755));
    let ws = app.ws.clone();
    let made = vec![watch::Made::Created(path.as_bytes().to_vec())];
    let attr = as_author(&app, &headers, made, move || ws.mkdir(&path, mode)).await?;
    Ok(Json(attr).into_response())
}

async fn unlink(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    let made = vec![watch::Made::Removed(path.as_bytes().to_vec())];
    as_author(&app, &headers, made, move || ws.unlink(&path)).await?;
    Ok(Json(json!({})).into_response())
}

async fn rmdir(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    let made = vec![watch::Made::Removed(path.as_bytes().to_vec())];
    as_author(&app, &headers, made, move || ws.rmdir(&path)).await?;
    Ok(Json(json!({})).into_response())
}

async fn rename(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let (from, to) = (a.path("path")?, a.path("to")?);
    let mode = match (a.flag("noreplace"), a.flag("exchange")) {
        (false, false) => RenameMode::Replace,
        (true, false) => RenameMode::NoReplace,
        (false, true) => RenameMode::Exchange,
        (true, true) => {
            return Err(
                RemoteError::Invalid("rename: noreplace and exchange are exclusive".into()).into(),
            )
        }
    };
    let ws = app.ws.clone();
    // inotify reports a rename as its old name removed, its new one made, and the pair. An
    // exchange's events are nobody's: each name changed, and both are checked.
    let (f, t) = (from.as_bytes().to_vec(), to.as_bytes().to_vec());
    let made = match mode {
        RenameMode::Exchange => Vec::new(),
        _ => vec![
            watch::Made::Removed(f.clone()),
            watch::Made::Created(t.clone()),
            watch::Made::Renamed { from: f, to: t },
        ],
    };
    as_author(&app, &headers, made, move || ws.rename(&from, &to, mode)).await?;
    Ok(Json(json!({})).into_response())
}

async fn mknod(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let path = a.path("path")?;
    let kind = match a.bytes("kind").unwrap_or_default() {
        b"fifo" => SpecialKind::Fifo,
        b"socket" => SpecialKind::Socket,
        b"chardevice" => SpecialKind::CharDevice,
        b"blockdevice" => SpecialKind::BlockDevice,
        other => {
            return Err(RemoteError::Invalid(format!(
                "mknod: unknown kind {:?}",
                String::from_utf8_lossy(other)
            ))
            .into())
        }
    };
    let mode: u32 = a.number("mode")?.unwrap_or(0o644);
    let rdev: u64 = a.number("rdev")?.unwrap_or(0);
    let ws = app.ws.clone();
    let made = vec![watch::Made::Created(path.as_bytes().to_vec())];
    let attr = as_author(&app, &headers, made, move || {
        ws.mknod(&path, kind, mode, rdev)
    })
    .await?;
    Ok(Json(attr).into_response())
}

async fn link(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let (existing, new) = (a.path("path")?, a.path("to")?);
    let ws = app.ws.clone();
    let made = vec![watch::Made::Created(new.as_bytes().to_vec())];
    let attr = as_author(&app, &headers, made, move || ws.link(&existing, &new)).await?;
    Ok(Json(attr).into_response())
}

fn xattr_name_arg(a: &QueryArgs) -> ApiResult<Vec<u8>> {
    a.bytes("name")
        .map(<[u8]>::to_vec)
        .ok_or_else(|| RemoteError::Invalid("an attribute name is required".into()).into())
}

async fn getxattr(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let a = args(&q);
    let (path, name) = (a.path("path")?, xattr_name_arg(&a)?);
    let ws = app.ws.clone();
    let value = blocking(move || ws.getxattr(&path, &name)).await?;
    Ok(Json(json!({ "value": WireBytes(value) })).into_response())
}

async fn listxattr(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    let names = blocking(move || ws.listxattr(&path)).await?;
    let names: Vec<WireBytes> = names.into_iter().map(WireBytes).collect();
    Ok(Json(json!({ "names": names })).into_response())
}

async fn setxattr(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(body): Json<wire::XattrBody>,
) -> ApiResult<Response> {
    let a = args(&q);
    let (path, name) = (a.path("path")?, xattr_name_arg(&a)?);
    let flags = XattrFlags {
        create: a.flag("create"),
        replace: a.flag("replace"),
    };
    let ws = app.ws.clone();
    blocking(move || ws.setxattr(&path, &name, &body.value.0, flags)).await?;
    Ok(Json(json!({})).into_response())
}

async fn removexattr(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let a = args(&q);
    let (path, name) = (a.path("path")?, xattr_name_arg(&a)?);
    let ws = app.ws.clone();
    blocking(move || ws.removexattr(&path, &name)).await?;
    Ok(Json(json!({})).into_response())
}

async fn fallocate(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let a = args(&q);
    let path = a.path("path")?;
    let offset: u64 = a.number("offset")?.unwrap_or(0);
    let len: u64 = a
        .number("len")?
        .ok_or_else(|| RemoteError::Invalid("fallocate: len is required".into()))?;
    let keep_size = a.flag("keep_size");
    let ws = app.ws.clone();
    Ok(Json(blocking(move || ws.fallocate(&path, offset, len, keep_size)).await?).into_response())
}

/// `copy_range`: an atomic commit of `to` (a copy of its base, the range copied in from `path`
/// inside the sandbox, the base checked, then the rename), serialised with `to`'s commits.
async fn copy_range(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let (src, dst) = (a.path("path")?, a.path("to")?);
    let src_offset: u64 = a.number("offset")?.unwrap_or(0);
    let dst_offset: u64 = a.number("to_offset")?.unwrap_or(0);
    let len: u64 = a
        .number("len")?
        .ok_or_else(|| RemoteError::Invalid("copy_range: len is required".into()))?;
    let base = a.text("base")?.map(crate::remote::Version);
    if dst_offset
        .checked_add(len.min(MAX_COMMIT_BYTES))
        .is_none_or(|end| end > MAX_COMMIT_BYTES)
    {
        return Err(
            RemoteError::TooLarge(format!("a copy ending past {MAX_COMMIT_BYTES} bytes")).into(),
        );
    }
    let ws = app.ws.clone();
    let target = {
        let (ws, p) = (ws.clone(), dst.clone());
        blocking(move || ws.commit_target(&p)).await?
    };
    let _serial = app.ws.commit_lock(&target).lock().await;
    let result = blocking(move || {
        let mut prepared = ws.prepare_commit(&target, base, None, Some(u64::MAX))?;
        prepared.set_author(client_of(&headers));
        let copied = ws.copy_into(&prepared, &src, src_offset, dst_offset, len)?;
        Ok((copied, ws.finish_commit(prepared)?))
    })
    .await;
    count_commit(&app, &result);
    let (copied, attr) = result?;
    app.stats
        .bytes_committed
        .fetch_add(copied, Ordering::Relaxed);
    Ok(Json(wire::CopyRangeAnswer { copied, attr }).into_response())
}

async fn symlink(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let a = args(&q);
    let path = a.path("path")?;
    let target = a.bytes("target").unwrap_or_default().to_vec();
    let ws = app.ws.clone();
    let made = vec![watch::Made::Created(path.as_bytes().to_vec())];
    let attr = as_author(&app, &headers, made, move || ws.symlink(&path, &target)).await?;
    Ok(Json(attr).into_response())
}

async fn readlink(State(app): State<Shared>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    let target = blocking(move || ws.readlink(&path)).await?;
    Ok(Json(json!({ "target": crate::remote::WireBytes(target) })).into_response())
}

async fn setattr(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(set): Json<SetAttr>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    Ok(Json(blocking(move || ws.setattr(&path, &set)).await?).into_response())
}

async fn statfs(State(app): State<Shared>) -> ApiResult<Response> {
    let ws = app.ws.clone();
    Ok(Json(blocking(move || ws.statfs()).await?).into_response())
}

async fn scan(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(req): Json<ScanRequest>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let mut req = req;
    req.validate().map_err(RemoteError::from)?;
    let (ws, app2) = (app.ws.clone(), app.clone());
    let cancel = app.search_cancel();
    let _leave = CancelOnDrop(cancel.clone());
    req.max_bytes = req.max_bytes.min(MAX_SCAN_BYTES);
    let result = blocking(move || {
        let (file, attr) = ws.open_file(&path)?;
        let scanned = crate::search::scan::scan_reader_at_until(&file, attr.size, req, &cancel);
        if cancel.is_cancelled() {
            return Err(app2.stopped("scan", &cancel));
        }
        scanned.map_err(|e| RemoteError::from_io(&e, &path.display()))
    })
    .await?;
    Ok(Json(result).into_response())
}

async fn grep(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(mut opts): Json<GrepOptions>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    // Counts and file lists cost a line per file whatever the matches: they are not capped by
    // the match limit unless asked (else `-c` would silently count at most that many).
    let per_file_only = opts
        .print
        .as_ref()
        .is_some_and(|p| !matches!(p.kind, crate::search::print::PrintKind::Lines));
    if !(per_file_only && opts.max_results.is_none()) {
        opts.max_results = Some(
            opts.max_results
                .unwrap_or(MAX_GREP_RESULTS)
                .min(MAX_GREP_RESULTS),
        );
    }
    opts.max_bytes = Some(opts.max_bytes.unwrap_or(MAX_GREP_BYTES).min(MAX_GREP_BYTES));
    // Reject a bad pattern with a status before streaming anything.
    crate::search::grep::build_matcher(&opts).map_err(RemoteError::from)?;
    let cancel = app.search_cancel();
    let ws = app.ws.clone();
    let (follow, sizes) = (opts.walk.follow, opts.walk.max_filesize.is_some());
    let search_cancel = cancel.clone();
    let (tree, root) = blocking(move || {
        let root = ws.search_root(&path)?;
        let tree = Beneath::new(ws.root_fd(), follow, search_cancel)
            .map_err(|e| RemoteError::from_io(&e, "the workspace root"))?
            .with_sizes(sizes);
        Ok((tree, root))
    })
    .await?;
    // Full width (a thread per core at most) for the first searches at once; past them one
    // worker each, so a few searches whose clients stopped reading never hold the others up.
    let turn = app.searches.clone().try_acquire_owned().ok();
    opts.threads = if turn.is_some() {
        opts.threads.min(cores())
    } else {
        1
    };
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    // The answer's body holds the receiver: once the client leaves, it is dropped and the
    // search stops at its next directory or chunk, not only at its next match.
    // The watcher's sender must not outlive the search, or the answer would never end.
    let (watcher, on_leave) = (tx.clone(), cancel.clone());
    let (finished, search_over) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = watcher.closed() => on_leave.cancel(),
            _ = search_over => {}
        }
    });
    let app2 = app.clone();
    app.stats.greps_started.fetch_add(1, Ordering::Relaxed);
    producer(move || {
        let _turn = turn;
        let gone = AtomicBool::new(false);
        let result = unpanic(|| {
            crate::search::grep::grep_beneath(&tree, root.as_bytes(), &opts, &mut |item| {
                let event = crate::remote::GrepEvent::from(item);
                let ok = !cancel.is_cancelled() && tx.blocking_send(json_line(&event)).is_ok();
                if !ok {
                    gone.store(true, Ordering::Relaxed);
                }
                ok
            })
            .map_err(RemoteError::from)
        });
        let line = match result {
            Ok(summary) => {
                json_line(&json!({ "truncated": summary.truncated, "summary": summary }))
            }
            Err(e) => json_line(&json!({ "error": ErrorBody::from_error(&e) })),
        };
        drop(finished);
        let left = gone.load(Ordering::Relaxed) && !cancel.timed_out();
        if left || tx.blocking_send(line).is_err() {
            app2.stats.greps_cancelled.fetch_add(1, Ordering::Relaxed);
            tracing::info!("grep ended early: the client went away");
        } else {
            app2.stats.greps_completed.fetch_add(1, Ordering::Relaxed);
        }
    })?;
    Ok(line_stream(rx))
}

async fn glob(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(body): Json<wire::GlobBody>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let (ws, app2) = (app.ws.clone(), app.clone());
    let cancel = app.search_cancel();
    let _leave = CancelOnDrop(cancel.clone());
    let paths = blocking(move || {
        let root = ws.resolve_relative(&path)?;
        // A literal segment may follow a symlink: resolved beneath the root only.
        let tree = Beneath::new(ws.root_fd(), true, cancel.clone())
            .map_err(|e| RemoteError::from_io(&e, "the workspace root"))?;
        let found = crate::search::glob::glob_source(&tree, root.as_bytes(), &body.pattern);
        if cancel.is_cancelled() {
            return Err(app2.stopped("glob", &cancel));
        }
        let mut paths = found?;
        paths.truncate(MAX_GLOB_RESULTS);
        Ok(paths)
    })
    .await?;
    Ok(Json(json!({ "paths": paths })).into_response())
}

async fn fuzzy(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(req): Json<FuzzyRequest>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let (ws, app2) = (app.ws.clone(), app.clone());
    let cancel = app.search_cancel();
    let _leave = CancelOnDrop(cancel.clone());
    let matches = blocking(move || {
        let root = ws.resolve_relative(&path)?;
        let walk = req.walk;
        let tree = Beneath::new(ws.root_fd(), walk.follow, cancel.clone())
            .map_err(|e| RemoteError::from_io(&e, "the workspace root"))?
            .with_sizes(walk.max_filesize.is_some());
        let limit = req
            .limit
            .unwrap_or(MAX_FUZZY_RESULTS)
            .min(MAX_FUZZY_RESULTS);
        let found = crate::search::fuzzy::fuzzy_source(
            &tree,
            root.as_bytes(),
            &req.query,
            &walk,
            Some(limit),
        );
        if cancel.is_cancelled() {
            return Err(app2.stopped("fuzzy", &cancel));
        }
        Ok(found?)
    })
    .await?;
    Ok(Json(json!({ "matches": matches })).into_response())
}

/// `edit` as a commit: read the file, replace in memory, commit it naming the version read,
/// so an edit never overwrites a change made in between.
async fn edit(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    Json(body): Json<wire::EditBody>,
) -> ApiResult<Response> {
    let path = args(&q).path("path")?;
    let ws = app.ws.clone();
    let target = {
        let (ws, p) = (ws.clone(), path.clone());
        blocking(move || ws.commit_target(&p)).await?
    };
    let _serial = app.ws.commit_lock(&target).lock().await;
    let count = blocking(move || {
        let (mut file, attr) = ws.open_file(&target).map_err(|e| match e {
            RemoteError::NotFound(m) => RemoteError::Query(crate::search::SearchError::NotFound(m)),
            // A FIFO or a device: "PATH: not a regular file".
            RemoteError::Invalid(m) => {
                RemoteError::Query(crate::search::SearchError::ReadFailed(path.display(), m))
            }
            other => other,
        })?;
        if attr.size > crate::search::edit::MAX_EDIT_FILE_BYTES {
            return Err(
                crate::search::SearchError::ReadFailed(path.display(), "too large".into()).into(),
            );
        }
        let mut bytes = Vec::new();
        // The size seen is no promise (the file may grow): never read past the limit.
        let limit = crate::search::edit::MAX_EDIT_FILE_BYTES;
        std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, limit + 1), &mut bytes)
            .map_err(|e| {
                RemoteError::from(crate::search::SearchError::ReadFailed(
                    path.display(),
                    e.to_string(),
                ))
            })?;
        if bytes.len() as u64 > limit {
            return Err(
                crate::search::SearchError::ReadFailed(path.display(), "too large".into()).into(),
            );
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            RemoteError::from(crate::search::SearchError::ReadFailed(
                path.display(),
                "not valid UTF-8".into(),
            ))
        })?;
        let (updated, count) =
            crate::search::edit::replace_in(&text, &body.old, &body.new, body.replace_all)?;
        let prepared = ws.prepare_commit(&target, Some(attr.version), None, None)?;
        std::io::Write::write_all(&mut &prepared.temp, updated.as_bytes()).map_err(|e| {
            RemoteError::from(crate::search::SearchError::WriteFailed(
                path.display(),
                e.to_string(),
            ))
        })?;
        ws.finish_commit(prepared)?;
        Ok(count)
    })
    .await?;
    app.stats.commits.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({ "count": count })).into_response())
}

async fn watch_feed(
    State(app): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let since: Option<u64> = args(&q).number("since")?;
    let me = client_of(&headers);
    // Each watcher learns only whether a change is its own, never another client's id.
    let line = move |mut ev: crate::remote::ChangeEvent| {
        ev.own = me.is_some() && ev.author == me;
        json_line(&ev)
    };
    let Some(feed) = &app.feed else {
        return Err(RemoteError::Unsupported("the change feed is not running".into()).into());
    };
    let Ok(watching) = app.watches.clone().try_acquire_owned() else {
        return Err(RemoteError::TooLarge(format!(
            "more than {MAX_WATCHES} change-feed streams at once"
        ))
        .into());
    };
    let (backlog, mut rx, start) = feed.subscribe(since);
    let (tx, out) = mpsc::channel(STREAM_QUEUE);
    tokio::spawn(async move {
        // Held until the stream ends (its client gone: the next send fails).
        let _watching = watching;
        let mut last = start;
        for ev in backlog {
            last = last.max(ev.seq);
            if tx.send(line(ev)).await.is_err() {
                return;
            }
        }
        loop {
            // A client gone ends the stream at once, even while nothing changes.
            let received = tokio::select! {
                r = rx.recv() => r,
                _ = tx.closed() => return,
            };
            let ev = match received {
                Ok(ev) if ev.seq <= last => continue,
                Ok(ev) => ev,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    crate::remote::ChangeEvent::lost(last)
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            last = last.max(ev.seq);
            if tx.send(line(ev)).await.is_err() {
                return;
            }
        }
    });
    Ok(line_stream(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_with_an_error_body_and_the_next_request_is_served() {
        let router = harden(
            Router::new()
                .route(
                    "/boom",
                    get(|| async {
                        let v: Vec<u8> = Vec::new();
                        format!("{}", v[std::hint::black_box(3)]) // out of bounds: panics
                    }),
                )
                .route("/ok", get(|| async { "fine" })),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        crate::remote::client::install_tls();
        let http = reqwest::Client::new();
        for _ in 0..2 {
            let resp = http.get(format!("{base}/boom")).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
            let err: ErrorBody = resp.json().await.unwrap();
            assert_eq!(err.error, "EIO");
            assert!(
                err.message.contains("index out of bounds"),
                "{}",
                err.message
            );
            let ok = http.get(format!("{base}/ok")).send().await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK);
            assert_eq!(ok.text().await.unwrap(), "fine");
        }
        server.abort();
    }

    #[test]
    fn a_panicking_stream_producer_ends_with_an_error_not_silently() {
        let r: crate::remote::Result<()> = unpanic(|| panic!("producer broke"));
        let e = r.unwrap_err();
        assert_eq!(e.token(), "EIO");
        assert!(e.to_string().contains("producer broke"), "{e}");
        assert_eq!(unpanic(|| Ok(7)).unwrap(), 7);
    }
}
