//! `grep`: content matches with positions and context, over a file or a tree walked once.
//!
//! The walk is [`walk_files`] (ripgrep's `ignore`; in the agent, [`walk_source`] beneath the
//! workspace's descriptor, see [`grep_beneath`]), the searching is ripgrep's own
//! `grep-searcher` + `grep-regex`, so results agree with `rg --json --sort path
//! --no-require-git` on the same tree. A match is one matching line: its first submatch gives
//! the column, and every submatch is listed.
//!
//! Results stream: each finished match goes to the caller's sink, which can stop the search by
//! returning `false`. With [`GrepOptions::print`] each file is instead printed as ripgrep prints
//! it ([`super::print`]) and the sink gets one [`GrepItem::Printed`] per file. A match is finished once its after-context is known, so matches come out in
//! file order, files in walk order.
//!
//! Context: the searcher emits every line within N of a match exactly once (as a match or as
//! context), so a ring of the last N emitted lines holds a match's before-context, and matches
//! waiting for their after-context collect the lines that follow.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

use base64::Engine;
use grep_matcher::Matcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use serde::{Deserialize, Serialize};

use super::beneath::Beneath;
use super::cancel::{Cancel, Guarded};
use super::print::{self, Haystack, PrintOptions, PrintedFile};
use super::walk::{walk_files, walk_source, SourceFile, TreeSource, WalkOptions, WalkedFile};
use super::SearchError;

/// Where a search's files come from: a local path, or a tree reached through one descriptor
/// (the agent's workspace, where every open stays beneath the root).
#[derive(Clone, Copy)]
enum Files<'a> {
    Local(&'a Path),
    Beneath(&'a Beneath, &'a [u8]),
}

impl Files<'_> {
    fn check_root(&self) -> Result<(), SearchError> {
        match self {
            Files::Local(root) => std::fs::metadata(root)
                .map(|_| ())
                .map_err(|e| SearchError::from_io(root, e)),
            Files::Beneath(tree, root) => match tree.kind(root) {
                Some(_) => Ok(()),
                None => Err(SearchError::NotFound(
                    String::from_utf8_lossy(root).into_owned(),
                )),
            },
        }
    }

    fn walk(
        &self,
        opts: &WalkOptions,
        visit: &mut dyn FnMut(WalkedFile) -> bool,
        on_error: &mut dyn FnMut(String),
    ) -> Result<(), SearchError> {
        match self {
            Files::Local(root) => walk_files(root, opts, visit, on_error),
            Files::Beneath(tree, root) => walk_source(*tree, root, opts, |f| visit(walked(f))),
        }
    }

    /// Open a file the walk found: a regular file or an error, never anything else.
    fn open(&self, file: &WalkedFile) -> Result<std::fs::File, SearchError> {
        match self {
            Files::Local(_) => super::open_regular(&file.path),
            Files::Beneath(tree, _) => {
                use std::os::unix::ffi::OsStrExt;
                let shown = file.path.display().to_string();
                tree.open_file(file.path.as_os_str().as_bytes())
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::InvalidInput => {
                            SearchError::ReadFailed(shown, "not a regular file".into())
                        }
                        std::io::ErrorKind::IsADirectory => SearchError::IsADirectory(shown),
                        _ => SearchError::from_io(&file.path, e),
                    })
            }
        }
    }

    fn cancel(&self) -> Cancel {
        match self {
            Files::Local(_) => Cancel::never(),
            Files::Beneath(tree, _) => tree.cancel().clone(),
        }
    }
}

/// A file of a [`Beneath`] walk: its path is relative to the tree's root descriptor.
fn walked(f: SourceFile) -> WalkedFile {
    use std::os::unix::ffi::OsStrExt;
    WalkedFile {
        path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&f.path)),
        relative: f.relative,
        relative_bytes: f.relative_bytes,
        explicit: f.explicit,
    }
}

