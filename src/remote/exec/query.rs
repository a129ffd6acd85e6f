//! Queries over exec: scan runs in the sandbox (`scripts/scan.sh`, only the window crosses);
//! grep runs in the sandbox too where ripgrep is there and the options have an exact rg form
//! ([`grep_in_sandbox`], [`super::rgjson`]: only the file list and the matching lines
//! cross). Otherwise grep, and glob and fuzzy always, run here, over a snapshot of the
//! searched subtree that the scripts list into a [`Snapshot`], so the matching rules are
//! exactly the agent's (the same pure functions, [`crate::remote::source_query`]). glob and fuzzy need only the paths and the
//! ignore files; grep needs the files' bytes too, so they cross (capped at
//! [`MAX_SNAPSHOT_BYTES`]): all of them, or for a pattern that needs a literal only those
//! that `grep -F` in the sandbox finds it in ([`grep_snapshot`]).

use crate::remote::*;
use crate::search::scan::ScanResult;
use crate::search::snapshot::{Snapshot, SnapshotError};
use crate::search::SearchError;

use super::program::{build, malformed, parse};
use super::remote::{Probe, ScriptRemote};
use super::rgjson::{self, Answer};
use super::{RunControl, Runner};
use crate::search::grep::GrepOptions;
use crate::search::print::PrintKind;

const GREP_RG: &str = include_str!("scripts/grep_rg.sh");

/// Most file bytes a grep without a sandbox-side tool downloads; past it the search is
/// refused rather than left to fill memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 256 * 1024 * 1024;
/// Bytes asked per read while copying a file into the snapshot.
const CHUNK: u32 = 4 * 1024 * 1024;
/// Files whose content shapes a walk (the ignore crate's).
const IGNORE_FILES: &[&[u8]] = &[b".gitignore", b".ignore", b".rgignore"];

async fn read_whole(remote: &ScriptRemote, path: &RemotePath) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    loop {
        let r = remote.read(path, data.len() as u64, CHUNK).await?;
        let n = r.data.len();
        data.extend_from_slice(&r.data);
        if n < CHUNK as usize {
            return Ok(data);
        }
    }
}

fn parent_dirs(path: &RemotePath) -> Vec<RemotePath> {
    let mut dirs = vec![RemotePath::root()];
    let mut cur = path.clone();
    let mut stack = Vec::new();
    while let Some((parent, _)) = cur.split_last() {
        stack.push(parent.clone());
        cur = parent;
    }
    dirs.extend(stack.into_iter().rev().filter(|p| !p.is_root()));
    dirs
}

fn joined(dir: &RemotePath, name: &[u8]) -> Result<RemotePath> {
    dir.join(name)
}

/// The literal every matching line of `opts` holds, byte for byte, where there is one: a
/// case-sensitive, not inverted search for a fixed string, or a pattern of letters, digits,
/// spaces and `_` only (no regex syntax). A file without it has no match.
pub fn required_literal(opts: &GrepOptions) -> Option<String> {
    let p = &opts.pattern;
    let insensitive =
        opts.case_insensitive || (opts.smart_case && !p.chars().any(char::is_uppercase));
    let plain = p
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b' ' || b == b'_');
    // max_filesize: the snapshot's stand-ins for skipped files are empty, so their sizes
    // would not be the files'.
    (!p.is_empty()
        && !p.contains('\n')
        && !insensitive
        && !opts.invert
        && opts.print.is_none()
        && opts.walk.max_filesize.is_none()
        && (opts.fixed_strings || plain))
        .then(|| p.clone())
}

/// Grep's snapshot without ripgrep in the sandbox: where the pattern needs a literal
/// ([`required_literal`]), `grep -F` in the sandbox says which files hold it, and only those
/// files' bytes cross (the others are empty stand-ins: walked and counted, never matching).
pub async fn grep_snapshot(
    remote: &ScriptRemote,
    runner: &dyn Runner,
    probe: &Probe,
    path: &RemotePath,
    opts: &GrepOptions,
) -> Result<Snapshot> {
    let pre = required_literal(opts).map(|literal| Prefilter {
        runner,
        probe,
        literal,
    });
    snapshot_with(remote, path, true, pre.as_ref()).await
}

