//! `glob`: files and directories by name pattern, Node's `fs.globSync` for a documented subset.
//!
//! Supported: `*`, `?`, `**` (alone in a segment), bracket classes (`[abc]`, `[a-z]`, `[!a]`,
//! `[^a]`), nested `{a,b}` brace expansion, `\` escapes, `.` and empty segments (dropped), a
//! trailing `/` (directories only). As in Node: wildcards do not match names starting with `.`
//! unless the segment itself starts with `.`; `**` does not descend into hidden or symlinked
//! directories; matching is case-sensitive; directories are results too.
//!
//! Refused with [`SearchError::Unsupported`]: extended globs (`+(a|b)` …), POSIX classes
//! (`[[:alpha:]]`), ranges `{1..3}`, `..` segments and absolute patterns.
//! Bounded: at most [`MAX_ALTERNATIVES`] brace alternatives and [`MAX_EXPANDED_UNITS`] UTF-16
//! code units of expanded patterns per call, so a short pattern cannot allocate without bound.
//!
//! Where sbxfs differs from Node on purpose (each pinned by a vector marked `node_differs`):
//! - the directory searched is never a result (Node gives `.` for `**`);
//! - results are sorted by bytes and deduplicated;
//! - a wildcard never enters a symlinked directory: only a literal segment follows a link
//!   (Node's `**/*` lists one level inside symlinked directories), and a link that resolves
//!   outside the searched directory is never followed;
//! - `\` escapes the next character (Node on Linux treats it as a path separator);
//! - `?` matches one character, not one UTF-16 code unit.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use regex::bytes::Regex;

use super::walk::{SourceKind, TreeSource};
use super::SearchError;
use std::os::unix::ffi::OsStrExt;

/// Most alternatives one pattern may expand to.
pub const MAX_ALTERNATIVES: usize = 1024;
/// Most UTF-16 code units (as Node counts string length) all expanded patterns may total.
pub const MAX_EXPANDED_UNITS: usize = 65_536;
/// Deepest nesting of braces: expansion recurses once per level, so this bounds the stack a
/// pattern can use (5,000 nested braces overflowed it); real patterns nest two or three deep.
pub const MAX_BRACE_DEPTH: usize = 64;
/// Deepest directory a pattern's walk descends (it recurses once per level): far below what
/// a worker thread's stack allows, far above real trees.
pub const MAX_WALK_DEPTH: usize = 1024;

/// Glob `pattern` under `root`; paths relative to `root`, `/`-separated, sorted.
pub fn glob(root: &Path, pattern: &str) -> Result<Vec<String>, SearchError> {
    let patterns = compile(pattern)?;
    let real_root = fs::canonicalize(root).map_err(|e| SearchError::from_io(root, e))?;
    if !real_root.is_dir() {
        return Err(SearchError::InvalidArgs(format!(
            "{}: not a directory",
            root.display()
        )));
    }
    let mut found = BTreeSet::new();
    let fs = LocalFs { root: &real_root };
    for p in &patterns {
        let mut walker = Walker {
            fs: &fs,
            pattern: p,
            found: &mut found,
            depth: 0,
            too_deep: false,
        };
        walker.walk_at(&real_root, "", 0);
        if walker.too_deep {
            return Err(SearchError::LimitExceeded(format!(
                "directories nested more than {MAX_WALK_DEPTH} deep"
            )));
        }
    }
    Ok(found.into_iter().collect())
}

/// [`glob`] over a [`TreeSource`] (the in-memory sandbox): `root` is the searched directory's
/// path in the source; the same patterns, rules and results as over a local directory.
pub fn glob_source(
    source: &dyn TreeSource,
    root: &[u8],
    pattern: &str,
) -> Result<Vec<String>, SearchError> {
    let patterns = compile(pattern)?;
    let shown = String::from_utf8_lossy(root).into_owned();
    let real_root = source
        .resolve(root)
        .ok_or_else(|| SearchError::NotFound(shown.clone()))?;
    if source.kind(&real_root) != Some(SourceKind::Dir) {
        return Err(SearchError::InvalidArgs(format!(
            "{shown}: not a directory"
        )));
    }
    let fs = SourceFs {
        source,
        root: &real_root,
    };
    let top = fs.path(&real_root);
    let mut found = BTreeSet::new();
    for p in &patterns {
        let mut walker = Walker {
            fs: &fs,
            pattern: p,
            found: &mut found,
            depth: 0,
            too_deep: false,
        };
        walker.walk_at(&top, "", 0);
        if walker.too_deep {
            return Err(SearchError::LimitExceeded(format!(
                "directories nested more than {MAX_WALK_DEPTH} deep"
            )));
        }
    }
    Ok(found.into_iter().collect())
}

