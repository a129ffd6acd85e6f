//! The query commands: grep, glob, fuzzy, scan, edit. Each runs the core on a local path, or
//! asks the mount the path is in (its sandbox runs the query; only results cross the network).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::output::{self, Printer};
use super::{ask, found, socket_error, RouteArgs, WalkArgs, ERROR, FOUND, NOTHING};
use crate::search::grep::GrepOptions;
use crate::search::scan::ScanRequest;
use crate::search::{self, SearchError};

/// Default `scan` budget: a screenful of context for an agent, small enough to cross a slow link
/// in one round trip.
pub const DEFAULT_SCAN_MAX_BYTES: u64 = 64 * 1024;
/// Default number of `fuzzy` results: more than any picker shows.
pub const DEFAULT_FUZZY_LIMIT: usize = 100;

#[derive(Args, Debug)]
pub(super) struct GrepArgs {
    pattern: String,
    /// Files or directories to search (default: the current directory).
    paths: Vec<PathBuf>,
    #[arg(short = 'i', long)]
    ignore_case: bool,
    /// Treat the pattern as a literal string.
    #[arg(short = 'F', long)]
    fixed_strings: bool,
    /// Lines of context before and after each match.
    #[arg(short = 'C', long, value_name = "N")]
    context: Option<usize>,
    #[arg(short = 'B', long, value_name = "N")]
    before_context: Option<usize>,
    #[arg(short = 'A', long, value_name = "N")]
    after_context: Option<usize>,
    /// Print only the paths of files with matches, once each.
    #[arg(short = 'l', long = "files-with-matches")]
    files_with_matches: bool,
    /// Line numbers are always shown; accepted for ripgrep/grep habits.
    #[arg(short = 'n', long = "line-number")]
    _line_number: bool,
    /// Search binary files (containing NUL bytes) as text.
    #[arg(short = 'a', long = "text")]
    text: bool,
    #[arg(long, value_name = "N")]
    max_results: Option<u64>,
    #[arg(long, value_name = "BYTES")]
    max_bytes: Option<u64>,
    /// Files searched at once (0: one per core).
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    walk: WalkArgs,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
pub(super) struct GlobArgs {
    pattern: String,
    #[arg(default_value = ".")]
    dir: PathBuf,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
pub(super) struct FuzzyArgs {
    query: String,
    #[arg(default_value = ".")]
    dir: PathBuf,
    #[arg(long, default_value_t = DEFAULT_FUZZY_LIMIT)]
    limit: usize,
    #[command(flatten)]
    walk: WalkArgs,
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
    for line in lines {
        let v = line.map_err(|e| SearchError::Io("control socket".into(), e.to_string()))?;
        if let Some(e) = socket_error(&v) {
            return Err(e);
        }
        match serde_json::from_value::<crate::remote::GrepEvent>(v) {
            Ok(crate::remote::GrepEvent::Match(mut m)) => {
                if let Some(pre) = prefix {
                    m.path = output::join_display(pre, &m.path, root_is_dir);
                }
                if !p.grep_match(&m) {
                    // The reader went away: closing the socket cancels the sandbox's search.
                    return Ok(search::grep::GrepSummary {
                        truncated: true,
                        ..Default::default()
                    });
                }
            }
            Ok(crate::remote::GrepEvent::Summary { summary, .. }) => return Ok(summary),
            Err(e) => return Err(SearchError::Io("control socket".into(), e.to_string())),
        }
    }
    Err(SearchError::Io(
        "control socket".into(),
        "the answer ended early".into(),
    ))
}

pub(super) fn run_grep(a: GrepArgs) -> i32 {
    let mut p = Printer::new(a.json);
    p.files_only = a.files_with_matches;
    let context = a.context.unwrap_or(0);
    let opts = GrepOptions {
        pattern: a.pattern,
        fixed_strings: a.fixed_strings,
        case_insensitive: a.ignore_case,
        before_context: a.before_context.unwrap_or(context),
        after_context: a.after_context.unwrap_or(context),
        binary: a.text,
        walk: a.walk.options(),
        max_results: a.max_results,
        max_bytes: a.max_bytes,
        threads: a.threads,
    };
    let paths = if a.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        a.paths
    };
    // With several paths, results are prefixed by the path given, as ripgrep prints them.
    let prefixed = paths.len() > 1;
    let mut total = search::grep::GrepSummary::default();
    let mut failed = false;
    for root in &paths {
        let prefix = prefixed.then(|| root.display().to_string());
        let mut remaining = opts.clone();
        remaining.max_results = opts.max_results.map(|m| m.saturating_sub(total.matches));
        remaining.max_bytes = opts.max_bytes.map(|m| m.saturating_sub(total.bytes));
        let result = match a.route.route(root) {
            Err(e) => Err(e),
            // In a mount: the sandbox searches, only results cross the network.
            Ok(Some(route)) => {
                remote_grep(&route, &remaining, &mut p, prefix.as_deref(), root.is_dir())
            }
            Ok(None) => search::grep::grep(root, &remaining, &mut |mut m| {
                if let Some(pre) = &prefix {
                    m.path = output::join_display(pre, &m.path, root.is_dir());
                }
                p.grep_match(&m)
            }),
        };
        match result {
            Ok(s) => {
                for e in &s.errors {
                    eprintln!("sbxfs grep: {e}");
                }
                total.matches += s.matches;
                total.files_searched += s.files_searched;
                total.files_matched += s.files_matched;
                total.bytes += s.bytes;
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
    }
    // A lone failing path is just an error; with several, the others' summary still counts.
    if !(failed && paths.len() == 1) {
        p.grep_summary(&total);
    }
    if failed {
        ERROR
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
    match result {
        Ok(paths) => {
            for path in &paths {
                p.glob_path(path);
            }
            found(!paths.is_empty())
        }
        Err(e) => p.error(&e),
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
                    hidden: a.walk.hidden,
                    no_ignore: a.walk.no_ignore,
                },
            },
        )
        .and_then(|v| {
            serde_json::from_value(v["matches"].clone())
                .map_err(|e| SearchError::Io("control socket".into(), e.to_string()))
        }),
        Ok(None) => search::fuzzy::fuzzy(&a.dir, &a.query, &a.walk.options(), Some(a.limit)),
    };
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
