//! The long-running commands: `agent` (in the sandbox), `mount`/`umount` (on the laptop), and
//! the hidden test `proxy`.

use std::path::PathBuf;

use clap::Args;

use super::{init_logging, load_token, ERROR};

pub(super) const AGENT_HELP: &str = concat!(
    "\
Examples:
  SBXFS_TOKEN=$(cat /etc/sbxfs/token) sbxfs agent --root /workspace
  sbxfs agent --root /workspace --listen localhost:7070 --token-file /etc/sbxfs/token
  sbxfs agent --root . --listen 127.0.0.1:0 --token-file token   # a free port; see the ready line

The agent prints `sbxfs agent listening on http://ADDR root=DIR` once it serves.
Reach it from the laptop through an ssh tunnel: ssh -N -L 7070:127.0.0.1:7070 SANDBOX

",
    exit_codes!()
);

pub(super) const MOUNT_HELP: &str = concat!(
    "\
Examples:
  sbxfs mount http://127.0.0.1:7070 ~/sb --token-file ~/.config/sbxfs/token
  sbxfs mount http://127.0.0.1:7070 ~/sb -o ro,cache_size=1G,timeout_ms=30000
  sbxfs mount https://sb.example:7443 ~/sb --token-file t --ca-file ca.pem --header-file h
  SBXFS_LOG=debug sbxfs mount http://127.0.0.1:7070 ~/sb 2> mount.log

The mount prints `sbxfs mounted URL on DIR` once it serves, and stays in the foreground.
While the agent has not answered yet it says so every 5 s (`still waiting for URL`).

",
    exit_codes!()
);

pub(super) const UMOUNT_HELP: &str = concat!(
    "\
Examples:
  sbxfs umount ~/sb          # pending writes are pushed first (as fusermount3 -u ~/sb)

",
    exit_codes!()
);

