//! Why `sbxfs mount` failed, as its exit code (the README's "Boot-time mounts" lists them): a
//! script or a service manager can tell a mistake in the command from a sandbox that is down.

/// The exit codes of `sbxfs mount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A usage mistake (an option, the token) or any other error, including writes that could
    /// not be pushed before exiting.
    Other = 2,
    /// The mountpoint cannot be used: missing, not a directory, not empty, already mounted.
    Mountpoint = 3,
    /// FUSE is not available or not permitted here: no `/dev/fuse`, no `fusermount3`, or the
    /// kernel or `fusermount3` refused the mount.
    Fuse = 4,
    /// The sandbox could not be reached at start (refused, name not resolved, timed out).
    Sandbox = 5,
    /// Something answered, but not an sbxfs agent this build can talk to (another server, a
    /// TLS failure, another protocol version).
    NotAgent = 6,
    /// The agent rejected the token.
    Token = 7,
}

/// An error with its exit code. Its text is the whole line (without the `sbxfs mount:` prefix).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub why: Failure,
    pub message: String,
}

impl Refused {
    /// The error to return.
    pub fn error(why: Failure, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Refused {
            why,
            message: message.into(),
        })
    }
}

/// The exit code for an error out of [`super::run`]: the sandbox's errors at first contact
/// are [`Failure::Sandbox`] wherever they are wrapped.
pub fn code_of(e: &anyhow::Error) -> i32 {
    if let Some(r) = e
        .chain()
        .find_map(|c| c.downcast_ref::<crate::remote::reach::ReachError>())
    {
        return r.exit_code();
    }
    if let Some(c) = e
        .chain()
        .find_map(|c| c.downcast_ref::<crate::remote::connect::ConnectError>())
    {
        return c.exit_code();
    }
    let why = if let Some(r) = e.downcast_ref::<Refused>() {
        r.why
    } else if e.downcast_ref::<crate::remote::RemoteError>().is_some() {
        Failure::Sandbox
    } else {
        Failure::Other
    };
    why as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_found_under_context() {
        let e = Refused::error(Failure::Mountpoint, "mountpoint /x does not exist");
        assert_eq!(code_of(&e), 3);
        assert_eq!(code_of(&e.context("while starting")), 3);
        let remote = anyhow::Error::new(crate::remote::RemoteError::Transport("refused".into()))
            .context("cannot reach the sandbox at http://h:1");
        assert_eq!(code_of(&remote), 5);
        assert_eq!(code_of(&anyhow::anyhow!("the token is empty")), 2);
    }
}
