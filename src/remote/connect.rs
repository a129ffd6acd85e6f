//! `connect(url)`: one place that turns what the user typed into a [`Remote`].
//!
//! | URL | transport |
//! |---|---|
//! | `http://HOST:PORT`, `https://…` | the sbxfs agent over HTTP(S) ([`super::client`]) |
//! | `ssh://[USER@]HOST[:PORT]/ABS/PATH[?agent=no]` | OpenSSH: a self-deployed agent over the ssh channel, or the exec-only scripts ([`super::ssh`]) |
//! | `shell:/ABS/PATH` | exec-only scripts over a local `sh` ([`super::exec`]) |
//! | `exec:/ABS/PATH` with `--exec 'CMD'` | exec-only scripts over CMD's stdio ([`super::exec`]) |
//! | `agentscope+http(s)://HOST:PORT[/ABS/PATH]` | agentscope-runtime's box server API ([`super::agentscope`]) |

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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

/// Connect to the sandbox `url` names (its first contact made: a wrong URL, token or server
/// fails here, before anything is created).
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Connected> {
    match scheme_of(url)? {
        Scheme::Http => Err(RemoteError::Unsupported(format!(
            "{url}: connect() for http(s) is being written"
        ))),
        Scheme::Ssh => super::ssh::connect(url, opts).await,
        Scheme::Shell => super::exec::connect_shell(url, opts).await,
        Scheme::Exec => super::exec::connect_exec(url, opts).await,
        Scheme::AgentScope => super::agentscope::connect(url, opts).await,
    }
}