#[derive(Args, Debug)]
pub(super) struct AgentArgs {
    /// The workspace directory to serve.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Address to listen on, HOST:PORT; a host name is resolved (port 0 picks a free port; the
    /// ready line says which). Keep it on loopback and reach it through an ssh tunnel: the
    /// token and the files travel in clear. `unix:/PATH` listens on a Unix socket instead
    /// (made 0600; what `sbxfs mount ssh://…` starts, reached through the ssh channel).
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "HOST:PORT", value_parser = parse_listen)]
    listen: crate::agent::ListenAddr,
    /// Speak on standard input and output instead of listening (one HTTP/2 connection; what
    /// `sbxfs mount shell:`/`exec:` starts through its exec channel). No token: the channel
    /// is the authentication. Exits when its input closes.
    #[arg(long, conflicts_with_all = ["listen", "token_file", "tls_cert", "exit_when_idle"])]
    stdio: bool,
    /// File holding the bearer token (else the SBXFS_TOKEN environment variable).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Exit once no client has been connected for SECS seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    exit_when_idle: Option<u64>,
    /// Longest a grep, glob, fuzzy search or scan may run, in seconds; it is also stopped as
    /// soon as its client disconnects.
    #[arg(long, value_name = "SECS", default_value_t = crate::agent::SEARCH_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    search_timeout: u64,
    /// Do not confine the agent with Landlock (by default it restricts itself to the workspace
    /// and read-only /proc/self and library directories at start).
    #[arg(long)]
    no_landlock: bool,
    /// Keep set-user-ID and set-group-ID bits that requests set (create, chmod, commits).
    /// Off by default: a token holder could otherwise make a setuid-root program when the
    /// agent runs as root.
    #[arg(long)]
    allow_setid: bool,
    /// Serve https with this certificate chain (PEM, the server's certificate first); with
    /// --tls-key. For a port reached without an ssh tunnel.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct MountArgs {
    /// The sandbox: http(s)://HOST:PORT (its agent), ssh://[USER@]HOST[:PORT]/PATH,
    /// shell:/PATH, exec:/PATH (with --exec) or agentscope+http(s)://HOST:PORT.
    remote: String,
    /// The empty directory to mount on.
    mountpoint: PathBuf,
    /// Mount options, comma-separated: allow_other, default_permissions, ro, noexec,
    /// idmap=none|user, nonempty, sync_close, timeout_ms=MS, token_file=FILE, and every long
    /// flag below as KEY=VALUE (see README "Mount options"; mount(8)'s own options are
    /// accepted and ignored).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// File holding the agent's token (else the SBXFS_TOKEN environment variable); http(s) and
    /// agentscope only.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// https: more trusted certificate authorities (PEM, one or more), besides the system's.
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// http(s): extra request headers, one `Name: value` per line (`#` comments), for
    /// providers that authenticate preview URLs by a header. Values are never logged.
    #[arg(long, value_name = "FILE")]
    header_file: Option<PathBuf>,
    /// exec:: the command that runs a shell in the sandbox, its stdin/stdout the script's
    /// (e.g. 'docker exec -i CONTAINER sh').
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// ssh://: the ssh config file to use (as ssh -F).
    #[arg(short = 'F', value_name = "CONFIG")]
    ssh_config: Option<PathBuf>,
    /// How long attributes and directory listings are trusted, in milliseconds [default: 1000].
    #[arg(long, value_name = "MS")]
    attr_ttl_ms: Option<u64>,
    /// Bytes of file data cached in memory (512M, 1G, …) [default: 512M].
    #[arg(long, value_name = "SIZE", value_parser = crate::mount::options::parse_size)]
    cache_size: Option<u64>,
    /// Bytes of file data kept on disk, per sandbox, so a remount reads unchanged files
    /// without fetching them (0 turns it off) [default: 1G].
    #[arg(long, value_name = "SIZE", value_parser = crate::mount::options::parse_size)]
    disk_cache_size: Option<u64>,
    /// Where staged writes are kept (default: a private directory per sandbox under
    /// $XDG_CACHE_HOME/sbxfs/staging).
    #[arg(long, value_name = "DIR")]
    staging_dir: Option<PathBuf>,
    /// Return once the mount answers and serve from the background (what `mount -t fuse.sbxfs`
    /// and fstab run).
    #[arg(long, overrides_with = "foreground")]
    background: bool,
    /// Stay in the foreground (the default of `sbxfs mount`).
    #[arg(short = 'f', long, overrides_with = "background")]
    foreground: bool,
    /// The daemon that --background starts.
    #[arg(long, hide = true)]
    detached: bool,
}

#[derive(Args, Debug)]
pub(super) struct UmountArgs {
    /// Where the sbxfs mount is.
    mountpoint: PathBuf,
    /// Unmount even when some writes could not be pushed (they stay in the daemon's staging
    /// directory, and the next mount of the sandbox pushes them); the exit code still says so.
    #[arg(long)]
    force: bool,
    /// Detach the mount now even while programs use it (fusermount3 -z): they keep what they
    /// have open, and the daemon pushes and exits when the last of them lets go.
    #[arg(short = 'z', long)]
    lazy: bool,
    /// Stop the agent this mount started in the sandbox (over ssh://) once the daemon has
    /// pushed everything, instead of leaving it for the next mount (it exits by itself after
    /// 30 minutes without one).
    #[arg(long)]
    stop_agent: bool,
}

#[derive(Args, Debug)]
pub(super) struct ProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Address to forward to.
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Delay applied to each direction, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

