//! Reference-model test of the mount core, without FUSE: random sequences of what programs do
//! — several handles open at once on a few files, reads, writes, truncates (by handle and by
//! path), fsync, close, rename, unlink, hard links, changes made in the sandbox, and injected
//! faults — applied both to `FsCore` (over an in-memory sandbox behind a fault injector) and
//! to a small POSIX model, compared after every step. The core is driven the way the kernel
//! drives it: names are looked up, handles are opened on nodes, `close` is flush + release.
//!
//! Shrunk failures are kept below as named regression tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use sbxfs::mount::clock::Clock;
use sbxfs::mount::core::{CoreConfig, FsCore};
use sbxfs::mount::inode::{NodeId, ROOT};
use sbxfs::remote::faulty::{FaultyRemote, Op as RemoteOp};
use sbxfs::remote::memory::{MemoryRemote, MemorySandbox};
use sbxfs::remote::{Remote, RemoteError, RemotePath, RenameMode};

const NAMES: [&str; 3] = ["a", "b", "c"];
const SLOTS: usize = 4;
/// The TTL of the cached variants ([`Real::new`]).
const CACHED_TTL: Duration = Duration::from_secs(600);

/// How far the core trusts what it cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trust {
    /// Every lookup asks the sandbox: what the sandbox changed is seen at once.
    Nothing,
    /// Attributes and listings for [`CACHED_TTL`] on a clock only [`Step::Tick`] moves, so
    /// the mount answers from its caches (only the mount changes the sandbox then).
    Ttl,
    /// The same TTL, and the change feed followed ([`sbxfs::mount::feed::follow`]): trusted
    /// indefinitely while it vouches; after each step the feed is waited for, and the mount
    /// must show the sandbox's own changes as well as its own.
    Feed,
}

