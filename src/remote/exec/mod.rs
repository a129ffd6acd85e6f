//! The exec-only backend: a [`Remote`](super::Remote) for sandboxes that offer nothing but "run
//! this shell program" (a provider's exec API, `docker exec`, `kubectl exec`, ssh without an
//! agent, a local `sh`). Every operation is a static POSIX `sh` script; user-controlled values
//! reach it only as base64 (never spliced into the script text); results come back framed by
//! a `__RESULT__` marker and are parsed strictly. Where python3 runs in the sandbox, stat,
//! listings and trees are one python script instead ([`pyfast`]).
//!
//! A [`Runner`] is how a program reaches the sandbox: it sends one whole `sh` program and
//! answers its exit status and output (each stream capped at [`OUTPUT_CAP`] bytes, the cut
//! counted). [`CommandRunner`] runs a local command (`sh`, `docker exec -i C sh`,
//! `ssh -S … host sh`) with the program on its standard input.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

pub mod edit;
pub mod output_check;
pub mod program;
pub mod pyfast;
pub mod query;
pub mod remote;
pub mod rgjson;
pub mod session;
pub mod statline;
pub mod supervise;

use super::{RemoteError, Result};

/// Most bytes kept of one stream of one remote command; the rest is counted and dropped.
pub const OUTPUT_CAP: usize = 8 * 1024 * 1024;

/// What ran and how it ended.
#[derive(Debug, Default, Clone)]
pub struct Output {
    /// The exit status (128 + N for a signal N, as a shell reports it).
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes of each stream dropped past [`OUTPUT_CAP`].
    pub stdout_cut: u64,
    pub stderr_cut: u64,
}

/// How a run may be stopped early.
#[derive(Clone, Default)]
pub struct RunControl {
    /// Cancelled: the command is stopped (where the transport can) and the run fails.
    pub cancel: CancellationToken,
    /// Longest the run may take.
    pub timeout: Option<Duration>,
}

/// One way to run a POSIX `sh` program in the sandbox.
#[async_trait]
pub trait Runner: Send + Sync {
    /// Run `program` (whole `sh` source; it reads nothing from its standard input).
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output>;
    /// Put bytes at an absolute path in the sandbox, where the transport moves files natively
    /// (an HTTP upload). `None`: not available, the scripts carry the bytes in base64.
    async fn put_file(&self, _abs_path: &[u8], _data: Bytes) -> Option<Result<()>> {
        None
    }
    /// A whole file's bytes, where the transport moves files natively.
    async fn get_file(&self, _abs_path: &[u8]) -> Option<Result<Bytes>> {
        None
    }
    /// Run the python fast path ([`pyfast`]) inside the server that already runs in the
    /// sandbox, its `input` being what the program would pipe to `python3`: no `sh`, no
    /// supervisor, no interpreter started per call. `None`: this runner has no such server
    /// (the program is run instead).
    async fn run_python_inline(&self, _input: &[u8], _ctl: &RunControl) -> Option<Result<Output>> {
        None
    }
    /// For messages and `ctl status`: what runs the programs.
    fn describe(&self) -> String;
}

/// Read a stream to its end, keeping at most `cap` bytes; answers what was kept and how many
/// bytes were dropped (the stream is drained, so the writer never blocks on a full pipe).
pub async fn collect_capped(mut r: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut cut = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                let take = room.min(n);
                kept.extend_from_slice(&buf[..take]);
                cut += (n - take) as u64;
            }
        }
    }
    (kept, cut)
}

/// A local command that runs a shell in the sandbox, given the program on standard input:
/// `["sh"]` (the `shell:` transport), `["docker", "exec", "-i", "C", "sh"]`, an ssh command.
pub struct CommandRunner {
    argv: Vec<String>,
}

impl CommandRunner {
    pub fn new(argv: Vec<String>) -> Result<Self> {
        if argv.is_empty() {
            return Err(RemoteError::Invalid("an empty exec command".into()));
        }
        Ok(CommandRunner { argv })
    }
}