/// What the glob walk asks of the tree it walks.
trait GlobFs {
    /// A directory's entries sorted by name: name, path, and whether it is a real directory.
    fn read_dir_sorted(&self, dir: &Path) -> Vec<(String, PathBuf, Kind)>;
    /// Is anything there (a dangling symlink is)?
    fn exists(&self, path: &Path) -> bool;
    /// Is it a real directory (not a symlink to one)?
    fn is_real_dir(&self, path: &Path) -> bool;
    /// A directory we may enter through a literal segment: a real directory, or a symlink to
    /// one that resolves inside the root.
    fn is_dir_within_root(&self, path: &Path) -> bool;
}

struct LocalFs<'a> {
    root: &'a Path,
}

impl GlobFs for LocalFs<'_> {
    fn read_dir_sorted(&self, dir: &Path) -> Vec<(String, PathBuf, Kind)> {
        read_dir_sorted(dir)
    }

    fn exists(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok()
    }

    fn is_real_dir(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
    }

    fn is_dir_within_root(&self, path: &Path) -> bool {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => true,
            Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path)
                .is_ok_and(|real| real.starts_with(self.root) && real.is_dir()),
            _ => false,
        }
    }
}

/// A [`TreeSource`] seen as paths: `/` + the source path.
struct SourceFs<'a> {
    source: &'a dyn TreeSource,
    root: &'a [u8],
}

impl SourceFs<'_> {
    fn path(&self, p: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        Path::new("/").join(std::ffi::OsStr::from_bytes(p))
    }

    fn bytes<'p>(&self, p: &'p Path) -> &'p [u8] {
        use std::os::unix::ffi::OsStrExt;
        let b = p.as_os_str().as_bytes();
        b.strip_prefix(b"/").unwrap_or(b)
    }
}

impl GlobFs for SourceFs<'_> {
    fn read_dir_sorted(&self, dir: &Path) -> Vec<(String, PathBuf, Kind)> {
        let d = self.bytes(dir);
        self.source
            .entries(d)
            .into_iter()
            .map(|e| {
                let path = dir.join(std::ffi::OsStr::from_bytes(&e.name));
                let kind = if e.kind == SourceKind::Dir {
                    Kind::Dir
                } else {
                    Kind::Other
                };
                (String::from_utf8_lossy(&e.name).into_owned(), path, kind)
            })
            .collect()
    }

    fn exists(&self, path: &Path) -> bool {
        self.source.kind(self.bytes(path)).is_some()
    }

    fn is_real_dir(&self, path: &Path) -> bool {
        self.source.kind(self.bytes(path)) == Some(SourceKind::Dir)
    }

    fn is_dir_within_root(&self, path: &Path) -> bool {
        let p = self.bytes(path);
        match self.source.kind(p) {
            Some(SourceKind::Dir) => true,
            Some(SourceKind::Symlink) => self.source.resolve(p).is_some_and(|real| {
                within(&real, self.root) && self.source.kind(&real) == Some(SourceKind::Dir)
            }),
            _ => false,
        }
    }
}

/// Is `path` `root` or below it (whole components)?
fn within(path: &[u8], root: &[u8]) -> bool {
    root.is_empty()
        || path == root
        || (path.starts_with(root) && path.get(root.len()) == Some(&b'/'))
}

/// One expanded pattern, split into segments.
#[derive(Debug)]
struct Pattern {
    segments: Vec<Segment>,
    dir_only: bool,
}

#[derive(Debug)]
enum Segment {
    Literal(String),
    Wild { regex: Regex, dot: bool },
    Globstar,
}

fn compile(pattern: &str) -> Result<Vec<Pattern>, SearchError> {
    check_supported(pattern)?;
    let expanded = expand_braces(pattern)?;
    let mut out = Vec::with_capacity(expanded.len());
    for p in expanded {
        if p.is_empty() {
            continue;
        }
        let dir_only = p.ends_with('/');
        let mut segments = Vec::new();
        for seg in p.split('/') {
            match seg {
                "" | "." => continue,
                ".." => {
                    return Err(SearchError::Unsupported(
                        "`..` segments reach outside the searched directory".into(),
                    ))
                }
                "**" => {
                    if !matches!(segments.last(), Some(Segment::Globstar)) {
                        segments.push(Segment::Globstar);
                    }
                }
                _ => segments.push(compile_segment(seg)?),
            }
        }
        if !segments.is_empty() {
            out.push(Pattern { segments, dir_only });
        }
    }
    Ok(out)
}

