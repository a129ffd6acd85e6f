//! The `sbxfs` command line. Each query subcommand runs the core on a local path; output is
//! ripgrep-like for people (colour on a terminal) or one JSON object per line with `--json`.
//! Exit codes like grep: 0 found, 1 nothing found, 2 error; `mount` adds 3 to 7 for why it could
//! not start (the table: `exit_codes!`; the values live in `mount::exit`).

/// The exit codes as a string literal, for the `--help` texts (`concat!` needs a literal); the
/// README's Troubleshooting lists the same.
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0  success (grep, glob, fuzzy, scan: something was found)
  1  grep, glob, fuzzy, scan: nothing found; edit: the text to replace does not occur;
     ctl flush: all pushed, but files met sandbox-side changes (saved as conflict copies)
  2  usage error, bad argument (a bad URL among them), or any other error
  3  mount: the mountpoint cannot be used (missing, not a directory, not empty, already mounted)
  4  mount: FUSE is missing or not permitted (no /dev/fuse, no fusermount3, mount refused)
  5  the sandbox could not be reached: connection refused, host name not resolved, no answer in time
  6  what answered is not an sbxfs agent this sbxfs can use: another server, a TLS failure,
     another protocol version
  7  the agent rejected the token"
    };
}

mod ctl;
mod daemon;
pub(crate) mod logging;
mod output;
mod query;
mod watch;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::search::walk::WalkOptions;
use crate::search::SearchError;
pub use query::{DEFAULT_FUZZY_LIMIT, DEFAULT_SCAN_MAX_BYTES};

/// `--version`: the program's version and the protocols it speaks (an agent and a mount must
/// speak the same agent protocol; the query commands and a mount, the same control protocol).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (agent protocol 2, control protocol 1)"
);

const TOP_HELP: &str = concat!(
    "\
Examples:
  sbxfs agent --root /workspace                       # in the sandbox (token in SBXFS_TOKEN)
  ssh -N -L 7070:127.0.0.1:7070 sandbox &             # on the laptop: a tunnel to it
  sbxfs mount http://127.0.0.1:7070 ~/sb --token-file ~/.config/sbxfs/token
  cd ~/sb && sbxfs grep -n TODO src                   # runs in the sandbox
  sbxfs ctl --mount ~/sb status
  sbxfs umount ~/sb

Environment:
  SBXFS_TOKEN  the bearer token, when no --token-file is given
  SBXFS_LOG    log filter, RUST_LOG syntax (e.g. debug, or sbxfs=trace,info); else RUST_LOG;
               default info. fuser's own messages are off unless named (info,fuser=debug)

",
    exit_codes!()
);

#[derive(Parser, Debug)]
#[command(
    name = "sbxfs",
    version = VERSION,
    about = "Mount a sandbox's workspace; search it where it lives",
    after_long_help = TOP_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Search file contents for a regular expression (or a literal with -F).
    Grep(query::GrepArgs),
    /// List files and directories matching a glob pattern.
    Glob(query::GlobArgs),
    /// Rank files by a fuzzy query (fzf v1, path scheme).
    Fuzzy(query::FuzzyArgs),
    /// Print a window of a file's lines.
    #[command(after_long_help = query::SCAN_HELP)]
    Scan(query::ScanArgs),
    /// Replace a string in a file, atomically.
    #[command(after_long_help = query::EDIT_HELP)]
    Edit(query::EditArgs),
    /// Print the sandbox's changes under a path as they happen (created, modified, …).
    #[command(after_long_help = watch::WATCH_HELP)]
    Watch(watch::WatchArgs),
    /// Serve a workspace over HTTP for sbxfs mounts (run it inside the sandbox).
    #[command(after_long_help = daemon::AGENT_HELP)]
    Agent(daemon::AgentArgs),
    /// Mount a sandbox's workspace (foreground; SIGTERM pushes pending writes and unmounts).
    #[command(after_long_help = daemon::MOUNT_HELP)]
    Mount(daemon::MountArgs),
    /// Unmount an sbxfs mount (its daemon pushes pending writes, then exits).
    #[command(after_long_help = daemon::UMOUNT_HELP)]
    Umount(daemon::UmountArgs),
    /// Control a mount: stats, flush, invalidate PATH, status.
    #[command(after_long_help = ctl::CTL_HELP)]
    Ctl(ctl::CtlArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_long_help = "\
Examples:
  sbxfs completions bash > ~/.local/share/bash-completion/completions/sbxfs
  sbxfs completions zsh > ~/.zfunc/_sbxfs        # with fpath+=(~/.zfunc) in ~/.zshrc
  sbxfs completions fish > ~/.config/fish/completions/sbxfs.fish")]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff), made from this command line's definition.
    #[command(after_long_help = "\
Examples:
  sbxfs man | man -l -                       # sbxfs(1)
  sbxfs man grep | man -l -                  # sbxfs-grep(1): every option of one command
  sbxfs man --dir ~/.local/share/man/man1 && man sbxfs-mount")]
    Man {
        /// The command whose page to print (default: sbxfs(1), the overview).
        command: Option<String>,
        /// Write every page (sbxfs.1 and sbxfs-COMMAND.1) into this directory instead.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        dir: Option<PathBuf>,
    },
    /// A delaying, byte-counting TCP proxy for tests and benchmarks.
    #[command(hide = true)]
    Proxy(daemon::ProxyArgs),
}