#[async_trait]
impl Runner for CommandRunner {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        let mut cmd = tokio::process::Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a cancel reaches what a local `sh` started too.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = crate::remote::tied::spawn(cmd)
            .map_err(|e| RemoteError::Transport(format!("cannot run {:?}: {e}", self.argv[0])))?;
        let mut group = LocalGroup(child.id());
        let mut stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let program = program.as_bytes().to_vec();
        let feed = async move {
            let _ = stdin.write_all(&program).await;
            drop(stdin);
        };
        let work = async {
            let (_, (out, out_cut), (err, err_cut), status) = tokio::join!(
                feed,
                collect_capped(stdout, OUTPUT_CAP),
                collect_capped(stderr, OUTPUT_CAP),
                child.wait()
            );
            let status =
                status.map_err(|e| RemoteError::Transport(format!("{}: {e}", self.describe())))?;
            use std::os::unix::process::ExitStatusExt;
            let code = status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            Ok(Output {
                code,
                stdout: out,
                stderr: err,
                stdout_cut: out_cut,
                stderr_cut: err_cut,
            })
        };
        let limit = ctl.timeout.unwrap_or(Duration::MAX);
        let stopped = tokio::select! {
            r = tokio::time::timeout(limit, work) => match r {
                Ok(r) => {
                    // Reaped: its group id is no longer ours to signal.
                    group.0 = None;
                    return r;
                }
                Err(_) => RemoteError::TimedOut(format!("{} (after {limit:?})", self.describe())),
            },
            _ = ctl.cancel.cancelled() => RemoteError::Transport(format!("{}: cancelled", self.describe())),
        };
        // Stopped early: the whole local group goes, and the child is reaped here (its group
        // id stays reserved until then, so the kill cannot reach a stranger).
        group.kill();
        group.0 = None;
        let _ = child.kill().await;
        Err(stopped)
    }

    fn describe(&self) -> String {
        self.argv.join(" ")
    }
}

/// The process group of a local command: killed (SIGKILL) when its run is dropped unfinished
/// (forgotten, `None`, once the child was reaped).
struct LocalGroup(Option<u32>);

