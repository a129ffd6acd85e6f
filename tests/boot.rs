//! Boot-time mounts: an fstab line and `mount -t fuse.sbxfs` through util-linux `mount` and
//! `mount.fuse3`, the systemd units (`systemd-analyze verify`, and a notify socket played by the
//! test), the `fuse.sbxfs` type in mountinfo, and each mistake at start: its line, its exit
//! code, and nothing left behind. Real agents, real mounts; every process is stopped by pid and
//! every mount unmounted even when a test fails.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Where `mount.fuse3` finds `sbxfs`: it runs `/bin/sh -c 'sbxfs …'`, and util-linux `mount`
/// hands helpers an environment without `PATH`, so the shell's default path applies
/// (`/usr/local/bin` first). The units expect the binary there too.
const INSTALLED: &str = "/usr/local/bin/sbxfs";

/// Install the freshly built binary where `mount` and the units find it (only if it differs:
/// a running daemon keeps its old file, the new one is renamed into place).
///
/// The copy is written by a `cp` child, never through a descriptor of this process: a process
/// another test thread forks meanwhile would inherit that descriptor, and exec of the file
/// fails with "Text file busy" while any writer is open. One install at a time.
fn install_binary(dest: &Path) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let built = fs::read(sbxfs_bin()).unwrap();
    if fs::read(dest).ok().as_deref() == Some(&built[..]) {
        return;
    }
    let dir = dest.parent().unwrap();
    fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(format!(".sbxfs.install-{}", std::process::id()));
    let (code, _, err) = run(Command::new("sh")
        .arg("-c")
        .arg(r#"cp "$1" "$2" && chmod 0755 "$2" && mv -f "$2" "$3""#)
        .arg("sh")
        .arg(sbxfs_bin())
        .arg(&tmp)
        .arg(dest));
    assert_eq!(code, 0, "install: {}", String::from_utf8_lossy(&err));
}

/// A sandbox served by a real agent, and a private place for everything a mount makes.
struct Sandbox {
    dir: tempfile::TempDir,
    root: PathBuf,
    agent: AgentProcess,
    token_file: PathBuf,
    /// `XDG_CACHE_HOME` and `XDG_RUNTIME_DIR` of the mounts this test starts.
    cache: PathBuf,
    runtime: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        // Other users (the tests acting as `nobody`) must reach the mountpoints.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("ws");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("hello.txt"), "hello from the sandbox\n").unwrap();
        let agent = AgentProcess::start(&root);
        let token_file = dir.path().join("token");
        fs::write(&token_file, &agent.token).unwrap();
        let (cache, runtime) = (dir.path().join("cache"), dir.path().join("runtime"));
        for d in [&cache, &runtime] {
            fs::create_dir(d).unwrap();
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).unwrap();
        }
        Sandbox {
            dir,
            root,
            agent,
            token_file,
            cache,
            runtime,
        }
    }

    fn mountpoint(&self, name: &str) -> PathBuf {
        let m = self.dir.path().join(name);
        fs::create_dir(&m).unwrap();
        m
    }

    /// The daemon's environment: its private state stays inside this test.
    fn env(&self, cmd: &mut Command) {
        cmd.env("XDG_CACHE_HOME", &self.cache)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env("SBXFS_LOG", "warn");
    }

    /// Every path under the private state and runtime directories.
    fn left_behind(&self) -> BTreeSet<PathBuf> {
        let mut all = BTreeSet::new();
        for base in [&self.cache, &self.runtime] {
            let mut stack = vec![base.clone()];
            while let Some(d) = stack.pop() {
                for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().unwrap().is_dir() {
                        stack.push(e.path());
                    }
                    all.insert(e.path());
                }
            }
        }
        all
    }
}

/// A mount this test made by `mount`: its detached daemon is found by its command line (it is
/// not our child), unmounted and stopped by pid on drop.
struct Mounted {
    dir: PathBuf,
}

impl Mounted {
    /// The pid of the daemon serving `dir` (`sbxfs mount --detached … DIR …`).
    fn daemon_pid(&self) -> Option<i32> {
        daemon_pids(&self.dir).into_iter().next()
    }

