//! The first contact with an agent, and what a failed one means: one line naming the cause
//! (what was asked, what answered), and an exit code per kind of cause.
//!
//! [`first_contact`] asks `GET /v1/info` once, before a mount creates anything, so a wrong URL,
//! token or server leaves nothing behind. [`describe`] names the cause of any transport error
//! (the mount's later calls use it too), by walking the error's source chain.

use std::time::Duration;

use reqwest::StatusCode;

use super::httpsetup::HttpSetup;
use super::wire::{ErrorBody, PROTOCOL_VERSION};
use super::RemoteInfo;

/// Exit code: the sandbox could not be reached (refused, name not resolved, timed out).
pub const EXIT_UNREACHABLE: i32 = Failure::Sandbox as i32;
/// Exit code: something answered, but not an sbxfs agent this build can talk to (another
/// server, a TLS failure, another protocol version).
pub const EXIT_NOT_AGENT: i32 = Failure::NotAgent as i32;
/// Exit code: the agent rejected the token.
pub const EXIT_TOKEN: i32 = Failure::Token as i32;
/// Exit code: a usage error (a bad URL among them).
pub const EXIT_USAGE: i32 = Failure::Other as i32;

use crate::mount::exit::Failure;

/// How often a first contact that has no answer yet says it is still waiting.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `work`'s result, calling `waiting` with the time taken every [`PROGRESS_EVERY`] until it
/// comes (a first contact, a deploy through an exec channel: never minutes without a word).
pub async fn reporting<T>(
    work: impl std::future::Future<Output = T>,
    waiting: impl Fn(Duration),
) -> T {
    let started = std::time::Instant::now();
    let mut work = std::pin::pin!(work);
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => waiting(started.elapsed()),
        }
    }
}

/// Why the first contact with an agent failed. Each message is one line naming the cause.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ReachError {
    #[error("{url:?} is not an agent URL ({why}): expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl { url: String, why: String },
    #[error("{url}: connection refused by {addr}: is the agent running, and on that port?")]
    Refused { url: String, addr: String },
    #[error("{url}: host name {host:?} not resolved: check the spelling, or use an IP address")]
    NotResolved { url: String, host: String },
    #[error("{url}: no answer within {after:?}: is the agent running there? (a longer wait: -o timeout_ms=MS)")]
    TimedOut { url: String, after: Duration },
    #[error("{url}: TLS: {why}")]
    Tls { url: String, why: String },
    #[error("{url} answered {status}{server}: not an sbxfs agent")]
    NotAgent {
        url: String,
        status: String,
        server: String,
    },
    #[error("{url}: the agent rejected the token: pass the token the agent was started with (--token-file FILE or SBXFS_TOKEN)")]
    TokenRejected { url: String },
    #[error("{url}: the agent speaks protocol {theirs} (sbxfs {agent_version}), this sbxfs speaks protocol {ours}: run the same sbxfs version on both sides")]
    Protocol {
        url: String,
        theirs: u32,
        ours: u32,
        agent_version: String,
    },
    #[error("{url}: an SSH server answered ({banner}), not an sbxfs agent: mount over SSH with ssh://[USER@]HOST[:PORT]/PATH")]
    Ssh { url: String, banner: String },
    #[error("{url}: {why}")]
    Other { url: String, why: String },
}

impl ReachError {
    /// The process exit code for this failure (documented in `sbxfs --help` and the README).
    pub fn exit_code(&self) -> i32 {
        match self {
            ReachError::BadUrl { .. } => EXIT_USAGE,
            ReachError::Refused { .. }
            | ReachError::NotResolved { .. }
            | ReachError::TimedOut { .. }
            | ReachError::Other { .. } => EXIT_UNREACHABLE,
            ReachError::Tls { .. }
            | ReachError::NotAgent { .. }
            | ReachError::Protocol { .. }
            | ReachError::Ssh { .. } => EXIT_NOT_AGENT,
            ReachError::TokenRejected { .. } => EXIT_TOKEN,
        }
    }
}

