//! `edit` through exec: `scripts/edit.py` in the sandbox, or download → replace → atomic
//! upload where it cannot run (being written).

use super::Runner;
use crate::remote::{RemoteError, Result};

/// Replace `old` by `new` (once, or everywhere) in the file at the absolute path `abs_path`
/// in the sandbox; answers the replacements made.
pub async fn edit(
    _runner: &dyn Runner,
    abs_path: &[u8],
    _old: &str,
    _new: &str,
    _replace_all: bool,
) -> Result<usize> {
    Err(RemoteError::Unsupported(format!(
        "{}: edit through exec is being written",
        String::from_utf8_lossy(abs_path)
    )))
}
