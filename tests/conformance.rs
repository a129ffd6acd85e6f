//! The `Remote` conformance suite: every backend must pass every check. Each check gets a fresh
//! backend over an empty workspace directory it can also touch directly (as a process in the
//! sandbox would). Backends: a real `sbxfs agent` process on loopback, through its HTTP client.

mod common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;

use common::*;
use sbxfs::remote::*;
use sbxfs::search::grep::GrepOptions;
use sbxfs::search::scan::ScanRequest;
use sbxfs::search::SearchError;

struct Backend {
    remote: Arc<dyn Remote>,
    root: PathBuf,
    _keep: Box<dyn std::any::Any + Send>,
}

fn agent_backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    Backend {
        remote: Arc::new(agent.client()),
        root,
        _keep: Box::new((agent, dir)),
    }
}

fn rp(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

fn whole(data: Vec<u8>) -> CommitContent {
    CommitContent::Whole(Box::new(std::io::Cursor::new(data)))
}

async fn stat_list_and_tree(b: &Backend) {
    let r = &b.remote;
    fs::create_dir_all(b.root.join("src/deep")).unwrap();
    fs::write(b.root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(b.root.join("src/deep/x.txt"), "x").unwrap();
    fs::write(b.root.join("README"), "hi").unwrap();
    std::os::unix::fs::symlink("src/main.rs", b.root.join("link")).unwrap();

    let a = r.stat(&rp("src/main.rs")).await.unwrap();
    assert_eq!((a.kind, a.size), (FileKind::File, 13));
    let meta = fs::metadata(b.root.join("src/main.rs")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(a.ino, meta.ino(), "the sandbox's own inode number");
    assert_eq!(a.mtime_ns, meta.mtime() * 1_000_000_000 + meta.mtime_nsec());
    assert_eq!(a.mode, meta.mode() & 0o7777);

    let l = r.stat(&rp("link")).await.unwrap();
    assert_eq!(
        l.kind,
        FileKind::Symlink,
        "stat does not follow the final symlink"
    );
    assert_eq!(l.symlink_target, Some(WireBytes(b"src/main.rs".to_vec())));
    assert_eq!(
        r.stat(&RemotePath::root()).await.unwrap().kind,
        FileKind::Dir
    );
    assert!(matches!(
        r.stat(&rp("missing")).await,
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        r.stat(&rp("README/x")).await,
        Err(RemoteError::NotDir(_))
    ));

    let names: Vec<Vec<u8>> = r
        .list(&RemotePath::root())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.0)
        .collect();
    assert_eq!(
        names,
        vec![b"README".to_vec(), b"link".to_vec(), b"src".to_vec()]
    );
    let src = r.list(&rp("src")).await.unwrap();
    assert_eq!(src[0].attr.kind, FileKind::Dir);
    assert_eq!(src[1].attr.size, 13);
    assert!(matches!(
        r.list(&rp("README")).await,
        Err(RemoteError::NotDir(_))
    ));
    assert!(matches!(
        r.list(&rp("nope")).await,
        Err(RemoteError::NotFound(_))
    ));

    let tree: Vec<Vec<u8>> = r
        .tree(&RemotePath::root())
        .await
        .unwrap()
        .map(|e| e.unwrap().path.0)
        .collect()
        .await;
    let tree: Vec<String> = tree
        .into_iter()
        .map(|p| String::from_utf8(p).unwrap())
        .collect();
    assert_eq!(
        tree,
        [
            "README",
            "link",
            "src",
            "src/deep",
            "src/main.rs",
            "src/deep/x.txt"
        ]
    );
    assert!(matches!(
        r.tree(&rp("nope")).await,
        Err(RemoteError::NotFound(_))
    ));
}

async fn ranged_reads_carry_the_version(b: &Backend) {
    let r = &b.remote;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(b.root.join("data.bin"), &data).unwrap();
    let v = r.stat(&rp("data.bin")).await.unwrap().version;
    let got = r.read(&rp("data.bin"), 100_000, 70_000).await.unwrap();
    assert_eq!(&got.data[..], &data[100_000..170_000]);
    assert_eq!(got.version, v);
    let tail = r.read(&rp("data.bin"), 299_990, 100).await.unwrap();
    assert_eq!(tail.data.len(), 10);
    assert!(r
        .read(&rp("data.bin"), 400_000, 10)
        .await
        .unwrap()
        .data
        .is_empty());
    fs::create_dir(b.root.join("d")).unwrap();
    assert!(matches!(
        r.read(&rp("d"), 0, 10).await,
        Err(RemoteError::IsDir(_))
    ));
    assert!(matches!(
        r.read(&rp("gone"), 0, 10).await,
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        r.read(&rp("data.bin"), 0, 64 << 20).await,
        Err(RemoteError::TooLarge(_))
    ));
    // Many reads in flight at once, as the mount issues them.
    let reads = (0..64u64).map(|i| {
        let r = r.clone();
        async move { r.read(&rp("data.bin"), i * 4096, 4096).await.unwrap() }
    });
    let results = futures_util::future::join_all(reads).await;
    for (i, res) in results.iter().enumerate() {
        assert_eq!(&res.data[..], &data[i * 4096..(i + 1) * 4096]);
    }
    // A change made in the sandbox changes the version.
    fs::write(b.root.join("data.bin"), b"new").unwrap();
    assert_ne!(r.stat(&rp("data.bin")).await.unwrap().version, v);
}

async fn commits_replace_whole_files_atomically_and_keep_mode(b: &Backend) {
    let r = &b.remote;
    let a = r
        .commit(
            &rp("new.txt"),
            whole(b"created\n".to_vec()),
            CommitOptions {
                base: None,
                create_mode: Some(0o600),
            },
        )
        .await
        .unwrap();
    assert_eq!((a.size, a.mode), (8, 0o600));
    assert_eq!(fs::read(b.root.join("new.txt")).unwrap(), b"created\n");

    fs::write(b.root.join("script.sh"), "old").unwrap();
    fs::set_permissions(b.root.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let big: Vec<u8> = (0..(8u32 << 20)).map(|i| (i * 7 % 256) as u8).collect();
    let base = r.stat(&rp("script.sh")).await.unwrap().version;
    let a = r
        .commit(
            &rp("script.sh"),
            whole(big.clone()),
            CommitOptions {
                base: Some(base.clone()),
                create_mode: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(fs::read(b.root.join("script.sh")).unwrap(), big);
    assert_eq!(
        fs::metadata(b.root.join("script.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    assert_eq!(a.mode, 0o755);

    // A stale base: conflict, nothing written.
    let err = r
        .commit(
            &rp("script.sh"),
            whole(b"lost".to_vec()),
            CommitOptions {
                base: Some(base),
                create_mode: None,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(fs::read(b.root.join("script.sh")).unwrap(), big);
    // A base for a file that does not exist is a conflict too.
    let err = r
        .commit(
            &rp("never.txt"),
            whole(b"x".to_vec()),
            CommitOptions {
                base: Some(Version("1".into())),
                create_mode: None,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert!(!b.root.join("never.txt").exists());

    // Through a symlink: the target changes, the link stays a link.
    fs::write(b.root.join("target.txt"), "t").unwrap();
    std::os::unix::fs::symlink("target.txt", b.root.join("alias")).unwrap();
    r.commit(
        &rp("alias"),
        whole(b"via link".to_vec()),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(fs::read(b.root.join("target.txt")).unwrap(), b"via link");
    assert!(fs::symlink_metadata(b.root.join("alias"))
        .unwrap()
        .file_type()
        .is_symlink());

    fs::create_dir(b.root.join("dir")).unwrap();
    assert!(matches!(
        r.commit(&rp("dir"), whole(b"x".to_vec()), CommitOptions::default())
            .await,
        Err(RemoteError::IsDir(_))
    ));
    assert!(matches!(
        r.commit(
            &rp("nodir/x"),
            whole(b"x".to_vec()),
            CommitOptions::default()
        )
        .await,
        Err(RemoteError::NotFound(_))
    ));
    assert_no_temp_files(&b.root);
}

fn assert_no_temp_files(root: &Path) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name();
            assert!(
                !name.as_bytes().windows(7).any(|w| w == b".sbxfs-"),
                "temp file left behind: {}",
                e.path().display()
            );
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
}

async fn patch_commits_apply_ranges_over_the_base(b: &Backend) {
    let r = &b.remote;
    fs::write(b.root.join("p.txt"), "0123456789").unwrap();
    let base = r.stat(&rp("p.txt")).await.unwrap().version;
    let patch = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 12,
        ranges: vec![
            (2, Bytes::from_static(b"AB")),
            (10, Bytes::from_static(b"XY")),
        ],
    };
    r.commit(
        &rp("p.txt"),
        patch,
        CommitOptions {
            base: Some(base.clone()),
            create_mode: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(fs::read(b.root.join("p.txt")).unwrap(), b"01AB456789XY");
    // Truncating patch.
    let base = r.stat(&rp("p.txt")).await.unwrap().version;
    let patch = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 3,
        ranges: vec![],
    };
    r.commit(
        &rp("p.txt"),
        patch,
        CommitOptions {
            base: Some(base),
            create_mode: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(fs::read(b.root.join("p.txt")).unwrap(), b"01A");
    // A patch over a stale base is refused.
    fs::write(b.root.join("p.txt"), "changed in the sandbox").unwrap();
    let stale = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 3,
        ranges: vec![(0, Bytes::from_static(b"zz"))],
    };
    let err = r
        .commit(
            &rp("p.txt"),
            stale,
            CommitOptions {
                base: Some(Version("0-0-0-0".into())),
                create_mode: None,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(
        fs::read(b.root.join("p.txt")).unwrap(),
        b"changed in the sandbox"
    );
    let missing = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 1,
        ranges: vec![],
    };
    assert!(r
        .commit(&rp("absent"), missing, CommitOptions::default())
        .await
        .is_err());
    assert!(!b.root.join("absent").exists());
    assert_no_temp_files(&b.root);
}

async fn namespace_operations_and_their_errors(b: &Backend) {
    let r = &b.remote;
    let a = r.create(&rp("f"), 0o640).await.unwrap();
    assert_eq!((a.kind, a.size, a.mode), (FileKind::File, 0, 0o640));
    assert!(matches!(
        r.create(&rp("f"), 0o644).await,
        Err(RemoteError::Exists(_))
    ));
    assert_eq!(r.mkdir(&rp("d"), 0o750).await.unwrap().mode, 0o750);
    assert!(matches!(
        r.mkdir(&rp("d"), 0o755).await,
        Err(RemoteError::Exists(_))
    ));
    assert!(matches!(
        r.mkdir(&rp("x/y"), 0o755).await,
        Err(RemoteError::NotFound(_))
    ));
    r.create(&rp("d/inner"), 0o644).await.unwrap();
    assert!(matches!(
        r.rmdir(&rp("d")).await,
        Err(RemoteError::NotEmpty(_))
    ));
    assert!(matches!(
        r.rmdir(&rp("f")).await,
        Err(RemoteError::NotDir(_))
    ));
    assert!(matches!(
        r.unlink(&rp("d")).await,
        Err(RemoteError::IsDir(_))
    ));
    assert!(matches!(
        r.unlink(&rp("nope")).await,
        Err(RemoteError::NotFound(_))
    ));

    r.rename(&rp("f"), &rp("g"), RenameMode::Replace)
        .await
        .unwrap();
    assert!(b.root.join("g").exists() && !b.root.join("f").exists());
    r.create(&rp("h"), 0o644).await.unwrap();
    assert!(matches!(
        r.rename(&rp("g"), &rp("h"), RenameMode::NoReplace).await,
        Err(RemoteError::Exists(_))
    ));
    r.rename(&rp("g"), &rp("h"), RenameMode::Replace)
        .await
        .unwrap();
    r.mkdir(&rp("e"), 0o755).await.unwrap();
    assert!(matches!(
        r.rename(&rp("e"), &rp("d"), RenameMode::Replace).await,
        Err(RemoteError::NotEmpty(_))
    ));
    assert!(matches!(
        r.rename(&rp("zzz"), &rp("q"), RenameMode::Replace).await,
        Err(RemoteError::NotFound(_))
    ));

    let l = r.symlink(&rp("ln"), b"h").await.unwrap();
    assert_eq!(l.kind, FileKind::Symlink);
    assert_eq!(r.readlink(&rp("ln")).await.unwrap(), b"h");
    assert!(matches!(
        r.readlink(&rp("h")).await,
        Err(RemoteError::Invalid(_))
    ));
    assert!(matches!(
        r.symlink(&rp("ln"), b"x").await,
        Err(RemoteError::Exists(_))
    ));

    fs::write(b.root.join("h"), "0123456789").unwrap();
    let a = r
        .setattr(
            &rp("h"),
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.mode, 0o600);
    let a = r
        .setattr(
            &rp("h"),
            SetAttr {
                size: Some(4),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.size, 4);
    assert_eq!(fs::read(b.root.join("h")).unwrap(), b"0123");
    let t = 1_600_000_000_123_456_789i64;
    let a = r
        .setattr(
            &rp("h"),
            SetAttr {
                mtime_ns: Some(t),
                atime_ns: Some(t),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.mtime_ns, t);
    assert!(matches!(
        r.setattr(
            &rp("none"),
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )
        .await,
        Err(RemoteError::NotFound(_))
    ));
    let s = r.statfs().await.unwrap();
    assert!(s.blocks > 0 && s.block_size > 0 && s.name_max >= 255);
    assert!(matches!(
        r.unlink(&RemotePath::root()).await,
        Err(RemoteError::Invalid(_))
    ));
}

async fn awkward_names_round_trip(b: &Backend) {
    let r = &b.remote;
    let names: Vec<&[u8]> = vec![
        b"with space",
        b"new\nline",
        b"quote\"s and 'single'",
        b"percent%41 plus+ amp&eq=",
        b"non-utf8 \xff\xfe",
        "日本語.txt".as_bytes(),
    ];
    for name in &names {
        let p = RemotePath::new(name.to_vec()).unwrap();
        r.commit(&p, whole(name.to_vec()), CommitOptions::default())
            .await
            .unwrap();
        assert_eq!(
            fs::read(b.root.join(std::ffi::OsStr::from_bytes(name))).unwrap(),
            *name
        );
        assert_eq!(&r.read(&p, 0, 1000).await.unwrap().data[..], *name);
        assert_eq!(r.stat(&p).await.unwrap().size, name.len() as u64);
    }
    let mut listed: Vec<Vec<u8>> = r
        .list(&RemotePath::root())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.0)
        .collect();
    let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    let from = RemotePath::new(b"non-utf8 \xff\xfe".to_vec()).unwrap();
    let to = RemotePath::new(b"renamed \xfe\nok".to_vec()).unwrap();
    r.rename(&from, &to, RenameMode::NoReplace).await.unwrap();
    assert!(b
        .root
        .join(std::ffi::OsStr::from_bytes(b"renamed \xfe\nok"))
        .exists());
}

async fn path_escapes_are_refused(b: &Backend) {
    let r = &b.remote;
    let outside = b.root.parent().unwrap().join("outside.txt");
    fs::write(&outside, "secret").unwrap();
    std::os::unix::fs::symlink("/etc", b.root.join("etc")).unwrap();
    std::os::unix::fs::symlink("../outside.txt", b.root.join("up")).unwrap();
    fs::write(b.root.join("inside.txt"), "fine").unwrap();
    std::os::unix::fs::symlink("inside.txt", b.root.join("ok-link")).unwrap();

    assert!(RemotePath::new(b"../outside.txt".to_vec()).is_err());
    assert!(RemotePath::new(b"/etc/passwd".to_vec()).is_err());
    assert!(RemotePath::new(b"a/../../x".to_vec()).is_err());
    assert!(RemotePath::new(b"a\0b".to_vec()).is_err());
    for path in ["etc/passwd", "up"] {
        let p = rp(path);
        assert!(
            matches!(r.read(&p, 0, 100).await, Err(RemoteError::Access(_))),
            "read {path}"
        );
        assert!(
            r.commit(&p, whole(b"pwned".to_vec()), CommitOptions::default())
                .await
                .is_err(),
            "commit {path}"
        );
        assert!(
            r.scan(
                &p,
                ScanRequest {
                    start_line: 1,
                    end_line: None,
                    max_bytes: 100
                }
            )
            .await
            .is_err(),
            "scan {path}"
        );
        assert!(
            r.edit(&p, "secret", "x", false).await.is_err(),
            "edit {path}"
        );
    }
    assert!(matches!(
        r.list(&rp("etc")).await,
        Err(RemoteError::Access(_))
    ));
    assert!(r
        .grep(
            &rp("etc"),
            GrepOptions {
                pattern: "root".into(),
                ..Default::default()
            }
        )
        .await
        .is_err());
    assert!(r.glob(&rp("etc"), "*").await.is_err());
    assert!(r
        .setattr(
            &rp("up"),
            SetAttr {
                mode: Some(0o777),
                ..Default::default()
            }
        )
        .await
        .is_err());
    assert!(r.mkdir(&rp("etc/newdir"), 0o755).await.is_err());
    assert_eq!(fs::read(&outside).unwrap(), b"secret");
    assert_eq!(
        fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // Links that stay inside are followed.
    assert_eq!(
        &r.read(&rp("ok-link"), 0, 100).await.unwrap().data[..],
        b"fine"
    );
    // The symlink itself can be inspected and removed.
    assert_eq!(r.readlink(&rp("etc")).await.unwrap(), b"/etc");
    r.unlink(&rp("etc")).await.unwrap();
    assert!(std::path::Path::new("/etc/passwd").exists());
}

async fn queries_run_next_to_the_data(b: &Backend) {
    let r = &b.remote;
    fs::create_dir_all(b.root.join("src")).unwrap();
    fs::write(b.root.join("src/a.rs"), "fn a() {}\n// TODO one\n").unwrap();
    fs::write(b.root.join("src/b.rs"), "// TODO two\nfn b() {}\n").unwrap();
    fs::write(b.root.join("notes.txt"), "alpha\nbeta\ngamma\n").unwrap();

    let s = r
        .scan(
            &rp("notes.txt"),
            ScanRequest {
                start_line: 2,
                end_line: None,
                max_bytes: 100,
            },
        )
        .await
        .unwrap();
    assert_eq!(s.lines, vec![b"beta".to_vec(), b"gamma".to_vec()]);
    assert_eq!((s.total_lines, s.total_bytes), (3, 17));
    assert!(matches!(
        r.scan(
            &rp("nope.txt"),
            ScanRequest {
                start_line: 1,
                end_line: None,
                max_bytes: 10
            }
        )
        .await,
        Err(RemoteError::NotFound(_))
    ));

    let events: Vec<GrepEvent> = r
        .grep(
            &RemotePath::root(),
            GrepOptions {
                pattern: "TODO".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
        .await;
    assert_eq!(events.len(), 3, "{events:?}");
    match (&events[0], &events[2]) {
        (GrepEvent::Match(m), GrepEvent::Summary { summary, truncated }) => {
            assert_eq!((m.path.as_str(), m.line, m.column), ("src/a.rs", 2, 4));
            assert_eq!((summary.matches, *truncated), (2, false));
        }
        other => panic!("unexpected {other:?}"),
    }
    let bad = r
        .grep(
            &RemotePath::root(),
            GrepOptions {
                pattern: "(".into(),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(bad, Err(RemoteError::Query(SearchError::Regex(_)))),
        "{:?}",
        bad.err()
    );

    assert_eq!(
        r.glob(&RemotePath::root(), "**/*.rs").await.unwrap(),
        ["src/a.rs", "src/b.rs"]
    );
    assert_eq!(r.glob(&rp("src"), "a*").await.unwrap(), ["a.rs"]);
    assert!(matches!(
        r.glob(&RemotePath::root(), "+(a)").await,
        Err(RemoteError::Query(SearchError::Unsupported(_)))
    ));
    let f = r
        .fuzzy(
            &RemotePath::root(),
            FuzzyRequest {
                query: "srcb".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(f[0].path, "src/b.rs");

    assert_eq!(
        r.edit(&rp("notes.txt"), "beta", "BETA", false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        fs::read_to_string(b.root.join("notes.txt")).unwrap(),
        "alpha\nBETA\ngamma\n"
    );
    assert!(matches!(
        r.edit(&rp("notes.txt"), "zzz", "y", false).await,
        Err(RemoteError::Query(SearchError::StringNotFound))
    ));
    assert!(matches!(
        r.edit(&rp("notes.txt"), "a", "y", false).await,
        Err(RemoteError::Query(SearchError::MultipleOccurrences(4)))
    ));
    assert_eq!(r.edit(&rp("notes.txt"), "a", "A", true).await.unwrap(), 4);
    assert!(matches!(
        r.edit(&rp("gone.txt"), "a", "b", false).await,
        Err(RemoteError::Query(SearchError::NotFound(_)))
    ));
    assert_no_temp_files(&b.root);
}

async fn change_feed_sees_writes_made_in_the_sandbox(b: &Backend) {
    let r = &b.remote;
    let mut feed = r.watch(None).await.unwrap();
    // Give the watcher a moment to be subscribed before the write.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    fs::write(b.root.join("direct.txt"), "made inside the sandbox").unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last_seq = 0;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, feed.next()).await {
        let ev = ev.unwrap();
        last_seq = ev.seq;
        seen.push(ev.clone());
        if ev.path.0 == b"direct.txt" && matches!(ev.kind, ChangeKind::Modified) {
            break;
        }
    }
    assert!(
        seen.iter()
            .any(|e| e.path.0 == b"direct.txt" && e.kind == ChangeKind::Created),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| e.path.0 == b"direct.txt" && e.kind == ChangeKind::Modified),
        "{seen:?}"
    );
    drop(feed);

    // Reconnect with the last number seen: what happened meanwhile arrives, nothing twice.
    fs::rename(b.root.join("direct.txt"), b.root.join("moved.txt")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut feed = r.watch(Some(last_seq)).await.unwrap();
    let renamed = ChangeKind::Renamed {
        to: WireBytes(b"moved.txt".to_vec()),
    };
    let ev = next_matching(&mut feed, |e| {
        e.path.0 == b"direct.txt" && e.kind == renamed
    })
    .await;
    assert!(ev.seq > last_seq);

    // A commit is reported as a change of its target, never as its temp file.
    let mut feed = r.watch(Some(ev.seq)).await.unwrap();
    r.commit(
        &rp("moved.txt"),
        whole(b"committed".to_vec()),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    let mut events = Vec::new();
    let modified = next_matching(&mut feed, |e| {
        events.push(e.clone());
        e.kind == ChangeKind::Modified
    })
    .await;
    assert_eq!(modified.path.0, b"moved.txt");
    assert!(
        events.iter().all(|e| e.path.0 == b"moved.txt"),
        "only the target is reported: {events:?}"
    );
}

/// The first event the predicate accepts, within 10 seconds; every event before it must be in
/// sequence.
async fn next_matching(
    feed: &mut futures_util::stream::BoxStream<'static, Result<ChangeEvent>>,
    mut want: impl FnMut(&ChangeEvent) -> bool,
) -> ChangeEvent {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = 0;
    loop {
        let ev = tokio::time::timeout_at(deadline, feed.next())
            .await
            .expect("the awaited change event did not arrive")
            .expect("the feed ended")
            .unwrap();
        assert!(ev.seq > last, "events in sequence");
        last = ev.seq;
        if want(&ev) {
            return ev;
        }
    }
}

async fn change_feed_reports_lost_events(b: &Backend) {
    let r = &b.remote;
    let feed = r.watch(None).await.unwrap();
    drop(feed);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // Overflow the agent's ring (8192 events): each file gives at least a create and a write.
    for i in 0..5000 {
        fs::write(b.root.join(format!("f{i}")), "x").unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut feed = r.watch(Some(1)).await.unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), feed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first.kind,
        ChangeKind::Lost,
        "a reconnect after an overflow must say events were lost"
    );
}

macro_rules! conformance {
    ($backend:ident: $($check:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let b = super::$backend();
                    super::$check(&b).await;
                }
            )*
        }
    };
}

conformance!(agent_backend:
    stat_list_and_tree,
    ranged_reads_carry_the_version,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
);
