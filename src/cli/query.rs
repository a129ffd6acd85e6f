//! The query commands: grep, glob, fuzzy, scan, edit. Each runs the core on a local path, or
//! asks the mount the path is in (its sandbox runs the query; only results cross the network).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;

use super::output::{self, Printer};
use super::{ask, found, socket_error, RouteArgs, WalkArgs, ERROR, FOUND, NOTHING};
use crate::search::grep::{GrepItem, GrepOptions};
use crate::search::print::{PrintKind, PrintOptions};
use crate::search::scan::ScanRequest;
use crate::search::{self, SearchError};

/// Default `scan` budget: a screenful of context for an agent, small enough to cross a slow link
/// in one round trip.
pub const DEFAULT_SCAN_MAX_BYTES: u64 = 64 * 1024;
/// Default number of `fuzzy` results: more than any picker shows.
pub const DEFAULT_FUZZY_LIMIT: usize = 100;

const GREP_EXAMPLES: &str = "\
Prints what `rg --sort path` prints for the same arguments: paths as given on the command line,
line numbers with -n (or on a terminal), `--` between groups of context. In an sbxfs mount the
sandbox searches; only the output crosses the network.

Examples:
  sbxfs grep -n 'fn main' src          src/main.rs:1:fn main() {
  sbxfs grep -l -t rust TODO           paths of Rust files with a TODO
  sbxfs grep -C2 -w -i error src/cli   two lines of context around the word \"error\"
  sbxfs grep --files -g '*.toml'       the files a search would read
  sbxfs grep --json -F 'a.b(' .        one JSON object per match

Exit status: 0 a match (or a file) was found, 1 none, 2 an error (also when some paths failed).";

const FUZZY_EXAMPLES: &str = "\
Examples:
  sbxfs fuzzy srvmod                   src/server/mod.rs ranked first
  sbxfs fuzzy -g '*.rs' --limit 5 cfg  the five best Rust files for \"cfg\"

Exit status: 0 a file matched, 1 none, 2 an error.";

const GLOB_EXAMPLES: &str = "\
Examples:
  sbxfs glob '**/*.rs' src             every Rust file under src/, sorted
  sbxfs glob '*.{toml,lock}'           Cargo.toml and Cargo.lock here

Exit status: 0 something matched, 1 nothing, 2 an error.";

/// When to colour grep's output (as ripgrep's `--color`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ColorChoice {
    Never,
    #[default]
    Auto,
    Always,
}

/// `--sort`: ripgrep's orders; `none` is accepted for habit (results are always in path order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum SortBy {
    Path,
    None,
}

