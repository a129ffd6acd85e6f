//! The `Remote` conformance suite: every backend must pass every check. Each check gets a fresh
//! backend over an empty workspace, plus a [`Sandbox`] handle that changes it directly (as a
//! process in the sandbox would, bypassing the `Remote`). Backends: a real `sbxfs agent`
//! process on loopback through its HTTP client (the sandbox side is the real directory), and
//! `MemoryRemote` (the sandbox side is its `MemorySandbox`). The macro at the bottom runs each
//! check against each backend (`agent_backend::CHECK`, `memory_backend::CHECK`); checks about a
//! real OS only are marked "agent only" and listed for the agent alone.

use crate::common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;

use common::*;
use sbxfs::remote::memory::{MemoryRemote, MemorySandbox};
use sbxfs::remote::*;
use sbxfs::search::grep::GrepOptions;
use sbxfs::search::scan::ScanRequest;
use sbxfs::search::SearchError;

/// What `lstat` says about a path, as both sandbox sides can tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    kind: FileKind,
    ino: u64,
    mode: u32,
    size: u64,
    mtime_ns: i64,
    nlink: u64,
}

/// A process inside the sandbox: changes made here bypass the `Remote` under test. Paths are
/// workspace-relative bytes; every call panics on failure (the test set it up wrong).
trait Sandbox: Send + Sync {
    /// Write a whole file in place (same inode), creating it (0644) if missing.
    fn write(&self, path: &[u8], data: &[u8]);
    /// A file's content (symlinks followed); `None` if it does not exist.
    fn try_read(&self, path: &[u8]) -> Option<Vec<u8>>;
    fn read(&self, path: &[u8]) -> Vec<u8> {
        self.try_read(path)
            .unwrap_or_else(|| panic!("{} is missing", String::from_utf8_lossy(path)))
    }
    /// `mkdir -p`.
    fn mkdir_all(&self, path: &[u8]);
    fn symlink(&self, target: &[u8], path: &[u8]);
    fn hard_link(&self, existing: &[u8], new: &[u8]);
    /// A file, symlink or empty directory.
    fn remove(&self, path: &[u8]);
    fn rename(&self, from: &[u8], to: &[u8]);
    fn chmod(&self, path: &[u8], mode: u32);
    /// `lstat`; `None` if nothing is there.
    fn lstat(&self, path: &[u8]) -> Option<Meta>;
    fn exists(&self, path: &[u8]) -> bool {
        self.lstat(path).is_some()
    }
    /// A directory's names, sorted.
    fn names(&self, dir: &[u8]) -> Vec<Vec<u8>>;
}

/// The agent's sandbox side: the real workspace directory.
struct RealDir(PathBuf);

impl RealDir {
    fn at(&self, path: &[u8]) -> PathBuf {
        if path.is_empty() {
            self.0.clone()
        } else {
            self.0.join(std::ffi::OsStr::from_bytes(path))
        }
    }
}

impl Sandbox for RealDir {
    fn write(&self, path: &[u8], data: &[u8]) {
        fs::write(self.at(path), data).unwrap();
    }
    fn try_read(&self, path: &[u8]) -> Option<Vec<u8>> {
        fs::read(self.at(path)).ok()
    }
    fn mkdir_all(&self, path: &[u8]) {
        fs::create_dir_all(self.at(path)).unwrap();
    }
    fn symlink(&self, target: &[u8], path: &[u8]) {
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), self.at(path)).unwrap();
    }
    fn hard_link(&self, existing: &[u8], new: &[u8]) {
        fs::hard_link(self.at(existing), self.at(new)).unwrap();
    }
    fn remove(&self, path: &[u8]) {
        let p = self.at(path);
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            fs::remove_dir(p).unwrap();
        } else {
            fs::remove_file(p).unwrap();
        }
    }
    fn rename(&self, from: &[u8], to: &[u8]) {
        fs::rename(self.at(from), self.at(to)).unwrap();
    }
    fn chmod(&self, path: &[u8], mode: u32) {
        fs::set_permissions(self.at(path), fs::Permissions::from_mode(mode)).unwrap();
    }
    fn lstat(&self, path: &[u8]) -> Option<Meta> {
        let m = fs::symlink_metadata(self.at(path)).ok()?;
        let t = m.file_type();
        let kind = if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_dir() {
            FileKind::Dir
        } else if t.is_file() {
            FileKind::File
        } else {
            FileKind::Other
        };
        Some(Meta {
            kind,
            ino: m.ino(),
            mode: m.mode() & 0o7777,
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            nlink: m.nlink(),
        })
    }
    fn names(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        let mut names: Vec<Vec<u8>> = fs::read_dir(self.at(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        names.sort();
        names
    }
}

/// `MemoryRemote`'s sandbox side.
impl Sandbox for MemorySandbox {
    fn write(&self, path: &[u8], data: &[u8]) {
        MemorySandbox::write(self, path, data).unwrap();
    }
    fn try_read(&self, path: &[u8]) -> Option<Vec<u8>> {
        MemorySandbox::read(self, path).ok()
    }
    fn mkdir_all(&self, path: &[u8]) {
        MemorySandbox::mkdir_all(self, path).unwrap();
    }
    fn symlink(&self, target: &[u8], path: &[u8]) {
        MemorySandbox::symlink(self, target, path).unwrap();
    }
    fn hard_link(&self, existing: &[u8], new: &[u8]) {
        MemorySandbox::hard_link(self, existing, new).unwrap();
    }
    fn remove(&self, path: &[u8]) {
        MemorySandbox::remove(self, path).unwrap();
    }
    fn rename(&self, from: &[u8], to: &[u8]) {
        MemorySandbox::rename(self, from, to).unwrap();
    }
    fn chmod(&self, path: &[u8], mode: u32) {
        MemorySandbox::chmod(self, path, mode).unwrap();
    }
    fn lstat(&self, path: &[u8]) -> Option<Meta> {
        let a = self.metadata(path).ok()?;
        Some(Meta {
            kind: a.kind,
            ino: a.ino,
            mode: a.mode,
            size: a.size,
            mtime_ns: a.mtime_ns,
            nlink: a.nlink,
        })
    }
    fn names(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        self.list(dir).unwrap()
    }
}

struct Backend {
    remote: Arc<dyn Remote>,
    sb: Box<dyn Sandbox>,
    /// The workspace directory, for checks about a real OS (agent only).
    real_root: Option<PathBuf>,
    _keep: Box<dyn std::any::Any + Send>,
}

fn agent_backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    Backend {
        remote: Arc::new(agent.client()),
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((agent, dir)),
    }
}

fn memory_backend() -> Backend {
    let m = MemoryRemote::new();
    Backend {
        sb: Box::new(m.sandbox()),
        remote: Arc::new(m),
        real_root: None,
        _keep: Box::new(()),
    }
}

