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
    let reader = BufReader::new(send(socket, req)?);
    Ok(reader
        .lines()
        .map(|l| l.and_then(|l| parse_line(l.as_bytes()))))
}

fn send(socket: &Path, req: Request) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(&Envelope {
        v: PROTOCOL_VERSION,
        request: req,
    })?;
    line.push(b'\n');
    stream.write_all(&line)?;
    Ok(stream)
}

fn parse_line(line: &[u8]) -> std::io::Result<serde_json::Value> {
    serde_json::from_slice(line)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A request whose one answer may take long (a flush while the sandbox is slow or hangs):
/// waited for in steps, so the caller can say what it waits for, or stop waiting.
pub struct Awaited {
    reader: BufReader<UnixStream>,
    line: Vec<u8>,
}

impl Awaited {
    pub fn send(socket: &Path, req: Request) -> std::io::Result<Awaited> {
        Ok(Awaited {
            reader: BufReader::new(send(socket, req)?),
            line: Vec::new(),
        })
    }

    /// The answer, if it arrives within `patience`; `Ok(None)` while it has not (what came
    /// so far is kept for the next call).
    pub fn within(
        &mut self,
        patience: std::time::Duration,
    ) -> std::io::Result<Option<serde_json::Value>> {
        use std::io::ErrorKind::{Interrupted, TimedOut, UnexpectedEof, WouldBlock};
        self.reader
            .get_ref()
            .set_read_timeout(Some(patience.max(std::time::Duration::from_millis(1))))?;
        // read_until keeps every byte it consumed in `line`, even when it fails.
        match self.reader.read_until(b'\n', &mut self.line) {
            Ok(_) if self.line.ends_with(b"\n") => parse_line(&self.line).map(Some),
            Ok(_) => Err(std::io::Error::new(
                UnexpectedEof,
                "the mount closed the connection",
            )),
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut | Interrupted) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
