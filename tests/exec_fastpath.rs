//! The python3 fast path of the exec-only transports (`src/remote/exec/pyfast.rs`) against the
//! sh scripts it stands in for: the same answers (attributes, versions, symlink targets, errors)
//! for awkward names, symlinks and fifos; paths past PATH_MAX for stat / list / tree; and what
//! a tree of 2,000 files costs either way (printed, not timed).

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures_util::StreamExt;

use sbxfs::remote::exec::session::SessionRunner;
use sbxfs::remote::exec::{script_remote, CommandRunner, Output, RunControl, Runner};
use sbxfs::remote::*;

/// A runner that counts what crosses: program bytes sent, output bytes received, runs, and
/// fast-path calls its own python ran (`inline`).
struct Counting<R = CommandRunner> {
    inner: R,
    sent: AtomicU64,
    received: AtomicU64,
    runs: AtomicU64,
    inline: AtomicU64,
}

impl<R> Counting<R> {
    fn over(inner: R) -> Arc<Counting<R>> {
        Arc::new(Counting {
            inner,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            inline: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl<R: Runner> Runner for Counting<R> {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.sent.fetch_add(program.len() as u64, Ordering::Relaxed);
        let out = self.inner.run(program, ctl).await?;
        self.received.fetch_add(
            (out.stdout.len() + out.stderr.len()) as u64,
            Ordering::Relaxed,
        );
        Ok(out)
    }
    async fn run_python_inline(&self, input: &[u8], ctl: &RunControl) -> Option<Result<Output>> {
        self.inline.fetch_add(1, Ordering::Relaxed);
        self.inner.run_python_inline(input, ctl).await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn counting(argv: &[&str]) -> Arc<Counting> {
    Counting::over(CommandRunner::new(argv.iter().map(|s| s.to_string()).collect()).unwrap())
}

fn remote_over(root: &Path, runner: Arc<dyn Runner>) -> Arc<dyn Remote> {
    script_remote(runner, root.as_os_str().as_bytes().to_vec()).unwrap()
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    (dir, root)
}

/// A PATH with everything of /usr/bin and /bin but python (the sh path then answers).
fn path_without_python(dir: &Path) -> String {
    for bin in ["/usr/bin", "/bin"] {
        for e in fs::read_dir(bin).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name.as_bytes().starts_with(b"python") || dir.join(&name).exists() {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), dir.join(&name)).unwrap();
        }
    }
    format!("PATH={}", dir.display())
}

/// The fast path (python3 in PATH, as on this machine) and the sh path, over one workspace.
struct Pair {
    fast: Arc<dyn Remote>,
    sh: Arc<dyn Remote>,
    fast_runner: Arc<Counting>,
    sh_runner: Arc<Counting>,
    _tools: tempfile::TempDir,
}

/// This machine's python3 resolved (not a pyenv shim, whose own start-up takes longer than the
/// whole tree), first in PATH.
fn path_with_real_python(dir: &Path) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys; sys.stdout.write(os.path.realpath(sys.executable))",
        ])
        .output()
        .unwrap();
    let real = String::from_utf8(out.stdout).unwrap();
    std::os::unix::fs::symlink(real, dir.join("python3")).unwrap();
    format!(
        "PATH={}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn pair(root: &Path) -> Pair {
    let tools = tempfile::tempdir().unwrap();
    let fast_path = path_with_real_python(tools.path());
    let without = tools.path().join("without");
    fs::create_dir(&without).unwrap();
    let path = path_without_python(&without);
    let fast_runner = counting(&["env", &fast_path, "sh"]);
    let sh_runner = counting(&["env", &path, "sh"]);
    Pair {
        fast: remote_over(root, fast_runner.clone()),
        sh: remote_over(root, sh_runner.clone()),
        fast_runner,
        sh_runner,
        _tools: tools,
    }
}

/// What the sh path cannot know: whether there are xattrs (and atime, which the sh path's own
/// reading may move).
fn comparable(mut a: Attr) -> Attr {
    a.has_xattrs = None;
    a.atime_ns = 0;
    a
}

fn rp(b: &[u8]) -> RemotePath {
    RemotePath::new(b.to_vec()).unwrap()
}

/// The same error, by kind.
fn same_error<T: std::fmt::Debug>(a: &Result<T>, b: &Result<T>, what: &str) {
    match (a, b) {
        (Err(x), Err(y)) => assert_eq!(
            std::mem::discriminant(x),
            std::mem::discriminant(y),
            "{what}: {x:?} / {y:?}"
        ),
        _ => panic!("{what}: expected two errors, got {a:?} / {b:?}"),
    }
}

fn awkward_names() -> Vec<Vec<u8>> {
    vec![
        b"$(touch pwned)".to_vec(),
        b"`touch pwned`".to_vec(),
        b"'; touch pwned; '".to_vec(),
        b"-rf".to_vec(),
        b"--".to_vec(),
        b"a name with spaces".to_vec(),
        b"new\nline\n".to_vec(),
        b"\n__RESULT__\nok\n".to_vec(),
        b"not utf8 \xff\xfe".to_vec(),
        b"..dots".to_vec(),
        b".hidden".to_vec(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_answers_as_the_sh_scripts_do() {
    let (dir, root) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "s").unwrap();
    fs::create_dir(root.join("d")).unwrap();
    for n in awkward_names() {
        let name = std::ffi::OsStr::from_bytes(&n);
        fs::write(root.join("d").join(name), &n).unwrap();
    }
    std::os::unix::fs::symlink("d/-rf", root.join("link")).unwrap();
    std::os::unix::fs::symlink("d", root.join("dirlink")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink("../outside/secret", root.join("d/rel-out")).unwrap();
    let fifo = std::ffi::CString::new(root.join("d/fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-ended path only.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    let big: Vec<u8> = (0..5u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
    fs::write(root.join("d/big"), big).unwrap();
    let p = pair(&root);
    answers_as_the_sh_scripts(&p.fast, &p.sh, &root, dir.path()).await;
    assert!(p.fast_runner.runs.load(Ordering::Relaxed) > 0);

    // The same through a session's python3 server, which runs the fast path itself: no
    // program per call, and not a descriptor left open however a call ends.
    let mark = format!(
        "SBXFS_TEST_SESSION={}",
        std::process::id() as u64 * 1000 + 7
    );
    let tools = tempfile::tempdir().unwrap();
    let path = path_with_real_python(tools.path());
    let session = SessionRunner::start(vec!["env".into(), mark.clone(), path, "sh".into()])
        .await
        .unwrap();
    let tally = Counting::over(session);
    let inline = remote_over(&root, tally.clone());
    inline.stat(&RemotePath::root()).await.unwrap();
    // (The first read asks once whether the transport moves files natively: a program.)
    inline.read(&rp(b"d/big"), 0, 1).await.unwrap();
    let server = child_with_env(&mark).expect("the session's python3 server");
    let fds = open_fds(server);
    let programs = tally.runs.load(Ordering::Relaxed);
    for _ in 0..3 {
        answers_as_the_sh_scripts(&inline, &p.sh, &root, dir.path()).await;
    }
    assert_eq!(
        tally.runs.load(Ordering::Relaxed),
        programs,
        "stat, list, tree and reads started no program"
    );
    assert!(tally.inline.load(Ordering::Relaxed) > 30);
    assert_eq!(open_fds(server), fds, "descriptors left open in the server");
}

/// The comparisons of [`the_fast_path_answers_as_the_sh_scripts_do`], of `fast` against `sh`.
async fn answers_as_the_sh_scripts(
    fast: &Arc<dyn Remote>,
    sh: &Arc<dyn Remote>,
    root: &Path,
    dir: &Path,
) {
    // Listings: every directory, same entries and attributes.
    for d in [&b""[..], b"d", b"dirlink"] {
        let path = rp(d);
        let a = fast.list(&path).await.unwrap();
        let b = sh.list(&path).await.unwrap();
        assert!(
            a.iter().all(|e| e.attr.has_xattrs.is_some()),
            "python knows"
        );
        let a: Vec<_> = a
            .into_iter()
            .map(|e| (e.name, comparable(e.attr)))
            .collect();
        let b: Vec<_> = b
            .into_iter()
            .map(|e| (e.name, comparable(e.attr)))
            .collect();
        assert_eq!(a, b, "list {d:?}");
    }
    let names = fast.list(&rp(b"d")).await.unwrap();
    assert_eq!(
        names.len(),
        awkward_names().len() + 3,
        "the names, fifo, rel-out, big"
    );
    assert!(names.iter().any(|e| e.attr.kind == FileKind::Fifo));

    // Trees, whole and from a subdirectory.
    for d in [&b""[..], b"d"] {
        let path = rp(d);
        let (a, b) = (tree_of(fast, &path).await, tree_of(sh, &path).await);
        assert_eq!(a, b, "tree {d:?}");
        assert!(!a.is_empty());
    }

    // stat_many over every name, plus the root, links and what fails.
    let mut paths = vec![RemotePath::root(), rp(b"link"), rp(b"dangling"), rp(b"out")];
    for n in awkward_names() {
        paths.push(rp(b"d").join(&n).unwrap());
        paths.push(rp(b"dirlink").join(&n).unwrap());
    }
    paths.extend([
        rp(b"d/fifo"),
        rp(b"d/rel-out"),
        rp(b"missing"),
        rp(b"d/-rf/under-a-file"),
        rp(b"out/secret"),
        rp(b"d/rel-out/x"),
    ]);
    let a = fast.stat_many(&paths).await.unwrap();
    let b = sh.stat_many(&paths).await.unwrap();
    assert_eq!(a.len(), b.len());
    for ((x, y), path) in a.into_iter().zip(b).zip(&paths) {
        match (x, y) {
            (Ok(x), Ok(y)) => assert_eq!(comparable(x), comparable(y), "{path:?}"),
            (x, y) => same_error(&x, &y, &path.display()),
        }
    }
    assert!(matches!(
        fast.stat(&rp(b"out/secret")).await,
        Err(RemoteError::Access(_))
    ));

    // Reads of every path: the same bytes and version, or the same error.
    for path in paths.iter().chain([&rp(b"d"), &rp(b"dirlink")]) {
        for (offset, len) in [(0, 1 << 20), (1, 3), (1 << 20, 10)] {
            let a = fast.read(path, offset, len).await;
            let b = sh.read(path, offset, len).await;
            match (a, b) {
                (Ok(x), Ok(y)) => {
                    assert_eq!((x.data, x.version), (y.data, y.version), "read {path:?}")
                }
                (x, y) => same_error(&x, &y, &format!("read {path:?}")),
            }
        }
    }
    let big = rp(b"d/big");
    assert_eq!(
        fast.read(&big, 1000, 3 << 20).await.unwrap().data,
        fs::read(root.join("d/big")).unwrap()[1000..][..3 << 20]
    );

    // Listing errors.
    for bad in [&b"missing"[..], b"link", b"out", b"dangling", b"d/fifo"] {
        let path = rp(bad);
        same_error(
            &fast.list(&path).await,
            &sh.list(&path).await,
            &format!("list {bad:?}"),
        );
        same_error(
            &fast.tree(&path).await.map(drop),
            &sh.tree(&path).await.map(drop),
            &format!("tree {bad:?}"),
        );
    }
    assert!(!root.join("pwned").exists() && !dir.join("pwned").exists());
}

/// A tree's paths and comparable attributes.
async fn tree_of(r: &Arc<dyn Remote>, path: &RemotePath) -> Vec<(WireBytes, Attr)> {
    r.tree(path)
        .await
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path, comparable(e.attr))
        })
        .collect()
        .await
}

/// The pid of this process's child whose environment holds `mark`.
fn child_with_env(mark: &str) -> Option<u32> {
    let me = std::process::id().to_string();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid = stat.rsplit(") ").next()?.split(' ').nth(1)?;
        let env = fs::read(e.path().join("environ")).ok()?;
        (ppid == me && env.split(|b| *b == 0).any(|v| v == mark.as_bytes())).then_some(pid)
    })
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The fast path's version of a file is the one its read and commit scripts make: a commit
/// based on a version from the fast path's stat goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_from_the_fast_path_commit() {
    let (_dir, root) = workspace();
    fs::write(root.join("f"), "one").unwrap();
    let p = pair(&root);
    let f = rp(b"f");
    let a = p.fast.stat(&f).await.unwrap();
    assert_eq!(a.version, p.sh.stat(&f).await.unwrap().version);
    assert_eq!(p.fast.read(&f, 0, 10).await.unwrap().version, a.version);
    let data: Box<dyn tokio::io::AsyncRead + Send + Unpin> =
        Box::new(std::io::Cursor::new(b"two".to_vec()));
    let after = p
        .fast
        .commit(
            &f,
            CommitContent::Whole(data),
            CommitOptions {
                base: Some(a.version),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p.fast.stat(&f).await.unwrap().version, after.version);
    assert_eq!(fs::read(root.join("f")).unwrap(), b"two");
}

/// 24 levels of 200-byte names (about 4,800 bytes, past PATH_MAX), made with openat one level
/// at a time: stat, list and tree reach the bottom through the fast path; the
/// sh path fails there (whole paths).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_past_path_max_are_walked_one_directory_at_a_time() {
    let (_dir, root) = workspace();
    let name = "d".repeat(200);
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfor _ in range(24):\n    \
             os.mkdir(sys.argv[2], dir_fd=fd)\n    fd = os.open(sys.argv[2], os.O_RDONLY, dir_fd=fd)\n\
             os.close(os.open(\"f.txt\", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))\n\
             os.symlink(\"f.txt\", \"link\", dir_fd=fd)\n\
             w = os.open(\"f.txt\", os.O_WRONLY, dir_fd=fd)\nos.write(w, b\"deep\")\n",
        )
        .arg(&root)
        .arg(&name)
        .status()
        .unwrap();
    assert!(made.success());
    let p = pair(&root);
    let mut dir = RemotePath::root();
    for _ in 0..24 {
        dir = dir.join(name.as_bytes()).unwrap();
    }
    assert!(dir.as_bytes().len() > 4096);
    let file = dir.join(b"f.txt").unwrap();
    let a = p.fast.stat(&file).await.unwrap();
    assert_eq!((a.kind, a.size), (FileKind::File, 4));
    assert_eq!(a.has_xattrs, Some(false));
    let link = p.fast.stat(&dir.join(b"link").unwrap()).await.unwrap();
    assert_eq!(link.symlink_target, Some(WireBytes(b"f.txt".to_vec())));
    let names: Vec<Vec<u8>> = p
        .fast
        .list(&dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.0)
        .collect();
    assert_eq!(names, vec![b"f.txt".to_vec(), b"link".to_vec()]);
    let tree: Vec<Vec<u8>> = p
        .fast
        .tree(&RemotePath::root())
        .await
        .unwrap()
        .map(|e| e.unwrap().path.0)
        .collect()
        .await;
    assert_eq!(tree.len(), 26, "24 directories, the file and the link");
    assert!(tree[24] == file.as_bytes(), "the file, at the bottom");
    // The sh path takes whole paths, which the kernel refuses there.
    assert!(p.sh.stat(&file).await.is_err());
}

/// A tree of 2,000 files (20 directories of 100) both ways: the same entries; the bytes each
/// way and the wall time are printed (`--nocapture`) for the README, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_two_thousand_files_both_ways() {
    let (_dir, root) = workspace();
    for d in 0..20 {
        let dir = root.join(format!("dir{d:02}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("file{f:03}.txt")), "x").unwrap();
        }
    }
    let p = pair(&root);
    // The probes first, so that only the trees are counted.
    p.fast.info().await.unwrap();
    p.sh.info().await.unwrap();
    let mut measured = Vec::new();
    for (what, r, c) in [
        ("python3", &p.fast, &p.fast_runner),
        ("sh", &p.sh, &p.sh_runner),
    ] {
        let (s0, r0, n0) = (
            c.sent.load(Ordering::Relaxed),
            c.received.load(Ordering::Relaxed),
            c.runs.load(Ordering::Relaxed),
        );
        let t = Instant::now();
        let entries = tree_of(r, &RemotePath::root()).await;
        let took = t.elapsed();
        eprintln!(
            "tree of 2020 entries over shell: with {what}: {} runs, {} bytes sent, {} bytes received, {:?}",
            c.runs.load(Ordering::Relaxed) - n0,
            c.sent.load(Ordering::Relaxed) - s0,
            c.received.load(Ordering::Relaxed) - r0,
            took
        );
        assert_eq!(entries.len(), 2020);
        measured.push(entries);
    }
    assert_eq!(measured[0], measured[1]);
}

/// Two workspaces made alike: awkward names, a symlink out, one back in, a dangling one.
fn alike_workspace(dir: &Path, name: &str, outside: &Path) -> PathBuf {
    let root = dir.join(name);
    fs::create_dir_all(root.join("d/sub")).unwrap();
    for n in awkward_names() {
        fs::write(root.join("d").join(std::ffi::OsStr::from_bytes(&n)), &n).unwrap();
    }
    fs::write(root.join("d/base"), "0123456789").unwrap();
    fs::write(root.join("d/sub/inner"), "inner").unwrap();
    std::os::unix::fs::symlink("d/base", root.join("link")).unwrap();
    std::os::unix::fs::symlink("d", root.join("dirlink")).unwrap();
    std::os::unix::fs::symlink("d/made-through-link", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink(outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink("../../outside/secret", root.join("d/rel-out")).unwrap();
    root
}

/// Every entry below `root`: its path, kind, size, permission bits, and its bytes or target.
fn snapshot(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("link {:?}", fs::read_link(&p).unwrap())
            } else if m.is_dir() {
                todo.push(p.clone());
                format!("dir {:o}", m.permissions().mode() & 0o7777)
            } else if m.is_file() {
                format!(
                    "file {:o} {:?}",
                    m.permissions().mode() & 0o7777,
                    fs::read(&p).unwrap()
                )
            } else {
                format!("other {:o}", m.permissions().mode())
            };
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), what));
        }
    }
    out.sort();
    out
}

