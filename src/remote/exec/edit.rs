//! `edit` through exec: `scripts/edit.py` in the sandbox, or download → replace with the Rust
//! core → atomic upload where it cannot run.
//!
//! The script's text and every argument travel as base64 (the script is `exec`ed by a short
//! `python3 -c` bootstrap, so no file is left behind and nothing user-controlled is ever parsed
//! by a shell). The fallback runs when python3 is missing (exit 126/127, or the shell's "not
//! found" on stderr), when the script reports `write_failed` (it left the target untouched), or
//! when the transport failed; it answers the same counts, errors and bytes, because both follow
//! [`crate::search::edit`]'s rules.

use base64::Engine;

use super::{RunControl, Runner};
use crate::remote::{RemoteError, Result};
use crate::search::edit::{replace_in, MAX_EDIT_FILE_BYTES};
use crate::search::SearchError;

/// Longest single command argument Linux accepts (`MAX_ARG_STRLEN`, the terminating NUL
/// included): the base64 of `old` and of `new` must each fit.
pub const MAX_ARG_BYTES: usize = 128 * 1024;

const EDIT_PY: &str = include_str!("../../../scripts/edit.py");

/// Runs the base64 script given as its first argument as `__main__`, with the rest as its argv.
/// (No single quote in it: the program holds it in single quotes.)
const BOOTSTRAP: &str = "import base64,sys\nsrc=base64.b64decode(sys.argv.pop(1))\nsys.argv[0]=\"edit.py\"\nexec(compile(src,\"edit.py\",\"exec\"),{\"__name__\":\"__main__\"})";

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn shown(abs_path: &[u8]) -> String {
    String::from_utf8_lossy(abs_path).into_owned()
}

/// Replace `old` by `new` (once, or everywhere) in the file at the absolute path `abs_path`
/// in the sandbox; answers the replacements made.
pub async fn edit(
    runner: &dyn Runner,
    abs_path: &[u8],
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<usize> {
    for (what, s) in [("old", old), ("new", new)] {
        let encoded = s.len().div_ceil(3) * 4;
        if encoded >= MAX_ARG_BYTES {
            return Err(SearchError::LimitExceeded(format!(
                "the {what} string is {} bytes: as a command argument (base64, {encoded} bytes) \
                 it passes the sandbox's limit of {MAX_ARG_BYTES} bytes for one argument: split the edit",
                s.len()
            ))
            .into());
        }
    }
    if old.is_empty() {
        return Err(SearchError::InvalidArgs("the string to replace is empty".into()).into());
    }
    match run_script(runner, abs_path, old, new, replace_all).await {
        Ok(ScriptAnswer::Count(n)) => Ok(n),
        Ok(ScriptAnswer::Failed(SearchError::WriteFailed(..))) => {
            fallback(runner, abs_path, old, new, replace_all).await
        }
        Ok(ScriptAnswer::Failed(e)) => Err(e.into()),
        Ok(ScriptAnswer::NoPython) => fallback(runner, abs_path, old, new, replace_all).await,
        // The run never reached the sandbox, or its answer was lost: the script writes
        // atomically, so the file is either edited or untouched. (A timeout is not retried: the
        // script may still be running.)
        Err(RemoteError::Transport(_)) => fallback(runner, abs_path, old, new, replace_all).await,
        Err(e) => Err(e),
    }
}

enum ScriptAnswer {
    Count(usize),
    Failed(SearchError),
    NoPython,
}

async fn run_script(
    runner: &dyn Runner,
    abs_path: &[u8],
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<ScriptAnswer> {
    let program = format!(
        "exec python3 -c '{BOOTSTRAP}' '{}' '{}' '{}' '{}' '{}'\n",
        b64(EDIT_PY.as_bytes()),
        b64(abs_path),
        b64(old.as_bytes()),
        b64(new.as_bytes()),
        b64(if replace_all { b"1" } else { b"0" }),
    );
    let out = runner.run(&program, &RunControl::default()).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result_line = stdout.strip_prefix("__RESULT__");
    if result_line.is_none() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.code == 126
            || out.code == 127
            || (out.code == 0 && out.stdout.is_empty() && stderr.contains("not found"))
        {
            return Ok(ScriptAnswer::NoPython);
        }
    }
    let malformed = |why: &str| {
        RemoteError::Io(
            shown(abs_path),
            format!(
                "edit.py in the sandbox ({}) {why}: exit {}, stderr {:?}",
                runner.describe(),
                out.code,
                String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(500)])
            ),
        )
    };
    let line = match result_line {
        Some(l) if out.code == 0 && l.ends_with('\n') && l.matches('\n').count() == 1 => l,
        _ => return Err(malformed("gave no result line")),
    };
    match answer(line.trim_end(), &shown(abs_path)) {
        Some(Ok(n)) => Ok(ScriptAnswer::Count(n)),
        Some(Err(e)) => Ok(ScriptAnswer::Failed(e)),
        None => Err(malformed("gave a malformed result")),
    }
}

