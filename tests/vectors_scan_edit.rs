//! The scan and edit vectors, run against every implementation: the Rust core (scan fed whole,
//! byte by byte and in odd chunks), `scripts/scan.sh` under dash+mawk, dash+gawk and busybox,
//! `scripts/edit.py`, the independent Python references in `tests/reference/`, and
//! `MemoryRemote`'s scan and edit.

use crate::common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine;
use serde_json::{json, Value};

use common::*;
use sbxfs::search::edit::edit_file;
use sbxfs::search::scan::{scan_file, LineWindow, ScanRequest, ScanResult};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The comparable form of a scan answer: lines as hex, plus the numbers.
fn scan_value(r: &ScanResult) -> Value {
    json!({
        "lines_hex": r.lines.iter().map(|l| hex(l)).collect::<Vec<_>>(),
        "start_line": r.start_line, "end_line": r.end_line, "total_lines": r.total_lines,
        "total_bytes": r.total_bytes, "first_line_bytes": r.first_line_bytes,
    })
}

fn expected_scan(case: &Value) -> Value {
    let mut e = case["expect"].clone();
    if let Some(lines) = e.get("lines").and_then(Value::as_array) {
        let hexed: Vec<String> = lines
            .iter()
            .map(|l| hex(l.as_str().unwrap().as_bytes()))
            .collect();
        e.as_object_mut().unwrap().remove("lines");
        e["lines_hex"] = json!(hexed);
    }
    e
}

struct ScanCase {
    name: String,
    path: PathBuf,
    req: ScanRequest,
    end_arg: String,
    expect: Result<Value, String>,
}

fn scan_cases(dir: &Path) -> Vec<ScanCase> {
    let v = load_vectors("scan.json");
    for (name, spec) in v["files"].as_object().unwrap() {
        fs::write(dir.join(name), file_bytes(spec)).unwrap();
    }
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let end = c["end"].as_u64();
            ScanCase {
                name: c["name"].as_str().unwrap().to_string(),
                path: dir.join(c["file"].as_str().unwrap()),
                req: ScanRequest {
                    start_line: c["start"].as_u64().unwrap(),
                    end_line: end,
                    max_bytes: c["max_bytes"].as_u64().unwrap(),
                },
                end_arg: end.map(|e| e.to_string()).unwrap_or_default(),
                expect: match c.get("expect_error").and_then(Value::as_str) {
                    Some(tok) => Err(tok.to_string()),
                    None => Ok(expected_scan(c)),
                },
            }
        })
        .collect()
}

#[test]
fn scan_vectors_rust_core_whole_and_chunked() {
    let dir = tempfile::tempdir().unwrap();
    let cases = scan_cases(dir.path());
    let mut checked = 0;
    for c in &cases {
        let got = scan_file(&c.path, c.req)
            .map(|r| scan_value(&r))
            .map_err(|e| e.token().to_string());
        assert_eq!(
            got, c.expect,
            "scan vector {:?} (rust, positional reads)",
            c.name
        );
        if let Ok(expect) = &c.expect {
            let data = fs::read(&c.path).unwrap();
            // Fed whole, one byte at a time, and in chunks of 7: the state machine must not care.
            for chunk in [data.len().max(1), 1, 7] {
                let mut w = LineWindow::new(c.req);
                for piece in data.chunks(chunk) {
                    w.feed(piece);
                }
                assert_eq!(
                    &scan_value(&w.finish()),
                    expect,
                    "scan vector {:?} fed in chunks of {chunk}",
                    c.name
                );
            }
        }
        checked += 1;
    }
    println!("scan vectors: {checked} passed (rust core: positional reads, whole, byte-by-byte, 7-byte chunks)");
}

