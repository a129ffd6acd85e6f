//! `sbxfs mount REMOTE MOUNTPOINT`: the FUSE filesystem over any [`crate::remote::Remote`].
//!
//! [`fuse`] is the thin adapter over [`core`], the filesystem operations, which work over
//! [`inode`] (the inode table), [`meta`] (listings), [`pages`] (the page cache), [`handles`]
//! (open files and directories) and [`writeback`] (pushes, retries, conflicts) with
//! [`staging`] (the durable image of a file being written). The daemon runs in the
//! foreground: SIGTERM or SIGINT (or `sbxfs umount`) push pending writes, then unmount.

pub mod core;
pub mod fuse;
pub mod handles;
pub mod inode;
pub mod meta;
pub mod pages;
pub mod staging;
pub mod state;
pub mod writeback;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use self::core::{CoreConfig, FsCore};
use crate::remote::client::AgentClient;
use crate::remote::{Remote, RemotePath};

/// Attributes and listings are trusted this long: short enough that a change made in the
/// sandbox shows within a second, long enough that `ls -l` and `git status` ask once.
pub const DEFAULT_ATTR_TTL: Duration = Duration::from_secs(1);
/// Page cache size: a working set of source files many times over.
pub const DEFAULT_CACHE_BYTES: u64 = 512 * 1024 * 1024;
/// How often failed pushes are looked at (each is retried with its own backoff).
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// FUSE threads: each only decodes and hands off, so a few suffice.
pub const FUSE_THREADS: usize = 4;

pub struct MountConfig {
    pub remote_url: String,
    pub token: Vec<u8>,
    pub mountpoint: PathBuf,
    pub attr_ttl: Duration,
    pub cache_bytes: u64,
    pub staging_dir: Option<PathBuf>,
}

/// Mount and serve until a signal or an unmount; pending writes are pushed before leaving.
pub fn run(cfg: MountConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(4)
        .build()?;
    let token = String::from_utf8(cfg.token.clone()).context("the token must be UTF-8")?;
    let client = AgentClient::new(&cfg.remote_url, &token)?;
    // Every call has a deadline: a sandbox that stops answering blocks nothing for good.
    // (`SBXFS_CALL_TIMEOUT_MS` shortens them, for tests and very near sandboxes.)
    let call = std::env::var("SBXFS_CALL_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(crate::remote::deadline::CALL, Duration::from_millis);
    let remote: Arc<dyn Remote> = Arc::new(crate::remote::deadline::Deadlines::with_call_deadline(
        client, call,
    ));
    let root = rt
        .block_on(remote.stat(&RemotePath::root()))
        .with_context(|| format!("cannot reach the sandbox at {}", cfg.remote_url))?;
    // Private, and the same for every mount of this remote: a daemon that was killed leaves
    // its unpushed edits there, and the next mount pushes them.
    let staging_dir = match &cfg.staging_dir {
        Some(d) => {
            state::ensure_private_dir(d)
                .with_context(|| format!("staging directory {}", d.display()))?;
            d.clone()
        }
        None => state::staging_dir_for(&cfg.remote_url).context("staging directory")?,
    };
    let core = FsCore::new(
        remote,
        CoreConfig {
            attr_ttl: cfg.attr_ttl,
            cache_bytes: cfg.cache_bytes,
            staging_dir: staging_dir.clone(),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        },
        root,
    );
    let mountpoint =
        std::fs::canonicalize(&cfg.mountpoint).unwrap_or_else(|_| cfg.mountpoint.clone());
    let socket = crate::control::socket_path(&mountpoint);
    let listener = {
        let _guard = rt.enter();
        crate::control::server::bind(&socket)
            .with_context(|| format!("control socket {}", socket.display()))?
    };
    let fs = fuse::SbxFs {
        core: core.clone(),
        rt: rt.handle().clone(),
        mountpoint: mountpoint.display().to_string(),
        socket: socket.display().to_string(),
        remote: cfg.remote_url.clone(),
    };
    let info = serde_json::json!({
        "mountpoint": mountpoint.display().to_string(),
        "socket": socket.display().to_string(),
        "remote": cfg.remote_url,
    });
    rt.spawn(crate::control::server::serve(listener, core.clone(), info));
    let mut options = fuser::Config::default();
    options.mount_options = vec![
        fuser::MountOption::FSName(format!("sbxfs:{}", cfg.remote_url)),
        fuser::MountOption::Subtype("sbxfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    options.n_threads = Some(FUSE_THREADS);
    options.clone_fd = true;
    let session = fuser::Session::new(fs, &cfg.mountpoint, &options)
        .with_context(|| format!("cannot mount on {}", cfg.mountpoint.display()))?;
    core.set_kernel_cache(Arc::new(fuse::Notifier(Arc::new(session.notifier()))));
    let background = session.spawn()?;
    println!(
        "sbxfs mounted {} on {}",
        cfg.remote_url,
        cfg.mountpoint.display()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tracing::info!(remote = %cfg.remote_url, mountpoint = %cfg.mountpoint.display(), "mounted");

    let retry_core = core.clone();
    rt.spawn(async move {
        let (done, left) = retry_core.recover_staged().await;
        if done + left > 0 {
            tracing::info!(
                pushed = done,
                kept = left,
                "unpushed edits from an earlier mount of this sandbox"
            );
        }
        loop {
            tokio::time::sleep(RETRY_INTERVAL).await;
            retry_core.retry_pending().await;
        }
    });
    // Wait for a signal, or for the session to end (an external `fusermount3 -u`).
    let ended = Arc::new(tokio::sync::Notify::new());
    let watcher_end = ended.clone();
    let guard = std::thread::spawn(move || {
        let r = background.join();
        watcher_end.notify_one();
        r
    });
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = ended.notified() => {}
        }
    });
    // Push what is staged before the mount goes away.
    let failures = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), core.flush_all())
            .await
            .unwrap_or_default()
    });
    for (path, e) in &failures {
        tracing::error!(file = %path, "could not push before unmounting: {e}");
    }
    let saved = if failures.is_empty() {
        Vec::new()
    } else {
        rt.block_on(core.save_unpushed(&staging_dir))
    };
    unmount(&cfg.mountpoint);
    let _ = guard.join();
    let _ = std::fs::remove_file(&socket);
    if !failures.is_empty() {
        for f in &saved {
            eprintln!("sbxfs: not pushed, kept in {}", f.display());
        }
        anyhow::bail!(
            "{} file(s) could not be pushed to the sandbox; copies are in {}/unpushed, and the next mount of this sandbox pushes them",
            failures.len(),
            staging_dir.display()
        );
    }
    Ok(())
}

/// Unmount (lazily, so a busy mount still goes away).
pub fn unmount(mountpoint: &Path) {
    let _ = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(mountpoint)
        .status();
}
