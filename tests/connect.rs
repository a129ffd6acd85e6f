//! `connect(url)` as a user meets it through `sbxfs mount`: https with `--ca-file`, a TLS
//! failure as one clear line and its exit code, `--header-file` headers on the wire (and never
//! in an error), an unknown scheme, and a real mount over https whose `ctl status` names the
//! transport and its capabilities.

use crate::common;

use std::io::{BufRead, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use common::testca::TestCa;
use common::{run, sbxfs_bin, AgentProcess, MountProcess};

/// `sbxfs mount URL DIR ARGS` expected to fail: its exit code and stderr. `timeout` only stops
/// a hung attempt.
fn mount_fails(url: &str, args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "conformance-token-0123456789").unwrap();
    let (code, _, err) = run(Command::new("timeout")
        .arg("60")
        .arg(sbxfs_bin())
        .arg("mount")
        .arg(url)
        .arg(&mnt)
        .arg("--token-file")
        .arg(&token)
        .args(args)
        .env("SBXFS_LOG", "warn")
        .env("XDG_CACHE_HOME", dir.path().join("cache")));
    (code, String::from_utf8_lossy(&err).into_owned())
}

/// One line of error, with `want` in it, and the exit code `code`.
fn assert_one_line(got: (i32, String), code: i32, want: &str) {
    let (c, err) = got;
    assert_eq!(c, code, "exit code; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(want), "{want:?} not in {err:?}");
}

/// An https agent whose certificate names `names`, signed by `ca`.
fn tls_agent(ca: &TestCa, names: &[&str], root: &Path) -> AgentProcess {
    let server = ca.server("agent", names);
    let (cert, key) = (
        server.cert.display().to_string(),
        server.key.display().to_string(),
    );
    AgentProcess::start_with_args(
        root,
        "conformance-token-0123456789",
        &["--tls-cert", &cert, "--tls-key", &key],
    )
}

#[test]
fn https_without_the_ca_is_one_tls_line_and_exit_6() {
    let Some(ca) = TestCa::new() else { return };
    let ws = tempfile::tempdir().unwrap();
    let agent = tls_agent(&ca, &["IP:127.0.0.1"], ws.path());
    assert_one_line(
        mount_fails(&agent.url, &[]),
        6,
        "TLS: certificate not trusted: pass the authority (CA) that signed it with --ca-file FILE",
    );
}

#[test]
fn plain_http_to_a_tls_agent_says_use_https_and_exits_6() {
    let Some(ca) = TestCa::new() else { return };
    let ws = tempfile::tempdir().unwrap();
    let agent = tls_agent(&ca, &["IP:127.0.0.1"], ws.path());
    let plain = agent.url.replace("https://", "http://");
    assert_one_line(
        mount_fails(&plain, &[]),
        6,
        "the server answered in TLS, not plain http: use https://",
    );
}

#[test]
fn a_certificate_for_another_host_is_named_as_such() {
    let Some(ca) = TestCa::new() else { return };
    let ws = tempfile::tempdir().unwrap();
    let agent = tls_agent(&ca, &["DNS:sandbox.example"], ws.path());
    let ca_file = ca.ca.display().to_string();
    assert_one_line(
        mount_fails(&agent.url, &["--ca-file", &ca_file]),
        6,
        "TLS: the certificate is not for host \"127.0.0.1\"",
    );
}

#[test]
fn a_ca_file_without_a_certificate_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    assert_one_line(
        mount_fails(
            "https://127.0.0.1:1",
            &["--ca-file", &bad.display().to_string()],
        ),
        2,
        "no PEM certificate in it",
    );
}

/// A server that records each request's header lines and answers 404 (not an agent).
fn header_recorder() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                keep.lock().unwrap().push(line.trim_end().to_string());
                line.clear();
            }
            let _ = write!(
                s,
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    (port, seen)
}

#[test]
fn header_file_headers_are_sent_and_never_shown() {
    let (port, seen) = header_recorder();
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("headers");
    std::fs::write(
        &headers,
        "# the provider's preview auth\n\nX-Preview-Key: s3cret-value\nX-Team: blue\n",
    )
    .unwrap();
    let got = mount_fails(
        &format!("http://127.0.0.1:{port}"),
        &["--header-file", &headers.display().to_string()],
    );
    assert!(!got.1.contains("s3cret"), "{}", got.1);
    assert_one_line(got, 6, "answered 404 Not Found");
    let seen = seen.lock().unwrap().clone();
    let has = |h: &str| seen.iter().any(|l| l.eq_ignore_ascii_case(h));
    assert!(has("x-preview-key: s3cret-value"), "{seen:?}");
    assert!(has("x-team: blue"), "{seen:?}");
    // The agent's token still travels as itself.
    assert!(
        has("authorization: Bearer conformance-token-0123456789"),
        "{seen:?}"
    );
}

#[test]
fn a_bad_header_line_is_named_by_number_without_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("headers");
    std::fs::write(&headers, "X-Ok: 1\nX-Key s3cret-value\n").unwrap();
    let got = mount_fails(
        "http://127.0.0.1:1",
        &["--header-file", &headers.display().to_string()],
    );
    assert!(!got.1.contains("s3cret"), "{}", got.1);
    assert_one_line(got, 2, "line 2: expected `Name: value`");
}

#[test]
fn an_unknown_scheme_is_a_usage_error_naming_the_forms() {
    let got = mount_fails("ftp://127.0.0.1/ws", &[]);
    assert_one_line(
        got,
        2,
        "not a sandbox URL: expected http(s)://HOST:PORT, ssh://",
    );
}

#[test]
fn a_mount_over_https_reads_writes_and_names_its_transport() {
    let Some(ca) = TestCa::new() else { return };
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "from the sandbox\n").unwrap();
    let agent = tls_agent(&ca, &["IP:127.0.0.1", "DNS:localhost"], ws.path());
    let ca_file = ca.ca.display().to_string();
    let m = MountProcess::start_url(
        &agent.url,
        &agent.token,
        &["--ca-file", &ca_file, "-o", "sync_close"],
    );
    assert_eq!(
        std::fs::read_to_string(m.dir.join("hello.txt")).unwrap(),
        "from the sandbox\n"
    );
    std::fs::write(m.dir.join("new.txt"), "written over https\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("new.txt")).unwrap(),
        "written over https\n",
        "with sync_close, the sandbox has the file once close returns"
    );
    let (code, out, err) = run(Command::new(sbxfs_bin())
        .args(["ctl", "--mount"])
        .arg(&m.dir)
        .args(["status", "--json"]));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["mount"]["transport"], "https", "{v:#}");
    let caps = &v["mount"]["capabilities"];
    for c in ["feed", "patch_commits", "server_search", "kill"] {
        assert_eq!(caps[c], true, "{c}: {v:#}");
    }
}

#[test]
fn http_to_an_ssh_port_says_it_is_ssh_and_names_ssh_urls() {
    let b = common::sshbox::SshBox::start();
    let port = b.sshd.as_ref().unwrap().port;
    for scheme in ["http", "https"] {
        let (code, err) = mount_fails(&format!("{scheme}://127.0.0.1:{port}"), &[]);
        assert_eq!(code, 6, "{scheme}: {err}");
        assert!(
            err.contains("an SSH server answered (SSH-2.0-") && err.contains("ssh://"),
            "{scheme}: {err}"
        );
        assert!(!err.contains("TLS"), "{scheme}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{scheme}: {err}");
    }
}
