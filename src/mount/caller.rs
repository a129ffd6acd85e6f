//! Whether the thread behind a request has been interrupted. fuser answers the kernel's
//! `FUSE_INTERRUPT` with `ENOSYS`, after which a caller signalled in a long request (a query
//! through the QUERY ioctl) waits for its answer, even to exit; so the request looks at its
//! caller itself. The thread's `/proc` status says: gone, a zombie, or a signal pending that
//! it does not block (what would have been an interrupt; a default-action `SIGINT` shows as
//! the `SIGKILL` the kernel turns it into).

use std::time::Duration;

/// How often a caller is looked at while its request runs.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Resolves once thread `tid` (a request's pid as FUSE gives it) is interrupted or gone;
/// never for `0` (a caller in a pid namespace the daemon cannot see).
pub async fn interrupted(tid: u32) {
    if tid == 0 {
        return std::future::pending().await;
    }
    let status = format!("/proc/{tid}/status");
    loop {
        match std::fs::read_to_string(&status) {
            Ok(s) if !is_interrupted(&s) => {}
            _ => return,
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The process (thread group) thread `tid` belongs to, while it lives and the daemon can see it.
pub fn process_of(tid: u32) -> Option<u32> {
    if tid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether a `/proc/TID/status` text says the thread is leaving or has a signal to take.
fn is_interrupted(status: &str) -> bool {
    let mut pending = 0u64;
    let mut blocked = 0u64;
    for l in status.lines() {
        let Some((key, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let mask = || u64::from_str_radix(value, 16).unwrap_or(0);
        match key {
            "State" if value.starts_with('Z') || value.starts_with('X') => return true,
            "SigPnd" | "ShdPnd" => pending |= mask(),
            "SigBlk" => blocked = mask(),
            _ => {}
        }
    }
    pending & !blocked != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: &str, sigpnd: &str, shdpnd: &str, sigblk: &str) -> String {
        format!(
            "Name:\tsbxfs\nState:\t{state}\nSigPnd:\t{sigpnd}\nShdPnd:\t{shdpnd}\nSigBlk:\t{sigblk}\n"
        )
    }

    #[test]
    fn a_pending_unblocked_signal_or_a_zombie_interrupts_and_a_blocked_one_does_not() {
        let none = "0000000000000000";
        assert!(!is_interrupted(&status("S (sleeping)", none, none, none)));
        // SIGKILL (a default-action SIGINT becomes it), for the thread or the group.
        assert!(is_interrupted(&status(
            "S (sleeping)",
            "0000000000000100",
            none,
            none
        )));
        assert!(is_interrupted(&status(
            "D (disk sleep)",
            none,
            "0000000000000100",
            none
        )));
        // SIGINT pending for a program that handles it: an interrupt, as FUSE_INTERRUPT is.
        assert!(is_interrupted(&status(
            "S (sleeping)",
            none,
            "0000000000000002",
            none
        )));
        // Blocked: the program chose not to take it now.
        let sigint = "0000000000000002";
        assert!(!is_interrupted(&status(
            "S (sleeping)",
            none,
            sigint,
            sigint
        )));
        assert!(is_interrupted(&status("Z (zombie)", none, none, none)));
    }

    #[test]
    fn a_thread_belongs_to_its_process() {
        // SAFETY: gettid and getpid have no preconditions.
        let (tid, pid) = unsafe { (libc::gettid() as u32, libc::getpid() as u32) };
        assert_eq!(process_of(tid), Some(pid));
        assert_eq!(process_of(0), None);
        assert_eq!(process_of(u32::MAX - 1), None);
    }

    #[tokio::test]
    async fn a_live_thread_is_not_interrupted_and_a_missing_one_is() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let still = tokio::time::timeout(Duration::from_millis(300), interrupted(me)).await;
        assert!(still.is_err(), "this thread has no signal pending");
        tokio::time::timeout(Duration::from_secs(5), interrupted(u32::MAX - 1))
            .await
            .expect("no such thread: at once");
    }
}
