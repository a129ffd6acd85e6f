//! The python3 fast path (`scripts/fast.py`): stat / list / tree / read, commits, namespace
//! changes and xattrs, for sandboxes where the probe found python 3.6 or later (`python3`,
//! else `python`).
//!
//! Why: one python process lstat's a whole tree through directory descriptors, where the sh
//! scripts pipe every path through `xargs stat`; it also knows what the shell tools do not —
//! nanosecond times where only busybox's `stat` is installed, whether an entry has extended
//! attributes (`listxattr`), and paths past `PATH_MAX` (walked with `openat`, one component at
//! a time, a symlink on the way followed by hand and refused when it leaves the workspace).
//!
//! How it travels: the program pipes a single-quoted variable into `PY -c BOOTSTRAP`; it holds
//! the script and every argument in base64, one per line, ended by `END` (a cut program is
//! refused, never half read); no user-controlled byte reaches a shell's or python's syntax. Its answer
//! uses lib.sh's framing (`__RESULT__`, then `ok` or `err TOKEN TEXT`) and
//! [`super::program::parse`]. Attribute lines are the sh path's own (`stat -c "$SF"` at the
//! probe's precision), so a version is the same whichever path made it: switching paths never
//! makes a file look changed.

use super::program::{b64, malformed, unb64};
use super::statline::{parse_attr, Precision};
use crate::remote::{check_entry_name, Attr, FileKind, RemoteError, WireBytes};

const FAST_PY: &str = include_str!("scripts/fast.py");

/// Reads standard input: line 1 the script (zlib, base64), the rest its items (no single
/// quote in it: the program holds it in single quotes).
const BOOTSTRAP: &str = "import base64,sys,zlib\nd=sys.stdin.buffer.read().split(b\"\\n\")\nexec(compile(zlib.decompress(base64.b64decode(d[0])),\"fast.py\",\"exec\"),{\"__name__\":\"__main__\",\"ITEMS\":d[1:]})";

/// `fast.py` as it travels with every call: its comment lines dropped, zlib-compressed
/// (python's `zlib` is always built in), base64 — about 3 kB instead of 10.6 kB of base64,
/// which is most of what a metadata call sends over a slow link.
fn packed_script() -> &'static str {
    static PACKED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PACKED.get_or_init(|| {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(super::program::strip_comments(FAST_PY).as_bytes())
            .expect("compressing into memory");
        b64(&z.finish().expect("compressing into memory"))
    })
}

/// The interpreter names the probe may answer (so the name put in a program is a fixed word).
pub const PYTHONS: [&str; 2] = ["python3", "python"];

/// What the fast path reads on its standard input for one operation (`stat`, `list`, `tree`
/// or `listings`): the packed script, then the items, one per line, ended by `END`. A
/// session's python3 server runs it as it is ([`super::Runner::run_python_inline`]); no
/// single quote in it (a program holds it in single quotes).
pub fn input(root: &[u8], precision: Precision, op: &str, args: &[&[u8]]) -> String {
    let mut p = String::with_capacity(packed_script().len() + 512);
    p.push_str(packed_script());
    p.push('\n');
    p.push_str(&b64(root));
    p.push('\n');
    p.push_str(match precision {
        Precision::Nanos => "ns\n",
        Precision::Seconds => "s\n",
    });
    p.push_str(op);
    p.push('\n');
    for a in args {
        p.push_str(&b64(a));
        p.push('\n');
    }
    p.push_str("END\n");
    p
}

/// The whole program of one fast-path operation (`stat`, `list` or `tree`), for a runner
/// with no python of its own running: [`input`] piped to a new interpreter.
pub fn program(
    python: &str,
    root: &[u8],
    precision: Precision,
    op: &str,
    args: &[&[u8]],
) -> String {
    debug_assert!(PYTHONS.contains(&python));
    let items = input(root, precision, op, args);
    // A quoted variable piped by the shell's own printf, not a here-document: dash writes a
    // here-document past the pipe's size from a child it never waits for, and that zombie
    // keeps the supervisor polling for the job's group to go (base64 holds no single quote).
    // (printf's `\n` puts back the newline the quotes' last line lacks.)
    format!(
        "__sbx_items='{}'\nprintf '%s\\n' \"$__sbx_items\" | {python} -c '{BOOTSTRAP}'\n",
        items.strip_suffix('\n').unwrap_or(&items)
    )
}

fn word(line: &str) -> (&str, &str) {
    line.split_once(' ').unwrap_or((line, ""))
}

/// An `X` line: whether the entry has extended attributes.
fn xattr_flag(v: &str) -> Result<bool, RemoteError> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(malformed("an xattr flag")),
    }
}