#[derive(Args, Debug)]
#[command(after_help = GREP_EXAMPLES)]
pub(super) struct GrepArgs {
    /// The regular expression to search for (ripgrep's syntax; a literal with -F). With --files
    /// it is the first PATH instead.
    #[arg(value_name = "PATTERN", required_unless_present_any = ["files", "type_list", "regexp"])]
    pattern: Option<String>,
    /// A pattern to search for; repeatable, a line matching any of them matches (a pattern
    /// may start with `-`). With -e, every positional argument is a PATH.
    #[arg(
        short = 'e',
        long = "regexp",
        value_name = "PATTERN",
        allow_hyphen_values = true
    )]
    regexp: Vec<String>,
    /// Files or directories to search (default: the current directory, printed without `./`).
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Match case-insensitively.
    #[arg(short = 'i', long, overrides_with = "smart_case")]
    ignore_case: bool,
    /// Case-insensitive unless the pattern has an uppercase letter.
    #[arg(short = 'S', long, overrides_with = "ignore_case")]
    smart_case: bool,
    /// Treat the pattern as a literal string.
    #[arg(short = 'F', long)]
    fixed_strings: bool,
    /// Only matches surrounded by word boundaries.
    #[arg(short = 'w', long = "word-regexp")]
    word: bool,
    /// Select the lines that do not match.
    #[arg(short = 'v', long = "invert-match")]
    invert: bool,
    /// Only matches that are a whole line.
    #[arg(short = 'x', long = "line-regexp")]
    line_regexp: bool,
    /// At most NUM matching lines of each file.
    #[arg(short = 'm', long = "max-count", value_name = "NUM")]
    max_count: Option<u64>,
    /// Print nothing, stop at the first match; the exit status says whether one was found
    /// (0, even if a file could not be read; else 1, or 2 on an error).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Print every match replaced by this (`$1`, `$name`: a capture group; `$$`: a `$`).
    #[arg(
        short = 'r',
        long,
        value_name = "REPLACEMENT",
        allow_hyphen_values = true
    )]
    replace: Option<String>,
    /// Let a match span lines: `\n` in the pattern matches a line's end.
    #[arg(short = 'U', long)]
    multiline: bool,
    /// Every match on a line of its own as PATH:LINE:COLUMN:LINE (Vim's quickfix format).
    #[arg(long)]
    vimgrep: bool,
    /// Lines of context before and after each match (as rg: the last of -C, -A, -B given
    /// wins over the others).
    #[arg(short = 'C', long, value_name = "NUM", overrides_with_all = ["before_context", "after_context"])]
    context: Option<usize>,
    /// Lines of context before each match.
    #[arg(short = 'B', long, value_name = "NUM", overrides_with = "context")]
    before_context: Option<usize>,
    /// Lines of context after each match.
    #[arg(short = 'A', long, value_name = "NUM", overrides_with = "context")]
    after_context: Option<usize>,
    /// Print the number of matching lines of each file with a match (with -o: of matches).
    #[arg(short = 'c', long)]
    count: bool,
    /// Print only the paths of files with matches, once each.
    #[arg(short = 'l', long = "files-with-matches")]
    files_with_matches: bool,
    /// Print only the paths of files without a match.
    #[arg(long = "files-without-match")]
    files_without_match: bool,
    /// Follow every printed path with a NUL byte instead of a newline or `:` (for
    /// `xargs -0`: the sandbox chooses the names, and a name may hold a space or a newline).
    #[arg(short = '0', long = "null")]
    null: bool,
    /// Print the files that would be searched, without searching (takes no PATTERN).
    #[arg(long)]
    files: bool,
    /// Print each match on a line of its own, not the whole line.
    #[arg(short = 'o', long)]
    only_matching: bool,
    /// Show line numbers (the default on a terminal).
    #[arg(short = 'n', long = "line-number", overrides_with = "no_line_number")]
    line_number: bool,
    /// Never show line numbers.
    #[arg(short = 'N', long = "no-line-number", overrides_with = "line_number")]
    no_line_number: bool,
    /// Show the column (1-based byte) of the first match; implies -n.
    #[arg(long)]
    column: bool,
    /// Print the file path with each line, even for a single file.
    #[arg(short = 'H', long = "with-filename", overrides_with = "no_filename")]
    with_filename: bool,
    /// Never print file paths with lines.
    #[arg(short = 'I', long = "no-filename", overrides_with = "with_filename")]
    no_filename: bool,
    /// Print each file's path once, above its lines (the default on a terminal).
    #[arg(long, overrides_with = "no_heading")]
    heading: bool,
    /// Print the path on every line, never as a heading.
    #[arg(long, overrides_with = "heading")]
    no_heading: bool,
    /// When to use ripgrep's colours: on a terminal (auto), never or always.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Search binary files (containing NUL bytes) as text.
    #[arg(short = 'a', long = "text")]
    text: bool,
    /// Search binary files found by the walk too, up to their first NUL after a match.
    #[arg(long)]
    binary: bool,
    /// Fewer filters: -u ignores .gitignore and the like, -uu also searches hidden files,
    /// -uuu also binary files.
    #[arg(short = 'u', long = "unrestricted", action = clap::ArgAction::Count)]
    unrestricted: u8,
    /// Only files of this type (see --type-list); repeatable.
    #[arg(short = 't', long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// No files of this type; repeatable.
    #[arg(short = 'T', long = "type-not", value_name = "TYPE")]
    types_not: Vec<String>,
    /// List the file types -t and -T know, with their globs, and exit.
    #[arg(long)]
    type_list: bool,
    /// Follow symbolic links while walking directories.
    #[arg(short = 'L', long)]
    follow: bool,
    /// Output order: always by path (`none` is accepted and gives the same order).
    #[arg(long, value_enum, value_name = "SORTBY")]
    sort: Option<SortBy>,
    /// Stop after this many matching lines (the output then says it was truncated).
    #[arg(long, value_name = "N")]
    max_results: Option<u64>,
    /// Stop before the output would pass this many bytes (units: 1K, 64K, 1M, 512M, 1G). Files
    /// are printed whole: the first file whose lines would not fit ends the search.
    #[arg(long, value_name = "SIZE", value_parser = crate::mount::options::parse_size)]
    max_bytes: Option<u64>,
    /// Files searched at once (0: one per core).
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    walk: WalkArgs,
    /// One JSON object per match, then a summary (sbxfs's format, not ripgrep's; -l gives
    /// one object per file).
    #[arg(long, conflicts_with_all = ["count", "files_without_match", "files", "only_matching"])]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
