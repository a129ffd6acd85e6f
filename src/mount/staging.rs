//! Write staging: the exact image of a file open for writing, held locally until it is pushed.
//!
//! A staged file is a local file standing for the remote file at its `base` version, plus what
//! the user did to it: the dirty byte ranges, the lowest length it had since the base (`cut`:
//! base bytes past it are gone and read as zeros if the file grows again), and its current
//! length. Writes never wait for a fetch: a page holding old bytes is fetched when someone
//! reads it, or by the capture of the base ([`crate::mount::core`]'s `capture`), and filled
//! around the dirty ranges. Pushing sends the dirty ranges as a patch over
//! the base (or the whole file when it is new or mostly rewritten and wholly local), naming the
//! base version, so the sandbox applies it with an atomic rename or refuses it as a conflict.
//!
//! Staging is durable: the file is named, in the mount's private staging directory, beside a
//! small journal ([`Journal`]: what it stands for, and every write and truncation since the
//! base), so a daemon that was killed finds its unpushed edits at the next mount.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use crate::remote::{CommitContent, Version};

pub use super::pages::PAGE;
/// A push sends the whole file instead of a patch once the dirty bytes exceed this share of it
/// (and every page is local): the patch would save little and hold the ranges in memory.
const WHOLE_FILE_SHARE: f64 = 0.5;
/// Above this many dirty bytes a patch is not built in memory when the whole file is local.
const MAX_PATCH_BYTES: u64 = 8 * 1024 * 1024;

pub struct Staged {
    pub file: File,
    /// The remote version the staged content is based on; `None` for a file that does not exist
    /// remotely yet.
    pub base: Option<Version>,
    /// Bytes of the base version still part of the file: the base's size, lowered by every
    /// truncation since (the `cut` a patch carries).
    pub base_size: u64,
    /// Current length of the staged file.
    pub len: u64,
    /// Pages (index) whose bytes are local: fetched, fully written, or beyond the base's size.
    present: BTreeSet<u64>,
    /// Dirty byte ranges `[start, end)`, sorted and disjoint.
    dirty: Vec<(u64, u64)>,
    /// The length changed (truncate/extend) since the last push.
    len_changed: bool,
    /// The last push failed; it is retried in the background.
    pub failed: bool,
    /// Mode and times set while writes were staged: applied after the next push, so they are
    /// not lost to the commit's rename (`cp -a`, `tar -x` set them before closing).
    pub pending_attr: crate::remote::SetAttr,
    /// Modification time of the staged content (set by each write, or by utimens).
    pub mtime_ns: Option<i64>,
    /// The durable record of this staged file (none in unit tests).
    pub journal: Option<Journal>,
    /// A background capture of the base was started for this image (one is enough: every
    /// push finishes it).
    pub capture_started: bool,
}

impl Staged {
    pub fn new(file: File, base: Option<Version>, base_size: u64) -> Self {
        Staged {
            file,
            base,
            base_size,
            len: base_size,
            present: BTreeSet::new(),
            dirty: Vec::new(),
            len_changed: false,
            failed: false,
            pending_attr: crate::remote::SetAttr::default(),
            mtime_ns: None,
            journal: None,
            capture_started: false,
        }
    }

    /// Pages of the base that are not local and overlap `[offset, offset+len)` (what a read
    /// of that range must fetch first).
    pub fn missing_in(&self, offset: u64, len: u64) -> Vec<u64> {
        let end = (offset + len).min(self.len).min(self.base_size);
        if offset >= end {
            return Vec::new();
        }
        (offset / PAGE..=(end - 1) / PAGE)
            .filter(|p| !self.page_present(*p))
            .collect()
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.len_changed || self.base.is_none()
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.iter().map(|(a, b)| b - a).sum()
    }

    /// Is the page local (so its bytes can be read from the staging file)? Also when writes
    /// covered every base byte of it: nothing of the base is left to fetch.
    pub fn page_present(&self, page: u64) -> bool {
        let start = page * PAGE;
        if start >= self.base_size || self.present.contains(&page) {
            return true;
        }
        let end = (start + PAGE).min(self.base_size);
        let i = self.dirty.partition_point(|&(a, _)| a <= start);
        i > 0 && self.dirty[i - 1].1 >= end
    }

