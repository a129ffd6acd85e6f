//! Building an exec-only program and reading its answer.
//!
//! A program is static script text (`scripts/*.sh`) behind a prelude that sets `ROOT`, the
//! stat formats and the positional parameters from base64 literals: base64's alphabet has no
//! quote, `$` or backquote, so no user-controlled byte is ever part of the script's syntax.
//! The whole program is one `{ …; } </dev/null` group: the shell parses all of it before
//! running any of it (a program cut short in transit is a syntax error, never half run),
//! and no tool it starts can read the rest of the program from standard input.
//!
//! The answer is whatever the program printed after the one line `__RESULT__`: `ok` and
//! the answer's lines, or `err TOKEN TEXT`. Anything before the marker is ignored (a login
//! banner); a second marker, a missing one, a cut output or an unknown first word is a
//! malformed answer, reported as an error and never guessed at.

use base64::Engine;

use super::Output;
use crate::remote::RemoteError;

/// Helpers every program shares.
pub const LIB: &str = include_str!("scripts/lib.sh");

const MARKER: &[u8] = b"\n__RESULT__\n";

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decode base64 that a program printed (line breaks ignored).
pub fn unb64(text: &str) -> Result<Vec<u8>, RemoteError> {
    let clean: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|_| malformed("bad base64"))
}

pub fn malformed(what: &str) -> RemoteError {
    RemoteError::Transport(format!("malformed answer from the sandbox: {what}"))
}

/// The text of one program: the prelude, [`LIB`], then `parts` (static script text, or text
/// made of base64 and fixed words only).
pub fn build(root: &[u8], sf: &str, vf: &str, args: &[&[u8]], parts: &[&str]) -> String {
    let mut p = String::with_capacity(4096 + parts.iter().map(|s| s.len()).sum::<usize>());
    p.push_str("{\numask 077\nLC_ALL=C\nexport LC_ALL\nset -f\n");
    p.push_str("__d() { printf %s \"$1\" | base64 -d && printf x; }\n");
    let mut set = |name: &str, value: &[u8]| {
        p.push_str(&format!(
            "{name}=$(__d '{}') || exit 97\n{name}=${{{name}%x}}\n",
            b64(value)
        ));
    };
    set("ROOT", root);
    set("SF", sf.as_bytes());
    set("VF", vf.as_bytes());
    for (i, a) in args.iter().enumerate() {
        set(&format!("__a{i}"), a);
    }
    p.push_str("set --");
    for i in 0..args.len() {
        p.push_str(&format!(" \"$__a{i}\""));
    }
    p.push('\n');
    p.push_str(&strip_comments(LIB));
    for part in parts {
        p.push_str(&strip_comments(part));
        if !p.ends_with('\n') {
            p.push('\n');
        }
    }
    p.push_str("} </dev/null\n");
    p
}

/// `text` without its whole-line comments (a line whose first non-blank byte is `#`): they
/// would cross the link with every call. Only for the scripts' own text — `sh`, awk and
/// python, where such a line is a comment wherever it stands (the scripts hold no
/// here-document; base64 and fixed words hold no `#`).
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if !line.trim_start().starts_with('#') {
            out.push_str(line);
        }
    }
    out
}

/// A here-document that holds `data` in base64 (76-column lines, which can never be the
/// delimiter).
pub fn heredoc_b64(data: &[u8]) -> String {
    let text = b64(data);
    let mut out = String::with_capacity(text.len() + text.len() / 76 + 32);
    for chunk in text.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("__SBX_DATA__\n");
    out
}

