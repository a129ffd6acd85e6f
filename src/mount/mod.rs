//! `sbxfs mount REMOTE MOUNTPOINT`: the FUSE filesystem over any [`crate::remote::Remote`].
//!
//! [`fuse`] is the thin adapter over [`core`] (its invalidations of the kernel's caches go
//! through [`kernel_notes`]), the filesystem operations, which work over
//! [`inode`] (the inode table), [`meta`] (listings), [`pages`] (the page cache), [`handles`]
//! (open files and directories) and [`writeback`] (pushes, retries, conflicts) with
//! [`staging`] (the durable image of a file being written); [`links`] shows symlink targets so
//! none leads out of the mount; [`feed`] follows the sandbox's change feed, which lets caches
//! be trusted while it is connected. Around them: [`control_server`]
//! answers the control socket, [`health`] keeps what is known of the sandbox's reachability,
//! [`options`] reads `-o`, [`mounts`] reads mountinfo, [`state`] keeps private local state,
//! [`preflight`] refuses mistakes before anything is created, [`kernel`] asks the kernel for
//! the mount, [`notify`] tells systemd, [`background`] serves
//! from the background for `mount -t fuse.sbxfs`, [`exit`] names the exit codes.
//! The daemon runs in the foreground: SIGTERM or SIGINT (or `sbxfs umount`) push pending
//! writes, then unmount.
//!
//! Lifecycle guarantees: a mountpoint that is missing, not a directory, not empty (without
//! `-o nonempty`) or already mounted is refused before anything is created, and a mount there is
//! not touched; a start that fails removes what it created (control socket, staging and runtime
//! directories); the mount is announced (stdout, `READY=1`) only once it answers; the daemon
//! unmounts exactly once, itself, and only while its mount is still there (fuser's own unmount
//! on drop never runs: see [`run`]).

pub mod access;
pub mod background;
pub mod caller;
pub mod clock;
pub mod control_server;
pub mod core;
pub mod disk_pages;
pub mod echo;
pub mod exit;
pub mod feed;
pub mod fuse;
pub mod gate;
pub mod gated;
pub mod handles;
pub mod health;
pub mod inode;
pub mod kernel;
pub mod kernel_notes;
pub mod lifecycle;
pub mod links;
pub mod made_links;
pub mod meta;
pub mod mounts;
pub mod newfiles;
pub mod notify;
pub mod options;
pub mod pages;
pub mod prefetch;
pub mod preflight;
pub mod pushq;
pub mod readahead;
pub mod recent;
pub mod sandbox;
pub mod staging;
pub use self::core::subtree;
pub mod state;
pub mod writeback;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use self::control_server::Control;
use self::core::{CoreConfig, FsCore};
use self::health::Health;
pub use self::options::IdMap;
use crate::remote::{Remote, RemotePath};

/// Attributes and listings are trusted this long: short enough that a change made in the
/// sandbox shows within a second, long enough that `ls -l` and `git status` ask once.
pub const DEFAULT_ATTR_TTL: Duration = Duration::from_secs(1);
/// Page cache size: a working set of source files many times over.
pub const DEFAULT_CACHE_BYTES: u64 = 512 * 1024 * 1024;
/// Bytes of file data kept on disk per sandbox by default (`--disk-cache-size`).
pub const DEFAULT_DISK_CACHE_BYTES: u64 = 1024 * 1024 * 1024;
/// How often failed pushes are looked at (each is retried with its own backoff).
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// FUSE threads: each only decodes and hands off, so a few suffice.
pub const FUSE_THREADS: usize = 4;
/// How long the daemon pushes what is staged once its session ended, before it exits
/// anyway (the journals keep the rest for the next mount).
const FINAL_PUSH_LIMIT: Duration = Duration::from_secs(60);

/// How often the daemon looks whether its FUSE session ended (an unmount from outside): it only
/// delays the daemon's exit by as much.
const SESSION_POLL: Duration = Duration::from_millis(50);
/// Every this many polls (half a second) the daemon also looks whether its mount is gone here
/// and held only by other mount namespaces ([`mounts::left_only_elsewhere`]: it reads each
/// process's namespace, so not every poll).
const ELSEWHERE_EVERY: u32 = 10;

