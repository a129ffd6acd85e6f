//! [`ScriptRemote`]: the whole [`Remote`] as static POSIX `sh` programs over a [`Runner`].
//!
//! Each call is one program (one round trip): the prelude and `scripts/lib.sh`
//! ([`super::program`]), then the operation's script. Paths are the validated
//! [`RemotePath`]s joined to the workspace's canonical root; the scripts refuse a path whose
//! directory resolves outside it, and follow a final symlink only for content operations
//! (read, commit, list, scan) and only when it stays inside. Those checks and the operation
//! are separate steps of one program, so a process in the sandbox racing them can win, as
//! against any path-based tool (the agent holds directory descriptors instead, and so does
//! fast.py, which runs every such operation where the sandbox has python).
//!
//! Where the probe finds python 3.6+, every operation on a path but grep runs
//! `scripts/fast.py` instead ([`super::pyfast`]: directory descriptors, so a symlink swapped
//! into the path mid-call cannot lead out; xattr presence; paths past PATH_MAX), and
//! on a sandbox whose `stat` knows whole seconds only, the scripts' `stat -c` goes through
//! python (`scripts/pystat.sh`): one precision, one version for a file whatever answered.
//!
//! What the transport lacks natively: no change feed (`watch` is `Unsupported`; the mount
//! revalidates by polling); patches applied in the sandbox to a copy of the base (taken only
//! where versions have nanoseconds, else the mount pushes whole files); and queries run here
//! over what the scripts list (glob/fuzzy: only paths and ignore files cross; grep: rg in the
//! sandbox where it is, else the bytes of the
//! files that may match cross) — see [`super::query`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;

use super::program::{self, b64, build, heredoc_b64, malformed, parse, unb64};
use super::pyfast;
use super::statline::{parse_attr, parse_version_fields, version_fields, Precision};
use super::{RunControl, Runner};
use crate::remote::*;
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::scan::{ScanRequest, ScanResult};
use crate::search::SearchError;

/// Start-up time of the sandbox's python, beyond a bare `sh`'s, past which the log says so: a real
/// interpreter starts in 20–70 ms (a few times that on a loaded machine), pyenv's shim in ~500.
const SLOW_PYTHON_START: std::time::Duration = std::time::Duration::from_millis(400);

const STAT: &str = include_str!("scripts/stat.sh");
const LIST: &str = include_str!("scripts/list.sh");
const TREE: &str = include_str!("scripts/tree.sh");
const READ: &str = include_str!("scripts/read.sh");
const COMMIT: &str = include_str!("scripts/commit.sh");
const NAMESPACE: &str = include_str!("scripts/namespace.sh");
const XATTR: &str = include_str!("scripts/xattr.sh");
const PROBE: &str = include_str!("scripts/probe.sh");
const STATFS: &str = include_str!("scripts/statfs.sh");
const SCAN_RUN: &str = include_str!("scripts/scan_run.sh");
const RESOLVE: &str = include_str!("scripts/resolve.sh");
const SCAN: &str = include_str!("../../../scripts/scan.sh");
const PYSTAT: &str = include_str!("scripts/pystat.sh");

/// Times a program is run again when it saw the sandbox change under it (a file gone
/// between listing and `stat`, a file rewritten during a read).
const ATTEMPTS: usize = 3;
/// Largest range one read answers: its base64 (4/3 of it) stays far below the runner's
/// output cap.
const MAX_READ: u32 = 4 * 1024 * 1024;
/// The exit status a session's python3 server answers when its inline fast path is held by
/// another call for 5 s ([`super::session`]).
const INLINE_BUSY: i32 = 125;

/// Largest block `dd` writes a patch range with: the offset's largest power-of-two divisor,
/// so the range lands exactly at `seek × bs`, up to this.
const MAX_DD_BLOCK: u64 = 64 * 1024;

/// What the first program learnt about the sandbox.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The workspace, every symlink resolved.
    pub root: Vec<u8>,
    pub precision: Precision,
    pub user: Identity,
    /// Tools found in PATH (python3, rg, getfattr, fallocate).
    pub tools: Vec<String>,
    /// The python (3.6 or later) that runs the fast stat/list/tree path ([`super::pyfast`]).
    pub python: Option<String>,
    /// The sandbox's `stat` knows whole seconds only but python runs: the scripts' `stat -c`
    /// goes through python (`scripts/pystat.sh`), so every path gives nanoseconds and the
    /// same versions.
    pub stat_via_python: bool,
}

pub struct ScriptRemote {
    runner: Arc<dyn Runner>,
    /// The root as given; canonical in `probe`.
    given_root: Vec<u8>,
    probe: OnceCell<Probe>,
    temp_seq: AtomicU64,
    /// Reads go through the runner's `get_file` until it answers `None` once.
    native_reads: std::sync::atomic::AtomicBool,
}

/// The lines of an answer after the first word of each: `("S", rest)`.
fn word(line: &str) -> (&str, &str) {
    line.split_once(' ').unwrap_or((line, ""))
}

