//! grep over exec with ripgrep in the sandbox: only the list of searched files and rg's
//! `--json` lines cross, not the files' bytes.
//!
//! The answer must be the agent's, exactly, so rg is asked only for what it does as the agent
//! does, and the rest is computed here from what it reports:
//!
//! - **Translated** ([`plan`]): hidden files, ignore rules (`--no-require-git`, no global git
//!   excludes, no `.git/info/exclude`), `--glob`, `--max-filesize`, fixed strings, case modes,
//!   invert, `--text`, context lines, and `-m` (max results + 1: enough for a file to show that
//!   more exist). Always `--sort path` (the agent's walk order) and `--no-mmap` (the agent's
//!   searcher reads, so binary files stop where its would).
//! - **Not translated, searched here instead** (the caller's local path): file types (rg's
//!   definitions depend on its version), following symlinks (rg would follow them out of the
//!   workspace), printed output, a pattern with a line break, `-w` before rg 14 (its word
//!   rule changed then), a root that is a file or reached through a symlink (rg searches a
//!   named file as binary-tolerant), ignore files above the workspace or a
//!   `.git/info/exclude` at its top (rg would read the first and not the second; the agent the
//!   opposite), and any run where rg reported an error (its messages are not the agent's).
//! - **Computed here**: each match's column and submatches (the core's own matcher over the
//!   exact line bytes rg reported), its context lines, the per-file and global caps
//!   (`max_results`, `max_bytes`) and the summary's counts, by the same rules as
//!   `search::grep`'s sink and emitter. `files_searched` counts the files `rg --files` lists
//!   (rg's own statistics count only files with matches).
//!
//! rg's output is capped by the supervisor ([`super::OUTPUT_CAP`]); a cut answer yields the
//! files that came whole and a summary that says `truncated` with an error naming the cut,
//! never a silently shorter answer.

use base64::Engine;
use grep_regex::RegexMatcher;
use serde::Deserialize;

use super::program::malformed;
use crate::remote::{GrepEvent, RemoteError, Result};
use crate::search::grep::{FileSink, GrepMatch, GrepOptions, GrepSummary};

/// Oldest rg taken at all: `--no-require-git` came with 11.
pub const MIN_RG_MAJOR: u32 = 11;
/// Oldest rg whose `-w` is the core's (rg 14 made it "a non-word character or the edge on
/// each side", as the core's matcher does).
pub const MIN_RG_MAJOR_WORD: u32 = 14;

/// How to run rg for a search, or why it cannot give the agent's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Options that choose the files (also given to `rg --files`).
    pub walk: Vec<String>,
    /// Options of the search itself, the pattern last.
    pub search: Vec<String>,
    pub min_major: u32,
    /// The ignore files above the searched directory count (the sandbox checks none lies
    /// above the workspace).
    pub parents: bool,
}

/// The rg command line for `opts`, or why there is none (`opts` with the agent's caps).
pub fn plan(opts: &GrepOptions) -> std::result::Result<Plan, &'static str> {
    let w = &opts.walk;
    if opts.print.is_some() {
        return Err("printed output");
    }
    if !w.types.is_empty() || !w.types_not.is_empty() {
        return Err("file types");
    }
    if w.follow {
        return Err("following symlinks");
    }
    if opts.pattern.contains('\n') {
        return Err("a line break in the pattern");
    }
    if opts.max_count.is_some() || opts.multiline {
        return Err("-m or -U");
    }
    let mut walk: Vec<String> = [
        "--no-config",
        "--sort",
        "path",
        "--no-require-git",
        "--no-ignore-global",
        "--no-ignore-exclude",
    ]
    .map(String::from)
    .to_vec();
    if w.hidden {
        walk.push("--hidden".into());
    }
    if w.no_ignore {
        walk.push("--no-ignore".into());
    }
    if let Some(n) = w.max_filesize {
        walk.push(format!("--max-filesize={n}"));
    }
    for g in &w.globs {
        walk.push(format!("--glob={g}"));
    }
    let mut search: Vec<String> = vec!["--no-mmap".into()];
    let flag = |on: bool, f: &str, s: &mut Vec<String>| {
        if on {
            s.push(f.into());
        }
    };
    flag(opts.fixed_strings, "--fixed-strings", &mut search);
    // rg takes the last of -S/-i; the core's matcher: insensitive wins over smart.
    flag(opts.smart_case, "--smart-case", &mut search);
    flag(opts.case_insensitive, "--ignore-case", &mut search);
    flag(opts.word, "--word-regexp", &mut search);
    flag(opts.invert, "--invert-match", &mut search);
    flag(opts.binary, "--text", &mut search);
    search.push(format!("--before-context={}", opts.before_context));
    search.push(format!("--after-context={}", opts.after_context));
    if let Some(m) = opts.max_results {
        search.push(format!("--max-count={}", m.saturating_add(1)));
    }
    search.push("-e".into());
    search.push(opts.pattern.clone());
    Ok(Plan {
        walk,
        search,
        min_major: if opts.word {
            MIN_RG_MAJOR_WORD
        } else {
            MIN_RG_MAJOR
        },
        parents: !w.no_ignore,
    })
}

