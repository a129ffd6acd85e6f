//! grep over the exec-only transport runs ripgrep in the sandbox where it is there: the
//! answers equal the agent's on the shared grep vectors, with rg and with a PATH lacking it
//! (the local search); the rg path moves far fewer bytes than downloading the files; an
//! answer past the output cap is reported truncated, never silently short; the capability
//! says whether the search runs remotely.

use crate::common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::Value;

use common::*;
use sbxfs::remote::exec::{script_remote, CommandRunner, Output, RunControl, Runner};
use sbxfs::remote::*;
use sbxfs::search::grep::GrepOptions;

/// A local shell as the sandbox, counting the programs it ran and the bytes they printed.
struct Counting {
    shell: CommandRunner,
    runs: AtomicU64,
    bytes: AtomicU64,
}

#[async_trait::async_trait]
impl Runner for Counting {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        let out = self.shell.run(program, ctl).await?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(out.stdout.len() as u64 + out.stdout_cut, Ordering::Relaxed);
        Ok(out)
    }
    fn describe(&self) -> String {
        "counting sh".into()
    }
}

fn counting(argv: &[&str]) -> Arc<Counting> {
    Arc::new(Counting {
        shell: CommandRunner::new(argv.iter().map(|s| s.to_string()).collect()).unwrap(),
        runs: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    })
}

fn remote_over(runner: Arc<Counting>, root: &Path) -> Arc<dyn Remote> {
    script_remote(runner, root.as_os_str().as_bytes().to_vec()).unwrap()
}

/// A PATH with everything of /usr/bin and /bin but `tool`.
fn path_without(dir: &Path, tool: &str) -> String {
    for bin in ["/usr/bin", "/bin"] {
        for e in fs::read_dir(bin).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name.as_bytes() == tool.as_bytes() || dir.join(&name).exists() {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), dir.join(&name)).unwrap();
        }
    }
    format!("PATH={}", dir.display())
}