impl ScriptRemote {
    pub fn new(runner: Arc<dyn Runner>, root: Vec<u8>) -> ScriptRemote {
        ScriptRemote {
            runner,
            given_root: root,
            probe: OnceCell::new(),
            temp_seq: AtomicU64::new(0),
            native_reads: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Ask the sandbox who and where it is (once).
    pub async fn probe(&self) -> Result<&Probe> {
        self.probe
            .get_or_try_init(|| async {
                let shown = String::from_utf8_lossy(&self.given_root).into_owned();
                let p = Precision::Nanos;
                let text = build(
                    &self.given_root,
                    p.attr_format(),
                    p.version_format(),
                    &[],
                    &[PROBE],
                );
                let out = self.runner.run(&text, &RunControl::default()).await?;
                let lines = parse(&out, &shown)?;
                let mut probe = Probe {
                    root: Vec::new(),
                    precision: Precision::Seconds,
                    user: Identity::default(),
                    tools: Vec::new(),
                    python: None,
                    stat_via_python: false,
                };
                for line in &lines {
                    match word(line) {
                        ("R", r) => probe.root = unb64(r)?,
                        ("U", ids) => {
                            let (u, g) = ids.split_once(' ').ok_or_else(|| malformed("id"))?;
                            probe.user.uid = u.parse().map_err(|_| malformed("uid"))?;
                            probe.user.gid = g.parse().map_err(|_| malformed("gid"))?;
                        }
                        ("G", gs) => {
                            probe.user.groups = gs
                                .split_whitespace()
                                .map(|g| g.parse().map_err(|_| malformed("groups")))
                                .collect::<Result<_>>()?
                        }
                        ("F", "ns") => probe.precision = Precision::Nanos,
                        ("F", _) => probe.precision = Precision::Seconds,
                        ("T", t) => probe.tools.push(t.to_string()),
                        ("Y", py) if pyfast::PYTHONS.contains(&py) => {
                            probe.python = Some(py.to_string())
                        }
                        _ => return Err(malformed("probe line")),
                    }
                }
                if !probe.root.starts_with(b"/") {
                    return Err(malformed("the workspace path"));
                }
                if probe.python.is_some() && probe.precision == Precision::Seconds {
                    probe.precision = Precision::Nanos;
                    probe.stat_via_python = true;
                }
                if let Some(python) = &probe.python {
                    self.note_python_start(python).await;
                }
                Ok(probe)
            })
            .await
    }

    /// Say once, in the log, when the sandbox's python is slow to start: a version manager's
    /// shim (pyenv's runs a shell program of its own first) costs every stat and listing
    /// about half a second, and moving the interpreter itself first in PATH is the cure.
    async fn note_python_start(&self, python: &str) {
        let time = |program: String| async move {
            let started = std::time::Instant::now();
            let ran = self.runner.run(&program, &RunControl::default()).await;
            ran.ok().map(|_| started.elapsed())
        };
        let Some(shell) = time(":\n".into()).await else {
            return;
        };
        // `python` is one of pyfast::PYTHONS: a fixed word.
        let Some(started) = time(format!("{python} -c ''\n")).await else {
            return;
        };
        let extra = started.saturating_sub(shell);
        if extra > SLOW_PYTHON_START {
            tracing::warn!(
                "the sandbox's {python} takes {} ms to start (a version manager's shim, such as \
                 pyenv's?): every stat and listing pays it; put the interpreter itself first in \
                 the sandbox's PATH (`command -v {python}` there says which one runs)",
                extra.as_millis()
            );
        }
    }

    /// Run one program (`parts` after the prelude) with `args`, answering its lines; a
    /// program that saw the sandbox change under it is run again.
    async fn call(&self, what: &str, args: &[&[u8]], parts: &[&str]) -> Result<Vec<String>> {
        let probe = self.probe().await?;
        let p = probe.precision;
        let pystat;
        let mut all: Vec<&str> = Vec::with_capacity(parts.len() + 1);
        if let (true, Some(python)) = (probe.stat_via_python, probe.python.as_deref()) {
            // `python` is one of pyfast::PYTHONS: a fixed word.
            pystat = format!("__PY={python}\n{PYSTAT}");
            all.push(&pystat);
        }
        all.extend_from_slice(parts);
        let text = build(&probe.root, p.attr_format(), p.version_format(), args, &all);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let out = self.runner.run(&text, &RunControl::default()).await?;
            match parse(&out, what) {
                Err(RemoteError::Transport(m)) if m.contains("changed while") => {
                    if attempt >= ATTEMPTS {
                        return Err(RemoteError::Transport(m));
                    }
                }
                r => return r,
            }
        }
    }

    /// Run the python fast path's `op` ([`pyfast`]), answering its lines; `None` where the
    /// sandbox has no python (the sh scripts answer then).
    async fn fast(&self, what: &str, op: &str, args: &[&[u8]]) -> Result<Option<Vec<String>>> {
        let probe = self.probe().await?;
        let Some(python) = probe.python.as_deref() else {
            return Ok(None);
        };
        let out = self.run_fast(probe, python, op, args).await?;
        parse(&out, what).map(Some)
    }

    /// One fast-path operation's output: run by the session's python3 server itself where
    /// there is one (no process started), else as a program piping its input to `python`.
    async fn run_fast(
        &self,
        probe: &Probe,
        python: &str,
        op: &str,
        args: &[&[u8]],
    ) -> Result<super::Output> {
        let input = pyfast::input(&probe.root, probe.precision, op, args);
        match self
            .runner
            .run_python_inline(input.as_bytes(), &RunControl::default())
            .await
        {
            // 125: the server's inline runner is held by another call (a hung file system):
            // this one runs as a program of its own.
            Some(Ok(out)) if out.code != INLINE_BUSY => return Ok(out),
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) | None => {}
        }
        let text = pyfast::program(python, &probe.root, probe.precision, op, args);
        self.runner.run(&text, &RunControl::default()).await
    }

    fn abs(&self, probe: &Probe, path: &RemotePath) -> Vec<u8> {
        let mut p = probe.root.clone();
        if !path.is_root() {
            p.push(b'/');
            p.extend_from_slice(path.as_bytes());
        }
        p
    }

    /// A temp file name in the target's directory (the agent's `.sbxfs-` mark, so sweeps and
    /// tests know it; [`is_temp_name`] hides it from listings).
    fn temp_name(&self) -> String {
        let n = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!(".sbxfs-exec-{:x}-{t:x}-{n:x}.tmp", std::process::id())
    }

    /// `S`/`L`/`E` lines of the stat script, one result per asked path.
    fn stat_results(lines: &[String], paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        let mut out: Vec<Result<Attr>> = Vec::with_capacity(paths.len());
        for line in lines {
            match word(line) {
                ("S", s) => out.push(parse_attr(s, None)),
                ("L", _) | ("X", _) => match out.last_mut() {
                    Some(Ok(a)) => {
                        if !pyfast::extra_line(a, line)? {
                            return Err(malformed("stat line"));
                        }
                    }
                    _ => return Err(malformed("an L or X line after no attributes")),
                },
                ("E", e) => {
                    let shown = paths
                        .get(out.len())
                        .map(|p| p.display())
                        .unwrap_or_default();
                    let (token, msg) = word(e);
                    out.push(Err(program::error_of(token, msg, &shown)));
                }
                _ => return Err(malformed("stat line")),
            }
        }
        if out.len() != paths.len() {
            return Err(malformed("stat answered another number of paths"));
        }
        out.into_iter()
            .map(|r| match r {
                Err(RemoteError::Transport(m)) => Err(malformed(&m)),
                r => Ok(r),
            })
            .collect()
    }

    /// The attributes an operation answered (`S` [+ `L`]).
    fn one_attr(lines: &[String], path: &RemotePath) -> Result<Attr> {
        let attrs = Self::stat_results(
            lines
                .iter()
                .filter(|l| l.starts_with("S ") || l.starts_with("L "))
                .cloned()
                .collect::<Vec<_>>()
                .as_slice(),
            std::slice::from_ref(path),
        )?;
        attrs.into_iter().next().expect("one path")
    }

    /// A range through the transport's own download (`get_file`), checked against the
    /// version before and after; `None` where the transport has none.
    async fn read_native(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
    ) -> Result<Option<ReadResult>> {
        let version_at = |lines: &[String]| -> Result<(Vec<u8>, Version)> {
            match lines {
                [r, s] => match (word(r), word(s)) {
                    (("R", r), ("S", s)) => Ok((unb64(r)?, parse_attr(s, None)?.version)),
                    _ => Err(malformed("resolve")),
                },
                _ => Err(malformed("resolve")),
            }
        };
        let shown = path.display();
        let args: [&[u8]; 2] = [path.as_bytes(), b"regular"];
        let (abs, before) = version_at(&self.call(&shown, &args, &[RESOLVE]).await?)?;
        let Some(whole) = self.runner.get_file(&abs).await else {
            return Ok(None);
        };
        let whole = whole?;
        let (_, after) = version_at(&self.call(&shown, &args, &[RESOLVE]).await?)?;
        if before != after || whole.len() as u64 > u64::MAX / 2 {
            return Err(RemoteError::Transport(format!(
                "{}: changed while read",
                path.display()
            )));
        }
        let start = (offset.min(whole.len() as u64)) as usize;
        let end = start.saturating_add(len as usize).min(whole.len());
        Ok(Some(ReadResult {
            data: whole.slice(start..end),
            version: before,
        }))
    }