fn bytes(b: &[u8]) -> CommitContent {
    CommitContent::Whole(Box::new(std::io::Cursor::new(b.to_vec())))
}

/// The same changes made through each path, one by one: the same answers (attributes, or the
/// error by kind), and workspaces that end alike; nothing outside is touched either way.
async fn changes(r: &Arc<dyn Remote>) -> Vec<String> {
    use RenameMode::*;
    let mut said = Vec::new();
    let mut note = |what: &str, r: Result<String>| {
        said.push(match r {
            Ok(a) => format!("{what}: ok {a}"),
            Err(e) => format!("{what}: {:?}", std::mem::discriminant(&e)),
        })
    };
    let shown = |a: &Attr| format!("{:?}", (a.kind, a.size, a.mode, &a.symlink_target));
    let some = |r: Result<Attr>| r.map(|a| shown(&a));
    let none = |r: Result<()>| r.map(|()| String::new());
    for n in awkward_names() {
        let p = rp(b"d").join(&n).unwrap();
        note(
            "commit awkward",
            some(r.commit(&p, bytes(b"new"), Default::default()).await),
        );
        let to = rp(b"d/sub").join(&n).unwrap();
        note("rename awkward", none(r.rename(&p, &to, Replace).await));
    }
    let absent = || CommitOptions {
        base: Some(Version::absent()),
        create_mode: Some(0o640),
        ..Default::default()
    };
    note(
        "create-only new",
        some(r.commit(&rp(b"d/new"), bytes(b"n"), absent()).await),
    );
    note(
        "create-only again",
        some(r.commit(&rp(b"d/new"), bytes(b"m"), absent()).await),
    );
    note(
        "commit through link",
        some(
            r.commit(&rp(b"link"), bytes(b"via link"), Default::default())
                .await,
        ),
    );
    note(
        "commit through dangling",
        some(
            r.commit(&rp(b"dangling"), bytes(b"made"), Default::default())
                .await,
        ),
    );
    note(
        "commit out",
        some(
            r.commit(&rp(b"out/secret"), bytes(b"x"), Default::default())
                .await,
        ),
    );
    note(
        "commit rel-out",
        some(
            r.commit(&rp(b"d/rel-out"), bytes(b"x"), Default::default())
                .await,
        ),
    );
    note(
        "commit a dir",
        some(
            r.commit(&rp(b"d/sub"), bytes(b"x"), Default::default())
                .await,
        ),
    );
    let patch = CommitContent::Patch {
        cut: 4,
        new_len: 12,
        ranges: vec![
            (2, bytes::Bytes::from_static(b"AB")),
            (9, bytes::Bytes::from_static(b"Z")),
        ],
    };
    note(
        "patch",
        some(r.commit(&rp(b"d/base"), patch, Default::default()).await),
    );
    note(
        "copy_range",
        r.copy_range(&rp(b"d/sub/inner"), 1, &rp(b"d/new"), 3, 10, None)
            .await
            .map(|(n, a)| format!("{n} {}", shown(&a))),
    );
    note(
        "copy_range missing",
        r.copy_range(&rp(b"d/nothing"), 0, &rp(b"d/new"), 0, 1, None)
            .await
            .map(|(n, a)| format!("{n} {}", shown(&a))),
    );
    note("create", some(r.create(&rp(b"d/c"), 0o600).await));
    note("create again", some(r.create(&rp(b"d/c"), 0o600).await));
    note("create out", some(r.create(&rp(b"out/c"), 0o600).await));
    note("mkdir", some(r.mkdir(&rp(b"d/m"), 0o750).await));
    note(
        "mkdir through dirlink",
        some(r.mkdir(&rp(b"dirlink/m2"), 0o700).await),
    );
    note("mkdir out", some(r.mkdir(&rp(b"out/m"), 0o700).await));
    note(
        "mkdir under a file",
        some(r.mkdir(&rp(b"d/base/m"), 0o700).await),
    );
    note(
        "fifo",
        some(r.mknod(&rp(b"d/fifo"), SpecialKind::Fifo, 0o640, 0).await),
    );
    // (Sockets and renameat2's exchange need python3: the sh path answers Unsupported.)
    note(
        "symlink",
        some(r.symlink(&rp(b"d/sl"), b"../out/secret").await),
    );
    note(
        "readlink",
        r.readlink(&rp(b"d/sl")).await.map(|t| format!("{t:?}")),
    );
    note(
        "readlink a file",
        r.readlink(&rp(b"d/base")).await.map(|t| format!("{t:?}")),
    );
    note("link", some(r.link(&rp(b"d/base"), &rp(b"d/base2")).await));
    note(
        "link a dir",
        some(r.link(&rp(b"d/sub"), &rp(b"d/sub2")).await),
    );
    note(
        "link out",
        some(r.link(&rp(b"out/secret"), &rp(b"d/stolen")).await),
    );
    note(
        "commit hard-linked",
        some(
            r.commit(&rp(b"d/base"), bytes(b"both names"), Default::default())
                .await,
        ),
    );
    let set = SetAttr {
        mode: Some(0o604),
        size: Some(3),
        mtime_ns: Some(1_500_000_000_000_000_123),
        ..Default::default()
    };
    note("setattr", some(r.setattr(&rp(b"d/c"), set).await));
    let set = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    note(
        "setattr a symlink's mode",
        some(r.setattr(&rp(b"d/sl"), set.clone()).await),
    );
    note(
        "setattr out",
        some(r.setattr(&rp(b"out/secret"), set).await),
    );
    note(
        "fallocate",
        some(r.fallocate(&rp(b"link"), 0, 100, false).await),
    );
    note(
        "rename",
        none(r.rename(&rp(b"d/c"), &rp(b"d/m/c"), Replace).await),
    );
    note(
        "rename into itself",
        none(r.rename(&rp(b"d"), &rp(b"d/m/x"), Replace).await),
    );
    note(
        "rename a dir over a file",
        none(r.rename(&rp(b"d/m"), &rp(b"d/base2"), Replace).await),
    );
    note(
        "rename noreplace",
        none(r.rename(&rp(b"d/new"), &rp(b"d/base"), NoReplace).await),
    );
    note(
        "rename out",
        none(r.rename(&rp(b"d/new"), &rp(b"out/new"), Replace).await),
    );
    note(
        "rename in from out",
        none(
            r.rename(&rp(b"out/secret"), &rp(b"d/secret"), Replace)
                .await,
        ),
    );
    note("unlink", none(r.unlink(&rp(b"d/base2")).await));
    note("unlink a dir", none(r.unlink(&rp(b"d/m")).await));
    note("unlink missing", none(r.unlink(&rp(b"d/base2")).await));
    note("unlink out", none(r.unlink(&rp(b"out/secret")).await));
    note("rmdir not empty", none(r.rmdir(&rp(b"d/m")).await));
    note("rmdir a symlink", none(r.rmdir(&rp(b"dirlink")).await));
    note("rmdir", none(r.rmdir(&rp(b"d/m2")).await));
    note("rmdir out", none(r.rmdir(&rp(b"out/m")).await));
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_through_the_fast_path_end_as_the_sh_scripts_end() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "s").unwrap();
    fs::create_dir(outside.join("m")).unwrap();
    let (a, b) = (
        alike_workspace(dir.path(), "a", &outside),
        alike_workspace(dir.path(), "b", &outside),
    );
    let outside_before = snapshot(&outside);
    let (pa, pb) = (pair(&a), pair(&b));
    let fast = changes(&pa.fast).await;
    let sh = changes(&pb.sh).await;
    let differ: Vec<_> = fast.iter().zip(&sh).filter(|(x, y)| x != y).collect();
    assert!(differ.is_empty(), "{differ:#?}");
    assert_eq!(fast.len(), sh.len());
    assert!(pa.fast_runner.runs.load(Ordering::Relaxed) > 0);
    assert_eq!(snapshot(&a), snapshot(&b), "the workspaces end alike");
    assert_eq!(
        snapshot(&outside),
        outside_before,
        "nothing outside touched"
    );
    assert!(fast
        .iter()
        .any(|l| l.starts_with("commit through dangling: ok")));
}