/// Longest pattern accepted: a pattern is typed or generated, not a document.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// Compiled-regex and lazy-DFA size limits: a pattern like `(a{1000}){1000}` is refused with a
/// clear error instead of taking memory without bound (the regex engine is linear-time, so
/// time is bounded by input size once compiled).
pub const REGEX_SIZE_LIMIT: usize = 16 * 1024 * 1024;
pub const DFA_SIZE_LIMIT: usize = 16 * 1024 * 1024;
/// Context lines are for reading around a match, not for dumping files.
pub const MAX_CONTEXT_LINES: usize = 1000;
/// The most one file's search may buffer: its longest line with the context around it. A
/// file with a longer line (a 1.5 GB minified blob) is reported as an error and skipped, so
/// a search's memory is bounded by this times its threads, whatever the files.
pub const MAX_LINE_BUFFER_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Files searched at once; 0 picks one per core (at most [`MAX_AUTO_THREADS`]).
    pub threads: usize,
    /// ripgrep `-w`: only matches surrounded by word boundaries.
    pub word: bool,
    /// ripgrep `-v`: select the lines that do not match.
    pub invert: bool,
    /// ripgrep `-S`: case-insensitive unless the pattern has an uppercase letter.
    pub smart_case: bool,
    /// ripgrep `--binary` (and `-uuu`): search binary files the walk finds too, up to their
    /// first NUL after a match.
    pub search_binary: bool,
    /// Answer with ripgrep's text output, one [`PrintedFile`] per file, instead of matches.
    pub print: Option<PrintOptions>,
    /// ripgrep `-m`: at most this many matching lines of each file.
    pub max_count: Option<u64>,
    /// ripgrep `-U`: a match may span lines (`\n` in the pattern matches a line's end).
    pub multiline: bool,
}

/// What a search yields: a match, or (with [`GrepOptions::print`]) one file's printed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrepItem {
    Match(GrepMatch),
    Printed(PrintedFile),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    pub path: String,
    /// 1-based line number.
    pub line: u64,
    /// 1-based byte column of the first match in the line.
    pub column: u64,
    /// The line without its `\n` (invalid UTF-8 replaced by U+FFFD; see `text_base64`).
    pub text: String,
    /// The exact bytes of the line, present only when it is not valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_base64: Option<String>,
    /// Byte ranges `[start, end)` of every match in the line.
    pub submatches: Vec<[u64; 2]>,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
        .case_smart(opts.smart_case)
        .word(opts.word)
        // As rg: across lines with -U (`^` and `$` still at each line's ends), else a line
        // at a time.
        .multi_line(opts.multiline)
        .line_terminator((!opts.multiline).then_some(b'\n'))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(DFA_SIZE_LIMIT);
    let pattern = if opts.fixed_strings {
        regex::escape(&opts.pattern)
    } else {
        opts.pattern.clone()
    };
    b.build(&pattern)
        .map_err(|e| SearchError::Regex(regex_error(&pattern, e)))
}

/// A regex error in terms of the user's pattern: the matcher reports it against the pattern
/// it wrapped (`(?:foo()`), so the pattern alone is parsed again for the message.
fn regex_error(pattern: &str, wrapped: grep_regex::Error) -> String {
    match regex_syntax::Parser::new().parse(pattern) {
        Err(regex_syntax::Error::Parse(e)) => format!(
            "{pattern}: {} (at column {})",
            e.kind(),
            e.span().start.column
        ),
        Err(regex_syntax::Error::Translate(e)) => format!(
            "{pattern}: {} (at column {})",
            e.kind(),
            e.span().start.column
        ),
        // Valid but not accepted (too big): the matcher's message, after the user's pattern.
        _ => format!("{pattern}: {}", wrapped.to_string().replace('\n', " ")),
    }
}

/// Search `root` (a file or a directory), sending each match to `sink` until it returns `false`.
///
/// Files are searched in parallel (`threads` workers) but matches reach `sink` in walk order:
/// a reorder buffer holds finished batches of files until every earlier one is done, and at
/// most [`BATCHES_IN_FLIGHT`] batches are walked ahead of the one being emitted, so memory stays
/// bounded whatever the tree.
pub fn grep(
    root: &Path,
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepMatch) -> bool,
) -> Result<GrepSummary, SearchError> {
    grep_items(root, opts, &mut |item| match item {
        GrepItem::Match(m) => sink(m),
        GrepItem::Printed(_) => true,
    })
}

/// [`grep`], yielding printed files too when [`GrepOptions::print`] asks for them.
pub fn grep_items(
    root: &Path,
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepItem) -> bool,
) -> Result<GrepSummary, SearchError> {
    grep_files(Files::Local(root), opts, sink)
}

