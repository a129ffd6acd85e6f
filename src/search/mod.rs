//! The search and edit core: `scan`, `glob`, `grep`, `fuzzy` and `edit`.
//!
//! Pure algorithms over a local directory tree, with no FUSE or network dependency: the agent
//! runs them next to the data, the CLI runs them on local paths, and the shared vectors in
//! `tests/vectors/` pin what every implementation (this one, `scripts/scan.sh`,
//! `scripts/edit.py`, the test references) must answer.

pub mod beneath;
pub mod cancel;
pub mod edit;
pub mod fuzzy;
pub mod glob;
pub mod grep;
pub mod print;
pub mod scan;
pub mod snapshot;
pub mod walk;

use std::io;
use std::path::Path;

/// Every way a query can fail. [`SearchError::token`] is the one place that names each for
/// programs (JSON output, the agent protocol, `scripts/edit.py`'s result line).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("unsupported pattern: {0}")]
    Unsupported(String),
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    #[error("invalid regular expression: {0}")]
    Regex(String),
    #[error("the string to replace was not found")]
    StringNotFound,
    #[error("the string to replace occurs {0} times; pass --all to replace each one, or make --old longer so it is unique")]
    MultipleOccurrences(usize),
    #[error("{0}: cannot read: {1}")]
    ReadFailed(String, String),
    #[error("{0}: cannot write: {1}")]
    WriteFailed(String, String),
    #[error("{0}: {1}")]
    Io(String, String),
}

/// Open a file for reading only if it is a regular file: opened `O_NONBLOCK` (so a FIFO put in
/// its place never blocks the open) and checked with `fstat` before anything reads it.
/// A directory is [`SearchError::IsADirectory`]; a FIFO, socket or device is
/// [`SearchError::ReadFailed`] with "not a regular file".
pub fn open_regular(path: &std::path::Path) -> Result<std::fs::File, SearchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| SearchError::from_io(path, e))?;
    let meta = file.metadata().map_err(|e| SearchError::from_io(path, e))?;
    if meta.is_dir() {
        return Err(SearchError::IsADirectory(path.display().to_string()));
    }
    if !meta.is_file() {
        return Err(SearchError::ReadFailed(
            path.display().to_string(),
            "not a regular file".into(),
        ));
    }
    Ok(file)
}

impl SearchError {
    /// The stable machine-readable name of this error.
    pub fn token(&self) -> &'static str {
        match self {
            SearchError::NotFound(_) => "not_found",
            SearchError::IsADirectory(_) => "is_a_directory",
            SearchError::InvalidArgs(_) => "invalid_args",
            SearchError::Unsupported(_) => "unsupported",
            SearchError::LimitExceeded(_) => "limit_exceeded",
            SearchError::Regex(_) => "invalid_regex",
            SearchError::StringNotFound => "string_not_found",
            SearchError::MultipleOccurrences(_) => "multiple_occurrences",
            SearchError::ReadFailed(..) => "read_failed",
            SearchError::WriteFailed(..) => "write_failed",
            SearchError::Io(..) => "io_error",
        }
    }

    /// The error's details without the wording [`std::fmt::Display`] adds, so that
    /// `from_token(token(), detail())` displays exactly as the original.
    pub fn detail(&self) -> String {
        match self {
            SearchError::NotFound(m)
            | SearchError::IsADirectory(m)
            | SearchError::InvalidArgs(m)
            | SearchError::Unsupported(m)
            | SearchError::LimitExceeded(m)
            | SearchError::Regex(m) => m.clone(),
            SearchError::StringNotFound | SearchError::MultipleOccurrences(_) => String::new(),
            SearchError::ReadFailed(p, r)
            | SearchError::WriteFailed(p, r)
            | SearchError::Io(p, r) => {
                format!("{p}\u{1f}{r}")
            }
        }
    }

    /// Rebuild an error from its token and message (the inverse of [`SearchError::token`] as
    /// far as the wire carries it: the message stands in for the details).
    pub fn from_token(token: &str, message: &str, count: Option<usize>) -> Option<Self> {
        let m = message.to_string();
        let two = || match message.split_once('\u{1f}') {
            Some((p, r)) => (p.to_string(), r.to_string()),
            None => (message.to_string(), String::new()),
        };
        Some(match token {
            "not_found" => SearchError::NotFound(m),
            "is_a_directory" => SearchError::IsADirectory(m),
            "invalid_args" => SearchError::InvalidArgs(m),
            "unsupported" => SearchError::Unsupported(m),
            "limit_exceeded" => SearchError::LimitExceeded(m),
            "invalid_regex" => SearchError::Regex(m),
            "string_not_found" => SearchError::StringNotFound,
            "multiple_occurrences" => SearchError::MultipleOccurrences(count.unwrap_or(0)),
            "read_failed" => {
                let (p, r) = two();
                SearchError::ReadFailed(p, r)
            }
            "write_failed" => {
                let (p, r) = two();
                SearchError::WriteFailed(p, r)
            }
            "io_error" => {
                let (p, r) = two();
                SearchError::Io(p, r)
            }
            _ => return None,
        })
    }

    pub(crate) fn from_io(path: &Path, e: io::Error) -> Self {
        let p = path.display().to_string();
        match e.kind() {
            io::ErrorKind::NotFound => SearchError::NotFound(p),
            io::ErrorKind::IsADirectory => SearchError::IsADirectory(p),
            _ => SearchError::Io(p, e.to_string()),
        }
    }
}
