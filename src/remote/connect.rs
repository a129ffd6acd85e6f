//! `connect(url)`: one place that turns what the user typed into a [`Remote`].
//!
//! | URL | transport |
//! |---|---|
//! | `http://HOST:PORT`, `https://…` | the sbxfs agent over HTTP(S) ([`super::client`]) |
//! | `ssh://[USER@]HOST[:PORT]/ABS/PATH[?agent=no]` | OpenSSH: a self-deployed agent over the ssh channel, or the exec-only scripts ([`super::ssh`]) |
//! | `shell:/ABS/PATH[?agent=no]` | the agent over a local `sh`'s stdio ([`super::stdio`]), or the exec-only scripts ([`super::exec`]) |
//! | `exec:/ABS/PATH[?agent=no]` with `--exec 'CMD'` | the same over CMD's stdio |
//! | `agentscope+http(s)://HOST:PORT[/ABS/PATH]` | agentscope-runtime's box server API ([`super::agentscope`]) |

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::deadline::Deadlines;
use super::httpsetup::HttpSetup;
use super::reach::{ReachError, EXIT_TOKEN, EXIT_UNREACHABLE, EXIT_USAGE};
use super::retry::retrying;
use super::{Remote, RemoteError, RemoteInfo, Result};

/// Everything besides the URL that a transport may need.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// The agent's token (http, https); agentscope's SECRET_TOKEN.
    pub token: Option<String>,
    /// Extra CA certificates (PEM) trusted for https, besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Extra request headers, one `Name: value` per line (providers that authenticate
    /// preview URLs that way). Values are secrets: never logged.
    pub header_file: Option<PathBuf>,
    /// `exec:`: the command that runs a shell in the sandbox (`docker exec -i C sh`).
    pub exec: Option<String>,
    /// `ssh://`: the ssh command to use instead of `ssh` (`-o ssh_command=`).
    pub ssh_command: Option<String>,
    /// `ssh://`: an ssh config file (`-F`).
    pub ssh_config: Option<PathBuf>,
    /// `ssh://`: the sbxfs binary to deploy in the sandbox (default: this program; it must be
    /// the static build to run on any sandbox).
    pub deploy_binary: Option<PathBuf>,
    /// `shell:`/`exec:`: the agent started through the channel keeps set-ID bits
    /// (`agent --allow-setid`; the mount's `-o allow_setid`).
    pub allow_setid: bool,
    /// Deadline of one call (the mount's `-o timeout_ms=`).
    pub call_timeout: Option<Duration>,
}

/// A connected sandbox.
pub struct Connected {
    pub remote: Arc<dyn Remote>,
    pub info: RemoteInfo,
    /// The transport's name, for `ctl status`: "http", "https", "ssh+agent", "ssh+scripts",
    /// "shell", "exec", "agentscope".
    pub transport: String,
    /// Whatever must live as long as the connection (an ssh master, a forwarding).
    pub keep: Box<dyn std::any::Any + Send + Sync>,
    /// Why the transport is not the first choice: why the exec-only scripts serve where an
    /// agent was wanted, or why ssh's agent speaks over a session, not a forwarded socket
    /// (`ctl status`'s `mount.transport_why`).
    pub why_scripts: Option<String>,
    /// What runs the exec-only scripts: one python3 or sh session, or a command per operation
    /// (`ctl status`'s `mount.scripts_run_by`).
    pub scripts_by: Option<String>,
}

/// The transports, by URL scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Ssh,
    Shell,
    Exec,
    AgentScope,
}

/// Which transport a URL names.
pub fn scheme_of(url: &str) -> Result<Scheme> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(Scheme::Http)
    } else if lower.starts_with("ssh://") {
        Ok(Scheme::Ssh)
    } else if lower.starts_with("shell:") {
        Ok(Scheme::Shell)
    } else if lower.starts_with("exec:") {
        Ok(Scheme::Exec)
    } else if lower.starts_with("agentscope+http://") || lower.starts_with("agentscope+https://") {
        Ok(Scheme::AgentScope)
    } else {
        Err(RemoteError::Invalid(format!(
            "{url:?}: not a sandbox URL: expected http(s)://HOST:PORT, ssh://[USER@]HOST[:PORT]/PATH, \
             shell:/PATH, exec:/PATH (with --exec CMD) or agentscope+http(s)://HOST:PORT"
        )))
    }
}

/// Why a connection could not be made, with the exit code `sbxfs mount` gives it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A usage mistake (an unknown scheme, a missing token, a bad --ca-file/--header-file).
    #[error("{0}")]
    Usage(String),
    /// The first contact with an agent over http(s) failed; its cause named.
    #[error(transparent)]
    Reach(#[from] ReachError),
    /// Another transport's failure.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl ConnectError {
    /// The process exit code (the table in `sbxfs --help`).
    pub fn exit_code(&self) -> i32 {
        match self {
            ConnectError::Usage(_) => EXIT_USAGE,
            ConnectError::Reach(r) => r.exit_code(),
            ConnectError::Remote(RemoteError::Invalid(_) | RemoteError::Unsupported(_)) => {
                EXIT_USAGE
            }
            ConnectError::Remote(RemoteError::Unauthorized(_)) => EXIT_TOKEN,
            ConnectError::Remote(_) => EXIT_UNREACHABLE,
        }
    }
}

impl From<ConnectError> for RemoteError {
    fn from(e: ConnectError) -> RemoteError {
        match e {
            ConnectError::Remote(r) => r,
            ConnectError::Usage(m) => RemoteError::Invalid(m),
            ConnectError::Reach(r) => {
                let m = r.to_string();
                match r {
                    ReachError::BadUrl { .. } => RemoteError::Invalid(m),
                    ReachError::TokenRejected { .. } => RemoteError::Unauthorized(m),
                    ReachError::TimedOut { .. } => RemoteError::TimedOut(m),
                    _ => RemoteError::Transport(m),
                }
            }
        }
    }
}

