//! `sbxfs watch`: the sandbox's changes under a path, as they happen, from the mount's
//! control socket: a line each for people, or JSON lines for tools.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::{logging::visible, RouteArgs, ERROR};

pub(super) const WATCH_HELP: &str = concat!(
    "\
Prints each change made in the sandbox (by its agent, a build, anything but this mount) under
PATH, within about a second: `created PATH`, `modified PATH`, `deleted PATH`, `renamed PATH →
NEW`. Paths are the workspace's (relative to the mount's root). Changes made through the mount
are not printed: the program that made them knows. Local file watchers (inotify: editors,
`cargo watch`, `tsc -w`) hear of the same changes through the mount itself.

Examples:
  sbxfs watch --mount ~/sb                     # everything in the mount
  cd ~/sb/src && sbxfs watch                   # what changes under src
  sbxfs watch --mount ~/sb --json | jq .       # {\"seq\":12,\"kind\":\"created\",\"path\":\"src/a.rs\"}
  sbxfs watch --mount ~/sb --json --since 12   # resume after the change numbered 12

Ctrl-C ends it. A line (stderr; JSON: {\"lost\": N}) says when changes were lost: the mount keeps
the last 65,536 for --since, and a watcher that falls far behind skips ahead. Numbers start
again at each mount: a --since from before gives {\"lost\": null, \"restarted\": true}. A burst
of more than 4,096 changes at once is told per directory (`modified DIR`) past that bound.

",
    exit_codes!()
);

#[derive(Args, Debug)]
pub(super) struct WatchArgs {
    /// What to watch: a directory (or file) in a mount; default the current directory.
    path: Option<PathBuf>,
    /// One JSON object per change: `seq`, `kind`, `path`, and `to` for a rename.
    #[arg(long)]
    json: bool,
    /// Print first the changes after this number (a `seq` seen before), then new ones.
    #[arg(long, value_name = "SEQ")]
    since: Option<u64>,
    #[command(flatten)]
    route: RouteArgs,
}

pub(super) fn run_watch(a: WatchArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("sbxfs watch: {}", visible(&m));
        ERROR
    };
    let path = a.path.clone().unwrap_or_else(|| PathBuf::from("."));
    let route = match a.route.route(&path) {
        Ok(Some(r)) => r,
        Ok(None) => return fail(format!("{} is not in a live sbxfs mount", path.display())),
        Err(e) => return fail(e.to_string()),
    };
    let req = crate::control::Request::Watch {
        path: crate::remote::WireBytes(route.path.clone()),
        since: a.since,
    };
    let lines = match crate::control::client::request(&route.socket, req) {
        Ok(l) => l,
        Err(e) => return fail(format!("{}: {e}", route.socket.display())),
    };
    let mut out = std::io::stdout().lock();
    for l in lines {
        let v = match l {
            Ok(v) => v,
            Err(e) => return fail(format!("the mount: {e}")),
        };
        if let Some(e) = super::socket_error(&v) {
            return fail(e.to_string());
        }
        let text = if a.json {
            // Characters that reorder the screen are sent as JSON escapes, as controls are.
            super::output::json_text(&v.to_string()) + "\n"
        } else if v.get("restarted").is_some() {
            eprintln!(
                "sbxfs watch: --since is from before this mount started (numbers start again at \
                 each mount): what changed meanwhile is unknown; live changes follow"
            );
            continue;
        } else if let Some(n) = v.get("lost") {
            eprintln!("sbxfs watch: {n} change(s) were lost");
            continue;
        } else {
            let field = |k: &str| visible(v.get(k).and_then(|s| s.as_str()).unwrap_or_default());
            match v.get("to").and_then(|t| t.as_str()) {
                Some(to) => format!("{} {} → {}\n", field("kind"), field("path"), visible(to)),
                None => format!("{} {}\n", field("kind"), field("path")),
            }
        };
        // A reader that went (`| head`): nothing more to say.
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return 0;
        }
    }
    fail("the mount ended".into())
}
