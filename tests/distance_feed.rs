//! Long caches kept true by the change feed: while the feed is connected, what the mount has
//! cached is trusted indefinitely (warm commands cost no request), and a change made in the
//! sandbox reaches the mount through the feed; when the feed drops or loses events, the mount
//! revalidates. Real agents and FUSE mounts, plus the core over the in-memory sandbox where a
//! fault (a feed cut at a chosen moment) must be placed exactly.

use crate::common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sbxfs::mount::core::{CoreConfig, FsCore};
use sbxfs::mount::inode::ROOT;
use sbxfs::remote::faulty::{Fault, FaultyRemote, Op};
use sbxfs::remote::memory::MemoryRemote;
use sbxfs::remote::{Remote, RemoteError, RemotePath};
use serde_json::Value;

/// Only stops a hung test: nothing here asserts how fast anything is.
const DEADLINE: Duration = Duration::from_secs(20);
/// A TTL no test outlives: whatever the mount sees of a sandbox change came from the feed.
const LONG_TTL_MS: &str = "600000";

fn status(m: &MountProcess) -> Value {
    let (code, out, err) = run(Command::new(sbxfs_bin()).args([
        "ctl",
        "--mount",
        m.dir.to_str().unwrap(),
        "status",
        "--json",
    ]));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    serde_json::from_slice(&out).unwrap()
}

/// Poll `check` until it holds; panics with `what` at the deadline.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < DEADLINE, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn feed_connected(m: &MountProcess) {
    eventually("the feed connects", || {
        status(m)["feed"]["state"] == "connected"
    });
}

fn workspace_requests(agent: &AgentProcess) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stats = rt.block_on(agent.client().agent_stats()).unwrap();
    stats["workspace_requests"].as_u64().unwrap()
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok()
}

#[test]
fn sandbox_changes_reach_a_mount_whose_caches_are_long() {
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/held.txt"), "old content\n").unwrap();
    fs::write(root.join("d/doomed.txt"), "bye\n").unwrap();
    fs::write(root.join("d/from.txt"), "moving\n").unwrap();
    let agent = AgentProcess::start(root);
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    let d = m.dir.join("d");
    feed_connected(&m);

    // Everything seen once: attributes, the listing, the held file's pages in the kernel.
    let mut held = fs::File::open(d.join("held.txt")).unwrap();
    let mut first = String::new();
    held.read_to_string(&mut first).unwrap();
    assert_eq!(first, "old content\n");
    assert_eq!(read(&d.join("held.txt")).unwrap(), "old content\n");
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["doomed.txt", "from.txt", "held.txt"]);
    assert!(d.join("doomed.txt").exists());
    assert!(fs::metadata(d.join("new.txt")).is_err());

    // The sandbox changes each of them behind the mount's back.
    fs::write(root.join("d/held.txt"), "new content, longer\n").unwrap();
    fs::write(root.join("d/new.txt"), "fresh\n").unwrap();
    fs::remove_file(root.join("d/doomed.txt")).unwrap();
    fs::rename(root.join("d/from.txt"), root.join("d/to.txt")).unwrap();

    // `cat` of a file whose pages the kernel keeps (held open all along).
    eventually("the changed file's new content", || {
        read(&d.join("held.txt")).as_deref() == Some("new content, longer\n")
    });
    // `stat`.
    eventually("the new size", || {
        fs::metadata(d.join("held.txt")).is_ok_and(|m| m.len() == 20)
    });
    eventually("the created file", || {
        read(&d.join("new.txt")).as_deref() == Some("fresh\n")
    });
    eventually("the deleted file gone", || {
        fs::symlink_metadata(d.join("doomed.txt")).is_err()
    });
    eventually("the renamed file under its new name only", || {
        read(&d.join("to.txt")).as_deref() == Some("moving\n")
            && fs::symlink_metadata(d.join("from.txt")).is_err()
    });
    // `ls`.
    eventually("the listing", || {
        let mut names: Vec<String> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names == ["held.txt", "new.txt", "to.txt"]
    });
    // The descriptor held open all along reads what a local file would show.
    held.seek(SeekFrom::Start(0)).unwrap();
    let mut again = String::new();
    held.read_to_string(&mut again).unwrap();
    assert_eq!(again, "new content, longer\n");
    let s = status(&m);
    assert_eq!(s["feed"]["state"], "connected", "{s}");
    assert!(s["feed"]["events"].as_u64().unwrap() >= 4, "{s}");
}

/// The feed applied every event it has numbered (none waits in a batch).
fn feed_applied(m: &MountProcess, events_at_least: u64) {
    eventually("the feed applies the sandbox's events", || {
        let f = &status(m)["feed"];
        f["events"].as_u64().unwrap_or(0) >= events_at_least
            && !f["last_seq"].is_null()
            && f["applied_seq"] == f["last_seq"]
    });
}

