//! grep's text output: ripgrep's own printer (`grep-printer`), configured as `rg` configures
//! it, so `sbxfs grep` prints byte for byte what `rg --sort path` prints.
//!
//! Each file is printed on its own (files are searched in parallel, and in a mount by the
//! sandbox), so the `--` or blank line ripgrep puts between files is added by whoever joins
//! the files in order ([`PrintOptions::file_separator`]).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use grep_matcher::{Match, Matcher};
use grep_printer::{ColorSpecs, StandardBuilder, SummaryBuilder, SummaryKind};
use grep_regex::RegexMatcher;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink};
use serde::{Deserialize, Serialize};
use termcolor::{Buffer, WriteColor};

use super::cancel::{Cancel, Guarded};
use super::grep::GrepOptions;
use crate::wirebytes::WireBytes;

/// What is printed for each file, as ripgrep's output modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrintKind {
    /// Matching lines (and context): rg's default.
    #[default]
    Lines,
    /// `-c`: the number of matching lines of each file with any (of matches with `-o`).
    Count,
    /// `-l`: the path of each file with a match.
    FilesWithMatches,
    /// `--files-without-match`: the path of each file without one.
    FilesWithoutMatch,
    /// `--files`: the path of each file that would be searched.
    Files,
}

/// How to print: what rg decides from its flags and from whether stdout is a terminal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PrintOptions {
    pub kind: PrintKind,
    /// The search root as the user typed it. A file below it is shown as this joined with its
    /// path below the root; empty shows the path below the root alone (rg with no path
    /// argument); a root that is a file is shown as typed.
    pub shown_root: WireBytes,
    /// Print the path with each line (`-H`, several paths) or not (`-I`); unset: as rg, with
    /// it unless the root is a file (decided where the root is seen: in a mount, the sandbox).
    pub with_filename: Option<bool>,
    pub line_number: bool,
    pub column: bool,
    /// `-o`: each match on a line of its own.
    pub only_matching: bool,
    /// The path once above a file's lines (rg on a terminal).
    pub heading: bool,
    /// ripgrep's default colours (ANSI).
    pub color: bool,
    /// `-0`: every printed path is followed by a NUL byte (in place of the newline after a
    /// listed path, or the `:` before a line or count), as `rg -0` prints.
    pub null: bool,
    /// `--vimgrep`: a line of its own for every match (with the path, line and column, which
    /// the caller turns on).
    pub per_match: bool,
    /// `-r`: each match printed replaced by this (`$1`, `$name` for capture groups).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<WireBytes>,
}

/// One file's printed output, and how many matches it counted (for the caps and the exit code).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrintedFile {
    pub printed: WireBytes,
    pub matches: u64,
    /// The path the file is printed as ([`PrintOptions::shown_path`]): what the laptop checks
    /// the printed lines against ([`check_printed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<WireBytes>,
    /// Its output would pass the search's byte cap (it was not held whole): the search ends
    /// before it, as for any file that does not fit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub over_cap: bool,
}