struct Prefilter<'a> {
    runner: &'a dyn Runner,
    probe: &'a Probe,
    literal: String,
}

const CONTAIN: &str = include_str!("scripts/contain.sh");

impl Prefilter<'_> {
    /// Which of `files` hold the literal (`None`: grep failed on one, download them all).
    async fn containing(
        &self,
        files: &[&[u8]],
    ) -> Result<Option<std::collections::HashSet<Vec<u8>>>> {
        let list = files.join(&b'\n');
        let p = self.probe.precision;
        let text = build(
            &self.probe.root,
            p.attr_format(),
            p.version_format(),
            &[self.literal.as_bytes(), &list],
            &[CONTAIN],
        );
        let out = self.runner.run(&text, &RunControl::default()).await?;
        let lines = parse(&out, "grep prefilter")?;
        let found = match lines.first().and_then(|l| l.strip_prefix("C ")) {
            Some(b) => super::program::unb64(b)?,
            None => return Err(malformed("grep prefilter")),
        };
        let mut set = std::collections::HashSet::new();
        let mut names = found.split(|&b| b == 0);
        let last = names.next_back();
        if last.is_some_and(|l| !l.is_empty()) {
            return Err(malformed("grep prefilter: a name without its NUL"));
        }
        for name in names {
            if name.is_empty() {
                return Ok(None);
            }
            set.insert(name.to_vec());
        }
        Ok(Some(set))
    }
}

/// A sandbox copy of `path`'s subtree (and the ignore files above it), with file contents
/// when `contents`.
pub async fn snapshot(
    remote: &ScriptRemote,
    path: &RemotePath,
    contents: bool,
) -> Result<Snapshot> {
    snapshot_with(remote, path, contents, None).await
}

async fn snapshot_with(
    remote: &ScriptRemote,
    path: &RemotePath,
    contents: bool,
    pre: Option<&Prefilter<'_>>,
) -> Result<Snapshot> {
    // A path out of the workspace is refused before anything is listed.
    remote.resolve(path).await.map_err(|e| match e {
        RemoteError::NotFound(p) => SearchError::NotFound(p).into(),
        e => e,
    })?;
    let mut sb = Snapshot::new();
    let fail = |e: SnapshotError| RemoteError::Io(path.display(), e.to_string());
    // Ignore files of the directories above (the walk reads them as the agent's does).
    let dirs = parent_dirs(path);
    let mut probes = Vec::new();
    for d in &dirs {
        for name in IGNORE_FILES.iter().chain([&&b".git"[..]]) {
            probes.push(joined(d, name)?);
        }
    }
    for d in dirs.iter().filter(|d| !d.is_root()) {
        sb.mkdir_all(d.as_bytes()).map_err(fail)?;
    }
    for batch in stat_many_batches(&probes) {
        for (p, a) in batch.iter().zip(remote.stat_many(batch).await?) {
            match a {
                Ok(a) if a.kind == FileKind::Dir => sb.mkdir_all(p.as_bytes()).map_err(fail)?,
                Ok(a) if a.kind == FileKind::File => {
                    let data = read_whole(remote, p).await?;
                    sb.write(p.as_bytes(), &data).map_err(fail)?;
                }
                _ => {}
            }
        }
    }
    let top = remote.stat(path).await?;
    let mut entries = Vec::new();
    match top.kind {
        FileKind::Dir => {
            if !path.is_root() {
                sb.mkdir_all(path.as_bytes()).map_err(fail)?;
            }
            let mut tree = remote.tree(path).await?;
            use futures_util::StreamExt;
            while let Some(e) = tree.next().await {
                entries.push(e?);
            }
        }
        _ => entries.push(TreeEntry {
            path: WireBytes(path.as_bytes().to_vec()),
            attr: top,
        }),
    }
    // Which files' bytes are needed (`None`: all of them).
    let mut wanted = None;
    if let (true, Some(pre)) = (contents, pre) {
        let files: Vec<&[u8]> = entries
            .iter()
            .filter(|e| e.attr.kind == FileKind::File && !e.path.0.contains(&b'\n'))
            .map(|e| &e.path.0[..])
            .collect();
        if !files.is_empty() {
            wanted = pre.containing(&files).await?;
        }
    }
    let mut bytes = 0u64;
    for e in &entries {
        let p = &e.path.0;
        match e.attr.kind {
            FileKind::Dir => sb.mkdir_all(p).map_err(fail)?,
            FileKind::Symlink => {
                if let Some(t) = &e.attr.symlink_target {
                    sb.symlink(&t.0, p).map_err(fail)?;
                }
            }
            FileKind::File => {
                let name = p.rsplit(|b| *b == b'/').next().unwrap_or(p);
                let rp = RemotePath::new(p.clone())?;
                let needed = contents
                    && wanted
                        .as_ref()
                        .is_none_or(|w| w.contains(p) || p.contains(&b'\n'));
                if needed || IGNORE_FILES.contains(&name) {
                    bytes += e.attr.size;
                    if bytes > MAX_SNAPSHOT_BYTES {
                        return Err(SearchError::LimitExceeded(format!(
                            "more than {MAX_SNAPSHOT_BYTES} bytes to search without a search tool in the sandbox"
                        ))
                        .into());
                    }
                    let data = read_whole(remote, &rp).await?;
                    sb.write(p, &data).map_err(fail)?;
                } else {
                    sb.write(p, b"").map_err(fail)?;
                }
            }
            _ => {}
        }
    }
    Ok(sb)
}