#[test]
fn a_sandbox_change_reported_while_the_file_was_still_open_after_a_save_is_seen_once_it_closes() {
    // A file saved through the mount keeps its staged image while another descriptor holds
    // it open (under load, a `close` reaches the daemon late: the same state). An event
    // for it then was not checked, and after the close the long caches kept the old file.
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path();
    fs::write(root.join("f"), "made in the sandbox\n").unwrap();
    let agent = AgentProcess::start(root);
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    let f = m.dir.join("f");
    feed_connected(&m);
    // The replacement is made before the save frees the file's first inode number, which
    // ext4 would give it otherwise: the number the mount showed all along would then pass
    // for a fresh one (or, while the held file lives, the mount shows a spare).
    fs::write(root.join("g"), "replacement\n").unwrap();
    let replaced = fs::metadata(root.join("g")).unwrap().ino();
    let held = fs::File::open(&f).unwrap();
    let shown_before = held.metadata().unwrap().ino();
    assert_ne!(shown_before, replaced);
    fs::write(&f, "saved here\n").unwrap();
    eventually("the save is in the sandbox", || {
        read(&root.join("f")).as_deref() == Some("saved here\n")
    });
    let before = status(&m)["feed"]["events"].as_u64().unwrap();
    // Replaced by another program in the sandbox.
    fs::rename(root.join("g"), root.join("f")).unwrap();
    feed_applied(&m, before + 1);
    drop(held);
    eventually("the replacement's content", || {
        read(&f).as_deref() == Some("replacement\n")
    });
    eventually("the replacement's inode number", || {
        fs::metadata(&f).is_ok_and(|a| a.ino() == replaced)
    });
}

#[test]
fn warm_find_and_cat_make_no_remote_request() {
    let ws = tempfile::tempdir().unwrap();
    for d in 0..5 {
        let dir = ws.path().join(format!("dir{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..6 {
            fs::write(dir.join(format!("f{f}.txt")), format!("{d}/{f}\n")).unwrap();
        }
    }
    let agent = AgentProcess::start(ws.path());
    // The default TTL (1 s): only the feed makes the caches outlive it.
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    let find = || {
        let (code, out, err) = run(Command::new("find").arg(&m.dir).args(["-type", "f"]));
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        let mut lines: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    };
    let cat_all = || {
        (0..5)
            .flat_map(|d| (0..6).map(move |f| (d, f)))
            .map(|(d, f)| read(&m.dir.join(format!("dir{d}/f{f}.txt"))).unwrap())
            .collect::<Vec<_>>()
    };
    let cold_find = find();
    assert_eq!(cold_find.len(), 30);
    let cold_cat = cat_all();
    // Past the TTL: without the feed, every one of these would ask again.
    std::thread::sleep(Duration::from_millis(1500));
    let before = workspace_requests(&agent);
    assert_eq!(find(), cold_find);
    assert_eq!(cat_all(), cold_cat);
    let _ = fs::metadata(m.dir.join("dir3/f2.txt")).unwrap();
    let after = workspace_requests(&agent);
    assert_eq!(
        after - before,
        0,
        "a warm find and cat asked the sandbox {} times",
        after - before
    );
}

#[test]
fn own_writes_survive_their_own_change_events() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    feed_connected(&m);
    let path = m.dir.join("mine.txt");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let events = status(&m)["feed"]["events"].as_u64().unwrap();
    f.write_all(b"hello").unwrap();
    f.sync_all().unwrap();
    // The sandbox reports our own push back; the mount applies it.
    eventually("the push's own events arrive", || {
        fs::read(ws.path().join("mine.txt")).is_ok_and(|d| d == b"hello")
            && status(&m)["feed"]["events"].as_u64().unwrap() > events
    });
    // The same descriptor goes on writing, and reads what it wrote.
    f.write_all(b" world").unwrap();
    let mut back = vec![0; 11];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, b"hello world");
    drop(f);
    assert_eq!(read(&path).unwrap(), "hello world");
    eventually("the sandbox has the whole file", || {
        fs::read(ws.path().join("mine.txt")).is_ok_and(|d| d == b"hello world")
    });
    // Again after its events too.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(read(&path).unwrap(), "hello world");
    assert_eq!(fs::metadata(&path).unwrap().len(), 11);
}