/// The lines of a successful answer, or the error the program reported. `what` names the
/// operation's path for messages.
pub fn parse(out: &Output, what: &str) -> Result<Vec<String>, RemoteError> {
    if out.stdout_cut > 0 {
        return Err(RemoteError::TooLarge(format!(
            "{what}: the answer passed {} bytes",
            super::OUTPUT_CAP
        )));
    }
    let mut text = Vec::with_capacity(out.stdout.len() + 1);
    text.push(b'\n');
    text.extend_from_slice(&out.stdout);
    let mut found = memchr::memmem::find_iter(&text, MARKER);
    let Some(at) = found.next() else {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        let said = String::from_utf8_lossy(&out.stdout);
        let said = said.trim();
        // Output without a result (a banner, a profile's echo, a wrapper's own text) is not
        // "no answer": what came is quoted so the cause can be seen.
        let what_came = if said.is_empty() {
            "gave no answer".to_string()
        } else {
            format!(
                "printed something else than the program's result ({:?})",
                said.chars().take(120).collect::<String>()
            )
        };
        return Err(RemoteError::Transport(format!(
            "{what}: the sandbox's shell {what_came} (exit {}){}{}",
            out.code,
            if err.is_empty() { "" } else { ": " },
            err.chars().take(500).collect::<String>()
        )));
    };
    if found.next().is_some() {
        return Err(malformed("more than one result marker"));
    }
    let body = std::str::from_utf8(&text[at + MARKER.len()..])
        .map_err(|_| malformed("not ASCII after the marker"))?;
    let mut lines = body.lines();
    match lines.next() {
        Some("ok") => Ok(lines.map(str::to_string).collect()),
        Some(line) if line.starts_with("err ") => {
            let rest = &line[4..];
            let (token, message) = rest.split_once(' ').unwrap_or((rest, ""));
            Err(error_of(token, message, what))
        }
        _ => Err(malformed("no ok/err after the marker")),
    }
}

/// The error a program reported: an errno name, `SYS` with a tool's message (which ends in
/// the strerror text), or `EAGAIN` (changed while looked at: the caller may retry).
pub fn error_of(token: &str, message: &str, what: &str) -> RemoteError {
    let message = message.trim();
    if token == "CONFLICT" {
        return RemoteError::Conflict {
            path: what.to_string(),
            base: String::new(),
            current: message.to_string(),
        };
    }
    let errno = match token {
        "SYS" => errno_of_message(message),
        t => errno_of_name(t),
    };
    match errno {
        Some(libc::EAGAIN) => RemoteError::Transport(format!("{what}: {message}")),
        // The script's own words say which argument was wrong.
        Some(libc::EINVAL) if token != "SYS" && !message.is_empty() => {
            RemoteError::Invalid(message.to_string())
        }
        Some(e) => RemoteError::from_errno(e, what),
        None => RemoteError::Io(what.to_string(), message.to_string()),
    }
}

fn errno_of_name(name: &str) -> Option<i32> {
    Some(match name {
        "ENOENT" => libc::ENOENT,
        "EEXIST" => libc::EEXIST,
        "ENOTDIR" => libc::ENOTDIR,
        "EISDIR" => libc::EISDIR,
        "ENOTEMPTY" => libc::ENOTEMPTY,
        "EACCES" => libc::EACCES,
        "EPERM" => libc::EPERM,
        "EINVAL" => libc::EINVAL,
        "ENODATA" => libc::ENODATA,
        "EOPNOTSUPP" => libc::EOPNOTSUPP,
        "EAGAIN" => libc::EAGAIN,
        "EIO" => libc::EIO,
        _ => return None,
    })
}

/// The errno whose text ends `message` (tools print `tool: 'path': strerror`; the text after
/// the last ": " is the strerror, whatever the path holds). glibc's and musl's texts.
pub fn errno_of_message(message: &str) -> Option<i32> {
    let tail = message.rsplit(": ").next().unwrap_or(message).trim();
    if let Some(e) = errno_of_text(tail) {
        return Some(e);
    }
    // A tool that says more after the cause (`base64: write error: No space left on device`
    // and then `base64: write error`, the lines joined): the first part that begins with a
    // cause's text names it.
    message
        .split(": ")
        .skip(1)
        .find_map(|part| errno_of_text_prefix(part.trim()))
}

/// Causes the C library's `strerror` does not name as tools print them.
const EXTRA_CAUSES: &[(&str, i32)] = &[
    ("No such attribute", libc::ENODATA),
    // dash's "cannot create X: Directory nonexistent".
    ("Directory nonexistent", libc::ENOENT),
    ("Not supported", libc::EOPNOTSUPP),
    ("Operation not supported", libc::EOPNOTSUPP),
    ("Invalid cross-device link", libc::EXDEV),
    ("Cross-device link", libc::EXDEV),
    ("Filename too long", libc::ENAMETOOLONG),
    ("File name too long", libc::ENAMETOOLONG),
    ("Read-only file system", libc::EROFS),
];

fn strerror(e: i32) -> String {
    let s = std::io::Error::from_raw_os_error(e).to_string();
    s.split(" (os error").next().unwrap_or("").to_string()
}