/// grep with ripgrep in the sandbox: the agent's events (already complete: rg's output is
/// collected whole, at most [`super::OUTPUT_CAP`]), or `None` when rg cannot give the agent's
/// answer exactly here (no rg, an option without an exact rg form, rg reported an error): the
/// caller then searches locally. Dropping the future stops the sandbox's rg (the run is
/// supervised).
pub async fn grep_in_sandbox(
    runner: &dyn Runner,
    probe: &Probe,
    path: &RemotePath,
    opts: &GrepOptions,
) -> Result<Option<Vec<GrepEvent>>> {
    // The agent's caps, so both answer the same.
    let given_caps = opts.max_results.is_some() || opts.max_bytes.is_some();
    let mut opts = opts.clone();
    opts.max_results = Some(
        opts.max_results
            .unwrap_or(crate::agent::MAX_GREP_RESULTS)
            .min(crate::agent::MAX_GREP_RESULTS),
    );
    opts.max_bytes = Some(
        opts.max_bytes
            .unwrap_or(crate::agent::MAX_GREP_BYTES)
            .min(crate::agent::MAX_GREP_BYTES),
    );
    if !probe.tools.iter().any(|t| t == "rg") {
        return Ok(None);
    }
    // Printed output: rg finds the matching lines, and `-l`, `-c` and `--files` are printed
    // here from them ([`printed_from`]).
    // Lines need the files' other lines (numbers, context separators): searched here.
    let printing = opts.print.as_ref().map(|p| p.kind);
    // `--files-without-match` names a binary file rg quit at its first NUL without a line.
    if matches!(
        printing,
        Some(PrintKind::Lines | PrintKind::FilesWithoutMatch)
    ) {
        tracing::debug!("grep searches here: printed lines or files without a match");
        return Ok(None);
    }
    // Caps of the caller's: where a capped printed search stops follows the real walk.
    if printing.is_some() && given_caps {
        tracing::debug!("grep searches here: printed output with caps");
        return Ok(None);
    }
    let mut rg_opts = opts.clone();
    if printing.is_some() {
        rg_opts.print = None;
        rg_opts.before_context = 0;
        rg_opts.after_context = 0;
        // A file's name is printed or not on its first matching line: one is enough.
        if printing != Some(PrintKind::Count) {
            rg_opts.max_results = Some(1);
        }
    }
    let plan = match rgjson::plan(&rg_opts) {
        Ok(plan) => plan,
        Err(why) => {
            tracing::debug!("grep searches here: {why}");
            return Ok(None);
        }
    };
    let matcher = crate::search::grep::build_matcher(&opts)?;
    let (min, nwalk) = (plan.min_major.to_string(), plan.walk.len().to_string());
    let mut args: Vec<&[u8]> = vec![
        path.as_bytes(),
        min.as_bytes(),
        if plan.parents { b"1" } else { b"0" },
        nwalk.as_bytes(),
    ];
    args.extend(plan.walk.iter().chain(&plan.search).map(|a| a.as_bytes()));
    let p = probe.precision;
    let text = build(
        &probe.root,
        p.attr_format(),
        p.version_format(),
        &args,
        &[GREP_RG],
    );
    let out = runner.run(&text, &RunControl::default()).await?;
    let shown = path.display();
    let mut all = Vec::with_capacity(out.stdout.len() + 1);
    all.push(b'\n');
    all.extend_from_slice(&out.stdout);
    const MARKER: &[u8] = b"\n__RESULT__\n";
    let mut found = memchr::memmem::find_iter(&all, MARKER);
    let (Some(at), None) = (found.next(), found.next()) else {
        // No marker, or more than one: the strict parser says which.
        parse(&out, &shown)?;
        return Err(malformed("grep"));
    };
    let body = &all[at + MARKER.len()..];
    let Some(body) = body.strip_prefix(b"ok\n") else {
        parse(&out, &shown)?;
        return Err(malformed("grep"));
    };
    match rgjson::parse_answer(body, out.stdout_cut > 0)? {
        Answer::Fallback(why) => {
            tracing::debug!("grep searches here: {why}");
            Ok(None)
        }
        Answer::Run(run) if printing.is_some() => printed_from(path, opts, run).await,
        Answer::Run(run) => rgjson::assemble(&opts, &matcher, run).map(Some),
    }
}

