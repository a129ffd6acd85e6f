//! The agent's client: a [`Remote`] over HTTP (protocol: [`super::wire`]).
//!
//! One `reqwest` client (connection reuse, many requests in flight at once), timeouts on every
//! call, the token sent as a header. One attempt per call: retries of idempotent calls live in
//! [`super::retry`], which `connect()` gives every transport.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::wire::{self, encode_bytes, ErrorBody, PatchHeader, VERSION_HEADER};
use super::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};

/// How long to wait for a connection: long enough for a far sandbox, short enough that a dead
/// one fails an operation quickly (the mount reports EIO rather than hang).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The client's own backstop for one request. The deadlines that matter (per operation,
/// scaled to its size, configurable) are [`super::deadline::Deadlines`]'s, which wraps every
/// backend; this only stops a request that wrapper would not (a client used alone).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Bytes read from a commit's source per chunk sent: large enough that a fast link is not
/// limited by per-chunk overhead.
pub const UPLOAD_CHUNK: usize = 256 * 1024;
/// Largest JSON answer read (bytes), and longest line of a streamed answer: far above any
/// honest answer but a listing, and a bound on what a broken or hostile agent can make the
/// daemon hold. Answers are parsed as they arrive, never buffered whole.
pub const MAX_JSON_ANSWER: u64 = 64 * 1024 * 1024;
/// An answer at most this long, its length given, is read whole before it is parsed.
const SMALL_ANSWER: u64 = 1024 * 1024;
/// Largest directory listing answer (bytes): a million entries of about 400 bytes each.
pub const MAX_LISTING_ANSWER: u64 = 512 * 1024 * 1024;
/// Most entries one directory listing may have: more than any real directory one browses
/// (and what its attributes cost, a few hundred MB, is the daemon's bound for one listing).
pub const MAX_DIR_ENTRIES: usize = 1_000_000;

/// How often a stdio session is pinged, and how long a ping may go unanswered.
const STDIO_PING: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    base: String,
    token: String,
    /// This client's [`super::wire::CLIENT_HEADER`]: its watch learns which changes its own
    /// commits made. `None` when the system gave no randomness: then nothing is its own, and
    /// every change is checked.
    client: Option<String>,
}

/// A fresh random client id (16 hex digits), as the other random tokens are drawn.
fn new_client_id() -> Option<String> {
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).ok()?;
    Some(format!("{:016x}", u64::from_ne_bytes(id)))
}

/// A pooled connection is dropped well before the agent closes an idle one: reusing one the
/// agent is closing fails a request that cannot always be retried (a commit). The pool may
/// hold a connection it opened and never used (a request it was opened for took one that
/// came free first), and the agent closes such a connection after its first-head timeout
/// (`agent::server::HEADER_READ_TIMEOUT`, 10 s), not the 60 s idle timeout of a used one.
const POOL_IDLE: Duration = Duration::from_secs(7);

impl AgentClient {
    /// `base` is the agent's URL, e.g. `http://127.0.0.1:7070`.
    pub fn new(base: &str, token: &str) -> Result<Self> {
        Self::with_setup(base, token, &super::httpsetup::HttpSetup::default())
    }

