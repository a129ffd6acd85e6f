//! POSIX open-file semantics through a real mount over a real agent, the way programs behave:
//! handles held open across truncates, renames and unlinks, duplicated descriptors, hard
//! links, FIFOs, exact modes, and a sandbox that stops answering. Each result is checked in
//! the sandbox's own directory. Every mount is unmounted even when a test fails.

use crate::common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    _agent: AgentProcess,
    mount: MountProcess,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    // These tests look in the sandbox right after a close: that is the `sync_close` model
    // (by default close queues the push; tests/distance_write.rs pins that model).
    let mount = MountProcess::start(&agent, &["-o", "sync_close"]);
    Setup {
        _dir: dir,
        root,
        _agent: agent,
        mount,
    }
}

fn sh(dir: &Path, script: &str) -> (i32, String, String) {
    let (code, out, err) = run(Command::new("bash").arg("-c").arg(script).current_dir(dir));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

fn rw(path: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Names in a directory that are conflict copies or other leftovers of the mount.
fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("sbxfs"))
        .collect()
}

#[test]
fn truncate_then_write_in_one_open_never_brings_old_bytes_back() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::write(m.join("f"), vec![b'A'; 20_000]).unwrap();
    {
        let f = rw(&m.join("f"));
        f.set_len(100).unwrap();
        f.write_all_at(b"0123456789", 30_000).unwrap();
    }
    let got = fs::read(r.join("f")).unwrap();
    assert_eq!(got.len(), 30_010);
    assert!(got[..100].iter().all(|&b| b == b'A'));
    assert!(
        got[100..30_000].iter().all(|&b| b == 0),
        "old bytes came back"
    );
    assert_eq!(&got[30_000..], b"0123456789");

    // Cut to 100, then grown to 3000 by truncate: zeros past 100.
    fs::write(m.join("g"), vec![b'B'; 20_000]).unwrap();
    {
        let f = rw(&m.join("g"));
        f.set_len(100).unwrap();
        f.set_len(3000).unwrap();
    }
    let got = fs::read(r.join("g")).unwrap();
    assert_eq!(got.len(), 3000);
    assert!(got[100..].iter().all(|&b| b == 0));
    assert_eq!(fs::read(m.join("g")).unwrap(), got, "the mount agrees");
}

#[test]
fn a_file_renamed_while_open_gets_its_later_writes_at_the_new_name() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    let mut f = fs::File::create(m.join("tmp-123")).unwrap();
    f.write_all(b"first half, ").unwrap();
    fs::rename(m.join("tmp-123"), m.join("dep-graph.bin")).unwrap();
    f.write_all(b"second half").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(r.join("dep-graph.bin")).unwrap(),
        "first half, second half"
    );
    assert!(!r.join("tmp-123").exists());
    assert!(leftovers(r).is_empty(), "{:?}", leftovers(r));
}

#[test]
fn an_unlinked_open_file_stays_usable_and_nothing_comes_back() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::write(m.join("big"), vec![7u8; 600_000]).unwrap();
    let mut f = rw(&m.join("big"));
    fs::remove_file(m.join("big")).unwrap();
    assert!(!r.join("big").exists());
    // Still readable (all of it) and writable through the handle.
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    assert_eq!(all, vec![7u8; 600_000]);
    f.write_all_at(b"more", 10).unwrap();
    let mut four = [0u8; 4];
    f.read_exact_at(&mut four, 10).unwrap();
    assert_eq!(&four, b"more");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.sync_all().unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!r.join("big").exists(), "an unlinked file came back");
    assert!(leftovers(r).is_empty(), "{:?}", leftovers(r));
    // A new file at the old name is another file.
    fs::write(m.join("big"), "new").unwrap();
    assert_eq!(fs::read_to_string(r.join("big")).unwrap(), "new");
}

