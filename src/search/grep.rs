//! `grep`: content matches with positions and context, over a file or a tree walked once.
//!
//! The walk is [`walk_files`] (ripgrep's `ignore`), the searching is ripgrep's own
//! `grep-searcher` + `grep-regex`, so results agree with `rg --json --sort path
//! --no-require-git` on the same tree. A match is one matching line: its first submatch gives
//! the column, and every submatch is listed.
//!
//! Results stream: each finished match goes to the caller's sink, which can stop the search by
//! returning `false`. A match is finished once its after-context is known, so matches come out in
//! file order, files in walk order.
//!
//! Context: the searcher emits every line within N of a match exactly once (as a match or as
//! context), so a ring of the last N emitted lines holds a match's before-context, and matches
//! waiting for their after-context collect the lines that follow.

use std::collections::VecDeque;
use std::path::Path;

use base64::Engine;
use grep_matcher::Matcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use serde::Serialize;

use super::walk::{walk_files, WalkOptions};
use super::SearchError;

/// Longest pattern accepted: a pattern is typed or generated, not a document.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// Compiled-regex and lazy-DFA size limits: a pattern like `(a{1000}){1000}` is refused with a
/// clear error instead of taking memory without bound (the regex engine is linear-time, so
/// time is bounded by input size once compiled).
pub const REGEX_SIZE_LIMIT: usize = 16 * 1024 * 1024;
pub const DFA_SIZE_LIMIT: usize = 16 * 1024 * 1024;
/// Context lines are for reading around a match, not for dumping files.
pub const MAX_CONTEXT_LINES: usize = 1000;

#[derive(Debug, Clone, Default)]
pub struct GrepOptions {
    pub pattern: String,
    /// Treat the pattern as a literal string.
    pub fixed_strings: bool,
    pub case_insensitive: bool,
    pub before_context: usize,
    pub after_context: usize,
    /// Search files that contain NUL bytes too (ripgrep's `--text`).
    pub binary: bool,
    pub walk: WalkOptions,
    /// Stop after this many matches (`truncated: true` if more exist).
    pub max_results: Option<u64>,
    /// Stop before the matches' text (lines and context) would exceed this many bytes.
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrepMatch {
    pub path: String,
    /// 1-based line number.
    pub line: u64,
    /// 1-based byte column of the first match in the line.
    pub column: u64,
    /// The line without its `\n` (invalid UTF-8 replaced by U+FFFD; see `text_base64`).
    pub text: String,
    /// The exact bytes of the line, present only when it is not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_base64: Option<String>,
    /// Byte ranges `[start, end)` of every match in the line.
    pub submatches: Vec<[u64; 2]>,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GrepSummary {
    pub matches: u64,
    pub files_searched: u64,
    pub files_matched: u64,
    /// Bytes of match and context text returned.
    pub bytes: u64,
    /// The search stopped at a cap (or the consumer stopped it) before the end.
    pub truncated: bool,
    /// Files or directories that could not be read.
    pub errors: Vec<String>,
}

/// Build the matcher once; reused by the agent for every file of a search.
pub fn build_matcher(opts: &GrepOptions) -> Result<RegexMatcher, SearchError> {
    if opts.pattern.len() > MAX_PATTERN_BYTES {
        return Err(SearchError::LimitExceeded(format!(
            "pattern is {} bytes; the limit is {MAX_PATTERN_BYTES}",
            opts.pattern.len()
        )));
    }
    let mut b = RegexMatcherBuilder::new();
    b.case_insensitive(opts.case_insensitive)
        .line_terminator(Some(b'\n'))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(DFA_SIZE_LIMIT);
    let pattern = if opts.fixed_strings {
        regex::escape(&opts.pattern)
    } else {
        opts.pattern.clone()
    };
    b.build(&pattern)
        .map_err(|e| SearchError::Regex(e.to_string()))
}

/// Search `root` (a file or a directory), sending each match to `sink` until it returns `false`.
pub fn grep(
    root: &Path,
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepMatch) -> bool,
) -> Result<GrepSummary, SearchError> {
    if opts.before_context > MAX_CONTEXT_LINES || opts.after_context > MAX_CONTEXT_LINES {
        return Err(SearchError::LimitExceeded(format!(
            "context is limited to {MAX_CONTEXT_LINES} lines"
        )));
    }
    let matcher = build_matcher(opts)?;
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .before_context(opts.before_context)
        .after_context(opts.after_context)
        .binary_detection(if opts.binary {
            BinaryDetection::none()
        } else {
            BinaryDetection::quit(b'\x00')
        })
        .build();
    let mut state = SearchState {
        opts,
        summary: GrepSummary::default(),
        stopped: false,
        sink,
    };
    let errors = std::cell::RefCell::new(Vec::new());
    walk_files(
        root,
        &opts.walk,
        |file| {
            state.summary.files_searched += 1;
            let mut file_sink = FileSink {
                path: file.relative,
                matcher: &matcher,
                state: &mut state,
                ring: VecDeque::new(),
                pending: VecDeque::new(),
                matched_any: false,
            };
            let result = searcher.search_path(&matcher, &file.path, &mut file_sink);
            file_sink.flush_all();
            if file_sink.matched_any {
                file_sink.state.summary.files_matched += 1;
            }
            if let Err(e) = result {
                errors
                    .borrow_mut()
                    .push(format!("{}: {e}", file.path.display()));
            }
            !state.stopped
        },
        |e| errors.borrow_mut().push(e),
    )?;
    state.summary.errors = errors.into_inner();
    Ok(state.summary)
}

struct SearchState<'a> {
    opts: &'a GrepOptions,
    summary: GrepSummary,
    stopped: bool,
    sink: &'a mut dyn FnMut(GrepMatch) -> bool,
}

