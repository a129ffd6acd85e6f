//! Differential test: seeded random sequences of file operations applied both through a real
//! mount and to a plain local directory; return codes, contents and listings compared after
//! every step. A failing sequence is shrunk (operations dropped while it still fails) and
//! printed, to be kept below as a named regression test.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use common::*;

/// A small deterministic generator (splitmix64): the seed alone reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const PATHS: &[&str] = &[
    "a", "b", "c", "e", "f", "d1", "d2", "d1/a", "d1/b", "d1/c", "d2/a", "d2/c", "d2/e", "d1/d3",
    "d1/d3/a", "d1/d3/b",
];

#[derive(Clone, Debug)]
enum Op {
    Create(String, Vec<u8>, u32),
    WriteAt(String, u64, Vec<u8>),
    Truncate(String, u64),
    Rename(String, String, bool),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
    Chmod(String, u32),
    Symlink(String, String),
    Read(String),
    /// Open a file read-write and keep the handle in a slot across later operations.
    Hold(usize, String),
    /// Through a held handle (it follows its file across renames and unlinks).
    HeldWrite(usize, u64, Vec<u8>),
    HeldTruncate(usize, u64),
    HeldRead(usize),
    Release(usize),
    Link(String, String),
}

const SLOTS: u64 = 3;

fn random_op(rng: &mut Rng) -> Op {
    let p = rng.pick(PATHS).to_string();
    let data = |rng: &mut Rng| -> Vec<u8> {
        let n = rng.below(300) as usize;
        (0..n).map(|_| b'a' + (rng.below(26) as u8)).collect()
    };
    // Weighted so that trees grow: creating ops are the most common.
    match rng.below(100) {
        0..=21 => Op::Create(p, data(rng), [0o644, 0o600, 0o755][rng.below(3) as usize]),
        22..=35 => Op::Mkdir(p),
        36..=47 => Op::WriteAt(p, rng.below(400), data(rng)),
        48..=55 => Op::Truncate(p, rng.below(400)),
        56..=65 => Op::Rename(p, rng.pick(PATHS).to_string(), rng.below(4) == 0),
        66..=72 => Op::Unlink(p),
        73..=78 => Op::Rmdir(p),
        79..=84 => Op::Chmod(p, [0o644, 0o600, 0o700, 0o755][rng.below(4) as usize]),
        85..=87 => Op::Symlink(p, rng.pick(PATHS).to_string()),
        88..=89 => Op::Read(p),
        90..=91 => Op::Hold(rng.below(SLOTS) as usize, p),
        92..=94 => Op::HeldWrite(rng.below(SLOTS) as usize, rng.below(400), data(rng)),
        95 => Op::HeldTruncate(rng.below(SLOTS) as usize, rng.below(400)),
        96 => Op::HeldRead(rng.below(SLOTS) as usize),
        97..=98 => Op::Release(rng.below(SLOTS) as usize),
        _ => Op::Link(p, rng.pick(PATHS).to_string()),
    }
}

fn code<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Apply one operation under `base` (with the handles held there); the observable outcome.
fn apply(base: &Path, held: &mut BTreeMap<usize, fs::File>, op: &Op) -> Result<Vec<u8>, i32> {
    let j = |p: &str| base.join(p);
    match op {
        Op::Hold(slot, p) => {
            let f = code(fs::OpenOptions::new().read(true).write(true).open(j(p)))?;
            held.insert(*slot, f);
            Ok(Vec::new())
        }
        Op::HeldWrite(slot, off, data) => match held.get(slot) {
            Some(f) => code(f.write_all_at(data, *off)).map(|_| Vec::new()),
            None => Ok(b"no handle".to_vec()),
        },
        Op::HeldTruncate(slot, len) => match held.get(slot) {
            Some(f) => code(f.set_len(*len)).map(|_| Vec::new()),
            None => Ok(b"no handle".to_vec()),
        },
        Op::HeldRead(slot) => match held.get(slot) {
            Some(f) => {
                let mut v = Vec::new();
                let mut at = 0u64;
                let mut buf = [0u8; 4096];
                loop {
                    let n = code(f.read_at(&mut buf, at))?;
                    if n == 0 {
                        break;
                    }
                    v.extend_from_slice(&buf[..n]);
                    at += n as u64;
                }
                let len = code(f.metadata())?.len();
                v.extend_from_slice(format!(" (fstat size {len})").as_bytes());
                Ok(v)
            }
            None => Ok(b"no handle".to_vec()),
        },
        Op::Release(slot) => {
            held.remove(slot);
            Ok(Vec::new())
        }
        Op::Link(a, b) => code(fs::hard_link(j(a), j(b))).map(|_| Vec::new()),
        Op::Create(p, data, mode) => {
            let mut f = code(
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(*mode)
                    .open(j(p)),
            )?;
            code(f.set_permissions(fs::Permissions::from_mode(*mode)))?;
            code(f.write_all(data))?;
            code(f.sync_all())?;
            Ok(Vec::new())
        }
        Op::WriteAt(p, off, data) => {
            let f = code(fs::OpenOptions::new().write(true).open(j(p)))?;
            code(f.write_all_at(data, *off))?;
            drop(f);
            Ok(Vec::new())
        }
        Op::Truncate(p, len) => {
            let f = code(fs::OpenOptions::new().write(true).open(j(p)))?;
            code(f.set_len(*len))?;
            Ok(Vec::new())
        }
        Op::Rename(a, b, no_replace) => {
            if *no_replace {
                let r = rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    j(a),
                    rustix::fs::CWD,
                    j(b),
                    rustix::fs::RenameFlags::NOREPLACE,
                );
                r.map_err(|e| e.raw_os_error()).map(|_| Vec::new())
            } else {
                code(fs::rename(j(a), j(b))).map(|_| Vec::new())
            }
        }
        Op::Unlink(p) => code(fs::remove_file(j(p))).map(|_| Vec::new()),
        Op::Mkdir(p) => code(fs::DirBuilder::new().mode(0o755).create(j(p))).map(|_| Vec::new()),
        Op::Rmdir(p) => code(fs::remove_dir(j(p))).map(|_| Vec::new()),
        Op::Chmod(p, mode) => {
            // chmod follows symlinks; only regular files and directories here.
            let m = code(fs::symlink_metadata(j(p)))?;
            if m.file_type().is_symlink() {
                return Ok(b"skip".to_vec());
            }
            code(fs::set_permissions(j(p), fs::Permissions::from_mode(*mode))).map(|_| Vec::new())
        }
        Op::Symlink(p, target) => {
            code(std::os::unix::fs::symlink(target, j(p))).map(|_| Vec::new())
        }
        Op::Read(p) => {
            let mut f = code(fs::File::open(j(p)))?;
            let mut v = Vec::new();
            code(f.read_to_end(&mut v))?;
            Ok(v)
        }
    }
}