/// Whether a file's printed output, as the sandbox answered it, is what ripgrep could print
/// for a file beneath the searched directory: its path is the shown root joined with a clean
/// relative path, and every line that names a file names that one. (A hostile sandbox could
/// otherwise print `/home/me/.bashrc` into `sbxfs grep -l … | xargs sed -i`.) Lines of the
/// file's own content are the file's, as with rg.
pub fn check_printed(print: &PrintOptions, f: &PrintedFile) -> Result<(), String> {
    let Some(path) = f.path.as_ref().map(|p| p.0.as_slice()) else {
        return Err("printed output that names no file".into());
    };
    let root = print.shown_root.0.as_slice();
    let below = if root.is_empty() {
        Some(path)
    } else if path == root {
        None
    } else {
        let sep = usize::from(!root.ends_with(b"/"));
        path.strip_prefix(root)
            .filter(|rest| sep == 0 || rest.first() == Some(&b'/'))
            .map(|rest| &rest[sep..])
    };
    let clean = |p: &[u8]| crate::remote::RemotePath::new(p.to_vec()).is_ok() && !p.is_empty();
    if path.contains(&b'\n') || !below.is_none_or(clean) {
        return Err(format!(
            "a path outside the searched directory: {}",
            String::from_utf8_lossy(path)
        ));
    }
    if print.color || f.printed.0.is_empty() {
        return Ok(());
    }
    let out = f.printed.0.as_slice();
    // What follows a path: a NUL with `-0`, else `:` (a match, a count) or `-` (context).
    let (after_path, after_listed): (&[u8], &[u8]) = if print.null {
        (b"\0", b"\0")
    } else {
        (b":-", b"\n")
    };
    let named = |line: &[u8]| {
        line.strip_prefix(path)
            .is_some_and(|rest| rest.first().is_some_and(|b| after_path.contains(b)))
    };
    let lines = out
        .strip_suffix(b"\n")
        .unwrap_or(out)
        .split(|&b| b == b'\n');
    let ok = match print.kind {
        PrintKind::Files | PrintKind::FilesWithMatches | PrintKind::FilesWithoutMatch => {
            out.strip_suffix(after_listed) == Some(path)
        }
        PrintKind::Count => {
            let mut all = lines;
            let line = all.next().unwrap_or_default();
            let number = match line.strip_prefix(path) {
                Some(rest) => rest.strip_prefix(&after_path[..1]),
                None => Some(line),
            };
            all.next().is_none()
                && number.is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
        }
        // Under a heading, the path stands alone on the first line, or with `-0` is
        // followed by a NUL and the first line.
        PrintKind::Lines if print.heading && print.null => out
            .strip_prefix(path)
            .is_some_and(|r| r.first() == Some(&0)),
        PrintKind::Lines if print.heading => out.split(|&b| b == b'\n').next() == Some(path),
        PrintKind::Lines if print.with_filename.unwrap_or(below.is_some()) => {
            let mut all = lines;
            all.all(|l| l == b"--" || named(l))
        }
        PrintKind::Lines => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "printed output that is not ripgrep's for {}",
            String::from_utf8_lossy(path)
        ))
    }
}

/// Where a file's bytes come from.
pub enum Haystack<'a> {
    /// An open file, read in chunks that each check the search's [`Cancel`].
    File(&'a std::fs::File, &'a Cancel),
    Bytes(&'a [u8]),
}

impl PrintOptions {
    /// What rg prints between two files' output: a blank line under headings, `--` with
    /// context, nothing otherwise.
    pub fn file_separator(&self, opts: &GrepOptions) -> Option<&'static [u8]> {
        if self.kind != PrintKind::Lines {
            None
        } else if self.heading {
            Some(b"\n")
        } else if opts.before_context > 0 || opts.after_context > 0 {
            Some(b"--\n")
        } else {
            None
        }
    }

    /// The path printed for a file found `relative` below the root.
    pub fn shown_path(&self, relative: &[u8], explicit: bool) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let relative = Path::new(std::ffi::OsStr::from_bytes(relative));
        let root = Path::new(std::ffi::OsStr::from_bytes(&self.shown_root.0));
        if root.as_os_str().is_empty() {
            PathBuf::from(relative)
        } else if explicit {
            root.to_path_buf()
        } else {
            root.join(relative)
        }
    }
}

/// The searcher for printing: as rg builds it (line numbers only when shown).
pub fn searcher(opts: &GrepOptions, print: &PrintOptions) -> Searcher {
    SearcherBuilder::new()
        .line_number(print.line_number)
        .multi_line(opts.multiline)
        .invert_match(opts.invert)
        .before_context(opts.before_context)
        .after_context(opts.after_context)
        .heap_limit(Some(super::grep::MAX_LINE_BUFFER_BYTES))
        .build()
}

/// rg's binary handling: a file named on the command line is searched up to its first NUL
/// after a match ("binary file matches"), one found by the walk is skipped at its first NUL
/// unless `--binary`; `--text` searches both as text.
fn binary_detection(opts: &GrepOptions, explicit: bool) -> BinaryDetection {
    if opts.binary {
        BinaryDetection::none()
    } else if explicit || opts.search_binary {
        BinaryDetection::convert(b'\x00')
    } else {
        BinaryDetection::quit(b'\x00')
    }
}

