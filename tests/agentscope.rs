//! The agentscope transport's Runner over a real agentscope-runtime box server: programs,
//! exit codes and both streams (binary, large, capped), large programs, file transfers
//! confined to the workspace, edit through it (edit.py and the fallback), no token in any
//! command line, and connect's first contact.

#[path = "common/boxserver.rs"]
mod boxserver;

use std::fs;
use std::os::unix::ffi::OsStrExt;

use boxserver::BoxServer;
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