#[command(after_help = GLOB_EXAMPLES)]
pub(super) struct GlobArgs {
    /// The glob: `*` and `?` within a name, `**` across directories, `[abc]`, `{a,b}`.
    #[arg(value_name = "PATTERN")]
    pattern: String,
    /// The directory to match under.
    #[arg(value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// One JSON object per path.
    #[arg(long)]
    json: bool,
    /// Each path exactly as named, followed by a NUL byte (for `xargs -0`: the sandbox
    /// chooses the names, and a name may hold a space or a newline).
    #[arg(short = '0', long = "null", conflicts_with = "json")]
    null: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
#[command(after_help = FUZZY_EXAMPLES)]
pub(super) struct FuzzyArgs {
    /// The characters to look for, in order (fzf's matching; smart case).
    #[arg(value_name = "QUERY")]
    query: String,
    /// The directory whose files are ranked.
    #[arg(value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Print at most this many files, best first.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_FUZZY_LIMIT)]
    limit: usize,
    /// Only files of this type (as grep -t); repeatable.
    #[arg(short = 't', long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// No files of this type; repeatable.
    #[arg(short = 'T', long = "type-not", value_name = "TYPE")]
    types_not: Vec<String>,
    /// Follow symbolic links while walking directories.
    #[arg(short = 'L', long)]
    follow: bool,
    #[command(flatten)]
    walk: WalkArgs,
    /// One JSON object per file, with its score and matched positions.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

pub(super) const SCAN_HELP: &str = concat!(
    "\
Examples:
  sbxfs scan src/main.rs --start 100 --end 160
  sbxfs scan big.log --start 5000 --max-bytes 1M
  sbxfs scan --json src/lib.rs

Without --end the window stops at --max-bytes (64K); stderr then says where and how to go on.

",
    exit_codes!()
);

pub(super) const EDIT_HELP: &str = concat!(
    "\
Examples:
  sbxfs edit src/lib.rs --old 'fn old_name(' --new 'fn new_name('
  sbxfs edit src/lib.rs --old-file before.txt --new-file after.txt
  sbxfs edit Cargo.toml --old 'edition = \"2018\"' --new 'edition = \"2021\"' --all

Exit code 0 when replaced; 1 when --old does not occur; 2 when it occurs more than once
(without --all), or on an error.

",
    exit_codes!()
);

#[derive(Args, Debug)]
pub(super) struct ScanArgs {
    /// The file to print lines of.
    file: PathBuf,
    /// First line (1-based).
    #[arg(long, default_value_t = 1, value_name = "LINE")]
    start: u64,
    /// Last line, inclusive (default: to the end, as far as --max-bytes allows).
    #[arg(long, value_name = "LINE")]
    end: Option<u64>,
    /// Most bytes of lines to print (64K, 1M, …); the window ends before the line that would
    /// pass it, and stderr says where it stopped.
    #[arg(long, default_value = "64K", value_name = "SIZE", value_parser = crate::mount::options::parse_size)]
    max_bytes: u64,
    /// Print one JSON object: lines, start_line, end_line, total_lines, total_bytes.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("old_text").required(true).args(["old", "old_file"]))]
#[command(group = clap::ArgGroup::new("new_text").required(true).args(["new", "new_file"]))]
pub(super) struct EditArgs {
    /// The file to edit (written whole, atomically, or not at all).
    file: PathBuf,
    /// The exact text to replace; it must occur once, unless --all.
    #[arg(long, allow_hyphen_values = true, value_name = "TEXT")]
    old: Option<OsString>,
    /// The text to put in its place.
    #[arg(long, allow_hyphen_values = true, value_name = "TEXT")]
    new: Option<OsString>,
    /// Read the text to replace from a file.
    #[arg(long, conflicts_with = "old", value_name = "FILE")]
    old_file: Option<PathBuf>,
    /// Read the replacement text from a file.
    #[arg(long, conflicts_with = "new", value_name = "FILE")]
    new_file: Option<PathBuf>,
    /// Replace every occurrence.
    #[arg(long)]
    all: bool,
    /// Print {"count": N} instead of "replaced N occurrences".
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

/// The sandbox's answer names something a search of the directory could not find.
fn refused(why: String) -> SearchError {
    SearchError::Io("sandbox".into(), format!("refused its answer: {why}"))
}

/// A path the sandbox answered, below the searched directory: relative and clean (`..` or
/// an absolute path would name a file elsewhere on this machine).
fn outside(path: &str) -> Result<(), SearchError> {
    match crate::remote::RemotePath::new(path.as_bytes().to_vec()) {
        Ok(_) => Ok(()),
        Err(_) => Err(refused(format!(
            "a path outside the searched directory: {path}"
        ))),
    }
}

/// Run grep in the sandbox through the mount's socket, printing as it streams.
fn remote_grep(
    route: &crate::control::client::Route,
    opts: &GrepOptions,
    p: &mut Printer,
    prefix: Option<&str>,
    root_is_dir: bool,
) -> Result<search::grep::GrepSummary, SearchError> {
    let req = crate::control::Request::Grep {
        path: crate::remote::WireBytes(route.path.clone()),
        options: opts.clone(),
    };
    let lines = crate::control::client::request(&route.socket, req)
        .map_err(|e| SearchError::Io(route.socket.display().to_string(), e.to_string()))?;
    // The reader went away: closing the socket cancels the sandbox's search.
    let gone = || search::grep::GrepSummary {
        truncated: true,
        ..Default::default()
    };
    // Files whose names hold a line break: never printed raw (a name could fake other lines
    // of the output), said on stderr, and the search goes on.
    let mut unprintable = Vec::new();
    for line in lines {
        let v = line.map_err(|e| SearchError::Io("control socket".into(), e.to_string()))?;
        if let Some(e) = socket_error(&v) {
            return Err(e);
        }
        match serde_json::from_value::<crate::remote::GrepEvent>(v) {
            Ok(crate::remote::GrepEvent::Match(_)) if opts.print.is_some() => {
                // An agent older than printed output answers with matches: say so rather
                // than print something that is not ripgrep's.
                return Err(SearchError::Io(
                    "sandbox".into(),
                    "its sbxfs agent is too old to print ripgrep's output: upgrade it, or pass --json"
                        .into(),
                ));
            }
            Ok(crate::remote::GrepEvent::Match(mut m)) => {
                outside(&m.path)?;
                if let Some(pre) = prefix {
                    m.path = output::join_display(pre, &m.path, root_is_dir);
                }
                if !p.grep_match(&m) {
                    return Ok(gone());
                }
            }
            Ok(crate::remote::GrepEvent::Printed(f)) => {
                if let Some(path) = f.path.as_ref().filter(|p| p.0.contains(&b'\n')) {
                    unprintable.push(format!(
                        "{}: a name with a line break is not printed in text output (use --json)",
                        super::logging::visible(&String::from_utf8_lossy(&path.0))
                    ));
                    continue;
                }
                if let Some(print) = &opts.print {
                    search::print::check_printed(print, &f).map_err(refused)?;
                }
                if !p.printed_file(&f) {
                    return Ok(gone());
                }
            }
            Ok(crate::remote::GrepEvent::Summary { mut summary, .. }) => {
                summary.errors.extend(unprintable);
                return Ok(summary);
            }
            Err(e) => return Err(SearchError::Io("control socket".into(), e.to_string())),
        }
    }
    Err(SearchError::Io(
        "control socket".into(),
        "the answer ended early".into(),
    ))
}

/// Whether stdin holds data to search, as rg decides: a pipe, a file or a socket (not a
/// terminal, not /dev/null).
fn stdin_is_data() -> bool {
    let Ok(meta) = rustix::fs::fstat(rustix::stdio::stdin()) else {
        return false;
    };
    let kind = rustix::fs::FileType::from_raw_mode(meta.st_mode);
    matches!(
        kind,
        rustix::fs::FileType::Fifo
            | rustix::fs::FileType::RegularFile
            | rustix::fs::FileType::Socket
    )
}

/// `sbxfs grep PATTERN` reading a pipe: stdin searched here, shown as `<stdin>` where a
/// path is printed.
fn grep_stdin(
    opts: &search::grep::GrepOptions,
    print: Option<PrintOptions>,
    p: &mut Printer,
) -> i32 {
    use std::io::Read;
    let mut data = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut data) {
        eprintln!("sbxfs grep: <stdin>: {e}");
        return ERROR;
    }
    let mut opts = opts.clone();
    opts.print = print.map(|pr| PrintOptions {
        shown_root: crate::remote::WireBytes(b"<stdin>".to_vec()),
        ..pr
    });
    let r = search::grep::grep_bytes(&data, "<stdin>", &opts, &mut |item| match item {
        GrepItem::Match(m) => p.grep_match(&m),
        GrepItem::Printed(f) => p.printed_file(&f),
    });
    match r {
        Ok(s) => {
            p.grep_summary(&s);
            p.flush();
            found(s.matches > 0)
        }
        Err(e) => {
            p.error(&e);
            p.flush();
            ERROR
        }
    }
}

impl GrepArgs {
    /// The pattern and the paths, as ripgrep reads them (`--files` takes no pattern).
    fn pattern_and_paths(&self) -> (String, Vec<PathBuf>) {
        let mut paths = self.paths.clone();
        if self.files || !self.regexp.is_empty() {
            if let Some(first) = &self.pattern {
                paths.insert(0, PathBuf::from(first));
            }
        }
        if self.files {
            return (String::new(), paths);
        }
        let patterns = match &self.pattern {
            _ if !self.regexp.is_empty() => self.regexp.clone(),
            Some(p) => vec![p.clone()],
            None => Vec::new(),
        };
        (self.combined(&patterns), paths)
    }

