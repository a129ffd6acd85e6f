//! The change feed: inotify events (through `notify`) under the workspace, numbered and kept in
//! a ring so a client that reconnects with the last number it saw gets what it missed, or a
//! `lost` event when the ring no longer reaches back that far (it must then revalidate).
//!
//! sbxfs's own temp files are invisible: a commit's rename of a temp over a file is reported
//! as that file modified.
//!
//! Only real directories beneath the root are watched: symlinks are never followed when
//! watches are added (a link to `/root` adds no watch outside), and an event is reported only
//! if its directory still resolves beneath the root with no symlink on the way (so a watch a
//! race slipped through a swapped symlink reports nothing from outside).

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use tokio::sync::broadcast;

use super::workspace::is_temp_name;
use crate::remote::{ChangeEvent, ChangeKind, WireBytes};

/// Events kept for reconnecting clients: minutes of ordinary editing, a burst of a big
/// `git checkout` may overflow it (then clients get `lost` and revalidate).
pub const RING_EVENTS: usize = 8192;

/// Named temps the agent's commits are made through, and the client each commit was for
/// ([`crate::remote::wire::CLIENT_HEADER`]): the feed takes the author when it sees the temp
/// renamed over its target, and reports the change as that client's own. Only names recorded
/// here count: a sandbox program that names a file like a temp and renames it is nobody's.
///
/// Names a client makes, removes or renames are recorded the same way, before the call, and
/// withdrawn if it fails: the event inotify then gives for that name (of that kind) is the
/// client's own. Each record is taken by one event at most.
#[derive(Default)]
pub struct Authors {
    names: Mutex<VecDeque<(Vec<u8>, u64)>>,
    made: Mutex<VecDeque<(Made, u64)>>,
}

/// A namespace change a client asked for, as the event for it will show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Made {
    Created(Vec<u8>),
    Removed(Vec<u8>),
    Renamed { from: Vec<u8>, to: Vec<u8> },
}

/// Temps remembered at most: more than commits in flight at once; a rename whose event was
/// lost leaves its entry, and the oldest go first.
const MAX_AUTHORS: usize = 1024;

impl Authors {
    /// The commit through temp `name` is `client`'s.
    pub fn record(&self, name: &[u8], client: u64) {
        let mut names = self.names.lock().expect("authors lock");
        if names.len() == MAX_AUTHORS {
            names.pop_front();
        }
        names.push_back((name.to_vec(), client));
    }

    /// Whose commit went through temp `name` (forgotten once asked).
    pub fn take(&self, name: &[u8]) -> Option<u64> {
        let mut names = self.names.lock().expect("authors lock");
        let at = names.iter().position(|(n, _)| n == name)?;
        names.remove(at).map(|(_, client)| client)
    }

    /// `client` is about to make `change` (withdrawn with [`Self::take_made`] if it fails).
    pub fn record_made(&self, change: Made, client: u64) {
        let mut made = self.made.lock().expect("authors lock");
        if made.len() == MAX_AUTHORS {
            made.pop_front();
        }
        made.push_back((change, client));
    }

    /// Whose rename moves `from` (or, with `from` None, moves something to `to`): for the
    /// halves inotify reports of a rename before the whole (kept for the whole to take).
    pub fn renaming(&self, from: Option<&[u8]>, to: Option<&[u8]>) -> Option<u64> {
        let made = self.made.lock().expect("authors lock");
        made.iter().find_map(|(m, client)| match m {
            Made::Renamed { from: f, to: t }
                if from.is_none_or(|x| x == f.as_slice())
                    && to.is_none_or(|x| x == t.as_slice()) =>
            {
                Some(*client)
            }
            _ => None,
        })
    }

    /// Whose change `change` was (forgotten once asked).
    pub fn take_made(&self, change: &Made) -> Option<u64> {
        let mut made = self.made.lock().expect("authors lock");
        let at = made.iter().position(|(m, _)| m == change)?;
        made.remove(at).map(|(_, client)| client)
    }
}

pub struct ChangeFeed {
    inner: Arc<Mutex<Ring>>,
    tx: broadcast::Sender<ChangeEvent>,
    _watcher: Option<notify::RecommendedWatcher>,
}

struct Ring {
    next_seq: u64,
    events: VecDeque<ChangeEvent>,
}

