//! The agent as a process: authentication, request limits, commit atomicity seen from inside the
//! sandbox, bytes on the wire for patch commits, a crash during a commit, cancellation of a
//! search, clean shutdown; requests that must not take it down (brace bombs, FIFOs), exact
//! modes under a umask, sparse files kept sparse.

use crate::common;

use std::fs;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use common::*;
use sbxfs::proxy::Proxy;
use sbxfs::remote::client::AgentClient;
use sbxfs::remote::*;
use sbxfs::search::grep::GrepOptions;

fn rp(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("ws");
    fs::create_dir(&root).unwrap();
    (d, root)
}

#[tokio::test]
async fn every_request_without_the_token_gets_401_and_changes_nothing() {
    let (_d, root) = workspace();
    fs::write(root.join("keep.txt"), "keep").unwrap();
    let agent = AgentProcess::start(&root);
    sbxfs::remote::client::install_tls();
    let http = reqwest::Client::new();
    let cases = [
        ("GET", "/v1/stat?path=keep.txt", None),
        ("POST", "/v1/unlink?path=keep.txt", None),
        ("GET", "/v1/no-such-endpoint", None),
        (
            "POST",
            "/v1/unlink?path=keep.txt",
            Some("Bearer wrong-token"),
        ),
        (
            "POST",
            "/v1/unlink?path=keep.txt",
            Some("Bearer conformance-token-012345678"),
        ),
        (
            "POST",
            "/v1/unlink?path=keep.txt",
            Some("conformance-token-0123456789"),
        ),
        ("GET", "/", Some("Basic Zm9vOmJhcg==")),
    ];
    for (method, path, auth) in cases {
        let mut req = http.request(method.parse().unwrap(), format!("{}{path}", agent.url));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{method} {path} with {auth:?}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized");
    }
    assert!(
        root.join("keep.txt").exists(),
        "an unauthorised unlink changed the workspace"
    );
    let bad = AgentClient::new(&agent.url, "nope").unwrap();
    assert!(matches!(
        bad.stat(&rp("keep.txt")).await,
        Err(RemoteError::Unauthorized(_))
    ));
    // With the token, the same calls work.
    assert_eq!(agent.client().stat(&rp("keep.txt")).await.unwrap().size, 4);
}

#[test]
fn the_token_comes_from_a_file_or_the_environment_never_argv_or_logs() {
    let (_d, root) = workspace();
    // No token at all: refuse to start.
    let out = std::process::Command::new(sbxfs_bin())
        .args(["agent", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .env_remove("SBXFS_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no token"));

    // From the environment, with debug logging: the token is never in the log.
    let secret = "env-token-that-must-not-leak-42";
    let mut child = std::process::Command::new(sbxfs_bin())
        .args(["agent", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .env("SBXFS_TOKEN", secret)
        .env("SBXFS_LOG", "trace")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ok = AgentClient::new(&url, secret).unwrap();
        ok.statfs().await.unwrap();
        let bad = AgentClient::new(&url, "wrong").unwrap();
        assert!(bad.statfs().await.is_err());
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM shuts the agent down cleanly"
    );
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("agent ready"), "{log}");
    assert!(!log.contains(secret), "the token appeared in the log");
    assert!(!line.contains(secret));
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let (_d, root) = workspace();
    fs::write(root.join("f"), "x").unwrap();
    let agent = AgentProcess::start(&root);
    sbxfs::remote::client::install_tls();
    let http = reqwest::Client::new();
    let huge = serde_json::json!({ "pattern": "x".repeat(2 * 1024 * 1024) });
    let resp = http
        .post(format!("{}/v1/grep?path=", agent.url))
        .bearer_auth(&agent.token)
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let c = agent.client();
    assert!(matches!(
        c.read(&rp("f"), 0, 17 << 20).await,
        Err(RemoteError::TooLarge(_))
    ));
    let long = "x".repeat(70_000);
    let r = c
        .grep(
            &RemotePath::root(),
            GrepOptions {
                pattern: long,
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(
        r,
        Err(RemoteError::Query(
            sbxfs::search::SearchError::LimitExceeded(_)
        ))
    ));
    let bomb = GrepOptions {
        pattern: "(((a{100}){100}){100})".into(),
        ..Default::default()
    };
    assert!(matches!(
        c.grep(&RemotePath::root(), bomb).await,
        Err(RemoteError::Query(sbxfs::search::SearchError::Regex(_)))
    ));
    // The agent is still serving.
    assert_eq!(c.stat(&rp("f")).await.unwrap().size, 1);
}

/// A reader that yields `left` bytes of `fill`, pausing `delay` after each `chunk` bytes, so a
/// commit takes a while.
struct SlowReader {
    left: usize,
    fill: u8,
    chunk: usize,
    delay: Duration,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    since_pause: usize,
}

impl tokio::io::AsyncRead for SlowReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        if self.left == 0 {
            return Poll::Ready(Ok(()));
        }
        if self.since_pause >= self.chunk {
            let delay = self.delay;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
            self.since_pause = 0;
        }
        let n = self
            .left
            .min(self.chunk - self.since_pause)
            .min(buf.remaining());
        buf.put_slice(&vec![self.fill; n]);
        self.left -= n;
        self.since_pause += n;
        Poll::Ready(Ok(()))
    }
}