fn rp(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

fn whole(data: Vec<u8>) -> CommitContent {
    CommitContent::Whole(Box::new(std::io::Cursor::new(data)))
}

/// `tree_listings`: the asked directory's listing whole, then its subdirectories' breadth
/// first, each exactly what `list` says, until the cap; the rest answered as not descended.
async fn tree_listings_are_breadth_first_and_capped(b: &Backend) {
    let r = &b.remote;
    b.sb.mkdir_all(b"a/x");
    b.sb.mkdir_all(b"b/y\nz");
    for f in [
        &b"a/a1"[..],
        b"a/a2",
        b"a/x/1",
        b"a/x/2",
        b"a/x/3",
        b"b/new\nline",
        b"b/bad\xff",
        b"c",
    ] {
        b.sb.write(f, b"x");
    }
    b.sb.write(b"b/y\nz/deep", b"y");
    let all: Vec<TreeListing> = r
        .tree_listings(&RemotePath::root(), 1000)
        .await
        .unwrap()
        .map(|l| l.unwrap())
        .collect()
        .await;
    let order: Vec<&[u8]> = all.iter().map(|l| l.path.as_bytes()).collect();
    assert_eq!(order, [&b""[..], b"a", b"b", b"a/x", b"b/y\nz"]);
    // Listing a directory may move its access time (relatime): all else must agree.
    let no_atime = |mut v: Vec<DirEntry>| {
        v.iter_mut().for_each(|e| e.attr.atime_ns = 0);
        v
    };
    for l in &all {
        let plain = no_atime(r.list(&l.path).await.unwrap());
        assert_eq!(l.entries.clone().map(no_atime), Some(plain), "{:?}", l.path);
    }
    // Three entries after the first listing: `a`'s fit, `b`'s do not; the walk stops there.
    let capped: Vec<(Vec<u8>, bool)> = r
        .tree_listings(&RemotePath::root(), 3)
        .await
        .unwrap()
        .map(|l| l.unwrap())
        .map(|l| (l.path.as_bytes().to_vec(), l.entries.is_some()))
        .collect()
        .await;
    assert_eq!(
        capped,
        [
            (b"".to_vec(), true),
            (b"a".to_vec(), true),
            (b"b".to_vec(), false),
            (b"a/x".to_vec(), false)
        ]
    );
    let none: Vec<TreeListing> = r
        .tree_listings(&rp("a"), 0)
        .await
        .unwrap()
        .map(|l| l.unwrap())
        .collect()
        .await;
    assert_eq!(none.len(), 2, "a's own listing, then a/x not descended");
    assert_eq!(none[0].entries.as_ref().map(Vec::len), Some(3));
    assert!(none[1].entries.is_none());
    assert!(matches!(
        r.tree_listings(&rp("nope"), 10).await.map(drop),
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        r.tree_listings(&rp("c"), 10).await.map(drop),
        Err(RemoteError::NotDir(_))
    ));
}

/// Stat, listings and trees say whether each entry has extended attributes (a symlink: its
/// own, not its target's), so a mount can answer "none" without asking.
async fn stat_list_and_tree_tell_whether_xattrs_exist(b: &Backend) {
    let r = &b.remote;
    b.sb.mkdir_all(b"d");
    b.sb.write(b"d/plain", b"x");
    b.sb.write(b"d/tagged", b"y");
    b.sb.symlink(b"tagged", b"d/link");
    r.setxattr(&rp("d/tagged"), b"user.k", b"v", XattrFlags::default())
        .await
        .unwrap();
    let want = [
        (b"link".to_vec(), Some(false)),
        (b"plain".to_vec(), Some(false)),
        (b"tagged".to_vec(), Some(true)),
    ];
    let bits = |v: &[DirEntry]| -> Vec<(Vec<u8>, Option<bool>)> {
        v.iter()
            .map(|e| (e.name.0.clone(), e.attr.has_xattrs))
            .collect()
    };
    assert_eq!(bits(&r.list(&rp("d")).await.unwrap()), want);
    for (name, has) in &want {
        let path = rp("d").join(name).unwrap();
        assert_eq!(r.stat(&path).await.unwrap().has_xattrs, *has, "{path:?}");
    }
    let tree: Vec<TreeListing> = r
        .tree_listings(&RemotePath::root(), 100)
        .await
        .unwrap()
        .map(|l| l.unwrap())
        .collect()
        .await;
    let d = tree.iter().find(|l| l.path == rp("d")).unwrap();
    assert_eq!(bits(d.entries.as_ref().unwrap()), want);
    r.removexattr(&rp("d/tagged"), b"user.k").await.unwrap();
    assert_eq!(
        r.stat(&rp("d/tagged")).await.unwrap().has_xattrs,
        Some(false)
    );
}

async fn stat_list_and_tree(b: &Backend) {
    let r = &b.remote;
    b.sb.mkdir_all(b"src/deep");
    b.sb.write(b"src/main.rs", b"fn main() {}\n");
    b.sb.write(b"src/deep/x.txt", b"x");
    b.sb.write(b"README", b"hi");
    b.sb.symlink(b"src/main.rs", b"link");

    let a = r.stat(&rp("src/main.rs")).await.unwrap();
    assert_eq!((a.kind, a.size), (FileKind::File, 13));
    let meta = b.sb.lstat(b"src/main.rs").unwrap();
    assert_eq!(a.ino, meta.ino, "the sandbox's own inode number");
    assert_eq!(a.mtime_ns, meta.mtime_ns);
    assert_eq!((a.mode, a.nlink), (meta.mode, meta.nlink));

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
    b.sb.write(b"data.bin", &data);
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
    b.sb.mkdir_all(b"d");
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
    b.sb.write(b"data.bin", b"new");
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
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((a.size, a.mode), (8, 0o600));
    assert_eq!(b.sb.read(b"new.txt"), b"created\n");

    b.sb.write(b"script.sh", b"old");
    b.sb.chmod(b"script.sh", 0o755);
    let big: Vec<u8> = (0..(8u32 << 20)).map(|i| (i * 7 % 256) as u8).collect();
    let base = r.stat(&rp("script.sh")).await.unwrap().version;
    let a = r
        .commit(
            &rp("script.sh"),
            whole(big.clone()),
            CommitOptions {
                base: Some(base.clone()),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(b.sb.read(b"script.sh"), big);
    assert_eq!(b.sb.lstat(b"script.sh").unwrap().mode, 0o755);
    assert_eq!(a.mode, 0o755);

    // A stale base: conflict, nothing written.
    let err = r
        .commit(
            &rp("script.sh"),
            whole(b"lost".to_vec()),
            CommitOptions {
                base: Some(base),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(b.sb.read(b"script.sh"), big);
    // A base for a file that does not exist is a conflict too.
    let err = r
        .commit(
            &rp("never.txt"),
            whole(b"x".to_vec()),
            CommitOptions {
                base: Some(Version("1".into())),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert!(!b.sb.exists(b"never.txt"));

    // Through a symlink: the target changes, the link stays a link.
    b.sb.write(b"target.txt", b"t");
    b.sb.symlink(b"target.txt", b"alias");
    r.commit(
        &rp("alias"),
        whole(b"via link".to_vec()),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(b.sb.read(b"target.txt"), b"via link");
    assert_eq!(b.sb.lstat(b"alias").unwrap().kind, FileKind::Symlink);

    b.sb.mkdir_all(b"dir");
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
    assert_no_temp_files(b.sb.as_ref());
}

fn assert_no_temp_files(sb: &dyn Sandbox) {
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        for name in sb.names(&dir) {
            let path = if dir.is_empty() {
                name.clone()
            } else {
                [&dir[..], b"/", &name[..]].concat()
            };
            assert!(
                !name.windows(7).any(|w| w == b".sbxfs-"),
                "temp file left behind: {}",
                String::from_utf8_lossy(&path)
            );
            if sb.lstat(&path).unwrap().kind == FileKind::Dir {
                stack.push(path);
            }
        }
    }
}

async fn patch_commits_apply_ranges_over_the_base(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"p.txt", b"0123456789");
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
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b.sb.read(b"p.txt"), b"01AB456789XY");
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
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b.sb.read(b"p.txt"), b"01A");
    // A patch over a stale base is refused.
    b.sb.write(b"p.txt", b"changed in the sandbox");
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
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(b.sb.read(b"p.txt"), b"changed in the sandbox");
    let missing = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 1,
        ranges: vec![],
    };
    assert!(r
        .commit(&rp("absent"), missing, CommitOptions::default())
        .await
        .is_err());
    assert!(!b.sb.exists(b"absent"));
    assert_no_temp_files(b.sb.as_ref());
}

/// A commit that names a modification time gives the new content that time (the time the
/// mount showed for the last write): a whole file, a patch, and a file the commit creates.
async fn commits_keep_the_mtime_they_name(b: &Backend) {
    let r = &b.remote;
    let t: i64 = 1_700_000_000_123_456_789;
    let with_time = |base: Option<Version>, t: i64| CommitOptions {
        base,
        mtime_ns: Some(t),
        ..Default::default()
    };
    let a = r
        .commit(&rp("m.txt"), whole(b"new".to_vec()), with_time(None, t))
        .await
        .unwrap();
    assert_eq!((a.mtime_ns, b.sb.lstat(b"m.txt").unwrap().mtime_ns), (t, t));
    let a = r
        .commit(
            &rp("m.txt"),
            whole(b"again".to_vec()),
            with_time(Some(a.version), t + 1_000),
        )
        .await
        .unwrap();
    assert_eq!(a.mtime_ns, t + 1_000);
    let a = r
        .commit(
            &rp("m.txt"),
            CommitContent::Patch {
                cut: u64::MAX,
                new_len: 5,
                ranges: vec![(0, Bytes::from_static(b"A"))],
            },
            with_time(Some(a.version), t + 2_000),
        )
        .await
        .unwrap();
    assert_eq!(a.mtime_ns, t + 2_000);
    assert_eq!(b.sb.lstat(b"m.txt").unwrap().mtime_ns, t + 2_000);
    assert_eq!(b.sb.read(b"m.txt"), b"Again");
    // Where the transport says so, an access time goes with the commit too (`cp -p`,
    // `rsync -a`: both times set before the first push).
    if r.info().await.unwrap().capabilities.commit_atime {
        let at = t - 5_000_000_000;
        let a = r
            .commit(
                &rp("a.txt"),
                whole(b"timed".to_vec()),
                CommitOptions {
                    mtime_ns: Some(t),
                    atime_ns: Some(at),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((a.atime_ns, a.mtime_ns), (at, t));
        let seen = b.sb.lstat(b"a.txt").unwrap();
        assert_eq!(seen.mtime_ns, t);
    }
}

async fn namespace_operations_and_their_errors(b: &Backend) {
    let r = &b.remote;
    let a = r.create(&rp("f"), 0o640).await.unwrap();
    assert_eq!((a.kind, a.size, a.mode), (FileKind::File, 0, 0o640));
    assert!(matches!(
        r.create(&rp("f"), 0o644).await,
        Err(RemoteError::Exists(_))
    ));
    // A name that is a symlink to a device or a file outside is taken too: its target keeps
    // its mode (a shell's noclobber opens such a name; a chmod after it followed the link
    // and once left this machine's /dev/null 0644).
    // (A device node of the test's own, made as root, stands for /dev/null.)
    let outside = tempfile::tempdir().unwrap();
    let device = outside.path().join("null");
    let made = std::process::Command::new("mknod")
        .args(["-m", "600"])
        .arg(&device)
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success());
    let target = if made {
        device
    } else {
        let f = outside.path().join("file");
        fs::write(&f, "").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        f
    };
    b.sb.symlink(target.as_os_str().as_bytes(), b"to_outside");
    assert!(matches!(
        r.create(&rp("to_outside"), 0o644).await,
        Err(RemoteError::Exists(_))
    ));
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
    b.sb.remove(b"to_outside");
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
    assert!(b.sb.exists(b"g") && !b.sb.exists(b"f"));
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

    b.sb.write(b"h", b"0123456789");
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
    assert_eq!(b.sb.read(b"h"), b"0123");
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
        assert_eq!(b.sb.read(name), *name);
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
    assert!(b.sb.exists(b"renamed \xfe\nok"));
}

async fn path_escapes_are_refused(b: &Backend) {
    let r = &b.remote;
    // Agent only: a real file just outside the workspace, that nothing may reach.
    let outside = b
        .real_root
        .as_ref()
        .map(|root| root.parent().unwrap().join("outside.txt"));
    if let Some(outside) = &outside {
        fs::write(outside, "secret").unwrap();
    }
    b.sb.symlink(b"/etc", b"etc");
    b.sb.symlink(b"../outside.txt", b"up");
    b.sb.write(b"inside.txt", b"fine");
    b.sb.symlink(b"inside.txt", b"ok-link");

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
    if let Some(outside) = &outside {
        assert_eq!(fs::read(outside).unwrap(), b"secret");
        assert_eq!(
            fs::metadata(outside).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }
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
    b.sb.mkdir_all(b"src");
    b.sb.write(b"src/a.rs", b"fn a() {}\n// TODO one\n");
    b.sb.write(b"src/b.rs", b"// TODO two\nfn b() {}\n");
    b.sb.write(b"notes.txt", b"alpha\nbeta\ngamma\n");

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
    assert_eq!(b.sb.read(b"notes.txt"), b"alpha\nBETA\ngamma\n");
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
    assert_no_temp_files(b.sb.as_ref());
}

async fn change_feed_sees_writes_made_in_the_sandbox(b: &Backend) {
    let r = &b.remote;
    let mut feed = r.watch(None).await.unwrap();
    // Give the watcher a moment to be subscribed before the write.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    b.sb.write(b"direct.txt", b"made inside the sandbox");
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
    b.sb.rename(b"direct.txt", b"moved.txt");
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
        b.sb.write(format!("f{i}").as_bytes(), b"x");
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

/// A commit based on [`Version::absent`] creates a file only where none is: one made in the
/// sandbox meanwhile is a conflict and keeps its content (a new file saved through a mount never
/// overwrites it).
async fn create_only_commits_never_replace(b: &Backend) {
    let r = &b.remote;
    assert!(r.info().await.unwrap().commit_absent);
    let only = || CommitOptions {
        base: Some(Version::absent()),
        create_mode: Some(0o640),
        ..Default::default()
    };
    let a = r
        .commit(&rp("made.txt"), whole(b"ours".to_vec()), only())
        .await
        .unwrap();
    assert_eq!((a.size, a.mode & 0o777), (4, 0o640));
    assert_eq!(b.sb.read(b"made.txt"), b"ours");
    b.sb.write(b"theirs.txt", b"theirs");
    for path in ["theirs.txt", "made.txt"] {
        let before = b.sb.read(path.as_bytes());
        let err = r
            .commit(&rp(path), whole(b"clobber".to_vec()), only())
            .await
            .unwrap_err();
        assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
        assert_eq!(b.sb.read(path.as_bytes()), before);
    }
    assert_no_temp_files(b.sb.as_ref());
}

async fn stat_many_answers_each_path_in_order(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"a", b"one");
    b.sb.mkdir_all(b"d/e");
    b.sb.write(b"d/e/f", b"three");
    b.sb.symlink(b"a", b"l");
    let paths = [
        rp("a"),
        rp("gone"),
        rp("d"),
        rp("d/e/f"),
        rp("l"),
        rp("a/x"),
    ];
    let got = r.stat_many(&paths).await.unwrap();
    assert_eq!(got.len(), paths.len());
    for (p, g) in paths.iter().zip(&got) {
        match r.stat(p).await {
            // (Not the atime: a single stat of a symlink reads it.)
            Ok(one) => {
                let g = g.as_ref().unwrap();
                let key = |a: &Attr| (a.kind, a.ino, a.size, a.mode, a.version.clone());
                assert_eq!(key(g), key(&one), "{p:?}");
            }
            Err(e) => assert_eq!(
                g.as_ref().unwrap_err().token(),
                e.token(),
                "{p:?}: the same error as a single stat"
            ),
        }
    }
    assert_eq!(got[1].as_ref().unwrap_err().token(), "ENOENT");
    assert_eq!(
        got[4].as_ref().unwrap().kind,
        FileKind::Symlink,
        "not followed"
    );
    assert!(r.stat_many(&[]).await.unwrap().is_empty());
    // One call is bounded: too many paths is one clear error, nothing partial.
    let many: Vec<RemotePath> = (0..=MAX_STAT_MANY).map(|i| rp(&format!("f{i}"))).collect();
    let e = r.stat_many(&many).await.unwrap_err();
    assert!(matches!(e, RemoteError::Invalid(_)), "{e:?}");
    // And the batches the helper cuts are each accepted.
    let batches = stat_many_batches(&many);
    assert_eq!(batches.len(), 2);
    for batch in batches {
        assert_eq!(r.stat_many(batch).await.unwrap().len(), batch.len());
    }
}

async fn hard_links_made_in_the_sandbox_share_an_inode(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"a", b"shared");
    b.sb.mkdir_all(b"d");
    b.sb.hard_link(b"a", b"d/b");
    let (a, bb) = (
        r.stat(&rp("a")).await.unwrap(),
        r.stat(&rp("d/b")).await.unwrap(),
    );
    assert_eq!((a.ino, a.nlink), (bb.ino, 2));
    assert_eq!(a.version, bb.version, "one inode, one content, one version");
    b.sb.remove(b"a");
    let left = r.stat(&rp("d/b")).await.unwrap();
    assert_eq!((left.ino, left.nlink), (a.ino, 1));
    assert_eq!(
        &r.read(&rp("d/b"), 0, 100).await.unwrap().data[..],
        b"shared"
    );
    assert!(matches!(
        r.stat(&rp("a")).await,
        Err(RemoteError::NotFound(_))
    ));
}

fn patch(cut: u64, new_len: u64, ranges: Vec<(u64, &'static [u8])>) -> CommitContent {
    CommitContent::Patch {
        cut,
        new_len,
        ranges: ranges
            .into_iter()
            .map(|(o, b)| (o, Bytes::from_static(b)))
            .collect(),
    }
}

fn based_on(v: Version) -> CommitOptions {
    CommitOptions {
        base: Some(v),
        create_mode: None,
        ..Default::default()
    }
}

/// The whole file through the remote (so any backend can be checked the same way).
async fn read_all(b: &Backend, path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = b
            .remote
            .read(&rp(path), out.len() as u64, 1 << 20)
            .await
            .unwrap();
        if got.data.is_empty() {
            return out;
        }
        out.extend_from_slice(&got.data);
    }
}

/// A new sparse file is sent as its written ranges: a patch cut to nothing needs no base.
async fn a_patch_cut_to_nothing_creates_its_file(b: &Backend) {
    let r = &b.remote;
    assert!(r.info().await.unwrap().capabilities.patch_new);
    let created = CommitOptions {
        base: Some(Version::absent()),
        create_mode: Some(0o640),
        ..Default::default()
    };
    // One byte far out (the hole is not sent).
    let a = r
        .commit(
            &rp("sparse.bin"),
            patch(0, 3_000_001, vec![(3_000_000, b"Z")]),
            created,
        )
        .await
        .unwrap();
    assert_eq!(a.size, 3_000_001);
    assert_eq!(a.mode & 0o7777, 0o640);
    let got = read_all(b, "sparse.bin").await;
    assert_eq!(got.len(), 3_000_001);
    assert!(got[..3_000_000].iter().all(|&c| c == 0));
    assert_eq!(got[3_000_000], b'Z');
    // `truncate -s 4096` of a new file: no range at all.
    r.commit(
        &rp("sized.bin"),
        patch(0, 4096, vec![]),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(read_all(b, "sized.bin").await, vec![0; 4096]);
    // Over a file that is there, a cut to nothing keeps none of it.
    b.sb.write(b"old.txt", b"old content here");
    let base = r.stat(&rp("old.txt")).await.unwrap().version;
    r.commit(
        &rp("old.txt"),
        patch(0, 3, vec![(0, b"new")]),
        based_on(base),
    )
    .await
    .unwrap();
    assert_eq!(read_all(b, "old.txt").await, b"new");
    // A patch that keeps bytes of its base still needs one.
    assert!(r
        .commit(
            &rp("missing.bin"),
            patch(5, 10, vec![]),
            CommitOptions::default()
        )
        .await
        .is_err());
    assert!(matches!(
        r.stat(&rp("missing.bin")).await,
        Err(RemoteError::NotFound(_))
    ));
}

async fn patches_cut_before_they_write(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"t.bin", &[b'A'; 20_000]);
    let base = r.stat(&rp("t.bin")).await.unwrap().version;
    // As `truncate -s 100` then a write at 30,000: what was between is gone, not kept.
    let a = r
        .commit(
            &rp("t.bin"),
            patch(100, 30_010, vec![(30_000, b"BBBBBBBBBB")]),
            based_on(base),
        )
        .await
        .unwrap();
    assert_eq!(a.size, 30_010);
    let got = read_all(b, "t.bin").await;
    assert_eq!(got.len(), 30_010);
    assert!(got[..100].iter().all(|&c| c == b'A'), "kept below the cut");
    assert!(
        got[100..30_000].iter().all(|&c| c == 0),
        "bytes between the cut and the range read as zeros"
    );
    assert_eq!(&got[30_000..], b"BBBBBBBBBB");

    // Cut, then grown again with no range: zeros past the cut.
    let base = a.version;
    r.commit(&rp("t.bin"), patch(5, 50, vec![]), based_on(base))
        .await
        .unwrap();
    let mut want = vec![b'A'; 5];
    want.resize(50, 0);
    assert_eq!(read_all(b, "t.bin").await, want);

    // A cut at or past the base size cuts nothing.
    let base = r.stat(&rp("t.bin")).await.unwrap().version;
    r.commit(
        &rp("t.bin"),
        patch(50, 52, vec![(50, b"zz")]),
        based_on(base),
    )
    .await
    .unwrap();
    want.extend_from_slice(b"zz");
    assert_eq!(read_all(b, "t.bin").await, want);
    assert_no_temp_files(&*b.sb);
}

async fn hard_links_share_content_and_survive_commits(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"a", b"one");
    let before = r.stat(&rp("a")).await.unwrap();
    let l = r.link(&rp("a"), &rp("b")).await.unwrap();
    assert_eq!((l.nlink, l.ino, l.kind), (2, before.ino, FileKind::File));
    assert_eq!(
        l.version, before.version,
        "a link changes the ctime only, not the version"
    );
    assert!(matches!(
        r.link(&rp("a"), &rp("b")).await,
        Err(RemoteError::Exists(_))
    ));
    assert!(matches!(
        r.link(&rp("missing"), &rp("c")).await,
        Err(RemoteError::NotFound(_))
    ));

    // A whole-file commit to one name: both names see it, still one inode.
    let a = r
        .commit(
            &rp("a"),
            whole(b"two, longer".to_vec()),
            based_on(l.version),
        )
        .await
        .unwrap();
    assert_eq!((a.ino, a.nlink), (before.ino, 2), "the link survives");
    assert_eq!(read_all(b, "b").await, b"two, longer");
    // A patch through the other name.
    let p = r
        .commit(
            &rp("b"),
            patch(3, 5, vec![(3, b"!!")]),
            based_on(a.version.clone()),
        )
        .await
        .unwrap();
    assert_eq!((p.ino, p.nlink), (before.ino, 2));
    assert_eq!(read_all(b, "a").await, b"two!!");
    // A stale base is still a conflict, and changes nothing.
    let err = r
        .commit(&rp("a"), whole(b"lost".to_vec()), based_on(a.version))
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(read_all(b, "b").await, b"two!!");
    // Once the other name is gone, commits are renames again (a new inode).
    r.unlink(&rp("b")).await.unwrap();
    let v = r.stat(&rp("a")).await.unwrap().version;
    let c = r
        .commit(&rp("a"), whole(b"three".to_vec()), based_on(v))
        .await
        .unwrap();
    assert_eq!(c.nlink, 1);
    assert_no_temp_files(&*b.sb);
}

async fn mknod_makes_fifos_sockets_and_devices_when_allowed(b: &Backend) {
    let r = &b.remote;
    let f = r
        .mknod(&rp("fifo"), SpecialKind::Fifo, 0o640, 0)
        .await
        .unwrap();
    assert_eq!((f.kind, f.mode, f.size), (FileKind::Fifo, 0o640, 0));
    let s = r
        .mknod(&rp("sock"), SpecialKind::Socket, 0o600, 0)
        .await
        .unwrap();
    assert_eq!((s.kind, s.mode), (FileKind::Socket, 0o600));
    assert!(matches!(
        r.mknod(&rp("fifo"), SpecialKind::Fifo, 0o644, 0).await,
        Err(RemoteError::Exists(_))
    ));
    let names: Vec<(Vec<u8>, FileKind)> = r
        .list(&RemotePath::root())
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name.0, e.attr.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            (b"fifo".to_vec(), FileKind::Fifo),
            (b"sock".to_vec(), FileKind::Socket)
        ]
    );
    // /dev/null's numbers (1, 3): made only where the sandbox may, else honestly EPERM.
    let rdev = libc::makedev(1, 3);
    match r
        .mknod(&rp("null"), SpecialKind::CharDevice, 0o666, rdev)
        .await
    {
        Ok(d) => assert_eq!(
            (d.kind, d.rdev, d.mode),
            (FileKind::CharDevice, rdev, 0o666)
        ),
        Err(e) => assert!(matches!(e, RemoteError::Perm(_)), "{e:?}"),
    }
    // Never opened for reading: a FIFO would block the reader forever.
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        r.read(&rp("fifo"), 0, 10),
    )
    .await
    .expect("reading a FIFO must not block")
    .unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

async fn rename_exchanges_and_refuses_to_replace(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"x", b"x");
    b.sb.mkdir_all(b"d");
    b.sb.write(b"d/inner", b"inner");
    r.rename(&rp("x"), &rp("d"), RenameMode::Exchange)
        .await
        .unwrap();
    assert_eq!(r.stat(&rp("x")).await.unwrap().kind, FileKind::Dir);
    assert_eq!(read_all(b, "x/inner").await, b"inner");
    assert_eq!(read_all(b, "d").await, b"x");
    assert!(matches!(
        r.rename(&rp("d"), &rp("missing"), RenameMode::Exchange)
            .await,
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        r.rename(&rp("d"), &rp("x"), RenameMode::NoReplace).await,
        Err(RemoteError::Exists(_))
    ));
    assert_eq!(
        read_all(b, "d").await,
        b"x",
        "a refused rename changes nothing"
    );
    r.rename(&rp("d"), &rp("y"), RenameMode::NoReplace)
        .await
        .unwrap();
    assert_eq!(read_all(b, "y").await, b"x");
}

