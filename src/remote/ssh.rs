//! The `ssh://[USER@]HOST[:PORT]/ABS/PATH[?agent=no]` transport, over the user's own OpenSSH
//! client and config (keys, ssh-agent, `~/.ssh/config`; `-o ssh_command=`, `-F`).
//!
//! One ControlMaster carries everything ([`master`]). Unless `?agent=no`, sbxfs finds this
//! workspace's agent in the sandbox or deploys its own binary there and starts it on a Unix
//! socket ([`deploy`]); a local socket in the connection's private directory is forwarded to
//! it, and the [`AgentClient`] speaks HTTP over that ("ssh+agent"). When the sandbox cannot
//! run it (read-only or noexec directories, a binary that does not run there) the exec-only
//! scripts run over `ssh … sh` instead ("ssh+scripts"). Dropping the connection stops the
//! master and its forwarding; the agent stays for the next mount and exits after
//! [`deploy::AGENT_IDLE_EXIT`] without a client. A dropped link (sshd restarted, the agent
//! killed) is made again in the background ([`relink`]); the master dies with the process
//! that started it, even a SIGKILLed one ([`master`]).

mod deploy;
mod master;
pub use master::quote;
mod relink;
pub mod target;

use std::sync::Arc;

use super::client::AgentClient;
use super::connect::{ConnectOptions, Connected};
use super::{Remote, RemoteError, Result};

pub use deploy::{workspace_key, AGENT_IDLE_EXIT};
pub use relink::{Relink, SshAgent, FIRST_WAIT, LONGEST_WAIT};

pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Connected> {
    let t = target::parse(url)?;
    let base = master::base_argv(&t, opts.ssh_command.as_deref(), opts.ssh_config.as_deref())?;
    let host = t.host.clone();
    let b = base.clone();
    let ssh = tokio::task::spawn_blocking(move || master::Master::start(b, &host))
        .await
        .map_err(|e| RemoteError::Transport(format!("ssh: {e}")))??;
    let ssh = Arc::new(ssh);
    let named = |e: RemoteError| match e {
        RemoteError::Invalid(m) => RemoteError::Invalid(format!("{url}: {m}")),
        other => other,
    };
    let mut why_scripts = None;
    if t.agent {
        let bin = match &opts.deploy_binary {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| RemoteError::Transport(format!("this program's path: {e}")))?,
        };
        let bin = deploy::Binary::of(bin)?;
        let reached = match with_agent(&ssh, &bin, &t.root, url).await {
            // The agent's socket cannot be reached through ssh: a server with
            // `AllowTcpForwarding no` refuses the forwarding's channel. The agent then speaks
            // on an ssh session's standard input and output, which every server allows.
            Err(e @ (RemoteError::Transport(_) | RemoteError::TimedOut(_))) => {
                tracing::warn!(
                    error = %e,
                    "the agent's socket cannot be reached through ssh (does the server refuse \
                     forwarding?): speaking to the agent over an ssh session instead"
                );
                let argv = ssh.argv(&["sh"]);
                let opts = ConnectOptions {
                    deploy_binary: Some(bin.path.clone()),
                    ..opts.clone()
                };
                match super::exec::stdio_agent(&argv, &t.root, "ssh+stdio", url, &opts).await? {
                    Ok(mut c) => {
                        c.keep = Box::new((c.keep, ssh));
                        c.why_scripts = Some(format!(
                            "the agent's socket cannot be reached through ssh (the server refuses \
                             forwarding?): {e}"
                        ));
                        return Ok(c);
                    }
                    Err(_) => Err(e),
                }
            }
            other => other,
        };
        match reached.map_err(named)? {
            Ok(agent) => {
                let remote: Arc<dyn Remote> = Arc::new(Relink::new(
                    url.to_string(),
                    base,
                    t.host.clone(),
                    bin,
                    t.root.clone(),
                    ssh,
                    agent,
                ));
                let info = remote.info().await?;
                return Ok(Connected {
                    remote,
                    info,
                    transport: "ssh+agent".into(),
                    keep: Box::new(()),
                    why_scripts: None,
                    scripts_by: None,
                });
            }
            Err(deploy::NoAgent(why)) => {
                tracing::warn!(%why, "no agent in the sandbox: using the exec-only scripts");
                why_scripts = Some(why);
            }
        }
    }
    let (runner, by) = super::exec::scripts_runner(ssh.argv(&["sh"]), t.session).await?;
    let remote = super::exec::script_remote(runner, t.root.clone())?;
    let info = remote.info().await.map_err(|e| match e {
        RemoteError::NotFound(_) | RemoteError::NotDir(_) => {
            named(deploy::missing_workspace(&t.root))
        }
        other => other,
    })?;
    tracing::info!("the exec-only scripts run through {by}");
    Ok(Connected {
        remote,
        info,
        transport: "ssh+scripts".into(),
        keep: Box::new(ssh),
        why_scripts: why_scripts.or_else(|| (!t.agent).then(|| "?agent=no".to_string())),
        scripts_by: Some(by),
    })
}

/// The agent's client over a forwarded socket; a reused agent that does not answer is
/// restarted once. `label`: the user's URL, which errors name.
async fn with_agent(
    ssh: &master::Master,
    bin: &deploy::Binary,
    root: &[u8],
    label: &str,
) -> Result<std::result::Result<Agent, deploy::NoAgent>> {
    let mut restart = false;
    loop {
        let d = match deploy::deploy(ssh, bin, root, restart).await? {
            Ok(d) => d,
            Err(no) => return Ok(Err(no)),
        };
        // A new name per forwarding: one made before on this master may still be listening.
        let local = ssh.dir().join(format!("agent{}.sock", next_socket()));
        ssh.forward(&local, &d.remote_socket)?;
        let client = AgentClient::over_unix_socket(&local, &d.token)?;
        match client.info().await.map_err(|e| relink::relabel(e, label)) {
            Ok(_) => {
                tracing::info!(
                    reused = d.reused,
                    "connected to the sandbox's agent over ssh"
                );
                return Ok(Ok(Agent {
                    client,
                    forward: (local, d.remote_socket),
                }));
            }
            Err(e) if d.reused && !restart => {
                tracing::info!(error = %e, "the running agent did not answer: starting a new one");
                restart = true;
            }
            Err(e) => {
                // An agent this mount started and cannot reach (a server refusing forwarding)
                // would wait 30 minutes for a client that never comes: stopped now.
                if !d.reused {
                    let _ = deploy::stop(ssh, &d.remote_socket).await;
                }
                return Err(e);
            }
        }
    }
}

/// The agent reached: its client, and the forwarding it goes through (local socket, the
/// agent's socket in the sandbox).
struct Agent {
    client: AgentClient,
    forward: (std::path::PathBuf, Vec<u8>),
}

/// A number for each forwarded socket this process makes.
fn next_socket() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