    /// Put fetched base bytes of `page` in place (only where the user has not written).
    pub fn fill_page(&mut self, page: u64, data: &[u8]) -> io::Result<()> {
        if self.present.contains(&page) {
            return Ok(());
        }
        let start = page * PAGE;
        // Base bytes past the cut are gone (truncated since the base): never bring them back.
        let keep = self.base_size.saturating_sub(start).min(data.len() as u64) as usize;
        let data = &data[..keep];
        let end = start + data.len() as u64;
        // Write the old bytes around any dirty ranges inside the page.
        let mut at = start;
        for &(a, b) in &self.dirty {
            if b <= at || a >= end {
                continue;
            }
            if a > at {
                self.file
                    .write_all_at(&data[(at - start) as usize..(a - start) as usize], at)?;
            }
            at = at.max(b);
        }
        if at < end {
            self.file.write_all_at(&data[(at - start) as usize..], at)?;
        }
        self.present.insert(page);
        // Recorded: after a restart these bytes are the base's own, never fetched again
        // (by then the sandbox may hold other bytes there).
        if let Some(j) = &mut self.journal {
            j.record(&format!("p {page} {}", page + 1))?;
        }
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(j) = &mut self.journal {
            j.record(&format!("w {offset} {}", data.len()))?;
        }
        self.file.write_all_at(data, offset)?;
        self.note_write(offset, data.len() as u64);
        Ok(())
    }

    /// Account for `len` bytes written at `offset` (the bytes are already in the file).
    fn note_write(&mut self, offset: u64, len: u64) {
        let end = offset + len;
        // Pages entirely covered are local now.
        for p in offset.div_ceil(PAGE)..end / PAGE {
            self.present.insert(p);
        }
        self.add_dirty(offset, end);
        if end > self.len {
            self.len = end;
            self.len_changed = true;
        }
    }

    /// Account for a cut to `len`: dirty ranges past it are gone, and so are the base's bytes
    /// (pages there count as local: zeros if the file grows again).
    fn note_truncate(&mut self, len: u64) {
        self.dirty = self
            .dirty
            .iter()
            .filter(|(a, _)| *a < len)
            .map(|&(a, b)| (a, b.min(len)))
            .collect();
        self.base_size = self.base_size.min(len);
        self.len = len;
        self.len_changed = true;
    }

    fn add_dirty(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut merged = (start, end);
        let mut out = Vec::with_capacity(self.dirty.len() + 1);
        for &(a, b) in &self.dirty {
            if b < merged.0 || a > merged.1 {
                out.push((a, b));
            } else {
                merged = (merged.0.min(a), merged.1.max(b));
            }
        }
        out.push(merged);
        out.sort_unstable();
        self.dirty = out;
    }

    pub fn truncate(&mut self, len: u64) -> io::Result<()> {
        if let Some(j) = &mut self.journal {
            j.record(&format!("t {len}"))?;
        }
        self.file.set_len(len)?;
        self.note_truncate(len);
        Ok(())
    }

    /// Every page of the file is local: the staging file alone is the whole content.
    pub fn complete(&self) -> bool {
        (0..self.base_size.div_ceil(PAGE)).all(|p| self.present.contains(&p))
    }

    /// The missing pages (for filling the staging file completely, e.g. for a conflict copy).
    pub fn missing_pages(&self) -> Vec<u64> {
        (0..self.base_size.div_ceil(PAGE))
            .filter(|p| !self.present.contains(p))
            .collect()
    }

    /// What to send: a patch over the base, or the whole file.
    pub fn content(&self) -> io::Result<(CommitContent, u64)> {
        self.content_for(true, false)
    }

