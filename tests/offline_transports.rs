//! A sandbox that stops answering, on every transport that can be cut for real: what the mount
//! knows is served past its TTL (listings, attributes, cached pages), a new file and an edit are
//! staged locally, and both land once the sandbox answers again.
//!
//! The outages are real: `http://` and `https://` go through the project's TCP proxy, cut (bytes
//! dropped, connections held, as a dead network does); `exec:` runs a wrapper that answers as
//! ssh does when the host refuses (exit 255, "Connection refused" on stderr) while a flag file
//! exists; `ssh://` (deployed agent, and `?agent=no`) stops the real sshd and its sessions, and
//! starts it again on the same port. (`shell:` runs a local `sh`, which cannot become
//! unreachable; it shares the scripts and their error classification with `exec:`.)

use crate::common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::sshbox::SshBox;
use common::*;

/// Attributes and listings are trusted this long: the checks run past it.
const TTL_MS: &str = "300";

/// What the scenario needs of an outage: cut it, restore it.
trait Outage {
    fn cut(&mut self);
    fn restore(&mut self);
}

fn prepare(root: &Path) {
    fs::create_dir_all(root.join("dir")).unwrap();
    fs::write(root.join("dir/a.txt"), "alpha\n").unwrap();
    fs::write(root.join("dir/edit.txt"), "one\ntwo\n").unwrap();
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("ls {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `sh -c script` in `dir`: its stdout, or a panic with what it said and the mount's log.
fn sh(dir: &Path, script: &str, mount: &MountProcess) -> String {
    let (code, out, err) = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    let (out, err) = (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    );
    assert_eq!(
        code,
        0,
        "{script}\nstdout: {out}\nstderr: {err}\nlog: {}",
        mount.log_text()
    );
    out
}

fn wait_for(path: &Path, want: &[u8], what: &str, mount: &MountProcess) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if fs::read(path).ok().as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never reached the sandbox: {:?}; log: {}",
            fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()),
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// List, read, cut; then ls, cat, stat, create+write+close, edit; restore; the new file and the
/// edit land with the right bytes.
fn offline_scenario(root: &Path, mount: &MountProcess, outage: &mut dyn Outage) {
    let m = mount.dir.join("dir");
    assert_eq!(names(&m), ["a.txt", "edit.txt"]);
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "alpha\n");
    assert_eq!(
        fs::read_to_string(m.join("edit.txt")).unwrap(),
        "one\ntwo\n"
    );

    outage.cut();
    // Past the TTL: everything below would ask the sandbox if it could.
    std::thread::sleep(Duration::from_millis(800));
    let ctx = |what: &str| {
        format!(
            "{what} while the sandbox is away; log: {}",
            mount.log_text()
        )
    };
    let listed = fs::read_dir(&m)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("ls")))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert!(listed.contains(&"a.txt".to_string()), "{listed:?}");
    assert_eq!(
        fs::read_to_string(m.join("a.txt")).unwrap_or_else(|e| panic!("{}: {e}", ctx("cat"))),
        "alpha\n"
    );
    let st = fs::metadata(m.join("a.txt")).unwrap_or_else(|e| panic!("{}: {e}", ctx("stat")));
    assert_eq!(st.len(), 6);
    // The same through the tools a user types.
    let out = sh(
        &mount.dir,
        "ls && ls -l dir && ls dir && cat dir/a.txt && stat -c %s dir/a.txt && \
         echo typed > dir/typed.txt && cat dir/typed.txt",
        mount,
    );
    assert!(out.contains("dir\n"), "{out}");
    assert!(out.contains("alpha\n6\ntyped\n"), "{out}");
    // A new file: made here, written, closed (close may say EIO: the data stays staged).
    let mut f =
        fs::File::create(m.join("new.txt")).unwrap_or_else(|e| panic!("{}: {e}", ctx("create")));
    f.write_all(b"made while away\n")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("write")));
    drop(f);
    // An edit of a file read before: its cached page is the base.
    let mut e = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("edit.txt"))
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("open for writing")));
    e.write_all(b"ONE").unwrap();
    let mut back = String::new();
    e.seek(SeekFrom::Start(0)).unwrap();
    e.read_to_string(&mut back).unwrap();
    assert_eq!(back, "ONE\ntwo\n");
    drop(e);
    // The mount shows both; the sandbox has neither yet.
    assert_eq!(
        fs::read_to_string(m.join("new.txt")).unwrap(),
        "made while away\n"
    );
    assert_eq!(
        fs::read_to_string(m.join("edit.txt")).unwrap(),
        "ONE\ntwo\n"
    );
    let listed = names(&m);
    assert!(listed.contains(&"new.txt".to_string()), "{listed:?}");
    assert!(!root.join("dir/new.txt").exists());
    assert_eq!(
        fs::read_to_string(root.join("dir/edit.txt")).unwrap(),
        "one\ntwo\n"
    );

    // `ctl status` says so, and keeps saying so while it is away (no probe may pass for an
    // answer without reaching the sandbox).
    let reachable = || {
        let out = Command::new(env!("CARGO_BIN_EXE_sbxfs"))
            .args([
                "ctl",
                "--mount",
                mount.dir.to_str().unwrap(),
                "status",
                "--json",
            ])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("ctl status: {e}: {out:?}"));
        v["reachable"].as_bool().unwrap_or_else(|| panic!("{v}"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while reachable() {
        assert!(
            Instant::now() < deadline,
            "{}",
            ctx("status never said unreachable")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(200));
        assert!(!reachable(), "{}", ctx("status said reachable again"));
    }

    outage.restore();
    wait_for(
        &root.join("dir/new.txt"),
        b"made while away\n",
        "the new file",
        mount,
    );
    wait_for(
        &root.join("dir/typed.txt"),
        b"typed\n",
        "the file made by the shell",
        mount,
    );
    wait_for(&root.join("dir/edit.txt"), b"ONE\ntwo\n", "the edit", mount);
    let listed = names(&m);
    assert_eq!(listed, ["a.txt", "edit.txt", "new.txt", "typed.txt"]);
}

// ---- http and https: the project's proxy, cut ----

struct ProxyCut<'a>(&'a sbxfs::proxy::Proxy);

