//! One persistent session per mount for the exec-only scripts: where the agent cannot run
//! (no directory that allows exec, another architecture, a seccomp profile) or is not wanted
//! (`?agent=no`), the exec channel (`sh`, `docker exec -i C sh`, `ssh … sh`) is opened once and
//! a small server runs in it for the mount's life: python3 where the sandbox has it, else a
//! POSIX `sh` loop. Each program is sent as a frame, runs in its own `sh` in the sandbox (many
//! at once), and its exit status and output come back as a frame: no channel set-up per
//! operation (a `docker exec` or an ssh channel costs more than most operations).
//!
//! Frames: a request is `ID LEN\n` and LEN bytes of program (LEN 0: a ping, answered at once),
//! or, to the python3 server, `ID LEN P\n` and the python fast path's input, run in-process;
//! an answer is `ID CODE OUTLEN ERRLEN\n` then the two streams' bytes. Answers come in any
//! order. A session that ends (or sends a malformed frame, or stops answering pings once a run
//! timed out) fails what was in flight and is started again on the next run.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::{Output, RunControl, Runner, OUTPUT_CAP};
use crate::remote::{RemoteError, Result};

/// The python3 server: reads frames, runs each program in its own `sh` on a thread, answers
/// under a lock. A frame marked `P` holds the python fast path's input ([`super::pyfast`]):
/// the server runs that script itself (compiled once), one at a time (it changes directory
/// through descriptors), so a stat or a listing starts no process at all; one that cannot
/// start within 5 s (another stuck on a hung file system) answers 125, and the caller runs
/// it as a program instead. No single quote in it (it travels inside one).
const PYTHON: &str = r#"
import base64, os, sys, threading, subprocess, zlib
rd = sys.stdin.buffer
wr = sys.stdout.buffer
lock = threading.Lock()
inline = threading.Lock()
codes = {}
env = dict(os.environ)
env["LC_ALL"] = "C"
try:
    home = os.getcwd()
except OSError:
    home = "/"
def answer(i, code, out, err):
    with lock:
        wr.write(("%d %d %d %d\n" % (i, code, len(out), len(err))).encode())
        wr.write(out)
        wr.write(err)
        wr.flush()
def spawn():
    try:
        return subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=home)
    except OSError:
        return subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
def job(i, prog):
    try:
        p = spawn()
        out, err = p.communicate(prog)
        code = p.returncode
        if code < 0:
            code = 128 - code
    except Exception as e:
        out, err, code = b"", ("sbxfs session: %s\n" % e).encode(), 126
    answer(i, code, out, err)
class Out(object):
    def __init__(self):
        self.parts = []
    def write(self, data):
        self.parts.append(data)
def inline_job(i, data):
    if not inline.acquire(timeout=5):
        answer(i, 125, b"", b"sbxfs session: the inline fast path is busy\n")
        return
    try:
        d = data.split(b"\n")
        code = codes.get(d[0])
        if code is None:
            code = compile(zlib.decompress(base64.b64decode(d[0])), "fast.py", "exec")
            if len(codes) >= 4:
                codes.clear()
            codes[d[0]] = code
        o = Out()
        exec(code, {"__name__": "__main__", "ITEMS": d[1:], "OUT": o})
        res = (0, b"".join(o.parts), b"")
    except BaseException as e:
        res = (1, b"", ("sbxfs session: %r\n" % (e,)).encode())
    finally:
        try:
            os.chdir(home)
        except OSError:
            pass
        inline.release()
    answer(i, res[0], res[1], res[2])
while True:
    line = rd.readline(64)
    f = line.split()
    if not line.endswith(b"\n") or len(f) not in (2, 3) or not f[0].isdigit() or not f[1].isdigit():
        break
    if len(f) == 3 and f[2] != b"P":
        break
    i, n = int(f[0]), int(f[1])
    prog = rd.read(n)
    if len(prog) != n:
        break
    if n == 0:
        answer(i, 0, b"", b"")
        continue
    run = inline_job if len(f) == 3 else job
    threading.Thread(target=run, args=(i, prog), daemon=True).start()
"#;

