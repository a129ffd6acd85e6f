//! `sbxfs grep ARGS` prints byte for byte what `rg --sort path ARGS` prints (stdout and exit
//! status), on a real tree: a copy of this repository's `src/` plus files made for the edge
//! cases (overlapping context, binary files, ignored, hidden and symlinked files, CRLF, several
//! file types). The same cases run standing in a real mount of that tree, where the sandbox
//! searches, must print the same. `fuzzy` and `glob` in a mount answer as run in the sandbox.

use crate::common;

use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The tree every case searches. `.git` makes rg honour `.gitignore`, as sbxfs always does.
fn build_tree(root: &Path) {
    copy_dir(&repo_root().join("src"), &root.join("src"));
    for (rel, bytes) in crafted_files() {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, bytes).unwrap();
    }
    fs::create_dir_all(root.join(".git")).unwrap();
    // A name that is not UTF-8: printed as its bytes, as rg prints it.
    let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    fs::write(root.join("sub").join(latin1), b"needle latin1\n").unwrap();
    for (target, link) in LINKS {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
}

/// Symbolic links of the tree: (target, link).
const LINKS: [(&str, &str); 2] = [("ctx.txt", "link.txt"), ("sub", "linkdir")];

/// The files made for the edge cases.
fn crafted_files() -> Vec<(&'static str, &'static [u8])> {
    vec![
        (
            "ctx.txt",
            b"one\nneedle a\nthree\nfour\nneedle b\nsix\nseven\neight\nnine\nten\n\
              needle c\ntwelve\nneedle d\nfourteen\nfifteen\nsixteen\nseventeen\neighteen\n\
              nineteen\nNeedle e\n",
        ),
        ("crlf.txt", b"needle one\r\nplain\r\nneedles two\r\n"),
        ("bin.dat", b"zero\x00needle\nmore needle\n"),
        ("binlate.dat", b"needle early\nline\n\x00needle late\n"),
        (".gitignore", b"ignored.txt\n*.log\n"),
        ("ignored.txt", b"needle ignored\n"),
        ("app.log", b"needle in a log\n"),
        (".hidden.txt", b"needle hidden\n"),
        (".config/conf.toml", b"needle = \"hidden dir\"\n"),
        ("a.py", b"import os\n# needle python\n"),
        ("b.js", b"const needle = 1;\n"),
        ("c.md", b"# Needle\n\nneedlework\n"),
        ("d.toml", b"[needle]\nx = 1\n"),
        ("Makefile", b"all:\n\techo needle\n"),
        ("sub/x.txt", b"needle sub\nother\n"),
        ("sub/deep/y.rs", b"fn needle() {}\n// a.b(\n"),
        ("sub/deep/z.txt", b"no match here\n"),
        (
            "words.txt",
            b"needle\nneedles\nneedle-nose\na_needle\nNEEDLE\n",
        ),
        ("empty.txt", b""),
        // A name with spaces: what `-0` is for (`xargs` would split it).
        ("with space/a /tmp/notes", b"needle spaced\n"),
    ]
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Every supported flag, alone and combined, with and without paths.
fn cases() -> Vec<Vec<&'static str>> {
    let cases: &[&[&str]] = &[
        &["needle"],
        &["-n", "needle"],
        &["-i", "NEEDLE"],
        &["-S", "needle"],
        &["-S", "Needle"],
        &["-w", "needle"],
        &["-w", "-n", "needle", "words.txt"],
        &["-v", "needle", "ctx.txt"],
        &["-v", "-n", "needle", "sub"],
        &["-c", "needle"],
        &["-c", "-v", "needle"],
        &["-c", "needle", "ctx.txt"],
        &["-l", "needle"],
        &["-l", "-i", "NEEDLE", "sub"],
        &["--files-without-match", "needle"],
        &["--files"],
        &["--files", "sub"],
        &["--files", "-t", "rust", "sub", "ctx.txt"],
        &["-o", "needle"],
        &["-o", "-n", "ne+dle[a-z]*"],
        // rg: -o with -c counts matches, not matching lines.
        &["-o", "-c", "needle"],
        &["-c", "-o", r"fn\s+\w+\(", "src"],
        &["-o", "-c", "e", "ctx.txt"],
        &["--column", "needle"],
        &["--column", "-o", "needle", "words.txt"],
        &["-C1", "needle"],
        &["-C", "3", "needle"],
        &["-A2", "-B1", "needle", "ctx.txt"],
        &["-C1", "-A3", "needle", "ctx.txt"],
        &["-A3", "-C1", "needle", "ctx.txt"],
        &["-B2", "-C1", "-A3", "needle", "ctx.txt"],
        &["-n", "-C2", "needle"],
        &["-A1", "needle", "ctx.txt", "words.txt"],
        &["-B", "4", "-n", "fn main", "src"],
        &["-H", "needle", "ctx.txt"],
        &["needle", "ctx.txt"],
        &["--no-filename", "needle"],
        &["-I", "-n", "needle", "sub"],
        &["-t", "py", "needle"],
        &["-t", "rust", "-c", "fn"],
        &["-T", "rust", "-l", "needle"],
        &["-t", "txt", "-t", "md", "-n", "needle"],
        &["-u", "needle"],
        &["-uu", "needle"],
        &["-uuu", "needle"],
        &["--binary", "needle"],
        &["-a", "needle", "bin.dat"],
        &["needle", "bin.dat"],
        &["needle", "binlate.dat"],
        &["-L", "needle"],
        &["-L", "-l", "needle"],
        &["needle", "link.txt"],
        &["--hidden", "needle"],
        &["--no-ignore", "-l", "needle"],
        &["-g", "*.txt", "needle"],
        &["-g", "!*.txt", "-l", "needle"],
        &["-F", "a.b(", "sub"],
        &["--max-filesize", "20", "-l", "needle"],
        &["-j1", "needle"],
        &["--heading", "-n", "needle"],
        &["--heading", "-C1", "needle", "ctx.txt", "words.txt"],
        &["--no-heading", "needle"],
        &["--color", "always", "needle"],
        &["--color", "always", "-n", "--heading", "-C1", "needle"],
        &["--color", "always", "-l", "needle"],
        &["--color", "always", "--files", "sub"],
        &["--color", "never", "needle"],
        &["needle", "sub"],
        &["needle", "./sub"],
        &["needle", "sub/"],
        &["needle", "sub", "ctx.txt"],
        &["needle", "ctx.txt", "crlf.txt"],
        &["-n", "needle", "crlf.txt"],
        &["-l", "fn", "src"],
        &["-c", "TODO", "src"],
        &["-n", "-w", "-C2", "-t", "rust", "Printer", "src"],
        &["fn main", "src/main.rs"],
        &["needle", "nonexistent", "ctx.txt"],
        &["zzz-no-such-thing"],
        &["zzz-no-such-thing", "ctx.txt"],
        &["needle", "empty.txt"],
        &["-0", "-l", "needle"],
        &["-0", "--files-without-match", "needle"],
        &["-0", "-c", "needle"],
        &["-0", "--files", "sub"],
        &["-0", "-H", "-n", "needle", "ctx.txt"],
        &["-0", "-C1", "needle"],
        &["-0", "--heading", "-n", "needle"],
    ];
    cases
        .iter()
        .chain(everyday_cases())
        .map(|c| c.to_vec())
        .collect()
}

