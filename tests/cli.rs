//! The `sbxfs` query commands end to end on local paths: output formats, JSON shapes, exit
//! codes (0 found, 1 nothing, 2 error), and input handling.

use crate::common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use common::*;

fn sbxfs(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let (code, out, err) = run(Command::new(sbxfs_bin()).current_dir(dir).args(args));
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn workspace() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::create_dir_all(w.join("src")).unwrap();
    fs::write(
        w.join("src/main.rs"),
        "fn main() {\n    // TODO one\n    work();\n}\n",
    )
    .unwrap();
    fs::write(w.join("src/lib.rs"), "pub fn work() {}\n// TODO two\n").unwrap();
    fs::write(w.join("notes.txt"), "alpha\nbeta\ngamma\n").unwrap();
    d
}

#[test]
fn grep_prints_path_line_column_text_and_context() {
    // As `rg --sort path`: line numbers only with -n, `--` between groups of context
    // (tests/rg_parity.rs compares with rg itself for every flag).
    let w = workspace();
    let (code, out, _) = sbxfs(w.path(), &["grep", "TODO", "-C", "1"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "src/lib.rs-pub fn work() {}\nsrc/lib.rs:// TODO two\n--\n\
         src/main.rs-fn main() {\nsrc/main.rs:    // TODO one\nsrc/main.rs-    work();\n"
    );
    let (code, out, _) = sbxfs(w.path(), &["grep", "-n", "--column", "TODO", "src/main.rs"]);
    assert_eq!(code, 0);
    assert_eq!(out, "2:8:    // TODO one\n");
}

#[test]
fn grep_json_has_the_documented_fields_and_a_summary() {
    let w = workspace();
    let (code, out, _) = sbxfs(w.path(), &["grep", "--json", "-i", "todo", "src"]);
    assert_eq!(code, 0);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    let m = &lines[0];
    for field in [
        "path",
        "line",
        "column",
        "text",
        "before",
        "after",
        "submatches",
    ] {
        assert!(m.get(field).is_some(), "missing {field} in {m}");
    }
    // Paths are relative to the directory searched.
    assert_eq!(m["path"], "lib.rs");
    assert_eq!(lines[2]["truncated"], false);
    assert_eq!(lines[2]["summary"]["matches"], 2);
}

#[test]
fn grep_exit_codes_follow_grep() {
    let w = workspace();
    assert_eq!(sbxfs(w.path(), &["grep", "absent-word"]).0, 1);
    let (code, _, err) = sbxfs(w.path(), &["grep", "(unclosed"]);
    assert_eq!(code, 2);
    assert!(err.contains("unclosed group"), "{err}");
    assert_eq!(sbxfs(w.path(), &["grep", "x", "missing-dir"]).0, 2);
}

#[test]
fn grep_with_several_paths_prefixes_each_result() {
    let w = workspace();
    let (code, out, _) = sbxfs(w.path(), &["grep", "beta|TODO two", "src", "notes.txt"]);
    assert_eq!(code, 0);
    assert_eq!(out, "src/lib.rs:// TODO two\nnotes.txt:beta\n");
}

#[test]
fn grep_max_results_reports_truncation() {
    let w = workspace();
    let (code, out, _) = sbxfs(w.path(), &["grep", "--json", "--max-results", "1", "TODO"]);
    assert_eq!(code, 0);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["truncated"], true);
}

