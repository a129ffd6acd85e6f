//! A mount that never lies about itself: `-o` options, what happens when a mount is started
//! twice, killed or fails to start, how often it unmounts, `--mount`/`--socket` on something that
//! is not a live mount, and `ctl status` while the sandbox hangs. Real mounts over real agent
//! processes; every mount is unmounted even when a test fails.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Setup {
    dir: tempfile::TempDir,
    root: PathBuf,
    agent: AgentProcess,
    mount: MountProcess,
}

fn setup_with(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, extra);
    Setup {
        dir,
        root,
        agent,
        mount,
    }
}

/// Run a command that must finish by itself within `limit` (else it is killed: `None`).
/// Returns the exit code and stdout + stderr.
fn run_within(cmd: &mut Command, limit: Duration) -> (Option<i32>, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, fs::read_to_string(out.path()).unwrap_or_default())
}

fn sbxfs(args: &[&str]) -> Command {
    let mut c = Command::new(sbxfs_bin());
    c.args(args).env("SBXFS_LOG", "warn");
    c
}

fn token_file(dir: &Path, agent: &AgentProcess) -> PathBuf {
    let f = dir.join("token");
    fs::write(&f, &agent.token).unwrap();
    f
}

/// The mountinfo line of the topmost mount at `dir`.
fn mountinfo_line(dir: &Path) -> Option<String> {
    let needle = format!(" {} ", dir.display());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .rev()
        .find(|l| l.contains(&needle))
        .map(str::to_string)
}

fn socket_of(mountpoint: &Path) -> PathBuf {
    sbxfs::control::socket_path(&fs::canonicalize(mountpoint).unwrap())
}

fn status_via(socket: &Path) -> (Option<i32>, serde_json::Value, Duration) {
    let t = Instant::now();
    let (code, out) = run_within(
        sbxfs(&["ctl", "status", "--json", "--socket"]).arg(socket),
        Duration::from_secs(30),
    );
    let v = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    (code, v, t.elapsed())
}

#[test]
fn allow_other_lets_another_user_in_and_without_it_they_are_refused() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let s = setup_with(&[]);
    fs::write(s.root.join("hello.txt"), "hi").unwrap();
    let shared = MountProcess::start(&s.agent, &["-o", "allow_other"]);
    for m in [&s.mount, &shared] {
        // The test's temp directories are 0700: let `nobody` reach the mountpoints.
        let parent = m.dir.parent().unwrap();
        fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let as_nobody = |args: &[&str], dir: &Path| {
        run(Command::new(&setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .arg(dir))
    };
    let (code, out, err) = as_nobody(&["ls"], &shared.dir);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(String::from_utf8_lossy(&out), "hello.txt\n");
    // The mode bits still apply to that user (the root is 0755, not theirs): the daemon checks.
    let (code, _, _) = as_nobody(&["touch"], &shared.dir.join("new.txt"));
    assert_ne!(code, 0);
    assert!(!s.root.join("new.txt").exists());
    // Without allow_other, another user is refused at the door.
    let (code, _, err) = as_nobody(&["ls"], &s.mount.dir);
    assert_ne!(code, 0);
    assert!(
        String::from_utf8_lossy(&err).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&err)
    );
    // Every mount is nosuid,nodev.
    let line = mountinfo_line(&shared.dir).unwrap();
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
}

#[test]
fn a_read_only_mount_gives_erofs_and_mount8_options_are_ignored() {
    let s = setup_with(&[
        "-o",
        "ro,_netdev,noauto,nofail,x-systemd.automount,comment=sbx,nosuid,noatime",
        "-o",
        "cache_size=64M,attr_ttl_ms=200",
    ]);
    let m = &s.mount.dir;
    fs::create_dir(s.root.join("d")).unwrap();
    fs::write(s.root.join("f.txt"), "data").unwrap();
    assert_eq!(fs::read_to_string(m.join("f.txt")).unwrap(), "data");
    let erofs = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    assert_eq!(erofs(fs::write(m.join("f.txt"), "x")), Some(libc::EROFS));
    assert_eq!(erofs(fs::write(m.join("new.txt"), "x")), Some(libc::EROFS));
    assert_eq!(erofs(fs::create_dir(m.join("e"))), Some(libc::EROFS));
    assert_eq!(erofs(fs::remove_file(m.join("f.txt"))), Some(libc::EROFS));
    assert_eq!(erofs(fs::remove_dir(m.join("d"))), Some(libc::EROFS));
    assert_eq!(fs::read_to_string(s.root.join("f.txt")).unwrap(), "data");
    assert!(!s.root.join("new.txt").exists());
    let line = mountinfo_line(m).unwrap();
    assert!(line.split(' ').nth(5).unwrap().starts_with("ro,"), "{line}");
    let (code, v, _) = status_via(&socket_of(m));
    assert_eq!(code, Some(0));
    assert_eq!(v["mount"]["read_only"], true);
}