#[test]
fn a_change_made_while_the_agent_was_down_is_seen_once_the_feed_is_back() {
    let ws = tempfile::tempdir().unwrap();
    fs::write(ws.path().join("f.txt"), "before\n").unwrap();
    let mut agent = AgentProcess::start(ws.path());
    let addr = agent.addr;
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    feed_connected(&m);
    assert_eq!(read(&m.dir.join("f.txt")).unwrap(), "before\n");

    agent.kill();
    eventually("status says the feed is reconnecting", || {
        let s = status(&m);
        s["feed"]["state"] == "reconnecting" && s["feed"]["trusted"] == false
    });
    let down = status(&m);
    assert!(
        down["feed"]["since_unix_ms"].as_u64().unwrap() > 0,
        "{down}"
    );
    // No agent watches while it is down: no event will ever say this happened.
    fs::write(ws.path().join("f.txt"), "changed while nobody watched\n").unwrap();
    let _agent = AgentProcess::start_on(ws.path(), addr);

    eventually("the feed reconnects and revalidates", || {
        let s = status(&m);
        s["feed"]["state"] == "connected" && s["feed"]["revalidations"].as_u64().unwrap() >= 2
    });
    eventually("the change is seen after reconnection", || {
        read(&m.dir.join("f.txt")).as_deref() == Some("changed while nobody watched\n")
    });
    let s = status(&m);
    assert_eq!(s["feed"]["trusted"], true, "{s}");
    let last = &s["feed"]["last_revalidation"];
    assert_eq!(last["reason"], "feed reconnected", "{s}");
    assert!(last["checked"].as_u64().unwrap() >= 1, "{s}");
    let log = m.log_text();
    assert!(log.contains("change feed unavailable"), "{log}");
    assert!(log.contains("revalidated"), "{log}");
}

// --- the core over the in-memory sandbox: faults placed exactly

struct Core {
    core: Arc<FsCore>,
    memory: MemoryRemote,
    faults: sbxfs::remote::faulty::FaultControl,
    rt: tokio::runtime::Runtime,
    _staging: tempfile::TempDir,
}

fn core_over_memory(
    ttl: Duration,
    prepare: impl FnOnce(&MemoryRemote, &sbxfs::remote::faulty::FaultControl),
) -> Core {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let memory = MemoryRemote::new();
    let faulty = FaultyRemote::new(memory.clone());
    let faults = faulty.control();
    prepare(&memory, &faults);
    let remote: Arc<dyn Remote> = Arc::new(faulty);
    let root = rt.block_on(remote.stat(&RemotePath::root())).unwrap();
    let staging = tempfile::tempdir().unwrap();
    let core = FsCore::new(
        remote,
        CoreConfig {
            attr_ttl: ttl,
            cache_bytes: 4 << 20,
            staging_dir: staging.path().to_path_buf(),
            tree_max: sbxfs::mount::subtree::DEFAULT_TREE_MAX,
            clock: Default::default(),
        },
        root,
    );
    rt.spawn(sbxfs::mount::feed::follow(
        core.clone(),
        None,
        sbxfs::mount::feed::DEFAULT_RECHECK,
    ));
    Core {
        core,
        memory,
        faults,
        rt,
        _staging: staging,
    }
}

impl Core {
    fn feed(&self) -> Value {
        self.core.feed_status()
    }

    fn cat(&self, name: &str) -> Vec<u8> {
        self.rt.block_on(async {
            let node = self.core.lookup(ROOT, name.as_bytes()).await.unwrap().node;
            let (fh, _) = self.core.open(node, false, false).await.unwrap();
            let data = self.core.read(fh, 0, 1 << 20).await.unwrap();
            self.core.release(fh).await.unwrap();
            data
        })
    }
}

#[test]
fn lost_events_make_the_mount_revalidate_everything() {
    let c = core_over_memory(Duration::from_secs(600), |m, f| {
        m.sandbox().write("a", b"one").unwrap();
        // Keeps fewer events than happen while the feed is away.
        m.set_ring_events(4);
        // The first feed breaks after two events; the reconnect waits until released.
        f.inject(Op::Watch, Fault::Cut { after: 2 }, Some(1));
        f.inject(Op::Watch, Fault::Hang, Some(1));
    });
    let sb = c.memory.sandbox();
    eventually("connected", || c.feed()["state"] == "connected");
    assert_eq!(c.cat("a"), b"one");
    sb.write("x1", b"1").unwrap();
    sb.write("x2", b"2").unwrap();
    eventually("the cut feed reconnects (and hangs there)", || {
        c.faults.hanging() == 1
    });
    assert_eq!(c.feed()["trusted"], false);
    // While it is away, more changes than the feed keeps for a reconnecting client.
    sb.write("a", b"two!").unwrap();
    for i in 0..10 {
        sb.write(format!("y{i}"), b"y").unwrap();
    }
    c.faults.release();
    eventually("the lost events are reported and revalidated", || {
        let f = c.feed();
        f["state"] == "connected"
            && f["lost_events"].as_u64().unwrap() >= 1
            && f["last_revalidation"]["reason"] == "lost events"
    });
    assert_eq!(c.cat("a"), b"two!");
}

#[test]
fn with_the_feed_connected_warm_calls_stay_local_past_the_ttl() {
    let c = core_over_memory(Duration::from_millis(50), |m, _| {
        m.sandbox().write("f", b"cached").unwrap()
    });
    // Connected and caught up (trust comes after the revalidation that follows connecting,
    // which a loaded machine can delay).
    eventually("connected and trusted", || {
        let f = c.feed();
        f["state"] == "connected" && f["trusted"] == true
    });
    assert_eq!(c.cat("f"), b"cached");
    std::thread::sleep(Duration::from_millis(200));
    c.faults.reset_counts();
    assert_eq!(c.cat("f"), b"cached");
    let node = c.rt.block_on(c.core.lookup(ROOT, b"f")).unwrap().node;
    c.rt.block_on(c.core.getattr(node)).unwrap();
    for op in [Op::Stat, Op::List, Op::Read, Op::StatMany] {
        assert_eq!(c.faults.calls(op), 0, "{op:?} asked of the sandbox");
    }
    // A change in the sandbox is still seen, through the feed.
    c.memory.sandbox().write("f", b"changed").unwrap();
    eventually("the change arrives", || c.cat("f") == b"changed");
}