#[test]
fn python_temporary_files_work() {
    let s = setup();
    let (code, out, err) = sh(
        &s.mount.dir,
        r#"python3 - <<'EOF'
import tempfile, os
with tempfile.TemporaryFile(dir='.') as f:
    f.write(b'x' * 100000); f.seek(0); assert f.read() == b'x' * 100000
with tempfile.NamedTemporaryFile(dir='.', delete=False) as f:
    f.write(b'named'); name = f.name
os.replace(name, 'kept.txt')
print(sorted(os.listdir('.')))
EOF"#,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "['kept.txt']");
    assert_eq!(
        fs::read_to_string(s.root.join("kept.txt")).unwrap(),
        "named"
    );
    assert!(leftovers(&s.root).is_empty());
}

/// Commits the mount made so far (from its control socket).
fn commits(mount: &Path) -> u64 {
    stat_of(mount, "commits")
}

#[test]
fn echo_into_a_file_is_one_commit_of_the_final_content() {
    let s = setup();
    let m = &s.mount.dir;
    fs::write(m.join("f"), "old content\n").unwrap();
    let before = commits(m);
    let (code, _, err) = sh(m, "echo x > f");
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fs::read_to_string(s.root.join("f")).unwrap(), "x\n");
    assert_eq!(commits(m) - before, 1, "one commit, not an empty one first");
}

#[test]
fn sizes_and_parent_attributes_agree_with_local_state_at_once() {
    let s = setup();
    let m = &s.mount.dir;
    let mut f = fs::File::create(m.join("f")).unwrap();
    f.write_all(&[1u8; 5000]).unwrap();
    // Another path and another descriptor see the size before any push.
    assert_eq!(fs::metadata(m.join("f")).unwrap().len(), 5000);
    let mut other = fs::File::open(m.join("f")).unwrap();
    assert_eq!(other.seek(SeekFrom::End(0)).unwrap(), 5000);
    f.set_len(10).unwrap();
    assert_eq!(fs::metadata(m.join("f")).unwrap().len(), 10);
    assert_eq!(other.metadata().unwrap().len(), 10);
    drop(f);
    // A directory's nlink and mtime follow changes made in it, at once.
    fs::create_dir(m.join("d")).unwrap();
    let before = fs::metadata(m.join("d")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::create_dir(m.join("d/sub")).unwrap();
    let after = fs::metadata(m.join("d")).unwrap();
    assert_eq!(after.nlink(), before.nlink() + 1);
    assert!(after.mtime_nsec() != before.mtime_nsec() || after.mtime() != before.mtime());
}

#[test]
fn st_ino_is_the_sandboxs_and_stays_across_the_mounts_own_saves() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::write(r.join("f"), "made in the sandbox").unwrap();
    let first = fs::metadata(r.join("f")).unwrap().ino();
    assert_eq!(fs::metadata(m.join("f")).unwrap().ino(), first);
    // Held open in the sandbox so its number is not freed and given to a later save's file
    // (ext4 hands a freed inode number out again at once).
    let _first_kept = fs::File::open(r.join("f")).unwrap();
    let held = fs::File::open(m.join("f")).unwrap();
    for round in 0..5 {
        // Each save is an atomic rename in the sandbox (a new inode there), but the file is
        // the same to programs here: SQLite, `tail -F` and editors compare st_ino.
        fs::write(m.join("f"), format!("round {round}")).unwrap();
        assert_ne!(fs::metadata(r.join("f")).unwrap().ino(), first);
        // A fresh stat through the mount (after the attribute TTL) shows the same number.
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(fs::metadata(m.join("f")).unwrap().ino(), first);
        assert_eq!(held.metadata().unwrap().ino(), first);
    }
    drop(held);
    // Replaced by another program in the sandbox: another file, with the sandbox's number.
    fs::write(r.join("g"), "replacement").unwrap();
    let replaced = fs::metadata(r.join("g")).unwrap().ino();
    fs::rename(r.join("g"), r.join("f")).unwrap();
    // Told by the change feed, which a loaded machine may deliver late.
    eventually(
        "the sandbox's replacement shows its inode number",
        Duration::from_secs(15),
        || fs::metadata(m.join("f")).unwrap().ino() == replaced,
    );
    assert_eq!(fs::read_to_string(m.join("f")).unwrap(), "replacement");
}

