//! A sandbox reached over ssh: a private sshd on 127.0.0.1 (key auth) whose sessions get their
//! own `HOME`, so what sbxfs deploys lands in this test's directory; an ssh config for `-F`
//! naming it `sbx`. On drop every agent deployed under that HOME is stopped by pid, then sshd.

use std::fs;
use std::path::{Path, PathBuf};

use super::sshfs::{start_sshd_with, Sshd};

pub struct SshBox {
    /// The workspace the URL names.
    pub root: PathBuf,
    /// The sessions' HOME in the "sandbox".
    pub home: PathBuf,
    /// `-F` config: host `sbx`, key auth, no known_hosts.
    pub config: PathBuf,
    pub sshd: Option<Sshd>,
    pub dir: tempfile::TempDir,
}

impl SshBox {
    pub fn start() -> SshBox {
        SshBox::start_with("")
    }

    /// [`SshBox::start`] with `extra` lines in sshd's config (`AllowTcpForwarding no`).
    pub fn start_with(extra: &str) -> SshBox {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let home = dir.path().join("home");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&home).unwrap();
        let keys = dir.path().join("keys");
        fs::create_dir_all(&keys).unwrap();
        let sshd = start_sshd_with(&keys, &format!("SetEnv HOME={}\n{extra}", home.display()));
        let config = dir.path().join("ssh_config");
        write_config(&config, sshd.port, &sshd.key);
        SshBox {
            root,
            home,
            config,
            sshd: Some(sshd),
            dir,
        }
    }

    /// `ssh://sbx/ROOT`, with `suffix` (`?agent=no`) appended.
    pub fn url(&self, suffix: &str) -> String {
        format!("ssh://sbx{}{suffix}", self.root.display())
    }

    pub fn options(&self) -> sbxfs::remote::connect::ConnectOptions {
        sbxfs::remote::connect::ConnectOptions {
            ssh_config: Some(self.config.clone()),
            deploy_binary: Some(env!("CARGO_BIN_EXE_sbxfs").into()),
            ..Default::default()
        }
    }

    /// The pid files of the agents deployed under HOME.
    pub fn agent_pid_files(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let base = self.home.join(".cache/sbxfs");
        for v in fs::read_dir(&base).into_iter().flatten().flatten() {
            for a in fs::read_dir(v.path().join("agents"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let p = a.path().join("pid");
                if p.exists() {
                    found.push(p);
                }
            }
        }
        found
    }

    /// The pid of the one agent deployed for this workspace.
    pub fn agent_pid(&self) -> i32 {
        let files = self.agent_pid_files();
        assert_eq!(files.len(), 1, "{files:?}");
        fs::read_to_string(&files[0])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

/// An ssh config naming the sshd `sbx`, with `key`.
pub fn write_config(path: &Path, port: u16, key: &Path) {
    fs::write(
        path,
        format!(
            "Host sbx\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  IdentityAgent none\n  StrictHostKeyChecking no\n  \
             UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            key.display()
        ),
    )
    .unwrap();
}

impl Drop for SshBox {
    fn drop(&mut self) {
        for f in self.agent_pid_files() {
            if let Some(pid) = fs::read_to_string(&f)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                // Only a process running a binary this test deployed (a pid may be reused).
                let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                if !exe.starts_with(&self.home) {
                    continue;
                }
                // SAFETY: kill(2) with a pid this test's sandbox recorded; no memory involved.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        self.sshd.take();
    }
}