/// Everything observable about a tree: kinds, modes, sizes, contents, link targets.
fn snapshot(base: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![base.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let m = fs::symlink_metadata(&p).unwrap();
            let desc = if m.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", m.permissions().mode() & 0o7777)
            } else {
                let data = fs::read(&p).unwrap();
                format!(
                    "file {:o} {} {}",
                    m.permissions().mode() & 0o7777,
                    data.len(),
                    String::from_utf8_lossy(&data)
                )
            };
            out.insert(rel, desc);
        }
    }
    out
}

/// Run `ops` in fresh directories under the mount and locally; the first divergence, if any.
static SUCCEEDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn divergence(mount_base: &Path, local_base: &Path, run: usize, ops: &[Op]) -> Option<String> {
    let m = mount_base.join(format!("run{run}"));
    let l = local_base.join(format!("run{run}"));
    fs::create_dir(&m).unwrap();
    fs::create_dir(&l).unwrap();
    let (mut hm, mut hl) = (BTreeMap::new(), BTreeMap::new());
    for (i, op) in ops.iter().enumerate() {
        let (a, b) = (apply(&m, &mut hm, op), apply(&l, &mut hl, op));
        if a != b {
            return Some(format!("step {i} {op:?}: mount {a:?}, local {b:?}"));
        }
        if a.is_ok() {
            SUCCEEDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let (sa, sb) = (snapshot(&m), snapshot(&l));
        if sa != sb {
            return Some(format!(
                "step {i} {op:?}: trees differ\nmount: {sa:#?}\nlocal: {sb:#?}"
            ));
        }
    }
    None
}

struct Rig {
    _d: tempfile::TempDir,
    _agent: AgentProcess,
    mount: MountProcess,
    local: tempfile::TempDir,
    runs: usize,
}

fn rig() -> Rig {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &[]);
    Rig {
        _d: d,
        _agent: agent,
        mount,
        local: tempfile::tempdir().unwrap(),
        runs: 0,
    }
}

impl Rig {
    fn check(&mut self, ops: &[Op]) -> Option<String> {
        self.runs += 1;
        divergence(&self.mount.dir, self.local.path(), self.runs, ops)
    }

    /// Drop operations while the sequence still fails: the shortest failing sequence found
    /// within a bounded effort (a failure is reported either way).
    fn shrink(&mut self, mut ops: Vec<Op>) -> Vec<Op> {
        let started = std::time::Instant::now();
        let mut i = ops.len();
        while i > 0 && started.elapsed() < std::time::Duration::from_secs(120) {
            i -= 1;
            let mut candidate = ops.clone();
            candidate.remove(i);
            if self.check(&candidate).is_some() {
                ops = candidate;
            }
        }
        ops
    }
}

fn run_seed(rig: &mut Rig, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let ops: Vec<Op> = (0..steps).map(|_| random_op(&mut rng)).collect();
    if let Some(first) = rig.check(&ops) {
        // Nothing after the diverging step matters.
        let step: usize = first
            .strip_prefix("step ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(ops.len() - 1);
        let shrunk = rig.shrink(ops[..=step].to_vec());
        let why = rig.check(&shrunk).unwrap_or_default();
        panic!(
            "seed {seed} diverged: {first}\n\nshrunk to {} ops: {shrunk:#?}\n{why}",
            shrunk.len()
        );
    }
}

#[test]
fn random_operation_sequences_behave_as_on_a_local_directory() {
    let mut rig = rig();
    let seeds = [1u64, 2, 3, 4];
    for seed in seeds {
        run_seed(&mut rig, seed, 600);
    }
    let ok = SUCCEEDED.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "differential: {} seeds × 600 steps (handles held across renames, unlinks and truncates) agree with a local directory ({ok} operations succeeded, the rest failed alike)",
        seeds.len()
    );
    assert!(
        ok > 400,
        "the sequences should often succeed, not only fail alike"
    );
}
