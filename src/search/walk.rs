//! The one directory walk that `grep` and `fuzzy` share, built on ripgrep's `ignore` crate so
//! that "which files count" means the same thing for both, and the same as `rg --files`.

use std::path::{Path, PathBuf};

use ignore::overrides::OverrideBuilder;
use ignore::WalkBuilder;

use super::SearchError;

/// Which files a walk yields. Defaults follow ripgrep: ignore files respected, hidden and
/// (for grep) binary files skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct WalkOptions {
    /// Include hidden files and directories (names starting with `.`).
    pub hidden: bool,
    /// Do not read `.gitignore`, `.ignore`, `.rgignore`, `.git/info/exclude` or the global
    /// git excludes.
    pub no_ignore: bool,
    /// ripgrep `--glob` rules: `G` includes only matching files, `!G` excludes them.
    pub globs: Vec<String>,
    /// Skip files larger than this many bytes.
    pub max_filesize: Option<u64>,
}

/// A file the walk found: its absolute path and its path relative to the searched root
/// (`/`-separated; for a root that is itself a file, its file name).
#[derive(Debug, Clone)]
pub struct WalkedFile {
    pub path: PathBuf,
    pub relative: String,
}

/// Walk `root` in a deterministic order (sorted by name within each directory, like
/// `rg --sort path`), calling `visit` for each regular file until it returns `false`.
/// Unreadable entries are reported through `on_error` and skipped.
pub fn walk_files(
    root: &Path,
    opts: &WalkOptions,
    mut visit: impl FnMut(WalkedFile) -> bool,
    mut on_error: impl FnMut(String),
) -> Result<(), SearchError> {
    let meta = std::fs::metadata(root).map_err(|e| SearchError::from_io(root, e))?;
    if meta.is_file() {
        let relative = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        visit(WalkedFile {
            path: root.to_path_buf(),
            relative,
        });
        return Ok(());
    }
    let mut overrides = OverrideBuilder::new(root);
    for g in &opts.globs {
        overrides
            .add(g)
            .map_err(|e| SearchError::InvalidArgs(format!("glob {g:?}: {e}")))?;
    }
    let overrides = overrides
        .build()
        .map_err(|e| SearchError::InvalidArgs(e.to_string()))?;
    let respect = !opts.no_ignore;
    let walker = WalkBuilder::new(root)
        .hidden(!opts.hidden)
        .ignore(respect)
        .git_ignore(respect)
        .git_global(respect)
        .git_exclude(respect)
        .parents(respect)
        // A sandbox workspace may carry a .gitignore without its .git: respect it anyway.
        .require_git(false)
        .add_custom_ignore_filename(".rgignore")
        .overrides(overrides)
        .max_filesize(opts.max_filesize)
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    for entry in walker {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                on_error(e.to_string());
                continue;
            }
        };
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let relative = relative_path(root, entry.path());
        if !visit(WalkedFile {
            path: entry.into_path(),
            relative,
        }) {
            break;
        }
    }
    Ok(())
}

fn relative_path(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut out = String::new();
    for (i, part) in rel.components().enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(&part.as_os_str().to_string_lossy());
    }
    out
}