/// `HOST:PORT` as a socket address, the host resolved (IPv4 preferred: `localhost` means
/// 127.0.0.1, as people expect).
fn parse_listen(s: &str) -> Result<crate::agent::ListenAddr, String> {
    use std::net::ToSocketAddrs;
    if let Some(path) = s.strip_prefix("unix:") {
        return if path.starts_with('/') {
            Ok(crate::agent::ListenAddr::Unix(path.into()))
        } else {
            Err(format!(
                "unix:{path}: expected an absolute path, unix:/PATH"
            ))
        };
    }
    let addrs: Vec<_> = s
        .to_socket_addrs()
        .map_err(|e| format!("expected HOST:PORT, e.g. 127.0.0.1:7070 ({e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .map(crate::agent::ListenAddr::Tcp)
        .ok_or_else(|| format!("{s} resolves to no address"))
}

/// Landlock the agent to its workspace unless told not to; one log line when it cannot.
fn confine_agent(
    root: &std::path::Path,
    listen: &crate::agent::ListenAddr,
    off: bool,
) -> crate::agent::confine::Confinement {
    use crate::agent::confine::{confine_with_socket, Confinement};
    if off {
        return Confinement::Disabled;
    }
    // A root that does not exist is reported by the agent itself, a moment later.
    let Ok(root) = std::fs::canonicalize(root) else {
        return Confinement::Unavailable;
    };
    let socket_dir = match listen {
        crate::agent::ListenAddr::Unix(p) => p.parent(),
        crate::agent::ListenAddr::Tcp(_) | crate::agent::ListenAddr::Stdio => None,
    };
    match confine_with_socket(&root, socket_dir) {
        Ok(Confinement::Unavailable) => {
            tracing::warn!(
                "Landlock is not available in this kernel: the agent is confined by openat2 only"
            );
            Confinement::Unavailable
        }
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                "Landlock could not be applied ({e}): the agent is confined by openat2 only"
            );
            Confinement::Unavailable
        }
    }
}

pub(super) fn run_agent(mut a: AgentArgs) -> i32 {
    init_logging();
    if a.stdio {
        a.listen = crate::agent::ListenAddr::Stdio;
    }
    if matches!(a.listen, crate::agent::ListenAddr::Tcp(addr) if !addr.ip().is_loopback())
        && a.tls_cert.is_none()
    {
        super::logging::user_line(
            4,
            &format!(
                "sbxfs agent: warning: {} is not a loopback address: the token and every file \
                 travel in clear over the network; prefer --listen 127.0.0.1:PORT and an ssh \
                 tunnel (ssh -L PORT:127.0.0.1:PORT SANDBOX)",
                a.listen
            ),
        );
    }
    let token = if a.stdio {
        Ok(crate::agent::STDIO_TOKEN.as_bytes().to_vec())
    } else {
        load_token(a.token_file.as_deref())
    };
    let result = token.and_then(|token| {
        // Read before Landlock confines the agent to its workspace.
        let tls = match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(crate::agent::tls::acceptor(cert, key)?),
            _ => None,
        };
        // Kept beside the workspace, outside what Landlock will allow.
        let workspace_id = crate::agent::identity::workspace_id(&a.root);
        // Before any thread starts: Landlock binds the calling thread and those it starts.
        let confinement = confine_agent(&a.root, &a.listen, a.no_landlock);
        let rt = crate::agent::runtime()?;
        let served = rt.block_on(crate::agent::serve(crate::agent::AgentConfig {
            root: a.root,
            listen: a.listen,
            token,
            idle_exit: a.exit_when_idle.map(std::time::Duration::from_secs),
            search_timeout: std::time::Duration::from_secs(a.search_timeout),
            confinement,
            allow_setid: a.allow_setid,
            tls,
            workspace_id,
        }));
        // Not waiting for every blocking thread: `--stdio`'s reader of standard input stays
        // blocked until the exec channel closes, which a SIGTERM'd agent must not wait for.
        rt.shutdown_timeout(std::time::Duration::from_secs(1));
        served
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            super::logging::user_line(3, &format!("sbxfs agent: {e:#}"));
            ERROR
        }
    }
}

/// Conflicts (and kept edits) `umount` names one by one: the latest.
const MAX_SHOWN: usize = 10;

