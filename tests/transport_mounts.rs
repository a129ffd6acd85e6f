//! The mount's real-tool checks over the transports besides the agent's http: `shell:` (the
//! agent over a local sh's stdin/stdout, and the exec-only scripts), `exec:` as another user,
//! `ssh://` with a self-deployed agent, and `ssh://…?agent=no` (the scripts over the ssh
//! channel). Each mounts a real workspace directory, works in it with
//! git, cp, an editor-style save and rm, and checks what the sandbox side holds.

use crate::common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::sshbox::SshBox;
use common::*;

fn sh(dir: &Path, script: &str) -> String {
    let (code, out, err) = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    let (out, err) = (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    );
    assert_eq!(code, 0, "{script}\nstdout: {out}\nstderr: {err}");
    out
}

fn status(mount: &Path) -> String {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--mount"])
        .arg(mount)
        .arg("status"));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    String::from_utf8_lossy(&out).into_owned()
}

/// What programs do in a project tree, through the mount at `m` over the workspace `r`.
fn real_tools(r: &Path, m: &Path) {
    fs::write(r.join("made-in-sandbox.txt"), "from the sandbox\n").unwrap();
    // Within a second where a change feed vouches for a listing taken before.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !m.join("made-in-sandbox.txt").exists() {
        assert!(std::time::Instant::now() < end, "never shown");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        fs::read_to_string(m.join("made-in-sandbox.txt")).unwrap(),
        "from the sandbox\n"
    );
    // git: init, add, commit, status clean, then a change seen.
    sh(
        m,
        "mkdir proj && cd proj && git init -q . && printf 'one\\n' > a.txt && mkdir -p src && \
         printf 'fn main() {}\\n' > src/main.rs && git add -A && \
         git -c user.email=t@example.com -c user.name=t commit -qm first",
    );
    assert_eq!(sh(&m.join("proj"), "git status --porcelain"), "");
    fs::write(m.join("proj/a.txt"), "one\ntwo\n").unwrap();
    assert_eq!(sh(&m.join("proj"), "git status --porcelain"), " M a.txt\n");
    // cp -r of the tree, then an editor-style save: a temp file renamed over the original
    // while a reader holds the old one open.
    sh(m, "cp -r proj copy");
    let mut held = fs::File::open(m.join("copy/a.txt")).unwrap();
    let tmp = m.join("copy/.a.txt.swp");
    let mut f = fs::File::create(&tmp).unwrap();
    f.write_all(b"saved by an editor\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o640)).unwrap();
    fs::rename(&tmp, m.join("copy/a.txt")).unwrap();
    let mut old = String::new();
    std::io::Read::read_to_string(&mut held, &mut old).unwrap();
    assert_eq!(
        old, "one\ntwo\n",
        "the handle held across the rename reads the old file"
    );
    // A truncate between writes, on one handle.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.join("copy/src/main.rs"))
        .unwrap();
    f.write_all(b"0123456789").unwrap();
    f.set_len(4).unwrap();
    f.write_all(b"XY").unwrap();
    drop(f);
    ctl_flush(m);
    // The sandbox side holds exactly what was written.
    assert_eq!(
        fs::read_to_string(r.join("proj/a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        fs::read_to_string(r.join("copy/a.txt")).unwrap(),
        "saved by an editor\n"
    );
    assert_eq!(
        fs::metadata(r.join("copy/a.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    assert_eq!(
        fs::read(r.join("copy/src/main.rs")).unwrap(),
        b"0123\0\0\0\0\0\0XY"
    );
    assert!(!r.join("copy/.a.txt.swp").exists());
    assert_eq!(sh(&r.join("proj"), "git status --porcelain"), " M a.txt\n");
    // rm -r, seen in the sandbox.
    sh(m, "rm -r copy");
    assert!(!r.join("copy").exists());
    assert!(!m.join("copy").exists());
    held_open_across_a_conflict(r, m);
}

fn over_shell(query: &str, transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let url = format!("shell:{}{query}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &[]);
    real_tools(&root, &mount.dir);
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.transport") && l.ends_with(&format!(" {transport}"))),
        "{st}"
    );
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.capabilities.patch_commits") && l.ends_with("true")),
        "{st}"
    );
}

#[test]
fn real_tools_work_over_the_shell_transport_with_the_agent() {
    over_shell("", "shell+agent");
}

#[test]
fn real_tools_work_over_the_shell_transport_with_the_scripts_only() {
    over_shell("?agent=no", "shell");
}

#[test]
fn real_tools_work_over_the_shell_transport_with_a_command_per_operation() {
    over_shell("?agent=no&session=no", "shell");
}

/// `exec:` as a container runtime gives it (`docker exec -i -u 65534 C sh`): a shell as another
/// user, with its own HOME, where the agent is uploaded through the channel and runs.
#[test]
fn real_tools_work_over_exec_as_the_sandboxs_own_user() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let home = dir.path().join("home");
    for d in [&root, &home] {
        fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let exec = format!(
        "env HOME={} {} --reuid=65534 --regid=65534 --clear-groups sh",
        home.display(),
        setpriv.display()
    );
    let url = format!("exec:{}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &["--exec", &exec]);
    fs::write(mount.dir.join("hello.txt"), "from the laptop\n").unwrap();
    ctl_flush(&mount.dir);
    let landed = root.join("hello.txt");
    assert_eq!(fs::read_to_string(&landed).unwrap(), "from the laptop\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(&landed).unwrap().uid(),
        65534,
        "made by the sandbox's user"
    );
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.transport") && l.ends_with(" exec+agent")),
        "{st}"
    );
    // The agent was uploaded under the sandbox user's HOME, private to it.
    let cache = home.join(".cache/sbxfs");
    assert_eq!(fs::metadata(&cache).unwrap().mode() & 0o777, 0o700);
    assert_eq!(fs::metadata(&cache).unwrap().uid(), 65534);
    // A change made in the sandbox is reported by the agent's change feed (within a second:
    // until then the listing the feed vouches for is what the mount shows).
    fs::write(root.join("from-sandbox.txt"), "agent edit\n").unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !mount.dir.join("from-sandbox.txt").exists() {
        assert!(std::time::Instant::now() < end, "the feed never showed it");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        fs::read_to_string(mount.dir.join("from-sandbox.txt")).unwrap(),
        "agent edit\n"
    );
}

fn ssh_ready() -> bool {
    if !is_root() || !Path::new("/usr/sbin/sshd").exists() {
        eprintln!("skipped: needs root and openssh-server (scripts/install-deps.sh)");
        return false;
    }
    require_tool("ssh").is_some()
}

fn over_ssh(suffix: &str, transport: &str) {
    if !ssh_ready() {
        return;
    }
    let b = SshBox::start();
    let config = b.config.display().to_string();
    let mount = MountProcess::start_url(&b.url(suffix), "unused", &["-F", &config]);
    real_tools(&b.root, &mount.dir);
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.transport") && l.ends_with(transport)),
        "{st}"
    );
}

#[test]
fn real_tools_work_over_ssh_with_the_deployed_agent() {
    over_ssh("", "ssh+agent");
}

#[test]
fn real_tools_work_over_ssh_with_the_scripts_only() {
    over_ssh("?agent=no", "ssh+scripts");
}

/// A sandbox whose every writable place is `noexec` (`/tmp`, `/dev/shm`, HOME and the
/// workspace's parent, as a hardened container has them): no agent can run, so the scripts
/// serve through one persistent python3 session, real tools work, and `ctl status` says why.
#[test]
fn a_sandbox_with_nowhere_to_run_a_program_gets_the_scripts_and_says_why() {
    nowhere_to_run(true);
}

/// The same sandbox without python3: the scripts run through one `sh` loop.
#[test]
fn a_sandbox_with_nowhere_to_run_a_program_and_no_python_gets_an_sh_session() {
    nowhere_to_run(false);
}

fn nowhere_to_run(python: bool) {
    if !is_root() || require_tool("unshare").is_none() {
        eprintln!("skipped: needs root and unshare");
        return;
    }
    // Outside /tmp, which the sandbox's shell covers with its own noexec tmpfs.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let parent = dir.path().join("srv");
    let root = parent.join("ws");
    let home = dir.path().join("home");
    let tools = dir.path().join("tools");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&tools).unwrap();
    // The sandbox's PATH: every program of this machine's, python3 among them or not.
    for bin in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        for e in fs::read_dir(bin).into_iter().flatten().flatten() {
            let name = e.file_name();
            if !python && name.to_string_lossy().starts_with("python") {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), tools.join(&name));
        }
    }
    let setup = format!(
        "mount -t tmpfs -o noexec t /tmp && mount -t tmpfs -o noexec t /dev/shm && \
         mount -t tmpfs -o noexec t {home} && mount --bind {parent} {parent} && \
         mount -o remount,bind,noexec {parent} && exec sh",
        home = home.display(),
        parent = parent.display()
    );
    let exec = format!(
        "env PATH={} HOME={} unshare -m sh -c {}",
        tools.display(),
        home.display(),
        shell_words::quote(&setup)
    );
    let url = format!("exec:{}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &["--exec", &exec]);
    real_tools(&root, &mount.dir);
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.transport ") && l.ends_with(" exec")),
        "{st}"
    );
    assert!(
        st.lines().any(|l| l.starts_with("mount.transport_why")
            && l.contains("no directory in the sandbox where a program can be written and run")),
        "{st}"
    );
    let by = if python {
        "one python3 session"
    } else {
        "one sh session (python3 not found)"
    };
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.scripts_run_by ") && l.ends_with(by)),
        "{st}"
    );
    // Nothing was left in the host's own /tmp or HOME, or beside the workspace, by the probe.
    assert!(!home.join(".cache").exists());
    let beside: Vec<_> = fs::read_dir(&parent)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        beside,
        ["ws"],
        "the probe left something beside the workspace"
    );
}