#[derive(Args, Debug)]
pub(super) struct WalkArgs {
    /// Search hidden files and directories.
    #[arg(long)]
    hidden: bool,
    /// Don't respect .gitignore/.ignore/.rgignore files.
    #[arg(long)]
    no_ignore: bool,
    /// Include (G) or exclude (!G) files by glob; repeatable.
    #[arg(short = 'g', long = "glob", value_name = "G")]
    globs: Vec<String>,
    /// Skip files larger than this (bytes, or 512K, 10M, …).
    #[arg(long, value_name = "SIZE", value_parser = crate::mount::options::parse_size)]
    max_filesize: Option<u64>,
}

impl WalkArgs {
    fn options(&self) -> WalkOptions {
        WalkOptions {
            hidden: self.hidden,
            no_ignore: self.no_ignore,
            globs: self.globs.clone(),
            max_filesize: self.max_filesize,
            ..Default::default()
        }
    }
}

/// Where a query goes when its path is not inside a mount the command can see.
#[derive(Args, Debug, Clone, Default)]
pub(super) struct RouteArgs {
    /// Ask the sbxfs mount this path is in; paths are then relative to it.
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

/// A command-line path as a workspace path, relative to the mount's root: leading `/` (`/` is
/// the root, as in `ctl --mount M invalidate /`), `./`, a lone `.` and trailing `/` dropped.
fn workspace_rel(p: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut b = p.as_os_str().as_bytes().trim_ascii_end();
    loop {
        let before = b.len();
        while let Some(rest) = b.strip_prefix(b"/") {
            b = rest;
        }
        while let Some(rest) = b.strip_prefix(b"./") {
            b = rest;
        }
        while let Some(rest) = b.strip_suffix(b"/") {
            b = rest;
        }
        if b.len() == before {
            break;
        }
    }
    if b == b"." {
        Vec::new()
    } else {
        b.to_vec()
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

/// `mount -t fuse.sbxfs` and fstab run `sbxfs REMOTE MOUNTPOINT -o OPTIONS` (see
/// `mount.fuse3(8)`): that form means `sbxfs mount --background REMOTE MOUNTPOINT -o OPTIONS`
/// (`-f` keeps it in the foreground). A remote has a `:` (`http://…`, `host:port`); no
/// subcommand does.
fn mount_helper_argv(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let word = |a: &std::ffi::OsString| !a.to_string_lossy().starts_with('-');
    match args.get(1..3) {
        Some([remote, mountpoint])
            if word(remote) && word(mountpoint) && remote.to_string_lossy().contains(':') =>
        {
            let mut rewritten = vec![args[0].clone(), "mount".into(), "--background".into()];
            rewritten.extend_from_slice(&args[1..]);
            rewritten
        }
        _ => args,
    }
}

/// The command line's definition (for completions and the man page).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Run the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse_from(mount_helper_argv(std::env::args_os().collect()));
    match cli.command {
        Command::Grep(a) => query::run_grep(a),
        Command::Glob(a) => query::run_glob(a),
        Command::Fuzzy(a) => query::run_fuzzy(a),
        Command::Scan(a) => query::run_scan(a),
        Command::Edit(a) => query::run_edit(a),
        Command::Agent(a) => daemon::run_agent(a),
        Command::Mount(a) => daemon::run_mount(a),
        Command::Umount(a) => daemon::run_umount(a),
        Command::Ctl(a) => ctl::run_ctl(a),
        Command::Watch(a) => watch::run_watch(a),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command(), "sbxfs", &mut script);
            print_all("completions", &script)
        }
        Command::Man { command: name, dir } => run_man(name, dir),
        Command::Proxy(a) => daemon::run_proxy(a),
    }
}

/// Write `bytes` to stdout; a reader that went away (`| head`) is not an error.
fn print_all(what: &str, bytes: &[u8]) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("sbxfs {what}: {e}");
            ERROR
        }
    }
}

/// `sbxfs man [COMMAND] [--dir DIR]`: sbxfs(1), one command's page (sbxfs-grep(1)), or all of
/// them written to a directory.
fn run_man(name: Option<String>, dir: Option<PathBuf>) -> i32 {
    let fail = |m: String| {
        eprintln!("sbxfs man: {m}");
        ERROR
    };
    let Some(dir) = dir else {
        return match man_page(name.as_deref()) {
            Ok(roff) => print_all("man", &roff),
            Err(m) => fail(m),
        };
    };
    // Made if missing, as `install -D` would: ~/.local/share/man/man1 often is.
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return fail(format!("{}: {e}", dir.display()));
    }
    let mut names = vec![None];
    names.extend(man_commands().into_iter().map(Some));
    for name in names {
        let file = dir.join(match &name {
            None => "sbxfs.1".to_string(),
            Some(n) => format!("sbxfs-{n}.1"),
        });
        let written = man_page(name.as_deref())
            .and_then(|roff| std::fs::write(&file, roff).map_err(|e| e.to_string()));
        if let Err(m) = written {
            return fail(format!("{}: {m}", file.display()));
        }
    }
    0
}

