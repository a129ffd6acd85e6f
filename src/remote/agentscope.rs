//! The `agentscope+http(s)://HOST:PORT[/ABS/PATH]` transport: agentscope-runtime's box server
//! (PyPI `agentscope-runtime`, `sandbox/box/shared/app.py`) as a [`Runner`] for the exec-only
//! scripts.
//!
//! What the server offers and how it is used:
//! - `POST /tools/run_shell_command {"command"}` runs `/bin/sh -c COMMAND` and answers stdout,
//!   stderr (decoded as UTF-8: other bytes fail the request) and the exit code. The program
//!   never appears in the command: it travels as base64 (or, when large, as an uploaded file),
//!   a fixed wrapper decodes it into a private temp directory, runs it with `sh`, and answers
//!   its exit code and both streams as base64, each capped at [`OUTPUT_CAP`] in the sandbox.
//! - `GET`/`PUT /workspace/file?path=` move whole files. `PUT` truncates the named file in
//!   place and creates missing parent directories, so [`Runner::put_file`] checks the parent
//!   first, uploads to a fresh temp name beside the target and renames it with a script.
//! - Paths are checked by string prefix and symlinks are followed: only absolute paths under
//!   the root, without `.`/`..` components, are sent, and a script first checks that the path
//!   resolves to itself (no symlink on the way). `DELETE /entry` (recursive) is never used.
//! - The token goes in the `Authorization: Bearer` header only: never in a command, never logged.
//!   `--header-file` headers (and `--ca-file` roots) are on every request, as for our agent.
//! - The server has no process kill (dropping a request leaves its command running), so every
//!   program runs under [`super::exec::supervise`]: a cancel, timeout or dropped run sends a
//!   second `run_shell_command` that stops the job's process group (TERM, KILL after 2 s).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;

use super::connect::{ConnectOptions, Connected};
use super::exec::{Output, RunControl, Runner, OUTPUT_CAP};
use super::{RemoteError, Result};

/// Longest program carried inside the command itself (one `sh -c` argument may be 128 KiB).
const INLINE_PROGRAM_MAX: usize = 96 * 1024;

/// Runs programs through an agentscope box server.
pub struct AgentScopeRunner {
    http: reqwest::Client,
    base: String,
    token: String,
    /// The workspace root in the sandbox (absolute, no trailing slash unless `/`).
    root: Vec<u8>,
    /// Commands in flight ([`COMMANDS_AT_ONCE`]).
    turns: tokio::sync::Semaphore,
}

/// Most commands the runner has the box server run at once. Each is a process the server
/// starts: a mount's 64 reads ahead at once would make 64, every one of them slower than the
/// whole batch queued here (exec APIs of hosted sandboxes also limit their rate).
const COMMANDS_AT_ONCE: usize = 8;

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    let clean: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(clean).ok()
}

/// The wrapper run by the server's shell: `$1` the program's base64 (or empty), `$2` the
/// base64 path of an uploaded program file (removed once read). Answers one ASCII frame.
const WRAPPER: &str = r#"d=$(mktemp -d) || exit 90
trap 'rm -rf "$d"' EXIT
if [ -n "$2" ]; then f=$(printf %s "$2" | base64 -d && echo x) || exit 91; f=${f%x}; cat -- "$f" > "$d/p" || exit 92; rm -f -- "$f"; else printf %s "$1" | base64 -d > "$d/p" || exit 93; fi
LC_ALL=C sh "$d/p" < /dev/null > "$d/o" 2> "$d/e"; c=$?
printf '__SBXFS_RUN__ %s %s %s\n' "$c" "$(wc -c < "$d/o" | tr -d ' ')" "$(wc -c < "$d/e" | tr -d ' ')"
head -c CAP "$d/o" | base64
echo __SBXFS_ERR__
head -c CAP "$d/e" | base64
"#;

/// Put `script` after `set --` with base64 arguments (single quotes hold base64).
fn with_args(script: &str, args: &[&str]) -> String {
    let mut p = String::from("set --");
    for a in args {
        p.push_str(" '");
        p.push_str(a);
        p.push('\'');
    }
    p.push('\n');
    p.push_str(script);
    p
}