#[test]
fn an_unknown_or_malformed_option_exits_2_with_a_clear_line() {
    let d = tempfile::tempdir().unwrap();
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    for (opts, says) in [
        ("ro,bogus_option", "unknown mount option `bogus_option`"),
        (
            "cache_size=lots",
            "mount option `cache_size`: `lots` is not a size",
        ),
        (
            "idmap=root",
            "mount option `idmap`: `root` is not `user` or `none`",
        ),
        ("ro=yes", "mount option `ro` takes no value"),
    ] {
        let (code, out) = run_within(
            sbxfs(&["mount", "http://127.0.0.1:9", "-o", opts]).arg(&mnt),
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(2), "{opts}: {out}");
        assert!(out.contains(says), "{opts}: {out}");
        assert!(mountinfo_line(&mnt).is_none(), "nothing mounted");
    }
}

#[test]
fn a_second_mount_on_a_live_mountpoint_is_refused_and_the_first_keeps_serving() {
    let mut s = setup_with(&[]);
    fs::write(s.root.join("a.txt"), "first").unwrap();
    let socket = socket_of(&s.mount.dir);
    let tf = token_file(s.dir.path(), &s.agent);
    let (code, out) = run_within(
        sbxfs(&["mount", &s.agent.url])
            .arg(&s.mount.dir)
            .arg("--token-file")
            .arg(&tf),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(3), "exit 3: the mountpoint: {out}");
    assert!(
        out.contains("is already an sbxfs mount (of http://127.0.0.1:"),
        "{out}"
    );
    // The first mount: still mounted once, its socket still answering, its files served.
    assert_eq!(
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .matches(&format!(" {} ", s.mount.dir.display()))
            .count(),
        1
    );
    let (code, v, _) = status_via(&socket);
    assert_eq!(code, Some(0));
    assert_eq!(v["reachable"], true);
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "first"
    );
    assert_eq!(s.mount.stop(), Some(0));
    assert!(
        !s.mount.log_text().contains("failed"),
        "{}",
        s.mount.log_text()
    );
}

#[test]
fn a_killed_daemon_leaves_a_dead_mount_that_is_named_and_a_stale_socket_that_is_replaced() {
    let mut s = setup_with(&[]);
    let dir = s.mount.dir.clone();
    let socket = socket_of(&dir);
    let mut child = s.mount.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(socket.exists(), "a killed daemon leaves its socket behind");
    let tf = token_file(s.dir.path(), &s.agent);
    let (code, out) = run_within(
        sbxfs(&["mount", &s.agent.url])
            .arg(&dir)
            .arg("--token-file")
            .arg(&tf),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(3), "exit 3: the mountpoint: {out}");
    assert!(
        out.contains("is a FUSE mount whose daemon is gone"),
        "{out}"
    );
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(&dir)
        .status()
        .unwrap()
        .success());
    // The stale socket (nobody listens) is replaced by the new mount's.
    let again = MountProcess::start_on(&dir, &s.agent.url, &s.agent.token, &[]);
    let (code, v, _) = status_via(&socket);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["mount"]["mountpoint"], dir.to_str().unwrap());
    assert!(again.log_text().contains("replaced a stale control socket"));
}

#[test]
fn the_daemon_unmounts_exactly_once_and_not_after_an_unmount_from_outside() {
    let mut s = setup_with(&[]);
    // A staging directory given by the user stays.
    let staging = s.dir.path().join("my-staging");
    fs::create_dir(&staging).unwrap();
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)).unwrap();
    let mut second = MountProcess::start(
        &s.agent,
        &["-o", &format!("staging_dir={}", staging.display())],
    );

    assert_eq!(s.mount.stop(), Some(0));
    let log = s.mount.log_text();
    assert_eq!(log.matches("unmounted").count(), 1, "{log}");
    assert!(
        !log.contains("Unmount failed") && !log.contains("could not unmount"),
        "{log}"
    );
    assert!(mountinfo_line(&s.mount.dir).is_none());

    let status = Command::new(sbxfs_bin())
        .arg("umount")
        .arg(&second.dir)
        .status()
        .unwrap();
    assert!(status.success());
    let code = second.child.take().unwrap().wait().unwrap().code();
    assert_eq!(code, Some(0));
    let log = second.log_text();
    assert!(
        !log.contains("unmounted") && !log.contains("Unmount failed"),
        "the daemon must not unmount again: {log}"
    );
    assert!(staging.is_dir());
    assert!(
        !socket_of(&second.dir).exists(),
        "the socket goes with the mount"
    );
}

