//! A real agentscope-runtime box server (PyPI `agentscope-runtime`, installed into a venv by
//! scripts/install-deps.sh) on a free loopback port, with a temp WORKSPACE_DIR; stopped by pid
//! when dropped (`common::boxserver`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct BoxServer {
    child: Child,
    pub port: u16,
    pub token: String,
    pub workspace: PathBuf,
    _dir: tempfile::TempDir,
}

/// The venv's python, or `None` (said) when the box server is not installed.
pub fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("SBXFS_AGENTSCOPE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/sbxfs-agentscope"));
    let py = venv.join("bin/python");
    if py.exists() {
        return Some(py);
    }
    if std::env::var_os("SBXFS_ALLOW_MISSING_TOOLS").is_some() {
        eprintln!("skipping: agentscope-runtime is not installed (scripts/install-deps.sh)");
        return None;
    }
    panic!(
        "{}: agentscope-runtime is not installed: run scripts/install-deps.sh",
        py.display()
    );
}

fn app_dir(python: &Path) -> PathBuf {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (Importing the package would pull in its Docker client; only the app's files are needed.)
    let app = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        .join("agentscope_runtime/sandbox/box/shared");
    assert!(app.join("app.py").exists(), "{}", app.display());
    app
}

impl BoxServer {
    /// Start it; `path_env` replaces the PATH its commands see (a sandbox without python3).
    pub fn start(path_env: Option<&str>) -> Option<BoxServer> {
        let python = venv_python()?;
        let app = app_dir(&python);
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let token = format!("tok-{}-{port}", std::process::id());
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "uvicorn", "app:app", "--app-dir"])
            .arg(&app)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--log-level=warning")
            .current_dir(dir.path())
            .env("WORKSPACE_DIR", &workspace)
            .env("SECRET_TOKEN", &token)
            // gitpython (imported by the app) refuses to load without git on PATH otherwise.
            .env("GIT_PYTHON_REFRESH", "quiet")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = path_env {
            cmd.env("PATH", p);
        }
        let child = cmd.spawn().expect("start the box server");
        let server = BoxServer {
            child,
            port,
            token,
            workspace,
            _dir: dir,
        };
        server.wait_ready();
        Some(server)
    }

    fn wait_ready(&self) {
        // A deadline only so a server that never starts fails the test instead of hanging it.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "the box server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        format!("agentscope+http://127.0.0.1:{}", self.port)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for BoxServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