/// [`grep_items`] over `root` (a path relative to the tree's root) of a [`Beneath`] tree: every
/// directory and file is opened beneath the tree's root descriptor, and the search stops soon
/// after the tree's [`Cancel`] fires (the summary then says `truncated`).
pub fn grep_beneath(
    tree: &Beneath,
    root: &[u8],
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepItem) -> bool,
) -> Result<GrepSummary, SearchError> {
    let mut summary = grep_files(Files::Beneath(tree, root), opts, sink)?;
    summary.truncated |= tree.cancel().is_cancelled();
    Ok(summary)
}

fn grep_files(
    files: Files<'_>,
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepItem) -> bool,
) -> Result<GrepSummary, SearchError> {
    check_context(opts)?;
    let matcher = build_matcher(opts)?;
    files.check_root()?;
    let cancel = files.cancel();
    // Never more threads than cores, whatever is asked: more only contend (and thousands
    // would exhaust the process's thread limit).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match opts.threads {
        0 => cores.min(MAX_AUTO_THREADS),
        n => n.min(cores),
    };
    let stop = AtomicBool::new(false);
    let (work_tx, work_rx) = mpsc::sync_channel::<(usize, Vec<WalkedFile>)>(BATCHES_IN_FLIGHT);
    let work_rx = Mutex::new(work_rx);
    // A counting semaphore: one slot per batch walked but not yet emitted.
    let (slot_tx, slot_rx) = mpsc::sync_channel::<()>(BATCHES_IN_FLIGHT);
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut redo = |file: &WalkedFile, max: u64| {
        let mut searcher = new_searcher(opts);
        search_file(
            &mut searcher,
            &matcher,
            opts,
            files,
            &cancel,
            file.clone(),
            Some(max),
        )
    };
    let mut emitter = Emitter {
        opts,
        sink,
        summary: GrepSummary::default(),
        stopped: false,
        redo: Some(&mut redo),
    };
    let mut spawn_error: Option<std::io::Error> = None;
    std::thread::scope(|scope| {
        // Threads the system refuses (a pids limit) are done without; none at all is an error.
        let mut spawned = 0;
        for _ in 0..threads {
            let (done_tx, work_rx, matcher) = (done_tx.clone(), &work_rx, &matcher);
            let (stop, opts, cancel) = (&stop, &opts, &cancel);
            let worker = std::thread::Builder::new().spawn_scoped(scope, move || {
                let mut searcher = new_searcher(opts);
                loop {
                    let job = work_rx.lock().expect("work queue lock").recv();
                    let Ok((index, batch)) = job else { break };
                    let results = batch
                        .into_iter()
                        .map(|file| {
                            if stop.load(Ordering::Relaxed) || cancel.is_cancelled() {
                                FileResult::default()
                            } else {
                                search_file(
                                    &mut searcher,
                                    matcher,
                                    opts,
                                    files,
                                    cancel,
                                    file,
                                    opts.max_results,
                                )
                            }
                        })
                        .collect();
                    if done_tx.send(Done::Batch { index, results }).is_err() {
                        break;
                    }
                }
            });
            match worker {
                Ok(_) => spawned += 1,
                Err(e) => {
                    spawn_error.get_or_insert(e);
                    break;
                }
            }
        }
        if spawned == 0 {
            return;
        }
        spawn_error = None;
        let walk_done = done_tx.clone();
        let (stop, opts) = (&stop, &opts);
        let walker = std::thread::Builder::new().spawn_scoped(scope, move || {
            let mut batches = 0;
            let mut batch = Vec::with_capacity(FILES_PER_BATCH);
            let mut errors = Vec::new();
            let send = |batch: Vec<WalkedFile>, batches: &mut usize| {
                if stop.load(Ordering::Relaxed)
                    || slot_tx.send(()).is_err()
                    || work_tx.send((*batches, batch)).is_err()
                {
                    return false;
                }
                *batches += 1;
                true
            };
            let walked = files.walk(
                &opts.walk,
                &mut |file| {
                    batch.push(file);
                    batch.len() < FILES_PER_BATCH || send(std::mem::take(&mut batch), &mut batches)
                },
                &mut |e| errors.push(e),
            );
            if !batch.is_empty() {
                send(batch, &mut batches);
            }
            if let Err(e) = walked {
                errors.push(e.to_string());
            }
            drop(work_tx);
            let _ = walk_done.send(Done::Walk { batches, errors });
        });
        if let Err(e) = walker {
            // The workers see the queue closed (its sender went with the walker) and end.
            spawn_error = Some(e);
            return;
        }
        drop(done_tx);
        emitter.run(done_rx, slot_rx, stop);
    });
    if let Some(e) = spawn_error {
        return Err(SearchError::LimitExceeded(format!(
            "the search could not start a thread ({e}); try again later"
        )));
    }
    Ok(emitter.summary)
}