#[test]
fn a_remote_without_a_feed_keeps_the_ttl() {
    let ttl = Duration::from_millis(100);
    let c = core_over_memory(ttl, |m, f| {
        m.sandbox().write("f", b"one").unwrap();
        f.fail_always(Op::Watch, RemoteError::Unsupported("no feed here".into()))
    });
    eventually("the feed is known to be missing", || {
        c.feed()["state"] == "unsupported"
    });
    assert_eq!(c.feed()["trusted"], false);
    assert_eq!(c.core.ttl(), ttl);
    assert_eq!(c.cat("f"), b"one");
    // Past the TTL, each look asks again.
    std::thread::sleep(ttl * 2);
    c.faults.reset_counts();
    let node = c.rt.block_on(c.core.lookup(ROOT, b"f")).unwrap().node;
    c.rt.block_on(c.core.getattr(node)).unwrap();
    assert!(c.faults.calls(Op::Stat) + c.faults.calls(Op::List) + c.faults.calls(Op::Tree) >= 1);
    c.memory.sandbox().write("f", b"two").unwrap();
    eventually("the TTL lets the change in", || c.cat("f") == b"two");
}

fn metadata_requests(agent: &AgentProcess) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stats = rt.block_on(agent.client().agent_stats()).unwrap();
    stats["metadata_requests"].as_u64().unwrap()
}