async fn modes_are_exactly_those_asked(b: &Backend) {
    // The test process (and so the agent it starts) has a umask, 022 by default: none of it
    // may show in what is made.
    let r = &b.remote;
    // The agent drops set-ID bits unless started with --allow-setid (a token holder must not
    // make a setuid-root program); the in-memory sandbox keeps them.
    let setid = if b.real_root.is_some() { 0 } else { 0o4000 };
    for (name, mode, made) in [
        ("f666", 0o666, 0o666),
        ("f600", 0o600, 0o600),
        ("f4755", 0o4755, 0o755 | setid),
    ] {
        assert_eq!(
            r.create(&rp(name), mode).await.unwrap().mode,
            made,
            "{name}"
        );
        assert_eq!(r.stat(&rp(name)).await.unwrap().mode, made, "{name}");
    }
    for (name, mode) in [("d777", 0o777), ("d1777", 0o1777), ("d700", 0o700)] {
        assert_eq!(r.mkdir(&rp(name), mode).await.unwrap().mode, mode, "{name}");
    }
    let f = r
        .mknod(&rp("p666"), SpecialKind::Fifo, 0o666, 0)
        .await
        .unwrap();
    assert_eq!(f.mode, 0o666);
    let c = r
        .commit(
            &rp("c666"),
            whole(b"new".to_vec()),
            CommitOptions {
                base: None,
                create_mode: Some(0o666),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(c.mode, 0o666);
    // A set-group-ID parent passes its bit (and its group) on to new directories, as Linux
    // does: asked for 0755, 02755 it is. Files get the group only.
    b.sb.mkdir_all(b"sgid");
    b.sb.chmod(b"sgid", 0o2775);
    let parent = r.stat(&rp("sgid")).await.unwrap();
    let sub = r.mkdir(&rp("sgid/sub"), 0o755).await.unwrap();
    assert_eq!((sub.mode, sub.gid), (0o2755, parent.gid));
    assert_eq!(r.stat(&rp("sgid/sub")).await.unwrap().mode, 0o2755);
    let f = r.create(&rp("sgid/f"), 0o644).await.unwrap();
    assert_eq!((f.mode, f.gid), (0o644, parent.gid));
}

/// A file another user owns keeps its owner when new content replaces it (a whole file and a
/// patch), where the sandbox may give files away (it runs as root).
async fn commits_keep_the_owner(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"owned.txt", b"v1");
    let given = r
        .setattr(
            &rp("owned.txt"),
            SetAttr {
                uid: Some(65534),
                gid: Some(65534),
                ..Default::default()
            },
        )
        .await;
    let Ok(a) = given else {
        return; // not root in the sandbox: files cannot be given away
    };
    assert_eq!((a.uid, a.gid), (65534, 65534));
    let w = r
        .commit(
            &rp("owned.txt"),
            whole(b"version two".to_vec()),
            based_on(a.version),
        )
        .await
        .unwrap();
    assert_eq!((w.uid, w.gid), (65534, 65534), "after a whole-file commit");
    let p = r
        .commit(
            &rp("owned.txt"),
            patch(u64::MAX, 11, vec![(0, b"V")]),
            based_on(w.version),
        )
        .await
        .unwrap();
    assert_eq!((p.uid, p.gid), (65534, 65534), "after a patch");
    let now = r.stat(&rp("owned.txt")).await.unwrap();
    assert_eq!((now.uid, now.gid), (65534, 65534));
    assert_eq!(read_all(b, "owned.txt").await, b"Version two");
}

async fn setattr_owners_symlink_times_and_limits(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"f", b"data");
    let a = r.stat(&rp("f")).await.unwrap();
    let same = r
        .setattr(
            &rp("f"),
            SetAttr {
                uid: Some(a.uid),
                gid: Some(a.gid),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (same.uid, same.gid),
        (a.uid, a.gid),
        "chown to its own owner"
    );

    b.sb.symlink(b"f", b"ln");
    let t = 1_500_000_000_000_000_123i64;
    let l = r
        .setattr(
            &rp("ln"),
            SetAttr {
                mtime_ns: Some(t),
                atime_ns: Some(t),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (l.kind, l.mtime_ns),
        (FileKind::Symlink, t),
        "the link's own times"
    );
    assert_ne!(
        r.stat(&rp("f")).await.unwrap().mtime_ns,
        t,
        "the target's times are untouched"
    );
    assert_eq!(
        b.sb.lstat(b"ln").unwrap().mtime_ns,
        t,
        "as the sandbox sees it"
    );
    assert!(matches!(
        r.setattr(
            &rp("ln"),
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )
        .await,
        Err(RemoteError::Unsupported(_))
    ));
    assert_eq!(
        r.stat(&rp("f")).await.unwrap().mode,
        a.mode,
        "target mode kept"
    );
    // A chown through a symlink changes the link's owner, not the target's.
    let lo = r
        .setattr(
            &rp("ln"),
            SetAttr {
                uid: Some(l.uid),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(lo.kind, FileKind::Symlink);

    for size in [u64::MAX, 1 << 63] {
        let err = r
            .setattr(
                &rp("f"),
                SetAttr {
                    size: Some(size),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RemoteError::FileTooBig(_)), "{size}: {err:?}");
        assert_eq!(err.errno(), libc::EFBIG);
    }
    assert_eq!(read_all(b, "f").await, b"data");
}

/// A commit's new content keeps the file's extended attributes (a whole file and a patch),
/// as a write in place would: an edit through the mount does not strip them.
async fn commits_keep_extended_attributes(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"x.txt", b"old");
    let f = rp("x.txt");
    r.setxattr(&f, b"user.tag", b"kept", XattrFlags::default())
        .await
        .unwrap();
    let v = r.stat(&f).await.unwrap().version;
    let a = r
        .commit(&f, whole(b"new".to_vec()), based_on(v))
        .await
        .unwrap();
    assert_eq!(r.getxattr(&f, b"user.tag").await.unwrap(), b"kept");
    r.commit(&f, patch(u64::MAX, 3, vec![(0, b"N")]), based_on(a.version))
        .await
        .unwrap();
    assert_eq!(r.getxattr(&f, b"user.tag").await.unwrap(), b"kept");
    assert_eq!(b.sb.read(b"x.txt"), b"New");
}

async fn xattrs_round_trip_without_following_symlinks(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"f", b"data");
    let f = rp("f");
    let none = XattrFlags::default();
    let create = XattrFlags {
        create: true,
        replace: false,
    };
    let replace = XattrFlags {
        create: false,
        replace: true,
    };
    assert!(matches!(
        r.getxattr(&f, b"user.sbxfs").await,
        Err(RemoteError::NoAttr(_))
    ));
    assert_eq!(
        r.getxattr(&f, b"user.sbxfs").await.unwrap_err().errno(),
        libc::ENODATA
    );
    assert!(matches!(
        r.setxattr(&f, b"user.sbxfs", b"v", replace).await,
        Err(RemoteError::NoAttr(_))
    ));
    let value: Vec<u8> = (0..=255u8).collect(); // not UTF-8
    r.setxattr(&f, b"user.sbxfs", &value, create).await.unwrap();
    assert_eq!(r.getxattr(&f, b"user.sbxfs").await.unwrap(), value);
    assert!(matches!(
        r.setxattr(&f, b"user.sbxfs", b"again", create).await,
        Err(RemoteError::Exists(_))
    ));
    r.setxattr(&f, b"user.sbxfs", b"replaced", replace)
        .await
        .unwrap();
    r.setxattr(&f, b"user.empty", b"", none).await.unwrap();
    assert_eq!(r.getxattr(&f, b"user.sbxfs").await.unwrap(), b"replaced");
    assert_eq!(r.getxattr(&f, b"user.empty").await.unwrap(), b"");
    let mut names = r.listxattr(&f).await.unwrap();
    names.retain(|n| n.starts_with(b"user."));
    names.sort();
    assert_eq!(names, vec![b"user.empty".to_vec(), b"user.sbxfs".to_vec()]);
    r.removexattr(&f, b"user.empty").await.unwrap();
    assert!(matches!(
        r.removexattr(&f, b"user.empty").await,
        Err(RemoteError::NoAttr(_))
    ));
    // Through a symlink: the link's own attributes (user.* has none on a link), not the file's.
    b.sb.symlink(b"f", b"ln");
    assert!(r.getxattr(&rp("ln"), b"user.sbxfs").await.is_err());
    // The root and a directory have attributes too.
    r.mkdir(&rp("d"), 0o755).await.unwrap();
    r.setxattr(&rp("d"), b"user.d", b"dir", none).await.unwrap();
    assert_eq!(r.getxattr(&rp("d"), b"user.d").await.unwrap(), b"dir");
    r.setxattr(&RemotePath::root(), b"user.root", b"r", none)
        .await
        .unwrap();
    assert_eq!(
        r.getxattr(&RemotePath::root(), b"user.root").await.unwrap(),
        b"r"
    );
    // Bounds.
    let long_name = [b"user.".to_vec(), vec![b'n'; 251]].concat();
    assert!(matches!(
        r.setxattr(&f, &long_name, b"v", none).await,
        Err(RemoteError::NameTooLong(_))
    ));
    assert!(matches!(
        r.setxattr(&f, b"user.big", &vec![0u8; 64 * 1024 + 1], none)
            .await,
        Err(RemoteError::TooLarge(_))
    ));
    assert!(matches!(
        r.getxattr(&rp("missing"), b"user.x").await,
        Err(RemoteError::NotFound(_))
    ));
}

async fn fallocate_grows_or_keeps_the_size(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"f", b"0123456789");
    let kept = r.fallocate(&rp("f"), 0, 1 << 20, true).await.unwrap();
    assert_eq!(kept.size, 10, "KEEP_SIZE");
    let grown = r.fallocate(&rp("f"), 4096, 8192, false).await.unwrap();
    assert_eq!(grown.size, 4096 + 8192);
    let got = read_all(b, "f").await;
    assert_eq!(&got[..10], b"0123456789", "the content does not change");
    assert!(got[10..].iter().all(|&c| c == 0));
    assert_eq!(r.stat(&rp("f")).await.unwrap().size, 12_288);
    assert!(matches!(
        r.fallocate(&rp("missing"), 0, 1, false).await,
        Err(RemoteError::NotFound(_))
    ));
    r.mkdir(&rp("d"), 0o755).await.unwrap();
    assert!(matches!(
        r.fallocate(&rp("d"), 0, 1, false).await,
        Err(RemoteError::IsDir(_))
    ));
}

async fn copy_range_is_an_atomic_commit_of_the_destination(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"src", b"0123456789");
    b.sb.write(b"dst", b"abcdefghij");
    let before = r.stat(&rp("dst")).await.unwrap();
    let (n, a) = r
        .copy_range(
            &rp("src"),
            2,
            &rp("dst"),
            5,
            3,
            Some(before.version.clone()),
        )
        .await
        .unwrap();
    assert_eq!((n, a.size), (3, 10));
    assert_eq!(read_all(b, "dst").await, b"abcde234ij");
    assert_ne!(a.version, before.version);
    // Past the source's end: fewer bytes; past the destination's end: it grows (a hole between).
    let (n, a) = r
        .copy_range(&rp("src"), 8, &rp("dst"), 12, 100, Some(a.version))
        .await
        .unwrap();
    assert_eq!((n, a.size), (2, 14));
    assert_eq!(read_all(b, "dst").await, b"abcde234ij\0\089");
    // Without a base: no check.
    let (n, _) = r
        .copy_range(&rp("src"), 0, &rp("dst"), 0, 1, None)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // A stale base: a conflict, nothing written.
    let err = r
        .copy_range(&rp("src"), 0, &rp("dst"), 0, 5, Some(before.version))
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err:?}");
    assert_eq!(read_all(b, "dst").await, b"0bcde234ij\0\089");
    assert!(matches!(
        r.copy_range(&rp("missing"), 0, &rp("dst"), 0, 5, None)
            .await,
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        r.copy_range(&rp("src"), 0, &rp("nodst"), 0, 5, None).await,
        Err(RemoteError::NotFound(_))
    ));
    assert_no_temp_files(&*b.sb);
}

