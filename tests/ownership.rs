//! Ownership and permissions on a real mount of a real agent running as another user: the
//! sandbox's owners are shown (so git's ownership guard keeps protecting the developer), the
//! mounting user acts as the sandbox's user, and other local users (with `allow_other`) get the
//! ordinary POSIX checks. These tests act as other users, so they need root.

use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{ctl_flush, run, sbxfs_bin, setpriv_as_root, AgentProcess, MountProcess};

/// The sandbox's user: a uid with no account here, as in a container.
const SANDBOX_UID: u32 = 4242;
/// Another local user of the laptop.
const OTHER_UID: u32 = 5151;
/// A group the other user may be in.
const SHARED_GID: u32 = 5555;

/// An agent started as [`SANDBOX_UID`] through `setpriv`: stopped by pid on drop, even when the
/// test fails.
struct AgentAs {
    child: std::process::Child,
    url: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl AgentAs {
    fn start(setpriv: &Path, root: &Path) -> AgentAs {
        use std::io::BufRead;
        let token = "ownership-token-0123456789".to_string();
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let token_file = dir.path().join("token");
        fs::write(&token_file, &token).unwrap();
        chown_tree(&token_file, SANDBOX_UID, SANDBOX_UID);
        let mut child = Command::new(setpriv)
            .arg(format!("--reuid={SANDBOX_UID}"))
            .arg(format!("--regid={SANDBOX_UID}"))
            .arg("--clear-groups")
            .arg(sbxfs_bin())
            .args(["agent", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .arg("--token-file")
            .arg(&token_file)
            .env("SBXFS_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start sbxfs agent as the sandbox user");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut agent = AgentAs {
            child,
            url: String::new(),
            token,
            _dir: dir,
        };
        agent.url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no ready line from the agent: {line:?}"))
            .to_string();
        agent
    }

    fn mount(&self, extra: &[&str]) -> MountProcess {
        // These tests look in the sandbox right after a write through the mount returns:
        // `close` waits for the push.
        let mut args = vec!["-o", "sync_close"];
        args.extend_from_slice(extra);
        let m = MountProcess::start_url(&self.url, &self.token, &args);
        // The test's temp directories are 0700: let other users reach the mountpoint.
        let parent = m.dir.parent().unwrap();
        fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
        m
    }
}

impl Drop for AgentAs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chown_tree(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
    if p.is_dir() && !p.is_symlink() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), uid, gid);
        }
    }
}

/// A workspace owned by the sandbox's user, reachable by it (the test's temp directory is 0700).
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::tempdir().unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let ws = base.path().join("ws");
    fs::create_dir(&ws).unwrap();
    (base, ws)
}

fn git(dir: &Path, home: &Path, args: &[&str]) -> (i32, String, String) {
    let (code, out, err) = run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // Only the repository's own configuration: no user or system safe.directory.
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE"));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// A git repository in the sandbox whose `core.fsmonitor` would create `marker` on the laptop.
fn hostile_repository(ws: &Path, home: &Path, marker: &Path) -> PathBuf {
    let repo = ws.join("repo");
    fs::create_dir(&repo).unwrap();
    assert_eq!(git(&repo, home, &["init", "-q"]).0, 0);
    fs::write(repo.join("README"), "hello\n").unwrap();
    let hook = format!("touch {}; false", marker.display());
    assert_eq!(git(&repo, home, &["config", "core.fsmonitor", &hook]).0, 0);
    chown_tree(ws, SANDBOX_UID, SANDBOX_UID);
    repo
}

#[test]
fn git_in_the_mount_refuses_a_sandbox_repository_so_its_fsmonitor_never_runs() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (base, ws) = workspace();
    let home = base.path().join("home");
    fs::create_dir(&home).unwrap();
    let marker = base.path().join("PWNED");
    hostile_repository(&ws, &home, &marker);
    let agent = AgentAs::start(&setpriv, &ws);
    let m = agent.mount(&[]);
    let repo = m.dir.join("repo");
    // The sandbox's owner is shown, not the mounting user.
    let meta = fs::metadata(repo.join(".git/config")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (SANDBOX_UID, SANDBOX_UID));
    let (code, _, err) = git(&repo, &home, &["status"]);
    assert_ne!(code, 0, "git accepted a repository owned by someone else");
    assert!(err.contains("dubious ownership"), "{err}");
    assert!(!marker.exists(), "the sandbox ran a command on the laptop");
    // Always nosuid,nodev.
    let line = mountinfo_line(&m.dir);
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    // The daemon checks, not the kernel.
    assert!(!line.contains("default_permissions"), "{line}");
}

