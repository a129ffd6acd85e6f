//! `scan`: a window of a file's lines, read in one streaming pass.
//!
//! Rules (pinned by `tests/vectors/scan.json`; `scripts/scan.sh` implements the same):
//! - lines split on `\n`; a trailing `\n` ends the last line instead of starting a new one;
//! - a UTF-8 BOM at the very start is not part of line 1 (a BOM later is text);
//! - lengths are bytes and `\r` is ordinary line content;
//! - lines are taken whole and greedily: a window costs the bytes of its lines plus one for each
//!   `\n` joining them; the first line that would not fit `max_bytes` ends the window;
//! - the scan reads only the bytes present when it starts, so a growing file cannot extend it.
//!
//! Memory is the window plus one read buffer, whatever the file size: the [`LineWindow`] state
//! machine is fed chunks and keeps only the lines it returns.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SearchError;

/// Size of one positional read: large enough to amortise syscalls, small enough that memory stays
/// flat (the scan holds one buffer of this size plus the window).
pub const READ_CHUNK: usize = 64 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What to scan: 1-based inclusive line numbers, like `sed -n START,ENDp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanRequest {
    pub start_line: u64,
    pub end_line: Option<u64>,
    pub max_bytes: u64,
}

/// The window and the facts about the file a caller needs to page through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanResult {
    /// The selected lines, without their `\n` (in JSON: strings, or `{"b64": …}` when not UTF-8).
    #[serde(with = "crate::wirebytes::lines")]
    pub lines: Vec<Vec<u8>>,
    /// Number of the first line returned (the requested start).
    pub start_line: u64,
    /// Number of the last line returned; `start_line - 1` when no line is returned.
    pub end_line: u64,
    pub total_lines: u64,
    /// Raw size of the file, BOM included.
    pub total_bytes: u64,
    /// Size of line `start_line`, 0 past the end: tells a caller when even one line cannot fit.
    pub first_line_bytes: u64,
}

impl ScanRequest {
    pub fn validate(&self) -> Result<(), SearchError> {
        if self.start_line == 0 {
            return Err(SearchError::InvalidArgs(
                "start line must be 1 or more".into(),
            ));
        }
        if let Some(end) = self.end_line {
            if end < self.start_line {
                return Err(SearchError::InvalidArgs(format!(
                    "end line {end} is before start line {}",
                    self.start_line
                )));
            }
        }
        Ok(())
    }
}

/// Scan a file on disk with positional reads bounded by the size seen at open.
pub fn scan_file(path: &Path, req: ScanRequest) -> Result<ScanResult, SearchError> {
    req.validate()?;
    let file = super::open_regular(path)?;
    let meta = file.metadata().map_err(|e| SearchError::from_io(path, e))?;
    scan_reader_at(&file, meta.len(), req).map_err(|e| SearchError::from_io(path, e))
}

/// Scan the first `size` bytes of anything readable by offset.
pub fn scan_reader_at(file: &File, size: u64, req: ScanRequest) -> io::Result<ScanResult> {
    scan_reader_at_until(file, size, req, &super::cancel::Cancel::never())
}

/// [`scan_reader_at`] that stops with an error once `cancel` fires (checked every chunk: the
/// whole file is read to count its lines, and a file can be huge).
pub fn scan_reader_at_until(
    file: &File,
    size: u64,
    req: ScanRequest,
    cancel: &super::cancel::Cancel,
) -> io::Result<ScanResult> {
    let mut window = LineWindow::new(req);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut offset = 0u64;
    while offset < size {
        if cancel.is_cancelled() {
            return Err(io::Error::other("scan cancelled"));
        }
        let want = (size - offset).min(READ_CHUNK as u64) as usize;
        let n = match file.read_at(&mut buf[..want], offset) {
            Ok(0) => break, // the file shrank: scan what was there
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        window.feed(&buf[..n]);
        offset += n as u64;
    }
    Ok(window.finish())
}

/// The scan state machine: feed it the file in chunks of any size, then `finish`.
#[derive(Debug)]
pub struct LineWindow {
    req: ScanRequest,
    /// Bytes fed so far (raw, BOM included).
    total_bytes: u64,
    /// The first bytes, held until we know whether they are a BOM.
    head: Vec<u8>,
    head_decided: bool,
    /// 1-based number of the line being read.
    line_no: u64,
    /// Length so far of the line being read.
    line_len: u64,
    /// Bytes of the line being read, kept only while it may still join the window.
    line_buf: Vec<u8>,
    lines: Vec<Vec<u8>>,
    /// Cost of the window so far (lines plus joining newlines).
    used: u64,
    window_closed: bool,
    first_line_bytes: u64,
}

impl LineWindow {
    pub fn new(req: ScanRequest) -> Self {
        LineWindow {
            req,
            total_bytes: 0,
            head: Vec::with_capacity(BOM.len()),
            head_decided: false,
            line_no: 1,
            line_len: 0,
            line_buf: Vec::new(),
            lines: Vec::new(),
            used: 0,
            window_closed: false,
            first_line_bytes: 0,
        }
    }

    pub fn feed(&mut self, mut chunk: &[u8]) {
        self.total_bytes += chunk.len() as u64;
        if !self.head_decided {
            let take = (BOM.len() - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if !BOM.starts_with(&self.head) || self.head.len() == BOM.len() {
                self.decide_head();
            } else {
                return; // still a possible BOM prefix; wait for more bytes
            }
        }
        self.feed_text(chunk);
    }

    fn decide_head(&mut self) {
        self.head_decided = true;
        let head = std::mem::take(&mut self.head);
        if head.as_slice() != BOM {
            self.feed_text(&head);
        }
    }

    /// Is the line being read inside the requested range and the window still open?
    fn collecting(&self) -> bool {
        !self.window_closed
            && self.line_no >= self.req.start_line
            && self.req.end_line.is_none_or(|end| self.line_no <= end)
    }

    /// Budget left for the current line's bytes if it is to join the window.
    fn budget_for_line(&self) -> u64 {
        let joiner = u64::from(!self.lines.is_empty());
        self.req.max_bytes.saturating_sub(self.used + joiner)
    }

    fn feed_text(&mut self, mut text: &[u8]) {
        while !text.is_empty() {
            if self.line_no < self.req.start_line {
                text = self.skip_to_start(text);
                continue;
            }
            // Past the window with nothing left to learn but the line count: count newlines fast.
            if self.line_no > self.req.start_line && !self.collecting() {
                self.count_lines(text);
                return;
            }
            let (part, ends_line) = match memchr::memchr(b'\n', text) {
                Some(i) => (&text[..i], true),
                None => (text, false),
            };
            self.line_len += part.len() as u64;
            if self.collecting() && self.line_buf.len() as u64 <= self.budget_for_line() {
                let room = self.budget_for_line() + 1 - self.line_buf.len() as u64;
                // Keep at most one byte past the budget: enough to know the line does not fit.
                let keep = (part.len() as u64).min(room) as usize;
                self.line_buf.extend_from_slice(&part[..keep]);
            }
            if ends_line {
                self.end_line();
                text = &text[part.len() + 1..];
            } else {
                text = &[];
            }
        }
    }

    /// Skip whole lines before the window; returns what is left of `text` once the start line
    /// begins (or nothing, when `text` ends first).
    fn skip_to_start<'a>(&mut self, text: &'a [u8]) -> &'a [u8] {
        let need = self.req.start_line - self.line_no;
        let mut seen = 0u64;
        let mut last_nl = None;
        for i in memchr::memchr_iter(b'\n', text) {
            seen += 1;
            last_nl = Some(i);
            if seen == need {
                break;
            }
        }
        self.line_no += seen;
        match last_nl {
            Some(i) if seen == need => {
                self.line_len = 0;
                &text[i + 1..]
            }
            Some(i) => {
                self.line_len = (text.len() - i - 1) as u64;
                &[]
            }
            None => {
                self.line_len += text.len() as u64;
                &[]
            }
        }
    }

    fn count_lines(&mut self, text: &[u8]) {
        match memchr::memrchr(b'\n', text) {
            None => self.line_len += text.len() as u64,
            Some(last_nl) => {
                self.line_no += memchr::memchr_iter(b'\n', text).count() as u64;
                self.line_len = (text.len() - last_nl - 1) as u64;
            }
        }
    }

    fn end_line(&mut self) {
        if self.line_no == self.req.start_line {
            self.first_line_bytes = self.line_len;
        }
        if self.collecting() {
            let joiner = u64::from(!self.lines.is_empty());
            if self.used + joiner + self.line_len <= self.req.max_bytes {
                self.used += joiner + self.line_len;
                self.lines.push(std::mem::take(&mut self.line_buf));
            } else {
                self.window_closed = true;
            }
        }
        self.line_buf.clear();
        self.line_no += 1;
        self.line_len = 0;
    }

    pub fn finish(mut self) -> ScanResult {
        if !self.head_decided {
            self.decide_head();
        }
        // A last line without its newline is still a line; nothing after a final `\n` is.
        if self.line_len > 0 {
            self.end_line();
        }
        let total_lines = self.line_no - 1;
        let start_line = self.req.start_line;
        ScanResult {
            end_line: (start_line + self.lines.len() as u64).saturating_sub(1),
            lines: self.lines,
            start_line,
            total_lines,
            total_bytes: self.total_bytes,
            first_line_bytes: self.first_line_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(content: &[u8], start: u64, end: Option<u64>, max: u64) -> ScanResult {
        let req = ScanRequest {
            start_line: start,
            end_line: end,
            max_bytes: max,
        };
        let mut w = LineWindow::new(req);
        w.feed(content);
        w.finish()
    }

    #[test]
    fn window_is_greedy_and_whole_lines() {
        let r = run(b"aa\nbbb\ncccc\n", 1, None, 6);
        assert_eq!(r.lines, vec![b"aa".to_vec(), b"bbb".to_vec()]);
        assert_eq!((r.start_line, r.end_line, r.total_lines), (1, 2, 3));
        assert_eq!(r.first_line_bytes, 2);
    }

    #[test]
    fn a_line_longer_than_the_budget_returns_nothing_but_its_size() {
        let r = run(b"0123456789\nx\n", 1, None, 4);
        assert!(r.lines.is_empty());
        assert_eq!((r.end_line, r.first_line_bytes), (0, 10));
    }

    #[test]
    fn bom_split_across_chunks_is_still_a_bom() {
        let req = ScanRequest {
            start_line: 1,
            end_line: None,
            max_bytes: 100,
        };
        let mut w = LineWindow::new(req);
        for b in b"\xEF\xBB\xBFhi\n" {
            w.feed(std::slice::from_ref(b));
        }
        let r = w.finish();
        assert_eq!(r.lines, vec![b"hi".to_vec()]);
        assert_eq!(r.total_bytes, 6);
    }
}
