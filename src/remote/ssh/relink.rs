//! The deployed agent over ssh, kept reachable: when the link drops, it is made again.
//!
//! A link is one ssh master, a local socket forwarded through it to the agent's socket in the
//! sandbox, and an [`AgentClient`] over that socket. It breaks when the ssh connection drops
//! (sshd restarted, the network cut: the master exits and its forwarding with it) or when the
//! agent goes away (killed, the sandbox rebooted: the forwarding leads nowhere).
//!
//! What is guaranteed:
//! - A call that fails with a transport error starts a repair in the background, at most one
//!   at a time; the repair first asks the agent over the current link, so a passing failure
//!   costs one round trip and changes nothing.
//! - While the link is broken, calls fail at once with [`RemoteError::Transport`] (the mount's
//!   "unreachable" class: it serves what it knows and keeps writes staged), never wait for ssh.
//! - The repair tries until it succeeds, the first attempts [`FIRST_WAIT`] apart, then farther
//!   apart up to [`LONGEST_WAIT`]: a new master (BatchMode, so never a prompt), the agent found
//!   again or started again with a fresh token (on stdin, as at mount time), a new forwarding.
//!   It stops when the remote is dropped.
//! - Errors name the user's `ssh://` URL, never the forwarding's internal `http://` address.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::StreamExt;

use super::deploy::Binary;
use super::master::Master;
use crate::remote::client::AgentClient;
use crate::remote::layer::{CallFn, CommitFn, Inner, Items, Layer, Layered, Op};
use crate::remote::*;

/// Wait before the second repair attempt: a restarted sshd is back within a second or two, and
/// one attempt (a refused connection) costs almost nothing.
pub const FIRST_WAIT: Duration = Duration::from_secs(1);
/// Longest wait between attempts: a sandbox away for long is still found within this once it
/// is back, and a dead one costs one ssh connection attempt per this interval.
pub const LONGEST_WAIT: Duration = Duration::from_secs(8);

/// Longest the repair waits for the agent to answer over the current link before taking it
/// for broken (a half-dead connection would otherwise hold the repair for ssh's keepalive).
const CHECK_DEADLINE: Duration = Duration::from_secs(10);

/// The address the agent's client names for the forwarded socket (it has no host of its own).
const INTERNAL: [&str; 2] = ["http://sbxfs-agent:80", "http://sbxfs-agent"];

/// One working link: the master and the client over its forwarding.
struct Link {
    master: Arc<Master>,
    client: Arc<AgentClient>,
    /// The forwarding the client goes through: cancelled when a repair keeps the master.
    forward: (std::path::PathBuf, Vec<u8>),
}

/// What a repair needs to make a link from nothing.
struct Plan {
    /// The user's URL, for messages.
    label: String,
    base: Vec<String>,
    host: String,
    bin: Binary,
    root: Vec<u8>,
}

struct State {
    /// `None` while broken.
    link: Option<Arc<Link>>,
    /// A repair is running.
    repairing: bool,
    /// The agent was stopped on purpose (`sbxfs umount --stop-agent`): none is started again.
    stopped: bool,
    /// Why the link broke (for the fail-fast error).
    cause: String,
}

struct Shared {
    plan: Plan,
    state: Mutex<State>,
}

/// The relink [`Layer`]: each call goes to the current link's agent; a transport failure
/// starts a repair.
pub struct Relink {
    shared: Arc<Shared>,
}

/// The [`Remote`] of an `ssh://` mount with a deployed agent.
pub type SshAgent = Layered<Relink>;

impl Relink {
    pub(super) fn new(
        label: String,
        base: Vec<String>,
        host: String,
        bin: Binary,
        root: Vec<u8>,
        master: Arc<Master>,
        agent: super::Agent,
    ) -> SshAgent {
        Layered::of(Relink {
            shared: Arc::new(Shared {
                plan: Plan {
                    label,
                    base,
                    host,
                    bin,
                    root,
                },
                state: Mutex::new(State {
                    link: Some(Arc::new(Link {
                        master,
                        client: Arc::new(agent.client),
                        forward: agent.forward,
                    })),
                    repairing: false,
                    stopped: false,
                    cause: String::new(),
                }),
            }),
        })
    }