/// The agents a mount started through its exec channel: its children running `agent --stdio`.
fn stdio_agents_of(mount: &MountProcess) -> Vec<i32> {
    let daemon = mount.child.as_ref().unwrap().id() as i32;
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let parent: Option<i32> = after.split(' ').nth(1).and_then(|p| p.parse().ok());
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == Some(daemon) && String::from_utf8_lossy(&cmdline).contains("--stdio") {
            found.push(pid);
        }
    }
    found
}

/// The agent on the channel hangs (SIGSTOP, never continued): the session is given up after
/// its pings go unanswered, a new one starts, and what was written meanwhile lands.
#[test]
fn a_hung_agent_session_is_replaced_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("known.txt"), "known\n").unwrap();
    let url = format!("shell:{}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &[]);
    assert_eq!(
        fs::read_to_string(mount.dir.join("known.txt")).unwrap(),
        "known\n"
    );
    let hung = stdio_agents_of(&mount);
    assert_eq!(hung.len(), 1, "one session: {hung:?}");
    // SAFETY: a signal to the mount's own child, found just above.
    unsafe {
        libc::kill(hung[0], libc::SIGSTOP);
    }
    let wrote = fs::write(mount.dir.join("while-hung.txt"), "written while hung\n");
    wrote.expect("a write while the agent hangs is staged");
    // Only a deadline for a broken test: the ping gives up after about 20 s.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while fs::read_to_string(root.join("while-hung.txt"))
        .ok()
        .as_deref()
        != Some("written while hung\n")
    {
        assert!(
            std::time::Instant::now() < until,
            "the write never landed; log: {}",
            mount.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let now = stdio_agents_of(&mount);
    assert!(
        !now.contains(&hung[0]),
        "the hung session was ended: {now:?}"
    );
    assert_eq!(now.len(), 1, "{now:?}");
}

/// Another user of the sandbox plants the places the probe looks in: `/tmp/sbxfs-0` as a
/// symlink to a directory of the victim's, `/dev/shm/sbxfs-0` as a directory of its own with a
/// program where the agent would be. Neither is used, touched or run: the agent goes beside
/// the workspace, in a directory of the sandbox user's own.
#[test]
fn planted_cache_directories_are_never_used() {
    if !is_root() || require_tool("unshare").is_none() {
        eprintln!("skipped: needs root and unshare");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = dir.path().join("srv/ws");
    fs::create_dir_all(&root).unwrap();
    let marker = dir.path().join("planted-program-ran");
    let report = dir.path().join("victim-after");
    // A program where this very build would be kept (the key is public: version, size and
    // time of the binary), saying the right version at the right size.
    let bin = sbxfs::remote::stdio::Binary::of(env!("CARGO_BIN_EXE_sbxfs").into()).unwrap();
    let size = fs::metadata(env!("CARGO_BIN_EXE_sbxfs")).unwrap().len();
    let planted = format!("/dev/shm/sbxfs-0/exec/{}", bin.key());
    // Inside the sandbox's own /tmp and /dev/shm (private tmpfs mounts, made again for each
    // session), HOME unusable. After each program, the victim's directory is reported.
    let setup = format!(
        "mount -t tmpfs t /tmp && mount -t tmpfs t /dev/shm && \
         mkdir /tmp/victim && echo keep > /tmp/victim/old && touch -d 2000-01-01 /tmp/victim/old && \
         chmod 755 /tmp/victim && ln -s /tmp/victim /tmp/sbxfs-0 && \
         mkdir -p {planted} && \
         printf '#!/bin/sh\\ntouch {marker}\\necho \"{version}\"\\nexit 0\\n' > {planted}/sbxfs && \
         truncate -s {size} {planted}/sbxfs && chmod 755 {planted}/sbxfs && \
         chown -R 65534:65534 /dev/shm/sbxfs-0 && \
         sh; echo $(stat -c %a /tmp/victim) $(cat /tmp/victim/old) >> {report}",
        marker = marker.display(),
        version = bin.version(),
        report = report.display()
    );
    let exec = format!(
        "env HOME=/proc/1 unshare -m sh -c {}",
        shell_words::quote(&setup)
    );
    let url = format!("exec:{}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &["--exec", &exec]);
    fs::write(mount.dir.join("hello.txt"), "hello\n").unwrap();
    ctl_flush(&mount.dir);
    assert_eq!(
        fs::read_to_string(root.join("hello.txt")).unwrap(),
        "hello\n"
    );
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("mount.transport ") && l.ends_with(" exec+agent")),
        "{st}"
    );
    assert!(!marker.exists(), "a planted program ran");
    // The agent is beside the workspace, in a private directory of the sandbox user's.
    let beside = dir.path().join("srv/.sbxfs-0/exec");
    let kept: Vec<_> = fs::read_dir(&beside).unwrap().flatten().collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].path().join("sbxfs").exists());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(dir.path().join("srv/.sbxfs-0"))
            .unwrap()
            .mode()
            & 0o777,
        0o700
    );
    // The victim's directory after the probe and the upload, each in its own session.
    let seen = fs::read_to_string(&report).unwrap();
    assert!(seen.lines().count() >= 2, "{seen}");
    assert!(
        seen.lines().all(|l| l == "755 keep"),
        "the victim's directory was changed: {seen}"
    );
}

