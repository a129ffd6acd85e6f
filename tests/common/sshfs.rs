//! sshfs at a distance, the peer the benchmarks measure sbxfs against: a private `sshd` on
//! 127.0.0.1 (key auth, its own config and host key, stopped by pid on drop) and `sshfs`
//! mounts of it (unmounted with `fusermount3 -uz` and stopped by pid on drop).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::MountedChild;

/// A private sshd; killed (by pid) on drop, also when the test fails. Drop the sshfs mounts
/// first: each connection's own sshd child exits when its client goes.
pub struct Sshd {
    child: Child,
    pub port: u16,
    /// The client key `authorized_keys` accepts.
    pub key: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start sshd as root on a free loopback port, with keys made in `dir`.
pub fn start_sshd(dir: &Path) -> Sshd {
    start_sshd_with(dir, "")
}

/// [`start_sshd`] with `extra` lines appended to its config (`SetEnv HOME=…`).
pub fn start_sshd_with(dir: &Path, extra: &str) -> Sshd {
    let host_key = dir.join("host_key");
    let key = dir.join("id");
    for k in [&host_key, &key] {
        assert!(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(k)
            .status()
            .unwrap()
            .success());
    }
    fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.join("sshd_config");
    fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin yes\n\
             PasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile {}\nSubsystem sftp internal-sftp\n{extra}",
            host_key.display(),
            dir.join("authorized_keys").display(),
            dir.join("sshd.pid").display()
        ),
    )
    .unwrap();
    fs::create_dir_all("/run/sshd").unwrap();
    let child = Command::new("/usr/sbin/sshd")
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sshd = Sshd { child, port, key };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return sshd;
        }
        if let Ok(Some(status)) = sshd.child.try_wait() {
            panic!("sshd exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sshd.child.kill().ok();
    panic!("sshd did not listen on {port}");
}

fn mounted(dir: &Path) -> bool {
    let want = dir.to_str().unwrap();
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want))
}

/// Mount `root` of the sshd reached at `port` (maybe a proxy in front of it) on `dir` with
/// sshfs's defaults (its 20 s caches on); returns once the mount answers.
pub fn mount_sshfs(root: &Path, port: u16, key: &Path, dir: &Path) -> MountedChild {
    fs::create_dir_all(dir).unwrap();
    let child = Command::new("sshfs")
        .arg("-f")
        .arg(format!("root@127.0.0.1:{}", root.display()))
        .arg(dir)
        .args(["-p", &port.to_string(), "-o"])
        .arg(format!(
            "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null",
            key.display()
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut m = MountedChild {
        child,
        dir: dir.to_path_buf(),
    };
    // A deadline only to stop a hung start.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mounted(dir) {
        if let Ok(Some(status)) = m.child.try_wait() {
            panic!("sshfs exited before mounting: {status}");
        }
        assert!(Instant::now() < deadline, "sshfs did not mount {dir:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    // sshfs may mount before its first exchange; a mount is ready once its root answers.
    fs::metadata(dir).unwrap();
    m
}
