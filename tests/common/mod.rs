//! Helpers shared by the integration tests: the vector corpus, trees on disk, external tools.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub mod boxserver;
pub mod sshbox;
pub mod sshfs;
pub mod testca;

use sbxfs::search::grep::GrepOptions;
use sbxfs::search::walk::WalkOptions;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn load_vectors(name: &str) -> Value {
    let path = repo_root().join("tests/vectors").join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The bytes a file spec describes (the same rules as tests/reference/vector_files.py).
pub fn file_bytes(spec: &Value) -> Vec<u8> {
    let mut data = if let Some(hex) = spec.get("hex").and_then(Value::as_str) {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect()
    } else if let Some(prefix) = spec.get("line_prefix").and_then(Value::as_str) {
        let width = spec.get("width").and_then(Value::as_u64).unwrap_or(1) as usize;
        let count = spec["count"].as_u64().expect("count");
        let mut d = Vec::new();
        for i in 1..=count {
            d.extend_from_slice(format!("{prefix}{i:0width$}\n").as_bytes());
        }
        d
    } else {
        spec.get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .as_bytes()
            .to_vec()
    };
    let repeat = spec.get("repeat").and_then(Value::as_u64).unwrap_or(1) as usize;
    data = data.repeat(repeat);
    if spec.get("no_final_newline").and_then(Value::as_bool) == Some(true)
        && data.last() == Some(&b'\n')
    {
        data.pop();
    }
    data
}

/// Create one entry of a tree: a file spec, `{"dir": true}` or `{"symlink": "target"}`.
pub fn write_entry(path: &Path, spec: &Value) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    if spec.get("dir").and_then(Value::as_bool) == Some(true) {
        fs::create_dir_all(path).unwrap();
    } else if let Some(target) = spec.get("symlink").and_then(Value::as_str) {
        std::os::unix::fs::symlink(target, path).unwrap();
    } else {
        fs::write(path, file_bytes(spec)).unwrap();
        if let Some(mode) = spec.get("mode").and_then(Value::as_str) {
            let mode = u32::from_str_radix(mode, 8).unwrap();
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// Create a tree `{ "relative/path": spec, ... }` under `dir`.
pub fn write_tree(dir: &Path, tree: &Value) {
    for (rel, spec) in tree.as_object().expect("tree is an object") {
        write_entry(&dir.join(rel), spec);
    }
}

/// Find an external tool the test needs. Missing tools fail the test (CI installs them all);
/// set SBXFS_ALLOW_MISSING_TOOLS=1 to skip instead on a machine without them.
pub fn require_tool(name: &str) -> Option<PathBuf> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    if std::env::var_os("SBXFS_ALLOW_MISSING_TOOLS").is_some() {
        eprintln!("skipping: {name} is not installed");
        return None;
    }
    panic!("{name} is not installed (bash .ci/run installs every tool the tests need)");
}

/// Unmount `dir` lazily, also where `fusermount3` is missing (a machine whose tools are not
/// installed yet: the tests say so, and must still leave no mount behind).
pub fn detach(dir: &Path) {
    let done = Command::new("fusermount3")
        .arg("-uz")
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !done {
        if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid NUL-terminated path; umount2 only reads it.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Stops a process (SIGSTOP) and lets it go on (SIGCONT) when dropped, even if the test fails.
pub struct Frozen(i32);

impl Frozen {
    pub fn stop(pid: u32) -> Frozen {
        // SAFETY: a signal to the test's own child process, still running.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Frozen(pid as i32)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A mount whose daemon a test started itself (sbxfs in the foreground, sshfs): unmounted
/// and stopped by pid on drop, also when the test fails.
pub struct MountedChild {
    pub child: std::process::Child,
    pub dir: PathBuf,
}

impl Drop for MountedChild {
    fn drop(&mut self) {
        detach(&self.dir);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the tests run as root (mounting as root, acting as other users, installing).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `setpriv`, for a test that acts as another user: that needs root (else `None`, said).
pub fn setpriv_as_root() -> Option<PathBuf> {
    let setpriv = require_tool("setpriv")?;
    if !is_root() {
        eprintln!("skipping: acting as another user needs root");
        return None;
    }
    Some(setpriv)
}

/// Run a command, returning stdout; panics with stderr on a spawn failure.
pub fn run(cmd: &mut Command) -> (i32, Vec<u8>, Vec<u8>) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

/// User plus system CPU time of a process so far, in clock ticks (`/proc/PID/stat`).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

pub fn sbxfs_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sbxfs"))
}

/// Grep options as the vectors spell them (the same names as the CLI flags).
pub fn grep_options(o: &Value) -> GrepOptions {
    let u = |k: &str| o.get(k).and_then(Value::as_u64);
    let b = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or(false);
    let context = u("context").unwrap_or(0) as usize;
    GrepOptions {
        pattern: o["pattern"].as_str().unwrap().to_string(),
        fixed_strings: b("fixed_strings"),
        case_insensitive: b("ignore_case"),
        before_context: u("before_context").map_or(context, |n| n as usize),
        after_context: u("after_context").map_or(context, |n| n as usize),
        binary: b("text"),
        walk: WalkOptions {
            hidden: b("hidden"),
            no_ignore: b("no_ignore"),
            globs: o
                .get("globs")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|g| g.as_str().unwrap().to_string()).collect())
                .unwrap_or_default(),
            max_filesize: u("max_filesize"),
            ..Default::default()
        },
        max_results: u("max_results"),
        max_bytes: u("max_bytes"),
        threads: u("threads").unwrap_or(0) as usize,
        ..Default::default()
    }
}

/// A real `sbxfs agent` process serving `root` on a loopback port; killed (by pid) on drop,
/// even when the test fails.
pub struct AgentProcess {
    pub child: std::process::Child,
    pub url: String,
    pub token: String,
    pub addr: std::net::SocketAddr,
    _token_dir: tempfile::TempDir,
}

impl AgentProcess {
    pub fn start(root: &Path) -> AgentProcess {
        Self::start_with_token(root, "conformance-token-0123456789")
    }

    pub fn start_with_token(root: &Path, token: &str) -> AgentProcess {
        Self::start_with_args(root, token, &[])
    }

    /// An agent started with extra command-line flags (`--search-timeout 3`, …).
    pub fn start_with_args(root: &Path, token: &str, extra: &[&str]) -> AgentProcess {
        Self::launch(
            root,
            AgentLaunch {
                args: extra,
                token: Some(token),
                log: Some("warn"),
                ..Default::default()
            },
        )
    }

    pub fn client(&self) -> sbxfs::remote::client::AgentClient {
        sbxfs::remote::client::AgentClient::new(&self.url, &self.token).unwrap()
    }

    /// SIGKILL: the agent gets no chance to clean up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How [`AgentProcess::launch`] starts an agent beyond the usual.
#[derive(Default)]
pub struct AgentLaunch<'a> {
    /// More `sbxfs agent` arguments (`--allow-setid`).
    pub args: &'a [&'a str],
    /// A command the agent runs under (`prlimit --nofile=16:16 --`).
    pub wrapper: &'a [&'a str],
    /// A cgroup the agent is started in (its `cgroup.procs` files).
    pub cgroup: Option<&'a LimitedCgroup>,
    /// `SBXFS_LOG`; `None` leaves the default level.
    pub log: Option<&'a str>,
    /// Where its stderr goes (else inherited).
    pub stderr: Option<fs::File>,
    /// The bearer token (else the conformance suite's).
    pub token: Option<&'a str>,
}

impl AgentProcess {
    /// Start an agent as [`AgentLaunch`] says. The agent is the child itself (a wrapper or
    /// the cgroup shell `exec`s it), so it is stopped by pid like any other.
    pub fn launch(root: &Path, how: AgentLaunch) -> AgentProcess {
        use std::io::BufRead;
        let token = how.token.unwrap_or("conformance-token-0123456789");
        let token_dir = tempfile::tempdir().unwrap();
        let token_file = token_dir.path().join("token");
        fs::write(&token_file, token).unwrap();
        let mut argv: Vec<std::ffi::OsString> = how.wrapper.iter().map(Into::into).collect();
        argv.push(sbxfs_bin().into());
        argv.extend(["agent", "--listen", "127.0.0.1:0", "--root"].map(Into::into));
        argv.push(root.into());
        argv.push("--token-file".into());
        argv.push(token_file.into());
        argv.extend(how.args.iter().map(Into::into));
        // Joining the cgroup first, then exec: every thread the agent makes counts.
        let join = how
            .cgroup
            .map(|c| {
                c.procs()
                    .iter()
                    .map(|p| format!("echo $$ > '{}' && ", p.display()))
                    .collect::<String>()
            })
            .unwrap_or_default();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{join}exec \"$@\""))
            .arg("sh")
            .args(&argv)
            .stdout(std::process::Stdio::piped());
        match how.log {
            Some(level) => cmd.env("SBXFS_LOG", level),
            None => cmd.env_remove("SBXFS_LOG"),
        };
        if let Some(f) = how.stderr {
            cmd.stderr(f);
        }
        let mut child = cmd.spawn().expect("start sbxfs agent");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap_or_else(|| {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no ready line from the agent: {line:?}")
            })
            .to_string();
        let addr = url
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .parse()
            .unwrap();
        AgentProcess {
            child,
            url,
            token: token.to_string(),
            addr,
            _token_dir: token_dir,
        }
    }

    /// A line of the agent's `/proc/PID/status` (`VmHWM`, `Threads`), its first number.
    pub fn status_number(&self, key: &str) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in the agent's status"))
    }

    /// Descriptors the agent has open.
    pub fn open_fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// Whether the agent process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// A cgroup limiting memory and processes, for a test that runs something it attacks: the
/// machine is never at risk. cgroup v2 where its controllers are there, else v1's memory and
/// pids hierarchies. Removed on drop (after what ran in it has been stopped).
pub struct LimitedCgroup {
    dirs: Vec<PathBuf>,
    v2: bool,
}

impl LimitedCgroup {
    /// `None` (said) when no cgroup can be made here (not root, no controllers).
    pub fn new(name: &str, memory_bytes: u64, pids: u64) -> Option<LimitedCgroup> {
        // Every test file shares this process (one test binary): the pid alone would let two
        // tests of different files that pick the same name collide, the second "skipping".
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let unique = format!("sbxfs-test-{name}-{}-{n}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let controllers =
            fs::read_to_string(v2_root.join("cgroup.controllers")).unwrap_or_default();
        let made = if controllers.contains("memory") && controllers.contains("pids") {
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory +pids");
            let dir = v2_root.join(&unique);
            fs::create_dir(&dir)
                .and_then(|_| fs::write(dir.join("memory.max"), memory_bytes.to_string()))
                .and_then(|_| fs::write(dir.join("memory.swap.max"), "0").or(Ok(())))
                .and_then(|_| fs::write(dir.join("pids.max"), pids.to_string()))
                .map(|_| LimitedCgroup {
                    dirs: vec![dir],
                    v2: true,
                })
        } else {
            let mem = v2_root.join("memory").join(&unique);
            let pid = v2_root.join("pids").join(&unique);
            let mut cg = LimitedCgroup {
                dirs: Vec::new(),
                v2: false,
            };
            fs::create_dir(&mem)
                .map(|_| cg.dirs.push(mem.clone()))
                .and_then(|_| {
                    fs::write(mem.join("memory.limit_in_bytes"), memory_bytes.to_string())
                })
                .and_then(|_| fs::create_dir(&pid))
                .map(|_| cg.dirs.push(pid.clone()))
                .and_then(|_| fs::write(pid.join("pids.max"), pids.to_string()))
                .map(|_| cg)
        };
        match made {
            Ok(cg) => Some(cg),
            Err(e) => {
                eprintln!("skipping: cannot make a limited cgroup here ({e})");
                None
            }
        }
    }

    /// The `cgroup.procs` files a process writes its pid to, to join.
    pub fn procs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The most processes and threads it ever held, where the kernel says (`pids.peak`).
    pub fn pids_peak(&self) -> Option<u64> {
        let dir = self.dirs.iter().find(|d| d.join("pids.max").exists())?;
        fs::read_to_string(dir.join("pids.peak"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes and threads in it now.
    pub fn pids_current(&self) -> u64 {
        let dir = self
            .dirs
            .iter()
            .find(|d| d.join("pids.max").exists())
            .unwrap();
        fs::read_to_string(dir.join("pids.current"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Change the pids limit while it runs.
    pub fn set_pids_max(&self, max: u64) {
        let dir = self
            .dirs
            .iter()
            .find(|d| d.join("pids.max").exists())
            .unwrap();
        fs::write(dir.join("pids.max"), max.to_string()).unwrap();
    }

    /// Times a fork or thread was refused at the pids limit.
    pub fn pids_refused(&self) -> u64 {
        let dir = self
            .dirs
            .iter()
            .find(|d| d.join("pids.max").exists())
            .unwrap();
        let events = fs::read_to_string(dir.join("pids.events")).unwrap_or_default();
        events
            .lines()
            .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Times memory use hit the limit (v2 `memory.events` max, v1 `memory.failcnt`).
    pub fn memory_limit_hits(&self) -> u64 {
        let dir = &self.dirs[0];
        if self.v2 {
            let events = fs::read_to_string(dir.join("memory.events")).unwrap_or_default();
            events
                .lines()
                .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
                .unwrap_or(0)
        } else {
            fs::read_to_string(dir.join("memory.failcnt"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        }
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            // The processes in it were stopped just before; their exit may take a moment.
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

impl AgentProcess {
    /// Start an agent on a given address (to restart one where a mount expects it).
    pub fn start_on(root: &Path, addr: std::net::SocketAddr) -> AgentProcess {
        use std::io::BufRead;
        let token = "conformance-token-0123456789";
        let token_dir = tempfile::tempdir().unwrap();
        let token_file = token_dir.path().join("token");
        fs::write(&token_file, token).unwrap();
        // The old listener's port may take a moment to be free again.
        for _ in 0..50 {
            let mut child = Command::new(sbxfs_bin())
                .args(["agent", "--listen", &addr.to_string(), "--root"])
                .arg(root)
                .arg("--token-file")
                .arg(&token_file)
                .env("SBXFS_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start sbxfs agent");
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            if line.contains("http://") {
                return AgentProcess {
                    child,
                    url: format!("http://{addr}"),
                    token: token.to_string(),
                    addr,
                    _token_dir: token_dir,
                };
            }
            let _ = child.wait();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("could not restart the agent on {addr}");
    }
}

/// A real `sbxfs mount` of an agent: unmounted (`fusermount3 -uz`) and stopped by pid on drop,
/// even when the test fails.
pub struct MountProcess {
    pub child: Option<std::process::Child>,
    pub dir: PathBuf,
    _base: tempfile::TempDir,
    pub log: PathBuf,
}

impl MountProcess {
    pub fn start(agent: &AgentProcess, extra: &[&str]) -> MountProcess {
        Self::start_url(&agent.url, &agent.token, extra)
    }

    /// Mount a remote by URL (e.g. an agent behind a proxy).
    pub fn start_url(url: &str, token: &str, extra: &[&str]) -> MountProcess {
        Self::start_url_cache(url, token, extra, None)
    }

    /// Mount with the daemon's private state (staging) under `cache` (`XDG_CACHE_HOME`), so
    /// a test can mount the same sandbox again over what an earlier daemon left; by default
    /// each mount has its own.
    pub fn start_url_cache(
        url: &str,
        token: &str,
        extra: &[&str],
        cache: Option<&Path>,
    ) -> MountProcess {
        Self::start_full(url, token, extra, cache, &[], None)
    }

    /// Mount with extra environment variables for the daemon.
    pub fn start_url_env(
        url: &str,
        token: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> MountProcess {
        Self::start_full(url, token, extra, None, env, None)
    }

    /// Mount on a directory the caller keeps (to mount there again, or on a prepared path).
    pub fn start_on(dir: &Path, url: &str, token: &str, extra: &[&str]) -> MountProcess {
        Self::start_full(url, token, extra, None, &[], Some(dir))
    }

    fn start_full(
        url: &str,
        token: &str,
        extra: &[&str],
        cache: Option<&Path>,
        env: &[(&str, &str)],
        on: Option<&Path>,
    ) -> MountProcess {
        let base = tempfile::tempdir().unwrap();
        let cache = cache
            .map(Path::to_path_buf)
            .unwrap_or_else(|| base.path().join("cache"));
        let dir = match on {
            Some(d) => d.to_path_buf(),
            None => {
                let d = base.path().join("mnt");
                fs::create_dir(&d).unwrap();
                d
            }
        };
        let token_file = base.path().join("token");
        fs::write(&token_file, token).unwrap();
        let log = base.path().join("mount.log");
        let mut child = Command::new(sbxfs_bin())
            .arg("mount")
            .arg(url)
            .arg(&dir)
            .arg("--token-file")
            .arg(&token_file)
            .args(extra)
            // A debugging run can ask every mount for more (`SBXFS_TEST_LOG=sbxfs=debug`).
            .env(
                "SBXFS_LOG",
                std::env::var("SBXFS_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("XDG_CACHE_HOME", &cache)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start sbxfs mount");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let mut m = MountProcess {
            child: Some(child),
            dir,
            _base: base,
            log,
        };
        if !line.contains("mounted") {
            m.stop();
            panic!("mount did not start: {line:?}; log: {}", m.log_text());
        }
        m
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM: the daemon pushes pending writes and unmounts. Returns its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                detach(&self.dir);
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                detach(&self.dir);
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        detach(&self.dir);
        if let Some(mut c) = self.child.take() {
            // SIGTERM first: the daemon stops what it started (an ssh master) as it exits.
            // SIGKILL only if it has not exited within a few seconds.
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < until {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait until `cond` holds, checking every 50 ms, for at most `deadline`; panics naming
/// `what` if it never does. The one way tests wait for something to happen.
pub fn eventually(what: &str, deadline: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + deadline;
    loop {
        if cond() {
            return;
        }
        if std::time::Instant::now() > until {
            panic!("{what}: not within {deadline:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Two processes spinning on the CPU (one per core of the CI machine), as on a busy laptop:
/// the real-tool tests run beside them, because most races only show under load. Stopped by
/// pid on drop.
pub struct CpuHogs {
    children: Vec<std::process::Child>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One pair of hogs at a time in the test process: tests that start them wait for the pair
/// before to stop, so the load stays two spinning processes beside whatever else runs.
static HOGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl CpuHogs {
    pub fn start() -> CpuHogs {
        let turn = HOGS.lock().unwrap_or_else(|e| e.into_inner());
        let children = (0..2)
            .map(|_| {
                Command::new("sh")
                    .arg("-c")
                    .arg("while :; do :; done")
                    .stdin(std::process::Stdio::null())
                    .spawn()
                    .expect("start a CPU hog")
            })
            .collect();
        CpuHogs {
            children,
            _turn: turn,
        }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Copy a program to be run from its copy, by `cp` in a process of its own: a file this test
/// process writes itself is open for writing for a moment, and a child another test forks
/// meanwhile inherits that descriptor until it execs, so running the copy could fail with
/// ETXTBSY ("Text file busy").
pub fn copy_program(from: &Path, to: &Path) {
    let out = Command::new("cp").arg(from).arg(to).output().unwrap();
    assert!(
        out.status.success(),
        "cp {} {}: {}",
        from.display(),
        to.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The contents of the conflict copies the mount saved beside `name` in the workspace `root`.
pub fn conflict_copies_of(root: &Path, name: &str) -> Vec<String> {
    let prefix = format!("{name}.sbxfs-conflict-");
    let mut copies: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    copies.sort();
    copies
        .iter()
        .map(|n| String::from_utf8_lossy(&std::fs::read(root.join(n)).unwrap()).into_owned())
        .collect()
}

/// A file held open across a push (an appending log; a write, fsync, write) through the
/// mount at `mount` of the workspace `root`: when the sandbox changes it before the next push,
/// the conflict copy is the user's whole version (the bytes the file had when opened, then
/// every write), never the sandbox's new bytes, and the sandbox keeps its own.
pub fn held_open_across_a_conflict(root: &Path, mount: &Path) {
    use std::io::Write;
    std::fs::write(mount.join("d.txt"), "line one\nline two\n").unwrap();
    ctl_flush(mount);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(mount.join("d.txt"))
        .unwrap();
    f.write_all(b"mine1\n").unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("d.txt")).unwrap(),
        "line one\nline two\nmine1\n"
    );
    std::fs::write(root.join("d.txt"), "THEIRS\n").unwrap();
    // Long enough for a change feed to tell the mount.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    f.write_all(b"mine2\n").unwrap();
    let conflict = f.sync_all().expect_err("the push met the sandbox's change");
    assert_eq!(conflict.raw_os_error(), Some(libc::EIO));
    // Still open after the conflict: what it writes next goes on after mine2 in the user's
    // version (the conflict copy), never onto the sandbox's new file.
    f.write_all(b"mine3\n").unwrap();
    drop(f);
    ctl_flush_conflicted(mount, "d.txt");
    assert_eq!(
        std::fs::read_to_string(root.join("d.txt")).unwrap(),
        "THEIRS\n"
    );
    assert_eq!(
        conflict_copies_of(root, "d.txt"),
        ["line one\nline two\nmine1\nmine2\nmine3\n"]
    );
    assert_eq!(
        std::fs::read_to_string(mount.join("d.txt")).unwrap(),
        "THEIRS\n"
    );
}

/// Wait (up to 10 s) until `path`, made in the sandbox, shows through the mount: the change
/// feed tells the mount within about a second, longer on a busy machine.
pub fn wait_shown(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never showed in the mount",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `text` made as `name` in the sandbox (`root`), then opened for appending through the mount
/// once it shows there: a writer holding a file the sandbox is about to change.
pub fn append_to_sandbox_file(root: &Path, mount: &Path, name: &str, text: &[u8]) -> std::fs::File {
    std::fs::write(root.join(name), text).unwrap();
    wait_shown(&mount.join(name));
    std::fs::OpenOptions::new()
        .append(true)
        .open(mount.join(name))
        .unwrap()
}

/// `sbxfs ctl --json stats` of the mount at `mount`.
pub fn ctl_stats(mount: &Path) -> Value {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--json", "--mount"])
        .arg(mount)
        .arg("stats"));
    assert_eq!(code, 0, "ctl stats: {}", String::from_utf8_lossy(&err));
    serde_json::from_slice(&out).unwrap()
}

/// `sbxfs ctl flush` on a mount where `path` met a sandbox-side change since the last flush:
/// exit 1, naming it and its conflict copy on stderr.
pub fn ctl_flush_conflicted(mount: &Path, path: &str) {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--mount"])
        .arg(mount)
        .arg("flush"));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 1, "ctl flush: {}{err}", String::from_utf8_lossy(&out));
    let named = format!("sbxfs ctl: conflict: {path} changed in the sandbox");
    assert!(
        err.contains(&named) && err.contains(&format!("saved beside it as {path}.sbxfs-conflict-")),
        "{err}"
    );
}

/// `sbxfs ctl flush` on the mount at `mount`, which must succeed: close queues the push, so a
/// test that looks in the sandbox right after a program closed its files waits for it first.
pub fn ctl_flush(mount: &Path) {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--mount"])
        .arg(mount)
        .arg("flush"));
    assert_eq!(
        code,
        0,
        "ctl flush: {}{}",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
}
