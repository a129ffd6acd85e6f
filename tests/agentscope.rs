//! The agentscope transport's Runner over a real agentscope-runtime box server: programs,
//! exit codes and both streams (binary, large, capped), large programs, file transfers
//! confined to the workspace, edit through it (edit.py and the fallback), no token in any
//! command line, and connect's first contact.

use std::fs;
use std::os::unix::ffi::OsStrExt;

use crate::common::boxserver::BoxServer;
use bytes::Bytes;
use sbxfs::remote::agentscope::{parse_url, AgentScopeRunner};
use sbxfs::remote::connect::{connect, ConnectOptions};
use sbxfs::remote::exec::{edit::edit, RunControl, Runner, OUTPUT_CAP};
use sbxfs::remote::RemoteError;

fn runner(s: &BoxServer) -> AgentScopeRunner {
    sbxfs::remote::client::install_tls();
    AgentScopeRunner::new(
        reqwest::Client::new(),
        s.base(),
        s.token.clone(),
        s.workspace.as_os_str().as_bytes().to_vec(),
    )
}

async fn run(r: &AgentScopeRunner, program: &str) -> sbxfs::remote::exec::Output {
    r.run(program, &RunControl::default()).await.unwrap()
}

#[tokio::test]
async fn programs_answer_exit_codes_and_both_streams_byte_exact() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let r = runner(&s);
    let out = run(&r, "echo out; echo err >&2; exit 7").await;
    assert_eq!(
        (out.code, &out.stdout[..], &out.stderr[..]),
        (7, &b"out\n"[..], &b"err\n"[..])
    );
    // Bytes that are not UTF-8 (the server decodes its command's output as UTF-8).
    let out = run(&r, r"printf '\377\000\376\n'; printf '\200' >&2").await;
    assert_eq!(out.stdout, b"\xff\x00\xfe\n");
    assert_eq!(out.stderr, b"\x80");
    // Quotes, $(…) and backticks in the program are the program's, not the server's shell's.
    let out = run(&r, "x='a b'; echo \"$x\" '$(no)' '`no`'").await;
    assert_eq!(out.stdout, b"a b $(no) `no`\n");
    // A signal is 128 + N.
    let out = run(&r, "kill -TERM $$").await;
    assert_eq!(out.code, 143);
}

#[tokio::test]
async fn large_output_is_capped_and_the_cut_counted() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let r = runner(&s);
    let n = OUTPUT_CAP + 12345;
    let out = run(
        &r,
        &format!("head -c {n} /dev/zero; head -c 3000000 /dev/zero >&2"),
    )
    .await;
    assert_eq!(out.code, 0);
    assert_eq!(out.stdout.len(), OUTPUT_CAP);
    assert_eq!(out.stdout_cut, 12345);
    assert!(out.stdout.iter().all(|&b| b == 0));
    assert_eq!((out.stderr.len(), out.stderr_cut), (3_000_000, 0));
}

#[tokio::test]
async fn a_program_too_long_for_one_command_goes_as_a_file_and_leaves_nothing() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let r = runner(&s);
    let filler = format!(": '{}'\n", "x".repeat(300 * 1024));
    let out = run(&r, &format!("{filler}echo done")).await;
    assert_eq!((out.code, &out.stdout[..]), (0, &b"done\n"[..]));
    let left: Vec<_> = fs::read_dir(&s.workspace).unwrap().collect();
    assert!(left.is_empty(), "left in the workspace: {left:?}");
}

