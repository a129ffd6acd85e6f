//! The page cache's second tier: pages kept on the laptop's disk, one directory per sandbox,
//! so a remount (or a daemon started again after a crash) reads unchanged files without
//! fetching them. A page is filed under its version, as in memory: the mount's first look
//! fetches the tree's current versions, so a file changed while nothing was mounted names
//! another version and its old pages are never served; `forget` drops a version's pages here
//! as it does in memory (the feed saw the file rewritten under the same version, or `sbxfs ctl
//! invalidate`).
//!
//! Reads are synchronous (a page is 128 KiB of local file); writes, removals and eviction are
//! one writer thread's, fed by a bounded queue a reader never waits on (a page the queue has no
//! room for is simply not kept). Each page file holds its version and index and a CRC of its
//! bytes, checked on every read: a torn or foreign file is a miss, and removed. Directories
//! are 0700 and files 0600; one daemon at a time uses a directory (a lock), the others run
//! without the tier. The caches of other sandboxes beside it are bounded too: once the
//! writer starts, those not in use go, least recently mounted first, until together they
//! hold no more than this one may, and any not mounted for [`UNUSED_FOR`] goes whatever its
//! size (sandboxes come and go: their caches must not pile up).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::pages::{PageIndex, PAGE};
use crate::remote::Version;

/// What starts every page file.
const MAGIC: &[u8; 8] = b"sbxfspg1";
/// Most bytes before a page's data: magic, lengths, index, CRC and the version's text.
const MAX_HEADER: u64 = 64 * 1024;
/// A sandbox's cache not mounted for this long is removed by the next mount of any.
const UNUSED_FOR: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
/// Pages waiting for the writer before new ones are dropped (at most 32 MiB in flight).
const QUEUE: usize = 256;

/// A version as a file name: a stable 64-bit hash of it (its full text is in each page file).
fn version_dir(v: &Version) -> String {
    format!("{:016x}", super::state::fnv1a(v.0.as_bytes()))
}

/// A page file: its version's directory and its name ([`file_name`]).
type Key = (String, String);

/// A page's file name: the file's ctime when its bytes were read, and the page's index. The
/// ctime moves with every change of the file, even one that puts its size and mtime back (and
/// with a rename or `chmod`: a miss then, never a wrong page).
fn file_name(ctime_ns: i64, page: PageIndex) -> String {
    format!("{:x}-{}", ctime_ns as u64, page.0)
}

/// What readers and the writer share: the pages on disk (or about to be) that may be served,
/// and the versions whose forget the writer has yet to carry out (none of their pages is
/// served, even one the writer writes before it gets to the forget).
#[derive(Default)]
struct Shared {
    present: HashSet<Key>,
    forgetting: HashMap<String, u32>,
}

enum Job {
    Put(Version, i64, PageIndex, Bytes),
    /// Remove every page of the version.
    Forget(Version),
    /// A page served from disk: it is the most recently used now.
    Used(Key),
}

pub struct DiskPages {
    dir: PathBuf,
    /// `None` only while dropped.
    jobs: Option<SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Mutex<Shared>>,
    /// Held for the daemon's life: the directory is this daemon's.
    _lock: File,
}