#[test]
fn the_mounts_own_saves_come_back_as_its_own_and_cost_no_check() {
    // Each push's change event used to cost a batched stat, and an event crossing the push's
    // answer could make the mount's own save look like the sandbox's.
    let ws = tempfile::tempdir().unwrap();
    for i in 0..10 {
        fs::write(ws.path().join(format!("f{i}")), "made in the sandbox\n").unwrap();
    }
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    feed_connected(&m);
    for i in 0..10 {
        assert_eq!(
            read(&m.dir.join(format!("f{i}"))).unwrap(),
            "made in the sandbox\n"
        );
    }
    let before = metadata_requests(&agent);
    let own_before = status(&m)["feed"]["own_events"].as_u64().unwrap();
    for i in 0..10 {
        let mut f = fs::File::create(m.dir.join(format!("f{i}"))).unwrap();
        f.write_all(format!("saved {i}\n").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    eventually("every save comes back as the mount's own", || {
        status(&m)["feed"]["own_events"].as_u64().unwrap() >= own_before + 10
    });
    feed_applied(&m, 0);
    let checks = metadata_requests(&agent) - before;
    assert_eq!(
        checks, 0,
        "the mount's own saves cost {checks} metadata requests"
    );
    for i in 0..10 {
        let want = format!("saved {i}\n");
        assert_eq!(read(&ws.path().join(format!("f{i}"))).unwrap(), want);
        assert_eq!(read(&m.dir.join(format!("f{i}"))).unwrap(), want);
    }
    // A change made in the sandbox is still checked and seen.
    fs::write(ws.path().join("f3"), "changed in the sandbox\n").unwrap();
    eventually("the sandbox's change", || {
        read(&m.dir.join("f3")).as_deref() == Some("changed in the sandbox\n")
    });
}

#[test]
fn the_mounts_own_names_come_back_as_its_own_and_cost_no_check() {
    // A name the mount made, removed or renamed came back as a foreign change: its parent's
    // listing dropped and fetched again, its node checked.
    let ws = tempfile::tempdir().unwrap();
    fs::write(ws.path().join("old.txt"), "x\n").unwrap();
    fs::write(ws.path().join("gone.txt"), "x\n").unwrap();
    fs::create_dir(ws.path().join("full")).unwrap();
    fs::write(ws.path().join("full/theirs"), "x\n").unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", LONG_TTL_MS]);
    feed_connected(&m);
    assert_eq!(fs::read_dir(&m.dir).unwrap().count(), 3);
    let before = metadata_requests(&agent);
    let own_before = status(&m)["feed"]["own_events"].as_u64().unwrap();
    fs::create_dir(m.dir.join("d")).unwrap();
    std::os::unix::fs::symlink("old.txt", m.dir.join("link")).unwrap();
    fs::remove_file(m.dir.join("gone.txt")).unwrap();
    fs::remove_dir(m.dir.join("d")).unwrap();
    fs::hard_link(m.dir.join("old.txt"), m.dir.join("hard")).unwrap();
    // Last: a rename (and a link) lists its directories again at their next look, for the
    // link counts and ctime the sandbox gives the names.
    fs::rename(m.dir.join("old.txt"), m.dir.join("new.txt")).unwrap();
    // mkdir, symlink, unlink, rmdir, link, and the rename: its first half and the whole (the
    // agent drops the second half the whole says).
    eventually("every change comes back as the mount's own", || {
        status(&m)["feed"]["own_events"].as_u64().unwrap() >= own_before + 7
    });
    feed_applied(&m, 0);
    let checks = metadata_requests(&agent) - before;
    assert_eq!(
        checks, 0,
        "the mount's own names cost {checks} metadata requests"
    );
    let listed = |dir: &std::path::Path| {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listed(&m.dir), ["full", "hard", "link", "new.txt"]);
    assert_eq!(listed(ws.path()), ["full", "hard", "link", "new.txt"]);
    // A change the sandbox refused is withdrawn: the same change made there later is the
    // sandbox's, and is seen.
    assert_eq!(
        fs::remove_dir(m.dir.join("full"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    let own_now = status(&m)["feed"]["own_events"].as_u64().unwrap();
    fs::remove_file(ws.path().join("full/theirs")).unwrap();
    fs::remove_dir(ws.path().join("full")).unwrap();
    fs::create_dir(ws.path().join("theirs")).unwrap();
    eventually("the sandbox's changes", || {
        m.dir.join("theirs").is_dir() && !m.dir.join("full").exists()
    });
    assert_eq!(
        status(&m)["feed"]["own_events"].as_u64().unwrap(),
        own_now,
        "a change made in the sandbox counted as the mount's"
    );
}

#[test]
fn a_file_reads_back_while_its_push_is_on_the_way() {
    // The push holds the file's staged image for the whole upload; reads used to wait for
    // it (a 2 GiB sparse file over `shell:` held `pread` for minutes). The commit here hangs
    // until released: a slow upload on demand.
    let c = core_over_memory(Duration::from_secs(1), |_, _| {});
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (node, fh) = c.rt.block_on(async {
        let (made, fh) = c
            .core
            .create(ROOT, b"big.bin", 0o644, true, false)
            .await
            .unwrap();
        c.core.write(fh, 0, &data).await.unwrap();
        (made.node, fh)
    });
    c.faults.inject(Op::Commit, Fault::Hang, Some(1));
    let core = c.core.clone();
    let pushing = c.rt.spawn(async move { core.fsync(fh).await });
    eventually("the push is on its way", || c.faults.calls(Op::Commit) >= 1);
    let back = c.rt.block_on(async {
        let (reader, _) = c.core.open(node, false, false).await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            let mut all = Vec::new();
            while all.len() < data.len() {
                let got = c.core.read(reader, all.len() as u64, 65536).await.unwrap();
                assert!(!got.is_empty(), "the file ended early");
                all.extend(got);
            }
            all
        })
        .await
        .expect("the read waited for the push");
        c.core.release(reader).await.unwrap();
        read
    });
    assert!(back == data, "read back other bytes than written");
    assert!(!pushing.is_finished(), "the push was still on its way");
    c.faults.release();
    c.rt.block_on(pushing).unwrap().unwrap();
    assert_eq!(
        c.rt.block_on(
            c.memory
                .read(&RemotePath::new(b"big.bin".to_vec()).unwrap(), 0, 300_000)
        )
        .unwrap()
        .data,
        data
    );
    c.rt.block_on(c.core.release(fh)).unwrap();
}

/// What the kernel asked the daemon while `run` ran, by request type.
fn kernel_requests_during(
    m: &MountProcess,
    run: impl FnOnce(),
) -> std::collections::BTreeMap<String, u64> {
    let counts = || {
        ctl_stats(&m.dir)["stats"]["kernel_requests"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = counts();
    run();
    counts()
        .into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0);
            (k, d)
        })
        .filter(|(_, d)| *d > 0)
        .collect()
}

#[test]
fn a_warm_ls_lr_past_the_ttl_costs_no_lookup_and_sandbox_changes_still_show() {
    // While the feed vouches for the caches, the kernel keeps names as long as attributes,
    // and a file's "no extended attributes" is answered without a task: `ls -l` asks two per
    // name. Before, every name was looked up again once the 1 s TTL passed.
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path();
    for d in 0..4 {
        fs::create_dir_all(root.join(format!("d{d}/sub"))).unwrap();
        for f in 0..8 {
            fs::write(root.join(format!("d{d}/f{f}.txt")), "x\n").unwrap();
            fs::write(root.join(format!("d{d}/sub/g{f}.txt")), "y\n").unwrap();
        }
    }
    let mut agent = AgentProcess::start(root);
    let addr = agent.addr;
    // The default TTL (1 s): the test waits past it.
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    let ls = || {
        let (code, out, err) = run(Command::new("ls").arg("-lR").arg(&m.dir));
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        String::from_utf8(out).unwrap()
    };
    let first = ls();
    assert!(first.contains("g7.txt"), "{first}");
    std::thread::sleep(Duration::from_millis(1200));
    let asked = kernel_requests_during(&m, || assert_eq!(ls(), first));
    assert_eq!(asked.get("lookup"), None, "{asked:?}");
    // Nor a listing: the kernel keeps each directory's entries (FOPEN_CACHE_DIR).
    assert_eq!(asked.get("readdir"), None, "{asked:?}");
    // Only the mount's root asks (its label and two ACLs): the walk does not list it.
    assert!(asked.get("getxattr").is_none_or(|n| *n <= 3), "{asked:?}");
    assert!(
        asked.get("getxattr_at_once").is_some_and(|n| *n >= 64),
        "{asked:?}"
    );

    // The sandbox removes, renames and makes names: each shows, though the kernel kept the
    // old names.
    fs::remove_file(root.join("d0/f0.txt")).unwrap();
    fs::rename(root.join("d1/f1.txt"), root.join("d1/renamed.txt")).unwrap();
    fs::create_dir(root.join("d2/new")).unwrap();
    fs::write(root.join("d2/new/h.txt"), "z\n").unwrap();
    let listed = |p: &str, name: &str| {
        fs::read_dir(m.dir.join(p))
            .map(|d| d.flatten().any(|e| e.file_name() == name))
            .unwrap_or(false)
    };
    let gone = |p: &str| {
        let (dir, name) = p.rsplit_once('/').unwrap();
        fs::symlink_metadata(m.dir.join(p)).is_err() && !listed(dir, name)
    };
    let there = |p: &str| {
        let (dir, name) = p.rsplit_once('/').unwrap();
        fs::symlink_metadata(m.dir.join(p)).is_ok() && listed(dir, name)
    };
    eventually(
        "the sandbox's changes show through the kept names and listings",
        || {
            gone("d0/f0.txt")
                && gone("d1/f1.txt")
                && there("d1/renamed.txt")
                && there("d2/new/h.txt")
        },
    );

    // No feed while the agent is down: nothing vouches, and a change made meanwhile shows
    // once it is back (the revalidation that follows drops the names that went).
    for p in ["d3/f3.txt", "d3/sub/g3.txt"] {
        assert!(there(p), "{p}");
    }
    agent.kill();
    eventually("the feed is down", || {
        status(&m)["feed"]["trusted"] == false
    });
    fs::remove_file(root.join("d3/f3.txt")).unwrap();
    fs::rename(root.join("d3/sub/g3.txt"), root.join("d3/sub/moved.txt")).unwrap();
    let _agent = AgentProcess::start_on(root, addr);
    eventually("changes made while nobody watched show", || {
        gone("d3/f3.txt") && gone("d3/sub/g3.txt") && there("d3/sub/moved.txt")
    });
}

#[test]
fn writes_to_a_file_ask_the_daemon_nothing_but_the_writes() {
    // The kernel asked for `security.capability` before every write (to drop file
    // capabilities): a daemon request each, eleven per SQLite transaction. With
    // FUSE_HANDLE_KILLPRIV_V2 it asks once per file, then marks it S_NOSEC.
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    let path = m.dir.join("many-writes.bin");
    let mut f = fs::File::create(&path).unwrap();
    f.write_all(b"first").unwrap();
    let asked = kernel_requests_during(&m, || {
        for i in 0..100u64 {
            f.write_all_at(&[b'a' + (i % 26) as u8; 10], i * 10)
                .unwrap();
        }
    });
    drop(f);
    assert!(asked.get("write").is_some_and(|n| *n >= 100), "{asked:?}");
    assert!(
        asked.get("getxattr_at_once").is_none_or(|n| *n <= 1),
        "{asked:?}"
    );
    let mut m = m;
    assert_eq!(m.stop(), Some(0), "the unmount pushed everything");
    let on_sandbox = fs::read(ws.path().join("many-writes.bin")).unwrap();
    assert_eq!(on_sandbox.len(), 1000);
    assert_eq!(&on_sandbox[990..], &[b'a' + (99 % 26) as u8; 10]);
    drop(agent);
}

/// What git does for every object it writes: a temp file, a hard link to its name, the temp
/// removed. The feed's check of the removed temp name found the file gone, and the mount
/// kept asking for it by that name: `cat` of the object said ENOENT and git's mmap of it
/// died of SIGBUS (`git log -p` through the mount after a commit in the sandbox).
fn files_written_as_git_writes_objects_read_back(m: &MountProcess, root: &Path) {
    fs::create_dir(root.join("objects")).unwrap();
    eventually("the directory shows", || m.dir.join("objects").is_dir());
    // Held by a reader, as git's directory walk would: the sandbox's changes are echoed in it.
    let _ = fs::read_dir(m.dir.join("objects")).unwrap().count();
    std::thread::sleep(Duration::from_millis(1200));
    for i in 0..10 {
        let tmp = root.join(format!("objects/tmp_obj_{i}"));
        fs::write(&tmp, format!("object {i}\n")).unwrap();
        // Each step a moment apart, as git's are: the temp's creation is echoed before it goes.
        std::thread::sleep(Duration::from_millis(30 * (i % 4)));
        fs::hard_link(&tmp, root.join(format!("objects/{i:02x}"))).unwrap();
        std::thread::sleep(Duration::from_millis(30 * (i % 3)));
        fs::remove_file(&tmp).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..10 {
        let obj = m.dir.join(format!("objects/{i:02x}"));
        eventually(&format!("object {i} reads back"), || {
            read(&obj).as_deref() == Some(format!("object {i}\n").as_str())
        });
    }
    // And they stay readable once every event is in.
    std::thread::sleep(Duration::from_millis(1500));
    for i in 0..10 {
        let obj = m.dir.join(format!("objects/{i:02x}"));
        assert_eq!(
            read(&obj).as_deref(),
            Some(format!("object {i}\n").as_str()),
            "{i:02x}"
        );
    }
}

#[test]
fn files_written_as_git_writes_objects_read_back_agent() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    files_written_as_git_writes_objects_read_back(&m, ws.path());
}

#[test]
fn files_written_as_git_writes_objects_read_back_shell() {
    let ws = tempfile::tempdir().unwrap();
    let m = MountProcess::start_url(&format!("shell:{}", ws.path().display()), "unused", &[]);
    feed_connected(&m);
    files_written_as_git_writes_objects_read_back(&m, ws.path());
}

/// The sandbox rewrites a file in place (truncate, then chunks) again and again while the
/// laptop reads it: every read is some prefix of what the file held, never NULs. Through
/// the page cache the kernel padded a read the rewrite had cut short with zeros up to the
/// size it knew, whenever the feed's invalidation (or another READ's end) reached it while
/// the READ was out: 3.4 % of `open; read; close` rounds, and a handle kept open met it too.
fn reads_of_a_file_rewritten_in_place_never_show_nuls(m: &MountProcess, root: &Path) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _load = CpuHogs::start();
    let path = root.join("rewritten");
    fs::write(&path, vec![b'A'; 300_000]).unwrap();
    eventually("the file shows", || m.dir.join("rewritten").is_file());
    // A handle opened before the rewrites start (the page-cache path throughout).
    let mut held = fs::File::open(m.dir.join("rewritten")).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let letter = b'A' + (n % 26) as u8;
                let size = 50_000 + (n as usize * 37_813) % 500_000;
                let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(0).unwrap();
                for chunk in vec![letter; size].chunks(65_536) {
                    f.write_all(chunk).unwrap();
                }
                drop(f);
                n += 1;
                std::thread::sleep(Duration::from_millis(2 + u64::from(n % 10)));
            }
            n
        })
    };
    let nuls = |what: &str, data: &[u8]| {
        data.iter()
            .position(|&b| b == 0)
            .map(|at| format!("{what}: NUL at {at} of {} bytes", data.len()))
    };
    let (mut bad, mut kept_bad) = (Vec::new(), Vec::new());
    let (mut fresh, mut kept) = (0, 0);
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        match fs::read(m.dir.join("rewritten")) {
            Ok(data) => bad.extend(nuls("open, read, close", &data)),
            Err(e) => bad.push(format!("open, read, close: {e}")),
        }
        fresh += 1;
    }
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let mut data = Vec::new();
        held.seek(SeekFrom::Start(0)).unwrap();
        match held.read_to_end(&mut data) {
            Ok(_) => kept_bad.extend(nuls("a handle kept open", &data)),
            Err(e) => bad.push(format!("a handle kept open: {e}")),
        }
        kept += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rewrites = writer.join().unwrap();
    assert!(
        rewrites > 50,
        "the sandbox rewrote the file only {rewrites} times"
    );
    assert!(
        bad.is_empty(),
        "{} of {fresh} + {kept} reads went wrong ({rewrites} rewrites): {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    // A handle opened before the rewrites reads through the page cache, where a READ the
    // kernel sent before the daemon could hold the file's invalidations can still meet one
    // (docs/consistency.md): rare, never a run of them.
    assert!(
        kept_bad.len() <= 1,
        "{} of {kept} reads of a kept handle met NULs: {:?}",
        kept_bad.len(),
        &kept_bad[..kept_bad.len().min(5)]
    );
}