/// edit.py's JSON answer (fast.py's `edit` gives the same): the replacements made, or the
/// error it names; `None` when it is neither.
pub(super) fn answer(json: &str, path: &str) -> Option<std::result::Result<usize, SearchError>> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    if let Some(n) = v.get("count").and_then(serde_json::Value::as_u64) {
        if v.get("error").is_none() {
            return Some(Ok(n as usize));
        }
    }
    let token = v.get("error")?.as_str()?;
    let message = v
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let count = v
        .get("count")
        .and_then(serde_json::Value::as_u64)
        .map(|n| n as usize);
    let path = path.to_string();
    Some(Err(match token {
        "not_found" => SearchError::NotFound(path),
        "read_failed" => SearchError::ReadFailed(path, message.into()),
        "write_failed" => SearchError::WriteFailed(path, message.into()),
        "string_not_found" => SearchError::StringNotFound,
        "multiple_occurrences" => SearchError::MultipleOccurrences(count?),
        "invalid_args" => SearchError::InvalidArgs(message.into()),
        _ => return None,
    }))
}

/// What the fallback learns of the target before it replaces.
struct Target {
    /// The symlink-resolved path (the file written; a link to it stays a link).
    path: Vec<u8>,
    /// `stat -c '%a %u %g %s %Y %i'` of the target: mode kept, and checked unchanged at commit.
    stat: String,
    mode: String,
    owner: String,
}

/// The fallback's first step: resolve, check and (without a native download) read the target.
/// `$1` the base64 path, `$2` "1" to print the content's base64 after the header.
const READ_TARGET_SH: &str = r#"set -u
p=$(printf %s "$1" | base64 -d && echo x) || { echo "__RESULT__ error transport base64"; exit 0; }
p=${p%x}
if [ ! -e "$p" ]; then echo "__RESULT__ error not_found"; exit 0; fi
t=$(readlink -f -- "$p" && echo x) || { echo "__RESULT__ error read_failed cannot resolve"; exit 0; }
t=${t%?x}
if [ -d "$t" ] || [ ! -f "$t" ]; then echo "__RESULT__ error read_failed not a regular file"; exit 0; fi
s=$(stat -c '%a %u %g %s %Y %i' -- "$t") || { echo "__RESULT__ error read_failed cannot stat"; exit 0; }
tb=$(printf %s "$t" | base64 | tr -d '\n')
echo "__RESULT__ ok $tb $s"
if [ "$2" = 1 ]; then base64 < "$t" || exit 3; fi
"#;