/// The bootstrap the channel's `sh` reads: python3's server where it runs, else the `sh` loop
/// (each program to a file, run in the background, answered under a `mkdir` lock). The last
/// line starts it, so the shell has read all of this before anything else is sent (a shell
/// reads its program from a pipe in blocks: later bytes would be taken as program text).
const BOOTSTRAP: &str = r#"sbxfs_session_sh() {
  umask 077
  s=$(mktemp -d 2>/dev/null) || { s="${TMPDIR:-/tmp}/sbxfs-session-$$"; mkdir -m 700 "$s" || exit 125; }
  trap 'rm -rf "$s"' EXIT
  # Read exactly N bytes of the pipe: busybox's head reads ahead (stdio), so each way is tried.
  if [ "$(printf abc | { head -c 1 > /dev/null 2>&1; cat; })" = bc ]; then
    take() { head -c "$1"; }
  elif [ "$(printf abc | { dd bs=1 count=1 iflag=fullblock > /dev/null 2>&1; cat; })" = bc ]; then
    take() { dd bs="$1" count=1 iflag=fullblock 2> /dev/null; }
  else
    take() { dd bs=1 count="$1" 2> /dev/null; }
  fi
  answer() {
    until mkdir "$s/lock" 2>/dev/null; do sleep 0.01 2>/dev/null || sleep 1; done
    if [ -e "$s/$1.o" ]; then
      echo "$1 $2 $(($(wc -c < "$s/$1.o"))) $(($(wc -c < "$s/$1.e")))"
      cat "$s/$1.o" "$s/$1.e"
    else
      echo "$1 $2 0 0"
    fi
    rm -f "$s/$1.p" "$s/$1.o" "$s/$1.e"
    rmdir "$s/lock"
  }
  echo "__SBXFS_SESSION_SH__ $1"
  while IFS=' ' read -r i n; do
    case "$i:$n" in *[!0-9:]* | :* | *:) break ;; esac
    if [ "$n" -eq 0 ]; then answer "$i" 0; continue; fi
    take "$n" > "$s/$i.p"
    (
      LC_ALL=C sh "$s/$i.p" < /dev/null > "$s/$i.o" 2> "$s/$i.e"
      answer "$i" $?
    ) &
  done
  exit 0
}
sbxfs_session() {
  if [ -n "${SBXFS_SESSION_NO_PYTHON:-}" ]; then
    sbxfs_session_sh "SBXFS_SESSION_NO_PYTHON is set"
  elif ! command -v python3 > /dev/null 2>&1; then
    sbxfs_session_sh "python3 not found"
  fi
  # The real interpreter first on PATH: a shim (pyenv, asdf) costs every script that runs
  # python3 its own start, often longer than the work.
  d=$(python3 -c 'import os, subprocess, sys, threading; print(os.path.dirname(sys.executable))' 2> /dev/null) || sbxfs_session_sh "python3 cannot start or lacks subprocess/threading"
  if [ -n "$d" ] && [ -x "$d/python3" ]; then PATH="$d:$PATH"; export PATH; fi
  echo __SBXFS_SESSION_PY__
  exec python3 -u -c 'PYTHON_SERVER'
}
sbxfs_session
"#;

/// Longest the channel may take to start the server (a cold `docker exec`, an ssh login).
const START: Duration = Duration::from_secs(60);
/// Most bytes a channel may print before the server's first line (a banner, a profile).
const MAX_BANNER: u64 = 64 * 1024;
/// How long a session has to answer a ping once a run timed out, before it is given up.
const PING_WAIT: Duration = Duration::from_secs(10);
/// Longest answer header line (`ID CODE OUTLEN ERRLEN`).
const MAX_HEADER: u64 = 96;

/// What serves the programs in the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Python,
    Sh,
}

impl Server {
    pub fn describe(self) -> &'static str {
        match self {
            Server::Python => "one python3 session",
            Server::Sh => "one sh session",
        }
    }
}

type Waiter = oneshot::Sender<Result<Output>>;

/// A started session: its input, the runs waiting for answers, and its local process group
/// (killed when the session is dropped or given up).
struct Live {
    stdin: tokio::sync::Mutex<tokio::process::ChildStdin>,
    waiting: Mutex<HashMap<u64, Waiter>>,
    ended: AtomicBool,
    next: AtomicU64,
    server: Server,
    /// Why the `sh` loop serves rather than python3, as the bootstrap said.
    why_sh: Option<String>,
    group: Option<i32>,
    /// Holds the child so it is reaped (and killed) when the session goes.
    _child: Mutex<Option<tokio::process::Child>>,
}

