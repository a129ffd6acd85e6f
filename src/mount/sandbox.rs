//! The sandbox as the mount reaches it: its [`Remote`], whether it answers and how fast, and
//! what it said of itself when the mount started (its workspace, what its transport takes).
//! One owner for all of it, so "does the sandbox answer?" has one answer: the one
//! [`Sandbox::note`] keeps from every call's outcome.
//!
//! A call that may be answered from what the mount knows goes through [`Sandbox::ask`]: past
//! `STALL` the sandbox is asked whether it answers at all, and a hung sandbox costs a call
//! about a second, not its 10–60 s deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::remote::{Remote, RemoteError, RemoteInfo, Result, StatFs};

/// A lookup, stat or listing that has waited this long for the sandbox asks whether it
/// answers at all ([`Sandbox::ask`]): a hung sandbox is noticed in about a second, not at the
/// call's 10 s deadline.
const STALL: Duration = Duration::from_millis(500);
/// How long that question waits. An `info` answer is one small round trip, so a sandbox
/// that gives none in this time is taken as gone until the retry loop's probe says otherwise.
const STALL_PROBE: Duration = Duration::from_secs(1);
/// How much longer a call with nothing else to serve waits for that question's answer: a
/// sandbox whose every program starts seconds late on a loaded machine is slow, not gone.
const SLOW_GRACE: Duration = Duration::from_secs(5);
/// Both grow with the sandbox's own pace: this many of its slowest recent `info` answers. A
/// sandbox that answers in 0.8 s (`shell:` on a loaded machine starts a process per call) is
/// slow, not gone.
const PACE_FACTOR: u32 = 4;

/// The sandbox did not answer (as opposed to answering no).
pub(super) fn unreachable(e: &RemoteError) -> bool {
    matches!(e, RemoteError::Transport(_) | RemoteError::TimedOut(_))
}

/// What the sandbox said of itself (`/v1/info`), as the mount uses it.
#[derive(Clone, Debug)]
struct Told {
    /// The workspace's absolute path in the sandbox, for showing symlink targets
    /// ([`super::links`]); unset, every absolute target counts as outside.
    root: Option<Vec<u8>>,
    /// The sandbox's workspace id: what staged edits are tied to.
    workspace_id: Option<String>,
    /// The sandbox refuses a new file's first push where a file appeared meanwhile
    /// ([`crate::remote::Version::absent`]); older agents cannot, and are overwritten.
    commit_absent: bool,
    /// The transport takes patch commits; without them every push sends the whole file.
    patch_commits: bool,
    /// A new file's push may be a patch over nothing.
    patch_new: bool,
    /// A commit sets the access time it is given.
    commit_atime: bool,
}

impl Default for Told {
    /// Before the sandbox says: patches (every transport's default), nothing else.
    fn default() -> Self {
        Told {
            root: None,
            workspace_id: None,
            commit_absent: false,
            patch_commits: true,
            patch_new: false,
            commit_atime: false,
        }
    }
}

pub struct Sandbox {
    remote: Arc<dyn Remote>,
    /// Since when the sandbox has not answered (none: the last remote call reached it), for
    /// `ctl status`, logs and [`Sandbox::ask`].
    offline_since: Mutex<Option<Instant>>,
    /// How long the sandbox's slowest recent `info` answer took (ns), decaying towards faster
    /// ones: the pace [`Sandbox::ask`] allows for.
    pace_ns: AtomicU64,
    /// Remote calls made (for `ctl stats`).
    calls: AtomicU64,
    /// The same by operation, as the transport made them (a retry counts once).
    by_op: Arc<crate::remote::counted::CallCounts>,
    told: RwLock<Told>,
    /// The last `statfs` answer and when it came.
    statfs_seen: Mutex<Option<(Instant, StatFs)>>,
}

impl Sandbox {
    pub fn new(remote: Arc<dyn Remote>) -> Self {
        let (counted, by_op) = crate::remote::counted::Counted::wrap(remote);
        Sandbox {
            remote: Arc::new(counted),
            by_op,
            offline_since: Mutex::new(None),
            pace_ns: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            told: RwLock::new(Told::default()),
            statfs_seen: Mutex::new(None),
        }
    }

    pub fn remote(&self) -> &Arc<dyn Remote> {
        &self.remote
    }

    /// What the sandbox's `info` said: its workspace and what its transport takes.
    pub fn learn(&self, info: &RemoteInfo) {
        let mut t = self.told.write().expect("told lock");
        t.root = Some(info.root.as_bytes().to_vec());
        t.workspace_id = info.workspace_id.clone();
        t.commit_absent = info.commit_absent;
        t.patch_commits = info.capabilities.patch_commits;
        t.patch_new = info.capabilities.patch_new;
        t.commit_atime = info.capabilities.commit_atime;
    }