impl ChangeFeed {
    pub fn start(root: &Path, authors: Arc<Authors>) -> notify::Result<Self> {
        let (tx, _) = broadcast::channel(RING_EVENTS);
        let inner = Arc::new(Mutex::new(Ring {
            next_seq: 1,
            events: VecDeque::with_capacity(RING_EVENTS),
        }));
        let (ring, sender, root_owned) = (inner.clone(), tx.clone(), root.to_path_buf());
        let root_fd = rfs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| notify::Error::io(e.into()))?;
        // The cookie of the last rename's first half: its second half comes with the whole
        // rename right after it, which says it all.
        let mut last_from: Option<usize> = None;
        let to_scan = start_scanner(root.to_path_buf(), inner.clone(), tx.clone());
        let handler = move |res: notify::Result<notify::Event>| match res {
            Ok(ev) => {
                match ev.kind {
                    EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                        last_from = ev.attrs.tracker()
                    }
                    EventKind::Modify(ModifyKind::Name(RenameMode::To))
                        if ev.attrs.tracker().is_some() && ev.attrs.tracker() == last_from =>
                    {
                        return;
                    }
                    _ => {}
                }
                for change in translate(&root_owned, ev, &authors) {
                    let to_inside = match &change.kind {
                        ChangeKind::Renamed { to } => beneath(&root_fd, &to.0),
                        _ => true,
                    };
                    let inside =
                        change.kind == ChangeKind::Lost || beneath(&root_fd, &change.path.0);
                    if !(inside && to_inside) {
                        continue;
                    }
                    // A directory made by someone else: what was made in it before its watch
                    // was in place raises nothing, so it is reported from a listing.
                    let made_dir = change.kind == ChangeKind::Created
                        && change.author.is_none()
                        && std::fs::symlink_metadata(
                            root_owned.join(OsStr::from_bytes(&change.path.0)),
                        )
                        .is_ok_and(|m| m.is_dir());
                    let path = change.path.0.clone();
                    publish(&ring, &sender, change);
                    if made_dir {
                        let _ = to_scan.send((std::time::Instant::now(), path));
                    }
                }
            }
            Err(_) => publish(&ring, &sender, ChangeEvent::lost(0)),
        };
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(handler, config)?;
        watcher.watch(root, RecursiveMode::Recursive)?;
        Ok(ChangeFeed {
            inner,
            tx,
            _watcher: Some(watcher),
        })
    }

    /// The retained events after `since` (none for a client starting fresh), preceded by a
    /// `lost` event if the ring no longer reaches back to it; plus a receiver for what follows,
    /// and the number after which events are new to this client. A `since` past the last event
    /// is another agent's (this one restarted): `lost`, then everything from now on.
    pub fn subscribe(
        &self,
        since: Option<u64>,
    ) -> (Vec<ChangeEvent>, broadcast::Receiver<ChangeEvent>, u64) {
        let ring = self.inner.lock().expect("change ring lock");
        let rx = self.tx.subscribe();
        let mut backlog = Vec::new();
        let last = ring.next_seq - 1;
        if since.is_some_and(|s| s > last) {
            backlog.push(ChangeEvent::lost(last));
            return (backlog, rx, last);
        }
        if let Some(since) = since {
            let oldest = ring.events.front().map_or(ring.next_seq, |e| e.seq);
            if since + 1 < oldest {
                backlog.push(ChangeEvent::lost(since));
            }
            backlog.extend(ring.events.iter().filter(|e| e.seq > since).cloned());
        }
        (backlog, rx, since.unwrap_or(0))
    }

    pub fn last_seq(&self) -> u64 {
        self.inner.lock().expect("change ring lock").next_seq - 1
    }
}

/// Most names a new directory's listing reports (a bigger tree made at once overflows the
/// ring anyway, and the clients revalidate).
const MAX_FOUND: usize = 4096;

/// What a directory just made holds (every level, breadth first, at most [`MAX_FOUND`]
/// names; symlinks are not followed), as workspace paths.
fn made_before_its_watch(root: &Path, dir: &[u8]) -> Vec<Vec<u8>> {
    let mut found = Vec::new();
    let mut dirs = std::collections::VecDeque::from([dir.to_vec()]);
    while let Some(d) = dirs.pop_front() {
        let Ok(entries) = std::fs::read_dir(root.join(OsStr::from_bytes(&d))) else {
            continue;
        };
        for e in entries.flatten() {
            if found.len() == MAX_FOUND {
                return found;
            }
            let name = e.file_name();
            if is_temp_name(name.as_bytes()) {
                continue;
            }
            let mut p = d.clone();
            p.push(b'/');
            p.extend_from_slice(name.as_bytes());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push_back(p.clone());
            }
            found.push(p);
        }
    }
    found
}

