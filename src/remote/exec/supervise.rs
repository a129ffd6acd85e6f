//! Supervised remote processes: every program a [`Supervised`] runner sends runs in the
//! sandbox in its own process group (a new session, `setsid`) under a supervising `sh` that
//! stops whatever the program left running (TERM, then KILL after 2 s) and removes the job's
//! files before it reports the program's exit status.
//!
//! The job's files live in a private (0700, checked to be ours and not a symlink) directory
//! in memory where the sandbox has one: `/dev/shm/sbxfs-jobs-UID`, else `$TMPDIR`, else `/tmp`.
//! `J.prog` is the program, `J.pgid` the group id, `J.env` the secrets, `J.cancel` a marker.
//!
//! Cancel (the caller's token, or the timeout) runs a second, small program on the same
//! runner that leaves the marker and stops the group. The job shell records its group before
//! it looks for the marker and the canceller leaves the marker before it reads the group, so
//! a cancel that comes before the command started makes it exit 143 without running it.
//! A run dropped before it finished (a FUSE interrupt drops the request's future) is
//! cancelled the same way, from a spawned task.
//!
//! Secrets ([`Job::secrets`]: tokens, environment values) never appear in a command string,
//! an argv or a log: they are written to `J.env` (through the runner's `put_file` where it
//! has one, else inside the program text that travels on the runner's standard input), and
//! the job shell sources that file and deletes it before the program's first line runs; they
//! reach the program as shell variables, exported to what it starts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::{Output, RunControl, Runner};
use crate::remote::{RemoteError, Result};

const PRELUDE: &str = include_str!("supervise.sh");
const RUN: &str = include_str!("supervise-run.sh");
const CANCEL: &str = include_str!("supervise-cancel.sh");

/// How long a cancelled run may take to report once its group was signalled: the canceller's
/// 2 s between TERM and KILL, the supervisor's own 2 s for leftovers, and a round trip.
const STOP_GRACE: Duration = Duration::from_secs(8);

/// The exit status of a program stopped by SIGTERM (128 + 15), or cancelled before it started.
pub const CANCELLED_EXIT: i32 = 143;

/// A supervised job's name in the sandbox's job directory: unique per process and call
/// (it names files, it is no secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobId(String);

impl JobId {
    pub fn new() -> JobId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        JobId(format!("{:x}-{:x}-{:x}", std::process::id(), nanos, n))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for JobId {
    fn default() -> Self {
        JobId::new()
    }
}

/// One program to run, with the secret values it may read as shell variables.
#[derive(Clone, Default)]
pub struct Job {
    pub id: JobId,
    pub program: String,
    /// `(NAME, value)`: NAME a shell variable name; the value any bytes but NUL.
    pub secrets: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Job {
    // Never the secret values, so a Job can be logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("program_bytes", &self.program.len())
            .field("secret_names", &names)
            .finish()
    }
}

/// A [`Runner`] whose every program runs supervised in the sandbox (see the module notes).
pub struct Supervised<R: Runner + ?Sized + 'static> {
    inner: Arc<R>,
}

