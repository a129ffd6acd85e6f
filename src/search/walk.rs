//! The one directory walk that `grep` and `fuzzy` share, built on ripgrep's `ignore` crate so
//! that "which files count" means the same thing for both, and the same as `rg --files`.
//!
//! Two forms with the same rules: [`walk_files`] over a local path (the local commands), and
//! [`walk_source`] over a [`TreeSource`] — the in-memory sandbox, or the agent's workspace seen
//! through [`super::beneath::Beneath`], where every directory and file is opened beneath the
//! root's descriptor so that a directory swapped for a symlink mid-walk cannot lead outside.

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
    /// ripgrep `-t TYPE`: only files of these types (ripgrep's default type definitions).
    pub types: Vec<String>,
    /// ripgrep `-T TYPE`: no files of these types.
    pub types_not: Vec<String>,
    /// ripgrep `-L`: follow symbolic links while walking.
    pub follow: bool,
}

/// The file types `-t`/`-T` select from: ripgrep's default definitions.
pub fn file_types(opts: &WalkOptions) -> Result<ignore::types::Types, SearchError> {
    let mut b = ignore::types::TypesBuilder::new();
    b.add_defaults();
    for t in &opts.types {
        b.select(t);
    }
    for t in &opts.types_not {
        b.negate(t);
    }
    b.build()
        .map_err(|e| SearchError::InvalidArgs(e.to_string()))
}

/// `rg --type-list`: each type and its globs, one a line, sorted by name.
pub fn type_list() -> String {
    let mut b = ignore::types::TypesBuilder::new();
    b.add_defaults();
    let mut out = String::new();
    for def in b.definitions() {
        out.push_str(&format!("{}: {}\n", def.name(), def.globs().join(", ")));
    }
    out
}

/// A file the walk found: its absolute path and its path relative to the searched root
/// (`/`-separated; for a root that is itself a file, its file name).
#[derive(Debug, Clone)]
pub struct WalkedFile {
    pub path: PathBuf,
    pub relative: String,
    /// The same path's exact bytes (a name need not be UTF-8).
    pub relative_bytes: Vec<u8>,
    /// The root itself was this file (named on the command line, as ripgrep says "explicit").
    pub explicit: bool,
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
            relative_bytes: relative.clone().into_bytes(),
            relative,
            explicit: true,
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
        .types(file_types(opts)?)
        .follow_links(opts.follow)
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
        let relative_bytes = {
            use std::os::unix::ffi::OsStrExt;
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
            rel.as_os_str().as_bytes().to_vec()
        };
        if !visit(WalkedFile {
            path: entry.into_path(),
            relative,
            relative_bytes,
            explicit: false,
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

/// What a [`TreeSource`] entry is. Symlinks are never followed by the walk (as `rg` without
/// `--follow`), so they are `Symlink`, not what they point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One name in a [`TreeSource`] directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    pub name: Vec<u8>,
    pub kind: SourceKind,
    pub size: u64,
}

/// A tree that is not a local directory (the in-memory sandbox), for the queries to walk.
/// Paths are `/`-separated bytes relative to the tree's top; the empty path is the top.
pub trait TreeSource {
    /// What `path` is, without following a final symlink (`None`: nothing there).
    fn kind(&self, path: &[u8]) -> Option<SourceKind>;
    /// A directory's entries, sorted by name (empty for anything else); symlinks on the way
    /// to it are followed, as `readdir` of a path follows them.
    fn entries(&self, dir: &[u8]) -> Vec<SourceEntry>;
    /// A regular file's bytes.
    fn content(&self, path: &[u8]) -> Option<Vec<u8>>;
    /// Where `path` leads with every symlink followed, if it stays inside the tree.
    fn resolve(&self, path: &[u8]) -> Option<Vec<u8>>;
}

/// A file a [`walk_source`] found: its path in the source and relative to the searched root.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: Vec<u8>,
    pub relative: String,
    /// The same path's exact bytes.
    pub relative_bytes: Vec<u8>,
    /// The root itself was this file.
    pub explicit: bool,
}

fn join_bytes(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

/// The ignore rules of one directory of a source, highest precedence first (`.rgignore`,
/// `.ignore`, `.gitignore`, as ripgrep orders them; `.git/info/exclude` at the top).
fn source_ignores(
    source: &dyn TreeSource,
    dir: &[u8],
    top: bool,
) -> Vec<ignore::gitignore::Gitignore> {
    use std::os::unix::ffi::OsStrExt;
    let base = std::path::Path::new("/").join(std::ffi::OsStr::from_bytes(dir));
    let mut names: Vec<&[u8]> = vec![b".rgignore", b".ignore", b".gitignore"];
    if top {
        names.push(b".git/info/exclude");
    }
    let mut out = Vec::new();
    for name in names {
        let Some(bytes) = source.content(&join_bytes(dir, name)) else {
            continue;
        };
        let mut b = ignore::gitignore::GitignoreBuilder::new(&base);
        for line in String::from_utf8_lossy(&bytes).lines() {
            // A bad line is skipped, as ripgrep skips it (with a warning).
            let _ = b.add_line(None, line);
        }
        if let Ok(gi) = b.build() {
            out.push(gi);
        }
    }
    out
}

/// [`walk_files`] over a [`TreeSource`]: the same rules (hidden files, the ignore files of the
/// searched directory, of the directories below it and of those above it in the source,
/// `--glob` overrides, `max_filesize`), the same order (sorted by name within each directory,
/// depth first), the same results for the same tree, without a local directory. The global
/// git excludes file is not read: a source has no home directory.
pub fn walk_source(
    source: &dyn TreeSource,
    root: &[u8],
    opts: &WalkOptions,
    mut visit: impl FnMut(SourceFile) -> bool,
) -> Result<(), SearchError> {
    use std::os::unix::ffi::OsStrExt;
    let shown = String::from_utf8_lossy(root).into_owned();
    match source.kind(root) {
        None => return Err(SearchError::NotFound(shown)),
        Some(SourceKind::Dir) => {}
        Some(_) => {
            let name = root.rsplit(|&b| b == b'/').next().unwrap_or(root);
            visit(SourceFile {
                path: root.to_vec(),
                relative: String::from_utf8_lossy(name).into_owned(),
                relative_bytes: name.to_vec(),
                explicit: true,
            });
            return Ok(());
        }
    }
    let vpath = |p: &[u8]| std::path::Path::new("/").join(std::ffi::OsStr::from_bytes(p));
    let mut overrides = OverrideBuilder::new(vpath(root));
    for g in &opts.globs {
        overrides
            .add(g)
            .map_err(|e| SearchError::InvalidArgs(format!("glob {g:?}: {e}")))?;
    }
    let overrides = overrides
        .build()
        .map_err(|e| SearchError::InvalidArgs(e.to_string()))?;
    let types = file_types(opts)?;
    let respect = !opts.no_ignore;
    // The rules in force, outermost first: those of the directories above the root, then one
    // level per directory walked.
    let mut parents: Vec<Vec<ignore::gitignore::Gitignore>> = Vec::new();
    if respect && !root.is_empty() {
        let mut at: Vec<u8> = Vec::new();
        parents.push(source_ignores(source, &at, true));
        for part in root.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            at = join_bytes(&at, part);
            if at.as_slice() != root {
                parents.push(source_ignores(source, &at, false));
            }
        }
    }
    let ignored = |levels: &[Vec<ignore::gitignore::Gitignore>], path: &[u8], is_dir: bool| {
        let vp = vpath(path);
        match overrides.matched(&vp, is_dir) {
            ignore::Match::Ignore(_) => return true,
            ignore::Match::Whitelist(_) => return false,
            ignore::Match::None => {}
        }
        let mut whitelisted = false;
        'levels: for level in levels.iter().rev() {
            for gi in level {
                match gi.matched(&vp, is_dir) {
                    ignore::Match::Ignore(_) => return true,
                    ignore::Match::Whitelist(_) => {
                        whitelisted = true;
                        break 'levels;
                    }
                    ignore::Match::None => {}
                }
            }
        }
        // As the `ignore` crate: a type selection decides after the ignore files, and a file it
        // selects is no longer hidden.
        match types.matched(&vp, is_dir) {
            ignore::Match::Ignore(_) => return true,
            ignore::Match::Whitelist(_) => whitelisted = true,
            ignore::Match::None => {}
        }
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        !whitelisted && !opts.hidden && name.first() == Some(&b'.')
    };
    let mut seen = Vec::new();
    walk_source_dir(
        source,
        root,
        root,
        opts,
        &mut parents,
        &ignored,
        &mut visit,
        &mut seen,
    );
    Ok(())
}

