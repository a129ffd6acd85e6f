//! The write path at a distance: a 1-byte edit of a large file moves bytes in proportion to
//! the edit, `close` queues the push (pushes in flight, ordered per file), a sandbox-side reader
//! never sees a partial file, and a push that fails is kept, reported and pushed later. Real
//! agent, real mount, through the delaying, byte-counting proxy where bytes are measured.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A sandbox, its agent, and a mount of it through a byte-counting proxy (`delay` each way).
struct Far {
    _dir: tempfile::TempDir,
    root: PathBuf,
    agent: AgentProcess,
    _rt: tokio::runtime::Runtime,
    proxy: sbxfs::proxy::Proxy,
    mount: MountProcess,
}

fn far(delay: Duration, extra: &[&str], prepare: impl FnOnce(&Path)) -> Far {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    prepare(&root);
    let agent = AgentProcess::start(&root);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt
        .block_on(sbxfs::proxy::Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            agent.addr,
            delay,
        ))
        .unwrap();
    let mount = MountProcess::start_url(&format!("http://{}", proxy.addr), &agent.token, extra);
    Far {
        _dir: dir,
        root,
        agent,
        _rt: rt,
        proxy,
        mount,
    }
}

impl Far {
    fn bytes(&self) -> u64 {
        self.proxy.counters.total()
    }

    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let (rc, out, err) = run(Command::new(sbxfs_bin())
            .arg("ctl")
            .arg("--mount")
            .arg(&self.mount.dir)
            .args(args));
        (
            rc,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    fn flush(&self) {
        let (rc, out, err) = self.ctl(&["flush"]);
        assert_eq!(rc, 0, "ctl flush: {out}{err}");
    }

    fn status(&self) -> serde_json::Value {
        let (rc, out, err) = self.ctl(&["status", "--json"]);
        assert_eq!(rc, 0, "ctl status: {out}{err}");
        serde_json::from_str(&out).unwrap()
    }
}

const BIG: usize = 64 * 1024 * 1024;
const EDIT_AT: u64 = 40 * 1024 * 1024 + 12345;

fn big_file(root: &Path) {
    let data: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    fs::write(root.join("big.bin"), data).unwrap();
}

fn expected_after_edit(at: u64) -> Vec<u8> {
    let mut data: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    data[at as usize] = b'x';
    data
}

#[test]
fn a_one_byte_dd_edit_of_a_64_mib_file_moves_under_64_kib() {
    let f = far(Duration::from_millis(1), &[], big_file);
    let target = f.mount.dir.join("big.bin");
    // The mount is up and has looked at the root; count from here.
    assert_eq!(fs::metadata(&target).unwrap().len(), BIG as u64);
    let before = f.bytes();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf x | dd of='{}' bs=1 seek={EDIT_AT} conv=notrunc status=none",
            target.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    f.flush();
    let moved = f.bytes() - before;
    assert_eq!(
        fs::read(f.root.join("big.bin")).unwrap(),
        expected_after_edit(EDIT_AT)
    );
    eprintln!("a 1-byte edit of 64 MiB moved {moved} bytes on the link");
    assert!(moved < 64 * 1024, "a 1-byte edit moved {moved} bytes");
}

#[test]
fn a_one_byte_python_edit_of_a_64_mib_file_moves_under_64_kib() {
    let Some(python) = require_tool("python3") else {
        return;
    };
    let f = far(Duration::from_millis(1), &[], big_file);
    let target = f.mount.dir.join("big.bin");
    assert_eq!(fs::metadata(&target).unwrap().len(), BIG as u64);
    let before = f.bytes();
    let status = Command::new(python)
        .arg("-c")
        .arg(format!(
            "f = open({:?}, 'r+b'); f.seek({EDIT_AT}); f.write(b'x'); f.close()",
            target.display().to_string()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    f.flush();
    let moved = f.bytes() - before;
    assert_eq!(
        fs::read(f.root.join("big.bin")).unwrap(),
        expected_after_edit(EDIT_AT)
    );
    eprintln!("a 1-byte edit of 64 MiB moved {moved} bytes on the link");
    assert!(moved < 64 * 1024, "a 1-byte edit moved {moved} bytes");
}

/// Every regular file under `dir`: relative path → (bytes, mode bits).
fn tree(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                let mode = e.metadata().unwrap().permissions().mode() & 0o7777;
                out.insert(rel, (fs::read(e.path()).unwrap(), mode));
            }
        }
    }
    out
}

/// The bytes of file `i` of the tarball: sizes from empty to 96 KiB, content unique per file.
fn tar_member(i: usize) -> Vec<u8> {
    let len = (i * 7919) % (96 * 1024);
    (0..len).map(|j| ((i * 31 + j * 7) % 253) as u8).collect()
}