/// [`grep`] over a [`TreeSource`] (the in-memory sandbox) instead of a local directory: the
/// same walk rules ([`walk_source`]), matching, context and caps, searching each file's bytes
/// in walk order on the calling thread.
pub fn grep_source(
    source: &dyn TreeSource,
    root: &[u8],
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepMatch) -> bool,
) -> Result<GrepSummary, SearchError> {
    grep_source_items(source, root, opts, &mut |item| match item {
        GrepItem::Match(m) => sink(m),
        GrepItem::Printed(_) => true,
    })
}

/// [`grep_source`], yielding printed files too when [`GrepOptions::print`] asks for them.
pub fn grep_source_items(
    source: &dyn TreeSource,
    root: &[u8],
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepItem) -> bool,
) -> Result<GrepSummary, SearchError> {
    check_context(opts)?;
    let matcher = build_matcher(opts)?;
    let mut searcher = new_searcher(opts);
    let mut emitter = Emitter::new(opts, sink);
    walk_source(source, root, &opts.walk, |file| {
        let result = match source.content(&file.path) {
            Some(bytes) => match &opts.print {
                // One file at a time: the matches still allowed are known exactly.
                Some(p) => print_with(
                    &mut searcher,
                    &matcher,
                    opts,
                    p,
                    remaining(opts, &emitter.summary),
                    &p.shown_path(&file.relative_bytes, file.explicit),
                    file.explicit,
                    Haystack::Bytes(&bytes),
                ),
                None => search_with(&matcher, opts, file.relative, |sink| {
                    searcher.search_slice(&matcher, &bytes, sink)
                }),
            },
            None => FileResult {
                error: Some(format!("{}: could not be read", file.relative)),
                ..Default::default()
            },
        };
        emitter.emit_file(result);
        !emitter.stopped
    })?;
    Ok(emitter.summary)
}

/// Context beyond [`MAX_CONTEXT_LINES`] is refused before any search.
fn check_context(opts: &GrepOptions) -> Result<(), SearchError> {
    if opts.before_context > MAX_CONTEXT_LINES || opts.after_context > MAX_CONTEXT_LINES {
        return Err(SearchError::LimitExceeded(format!(
            "context is limited to {MAX_CONTEXT_LINES} lines"
        )));
    }
    Ok(())
}

/// [`grep_items`] over bytes in hand (a pipe on stdin): one file, named `shown`.
pub fn grep_bytes(
    bytes: &[u8],
    shown: &str,
    opts: &GrepOptions,
    sink: &mut dyn FnMut(GrepItem) -> bool,
) -> Result<GrepSummary, SearchError> {
    check_context(opts)?;
    let matcher = build_matcher(opts)?;
    let mut searcher = new_searcher(opts);
    let mut emitter = Emitter::new(opts, sink);
    let result = match &opts.print {
        Some(p) => print_with(
            &mut searcher,
            &matcher,
            opts,
            p,
            remaining(opts, &emitter.summary),
            Path::new(shown),
            true,
            Haystack::Bytes(bytes),
        ),
        None => search_with(&matcher, opts, shown.to_string(), |sink| {
            searcher.search_slice(&matcher, bytes, sink)
        }),
    };
    emitter.emit_file(result);
    Ok(emitter.summary)
}

/// Workers used when `threads` is 0: past this, one disk and one walker are the bottleneck.
pub const MAX_AUTO_THREADS: usize = 8;
/// Files handed to a worker at once: one channel hand-off per file costs more than searching
/// a small file (futex wake-ups dominated a tree of 50k small files).
pub const FILES_PER_BATCH: usize = 32;
/// Batches walked ahead of the first one not yet emitted: bounds the reorder buffer to
/// `FILES_PER_BATCH * BATCHES_IN_FLIGHT` files' results.
pub const BATCHES_IN_FLIGHT: usize = 8;

