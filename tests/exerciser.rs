//! An fsx-style exerciser through a real mount: random writes, reads, truncates, mmap reads
//! and writes, fsyncs, and close/reopen (sometimes `O_SYNC`) on one file, checked after every
//! operation against a shadow copy — content through the descriptor, size by `fstat`, `stat`
//! of the path and `lseek(SEEK_END)` — and at the end in the sandbox itself. Seeded, so a
//! failure names the seed and the operation that diverged.

use crate::common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use common::*;

/// A small deterministic generator (xorshift64*), so runs are reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const MAX_LEN: u64 = 300 * 1024;

fn open(path: &Path, sync: bool) -> fs::File {
    let mut o = fs::OpenOptions::new();
    o.read(true).write(true);
    if sync {
        o.custom_flags(libc::O_SYNC);
    }
    o.open(path).unwrap()
}

fn exercise(mount: &Path, root: &Path, seed: u64, ops: usize) {
    let path = mount.join(format!("fsx-{seed}"));
    fs::write(&path, b"").unwrap();
    let mut shadow: Vec<u8> = Vec::new();
    let mut rng = Rng(seed | 1);
    let mut file = open(&path, false);
    let mut log: Vec<String> = Vec::new();
    for i in 0..ops {
        let op = rng.below(100);
        let what = match op {
            0..=29 => {
                let off = rng.below(MAX_LEN);
                let len = 1 + rng.below(20_000).min(MAX_LEN - off);
                let byte = (rng.next() % 251) as u8 + 1;
                let data = vec![byte; len as usize];
                file.write_all_at(&data, off).unwrap();
                let end = (off + len) as usize;
                if shadow.len() < end {
                    shadow.resize(end, 0);
                }
                shadow[off as usize..end].copy_from_slice(&data);
                format!("write {off}+{len}")
            }
            30..=44 => {
                let off = rng.below(MAX_LEN);
                let len = 1 + rng.below(40_000);
                let mut buf = vec![0u8; len as usize];
                let n = read_full(&file, &mut buf, off);
                let want = shadow
                    .get(off as usize..)
                    .map_or(&[][..], |s| &s[..s.len().min(len as usize)]);
                assert!(
                    &buf[..n] == want,
                    "seed {seed} op {i} read {off}+{len}: content differs; last ops {:?}",
                    &log[log.len().saturating_sub(8)..]
                );
                format!("read {off}+{len}")
            }
            45..=54 => {
                let len = rng.below(MAX_LEN);
                file.set_len(len).unwrap();
                shadow.resize(len as usize, 0);
                format!("truncate {len}")
            }
            55..=62 => {
                // mmap read of the whole file.
                if !shadow.is_empty() {
                    let got = mmap_read(&file, shadow.len());
                    assert!(
                        got == shadow,
                        "seed {seed} op {i} mmap read differs; last ops {:?}",
                        &log[log.len().saturating_sub(8)..]
                    );
                }
                "mmap read".to_string()
            }
            63..=69 => {
                // mmap write within the current size.
                if !shadow.is_empty() {
                    let off = rng.below(shadow.len() as u64) as usize;
                    let len = (1 + rng.below(5000) as usize).min(shadow.len() - off);
                    let byte = (rng.next() % 251) as u8 + 1;
                    mmap_write(&file, shadow.len(), off, &vec![byte; len]);
                    shadow[off..off + len].fill(byte);
                    format!("mmap write {off}+{len}")
                } else {
                    "mmap write (empty)".to_string()
                }
            }
            70..=76 => {
                file.sync_all().unwrap();
                "fsync".to_string()
            }
            77..=84 if !shadow.is_empty() => {
                // copy_file_range within the file (done by the sandbox), not overlapping.
                let src = rng.below(shadow.len() as u64);
                let len = (1 + rng.below(20_000)).min(shadow.len() as u64 - src);
                let dst = rng.below(MAX_LEN);
                if dst + len > src && dst < src + len {
                    "copy_file_range (overlap, skipped)".to_string()
                } else {
                    let (mut off_in, mut off_out) = (src as i64, dst as i64);
                    // SAFETY: one valid descriptor, offsets passed by pointer to locals.
                    let n = unsafe {
                        libc::copy_file_range(
                            file.as_raw_fd(),
                            &mut off_in,
                            file.as_raw_fd(),
                            &mut off_out,
                            len as usize,
                            0,
                        )
                    };
                    assert!(
                        n >= 0,
                        "seed {seed} op {i} copy_file_range {src}+{len} -> {dst}: {}; last ops {:?}",
                        std::io::Error::last_os_error(),
                        &log[log.len().saturating_sub(8)..]
                    );
                    let n = n as usize;
                    let chunk = shadow[src as usize..src as usize + n].to_vec();
                    let end = dst as usize + n;
                    if shadow.len() < end {
                        shadow.resize(end, 0);
                    }
                    shadow[dst as usize..end].copy_from_slice(&chunk);
                    format!("copy_file_range {src}+{n} -> {dst}")
                }
            }
            _ => {
                let sync = rng.below(2) == 0;
                drop(file);
                file = open(&path, sync);
                format!("reopen sync={sync}")
            }
        };
        log.push(what);
        // Sizes agree everywhere, at once.
        let want = shadow.len() as u64;
        let fstat = file.metadata().unwrap().len();
        let stat = fs::metadata(&path).unwrap().len();
        // SAFETY: a valid descriptor; lseek changes only its offset.
        let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) } as u64;
        assert!(
            (fstat, stat, end) == (want, want, want),
            "seed {seed} op {i} sizes fstat {fstat} stat {stat} seek_end {end} want {want}; last ops {:?}",
            &log[log.len().saturating_sub(8)..]
        );
    }
    file.sync_all().unwrap();
    drop(file);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let inside = fs::read(root.join(format!("fsx-{seed}"))).unwrap();
    assert!(inside == shadow, "seed {seed}: the sandbox's copy differs");
}

fn read_full(f: &fs::File, buf: &mut [u8], off: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64).unwrap() {
            0 => break,
            n => got += n,
        }
    }
    got
}

fn mmap_read(f: &fs::File, len: usize) -> Vec<u8> {
    // SAFETY: a shared read-only mapping of `len` bytes of an open file, copied out and
    // unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let out = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        out
    }
}

fn mmap_write(f: &fs::File, len: usize, off: usize, data: &[u8]) {
    // SAFETY: a shared writable mapping of `len` bytes of a file opened read-write; the write
    // stays within it; msync then munmap before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(data.as_ptr(), (p as *mut u8).add(off), data.len());
        libc::msync(p, len, libc::MS_SYNC);
        libc::munmap(p, len);
    }
}

fn with_mount(extra: &[&str], seeds: &[u64], ops: usize) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, extra);
    for &seed in seeds {
        exercise(&mount.dir, &root, seed, ops);
    }
}

#[test]
fn random_io_with_mmap_truncates_and_reopens_matches_a_shadow_copy() {
    with_mount(&[], &[1, 2, 3], 1500);
}

#[test]
fn the_same_with_no_attribute_cache() {
    with_mount(&["--attr-ttl-ms", "0"], &[4, 5], 1000);
}

#[test]
fn the_same_while_the_cpus_are_busy() {
    // The truncate → fsync → close → open races showed only under load.
    let _load = CpuHogs::start();
    with_mount(&[], &[6, 7], 1200);
    with_mount(&["-o", "default_permissions"], &[8], 1200);
}
