//! Queries that run in the sandbox: the INFO ioctl (from Rust and from the C example), the
//! control socket and its owner check, and the `sbxfs` commands routed through a mount giving
//! exactly what they give run locally on the agent's root.

use crate::common;

use std::fs;
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use sbxfs::control::{MountInfo, IOC_INFO, IOC_INFO_SIZE};

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    agent: AgentProcess,
    mount: MountProcess,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir_all(root.join("src/net")).unwrap();
    fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    // TODO: port\n    serve(8080);\n}\n",
    )
    .unwrap();
    fs::write(
        root.join("src/net/server.rs"),
        "pub fn serve(p: u16) {\n    // TODO: shutdown\n}\n",
    )
    .unwrap();
    fs::write(root.join(".gitignore"), "target/\n").unwrap();
    fs::create_dir(root.join("target")).unwrap();
    fs::write(root.join("target/junk.rs"), "// TODO ignored\n").unwrap();
    let log: String = (1..=5000).map(|i| format!("line {i}\n")).collect();
    fs::write(root.join("app.log"), log).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &[]);
    Setup {
        _dir: dir,
        root,
        agent,
        mount,
    }
}

/// Raw INFO ioctl with a given command number and buffer size.
fn raw_ioctl(path: &Path, cmd: u32, size: usize) -> Result<Vec<u8>, i32> {
    let f = fs::File::open(path).unwrap();
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: the buffer is at least as large as the size encoded in `cmd` for every command
    // this test sends (it passes `size` equal to or larger than the encoded size).
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(buf)
}

fn ior(ty: u8, nr: u8, size: u32) -> u32 {
    (2 << 30) | (size << 16) | ((ty as u32) << 8) | nr as u32
}

#[test]
fn info_ioctl_answers_on_files_and_directories_and_refuses_malformed_requests() {
    let s = setup();
    for (p, want) in [
        (s.mount.dir.clone(), ""),
        (s.mount.dir.join("src"), "src"),
        (s.mount.dir.join("src/main.rs"), "src/main.rs"),
    ] {
        let buf = raw_ioctl(&p, IOC_INFO, IOC_INFO_SIZE).unwrap();
        let end = buf.iter().position(|&b| b == 0).unwrap();
        let info: MountInfo = serde_json::from_slice(&buf[..end]).unwrap();
        assert_eq!(info.path.0, want.as_bytes());
        assert_eq!(info.remote, s.agent.url);
        assert!(Path::new(&info.socket).exists());
    }
    // Another command, or the right number with the wrong size: refused, and the mount goes on.
    assert_eq!(
        raw_ioctl(&s.mount.dir, ior(b'S', 2, 4096), 4096),
        Err(libc::ENOTTY)
    );
    assert_eq!(
        raw_ioctl(&s.mount.dir, ior(b'S', 1, 16), 16).unwrap_err(),
        libc::ENOTTY
    );
    assert_eq!(
        raw_ioctl(&s.mount.dir.join("src"), libc::FIONREAD as u32, 8).unwrap_err(),
        libc::ENOTTY
    );
    // Outside a mount the same ioctl is simply not understood.
    assert!(raw_ioctl(s.root.as_path(), IOC_INFO, IOC_INFO_SIZE).is_err());
    assert!(fs::read_dir(&s.mount.dir).unwrap().count() > 0);
}