impl Live {
    /// End the session: its group killed, every waiting run failed.
    fn end(&self, why: &str) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        kill_group(self.group);
        let waiting: Vec<Waiter> = self
            .waiting
            .lock()
            .expect("not poisoned")
            .drain()
            .map(|(_, w)| w)
            .collect();
        for w in waiting {
            let _ = w.send(Err(RemoteError::Transport(format!(
                "the sandbox's session ended: {why}"
            ))));
        }
    }

    fn register(&self) -> (u64, oneshot::Receiver<Result<Output>>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("not poisoned").insert(id, tx);
        (id, rx)
    }

    fn forget(&self, id: u64) {
        self.waiting.lock().expect("not poisoned").remove(&id);
    }

    async fn send(&self, id: u64, kind: Frame, program: &[u8]) -> Result<()> {
        let mut frame = match kind {
            Frame::Sh => format!("{id} {}\n", program.len()),
            Frame::PythonInline => format!("{id} {} P\n", program.len()),
        }
        .into_bytes();
        frame.extend_from_slice(program);
        let mut stdin = self.stdin.lock().await;
        let sent = async {
            stdin.write_all(&frame).await?;
            stdin.flush().await
        };
        if let Err(e) = sent.await {
            self.end(&format!("cannot send: {e}"));
            return Err(RemoteError::Transport(format!(
                "the sandbox's session ended: {e}"
            )));
        }
        Ok(())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        kill_group(self.group);
    }
}

fn kill_group(group: Option<i32>) {
    if let Some(pid) = group.filter(|&p| p > 1) {
        // SAFETY: killpg only sends a signal, to the group of our own child (reaped only when
        // `Live` is dropped, after this).
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
}

/// A [`Runner`] over one persistent session on the exec channel `argv`.
pub struct SessionRunner {
    argv: Vec<String>,
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
    /// What served the last session, and why not python3 (for messages).
    server: Mutex<Option<(Server, Option<String>)>>,
}

impl SessionRunner {
    /// Open the first session now: an error (the channel does not start, or prints no
    /// server's first line within a minute) says why, for the caller to run a command per
    /// program instead.
    pub async fn start(argv: Vec<String>) -> Result<SessionRunner> {
        if argv.is_empty() {
            return Err(RemoteError::Invalid("an empty exec command".into()));
        }
        let runner = SessionRunner {
            argv,
            live: tokio::sync::Mutex::new(None),
            server: Mutex::new(None),
        };
        runner.live().await?;
        Ok(runner)
    }

    /// What serves the programs: python3 or the `sh` loop.
    pub fn server(&self) -> Option<Server> {
        self.server
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|s| s.0)
    }

    /// What serves the programs, in words, with why not python3 where the `sh` loop does:
    /// "one sh session (python3 not found)".
    pub fn serving(&self) -> String {
        match &*self.server.lock().expect("not poisoned") {
            None => "one session".into(),
            Some((s, None)) => s.describe().into(),
            Some((s, Some(why))) => format!("{} ({why})", s.describe()),
        }
    }

    /// The running session, or a new one.
    async fn live(&self) -> Result<Arc<Live>> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref().filter(|l| !l.ended.load(Ordering::SeqCst)) {
            return Ok(live.clone());
        }
        let live = open(&self.argv).await?;
        // The first server is logged by the connect, once the workspace is known to be there.
        if self.server().is_some_and(|s| s != live.server) {
            tracing::info!(command = %self.argv.join(" "), "the exec-only scripts now run through {}", live.server.describe());
        }
        *self.server.lock().expect("not poisoned") = Some((live.server, live.why_sh.clone()));
        *slot = Some(live.clone());
        Ok(live)
    }
}

