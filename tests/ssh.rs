//! The `ssh://` transport against a real OpenSSH server on 127.0.0.1 (key auth, its sessions'
//! HOME in the test's directory): sbxfs deploys its agent on the first connect, reuses it on
//! the second, keeps its token out of every command line, opens no TCP port in the sandbox,
//! and fails once, clearly, when the key is refused.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::sshbox::SshBox;
use common::*;
use sbxfs::remote::connect::{connect, Connected};
use sbxfs::remote::*;

/// Run only where a private sshd can be started (root, openssh-server installed).
fn ready() -> bool {
    if !is_root() || !std::path::Path::new("/usr/sbin/sshd").exists() {
        eprintln!("skipped: needs root and openssh-server (scripts/install-deps.sh)");
        return false;
    }
    require_tool("ssh").is_some()
}

async fn connect_box(b: &SshBox, suffix: &str) -> Result<Connected> {
    // A deadline only to stop a hung test.
    tokio::time::timeout(
        Duration::from_secs(120),
        connect(&b.url(suffix), &b.options()),
    )
    .await
    .expect("connect hung")
}

fn rp(s: &str) -> RemotePath {
    RemotePath::new(s.as_bytes().to_vec()).unwrap()
}

/// Every process's argv, as one byte string each.
fn all_command_lines() -> Vec<Vec<u8>> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .collect()
}

fn the_token(b: &SshBox) -> String {
    let pid_file = &b.agent_pid_files()[0];
    fs::read_to_string(pid_file.with_file_name("token"))
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_connect_deploys_the_agent_and_the_second_reuses_it() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    fs::write(b.root.join("hello.txt"), "hi\n").unwrap();
    let c1 = connect_box(&b, "").await.unwrap();
    assert_eq!(c1.transport, "ssh+agent");
    let bin = fs::read_dir(b.home.join(".cache/sbxfs"))
        .unwrap()
        .flatten()
        .map(|v| v.path().join("sbxfs"))
        .next()
        .expect("a version directory");
    let uploaded = fs::metadata(&bin).unwrap();
    assert_eq!(uploaded.mode() & 0o777, 0o700);
    let pid = b.agent_pid();
    let data = c1.remote.read(&rp("hello.txt"), 0, 100).await.unwrap().data;
    assert_eq!(&data[..], b"hi\n");

    let c2 = connect_box(&b, "").await.unwrap();
    assert_eq!(c2.transport, "ssh+agent");
    assert_eq!(
        b.agent_pid(),
        pid,
        "the same agent serves the second connection"
    );
    let again = fs::metadata(&bin).unwrap();
    assert_eq!(
        (again.ino(), again.mtime_nsec()),
        (uploaded.ino(), uploaded.mtime_nsec()),
        "no second upload"
    );
    // Both work at once, on the same files.
    c2.remote
        .commit(
            &rp("new.txt"),
            CommitContent::Whole(Box::new(std::io::Cursor::new(b"from two".to_vec()))),
            CommitOptions::default(),
        )
        .await
        .unwrap();
    let data = c1.remote.read(&rp("new.txt"), 0, 100).await.unwrap().data;
    assert_eq!(&data[..], b"from two");

    // Dropping a connection stops its master; the agent stays for the next one.
    drop(c1);
    drop(c2);
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let masters: Vec<_> = all_command_lines()
        .into_iter()
        .filter(|c| {
            c.windows(b.config.as_os_str().len())
                .any(|w| w == b.config.as_os_str().as_encoded_bytes())
        })
        .collect();
    assert!(masters.is_empty(), "ssh processes left: {masters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_appears_in_no_command_line() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (seen, stop) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                seen.lock().unwrap().extend(all_command_lines());
            }
        })
    };
    let c = connect_box(&b, "").await.unwrap();
    c.remote.info().await.unwrap();
    drop(c);
    // A second connect reads the token back from the sandbox.
    let c = connect_box(&b, "").await.unwrap();
    c.remote.stat(&rp("")).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    seen.lock().unwrap().extend(all_command_lines());
    let token = the_token(&b);
    assert_eq!(token.len(), 64, "a fresh 256-bit token");
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter()
            .any(|c| String::from_utf8_lossy(c).contains("agent\0--root")),
        "the scan saw the agent's command line"
    );
    for cmd in seen.iter() {
        assert!(
            !String::from_utf8_lossy(cmd).contains(&token),
            "the token is in {:?}",
            String::from_utf8_lossy(cmd)
        );
    }
    let token_file = b.agent_pid_files()[0].with_file_name("token");
    assert_eq!(fs::metadata(token_file).unwrap().mode() & 0o777, 0o600);
}