type Levels = Vec<Vec<ignore::gitignore::Gitignore>>;

/// Walk one directory; `false` once the visitor said stop.
/// Whether a path is ignored, given the ignore files of every level above it.
type IgnoredFn<'a> = dyn Fn(&[Vec<ignore::gitignore::Gitignore>], &[u8], bool) -> bool + 'a;

#[allow(clippy::too_many_arguments)]
fn walk_source_dir(
    source: &dyn TreeSource,
    root: &[u8],
    dir: &[u8],
    opts: &WalkOptions,
    levels: &mut Levels,
    ignored: &IgnoredFn<'_>,
    visit: &mut dyn FnMut(SourceFile) -> bool,
    // With `follow`: the directories being walked, resolved, so a link loop ends.
    seen: &mut Vec<Vec<u8>>,
) -> bool {
    if opts.follow {
        let Some(real) = source.resolve(dir) else {
            return true;
        };
        if seen.contains(&real) {
            return true;
        }
        seen.push(real);
    }
    if !opts.no_ignore {
        levels.push(source_ignores(source, dir, dir.is_empty()));
    }
    let mut go_on = true;
    for mut e in source.entries(dir) {
        let path = join_bytes(dir, &e.name);
        if opts.follow && e.kind == SourceKind::Symlink {
            // Followed, the link is what it leads to (a dangling or escaping one is skipped).
            match source.resolve(&path) {
                Some(target) => {
                    e.kind = source.kind(&target).unwrap_or(SourceKind::Other);
                    if e.kind == SourceKind::File {
                        e.size = source.content(&target).map_or(0, |c| c.len() as u64);
                    }
                }
                None => continue,
            }
        }
        match e.kind {
            SourceKind::Dir => {
                if !ignored(levels, &path, true)
                    && !walk_source_dir(source, root, &path, opts, levels, ignored, visit, seen)
                {
                    go_on = false;
                    break;
                }
            }
            SourceKind::File => {
                if ignored(levels, &path, false) || opts.max_filesize.is_some_and(|m| e.size > m) {
                    continue;
                }
                let rel = &path[root.len() + usize::from(!root.is_empty())..];
                let relative = String::from_utf8_lossy(rel).into_owned();
                if !visit(SourceFile {
                    relative_bytes: rel.to_vec(),
                    path,
                    relative,
                    explicit: false,
                }) {
                    go_on = false;
                    break;
                }
            }
            SourceKind::Symlink | SourceKind::Other => {}
        }
    }
    if !opts.no_ignore {
        levels.pop();
    }
    if opts.follow {
        seen.pop();
    }
    go_on
}