#[test]
fn hard_links_fifos_modes_owners_and_exchange() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    // Hard links: one file under two names.
    fs::write(m.join("a"), "one").unwrap();
    fs::hard_link(m.join("a"), m.join("b")).unwrap();
    assert_eq!(fs::metadata(r.join("a")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(r.join("a")).unwrap().ino(),
        fs::metadata(r.join("b")).unwrap().ino()
    );
    fs::write(m.join("a"), "two").unwrap();
    assert_eq!(
        fs::read_to_string(r.join("b")).unwrap(),
        "two",
        "links stay one file"
    );
    assert_eq!(fs::read_to_string(m.join("b")).unwrap(), "two");

    // A FIFO, with a reader and a writer through the mount.
    let (code, _, err) = sh(m, "mkfifo p && (echo through > p &) && cat p");
    assert_eq!(code, 0, "{err}");
    assert!(fs::symlink_metadata(r.join("p"))
        .unwrap()
        .file_type()
        .is_fifo_like());

    // The exact mode asked for, whatever the agent's umask.
    let (code, _, err) = sh(m, "umask 0; python3 -c \"import os; os.close(os.open('m', os.O_CREAT|os.O_WRONLY, 0o666)); os.mkdir('md', 0o777)\"");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::metadata(r.join("m")).unwrap().mode() & 0o7777, 0o666);
    assert_eq!(fs::metadata(r.join("md")).unwrap().mode() & 0o7777, 0o777);

    // chown goes to the sandbox (the agent runs as root here).
    std::os::unix::fs::chown(m.join("m"), Some(4321), Some(4321)).unwrap();
    assert_eq!(fs::metadata(r.join("m")).unwrap().uid(), 4321);

    // RENAME_EXCHANGE swaps two names atomically.
    fs::write(m.join("x"), "X").unwrap();
    fs::write(m.join("y"), "Y").unwrap();
    let (cx, cy) = (
        std::ffi::CString::new(m.join("x").as_os_str().as_encoded_bytes()).unwrap(),
        std::ffi::CString::new(m.join("y").as_os_str().as_encoded_bytes()).unwrap(),
    );
    // SAFETY: two valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cx.as_ptr(),
            libc::AT_FDCWD,
            cy.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fs::read_to_string(r.join("x")).unwrap(), "Y");
    assert_eq!(
        fs::read_to_string(m.join("y")).unwrap_or_else(|e| panic!("{e}: {}", s.mount.log_text())),
        "X"
    );

    // Times of a symlink itself (not its target).
    std::os::unix::fs::symlink("x", m.join("ln")).unwrap();
    let target_before = fs::metadata(r.join("x")).unwrap().mtime();
    let (code, _, err) = sh(m, "touch -h -d 2001-02-03 ln");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        fs::symlink_metadata(r.join("ln")).unwrap().mtime(),
        981158400
    );
    assert_eq!(fs::metadata(r.join("x")).unwrap().mtime(), target_before);

    // A size past the limit is EFBIG.
    let f = rw(&m.join("x"));
    assert_eq!(
        f.set_len(1 << 62).unwrap_err().raw_os_error(),
        Some(libc::EFBIG)
    );
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_fifo()
    }
}

#[test]
fn extended_attributes_pass_through() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::write(m.join("f"), "x").unwrap();
    let (code, out, err) = sh(
        m,
        "python3 -c \"import os; os.setxattr('f', 'user.k', b'v1'); print(os.getxattr('f', 'user.k').decode()); print(os.listxattr('f'))\"",
    );
    if err.contains("Operation not supported") && !xattr_ok(r) {
        eprintln!("skipped: the test filesystem has no user xattrs");
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("v1\n") && out.contains("user.k"), "{out}");
    let (code, _, err) = sh(
        m,
        "python3 -c \"import os; os.getxattr('f', 'user.missing')\"",
    );
    assert_ne!(code, 0);
    assert!(err.contains("No data available"), "{err}");
}

fn xattr_ok(dir: &Path) -> bool {
    let p = dir.join(".xattr-probe");
    fs::write(&p, "").unwrap();
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path and name, a 1-byte value.
    let rc = unsafe { libc::setxattr(c.as_ptr(), c"user.p".as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    let _ = fs::remove_file(&p);
    rc == 0
}

#[test]
fn a_directory_listing_continues_from_its_own_snapshot() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::create_dir(r.join("many")).unwrap();
    for i in 0..3000 {
        fs::write(r.join(format!("many/f{i:05}")), "").unwrap();
    }
    let mut dir = fs::read_dir(m.join("many")).unwrap();
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.push(dir.next().unwrap().unwrap().file_name());
    }
    // The directory changes while it is being read: the listing neither shifts nor repeats.
    for i in 0..50 {
        fs::remove_file(r.join(format!("many/f{i:05}"))).unwrap();
    }
    seen.extend(dir.map(|e| e.unwrap().file_name()));
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "no entry twice");
    assert_eq!(seen.len(), 3000, "every entry of the snapshot");
}