/// Connect to the sandbox `url` names (its first contact made: a wrong URL, token or server
/// fails here, before anything is created).
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Connected> {
    connect_reporting(url, opts, |_| {})
        .await
        .map_err(RemoteError::from)
}

/// [`connect`], calling `waiting` every few seconds while an agent has not answered yet, and
/// failing with the cause's own exit code. Whatever the transport, its remote comes back
/// wrapped in the one retry ([`super::retry`]) and deadline ([`super::deadline`]) wrapper.
pub async fn connect_reporting(
    url: &str,
    opts: &ConnectOptions,
    waiting: impl Fn(Duration),
) -> std::result::Result<Connected, ConnectError> {
    let scheme = scheme_of(url).map_err(|e| match e {
        RemoteError::Invalid(m) => ConnectError::Usage(m),
        other => ConnectError::Remote(other),
    })?;
    check_options_apply(scheme, opts).map_err(ConnectError::Usage)?;
    // The agent's first contact says it is still waiting itself; the others (a deploy, an
    // upload through a slow channel) are said here.
    use super::reach::reporting;
    let mut c = match scheme {
        Scheme::Http => connect_http(url, opts, &waiting).await?,
        Scheme::Ssh => reporting(super::ssh::connect(url, opts), &waiting).await?,
        Scheme::Shell => reporting(super::exec::connect_shell(url, opts), &waiting).await?,
        Scheme::Exec => reporting(super::exec::connect_exec(url, opts), &waiting).await?,
        Scheme::AgentScope => reporting(super::agentscope::connect(url, opts), &waiting).await?,
    };
    let call = opts.call_timeout.unwrap_or(super::deadline::CALL);
    c.remote = Arc::new(Deadlines::with_call_deadline(
        Arc::new(retrying(c.remote)),
        call,
    ));
    Ok(c)
}

/// An option meant for another transport is a mistake worth saying (`--exec` with `shell:`
/// would otherwise be silently ignored and the mount would reach somewhere else than meant).
fn check_options_apply(scheme: Scheme, opts: &ConnectOptions) -> std::result::Result<(), String> {
    let misplaced = |flag: &str, for_what: &str| {
        format!(
            "{flag} is only for {for_what} URLs (this one is {})",
            format!("{scheme:?}").to_lowercase()
        )
    };
    if opts.exec.is_some() && scheme != Scheme::Exec {
        return Err(misplaced("--exec", "exec:"));
    }
    if (opts.ssh_command.is_some() || opts.ssh_config.is_some()) && scheme != Scheme::Ssh {
        return Err(misplaced("-F / -o ssh_command", "ssh://"));
    }
    if (opts.ca_file.is_some() || opts.header_file.is_some())
        && !matches!(scheme, Scheme::Http | Scheme::AgentScope)
    {
        return Err(misplaced(
            "--ca-file / --header-file",
            "http(s):// and agentscope+http(s)://",
        ));
    }
    Ok(())
}

/// Our agent over http or https: `--ca-file` and `--header-file` loaded, the first contact
/// made with them (its one-line errors and exit codes), then the client.
async fn connect_http(
    url: &str,
    opts: &ConnectOptions,
    waiting: impl Fn(Duration),
) -> std::result::Result<Connected, ConnectError> {
    let setup = HttpSetup::load(opts.ca_file.as_deref(), opts.header_file.as_deref())
        .map_err(ConnectError::Usage)?;
    let Some(token) = opts.token.as_deref() else {
        return Err(ConnectError::Usage(
            "no token: pass --token-file FILE (for a mount also -o token_file=FILE) or set SBXFS_TOKEN"
                .into(),
        ));
    };
    let timeout = opts.call_timeout.unwrap_or(super::deadline::CALL);
    let info = super::reach::first_contact_with(url, token, timeout, &setup, waiting).await?;
    let client = super::client::AgentClient::with_setup(url, token, &setup)?;
    let transport = if url.to_ascii_lowercase().starts_with("https://") {
        "https"
    } else {
        "http"
    };
    Ok(Connected {
        remote: Arc::new(client),
        info,
        transport: transport.into(),
        keep: Box::new(()),
        why_scripts: None,
        scripts_by: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_option_for_another_transport_is_a_usage_error() {
        let cases: [(&str, ConnectOptions); 3] = [
            (
                "shell:/tmp",
                ConnectOptions {
                    exec: Some("sh".into()),
                    ..Default::default()
                },
            ),
            (
                "exec:/tmp",
                ConnectOptions {
                    exec: Some("sh".into()),
                    ssh_config: Some("/dev/null".into()),
                    ..Default::default()
                },
            ),
            (
                "ssh://h/tmp",
                ConnectOptions {
                    ca_file: Some("/dev/null".into()),
                    ..Default::default()
                },
            ),
        ];
        for (url, opts) in cases {
            let e = connect_reporting(url, &opts, |_| {}).await.err().unwrap();
            assert_eq!(e.exit_code(), EXIT_USAGE, "{url}: {e}");
            assert!(e.to_string().contains("is only for"), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_a_usage_error_naming_the_forms() {
        let e = connect_reporting("ftp://h/x", &ConnectOptions::default(), |_| {})
            .await
            .err()
            .unwrap();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("ssh://[USER@]HOST"), "{e}");
    }

    #[tokio::test]
    async fn http_without_a_token_is_a_usage_error() {
        let e = connect_reporting("http://127.0.0.1:1", &ConnectOptions::default(), |_| {})
            .await
            .err()
            .unwrap();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().starts_with("no token"), "{e}");
    }
}