/// rg's everyday flags beyond the first set: -e, -x, -m, -q, -r, -U, --vimgrep.
fn everyday_cases() -> &'static [&'static [&'static str]] {
    &[
        &["-e", "needle", "-e", "TODO", "-n"],
        &["-e", "needle", "sub", "ctx.txt"],
        &["-e", "-needle"],
        &["-x", "-n", ".*needle.*", "ctx.txt"],
        &["-x", "needle"],
        &["-F", "-x", "-e", "a.b(", "-e", "// a.b(", "sub"],
        &["-m", "1", "needle"],
        &["-m1", "-c", "needle"],
        &["-m", "2", "-n", "-A1", "needle", "ctx.txt"],
        &["-q", "needle"],
        &["-q", "zzz-no-such-thing"],
        &["-q", "needle", "nonexistent", "ctx.txt"],
        &["-r", "NEEDLE", "needle"],
        &["-o", "-r", "[$0]", "ne+dle"],
        &["-r", "$1", "-n", "(n)eedle", "ctx.txt"],
        &["-U", "-n", r"fn needle\(\) \{\}\n//", "sub"],
        &["-U", "-c", r"e\ne"],
        &["--vimgrep", "needle"],
        &["--vimgrep", "-o", "e", "ctx.txt"],
        &["-U", "--vimgrep", r"fn needle\(\) \{\}\n//", "sub"],
    ]
}

/// Exit status and stdout of a command run in `dir`, as bytes.
fn output(cmd: &mut Command, dir: &Path) -> (i32, Vec<u8>) {
    let (code, out, _) = run(cmd.current_dir(dir).env_remove("NO_COLOR"));
    (code, out)
}

