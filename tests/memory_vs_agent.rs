//! Differential test of the two backends: random sequences of `Remote` operations applied both
//! to a real agent (over a real directory) and to `MemoryRemote`; after every step the two must
//! agree on the outcome (success, or the same error kind) and on the whole tree (names, kinds,
//! sizes, modes, link counts, symlink targets, file contents, attributes). Inode numbers, times
//! and version strings differ by nature and are not compared. Shrunk failures are kept by
//! proptest in `memory_vs_agent.proptest-regressions`.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use proptest::prelude::*;

use common::AgentProcess;
use sbxfs::remote::memory::MemoryRemote;
use sbxfs::remote::*;

/// A small name space, so operations collide often: a file may meet a directory, a link, itself.
const PATHS: [&str; 9] = ["a", "b", "d", "d/a", "d/b", "d/e", "d/e/a", "l", "d/l"];
const TARGETS: [&str; 5] = ["a", "d", "../a", "d/e", "nowhere"];
const XATTRS: [&str; 2] = ["user.k", "user.other"];

#[derive(Clone, Debug)]
enum Step {
    Create(usize, u32),
    Mkdir(usize, u32),
    Unlink(usize),
    Rmdir(usize),
    Rename(usize, usize, u8),
    Link(usize, usize),
    Symlink(usize, usize),
    Commit(usize, Vec<u8>),
    Patch(usize, u64, u64, u64, Vec<u8>),
    Chmod(usize, u32),
    Truncate(usize, u64),
    Read(usize, u64, u32),
    SetXattr(usize, usize, Vec<u8>, u8),
    RemoveXattr(usize, usize),
    Fallocate(usize, u64, u64, bool),
    CopyRange(usize, u64, usize, u64, u64),
}

fn step() -> impl Strategy<Value = Step> {
    let p = || 0..PATHS.len();
    let data = || proptest::collection::vec(any::<u8>(), 0..20);
    // No set-user-ID modes yet: the agent's commit chmods its temp file before chowning it,
    // and the chown clears the bit (memory keeps it, as the trait says a commit keeps the mode).
    let mode = || prop_oneof![Just(0o644u32), Just(0o600), Just(0o755), Just(0o700)];
    prop_oneof![
        (p(), mode()).prop_map(|(a, m)| Step::Create(a, m)),
        (p(), mode()).prop_map(|(a, m)| Step::Mkdir(a, m)),
        p().prop_map(Step::Unlink),
        p().prop_map(Step::Rmdir),
        (p(), p(), 0u8..3).prop_map(|(a, b, m)| Step::Rename(a, b, m)),
        (p(), p()).prop_map(|(a, b)| Step::Link(a, b)),
        (p(), 0..TARGETS.len()).prop_map(|(a, t)| Step::Symlink(a, t)),
        (p(), data()).prop_map(|(a, d)| Step::Commit(a, d)),
        (p(), 0u64..30, 0u64..30, 0u64..30, data())
            .prop_map(|(a, cut, len, off, d)| Step::Patch(a, cut, len, off, d)),
        (p(), mode()).prop_map(|(a, m)| Step::Chmod(a, m)),
        (p(), 0u64..40).prop_map(|(a, n)| Step::Truncate(a, n)),
        (p(), 0u64..30, 0u32..30).prop_map(|(a, o, n)| Step::Read(a, o, n)),
        (p(), 0..XATTRS.len(), data(), 0u8..3).prop_map(|(a, k, v, f)| Step::SetXattr(a, k, v, f)),
        (p(), 0..XATTRS.len()).prop_map(|(a, k)| Step::RemoveXattr(a, k)),
        (p(), 0u64..30, 1u64..30, any::<bool>())
            .prop_map(|(a, o, n, k)| Step::Fallocate(a, o, n, k)),
        (p(), 0u64..20, p(), 0u64..20, 0u64..20)
            .prop_map(|(a, so, b, d, n)| Step::CopyRange(a, so, b, d, n)),
    ]
}

fn rp(i: usize) -> RemotePath {
    RemotePath::new(PATHS[i].as_bytes().to_vec()).unwrap()
}