#[test]
fn another_builds_agent_copy_is_removed_unless_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (home, root) = (dir.path().join("home"), dir.path().join("ws"));
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("f"), "f\n").unwrap();
    let exec = home.join(".cache/sbxfs/exec");
    // A copy another build left (a rebuild a day would fill the disk), and one a running
    // process uses.
    let old = exec.join("0.0.1-p1-old-build");
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join("sbxfs"), "an older build").unwrap();
    let busy = exec.join("0.0.1-p1-busy-build");
    fs::create_dir_all(&busy).unwrap();
    fs::copy("/bin/sleep", busy.join("sbxfs")).unwrap();
    for d in [
        home.join(".cache/sbxfs"),
        exec.clone(),
        old.clone(),
        busy.clone(),
    ] {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let mut running = Command::new(busy.join("sbxfs")).arg("60").spawn().unwrap();
    let home_s = home.display().to_string();
    let m = MountProcess::start_url_env(
        &format!("shell:{}", root.display()),
        "unused",
        &[],
        &[("HOME", &home_s)],
    );
    assert_eq!(fs::read_to_string(m.dir.join("f")).unwrap(), "f\n");
    let _ = running.kill();
    let _ = running.wait();
    let left: Vec<String> = fs::read_dir(&exec)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!old.exists(), "{left:?}");
    assert!(busy.exists(), "{left:?}");
    assert_eq!(
        left.len(),
        2,
        "this build's copy and the busy one: {left:?}"
    );
}