    /// The current link's client, or the fail-fast error (and a repair started).
    fn current(&self) -> Result<Arc<Link>> {
        let link = self.shared.lock().link.clone();
        match link {
            Some(l) if !l.master.exited() => Ok(l),
            Some(l) => {
                let e = RemoteError::Transport("the ssh connection closed".into());
                Err(Shared::failed(&self.shared, &l, e))
            }
            None => {
                Shared::repair(&self.shared);
                let cause = self.shared.lock().cause.clone();
                Err(RemoteError::Transport(format!(
                    "{}: the ssh connection is down, reconnecting ({cause})",
                    self.shared.plan.label
                )))
            }
        }
    }

    /// The error a call over `link` answers, a repair started on a transport failure.
    fn failed(&self, link: &Arc<Link>, e: RemoteError) -> RemoteError {
        Shared::failed(&self.shared, link, e)
    }
}

impl Layer for Relink {
    fn inner(&self) -> Result<Inner> {
        Ok(self.current()?.client.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        _op: Op,
        _bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        async move {
            let link = self.current()?;
            call(link.client.clone())
                .await
                .map_err(|e| self.failed(&link, e))
        }
        .boxed()
    }

    /// As a call, and the stream's items' errors are treated alike.
    fn stream<'a, T: Send + 'static>(
        &'a self,
        _op: Op,
        call: CallFn<'a, Items<T>>,
    ) -> BoxFuture<'a, Result<Items<T>>> {
        async move {
            let link = self.current()?;
            let s = call(link.client.clone())
                .await
                .map_err(|e| self.failed(&link, e))?;
            let shared = Arc::downgrade(&self.shared);
            let link = Arc::downgrade(&link);
            Ok(s.map(move |item| {
                item.map_err(|e| match (shared.upgrade(), link.upgrade()) {
                    (Some(s), Some(l)) => Shared::failed(&s, &l, e),
                    _ => e,
                })
            })
            .boxed())
        }
        .boxed()
    }

    fn commit<'a>(
        &'a self,
        _path: &'a RemotePath,
        content: CommitContent,
        call: CommitFn<'a>,
    ) -> BoxFuture<'a, Result<Attr>> {
        async move {
            let link = self.current()?;
            call(link.client.clone(), content)
                .await
                .map_err(|e| self.failed(&link, e))
        }
        .boxed()
    }

    /// The agent stopped through the link's master (its own STOP script), and none started
    /// again by a repair.
    fn stop_agent(&self) -> BoxFuture<'_, Result<String>> {
        async move {
            let link = self.current()?;
            self.shared.lock().stopped = true;
            super::deploy::stop(&link.master, &link.forward.1).await
        }
        .boxed()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call over `link` failed with `e`: a transport failure starts a repair. Answers the
    /// error as the caller should see it.
    fn failed(this: &Arc<Shared>, link: &Arc<Link>, e: RemoteError) -> RemoteError {
        let e = relabel(e, &this.plan.label);
        if matches!(e, RemoteError::Transport(_)) {
            if link.master.exited() {
                let mut st = this.lock();
                if st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link)) {
                    tracing::warn!(error = %e, "the ssh connection closed: reconnecting");
                    st.link = None;
                    st.cause = "the ssh connection closed".into();
                }
            }
            Shared::repair(this);
        }
        e
    }

    /// Start the background repair unless one is running.
    fn repair(this: &Arc<Shared>) {
        {
            let mut st = this.lock();
            if st.repairing || st.stopped {
                return;
            }
            st.repairing = true;
        }
        let weak = Arc::downgrade(this);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            this.lock().repairing = false;
            return;
        };
        rt.spawn(repair_loop(weak));
    }
}