fn rg(rg: &Path, dir: &Path, args: &[&str]) -> (i32, Vec<u8>) {
    output(Command::new(rg).args(["--sort", "path"]).args(args), dir)
}

fn sbxfs(dir: &Path, cmd: &str, args: &[&str]) -> (i32, Vec<u8>) {
    output(Command::new(sbxfs_bin()).arg(cmd).args(args), dir)
}

/// Compare every case run in `here` against rg run in `root`; all differences in one panic.
fn compare_all(rg_bin: &Path, root: &Path, here: &Path, cases: &[Vec<&str>]) {
    let mut diffs = Vec::new();
    for args in cases {
        let want = rg(rg_bin, root, args);
        let got = sbxfs(here, "grep", args);
        if got != want {
            diffs.push(format!(
                "sbxfs grep {args:?} in {}:\n  rg (exit {}):\n{}\n  sbxfs (exit {}):\n{}",
                here.display(),
                want.0,
                String::from_utf8_lossy(&want.1),
                got.0,
                String::from_utf8_lossy(&got.1)
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} of {} cases differ from rg:\n{}",
        diffs.len(),
        cases.len(),
        diffs.join("\n")
    );
}

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    build_tree(&root);
    Tree { _dir: dir, root }
}

#[test]
fn grep_prints_what_rg_prints_for_every_supported_flag() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let t = tree();
    compare_all(&rg_bin, &t.root, &t.root, &cases());
    // From a directory below, with paths above it.
    let below: Vec<Vec<&str>> = vec![
        vec!["needle"],
        vec!["-n", "needle", ".."],
        vec!["needle", "../ctx.txt", "x.txt"],
    ];
    compare_all(&rg_bin, &t.root.join("sub"), &t.root.join("sub"), &below);
}

#[test]
fn grep_in_a_mount_prints_what_rg_prints_in_the_sandbox() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let t = tree();
    let agent = AgentProcess::start(&t.root);
    let mount = MountProcess::start(&agent, &[]);
    compare_all(&rg_bin, &t.root, &mount.dir, &cases());
    let below: Vec<Vec<&str>> = vec![
        vec!["needle"],
        vec!["-n", "-C1", "needle", "../ctx.txt", "x.txt"],
    ];
    compare_all(&rg_bin, &t.root.join("sub"), &mount.dir.join("sub"), &below);
}

#[test]
fn grep_over_shell_prints_what_rg_prints_for_the_everyday_flags() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let t = tree();
    let mount = MountProcess::start_url(&format!("shell:{}", t.root.display()), "unused", &[]);
    let cases: Vec<Vec<&str>> = everyday_cases().iter().map(|c| c.to_vec()).collect();
    compare_all(&rg_bin, &t.root, &mount.dir, &cases);
}

#[test]
fn grep_with_no_path_searches_a_pipe_on_stdin_as_rg_does() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = b"one needle\ntwo\nneedle three\n";
    for args in [
        &["needle"][..],
        &["-n", "needle"],
        &["-c", "needle"],
        &["-H", "--vimgrep", "needle"],
        &["-v", "-A1", "needle"],
        &["-q", "needle"],
        &["zzz"],
    ] {
        let piped = |program: &Path, pre: &[&str]| {
            let mut child = Command::new(program)
                .args(pre)
                .args(args)
                .current_dir(dir.path())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(input).unwrap();
            let out = child.wait_with_output().unwrap();
            (out.status.code(), out.stdout)
        };
        assert_eq!(
            piped(&sbxfs_bin(), &["grep"]),
            piped(&rg_bin, &[]),
            "{args:?}"
        );
    }
}

/// Run `program args` under `script`, so its stdout is a terminal; the bytes it printed.
fn on_a_terminal(script: &Path, dir: &Path, program: &Path, args: &[&str]) -> Vec<u8> {
    let mut line = program.display().to_string();
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let (code, out, err) = run(Command::new(script)
        .current_dir(dir)
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .args(["-qec", &line, "/dev/null"]));
    assert!(
        code <= 1,
        "{line}: exit {code}: {}",
        String::from_utf8_lossy(&err)
    );
    out
}