/// The fallback's last step: `$1` base64 target, `$2` its stat line as read (unchanged, or
/// nothing is written), `$3` the mode, `$4` owner uid:gid, `$5` the base64 temp path when the
/// transport uploaded it natively, else `$6` the content's base64.
const COMMIT_SH: &str = r#"set -u
t=$(printf %s "$1" | base64 -d && echo x) || exit 3
t=${t%x}
now=$(stat -c '%a %u %g %s %Y %i' -- "$t" 2>/dev/null) || now=gone
if [ "$now" != "$2" ]; then
  if [ -n "$5" ]; then tmp=$(printf %s "$5" | base64 -d && echo x) && rm -f -- "${tmp%x}"; fi
  echo "__RESULT__ error conflict"; exit 0
fi
if [ -n "$5" ]; then
  tmp=$(printf %s "$5" | base64 -d && echo x) || exit 3
  tmp=${tmp%x}
else
  d=${t%/*}
  [ -n "$d" ] || d=/
  b=${t##*/}
  tmp=$(mktemp "$d/.$b.sbxfs-XXXXXX") || { echo "__RESULT__ error write_failed cannot create a temp file beside the target"; exit 0; }
  if ! printf %s "$6" | base64 -d > "$tmp"; then rm -f -- "$tmp"; echo "__RESULT__ error write_failed cannot write the temp file"; exit 0; fi
fi
chmod "$3" -- "$tmp" 2>/dev/null || chmod "$3" "$tmp" || { rm -f -- "$tmp"; echo "__RESULT__ error write_failed cannot set the mode"; exit 0; }
chown "$4" -- "$tmp" 2>/dev/null || :
sync -- "$tmp" 2>/dev/null || :
if mv -f -- "$tmp" "$t"; then echo "__RESULT__ ok"; else rm -f -- "$tmp"; echo "__RESULT__ error write_failed cannot rename over the target"; fi
"#;

/// `script` preceded by `set --` giving its positional arguments (each is base64 or a token
/// this module wrote, so single quotes hold them).
fn with_args(script: &str, args: &[&str]) -> String {
    let mut p = String::from("set --");
    for a in args {
        debug_assert!(!a.contains('\''));
        p.push_str(" '");
        p.push_str(a);
        p.push('\'');
    }
    p.push('\n');
    p.push_str(script);
    p
}