impl Outage for ProxyCut<'_> {
    fn cut(&mut self) {
        self.0.set_cut(true);
    }
    fn restore(&mut self) {
        self.0.set_cut(false);
    }
}

fn over_proxy(root: &Path, agent: &AgentProcess, scheme: &str, extra: &[&str]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt
        .block_on(sbxfs::proxy::Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            agent.addr,
            Duration::ZERO,
        ))
        .unwrap();
    let mut args = vec!["--attr-ttl-ms", TTL_MS, "-o", "timeout_ms=1500"];
    args.extend_from_slice(extra);
    let mount = MountProcess::start_url(&format!("{scheme}://{}", proxy.addr), &agent.token, &args);
    offline_scenario(root, &mount, &mut ProxyCut(&proxy));
    drop(mount);
    drop(proxy);
}

#[test]
fn http_serves_what_it_knows_while_the_link_is_cut() {
    let ws = tempfile::tempdir().unwrap();
    prepare(ws.path());
    let agent = AgentProcess::start(ws.path());
    over_proxy(ws.path(), &agent, "http", &[]);
}

#[test]
fn https_serves_what_it_knows_while_the_link_is_cut() {
    let Some(ca) = common::testca::TestCa::new() else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    prepare(ws.path());
    let server = ca.server("agent", &["IP:127.0.0.1"]);
    let (cert, key) = (
        server.cert.display().to_string(),
        server.key.display().to_string(),
    );
    let agent = AgentProcess::start_with_args(
        ws.path(),
        "offline-token-0123456789",
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    let ca_file = ca.ca.display().to_string();
    over_proxy(ws.path(), &agent, "https", &["--ca-file", &ca_file]);
}

// ---- exec: a wrapper that answers as ssh does when the host refuses ----

/// An exec command that fails while a flag file exists, as ssh does while its host is away.
/// Every session it started records its pid (the shell `exec`s into whatever the program
/// runs, the agent included), and a cut ends those still running, as a dropped link would.
struct FlagFile {
    flag: PathBuf,
    pids: PathBuf,
}

impl Outage for FlagFile {
    fn cut(&mut self) {
        fs::write(&self.flag, "").unwrap();
        for pid in fs::read_to_string(&self.pids).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: a signal to a session this test's wrapper started (gone ones: ESRCH;
                // pids are not reused within the test's few seconds).
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
    fn restore(&mut self) {
        fs::remove_file(&self.flag).unwrap();
    }
}

fn exec_serves_what_it_knows_while_its_command_cannot_connect(query: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    prepare(&root);
    let flag = dir.path().join("down");
    let pids = dir.path().join("pids");
    let wrapper = dir.path().join("fake-ssh.sh");
    fs::write(
        &wrapper,
        format!(
            "if [ -e '{}' ]; then\n  echo 'ssh: connect to host x port 22: Connection refused' >&2\n  \
             exit 255\nfi\necho $$ >> '{}'\nexec sh\n",
            flag.display(),
            pids.display()
        ),
    )
    .unwrap();
    let cmd = format!("sh {}", wrapper.display());
    let mount = MountProcess::start_url(
        &format!("exec:{}{query}", root.display()),
        "unused",
        &[
            "--exec",
            &cmd,
            "--attr-ttl-ms",
            TTL_MS,
            "-o",
            "timeout_ms=3000",
        ],
    );
    offline_scenario(&root, &mount, &mut FlagFile { flag, pids });
}

#[test]
fn exec_scripts_serve_what_they_know_while_the_command_cannot_connect() {
    exec_serves_what_it_knows_while_its_command_cannot_connect("?agent=no");
}

#[test]
fn exec_agent_serves_what_it_knows_while_its_session_is_cut() {
    exec_serves_what_it_knows_while_its_command_cannot_connect("");
}

// ---- ssh: the real sshd stopped (with its sessions) and started again on its port ----

fn ssh_ready() -> bool {
    if !is_root() || !Path::new("/usr/sbin/sshd").exists() {
        eprintln!("skipped: needs root and openssh-server (scripts/install-deps.sh)");
        return false;
    }
    require_tool("ssh").is_some()
}

/// The sshd of an [`SshBox`], stopped and started again by this test (the box's own is taken
/// over: this one is killed by pid on drop).
struct SshdOutage {
    config: PathBuf,
    pid: Option<i32>,
    child: Option<Child>,
    port: u16,
}

/// The pids of `pid`'s children (an sshd's per-connection processes).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so count from the last ')'.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

/// Send `sig` to `pid` and every process under it (children first).
fn signal_tree(pid: i32, sig: i32) {
    for c in children_of(pid) {
        signal_tree(c, sig);
    }
    // SAFETY: kill(2) of a process this test started (sshd) or one of its sessions.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn kill_tree(pid: i32) {
    signal_tree(pid, libc::SIGKILL);
}

/// A link that goes silent: sshd and its sessions stopped (SIGSTOP), so the ssh connection
/// stays open and nothing crosses it, as a dead network does; SIGCONT brings it back.
struct SshdFrozen {
    pid: i32,
    frozen: bool,
}

impl Outage for SshdFrozen {
    fn cut(&mut self) {
        signal_tree(self.pid, libc::SIGSTOP);
        self.frozen = true;
    }
    fn restore(&mut self) {
        signal_tree(self.pid, libc::SIGCONT);
        self.frozen = false;
    }
}

impl Drop for SshdFrozen {
    fn drop(&mut self) {
        if self.frozen {
            self.restore();
        }
    }
}

impl Outage for SshdOutage {
    fn cut(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill_tree(pid);
        }
        if let Some(mut c) = self.child.take() {
            kill_tree(c.id() as i32);
            let _ = c.wait();
        }
    }
    fn restore(&mut self) {
        let child = Command::new("/usr/sbin/sshd")
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&self.config)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sshd did not listen again on {}", self.port);
    }
}

