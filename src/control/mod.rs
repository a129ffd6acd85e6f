//! The mount's control surface, shared by the daemon and the CLI (one versioned protocol): the
//! request types, the ioctl numbers and codec, the socket's location, and the CLI's client. The
//! daemon's side of the socket is [`crate::mount::control_server`].
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

/// Where the FUSE adapter's QUERY ioctl still looks for the daemon side, which moved to
/// [`crate::mount::control_server`]; goes once the adapter names that module itself.
#[doc(hidden)]
pub mod server {
    pub use crate::mount::control_server::answer_one;
}

use serde::{Deserialize, Serialize};

use crate::remote::FuzzyRequest;
use crate::search::grep::GrepOptions;
use crate::search::scan::ScanRequest;

pub const PROTOCOL_VERSION: u32 = 1;

/// `_IOR(type, nr, size)` as Linux encodes it.
const fn ior(ty: u8, nr: u8, size: u32) -> u32 {
    (2 << 30) | (size << 16) | ((ty as u32) << 8) | nr as u32
}

/// `_IOWR(type, nr, size)`.
const fn iowr(ty: u8, nr: u8, size: u32) -> u32 {
    (3 << 30) | (size << 16) | ((ty as u32) << 8) | nr as u32
}

/// Size of the QUERY buffer (request in, answer out): under FUSE's 16 KiB restricted limit.
pub const IOC_QUERY_SIZE: usize = 16_000;
/// `SBXFS_IOC_QUERY`: `_IOWR('S', 2, char[16000])`. In: a NUL-terminated request like the
/// socket's (`{"v":1,"op":"scan","request":{…}}`; its `path` is ignored: the query is about the
/// file or directory the ioctl is called on). Out: the NUL-terminated JSON answer, or `E2BIG`
/// when it does not fit (ask the control socket, whose path INFO gives), `EINVAL` for a
/// malformed request.
pub const IOC_QUERY: u32 = iowr(b'S', 2, IOC_QUERY_SIZE as u32);

/// Decode a QUERY ioctl's buffer: a NUL-terminated [`Envelope`] whose `path` may be left out
/// (the ioctl's file is what it is about). `None` for anything else: a wrong size, a missing
/// NUL, another version, a malformed or too deeply nested request.
pub fn decode_query(in_data: &[u8]) -> Option<Request> {
    if in_data.len() != IOC_QUERY_SIZE {
        return None;
    }
    let end = in_data.iter().position(|&b| b == 0)?;
    let mut v = serde_json::from_slice::<serde_json::Value>(&in_data[..end]).ok()?;
    if v.get("v")?.as_u64()? != u64::from(PROTOCOL_VERSION) {
        return None;
    }
    if v.get("path").is_none() {
        v["path"] = serde_json::json!("");
    }
    serde_json::from_value::<Request>(v).ok()
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
    /// When the daemon exits (after its last push), stop the agent this mount started in the
    /// sandbox (`sbxfs umount --stop-agent`). Answer: `{"stop_agent": "at exit"}`.
    #[serde(rename = "stop_agent")]
    StopAgent,
    Invalidate {
        path: crate::remote::WireBytes,
    },
    Status,
    /// A symlink's target as the sandbox has it (the mount shows outside targets under a path
    /// that cannot resolve: see [`crate::mount::links`]). Answer: `{"target", "shown"}`. By
    /// ioctl, `path` is relative to the directory the ioctl is called on.
    Readlink {
        path: crate::remote::WireBytes,
    },
    /// Stream the sandbox's changes under `path` (the workspace's root: empty), one JSON line
    /// each (`{"seq","kind","path","to"}`), first those after `since`. A `{"lost": N}` line
    /// says changes were dropped (not kept any more, or the watcher fell behind).
    Watch {
        path: crate::remote::WireBytes,
        #[serde(default)]
        since: Option<u64>,
    },
}

impl Request {
    /// The same request about another path (the ioctl's file or directory).
    pub fn at(self, p: Vec<u8>) -> Request {
        let w = crate::remote::WireBytes(p);
        match self {
            Request::Grep { options, .. } => Request::Grep { path: w, options },
            Request::Glob { pattern, .. } => Request::Glob { path: w, pattern },
            Request::Fuzzy { request, .. } => Request::Fuzzy { path: w, request },
            Request::Scan { request, .. } => Request::Scan { path: w, request },
            Request::Edit {
                old,
                new,
                replace_all,
                ..
            } => Request::Edit {
                path: w,
                old,
                new,
                replace_all,
            },
            Request::Invalidate { .. } => Request::Invalidate { path: w },
            Request::Watch { since, .. } => Request::Watch { path: w, since },
            // A link cannot be opened for an ioctl (open follows it): the ioctl names its
            // directory, and the request the link's path relative to that directory.
            Request::Readlink { path } => {
                let mut p = w.0;
                if !path.0.is_empty() {
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&path.0);
                }
                Request::Readlink {
                    path: crate::remote::WireBytes(p),
                }
            }
            other => other,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buffer(request: &[u8]) -> Vec<u8> {
        let mut b = request.to_vec();
        b.resize(IOC_QUERY_SIZE, 0);
        b
    }

    #[test]
    fn a_query_without_a_path_is_about_the_ioctls_file() {
        let r = decode_query(&buffer(br#"{"v":1,"op":"readlink"}"#)).unwrap();
        assert!(matches!(r, Request::Readlink { ref path } if path.0.is_empty()));
        assert!(matches!(r.at(b"d".to_vec()), Request::Readlink { path } if path.0 == b"d"));
        let r = decode_query(&buffer(br#"{"v":1,"op":"readlink","path":"ln"}"#)).unwrap();
        assert!(matches!(r.at(b"d".to_vec()), Request::Readlink { path } if path.0 == b"d/ln"));
        assert!(decode_query(&buffer(br#"{"v":2,"op":"status"}"#)).is_none());
        assert!(
            decode_query(br#"{"v":1,"op":"status"}"#).is_none(),
            "wrong size"
        );
        assert!(
            decode_query(&vec![b' '; IOC_QUERY_SIZE]).is_none(),
            "no NUL"
        );
    }

    proptest! {
        #[test]
        fn any_ioctl_buffer_decodes_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_query(&buffer(&bytes));
            let _ = decode_query(&bytes);
        }

        #[test]
        fn any_control_line_decodes_or_is_refused(line in ".{0,400}") {
            let _ = serde_json::from_str::<Envelope>(&line);
            let _ = serde_json::from_str::<MountInfo>(&line);
        }

        /// Past serde_json's recursion limit (128), wherever the nesting is (an unknown field
        /// included): an error, never a stack overflow.
        #[test]
        fn a_deeply_nested_request_is_refused(depth in 128usize..7_000) {
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let line = format!(r#"{{"v":1,"op":"glob","path":"","pattern":{nested}}}"#);
            prop_assert!(serde_json::from_str::<Envelope>(&line).is_err());
            let opts = format!(r#"{{"v":1,"op":"grep","path":"","options":{{"pattern":"x","globs":{nested}}}}}"#);
            prop_assert!(serde_json::from_str::<Envelope>(&opts).is_err());
            if line.len() < IOC_QUERY_SIZE {
                prop_assert!(decode_query(&buffer(line.as_bytes())).is_none());
            }
        }
    }
}