/// Apply an `L` or `X` line to the attributes it follows; false for another line.
pub fn extra_line(attr: &mut Attr, line: &str) -> Result<bool, RemoteError> {
    match word(line) {
        ("L", t) if attr.kind == FileKind::Symlink && attr.symlink_target.is_none() => {
            attr.symlink_target = Some(WireBytes(unb64(t)?));
            Ok(true)
        }
        ("L", _) => Err(malformed("a link target without a link")),
        ("X", x) if attr.has_xattrs.is_none() => {
            attr.has_xattrs = Some(xattr_flag(x)?);
            Ok(true)
        }
        ("X", _) => Err(malformed("a second xattr flag")),
        _ => Ok(false),
    }
}

/// The `N name` / `S line` / [`L target`] / [`X flag`] groups of a listing or a tree: each
/// name (a tree's: relative to the listed directory, checked component by component) and its
/// attributes, but a commit's temp file ([`super::remote::is_temp_name`]). A symlink must come
/// with its target.
pub fn entries(lines: &[String]) -> Result<Vec<(Vec<u8>, Attr)>, RemoteError> {
    let mut out: Vec<(Vec<u8>, Attr)> = Vec::new();
    let mut it = lines.iter().peekable();
    while let Some(line) = it.next() {
        let ("N", n) = word(line) else {
            return Err(malformed("an entry without its name"));
        };
        let name = unb64(n)?;
        if name.is_empty() {
            return Err(malformed("an empty name"));
        }
        for part in name.split(|b| *b == b'/') {
            check_entry_name(part).map_err(malformed)?;
        }
        let mut attr = match it.next().map(|l| word(l)) {
            Some(("S", s)) => parse_attr(s, None)?,
            _ => return Err(malformed("an entry without its attributes")),
        };
        while let Some(l) = it.peek() {
            if !extra_line(&mut attr, l)? {
                break;
            }
            it.next();
        }
        if attr.kind == FileKind::Symlink && attr.symlink_target.is_none() {
            return Err(malformed("a link without its target"));
        }
        if !super::remote::is_temp_name(&name) {
            out.push((name, attr));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    const FILE: &str = "81a4 17 1000 1000 1.5 1796105219.164717640 3.000000001 2049 1234 1 0 0";
    const LINK: &str = "a1ff 1 1000 1000 1 2 3 2049 1235 1 0 0";

    #[test]
    fn groups_carry_names_targets_and_xattr_flags() {
        let got = entries(&lines(&[
            &format!("N {}", b64(b"a b")),
            &format!("S {FILE}"),
            "X 1",
            &format!("N {}", b64(b"d/l")),
            &format!("S {LINK}"),
            &format!("L {}", b64(b"x")),
        ]))
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, b"a b");
        assert_eq!(got[0].1.has_xattrs, Some(true));
        assert_eq!(got[1].1.has_xattrs, None);
        assert_eq!(got[1].1.symlink_target.as_ref().unwrap().0, b"x");
    }

    #[test]
    fn a_commits_temp_file_is_not_listed() {
        let group = |name: &[u8]| [format!("N {}", b64(name)), format!("S {FILE}")];
        let lines: Vec<String> = [
            &b".sbxfs-exec-3f-18c2a-0.tmp"[..],
            b"d/.sbxfs-exec-3f-18c2a-1.tmp",
            b".sbxfs-exec-notes",
            b"notes.tmp",
        ]
        .iter()
        .flat_map(|n| group(n))
        .collect();
        let names: Vec<Vec<u8>> = entries(&lines).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names, [&b".sbxfs-exec-notes"[..], b"notes.tmp"]);
    }

    #[test]
    fn forged_groups_are_refused() {
        let n = |s: &[u8]| format!("N {}", b64(s));
        for bad in [
            vec![n(b"a")],
            vec![n(b"../x"), format!("S {FILE}")],
            vec![n(b""), format!("S {FILE}")],
            vec![n(b"a"), format!("S {LINK}")],
            vec![n(b"a"), format!("S {FILE}"), format!("L {}", b64(b"x"))],
            vec![n(b"a"), format!("S {FILE}"), "X 1".into(), "X 0".into()],
            vec![n(b"a"), format!("S {FILE}"), "X 2".into()],
            vec![format!("S {FILE}")],
        ] {
            assert!(entries(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_program_holds_no_argument_in_clear() {
        let p = program(
            "python3",
            b"/w",
            Precision::Nanos,
            "stat",
            &[b"$(touch /tmp/x)'\"`"],
        );
        assert!(!p.contains("touch"));
        assert!(!p.contains('`'));
        assert!(!BOOTSTRAP.contains('\''));
        assert!(p.starts_with("__sbx_items='"));
        assert_eq!(
            p.matches('\'').count(),
            6,
            "the variable's and the bootstrap's quotes"
        );
    }
}