pub struct MountConfig {
    pub remote_url: String,
    /// The token (http(s), agentscope); empty for transports that take none.
    pub token: Vec<u8>,
    /// How to reach the sandbox besides its URL (`--ca-file`, `--header-file`, `--exec`, …).
    pub connect: crate::remote::connect::ConnectOptions,
    pub mountpoint: PathBuf,
    pub attr_ttl: Duration,
    /// Deadline of one remote call (queries and idle transfers get multiples of it).
    pub call_timeout: Duration,
    pub cache_bytes: u64,
    /// Bytes of file data kept on disk per sandbox for remounts ([`disk_pages`]; 0: none).
    pub disk_cache_bytes: u64,
    /// Entries a directory's first look fetches with its subtree (`-o tree_max=N`; 0: off).
    pub tree_max: usize,
    /// While the change feed is connected, every known file is re-checked within this time
    /// (`-o recheck_s=N`; zero: never): inotify does not see every change.
    pub recheck: Duration,
    pub staging_dir: Option<PathBuf>,
    /// Other users (and root) may use the mount (`-o allow_other`).
    pub allow_other: bool,
    /// The kernel checks mode bits, everyone's against the owners shown (`-o
    /// default_permissions`); by default the daemon checks, the mounting user as the sandbox's
    /// user ([`gate`]).
    pub default_permissions: bool,
    /// A read-only mount: every write gets `EROFS` from the kernel (`-o ro`).
    pub read_only: bool,
    /// Programs on the mount cannot be executed (`-o noexec`).
    pub no_exec: bool,
    /// Who files appear to be owned by: the sandbox's owners (`none`, the default), or its
    /// user mapped to you (`user`).
    pub idmap: IdMap,
    /// Mount over a directory that is not empty (`-o nonempty`), hiding what is there.
    pub nonempty: bool,
    /// `close` waits until the sandbox has the file (`-o sync_close`); by default it queues
    /// the push and returns ([`pushq`]).
    pub sync_close: bool,
    /// Started by [`background::start`]: once the mount answers, let go of the terminal.
    pub detached: bool,
}

impl MountConfig {
    /// A configuration with every option at its default.
    pub fn new(remote_url: String, token: Vec<u8>, mountpoint: PathBuf) -> MountConfig {
        MountConfig {
            remote_url,
            token,
            connect: Default::default(),
            mountpoint,
            attr_ttl: DEFAULT_ATTR_TTL,
            call_timeout: crate::remote::deadline::CALL,
            cache_bytes: DEFAULT_CACHE_BYTES,
            disk_cache_bytes: DEFAULT_DISK_CACHE_BYTES,
            tree_max: subtree::DEFAULT_TREE_MAX,
            recheck: feed::DEFAULT_RECHECK,
            staging_dir: None,
            allow_other: false,
            default_permissions: false,
            read_only: false,
            no_exec: false,
            idmap: IdMap::None,
            nonempty: false,
            sync_close: false,
            detached: false,
        }
    }

    /// What the kernel is told about the mount ([`kernel`]).
    fn kernel_options(&self) -> kernel::KernelOptions {
        kernel::KernelOptions {
            source: self.remote_url.clone(),
            read_only: self.read_only,
            no_exec: self.no_exec,
            default_permissions: self.default_permissions,
            allow_other: self.allow_other,
        }
    }

    /// What fuser is told: how to serve the device [`kernel`] mounted.
    fn fuse_config(&self) -> fuser::Config {
        let mut c = fuser::Config::default();
        if self.allow_other {
            // fuser filters requests by uid as well: only `All` lets other users' through.
            c.acl = fuser::SessionACL::All;
        }
        c.n_threads = Some(FUSE_THREADS);
        c.clone_fd = true;
        c
    }
}