fn check_supported(pattern: &str) -> Result<(), SearchError> {
    if pattern.starts_with('/') {
        return Err(SearchError::Unsupported(
            "absolute patterns: patterns are relative to the searched directory".into(),
        ));
    }
    let b = pattern.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'+' | b'@' | b'!' | b'?' | b'*' if b.get(i + 1) == Some(&b'(') => {
                return Err(SearchError::Unsupported(format!(
                    "extended glob `{}(` is not supported",
                    b[i] as char
                )))
            }
            b'[' if b.get(i + 1) == Some(&b'[') && b.get(i + 2) == Some(&b':')
                || b[i] == b'[' && class_has_posix(&b[i..]) =>
            {
                return Err(SearchError::Unsupported(
                    "POSIX character classes like [[:alpha:]] are not supported".into(),
                ))
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Does the bracket class starting at `b[0] == '['` contain `[:`?
fn class_has_posix(b: &[u8]) -> bool {
    let mut i = 1;
    if matches!(b.get(i), Some(b'!' | b'^')) {
        i += 1;
    }
    if b.get(i) == Some(&b']') {
        i += 1;
    }
    while i < b.len() && b[i] != b']' {
        if b[i] == b'[' && b.get(i + 1) == Some(&b':') {
            return true;
        }
        i += 1;
    }
    false
}

/// Expand `{a,b}` alternatives, nested, left to right like the `brace-expansion` package.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>, SearchError> {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let b = pattern.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    if deepest > MAX_BRACE_DEPTH {
        return Err(SearchError::LimitExceeded(format!(
            "braces nested {deepest} deep; at most {MAX_BRACE_DEPTH} are allowed"
        )));
    }
    expand(pattern)
}

/// Add one alternative to a level's output, enforcing both caps. Every string of a level ends up
/// inside some final pattern, so checking each level bounds the work without overcounting.
fn push_capped(out: &mut Vec<String>, units: &mut usize, s: String) -> Result<(), SearchError> {
    *units += s.encode_utf16().count();
    if out.len() >= MAX_ALTERNATIVES {
        return Err(SearchError::LimitExceeded(format!(
            "brace expansion gives more than {MAX_ALTERNATIVES} alternatives"
        )));
    }
    if *units > MAX_EXPANDED_UNITS {
        return Err(SearchError::LimitExceeded(format!(
            "brace expansion gives more than {MAX_EXPANDED_UNITS} characters of patterns"
        )));
    }
    out.push(s);
    Ok(())
}

fn expand(s: &str) -> Result<Vec<String>, SearchError> {
    let Some((open, close)) = first_brace_pair(s) else {
        return Ok(vec![s.to_string()]);
    };
    let pre = &s[..open];
    let body = &s[open + 1..close];
    let post = &s[close + 1..];
    let parts = split_top_level_commas(body);
    let posts = expand(post)?;
    let mut out = Vec::new();
    let mut units = 0usize;
    if parts.len() == 1 {
        if is_sequence(body) {
            return Err(SearchError::Unsupported(format!(
                "ranges like {{{body}}} are not supported"
            )));
        }
        // `{a}` is literal, but braces inside it may still expand.
        for inner in expand(body)? {
            for p in &posts {
                push_capped(&mut out, &mut units, format!("{pre}{{{inner}}}{p}"))?;
            }
        }
        return Ok(out);
    }
    for part in parts {
        for alt in expand(part)? {
            for p in &posts {
                push_capped(&mut out, &mut units, format!("{pre}{alt}{p}"))?;
            }
        }
    }
    Ok(out)
}

/// The first `{` with a balanced `}` after it (escapes honoured).
fn first_brace_pair(s: &str) -> Option<(usize, usize)> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => {
                let mut depth = 0;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'\\' => j += 1,
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some((i, j));
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                return None;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn split_top_level_commas(body: &str) -> Vec<&str> {
    let b = body.as_bytes();
    let (mut depth, mut start, mut i) = (0, 0, 0);
    let mut parts = Vec::new();
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&body[start..]);
    parts
}

/// `x..y` or `x..y..z`: the sequences brace expansion would turn into ranges.
fn is_sequence(body: &str) -> bool {
    let parts: Vec<&str> = body.split("..").collect();
    (parts.len() == 2 || parts.len() == 3) && parts.iter().all(|p| !p.is_empty() && p.len() <= 20)
}

