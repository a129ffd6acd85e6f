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

use async_trait::async_trait;
use futures_util::stream::{BoxStream, StreamExt};

use super::deploy::Binary;
use super::master::Master;
use crate::remote::client::AgentClient;
use crate::remote::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};

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

/// The [`Remote`] of an `ssh://` mount with a deployed agent.
pub struct SshAgent {
    shared: Arc<Shared>,
}

impl SshAgent {
    pub(super) fn new(
        label: String,
        base: Vec<String>,
        host: String,
        bin: Binary,
        root: Vec<u8>,
        master: Arc<Master>,
        agent: super::Agent,
    ) -> SshAgent {
        SshAgent {
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
        }
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

    /// Run `f` on the current link's client; a transport failure starts a repair.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Arc<AgentClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let link = self.current()?;
        match f(link.client.clone()).await {
            Ok(v) => Ok(v),
            Err(e) => Err(Shared::failed(&self.shared, &link, e)),
        }
    }

    /// [`SshAgent::call`] for a call answering a stream: its items' errors are treated alike.
    async fn stream<T, F, Fut>(&self, f: F) -> Result<BoxStream<'static, Result<T>>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<AgentClient>) -> Fut,
        Fut: std::future::Future<Output = Result<BoxStream<'static, Result<T>>>>,
    {
        let link = self.current()?;
        let s = match f(link.client.clone()).await {
            Ok(s) => s,
            Err(e) => return Err(Shared::failed(&self.shared, &link, e)),
        };
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

#[async_trait]
impl Remote for SshAgent {
    async fn info(&self) -> Result<RemoteInfo> {
        self.call(|c| async move { c.info().await }).await
    }
    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        self.call(|c| async move { c.stat(path).await }).await
    }
    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        self.call(|c| async move { c.stat_many(paths).await }).await
    }
    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        self.call(|c| async move { c.list(path).await }).await
    }
    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        self.stream(|c| async move { c.tree(path).await }).await
    }
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<TreeListing>>> {
        self.stream(|c| async move { c.tree_listings(path, max_entries).await })
            .await
    }
    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        self.call(|c| async move { c.read(path, offset, len).await })
            .await
    }
    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        self.call(|c| async move { c.commit(path, content, opts).await })
            .await
    }
    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.call(|c| async move { c.create(path, mode).await })
            .await
    }
    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        self.call(|c| async move { c.mkdir(path, mode).await })
            .await
    }
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        self.call(|c| async move { c.mknod(path, kind, mode, rdev).await })
            .await
    }
    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        self.call(|c| async move { c.unlink(path).await }).await
    }
    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        self.call(|c| async move { c.rmdir(path).await }).await
    }
    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        self.call(|c| async move { c.rename(from, to, mode).await })
            .await
    }
    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        self.call(|c| async move { c.link(existing, new).await })
            .await
    }
    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        self.call(|c| async move { c.symlink(path, target).await })
            .await
    }
    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        self.call(|c| async move { c.readlink(path).await }).await
    }
    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        self.call(|c| async move { c.setattr(path, attr).await })
            .await
    }
    async fn stop_agent(&self) -> Result<String> {
        let link = self.current()?;
        self.shared.lock().stopped = true;
        super::deploy::stop(&link.master, &link.forward.1).await
    }

    async fn statfs(&self) -> Result<StatFs> {
        self.call(|c| async move { c.statfs().await }).await
    }
    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        self.call(|c| async move { c.getxattr(path, name).await })
            .await
    }
    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        self.call(|c| async move { c.listxattr(path).await }).await
    }
    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        self.call(|c| async move { c.setxattr(path, name, value, flags).await })
            .await
    }
    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        self.call(|c| async move { c.removexattr(path, name).await })
            .await
    }
    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        self.call(|c| async move { c.fallocate(path, offset, len, keep_size).await })
            .await
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
        self.call(|c| async move {
            c.copy_range(src, src_offset, dst, dst_offset, len, dst_base)
                .await
        })
        .await
    }
    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        self.call(|c| async move { c.scan(path, req).await }).await
    }
    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        self.stream(|c| async move { c.grep(path, opts).await })
            .await
    }
    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        self.call(|c| async move { c.glob(path, pattern).await })
            .await
    }
    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        self.call(|c| async move { c.fuzzy(path, req).await }).await
    }
    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        self.call(|c| async move { c.edit(path, old, new, replace_all).await })
            .await
    }
    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        self.stream(|c| async move { c.watch(since).await }).await
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
