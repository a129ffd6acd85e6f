//! The glob, grep and fuzzy vectors, run against the Rust core on disk and over `MemoryRemote`. (Their expected results were
//! checked against Node's fs.globSync, ripgrep and fzf; tests/peers.rs re-checks those peers.)

use crate::common;

use serde_json::{json, Value};

use common::*;
use sbxfs::search::fuzzy::fuzzy;
use sbxfs::search::glob::glob;
use sbxfs::search::grep::{grep, GrepOptions};

use sbxfs::search::walk::WalkOptions;

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn glob_vectors_rust_core() {
    let v = load_vectors("glob.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let cases = v["cases"].as_array().unwrap();
    let mut differs = 0;
    for c in cases {
        let pattern = c["pattern"].as_str().unwrap();
        let got = glob(dir.path(), pattern).map_err(|e| e.token().to_string());
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(strings(&c["expect"])),
        };
        assert_eq!(got, want, "glob vector {pattern:?}");
        differs += usize::from(c.get("node_differs").is_some());
    }
    println!(
        "glob vectors: {} passed (rust core; {differs} differ from Node on purpose)",
        cases.len()
    );
}

/// Run the core grep as the vectors record it: the matches then the summary's truncated flag.
fn grep_value(root: &std::path::Path, o: &Value) -> Result<Value, String> {
    let mut matches = Vec::new();
    let summary = grep(root, &grep_options(o), &mut |m| {
        matches.push(serde_json::to_value(&m).unwrap());
        true
    })
    .map_err(|e| e.token().to_string())?;
    Ok(json!({"matches": matches, "truncated": summary.truncated}))
}

#[test]
fn grep_vectors_rust_core() {
    let v = load_vectors("grep.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let cases = v["cases"].as_array().unwrap();
    for c in cases {
        let root = dir
            .path()
            .join(c["options"]["path"].as_str().unwrap_or("."));
        let got = grep_value(&root, &c["options"]);
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(c["expect"].clone()),
        };
        assert_eq!(got, want, "grep vector {:?}", c["name"]);
    }
    println!("grep vectors: {} passed (rust core)", cases.len());
}

#[test]
fn grep_stops_when_the_consumer_stops() {
    let v = load_vectors("grep.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let mut seen = 0;
    let opts = GrepOptions {
        pattern: "TODO".into(),
        ..Default::default()
    };
    let summary = grep(dir.path(), &opts, &mut |_| {
        seen += 1;
        seen < 2
    })
    .unwrap();
    assert_eq!(seen, 2);
    assert!(summary.truncated);
}

#[test]
fn fuzzy_vectors_rust_core() {
    let v = load_vectors("fuzzy.json");
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &v["tree"]);
    let cases = v["cases"].as_array().unwrap();
    for c in cases {
        let walk = WalkOptions {
            hidden: c["hidden"].as_bool().unwrap_or(false),
            no_ignore: c["no_ignore"].as_bool().unwrap_or(false),
            ..Default::default()
        };
        let limit = c["limit"].as_u64().map(|n| n as usize);
        let got = fuzzy(dir.path(), c["query"].as_str().unwrap(), &walk, limit)
            .map(|ms| serde_json::to_value(ms).unwrap())
            .map_err(|e| e.token().to_string());
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(c["expect"].clone()),
        };
        assert_eq!(got, want, "fuzzy vector {:?}", c["query"]);
    }
    println!("fuzzy vectors: {} passed (rust core)", cases.len());
}

// The same vectors over `MemoryRemote`: its queries walk the in-memory tree with the core's
// `TreeSource` walk, so they must answer exactly what the core answers on a real directory.

use futures_util::StreamExt;
use sbxfs::remote::memory::MemoryRemote;
use sbxfs::remote::{FuzzyRequest, GrepEvent, Remote, RemoteError, RemotePath};

/// The vector tree, written into a fresh in-memory sandbox.
fn memory_tree(tree: &Value) -> MemoryRemote {
    let m = MemoryRemote::new();
    let sb = m.sandbox();
    for (rel, spec) in tree.as_object().expect("tree is an object") {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            sb.mkdir_all(parent).unwrap();
        }
        if spec.get("dir").and_then(Value::as_bool) == Some(true) {
            sb.mkdir_all(rel).unwrap();
        } else if let Some(target) = spec.get("symlink").and_then(Value::as_str) {
            sb.symlink(target, rel).unwrap();
        } else {
            sb.write(rel, &file_bytes(spec)).unwrap();
            if let Some(mode) = spec.get("mode").and_then(Value::as_str) {
                sb.chmod(rel, u32::from_str_radix(mode, 8).unwrap())
                    .unwrap();
            }
        }
    }
    m
}

fn token(e: RemoteError) -> String {
    match e {
        RemoteError::Query(q) => q.token().to_string(),
        RemoteError::NotFound(_) => "not_found".into(),
        other => other.token().to_string(),
    }
}

fn vpath(p: Option<&str>) -> RemotePath {
    match p {
        None | Some(".") => RemotePath::root(),
        Some(p) => RemotePath::new(p.as_bytes().to_vec()).unwrap(),
    }
}

#[tokio::test]
async fn glob_vectors_memory_remote() {
    let v = load_vectors("glob.json");
    let m = memory_tree(&v["tree"]);
    for c in v["cases"].as_array().unwrap() {
        let pattern = c["pattern"].as_str().unwrap();
        let got = m.glob(&RemotePath::root(), pattern).await.map_err(token);
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(strings(&c["expect"])),
        };
        assert_eq!(got, want, "glob vector {pattern:?}");
    }
}

#[tokio::test]
async fn grep_vectors_memory_remote() {
    let v = load_vectors("grep.json");
    let m = memory_tree(&v["tree"]);
    for c in v["cases"].as_array().unwrap() {
        let o = &c["options"];
        let got = async {
            let mut s = m.grep(&vpath(o["path"].as_str()), grep_options(o)).await?;
            let mut matches = Vec::new();
            while let Some(ev) = s.next().await {
                match ev? {
                    GrepEvent::Match(m) => matches.push(serde_json::to_value(&m).unwrap()),
                    GrepEvent::Summary { truncated, .. } => {
                        return Ok(json!({"matches": matches, "truncated": truncated}))
                    }
                    GrepEvent::Printed(_) => panic!("printed output was not asked for"),
                }
            }
            panic!("the grep stream ended without a summary")
        }
        .await
        .map_err(token);
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(c["expect"].clone()),
        };
        assert_eq!(got, want, "grep vector {:?}", c["name"]);
    }
}

#[tokio::test]
async fn fuzzy_vectors_memory_remote() {
    let v = load_vectors("fuzzy.json");
    let m = memory_tree(&v["tree"]);
    for c in v["cases"].as_array().unwrap() {
        let req = FuzzyRequest {
            query: c["query"].as_str().unwrap().to_string(),
            limit: c["limit"].as_u64().map(|n| n as usize),
            walk: WalkOptions {
                hidden: c["hidden"].as_bool().unwrap_or(false),
                no_ignore: c["no_ignore"].as_bool().unwrap_or(false),
                ..Default::default()
            },
        };
        let got = m
            .fuzzy(&RemotePath::root(), req)
            .await
            .map(|ms| serde_json::to_value(ms).unwrap())
            .map_err(token);
        let want = match c.get("expect_error").and_then(Value::as_str) {
            Some(t) => Err(t.to_string()),
            None => Ok(c["expect"].clone()),
        };
        assert_eq!(got, want, "fuzzy vector {:?}", c["query"]);
    }
}