#[derive(Clone, Debug)]
enum Step {
    Open {
        name: usize,
        slot: usize,
        write: bool,
        create: bool,
        trunc: bool,
    },
    Close(usize),
    Write {
        slot: usize,
        offset: u32,
        len: u16,
        byte: u8,
    },
    Read(usize),
    Ftruncate {
        slot: usize,
        len: u32,
    },
    Fsync(usize),
    Truncate {
        name: usize,
        len: u32,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Unlink(usize),
    Link {
        from: usize,
        to: usize,
    },
    /// A process in the sandbox replaces a file no handle of ours writes to.
    SandboxWrite {
        name: usize,
        len: u16,
        byte: u8,
    },
    /// The next commit fails as if the sandbox did not answer.
    FailNextCommit,
    /// The next commit lands in the sandbox, but its answer is lost.
    LoseNextCommitAnswer,
    /// The next unlink is done in the sandbox, but its answer is lost (a session cut).
    LoseNextUnlinkAnswer,
    /// The next mkdir is made in the sandbox but its answer is lost.
    LoseNextMkdirAnswer,
    /// The kernel forgets every node it looked up (memory pressure, `drop_caches`).
    ForgetAll,
    /// A `stat` of the file is answered late, after the mount's own save of it landed: the
    /// answer (the sandbox's file before the save) crosses the push on its way.
    StatCrossesOwnSave {
        name: usize,
        len: u16,
        byte: u8,
    },
    /// `mkdir d; : > d/x; rmdir d`: a new file whose push may still be queued.
    RmdirOverUnpushedFile,
    /// `mkdir d`, a file written in it and closed (its push queued), `mv d e`: the file is
    /// read back at its new path at once and lands there, never at the old one.
    RenameDirOverQueuedFile {
        len: u16,
        byte: u8,
    },
    /// Time passes beyond every TTL (with caches trusted: what was fetched is asked again).
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    let name = 0..NAMES.len();
    let slot = 0..SLOTS;
    prop_oneof![
        4 => (name.clone(), slot.clone(), any::<bool>(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(name, slot, write, create, trunc)| Step::Open { name, slot, write, create, trunc }),
        3 => slot.clone().prop_map(Step::Close),
        5 => (slot.clone(), 0u32..300_000, 1u16..3000, any::<u8>())
            .prop_map(|(slot, offset, len, byte)| Step::Write { slot, offset, len, byte }),
        2 => slot.clone().prop_map(Step::Read),
        2 => (slot.clone(), 0u32..300_000).prop_map(|(slot, len)| Step::Ftruncate { slot, len }),
        1 => slot.clone().prop_map(Step::Fsync),
        1 => (name.clone(), 0u32..300_000).prop_map(|(name, len)| Step::Truncate { name, len }),
        2 => (name.clone(), name.clone()).prop_map(|(from, to)| Step::Rename { from, to }),
        2 => name.clone().prop_map(Step::Unlink),
        1 => (name.clone(), name.clone()).prop_map(|(from, to)| Step::Link { from, to }),
        1 => (name.clone(), 0u16..5000, any::<u8>())
            .prop_map(|(name, len, byte)| Step::SandboxWrite { name, len, byte }),
        1 => Just(Step::FailNextCommit),
        1 => Just(Step::LoseNextCommitAnswer),
        1 => Just(Step::LoseNextUnlinkAnswer),
        1 => Just(Step::LoseNextMkdirAnswer),
        1 => Just(Step::ForgetAll),
        1 => (name.clone(), 1u16..5000, any::<u8>())
            .prop_map(|(name, len, byte)| Step::StatCrossesOwnSave { name, len, byte }),
        1 => Just(Step::RmdirOverUnpushedFile),
        1 => (1u16..5000, any::<u8>())
            .prop_map(|(len, byte)| Step::RenameDirOverQueuedFile { len, byte }),
        1 => Just(Step::Tick),
    ]
}

/// The POSIX model: files are objects; names and handles point at them.
#[derive(Default, Debug)]
struct Model {
    files: BTreeMap<usize, Vec<u8>>,
    names: BTreeMap<usize, usize>,
    handles: BTreeMap<usize, (usize, bool)>,
    next: usize,
}

struct Real {
    core: Arc<FsCore>,
    /// The TTLs' clock: moved only by [`Step::Tick`].
    clock: Clock,
    sandbox: MemorySandbox,
    faults: sbxfs::remote::faulty::FaultControl,
    handles: BTreeMap<usize, u64>,
    trust: Trust,
    _staging: tempfile::TempDir,
}

impl Real {
    async fn new(trust: Trust) -> Real {
        let clock = Clock::manual();
        let memory = MemoryRemote::new();
        let sandbox = memory.sandbox();
        let faulty = FaultyRemote::new(memory);
        let faults = faulty.control();
        let remote: Arc<dyn Remote> = Arc::new(faulty);
        let root = remote.stat(&RemotePath::root()).await.unwrap();
        let staging = tempfile::tempdir().unwrap();
        let core = FsCore::new(
            remote,
            CoreConfig {
                attr_ttl: match trust {
                    Trust::Nothing => Duration::ZERO,
                    Trust::Ttl | Trust::Feed => CACHED_TTL,
                },
                cache_bytes: 4 * 1024 * 1024,
                staging_dir: staging.path().to_path_buf(),
                tree_max: sbxfs::mount::subtree::DEFAULT_TREE_MAX,
                clock: clock.clone(),
            },
            root,
        );
        let real = Real {
            core,
            clock,
            sandbox,
            faults,
            handles: BTreeMap::new(),
            trust,
            _staging: staging,
        };
        if trust == Trust::Feed {
            // Re-check rounds every 100 ms: they interleave with the steps as the events do.
            tokio::spawn(sbxfs::mount::feed::follow(
                real.core.clone(),
                None,
                Duration::from_millis(600),
            ));
            real.settle().await;
        }
        real
    }

    /// With the feed followed: wait until it has applied every event the sandbox numbered
    /// (the mount's own pushes' and the sandbox's own changes alike) and vouches again.
    async fn settle(&self) {
        // A push queued by a close ends when it ends: waited for, so a failure it meets (the
        // sandbox taken for out of reach) happens in the step that caused it, not halfway
        // through the check of the next (the daemon probes such a sandbox every second).
        while self.core.queued_pushes() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if !self.core.is_reachable() {
            self.core.probe().await;
        }
        if self.trust != Trust::Feed {
            return;
        }
        let until = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let want = self.sandbox.last_seq();
            match self.core.feed_caught_up_to() {
                Some(seen) if seen >= want => return,
                None if want == 0 && self.core.feed_status()["trusted"] == true => return,
                _ => {}
            }
            assert!(
                std::time::Instant::now() < until,
                "the change feed never caught up with event {want}: {}",
                self.core.feed_status()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn node(&self, name: usize) -> Result<NodeId, RemoteError> {
        Ok(self.core.lookup(ROOT, NAMES[name].as_bytes()).await?.node)
    }

    /// `mkdir d` and `d/x` created and open: `d`'s node and the handle (none if `d` could
    /// not be made: an injected fault).
    async fn make_d_x(&self) -> Option<(NodeId, u64)> {
        self.core.mkdir(ROOT, b"d", 0o755).await.ok()?;
        let d = self.core.lookup(ROOT, b"d").await.expect("lookup d").node;
        let (_, fh) = self
            .core
            .create(d, b"x", 0o644, true, false)
            .await
            .expect("create d/x");
        Some((d, fh))
    }

    /// What a program sees reading a whole file through a handle.
    async fn read_all(&self, fh: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let chunk = self
                .core
                .read(fh, out.len() as u64, 128 * 1024)
                .await
                .expect("read through an open handle");
            if chunk.is_empty() {
                return out;
            }
            out.extend_from_slice(&chunk);
        }
    }
}

fn errno(r: &Result<impl Sized, RemoteError>) -> i32 {
    r.as_ref().err().map_or(0, |e| e.errno())
}

async fn apply(step: &Step, m: &mut Model, r: &mut Real) {
    match *step {
        Step::Open {
            name,
            slot,
            write,
            create,
            trunc,
        } => {
            if m.handles.contains_key(&slot) {
                return;
            }
            let exists = m.names.contains_key(&name);
            if !exists && !create {
                assert_eq!(errno(&r.node(name).await), libc::ENOENT);
                return;
            }
            let fh = if exists {
                let node = r.node(name).await.expect("lookup of an existing name");
                r.core
                    .open(node, write, trunc && write)
                    .await
                    .expect("open")
                    .0
            } else {
                let (_, fh) = r
                    .core
                    .create(ROOT, NAMES[name].as_bytes(), 0o644, false, false)
                    .await
                    .expect("create");
                fh
            };
            let file = match m.names.get(&name) {
                Some(&f) => f,
                None => {
                    m.next += 1;
                    m.files.insert(m.next, Vec::new());
                    m.names.insert(name, m.next);
                    m.next
                }
            };
            if trunc && write {
                m.files.get_mut(&file).unwrap().clear();
            }
            let write = write || !exists;
            m.handles.insert(slot, (file, write));
            r.handles.insert(slot, fh);
        }
        Step::Close(slot) => {
            if let Some(fh) = r.handles.remove(&slot) {
                // A failed push is reported here and kept; the model does not change.
                let _ = r.core.flush(fh).await;
                let _ = r.core.release(fh).await;
                m.handles.remove(&slot);
            }
        }
        Step::Write {
            slot,
            offset,
            len,
            byte,
        } => {
            let (Some(&fh), Some(&(file, writable))) = (r.handles.get(&slot), m.handles.get(&slot))
            else {
                return;
            };
            let data = vec![byte; len as usize];
            let got = r.core.write(fh, offset as u64, &data).await;
            if !writable {
                assert!(got.is_err(), "a read-only handle refuses writes");
                return;
            }
            assert_eq!(got.expect("write") as usize, data.len());
            let f = m.files.get_mut(&file).unwrap();
            let end = offset as usize + data.len();
            if f.len() < end {
                f.resize(end, 0);
            }
            f[offset as usize..end].copy_from_slice(&data);
        }
        Step::Read(slot) => {
            let (Some(&fh), Some(&(file, _))) = (r.handles.get(&slot), m.handles.get(&slot)) else {
                return;
            };
            assert_eq!(
                r.read_all(fh).await,
                m.files[&file],
                "read through slot {slot}"
            );
        }
        Step::Ftruncate { slot, len } => {
            let (Some(&fh), Some(&(file, writable))) = (r.handles.get(&slot), m.handles.get(&slot))
            else {
                return;
            };
            if !writable {
                return;
            }
            let node = r.core.handle_node(fh).expect("open handle");
            r.core
                .setattr(
                    node,
                    Some(fh),
                    None,
                    (None, None),
                    Some(len as u64),
                    None,
                    None,
                )
                .await
                .expect("ftruncate");
            m.files.get_mut(&file).unwrap().resize(len as usize, 0);
        }
        Step::Fsync(slot) => {
            if let Some(&fh) = r.handles.get(&slot) {
                let _ = r.core.fsync(fh).await;
            }
        }
        Step::Truncate { name, len } => {
            let Some(&file) = m.names.get(&name) else {
                return;
            };
            let node = r.node(name).await.expect("lookup");
            r.core
                .setattr(node, None, None, (None, None), Some(len as u64), None, None)
                .await
                .expect("truncate");
            m.files.get_mut(&file).unwrap().resize(len as usize, 0);
        }
        Step::Rename { from, to } => {
            let got = r
                .core
                .rename(
                    ROOT,
                    NAMES[from].as_bytes(),
                    ROOT,
                    NAMES[to].as_bytes(),
                    RenameMode::Replace,
                )
                .await;
            match m.names.get(&from).copied() {
                None => assert_eq!(errno(&got), libc::ENOENT),
                Some(f) => {
                    got.expect("rename");
                    // Two names of one file: rename(2) does nothing.
                    if m.names.get(&to) != Some(&f) {
                        m.names.remove(&from);
                        m.names.insert(to, f);
                    }
                }
            }
        }
        Step::Unlink(name) => {
            let got = r.core.unlink(ROOT, NAMES[name].as_bytes()).await;
            match m.names.remove(&name) {
                None => assert_eq!(errno(&got), libc::ENOENT),
                Some(_) => got.expect("unlink"),
            }
        }
        Step::Link { from, to } => {
            let (Some(&f), false) = (m.names.get(&from), m.names.contains_key(&to)) else {
                return;
            };
            let node = r.node(from).await.expect("lookup");
            match r.core.link(node, ROOT, NAMES[to].as_bytes()).await {
                Ok(_) => {
                    m.names.insert(to, f);
                }
                // The link pushes first; an injected fault may refuse it, changing nothing.
                Err(RemoteError::Transport(_)) => {}
                Err(e) => panic!("link: {e}"),
            }
        }
        Step::Tick => r.clock.advance(CACHED_TTL + Duration::from_secs(1)),
        Step::SandboxWrite { name, len, byte } => {
            // Only a file no handle of ours is open on (else it is a conflict, another test).
            let open = m
                .names
                .get(&name)
                .is_some_and(|f| m.handles.values().any(|(h, _)| h == f));
            let linked = m
                .names
                .get(&name)
                .is_some_and(|f| m.names.values().filter(|x| *x == f).count() > 1);
            if open || linked || r.core.has_unpushed() {
                return;
            }
            let data = vec![byte; len as usize];
            r.sandbox
                .replace(NAMES[name], &data)
                .expect("sandbox write");
            m.next += 1;
            m.files.insert(m.next, data);
            m.names.insert(name, m.next);
        }
        Step::StatCrossesOwnSave { name, len, byte } => {
            let Some(&file) = m.names.get(&name) else {
                return;
            };
            let open = m.handles.values().any(|(h, _)| *h == file);
            let linked = m.names.values().filter(|x| **x == file).count() > 1;
            if open || linked {
                return;
            }
            let node = r.node(name).await.expect("lookup");
            r.faults
                .answer_late(RemoteOp::Stat, Duration::from_millis(40), 1);
            let core = r.core.clone();
            let stat = tokio::spawn(async move { core.getattr(node).await });
            // Let the stat read the sandbox before the save lands.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let data = vec![byte; len as usize];
            let (fh, _) = r.core.open(node, true, true).await.expect("open to save");
            r.core.write(fh, 0, &data).await.expect("write");
            let _ = r.core.flush(fh).await;
            let _ = r.core.release(fh).await;
            let _ = r.core.flush_all().await;
            let _ = stat.await.expect("stat task");
            r.faults.clear(RemoteOp::Stat);
            *m.files.get_mut(&file).unwrap() = data;
        }
        Step::RmdirOverUnpushedFile => {
            let Some((d, fh)) = r.make_d_x().await else {
                return;
            };
            // close() returns after FLUSH; RELEASE (which pushes a file that wrote nothing)
            // may come after the next call.
            let _ = r.core.flush(fh).await;
            let got = r.core.rmdir(ROOT, b"d").await;
            assert_eq!(
                errno(&got),
                libc::ENOTEMPTY,
                "rmdir of a directory holding x"
            );
            let _ = r.core.release(fh).await;
            r.core.unlink(d, b"x").await.expect("unlink d/x");
            r.core.rmdir(ROOT, b"d").await.expect("rmdir d, empty now");
        }
        Step::RenameDirOverQueuedFile { len, byte } => {
            let Some((_, fh)) = r.make_d_x().await else {
                return;
            };
            let data = vec![byte; len as usize];
            r.core.write(fh, 0, &data).await.expect("write d/x");
            let _ = r.core.flush(fh).await;
            let _ = r.core.release(fh).await;
            r.core
                .rename(ROOT, b"d", ROOT, b"e", RenameMode::Replace)
                .await
                .expect("mv d e");
            let e = r.core.lookup(ROOT, b"e").await.expect("lookup e").node;
            let x = r.core.lookup(e, b"x").await.expect("lookup e/x");
            assert_eq!(
                x.attr.size, len as u64,
                "size of e/x right after the rename"
            );
            let (rh, _) = r.core.open(x.node, false, false).await.expect("open e/x");
            assert!(r.read_all(rh).await == data, "content of e/x");
            r.core.release(rh).await.unwrap();
            let d = r.core.lookup(ROOT, b"d").await;
            assert_eq!(
                errno(&d),
                libc::ENOENT,
                "d is gone: {:?}; sandbox has {:?}",
                d.as_ref().map(|na| (na.node, na.attr.kind, na.attr.ino)),
                r.sandbox.list("").map(|l| l
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect::<Vec<_>>())
            );
            // Once pushed (an injected fault may hold it back: then it is checked at the
            // next flush that leaves nothing behind), the file is at its new path only.
            if r.core.flush_all().await.is_empty() {
                assert!(
                    r.sandbox.read("e/x").ok() == Some(data),
                    "e/x in the sandbox"
                );
                assert!(!r.sandbox.exists("d"), "nothing left at the old path");
            }
            r.core.unlink(e, b"x").await.expect("unlink e/x");
            r.core.rmdir(ROOT, b"e").await.expect("rmdir e, empty now");
        }
        Step::FailNextCommit => {
            r.faults
                .fail_once(RemoteOp::Commit, RemoteError::Transport("cut".into()));
        }
        Step::LoseNextCommitAnswer => r.faults.lose_answer_once(RemoteOp::Commit),
        Step::LoseNextUnlinkAnswer => r.faults.lose_answer_once(RemoteOp::Unlink),
        Step::LoseNextMkdirAnswer => r.faults.lose_answer_once(RemoteOp::Mkdir),
        Step::ForgetAll => {
            for n in NAMES {
                if let Ok(na) = r.core.lookup(ROOT, n.as_bytes()).await {
                    r.core.forget(na.node, u64::MAX);
                }
            }
        }
    }
}

/// After every step: every name and every open handle shows the model's content.
async fn check(m: &Model, r: &Real) {
    for (i, n) in NAMES.iter().enumerate() {
        let got = r.core.lookup(ROOT, n.as_bytes()).await;
        match m.names.get(&i) {
            None => assert_eq!(
                errno(&got),
                libc::ENOENT,
                "{n} should not exist: {:?}; sandbox has {:?}",
                got.as_ref().map(|na| (na.node, na.attr.size, na.attr.dev)),
                r.sandbox.list("").map(|l| l
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect::<Vec<_>>())
            ),
            Some(f) => {
                let na = got.unwrap_or_else(|e| panic!("{n} should exist: {e}"));
                let want = &m.files[f];
                assert_eq!(na.attr.size, want.len() as u64, "size of {n}");
                let (fh, _) = r.core.open(na.node, false, false).await.expect("open");
                let content = r.read_all(fh).await;
                r.core.release(fh).await.unwrap();
                assert!(
                    content == *want,
                    "content of {n} ({} bytes vs {})",
                    content.len(),
                    want.len()
                );
            }
        }
    }
    for (slot, (file, _)) in &m.handles {
        let fh = r.handles[slot];
        let got = r.read_all(fh).await;
        assert!(got == m.files[file], "content through slot {slot}");
    }
}

/// At the end: everything closed and pushed, the sandbox holds exactly the model's files.
async fn finish(m: &mut Model, r: &mut Real) {
    r.faults.clear_all();
    for slot in 0..SLOTS {
        apply(&Step::Close(slot), m, r).await;
    }
    // Pushes queued by the closes end first (one may meet an injected fault and mark the
    // sandbox unreachable, as a real cut would); the daemon's probe then finds it answering.
    let _ = r.core.flush_all().await;
    r.core.probe().await;
    let failures = r.core.flush_all().await;
    assert!(failures.is_empty(), "{failures:?}");
    for (i, n) in NAMES.iter().enumerate() {
        match m.names.get(&i) {
            None => assert!(!r.sandbox.exists(n), "{n} left in the sandbox"),
            Some(f) => {
                let got = r.sandbox.read(n).expect("in the sandbox");
                assert!(got == m.files[f], "sandbox content of {n}");
            }
        }
    }
    let listed = r.sandbox.list("").unwrap();
    assert!(
        listed
            .iter()
            .all(|n| NAMES.iter().any(|x| x.as_bytes() == n.as_slice())),
        "no conflict copies or leftovers: {listed:?}"
    );
}

fn run(steps: &[Step]) {
    run_with(steps, Trust::Nothing);
}

/// The same steps with caches trusted for a TTL; the sandbox's own changes are left out (the
/// mount would rightly not see them until the TTL ran out).
fn run_cached(steps: &[Step]) {
    let mount_only: Vec<Step> = steps
        .iter()
        .filter(|s| {
            !matches!(
                s,
                Step::SandboxWrite { .. } | Step::StatCrossesOwnSave { .. }
            )
        })
        .cloned()
        .collect();
    run_with(&mount_only, Trust::Ttl);
}

/// The same steps with caches trusted while the change feed vouches for them, the sandbox's
/// own changes included: the feed is what tells the mount.
fn run_followed(steps: &[Step]) {
    run_with(steps, Trust::Feed);
}

fn run_with(steps: &[Step], trust: Trust) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut m = Model::default();
        let mut r = Real::new(trust).await;
        for s in steps {
            // The daemon probes a sandbox that stopped answering every second.
            if !r.core.is_reachable() {
                r.core.probe().await;
            }
            apply(s, &mut m, &mut r).await;
            r.settle().await;
            check(&m, &r).await;
        }
        finish(&mut m, &mut r).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        max_shrink_iters: 4000,
        // tests/refmodel.proptest-regressions, beside this file, whatever the test crate's
        // layout (the default looks for a lib.rs or main.rs above it and would move them).
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_core_behaves_like_posix(steps in prop::collection::vec(step(), 1..40)) {
        run(&steps);
    }

    #[test]
    fn the_core_behaves_like_posix_with_caches_trusted(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        run_cached(&steps);
    }

    #[test]
    fn the_core_behaves_like_posix_with_the_change_feed_followed(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        run_followed(&steps);
    }
}

// Regression cases (shrunk failures, kept).

/// An unlink done in the sandbox whose answer was lost (a session cut, as a killed `ssh`
/// does): the file is gone, and `unlink` succeeds (`git` failed on `HEAD.lock` with EIO).
#[test]
fn an_unlink_whose_answer_was_lost_succeeds() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Close(0),
        LoseNextUnlinkAnswer,
        Unlink(0),
    ]);
}