/// Socket inodes of `pid`'s descriptors.
fn socket_inodes(pid: i32) -> BTreeSet<String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_agent_listens_on_no_tcp_port() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    let c = connect_box(&b, "").await.unwrap();
    c.remote.info().await.unwrap();
    let pid = b.agent_pid();
    let mine = socket_inodes(pid);
    assert!(!mine.is_empty(), "the agent holds its Unix socket");
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in fs::read_to_string(table).unwrap().lines().skip(1) {
            let inode = line.split_whitespace().nth(9).unwrap_or("");
            assert!(!mine.contains(inode), "the agent has a TCP socket: {line}");
        }
    }
    let unix = fs::read_to_string("/proc/net/unix").unwrap();
    let sock = b.agent_pid_files()[0].with_file_name("sock");
    assert!(
        unix.lines().any(|l| l.ends_with(sock.to_str().unwrap())
            && mine.contains(l.split_whitespace().nth(6).unwrap_or(""))),
        "the agent listens on {sock:?}"
    );
    assert_eq!(
        fs::metadata(sock.parent().unwrap()).unwrap().mode() & 0o777,
        0o700
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_fails_once_saying_use_a_key_or_agent() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    let other = b.dir.path().join("other_key");
    assert!(std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap()
        .success());
    common::sshbox::write_config(&b.config, b.sshd.as_ref().unwrap().port, &other);
    let e = match connect_box(&b, "").await {
        Ok(_) => panic!("a refused key connected"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("Permission denied"), "{e}");
    assert!(e.contains("use a key / ssh-agent"), "{e}");
    assert!(b.agent_pid_files().is_empty(), "nothing deployed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_is_refused_before_any_ssh_runs() {
    let e = connect("ssh://host", &Default::default())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no workspace path"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_no_runs_the_exec_only_scripts() {
    if !ready() {
        return;
    }
    let b = SshBox::start();
    fs::write(b.root.join("a.txt"), "scripts\n").unwrap();
    let c = connect_box(&b, "?agent=no").await.unwrap();
    assert_eq!(c.transport, "ssh+scripts");
    assert!(b.agent_pid_files().is_empty(), "no agent deployed");
    let data = c.remote.read(&rp("a.txt"), 0, 100).await.unwrap().data;
    assert_eq!(&data[..], b"scripts\n");
}

/// The agent ssh deploys: `--listen unix:PATH` makes a 0600 socket, serves on it, and
/// `--exit-when-idle` ends it once no client has been connected for that long.
#[test]
fn a_unix_socket_agent_serves_then_exits_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(dir.path().join("token"), "t0k3n\n").unwrap();
    let sock = dir.path().join("agent.sock");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sbxfs"))
        .args(["agent", "--exit-when-idle", "2", "--root"])
        .arg(&root)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--token-file")
        .arg(dir.path().join("token"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut agent = Stop(child);
    // A deadline only to stop a hung test.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::metadata(&sock).unwrap().mode() & 0o777, 0o600);
    let client = sbxfs::remote::client::AgentClient::over_unix_socket(&sock, "t0k3n").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(client.info()).unwrap();
    assert_eq!(
        info.root.as_bytes(),
        fs::canonicalize(&root)
            .unwrap()
            .as_os_str()
            .as_encoded_bytes()
    );
    let wrong = sbxfs::remote::client::AgentClient::over_unix_socket(&sock, "nope").unwrap();
    assert!(
        rt.block_on(wrong.info()).is_err(),
        "a wrong token is refused"
    );
    drop((client, wrong, rt));
    let status = loop {
        if let Some(s) = agent.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the idle agent did not exit"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the socket is removed on exit");
}

/// A workspace path with quotes, `$(…)`, backticks, a newline and a leading dash reaches the
/// sandbox as one word: nothing in it runs, and the agent serves exactly that directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awkward_workspace_path_is_one_word_in_the_sandbox() {
    if !ready() {
        return;
    }
    let mut b = SshBox::start();
    // A command would run in HOME (ssh's working directory) or / (where the agent starts).
    let name = "-w s'\"$(touch sbxfs-ran)`touch sbxfs-ran`\nx";
    b.root = b.dir.path().join(name);
    fs::create_dir(&b.root).unwrap();
    fs::write(b.root.join("f"), "awkward").unwrap();
    let encoded: String = percent_encoding::utf8_percent_encode(
        b.root.to_str().unwrap(),
        percent_encoding::NON_ALPHANUMERIC,
    )
    .to_string()
    .replace("%2F", "/");
    let c = tokio::time::timeout(
        Duration::from_secs(120),
        connect(&format!("ssh://sbx{encoded}"), &b.options()),
    )
    .await
    .expect("connect hung")
    .unwrap();
    assert_eq!(c.transport, "ssh+agent");
    assert_eq!(
        c.info.root.as_bytes(),
        b.root.as_os_str().as_encoded_bytes()
    );
    let data = c.remote.read(&rp("f"), 0, 100).await.unwrap().data;
    assert_eq!(&data[..], b"awkward");
    for canary in [b.home.join("sbxfs-ran"), "/sbxfs-ran".into()] {
        assert!(!canary.exists(), "a command in the path ran: {canary:?}");
    }
}