#[test]
fn on_a_terminal_grep_prints_rgs_colours_headings_and_line_numbers() {
    let (Some(rg_bin), Some(script)) = (require_tool("rg"), require_tool("script")) else {
        return;
    };
    let t = tree();
    let cases: &[&[&str]] = &[
        &["needle"],
        &["-C1", "needle", "ctx.txt", "words.txt"],
        &["--no-heading", "-w", "needle"],
        &["-c", "needle"],
        &["-l", "needle", "sub"],
        &["--color", "never", "needle", "ctx.txt"],
        &["--files", "sub"],
    ];
    for args in cases {
        let mut rg_args = vec!["--sort", "path"];
        rg_args.extend_from_slice(args);
        let want = on_a_terminal(&script, &t.root, &rg_bin, &rg_args);
        let mut ours = vec!["grep"];
        ours.extend_from_slice(args);
        let got = on_a_terminal(&script, &t.root, &sbxfs_bin(), &ours);
        assert!(!want.is_empty(), "rg {args:?} printed nothing");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "sbxfs grep {args:?} on a terminal differs from rg"
        );
    }
}

/// `--max-results N` (sbxfs's cap) prints rg's first N matching lines and says it stopped;
/// locally (files printed in parallel, the last one printed again with fewer matches) and in
/// a mount alike.
#[test]
fn max_results_prints_rgs_first_lines() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let t = tree();
    let agent = AgentProcess::start(&t.root);
    let mount = MountProcess::start(&agent, &[]);
    let all = rg(&rg_bin, &t.root, &["-n", "needle"]).1;
    for n in [1, 3, 7] {
        let want: Vec<u8> = all
            .split_inclusive(|&b| b == b'\n')
            .take(n)
            .flatten()
            .copied()
            .collect();
        for dir in [&t.root, &mount.dir] {
            let (code, out, err) = run(Command::new(sbxfs_bin()).current_dir(dir).args([
                "grep",
                "-j4",
                "-n",
                "--max-results",
                &n.to_string(),
                "needle",
            ]));
            assert_eq!(code, 0);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "--max-results {n} in {dir:?}"
            );
            assert!(String::from_utf8_lossy(&err).contains("truncated"));
        }
    }
}

/// `sbxfs grep … | head -2`: status and stderr under `set -o pipefail`.
fn piped_to_head(program: &Path, prefix: &[&str], dir: &Path, args: &[&str]) -> (i32, String) {
    let err = tempfile::NamedTempFile::new().unwrap();
    let (code, _, _) = run(Command::new("bash")
        .current_dir(dir)
        .arg("-c")
        .arg(r#"set -o pipefail; err="$1"; shift; "$@" 2>"$err" | head -2 >/dev/null"#)
        .arg("bash")
        .arg(err.path())
        .arg(program)
        .args(prefix)
        .args(args));
    (code, fs::read_to_string(err.path()).unwrap())
}

/// A reader that closes the pipe (`| head -2`) ends the search quietly, with rg's status (0
/// when a file printed before the pipe closed matched, else 1), locally and in a mount.
#[test]
fn a_closed_pipe_ends_grep_quietly_with_rgs_status() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let big: String = (0..200_000).map(|i| format!("fn f{i}() {{}}\n")).collect();
    for (rel, text) in [
        ("first/a.rs", "fn small() {}\n"),
        ("first/big.rs", big.as_str()),
        ("last/big.rs", big.as_str()),
        ("last/z.rs", "fn small() {}\n"),
    ] {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &[]);
    for (args, status) in [
        (&["fn", "first"][..], 0),
        (&["fn", "last"][..], 1),
        (&["-n", "fn"][..], 0),
    ] {
        let want = piped_to_head(&rg_bin, &["--sort", "path"], &root, args);
        assert_eq!(want, (status, String::new()), "rg {args:?}");
        for here in [&root, &mount.dir] {
            let got = piped_to_head(&sbxfs_bin(), &["grep"], here, args);
            assert_eq!(got, want, "sbxfs grep {args:?} in {here:?}");
        }
    }
    // A real cap still says so.
    let (code, _, err) = run(Command::new(sbxfs_bin()).current_dir(&mount.dir).args([
        "grep",
        "--max-results",
        "3",
        "fn",
        "first",
    ]));
    assert_eq!(code, 0);
    assert!(
        String::from_utf8_lossy(&err).contains("stopped at a limit after 3 matches"),
        "{}",
        String::from_utf8_lossy(&err)
    );
}