/// Check that `url` is an agent URL: http or https, with a host.
pub fn parse_url(url: &str) -> Result<reqwest::Url, ReachError> {
    let bad = |why: &str| ReachError::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    if !url.contains("://") {
        return Err(bad("no http:// or https://"));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("no http:// or https://"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Never echoed: the URL is shown in the mount table, which every local user can read.
        let mut shown = parsed.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        return Err(ReachError::BadUrl {
            url: shown.to_string(),
            why: "it carries credentials (USER:PASSWORD@), which would show in the mount table; \
                  the agent's token goes in --token-file or SBXFS_TOKEN"
                .into(),
        });
    }
    Ok(parsed)
}

#[cfg(test)]
mod credential_tests {
    #[test]
    fn credentials_in_the_url_are_refused_and_never_echoed() {
        let e = super::parse_url("http://me:s3cret@127.0.0.1:7070").unwrap_err();
        let line = e.to_string();
        assert!(line.contains("credentials"), "{line}");
        assert!(!line.contains("s3cret") && !line.contains("me:"), "{line}");
        assert_eq!(e.exit_code(), 2);
    }
}

/// What to do about a certificate the system does not trust.
const UNTRUSTED: &str = "certificate not trusted: pass the authority (CA) that signed it with \
                         --ca-file FILE, or add it to the system's trusted certificates \
                         (a self-signed server certificate is not accepted as its own authority)";

/// What a transport error of a request that waited up to `waited` comes down to: the cause,
/// named, from the error's source chain.
pub fn classify(url: &str, e: &reqwest::Error, waited: Duration) -> ReachError {
    let url_s = url.to_string();
    let parsed = reqwest::Url::parse(url).ok();
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_default();
    let addr = parsed
        .as_ref()
        .map(|u| format!("{host}:{}", u.port_or_known_default().unwrap_or(80)))
        .unwrap_or_default();
    let chain = chain(e);
    let io_kind = io_kind(e);
    if e.is_timeout() || io_kind == Some(std::io::ErrorKind::TimedOut) {
        return ReachError::TimedOut {
            url: url_s,
            after: waited,
        };
    }
    if io_kind == Some(std::io::ErrorKind::ConnectionRefused) {
        return ReachError::Refused { url: url_s, addr };
    }
    if is_dns(&chain) {
        return ReachError::NotResolved { url: url_s, host };
    }
    // Over https, a connection that failed for none of the reasons above failed in TLS.
    let https = parsed.as_ref().is_some_and(|u| u.scheme() == "https");
    let tls = |why: String| ReachError::Tls {
        url: url_s.clone(),
        why,
    };
    let wrong_name = || {
        tls(format!(
            "the certificate is not for host {host:?}: connect by a name (or address) it names"
        ))
    };
    let handshake = |why: &str| {
        tls(format!(
            "handshake failed ({why}): does the server speak https? \
             (an agent serves https only when started with --tls-cert)"
        ))
    };
    // An SSH server greets first, and its greeting reads as a bad HTTP version, as a failed
    // handshake, or (when it comes before the request is sent: a busy machine) as a message
    // nobody asked for: it says what it is.
    let garbled = chain.iter().any(|m| {
        m.contains("invalid HTTP version")
            || m.contains("InvalidContentType")
            || m.contains("unexpected message from connection")
            || m.contains("connection closed before message completed")
    }) || (https && e.is_connect() && tls_error(e).is_none());
    if garbled {
        if let Some(banner) = ssh_banner(&addr) {
            return ReachError::Ssh { url: url_s, banner };
        }
    }
    match tls_error(e) {
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => wrong_name(),
        Some(rustls::Error::InvalidCertificate(_)) => tls(UNTRUSTED.into()),
        Some(other) => handshake(&other.to_string()),
        // The platform verifier's error reaches us as text only.
        None if https && chain.iter().any(|m| is_wrong_name(m)) => wrong_name(),
        None if https && chain.iter().any(|m| m.contains("invalid peer certificate")) => {
            tls(UNTRUSTED.into())
        }
        None if https && e.is_connect() => handshake(chain.last().map_or("", String::as_str)),
        // A TLS server answers a plain request with a handshake record, which hyper reads as
        // a bad HTTP version.
        None if !https && chain.iter().any(|m| m.contains("invalid HTTP version")) => tls(
            "the server answered in TLS, not plain http: use https:// (with --ca-file if its \
             certificate is not from a public CA)"
                .into(),
        ),
        None => ReachError::Other {
            url: url_s,
            why: describe(e),
        },
    }
}

/// The greeting line of an SSH server at `addr` (`SSH-2.0-OpenSSH_9.2p1 …`), if one is
/// there: read within a second of connecting, before anything is sent.
fn ssh_banner(addr: &str) -> Option<String> {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    const WAIT: Duration = Duration::from_secs(1);
    let to = addr.to_socket_addrs().ok()?.next()?;
    let mut conn = std::net::TcpStream::connect_timeout(&to, WAIT).ok()?;
    conn.set_read_timeout(Some(WAIT)).ok()?;
    let mut buf = [0u8; 128];
    let n = conn.read(&mut buf).ok()?;
    let greeting = buf[..n].strip_prefix(b"SSH-")?;
    let line = greeting.split(|&b| b == b'\r' || b == b'\n').next()?;
    let shown: String = String::from_utf8_lossy(line)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Some(format!("SSH-{shown}"))
}

/// A certificate error that says the certificate names other hosts.
fn is_wrong_name(m: &str) -> bool {
    m.contains("NotValidForName") || m.contains("not valid for name")
}

/// hyper's resolver failed: the host name did not resolve.
fn is_dns(chain: &[String]) -> bool {
    chain.iter().any(|m| m.starts_with("dns error"))
}

/// A transport error in one line: its innermost causes, without reqwest's request framing
/// ("error sending request for url (…)"), e.g. "connection refused (127.0.0.1:7781)".
pub fn describe(e: &reqwest::Error) -> String {
    let chain = chain(e);
    if is_dns(&chain) {
        return format!(
            "host name not resolved ({})",
            chain.last().cloned().unwrap_or_default()
        );
    }
    if let Some(kind) = io_kind(e) {
        let inner = chain.last().cloned().unwrap_or_default();
        return match kind {
            std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
            std::io::ErrorKind::TimedOut => "timed out".into(),
            _ => inner,
        };
    }
    if e.is_timeout() {
        return "timed out".into();
    }
    // The outermost error repeats the URL; its causes say what went wrong.
    match chain.len() {
        0 | 1 => e.to_string(),
        _ => chain[1..].join(": "),
    }
}

/// The messages of an error and each of its sources, outermost first, repeats dropped.
fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let m = err.to_string();
        if out.last() != Some(&m) {
            out.push(m);
        }
        cur = err.source();
    }
    out
}

