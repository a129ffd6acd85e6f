//! `sbxfs ctl`: ask a mount for its stats or status, flush it, invalidate a path. The answer
//! is a table for people, or the mount's JSON with `--json`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{ask, RouteArgs, ERROR};

pub(super) const CTL_HELP: &str = concat!(
    "\
Examples:
  sbxfs ctl --mount ~/sb status            # which remote, reachable, what is pending
  cd ~/sb/src && sbxfs ctl stats           # the mount holding the current directory
  sbxfs ctl --mount ~/sb flush --json      # push pending writes now; JSON answer
  sbxfs ctl --mount ~/sb invalidate src/main.rs   # PATH relative to --mount (here the root)
  sbxfs ctl --mount ~/sb readlink evil     # a symlink's target as the sandbox has it

Exit code 0 on success; 2 when no mount answers, or when flush could not push everything; 1
when flush pushed everything but files met a change made in the sandbox since the last flush:
your versions were saved beside them as conflict copies, each named on stderr.

",
    exit_codes!()
);

#[derive(Args, Debug)]
pub(super) struct CtlArgs {
    #[command(subcommand)]
    action: CtlAction,
    /// The mount to control: its mountpoint, or any path in it (default: the current
    /// directory). Paths given to the action are then relative to that path.
    #[arg(long, global = true, value_name = "MOUNTPOINT")]
    mount: Option<PathBuf>,
    /// The control socket of the mount to control (`sbxfs ctl status` shows it).
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "mount")]
    socket: Option<PathBuf>,
    /// Print the mount's answer as JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub(super) enum CtlAction {
    /// Cache hit ratio, bytes read and pushed, pending and failed commits, conflicts, latency.
    Stats,
    /// Push pending writes now; report failures.
    Flush,
    /// Forget cached data and attributes of a path.
    Invalidate {
        /// The path to forget: relative to --mount's root when --mount is given, else to the
        /// current directory.
        path: PathBuf,
    },
    /// Which remote, whether it answered lately, what is pending (never waits for the sandbox).
    Status,
    /// Print a symlink's target as the sandbox has it (the mount itself shows targets outside
    /// the workspace under /dev/null/sbxfs-outside, so they never reach a local file).
    Readlink {
        /// The symlink: relative to --mount's root when --mount is given, else to the current
        /// directory.
        path: PathBuf,
    },
}

/// Why `path` names no mount: it does not exist, or it is outside every live mount (an
/// absolute path is this machine's, not the mount's: `/` is not the mount's root).
fn not_in_a_mount(path: &std::path::Path) -> String {
    if std::fs::symlink_metadata(path).is_err() {
        return format!("{}: no such file or directory", path.display());
    }
    let hint = if path.is_absolute() {
        " (without --mount a path is this machine's: `.` in the mount's root, or --mount MOUNTPOINT PATH)"
    } else {
        " (run it inside a mount, or give --mount MOUNTPOINT)"
    };
    format!("{} is not in a live sbxfs mount{hint}", path.display())
}

pub(super) fn run_ctl(a: CtlArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("sbxfs ctl: {}", super::logging::visible(&m));
        ERROR
    };
    let route_args = RouteArgs {
        mount: a.mount.clone(),
        socket: a.socket.clone(),
    };
    // The mount itself: `.` unless --mount/--socket say which; it is never run locally.
    let here = std::path::Path::new(".");
    let route = match route_args.route(here) {
        Ok(Some(r)) => r,
        Ok(None) => return fail(not_in_a_mount(here)),
        Err(e) => return fail(e.to_string()),
    };
    let req = match &a.action {
        CtlAction::Stats => crate::control::Request::Stats,
        CtlAction::Flush => crate::control::Request::Flush,
        CtlAction::Status => crate::control::Request::Status,
        CtlAction::Invalidate { path } => match route_args.route(path) {
            Ok(Some(r)) => crate::control::Request::Invalidate {
                path: crate::remote::WireBytes(r.path),
            },
            Ok(None) => return fail(not_in_a_mount(path)),
            Err(e) => return fail(e.to_string()),
        },
        CtlAction::Readlink { path } => match link_route(&route_args, path) {
            Ok(p) => crate::control::Request::Readlink {
                path: crate::remote::WireBytes(p),
            },
            Err(m) => return fail(m),
        },
    };
    match ask(&route, req) {
        Ok(v) => {
            // A reader that stops early (`| head`) is no error: nothing more to say.
            let quiet = |text: String| {
                use std::io::Write;
                let _ = std::io::stdout().lock().write_all(text.as_bytes());
            };
            if a.json {
                quiet(
                    super::output::json_text(&serde_json::to_string_pretty(&v).unwrap_or_default())
                        + "\n",
                );
            } else if matches!(a.action, CtlAction::Readlink { .. }) {
                print_target(&v);
            } else {
                quiet(table(&v));
            }
            if matches!(a.action, CtlAction::Flush) {
                return flush_verdict(&v);
            }
            0
        }
        Err(e) => fail(e.to_string()),
    }
}

