//! The life of an `ssh://` mount against a real OpenSSH server on 127.0.0.1: it comes back by
//! itself after sshd is restarted or the agent in the sandbox is killed (errors meanwhile name
//! the user's URL), a workspace that does not exist is refused with exit 2 and leaves nothing
//! in the sandbox, and a SIGKILLed mount daemon leaves no ssh process behind.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sshbox::SshBox;
use common::*;

fn ready() -> bool {
    if !is_root() || !Path::new("/usr/sbin/sshd").exists() {
        eprintln!("skipped: needs root and openssh-server (scripts/install-deps.sh)");
        return false;
    }
    require_tool("ssh").is_some()
}

fn mount(b: &SshBox, suffix: &str) -> MountProcess {
    let config = b.config.display().to_string();
    MountProcess::start_url(&b.url(suffix), "unused", &["-F", &config])
}

/// Poll `f` until it answers `Some`, or fail after `limit` saying `what`.
fn within<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …: comm may hold spaces, so read after its closing parenthesis.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(1)?.parse().ok()
}

/// Whether `pid` runs (exists and is not a zombie waiting for its parent to reap it).
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rfind(')').is_some_and(|i| !s[i..].starts_with(") Z")))
}

fn exe_of(pid: i32) -> PathBuf {
    fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default()
}

/// The running ssh client processes whose command line holds `needle` (the ssh config path
/// names one mount's ssh).
fn processes_naming(needle: &Path) -> Vec<i32> {
    let n = needle.as_os_str().as_encoded_bytes();
    pids()
        .into_iter()
        .filter(|&p| running(p) && exe_of(p).file_name().is_some_and(|f| f == "ssh"))
        .filter(|p| {
            fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.windows(n.len()).any(|w| w == n))
        })
        .collect()
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid this test found; no memory involved.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The box's sshd: its listener (from its pid file) and every sshd process under it (the
/// sessions, which outlive the listener otherwise).
fn sshd_tree(b: &SshBox) -> Vec<i32> {
    let listener: i32 = fs::read_to_string(b.dir.path().join("keys/sshd.pid"))
        .expect("sshd's pid file")
        .trim()
        .parse()
        .unwrap();
    let mut tree = vec![listener];
    let all = pids();
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        for &c in &all {
            if parent_of(c) == Some(p) && exe_of(c).to_string_lossy().contains("sshd") {
                tree.push(c);
            }
        }
        i += 1;
    }
    tree
}

/// sshd started again on the box's port with its config (same keys), stopped with its
/// sessions on drop.
struct Restarted {
    child: std::process::Child,
    pid_file: PathBuf,
}

