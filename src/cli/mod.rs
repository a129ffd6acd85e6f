//! The `sbxfs` command line. Each query subcommand runs the core on a local path; output is
//! ripgrep-like for people (colour on a terminal) or one JSON object per line with `--json`.
//! Exit codes like grep: 0 found, 1 nothing found, 2 error.

mod output;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::search::grep::GrepOptions;
use crate::search::scan::ScanRequest;
use crate::search::walk::WalkOptions;
use crate::search::{self, SearchError};
use output::Printer;

/// Default `scan` budget: a screenful of context for an agent, small enough to cross a slow link
/// in one round trip.
pub const DEFAULT_SCAN_MAX_BYTES: u64 = 64 * 1024;
/// Default number of `fuzzy` results: more than any picker shows.
pub const DEFAULT_FUZZY_LIMIT: usize = 100;

#[derive(Parser, Debug)]
#[command(
    name = "sbxfs",
    version,
    about = "Mount a sandbox's workspace; search it where it lives"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Search file contents for a regular expression (or a literal with -F).
    Grep(GrepArgs),
    /// List files and directories matching a glob pattern.
    Glob(GlobArgs),
    /// Rank files by a fuzzy query (fzf v1, path scheme).
    Fuzzy(FuzzyArgs),
    /// Print a window of a file's lines.
    Scan(ScanArgs),
    /// Replace a string in a file, atomically.
    Edit(EditArgs),
    /// Serve a workspace over HTTP for sbxfs mounts (run it inside the sandbox).
    Agent(AgentArgs),
    /// Mount a sandbox's workspace (foreground; SIGTERM pushes pending writes and unmounts).
    Mount(MountArgs),
    /// Unmount an sbxfs mount (its daemon pushes pending writes, then exits).
    Umount(UmountArgs),
    /// Control a mount: stats, flush, invalidate PATH, status.
    Ctl(CtlArgs),
    /// A delaying, byte-counting TCP proxy for tests and benchmarks.
    #[command(hide = true)]
    Proxy(ProxyArgs),
}