pub(super) fn run_mount(a: MountArgs) -> i32 {
    close_inherited_on_exec();
    if a.background {
        // The same command line again, as the detached daemon.
        let args = super::mount_helper_argv(std::env::args_os().collect())
            .into_iter()
            .skip(1)
            .map(|w| {
                if w == "--background" {
                    "--detached".into()
                } else {
                    w
                }
            })
            .collect();
        return crate::mount::background::start(args);
    }
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
    let result = mount_token(&a.remote, token_file.as_deref()).and_then(|token| {
        let mut cfg = crate::mount::MountConfig::new(a.remote, token, a.mountpoint);
        cfg.connect.ca_file = o.ca_file.or(a.ca_file);
        cfg.connect.header_file = o.header_file.or(a.header_file);
        cfg.connect.exec = a.exec;
        cfg.connect.ssh_config = a.ssh_config;
        cfg.connect.ssh_command = o.ssh_command;
        cfg.connect.allow_setid = o.allow_setid;
        if let Some(ms) = o.attr_ttl_ms.or(a.attr_ttl_ms) {
            cfg.attr_ttl = std::time::Duration::from_millis(ms);
        }
        if let Some(bytes) = o.cache_size.or(a.cache_size) {
            cfg.cache_bytes = bytes;
        }
        if let Some(bytes) = o.disk_cache_size.or(a.disk_cache_size) {
            cfg.disk_cache_bytes = bytes;
        }
        if let Some(n) = o.tree_max {
            cfg.tree_max = n;
        }
        if let Some(s) = o.recheck_s {
            cfg.recheck = std::time::Duration::from_secs(s);
        }
        if let Some(ms) = o.timeout_ms {
            cfg.call_timeout = std::time::Duration::from_millis(ms);
        }
        cfg.staging_dir = o.staging_dir.or(a.staging_dir);
        cfg.allow_other = o.allow_other;
        // Without it the daemon checks permissions itself (the mounting user as the sandbox's).
        cfg.default_permissions = o.default_permissions;
        cfg.read_only = o.read_only.unwrap_or(false);
        cfg.no_exec = o.no_exec.unwrap_or(false);
        cfg.idmap = o.idmap.unwrap_or_default();
        cfg.nonempty = o.nonempty;
        cfg.sync_close = o.sync_close;
        cfg.detached = a.detached;
        crate::mount::run(cfg)
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            super::logging::user_line(3, &format!("sbxfs mount: {e:#}"));
            crate::mount::exit::code_of(&e)
        }
    }
}

/// The token a mount of `remote` sends: required for our agent over http(s), taken when given
/// for agentscope, not asked for by transports that have none (ssh, shell, exec).
fn mount_token(remote: &str, file: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    use crate::remote::connect::{scheme_of, Scheme};
    match scheme_of(remote) {
        Ok(Scheme::Http) => load_token(file),
        // An unknown scheme is reported by connect, with the forms it takes.
        Err(_) => Ok(Vec::new()),
        Ok(Scheme::AgentScope) if file.is_some() || std::env::var_os("SBXFS_TOKEN").is_some() => {
            load_token(file)
        }
        Ok(_) => Ok(Vec::new()),
    }
}