#[test]
fn scan_vectors_python_reference() {
    let Some(python) = require_tool("python3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = repo_root().join("tests/reference/scan_ref.py");
    let cases = scan_cases(dir.path());
    for c in &cases {
        let (_, out, err) = run(Command::new(&python).arg(&script).args([
            c.path.as_os_str(),
            c.req.start_line.to_string().as_ref(),
            c.end_arg.as_ref(),
            c.req.max_bytes.to_string().as_ref(),
        ]));
        let v: Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{}: {e}: {}", c.name, String::from_utf8_lossy(&err)));
        let got = match v.get("error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(v),
        };
        assert_eq!(got, c.expect, "scan vector {:?} (python reference)", c.name);
    }
    println!("scan vectors: {} passed (python reference)", cases.len());
}

/// A directory whose only programs are the given (name -> binary) links, so a script run with it
/// as PATH uses exactly that awk (or that busybox for everything).
fn tool_dir(links: &[(&str, &Path)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, target) in links {
        std::os::unix::fs::symlink(target, d.path().join(name)).unwrap();
    }
    d
}

fn parse_scan_sh(out: &[u8]) -> Result<Value, String> {
    let nl = out.iter().position(|&b| b == b'\n').expect("header line");
    let header = std::str::from_utf8(&out[..nl]).unwrap();
    let f: Vec<&str> = header.split(' ').collect();
    if f[0] == "ERR" {
        return Err(f[1].to_string());
    }
    assert_eq!(f[0], "OK", "header {header:?}");
    let n: Vec<u64> = f[1..6].iter().map(|x| x.parse().unwrap()).collect();
    let count = (n[1] + 1 - n[0]) as usize;
    let body = &out[nl + 1..];
    let mut lines: Vec<&[u8]> = body.split(|&b| b == b'\n').collect();
    assert_eq!(lines.pop(), Some(&b""[..]), "output ends with a newline");
    assert_eq!(lines.len(), count, "line count matches header {header:?}");
    Ok(json!({
        "lines_hex": lines.iter().map(|l| hex(l)).collect::<Vec<_>>(),
        "start_line": n[0], "end_line": n[1], "total_lines": n[2],
        "total_bytes": n[3], "first_line_bytes": n[4],
    }))
}

#[test]
fn scan_vectors_shell_script_under_every_awk() {
    let dir = tempfile::tempdir().unwrap();
    let cases = scan_cases(dir.path());
    let script = repo_root().join("scripts/scan.sh");
    let mut runs: Vec<(String, tempfile::TempDir, PathBuf)> = Vec::new();
    let (Some(dash), Some(mawk), Some(gawk), Some(busybox)) = (
        require_tool("dash"),
        require_tool("mawk"),
        require_tool("gawk"),
        require_tool("busybox"),
    ) else {
        return;
    };
    runs.push((
        "dash+mawk".into(),
        tool_dir(&[("awk", &mawk)]),
        dash.clone(),
    ));
    runs.push((
        "dash+gawk".into(),
        tool_dir(&[("awk", &gawk)]),
        dash.clone(),
    ));
    let applets = ["sh", "awk", "head", "wc", "dd", "od", "tr"];
    let links: Vec<(&str, &Path)> = applets.iter().map(|a| (*a, busybox.as_path())).collect();
    let bb = tool_dir(&links);
    let bb_sh = bb.path().join("sh");
    runs.push(("busybox sh+awk".into(), bb, bb_sh));
    for (label, tools, shell) in &runs {
        // dash runs find the coreutils after the chosen awk; busybox runs find only busybox.
        let path = if label.starts_with("busybox") {
            tools.path().display().to_string()
        } else {
            format!("{}:/usr/bin:/bin", tools.path().display())
        };
        for c in &cases {
            let (_, out, err) = run(Command::new(shell)
                .arg(&script)
                .arg(&c.path)
                .arg(c.req.start_line.to_string())
                .arg(&c.end_arg)
                .arg(c.req.max_bytes.to_string())
                .env_clear()
                .env("PATH", &path));
            assert!(
                !out.is_empty(),
                "{label} {:?}: no output; stderr: {}",
                c.name,
                String::from_utf8_lossy(&err)
            );
            assert_eq!(
                parse_scan_sh(&out),
                c.expect,
                "scan vector {:?} ({label})",
                c.name
            );
        }
        println!(
            "scan vectors: {} passed (scripts/scan.sh, {label})",
            cases.len()
        );
    }
}

/// Set up one edit case in `dir`; returns the path to edit and the path holding the content.
fn edit_setup(dir: &Path, case: &Value) -> (PathBuf, PathBuf) {
    let target = dir.join("file.txt");
    if !case["file"].is_null() {
        write_entry(&target, &case["file"]);
    }
    if case.get("via_symlink").and_then(Value::as_bool) == Some(true) {
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink("file.txt", &link).unwrap();
        return (link, target);
    }
    (target.clone(), target)
}

/// Run one edit implementation over every case, checking counts, contents, modes, links and
/// that failures leave the file untouched and no temp file behind.
fn check_edit_impl(label: &str, mut edit: impl FnMut(&Path, &Value) -> Value) -> usize {
    let v = load_vectors("edit.json");
    let cases = v["cases"].as_array().unwrap();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (path, target) = edit_setup(dir.path(), c);
        let before = fs::read(&target).ok();
        let got = edit(&path, c);
        if let Some(tok) = c.get("expect_error").and_then(Value::as_str) {
            assert_eq!(
                got["error"],
                json!(tok),
                "edit vector {name:?} ({label}): {got}"
            );
            if let Some(n) = c.get("expect_count") {
                assert_eq!(&got["count"], n, "edit vector {name:?} ({label})");
            }
            assert_eq!(
                fs::read(&target).ok(),
                before,
                "edit vector {name:?} ({label}): file changed"
            );
        } else {
            let e = &c["expect"];
            assert_eq!(
                got,
                json!({"count": e["count"]}),
                "edit vector {name:?} ({label})"
            );
            let content = fs::read_to_string(&target).unwrap();
            assert_eq!(
                content,
                e["content"].as_str().unwrap(),
                "edit vector {name:?} ({label})"
            );
            if let Some(mode) = e.get("mode").and_then(Value::as_str) {
                let m = fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
                assert_eq!(
                    format!("{m:o}"),
                    mode,
                    "edit vector {name:?} ({label}): mode"
                );
            }
            if path != target {
                assert!(fs::symlink_metadata(&path)
                    .unwrap()
                    .file_type()
                    .is_symlink());
            }
        }
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains(".sbxfs-")),
            "edit vector {name:?} ({label}): temp file left: {names:?}"
        );
    }
    cases.len()
}

