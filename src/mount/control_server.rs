//! The daemon side of the control socket (the protocol and the client live in
//! [`crate::control`]): one task per connection; a bad request answers an error line and never
//! stops the daemon.
//!
//! Two invariants keep a mount's control surface honest:
//! - **A live mount's socket is never replaced.** The daemon holds an exclusive `flock` on a lock
//!   file beside the socket for as long as it lives; a second daemon for the same mountpoint
//!   finds it taken and refuses to start. A socket left by a daemon that died (the lock is free,
//!   nobody listens) is stale and replaced.
//! - **Answers never wait for the sandbox unless the request is about the sandbox.** `status`
//!   and `stats` are answered from what the mount knows ([`super::health`]): they answer at once
//!   even while the sandbox hangs.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::core::FsCore;
use super::health::Health;
use crate::control::{Envelope, Request, PROTOCOL_VERSION};
use crate::remote::wire::ErrorBody;
use crate::remote::{GrepEvent, RemoteError, RemotePath};

/// Longest request line: a query, not a document (edits carry their text, hence 4 MiB).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// How long a client has to send its whole request line: a local client writes it at once,
/// so a connection still short of a line after this is stuck or hostile, and is dropped
/// (it would otherwise hold a descriptor for good).
const REQUEST_LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long accepting pauses after a failure (`EMFILE`, `ENFILE`, `ENOBUFS`): long enough
/// not to spin while descriptors are short, short enough that service resumes promptly.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What a control request is answered from.
pub struct Control {
    /// `sbxfs umount --stop-agent` asked: the daemon stops the agent as it exits.
    pub stop_agent_at_exit: std::sync::atomic::AtomicBool,
    pub core: Arc<FsCore>,
    /// Which mount this is: mountpoint, socket, remote and options (status reports it).
    pub info: serde_json::Value,
    pub health: Arc<Health>,
}

/// The mounts of this process, for the QUERY ioctl: the adapter names a mount by its `info`
/// (socket path), not by its [`Control`].
static REGISTRY: Mutex<Vec<Weak<Control>>> = Mutex::new(Vec::new());

/// Make `control` findable by [`answer_one`]; it drops out when the last `Arc` goes.
pub fn register(control: &Arc<Control>) {
    let mut r = REGISTRY.lock().expect("registry lock");
    r.retain(|w| w.strong_count() > 0);
    r.push(Arc::downgrade(control));
}

fn registered(info: &serde_json::Value) -> Option<Arc<Control>> {
    let socket = info.get("socket")?;
    REGISTRY
        .lock()
        .expect("registry lock")
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.info.get("socket") == Some(socket))
}

/// Why the control socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "{0} is the control socket of a live sbxfs daemon of this sandbox (one still pushing \
         after an unmount exits once done: wait a few seconds and mount again)"
    )]
    Live(PathBuf),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// Holds a bound control socket's lock. Dropping it removes the socket file (it is this
/// daemon's: the lock proves no one else's can be there), then the lock file while still
/// holding it (a daemon that opened it meanwhile sees it was unlinked and starts over), and
/// releases the lock.
pub struct SocketGuard {
    path: PathBuf,
    lock_path: PathBuf,
    _lock: std::fs::File,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Lock `lock_path` (exclusively, without waiting): `None` if another daemon holds it. A lock
/// taken on a file that was unlinked meanwhile (its daemon left) is retried on the new file.
fn take_lock(lock_path: &Path) -> Result<Option<std::fs::File>, BindError> {
    use std::os::unix::fs::MetadataExt;
    let io = |e| BindError::Io(lock_path.to_path_buf(), e);
    loop {
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(lock_path)
            .map_err(io)?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => return Err(io(e.into())),
        }
        let held = lock.metadata().map_err(io)?;
        match std::fs::metadata(lock_path) {
            Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => return Ok(Some(lock)),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        }
    }
}

/// Bind the socket (0600, in a 0700 directory), unless a live mount owns it.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketGuard), BindError> {
    let io = |e| BindError::Io(path.to_path_buf(), e);
    if let Some(dir) = path.parent() {
        // It may be under a world-writable `$TMPDIR`: only a real directory of ours, 0700.
        super::state::ensure_private_dir(dir).map_err(|e| BindError::Io(dir.to_path_buf(), e))?;
    }
    let lock_path = path.with_extension("lock");
    let Some(lock) = take_lock(&lock_path)? else {
        return Err(BindError::Live(path.to_path_buf()));
    };
    // Someone listening without holding the lock (a daemon from before the lock existed): live.
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(BindError::Live(path.to_path_buf()));
    }
    // Whatever is left there is stale: its daemon is gone.
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "replaced a stale control socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    let guard = SocketGuard {
        path: path.to_path_buf(),
        lock_path,
        _lock: lock,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok((listener, guard))
}