impl LocalGroup {
    fn kill(&self) {
        if let Some(pid) = self
            .0
            .and_then(|p| i32::try_from(p).ok())
            .filter(|&p| p > 1)
        {
            // SAFETY: killpg only sends a signal; the group is our unreaped child's own.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The absolute path after `scheme` (`shell:/ABS/PATH`), percent-decoded.
fn url_path(url: &str, scheme: &str) -> Result<Vec<u8>> {
    let rest = &url[scheme.len()..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path: Vec<u8> = percent_encoding::percent_decode_str(rest).collect();
    if !path.starts_with(b"/") || path.contains(&0) {
        return Err(RemoteError::Invalid(format!(
            "{url:?}: expected {scheme}/ABSOLUTE/PATH"
        )));
    }
    Ok(path)
}

/// Probe the sandbox through `runner` and answer the connection. A workspace that is not a
/// directory is a usage mistake (exit 2) naming `url`.
async fn connect_runner(
    runner: std::sync::Arc<dyn Runner>,
    root: Vec<u8>,
    transport: &str,
    url: &str,
) -> Result<super::connect::Connected> {
    let remote = std::sync::Arc::new(remote::ScriptRemote::new(supervised(runner), root));
    let info = super::Remote::info(&*remote).await.map_err(|e| match e {
        RemoteError::NotFound(_) => {
            RemoteError::Invalid(format!("{url}: no such directory in the sandbox"))
        }
        RemoteError::NotDir(_) => {
            RemoteError::Invalid(format!("{url}: not a directory in the sandbox"))
        }
        other => other,
    })?;
    Ok(super::connect::Connected {
        remote,
        info,
        transport: transport.to_string(),
        keep: Box::new(()),
        why_scripts: None,
        scripts_by: None,
    })
}

/// `shell:/ABS/PATH[?agent=no]`: the agent over a local `sh`'s standard input and output
/// ([`super::stdio`]), or the exec-only scripts (`?agent=no`, or where no agent can run) over
/// it (the `sh` in PATH: dash on Debian, busybox's where it is first).
pub async fn connect_shell(
    url: &str,
    opts: &super::connect::ConnectOptions,
) -> Result<super::connect::Connected> {
    let (path_url, query) = without_agent_query(url)?;
    let root = url_path(path_url, "shell:")?;
    let argv = vec!["sh".to_string()];
    let why = match query.agent {
        true => match stdio_agent(&argv, &root, "shell+agent", url, opts).await? {
            Ok(c) => return Ok(session_unused(c, query)),
            Err(why) => why,
        },
        false => "?agent=no".to_string(),
    };
    let (runner, by) = scripts_runner(argv, query.session).await?;
    let mut c = connect_runner(runner, root, "shell", url).await?;
    tracing::info!(%why, "the exec-only scripts run through {by}");
    c.why_scripts = Some(why);
    c.scripts_by = Some(by);
    Ok(c)
}

/// `exec:/ABS/PATH[?agent=no]` with `--exec CMD`: as `shell:`, over CMD's standard input and
/// output. CMD is split by shell-words rules (quotes, backslashes) and run directly, never
/// through a local shell.
pub async fn connect_exec(
    url: &str,
    opts: &super::connect::ConnectOptions,
) -> Result<super::connect::Connected> {
    let (path_url, query) = without_agent_query(url)?;
    let root = url_path(path_url, "exec:")?;
    let cmd = opts.exec.as_deref().ok_or_else(|| {
        RemoteError::Invalid(format!(
            "{url}: exec: needs --exec 'COMMAND' (a command that runs a shell in the sandbox, \
             e.g. 'docker exec -i CONTAINER sh')"
        ))
    })?;
    let argv = shell_words::split(cmd)
        .map_err(|e| RemoteError::Invalid(format!("--exec {cmd:?}: {e}")))?;
    if argv.is_empty() {
        return Err(RemoteError::Invalid("an empty exec command".into()));
    }
    let why = match query.agent {
        true => match stdio_agent(&argv, &root, "exec+agent", url, opts).await? {
            Ok(c) => return Ok(session_unused(c, query)),
            Err(why) => why,
        },
        false => "?agent=no".to_string(),
    };
    let (runner, by) = scripts_runner(argv, query.session).await?;
    let mut c = connect_runner(runner, root, "exec", url).await?;
    tracing::info!(%why, "the exec-only scripts run through {by}");
    c.why_scripts = Some(why);
    c.scripts_by = Some(by);
    Ok(c)
}

/// The agent serves: `?session=no` (which is about the scripts) has nothing to do, and says so.
fn session_unused(c: super::connect::Connected, query: ExecQuery) -> super::connect::Connected {
    if !query.session {
        tracing::warn!(
            "?session=no applies to the exec-only scripts, and the agent serves this mount \
             (add agent=no for the scripts: ?agent=no&session=no)"
        );
    }
    c
}

/// Longest a freshly started agent may take to answer its first request.
const FIRST_ANSWER: std::time::Duration = std::time::Duration::from_secs(60);

/// What an exec URL's query asks for: `agent=no` (the scripts, no agent deployed) and
/// `session=no` (the scripts as a command per operation, no persistent session), joined by `&`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecQuery {
    pub agent: bool,
    pub session: bool,
}

impl ExecQuery {
    /// Parse the part after `?` (None: no query); an error names what is not known.
    pub fn parse(query: Option<&str>) -> std::result::Result<ExecQuery, String> {
        let mut q = ExecQuery {
            agent: true,
            session: true,
        };
        for part in query.into_iter().flat_map(|q| q.split('&')) {
            match part {
                "" => {}
                "agent=no" => q.agent = false,
                "agent=yes" => q.agent = true,
                "session=no" => q.session = false,
                "session=yes" => q.session = true,
                other => {
                    return Err(format!(
                        "unknown option {other:?} (known: agent=no, session=no; a '?' in the path is %3F)"
                    ))
                }
            }
        }
        Ok(q)
    }
}

/// A URL's query and the URL without it.
fn without_agent_query(url: &str) -> Result<(&str, ExecQuery)> {
    let (path, query) = match url.split_once('?') {
        None => (url, None),
        Some((path, q)) => (path, Some(q)),
    };
    let q = ExecQuery::parse(query).map_err(|e| RemoteError::Invalid(format!("{url:?}: {e}")))?;
    Ok((path, q))
}

/// The runner of the exec-only scripts over the channel `argv`: one persistent session
/// ([`session`]) unless `?session=no`, or where none starts (then a command per program); with
/// what runs them, for `ctl status`.
pub async fn scripts_runner(
    argv: Vec<String>,
    session: bool,
) -> Result<(std::sync::Arc<dyn Runner>, String)> {
    if session {
        match session::SessionRunner::start(argv.clone()).await {
            Ok(r) => {
                let by = r.serving();
                return Ok((std::sync::Arc::new(r), by));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no persistent session in the sandbox: a command per operation");
                let by = format!("a command per operation (no session: {e})");
                return Ok((std::sync::Arc::new(CommandRunner::new(argv)?), by));
            }
        }
    }
    let by = "a command per operation (?session=no)".to_string();
    Ok((std::sync::Arc::new(CommandRunner::new(argv)?), by))
}

/// The agent deployed through the exec channel `argv` and reached over its standard input
/// The agent deployed through the exec channel `argv` and reached over its standard input
/// and output (`transport`: its name in `ctl status`); where it cannot run, why (logged), for
/// the scripts to serve.
pub async fn stdio_agent(
    argv: &[String],
    root: &[u8],
    transport: &str,
    url: &str,
    opts: &super::connect::ConnectOptions,
) -> Result<std::result::Result<super::connect::Connected, String>> {
    use super::stdio::{deploy, Binary, Bridge, NoAgent};
    let bin = match Binary::chosen(opts.deploy_binary.as_deref()) {
        Ok(bin) => bin,
        Err(e) => {
            tracing::warn!(error = %e, "no agent to deploy: using the exec-only scripts");
            return Ok(Err(format!("no agent to deploy: {e}")));
        }
    };
    let agent = match deploy(argv, &bin, root).await {
        Ok(Ok(agent)) => agent,
        Ok(Err(NoAgent(why))) => {
            tracing::warn!(%why, "no agent in the sandbox: using the exec-only scripts");
            return Ok(Err(why));
        }
        Err(RemoteError::NotFound(_)) => {
            return Err(RemoteError::Invalid(format!(
                "{url}: no such directory in the sandbox"
            )))
        }
        Err(RemoteError::NotDir(_)) => {
            return Err(RemoteError::Invalid(format!(
                "{url}: not a directory in the sandbox"
            )))
        }
        Err(e) => return Err(e),
    };
    let bridge = Bridge::start(argv.to_vec(), agent, root.to_vec(), opts.allow_setid)?;
    let client = super::client::AgentClient::over_stdio_bridge(bridge.socket())?;
    let first = tokio::time::timeout(FIRST_ANSWER, super::Remote::info(&client)).await;
    let first = first.unwrap_or_else(|_| {
        Err(RemoteError::TimedOut(format!(
            "no answer within {FIRST_ANSWER:?}"
        )))
    });
    match first {
        Ok(info) => {
            tracing::info!(
                "connected to the sandbox's agent over the exec channel's standard input and output"
            );
            Ok(Ok(super::connect::Connected {
                remote: std::sync::Arc::new(client),
                info,
                transport: transport.to_string(),
                keep: Box::new(bridge),
                why_scripts: None,
                scripts_by: None,
            }))
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "the agent did not answer through the exec channel: using the exec-only scripts"
            );
            Ok(Err(format!(
                "the agent did not answer through the exec channel: {e}"
            )))
        }
    }
}

/// The exec-only [`Remote`](super::Remote) over `runner`, for the workspace at the absolute
/// path `root` in the sandbox (probed on its first call).
pub fn script_remote(
    runner: std::sync::Arc<dyn Runner>,
    root: Vec<u8>,
) -> Result<std::sync::Arc<dyn super::Remote>> {
    if !root.starts_with(b"/") || root.contains(&0) {
        return Err(RemoteError::Invalid(format!(
            "{}: the workspace must be an absolute path",
            String::from_utf8_lossy(&root)
        )));
    }
    Ok(std::sync::Arc::new(remote::ScriptRemote::new(
        supervised(runner),
        root,
    )))
}

/// Every program of the exec-only backend runs supervised: in its own process group, stopped
/// whole on cancel, timeout or a dropped run ([`supervise`]).
fn supervised(runner: std::sync::Arc<dyn Runner>) -> std::sync::Arc<dyn Runner> {
    std::sync::Arc::new(supervise::Supervised::new(runner))
}
