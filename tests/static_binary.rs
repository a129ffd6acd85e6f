//! The one static binary: `scripts/build-static.sh` builds an `sbxfs` that needs no libc, and
//! inside a chroot holding nothing but it, a static busybox and an empty workspace it prints
//! its version and serves that workspace as the agent (what is deployed into sandboxes).

use crate::common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The static binary, built once per run (cargo reuses target/static when it is up to date).
fn static_sbxfs() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // Without the variables `cargo test` sets for its tests: build scripts that watch
            // them would rebuild target/static at every run.
            let mut cmd = Command::new(common::repo_root().join("scripts/build-static.sh"));
            cmd.env_clear();
            for keep in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR"] {
                if let Some(v) = std::env::var_os(keep) {
                    cmd.env(keep, v);
                }
            }
            let out = cmd.output().expect("run scripts/build-static.sh");
            assert!(
                out.status.success(),
                "build-static.sh: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        })
        .clone()
}

/// Kills the chrooted agent by pid, even when the test fails.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn file_says(path: &Path) -> String {
    let out = Command::new("file").arg("-L").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_static_binary_needs_no_libc() {
    let bin = static_sbxfs();
    let says = file_says(&bin);
    assert!(
        says.contains("statically linked") || says.contains("static-pie linked"),
        "{says}"
    );
    // ldd has nothing to load for it.
    let ldd = Command::new("ldd").arg(&bin).output().unwrap();
    let text = String::from_utf8_lossy(&ldd.stdout) + String::from_utf8_lossy(&ldd.stderr);
    assert!(!text.contains("libc.so"), "{text}");
}

#[test]
fn the_static_agent_serves_a_workspace_from_a_chroot_with_nothing_else() {
    if !common::is_root() {
        println!("skipped: chroot needs root");
        return;
    }
    let Some(busybox) = common::require_tool("busybox") else {
        println!("skipped: no busybox (scripts/install-deps.sh installs busybox-static)");
        return;
    };
    if !file_says(&busybox).contains("statically linked") {
        println!(
            "skipped: {} is not static (install busybox-static)",
            busybox.display()
        );
        return;
    }
    let bin = static_sbxfs();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::create_dir_all(r.join("ws")).unwrap();
    common::copy_program(&bin, &r.join("bin/sbxfs"));
    common::copy_program(&busybox, &r.join("bin/busybox"));
    std::os::unix::fs::symlink("busybox", r.join("bin/sh")).unwrap();
    std::fs::write(r.join("token"), "static-token-0123456789").unwrap();

    // The version, straight and through the chroot's only shell.
    for argv in [
        vec!["/bin/sbxfs", "--version"],
        vec!["/bin/sh", "-c", "/bin/sbxfs --version"],
    ] {
        let out = Command::new("chroot").arg(r).args(&argv).output().unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("sbxfs "),
            "{argv:?}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let mut agent = Stop(
        Command::new("chroot")
            .arg(r)
            .args([
                "/bin/sbxfs",
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--root",
                "/ws",
            ])
            .args(["--token-file", "/token"])
            .env("SBXFS_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("chroot"),
    );
    let mut line = String::new();
    std::io::BufReader::new(agent.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no ready line from the chrooted agent: {line:?}"))
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = sbxfs::remote::client::AgentClient::new(&url, "static-token-0123456789").unwrap();
    use sbxfs::remote::Remote;
    let info = rt
        .block_on(client.info())
        .expect("/v1/info from the chrooted agent");
    assert_eq!(info.agent_version, env!("CARGO_PKG_VERSION"));
    // And it serves the empty workspace: a directory made through it lands in the chroot.
    let dir = sbxfs::remote::RemotePath::new(b"made-by-agent".to_vec()).unwrap();
    rt.block_on(client.mkdir(&dir, 0o755))
        .expect("mkdir through the chrooted agent");
    assert!(r.join("ws/made-by-agent").is_dir());
}
