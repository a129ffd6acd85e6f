//! Each mistake a user can make when mounting or starting an agent gets one line naming the
//! cause and its documented exit code, and leaves nothing behind: no mount, no process, no
//! file in the private state directories. The real binary runs against real servers: a closed
//! port, an unresolvable name, python's http.server, a listener that never answers, a TLS
//! server with a self-signed certificate, a real agent with another token.

use crate::common;

use std::fs;
use std::io::{BufRead, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

/// A mount attempt's private world: its mountpoint, state (`XDG_CACHE_HOME`) and runtime
/// (`XDG_RUNTIME_DIR`) directories, and a token file.
struct Attempt {
    base: tempfile::TempDir,
}

impl Attempt {
    fn new(token: &str) -> Attempt {
        let base = tempfile::tempdir().unwrap();
        for d in ["mnt", "cache", "run"] {
            fs::create_dir(base.path().join(d)).unwrap();
        }
        fs::write(base.path().join("token"), token).unwrap();
        Attempt { base }
    }

    fn mnt(&self) -> PathBuf {
        self.base.path().join("mnt")
    }

    /// Run `sbxfs mount URL MNT` to its end; its exit code and stderr.
    fn mount(&self, url: &str, extra: &[&str]) -> (i32, String) {
        self.mount_env(url, extra, &[])
    }

    fn mount_env(&self, url: &str, extra: &[&str], env: &[(&str, &Path)]) -> (i32, String) {
        let (code, _, err) = run(Command::new(sbxfs_bin())
            .arg("mount")
            .arg(url)
            .arg(self.mnt())
            .arg("--token-file")
            .arg(self.base.path().join("token"))
            .args(extra)
            .env("XDG_CACHE_HOME", self.base.path().join("cache"))
            .env("XDG_RUNTIME_DIR", self.base.path().join("run"))
            .env_remove("SBXFS_LOG")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null()));
        (code, String::from_utf8_lossy(&err).into_owned())
    }

    /// Nothing left behind: the mountpoint is a plain empty directory, not a mount, and the
    /// state and runtime directories hold nothing.
    fn assert_nothing_left(&self) {
        let mnt = self.mnt();
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(mnt.to_str().unwrap()),
            "still mounted: {mnt:?}"
        );
        assert_eq!(
            fs::read_dir(&mnt).unwrap().count(),
            0,
            "mountpoint not empty"
        );
        for d in ["cache", "run"] {
            let left: Vec<_> = fs::read_dir(self.base.path().join(d))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert!(left.is_empty(), "left behind in {d}: {left:?}");
        }
    }
}

/// The single line of stderr (the error) and the exit code, asserted.
fn assert_one_line(err: &str, code: i32, want_code: i32, want: &str) {
    assert_eq!(code, want_code, "exit code; stderr: {err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].contains(want), "{want:?} not in {:?}", lines[0]);
}

/// A child process stopped (by pid) on drop, even when the test fails.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait until something accepts connections on `port` (the server started).
fn wait_listening(port: u16, server: &mut Child) {
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(s)) = server.try_wait() {
            panic!("the server exited: {s}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("nothing listens on {port}");
}

/// A python3 server on a free port, running `script` (which gets the port as argv[1]).
fn python_server(script: &str, dir: &Path) -> (Process, u16) {
    require_tool("python3").expect("python3");
    let port = free_port();
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(port.to_string())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port, &mut child);
    (Process(child), port)
}

/// A server answering every request with `status` and `body` once, then closing.
fn fixed_answer_server(status: &'static str, body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn a_url_without_a_scheme_says_the_expected_form() {
    let a = Attempt::new("t");
    let (code, err) = a.mount("127.0.0.1:7781", &[]);
    assert_one_line(
        &err,
        code,
        2,
        "not a sandbox URL: expected http(s)://HOST:PORT, ssh://",
    );
    assert!(err.contains("\"127.0.0.1:7781\""), "{err}");
    a.assert_nothing_left();
}

#[test]
fn a_refused_connection_names_the_address() {
    let a = Attempt::new("t");
    let port = free_port();
    let (code, err) = a.mount(&format!("http://127.0.0.1:{port}"), &[]);
    assert_one_line(
        &err,
        code,
        5,
        &format!("connection refused by 127.0.0.1:{port}"),
    );
    a.assert_nothing_left();
}

#[test]
fn an_unresolvable_name_names_the_host() {
    let a = Attempt::new("t");
    let (code, err) = a.mount("http://nonexistent.invalid:1", &[]);
    assert_one_line(
        &err,
        code,
        5,
        "host name \"nonexistent.invalid\" not resolved",
    );
    a.assert_nothing_left();
}

#[test]
fn a_plain_web_server_is_not_an_agent_and_says_what_answered() {
    let a = Attempt::new("t");
    let site = tempfile::tempdir().unwrap();
    let (_server, port) = python_server(
        "import sys, http.server\n\
         http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), \
         http.server.SimpleHTTPRequestHandler).serve_forever()",
        site.path(),
    );
    let (code, err) = a.mount(&format!("http://127.0.0.1:{port}"), &[]);
    assert_one_line(
        &err,
        code,
        6,
        &format!("http://127.0.0.1:{port} answered 404 Not Found (server: SimpleHTTP/"),
    );
    assert!(err.trim_end().ends_with("not an sbxfs agent"), "{err}");
    a.assert_nothing_left();
}

/// A server on a free port that accepts and holds every connection without a word.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    port
}

