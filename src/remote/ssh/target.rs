//! `ssh://[USER@]HOST[:PORT]/ABS/PATH[?agent=no]`: what the URL says, checked once.

use percent_encoding::percent_decode_str;

use crate::remote::{RemoteError, Result};

/// A parsed `ssh://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshTarget {
    pub user: Option<String>,
    /// Host name or address, without the brackets of an IPv6 literal.
    pub host: String,
    pub port: Option<u16>,
    /// The workspace's absolute path in the sandbox (percent-decoded; any bytes but NUL).
    pub root: Vec<u8>,
    /// False with `?agent=no`: the exec-only scripts, no deployed agent.
    pub agent: bool,
    /// False with `?session=no`: the scripts as an ssh command per operation.
    pub session: bool,
}

const FORM: &str = "expected ssh://[USER@]HOST[:PORT]/ABS/PATH[?agent=no[&session=no]]";

fn bad(url: &str, why: &str) -> RemoteError {
    RemoteError::Invalid(format!("{url:?}: {why} ({FORM})"))
}

/// Parse an `ssh://` URL; every mistake gets one error naming it.
pub fn parse(url: &str) -> Result<SshTarget> {
    let rest = url
        .get(..6)
        .filter(|s| s.eq_ignore_ascii_case("ssh://"))
        .map(|_| &url[6..])
        .ok_or_else(|| bad(url, "not an ssh:// URL"))?;
    if rest.contains('#') {
        return Err(bad(url, "a fragment (#) has no meaning here; write %23"));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return Err(bad(url, "no workspace path")),
    };
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => {
            if u.contains(':') {
                return Err(bad(
                    url,
                    "passwords in the URL are not supported: use a key or ssh-agent",
                ));
            }
            let u = decode_utf8(url, u, "user")?;
            if u.is_empty() || u.starts_with('-') || u.chars().any(char::is_control) {
                return Err(bad(url, "bad user name"));
            }
            (Some(u), h)
        }
        None => (None, authority),
    };
    let (host, port) = split_host_port(url, hostport)?;
    let root: Vec<u8> = percent_decode_str(path).collect();
    if root.contains(&0) {
        return Err(bad(url, "the path holds a NUL byte"));
    }
    let q = crate::remote::exec::ExecQuery::parse(query).map_err(|e| bad(url, &e))?;
    Ok(SshTarget {
        user,
        host,
        port,
        root,
        agent: q.agent,
        session: q.session,
    })
}

fn decode_utf8(url: &str, s: &str, what: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| bad(url, &format!("the {what} is not UTF-8")))
}

fn split_host_port(url: &str, s: &str) -> Result<(String, Option<u16>)> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad(url, "an unclosed [ in the host"))?;
        if h.is_empty()
            || !h
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(bad(url, "bad IPv6 address"));
        }
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad(url, "junk after the IPv6 address"))?,
                ),
            ),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    // A host is a name or an address: nothing ssh could read as an option or a second word.
    let name_ok = !host.is_empty()
        && !host.starts_with('-')
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !name_ok {
        return Err(bad(url, "bad host name"));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| bad(url, &format!("bad port {p:?}")))?,
        ),
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_host_port_path_and_agent_option() {
        let t = parse("ssh://me@box.example:2222/work/my%20repo?agent=no").unwrap();
        assert_eq!(t.user.as_deref(), Some("me"));
        assert_eq!(t.host, "box.example");
        assert_eq!(t.port, Some(2222));
        assert_eq!(t.root, b"/work/my repo");
        assert!(!t.agent);
        let t = parse("SSH://box/").unwrap();
        assert_eq!(
            (t.user, t.port, t.root, t.agent),
            (None, None, b"/".to_vec(), true)
        );
    }

    #[test]
    fn ipv6_literals_lose_their_brackets() {
        let t = parse("ssh://[::1]:22/w").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", Some(22)));
        assert_eq!(parse("ssh://[fe80::1]/w").unwrap().host, "fe80::1");
    }

    #[test]
    fn percent_decoding_keeps_non_utf8_bytes() {
        assert_eq!(parse("ssh://h/a%FFb").unwrap().root, b"/a\xffb");
    }

    #[test]
    fn each_mistake_is_refused_with_what_is_wrong() {
        for (url, why) in [
            ("ssh://host", "no workspace path"),
            ("ssh://u:pw@host/w", "passwords"),
            ("ssh://-oProxyCommand=x/w", "bad host"),
            ("ssh://ho st/w", "bad host"),
            ("ssh://host:0/w", "bad port"),
            ("ssh://host:99999/w", "bad port"),
            ("ssh://host:x/w", "bad port"),
            ("ssh://[::1/w", "unclosed"),
            ("ssh://[::1]x/w", "junk"),
            ("ssh://host/w?agent=maybe", "unknown option"),
            ("ssh://host/a%00b", "NUL"),
            ("ssh://@host/w", "bad user"),
            ("ssh://-l@host/w", "bad user"),
            ("ssh:///w", "bad host"),
            ("ssh://h/w#x", "fragment"),
            ("http://h/w", "not an ssh"),
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
            assert!(e.contains("ssh://[USER@]HOST"), "{url}: {e}");
        }
    }
}