/// A mkdir made in the sandbox whose answer was lost: it succeeds (it said EIO, and the
/// directory appeared anyway), and the directory is usable at once.
#[test]
fn a_mkdir_whose_answer_was_lost_succeeds() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let r = Real::new(Trust::Nothing).await;
        r.faults.lose_answer_once(RemoteOp::Mkdir);
        r.core.mkdir(ROOT, b"d", 0o755).await.expect("mkdir");
        let d = r.core.lookup(ROOT, b"d").await.expect("lookup d").node;
        r.core.mkdir(d, b"e", 0o755).await.expect("mkdir d/e");
        assert_eq!(errno(&r.core.mkdir(ROOT, b"d", 0o755).await), libc::EEXIST);
    });
}

/// Shrunk by the proptest: renames over a new file's name, then away, left the old name
/// found.
#[test]
fn renames_over_and_away_from_new_files_leave_no_name_behind() {
    use Step::*;
    run(&[
        Ftruncate {
            slot: 0,
            len: 247187,
        },
        Open {
            name: 2,
            slot: 2,
            write: true,
            create: true,
            trunc: false,
        },
        Open {
            name: 1,
            slot: 2,
            write: false,
            create: true,
            trunc: false,
        },
        Unlink(0),
        Unlink(1),
        Open {
            name: 0,
            slot: 0,
            write: false,
            create: true,
            trunc: false,
        },
        Fsync(1),
        Link { from: 1, to: 2 },
        Close(0),
        Rename { from: 2, to: 0 },
        Open {
            name: 1,
            slot: 3,
            write: false,
            create: true,
            trunc: false,
        },
        Rename { from: 0, to: 1 },
        Write {
            slot: 1,
            offset: 134254,
            len: 673,
            byte: 157,
        },
        Read(3),
        Close(0),
        Tick,
        StatCrossesOwnSave {
            name: 2,
            len: 3282,
            byte: 97,
        },
        StatCrossesOwnSave {
            name: 1,
            len: 4977,
            byte: 0,
        },
        Write {
            slot: 3,
            offset: 71496,
            len: 2490,
            byte: 174,
        },
        Open {
            name: 0,
            slot: 1,
            write: true,
            create: true,
            trunc: true,
        },
        Write {
            slot: 3,
            offset: 94980,
            len: 1551,
            byte: 189,
        },
    ]);
}