/// The exit code of a flush: [`ERROR`] when something is not pushed; 1 when everything is but
/// files met a sandbox-side change since the last flush (each named on stderr: the user's
/// version is in a conflict copy, not at its path); 0 otherwise.
fn flush_verdict(v: &serde_json::Value) -> i32 {
    let list = |k: &str| v[k].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let text =
        |item: &serde_json::Value, k: &str| super::daemon::visible(item[k].as_str().unwrap_or("?"));
    for f in list("failures") {
        eprintln!(
            "sbxfs ctl: not pushed: {}: {} (kept; pushed again when the cause is fixed)",
            text(f, "path"),
            text(f, "error")
        );
    }
    let new = list("new_conflicts");
    for c in new {
        eprintln!(
            "sbxfs ctl: conflict: {} changed in the sandbox while it had unpushed edits; your \
             version was saved beside it as {}",
            text(c, "path"),
            text(c, "saved_as")
        );
    }
    if v["flushed"] == false {
        ERROR
    } else {
        i32::from(!new.is_empty())
    }
}

/// The workspace path of the link `path` names, found through its directory: the link itself
/// is never followed (its target may be a path that cannot resolve).
fn link_route(route_args: &RouteArgs, path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    let name = path
        .file_name()
        .filter(|n| *n != "..")
        .ok_or_else(|| format!("{}: not a symlink's path", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let mut p = match route_args.route(dir) {
        Ok(Some(r)) => r.path,
        Ok(None) => return Err(not_in_a_mount(path)),
        Err(e) => return Err(e.to_string()),
    };
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name.as_bytes());
    Ok(p)
}

/// A readlink answer as `readlink` prints it: the raw target bytes and a newline — on a
/// terminal with its control characters escaped (the sandbox chose the target, and a raw
/// escape would reach the terminal); `--json` carries it exactly.
fn print_target(v: &serde_json::Value) {
    use std::io::{IsTerminal, Write};
    let target = serde_json::from_value::<crate::remote::WireBytes>(v["target"].clone())
        .map(|w| w.0)
        .unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if out.is_terminal() {
        let shown = super::daemon::visible(&String::from_utf8_lossy(&target));
        let _ = out.write_all(shown.as_bytes());
    } else {
        let _ = out.write_all(&target);
    }
    let _ = out.write_all(b"\n");
}

/// Entries of a list the table shows (the latest).
const MAX_TABLE_ITEMS: usize = 10;

/// A JSON answer as a two-column table: each scalar under its dotted path (`cache.hits`,
/// `failed[0].path`), the names aligned.
fn table(v: &serde_json::Value) -> String {
    let mut rows = Vec::new();
    flatten(String::new(), v, &mut rows);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        // Paths and errors name the sandbox's files: never a raw escape on the terminal.
        .map(|(k, v)| format!("{k:width$}  {}\n", super::daemon::visible(v)))
        .collect()
}

fn flatten(prefix: String, v: &serde_json::Value, rows: &mut Vec<(String, String)>) {
    use serde_json::Value;
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                flatten(join(k), v, rows);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            // A long list (every conflict of a long-lived mount) shows its latest entries.
            let skip = a.len().saturating_sub(MAX_TABLE_ITEMS);
            if skip > 0 {
                rows.push((
                    prefix.clone(),
                    format!("{skip} earlier not shown (--json lists all {})", a.len()),
                ));
            }
            for (i, v) in a.iter().enumerate().skip(skip) {
                flatten(format!("{prefix}[{i}]"), v, rows);
            }
        }
        Value::Object(_) | Value::Array(_) => rows.push((prefix, "(none)".into())),
        Value::String(s) => rows.push((prefix, s.clone())),
        Value::Null => rows.push((prefix, "-".into())),
        // Measurements (milliseconds, ratios): three decimals say enough.
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or_default();
            let text = format!("{x:.3}");
            rows.push((
                prefix,
                text.trim_end_matches('0').trim_end_matches('.').into(),
            ))
        }
        other => rows.push((prefix, other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn measurements_are_rounded_in_the_table() {
        let t = super::table(
            &serde_json::json!({"round_trip_ms": 2.4010960000000003, "x": 2.5, "n": 7}),
        );
        assert_eq!(
            t,
            "n              7\nround_trip_ms  2.401\nx              2.5\n"
        );
    }

    #[test]
    fn a_long_list_shows_its_latest_entries_and_says_how_many_are_not_shown() {
        let conflicts: Vec<_> = (0..62)
            .map(|i| serde_json::json!({ "path": format!("f{i}") }))
            .collect();
        let t = super::table(&serde_json::json!({ "conflicts": conflicts }));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 11, "{t}");
        assert_eq!(
            lines[0],
            "conflicts           52 earlier not shown (--json lists all 62)"
        );
        assert_eq!(lines[10], "conflicts[61].path  f61");
    }

    #[test]
    fn a_table_has_one_aligned_row_per_value() {
        let v = serde_json::json!({"remote": "http://x", "cache": {"hits": 3, "misses": 10},
            "failed": [], "last": null, "pending": [{"path": "a"}]});
        assert_eq!(
            super::table(&v),
            "cache.hits       3\ncache.misses     10\nfailed           (none)\n\
             last             -\npending[0].path  a\nremote           http://x\n"
        );
    }
}
