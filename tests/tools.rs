//! Real tools in a real mount, checked on the sandbox side: cargo's incremental builds (temp
//! files renamed while open), SQLite in WAL mode with two connections (shared memory file,
//! several writers), rsync with hard links, and git's garbage collection (packs renamed over
//! while open, many unlinks). These are the programs that broke earlier builds of the mount.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    _agent: AgentProcess,
    mount: MountProcess,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let agent = AgentProcess::start(&root);
    let mount = MountProcess::start(&agent, &[]);
    Setup {
        _dir: dir,
        root,
        _agent: agent,
        mount,
    }
}

fn sh(dir: &Path, script: &str) -> (i32, String, String) {
    let (code, out, err) = run(Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("CARGO_TERM_COLOR", "never"));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

fn leftovers(dir: &Path) -> Vec<String> {
    let (_, out, _) = sh(dir, "find . -name '*sbxfs*'");
    out.lines().map(str::to_string).collect()
}

#[test]
fn cargo_builds_incrementally_twice_with_no_corrupt_artifacts() {
    let s = setup();
    let m = &s.mount.dir;
    let (code, _, err) = sh(
        m,
        "cargo new -q app && cd app && printf 'fn main() { println!(\"v1 {}\", helper()); }\\nfn helper() -> u32 { 41 + 1 }\\n' > src/main.rs && CARGO_INCREMENTAL=1 cargo build 2>&1",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sh(
        &m.join("app"),
        "sed -i 's/v1/v2/' src/main.rs && CARGO_INCREMENTAL=1 cargo build 2>&1 && ./target/debug/app",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !out.contains("corrupt") && !out.contains("warning: error"),
        "cargo complained: {out}"
    );
    assert!(out.trim_end().ends_with("v2 42"), "{out}");
    // The sandbox holds a working build, equal in behaviour to a local one.
    let (code, out, err) = sh(&s.root.join("app"), "./target/debug/app");
    assert_eq!((code, out.as_str()), (0, "v2 42\n"), "{err}");
    let (code, out, _) = sh(
        &s.root.join("app"),
        "ls target/debug/incremental/*/* | grep -c dep-graph.bin",
    );
    assert_eq!(code, 0);
    assert!(out.trim().parse::<u32>().unwrap() >= 1, "{out}");
    assert!(leftovers(&s.root).is_empty(), "{:?}", leftovers(&s.root));
}

#[test]
fn sqlite_in_wal_mode_with_two_connections() {
    let s = setup();
    let script = r#"
import sqlite3
a = sqlite3.connect('db.sqlite'); a.execute('pragma journal_mode=wal')
a.execute('create table t (k integer primary key, v text)'); a.commit()
b = sqlite3.connect('db.sqlite')
for i in range(200):
    (a if i % 2 else b).execute('insert into t (v) values (?)', ('row %d' % i,))
    (a if i % 2 else b).commit()
assert a.execute('select count(*) from t').fetchone()[0] == 200
assert b.execute('pragma integrity_check').fetchone()[0] == 'ok'
a.execute('pragma wal_checkpoint(truncate)'); a.close(); b.close()
print('ok')
"#;
    let (code, out, err) = sh(&s.mount.dir, &format!("python3 - <<'EOF'\n{script}\nEOF"));
    assert_eq!((code, out.trim()), (0, "ok"), "{err}");
    // The sandbox's copy is a sound database with every row.
    let (code, out, err) = sh(
        &s.root,
        "python3 -c \"import sqlite3; c = sqlite3.connect('db.sqlite'); print(c.execute('select count(*) from t').fetchone()[0], c.execute('pragma integrity_check').fetchone()[0])\"",
    );
    assert_eq!((code, out.trim()), (0, "200 ok"), "{err}");
    assert!(leftovers(&s.root).is_empty(), "{:?}", leftovers(&s.root));
}

#[test]
fn rsync_with_hard_links_keeps_them_linked() {
    require_tool("rsync");
    let s = setup();
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    fs::write(src.path().join("d/one"), "shared content").unwrap();
    fs::hard_link(src.path().join("d/one"), src.path().join("d/two")).unwrap();
    fs::write(src.path().join("d/other"), "other").unwrap();
    let (code, _, err) = sh(
        src.path(),
        &format!("rsync -aH d/ {}/d/", s.mount.dir.display()),
    );
    assert_eq!(code, 0, "{err}");
    use std::os::unix::fs::MetadataExt;
    let (one, two) = (
        fs::metadata(s.root.join("d/one")).unwrap(),
        fs::metadata(s.root.join("d/two")).unwrap(),
    );
    assert_eq!(one.ino(), two.ino(), "still one file in the sandbox");
    assert_eq!(one.nlink(), 2);
    assert_eq!(
        fs::read_to_string(s.root.join("d/two")).unwrap(),
        "shared content"
    );
    // And back out, links kept.
    let out = tempfile::tempdir().unwrap();
    let (code, _, err) = sh(
        &s.mount.dir,
        &format!("rsync -aH d/ {}/", out.path().display()),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        fs::metadata(out.path().join("one")).unwrap().ino(),
        fs::metadata(out.path().join("two")).unwrap().ino()
    );
}

#[test]
fn git_gc_in_the_mount_leaves_a_sound_repository() {
    let s = setup();
    let (code, out, err) = sh(
        &s.mount.dir,
        "git init -q r && cd r && git config user.email t@t && git config user.name t && \
         for i in $(seq 1 30); do echo $i > f$i; git add f$i; git commit -qm c$i; done && \
         git gc -q && git fsck --full 2>&1 && git count-objects -v | grep -E '^(count|packs)'",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("count: 0") && out.contains("packs: 1"),
        "{out}"
    );
    let (code, out, err) = sh(
        &s.root.join("r"),
        "git fsck --full && git log --oneline | wc -l",
    );
    assert_eq!((code, out.trim()), (0, "30"), "{err}");
    assert!(leftovers(&s.root).is_empty(), "{:?}", leftovers(&s.root));
}

/// A wheel built by hand (no network, no build tools): one module.
fn hello_wheel(dir: &Path) -> std::path::PathBuf {
    let wheel = dir.join("hello-0.1-py3-none-any.whl");
    let script = format!(
        "import zipfile\n\
         with zipfile.ZipFile({wheel:?}, 'w') as z:\n\
         \x20   z.writestr('hello.py', 'X = \"hi from the wheel\"\\n')\n\
         \x20   z.writestr('hello-0.1.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: hello\\nVersion: 0.1\\n')\n\
         \x20   z.writestr('hello-0.1.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: sbxfs-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
         \x20   z.writestr('hello-0.1.dist-info/RECORD', 'hello.py,,\\nhello-0.1.dist-info/METADATA,,\\nhello-0.1.dist-info/WHEEL,,\\nhello-0.1.dist-info/RECORD,,\\n')\n",
        wheel = wheel.display().to_string()
    );
    let (code, _, err) = run(Command::new("python3").arg("-c").arg(script));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    wheel
}

#[test]
fn python_venv_and_pip_install_of_a_local_wheel_work_in_a_mount() {
    let s = setup();
    let m = &s.mount.dir;
    let wheel = hello_wheel(s._dir.path());
    // venv links bin/python3 to the interpreter and runs it at once (it used to read back as
    // /dev/null/sbxfs-outside/…: `[Errno 20] Not a directory`).
    let (code, out, err) = sh(
        m,
        &format!(
            "python3 -m venv venv && venv/bin/pip install -q --no-index --no-deps {} && \
             venv/bin/python -c 'import hello, sys; print(hello.X); print(sys.prefix)'",
            wheel.display()
        ),
    );
    assert_eq!(code, 0, "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("hi from the wheel"));
    assert_eq!(Path::new(lines.next().unwrap()), m.join("venv"));
    // In the sandbox: the installed module, and the interpreter link as venv wrote it.
    let (code, out, _) = sh(&s.root, "ls venv/lib/python3*/site-packages/hello.py");
    assert_eq!(code, 0, "{out}");
    let link = fs::read_link(s.root.join("venv/bin/python3")).unwrap();
    assert_eq!(fs::read_link(m.join("venv/bin/python3")).unwrap(), link);
    assert!(link.is_absolute(), "{}", link.display());
}

#[test]
fn python_venv_works_in_a_shell_mount() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let url = format!("shell:{}", root.display());
    let mount = MountProcess::start_url(&url, "", &[]);
    let (code, out, err) = sh(
        &mount.dir,
        "python3 -m venv --without-pip venv && venv/bin/python -c 'import sys; print(sys.prefix)'",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(Path::new(out.trim()), mount.dir.join("venv"));
    assert!(fs::read_link(root.join("venv/bin/python3")).is_ok());
}