#[test]
fn reads_of_a_file_rewritten_in_place_never_show_nuls_agent() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    reads_of_a_file_rewritten_in_place_never_show_nuls(&m, ws.path());
}

#[test]
fn reads_of_a_file_rewritten_in_place_never_show_nuls_shell() {
    let ws = tempfile::tempdir().unwrap();
    let m = MountProcess::start_url(&format!("shell:{}", ws.path().display()), "unused", &[]);
    feed_connected(&m);
    reads_of_a_file_rewritten_in_place_never_show_nuls(&m, ws.path());
}

/// New bytes under the old size and mtime (`cp -p`, `rsync -t --inplace`) carry the old
/// version: the mount served the old bytes for ever, `ctl invalidate` included. The ctime
/// moved, and the pages are read again.
fn a_rewrite_that_keeps_size_and_mtime_shows(m: &MountProcess, root: &Path) {
    let path = root.join("conf");
    let same_times = |f: &Path| {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let file = fs::OpenOptions::new().write(true).open(f).unwrap();
        file.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    };
    fs::write(&path, "config = alpha\n").unwrap();
    same_times(&path);
    eventually("the first bytes show", || {
        read(&m.dir.join("conf")).as_deref() == Some("config = alpha\n")
    });
    for (i, word) in ["bravo", "charl", "delta"].iter().enumerate() {
        fs::write(&path, format!("config = {word}\n")).unwrap();
        same_times(&path);
        let want = format!("config = {word}\n");
        eventually(&format!("rewrite {i} shows"), || {
            read(&m.dir.join("conf")).as_deref() == Some(want.as_str())
        });
    }
}