impl DiskPages {
    /// Open (making it if needed) the cache in `dir`, bounded by `cap` bytes. `None`, logged,
    /// when another daemon uses it or it cannot be made private.
    pub fn open(dir: &Path, cap: u64) -> Option<DiskPages> {
        match Self::try_open(dir, cap) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(
                    "no disk cache in {}: {e}; pages are cached in memory only",
                    dir.display()
                );
                None
            }
        }
    }

    fn try_open(dir: &Path, cap: u64) -> io::Result<Option<DiskPages>> {
        super::state::ensure_private_dir(dir)?;
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join("lock"))?;
        if !lock_now(&lock) {
            tracing::info!(
                "the disk cache {} is in use by another mount of this sandbox; this one caches \
                 in memory only",
                dir.display()
            );
            return Ok(None);
        }
        // When this sandbox was last mounted, for the other sandboxes' mounts to see.
        let _ = lock.set_modified(std::time::SystemTime::now());
        let tmp = dir.join("tmp");
        let _ = fs::remove_dir_all(&tmp);
        fs::DirBuilder::new().mode(0o700).create(&tmp)?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (jobs, rx) = sync_channel(QUEUE);
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            cap: cap.max(PAGE),
            shared: shared.clone(),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            bytes: 0,
            tmp_seq: 0,
        };
        writer.load();
        let writer = std::thread::Builder::new()
            .name("sbxfs-disk-cache".into())
            .spawn(move || {
                writer.trim_others();
                writer.run(rx)
            })?;
        Ok(Some(DiskPages {
            dir: dir.to_path_buf(),
            jobs: Some(jobs),
            writer: Some(writer),
            shared,
            _lock: lock,
        }))
    }

    fn path(&self, v: &Version, ctime_ns: i64, page: PageIndex) -> PathBuf {
        self.dir
            .join(version_dir(v))
            .join(file_name(ctime_ns, page))
    }

    /// Whether the page is on disk (as far as the writer knows): read-ahead leaves it alone.
    pub fn has(&self, v: &Version, ctime_ns: i64, page: PageIndex) -> bool {
        let key = (version_dir(v), file_name(ctime_ns, page));
        self.shared
            .lock()
            .expect("disk pages lock")
            .present
            .contains(&key)
    }

    /// The page's bytes, if a sound file of this version and index holds them.
    pub fn get(&self, v: &Version, ctime_ns: i64, page: PageIndex) -> Option<Bytes> {
        if !kept_on_disk(v) || !self.has(v, ctime_ns, page) {
            return None;
        }
        let path = self.path(v, ctime_ns, page);
        let raw = read_page_file(&path);
        match raw
            .as_deref()
            .and_then(|raw| decode(raw, v, ctime_ns, page))
        {
            Some(data) => {
                self.try_send(Job::Used((version_dir(v), file_name(ctime_ns, page))));
                Some(Bytes::copy_from_slice(data))
            }
            None => {
                tracing::debug!(
                    "disk cache: {} is not a sound page; removed",
                    path.display()
                );
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Keep the page (unless the writer is behind: then it is not kept).
    pub fn put(&self, v: Version, ctime_ns: i64, page: PageIndex, data: Bytes) {
        if !kept_on_disk(&v) {
            return;
        }
        self.try_send(Job::Put(v, ctime_ns, page, data));
    }

    fn try_send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            match jobs.try_send(job) {
                Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    /// Remove every page of `v`: none is served from now on, and the writer removes them
    /// (pages queued before are removed too: the queue is in order).
    pub fn forget(&self, v: &Version) {
        let dir = version_dir(v);
        {
            let mut sh = self.shared.lock().expect("disk pages lock");
            sh.present.retain(|(d, _)| *d != dir);
            *sh.forgetting.entry(dir).or_default() += 1;
        }
        // Waits only while the queue is full (the writer is never stuck).
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Forget(v.clone()));
        }
    }
}

impl Drop for DiskPages {
    /// What is queued is written (or removed) before the directory is let go.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Whether pages of `v` may be kept across mounts: a version a stat names, with the file's
/// birth time in it (`maj:min-ino-size-mtime-born`). Without one (exec-only scripts, a
/// filesystem with no birth times) a file made later with the same inode number, size and
/// mtime would be taken for the old one: no feed watches the sandbox between mounts to tell.
fn kept_on_disk(v: &Version) -> bool {
    let parts: Vec<&str> = v.0.split('-').collect();
    parts.len() == 5
        && parts[4].bytes().all(|b| b.is_ascii_hexdigit())
        && !parts[4].is_empty()
        && parts[4] != "0"
        && v.0.len() as u64 <= MAX_HEADER / 2
}

/// A page file's bytes: a regular file only (never through a link, never a FIFO that would
/// block), and no more than a page file can hold.
fn read_page_file(path: &Path) -> Option<Vec<u8>> {
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let most = PAGE + MAX_HEADER;
    let mut raw = Vec::with_capacity(most as usize);
    f.take(most + 1).read_to_end(&mut raw).ok()?;
    (raw.len() as u64 <= most).then_some(raw)
}

fn lock_now(f: &File) -> bool {
    rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// Bytes of the files in `dir` and the directories beneath it.
fn bytes_under(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// The bytes a page file holds, if it is sound and of `v` at `page`.
fn decode<'a>(raw: &'a [u8], v: &Version, ctime_ns: i64, page: PageIndex) -> Option<&'a [u8]> {
    let rest = raw.strip_prefix(MAGIC.as_slice())?;
    let (vlen, rest) = rest.split_first_chunk::<4>()?;
    let vlen = u32::from_le_bytes(*vlen) as usize;
    let (version, rest) = (rest.get(..vlen)?, rest.get(vlen..)?);
    let (ctime, rest) = rest.split_first_chunk::<8>()?;
    let (index, rest) = rest.split_first_chunk::<8>()?;
    let (crc, data) = rest.split_first_chunk::<4>()?;
    let sound = version == v.0.as_bytes()
        && i64::from_le_bytes(*ctime) == ctime_ns
        && u64::from_le_bytes(*index) == page.0
        && u32::from_le_bytes(*crc) == crc32fast::hash(data)
        && data.len() as u64 <= PAGE;
    sound.then_some(data)
}

fn encode(v: &Version, ctime_ns: i64, page: PageIndex, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + v.0.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(v.0.len() as u32).to_le_bytes());
    out.extend_from_slice(v.0.as_bytes());
    out.extend_from_slice(&ctime_ns.to_le_bytes());
    out.extend_from_slice(&page.0.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The writer thread's state: which pages are on disk, in order of use, and their bytes.
struct Writer {
    dir: PathBuf,
    cap: u64,
    shared: Arc<Mutex<Shared>>,
    /// Each page's file size and place in `order`.
    entries: HashMap<Key, (u64, u64)>,
    order: BTreeMap<u64, Key>,
    next: u64,
    bytes: u64,
    tmp_seq: u64,
}

impl Writer {
    /// What an earlier daemon left, oldest used first (by modification time: a page used
    /// from disk is touched).
    fn load(&mut self) {
        let mut found = Vec::new();
        for vdir in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = vdir.file_name().to_string_lossy().into_owned();
            if name.len() != 16 || !vdir.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for f in fs::read_dir(vdir.path()).into_iter().flatten().flatten() {
                let file = f.file_name().to_string_lossy().into_owned();
                let sound_name = file.split_once('-').is_some_and(|(c, p)| {
                    u64::from_str_radix(c, 16).is_ok() && p.parse::<u64>().is_ok()
                });
                if !sound_name {
                    continue;
                }
                if let Ok(m) = f.metadata() {
                    let used = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push((used, (name.clone(), file), m.len()));
                }
            }
        }
        found.sort();
        for (_, key, size) in found {
            self.insert(key, size);
        }
        self.evict();
    }

    /// Remove the caches of other sandboxes beside this one that no daemon uses: any not
    /// mounted for [`UNUSED_FOR`], then the least recently mounted while together they hold
    /// more than `cap`.
    fn trim_others(&self) {
        let (Some(parent), Some(mine)) = (self.dir.parent(), self.dir.file_name()) else {
            return;
        };
        let mut idle = Vec::new();
        let mut total = 0;
        for e in fs::read_dir(parent).into_iter().flatten().flatten() {
            let path = e.path();
            if e.file_name() == mine || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let size = bytes_under(&path);
            total += size;
            // Held by a live daemon: counted, left alone. Our lock is let go when `f` drops.
            let Ok(f) = File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path.join("lock"))
            else {
                continue;
            };
            if lock_now(&f) {
                let used = f
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                idle.push((used, path, size, f));
            }
        }
        idle.sort_by_key(|(used, ..)| *used);
        let now = std::time::SystemTime::now();
        for (used, path, size, _lock) in idle {
            let stale = now.duration_since(used).is_ok_and(|age| age > UNUSED_FOR);
            if !stale && total <= self.cap {
                break;
            }
            tracing::info!(
                "disk cache: removing {} (another sandbox's, unused)",
                path.display()
            );
            if fs::remove_dir_all(&path).is_ok() {
                total -= size;
            }
        }
    }

    fn run(mut self, rx: Receiver<Job>) {
        for job in rx {
            match job {
                Job::Put(v, ctime_ns, page, data) => {
                    if let Err(e) = self.write(&v, ctime_ns, page, &data) {
                        tracing::debug!("disk cache: page not kept: {e}");
                    }
                }
                Job::Forget(v) => {
                    let dir = version_dir(&v);
                    let gone: Vec<Key> = self
                        .entries
                        .keys()
                        .filter(|(d, _)| *d == dir)
                        .cloned()
                        .collect();
                    for key in gone {
                        self.remove(&key);
                    }
                    let _ = fs::remove_dir_all(self.dir.join(&dir));
                    let mut sh = self.shared.lock().expect("disk pages lock");
                    if let Some(n) = sh.forgetting.get_mut(&dir) {
                        *n -= 1;
                        if *n == 0 {
                            sh.forgetting.remove(&dir);
                        }
                    }
                }
                Job::Used(key) => {
                    if let Some(&(size, _)) = self.entries.get(&key) {
                        self.insert(key.clone(), size);
                        let path = self.dir.join(&key.0).join(&key.1);
                        if let Ok(f) = File::options().write(true).open(path) {
                            let _ = f.set_modified(std::time::SystemTime::now());
                        }
                    }
                }
            }
        }
    }

    fn write(
        &mut self,
        v: &Version,
        ctime_ns: i64,
        page: PageIndex,
        data: &[u8],
    ) -> io::Result<()> {
        let key = (version_dir(v), file_name(ctime_ns, page));
        let vdir = self.dir.join(&key.0);
        match fs::DirBuilder::new().mode(0o700).create(&vdir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        // A real directory of ours, never a link leading elsewhere.
        if !fs::symlink_metadata(&vdir)?.is_dir() {
            return Err(io::Error::other(format!(
                "{}: not a directory",
                vdir.display()
            )));
        }
        self.tmp_seq += 1;
        let tmp = self.dir.join("tmp").join(self.tmp_seq.to_string());
        let body = encode(v, ctime_ns, page, data);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&body)?;
        drop(f);
        fs::rename(&tmp, vdir.join(&key.1))?;
        self.insert(key, body.len() as u64);
        self.evict();
        Ok(())
    }

    fn insert(&mut self, key: Key, size: u64) {
        if let Some((old, at)) = self.entries.remove(&key) {
            self.order.remove(&at);
            self.bytes -= old;
        }
        self.next += 1;
        self.order.insert(self.next, key.clone());
        self.entries.insert(key.clone(), (size, self.next));
        self.bytes += size;
        let mut sh = self.shared.lock().expect("disk pages lock");
        if !sh.forgetting.contains_key(&key.0) {
            sh.present.insert(key);
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some((size, at)) = self.entries.remove(key) {
            self.order.remove(&at);
            self.bytes -= size;
        }
        self.shared
            .lock()
            .expect("disk pages lock")
            .present
            .remove(key);
        let _ = fs::remove_file(self.dir.join(&key.0).join(&key.1));
    }

    fn evict(&mut self) {
        while self.bytes > self.cap {
            let Some(key) = self.order.first_key_value().map(|(_, k)| k.clone()) else {
                break;
            };
            self.remove(&key);
            // An emptied version directory goes too (fails harmlessly while pages remain).
            let _ = fs::remove_dir(self.dir.join(&key.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(d: &DiskPages, v: &Version, page: u64) -> Bytes {
        for _ in 0..500 {
            if let Some(b) = d.get(v, 7, PageIndex(page)) {
                return b;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        panic!("page {page} never kept");
    }

    #[test]
    fn pages_outlive_the_daemon_and_a_forget_removes_them() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("pages");
        let v = Version("1:2-3-4-5-6".into());
        {
            let d = DiskPages::open(&dir, 1 << 30).unwrap();
            assert!(
                DiskPages::open(&dir, 1 << 30).is_none(),
                "one daemon at a time"
            );
            d.put(v.clone(), 7, PageIndex(0), Bytes::from_static(b"hello"));
            assert_eq!(&wait_for(&d, &v, 0)[..], b"hello");
            assert!(d.get(&Version("other".into()), 7, PageIndex(0)).is_none());
            assert!(
                d.get(&v, 8, PageIndex(0)).is_none(),
                "another ctime: changed since"
            );
        }
        let d = DiskPages::open(&dir, 1 << 30).unwrap();
        assert_eq!(&d.get(&v, 7, PageIndex(0)).unwrap()[..], b"hello", "kept");
        d.forget(&v);
        assert!(d.get(&v, 7, PageIndex(0)).is_none());
        drop(d);
        let d = DiskPages::open(&dir, 1 << 30).unwrap();
        assert!(d.get(&v, 7, PageIndex(0)).is_none(), "forgotten for good");
    }

    #[test]
    fn a_damaged_page_is_a_miss_and_removed() {
        let t = tempfile::tempdir().unwrap();
        let v = Version("fd:1-2a-3e8-17-99".into());
        let d = DiskPages::open(&t.path().join("p"), 1 << 30).unwrap();
        d.put(v.clone(), 7, PageIndex(3), Bytes::from(vec![9u8; 1000]));
        wait_for(&d, &v, 3);
        let path = d.path(&v, 7, PageIndex(3));
        let mut raw = fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        fs::write(&path, raw).unwrap();
        assert!(d.get(&v, 7, PageIndex(3)).is_none());
        assert!(!path.exists());
    }

    #[test]
    fn the_cache_stays_within_its_bytes_the_least_used_going_first() {
        let t = tempfile::tempdir().unwrap();
        let d = DiskPages::open(&t.path().join("p"), 3 * PAGE + 3 * 100).unwrap();
        let v = Version("fd:1-2a-3e8-17-99".into());
        let page = Bytes::from(vec![1u8; PAGE as usize]);
        for i in 0..3 {
            d.put(v.clone(), 7, PageIndex(i), page.clone());
            wait_for(&d, &v, i);
        }
        wait_for(&d, &v, 0); // used: page 1 is now the least recently used
        d.put(v.clone(), 7, PageIndex(3), page.clone());
        wait_for(&d, &v, 3);
        assert!(d.get(&v, 7, PageIndex(1)).is_none());
        assert!(d.get(&v, 7, PageIndex(0)).is_some());
        assert!(d.get(&v, 7, PageIndex(2)).is_some());
    }

    #[test]
    fn other_sandboxes_caches_are_trimmed_the_least_recently_mounted_first() {
        let t = tempfile::tempdir().unwrap();
        let sibling = |name: &str, bytes: usize, days_ago: u64| {
            let d = t.path().join(name);
            fs::create_dir_all(d.join("0123456789abcdef")).unwrap();
            fs::write(d.join("0123456789abcdef").join("0"), vec![0u8; bytes]).unwrap();
            let lock = File::create(d.join("lock")).unwrap();
            let at =
                std::time::SystemTime::now() - std::time::Duration::from_secs(days_ago * 86400);
            lock.set_modified(at).unwrap();
            d
        };
        let stale = sibling("stale", 10, 40);
        let old = sibling("old", 60_000, 5);
        let recent = sibling("recent", 60_000, 1);
        let busy = sibling("busy", 60_000, 9);
        let held = File::options().write(true).open(busy.join("lock")).unwrap();
        assert!(lock_now(&held));
        let d = DiskPages::open(&t.path().join("mine"), PAGE).unwrap();
        drop(d); // the writer has run
        assert!(!stale.exists(), "not mounted for 40 days");
        assert!(
            !old.exists(),
            "the least recently mounted, while over the bound"
        );
        assert!(recent.exists() && busy.exists());
    }

    #[test]
    fn a_page_file_that_is_a_link_a_fifo_or_a_directory_is_a_miss_not_a_hang() {
        let t = tempfile::tempdir().unwrap();
        let v = Version("fd:1-2a-3e8-17-99".into());
        let d = DiskPages::open(&t.path().join("p"), 1 << 30).unwrap();
        for page in 0..3 {
            d.put(v.clone(), 7, PageIndex(page), Bytes::from_static(b"x"));
            wait_for(&d, &v, page);
        }
        // A sound page 0 elsewhere: not reached through a link.
        let outside = t.path().join("outside");
        fs::write(&outside, encode(&v, 7, PageIndex(0), b"secret")).unwrap();
        for page in 0..3 {
            fs::remove_file(d.path(&v, 7, PageIndex(page))).unwrap();
        }
        std::os::unix::fs::symlink(&outside, d.path(&v, 7, PageIndex(0))).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path(&v, 7, PageIndex(1)),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        fs::create_dir(d.path(&v, 7, PageIndex(2))).unwrap();
        for page in 0..3 {
            assert!(d.get(&v, 7, PageIndex(page)).is_none(), "page {page}");
        }
    }

    #[test]
    fn only_versions_with_a_birth_time_are_kept() {
        let t = tempfile::tempdir().unwrap();
        let d = DiskPages::open(&t.path().join("p"), 1 << 30).unwrap();
        let born = Version("fd:1-2a-3e8-17-99".into());
        for unborn in [
            "fd:1-2a-3e8-17",
            "fd:1-2a-3e8-17-0",
            "fd:1-2a-3e8-17-99~unsettled",
            "absent",
        ] {
            let v = Version(unborn.into());
            d.put(v.clone(), 7, PageIndex(0), Bytes::from_static(b"x"));
        }
        d.put(born.clone(), 7, PageIndex(0), Bytes::from_static(b"kept"));
        assert_eq!(&wait_for(&d, &born, 0)[..], b"kept");
        drop(d);
        let (_, dirs) = (0, fs::read_dir(t.path().join("p")).unwrap().count());
        assert_eq!(dirs, 3, "lock, tmp and the one version's directory");
    }
}