/// A sandbox runtime that starts processes in mount namespaces of their own after the mount
/// (`unshare -m`, as container runtimes do) gives each a copy of every mount, ours included,
/// and a copy keeps the FUSE session alive after `sbxfs umount` here. The daemon must still
/// push, exit, and free the mountpoint for the next mount (it used to wait for ever, deaf to
/// SIGTERM, and a remount was refused).
#[test]
fn umount_ends_the_daemon_when_another_mount_namespace_holds_a_copy() {
    if !is_root() {
        eprintln!("skipped: unshare -m needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let pids = dir.path().join("pids");
    // Each session of the channel also starts, a second later (after the mount), a process in
    // a mount namespace of its own that outlives the session.
    let exec = format!(
        "sh -c '(sleep 1; exec unshare -m sleep 600) </dev/null >/dev/null 2>&1 & echo $! >> {}; exec sh'",
        pids.display()
    );
    let url = format!("exec:{}", root.display());
    let mut mount = MountProcess::start_url(&url, "unused", &["--exec", &exec]);
    fs::write(mount.dir.join("kept.txt"), "pushed before the exit\n").unwrap();
    let ours = fs::read_link("/proc/self/ns/mnt").unwrap();
    let copied = |pid: &str| {
        fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|ns| ns != ours)
            && fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                .is_ok_and(|m| m.contains(mount.dir.to_str().unwrap()))
    };
    let started = || fs::read_to_string(&pids).unwrap_or_default();
    eventually(
        "a process in another namespace holds a copy of the mount",
        std::time::Duration::from_secs(20),
        || started().lines().any(copied),
    );
    let (code, _, err) = run(Command::new(sbxfs_bin()).arg("umount").arg(&mount.dir));
    let err = String::from_utf8_lossy(&err).into_owned();
    let daemon_gone = mount
        .child
        .as_mut()
        .map(|c| c.try_wait().unwrap().is_some());
    for pid in started().lines() {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
    }
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("still finishing"), "{err}");
    assert_eq!(daemon_gone, Some(true), "the daemon did not exit: {err}");
    assert_eq!(
        fs::read_to_string(root.join("kept.txt")).unwrap(),
        "pushed before the exit\n"
    );
    // The mountpoint is free again.
    let again = MountProcess::start_on(&mount.dir, &url, "unused", &["--exec", "sh"]);
    assert!(again.dir.join("kept.txt").exists());
}

