//! Real mounts over a real agent process: what editors, git and the shell do, the errors they
//! see, and that no edit is ever lost or half-written. Every mount is unmounted even on failure.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    agent: AgentProcess,
    mount: MountProcess,
}

fn setup() -> Setup {
    setup_with(&[])
}

fn setup_with(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, extra);
    Setup {
        _dir: dir,
        root,
        agent,
        mount,
    }
}

fn sh(dir: &Path, script: &str) -> (i32, String, String) {
    let (code, out, err) = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

#[test]
fn shell_tools_work_through_the_mount() {
    let s = setup();
    let (r, m) = (&s.root, &s.mount.dir);
    fs::create_dir_all(r.join("src/deep")).unwrap();
    fs::write(r.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(r.join("src/deep/x.txt"), "deep").unwrap();
    let (code, out, _) = sh(m, "ls -l src && find . | sort && cat src/main.rs");
    assert_eq!(code, 0);
    assert!(
        out.contains("main.rs") && out.contains("./src/deep/x.txt") && out.contains("fn main"),
        "{out}"
    );

    // cp -a in and out: contents, modes and times preserved both ways.
    let (code, _, err) = sh(
        m,
        "cp -a src copy && cp -a copy /tmp/../$PWD/../out 2>/dev/null; true",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = sh(
        m,
        &format!(
            "cp -a {} ./outside-in",
            env!("CARGO_MANIFEST_DIR").to_string() + "/tests/vectors"
        ),
    );
    assert_eq!(code, 0, "{err}");
    ctl_flush(m);
    let (code, _, _) = sh(
        r,
        &format!(
            "diff -r {}/tests/vectors outside-in",
            env!("CARGO_MANIFEST_DIR")
        ),
    );
    assert_eq!(code, 0, "cp -a into the mount changed the files");
    let orig = fs::metadata(format!(
        "{}/tests/vectors/scan.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let copied = fs::metadata(r.join("outside-in/scan.json")).unwrap();
    assert_eq!(orig.mtime(), copied.mtime(), "cp -a keeps mtime");
    let out_dir = tempfile::tempdir().unwrap();
    let (code, _, err) = sh(m, &format!("cp -a src {}/back", out_dir.path().display()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        fs::read(out_dir.path().join("back/deep/x.txt")).unwrap(),
        b"deep"
    );

    // tar -x of 500 files.
    let src = tempfile::tempdir().unwrap();
    for i in 0..500 {
        fs::write(
            src.path().join(format!("f{i:03}.txt")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    let tar = out_dir.path().join("t.tar");
    assert!(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(src.path())
        .arg(".")
        .status()
        .unwrap()
        .success());
    fs::create_dir(m.join("untar")).unwrap();
    let (code, _, err) = sh(&m.join("untar"), &format!("tar -xf {}", tar.display()));
    assert_eq!(code, 0, "{err}");
    ctl_flush(m);
    assert_eq!(fs::read_dir(r.join("untar")).unwrap().count(), 500);
    assert_eq!(
        fs::read_to_string(r.join("untar/f499.txt")).unwrap(),
        "file 499\n"
    );

    // Namespace operations, attributes, symlinks.
    let (code, _, err) = sh(
        m,
        "mkdir d && echo hi > d/f && mv d/f d/g && ln -s g d/link && chmod 600 d/g && \
         truncate -s 1 d/g && touch -d '2020-01-02 03:04:05' d/g && rm d/link && mkdir e && rmdir e",
    );
    assert_eq!(code, 0, "{err}");
    ctl_flush(m);
    let g = fs::metadata(r.join("d/g")).unwrap();
    assert_eq!((g.len(), g.permissions().mode() & 0o777), (1, 0o600));
    assert_eq!(g.mtime(), 1_577_934_245);
    assert!(!r.join("d/link").exists() && !r.join("e").exists() && !r.join("d/f").exists());
    fs::write(r.join("target.txt"), "through a link").unwrap();
    std::os::unix::fs::symlink("target.txt", r.join("alias")).unwrap();
    assert_eq!(
        fs::read_to_string(m.join("alias")).unwrap(),
        "through a link"
    );
    assert_eq!(
        fs::read_link(m.join("alias")).unwrap(),
        Path::new("target.txt")
    );
}

#[test]
fn stat_shows_the_sandbox_inode_numbers_times_and_owners() {
    let s = setup();
    fs::write(s.root.join("f"), "x").unwrap();
    let inside = fs::metadata(s.root.join("f")).unwrap();
    let through = fs::metadata(s.mount.dir.join("f")).unwrap();
    assert_eq!(through.ino(), inside.ino());
    assert_eq!(
        (through.mtime(), through.mtime_nsec()),
        (inside.mtime(), inside.mtime_nsec())
    );
    assert_eq!(
        (through.ctime(), through.ctime_nsec()),
        (inside.ctime(), inside.ctime_nsec())
    );
    // The sandbox's owners, as the sandbox has them (idmap=none).
    assert_eq!((through.uid(), through.gid()), (inside.uid(), inside.gid()));
    // A chown that keeps the owner succeeds (and changes nothing in the sandbox).
    let me = rustix::process::getuid().as_raw();
    std::os::unix::fs::chown(s.mount.dir.join("f"), Some(me), None).unwrap();
    assert_eq!(fs::metadata(s.root.join("f")).unwrap().uid(), inside.uid());
}

/// The error a syscall gives, as an errno.
fn errno<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

#[test]
fn errors_are_the_ones_ext4_gives() {
    let s = setup();
    let local = tempfile::tempdir().unwrap();
    for base in [local.path(), s.mount.dir.as_path()] {
        fs::create_dir(base.join("dir")).unwrap();
        fs::write(base.join("dir/file"), "x").unwrap();
        fs::write(base.join("file"), "y").unwrap();
    }
    type Check = (&'static str, Box<dyn Fn(&Path) -> i32>);
    let checks: Vec<Check> = vec![
        (
            "open missing",
            Box::new(|b: &Path| errno(fs::File::open(b.join("missing")))),
        ),
        (
            "mkdir existing",
            Box::new(|b: &Path| errno(fs::create_dir(b.join("dir")))),
        ),
        (
            "create_new existing",
            Box::new(|b: &Path| {
                errno(
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(b.join("file")),
                )
            }),
        ),
        (
            "rmdir non-empty",
            Box::new(|b: &Path| errno(fs::remove_dir(b.join("dir")))),
        ),
        (
            "rmdir a file",
            Box::new(|b: &Path| errno(fs::remove_dir(b.join("file")))),
        ),
        (
            "unlink a directory",
            Box::new(|b: &Path| errno(fs::remove_file(b.join("dir")))),
        ),
        (
            "open under a file",
            Box::new(|b: &Path| errno(fs::File::open(b.join("file/x")))),
        ),
        (
            "write a directory",
            Box::new(|b: &Path| errno(fs::OpenOptions::new().write(true).open(b.join("dir")))),
        ),
        (
            "rename onto non-empty dir",
            Box::new(|b: &Path| {
                let _ = fs::create_dir(b.join("empty"));
                errno(fs::rename(b.join("empty"), b.join("dir")))
            }),
        ),
        (
            "readlink a file",
            Box::new(|b: &Path| errno(fs::read_link(b.join("file")))),
        ),
        (
            "unlink missing",
            Box::new(|b: &Path| errno(fs::remove_file(b.join("nope")))),
        ),
    ];
    for (what, f) in &checks {
        let want = f(local.path());
        let got = f(&s.mount.dir);
        assert_eq!(
            got, want,
            "{what}: the mount gives errno {got}, ext4 gives {want}"
        );
        assert_ne!(want, 0, "{what} should fail");
    }
}

/// What vim does on `:w` with its default 'backupcopy=auto': probe that it may create and chown
/// a file (`4913`), rename the original to a backup, write the new file, fsync, set the mode.
fn vim_style_save(dir: &Path, name: &str, content: &[u8]) {
    let file = dir.join(name);
    let mode = fs::metadata(&file).unwrap().permissions().mode();
    let probe = dir.join("4913");
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .unwrap();
    let meta = fs::metadata(&file).unwrap();
    std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid())).unwrap();
    let pm = f.metadata().unwrap();
    assert_eq!(
        (pm.uid(), pm.gid()),
        (meta.uid(), meta.gid()),
        "vim would fall back to an in-place write"
    );
    drop(f);
    fs::remove_file(&probe).unwrap();
    let backup = dir.join(format!("{name}~"));
    fs::rename(&file, &backup).unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .unwrap();
    f.write_all(content).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
    fs::remove_file(&backup).unwrap();
}

#[test]
fn a_vim_style_save_leaves_the_right_content_and_mode_in_the_sandbox() {
    let s = setup();
    fs::write(s.root.join("script.sh"), "#!/bin/sh\necho old\n").unwrap();
    fs::set_permissions(s.root.join("script.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    vim_style_save(&s.mount.dir, "script.sh", b"#!/bin/sh\necho new\n");
    assert_eq!(
        fs::read_to_string(s.root.join("script.sh")).unwrap(),
        "#!/bin/sh\necho new\n"
    );
    assert_eq!(
        fs::metadata(s.root.join("script.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o751
    );
    let names: Vec<String> = fs::read_dir(&s.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["script.sh"]);
}

#[test]
fn git_works_inside_the_mount_and_trusts_stat_data_recorded_in_the_sandbox() {
    if require_tool("git").is_none() {
        return;
    }
    let s = setup();
    let m = &s.mount.dir;
    fs::create_dir(m.join("repo")).unwrap();
    for i in 0..20 {
        fs::write(m.join(format!("repo/f{i}.txt")), format!("content {i}\n")).unwrap();
    }
    let git = "git -c user.name=t -c user.email=t@example.com";
    let (code, out, err) = sh(
        &m.join("repo"),
        &format!("git init -q && git add -A && {git} commit -qm init && git status --porcelain"),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "", "a clean tree right after commit");
    fs::write(m.join("repo/f3.txt"), "changed\n").unwrap();
    let (_, out, _) = sh(&m.join("repo"), "git status --porcelain");
    assert_eq!(out, " M f3.txt\n");

    // A repository committed inside the sandbox: git status through the mount must not read
    // every file's content (its index's stat data still matches).
    let inner = s.root.join("inner");
    fs::create_dir(&inner).unwrap();
    let big = "x".repeat(200_000);
    for i in 0..30 {
        fs::write(inner.join(format!("g{i}.txt")), &big).unwrap();
    }
    // Old mtimes, as for files that were not just written: git re-hashes "racily clean" files
    // (modified in the same second as its index) wherever it runs.
    let (code, _, err) = sh(
        &inner,
        &format!(
            "touch -d '1 hour ago' g*.txt && git init -q && git add -A && {git} commit -qm inside"
        ),
    );
    assert_eq!(code, 0, "{err}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = s.agent.client();
    let before = rt.block_on(client.agent_stats()).unwrap()["bytes_read"]
        .as_u64()
        .unwrap();
    let (code, out, err) = sh(&m.join("inner"), "git status --porcelain");
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    let read = rt.block_on(client.agent_stats()).unwrap()["bytes_read"]
        .as_u64()
        .unwrap()
        - before;
    assert!(
        read < 1_000_000,
        "git status read {read} bytes: it re-hashed the files (6 MB)"
    );
}

#[test]
fn a_reader_in_the_sandbox_never_sees_a_half_written_save() {
    let s = setup();
    const SIZE: usize = 64 << 20;
    fs::write(s.root.join("big.bin"), vec![b'a'; SIZE]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, path) = (stop.clone(), s.root.join("big.bin"));
    let poller = std::thread::spawn(move || {
        let mut reads = 0;
        while !stop2.load(Ordering::Relaxed) {
            let data = fs::read(&path).unwrap();
            assert_eq!(data.len(), SIZE, "a reader saw a file of the wrong size");
            assert!(
                data.iter().all(|&b| b == data[0]),
                "a reader saw a mix of old and new content"
            );
            reads += 1;
        }
        reads
    });
    // Written by a process of its own: in this test binary, a child another test spawns
    // inherits the descriptor and closes it at exec, a flush that publishes what is written
    // so far (the close-to-open rule, not a half-written commit).
    let script = "import os, sys\n\
                  f = open(sys.argv[1], 'wb', buffering=0)\n\
                  for _ in range(64):\n    f.write(b'b' * (1 << 20))\n\
                  os.fsync(f.fileno())\n\
                  f.close()\n";
    let (code, _, err) = run(Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(s.mount.dir.join("big.bin")));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    stop.store(true, Ordering::Relaxed);
    assert!(poller.join().unwrap() >= 1);
    assert!(fs::read(s.root.join("big.bin"))
        .unwrap()
        .iter()
        .all(|&b| b == b'b'));
}

#[test]
fn a_file_written_in_the_sandbox_shows_after_the_ttl() {
    let s = setup_with(&["--attr-ttl-ms", "300"]);
    fs::write(s.root.join("a.txt"), "first").unwrap();
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "first"
    );
    fs::write(s.root.join("a.txt"), "second version").unwrap();
    fs::write(s.root.join("new.txt"), "new").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "second version"
    );
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("new.txt")).unwrap(),
        "new"
    );
}

#[test]
fn a_save_while_the_agent_is_down_reports_eio_keeps_the_data_and_pushes_later() {
    let mut s = setup();
    fs::write(s.root.join("doc.txt"), "original").unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(s.mount.dir.join("doc.txt"))
        .unwrap();
    f.write_all(b"the user's edit").unwrap();
    let addr = s.agent.addr;
    s.agent.kill();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(f);
    assert_eq!(
        fs::read_to_string(s.root.join("doc.txt")).unwrap(),
        "original",
        "target intact"
    );
    // Other operations fail with EIO promptly rather than hang.
    let t = std::time::Instant::now();
    let e = fs::read_dir(s.mount.dir.join("elsewhere"))
        .map(|_| ())
        .unwrap_err();
    assert!(e.raw_os_error() == Some(libc::EIO) || e.raw_os_error() == Some(libc::ENOENT));
    assert!(t.elapsed() < Duration::from_secs(20));
    // The agent comes back: the staged edit is pushed by itself.
    s.agent = AgentProcess::start_on(&s.root, addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fs::read_to_string(s.root.join("doc.txt")).unwrap() != "the user's edit" {
        assert!(
            std::time::Instant::now() < deadline,
            "the staged edit was not pushed after restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("doc.txt")).unwrap(),
        "the user's edit"
    );
}

#[test]
fn a_conflicting_save_keeps_both_versions() {
    let s = setup();
    fs::write(s.root.join("notes.txt"), "base\n").unwrap();
    // A runnable file: its conflict copy stays runnable (not the private 0600 it once got).
    let runnable = fs::Permissions::from_mode(0o750);
    fs::set_permissions(s.root.join("notes.txt"), runnable).unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.mount.dir.join("notes.txt"))
        .unwrap();
    let mut buf = String::new();
    f.read_to_string(&mut buf).unwrap();
    // Someone in the sandbox changes the file meanwhile.
    fs::write(s.root.join("notes.txt"), "changed in the sandbox\n").unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"mine\n", 0).unwrap();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(f);
    assert_eq!(
        fs::read_to_string(s.root.join("notes.txt")).unwrap(),
        "changed in the sandbox\n"
    );
    let copies: Vec<_> = fs::read_dir(&s.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("notes.txt.sbxfs-conflict-"))
        .collect();
    assert_eq!(copies.len(), 1, "one conflict copy");
    assert_eq!(
        fs::read_to_string(s.root.join(&copies[0])).unwrap(),
        "mine\n"
    );
    let mode = fs::metadata(s.root.join(&copies[0])).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o750, "the conflict copy's mode");
    assert!(s.mount.log_text().contains("conflict"));
    // The sandbox may delete its copy (`git clean`, or a sandbox that forced the conflict):
    // the user's version is kept on the laptop too, under the staging directory's conflicts/.
    fs::remove_file(s.root.join(&copies[0])).unwrap();
    let cache = s.mount.log.parent().unwrap().join("cache");
    let (_, found, _) = run(Command::new("find").arg(&cache).args([
        "-path",
        "*/conflicts/*",
        "-name",
        "notes.txt.sbxfs-conflict-*",
    ]));
    let found = String::from_utf8_lossy(&found);
    let kept: Vec<&str> = found.lines().collect();
    assert_eq!(kept.len(), 1, "{found}");
    assert_eq!(fs::read_to_string(kept[0]).unwrap(), "mine\n");
    let mode = fs::metadata(kept[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // `ctl flush` names the copy once: exit 1 (all pushed, but a version is not at its
    // path), then 0 (nothing new since).
    let flush = || {
        run(Command::new(sbxfs_bin())
            .args(["ctl", "--mount"])
            .arg(&s.mount.dir)
            .arg("flush"))
    };
    let (code, _, err) = flush();
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("sbxfs ctl: conflict: notes.txt changed in the sandbox")
            && err.contains(&copies[0]),
        "{err}"
    );
    let (code, _, err) = flush();
    assert_eq!(
        (code, err.is_empty()),
        (0, true),
        "{}",
        String::from_utf8_lossy(&err)
    );
    // `ctl status` lists the copy, and `sbxfs umount` names it (exit 0: nothing is unpushed).
    let (_, out, _) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--json", "--mount"])
        .arg(&s.mount.dir)
        .arg("status"));
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        status["conflicts"],
        serde_json::json!([{"path": "notes.txt", "saved_as": copies[0]}]),
        "{status}"
    );
    let (code, _, err) = run(Command::new(sbxfs_bin()).arg("umount").arg(&s.mount.dir));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("conflict: notes.txt changed in the sandbox") && err.contains(&copies[0]),
        "{err}"
    );
}

#[test]
fn a_file_held_open_across_a_push_keeps_the_users_version_in_a_conflict() {
    let s = setup();
    held_open_across_a_conflict(&s.root, &s.mount.dir);
}

#[test]
fn a_file_appended_to_keeps_the_users_version_in_a_conflict_without_a_push_between() {
    // `exec 7>>log; echo a >&7; …; echo b >&7; exec 7>&-` with the sandbox changing the file
    // in between: nothing was pushed, nothing read. The base is captured in the background
    // from the first write on, so the conflict copy still has the lines the file had.
    let s = setup();
    fs::write(s.root.join("e.txt"), "line one\nline two\n").unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(s.mount.dir.join("e.txt"))
        .unwrap();
    f.write_all(b"mine1\n").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    fs::write(s.root.join("e.txt"), "THEIRS\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    f.write_all(b"mine2\n").unwrap();
    drop(f);
    ctl_flush_conflicted(&s.mount.dir, "e.txt");
    assert_eq!(
        fs::read_to_string(s.root.join("e.txt")).unwrap(),
        "THEIRS\n"
    );
    assert_eq!(
        conflict_copies_of(&s.root, "e.txt"),
        ["line one\nline two\nmine1\nmine2\n"]
    );
}

#[test]
fn a_file_the_sandbox_replaces_or_deletes_right_after_an_open_for_writing_keeps_its_lines() {
    // `exec 5>>f` in the mount, then the sandbox deletes or rewrites f before the first
    // write: the base is taken at the open, so the conflict copy has the old lines, not NULs
    // or the sandbox's new bytes in their place.
    let s = setup();
    for (name, sandbox_side) in [("del.txt", None), ("new.txt", Some("THEIRS\n"))] {
        let mut f = append_to_sandbox_file(
            &s.root,
            &s.mount.dir,
            name,
            b"base line one\nbase line two\n",
        );
        match sandbox_side {
            None => fs::remove_file(s.root.join(name)).unwrap(),
            Some(text) => fs::write(s.root.join(name), text).unwrap(),
        }
        std::thread::sleep(Duration::from_millis(1200));
        f.write_all(b"mine\n").unwrap();
        drop(f);
        let _ = run(Command::new(sbxfs_bin())
            .args(["ctl", "--mount"])
            .arg(&s.mount.dir)
            .arg("flush"));
        let at_name = fs::read_to_string(s.root.join(name)).ok();
        let copies = conflict_copies_of(&s.root, name);
        let mine = "base line one\nbase line two\nmine\n";
        match sandbox_side {
            // Deleted: the user's version is the file again, or saved beside its old name.
            None => assert!(
                at_name.as_deref() == Some(mine) || copies == [mine],
                "{name}: {at_name:?} {copies:?}\n{}",
                s.mount.log_text()
            ),
            Some(text) => {
                assert_eq!(at_name.as_deref(), Some(text));
                assert_eq!(copies, [mine], "{name}\n{}", s.mount.log_text());
            }
        }
    }
}

#[test]
fn a_conflict_on_a_large_sparse_file_copies_in_the_sandbox_and_keeps_holes_here() {
    // 64 MiB, almost all hole; a byte written through the mount, then the sandbox changes
    // the file. The copy is made in the sandbox (no page-by-page read of 256 MiB over the
    // link), and the laptop's own copy takes the user's bytes' space, not 64 MiB.
    let s = setup();
    let size = 64u64 << 20;
    let f = fs::File::create(s.root.join("disk.img")).unwrap();
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"HEAD", 0).unwrap();
    drop(f);
    wait_shown(&s.mount.dir.join("disk.img"));
    let g = fs::OpenOptions::new()
        .write(true)
        .open(s.mount.dir.join("disk.img"))
        .unwrap();
    g.write_all_at(b"mine", 32 << 20).unwrap();
    let theirs = fs::OpenOptions::new()
        .write(true)
        .open(s.root.join("disk.img"))
        .unwrap();
    theirs.write_all_at(b"THEIRS", 0).unwrap();
    drop(theirs);
    let calls_before = ctl_stats(&s.mount.dir)["stats"]["remote_calls"]
        .as_u64()
        .unwrap();
    let err = g.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(g);
    let calls = ctl_stats(&s.mount.dir)["stats"]["remote_calls"]
        .as_u64()
        .unwrap()
        - calls_before;
    assert!(calls < 100, "{calls} remote calls for the conflict copy");
    let copies: Vec<_> = fs::read_dir(&s.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("disk.img.sbxfs-conflict-"))
        .collect();
    assert_eq!(copies.len(), 1);
    let copy = fs::File::open(&copies[0]).unwrap();
    assert_eq!(copy.metadata().unwrap().len(), size);
    let mut buf = [0u8; 4];
    copy.read_exact_at(&mut buf, 32 << 20).unwrap();
    assert_eq!(&buf, b"mine");
    let cache = s.mount.log.parent().unwrap().join("cache");
    let (_, found, _) = run(Command::new("find").arg(&cache).args([
        "-path",
        "*/conflicts/*",
        "-name",
        "disk.img.sbxfs-conflict-*",
    ]));
    let found = String::from_utf8_lossy(&found);
    let kept = found.lines().next().expect("a local copy");
    let meta = fs::metadata(kept).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.len(), size);
    assert!(
        meta.blocks() * 512 < 4 << 20,
        "the local copy takes {} bytes",
        meta.blocks() * 512
    );
    let local = fs::File::open(kept).unwrap();
    local.read_exact_at(&mut buf, 32 << 20).unwrap();
    assert_eq!(&buf, b"mine");
}

#[test]
fn writes_after_a_conflict_on_a_hard_linked_file_go_to_the_conflict_copy() {
    // The sandbox links the file under a second name, then rewrites it in place: the
    // still-open handle's next writes go to the user's copy, never onto the sandbox's file
    // (at the old offset, NULs before them) under either name.
    let s = setup();
    let mut f = append_to_sandbox_file(&s.root, &s.mount.dir, "log", b"line0\n");
    f.write_all(b"USER-A\n").unwrap();
    f.sync_all().unwrap();
    fs::hard_link(s.root.join("log"), s.root.join(".hidden-link")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    fs::write(s.root.join("log"), "X\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    f.write_all(b"USER-B\n").unwrap();
    assert_eq!(
        f.sync_all().unwrap_err().raw_os_error(),
        Some(libc::EIO),
        "{}",
        s.mount.log_text()
    );
    f.write_all(b"USER-C\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    ctl_flush_conflicted(&s.mount.dir, "log");
    assert_eq!(fs::read_to_string(s.root.join("log")).unwrap(), "X\n");
    assert_eq!(
        fs::read_to_string(s.root.join(".hidden-link")).unwrap(),
        "X\n"
    );
    assert_eq!(
        conflict_copies_of(&s.root, "log"),
        ["line0\nUSER-A\nUSER-B\nUSER-C\n"]
    );
    assert_eq!(fs::read_to_string(s.mount.dir.join("log")).unwrap(), "X\n");
}

#[test]
fn a_file_replaced_by_a_directory_while_open_is_a_conflict_not_a_stuck_push() {
    let s = setup();
    let mut f = append_to_sandbox_file(&s.root, &s.mount.dir, "d.txt", b"base\n");
    f.write_all(b"mine1\n").unwrap();
    fs::remove_file(s.root.join("d.txt")).unwrap();
    fs::create_dir(s.root.join("d.txt")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    f.write_all(b"mine2\n").unwrap();
    let _ = f.sync_all();
    drop(f);
    ctl_flush_conflicted(&s.mount.dir, "d.txt");
    assert!(s.root.join("d.txt").is_dir());
    assert_eq!(
        conflict_copies_of(&s.root, "d.txt"),
        ["base\nmine1\nmine2\n"],
        "{}",
        s.mount.log_text()
    );
    let (_, out, _) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--json", "--mount"])
        .arg(&s.mount.dir)
        .arg("status"));
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status["pending_commits"], 0, "{status}");
}

#[test]
fn a_large_files_conflict_copy_keeps_what_an_earlier_push_sent() {
    // 2 MiB (not kept whole here): an append pushed, then the sandbox replaces the file, then
    // another append. The copy is made from the sandbox's file, with every byte held here
    // over it: both appends, not only the unpushed one.
    let s = setup();
    let mut base = vec![b'b'; (2 << 20) - 1];
    base.push(b'\n');
    fs::write(s.root.join("k"), &base).unwrap();
    wait_shown(&s.mount.dir.join("k"));
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(s.mount.dir.join("k"))
        .unwrap();
    f.write_all(b"AAAA\n").unwrap();
    f.sync_all().unwrap();
    fs::write(s.root.join("k.t"), "new\n").unwrap();
    fs::rename(s.root.join("k.t"), s.root.join("k")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    f.write_all(b"BBBB\n").unwrap();
    // The name leads to the sandbox's new file: this fsync hears of the conflict.
    assert_eq!(
        f.sync_all().unwrap_err().raw_os_error(),
        Some(libc::EIO),
        "{}",
        s.mount.log_text()
    );
    drop(f);
    ctl_flush_conflicted(&s.mount.dir, "k");
    assert_eq!(fs::read_to_string(s.root.join("k")).unwrap(), "new\n");
    let copies = conflict_copies_of(&s.root, "k");
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].len(), (2 << 20) + 10);
    assert!(
        copies[0].ends_with("AAAA\nBBBB\n"),
        "{:?}",
        &copies[0][copies[0].len() - 20..]
    );
}

#[test]
fn a_lock_file_made_here_survives_the_echo_of_the_sandboxs_own_lock_rename() {
    // Git on both sides: the sandbox's git renames its index.lock over index; right after,
    // git here makes its own index.lock. The sandbox's rename, echoed to local watchers a
    // moment later, must not move the new local file (git then failed: "unable to write
    // new index file", its lock gone from under it).
    let s = setup();
    fs::write(s.root.join("idx"), "old index\n").unwrap();
    wait_shown(&s.mount.dir.join("idx"));
    for round in 0..3 {
        fs::write(s.root.join("idx.lock"), format!("sandbox {round}\n")).unwrap();
        fs::rename(s.root.join("idx.lock"), s.root.join("idx")).unwrap();
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(s.mount.dir.join("idx.lock"))
            .unwrap();
        f.write_all(format!("laptop {round}\n").as_bytes()).unwrap();
        // Long enough for the sandbox's rename to be echoed meanwhile.
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                s.mount.dir.join("idx.lock").exists(),
                "round {round}: the lock made here vanished\n{}",
                s.mount.log_text()
            );
        }
        drop(f);
        fs::rename(s.mount.dir.join("idx.lock"), s.mount.dir.join("idx")).unwrap();
        ctl_flush(&s.mount.dir);
        assert_eq!(
            fs::read_to_string(s.root.join("idx")).unwrap(),
            format!("laptop {round}\n")
        );
        assert!(!s.root.join("idx.lock").exists());
    }
    assert!(conflict_copies_of(&s.root, "idx").is_empty());
}

#[test]
fn sigterm_pushes_pending_writes_then_unmounts() {
    let mut s = setup();
    fs::write(s.mount.dir.join("late.txt"), "written before stop").unwrap();
    assert_eq!(s.mount.stop(), Some(0));
    assert_eq!(
        fs::read_to_string(s.root.join("late.txt")).unwrap(),
        "written before stop"
    );
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(s.mount.dir.to_str().unwrap()),
        "still mounted"
    );
}

#[test]
fn stopping_while_the_sandbox_is_unreachable_keeps_unpushed_writes_on_disk() {
    let mut s = setup();
    fs::write(s.root.join("doc.txt"), "original").unwrap();
    // The file was open in an editor before the sandbox went away.
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("doc.txt")).unwrap(),
        "original"
    );
    s.agent.kill();
    // Saved while the agent is gone: the push on close fails (EIO) and the edit stays staged.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(s.mount.dir.join("doc.txt"))
        .unwrap();
    f.write_all(b"unpushed edit").unwrap();
    assert_eq!(
        f.flush()
            .and_then(|_| f.sync_all())
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EIO)
    );
    drop(f);
    let code = s.mount.stop();
    assert_eq!(code, Some(2), "the daemon reports that data was not pushed");
    let log = s.mount.log_text();
    let kept = log
        .lines()
        .find_map(|l| l.strip_prefix("sbxfs: not pushed, kept in "))
        .unwrap_or_else(|| panic!("no kept file reported: {log}"));
    assert_eq!(fs::read_to_string(kept.trim()).unwrap(), "unpushed edit");
    assert_eq!(
        fs::read_to_string(s.root.join("doc.txt")).unwrap(),
        "original"
    );
    let _ = fs::remove_dir_all(Path::new(kept.trim()).parent().unwrap());
}

