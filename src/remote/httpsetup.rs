//! What an http(s) client is built with besides the URL: extra trusted CAs (`--ca-file`, on top
//! of the system's) and extra request headers (`--header-file`, for providers that
//! authenticate preview URLs by a header). Header values are secrets: marked sensitive, so
//! they never show in a log or a `Debug` print, and never echoed in an error.

use std::path::Path;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// Headers a header file may not set: the agent's token travels in `Authorization`, and the
/// rest frame the request itself.
const RESERVED: &[&str] = &[
    "authorization",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
];

/// Extra roots and headers for every request to one sandbox.
#[derive(Clone, Default)]
pub struct HttpSetup {
    pub roots: Vec<reqwest::Certificate>,
    pub headers: HeaderMap,
}

impl std::fmt::Debug for HttpSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: the values are secrets.
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("HttpSetup")
            .field("roots", &self.roots.len())
            .field("headers", &names)
            .finish()
    }
}

impl HttpSetup {
    /// Load `--ca-file` and `--header-file`; an error is one line naming the file (and the
    /// line), never a header's value.
    pub fn load(ca_file: Option<&Path>, header_file: Option<&Path>) -> Result<HttpSetup, String> {
        let mut setup = HttpSetup::default();
        if let Some(f) = ca_file {
            setup.roots = load_roots(f)?;
        }
        if let Some(f) = header_file {
            let text =
                std::fs::read(f).map_err(|e| format!("--header-file {}: {e}", f.display()))?;
            setup.headers =
                parse_headers(&text).map_err(|e| format!("--header-file {}: {e}", f.display()))?;
        }
        Ok(setup)
    }

    /// `builder` for requests to `url`, with these roots trusted and these headers sent on
    /// every request.
    pub fn apply(&self, builder: reqwest::ClientBuilder, url: &str) -> reqwest::ClientBuilder {
        let builder = if is_plain_http(url) {
            plain_http(builder)
        } else {
            builder.tls_certs_merge(self.roots.iter().cloned())
        };
        builder.default_headers(self.headers.clone())
    }
}

/// A client that only ever speaks plain http (it follows no redirect) loads no trust store:
/// reading the system's certificates costs a start seconds on a machine busy with I/O.
pub fn plain_http(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder.tls_certs_only(std::iter::empty())
}

fn is_plain_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
}

/// Every certificate in a PEM file (one or more).
fn load_roots(f: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(f).map_err(|e| format!("--ca-file {}: {e}", f.display()))?;
    let bad = || {
        format!(
            "--ca-file {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            f.display()
        )
    };
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|_| bad())?;
    if certs.is_empty() {
        return Err(bad());
    }
    Ok(certs)
}

/// `Name: value` lines; blank lines and `#` comments skipped.
pub fn parse_headers(text: &[u8]) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line).trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(format!("line {n}: expected `Name: value`"));
        };
        let name = HeaderName::from_bytes(line[..colon].trim_ascii())
            .map_err(|_| format!("line {n}: not a valid header name"))?;
        if RESERVED.contains(&name.as_str()) {
            return Err(format!(
                "line {n}: the header {} is not one a header file may set (sbxfs sets it)",
                name.as_str()
            ));
        }
        let mut value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii())
            .map_err(|_| format!("line {n}: the value is not a valid header value"))?;
        value.set_sensitive(true);
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_parsed_and_comments_skipped() {
        let h = parse_headers(b"# provider auth\n\nX-Api-Key: s3cret\r\nX-Two:  a b \n").unwrap();
        assert_eq!(h["x-api-key"], "s3cret");
        assert_eq!(h["x-two"], "a b");
        assert!(h["x-api-key"].is_sensitive());
        let shown = format!(
            "{:?}",
            HttpSetup {
                roots: vec![],
                headers: h
            }
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_bad_line_names_its_number_and_never_the_value() {
        for (text, want) in [
            (
                &b"X-Ok: 1\nno colon s3cret\n"[..],
                "line 2: expected `Name: value`",
            ),
            (b"\n\nBad Name: s3cret", "line 3: not a valid header name"),
            (
                b"X-A: s3cret\x01",
                "line 1: the value is not a valid header value",
            ),
            (
                b"Authorization: Bearer s3cret",
                "line 1: the header authorization",
            ),
        ] {
            let e = parse_headers(text).unwrap_err();
            assert!(e.starts_with(want), "{e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }
}