#[test]
fn grep_stops_quietly_when_the_reader_goes_away() {
    let w = workspace();
    let big: String = (0..200_000).map(|i| format!("match {i}\n")).collect();
    fs::write(w.path().join("big.txt"), big).unwrap();
    let mut child = Command::new(sbxfs_bin())
        .current_dir(w.path())
        .args(["grep", "match"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(status.code().is_some(), "ended by a signal: {status:?}");
    // As rg: nothing on stderr (no "stopped at a limit"), the search just ends.
    assert_eq!(err, "");
}

/// grep's --max-bytes takes units as every byte count does (`1K`, `64K`, `1M`, `512M`).
#[test]
fn grep_max_bytes_takes_units() {
    let w = workspace();
    fs::create_dir(w.path().join("many")).unwrap();
    for i in 0..100 {
        fs::write(
            w.path().join(format!("many/f{i:03}.txt")),
            "needle here
",
        )
        .unwrap();
    }
    let (code, all, err) = sbxfs(w.path(), &["grep", "needle", "many"]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(all.len() > 2048);
    let (code, out, err) = sbxfs(w.path(), &["grep", "--max-bytes", "1K", "needle", "many"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.len() <= 1024 && out.len() > 900, "{}", out.len());
    assert!(all.starts_with(&out));
    assert!(err.contains("stopped at a limit"), "{err}");
    for size in ["64K", "1M", "512M", "1G"] {
        let (code, out, err) = sbxfs(w.path(), &["grep", "--max-bytes", size, "needle", "many"]);
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (0, all.as_str(), ""),
            "{size}"
        );
    }
    let (code, _, err) = sbxfs(w.path(), &["grep", "--max-bytes", "1Q", "needle", "many"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown unit `Q`"), "{err}");
    let (code, _, err) = sbxfs(w.path(), &["grep", "--max-filesize", "1K", "-l", "needle"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn glob_and_fuzzy_print_a_sandbox_names_terminal_escapes_escaped() {
    let w = tempfile::tempdir().unwrap();
    let evil = "evil\u{1b}]0;PWNED\u{7}\u{1b}[31mred.txt";
    std::fs::write(w.path().join(evil), "x").unwrap();
    // A right-to-left override shows "rlo\u{202e}txt.exe" as "rloexe.txt".
    std::fs::write(w.path().join("rlo\u{202e}txt.exe"), "x").unwrap();
    let shown = "evil\\u{1b}]0;PWNED\\u{7}\\u{1b}[31mred.txt";
    for args in [
        &["glob", "*.txt"][..],
        &["fuzzy", "evilred"][..],
        &["glob", "rlo*"][..],
        &["fuzzy", "rloexe"][..],
    ] {
        let (code, out, err) = sbxfs(w.path(), args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'),
            "{args:?} printed a raw escape: {out:?}"
        );
        let shown = if args[1].starts_with("rlo") {
            "rlo\\u{202e}txt.exe"
        } else {
            shown
        };
        assert!(out.contains(shown), "{args:?}: {out:?}");
    }
    // JSON carries the name exactly (escaped by JSON itself).
    let (_, out, _) = sbxfs(w.path(), &["glob", "--json", "*.txt"]);
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert_eq!(json_lines(&out)[0]["path"], evil);
}

#[test]
fn glob_and_fuzzy_json_shapes() {
    let w = workspace();
    let (code, out, _) = sbxfs(w.path(), &["glob", "--json", "**/*.rs"]);
    assert_eq!(code, 0);
    assert_eq!(
        json_lines(&out),
        vec![
            serde_json::json!({"path": "src/lib.rs"}),
            serde_json::json!({"path": "src/main.rs"})
        ]
    );
    assert_eq!(sbxfs(w.path(), &["glob", "*.none"]).0, 1);
    let (code, _, err) = sbxfs(w.path(), &["glob", "+(a|b)"]);
    assert_eq!(code, 2);
    assert!(err.contains("extended glob"), "{err}");

    let (code, out, _) = sbxfs(w.path(), &["fuzzy", "--json", "srcmain"]);
    assert_eq!(code, 0);
    let m = &json_lines(&out)[0];
    assert_eq!(m["path"], "src/main.rs");
    assert!(m["score"].as_i64().unwrap() > 0);
    assert_eq!(m["positions"].as_array().unwrap().len(), 7);
    assert_eq!(sbxfs(w.path(), &["fuzzy", "qqqq"]).0, 1);
}

#[test]
fn scan_prints_the_window_or_its_json() {
    let w = workspace();
    let (code, out, _) = sbxfs(
        w.path(),
        &["scan", "notes.txt", "--start", "2", "--end", "3"],
    );
    assert_eq!(code, 0);
    assert_eq!(out, "beta\ngamma\n");
    let (_, out, _) = sbxfs(w.path(), &["scan", "notes.txt", "--start", "2", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"lines": ["beta", "gamma"], "start_line": 2, "end_line": 3,
            "total_lines": 3, "total_bytes": 17, "first_line_bytes": 4})
    );
    let (code, _, err) = sbxfs(
        w.path(),
        &["scan", "notes.txt", "--start", "1", "--max-bytes", "2"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("line 1 is 5 bytes"), "{err}");
    let (code, out, _) = sbxfs(w.path(), &["scan", "gone.txt", "--start", "1", "--json"]);
    assert_eq!(code, 2);
    assert_eq!(json_lines(&out)[0]["error"], "not_found");
}

#[test]
fn edit_replaces_multiline_text_from_files_and_reports_errors() {
    let w = workspace();
    let p = w.path();
    fs::write(p.join("old.txt"), "fn main() {\n    // TODO one\n").unwrap();
    fs::write(p.join("new.txt"), "fn main() {\n    // DONE\n").unwrap();
    let (code, out, _) = sbxfs(
        p,
        &[
            "edit",
            "src/main.rs",
            "--old-file",
            "old.txt",
            "--new-file",
            "new.txt",
            "--json",
        ],
    );
    assert_eq!((code, out.trim()), (0, r#"{"count":1}"#));
    assert_eq!(
        fs::read_to_string(p.join("src/main.rs")).unwrap(),
        "fn main() {\n    // DONE\n    work();\n}\n"
    );
    let (code, out, _) = sbxfs(
        p,
        &["edit", "notes.txt", "--old", "a", "--new", "A", "--json"],
    );
    assert_eq!(code, 2);
    let v = &json_lines(&out)[0];
    assert_eq!(
        (v["error"].as_str(), v["count"].as_u64()),
        (Some("multiple_occurrences"), Some(5))
    );
    let (code, _, _) = sbxfs(
        p,
        &["edit", "notes.txt", "--old", "a", "--new", "A", "--all"],
    );
    assert_eq!(code, 0);
    assert_eq!(
        fs::read_to_string(p.join("notes.txt")).unwrap(),
        "AlphA\nbetA\ngAmmA\n"
    );
    let (code, out, _) = sbxfs(
        p,
        &["edit", "notes.txt", "--old", "zzz", "--new", "", "--json"],
    );
    assert_eq!(code, 1);
    assert_eq!(json_lines(&out)[0]["error"], "string_not_found");
    // A leading hyphen is text, not a flag.
    fs::write(p.join("flags.txt"), "-x\n").unwrap();
    assert_eq!(
        sbxfs(p, &["edit", "flags.txt", "--old", "-x", "--new", "--y"]).0,
        0
    );
    assert_eq!(fs::read_to_string(p.join("flags.txt")).unwrap(), "--y\n");
}

#[test]
fn scan_is_bounded_by_the_size_seen_at_start() {
    let w = workspace();
    let path = w.path().join("grow.txt");
    fs::write(&path, "one\ntwo\n").unwrap();
    let file = fs::File::open(&path).unwrap();
    let size = file.metadata().unwrap().len();
    // The file grows after the scan started: the bytes past the starting size are not seen.
    fs::write(&path, "one\ntwo\nthree\nfour\n").unwrap();
    let req = sbxfs::search::scan::ScanRequest {
        start_line: 1,
        end_line: None,
        max_bytes: 1000,
    };
    let r = sbxfs::search::scan::scan_reader_at(&file, size, req).unwrap();
    assert_eq!(r.total_lines, 2);
    assert_eq!(r.total_bytes, 8);
    assert_eq!(r.lines, vec![b"one".to_vec(), b"two".to_vec()]);
}

/// The subcommands whose every argument must be described (grep, glob and fuzzy are checked
/// with their own options elsewhere).
const DESCRIBED: &[&[&str]] = &[
    &["scan"],
    &["edit"],
    &["agent"],
    &["mount"],
    &["umount"],
    &["ctl"],
    &["ctl", "invalidate"],
    &["completions"],
    &["man"],
];

#[test]
fn help_describes_every_option_and_lists_the_exit_codes() {
    let root = sbxfs::cli::command();
    for path in DESCRIBED {
        let mut cmd = &root;
        for name in *path {
            cmd = cmd.find_subcommand(name).unwrap();
        }
        let mut args: Vec<&str> = path.to_vec();
        args.push("--help");
        let (code, help, _) = sbxfs(Path::new("."), &args);
        assert_eq!(code, 0, "{args:?}");
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let text = arg
                .get_help()
                .unwrap_or_else(|| panic!("{path:?}: {} has no help text", arg.get_id()))
                .to_string();
            // The first line of the description is shown (clap may wrap the rest).
            let first: String = text
                .split_whitespace()
                .take(4)
                .collect::<Vec<_>>()
                .join(" ");
            let shown: String = help.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                shown.contains(&first),
                "{path:?} --help lacks {first:?}:\n{help}"
            );
        }
        if !matches!(path, [a] if *a == "completions" || *a == "man") && path.len() == 1 {
            assert!(help.contains("Examples:"), "{path:?} has no examples");
            assert!(help.contains("Exit codes:"), "{path:?} has no exit codes");
        }
    }
    let (_, top, _) = sbxfs(Path::new("."), &["--help"]);
    for line in [
        "Exit codes:",
        "  3  mount: the mountpoint cannot be used",
        "  4  mount: FUSE is missing or not permitted",
        "  5  the sandbox could not be reached",
        "  6  what answered is not an sbxfs agent",
        "  7  the agent rejected the token",
        "SBXFS_LOG",
    ] {
        assert!(
            top.contains(line),
            "top-level --help lacks {line:?}:\n{top}"
        );
    }
}

#[test]
fn version_names_the_protocols() {
    let (code, out, _) = sbxfs(Path::new("."), &["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!(
            "sbxfs {} (agent protocol {}, control protocol {})",
            env!("CARGO_PKG_VERSION"),
            sbxfs::remote::wire::PROTOCOL_VERSION,
            sbxfs::control::PROTOCOL_VERSION
        )
    );
}

#[test]
fn completions_and_the_man_page_are_generated_from_the_cli() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = sbxfs(Path::new("."), &["completions", shell]);
        assert_eq!(code, 0, "{err}");
        for word in [
            "mount",
            "umount",
            "ctl",
            "invalidate",
            "token-file",
            "max-bytes",
        ] {
            assert!(out.contains(word), "{shell} completion lacks {word}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, bash, _) = sbxfs(Path::new("."), &["completions", "bash"]);
    fs::write(dir.path().join("sbxfs.bash"), bash).unwrap();
    let (code, _, err) = run(Command::new("bash")
        .arg("-n")
        .arg(dir.path().join("sbxfs.bash")));
    assert_eq!(
        code,
        0,
        "bash rejects the script: {}",
        String::from_utf8_lossy(&err)
    );
    let (code, man, _) = sbxfs(Path::new("."), &["man"]);
    assert_eq!(code, 0);
    assert!(man.contains(".TH sbxfs 1"), "{man}");
    for word in ["mount", "agent", "Exit codes", "SBXFS_LOG"] {
        assert!(man.contains(word), "man page lacks {word}");
    }
}

#[test]
fn each_command_has_a_man_page_with_its_options() {
    let (code, grep, err) = sbxfs(Path::new("."), &["man", "grep"]);
    assert_eq!(code, 0, "{err}");
    assert!(grep.contains(".TH sbxfs-grep 1"), "{grep}");
    for option in ["ignore\\-case", "files\\-without\\-match", "max\\-bytes"] {
        assert!(grep.contains(option), "sbxfs-grep(1) lacks {option}");
    }
    let (code, _, err) = sbxfs(Path::new("."), &["man", "bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("no command `bogus`"), "{err}");
    let top = tempfile::tempdir().unwrap();
    // A directory that does not exist yet (~/.local/share/man/man1 often does not) is made.
    let dir = top.path().join("share/man/man1");
    let out = dir.to_str().unwrap();
    let (code, _, err) = sbxfs(Path::new("."), &["man", "--dir", out]);
    assert_eq!(code, 0, "{err}");
    let mut pages: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    assert!(pages.contains(&"sbxfs.1".to_string()), "{pages:?}");
    assert!(pages.contains(&"sbxfs-mount.1".to_string()), "{pages:?}");
    assert!(
        !pages
            .iter()
            .any(|p| p.contains("help") || p.contains("proxy")),
        "{pages:?}"
    );
    let mount = fs::read_to_string(dir.join("sbxfs-mount.1")).unwrap();
    assert!(
        mount.contains("token\\-file") && mount.contains("cache\\-size"),
        "{mount}"
    );
}

/// `sbxfs completions zsh | head -1`, `sbxfs man | head -1`: the reader leaving early is no
/// error (no panic, nothing on stderr, exit 0).
#[test]
fn generated_text_into_a_closed_pipe_is_no_error() {
    for args in ["completions zsh", "completions fish", "man", "man grep"] {
        let script = format!(
            "set -o pipefail; '{}' {args} | head -c 1 >/dev/null",
            sbxfs_bin().display()
        );
        let (code, _, err) = run(Command::new("bash").arg("-c").arg(&script));
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, 0, "{args}: {err}");
        assert!(err.is_empty(), "{args}: {err}");
    }
}

/// `sbxfs ctl status | true`: the same for ctl's answers (it used to panic, exit 101).
#[test]
fn ctl_answers_into_a_closed_pipe_are_no_error() {
    let (_w, _agent, m) = mounted();
    for args in ["status", "status --json", "stats", "flush"] {
        let script = format!(
            "set -o pipefail; '{}' ctl --mount '{}' {args} | true",
            sbxfs_bin().display(),
            m.dir.display()
        );
        let (code, _, err) = run(Command::new("bash").arg("-c").arg(&script));
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, 0, "{args}: {err}");
        assert!(err.is_empty(), "{args}: {err}");
    }
}

/// `sbxfs umount` unmounts sbxfs mounts only: as root, fusermount3 would unmount anything.
#[test]
fn umount_leaves_other_filesystems_alone() {
    let w = workspace();
    let plain = w.path().join("plain");
    fs::create_dir(&plain).unwrap();
    let (code, _, err) = sbxfs(w.path(), &["umount", "plain"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not a mount point"), "{err}");
    if !is_root() {
        return; // mounting a tmpfs needs root
    }
    let (code, _, err) = run(Command::new("mount")
        .args(["-t", "tmpfs", "sbxfs-test"])
        .arg(&plain));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let (code, _, err) = sbxfs(w.path(), &["umount", "plain"]);
    let mounted = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(plain.to_str().unwrap());
    let _ = run(Command::new("umount").arg(&plain));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not an sbxfs mount (type tmpfs)"), "{err}");
    assert!(mounted, "the tmpfs was unmounted");
}

#[test]
fn sizes_take_units() {
    let w = workspace();
    let lines: String = (1..=1000).map(|i| format!("line {i:04}\n")).collect();
    fs::write(w.path().join("big.txt"), &lines).unwrap();
    let (code, out, err) = sbxfs(w.path(), &["scan", "big.txt", "--max-bytes", "1K"]);
    assert_eq!(code, 0, "{err}");
    // 10-byte lines: 102 fit in 1024 bytes.
    assert_eq!(out, lines[..1020]);
    assert_eq!(
        err.trim(),
        "sbxfs scan: stopped at line 102 of 1000 by the --max-bytes budget; \
         go on with --start 103, or raise it (e.g. --max-bytes 1M)"
    );
    let (code, out, err) = sbxfs(w.path(), &["scan", "big.txt", "--max-bytes", "1M"]);
    assert_eq!((code, out.len(), err.as_str()), (0, lines.len(), ""));
    let (code, _, err) = sbxfs(w.path(), &["scan", "big.txt", "--max-bytes", "1Q"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown unit `Q`"), "{err}");
    // --cache-size 512M is a size: the mount gets as far as the (closed) port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    fs::create_dir(w.path().join("mnt")).unwrap();
    let (code, _, err) = run(Command::new(sbxfs_bin())
        .args(["mount", &format!("http://127.0.0.1:{port}"), "mnt"])
        .args(["--cache-size", "512M"])
        .env("SBXFS_TOKEN", "t")
        .env("XDG_CACHE_HOME", w.path().join("cache"))
        .current_dir(w.path()));
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("connection refused"), "{err}");
    let (code, _, err) = sbxfs(w.path(), &["grep", "line", ".", "--max-filesize", "2K"]);
    assert_eq!(
        code, 1,
        "a 10000-byte file is skipped under --max-filesize 2K: {err}"
    );
}

#[test]
fn a_scan_within_its_budget_says_nothing() {
    let w = workspace();
    let (code, out, err) = sbxfs(w.path(), &["scan", "notes.txt"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "alpha\nbeta\ngamma\n", "")
    );
}

#[test]
fn edit_that_is_not_unique_names_the_all_flag() {
    let w = workspace();
    let (code, _, err) = sbxfs(w.path(), &["edit", "notes.txt", "--old", "a", "--new", "A"]);
    assert_eq!(code, 2);
    assert!(err.contains("occurs 5 times; pass --all"), "{err}");
    assert_eq!(
        fs::read_to_string(w.path().join("notes.txt")).unwrap(),
        "alpha\nbeta\ngamma\n",
        "nothing changed"
    );
}

/// A real agent and mount of a small workspace with `src/a.txt`.
fn mounted() -> (tempfile::TempDir, AgentProcess, MountProcess) {
    let ws = tempfile::tempdir().unwrap();
    fs::create_dir(ws.path().join("src")).unwrap();
    fs::write(ws.path().join("src/a.txt"), "a\n").unwrap();
    let agent = AgentProcess::start(ws.path());
    let m = MountProcess::start(&agent, &[]);
    (ws, agent, m)
}

#[test]
fn ctl_prints_a_table_by_default_and_json_with_the_flag() {
    let (_ws, _agent, m) = mounted();
    let mnt = m.dir.to_str().unwrap();
    let (code, json, err) = sbxfs(Path::new("/"), &["ctl", "--mount", mnt, "status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["reachable"], true);
    let (code, table, err) = sbxfs(Path::new("/"), &["ctl", "--mount", mnt, "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        serde_json::from_str::<Value>(&table).is_err(),
        "not a table: {table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find_map(|l| l.strip_prefix(name).filter(|r| r.starts_with(' ')))
            .unwrap_or_else(|| panic!("no row {name}: {table}"))
            .trim()
            .to_string()
    };
    assert_eq!(row("reachable"), "true");
    assert_eq!(row("mount.remote"), v["mount"]["remote"].as_str().unwrap());
    assert_eq!(row("pending_commits"), v["pending_commits"].to_string());
}

#[test]
fn ctl_invalidate_resolves_its_path_against_the_mount() {
    let (_ws, _agent, m) = mounted();
    let elsewhere = tempfile::tempdir().unwrap();
    let mnt = m.dir.to_str().unwrap();
    let (code, out, err) = sbxfs(
        elsewhere.path(),
        &["ctl", "--mount", mnt, "invalidate", "src/a.txt", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["invalidated"], "src/a.txt", "{v}");
    // Without --mount, the same path from outside the mount is an error, not a guess.
    let (code, _, err) = sbxfs(elsewhere.path(), &["ctl", "invalidate", "src/a.txt"]);
    assert_eq!(code, 2);
    assert!(err.contains("not in a live sbxfs mount"), "{err}");
}