#[test]
fn truncate_then_write_far_past_the_cut_reads_zeros_between() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 2000,
            byte: b'A',
        },
        Close(0),
        Open {
            name: 0,
            slot: 1,
            write: true,
            create: false,
            trunc: false,
        },
        Ftruncate { slot: 1, len: 100 },
        Write {
            slot: 1,
            offset: 30_000,
            len: 10,
            byte: b'0',
        },
        Close(1),
    ]);
}

#[test]
fn writes_after_a_rename_of_the_open_file_land_at_the_new_name() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 10,
            byte: 1,
        },
        Rename { from: 0, to: 1 },
        Write {
            slot: 0,
            offset: 10,
            len: 10,
            byte: 2,
        },
        Close(0),
    ]);
}

#[test]
fn an_unlinked_open_file_keeps_working_and_nothing_comes_back() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 10,
            byte: 1,
        },
        Fsync(0),
        Open {
            name: 0,
            slot: 1,
            write: false,
            create: false,
            trunc: false,
        },
        Unlink(0),
        Write {
            slot: 0,
            offset: 5,
            len: 10,
            byte: 2,
        },
        Read(1),
        Close(0),
        Read(1),
        Close(1),
    ]);
}

#[test]
fn a_push_whose_answer_was_lost_is_not_taken_for_a_conflict() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 100,
            byte: 7,
        },
        LoseNextCommitAnswer,
        Fsync(0),
        Write {
            slot: 0,
            offset: 50,
            len: 100,
            byte: 8,
        },
        Close(0),
    ]);
}