fn mountinfo_line(dir: &Path) -> String {
    let needle = format!(" {} ", dir.display());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .rev()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("{} is not mounted", dir.display()))
        .to_string()
}

fn status(m: &MountProcess) -> serde_json::Value {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .arg("ctl")
        .arg("--mount")
        .arg(&m.dir)
        .args(["status", "--json"]));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn default_permissions_hands_the_checks_to_the_kernel_against_the_owners_shown() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (_base, ws) = workspace();
    fs::write(ws.join("secret.txt"), "secret\n").unwrap();
    fs::write(ws.join("public.txt"), "public\n").unwrap();
    chown_tree(&ws, SANDBOX_UID, SANDBOX_UID);
    set_mode(&ws.join("secret.txt"), 0o600);
    let agent = AgentAs::start(&setpriv, &ws);
    let m = agent.mount(&["-o", "allow_other,default_permissions"]);
    assert!(mountinfo_line(&m.dir).contains("default_permissions"));
    let v = status(&m);
    assert_eq!(v["mount"]["permissions"], "kernel");
    assert_eq!(v["mount"]["idmap"], "none");
    let meta = fs::metadata(m.dir.join("secret.txt")).unwrap();
    assert_eq!(meta.uid(), SANDBOX_UID);
    let (code, err) = as_other(&setpriv, &[], &m.dir, "cat secret.txt");
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(as_other(&setpriv, &[], &m.dir, "cat public.txt").0, 0);
}

#[test]
fn with_idmap_user_files_show_as_yours_and_git_trusts_the_repository() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (base, ws) = workspace();
    let home = base.path().join("home");
    fs::create_dir(&home).unwrap();
    let marker = base.path().join("PWNED");
    hostile_repository(&ws, &home, &marker);
    fs::write(ws.join("roots.txt"), "r\n").unwrap();
    let agent = AgentAs::start(&setpriv, &ws);
    let m = agent.mount(&["-o", "idmap=user"]);
    let repo = m.dir.join("repo");
    let meta = fs::metadata(repo.join(".git/config")).unwrap();
    let me = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    assert_eq!((meta.uid(), meta.gid()), me);
    // Other owners are shown as they are (root's file stays root's: uid 0 here too).
    assert_eq!(fs::metadata(m.dir.join("roots.txt")).unwrap().uid(), 0);
    // What the README warns about: the guard is off, and the repository's fsmonitor runs.
    let (code, _, err) = git(&repo, &home, &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        marker.exists(),
        "idmap=user is documented to trust the sandbox"
    );
    // A chown to yourself is the sandbox user's own owner: nothing changes there.
    std::os::unix::fs::chown(repo.join("README"), Some(me.0), Some(me.1)).unwrap();
    let inside = fs::metadata(ws.join("repo/README")).unwrap();
    assert_eq!((inside.uid(), inside.gid()), (SANDBOX_UID, SANDBOX_UID));
    // The status names the mapping and the sandbox's identity.
    let v = status(&m);
    assert_eq!(v["mount"]["permissions"], "sbxfs");
    assert_eq!(v["mount"]["idmap"], "user");
    assert_eq!(v["mount"]["sandbox_user"]["uid"], SANDBOX_UID);
    assert_eq!(v["mount"]["sandbox_user"]["gid"], SANDBOX_UID);
}