/// Start the channel, send the bootstrap, wait for the server's first line.
async fn open(argv: &[String]) -> Result<Arc<Live>> {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env("LC_ALL", "C")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = crate::remote::tied::spawn(cmd)
        .map_err(|e| RemoteError::Transport(format!("cannot run {:?}: {e}", argv[0])))?;
    let group = child.id().and_then(|p| i32::try_from(p).ok());
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
    tokio::spawn(crate::remote::stdio::log_stderr(
        child.stderr.take().expect("piped"),
    ));
    let bootstrap = BOOTSTRAP.replace("PYTHON_SERVER", PYTHON);
    let started = async {
        stdin.write_all(bootstrap.as_bytes()).await.ok()?;
        stdin.flush().await.ok()?;
        first_line(&mut stdout).await
    };
    let (server, why_sh) = match tokio::time::timeout(START, started).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            kill_group(group);
            return Err(RemoteError::Transport(format!(
                "{}: the channel ended (or printed too much) before its session started",
                argv.join(" ")
            )));
        }
        Err(_) => {
            kill_group(group);
            return Err(RemoteError::TimedOut(format!(
                "{}: no session within {START:?}",
                argv.join(" ")
            )));
        }
    };
    let live = Arc::new(Live {
        stdin: tokio::sync::Mutex::new(stdin),
        waiting: Mutex::new(HashMap::new()),
        ended: AtomicBool::new(false),
        next: AtomicU64::new(1),
        server,
        why_sh,
        group,
        _child: Mutex::new(Some(child)),
    });
    let weak = Arc::downgrade(&live);
    tokio::spawn(async move {
        let why = read_answers(stdout, &weak).await;
        if let Some(live) = weak.upgrade() {
            tracing::warn!(%why, "the sandbox's session ended");
            live.end(&why);
        }
    });
    Ok(live)
}

/// Read to the server's first line (after whatever the channel printed first, bounded).
async fn first_line<R: tokio::io::AsyncBufRead + Unpin>(
    out: &mut R,
) -> Option<(Server, Option<String>)> {
    let mut banner = out.take(MAX_BANNER);
    let mut line = Vec::new();
    loop {
        line.clear();
        if banner.read_until(b'\n', &mut line).await.ok()? == 0 {
            return None;
        }
        match line.strip_suffix(b"\n") {
            Some(b"__SBXFS_SESSION_PY__") => return Some((Server::Python, None)),
            Some(l) if l.starts_with(b"__SBXFS_SESSION_SH__") => {
                let why = String::from_utf8_lossy(&l[b"__SBXFS_SESSION_SH__".len()..]);
                let why = why.trim();
                return Some((Server::Sh, (!why.is_empty()).then(|| why.to_string())));
            }
            _ => {}
        }
    }
}

/// One answer's header, parsed strictly: `ID CODE OUTLEN ERRLEN`.
fn parse_header(line: &[u8]) -> Option<(u64, i32, u64, u64)> {
    let text = std::str::from_utf8(line.strip_suffix(b"\n")?).ok()?;
    let mut f = text.split(' ');
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut next = || f.next().filter(|s| digits(s));
    let id = next()?.parse().ok()?;
    let code = next()?.parse().ok()?;
    let out = next()?.parse().ok()?;
    let err = next()?.parse().ok()?;
    f.next().is_none().then_some((id, code, out, err))
}

/// Read `len` bytes of `r`, keeping at most [`OUTPUT_CAP`]; None if it ended first.
async fn take_stream<R: AsyncRead + Unpin>(r: &mut R, len: u64) -> Option<(Vec<u8>, u64)> {
    let keep = len.min(OUTPUT_CAP as u64);
    let mut kept = vec![0u8; keep as usize];
    r.read_exact(&mut kept).await.ok()?;
    let cut = len - keep;
    let dropped = tokio::io::copy(&mut (&mut *r).take(cut), &mut tokio::io::sink())
        .await
        .ok()?;
    (dropped == cut).then_some((kept, cut))
}

/// Hand each answer to its run until the stream ends or breaks the framing; why it stopped.
async fn read_answers<R: AsyncRead + Unpin>(
    mut out: tokio::io::BufReader<R>,
    live: &std::sync::Weak<Live>,
) -> String {
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut out)
            .take(MAX_HEADER)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) => return "its output ended".into(),
            Err(e) => return format!("reading its output: {e}"),
            Ok(_) => {}
        }
        let Some((id, code, out_len, err_len)) = parse_header(&line) else {
            return format!(
                "it answered out of frame: {:?}",
                String::from_utf8_lossy(&line[..line.len().min(80)])
            );
        };
        let Some((stdout, stdout_cut)) = take_stream(&mut out, out_len).await else {
            return "its output ended within an answer".into();
        };
        let Some((stderr, stderr_cut)) = take_stream(&mut out, err_len).await else {
            return "its output ended within an answer".into();
        };
        let Some(live) = live.upgrade() else {
            return "no longer used".into();
        };
        let waiter = live.waiting.lock().expect("not poisoned").remove(&id);
        if let Some(w) = waiter {
            let _ = w.send(Ok(Output {
                code,
                stdout,
                stderr,
                stdout_cut,
                stderr_cut,
            }));
        }
    }
}