#[test]
fn sbxfs_umount_pushes_then_unmounts() {
    let mut s = setup();
    fs::write(s.mount.dir.join("u.txt"), "via umount").unwrap();
    let status = Command::new(sbxfs_bin())
        .arg("umount")
        .arg(&s.mount.dir)
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = s.mount.child.take().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        fs::read_to_string(s.root.join("u.txt")).unwrap(),
        "via umount"
    );
}

#[test]
fn the_readme_demo_mounts_a_demo_workspace() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, err) = run(Command::new("bash")
        .arg(repo_root().join("scripts/demo.sh"))
        .arg("--smoke")
        .env("SBXFS_DEMO_DIR", d.path()));
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{out}\n{}", String::from_utf8_lossy(&err));
    assert!(
        out.contains("smoke test passed") && out.contains("// edited through the mount"),
        "{out}"
    );
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(d.path().to_str().unwrap()),
        "the demo left its mount behind"
    );
}

#[test]
fn replacing_a_file_by_rename_again_and_again_always_shows_the_new_content() {
    // libgit2's config dance: write NAME.lock, rename it over NAME, read NAME back. Every save
    // through the mount gives the file a new sandbox inode, and the sandbox reuses the old
    // numbers: the mount must never confuse two files that wore the same number.
    let s = setup();
    let dir = s.mount.dir.join("cfg");
    fs::create_dir(&dir).unwrap();
    let (cfg, lock) = (dir.join("config"), dir.join("config.lock"));
    let mut content = String::from("[core]\n");
    for i in 0..40 {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
            .unwrap();
        if cfg.exists() {
            let size = fs::metadata(&cfg).unwrap().len();
            let read = fs::read_to_string(&cfg).unwrap();
            assert_eq!(
                (size as usize, read.as_str()),
                (content.len(), content.as_str()),
                "round {i}"
            );
        }
        content.push_str(&format!("\tkey{i} = {i}\n"));
        f.write_all(content.as_bytes()).unwrap();
        drop(f);
        fs::rename(&lock, &cfg).unwrap();
    }
    assert_eq!(
        fs::read_to_string(s.root.join("cfg/config")).unwrap(),
        content
    );
}