/// A sandbox whose channel stops reading the agent's upload (here: the session that should
/// take it never starts reading) is given up on after 20 s without progress, saying so,
/// and says it is still waiting every 5 s meanwhile — not ten silent minutes.
#[test]
fn an_upload_the_sandbox_stops_reading_fails_in_seconds_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home, marker) = (
        dir.path().join("ws"),
        dir.path().join("home"),
        dir.path().join("probed"),
    );
    fs::create_dir(&root).unwrap();
    fs::create_dir(&home).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // The probe's session is a shell; every session after it never reads its input.
    let exec = format!(
        "env HOME={home} sh -c 'if [ -e {marker} ]; then exec sleep 600; fi; touch {marker}; exec sh'",
        home = home.display(),
        marker = marker.display()
    );
    let started = std::time::Instant::now();
    let (code, _, err) = run(Command::new(sbxfs_bin())
        .arg("mount")
        .arg(format!("exec:{}", root.display()))
        .arg(&mnt)
        .args(["--exec", &exec])
        .stdin(std::process::Stdio::null()));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 5, "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{err}"
    );
    assert!(
        err.contains("the sandbox stopped reading the agent's upload")
            && err.contains("nothing for 20 s"),
        "{err}"
    );
    assert!(
        err.contains("sbxfs mount: still waiting for exec:") && err.contains("(15 s)"),
        "{err}"
    );
    assert!(!fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(mnt.to_str().unwrap()));
}