/// What a request frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// A whole `sh` program, run in its own `sh`.
    Sh,
    /// The python fast path's input, run by the python3 server itself (`ID LEN P`).
    PythonInline,
}

/// Takes a run's waiter out of the table however the run ends.
struct Forget<'a>(&'a Live, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

impl SessionRunner {
    /// Send one request frame and wait for its answer, within the caller's limits.
    async fn exchange(&self, kind: Frame, program: &[u8], ctl: &RunControl) -> Result<Output> {
        let live = self.live().await?;
        self.exchange_on(live, kind, program, ctl).await
    }

    async fn exchange_on(
        &self,
        live: Arc<Live>,
        kind: Frame,
        program: &[u8],
        ctl: &RunControl,
    ) -> Result<Output> {
        let (id, answer) = live.register();
        let _forget = Forget(&live, id);
        // A frame is written whole or the session ends: from a task of its own, so a caller
        // that gives up (a deadline, a cancel) never leaves half a frame on the channel for
        // the server to take the next frames' bytes as the rest of it.
        let sending = {
            let (live, frame) = (live.clone(), program.to_vec());
            tokio::spawn(async move { live.send(id, kind, &frame).await })
        };
        let answered = async {
            match sending.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(RemoteError::Transport(format!("sending: {e}"))),
            }
            answer.await.unwrap_or_else(|_| {
                Err(RemoteError::Transport("the sandbox's session ended".into()))
            })
        };
        let limit = ctl.timeout.unwrap_or(Duration::MAX);
        tokio::select! {
            r = tokio::time::timeout(limit, answered) => match r {
                Ok(r) => r,
                Err(_) => {
                    // A slow program, or a hung session: a ping tells which.
                    tokio::spawn(check_alive(live.clone()));
                    Err(RemoteError::TimedOut(format!("{} (after {limit:?})", self.describe())))
                }
            },
            _ = ctl.cancel.cancelled() => Err(RemoteError::Transport(format!("{}: cancelled", self.describe()))),
        }
    }
}

#[async_trait]
impl Runner for SessionRunner {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        self.exchange(Frame::Sh, program.as_bytes(), ctl).await
    }

    /// The python3 server runs it itself; the `sh` loop cannot (`None`).
    async fn run_python_inline(&self, input: &[u8], ctl: &RunControl) -> Option<Result<Output>> {
        let live = match self.live().await {
            Ok(live) => live,
            Err(e) => return Some(Err(e)),
        };
        if live.server != Server::Python {
            return None;
        }
        Some(
            self.exchange_on(live, Frame::PythonInline, input, ctl)
                .await,
        )
    }

    fn describe(&self) -> String {
        match self.server() {
            Some(s) => format!("{} over {}", s.describe(), self.argv.join(" ")),
            None => self.argv.join(" "),
        }
    }
}