/// Serve connections until the runtime stops. A failed `accept` (out of descriptors, most
/// likely) pauses and tries again: the socket keeps serving once descriptors are free.
pub async fn serve(listener: UnixListener, control: Arc<Control>) {
    let owner = rustix::process::getuid().as_raw();
    let mut failures = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Logged on the first failure of a run and every 100th after, not 10 per second.
                if failures.is_multiple_of(100) {
                    tracing::warn!("control socket: accept failed ({e}); retrying");
                }
                failures += 1;
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        failures = 0;
        let control = control.clone();
        tokio::spawn(async move {
            let allowed = stream
                .peer_cred()
                .is_ok_and(|c| c.uid() == owner || c.uid() == 0);
            if !allowed {
                let mut s = stream;
                // Read the request line first, so the refusal reaches a client still sending.
                let mut scratch = [0u8; 4096];
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    tokio::io::AsyncReadExt::read(&mut s, &mut scratch),
                )
                .await;
                let _ = s
                    .write_all(&line(&json!({"error": "EACCES", "message": "only the mount's owner may use its control socket"})))
                    .await;
                return;
            }
            handle(stream, &control).await;
        });
    }
}

fn line(v: &serde_json::Value) -> Vec<u8> {
    let mut l = serde_json::to_vec(v).expect("serialisable");
    l.push(b'\n');
    l
}

fn error_line(e: &RemoteError) -> Vec<u8> {
    line(&json!(ErrorBody::from_error(e)))
}

async fn handle(stream: UnixStream, control: &Control) {
    let core = &control.core;
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(
        read,
        MAX_REQUEST_BYTES as u64,
    ));
    let mut buf = Vec::new();
    let read = tokio::time::timeout(REQUEST_LINE_TIMEOUT, reader.read_until(b'\n', &mut buf));
    let Ok(read) = read.await else {
        let _ = write
            .write_all(&error_line(&RemoteError::TimedOut(format!(
                "no complete request line within {} s",
                REQUEST_LINE_TIMEOUT.as_secs()
            ))))
            .await;
        return;
    };
    if read.is_err() || !buf.ends_with(b"\n") {
        let _ = write
            .write_all(&error_line(&RemoteError::TooLarge(
                "request line missing or too long".into(),
            )))
            .await;
        return;
    }
    let env: Envelope = match serde_json::from_slice(&buf) {
        Ok(e) => e,
        Err(e) => {
            let _ = write
                .write_all(&error_line(&RemoteError::Invalid(format!(
                    "bad request: {e}"
                ))))
                .await;
            return;
        }
    };
    if env.v != PROTOCOL_VERSION {
        let _ = write
            .write_all(&error_line(&RemoteError::Invalid(format!(
                "protocol version {} is not {PROTOCOL_VERSION}",
                env.v
            ))))
            .await;
        return;
    }
    let remote = core.remote().clone();
    let path = |w: crate::remote::WireBytes| RemotePath::new(w.0);
    let answer: Result<serde_json::Value, RemoteError> = match env.request {
        Request::Grep { path: p, options } => {
            let p = match path(p) {
                Ok(p) => p,
                Err(e) => {
                    let _ = write.write_all(&error_line(&e)).await;
                    return;
                }
            };
            // Unpushed local writes go first, so the sandbox answers about what the user sees.
            let _ = core.flush_all().await;
            let gone = client_gone(&mut reader);
            tokio::pin!(gone);
            let hung = control.health.hung();
            tokio::pin!(hung);
            let started = tokio::select! {
                s = remote.grep(&p, options) => s,
                e = &mut hung => Err(e),
            };
            match started {
                Ok(mut stream) => loop {
                    // A client gone (a search with nothing to print for a while never learns
                    // it from a write): dropping the stream cancels the search in the sandbox.
                    let item = tokio::select! {
                        item = stream.next() => item,
                        _ = &mut gone => return,
                        e = &mut hung => {
                            let _ = write.write_all(&error_line(&e)).await;
                            return;
                        }
                    };
                    let Some(item) = item else { return };
                    {
                        let l = match item {
                            Ok(event) => line(&json!(event)),
                            Err(e) => error_line(&e),
                        };
                        // A client gone: dropping the stream cancels the search in the sandbox.
                        if write.write_all(&l).await.is_err() {
                            return;
                        }
                    }
                },
                Err(e) => Err(e),
            }
        }
        Request::Watch { path: p, since } => {
            watch(core, &p.0, since, &mut reader, &mut write).await;
            return;
        }
        // A query whose client left is dropped (cancelled in the sandbox); requests that
        // change something (edit, flush) are seen through.
        query @ (Request::Glob { .. } | Request::Fuzzy { .. } | Request::Scan { .. }) => {
            tokio::select! {
                a = answer(control, query) => a,
                _ = client_gone(&mut reader) => return,
            }
        }
        other => answer(control, other).await,
    };
    let l = match answer {
        Ok(v) => line(&v),
        Err(e) => error_line(&e),
    };
    let _ = write.write_all(&l).await;
}