impl<R: Runner + ?Sized + 'static> Supervised<R> {
    pub fn new(inner: Arc<R>) -> Supervised<R> {
        Supervised { inner }
    }

    /// Run `job` supervised. Cancel or timeout: the job's group is stopped and the run fails
    /// with [`RemoteError::Transport`] ("cancelled") or [`RemoteError::TimedOut`].
    pub async fn run_job(&self, job: &Job, ctl: &RunControl) -> Result<Output> {
        let env = secrets_file(&job.secrets)?;
        if ctl.cancel.is_cancelled() {
            return Err(self.cancelled(&job.id, "before it started"));
        }
        let inline_env = match env {
            Some(text) => match self.put_secrets(&job.id, text.clone(), ctl).await {
                Some(r) => {
                    r?;
                    None
                }
                None => Some(text),
            },
            None => None,
        };
        let program = run_program(&job.id, &job.program, inline_env.as_deref());
        // The transport's own cancel is kept for after the group was stopped: dropping the
        // connection first would leave the group running in the sandbox.
        let transport_cancel = CancellationToken::new();
        let inner_ctl = RunControl {
            cancel: transport_cancel.clone(),
            timeout: None,
        };
        let mut guard = CancelOnDrop {
            inner: Some(self.inner.clone()),
            job: job.id.clone(),
        };
        let run = self.inner.run(&program, &inner_ctl);
        tokio::pin!(run);
        let limit = ctl.timeout.unwrap_or(Duration::MAX);
        let why = tokio::select! {
            r = &mut run => {
                guard.inner = None;
                let out = r?;
                if out.code == CANCELLED_EXIT && was_cancelled(&out) {
                    return Err(self.cancelled(&job.id, "in the sandbox"));
                }
                return Ok(out);
            }
            _ = ctl.cancel.cancelled() => None,
            _ = tokio::time::sleep(limit) => Some(limit),
        };
        guard.inner = None;
        let stop = cancel_job(self.inner.as_ref(), &job.id).await;
        // The supervisor reports once the group is gone; past the grace the transport goes too.
        let _ = tokio::time::timeout(STOP_GRACE, &mut run).await;
        transport_cancel.cancel();
        let stopped = match stop {
            Ok(()) => "its process group was stopped".to_string(),
            Err(e) => format!("stopping its process group failed: {e}"),
        };
        Err(match why {
            None => RemoteError::Transport(format!(
                "{}: job {} cancelled; {stopped}",
                self.inner.describe(),
                job.id.as_str()
            )),
            Some(limit) => RemoteError::TimedOut(format!(
                "{}: job {} ran past {limit:?}; {stopped}",
                self.inner.describe(),
                job.id.as_str()
            )),
        })
    }

    /// Cancel the job `id` (running, or not yet started: it will then exit 143 unrun).
    pub async fn cancel(&self, id: &JobId) -> Result<()> {
        cancel_job(self.inner.as_ref(), id).await
    }

    fn cancelled(&self, id: &JobId, when: &str) -> RemoteError {
        RemoteError::Transport(format!(
            "{}: job {} cancelled {when}",
            self.inner.describe(),
            id.as_str()
        ))
    }

    /// Write the secrets file through the transport's own upload, into the job directory
    /// (found by a first small program). `None`: the transport has no upload.
    async fn put_secrets(&self, id: &JobId, text: String, ctl: &RunControl) -> Option<Result<()>> {
        let found = self
            .inner
            .run(
                &format!("j={}\n{PRELUDE}printf '%s' \"$p\"\n", id.as_str()),
                ctl,
            )
            .await;
        let out = match found {
            Ok(out) if out.code == 0 && out.stdout.starts_with(b"/") => out,
            Ok(out) => {
                return Some(Err(RemoteError::Transport(format!(
                    "{}: no job directory: {}",
                    self.inner.describe(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))))
            }
            Err(e) => return Some(Err(e)),
        };
        let mut path = out.stdout;
        path.extend_from_slice(b".env");
        self.inner.put_file(&path, Bytes::from(text)).await
    }
}

#[async_trait]
impl<R: Runner + ?Sized + 'static> Runner for Supervised<R> {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        let job = Job {
            id: JobId::new(),
            program: program.to_string(),
            secrets: Vec::new(),
        };
        self.run_job(&job, ctl).await
    }

    async fn put_file(&self, abs_path: &[u8], data: Bytes) -> Option<Result<()>> {
        self.inner.put_file(abs_path, data).await
    }

    /// Nothing to supervise: no process is started for it.
    async fn run_python_inline(&self, input: &[u8], ctl: &RunControl) -> Option<Result<Output>> {
        self.inner.run_python_inline(input, ctl).await
    }

    async fn get_file(&self, abs_path: &[u8]) -> Option<Result<Bytes>> {
        self.inner.get_file(abs_path).await
    }

    fn describe(&self) -> String {
        format!("{} (supervised)", self.inner.describe())
    }
}

/// Cancels the job from a spawned task when a run is dropped before it finished.
struct CancelOnDrop<R: Runner + ?Sized + 'static> {
    inner: Option<Arc<R>>,
    job: JobId,
}

impl<R: Runner + ?Sized + 'static> Drop for CancelOnDrop<R> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let job = self.job.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = cancel_job(inner.as_ref(), &job).await {
                    tracing::warn!("cancelling dropped job {}: {e}", job.as_str());
                }
            });
        }
    }
}