    /// A client that also trusts `setup`'s CAs and sends its headers (`--ca-file`,
    /// `--header-file`).
    pub fn with_setup(
        base: &str,
        token: &str,
        setup: &super::httpsetup::HttpSetup,
    ) -> Result<Self> {
        install_tls();
        let builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(POOL_IDLE)
            .tcp_nodelay(true)
            .tcp_keepalive(Duration::from_secs(30))
            // An agent never redirects; one that does is not followed elsewhere (to a service
            // on this machine, say): the 3xx is an error.
            .redirect(reqwest::redirect::Policy::none());
        let http = setup
            .apply(builder, base)
            .build()
            .map_err(|e| RemoteError::Transport(e.to_string()))?;
        Ok(AgentClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            client: new_client_id(),
        })
    }

    /// An agent reached through the Unix socket `socket` (the ssh transport's forwarding):
    /// nothing on the way but this machine's kernel.
    pub fn over_unix_socket(socket: &std::path::Path, token: &str) -> Result<Self> {
        install_tls();
        let http = super::httpsetup::plain_http(reqwest::Client::builder())
            .unix_socket(socket)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(POOL_IDLE)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RemoteError::Transport(e.to_string()))?;
        Ok(AgentClient {
            http,
            base: "http://sbxfs-agent".to_string(),
            token: token.to_string(),
            client: new_client_id(),
        })
    }

    /// An agent on an exec channel's standard input and output, reached through the local
    /// Unix socket that bridges to it ([`super::stdio`]): HTTP/2 from the first byte, every
    /// request a stream of the one connection, with windows as large as the agent's.
    pub fn over_stdio_bridge(socket: &std::path::Path) -> Result<Self> {
        install_tls();
        let http = super::httpsetup::plain_http(reqwest::Client::builder())
            .unix_socket(socket)
            .http2_prior_knowledge()
            .http2_initial_stream_window_size(crate::agent::server::STDIO_STREAM_WINDOW)
            .http2_initial_connection_window_size(crate::agent::server::STDIO_CONNECTION_WINDOW)
            .http2_max_frame_size(1024 * 1024)
            // A channel that stops carrying bytes (a hung sandbox, a link gone silent) is
            // closed after a missed ping, so the next request starts a new session.
            .http2_keep_alive_interval(STDIO_PING)
            .http2_keep_alive_timeout(STDIO_PING)
            .http2_keep_alive_while_idle(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(None)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RemoteError::Transport(e.to_string()))?;
        Ok(AgentClient {
            http,
            base: "http://sbxfs-agent".to_string(),
            token: crate::agent::STDIO_TOKEN.to_string(),
            client: new_client_id(),
        })
    }

    fn request(&self, method: Method, endpoint: &str, query: &[(&str, Vec<u8>)]) -> RequestBuilder {
        let mut url = format!("{}/v1/{endpoint}", self.base);
        for (i, (k, v)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(k);
            url.push('=');
            url.push_str(&encode_bytes(v));
        }
        let req = self.http.request(method, url).bearer_auth(&self.token);
        match &self.client {
            Some(id) => req.header(super::wire::CLIENT_HEADER, id),
            None => req,
        }
    }

    /// Send once; decode error answers.
    async fn send(
        &self,
        timeout: Option<Duration>,
        make: impl Fn() -> RequestBuilder,
    ) -> Result<reqwest::Response> {
        let mut req = make();
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        match req.send().await {
            Ok(resp) if resp.status().is_success() => Ok(resp),
            Ok(resp) => Err(decode_error(resp).await),
            Err(e) => Err(transport(e)),
        }
    }

    async fn get_json<T: DeserializeOwned + Send + 'static>(
        &self,
        endpoint: &str,
        query: &[(&str, Vec<u8>)],
    ) -> Result<T> {
        let resp = self
            .send(Some(CALL_TIMEOUT), || {
                self.request(Method::GET, endpoint, query)
            })
            .await?;
        json_answer(resp, MAX_JSON_ANSWER).await
    }

    async fn post_json<T: DeserializeOwned + Send + 'static>(
        &self,
        endpoint: &str,
        query: &[(&str, Vec<u8>)],
        body: Option<serde_json::Value>,
    ) -> Result<T> {
        let resp = self
            .send(Some(CALL_TIMEOUT), || {
                let r = self.request(Method::POST, endpoint, query);
                match &body {
                    Some(b) => r.json(b),
                    None => r,
                }
            })
            .await?;
        json_answer(resp, MAX_JSON_ANSWER).await
    }

    /// The agent's counters (`GET /v1/stats`).
    pub async fn agent_stats(&self) -> Result<serde_json::Value> {
        self.get_json("stats", &[]).await
    }
}

/// https through rustls with ring's cryptography (pure Rust plus a little assembly: the binary
/// needs no system TLS library, so the same binary runs as the agent in any sandbox) and the
/// system's trusted certificates. Installed once per process, before any client is built: a
/// `reqwest::Client` built without it panics (tests building their own call this first).
pub fn install_tls() {
    // An error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A transport failure, its cause named (refused, not resolved, TLS, …) with the agent's
/// address, never reqwest's bare "error sending request".
fn transport(e: reqwest::Error) -> RemoteError {
    let cause = super::reach::describe(&e);
    let m = match e.url() {
        Some(u) => format!(
            "{cause} ({}://{}:{})",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or_default()
        ),
        None => cause,
    };
    if e.is_timeout() {
        RemoteError::TimedOut(m)
    } else {
        RemoteError::Transport(m)
    }
}

/// How many answers past [`SMALL_ANSWER`] bytes the daemon parses at once. A listing's parse
/// holds a few hundred bytes per entry, so several hostile listings of 200,000 entries each
/// parsed side by side would add up to half a gigabyte; past this many, a large answer waits
/// (holding at most its first [`SMALL_ANSWER`] bytes) until one ends.
pub const LARGE_ANSWERS_AT_ONCE: usize = 2;
static LARGE_ANSWERS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(LARGE_ANSWERS_AT_ONCE);

/// An answer body as a stream of I/O chunks that fails once it passes `limit` bytes, and
/// waits for a turn among [`LARGE_ANSWERS`] once it passes [`SMALL_ANSWER`] bytes.
fn limited_body(
    resp: reqwest::Response,
    limit: u64,
    large: &'static tokio::sync::Semaphore,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static {
    struct Body<S> {
        chunks: S,
        seen: u64,
        turn: Option<tokio::sync::SemaphorePermit<'static>>,
    }
    let start = Body {
        chunks: resp.bytes_stream(),
        seen: 0,
        turn: None,
    };
    Box::pin(futures_util::stream::unfold(
        start,
        move |mut b| async move {
            let chunk = match b.chunks.next().await? {
                Ok(chunk) => chunk,
                Err(e) => return Some((Err(std::io::Error::other(transport(e))), b)),
            };
            b.seen += chunk.len() as u64;
            if b.seen > limit {
                return Some((Err(std::io::Error::other(TooLong(limit))), b));
            }
            if b.seen > SMALL_ANSWER && b.turn.is_none() {
                // The semaphore is never closed.
                b.turn = large.acquire().await.ok();
            }
            Some((Ok(chunk), b))
        },
    ))
}

/// An answer that passed its size limit (kept apart from transport failures).
#[derive(Debug, thiserror::Error)]
#[error("the agent's answer is larger than {0} bytes, which no honest answer is")]
struct TooLong(u64);

/// Decode a JSON answer as it arrives (at most `limit` bytes; serde_json's own recursion
/// limit bounds nesting), never holding the whole body.
async fn json_answer<T: DeserializeOwned + Send + 'static>(
    resp: reqwest::Response,
    limit: u64,
) -> Result<T> {
    json_answer_among(resp, limit, &LARGE_ANSWERS).await
}

