//! systemd's protocols: readiness (`sd_notify(3)`) and whether stderr is its journal. Readiness is
//! one datagram of `KEY=VALUE` lines to the socket named by `$NOTIFY_SOCKET` (a path, or a
//! Linux abstract name written `@name`). Without that variable (not started by systemd with `Type=notify`) nothing is sent. Written here
//! rather than taken from a crate because the crates at hand do not reach abstract sockets,
//! which systemd uses in containers.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The service is up: the mount answers.
pub const READY: &str = "READY=1";
/// The service is on its way out (pushing pending writes, then unmounting).
pub const STOPPING: &str = "STOPPING=1";

/// Send `state` (lines of `KEY=VALUE`) to the service manager. `Ok(false)`: no manager asked.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(name) = std::env::var_os("NOTIFY_SOCKET").filter(|n| !n.is_empty()) else {
        return Ok(false);
    };
    let bytes = name.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(&name)?,
    };
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// [`notify()`], with a failure logged rather than returned: the mount serves either way.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("could not notify the service manager ({state}): {e}");
    }
}

/// True when stderr is the journal: systemd sets `JOURNAL_STREAM=DEV:INODE` of the stream it
/// connected, and a child whose stderr was redirected elsewhere must not be fooled by it.
pub fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(std::io::stderr()) else {
        return false;
    };
    dev.parse() == Ok(st.st_dev) && ino.parse() == Ok(st.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_and_an_abstract_name_both_receive_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let by_path = UnixDatagram::bind(&path).unwrap();
        let name = format!("sbxfs-notify-test-{}", std::process::id());
        let by_name =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let mut buf = [0u8; 64];
        // One test sets the variable in turn (tests of this module run in one thread each, but
        // only this one reads NOTIFY_SOCKET).
        for (value, socket) in [
            (path.display().to_string(), &by_path),
            (format!("@{name}"), &by_name),
        ] {
            // SAFETY: no other thread of this test binary reads or writes NOTIFY_SOCKET.
            unsafe { std::env::set_var("NOTIFY_SOCKET", &value) };
            assert!(notify(READY).unwrap());
            let n = socket.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"READY=1");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(!notify(READY).unwrap());
    }
}