impl Drop for Restarted {
    fn drop(&mut self) {
        if let Ok(s) = fs::read_to_string(&self.pid_file) {
            let me: i32 = s.trim().parse().unwrap_or(0);
            if me == self.child.id() as i32 {
                for &c in &pids() {
                    if parent_of(c) == Some(me) && exe_of(c).to_string_lossy().contains("sshd") {
                        kill(c, libc::SIGKILL);
                    }
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stop the box's sshd and every session it serves: the mount's master loses its connection.
fn stop_sshd(b: &mut SshBox) {
    let tree = sshd_tree(b);
    for &p in tree.iter().rev() {
        kill(p, libc::SIGKILL);
    }
    b.sshd.take();
}

fn start_sshd_again(b: &SshBox, port: u16) -> Restarted {
    let keys = b.dir.path().join("keys");
    let child = Command::new("/usr/sbin/sshd")
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(keys.join("sshd_config"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let r = Restarted {
        child,
        pid_file: keys.join("sshd.pid"),
    };
    within(Duration::from_secs(10), "sshd listens again", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    r
}

fn port_of(b: &SshBox) -> u16 {
    let cfg = fs::read_to_string(&b.config).unwrap();
    cfg.lines()
        .find_map(|l| l.trim().strip_prefix("Port "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn an_ssh_agent_mount_recovers_after_sshd_is_restarted() {
    if !ready() {
        return;
    }
    let mut b = SshBox::start();
    let port = port_of(&b);
    fs::write(b.root.join("known.txt"), "known before\n").unwrap();
    let m = mount(&b, "");
    assert_eq!(
        fs::read_to_string(m.dir.join("known.txt")).unwrap(),
        "known before\n"
    );
    let agent = b.agent_pid();
    let masters = processes_naming(&b.config);
    assert!(!masters.is_empty(), "the mount's ssh master runs");

    stop_sshd(&mut b);
    // The master goes with its connection.
    within(Duration::from_secs(20), "the master exits", || {
        masters.iter().all(|&p| !running(p)).then_some(())
    });
    // While down: what the mount knows stays readable, a new file is staged, not lost.
    assert_eq!(
        fs::read_to_string(m.dir.join("known.txt")).unwrap(),
        "known before\n",
        "a cached file is readable while the sandbox is unreachable"
    );
    let wrote = fs::write(m.dir.join("while-down.txt"), "written while down\n");
    let listing = fs::read_dir(&m.dir).map(|d| d.count());

    let _sshd = start_sshd_again(&b, port);
    // Back: a file made in the sandbox meanwhile is seen, and what was written while down lands.
    fs::write(b.root.join("after.txt"), "made after\n").unwrap();
    within(Duration::from_secs(60), "the mount reads again", || {
        fs::read_to_string(m.dir.join("after.txt")).ok()
    });
    wrote.expect("a write while down is staged");
    within(Duration::from_secs(60), "the staged write lands", || {
        fs::read_to_string(b.root.join("while-down.txt"))
            .ok()
            .filter(|s| s == "written while down\n")
    });
    let _ = listing;
    assert_eq!(b.agent_pid(), agent, "the running agent is used again");
    // An ssh master is running again.
    assert!(!processes_naming(&b.config).is_empty());
    let log = m.log_text();
    assert!(!log.contains("sbxfs-agent:80"), "{log}");
}

#[test]
fn an_ssh_agent_mount_starts_the_agent_again_when_it_is_killed() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    fs::write(b.root.join("a.txt"), "a\n").unwrap();
    let m = mount(&b, "");
    assert_eq!(fs::read_to_string(m.dir.join("a.txt")).unwrap(), "a\n");
    let agent = b.agent_pid();
    let token_file = b.agent_pid_files()[0].with_file_name("token");
    let token = fs::read_to_string(&token_file).unwrap();
    kill(agent, libc::SIGKILL);
    within(Duration::from_secs(10), "the agent is gone", || {
        (!running(agent)).then_some(())
    });
    fs::write(b.root.join("b.txt"), "b\n").unwrap();
    let got = within(Duration::from_secs(60), "the mount reads again", || {
        fs::read_to_string(m.dir.join("b.txt")).ok()
    });
    assert_eq!(got, "b\n");
    fs::write(m.dir.join("c.txt"), "c\n").unwrap();
    within(Duration::from_secs(30), "a write lands", || {
        fs::read_to_string(b.root.join("c.txt"))
            .ok()
            .filter(|s| s == "c\n")
    });
    assert_ne!(b.agent_pid(), agent, "a new agent serves");
    assert_ne!(
        fs::read_to_string(&token_file).unwrap(),
        token,
        "with a fresh token"
    );
    let log = m.log_text();
    assert!(!log.contains("sbxfs-agent:80"), "{log}");
}

/// `sbxfs mount URL MNT ARGS…` expected to fail: its exit code and stderr.
fn mount_fails(url: &str, args: &[&str]) -> (i32, String) {
    let mnt = tempfile::tempdir().unwrap();
    let mut child = Command::new(sbxfs_bin())
        .arg("mount")
        .arg(url)
        .arg(mnt.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let code = child.wait().unwrap().code().unwrap_or(-1);
    let _ = Command::new("fusermount3")
        .arg("-uz")
        .arg(mnt.path())
        .stderr(Stdio::null())
        .status();
    (code, err)
}

#[test]
fn a_missing_workspace_over_ssh_exits_2_naming_it_and_leaves_nothing() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    let config = b.config.display().to_string();
    for suffix in ["", "?agent=no"] {
        let url = format!("ssh://sbx/no/such/dir{suffix}");
        let (code, err) = mount_fails(&url, &["-F", &config]);
        assert_eq!(code, 2, "{url}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{url}: one line: {err}");
        assert!(lines[0].contains("/no/such/dir"), "{url}: {err}");
        assert!(!err.contains("no agent"), "{url}: {err}");
        assert!(
            !b.home.join(".cache/sbxfs").exists(),
            "{url}: nothing made in the sandbox"
        );
    }
    // No ssh of these attempts is left.
    within(Duration::from_secs(5), "no ssh left", || {
        processes_naming(&b.config).is_empty().then_some(())
    });
}

#[test]
fn a_missing_workspace_over_shell_and_exec_exits_2() {
    for (url, args) in [
        ("shell:/nonexistent/sbxfs-ws", &[][..]),
        ("exec:/nonexistent/sbxfs-ws", &["--exec", "sh"][..]),
    ] {
        let (code, err) = mount_fails(url, args);
        assert_eq!(code, 2, "{url}: {err}");
        assert!(err.contains("/nonexistent/sbxfs-ws"), "{url}: {err}");
    }
}

#[test]
fn a_sigkilled_mount_daemon_leaves_no_ssh_behind() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    fs::write(b.root.join("a.txt"), "a\n").unwrap();
    // The private directory of the daemon killed last: the next mount removes it.
    let mut left_by_killed: Option<std::path::PathBuf> = None;
    for suffix in ["", "?agent=no", ""] {
        let mut m = mount(&b, suffix);
        assert_eq!(fs::read_to_string(m.dir.join("a.txt")).unwrap(), "a\n");
        assert!(
            !processes_naming(&b.config).is_empty(),
            "{suffix}: the mount's ssh master runs"
        );
        if let Some(dir) = left_by_killed.take() {
            assert!(!dir.exists(), "{} is left", dir.display());
        }
        let pid = m.child.as_ref().unwrap().id().to_string();
        let own: Vec<_> = fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("sbxfs-ssh-"))
                    && fs::read_to_string(p.join("owner.pid")).is_ok_and(|o| o.trim() == pid)
            })
            .collect();
        assert_eq!(
            own.len(),
            1,
            "{suffix}: one private dir names the daemon: {own:?}"
        );
        left_by_killed = own.into_iter().next();
        let mut daemon = m.child.take().unwrap();
        daemon.kill().unwrap();
        daemon.wait().unwrap();
        within(
            Duration::from_secs(5),
            "no ssh of the killed mount is left",
            || processes_naming(&b.config).is_empty().then_some(()),
        );
        let st = Command::new("fusermount3")
            .arg("-uz")
            .arg(&m.dir)
            .status()
            .unwrap();
        assert!(st.success(), "{suffix}: the dead mount is unmounted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_sandbox_is_away_calls_fail_fast_naming_the_ssh_url_then_work_again() {
    use sbxfs::remote::{RemoteError, RemotePath};
    if !ready() {
        return;
    }
    let mut b = SshBox::start();
    let port = port_of(&b);
    fs::write(b.root.join("a.txt"), "a\n").unwrap();
    let url = b.url("");
    let c = tokio::time::timeout(
        Duration::from_secs(120),
        sbxfs::remote::connect::connect(&url, &b.options()),
    )
    .await
    .expect("connect hung")
    .unwrap();
    let a = RemotePath::new(b"a.txt".to_vec()).unwrap();
    c.remote.stat(&a).await.unwrap();
    // The sandbox "reboots": sshd and the agent both gone.
    let agent = b.agent_pid();
    stop_sshd(&mut b);
    kill(agent, libc::SIGKILL);
    within(Duration::from_secs(10), "the agent is gone", || {
        (!running(agent)).then_some(())
    });
    let started = Instant::now();
    let e = c.remote.stat(&a).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "fails fast: {:?}",
        started.elapsed()
    );
    assert!(matches!(e, RemoteError::Transport(_)), "{e:?}");
    let text = e.to_string();
    assert!(!text.contains("sbxfs-agent"), "{text}");
    assert!(text.contains(&url), "{text}");
    let _sshd = start_sshd_again(&b, port);
    // Back by itself, with a new agent.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match c.remote.stat(&a).await {
            Ok(attr) => {
                assert_eq!(attr.size, 2);
                break;
            }
            Err(e) => {
                assert!(Instant::now() < until, "not back: {e}");
                assert!(!e.to_string().contains("sbxfs-agent"), "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_ne!(b.agent_pid(), agent);
}

#[test]
fn an_sshd_that_refuses_forwarding_still_gets_the_agent_over_a_session() {
    if !ready() {
        return;
    }
    let b = SshBox::start_with("AllowTcpForwarding no\nAllowStreamLocalForwarding no\n");
    fs::write(b.root.join("known.txt"), "known before\n").unwrap();
    let m = mount(&b, "");
    assert_eq!(
        fs::read_to_string(m.dir.join("known.txt")).unwrap(),
        "known before\n"
    );
    let (code, out, err) = run(Command::new(sbxfs_bin()).args([
        "ctl",
        "--mount",
        m.dir.to_str().unwrap(),
        "status",
        "--json",
    ]));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status["mount"]["transport"], "ssh+stdio", "{status}");
    // Writes land, and the change feed reports a change made in the sandbox.
    fs::write(m.dir.join("made.txt"), "through the mount\n").unwrap();
    within(Duration::from_secs(30), "the write lands", || {
        fs::read_to_string(b.root.join("made.txt"))
            .ok()
            .filter(|s| s == "through the mount\n")
    });
    assert_eq!(status["feed"]["state"], "connected", "{status}");
    let log = m.log_text();
    assert!(log.contains("refuse"), "the log says why: {log}");
    // The socket agent started first, which no forwarding could reach, was stopped (it would
    // otherwise wait 30 minutes for a client).
    within(
        Duration::from_secs(10),
        "the unreachable agent stops",
        || {
            let running: Vec<_> = b
                .agent_pid_files()
                .iter()
                .filter_map(|f| fs::read_to_string(f).ok())
                .filter(|pid| std::path::Path::new(&format!("/proc/{}", pid.trim())).exists())
                .collect();
            running.is_empty().then_some(())
        },
    );
}

#[test]
fn deploying_a_dynamically_linked_build_says_so_and_names_the_static_one() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    fs::write(b.root.join("a.txt"), "a\n").unwrap();
    let m = mount(&b, "");
    assert_eq!(fs::read_to_string(m.dir.join("a.txt")).unwrap(), "a\n");
    // The test build is dynamically linked, as a `cargo build` is.
    let log = m.log_text();
    assert!(
        log.contains("deploying a dynamically linked sbxfs")
            && log.contains("+crt-static")
            && log.contains("-o deploy_binary=PATH"),
        "{log}"
    );
}

#[test]
fn umount_stop_agent_pushes_then_stops_the_agent_the_mount_started() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    let m = mount(&b, "");
    fs::write(m.dir.join("last.txt"), "pushed before the agent stops\n").unwrap();
    let agent = b.agent_pid();
    assert!(Path::new(&format!("/proc/{agent}")).exists());
    let (code, _, err) = run(Command::new(sbxfs_bin())
        .args(["umount", "--stop-agent"])
        .arg(&m.dir)
        .env("SBXFS_LOG", "warn"));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("stops once the last push is done"), "{err}");
    assert_eq!(
        fs::read_to_string(b.root.join("last.txt")).unwrap(),
        "pushed before the agent stops\n"
    );
    within(Duration::from_secs(20), "the agent exits", || {
        (!Path::new(&format!("/proc/{agent}")).exists()).then_some(())
    });
    // None is started again, and its pid file is gone.
    std::thread::sleep(Duration::from_secs(2));
    assert!(b.agent_pid_files().is_empty(), "{:?}", b.agent_pid_files());
}