/// Until the link works again (or the remote is gone): check it, and make it again if broken.
async fn repair_loop(weak: Weak<Shared>) {
    let mut wait = FIRST_WAIT;
    loop {
        let Some(this) = weak.upgrade() else { return };
        let outcome = repair_once(&this).await;
        match outcome {
            Ok(()) => {
                this.lock().repairing = false;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?wait, "reconnecting over ssh failed");
                this.lock().cause = relabel(e, &this.plan.label).to_string();
            }
        }
        drop(this);
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
    }
}

/// One attempt: nothing to do if the agent answers over the current link; otherwise the
/// master (kept if it still answers, else started again), the agent (found, or started with
/// a fresh token), a new forwarding.
async fn repair_once(this: &Arc<Shared>) -> Result<()> {
    let current = this.lock().link.clone();
    if let Some(l) = &current {
        let answers = tokio::time::timeout(CHECK_DEADLINE, l.client.info()).await;
        if !l.master.exited() && matches!(answers, Ok(Ok(_))) {
            return Ok(());
        }
    }
    {
        let mut st = this.lock();
        if st.link.is_some() {
            tracing::warn!("the agent does not answer over ssh: reconnecting");
            st.cause = "the agent does not answer".into();
        }
        st.link = None;
    }
    let master = match current {
        Some(l)
            if {
                let m = l.master.clone();
                tokio::task::spawn_blocking(move || m.alive())
                    .await
                    .unwrap_or(false)
            } =>
        {
            // The old forwarding leads to a socket that is gone or replaced: stop it.
            let (m, (local, remote)) = (l.master.clone(), l.forward.clone());
            let _ = tokio::task::spawn_blocking(move || m.cancel_forward(&local, &remote)).await;
            l.master.clone()
        }
        _ => {
            let (base, host) = (this.plan.base.clone(), this.plan.host.clone());
            let m = tokio::task::spawn_blocking(move || Master::start(base, &host))
                .await
                .map_err(|e| RemoteError::Transport(format!("ssh: {e}")))??;
            Arc::new(m)
        }
    };
    let agent = match super::with_agent(&master, &this.plan.bin, &this.plan.root, &this.plan.label)
        .await?
    {
        Ok(a) => a,
        Err(super::deploy::NoAgent(why)) => {
            return Err(RemoteError::Transport(format!(
                "the agent cannot run in the sandbox any more: {why}"
            )))
        }
    };
    tracing::info!("reconnected to the sandbox's agent over ssh");
    let mut st = this.lock();
    st.link = Some(Arc::new(Link {
        master,
        client: Arc::new(agent.client),
        forward: agent.forward,
    }));
    st.cause.clear();
    Ok(())
}

/// `e` with the forwarding's internal address replaced by the user's URL.
pub(super) fn relabel(e: RemoteError, label: &str) -> RemoteError {
    let fix = |m: String| {
        let mut m = m;
        for i in INTERNAL {
            if m.contains(i) {
                m = m.replace(i, label);
            }
        }
        m
    };
    match e {
        RemoteError::Transport(m) => RemoteError::Transport(fix(m)),
        RemoteError::TimedOut(m) => RemoteError::TimedOut(fix(m)),
        RemoteError::Io(a, b) => RemoteError::Io(fix(a), fix(b)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_users_url_not_the_forwarding() {
        let e = relabel(
            RemoteError::Transport("connection refused (http://sbxfs-agent:80)".into()),
            "ssh://box/w",
        );
        assert_eq!(
            e.to_string(),
            "the sandbox did not answer: connection refused (ssh://box/w)"
        );
        let e = relabel(RemoteError::NotFound("a".into()), "ssh://box/w");
        assert_eq!(e, RemoteError::NotFound("a".into()));
    }
}