    /// Wait until the daemon has exited by itself (it pushes pending writes first).
    fn wait_for_daemon_exit(&self, pid: i32) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() && is_our_daemon(pid, &self.dir) {
            assert!(Instant::now() < deadline, "the daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        for pid in daemon_pids(&self.dir) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

fn is_our_daemon(pid: i32, mountpoint: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let mnt = mountpoint.as_os_str().as_encoded_bytes();
    args.contains(&&b"--detached"[..]) && args.contains(&mnt)
}

fn daemon_pids(mountpoint: &Path) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| is_our_daemon(pid, mountpoint))
        .collect()
}

/// Run a command that must finish by itself (else it is killed and the test fails). Returns
/// the exit code and stdout + stderr.
fn finish(cmd: &mut Command) -> (i32, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = fs::read_to_string(out.path()).unwrap_or_default();
    (status.code().unwrap_or(-1), text)
}

/// The `findmnt -t fuse.sbxfs` line for `dir`: `TARGET SOURCE FSTYPE`.
fn findmnt_sbxfs(dir: &Path) -> Option<String> {
    let out = Command::new("findmnt")
        .args(["-t", "fuse.sbxfs", "-n", "-r", "-o", "TARGET,SOURCE,FSTYPE"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.split(' ').next() == Some(&*dir.to_string_lossy()))
        .map(str::to_string)
}

/// Mounted through `mount`: the line in `findmnt -t fuse.sbxfs`, a read, a write, and `umount`
/// pushing the write before the daemon exits.
fn check_mounted_then_umount(s: &Sandbox, mnt: &Path) {
    let m = Mounted {
        dir: mnt.to_path_buf(),
    };
    let line = findmnt_sbxfs(mnt).expect("findmnt -t fuse.sbxfs lists the mount");
    assert_eq!(
        line,
        format!("{} {} fuse.sbxfs", mnt.display(), s.agent.url),
        "type fuse.sbxfs, the remote as the source"
    );
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let entry = info
        .lines()
        .find(|l| l.contains(&format!(" {} ", mnt.display())))
        .unwrap();
    assert!(
        entry.contains("nosuid") && entry.contains("nodev"),
        "{entry}"
    );
    assert_eq!(
        fs::read_to_string(mnt.join("hello.txt")).unwrap(),
        "hello from the sandbox\n"
    );
    fs::write(mnt.join("written.txt"), "written through the mount\n").unwrap();
    // The background daemon's log: a private file that `ctl status` names.
    let status = Command::new(INSTALLED)
        .args(["ctl", "status"])
        .current_dir(mnt)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    let log = status
        .lines()
        .find_map(|l| l.strip_prefix("mount.log "))
        .map(str::trim)
        .unwrap_or_else(|| panic!("ctl status names the log: {status}"));
    // (The daemon logs at warn here: the file is made, and private.)
    let meta = fs::symlink_metadata(log).unwrap();
    assert!(meta.is_file(), "{log}");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{log}");
    let pid = m.daemon_pid().expect("the daemon serves in the background");
    let (code, out) = finish(Command::new("umount").arg(mnt));
    assert_eq!(code, 0, "{out}");
    m.wait_for_daemon_exit(pid);
    assert!(findmnt_sbxfs(mnt).is_none());
    assert_eq!(
        fs::read_to_string(s.root.join("written.txt")).unwrap(),
        "written through the mount\n",
        "umount pushed the write"
    );
}

#[test]
fn an_fstab_line_mounts_through_mount_and_umount_pushes_what_was_written() {
    if !is_root() {
        eprintln!("skipping: installing the binary for mount.fuse3 needs root");
        return;
    }
    install_binary(Path::new(INSTALLED));
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    // The README's line, with this test's paths.
    let fstab = s.dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.sbxfs _netdev,noauto,x-systemd.automount,allow_other,token_file={} 0 0\n",
            s.agent.url,
            mnt.display(),
            s.token_file.display()
        ),
    )
    .unwrap();
    let mut mount = Command::new("mount");
    mount.arg("-T").arg(&fstab).arg(&mnt);
    s.env(&mut mount);
    let (code, out) = finish(&mut mount);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "", "a mount that worked says nothing");
    check_mounted_then_umount(&s, &mnt);
}

#[test]
fn mount_t_fuse_sbxfs_takes_the_options_mount_and_systemd_pass() {
    if !is_root() {
        eprintln!("skipping: installing the binary for mount.fuse3 needs root");
        return;
    }
    install_binary(Path::new(INSTALLED));
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    let mut mount = Command::new("mount");
    mount
        .args(["-t", "fuse.sbxfs", &s.agent.url])
        .arg(&mnt)
        .arg("-o")
        .arg(format!(
            "_netdev,noauto,nofail,x-systemd.automount,x-systemd.mount-timeout=30,allow_other,\
             cache_size=64M,timeout_ms=5000,token_file={}",
            s.token_file.display()
        ));
    s.env(&mut mount);
    let (code, out) = finish(&mut mount);
    assert_eq!(code, 0, "{out}");
    check_mounted_then_umount(&s, &mnt);
}

