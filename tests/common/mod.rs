//! Helpers shared by the integration tests: the vector corpus, trees on disk, external tools.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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

/// A mount whose daemon a test started itself (sbxfs in the foreground, sshfs): unmounted
/// and stopped by pid on drop, also when the test fails.
pub struct MountedChild {
    pub child: std::process::Child,
    pub dir: PathBuf,
}

impl Drop for MountedChild {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status();
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
        use std::io::BufRead;
        let token_dir = tempfile::tempdir().unwrap();
        let token_file = token_dir.path().join("token");
        fs::write(&token_file, format!("{token}\n")).unwrap();
        let mut child = Command::new(sbxfs_bin())
            .args(["agent", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .arg("--token-file")
            .arg(&token_file)
            .args(extra)
            .env("SBXFS_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start sbxfs agent");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no ready line from the agent: {line:?}"))
            .to_string();
        let addr = url.trim_start_matches("http://").parse().unwrap();
        AgentProcess {
            child,
            url,
            token: token.to_string(),
            addr,
            _token_dir: token_dir,
        }
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
            .env("SBXFS_LOG", "info")
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
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.dir)
                    .stderr(std::process::Stdio::null())
                    .status();
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.dir)
                    .stderr(std::process::Stdio::null())
                    .status();
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
