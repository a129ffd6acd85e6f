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

/// Ask the mount holding `path` a question through the QUERY ioctl. `Err(E2BIG)` means the
/// answer is too large for the ioctl: use the control socket instead.
pub fn ioctl_query(path: &Path, request: &Request) -> Result<serde_json::Value, i32> {
    use super::{IOC_QUERY, IOC_QUERY_SIZE};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let mut buf = vec![0u8; IOC_QUERY_SIZE];
    let req = serde_json::to_vec(&Envelope {
        v: PROTOCOL_VERSION,
        request: request.clone(),
    })
    .map_err(|_| libc::EINVAL)?;
    if req.len() >= IOC_QUERY_SIZE {
        return Err(libc::E2BIG);
    }
    buf[..req.len()].copy_from_slice(&req);
    // SAFETY: IOC_QUERY is an _IOWR command of size IOC_QUERY_SIZE, exactly `buf`'s length; the
    // kernel reads and writes at most that many bytes, and `file` stays open for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), IOC_QUERY as _, buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    serde_json::from_slice(&buf[..end]).map_err(|_| libc::EIO)
}

/// Where a query about `path` goes: its mount's socket, and `path` inside the workspace.
pub struct Route {
    pub socket: PathBuf,
    pub path: Vec<u8>,
    pub info: MountInfo,
    /// The local path, for the QUERY ioctl.
    pub on: Option<PathBuf>,
}

pub fn route(path: &Path) -> Option<Route> {
    let info = mount_info(path)?;
    Some(Route {
        socket: PathBuf::from(&info.socket),
        path: info.path.0.clone(),
        info,
        on: Some(path.to_path_buf()),
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