#[test]
fn a_pipelined_untar_never_shows_a_partial_file_and_every_file_lands() {
    let src = tempfile::tempdir().unwrap();
    let content = src.path().join("content");
    let mut expected = BTreeMap::new();
    for i in 0..500 {
        let rel = format!("d{:02}/f{i:03}.bin", i % 20);
        let path = content.join(&rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, tar_member(i)).unwrap();
        let mode = [0o644, 0o755, 0o600, 0o640][i % 4];
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        expected.insert(rel, (tar_member(i), mode));
    }
    let tarball = src.path().join("t.tar");
    let (rc, _, err) = run(Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&content)
        .arg("."));
    assert_eq!(rc, 0, "tar -c: {}", String::from_utf8_lossy(&err));

    let f = far(Duration::from_millis(2), &[], |_| {});
    // A reader in the sandbox: every file of the tarball it sees is whole.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, root, expected) = (stop.clone(), f.root.clone(), expected.clone());
        std::thread::spawn(move || {
            let (mut checked, mut partial) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                for (rel, (want, _)) in &expected {
                    if let Ok(got) = fs::read(root.join(rel)) {
                        checked += 1;
                        if &got != want {
                            partial.push(format!("{rel}: {} of {} bytes", got.len(), want.len()));
                        }
                    }
                }
            }
            (checked, partial)
        })
    };
    let (rc, _, err) = run(Command::new("tar")
        .arg("--no-same-owner")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&f.mount.dir));
    assert_eq!(rc, 0, "tar -x: {}", String::from_utf8_lossy(&err));
    // Through the mount, at once: every file, whole, with its mode.
    assert_eq!(tree(&f.mount.dir), expected, "the mount shows the tarball");
    f.flush();
    stop.store(true, Ordering::Relaxed);
    let (checked, partial) = reader.join().unwrap();
    assert!(
        partial.is_empty(),
        "the sandbox showed partial files: {partial:?}"
    );
    assert!(checked > 0, "the reader saw files");
    assert_eq!(tree(&f.root), expected, "the sandbox has the tarball");
    assert_eq!(f.status()["queued_pushes"], 0);
}

/// One program run against a local directory and the mount alike: writes, renames and
/// unlinks with handles held open across them.
fn handles_across_renames(dir: &Path) -> Vec<u8> {
    let p = |n: &str| dir.join(n);
    fs::write(p("a"), b"one").unwrap();
    let mut h = fs::OpenOptions::new().write(true).open(p("a")).unwrap();
    h.write_all(b"two").unwrap();
    fs::rename(p("a"), p("b")).unwrap();
    h.write_all(b"three").unwrap();
    drop(h);
    // Truncate between writes, rename over an existing file.
    let mut h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("b"))
        .unwrap();
    h.set_len(2).unwrap();
    h.seek(SeekFrom::End(0)).unwrap();
    h.write_all(b"-after-cut").unwrap();
    fs::write(p("c"), b"to be replaced").unwrap();
    fs::rename(p("b"), p("c")).unwrap();
    h.write_all(b"-renamed-over").unwrap();
    drop(h);
    // Unlinked while open: the handle keeps reading and writing; the name is gone.
    let mut d = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p("d"))
        .unwrap();
    d.write_all(b"doomed").unwrap();
    fs::remove_file(p("d")).unwrap();
    d.write_all(b"-still").unwrap();
    let mut seen = Vec::new();
    d.seek(SeekFrom::Start(0)).unwrap();
    d.read_to_end(&mut seen).unwrap();
    drop(d);
    // A directory renamed with a freshly written file inside.
    fs::create_dir(p("dir")).unwrap();
    fs::write(p("dir/x"), b"inside").unwrap();
    fs::rename(p("dir"), p("dir2")).unwrap();
    fs::write(p("dir2/x"), b"inside, again").unwrap();
    // Written, closed, unlinked at once; written and renamed twice.
    fs::write(p("e"), b"short-lived").unwrap();
    fs::remove_file(p("e")).unwrap();
    fs::write(p("f"), b"first").unwrap();
    fs::rename(p("f"), p("g")).unwrap();
    let g = fs::OpenOptions::new().write(true).open(p("g")).unwrap();
    g.write_all_at(b"FI", 0).unwrap();
    fs::rename(p("g"), p("h")).unwrap();
    drop(g);
    seen
}

#[test]
fn writes_renames_and_unlinks_with_handles_open_land_in_order() {
    let local = tempfile::tempdir().unwrap();
    let want_seen = handles_across_renames(local.path());
    let want = tree(local.path());
    let f = far(Duration::from_millis(2), &[], |_| {});
    let seen = handles_across_renames(&f.mount.dir);
    assert_eq!(
        seen, want_seen,
        "read back through the unlinked file's handle"
    );
    assert_eq!(
        tree(&f.mount.dir),
        want,
        "the mount, at once; log: {}",
        f.mount.log_text()
    );
    f.flush();
    assert_eq!(tree(&f.root), want, "the sandbox, after ctl flush");
    let names: Vec<String> = fs::read_dir(&f.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("sbxfs-conflict")),
        "no conflict copies: {names:?}"
    );
}