enum Done {
    Batch {
        index: usize,
        results: Vec<FileResult>,
    },
    Walk {
        batches: usize,
        errors: Vec<String>,
    },
}

#[derive(Default)]
struct FileResult {
    matches: Vec<GrepMatch>,
    /// With [`GrepOptions::print`]: the file's output.
    printed: Option<PrintedFile>,
    /// The file, for printing it again with fewer matches allowed (see [`Emitter::redo`]).
    file: Option<WalkedFile>,
    searched: bool,
    error: Option<String>,
}

/// Matches a search may still yield.
fn remaining(opts: &GrepOptions, summary: &GrepSummary) -> Option<u64> {
    opts.max_results.map(|m| m.saturating_sub(summary.matches))
}

fn new_searcher(opts: &GrepOptions) -> Searcher {
    if let Some(p) = &opts.print {
        return print::searcher(opts, p);
    }
    SearcherBuilder::new()
        .invert_match(opts.invert)
        .multi_line(opts.multiline)
        .line_number(true)
        .before_context(opts.before_context)
        .after_context(opts.after_context)
        .binary_detection(if opts.binary {
            BinaryDetection::none()
        } else {
            BinaryDetection::quit(b'\x00')
        })
        .heap_limit(Some(MAX_LINE_BUFFER_BYTES))
        .build()
}

fn search_file(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    opts: &GrepOptions,
    files: Files<'_>,
    cancel: &Cancel,
    file: WalkedFile,
    max_matches: Option<u64>,
) -> FileResult {
    let shown = file.path.display().to_string();
    // The walk yields regular files only, but one may have been replaced since (a FIFO would
    // block the search): open it without blocking and look before reading. The searcher
    // reads this descriptor, never the path again.
    let opened = match files.open(&file) {
        Ok(f) => f,
        Err(SearchError::ReadFailed(..) | SearchError::IsADirectory(_)) => {
            return FileResult::default()
        }
        Err(e) => {
            return FileResult {
                searched: true,
                error: Some(e.to_string()),
                ..Default::default()
            }
        }
    };
    let mut result = match &opts.print {
        Some(p) => {
            let mut r = print_with(
                searcher,
                matcher,
                opts,
                p,
                max_matches,
                &p.shown_path(&file.relative_bytes, file.explicit),
                file.explicit,
                Haystack::File(&opened, cancel),
            );
            r.file = Some(file);
            r
        }
        None => search_with(matcher, opts, file.relative, |sink| {
            let reader = Guarded {
                inner: &opened,
                cancel,
            };
            searcher.search_reader(matcher, reader, sink)
        }),
    };
    if cancel.is_cancelled() {
        // Stopped part-way: nothing of this file is reported.
        return FileResult::default();
    }
    if let Some(e) = &mut result.error {
        *e = format!("{shown}: {e}");
    }
    result
}

/// Search one file and print it (see [`print::print_file`]).
#[allow(clippy::too_many_arguments)]
fn print_with(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    opts: &GrepOptions,
    p: &PrintOptions,
    max_matches: Option<u64>,
    shown: &Path,
    explicit: bool,
    hay: Haystack<'_>,
) -> FileResult {
    match print::print_file(
        searcher,
        matcher,
        opts,
        p,
        max_matches,
        shown,
        explicit,
        &hay,
    ) {
        Ok(printed) => FileResult {
            printed: Some(printed),
            searched: true,
            ..Default::default()
        },
        Err(e) => FileResult {
            searched: true,
            error: Some(e.to_string()),
            ..Default::default()
        },
    }
}

/// Search one file through `search` (a path or a slice), collecting its matches.
fn search_with(
    matcher: &RegexMatcher,
    opts: &GrepOptions,
    relative: String,
    search: impl FnOnce(&mut FileSink<'_>) -> Result<(), std::io::Error>,
) -> FileResult {
    let mut sink = FileSink::new(relative, matcher, opts);
    let result = search(&mut sink);
    FileResult {
        matches: sink.into_matches(),
        searched: true,
        error: result.err().map(|e| e.to_string()),
        ..Default::default()
    }
}

/// Prints a file again allowing at most this many matches.
type Redo<'a> = &'a mut dyn FnMut(&WalkedFile, u64) -> FileResult;

/// The calling thread's side: puts finished files back in walk order, applies the caps and
/// feeds the caller's sink.
struct Emitter<'a> {
    opts: &'a GrepOptions,
    sink: &'a mut dyn FnMut(GrepItem) -> bool,
    summary: GrepSummary,
    stopped: bool,
    /// Print a file again allowing at most this many matches: a file printed in parallel
    /// may hold more than the matches left when its turn comes.
    redo: Option<Redo<'a>>,
}