/// The agent's session over `shell:` killed in the middle of a commit, twice, while a 64 MiB
/// file is saved: the file lands whole and once. A commit that landed with its answer lost is
/// recognised as the mount's own (no conflict copy of itself), nothing stays pending, and
/// the sandbox keeps no half-written temp file.
#[test]
fn a_session_killed_mid_commit_lands_the_file_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let url = format!("shell:{}", root.display());
    let mount = MountProcess::start_url(&url, "unused", &[]);
    let mount_pid = mount.child.as_ref().unwrap().id();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..64 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let src = dir.path().join("src.bin");
    fs::write(&src, &data).unwrap();
    // The agent is the channel's `sh` replaced by `sbxfs agent --stdio`: a child of the mount.
    let agent = || -> Option<u32> {
        fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(p.path().join("stat")).ok()?;
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            let cmd = fs::read(p.path().join("cmdline")).ok()?;
            (ppid == mount_pid && String::from_utf8_lossy(&cmd).contains("--stdio")).then_some(pid)
        })
    };
    // A commit under way holds an unnamed temp file (`O_TMPFILE`) in the workspace.
    let committing = |pid: u32| {
        fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                fs::read_link(fd.path()).is_ok_and(|t| {
                    t.starts_with(&root) && t.to_string_lossy().ends_with("(deleted)")
                })
            })
        })
    };
    let copy = {
        let (src, dst) = (src.clone(), mount.dir.join("big.bin"));
        std::thread::spawn(move || fs::copy(src, dst))
    };
    let mut kills = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while kills < 2 && std::time::Instant::now() < until {
        if let Some(pid) = agent().filter(|&p| committing(p)) {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
            kills += 1;
            // The next session: started by the retry.
            while agent() == Some(pid) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        if kills == 0
            && copy.is_finished()
            && fs::read(root.join("big.bin")).is_ok_and(|d| d == data)
        {
            break;
        }
    }
    copy.join().unwrap().unwrap();
    assert!(kills >= 1, "no commit was ever seen under way to cut");
    ctl_flush(&mount.dir);
    assert!(
        fs::read(root.join("big.bin")).unwrap() == data,
        "the file is not exact"
    );
    let names: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["big.bin"], "after {kills} cut(s)");
    let st = status(&mount.dir);
    assert!(
        st.lines()
            .any(|l| l.starts_with("push_failures ") && l.ends_with("(none)")),
        "{st}"
    );
    assert!(
        st.lines()
            .any(|l| l.starts_with("stats.commits ") && l.ends_with(" 1")),
        "one commit landed: {st}"
    );
}

/// `agent --stdio` stopped by SIGTERM exits, though its exec channel stays open (a `docker
/// exec` session whose other end is gone but not closed): it waited for its input to close.
#[test]
fn a_stdio_agent_exits_on_sigterm_while_its_input_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = std::process::Command::new(crate::common::sbxfs_bin())
        .args(["agent", "--stdio", "--root"])
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("agent ready on stdio") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "the agent ended before it was ready");
    }
    // SAFETY: a signal to our own child, by its pid.
    unsafe {
        libc::kill(agent.id() as i32, libc::SIGTERM);
    }
    // Only a deadline for a broken agent: it lets requests finish for a few seconds.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = agent.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > until {
            let _ = agent.kill();
            let _ = agent.wait();
            panic!("the agent did not exit within 30 s of SIGTERM with its input open");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    drop(agent.stdin.take());
}
