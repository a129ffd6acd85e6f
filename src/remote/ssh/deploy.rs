//! The agent sbxfs deploys into a sandbox over ssh, and finds again on the next mount.
//!
//! Layout in the sandbox, under the first of `$HOME/.cache/sbxfs` and `/tmp/sbxfs-UID` where a
//! file can be written *and executed* (a read-only or noexec home falls through to /tmp):
//!
//! ```text
//! BASE/VERSION/sbxfs                     the binary (0700), replaced only by a checked upload
//! BASE/VERSION/agents/KEY/{sock,token,pid,log}   one agent per workspace path (KEY hashes it)
//! ```
//!
//! The agent listens on `sock` only (no TCP port); the mount reaches it through a forwarding of
//! the ssh master. Its token is made here, fresh, and reaches the sandbox on the ssh command's
//! standard input (written 0600 by shell builtins); a second mount reads it back on standard
//! output. It never appears in a command line. The scripts are static text: every value
//! arrives as a quoted positional argument. The agent exits by itself after
//! [`AGENT_IDLE_EXIT`] without a client.

use std::time::Duration;

use super::master::{quote, Input, Master};
use crate::remote::{RemoteError, Result};

/// A deployed agent with no client for this long exits (a remount within it reuses it).
pub const AGENT_IDLE_EXIT: Duration = Duration::from_secs(30 * 60);
/// Longest one deploy step may take (the upload is the long one: tens of MB).
const STEP_DEADLINE: Duration = Duration::from_secs(600);

/// Find a usable directory and what it holds. Args: version dir name, expected `--version`
/// line, workspace key, workspace path. Answers `missing` (the workspace is not a directory:
/// nothing is made), `reuse SOCK` + the token on the next line, `start DIR`, `upload DIR`, or
/// `none`.
const PROBE: &str = r#"
set -u
[ -d "$4" ] || { echo "__RESULT__ missing"; exit 0; }
for base in "${HOME:-/nonexistent}/.cache/sbxfs" "/tmp/sbxfs-$(id -u)"; do
  d="$base/$1"
  mkdir -p "$d" 2>/dev/null && chmod 700 "$base" "$d" 2>/dev/null || continue
  if [ -x "$d/sbxfs" ] && [ "$("$d/sbxfs" --version 2>/dev/null)" = "$2" ]; then
    a="$d/agents/$3"
    if [ -S "$a/sock" ] && [ -f "$a/pid" ] && kill -0 "$(cat "$a/pid")" 2>/dev/null; then
      echo "__RESULT__ reuse $a/sock"; cat "$a/token"; exit 0
    fi
    echo "__RESULT__ start $d"; exit 0
  fi
  probe="$d/.probe.$$"
  if printf '#!/bin/sh\nexit 0\n' > "$probe" 2>/dev/null && chmod 700 "$probe" && "$probe"; then
    rm -f "$probe"; echo "__RESULT__ upload $d"; exit 0
  fi
  rm -f "$probe"
done
echo "__RESULT__ none"
"#;

/// Receive the binary on stdin into DIR ($1), check that it runs and says `$2`, then move it
/// into place (a half upload never becomes `sbxfs`).
const UPLOAD: &str = r#"
set -u
umask 077
t="$1/.sbxfs.$$"
cat > "$t" && chmod 700 "$t" || { rm -f "$t"; echo "__RESULT__ failed cannot write $1"; exit 0; }
v="$("$t" --version 2>&1)"
if [ "$v" != "$2" ]; then rm -f "$t"; echo "__RESULT__ failed does not run here: $v"; exit 0; fi
mv -f "$t" "$1/sbxfs" && echo "__RESULT__ ok"
"#;

