//! Reads through a mount whose sandbox is far away (the project's delaying proxy, 5 ms each
//! way): read-ahead must give exactly the sandbox's bytes, sequentially, for many readers at
//! once, with random reads mixed in, and after a change; memory stays within the page cache's
//! size; reads of several files overlap; a reader of a sandbox that stopped answering can be
//! killed, and the mount serves again once the sandbox answers.

use crate::common;

use std::fs;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{AgentProcess, MountProcess};
use sbxfs::proxy::Proxy;

const MIB: usize = 1024 * 1024;

/// Bytes that differ at every offset and per seed (a mixed-up page shows).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// An agent over a fresh root, a proxy 5 ms each way in front of it, and a mount through it.
struct Far {
    // Dropped in this order: the mount before the proxy it talks through, the root last.
    mount: MountProcess,
    proxy: Proxy,
    _rt: tokio::runtime::Runtime,
    _agent: AgentProcess,
    root: tempfile::TempDir,
}

impl Far {
    fn new(files: &[(&str, &[u8])], mount_args: &[&str]) -> Far {
        let root = tempfile::tempdir().unwrap();
        for (name, data) in files {
            fs::write(root.path().join(name), data).unwrap();
        }
        let agent = AgentProcess::start(root.path());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let proxy = rt
            .block_on(Proxy::start(
                "127.0.0.1:0".parse().unwrap(),
                agent.addr,
                Duration::from_millis(5),
            ))
            .unwrap();
        let url = format!("http://{}", proxy.addr);
        let mount = MountProcess::start_url(&url, &agent.token, mount_args);
        Far {
            root,
            mount,
            proxy,
            _rt: rt,
            _agent: agent,
        }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.mount.dir.join(name)
    }

    fn daemon_pid(&self) -> u32 {
        self.mount.child.as_ref().unwrap().id()
    }
}

impl Drop for Far {
    fn drop(&mut self) {
        self.mount.stop();
    }
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first differing byte at offset {at}");
    }
}

#[test]
fn a_large_file_read_sequentially_is_byte_identical() {
    let data = pseudo_random(96 * MIB + 12345, 1);
    let far = Far::new(&[("big", &data)], &[]);
    // `cat`, as a user would, and a plain read of the whole file.
    let out = Command::new("cat").arg(far.path("big")).output().unwrap();
    assert!(out.status.success());
    assert_same(&out.stdout, &data, "cat");
    assert_same(&fs::read(far.path("big")).unwrap(), &data, "read");
    // What crossed the link is the file about once: read-ahead fetched nothing twice.
    let down = far.proxy.counters.down.load(Ordering::Relaxed) as usize;
    assert!(
        down < data.len() * 5 / 4,
        "{down} bytes for a {} byte file",
        data.len()
    );
}

#[test]
fn several_files_read_at_once_are_each_byte_identical() {
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("f{i}"),
                pseudo_random(12 * MIB + i * 4099, 10 + i as u64),
            )
        })
        .collect();
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    let far = Far::new(&refs, &[]);
    let barrier = Arc::new(Barrier::new(files.len() * 2));
    std::thread::scope(|s| {
        for (name, data) in &files {
            // Two readers of each file, at once: one from the start, one from the middle on.
            for half in [0, data.len() / 2] {
                let (barrier, path) = (barrier.clone(), far.path(name));
                s.spawn(move || {
                    let f = fs::File::open(&path).unwrap();
                    barrier.wait();
                    let mut got = vec![0u8; data.len() - half];
                    f.read_exact_at(&mut got, half as u64).unwrap();
                    assert_same(&got, &data[half..], name);
                });
            }
        }
    });
}

