//! Editors see the sandbox live: changes made in the served directory (never through the
//! mount) raise inotify events on the mount, seen by a real `inotifywait -m -r`; a change
//! made through the mount is reported once; the echoes change nothing; `sbxfs watch` streams
//! the same changes and resumes with `--since`.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{require_tool, sbxfs_bin, AgentProcess, CpuHogs, MountProcess};

/// How long a sandbox-side change may take to reach a local watcher.
const WITHIN: Duration = Duration::from_secs(10);

/// A long-running watcher whose stdout lines are collected; killed by pid on drop.
struct Lines {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Lines {
    fn start(cmd: &mut Command, ready: Option<&str>) -> Lines {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        for stream in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            });
        }
        let w = Lines { child, lines };
        if let Some(ready) = ready {
            w.wait_for(&format!("the watcher's {ready:?}"), |l| l.contains(ready));
        }
        w
    }

    fn all(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn wait_for(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + WITHIN;
        loop {
            if let Some(l) = self.all().into_iter().find(|l| want(l)) {
                return l;
            }
            assert!(
                Instant::now() < end,
                "no {what} within {WITHIN:?}: {:#?}",
                self.all()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn count(&self, want: impl Fn(&str) -> bool) -> usize {
        self.all().iter().filter(|l| want(l)).count()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `inotifywait -m -r` on the mount: lines `EVENTS PATH COOKIE`.
fn inotify(mnt: &Path) -> Option<Lines> {
    let tool = require_tool("inotifywait")?;
    Some(Lines::start(
        Command::new(tool)
            .args(["-m", "-r", "--format", "%e %w%f %c"])
            .arg(mnt),
        Some("Watches established"),
    ))
}

/// A served workspace, mounted over the agent (`http`) or over `shell:`.
struct Served {
    _dir: tempfile::TempDir,
    root: PathBuf,
    _agent: Option<AgentProcess>,
    mount: MountProcess,
}

fn served(transport: &str) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::create_dir_all(root.join("gone-dir")).unwrap();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    fs::write(root.join("gone.txt"), "g\n").unwrap();
    fs::write(root.join("move-me.txt"), "m\n").unwrap();
    fs::write(root.join("sub/across.txt"), "x\n").unwrap();
    let (agent, mount) = match transport {
        "http" => {
            let agent = AgentProcess::start(&root);
            let mount = MountProcess::start(&agent, &[]);
            (Some(agent), mount)
        }
        _ => (
            None,
            MountProcess::start_url(&format!("shell:{}", root.display()), "unused", &[]),
        ),
    };
    // What an editor has open: the tree listed.
    for d in ["", "sub", "gone-dir"] {
        fs::read_dir(mount.dir.join(d)).unwrap().for_each(drop);
    }
    Served {
        _dir: dir,
        root,
        _agent: agent,
        mount,
    }
}

fn each_kind_of_change_raises_its_inotify_event(transport: &str) {
    let s = served(transport);
    let Some(w) = inotify(&s.mount.dir) else {
        eprintln!("skipped: no inotifywait (scripts/install-deps.sh installs inotify-tools)");
        return;
    };
    let m = s.mount.dir.display().to_string();
    let event = |events: &'static str, path: String| {
        let want = format!("{events} {m}/{path} ");
        w.wait_for(&want.clone(), move |l| l.starts_with(&want))
    };
    fs::write(s.root.join("new.txt"), "new\n").unwrap();
    event("CREATE", "new.txt".into());
    fs::write(s.root.join("a.txt"), "a changed\n").unwrap();
    event("MODIFY", "a.txt".into());
    event("CLOSE_WRITE,CLOSE", "a.txt".into());
    fs::set_permissions(s.root.join("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    event("ATTRIB", "a.txt".into());
    fs::create_dir(s.root.join("newdir")).unwrap();
    event("CREATE,ISDIR", "newdir".into());
    fs::remove_file(s.root.join("gone.txt")).unwrap();
    event("DELETE", "gone.txt".into());
    fs::remove_dir(s.root.join("gone-dir")).unwrap();
    event("DELETE,ISDIR", "gone-dir".into());
    fs::rename(s.root.join("move-me.txt"), s.root.join("moved.txt")).unwrap();
    let from = event("MOVED_FROM", "move-me.txt".into());
    let to = event("MOVED_TO", "moved.txt".into());
    let cookie = |l: &str| l.rsplit(' ').next().unwrap().to_string();
    assert_eq!(cookie(&from), cookie(&to), "one move: {from} / {to}");
    fs::rename(s.root.join("sub/across.txt"), s.root.join("across.txt")).unwrap();
    event("MOVED_FROM", "sub/across.txt".into());
    event("MOVED_TO", "across.txt".into());
    // The mount shows what the sandbox has, after all of it.
    let mut names: Vec<String> = fs::read_dir(&s.mount.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "a.txt",
            "across.txt",
            "moved.txt",
            "new.txt",
            "newdir",
            "sub"
        ]
    );
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "a changed\n"
    );
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("moved.txt")).unwrap(),
        "m\n"
    );
    assert!(fs::read_dir(s.mount.dir.join("sub"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn each_kind_of_sandbox_side_change_raises_its_inotify_event_agent() {
    each_kind_of_change_raises_its_inotify_event("http");
}

#[test]
fn each_kind_of_sandbox_side_change_raises_its_inotify_event_shell() {
    each_kind_of_change_raises_its_inotify_event("shell");
}

/// What `ctl stats --json` says of pushes.
fn commits(mnt: &Path) -> u64 {
    let out = Command::new(sbxfs_bin())
        .args(["ctl", "stats", "--json"])
        .current_dir(mnt)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["stats"]["commits"]
        .as_u64()
        .unwrap_or_else(|| panic!("no commits in {v}"))
}

/// Names, kinds, sizes, contents and modification times under `root`.
fn snapshot(root: &Path) -> Vec<(String, bool, u64, Vec<u8>, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut all = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let data = if m.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            all.push((
                rel,
                m.is_dir(),
                m.len(),
                data,
                m.mtime_nsec() + m.mtime() * 1_000_000_000,
            ));
            if m.is_dir() {
                dirs.push(p);
            }
        }
    }
    all.sort();
    all
}

#[test]
fn a_change_through_the_mount_is_reported_once_and_the_echoes_change_nothing() {
    let s = served("http");
    let Some(w) = inotify(&s.mount.dir) else {
        eprintln!("skipped: no inotifywait");
        return;
    };
    let m = s.mount.dir.display().to_string();
    // Through the mount: the kernel's own events, never doubled by the feed's echo.
    fs::write(s.mount.dir.join("local.txt"), "local\n").unwrap();
    let created = format!("CREATE {m}/local.txt ");
    w.wait_for("the local create", |l| l.starts_with(&created));
    // The push lands in the sandbox and its own feed event comes back: no echo for it.
    let end = Instant::now() + WITHIN;
    while fs::read(s.root.join("local.txt")).ok().as_deref() != Some(b"local\n") {
        assert!(Instant::now() < end, "the write never reached the sandbox");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(w.count(|l| l.starts_with(&created)), 1, "{:#?}", w.all());
    let modified = format!("MODIFY {m}/local.txt ");
    assert_eq!(w.count(|l| l.starts_with(&modified)), 1, "{:#?}", w.all());

    // Sandbox-side changes, each echoed: the sandbox's files, their times and the mount's
    // pushes are the same after the echoes as the changes left them.
    let pushed = commits(&s.mount.dir);
    fs::write(s.root.join("e1.txt"), "one\n").unwrap();
    fs::write(s.root.join("a.txt"), "a, changed in the sandbox\n").unwrap();
    fs::create_dir(s.root.join("e-dir")).unwrap();
    fs::rename(s.root.join("move-me.txt"), s.root.join("sub/moved.txt")).unwrap();
    fs::remove_file(s.root.join("gone.txt")).unwrap();
    let before = snapshot(&s.root);
    for (what, path) in [
        ("CREATE", "e1.txt"),
        ("MODIFY", "a.txt"),
        ("CREATE,ISDIR", "e-dir"),
        ("MOVED_TO", "sub/moved.txt"),
        ("DELETE", "gone.txt"),
    ] {
        let want = format!("{what} {m}/{path} ");
        w.wait_for(&want.clone(), move |l| l.starts_with(&want));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(snapshot(&s.root), before, "the echoes changed the sandbox");
    assert_eq!(commits(&s.mount.dir), pushed, "the echoes pushed something");
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "a, changed in the sandbox\n"
    );
}

#[test]
fn a_burst_of_sandbox_side_creates_keeps_the_mount_answering_and_is_coalesced() {
    let s = served("http");
    let Some(w) = inotify(&s.mount.dir) else {
        eprintln!("skipped: no inotifywait");
        return;
    };
    fs::create_dir(s.root.join("burst")).unwrap();
    let burst_dir = format!("CREATE,ISDIR {}/burst ", s.mount.dir.display());
    w.wait_for("the burst directory", |l| l.starts_with(&burst_dir));
    fs::read_dir(s.mount.dir.join("burst"))
        .unwrap()
        .for_each(drop);
    const FILES: usize = 10_000;
    let root = s.root.clone();
    let maker = std::thread::spawn(move || {
        for i in 0..FILES {
            fs::write(root.join(format!("burst/f{i:05}")), b"x").unwrap();
        }
    });
    // The mount answers all along (a generous bound: the suite runs beside CPU hogs).
    let mut slowest = Duration::ZERO;
    while !maker.is_finished() {
        let t = Instant::now();
        fs::metadata(s.mount.dir.join("a.txt")).unwrap();
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    maker.join().unwrap();
    assert!(slowest < Duration::from_secs(2), "a stat took {slowest:?}");
    let burst = format!("{}/burst", s.mount.dir.display());
    w.wait_for("events from the burst", |l| {
        l.contains(&burst) && !l.contains("ISDIR")
    });
    // Everything is there, and the watcher heard no more than one event kind per file.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let n = fs::read_dir(s.mount.dir.join("burst")).unwrap().count();
        if n == FILES {
            break;
        }
        assert!(Instant::now() < end, "{n} of {FILES} files shown");
        std::thread::sleep(Duration::from_millis(200));
    }
    let creates = w.count(|l| l.starts_with("CREATE ") && l.contains(&burst));
    assert!(creates <= FILES, "{creates} creates for {FILES} files");
}

#[test]
fn sbxfs_watch_prints_the_changes_and_resumes_with_since() {
    let s = served("http");
    let watch = |extra: &[&str]| {
        Lines::start(
            Command::new(sbxfs_bin())
                .arg("watch")
                .args(extra)
                .current_dir(&s.mount.dir),
            None,
        )
    };
    let text = watch(&[]);
    let json = watch(&["--json", "sub"]);
    std::thread::sleep(Duration::from_millis(500));
    fs::write(s.root.join("w.txt"), "w\n").unwrap();
    fs::write(s.root.join("sub/s.txt"), "s\n").unwrap();
    fs::rename(s.root.join("move-me.txt"), s.root.join("sub/m.txt")).unwrap();
    text.wait_for("created w.txt", |l| l == "created w.txt");
    text.wait_for("created sub/s.txt", |l| l == "created sub/s.txt");
    text.wait_for("the rename", |l| l == "renamed move-me.txt → sub/m.txt");
    // Under sub only, as JSON lines; the rename into it is there, w.txt is not.
    let line = json.wait_for("the rename as JSON", |l| l.contains("\"renamed\""));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["path"], "move-me.txt");
    assert_eq!(v["to"], "sub/m.txt");
    let seen: Vec<serde_json::Value> = json
        .all()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(seen.iter().all(|v| v["path"] != "w.txt"), "{seen:?}");
    let seq_of = |path: &str| {
        seen.iter()
            .find(|v| v["path"] == path)
            .and_then(|v| v["seq"].as_u64())
            .unwrap_or_else(|| panic!("{path} in {seen:?}"))
    };
    let wanted = [seq_of("sub/s.txt"), seq_of("move-me.txt")];
    // Resuming just before them: they come again, from the mount's memory, and nothing
    // from before.
    let since = wanted.iter().min().unwrap() - 1;
    let again = watch(&["--json", "--since", &since.to_string()]);
    let seqs = |w: &Lines| -> Vec<u64> {
        w.all()
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    for n in wanted {
        again.wait_for(&format!("change {n} again"), |l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64() == Some(n)
        });
    }
    assert!(seqs(&again).iter().all(|n| *n > since), "{:?}", again.all());
    // Not in a mount: one clear line.
    let out = Command::new(sbxfs_bin())
        .args(["watch", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in a live sbxfs mount"));
}

/// The watchers editors and dev servers are built on react to sandbox-side changes: Node's
/// `fs.watch` (VS Code's and vite's base) and a Python inotify loop (watchdog's).
#[test]
fn node_fs_watch_and_a_python_inotify_loop_see_sandbox_side_changes() {
    let s = served("http");
    let mut watchers = Vec::new();
    if let Some(node) = require_tool("node") {
        let script = "const fs = require('fs'); \
             fs.watch(process.argv[1], (ev, name) => console.log('node', ev, name)); \
             console.log('ready');";
        let w = Lines::start(
            Command::new(node).args(["-e", script]).arg(&s.mount.dir),
            Some("ready"),
        );
        watchers.push((
            w,
            &[
                "node rename by-agent.txt",
                "node change a.txt",
                "node rename gone.txt",
            ][..],
        ));
    }
    let python = "
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
IN_MODIFY, IN_CLOSE_WRITE, IN_CREATE, IN_DELETE = 0x2, 0x8, 0x100, 0x200
names = {IN_MODIFY: 'modify', IN_CLOSE_WRITE: 'close_write', IN_CREATE: 'create', IN_DELETE: 'delete'}
assert libc.inotify_add_watch(fd, sys.argv[1].encode(), IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE) >= 0
print('ready', flush=True)
while True:
    buf = os.read(fd, 65536)
    at = 0
    while at < len(buf):
        wd, mask, cookie, size = struct.unpack_from('iIII', buf, at)
        name = buf[at + 16: at + 16 + size].rstrip(b'\\0').decode()
        at += 16 + size
        for bit, word in names.items():
            if mask & bit:
                print('python', word, name, flush=True)
";
    let w = Lines::start(
        Command::new("python3")
            .args(["-c", python])
            .arg(&s.mount.dir),
        Some("ready"),
    );
    watchers.push((
        w,
        &[
            "python create by-agent.txt",
            "python modify a.txt",
            "python close_write a.txt",
            "python delete gone.txt",
        ][..],
    ));
    fs::write(s.root.join("by-agent.txt"), "x\n").unwrap();
    fs::write(s.root.join("a.txt"), "a, again\n").unwrap();
    fs::remove_file(s.root.join("gone.txt")).unwrap();
    for (w, wants) in &watchers {
        for want in *wants {
            w.wait_for(want, |l| l == *want);
        }
    }
}

/// What a program does in the sandbox at speed: files made in a directory right after it
/// (before the agent's watch on it is in place) are reported, a file removed and made again
/// is reported as there, and a `--since` from before a remount says so and goes on live.
#[test]
fn fast_trees_replaced_files_and_a_stale_since_are_reported_as_they_are() {
    let s = served("http");
    let watch = Lines::start(
        Command::new(sbxfs_bin())
            .args(["watch", "--json"])
            .current_dir(&s.mount.dir),
        None,
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut made = Vec::new();
    for p in 0..30 {
        let d = s.root.join(format!("node_modules/pkg{p:02}/lib"));
        fs::create_dir_all(&d).unwrap();
        for f in 0..20 {
            fs::write(d.join(format!("f{f:02}.js")), "x").unwrap();
            made.push(format!("node_modules/pkg{p:02}/lib/f{f:02}.js"));
        }
    }
    for path in &made {
        let want = format!("\"path\":\"{path}\"");
        watch.wait_for(path, |l| l.contains(&want));
    }
    // Removed and made again, many times over: the last word is that it is there.
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        fs::remove_file(s.root.join("a.txt")).unwrap();
        fs::write(s.root.join("a.txt"), format!("round {round}\n")).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    let last = watch
        .all()
        .into_iter()
        .rev()
        .find(|l| l.contains("\"path\":\"a.txt\""))
        .expect("a.txt reported");
    assert!(!last.contains("\"deleted\""), "{last}");
    assert_eq!(
        fs::read_to_string(s.mount.dir.join("a.txt")).unwrap(),
        "round 2\n"
    );
    // A number this mount never gave.
    let stale = Lines::start(
        Command::new(sbxfs_bin())
            .args(["watch", "--json", "--since", "99999999"])
            .current_dir(&s.mount.dir),
        None,
    );
    stale.wait_for("the restart", |l| l.contains("\"restarted\":true"));
    fs::write(s.root.join("after.txt"), "x").unwrap();
    stale.wait_for("a live change after it", |l| l.contains("after.txt"));
}

#[test]
fn a_detached_mounts_echoes_never_touch_the_laptop_directory_left_at_its_path() {
    let s = served("http");
    let m = s.mount.dir.clone();
    // A program keeps the mount busy, so a lazy unmount leaves the daemon serving it.
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let user = Stop(
        Command::new("sleep")
            .arg("60")
            .current_dir(m.join("sub"))
            .spawn()
            .unwrap(),
    );
    let pid = user.0.id();
    let out = Command::new(sbxfs_bin())
        .args(["umount", "--lazy"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    // The path is a plain laptop directory now, holding the laptop's own file.
    fs::write(m.join("a.txt"), "the laptop's own\n").unwrap();
    fs::create_dir(m.join("gone-dir")).unwrap();
    // The sandbox changes the same names, and makes new ones.
    fs::write(s.root.join("a.txt"), "changed in the sandbox\n").unwrap();
    fs::write(s.root.join("new.txt"), "new\n").unwrap();
    fs::create_dir(s.root.join("newdir")).unwrap();
    fs::remove_dir(s.root.join("gone-dir")).unwrap();
    fs::rename(s.root.join("move-me.txt"), s.root.join("moved.txt")).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let mut names: Vec<String> = fs::read_dir(&m)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "gone-dir"]);
    assert_eq!(
        fs::read_to_string(m.join("a.txt")).unwrap(),
        "the laptop's own\n"
    );
    fs::remove_file(m.join("a.txt")).unwrap();
    fs::remove_dir(m.join("gone-dir")).unwrap();
}

#[test]
fn a_file_written_as_it_is_made_in_the_sandbox_is_created_and_modified_once() {
    let s = served("http");
    let Some(w) = inotify(&s.mount.dir) else {
        eprintln!("skipped: no inotifywait (scripts/install-deps.sh installs inotify-tools)");
        return;
    };
    let m = s.mount.dir.display().to_string();
    for i in 0..12 {
        fs::write(s.root.join(format!("n{i}.txt")), format!("c{i}\n")).unwrap();
    }
    let last = format!("{m}/n11.txt ");
    w.wait_for("the last file's events", |l| {
        l.contains(&last) && l.contains("CLOSE_WRITE")
    });
    // Whatever else would come (a second modify) comes within the echo's second.
    std::thread::sleep(Duration::from_secs(3));
    let lines = w.all();
    for i in 0..12 {
        let path = format!("{m}/n{i}.txt ");
        let count = |kind: &str| {
            lines
                .iter()
                .filter(|l| {
                    l.contains(&path) && l.split(' ').next().unwrap().split(',').any(|k| k == kind)
                })
                .count()
        };
        assert_eq!(
            (count("CREATE"), count("MODIFY")),
            (1, 1),
            "n{i}.txt: {lines:#?}"
        );
    }
}

/// A file made and moved at once in the sandbox (`echo > c; mv c d`, a tool's save through a
/// temporary name): the watcher sees the new name appear (its creation settled to nothing,
/// the move had nothing to move on the mountpoint, and nothing was raised).
fn a_file_made_and_moved_at_once_is_seen_under_its_new_name(transport: &str) {
    let _load = CpuHogs::start();
    let s = served(transport);
    let Some(w) = inotify(&s.mount.dir) else {
        eprintln!("skipped: no inotifywait (scripts/install-deps.sh installs inotify-tools)");
        return;
    };
    let m = s.mount.dir.display().to_string();
    for round in 0..6 {
        let (c, d) = (format!("c{round}.txt"), format!("d{round}.txt"));
        fs::write(s.root.join("sub").join(&c), "x\n").unwrap();
        fs::rename(s.root.join("sub").join(&c), s.root.join("sub").join(&d)).unwrap();
        let seen = format!("{m}/sub/{d} ");
        w.wait_for(&format!("CREATE or MOVED_TO of sub/{d}"), move |l| {
            (l.starts_with("CREATE ") || l.starts_with("MOVED_TO ")) && l.contains(&seen)
        });
    }
}

#[test]
fn a_file_made_and_moved_at_once_is_seen_under_its_new_name_agent() {
    a_file_made_and_moved_at_once_is_seen_under_its_new_name("http");
}

#[test]
fn a_file_made_and_moved_at_once_is_seen_under_its_new_name_shell() {
    a_file_made_and_moved_at_once_is_seen_under_its_new_name("shell");
}