/// Run `sh -c script` as [`OTHER_UID`] with the given supplementary groups: exit code and
/// stderr.
fn as_other(setpriv: &Path, groups: &[u32], dir: &Path, script: &str) -> (i32, String) {
    let mut cmd = Command::new(setpriv);
    cmd.arg(format!("--reuid={OTHER_UID}"))
        .arg(format!("--regid={OTHER_UID}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", list.join(",")));
    }
    let (code, _, err) = run(cmd.args(["sh", "-c", script]).current_dir(dir));
    (code, String::from_utf8_lossy(&err).into_owned())
}

fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn another_local_user_gets_the_posix_checks_against_the_owners_shown() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (_base, ws) = workspace();
    fs::write(ws.join("secret.txt"), "secret\n").unwrap();
    fs::write(ws.join("public.txt"), "public\n").unwrap();
    fs::create_dir(ws.join("private")).unwrap();
    fs::write(ws.join("private/inside.txt"), "inside\n").unwrap();
    fs::create_dir(ws.join("sticky")).unwrap();
    fs::write(ws.join("sticky/victim.txt"), "victim\n").unwrap();
    fs::write(ws.join("group.txt"), "").unwrap();
    fs::write(ws.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    chown_tree(&ws, SANDBOX_UID, SANDBOX_UID);
    std::os::unix::fs::chown(ws.join("group.txt"), None, Some(SHARED_GID)).unwrap();
    set_mode(&ws, 0o755);
    set_mode(&ws.join("secret.txt"), 0o600);
    set_mode(&ws.join("public.txt"), 0o644);
    set_mode(&ws.join("private"), 0o700);
    set_mode(&ws.join("sticky"), 0o1777);
    set_mode(&ws.join("sticky/victim.txt"), 0o666);
    set_mode(&ws.join("group.txt"), 0o660);
    set_mode(&ws.join("run.sh"), 0o744);
    let agent = AgentAs::start(&setpriv, &ws);
    let m = agent.mount(&["-o", "allow_other"]);
    let denied = |what: &str, (code, err): (i32, String), says: &str| {
        assert_ne!(code, 0, "{what} was allowed");
        assert!(err.contains(says), "{what}: {err}");
    };
    let allowed = |what: &str, (code, err): (i32, String)| {
        assert_eq!(code, 0, "{what}: {err}");
    };
    let d = &m.dir;
    allowed(
        "reading a 0644 file",
        as_other(&setpriv, &[], d, "cat public.txt"),
    );
    denied(
        "reading a 0600 file of the sandbox user",
        as_other(&setpriv, &[], d, "cat secret.txt"),
        "Permission denied",
    );
    // access(2) answers the same.
    allowed(
        "access(R_OK) of a 0644 file",
        as_other(&setpriv, &[], d, "test -r public.txt"),
    );
    assert_ne!(as_other(&setpriv, &[], d, "test -r secret.txt").0, 0);
    assert_ne!(as_other(&setpriv, &[], d, "test -w public.txt").0, 0);
    // The mounting user looked the name up first: the kernel must still ask on the other
    // user's behalf.
    assert_eq!(
        fs::read_to_string(d.join("private/inside.txt")).unwrap(),
        "inside\n"
    );
    denied(
        "a lookup in a 0700 directory",
        as_other(&setpriv, &[], d, "stat private/inside.txt"),
        "Permission denied",
    );
    // Nor a name the mounting user has just created there.
    fs::write(d.join("private/fresh.txt"), "fresh\n").unwrap();
    denied(
        "a lookup of a new name in a 0700 directory",
        as_other(&setpriv, &[], d, "cat private/fresh.txt"),
        "Permission denied",
    );
    denied(
        "listing a 0700 directory",
        as_other(&setpriv, &[], d, "ls private"),
        "Permission denied",
    );
    denied(
        "unlinking another's file in a sticky directory",
        as_other(&setpriv, &[], d, "rm -f sticky/victim.txt"),
        "Operation not permitted",
    );
    assert!(ws.join("sticky/victim.txt").exists());
    denied(
        "chmod of a file it does not own",
        as_other(&setpriv, &[], d, "chmod 666 public.txt"),
        "Operation not permitted",
    );
    assert_eq!(
        fs::metadata(ws.join("public.txt")).unwrap().mode() & 0o777,
        0o644
    );
    denied(
        "creating a file in the sandbox user's 0755 directory",
        as_other(&setpriv, &[], d, "touch new.txt"),
        "Permission denied",
    );
    assert!(!ws.join("new.txt").exists());
    // Executing needs the x bit of the caller's class, not just any x bit.
    denied(
        "executing a 0744 file of the sandbox user",
        as_other(&setpriv, &[], d, "./run.sh"),
        "Permission denied",
    );
    allowed(
        "executing it as the mounting user",
        (run(&mut Command::new(d.join("run.sh"))).0, String::new()),
    );
    // Queries run in the sandbox as its user: not for another local user.
    let bin_dir = tempfile::tempdir().unwrap();
    set_mode(bin_dir.path(), 0o755);
    let bin = bin_dir.path().join("sbxfs");
    crate::common::copy_program(&sbxfs_bin(), &bin);
    let (_, out, err) = run(Command::new(&setpriv)
        .arg(format!("--reuid={OTHER_UID}"))
        .arg(format!("--regid={OTHER_UID}"))
        .arg("--clear-groups")
        .arg(&bin)
        .args(["grep", "secret", "."])
        .current_dir(d));
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    assert!(
        !out.contains("secret.txt"),
        "another user's query read it: {out}"
    );
    assert!(
        !err.contains("No such file"),
        "the query did not run: {err}"
    );
    // user.* attributes follow the mode; an ACL is the owner's to set.
    let setxattr = |name: &str, hex: &str| {
        format!(
            "python3 -c \"import os; os.setxattr('public.txt', '{name}', bytes.fromhex('{hex}'))\""
        )
    };
    denied(
        "a user.* attribute on a file it may not write",
        as_other(&setpriv, &[], d, &setxattr("user.k", "76")),
        "Permission denied",
    );
    // A valid ACL (user::rw-, group::r--, other::rw-): the kernel refuses a malformed one itself.
    let acl = "0200000001000600ffffffff04000400ffffffff20000600ffffffff";
    denied(
        "an ACL on a file it does not own",
        as_other(&setpriv, &[], d, &setxattr("system.posix_acl_access", acl)),
        "Operation not permitted",
    );
    assert_eq!(
        fs::metadata(ws.join("public.txt")).unwrap().mode() & 0o777,
        0o644
    );
    // A hard link to a file it may not write is refused (protected_hardlinks).
    denied(
        "a hard link to another's 0644 file",
        as_other(&setpriv, &[], d, "ln public.txt sticky/pinned"),
        "Operation not permitted",
    );
    assert!(!ws.join("sticky/pinned").exists());
    // A world-writable directory takes its new file; the agent makes it, so it is the
    // sandbox user's (as a file made over sshfs is the remote login's).
    allowed(
        "creating a file in a 1777 directory",
        as_other(&setpriv, &[], d, "echo mine > sticky/mine.txt"),
    );
    assert_eq!(
        fs::read_to_string(ws.join("sticky/mine.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        fs::metadata(d.join("sticky/mine.txt")).unwrap().uid(),
        SANDBOX_UID
    );
    // The group's write bit applies through a supplementary group, and only through it.
    denied(
        "writing a 0660 file of a group it is not in",
        as_other(&setpriv, &[], d, "echo no >> group.txt"),
        "Permission denied",
    );
    allowed(
        "writing a 0660 file through a supplementary group",
        as_other(&setpriv, &[SHARED_GID], d, "echo yes >> group.txt"),
    );
    drop(m);
    assert_eq!(fs::read_to_string(ws.join("group.txt")).unwrap(), "yes\n");
}

#[test]
fn the_mounting_user_acts_as_the_sandbox_user_not_as_itself() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (_base, ws) = workspace();
    fs::write(ws.join("theirs.txt"), "old\n").unwrap();
    fs::write(ws.join("read_only.txt"), "keep\n").unwrap();
    chown_tree(&ws, SANDBOX_UID, SANDBOX_UID);
    fs::write(ws.join("roots.txt"), "root's\n").unwrap();
    set_mode(&ws.join("roots.txt"), 0o400);
    set_mode(&ws.join("read_only.txt"), 0o444);
    let agent = AgentAs::start(&setpriv, &ws);
    // The agent says who it runs as.
    let client = sbxfs::remote::client::AgentClient::new(&agent.url, &agent.token).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(sbxfs::remote::Remote::info(&client)).unwrap();
    let user = info.user.expect("the agent's identity");
    assert_eq!((user.uid, user.gid), (SANDBOX_UID, SANDBOX_UID));
    assert!(user.groups.is_empty(), "{:?}", user.groups);
    let m = agent.mount(&[]);
    // A file of the sandbox user, shown under its uid, is writable by the mounting user.
    fs::write(m.dir.join("theirs.txt"), "new\n").unwrap();
    // New files are the sandbox user's.
    fs::write(m.dir.join("made.txt"), "made\n").unwrap();
    assert_eq!(
        fs::metadata(m.dir.join("made.txt")).unwrap().uid(),
        SANDBOX_UID
    );
    // Root here is the sandbox user there: root's 0400 file and the user's own 0444 file are
    // not writable, though local root could write both.
    let write = |name: &str| fs::OpenOptions::new().write(true).open(m.dir.join(name));
    assert_eq!(
        write("roots.txt").unwrap_err().kind(),
        std::io::ErrorKind::PermissionDenied
    );
    assert_eq!(
        write("read_only.txt").unwrap_err().kind(),
        std::io::ErrorKind::PermissionDenied
    );
    assert!(fs::read(m.dir.join("roots.txt")).is_err());
    // access(2) answers as the sandbox user too.
    let c = std::ffi::CString::new(
        m.dir
            .join("read_only.txt")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::W_OK) }, -1);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::R_OK) }, 0);
    // chmod of its own file works; of root's, not.
    fs::set_permissions(
        m.dir.join("read_only.txt"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let e = fs::set_permissions(m.dir.join("roots.txt"), fs::Permissions::from_mode(0o666))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    drop(m);
    assert_eq!(fs::read_to_string(ws.join("theirs.txt")).unwrap(), "new\n");
    assert_eq!(
        fs::read_to_string(ws.join("roots.txt")).unwrap(),
        "root's\n"
    );
    assert_eq!(
        fs::read_to_string(ws.join("read_only.txt")).unwrap(),
        "keep\n"
    );
    assert_eq!(
        fs::metadata(ws.join("read_only.txt")).unwrap().mode() & 0o777,
        0o644
    );
}

/// A mount made by [`OTHER_UID`] through `fusermount3`, as a developer's mount is: unmounted
/// and stopped by pid on drop.
fn mount_as_other(setpriv: &Path, agent: &AgentAs, base: &Path) -> common::MountedChild {
    use std::io::BufRead;
    let mnt = base.join("user-mnt");
    let cache = base.join("user-cache");
    let runtime = base.join("user-runtime");
    for d in [&mnt, &cache, &runtime] {
        fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    set_mode(&runtime, 0o700);
    let mut child = Command::new(setpriv)
        .arg(format!("--reuid={OTHER_UID}"))
        .arg(format!("--regid={OTHER_UID}"))
        .arg("--clear-groups")
        .arg(sbxfs_bin())
        .arg("mount")
        .arg(&agent.url)
        .arg(&mnt)
        .env("SBXFS_TOKEN", &agent.token)
        .env("XDG_CACHE_HOME", &cache)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("HOME", base)
        .stdout(std::process::Stdio::piped())
        .stderr(fs::File::create(base.join("user-mount.log")).unwrap())
        .spawn()
        .expect("start sbxfs mount as another user");
    let stdout = child.stdout.take().unwrap();
    let m = common::MountedChild { child, dir: mnt };
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("mounted"),
        "the user's mount did not start: {line:?}: {}",
        fs::read_to_string(base.join("user-mount.log")).unwrap_or_default()
    );
    m
}

#[test]
fn a_users_own_mount_acts_as_the_sandbox_user_and_git_still_refuses_the_repository() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    // fusermount3 opens /dev/fuse as the user: where it is root's alone, no user can mount.
    let dev = fs::metadata("/dev/fuse").map(|m| m.mode()).unwrap_or(0);
    if dev & 0o006 != 0o006 {
        eprintln!("skipping: /dev/fuse is not open to other users here (mode {dev:o})");
        return;
    }
    let (base, ws) = workspace();
    let home = base.path().join("home");
    fs::create_dir(&home).unwrap();
    let marker = base.path().join("PWNED");
    hostile_repository(&ws, &home, &marker);
    fs::write(ws.join("theirs.txt"), "old\n").unwrap();
    chown_tree(&ws.join("theirs.txt"), SANDBOX_UID, SANDBOX_UID);
    fs::write(ws.join("roots.txt"), "root's\n").unwrap();
    set_mode(&ws.join("roots.txt"), 0o600);
    let agent = AgentAs::start(&setpriv, &ws);
    let m = mount_as_other(&setpriv, &agent, base.path());
    let d = &m.dir;
    // The user writes the sandbox user's 0644 file (shown as uid 4242, not theirs) ...
    let (code, err) = as_other(&setpriv, &[], d, "echo new > theirs.txt");
    assert_eq!(code, 0, "{err}");
    // ... but not what the sandbox user could not read.
    let (code, err) = as_other(&setpriv, &[], d, "cat roots.txt");
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    // git run by that user in the mount refuses the sandbox's repository.
    let script = format!(
        "HOME={} GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -C repo status",
        home.display()
    );
    let (code, err) = as_other(&setpriv, &[], d, &script);
    assert_ne!(code, 0, "git accepted the sandbox's repository");
    assert!(err.contains("dubious ownership"), "{err}");
    assert!(!marker.exists(), "the sandbox ran a command on the laptop");
    drop(m);
    assert_eq!(fs::read_to_string(ws.join("theirs.txt")).unwrap(), "new\n");
}