/// The staging directory: private, and the same for every mount of this remote (a daemon that
/// was killed leaves its unpushed edits there, and the next mount pushes them). An `exec:`
/// remote is its command as much as its URL: `exec:/workspace` through two containers' `docker
/// exec` is two sandboxes, whose edits must never be pushed into each other.
fn staging_dir(
    configured: Option<&Path>,
    remote_url: &str,
    exec: Option<&str>,
    created: &mut state::Created,
) -> anyhow::Result<PathBuf> {
    let remote_key = match exec {
        Some(cmd) => format!("{remote_url}\0exec={cmd}"),
        None => remote_url.to_string(),
    };
    let remote_url = remote_key.as_str();
    match configured {
        Some(d) => {
            // The error names the directory.
            created.private_dir(d).context("staging directory")?;
            Ok(d.to_path_buf())
        }
        None => state::staging_dir_for(remote_url, created).context("staging directory"),
    }
}

/// The echo thread ([`echo`]): sandbox-side changes repeated on the mountpoint, so local
/// watchers get their inotify events. It holds the core only while it works on a change.
fn start_echoes(
    core: &Arc<core::FsCore>,
    kernel: &Arc<fuser::Notifier>,
    mountpoint: &Path,
    our_dev: Option<&str>,
    rt: &tokio::runtime::Handle,
) {
    let Some(dev) = our_dev.map(str::to_string) else {
        tracing::warn!(
            "no echo thread (local watchers will not hear of sandbox-side changes): the mount's \
             device is unknown"
        );
        return;
    };
    let (weak, kernel, mnt, rt) = (
        Arc::downgrade(core),
        kernel.clone(),
        mountpoint.to_path_buf(),
        rt.clone(),
    );
    let started = std::thread::Builder::new()
        .name("sbxfs-echo".into())
        .spawn(move || {
            if let Some(core) = weak.upgrade() {
                core.echoes().claim_thread();
            }
            loop {
                let Some(core) = weak.upgrade() else { break };
                let Some(job) = core.echoes().next_job() else {
                    break;
                };
                // Only while the mountpoint's path leads to this mount: once it is detached
                // (umount --lazy) or a directory above it renamed, that path is a plain
                // laptop directory, which must never see a sandbox's change. (No descriptor
                // of the mount is held for this: it would keep the mount busy.)
                if still_ours(&mnt, &dev) {
                    core.echo(job, &mnt, &kernel, &rt);
                } else {
                    core.echo_dropped(job);
                }
            }
        });
    if let Err(e) = started {
        tracing::warn!(
            "no echo thread (local watchers will not hear of sandbox-side changes): {e}"
        );
    }
}

/// Whether `mountpoint` is this mount's root (its device is `dev`, "major:minor"), looked at
/// without following a symlink put in its place.
fn still_ours(mountpoint: &Path, dev: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(mountpoint).is_ok_and(|m| {
        m.is_dir() && format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev())) == dev
    })
}

/// The mount is up when a stat of the mountpoint is answered by it (the device number is the
/// mount's): only then is it announced, on stdout and to systemd.
fn announce_ready(
    cfg: &MountConfig,
    mountpoint: &Path,
    our_dev: Option<&str>,
    kernel_cache: &fuser::Notifier,
    log_file: Option<&Path>,
) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(mountpoint) {
        Ok(m) => {
            let dev = format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev()));
            if our_dev.is_some_and(|d| d != dev) {
                tracing::warn!(mountpoint = %mountpoint.display(), "another mount covers this one");
            }
        }
        Err(e) => {
            tracing::warn!(mountpoint = %mountpoint.display(), "the new mount does not answer a stat: {e}")
        }
    }
    // That stat left the root's attributes in the kernel's cache; dropped again, so that a stat
    // soon after a crash meets the dead daemon (ENOTCONN) rather than the cache.
    let _ = kernel_cache.inval_inode(fuser::INodeNo(1), -1, 0);
    if cfg.detached {
        background::release_stdin_and_stderr(log_file);
        crate::cli::logging::release_held();
    }
    println!(
        "sbxfs mounted {} on {}",
        cfg.remote_url,
        cfg.mountpoint.display()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if cfg.detached {
        background::release_stdout();
    }
    notify::tell(&format!(
        "{}\nSTATUS=serving {} on {}",
        notify::READY,
        cfg.remote_url,
        mountpoint.display()
    ));
    tracing::info!(remote = %cfg.remote_url, mountpoint = %mountpoint.display(), "mounted");
}