async fn paths_deeper_than_path_max_work(b: &Backend) {
    let r = &b.remote;
    // 24 levels of 200-byte names: about 4,800 bytes, past PATH_MAX (4096).
    let name = "d".repeat(200);
    let mut dir = RemotePath::root();
    for _ in 0..24 {
        dir = dir.join(name.as_bytes()).unwrap();
        assert_eq!(r.mkdir(&dir, 0o755).await.unwrap().kind, FileKind::Dir);
    }
    assert!(dir.as_bytes().len() > 4096);
    let file = dir.join(b"f.txt").unwrap();
    let a = r.create(&file, 0o644).await.unwrap();
    assert_eq!(a.kind, FileKind::File);
    let a = r
        .commit(&file, whole(b"deep".to_vec()), based_on(a.version))
        .await
        .unwrap();
    assert_eq!(r.stat(&file).await.unwrap().size, 4);
    assert_eq!(r.read(&file, 0, 100).await.unwrap().data, &b"deep"[..]);
    let names: Vec<Vec<u8>> = r
        .list(&dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.0)
        .collect();
    assert_eq!(names, vec![b"f.txt".to_vec()]);
    let tree: Vec<Vec<u8>> = r
        .tree(&RemotePath::root())
        .await
        .unwrap()
        .map(|e| e.unwrap().path.0)
        .collect()
        .await;
    assert_eq!(tree.len(), 25, "24 directories and the file");
    assert_eq!(tree.last().unwrap(), file.as_bytes());
    let moved = dir.join(b"g.txt").unwrap();
    r.rename(&file, &moved, RenameMode::NoReplace)
        .await
        .unwrap();
    r.commit(&moved, patch(4, 6, vec![(4, b"er")]), based_on(a.version))
        .await
        .unwrap();
    assert_eq!(r.read(&moved, 0, 100).await.unwrap().data, &b"deeper"[..]);
    // The queries on one file work there too.
    assert_eq!(r.edit(&moved, "deep", "DEEP", false).await.unwrap(), 1);
    let window = r
        .scan(
            &moved,
            ScanRequest {
                start_line: 1,
                end_line: None,
                max_bytes: 1024,
            },
        )
        .await
        .unwrap();
    assert_eq!(window.lines, vec![b"DEEPer".to_vec()]);
    assert!(matches!(r.stat(&file).await, Err(RemoteError::NotFound(_))));
    r.unlink(&moved).await.unwrap();
    // Too deep even for us: refused by name, not by a failed call.
    let mut too_deep = Vec::new();
    while too_deep.len() <= MAX_PATH_BYTES {
        too_deep.extend_from_slice(b"abcdefgh/");
    }
    too_deep.pop();
    assert!(matches!(
        RemotePath::new(too_deep),
        Err(RemoteError::NameTooLong(_))
    ));
    while !dir.is_root() {
        r.rmdir(&dir).await.unwrap();
        dir = dir.split_last().unwrap().0;
    }
    assert!(r.list(&RemotePath::root()).await.unwrap().is_empty());
}