#[test]
fn a_stopped_sandbox_keeps_cached_reads_bounds_close_and_gets_the_write_later() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &["-o", "timeout_ms=1000"]);
    let m = &mount.dir;
    fs::write(root.join("cached.txt"), "served from cache").unwrap();
    assert_eq!(
        fs::read_to_string(m.join("cached.txt")).unwrap(),
        "served from cache"
    );
    assert_eq!(fs::read_dir(m).unwrap().count(), 1);
    let pid = rustix::process::Pid::from_child(&agent.child);
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let _resume = Resume(pid);
    std::thread::sleep(Duration::from_millis(1200));
    // Cached content and listings keep being served while the sandbox does not answer.
    assert_eq!(
        fs::read_to_string(m.join("cached.txt")).unwrap(),
        "served from cache"
    );
    let names: Vec<_> = fs::read_dir(m)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.iter().any(|n| n == "cached.txt"));
    // A write: close returns within its deadline (with an error: not pushed yet).
    let t = Instant::now();
    let mut f = fs::File::create(m.join("cached.txt")).unwrap_or_else(|_| {
        fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.join("cached.txt"))
            .unwrap()
    });
    f.write_all(b"written while stopped").unwrap();
    let closed = f.sync_all();
    drop(f);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(closed.is_err(), "an unpushed write is reported");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if fs::read_to_string(root.join("cached.txt")).unwrap() == "written while stopped" {
            break;
        }
        assert!(Instant::now() < deadline, "the write never landed");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

/// Resumes a stopped process however the test ends.
struct Resume(rustix::process::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

#[test]
fn a_killed_daemon_leaves_its_edits_for_the_next_mount_to_push() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let cache = dir.path().join("cache");
    fs::write(root.join("f"), "base content").unwrap();
    let mut agent = AgentProcess::start(&root);
    let addr = agent.addr;
    let url = agent.url.clone();
    let token = agent.token.clone();
    let mut mount = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    assert_eq!(
        fs::read_to_string(mount.dir.join("f")).unwrap(),
        "base content"
    );
    // The sandbox goes away; an edit is staged and cannot be pushed.
    agent.kill();
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(mount.dir.join("f"))
            .unwrap();
        f.write_all(b"EDIT").unwrap();
        let _ = f.sync_all();
    }
    // The daemon is killed outright (as by the OOM killer).
    let child = mount.child.as_mut().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(mount);
    // The staging directory is private.
    let staging = cache.join("sbxfs");
    assert_eq!(fs::metadata(&staging).unwrap().mode() & 0o777, 0o700);
    // The sandbox is back; the next mount of it pushes the edit.
    let _agent = AgentProcess::start_on(&root, addr);
    let _mount = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if fs::read_to_string(root.join("f")).unwrap() == "EDIT content" {
            break;
        }
        assert!(Instant::now() < deadline, "the edit was not recovered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An edit left by a killed daemon that the sandbox now refuses for good (its directory was
/// removed meanwhile) is not kept for ever, unseen: its bytes are saved under the staging
/// directory's `unpushed/`, at its sandbox path.
#[test]
fn an_edit_left_by_a_killed_daemon_that_cannot_land_is_saved_as_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir_all(root.join("sub")).unwrap();
    let cache = dir.path().join("cache");
    let mut agent = AgentProcess::start(&root);
    let addr = agent.addr;
    let url = agent.url.clone();
    let token = agent.token.clone();
    let mut mount = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    assert!(fs::read_dir(mount.dir.join("sub"))
        .unwrap()
        .next()
        .is_none());
    agent.kill();
    {
        let mut f = fs::File::create(mount.dir.join("sub/new.txt")).unwrap();
        f.write_all(b"made while away").unwrap();
        let _ = f.sync_all();
    }
    let child = mount.child.as_mut().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(mount);
    // Meanwhile the sandbox loses the directory.
    fs::remove_dir(root.join("sub")).unwrap();
    let _agent = AgentProcess::start_on(&root, addr);
    let mount = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    // Every file under the cache, by path (the staging directory is one per sandbox).
    let files = || {
        let mut out = Vec::new();
        let mut todo = vec![cache.clone()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().unwrap().is_dir() {
                    todo.push(e.path());
                } else {
                    out.push(e.path());
                }
            }
        }
        out
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let copy = loop {
        if let Some(c) = files()
            .into_iter()
            .find(|p| p.ends_with("unpushed/sub/new.txt"))
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no copy saved; log: {}",
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(fs::read_to_string(&copy).unwrap(), "made while away");
    assert!(!root.join("sub").exists());
    // The journal is gone: nothing is left staged for a next mount to try again.
    let journals: Vec<_> = files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "meta"))
        .collect();
    assert!(journals.is_empty(), "{journals:?}");
}

