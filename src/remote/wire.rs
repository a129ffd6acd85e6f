//! The agent protocol, version 2: shared by the agent (`crate::agent`) and its client
//! ([`super::client`]), so neither can drift from the other.
//!
//! HTTP/1.1 on `/v1/...`; every request carries `Authorization: Bearer TOKEN` (else 401, on any
//! path, known or not). Paths travel in the query string as `path=` (and `to=`), percent-encoded
//! raw bytes, relative to the workspace root. Answers are JSON; streams (`tree`, `grep`,
//! `watch`) are JSON lines; `read` answers raw bytes with the version in [`VERSION_HEADER`].
//! Errors are a status code plus `{"error": TOKEN, "message": …}` ([`ErrorBody`]); a request
//! that made the agent fail unexpectedly answers 500 with token `EIO`.
//!
//! Version 2 added mknod, link, the xattr calls, fallocate, copy_range, rename's `exchange`,
//! a patch's `cut`, `uid`/`gid` in setattr, and attributes' `dev`/`rdev`; versions name the
//! device and no longer the ctime. Paths may be up to [`super::MAX_PATH_BYTES`] long.
//!
//! | method and path | query | body | answer |
//! |---|---|---|---|
//! | `GET /v1/info` | | | [`super::RemoteInfo`] |
//! | `GET /v1/stat` | path | | [`super::Attr`] (with `has_xattrs`, also in listings and trees; absent from older agents) |
//! | `POST /v1/stat_many` | | [`StatManyBody`] | `{"results": [`[`StatOutcome`]`]}`, in order |
//! | `GET /v1/list` | path | | `{"entries": [DirEntry]}` |
//! | `GET /v1/tree` | path | | JSON lines of [`super::TreeEntry`], then `{"end": n}` |
//! | `GET /v1/tree` | path, `format=packed`, max?, `xattrs=1`? | | [`super::treepack`] (content type `application/x-sbxfs-tree`; older agents answer JSON lines, which the client refuses) |
//! | `GET /v1/read` | path, offset, len | | bytes; header `x-sbxfs-version` |
//! | `PUT /v1/commit` | path, base?, mode?, patch? | the file, or a patch ([`PatchHeader`] line + bytes) | Attr |
//! | `POST /v1/create` `/v1/mkdir` | path, mode (exact: no umask) | | Attr |
//! | `POST /v1/mknod` | path, kind (`fifo` `socket` `chardevice` `blockdevice`), mode, rdev? | | Attr |
//! | `POST /v1/unlink` `/v1/rmdir` | path | | `{}` |
//! | `POST /v1/rename` | path, to, noreplace? or exchange? | | `{}` |
//! | `POST /v1/link` | path (existing), to (new name) | | Attr (its nlink one more) |
//! | `POST /v1/symlink` | path, target | | Attr |
//! | `GET /v1/readlink` | path | | `{"target": bytes}` |
//! | `POST /v1/setattr` | path | [`super::SetAttr`] | Attr |
//! | `GET /v1/statfs` | | | [`super::StatFs`] |
//! | `GET /v1/getxattr` | path, name | | `{"value": bytes}` (`ENODATA` if none) |
//! | `GET /v1/listxattr` | path | | `{"names": [bytes]}` |
//! | `POST /v1/setxattr` | path, name, create? or replace? | [`XattrBody`] | `{}` |
//! | `POST /v1/removexattr` | path, name | | `{}` |
//! | `POST /v1/fallocate` | path, offset, len, keep_size? | | Attr |
//! | `POST /v1/copy_range` | path (source), offset, to, to_offset, len, base? | | [`CopyRangeAnswer`] |
//! | `POST /v1/scan` | path | ScanRequest | ScanResult |
//! | `POST /v1/grep` | path | GrepOptions | JSON lines of matches (or, with `print`, of printed files), then the summary |
//! | `POST /v1/glob` | path | `{"pattern"}` | `{"paths": [...]}` |
//! | `POST /v1/fuzzy` | path | [`super::FuzzyRequest`] | `{"matches": [...]}` |
//! | `POST /v1/edit` | path | [`EditBody`] | `{"count": n}` |
//! | `GET /v1/watch` | since? | | JSON lines of [`super::ChangeEvent`] |

use std::collections::HashMap;

use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use super::{Attr, RemoteError, RemotePath, WireBytes};

pub const PROTOCOL_VERSION: u32 = 2;
pub const VERSION_HEADER: &str = "x-sbxfs-version";
/// A random id one client (one mount's connection to its agent) sends on every request, so
/// that its watch learns which changes are its own ([`super::ChangeEvent::own`]): 16 hex
/// digits. Not a credential: it only saves the client a check of a change it made.
pub const CLIENT_HEADER: &str = "x-sbxfs-client";