/// `$1` base64 path: answers `ok` when the path's directory exists, is a directory, and the
/// path resolves to itself (no symlink on the way, nothing outside where it says).
const CHECK_PARENT_SH: &str = r#"p=$(printf %s "$1" | base64 -d && echo x) || exit 3
p=${p%x}
d=${p%/*}; [ -n "$d" ] || d=/
[ -d "$d" ] || { echo notdir; exit 0; }
r=$(readlink -f -- "$d" && echo x) || exit 3
[ "${r%?x}" = "$d" ] || { echo symlink; exit 0; }
if [ -L "$p" ]; then echo symlink; elif [ -d "$p" ]; then echo isdir; else echo ok; fi
"#;

/// `$1` base64 temp, `$2` base64 target: rename the upload over the target.
const PLACE_SH: &str = r#"t=$(printf %s "$1" | base64 -d && echo x) || exit 3
p=$(printf %s "$2" | base64 -d && echo x) || exit 3
t=${t%x}; p=${p%x}
if mv -f -- "$t" "$p"; then echo ok; else rm -f -- "$t"; echo failed; fi
"#;

impl AgentScopeRunner {
    pub fn new(http: reqwest::Client, base: String, token: String, root: Vec<u8>) -> Self {
        AgentScopeRunner {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
            root,
            turns: tokio::sync::Semaphore::new(COMMANDS_AT_ONCE),
        }
    }

    /// The workspace root this runner confines file transfers to.
    pub fn root(&self) -> &[u8] {
        &self.root
    }

    /// `path` as a string the server may be sent: absolute, under the root, UTF-8 (the query
    /// string carries text), without `.`/`..`/empty components. `None`: the scripts carry it.
    fn confined<'a>(&self, path: &'a [u8]) -> Option<&'a str> {
        let s = std::str::from_utf8(path).ok()?;
        let root = std::str::from_utf8(&self.root).ok()?;
        let rest = if root == "/" {
            s.strip_prefix('/')?
        } else {
            s.strip_prefix(root)?.strip_prefix('/')?
        };
        let clean = !rest.is_empty()
            && rest
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
            && !s.contains(['\0', '\r', '\n']);
        clean.then_some(s)
    }

    fn file_url(&self, query: &[(&str, &str)]) -> Result<reqwest::Url> {
        let mut url = reqwest::Url::parse(&format!("{}/workspace/file", self.base))
            .map_err(|e| RemoteError::Invalid(format!("{}: {e}", self.base)))?;
        url.query_pairs_mut().extend_pairs(query);
        Ok(url)
    }

    fn post_json(&self, route: &str, body: &serde_json::Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{route}", self.base))
            .bearer_auth(&self.token)
            .json(body)
    }

    async fn shell(&self, command: &str, ctl: &RunControl) -> Result<(i32, String, String)> {
        let mut req = self.post_json(
            "/tools/run_shell_command",
            &serde_json::json!({ "command": command }),
        );
        if let Some(t) = ctl.timeout {
            req = req.timeout(t);
        }
        let send = async {
            let _turn = self.turns.acquire().await.expect("never closed");
            let resp = req.send().await.map_err(|e| self.transport(e))?;
            let resp = self.status_ok(resp, "run a command").await?;
            resp.json::<serde_json::Value>()
                .await
                .map_err(|e| self.transport(e))
        };
        let v = tokio::select! {
            r = send => r?,
            _ = ctl.cancel.cancelled() => {
                return Err(RemoteError::Transport(format!("{}: cancelled", self.describe())))
            }
        };
        let bad = || {
            RemoteError::Io(
                self.describe(),
                "a malformed run_shell_command answer".into(),
            )
        };
        let content = v
            .get("content")
            .and_then(|c| c.as_array())
            .ok_or_else(bad)?;
        let part = |name: &str| {
            content
                .iter()
                .find(|p| p.get("description").and_then(|d| d.as_str()) == Some(name))
                .and_then(|p| p.get("text").and_then(|t| t.as_str()))
                .map(str::to_string)
        };
        let code: i32 = part("returncode")
            .and_then(|c| c.trim().parse().ok())
            .ok_or_else(bad)?;
        Ok((
            code,
            part("stdout").ok_or_else(bad)?,
            part("stderr").unwrap_or_default(),
        ))
    }

    fn transport(&self, e: reqwest::Error) -> RemoteError {
        // reqwest's message names the URL (no token: it travels in a header only).
        if e.is_timeout() {
            RemoteError::TimedOut(format!("{}: {e}", self.describe()))
        } else {
            RemoteError::Transport(format!("{}: {e}", self.describe()))
        }
    }

    async fn status_ok(&self, resp: reqwest::Response, what: &str) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let body: String = body.chars().take(300).collect();
        let msg = format!("{}: cannot {what}: HTTP {status}: {body}", self.describe());
        Err(match status.as_u16() {
            401 | 403 if body.contains("token") || body.contains("authorization") => {
                RemoteError::Unauthorized(msg)
            }
            403 => RemoteError::Access(msg),
            404 => RemoteError::NotFound(msg),
            409 => RemoteError::IsDir(msg),
            _ => RemoteError::Transport(msg),
        })
    }

    fn parse_frame(&self, stdout: &str) -> Result<Output> {
        let bad = |why: &str| RemoteError::Io(self.describe(), format!("run answer: {why}"));
        let (header, rest) = stdout.split_once('\n').ok_or_else(|| bad("no frame"))?;
        let f: Vec<&str> = header
            .strip_prefix("__SBXFS_RUN__ ")
            .ok_or_else(|| bad("no frame"))?
            .split(' ')
            .collect();
        let [code, out_len, err_len] = f[..] else {
            return Err(bad("a malformed frame"));
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad("a malformed frame"));
        let (out_b64, err_b64) = rest
            .split_once("__SBXFS_ERR__\n")
            .ok_or_else(|| bad("no stderr part"))?;
        let stdout = unb64(out_b64).ok_or_else(|| bad("malformed base64"))?;
        let stderr = unb64(err_b64).ok_or_else(|| bad("malformed base64"))?;
        let (out_len, err_len) = (num(out_len)?, num(err_len)?);
        if stdout.len() as u64 > out_len || stderr.len() as u64 > err_len {
            return Err(bad("more bytes than counted"));
        }
        Ok(Output {
            code: code.parse().map_err(|_| bad("a malformed exit code"))?,
            stdout_cut: out_len - stdout.len() as u64,
            stderr_cut: err_len - stderr.len() as u64,
            stdout,
            stderr,
        })
    }

    /// PUT the bytes at `path` as they are (the caller chose a fresh name).
    async fn put_raw(&self, path: &str, data: Bytes) -> Result<()> {
        let resp = self
            .http
            .put(self.file_url(&[("path", path)])?)
            .bearer_auth(&self.token)
            .body(data)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        self.status_ok(resp, "upload").await.map(drop)
    }

    async fn put_checked(&self, abs_path: &[u8], path: &str, data: Bytes) -> Result<()> {
        let shown = String::from_utf8_lossy(abs_path).into_owned();
        let ctl = RunControl::default();
        let check = self
            .run(&with_args(CHECK_PARENT_SH, &[&b64(abs_path)]), &ctl)
            .await?;
        match (check.code, check.stdout.as_slice()) {
            (0, b"ok\n") => {}
            (0, b"notdir\n") => return Err(RemoteError::NotFound(shown)),
            (0, b"isdir\n") => return Err(RemoteError::IsDir(shown)),
            (0, b"symlink\n") => {
                return Err(RemoteError::Access(format!(
                    "{shown}: a symlink on the way: not uploaded through it"
                )))
            }
            _ => {
                return Err(RemoteError::Io(
                    shown,
                    "cannot check the upload's directory".into(),
                ))
            }
        }
        let tmp = temp_beside(path).ok_or_else(|| RemoteError::Invalid(shown.clone()))?;
        self.put_raw(&tmp, data).await?;
        let placed = self
            .run(
                &with_args(PLACE_SH, &[&b64(tmp.as_bytes()), &b64(abs_path)]),
                &ctl,
            )
            .await?;
        if placed.code == 0 && placed.stdout == b"ok\n" {
            Ok(())
        } else {
            Err(RemoteError::Io(
                shown,
                "cannot rename the upload into place".into(),
            ))
        }
    }

    async fn get_checked(&self, abs_path: &[u8], path: &str) -> Result<Bytes> {
        let shown = String::from_utf8_lossy(abs_path).into_owned();
        let check = self
            .run(
                &with_args(CHECK_PARENT_SH, &[&b64(abs_path)]),
                &RunControl::default(),
            )
            .await?;
        match (check.code, check.stdout.as_slice()) {
            (0, b"ok\n") => {}
            (0, b"notdir\n") => return Err(RemoteError::NotFound(shown)),
            (0, b"isdir\n") => return Err(RemoteError::IsDir(shown)),
            (0, b"symlink\n") => {
                return Err(RemoteError::Access(format!(
                    "{shown}: a symlink on the way: not read through it"
                )))
            }
            _ => return Err(RemoteError::Io(shown, "cannot check the path".into())),
        }
        let resp = self
            .http
            .get(self.file_url(&[("path", path), ("format", "bytes")])?)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        let resp = self.status_ok(resp, "download").await?;
        resp.bytes().await.map_err(|e| self.transport(e))
    }
}

/// A fresh hidden name in `path`'s directory.
fn temp_beside(path: &str) -> Option<String> {
    let (dir, name) = path.rsplit_once('/')?;
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).ok()?;
    let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let name: String = name.chars().take(64).collect();
    Some(format!("{dir}/.{name}.sbxfs-{nonce}.up"))
}

#[async_trait]
impl Runner for AgentScopeRunner {
    async fn run(&self, program: &str, ctl: &RunControl) -> Result<Output> {
        let wrapper = WRAPPER.replace("CAP", &OUTPUT_CAP.to_string());
        let command = if program.len() <= INLINE_PROGRAM_MAX {
            with_args(&wrapper, &[&b64(program.as_bytes()), ""])
        } else {
            // Too long for one command argument: upload it, the wrapper reads and removes it.
            let mut file = self.root.clone();
            if file.last() != Some(&b'/') {
                file.push(b'/');
            }
            file.extend_from_slice(b"sbxfs-program");
            let file =
                temp_beside(std::str::from_utf8(&file).map_err(|_| {
                    RemoteError::Invalid("a workspace root that is not UTF-8".into())
                })?)
                .ok_or_else(|| RemoteError::Invalid("no temp name".into()))?;
            self.put_raw(&file, Bytes::from(program.as_bytes().to_vec()))
                .await?;
            with_args(&wrapper, &["", &b64(file.as_bytes())])
        };
        let (code, stdout, stderr) = self.shell(&command, ctl).await?;
        if code != 0 {
            return Err(RemoteError::Io(
                self.describe(),
                format!(
                    "the command wrapper failed (exit {code}; does the sandbox have sh, base64, \
                     mktemp and head?): {}",
                    stderr.chars().take(300).collect::<String>()
                ),
            ));
        }
        self.parse_frame(&stdout)
    }

    async fn put_file(&self, abs_path: &[u8], data: Bytes) -> Option<Result<()>> {
        let path = self.confined(abs_path)?;
        Some(self.put_checked(abs_path, path, data).await)
    }

    async fn get_file(&self, abs_path: &[u8]) -> Option<Result<Bytes>> {
        let path = self.confined(abs_path)?;
        Some(self.get_checked(abs_path, path).await)
    }

    fn describe(&self) -> String {
        format!("agentscope box server at {}", self.base)
    }
}

/// Split `agentscope+http(s)://HOST:PORT[/ABS/PATH]` into the server's base URL and the root
/// path given (if any).
pub fn parse_url(url: &str) -> Result<(String, Option<String>)> {
    let invalid = |why: &str| {
        RemoteError::Invalid(format!(
            "{url:?}: {why}: expected agentscope+http(s)://HOST:PORT[/ABS/PATH]"
        ))
    };
    let lower = url.to_ascii_lowercase();
    if !lower.starts_with("agentscope+http://") && !lower.starts_with("agentscope+https://") {
        return Err(invalid("not an agentscope URL"));
    }
    let inner = &url["agentscope+".len()..];
    // Checked before parsing: the parser would resolve `..` away.
    let raw_path = inner
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
        .unwrap_or("");
    if raw_path
        .split(['/', '?', '#'])
        .any(|c| c == "." || c == ".." || c.eq_ignore_ascii_case("%2e%2e"))
    {
        return Err(invalid("the path has . or .. components"));
    }
    let parsed = reqwest::Url::parse(inner).map_err(|e| invalid(&e.to_string()))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() || !parsed.username().is_empty() {
        return Err(invalid("no query, fragment or user allowed"));
    }
    let path = percent_encoding::percent_decode_str(parsed.path())
        .decode_utf8()
        .map_err(|_| invalid("the path is not UTF-8"))?
        .into_owned();
    let root = match path.trim_end_matches('/') {
        "" => None,
        p if p
            .split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..") =>
        {
            return Err(invalid("the path has empty, . or .. components"))
        }
        p => Some(p.to_string()),
    };
    let mut base = parsed.clone();
    base.set_path("");
    let base = base.as_str().trim_end_matches('/').to_string();
    Ok((base, root))
}

pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Connected> {
    let (base, root) = parse_url(url)?;
    let token = opts.token.clone().ok_or_else(|| {
        RemoteError::Unauthorized(format!(
            "{base}: the box server's SECRET_TOKEN is needed (--token-file or SBXFS_TOKEN)"
        ))
    })?;
    // `--ca-file` and `--header-file` as for our agent: the headers (a provider's auth in
    // front of the box server) go on every request, their values never logged.
    let setup =
        super::httpsetup::HttpSetup::load(opts.ca_file.as_deref(), opts.header_file.as_deref())
            .map_err(RemoteError::Invalid)?;
    super::client::install_tls();
    let builder = setup.apply(
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // uvicorn closes a keep-alive connection after 5 s idle: drop ours first, so no
            // request goes out on one it is closing.
            .pool_idle_timeout(Duration::from_secs(3))
            .redirect(reqwest::redirect::Policy::none()),
        &base,
    );
    let http = builder
        .build()
        .map_err(|e| RemoteError::Transport(format!("{base}: {e}")))?;
    let probe = AgentScopeRunner::new(http.clone(), base.clone(), token.clone(), b"/".to_vec());
    // First contact: a wrong URL or token fails here. The root is the URL's path, or the
    // server's WORKSPACE_DIR (its working directory does not say; its environment does).
    let out = probe
        .run(
            "r=${WORKSPACE_DIR:-/workspace}; cd -- \"$r\" && pwd -P",
            &RunControl {
                timeout: Some(opts.call_timeout.unwrap_or(Duration::from_secs(30))),
                ..Default::default()
            },
        )
        .await?;
    let root = match root {
        Some(r) => r.into_bytes(),
        None => {
            let mut r = out.stdout.clone();
            if out.code != 0 || r.pop() != Some(b'\n') || !r.starts_with(b"/") {
                return Err(RemoteError::NotFound(format!(
                    "{base}: the box server's workspace directory: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            r
        }
    };
    let runner = AgentScopeRunner::new(http, base, token, root.clone());
    let remote = super::exec::script_remote(Arc::new(runner), root)?;
    let info = remote.info().await?;
    Ok(Connected {
        remote,
        info,
        transport: "agentscope".into(),
        keep: Box::new(()),
        why_scripts: None,
        scripts_by: Some("a command per operation (the exec API takes no standard input)".into()),
    })
}
