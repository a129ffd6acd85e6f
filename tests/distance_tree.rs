//! The namespace in few round trips: a directory's first look fetches its subtree's metadata
//! in one packed answer (`-o tree_max=N`), so a cold `find` or `ls -lR` of a 3,000-file,
//! 300-directory tree costs a handful of requests (counted at the agent, `/v1/stats`) and shows
//! exactly the local tree; beyond the cap, directories are listed lazily; a hostile agent's
//! tree is refused with EIO and the daemon stays up; a file made in the sandbox after the
//! prefetch shows once the attribute TTL has passed.

use crate::common;

use std::fs;
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use sbxfs::remote::{Remote, RemotePath};

const DIRS: usize = 300;
const FILES_PER_DIR: usize = 10;

/// 20 top directories of 14 subdirectories each (300 directories with the top ones and the
/// root's `odd`), 10 files in each, plus names with a newline and invalid UTF-8.
fn build_tree(root: &Path) {
    let mut made = 0;
    'top: for t in 0..20 {
        let top = root.join(format!("pkg{t:02}"));
        fs::create_dir(&top).unwrap();
        made += 1;
        for s in 0..14 {
            if made == DIRS - 1 {
                break 'top;
            }
            let sub = top.join(format!("mod{s:02}"));
            fs::create_dir(&sub).unwrap();
            made += 1;
        }
    }
    let odd = root.join("odd dir\nwith newline");
    fs::create_dir(&odd).unwrap();
    for (i, dir) in dirs_of(root).iter().enumerate() {
        for f in 0..FILES_PER_DIR {
            let content = vec![b'x'; (i * 7 + f * 13) % 3000];
            fs::write(dir.join(format!("file{f}.rs")), content).unwrap();
        }
    }
    fs::write(odd.join(std::ffi::OsStr::from_bytes(b"bad\xffname")), b"?").unwrap();
    fs::write(odd.join("new\nline.txt"), b"nl").unwrap();
    let mut p = fs::metadata(root.join("pkg00/file0.rs"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o600);
    fs::set_permissions(root.join("pkg00/file0.rs"), p).unwrap();
    std::os::unix::fs::symlink("file1.rs", root.join("pkg00/link")).unwrap();
}

fn dirs_of(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.push(p.clone());
            out.extend(dirs_of(&p));
        }
    }
    out
}

/// `find . -printf '%p %s %m %y\0'` in `dir`, entries sorted.
fn find_listing(dir: &Path) -> Vec<Vec<u8>> {
    let out = Command::new("find")
        .arg(".")
        .arg("-printf")
        .arg("%p %s %m %y\\0")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<Vec<u8>> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    v.sort();
    v
}