/// A [`CLIENT_HEADER`] value as the agent keeps it (exactly 16 lowercase hex digits).
pub fn parse_client_id(v: &[u8]) -> Option<u64> {
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if v.len() != 16 || !v.iter().all(hex) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(v).ok()?, 16).ok()
}
/// Largest read one request may ask for: big enough for read-ahead windows, small enough that
/// one request cannot pin much memory in the agent.
pub const MAX_READ_BYTES: u32 = 16 * 1024 * 1024;
/// Largest JSON request body (queries, setattr): a query is small.
pub const MAX_JSON_BODY_BYTES: usize = 1024 * 1024;

/// Characters left as they are in a query value: unreserved ones, so paths stay readable.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Percent-encode raw bytes for a query value.
pub fn encode_bytes(bytes: &[u8]) -> String {
    percent_encoding::percent_encode(bytes, QUERY_VALUE).to_string()
}

pub fn encode_str(s: &str) -> String {
    utf8_percent_encode(s, QUERY_VALUE).to_string()
}

/// A query string decoded into raw byte values.
#[derive(Debug, Default)]
pub struct QueryArgs(HashMap<String, Vec<u8>>);

impl QueryArgs {
    pub fn parse(raw: Option<&str>) -> Self {
        let mut map = HashMap::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key: Vec<u8> = percent_decode(k.as_bytes()).collect();
            // `+` is a literal plus here: we never encode spaces as `+`.
            let value: Vec<u8> = percent_decode(v.as_bytes()).collect();
            map.insert(String::from_utf8_lossy(&key).into_owned(), value);
        }
        QueryArgs(map)
    }

    pub fn bytes(&self, key: &str) -> Option<&[u8]> {
        self.0.get(key).map(Vec::as_slice)
    }

    pub fn path(&self, key: &str) -> Result<RemotePath, RemoteError> {
        RemotePath::new(self.bytes(key).unwrap_or_default().to_vec())
    }

    pub fn text(&self, key: &str) -> Result<Option<String>, RemoteError> {
        self.bytes(key)
            .map(|b| {
                String::from_utf8(b.to_vec())
                    .map_err(|_| RemoteError::Invalid(format!("{key} is not UTF-8")))
            })
            .transpose()
    }

    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, RemoteError> {
        self.text(key)?
            .map(|t| {
                t.parse::<T>()
                    .map_err(|_| RemoteError::Invalid(format!("{key}={t:?} is not a number")))
            })
            .transpose()
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.bytes(key), Some(b"1" | b"true"))
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
}

impl ErrorBody {
    pub fn from_error(e: &RemoteError) -> Self {
        let (count, base, current) = match e {
            RemoteError::Query(crate::search::SearchError::MultipleOccurrences(n)) => {
                (Some(*n), None, None)
            }
            RemoteError::Conflict { base, current, .. } => {
                (None, Some(base.clone()), Some(current.clone()))
            }
            _ => (None, None, None),
        };
        let message = match e {
            RemoteError::Conflict { path, .. } => path.clone(),
            RemoteError::NotFound(m)
            | RemoteError::Exists(m)
            | RemoteError::NotDir(m)
            | RemoteError::IsDir(m)
            | RemoteError::NotEmpty(m)
            | RemoteError::Access(m)
            | RemoteError::Perm(m)
            | RemoteError::CrossDevice(m)
            | RemoteError::NameTooLong(m)
            | RemoteError::Invalid(m)
            | RemoteError::TooLarge(m)
            | RemoteError::FileTooBig(m)
            | RemoteError::NoAttr(m)
            | RemoteError::Stale(m)
            | RemoteError::Unsupported(m)
            | RemoteError::Unauthorized(m)
            | RemoteError::Transport(m)
            | RemoteError::TimedOut(m)
            | RemoteError::NoSpace(m)
            | RemoteError::ReadOnly(m)
            | RemoteError::Quota(m) => m.clone(),
            RemoteError::Query(q) => q.detail(),
            other => other.to_string(),
        };
        ErrorBody {
            error: e.token().to_string(),
            message,
            count,
            base,
            current,
        }
    }

    pub fn into_error(self) -> RemoteError {
        RemoteError::from_wire(
            &self.error,
            &self.message,
            self.count,
            self.base.as_deref(),
            self.current.as_deref(),
        )
    }
}

/// The HTTP status an error travels with (the token in the body is what clients decode).
pub fn status_for(e: &RemoteError) -> u16 {
    match e {
        RemoteError::NotFound(_) => 404,
        RemoteError::Exists(_) | RemoteError::NotEmpty(_) | RemoteError::Conflict { .. } => 409,
        RemoteError::Access(_) | RemoteError::Perm(_) => 403,
        RemoteError::Unauthorized(_) => 401,
        RemoteError::TooLarge(_) => 413,
        RemoteError::NoAttr(_) => 404,
        RemoteError::Stale(_) => 409,
        RemoteError::FileTooBig(_) => 400,
        RemoteError::Unsupported(_) => 501,
        RemoteError::Transport(_)
        | RemoteError::Io(..)
        | RemoteError::NoSpace(_)
        | RemoteError::ReadOnly(_)
        | RemoteError::Quota(_) => 500,
        RemoteError::TimedOut(_) => 504,
        // 499 as nginx says it: the client went away before the answer.
        RemoteError::Interrupted(_) => 499,
        RemoteError::NotDir(_)
        | RemoteError::IsDir(_)
        | RemoteError::CrossDevice(_)
        | RemoteError::NameTooLong(_)
        | RemoteError::Invalid(_)
        | RemoteError::Query(_) => 400,
    }
}