/// Descriptors the mount was started with besides stdin, stdout and stderr (a shell's or a
/// supervisor's own, opened without close-on-exec) are not passed on to the commands the mount
/// runs (an exec channel, ssh): the sandbox's session would hold them for its whole life.
fn close_inherited_on_exec() {
    // close_range(3, ~0, CLOSE_RANGE_CLOEXEC); a kernel without it (before 5.11) leaves them.
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: only marks descriptors close-on-exec; none is closed or reused.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

pub(super) fn run_umount(a: UmountArgs) -> i32 {
    // Only an sbxfs mount: as root, fusermount3 would unmount anything.
    let shown = a.mountpoint.display();
    let at = mount_table_path(&a.mountpoint);
    let mounts = crate::mount::mounts::current();
    match crate::mount::mounts::top_at(&mounts, &at) {
        None if !at.exists() => {
            eprintln!("sbxfs umount: {shown} does not exist");
            return ERROR;
        }
        None => {
            eprintln!("sbxfs umount: {shown} is not a mount point");
            return ERROR;
        }
        Some(e) if !e.is_sbxfs() => {
            eprintln!(
                "sbxfs umount: {shown} is not an sbxfs mount (type {}); left alone (use umount)",
                e.fstype
            );
            return ERROR;
        }
        Some(_) => {}
    }
    // Push first, through the daemon: a write the sandbox refuses (a full disk) is named
    // here, and the mount stays so nothing is lost, unless --force.
    let flushed = flush_before_unmount(&at, a.force);
    let unpushed = &flushed.unpushed;
    // What the mount did with edits (kept, saved beside): told once, when it is unmounted,
    // not again at each attempt a busy mount refuses.
    let notes = || {
        // The latest few of each: a long-lived mount's run to hundreds of lines.
        let latest = |all: &[(String, String)], what: &str| -> usize {
            let skipped = all.len().saturating_sub(MAX_SHOWN);
            if skipped > 0 {
                eprintln!(
                    "sbxfs umount: {} {what} in all; the latest {MAX_SHOWN}:",
                    all.len()
                );
            }
            skipped
        };
        let skipped = latest(&flushed.kept, "edits kept from earlier mounts");
        for (path, why) in &flushed.kept[skipped..] {
            eprintln!(
                "sbxfs umount: note: {path}: an edit from an earlier mount is kept unpushed in \
                 the staging directory ({why})"
            );
        }
        let skipped = latest(&flushed.conflicts, "conflicts while mounted");
        for (path, copy) in &flushed.conflicts[skipped..] {
            eprintln!(
                "sbxfs umount: conflict: {path} changed in the sandbox while it had unpushed \
                 edits; your version was saved beside it as {copy}"
            );
        }
    };
    if !unpushed.is_empty() {
        for line in unpushed {
            eprintln!("sbxfs umount: not pushed: {line}");
        }
        if !a.force {
            eprintln!(
                "sbxfs umount: {shown} stays mounted: {} file(s) could not be pushed to the sandbox; \
                 fix the cause and run it again, or use --force to unmount anyway (the files are \
                 kept locally and the next mount pushes them)",
                unpushed.len()
            );
            return ERROR;
        }
    }
    let failed = !unpushed.is_empty();
    if a.stop_agent {
        ask_to_stop_the_agent(&at);
    }
    // The daemon sees its session end, pushes what is staged, and exits.
    let outcome = crate::mount::kernel::unmount(&at, a.lazy);
    if outcome.is_ok() {
        notes();
    }
    use crate::mount::kernel::UnmountError;
    match outcome {
        Err(UnmountError::Busy) => {
            eprintln!("sbxfs umount: {shown} is busy: programs are using it");
            for (pid, name, what) in users_of(&at).iter().take(MAX_USERS_SHOWN) {
                eprintln!("sbxfs umount:   pid {pid} ({name}): {what}");
            }
            eprintln!(
                "sbxfs umount: stop them or leave the directory, or detach it now with \
                 `sbxfs umount --lazy {shown}` (the daemon pushes and exits when they let go)"
            );
            return ERROR;
        }
        Err(UnmountError::Refused(why)) => {
            eprintln!(
                "sbxfs umount: could not unmount {shown}{}",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {}", visible(&why))
                }
            );
            return ERROR;
        }
        Err(UnmountError::NoFusermount(e)) => {
            eprintln!("sbxfs umount: fusermount3: {e} (install fuse3, or unmount as root)");
            return ERROR;
        }
        Ok(()) if failed => {
            eprintln!(
                "sbxfs umount: unmounted {shown}; {} file(s) not pushed are kept in {} for the \
                 next mount",
                unpushed.len(),
                flushed
                    .staging
                    .as_deref()
                    .unwrap_or("the daemon's staging directory (its log names it)")
            );
        }
        // Detached: the daemon stays while programs hold it, so it is not waited for.
        Ok(()) if a.lazy => {
            eprintln!(
                "sbxfs umount: detached {shown}; its daemon pushes and exits when the programs \
                 using it let go"
            );
            return 0;
        }
        Ok(()) => {}
    }
    let code = if failed { ERROR } else { 0 };
    // Returns once the daemon is gone, so a mount right after finds the place free.
    // Forced past unpushed files, it does not wait long: the daemon goes on trying for a
    // bounded time, and its journals keep the rest for the next mount.
    let wait = if failed {
        FORCED_EXIT_WAIT
    } else {
        DAEMON_EXIT_WAIT
    };
    if let Some(daemon) = flushed.daemon {
        let gone = daemon.wait_gone(wait);
        if !gone && failed {
            eprintln!(
                "sbxfs umount: its daemon (pid {}) is still finishing: it tries to push them \
                 for up to a minute, then keeps what it could not push for the next mount",
                daemon.pid
            );
        } else if !gone {
            eprintln!(
                "sbxfs umount: unmounted {shown}; its daemon (pid {}) is still finishing after {} s",
                daemon.pid,
                wait.as_secs()
            );
        }
    }
    code
}