/// [`json_answer`], taking turns for large answers among `large`.
async fn json_answer_among<T: DeserializeOwned + Send + 'static>(
    resp: reqwest::Response,
    limit: u64,
    large: &'static tokio::sync::Semaphore,
) -> Result<T> {
    match resp.content_length() {
        Some(n) if n > limit => return Err(RemoteError::Transport(TooLong(limit).to_string())),
        // Most answers are small and say their length (which hyper holds the body to): read
        // them at once, without a blocking thread.
        Some(n) if n <= SMALL_ANSWER => {
            let body = resp.bytes().await.map_err(transport)?;
            return serde_json::from_slice(&body)
                .map_err(|e| RemoteError::Transport(format!("bad answer: {e}")));
        }
        _ => {}
    }
    // A caller that gives up (a deadline) ends the body, so the parsing thread is not held by
    // an agent that trickles its answer.
    let abandoned = tokio_util::sync::CancellationToken::new();
    let _abandon_on_drop = abandoned.clone().drop_guard();
    let body = limited_body(resp, limit, large).take_until(abandoned.cancelled_owned());
    let reader = tokio_util::io::StreamReader::new(Box::pin(body));
    let bridge = tokio_util::io::SyncIoBridge::new(reader);
    tokio::task::spawn_blocking(move || {
        serde_json::from_reader::<_, T>(std::io::BufReader::new(bridge)).map_err(|e| {
            let inner = e
                .io_error_kind()
                .and_then(|_| std::error::Error::source(&e))
                .map(|s| s.to_string());
            RemoteError::Transport(match inner {
                Some(why) => why,
                None => format!("bad answer: {e}"),
            })
        })
    })
    .await
    .map_err(|e| RemoteError::Transport(format!("decoding an answer: {e}")))?
}

/// A listing's entries, counted while they are parsed: more than [`MAX_DIR_ENTRIES`] is an
/// error before the next one is allocated.
fn capped_entries<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<DirEntry>, D::Error> {
    struct Capped;
    impl<'de> serde::de::Visitor<'de> for Capped {
        type Value = Vec<DirEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_DIR_ENTRIES} directory entries")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = seq.next_element::<DirEntry>()? {
                if out.len() == MAX_DIR_ENTRIES {
                    return Err(serde::de::Error::custom(format!(
                        "a directory listing with more than {MAX_DIR_ENTRIES} entries"
                    )));
                }
                out.push(e);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Capped)
}

/// The statuses a gateway gives for an upstream that is down, asleep or slow.
fn is_gateway_failure(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

async fn decode_error(resp: reqwest::Response) -> RemoteError {
    let status = resp.status();
    match json_answer::<ErrorBody>(resp, MAX_JSON_ANSWER).await {
        Ok(body) => body.into_error(),
        Err(_) if status == StatusCode::UNAUTHORIZED => {
            RemoteError::Unauthorized(status.to_string())
        }
        // A gateway in front of the agent (a hosted sandbox's preview URL, a reverse proxy)
        // answers for an agent it cannot reach: the sandbox did not answer.
        Err(_) if is_gateway_failure(status) => RemoteError::Transport(format!(
            "a gateway answered {status} for the agent (the sandbox is not answering)"
        )),
        Err(_) => RemoteError::Io(
            "sandbox".into(),
            format!("answered {status}, which no sbxfs agent answers"),
        ),
    }
}

/// Split a streamed answer into JSON values, one per line.
fn json_lines(resp: reqwest::Response) -> BoxStream<'static, Result<serde_json::Value>> {
    let body = resp.bytes_stream();
    // `scanned`: how much of `buf` is known to hold no newline, so a line that arrives a byte
    // at a time is searched once, not once per byte.
    futures_util::stream::unfold(
        (body, Vec::<u8>::new(), 0usize, false),
        |(mut body, mut buf, mut scanned, done)| async move {
            if done {
                return None;
            }
            loop {
                if let Some(i) = buf[scanned..].iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=scanned + i).collect();
                    let item = serde_json::from_slice::<serde_json::Value>(&line[..line.len() - 1])
                        .map_err(|e| RemoteError::Transport(format!("bad stream line: {e}")));
                    return Some((item, (body, buf, 0, false)));
                }
                scanned = buf.len();
                if buf.len() as u64 > MAX_JSON_ANSWER {
                    let e = RemoteError::Transport(format!(
                        "a line of the agent's answer is longer than {MAX_JSON_ANSWER} bytes"
                    ));
                    return Some((Err(e), (body, Vec::new(), 0, true)));
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => return Some((Err(transport(e)), (body, buf, 0, true))),
                    None if buf.is_empty() => return None,
                    None => {
                        return Some((
                            Err(RemoteError::Transport("stream ended mid-line".into())),
                            (body, buf, 0, true),
                        ))
                    }
                }
            }
        },
    )
    .boxed()
}