#[test]
fn two_conflict_copies_in_one_second_never_overwrite_each_other() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    for round in 0..2 {
        fs::write(r.join("f"), format!("sandbox {round}")).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        let mut f = rw(&m.join("f"));
        // The sandbox changes it again while we hold it open.
        fs::write(r.join("f"), format!("sandbox again {round}!")).unwrap();
        f.write_all(format!("mine {round}").as_bytes()).unwrap();
        let _ = f.sync_all();
    }
    let copies: Vec<String> = leftovers(r)
        .into_iter()
        .filter(|n| n.contains("conflict"))
        .collect();
    assert_eq!(copies.len(), 2, "{copies:?}");
    let mut contents: Vec<String> = copies
        .iter()
        .map(|c| fs::read_to_string(r.join(c)).unwrap())
        .collect();
    contents.sort();
    assert!(
        contents[0].starts_with("mine 0") && contents[1].starts_with("mine 1"),
        "{contents:?}"
    );
    let mode = fs::metadata(r.join(&copies[0]))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o022,
        0,
        "nobody else may write a conflict copy: {mode:o}"
    );
}

/// One counter of the mount's `ctl stats`.
fn stat_of(mount: &Path, key: &str) -> u64 {
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--mount"])
        .arg(mount)
        .args(["stats", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "ctl stats: exit {code}, {e}: {}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        )
    });
    v.pointer(&format!("/stats/{key}"))
        .and_then(|c| c.as_u64())
        .unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn copy_file_range_and_fallocate_are_done_in_the_sandbox() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(r.join("src"), &big).unwrap();
    fs::write(r.join("dst"), b"").unwrap();
    let before = stat_of(m, "bytes_read");
    let (code, out, err) = sh(
        m,
        "python3 -c \"import os; a = os.open('src', os.O_RDONLY); b = os.open('dst', os.O_WRONLY); n = 0\nwhile True:\n    k = os.copy_file_range(a, b, 1 << 24)\n    n += k\n    if k == 0: break\nos.posix_fallocate(b, 0, 5000000); os.close(b); print(n)\"",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "4000000");
    let got = fs::read(r.join("dst")).unwrap();
    assert_eq!(got.len(), 5_000_000, "fallocate grew the file");
    assert!(got[..4_000_000] == big[..], "the copy is exact");
    assert!(got[4_000_000..].iter().all(|&b| b == 0));
    let read = stat_of(m, "bytes_read") - before;
    assert!(
        read < 1_000_000,
        "{read} bytes crossed for a copy made in the sandbox"
    );
}

#[test]
fn paths_deeper_than_path_max_work() {
    let s = setup();
    let (code, out, err) = sh(
        &s.mount.dir,
        "python3 -c \"
import os
name = 'd' * 200
for i in range(30):
    os.mkdir(name); os.chdir(name)
open('leaf', 'w').write('deep')
print(len(os.getcwd()), open('leaf').read())
\"",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.trim().ends_with("deep"), "{out}");
    assert!(
        out.split_whitespace()
            .next()
            .unwrap()
            .parse::<usize>()
            .unwrap()
            > 4096
    );
    // In the sandbox itself, walked a component at a time (the whole path is past PATH_MAX).
    let (code, out, _) = sh(
        &s.root,
        "python3 -c \"
import os
for i in range(30):
    os.chdir('d' * 200)
print(open('leaf').read(), end='')
\"",
    );
    assert_eq!((code, out.as_str()), (0, "deep"));
}

