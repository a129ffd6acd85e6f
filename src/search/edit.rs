//! `edit`: replace a string in a file, atomically.
//!
//! Rules (pinned by `tests/vectors/edit.json`; `scripts/edit.py` implements the same):
//! - `old` must be non-empty; `new` may be empty (a deletion);
//! - CRLF and lone CR are normalised to LF in the file, in `old` and in `new`, and the file is
//!   written back with LF;
//! - occurrences are counted without overlap, left to right: none is `string_not_found`; more
//!   than one without `replace_all` is `multiple_occurrences` with the count;
//! - the file must be valid UTF-8 (else `read_failed`, file untouched);
//! - the write goes through [`crate::atomic`]: any failure leaves the target byte-for-byte
//!   unchanged.

use std::fs;
use std::io;
use std::path::Path;

use super::SearchError;
use crate::atomic;

/// Largest file `edit` rewrites: the whole file is held in memory to replace in it.
pub const MAX_EDIT_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Normalise line endings: CRLF and lone CR become LF.
pub fn normalize_newlines(s: &str) -> String {
    if !s.contains('\r') {
        return s.to_string();
    }
    s.replace("\r\n", "\n").replace('\r', "\n")
}

/// Apply the replacement to `content`; returns the new content and the number of replacements.
///
/// ```
/// use sbxfs::search::edit::replace_in;
/// let (text, n) = replace_in("a\r\nb a", "a", "x", true).unwrap();
/// assert_eq!((text.as_str(), n), ("x\nb x", 2));
/// ```
pub fn replace_in(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), SearchError> {
    if old.is_empty() {
        return Err(SearchError::InvalidArgs(
            "the string to replace is empty".into(),
        ));
    }
    let content = normalize_newlines(content);
    let old = normalize_newlines(old);
    let new = normalize_newlines(new);
    let count = content.matches(old.as_str()).count();
    // The answer is bounded like the input: a short `old` replaced everywhere by a long `new`
    // would otherwise grow a small file a million-fold in the agent's memory.
    let grown = (content.len() as u64)
        .saturating_sub(count as u64 * old.len() as u64)
        .saturating_add((count as u64).saturating_mul(new.len() as u64));
    if (count > 0 && (replace_all || count == 1)) && grown > MAX_EDIT_FILE_BYTES {
        return Err(SearchError::LimitExceeded(format!(
            "the edited file would be {grown} bytes, more than {MAX_EDIT_FILE_BYTES}: split the edit"
        )));
    }
    match count {
        0 => Err(SearchError::StringNotFound),
        n if n > 1 && !replace_all => Err(SearchError::MultipleOccurrences(n)),
        n if replace_all => Ok((content.replace(old.as_str(), &new), n)),
        _ => Ok((content.replacen(old.as_str(), &new, 1), 1)),
    }
}

/// Replace `old` with `new` in the file at `path` (a symlink is followed; the link stays).
pub fn edit_file(
    path: &Path,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<usize, SearchError> {
    if old.is_empty() {
        return Err(SearchError::InvalidArgs(
            "the string to replace is empty".into(),
        ));
    }
    let shown = path.display().to_string();
    let target = atomic::resolve_target(path).map_err(|e| SearchError::from_io(path, e))?;
    let read_failed = |e: io::Error| SearchError::ReadFailed(shown.clone(), e.to_string());
    let meta = fs::metadata(&target).map_err(read_failed)?;
    if !meta.is_file() {
        return Err(SearchError::ReadFailed(shown, "not a regular file".into()));
    }
    if meta.len() > MAX_EDIT_FILE_BYTES {
        return Err(SearchError::ReadFailed(
            shown,
            format!("larger than {MAX_EDIT_FILE_BYTES} bytes"),
        ));
    }
    let bytes = fs::read(&target).map_err(read_failed)?;
    let content = String::from_utf8(bytes)
        .map_err(|_| SearchError::ReadFailed(shown.clone(), "not valid UTF-8".into()))?;
    let (updated, count) = replace_in(&content, old, new, replace_all)?;
    atomic::replace_bytes(&target, updated.as_bytes())
        .map_err(|e| SearchError::WriteFailed(shown, e.to_string()))?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_edit_that_would_grow_the_file_past_the_limit_is_refused() {
        let content = "a".repeat(2000);
        let new = "B".repeat(512 * 1024);
        let err = super::replace_in(&content, "a", &new, true).unwrap_err();
        assert!(err.to_string().contains("split the edit"), "{err}");
        // Under the limit it is done.
        let (out, n) = super::replace_in(&content, "a", "BB", true).unwrap();
        assert_eq!((out.len(), n), (4000, 2000));
    }
}