#[test]
fn a_server_that_never_answers_times_out() {
    let a = Attempt::new("t");
    let port = silent_server();
    let (code, err) = a.mount(
        &format!("http://127.0.0.1:{port}"),
        &["-o", "timeout_ms=300"],
    );
    assert_one_line(
        &err,
        code,
        5,
        &format!("http://127.0.0.1:{port}: no answer within 300ms"),
    );
    a.assert_nothing_left();
}

#[test]
fn a_server_that_never_answers_is_waited_for_with_progress() {
    let a = Attempt::new("t");
    let port = silent_server();
    // Progress every 5 s: one line at 5 s, then the time-out at 7 s.
    let (code, err) = a.mount(
        &format!("http://127.0.0.1:{port}"),
        &["-o", "timeout_ms=7000"],
    );
    assert_eq!(code, 5, "{err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(
        lines,
        [
            format!("sbxfs mount: still waiting for http://127.0.0.1:{port} (5 s)").as_str(),
            &format!(
                "sbxfs mount: http://127.0.0.1:{port}: no answer within 7s: is the agent running \
                 there? (a longer wait: -o timeout_ms=MS)"
            ),
        ]
    );
    a.assert_nothing_left();
}

#[test]
fn a_missing_token_file_is_named() {
    let a = Attempt::new("t");
    let (code, err) = a.mount(
        "http://127.0.0.1:1",
        &["-o", "token_file=/nonexistent/token"],
    );
    assert_one_line(
        &err,
        code,
        2,
        "--token-file /nonexistent/token: No such file or directory",
    );
    a.assert_nothing_left();
}

#[test]
fn a_wrong_token_is_rejected_by_the_agent() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let a = Attempt::new("not-the-token");
    let (code, err) = a.mount(&agent.url, &[]);
    assert_one_line(&err, code, 7, "the agent rejected the token");
    a.assert_nothing_left();
}

#[test]
fn another_protocol_version_is_named() {
    let port = fixed_answer_server(
        "200 OK",
        r#"{"protocol": 99, "agent_version": "9.9.9", "root": "/w"}"#,
    );
    let a = Attempt::new("t");
    let (code, err) = a.mount(&format!("http://127.0.0.1:{port}"), &[]);
    assert_one_line(
        &err,
        code,
        6,
        "the agent speaks protocol 99 (sbxfs 9.9.9), this sbxfs speaks protocol 2",
    );
    a.assert_nothing_left();
}

#[test]
fn a_401_from_another_server_is_not_a_token_problem() {
    let port = fixed_answer_server("401 Unauthorized", "{}");
    let a = Attempt::new("t");
    let (code, err) = a.mount(&format!("http://127.0.0.1:{port}"), &[]);
    assert_one_line(
        &err,
        code,
        6,
        "answered 401 Unauthorized: not an sbxfs agent",
    );
    a.assert_nothing_left();
}