    /// One range of at most [`MAX_READ`] bytes, in one program: its bytes cross as they are
    /// (no base64: a third fewer bytes and no encoding on either side), between the stat line
    /// before and the one after, which must be equal (else it is read again).
    async fn read_chunk(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        let (o, l) = (offset.to_string(), len.to_string());
        let probe = self.probe().await?;
        let shown = path.display();
        if let Some(python) = probe.python.as_deref() {
            // Where python runs, the file is opened through directory descriptors (a symlink
            // swapped into the path while it is read cannot lead out of the workspace, as it
            // could between the sh script's check and its `tail`), by the session's python3
            // server itself where there is one (no program started).
            let args: [&[u8]; 3] = [path.as_bytes(), o.as_bytes(), l.as_bytes()];
            for _ in 0..ATTEMPTS {
                let out = self.run_fast(probe, python, "read", &args).await?;
                match parse_raw_read(&out, &shown, len)? {
                    Some(r) => return Ok(r),
                    None => continue,
                }
            }
            return Err(RemoteError::Transport(format!(
                "{shown}: changed while read"
            )));
        }
        let p = probe.precision;
        let pystat;
        let mut all: Vec<&str> = Vec::with_capacity(2);
        if let (true, Some(python)) = (probe.stat_via_python, probe.python.as_deref()) {
            // `python` is one of pyfast::PYTHONS: a fixed word.
            pystat = format!("__PY={python}\n{PYSTAT}");
            all.push(&pystat);
        }
        all.push(READ);
        let args: [&[u8]; 3] = [path.as_bytes(), o.as_bytes(), l.as_bytes()];
        let text = build(
            &probe.root,
            p.attr_format(),
            p.version_format(),
            &args,
            &all,
        );
        for _ in 0..ATTEMPTS {
            let out = self.runner.run(&text, &RunControl::default()).await?;
            match parse_raw_read(&out, &shown, len)? {
                Some(r) => return Ok(r),
                None => continue,
            }
        }
        Err(RemoteError::Transport(format!(
            "{shown}: changed while read"
        )))
    }

    /// `op` through fast.py's directory descriptors where python runs (a directory swapped
    /// for a symlink during the call cannot turn it on a file outside the workspace, as it can
    /// between an sh script's check and its use of the path), else `script` with `sh_args`.
    async fn fast_else_script(
        &self,
        path: &RemotePath,
        op: &str,
        args: &[&[u8]],
        script: &str,
        sh_args: &[&[u8]],
    ) -> Result<Vec<String>> {
        let shown = path.display();
        if let Some(lines) = self.fast(&shown, op, args).await? {
            return Ok(lines);
        }
        self.call(&shown, sh_args, &[script]).await
    }

    /// A namespace operation (`args`: namespace.sh's, the operation's name first).
    async fn namespace(&self, what: &RemotePath, args: &[&[u8]]) -> Result<Vec<String>> {
        self.fast_else_script(what, "ns", args, NAMESPACE, args)
            .await
    }

    /// An extended-attribute operation (`sh`: xattr.sh's arguments, the value in base64).
    async fn xattr_call(
        &self,
        path: &RemotePath,
        fast: &[&[u8]],
        sh: &[&[u8]],
    ) -> Result<Vec<String>> {
        self.fast_else_script(path, "xattr", fast, XATTR, sh).await
    }

    /// A commit through fast.py (`how`: how the new content is made, see its `commit`), the
    /// same steps as commit.sh's on descriptors; `None` where the sandbox has no python.
    async fn commit_fast(
        &self,
        path: &RemotePath,
        base: Option<&Version>,
        create_mode: u32,
        mtime_ns: Option<i64>,
        how: &[&[u8]],
    ) -> Result<Option<Lines>> {
        let probe = self.probe().await?;
        if probe.python.is_none() {
            return Ok(None);
        }
        let base_version = base.map(|v| v.0.clone()).unwrap_or_default();
        let base = commit_base(base, probe.precision);
        let mode = octal(create_mode);
        let temp = self.temp_name();
        let mtime = mtime_ns.map(touch_time).unwrap_or_default();
        let mut args: Vec<&[u8]> = vec![
            path.as_bytes(),
            base.as_bytes(),
            mode.as_bytes(),
            temp.as_bytes(),
            mtime.as_bytes(),
        ];
        args.extend_from_slice(how);
        let shown = path.display();
        match self.fast(&shown, "commit", &args).await {
            Err(RemoteError::Conflict { path, current, .. }) => {
                Err(conflict_of(&path, &base_version, &current))
            }
            r => r.map(|l| l.map(Lines)),
        }
    }

    /// Where a content operation on `path` lands: its absolute path with a final symlink
    /// followed, refused when that leaves the workspace.
    pub async fn resolve(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let lines = self
            .call(&path.display(), &[path.as_bytes()], &[RESOLVE])
            .await?;
        match lines.first().map(|l| word(l)) {
            Some(("R", r)) => unb64(r),
            _ => Err(malformed("resolve")),
        }
    }

    /// Commit through the commit script, `content` being the shell function that fills the
    /// temp file (`pre` runs first: copy_range's source checks).
    async fn commit_with(
        &self,
        path: &RemotePath,
        base: Option<&Version>,
        create_mode: u32,
        content_fn: &str,
        pre: &str,
        extra: &[&[u8]],
    ) -> Result<Lines> {
        let probe = self.probe().await?;
        let base_version = base.map(|v| v.0.clone()).unwrap_or_default();
        let base = commit_base(base, probe.precision);
        let mode = octal(create_mode);
        let temp = self.temp_name();
        let mut args: Vec<&[u8]> = vec![path.as_bytes(), base.as_bytes(), mode.as_bytes()];
        args.push(temp.as_bytes());
        args.extend_from_slice(extra);
        let shown = path.display();
        match self.call(&shown, &args, &[content_fn, pre, COMMIT]).await {
            Err(RemoteError::Conflict { path, current, .. }) => {
                Err(conflict_of(&path, &base_version, &current))
            }
            r => r.map(Lines),
        }
    }
}

struct Lines(Vec<String>);

/// A name [`ScriptRemote::temp_name`] made (`.sbxfs-exec-…tmp`, or a path ending in one): a
/// commit's temp file, or an upload on its way into one, left out of listings and trees. It
/// lives for the length of one commit, but a listing taken then would show it to every tool
/// (`git status` printed it as untracked).
pub(super) fn is_temp_name(name: &[u8]) -> bool {
    let last = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
    last.starts_with(b".sbxfs-exec-") && last.ends_with(b".tmp")
}

/// A commit's new content, read: whole, or a patch over the file's own bytes.
enum NewContent {
    Whole(Bytes),
    Patch {
        cut: u64,
        new_len: u64,
        ranges: Vec<(u64, Bytes)>,
    },
}