#[test]
fn a_handle_never_reads_a_mix_of_two_files() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    // Replaced by rename in the sandbox while a reader holds it: the reader goes on reading
    // the file it opened, whole (the agent holds it), never the new file's bytes after the
    // old one's. The file here is larger than one read-ahead, so its tail is read after.
    let old: Vec<u8> = (0..3_000_000u32).map(|i| b'A' + (i % 7) as u8).collect();
    fs::write(r.join("f"), &old).unwrap();
    let f = fs::File::open(m.join("f")).unwrap();
    let mut head = [0u8; 100];
    f.read_exact_at(&mut head, 0).unwrap();
    fs::write(r.join("f.tmp"), vec![b'Z'; 3_000_000]).unwrap();
    fs::rename(r.join("f.tmp"), r.join("f")).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let mut rest = vec![0u8; 1_000_000];
    f.read_exact_at(&mut rest, 2_000_000).unwrap();
    assert!(
        rest == old[2_000_000..],
        "the tail is not the opened file's"
    );
    let mut all = Vec::new();
    (&f).read_to_end(&mut all).unwrap();
    assert!(all == old, "not the opened file, whole");
    drop(f);
    // A new open reads the new file.
    assert_eq!(fs::read(m.join("f")).unwrap(), vec![b'Z'; 3_000_000]);

    // Removed in the sandbox while open here: read to its end, and fstat still answers.
    fs::write(r.join("gone"), &old).unwrap();
    let mut gone = fs::File::open(m.join("gone")).unwrap();
    gone.read_exact_at(&mut head, 0).unwrap();
    fs::remove_file(r.join("gone")).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(gone.metadata().unwrap().len(), old.len() as u64);
    let mut all = Vec::new();
    gone.read_to_end(&mut all).unwrap();
    assert!(all == old, "not the removed file, whole");
    assert!(fs::symlink_metadata(m.join("gone")).is_err());

    // Changed in place in the sandbox (same file): the reader sees the new bytes, as on ext4.
    fs::write(r.join("g"), vec![b'C'; 300_000]).unwrap();
    let g = fs::File::open(m.join("g")).unwrap();
    g.read_exact_at(&mut head, 0).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(r.join("g"))
        .unwrap()
        .write_all_at(&vec![b'D'; 300_000], 0)
        .unwrap();
    // Told by the change feed (late on a loaded machine), or found once the TTL is past.
    let mut tail = vec![0u8; 1000];
    eventually(
        "the reader sees the bytes written in place",
        Duration::from_secs(15),
        || {
            g.read_exact_at(&mut tail, 250_000).unwrap();
            tail.iter().all(|&b| b == b'D')
        },
    );
}

/// Mount the agent serving `root` (its `f` holds "one: base"), write "ONE" into `f` while the
/// agent is down, and kill the mount: the edit stays staged in `cache`. Answers the agent's
/// address, URL and token, for another agent to take over.
fn leave_an_unpushed_edit(root: &Path, cache: &Path) -> (std::net::SocketAddr, String, String) {
    let mut agent = AgentProcess::start(root);
    let (addr, url, token) = (agent.addr, agent.url.clone(), agent.token.clone());
    let mut mount = MountProcess::start_url_cache(&url, &token, &[], Some(cache));
    assert_eq!(
        fs::read_to_string(mount.dir.join("f")).unwrap(),
        "one: base"
    );
    agent.kill();
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(mount.dir.join("f"))
            .unwrap();
        f.write_all(b"ONE").unwrap();
        let _ = f.sync_all();
    }
    let child = mount.child.as_mut().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(mount);
    (addr, url, token)
}