/// A packed tree answer ([`treepack`]) decoded as it arrives: each listing is handed out once
/// complete; a body that stops before its end record is an error.
fn packed_listings(
    resp: reqwest::Response,
    path: &RemotePath,
    max_entries: usize,
) -> BoxStream<'static, Result<TreeListing>> {
    struct St {
        body: BoxStream<'static, reqwest::Result<Bytes>>,
        dec: Option<treepack::Decoder>,
        asm: treepack::Assembler,
        failed: bool,
    }
    let st = St {
        body: resp.bytes_stream().boxed(),
        dec: Some(treepack::Decoder::new()),
        asm: treepack::Assembler::new(path, max_entries),
        failed: false,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.failed {
                return None;
            }
            if let Some(l) = st.asm.ready.pop_front() {
                return Some((Ok(l), st));
            }
            if st.asm.ended() {
                return None;
            }
            let err = match st.body.next().await {
                Some(Ok(chunk)) => {
                    let (dec, asm) = (st.dec.as_mut().expect("decoding"), &mut st.asm);
                    match dec.feed(&chunk, &mut |r| asm.on(r)) {
                        Ok(()) => continue,
                        Err(e) => e,
                    }
                }
                Some(Err(e)) => transport(e),
                None => match st.dec.take().map(treepack::Decoder::finish) {
                    Some(Err(e)) => e,
                    _ => RemoteError::Transport(
                        "the agent's tree answer ended before its end record".into(),
                    ),
                },
            };
            st.failed = true;
            return Some((Err(err), st));
        }
    })
    .boxed()
}

/// A streamed answer that must end with a line `is_last` recognises (tree's `end`, grep's
/// summary or error): a body that stops before it is an error, never a silently short answer
/// (a dropped connection, an agent that died). Lines after the last one are ignored.
fn terminated(
    lines: BoxStream<'static, Result<serde_json::Value>>,
    is_last: fn(&serde_json::Value) -> bool,
) -> BoxStream<'static, Result<serde_json::Value>> {
    futures_util::stream::unfold((lines, false), move |(mut lines, done)| async move {
        if done {
            return None;
        }
        match lines.next().await {
            Some(Ok(v)) => {
                let last = is_last(&v);
                Some((Ok(v), (lines, last)))
            }
            Some(Err(e)) => Some((Err(e), (lines, true))),
            None => Some((
                Err(RemoteError::Transport(
                    "the agent's answer ended before its last line".into(),
                )),
                (lines, true),
            )),
        }
    })
    .boxed()
}

fn decode<T: DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| RemoteError::Transport(format!("bad answer: {e}")))
}

fn stream_error(v: &serde_json::Value) -> Option<RemoteError> {
    let e = v.get("error")?;
    serde_json::from_value::<ErrorBody>(e.clone())
        .ok()
        .map(ErrorBody::into_error)
}

/// The agent checks names too; checking here first spares a round trip and keeps a bad name
/// out of the URL.
fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(RemoteError::Invalid(
            "an extended attribute name is empty or has a NUL".into(),
        ));
    }
    if name.len() > MAX_XATTR_NAME_BYTES {
        return Err(RemoteError::NameTooLong(
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    Ok(())
}

fn p(path: &RemotePath) -> (&'static str, Vec<u8>) {
    ("path", path.as_bytes().to_vec())
}

impl AgentClient {
    /// One read, of the held file at `held` if the agent still has it
    /// ([`Remote::read_held`]).
    async fn read_of(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
        held: Option<&Version>,
    ) -> Result<ReadResult> {
        let mut q = vec![
            p(path),
            ("offset", offset.to_string().into_bytes()),
            ("len", len.to_string().into_bytes()),
        ];
        if let Some(v) = held {
            q.push(("held", v.0.clone().into_bytes()));
        }
        let resp = self
            .send(Some(CALL_TIMEOUT), || self.request(Method::GET, "read", &q))
            .await?;
        let version = resp
            .headers()
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| Version(v.to_string()))
            .ok_or_else(|| RemoteError::Transport("read answer without a version".into()))?;
        // Never more than asked: a longer answer is refused as it arrives, not buffered.
        let more = || {
            RemoteError::Io(
                path.display(),
                "the sandbox answered more bytes than asked".into(),
            )
        };
        if resp.content_length().is_some_and(|n| n > u64::from(len)) {
            return Err(more());
        }
        // Sized once: a buffer grown by doubling leaves a trail of freed ones behind.
        let mut data = bytes::BytesMut::with_capacity(
            resp.content_length()
                .map_or(0, |n| n.min(u64::from(len)) as usize),
        );
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(transport)?;
            if data.len() + chunk.len() > len as usize {
                return Err(more());
            }
            data.extend_from_slice(&chunk);
        }
        Ok(ReadResult {
            data: data.freeze(),
            version,
        })
    }
}