#[test]
fn a_failed_start_removes_the_socket_and_staging_directory_it_created() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let tf = token_file(d.path(), &agent);

    // Not a directory: refused before anything is made.
    let not_a_dir = d.path().join("not-a-dir");
    fs::write(&not_a_dir, "").unwrap();
    let (code, out) = run_within(
        sbxfs(&["mount", &agent.url])
            .arg(&not_a_dir)
            .arg("--token-file")
            .arg(&tf),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(3), "exit 3: the mountpoint: {out}");
    assert!(out.contains("is not a directory"), "{out}");
    assert!(!socket_of(&not_a_dir).exists(), "socket left behind");

    // The sandbox does not answer, after the socket and the staging directory were made:
    // both are removed (a given staging directory, and the default one for this remote).
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let staging = d.path().join("staging-new");
    let cache = d.path().join("cache");
    for opts in [
        vec![
            "-o".to_string(),
            format!("staging_dir={}", staging.display()),
        ],
        vec![],
    ] {
        let child = sbxfs(&["mount", "http://127.0.0.1:9"])
            .arg(&mnt)
            .arg("--token-file")
            .arg(&tf)
            .args(&opts)
            .env("XDG_CACHE_HOME", &cache)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Exit code 5: the sandbox could not be reached.
        assert_eq!(out.status.code(), Some(5), "{err}");
        assert!(
            err.contains("http://127.0.0.1:9: connection refused by 127.0.0.1:9"),
            "{err}"
        );
        assert!(!staging.exists(), "staging directory left behind");
        let per_remote = fs::read_dir(cache.join("sbxfs/staging"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(per_remote, 0, "default staging directory left behind");
        assert!(!socket_of(&mnt).exists(), "socket left behind");
    }
    assert!(mountinfo_line(&mnt).is_none());
}

#[test]
fn mount_and_socket_flags_refuse_what_is_not_a_live_mount() {
    let local = tempfile::tempdir().unwrap();
    let l = local.path();
    fs::write(l.join("f.txt"), "alpha\n").unwrap();
    // A stale socket: bound, then nobody listening.
    let dead = l.join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let ls = l.to_str().unwrap();
    let ds = dead.to_str().unwrap();
    for args in [
        vec![
            "edit", "f.txt", "--old", "alpha", "--new", "beta", "--mount", ls,
        ],
        vec!["grep", "alpha", "--mount", ls],
        vec!["scan", "f.txt", "--start", "1", "--mount", ls],
        vec!["glob", "*", "--mount", ls],
        vec!["fuzzy", "f", "--mount", ls],
        vec!["ctl", "status", "--mount", ls],
        vec!["ctl", "--mount", ls, "invalidate", "f.txt"],
    ] {
        let (code, out) = run_within(sbxfs(&args).current_dir(l), Duration::from_secs(10));
        assert_eq!(code, Some(2), "{args:?}: {out}");
        assert!(
            out.contains(&format!("--mount {ls}: not a live sbxfs mount")),
            "{args:?}: {out}"
        );
    }
    for args in [
        vec!["glob", "*", "--socket", ds],
        vec![
            "edit", "f.txt", "--old", "alpha", "--new", "beta", "--socket", ds,
        ],
        vec!["ctl", "stats", "--socket", ds],
        vec!["grep", "alpha", "--socket", "/nonexistent/sbxfs.sock"],
    ] {
        let (code, out) = run_within(sbxfs(&args).current_dir(l), Duration::from_secs(10));
        assert_eq!(code, Some(2), "{args:?}: {out}");
        assert!(
            out.contains("no live sbxfs mount listens there"),
            "{args:?}: {out}"
        );
    }
    assert_eq!(fs::read_to_string(l.join("f.txt")).unwrap(), "alpha\n");
    // Without --mount, a local path is still searched and edited locally.
    let (code, out) = run_within(
        sbxfs(&["edit", "f.txt", "--old", "alpha", "--new", "beta"]).current_dir(l),
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(fs::read_to_string(l.join("f.txt")).unwrap(), "beta\n");

    // A live mount: --mount and --socket reach it, and a path it lacks is the sandbox's answer.
    let s = setup_with(&[]);
    fs::write(s.root.join("g.txt"), "gamma\n").unwrap();
    let m = s.mount.dir.to_str().unwrap();
    let socket = socket_of(&s.mount.dir);
    let (code, out) = run_within(
        sbxfs(&["scan", "g.txt", "--mount", m]).current_dir(l),
        Duration::from_secs(20),
    );
    assert_eq!((code, out.as_str()), (Some(0), "gamma\n"));
    let (code, out) = run_within(
        sbxfs(&["scan", "missing.txt", "--mount", m, "--json"]).current_dir(l),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("\"not_found\""), "{out}");
    let (code, out) = run_within(
        sbxfs(&[
            "ctl",
            "--socket",
            socket.to_str().unwrap(),
            "invalidate",
            "g.txt",
            "--json",
        ])
        .current_dir(l),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\"invalidated\": \"g.txt\""), "{out}");
}

/// `status` through the QUERY ioctl on `dir`.
fn status_by_ioctl(dir: &Path) -> serde_json::Value {
    use sbxfs::control::{IOC_QUERY, IOC_QUERY_SIZE};
    use std::os::fd::AsRawFd;
    let f = fs::File::open(dir).unwrap();
    let mut buf = vec![0u8; IOC_QUERY_SIZE];
    let req = br#"{"v":1,"op":"status"}"#;
    buf[..req.len()].copy_from_slice(req);
    // SAFETY: `buf` is exactly the size IOC_QUERY encodes, and `f` stays open for the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), IOC_QUERY as _, buf.as_mut_ptr()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let end = buf.iter().position(|&b| b == 0).unwrap();
    serde_json::from_slice(&buf[..end]).unwrap()
}

#[test]
fn ctl_status_answers_at_once_while_the_sandbox_hangs() {
    let s = setup_with(&[]);
    let socket = socket_of(&s.mount.dir);
    let (code, v, _) = status_via(&socket);
    assert_eq!((code, &v["reachable"]), (Some(0), &serde_json::json!(true)));
    // The ioctl answers from the same knowledge as the socket.
    let v = status_by_ioctl(&s.mount.dir);
    assert_eq!(v["reachable"], true, "{v}");
    assert_eq!(v["mount"]["socket"], socket.to_str().unwrap());
    let agent = rustix::process::Pid::from_child(&s.agent.child);
    // A hung sandbox: connections are accepted by the kernel, nothing answers.
    rustix::process::kill_process(agent, rustix::process::Signal::STOP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let seen_down = loop {
        let (code, v, took) = status_via(&socket);
        assert_eq!(code, Some(0), "{v}");
        // Never the sandbox's 10 s deadline (a busy machine may take a while to start `sbxfs`).
        assert!(took < Duration::from_secs(6), "status waited {took:?}");
        assert_eq!(v["mount"]["remote"], s.agent.url);
        assert_eq!(v["pending_commits"], 0);
        assert_eq!(v["push_failures"], serde_json::json!([]));
        if v["reachable"] == false {
            break v;
        }
        assert!(Instant::now() < deadline, "never reported unreachable: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(seen_down["last_error"].is_string(), "{seen_down}");
    assert!(
        seen_down["last_answer_ms_ago"].as_u64().unwrap() >= 2000,
        "{seen_down}"
    );
    let t = Instant::now();
    let (code, out) = run_within(
        &mut sbxfs(&[
            "ctl",
            "stats",
            "--json",
            "--socket",
            socket.to_str().unwrap(),
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "stats waited {:?}",
        t.elapsed()
    );
    // The sandbox answers again: status says so by itself.
    rustix::process::kill_process(agent, rustix::process::Signal::CONT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v, _) = status_via(&socket);
        if v["reachable"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never reported reachable again: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn allow_other_for_a_user_is_refused_with_the_fuse_conf_line_to_add() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let conf = fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if sbxfs::mount::options::fuse_conf_allows_other(&conf) {
        eprintln!("skipping: /etc/fuse.conf allows allow_other here");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let (code, out) = run_within(
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(sbxfs_bin())
            .args(["mount", "http://127.0.0.1:9", "-o", "allow_other"])
            .arg(&mnt)
            .env("SBXFS_TOKEN", "t"),
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("allow_other needs the line `user_allow_other` in /etc/fuse.conf"),
        "{out}"
    );
}

#[test]
fn umount_of_a_busy_mount_names_who_uses_it_and_lazy_detaches_it() {
    let s = setup_with(&[]);
    fs::write(s.mount.dir.join("f"), "kept").unwrap();
    // A conflict earlier in the mount's life: named when it is unmounted, not at each refusal.
    fs::write(s.root.join("c.txt"), "base\n").unwrap();
    // Made in the sandbox: shown once the change feed tells the mount.
    let seen = Instant::now() + Duration::from_secs(10);
    while !s.mount.dir.join("c.txt").exists() {
        assert!(Instant::now() < seen, "c.txt never showed in the mount");
        std::thread::sleep(Duration::from_millis(50));
    }
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(s.mount.dir.join("c.txt"))
            .unwrap();
        fs::write(s.root.join("c.txt"), "theirs\n").unwrap();
        f.write_all_at(b"mine\n", 0).unwrap();
        assert!(f.sync_all().is_err(), "a conflict");
    }
    // A program whose working directory is in the mount, as a shell left there.
    let mut user = Command::new("sleep")
        .arg("60")
        .current_dir(&s.mount.dir)
        .spawn()
        .unwrap();
    struct Stop<'a>(&'a mut std::process::Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = user.id();
    let _stop = Stop(&mut user);
    let dir = s.mount.dir.to_str().unwrap();
    let (code, err) = run_within(&mut sbxfs(&["umount", dir]), Duration::from_secs(30));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is busy"), "{err}");
    assert!(
        err.contains(&format!(
            "pid {pid} (sleep): its working directory is there"
        )),
        "{err}"
    );
    assert!(err.contains("--lazy"), "{err}");
    assert!(!err.contains("conflict"), "{err}");
    assert!(mountinfo_line(&s.mount.dir).is_some(), "still mounted");
    let (code, err) = run_within(
        &mut sbxfs(&["umount", "--lazy", dir]),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("conflict: c.txt changed in the sandbox"),
        "{err}"
    );
    assert!(mountinfo_line(&s.mount.dir).is_none(), "detached");
    // What was written was pushed before the detach.
    assert_eq!(fs::read_to_string(s.root.join("f")).unwrap(), "kept");
}

#[test]
fn root_unmounts_without_fusermount3_and_the_write_reaches_the_sandbox() {
    // Root mounts with mount(2), so `sbxfs mount` works where fuse3's tools are missing;
    // `sbxfs umount` failed there ("fusermount3: No such file or directory").
    if !is_root() {
        return;
    }
    let mut s = setup_with(&[]);
    fs::write(s.mount.dir.join("f"), "written before the umount\n").unwrap();
    let bare = tempfile::tempdir().unwrap();
    let dir = s.mount.dir.to_str().unwrap().to_string();
    let (code, err) = run_within(
        sbxfs(&["umount", &dir]).env("PATH", bare.path()),
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(mountinfo_line(&s.mount.dir).is_none(), "unmounted");
    assert_eq!(
        fs::read_to_string(s.root.join("f")).unwrap(),
        "written before the umount\n"
    );
    assert_eq!(s.mount.stop(), Some(0), "the daemon ends cleanly");
}

#[test]
fn a_staging_directory_open_to_others_is_refused_before_the_sandbox_is_contacted() {
    // Over `shell:` the agent was uploaded into the sandbox first, and the message named
    // the directory twice.
    let dir = tempfile::tempdir().unwrap();
    let (ws, mnt, staging) = (
        dir.path().join("ws"),
        dir.path().join("mnt"),
        dir.path().join("staging"),
    );
    for d in [&ws, &mnt, &staging] {
        fs::create_dir(d).unwrap();
    }
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o755)).unwrap();
    let url = format!("shell:{}", ws.display());
    let (code, err) = run_within(
        sbxfs(&["mount", &url, mnt.to_str().unwrap(), "--staging-dir"]).arg(&staging),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(2), "{err}");
    let shown = staging.display().to_string();
    assert!(err.contains("open to other users (mode 755)"), "{err}");
    assert_eq!(err.matches(&shown).count(), 1, "{err}");
    assert!(mountinfo_line(&mnt).is_none());
    // Nothing was made in the workspace.
    assert_eq!(fs::read_dir(&ws).unwrap().count(), 0);
}