/// One line rg reported for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgLine {
    pub number: u64,
    /// The line's exact bytes, without its `\n`.
    pub bytes: Vec<u8>,
    pub is_match: bool,
}

/// What one run answered.
#[derive(Debug, Default)]
pub struct RgRun {
    /// The files searched, in walk order.
    pub files: Vec<Vec<u8>>,
    /// Files with lines, in order, with whether rg finished them (`end` seen).
    pub reported: Vec<(Vec<u8>, Vec<RgLine>, bool)>,
    /// rg's output came whole (its final status was seen).
    pub complete: bool,
}

/// What a program answered: rg's output, or a reason to search locally.
#[derive(Debug)]
pub enum Answer {
    Run(RgRun),
    Fallback(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Data {
    Text { text: String },
    Bytes { bytes: String },
}

impl Data {
    fn into_bytes(self) -> Result<Vec<u8>> {
        match self {
            Data::Text { text } => Ok(text.into_bytes()),
            Data::Bytes { bytes } => base64::engine::general_purpose::STANDARD
                .decode(bytes)
                .map_err(|_| malformed("rg: bad base64")),
        }
    }
}

#[derive(Deserialize)]
struct Lines {
    path: Data,
    lines: Data,
    line_number: Option<u64>,
}

#[derive(Deserialize)]
struct PathOnly {
    path: Data,
}

#[derive(Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
enum Message {
    Begin(PathOnly),
    Match(Lines),
    Context(Lines),
    End(PathOnly),
    Summary(serde::de::IgnoredAny),
}

/// Parse the program's answer (after the result marker's `ok` line): strictly, every line
/// known and in its place; a cut output (`cut`) ends early and says so.
pub fn parse_answer(body: &[u8], cut: bool) -> Result<Answer> {
    let mut lines = body.split_inclusive(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    if let Some(reason) = first.strip_prefix(b"F ") {
        return Ok(Answer::Fallback(
            String::from_utf8_lossy(reason).trim().to_string(),
        ));
    }
    let Some(list) = first
        .strip_prefix(b"L ")
        .and_then(|l| l.strip_suffix(b"\n"))
    else {
        if cut {
            return Ok(Answer::Fallback(
                "the file list passed the output cap".into(),
            ));
        }
        return Err(malformed("rg: no file list"));
    };
    let list = base64::engine::general_purpose::STANDARD
        .decode(list)
        .map_err(|_| malformed("rg: file list"))?;
    let mut run = RgRun {
        files: list
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
        ..Default::default()
    };
    match lines.next() {
        Some(l) if l.starts_with(b"LRC ") => {
            if !matches!(l, b"LRC 0\n" | b"LRC 1\n") {
                return Ok(Answer::Fallback("rg --files failed".into()));
            }
        }
        _ if cut => return Ok(Answer::Run(run)),
        _ => return Err(malformed("rg: no listing status")),
    }
    match lines.next() {
        Some(b"J\n") => {}
        _ if cut => return Ok(Answer::Run(run)),
        _ => return Err(malformed("rg: no J")),
    }
    for line in lines {
        let Some(line) = line.strip_suffix(b"\n") else {
            // The last, cut line.
            if cut {
                break;
            }
            return Err(malformed("rg: an unfinished line"));
        };
        if let Some(rc) = line.strip_prefix(b"JRC ") {
            if rc != b"0" && rc != b"1" {
                return Ok(Answer::Fallback("rg reported an error".into()));
            }
            run.complete = true;
            continue;
        }
        if run.complete {
            return Err(malformed("rg: output after its status"));
        }
        let msg: Message =
            serde_json::from_slice(line).map_err(|e| malformed(&format!("rg json: {e}")))?;
        match msg {
            Message::Begin(b) => run.reported.push((b.path.into_bytes()?, Vec::new(), false)),
            Message::Match(l) | Message::Context(l) if l.line_number.is_none() => {
                return Err(malformed("rg: a line without its number"))
            }
            m @ (Message::Match(_) | Message::Context(_)) => {
                let (is_match, l) = match m {
                    Message::Match(l) => (true, l),
                    Message::Context(l) => (false, l),
                    _ => unreachable!("matched above"),
                };
                let path = l.path.into_bytes()?;
                let mut bytes = l.lines.into_bytes()?;
                match run.reported.last_mut() {
                    Some((p, lines, false)) if *p == path => {
                        if bytes.last() == Some(&b'\n') {
                            bytes.pop();
                        }
                        if bytes.contains(&b'\n') {
                            return Err(malformed("rg: several lines in one message"));
                        }
                        lines.push(RgLine {
                            number: l.line_number.unwrap_or(0),
                            bytes,
                            is_match,
                        });
                    }
                    _ => return Err(malformed("rg: a line outside its file")),
                }
            }
            Message::End(e) => {
                let path = e.path.into_bytes()?;
                match run.reported.last_mut() {
                    Some((p, _, done @ false)) if *p == path => *done = true,
                    _ => return Err(malformed("rg: an end without its begin")),
                }
            }
            Message::Summary(_) => {}
        }
    }
    if !run.complete && !cut {
        return Err(malformed("rg: no final status"));
    }
    Ok(Answer::Run(run))
}

/// The events the agent would answer, from what rg reported (`opts` with the agent's caps).
pub fn assemble(opts: &GrepOptions, matcher: &RegexMatcher, run: RgRun) -> Result<Vec<GrepEvent>> {
    let mut em = Emitter {
        opts,
        summary: GrepSummary::default(),
        stopped: false,
        events: Vec::new(),
    };
    // A cut output: only the files up to the last one rg finished are known.
    let known = if run.complete {
        run.files.len()
    } else {
        match run.reported.iter().rposition(|r| r.2) {
            Some(i) => {
                let last = &run.reported[i].0;
                run.files
                    .iter()
                    .position(|f| f == last)
                    .map_or(0, |at| at + 1)
            }
            None => 0,
        }
    };
    let mut reported = run.reported.into_iter().peekable();
    for file in &run.files[..known] {
        let lines = match reported.peek() {
            Some((p, _, _)) if p == file => reported.next().map(|r| r.1).unwrap_or_default(),
            _ => Vec::new(),
        };
        let shown = String::from_utf8_lossy(file).into_owned();
        em.emit_file(file_matches(opts, matcher, shown, lines));
        if em.stopped {
            break;
        }
    }
    if !em.stopped {
        if let Some((p, _, true)) = reported.next() {
            return Err(RemoteError::Transport(format!(
                "{}: the sandbox changed during the search (rg reported a file its listing lacks)",
                String::from_utf8_lossy(&p)
            )));
        }
        if !run.complete {
            em.summary.truncated = true;
            em.summary.errors.push(format!(
                "the search's output in the sandbox passed {} bytes and was cut; narrow the search",
                super::OUTPUT_CAP
            ));
        }
    }
    let summary = em.summary;
    em.events.push(GrepEvent::Summary {
        truncated: summary.truncated,
        summary,
    });
    Ok(em.events)
}

/// One file's matches with their context, stopped where the core's per-file sink stops.
fn file_matches(
    opts: &GrepOptions,
    matcher: &RegexMatcher,
    path: String,
    lines: Vec<RgLine>,
) -> Vec<GrepMatch> {
    let mut s = FileSink::new(path, matcher, opts);
    for l in lines {
        if !s.feed(l.number, &l.bytes, l.is_match) {
            break;
        }
    }
    s.into_matches()
}

/// The core's emitter: files in walk order, the global caps, the summary.
struct Emitter<'a> {
    opts: &'a GrepOptions,
    summary: GrepSummary,
    stopped: bool,
    events: Vec<GrepEvent>,
}

impl Emitter<'_> {
    fn emit_file(&mut self, matches: Vec<GrepMatch>) {
        self.summary.files_searched += 1;
        self.summary.files_matched += u64::from(!matches.is_empty());
        for m in matches {
            let context: usize = m.before.iter().chain(&m.after).map(String::len).sum();
            let cost = (m.text.len() + context) as u64;
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
            self.events.push(GrepEvent::Match(m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::grep::build_matcher;

    fn opts(pattern: &str) -> GrepOptions {
        GrepOptions {
            pattern: pattern.into(),
            max_results: Some(100),
            max_bytes: Some(1 << 20),
            ..Default::default()
        }
    }

    fn answer(files: &[&str], json: &str, tail: &str) -> Vec<u8> {
        let list: Vec<u8> = files
            .iter()
            .flat_map(|f| [f.as_bytes(), b"\0"].concat())
            .collect();
        format!(
            "L {}\nLRC 0\nJ\n{json}{tail}",
            base64::engine::general_purpose::STANDARD.encode(list)
        )
        .into_bytes()
    }

    const A: &str = concat!(
        r#"{"type":"begin","data":{"path":{"text":"a.txt"}}}"#,
        "\n",
        r#"{"type":"match","data":{"path":{"text":"a.txt"},"lines":{"text":"x foo foo\n"},"line_number":2,"absolute_offset":4,"submatches":[]}}"#,
        "\n",
        r#"{"type":"end","data":{"path":{"text":"a.txt"},"binary_offset":null,"stats":{}}}"#,
        "\n",
    );

    #[test]
    fn matches_get_the_cores_columns_and_submatches_and_files_are_counted() {
        let o = opts("foo");
        let body = answer(
            &["a.txt", "b.txt"],
            A,
            "{\"type\":\"summary\",\"data\":{}}\nJRC 0\n",
        );
        let Answer::Run(run) = parse_answer(&body, false).unwrap() else {
            panic!("fallback")
        };
        let ev = assemble(&o, &build_matcher(&o).unwrap(), run).unwrap();
        let GrepEvent::Match(m) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!((m.line, m.column, m.text.as_str()), (2, 3, "x foo foo"));
        assert_eq!(m.submatches, vec![[2, 5], [6, 9]]);
        let GrepEvent::Summary { summary, truncated } = &ev[1] else {
            panic!("{ev:?}")
        };
        assert!(!truncated);
        assert_eq!((summary.files_searched, summary.files_matched), (2, 1));
    }

    #[test]
    fn a_cut_output_is_a_truncated_summary_with_an_error() {
        let o = opts("foo");
        let body = answer(&["a.txt", "b.txt", "c.txt"], A, r#"{"type":"begin","da"#);
        let Answer::Run(run) = parse_answer(&body, true).unwrap() else {
            panic!("fallback")
        };
        let ev = assemble(&o, &build_matcher(&o).unwrap(), run).unwrap();
        let GrepEvent::Summary { summary, truncated } = ev.last().unwrap() else {
            panic!("{ev:?}")
        };
        assert!(truncated);
        assert_eq!(summary.files_searched, 1);
        assert!(summary.errors[0].contains("cut"), "{summary:?}");
        // The same output, not cut, is malformed.
        assert!(parse_answer(&body, false).is_err());
    }

    #[test]
    fn errors_and_unknown_lines_are_never_guessed_at() {
        let body = answer(&["a.txt"], A, "JRC 2\n");
        assert!(matches!(
            parse_answer(&body, false),
            Ok(Answer::Fallback(_))
        ));
        let body = answer(&["a.txt"], "{\"type\":\"weird\",\"data\":{}}\n", "JRC 0\n");
        assert!(parse_answer(&body, false).is_err());
        let body = answer(&["a.txt"], "", "JRC 0\nmore\n");
        assert!(parse_answer(&body, false).is_err());
    }

    #[test]
    fn options_without_an_exact_rg_form_search_locally() {
        let mut o = opts("x");
        assert!(plan(&o).is_ok());
        o.walk.types = vec!["rust".into()];
        assert!(plan(&o).is_err());
        let mut o = opts("x");
        o.walk.follow = true;
        assert!(plan(&o).is_err());
        let o = opts("a\nb");
        assert!(plan(&o).is_err());
        let mut o = opts("-x");
        o.word = true;
        let p = plan(&o).unwrap();
        assert_eq!(p.min_major, MIN_RG_MAJOR_WORD);
        assert_eq!(&p.search[p.search.len() - 2..], ["-e", "-x"]);
    }
}