fn compile_segment(seg: &str) -> Result<Segment, SearchError> {
    let chars: Vec<char> = seg.chars().collect();
    let mut re = String::from("^");
    let mut literal = String::new();
    let mut magic = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' if i + 1 < chars.len() => {
                i += 1;
                literal.push(chars[i]);
                re.push_str(&regex::escape(&chars[i].to_string()));
            }
            '*' => {
                magic = true;
                re.push_str("(?-u:[^/])*");
            }
            '?' => {
                magic = true;
                re.push_str("[^/]");
            }
            '[' => match parse_class(&chars[i..]) {
                Some((class, used)) => {
                    magic = true;
                    re.push_str(&class);
                    i += used - 1;
                }
                None => {
                    literal.push('[');
                    re.push_str(r"\[");
                }
            },
            _ => {
                literal.push(c);
                re.push_str(&regex::escape(&c.to_string()));
            }
        }
        i += 1;
    }
    if !magic {
        return Ok(Segment::Literal(literal));
    }
    re.push('$');
    let regex = Regex::new(&re).map_err(|e| SearchError::InvalidArgs(e.to_string()))?;
    Ok(Segment::Wild {
        regex,
        dot: seg.starts_with('.'),
    })
}

/// Parse a bracket class at `chars[0] == '['`; returns the regex class and chars consumed, or
/// `None` when there is no closing `]` (then `[` is literal).
fn parse_class(chars: &[char]) -> Option<(String, usize)> {
    let mut i = 1;
    let negate = matches!(chars.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let mut items: Vec<(char, char)> = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let lo = if c == '\\' {
            i += 1;
            *chars.get(i)?
        } else {
            c
        };
        i += 1;
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&n| n != ']') {
            let mut hi = chars[i + 1];
            i += 2;
            if hi == '\\' {
                hi = *chars.get(i)?;
                i += 1;
            }
            items.push((lo, hi));
        } else {
            items.push((lo, lo));
        }
    }
    // A reversed range like [z-a] matches nothing, as in Node.
    items.retain(|(lo, hi)| lo <= hi);
    let mut class = String::new();
    for (lo, hi) in &items {
        class.push_str(&regex::escape(&lo.to_string()));
        if lo != hi {
            class.push('-');
            class.push_str(&regex::escape(&hi.to_string()));
        }
    }
    let re = match (negate, class.is_empty()) {
        (false, true) => "[^\\x00-\\x{10FFFF}]".to_string(),
        (true, true) => "[^/]".to_string(),
        (false, false) => format!("[{class}]"),
        (true, false) => format!("[^/{class}]"),
    };
    Some((re, i))
}

struct Walker<'a> {
    fs: &'a dyn GlobFs,
    pattern: &'a Pattern,
    found: &'a mut BTreeSet<String>,
    /// Directories entered below the root, now.
    depth: usize,
    /// Set when the walk met a tree deeper than [`MAX_WALK_DEPTH`] (then it stops).
    too_deep: bool,
}

impl Walker<'_> {
    /// Match `segments[idx..]` inside `dir`, whose path relative to the root is `rel`.
    fn walk_at(&mut self, dir: &Path, rel: &str, idx: usize) {
        if self.depth > MAX_WALK_DEPTH || self.too_deep {
            self.too_deep = true;
            return;
        }
        self.depth += 1;
        self.walk_segment(dir, rel, idx);
        self.depth -= 1;
    }

    fn walk_segment(&mut self, dir: &Path, rel: &str, idx: usize) {
        let segments = &self.pattern.segments;
        if idx == segments.len() {
            self.record(dir, rel);
            return;
        }
        let last = idx + 1 == segments.len();
        match &segments[idx] {
            Segment::Literal(name) => {
                let path = dir.join(name);
                let child = join_rel(rel, name);
                if last {
                    if self.fs.exists(&path) {
                        self.record(&path, &child);
                    }
                } else if self.fs.is_dir_within_root(&path) {
                    self.walk_at(&path, &child, idx + 1);
                }
            }
            Segment::Wild { regex, dot } => {
                for (name, path, kind) in self.fs.read_dir_sorted(dir) {
                    if (name.starts_with('.') && !dot) || !regex.is_match(name.as_bytes()) {
                        continue;
                    }
                    let child = join_rel(rel, &name);
                    if last {
                        self.record(&path, &child);
                    } else if kind == Kind::Dir {
                        self.walk_at(&path, &child, idx + 1);
                    }
                }
            }
            Segment::Globstar => {
                // Zero segments.
                self.walk_at(dir, rel, idx + 1);
                for (name, path, kind) in self.fs.read_dir_sorted(dir) {
                    if name.starts_with('.') {
                        continue;
                    }
                    let child = join_rel(rel, &name);
                    if kind == Kind::Dir {
                        self.walk_at(&path, &child, idx);
                    } else if last {
                        self.record(&path, &child);
                    }
                }
            }
        }
    }

    fn record(&mut self, path: &Path, rel: &str) {
        if rel.is_empty() {
            return; // the searched directory itself is never a result
        }
        if self.pattern.dir_only && !self.fs.is_real_dir(path) {
            return;
        }
        self.found.insert(rel.to_string());
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    /// A real directory (not a symlink to one).
    Dir,
    Other,
}

