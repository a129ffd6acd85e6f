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

impl RemoteError {
    /// The errno a filesystem call reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            RemoteError::NotFound(_) => libc::ENOENT,
            RemoteError::Exists(_) => libc::EEXIST,
            RemoteError::NotDir(_) => libc::ENOTDIR,
            RemoteError::IsDir(_) => libc::EISDIR,
            RemoteError::NotEmpty(_) => libc::ENOTEMPTY,
            RemoteError::Access(_) => libc::EACCES,
            RemoteError::Perm(_) => libc::EPERM,
            RemoteError::CrossDevice(_) => libc::EXDEV,
            RemoteError::NameTooLong(_) => libc::ENAMETOOLONG,
            RemoteError::Invalid(_) => libc::EINVAL,
            RemoteError::TooLarge(_) => libc::E2BIG,
            RemoteError::FileTooBig(_) => libc::EFBIG,
            RemoteError::NoAttr(_) => libc::ENODATA,
            RemoteError::Stale(_) => libc::ESTALE,
            RemoteError::Unsupported(_) => libc::EOPNOTSUPP,
            // A conflict is reported to the writer as an I/O error; the mount keeps the data.
            RemoteError::Conflict { .. } => libc::EIO,
            RemoteError::Unauthorized(_) => libc::EACCES,
            RemoteError::Transport(_) => libc::EIO,
            RemoteError::TimedOut(_) => libc::EIO,
            RemoteError::NoSpace(_) => libc::ENOSPC,
            RemoteError::ReadOnly(_) => libc::EROFS,
            RemoteError::Quota(_) => libc::EDQUOT,
            RemoteError::Query(e) => match e {
                SearchError::NotFound(_) => libc::ENOENT,
                SearchError::IsADirectory(_) => libc::EISDIR,
                SearchError::LimitExceeded(_) => libc::E2BIG,
                _ => libc::EINVAL,
            },
            RemoteError::Io(..) => libc::EIO,
            RemoteError::Interrupted(_) => libc::EINTR,
        }
    }

    /// The wire name of this error (errno names for file errors, the core's tokens for queries).
    pub fn token(&self) -> &'static str {
        match self {
            RemoteError::NotFound(_) => "ENOENT",
            RemoteError::Exists(_) => "EEXIST",
            RemoteError::NotDir(_) => "ENOTDIR",
            RemoteError::IsDir(_) => "EISDIR",
            RemoteError::NotEmpty(_) => "ENOTEMPTY",
            RemoteError::Access(_) => "EACCES",
            RemoteError::Perm(_) => "EPERM",
            RemoteError::CrossDevice(_) => "EXDEV",
            RemoteError::NameTooLong(_) => "ENAMETOOLONG",
            RemoteError::Invalid(_) => "EINVAL",
            RemoteError::TooLarge(_) => "E2BIG",
            RemoteError::FileTooBig(_) => "EFBIG",
            RemoteError::NoAttr(_) => "ENODATA",
            RemoteError::Stale(_) => "ESTALE",
            RemoteError::Unsupported(_) => "EOPNOTSUPP",
            RemoteError::Conflict { .. } => "conflict",
            RemoteError::Unauthorized(_) => "unauthorized",
            RemoteError::Transport(_) => "transport",
            RemoteError::TimedOut(_) => "ETIMEDOUT",
            RemoteError::NoSpace(_) => "ENOSPC",
            RemoteError::ReadOnly(_) => "EROFS",
            RemoteError::Quota(_) => "EDQUOT",
            RemoteError::Query(e) => e.token(),
            RemoteError::Io(..) => "EIO",
            RemoteError::Interrupted(_) => "EINTR",
        }
    }

    /// The error for an errno returned by a system call on `path`.
    pub fn from_errno(errno: i32, path: &str) -> Self {
        let p = path.to_string();
        match errno {
            libc::ENOENT => RemoteError::NotFound(p),
            libc::EEXIST => RemoteError::Exists(p),
            libc::ENOTDIR => RemoteError::NotDir(p),
            libc::EISDIR => RemoteError::IsDir(p),
            libc::ENOTEMPTY => RemoteError::NotEmpty(p),
            libc::EACCES => RemoteError::Access(p),
            libc::EPERM => RemoteError::Perm(p),
            libc::EXDEV => RemoteError::CrossDevice(p),
            libc::ENAMETOOLONG => RemoteError::NameTooLong(p),
            libc::EINVAL => RemoteError::Invalid(p),
            libc::ENOSPC => RemoteError::NoSpace(p),
            libc::EDQUOT => RemoteError::Quota(p),
            libc::EROFS => RemoteError::ReadOnly(p),
            libc::EOPNOTSUPP => RemoteError::Unsupported(p),
            libc::ELOOP => RemoteError::Invalid(format!("{p}: too many levels of symbolic links")),
            libc::EFBIG => RemoteError::FileTooBig(p),
            libc::ENODATA => RemoteError::NoAttr(p),
            libc::EINTR => RemoteError::Interrupted(p),
            e => RemoteError::Io(p, std::io::Error::from_raw_os_error(e).to_string()),
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
            "ENOENT" => RemoteError::NotFound(m),
            "EEXIST" => RemoteError::Exists(m),
            "ENOTDIR" => RemoteError::NotDir(m),
            "EISDIR" => RemoteError::IsDir(m),
            "ENOTEMPTY" => RemoteError::NotEmpty(m),
            "EACCES" => RemoteError::Access(m),
            "EPERM" => RemoteError::Perm(m),
            "EXDEV" => RemoteError::CrossDevice(m),
            "ENAMETOOLONG" => RemoteError::NameTooLong(m),
            "EINVAL" => RemoteError::Invalid(m),
            "E2BIG" => RemoteError::TooLarge(m),
            "EFBIG" => RemoteError::FileTooBig(m),
            "ENODATA" => RemoteError::NoAttr(m),
            "ESTALE" => RemoteError::Stale(m),
            "EOPNOTSUPP" => RemoteError::Unsupported(m),
            "ENOSPC" => RemoteError::NoSpace(m),
            "EROFS" => RemoteError::ReadOnly(m),
            "EDQUOT" => RemoteError::Quota(m),
            "ETIMEDOUT" => RemoteError::TimedOut(m),
            "EINTR" => RemoteError::Interrupted(m),
            "conflict" => RemoteError::Conflict {
                path: m,
                base: base.unwrap_or_default().to_string(),
                current: current.unwrap_or_default().to_string(),
            },
            "unauthorized" => RemoteError::Unauthorized(m),
            "EIO" => RemoteError::Io(String::new(), m),
            other => match SearchError::from_token(other, message, count) {
                Some(e) => RemoteError::Query(e),
                None => RemoteError::Io(String::new(), format!("{other}: {message}")),
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
    fn a_full_disk_a_quota_and_a_read_only_sandbox_keep_their_errno() {
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EACCES] {
            let e = RemoteError::from_errno(errno, "f");
            assert_eq!(e.errno(), errno, "{e}");
            let back = RemoteError::from_wire(e.token(), "f", None, None, None);
            assert_eq!(back.errno(), errno, "{back}");
        }
    }
}