/// Unmount our mount, once, lazily: a mount still in use leaves the namespace at once and ends
/// when its last user leaves.
fn unmount_once(mountpoint: &Path) {
    match kernel::unmount(mountpoint, true) {
        Ok(()) => tracing::info!(mountpoint = %mountpoint.display(), "unmounted"),
        Err(e) => tracing::error!(mountpoint = %mountpoint.display(), "could not unmount: {e}"),
    }
}

/// Whom the mounting user acts as: the agent's identity; an older agent that does not say is
/// taken to run as the workspace root's owner. A list of groups longer than a process can have
/// is cut.
fn sandbox_user(
    said: Option<crate::remote::Identity>,
    root: &crate::remote::Attr,
) -> crate::remote::Identity {
    match said {
        Some(mut id) => {
            id.groups.truncate(gate::MAX_GROUPS);
            id
        }
        None => crate::remote::Identity {
            uid: root.uid,
            gid: root.gid,
            groups: vec![root.gid],
        },
    }
}

/// Mount and serve until a signal or an unmount; pending writes are pushed before leaving.
pub fn run(cfg: MountConfig) -> anyhow::Result<()> {
    if cfg.detached {
        crate::cli::logging::hold_info_until_ready();
        background::leave_session();
    }
    let mountpoint = preflight::check_mountpoint(&cfg.mountpoint, cfg.nonempty)?;
    preflight::check_fuse()?;
    if cfg.allow_other {
        preflight::check_allow_other()?;
    }
    if let Some(d) = cfg.staging_dir.as_deref() {
        state::check_private_if_there(d).context("staging directory")?;
    }
    readahead::bound_allocator();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(4)
        .build()?;
    // Connect (the first contact made) before anything is created: a wrong URL, token or
    // server leaves nothing behind, and the error names the cause.
    // Every call has a deadline: a sandbox that stops answering blocks nothing for good.
    // (`-o timeout_ms=`; `SBXFS_CALL_TIMEOUT_MS` in the environment for tests.)
    let call = std::env::var("SBXFS_CALL_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(cfg.call_timeout, Duration::from_millis);
    let mut opts = cfg.connect.clone();
    if !cfg.token.is_empty() {
        opts.token = Some(String::from_utf8(cfg.token.clone()).context("the token must be UTF-8")?);
    }
    opts.call_timeout = Some(call);
    let connected = rt.block_on(crate::remote::connect::connect_reporting(
        &cfg.remote_url,
        &opts,
        |waited| {
            eprintln!(
                "sbxfs mount: still waiting for {} ({} s)",
                cfg.remote_url,
                waited.as_secs()
            )
        },
    ))?;
    let info = connected.info.clone();
    let transport = connected.transport.clone();
    let why_scripts = connected.why_scripts.clone();
    let scripts_by = connected.scripts_by.clone();
    // An ssh master or a forwarding lives as long as the mount.
    let _keep = connected.keep;
    let mut socket = crate::control::socket_path(&mountpoint);
    // Every directory made from here on is removed again if the start fails.
    let mut created = state::Created::default();
    if let Some(dir) = socket.parent().map(Path::to_path_buf) {
        if let Err(e) = created.private_dir(&dir) {
            let fresh = fresh_socket_dir(&dir, &e)?;
            created.made(&fresh);
            socket = fresh.join(socket.file_name().unwrap_or_default());
        }
    }
    // Refused while a live mount holds it; removed again when `_socket_guard` drops.
    let (listener, _socket_guard) = {
        let _enter = rt.enter();
        control_server::bind(&socket).context("control socket")?
    };
    let staging_path = staging_dir(
        cfg.staging_dir.as_deref(),
        &cfg.remote_url,
        cfg.connect.exec.as_deref(),
        &mut created,
    )?;
    // Already wrapped in the retry and deadline wrapper every transport gets.
    let remote: Arc<dyn Remote> = connected.remote;
    let health = Health::new();
    let asked = Instant::now();
    let root = rt
        .block_on(remote.stat(&RemotePath::root()))
        .with_context(|| format!("cannot reach the sandbox at {}", cfg.remote_url))?;
    let first_answer = asked.elapsed();
    health.answered(first_answer);
    let core = FsCore::new(
        remote.clone(),
        CoreConfig {
            attr_ttl: cfg.attr_ttl,
            cache_bytes: cfg.cache_bytes,
            staging_dir: staging_path.clone(),
            tree_max: cfg.tree_max,
            clock: Default::default(),
        },
        root.clone(),
    );
    core.set_sync_close(cfg.sync_close);
    core.note_pace(first_answer);
    let owners = Arc::new(gate::Owners {
        idmap: cfg.idmap,
        mount_uid: rustix::process::getuid().as_raw(),
        mount_gid: rustix::process::getgid().as_raw(),
        sandbox: sandbox_user(info.user.clone(), &root),
        checks: !cfg.default_permissions,
    });
    tracing::info!(
        uid = owners.sandbox.uid,
        gid = owners.sandbox.gid,
        idmap = cfg.idmap.as_str(),
        "the sandbox's user"
    );
    core.learn(&info);
    let (notes, notes_rx) = kernel_notes::KernelNotes::new();
    let fs = fuse::SbxFs {
        notes: notes.clone(),
        fs: Arc::new(gated::GatedFs::new(
            core.clone(),
            owners.clone(),
            cfg.allow_other,
            gated::MountLabel {
                mountpoint: mountpoint.display().to_string(),
                socket: socket.display().to_string(),
                remote: cfg.remote_url.clone(),
            },
        )),
        rt: rt.handle().clone(),
    };
    // A background daemon's log goes to a private file beside its socket (the journal keeps
    // it where stderr is the journal).
    let log_file =
        (cfg.detached && !notify::stderr_is_journal()).then(|| socket.with_extension("log"));
    let control = Arc::new(Control {
        stop_agent_at_exit: Default::default(),
        core: core.clone(),
        info: serde_json::json!({
            "mountpoint": mountpoint.display().to_string(),
            "socket": socket.display().to_string(),
            "remote": cfg.remote_url,
            "read_only": cfg.read_only,
            "allow_other": cfg.allow_other,
            "idmap": cfg.idmap.as_str(),
            "sandbox_user": owners.sandbox,
            "permissions": if owners.checks { "sbxfs" } else { "kernel" },
            "transport": transport,
            "transport_why": why_scripts,
            "scripts_run_by": scripts_by,
            "log": log_file.as_ref().map(|p| p.display().to_string()),
            "capabilities": info.capabilities,
        }),
        health: health.clone(),
    });
    control_server::register(&control);
    rt.spawn(control_server::serve(listener, control.clone()));
    let paced = core.clone();
    rt.spawn(health::watch(health.clone(), remote, move |took| {
        paced.note_pace(took)
    }));
    let fuse_config = cfg.fuse_config();
    let kernel_options = cfg.kernel_options();
    let dev = match kernel::mount_direct(&mountpoint, &kernel_options) {
        Ok(Some(dev)) => Ok(dev),
        Ok(None) => kernel::mount_with_fusermount(&mountpoint, &kernel_options),
        Err(e) => Err(e),
    }
    .map_err(|e| preflight::mount_refused(&cfg.mountpoint, cfg.allow_other, e))?;
    let session = match fuser::Session::from_fd(fs, dev, fuse_config.acl, fuse_config) {
        Ok(s) => s,
        Err(e) => {
            unmount_once(&mountpoint);
            return Err(anyhow::Error::new(e).context("the kernel's FUSE handshake failed"));
        }
    };
    // Only now: a start that fails leaves no cache directory behind.
    if cfg.disk_cache_bytes > 0 {
        match state::pages_dir_for(&cfg.remote_url, &core.sandbox_id(), &mut created) {
            Ok(dir) => core.attach_disk_cache(&dir, cfg.disk_cache_bytes),
            Err(e) => tracing::warn!("no disk cache: {e}; pages are cached in memory only"),
        }
    }
    // The device number tells our mount from one mounted over it later.
    let our_dev = mounts::top_at(&mounts::current(), &mountpoint).map(|e| e.dev.clone());
    let kernel_cache = Arc::new(session.notifier());
    kernel_notes::start(notes.clone(), notes_rx, kernel_cache.clone());
    core.set_kernel_cache(Arc::new(kernel_notes::Notifier(notes)));
    if info.capabilities.feed {
        rt.spawn(feed::follow(
            core.clone(),
            Some(health.clone()),
            cfg.recheck,
        ));
    } else {
        feed::without_feed(&core);
    }
    let background = session.spawn()?;
    start_echoes(
        &core,
        &kernel_cache,
        &mountpoint,
        our_dev.as_deref(),
        rt.handle(),
    );
    created.keep();
    // Signals are caught before the mount is announced: a SIGTERM right after the ready line
    // must push and unmount, not kill the daemon.
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _enter = rt.enter();
        (
            signal(SignalKind::terminate()).context("SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("SIGINT handler")?,
        )
    };
    announce_ready(
        &cfg,
        &mountpoint,
        our_dev.as_deref(),
        &kernel_cache,
        log_file.as_deref(),
    );

    let retry_core = core.clone();
    rt.spawn(async move {
        let found = retry_core.recover_staged().await;
        if found != Default::default() {
            tracing::info!(
                pushed = found.pushed,
                conflicts = found.conflicts,
                kept = found.kept,
                "unpushed edits from an earlier mount of this sandbox"
            );
        }
        loop {
            tokio::time::sleep(RETRY_INTERVAL).await;
            if !retry_core.is_reachable() && !retry_core.probe().await {
                continue;
            }
            retry_core.retry_pending().await;
        }
    });
    // Wait for a signal, or for the session to end (an unmount from outside), or for the
    // mount to be unmounted here while another namespace's copy holds the session open.
    let session_ended = || background.guard.is_finished();
    let only_elsewhere = || {
        our_dev
            .as_deref()
            .is_some_and(|dev| mounts::left_only_elsewhere(&mountpoint, dev))
    };
    rt.block_on(async {
        let ended = async {
            let mut polls = 0u32;
            while !session_ended() {
                tokio::time::sleep(SESSION_POLL).await;
                polls += 1;
                if polls.is_multiple_of(ELSEWHERE_EVERY) && only_elsewhere() {
                    tracing::info!(
                        "unmounted here; the copies other mount namespaces hold (processes started there after the mount) are cut off"
                    );
                    break;
                }
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = ended => {}
        }
    });
    core.echoes().stop();
    notify::tell(&format!(
        "{}\nSTATUS=pushing pending writes, then unmounting",
        notify::STOPPING
    ));
    // Push what is staged before the mount goes away.
    let failures: Vec<(String, String)> = rt.block_on(async {
        match tokio::time::timeout(FINAL_PUSH_LIMIT, core.flush_all()).await {
            Ok(failures) => failures
                .into_iter()
                .map(|(path, e)| (path, e.to_string()))
                .collect(),
            // A sandbox that hangs does not hold the exit: what is unpushed is named, and its
            // journals stay for the next mount.
            Err(_) => core
                .file_stages()
                .into_iter()
                .filter(|(_, stage)| stage.unpushed())
                .map(|(path, _)| {
                    let why = format!(
                        "the sandbox did not take it within {} s",
                        FINAL_PUSH_LIMIT.as_secs()
                    );
                    (path, why)
                })
                .collect(),
        }
    });
    for (path, e) in &failures {
        tracing::error!(file = %path, "could not push before unmounting: {e}");
    }
    // After the last push: the agent this mount started, if `umount --stop-agent` asked.
    if control
        .stop_agent_at_exit
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        match rt.block_on(core.remote().stop_agent()) {
            Ok(done) => tracing::info!("{done}"),
            Err(e) => tracing::warn!("the agent was not stopped: {e}"),
        }
    }
    let saved = if failures.is_empty() {
        Vec::new()
    } else {
        // A push still in flight holds its file: the copies are bounded too (the journals
        // are the durable record either way).
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(15), core.save_unpushed(&staging_path))
                .await
                .unwrap_or_default()
        })
    };
    // Unmount once, ourselves, while our mount is still there (not after `sbxfs umount`).
    let still_ours = mounts::top_at(&mounts::current(), &mountpoint)
        .is_some_and(|e| e.is_sbxfs() && Some(&e.dev) == our_dev.as_ref());
    if still_ours {
        unmount_once(&mountpoint);
    }
    // Copies in other mount namespaces would hold the session for ever: exiting closes the
    // device, which ends the connection and leaves those copies answering ENOTCONN.
    let mut polls = 0u32;
    while !session_ended() {
        std::thread::sleep(SESSION_POLL);
        polls += 1;
        if polls.is_multiple_of(ELSEWHERE_EVERY) && only_elsewhere() {
            break;
        }
    }
    // Dropping fuser's session would unmount once more, and its check that the mount is already
    // gone races the kernel's teardown: it logged a failed unmount on every stop. The session has
    // ended and the mount is gone; the process's exit closes the device.
    std::mem::forget(background);
    if failures.is_empty() {
        return Ok(());
    }
    for f in &saved {
        eprintln!("sbxfs: not pushed, kept in {}", f.display());
    }
    anyhow::bail!(
        "{} file(s) could not be pushed to the sandbox; copies are in {}/unpushed, and the next mount of this sandbox pushes them",
        failures.len(),
        staging_path.display()
    )
}