#[test]
fn a_file_another_local_user_makes_is_its_own_where_the_agent_is_root() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (_base, ws) = workspace();
    fs::create_dir(ws.join("shared")).unwrap();
    set_mode(&ws.join("shared"), 0o1777);
    fs::create_dir(ws.join("team")).unwrap();
    std::os::unix::fs::chown(ws.join("team"), None, Some(SHARED_GID)).unwrap();
    set_mode(&ws.join("team"), 0o2777);
    let agent = AgentProcess::start(&ws);
    let m = MountProcess::start(&agent, &["-o", "allow_other"]);
    fs::set_permissions(m.dir.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    // What the POSIX suites do as a second user: make files, then use them as their owner.
    let (code, err) = as_other(
        &setpriv,
        &[],
        &m.dir,
        "set -e; cd shared; echo hi > f; chmod 600 f; truncate -s 1 f; mv f g; \
         mkdir d; chmod 700 d; ln -s g l; touch -d 2020-01-01 g; : > e; chmod 640 e; \
         cd ../team; : > t; mkdir td",
    );
    assert_eq!(code, 0, "{err}; log: {}", m.log_text());
    ctl_flush(&m.dir);
    let inside = |p: &str| fs::symlink_metadata(ws.join(p)).unwrap();
    for p in ["shared/g", "shared/d", "shared/l", "shared/e"] {
        assert_eq!(
            (inside(p).uid(), inside(p).gid()),
            (OTHER_UID, OTHER_UID),
            "{p}"
        );
    }
    assert_eq!(inside("shared/g").mode() & 0o7777, 0o600);
    assert_eq!(inside("shared/g").len(), 1);
    assert_eq!(inside("shared/e").mode() & 0o7777, 0o640);
    assert_eq!(fs::read_to_string(ws.join("shared/g")).unwrap(), "h");
    // In a set-group-ID directory the group is the directory's, as on ext4.
    assert_eq!(inside("team/t").gid(), SHARED_GID);
    assert_eq!(inside("team/td").gid(), SHARED_GID);
    // The mount shows the same owners.
    let shown = fs::metadata(m.dir.join("shared/g")).unwrap();
    assert_eq!((shown.uid(), shown.gid()), (OTHER_UID, OTHER_UID));
    // The mounting user's own files stay the sandbox user's.
    fs::write(m.dir.join("shared/mine"), "x").unwrap();
    ctl_flush(&m.dir);
    assert_eq!(inside("shared/mine").uid(), 0);
}