/// Sandbox code that can write the workspace swaps a directory for a symlink to a directory
/// outside, over and over (renameat2's exchange: atomic), while files in it are created,
/// committed, renamed, chmod'ed and removed through the fast path (a python3 session, as a
/// mount over `shell:…?agent=no` runs them). Nothing outside changes: each call walks its
/// path by directory descriptors. (The sh scripts, which check a path and then use it, lose
/// this race: they are what runs where the sandbox has no python3.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_symlink_mid_change_cannot_lead_outside() {
    let (dir, root) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    for n in ["x", "y", "z", "m", "e", "s"] {
        fs::write(outside.join(n), "keep").unwrap();
        fs::set_permissions(outside.join(n), fs::Permissions::from_mode(0o644)).unwrap();
    }
    let before = snapshot(&outside);
    fs::create_dir(root.join("d")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("swap")).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let attacker = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let (d, s) = (
            std::ffi::CString::new(root.join("d").as_os_str().as_bytes()).unwrap(),
            std::ffi::CString::new(root.join("swap").as_os_str().as_bytes()).unwrap(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two NUL-ended paths, read only.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        d.as_ptr(),
                        libc::AT_FDCWD,
                        s.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let tools = tempfile::tempdir().unwrap();
    let path = path_with_real_python(tools.path());
    let session = SessionRunner::start(vec!["env".into(), path, "sh".into()])
        .await
        .unwrap();
    let r = remote_over(&root, Arc::new(session));
    let (mut ok, mut refused) = (0, 0);
    let mut leaked = Vec::new();
    for i in 0..150 {
        let calls: Vec<Result<()>> = vec![
            r.create(&rp(b"d/x"), 0o666).await.map(drop),
            r.commit(&rp(b"d/y"), bytes(b"pushed"), Default::default())
                .await
                .map(drop),
            r.setattr(
                &rp(b"d/y"),
                SetAttr {
                    mode: Some(0o777),
                    size: Some(1),
                    ..Default::default()
                },
            )
            .await
            .map(drop),
            r.rename(&rp(b"d/y"), &rp(b"d/z"), RenameMode::Replace)
                .await,
            r.commit(
                &rp(b"d/m"),
                CommitContent::Patch {
                    cut: 0,
                    new_len: 2,
                    ranges: vec![(0, bytes::Bytes::from_static(b"pp"))],
                },
                Default::default(),
            )
            .await
            .map(drop),
            r.unlink(&rp(b"d/x")).await,
            r.unlink(&rp(b"d/z")).await,
            r.unlink(&rp(b"d/m")).await,
            // The queries on one file: an edit in place, and a window of lines.
            r.commit(&rp(b"d/e"), bytes(b"keep"), Default::default())
                .await
                .map(drop),
            r.edit(&rp(b"d/e"), "keep", "EDITED", false).await.map(drop),
            r.commit(&rp(b"d/s"), bytes(b"inside\n"), Default::default())
                .await
                .map(drop),
            scanned(&r, &mut leaked).await,
        ];
        for c in calls {
            match c {
                Ok(()) => ok += 1,
                Err(_) => refused += 1,
            }
        }
        if i % 50 == 0 {
            assert_eq!(
                snapshot(&outside),
                before,
                "changed outside after {i} rounds"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    assert!(swaps.load(Ordering::Relaxed) > 1000, "the attacker ran");
    assert!(
        ok > 0 && refused > 0,
        "both sides of the swap were met: {ok} / {refused}"
    );
    assert_eq!(snapshot(&outside), before, "nothing outside changed");
    assert!(leaked.is_empty(), "scan read outside: {leaked:?}");
}

/// `d/s`'s first line through `scan`; what it shows is never the file outside.
async fn scanned(r: &Arc<dyn Remote>, leaked: &mut Vec<Vec<u8>>) -> Result<()> {
    let req = sbxfs::search::scan::ScanRequest {
        start_line: 1,
        end_line: Some(1),
        max_bytes: 100,
    };
    let w = r.scan(&rp(b"d/s"), req).await?;
    if w.lines != [b"inside".to_vec()] {
        leaked.push(w.lines.concat());
    }
    Ok(())
}
