//! `edit` through exec (`sbxfs::remote::exec::edit`): `scripts/edit.py` run by python3 in the
//! "sandbox" (a local `sh` with a chosen PATH), and the download → replace → atomic upload
//! fallback when python3 is missing or cannot write — both against the shared edit vectors,
//! with the same counts, errors and bytes.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use common::*;
use sbxfs::remote::exec::{edit::edit, CommandRunner};
use sbxfs::remote::RemoteError;
use sbxfs::search::SearchError;

/// Tools the fallback's scripts use (python3 left out on purpose).
const TOOLS: &[&str] = &[
    "sh", "base64", "readlink", "stat", "mktemp", "mv", "chmod", "chown", "rm", "tr", "sync",
    "cat", "env",
];

/// A PATH directory holding only [`TOOLS`] (links to this machine's), so python3 is absent.
fn no_python_path() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for t in TOOLS {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(t))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{t} not installed"));
        std::os::unix::fs::symlink(real, d.path().join(t)).unwrap();
    }
    d
}

fn runner(path_var: &str, prefix: &[&str]) -> CommandRunner {
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.extend([
        "/usr/bin/env".into(),
        "-i".into(),
        format!("PATH={path_var}"),
        "/bin/sh".into(),
    ]);
    CommandRunner::new(argv).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An answer as the vectors spell it.
fn as_value(r: Result<usize, RemoteError>) -> Value {
    match r {
        Ok(n) => json!({ "count": n }),
        Err(RemoteError::Query(SearchError::MultipleOccurrences(n))) => {
            json!({"error": "multiple_occurrences", "count": n})
        }
        Err(RemoteError::Query(e)) => json!({ "error": e.token() }),
        Err(e) => panic!("not a query error: {e}"),
    }
}

/// Every edit vector through `runner`: counts, errors, bytes, modes, links, no temp left.
fn check_vectors(label: &str, runner: &CommandRunner) {
    let rt = rt();
    let v = load_vectors("edit.json");
    let cases = v["cases"].as_array().unwrap();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("file.txt");
        if !c["file"].is_null() {
            write_entry(&target, &c["file"]);
        }
        let path = if c.get("via_symlink").and_then(Value::as_bool) == Some(true) {
            let link = dir.path().join("link.txt");
            std::os::unix::fs::symlink("file.txt", &link).unwrap();
            link
        } else {
            target.clone()
        };
        let before = fs::read(&target).ok();
        let got = as_value(rt.block_on(edit(
            runner,
            path.as_os_str().as_encoded_bytes(),
            c["old"].as_str().unwrap(),
            c["new"].as_str().unwrap(),
            c["replace_all"].as_bool().unwrap(),
        )));
        if let Some(tok) = c.get("expect_error").and_then(Value::as_str) {
            assert_eq!(got["error"], json!(tok), "{name:?} ({label}): {got}");
            if let Some(n) = c.get("expect_count") {
                assert_eq!(&got["count"], n, "{name:?} ({label})");
            }
            assert_eq!(
                fs::read(&target).ok(),
                before,
                "{name:?} ({label}): changed"
            );
        } else {
            let e = &c["expect"];
            assert_eq!(got, json!({"count": e["count"]}), "{name:?} ({label})");
            assert_eq!(
                fs::read_to_string(&target).unwrap(),
                e["content"].as_str().unwrap(),
                "{name:?} ({label})"
            );
            if let Some(mode) = e.get("mode").and_then(Value::as_str) {
                let m = fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
                assert_eq!(format!("{m:o}"), mode, "{name:?} ({label}): mode");
            }
            if path != target {
                assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
            }
        }
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains(".sbxfs-")),
            "{name:?} ({label}): temp file left: {names:?}"
        );
    }
    println!("edit vectors: {} passed ({label})", cases.len());
}

#[test]
fn edit_vectors_through_exec_with_python3() {
    if require_tool("python3").is_none() {
        return;
    }
    assert!(Path::new("/usr/bin/python3").exists());
    check_vectors("edit.py over sh", &runner("/usr/bin:/bin", &[]));
}

#[test]
fn edit_vectors_through_exec_without_python3_take_the_fallback() {
    let tools = no_python_path();
    let r = runner(&tools.path().display().to_string(), &[]);
    // python3 really is missing there.
    let out = rt()
        .block_on(sbxfs::remote::exec::Runner::run(
            &r,
            "command -v python3 || echo none",
            &Default::default(),
        ))
        .unwrap();
    assert_eq!(out.stdout, b"none\n");
    check_vectors("fallback over sh without python3", &r);
}

