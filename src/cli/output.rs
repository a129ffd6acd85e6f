//! How results are printed: one JSON object per line (`--json`), or text (grep's is ripgrep's
//! own output, printed by the search; see `search::print`), with colour on a terminal. A closed pipe (`sbxfs grep … | head`) stops the search.

use std::io::{self, BufWriter, IsTerminal, Write};

use serde_json::json;

use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::{GrepMatch, GrepSummary};
use crate::search::print::PrintedFile;
use crate::search::scan::ScanResult;
use crate::search::SearchError;

const MATCH_COLOUR: &str = "\x1b[1;31m";
const RESET: &str = "\x1b[0m";

pub struct Printer {
    json: bool,
    colour: bool,
    out: BufWriter<io::Stdout>,
    /// The reader went away: stop producing.
    closed: bool,
    /// Matches whose output was handed to stdout whole (ripgrep's exit status when the reader
    /// goes away: 0 if a file searched before then matched).
    delivered: u64,
    /// grep -l: print each matching file's path once.
    pub files_only: bool,
    last_path: Option<String>,
    /// What ripgrep prints between two files' output (`--`, or a blank line under headings).
    pub file_separator: Option<&'static [u8]>,
    /// A file's output was printed already.
    written: bool,
    /// stdout is a terminal: a sandbox's name never reaches it raw.
    to_terminal: bool,
    /// grep -q: nothing is printed; what would have been still counts.
    pub quiet: bool,
}

/// Join a root given on the command line and a path relative to it, for display.
pub fn join_display(root: &str, rel: &str, root_is_dir: bool) -> String {
    if !root_is_dir {
        return root.to_string();
    }
    if root.ends_with('/') {
        format!("{root}{rel}")
    } else {
        format!("{root}/{rel}")
    }
}