#[test]
fn random_reads_mixed_with_a_sequential_reader_are_byte_identical() {
    let data = pseudo_random(64 * MIB + 777, 2);
    let far = Far::new(&[("mixed", &data)], &[]);
    let f = fs::File::open(far.path("mixed")).unwrap();
    let other = fs::File::open(far.path("mixed")).unwrap();
    let mut seq = 0usize;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut buf = vec![0u8; 200 * 1024];
    while seq < data.len() {
        // Sequential, in odd sizes across page boundaries.
        let n = (buf.len() - 1000).min(data.len() - seq);
        f.read_exact_at(&mut buf[..n], seq as u64).unwrap();
        assert_same(&buf[..n], &data[seq..seq + n], "sequential");
        seq += n;
        // A pread at a random offset, on the same handle and on another one.
        for file in [&f, &other] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % data.len() as u64) as usize;
            let len = ((x >> 40) as usize % buf.len()).min(data.len() - at);
            file.read_exact_at(&mut buf[..len], at as u64).unwrap();
            assert_same(&buf[..len], &data[at..at + len], "random");
        }
    }
    // Reading at the very end, and past it.
    let mut tail = [0u8; 100];
    let n = f.read_at(&mut tail, data.len() as u64 - 10).unwrap();
    assert_same(&tail[..n], &data[data.len() - 10..], "tail");
    assert_eq!(f.read_at(&mut tail, data.len() as u64 + 5).unwrap(), 0);
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in the daemon's status"))
}

#[test]
fn reading_a_file_four_times_the_cache_keeps_the_daemon_within_cache_plus_64_mib() {
    let cache = 64 * MIB;
    let data = pseudo_random(4 * cache, 3);
    let far = Far::new(&[("huge", &data)], &["-o", "cache_size=64M"]);
    let mut f = fs::File::open(far.path("huge")).unwrap();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut at = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert_same(&buf[..n], &data[at..at + n], "huge");
        at += n;
    }
    assert_eq!(at, data.len());
    let hwm = status_kib(far.daemon_pid(), "VmHWM") as usize * 1024;
    assert!(
        hwm < cache + 64 * MIB,
        "the daemon's peak RSS was {} MiB with a 64 MiB cache",
        hwm / MIB
    );
}

#[test]
fn reads_of_eight_files_overlap_rather_than_queue() {
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("r{i}"), pseudo_random(32 * MIB, 20 + i)))
        .collect();
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    let far = Far::new(&refs, &[]);
    let handles: Vec<fs::File> = files
        .iter()
        .map(|(n, _)| {
            let f = fs::File::open(far.path(n)).unwrap();
            // One read at a time per file, as asked: no read-ahead (the kernel's or ours)
            // opens connections of its own.
            let r = unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    libc::POSIX_FADV_RANDOM,
                )
            };
            assert_eq!(r, 0);
            f
        })
        .collect();
    let before = far.proxy.counters.connections.load(Ordering::Relaxed);
    let barrier = Arc::new(Barrier::new(files.len()));
    std::thread::scope(|s| {
        for (f, (name, data)) in handles.iter().zip(&files) {
            let barrier = barrier.clone();
            s.spawn(move || {
                barrier.wait();
                // Far apart and backwards, so no read counts as sequential.
                let mut buf = [0u8; 4096];
                for k in (0..8).rev() {
                    let at = k * 4 * MIB;
                    f.read_exact_at(&mut buf, at as u64).unwrap();
                    assert_same(&buf, &data[at..at + 4096], name);
                }
            });
        }
    });
    // The client opens a connection only when every open one is busy: eight readers
    // overlapping need about eight; reads queued behind one another would reuse one.
    let total = far.proxy.counters.connections.load(Ordering::Relaxed);
    assert!(
        total >= 6,
        "{total} connections in all ({before} before the reads): the reads did not overlap"
    );
}

/// Start `cat` on a file opened before the link is cut; answers the child once it holds the
/// descriptor (it waits for a line on stdin to start reading).
fn cat_of_open_file(path: &Path) -> std::process::Child {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$1\" && echo opened && read go && exec cat <&3 >/dev/null")
        .arg("sh")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "opened");
    child
}