/// `sbxfs watch`: the sandbox's changes under `under`, kept ones after `since` first, until
/// the client goes.
async fn watch(
    core: &crate::mount::core::FsCore,
    under: &[u8],
    since: Option<u64>,
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    write: &mut (impl tokio::io::AsyncWrite + Unpin),
) {
    use tokio::sync::broadcast::error::RecvError;
    let under = String::from_utf8_lossy(under).into_owned();
    let wanted = |s: &crate::mount::echo::Seen| {
        let within = |p: &str| {
            under.is_empty()
                || p == under
                || p.strip_prefix(&under).is_some_and(|r| r.starts_with('/'))
        };
        within(&s.path) || s.to.as_deref().is_some_and(within)
    };
    let (kept, mut rx) = core.echoes().subscribe(since);
    let mut last = since.unwrap_or_else(|| core.echoes().last_seq());
    let mut out = Vec::new();
    match kept {
        Ok(kept) => {
            for s in kept.iter().filter(|s| wanted(s)) {
                out.extend(line(&json!(s)));
            }
            last = kept.last().map_or(last, |s| s.seq);
        }
        // A number this mount never gave: from before a remount. How much was missed is
        // unknown; what comes now is live.
        Err(_) if since.is_some_and(|s| s > core.echoes().last_seq()) => {
            last = core.echoes().last_seq();
            out.extend(line(&json!({ "lost": null, "restarted": true })));
        }
        Err(first) => {
            out.extend(line(&json!({ "lost": first.saturating_sub(last + 1) })));
            last = first - 1;
        }
    }
    if write.write_all(&out).await.is_err() {
        return;
    }
    let gone = client_gone(reader);
    tokio::pin!(gone);
    loop {
        let next = tokio::select! {
            n = rx.recv() => n,
            _ = &mut gone => return,
        };
        let l = match next {
            Ok(s) if s.seq <= last => continue,
            Ok(s) => {
                last = s.seq;
                if !wanted(&s) {
                    continue;
                }
                line(&json!(s))
            }
            Err(RecvError::Lagged(n)) => line(&json!({ "lost": n })),
            Err(RecvError::Closed) => return,
        };
        if write.write_all(&l).await.is_err() {
            return;
        }
    }
}