#[test]
fn cargo_new_and_cargo_build_work_inside_the_mount() {
    let s = setup();
    let (code, _, err) = sh(
        &s.mount.dir,
        "cargo new -q hello && cd hello && cargo build -q && ./target/debug/hello",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sh(&s.root.join("hello"), "./target/debug/hello");
    assert_eq!((code, out.as_str()), (0, "Hello, world!\n"), "{err}");
}

#[test]
fn many_files_written_at_once_never_mix_their_contents() {
    // Parallel builds write many files at once while saves free and the sandbox reuses inode
    // numbers: each file must keep its own content.
    let s = setup();
    let m = s.mount.dir.clone();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    let name = m.join(format!("t{t}-f{i}.o"));
                    let body = format!("thread {t} file {i} ").repeat(50 + i);
                    fs::write(&name, &body).unwrap();
                    let tmp = m.join(format!("t{t}-f{i}.tmp"));
                    fs::write(&tmp, body.to_uppercase()).unwrap();
                    fs::rename(&tmp, m.join(format!("t{t}-g{i}.o"))).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for t in 0..8 {
        for i in 0..40 {
            let body = format!("thread {t} file {i} ").repeat(50 + i);
            for (name, want) in [
                (format!("t{t}-f{i}.o"), body.clone()),
                (format!("t{t}-g{i}.o"), body.to_uppercase()),
            ] {
                assert_eq!(
                    fs::read_to_string(s.root.join(&name)).unwrap(),
                    want,
                    "{name} in the sandbox"
                );
                assert_eq!(
                    fs::read_to_string(m.join(&name)).unwrap(),
                    want,
                    "{name} through the mount"
                );
            }
        }
    }
}

#[test]
fn a_hung_remote_call_does_not_block_unrelated_operations() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("cached.txt"), "already here").unwrap();
    fs::write(root.join("uncached.txt"), "needs the network").unwrap();
    let agent = AgentProcess::start(&root);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt
        .block_on(sbxfs::proxy::Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            agent.addr,
            Duration::ZERO,
        ))
        .unwrap();
    let mount = MountProcess::start_url(
        &format!("http://{}", proxy.addr),
        &agent.token,
        &["--attr-ttl-ms", "60000"],
    );
    let m = mount.dir.clone();
    assert_eq!(
        fs::read_to_string(m.join("cached.txt")).unwrap(),
        "already here"
    );
    assert_eq!(fs::read_dir(&m).unwrap().count(), 2);
    // The link to the sandbox goes dead: a read of an uncached file hangs in the network...
    proxy.set_cut(true);
    let m2 = m.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = fs::read_to_string(m2.join("uncached.txt"));
        let _ = tx.send(r.map_err(|e| e.raw_os_error()));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        rx.try_recv().is_err(),
        "the uncached read should be waiting on the network"
    );
    // ...while what the mount already knows is served at once.
    let t = std::time::Instant::now();
    assert_eq!(fs::metadata(m.join("cached.txt")).unwrap().len(), 12);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "unrelated operations waited for the hung call"
    );
    // The hung call ends with EIO within the client's timeouts, not never.
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the hung read never ended");
    assert_eq!(r.unwrap_err(), Some(libc::EIO));
    drop(mount);
    drop(proxy);
}