/// The first line of a patch commit's body; the ranges' bytes follow it, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PatchHeader {
    /// The lowest length since the base ([`super::CommitContent::Patch`]); absent: no cut.
    #[serde(default = "no_cut")]
    pub cut: u64,
    pub new_len: u64,
    /// `[offset, length]` of each range.
    pub ranges: Vec<[u64; 2]>,
}

fn no_cut() -> u64 {
    u64::MAX
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EditBody {
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub replace_all: bool,
}

/// The body of `POST /v1/setxattr`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct XattrBody {
    pub value: WireBytes,
}

/// The answer of `POST /v1/copy_range`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CopyRangeAnswer {
    pub copied: u64,
    pub attr: Attr,
}

/// The body of `POST /v1/stat_many`: at most [`super::MAX_STAT_MANY`] paths.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatManyBody {
    pub paths: Vec<WireBytes>,
}

/// One path's outcome in the answer of `POST /v1/stat_many`: its attributes or its error.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatOutcome {
    Attr { attr: Attr },
    Error(ErrorBody),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GlobBody {
    pub pattern: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_round_trip_any_bytes() {
        let raw = b"dir with space/new\nline \"q\" %25 +plus \xff\xfe";
        let q = format!("path={}&x=1", encode_bytes(raw));
        let args = QueryArgs::parse(Some(&q));
        assert_eq!(args.bytes("path"), Some(&raw[..]));
        assert_eq!(args.number::<u32>("x").unwrap(), Some(1));
    }

    use proptest::prelude::*;

    /// JSON arrays nested `n` deep around `inner`.
    fn nested(n: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(n), "]".repeat(n))
    }

    proptest! {
        #[test]
        fn any_query_string_parses_and_answers_without_panicking(raw in ".{0,300}") {
            let args = QueryArgs::parse(Some(&raw));
            for key in ["path", "to", "offset", "len", "mode", "x"] {
                let _ = args.path(key);
                let _ = args.text(key);
                let _ = args.number::<u64>(key);
                let _ = args.number::<i64>(key);
                let _ = args.flag(key);
            }
        }

        #[test]
        fn any_query_value_round_trips(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let q = format!("path={}", encode_bytes(&value));
            let args = QueryArgs::parse(Some(&q));
            prop_assert_eq!(args.bytes("path"), Some(&value[..]));
        }

        #[test]
        fn any_bytes_as_a_patch_header_or_an_answer_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..400)
        ) {
            let _ = serde_json::from_slice::<PatchHeader>(&bytes);
            let _ = serde_json::from_slice::<ErrorBody>(&bytes).map(ErrorBody::into_error);
            let _ = serde_json::from_slice::<Attr>(&bytes);
            let _ = serde_json::from_slice::<CopyRangeAnswer>(&bytes);
            let _ = serde_json::from_slice::<super::super::RemoteInfo>(&bytes);
            let _ = serde_json::from_slice::<super::super::GrepEvent>(&bytes);
            let _ = serde_json::from_slice::<super::super::ChangeEvent>(&bytes);
        }

        #[test]
        fn a_patch_header_with_any_numbers_parses_or_is_refused(
            cut in any::<u64>(), new_len in any::<u64>(),
            ranges in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..20)
        ) {
            let h = PatchHeader { cut, new_len, ranges: ranges.iter().map(|&(a, b)| [a, b]).collect() };
            let back: PatchHeader = serde_json::from_slice(&serde_json::to_vec(&h).unwrap()).unwrap();
            prop_assert_eq!(back.ranges, h.ranges);
        }

        #[test]
        fn deeply_nested_answers_are_an_error_not_a_stack_overflow(depth in 100usize..100_000) {
            let ranges = format!(r#"{{"new_len": 1, "ranges": {}}}"#, nested(depth, "1"));
            prop_assert!(serde_json::from_str::<PatchHeader>(&ranges).is_err());
            let msg = format!(r#"{{"error": "EIO", "message": {}}}"#, nested(depth, ""));
            prop_assert!(serde_json::from_str::<ErrorBody>(&msg).is_err());
            let name = format!(r#"{{"kind": "file", "symlink_target": {{"b64": {}}}}}"#, nested(depth, ""));
            prop_assert!(serde_json::from_str::<Attr>(&name).is_err());
        }
    }
}