#[test]
fn the_mount_fuse3_form_returns_the_daemons_error_line_and_code() {
    let s = Sandbox::new();
    let missing = s.dir.path().join("missing");
    let before = s.left_behind();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.arg(&s.agent.url)
        .arg(&missing)
        .arg("-o")
        .arg(format!("rw,dev,suid,token_file={}", s.token_file.display()));
    s.env(&mut cmd);
    let (code, out) = finish(&mut cmd);
    assert_eq!(code, 3, "{out}");
    assert_eq!(
        out,
        format!(
            "sbxfs mount: mountpoint {0} does not exist; create it first (mkdir -p {0})\n",
            missing.display()
        )
    );
    assert_eq!(s.left_behind(), before);
    assert!(daemon_pids(&missing).is_empty(), "no daemon left");
}

#[test]
fn through_fusermount3_the_mount_is_fuse_sbxfs_too() {
    if !is_root() {
        eprintln!("skipping: as another user fusermount3 is the only way anyway");
        return;
    }
    let s = Sandbox::new();
    // The same path a user's mount takes: fusermount3 mounts and hands the device back.
    let mut m = MountProcess::start_url_env(
        &s.agent.url,
        &s.agent.token,
        &[],
        &[("SBXFS_MOUNT_WITH_FUSERMOUNT", "1")],
    );
    let line = findmnt_sbxfs(&m.dir).expect("findmnt -t fuse.sbxfs lists the mount");
    assert_eq!(
        line,
        format!("{} {} fuse.sbxfs", m.dir.display(), s.agent.url)
    );
    assert_eq!(
        fs::read_to_string(m.dir.join("hello.txt")).unwrap(),
        "hello from the sandbox\n"
    );
    assert_eq!(m.stop(), Some(0));
    assert!(findmnt_sbxfs(&m.dir).is_none());
}