/// Wait for the child to end; the deadline only stops a hung test.
fn wait_ended(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the reader did not end after its signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reader_of_a_silent_sandbox_can_be_killed_and_the_mount_serves_again() {
    use std::os::unix::process::ExitStatusExt;
    let data = pseudo_random(16 * MIB, 4);
    let far = Far::new(
        &[("a", &data), ("b", &data)],
        // Short deadlines: a read blocked on the silent sandbox ends with EIO soon.
        &["-o", "timeout_ms=1500"],
    );
    for (name, signal) in [("a", libc::SIGINT), ("b", libc::SIGKILL)] {
        let mut cat = cat_of_open_file(&far.path(name));
        far.proxy.set_cut(true);
        writeln!(cat.stdin.as_mut().unwrap(), "go").unwrap();
        // Give the reader time to block in its read (not a measurement).
        std::thread::sleep(Duration::from_millis(300));
        unsafe { libc::kill(cat.id() as i32, signal) };
        let status = wait_ended(&mut cat);
        // Killed by the signal, or already ended by an error: the mount may know the sandbox
        // is silent (its change feed dropped) and fail the read at once. Never a hang.
        assert!(
            status.signal() == Some(signal) || status.code().is_some_and(|c| c != 0),
            "{status:?}"
        );
        far.proxy.set_cut(false);
        // The same file, read again whole: the mount still serves, and serves it right.
        assert_same(&fs::read(far.path(name)).unwrap(), &data, name);
    }
    // While the sandbox stays silent, a read ends (with an error) rather than hanging.
    fs::write(far.root.path().join("c"), &data).unwrap();
    // Made in the sandbox: the change feed brings it within about a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Whole: the feed may report its creation before its content (and the kernel would end
    // a read past the size it was told without asking).
    let f = loop {
        match fs::File::open(far.path("c")) {
            Ok(f) if f.metadata().unwrap().len() == data.len() as u64 => break f,
            Ok(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(f) => panic!("c never showed whole: {:?}", f.metadata()),
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("c never showed through the mount: {e}"),
        }
    };
    far.proxy.set_cut(true);
    let mut buf = vec![0u8; 64 * 1024];
    let r = f.read_at(&mut buf, 8 * MIB as u64);
    assert!(r.is_err(), "a read of a silent sandbox answered {r:?}");
    far.proxy.set_cut(false);
    let mut got = vec![0u8; 64 * 1024];
    f.read_exact_at(&mut got, 8 * MIB as u64).unwrap();
    assert_same(
        &got,
        &data[8 * MIB..8 * MIB + 64 * 1024],
        "after the link is back",
    );
}

#[test]
fn a_file_changed_in_the_sandbox_reads_as_its_new_version_after_reopen() {
    let old = pseudo_random(24 * MIB + 5, 5);
    let far = Far::new(&[("changing", &old)], &[]);
    assert_same(&fs::read(far.path("changing")).unwrap(), &old, "old");
    // Replaced in the sandbox (a new inode) and changed in place: both read as the new bytes,
    // with nothing of the old version's cached or prefetched pages.
    let replaced = pseudo_random(20 * MIB + 3, 6);
    let tmp = far.root.path().join(".changing.tmp");
    fs::write(&tmp, &replaced).unwrap();
    fs::rename(&tmp, far.root.path().join("changing")).unwrap();
    // The change feed brings the change within about a second; until then a read is the
    // whole old version, never a mix.
    read_until_new(&far.path("changing"), &old, &replaced, "replaced");
    let mut in_place = replaced.clone();
    in_place[..8 * MIB].copy_from_slice(&pseudo_random(8 * MIB, 7));
    fs::OpenOptions::new()
        .write(true)
        .open(far.root.path().join("changing"))
        .unwrap()
        .write_all_at(&in_place[..8 * MIB], 0)
        .unwrap();
    read_until_new(
        &far.path("changing"),
        &replaced,
        &in_place,
        "changed in place",
    );
}

/// Read `path` whole until it is `new` (each read must be `old` or `new`, never a mix).
fn read_until_new(path: &Path, old: &[u8], new: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = fs::read(path).unwrap();
        if got == new {
            return;
        }
        assert!(got == old, "{what}: neither the old nor the new version");
        assert!(Instant::now() < deadline, "{what}: still the old version");
        std::thread::sleep(Duration::from_millis(100));
    }
}
