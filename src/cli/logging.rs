//! Where the daemons' logs go and how they look: a `RUST_LOG`-style filter (`SBXFS_LOG`, else
//! `RUST_LOG`, else `info`), colour only on a terminal, and under systemd (stderr is the
//! journal) no timestamps or colour and the level as a syslog `<N>` prefix, which journald
//! turns into the entry's priority. fuser's own messages (multi-line WARNs, and errors
//! about replies to requests the kernel already gave up on) are off unless the filter names
//! `fuser` (e.g. `SBXFS_LOG=info,fuser=debug`): what matters of them reaches the mount as errors.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::{EitherWriter, MakeWriter};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Libraries whose messages are off unless the filter names them: fuser's (see above), the
/// TLS verifier's, which repeats as an ERROR what the mount's own error line says, and the
/// inotify watcher's, whose WARN per vanished watch a sandbox can trigger by the thousand with
/// renames (the change feed reports what matters itself).
const QUIET: [&str; 3] = ["fuser", "rustls_platform_verifier", "notify"];

/// The filter: the variable's directives, plus `TARGET=off` for each of [`QUIET`] they do not
/// name.
pub fn filter_spec(sbxfs_log: Option<&str>, rust_log: Option<&str>) -> String {
    let spec = sbxfs_log
        .or(rust_log)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("info");
    let mut spec = spec.to_string();
    for quiet in QUIET {
        if !spec.contains(quiet) {
            spec.push_str(&format!(",{quiet}=off"));
        }
    }
    spec
}

/// A line for the user on stderr (an error that ends the program, a warning), with its syslog
/// priority (3 error, 4 warning) in front when stderr is the journal, as log lines have.
pub fn user_line(priority: u8, line: &str) {
    // Errors quote what the sandbox said (an agent's version, a file name): never a raw
    // escape on the terminal.
    let line = visible(line);
    if crate::mount::notify::stderr_is_journal() {
        eprintln!("<{priority}>{line}");
    } else {
        eprintln!("{line}");
    }
}

/// A syslog priority prefix (`<3>` error … `<7>` debug) before each event.
struct SyslogPrefix<F>(F);

impl<S, N, F> FormatEvent<S, N> for SyslogPrefix<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Bidirectional marks, overrides and isolates: they reorder what follows them on screen
/// ("rlo\u{202e}txt.exe" shows as "rloexe.txt").
pub fn reorders(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with control characters (terminal escapes in a sandbox-chosen name) shown as
/// `\u{1b}`-style escapes.
pub fn visible(text: &str) -> String {
    // Bidirectional overrides and isolates reorder what follows them on screen
    // ("rlo\u{202e}txt.exe" shows as "rloexe.txt"): escaped as controls are.
    text.chars()
        .map(|c| {
            if c.is_control() || reorders(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Each field written with its control characters escaped ([`visible`]): the log names the
/// sandbox's files, and a name carrying a terminal escape must not reach the terminal (or a
/// file someone `cat`s) raw. The formatter's own colours stay.
fn escaped_fields() -> impl for<'w> FormatFields<'w> {
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = visible(&format!("{value:?}"));
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{}={text}", field.name())
        }
    })
    .delimited(" ")
}

/// While a background daemon starts, its stderr is still the terminal `sbxfs mount
/// --background` (or `mount -t fuse.sbxfs`) runs in: only warnings and errors go there; the
/// other lines are held here and written to the daemon's log once it has one.
static HELD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// From now until [`release_held`], lines below WARN are held ([`HELD`]).
pub fn hold_info_until_ready() {
    *HELD.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
}

/// The held lines to stderr (the log by now), and lines go there directly from now on.
pub fn release_held() {
    let held = HELD.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(lines) = held {
        let _ = std::io::stderr().write_all(&lines);
    }
}

/// stderr, or [`HELD`] for a line below WARN while lines are held.
struct StartupWriter;

/// Appends to [`HELD`] (to stderr if it was released meanwhile).
struct HeldLine;

impl std::io::Write for HeldLine {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match HELD.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(lines) => {
                lines.extend_from_slice(b);
                Ok(b.len())
            }
            None => std::io::stderr().write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for StartupWriter {
    type Writer = EitherWriter<std::io::Stderr, HeldLine>;

    fn make_writer(&'a self) -> Self::Writer {
        EitherWriter::A(std::io::stderr())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        let holding = HELD.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        if holding && *meta.level() > Level::WARN {
            EitherWriter::B(HeldLine)
        } else {
            EitherWriter::A(std::io::stderr())
        }
    }
}

/// Install the process's log subscriber (once; later calls do nothing).
pub fn init() {
    let spec = filter_spec(
        std::env::var("SBXFS_LOG").ok().as_deref(),
        std::env::var("RUST_LOG").ok().as_deref(),
    );
    let filter = tracing_subscriber::EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("sbxfs: ignoring the log filter {spec:?} ({e}); logging at info");
        tracing_subscriber::EnvFilter::new(filter_spec(None, None))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .fmt_fields(escaped_fields())
        .with_writer(StartupWriter);
    if crate::mount::notify::stderr_is_journal() {
        let format = tracing_subscriber::fmt::format()
            .without_time()
            .with_level(false)
            .with_ansi(false);
        let _ = builder
            .with_ansi(false)
            .event_format(SyslogPrefix(format))
            .try_init();
    } else {
        let _ = builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init();
    }
}

#[cfg(test)]
mod tests {
    use super::filter_spec;

    #[test]
    fn a_name_with_a_terminal_escape_is_logged_escaped() {
        use std::sync::{Arc, Mutex};
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(super::escaped_fields())
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let name = "c\u{1b}]0;TITLE\u{7}\u{1b}[2J";
            tracing::error!(file = %name, "conflict on {name}\nsecond line");
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("conflict on c\\u{1b}]0;TITLE"), "{text:?}");
        assert!(text.contains("file=c\\u{1b}]0;TITLE"), "{text:?}");
        assert_eq!(text.lines().count(), 1, "one line per event: {text:?}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn noisy_libraries_are_quiet_unless_named() {
        assert_eq!(
            filter_spec(None, None),
            "info,fuser=off,rustls_platform_verifier=off,notify=off"
        );
        assert_eq!(
            filter_spec(Some("trace"), Some("warn")),
            "trace,fuser=off,rustls_platform_verifier=off,notify=off"
        );
        assert_eq!(
            filter_spec(None, Some("debug")),
            "debug,fuser=off,rustls_platform_verifier=off,notify=off"
        );
        assert_eq!(
            filter_spec(Some("info,fuser=debug"), None),
            "info,fuser=debug,rustls_platform_verifier=off,notify=off"
        );
    }
}