#[test]
fn a_rewrite_that_keeps_size_and_mtime_shows_agent() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &[]);
    feed_connected(&m);
    a_rewrite_that_keeps_size_and_mtime_shows(&m, ws.path());
}

#[test]
fn a_rewrite_that_keeps_size_and_mtime_shows_shell() {
    let ws = tempfile::tempdir().unwrap();
    let m = MountProcess::start_url(&format!("shell:{}", ws.path().display()), "unused", &[]);
    feed_connected(&m);
    a_rewrite_that_keeps_size_and_mtime_shows(&m, ws.path());
}

/// The exec-only scripts have no feed: past the TTL the new change time (same version) drops
/// the pages (new-user trial: the old bytes were served for good).
#[test]
fn a_rewrite_that_keeps_size_and_mtime_shows_without_a_feed() {
    let ws = tempfile::tempdir().unwrap();
    let url = format!("shell:{}?agent=no", ws.path().display());
    let m = MountProcess::start_url(&url, "unused", &[]);
    a_rewrite_that_keeps_size_and_mtime_shows(&m, ws.path());
}

/// A write inotify does not report: through a hard link from outside the workspace (the
/// workspace's watches see nothing). It shows within the re-check period (`-o recheck_s`),
/// the feed connected all along.
fn a_change_inotify_misses_shows_within_the_recheck(m: &MountProcess, root: &Path) {
    let outside = tempfile::tempdir_in(root.parent().unwrap()).unwrap();
    let path = root.join("linked");
    fs::write(&path, "before: 1\n").unwrap();
    let other = outside.path().join("linked");
    fs::hard_link(&path, &other).unwrap();
    eventually("the first bytes show", || {
        read(&m.dir.join("linked")).as_deref() == Some("before: 1\n")
    });
    for text in ["after: 22\n", "again: 333\n"] {
        fs::write(&other, text).unwrap();
        eventually(&format!("{text:?} shows"), || {
            read(&m.dir.join("linked")).as_deref() == Some(text)
        });
    }
    assert_eq!(status(m)["feed"]["state"], "connected");
    assert!(status(m)["feed"]["recheck"]["changed"].as_u64().unwrap() >= 2);
}