    /// [`Staged::content`] for a transport that takes patches or not: without them the whole
    /// file, which must then be [`Staged::complete`].
    /// `patches`: the transport takes patches over a base; `patch_new`: also a patch that
    /// creates its file (cut 0 over nothing), so a new sparse file (a byte written at 2 GiB, a
    /// `truncate -s 1G`) sends only its written ranges, not gigabytes of zeros.
    pub fn content_for(&self, patches: bool, patch_new: bool) -> io::Result<(CommitContent, u64)> {
        let dirty = self.dirty_bytes();
        let sparse = dirty <= MAX_PATCH_BYTES && dirty as f64 <= self.len as f64 * WHOLE_FILE_SHARE;
        let whole = match self.base {
            // Every byte of a file made here is in its dirty ranges (its base is empty).
            None => !(patch_new && self.base_size == 0 && sparse),
            Some(_) => self.complete() && (!patches || !sparse),
        };
        if whole {
            return Ok((CommitContent::Whole(Box::new(self.reader()?)), self.len));
        }
        let mut ranges = Vec::with_capacity(self.dirty.len());
        for &(a, b) in &self.dirty {
            let mut buf = vec![0u8; (b - a) as usize];
            self.file.read_exact_at(&mut buf, a)?;
            ranges.push((a, Bytes::from(buf)));
        }
        Ok((
            CommitContent::Patch {
                cut: self.base_size,
                new_len: self.len,
                ranges,
            },
            dirty,
        ))
    }

    /// A stream of the whole staged content from its own open file description (reopened
    /// through /proc), so its offset is shared with no other reader of the staging file.
    pub fn reader(&self) -> io::Result<impl tokio::io::AsyncRead + Send + Unpin + 'static> {
        self.cover_len()?;
        Ok(tokio::io::AsyncReadExt::take(
            tokio::fs::File::from_std(self.reopen()?),
            self.len,
        ))
    }

    fn reopen(&self) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// The whole staged content, read blocking from its own open file description.
    pub fn image(&self) -> io::Result<impl std::io::Read> {
        self.cover_len()?;
        Ok(std::io::Read::take(self.reopen()?, self.len))
    }

    /// The staging file is as long as the image (pages never fetched or written past its end
    /// are a hole, read as zeros): a reader of it never ends short of the file's length.
    fn cover_len(&self) -> io::Result<()> {
        if self.file.metadata()?.len() < self.len {
            self.file.set_len(self.len)?;
        }
        Ok(())
    }

    /// The push of the current content succeeded: it is the new base.
    pub fn pushed(&mut self, version: Version, size: u64) {
        // Pages wholly past the old cut hold only local bytes: they stay local under the new
        // base. Pages never fetched are the new base's too (the push changed only what was
        // written, and fills always write around nothing dirty from now on).
        for p in self.base_size.div_ceil(PAGE)..size.div_ceil(PAGE) {
            self.present.insert(p);
        }
        self.base = Some(version.clone());
        self.base_size = size;
        self.dirty.clear();
        self.len_changed = false;
        self.failed = false;
        if let Some(j) = &mut self.journal {
            let _ = j.rebase(Some(version), size);
            for (start, end) in runs(&self.present) {
                let _ = j.record(&format!("p {start} {end}"));
            }
        }
    }

    /// The sandbox changed the (clean) file itself: follow its new version, keeping nothing
    /// local (pages are fetched again when read).
    pub fn rebase_remote(&mut self, version: Version, size: u64) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.set_len(size)?;
        self.present.clear();
        self.dirty.clear();
        self.len_changed = false;
        self.base = Some(version.clone());
        self.base_size = size;
        self.len = size;
        if let Some(j) = &mut self.journal {
            j.rebase(Some(version), size)?;
        }
        Ok(())
    }

    /// A patch of every byte this image holds locally (written, or the base's kept), over
    /// `cut` = the base's size: what makes the user's version of a file not held whole from
    /// a copy of another (a conflict copy made from the sandbox's current file). `None` when
    /// that is more than `max` bytes.
    pub fn local_patch(&self, max: u64) -> io::Result<Option<(CommitContent, u64)>> {
        let mut spans: Vec<(u64, u64)> = self.dirty.clone();
        for (a, b) in runs(&self.present) {
            spans.push((a * PAGE, (b * PAGE).min(self.len)));
        }
        spans.retain(|(a, b)| a < b);
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in spans {
            match merged.last_mut() {
                Some((_, end)) if a <= *end => *end = (*end).max(b),
                _ => merged.push((a, b)),
            }
        }
        let total: u64 = merged.iter().map(|(a, b)| b - a).sum();
        if total > max {
            return Ok(None);
        }
        let mut ranges = Vec::with_capacity(merged.len());
        for (a, b) in merged {
            let mut buf = vec![0u8; (b - a) as usize];
            self.file.read_exact_at(&mut buf, a)?;
            ranges.push((a, Bytes::from(buf)));
        }
        Ok(Some((
            CommitContent::Patch {
                cut: self.base_size,
                new_len: self.len,
                ranges,
            },
            total,
        )))
    }

    pub fn dirty_ranges(&self) -> &[(u64, u64)] {
        &self.dirty
    }

    /// Rebuild the state a journal recorded (after a restart): dirty ranges, cut and length.
    pub fn replay(&mut self, ops: &[JournalOp]) {
        for op in ops {
            match *op {
                JournalOp::Write { offset, len } => self.note_write(offset, len),
                JournalOp::Truncate(len) => self.note_truncate(len),
                JournalOp::Present { start, end } => {
                    // Pages past the base are local anyway.
                    let end = end.min(self.base_size.div_ceil(PAGE));
                    self.present.extend(start..end)
                }
            }
        }
    }

    /// Read staged bytes (only from present pages; the caller fetches the rest).
    pub fn read_local(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        read_image(&self.file, self.len, offset, len)
    }
}