#[test]
fn a_file_closed_by_every_handle_follows_the_sandbox_again() {
    use Step::*;
    run(&[
        Open {
            name: 2,
            slot: 3,
            write: false,
            create: true,
            trunc: false,
        },
        Open {
            name: 2,
            slot: 1,
            write: false,
            create: false,
            trunc: false,
        },
        Close(3),
        Close(1),
        SandboxWrite {
            name: 2,
            len: 1,
            byte: 0,
        },
    ]);
}

#[test]
fn a_forgotten_node_with_a_failed_push_is_still_pushed() {
    use Step::*;
    run(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 10,
            byte: 3,
        },
        FailNextCommit,
        FailNextCommit,
        Close(0),
        ForgetAll,
    ]);
}

#[test]
fn a_failed_push_is_kept_and_pushed_later() {
    use Step::*;
    run(&[
        Open {
            name: 2,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        FailNextCommit,
        Write {
            slot: 0,
            offset: 0,
            len: 100,
            byte: 7,
        },
        Close(0),
    ]);
}

#[test]
fn a_new_file_renamed_over_a_sandbox_file_and_away_leaves_it_gone() {
    use Step::*;
    run(&[
        SandboxWrite {
            name: 2,
            len: 0,
            byte: 0,
        },
        Open {
            name: 0,
            slot: 0,
            write: false,
            create: true,
            trunc: false,
        },
        Rename { from: 0, to: 2 },
        Rename { from: 2, to: 0 },
    ]);
}

#[test]
fn a_new_file_whose_commit_answer_was_lost_can_be_unlinked() {
    use Step::*;
    run(&[
        Open {
            name: 1,
            slot: 1,
            write: false,
            create: true,
            trunc: false,
        },
        LoseNextCommitAnswer,
        Close(1),
        Unlink(1),
    ]);
}

#[test]
fn a_new_file_renamed_over_one_name_of_a_linked_file_leaves_the_other_name_pushable() {
    use Step::*;
    run(&[
        Open {
            name: 2,
            slot: 2,
            write: false,
            create: true,
            trunc: false,
        },
        Open {
            name: 0,
            slot: 0,
            write: false,
            create: true,
            trunc: false,
        },
        Link { from: 2, to: 1 },
        Rename { from: 0, to: 1 },
        Ftruncate { slot: 2, len: 1 },
    ]);
}

#[test]
fn truncate_by_path_right_after_close_is_not_lost_to_the_queued_push() {
    use Step::*;
    // The close queues the push; the truncate races with it (and with the idle image being
    // dropped after it), so the sequence is run many times.
    for _ in 0..50 {
        run(&[
            Open {
                name: 1,
                slot: 1,
                write: false,
                create: true,
                trunc: true,
            },
            Close(1),
            Truncate {
                name: 1,
                len: 103_448,
            },
        ]);
    }
}

#[test]
fn a_lost_commit_answer_after_sandbox_rewrites_and_a_rename_leaves_no_conflict_copy() {
    use Step::*;
    run(&[
        Truncate {
            name: 2,
            len: 201663,
        },
        FailNextCommit,
        LoseNextCommitAnswer,
        Open {
            name: 2,
            slot: 1,
            write: false,
            create: true,
            trunc: false,
        },
        Fsync(2),
        Ftruncate {
            slot: 1,
            len: 10646,
        },
        Open {
            name: 2,
            slot: 0,
            write: true,
            create: false,
            trunc: false,
        },
        ForgetAll,
        Ftruncate {
            slot: 1,
            len: 286210,
        },
        Write {
            slot: 0,
            offset: 228888,
            len: 1031,
            byte: 54,
        },
        Write {
            slot: 2,
            offset: 53223,
            len: 2630,
            byte: 62,
        },
        ForgetAll,
        Unlink(1),
        Write {
            slot: 1,
            offset: 219499,
            len: 703,
            byte: 7,
        },
        SandboxWrite {
            name: 2,
            len: 2391,
            byte: 230,
        },
        Fsync(2),
        Ftruncate {
            slot: 0,
            len: 93997,
        },
        Close(3),
        Open {
            name: 1,
            slot: 2,
            write: true,
            create: true,
            trunc: false,
        },
        SandboxWrite {
            name: 2,
            len: 2878,
            byte: 40,
        },
        Ftruncate {
            slot: 2,
            len: 59187,
        },
        Close(3),
        Close(0),
        SandboxWrite {
            name: 0,
            len: 4980,
            byte: 223,
        },
        ForgetAll,
        Rename { from: 1, to: 2 },
        Write {
            slot: 3,
            offset: 250935,
            len: 1666,
            byte: 53,
        },
        LoseNextCommitAnswer,
        Write {
            slot: 3,
            offset: 16199,
            len: 2977,
            byte: 86,
        },
        LoseNextCommitAnswer,
        Open {
            name: 2,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
    ]);
}

/// The feed variant's premise: a file the mount has cached (trusted for 600 s) and then
/// changed in the sandbox shows its new content once the feed has told the mount, with no
/// time passing; so does the mount's own save after it, with no conflict.
#[test]
fn a_sandbox_change_reaches_a_mount_trusting_its_caches_through_the_feed() {
    use Step::*;
    run_followed(&[
        Open {
            name: 0,
            slot: 0,
            write: true,
            create: true,
            trunc: false,
        },
        Write {
            slot: 0,
            offset: 0,
            len: 100,
            byte: 1,
        },
        Fsync(0),
        Close(0),
        Read(0),
        SandboxWrite {
            name: 0,
            len: 3000,
            byte: 2,
        },
        Open {
            name: 0,
            slot: 1,
            write: true,
            create: false,
            trunc: false,
        },
        Write {
            slot: 1,
            offset: 10,
            len: 10,
            byte: 3,
        },
        Close(1),
    ]);
}

/// Shrunk by the proptest (feed variant, under load): a new file whose first push failed,
/// renamed over one name of a file linked in the sandbox, must replace that name.
#[test]
fn a_new_file_with_a_failed_push_renamed_over_a_linked_name_replaces_it() {
    use Step::*;
    let steps = [
        SandboxWrite {
            name: 2,
            len: 1,
            byte: 0,
        },
        FailNextCommit,
        Link { from: 2, to: 1 },
        Open {
            name: 0,
            slot: 0,
            write: false,
            create: true,
            trunc: false,
        },
        Close(0),
        Rename { from: 0, to: 1 },
    ];
    run(&steps);
    run_followed(&steps);
}

/// Shrunk by the proptest: a push queued by a close failed (the sandbox taken for out of
/// reach) after the sandbox made `c`, which the feed reported; `c` was then looked up from
/// the listing fetched before it, served stale while out of reach: "no such file".
#[test]
fn a_name_the_feed_reported_made_is_not_missing_while_the_sandbox_is_out_of_reach() {
    use Step::*;
    for _ in 0..20 {
        run_followed(&[
            FailNextCommit,
            SandboxWrite {
                name: 2,
                len: 134,
                byte: 166,
            },
            Open {
                name: 1,
                slot: 3,
                write: false,
                create: true,
                trunc: false,
            },
            Close(3),
            ForgetAll,
        ]);
    }
}

/// A rename of a file with two names, reported by the change feed while the rename is being
/// applied: the feed's event once re-made the old name from the listing's entry, which the
/// rename had not dropped yet (`c` still listed after `mv c b`: 1 run in 15 of this case).
#[test]
fn a_rename_the_feed_reports_while_it_is_applied_leaves_no_old_name() {
    use Step::*;
    let steps = vec![
        SandboxWrite {
            name: 2,
            len: 3773,
            byte: 7,
        },
        Link { from: 2, to: 0 },
        Open {
            name: 2,
            slot: 2,
            write: true,
            create: true,
            trunc: true,
        },
        Open {
            name: 2,
            slot: 0,
            write: false,
            create: true,
            trunc: false,
        },
        Rename { from: 2, to: 1 },
        RenameDirOverQueuedFile { len: 41, byte: 159 },
    ];
    for _ in 0..100 {
        run_followed(&steps);
    }
}
