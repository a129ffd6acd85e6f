//! Following the sandbox's change feed ([`crate::agent::watch`], [`Remote::watch`]) so that
//! caches can be trusted for as long as it is connected.
//!
//! While the feed is connected and caught up ([`FeedState::trusted`]), attributes, listings,
//! link targets and pages are trusted indefinitely, here and in the kernel's attribute cache
//! ([`TRUSTED_TTL`]), and `open` does not revalidate: warm commands cost no round trip. (The
//! kernel keeps names for the TTL: a name it asks again about is answered from the trusted
//! nodes here, without a round trip.) Each event drops exactly
//! what it touches: the node's attributes and pages, its parent's listing, the kernel's entry
//! for a name made, removed or renamed. Whether a node changed is asked of the sandbox, in one
//! batched stat per burst of events ([`Remote::stat_many`]), and only a changed version is
//! dropped, so the events of the mount's own writes throw nothing away. The agent marks the
//! commits, and the names made, removed and renamed, that a mount asked for itself (its
//! client id, [`crate::remote::wire::CLIENT_HEADER`], on the request and the watch): those
//! are not checked at all.
//!
//! When the feed drops, cannot be reached, or says events were lost, trust ends at once (the
//! configured TTL applies again, and the kernel forgets what it was told to keep long); once
//! it is back, every cached path is revalidated in batched stats before trust returns. A
//! remote without a feed keeps the TTL.
//!
//! inotify, which the feed is made of, does not see every change: a write through a shared
//! `mmap`, or through a hard link from outside the workspace, raises no event, and a watcher's
//! paths can go stale under quick directory renames. So while the feed vouches for the caches,
//! every file and directory the mount knows is also re-checked in batched stats, a share of
//! them at a time, all of them once per `-o recheck_s` ([`Recheck`]). Each change of state is one log line and shows in
//! `sbxfs ctl status` ([`FeedState::snapshot`]).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::{FutureExt, StreamExt};
use serde_json::json;

use super::core::FsCore;
use super::core::{Applied, Change};
use super::echo::Job;
use super::health::Health;
use super::inode::NodeId;
use crate::remote::{stat_many_batches, ChangeEvent, ChangeKind, RemoteError, RemotePath};

/// How long what is cached is trusted while the feed vouches for it: "indefinitely", but an
/// `Instant` arithmetic that never overflows (and is shorter than [`super::core::stale_instant`]'s age).
pub const TRUSTED_TTL: Duration = Duration::from_secs(30 * 86_400);
/// How long the kernel keeps a name while the feed vouches for it ([`FsCore::entry_ttl`]):
/// the longest a name changed in the sandbox can outlive a feed that dropped.
pub const TRUSTED_ENTRY_TTL: Duration = Duration::from_secs(60);
/// First wait before reconnecting; doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Events taken in one go before they are applied (one batched stat for all of them).
const MAX_BATCH: usize = 4096;
/// How often a connected feed looks whether the sandbox still answers the health probe: a
/// link that went silent leaves the stream open but says nothing.
const HEALTH_TICK: Duration = Duration::from_secs(1);
/// Default `-o recheck_s`: how long a change inotify does not report may stay unseen, for a
/// mount that knows up to [`RECHECK_ROUNDS`] × [`RECHECK_MOST`] files (beyond, longer).
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(60);
/// A re-check period is this many rounds, each asking about a share of the known files.
const RECHECK_ROUNDS: u32 = 6;
/// Most paths one round asks about (one to a few batched stats).
const RECHECK_MOST: usize = 4096;

/// Where the feed stands, for `ctl status` and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    Starting,
    Connected,
    Reconnecting {
        error: String,
    },
    /// The remote has no feed: the TTL applies for good.
    Unsupported,
}

struct Revalidation {
    at: SystemTime,
    reason: String,
    checked: usize,
    changed: usize,
}

struct Status {
    link: Link,
    since: SystemTime,
    last_seq: Option<u64>,
    /// The last event whose burst is applied (caches changed, nodes checked).
    applied_seq: Option<u64>,
    events: u64,
    /// Of which the mount's own changes (commits, names), reported back (nothing to check).
    own_events: u64,
    lost_events: u64,
    revalidations: u64,
    last_revalidation: Option<Revalidation>,
    /// `-o recheck_s` (zero: off), and what its rounds asked and found changed.
    recheck_every: Duration,
    rechecked: u64,
    recheck_changed: u64,
}