/// Up to `len` bytes at `offset` of a staged image `size` bytes long, read from its file.
pub fn read_image(file: &File, size: u64, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let end = offset.saturating_add(len).min(size);
    if offset >= end {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; (end - offset) as usize];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64)? {
            0 => break, // a hole past the file's end reads as zeros
            n => got += n,
        }
    }
    Ok(buf)
}

/// One recorded change to a staged file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalOp {
    Write {
        offset: u64,
        len: u64,
    },
    Truncate(u64),
    /// Base pages `[start, end)` are in the data file (captured, or fetched for a read).
    Present {
        start: u64,
        end: u64,
    },
}

/// A set of pages as runs `[start, end)`.
fn runs(pages: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((_, end)) if *end == p => *end += 1,
            _ => out.push((p, p + 1)),
        }
    }
    out
}

/// What a staged file stands for, kept beside it (`N.meta`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct JournalMeta {
    /// The file's path in the sandbox when it was last recorded.
    pub path: crate::remote::WireBytes,
    pub base: Option<Version>,
    pub base_size: u64,
    /// Mode for a file the push creates.
    pub mode: Option<u32>,
    /// Which sandbox it belongs to (its root's device and inode): a later mount of the same
    /// URL that reaches another sandbox leaves it alone.
    #[serde(default)]
    pub sandbox: Option<String>,
}

/// The durable record of a staged file: `N.data` (the content), `N.meta` ([`JournalMeta`],
/// rewritten on rare events: a push, a rename) and `N.log` (one line per write or truncation,
/// appended as they happen, so a daemon killed at any point leaves a record of every byte it
/// accepted).
pub struct Journal {
    dir: std::path::PathBuf,
    id: u64,
    log: File,
    meta: JournalMeta,
}