/// `ls -R` names in the C locale (no times: the comparison is of names and order).
fn ls_r(dir: &Path, long: bool) -> Vec<u8> {
    let out = Command::new("ls")
        .arg(if long { "-lRn" } else { "-R" })
        .arg(".")
        .env("LC_ALL", "C")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The agent's counters (`GET /v1/stats`; this request counted in `requests`).
fn agent_stats(agent: &AgentProcess) -> serde_json::Value {
    let mut s = std::net::TcpStream::connect(agent.addr).unwrap();
    write!(
        s,
        "GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        agent.token
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let json = &body[body.find("\r\n\r\n").expect("an HTTP answer") + 4..];
    serde_json::from_str(json).expect("stats JSON")
}

/// Metadata requests (`stat`, `list`, `tree`) and all requests the agent answered while `f`
/// ran (the stats requests themselves not counted).
fn requests_during<T>(agent: &AgentProcess, f: impl FnOnce() -> T) -> (u64, u64, T) {
    let before = agent_stats(agent);
    let out = f();
    let after = agent_stats(agent);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().expect(k);
    (
        n(&after, "metadata_requests") - n(&before, "metadata_requests"),
        // Every request about the workspace (the change feed's own connection, `info` and
        // this `stats` aside).
        n(&after, "workspace_requests") - n(&before, "workspace_requests"),
        out,
    )
}

fn fixture() -> (tempfile::TempDir, AgentProcess) {
    let ws = tempfile::tempdir().unwrap();
    build_tree(ws.path());
    let agent = AgentProcess::start(ws.path());
    (ws, agent)
}

/// Long attribute TTLs, so the counts do not depend on how fast this machine runs `find`.
const LONG_TTL: &[&str] = &["--attr-ttl-ms", "600000"];

#[test]
fn a_cold_find_takes_a_handful_of_requests_and_shows_exactly_the_local_tree() {
    let (ws, agent) = fixture();
    let local = find_listing(ws.path());
    assert!(local.len() > DIRS * FILES_PER_DIR, "{}", local.len());
    let m = MountProcess::start(&agent, LONG_TTL);
    let (meta, all, through) = requests_during(&agent, || find_listing(&m.dir));
    assert_eq!(through.len(), local.len());
    assert_eq!(through, local, "find through the mount");
    println!(
        "cold find of {} entries: {meta} metadata requests, {all} in all",
        local.len()
    );
    assert!(meta <= 3, "a cold find made {meta} metadata requests");
    // The same again: nothing left to ask.
    let (meta, all, again) = requests_during(&agent, || find_listing(&m.dir));
    assert_eq!(again, local);
    println!("warm find: {meta} metadata requests, {all} in all (the health probe's)");
    assert_eq!(meta, 0, "a warm find asks nothing");
}

/// `ls -lRn` without its "total" lines (block counts: the local filesystem's allocation, which
/// a mount reports from the size).
fn ls_lr(dir: &Path) -> String {
    String::from_utf8_lossy(&ls_r(dir, true))
        .lines()
        .filter(|l| !l.starts_with("total "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_cold_ls_lr_takes_a_handful_of_requests_and_lists_what_ls_lists_locally() {
    let (ws, agent) = fixture();
    let m = MountProcess::start(&agent, LONG_TTL);
    // `ls -l` asks every file for its security label and ACL (getxattr, listxattr): the tree
    // says which files have none, so those are answered without a round trip.
    let (meta, all, long) = requests_during(&agent, || ls_lr(&m.dir));
    println!(
        "cold ls -lR: {meta} metadata requests, {all} in all; {} bytes listed",
        long.len()
    );
    assert!(meta <= 3, "a cold ls -lR made {meta} metadata requests");
    // A handful, whatever the tree's size (6,921 when every file's xattrs were asked for):
    // the tree, the symlink's target, the root's own labels, and one more now and then
    // under load (the health probe's `info` is not among them: it is not about the
    // workspace).
    assert!(all <= 8, "a cold ls -lR made {all} requests in all");
    assert_eq!(long, ls_lr(ws.path()));
    assert_eq!(ls_r(&m.dir, false), ls_r(ws.path(), false));
}

/// `getfattr -d` (the `user.` attributes and their values) of `path`, its output as text.
fn getfattr(getfattr: &Path, path: &Path) -> String {
    let (code, out, err) = run(Command::new(getfattr)
        .arg("-d")
        .arg("--absolute-names")
        .arg(path));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn an_xattr_set_in_the_sandbox_shows_through_the_mount_after_the_ttl() {
    let (Some(get), Some(_)) = (require_tool("getfattr"), require_tool("setfattr")) else {
        return;
    };
    let (ws, agent) = fixture();
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", "300"]);
    let file = m.dir.join("pkg02/mod03/file4.rs");
    assert_eq!(getfattr(&get, &file), "");
    let local = ws.path().join("pkg02/mod03/file4.rs");
    let (code, _, err) = run(Command::new(require_tool("setfattr").unwrap())
        .args(["-n", "user.origin", "-v", "sandbox"])
        .arg(&local));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    // The deadline only stops a hung test: it shows once the TTL has passed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !getfattr(&get, &file).contains("user.origin=\"sandbox\"") {
        assert!(
            Instant::now() < deadline,
            "the sandbox's xattr never showed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        getfattr(&get, &file),
        getfattr(&get, &local).replace(&local.display().to_string(), &file.display().to_string())
    );
}

#[test]
fn an_xattr_set_through_the_mount_shows_at_once_and_its_removal_too() {
    let (Some(get), Some(set)) = (require_tool("getfattr"), require_tool("setfattr")) else {
        return;
    };
    let (ws, agent) = fixture();
    let m = MountProcess::start(&agent, LONG_TTL);
    let file = m.dir.join("pkg05/file1.rs");
    // Listed (and so known to have none) before the change.
    assert!(ls_lr(&m.dir.join("pkg05")).contains("file1.rs"));
    // Known to have none: answered without asking (the health probe may add one request).
    let (_, all, shown) = requests_during(&agent, || {
        (0..5).map(|_| getfattr(&get, &file)).collect::<String>()
    });
    assert_eq!(shown, "");
    assert!(
        all <= 1,
        "five getfattr of a file without xattrs: {all} requests"
    );
    for args in [
        &["-n", "user.a", "-v", "one"][..],
        &["-n", "user.b", "-v", "two"],
        &["-x", "user.a"],
    ] {
        let (code, _, err) = run(Command::new(&set).args(args).arg(&file));
        assert_eq!(code, 0, "{args:?}: {}", String::from_utf8_lossy(&err));
    }
    let shown = getfattr(&get, &file);
    assert!(shown.contains("user.b=\"two\""), "{shown}");
    assert!(!shown.contains("user.a"), "{shown}");
    // A second look at the directory (from its cached listing) does not forget it.
    assert!(ls_lr(&m.dir.join("pkg05")).contains("file1.rs"));
    assert!(getfattr(&get, &file).contains("user.b=\"two\""));
    let (code, _, _) = run(Command::new(&set).args(["-x", "user.b"]).arg(&file));
    assert_eq!(code, 0);
    assert_eq!(getfattr(&get, &file), "");
    assert_eq!(getfattr(&get, &ws.path().join("pkg05/file1.rs")), "");
}

#[test]
fn with_tree_max_0_listings_go_directory_by_directory_and_stay_exact() {
    let (ws, agent) = fixture();
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", "600000", "-o", "tree_max=0"]);
    let (used, _, through) = requests_during(&agent, || find_listing(&m.dir));
    assert_eq!(through, find_listing(ws.path()));
    assert!(
        used >= DIRS as u64,
        "one listing per directory, {used} requests"
    );
}

#[test]
fn a_tree_larger_than_tree_max_is_complete_through_the_mount() {
    let (ws, agent) = fixture();
    // 500 entries a fetch: the root's and a few dozen directories' listings, the rest lazily.
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", "600000", "-o", "tree_max=500"]);
    let (used, _, through) = requests_during(&agent, || find_listing(&m.dir));
    assert_eq!(through, find_listing(ws.path()));
    // Breadth first: the root and the 20 top directories' listings come in the first answer;
    // each deeper directory beyond the cap is fetched (with its own subtree) when entered.
    println!("find with tree_max=500: {used} metadata requests");
    assert!(used > 1, "one answer cannot hold the whole tree");
    assert!(used < DIRS as u64, "fewer than one per directory: {used}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packed_tree_is_far_smaller_on_the_link_than_the_json_listings() {
    let (ws, agent) = fixture();
    let proxy =
        sbxfs::proxy::Proxy::start("127.0.0.1:0".parse().unwrap(), agent.addr, Duration::ZERO)
            .await
            .unwrap();
    let client =
        sbxfs::remote::client::AgentClient::new(&format!("http://{}", proxy.addr), &agent.token)
            .unwrap();
    let listings: Vec<_> = client
        .tree_listings(&RemotePath::root(), 1_000_000)
        .await
        .unwrap()
        .map(|l| l.unwrap())
        .collect()
        .await;
    let packed = proxy.counters.total();
    assert_eq!(listings.len(), dirs_of(ws.path()).len() + 1);
    let entries: usize = listings
        .iter()
        .map(|l| l.entries.as_ref().unwrap().len())
        .sum();
    let mut json = 0;
    for l in &listings {
        let before = proxy.counters.total();
        let plain = client.list(&l.path).await.unwrap();
        json += proxy.counters.total() - before;
        // Listing a directory may move its access time (relatime): all else must agree.
        let names = |v: &[sbxfs::remote::DirEntry]| -> Vec<_> {
            v.iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        e.attr.ino,
                        e.attr.size,
                        e.attr.version.clone(),
                    )
                })
                .collect()
        };
        assert_eq!(
            names(&plain),
            names(l.entries.as_ref().unwrap()),
            "{:?}",
            l.path
        );
    }
    println!(
        "{entries} entries: packed tree {packed} bytes ({:.1} per entry), JSON listings {json} bytes ({:.1} per entry): {:.1}x smaller",
        packed as f64 / entries as f64,
        json as f64 / entries as f64,
        json as f64 / packed as f64
    );
    assert!(packed * 2 <= json, "packed {packed} B vs JSON {json} B");
}

/// The hostile agent (tests/hostile/agent.py), killed by pid on drop.
struct HostileAgent {
    child: std::process::Child,
    url: String,
}

impl HostileAgent {
    fn start() -> Option<HostileAgent> {
        let python = require_tool("python3")?;
        let mut child = Command::new(python)
            .arg(repo_root().join("tests/hostile/agent.py"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().expect("the hostile agent's port");
        Some(HostileAgent {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }
}

impl Drop for HostileAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_hostile_tree_answer_gives_eio_and_the_daemon_stays_up() {
    let Some(agent) = HostileAgent::start() else {
        return;
    };
    let mut mount = MountProcess::start_url(&agent.url, "token", &[]);
    let m = mount.dir.clone();
    // The root's tree is answered 404 (no such route): listed the plain way.
    let names: Vec<_> = fs::read_dir(&m)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"badtree".to_string()), "{names:?}");
    for (dir, what) in [
        ("badtree", "a name with a slash"),
        ("bigtree", "a trillion entries claimed, then endless ones"),
        ("bombtree", "a gigabyte of compressed zeros"),
    ] {
        let e = fs::read_dir(m.join(dir))
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
        assert!(fs::metadata(&m).unwrap().is_dir(), "alive after {what}");
        assert_eq!(
            fs::read(m.join("fine.txt")).unwrap(),
            b"hello\n",
            "after {what}"
        );
    }
    assert_eq!(mount.stop(), Some(0), "{}", mount.log_text());
}

#[test]
fn a_file_made_in_the_sandbox_after_the_prefetch_shows_after_the_ttl() {
    let (ws, agent) = fixture();
    let m = MountProcess::start(&agent, &["--attr-ttl-ms", "300"]);
    // The first look fetches the whole tree, pkg03/mod04's listing with it.
    assert!(fs::read_dir(&m.dir).unwrap().count() > 10);
    let visited = m.dir.join("pkg01");
    assert!(fs::read_dir(&visited).unwrap().count() > 10);
    fs::write(ws.path().join("pkg01/late.rs"), b"late").unwrap();
    fs::write(ws.path().join("pkg03/mod04/late.rs"), b"late too").unwrap();
    // The deadline only stops a hung test: each shows once the TTL has passed.
    let deadline = Instant::now() + Duration::from_secs(20);
    for path in [visited.join("late.rs"), m.dir.join("pkg03/mod04/late.rs")] {
        let dir = path.parent().unwrap().to_path_buf();
        loop {
            let listed = fs::read_dir(&dir)
                .unwrap()
                .any(|e| e.unwrap().file_name() == "late.rs");
            if listed {
                break;
            }
            assert!(Instant::now() < deadline, "{} never showed", path.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(fs::read(&path).unwrap().starts_with(b"late"));
    }
}
