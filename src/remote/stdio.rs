//! The agent over an exec channel's standard input and output: what `shell:`, `exec:` and an
//! `ssh://` whose server forbids forwarding use, so any sandbox that runs a shell gets the
//! agent's speed (one persistent process, requests in flight at once, the change feed).
//!
//! 1. **Deploy through the channel** ([`deploy`]): one `sh` probe finds a directory where a
//!    file can be written *and run* (`$HOME/.cache/sbxfs`, `/tmp`, `/dev/shm`, beside the
//!    workspace) and whether this very binary is there (size and `--version`); if not, the
//!    binary travels on the same channel's standard input (`cat >` a temporary name, checked,
//!    `mv`). A sandbox of another architecture, or none where a program may run, answers
//!    [`NoAgent`], and the caller uses the scripts.
//! 2. **A session per connection** ([`Bridge`]): a private Unix socket (0700 directory) on the
//!    laptop; each connection the client makes runs the channel's command once, with
//!    `exec sbxfs agent --stdio` as its program, and copies bytes both ways. The client speaks
//!    HTTP/2 from the first byte, so one connection carries every request; when the channel
//!    drops, the next request makes a new session (nothing is lost: the write path's commits
//!    are versioned and retried as over any other connection).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::exec::{collect_capped, CommandRunner, Output, RunControl, Runner, OUTPUT_CAP};
use super::ssh::quote;
use super::{RemoteError, Result};

/// Longest the probe may take: a channel that does not run it by then is not answering.
const PROBE_DEADLINE: Duration = Duration::from_secs(60);

/// Longest one deploy step may take (the upload is the long one: tens of MB).
const STEP_DEADLINE: Duration = Duration::from_secs(600);

/// Longest an upload may go without the sandbox taking a byte of it (starting to read it,
/// or reading on): a channel that stopped reading is not waited for until the step deadline.
const UPLOAD_IDLE: Duration = Duration::from_secs(20);

/// Bytes of the upload written at a time (a pipe's buffer).
const UPLOAD_CHUNK: usize = 64 * 1024;

/// Longest an exec channel may take to start a shell and read the launch program.
const SESSION_START: Duration = Duration::from_secs(60);

/// Why no agent runs in the sandbox; the scripts serve instead.
#[derive(Debug)]
pub struct NoAgent(pub String);

/// The binary to deploy: its path here, its `--version` line and size (which name the
/// directory it is kept in, so a rebuilt binary is uploaded again and an old one reused).
pub struct Binary {
    path: PathBuf,
    version: String,
    size: u64,
    /// A name for this build: version, size and modification time.
    key: String,
}

impl Binary {
    pub fn of(path: PathBuf) -> Result<Binary> {
        let out = std::process::Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", path.display())))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || version.is_empty() {
            return Err(RemoteError::Transport(format!(
                "{}: --version failed",
                path.display()
            )));
        }
        let meta = std::fs::metadata(&path)
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", path.display())))?;
        use std::os::unix::fs::MetadataExt;
        let key = format!(
            "{}-p{}-{:x}-{:x}",
            env!("CARGO_PKG_VERSION"),
            super::wire::PROTOCOL_VERSION,
            meta.size(),
            meta.mtime_nsec() as u64 ^ ((meta.mtime() as u64) << 20)
        );
        Ok(Binary {
            path,
            version,
            size: meta.size(),
            key,
        })
    }

    /// The name of the directory this build is kept in, in the sandbox.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Its `--version` line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// This program, or the one `--deploy-binary` names.
    pub fn chosen(path: Option<&Path>) -> Result<Binary> {
        match path {
            Some(p) => Binary::of(p.to_path_buf()),
            None => Binary::of(
                std::env::current_exe()
                    .map_err(|e| RemoteError::Transport(format!("this program's path: {e}")))?,
            ),
        }
    }
}