    fn told(&self) -> std::sync::RwLockReadGuard<'_, Told> {
        self.told.read().expect("told lock")
    }

    pub fn workspace_root(&self) -> Option<Vec<u8>> {
        self.told().root.clone()
    }

    pub fn workspace_id(&self) -> Option<String> {
        self.told().workspace_id.clone()
    }

    pub fn commit_absent(&self) -> bool {
        self.told().commit_absent
    }

    pub fn patch_commits(&self) -> bool {
        self.told().patch_commits
    }

    pub fn patch_new(&self) -> bool {
        self.told().patch_new
    }

    pub fn commit_atime(&self) -> bool {
        self.told().commit_atime
    }

    /// A transport taken as one without patch commits (tests of the whole-file path).
    pub fn set_patch_commits(&self, yes: bool) {
        self.told.write().expect("told lock").patch_commits = yes;
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls made by operation.
    pub fn calls_by_op(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.by_op.snapshot()
    }

    pub fn is_reachable(&self) -> bool {
        self.offline_since.lock().expect("offline lock").is_none()
    }

    /// Whether the sandbox answered (a first failure starts its time offline).
    fn set_reachable(&self, yes: bool) {
        let mut since = self.offline_since.lock().expect("offline lock");
        if yes {
            *since = None;
        } else if since.is_none() {
            *since = Some(Instant::now());
        }
    }

    /// Count a remote call and note whether the sandbox answered.
    pub fn note<T>(&self, r: Result<T>) -> Result<T> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match &r {
            Err(e) if unreachable(e) => self.set_reachable(false),
            _ => self.set_reachable(true),
        }
        r
    }

    /// Ask whether the sandbox answers; `Some(true)` when it answers again after it did not.
    pub async fn probe(&self) -> (bool, bool) {
        let was = self.is_reachable();
        let ok = self.note(self.timed_info().await).is_ok();
        (ok, ok && !was)
    }

    /// How long a probe may take at the sandbox's pace.
    pub fn probe_wait(&self) -> Duration {
        self.stall_limits().1
    }

    /// An `info` call, its time noted as the sandbox's pace when it answers.
    async fn timed_info(&self) -> Result<RemoteInfo> {
        let asked = Instant::now();
        let r = self.remote.info().await;
        if r.is_ok() {
            self.note_pace(asked.elapsed());
        }
        r
    }

    /// The time one `info` answer took: a slower one raises the pace at once, a faster one
    /// lowers it by an eighth of the difference.
    pub fn note_pace(&self, took: Duration) {
        let took = took.as_nanos().min(u64::MAX as u128) as u64;
        let _ = self
            .pace_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if took >= old {
                    took
                } else {
                    old - (old - took) / 8
                })
            });
    }

    /// How long a call waits before asking whether the sandbox answers, and how long that
    /// question waits: `STALL` and `STALL_PROBE`, or more for a slow sandbox.
    fn stall_limits(&self) -> (Duration, Duration) {
        let pace = Duration::from_nanos(self.pace_ns.load(Ordering::Relaxed)) * PACE_FACTOR;
        (STALL.max(pace), STALL_PROBE.max(pace))
    }

    /// A remote call that may have an answer from what the mount knows if the sandbox gives
    /// none (a lookup, stat, or listing), counted and noted ([`Self::note`]). Past `STALL`
    /// the sandbox is asked whether it answers at all; if it does not within `STALL_PROBE`,
    /// the mount is offline until a probe says otherwise, and the call is given up as
    /// unreachable when `known` says the caller has something to serve instead. With nothing
    /// else to serve, a sandbox slowed by load gets `SLOW_GRACE` more for its probe (an
    /// error would be all the caller had): answered, the call goes on to its own deadline;
    /// not, it is given up too. Once the sandbox has not answered for longer than that, calls
    /// get no grace: a hung sandbox costs each 1.5 s.
    pub async fn ask<T>(
        &self,
        call: impl std::future::Future<Output = Result<T>>,
        known: impl FnOnce() -> bool,
    ) -> Result<T> {
        let r = self.or_offline(call, known).await;
        self.note(r)
    }

    async fn or_offline<T>(
        &self,
        call: impl std::future::Future<Output = Result<T>>,
        known: impl FnOnce() -> bool,
    ) -> Result<T> {
        // Known to hang: no probe has answered for longer than a slow sandbox takes.
        let hung = self
            .offline_since
            .lock()
            .expect("offline lock")
            .is_some_and(|t| t.elapsed() > SLOW_GRACE);
        let (stall, stall_probe) = self.stall_limits();
        tokio::pin!(call);
        tokio::select! {
            r = &mut call => return r,
            _ = tokio::time::sleep(stall) => {}
        }
        let probe = self.timed_info();
        tokio::pin!(probe);
        let answered = |p: &Result<RemoteInfo>| match p {
            Ok(_) => true,
            Err(e) => !unreachable(e),
        };
        tokio::select! {
            r = &mut call => return r,
            p = tokio::time::timeout(stall_probe, &mut probe) => match p {
                Ok(p) if answered(&p) => return call.await,
                _ => {}
            },
        }
        let waited = stall + stall_probe;
        if self.is_reachable() {
            tracing::warn!(
                "the sandbox does not answer: serving what the mount knows until it does"
            );
        }
        self.set_reachable(false);
        if !known() && !hung {
            tokio::select! {
                r = &mut call => return r,
                p = tokio::time::timeout(SLOW_GRACE, &mut probe) => match p {
                    Ok(p) if answered(&p) => {
                        self.set_reachable(true);
                        return call.await;
                    }
                    _ => {}
                },
            }
        }
        Err(RemoteError::Transport(format!(
            "no answer within {} ms, nor to a probe",
            waited.as_millis()
        )))
    }

    /// Free space as of at most `ttl` ago on `clock`: `find` and `df` ask on every run, and
    /// no feed reports free space. Out of reach: the last answer, however old (`df` keeps
    /// working).
    pub async fn statfs(&self, clock: &super::clock::Clock, ttl: Duration) -> Result<StatFs> {
        let seen = || self.statfs_seen.lock().expect("statfs lock").clone();
        if let Some((at, s)) = seen() {
            if clock.since(at) < ttl || !self.is_reachable() {
                return Ok(s);
            }
        }
        let known = || seen().is_some();
        match self.ask(self.remote.statfs(), known).await {
            Ok(s) => {
                *self.statfs_seen.lock().expect("statfs lock") = Some((clock.now(), s.clone()));
                Ok(s)
            }
            Err(e) if unreachable(&e) => seen().map(|(_, s)| s).ok_or(e),
            Err(e) => Err(e),
        }
    }
}