async fn cancel_job<R: Runner + ?Sized>(inner: &R, id: &JobId) -> Result<()> {
    let program = format!("j={}\n{PRELUDE}{CANCEL}", id.as_str());
    let ctl = RunControl {
        cancel: CancellationToken::new(),
        timeout: Some(STOP_GRACE),
    };
    let out = inner.run(&program, &ctl).await?;
    if out.code != 0 {
        return Err(RemoteError::Transport(format!(
            "{}: cancel of job {} exited {}: {}",
            inner.describe(),
            id.as_str(),
            out.code,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The supervisor's "cancelled" line on stderr (a 143 of the program's own is its business).
fn was_cancelled(out: &Output) -> bool {
    out.stderr
        .split(|&b| b == b'\n')
        .any(|l| l.starts_with(b"sbxfs: job ") && l.windows(9).any(|w| w == b"cancelled"))
}

/// The whole supervising program: the job id, the shared functions, the program (and the
/// secrets, when they travel inline) as quoted here-documents, then the supervisor.
fn run_program(id: &JobId, program: &str, inline_env: Option<&str>) -> String {
    let mut s = format!("j={}\n{PRELUDE}", id.as_str());
    heredoc(&mut s, "\"$p.prog\"", program, id);
    if let Some(env) = inline_env {
        heredoc(&mut s, "\"$p.env\"", env, id);
    }
    s.push_str(RUN);
    s
}

/// `cat > FILE <<'END'` with a terminator that no line of `body` equals (the quoted
/// terminator turns off every expansion: the body arrives byte for byte).
fn heredoc(s: &mut String, file: &str, body: &str, id: &JobId) {
    let mut n = 0u32;
    let end = loop {
        let end = format!("SBXFS_END_{}_{n}", id.as_str().replace('-', "_"));
        if !body.lines().any(|l| l == end) {
            break end;
        }
        n += 1;
    };
    s.push_str(&format!("cat >{file} <<'{end}'\n{body}"));
    if !body.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&end);
    s.push('\n');
}

/// The secrets as `sh` text: `export NAME='value'` lines, single quotes escaped. `None` when
/// there are none.
pub fn secrets_file(secrets: &[(String, Vec<u8>)]) -> Result<Option<String>> {
    if secrets.is_empty() {
        return Ok(None);
    }
    let mut text = String::new();
    for (name, value) in secrets {
        let valid = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(RemoteError::Invalid(format!(
                "secret name {name:?}: not a shell variable name"
            )));
        }
        if value.contains(&0) {
            return Err(RemoteError::Invalid(format!(
                "secret {name}: a NUL byte cannot reach a shell variable"
            )));
        }
        // Values are text the shell reads back byte for byte; non-UTF-8 is refused rather
        // than silently changed.
        let value = std::str::from_utf8(value).map_err(|_| {
            RemoteError::Invalid(format!("secret {name}: not UTF-8 (give it in base64)"))
        })?;
        text.push_str(&format!(
            "{name}='{}'\nexport {name}\n",
            value.replace('\'', "'\\''")
        ));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heredoc_terminator_never_equals_a_line_of_the_body() {
        let id = JobId("1-2-3".into());
        let body = "echo a\nSBXFS_END_1_2_3_0\nSBXFS_END_1_2_3_1\n";
        let mut s = String::new();
        heredoc(&mut s, "f", body, &id);
        assert!(s.ends_with("SBXFS_END_1_2_3_2\n"), "{s}");
    }

    #[test]
    fn secrets_file_quotes_values_and_refuses_bad_names() {
        let text = secrets_file(&[("TOKEN".into(), b"a'b $(x)".to_vec())])
            .unwrap()
            .unwrap();
        assert_eq!(text, "TOKEN='a'\\''b $(x)'\nexport TOKEN\n");
        assert!(secrets_file(&[("A-B".into(), b"x".to_vec())]).is_err());
        assert!(secrets_file(&[("1A".into(), b"x".to_vec())]).is_err());
        assert!(secrets_file(&[("A".into(), b"x\0".to_vec())]).is_err());
        assert_eq!(secrets_file(&[]).unwrap(), None);
    }

    #[test]
    fn job_debug_shows_no_secret_value() {
        let job = Job {
            secrets: vec![("TOKEN".into(), b"hunter2".to_vec())],
            ..Job::default()
        };
        let shown = format!("{job:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