impl<'a> Emitter<'a> {
    /// One file at a time, on the calling thread: nothing to print again.
    fn new(opts: &'a GrepOptions, sink: &'a mut dyn FnMut(GrepItem) -> bool) -> Self {
        Emitter {
            opts,
            sink,
            summary: GrepSummary::default(),
            stopped: false,
            redo: None,
        }
    }
}

impl Emitter<'_> {
    fn run(&mut self, done: mpsc::Receiver<Done>, slots: mpsc::Receiver<()>, stop: &AtomicBool) {
        let mut waiting: BTreeMap<usize, Vec<FileResult>> = BTreeMap::new();
        let mut next = 0;
        let mut total = None;
        while total.is_none_or(|t| next < t) {
            let Ok(msg) = done.recv() else { break };
            match msg {
                Done::Batch { index, results } => {
                    waiting.insert(index, results);
                }
                Done::Walk { batches, errors } => {
                    total = Some(batches);
                    self.summary.errors.extend(errors);
                }
            }
            while let Some(results) = waiting.remove(&next) {
                for result in results {
                    self.emit_file(result);
                }
                next += 1;
                let _ = slots.recv();
                if self.stopped {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        // Unblock the walker if it waits for a slot, then let the workers drain.
        drop(slots);
        stop.store(true, Ordering::Relaxed);
        for msg in done {
            if let Done::Walk { errors, .. } = msg {
                self.summary.errors.extend(errors);
            }
        }
    }

    fn emit_file(&mut self, mut result: FileResult) {
        if self.stopped {
            return;
        }
        if let Some(e) = result.error.take() {
            self.summary.errors.push(e);
        }
        if result.printed.is_some() {
            return self.emit_printed(result);
        }
        self.summary.files_searched += u64::from(result.searched);
        self.summary.files_matched += u64::from(!result.matches.is_empty());
        for m in result.matches {
            let cost = match_bytes(&m);
            let over_results = self
                .opts
                .max_results
                .is_some_and(|max| self.summary.matches >= max);
            let over_bytes = self
                .opts
                .max_bytes
                .is_some_and(|max| self.summary.bytes + cost > max);
            if over_results || over_bytes {
                self.summary.truncated = true;
                self.stopped = true;
                return;
            }
            self.summary.matches += 1;
            self.summary.bytes += cost;
            if !(self.sink)(GrepItem::Match(m)) {
                self.summary.truncated = true;
                self.stopped = true;
                return;
            }
        }
    }

    /// A printed file: counted whole against the caps (printed again with fewer matches when
    /// it holds more than are left; stopped before it when its text would pass `max_bytes`).
    fn emit_printed(&mut self, mut result: FileResult) {
        let mut printed = result.printed.take().unwrap_or_default();
        let left = remaining(self.opts, &self.summary);
        if let Some(left) = left.filter(|&left| printed.matches > left) {
            self.summary.truncated = true;
            self.stopped = true;
            match (left, &mut self.redo, &result.file) {
                (1.., Some(redo), Some(file)) => {
                    printed = redo(file, left).printed.unwrap_or_default();
                }
                _ => return,
            }
        }
        let cost = printed.printed.0.len() as u64;
        if printed.over_cap
            || self
                .opts
                .max_bytes
                .is_some_and(|max| self.summary.bytes + cost > max)
        {
            self.summary.truncated = true;
            self.stopped = true;
            return;
        }
        self.summary.files_searched += u64::from(result.searched);
        self.summary.files_matched += u64::from(printed.matches > 0);
        self.summary.matches += printed.matches;
        self.summary.bytes += cost;
        if !printed.printed.0.is_empty() && !(self.sink)(GrepItem::Printed(printed)) {
            self.summary.truncated = true;
            self.stopped = true;
        }
    }
}

/// What a match costs against `max_bytes`: the text of its line and of its context lines.
fn match_bytes(m: &GrepMatch) -> u64 {
    let context: usize = m.before.iter().chain(&m.after).map(String::len).sum();
    (m.text.len() + context) as u64
}

/// One worker's view of one file: collects its matches with their context. A file stops once it
/// holds more than the caps allow, so one huge file cannot fill memory; the emitter decides.
pub(crate) struct FileSink<'s> {
    path: String,
    matcher: &'s RegexMatcher,
    opts: &'s GrepOptions,
    /// The last `before_context` lines the searcher emitted, with their numbers.
    ring: VecDeque<(u64, Vec<u8>)>,
    /// Matches still collecting after-context.
    pending: VecDeque<GrepMatch>,
    done: Vec<GrepMatch>,
    bytes: u64,
}

impl<'s> FileSink<'s> {
    pub(crate) fn new(path: String, matcher: &'s RegexMatcher, opts: &'s GrepOptions) -> Self {
        FileSink {
            path,
            matcher,
            opts,
            ring: VecDeque::new(),
            pending: VecDeque::new(),
            done: Vec::new(),
            bytes: 0,
        }
    }

    /// Feed one line found elsewhere (another searcher's report, as the exec transport's
    /// `rg --json`): a match or a context line. Answers whether the file may go on.
    pub(crate) fn feed(&mut self, line_no: u64, line: &[u8], is_match: bool) -> bool {
        if is_match {
            self.on_match_line(line_no, line)
        } else {
            self.saw_line(line_no, line);
            !self.over_caps()
        }
    }

    /// The file's matches, those still collecting after-context included.
    pub(crate) fn into_matches(mut self) -> Vec<GrepMatch> {
        self.done.extend(self.pending.drain(..));
        self.done
    }

    /// Record a line the searcher emitted (match or context): it is after-context for pending
    /// matches and a candidate before-context for the next one.
    fn saw_line(&mut self, line_no: u64, text: &[u8]) {
        let after = self.opts.after_context as u64;
        for m in self.pending.iter_mut() {
            if line_no > m.line && line_no <= m.line + after {
                m.after.push(lossy(text));
                self.bytes += text.len() as u64;
            }
        }
        while let Some(m) = self.pending.front() {
            if m.line + after > line_no {
                break;
            }
            let m = self.pending.pop_front().expect("front exists");
            self.done.push(m);
        }
        let before = self.opts.before_context;
        if before > 0 {
            if self.ring.len() == before {
                self.ring.pop_front();
            }
            self.ring.push_back((line_no, text.to_vec()));
        }
    }

    /// Has this file collected more than any search could emit?
    fn over_caps(&self) -> bool {
        let held = (self.done.len() + self.pending.len()) as u64;
        self.opts.max_results.is_some_and(|max| held > max)
            || self.opts.max_bytes.is_some_and(|max| self.bytes > max)
    }

    fn on_match_line(&mut self, line_no: u64, line: &[u8]) -> bool {
        let min_line = line_no.saturating_sub(self.opts.before_context as u64);
        let before: Vec<String> = self
            .ring
            .iter()
            .filter(|(n, _)| *n >= min_line && *n < line_no)
            .map(|(_, t)| lossy(t))
            .collect();
        let mut submatches = Vec::new();
        let _ = self.matcher.find_iter(line, |m| {
            submatches.push([m.start() as u64, m.end() as u64]);
            true
        });
        let column = submatches.first().map_or(1, |s| s[0] + 1);
        let text_base64 = std::str::from_utf8(line)
            .is_err()
            .then(|| base64::engine::general_purpose::STANDARD.encode(line));
        self.bytes += line.len() as u64 + before.iter().map(|t| t.len() as u64).sum::<u64>();
        let m = GrepMatch {
            path: self.path.clone(),
            line: line_no,
            column,
            text: lossy(line),
            text_base64,
            submatches,
            before,
            after: Vec::new(),
        };
        // This line is after-context of earlier matches before it is a match of its own.
        self.saw_line(line_no, line);
        self.pending.push_back(m);
        if self.opts.after_context == 0 {
            self.done.extend(self.pending.drain(..));
        }
        let held = (self.done.len() + self.pending.len()) as u64;
        !self.over_caps() && self.opts.max_count.is_none_or(|m| held < m)
    }
}

impl Sink for FileSink<'_> {
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
        Ok(!self.over_caps())
    }
}

fn strip_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