    /// Several patterns as one, as rg joins them: an alternation (each a literal with -F),
    /// whole lines with -x.
    fn combined(&self, patterns: &[String]) -> String {
        let literal = self.fixed_strings && (patterns.len() > 1 || self.line_regexp);
        let one = |p: &String| if literal { regex::escape(p) } else { p.clone() };
        let joined = match patterns {
            [p] => one(p),
            many => many
                .iter()
                .map(|p| format!("(?:{})", one(p)))
                .collect::<Vec<_>>()
                .join("|"),
        };
        if self.line_regexp {
            format!("^(?:{joined})$")
        } else {
            joined
        }
    }

    /// Whether the patterns went into the regex as literals already ([`Self::combined`]).
    fn literal_combined(&self) -> bool {
        self.fixed_strings && (self.regexp.len() > 1 || self.line_regexp)
    }

    fn print_kind(&self) -> PrintKind {
        if self.files {
            PrintKind::Files
        } else if self.files_with_matches {
            PrintKind::FilesWithMatches
        } else if self.files_without_match {
            PrintKind::FilesWithoutMatch
        } else if self.count {
            PrintKind::Count
        } else {
            PrintKind::Lines
        }
    }

    /// How ripgrep would print, given the paths and whether stdout is a terminal.
    fn print_options(&self, paths: &[PathBuf], tty: bool) -> PrintOptions {
        let kind = self.print_kind();
        let with_filename = if self.no_filename {
            Some(false)
        } else if self.with_filename || paths.len() > 1 {
            Some(true)
        } else {
            None
        };
        let color = match self.color {
            ColorChoice::Never => false,
            ColorChoice::Always => true,
            ColorChoice::Auto => {
                tty && std::env::var_os("NO_COLOR").is_none()
                    && std::env::var_os("TERM").is_some_and(|t| t != "dumb")
            }
        };
        // rg --vimgrep: the path, line and column on every line, no heading.
        let vim = self.vimgrep && kind == PrintKind::Lines;
        PrintOptions {
            kind,
            shown_root: Default::default(),
            with_filename: if vim && !self.no_filename {
                Some(true)
            } else {
                with_filename
            },
            line_number: kind == PrintKind::Lines
                && (vim || !self.no_line_number && (self.line_number || self.column || tty)),
            column: self.column || vim,
            only_matching: self.only_matching,
            heading: !vim && !self.no_heading && (self.heading || tty),
            color,
            null: self.null,
            per_match: vim,
            replacement: self
                .replace
                .as_ref()
                .map(|r| crate::remote::WireBytes(r.clone().into_bytes())),
        }
    }