/// The usual control socket directory is not ours to use (another local user made it, or a
/// link, in a shared `/tmp`): a fresh private directory beside it, made by us with a random
/// name, so nobody can stop the mount by squatting a name. The CLI finds the socket through
/// the mount (its INFO ioctl), wherever it is.
fn fresh_socket_dir(usual: &Path, why: &std::io::Error) -> anyhow::Result<PathBuf> {
    let base = usual.parent().unwrap_or(Path::new("/tmp"));
    let prefix = format!(
        "{}-",
        usual
            .file_name()
            .map_or("sbxfs".into(), |n| n.to_string_lossy())
    );
    let fresh = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(base)
        .with_context(|| {
            format!(
                "control socket directory {}: {why}, and none could be made beside it",
                usual.display()
            )
        })?
        .keep();
    tracing::warn!(
        "control socket directory {}: {why}; using {} instead",
        usual.display(),
        fresh.display()
    );
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_that_does_not_say_who_it_is_is_taken_as_the_workspace_owner() {
        // What an older agent answers: no `user`.
        let info: crate::remote::RemoteInfo =
            serde_json::from_str(r#"{"protocol":1,"agent_version":"0.1","root":"/w"}"#).unwrap();
        assert_eq!(info.user, None);
        let root: crate::remote::Attr = serde_json::from_value(serde_json::json!({
            "kind": "dir", "size": 0, "mode": 0o755, "uid": 1234, "gid": 99,
            "atime_ns": 0, "mtime_ns": 0, "ctime_ns": 0, "ino": 2, "nlink": 2, "version": "v"
        }))
        .unwrap();
        let id = sandbox_user(info.user, &root);
        assert_eq!((id.uid, id.gid, id.groups), (1234, 99, vec![99]));
        let said = crate::remote::Identity {
            uid: 7,
            gid: 8,
            groups: vec![0; gate::MAX_GROUPS + 10],
        };
        assert_eq!(
            sandbox_user(Some(said), &root).groups.len(),
            gate::MAX_GROUPS
        );
    }
}
