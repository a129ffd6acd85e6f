//! The one error type every `Remote` returns, and the one place it becomes an errno.

use crate::search::SearchError;

/// A remote operation's failure. [`RemoteError::errno`] maps every variant, exhaustively, so a
/// new variant forces a decision; [`RemoteError::token`] names it on the wire.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RemoteError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: already exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotDir(String),
    #[error("{0}: is a directory")]
    IsDir(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{0}: permission denied")]
    Access(String),
    #[error("{0}: operation not permitted")]
    Perm(String),
    #[error("{0}: cross-device link")]
    CrossDevice(String),
    #[error("{0}: name too long")]
    NameTooLong(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("too large: {0}")]
    TooLarge(String),
    /// A file size past what the sandbox allows (`EFBIG`).
    #[error("{0}: file too large")]
    FileTooBig(String),
    /// The file a handle was reading was replaced in the sandbox: its old content is gone
    /// (`ESTALE`, as NFS answers for a file handle whose file was replaced).
    #[error("{0}: stale file handle (replaced in the sandbox since it was opened)")]
    Stale(String),
    /// No extended attribute by that name (`ENODATA`).
    #[error("{0}: no such attribute")]
    NoAttr(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The file changed since the version the caller named; nothing was written.
    #[error("{path}: changed in the sandbox since version {base} (now {current})")]
    Conflict {
        path: String,
        base: String,
        current: String,
    },
    #[error("not authorised: {0}")]
    Unauthorized(String),
    #[error("the sandbox did not answer: {0}")]
    Transport(String),
    #[error("timed out: {0}")]
    TimedOut(String),
    #[error("{0}: no space left on device")]
    NoSpace(String),
    /// The sandbox's filesystem is mounted read-only (`EROFS`).
    #[error("{0}: read-only file system")]
    ReadOnly(String),
    /// The sandbox user's disk quota is used up (`EDQUOT`).
    #[error("{0}: disk quota exceeded")]
    Quota(String),
    #[error("{0}")]
    Query(SearchError),
    #[error("{0}: i/o error: {1}")]
    Io(String, String),
    /// The caller was interrupted by a signal while the mount worked for it (`EINTR`): its
    /// work was dropped.
    #[error("{0}: interrupted")]
    Interrupted(String),
}

pub type Result<T> = std::result::Result<T, RemoteError>;

/// One kind of error that carries a single message: how it is made, its name on the wire,
/// the errno a filesystem call reports for it, and whether a system call's errno of that
/// value becomes it ([`RemoteError::from_errno`]).
struct Kind {
    make: fn(String) -> RemoteError,
    token: &'static str,
    errno: i32,
    from_errno: bool,
}

const fn kind(make: fn(String) -> RemoteError, token: &'static str, errno: i32) -> Kind {
    Kind {
        make,
        token,
        errno,
        from_errno: true,
    }
}

/// Kinds the sandbox's errno never produces (they are this side's findings or words).
const fn finding(make: fn(String) -> RemoteError, token: &'static str, errno: i32) -> Kind {
    Kind {
        make,
        token,
        errno,
        from_errno: false,
    }
}

/// The table, written once: every single-message variant (the others — a conflict with its
/// versions, a query's error, an I/O error with its path — are the matches below).
const KINDS: &[Kind] = &[
    kind(RemoteError::NotFound, "ENOENT", libc::ENOENT),
    kind(RemoteError::Exists, "EEXIST", libc::EEXIST),
    kind(RemoteError::NotDir, "ENOTDIR", libc::ENOTDIR),
    kind(RemoteError::IsDir, "EISDIR", libc::EISDIR),
    kind(RemoteError::NotEmpty, "ENOTEMPTY", libc::ENOTEMPTY),
    kind(RemoteError::Access, "EACCES", libc::EACCES),
    kind(RemoteError::Perm, "EPERM", libc::EPERM),
    kind(RemoteError::CrossDevice, "EXDEV", libc::EXDEV),
    kind(RemoteError::NameTooLong, "ENAMETOOLONG", libc::ENAMETOOLONG),
    kind(RemoteError::Invalid, "EINVAL", libc::EINVAL),
    kind(RemoteError::TooLarge, "E2BIG", libc::E2BIG),
    kind(RemoteError::FileTooBig, "EFBIG", libc::EFBIG),
    kind(RemoteError::NoAttr, "ENODATA", libc::ENODATA),
    kind(RemoteError::Stale, "ESTALE", libc::ESTALE),
    kind(RemoteError::Unsupported, "EOPNOTSUPP", libc::EOPNOTSUPP),
    kind(RemoteError::NoSpace, "ENOSPC", libc::ENOSPC),
    kind(RemoteError::ReadOnly, "EROFS", libc::EROFS),
    kind(RemoteError::Quota, "EDQUOT", libc::EDQUOT),
    kind(RemoteError::Interrupted, "EINTR", libc::EINTR),
    finding(RemoteError::TimedOut, "ETIMEDOUT", libc::EIO),
    finding(RemoteError::Unauthorized, "unauthorized", libc::EACCES),
    // "Did not answer" is this side's finding, never the sandbox's word: an agent that says
    // it is an error of its own (EIO, below), not a dead link to retry.
    finding(RemoteError::Transport, "transport", libc::EIO),
];

impl RemoteError {
    /// This error's row of [`KINDS`] (`None` for the variants with more than a message).
    fn kind(&self) -> Option<&'static Kind> {
        let mine = std::mem::discriminant(self);
        KINDS
            .iter()
            .find(|k| std::mem::discriminant(&(k.make)(String::new())) == mine)
    }

    /// The errno a filesystem call reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            // A conflict is reported to the writer as an I/O error; the mount keeps the data.
            RemoteError::Conflict { .. } | RemoteError::Io(..) => libc::EIO,
            RemoteError::Query(e) => match e {
                SearchError::NotFound(_) => libc::ENOENT,
                SearchError::IsADirectory(_) => libc::EISDIR,
                SearchError::LimitExceeded(_) => libc::E2BIG,
                _ => libc::EINVAL,
            },
            other => other.kind().map_or(libc::EIO, |k| k.errno),
        }
    }

    /// The wire name of this error (errno names for file errors, the core's tokens for queries).
    pub fn token(&self) -> &'static str {
        match self {
            RemoteError::Conflict { .. } => "conflict",
            RemoteError::Query(e) => e.token(),
            RemoteError::Io(..) => "EIO",
            other => other.kind().map_or("EIO", |k| k.token),
        }
    }

    /// The error for an errno returned by a system call on `path`.
    pub fn from_errno(errno: i32, path: &str) -> Self {
        let p = path.to_string();
        if errno == libc::ELOOP {
            return RemoteError::Invalid(format!("{p}: too many levels of symbolic links"));
        }
        match KINDS.iter().find(|k| k.from_errno && k.errno == errno) {
            Some(k) => (k.make)(p),
            None => RemoteError::Io(p, std::io::Error::from_raw_os_error(errno).to_string()),
        }
    }

    pub fn from_io(e: &std::io::Error, path: &str) -> Self {
        match e.raw_os_error() {
            Some(errno) => Self::from_errno(errno, path),
            None => RemoteError::Io(path.to_string(), e.to_string()),
        }
    }

    /// Rebuild an error from its wire form (`token`, `message`, and the extra fields).
    pub fn from_wire(
        token: &str,
        message: &str,
        count: Option<usize>,
        base: Option<&str>,
        current: Option<&str>,
    ) -> Self {
        let m = message.to_string();
        match token {
            "conflict" => RemoteError::Conflict {
                path: m,
                base: base.unwrap_or_default().to_string(),
                current: current.unwrap_or_default().to_string(),
            },
            "EIO" => RemoteError::Io(String::new(), m),
            // The sandbox cannot claim this side's finding (see [`KINDS`]).
            "transport" => RemoteError::Io(String::new(), format!("transport: {message}")),
            other => match KINDS.iter().find(|k| k.token == other) {
                Some(k) => (k.make)(m),
                None => match SearchError::from_token(other, message, count) {
                    Some(e) => RemoteError::Query(e),
                    None => RemoteError::Io(String::new(), format!("{other}: {message}")),
                },
            },
        }
    }
}