/// The version a commit requires, as the programs compare it: "" (none), `absent`, or the
/// version fields (one made elsewhere never matches: the program answers the conflict).
fn commit_base(base: Option<&Version>, precision: Precision) -> String {
    match base {
        None => String::new(),
        Some(v) if v.is_absent() => "absent".into(),
        Some(v) => version_fields(v, precision).unwrap_or_else(|| "unknown".into()),
    }
}

/// A `CONFLICT` answer (its text: the current version fields, or "absent").
fn conflict_of(path: &str, base: &str, current: &str) -> RemoteError {
    let current = if current.trim() == "absent" {
        "absent".to_string()
    } else {
        parse_version_fields(current.trim())
            .map(|v| v.0)
            .unwrap_or_else(|_| current.to_string())
    };
    RemoteError::Conflict {
        path: path.to_string(),
        base: base.to_string(),
        current,
    }
}

/// The agent's tree order: a directory's entries whole (sorted), then each subdirectory's
/// the same way, in order.
fn agent_order(top: &RemotePath, entries: Vec<(RemotePath, Attr)>) -> Vec<(RemotePath, Attr)> {
    use std::collections::BTreeMap;
    let mut by_dir: BTreeMap<Vec<u8>, Vec<(RemotePath, Attr)>> = BTreeMap::new();
    for (p, a) in entries {
        let parent = p
            .split_last()
            .map(|(d, _)| d.as_bytes().to_vec())
            .unwrap_or_default();
        by_dir.entry(parent).or_default().push((p, a));
    }
    let mut out = Vec::new();
    let mut stack = vec![top.as_bytes().to_vec()];
    while let Some(dir) = stack.pop() {
        let Some(mut children) = by_dir.remove(&dir) else {
            continue;
        };
        children.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
        let subdirs: Vec<Vec<u8>> = children
            .iter()
            .filter(|(_, a)| a.kind == FileKind::Dir)
            .map(|(p, _)| p.as_bytes().to_vec())
            .collect();
        out.extend(children);
        stack.extend(subdirs.into_iter().rev());
    }
    out
}

fn tree_stream(entries: Vec<(RemotePath, Attr)>) -> BoxStream<'static, Result<TreeEntry>> {
    stream::iter(entries.into_iter().map(|(p, attr)| {
        Ok(TreeEntry {
            path: WireBytes(p.as_bytes().to_vec()),
            attr,
        })
    }))
    .boxed()
}

/// A `dd` block size and seek that put a range at exactly `offset`.
fn dd_at(offset: u64) -> (u64, u64) {
    let bs = if offset == 0 {
        MAX_DD_BLOCK
    } else {
        (1u64 << offset.trailing_zeros()).min(MAX_DD_BLOCK)
    };
    (bs, offset / bs)
}

/// A mode to make or set: set-ID bits dropped, as the agent does by default (whoever can
/// mount must not make a set-ID program in the sandbox).
fn octal(mode: u32) -> String {
    // Five digits: GNU chmod keeps a directory's set-group-ID bit for a shorter number.
    format!("{:05o}", mode & 0o1777)
}

/// Nanoseconds as `touch -d @` takes them.
fn touch_time(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:09}", a / 1_000_000_000, a % 1_000_000_000)
}

#[async_trait]
impl Remote for ScriptRemote {
    async fn info(&self) -> Result<RemoteInfo> {
        // The probe is learned once; a later `info` is the mount's "does it answer?" and must
        // reach the sandbox, or a dead link would look alive.
        if self.probe.get().is_some() {
            self.statfs().await?;
        }
        let probe = self.probe().await?;
        Ok(RemoteInfo {
            protocol: wire::PROTOCOL_VERSION,
            agent_version: format!("exec-scripts ({})", self.runner.describe()),
            workspace_id: None,
            root: String::from_utf8_lossy(&probe.root).into_owned(),
            user: Some(probe.user.clone()),
            landlock: None,
            tree_formats: Vec::new(),
            commit_absent: true,
            capabilities: Capabilities {
                feed: false,
                // Patches are applied in the sandbox to a copy of the base, checked by its
                // version; a version of whole seconds could miss a change made within the
                // same second, which a patch would then be mixed into.
                patch_commits: probe.precision == Precision::Nanos,
                // The commit script starts a cut-0 patch from an empty file.
                patch_new: true,
                // `touch` sets one time per call: the access time stays a call of its own.
                commit_atime: false,
                // grep runs in the sandbox where rg is (glob and fuzzy: only paths cross).
                server_search: probe.tools.iter().any(|t| t == "rg"),
                kill: true,
            },
        })
    }