#[async_trait]
impl Remote for AgentClient {
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let kind: &[u8] = match kind {
            SpecialKind::Fifo => b"fifo",
            SpecialKind::Socket => b"socket",
            SpecialKind::CharDevice => b"chardevice",
            SpecialKind::BlockDevice => b"blockdevice",
        };
        let q = [
            p(path),
            ("kind", kind.to_vec()),
            ("mode", mode.to_string().into_bytes()),
            ("rdev", rdev.to_string().into_bytes()),
        ];
        self.post_json("mknod", &q, None).await
    }

    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        let q = [p(existing), ("to", new.as_bytes().to_vec())];
        self.post_json("link", &q, None).await
    }

    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        #[derive(Deserialize)]
        struct Value {
            value: WireBytes,
        }
        check_xattr_name(name)?;
        let q = [p(path), ("name", name.to_vec())];
        let v: Value = self.get_json("getxattr", &q).await?;
        if v.value.0.len() > MAX_XATTR_VALUE_BYTES {
            return Err(RemoteError::TooLarge(
                "an xattr value from the agent".into(),
            ));
        }
        Ok(v.value.0)
    }

    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        #[derive(Deserialize)]
        struct Names {
            names: Vec<WireBytes>,
        }
        let n: Names = self.get_json("listxattr", &[p(path)]).await?;
        Ok(n.names.into_iter().map(|n| n.0).collect())
    }

    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        check_xattr_name(name)?;
        super::check_xattr_value(path, value)?;
        let mut q = vec![p(path), ("name", name.to_vec())];
        if flags.create {
            q.push(("create", b"1".to_vec()));
        }
        if flags.replace {
            q.push(("replace", b"1".to_vec()));
        }
        let body = serde_json::to_value(wire::XattrBody {
            value: WireBytes(value.to_vec()),
        })
        .expect("serialisable");
        self.post_json::<serde_json::Value>("setxattr", &q, Some(body))
            .await
            .map(|_| ())
    }

    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        let q = [p(path), ("name", name.to_vec())];
        self.post_json::<serde_json::Value>("removexattr", &q, None)
            .await
            .map(|_| ())
    }

    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        let mut q = vec![
            p(path),
            ("offset", offset.to_string().into_bytes()),
            ("len", len.to_string().into_bytes()),
        ];
        if keep_size {
            q.push(("keep_size", b"1".to_vec()));
        }
        self.post_json("fallocate", &q, None).await
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
        let mut q = vec![
            p(src),
            ("offset", src_offset.to_string().into_bytes()),
            ("to", dst.as_bytes().to_vec()),
            ("to_offset", dst_offset.to_string().into_bytes()),
            ("len", len.to_string().into_bytes()),
        ];
        if let Some(b) = dst_base {
            q.push(("base", b.0.into_bytes()));
        }
        // A copy of a large file takes the sandbox's time, not the network's: no call timeout
        // beyond the commit's (none), like a commit.
        let resp = self
            .send(None, || self.request(Method::POST, "copy_range", &q))
            .await?;
        let a: wire::CopyRangeAnswer = json_answer(resp, MAX_JSON_ANSWER).await?;
        Ok((a.copied, a.attr))
    }

    async fn info(&self) -> Result<RemoteInfo> {
        self.get_json("info", &[]).await
    }

    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        self.get_json("stat", &[p(path)]).await
    }

    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        #[derive(Deserialize)]
        struct Answer {
            results: Vec<wire::StatOutcome>,
        }
        super::check_stat_many(paths)?;
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let body = serde_json::to_value(wire::StatManyBody {
            paths: paths
                .iter()
                .map(|p| WireBytes(p.as_bytes().to_vec()))
                .collect(),
        })
        .expect("serialisable");
        let answer: Answer = self.post_json("stat_many", &[], Some(body)).await?;
        if answer.results.len() != paths.len() {
            return Err(RemoteError::Io(
                String::new(),
                format!(
                    "the agent answered {} outcomes for {} paths",
                    answer.results.len(),
                    paths.len()
                ),
            ));
        }
        Ok(answer
            .results
            .into_iter()
            .map(|o| match o {
                wire::StatOutcome::Attr { attr } => Ok(attr),
                wire::StatOutcome::Error(e) => Err(e.into_error()),
            })
            .collect())
    }

    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        #[derive(Deserialize)]
        struct Listing {
            #[serde(deserialize_with = "capped_entries")]
            entries: Vec<DirEntry>,
        }
        let resp = self
            .send(Some(CALL_TIMEOUT), || {
                self.request(Method::GET, "list", &[p(path)])
            })
            .await?;
        let listing: Listing = json_answer(resp, MAX_LISTING_ANSWER).await?;
        for e in &listing.entries {
            check_entry_name(&e.name.0).map_err(|why| {
                RemoteError::Io(
                    path.display(),
                    format!("the sandbox listed an impossible name: {why}"),
                )
            })?;
        }
        Ok(listing.entries)
    }

    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        let resp = self
            .send(None, || self.request(Method::GET, "tree", &[p(path)]))
            .await?;
        let lines = terminated(json_lines(resp), |v| v.get("end").is_some());
        let stream = lines.filter_map(|item| async move {
            match item {
                Err(e) => Some(Err(e)),
                Ok(v) if v.get("end").is_some() => stream_error(&v).map(Err),
                Ok(v) => Some(decode::<TreeEntry>(v).and_then(|t| {
                    RemotePath::new(t.path.0.clone()).map_err(|e| {
                        RemoteError::Transport(format!("the agent listed an impossible path: {e}"))
                    })?;
                    Ok(t)
                })),
            }
        });
        Ok(stream.boxed())
    }

    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<TreeListing>>> {
        let q = [
            p(path),
            ("format", treepack::FORMAT.as_bytes().to_vec()),
            ("max", max_entries.to_string().into_bytes()),
            (treepack::XATTRS_PARAM, b"1".to_vec()),
            (treepack::BORN_PARAM, b"1".to_vec()),
        ];
        let resp = self
            .send(None, || self.request(Method::GET, "tree", &q))
            .await?;
        let packed = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == treepack::CONTENT_TYPE.as_bytes());
        if !packed {
            // An older agent answers its whole tree as JSON lines: not what was asked.
            return Err(RemoteError::Unsupported(
                "the agent does not answer packed trees".into(),
            ));
        }
        Ok(packed_listings(resp, path, max_entries))
    }

    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        self.read_of(path, offset, len, None).await
    }

    async fn read_held(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
        version: &Version,
    ) -> Result<ReadResult> {
        self.read_of(path, offset, len, Some(version)).await
    }

    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        let mut q = vec![p(path)];
        if let Some(b) = &opts.base {
            q.push(("base", b.0.clone().into_bytes()));
        }
        if let Some(m) = opts.create_mode {
            q.push(("mode", m.to_string().into_bytes()));
        }
        if let Some(t) = opts.mtime_ns {
            q.push(("mtime", t.to_string().into_bytes()));
        }
        if let Some(t) = opts.atime_ns {
            q.push(("atime", t.to_string().into_bytes()));
        }
        let body = match content {
            CommitContent::Whole(reader) => reqwest::Body::wrap_stream(
                tokio_util::io::ReaderStream::with_capacity(reader, UPLOAD_CHUNK),
            ),
            CommitContent::Patch {
                cut,
                new_len,
                ranges,
            } => {
                q.push(("patch", b"1".to_vec()));
                let header = PatchHeader {
                    cut,
                    new_len,
                    ranges: ranges.iter().map(|(o, b)| [*o, b.len() as u64]).collect(),
                };
                let mut head = serde_json::to_vec(&header).expect("serialisable");
                head.push(b'\n');
                let parts =
                    std::iter::once(Bytes::from(head)).chain(ranges.into_iter().map(|(_, b)| b));
                reqwest::Body::wrap_stream(futures_util::stream::iter(
                    parts.map(Ok::<_, std::io::Error>),
                ))
            }
        };
        // A body stream can be sent once: commits are never retried here (the caller decides).
        let resp = self
            .request(Method::PUT, "commit", &q)
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(decode_error(resp).await);
        }
        json_answer(resp, MAX_JSON_ANSWER).await
    }

    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.post_json(
            "create",
            &[p(path), ("mode", mode.to_string().into_bytes())],
            None,
        )
        .await
    }

    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.post_json(
            "mkdir",
            &[p(path), ("mode", mode.to_string().into_bytes())],
            None,
        )
        .await
    }

    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        self.post_json::<serde_json::Value>("unlink", &[p(path)], None)
            .await
            .map(|_| ())
    }

    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        self.post_json::<serde_json::Value>("rmdir", &[p(path)], None)
            .await
            .map(|_| ())
    }

    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        let mut q = vec![p(from), ("to", to.as_bytes().to_vec())];
        match mode {
            RenameMode::Replace => {}
            RenameMode::NoReplace => q.push(("noreplace", b"1".to_vec())),
            RenameMode::Exchange => q.push(("exchange", b"1".to_vec())),
        }
        self.post_json::<serde_json::Value>("rename", &q, None)
            .await
            .map(|_| ())
    }

    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        self.post_json("symlink", &[p(path), ("target", target.to_vec())], None)
            .await
    }

    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        #[derive(Deserialize)]
        struct Link {
            target: WireBytes,
        }
        Ok(self
            .get_json::<Link>("readlink", &[p(path)])
            .await?
            .target
            .0)
    }

    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        let body = serde_json::to_value(&attr).expect("serialisable");
        self.post_json("setattr", &[p(path)], Some(body)).await
    }

    async fn statfs(&self) -> Result<StatFs> {
        self.get_json("statfs", &[]).await
    }

    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        let body = serde_json::to_value(req).expect("serialisable");
        self.post_json("scan", &[p(path)], Some(body)).await
    }

    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        let body = serde_json::to_value(&opts).expect("serialisable");
        let resp = self
            .send(None, || {
                self.request(Method::POST, "grep", &[p(path)]).json(&body)
            })
            .await?;
        let lines = terminated(json_lines(resp), |v| {
            v.get("summary").is_some() || v.get("error").is_some()
        });
        let stream = lines.map(|item| {
            let v = item?;
            if let Some(e) = stream_error(&v) {
                return Err(e);
            }
            decode::<GrepEvent>(v)
        });
        Ok(stream.boxed())
    }

    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Paths {
            paths: Vec<String>,
        }
        let body = serde_json::json!({ "pattern": pattern });
        Ok(self
            .post_json::<Paths>("glob", &[p(path)], Some(body))
            .await?
            .paths)
    }

    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        #[derive(Deserialize)]
        struct Matches {
            matches: Vec<FuzzyMatch>,
        }
        let body = serde_json::to_value(&req).expect("serialisable");
        Ok(self
            .post_json::<Matches>("fuzzy", &[p(path)], Some(body))
            .await?
            .matches)
    }

    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        #[derive(Deserialize)]
        struct Count {
            count: usize,
        }
        let body = serde_json::to_value(wire::EditBody {
            old: old.to_string(),
            new: new.to_string(),
            replace_all,
        })
        .expect("serialisable");
        Ok(self
            .post_json::<Count>("edit", &[p(path)], Some(body))
            .await?
            .count)
    }

    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        let q: Vec<(&str, Vec<u8>)> = since
            .map(|s| ("since", s.to_string().into_bytes()))
            .into_iter()
            .collect();
        let resp = self
            .send(None, || self.request(Method::GET, "watch", &q))
            .await?;
        Ok(json_lines(resp)
            .map(|item| decode::<ChangeEvent>(item?))
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(v: Vec<serde_json::Value>) -> BoxStream<'static, Result<serde_json::Value>> {
        futures_util::stream::iter(v.into_iter().map(Ok)).boxed()
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_last_line_ends_with_an_error() {
        let is_end: fn(&serde_json::Value) -> bool = |v| v.get("end").is_some();
        let cut: Vec<Result<serde_json::Value>> =
            terminated(values(vec![serde_json::json!({"a": 1})]), is_end)
                .collect()
                .await;
        assert_eq!(cut.len(), 2);
        assert!(matches!(cut[1], Err(RemoteError::Transport(_))), "{cut:?}");
        let whole: Vec<Result<serde_json::Value>> = terminated(
            values(vec![
                serde_json::json!({"a": 1}),
                serde_json::json!({"end": 1}),
                serde_json::json!({"after": true}),
            ]),
            is_end,
        )
        .collect()
        .await;
        assert_eq!(whole.len(), 2, "ends at its last line");
        assert!(whole.iter().all(Result::is_ok));
    }

    /// A response with `status` whose body is `chunks`.
    fn with_status(chunks: Vec<Bytes>, status: u16) -> reqwest::Response {
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks.into_iter().map(Ok::<_, std::io::Error>),
        ));
        let mut r = http::Response::new(body);
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
        reqwest::Response::from(r)
    }

    /// A response whose body is `chunks`, as a server would stream it.
    fn response(chunks: Vec<Bytes>) -> reqwest::Response {
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks.into_iter().map(Ok::<_, std::io::Error>),
        ));
        reqwest::Response::from(http::Response::new(body))
    }

    #[tokio::test]
    async fn a_gateways_page_for_a_down_agent_means_not_answering() {
        let page = || vec![Bytes::from_static(b"<html><h1>502 Bad Gateway</h1></html>")];
        for (code, unreachable) in [(502, true), (503, true), (504, true), (500, false)] {
            let e = decode_error(with_status(page(), code)).await;
            assert_eq!(
                matches!(e, RemoteError::Transport(_)),
                unreachable,
                "{code}: {e:?}"
            );
        }
        // The agent's own error body is the agent's answer, whatever the status.
        let body = br#"{"error":"ENOENT","message":"x: no such file or directory"}"#;
        let e = decode_error(with_status(vec![Bytes::from_static(body)], 503)).await;
        assert!(!matches!(e, RemoteError::Transport(_)), "{e:?}");
    }

    #[tokio::test]
    async fn an_abandoned_answer_frees_its_parsing_thread() {
        // A body that never ends: the caller gives up, and the parse ends with it.
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(1);
        tx.send(Ok(Bytes::from_static(b"[1,"))).await.unwrap();
        let body = reqwest::Body::wrap_stream(tokio_stream_of(rx));
        let resp = reqwest::Response::from(http::Response::new(body));
        let parse = json_answer::<Vec<u32>>(resp, 1024);
        assert!(tokio::time::timeout(Duration::from_millis(50), parse)
            .await
            .is_err());
        // The sender sees its receiver gone once the parsing thread has let go of the body
        // (the deadline only stops a hung test).
        tokio::time::timeout(Duration::from_secs(60), tx.closed())
            .await
            .expect("the parsing thread still holds the body");
    }

    #[tokio::test]
    async fn large_answers_take_turns_and_small_ones_never_wait() {
        static TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
        let big = || Bytes::from(b"1,".repeat(SMALL_ANSWER as usize / 2 + 1));
        let answer = || {
            let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(1);
            let body = reqwest::Body::wrap_stream(tokio_stream_of(rx));
            let resp = reqwest::Response::from(http::Response::new(body));
            let parse = tokio::spawn(json_answer_among::<Vec<u32>>(resp, MAX_JSON_ANSWER, &TURNS));
            (tx, parse)
        };
        let mut held = Vec::new();
        for _ in 0..2 {
            let (tx, parse) = answer();
            tx.send(Ok(Bytes::from_static(b"["))).await.unwrap();
            tx.send(Ok(big())).await.unwrap();
            held.push((tx, parse));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while TURNS.available_permits() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "two large answers never took turns"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A third large answer stops reading once past its first MiB: its sender fills up.
        let (third, third_parse) = answer();
        third.send(Ok(Bytes::from_static(b"["))).await.unwrap();
        third.send(Ok(big())).await.unwrap();
        third.send(Ok(big())).await.unwrap();
        let stuck = tokio::time::timeout(Duration::from_millis(300), third.send(Ok(big())));
        assert!(
            stuck.await.is_err(),
            "a third large answer was read beside two"
        );
        // A small answer is not held up by them.
        let (small, small_parse) = answer();
        small.send(Ok(Bytes::from_static(b"[7]"))).await.unwrap();
        drop(small);
        assert_eq!(small_parse.await.unwrap().unwrap(), vec![7]);
        // One ends: the third goes on and completes.
        let (first, first_parse) = held.remove(0);
        first.send(Ok(Bytes::from_static(b"1]"))).await.unwrap();
        drop(first);
        assert!(first_parse.await.unwrap().is_ok());
        third.send(Ok(Bytes::from_static(b"1]"))).await.unwrap();
        drop(third);
        let n = third_parse.await.unwrap().unwrap().len();
        // (The send that timed out carried nothing.)
        assert_eq!(n, 2 * (SMALL_ANSWER as usize / 2 + 1) + 1);
        drop(held);
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test]
    async fn an_answer_past_its_limit_is_refused_while_it_arrives() {
        // 64 MiB of an endless array against a 1 MiB limit: refused after about 1 MiB.
        let mut chunks = vec![Bytes::from_static(b"[")];
        chunks.extend(std::iter::repeat_n(
            Bytes::from(b"1,".repeat(512 * 1024)),
            64,
        ));
        let r = json_answer::<Vec<u32>>(response(chunks), 1024 * 1024).await;
        match r {
            Err(RemoteError::Transport(m)) => assert!(m.contains("larger than"), "{m}"),
            other => panic!("{other:?}"),
        }
        let ok = json_answer::<Vec<u32>>(response(vec![Bytes::from_static(b"[1, 2]")]), 16).await;
        assert_eq!(ok.unwrap(), vec![1, 2]);
        // With a length: refused before reading when it is over the limit, read whole when small.
        let sized = |b: &'static [u8]| reqwest::Response::from(http::Response::new(b));
        let r = json_answer::<Vec<u32>>(sized(b"[1, 2, 3]"), 4).await;
        assert!(
            matches!(r, Err(RemoteError::Transport(ref m)) if m.contains("larger than")),
            "{r:?}"
        );
        assert_eq!(
            json_answer::<Vec<u32>>(sized(b"[3]"), 16).await.unwrap(),
            vec![3]
        );
        assert!(json_answer::<Vec<u32>>(sized(b"[3"), 16).await.is_err());
    }

    #[derive(Deserialize, Debug)]
    struct Listing {
        #[serde(deserialize_with = "capped_entries")]
        #[allow(dead_code)]
        entries: Vec<DirEntry>,
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_bytes_as_a_listing_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = serde_json::from_slice::<Listing>(&bytes);
        }

        #[test]
        fn a_deeply_nested_listing_is_an_error(depth in 100usize..50_000) {
            let l = format!(r#"{{"entries": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
            prop_assert!(serde_json::from_str::<Listing>(&l).is_err());
        }

        #[test]
        fn impossible_entry_names_are_named(name in proptest::collection::vec(any::<u8>(), 0..300)) {
            let ok = !name.is_empty()
                && name != b"." && name != b".."
                && !name.contains(&b'/') && !name.contains(&0)
                && name.len() <= MAX_NAME_BYTES;
            prop_assert_eq!(check_entry_name(&name).is_ok(), ok);
        }
    }
}