fn read_dir_sorted(dir: &Path) -> Vec<(String, PathBuf, Kind)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut entries: Vec<(String, PathBuf, Kind)> = rd
        .filter_map(Result::ok)
        .map(|e| {
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => Kind::Dir,
                _ => Kind::Other,
            };
            (e.file_name().to_string_lossy().into_owned(), e.path(), kind)
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

fn join_rel(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_nested_and_keep_single_items_literal() {
        assert_eq!(
            expand_braces("x{a,{b,c}}y").unwrap(),
            vec!["xay", "xby", "xcy"]
        );
        assert_eq!(expand_braces("{a}.rs").unwrap(), vec!["{a}.rs"]);
        assert_eq!(expand_braces("{,a}.rs").unwrap(), vec![".rs", "a.rs"]);
        assert_eq!(expand_braces("{a,b").unwrap(), vec!["{a,b"]);
    }

    #[test]
    fn brace_bombs_are_refused() {
        let bomb = "{a,b}".repeat(11); // 2^11 = 2048 alternatives
        assert!(matches!(
            expand_braces(&bomb),
            Err(SearchError::LimitExceeded(_))
        ));
        assert!(matches!(
            expand_braces("{1..3}"),
            Err(SearchError::Unsupported(_))
        ));
    }

    #[test]
    fn many_stars_match_long_names_in_linear_time() {
        // A backtracking matcher takes exponential time on this pattern and name; the regex
        // engine here is a finite automaton, linear in the name whatever the pattern.
        let Segment::Wild { regex, .. } = compile_segment("*a*a*a*a*a*a*a*a*a*a*a*a*b").unwrap()
        else {
            panic!("a wildcard segment");
        };
        let name = "a".repeat(255);
        for _ in 0..10_000 {
            assert!(!regex.is_match(name.as_bytes()));
        }
        assert!(regex.is_match(format!("{name}b").as_bytes()));
    }

    #[test]
    fn deeply_nested_braces_are_refused_not_recursed() {
        let bomb = format!("{}a{}", "{".repeat(5000), "}".repeat(5000));
        let err = expand_braces(&bomb).unwrap_err();
        assert!(matches!(err, SearchError::LimitExceeded(_)), "{err:?}");
        assert!(err.to_string().contains("nested"), "{err}");
        let ok = format!(
            "{}a,b{}",
            "{".repeat(MAX_BRACE_DEPTH),
            "}".repeat(MAX_BRACE_DEPTH)
        );
        assert!(expand_braces(&ok).is_ok());
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_pattern_compiles_or_is_refused(pattern in "[{},*?\\[\\]!^a-c/.\\\\:+()|-]{0,120}") {
            let _ = compile(&pattern);
        }

        #[test]
        fn any_text_as_a_pattern_compiles_or_is_refused(pattern in ".{0,200}") {
            let _ = compile(&pattern);
        }

        #[test]
        fn nested_braces_of_any_depth_are_bounded(depth in 0usize..20_000, inner in "[a-c,]{0,4}") {
            let p = format!("{}{inner}{}", "{".repeat(depth), "}".repeat(depth));
            match compile(&p) {
                Ok(_) => prop_assert!(depth <= MAX_BRACE_DEPTH),
                Err(e) => prop_assert!(
                    matches!(e, SearchError::LimitExceeded(_) | SearchError::Unsupported(_)),
                    "{e:?}"
                ),
            }
            // Unbalanced, too.
            let _ = compile(&"{".repeat(depth));
            let _ = compile(&"}".repeat(depth));
        }

        #[test]
        fn matching_any_pattern_in_a_small_tree_never_panics(pattern in "[{},*?a-c/.\\[\\]!]{1,40}") {
            let dir = tempfile::tempdir().unwrap();
            for p in ["a/b/c", "a/.h", "b/cc", "ab"] {
                let f = dir.path().join(p);
                std::fs::create_dir_all(f.parent().unwrap()).unwrap();
                std::fs::write(f, "").unwrap();
            }
            let _ = glob(dir.path(), &pattern);
        }
    }
}