/// A tmpfs mounted inside the workspace: two files there and beside it differ by their device,
/// which versions name. Agent only (a real OS); skipped, with the reason printed, where
/// mounting is not allowed.
async fn versions_name_the_device(b: &Backend) {
    let r = &b.remote;
    let root = b.real_root.as_ref().expect("agent only");
    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "sbxfs-test"])
        .arg(&mnt)
        .stderr(std::process::Stdio::piped())
        .output();
    match ok {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "skipping versions_name_the_device: mount failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipping versions_name_the_device: cannot run mount: {e}");
            return;
        }
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    b.sb.write(b"here", b"same");
    fs::write(mnt.join("there"), "same").unwrap();
    let here = r.stat(&rp("here")).await.unwrap();
    let there = r.stat(&rp("mnt/there")).await.unwrap();
    assert_ne!(here.dev, there.dev, "two filesystems, two devices");
    assert_ne!(here.version, there.version);
    assert!(there.version.0.contains(&format!("{:x}", there.ino)));
    // A commit there checks its base with the same versions.
    let a = r
        .commit(
            &rp("mnt/there"),
            whole(b"new".to_vec()),
            based_on(there.version.clone()),
        )
        .await
        .unwrap();
    assert_eq!(a.dev, there.dev);
    assert!(matches!(
        r.commit(
            &rp("mnt/there"),
            whole(b"x".to_vec()),
            based_on(here.version)
        )
        .await,
        Err(RemoteError::Conflict { .. })
    ));
}