fn run<M: Matcher, S: Sink<Error = io::Error>>(
    searcher: &mut Searcher,
    matcher: M,
    hay: &Haystack<'_>,
    sink: S,
) -> io::Result<()> {
    match hay {
        Haystack::File(f, cancel) => {
            searcher.search_reader(matcher, Guarded { inner: *f, cancel }, sink)
        }
        Haystack::Bytes(b) => searcher.search_slice(matcher, b, sink),
    }
}

fn colors(print: &PrintOptions) -> ColorSpecs {
    if print.color {
        ColorSpecs::default_with_color()
    } else {
        ColorSpecs::default()
    }
}

/// Search one file and print it as rg would, stopping after `max_matches` matching lines.
#[allow(clippy::too_many_arguments)]
pub fn print_file(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    opts: &GrepOptions,
    print: &PrintOptions,
    max_matches: Option<u64>,
    shown: &Path,
    explicit: bool,
    hay: &Haystack<'_>,
) -> io::Result<PrintedFile> {
    searcher.set_binary_detection(binary_detection(opts, explicit));
    // `-m` caps each file; the search's own cap what is left of it.
    let max_matches = match (max_matches, opts.max_count) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let buf = Capped {
        inner: if print.color {
            Buffer::ansi()
        } else {
            Buffer::no_color()
        },
        // A file is printed whole or not at all: past the search's byte cap its output is of
        // no use, and it is never held (`-r '$0$0…'` multiplies what a line prints).
        left: opts.max_bytes.map_or(u64::MAX, |m| m.saturating_add(1)),
        hit: false,
    };
    let (buf, matches) = match print.kind {
        PrintKind::Files => {
            let mut buf = buf;
            buf.set_color(colors(print).path())?;
            write_path(&mut buf, shown)?;
            buf.reset()?;
            buf.write_all(if print.null { b"\0" } else { b"\n" })?;
            (buf, 1)
        }
        PrintKind::Lines => {
            let mut printer = StandardBuilder::new()
                .color_specs(colors(print))
                .heading(print.heading)
                .path(print.with_filename.unwrap_or(!explicit))
                .only_matching(print.only_matching)
                .per_match(print.per_match)
                // A match across lines: its first line only, once (rg's --vimgrep).
                .per_match_one_line(print.per_match)
                .replacement(print.replacement.as_ref().map(|r| r.0.clone()))
                .max_matches(max_matches)
                .column(print.column)
                .separator_search(None)
                .separator_context(Some(b"--".to_vec()))
                .path_terminator(print.null.then_some(b'\0'))
                .build(buf);
            // With -r, matching stops before the replaced text could pass the byte cap: the
            // printer builds a line's replaced text whole before it writes any of it.
            let budget = print
                .replacement
                .as_ref()
                .zip(opts.max_bytes)
                .map(|(r, max)| Budgeted::new(matcher, r.0.len() as u64, max));
            let (r, matches) = match &budget {
                Some(b) => {
                    let mut sink = printer.sink_with_path(b, shown);
                    let r = run(searcher, b, hay, &mut sink);
                    (r, sink.match_count())
                }
                None => {
                    let mut sink = printer.sink_with_path(matcher, shown);
                    let r = run(searcher, matcher, hay, &mut sink);
                    (r, sink.match_count())
                }
            };
            let mut buf = printer.into_inner();
            buf.hit |= budget.is_some_and(|b| b.spent.get());
            // Over the cap: what was held is enough to say the file does not fit.
            if !buf.hit {
                r?;
            }
            (buf, matches)
        }
        kind => {
            let kind = match kind {
                // rg: `-o` with `-c` counts matches, not matching lines.
                PrintKind::Count if print.only_matching => SummaryKind::CountMatches,
                PrintKind::Count => SummaryKind::Count,
                PrintKind::FilesWithMatches => SummaryKind::PathWithMatch,
                _ => SummaryKind::PathWithoutMatch,
            };
            let mut printer = SummaryBuilder::new()
                .kind(kind)
                .color_specs(colors(print))
                .path(print.with_filename.unwrap_or(!explicit))
                .max_matches(max_matches)
                .path_terminator(print.null.then_some(b'\0'))
                .build(buf);
            let mut sink = printer.sink_with_path(matcher, shown);
            run(searcher, matcher, hay, &mut sink)?;
            let matched = u64::from(sink.has_match());
            (printer.into_inner(), matched)
        }
    };
    use std::os::unix::ffi::OsStrExt;
    Ok(PrintedFile {
        over_cap: buf.hit,
        printed: WireBytes(buf.inner.into_inner()),
        matches,
        path: Some(WireBytes(shown.as_os_str().as_bytes().to_vec())),
    })
}