#[test]
fn a_failed_push_is_kept_reported_on_fsync_and_in_status_then_lands() {
    let mut f = far(Duration::ZERO, &[], |root| {
        fs::write(root.join("f.txt"), b"old").unwrap();
    });
    let target = f.mount.dir.join("f.txt");
    let mut h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .unwrap();
    h.write_all(b"new data, kept").unwrap();
    // The sandbox's agent goes away: the push cannot land.
    let addr = f.agent.addr;
    f.agent.kill();
    let err = h.sync_all().expect_err("fsync must report the failed push");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let status = f.status();
    let failures = status["push_failures"].as_array().unwrap();
    assert!(
        failures
            .iter()
            .any(|x| x["path"] == "f.txt" && x["error"].as_str().is_some_and(|e| !e.is_empty())),
        "ctl status names the failed push: {status}"
    );
    // Kept: the mount still shows the user's bytes.
    let mut back = String::new();
    h.seek(SeekFrom::Start(0)).unwrap();
    h.read_to_string(&mut back).unwrap();
    assert_eq!(back, "new data, kept");
    assert_eq!(fs::read(f.root.join("f.txt")).unwrap(), b"old");
    // A new file can be saved meanwhile too: made in the mount, pushed once the sandbox is back.
    fs::write(f.mount.dir.join("saved offline.txt"), b"while away").unwrap();
    assert_eq!(
        fs::read(f.mount.dir.join("saved offline.txt")).unwrap(),
        b"while away"
    );
    // The sandbox is back: the push is retried by itself and lands.
    f.agent = AgentProcess::start_on(&f.root, addr);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs::read(f.root.join("f.txt")).unwrap() != b"new data, kept" {
        assert!(Instant::now() < deadline, "the kept push never landed");
        std::thread::sleep(Duration::from_millis(50));
    }
    h.sync_all().expect("fsync once the push landed");
    drop(h);
    f.flush();
    assert!(f.status()["push_failures"].as_array().unwrap().is_empty());
    assert_eq!(
        fs::read(f.root.join("saved offline.txt")).unwrap(),
        b"while away"
    );
}

#[test]
fn with_sync_close_the_sandbox_has_the_file_when_close_returns() {
    let f = far(Duration::from_millis(5), &["-o", "sync_close"], |root| {
        fs::write(root.join("old.txt"), b"before").unwrap();
    });
    for i in 0..5 {
        let name = format!("new{i}.txt");
        fs::write(f.mount.dir.join(&name), format!("content {i}")).unwrap();
        assert_eq!(
            fs::read_to_string(f.root.join(&name)).unwrap(),
            format!("content {i}")
        );
    }
    fs::write(f.mount.dir.join("old.txt"), b"after").unwrap();
    assert_eq!(fs::read(f.root.join("old.txt")).unwrap(), b"after");
}

#[test]
fn unmount_waits_for_the_queued_pushes() {
    let mut f = far(Duration::from_millis(5), &[], |_| {});
    let mut want = BTreeMap::new();
    for i in 0..60 {
        let name = format!("q{i:02}.txt");
        let data = format!("queued {i}").repeat(i + 1).into_bytes();
        fs::write(f.mount.dir.join(&name), &data).unwrap();
        want.insert(name, (data, 0o644));
    }
    // Unmounted from outside: the daemon pushes what is queued, then exits.
    let (rc, _, err) = run(Command::new("fusermount3").arg("-u").arg(&f.mount.dir));
    assert_eq!(rc, 0, "fusermount3 -u: {}", String::from_utf8_lossy(&err));
    let mut child = f.mount.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not exit after the unmount");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "daemon exit: {status}; log: {}",
        f.mount.log_text()
    );
    let got: BTreeMap<String, (Vec<u8>, u32)> = tree(&f.root)
        .into_iter()
        .map(|(k, (d, m))| (k, (d, m & 0o777)))
        .collect();
    let want: BTreeMap<String, (Vec<u8>, u32)> = want
        .into_iter()
        .map(|(k, (d, _))| {
            let m = got.get(&k).map_or(0, |x| x.1);
            (k, (d, m))
        })
        .collect();
    assert_eq!(
        got, want,
        "every queued file is in the sandbox after unmount"
    );
}

#[test]
fn a_name_the_sandbox_takes_before_the_first_push_is_not_overwritten() {
    let f = far(Duration::from_millis(5), &[], |_| {});
    // Created in the mount (locally: the name was just seen absent), then made in the sandbox
    // before the new file's first push.
    let mut ours = fs::File::create(f.mount.dir.join("race.txt")).unwrap();
    fs::write(f.root.join("race.txt"), b"theirs").unwrap();
    ours.write_all(b"ours").unwrap();
    drop(ours);
    common::ctl_flush_conflicted(&f.mount.dir, "race.txt");
    assert_eq!(fs::read(f.root.join("race.txt")).unwrap(), b"theirs");
    let copies: Vec<Vec<u8>> = fs::read_dir(&f.root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("race.txt.sbxfs-conflict-")
        })
        .map(|e| fs::read(e.path()).unwrap())
        .collect();
    assert_eq!(
        copies,
        vec![b"ours".to_vec()],
        "our version saved beside theirs"
    );
}
