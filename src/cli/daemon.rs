//! The long-running commands: `agent` (in the sandbox), `mount`/`umount` (on the laptop), and
//! the hidden test `proxy`.

use std::path::PathBuf;

use clap::Args;

use super::{init_logging, load_token, ERROR};

#[derive(Args, Debug)]
pub(super) struct AgentArgs {
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
pub(super) struct MountArgs {
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
    mountpoint: PathBuf,
}

#[derive(Args, Debug)]
pub(super) struct ProxyArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Delay applied to each direction, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

pub(super) fn run_agent(a: AgentArgs) -> i32 {
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

pub(super) fn run_mount(a: MountArgs) -> i32 {
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
        cfg.nonempty = o.nonempty;
        cfg.detached = a.detached;
        crate::mount::run(cfg)
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbxfs mount: {e:#}");
            crate::mount::exit::code_of(&e)
        }
    }
}

pub(super) fn run_umount(a: UmountArgs) -> i32 {
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