/// Give the session up unless it answers a ping within [`PING_WAIT`].
async fn check_alive(live: Arc<Live>) {
    let (id, pong) = live.register();
    let _forget = Forget(&live, id);
    // A send that cannot get through (the sandbox reads nothing) counts as no answer.
    let answered = async {
        live.send(id, Frame::Sh, b"").await.ok()?;
        pong.await.ok()
    };
    if tokio::time::timeout(PING_WAIT, answered).await.is_err() {
        tracing::warn!("the sandbox's session does not answer: starting a new one");
        live.end(&format!("no answer to a ping within {PING_WAIT:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(no_python: bool) -> Vec<String> {
        let mut argv = vec!["env".to_string()];
        if no_python {
            argv.push("SBXFS_SESSION_NO_PYTHON=1".into());
        }
        argv.push("sh".into());
        argv
    }

    #[test]
    fn the_python_server_fits_in_single_quotes() {
        assert!(!PYTHON.contains('\''));
    }

    #[test]
    fn headers_are_parsed_strictly() {
        assert_eq!(parse_header(b"7 0 3 0\n"), Some((7, 0, 3, 0)));
        for bad in [
            &b"7 0 3\n"[..],
            b"7 0 3 0 1\n",
            b"7 -1 3 0\n",
            b"7  0 3 0\n",
            b"7 0 3 0",
            b"x 0 3 0\n",
            b"7 0 99999999999999999999999 0\n",
        ] {
            assert_eq!(parse_header(bad), None, "{bad:?}");
        }
    }

    async fn runs_many_at_once(no_python: bool, server: Server) {
        let r = Arc::new(SessionRunner::start(sh(no_python)).await.unwrap());
        assert_eq!(r.server(), Some(server));
        let ctl = RunControl::default();
        // A slow program does not hold up a quick one.
        let slow = {
            let r = r.clone();
            let ctl = ctl.clone();
            tokio::spawn(async move { r.run("sleep 1; echo slow", &ctl).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = std::time::Instant::now();
        let quick = r
            .run("printf 'a\\0b'; echo err >&2; exit 3", &ctl)
            .await
            .unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        assert_eq!((quick.code, &quick.stdout[..]), (3, &b"a\0b"[..]));
        assert_eq!(quick.stderr, b"err\n");
        assert_eq!(slow.await.unwrap().unwrap().stdout, b"slow\n");
        // Large programs and outputs cross whole.
        let big = format!("cat <<'EOF'\n{}\nEOF\n", "x".repeat(300_000));
        let out = r.run(&big, &ctl).await.unwrap();
        assert_eq!(out.stdout.len(), 300_001);
        let many: Vec<_> = (0..20)
            .map(|n| {
                let r = r.clone();
                let ctl = ctl.clone();
                tokio::spawn(async move { r.run(&format!("echo {n}"), &ctl).await })
            })
            .collect();
        for (n, h) in many.into_iter().enumerate() {
            assert_eq!(
                h.await.unwrap().unwrap().stdout,
                format!("{n}\n").into_bytes()
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_python_session_runs_many_programs_at_once() {
        runs_many_at_once(false, Server::Python).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_sh_session_runs_many_programs_at_once() {
        runs_many_at_once(true, Server::Sh).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_that_ends_fails_its_runs_and_the_next_run_starts_another() {
        for no_python in [false, true] {
            let r = SessionRunner::start(sh(no_python)).await.unwrap();
            let ctl = RunControl::default();
            // The session's whole process group killed from inside: its output ends.
            let gone = r.run("kill -9 0; sleep 5", &ctl).await;
            assert!(gone.is_err(), "{gone:?}");
            let again = r.run("echo back", &ctl).await.unwrap();
            assert_eq!(again.stdout, b"back\n");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_gives_up_mid_send_leaves_a_whole_frame() {
        // A sandbox that reads nothing for a while, then records what it was sent.
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            format!(
                "echo __SBXFS_SESSION_PY__; sleep 2; cat > '{}'",
                seen.display()
            ),
        ];
        let r = SessionRunner::start(argv).await.unwrap();
        let program = "#".repeat(1 << 20);
        // The caller's own deadline drops the run while the frame is half written.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(300),
            r.run(&program, &RunControl::default()),
        )
        .await;
        assert!(gave_up.is_err());
        let header = format!("1 {}\n", program.len());
        let end = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = std::fs::read(&seen).unwrap_or_default();
            if let Some(at) = got
                .windows(header.len())
                .position(|w| w == header.as_bytes())
            {
                let body = &got[at + header.len()..];
                if body.len() >= program.len() {
                    assert!(body[..program.len()].iter().all(|b| *b == b'#'));
                    break;
                }
            }
            assert!(
                std::time::Instant::now() < end,
                "the frame never arrived whole: {} bytes",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_that_never_starts_a_session_is_an_error() {
        let e = SessionRunner::start(vec!["true".into()])
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("before its session started"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hostile_answer_ends_the_session_not_the_daemon() {
        // A channel that prints the first line then garbage where a frame should be.
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            "echo __SBXFS_SESSION_PY__; echo '1 0 99999999999 0'; echo junk; sleep 5".into(),
        ];
        let r = SessionRunner::start(argv).await.unwrap();
        let ctl = RunControl {
            timeout: Some(Duration::from_secs(3)),
            ..Default::default()
        };
        assert!(r.run("echo hi", &ctl).await.is_err());
    }
}