/// `umount --stop-agent`: the daemon stops the agent it started as it exits (after its last
/// push). Said at once when the mount's agent is not one it started.
fn ask_to_stop_the_agent(at: &std::path::Path) {
    let Some(info) = crate::control::client::mount_info(at) else {
        eprintln!("sbxfs umount: --stop-agent: the mount's daemon does not answer");
        return;
    };
    let socket = PathBuf::from(&info.socket);
    let transport = status(&socket)
        .and_then(|s| s["mount"]["transport"].as_str().map(str::to_string))
        .unwrap_or_default();
    if transport.ends_with("+stdio") {
        eprintln!("sbxfs umount: its agent runs on the mount's own session and ends with it");
        return;
    }
    if transport != "ssh+agent" {
        eprintln!(
            "sbxfs umount: --stop-agent: this mount did not start its agent ({}): nothing to \
             stop here (stop an agent you run where it runs)",
            if transport.is_empty() {
                "unknown transport"
            } else {
                transport.as_str()
            }
        );
        return;
    }
    let answered =
        crate::control::client::Awaited::send(&socket, crate::control::Request::StopAgent)
            .ok()
            .and_then(|mut ask| ask.within(std::time::Duration::from_secs(5)).ok().flatten());
    match answered {
        Some(_) => eprintln!("sbxfs umount: its agent in the sandbox stops once the last push is done"),
        None => eprintln!("sbxfs umount: --stop-agent: the daemon did not answer; the agent exits by itself after 30 minutes without a mount"),
    }
}

/// Programs named when a mount is busy; past this, the first are enough to act on.
const MAX_USERS_SHOWN: usize = 10;

/// The processes using something at or below `at`: pid, command name, and how (their
/// working or root directory, an open file). Read from `/proc` links, which never touch the
/// mount.
fn users_of(at: &std::path::Path) -> Vec<(u32, String, &'static str)> {
    let below = |link: &std::path::Path| std::fs::read_link(link).is_ok_and(|t| t.starts_with(at));
    let mut users = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return users;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // `cd MNT && sbxfs umount .` is not a user of the mount it unmounts.
        if pid == std::process::id() {
            continue;
        }
        let dir = p.path();
        let what = if below(&dir.join("cwd")) {
            Some("its working directory is there")
        } else if below(&dir.join("root")) {
            Some("its root directory is there")
        } else if std::fs::read_dir(dir.join("fd"))
            .is_ok_and(|fds| fds.flatten().any(|fd| below(&fd.path())))
        {
            Some("it has a file there open")
        } else {
            None
        };
        if let Some(what) = what {
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            users.push((pid, visible(name.trim()), what));
        }
    }
    users.sort();
    users
}

