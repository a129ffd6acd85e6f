//! The mount's control surface, shared by the daemon and the CLI (one versioned protocol).
//!
//! - **ioctl** on any file or directory of a mount: `SBXFS_IOC_INFO` answers which mount this
//!   is (mountpoint, control socket, remote) and the file's workspace path and cached version,
//!   as NUL-terminated JSON in a fixed 4 KiB buffer (FUSE passes only restricted ioctls, whose
//!   size the command number fixes). That is how `sbxfs grep` standing in a mount finds it.
//! - **Control socket**: one Unix socket per mount, 0600 in a private runtime directory, usable by
//!   the mount's owner (and root) only (`SO_PEERCRED`). One JSON request line per connection
//!   ([`Request`], with `"v": 1`), answered with JSON lines: grep streams its matches then a
//!   summary line; a client that disconnects cancels the search in the sandbox.

pub mod client;
pub mod server;

use serde::{Deserialize, Serialize};

use crate::remote::FuzzyRequest;
use crate::search::grep::GrepOptions;
use crate::search::scan::ScanRequest;

pub const PROTOCOL_VERSION: u32 = 1;

/// `_IOR(type, nr, size)` as Linux encodes it.
const fn ior(ty: u8, nr: u8, size: u32) -> u32 {
    (2 << 30) | (size << 16) | ((ty as u32) << 8) | nr as u32
}

/// Size of the INFO answer buffer: fixed by the command number, under FUSE's 16 KiB limit.
pub const IOC_INFO_SIZE: usize = 4096;
/// `SBXFS_IOC_INFO`: `_IOR('S', 1, char[4096])`.
pub const IOC_INFO: u32 = ior(b'S', 1, IOC_INFO_SIZE as u32);

/// The INFO answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MountInfo {
    pub v: u32,
    pub mountpoint: String,
    pub socket: String,
    pub remote: String,
    /// The file's path in the workspace (`""` for the root).
    pub path: crate::remote::WireBytes,
    /// The version cached for the file, if known.
    #[serde(default)]
    pub version: Option<String>,
}

/// One request on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Grep {
        path: crate::remote::WireBytes,
        options: GrepOptions,
    },
    Glob {
        path: crate::remote::WireBytes,
        pattern: String,
    },
    Fuzzy {
        path: crate::remote::WireBytes,
        request: FuzzyRequest,
    },
    Scan {
        path: crate::remote::WireBytes,
        request: ScanRequest,
    },
    Edit {
        path: crate::remote::WireBytes,
        old: String,
        new: String,
        replace_all: bool,
    },
    Stats,
    Flush,
    Invalidate {
        path: crate::remote::WireBytes,
    },
    Status,
}

/// The envelope: the protocol version and the request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u32,
    #[serde(flatten)]
    pub request: Request,
}

/// Where a mount keeps its control socket: a per-user directory only its owner can enter.
pub fn socket_path(mountpoint: &std::path::Path) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let uid = rustix::process::getuid().as_raw();
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_dir())
        .map(|p| p.join("sbxfs"))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sbxfs-{uid}")));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    mountpoint.hash(&mut h);
    base.join(format!("{:016x}.sock", h.finish()))
}