fn header_error(abs_path: &[u8], rest: &str) -> RemoteError {
    let (token, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let path = shown(abs_path);
    match token {
        "not_found" => SearchError::NotFound(path).into(),
        "read_failed" => SearchError::ReadFailed(path, message.into()).into(),
        "write_failed" => SearchError::WriteFailed(path, message.into()).into(),
        "conflict" => RemoteError::Conflict {
            path,
            base: "the version edited".into(),
            current: "changed during the edit".into(),
        },
        _ => RemoteError::Io(path, format!("edit: {rest}")),
    }
}

async fn read_target(
    runner: &dyn Runner,
    abs_path: &[u8],
    with_content: bool,
) -> Result<(Target, Option<Vec<u8>>)> {
    let program = with_args(
        READ_TARGET_SH,
        &[&b64(abs_path), if with_content { "1" } else { "0" }],
    );
    let out = runner.run(&program, &RunControl::default()).await?;
    let bad = |why: &str| {
        RemoteError::Io(
            shown(abs_path),
            format!(
                "edit: reading the file through {}: {why} (exit {})",
                runner.describe(),
                out.code
            ),
        )
    };
    if out.stdout_cut > 0 {
        return Err(bad("the file is too large to move through this transport"));
    }
    let text = std::str::from_utf8(&out.stdout).map_err(|_| bad("a malformed answer"))?;
    let (header, body) = text.split_once('\n').ok_or_else(|| bad("no answer"))?;
    let rest = header
        .strip_prefix("__RESULT__ ")
        .ok_or_else(|| bad("no result line"))?;
    if out.code != 0 {
        return Err(bad("the read failed"));
    }
    if let Some(e) = rest.strip_prefix("error ") {
        return Err(header_error(abs_path, e));
    }
    let f: Vec<&str> = rest
        .strip_prefix("ok ")
        .ok_or_else(|| bad("a malformed result"))?
        .split(' ')
        .collect();
    let [tb, mode, uid, gid, size, _mtime, _ino] = f[..] else {
        return Err(bad("a malformed result"));
    };
    let decode = |s: &str| {
        let clean: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map_err(|_| bad("malformed base64"))
    };
    let size: u64 = size.parse().map_err(|_| bad("a malformed size"))?;
    if size > MAX_EDIT_FILE_BYTES {
        return Err(SearchError::ReadFailed(
            shown(abs_path),
            format!("larger than {MAX_EDIT_FILE_BYTES} bytes"),
        )
        .into());
    }
    let valid_mode =
        !mode.is_empty() && mode.len() <= 4 && mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !valid_mode || !numeric(uid) || !numeric(gid) {
        return Err(bad("a malformed result"));
    }
    let target = Target {
        path: decode(tb)?,
        stat: f[1..].join(" "),
        mode: mode.to_string(),
        owner: format!("{uid}:{gid}"),
    };
    let content = if with_content {
        Some(decode(body)?)
    } else {
        None
    };
    Ok((target, content))
}

async fn fallback(
    runner: &dyn Runner,
    abs_path: &[u8],
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<usize> {
    let (target, _) = read_target(runner, abs_path, false).await?;
    let bytes = match runner.get_file(&target.path).await {
        Some(r) => r?.to_vec(),
        None => match read_target(runner, abs_path, true).await? {
            (again, Some(c)) if again.stat == target.stat && again.path == target.path => c,
            _ => return Err(header_error(abs_path, "conflict")),
        },
    };
    if bytes.len() as u64 > MAX_EDIT_FILE_BYTES {
        return Err(SearchError::ReadFailed(shown(abs_path), "too large".into()).into());
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| SearchError::ReadFailed(shown(abs_path), "not valid UTF-8".into()))?;
    let (updated, count) = replace_in(text, old, new, replace_all)?;
    let updated = bytes::Bytes::from(updated.into_bytes());

    let tb = b64(&target.path);
    let mut uploaded = String::new();
    if let Some(tmp) = temp_beside(&target.path) {
        if let Some(r) = runner.put_file(&tmp, updated.clone()).await {
            r.map_err(|e| SearchError::WriteFailed(shown(abs_path), e.to_string()))?;
            uploaded = b64(&tmp);
        }
    }
    let inline = if uploaded.is_empty() {
        b64(&updated)
    } else {
        String::new()
    };
    let program = with_args(
        COMMIT_SH,
        &[
            &tb,
            &target.stat,
            &target.mode,
            &target.owner,
            &uploaded,
            &inline,
        ],
    );
    let out = runner.run(&program, &RunControl::default()).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim_end().strip_prefix("__RESULT__ ") {
        Some("ok") if out.code == 0 => Ok(count),
        Some(rest) if out.code == 0 && rest.starts_with("error ") => {
            Err(header_error(abs_path, &rest["error ".len()..]))
        }
        _ => Err(RemoteError::Io(
            shown(abs_path),
            format!(
                "edit: the commit through {} gave no result (exit {})",
                runner.describe(),
                out.code
            ),
        )),
    }
}

/// A fresh temp name in `target`'s directory, for a native upload before the rename.
fn temp_beside(target: &[u8]) -> Option<Vec<u8>> {
    let slash = target.iter().rposition(|&b| b == b'/')?;
    let (dir, name) = (&target[..slash], &target[slash + 1..]);
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).ok()?;
    let mut t = dir.to_vec();
    t.extend_from_slice(b"/.");
    t.extend_from_slice(&name[..name.len().min(100)]);
    t.extend_from_slice(b".sbxfs-");
    t.extend(nonce.iter().flat_map(|b| format!("{b:02x}").into_bytes()));
    t.extend_from_slice(b".tmp");
    Some(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bootstrap_fits_in_single_quotes() {
        assert!(!super::BOOTSTRAP.contains('\''));
    }
}