    fn options(&self, pattern: String) -> GrepOptions {
        let context = self.context.unwrap_or(0);
        let mut walk = self.walk.options();
        walk.types.clone_from(&self.types);
        walk.types_not.clone_from(&self.types_not);
        walk.follow = self.follow;
        walk.no_ignore |= self.unrestricted >= 1;
        walk.hidden |= self.unrestricted >= 2;
        GrepOptions {
            pattern,
            fixed_strings: self.fixed_strings && !self.literal_combined(),
            case_insensitive: self.ignore_case,
            smart_case: self.smart_case,
            word: self.word,
            invert: self.invert,
            before_context: self.before_context.unwrap_or(context),
            after_context: self.after_context.unwrap_or(context),
            binary: self.text,
            search_binary: self.binary || self.unrestricted >= 3,
            walk,
            max_results: self.max_results,
            max_bytes: self.max_bytes,
            threads: self.threads,
            print: None,
            max_count: self.max_count,
            multiline: self.multiline,
        }
    }
}

/// The search root as ripgrep shows it: as typed, or nothing before the paths below `.` when
/// no path was given.
fn shown_root(given: bool, root: &std::path::Path) -> crate::remote::WireBytes {
    use std::os::unix::ffi::OsStrExt;
    crate::remote::WireBytes(if given {
        root.as_os_str().as_bytes().to_vec()
    } else {
        Vec::new()
    })
}

pub(super) fn run_grep(a: GrepArgs) -> i32 {
    if a.type_list {
        print!("{}", search::walk::type_list());
        return FOUND;
    }
    let tty = std::io::stdout().is_terminal();
    let mut p = Printer::new(a.json);
    p.files_only = a.files_with_matches;
    p.quiet = a.quiet;
    let (pattern, given) = a.pattern_and_paths();
    let mut opts = a.options(pattern);
    let mut print = (!a.json).then(|| a.print_options(&given, tty));
    if a.quiet {
        // The first match answers: one file's name, never printed.
        opts.max_results = Some(1);
        if let Some(pr) = &mut print {
            pr.kind = PrintKind::FilesWithMatches;
        }
    }
    // As rg: no path, and a pipe or a file on stdin: stdin is searched (here; it is local).
    if given.is_empty() && !a.files && stdin_is_data() {
        return grep_stdin(&opts, print, &mut p);
    }
    p.file_separator = print.as_ref().and_then(|pr| pr.file_separator(&opts));
    let paths = if given.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        given.clone()
    };
    // With several paths in --json, results are prefixed by the path given; text output
    // prints paths as ripgrep does, from the root as typed.
    let prefixed = a.json && paths.len() > 1;
    let mut total = search::grep::GrepSummary::default();
    let mut failed = false;
    for root in &paths {
        let prefix = prefixed.then(|| root.display().to_string());
        let mut remaining = opts.clone();
        remaining.max_results = opts.max_results.map(|m| m.saturating_sub(total.matches));
        remaining.max_bytes = opts.max_bytes.map(|m| m.saturating_sub(total.bytes));
        remaining.print = print.clone().map(|pr| PrintOptions {
            shown_root: shown_root(!given.is_empty(), root),
            ..pr
        });
        let result = match a.route.route(root) {
            Err(e) => Err(e),
            // In a mount: the sandbox searches, only results cross the network.
            Ok(Some(route)) => {
                remote_grep(&route, &remaining, &mut p, prefix.as_deref(), root.is_dir())
            }
            Ok(None) => search::grep::grep_items(root, &remaining, &mut |item| match item {
                GrepItem::Match(mut m) => {
                    if let Some(pre) = &prefix {
                        m.path = output::join_display(pre, &m.path, root.is_dir());
                    }
                    p.grep_match(&m)
                }
                GrepItem::Printed(f) => p.printed_file(&f),
            }),
        };
        match result {
            Ok(s) => {
                for e in &s.errors {
                    eprintln!("sbxfs grep: {}", super::logging::visible(&e.to_string()));
                }
                total.matches += s.matches;
                total.files_searched += s.files_searched;
                total.files_matched += s.files_matched;
                total.bytes += s.bytes;
                failed |= !s.errors.is_empty();
                total.errors.extend(s.errors);
                if s.truncated {
                    total.truncated = true;
                    break;
                }
            }
            Err(e) => {
                p.error(&e);
                failed = true;
            }
        }
        if p.is_closed() {
            break;
        }
    }
    // A lone failing path is just an error; with several, the others' summary still counts.
    if !(failed && paths.len() == 1 && total.matches == 0) {
        p.grep_summary(&total);
    }
    p.flush();
    // As ripgrep: any error makes the status 2, even with matches (but for -q with a match).
    // A closed stdout ends the search quietly; the status then says whether a file printed
    // before it matched.
    if a.quiet && total.matches > 0 {
        FOUND
    } else if failed {
        ERROR
    } else if p.is_closed() {
        found(p.delivered() > 0)
    } else {
        found(total.matches > 0)
    }
}

pub(super) fn run_glob(a: GlobArgs) -> i32 {
    let mut p = Printer::new(a.json);
    let result = match a.route.route(&a.dir) {
        Err(e) => Err(e),
        Ok(Some(route)) => ask(
            &route,
            crate::control::Request::Glob {
                path: crate::remote::WireBytes(route.path.clone()),
                pattern: a.pattern.clone(),
            },
        )
        .and_then(|v| {
            serde_json::from_value(v["paths"].clone())
                .map_err(|e| SearchError::Io("control socket".into(), e.to_string()))
        }),
        Ok(None) => search::glob::glob(&a.dir, &a.pattern),
    };
    let result = result.and_then(|paths: Vec<String>| {
        paths.iter().try_for_each(|path| outside(path))?;
        Ok(paths)
    });
    match result {
        Ok(paths) => {
            for path in &paths {
                p.glob_path(path, a.null);
            }
            found(!paths.is_empty())
        }
        Err(e) => p.error(&e),
    }
}

impl FuzzyArgs {
    /// Every walk option, for the local run and the wire alike.
    fn walk_options(&self) -> crate::search::walk::WalkOptions {
        let mut walk = self.walk.options();
        walk.types.clone_from(&self.types);
        walk.types_not.clone_from(&self.types_not);
        walk.follow = self.follow;
        walk
    }
}

pub(super) fn run_fuzzy(a: FuzzyArgs) -> i32 {
    let mut p = Printer::new(a.json);
    let result = match a.route.route(&a.dir) {
        Err(e) => Err(e),
        Ok(Some(route)) => ask(
            &route,
            crate::control::Request::Fuzzy {
                path: crate::remote::WireBytes(route.path.clone()),
                request: crate::remote::FuzzyRequest {
                    query: a.query.clone(),
                    limit: Some(a.limit),
                    walk: a.walk_options(),
                },
            },
        )
        .and_then(|v| {
            serde_json::from_value(v["matches"].clone())
                .map_err(|e| SearchError::Io("control socket".into(), e.to_string()))
        }),
        Ok(None) => search::fuzzy::fuzzy(&a.dir, &a.query, &a.walk_options(), Some(a.limit)),
    };
    let result = result.and_then(|matches: Vec<search::fuzzy::FuzzyMatch>| {
        matches.iter().try_for_each(|m| outside(&m.path))?;
        Ok(matches)
    });
    match result {
        Ok(matches) => {
            for m in &matches {
                p.fuzzy_match(m);
            }
            found(!matches.is_empty())
        }
        Err(e) => p.error(&e),
    }
}

pub(super) fn run_scan(a: ScanArgs) -> i32 {
    let mut p = Printer::new(a.json);
    let req = ScanRequest {
        start_line: a.start,
        end_line: a.end,
        max_bytes: a.max_bytes,
    };
    let result = match a.route.route(&a.file) {
        Err(e) => Err(e),
        Ok(Some(route)) => ask(
            &route,
            crate::control::Request::Scan {
                path: crate::remote::WireBytes(route.path.clone()),
                request: req,
            },
        )
        .and_then(|v| {
            serde_json::from_value(v)
                .map_err(|e| SearchError::Io("control socket".into(), e.to_string()))
        }),
        Ok(None) => search::scan::scan_file(&a.file, req),
    };
    match result {
        Ok(r) => {
            p.scan_result(&r, a.end);
            found(!r.lines.is_empty())
        }
        Err(e) => p.error(&e),
    }
}

fn text_arg(
    inline: Option<OsString>,
    file: Option<PathBuf>,
    what: &str,
) -> Result<String, SearchError> {
    let bytes = match (inline, file) {
        (Some(s), _) => s.into_encoded_bytes(),
        (None, Some(f)) => std::fs::read(&f)
            .map_err(|e| SearchError::InvalidArgs(format!("{what} file {}: {e}", f.display())))?,
        (None, None) => return Err(SearchError::InvalidArgs(format!("{what} is missing"))),
    };
    String::from_utf8(bytes)
        .map_err(|_| SearchError::InvalidArgs(format!("{what} is not valid UTF-8")))
}

pub(super) fn run_edit(a: EditArgs) -> i32 {
    let mut p = Printer::new(a.json);
    let texts = text_arg(a.old, a.old_file, "--old")
        .and_then(|old| Ok((old, text_arg(a.new, a.new_file, "--new")?)));
    let result = texts.and_then(|(old, new)| match a.route.route(&a.file)? {
        Some(route) => ask(
            &route,
            crate::control::Request::Edit {
                path: crate::remote::WireBytes(route.path.clone()),
                old,
                new,
                replace_all: a.all,
            },
        )
        .map(|v| v["count"].as_u64().unwrap_or(0) as usize),
        None => search::edit::edit_file(&a.file, &old, &new, a.all),
    });
    match result {
        Ok(count) => {
            p.edit_count(count);
            FOUND
        }
        Err(SearchError::StringNotFound) => {
            p.error(&SearchError::StringNotFound);
            NOTHING
        }
        Err(e) => p.error(&e),
    }
}
