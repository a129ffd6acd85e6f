//! The CLI side: find the mount a path lies in (the INFO ioctl), and talk to its socket.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::{Envelope, MountInfo, Request, IOC_INFO, IOC_INFO_SIZE, PROTOCOL_VERSION};

/// Ask the mount holding `path` who it is; `None` when `path` is not in an sbxfs mount.
pub fn mount_info(path: &Path) -> Option<MountInfo> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut buf = vec![0u8; IOC_INFO_SIZE];
    // SAFETY: IOC_INFO is an _IOR command whose size (4096) is exactly `buf`'s length; the kernel
    // writes at most that many bytes into it, and `file` stays open for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), IOC_INFO as _, buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    serde_json::from_slice(&buf[..end]).ok()
}

use std::os::unix::fs::OpenOptionsExt;

/// Where a query about `path` goes: its mount's socket, and `path` inside the workspace.
pub struct Route {
    pub socket: PathBuf,
    pub path: Vec<u8>,
    pub info: MountInfo,
}

pub fn route(path: &Path) -> Option<Route> {
    let info = mount_info(path)?;
    Some(Route {
        socket: PathBuf::from(&info.socket),
        path: info.path.0.clone(),
        info,
    })
}

/// Send one request; the answer lines arrive through the returned iterator (dropping it closes
/// the connection, which cancels a search in the sandbox).
pub fn request(
    socket: &Path,
    req: Request,
) -> std::io::Result<impl Iterator<Item = std::io::Result<serde_json::Value>>> {
    let mut stream = UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(&Envelope {
        v: PROTOCOL_VERSION,
        request: req,
    })?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let reader = BufReader::new(stream);
    Ok(reader.lines().map(|l| {
        l.and_then(|l| {
            serde_json::from_str(&l)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
    }))
}