/// Names a shell would mangle if they were ever spliced into a script.
fn awkward_names() -> Vec<Vec<u8>> {
    vec![
        b"with space.txt".to_vec(),
        b"new\nline.txt".to_vec(),
        b"it's \"quoted\".txt".to_vec(),
        b"$(touch pwned).txt".to_vec(),
        b"`touch pwned`.txt".to_vec(),
        b"-leading-dash.txt".to_vec(),
        b"non-utf8-\xff\xfe.txt".to_vec(),
        b"trailing-newline\n".to_vec(),
    ]
}

fn check_awkward(label: &str, r: &CommandRunner) {
    use std::os::unix::ffi::OsStrExt;
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    for name in awkward_names() {
        let p = dir.path().join(std::ffi::OsStr::from_bytes(&name));
        fs::write(&p, "alpha\r\nbeta\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        let n = rt
            .block_on(edit(r, p.as_os_str().as_bytes(), "beta", "gamma", false))
            .unwrap_or_else(|e| panic!("{label} {name:?}: {e}"));
        assert_eq!(n, 1, "{label} {name:?}");
        assert_eq!(fs::read(&p).unwrap(), b"alpha\ngamma\n", "{label} {name:?}");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
    }
    let mut names: Vec<Vec<u8>> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    names.sort();
    let mut want = awkward_names();
    want.sort();
    assert_eq!(names, want, "{label}: nothing made, nothing left behind");
    assert!(!Path::new("pwned").exists() && !dir.path().join("pwned").exists());
}

#[test]
fn awkward_names_edit_the_same_with_and_without_python3() {
    check_awkward("edit.py", &runner("/usr/bin:/bin", &[]));
    let tools = no_python_path();
    check_awkward(
        "fallback",
        &runner(&tools.path().display().to_string(), &[]),
    );
}

#[test]
fn an_argument_over_the_single_argument_limit_is_refused_before_anything_runs() {
    // A runner that cannot start: had anything run, the error would be a transport one.
    let r = CommandRunner::new(vec!["/nonexistent/sbxfs-no-shell".into()]).unwrap();
    let big = "x".repeat(100 * 1024);
    for (old, new) in [(big.as_str(), "y"), ("y", big.as_str())] {
        let e = rt()
            .block_on(edit(&r, b"/tmp/whatever", old, new, false))
            .unwrap_err();
        assert!(
            matches!(e, RemoteError::Query(SearchError::LimitExceeded(_))),
            "{e}"
        );
        assert!(e.to_string().contains("split the edit"), "{e}");
    }
    // Just under the limit is not refused for its size: it runs (and here fails to start).
    let fits = "x".repeat(90 * 1024);
    let e = rt()
        .block_on(edit(&r, b"/tmp/whatever", &fits, "y", false))
        .unwrap_err();
    assert!(matches!(e, RemoteError::Transport(_)), "{e}");
}

/// A directory the sandbox's user cannot write: edit.py reports write_failed, the fallback
/// cannot write either; the answer is write_failed and the target is untouched.
#[test]
fn a_read_only_directory_is_write_failed_and_leaves_the_target_untouched() {
    let as_nobody: Vec<String> = if is_root() {
        let Some(setpriv) = setpriv_as_root() else {
            return;
        };
        vec![
            setpriv.display().to_string(),
            "--reuid=65534".into(),
            "--regid=65534".into(),
            "--clear-groups".into(),
        ]
    } else {
        Vec::new()
    };
    let prefix: Vec<&str> = as_nobody.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let ro = dir.path().join("ro");
    fs::create_dir(&ro).unwrap();
    let file = ro.join("f.txt");
    fs::write(&file, "one two\n").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    let tools = no_python_path();
    fs::set_permissions(tools.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for (label, path_var) in [
        ("edit.py", "/usr/bin:/bin".to_string()),
        ("fallback", tools.path().display().to_string()),
    ] {
        let r = runner(&path_var, &prefix);
        let e = rt()
            .block_on(edit(
                &r,
                file.as_os_str().as_encoded_bytes(),
                "two",
                "2",
                false,
            ))
            .unwrap_err();
        assert!(
            matches!(e, RemoteError::Query(SearchError::WriteFailed(..))),
            "{label}: {e}"
        );
        assert_eq!(fs::read(&file).unwrap(), b"one two\n", "{label}");
        let left: Vec<PathBuf> = fs::read_dir(&ro)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left, vec![file.clone()], "{label}");
    }
}