use std::future::Future;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_in_the_sandbox_never_sees_a_half_written_commit() {
    let (_d, root) = workspace();
    const SIZE: usize = 32 << 20;
    fs::write(root.join("big.bin"), vec![b'a'; SIZE]).unwrap();
    let agent = AgentProcess::start(&root);
    let client = agent.client();
    let stop = Arc::new(AtomicBool::new(false));
    let path = root.join("big.bin");
    let (stop2, path2) = (stop.clone(), path.clone());
    let poller = std::thread::spawn(move || {
        let mut reads = 0;
        while !stop2.load(Ordering::Relaxed) {
            let data = fs::read(&path2).unwrap();
            assert_eq!(data.len(), SIZE, "a reader saw a file of the wrong size");
            // All bytes equal, checked with one memcmp (an element-wise loop is slow enough in a
            // debug build, on a loaded machine, to leave too few reads during the commit).
            assert!(
                data[1..] == data[..SIZE - 1],
                "a reader saw a mix of old and new content"
            );
            reads += 1;
        }
        reads
    });
    let reader = SlowReader {
        left: SIZE,
        fill: b'b',
        chunk: 1 << 20,
        delay: Duration::from_millis(40),
        sleep: None,
        since_pause: 0,
    };
    client
        .commit(
            &rp("big.bin"),
            CommitContent::Whole(Box::new(reader)),
            CommitOptions::default(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let reads = poller.join().unwrap();
    assert!(
        reads >= 5,
        "the poller should have read during the commit ({reads} reads)"
    );
    assert!(fs::read(&path).unwrap().iter().all(|&b| b == b'b'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_byte_patch_into_256_mib_sends_bytes_of_the_patch_not_the_file() {
    let (_d, root) = workspace();
    const SIZE: u64 = 256 << 20;
    let f = fs::File::create(root.join("huge.bin")).unwrap();
    f.set_len(SIZE).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"start", 0).unwrap();
    drop(f);
    let agent = AgentProcess::start(&root);
    let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), agent.addr, Duration::ZERO)
        .await
        .unwrap();
    let client = AgentClient::new(&format!("http://{}", proxy.addr), &agent.token).unwrap();
    let base = client.stat(&rp("huge.bin")).await.unwrap().version;
    let before = proxy.counters.total();
    let patch = CommitContent::Patch {
        cut: u64::MAX,
        new_len: SIZE,
        ranges: vec![(123_456_789, Bytes::from_static(b"!"))],
    };
    client
        .commit(
            &rp("huge.bin"),
            patch,
            CommitOptions {
                base: Some(base),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let patch_bytes = proxy.counters.total() - before;
    let mut got = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(root.join("huge.bin")).unwrap(),
        &mut got,
        123_456_789,
    )
    .unwrap();
    assert_eq!(&got, b"!");
    assert_eq!(fs::metadata(root.join("huge.bin")).unwrap().len(), SIZE);
    assert!(
        patch_bytes < 4096,
        "a 1-byte patch moved {patch_bytes} bytes"
    );

    let before = proxy.counters.total();
    let file = tokio::fs::File::open(root.join("huge.bin")).await.unwrap();
    client
        .commit(
            &rp("huge.bin"),
            CommitContent::Whole(Box::new(file)),
            CommitOptions::default(),
        )
        .await
        .unwrap();
    let whole_bytes = proxy.counters.total() - before;
    assert!(whole_bytes >= SIZE);
    println!(
        "1-byte patch commit: {patch_bytes} bytes on the wire; whole-file commit: {whole_bytes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_agent_mid_commit_leaves_the_target_intact_and_no_temp() {
    let (_d, root) = workspace();
    fs::write(root.join("doc.txt"), "the original").unwrap();
    // A stale named temp from an earlier crash: swept when the agent starts.
    fs::write(root.join(STALE_DOC_TEMP), "stale").unwrap();
    let mut agent = AgentProcess::start(&root);
    let client = agent.client();
    let reader = SlowReader {
        left: 64 << 20,
        fill: b'z',
        chunk: 256 << 10,
        delay: Duration::from_millis(20),
        sleep: None,
        since_pause: 0,
    };
    let commit = tokio::spawn(async move {
        client
            .commit(
                &rp("doc.txt"),
                CommitContent::Whole(Box::new(reader)),
                CommitOptions::default(),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent.kill();
    let result = commit.await.unwrap();
    assert!(result.is_err(), "the commit cannot have succeeded");
    assert_eq!(
        fs::read_to_string(root.join("doc.txt")).unwrap(),
        "the original"
    );
    let names = || -> Vec<String> {
        fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        names(),
        vec!["doc.txt".to_string()],
        "no temp file may remain"
    );
    let agent = AgentProcess::start(&root);
    let c = agent.client();
    assert_eq!(
        &c.read(&rp("doc.txt"), 0, 100).await.unwrap().data[..],
        b"the original"
    );
    c.commit(
        &rp("doc.txt"),
        CommitContent::Whole(Box::new(std::io::Cursor::new(b"after restart".to_vec()))),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        fs::read_to_string(root.join("doc.txt")).unwrap(),
        "after restart"
    );
    assert_eq!(names(), vec!["doc.txt".to_string()]);
}

/// A named temp as the agent makes them (`.NAME.sbxfs-agent-<32 hex>.tmp`), left by a crash.
const STALE_DOC_TEMP: &str = ".doc.txt.sbxfs-agent-00000000deadbeef00000000deadbeef.tmp";

#[tokio::test]
async fn the_stale_temp_sweep_runs_at_start_and_takes_only_the_agents_own_names() {
    let (_d, root) = workspace();
    fs::create_dir(root.join("sub")).unwrap();
    let stale = "sub/.a.sbxfs-agent-0123456789abcdef0123456789abcdef.tmp";
    fs::write(root.join(stale), "stale").unwrap();
    // Users' files that only look like temps: never deleted, however many restarts.
    let users = [
        "sub/.keep-me.tmp",
        "sub/.x.sbxfs-1.tmp",
        "sub/.a.sbxfs-0123456789abcdef.tmp",
        ".y.sbxfs-agent-1234.tmp",
    ];
    for u in users {
        fs::write(root.join(u), "user data").unwrap();
    }
    for _ in 0..2 {
        let agent = AgentProcess::start(&root);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while root.join(stale).exists() {
            assert!(std::time::Instant::now() < deadline, "stale temp not swept");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The sweep has run (the stale one is gone); the agent answers, so it is not mid-way.
        agent.client().stat(&rp("sub")).await.unwrap();
        for u in users {
            assert_eq!(
                fs::read_to_string(root.join(u)).unwrap(),
                "user data",
                "{u}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_grep_stream_stops_the_search_in_the_agent() {
    let (_d, root) = workspace();
    for d in 0..50 {
        fs::create_dir(root.join(format!("d{d}"))).unwrap();
        for f in 0..40 {
            let body: String = (0..200).map(|i| format!("needle line {i}\n")).collect();
            fs::write(root.join(format!("d{d}/f{f}.txt")), body).unwrap();
        }
    }
    let agent = AgentProcess::start(&root);
    let c = agent.client();
    let mut stream = c
        .grep(
            &RemotePath::root(),
            GrepOptions {
                pattern: "needle".into(),
                threads: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first, GrepEvent::Match(_)));
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = c.agent_stats().await.unwrap();
        if stats["greps_cancelled"] == 1 {
            assert_eq!(stats["greps_completed"], 0);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not stop the search: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent answers and is still the same process.
async fn still_serving(agent: &mut AgentProcess, client: &AgentClient) {
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent process died"
    );
    let a = tokio::time::timeout(Duration::from_secs(10), client.stat(&RemotePath::root()))
        .await
        .expect("the agent answers")
        .unwrap();
    assert_eq!(a.kind, FileKind::Dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_glob_brace_bomb_is_refused_and_the_agent_keeps_serving() {
    let (_d, root) = workspace();
    fs::write(root.join("a"), "a").unwrap();
    let mut agent = AgentProcess::start(&root);
    let client = agent.client();
    // 5,000 nested braces used to overflow the expansion's stack and kill the agent.
    let bomb = format!("{}a{}", "{".repeat(5000), "}".repeat(5000));
    let err = client.glob(&RemotePath::root(), &bomb).await.unwrap_err();
    assert_eq!(err.token(), "limit_exceeded", "{err:?}");
    assert!(err.to_string().contains("nested"), "{err}");
    still_serving(&mut agent, &client).await;
    // A deep tree: the walk bounds its own recursion too.
    let mut deep = root.join("deep");
    for _ in 0..1500 {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    match client.glob(&RemotePath::root(), "**").await {
        Ok(paths) => assert!(paths.len() > 1000),
        Err(e) => assert_eq!(e.token(), "limit_exceeded", "{e:?}"),
    }
    still_serving(&mut agent, &client).await;
    assert_eq!(
        client.glob(&RemotePath::root(), "{a,b}").await.unwrap(),
        vec!["a".to_string()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_are_refused_at_once_by_read_scan_grep_and_edit() {
    let (_d, root) = workspace();
    fs::write(root.join("real.txt"), "needle here\n").unwrap();
    let mut agent = AgentProcess::start(&root);
    let client = agent.client();
    client
        .mknod(&rp("fifo"), SpecialKind::Fifo, 0o644, 0)
        .await
        .unwrap();
    std::os::unix::fs::symlink("fifo", root.join("to-fifo")).unwrap();
    // Generous: what is proved is "answers", not "answers fast".
    let soon = Duration::from_secs(20);
    for path in ["fifo", "to-fifo"] {
        let p = rp(path);
        let read = tokio::time::timeout(soon, client.read(&p, 0, 100))
            .await
            .expect("read of a FIFO must not block");
        let scan = tokio::time::timeout(
            soon,
            client.scan(
                &p,
                sbxfs::search::scan::ScanRequest {
                    start_line: 1,
                    end_line: None,
                    max_bytes: 65536,
                },
            ),
        )
        .await
        .expect("scan of a FIFO must not block");
        let edit = tokio::time::timeout(soon, client.edit(&p, "a", "b", false))
            .await
            .expect("edit of a FIFO must not block");
        let grep = tokio::time::timeout(soon, async {
            let opts = GrepOptions {
                pattern: "needle".into(),
                ..Default::default()
            };
            match client.grep(&p, opts).await {
                Err(e) => Err(e),
                Ok(mut s) => match s.next().await {
                    Some(Err(e)) => Err(e),
                    other => panic!("grep of a FIFO answered {other:?}"),
                },
            }
        })
        .await
        .expect("grep of a FIFO must not block");
        for (op, result) in [
            ("read", read.map(|_| ())),
            ("scan", scan.map(|_| ())),
            ("edit", edit.map(|_| ())),
            ("grep", grep),
        ] {
            let err = result.expect_err(op);
            assert!(
                err.to_string().contains("not a regular file"),
                "{op} {path}: {err}"
            );
        }
    }
    // A search of the directory skips the FIFO and finds the file.
    let opts = GrepOptions {
        pattern: "needle".into(),
        ..Default::default()
    };
    let events: Vec<GrepEvent> = tokio::time::timeout(soon, async {
        client
            .grep(&RemotePath::root(), opts)
            .await
            .unwrap()
            .map(|e| e.unwrap())
            .collect()
            .await
    })
    .await
    .expect("grep of a directory holding a FIFO must not block");
    let matched: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            GrepEvent::Match(m) => Some(m.path.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(matched, ["real.txt"]);
    still_serving(&mut agent, &client).await;
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(root.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo(),
        "edit left the FIFO alone"
    );
}

/// An agent started through a wrapper command (a umask, another user), as a service manager
/// might start it; killed on drop.
struct WrappedAgent {
    child: std::process::Child,
    client: AgentClient,
    _token_dir: tempfile::TempDir,
}

impl WrappedAgent {
    /// With this umask.
    fn with_umask(root: &std::path::Path, umask: u32) -> Self {
        let script = format!("umask {umask:03o} && exec \"$0\" \"$@\"");
        Self::start(root, &["sh", "-c", &script])
    }

    /// As `nobody` (uid and gid 65534, no capabilities).
    fn as_nobody(root: &std::path::Path) -> Self {
        Self::start(
            root,
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
            ],
        )
    }

    fn start(root: &std::path::Path, wrapper: &[&str]) -> Self {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        let token = "wrapped-token-0123456789";
        let token_dir = tempfile::tempdir().unwrap();
        // Readable by whichever user the wrapper makes the agent.
        fs::set_permissions(token_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let token_file = token_dir.path().join("token");
        fs::write(&token_file, token).unwrap();
        fs::set_permissions(&token_file, fs::Permissions::from_mode(0o644)).unwrap();
        let mut child = std::process::Command::new(wrapper[0])
            .args(&wrapper[1..])
            .arg(sbxfs_bin())
            .args(["agent", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .arg("--token-file")
            .arg(&token_file)
            .env("SBXFS_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no ready line from the agent: {line:?}"));
        WrappedAgent {
            client: AgentClient::new(url, token).unwrap(),
            child,
            _token_dir: token_dir,
        }
    }
}

impl Drop for WrappedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprivileged_agent_reports_eperm_for_devices_and_foreign_owners() {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::getuid().is_root() {
        eprintln!("skipping: the test must run as root to start an agent as nobody");
        return;
    }
    let (d, root) = workspace();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    let agent = WrappedAgent::as_nobody(&root);
    let c = &agent.client;
    let f = c.create(&rp("f"), 0o644).await.unwrap();
    assert_eq!(f.uid, 65534, "the agent runs as nobody");
    let err = c
        .mknod(
            &rp("null"),
            SpecialKind::CharDevice,
            0o666,
            libc::makedev(1, 3),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Perm(_)), "{err:?}");
    assert_eq!(err.errno(), libc::EPERM);
    assert!(!root.join("null").exists());
    // FIFOs and sockets need no privilege.
    c.mknod(&rp("p"), SpecialKind::Fifo, 0o600, 0)
        .await
        .unwrap();
    c.mknod(&rp("s"), SpecialKind::Socket, 0o600, 0)
        .await
        .unwrap();
    let err = c
        .setattr(
            &rp("f"),
            SetAttr {
                uid: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RemoteError::Perm(_)), "{err:?}");
    assert_eq!(c.stat(&rp("f")).await.unwrap().uid, 65534, "unchanged");
    // Giving it to its own owner is allowed.
    c.setattr(
        &rp("f"),
        SetAttr {
            uid: Some(65534),
            gid: Some(65534),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_are_exact_under_a_restrictive_umask() {
    let (_d, root) = workspace();
    let agent = WrappedAgent::with_umask(&root, 0o077);
    let client = agent.client.clone();
    assert_eq!(client.create(&rp("f"), 0o666).await.unwrap().mode, 0o666);
    assert_eq!(client.mkdir(&rp("d"), 0o1777).await.unwrap().mode, 0o1777);
    assert_eq!(client.mkdir(&rp("e"), 0o777).await.unwrap().mode, 0o777);
    let fifo = client
        .mknod(&rp("p"), SpecialKind::Fifo, 0o644, 0)
        .await
        .unwrap();
    assert_eq!(fifo.mode, 0o644);
    let c = client
        .commit(
            &rp("c"),
            CommitContent::Whole(Box::new(std::io::Cursor::new(b"x".to_vec()))),
            CommitOptions {
                base: None,
                create_mode: Some(0o664),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(c.mode, 0o664);
    use std::os::unix::fs::PermissionsExt;
    for (name, mode) in [("f", 0o666), ("d", 0o1777), ("e", 0o777), ("c", 0o664)] {
        let m = fs::metadata(root.join(name)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(m, mode, "{name} on disk");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_stays_sparse_through_patches_and_linked_commits() {
    use std::os::unix::fs::MetadataExt;
    let (_d, root) = workspace();
    let path = root.join("sparse.img");
    let f = fs::File::create(&path).unwrap();
    f.set_len(256 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"head", 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"tail", (256 << 20) - 4).unwrap();
    drop(f);
    let agent = AgentProcess::start(&root);
    let client = agent.client();
    let allocated = |p: &std::path::Path| fs::metadata(p).unwrap().blocks() * 512;
    let v = client.stat(&rp("sparse.img")).await.unwrap().version;
    client
        .commit(
            &rp("sparse.img"),
            CommitContent::Patch {
                cut: u64::MAX,
                new_len: 256 << 20,
                ranges: vec![(100 << 20, Bytes::from_static(b"middle"))],
            },
            CommitOptions {
                base: Some(v),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        allocated(&path) < 1 << 20,
        "patched copy allocates {} bytes of a 256 MiB sparse file",
        allocated(&path)
    );
    let got = client.read(&rp("sparse.img"), 100 << 20, 6).await.unwrap();
    assert_eq!(&got.data[..], b"middle");
    let got = client
        .read(&rp("sparse.img"), (256 << 20) - 4, 4)
        .await
        .unwrap();
    assert_eq!(&got.data[..], b"tail");
    // The same through a hard-linked file's in-place commit.
    client.link(&rp("sparse.img"), &rp("other")).await.unwrap();
    let v = client.stat(&rp("sparse.img")).await.unwrap().version;
    client
        .commit(
            &rp("sparse.img"),
            CommitContent::Patch {
                cut: u64::MAX,
                new_len: 256 << 20,
                ranges: vec![(0, Bytes::from_static(b"HEAD"))],
            },
            CommitOptions {
                base: Some(v),
                create_mode: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(allocated(&path) < 1 << 20, "{}", allocated(&path));
    assert_eq!(
        &client.read(&rp("other"), 0, 4).await.unwrap().data[..],
        b"HEAD"
    );
    assert_eq!(fs::metadata(&path).unwrap().nlink(), 2);
}

/// The next change of `path`'s content on `feed` (a new file's creation before it is a
/// namespace event, which says nothing of who made it), within 10 seconds.
async fn next_about(
    feed: &mut futures_util::stream::BoxStream<'static, Result<ChangeEvent>>,
    path: &[u8],
) -> ChangeEvent {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = feed.next().await.expect("the feed ended").unwrap();
            if ev.path.0 == path && ev.kind == ChangeKind::Modified {
                return ev;
            }
        }
    })
    .await
    .expect("no event about the path within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_reported_as_its_own_to_its_client_only() {
    let (_d, root) = workspace();
    let agent = AgentProcess::start(&root);
    let (mine, other) = (agent.client(), agent.client());
    let mut my_feed = mine.watch(None).await.unwrap();
    let mut other_feed = other.watch(None).await.unwrap();
    // Both feeds are subscribed once an event made after them reaches both.
    fs::write(root.join("mine.txt"), "made in the sandbox\n").unwrap();
    fs::write(root.join("ready"), "x").unwrap();
    next_about(&mut my_feed, b"ready").await;
    next_about(&mut other_feed, b"ready").await;
    let commit = |c: &AgentClient, name: &'static str| {
        let c = c.clone();
        async move {
            c.commit(
                &rp(name),
                CommitContent::Whole(Box::new(std::io::Cursor::new(b"saved\n".to_vec()))),
                CommitOptions::default(),
            )
            .await
            .unwrap()
        }
    };
    commit(&mine, "mine.txt").await;
    let ev = next_about(&mut my_feed, b"mine.txt").await;
    assert!(
        ev.own,
        "the committing client is told it is its own: {ev:?}"
    );
    let ev = next_about(&mut other_feed, b"mine.txt").await;
    assert!(!ev.own, "another client is not: {ev:?}");
    // The other client's commit is its own, not ours.
    commit(&other, "theirs.txt").await;
    assert!(!next_about(&mut my_feed, b"theirs.txt").await.own);
    assert!(next_about(&mut other_feed, b"theirs.txt").await.own);
    // A sandbox program naming a file as the agent names its temps, and renaming it over a
    // file, is nobody's commit.
    let forged = root.join(".mine.txt.sbxfs-agent-0123456789abcdef0123456789abcdef.tmp");
    fs::write(&forged, "forged\n").unwrap();
    fs::rename(&forged, root.join("mine.txt")).unwrap();
    let ev = next_about(&mut my_feed, b"mine.txt").await;
    assert!(
        !ev.own,
        "a rename made in the sandbox is not the client's: {ev:?}"
    );
    assert_eq!(fs::read(root.join("mine.txt")).unwrap(), b"forged\n");
}