/// The TLS error in the chain, if any (rustls's errors travel inside I/O errors, which show
/// their inner error only through `get_ref`).
fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if inner.is_some() {
            return inner;
        }
        cur = err.source();
    }
    None
}

/// The kind of the innermost I/O error in the chain, if any.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut found = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            found = Some(io.kind());
        }
        cur = err.source();
    }
    found
}

/// Largest first answer read from whoever is at the URL (an agent's info is a few hundred bytes).
const MAX_INFO_BYTES: usize = 64 * 1024;

/// Ask the agent at `url` who it is, once, within `timeout`, calling `waiting` every
/// [`PROGRESS_EVERY`] while there is no answer. Ok when it is an sbxfs agent speaking this
/// protocol that accepts `token`.
pub async fn first_contact(
    url: &str,
    token: &str,
    timeout: Duration,
    waiting: impl Fn(Duration),
) -> Result<RemoteInfo, ReachError> {
    first_contact_with(url, token, timeout, &HttpSetup::default(), waiting).await
}

/// [`first_contact`], trusting `setup`'s CAs and sending its headers.
pub async fn first_contact_with(
    url: &str,
    token: &str,
    timeout: Duration,
    setup: &HttpSetup,
    waiting: impl Fn(Duration),
) -> Result<RemoteInfo, ReachError> {
    parse_url(url)?;
    super::client::install_tls();
    let base = url.trim_end_matches('/').to_string();
    let builder = reqwest::Client::builder()
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none());
    let http = setup
        .apply(builder, url)
        .build()
        .map_err(|e| ReachError::Other {
            url: base.clone(),
            why: describe(&e),
        })?;
    let asked = base.clone();
    let token = token.to_string();
    let ask = async move {
        let base = asked;
        let resp = http
            .get(format!("{base}/v1/info"))
            .bearer_auth(&token)
            .send()
            .await
            .map_err(|e| classify(&base, &e, timeout))?;
        let status = resp.status();
        let server = resp
            .headers()
            .get(reqwest::header::SERVER)
            .and_then(|v| v.to_str().ok())
            .map(|s| format!(" (server: {s})"))
            .unwrap_or_default();
        // Whoever answers is not trusted yet: an info answer is small, so read at most
        // MAX_INFO_BYTES (a larger one is not an agent's).
        let mut body = Vec::new();
        let mut chunks = resp.bytes_stream();
        while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
            let chunk = chunk.map_err(|e| classify(&base, &e, timeout))?;
            if body.len() + chunk.len() > MAX_INFO_BYTES {
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<_, ReachError>((status, server, body))
    };
    let answer = reporting(tokio::time::timeout(timeout, ask), waiting).await;
    let (status, server, body) = match answer {
        Err(_) => {
            return Err(ReachError::TimedOut {
                url: base,
                after: timeout,
            })
        }
        Ok(r) => r?,
    };
    let not_agent = || ReachError::NotAgent {
        url: base.clone(),
        status: status.to_string(),
        server: server.clone(),
    };
    if status == StatusCode::UNAUTHORIZED {
        // Only an agent's own refusal means the token is wrong; another server's 401 is not.
        return match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(b) if b.error == "unauthorized" => Err(ReachError::TokenRejected { url: base }),
            _ => Err(not_agent()),
        };
    }
    if !status.is_success() {
        return Err(not_agent());
    }
    let info: RemoteInfo = serde_json::from_slice(&body).map_err(|_| not_agent())?;
    if info.protocol != PROTOCOL_VERSION {
        return Err(ReachError::Protocol {
            url: base,
            theirs: info.protocol,
            ours: PROTOCOL_VERSION,
            agent_version: info.agent_version,
        });
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_scheme_says_the_expected_form() {
        let e = parse_url("127.0.0.1:7781").unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("expected http://HOST:PORT"), "{e}");
        let e = parse_url("localhost:7781").unwrap_err();
        assert!(e.to_string().contains("no http:// or https://"), "{e}");
        assert!(parse_url("http://127.0.0.1:7781").is_ok());
        assert!(parse_url("https://sandbox.example:443/").is_ok());
    }
}