fn edit_args(c: &Value) -> (String, String, bool) {
    (
        c["old"].as_str().unwrap().to_string(),
        c["new"].as_str().unwrap().to_string(),
        c["replace_all"].as_bool().unwrap(),
    )
}

#[test]
fn edit_vectors_rust_core() {
    let n = check_edit_impl("rust", |path, c| {
        let (old, new, all) = edit_args(c);
        match edit_file(path, &old, &new, all) {
            Ok(count) => json!({ "count": count }),
            Err(sbxfs::search::SearchError::MultipleOccurrences(n)) => {
                json!({"error": "multiple_occurrences", "count": n})
            }
            Err(e) => json!({ "error": e.token() }),
        }
    });
    println!("edit vectors: {n} passed (rust core)");
}

#[test]
fn edit_vectors_python_script() {
    let Some(python) = require_tool("python3") else {
        return;
    };
    let script = repo_root().join("scripts/edit.py");
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let n = check_edit_impl("scripts/edit.py", |path, c| {
        let (old, new, all) = edit_args(c);
        let flag = if all { "1" } else { "0" };
        let (code, out, err) = run(Command::new(&python).arg(&script).args([
            b64(path.as_os_str().as_encoded_bytes()),
            b64(old.as_bytes()),
            b64(new.as_bytes()),
            b64(flag.as_bytes()),
        ]));
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            code,
            0,
            "edit.py failed: {out} {}",
            String::from_utf8_lossy(&err)
        );
        let line = out.strip_prefix("__RESULT__").expect("one __RESULT__ line");
        assert_eq!(out.lines().count(), 1, "only one output line: {out:?}");
        let mut v: Value = serde_json::from_str(line.trim_end()).unwrap();
        v.as_object_mut().unwrap().remove("message");
        v
    });
    println!("edit vectors: {n} passed (scripts/edit.py)");
}