/// `-r`'s matcher under a byte cap: each match may print the replacement with every group
/// the whole match (`per_byte` × (1 + its length) bytes at most); once that could pass
/// `budget`, no further match is found and the file is marked over the cap.
struct Budgeted<'m> {
    inner: &'m RegexMatcher,
    per_byte: u64,
    left: std::cell::Cell<u64>,
    spent: std::cell::Cell<bool>,
}

impl<'m> Budgeted<'m> {
    fn new(inner: &'m RegexMatcher, replacement_len: u64, budget: u64) -> Self {
        Budgeted {
            inner,
            per_byte: replacement_len.max(1),
            left: std::cell::Cell::new(budget),
            spent: std::cell::Cell::new(false),
        }
    }
}

impl Matcher for Budgeted<'_> {
    type Captures = <RegexMatcher as Matcher>::Captures;
    type Error = <RegexMatcher as Matcher>::Error;

    fn find_at(&self, haystack: &[u8], at: usize) -> Result<Option<Match>, Self::Error> {
        self.inner.find_at(haystack, at)
    }
    fn new_captures(&self) -> Result<Self::Captures, Self::Error> {
        self.inner.new_captures()
    }
    fn capture_count(&self) -> usize {
        self.inner.capture_count()
    }
    fn capture_index(&self, name: &str) -> Option<usize> {
        self.inner.capture_index(name)
    }
    fn captures_at(
        &self,
        haystack: &[u8],
        at: usize,
        caps: &mut Self::Captures,
    ) -> Result<bool, Self::Error> {
        use grep_matcher::Captures;
        if self.spent.get() || !self.inner.captures_at(haystack, at, caps)? {
            return Ok(false);
        }
        let len = caps.get(0).map_or(0, |m| m.len() as u64);
        let cost = self.per_byte.saturating_mul(len + 1);
        if cost > self.left.get() {
            self.spent.set(true);
            return Ok(false);
        }
        self.left.set(self.left.get() - cost);
        Ok(true)
    }
    fn shortest_match_at(&self, haystack: &[u8], at: usize) -> Result<Option<usize>, Self::Error> {
        self.inner.shortest_match_at(haystack, at)
    }
    fn non_matching_bytes(&self) -> Option<&grep_matcher::ByteSet> {
        self.inner.non_matching_bytes()
    }
    fn line_terminator(&self) -> Option<grep_matcher::LineTerminator> {
        self.inner.line_terminator()
    }
    fn find_candidate_line(
        &self,
        haystack: &[u8],
    ) -> Result<Option<grep_matcher::LineMatchKind>, Self::Error> {
        self.inner.find_candidate_line(haystack)
    }
}

/// A printer's buffer that refuses to grow past `left` more bytes (the search then stops).
struct Capped {
    inner: Buffer,
    left: u64,
    hit: bool,
}

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if b.len() as u64 > self.left {
            let n = self.left as usize;
            self.inner.write_all(&b[..n])?;
            self.left = 0;
            self.hit = true;
            return Err(io::Error::other("the file's output passes the byte cap"));
        }
        self.left -= b.len() as u64;
        self.inner.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl WriteColor for Capped {
    fn supports_color(&self) -> bool {
        self.inner.supports_color()
    }
    fn set_color(&mut self, spec: &termcolor::ColorSpec) -> io::Result<()> {
        self.inner.set_color(spec)
    }
    fn reset(&mut self) -> io::Result<()> {
        self.inner.reset()
    }
    fn is_synchronous(&self) -> bool {
        self.inner.is_synchronous()
    }
    fn set_hyperlink(&mut self, link: &termcolor::HyperlinkSpec) -> io::Result<()> {
        self.inner.set_hyperlink(link)
    }
    fn supports_hyperlinks(&self) -> bool {
        self.inner.supports_hyperlinks()
    }
}

fn write_path(out: &mut impl Write, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    out.write_all(path.as_os_str().as_bytes())
}