/// Whether the feed vouches for the caches, and what status says about it.
pub struct FeedState {
    trusted: AtomicBool,
    status: Mutex<Status>,
}

impl Default for FeedState {
    fn default() -> Self {
        FeedState {
            trusted: AtomicBool::new(false),
            status: Mutex::new(Status {
                link: Link::Starting,
                since: SystemTime::now(),
                last_seq: None,
                applied_seq: None,
                events: 0,
                own_events: 0,
                lost_events: 0,
                revalidations: 0,
                last_revalidation: None,
                recheck_every: Duration::ZERO,
                rechecked: 0,
                recheck_changed: 0,
            }),
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms_ago(t: SystemTime) -> u64 {
    t.elapsed().map_or(0, |d| d.as_millis() as u64)
}

impl FeedState {
    /// The feed is connected and caught up: cached state is trusted indefinitely.
    pub fn trusted(&self) -> bool {
        self.trusted.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().expect("feed status lock")
    }

    /// A new state: logged once, here.
    fn set_link(&self, link: Link) {
        let mut s = self.lock();
        if s.link == link {
            return;
        }
        match &link {
            Link::Connected => tracing::info!(
                "change feed connected: attributes, listings and pages are trusted until it drops"
            ),
            Link::Reconnecting { error } => tracing::warn!(
                "change feed unavailable ({error}): attributes and listings are trusted for the \
                 TTL only, until it is back"
            ),
            Link::Unsupported => tracing::info!(
                "the sandbox has no change feed: attributes and listings are trusted for the TTL"
            ),
            Link::Starting => {}
        }
        // A reconnecting state keeps the time it started, whatever the next error says.
        let keeps_time = matches!(
            (&s.link, &link),
            (Link::Reconnecting { .. }, Link::Reconnecting { .. })
        );
        if !keeps_time {
            s.since = SystemTime::now();
        }
        s.link = link;
    }

    /// The last event applied with its burst, while the feed vouches for the caches: what
    /// the mount shows accounts for every change the sandbox numbered up to it.
    pub fn caught_up_to(&self) -> Option<u64> {
        if !self.trusted() {
            return None;
        }
        self.lock().applied_seq
    }

    /// What `sbxfs ctl status` shows under `feed`.
    pub fn snapshot(&self) -> serde_json::Value {
        let s = self.lock();
        let (state, error) = match &s.link {
            Link::Starting => ("starting", None),
            Link::Connected => ("connected", None),
            Link::Reconnecting { error } => ("reconnecting", Some(error.clone())),
            Link::Unsupported => ("unsupported", None),
        };
        json!({
            "state": state,
            "trusted": self.trusted(),
            "since_unix_ms": unix_ms(s.since),
            "since_ms_ago": ms_ago(s.since),
            "error": error,
            "last_seq": s.last_seq,
            "applied_seq": s.applied_seq,
            "events": s.events,
            "own_events": s.own_events,
            "lost_events": s.lost_events,
            "revalidations": s.revalidations,
            "last_revalidation": s.last_revalidation.as_ref().map(|r| json!({
                "reason": r.reason,
                "at_unix_ms": unix_ms(r.at),
                "ms_ago": ms_ago(r.at),
                "checked": r.checked,
                "changed": r.changed,
            })),
            "recheck": json!({
                "every_s": s.recheck_every.as_secs_f64(),
                "checked": s.rechecked,
                "changed": s.recheck_changed,
            }),
        })
    }
}

/// Why a connected feed stopped being followed.
enum Break {
    /// The stream broke or ended, or the sandbox stopped answering.
    Link(String),
    /// A batched stat did not get through.
    Revalidation(RemoteError),
}

/// Follow the feed until the runtime stops: connect, revalidate, trust, apply events; on any
/// break, distrust at once and reconnect with backoff, resuming after the last event seen.
/// A transport without a change feed (its capabilities say so): not followed; what is cached
/// is trusted for the TTL only, and revalidated by polling.
pub fn without_feed(core: &FsCore) {
    core.feed().set_link(Link::Unsupported);
}

/// `recheck`: how often every known file is re-checked while the feed is connected
/// ([`Recheck`]; zero: never).
pub async fn follow(core: Arc<FsCore>, health: Option<Arc<Health>>, recheck: Duration) {
    core.feed().lock().recheck_every = recheck;
    let mut recheck = Recheck::every(recheck);
    let mut since: Option<u64> = None;
    let mut connected_before = false;
    let mut backoff = MIN_BACKOFF;
    loop {
        let stream = match core.remote().watch(since).await {
            Ok(s) => s,
            Err(RemoteError::Unsupported(_)) => {
                core.feed().set_link(Link::Unsupported);
                return;
            }
            Err(e) => {
                core.feed().set_link(Link::Reconnecting {
                    error: e.to_string(),
                });
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        // Subscribed: whatever changes from here on is in the stream. What changed before
        // (while no feed vouched for the caches) is found by revalidating everything cached.
        let reason = if connected_before {
            "feed reconnected"
        } else {
            "feed connected"
        };
        connected_before = true;
        let dropped = match revalidate_all(&core, reason).await {
            Ok(()) => {
                core.feed().trusted.store(true, Ordering::SeqCst);
                core.feed().set_link(Link::Connected);
                let connected = Instant::now();
                let broke = run(&core, stream, health.as_deref(), &mut since, &mut recheck).await;
                // A feed that breaks as soon as it connects does not reconnect at once again.
                if connected.elapsed() > MAX_BACKOFF * 2 {
                    backoff = MIN_BACKOFF;
                }
                broke
            }
            Err(e) => Break::Revalidation(e),
        };
        distrust(&core);
        let error = match dropped {
            Break::Link(e) => e,
            Break::Revalidation(e) => format!("revalidation failed: {e}"),
        };
        core.feed().set_link(Link::Reconnecting { error });
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Apply events as they come, in bursts, until the feed breaks.
async fn run(
    core: &FsCore,
    mut stream: futures_util::stream::BoxStream<'static, crate::remote::Result<ChangeEvent>>,
    health: Option<&Health>,
    since: &mut Option<u64>,
    recheck: &mut Recheck,
) -> Break {
    let mut tick = tokio::time::interval(HEALTH_TICK);
    let mut recheck_tick = recheck.interval();
    // Only a failure seen after a success counts: the probe may not have noticed yet that the
    // sandbox is back when the feed already is.
    let mut answered = false;
    loop {
        let first = tokio::select! {
            next = stream.next() => next,
            _ = tick.tick() => {
                match health.map(Health::reachable) {
                    Some(true) => answered = true,
                    Some(false) if answered => {
                        return Break::Link("the sandbox does not answer".into());
                    }
                    _ => {}
                }
                continue;
            }
            _ = async {
                match recheck_tick.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            } => {
                recheck.round(core).await;
                continue;
            }
        };
        let mut batch = Vec::new();
        let mut ended = None;
        match first {
            Some(Ok(ev)) => batch.push(ev),
            Some(Err(e)) => return Break::Link(e.to_string()),
            None => return Break::Link("the feed ended".into()),
        }
        // Whatever else is already here joins this burst.
        while batch.len() < MAX_BATCH {
            match stream.next().now_or_never() {
                Some(Some(Ok(ev))) => batch.push(ev),
                Some(Some(Err(e))) => {
                    ended = Some(e.to_string());
                    break;
                }
                Some(None) => {
                    ended = Some("the feed ended".into());
                    break;
                }
                None => break,
            }
        }
        // The last in arrival order, not the largest: a restarted agent numbers afresh, and
        // says so with a `lost` event carrying its own last number.
        if let Some(last) = batch.last() {
            *since = Some(last.seq);
        }
        if let Err(e) = apply(core, batch).await {
            return Break::Revalidation(e);
        }
        if let Some(e) = ended {
            return Break::Link(e);
        }
    }
}

/// Trust ends: the TTL applies again here at once, and the kernel forgets the attributes it
/// was told to keep long.
fn distrust(core: &FsCore) {
    core.feed().trusted.store(false, Ordering::SeqCst);
    core.apply(Change::Distrusted);
}

/// One burst of events: namespace changes drop their parent's listing and attributes at
/// once; every path the mount has a node for is checked in batched stats.
async fn apply(core: &FsCore, batch: Vec<ChangeEvent>) -> crate::remote::Result<()> {
    let mut lost = false;
    let mut check: BTreeSet<(NodeId, RemotePath)> = BTreeSet::new();
    let last = batch.last().map(|e| e.seq);
    {
        let mut s = core.feed().lock();
        s.events += batch.len() as u64;
        s.last_seq = batch.iter().map(|e| e.seq).max().or(s.last_seq);
    }
    let applied = || core.feed().lock().applied_seq = last;
    // What the sandbox did, for watchers and inotify ([`super::echo`]): published once the
    // caches know it.
    let mut echoes = Vec::new();
    // What each Modified echo's file held before its check, in order.
    let mut contents = Vec::new();
    for ev in batch {
        let Ok(path) = RemotePath::new(ev.path.0.clone()) else {
            tracing::debug!(path = ?ev.path, "change event with an unusable path ignored");
            continue;
        };
        tracing::trace!(?ev.kind, path = ?ev.path, own = ev.own, "feed event");
        match ev.kind {
            ChangeKind::Lost => lost = true,
            // This mount's own commit: its answer already told the mount what it made, in
            // whichever order the two arrive. Checking it would cost a stat, and an answer
            // and an event crossing must never make the mount's own save look foreign.
            //
            // So are the names it made, removed or renamed: its own answer already changed
            // the listing in place, and dropping it now could lose a name staged since.
            _ if ev.own => core.feed().lock().own_events += 1,
            ChangeKind::Modified => {
                let content = core.content_at(&path);
                touched(core, &path, false, &mut check);
                echoes.push(Job::Modified(path));
                contents.push(content);
            }
            ChangeKind::Created => {
                touched(core, &path, true, &mut check);
                echoes.push(Job::Created(path));
            }
            ChangeKind::Removed => {
                let node = core.hold_node_at(&path);
                touched(core, &path, true, &mut check);
                echoes.push(Job::Removed(path, node));
            }
            ChangeKind::Renamed { to } => {
                let node = core.hold_node_at(&path);
                touched(core, &path, true, &mut check);
                match RemotePath::new(to.0) {
                    Ok(to) => {
                        touched(core, &to, true, &mut check);
                        echoes.push(Job::Renamed(path, to, node));
                    }
                    Err(_) => lost = true,
                }
            }
        }
    }
    if lost {
        core.feed().lock().lost_events += 1;
        tracing::warn!("the change feed lost events: revalidating everything cached");
        distrust(core);
        revalidate_all(core, "lost events").await?;
        applied();
        core.feed().trusted.store(true, Ordering::SeqCst);
        return Ok(());
    }
    let checked: Vec<(NodeId, RemotePath)> = check.into_iter().collect();
    let changed = check_nodes(core, checked.clone(), true).await?;
    applied();
    // A create or change of a name the mount had, whose check found it as the mount knew it,
    // is the mount's own (the second half of its commit's rename, an atime): no echo.
    let as_known = |p: &RemotePath| checked.iter().any(|(n, q)| q == p && !changed.contains(n));
    // A change the check saw move the change time of the same file, its data as it was,
    // changed attributes only: an attribute event.
    let mut contents = contents.into_iter();
    for j in echoes.iter_mut() {
        if let Job::Modified(p) = j {
            let before = contents.next().flatten();
            let attrs_only = match (before, core.content_at(p)) {
                (Some((ino, v, size, ct)), Some((ino2, v2, size2, ct2))) => {
                    (ino, v, size) == (ino2, v2, size2) && ct != ct2
                }
                _ => false,
            };
            if attrs_only {
                *j = Job::Touched(p.clone());
            }
        }
    }
    echoes.retain(|j| match j {
        Job::Created(p) | Job::Modified(p) | Job::Touched(p) => !as_known(p),
        _ => true,
    });
    let (echoes, unheld) = without_halves_of_moves(echoes);
    for node in unheld {
        core.forget(node, 1);
    }
    for job in echoes {
        core.echoes().sandbox_changed(job);
    }
    Ok(())
}

/// A move is reported as its two halves too (a removal of the old name, a create of the new)
/// where the agent's watcher sees it so: the rename says it all.
fn without_halves_of_moves(jobs: Vec<Job>) -> (Vec<Job>, Vec<NodeId>) {
    let moves: Vec<(RemotePath, RemotePath)> = jobs
        .iter()
        .filter_map(|j| match j {
            Job::Renamed(from, to, _) => Some((from.clone(), to.clone())),
            _ => None,
        })
        .collect();
    let half = |j: &Job| match j {
        Job::Removed(p, _) => moves.iter().any(|(from, _)| from == p),
        Job::Created(p) => moves.iter().any(|(_, to)| to == p),
        _ => false,
    };
    let (halves, kept): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(half);
    // A dropped removal gives back the node it held for its echo.
    let unheld = halves
        .into_iter()
        .filter_map(|j| match j {
            Job::Removed(_, node) => node,
            _ => None,
        })
        .collect();
    (kept, unheld)
}

/// An event about `path`: the caches it touches are made stale ([`Change::Reported`]); a node
/// the mount has for it is checked.
fn touched(
    core: &FsCore,
    path: &RemotePath,
    namespace: bool,
    check: &mut BTreeSet<(NodeId, RemotePath)>,
) {
    if let Applied::Check(node) = core.apply(Change::Reported { path, namespace }) {
        check.insert((node, path.clone()));
    }
    // A name made, removed or moved changes its directory's own attributes (times, link
    // count), which the directory's parent's listing holds too: asked in the same batch.
    if namespace {
        if let Some((dir, _)) = path.split_last() {
            if let Some(node) = core.node_at(&dir) {
                check.insert((node, dir));
            }
        }
    }
}

/// Everything cached may be stale: no listing is trusted (each is kept for a sandbox that
/// stops answering meanwhile), every named node is checked.
async fn revalidate_all(core: &FsCore, reason: &str) -> crate::remote::Result<()> {
    core.apply(Change::AllStale);
    let nodes = core.known_paths();
    let checked = nodes.len();
    let changed = check_nodes(core, nodes, false).await?.len();
    tracing::info!(
        checked,
        changed,
        "revalidated what the mount had cached ({reason})"
    );
    let mut s = core.feed().lock();
    s.revalidations += 1;
    s.last_revalidation = Some(Revalidation {
        at: SystemTime::now(),
        reason: reason.to_string(),
        checked,
        changed,
    });
    Ok(())
}

/// Ask the sandbox for the nodes' attributes in batched stats and drop what changed (here
/// and in the kernel); what did not change is trusted afresh (`children_reported`: see
/// [`Change::Answered`]). Answers which changed.
async fn check_nodes(
    core: &FsCore,
    nodes: Vec<(NodeId, RemotePath)>,
    children_reported: bool,
) -> crate::remote::Result<BTreeSet<NodeId>> {
    // Files with staged writes answer from their staged image: their own push (and its
    // conflict check) deals with the sandbox's version, or its end asks again.
    let nodes: Vec<(NodeId, RemotePath)> = nodes
        .into_iter()
        .filter(|(n, _)| !core.left_to_staging(*n))
        .collect();
    let paths: Vec<RemotePath> = nodes.iter().map(|(_, p)| p.clone()).collect();
    let mut changed = BTreeSet::new();
    let mut at = 0;
    let mut unanswered = None;
    for batch in stat_many_batches(&paths) {
        let before = core.epoch();
        let answers = core.note(core.remote().stat_many(batch).await)?;
        // A local change raced these answers: what differs is dropped, not recorded.
        let raced = core.epoch() != before;
        for answer in answers {
            let (node, path) = &nodes[at];
            at += 1;
            match answer {
                // No answer for this path: nothing learnt, so the node stays as it was
                // (untrusted past its TTL, served while the sandbox does not answer) and the
                // revalidation fails.
                Err(e) if super::core::unreachable(&e) => {
                    unanswered.get_or_insert(e);
                    continue;
                }
                answer => {
                    let answered = Change::Answered {
                        node: *node,
                        path,
                        answer,
                        raced,
                        asked: before,
                        children_reported,
                    };
                    if core.apply(answered) == Applied::Changed {
                        changed.insert(*node);
                    }
                }
            }
        }
    }
    match unanswered {
        Some(e) => Err(e),
        None => Ok(changed),
    }
}

/// The re-check of what inotify does not report: in rounds, each asking the sandbox about the
/// next share of the files and links the mount knows (in path order, wrapping around), so
/// that all of them are asked about once per period. What changed is dropped as an event's
/// check would drop it, and echoed to the laptop's watchers.
struct Recheck {
    every: Duration,
    /// The last path the previous round asked about.
    after: Option<RemotePath>,
    /// Nodes whose last check found them changed: one found so again (a name gone that the
    /// kernel still holds, asked about every period) is not logged again.
    changed_before: BTreeSet<NodeId>,
}

impl Recheck {
    fn every(every: Duration) -> Recheck {
        Recheck {
            every,
            after: None,
            changed_before: BTreeSet::new(),
        }
    }

    /// The rounds' clock: none when re-checking is off. The first round comes one round's
    /// time after the feed connects (its revalidation just asked about everything).
    fn interval(&self) -> Option<tokio::time::Interval> {
        if self.every.is_zero() {
            return None;
        }
        let round = (self.every / RECHECK_ROUNDS).max(Duration::from_millis(100));
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + round, round);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(t)
    }

    /// The next share of `known` (sorted by path) after the last one asked about.
    fn next_share(&mut self, known: Vec<(NodeId, RemotePath)>) -> Vec<(NodeId, RemotePath)> {
        let share = known
            .len()
            .div_ceil(RECHECK_ROUNDS as usize)
            .clamp(1, RECHECK_MOST);
        let mut start = match &self.after {
            Some(after) => known.partition_point(|(_, p)| p <= after),
            None => 0,
        };
        if start >= known.len() {
            start = 0;
        }
        let taken: Vec<(NodeId, RemotePath)> = known.into_iter().skip(start).take(share).collect();
        self.after = taken.last().map(|(_, p)| p.clone());
        taken
    }

    async fn round(&mut self, core: &FsCore) {
        let share = self.next_share(core.known_paths_in_order());
        if share.is_empty() {
            return;
        }
        let checked = share.len() as u64;
        // What each file held before: a change of its attributes only (the change time a
        // rename of the mount's own commit moves, a directory's times its own creates moved)
        // is not a change the feed missed, nor one for watchers.
        let before: Vec<_> = share.iter().map(|(_, p)| core.content_at(p)).collect();
        let changed = match check_nodes(core, share.clone(), false).await {
            Ok(changed) => changed,
            // The health probe and the feed itself say when the sandbox is gone; a round
            // that did not get through is asked again next period.
            Err(e) => {
                tracing::debug!("a re-check round was not answered: {e}");
                return;
            }
        };
        let mut found = Vec::new();
        let mut new = 0;
        for ((node, path), before) in share.into_iter().zip(before) {
            let content_changed = || {
                !core.is_directory_at(&path)
                    && match (before, core.content_at(&path)) {
                        (Some((ino, v, size, _)), Some((ino2, v2, size2, _))) => {
                            (ino, v, size) != (ino2, v2, size2)
                        }
                        _ => true,
                    }
            };
            if !changed.contains(&node) || !content_changed() {
                self.changed_before.remove(&node);
                continue;
            }
            if self.changed_before.insert(node) {
                new += 1;
            }
            found.push(path);
        }
        {
            let mut s = core.feed().lock();
            s.rechecked += checked;
            s.recheck_changed += found.len() as u64;
        }
        let Some(first) = found.first() else {
            return;
        };
        if new > 0 {
            tracing::info!(
                changed = found.len(),
                first = %first.display(),
                "the re-check found changes in the sandbox that its change feed did not report"
            );
        } else {
            tracing::debug!(changed = found.len(), first = %first.display(), "re-check: changed again");
        }
        for path in found {
            core.echoes().sandbox_changed(Job::Modified(path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(names: &[&str]) -> Vec<(NodeId, RemotePath)> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    NodeId(i as u64 + 2),
                    RemotePath::new(n.as_bytes().to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn names(share: &[(NodeId, RemotePath)]) -> Vec<String> {
        share
            .iter()
            .map(|(_, p)| String::from_utf8_lossy(p.as_bytes()).into_owned())
            .collect()
    }

    #[test]
    fn rounds_take_a_share_each_and_wrap_around() {
        let mut r = Recheck::every(Duration::from_secs(60));
        let all: Vec<String> = (0..13).map(|i| format!("f{i:02}")).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut seen = Vec::new();
        // 13 files in 6 rounds: 3 a round, all of them within one period.
        for want in [3, 3, 3, 3, 1] {
            let share = names(&r.next_share(known(&all)));
            assert_eq!(share.len(), want);
            seen.extend(share);
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 13, "every file asked about once a period");
        // Then from the start again.
        assert_eq!(names(&r.next_share(known(&all)))[0], "f00");
    }

    #[test]
    fn a_path_gone_since_the_last_round_does_not_lose_the_place() {
        let mut r = Recheck::every(Duration::from_secs(60));
        assert_eq!(names(&r.next_share(known(&["a", "b"]))), ["a"]);
        // "a" went, "aa" came: the round goes on after "a".
        assert_eq!(names(&r.next_share(known(&["aa", "b", "c"]))), ["aa"]);
        assert_eq!(names(&r.next_share(known(&["aa", "b", "c"]))), ["b"]);
        assert!(r.next_share(Vec::new()).is_empty());
    }

    #[test]
    fn off_has_no_clock() {
        assert!(Recheck::every(Duration::ZERO).interval().is_none());
    }
}