/// The commands that get a page of their own: every visible one but `help`.
fn man_commands() -> Vec<String> {
    command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name().to_string())
        .collect()
}

/// One page as roff: sbxfs(1), or sbxfs-NAME(1) with every option of that command.
fn man_page(name: Option<&str>) -> Result<Vec<u8>, String> {
    let mut cmd = command();
    cmd.build();
    let page = match name {
        None => cmd,
        Some(name) if man_commands().iter().any(|c| c == name) => {
            let sub = cmd.find_subcommand(name).cloned().unwrap_or_default();
            // A one-shot command: the leaked name lives as long as the process anyway.
            sub.name(&*Box::leak(format!("sbxfs-{name}").into_boxed_str()))
                .version(VERSION)
        }
        Some(name) => return Err(format!("no command `{name}` (see sbxfs --help)")),
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .map_err(|e| e.to_string())?;
    Ok(roff)
}

/// The token a daemon uses: from a file (trailing whitespace trimmed) or `SBXFS_TOKEN`; never
/// from argv, where other users could read it.
pub fn load_token(file: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    let token = match file {
        Some(f) => {
            std::fs::read(f).map_err(|e| anyhow::anyhow!("--token-file {}: {e}", f.display()))?
        }
        None => std::env::var_os("SBXFS_TOKEN")
            .map(std::ffi::OsString::into_encoded_bytes)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no token: pass --token-file FILE (for a mount also -o token_file=FILE) or set SBXFS_TOKEN"
                )
            })?,
    };
    let token = token.trim_ascii().to_vec();
    anyhow::ensure!(!token.is_empty(), "the token is empty");
    Ok(token)
}

fn init_logging() {
    logging::init();
}

/// An error line from the control socket, as the core's error.
fn socket_error(v: &serde_json::Value) -> Option<SearchError> {
    v.get("error")?;
    let body: crate::remote::wire::ErrorBody = serde_json::from_value(v.clone()).ok()?;
    Some(match body.into_error() {
        crate::remote::RemoteError::Query(e) => e,
        crate::remote::RemoteError::NotFound(m) => SearchError::NotFound(m),
        crate::remote::RemoteError::IsDir(m) => SearchError::IsADirectory(m),
        // Errors about no path in particular read "the sandbox: transport: …", not ": : …".
        other => SearchError::Io(
            "the sandbox".into(),
            other.to_string().trim_start_matches(": ").to_string(),
        ),
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

#[cfg(test)]
mod tests {
    use super::mount_helper_argv;

    #[test]
    fn the_version_names_the_protocols_this_build_speaks() {
        let agent = format!("agent protocol {}", crate::remote::wire::PROTOCOL_VERSION);
        let control = format!("control protocol {}", crate::control::PROTOCOL_VERSION);
        assert!(super::VERSION.contains(&agent), "{}", super::VERSION);
        assert!(super::VERSION.contains(&control), "{}", super::VERSION);
    }

    #[test]
    fn paths_given_with_mount_are_relative_to_its_root() {
        let rel = |p: &str| String::from_utf8(super::workspace_rel(p.as_ref())).unwrap();
        for root in ["/", ".", "./", "//", "/./", ""] {
            assert_eq!(rel(root), "", "{root:?}");
        }
        assert_eq!(rel("/src/main.rs"), "src/main.rs");
        assert_eq!(rel("./src/"), "src");
        assert_eq!(rel("src/a b"), "src/a b");
        assert_eq!(rel(".hidden"), ".hidden");
    }

    fn argv(words: &[&str]) -> Vec<std::ffi::OsString> {
        words.iter().map(Into::into).collect()
    }

    #[test]
    fn what_mount_fuse3_runs_is_a_background_mount_and_subcommands_stay() {
        assert_eq!(
            mount_helper_argv(argv(&["sbxfs", "http://h:1", "/m", "-o", "rw,dev,suid"])),
            argv(&[
                "sbxfs",
                "mount",
                "--background",
                "http://h:1",
                "/m",
                "-o",
                "rw,dev,suid"
            ])
        );
        for unchanged in [
            &["sbxfs", "mount", "http://h:1", "/m"][..],
            &["sbxfs", "grep", "a:b", "src"],
            &["sbxfs", "http://h:1"],
            &["sbxfs", "--version"],
        ] {
            assert_eq!(mount_helper_argv(argv(unchanged)), argv(unchanged));
        }
    }
}