#[tokio::test]
async fn files_move_byte_exact_with_awkward_names_and_stay_confined() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let r = runner(&s);
    let ws = s.workspace.clone();
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    for name in [
        "plain",
        "with space",
        "it's \"q\"",
        "$(touch pwned)",
        "`x`",
        "-dash",
        "ünï",
    ] {
        let p = ws.join(name);
        let abs = p.as_os_str().as_bytes();
        r.put_file(abs, Bytes::from(data.clone()))
            .await
            .expect("native")
            .unwrap();
        assert_eq!(fs::read(&p).unwrap(), data, "{name}");
        let back = r.get_file(abs).await.expect("native").unwrap();
        assert_eq!(&back[..], &data[..], "{name}");
    }
    // A put replaces by rename: a reader holding the old file keeps the old bytes.
    let p = ws.join("plain");
    let held = fs::File::open(&p).unwrap();
    r.put_file(p.as_os_str().as_bytes(), Bytes::from_static(b"new"))
        .await
        .unwrap()
        .unwrap();
    let mut old = Vec::new();
    std::io::Read::read_to_end(&mut &held, &mut old).unwrap();
    assert_eq!(
        (old, fs::read(&p).unwrap()),
        (data.clone(), b"new".to_vec())
    );
    assert!(!ws.join("pwned").exists());
    // Not UTF-8, outside the root, or with .. : not sent to the server (the scripts carry it).
    assert!(r.get_file(b"/etc/passwd").await.is_none());
    assert!(r
        .get_file(&[ws.as_os_str().as_bytes(), b"/../x"].concat())
        .await
        .is_none());
    assert!(r
        .get_file(&[ws.as_os_str().as_bytes(), b"/\xff"].concat())
        .await
        .is_none());
    // A missing directory is not created (the server's PUT would make it).
    let e = r
        .put_file(
            ws.join("nodir/f").as_os_str().as_bytes(),
            Bytes::from_static(b"x"),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, RemoteError::NotFound(_)), "{e}");
    assert!(!ws.join("nodir").exists());
    // A symlink planted in the sandbox is not followed, either way.
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.join("link")).unwrap();
    for p in [ws.join("out/secret"), ws.join("link")] {
        let abs = p.as_os_str().as_bytes();
        let e = r.get_file(abs).await.unwrap().unwrap_err();
        assert!(matches!(e, RemoteError::Access(_)), "{e}");
        let e = r
            .put_file(abs, Bytes::from_static(b"x"))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, RemoteError::Access(_)), "{e}");
    }
    assert_eq!(fs::read(outside.path().join("secret")).unwrap(), b"s");
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[tokio::test]
async fn the_token_never_appears_in_a_command_line() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let r = runner(&s);
    // Every process's command line, seen from inside the sandbox while a command runs.
    let out = run(
        &r,
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < \"$f\"; echo; done",
    )
    .await;
    assert!(out.stdout.len() > 10);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("base64"), "the wrapper is visible: {text}");
    assert!(!text.contains(&s.token), "the token is in a command line");
}

#[tokio::test]
async fn edit_through_the_box_server_with_and_without_python3() {
    let tools = tempfile::tempdir().unwrap();
    for t in [
        "sh", "base64", "readlink", "stat", "mktemp", "mv", "chmod", "chown", "rm", "tr", "sync",
        "cat", "head", "wc",
    ] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(t))
            .find(|p| p.exists())
            .unwrap();
        std::os::unix::fs::symlink(real, tools.path().join(t)).unwrap();
    }
    let no_python = tools.path().display().to_string();
    for path_env in [None, Some(no_python.as_str())] {
        let Some(s) = BoxServer::start(path_env) else {
            return;
        };
        let r = runner(&s);
        let label = if path_env.is_some() {
            "fallback"
        } else {
            "edit.py"
        };
        let f = s.workspace.join("a b.txt");
        fs::write(&f, "one\r\ntwo two\n").unwrap();
        let abs = f.as_os_str().as_bytes();
        let e = edit(&r, abs, "two", "2", false).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            sbxfs::search::SearchError::MultipleOccurrences(2).to_string()
        );
        assert_eq!(edit(&r, abs, "two", "2", true).await.unwrap(), 2, "{label}");
        assert_eq!(fs::read(&f).unwrap(), b"one\n2 2\n", "{label}");
        let e = edit(&r, &[abs, b"-missing"].concat(), "a", "b", false)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                RemoteError::Query(sbxfs::search::SearchError::NotFound(_))
            ),
            "{label}: {e}"
        );
        let names: Vec<_> = fs::read_dir(&s.workspace)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{label}: {names:?}");
    }
}