#[test]
fn rsync_into_and_out_of_the_mount() {
    if require_tool("rsync").is_none() {
        return;
    }
    let s = setup();
    let src = format!("{}/src/", env!("CARGO_MANIFEST_DIR"));
    let (code, _, err) = sh(
        &s.mount.dir,
        &format!("rsync -a {src} in/ && rsync -a {src} in/"),
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = sh(&s.root, &format!("diff -r {src} in"));
    assert_eq!(code, 0, "rsync into the mount changed the files");
    let out = tempfile::tempdir().unwrap();
    let (code, _, err) = sh(
        &s.mount.dir,
        &format!("rsync -a in/ {}/", out.path().display()),
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = sh(out.path(), &format!("diff -r {src} ."));
    assert_eq!(code, 0, "rsync out of the mount changed the files");
}

/// A plain http mount reads no certificate store: one that cannot be read (here a FIFO
/// nobody writes, standing in for a disk busy for a minute) does not hold its start.
#[test]
fn a_plain_http_mount_reads_no_certificate_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("a.txt"), "here\n").unwrap();
    let fifo = dir.path().join("certs.pem");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let certs_dir = dir.path().join("certs");
    fs::create_dir(&certs_dir).unwrap();
    // The watchdog: a start held by the store is let go after 30 s, and the test fails.
    let released = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (fifo, released, done) = (fifo.clone(), released.clone(), done.clone());
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < until && !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            while !done.load(Ordering::Relaxed) {
                use std::os::unix::fs::OpenOptionsExt;
                if fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo)
                    .is_ok()
                {
                    released.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let agent = AgentProcess::start(&root);
    let store = [
        ("SSL_CERT_FILE", fifo.to_str().unwrap()),
        ("SSL_CERT_DIR", certs_dir.to_str().unwrap()),
    ];
    let mut mount = MountProcess::start_url_env(&agent.url, &agent.token, &[], &store);
    let read = fs::read_to_string(mount.dir.join("a.txt"));
    mount.stop();
    done.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    assert_eq!(read.unwrap(), "here\n");
    assert!(
        !released.load(Ordering::Relaxed),
        "the mount waited for the certificate store"
    );
}
