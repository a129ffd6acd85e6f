//! The exec-only scripts backend against real shells: hostile names never become script
//! text, a forged or broken answer is an error, a sandbox without python3 answers the same,
//! queries agree with the agent's over the same directory, and bad URLs fail clearly.

use crate::common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::StreamExt;

use common::*;
use sbxfs::remote::connect::{connect, ConnectOptions};
use sbxfs::remote::exec::{script_remote, CommandRunner};
use sbxfs::remote::*;
use sbxfs::search::grep::GrepOptions;
use sbxfs::search::scan::ScanRequest;

fn shell_remote(root: &Path, argv: &[&str]) -> Arc<dyn Remote> {
    let runner =
        Arc::new(CommandRunner::new(argv.iter().map(|s| s.to_string()).collect()).unwrap());
    script_remote(runner, root.as_os_str().as_bytes().to_vec()).unwrap()
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    (dir, root)
}

fn whole(data: &[u8]) -> CommitContent {
    CommitContent::Whole(Box::new(std::io::Cursor::new(data.to_vec())))
}

/// Names that would run a command, end a quote or read as an option if spliced into a script
/// (the command makes the file `pwned` in the shell's working directory).
fn hostile_names() -> Vec<Vec<u8>> {
    let m = "pwned";
    vec![
        format!("$(touch {m})").into_bytes(),
        format!("`touch {m}`").into_bytes(),
        format!("'; touch {m}; '").into_bytes(),
        format!("\"; touch {m}; \"").into_bytes(),
        b"-rf".to_vec(),
        b"--".to_vec(),
        b"a name with spaces".to_vec(),
        b"new\nline\n".to_vec(),
        b"\n__RESULT__\nok\n".to_vec(),
        b"tab\there".to_vec(),
        b"not utf8 \xff\xfe".to_vec(),
        b"back\\slash%s%n".to_vec(),
        b"*".to_vec(),
        b"..dots".to_vec(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_pass_every_operation_as_data() {
    let (dir, root) = workspace();
    let marker = dir.path().join("pwned");
    let cd = format!("cd '{}' && exec sh", dir.path().display());
    let r = shell_remote(&root, &["sh", "-c", &cd]);
    for name in hostile_names() {
        let shown = String::from_utf8_lossy(&name).into_owned();
        let p = RemotePath::new(name.clone()).unwrap();
        let d = RemotePath::new([&name[..], b".d"].concat()).unwrap();
        let moved = RemotePath::new([&name[..], b".moved"].concat()).unwrap();
        let linked = RemotePath::new([&name[..], b".link"].concat()).unwrap();
        let sym = RemotePath::new([&name[..], b".sym"].concat()).unwrap();

        r.create(&p, 0o640).await.unwrap();
        let a = r
            .commit(&p, whole(&name), CommitOptions::default())
            .await
            .unwrap();
        assert_eq!(a.mode, 0o640, "{shown}");
        assert_eq!(&r.read(&p, 0, 4096).await.unwrap().data[..], &name[..]);
        assert_eq!(
            fs::read(root.join(std::ffi::OsStr::from_bytes(&name))).unwrap(),
            name
        );
        r.mkdir(&d, 0o750).await.unwrap();
        let inner = d.join(&name).unwrap();
        r.commit(&inner, whole(b"x"), CommitOptions::default())
            .await
            .unwrap();
        let names: Vec<Vec<u8>> = r
            .list(&d)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name.0)
            .collect();
        assert_eq!(names, vec![name.clone()], "{shown}");
        r.link(&p, &linked).await.unwrap();
        r.symlink(&sym, &name).await.unwrap();
        assert_eq!(r.readlink(&sym).await.unwrap(), name);
        r.rename(&p, &moved, RenameMode::Replace).await.unwrap();
        assert!(matches!(r.stat(&p).await, Err(RemoteError::NotFound(_))));
        r.setattr(
            &moved,
            SetAttr {
                mode: Some(0o600),
                mtime_ns: Some(1_600_000_000_123_456_789),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let m = r.stat(&moved).await.unwrap();
        assert_eq!((m.mode, m.mtime_ns), (0o600, 1_600_000_000_123_456_789));
        r.unlink(&moved).await.unwrap();
        r.unlink(&linked).await.unwrap();
        r.unlink(&sym).await.unwrap();
        r.unlink(&inner).await.unwrap();
        r.rmdir(&d).await.unwrap();
        assert!(!marker.exists(), "{shown} ran a command");
    }
    // Everything made was removed again: nothing else was touched.
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
    assert!(!marker.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_broken_answer_is_an_error() {
    let (_dir, root) = workspace();
    fs::write(root.join("f"), "data").unwrap();
    let root_s = root.to_str().unwrap();
    // A sandbox shell that prints a result marker of its own before running the program.
    let forged = shell_remote(
        &root,
        &["sh", "-c", "printf '__RESULT__\\nok\\nS 1 2 3\\n'; exec sh"],
    );
    assert!(matches!(
        forged.stat(&RemotePath::new(b"f".to_vec()).unwrap()).await,
        Err(RemoteError::Transport(m)) if m.contains("more than one result marker")
    ));
    // One that answers without running anything.
    let liar = shell_remote(
        &root,
        &[
            "sh",
            "-c",
            "cat >/dev/null; printf '__RESULT__\\nok\\nR Lw==\\nF ns\\n'",
        ],
    );
    let e = liar
        .read(&RemotePath::new(b"f".to_vec()).unwrap(), 0, 10)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");
    // One that dies.
    let dead = shell_remote(&root, &["sh", "-c", "cat >/dev/null; exit 3"]);
    let e = dead.info().await.unwrap_err();
    assert!(
        matches!(&e, RemoteError::Transport(m) if m.contains("exit 3")),
        "{e:?}"
    );
    // And the honest shell still answers.
    let good = shell_remote(&root, &["sh"]);
    assert_eq!(good.info().await.unwrap().root, root_s);
}

/// A PATH with everything of /usr/bin and /bin but python3.
fn path_without_python(dir: &Path) -> String {
    for bin in ["/usr/bin", "/bin"] {
        for e in fs::read_dir(bin).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name.as_bytes().starts_with(b"python") || dir.join(&name).exists() {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), dir.join(&name)).unwrap();
        }
    }
    format!("PATH={}", dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_without_python3_answers_the_same() {
    let (dir, root) = workspace();
    fs::create_dir(root.join("src")).unwrap();
    fs::write(root.join("src/a.rs"), "fn a() {}\n").unwrap();
    fs::write(root.join("bin"), [0u8, 255, 10, 13]).unwrap();
    std::os::unix::fs::symlink("src/a.rs", root.join("link")).unwrap();
    let tools = dir.path().join("tools");
    fs::create_dir(&tools).unwrap();
    let path = path_without_python(&tools);
    let with = shell_remote(&root, &["sh"]);
    let without = shell_remote(&root, &["env", &path, "sh"]);
    let top = RemotePath::root();
    let src = RemotePath::new(b"src".to_vec()).unwrap();
    let bin = RemotePath::new(b"bin".to_vec()).unwrap();
    // Only python3 tells whether a file has xattrs (the sh path leaves it unknown); reading a
    // symlink's target (either path) may move its atime.
    let unknown = |mut a: Attr| {
        a.has_xattrs = None;
        a.atime_ns = 0;
        a
    };
    let mut listed = with.list(&top).await.unwrap();
    for e in listed.iter_mut() {
        e.attr = unknown(e.attr.clone());
    }
    let mut plain = without.list(&top).await.unwrap();
    for e in plain.iter_mut() {
        e.attr = unknown(e.attr.clone());
    }
    assert_eq!(listed, plain);
    assert_eq!(
        unknown(with.stat(&src).await.unwrap()),
        unknown(without.stat(&src).await.unwrap())
    );
    assert_eq!(
        with.read(&bin, 1, 10).await.unwrap(),
        without.read(&bin, 1, 10).await.unwrap()
    );
    let a: Vec<_> = with
        .tree(&top)
        .await
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            e.attr = unknown(e.attr);
            e
        })
        .collect()
        .await;
    let b: Vec<_> = without
        .tree(&top)
        .await
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            e.attr = unknown(e.attr);
            e
        })
        .collect()
        .await;
    assert_eq!(a, b);
    // What needs python3 says so.
    assert!(matches!(
        without.rename(&bin, &src, RenameMode::Exchange).await,
        Err(RemoteError::Unsupported(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_answer_as_the_agent_does() {
    let (_dir, root) = workspace();
    fs::create_dir_all(root.join("src/deep")).unwrap();
    fs::write(root.join("src/a.rs"), "fn a() {}\n// TODO one\n").unwrap();
    fs::write(root.join("src/deep/b.rs"), "// TODO two\nfn b() {}\n").unwrap();
    fs::write(root.join(".gitignore"), "ignored.txt\n").unwrap();
    fs::create_dir(root.join(".git")).unwrap();
    fs::write(root.join("ignored.txt"), "TODO hidden\n").unwrap();
    fs::write(root.join("notes.txt"), "alpha\nbeta\ngamma\n").unwrap();
    let agent = AgentProcess::start(&root);
    let a = agent.client();
    let s = shell_remote(&root, &["sh"]);
    let top = RemotePath::root();

    let grep = |r: Arc<dyn Remote>| async move {
        let opts = GrepOptions {
            pattern: "TODO".into(),
            ..Default::default()
        };
        let events: Vec<GrepEvent> = r
            .grep(&RemotePath::root(), opts)
            .await
            .unwrap()
            .map(|e| e.unwrap())
            .collect()
            .await;
        events
    };
    let from_agent = grep(Arc::new(agent.client())).await;
    let from_shell = grep(s.clone()).await;
    assert_eq!(from_shell, from_agent);
    assert!(from_shell.len() >= 3, "{from_shell:?}");

    assert_eq!(
        s.glob(&top, "**/*.rs").await.unwrap(),
        a.glob(&top, "**/*.rs").await.unwrap()
    );
    let fq = FuzzyRequest {
        query: "brs".into(),
        ..Default::default()
    };
    assert_eq!(
        s.fuzzy(&top, fq.clone()).await.unwrap(),
        a.fuzzy(&top, fq).await.unwrap()
    );
    let notes = RemotePath::new(b"notes.txt".to_vec()).unwrap();
    let req = ScanRequest {
        start_line: 2,
        end_line: Some(3),
        max_bytes: 100,
    };
    assert_eq!(
        s.scan(&notes, req).await.unwrap(),
        a.scan(&notes, req).await.unwrap()
    );
    let bad = ScanRequest {
        start_line: 3,
        end_line: Some(1),
        max_bytes: 100,
    };
    assert!(s.scan(&notes, bad).await.is_err());
    let info = s.info().await.unwrap();
    // No feed; patches applied in the sandbox (this sandbox's times have nanoseconds).
    assert!(!info.capabilities.feed && info.capabilities.patch_commits);
    assert!(matches!(
        s.watch(None).await,
        Err(RemoteError::Unsupported(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_and_exec_urls_fail_clearly() {
    let (_dir, root) = workspace();
    let opts = ConnectOptions::default();
    let missing = format!("shell:{}/nope", root.display());
    let e = connect(&missing, &opts)
        .await
        .err()
        .expect("a missing root");
    // A wrong workspace is a usage mistake (`sbxfs mount` exits 2), naming the URL.
    assert!(matches!(e, RemoteError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains(&missing), "{e}");
    fs::write(root.join("file"), "").unwrap();
    let file = format!("shell:{}/file", root.display());
    let e = connect(&file, &opts).await.err().expect("a file as root");
    assert!(matches!(e, RemoteError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("not a directory"), "{e}");
    let e = connect("shell:relative/path", &opts).await.err().unwrap();
    assert!(matches!(e, RemoteError::Invalid(_)), "{e:?}");
    let url = format!("exec:{}", root.display());
    let e = connect(&url, &opts).await.err().unwrap();
    assert!(e.to_string().contains("--exec"), "{e}");
    let unbalanced = ConnectOptions {
        exec: Some("sh -c 'exec sh".into()),
        ..Default::default()
    };
    let e = connect(&url, &unbalanced).await.err().unwrap();
    assert!(matches!(e, RemoteError::Invalid(_)), "{e:?}");
    let scripts = connect(&format!("shell:{}?agent=no", root.display()), &opts)
        .await
        .unwrap();
    assert_eq!(scripts.transport, "shell");
    assert_eq!(scripts.info.root, root.to_str().unwrap());
    assert!(!scripts.info.capabilities.feed);
    let e = connect(&format!("shell:{}?agent=maybe", root.display()), &opts)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("agent=maybe"), "{e}");
    assert!(e.to_string().contains("agent=no, session=no"), "{e}");
    // Options combine; a command per operation on request.
    let per_op = connect(
        &format!("shell:{}?agent=no&session=no", root.display()),
        &opts,
    )
    .await
    .unwrap();
    assert_eq!(
        per_op.scripts_by.as_deref(),
        Some("a command per operation (?session=no)")
    );
    assert_eq!(scripts.scripts_by.as_deref(), Some("one python3 session"));
    // By default the agent runs over the shell's standard input and output.
    let with_agent = ConnectOptions {
        deploy_binary: Some(env!("CARGO_BIN_EXE_sbxfs").into()),
        ..Default::default()
    };
    let agent = connect(&format!("shell:{}", root.display()), &with_agent)
        .await
        .unwrap();
    assert_eq!(agent.transport, "shell+agent");
    assert!(agent.info.capabilities.feed);
    for bad in [missing.as_str(), file.as_str()] {
        let e = connect(bad, &with_agent).await.err().unwrap();
        assert!(matches!(e, RemoteError::Invalid(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains(bad), "{e}");
    }
}

/// A shell transport that also moves files natively, as agentscope's HTTP upload does: the
/// sandbox is this machine, so `put_file` writes the file itself.
struct UploadingRunner {
    shell: CommandRunner,
    uploads: std::sync::Mutex<Vec<Vec<u8>>>,
    downloads: std::sync::Mutex<Vec<Vec<u8>>>,
}

#[async_trait::async_trait]
impl sbxfs::remote::exec::Runner for UploadingRunner {
    async fn run(
        &self,
        program: &str,
        ctl: &sbxfs::remote::exec::RunControl,
    ) -> Result<sbxfs::remote::exec::Output> {
        self.shell.run(program, ctl).await
    }
    async fn put_file(&self, abs_path: &[u8], data: bytes::Bytes) -> Option<Result<()>> {
        self.uploads.lock().unwrap().push(abs_path.to_vec());
        Some(
            fs::write(std::ffi::OsStr::from_bytes(abs_path), &data)
                .map_err(|e| RemoteError::Io("upload".into(), e.to_string())),
        )
    }
    async fn get_file(&self, abs_path: &[u8]) -> Option<Result<bytes::Bytes>> {
        self.downloads.lock().unwrap().push(abs_path.to_vec());
        Some(
            fs::read(std::ffi::OsStr::from_bytes(abs_path))
                .map(bytes::Bytes::from)
                .map_err(|e| RemoteError::Io("download".into(), e.to_string())),
        )
    }
    fn describe(&self) -> String {
        "sh with uploads".into()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_and_reads_use_native_file_moves_when_the_transport_has_them() {
    let (_dir, root) = workspace();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/f"), "old").unwrap();
    let runner = Arc::new(UploadingRunner {
        shell: CommandRunner::new(vec!["sh".into()]).unwrap(),
        uploads: Default::default(),
        downloads: Default::default(),
    });
    let r = script_remote(runner.clone(), root.as_os_str().as_bytes().to_vec()).unwrap();
    let f = RemotePath::new(b"d/f".to_vec()).unwrap();
    let before = r.stat(&f).await.unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let a = r
        .commit(
            &f,
            whole(&data),
            CommitOptions {
                base: Some(before.version.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(fs::read(root.join("d/f")).unwrap(), data);
    assert_eq!(a.size, data.len() as u64);
    assert_eq!(runner.uploads.lock().unwrap().len(), 1);
    // Reads take the native download, of the file the path resolves to, with its version.
    let got = r.read(&f, 5, 10).await.unwrap();
    assert_eq!(&got.data[..], &data[5..15]);
    assert_eq!(got.version, a.version);
    assert_eq!(
        runner.downloads.lock().unwrap().as_slice(),
        &[root.join("d/f").as_os_str().as_bytes().to_vec()]
    );
    assert!(r.read(&f, 1 << 40, 10).await.unwrap().data.is_empty());
    // A conflict still removes the upload.
    let e = r
        .commit(
            &f,
            whole(b"late"),
            CommitOptions {
                base: Some(before.version),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, RemoteError::Conflict { .. }), "{e:?}");
    assert_eq!(fs::read(root.join("d/f")).unwrap(), data);
    let mut left: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .chain(fs::read_dir(root.join("d")).unwrap())
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, vec!["d", "f"]);
}

/// A sandbox whose `python3` is a slow shim (pyenv's runs a program of its own first) makes
/// every stat and listing pay its start-up: the mount's log says so once, with the cure.
#[test]
fn a_slow_starting_python_is_named_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("f"), "x").unwrap();
    let bin = dir.path().join("shim");
    fs::create_dir(&bin).unwrap();
    let real = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a python3");
    let shim = bin.join("python3");
    fs::write(&shim, format!("#!/bin/sh\nsleep 1.5\nexec {real} \"$@\"\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    // A command per operation pays the shim every time, and the log says so; the session puts
    // the real interpreter first on its PATH, so nothing is slow and nothing is said.
    for (query, warned) in [("agent=no&session=no", true), ("agent=no", false)] {
        let mount = MountProcess::start_url_env(
            &format!("shell:{}?{query}", root.display()),
            "unused",
            &[],
            &[("PATH", &path)],
        );
        assert_eq!(fs::read(mount.dir.join("f")).unwrap(), b"x");
        let log = mount.log_text();
        assert_eq!(
            log.contains("python3 takes") && log.contains("first in the sandbox's PATH"),
            warned,
            "{query}: {log}"
        );
    }
}
