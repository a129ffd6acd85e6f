//! Serving from the background, as `mount -t fuse.sbxfs` and fstab expect of a FUSE program
//! (sshfs does the same): the command returns 0 once the mount answers, or prints why it failed
//! and returns the daemon's exit code; the daemon goes on in its own session.
//!
//! The daemon is this program again (`sbxfs mount --detached …`), started before any thread
//! exists in it, rather than a `fork` of a process that may already run threads. It tells the
//! waiting parent it is ready with its usual "mounted" line on a pipe; its errors go to the
//! stderr it inherited. Once ready it lets go of the terminal: stdin, stdout and stderr go to
//! `/dev/null`, except a stderr that is the systemd journal (`$JOURNAL_STREAM`, as for a mount
//! unit made from fstab), where its log goes on.

use std::ffi::OsString;
use std::io::BufRead;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

/// Start the daemon with `args` and wait until it is ready or gone; the exit code for this
/// command.
pub fn start(args: Vec<OsString>) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sbxfs mount: cannot find this program to start the daemon: {e}");
            return super::exit::Failure::Other as i32;
        }
    };
    let mut child = match Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sbxfs mount: cannot start the daemon: {e}");
            return super::exit::Failure::Other as i32;
        }
    };
    let mut line = String::new();
    let ready = child
        .stdout
        .take()
        .map(|out| std::io::BufReader::new(out).read_line(&mut line))
        .is_some_and(|r| r.is_ok_and(|n| n > 0));
    if ready {
        // The daemon serves on; it is not this process's child to wait for any more.
        return 0;
    }
    match child.wait() {
        Ok(status) => status.code().unwrap_or(super::exit::Failure::Other as i32),
        Err(e) => {
            eprintln!("sbxfs mount: lost the daemon: {e}");
            super::exit::Failure::Other as i32
        }
    }
}

/// In the daemon, first thing: a session of its own, so that closing the terminal or the
/// end of the shell that ran `mount` does not signal it.
pub fn leave_session() {
    if let Err(e) = rustix::process::setsid() {
        tracing::warn!("could not start a session of its own: {e}");
    }
}

/// Once ready, before the "mounted" line: stdin to `/dev/null`, stderr to `log` (a new
/// private file; `/dev/null` if it cannot be made, or with no `log`: stderr is the journal).
pub fn release_stdin_and_stderr(log: Option<&std::path::Path>) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return;
    };
    let _ = rustix::stdio::dup2_stdin(null.as_fd());
    if super::notify::stderr_is_journal() {
        return;
    }
    let file = log.and_then(|log| {
        let _ = std::fs::remove_file(log);
        std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(log)
            .ok()
    });
    let _ = rustix::stdio::dup2_stderr(file.as_ref().map_or(null.as_fd(), |f| f.as_fd()));
}

/// After the "mounted" line: stdout to `/dev/null` (the waiting parent has read it and left).
pub fn release_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(null.as_fd());
    }
}
