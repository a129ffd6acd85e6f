//! The daemon side of the control socket: one task per connection, a bad request answers an
//! error line and never stops the daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::{Envelope, Request, PROTOCOL_VERSION};
use crate::mount::core::FsCore;
use crate::remote::wire::ErrorBody;
use crate::remote::{GrepEvent, RemoteError, RemotePath};

/// Longest request line: a query, not a document (edits carry their text, hence 4 MiB).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Bind the socket (0600, in a 0700 directory) and serve it.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub async fn serve(listener: UnixListener, core: Arc<FsCore>, info: serde_json::Value) {
    let owner = rustix::process::getuid().as_raw();
    while let Ok((stream, _)) = listener.accept().await {
        let (core, info) = (core.clone(), info.clone());
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
            handle(stream, core, info).await;
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

async fn handle(stream: UnixStream, core: Arc<FsCore>, info: serde_json::Value) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(
        read,
        MAX_REQUEST_BYTES as u64,
    ));
    let mut buf = Vec::new();
    if reader.read_until(b'\n', &mut buf).await.is_err() || !buf.ends_with(b"\n") {
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
            match remote.grep(&p, options).await {
                Ok(mut stream) => {
                    while let Some(item) = stream.next().await {
                        let l = match item {
                            Ok(GrepEvent::Match(m)) => line(&json!(m)),
                            Ok(s @ GrepEvent::Summary { .. }) => line(&json!(s)),
                            Err(e) => error_line(&e),
                        };
                        // A client gone: dropping the stream cancels the search in the sandbox.
                        if write.write_all(&l).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
                Err(e) => Err(e),
            }
        }
        other => answer_one(&core, &info, other).await,
    };
    let l = match answer {
        Ok(v) => line(&v),
        Err(e) => error_line(&e),
    };
    let _ = write.write_all(&l).await;
}

/// Answer a request that has one answer (everything but grep's stream): shared by the socket
/// and the QUERY ioctl.
pub async fn answer_one(
    core: &Arc<FsCore>,
    info: &serde_json::Value,
    request: Request,
) -> Result<serde_json::Value, RemoteError> {
    let remote = core.remote().clone();
    let path = |w: crate::remote::WireBytes| RemotePath::new(w.0);
    match request {
        Request::Grep { path: p, options } => {
            // Collected whole: for the ioctl, whose answer must fit its buffer anyway.
            let p = path(p)?;
            let _ = core.flush_all().await;
            let mut stream = remote.grep(&p, options).await?;
            let mut matches = Vec::new();
            while let Some(item) = stream.next().await {
                match item? {
                    GrepEvent::Match(m) => matches.push(m),
                    GrepEvent::Summary { summary, truncated } => {
                        return Ok(
                            json!({ "matches": matches, "summary": summary, "truncated": truncated }),
                        )
                    }
                }
            }
            Err(RemoteError::Transport("the grep answer ended early".into()))
        }
        Request::Glob { path: p, pattern } => match path(p) {
            Ok(p) => remote
                .glob(&p, &pattern)
                .await
                .map(|paths| json!({ "paths": paths })),
            Err(e) => Err(e),
        },
        Request::Fuzzy { path: p, request } => match path(p) {
            Ok(p) => remote
                .fuzzy(&p, request)
                .await
                .map(|m| json!({ "matches": m })),
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
                // The file changed under the mount's caches and the kernel's: drop them.
                core.invalidate_path(&p);
                r.map(|count| json!({ "count": count }))
            }
            Err(e) => Err(e),
        },
        Request::Stats => Ok(json!({
            "cache_hit_ratio": core.cache_hit_ratio(),
            "stats": &core.stats,
            "pending_commits": core.pending_count(),
            "remote_round_trip_ms": round_trip_ms(core).await,
        })),
        Request::Flush => {
            let failures = core.flush_all().await;
            Ok(json!({
                "flushed": failures.is_empty(),
                "failures": failures.iter().map(|(p, e)| json!({"path": p, "error": e.to_string()})).collect::<Vec<_>>(),
            }))
        }
        Request::Invalidate { path: p } => match path(p) {
            Ok(p) => {
                core.invalidate_path(&p);
                Ok(json!({ "invalidated": p.display() }))
            }
            Err(e) => Err(e),
        },
        Request::Status => {
            let reachable = remote.info().await.is_ok();
            Ok(
                json!({ "mount": info, "reachable": reachable, "pending_commits": core.pending_count() }),
            )
        }
    }
}

async fn round_trip_ms(core: &FsCore) -> Option<f64> {
    let t = std::time::Instant::now();
    core.remote().info().await.ok()?;
    Some(t.elapsed().as_secs_f64() * 1000.0)
}