#[test]
fn another_local_user_is_held_to_the_files_acls() {
    let Some(setpriv) = setpriv_as_root() else {
        return;
    };
    let (_base, ws) = workspace();
    fs::write(ws.join("denied.txt"), "not for you\n").unwrap();
    fs::write(ws.join("masked.txt"), "kept\n").unwrap();
    fs::write(ws.join("granted.txt"), "for you\n").unwrap();
    chown_tree(&ws, SANDBOX_UID, SANDBOX_UID);
    set_mode(&ws, 0o755);
    set_mode(&ws.join("denied.txt"), 0o644);
    set_mode(&ws.join("masked.txt"), 0o666);
    set_mode(&ws.join("granted.txt"), 0o600);
    let acl = |spec: &str, file: &str| {
        let (code, _, err) = run(Command::new("setfacl")
            .args(["-m", spec])
            .arg(ws.join(file)));
        assert_eq!(
            code,
            0,
            "setfacl {spec} {file}: {}",
            String::from_utf8_lossy(&err)
        );
    };
    acl(&format!("u:{OTHER_UID}:---"), "denied.txt");
    acl(&format!("u:{OTHER_UID}:r--,m::r--"), "masked.txt");
    acl(&format!("u:{OTHER_UID}:r--"), "granted.txt");
    let agent = AgentAs::start(&setpriv, &ws);
    let m = agent.mount(&["-o", "allow_other"]);
    let d = &m.dir;
    // The mode bits alone would let them read a 0644 file: the ACL says no.
    let (code, err) = as_other(&setpriv, &[], d, "cat denied.txt");
    assert_ne!(code, 0, "read a file whose ACL denies them");
    assert!(err.contains("Permission denied"), "{err}");
    assert_ne!(as_other(&setpriv, &[], d, "test -r denied.txt").0, 0);
    // 0666 would let them append: their entry, under the mask, is read only.
    let (code, _) = as_other(&setpriv, &[], d, "cat masked.txt");
    assert_eq!(code, 0, "reading what the ACL grants");
    let (code, _) = as_other(&setpriv, &[], d, "echo more >> masked.txt");
    assert_ne!(code, 0, "appended to a file whose ACL makes them read only");
    assert_eq!(fs::read_to_string(ws.join("masked.txt")).unwrap(), "kept\n");
    // And an ACL grants what the mode bits do not.
    let (code, err) = as_other(&setpriv, &[], d, "cat granted.txt");
    assert_eq!(code, 0, "reading a 0600 file their ACL entry grants: {err}");
}
