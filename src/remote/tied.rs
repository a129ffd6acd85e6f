//! Local commands that die with the daemon: a channel command (`sh`, `docker exec -i`, `ssh`)
//! left running after the mount is killed would hold the sandbox's session (and, for a local
//! `sh`, the agent) forever. Each is started with `PR_SET_PDEATHSIG`, which fires when the
//! *thread* that forked it exits, so the fork happens on one thread kept for the process's life
//! (a runtime's thread may end while the process goes on).

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Job = (
    tokio::process::Command,
    tokio::runtime::Handle,
    mpsc::Sender<std::io::Result<tokio::process::Child>>,
);

/// Spawn `cmd` (from within a runtime), to be killed when this process exits.
pub fn spawn(mut cmd: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid, kill, getpid) between fork and
    // exec; no allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the line above: the signal will never come.
            if libc::getppid() as u32 != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sbxfs-spawn".into())
            .spawn(move || {
                for (mut cmd, runtime, reply) in rx {
                    let _in_runtime = runtime.enter();
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("a thread to start channel commands from");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tokio::runtime::Handle::current(), reply))
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?
}