/// A summary kind of printed output from rg's matching lines: each searched file stands in a
/// [`Snapshot`] holding only its matching lines, and the core searches and prints that
/// as the agent prints the real file. Which lines match, their count and which files have
/// any are the real file's, and that is all `-l`, `-c` and `--files` print. The walk there takes every stand-in (rg's listing already applied
/// hidden, ignore files, globs and sizes). `None` (search here) when rg's output was cut
/// or the answer reached its caps.
async fn printed_from(
    path: &RemotePath,
    mut opts: GrepOptions,
    run: rgjson::RgRun,
) -> Result<Option<Vec<GrepEvent>>> {
    if !run.complete {
        tracing::debug!("grep searches here: rg's output was cut");
        return Ok(None);
    }
    let mut sb = Snapshot::new();
    let fail = |e: SnapshotError| RemoteError::Io(path.display(), e.to_string());
    if !path.is_root() {
        sb.mkdir_all(path.as_bytes()).map_err(fail)?;
    }
    let mut lines: std::collections::HashMap<Vec<u8>, Vec<rgjson::RgLine>> =
        run.reported.into_iter().map(|(p, l, _)| (p, l)).collect();
    for file in &run.files {
        let mut full = path.as_bytes().to_vec();
        if !full.is_empty() {
            full.push(b'/');
        }
        full.extend_from_slice(file);
        let full = RemotePath::new(full)?;
        if let Some((parent, _)) = full.split_last() {
            if !parent.is_root() {
                sb.mkdir_all(parent.as_bytes()).map_err(fail)?;
            }
        }
        let mut data = Vec::new();
        for l in lines.remove(file).unwrap_or_default() {
            if l.is_match {
                data.extend_from_slice(&l.bytes);
                data.push(b'\n');
            }
        }
        sb.write(full.as_bytes(), &data).map_err(fail)?;
    }
    if let Some(p) = lines.keys().next() {
        return Err(RemoteError::Transport(format!(
            "{}: the sandbox changed during the search (rg reported a file its listing lacks)",
            String::from_utf8_lossy(p)
        )));
    }
    let w = &mut opts.walk;
    w.hidden = true;
    w.no_ignore = true;
    w.globs.clear();
    w.max_filesize = None;
    use futures_util::StreamExt;
    let events: Vec<Result<GrepEvent>> = crate::remote::source_query::grep(&sb, path, opts)?
        .collect()
        .await;
    let events = events.into_iter().collect::<Result<Vec<_>>>()?;
    // A search stopped by its caps: where it stops and what it counts by then follow the
    // agent's walk over the real files, not the stand-ins.
    if events.iter().any(|e| {
        matches!(
            e,
            GrepEvent::Summary {
                truncated: true,
                ..
            }
        )
    }) {
        tracing::debug!("grep searches here: the printed answer reached its caps");
        return Ok(None);
    }
    Ok(Some(events))
}

