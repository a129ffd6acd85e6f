//! Supervised remote processes over real local shells (dash as `sh`, and busybox's ash): a
//! cancel, a timeout or a normal exit leaves no process of the job's group running (checked
//! with `ps`); a cancel before the start runs nothing; output is capped with the cut counted;
//! secrets reach the program but no argv, environment or leftover file.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sbxfs::remote::exec::supervise::{Job, JobId, Supervised};
use sbxfs::remote::exec::{CommandRunner, Output, RunControl, Runner, OUTPUT_CAP};
use sbxfs::remote::RemoteError;

/// Only to stop a hung test, never part of an assertion.
const HANG: Duration = Duration::from_secs(60);

fn shells() -> Vec<(&'static str, Vec<String>)> {
    let mut v = vec![("dash", vec!["sh".to_string()])];
    if common::require_tool("busybox").is_some() {
        v.push(("busybox", vec!["busybox".into(), "sh".into()]));
    }
    v
}

fn supervised(argv: Vec<String>) -> Supervised<CommandRunner> {
    Supervised::new(Arc::new(CommandRunner::new(argv).unwrap()))
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

/// The sandbox's job directory, as the supervisor picks it (this test runs where /dev/shm is
/// writable or not at all).
fn job_dir() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() && rustix::fs::access(shm, rustix::fs::Access::WRITE_OK).is_ok() {
        shm.to_path_buf()
    } else {
        std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/tmp".into())
    };
    base.join(format!("sbxfs-jobs-{uid}"))
}

fn job_files(id: &JobId) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(job_dir()) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{}.", id.as_str())))
        .collect()
}

/// A program that records its process group in `pgid_file` and leaves two children behind.
fn program_with_children(pgid_file: &Path) -> String {
    format!(
        "sleep 1000 &\nsleep 1000 &\necho $$ > '{}'\nwait\n",
        pgid_file.display()
    )
}