/// Replace `path` by rename, as a program in the sandbox saves: the new file is another inode.
fn replace_by_rename(b: &Backend, path: &str, data: &[u8]) {
    let temp = format!("{path}.new");
    b.sb.write(temp.as_bytes(), data);
    b.sb.rename(temp.as_bytes(), path.as_bytes());
}

async fn reads_never_mix_a_replaced_file_with_its_successor(b: &Backend) {
    let r = &b.remote;
    b.sb.write(b"f", &[b'A'; 200_000]);
    let v1 = r.stat(&rp("f")).await.unwrap().version;
    let first = r.read_held(&rp("f"), 0, 4096, &v1).await.unwrap();
    assert_eq!((&first.data[..], &first.version), (&[b'A'; 4096][..], &v1));
    replace_by_rename(b, "f", &[b'B'; 200_000]);
    // The same number of bytes, so only the version tells the files apart: the answer is
    // the first file's bytes under its version (a sandbox that still holds it) or the new
    // file's under another one, never one file's bytes under the other's version.
    let later = r.read_held(&rp("f"), 100_000, 4096, &v1).await.unwrap();
    if later.version == v1 {
        assert_eq!(&later.data[..], &[b'A'; 4096][..]);
    } else {
        assert_eq!(&later.data[..], &[b'B'; 4096][..]);
        assert_eq!(later.version, r.stat(&rp("f")).await.unwrap().version);
    }
    // A plain read is of what the name holds now.
    let now = r.read(&rp("f"), 0, 10).await.unwrap();
    assert_eq!(&now.data[..], b"BBBBBBBBBB");
}

/// Agent only: the agent holds the file a mount reads, so a reader's file replaced by rename
/// or removed in the sandbox keeps its bytes, as an open file does on a local disk.
async fn held_reads_keep_a_replaced_or_removed_file(b: &Backend) {
    let r = &b.remote;
    let old: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    b.sb.write(b"f", &old);
    let v1 = r.stat(&rp("f")).await.unwrap().version;
    r.read_held(&rp("f"), 0, 4096, &v1).await.unwrap();
    replace_by_rename(b, "f", &[b'B'; 300_000]);
    let got = r.read_held(&rp("f"), 200_000, 65_536, &v1).await.unwrap();
    assert_eq!(got.version, v1);
    assert_eq!(&got.data[..], &old[200_000..265_536]);
    // The new file is read under its own version, and held in turn; removed, it still reads.
    let v2 = r.stat(&rp("f")).await.unwrap().version;
    assert_ne!(v1, v2);
    let new = r.read_held(&rp("f"), 0, 100, &v2).await.unwrap();
    assert_eq!((&new.data[..], &new.version), (&[b'B'; 100][..], &v2));
    b.sb.remove(b"f");
    let gone = r.read_held(&rp("f"), 299_900, 1000, &v2).await.unwrap();
    assert_eq!((&gone.data[..], &gone.version), (&[b'B'; 100][..], &v2));
    // Changed in place, the held file's version is no longer the one asked for: the answer
    // is what the name holds now.
    b.sb.write(b"g", b"one");
    let g1 = r.stat(&rp("g")).await.unwrap().version;
    r.read_held(&rp("g"), 0, 10, &g1).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    b.sb.write(b"g", b"two!");
    let g2 = r.read_held(&rp("g"), 0, 10, &g1).await.unwrap();
    assert_eq!(&g2.data[..], b"two!");
    assert_ne!(g2.version, g1);
    assert!(matches!(
        r.read_held(&rp("never"), 0, 10, &g1).await,
        Err(RemoteError::NotFound(_))
    ));
}