/// An https server with a self-signed certificate for 127.0.0.1 does not pass as trusted; the
/// same server, its certificate made trusted (`SSL_CERT_FILE`), is reached over TLS.
#[test]
fn an_untrusted_certificate_is_a_tls_error_and_a_trusted_one_works() {
    let Some(openssl) = require_tool("openssl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run(Command::new(openssl)
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .current_dir(dir.path()));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let (_server, port) = python_server(
        "import sys, ssl, http.server\n\
         s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)\n\
         c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
         c.load_cert_chain('cert.pem', 'key.pem')\n\
         s.socket = c.wrap_socket(s.socket, server_side=True)\n\
         s.serve_forever()",
        dir.path(),
    );
    let a = Attempt::new("t");
    let (code, err) = a.mount(&format!("https://127.0.0.1:{port}"), &[]);
    assert_one_line(&err, code, 6, "TLS: certificate not trusted");
    a.assert_nothing_left();
    let cert = dir.path().join("cert.pem");
    let (code, err) = a.mount_env(
        &format!("https://127.0.0.1:{port}"),
        &[],
        &[("SSL_CERT_FILE", &cert)],
    );
    // TLS worked: what answered is python's web server, not an agent.
    assert_one_line(
        &err,
        code,
        6,
        &format!("https://127.0.0.1:{port} answered 404 Not Found (server: SimpleHTTP/"),
    );
    a.assert_nothing_left();
}

#[test]
fn https_to_a_plain_http_agent_is_a_tls_handshake_error() {
    let ws = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(ws.path());
    let a = Attempt::new(&agent.token);
    let url = agent.url.replace("http://", "https://");
    let (code, err) = a.mount(&url, &[]);
    assert_one_line(&err, code, 6, "TLS: handshake failed");
    a.assert_nothing_left();
}

/// Run `sbxfs agent ARGS` (token from a file) to its end; exit code and stderr.
fn agent_fails(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, "t").unwrap();
    let (code, _, err) = run(Command::new(sbxfs_bin())
        .arg("agent")
        .args(args)
        .arg("--token-file")
        .arg(&token)
        .env("SBXFS_LOG", "warn"));
    (code, String::from_utf8_lossy(&err).into_owned())
}