impl From<SearchError> for RemoteError {
    fn from(e: SearchError) -> Self {
        RemoteError::Query(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant (the match makes a new variant a compile error here).
    fn every_variant() -> Vec<RemoteError> {
        let m = || "p".to_string();
        let all = vec![
            RemoteError::NotFound(m()),
            RemoteError::Exists(m()),
            RemoteError::NotDir(m()),
            RemoteError::IsDir(m()),
            RemoteError::NotEmpty(m()),
            RemoteError::Access(m()),
            RemoteError::Perm(m()),
            RemoteError::CrossDevice(m()),
            RemoteError::NameTooLong(m()),
            RemoteError::Invalid(m()),
            RemoteError::TooLarge(m()),
            RemoteError::FileTooBig(m()),
            RemoteError::Stale(m()),
            RemoteError::NoAttr(m()),
            RemoteError::Unsupported(m()),
            RemoteError::Conflict {
                path: m(),
                base: "b".into(),
                current: "c".into(),
            },
            RemoteError::Unauthorized(m()),
            RemoteError::Transport(m()),
            RemoteError::TimedOut(m()),
            RemoteError::NoSpace(m()),
            RemoteError::ReadOnly(m()),
            RemoteError::Quota(m()),
            RemoteError::Query(SearchError::NotFound(m())),
            RemoteError::Io(String::new(), m()),
            RemoteError::Interrupted(m()),
        ];
        for e in &all {
            match e {
                RemoteError::NotFound(_)
                | RemoteError::Exists(_)
                | RemoteError::NotDir(_)
                | RemoteError::IsDir(_)
                | RemoteError::NotEmpty(_)
                | RemoteError::Access(_)
                | RemoteError::Perm(_)
                | RemoteError::CrossDevice(_)
                | RemoteError::NameTooLong(_)
                | RemoteError::Invalid(_)
                | RemoteError::TooLarge(_)
                | RemoteError::FileTooBig(_)
                | RemoteError::Stale(_)
                | RemoteError::NoAttr(_)
                | RemoteError::Unsupported(_)
                | RemoteError::Conflict { .. }
                | RemoteError::Unauthorized(_)
                | RemoteError::Transport(_)
                | RemoteError::TimedOut(_)
                | RemoteError::NoSpace(_)
                | RemoteError::ReadOnly(_)
                | RemoteError::Quota(_)
                | RemoteError::Query(_)
                | RemoteError::Io(..)
                | RemoteError::Interrupted(_) => {}
            }
        }
        all
    }

    #[test]
    fn every_variant_survives_the_wire_with_its_errno() {
        for e in every_variant() {
            // "Did not answer" is this side's finding, never the sandbox's word: an agent
            // that says it is an error of its own (EIO), not a dead link to retry.
            if matches!(e, RemoteError::Transport(_)) {
                let back = RemoteError::from_wire(e.token(), "p", None, None, None);
                assert_eq!(back.errno(), libc::EIO);
                assert!(!matches!(back, RemoteError::Transport(_)));
                continue;
            }
            let back = RemoteError::from_wire(e.token(), "p", None, Some("b"), Some("c"));
            assert_eq!(back.token(), e.token(), "{e:?}");
            assert_eq!(back.errno(), e.errno(), "{e:?}");
        }
    }

    #[test]
    fn the_table_names_each_kind_once_and_errnos_come_back_as_themselves() {
        for (i, k) in KINDS.iter().enumerate() {
            let e = (k.make)("p".into());
            assert_eq!(e.token(), k.token);
            assert_eq!(e.errno(), k.errno);
            for other in &KINDS[i + 1..] {
                assert_ne!(k.token, other.token, "a token named twice");
                assert!(
                    !(k.from_errno && other.from_errno && k.errno == other.errno),
                    "errno {} made by two kinds",
                    k.errno
                );
            }
            if k.from_errno {
                assert_eq!(RemoteError::from_errno(k.errno, "p"), e);
            }
        }
        // Every single-message variant has its row.
        for e in every_variant() {
            let single = !matches!(
                e,
                RemoteError::Conflict { .. } | RemoteError::Query(_) | RemoteError::Io(..)
            );
            assert_eq!(e.kind().is_some(), single, "{e:?}");
        }
    }

    #[test]
    fn a_full_disk_a_quota_and_a_read_only_sandbox_keep_their_errno() {
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EACCES] {
            let e = RemoteError::from_errno(errno, "f");
            assert_eq!(e.errno(), errno, "{e}");
            let back = RemoteError::from_wire(e.token(), "f", None, None, None);
            assert_eq!(back.errno(), errno, "{back}");
        }
    }
}