#[test]
fn a_change_inotify_misses_shows_within_the_recheck_agent() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &["-o", "recheck_s=2"]);
    feed_connected(&m);
    a_change_inotify_misses_shows_within_the_recheck(&m, ws.path());
}

#[test]
fn a_change_inotify_misses_shows_within_the_recheck_shell() {
    let ws = tempfile::tempdir().unwrap();
    let m = MountProcess::start_url(
        &format!("shell:{}", ws.path().display()),
        "unused",
        &["-o", "recheck_s=2"],
    );
    feed_connected(&m);
    a_change_inotify_misses_shows_within_the_recheck(&m, ws.path());
}

/// A git repository made and committed to through the mount: the re-check of what the feed
/// vouches for finds nothing it missed (the change times its own commits' renames moved,
/// and its directories' times, once counted as missed changes and raised inotify events at
/// watchers of an untouched tree, every period).
#[test]
fn the_recheck_finds_nothing_after_git_writes_through_the_mount() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &["-o", "recheck_s=2"]);
    feed_connected(&m);
    let repo = m.dir.join("g");
    fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        let (code, _, err) = run(Command::new("git")
            .args(["-c", "user.email=t@t", "-c", "user.name=t"])
            .args(args)
            .current_dir(&repo));
        assert_eq!(code, 0, "git {args:?}: {}", String::from_utf8_lossy(&err));
    };
    git(&["init", "-q", "-b", "main"]);
    for i in 0..3 {
        fs::write(repo.join(format!("f{i}")), format!("{i}\n")).unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", &format!("c{i}")]);
    }
    let (code, _, _) = run(Command::new(sbxfs_bin())
        .args(["ctl", "flush"])
        .current_dir(&m.dir));
    assert_eq!(code, 0);
    // Two whole periods: every known file asked about twice.
    std::thread::sleep(Duration::from_secs(5));
    let s = status(&m);
    assert!(
        s["feed"]["recheck"]["checked"].as_u64().unwrap() > 20,
        "{s}"
    );
    assert_eq!(s["feed"]["recheck"]["changed"], 0, "{s}");
}