/// How long after a directory is made its listing is taken: by then the watcher has usually
/// put its watch on it (it does so after passing the directory's own event on).
const SCAN_AFTER: std::time::Duration = std::time::Duration::from_millis(100);
/// And once more this long after: on a busy machine the watcher may add its watch after the
/// first listing, and what was made between the two would be reported by neither.
const SCAN_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A thread that lists each directory made in the sandbox [`SCAN_AFTER`] it was reported,
/// and reports what it holds as created (a name reported twice is checked twice: harmless).
fn start_scanner(
    root: PathBuf,
    ring: Arc<Mutex<Ring>>,
    sender: broadcast::Sender<ChangeEvent>,
) -> std::sync::mpsc::Sender<(std::time::Instant, Vec<u8>)> {
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let spawned = std::thread::Builder::new()
        .name("sbxfs-feed-scan".into())
        .spawn(move || {
            use std::sync::mpsc::RecvTimeoutError;
            use std::time::Instant;
            // Directories listed once, waiting for their second listing (in order made).
            let mut again: std::collections::VecDeque<(Instant, Vec<u8>)> = Default::default();
            loop {
                let due = again.front().map(|(at, _)| *at + SCAN_AGAIN_AFTER);
                let (at, dir, after, first) = match due {
                    Some(due) if due <= Instant::now() => {
                        let (at, dir) = again.pop_front().expect("checked");
                        (at, dir, SCAN_AGAIN_AFTER, false)
                    }
                    Some(due) => match rx.recv_timeout(due - Instant::now()) {
                        Ok((at, dir)) => (at, dir, SCAN_AFTER, true),
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => {
                            std::thread::sleep(due.saturating_duration_since(Instant::now()));
                            continue;
                        }
                    },
                    None => match rx.recv() {
                        Ok((at, dir)) => (at, dir, SCAN_AFTER, true),
                        Err(_) => break,
                    },
                };
                if let Some(wait) = (at + after).checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if first {
                    again.push_back((at, dir.clone()));
                }
                // The second listing reports only what nothing reported yet.
                let reported = if first {
                    Default::default()
                } else {
                    reported_beneath(&ring, &dir)
                };
                for found in made_before_its_watch(&root, &dir) {
                    if reported.contains(&found) {
                        continue;
                    }
                    publish(
                        &ring,
                        &sender,
                        ChangeEvent::new(0, found, ChangeKind::Created),
                    );
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no scanner for new directories: {e}");
    }
    tx
}

/// The paths beneath `dir` that events still in the ring name.
fn reported_beneath(ring: &Mutex<Ring>, dir: &[u8]) -> std::collections::HashSet<Vec<u8>> {
    let r = ring.lock().expect("change ring lock");
    let below = |p: &[u8]| p.len() > dir.len() && p.starts_with(dir) && p[dir.len()] == b'/';
    let mut found = std::collections::HashSet::new();
    for e in &r.events {
        if below(&e.path.0) {
            found.insert(e.path.0.clone());
        }
        if let ChangeKind::Renamed { to } = &e.kind {
            if below(&to.0) {
                found.insert(to.0.clone());
            }
        }
    }
    found
}

/// Number `change` (its `seq` is replaced) and send it.
fn publish(ring: &Mutex<Ring>, tx: &broadcast::Sender<ChangeEvent>, mut change: ChangeEvent) {
    let mut r = ring.lock().expect("change ring lock");
    change.seq = r.next_seq;
    r.next_seq += 1;
    if r.events.len() == RING_EVENTS {
        r.events.pop_front();
    }
    r.events.push_back(change.clone());
    // Publish under the lock so subscribers see events in sequence order.
    let _ = tx.send(change);
}

/// Does the directory holding `rel` resolve beneath the root through real directories only?
fn beneath(root: &impl std::os::fd::AsFd, rel: &[u8]) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let parent = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => &rel[..i],
        None => return true,
    };
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    // A path longer than one call takes is resolved a chunk of whole components at a time.
    let mut held: Option<std::os::fd::OwnedFd> = None;
    for chunk in crate::search::beneath::path_chunks(parent) {
        let from = match &held {
            Some(fd) => fd.as_fd(),
            None => root.as_fd(),
        };
        let name = std::ffi::OsStr::from_bytes(chunk);
        match rfs::openat2(from, name, flags, Mode::empty(), how) {
            Ok(fd) => held = Some(fd),
            Err(_) => return false,
        }
    }
    true
}

fn rel(root: &Path, p: &Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let r = p.strip_prefix(root).ok()?;
    Some(r.as_os_str().as_bytes().to_vec())
}

/// sbxfs's named temps, and the `#INODE` names inotify gives unnamed `O_TMPFILE` files.
fn is_temp(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    p.file_name().is_some_and(|n| {
        let n = n.as_bytes();
        is_temp_name(n) || (n.len() > 1 && n[0] == b'#' && n[1..].iter().all(u8::is_ascii_digit))
    })
}

/// The changes one inotify event reports (numbered later, by [`publish`]).
fn translate(root: &Path, ev: notify::Event, authors: &Authors) -> Vec<ChangeEvent> {
    let change = |kind: ChangeKind, path: Vec<u8>| ChangeEvent::new(0, path, kind);
    if ev.need_rescan() {
        return vec![ChangeEvent::lost(0)];
    }
    let paths: Vec<PathBuf> = ev.paths;
    let one = |kind: ChangeKind| -> Vec<ChangeEvent> {
        paths
            .iter()
            .filter(|p| !is_temp(p))
            .filter_map(|p| rel(root, p))
            .map(|r| {
                let made = match kind {
                    ChangeKind::Created => Some(Made::Created(r.clone())),
                    ChangeKind::Removed => Some(Made::Removed(r.clone())),
                    _ => None,
                };
                let mut ev = change(kind.clone(), r);
                ev.author = made.and_then(|m| authors.take_made(&m));
                ev
            })
            .collect()
    };
    match ev.kind {
        EventKind::Create(_) => one(ChangeKind::Created),
        EventKind::Remove(_) => one(ChangeKind::Removed),
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) if paths.len() == 2 => {
            let (from, to) = (&paths[0], &paths[1]);
            let Some(to_rel) = rel(root, to) else {
                return Vec::new();
            };
            if is_temp(from) {
                // A commit (or an editor's save) landed: the target's content changed.
                let mut landed = change(ChangeKind::Modified, to_rel);
                landed.author = from
                    .file_name()
                    .and_then(|n| authors.take(n.as_encoded_bytes()));
                return vec![landed];
            }
            match rel(root, from) {
                Some(from_rel) => {
                    let made = Made::Renamed {
                        from: from_rel.clone(),
                        to: to_rel.clone(),
                    };
                    let mut ev = change(
                        ChangeKind::Renamed {
                            to: WireBytes(to_rel),
                        },
                        from_rel,
                    );
                    ev.author = authors.take_made(&made);
                    vec![ev]
                }
                None => vec![change(ChangeKind::Created, to_rel)],
            }
        }
        // The halves of a rename a client asked for are its own, as the whole is.
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
            let mut evs = one(ChangeKind::Removed);
            for ev in evs.iter_mut().filter(|e| e.author.is_none()) {
                ev.author = authors.renaming(Some(&ev.path.0), None);
            }
            evs
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            let mut evs = one(ChangeKind::Created);
            for ev in evs.iter_mut().filter(|e| e.author.is_none()) {
                ev.author = authors.renaming(None, Some(&ev.path.0));
            }
            evs
        }
        EventKind::Modify(_) => one(ChangeKind::Modified),
        EventKind::Access(_) => Vec::new(),
        EventKind::Any | EventKind::Other => one(ChangeKind::Modified),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_since_from_another_agent_is_answered_with_lost_then_everything_new() {
        let dir = tempfile::tempdir().unwrap();
        let feed = ChangeFeed::start(dir.path(), Arc::default()).unwrap();
        // A client that followed an earlier agent (numbers far past this one's).
        let (backlog, _rx, start) = feed.subscribe(Some(1_000_000));
        assert_eq!(backlog.len(), 1);
        assert_eq!(backlog[0].kind, ChangeKind::Lost);
        assert_eq!(
            start,
            feed.last_seq(),
            "new events are those after this agent's last"
        );
        // A client of this agent resumes where it was, with nothing lost.
        let (backlog, _rx, start) = feed.subscribe(Some(feed.last_seq()));
        assert!(backlog.is_empty());
        assert_eq!(start, feed.last_seq());
    }
}