async fn wait_for_pgid(pgid_file: &Path) -> u32 {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(pgid_file) {
            if let Ok(n) = s.trim().parse() {
                return n;
            }
        }
        assert!(start.elapsed() < HANG, "the job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cancel_stops_every_process_of_the_group() {
    for (name, argv) in shells() {
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pgid");
        let sup = Arc::new(supervised(argv));
        let job = Job {
            program: program_with_children(&pgid_file),
            ..Job::default()
        };
        let ctl = RunControl::default();
        let run = {
            let (sup, job, ctl) = (sup.clone(), job.clone(), ctl.clone());
            tokio::spawn(async move { sup.run_job(&job, &ctl).await })
        };
        let pgid = wait_for_pgid(&pgid_file).await;
        assert!(
            live_members(pgid).len() >= 3,
            "{name}: {:?}",
            live_members(pgid)
        );
        ctl.cancel.cancel();
        let r = tokio::time::timeout(HANG, run).await.unwrap().unwrap();
        match r {
            Err(RemoteError::Transport(m)) => assert!(m.contains("cancelled"), "{name}: {m}"),
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(live_members(pgid), Vec::<String>::new(), "{name}");
        assert_eq!(job_files(&job.id), Vec::<String>::new(), "{name}");
    }
}

#[tokio::test]
async fn timeout_stops_the_group_like_a_cancel() {
    for (name, argv) in shells() {
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pgid");
        let sup = supervised(argv);
        let job = Job {
            program: program_with_children(&pgid_file),
            ..Job::default()
        };
        let ctl = RunControl {
            timeout: Some(Duration::from_secs(2)),
            ..RunControl::default()
        };
        let r = sup.run_job(&job, &ctl).await;
        match r {
            Err(RemoteError::TimedOut(m)) => assert!(m.contains("process group"), "{name}: {m}"),
            other => panic!("{name}: {other:?}"),
        }
        let pgid: u32 = std::fs::read_to_string(&pgid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(live_members(pgid), Vec::<String>::new(), "{name}");
        assert_eq!(job_files(&job.id), Vec::<String>::new(), "{name}");
    }
}

#[tokio::test]
async fn leftover_children_are_stopped_when_the_program_exits() {
    for (name, argv) in shells() {
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pgid");
        let sup = supervised(argv);
        let program = format!(
            "sleep 1000 &\necho $$ > '{}'\necho done\nexit 3\n",
            pgid_file.display()
        );
        let out = tokio::time::timeout(HANG, sup.run(&program, &RunControl::default()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (out.code, out.stdout.as_slice()),
            (3, &b"done\n"[..]),
            "{name}"
        );
        let pgid: u32 = std::fs::read_to_string(&pgid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(live_members(pgid), Vec::<String>::new(), "{name}");
    }
}

#[tokio::test]
async fn a_cancel_before_the_start_runs_nothing_and_exits_143() {
    for (name, argv) in shells() {
        let dir = tempfile::tempdir().unwrap();
        let touched = dir.path().join("touched");
        let sup = supervised(argv);
        let job = Job {
            program: format!("touch '{}'\n", touched.display()),
            ..Job::default()
        };
        // The cancel reaches the sandbox first: it leaves the marker.
        sup.cancel(&job.id).await.unwrap();
        let r = sup.run_job(&job, &RunControl::default()).await;
        match r {
            Err(RemoteError::Transport(m)) => assert!(m.contains("cancelled"), "{name}: {m}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(!touched.exists(), "{name}: the program ran");
        assert_eq!(job_files(&job.id), Vec::<String>::new(), "{name}");

        // Seen from the raw runner: the supervisor's exit status is 143.
        let raw = CommandRunner::new(vec!["sh".into()]).unwrap();
        let probe = Supervised::new(Arc::new(raw));
        let id = JobId::new();
        probe.cancel(&id).await.unwrap();
        let marker = job_dir().join(format!("{}.cancel", id.as_str()));
        assert!(marker.exists(), "{name}: no marker at {}", marker.display());
        let _ = std::fs::remove_file(marker);
    }
}

#[tokio::test]
async fn a_run_cancelled_before_it_is_sent_never_reaches_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let touched = dir.path().join("touched");
    let sup = supervised(vec!["sh".into()]);
    let ctl = RunControl::default();
    ctl.cancel.cancel();
    let r = sup
        .run(&format!("touch '{}'\n", touched.display()), &ctl)
        .await;
    assert!(
        matches!(r, Err(RemoteError::Transport(ref m)) if m.contains("cancelled")),
        "{r:?}"
    );
    assert!(!touched.exists());
}

#[tokio::test]
async fn output_is_capped_per_stream_and_the_cut_reported() {
    const PRINTED: u64 = 20 * 1024 * 1024;
    for (name, argv) in shells() {
        let sup = supervised(argv);
        let program = format!("head -c {PRINTED} /dev/zero\necho small >&2\n");
        let out: Output = tokio::time::timeout(HANG, sup.run(&program, &RunControl::default()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.code, 0, "{name}");
        assert_eq!(out.stdout.len(), OUTPUT_CAP, "{name}");
        assert_eq!(out.stdout_cut, PRINTED - OUTPUT_CAP as u64, "{name}");
        assert_eq!(
            (out.stderr.as_slice(), out.stderr_cut),
            (&b"small\n"[..], 0)
        );
        let e = out.success("a listing").unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "stdout cut at {OUTPUT_CAP} bytes ({} more bytes dropped)",
                PRINTED - OUTPUT_CAP as u64
            )),
            "{name}: {e}"
        );
    }
}

/// A directory holding an `sh` that logs its argv and environment to `log`, then runs dash.
fn recording_sh(dir: &Path, log: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let sh = bin.join("sh");
    std::fs::write(
        &sh,
        format!(
            "#!/bin/sh\n{{ printf 'ARGV'; for a in \"$0\" \"$@\"; do printf ' [%s]' \"$a\"; done; echo; env; echo ---; }} >> '{}'\nexec /bin/sh \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
async fn secrets_reach_the_program_but_no_argv_environment_or_file() {
    let nonce = JobId::new().as_str().replace('-', "x");
    let secret = format!("s3cr3t-{nonce}-'\"$(touch /tmp/pwned)`x`\\n");
    for (name, shell) in [("dash", vec!["sh"]), ("busybox", vec!["busybox", "sh"])] {
        if name == "busybox" && common::require_tool("busybox").is_none() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("argv.log");
        let bin = recording_sh(dir.path(), &log);
        let mut argv = vec![
            "env".to_string(),
            format!("PATH={}:/usr/bin:/bin", bin.display()),
        ];
        argv.extend(shell.iter().map(|s| s.to_string()));
        let sup = supervised(argv);
        let job = Job {
            program: "printf '%s' \"$SBXFS_TEST_TOKEN\" | od -An -tx1 | tr -d ' \\n'\n".into(),
            secrets: vec![("SBXFS_TEST_TOKEN".into(), secret.clone().into_bytes())],
            ..Job::default()
        };
        let out = tokio::time::timeout(HANG, sup.run_job(&job, &RunControl::default()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            out.code,
            0,
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            hex(secret.as_bytes()),
            "{name}"
        );

        // busybox's standalone shell runs `setsid` and `sh` as its own applets, never through
        // PATH: only dash's processes reach the recorder.
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        if name == "dash" {
            assert!(
                logged.contains("ARGV"),
                "{name}: the recording sh never ran"
            );
            assert!(
                logged.contains("sbxfs-job"),
                "{name}: the job shell was not recorded"
            );
        }
        assert!(
            !logged.contains(&nonce),
            "{name}: a secret in an argv or environment:\n{logged}"
        );
        // Nothing of the job stays, and no file of the job directory holds the secret.
        assert_eq!(job_files(&job.id), Vec::<String>::new(), "{name}");
        for e in std::fs::read_dir(job_dir()).unwrap().flatten() {
            let data = std::fs::read(e.path()).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&data).contains(&nonce),
                "{name}: the secret stayed in {}",
                e.path().display()
            );
        }
        assert!(!Path::new("/tmp/pwned").exists());
    }
}

#[tokio::test]
async fn the_job_directory_is_private() {
    let sup = supervised(vec!["sh".into()]);
    let out = sup.run("true\n", &RunControl::default()).await.unwrap();
    assert_eq!(out.code, 0);
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(job_dir()).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o700);
    // SAFETY: getuid cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });
}

#[tokio::test]
async fn a_cancelled_local_command_is_killed_with_its_children_and_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pgid_file = dir.path().join("pgid");
    // Unsupervised: the local `sh` itself leads the group the runner kills.
    let runner = Arc::new(CommandRunner::new(vec!["sh".into()]).unwrap());
    let ctl = RunControl::default();
    let run = {
        let (runner, ctl) = (runner.clone(), ctl.clone());
        let program = program_with_children(&pgid_file);
        tokio::spawn(async move { runner.run(&program, &ctl).await })
    };
    let pgid = wait_for_pgid(&pgid_file).await;
    assert!(live_members(pgid).len() >= 3, "{:?}", live_members(pgid));
    ctl.cancel.cancel();
    let r = tokio::time::timeout(HANG, run).await.unwrap().unwrap();
    assert!(
        matches!(r, Err(RemoteError::Transport(ref m)) if m.contains("cancelled")),
        "{r:?}"
    );
    assert_eq!(live_members(pgid), Vec::<String>::new());
    // Reaped too: the shell is no zombie child of ours.
    let stat = std::fs::read_to_string(format!("/proc/{pgid}/stat")).unwrap_or_default();
    assert!(!stat.contains(") Z "), "{stat}");
}

/// A transport that moves files natively (as an HTTP upload does; here: local writes, the
/// sandbox being this machine) and records every program text it was sent.
struct UploadingRunner {
    shell: CommandRunner,
    sent: std::sync::Mutex<Vec<String>>,
    uploads: std::sync::Mutex<Vec<PathBuf>>,
}

#[async_trait::async_trait]
impl Runner for UploadingRunner {
    async fn run(&self, program: &str, ctl: &RunControl) -> sbxfs::remote::Result<Output> {
        self.sent.lock().unwrap().push(program.to_string());
        self.shell.run(program, ctl).await
    }

    async fn put_file(
        &self,
        abs_path: &[u8],
        data: bytes::Bytes,
    ) -> Option<sbxfs::remote::Result<()>> {
        use std::os::unix::ffi::OsStrExt;
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(abs_path));
        self.uploads.lock().unwrap().push(path.clone());
        Some(
            std::fs::write(&path, &data)
                .map_err(|e| RemoteError::Io(path.display().to_string(), e.to_string())),
        )
    }

    fn describe(&self) -> String {
        "uploading sh".into()
    }
}

#[tokio::test]
async fn secrets_travel_by_upload_where_the_transport_has_one_and_never_in_a_program() {
    let nonce = JobId::new().as_str().replace('-', "y");
    let secret = format!("tok-{nonce}");
    let runner = Arc::new(UploadingRunner {
        shell: CommandRunner::new(vec!["sh".into()]).unwrap(),
        sent: Default::default(),
        uploads: Default::default(),
    });
    let sup = Supervised::new(runner.clone());
    let job = Job {
        program: "printf '%s' \"$API_TOKEN\"\n".into(),
        secrets: vec![("API_TOKEN".into(), secret.clone().into_bytes())],
        ..Job::default()
    };
    let out = sup.run_job(&job, &RunControl::default()).await.unwrap();
    assert_eq!(
        (out.code, String::from_utf8_lossy(&out.stdout)),
        (0, secret.as_str().into())
    );
    let sent = runner.sent.lock().unwrap().join("\n");
    assert!(
        !sent.contains(&nonce),
        "a secret in a program text:\n{sent}"
    );
    let uploads = runner.uploads.lock().unwrap().clone();
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    assert!(uploads[0].starts_with(job_dir()), "{uploads:?}");
    assert!(!uploads[0].exists(), "the secrets file outlived the run");
    assert_eq!(job_files(&job.id), Vec::<String>::new());
}

/// Files a job leaves when its supervisor dies with the channel (its `.pgid`, `.prog`, `.env`)
/// and cancel markers that came after their job ended are swept once 10 minutes old; the
/// files of a job whose process group still runs, and young markers, stay.
#[tokio::test]
async fn leftovers_of_dead_jobs_are_swept_and_live_jobs_kept() {
    use std::os::unix::process::CommandExt;
    for (name, argv) in shells() {
        let sup = supervised(argv);
        // Make sure the directory exists before the leftovers are planted in it.
        sup.run("true\n", &RunControl::default()).await.unwrap();
        let dir = job_dir();
        let tag = format!("sweeptest{:x}", std::process::id());
        let mut live = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let plant = |file: &str, body: String, old: bool| {
            let p = dir.join(format!("{tag}-{file}"));
            std::fs::write(&p, body).unwrap();
            if old {
                let ok = std::process::Command::new("touch")
                    .args(["-d", "20 minutes ago"])
                    .arg(&p)
                    .status()
                    .unwrap();
                assert!(ok.success());
            }
        };
        plant("dead.pgid", format!("{gone_pid}\n"), true);
        plant("dead.prog", "sleep 1\n".into(), true);
        plant("dead.env", "TOKEN='x'\n".into(), true);
        plant("late.cancel", String::new(), true);
        plant("live.pgid", format!("{}\n", live.id()), true);
        plant("live.prog", "sleep 300\n".into(), true);
        plant("fresh.cancel", String::new(), false);
        // Every 16th job sweeps (of this process's: tests beside this one run jobs too).
        for _ in 0..400 {
            if !dir.join(format!("{tag}-dead.pgid")).exists() {
                break;
            }
            sup.run("true\n", &RunControl::default()).await.unwrap();
        }
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_prefix(&format!("{tag}-")).map(str::to_string))
            .collect();
        left.sort();
        let _ = live.kill();
        let _ = live.wait();
        for f in &left {
            let _ = std::fs::remove_file(dir.join(format!("{tag}-{f}")));
        }
        assert_eq!(left, ["fresh.cancel", "live.pgid", "live.prog"], "{name}");
    }
}