#[test]
fn urls_are_parsed_strictly() {
    assert_eq!(
        parse_url("agentscope+http://127.0.0.1:8000").unwrap(),
        ("http://127.0.0.1:8000".into(), None)
    );
    assert_eq!(
        parse_url("agentscope+https://box.example:443/work/space/").unwrap(),
        ("https://box.example".into(), Some("/work/space".into()))
    );
    for bad in [
        "agentscope+http://",
        "agentscope+http://h:1/a/../b",
        "agentscope+http://h:1/a?x=1",
        "agentscope+http://user@h:1",
        "agentscope+ftp://h",
    ] {
        assert!(
            matches!(parse_url(bad), Err(RemoteError::Invalid(_))),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn connect_checks_the_token_on_first_contact() {
    let Some(s) = BoxServer::start(None) else {
        return;
    };
    let wrong = ConnectOptions {
        token: Some("wrong".into()),
        ..Default::default()
    };
    let e = connect(&s.url(), &wrong).await.err().expect("refused");
    assert!(matches!(e, RemoteError::Unauthorized(_)), "{e}");
    assert!(!e.to_string().contains(&s.token));
    let e = connect(&s.url(), &ConnectOptions::default())
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, RemoteError::Unauthorized(_)), "{e}");
    let right = ConnectOptions {
        token: Some(s.token.clone()),
        ..Default::default()
    };
    let c = connect(&s.url(), &right).await.expect("connect");
    assert_eq!(c.transport, "agentscope");
}

// --- Cancel: a real kill in the sandbox, and --header-file headers on every request.

mod kill_and_headers {
    use super::*;

    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use sbxfs::remote::exec::supervise::{Job, JobId, Supervised};
    use sbxfs::remote::{CommitContent, CommitOptions, RemotePath};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Only to stop a hung test, never part of an assertion.
    const HANG: Duration = Duration::from_secs(60);

    fn supervised(s: &BoxServer) -> Arc<Supervised<AgentScopeRunner>> {
        Arc::new(Supervised::new(Arc::new(runner(s))))
    }

    /// The live (not zombie) processes of process group `pgid`, as `ps` lists them.
    fn live_members(pgid: u32) -> Vec<String> {
        let out = std::process::Command::new("ps")
            .args(["-e", "-o", "pid=,pgid=,stat=,args="])
            .output()
            .expect("ps");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 3 && f[1] == pgid.to_string() && !f[2].starts_with('Z')
            })
            .map(str::to_string)
            .collect()
    }

    /// Files of job `id` left in any directory the supervisor may have picked.
    fn job_files(id: &JobId) -> Vec<String> {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let mut left = Vec::new();
        for base in ["/dev/shm", "/tmp"] {
            let dir = Path::new(base).join(format!("sbxfs-jobs-{uid}"));
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            left.extend(
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{}.", id.as_str()))),
            );
        }
        left
    }

    /// A program that records its process group in `pgid_file`, leaves a sleeper and a busy
    /// loop behind, and waits for them.
    fn long_program(pgid_file: &Path) -> String {
        format!(
            "sleep 1000 &\n(while :; do :; done) &\necho $$ > '{}'\nwait\n",
            pgid_file.display()
        )
    }

    /// Kills what is left of a job's group when a test fails half way (the box server's own
    /// stop does not reach a `setsid` group).
    struct GroupGuard(u32);

    impl Drop for GroupGuard {
        fn drop(&mut self) {
            if self.0 > 1 && !live_members(self.0).is_empty() {
                // SAFETY: killpg only sends a signal, to the group this test's job made.
                unsafe {
                    libc::killpg(self.0 as i32, libc::SIGKILL);
                }
            }
        }
    }

    async fn wait_for_pgid(pgid_file: &Path) -> u32 {
        let start = Instant::now();
        loop {
            if let Ok(s) = fs::read_to_string(pgid_file) {
                if let Ok(n) = s.trim().parse() {
                    return n;
                }
            }
            assert!(start.elapsed() < HANG, "the job never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_gone(pgid: u32) -> Vec<String> {
        let start = Instant::now();
        loop {
            let left = live_members(pgid);
            if left.is_empty() || start.elapsed() > HANG {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test]
    async fn a_cancelled_command_is_killed_in_the_sandbox_with_its_children() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let sup = supervised(&s);
        let pgid_file = s.workspace.join("pgid");
        let job = Job {
            program: long_program(&pgid_file),
            ..Job::default()
        };
        let ctl = RunControl::default();
        let run = {
            let (sup, job, ctl) = (sup.clone(), job.clone(), ctl.clone());
            tokio::spawn(async move { sup.run_job(&job, &ctl).await })
        };
        let pgid = wait_for_pgid(&pgid_file).await;
        let _guard = GroupGuard(pgid);
        // The job shell, the sleeper and the busy subshell.
        assert!(live_members(pgid).len() >= 3, "{:?}", live_members(pgid));
        let asked = Instant::now();
        ctl.cancel.cancel();
        let r = tokio::time::timeout(HANG, run).await.unwrap().unwrap();
        match r {
            Err(RemoteError::Transport(m)) => {
                assert!(m.contains("cancelled"), "{m}");
                assert!(m.contains("its process group was stopped"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // Stopped right away (TERM reaches all of them), not at the end of its sleep.
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(live_members(pgid), Vec::<String>::new());
        assert_eq!(job_files(&job.id), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_timeout_or_a_dropped_run_kills_the_command_too() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let sup = supervised(&s);
        // The timeout.
        let pgid_file = s.workspace.join("pgid-timeout");
        let job = Job {
            program: long_program(&pgid_file),
            ..Job::default()
        };
        let ctl = RunControl {
            timeout: Some(Duration::from_secs(2)),
            ..RunControl::default()
        };
        let r = sup.run_job(&job, &ctl).await;
        assert!(matches!(r, Err(RemoteError::TimedOut(_))), "{r:?}");
        let pgid = wait_for_pgid(&pgid_file).await;
        let _guard = GroupGuard(pgid);
        assert_eq!(live_members(pgid), Vec::<String>::new());
        assert_eq!(job_files(&job.id), Vec::<String>::new());

        // A run whose future is dropped (a FUSE interrupt, a dropped query): the cancel goes
        // from a spawned task.
        let pgid_file = s.workspace.join("pgid-dropped");
        let job = Job {
            program: long_program(&pgid_file),
            ..Job::default()
        };
        let run = {
            let (sup, job) = (sup.clone(), job.clone());
            tokio::spawn(async move { sup.run_job(&job, &RunControl::default()).await })
        };
        let pgid = wait_for_pgid(&pgid_file).await;
        let _guard = GroupGuard(pgid);
        assert!(!live_members(pgid).is_empty());
        run.abort();
        assert!(run.await.unwrap_err().is_cancelled());
        assert_eq!(wait_gone(pgid).await, Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_cancel_before_the_start_leaves_a_marker_and_nothing_runs() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let sup = supervised(&s);
        let touched = s.workspace.join("touched");
        let job = Job {
            program: format!("touch '{}'\n", touched.display()),
            ..Job::default()
        };
        sup.cancel(&job.id).await.unwrap();
        let r = sup.run_job(&job, &RunControl::default()).await;
        match r {
            Err(RemoteError::Transport(m)) => assert!(m.contains("cancelled"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(!touched.exists(), "the program ran");
        assert_eq!(job_files(&job.id), Vec::<String>::new());
    }

    #[tokio::test]
    async fn the_transport_reports_that_it_kills() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let opts = ConnectOptions {
            token: Some(s.token.clone()),
            ..Default::default()
        };
        let c = connect(&s.url(), &opts).await.expect("connect");
        assert!(c.info.capabilities.kill, "{:?}", c.info.capabilities);
        assert!(!c.info.capabilities.feed);
    }

    /// A loopback TCP forwarder to `upstream` that keeps every byte the client sent.
    async fn recorder(upstream: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                log.lock().unwrap().extend_from_slice(&buf[..n]);
                                if sw.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = sw.shutdown().await;
                    let _ = down.await;
                });
            }
        });
        (port, seen)
    }

    fn count(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).filter(|w| *w == needle).count()
    }

    #[tokio::test]
    async fn header_file_headers_go_on_every_box_server_request() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let (port, seen) = recorder(s.port).await;
        let dir = tempfile::tempdir().unwrap();
        let headers = dir.path().join("headers");
        fs::write(
            &headers,
            "# the provider's gateway\nX-Sbxfs-Gateway: gw-s3cret-value\nX-Second: two\n",
        )
        .unwrap();
        fs::write(s.workspace.join("f"), "hello").unwrap();
        let opts = ConnectOptions {
            token: Some(s.token.clone()),
            header_file: Some(headers.clone()),
            ..Default::default()
        };
        let c = connect(&format!("agentscope+http://127.0.0.1:{port}"), &opts)
            .await
            .expect("connect");
        let f = RemotePath::new(b"f".to_vec()).unwrap();
        // A read (the server's GET /workspace/file) and a commit (PUT, then a rename).
        let got = c.remote.read(&f, 0, 100).await.unwrap();
        assert_eq!(&got.data[..], b"hello");
        c.remote
            .commit(
                &f,
                CommitContent::Whole(Box::new(std::io::Cursor::new(b"bye".to_vec()))),
                CommitOptions::default(),
            )
            .await
            .unwrap();
        assert_eq!(fs::read(s.workspace.join("f")).unwrap(), b"bye");

        let sent = seen.lock().unwrap().to_ascii_lowercase();
        let requests = count(&sent, b" http/1.1\r\n");
        assert!(requests >= 4, "{requests} requests");
        assert!(count(&sent, b"get /workspace/file?") >= 1);
        assert!(count(&sent, b"put /workspace/file?") >= 1);
        assert_eq!(
            count(&sent, b"\r\nx-sbxfs-gateway: gw-s3cret-value\r\n"),
            requests,
            "a request without the header"
        );
        assert_eq!(count(&sent, b"\r\nx-second: two\r\n"), requests);

        // A header file that cannot be read is refused before any request, naming the file.
        let before = seen.lock().unwrap().len();
        let bad = ConnectOptions {
            header_file: Some(dir.path().join("missing")),
            ..opts.clone()
        };
        let e = connect(&format!("agentscope+http://127.0.0.1:{port}"), &bad)
            .await
            .err()
            .expect("refused");
        assert!(matches!(e, RemoteError::Invalid(_)), "{e}");
        assert!(e.to_string().contains("--header-file"), "{e}");
        assert_eq!(seen.lock().unwrap().len(), before);
    }

    #[tokio::test]
    async fn an_oversized_xattr_value_is_refused_before_it_reaches_the_box_server() {
        let Some(s) = BoxServer::start(None) else {
            return;
        };
        let (port, seen) = recorder(s.port).await;
        let opts = ConnectOptions {
            token: Some(s.token.clone()),
            ..Default::default()
        };
        let c = connect(&format!("agentscope+http://127.0.0.1:{port}"), &opts)
            .await
            .expect("connect");
        fs::write(s.workspace.join("f"), "x").unwrap();
        let f = RemotePath::new(b"f".to_vec()).unwrap();
        let before = seen.lock().unwrap().len();
        let big = vec![b'v'; sbxfs::remote::MAX_XATTR_VALUE_BYTES + 1];
        let e = c
            .remote
            .setxattr(&f, b"user.big", &big, Default::default())
            .await
            .unwrap_err();
        assert!(matches!(e, RemoteError::TooLarge(_)), "{e}");
        assert_eq!(seen.lock().unwrap().len(), before, "a request was sent");
    }
}