impl SearchState<'_> {
    fn emit(&mut self, m: GrepMatch) {
        if self.stopped {
            return;
        }
        if !(self.sink)(m) {
            self.stopped = true;
            self.summary.truncated = true;
        }
    }
}

struct FileSink<'s, 'a> {
    path: String,
    matcher: &'s RegexMatcher,
    state: &'s mut SearchState<'a>,
    /// The last `before_context` lines the searcher emitted, with their numbers.
    ring: VecDeque<(u64, Vec<u8>)>,
    /// Matches still collecting after-context.
    pending: VecDeque<GrepMatch>,
    matched_any: bool,
}

impl FileSink<'_, '_> {
    /// Record a line the searcher emitted (match or context): it is after-context for pending
    /// matches and a candidate before-context for the next one.
    fn saw_line(&mut self, line_no: u64, text: &[u8]) {
        let after = self.state.opts.after_context as u64;
        for m in self.pending.iter_mut() {
            if line_no > m.line && line_no <= m.line + after {
                m.after.push(lossy(text));
                self.state.summary.bytes += text.len() as u64;
            }
        }
        self.flush_done(line_no);
        let before = self.state.opts.before_context;
        if before > 0 {
            if self.ring.len() == before {
                self.ring.pop_front();
            }
            self.ring.push_back((line_no, text.to_vec()));
        }
    }

    /// Emit pending matches whose after-context window ends at or before `line_no`.
    fn flush_done(&mut self, line_no: u64) {
        let after = self.state.opts.after_context as u64;
        while let Some(m) = self.pending.front() {
            if m.line + after > line_no {
                break;
            }
            let m = self.pending.pop_front().expect("front exists");
            self.state.emit(m);
        }
    }

    fn flush_all(&mut self) {
        while let Some(m) = self.pending.pop_front() {
            self.state.emit(m);
        }
    }

    fn on_match_line(&mut self, line_no: u64, line: &[u8]) -> bool {
        let opts = self.state.opts;
        let summary = &self.state.summary;
        if opts.max_results.is_some_and(|max| summary.matches >= max) {
            self.state.summary.truncated = true;
            return false;
        }
        let min_line = line_no.saturating_sub(opts.before_context as u64);
        let before: Vec<&[u8]> = self
            .ring
            .iter()
            .filter(|(n, _)| *n >= min_line && *n < line_no)
            .map(|(_, t)| t.as_slice())
            .collect();
        let cost = line.len() as u64 + before.iter().map(|t| t.len() as u64).sum::<u64>();
        if opts.max_bytes.is_some_and(|max| summary.bytes + cost > max) {
            self.state.summary.truncated = true;
            return false;
        }
        let mut submatches = Vec::new();
        let _ = self.matcher.find_iter(line, |m| {
            submatches.push([m.start() as u64, m.end() as u64]);
            true
        });
        let column = submatches.first().map_or(1, |s| s[0] + 1);
        let text_base64 = std::str::from_utf8(line)
            .is_err()
            .then(|| base64::engine::general_purpose::STANDARD.encode(line));
        let m = GrepMatch {
            path: self.path.clone(),
            line: line_no,
            column,
            text: lossy(line),
            text_base64,
            submatches,
            before: before.into_iter().map(lossy).collect(),
            after: Vec::new(),
        };
        self.state.summary.matches += 1;
        self.state.summary.bytes += cost;
        self.matched_any = true;
        // This line is after-context of earlier matches before it is a match of its own.
        self.saw_line(line_no, line);
        self.pending.push_back(m);
        self.flush_done(line_no);
        !self.state.stopped
    }
}

impl Sink for FileSink<'_, '_> {
    type Error = std::io::Error;

    fn matched(&mut self, _s: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        let first = mat.line_number().unwrap_or(0);
        for (line_no, line) in (first..).zip(mat.lines()) {
            if !self.on_match_line(line_no, strip_newline(line)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn context(&mut self, _s: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, Self::Error> {
        if let Some(n) = ctx.line_number() {
            self.saw_line(n, strip_newline(ctx.bytes()));
        }
        Ok(!self.state.stopped)
    }
}

fn strip_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
