//! The agent's searches stay inside the workspace under races, and stop when nobody waits:
//! a directory swapped for a symlink out of the workspace (by a C helper looping
//! `renameat2(RENAME_EXCHANGE)`) never leaks an outside file into grep, glob or fuzzy answers;
//! a search whose client disconnects stops using CPU while the agent keeps answering.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use common::*;
use sbxfs::remote::{FuzzyRequest, GrepEvent, Remote, RemotePath};
use sbxfs::search::grep::GrepOptions;
use sbxfs::search::walk::WalkOptions;

const SECRET: &str = "SECRET-7d1e0c4b-outside";
const MARKER: &str = "marker-7d1e0c4b.txt";

/// Compile `tests/c/NAME.c` with gcc into `dir`; `None` (the test is skipped) without gcc.
fn compile_helper(name: &str, dir: &Path) -> Option<PathBuf> {
    let gcc = require_tool("gcc")?;
    let out = dir.join(name);
    let src = repo_root().join("tests/c").join(format!("{name}.c"));
    let (code, _, err) = run(Command::new(gcc)
        .args(["-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&src));
    assert_eq!(
        code,
        0,
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&err)
    );
    Some(out)
}

/// A helper process, killed by pid on drop even when the test fails.
struct Helper(Child);

impl Helper {
    fn start(program: &Path, args: &[&Path]) -> Helper {
        use std::io::BufRead;
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start helper");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the helper did not start");
        Helper(child)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rp(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

/// A workspace `ws` beside a directory `outside` holding the secret marker file.
fn workspace_beside_a_secret() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let (root, outside) = (d.path().join("ws"), d.path().join("outside"));
    fs::create_dir_all(outside.join("deeper")).unwrap();
    fs::write(outside.join(MARKER), format!("{SECRET}\n")).unwrap();
    fs::write(outside.join("deeper").join(MARKER), format!("{SECRET}\n")).unwrap();
    fs::create_dir(&root).unwrap();
    (d, root, outside)
}

/// A real directory inside the workspace with ordinary files.
fn plain_dir(dir: &Path) {
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("plain.txt"), "plain inside\n").unwrap();
    fs::write(dir.join("sub/plain.txt"), "plain inside\n").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_an_outside_symlink_never_leaks_into_grep_glob_or_fuzzy() {
    let (d, root, outside) = workspace_beside_a_secret();
    let Some(exchange) = compile_helper("exchange", d.path()) else {
        return;
    };
    // Two pairs: one link absolute, one relative (`../outside`), each swapped with a real
    // directory as fast as the kernel allows.
    plain_dir(&root.join("d1"));
    plain_dir(&root.join("d2"));
    std::os::unix::fs::symlink(&outside, root.join("l1")).unwrap();
    std::os::unix::fs::symlink("../outside", root.join("l2")).unwrap();
    let _swap1 = Helper::start(&exchange, &[&root.join("d1"), &root.join("l1")]);
    let _swap2 = Helper::start(&exchange, &[&root.join("d2"), &root.join("l2")]);
    let agent = AgentProcess::start(&root);
    let c = agent.client();
    let leaked = |answer: &str| answer.contains(SECRET) || answer.contains("marker-7d1e0c4b");
    let mut inside_seen = 0;
    for i in 0..300 {
        let follow = i % 2 == 1;
        let opts = GrepOptions {
            pattern: format!("{SECRET}|plain"),
            walk: WalkOptions {
                follow,
                hidden: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut answer = String::new();
        let mut stream = c.grep(&RemotePath::root(), opts).await.unwrap();
        while let Some(event) = stream.next().await {
            let event = event.unwrap();
            if matches!(event, GrepEvent::Match(_)) {
                inside_seen += 1;
            }
            answer.push_str(&format!("{event:?}\n"));
        }
        assert!(
            !leaked(&answer),
            "grep #{i} (follow {follow}) leaked: {answer}"
        );

        for pattern in ["**/*", "d1/*", "l2/**", "*/sub/*"] {
            let answer = format!("{:?}", c.glob(&RemotePath::root(), pattern).await);
            assert!(!leaked(&answer), "glob {pattern} #{i} leaked: {answer}");
        }

        let req: FuzzyRequest = serde_json::from_value(serde_json::json!({
            "query": "marker",
            "follow": follow,
            "hidden": true,
        }))
        .unwrap();
        let answer = format!("{:?}", c.fuzzy(&RemotePath::root(), req).await);
        assert!(!leaked(&answer), "fuzzy #{i} leaked: {answer}");
        // Searching from the swapped name itself: refused or inside, never outside.
        let answer = format!("{:?}", c.glob(&rp("d1"), "**").await);
        assert!(!leaked(&answer), "glob in d1 #{i} leaked: {answer}");
    }
    // The searches really walked the swapping directories.
    assert!(inside_seen > 0, "no search ever found the inside files");
}

/// Wait (at most 30 s, only so a hung agent fails the test) until a stats counter reaches `n`.
async fn stat_reaches(c: &sbxfs::remote::client::AgentClient, key: &str, n: u64) {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = c.agent_stats().await.unwrap();
        if stats[key].as_u64() == Some(n) {
            return;
        }
        assert!(Instant::now() < give_up, "{key} never reached {n}: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a search stopped: the agent uses (almost) no CPU over a second, and still answers.
async fn idle_and_serving(agent: &AgentProcess, c: &sbxfs::remote::client::AgentClient) {
    let before = cpu_ticks(agent.child.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks(agent.child.id()) - before;
    // A search still running would use most of a core (~100 ticks a second).
    assert!(
        used < 30,
        "the agent used {used} ticks of CPU in a second after the stop"
    );
    let a = tokio::time::timeout(Duration::from_secs(10), c.stat(&RemotePath::root()))
        .await
        .expect("the agent answers")
        .unwrap();
    assert_eq!(a.kind, sbxfs::remote::FileKind::Dir);
}

/// A tree that takes seconds to search: 4,000 names, hard links to one 1 MiB file with no match,
/// in 200 directories (a glob of 1,000 alternatives walks them 1,000 times).
fn slow_tree(root: &Path) {
    let line = "0123 abcd 4567 efgh ijkl mnop\n";
    let data = line.repeat((1 << 20) / line.len());
    fs::write(root.join("data.txt"), &data).unwrap();
    for d in 0..200 {
        let dir = root.join(format!("d{d:03}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..20 {
            fs::hard_link(root.join("data.txt"), dir.join(format!("f{f:02}.txt"))).unwrap();
        }
    }
}

/// A regex with no literal to skip ahead with: every byte goes through the automaton.
const NO_MATCH: &str = "[0-9]{4}[a-z]";

fn pathological_glob() -> String {
    let alternatives: Vec<String> = (0..1000).map(|i| format!("q{i}")).collect();
    format!("**/{{{}}}*", alternatives.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_stop_at_their_deadline() {
    let d = tempfile::tempdir().unwrap();
    slow_tree(d.path());
    let agent = AgentProcess::start_with_args(d.path(), "t0123456789", &["--search-timeout", "2"]);
    let c = agent.client();
    let opts = GrepOptions {
        pattern: NO_MATCH.into(),
        ..Default::default()
    };
    let mut stream = c.grep(&RemotePath::root(), opts).await.unwrap();
    let mut last = None;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("grep ended")
    {
        last = Some(event.unwrap());
    }
    match last {
        Some(GrepEvent::Summary { truncated, summary }) => {
            assert!(
                truncated,
                "the search finished within its deadline: {summary:?}"
            );
            assert!(summary.files_searched < 4000, "{summary:?}");
        }
        other => panic!("no summary: {other:?}"),
    }
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        c.glob(&RemotePath::root(), &pathological_glob()),
    )
    .await
    .expect("glob ended")
    .unwrap_err();
    assert!(err.to_string().contains("--search-timeout"), "{err}");
    idle_and_serving(&agent, &c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_whose_client_leaves_stops_using_cpu() {
    let d = tempfile::tempdir().unwrap();
    slow_tree(d.path());
    let agent = AgentProcess::start(d.path());
    let c = agent.client();
    // A grep with no match over gigabytes: nothing is ever sent, so only the walk and the
    // searcher's own checks can notice the client left.
    let opts = GrepOptions {
        pattern: NO_MATCH.into(),
        ..Default::default()
    };
    let left = tokio::time::timeout(Duration::from_millis(200), async {
        let mut stream = c.grep(&RemotePath::root(), opts).await.unwrap();
        while stream.next().await.is_some() {}
    })
    .await;
    assert!(left.is_err(), "the grep finished within 200 ms");
    stat_reaches(&c, "greps_cancelled", 1).await;
    assert_eq!(c.agent_stats().await.unwrap()["greps_completed"], 0);
    idle_and_serving(&agent, &c).await;

    let left = tokio::time::timeout(
        Duration::from_millis(200),
        c.glob(&RemotePath::root(), &pathological_glob()),
    )
    .await;
    assert!(left.is_err(), "the glob finished within 200 ms");
    stat_reaches(&c, "searches_cancelled", 1).await;
    idle_and_serving(&agent, &c).await;
}

/// How many inotify watches a process holds (`/proc/PID/fdinfo` of its inotify descriptors).
fn inotify_watches(pid: u32) -> usize {
    let mut n = 0;
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let is_inotify =
            fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify"));
        if is_inotify {
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            n += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_never_follows_a_symlink_out_of_the_workspace() {
    let (_d, root, outside) = workspace_beside_a_secret();
    for i in 0..30 {
        fs::create_dir(outside.join(format!("sub{i}"))).unwrap();
    }
    fs::create_dir(root.join("inside")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink("../outside", root.join("out_relative")).unwrap();
    let agent = AgentProcess::start(&root);
    let c = agent.client();
    // The root and `inside`: nothing of the 32 directories behind the links.
    assert_eq!(inotify_watches(agent.child.id()), 2);
    let mut feed = c.watch(None).await.unwrap();
    // Changes outside, through and beside the links, then one inside.
    fs::write(outside.join("new.txt"), "x").unwrap();
    fs::write(outside.join("sub3/new.txt"), "x").unwrap();
    fs::create_dir(outside.join("sub3/newdir")).unwrap();
    fs::write(outside.join(MARKER), "changed").unwrap();
    fs::write(root.join("inside/hello.txt"), "hi").unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, feed.next())
            .await
            .expect("the inside change arrives")
            .unwrap()
            .unwrap();
        let path = String::from_utf8_lossy(&ev.path.0).into_owned();
        seen.push(format!("{:?} {path}", ev.kind));
        if path == "inside/hello.txt" {
            break;
        }
    }
    assert!(
        seen.iter().all(|e| !e.contains("out")),
        "events from outside: {seen:?}"
    );
    // A directory made inside later is watched; still nothing outside.
    fs::create_dir(root.join("inside/later")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("inside/later/link")).unwrap();
    // inotify reports nothing made in a directory before its watch exists: wait for it (the
    // watch count going up) so the file below is a change the feed can see.
    let watched = Instant::now() + Duration::from_secs(10);
    while inotify_watches(agent.child.id()) < 3 && Instant::now() < watched {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fs::write(outside.join("sub4/x"), "x").unwrap();
    fs::write(root.join("inside/later/y"), "y").unwrap();
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, feed.next())
            .await
            .expect("the later change arrives")
            .unwrap()
            .unwrap();
        let path = String::from_utf8_lossy(&ev.path.0).into_owned();
        assert!(!path.contains("sub4"), "an event from outside: {path}");
        if path == "inside/later/y" {
            break;
        }
    }
    assert_eq!(inotify_watches(agent.child.id()), 3);
}

#[test]
fn the_agents_landlock_rules_allow_the_workspace_and_nothing_else() {
    use sbxfs::agent::confine::{confine, Confinement};
    use std::io::ErrorKind::PermissionDenied;
    let (d, root, outside) = workspace_beside_a_secret();
    let top = d.path().to_path_buf();
    // Landlock binds the calling thread: a thread of its own keeps the test process free.
    std::thread::spawn(move || {
        let c = confine(&root).unwrap();
        assert!(
            matches!(c, Confinement::Full | Confinement::Partial),
            "Landlock is not in force: {c:?}"
        );
        // Everything the agent does inside the workspace still works.
        fs::create_dir(root.join("dir")).unwrap();
        fs::write(root.join("dir/f"), "x").unwrap();
        fs::rename(root.join("dir/f"), root.join("g")).unwrap();
        assert_eq!(fs::read(root.join("g")).unwrap(), b"x");
        std::os::unix::fs::symlink("g", root.join("link")).unwrap();
        fs::hard_link(root.join("g"), root.join("h")).unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(root.join("g"))
            .unwrap()
            .set_len(0)
            .unwrap();
        fs::remove_file(root.join("g")).unwrap();
        fs::remove_dir(root.join("dir")).unwrap();
        assert!(fs::read_dir(root.join(".")).unwrap().count() >= 2);
        assert!(fs::read_to_string("/proc/self/status").is_ok());
        // Outside it: nothing, whatever the route.
        for path in [
            outside.join(MARKER),
            top.join("outside/deeper").join(MARKER),
            PathBuf::from("/etc/passwd"),
            PathBuf::from(format!("/proc/self/root{}", outside.join(MARKER).display())),
        ] {
            let err = fs::read(&path).unwrap_err();
            assert_eq!(err.kind(), PermissionDenied, "{}: {err}", path.display());
        }
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        let err = fs::read(root.join("out").join(MARKER)).unwrap_err();
        assert_eq!(err.kind(), PermissionDenied, "through a link: {err}");
        let err = fs::read_dir(&outside).unwrap_err();
        assert_eq!(err.kind(), PermissionDenied, "listing outside: {err}");
        let err = fs::write(top.join("new"), "x").unwrap_err();
        assert_eq!(err.kind(), PermissionDenied, "writing outside: {err}");
        let err = fs::rename(root.join("h"), top.join("h")).unwrap_err();
        assert!(
            matches!(err.raw_os_error(), Some(libc::EACCES | libc::EXDEV)),
            "moving a file out: {err}"
        );
    })
    .join()
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_says_landlock_is_in_force_and_no_route_leads_outside() {
    let (_d, root, outside) = workspace_beside_a_secret();
    fs::write(root.join("inside.txt"), "plain inside\n").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
    std::os::unix::fs::symlink("../outside", root.join("rel")).unwrap();
    let magic = format!("/proc/self/root{}", outside.display());
    std::os::unix::fs::symlink(&magic, root.join("magic")).unwrap();
    let agent = AgentProcess::start(&root);
    let c = agent.client();
    let info = c.info().await.unwrap();
    assert_eq!(info.landlock.as_deref(), Some("enforced"), "{info:?}");
    let leaked = |answer: &str| answer.contains(SECRET) || answer.contains("marker-7d1e0c4b");
    for link in ["abs", "rel", "magic"] {
        let file = rp(&format!("{link}/{MARKER}"));
        assert!(c.read(&file, 0, 100).await.is_err(), "read through {link}");
        assert!(c.stat(&file).await.is_err(), "stat through {link}");
        assert!(c.list(&rp(link)).await.is_err(), "list through {link}");
        let answer = format!("{:?}", c.glob(&rp(link), "**").await);
        assert!(!leaked(&answer), "glob through {link}: {answer}");
    }
    for follow in [false, true] {
        let opts = GrepOptions {
            pattern: format!("{SECRET}|plain"),
            walk: WalkOptions {
                follow,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut answer = String::new();
        let mut stream = c.grep(&RemotePath::root(), opts).await.unwrap();
        while let Some(event) = stream.next().await {
            answer.push_str(&format!("{:?}\n", event.unwrap()));
        }
        assert!(answer.contains("inside.txt"), "{answer}");
        assert!(!leaked(&answer), "grep (follow {follow}): {answer}");
    }
    drop(agent);
    let agent = AgentProcess::start_with_args(&root, "t0123456789", &["--no-landlock"]);
    let info = agent.client().info().await.unwrap();
    assert_eq!(info.landlock.as_deref(), Some("disabled"), "{info:?}");
}