impl Printer {
    pub fn new(json: bool) -> Self {
        let stdout = io::stdout();
        let to_terminal = stdout.is_terminal();
        let colour = !json && to_terminal && std::env::var_os("NO_COLOR").is_none();
        Printer {
            json,
            colour,
            out: BufWriter::new(stdout),
            closed: false,
            delivered: 0,
            files_only: false,
            last_path: None,
            file_separator: None,
            written: false,
            to_terminal,
            quiet: false,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> bool {
        if self.quiet {
            return true;
        }
        if !self.closed && self.out.write_all(bytes).is_err() {
            self.closed = true;
        }
        !self.closed
    }

    /// Whether the reader went away (a closed pipe: `sbxfs grep … | head`).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Matches printed whole before the reader went away (or all of them).
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    fn json_line<T: serde::Serialize>(&mut self, v: &T) -> bool {
        let mut line = json_text(&serde_json::to_string(v).expect("results serialise"));
        line.push('\n');
        self.write(line.as_bytes())
    }

    fn paint(&self, colour: &str, s: &str) -> String {
        if self.colour {
            format!("{colour}{s}{RESET}")
        } else {
            s.to_string()
        }
    }

    /// Print one match as JSON (`--json`); `false` when output is closed and the search
    /// should stop.
    pub fn grep_match(&mut self, m: &GrepMatch) -> bool {
        if self.files_only {
            if self.last_path.as_deref() == Some(m.path.as_str()) {
                return !self.closed;
            }
            self.last_path = Some(m.path.clone());
            let ok = self.json_line(&json!({ "path": m.path }));
            self.delivered += u64::from(ok);
            return ok;
        }
        let ok = self.json_line(m);
        self.delivered += u64::from(ok);
        ok
    }

    /// Print one file as ripgrep printed it, after ripgrep's separator between files;
    /// `false` when output is closed.
    pub fn printed_file(&mut self, f: &PrintedFile) -> bool {
        if f.printed.0.is_empty() {
            return !self.closed;
        }
        if let Some(sep) = self.file_separator.filter(|_| self.written) {
            self.write(sep);
        }
        self.written = true;
        let ok = self.write(&f.printed.0);
        if ok {
            self.delivered += f.matches;
        }
        ok
    }

    pub fn grep_summary(&mut self, s: &GrepSummary) {
        if self.quiet {
            return;
        }
        if self.json {
            self.json_line(&json!({"summary": s, "truncated": s.truncated}));
        } else if s.truncated && !self.closed {
            // A closed pipe ends the search quietly, as rg; this is a real cap.
            let matches = match s.matches {
                1 => "1 match".to_string(),
                n => format!("{n} matches"),
            };
            eprintln!("sbxfs grep: stopped at a limit after {matches} (truncated)");
        }
        self.flush();
    }

    /// Paths are the sandbox's names: their control characters (a terminal escape, a
    /// newline) are printed escaped, never raw; `--json` carries them exactly, and so does
    /// `null` (each followed by a NUL) unless stdout is a terminal.
    pub fn glob_path(&mut self, path: &str, null: bool) -> bool {
        if self.json {
            return self.json_line(&json!({ "path": path }));
        }
        if null && !self.to_terminal {
            return self.write(format!("{path}\0").as_bytes());
        }
        let end = if null { "\0" } else { "\n" };
        self.write(format!("{}{end}", super::logging::visible(path)).as_bytes())
    }

    pub fn fuzzy_match(&mut self, m: &FuzzyMatch) -> bool {
        if self.json {
            return self.json_line(m);
        }
        let text: String = m
            .path
            .chars()
            .enumerate()
            .map(|(i, c)| {
                // As in glob's output: a sandbox name's control characters (and the
                // characters that reorder the screen) escaped.
                let c = if c.is_control() || super::logging::reorders(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                };
                if self.colour && m.positions.contains(&i) {
                    self.paint(MATCH_COLOUR, &c)
                } else {
                    c
                }
            })
            .collect();
        self.write(format!("{text}\n").as_bytes())
    }

    pub fn scan_result(&mut self, r: &ScanResult, requested_end: Option<u64>) {
        if self.json {
            self.json_line(r);
        } else {
            for line in &r.lines {
                if !self.write(line) || !self.write(b"\n") {
                    break;
                }
            }
            if r.lines.is_empty() && r.start_line <= r.total_lines {
                eprintln!(
                    "sbxfs scan: line {} is {} bytes, more than --max-bytes allows",
                    r.start_line, r.first_line_bytes
                );
            } else if let Some(wanted) = stopped_short(r, requested_end) {
                eprintln!(
                    "sbxfs scan: stopped at line {} of {wanted} by the --max-bytes budget; \
                     go on with --start {}, or raise it (e.g. --max-bytes 1M)",
                    r.end_line,
                    r.end_line + 1
                );
            }
        }
        self.flush();
    }

    pub fn edit_count(&mut self, count: usize) {
        if self.json {
            self.json_line(&json!({ "count": count }));
        } else {
            let s = if count == 1 { "" } else { "s" };
            self.write(format!("replaced {count} occurrence{s}\n").as_bytes());
        }
        self.flush();
    }

    /// Report an error; returns the error exit code.
    pub fn error(&mut self, e: &SearchError) -> i32 {
        if self.json {
            let mut v = json!({ "error": e.token(), "message": e.to_string() });
            if let SearchError::MultipleOccurrences(n) = e {
                v["count"] = json!(n);
            }
            self.json_line(&v);
        } else {
            // The message may quote the sandbox (its names, its agent's words).
            eprintln!("sbxfs: {}", super::logging::visible(&e.to_string()));
        }
        self.flush();
        2
    }

    pub fn flush(&mut self) {
        if !self.closed && self.out.flush().is_err() {
            self.closed = true;
        }
    }
}

/// The last line the window should have reached (the one asked for, or the file's last), when
/// the byte budget, not the lines, ended it first.
fn stopped_short(r: &ScanResult, requested_end: Option<u64>) -> Option<u64> {
    let wanted = requested_end.map_or(r.total_lines, |e| e.min(r.total_lines));
    (!r.lines.is_empty() && r.end_line < wanted).then_some(wanted)
}

/// JSON as serde writes it, with the C1 controls (U+0080–U+009F: CSI among them, which some
/// terminals act on in UTF-8) escaped as `\u00XX`, as the C0 controls already are: a
/// sandbox's names reach a terminal as text. (They occur only inside strings.)
pub fn json_text(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // C1 controls, and the characters that reorder the screen (bidi overrides, isolates).
        if ('\u{80}'..='\u{9f}').contains(&c) || super::logging::reorders(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod json_tests {
    #[test]
    fn bidi_overrides_are_escaped_and_the_json_means_the_same() {
        let name = "bidi\u{202e}txt.exe\u{2066}x\u{200f}";
        let v = serde_json::json!({ "path": name });
        let text = super::json_text(&serde_json::to_string(&v).unwrap());
        assert!(!text.chars().any(crate::cli::logging::reorders), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["path"], name);
    }

    #[test]
    fn c1_controls_are_escaped_and_the_json_means_the_same() {
        let v = serde_json::json!({"path": "a\u{9b}31mb\u{85}\u{7f}é\u{a0}"});
        let text = super::json_text(&serde_json::to_string(&v).unwrap());
        assert!(
            !text.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)),
            "{text}"
        );
        assert!(text.contains("\\u009b") && text.contains("\\u0085"));
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), v);
    }
}