#[test]
fn ready_is_sent_once_the_mount_answers_and_stopping_after_sigterm() {
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    let notify_path = s.dir.path().join("notify");
    let systemd = UnixDatagram::bind(&notify_path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // The unit's ExecStart with an empty OPTIONS.
    let mut cmd = Command::new(sbxfs_bin());
    cmd.arg("mount")
        .arg(&s.agent.url)
        .arg(&mnt)
        .arg("--token-file")
        .arg(&s.token_file)
        .args(["-o", ""])
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    s.env(&mut cmd);
    let mut mount = MountedChild {
        child: cmd.spawn().unwrap(),
        dir: mnt.clone(),
    };
    let mut buf = vec![0u8; 4096];
    let n = systemd.recv(&mut buf).expect("READY=1 arrives");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    // At that moment the mount already answers: no waiting.
    let names: Vec<String> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["hello.txt"]);
    assert!(findmnt_sbxfs(&mnt).is_some());
    fs::write(mnt.join("written.txt"), "before the stop\n").unwrap();

    rustix::process::kill_process(
        rustix::process::Pid::from_child(&mount.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let n = systemd.recv(&mut buf).expect("STOPPING=1 arrives");
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = mount.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        fs::read_to_string(s.root.join("written.txt")).unwrap(),
        "before the stop\n",
        "the stop pushed the write"
    );
    assert!(findmnt_sbxfs(&mnt).is_none(), "the stop unmounted");
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = require_tool("systemd-analyze") else {
        return;
    };
    if !is_root() {
        eprintln!("skipping: the system units expect the binary in /usr/local/bin (root)");
        return;
    }
    install_binary(Path::new(INSTALLED));
    let units = repo_root().join("systemd");
    for unit in ["sbxfs@.service", "sbxfs-agent.service"] {
        let (code, out) = finish(Command::new(&analyze).arg("verify").arg(units.join(unit)));
        assert_eq!(code, 0, "{unit}: {out}");
        assert_eq!(out, "", "{unit}: no warnings");
    }
    // The user unit expects the binary in ~/.local/bin.
    let home = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    install_binary(&home.path().join(".local/bin/sbxfs"));
    let (code, out) = finish(
        Command::new(&analyze)
            .args(["--user", "verify"])
            .arg(units.join("user/sbxfs@.service"))
            .env("HOME", home.path())
            .env("XDG_RUNTIME_DIR", runtime.path()),
    );
    assert_eq!(code, 0, "user unit: {out}");
    assert_eq!(out, "", "user unit: no warnings");
}

/// One mistake: `sbxfs mount` with `args` after the remote exits `code` with exactly `line`,
/// and leaves nothing behind.
fn assert_refused(s: &Sandbox, remote: &str, mnt: &Path, extra: &[&str], code: i32, line: &str) {
    let before = s.left_behind();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.args(["mount", remote])
        .arg(mnt)
        .arg("--token-file")
        .arg(&s.token_file)
        .args(extra);
    s.env(&mut cmd);
    let (got, out) = finish(&mut cmd);
    assert_eq!(
        (got, out.as_str()),
        (code, &*format!("sbxfs mount: {line}\n"))
    );
    assert_eq!(s.left_behind(), before, "nothing left behind");
}

#[test]
fn a_missing_mountpoint_exits_3_and_leaves_nothing() {
    let s = Sandbox::new();
    let mnt = s.dir.path().join("nowhere");
    let m = mnt.display();
    assert_refused(
        &s,
        &s.agent.url,
        &mnt,
        &[],
        3,
        &format!("mountpoint {m} does not exist; create it first (mkdir -p {m})"),
    );
}

#[test]
fn a_regular_file_as_mountpoint_exits_3_and_leaves_nothing() {
    let s = Sandbox::new();
    let file = s.dir.path().join("file");
    fs::write(&file, "").unwrap();
    assert_refused(
        &s,
        &s.agent.url,
        &file,
        &[],
        3,
        &format!("mountpoint {} is not a directory", file.display()),
    );
}

#[test]
fn a_non_empty_mountpoint_exits_3_unless_nonempty() {
    let s = Sandbox::new();
    let mnt = s.mountpoint("full");
    fs::write(mnt.join("mine.txt"), "kept\n").unwrap();
    assert_refused(
        &s,
        &s.agent.url,
        &mnt,
        &[],
        3,
        &format!(
            "mountpoint {} is not empty (the mount would hide what is there); use an empty directory, or -o nonempty",
            mnt.display()
        ),
    );
    let mut m = MountProcess::start_on(&mnt, &s.agent.url, &s.agent.token, &["-o", "nonempty"]);
    assert_eq!(
        fs::read_to_string(mnt.join("hello.txt")).unwrap(),
        "hello from the sandbox\n"
    );
    assert_eq!(m.stop(), Some(0));
    assert_eq!(fs::read_to_string(mnt.join("mine.txt")).unwrap(), "kept\n");
}

#[test]
fn a_mountpoint_where_another_filesystem_is_mounted_exits_3() {
    if !is_root() {
        eprintln!("skipping: mounting a tmpfs needs root");
        return;
    }
    let s = Sandbox::new();
    let mnt = s.mountpoint("taken");
    let (code, out) = finish(
        Command::new("mount")
            .args(["-t", "tmpfs", "sbxfs-test-tmpfs"])
            .arg(&mnt),
    );
    assert_eq!(code, 0, "{out}");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&mnt);
    assert_refused(
        &s,
        &s.agent.url,
        &mnt,
        &[],
        3,
        &format!(
            "{} is already a mount point (tmpfs sbxfs-test-tmpfs); unmount it first or choose another directory",
            mnt.display()
        ),
    );
}

#[test]
fn a_sandbox_that_cannot_be_reached_exits_5_and_leaves_nothing() {
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    let before = s.left_behind();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.args(["mount", "http://127.0.0.1:9"])
        .arg(&mnt)
        .arg("--token-file")
        .arg(&s.token_file);
    s.env(&mut cmd);
    let (code, out) = finish(&mut cmd);
    assert_eq!(code, 5, "{out}");
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    assert!(
        out.starts_with("sbxfs mount: http://127.0.0.1:9: connection refused by 127.0.0.1:9"),
        "{out}"
    );
    assert_eq!(s.left_behind(), before, "nothing left behind");
    assert!(findmnt_sbxfs(&mnt).is_none());
}