    async fn stat(&self, path: &RemotePath) -> Result<Attr> {
        let mut r = self.stat_many(std::slice::from_ref(path)).await?;
        r.pop().expect("one path")
    }

    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>> {
        check_stat_many(paths)?;
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let args: Vec<&[u8]> = paths.iter().map(|p| p.as_bytes()).collect();
        if let Some(lines) = self.fast("stat", "stat", &args).await? {
            return Self::stat_results(&lines, paths);
        }
        let lines = self.call("stat", &args, &[STAT]).await?;
        Self::stat_results(&lines, paths)
    }

    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>> {
        let shown = path.display();
        if let Some(lines) = self.fast(&shown, "list", &[path.as_bytes()]).await? {
            let mut entries = pyfast::entries(&lines)?
                .into_iter()
                .map(|(name, attr)| {
                    check_entry_name(&name).map_err(malformed)?;
                    Ok(DirEntry {
                        name: WireBytes(name),
                        attr,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            entries.sort_by(|a, b| a.name.0.cmp(&b.name.0));
            return Ok(entries);
        }
        let lines = self
            .call(&path.display(), &[path.as_bytes()], &[LIST])
            .await?;
        let mut it = lines.iter();
        let names = match it.next().map(|l| word(l)) {
            Some(("N", n)) => unb64(n)?,
            _ => return Err(malformed("list without names")),
        };
        let names: Vec<&[u8]> = if names.is_empty() {
            Vec::new()
        } else {
            names
                .strip_suffix(b"\0")
                .ok_or_else(|| malformed("names"))?
                .split(|b| *b == 0)
                .collect()
        };
        let mut entries = Vec::with_capacity(names.len());
        for name in &names {
            check_entry_name(name).map_err(malformed)?;
            let line = it.next().ok_or_else(|| malformed("fewer stat lines"))?;
            entries.push(DirEntry {
                name: WireBytes(name.to_vec()),
                attr: parse_attr(line, None)?,
            });
        }
        for e in entries
            .iter_mut()
            .filter(|e| e.attr.kind == FileKind::Symlink)
        {
            match it.next().map(|l| word(l)) {
                Some(("L", t)) => e.attr.symlink_target = Some(WireBytes(unb64(t)?)),
                _ => return Err(malformed("a link without its target")),
            }
        }
        if it.next().is_some() {
            return Err(malformed("extra list lines"));
        }
        entries.retain(|e| !is_temp_name(&e.name.0));
        entries.sort_by(|a, b| a.name.0.cmp(&b.name.0));
        Ok(entries)
    }

    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>> {
        let shown = path.display();
        if let Some(lines) = self.fast(&shown, "tree", &[path.as_bytes()]).await? {
            let entries = pyfast::entries(&lines)?
                .into_iter()
                .map(|(rel, attr)| {
                    let full = if path.is_root() {
                        RemotePath::new(rel)
                    } else {
                        RemotePath::new([path.as_bytes(), b"/", &rel].concat())
                    }
                    .map_err(|_| malformed("a path"))?;
                    Ok((full, attr))
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(tree_stream(agent_order(path, entries)));
        }
        let lines = self
            .call(&path.display(), &[path.as_bytes()], &[TREE])
            .await?;
        let mut it = lines.iter();
        let names = match it.next().map(|l| word(l)) {
            Some(("N", n)) => unb64(n)?,
            _ => return Err(malformed("tree without paths")),
        };
        let mut entries = Vec::new();
        if !names.is_empty() {
            for rel in names
                .strip_suffix(b"\0")
                .ok_or_else(|| malformed("paths"))?
                .split(|b| *b == 0)
            {
                let rel = rel.strip_prefix(b"./").ok_or_else(|| malformed("a path"))?;
                let line = it.next().ok_or_else(|| malformed("fewer stat lines"))?;
                let full = if path.is_root() {
                    RemotePath::new(rel.to_vec())
                } else {
                    RemotePath::new([path.as_bytes(), b"/", rel].concat())
                }
                .map_err(|_| malformed("a path"))?;
                entries.push((full, parse_attr(line, None)?));
            }
        }
        if it.next().is_some() {
            return Err(malformed("extra tree lines"));
        }
        entries.retain(|(p, _)| !is_temp_name(p.as_bytes()));
        // Symlink targets in one more round trip.
        let links: Vec<RemotePath> = entries
            .iter()
            .filter(|(_, a)| a.kind == FileKind::Symlink)
            .map(|(p, _)| p.clone())
            .collect();
        let mut targets = std::collections::HashMap::new();
        for batch in stat_many_batches(&links) {
            for (p, a) in batch.iter().zip(self.stat_many(batch).await?) {
                if let Ok(Attr {
                    symlink_target: Some(t),
                    ..
                }) = a
                {
                    targets.insert(p.as_bytes().to_vec(), t);
                }
            }
        }
        for (p, a) in entries.iter_mut() {
            if a.kind == FileKind::Symlink {
                a.symlink_target = targets.remove(p.as_bytes());
            }
        }
        Ok(tree_stream(agent_order(path, entries)))
    }

    /// Where python runs: one call for the whole subtree (`fast.py`'s `listings`, walked and
    /// capped in the sandbox exactly as [`listings::Walk`] does), instead of one `list` call
    /// per directory — a cold `find` of 30 directories is 1 round trip, not 31.
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<listings::TreeListing>>> {
        let max = max_entries.min(listings::MAX_TREE_ENTRIES).to_string();
        let shown = path.display();
        let Some(lines) = self
            .fast(&shown, "listings", &[path.as_bytes(), max.as_bytes()])
            .await?
        else {
            return listings::by_list(self, path, max_entries).await;
        };
        let mut given: std::collections::HashMap<Vec<u8>, Vec<DirEntry>> =
            std::collections::HashMap::new();
        let mut at = 0;
        while at < lines.len() {
            let ("D", d) = word(&lines[at]) else {
                return Err(malformed("a listing without its directory"));
            };
            let rel = unb64(d)?;
            let end = lines[at + 1..]
                .iter()
                .position(|l| l.starts_with("D "))
                .map_or(lines.len(), |n| at + 1 + n);
            let mut entries = pyfast::entries(&lines[at + 1..end])?
                .into_iter()
                .map(|(name, attr)| {
                    check_entry_name(&name).map_err(malformed)?;
                    Ok(DirEntry {
                        name: WireBytes(name),
                        attr,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            entries.sort_by(|a, b| a.name.0.cmp(&b.name.0));
            let full = if rel.is_empty() {
                path.clone()
            } else if path.is_root() {
                RemotePath::new(rel).map_err(|_| malformed("a path"))?
            } else {
                RemotePath::new([path.as_bytes(), b"/", &rel].concat())
                    .map_err(|_| malformed("a path"))?
            };
            if given.insert(full.as_bytes().to_vec(), entries).is_some() {
                return Err(malformed("a directory listed twice"));
            }
            at = end;
        }
        // The same walk over what came: a directory the sandbox did not list (beyond the cap,
        // or not enterable) is answered as not descended.
        let mut walk = listings::Walk::new(path, max_entries);
        let mut out = Vec::new();
        while let Some(dir) = walk.next_dir().cloned() {
            match given.remove(dir.as_bytes()) {
                Some(entries) => {
                    if !walk.listed(&entries)? {
                        break;
                    }
                    out.push(Ok(listings::TreeListing {
                        path: dir,
                        entries: Some(entries),
                    }));
                }
                None if dir == *path => return Err(malformed("no listing of the asked directory")),
                None => {
                    walk.skipped();
                    out.push(Ok(listings::TreeListing {
                        path: dir,
                        entries: None,
                    }));
                }
            }
        }
        out.extend(walk.rest().into_iter().map(|path| {
            Ok(listings::TreeListing {
                path,
                entries: None,
            })
        }));
        Ok(stream::iter(out).boxed())
    }

    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult> {
        if len > wire::MAX_READ_BYTES {
            return Err(RemoteError::TooLarge(format!(
                "{}: reads are limited to {} bytes",
                path.display(),
                wire::MAX_READ_BYTES
            )));
        }
        if self.native_reads.load(Ordering::Relaxed) {
            match self.read_native(path, offset, len).await? {
                Some(r) => return Ok(r),
                None => self.native_reads.store(false, Ordering::Relaxed),
            }
        }
        // Chunks small enough for the output cap; all must carry one version, or the whole
        // range is read again.
        'again: for _ in 0..ATTEMPTS {
            let first = self.read_chunk(path, offset, len.min(MAX_READ)).await?;
            let mut data = first.data.to_vec();
            while data.len() < len as usize
                && data.len() % MAX_READ as usize == 0
                && !data.is_empty()
            {
                let want = (len as usize - data.len()).min(MAX_READ as usize) as u32;
                let next = self
                    .read_chunk(path, offset + data.len() as u64, want)
                    .await?;
                if next.version != first.version {
                    continue 'again;
                }
                if next.data.is_empty() {
                    break;
                }
                data.extend_from_slice(&next.data);
            }
            return Ok(ReadResult {
                data: Bytes::from(data),
                version: first.version,
            });
        }
        Err(RemoteError::Transport(format!(
            "{}: kept changing while read",
            path.display()
        )))
    }

    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr> {
        let mode = opts.create_mode.unwrap_or(0o644);
        let content = match content {
            CommitContent::Whole(mut r) => {
                let mut data = Vec::new();
                r.read_to_end(&mut data)
                    .await
                    .map_err(|e| RemoteError::Io(path.display(), e.to_string()))?;
                NewContent::Whole(Bytes::from(data))
            }
            CommitContent::Patch {
                cut,
                new_len,
                ranges,
            } => {
                // The shell's arithmetic is signed 64-bit: a cut past that cuts nothing.
                let cut = cut.min(i64::MAX as u64);
                if new_len > i64::MAX as u64 {
                    return Err(RemoteError::FileTooBig(path.display()));
                }
                NewContent::Patch {
                    cut,
                    new_len,
                    ranges,
                }
            }
        };
        // A transport that moves files natively (an HTTP upload) puts the bytes in the
        // workspace root (always inside it), and the program copies them into its temp.
        let uploaded = match &content {
            NewContent::Whole(data) => {
                let probe = self.probe().await?;
                let up = self.temp_name();
                let mut up_abs = probe.root.clone();
                up_abs.push(b'/');
                up_abs.extend_from_slice(up.as_bytes());
                match self.runner.put_file(&up_abs, data.clone()).await {
                    Some(Ok(())) => Some(up),
                    Some(Err(e)) => return Err(e),
                    None => None,
                }
            }
            NewContent::Patch { .. } => None,
        };
        let (cut, len);
        let offsets: Vec<String>;
        let how: Vec<&[u8]> = match (&content, &uploaded) {
            (_, Some(up)) => vec![b"up", up.as_bytes()],
            (NewContent::Whole(data), None) => vec![b"data", data],
            (
                NewContent::Patch {
                    cut: c,
                    new_len,
                    ranges,
                },
                None,
            ) => {
                (cut, len) = (c.to_string(), new_len.to_string());
                offsets = ranges.iter().map(|(o, _)| o.to_string()).collect();
                let mut how: Vec<&[u8]> = vec![b"patch", cut.as_bytes(), len.as_bytes()];
                for ((_, bytes), o) in ranges.iter().zip(&offsets) {
                    how.push(o.as_bytes());
                    how.push(bytes);
                }
                how
            }
        };
        if let Some(lines) = self
            .commit_fast(path, opts.base.as_ref(), mode, opts.mtime_ns, &how)
            .await?
        {
            return Self::one_attr(&lines.0, path);
        }
        let content_fn = match (content, uploaded) {
            // `up` is ours: `.sbxfs-exec-` and hex digits only.
            (_, Some(up)) => format!(
                "UP=$ROOT/{up}\ntrap 'rm -f -- \"$UP\"' EXIT\ncontent() {{\ncat -- \"$UP\" >\"$1\" || return 1\n}}\n"
            ),
            (NewContent::Whole(data), None) => format!(
                "content() {{\nbase64 -d >\"$1\" <<'__SBX_DATA__' || return 1\n{}}}\n",
                heredoc_b64(&data)
            ),
            (
                NewContent::Patch {
                    cut,
                    new_len,
                    ranges,
                },
                None,
            ) => {
                // Cut to nothing: no base is read (a new file has none).
                let mut f = if cut == 0 {
                    String::from("content() {\n: >\"$1\" || return 1\n")
                } else {
                    // The base is copied in the sandbox (its holes kept where cp can: GNU).
                    let mut f = String::from(
                        "content() {\ncp --sparse=always -- \"$P\" \"$1\" 2>/dev/null || cat -- \"$P\" >\"$1\" || return 1\n",
                    );
                    f.push_str(&format!(
                        "s=$(wc -c <\"$1\") || return 1\n[ \"$s\" -le {cut} ] || truncate -s {cut} -- \"$1\" || return 1\n"
                    ));
                    f
                };
                for (off, bytes) in &ranges {
                    let (bs, seek) = dd_at(*off);
                    f.push_str(&format!(
                        "base64 -d <<'__SBX_DATA__' | dd of=\"$1\" bs={bs} seek={seek} conv=notrunc 2>/dev/null || return 1\n{}",
                        heredoc_b64(bytes)
                    ));
                }
                f.push_str(&format!("truncate -s {new_len} -- \"$1\"\n}}\n"));
                f
            }
        };
        // The new content's mtime, as touch takes it (ignored where touch cannot).
        let content_fn = match opts.mtime_ns {
            Some(ns) => format!(
                "MTIME=@{}.{:09}\n{content_fn}",
                ns.div_euclid(1_000_000_000),
                ns.rem_euclid(1_000_000_000)
            ),
            None => content_fn,
        };
        let lines = self
            .commit_with(path, opts.base.as_ref(), mode, &content_fn, "", &[])
            .await?;
        Self::one_attr(&lines.0, path)
    }

    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let m = octal(mode);
        let lines = self
            .namespace(path, &[b"create", path.as_bytes(), m.as_bytes()])
            .await?;
        Self::one_attr(&lines, path)
    }

    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr> {
        let m = octal(mode);
        let lines = self
            .namespace(path, &[b"mkdir", path.as_bytes(), m.as_bytes()])
            .await?;
        Self::one_attr(&lines, path)
    }

    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let m = octal(mode);
        let (major, minor) = (libc::major(rdev).to_string(), libc::minor(rdev).to_string());
        let lines = match kind {
            SpecialKind::Fifo => {
                self.namespace(path, &[b"mkfifo", path.as_bytes(), m.as_bytes()])
                    .await?
            }
            SpecialKind::Socket => {
                self.namespace(path, &[b"socket", path.as_bytes(), m.as_bytes()])
                    .await?
            }
            SpecialKind::CharDevice | SpecialKind::BlockDevice => {
                let t: &[u8] = if kind == SpecialKind::CharDevice {
                    b"c"
                } else {
                    b"b"
                };
                self.namespace(
                    path,
                    &[
                        b"mknod",
                        path.as_bytes(),
                        m.as_bytes(),
                        t,
                        major.as_bytes(),
                        minor.as_bytes(),
                    ],
                )
                .await?
            }
        };
        Self::one_attr(&lines, path)
    }

    async fn unlink(&self, path: &RemotePath) -> Result<()> {
        if path.is_root() {
            return Err(RemoteError::Invalid("unlink of the workspace root".into()));
        }
        self.namespace(path, &[b"unlink", path.as_bytes()])
            .await
            .map(drop)
    }

    async fn rmdir(&self, path: &RemotePath) -> Result<()> {
        if path.is_root() {
            return Err(RemoteError::Invalid("rmdir of the workspace root".into()));
        }
        self.namespace(path, &[b"rmdir", path.as_bytes()])
            .await
            .map(drop)
    }

    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()> {
        let m: &[u8] = match mode {
            RenameMode::Replace => b"replace",
            RenameMode::NoReplace => b"noreplace",
            RenameMode::Exchange => b"exchange",
        };
        if from.is_root() || to.is_root() {
            return Err(RemoteError::Invalid("rename of the workspace root".into()));
        }
        self.namespace(from, &[b"rename", from.as_bytes(), to.as_bytes(), m])
            .await
            .map(drop)
    }

    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr> {
        let lines = self
            .namespace(new, &[b"link", existing.as_bytes(), new.as_bytes()])
            .await?;
        Self::one_attr(&lines, new)
    }

    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) || target.len() > MAX_PATH_BYTES {
            return Err(RemoteError::Invalid(format!(
                "{}: a symlink target must be 1 to {MAX_PATH_BYTES} bytes without NUL",
                path.display()
            )));
        }
        let lines = self
            .namespace(path, &[b"symlink", path.as_bytes(), target])
            .await?;
        Self::one_attr(&lines, path)
    }

    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>> {
        let lines = self
            .namespace(path, &[b"readlink", path.as_bytes()])
            .await?;
        match lines.first().map(|l| word(l)) {
            Some(("L", t)) => unb64(t),
            _ => Err(malformed("readlink")),
        }
    }

    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr> {
        if attr.size.is_some_and(|s| s > i64::MAX as u64) {
            return Err(RemoteError::FileTooBig(path.display()));
        }
        let opt = |v: Option<String>| v.unwrap_or_default();
        let mode = opt(attr.mode.map(octal));
        let size = opt(attr.size.map(|s| s.to_string()));
        let atime = opt(attr.atime_ns.map(touch_time));
        let mtime = opt(attr.mtime_ns.map(touch_time));
        let uid = opt(attr.uid.map(|u| u.to_string()));
        let gid = opt(attr.gid.map(|g| g.to_string()));
        let lines = self
            .namespace(
                path,
                &[
                    b"setattr",
                    path.as_bytes(),
                    mode.as_bytes(),
                    size.as_bytes(),
                    atime.as_bytes(),
                    mtime.as_bytes(),
                    uid.as_bytes(),
                    gid.as_bytes(),
                ],
            )
            .await?;
        Self::one_attr(&lines, path)
    }

    async fn statfs(&self) -> Result<StatFs> {
        let lines = self.call("statfs", &[], &[STATFS]).await?;
        let line = match lines.first().map(|l| word(l)) {
            Some(("F", f)) => f,
            _ => return Err(malformed("statfs")),
        };
        let n: Vec<u64> = line
            .split(' ')
            .map(|s| s.parse().map_err(|_| malformed("statfs number")))
            .collect::<Result<_>>()?;
        let [block_size, blocks, blocks_free, blocks_available, files, files_free, name_max] =
            n[..]
        else {
            return Err(malformed("statfs fields"));
        };
        Ok(StatFs {
            block_size,
            blocks,
            blocks_free,
            blocks_available,
            files,
            files_free,
            name_max,
        })
    }

    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let args: [&[u8]; 3] = [b"get", path.as_bytes(), name];
        let lines = self.xattr_call(path, &args, &args).await?;
        match lines.first().map(|l| word(l)) {
            Some(("V", v)) => unb64(v),
            _ => Err(malformed("getxattr")),
        }
    }

    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>> {
        let args: [&[u8]; 2] = [b"list", path.as_bytes()];
        let lines = self.xattr_call(path, &args, &args).await?;
        lines
            .iter()
            .map(|l| match word(l) {
                ("X", x) => unb64(x),
                _ => Err(malformed("listxattr")),
            })
            .collect()
    }

    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        check_xattr_name(name)?;
        crate::remote::check_xattr_value(path, value)?;
        let v = b64(value);
        let flag: &[u8] = if flags.create {
            b"create"
        } else if flags.replace {
            b"replace"
        } else {
            b""
        };
        // The scripts take the value in base64; fast.py's arguments all travel so already.
        self.xattr_call(
            path,
            &[b"set", path.as_bytes(), name, value, flag],
            &[b"set", path.as_bytes(), name, v.as_bytes(), flag],
        )
        .await
        .map(drop)
    }

    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        let args: [&[u8]; 3] = [b"remove", path.as_bytes(), name];
        self.xattr_call(path, &args, &args).await.map(drop)
    }

    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(RemoteError::Invalid(format!(
                "{}: fallocate range",
                path.display()
            )));
        }
        let (o, l) = (offset.to_string(), len.to_string());
        let k: &[u8] = if keep_size { b"1" } else { b"0" };
        let lines = self
            .namespace(
                path,
                &[b"fallocate", path.as_bytes(), o.as_bytes(), l.as_bytes(), k],
            )
            .await?;
        let mut a = Self::one_attr(&lines, path)?;
        // attrs printed the (followed) file; its own name is the one asked for.
        a.symlink_target = None;
        Ok(a)
    }

