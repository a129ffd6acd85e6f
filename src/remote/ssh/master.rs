//! One multiplexed OpenSSH connection: a ControlMaster kept as a child process for the
//! connection's life, in a private 0700 directory; every later `ssh` goes through its socket
//! (`-S`), so the user authenticates once. `BatchMode=yes`: a password prompt would hang a
//! mount, so it fails instead.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::target::SshTarget;
use crate::remote::exec::{collect_capped, Output, OUTPUT_CAP};
use crate::remote::{RemoteError, Result};

/// Longest the master may take to connect and authenticate.
const CONNECT_DEADLINE: Duration = Duration::from_secs(60);

/// Options sbxfs adds to every ssh it runs: first given wins in ssh, so these beat the
/// user's config; everything else (keys, agent, proxies) comes from that config.
const FORCED: [&str; 4] = [
    "-oBatchMode=yes",
    "-oServerAliveInterval=15",
    "-oServerAliveCountMax=4",
    "-oConnectTimeout=30",
];

/// The private directories' name prefix, in the temp dir.
const DIR_PREFIX: &str = "sbxfs-ssh-";
/// The file in a private directory naming the process it belongs to.
const OWNER_FILE: &str = "owner.pid";

/// Remove the private directories of our own daemons that died without cleaning up (`kill
/// -9`): each names its owner; one whose owner is gone is removed. Others are left alone.
fn sweep_dead_dirs(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::getuid().as_raw();
    for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The running master; stopped (by pid) on drop.
pub struct Master {
    /// The user's ssh command with its options, `-F`, `-p`, `-l` and [`FORCED`].
    base: Vec<String>,
    host: String,
    control: PathBuf,
    child: Mutex<std::process::Child>,
    /// Private 0700 directory: the control socket, the forwarded agent socket, the log.
    dir: tempfile::TempDir,
}

impl Drop for Master {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The ssh command line before the host: the user's command, `-F`, `-p`, `-l`, our options.
pub fn base_argv(
    t: &SshTarget,
    ssh_command: Option<&str>,
    ssh_config: Option<&Path>,
) -> Result<Vec<String>> {
    let mut argv = match ssh_command {
        Some(c) => shell_words::split(c)
            .map_err(|e| RemoteError::Invalid(format!("ssh_command {c:?}: {e}")))?,
        None => vec!["ssh".to_string()],
    };
    if argv.is_empty() {
        return Err(RemoteError::Invalid("ssh_command is empty".into()));
    }
    if let Some(f) = ssh_config {
        let f = f
            .to_str()
            .ok_or_else(|| RemoteError::Invalid(format!("-F {f:?}: not UTF-8")))?;
        argv.extend(["-F".to_string(), f.to_string()]);
    }
    if let Some(p) = t.port {
        argv.extend(["-p".to_string(), p.to_string()]);
    }
    if let Some(u) = &t.user {
        argv.extend(["-l".to_string(), u.clone()]);
    }
    argv.extend(FORCED.iter().map(|s| s.to_string()));
    Ok(argv)
}

impl Master {
    /// Start the master and wait until its socket answers (authenticated), or fail with ssh's
    /// own words and what to do.
    pub fn start(base: Vec<String>, host: &str) -> Result<Master> {
        sweep_dead_dirs(&std::env::temp_dir());
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| RemoteError::Transport(format!("private directory: {e}")))?;
        // Private: it holds the control socket (anyone who can reach it runs commands as us).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
                .map_err(|e| RemoteError::Transport(format!("private directory: {e}")))?;
        }
        // Whose it is: a daemon killed outright cannot remove it; the next one does.
        std::fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())
            .map_err(|e| RemoteError::Transport(format!("private directory: {e}")))?;
        let control = dir.path().join("master");
        let log = dir.path().join("master.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", log.display())))?;
        let mut cmd = std::process::Command::new(&base[0]);
        cmd.args(&base[1..])
            .args([
                "-M",
                "-N",
                "-oControlPersist=no",
                "-oClearAllForwardings=yes",
                "-S",
            ])
            .arg(&control)
            .arg("--")
            .arg(host)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = spawn_tied(cmd)
            .map_err(|e| RemoteError::Transport(format!("cannot run {:?}: {e}", base[0])))?;
        let master = Master {
            base,
            host: host.to_string(),
            control,
            child: Mutex::new(child),
            dir,
        };
        // A deadline only to stop a hung start: ssh's own ConnectTimeout comes first.
        let deadline = Instant::now() + CONNECT_DEADLINE;
        loop {
            if let Some(status) = master
                .child
                .lock()
                .expect("ssh master")
                .try_wait()
                .ok()
                .flatten()
            {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(connect_error(host, status.code(), &said));
            }
            if master.check() {
                return Ok(master);
            }
            if Instant::now() > deadline {
                return Err(RemoteError::TimedOut(format!(
                    "ssh {host}: no connection after {CONNECT_DEADLINE:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the master process has exited (the connection dropped, or it was killed).
    pub fn exited(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        !matches!(child.try_wait(), Ok(None))
    }

    /// Whether the master is running and answers on its socket.
    pub fn alive(&self) -> bool {
        !self.exited() && self.check()
    }

    fn check(&self) -> bool {
        self.control.exists()
            && std::process::Command::new(&self.base[0])
                .args(&self.base[1..])
                .arg("-S")
                .arg(&self.control)
                .args(["-O", "check", "--", &self.host])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    }

    /// The private directory (0700) of this connection.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// An ssh argv that runs `remote` (one command line for the remote shell) through the
    /// master: no new authentication.
    pub fn argv(&self, remote: &[&str]) -> Vec<String> {
        let mut argv = self.base.clone();
        argv.extend([
            "-S".to_string(),
            self.control.to_string_lossy().into_owned(),
            "-oControlMaster=no".to_string(),
            "-oClearAllForwardings=yes".to_string(),
            "-T".to_string(),
            "--".to_string(),
            self.host.clone(),
        ]);
        argv.extend(remote.iter().map(|s| s.to_string()));
        argv
    }

    /// Run `remote` (a command line for the remote shell, built with [`quote`]) with `input` on
    /// its standard input: bytes, or a file streamed as it is read (the binary to deploy).
    pub async fn run(&self, remote: Vec<u8>, input: Input, limit: Duration) -> Result<Output> {
        let mut argv: Vec<OsString> = self.argv(&[]).into_iter().map(OsString::from).collect();
        argv.push(OsString::from_vec(remote));
        let (stdin_of, bytes) = match input {
            Input::Bytes(b) => (Stdio::piped(), b),
            Input::File(f) => (Stdio::from(f), Vec::new()),
        };
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(stdin_of)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RemoteError::Transport(format!("cannot run {:?}: {e}", argv[0])))?;
        let stdin = child.stdin.take();
        let (stdout, stderr) = (
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let work = async {
            let feed = async move {
                use tokio::io::AsyncWriteExt;
                if let Some(mut stdin) = stdin {
                    let _ = stdin.write_all(&bytes).await;
                }
            };
            let (_, (out, out_cut), (err, err_cut), status) = tokio::join!(
                feed,
                collect_capped(stdout, OUTPUT_CAP),
                collect_capped(stderr, OUTPUT_CAP),
                child.wait()
            );
            let status = status.map_err(|e| RemoteError::Transport(format!("ssh: {e}")))?;
            Ok(Output {
                code: status.code().unwrap_or(255),
                stdout: out,
                stderr: err,
                stdout_cut: out_cut,
                stderr_cut: err_cut,
            })
        };
        tokio::time::timeout(limit, work).await.map_err(|_| {
            RemoteError::TimedOut(format!("ssh {}: no answer after {limit:?}", self.host))
        })?
    }

    /// Forward the local Unix socket `local` to `remote` (a Unix socket in the sandbox) through
    /// the master; it stops with the master.
    pub fn forward(&self, local: &Path, remote: &[u8]) -> Result<()> {
        let mut spec = local.as_os_str().to_os_string().into_vec();
        spec.push(b':');
        spec.extend_from_slice(remote);
        let out = std::process::Command::new(&self.base[0])
            .args(&self.base[1..])
            .arg("-S")
            .arg(&self.control)
            .args(["-O", "forward", "-L"])
            .arg(OsString::from_vec(spec))
            .args(["--", &self.host])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| RemoteError::Transport(format!("ssh -O forward: {e}")))?;
        if !out.status.success() {
            return Err(RemoteError::Transport(format!(
                "ssh {}: cannot forward to the agent's socket: {}",
                self.host,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Stop forwarding `local` to `remote` (best effort: a forwarding already gone is fine),
    /// and remove the local socket.
    pub fn cancel_forward(&self, local: &Path, remote: &[u8]) {
        let mut spec = local.as_os_str().to_os_string().into_vec();
        spec.push(b':');
        spec.extend_from_slice(remote);
        let _ = std::process::Command::new(&self.base[0])
            .args(&self.base[1..])
            .arg("-S")
            .arg(&self.control)
            .args(["-O", "cancel", "-L"])
            .arg(OsString::from_vec(spec))
            .args(["--", &self.host])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(local);
    }
}

/// Start `cmd` so that it gets SIGTERM when this process dies, however it dies (SIGKILL
/// included): the master must not outlive the mount that started it.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process,
/// so the fork happens on one thread kept for the process's life (a `spawn_blocking` thread
/// would exit after a while idle and take the master with it).
fn spawn_tied(mut cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    type Job = (
        std::process::Command,
        std::sync::mpsc::Sender<std::io::Result<std::process::Child>>,
    );
    static SPAWNER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let parent = std::process::id();
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls (prctl, getppid, kill, getpid) between fork
        // and exec; no allocation, no lock.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before the line above: the signal will never come.
                if libc::getppid() as u32 != parent {
                    libc::kill(libc::getpid(), libc::SIGTERM);
                }
                Ok(())
            });
        }
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sbxfs-ssh-spawn".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("a thread to start ssh masters from");
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the ssh spawning thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the ssh spawning thread is gone"))?
}

/// What a remote command reads on its standard input.
pub enum Input {
    Bytes(Vec<u8>),
    File(std::fs::File),
}

/// The one error for a master that exited: ssh's last words, and what to do about them.
fn connect_error(host: &str, code: Option<i32>, said: &str) -> RemoteError {
    let said = said.trim();
    let hint = if said.contains("Permission denied") || said.contains("assword") {
        " (sbxfs runs ssh with BatchMode=yes, so it never asks for a password: use a key / ssh-agent)"
    } else if said.contains("Host key verification failed") {
        " (the host's key is not in known_hosts: connect once with plain ssh to accept it)"
    } else {
        ""
    };
    let code = code.map_or("a signal".to_string(), |c| format!("status {c}"));
    RemoteError::Transport(format!(
        "ssh {host} failed ({code}): {}{hint}",
        if said.is_empty() { "no message" } else { said }
    ))
}

/// `s` as one word for a POSIX shell: single-quoted, any bytes.
pub fn quote(s: &[u8]) -> Vec<u8> {
    let mut q = vec![b'\''];
    for &b in s {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_every_awkward_byte() {
        for word in [
            &b"plain"[..],
            b"it's",
            b"$(touch /tmp/x) `id` ; rm -rf / #",
            b"-n",
            b"a\nb\xff",
            b"",
        ] {
            let mut cmd = b"printf %s ".to_vec();
            cmd.extend(quote(word));
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(OsString::from_vec(cmd))
                .output()
                .unwrap();
            assert_eq!(out.stdout, word);
        }
    }

    #[test]
    fn the_users_command_comes_first_and_batch_mode_is_forced() {
        let t = super::super::target::parse("ssh://me@h:2200/w").unwrap();
        let argv = base_argv(
            &t,
            Some("ssh -i 'my key' -o StrictHostKeyChecking=no"),
            Some(Path::new("/c")),
        )
        .unwrap();
        assert_eq!(
            &argv[..9],
            [
                "ssh",
                "-i",
                "my key",
                "-o",
                "StrictHostKeyChecking=no",
                "-F",
                "/c",
                "-p",
                "2200"
            ]
        );
        assert!(argv.contains(&"-oBatchMode=yes".to_string()));
        assert!(base_argv(&t, Some("ssh 'unclosed"), None).is_err());
        assert!(base_argv(&t, Some(""), None).is_err());
    }

    #[test]
    fn a_refused_key_says_to_use_a_key_or_agent() {
        let e = connect_error("h", Some(255), "root@h: Permission denied (publickey).\n");
        assert!(e.to_string().contains("use a key / ssh-agent"), "{e}");
    }
}