#[derive(Args, Debug)]
struct AgentArgs {
    /// The workspace directory to serve.
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on (port 0 picks a free port; the ready line says which).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: std::net::SocketAddr,
    /// File holding the bearer token (else the SBXFS_TOKEN environment variable).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct MountArgs {
    /// The sandbox: an agent URL, http://HOST:PORT.
    remote: String,
    mountpoint: PathBuf,
    /// Mount options, comma-separated: allow_other, default_permissions, ro, noexec,
    /// idmap=user|none, and every long flag below as KEY=VALUE (see README "Mount options").
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// File holding the agent's token (else the SBXFS_TOKEN environment variable).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// How long attributes and directory listings are trusted, in milliseconds [default: 1000].
    #[arg(long)]
    attr_ttl_ms: Option<u64>,
    /// Bytes of file data cached in memory (512M, 1G, …) [default: 512M].
    #[arg(long, value_parser = crate::mount::options::parse_size)]
    cache_size: Option<u64>,
    /// Where staged writes are kept (default: a private directory per sandbox under
    /// $XDG_CACHE_HOME/sbxfs/staging).
    #[arg(long)]
    staging_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct UmountArgs {
    mountpoint: PathBuf,
}

#[derive(Args, Debug)]
struct CtlArgs {
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
enum CtlAction {
    /// Cache hit ratio, bytes read and pushed, pending and failed commits, conflicts, latency.
    Stats,
    /// Push pending writes now; report failures.
    Flush,
    /// Forget cached data and attributes of a path.
    Invalidate { path: PathBuf },
    /// Which remote, whether it answered lately, what is pending (never waits for the sandbox).
    Status,
}

#[derive(Args, Debug)]
struct ProxyArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Delay applied to each direction, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

#[derive(Args, Debug)]
struct WalkArgs {
    /// Search hidden files and directories.
    #[arg(long)]
    hidden: bool,
    /// Don't respect .gitignore/.ignore/.rgignore files.
    #[arg(long)]
    no_ignore: bool,
    /// Include (G) or exclude (!G) files by glob; repeatable.
    #[arg(short = 'g', long = "glob", value_name = "G")]
    globs: Vec<String>,
    /// Skip files larger than this many bytes.
    #[arg(long, value_name = "BYTES")]
    max_filesize: Option<u64>,
}

impl WalkArgs {
    fn options(&self) -> WalkOptions {
        WalkOptions {
            hidden: self.hidden,
            no_ignore: self.no_ignore,
            globs: self.globs.clone(),
            max_filesize: self.max_filesize,
        }
    }
}

/// Where a query goes when its path is not inside a mount the command can see.
#[derive(Args, Debug, Clone, Default)]
struct RouteArgs {
    /// Ask this sbxfs mount; paths are then relative to its root.
    #[arg(long, value_name = "MOUNTPOINT")]
    mount: Option<PathBuf>,
    /// Ask the mount listening on this control socket; paths are workspace paths.
    #[arg(long, value_name = "PATH", conflicts_with = "mount")]
    socket: Option<PathBuf>,
}

impl RouteArgs {
    /// The route for `path`. `--socket`/`--mount` must name a live mount: anything else is an
    /// error, never a silent local run. Without them the INFO ioctl on `path` decides (`None`:
    /// not in a mount, run locally).
    fn route(
        &self,
        path: &std::path::Path,
    ) -> Result<Option<crate::control::client::Route>, SearchError> {
        use crate::control::client;
        if let Some(socket) = &self.socket {
            check_socket(socket)?;
            return Ok(Some(client::Route {
                socket: socket.clone(),
                path: workspace_rel(path),
                info: crate::control::MountInfo {
                    v: crate::control::PROTOCOL_VERSION,
                    mountpoint: String::new(),
                    socket: socket.display().to_string(),
                    remote: String::new(),
                    path: Default::default(),
                    version: None,
                },
                on: None,
            }));
        }
        let Some(m) = &self.mount else {
            return Ok(client::route(path));
        };
        let Some(root) = client::mount_info(m) else {
            return Err(SearchError::Io(
                format!("--mount {}", m.display()),
                "not a live sbxfs mount (no sbxfs mount answers there)".into(),
            ));
        };
        if let Some(r) = client::route(&m.join(path)) {
            return Ok(Some(r));
        }
        // A path the mount does not show (yet): the sandbox answers about it (`not_found`),
        // never the local disk.
        let mut p = root.path.0.clone();
        let rel = workspace_rel(path);
        if !p.is_empty() && !rel.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(&rel);
        Ok(Some(client::Route {
            socket: PathBuf::from(&root.socket),
            path: p,
            info: root,
            on: None,
        }))
    }
}

/// A command-line path as a workspace path: `./` and a lone `.` dropped.
fn workspace_rel(p: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    let b = b.strip_prefix(b"./").unwrap_or(b);
    if b == b"." {
        Vec::new()
    } else {
        b.trim_ascii_end().to_vec()
    }
}

/// `--socket PATH` must be a live mount's control socket.
fn check_socket(socket: &std::path::Path) -> Result<(), SearchError> {
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(_) => Ok(()),
        Err(e) => Err(SearchError::Io(
            format!("--socket {}", socket.display()),
            format!("no live sbxfs mount listens there ({e})"),
        )),
    }
}

#[derive(Args, Debug)]
struct GrepArgs {
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
struct GlobArgs {
    pattern: String,
    #[arg(default_value = ".")]
    dir: PathBuf,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
struct FuzzyArgs {
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

#[derive(Args, Debug)]
struct ScanArgs {
    file: PathBuf,
    /// First line (1-based).
    #[arg(long, default_value_t = 1)]
    start: u64,
    /// Last line, inclusive (default: to the end, as far as --max-bytes allows).
    #[arg(long)]
    end: Option<u64>,
    #[arg(long, default_value_t = DEFAULT_SCAN_MAX_BYTES)]
    max_bytes: u64,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

#[derive(Args, Debug)]
struct EditArgs {
    file: PathBuf,
    #[arg(long, required_unless_present = "old_file", allow_hyphen_values = true)]
    old: Option<OsString>,
    #[arg(long, required_unless_present = "new_file", allow_hyphen_values = true)]
    new: Option<OsString>,
    /// Read the text to replace from a file.
    #[arg(long, conflicts_with = "old")]
    old_file: Option<PathBuf>,
    /// Read the replacement text from a file.
    #[arg(long, conflicts_with = "new")]
    new_file: Option<PathBuf>,
    /// Replace every occurrence.
    #[arg(long)]
    all: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    route: RouteArgs,
}

/// Run the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Grep(a) => run_grep(a),
        Command::Glob(a) => run_glob(a),
        Command::Fuzzy(a) => run_fuzzy(a),
        Command::Scan(a) => run_scan(a),
        Command::Edit(a) => run_edit(a),
        Command::Agent(a) => run_agent(a),
        Command::Mount(a) => run_mount(a),
        Command::Umount(a) => run_umount(a),
        Command::Ctl(a) => run_ctl(a),
        Command::Proxy(a) => run_proxy(a),
    }
}

/// The token a daemon uses: from a file (trailing whitespace trimmed) or `SBXFS_TOKEN`; never
/// from argv, where other users could read it.
pub fn load_token(file: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    let token = match file {
        Some(f) => std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?,
        None => std::env::var_os("SBXFS_TOKEN")
            .map(std::ffi::OsString::into_encoded_bytes)
            .ok_or_else(|| {
                anyhow::anyhow!("no token: pass --token-file FILE or set SBXFS_TOKEN")
            })?,
    };
    let token = token.trim_ascii().to_vec();
    anyhow::ensure!(!token.is_empty(), "the token is empty");
    Ok(token)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SBXFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run_agent(a: AgentArgs) -> i32 {
    init_logging();
    let result = load_token(a.token_file.as_deref()).and_then(|token| {
        let rt = tokio::runtime::Runtime::new()?;
        rt.block_on(crate::agent::serve(crate::agent::AgentConfig {
            root: a.root,
            listen: a.listen,
            token,
        }))
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbxfs agent: {e:#}");
            ERROR
        }
    }
}

fn run_mount(a: MountArgs) -> i32 {
    init_logging();
    let mut o = crate::mount::options::MountOptions::default();
    for arg in &a.options {
        if let Err(e) = o.parse_into(arg) {
            eprintln!("sbxfs mount: {e} (see the README's \"Mount options\")");
            return ERROR;
        }
    }
    // `-o` wins over the flag of the same name.
    let token_file = o.token_file.or(a.token_file);
    let result = load_token(token_file.as_deref()).and_then(|token| {
        let mut cfg = crate::mount::MountConfig::new(a.remote, token, a.mountpoint);
        if let Some(ms) = o.attr_ttl_ms.or(a.attr_ttl_ms) {
            cfg.attr_ttl = std::time::Duration::from_millis(ms);
        }
        if let Some(bytes) = o.cache_size.or(a.cache_size) {
            cfg.cache_bytes = bytes;
        }
        if let Some(ms) = o.timeout_ms {
            cfg.call_timeout = std::time::Duration::from_millis(ms);
        }
        cfg.staging_dir = o.staging_dir.or(a.staging_dir);
        cfg.allow_other = o.allow_other;
        // `default_permissions` is on whatever -o says (`o.default_permissions` only confirms
        // it): without it nothing would check mode bits at all.
        cfg.read_only = o.read_only.unwrap_or(false);
        cfg.no_exec = o.no_exec.unwrap_or(false);
        cfg.idmap = o.idmap.unwrap_or_default();
        crate::mount::run(cfg)
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbxfs mount: {e:#}");
            ERROR
        }
    }
}

fn run_umount(a: UmountArgs) -> i32 {
    // The daemon sees its session end, pushes what is staged, and exits.
    match std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&a.mountpoint)
        .status()
    {
        Ok(s) if s.success() => 0,
        Ok(_) => ERROR,
        Err(e) => {
            eprintln!("sbxfs umount: fusermount3: {e}");
            ERROR
        }
    }
}

/// An error line from the control socket, as the core's error.
fn socket_error(v: &serde_json::Value) -> Option<SearchError> {
    v.get("error")?;
    let body: crate::remote::wire::ErrorBody = serde_json::from_value(v.clone()).ok()?;
    Some(match body.into_error() {
        crate::remote::RemoteError::Query(e) => e,
        crate::remote::RemoteError::NotFound(m) => SearchError::NotFound(m),
        crate::remote::RemoteError::IsDir(m) => SearchError::IsADirectory(m),
        other => SearchError::Io("sandbox".into(), other.to_string()),
    })
}

/// Ask the mount a one-answer question through its socket.
fn ask(
    route: &crate::control::client::Route,
    req: crate::control::Request,
) -> Result<serde_json::Value, SearchError> {
    let mut lines = crate::control::client::request(&route.socket, req)
        .map_err(|e| SearchError::Io(route.socket.display().to_string(), e.to_string()))?;
    let v = lines
        .next()
        .ok_or_else(|| SearchError::Io("control socket".into(), "no answer".into()))?
        .map_err(|e| SearchError::Io("control socket".into(), e.to_string()))?;
    match socket_error(&v) {
        Some(e) => Err(e),
        None => Ok(v),
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

fn run_ctl(a: CtlArgs) -> i32 {
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

fn run_proxy(a: ProxyArgs) -> i32 {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sbxfs proxy: {e}");
            return ERROR;
        }
    };
    rt.block_on(async {
        let delay = std::time::Duration::from_millis(a.delay_ms);
        let proxy = match crate::proxy::Proxy::start(a.listen, a.to, delay).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sbxfs proxy: {e}");
                return ERROR;
            }
        };
        println!("sbxfs proxy listening on {} -> {}", proxy.addr, a.to);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let c = &proxy.counters;
        use std::sync::atomic::Ordering::Relaxed;
        println!(
            "bytes up={} down={} connections={}",
            c.up.load(Relaxed),
            c.down.load(Relaxed),
            c.connections.load(Relaxed)
        );
        0
    })
}

const FOUND: i32 = 0;
const NOTHING: i32 = 1;
const ERROR: i32 = 2;

fn found(any: bool) -> i32 {
    if any {
        FOUND
    } else {
        NOTHING
    }
}

fn run_grep(a: GrepArgs) -> i32 {
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

fn run_glob(a: GlobArgs) -> i32 {
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

fn run_fuzzy(a: FuzzyArgs) -> i32 {
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

fn run_scan(a: ScanArgs) -> i32 {
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
            p.scan_result(&r);
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

fn run_edit(a: EditArgs) -> i32 {
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