#[test]
fn edit_vectors_python_reference() {
    let Some(python) = require_tool("python3") else {
        return;
    };
    let script = repo_root().join("tests/reference/edit_ref.py");
    let v = load_vectors("edit.json");
    let mut checked = 0;
    for c in v["cases"].as_array().unwrap() {
        // The reference works on content only: skip the file-system cases.
        let file = &c["file"];
        if file.is_null() || file.get("dir").is_some() {
            continue;
        }
        let req = json!({
            "content_hex": hex(&file_bytes(file)),
            "old": c["old"], "new": c["new"], "replace_all": c["replace_all"],
        });
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(req.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        let name = c["name"].as_str().unwrap();
        if let Some(tok) = c.get("expect_error").and_then(Value::as_str) {
            assert_eq!(got["error"], json!(tok), "edit vector {name:?} (reference)");
        } else {
            assert_eq!(
                got["count"], c["expect"]["count"],
                "edit vector {name:?} (reference)"
            );
            assert_eq!(
                got["content"], c["expect"]["content"],
                "edit vector {name:?} (reference)"
            );
        }
        checked += 1;
    }
    println!(
        "edit vectors: {checked} passed (python reference; file-system cases are the scripts' job)"
    );
}

// The same vectors over `MemoryRemote`: its scan feeds the core's `LineWindow` and its edit
// uses the core's `replace_in`, so they must answer what the core answers on disk.

use sbxfs::remote::memory::MemoryRemote;
use sbxfs::remote::{Remote, RemoteError, RemotePath};

fn mem_path(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

/// The vector token for a `Remote` error: the core's own for a query error; a missing file is
/// `not_found`. A directory: the `Remote` answers EISDIR (as the agent does), the core's
/// `scan_file` says `is_a_directory` and its `edit_file` `read_failed`.
fn mem_token(e: RemoteError, dir_token: &str) -> String {
    match e {
        RemoteError::Query(q) => q.token().to_string(),
        RemoteError::NotFound(_) => "not_found".into(),
        RemoteError::IsDir(_) => dir_token.into(),
        other => other.token().to_string(),
    }
}

#[tokio::test]
async fn scan_vectors_memory_remote() {
    let dir = tempfile::tempdir().unwrap();
    let cases = scan_cases(dir.path());
    let m = MemoryRemote::new();
    for c in &cases {
        let name = c.path.file_name().unwrap().to_str().unwrap();
        if let Ok(data) = fs::read(&c.path) {
            m.sandbox().write(name, &data).unwrap();
        }
        let got = m
            .scan(&mem_path(name), c.req)
            .await
            .map(|r| scan_value(&r))
            .map_err(|e| mem_token(e, "is_a_directory"));
        assert_eq!(got, c.expect, "scan vector {:?} (memory remote)", c.name);
    }
}

#[tokio::test]
async fn edit_vectors_memory_remote() {
    let v = load_vectors("edit.json");
    for c in v["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let m = MemoryRemote::new();
        let sb = m.sandbox();
        let spec = &c["file"];
        if spec.get("dir").and_then(Value::as_bool) == Some(true) {
            sb.mkdir("file.txt").unwrap();
        } else if !spec.is_null() {
            sb.write("file.txt", &file_bytes(spec)).unwrap();
            if let Some(mode) = spec.get("mode").and_then(Value::as_str) {
                sb.chmod("file.txt", u32::from_str_radix(mode, 8).unwrap())
                    .unwrap();
            }
        }
        let via_link = c.get("via_symlink").and_then(Value::as_bool) == Some(true);
        if via_link {
            sb.symlink("file.txt", "link.txt").unwrap();
        }
        let before = sb.read("file.txt").ok();
        let (old, new, all) = edit_args(c);
        let path = mem_path(if via_link { "link.txt" } else { "file.txt" });
        let got = match m.edit(&path, &old, &new, all).await {
            Ok(count) => json!({ "count": count }),
            Err(RemoteError::Query(sbxfs::search::SearchError::MultipleOccurrences(n))) => {
                json!({"error": "multiple_occurrences", "count": n})
            }
            Err(e) => json!({ "error": mem_token(e, "read_failed") }),
        };
        if let Some(tok) = c.get("expect_error").and_then(Value::as_str) {
            assert_eq!(got["error"], json!(tok), "edit vector {name:?} (memory)");
            if let Some(n) = c.get("expect_count") {
                assert_eq!(&got["count"], n, "edit vector {name:?} (memory)");
            }
            assert_eq!(sb.read("file.txt").ok(), before, "{name:?}: file changed");
        } else {
            let e = &c["expect"];
            assert_eq!(got, json!({"count": e["count"]}), "edit vector {name:?}");
            assert_eq!(
                sb.read("file.txt").unwrap(),
                e["content"].as_str().unwrap().as_bytes(),
                "edit vector {name:?} (memory)"
            );
            if let Some(mode) = e.get("mode").and_then(Value::as_str) {
                let got_mode = sb.metadata("file.txt").unwrap().mode;
                assert_eq!(format!("{got_mode:o}"), mode, "edit vector {name:?}: mode");
            }
            if via_link {
                let kind = sb.metadata("link.txt").unwrap().kind;
                assert_eq!(kind, sbxfs::remote::FileKind::Symlink, "{name:?}");
            }
        }
        let expected_names = usize::from(!spec.is_null()) + usize::from(via_link);
        assert_eq!(
            sb.list("").unwrap().len(),
            expected_names,
            "edit vector {name:?} (memory): nothing left beside the file"
        );
    }
}