/// A journal is its daemon's while that daemon has it open: an exclusive lock on its log,
/// released with the file (at exit, however the daemon ends).
fn hold(log: &File) -> io::Result<()> {
    rustix::fs::flock(log, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(io::Error::from)
}

fn create_private(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl Journal {
    /// A new staged file in `dir`: answers the journal and the (empty) data file.
    pub fn create(dir: &std::path::Path, meta: JournalMeta) -> io::Result<(Journal, File)> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let id = (std::process::id() as u64) << 32
                | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let data = match create_private(&dir.join(format!("{id}.data"))) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            let log = create_private(&dir.join(format!("{id}.log")))?;
            hold(&log)?;
            let j = Journal {
                dir: dir.to_path_buf(),
                id,
                log,
                meta,
            };
            j.write_meta()?;
            return Ok((j, data));
        }
    }

    fn write_meta(&self) -> io::Result<()> {
        let tmp = self.dir.join(format!("{}.meta.tmp", self.id));
        let _ = std::fs::remove_file(&tmp);
        let mut f = create_private(&tmp)?;
        use std::io::Write;
        f.write_all(&serde_json::to_vec(&self.meta).expect("serialisable"))?;
        std::fs::rename(tmp, self.dir.join(format!("{}.meta", self.id)))
    }

    fn record(&mut self, line: &str) -> io::Result<()> {
        use std::io::Write;
        self.log.write_all(format!("{line}\n").as_bytes())
    }

    /// The content was pushed: it is the new base, and the log starts over.
    pub fn rebase(&mut self, base: Option<Version>, size: u64) -> io::Result<()> {
        self.meta.base = base;
        self.meta.base_size = size;
        self.write_meta()?;
        self.log.set_len(0)?;
        use std::io::Seek;
        self.log.seek(io::SeekFrom::Start(0))?;
        Ok(())
    }

    /// The file has a new path (renamed through the mount).
    pub fn moved(&mut self, path: &crate::remote::RemotePath) -> io::Result<()> {
        self.meta.path = crate::remote::WireBytes(path.as_bytes().to_vec());
        self.write_meta()
    }

    /// Nothing is left to push: remove the record.
    pub fn remove(self) {
        for ext in ["data", "log", "meta"] {
            let _ = std::fs::remove_file(self.dir.join(format!("{}.{ext}", self.id)));
        }
    }

    pub fn data_path(&self) -> std::path::PathBuf {
        self.dir.join(format!("{}.data", self.id))
    }

    /// Every staged file recorded in `dir` (left by a daemon that did not finish).
    pub fn recover(dir: &std::path::Path) -> Vec<(Journal, File, Vec<JournalOp>)> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return out;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_suffix(".meta")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let open = |ext: &str| {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(dir.join(format!("{id}.{ext}")))
            };
            let (Ok(meta), Ok(data), Ok(log)) =
                (std::fs::read(dir.join(&name)), open("data"), open("log"))
            else {
                continue;
            };
            let Ok(meta) = serde_json::from_slice::<JournalMeta>(&meta) else {
                continue;
            };
            // Another live daemon of the same sandbox owns it (its file is still being
            // written): never taken over.
            if hold(&log).is_err() {
                continue;
            }
            let text = std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default();
            let ops = text
                .lines()
                .filter_map(|l| {
                    let mut w = l.split(' ');
                    match (w.next(), w.next(), w.next()) {
                        (Some("w"), Some(o), Some(n)) => Some(JournalOp::Write {
                            offset: o.parse().ok()?,
                            len: n.parse().ok()?,
                        }),
                        (Some("t"), Some(n), None) => Some(JournalOp::Truncate(n.parse().ok()?)),
                        (Some("p"), Some(a), Some(b)) => {
                            let (start, end) = (a.parse().ok()?, b.parse().ok()?);
                            // A log is the daemon's own, but never trusted to size a loop.
                            (start <= end && end - start <= 1 << 32)
                                .then_some(JournalOp::Present { start, end })
                        }
                        _ => None,
                    }
                })
                .collect();
            use std::io::Seek;
            let mut log = log;
            let _ = log.seek(io::SeekFrom::End(0));
            out.push((
                Journal {
                    dir: dir.to_path_buf(),
                    id,
                    log,
                    meta,
                },
                data,
                ops,
            ));
        }
        out
    }

    pub fn meta(&self) -> &JournalMeta {
        &self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(base: &[u8]) -> Staged {
        let f = tempfile::tempfile().unwrap();
        Staged::new(f, Some(Version("v1".into())), base.len() as u64)
    }

    #[test]
    fn a_new_sparse_file_is_a_patch_over_nothing_where_the_transport_takes_one() {
        let mut s = Staged::new(tempfile::tempfile().unwrap(), None, 0);
        s.write(1 << 31, b"Z").unwrap();
        match s.content_for(false, true).unwrap() {
            (
                CommitContent::Patch {
                    cut,
                    new_len,
                    ranges,
                },
                bytes,
            ) => {
                assert_eq!((cut, new_len, bytes), (0, (1 << 31) + 1, 1));
                assert_eq!(ranges, vec![(1 << 31, Bytes::from_static(b"Z"))]);
            }
            (CommitContent::Whole(_), _) => panic!("a whole file of zeros"),
        }
        // Without the capability, and for a file written mostly full, the whole file.
        assert!(matches!(
            s.content_for(true, false).unwrap().0,
            CommitContent::Whole(_)
        ));
        let mut full = Staged::new(tempfile::tempfile().unwrap(), None, 0);
        full.write(0, &[1u8; 10_000]).unwrap();
        assert!(matches!(
            full.content_for(true, true).unwrap().0,
            CommitContent::Whole(_)
        ));
    }

    #[test]
    fn writes_fetch_nothing_reads_need_only_untouched_base_pages() {
        let mut s = staged(&vec![0u8; 3 * PAGE as usize]);
        s.write(10, b"x").unwrap();
        assert_eq!(s.missing_in(0, 3 * PAGE), vec![0, 1, 2]);
        s.write(PAGE, &vec![1u8; PAGE as usize]).unwrap();
        assert_eq!(s.missing_in(0, 3 * PAGE), vec![0, 2]);
    }

    #[test]
    fn truncated_base_bytes_never_come_back() {
        // 20,000 old bytes, cut to 100, then a write far past it: old bytes 100.. are zeros.
        let mut s = staged(&[b'A'; 20_000]);
        s.truncate(100).unwrap();
        s.write(30_000, b"0123456789").unwrap();
        s.fill_page(0, &[b'A'; 20_000]).unwrap();
        let all = s.read_local(0, s.len).unwrap();
        assert_eq!(all.len(), 30_010);
        assert!(all[..100].iter().all(|&b| b == b'A'));
        assert!(all[100..30_000].iter().all(|&b| b == 0));
        match s.content().unwrap().0 {
            CommitContent::Patch { cut, new_len, .. } => assert_eq!((cut, new_len), (100, 30_010)),
            CommitContent::Whole(_) => {}
        }
    }

    #[test]
    fn a_journal_a_live_daemon_holds_is_never_recovered_by_another() {
        let dir = tempfile::tempdir().unwrap();
        let meta = JournalMeta {
            path: crate::remote::WireBytes(b"open.txt".to_vec()),
            base: None,
            base_size: 0,
            mode: None,
            sandbox: None,
        };
        let (live, _file) = Journal::create(dir.path(), meta).unwrap();
        // A second mount of the same sandbox looks while the first still writes the file.
        assert!(Journal::recover(dir.path()).is_empty());
        // Once its daemon is gone (the journal closed), the next one takes it.
        drop(live);
        assert_eq!(Journal::recover(dir.path()).len(), 1);
    }

    #[test]
    fn a_journal_replays_to_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let meta = JournalMeta {
            path: crate::remote::WireBytes(b"f".to_vec()),
            base: Some(Version("v1".into())),
            base_size: 1000,
            mode: None,
            sandbox: None,
        };
        let (j, file) = Journal::create(dir.path(), meta).unwrap();
        let mut s = Staged::new(file, Some(Version("v1".into())), 1000);
        s.journal = Some(j);
        s.write(10, b"abc").unwrap();
        s.truncate(500).unwrap();
        s.write(600, b"zz").unwrap();
        let (dirty, len, cut) = (s.dirty.clone(), s.len, s.base_size);
        drop(s);
        let mut found = Journal::recover(dir.path());
        assert_eq!(found.len(), 1);
        let (j, file, ops) = found.pop().unwrap();
        let mut r = Staged::new(file, j.meta().base.clone(), j.meta().base_size);
        r.replay(&ops);
        assert_eq!((r.dirty.clone(), r.len, r.base_size), (dirty, len, cut));
        assert_eq!(r.read_local(10, 3).unwrap(), b"abc");
    }

    #[test]
    fn an_image_is_read_to_its_full_length_however_little_of_it_is_local() {
        // A conflict copy of a 100 KiB file whose base could not be fetched: the image has
        // only the user's write, yet it is 100 KiB long (zeros where nothing is known).
        let mut s = Staged::new(
            tempfile::tempfile().unwrap(),
            Some(Version("v".into())),
            100 << 10,
        );
        s.write(1000, b"USER-EDIT\n").unwrap();
        s.fill_page(0, b"SHORT").unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut s.image().unwrap(), &mut all).unwrap();
        assert_eq!(all.len(), 100 << 10);
        assert_eq!(&all[1000..1010], b"USER-EDIT\n");
    }

    #[test]
    fn a_journal_keeps_which_base_pages_were_captured() {
        // After a restart the captured base bytes are used as they are: the sandbox may have
        // other bytes there by then (a conflict copy would splice them in).
        let dir = tempfile::tempdir().unwrap();
        let size = 3 * PAGE;
        let meta = JournalMeta {
            path: crate::remote::WireBytes(b"f".to_vec()),
            base: Some(Version("v1".into())),
            base_size: size,
            mode: None,
            sandbox: None,
        };
        let (j, file) = Journal::create(dir.path(), meta).unwrap();
        let mut s = Staged::new(file, Some(Version("v1".into())), size);
        s.journal = Some(j);
        s.write(size, b"appended").unwrap();
        s.fill_page(0, &vec![b'a'; PAGE as usize]).unwrap();
        s.fill_page(2, &vec![b'c'; PAGE as usize]).unwrap();
        drop(s);
        let (j, file, ops) = Journal::recover(dir.path()).pop().unwrap();
        let mut r = Staged::new(file, j.meta().base.clone(), j.meta().base_size);
        r.replay(&ops);
        assert_eq!(r.missing_pages(), vec![1]);
        assert_eq!(r.read_local(2 * PAGE, 2).unwrap(), b"cc");
        // A push rebases the log: what is local stays known.
        r.journal = Some(j);
        r.fill_page(1, &vec![b'b'; PAGE as usize]).unwrap();
        r.pushed(Version("v2".into()), size + 8);
        drop(r);
        let (j, file, ops) = Journal::recover(dir.path()).pop().unwrap();
        let mut r = Staged::new(file, j.meta().base.clone(), j.meta().base_size);
        r.replay(&ops);
        assert!(r.complete());
        assert_eq!(r.read_local(PAGE, 2).unwrap(), b"bb");
    }

    #[test]
    fn a_page_whose_base_bytes_were_all_written_needs_no_fetch() {
        let f = tempfile::tempfile().unwrap();
        let mut s = Staged::new(f, Some(Version("v".into())), 3);
        assert_eq!(s.missing_in(0, 10), vec![0]);
        s.write(1, b"xy").unwrap();
        assert_eq!(s.missing_in(0, 10), vec![0], "byte 0 is still the base's");
        s.write(0, b"new data").unwrap();
        assert!(
            s.missing_in(0, 10).is_empty(),
            "every base byte was written"
        );
        let big = tempfile::tempfile().unwrap();
        let mut s = Staged::new(big, Some(Version("v".into())), 3 * PAGE);
        s.write(PAGE + 5, b"x").unwrap();
        assert_eq!(
            s.missing_in(0, 3 * PAGE),
            vec![0, 1, 2],
            "a 1-byte write fetches nothing"
        );
    }

    #[test]
    fn dirty_ranges_merge_and_truncate() {
        let mut s = staged(&[0u8; 100]);
        s.write(10, b"abc").unwrap();
        s.write(12, b"xyz").unwrap();
        s.write(50, b"q").unwrap();
        assert_eq!(s.dirty, vec![(10, 15), (50, 51)]);
        s.truncate(11).unwrap();
        assert_eq!(s.dirty, vec![(10, 11)]);
        assert_eq!(s.len, 11);
    }

    #[test]
    fn a_fill_never_overwrites_what_the_user_wrote() {
        let mut s = staged(&[b'o'; 20]);
        s.write(5, b"NEW").unwrap();
        s.fill_page(0, &[b'o'; 20]).unwrap();
        assert_eq!(s.read_local(0, 20).unwrap(), b"oooooNEWoooooooooooo");
    }
}