/// How long `umount` waits for the daemon to exit after the unmount.
const DAEMON_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(20);
/// How long `umount --force` waits for it when files stayed unpushed.
const FORCED_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the daemon answered to the flush before an unmount.
#[derive(Default)]
struct Flushed {
    /// One line per file it could not push (`PATH: cause`).
    unpushed: Vec<String>,
    /// Each conflict copy the mount made: the file and the copy's name.
    conflicts: Vec<(String, String)>,
    /// Edits an earlier mount left that stay unpushed: the file and why.
    kept: Vec<(String, String)>,
    /// The daemon's staging directory, where unpushed files are kept.
    staging: Option<String>,
    daemon: Option<Process>,
}

impl Flushed {
    /// No answer to the flush: the daemon still pushes as it unmounts, and is waited for.
    fn only_daemon(socket: &std::path::Path) -> Flushed {
        Flushed {
            daemon: status(socket).as_ref().and_then(daemon_of),
            ..Flushed::default()
        }
    }
}

/// The daemon a flush or status answer names (`pid`).
fn daemon_of(v: &serde_json::Value) -> Option<Process> {
    v["pid"].as_u64().map(|p| Process::of(p as u32))
}

/// Each `{a, b}` object of the list `v[key]`, shown safely (names are the sandbox's).
fn pairs(v: &serde_json::Value, key: &str, a: &str, b: &str) -> Vec<(String, String)> {
    let text = |v: &serde_json::Value| visible(v.as_str().unwrap_or("?"));
    v[key]
        .as_array()
        .map(|xs| xs.iter().map(|x| (text(&x[a]), text(&x[b]))).collect())
        .unwrap_or_default()
}

/// A process known by pid and start time (a pid reused by another process is not it).
struct Process {
    pid: u32,
    started: Option<String>,
}

impl Process {
    fn of(pid: u32) -> Process {
        Process {
            pid,
            started: Self::start_time(pid),
        }
    }