/// Resolves when the client has closed its end (it sends nothing after its request line):
/// killed, interrupted, or its reader gone.
async fn client_gone(reader: &mut (impl tokio::io::AsyncRead + Unpin)) {
    let mut buf = [0u8; 256];
    while let Ok(n) = tokio::io::AsyncReadExt::read(reader, &mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// Answer a request for the QUERY ioctl, which knows its mount by `info`.
pub async fn answer_one(
    core: &Arc<FsCore>,
    info: &serde_json::Value,
    request: Request,
) -> Result<serde_json::Value, RemoteError> {
    match registered(info) {
        Some(control) => answer(&control, request).await,
        // Not started by `mount::run` (no probe): reachability is unknown, and said so.
        None => {
            let control = Control {
                stop_agent_at_exit: Default::default(),
                core: core.clone(),
                info: info.clone(),
                health: Arc::new(Health::default()),
            };
            let mut v = answer(&control, request).await?;
            if v.get("reachable").is_some() {
                v["reachable"] = serde_json::Value::Null;
            }
            Ok(v)
        }
    }
}

/// Answer a request that has one answer (everything but grep's stream): shared by the socket
/// and the QUERY ioctl. A query is given up once the sandbox stops answering the mount's
/// probe ([`Health::hung`]); a request that changes something (edit, flush) is seen through.
pub async fn answer(control: &Control, request: Request) -> Result<serde_json::Value, RemoteError> {
    match request {
        Request::Grep { .. }
        | Request::Glob { .. }
        | Request::Fuzzy { .. }
        | Request::Scan { .. } => {
            tokio::select! {
                a = answer_now(control, request) => a,
                e = control.health.hung() => Err(e),
            }
        }
        _ => answer_now(control, request).await,
    }
}

async fn answer_now(control: &Control, request: Request) -> Result<serde_json::Value, RemoteError> {
    let core = &control.core;
    let remote = core.remote().clone();
    let path = |w: crate::remote::WireBytes| RemotePath::new(w.0);
    match request {
        Request::Watch { .. } => Err(RemoteError::Invalid(
            "watch is a stream: ask the control socket".into(),
        )),
        Request::Grep { path: p, options } => {
            // Collected whole: for the ioctl, whose answer must fit its buffer anyway.
            let p = path(p)?;
            let _ = core.flush_all().await;
            let mut stream = remote.grep(&p, options).await?;
            let (mut matches, mut printed) = (Vec::new(), Vec::new());
            while let Some(item) = stream.next().await {
                match item? {
                    GrepEvent::Match(m) => matches.push(m),
                    GrepEvent::Printed(p) => printed.push(p),
                    GrepEvent::Summary { summary, truncated } => {
                        let mut v = json!({ "matches": matches, "summary": summary, "truncated": truncated });
                        if !printed.is_empty() {
                            v["printed"] = json!(printed);
                        }
                        return Ok(v);
                    }
                }
            }
            Err(RemoteError::Transport("the grep answer ended early".into()))
        }
        // Every query waits for the queued pushes: a file closed a moment ago is found.
        Request::Glob { path: p, pattern } => match path(p) {
            Ok(p) => {
                let _ = core.flush_all().await;
                remote
                    .glob(&p, &pattern)
                    .await
                    .map(|paths| json!({ "paths": paths }))
            }
            Err(e) => Err(e),
        },
        Request::Fuzzy { path: p, request } => match path(p) {
            Ok(p) => {
                let _ = core.flush_all().await;
                remote
                    .fuzzy(&p, request)
                    .await
                    .map(|m| json!({ "matches": m }))
            }
            Err(e) => Err(e),
        },
        Request::Scan { path: p, request } => match path(p) {
            Ok(p) => {
                let _ = core.flush_all().await;
                remote.scan(&p, request).await.map(|r| json!(r))
            }
            Err(e) => Err(e),
        },
        Request::Edit {
            path: p,
            old,
            new,
            replace_all,
        } => match path(p) {
            Ok(p) => {
                let _ = core.flush_all().await;
                let r = remote.edit(&p, &old, &new, replace_all).await;
                // The file changed under the mount's caches and the kernel's: drop them (the
                // edit replaced it: the name leads to another sandbox inode now).
                core.invalidate_path(&p);
                core.kernel_settled().await;
                r.map(|count| json!({ "count": count }))
            }
            Err(e) => Err(e),
        },
        // From what the mount knows: these answer at once, even while the sandbox hangs.
        Request::Stats => Ok(json!({
            "cache_hit_ratio": core.cache_hit_ratio(),
            "stats": core.stats_json(),
            "pending_commits": core.pending_count(),
            "remote_round_trip_ms": control.health.round_trip_ms(),
            "echoes": json!(&core.echoes().stats),
        })),
        Request::Flush => {
            let failures = core.flush_all().await;
            Ok(json!({
                "flushed": failures.is_empty(),
                "new_conflicts": core.conflict_copies_unreported(),
                "failures": failures.iter().map(|(p, e)| json!({"path": p, "error": e.to_string()})).collect::<Vec<_>>(),
                "conflicts": core.conflict_copies(),
                "kept_from_earlier": core.kept_from_earlier(),
                "staging": core.config().staging_dir.display().to_string(),
                "pid": std::process::id(),
            }))
        }
        Request::StopAgent => {
            control
                .stop_agent_at_exit
                .store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(json!({ "stop_agent": "at exit" }))
        }
        Request::Invalidate { path: p } => match path(p) {
            Ok(p) => {
                core.invalidate_path(&p);
                core.kernel_settled().await;
                Ok(json!({ "invalidated": p.display() }))
            }
            Err(e) => Err(e),
        },
        Request::Readlink { path: p } => {
            let p = path(p)?;
            let raw = remote.readlink(&p).await?;
            let shown = core.shown_target(&p, &raw);
            Ok(
                json!({ "target": crate::remote::WireBytes(raw), "shown": crate::remote::WireBytes(shown) }),
            )
        }
        Request::Status => {
            let mut v = control.health.snapshot();
            v["mount"] = control.info.clone();
            v["pending_commits"] = json!(core.pending_count());
            v["unpushed"] = json!(core.has_unpushed());
            v["push_failures"] = json!(core.push_failures());
            v["queued_pushes"] = json!(core.queued_pushes());
            v["files"] = json!(core
                .file_stages()
                .into_iter()
                .map(|(path, state)| json!({"path": path, "state": state}))
                .collect::<Vec<_>>());
            v["conflicts"] = json!(core.conflict_copies());
            v["kept_from_earlier"] = json!(core.kept_from_earlier());
            v["staging"] = json!(core.config().staging_dir.display().to_string());
            v["pid"] = json!(std::process::id());
            v["stats"] = core.stats_json();
            v["feed"] = core.feed_status();
            Ok(v)
        }
    }
}