#[test]
fn the_c_example_calls_the_ioctl() {
    let Some(cc) = require_tool("cc") else { return };
    let out_dir = tempfile::tempdir().unwrap();
    let exe = out_dir.path().join("sbxfs_info");
    let st = Command::new(cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&exe)
        .arg(repo_root().join("scripts/sbxfs_info.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let s = setup();
    let (code, out, _) = run(Command::new(&exe).arg(s.mount.dir.join("src/net")));
    assert_eq!(code, 0);
    let info: MountInfo = serde_json::from_slice(out.trim_ascii()).unwrap();
    assert_eq!(info.path.0, b"src/net");
    let (code, _, _) = run(Command::new(&exe).arg(&s.root));
    assert_eq!(code, 1, "not an sbxfs mount");
}

fn sbxfs_in(dir: &Path, args: &[&str]) -> (i32, String) {
    let (code, out, err) = run(Command::new(sbxfs_bin()).current_dir(dir).args(args));
    (
        code,
        String::from_utf8_lossy(&out).into_owned() + &String::from_utf8_lossy(&err),
    )
}

#[test]
fn commands_in_a_mount_run_in_the_sandbox_and_answer_exactly_as_locally() {
    let s = setup();
    let before = rt().block_on(s.agent.client().agent_stats()).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["grep", "TODO"],
        vec!["grep", "--json", "-C", "1", "TODO"],
        vec!["grep", "-i", "serve", "src"],
        vec!["grep", "--json", "zzz-nothing"],
        vec!["glob", "**/*.rs"],
        vec!["glob", "--json", "src/*"],
        vec!["fuzzy", "--json", "srvr"],
        vec!["scan", "app.log", "--start", "4990", "--json"],
        vec!["scan", "app.log", "--start", "10", "--end", "12"],
        vec!["grep", "("],
    ];
    for args in &cases {
        let here = sbxfs_in(&s.mount.dir, args);
        let there = sbxfs_in(&s.root, args);
        assert_eq!(
            here, there,
            "sbxfs {args:?} differs between the mount and the sandbox itself"
        );
    }
    // The answers came from the sandbox: it ran the searches.
    let after = rt().block_on(s.agent.client().agent_stats()).unwrap();
    assert!(
        after["greps_completed"].as_u64().unwrap()
            >= before["greps_completed"].as_u64().unwrap() + 3
    );
    // A grep in the mount reads no file content through it.
    assert!(after["bytes_read"].as_u64().unwrap() - before["bytes_read"].as_u64().unwrap() < 1000);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

#[test]
fn an_edit_through_the_mount_shows_in_cat_right_after() {
    let s = setup();
    let m = &s.mount.dir;
    assert!(fs::read_to_string(m.join("src/main.rs"))
        .unwrap()
        .contains("8080"));
    let (code, out) = sbxfs_in(
        m,
        &[
            "edit",
            "src/main.rs",
            "--old",
            "8080",
            "--new",
            "9090",
            "--json",
        ],
    );
    assert_eq!((code, out.trim()), (0, r#"{"count":1}"#));
    assert!(fs::read_to_string(m.join("src/main.rs"))
        .unwrap()
        .contains("serve(9090)"));
    assert!(fs::read_to_string(s.root.join("src/main.rs"))
        .unwrap()
        .contains("serve(9090)"));
    // Unpushed local writes are pushed before a query answers, so it sees them.
    fs::write(m.join("src/new.rs"), "// TODO fresh\n").unwrap();
    let (_, out) = sbxfs_in(m, &["grep", "fresh"]);
    assert_eq!(out, "src/new.rs:// TODO fresh\n");
}

#[test]
fn ctl_reports_stats_status_and_flushes() {
    let s = setup();
    let m = &s.mount.dir;
    let _ = fs::read(m.join("app.log")).unwrap();
    let (code, out) = sbxfs_in(m, &["ctl", "stats", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["stats"]["bytes_read"].as_u64().unwrap() > 0);
    assert!(v["remote_round_trip_ms"].as_f64().is_some());
    let (code, out) = sbxfs_in(m, &["ctl", "status", "--json"]);
    assert_eq!(code, 0);
    assert!(out.contains("\"reachable\": true"), "{out}");
    let (code, out) = sbxfs_in(m, &["ctl", "flush", "--json"]);
    assert_eq!(code, 0);
    assert!(out.contains("\"flushed\": true"));
    let (code, _) = sbxfs_in(m, &["ctl", "invalidate", "src/main.rs"]);
    assert_eq!(code, 0);
    let (code, out) = sbxfs_in(&s.root, &["ctl", "stats"]);
    assert_eq!(code, 2, "outside a mount: {out}");
}

#[test]
fn the_control_socket_refuses_other_users() {
    let Some(setpriv) = require_tool("setpriv") else {
        return;
    };
    let s = setup();
    let buf = raw_ioctl(&s.mount.dir, IOC_INFO, IOC_INFO_SIZE).unwrap();
    let end = buf.iter().position(|&b| b == 0).unwrap();
    let info: MountInfo = serde_json::from_slice(&buf[..end]).unwrap();
    let mode = fs::metadata(&info.socket).unwrap().permissions();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.mode() & 0o777, 0o600);
    // `nobody`, even allowed past the file permissions, is refused by the peer-credential check.
    let client = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); s.sendall(b'{{\"v\":1,\"op\":\"status\"}}\\n'); print(s.recv(4096).decode())",
        info.socket
    );
    let out = Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=+dac_override",
            "--ambient-caps=+dac_override",
            "python3",
            "-c",
            &client,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("EACCES"),
        "stdout {text:?} stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The owner is served.
    let (code, out) = sbxfs_in(&s.mount.dir, &["ctl", "status"]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn interrupting_a_grep_in_a_mount_stops_the_search_in_the_sandbox() {
    let s = setup();
    for d in 0..40 {
        fs::create_dir(s.root.join(format!("big{d}"))).unwrap();
        for f in 0..40 {
            let body: String = (0..200).map(|i| format!("needle {i}\n")).collect();
            fs::write(s.root.join(format!("big{d}/f{f}.txt")), body).unwrap();
        }
    }
    let mut cmd = Command::new(sbxfs_bin());
    cmd.current_dir(&s.mount.dir)
        .args(["grep", "-j", "1", "needle"])
        .stdout(Stdio::piped());
    // SIGINT as a terminal delivers it, even when this test runs in a background job (whose
    // shell set SIGINT ignored, which children inherit).
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("needle"));
    // Ctrl-C.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let _ = child.wait();
    let client = s.agent.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = rt().block_on(client.agent_stats()).unwrap();
        if st["greps_cancelled"].as_u64() == Some(1) {
            assert_eq!(st["greps_completed"].as_u64(), Some(0));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox kept searching: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = (
        std::io::stdout().flush(),
        std::io::stdin().read(&mut [0u8; 0]),
    );
}

/// A workspace a search spends seconds in without finding anything: 200 MiB of text no
/// pattern below matches.
fn quiet_workspace() -> (tempfile::TempDir, AgentProcess, MountProcess) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let line = "abcdefghij klmnopqrst uvwxyz0123 ".repeat(3) + "\n";
    let body = line.repeat((1 << 20) / line.len());
    for i in 0..200 {
        fs::write(root.join(format!("f{i:03}.txt")), &body).unwrap();
    }
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &[]);
    (dir, agent, mount)
}

/// A pattern the quiet workspace never matches, slow to rule out on every line.
const NOWHERE: &str = r"(?i)ZZZ[a-z]+\w{3}(foo|bar)";

/// Interrupt `cmd` (SIGINT as a terminal gives it) once the agent has started its search,
/// then require the search cancelled in the sandbox, not finished, and the agent idle after.
fn interrupted_search_stops_in_the_sandbox(agent: &AgentProcess, mut cmd: Command) {
    // SIGINT's default action even when this test runs in a background job (whose shell set
    // SIGINT ignored, which children inherit).
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let client = agent.client();
    let stats = || rt().block_on(client.agent_stats()).unwrap();
    let mut child = cmd.stdout(Stdio::null()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stats()["greps_started"].as_u64() != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the search never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = stats();
        if st["greps_cancelled"].as_u64() == Some(1) {
            break;
        }
        assert_eq!(
            st["greps_completed"].as_u64(),
            Some(0),
            "the sandbox searched to the end after the interrupt: {st}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox kept searching: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And it is really idle: a second of the agent's CPU time, not the search's seconds.
    let before = cpu_ticks(agent.child.id());
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(agent.child.id()) - before;
    assert!(
        used < 30,
        "the agent used {used} ticks in the second after the cancel"
    );
    assert_eq!(stats()["greps_completed"].as_u64(), Some(0));
}

#[test]
fn interrupting_a_grep_that_has_found_nothing_yet_stops_the_search_in_the_sandbox() {
    let (_dir, agent, mount) = quiet_workspace();
    let mut cmd = Command::new(sbxfs_bin());
    cmd.current_dir(&mount.dir).args(["grep", NOWHERE]);
    interrupted_search_stops_in_the_sandbox(&agent, cmd);
    // The mount still answers queries.
    let (code, out) = sbxfs_in(&mount.dir, &["glob", "f00*.txt"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().count(), 10);
}

#[test]
fn interrupting_a_query_ioctl_stops_the_search_in_the_sandbox() {
    let (_dir, agent, mount) = quiet_workspace();
    let request = serde_json::json!({"v": 1, "op": "grep", "options": {"pattern": NOWHERE}});
    let script = format!(
        "import fcntl, os, sys\n\
         buf = bytearray({size})\n\
         req = {req:?}.encode()\n\
         buf[:len(req)] = req\n\
         fd = os.open(sys.argv[1], os.O_RDONLY)\n\
         fcntl.ioctl(fd, {cmd}, buf)\n",
        size = sbxfs::control::IOC_QUERY_SIZE,
        req = request.to_string(),
        cmd = sbxfs::control::IOC_QUERY,
    );
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script).arg(&mount.dir);
    interrupted_search_stops_in_the_sandbox(&agent, cmd);
}

/// The QUERY ioctl with a raw request buffer.
fn raw_query(path: &Path, request: &[u8]) -> Result<serde_json::Value, i32> {
    use sbxfs::control::{IOC_QUERY, IOC_QUERY_SIZE};
    let f = fs::File::open(path).unwrap();
    let mut buf = vec![0u8; IOC_QUERY_SIZE];
    buf[..request.len()].copy_from_slice(request);
    // SAFETY: `buf` is exactly the size IOC_QUERY encodes.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), IOC_QUERY as _, buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap();
    Ok(serde_json::from_slice(&buf[..end]).unwrap())
}

#[test]
fn query_ioctl_answers_small_queries_and_refuses_bad_or_oversized_ones() {
    let s = setup();
    let m = &s.mount.dir;
    let v = raw_query(
        &m.join("app.log"),
        br#"{"v":1,"op":"scan","request":{"start_line":4999,"end_line":null,"max_bytes":100}}"#,
    )
    .unwrap();
    assert_eq!(v["lines"], serde_json::json!(["line 4999", "line 5000"]));
    let v = raw_query(
        &m.join("src"),
        br#"{"v":1,"op":"glob","pattern":"**/*.rs"}"#,
    )
    .unwrap();
    assert_eq!(v["paths"], serde_json::json!(["main.rs", "net/server.rs"]));
    let v = raw_query(m, br#"{"v":1,"op":"grep","options":{"pattern":"TODO"}}"#).unwrap();
    assert_eq!(v["matches"].as_array().unwrap().len(), 2);
    // A query error is an answer, not an errno.
    let v = raw_query(m, br#"{"v":1,"op":"grep","options":{"pattern":"("}}"#).unwrap();
    assert_eq!(v["error"], "invalid_regex");
    // Malformed: not JSON, unknown op, wrong version.
    assert_eq!(raw_query(m, b"not json"), Err(libc::EINVAL));
    assert_eq!(
        raw_query(m, br#"{"v":1,"op":"format-disk"}"#),
        Err(libc::EINVAL)
    );
    assert_eq!(raw_query(m, br#"{"v":9,"op":"stats"}"#), Err(libc::EINVAL));
    // An answer larger than the buffer: E2BIG (the CLI then asks the control socket).
    let big = raw_query(
        &m.join("app.log"),
        br#"{"v":1,"op":"scan","request":{"start_line":1,"end_line":null,"max_bytes":1000000}}"#,
    );
    assert_eq!(big, Err(libc::E2BIG));
    let (code, out) = sbxfs_in(
        m,
        &["scan", "app.log", "--start", "1", "--max-bytes", "1000000"],
    );
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 5000, "the CLI fell back to the socket");
    // The mount still serves.
    assert!(fs::read_to_string(m.join("src/main.rs"))
        .unwrap()
        .contains("TODO"));
}

#[test]
fn mount_and_socket_options_work_from_outside_the_mount() {
    let s = setup();
    let elsewhere = tempfile::tempdir().unwrap();
    let m = s.mount.dir.to_str().unwrap().to_string();
    let (code, out) = sbxfs_in(elsewhere.path(), &["grep", "TODO", "src", "--mount", &m]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            "src/main.rs:    // TODO: port\nsrc/net/server.rs:    // TODO: shutdown\n"
        )
    );
    let buf = raw_ioctl(&s.mount.dir, IOC_INFO, IOC_INFO_SIZE).unwrap();
    let end = buf.iter().position(|&b| b == 0).unwrap();
    let info: MountInfo = serde_json::from_slice(&buf[..end]).unwrap();
    let (code, out) = sbxfs_in(
        elsewhere.path(),
        &[
            "scan",
            "app.log",
            "--start",
            "4999",
            "--socket",
            &info.socket,
        ],
    );
    assert_eq!((code, out.as_str()), (0, "line 4999\nline 5000\n"));
    let (code, out) = sbxfs_in(
        elsewhere.path(),
        &["glob", "**/server.rs", "--socket", &info.socket],
    );
    assert_eq!((code, out.as_str()), (0, "src/net/server.rs\n"));
}

/// A sandbox that stops answering (its agent frozen, as a paused container's is): a query is
/// given up once the mount's probe goes unanswered, within seconds, with one line saying so
/// (it waited out the query's one-minute deadline), and works again once the sandbox does.
#[test]
fn queries_against_a_hung_sandbox_give_up_within_seconds() {
    let s = setup();
    let m = s.mount.dir.clone();
    let (code, out) = sbxfs_in(&m, &["grep", "-l", "TODO", "src"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "src/main.rs\nsrc/net/server.rs\n")
    );
    {
        let _frozen = Frozen::stop(s.agent.child.id());
        for query in [&["grep", "TODO", "src"][..], &["glob", "**/*.rs", "src"]] {
            let start = std::time::Instant::now();
            let (code, out) = sbxfs_in(&m, query);
            let took = start.elapsed();
            assert_ne!(code, 0, "{query:?}: {out}");
            assert!(out.contains("stopped answering"), "{query:?}: {out}");
            assert_eq!(out.lines().count(), 1, "{query:?}: {out}");
            assert!(took < Duration::from_secs(30), "{query:?} took {took:?}");
        }
    }
    eventually("grep answers again", Duration::from_secs(20), || {
        sbxfs_in(&m, &["grep", "-l", "TODO", "src"])
            == (0, "src/main.rs\nsrc/net/server.rs\n".into())
    });
}
