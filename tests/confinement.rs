//! The agent's searches stay inside the workspace under races, and stop when nobody waits:
//! a directory swapped for a symlink out of the workspace (by a C helper looping
//! `renameat2(RENAME_EXCHANGE)`) never leaks an outside file into grep, glob or fuzzy answers;
//! a search whose client disconnects stops using CPU while the agent keeps answering.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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