/// What a step answered, in a form both backends can give: the error kind, or what matters of
/// the success.
async fn apply(r: &dyn Remote, s: &Step) -> std::result::Result<String, &'static str> {
    let t = |e: RemoteError| e.token();
    let shape = |a: Attr| format!("{:?} {} {:o} {}", a.kind, a.size, a.mode, a.nlink);
    Ok(match s {
        Step::Create(a, m) => shape(r.create(&rp(*a), *m).await.map_err(t)?),
        Step::Mkdir(a, m) => {
            let a = r.mkdir(&rp(*a), *m).await.map_err(t)?;
            format!("{:?} {:o} {}", a.kind, a.mode, a.nlink)
        }
        Step::Unlink(a) => format!("{:?}", r.unlink(&rp(*a)).await.map_err(t)?),
        Step::Rmdir(a) => format!("{:?}", r.rmdir(&rp(*a)).await.map_err(t)?),
        Step::Rename(a, b, m) => {
            let mode = [
                RenameMode::Replace,
                RenameMode::NoReplace,
                RenameMode::Exchange,
            ][*m as usize];
            format!("{:?}", r.rename(&rp(*a), &rp(*b), mode).await.map_err(t)?)
        }
        Step::Link(a, b) => shape(r.link(&rp(*a), &rp(*b)).await.map_err(t)?),
        Step::Symlink(a, target) => shape(
            r.symlink(&rp(*a), TARGETS[*target].as_bytes())
                .await
                .map_err(t)?,
        ),
        Step::Commit(a, d) => {
            let body = CommitContent::Whole(Box::new(std::io::Cursor::new(d.clone())));
            shape(
                r.commit(&rp(*a), body, CommitOptions::default())
                    .await
                    .map_err(t)?,
            )
        }
        Step::Patch(a, cut, len, off, d) => {
            let base = r.stat(&rp(*a)).await.ok().map(|a| a.version);
            let body = CommitContent::Patch {
                cut: *cut,
                new_len: *len,
                ranges: vec![(*off, Bytes::from(d.clone()))],
            };
            let opts = CommitOptions {
                base,
                ..Default::default()
            };
            shape(r.commit(&rp(*a), body, opts).await.map_err(t)?)
        }
        Step::Chmod(a, m) => {
            let set = SetAttr {
                mode: Some(*m),
                ..Default::default()
            };
            shape(r.setattr(&rp(*a), set).await.map_err(t)?)
        }
        Step::Truncate(a, n) => {
            let set = SetAttr {
                size: Some(*n),
                ..Default::default()
            };
            shape(r.setattr(&rp(*a), set).await.map_err(t)?)
        }
        Step::Read(a, o, n) => {
            let got = r.read(&rp(*a), *o, *n).await.map_err(t)?;
            format!("{:?}", got.data)
        }
        Step::SetXattr(a, k, v, f) => {
            let flags = XattrFlags {
                create: *f == 1,
                replace: *f == 2,
            };
            let name = XATTRS[*k].as_bytes();
            format!(
                "{:?}",
                r.setxattr(&rp(*a), name, v, flags).await.map_err(t)?
            )
        }
        Step::RemoveXattr(a, k) => {
            let name = XATTRS[*k].as_bytes();
            format!("{:?}", r.removexattr(&rp(*a), name).await.map_err(t)?)
        }
        Step::Fallocate(a, o, n, keep) => {
            shape(r.fallocate(&rp(*a), *o, *n, *keep).await.map_err(t)?)
        }
        Step::CopyRange(a, so, b, d, n) => {
            let (copied, attr) = r
                .copy_range(&rp(*a), *so, &rp(*b), *d, *n, None)
                .await
                .map_err(t)?;
            format!("{copied} {}", shape(attr))
        }
    })
}

/// The whole tree as both backends can describe it.
async fn snapshot(r: &dyn Remote) -> Vec<String> {
    let entries: Vec<TreeEntry> = r
        .tree(&RemotePath::root())
        .await
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
        .await;
    let mut out = Vec::new();
    for e in entries {
        let p = RemotePath::new(e.path.0.clone()).unwrap();
        let a = &e.attr;
        let content = match a.kind {
            FileKind::File => format!("{:?}", r.read(&p, 0, 1 << 16).await.unwrap().data),
            _ => String::new(),
        };
        // A directory's size is the filesystem's business.
        let size = if a.kind == FileKind::Dir { 0 } else { a.size };
        // Their order is the filesystem's business too (ext4 lists them as it stores them).
        let xattrs = if a.kind == FileKind::Symlink {
            Vec::new()
        } else {
            let mut names = r.listxattr(&p).await.unwrap();
            names.sort();
            names
        };
        out.push(format!(
            "{} {:?} {size} {:o} {} {:?} {content} {xattrs:?}",
            p.display(),
            a.kind,
            a.mode,
            a.nlink,
            a.symlink_target,
        ));
    }
    out
}

struct Agent {
    _process: AgentProcess,
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    remote: Arc<dyn Remote>,
}

fn empty_the_workspace(root: &std::path::Path) {
    for e in std::fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

proptest! {
    // 48 sequences by default (an agent round trip per step and per snapshot); more with
    // PROPTEST_CASES=N.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(48),
        // Failures kept in tests/memory_vs_agent.proptest-regressions, beside this file.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_answers_like_the_agent(steps in proptest::collection::vec(step(), 1..25)) {
        thread_local! {
            static AGENT: std::cell::RefCell<Option<Agent>> = const { std::cell::RefCell::new(None) };
            // One runtime for every case, as the agent's client lives across cases: its pooled
            // connections' tasks run on the runtime that made them, and one dropped with its
            // case leaves the pool handing out dead connections ("connection closed before
            // message completed").
            static RT: tokio::runtime::Runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        }
        RT.with(|rt| AGENT.with(|cell| {
            let mut cell = cell.borrow_mut();
            let agent = cell.get_or_insert_with(|| {
                let dir = tempfile::tempdir().unwrap();
                let root = dir.path().join("ws");
                std::fs::create_dir(&root).unwrap();
                let process = AgentProcess::start(&root);
                // Behind the retry layer, as every mount has it: a pooled connection the agent
                // closed as a request went out fails that request's transport, and an idempotent
                // one (the snapshot's tree walk) is asked again. Changes are never retried, so a
                // step's answer is still the agent's first.
                let remote: Arc<dyn Remote> = Arc::new(sbxfs::remote::retry::retrying(Arc::new(
                    process.client(),
                )));
                Agent { _process: process, _dir: dir, root, remote }
            });
            empty_the_workspace(&agent.root);
            let memory = MemoryRemote::new();
            rt.block_on(async {
                for (i, s) in steps.iter().enumerate() {
                    let want = apply(&*agent.remote, s).await;
                    let got = apply(&memory, s).await;
                    prop_assert_eq!(&got, &want, "step {} {:?}", i, s);
                    let (want, got) = (snapshot(&*agent.remote).await, snapshot(&memory).await);
                    prop_assert_eq!(got, want, "tree after step {} {:?}", i, s);
                }
                Ok(())
            })
        }))?;
    }
}
