//! Write staging: what a file open for writing holds locally until it is pushed.
//!
//! A staged file is a local temp file standing for the remote file at its `base` version, plus
//! what the user wrote: the pages present locally (fetched from the remote only where a partial
//! overwrite needs the old bytes), the dirty byte ranges, and the new length. Pushing sends the
//! dirty ranges as a patch over the base (or the whole file when it is new or mostly rewritten),
//! naming the base version, so the sandbox applies it with an atomic rename or refuses it as a
//! conflict. Until a push succeeds, nothing is dropped: the staged file stays, and is retried.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use crate::remote::{CommitContent, Version};

/// Size of a staging page: the unit fetched from the remote when a write covers part of it.
pub const PAGE: u64 = 128 * 1024;
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
    /// Size of the base version.
    pub base_size: u64,
    /// Current length of the staged file.
    pub len: u64,
    /// Pages (index) whose bytes are local: fetched, fully written, or beyond the base's size.
    present: BTreeSet<u64>,
    /// Dirty byte ranges `[start, end)`, sorted and disjoint.
    dirty: Vec<(u64, u64)>,
    /// The length changed (truncate/extend) since the last push.
    len_changed: bool,
    /// Handles open on this staged file.
    pub handles: usize,
    /// The last push failed; it is retried in the background.
    pub failed: bool,
    /// Mode and times set while writes were staged: applied after the next push, so they are
    /// not lost to the commit's rename (`cp -a`, `tar -x` set them before closing).
    pub pending_attr: crate::remote::SetAttr,
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
            handles: 0,
            failed: false,
            pending_attr: crate::remote::SetAttr::default(),
        }
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.len_changed || self.base.is_none()
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.iter().map(|(a, b)| b - a).sum()
    }

    /// Is the page local (so its bytes can be read from the staging file)?
    pub fn page_present(&self, page: u64) -> bool {
        page * PAGE >= self.base_size || self.present.contains(&page)
    }

    /// Pages that must be fetched before writing `len` bytes at `offset`: those partly covered
    /// and holding old bytes.
    pub fn pages_to_fill(&self, offset: u64, len: u64) -> Vec<u64> {
        if len == 0 {
            return Vec::new();
        }
        let end = offset + len;
        let mut out = Vec::new();
        for page in [offset / PAGE, (end - 1) / PAGE] {
            let (p_start, p_end) = (page * PAGE, (page + 1) * PAGE);
            let fully_covered = offset <= p_start && end >= p_end.min(self.base_size.max(end));
            if !self.page_present(page) && !fully_covered && !out.contains(&page) {
                out.push(page);
            }
        }
        out
    }

    /// Put fetched base bytes of `page` in place (only where the user has not written).
    pub fn fill_page(&mut self, page: u64, data: &[u8]) -> io::Result<()> {
        if self.present.contains(&page) {
            return Ok(());
        }
        let start = page * PAGE;
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
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)?;
        let end = offset + data.len() as u64;
        // Pages entirely covered are local now.
        let first_full = offset.div_ceil(PAGE);
        let last_full = end / PAGE;
        for p in first_full..last_full {
            self.present.insert(p);
        }
        self.add_dirty(offset, end);
        if end > self.len {
            self.len = end;
            self.len_changed = true;
        }
        Ok(())
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
        self.file.set_len(len)?;
        self.dirty = self
            .dirty
            .iter()
            .filter(|(a, _)| *a < len)
            .map(|&(a, b)| (a, b.min(len)))
            .collect();
        if len < self.base_size {
            // Bytes past the new end are gone; pages there count as local (zeros if extended).
            self.base_size = self.base_size.min(len);
        }
        self.len = len;
        self.len_changed = true;
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
        let dirty = self.dirty_bytes();
        let whole = self.base.is_none()
            || (self.complete()
                && (dirty > MAX_PATCH_BYTES || dirty as f64 > self.len as f64 * WHOLE_FILE_SHARE));
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
        use std::os::fd::AsRawFd;
        let f = File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))?;
        Ok(tokio::io::AsyncReadExt::take(
            tokio::fs::File::from_std(f),
            self.len,
        ))
    }

    /// The push of the current content succeeded: it is the new base.
    pub fn pushed(&mut self, version: Version, size: u64) {
        self.base = Some(version);
        self.base_size = size;
        self.dirty.clear();
        self.len_changed = false;
        self.failed = false;
        // Everything written is local; pages never fetched are still the remote's.
    }

    /// Read staged bytes (only from present pages; the caller fetches the rest).
    pub fn read_local(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = (offset + len).min(self.len);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        let mut got = 0;
        while got < buf.len() {
            match self.file.read_at(&mut buf[got..], offset + got as u64)? {
                0 => break, // a hole past the file's end reads as zeros
                n => got += n,
            }
        }
        Ok(buf)
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
    fn partial_page_writes_need_the_old_bytes_full_pages_do_not() {
        let s = staged(&vec![0u8; 3 * PAGE as usize]);
        assert_eq!(s.pages_to_fill(10, 5), vec![0]);
        assert_eq!(s.pages_to_fill(PAGE, PAGE), Vec::<u64>::new());
        assert_eq!(s.pages_to_fill(PAGE - 1, 2), vec![0, 1]);
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