/// `scripts/scan.sh`'s output: `OK START END TOTAL_LINES TOTAL_BYTES FIRST_LINE_BYTES` and
/// the lines, or `ERR TOKEN MESSAGE`.
pub fn parse_scan(out: &[u8], shown: &str) -> Result<ScanResult> {
    let nl = memchr::memchr(b'\n', out).ok_or_else(|| malformed("scan header"))?;
    let head = std::str::from_utf8(&out[..nl]).map_err(|_| malformed("scan header"))?;
    let rest = &out[nl + 1..];
    if let Some(err) = head.strip_prefix("ERR ") {
        let (token, msg) = err.split_once(' ').unwrap_or((err, ""));
        if token == "not_found" {
            return Err(RemoteError::NotFound(shown.to_string()));
        }
        let msg = if msg.contains("no such file") || token == "is_a_directory" {
            shown.to_string()
        } else {
            format!("{shown}: {msg}")
        };
        return Err(SearchError::from_token(token, &msg, None)
            .map(RemoteError::Query)
            .unwrap_or_else(|| RemoteError::Io(shown.to_string(), err.to_string())));
    }
    let f: Vec<u64> = head
        .strip_prefix("OK ")
        .ok_or_else(|| malformed("scan header"))?
        .split(' ')
        .map(|n| n.parse().map_err(|_| malformed("scan number")))
        .collect::<Result<_>>()?;
    let [start_line, end_line, total_lines, total_bytes, first_line_bytes] = f[..] else {
        return Err(malformed("scan header fields"));
    };
    let mut lines: Vec<Vec<u8>> = Vec::new();
    if !rest.is_empty() {
        let body = rest
            .strip_suffix(b"\n")
            .ok_or_else(|| malformed("scan lines"))?;
        lines = body.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    }
    if end_line + 1 < start_line || lines.len() as u64 != end_line + 1 - start_line {
        return Err(malformed("scan line count"));
    }
    Ok(ScanResult {
        lines,
        start_line,
        end_line,
        total_lines,
        total_bytes,
        first_line_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(pattern: &str, f: impl FnOnce(&mut GrepOptions)) -> Option<String> {
        let mut o = GrepOptions {
            pattern: pattern.into(),
            ..Default::default()
        };
        f(&mut o);
        required_literal(&o)
    }

    #[test]
    fn only_a_case_sensitive_plain_or_fixed_pattern_has_a_required_literal() {
        assert_eq!(lit("TODO fix", |_| {}), Some("TODO fix".into()));
        assert_eq!(lit("a.c(", |o| o.fixed_strings = true), Some("a.c(".into()));
        assert_eq!(lit("a.c", |_| {}), None);
        assert_eq!(lit("\\w+", |_| {}), None);
        assert_eq!(lit("", |_| {}), None);
        assert_eq!(lit("todo", |o| o.case_insensitive = true), None);
        // Smart case: insensitive (no literal) unless the pattern has an uppercase letter.
        assert_eq!(lit("todo", |o| o.smart_case = true), None);
        assert_eq!(lit("Todo", |o| o.smart_case = true), Some("Todo".into()));
        assert_eq!(lit("todo", |o| o.invert = true), None);
        assert_eq!(lit("todo", |o| o.walk.max_filesize = Some(10)), None);
        // -w: a word match still holds the literal.
        assert_eq!(lit("todo", |o| o.word = true), Some("todo".into()));
    }
}