/// Find a usable directory and what it holds. Args: key, expected `--version` line, size,
/// workspace path. Prints `arch MACHINE`, then `__RESULT__` and one of `missing` (no
/// workspace), `notdir` (it is not a directory), `ready DIR`, `upload DIR` or `none`.
const PROBE: &str = r#"
set -u
echo "arch $(uname -m 2>/dev/null)"
[ -e "$4" ] || { echo "__RESULT__ missing"; exit 0; }
[ -d "$4" ] || { echo "__RESULT__ notdir"; exit 0; }
u="$(id -u 2>/dev/null || echo 0)"
# A directory of ours: made here if missing, a real directory (not a symlink) owned by this
# user, then private. One made or planted by anyone else is never used (root could chmod it).
# Where nothing can run, what this probe made goes again (rmdir: only if empty).
unmake() { rmdir "$d" "$base/exec" "$base" ${up:+"$up"} 2>/dev/null; }
mine() { mkdir "$1" 2>/dev/null; [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod 700 "$1" 2>/dev/null; }
for base in "${HOME:-/nonexistent}/.cache/sbxfs" "/tmp/sbxfs-$u" "/dev/shm/sbxfs-$u" "$(dirname "$4")/.sbxfs-$u"; do
  d="$base/exec/$1"
  up="$(dirname "$base")"
  [ -d "$up" ] && up=""
  mkdir -p "$(dirname "$base")" 2>/dev/null
  mine "$base" && mine "$base/exec" && mine "$d" || { unmake; continue; }
  # Other builds' copies go unless a process runs from one (each is a whole binary: a
  # rebuild a day would fill the disk); without /proc, those no session started for two days.
  exes=
  if [ -d /proc/self ]; then
    for e in /proc/[0-9]*/exe; do exes="$exes
$(readlink "$e" 2>/dev/null)"; done
  fi
  for o in "$base/exec"/*; do
    [ "$o" = "$d" ] || [ ! -d "$o" ] && continue
    if [ -d /proc/self ]; then
      case "$exes" in *"$o/sbxfs"*) ;; *) rm -rf "$o" ;; esac
    else
      [ -n "$(find "$o" -prune -mtime +1 2>/dev/null)" ] && rm -rf "$o"
    fi
  done
  if [ -e "$d/.does-not-run" ]; then echo "__RESULT__ norun $(cat "$d/.does-not-run")"; exit 0; fi
  if [ -x "$d/sbxfs" ] && [ ! -L "$d/sbxfs" ] && [ -O "$d/sbxfs" ] \
     && [ "$(wc -c < "$d/sbxfs" 2>/dev/null | tr -d ' ')" = "$3" ] \
     && [ "$("$d/sbxfs" --version 2>/dev/null)" = "$2" ]; then
    echo "__RESULT__ ready $d"; exit 0
  fi
  probe="$d/.probe.$$"
  if printf '#!/bin/sh\nexit 0\n' > "$probe" 2>/dev/null && chmod 700 "$probe" && "$probe"; then
    rm -f "$probe"; echo "__RESULT__ upload $d"; exit 0
  fi
  rm -f "$probe"
  unmake
done
echo "__RESULT__ none"
"#;

/// Receive the binary on the rest of standard input into DIR ($1), check its size ($3) and
/// that it runs and says `$2`, then move it into place (a half upload never becomes `sbxfs`).
/// The binary is sent only once [`GO_ON`] is printed: a shell reads its program from a pipe
/// in blocks, so bytes sent with the program would be swallowed as program text.
const UPLOAD: &str = r#"{
set -u
umask 077
t="$1/.sbxfs.$$"
echo __SBXFS_GO_ON__
cat > "$t" && chmod 700 "$t" || { rm -f "$t"; echo "__RESULT__ failed cannot write $1"; exit 0; }
n="$(wc -c < "$t" | tr -d ' ')"
if [ "$n" != "$3" ]; then rm -f "$t"; echo "__RESULT__ failed the upload arrived cut ($n of $3 bytes)"; exit 0; fi
v="$("$t" --version 2>&1)"
if [ "$v" != "$2" ]; then
  rm -f "$t"; printf '%s\n' "$v" | head -n 1 | cut -c1-200 > "$1/.does-not-run"
  echo "__RESULT__ failed does not run here: $v"; exit 0
fi
mv -f "$t" "$1/sbxfs" && echo "__RESULT__ ok"
}
"#;

/// The line a program prints once the shell has read all of it: what follows on standard
/// input is for the program's own commands.
const GO_ON: &str = "__SBXFS_GO_ON__";

/// Most bytes a channel may print before [`GO_ON`] (a login banner, a profile's chatter).
const MAX_BANNER: usize = 64 * 1024;

/// Read `out` up to and including the [`GO_ON`] line; false if it ended, or printed too much,
/// before it.
async fn await_go_on<R: tokio::io::AsyncBufRead + Unpin>(out: &mut R) -> bool {
    use tokio::io::AsyncReadExt;
    // Bounded before any line is read whole: a channel that prints no newline holds no more.
    let mut banner = out.take(MAX_BANNER as u64 + GO_ON.len() as u64 + 1);
    let mut line = Vec::new();
    loop {
        line.clear();
        match banner.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        if line.strip_suffix(b"\n") == Some(GO_ON.as_bytes()) {
            return true;
        }
    }
}

/// A program with its arguments: `set -- 'a' 'b'` then the body (values never spliced into
/// the body's text).
fn with_args(body: &str, args: &[&[u8]]) -> Vec<u8> {
    let mut p = b"set --".to_vec();
    for a in args {
        p.push(b' ');
        p.extend(quote(a));
    }
    p.push(b'\n');
    p.extend_from_slice(body.as_bytes());
    p
}

/// The `__RESULT__` line of a step's output, and the lines before it.
fn result(out: &Output, step: &str) -> Result<(String, Vec<String>)> {
    let text = String::from_utf8_lossy(&out.stdout);
    let before: Vec<String> = text
        .lines()
        .take_while(|l| !l.starts_with("__RESULT__ "))
        .map(str::to_string)
        .collect();
    match text.lines().find_map(|l| l.strip_prefix("__RESULT__ ")) {
        Some(r) => Ok((r.to_string(), before)),
        None => {
            let err = String::from_utf8_lossy(&out.stderr);
            let err = err.trim();
            Err(RemoteError::Transport(
                match (err.is_empty(), text.trim().is_empty()) {
                    (true, true) => format!(
                        "the exec command exited at once (status {}) with no output: is it a \
                     command that runs a shell reading its standard input (e.g. \
                     'docker exec -i CONTAINER sh')?",
                        out.code
                    ),
                    (true, false) => format!(
                        "the agent's {step} step answered no result (status {}): it printed {:?}",
                        out.code,
                        quoted(&text)
                    ),
                    (false, _) => format!(
                        "the agent's {step} step answered no result (status {}): {}",
                        out.code,
                        quoted(err)
                    ),
                },
            ))
        }
    }
}

/// Whether the ELF file at `path` names a program interpreter (is dynamically linked): it
/// then runs only where the same C library is. `None`: not an ELF file this can read.
pub fn is_dynamically_linked(path: &Path) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 64];
    f.read_exact(&mut head).ok()?;
    // 64-bit little-endian ELF only (what this program is built as).
    if &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().ok()?);
    let phentsize = u64::from(u16::from_le_bytes(head[0x36..0x38].try_into().ok()?));
    let phnum = u16::from_le_bytes(head[0x38..0x3a].try_into().ok()?);
    const PT_INTERP: u32 = 3;
    for i in 0..u64::from(phnum) {
        f.seek(SeekFrom::Start(phoff + i * phentsize)).ok()?;
        let mut kind = [0u8; 4];
        f.read_exact(&mut kind).ok()?;
        if u32::from_le_bytes(kind) == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// How to make a build that runs in any Linux sandbox of this architecture, for one who has
/// the binary and not the sources' scripts.
pub const STATIC_BUILD: &str = "a static build runs anywhere: \
     cargo build --release with RUSTFLAGS='-C target-feature=+crt-static' and an explicit \
     --target (the sources' scripts/build-static.sh does this), passed as -o deploy_binary=PATH";

/// What to do about a build that does not run in the sandbox, when it is a dynamic one.
pub fn static_hint(path: &Path) -> String {
    if is_dynamically_linked(path) == Some(true) {
        format!("; this sbxfs is dynamically linked: {STATIC_BUILD}")
    } else {
        String::new()
    }
}

/// Say, before an upload, that a dynamic build may not run there.
pub fn warn_if_dynamic(path: &Path) {
    if is_dynamically_linked(path) == Some(true) {
        tracing::warn!(
            path = %path.display(),
            "deploying a dynamically linked sbxfs: it runs only where the C library matches \
             this machine's; {STATIC_BUILD}"
        );
    }
}

/// The machine name `uname -m` gives for this build's architecture.
fn local_machine() -> &'static str {
    match std::env::consts::ARCH {
        "x86" => "i686",
        "arm" => "armv7l",
        other => other,
    }
}

/// Run `argv` with `program` then the file at `payload` on its standard input.
async fn run_with_payload(argv: &[String], program: Vec<u8>, payload: &Path) -> Result<Output> {
    let mut file = tokio::fs::File::open(payload)
        .await
        .map_err(|e| RemoteError::Transport(format!("{}: {e}", payload.display())))?;
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env("LC_ALL", "C")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = super::tied::spawn(cmd)
        .map_err(|e| RemoteError::Transport(format!("cannot run {:?}: {e}", argv[0])))?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
    let stderr = child.stderr.take().expect("piped");
    let total = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let stalled = |sent: u64| {
        RemoteError::TimedOut(format!(
            "the sandbox stopped reading the agent's upload through the exec channel ({}): {sent} of {total} bytes \
             taken, then nothing for {} s",
            argv[0],
            UPLOAD_IDLE.as_secs()
        ))
    };
    let work = async {
        let errs = tokio::spawn(collect_capped(stderr, OUTPUT_CAP));
        let _ = stdin.write_all(&program).await;
        let Ok(go_on) = tokio::time::timeout(UPLOAD_IDLE, await_go_on(&mut stdout)).await else {
            return Err(stalled(0));
        };
        if go_on {
            let mut sent = 0u64;
            let mut chunk = vec![0u8; UPLOAD_CHUNK];
            loop {
                let n = match file.read(&mut chunk).await {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        return Err(RemoteError::Transport(format!(
                            "{}: {e}",
                            payload.display()
                        )))
                    }
                };
                match tokio::time::timeout(UPLOAD_IDLE, stdin.write_all(&chunk[..n])).await {
                    Err(_) => return Err(stalled(sent)),
                    // The channel closed: its output says why.
                    Ok(Err(_)) => break,
                    Ok(Ok(())) => sent += n as u64,
                }
            }
        }
        drop(stdin);
        let (out, out_cut) = collect_capped(stdout, OUTPUT_CAP).await;
        let (err, err_cut) = errs.await.unwrap_or_default();
        let status = child
            .wait()
            .await
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", argv[0])))?;
        Ok(Output {
            code: status.code().unwrap_or(128),
            stdout: out,
            stderr: err,
            stdout_cut: out_cut,
            stderr_cut: err_cut,
        })
    };
    tokio::time::timeout(STEP_DEADLINE, work)
        .await
        .map_err(|_| RemoteError::TimedOut(format!("uploading sbxfs through {}", argv[0])))?
}

/// Where the deployed binary is in the sandbox, or why there is none. A workspace that is
/// not a directory is an error.
pub async fn deploy(
    argv: &[String],
    bin: &Binary,
    root: &[u8],
) -> Result<std::result::Result<Vec<u8>, NoAgent>> {
    let runner = CommandRunner::new(argv.to_vec())?;
    let size = bin.size.to_string();
    let probe = with_args(
        PROBE,
        &[
            bin.key.as_bytes(),
            bin.version.as_bytes(),
            size.as_bytes(),
            root,
        ],
    );
    let ctl = RunControl {
        timeout: Some(PROBE_DEADLINE),
        ..Default::default()
    };
    tracing::info!(command = %argv.join(" "), "looking for the agent in the sandbox through the exec channel");
    let out = runner.run(&String::from_utf8_lossy(&probe), &ctl).await?;
    match ProbeAnswer::read(&out)? {
        ProbeAnswer::Missing => Err(RemoteError::NotFound(format!(
            "{}: no such directory in the sandbox",
            String::from_utf8_lossy(root)
        ))),
        ProbeAnswer::NotDir => Err(RemoteError::NotDir(format!(
            "{}: not a directory in the sandbox",
            String::from_utf8_lossy(root)
        ))),
        ProbeAnswer::Ready(dir) => Ok(Ok(format!("{dir}/sbxfs").into_bytes())),
        // An upload of this very build failed to run there before: not sent again.
        ProbeAnswer::NoRun(why) => Ok(Err(NoAgent(format!(
            "this build did not run in the sandbox ({why}){}",
            static_hint(&bin.path)
        )))),
        ProbeAnswer::Upload { arch, .. } if !arch.is_empty() && arch != local_machine() => {
            Ok(Err(NoAgent(format!(
                "the sandbox is {arch} and this sbxfs is built for {}",
                local_machine()
            ))))
        }
        ProbeAnswer::Upload { dir, .. } => {
            // A plain local `sh` (`shell:`) runs this machine's C library: no warning.
            let local_sh = argv.len() == 1
                && Path::new(&argv[0]).file_name() == Some(std::ffi::OsStr::new("sh"));
            if !local_sh {
                warn_if_dynamic(&bin.path);
            }
            tracing::info!(
                bytes = bin.size,
                dir,
                "uploading the agent into the sandbox through the exec channel"
            );
            let program = with_args(
                UPLOAD,
                &[dir.as_bytes(), bin.version.as_bytes(), size.as_bytes()],
            );
            let out = run_with_payload(argv, program, &bin.path).await?;
            let (said, _) = result(&out, "upload")?;
            if said != "ok" {
                let why = quoted(said.strip_prefix("failed ").unwrap_or(&said));
                return Ok(Err(NoAgent(format!(
                    "the uploaded agent {why}{}",
                    static_hint(&bin.path)
                ))));
            }
            Ok(Ok(format!("{dir}/sbxfs").into_bytes()))
        }
        ProbeAnswer::Nowhere => Ok(Err(NoAgent(
            "no directory in the sandbox where a program can be written and run".into(),
        ))),
    }
}

/// Longest text of the sandbox's a message quotes (an answer is the sandbox's to make: a
/// hostile one could fill the log).
const MAX_QUOTED: usize = 200;

/// `text` cut to [`MAX_QUOTED`] characters.
fn quoted(text: &str) -> String {
    let mut q: String = text.chars().take(MAX_QUOTED).collect();
    if q.len() < text.len() {
        q.push('…');
    }
    q
}

/// What the deploy probe found in the sandbox.
#[derive(Debug, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The workspace does not exist.
    Missing,
    /// The workspace is not a directory.
    NotDir,
    /// This build is in `dir`, checked by size and hash.
    Ready(String),
    /// This build was uploaded before and did not run, for this reason.
    NoRun(String),
    /// `dir` can hold and run the binary; the sandbox's machine is `arch` (empty: unknown).
    Upload { dir: String, arch: String },
    /// No directory can hold and run a program.
    Nowhere,
}

impl ProbeAnswer {
    /// The answer in the probe's output; a directory must be an absolute path of printable
    /// characters (it becomes part of a command), and text quoted from it stays short.
    pub fn read(out: &Output) -> Result<ProbeAnswer> {
        let (said, before) = result(out, "probe")?;
        let arch = before
            .iter()
            .find_map(|l| l.strip_prefix("arch "))
            .map(|a| quoted(a.trim()))
            .unwrap_or_default();
        let dir = |d: &str| {
            if d.starts_with('/') && !d.chars().any(char::is_control) && d.len() <= 4096 {
                Ok(d.to_string())
            } else {
                Err(RemoteError::Transport(format!(
                    "the agent's probe named an impossible directory: {:?}",
                    quoted(d)
                )))
            }
        };
        Ok(match said.split_once(' ').unwrap_or((said.as_str(), "")) {
            ("missing", _) => ProbeAnswer::Missing,
            ("notdir", _) => ProbeAnswer::NotDir,
            ("ready", d) => ProbeAnswer::Ready(dir(d)?),
            ("norun", why) => ProbeAnswer::NoRun(quoted(why)),
            ("upload", d) => ProbeAnswer::Upload { dir: dir(d)?, arch },
            _ => ProbeAnswer::Nowhere,
        })
    }
}

/// The local end of the sessions: a Unix socket in a private directory; every connection
/// to it is one run of the exec channel with the agent on its standard input and output.
/// Dropped: no new sessions, and those running end (their commands are killed).
pub struct Bridge {
    socket: PathBuf,
    _dir: tempfile::TempDir,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Bridge {
    /// Listen for the client's connections; each runs `argv` with `exec BIN agent --stdio
    /// --root ROOT` as its program.
    pub fn start(
        argv: Vec<String>,
        agent: Vec<u8>,
        root: Vec<u8>,
        allow_setid: bool,
    ) -> Result<Bridge> {
        use std::os::unix::fs::PermissionsExt;
        sweep_stale_bridges(&std::env::temp_dir());
        // 0700 whatever the umask: the socket is the agent, with no token on it.
        let dir = tempfile::Builder::new()
            .prefix("sbxfs-exec-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|e| RemoteError::Transport(format!("a private directory: {e}")))?;
        let socket = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", socket.display())))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", socket.display())))?;
        let me = rustix::process::geteuid().as_raw();
        let setid = if allow_setid { " --allow-setid" } else { "" };
        let launch = with_args(
            &format!(
                "touch \"${{1%/sbxfs}}\" 2>/dev/null; echo {GO_ON}; \
                 exec \"$1\" agent --stdio{setid} --root \"$2\"\n"
            ),
            &[&agent, &root],
        );
        let argv = Arc::new(argv);
        let launch = Arc::new(launch);
        let accept = tokio::spawn(async move {
            let mut sessions = tokio::task::JoinSet::new();
            loop {
                let conn = match listener.accept().await {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "the agent's local socket failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Only this process's user (the directory already keeps others out).
                match conn.peer_cred() {
                    Ok(c) if c.uid() == me => {}
                    other => {
                        tracing::warn!(peer = ?other, "refused a connection to the agent's socket from another user");
                        continue;
                    }
                }
                while sessions.try_join_next().is_some() {}
                sessions.spawn(session(conn, argv.clone(), launch.clone()));
            }
        });
        Ok(Bridge {
            socket,
            _dir: dir,
            accept,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Most of a session's standard error kept for the log; the rest is read and dropped.
const STDERR_LOGGED: usize = 64 * 1024;

/// Log what the channel prints on standard error (the agent's own log, the channel's
/// complaints), in chunks, up to [`STDERR_LOGGED`] bytes; drain the rest.
pub(crate) async fn log_stderr(mut stderr: impl tokio::io::AsyncRead + Unpin) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 8192];
    let mut logged = 0usize;
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) if logged < STDERR_LOGGED => {
                logged += n;
                let text = String::from_utf8_lossy(&buf[..n]);
                tracing::debug!(target: "sbxfs::agent_in_sandbox", "{}", text.trim_end());
            }
            Ok(_) => {}
        }
    }
}

/// Remove what killed mounts left in `parent`: this user's `sbxfs-exec-*` directories (never
/// a symlink) older than a minute whose socket no process has bound.
fn sweep_stale_bridges(parent: &Path) {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let Ok(bound) = std::fs::read_to_string("/proc/net/unix") else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("sbxfs-exec-") {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if !meta.is_dir() || meta.uid() != me || !old {
            continue;
        }
        // Bound sockets are listed by the kernel: a live bridge's is there (connecting to it
        // would start a session in that mount).
        let socket = e.path().join("agent.sock");
        if !bound.contains(socket.to_string_lossy().as_ref()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// One connection: the channel's command run once, the agent's bytes copied both ways until
/// either side ends; the command is killed with its local process group when it does.
async fn session(mut conn: tokio::net::UnixStream, argv: Arc<Vec<String>>, launch: Arc<Vec<u8>>) {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match super::tied::spawn(cmd) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, command = %argv[0], "cannot run the exec channel");
            return;
        }
    };
    // However the session ends, its whole local group goes (a local `sh`'s children too).
    let _group = GroupKill(child.id());
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
    let stderr = child.stderr.take().expect("piped");
    tokio::spawn(log_stderr(stderr));
    if stdin.write_all(&launch).await.is_err() {
        return;
    }
    // Nothing of the client's is sent before the shell has read the whole launch program.
    match tokio::time::timeout(SESSION_START, await_go_on(&mut stdout)).await {
        Ok(true) => {}
        _ => {
            tracing::warn!(command = %argv.join(" "), "the exec channel did not start the agent");
            return;
        }
    }
    // Either side ending ends the session: a client that gave up on a hung agent must not
    // wait for that agent's output to end.
    let (mut from_client, mut to_client) = conn.split();
    tokio::select! {
        r = tokio::io::copy(&mut from_client, &mut stdin) => {
            tracing::debug!(?r, "the client ended an agent session");
        }
        r = tokio::io::copy(&mut stdout, &mut to_client) => match r {
            Ok(bytes) => tracing::info!(bytes, "the agent's session in the sandbox ended (its output closed); the next request starts another"),
            Err(e) => tracing::info!("the agent's session in the sandbox ended: {e}; the next request starts another"),
        }
    }
}

/// A session's local process group, killed when the session ends; its leader is reaped after
/// (by `kill_on_drop`), so the group id is still ours when the signal is sent.
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pid) = self
            .0
            .and_then(|p| i32::try_from(p).ok())
            .filter(|&p| p > 1)
        {
            // SAFETY: killpg only sends a signal, to the group of our own unreaped child.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn output(stdout: Vec<u8>, stderr: Vec<u8>) -> Output {
        Output {
            code: 0,
            stdout,
            stderr,
            stdout_cut: 0,
            stderr_cut: 0,
        }
    }

    proptest! {
        /// Whatever the sandbox answers to the probe: no panic, a directory used only when
        /// absolute and printable, and any message short.
        #[test]
        fn any_probe_answer_is_read_safely(
            head in proptest::collection::vec(any::<u8>(), 0..300),
            word in prop::sample::select(vec!["ready ", "upload ", "norun ", "missing", "x "]),
            tail in proptest::collection::vec(any::<u8>(), 0..300),
            stderr in proptest::collection::vec(any::<u8>(), 0..2000),
        ) {
            let mut stdout = head;
            stdout.extend_from_slice(b"\n__RESULT__ ");
            stdout.extend_from_slice(word.as_bytes());
            stdout.extend_from_slice(&tail);
            for out in [output(stdout.clone(), stderr.clone()), output(tail.clone(), stderr.clone())] {
                match ProbeAnswer::read(&out) {
                    Ok(ProbeAnswer::Ready(d)) | Ok(ProbeAnswer::Upload { dir: d, .. }) => {
                        prop_assert!(d.starts_with('/') && !d.chars().any(char::is_control));
                    }
                    Ok(ProbeAnswer::NoRun(why)) => prop_assert!(why.chars().count() <= MAX_QUOTED + 1),
                    Ok(_) => {}
                    Err(e) => prop_assert!(e.to_string().len() < 2 * MAX_QUOTED * 4 + 300, "{}", e),
                }
            }
        }
    }

    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_channel_that_never_says_go_on_is_given_up_within_the_banner_bound() {
        let (mut sandbox, laptop) = tokio::io::duplex(64 * 1024);
        // Endless bytes with no newline, then endless short lines: neither is held whole.
        let writer = tokio::spawn(async move {
            let chunk = vec![b'A'; 64 * 1024];
            let mut sent = 0usize;
            while sandbox.write_all(&chunk).await.is_ok() {
                sent += chunk.len();
                if sent > 64 * 1024 * 1024 {
                    break;
                }
            }
            sent
        });
        let mut out = tokio::io::BufReader::new(laptop);
        assert!(!await_go_on(&mut out).await);
        drop(out);
        let sent = writer.await.unwrap();
        assert!(sent < 4 * MAX_BANNER, "read {sent} bytes of banner");
        // A banner then the line: found, and what follows it is left for the caller.
        let (mut sandbox, laptop) = tokio::io::duplex(64 * 1024);
        sandbox
            .write_all(format!("Welcome!\n{GO_ON}\nPRI * HTTP/2.0").as_bytes())
            .await
            .unwrap();
        let mut out = tokio::io::BufReader::new(laptop);
        assert!(await_go_on(&mut out).await);
        let mut rest = vec![0u8; 14];
        tokio::io::AsyncReadExt::read_exact(&mut out, &mut rest)
            .await
            .unwrap();
        assert_eq!(rest, b"PRI * HTTP/2.0");
    }

    #[tokio::test]
    async fn the_bridge_socket_is_private_to_this_user() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let bridge =
            Bridge::start(vec!["sh".into()], b"/x".to_vec(), b"/y".to_vec(), false).unwrap();
        let socket = bridge.socket();
        let dir = socket.parent().unwrap();
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let sock = std::fs::metadata(socket).unwrap();
        assert_eq!(sock.permissions().mode() & 0o777, 0o600);
        assert_eq!(sock.uid(), rustix::process::geteuid().as_raw());
    }

    #[tokio::test]
    async fn what_killed_mounts_left_is_swept_and_a_live_bridge_is_not() {
        let parent = tempfile::tempdir().unwrap();
        let stale = parent.path().join("sbxfs-exec-stale");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("agent.sock"), "").unwrap();
        let live = parent.path().join("sbxfs-exec-live");
        std::fs::create_dir(&live).unwrap();
        let _listening = std::os::unix::net::UnixListener::bind(live.join("agent.sock")).unwrap();
        let young = parent.path().join("sbxfs-exec-young");
        std::fs::create_dir(&young).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        for d in [&stale, &live] {
            std::fs::File::open(d).unwrap().set_modified(old).unwrap();
        }
        sweep_stale_bridges(parent.path());
        assert!(!stale.exists());
        assert!(live.exists(), "a bound socket's directory stays");
        assert!(young.exists(), "a directory made a moment ago stays");
    }

    #[test]
    fn this_program_is_read_as_elf_and_a_script_is_not() {
        let me = std::env::current_exe().unwrap();
        assert!(is_dynamically_linked(&me).is_some());
        let script = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(script.path(), "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(is_dynamically_linked(script.path()), None);
    }
}