#[test]
fn unpushed_edits_never_go_to_another_sandbox_at_the_same_address() {
    let dir = tempfile::tempdir().unwrap();
    let (root1, root2) = (dir.path().join("ws1"), dir.path().join("ws2"));
    fs::create_dir(&root1).unwrap();
    fs::create_dir(&root2).unwrap();
    fs::write(root1.join("f"), "one: base").unwrap();
    fs::write(root2.join("f"), "two: theirs").unwrap();
    let cache = dir.path().join("cache");
    let (addr, url, token) = leave_an_unpushed_edit(&root1, &cache);
    // Another sandbox now answers at the same address: the edit stays staged.
    {
        let _other = AgentProcess::start_on(&root2, addr);
        let _m = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(fs::read_to_string(root2.join("f")).unwrap(), "two: theirs");
        assert!(leftovers(&root2).is_empty(), "{:?}", leftovers(&root2));
    }
    // Its own sandbox is back: now it is pushed.
    let _agent = AgentProcess::start_on(&root1, addr);
    let _mount = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    let deadline = Instant::now() + Duration::from_secs(20);
    while fs::read_to_string(root1.join("f")).unwrap() != "ONE: base" {
        assert!(
            Instant::now() < deadline,
            "the edit never reached its sandbox"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_edit_kept_over_a_restart_is_saved_whole_when_the_sandbox_changed_the_file_meanwhile() {
    // The daemon was killed with an edit of the first bytes unpushed; the sandbox then
    // rewrote the file. The conflict copy made at the next mount is the user's version (the
    // edit over the base bytes kept with it), never the edit spliced onto the new bytes.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("f"), "one: base").unwrap();
    let cache = dir.path().join("cache");
    let (addr, url, token) = leave_an_unpushed_edit(&root, &cache);
    fs::write(root.join("f"), "SANDBOX REWROTE IT").unwrap();
    let _agent = AgentProcess::start_on(&root, addr);
    let m = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m
        .log_text()
        .contains("from an earlier mount of this sandbox")
    {
        assert!(Instant::now() < deadline, "no recovery: {}", m.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = m.log_text();
    assert!(
        log.contains("pushed=0 conflicts=1 kept=0"),
        "a conflict is not counted as pushed: {log}"
    );
    assert_eq!(
        fs::read_to_string(root.join("f")).unwrap(),
        "SANDBOX REWROTE IT"
    );
    assert_eq!(conflict_copies_of(&root, "f"), ["ONE: base"], "{log}");
    let stats = ctl_stats(&m.dir);
    assert_eq!(stats["stats"]["conflicts"], 1, "{stats}");
}

#[test]
fn unpushed_edits_never_go_to_a_new_workspace_that_took_the_old_ones_inode_number() {
    // What a hostile agent can claim (any device and inode) and a cloned or rebuilt sandbox
    // does honestly: here for real, a directory made where the old workspace was deleted
    // gets its inode number (ext4 hands a freed number out again at once).
    let dir = tempfile::tempdir().unwrap();
    let root1 = dir.path().join("ws1");
    fs::create_dir(&root1).unwrap();
    fs::write(root1.join("f"), "one: base").unwrap();
    let old = fs::metadata(&root1).unwrap();
    let cache = dir.path().join("cache");
    let (addr, url, token) = leave_an_unpushed_edit(&root1, &cache);
    fs::remove_dir_all(&root1).unwrap();
    let Some(root2) = (0..2000).find_map(|i| {
        let d = dir.path().join(format!("ws2-{i}"));
        fs::create_dir(&d).unwrap();
        let m = fs::metadata(&d).unwrap();
        // One that got another freed number (the file's) is kept, so the next takes
        // the next free one.
        ((m.dev(), m.ino()) == (old.dev(), old.ino())).then_some(d)
    }) else {
        // Another process on this disk took the freed number first (the suite runs tests
        // in parallel): the case cannot be made this time.
        eprintln!("skipped: no new directory got the old workspace's inode number");
        return;
    };
    fs::write(root2.join("f"), "two: theirs").unwrap();
    let _other = AgentProcess::start_on(&root2, addr);
    let m = MountProcess::start_url_cache(&url, &token, &[], Some(&cache));
    // The recovery ran (it logs what it kept), and left the other workspace alone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m.log_text().contains("staged for another sandbox") {
        assert!(
            Instant::now() < deadline,
            "no word of the kept edit: {}",
            m.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(fs::read_to_string(root2.join("f")).unwrap(), "two: theirs");
    assert!(leftovers(&root2).is_empty(), "{:?}", leftovers(&root2));
    // `ctl status` and `umount` name what stays kept (umount succeeds: it is not this
    // mount's to push).
    let (_, out, _) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--json", "--mount"])
        .arg(&m.dir)
        .arg("status"));
    let status: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status["kept_from_earlier"][0]["path"], "f", "{status}");
    let (code, _, err) = run(Command::new(sbxfs_bin()).arg("umount").arg(&m.dir));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("note: f: an edit from an earlier mount is kept unpushed"),
        "{err}"
    );
}

#[test]
fn writes_follow_a_file_the_sandbox_renamed_while_it_was_open() {
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    fs::write(r.join("draft.txt"), "base\n").unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.join("draft.txt"))
        .unwrap();
    f.write_all(b"mine 1\n").unwrap();
    // A process in the sandbox renames it while we hold it open.
    fs::rename(r.join("draft.txt"), r.join("final.txt")).unwrap();
    f.write_all(b"mine 2\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(r.join("final.txt")).unwrap(),
        "base\nmine 1\nmine 2\n"
    );
    assert!(!r.join("draft.txt").exists());
    assert!(leftovers(r).is_empty(), "{:?}", leftovers(r));
}

#[test]
fn a_lock_file_made_here_is_a_lock_in_the_sandbox_too() {
    // Git on both sides: a `NAME.lock` made exclusively here must stop git in the sandbox
    // from taking the same lock, and the other way round.
    let s = setup();
    let (m, r) = (&s.mount.dir, &s.root);
    let mut lock = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.join("index.lock"))
        .unwrap();
    let theirs = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(r.join("index.lock"));
    assert_eq!(
        theirs.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists,
        "the sandbox took a lock held here"
    );
    lock.write_all(b"new index").unwrap();
    drop(lock);
    fs::rename(m.join("index.lock"), m.join("index")).unwrap();
    assert_eq!(fs::read_to_string(r.join("index")).unwrap(), "new index");
    assert!(
        !r.join("index.lock").exists(),
        "the lock stayed in the sandbox"
    );
    // A lock the sandbox holds is refused here, whatever the mount's listing last said.
    fs::write(r.join("HEAD.lock"), "theirs").unwrap();
    let ours = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.join("HEAD.lock"));
    assert_eq!(
        ours.map(drop).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(fs::read_to_string(r.join("HEAD.lock")).unwrap(), "theirs");
}

#[test]
fn a_remount_after_kill_9_reads_unchanged_files_from_the_disk_cache() {
    // The daemon keeps the pages it fetched on disk (per sandbox, private): the next mount
    // serves files that did not change without fetching them, and fetches those that did,
    // even rewritten with their size and mtime put back.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let cache = dir.path().join("cache");
    let big: Vec<u8> = (0..(3 << 20) + 1234).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(root.join("big.bin"), &big).unwrap();
    fs::write(root.join("same.txt"), "unchanged\n").unwrap();
    fs::write(root.join("changes.txt"), "before\n").unwrap();
    fs::write(root.join("sneaky.txt"), "AAAA\n").unwrap();
    fs::write(root.join("late.txt"), "BBBB\n").unwrap();
    let names = [
        "big.bin",
        "same.txt",
        "changes.txt",
        "sneaky.txt",
        "late.txt",
    ];
    let agent = AgentProcess::start(&root);
    let mut mount = MountProcess::start_url_cache(&agent.url, &agent.token, &[], Some(&cache));
    for name in names {
        assert_eq!(
            fs::read(mount.dir.join(name)).unwrap(),
            fs::read(root.join(name)).unwrap()
        );
    }
    // 25 pages of big.bin, one each of the others, on disk (the writer is behind the reads).
    let pages = cache.join("sbxfs").join("pages");
    let on_disk = || {
        let (_, out, _) = run(Command::new("find")
            .arg(&pages)
            .args(["-type", "f", "-path", "*-*/*/*"]));
        String::from_utf8_lossy(&out).lines().count()
    };
    eventually("the pages on disk", Duration::from_secs(10), || {
        on_disk() >= 29
    });
    assert_eq!(fs::metadata(&pages).unwrap().mode() & 0o777, 0o700);
    let child = mount.child.as_mut().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(mount);
    fs::write(root.join("changes.txt"), "after, longer\n").unwrap();
    // Rewritten in place with its size and mtime put back: the same version, a new ctime.
    let put_back = |name: &str, text: &str| {
        let path = root.join(name);
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.set_modified(mtime).unwrap();
    };
    put_back("sneaky.txt", "XXXX\n");
    let mount = MountProcess::start_url_cache(&agent.url, &agent.token, &[], Some(&cache));
    // Changed after the mount's first look, before it read the file: the feed reports a file
    // this mount holds no pages of (yet the disk does, of its old content).
    assert_eq!(fs::read_dir(&mount.dir).unwrap().count(), names.len());
    put_back("late.txt", "YYYY\n");
    std::thread::sleep(Duration::from_millis(1500));
    for name in names {
        assert_eq!(
            fs::read(mount.dir.join(name)).unwrap(),
            fs::read(root.join(name)).unwrap(),
            "{name}"
        );
    }
    let stats = ctl_stats(&mount.dir);
    // The three changed files' few bytes only (big.bin's 3 MiB came from disk).
    let fetched = stats["stats"]["bytes_read"].as_u64().unwrap();
    assert!(fetched < 100, "only the changed files are fetched: {stats}");
    assert!(
        stats["stats"]["disk_cache_hits"].as_u64().unwrap() >= 26,
        "{stats}"
    );
}