/// Start the agent of DIR ($1) for workspace $2 (key $3, idle exit $4 s); the token is the
/// first line of stdin. An older agent of this workspace that no longer answers is stopped.
const START: &str = r#"
set -u
umask 077
a="$1/agents/$3"
mkdir -p "$a" && chmod 700 "$1/agents" "$a" || { echo "__RESULT__ failed cannot make $a"; exit 0; }
IFS= read -r tok || { echo "__RESULT__ failed no token"; exit 0; }
if [ -f "$a/pid" ]; then
  p="$(cat "$a/pid")"
  if [ -n "$p" ] && [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$1/sbxfs" ]; then kill "$p" 2>/dev/null; fi
fi
rm -f "$a/sock"
printf '%s\n' "$tok" > "$a/token"
cd /
if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi
$s nohup "$1/sbxfs" agent --root "$2" --listen "unix:$a/sock" --token-file "$a/token" \
  --exit-when-idle "$4" </dev/null >"$a/log" 2>&1 &
p=$!
echo "$p" > "$a/pid"
i=0
while [ ! -S "$a/sock" ]; do
  if ! kill -0 "$p" 2>/dev/null; then echo "__RESULT__ failed"; tail -n 5 "$a/log"; exit 0; fi
  i=$((i+1))
  if [ "$i" -gt 300 ]; then echo "__RESULT__ failed no socket after 30 s"; exit 0; fi
  sleep 0.1 2>/dev/null || sleep 1
done
echo "__RESULT__ started $a/sock"
"#;

/// Stop the agent whose socket is `$1` (`…/agents/KEY/sock`): the process its pid file
/// names, if that is the deployed sbxfs. Answers `stopped PID` or `gone`.
const STOP: &str = r#"
set -u
a=${1%/sock}
d=${a%/agents/*}
p=$(cat "$a/pid" 2>/dev/null) || p=
if [ -n "$p" ] && [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$d/sbxfs" ] && kill "$p" 2>/dev/null; then
  rm -f "$a/pid"; echo "__RESULT__ stopped $p"
else
  echo "__RESULT__ gone"
fi
"#;

/// Stop the deployed agent answering on `sock` in the sandbox; what was done, in words.
pub async fn stop(ssh: &Master, sock: &[u8]) -> Result<String> {
    let out = ssh
        .run(
            command(STOP, &[sock]),
            Input::Bytes(Vec::new()),
            Duration::from_secs(30),
        )
        .await?;
    let (said, _) = result(&out, "stop")?;
    let dir = String::from_utf8_lossy(sock.strip_suffix(b"/sock").unwrap_or(sock)).into_owned();
    Ok(match said.split_once(' ') {
        Some(("stopped", pid)) => format!("stopped the agent (pid {pid} in the sandbox, {dir})"),
        _ => format!("the agent ({dir}) had already exited"),
    })
}

/// Where the deployed agent answers, and its token.
pub struct Deployed {
    pub remote_socket: Vec<u8>,
    pub token: String,
    /// Whether an agent already running was found (no upload, no start).
    pub reused: bool,
}

/// Why no agent could be deployed: the caller falls back to the exec-only scripts.
pub struct NoAgent(pub String);

/// What sbxfs deploys, and how it names itself.
pub struct Binary {
    pub path: std::path::PathBuf,
    /// Its `--version` line, exactly.
    pub version: String,
}

impl Binary {
    pub fn of(path: std::path::PathBuf) -> Result<Binary> {
        let out = std::process::Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| RemoteError::Transport(format!("{}: {e}", path.display())))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || version.is_empty() {
            return Err(RemoteError::Transport(format!(
                "{}: --version failed",
                path.display()
            )));
        }
        Ok(Binary { path, version })
    }
}

/// The remote command line: `sh -c SCRIPT sbxfs ARGS…`, every piece quoted.
fn command(script: &str, args: &[&[u8]]) -> Vec<u8> {
    let mut c = b"sh -c ".to_vec();
    c.extend(quote(script.as_bytes()));
    c.extend_from_slice(b" sbxfs");
    for a in args {
        c.push(b' ');
        c.extend(quote(a));
    }
    c
}

/// The `__RESULT__` line's words after the marker, and the lines after it.
fn result(out: &crate::remote::exec::Output, step: &str) -> Result<(String, Vec<String>)> {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().skip_while(|l| !l.starts_with("__RESULT__ "));
    match lines.next() {
        Some(l) => Ok((
            l["__RESULT__ ".len()..].to_string(),
            lines.map(str::to_string).collect(),
        )),
        None => Err(RemoteError::Transport(format!(
            "ssh: the {step} step answered no result (status {}): {}",
            out.code,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The directory name of this version: the package version and the agent protocol.
fn version_dir() -> String {
    format!(
        "{}-p{}",
        env!("CARGO_PKG_VERSION"),
        crate::remote::wire::PROTOCOL_VERSION
    )
}

/// A stable name for the workspace path (FNV-1a, 64 bits: a directory name, not a secret).
pub fn workspace_key(root: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in root {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Find the running agent of this workspace, or deploy and start one. `Ok(Err(NoAgent))` when
/// the sandbox cannot run it (no writable and executable directory, a binary that does not
/// run there); `Err` when ssh itself fails. `restart`: the agent found last time did not
/// answer; start a new one.
pub async fn deploy(
    ssh: &Master,
    bin: &Binary,
    root: &[u8],
    restart: bool,
) -> Result<std::result::Result<Deployed, NoAgent>> {
    let key = workspace_key(root);
    let vdir = version_dir();
    let out = ssh
        .run(
            command(
                PROBE,
                &[
                    vdir.as_bytes(),
                    bin.version.as_bytes(),
                    key.as_bytes(),
                    root,
                ],
            ),
            Input::Bytes(Vec::new()),
            STEP_DEADLINE,
        )
        .await?;
    let (said, rest) = result(&out, "probe")?;
    if said == "missing" {
        return Err(missing_workspace(root));
    }
    let dir = match said.split_once(' ') {
        Some(("reuse", sock)) if !restart => {
            let token = rest
                .first()
                .map(|t| t.trim().to_string())
                .unwrap_or_default();
            if !token.is_empty() {
                return Ok(Ok(Deployed {
                    remote_socket: sock.as_bytes().to_vec(),
                    token,
                    reused: true,
                }));
            }
            parent_of_agents(sock)
        }
        Some(("reuse", sock)) => parent_of_agents(sock),
        Some(("start", d)) => d.to_string(),
        Some(("upload", d)) => {
            crate::remote::stdio::warn_if_dynamic(&bin.path);
            // A session the connection dropped (ssh's status 255) is tried once more: the
            // upload writes a temp file and renames it, so a second attempt is safe.
            let mut attempt = 0;
            let out = loop {
                attempt += 1;
                let data = std::fs::File::open(&bin.path)
                    .map_err(|e| RemoteError::Transport(format!("{}: {e}", bin.path.display())))?;
                let out = ssh
                    .run(
                        command(UPLOAD, &[d.as_bytes(), bin.version.as_bytes()]),
                        Input::File(data),
                        STEP_DEADLINE,
                    )
                    .await?;
                if out.code == 255 && attempt < 2 && result(&out, "upload").is_err() {
                    tracing::warn!("the upload's ssh session failed (status 255): trying again");
                    continue;
                }
                break out;
            };
            let (said, _) = result(&out, "upload")?;
            if said != "ok" {
                let hint = crate::remote::stdio::static_hint(&bin.path);
                return Ok(Err(NoAgent(format!("{said}{hint}"))));
            }
            d.to_string()
        }
        _ => {
            return Ok(Err(NoAgent(
                "no directory in the sandbox where a program can be written and run".into(),
            )))
        }
    };
    let token = fresh_token()?;
    let idle = AGENT_IDLE_EXIT.as_secs().to_string();
    let out = ssh
        .run(
            command(
                START,
                &[dir.as_bytes(), root, key.as_bytes(), idle.as_bytes()],
            ),
            Input::Bytes(format!("{token}\n").into_bytes()),
            STEP_DEADLINE,
        )
        .await?;
    let (said, rest) = result(&out, "start")?;
    match said.split_once(' ') {
        Some(("started", sock)) => Ok(Ok(Deployed {
            remote_socket: sock.as_bytes().to_vec(),
            token,
            reused: false,
        })),
        _ => Ok(Err(NoAgent(format!(
            "the agent did not start: {said} {}",
            rest.join(" / ")
        )))),
    }
}

/// The one error for a workspace path that is not a directory in the sandbox: a usage
/// mistake (exit 2), like a wrong path on any other transport.
pub fn missing_workspace(root: &[u8]) -> RemoteError {
    RemoteError::Invalid(format!(
        "the workspace {} is not a directory in the sandbox",
        String::from_utf8_lossy(root)
    ))
}

/// `BASE/VERSION` from `BASE/VERSION/agents/KEY/sock`.
fn parent_of_agents(sock: &str) -> String {
    let p = std::path::Path::new(sock);
    p.ancestors()
        .nth(3)
        .map_or_else(String::new, |d| d.to_string_lossy().into_owned())
}

/// 32 random bytes from the kernel, hex: the deployed agent's token.
fn fresh_token() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| RemoteError::Transport(format!("/dev/urandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_dir_is_three_levels_above_its_socket() {
        assert_eq!(
            parent_of_agents("/h/.cache/sbxfs/0.1-p2/agents/ab/sock"),
            "/h/.cache/sbxfs/0.1-p2"
        );
    }

    #[test]
    fn workspace_keys_differ_by_path_and_are_stable() {
        assert_eq!(workspace_key(b"/w"), workspace_key(b"/w"));
        assert_ne!(workspace_key(b"/w"), workspace_key(b"/w2"));
        assert_eq!(workspace_key(b"/w").len(), 16);
    }
}
