//! `sbxfs ctl`: ask a mount for its stats or status, flush it, invalidate a path.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{ask, RouteArgs, ERROR};

#[derive(Args, Debug)]
pub(super) struct CtlArgs {
    #[command(subcommand)]
    action: CtlAction,
    /// A path in the mount to control (default: the current directory).
    #[arg(long, global = true, value_name = "MOUNTPOINT")]
    mount: Option<PathBuf>,
    /// The control socket of the mount to control.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "mount")]
    socket: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub(super) enum CtlAction {
    /// Cache hit ratio, bytes read and pushed, pending and failed commits, conflicts, latency.
    Stats,
    /// Push pending writes now; report failures.
    Flush,
    /// Forget cached data and attributes of a path.
    Invalidate { path: PathBuf },
    /// Which remote, whether it answered lately, what is pending (never waits for the sandbox).
    Status,
}

pub(super) fn run_ctl(a: CtlArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("sbxfs ctl: {m}");
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
        Ok(None) => return fail(format!("{} is not in a live sbxfs mount", here.display())),
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
            Ok(None) => return fail(format!("{} is not in a live sbxfs mount", path.display())),
            Err(e) => return fail(e.to_string()),
        },
    };
    match ask(&route, req) {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            if matches!(a.action, CtlAction::Flush) && v["flushed"] == false {
                return ERROR;
            }
            0
        }
        Err(e) => fail(e.to_string()),
    }
}