/// As `nobody`, with the private directories theirs.
fn as_nobody(s: &Sandbox, setpriv: &Path) -> Command {
    for d in [&s.cache, &s.runtime] {
        rustix::fs::chown(
            d,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .unwrap();
    }
    let mut cmd = Command::new(setpriv);
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(sbxfs_bin())
        .env("SBXFS_TOKEN", &s.agent.token);
    s.env(&mut cmd);
    cmd
}

#[test]
fn without_fusermount3_a_user_mount_exits_4_and_leaves_nothing() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    let before = s.left_behind();
    let empty_path = s.dir.path().join("no-tools");
    fs::create_dir(&empty_path).unwrap();
    let (code, out) = finish(
        as_nobody(&s, &setpriv)
            .args(["mount", &s.agent.url])
            .arg(&mnt)
            .env("PATH", &empty_path),
    );
    assert_eq!(
        (code, out.as_str()),
        (
            4,
            "sbxfs mount: fusermount3 is not on PATH: install FUSE 3 (Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3)\n"
        )
    );
    assert_eq!(s.left_behind(), before, "nothing left behind");
}

#[test]
fn a_mount_fusermount3_refuses_exits_4_as_not_permitted_and_leaves_nothing() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let s = Sandbox::new();
    // Root's directory: fusermount3 lets a user mount only where they may write (and on
    // machines where /dev/fuse is root's alone, nowhere).
    let mnt = s.mountpoint("roots");
    let before = s.left_behind();
    let (code, out) = finish(
        as_nobody(&s, &setpriv)
            .args(["mount", &s.agent.url])
            .arg(&mnt),
    );
    assert_eq!(code, 4, "{out}");
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    assert!(
        out.starts_with(&format!(
            "sbxfs mount: not permitted to mount on {}: ",
            mnt.display()
        )),
        "{out}"
    );
    assert_eq!(s.left_behind(), before, "nothing left behind");
    assert!(findmnt_sbxfs(&mnt).is_none());
}

#[test]
fn with_f_the_mount_fuse3_form_stays_in_the_foreground() {
    use std::io::BufRead;
    let s = Sandbox::new();
    let mnt = s.mountpoint("mnt");
    let mut cmd = Command::new(sbxfs_bin());
    cmd.arg(&s.agent.url)
        .arg(&mnt)
        .arg("-f")
        .arg("-o")
        .arg(format!("token_file={}", s.token_file.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    s.env(&mut cmd);
    let mut mount = MountedChild {
        child: cmd.spawn().unwrap(),
        dir: mnt.clone(),
    };
    let mut line = String::new();
    std::io::BufReader::new(mount.child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line,
        format!("sbxfs mounted {} on {}\n", s.agent.url, mnt.display())
    );
    assert!(
        mount.child.try_wait().unwrap().is_none(),
        "the daemon is this process"
    );
    assert!(daemon_pids(&mnt).is_empty(), "no detached daemon");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&mount.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(mount.child.wait().unwrap().code(), Some(0));
    assert!(findmnt_sbxfs(&mnt).is_none());
}

/// A unit's `ExecStopPost=` command as the shell would run it (systemd turns `$$` into `$`).
fn stop_post_command(unit: &Path) -> String {
    let text = fs::read_to_string(unit).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStopPost="))
        .unwrap_or_else(|| panic!("{}: no ExecStopPost", unit.display()));
    line.trim_start_matches('-').replace("$$", "$")
}

#[test]
fn the_units_unmount_a_mount_whose_daemon_was_killed_and_nothing_else() {
    let s = Sandbox::new();
    let dead =
        |dir: &Path| fs::metadata(dir).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN);
    for unit in ["sbxfs@.service", "user/sbxfs@.service"] {
        let command = stop_post_command(&repo_root().join("systemd").join(unit));
        let mut m = MountProcess::start(&s.agent, &[]);
        let mut daemon = m.child.take().unwrap();
        daemon.kill().unwrap();
        daemon.wait().unwrap();
        assert!(dead(&m.dir), "a killed daemon leaves a dead mount");
        let stop_post = |result: &str| {
            let (code, out) = finish(
                Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .env("SERVICE_RESULT", result)
                    .env("MOUNTPOINT", &m.dir),
            );
            assert_eq!(code, 0, "{unit} {result}: {out}");
        };
        // Ended by itself (e.g. refused because the mount there is another's): left alone.
        stop_post("exit-code");
        assert!(
            dead(&m.dir),
            "{unit}: after an exit the mount is left alone"
        );
        stop_post("signal");
        assert!(
            fs::read_dir(&m.dir).is_ok(),
            "{unit}: the dead mount is gone"
        );
        assert!(findmnt_sbxfs(&m.dir).is_none());
    }
}