impl Drop for SshdOutage {
    fn drop(&mut self) {
        self.cut();
    }
}

#[derive(Clone, Copy)]
enum SshCut {
    /// sshd and its sessions killed, then sshd started again on its port.
    Stopped,
    /// sshd and its sessions frozen (SIGSTOP), then resumed.
    Frozen,
}

fn over_ssh(suffix: &str, how: SshCut) {
    if !ssh_ready() {
        return;
    }
    let mut b = SshBox::start();
    prepare(&b.root);
    let sshd = b.sshd.take().unwrap();
    let port = sshd.port;
    let keys = b.dir.path().join("keys");
    let sshd_pid: i32 = fs::read_to_string(keys.join("sshd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let config = b.config.display().to_string();
    let mount = MountProcess::start_url(
        &b.url(suffix),
        "unused",
        &[
            "-F",
            &config,
            "--attr-ttl-ms",
            TTL_MS,
            "-o",
            "timeout_ms=2000",
        ],
    );
    match how {
        SshCut::Frozen => {
            let mut outage = SshdFrozen {
                pid: sshd_pid,
                frozen: false,
            };
            offline_scenario(&b.root, &mount, &mut outage);
            drop(outage);
            drop(mount);
            drop(sshd);
        }
        SshCut::Stopped => {
            // The box's sshd is this outage's now: killed by pid with its sessions, never
            // through the handle (whose pid is dead once the outage starts).
            std::mem::forget(sshd);
            let mut outage = SshdOutage {
                config: keys.join("sshd_config"),
                pid: Some(sshd_pid),
                child: None,
                port,
            };
            offline_scenario(&b.root, &mount, &mut outage);
            drop(mount);
            drop(outage);
        }
    }
}

#[test]
fn ssh_with_the_deployed_agent_serves_what_it_knows_while_the_link_is_silent() {
    over_ssh("", SshCut::Frozen);
}

#[test]
fn ssh_scripts_only_serve_what_they_know_while_the_link_is_silent() {
    over_ssh("?agent=no", SshCut::Frozen);
}

#[test]
fn ssh_scripts_only_serve_what_they_know_while_sshd_is_down() {
    over_ssh("?agent=no", SshCut::Stopped);
}

/// The master connection dies with sshd: the ssh remote makes a new master and forwarding
/// (src/remote/ssh/relink.rs) once sshd answers again.
#[test]
fn ssh_with_the_deployed_agent_serves_what_it_knows_while_sshd_is_down() {
    over_ssh("", SshCut::Stopped);
}

/// A sandbox that turns slow (a busy machine: every program now starts 4 s late) is slow, not
/// gone: a read with nothing cached to serve instead waits for its answer instead of failing
/// with EIO when the probe beside it is late too.
#[test]
fn a_sandbox_slowed_by_load_still_answers_reads_that_only_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("cold.txt"), "only the sandbox has this\n").unwrap();
    fs::write(root.join("warm.txt"), "cached\n").unwrap();
    let slow = dir.path().join("slow");
    let shell = format!(
        "sh -c 'if [ -e {} ]; then sleep 4; fi; exec sh'",
        slow.display()
    );
    let mount = MountProcess::start_url(
        &format!("exec:{}", root.display()),
        "unused",
        &["--exec", &shell, "--attr-ttl-ms", "600000"],
    );
    let m = &mount.dir;
    assert_eq!(fs::read_to_string(m.join("warm.txt")).unwrap(), "cached\n");
    assert_eq!(fs::metadata(m.join("cold.txt")).unwrap().len(), 26);
    fs::write(&slow, "").unwrap();
    let t = Instant::now();
    let read = fs::read_to_string(m.join("cold.txt"));
    let took = t.elapsed();
    // Opens ask the sandbox (no change feed here), which now takes its time.
    let warm = fs::read_to_string(m.join("warm.txt"));
    let _ = fs::remove_file(&slow);
    assert_eq!(
        read.map_err(|e| e.raw_os_error()),
        Ok("only the sandbox has this\n".to_string()),
        "after {took:?}: {}",
        mount.log_text()
    );
    assert_eq!(warm.unwrap(), "cached\n");
}