/// Everything a grep answered: its events, or the error (from the call or in the stream).
async fn grep_all(
    r: &dyn Remote,
    path: &RemotePath,
    opts: GrepOptions,
) -> std::result::Result<Vec<GrepEvent>, String> {
    let mut s = r.grep(path, opts).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(e) = s.next().await {
        out.push(e.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

struct Sandboxes {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    with_rg: Arc<Counting>,
    without_rg: Arc<Counting>,
}

fn sandboxes() -> Option<Sandboxes> {
    require_tool("rg")?;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let tools = dir.path().join("tools");
    fs::create_dir(&tools).unwrap();
    let path = path_without(&tools, "rg");
    Some(Sandboxes {
        with_rg: counting(&["sh"]),
        without_rg: counting(&["env", &path, "sh"]),
        _dir: dir,
        root,
    })
}

/// The major version of the rg this machine has.
fn rg_major() -> u32 {
    let out = std::process::Command::new("rg")
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

fn matches(events: &[GrepEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, GrepEvent::Match(_)))
        .count()
}

fn summary(events: &[GrepEvent]) -> (&sbxfs::search::grep::GrepSummary, bool) {
    match events.last() {
        Some(GrepEvent::Summary { summary, truncated }) => (summary, *truncated),
        other => panic!("no summary at the end: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_vectors_equal_the_agents_with_rg_and_without() {
    let Some(sb) = sandboxes() else { return };
    let v = load_vectors("grep.json");
    write_tree(&sb.root, &v["tree"]);
    let agent = AgentProcess::start(&sb.root);
    let a = agent.client();
    let with = remote_over(sb.with_rg.clone(), &sb.root);
    let without = remote_over(sb.without_rg.clone(), &sb.root);
    assert!(with.info().await.unwrap().capabilities.server_search);
    assert!(!without.info().await.unwrap().capabilities.server_search);
    let cases = v["cases"].as_array().unwrap();
    let mut in_sandbox = 0;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let o: &Value = &c["options"];
        let path = RemotePath::new(o["path"].as_str().unwrap_or("").as_bytes().to_vec()).unwrap();
        let opts = grep_options(o);
        let want = grep_all(&a, &path, opts.clone()).await;
        let runs = sb.with_rg.runs.load(Ordering::Relaxed);
        let got = grep_all(&*with, &path, opts.clone()).await;
        let one_program = sb.with_rg.runs.load(Ordering::Relaxed) - runs == 1;
        let local = grep_all(&*without, &path, opts).await;
        match &want {
            Ok(want) => {
                assert_eq!(got.as_ref(), Ok(want), "{name}: with rg");
                assert_eq!(local.as_ref(), Ok(want), "{name}: without rg");
                in_sandbox += usize::from(one_program);
                if !one_program {
                    println!("searched here: {name}");
                }
            }
            Err(e) => {
                assert!(got.is_err(), "{name}: the agent says {e}, with rg: {got:?}");
                assert!(
                    local.is_err(),
                    "{name}: the agent says {e}, without rg: {local:?}"
                );
            }
        }
    }
    // Most cases search a directory with options rg has: they ran in the sandbox.
    assert!(
        in_sandbox >= 15,
        "only {in_sandbox} cases ran rg in the sandbox"
    );
    println!(
        "grep vectors over exec: {} equal the agent's ({in_sandbox} through rg in the sandbox)",
        cases.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_options_equal_the_agents() {
    let Some(sb) = sandboxes() else { return };
    let r = &sb.root;
    fs::create_dir_all(r.join("sub/deeper")).unwrap();
    fs::write(r.join(".ignore"), "skipped/\n").unwrap();
    fs::create_dir(r.join("skipped")).unwrap();
    fs::write(r.join("skipped/x.txt"), "Needle here\n").unwrap();
    fs::write(r.join("sub/.gitignore"), "*.gen\n").unwrap();
    fs::write(r.join("sub/a.gen"), "needle generated\n").unwrap();
    fs::write(
        r.join("sub/deeper/b.txt"),
        "one\nNeedle two\nthree needle\nfour\n",
    )
    .unwrap();
    fs::write(r.join("-dash file"), "needle-ish words\nneedles\n").unwrap();
    fs::write(r.join("name\nwith newline"), "a needle\n").unwrap();
    fs::write(
        std::ffi::OsStr::from_bytes(&[r.as_os_str().as_bytes(), b"/lat\xe9n.txt"].concat()),
        b"caf\xe9 needle\n",
    )
    .unwrap();
    let agent = AgentProcess::start(r);
    let a = agent.client();
    let with = remote_over(sb.with_rg.clone(), r);
    let without = remote_over(sb.without_rg.clone(), r);
    // Probed once before (so each grep below is its own programs only).
    assert!(with.info().await.unwrap().capabilities.server_search);
    let base = GrepOptions {
        pattern: "needle".into(),
        ..Default::default()
    };
    let variants: Vec<(&str, GrepOptions)> = vec![
        ("plain", base.clone()),
        (
            "smart case",
            GrepOptions {
                pattern: "Needle".into(),
                smart_case: true,
                ..base.clone()
            },
        ),
        (
            "smart and insensitive",
            GrepOptions {
                pattern: "Needle".into(),
                smart_case: true,
                case_insensitive: true,
                ..base.clone()
            },
        ),
        (
            "invert with context",
            GrepOptions {
                invert: true,
                before_context: 1,
                after_context: 2,
                ..base.clone()
            },
        ),
        (
            "word",
            GrepOptions {
                word: true,
                ..base.clone()
            },
        ),
        (
            "no ignore, hidden",
            GrepOptions {
                case_insensitive: true,
                walk: sbxfs::search::walk::WalkOptions {
                    no_ignore: true,
                    hidden: true,
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
        (
            "one match allowed",
            GrepOptions {
                max_results: Some(1),
                after_context: 3,
                ..base.clone()
            },
        ),
        (
            "types search here",
            GrepOptions {
                walk: sbxfs::search::walk::WalkOptions {
                    types: vec!["txt".into()],
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
    ];
    for (name, opts) in variants {
        for path in [
            RemotePath::root(),
            RemotePath::new(b"sub".to_vec()).unwrap(),
        ] {
            let want = grep_all(&a, &path, opts.clone()).await;
            assert!(want.is_ok(), "{name}: {want:?}");
            let runs = sb.with_rg.runs.load(Ordering::Relaxed);
            assert_eq!(
                grep_all(&*with, &path, opts.clone()).await,
                want,
                "{name}: with rg"
            );
            // One program (rg in the sandbox), unless the options have no exact rg form.
            let here = name == "types search here" || (name == "word" && rg_major() < 14);
            let one = sb.with_rg.runs.load(Ordering::Relaxed) - runs == 1;
            assert_eq!(one, !here, "{name}: ran rg in the sandbox?");
            assert_eq!(
                grep_all(&*without, &path, opts.clone()).await,
                want,
                "{name}: without rg"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rg_moves_only_the_matches_not_the_files() {
    let Some(sb) = sandboxes() else { return };
    let r = &sb.root;
    // Four large files without a match, one small file with one; a regex (a literal would
    // let the local path ask `grep -F` which files to download).
    let filler = "nothing to see on this line at all\n".repeat(30_000);
    for i in 0..4 {
        fs::write(r.join(format!("big{i}.txt")), &filler).unwrap();
    }
    fs::write(r.join("small.txt"), "the needle\n").unwrap();
    let with = remote_over(sb.with_rg.clone(), r);
    let without = remote_over(sb.without_rg.clone(), r);
    with.info().await.unwrap();
    without.info().await.unwrap();
    let opts = GrepOptions {
        pattern: "ne+dle".into(),
        ..Default::default()
    };
    let before = (
        sb.with_rg.bytes.load(Ordering::Relaxed),
        sb.without_rg.bytes.load(Ordering::Relaxed),
    );
    let got = grep_all(&*with, &RemotePath::root(), opts.clone())
        .await
        .unwrap();
    let local = grep_all(&*without, &RemotePath::root(), opts)
        .await
        .unwrap();
    assert_eq!(got, local);
    assert_eq!(matches(&got), 1);
    assert_eq!(summary(&got).0.files_searched, 5);
    let rg_bytes = sb.with_rg.bytes.load(Ordering::Relaxed) - before.0;
    let download_bytes = sb.without_rg.bytes.load(Ordering::Relaxed) - before.1;
    println!("bytes that crossed: rg {rg_bytes}, download {download_bytes}");
    assert!(download_bytes > 4 * filler.len() as u64, "{download_bytes}");
    assert!(
        rg_bytes * 100 < download_bytes,
        "rg {rg_bytes} bytes vs download {download_bytes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_past_the_output_cap_is_reported_truncated() {
    let Some(sb) = sandboxes() else { return };
    let r = &sb.root;
    // 100 files of 1000 matching lines: rg's JSON for them is far past 8 MiB.
    let lines: String = (0..1000).map(|i| format!("match line {i:04}\n")).collect();
    for i in 0..100 {
        fs::write(r.join(format!("f{i:03}.txt")), &lines).unwrap();
    }
    let with = remote_over(sb.with_rg.clone(), r);
    let opts = GrepOptions {
        pattern: "match".into(),
        ..Default::default()
    };
    let got = grep_all(&*with, &RemotePath::root(), opts.clone())
        .await
        .unwrap();
    let (s, truncated) = summary(&got);
    assert!(truncated && s.truncated);
    assert!(s.errors.iter().any(|e| e.contains("cut")), "{:?}", s.errors);
    // What came is exactly the core's answer's beginning: whole files, in order.
    let n = matches(&got);
    assert!(n > 1000 && n < 100_000 && n.is_multiple_of(1000), "{n}");
    assert_eq!(s.files_searched, (n / 1000) as u64);
    let mut core = Vec::new();
    sbxfs::search::grep::grep(r, &opts, &mut |m| {
        core.push(GrepEvent::Match(m));
        core.len() < n
    })
    .unwrap();
    assert_eq!(&got[..n], &core[..]);
}

/// A PATH holding busybox's applets (and rg, `with_rg`), nothing else.
fn busybox_path(dir: &Path, with_rg: bool) -> Option<String> {
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())?;
    let list = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        std::os::unix::fs::symlink(busybox, dir.join(applet)).unwrap();
    }
    if with_rg {
        std::os::unix::fs::symlink(require_tool("rg")?, dir.join("rg")).unwrap();
    }
    Some(format!("PATH={}", dir.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_with_and_without_rg_answers_the_vectors_as_the_agent() {
    let Some(sb) = sandboxes() else { return };
    let (tools, bare) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (Some(path), Some(bare_path)) = (
        busybox_path(tools.path(), true),
        busybox_path(bare.path(), false),
    ) else {
        require_tool("busybox");
        return;
    };
    let v = load_vectors("grep.json");
    write_tree(&sb.root, &v["tree"]);
    let agent = AgentProcess::start(&sb.root);
    let a = agent.client();
    let runner = counting(&["env", &path, "sh"]);
    let bb = remote_over(runner.clone(), &sb.root);
    assert!(bb.info().await.unwrap().capabilities.server_search);
    // busybox alone: grep -F (its applet) chooses the files to download for a literal.
    let bare_bb = remote_over(counting(&["env", &bare_path, "sh"]), &sb.root);
    assert!(!bare_bb.info().await.unwrap().capabilities.server_search);
    let mut in_sandbox = 0;
    for c in v["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let o: &Value = &c["options"];
        let path = RemotePath::new(o["path"].as_str().unwrap_or("").as_bytes().to_vec()).unwrap();
        let opts = grep_options(o);
        let want = grep_all(&a, &path, opts.clone()).await;
        let runs = runner.runs.load(Ordering::Relaxed);
        let got = grep_all(&*bb, &path, opts.clone()).await;
        let bare_got = grep_all(&*bare_bb, &path, opts).await;
        in_sandbox += usize::from(runner.runs.load(Ordering::Relaxed) - runs == 1);
        match &want {
            Ok(want) => {
                assert_eq!(got.as_ref(), Ok(want), "{name}: busybox with rg");
                assert_eq!(bare_got.as_ref(), Ok(want), "{name}: busybox alone");
            }
            Err(e) => {
                assert!(got.is_err(), "{name}: the agent says {e}, busybox: {got:?}");
                assert!(
                    bare_got.is_err(),
                    "{name}: the agent says {e}: {bare_got:?}"
                );
            }
        }
    }
    assert!(
        in_sandbox >= 15,
        "only {in_sandbox} cases ran rg in the sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_grep_stops_rg_in_the_sandbox() {
    let Some(sb) = sandboxes() else { return };
    let rg = require_tool("rg").unwrap();
    fs::write(sb.root.join("a.txt"), "needle\n").unwrap();
    // The sandbox's rg, slow to search: it waits before it runs (the real rg, in the end).
    let tools = tempfile::tempdir().unwrap();
    let wrapper = tools.path().join("rg");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --json \"*) sleep 317 ;; esac\nexec '{}' \"$@\"\n",
            rg.display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "PATH={}:{}",
        tools.path().display(),
        std::env::var("PATH").unwrap()
    );
    let r = remote_over(counting(&["env", &path, "sh"]), &sb.root);
    assert!(r.info().await.unwrap().capabilities.server_search);
    let sleeping = || {
        let out = std::process::Command::new("ps")
            .args(["-eo", "args"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == "sleep 317")
    };
    let opts = GrepOptions {
        pattern: "needle".into(),
        ..Default::default()
    };
    let top = RemotePath::root();
    let search = r.grep(&top, opts);
    let (dropped, was_running) = tokio::join!(
        tokio::time::timeout(std::time::Duration::from_secs(3), search),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
            sleeping()
        }
    );
    assert!(dropped.is_err(), "the slow search answered");
    assert!(was_running, "rg was not running in the sandbox");
    // The supervisor stops the whole group: TERM, then KILL after 2 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while sleeping() {
        assert!(
            std::time::Instant::now() < deadline,
            "rg's process group outlived the dropped search"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rg_a_literal_downloads_only_the_files_that_hold_it() {
    let Some(sb) = sandboxes() else { return };
    let r = &sb.root;
    let filler = "nothing to see on this line at all\n".repeat(30_000);
    for i in 0..4 {
        fs::write(r.join(format!("big{i}.txt")), &filler).unwrap();
    }
    fs::write(r.join("small.txt"), "the needle\n").unwrap();
    fs::write(r.join("-dash"), "needle\n").unwrap();
    let agent = AgentProcess::start(r);
    let a = agent.client();
    let without = remote_over(sb.without_rg.clone(), r);
    without.info().await.unwrap();
    let top = RemotePath::root();
    let literal = GrepOptions {
        pattern: "needle".into(),
        after_context: 1,
        ..Default::default()
    };
    let before = sb.without_rg.bytes.load(Ordering::Relaxed);
    let got = grep_all(&*without, &top, literal.clone()).await.unwrap();
    let literal_bytes = sb.without_rg.bytes.load(Ordering::Relaxed) - before;
    assert_eq!(Ok(&got), grep_all(&a, &top, literal).await.as_ref());
    assert_eq!(matches(&got), 2);
    assert_eq!(summary(&got).0.files_searched, 6);
    // A regex has no literal to look for: every file crosses, and the answer is the same.
    let regex = GrepOptions {
        pattern: "ne+dle".into(),
        ..Default::default()
    };
    let before = sb.without_rg.bytes.load(Ordering::Relaxed);
    let all = grep_all(&*without, &top, regex.clone()).await.unwrap();
    let regex_bytes = sb.without_rg.bytes.load(Ordering::Relaxed) - before;
    assert_eq!(Ok(&all), grep_all(&a, &top, regex).await.as_ref());
    println!("without rg: literal {literal_bytes} bytes, regex {regex_bytes} bytes");
    assert!(
        literal_bytes * 50 < regex_bytes,
        "literal {literal_bytes} vs regex {regex_bytes}"
    );
}

/// `sbxfs grep -l` (and `-c`, `--files`) prints: the CLI always asks for printed output. With
/// rg in the sandbox those run there, one program, and print exactly the agent's bytes;
/// printed lines and `--files-without-match` are still searched here, equal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_file_lists_and_counts_run_in_the_sandbox_as_the_agent_prints() {
    use sbxfs::search::print::{PrintKind, PrintOptions};
    let Some(sb) = sandboxes() else { return };
    let r = &sb.root;
    fs::create_dir_all(r.join("sub/deeper")).unwrap();
    fs::write(r.join(".ignore"), "skipped/\n").unwrap();
    fs::create_dir(r.join("skipped")).unwrap();
    fs::write(r.join("skipped/x.txt"), "needle here\n").unwrap();
    fs::write(r.join("sub/.gitignore"), "*.gen\n").unwrap();
    fs::write(r.join("sub/a.gen"), "needle generated\n").unwrap();
    fs::write(r.join(".hidden"), "needle needle hidden\n").unwrap();
    fs::write(
        r.join("sub/deeper/b.txt"),
        "one\nNeedle two\nthree needle needle\nfour\r\nneedle at the end",
    )
    .unwrap();
    fs::write(r.join("-dash file"), "needle-ish words\nneedles\n").unwrap();
    fs::write(r.join("name\nwith newline"), "a needle\n").unwrap();
    fs::write(r.join("bin.dat"), b"needle\0needle\n").unwrap();
    fs::write(r.join("none.txt"), "nothing\n").unwrap();
    let filler = "nothing to see on this line at all\n".repeat(30_000);
    fs::write(r.join("big.txt"), &filler).unwrap();
    let agent = AgentProcess::start(r);
    let a = agent.client();
    let with = remote_over(sb.with_rg.clone(), r);
    assert!(with.info().await.unwrap().capabilities.server_search);
    let print = |kind: PrintKind, f: &dyn Fn(&mut PrintOptions)| {
        let mut p = PrintOptions {
            kind,
            shown_root: WireBytes(b"the/root".to_vec()),
            ..Default::default()
        };
        f(&mut p);
        Some(p)
    };
    let base = GrepOptions {
        pattern: "needle".into(),
        ..Default::default()
    };
    let all = sbxfs::search::walk::WalkOptions {
        no_ignore: true,
        hidden: true,
        ..Default::default()
    };
    let variants: Vec<(&str, GrepOptions, bool)> = vec![
        (
            "-l",
            GrepOptions {
                print: print(PrintKind::FilesWithMatches, &|_| {}),
                ..base.clone()
            },
            true,
        ),
        (
            "-l, no shown root, coloured",
            GrepOptions {
                print: print(PrintKind::FilesWithMatches, &|p| {
                    p.shown_root = WireBytes(Vec::new());
                    p.color = true;
                }),
                ..base.clone()
            },
            true,
        ),
        (
            "-l -uu -i with context",
            GrepOptions {
                print: print(PrintKind::FilesWithMatches, &|_| {}),
                case_insensitive: true,
                before_context: 2,
                walk: all.clone(),
                ..base.clone()
            },
            true,
        ),
        (
            "-l --glob",
            GrepOptions {
                print: print(PrintKind::FilesWithMatches, &|_| {}),
                walk: sbxfs::search::walk::WalkOptions {
                    globs: vec!["*.txt".into()],
                    hidden: true,
                    ..Default::default()
                },
                ..base.clone()
            },
            true,
        ),
        (
            "-l -v",
            GrepOptions {
                print: print(PrintKind::FilesWithMatches, &|_| {}),
                invert: true,
                ..base.clone()
            },
            true,
        ),
        (
            "-c",
            GrepOptions {
                print: print(PrintKind::Count, &|_| {}),
                walk: all.clone(),
                ..base.clone()
            },
            true,
        ),
        (
            "-c -o --text",
            GrepOptions {
                print: print(PrintKind::Count, &|p| p.only_matching = true),
                binary: true,
                walk: all.clone(),
                ..base.clone()
            },
            true,
        ),
        (
            "--files-without-match",
            GrepOptions {
                print: print(PrintKind::FilesWithoutMatch, &|_| {}),
                walk: all.clone(),
                ..base.clone()
            },
            false,
        ),
        (
            "--files",
            GrepOptions {
                print: print(PrintKind::Files, &|_| {}),
                ..base.clone()
            },
            true,
        ),
        (
            "lines search here",
            GrepOptions {
                print: print(PrintKind::Lines, &|p| p.line_number = true),
                ..base.clone()
            },
            false,
        ),
    ];
    for (name, opts, remote) in variants {
        for path in [
            RemotePath::root(),
            RemotePath::new(b"sub".to_vec()).unwrap(),
        ] {
            let want = grep_all(&a, &path, opts.clone()).await;
            assert!(want.is_ok(), "{name}: {want:?}");
            assert!(
                want.as_ref()
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e, GrepEvent::Printed(_))),
                "{name}: the agent printed nothing"
            );
            let (runs, bytes) = (
                sb.with_rg.runs.load(Ordering::Relaxed),
                sb.with_rg.bytes.load(Ordering::Relaxed),
            );
            assert_eq!(
                grep_all(&*with, &path, opts.clone()).await,
                want,
                "{name} in {path:?}: with rg"
            );
            let one = sb.with_rg.runs.load(Ordering::Relaxed) - runs == 1;
            assert_eq!(one, remote, "{name}: ran rg in the sandbox?");
            let moved = sb.with_rg.bytes.load(Ordering::Relaxed) - bytes;
            if remote {
                assert!(moved < filler.len() as u64 / 10, "{name}: {moved} bytes");
            }
        }
    }
}