    /// Field 22 of /proc/PID/stat (after the parenthesised name, which may hold spaces);
    /// `None` once the process is gone or a zombie.
    fn start_time(pid: u32) -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // A zombie leader whose other threads are still exiting (one blocked on the FUSE
        // device, say) has not exited yet: only once it is alone is it gone.
        if fields.first() == Some(&"Z") && Self::threads(pid) <= 1 {
            return None;
        }
        fields.get(19).map(|s| s.to_string())
    }

    fn threads(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
    }

    fn is_gone(&self) -> bool {
        let now = Self::start_time(self.pid);
        now.is_none() || now != self.started
    }

    fn wait_gone(&self, limit: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + limit;
        loop {
            if self.is_gone() {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// How long `umount` waits for the flush before it says what it waits for.
const FLUSH_NOTE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// How long `umount --force` waits for the flush before it unmounts anyway.
const FORCE_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Ask the mount's daemon to push everything now. A daemon that does not answer is left to
/// push as it unmounts. Without `force` this waits as long as the pushes take (saying so after
/// a few seconds); with it, at most [`FORCE_FLUSH_LIMIT`], and what is still unpushed then is
/// named from the mount's status.
fn flush_before_unmount(at: &std::path::Path, force: bool) -> Flushed {
    let Some(info) = crate::control::client::mount_info(at) else {
        return Flushed::default();
    };
    let socket = PathBuf::from(&info.socket);
    let Ok(mut flush) =
        crate::control::client::Awaited::send(&socket, crate::control::Request::Flush)
    else {
        return Flushed::default();
    };
    let give_up = force.then(|| std::time::Instant::now() + FORCE_FLUSH_LIMIT);
    let mut noted = false;
    let answer = loop {
        // The first wait ends at the note; after it, the rest of --force's bound (or as long
        // as it takes).
        let step = match give_up {
            Some(t) if noted => t.saturating_duration_since(std::time::Instant::now()),
            None if noted => FORCE_FLUSH_LIMIT,
            _ => FLUSH_NOTE_AFTER,
        };
        match flush.within(step) {
            Ok(Some(v)) => break Some(v),
            Ok(None) if give_up.is_some_and(|t| std::time::Instant::now() >= t) => break None,
            Ok(None) => {
                if !noted {
                    noted = true;
                    let waiting = status(&socket).map_or(0, |s| unpushed_in(&s).len());
                    eprintln!(
                        "sbxfs umount: waiting for the sandbox to take {waiting} file(s){}",
                        if force {
                            format!(
                                "; unmounting anyway after {} s",
                                FORCE_FLUSH_LIMIT.as_secs()
                            )
                        } else {
                            " (Ctrl-C leaves it mounted; --force unmounts after a bounded wait)"
                                .into()
                        }
                    );
                }
            }
            Err(_) => return Flushed::only_daemon(&socket),
        }
    };
    let Some(v) = answer else {
        // The sandbox did not take them in time: name what stays, from what the mount knows.
        let limit = FORCE_FLUSH_LIMIT.as_secs();
        let Some(now) = status(&socket) else {
            return Flushed::default();
        };
        return Flushed {
            unpushed: unpushed_in(&now)
                .into_iter()
                .map(|path| format!("{path}: the sandbox did not take it within {limit} s"))
                .collect(),
            staging: now["staging"].as_str().map(visible),
            daemon: daemon_of(&now),
            ..Flushed::default()
        };
    };
    if let Some(e) = super::socket_error(&v) {
        tracing::debug!("flush before unmount: {e}");
        return Flushed::only_daemon(&socket);
    }
    // The error names the file already ("PATH: cause").
    let unpushed = pairs(&v, "failures", "path", "error")
        .into_iter()
        .map(|(path, error)| {
            if error.starts_with(&path) {
                error
            } else {
                format!("{path}: {error}")
            }
        })
        .collect();
    // Names are the sandbox's: never a raw escape on the terminal.
    let conflicts = pairs(&v, "conflicts", "path", "saved_as");
    let kept = pairs(&v, "kept_from_earlier", "path", "why");
    Flushed {
        unpushed,
        conflicts,
        kept,
        staging: v["staging"].as_str().map(visible),
        daemon: daemon_of(&v),
    }
}

/// The mount's status: answered from what it knows, even while the sandbox hangs.
fn status(socket: &std::path::Path) -> Option<serde_json::Value> {
    let mut ask =
        crate::control::client::Awaited::send(socket, crate::control::Request::Status).ok()?;
    ask.within(std::time::Duration::from_secs(5)).ok().flatten()
}

/// The files a status answer names as not pushed yet (conflict copies are pushed: their
/// files follow the sandbox), shown safely.
fn unpushed_in(status: &serde_json::Value) -> Vec<String> {
    status["files"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter(|f| f["state"] != "conflict")
                .map(|f| visible(f["path"].as_str().unwrap_or("?")))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) use super::logging::visible;

/// A mountpoint as the mount table names it: absolute, with symlinks in its parents resolved.
/// The mountpoint itself is never stat'ed (a dead FUSE mount answers ENOTCONN).
fn mount_table_path(p: &std::path::Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|d| d.join(name))
            .unwrap_or(abs),
        _ => abs,
    }
}

pub(super) fn run_proxy(a: ProxyArgs) -> i32 {
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

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_in_a_name_are_shown_escaped() {
        assert_eq!(
            super::visible("evil\u{1b}]0;PWNED\u{7}.txt: no space"),
            "evil\\u{1b}]0;PWNED\\u{7}.txt: no space"
        );
        assert_eq!(super::visible("plain/ü.txt"), "plain/ü.txt");
    }
}