/// Start `sbxfs agent ARGS`; the process (stopped on drop), its ready line and stderr file.
fn agent_starts(args: &[&str], dir: &Path) -> (Process, String, PathBuf) {
    let token = dir.join("token");
    fs::write(&token, "t").unwrap();
    let log = dir.join("agent.log");
    let mut child = Command::new(sbxfs_bin())
        .arg("agent")
        .args(args)
        .arg("--token-file")
        .arg(&token)
        .env("SBXFS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Process(child), line, log)
}

#[test]
fn an_agent_root_that_does_not_exist_is_named() {
    let (code, err) = agent_fails(&[
        "--root",
        "/nonexistent/sbxfs-root",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_one_line(
        &err,
        code,
        2,
        "--root /nonexistent/sbxfs-root: No such file or directory",
    );
}

#[test]
fn an_address_in_use_is_named() {
    let ws = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = agent_fails(&["--root", ws.path().to_str().unwrap(), "--listen", &addr]);
    assert_one_line(
        &err,
        code,
        2,
        &format!("cannot listen on {addr}: Address already in use"),
    );
}

#[test]
fn an_agent_listens_on_a_host_name() {
    let ws = tempfile::tempdir().unwrap();
    let (_agent, ready, log) = agent_starts(
        &[
            "--root",
            ws.path().to_str().unwrap(),
            "--listen",
            "localhost:0",
        ],
        ws.path(),
    );
    assert!(ready.contains("listening on http://127.0.0.1:"), "{ready}");
    assert!(!fs::read_to_string(log).unwrap().contains("warning"));
}

#[test]
fn a_non_loopback_listen_address_is_warned_about() {
    let ws = tempfile::tempdir().unwrap();
    let (_agent, ready, log) = agent_starts(
        &[
            "--root",
            ws.path().to_str().unwrap(),
            "--listen",
            "0.0.0.0:0",
        ],
        ws.path(),
    );
    assert!(ready.contains("listening on http://0.0.0.0:"), "{ready}");
    let log = fs::read_to_string(log).unwrap();
    assert!(
        log.contains(
            "0.0.0.0:0 is not a loopback address: the token and every file travel in clear"
        ),
        "{log}"
    );
    assert!(log.contains("ssh tunnel"), "{log}");
}

#[test]
fn the_token_appears_in_no_log_at_trace_level() {
    let token = "sekrit-token-4f1c9a77e2";
    let ws = tempfile::tempdir().unwrap();
    fs::write(ws.path().join("hello.txt"), "hello\n").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let token_file = logs.path().join("token");
    fs::write(&token_file, token).unwrap();
    let agent_log = logs.path().join("agent.log");
    let mut child = Command::new(sbxfs_bin())
        .args(["agent", "--listen", "127.0.0.1:0", "--root"])
        .arg(ws.path())
        .arg("--token-file")
        .arg(&token_file)
        .env("SBXFS_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&agent_log).unwrap())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    let agent = Process(child);
    let url = ready
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let mut m = MountProcess::start_url_env(&url, token, &[], &[("SBXFS_LOG", "trace")]);
    // Traffic: a read, a write pushed, a listing.
    let mut text = String::new();
    fs::File::open(m.dir.join("hello.txt"))
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "hello\n");
    fs::write(m.dir.join("new.txt"), "new\n").unwrap();
    assert_eq!(fs::read_dir(&m.dir).unwrap().count(), 2);
    assert_eq!(m.stop(), Some(0));
    drop(agent);
    assert_eq!(
        fs::read_to_string(ws.path().join("new.txt")).unwrap(),
        "new\n"
    );
    let mount_log = m.log_text();
    let agent_log = fs::read_to_string(&agent_log).unwrap();
    // The logs are real trace logs, and neither holds the token.
    assert!(mount_log.contains("TRACE"), "mount log is not at trace");
    assert!(!mount_log.contains('\x1b'), "ANSI codes in a log file");
    assert!(agent_log.contains("TRACE"), "agent log is not at trace");
    assert!(
        !mount_log.contains(token),
        "the token is in the mount's log"
    );
    assert!(
        !agent_log.contains(token),
        "the token is in the agent's log"
    );
}

/// Run `sbxfs agent` (started, then stopped) with stderr to a file, `env` set; the log's text.
fn agent_log_with(env: &[(&str, &str)], journal: bool) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let file = fs::File::create(&log).unwrap();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.args(["agent", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.path())
        .env("SBXFS_TOKEN", "t")
        .env_remove("SBXFS_LOG")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .envs(env.iter().copied())
        .stdout(Stdio::piped());
    if journal {
        // As systemd does: JOURNAL_STREAM names the device and inode of the stream on stderr.
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().unwrap();
        cmd.env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()));
    }
    let mut child = Process(cmd.stderr(file).spawn().unwrap());
    let mut ready = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    // SIGTERM: the agent logs its stop and exits.
    let pid = rustix::process::Pid::from_child(&child.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    child.0.wait().unwrap();
    fs::read_to_string(log).unwrap()
}

#[test]
fn logs_in_a_file_have_no_colour_and_follow_the_filter() {
    let info = agent_log_with(&[], false);
    assert!(info.contains(" INFO sbxfs::agent: agent ready"), "{info}");
    assert!(!info.contains('\x1b'), "ANSI codes in a file: {info:?}");
    let quiet = agent_log_with(&[("RUST_LOG", "warn")], false);
    assert_eq!(quiet, "", "RUST_LOG is the fallback");
    let info = agent_log_with(&[("SBXFS_LOG", "info"), ("RUST_LOG", "warn")], false);
    assert!(
        info.contains("agent ready"),
        "SBXFS_LOG wins over RUST_LOG: {info}"
    );
}

#[test]
fn logs_to_the_journal_carry_syslog_priorities_and_no_timestamps() {
    let log = agent_log_with(&[], true);
    let lines: Vec<_> = log.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l.starts_with("<6>sbxfs::agent: "), "{l:?}");
        assert!(!l.contains('\x1b'), "{l:?}");
    }
    assert!(lines[0].contains("agent ready"), "{log}");
    // A JOURNAL_STREAM that is not this stderr (inherited, then redirected) changes nothing.
    let log = agent_log_with(&[("JOURNAL_STREAM", "1:1")], false);
    assert!(log.contains(" INFO sbxfs::agent: agent ready"), "{log}");
}

#[test]
fn an_error_line_to_the_journal_carries_the_error_priority() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let file = fs::File::create(&log).unwrap();
    let m = file.metadata().unwrap();
    let (code, _, _) = run(Command::new(sbxfs_bin())
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--root",
            "/nonexistent/root",
        ])
        .env("SBXFS_TOKEN", "t")
        .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
        .stderr(file));
    assert_eq!(code, 2);
    assert_eq!(
        fs::read_to_string(log).unwrap(),
        "<3>sbxfs agent: --root /nonexistent/root: No such file or directory (os error 2)\n"
    );
}