/// The errno whose text `part` begins with, followed by nothing or a space.
fn errno_of_text_prefix(part: &str) -> Option<i32> {
    let starts = |t: &str| {
        part.strip_prefix(t)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    };
    if let Some((_, e)) = EXTRA_CAUSES.iter().find(|(t, _)| starts(t)) {
        return Some(*e);
    }
    (1..134).find(|&e| {
        let s = strerror(e);
        !s.is_empty() && starts(&s)
    })
}

/// The errno whose text is exactly `tail`.
fn errno_of_text(tail: &str) -> Option<i32> {
    if let Some((_, e)) = EXTRA_CAUSES.iter().find(|(t, _)| *t == tail) {
        return Some(*e);
    }
    if tail.contains("to a subdirectory of itself") {
        return Some(libc::EINVAL);
    }
    (1..134).find(|&e| {
        let s = strerror(e);
        !s.is_empty() && s == tail
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(stdout: &[u8]) -> Output {
        Output {
            stdout: stdout.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn text_before_the_marker_is_ignored() {
        let lines = parse(&out(b"banner\n__RESULT__\nok\nS 1\n"), "x").unwrap();
        assert_eq!(lines, vec!["S 1"]);
        let lines = parse(&out(b"__RESULT__\nok\n"), "x").unwrap();
        assert!(lines.is_empty());
    }

    #[test]
    fn output_without_a_result_is_quoted_not_called_no_answer() {
        let e = parse(&out(b"Welcome to the sandbox!\n"), "stat a").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(
                "printed something else than the program's result (\"Welcome to the sandbox!\")"
            ),
            "{m}"
        );
        let e = parse(&out(b""), "stat a").unwrap_err();
        assert!(e.to_string().contains("gave no answer"), "{e}");
    }

    #[test]
    fn a_second_marker_or_none_is_an_error() {
        assert!(parse(&out(b"__RESULT__\nok\n__RESULT__\nok\n"), "x").is_err());
        assert!(parse(&out(b"ok\n"), "x").is_err());
        assert!(parse(&out(b"__RESULT__\nmaybe\n"), "x").is_err());
        let cut = Output {
            stdout: b"__RESULT__\nok\n".to_vec(),
            stdout_cut: 1,
            ..Default::default()
        };
        assert!(parse(&cut, "x").is_err());
    }

    #[test]
    fn errors_map_by_token_and_by_strerror_text() {
        let e = parse(
            &out(b"__RESULT__\nerr SYS mkdir: cannot create directory 'a: b': File exists\n"),
            "a",
        );
        assert!(matches!(e, Err(RemoteError::Exists(_))), "{e:?}");
        let e = parse(&out(b"__RESULT__\nerr ENOTEMPTY d\n"), "d");
        assert!(matches!(e, Err(RemoteError::NotEmpty(_))));
        let e = parse(
            &out(
                b"__RESULT__\nerr SYS rmdir: 'x: No such file or directory': Directory not empty\n",
            ),
            "x",
        );
        assert!(matches!(e, Err(RemoteError::NotEmpty(_))));
    }

    #[test]
    fn a_cause_followed_by_more_words_still_names_the_errno() {
        // What `base64 -d >FILE` says on a full disk, its two lines joined by the script.
        let m = "/w/.t.tmp: base64: write error: No space left on device base64: write error";
        assert_eq!(errno_of_message(m), Some(libc::ENOSPC));
        let e = parse(&out(format!("__RESULT__\nerr SYS {m}\n").as_bytes()), "f");
        assert!(matches!(e, Err(RemoteError::NoSpace(_))), "{e:?}");
        let m = "cat: write error: Disk quota exceeded";
        assert_eq!(errno_of_message(m), Some(libc::EDQUOT));
        let m = "dd: failed to open 'x': Read-only file system";
        assert_eq!(errno_of_message(m), Some(libc::EROFS));
        // A word that merely starts like a cause is not one.
        assert_eq!(errno_of_message("tool: write error: No spaces here"), None);
    }

    #[test]
    fn arguments_reach_the_script_only_as_base64() {
        let p = build(b"/w", "%s", "%s", &[b"$(touch /tmp/x)'\"`"], &["echo"]);
        assert!(!p.contains("touch"));
        assert!(!p.contains('`'));
    }
}