/// The "too big" error names the user's pattern, as the invalid-regex error does.
#[test]
fn a_regex_too_big_error_shows_the_users_pattern() {
    let t = tree();
    let pattern = "(((a{100}){100}){100})";
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .current_dir(&t.root)
        .args(["grep", pattern]));
    let err = String::from_utf8(err).unwrap();
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains(&format!("{pattern}: ")), "{err}");
    assert!(err.contains("size limit"), "{err}");
    assert!(!err.contains("(?:"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn sort_none_is_accepted_and_prints_in_path_order() {
    let t = tree();
    let by_path = sbxfs(&t.root, "grep", &["--sort", "path", "-n", "needle"]);
    let none = sbxfs(&t.root, "grep", &["--sort", "none", "-n", "needle"]);
    assert_eq!(by_path.0, 0);
    assert_eq!(none, by_path);
}

#[test]
fn grep_type_list_is_rgs() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let t = tree();
    let want = output(Command::new(&rg_bin).arg("--type-list"), &t.root);
    let got = sbxfs(&t.root, "grep", &["--type-list"]);
    // The `ignore` crate's definitions may be newer than the installed rg's: every type rg
    // knows is listed, with the same globs, unless the crate changed that type.
    let got_text = String::from_utf8(got.1).unwrap();
    assert_eq!(got.0, 0);
    for t in ["rust: *.rs", "py: *.py, *.pyi", "md:", "toml: *.toml"] {
        assert!(got_text.contains(t), "--type-list lacks {t:?}");
    }
    assert!(want.1.len() > 1000 && got_text.len() > 1000);
}

#[test]
fn an_invalid_regex_error_shows_the_users_pattern() {
    let t = tree();
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .current_dir(&t.root)
        .args(["grep", "foo("]));
    let err = String::from_utf8(err).unwrap();
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("foo(: unclosed group"), "{err}");
    assert!(!err.contains("(?:"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn fuzzy_and_glob_in_a_mount_answer_as_run_in_the_sandbox() {
    let t = tree();
    let agent = AgentProcess::start(&t.root);
    let mount = MountProcess::start(&agent, &[]);
    let cases: &[(&str, &[&str])] = &[
        ("fuzzy", &["-g", "*.rs", "--max-filesize", "3000", "rs"]),
        ("fuzzy", &["-g", "!src/**", "txt"]),
        ("fuzzy", &["--hidden", "--no-ignore", "-t", "toml", "conf"]),
        ("fuzzy", &["-T", "rust", "--json", "x"]),
        ("fuzzy", &["-L", "--limit", "3", "y"]),
        ("fuzzy", &["srch", "src"]),
        ("glob", &["**/*.rs", "src"]),
        ("glob", &["*.{txt,md}"]),
        ("glob", &["--json", "sub/**"]),
    ];
    for (cmd, args) in cases {
        let there = sbxfs(&t.root, cmd, args);
        let here = sbxfs(&mount.dir, cmd, args);
        assert!(
            there.0 == 0,
            "sbxfs {cmd} {args:?} found nothing in the sandbox"
        );
        assert_eq!(
            String::from_utf8_lossy(&here.1),
            String::from_utf8_lossy(&there.1),
            "sbxfs {cmd} {args:?} differs between the mount and the sandbox"
        );
        assert_eq!(here.0, there.0);
    }
}

/// The in-memory sandbox (`MemoryRemote`, the tests' stand-in for an agent) prints each file
/// exactly as the core does on a real directory.
#[tokio::test]
async fn the_memory_sandbox_prints_as_the_core_does() {
    use futures_util::StreamExt;
    use sbxfs::remote::{GrepEvent, Remote, RemotePath};
    use sbxfs::search::grep::{grep_items, GrepItem, GrepOptions};
    use sbxfs::search::print::{PrintKind, PrintOptions};
    use sbxfs::search::walk::WalkOptions;

    let dir = tempfile::tempdir().unwrap();
    let m = sbxfs::remote::memory::MemoryRemote::new();
    let sb = m.sandbox();
    for (rel, bytes) in crafted_files() {
        let p = dir.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, bytes).unwrap();
        if let Some((parent, _)) = rel.rsplit_once('/') {
            sb.mkdir_all(parent).unwrap();
        }
        sb.write(rel, bytes).unwrap();
    }
    for (target, link) in LINKS {
        std::os::unix::fs::symlink(target, dir.path().join(link)).unwrap();
        sb.symlink(target, link).unwrap();
    }
    let print = |kind| PrintOptions {
        kind,
        line_number: true,
        ..Default::default()
    };
    let cases = [
        (print(PrintKind::Lines), GrepOptions::default()),
        (
            print(PrintKind::Lines),
            GrepOptions {
                before_context: 2,
                after_context: 1,
                word: true,
                ..Default::default()
            },
        ),
        (
            PrintOptions {
                color: true,
                heading: true,
                ..print(PrintKind::Lines)
            },
            GrepOptions {
                invert: true,
                ..Default::default()
            },
        ),
        (print(PrintKind::Count), GrepOptions::default()),
        (
            print(PrintKind::FilesWithMatches),
            GrepOptions {
                walk: WalkOptions {
                    hidden: true,
                    no_ignore: true,
                    follow: true,
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        (
            print(PrintKind::Files),
            GrepOptions {
                walk: WalkOptions {
                    types: vec!["txt".into()],
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        (
            print(PrintKind::FilesWithoutMatch),
            GrepOptions {
                search_binary: true,
                smart_case: true,
                ..Default::default()
            },
        ),
    ];
    for (p, base) in cases {
        let opts = GrepOptions {
            pattern: "needle".into(),
            print: Some(p),
            ..base
        };
        let mut local = Vec::new();
        grep_items(dir.path(), &opts, &mut |item| {
            if let GrepItem::Printed(f) = item {
                local.push(f);
            }
            true
        })
        .unwrap();
        let mut stream = m.grep(&RemotePath::root(), opts.clone()).await.unwrap();
        let mut remote = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                GrepEvent::Printed(f) => remote.push(f),
                GrepEvent::Summary { .. } => break,
                GrepEvent::Match(_) => panic!("a match where printed files were asked for"),
            }
        }
        assert!(!local.is_empty(), "{opts:?} printed nothing");
        assert_eq!(remote, local, "{opts:?}");
    }
}

/// The wire stays readable both ways: requests from older peers (without the new fields) parse
/// with rg's defaults, and a printed file is never mistaken for a match.
#[test]
fn new_options_cross_the_wire_and_old_requests_still_parse() {
    use sbxfs::remote::{FuzzyRequest, GrepEvent};
    use sbxfs::search::grep::GrepOptions;
    use sbxfs::search::print::PrintedFile;

    let old: FuzzyRequest =
        serde_json::from_str(r#"{"query":"x","limit":5,"hidden":true,"no_ignore":false}"#).unwrap();
    assert!(old.walk.hidden && old.walk.globs.is_empty() && old.walk.max_filesize.is_none());
    let mut new = old.clone();
    new.walk.globs = vec!["*.rs".into()];
    new.walk.max_filesize = Some(10);
    new.walk.types = vec!["rust".into()];
    new.walk.follow = true;
    let v = serde_json::to_value(&new).unwrap();
    assert_eq!(v["hidden"], true, "the old keys keep their place: {v}");
    assert_eq!(serde_json::from_value::<FuzzyRequest>(v).unwrap(), new);

    let old: GrepOptions =
        serde_json::from_str(r#"{"pattern":"a","case_insensitive":true,"walk":{"hidden":true}}"#)
            .unwrap();
    assert!(old.print.is_none() && !old.word && !old.invert && old.walk.types.is_empty());
    let printed = GrepEvent::Printed(PrintedFile {
        printed: sbxfs::remote::WireBytes(b"a.txt:x\n".to_vec()),
        matches: 1,
        path: Some(sbxfs::remote::WireBytes(b"a.txt".to_vec())),
        over_cap: false,
    });
    let line = serde_json::to_string(&printed).unwrap();
    assert_eq!(serde_json::from_str::<GrepEvent>(&line).unwrap(), printed);
}

/// Counts and file lists are not cut by the agent's match limit (100,000): `-c` in a mount
/// over a file with more matching lines than that counts them all, as rg does.
#[test]
fn counts_in_a_mount_are_not_capped_by_the_match_limit() {
    let Some(rg_bin) = require_tool("rg") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let lines: String = (0..150_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(root.path().join("big.txt"), lines).unwrap();
    let agent = AgentProcess::start(root.path());
    let mount = MountProcess::start(&agent, &[]);
    for args in [&["-c", "line"][..], &["-v", "-c", "zzz"], &["-l", "line"]] {
        let want = rg(&rg_bin, root.path(), args);
        let (code, out, err) = run(Command::new(sbxfs_bin())
            .current_dir(&mount.dir)
            .arg("grep")
            .args(args));
        assert_eq!(
            (code, String::from_utf8_lossy(&out)),
            (want.0, String::from_utf8_lossy(&want.1)),
            "{args:?}: {}",
            String::from_utf8_lossy(&err)
        );
        assert!(
            err.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&err)
        );
    }
}