/// Agent only (a real ext4 or tmpfs): a file made under the inode number a removed one had is
/// another file: another birth time and version, the same in every answer that names it.
async fn a_file_made_under_a_freed_inode_number_is_another_file(b: &Backend) {
    let r = &b.remote;
    let root = b.real_root.as_ref().expect("agent only");
    let mut reused = false;
    for _ in 0..50 {
        fs::write(root.join("f"), b"same").unwrap();
        let a1 = r.stat(&rp("f")).await.unwrap();
        fs::remove_file(root.join("f")).unwrap();
        fs::write(root.join("f"), b"same").unwrap();
        let a2 = r.stat(&rp("f")).await.unwrap();
        assert_ne!(a1.version, a2.version, "{a1:?} {a2:?}");
        if a1.ino == a2.ino {
            assert_ne!(a1.born_ns, a2.born_ns, "{a1:?} {a2:?}");
            reused = true;
            // The listings name it the same way as stat does.
            let listed = r.list(&RemotePath::root()).await.unwrap();
            let entry = listed.iter().find(|e| e.name.0 == b"f").unwrap();
            assert_eq!(
                (entry.attr.born_ns, &entry.attr.version),
                (a2.born_ns, &a2.version)
            );
            break;
        }
        fs::remove_file(root.join("f")).unwrap();
    }
    let fs_type = rustix::fs::statfs(root).unwrap().f_type as i64;
    // tmpfs never hands out a number again; ext4 does at once.
    assert!(
        reused || fs_type == 0x0102_1994,
        "no file got a freed inode number in 50 tries (filesystem {fs_type:#x})"
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
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    held_reads_keep_a_replaced_or_removed_file,
    a_file_made_under_a_freed_inode_number_is_another_file,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
    // Agent only: a tmpfs mounted inside the real workspace.
    versions_name_the_device,
);

conformance!(memory_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
);

/// The agent over https (`--tls-cert`), reached through `connect()` with `--ca-file`: the
/// remote every mount of an https URL gets (TLS, the retry and deadline wrapper).
fn https_backend() -> Backend {
    let ca = common::testca::TestCa::new().expect("the openssl CLI (scripts/install-deps.sh)");
    let server = ca.server("agent", &["IP:127.0.0.1", "DNS:localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let (cert, key) = (
        server.cert.display().to_string(),
        server.key.display().to_string(),
    );
    let agent = AgentProcess::start_with_args(
        &root,
        "conformance-token-0123456789",
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    assert!(agent.url.starts_with("https://"), "{}", agent.url);
    let opts = sbxfs::remote::connect::ConnectOptions {
        token: Some(agent.token.clone()),
        ca_file: Some(ca.ca.clone()),
        ..Default::default()
    };
    let connected = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current()
            .block_on(sbxfs::remote::connect::connect(&agent.url, &opts))
    })
    .unwrap_or_else(|e| panic!("connect {}: {e}", agent.url));
    assert_eq!(connected.transport, "https");
    Backend {
        remote: connected.remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((agent, dir, ca)),
    }
}

conformance!(https_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    held_reads_keep_a_replaced_or_removed_file,
    a_file_made_under_a_freed_inode_number_is_another_file,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
    versions_name_the_device,
);

/// The exec-only scripts over `argv` (a command that runs a shell), on a real directory.
fn script_backend(argv: Vec<String>) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let runner = Arc::new(sbxfs::remote::exec::CommandRunner::new(argv).unwrap());
    let remote =
        sbxfs::remote::exec::script_remote(runner, root.as_os_str().as_bytes().to_vec()).unwrap();
    Backend {
        remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new(dir),
    }
}

/// `shell:`: the scripts over the `sh` in PATH (dash on Debian) with GNU coreutils.
fn shell_backend() -> Backend {
    script_backend(vec!["sh".into()])
}

/// The scripts over busybox alone: its `sh` and its applets are all PATH holds.
fn busybox_shell_backend() -> Backend {
    let tools = tempfile::tempdir().unwrap();
    let busybox = which_busybox();
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        std::os::unix::fs::symlink(&busybox, tools.path().join(applet)).unwrap();
    }
    let path = format!("PATH={}", tools.path().display());
    let mut b = script_backend(vec!["env".into(), path, "sh".into()]);
    b._keep = Box::new((b._keep, tools));
    b
}

fn which_busybox() -> PathBuf {
    ["/usr/bin/busybox", "/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox is installed (scripts/install-deps.sh)")
}

/// `exec:` through `connect`, the shell reached through a command (`sh -c 'exec sh'`) as a
/// provider's CLI would.
fn exec_backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let url = format!("exec:{}?agent=no", root.display());
    let opts = sbxfs::remote::connect::ConnectOptions {
        exec: Some("sh -c 'exec sh'".into()),
        ..Default::default()
    };
    let connected = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(sbxfs::remote::connect::connect(&url, &opts))
    })
    .unwrap();
    assert_eq!(connected.transport, "exec");
    assert_eq!(connected.scripts_by.as_deref(), Some("one python3 session"));
    Backend {
        remote: connected.remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((dir, connected.keep)),
    }
}

/// `shell:` and `exec:` as `connect` makes them by default: the agent deployed through the
/// channel and spoken to over its standard input and output.
fn stdio_agent_backend(scheme: &str, exec: Option<&str>) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let url = format!("{scheme}:{}", root.display());
    let opts = sbxfs::remote::connect::ConnectOptions {
        exec: exec.map(str::to_string),
        deploy_binary: Some(env!("CARGO_BIN_EXE_sbxfs").into()),
        ..Default::default()
    };
    let connected = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(sbxfs::remote::connect::connect(&url, &opts))
    })
    .unwrap();
    assert_eq!(connected.transport, format!("{scheme}+agent"));
    Backend {
        remote: connected.remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((dir, connected.keep)),
    }
}

fn shell_agent_backend() -> Backend {
    stdio_agent_backend("shell", None)
}

/// Through a command that runs the shell (`sh -c 'exec sh'`), as a provider's CLI would.
fn exec_agent_backend() -> Backend {
    stdio_agent_backend("exec", Some("sh -c 'exec sh'"))
}

conformance!(shell_agent_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    held_reads_keep_a_replaced_or_removed_file,
    a_file_made_under_a_freed_inode_number_is_another_file,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
    // Agent only: a tmpfs mounted inside the real workspace.
    versions_name_the_device,
);

conformance!(exec_agent_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    held_reads_keep_a_replaced_or_removed_file,
    a_file_made_under_a_freed_inode_number_is_another_file,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
    // Agent only: a tmpfs mounted inside the real workspace.
    versions_name_the_device,
);

conformance!(shell_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the scripts leave has_xattrs unknown
    // (None: the mount asks), as a getfattr per listed file would cost a process each.
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    // paths_deeper_than_path_max_work: the shell tools take whole paths, which the kernel
    // refuses past PATH_MAX (ENAMETOOLONG).
    versions_name_the_device,
);

conformance!(exec_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the scripts leave has_xattrs unknown
    // (None: the mount asks), as a getfattr per listed file would cost a process each.
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    // paths_deeper_than_path_max_work: the shell tools take whole paths, which the kernel
    // refuses past PATH_MAX (ENAMETOOLONG).
    versions_name_the_device,
);

// busybox's stat and touch know whole seconds only, and its fallocate has no --keep-size:
// stat_list_and_tree, namespace_operations_and_their_errors,
// setattr_owners_symlink_times_and_limits and fallocate_grows_or_keeps_the_size pin
// nanoseconds or keep-size, and are left out.
conformance!(busybox_shell_backend:
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the scripts leave has_xattrs unknown
    // (None: the mount asks), as a getfattr per listed file would cost a process each.
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    // mknod_makes_fifos_sockets_and_devices_when_allowed, rename_exchanges_and_refuses_to_replace:
    // sockets and renameat2 need python3, which a busybox-only sandbox has not.
    modes_are_exactly_those_asked,
    // xattrs_round_trip_without_following_symlinks: busybox has no getfattr/setfattr
    // (Unsupported, pinned in tests/exec_remote.rs).
    copy_range_is_an_atomic_commit_of_the_destination,
    // paths_deeper_than_path_max_work: the shell tools take whole paths, which the kernel
    // refuses past PATH_MAX (ENAMETOOLONG).
    versions_name_the_device,
);

