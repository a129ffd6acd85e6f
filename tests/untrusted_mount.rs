//! The sandbox is untrusted, seen from the mount: its symlinks never lead to a local file, a
//! broken or hostile agent cannot take the daemon down or make it hold unbounded memory, the
//! control socket outlives running out of descriptors and slow clients, and private state
//! pre-created by another local user is never used. Real agents, real mounts; every process is
//! stopped by pid and every mount unmounted in a guard.

use crate::common;

use std::fs;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn sh(dir: &Path, script: &str) -> (i32, String, String) {
    let (code, out, err) = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

fn ctl(mount: &Path, args: &[&str]) -> (i32, Vec<u8>, String) {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .arg("ctl")
        .arg("--mount")
        .arg(mount)
        .args(args));
    (code, out, String::from_utf8_lossy(&err).into_owned())
}

struct Sandbox {
    dir: tempfile::TempDir,
    root: std::path::PathBuf,
    _agent: AgentProcess,
    mount: MountProcess,
}

fn sandbox() -> Sandbox {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    // These tests look in the sandbox right after a write returns: `close` waits for its push.
    let mount = MountProcess::start(&agent, &["-o", "sync_close"]);
    Sandbox {
        dir,
        root,
        _agent: agent,
        mount,
    }
}

#[test]
fn a_symlink_out_of_the_workspace_never_reaches_a_local_file() {
    let s = sandbox();
    let m = &s.mount.dir;
    // A local file of the developer's, outside the workspace.
    let secret = s.dir.path().join("secret");
    fs::write(&secret, "mine\n").unwrap();
    fs::create_dir_all(s.root.join("a/b")).unwrap();
    // In the sandbox: an absolute link to it, and a relative one climbing out to it.
    std::os::unix::fs::symlink(&secret, s.root.join("evil")).unwrap();
    std::os::unix::fs::symlink("../../../secret", s.root.join("a/b/up")).unwrap();
    for link in ["evil", "a/b/up"] {
        let p = m.join(link);
        assert!(fs::read(&p).is_err(), "{link}: read through the link");
        let (code, _, _) = sh(m, &format!("echo x > {link}"));
        assert_ne!(code, 0, "{link}: a write through the link succeeded");
        let (code, _, _) = sh(m, &format!("echo x >> {link}"));
        assert_ne!(code, 0, "{link}: an append through the link succeeded");
        let shown = fs::read_link(&p).unwrap();
        assert!(
            shown.starts_with("/dev/null/sbxfs-outside"),
            "{link} shows {}",
            shown.display()
        );
        // stat's size of a link is the length readlink returns.
        let len = fs::symlink_metadata(&p).unwrap().len();
        assert_eq!(len, shown.as_os_str().len() as u64, "{link}");
    }
    assert_eq!(fs::read_to_string(&secret).unwrap(), "mine\n");
    // The sandbox's own targets, honestly, through the control surface.
    let (code, out, err) = ctl(m, &["readlink", "evil"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("{}\n", secret.display()).into_bytes());
    let (code, out, err) = ctl(m, &["readlink", "a/b/up"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, b"../../../secret\n");
    // And through the QUERY ioctl on the link's directory.
    let v = sbxfs::control::client::ioctl_query(
        &m.join("a/b"),
        &sbxfs::control::Request::Readlink {
            path: sbxfs::remote::WireBytes(b"up".to_vec()),
        },
    )
    .unwrap();
    assert_eq!(v["target"], "../../../secret", "{v}");
    assert_eq!(v["shown"], "/dev/null/sbxfs-outside/../../../secret", "{v}");
    // The sandbox's link is untouched too.
    assert_eq!(fs::read_link(s.root.join("evil")).unwrap(), secret);
}

/// A hostile shell (`exec:` whose output is rewritten) answers the link target `..X` as
/// `..\0`: the kernel would read that as `..`, the mountpoint's parent on the laptop.
#[test]
fn a_symlink_target_with_a_nul_never_reaches_a_local_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink("..X", root.join("evil")).unwrap();
    // base64 of "..X" is "Li5Y"; of "..\0", "Li4A".
    let mount = MountProcess::start_url(
        &format!("exec:{}", root.display()),
        "unused",
        &["--exec", "sh -c 'sh | sed -u s/Li5Y/Li4A/g'"],
    );
    let m = &mount.dir;
    // The mountpoint's parent holds the daemon's token file and log: a laptop directory.
    let laptop = m.parent().unwrap();
    assert!(laptop.join("token").exists());
    let shown = fs::read_link(m.join("evil")).unwrap();
    assert!(
        shown.starts_with("/dev/null/sbxfs-outside"),
        "evil shows {}",
        shown.display()
    );
    assert!(!shown.as_os_str().as_encoded_bytes().contains(&0));
    assert!(
        fs::read_dir(m.join("evil")).is_err(),
        "listed a laptop directory"
    );
    assert!(
        fs::read(m.join("evil/token")).is_err(),
        "read a laptop file"
    );
    let (code, _, _) = sh(m, "echo x > evil/pwned");
    assert_ne!(code, 0, "wrote through the link");
    assert!(!laptop.join("pwned").exists());
}

/// Removes a laptop file the test made outside its temp dir, even when the test fails.
struct RemoveAfter(std::path::PathBuf);

impl Drop for RemoveAfter {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn a_hard_linked_symlink_shows_a_target_safe_from_every_name() {
    let s = sandbox();
    let (m, r) = (&s.mount.dir, &s.root);
    // A laptop file where the deep link's target lands when followed from the mount's top.
    let victim_name = format!("sbxfs-victim-{}", std::process::id());
    let victim = Path::new("/tmp").join(&victim_name);
    let _cleanup = RemoveAfter(victim.clone());
    fs::write(&victim, "laptop secret\n").unwrap();
    let deep = "d1/d2/d3/d4/d5/d6/d7/d8";
    fs::create_dir_all(r.join(deep)).unwrap();
    // From depth 8, eight `..` land on the workspace root: inside, shown as is.
    let target = format!("../../../../../../../../tmp/{victim_name}");
    std::os::unix::fs::symlink(&target, r.join(deep).join("link")).unwrap();
    // The user lists the tree: the mount learns the link at depth 8.
    let (code, _, err) = sh(m, "ls -laR > /dev/null");
    assert_eq!(code, 0, "{err}");
    let at_depth = m.join(deep).join("link");
    assert_eq!(fs::read_link(&at_depth).unwrap(), Path::new(&target));
    // The sandbox gives the symlink itself a second name at the top (same inode, nlink 2).
    let (code, _, err) = sh(r, &format!("ln -P {deep}/link top"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::symlink_metadata(r.join("top")).unwrap().nlink(), 2);
    let top = m.join("top");
    eventually(
        "the new name shows in the mount",
        Duration::from_secs(15),
        || fs::symlink_metadata(&top).is_ok(),
    );
    let shown = fs::read_link(&top).unwrap();
    assert!(
        shown.starts_with("/dev/null/sbxfs-outside"),
        "top shows {}",
        shown.display()
    );
    assert!(fs::read(&top).is_err(), "read through top");
    let (code, _, _) = sh(m, "echo x > top");
    assert_ne!(code, 0, "a write through top succeeded");
    // The control surface says what the mount shows, beside the sandbox's own target.
    let v = sbxfs::control::client::ioctl_query(
        m,
        &sbxfs::control::Request::Readlink {
            path: sbxfs::remote::WireBytes(b"top".to_vec()),
        },
    )
    .unwrap();
    assert_eq!(v["target"], target.as_str(), "{v}");
    assert!(
        v["shown"]
            .as_str()
            .unwrap()
            .starts_with("/dev/null/sbxfs-outside"),
        "{v}"
    );
    // The name at depth 8 still shows its target as is: it is judged from its own place.
    assert_eq!(fs::read_link(&at_depth).unwrap(), Path::new(&target));

    // A hard link of the symlink made through the mount: one file, two places, and the
    // target shown is safe from both.
    let (code, _, err) = sh(m, &format!("ln -P {deep}/link top2"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::symlink_metadata(r.join("top2")).unwrap().nlink(), 3);
    assert!(fs::read_link(m.join("top2"))
        .unwrap()
        .starts_with("/dev/null/sbxfs-outside"));
    assert!(fs::read(m.join("top2")).is_err(), "read through top2");
    let (code, _, _) = sh(m, "echo x >> top2");
    assert_ne!(code, 0, "an append through top2 succeeded");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "laptop secret\n");
    // Both names of that file now show the outside form, and the control surface says so.
    let deep_shown = fs::read_link(&at_depth).unwrap();
    assert!(
        deep_shown.starts_with("/dev/null/sbxfs-outside"),
        "{deep_shown:?}"
    );
    let v = sbxfs::control::client::ioctl_query(
        &m.join(deep),
        &sbxfs::control::Request::Readlink {
            path: sbxfs::remote::WireBytes(b"link".to_vec()),
        },
    )
    .unwrap();
    assert_eq!(
        v["shown"].as_str(),
        deep_shown.to_str(),
        "ctl's shown target is the mount's: {v}"
    );
    // The sandbox's links are untouched.
    assert_eq!(fs::read_link(r.join("top2")).unwrap(), Path::new(&target));
}

#[test]
fn an_absolute_symlink_inside_the_workspace_is_followed_inside_the_mount() {
    let s = sandbox();
    let m = &s.mount.dir;
    fs::create_dir_all(s.root.join("src/deep")).unwrap();
    fs::write(s.root.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let root = fs::canonicalize(&s.root).unwrap();
    std::os::unix::fs::symlink(root.join("src/lib.rs"), s.root.join("src/deep/lib")).unwrap();
    std::os::unix::fs::symlink(root.join("src"), s.root.join("top")).unwrap();
    assert_eq!(
        fs::read_link(m.join("src/deep/lib")).unwrap(),
        Path::new("../../src/lib.rs")
    );
    assert_eq!(
        fs::read_to_string(m.join("src/deep/lib")).unwrap(),
        "pub fn f() {}\n"
    );
    assert_eq!(fs::read_link(m.join("top")).unwrap(), Path::new("src"));
    assert!(m.join("top/deep").is_dir());
    // A write through the link lands in the sandbox's file.
    fs::write(m.join("src/deep/lib"), "pub fn g() {}\n").unwrap();
    assert_eq!(
        fs::read_to_string(s.root.join("src/lib.rs")).unwrap(),
        "pub fn g() {}\n"
    );
    let (code, out, err) = ctl(m, &["readlink", "src/deep/lib"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("{}\n", root.join("src/lib.rs").display()).into_bytes()
    );
}

#[test]
fn a_symlink_made_through_the_mount_reads_back_as_written_until_the_sandbox_changes_it() {
    let s = sandbox();
    let m = &s.mount.dir;
    let outside = |t: &str| Path::new("/dev/null/sbxfs-outside").join(t.trim_start_matches('/'));
    fs::create_dir(m.join("bin")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", m.join("bin/host")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", m.join("bin/moved")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", m.join("bin/linked")).unwrap();
    // The sandbox has what was asked for, and so does the laptop, as on a local disk (venv's
    // `bin/python3 → /usr/bin/python3` is run at once).
    assert_eq!(
        fs::read_link(s.root.join("bin/host")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert_eq!(
        fs::read_link(m.join("bin/host")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert_eq!(
        fs::read(m.join("bin/host")).unwrap(),
        fs::read("/etc/hostname").unwrap()
    );
    // Remembered across a remount (the mount's durable state).
    let cache = s.dir.path().join("cache");
    let second = MountProcess::start_url_cache(&s._agent.url, &s._agent.token, &[], Some(&cache));
    std::os::unix::fs::symlink("/etc/hostname", second.dir.join("bin/durable")).unwrap();
    drop(second);
    let third = MountProcess::start_url_cache(&s._agent.url, &s._agent.token, &[], Some(&cache));
    assert_eq!(
        fs::read_link(third.dir.join("bin/durable")).unwrap(),
        Path::new("/etc/hostname"),
        "remembered by a later mount"
    );
    assert_eq!(
        fs::read_link(third.dir.join("bin/host")).unwrap(),
        outside("/etc/hostname"),
        "made by another mount's state: judged"
    );
    drop(third);
    // The sandbox changes one, moves one and hard-links one: each is judged again.
    fs::remove_file(s.root.join("bin/host")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", s.root.join("bin/host")).unwrap();
    fs::rename(s.root.join("bin/moved"), s.root.join("bin/elsewhere")).unwrap();
    fs::hard_link(s.root.join("bin/linked"), s.root.join("linked-too")).unwrap();
    eventually("the changed link judged", Duration::from_secs(15), || {
        fs::read_link(m.join("bin/host")).is_ok_and(|t| t == outside("/etc/passwd"))
    });
    eventually("the moved link judged", Duration::from_secs(15), || {
        fs::read_link(m.join("bin/elsewhere")).is_ok_and(|t| t == outside("/etc/hostname"))
    });
    // A symlink's names are never one node: the new name is judged, the one made here is
    // still exactly what was written there.
    eventually(
        "the hard link's new name judged",
        Duration::from_secs(15),
        || fs::read_link(m.join("linked-too")).is_ok_and(|t| t == outside("/etc/hostname")),
    );
    assert_eq!(
        fs::read_link(m.join("bin/linked")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert!(fs::read(m.join("bin/host")).is_err());
}

/// The hostile agent (tests/hostile/agent.py), killed by pid on drop.
struct HostileAgent {
    child: std::process::Child,
    url: String,
}

impl HostileAgent {
    fn start() -> Option<HostileAgent> {
        Self::start_with(&[])
    }

    fn start_with(env: &[(&str, &str)]) -> Option<HostileAgent> {
        let python = require_tool("python3")?;
        let mut child = Command::new(python)
            .arg(repo_root().join("tests/hostile/agent.py"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().expect("the hostile agent's port");
        Some(HostileAgent {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }
}

impl Drop for HostileAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What an agent says about itself reaches the terminal escaped: a mount refused for its
/// protocol quotes the agent's version, which here is a terminal escape.
#[test]
fn an_agents_words_reach_the_terminal_escaped() {
    let Some(agent) =
        HostileAgent::start_with(&[("HOSTILE_VERSION", "\u{1b}]0;PWNED\u{7}\u{1b}[2J")])
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mnt, token) = (dir.path().join("mnt"), dir.path().join("token"));
    fs::create_dir(&mnt).unwrap();
    fs::write(&token, "unused").unwrap();
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .arg("mount")
        .arg(&agent.url)
        .arg(&mnt)
        .arg("--token-file")
        .arg(&token)
        .arg("--foreground"));
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
    let text = String::from_utf8_lossy(&err);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("PWNED"), "{text}");
    assert!(!err.contains(&0x1b) && !out.contains(&0x1b), "{text}");
    assert!(!err.contains(&0x07), "{text}");
}

/// The daemon's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM")
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or_default()
}

#[test]
fn a_hostile_agent_gets_errors_and_cannot_take_the_mount_down() {
    let Some(agent) = HostileAgent::start() else {
        return;
    };
    let mut mount = MountProcess::start_url(&agent.url, "token", &[]);
    let m = mount.dir.clone();
    let pid = mount.child.as_ref().unwrap().id();
    let alive = |what: &str| {
        // The mountpoint still answers (never "Transport endpoint is not connected").
        let md = fs::metadata(&m).unwrap_or_else(|e| panic!("after {what}: {e}"));
        assert!(md.is_dir(), "after {what}");
    };
    alive("mounting");

    // 1.5 GB answering a 128 KiB read: refused, not buffered.
    let e = fs::read(m.join("endless")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    alive("an endless read answer");

    // A size of 2^63 - 1: shown, read as far as the agent answers, never staged for writing.
    let md = fs::metadata(m.join("huge_size")).unwrap();
    assert_eq!(md.len(), (1u64 << 63) - 1);
    let mut head = [0u8; 6];
    fs::File::open(m.join("huge_size"))
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(&head, b"hello\n");
    let e = fs::OpenOptions::new()
        .write(true)
        .open(m.join("huge_size"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EFBIG, "{e}");
    alive("a size of 2^63 - 1");

    // Two million entries in one listing: more than any listing may have.
    let e = fs::read_dir(m.join("many"))
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    alive("a listing of two million entries");

    // Names no directory can hold.
    for dir in ["slash", "dotdot"] {
        let e = fs::read_dir(m.join(dir))
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .unwrap_err();
        assert_eq!(errno_of(&e), libc::EIO, "{dir}: {e}");
        alive(dir);
    }
    // Reads that never match the file's stat: followed a few times, then taken as they come
    // (as a file rewritten faster than a round trip is), never a read that spins. (The
    // deadline only stops a hung test.)
    let (tx, rx) = std::sync::mpsc::channel();
    let flapping = m.join("flapping");
    std::thread::spawn(move || tx.send(fs::read(flapping)));
    let read = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("a read of a flapping file hung")
        .expect("a read of a flapping file");
    assert_eq!(read, b"hello\n");
    alive("reads that never match the stat");

    // A redirect is not followed anywhere.
    let e = fs::read(m.join("redirected")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    alive("a redirect");

    // The honest parts still work.
    assert_eq!(fs::read_to_string(m.join("fine.txt")).unwrap(), "hello\n");
    let names: Vec<_> = fs::read_dir(&m)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"fine.txt".to_string()), "{names:?}");

    let peak = peak_rss_kib(pid);
    eprintln!("daemon peak RSS: {peak} KiB");
    // A million parsed entries (the listing cap) is the largest thing held; nothing near the
    // 1.5 GB or 2^63 the agent offered.
    assert!(peak < 700 * 1024, "peak RSS {peak} KiB");
    assert!(
        mount.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon exited; log: {}",
        mount.log_text()
    );
    assert!(
        !mount.log_text().contains("panicked"),
        "{}",
        mount.log_text()
    );
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

#[test]
fn the_control_socket_serves_again_after_descriptors_ran_out() {
    let Some(prlimit) = require_tool("prlimit") else {
        return;
    };
    let s = sandbox();
    let m = &s.mount.dir;
    let pid = s.mount.child.as_ref().unwrap().id();
    let (code, out, err) = ctl(m, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let socket = status["mount"]["socket"].as_str().unwrap().to_string();
    // A few descriptors to spare, then many clients holding connections open.
    let limit = open_fds(pid) + 8;
    let (code, _, err) = run(Command::new(prlimit)
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}")));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let held: Vec<std::os::unix::net::UnixStream> = (0..64)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    // The daemon ran out: it says so in its log (and keeps trying).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s.mount.log_text().contains("accept failed") {
        assert!(Instant::now() < deadline, "{}", s.mount.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    let (code, out, err) = ctl(m, &["status", "--json"]);
    assert_eq!(code, 0, "status after running out of descriptors: {err}");
    let again: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(again["mount"]["socket"], status["mount"]["socket"]);
    assert!(fs::metadata(m).unwrap().is_dir());
}

#[test]
fn a_control_client_that_never_finishes_its_line_is_dropped_while_others_are_served() {
    let s = sandbox();
    let m = &s.mount.dir;
    let (code, out, err) = ctl(m, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let socket = status["mount"]["socket"].as_str().unwrap();
    let mut slow = std::os::unix::net::UnixStream::connect(socket).unwrap();
    slow.write_all(br#"{"v":1,"op":"sta"#).unwrap();
    // Others are served meanwhile.
    for _ in 0..3 {
        let (code, _, err) = ctl(m, &["stats"]);
        assert_eq!(code, 0, "{err}");
    }
    // The slow one is told why and dropped (the deadline only stops a hung test).
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("no complete request line"), "{answer:?}");
}

/// Another local user pre-creates a place where the daemon keeps private state (the control
/// socket's directory under `$XDG_RUNTIME_DIR` or `$TMPDIR`, the cache with staging), as a
/// directory open to all or as a symlink to a directory of theirs: a mount started as root
/// never writes through the link nor into their directory; it takes a fresh private
/// directory for its socket instead, and refuses a cache it cannot trust with one clear error
/// (staged edits must be found again by the next mount, so they never move elsewhere).
#[test]
fn private_state_pre_created_by_another_user_is_never_used() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let agent_dir = tempfile::tempdir().unwrap();
    let ws = agent_dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let agent = AgentProcess::start(&ws);
    // (the spot the attacker takes, whether XDG_RUNTIME_DIR is set)
    let spots = [
        ("run/sbxfs", true),
        ("tmp/sbxfs-0", false),
        ("cache/sbxfs", true),
        ("cache/sbxfs/staging", true),
    ];
    for (spot, runtime_dir) in spots {
        for planted in [true, false] {
            attack_private_state(&setpriv, &agent, spot, runtime_dir, planted);
        }
    }
}

fn attack_private_state(
    setpriv: &Path,
    agent: &AgentProcess,
    spot: &str,
    runtime_dir: bool,
    planted: bool,
) {
    let what = format!("{spot} (planted link: {planted})");
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // World-writable bases, as /tmp is.
    for b in ["tmp", "run", "cache"] {
        fs::create_dir(t.path().join(b)).unwrap();
        fs::set_permissions(t.path().join(b), fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let as_nobody = |script: &str| {
        let (code, _, err) = run(Command::new(setpriv)
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(script)
            .current_dir(t.path()));
        assert_eq!(code, 0, "{what}: {}", String::from_utf8_lossy(&err));
    };
    let victim = t.path().join("tmp/victim");
    as_nobody("mkdir -m 777 tmp/victim && echo untouched > tmp/victim/file");
    if spot == "cache/sbxfs/staging" {
        // Inside a private directory of root's that is fine, the attacker can plant nothing;
        // here the whole cache directory is the attacker's, open to all.
        as_nobody("mkdir -m 777 cache/sbxfs");
    }
    if planted {
        as_nobody(&format!("ln -s {} {spot}", victim.display()));
    } else {
        as_nobody(&format!("mkdir -p -m 777 {spot}"));
    }
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let token_file = t.path().join("token");
    fs::write(&token_file, &agent.token).unwrap();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.arg("mount")
        .arg(&agent.url)
        .arg(&mnt)
        .arg("--token-file")
        .arg(&token_file)
        .env("TMPDIR", t.path().join("tmp"))
        .env("XDG_CACHE_HOME", t.path().join("cache"))
        .env("SBXFS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(fs::File::create(t.path().join("mount.log")).unwrap());
    if runtime_dir {
        cmd.env("XDG_RUNTIME_DIR", t.path().join("run"));
    } else {
        cmd.env_remove("XDG_RUNTIME_DIR");
    }
    let mut child = cmd.spawn().unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let mounted = first.contains("mounted");
    let guard = MountedChild {
        child,
        dir: mnt.clone(),
    };
    if mounted {
        // Whatever the daemon chose instead: the mount works, and (below) nothing of it
        // lands in the attacker's places.
        fs::write(mnt.join("f"), "data").unwrap();
        // The CLI finds the control socket through the mount, wherever the daemon put it.
        let (code, _, err) = ctl(&mnt, &["status"]);
        assert_eq!(code, 0, "{what}: ctl status: {err}");
    }
    drop(guard);
    let log = fs::read_to_string(t.path().join("mount.log")).unwrap();
    eprintln!("{what}: mounted: {mounted}; {log}");
    if spot == "run/sbxfs" || spot == "tmp/sbxfs-0" {
        // The control socket's usual place taken: a fresh private directory beside it, so
        // nobody stops the user's mounts by squatting a name; one line says so.
        assert!(mounted, "{what}: the mount refused to start: {log}");
        assert!(
            log.contains("using") && log.contains("instead"),
            "{what}: {log}"
        );
    }
    if !mounted {
        assert!(
            log.contains("refusing") && log.lines().count() == 1,
            "{what}: not one clear error: {log}"
        );
    }
    let names: Vec<_> = fs::read_dir(&victim)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("file")], "{what}");
    assert_eq!(
        fs::read_to_string(victim.join("file")).unwrap(),
        "untouched\n",
        "{what}"
    );
    let p = t.path().join(spot);
    if !planted {
        for e in fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            assert_ne!(
                e.metadata().unwrap().uid(),
                0,
                "{what}: root wrote {}",
                e.path().display()
            );
        }
    }
}

/// Search results name files beneath the searched directory only: a sandbox that answers
/// `grep -l`, `glob` or `fuzzy` with a laptop path (`/etc/passwd`, `../../x`), or prints a line
/// more than ripgrep would, has its answer refused, so `sbxfs grep -l … | xargs sed -i` never
/// reaches a file outside the mount.
#[test]
fn search_results_never_name_a_file_outside_the_mount() {
    let Some(agent) = HostileAgent::start() else {
        return;
    };
    let mount = MountProcess::start_url(&agent.url, "unused", &[]);
    let m = &mount.dir;
    for args in [
        &["grep", "-l", "forgedpath"][..],
        &["grep", "-l", "forgedline"],
        &["grep", "forgedline"],
        &["glob", "*"],
        &["fuzzy", "x"],
    ] {
        let (code, out, err) = run(Command::new(sbxfs_bin()).current_dir(m).args(args));
        let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
        assert_eq!(code, 2, "{args:?}: {out} / {err}");
        assert!(
            !out.contains("/etc/") && !out.contains(".."),
            "{args:?} printed {out:?}"
        );
        assert!(err.contains("refused its answer"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

/// A sandbox may name a file `a /tmp/…/notes`: `xargs` splits that at the space and would
/// edit the laptop's file. With `-0` (grep and glob) and `xargs -0` the name stays whole, so
/// the edit reaches the sandbox's file only.
#[test]
fn a_name_with_a_space_reaches_xargs_0_whole() {
    let s = sandbox();
    // Beside the test's directory, not in it: the walk skips hidden directories (`.tmpXXX`).
    let laptop = tempfile::Builder::new()
        .prefix("sbxfs-victim-")
        .tempdir_in("/tmp")
        .unwrap();
    let victim = laptop.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("notes"), "TODO laptop\n").unwrap();
    // `a /tmp/sbxfs-victim-…/victim/notes` in the sandbox.
    let inside = s.root.join(format!("a {}/notes", victim.display()));
    fs::create_dir_all(inside.parent().unwrap()).unwrap();
    fs::write(&inside, "TODO sandbox\n").unwrap();
    for (cmd, word) in [
        ("grep -0 -l TODO", "GREPPED"),
        ("glob -0 '**/notes'", "GLOBBED"),
    ] {
        let script = format!(
            "{} {cmd} | xargs -0 sed -i 's/TODO/{word}/;s/GREPPED/{word}/'",
            sbxfs_bin().display()
        );
        let (code, out, err) = sh(&s.mount.dir, &script);
        assert_eq!(code, 0, "{script}: {out} {err}");
        assert_eq!(
            fs::read_to_string(victim.join("notes")).unwrap(),
            "TODO laptop\n",
            "{cmd} | xargs -0 touched a laptop file"
        );
        assert_eq!(
            fs::read_to_string(&inside).unwrap(),
            format!("{word} sandbox\n"),
            "{cmd} | xargs -0 edits the sandbox's file"
        );
    }
}

#[test]
fn a_name_with_a_line_break_is_skipped_by_grep_and_hides_no_other_match() {
    let s = sandbox();
    for name in ["aaa", "nl\nfake:1:match", "zzz"] {
        fs::write(s.root.join(name), "needle\n").unwrap();
    }
    for args in [&["-l"][..], &["-n"], &["-c"]] {
        let (code, out, err) = run(Command::new(sbxfs_bin())
            .arg("grep")
            .args(args)
            .arg("needle")
            .current_dir(&s.mount.dir));
        let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        let files: Vec<&str> = out.lines().map(|l| l.split(':').next().unwrap()).collect();
        assert_eq!(files, ["aaa", "zzz"], "{args:?}: {out}");
        assert!(err.contains("line break"), "{args:?}: {err}");
    }
}

#[test]
fn a_replacement_that_multiplies_output_stops_at_the_cap_in_bounded_time() {
    let s = sandbox();
    fs::write(s.root.join("many"), format!("{}\n", "a".repeat(200_000))).unwrap();
    // Each one-byte match printed as 4,000 bytes: 800 MB for the one line, which the
    // printer would build whole before writing it.
    let replacement = "$0".repeat(2000);
    let started = Instant::now();
    let (code, out, err) = run(Command::new("timeout")
        .arg("120")
        .arg(sbxfs_bin())
        .args(["grep", "-o", "-r", &replacement, "a", "many"])
        .current_dir(&s.mount.dir));
    let err = String::from_utf8_lossy(&err);
    assert!(started.elapsed() < Duration::from_secs(60), "{err}");
    assert_ne!(code, 124, "killed by timeout: {err}");
    assert!(out.len() as u64 <= 64 << 20, "{} bytes", out.len());
    assert!(err.contains("truncated"), "{code}: {err}");
    // A small one prints as rg does.
    let (code, out, _) = run(Command::new(sbxfs_bin())
        .args(["grep", "-o", "-r", "<$0>", "a+", "many"])
        .current_dir(&s.mount.dir));
    assert_eq!(code, 0);
    assert_eq!(out.len(), 200_000 + 3);
}