    async fn copy_range(
        &self,
        src: &RemotePath,
        src_offset: u64,
        dst: &RemotePath,
        dst_offset: u64,
        len: u64,
        dst_base: Option<Version>,
    ) -> Result<(u64, Attr)> {
        let (bs, seek) = dd_at(dst_offset);
        let content_fn = format!(
            "content() {{\nif [ -e \"$P\" ]; then cat -- \"$P\" >\"$1\" || return 1; fi\n\
             tail -c +$(({src_offset} + 1)) -- \"$SRC\" | head -c {len} | dd of=\"$1\" bs={bs} seek={seek} conv=notrunc 2>/dev/null || return 1\n}}\n"
        );
        if [src_offset, dst_offset, len]
            .iter()
            .any(|v| *v > i64::MAX as u64)
            || dst_offset
                .checked_add(len)
                .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(RemoteError::FileTooBig(dst.display()));
        }
        let (so, l, d) = (
            src_offset.to_string(),
            len.to_string(),
            dst_offset.to_string(),
        );
        let how: [&[u8]; 5] = [
            b"copy",
            src.as_bytes(),
            so.as_bytes(),
            l.as_bytes(),
            d.as_bytes(),
        ];
        let fast = self
            .commit_fast(dst, dst_base.as_ref(), 0o644, None, &how)
            .await?;
        let lines = match fast {
            Some(lines) => lines,
            None => {
                let pre = format!(
                    "at \"$1\"\n[ -e \"$P\" ] || [ -L \"$P\" ] || fail ENOENT \"$1\"\nat \"$5\"\nfollow\n[ -e \"$P\" ] || fail ENOENT \"$5\"\n[ -d \"$P\" ] && fail EISDIR \"$5\"\n\
                     [ -f \"$P\" ] || fail EINVAL \"$5: not a regular file\"\nSRC=$P\n\
                     sz=$(stat -L -c %s -- \"$SRC\") || fail EIO \"$5\"\n\
                     COPIED=$(( sz > {src_offset} ? (sz - {src_offset} < {len} ? sz - {src_offset} : {len}) : 0 ))\n"
                );
                self.commit_with(
                    dst,
                    dst_base.as_ref(),
                    0o644,
                    &content_fn,
                    &pre,
                    &[src.as_bytes()],
                )
                .await?
            }
        };
        let copied = lines
            .0
            .iter()
            .find_map(|l| match word(l) {
                ("C", c) => c.parse::<u64>().ok(),
                _ => None,
            })
            .ok_or_else(|| malformed("copy_range without a count"))?;
        let attr = Self::one_attr(
            &lines
                .0
                .iter()
                .filter(|l| !l.starts_with("C "))
                .cloned()
                .collect::<Vec<_>>(),
            dst,
        )?;
        Ok((copied, attr))
    }

    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult> {
        req.validate()?;
        let start = req.start_line.to_string();
        let end = req.end_line.map(|e| e.to_string()).unwrap_or_default();
        let max = req.max_bytes.to_string();
        let args: [&[u8]; 5] = [
            path.as_bytes(),
            start.as_bytes(),
            end.as_bytes(),
            max.as_bytes(),
            SCAN.as_bytes(),
        ];
        // Where python runs, scan.sh reads the file fast.py opened by directory descriptors.
        let lines = self
            .fast_else_script(path, "scan", &args, SCAN_RUN, &args)
            .await?;
        let window = match lines.first().map(|l| word(l)) {
            Some(("W", w)) => unb64(w)?,
            _ => return Err(malformed("scan")),
        };
        super::query::parse_scan(&window, &path.display())
    }

    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>> {
        crate::search::grep::build_matcher(&opts)?;
        use crate::search::grep::MAX_CONTEXT_LINES;
        if opts.before_context > MAX_CONTEXT_LINES || opts.after_context > MAX_CONTEXT_LINES {
            // As the local search reports it (in the stream), before anything crosses.
            let e = SearchError::LimitExceeded(format!(
                "context is limited to {MAX_CONTEXT_LINES} lines"
            ));
            return Ok(stream::iter([Err(e.into())]).boxed());
        }
        // ripgrep in the sandbox where it gives the agent's answer; else the files cross.
        let probe = self.probe().await?;
        if let Some(events) =
            super::query::grep_in_sandbox(&*self.runner, probe, path, &opts).await?
        {
            return Ok(stream::iter(events.into_iter().map(Ok)).boxed());
        }
        let snap = super::query::grep_snapshot(self, &*self.runner, probe, path, &opts).await?;
        crate::remote::source_query::grep(&snap, path, opts)
    }

    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
        let snap = super::query::snapshot(self, path, false).await?;
        crate::remote::source_query::glob(&snap, path, pattern)
    }

    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>> {
        crate::search::fuzzy::Query::new(&req.query)?;
        let snap = super::query::snapshot(self, path, false).await?;
        crate::remote::source_query::fuzzy(&snap, path, req)
    }

    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize> {
        // Where python runs, by directory descriptors (the file read and replaced in the
        // directory walked to, which a swapped symlink cannot move out of the workspace).
        let temp = self.temp_name();
        let all: &[u8] = if replace_all { b"1" } else { b"0" };
        let args: [&[u8]; 5] = [
            path.as_bytes(),
            old.as_bytes(),
            new.as_bytes(),
            all,
            temp.as_bytes(),
        ];
        if let Some(lines) = self.fast(&path.display(), "edit", &args).await? {
            let said = lines.iter().find_map(|l| l.strip_prefix("R "));
            return match said.and_then(|j| super::edit::answer(j, &path.display())) {
                Some(Ok(n)) => Ok(n),
                Some(Err(e)) => Err(e.into()),
                None => Err(malformed("edit")),
            };
        }
        let abs = match self.resolve(path).await {
            Ok(a) => a,
            Err(RemoteError::NotFound(p)) => return Err(SearchError::NotFound(p).into()),
            Err(e) => return Err(e),
        };
        super::edit::edit(&*self.runner, &abs, old, new, replace_all).await
    }

    async fn watch(&self, _since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>> {
        Err(RemoteError::Unsupported(
            "no change feed through exec: the mount revalidates by polling".into(),
        ))
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_XATTR_NAME_BYTES {
        return Err(RemoteError::NameTooLong("an attribute name".into()));
    }
    if name.is_empty() || name.contains(&0) {
        return Err(RemoteError::Invalid("an attribute name".into()));
    }
    Ok(())
}

/// The absolute path of `path` under the probed root (for transports' native file moves).
pub async fn absolute(remote: &ScriptRemote, path: &RemotePath) -> Result<Vec<u8>> {
    let probe = remote.probe().await?;
    Ok(remote.abs(probe, path))
}

/// `scripts/read.sh`'s answer: the range with the version it was read at, `None` when the
/// file changed during the read (the stat lines before and after differ).
fn parse_raw_read(out: &super::Output, shown: &str, len: u32) -> Result<Option<ReadResult>> {
    const MARKER: &[u8] = b"\n__RESULT__\n";
    if out.stdout_cut > 0 {
        return Err(RemoteError::TooLarge(format!(
            "{shown}: the answer passed {} bytes",
            super::OUTPUT_CAP
        )));
    }
    let mut all = Vec::with_capacity(out.stdout.len() + 1);
    all.push(b'\n');
    all.extend_from_slice(&out.stdout);
    // The first marker is the program's: the file's bytes (which may hold one) come after it.
    let body = memchr::memmem::find(&all, MARKER).map(|at| &all[at + MARKER.len()..]);
    let Some(body) = body.and_then(|b| b.strip_prefix(b"ok\n")) else {
        // An error, or no answer: the strict parser says which.
        super::program::parse(out, shown)?;
        return Err(malformed("read"));
    };
    let nl = memchr::memchr(b'\n', body).ok_or_else(|| malformed("read: no stat line"))?;
    let before = std::str::from_utf8(&body[..nl])
        .ok()
        .and_then(|l| l.strip_prefix("S "))
        .ok_or_else(|| malformed("read: no stat line"))?;
    let rest = body[nl + 1..]
        .strip_suffix(b"\n")
        .ok_or_else(|| malformed("read: no end line"))?;
    let end = memchr::memrchr(b'\n', rest).ok_or_else(|| malformed("read: no end line"))?;
    let (data, last) = (&rest[..end], &rest[end + 1..]);
    let last = std::str::from_utf8(last)
        .ok()
        .and_then(|l| l.strip_prefix("E "))
        .ok_or_else(|| malformed("read: no end line"))?;
    let (rc, after) = last
        .split_once(' ')
        .ok_or_else(|| malformed("read: end line"))?;
    let rc: u32 = rc.parse().map_err(|_| malformed("read: tail's status"))?;
    // 0, or a signal (tail stopped by the pipe once `head` had its bytes).
    if rc != 0 && rc < 128 {
        return Err(RemoteError::Io(
            shown.to_string(),
            "Input/output error".into(),
        ));
    }
    if data.len() > len as usize {
        return Err(malformed("more bytes than asked"));
    }
    if after != before {
        return Ok(None);
    }
    let attr = parse_attr(before, None)?;
    Ok(Some(ReadResult {
        data: Bytes::copy_from_slice(data),
        version: attr.version,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dd_lands_ranges_exactly() {
        assert_eq!(dd_at(0), (MAX_DD_BLOCK, 0));
        assert_eq!(dd_at(4096), (4096, 1));
        assert_eq!(dd_at(3), (1, 3));
        assert_eq!(dd_at(1 << 20), (MAX_DD_BLOCK, 16));
        let (bs, seek) = dd_at(12_288);
        assert_eq!(bs * seek, 12_288);
    }

    #[test]
    fn touch_times_keep_nanoseconds() {
        assert_eq!(touch_time(1_500_000_000), "1.500000000");
        assert_eq!(touch_time(-1_500_000_000), "-1.500000000");
    }
}