// ---- The scripts through one persistent session (src/remote/exec/session.rs): the `sh` loop
// where python3 is not there (dash with GNU tools; busybox alone); python3's server is
// exec_backend's.

/// The exec-only scripts through one session on `argv`, served by `server`.
fn script_session_backend(
    argv: Vec<String>,
    server: sbxfs::remote::exec::session::Server,
) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let runner = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current()
            .block_on(sbxfs::remote::exec::session::SessionRunner::start(argv))
    })
    .unwrap();
    assert_eq!(runner.server(), Some(server));
    let remote =
        sbxfs::remote::exec::script_remote(Arc::new(runner), root.as_os_str().as_bytes().to_vec())
            .unwrap();
    Backend {
        remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new(dir),
    }
}

/// The `sh` loop under dash, GNU tools beside it.
fn dash_session_backend() -> Backend {
    script_session_backend(
        vec![
            "env".into(),
            "SBXFS_SESSION_NO_PYTHON=1".into(),
            "sh".into(),
        ],
        sbxfs::remote::exec::session::Server::Sh,
    )
}

/// The `sh` loop under busybox's ash, with its applets alone.
fn busybox_session_backend() -> Backend {
    let tools = tempfile::tempdir().unwrap();
    let busybox = which_busybox();
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        std::os::unix::fs::symlink(&busybox, tools.path().join(applet)).unwrap();
    }
    let path = format!("PATH={}", tools.path().display());
    let mut b = script_session_backend(
        vec!["env".into(), path, "sh".into()],
        sbxfs::remote::exec::session::Server::Sh,
    );
    b._keep = Box::new((b._keep, tools));
    b
}

conformance!(dash_session_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the scripts leave has_xattrs unknown
    // (None: the mount asks), as a getfattr per listed file would cost a process each.
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    // paths_deeper_than_path_max_work: the shell tools take whole paths, which the kernel
    // refuses past PATH_MAX (ENAMETOOLONG).
    versions_name_the_device,
);

conformance!(busybox_session_backend:
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the scripts leave has_xattrs unknown
    // (None: the mount asks), as a getfattr per listed file would cost a process each.
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    // mknod_makes_fifos_sockets_and_devices_when_allowed, rename_exchanges_and_refuses_to_replace:
    // sockets and renameat2 need python3, which a busybox-only sandbox has not.
    modes_are_exactly_those_asked,
    // xattrs_round_trip_without_following_symlinks: busybox has no getfattr/setfattr
    // (Unsupported, pinned in tests/exec_remote.rs).
    copy_range_is_an_atomic_commit_of_the_destination,
    // paths_deeper_than_path_max_work: the shell tools take whole paths, which the kernel
    // refuses past PATH_MAX (ENAMETOOLONG).
    versions_name_the_device,
);

/// The agent sbxfs deploys over ssh, reached through the ssh channel (a private sshd on
/// 127.0.0.1; the workspace is on this machine, so the checks about a real OS apply).
fn ssh_backend() -> Backend {
    // One deploy at a time: each uploads the whole debug binary (hundreds of MB), and two dozen
    // at once on two cores only measure the machine.
    static DEPLOYING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = DEPLOYING.lock().unwrap_or_else(|p| p.into_inner());
    let b = common::sshbox::SshBox::start();
    let c = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current()
            .block_on(sbxfs::remote::connect::connect(&b.url(""), &b.options()))
    })
    .unwrap();
    assert_eq!(c.transport, "ssh+agent");
    let root = b.root.clone();
    Backend {
        remote: c.remote.clone(),
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((c.remote, c.keep, b)),
    }
}

conformance!(ssh_backend:
    commits_keep_extended_attributes,
    commits_keep_the_mtime_they_name,
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    stat_list_and_tree_tell_whether_xattrs_exist,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    held_reads_keep_a_replaced_or_removed_file,
    a_file_made_under_a_freed_inode_number_is_another_file,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    change_feed_sees_writes_made_in_the_sandbox,
    change_feed_reports_lost_events,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    setattr_owners_symlink_times_and_limits,
    commits_keep_the_owner,
    xattrs_round_trip_without_following_symlinks,
    fallocate_grows_or_keeps_the_size,
    copy_range_is_an_atomic_commit_of_the_destination,
    paths_deeper_than_path_max_work,
    versions_name_the_device,
);

use crate::common::boxserver;

/// The `agentscope` transport: a real agentscope-runtime box server on loopback (its
/// WORKSPACE_DIR the sandbox side). `None` only when the box server is not installed and
/// missing tools are allowed.
fn agentscope_backend() -> Option<Backend> {
    let server = boxserver::BoxServer::start(None)?;
    let opts = sbxfs::remote::connect::ConnectOptions {
        token: Some(server.token.clone()),
        ..Default::default()
    };
    let url = format!("{}{}", server.url(), server.workspace.display());
    let connected = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(sbxfs::remote::connect::connect(&url, &opts))
    });
    let c = match connected {
        Ok(c) => c,
        Err(e) => panic!("{url}: {e}"),
    };
    assert_eq!(c.transport, "agentscope");
    let root = server.workspace.clone();
    Some(Backend {
        remote: c.remote,
        sb: Box::new(RealDir(root.clone())),
        real_root: Some(root),
        _keep: Box::new((server, c.keep)),
    })
}

/// Like `conformance!`, for a backend that may not be available (then each check says so).
macro_rules! conformance_if_available {
    ($backend:ident: $($check:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let Some(b) = super::$backend() else { return };
                    super::$check(&b).await;
                }
            )*
        }
    };
}

conformance_if_available!(agentscope_backend:
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    // stat_list_and_tree_tell_whether_xattrs_exist: the exec scripts leave has_xattrs unknown.
    ranged_reads_carry_the_version,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    namespace_operations_and_their_errors,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    // change_feed_*: exec transports have no feed (capabilities.feed = false; the mount polls).
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
);

// ---- The python3 fast path of the exec-only transports (src/remote/exec/pyfast.rs): where
// python3 runs in the sandbox, stat / list / tree say whether each entry has xattrs, and a
// busybox-only sandbox gets nanosecond times (its scripts' `stat -c` goes through python too,
// so versions agree everywhere). Paths past PATH_MAX: stat / list / tree only, pinned in
// tests/exec_fastpath.rs (mkdir, commit and the rest still take whole paths).

/// The real python3 of this machine (a pyenv shim resolved), to link into a bare PATH.
fn real_python3() -> PathBuf {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys; sys.stdout.write(os.path.realpath(sys.executable))",
        ])
        .output()
        .expect("python3 is installed (scripts/install-deps.sh)");
    assert!(out.status.success());
    PathBuf::from(String::from_utf8(out.stdout).unwrap())
}

/// `shell:` where python3 is in PATH (as on this machine): the fast path answers.
fn shell_python_backend() -> Backend {
    real_python3();
    shell_backend()
}

/// `exec:` where python3 is in PATH.
fn exec_python_backend() -> Backend {
    real_python3();
    exec_backend()
}

/// busybox's applets and python3, nothing else.
fn busybox_python_shell_backend() -> Backend {
    let tools = tempfile::tempdir().unwrap();
    let busybox = which_busybox();
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        std::os::unix::fs::symlink(&busybox, tools.path().join(applet)).unwrap();
    }
    std::os::unix::fs::symlink(real_python3(), tools.path().join("python3")).unwrap();
    let path = format!("PATH={}", tools.path().display());
    let mut b = script_backend(vec!["env".into(), path, "sh".into()]);
    b._keep = Box::new((b._keep, tools));
    b
}

conformance!(shell_python_backend: stat_list_and_tree_tell_whether_xattrs_exist);

conformance!(exec_python_backend: stat_list_and_tree_tell_whether_xattrs_exist);

// stat_list_and_tree pins nanosecond mtimes; the others check versions made by the fast path
// against those the read / commit scripts make. (busybox has no setfattr: no xattr checks;
// its touch sets whole seconds: no setattr checks.)
conformance!(busybox_python_shell_backend:
    stat_list_and_tree,
    tree_listings_are_breadth_first_and_capped,
    ranged_reads_carry_the_version,
    reads_never_mix_a_replaced_file_with_its_successor,
    commits_replace_whole_files_atomically_and_keep_mode,
    patch_commits_apply_ranges_over_the_base,
    awkward_names_round_trip,
    path_escapes_are_refused,
    queries_run_next_to_the_data,
    stat_many_answers_each_path_in_order,
    create_only_commits_never_replace,
    hard_links_made_in_the_sandbox_share_an_inode,
    patches_cut_before_they_write,
    a_patch_cut_to_nothing_creates_its_file,
    hard_links_share_content_and_survive_commits,
    mknod_makes_fifos_sockets_and_devices_when_allowed,
    rename_exchanges_and_refuses_to_replace,
    modes_are_exactly_those_asked,
    copy_range_is_an_atomic_commit_of_the_destination,
);
