//! `Remote`: the one interface between the mount and a sandbox. Every backend implements it
//! (the agent's HTTP client [`client`]; the in-memory reference sandbox [`memory`]; an
//! exec-only backend later) and one conformance suite (`tests/conformance.rs`) holds each to
//! the same behaviour. [`faulty`] wraps any backend to inject latency, errors, hangs and cut
//! streams, for the faults a real sandbox cannot be made to produce on demand.
//!
//! Paths are [`RemotePath`]s: validated, relative to the workspace root, raw bytes (names need
//! not be UTF-8). Every attribute carries a [`Version`] that changes whenever the content may
//! have changed; reads report the version their bytes came from, and a commit can name the
//! version it was based on, so a write never silently overwrites a change made in the sandbox.

pub mod agentscope;
pub mod client;
pub mod connect;
pub mod counted;
pub mod deadline;
pub mod error;
pub mod exec;
pub mod faulty;
pub mod httpsetup;
pub mod layer;
pub mod listings;
#[cfg(any(test, feature = "test-support"))]
pub mod memory;
pub mod reach;
pub mod retry;
pub mod source_query;
pub mod ssh;
pub mod stdio;
pub mod tied;
pub mod treepack;
pub mod wire;

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use crate::wirebytes::WireBytes;
pub use error::{RemoteError, Result};
pub use listings::TreeListing;

use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::{GrepItem, GrepMatch, GrepOptions, GrepSummary};
use crate::search::print::PrintedFile;
use crate::search::scan::{ScanRequest, ScanResult};
use crate::search::walk::WalkOptions;

/// Longest path accepted (bytes): deeper than Linux's PATH_MAX (4096) on purpose, since a
/// workspace may hold trees deeper than one system call can name (the agent walks such paths
/// in chunks). Not more: a request may carry two paths (rename, link, copy_range) percent-
/// encoded at up to 3 bytes per byte, and an HTTP URI is limited to 64 KiB (the `http` crate's
/// limit), so 2 × 3 × 10 KiB leaves room for the rest of the URI.
pub const MAX_PATH_BYTES: usize = 10 * 1024;
/// Most paths one [`Remote::stat_many`] call takes.
pub const MAX_STAT_MANY: usize = 256;
/// Most path bytes one [`Remote::stat_many`] call takes: escaped in JSON (at most 6 bytes per
/// byte) they stay under the agent's JSON body limit.
pub const MAX_STAT_MANY_BYTES: usize = 128 * 1024;

/// Why `paths` cannot be one [`Remote::stat_many`] call (too many, or too many bytes).
pub fn check_stat_many(paths: &[RemotePath]) -> Result<()> {
    let bytes: usize = paths.iter().map(|p| p.as_bytes().len()).sum();
    if paths.len() > MAX_STAT_MANY || bytes > MAX_STAT_MANY_BYTES {
        return Err(RemoteError::Invalid(format!(
            "{} paths ({bytes} bytes) in one batched stat: at most {MAX_STAT_MANY} paths and \
             {MAX_STAT_MANY_BYTES} bytes",
            paths.len()
        )));
    }
    Ok(())
}

/// `paths` cut into batches that [`Remote::stat_many`] takes, in order.
pub fn stat_many_batches(paths: &[RemotePath]) -> Vec<&[RemotePath]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in paths.iter().enumerate() {
        let len = p.as_bytes().len();
        if i > start && (i - start == MAX_STAT_MANY || bytes + len > MAX_STAT_MANY_BYTES) {
            out.push(&paths[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < paths.len() {
        out.push(&paths[start..]);
    }
    out
}

/// Longest name accepted (bytes), as Linux's NAME_MAX.
pub const MAX_NAME_BYTES: usize = 255;
/// Largest extended attribute value, and name list (Linux's XATTR_SIZE_MAX, XATTR_LIST_MAX).
pub const MAX_XATTR_VALUE_BYTES: usize = 64 * 1024;
/// Longest extended attribute name (Linux's XATTR_NAME_MAX).
pub const MAX_XATTR_NAME_BYTES: usize = 255;

/// The one check of a value given to `setxattr` before it leaves for the sandbox (every
/// transport): at most [`MAX_XATTR_VALUE_BYTES`], as the kernel would refuse it (E2BIG).
pub fn check_xattr_value(path: &RemotePath, value: &[u8]) -> Result<()> {
    if value.len() > MAX_XATTR_VALUE_BYTES {
        return Err(RemoteError::TooLarge(format!(
            "{}: extended attribute values are limited to {MAX_XATTR_VALUE_BYTES} bytes",
            path.display()
        )));
    }
    Ok(())
}

/// Why `name` cannot be one directory entry's name (empty, `.`, `..`, a `/` or NUL in it,
/// longer than [`MAX_NAME_BYTES`]); names from the other side are checked before they
/// become inodes.
pub fn check_entry_name(name: &[u8]) -> std::result::Result<(), &'static str> {
    match name {
        b"" => Err("an empty name"),
        b"." | b".." => Err("`.` or `..` as a name"),
        n if n.contains(&b'/') => Err("a `/` in a name"),
        n if n.contains(&0) => Err("a NUL byte in a name"),
        n if n.len() > MAX_NAME_BYTES => Err("a name longer than 255 bytes"),
        _ => Ok(()),
    }
}

/// A path inside the workspace: relative, `/`-separated, no `.`/`..`/empty components, no NUL.
/// The empty path is the workspace root.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RemotePath(Vec<u8>);

impl RemotePath {
    pub fn root() -> Self {
        RemotePath(Vec::new())
    }

    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes: Vec<u8> = bytes.into();
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        if bytes.len() > MAX_PATH_BYTES {
            return Err(RemoteError::NameTooLong(shown));
        }
        if bytes.contains(&0) {
            return Err(RemoteError::Invalid(format!("{shown:?}: NUL byte in path")));
        }
        if bytes.first() == Some(&b'/') {
            return Err(RemoteError::Invalid(format!(
                "{shown}: absolute paths are not accepted; paths are relative to the workspace"
            )));
        }
        if bytes.is_empty() {
            return Ok(RemotePath(bytes));
        }
        for part in bytes.split(|&b| b == b'/') {
            match part {
                b"" | b"." => {
                    return Err(RemoteError::Invalid(format!(
                        "{shown}: empty or `.` path component"
                    )))
                }
                b".." => {
                    return Err(RemoteError::Invalid(format!(
                        "{shown}: `..` would leave the workspace"
                    )))
                }
                p if p.len() > MAX_NAME_BYTES => return Err(RemoteError::NameTooLong(shown)),
                _ => {}
            }
        }
        Ok(RemotePath(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// This path joined with one more name.
    pub fn join(&self, name: &[u8]) -> Result<Self> {
        if self.0.is_empty() {
            return RemotePath::new(name.to_vec());
        }
        let mut b = self.0.clone();
        b.push(b'/');
        b.extend_from_slice(name);
        RemotePath::new(b)
    }

    /// The parent path and the last name (`None` for the root).
    pub fn split_last(&self) -> Option<(RemotePath, &[u8])> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => (RemotePath(self.0[..i].to_vec()), &self.0[i + 1..]),
            None => (RemotePath::root(), &self.0[..]),
        })
    }

    /// For messages and logs.
    pub fn display(&self) -> String {
        if self.0.is_empty() {
            ".".into()
        } else {
            String::from_utf8_lossy(&self.0).into_owned()
        }
    }
}

impl fmt::Debug for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemotePath({:?})", self.display())
    }
}

/// Identifies a file's content across the whole workspace: device, inode, size and mtime. It
/// changes whenever the content may have changed, and not for a rename, `chmod` or `link`
/// (which change only the ctime), so a file renamed while open keeps its base version.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct Version(pub String);

impl Version {
    /// The base a commit names to create a file only where none is: the sandbox refuses it as
    /// a conflict when a file exists there (atomically: the final rename does not replace).
    /// No real version has this form.
    pub fn absent() -> Version {
        Version("absent".to_string())
    }

    pub fn is_absent(&self) -> bool {
        self.0 == "absent"
    }

    /// The version of bytes read while the file kept changing (at `now` after the read): no
    /// stat ever names it, so they are never taken from a cache for a real version.
    pub fn unsettled(now: &Version) -> Version {
        Version(format!("{now}~unsettled"))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    /// Anything else (never made through the mount).
    Other,
}

/// The special files [`Remote::mknod`] makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// How [`Remote::rename`] treats an existing target (`renameat2` flags).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RenameMode {
    /// Replace the target if there is one (plain `rename(2)`).
    #[default]
    Replace,
    /// Fail with `Exists` if the target exists (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names atomically; both must exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// `setxattr` flags: at most one of the two.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct XattrFlags {
    /// Fail with `Exists` if the attribute exists (`XATTR_CREATE`).
    #[serde(default)]
    pub create: bool,
    /// Fail with `NoAttr` if it does not (`XATTR_REPLACE`).
    #[serde(default)]
    pub replace: bool,
}

/// What a file is, as the sandbox sees it (its own inode numbers and nanosecond times).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Attr {
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// The sandbox's device and inode numbers and the birth time: together, the file's
    /// identity. The birth time tells a file apart from an earlier one that had its inode
    /// number (ext4 hands a freed number to the next file made, so a file replaced by an
    /// atomic rename often comes back under its predecessor's number); 0 where not known.
    #[serde(default)]
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub born_ns: i64,
    pub nlink: u64,
    /// Device number of a character or block device (0 otherwise).
    #[serde(default)]
    pub rdev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<WireBytes>,
    pub version: Version,
    /// Whether the file has any extended attribute (a symlink: its own), so a mount can
    /// answer `getxattr`/`listxattr` for one that has none without a round trip. `None`:
    /// not known (an older agent), ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_xattrs: Option<bool>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: WireBytes,
    pub attr: Attr,
}

/// One entry of a subtree listing: its path relative to the workspace root.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TreeEntry {
    pub path: WireBytes,
    pub attr: Attr,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReadResult {
    pub data: Bytes,
    pub version: Version,
}

/// The new content of a commit.
pub enum CommitContent {
    /// The whole new file, streamed (never held in memory whole).
    Whole(Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    /// New bytes over the base version. Applied in this order: the base cut to `cut` bytes
    /// (the lowest length the file had since the base; bytes past it are gone, and read as
    /// zeros if the file grows again), each range written at its offset, then the file cut or
    /// extended to `new_len`. `cut >= base size` means nothing was cut.
    Patch {
        cut: u64,
        new_len: u64,
        ranges: Vec<(u64, Bytes)>,
    },
}

impl fmt::Debug for CommitContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommitContent::Whole(_) => f.write_str("Whole(..)"),
            CommitContent::Patch {
                cut,
                new_len,
                ranges,
            } => {
                write!(
                    f,
                    "Patch {{ cut: {cut}, new_len: {new_len}, ranges: {} }}",
                    ranges.len()
                )
            }
        }
    }
}

/// Options of a commit besides its content.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Fail with a conflict unless the file is at this version (a missing file never is);
    /// [`Version::absent`]: unless no file is there.
    pub base: Option<Version>,
    /// Mode for a file the commit creates (default 0644), exactly (no umask applies); an
    /// existing file keeps its mode.
    pub create_mode: Option<u32>,
    /// The modification time the new content gets (ns since the epoch): when it was last
    /// written through the mount, so a push does not move a time programs already saw (an
    /// editor's "changed on disk" check). `None`: the commit's own time.
    pub mtime_ns: Option<i64>,
    /// The access time the new content gets, where the transport says `commit_atime` (a
    /// `cp -p` or `rsync -a` sets both times before the first push: one call, not two).
    /// `None`: left to the sandbox.
    pub atime_ns: Option<i64>,
}

/// Attributes to change; a final symlink is never followed (its own times change; a mode on a
/// symlink is `Unsupported`, as on Linux). `uid`/`gid` are the sandbox's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atime_ns: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime_ns: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl SetAttr {
    /// Fold in a later change: each attribute it sets replaces this one's.
    pub fn then(&mut self, later: &SetAttr) {
        self.mode = later.mode.or(self.mode);
        self.size = later.size.or(self.size);
        self.atime_ns = later.atime_ns.or(self.atime_ns);
        self.mtime_ns = later.mtime_ns.or(self.mtime_ns);
        self.uid = later.uid.or(self.uid);
        self.gid = later.gid.or(self.gid);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u64,
}

/// What happened to a path in the sandbox (from the agent's change feed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ChangeKind {
    Created,
    Modified,
    Removed,
    Renamed {
        to: WireBytes,
    },
    /// Events were dropped (the feed fell behind, or a reconnect came too late): revalidate all.
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeEvent {
    /// Position in the feed; reconnect with `since` = the last one seen.
    pub seq: u64,
    #[serde(default)]
    pub path: WireBytes,
    #[serde(flatten)]
    pub kind: ChangeKind,
    /// The change is the watching client's own commit (made in answer to a request carrying
    /// the same [`wire::CLIENT_HEADER`]): its answer told the client what it made, so there is
    /// nothing to check. Older agents never say.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own: bool,
    /// Which client's commit made it (the agent's own bookkeeping; never sent: a client
    /// learns only whether a change is its own).
    #[serde(skip)]
    pub author: Option<u64>,
}

impl ChangeEvent {
    pub fn new(seq: u64, path: Vec<u8>, kind: ChangeKind) -> Self {
        ChangeEvent {
            seq,
            path: WireBytes(path),
            kind,
            own: false,
            author: None,
        }
    }

    /// Events after `seq` were dropped: the client revalidates everything.
    pub fn lost(seq: u64) -> Self {
        ChangeEvent::new(seq, Vec::new(), ChangeKind::Lost)
    }
}

/// One item of a streamed grep: a match, or the summary that ends the stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GrepEvent {
    Summary {
        summary: GrepSummary,
        truncated: bool,
    },
    /// One file as ripgrep prints it (asked for with `GrepOptions::print`; older peers never
    /// ask, so never see one).
    Printed(PrintedFile),
    Match(GrepMatch),
}

impl From<GrepItem> for GrepEvent {
    fn from(item: GrepItem) -> Self {
        match item {
            GrepItem::Match(m) => GrepEvent::Match(m),
            GrepItem::Printed(p) => GrepEvent::Printed(p),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FuzzyRequest {
    pub query: String,
    #[serde(default)]
    pub limit: Option<usize>,
    /// Which files count: the same keys as before at the top level (`hidden`, `no_ignore`),
    /// every walk option now, each defaulted so older peers still parse.
    #[serde(flatten)]
    pub walk: WalkOptions,
}

/// Who the remote is (for status and the ioctl INFO).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteInfo {
    pub protocol: u32,
    pub agent_version: String,
    pub root: String,
    /// Who the agent runs as: the sandbox's user, whom the mounting user acts as. Absent from
    /// an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<Identity>,
    /// How far Landlock confines the agent: "enforced", "partially enforced", "unavailable"
    /// or "disabled" (absent from older agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock: Option<String>,
    /// Encodings `GET /v1/tree` answers in besides JSON lines (`"packed"`:
    /// [`treepack`]); empty from older agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tree_formats: Vec<String>,
    /// The agent understands [`Version::absent`] as a commit's base (false from older agents,
    /// which would take it for a version that never matches).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub commit_absent: bool,
    /// What the transport does natively (the agent: everything); the mount adapts to what it
    /// lacks, and `ctl status` shows it.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// The random id the agent keeps for this workspace ([`crate::agent::identity`]): what
    /// unpushed edits are tied to. Absent from transports without one and older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
}

/// What a transport does natively. Where one is missing the mount adapts: no `feed` means
/// revalidation by polling (attributes trusted for the TTL only); no `patch_commits` means
/// whole-file commits; no `server_search` means queries list paths remotely and match here;
/// no `kill` means a cancelled remote command may run to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// A change feed (`watch`) pushes sandbox-side changes.
    pub feed: bool,
    /// Commits may be patches (ranges over the base) rather than whole files.
    pub patch_commits: bool,
    /// A patch with cut 0 may create its file (nothing to cut from), so a new sparse file is
    /// sent as its written ranges. Agents before it say nothing: false.
    #[serde(default)]
    pub patch_new: bool,
    /// A commit sets the access time it is given ([`CommitOptions::atime_ns`]). Agents
    /// before it say nothing: false.
    #[serde(default)]
    pub commit_atime: bool,
    /// grep/glob/fuzzy run in the sandbox, only results cross.
    pub server_search: bool,
    /// A cancelled remote command is stopped (its process group killed).
    pub kill: bool,
}

impl Default for Capabilities {
    /// The agent's: everything (older agents do not say, and have all of these).
    fn default() -> Self {
        Capabilities {
            feed: true,
            patch_commits: true,
            patch_new: true,
            commit_atime: true,
            server_search: true,
            kill: true,
        }
    }
}

/// A process's credentials: who a permission check is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    #[serde(default)]
    pub groups: Vec<u32>,
}

impl Identity {
    /// This process's own credentials.
    pub fn of_this_process() -> Identity {
        Identity {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: rustix::process::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
        }
    }
}

/// The operations a sandbox backend provides. All paths are workspace-relative.
#[async_trait]
pub trait Remote: Send + Sync {
    async fn info(&self) -> Result<RemoteInfo>;

    // --- metadata
    /// Attributes of a path (a symlink itself, not its target).
    async fn stat(&self, path: &RemotePath) -> Result<Attr>;
    /// Attributes of several paths in one round trip, each path's own outcome in order (a
    /// missing path is its `NotFound`, not the call's). At most [`MAX_STAT_MANY`] paths and
    /// [`MAX_STAT_MANY_BYTES`] of them ([`check_stat_many`]); more is `Invalid`.
    async fn stat_many(&self, paths: &[RemotePath]) -> Result<Vec<Result<Attr>>>;
    /// A directory's entries with their attributes, sorted by name, in one round trip.
    async fn list(&self, path: &RemotePath) -> Result<Vec<DirEntry>>;
    /// Every entry under a directory (depth first, sorted), streamed in one response.
    async fn tree(&self, path: &RemotePath) -> Result<BoxStream<'static, Result<TreeEntry>>>;
    /// A subtree's listings in one answer, breadth first: `path`'s own (whole), then its
    /// subdirectories' as long as the entries after the first stay within `max_entries`;
    /// directories beyond are answered as not descended ([`TreeListing::entries`] `None`).
    async fn tree_listings(
        &self,
        path: &RemotePath,
        max_entries: usize,
    ) -> Result<BoxStream<'static, Result<TreeListing>>> {
        listings::by_list(self, path, max_entries).await
    }

    // --- data
    /// Up to `len` bytes at `offset` (fewer at the end of the file), with their version.
    async fn read(&self, path: &RemotePath, offset: u64, len: u32) -> Result<ReadResult>;
    /// As [`Remote::read`], from the file that was at `path` at `version` if the sandbox still
    /// holds it open, even though a rename replaced it or it was removed since (as a local
    /// disk's open file keeps its bytes); the file read is held for the next such read. A
    /// sandbox that holds nothing answers what `path` holds now, with its version.
    async fn read_held(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u32,
        version: &Version,
    ) -> Result<ReadResult> {
        let _ = version;
        self.read(path, offset, len).await
    }
    /// Replace the file's content atomically (temp file beside it, then rename), after
    /// checking `opts.base`. A file with other hard links (`nlink > 1`) is the exception: a
    /// rename would cut those names off, so its new content, assembled aside all the same, is
    /// copied into the existing inode after the base check. The links are kept; atomicity is
    /// not (a reader in the sandbox may see the file empty or half copied during that local
    /// copy, and a crash then leaves it so), though a failed upload still changes nothing.
    async fn commit(
        &self,
        path: &RemotePath,
        content: CommitContent,
        opts: CommitOptions,
    ) -> Result<Attr>;

    // --- namespace
    /// Create an empty file with exactly `mode` (no umask); fails with `Exists` if the name
    /// is taken.
    async fn create(&self, path: &RemotePath, mode: u32) -> Result<Attr>;
    /// Make a directory with exactly `mode` (no umask).
    async fn mkdir(&self, path: &RemotePath, mode: u32) -> Result<Attr>;
    /// Make a FIFO, a socket or (where the sandbox allows it) a device, with exactly `mode`.
    async fn mknod(
        &self,
        path: &RemotePath,
        kind: SpecialKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr>;
    async fn unlink(&self, path: &RemotePath) -> Result<()>;
    async fn rmdir(&self, path: &RemotePath) -> Result<()>;
    async fn rename(&self, from: &RemotePath, to: &RemotePath, mode: RenameMode) -> Result<()>;
    /// A new name `new` for the existing file `existing` (a hard link); answers the file's
    /// attributes (its `nlink` one more).
    async fn link(&self, existing: &RemotePath, new: &RemotePath) -> Result<Attr>;
    async fn symlink(&self, path: &RemotePath, target: &[u8]) -> Result<Attr>;
    async fn readlink(&self, path: &RemotePath) -> Result<Vec<u8>>;
    async fn setattr(&self, path: &RemotePath, attr: SetAttr) -> Result<Attr>;
    async fn statfs(&self) -> Result<StatFs>;

    // --- extended attributes (a final symlink is not followed)
    /// The value of one attribute (`NoAttr` if it has none by that name).
    async fn getxattr(&self, path: &RemotePath, name: &[u8]) -> Result<Vec<u8>>;
    async fn listxattr(&self, path: &RemotePath) -> Result<Vec<Vec<u8>>>;
    async fn setxattr(
        &self,
        path: &RemotePath,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()>;
    async fn removexattr(&self, path: &RemotePath, name: &[u8]) -> Result<()>;

    // --- data operations done in the sandbox (no bytes cross)
    /// `fallocate(2)` mode 0 (or `KEEP_SIZE`): make sure `[offset, offset+len)` is allocated,
    /// growing the file unless `keep_size`. In place (the content does not change).
    async fn fallocate(
        &self,
        path: &RemotePath,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<Attr>;
    /// Copy `len` bytes of `src` at `src_offset` into `dst` at `dst_offset`, as an atomic
    /// commit of `dst` (temp copy, then rename) checked against `dst_base` like
    /// [`Remote::commit`]. Answers the bytes copied (fewer at `src`'s end) and `dst`'s new
    /// attributes.
    #[allow(clippy::too_many_arguments)]
    async fn copy_range(
        &self,
        src: &RemotePath,
        src_offset: u64,
        dst: &RemotePath,
        dst_offset: u64,
        len: u64,
        dst_base: Option<Version>,
    ) -> Result<(u64, Attr)>;

    // --- queries, answered next to the data
    async fn scan(&self, path: &RemotePath, req: ScanRequest) -> Result<ScanResult>;
    /// Matches stream as they are found, then one `Summary`; dropping the stream cancels it.
    async fn grep(
        &self,
        path: &RemotePath,
        opts: GrepOptions,
    ) -> Result<BoxStream<'static, Result<GrepEvent>>>;
    async fn glob(&self, path: &RemotePath, pattern: &str) -> Result<Vec<String>>;
    async fn fuzzy(&self, path: &RemotePath, req: FuzzyRequest) -> Result<Vec<FuzzyMatch>>;
    async fn edit(
        &self,
        path: &RemotePath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize>;

    /// Change events after `since` (or from now); a `Lost` event means some were dropped.
    async fn watch(&self, since: Option<u64>) -> Result<BoxStream<'static, Result<ChangeEvent>>>;

    /// Stop the agent this connection started in the sandbox (one deployed over ssh), and
    /// start none again; answers what was stopped. Transports whose agent someone else runs,
    /// or that run none, answer `Unsupported` saying so.
    async fn stop_agent(&self) -> Result<String> {
        Err(RemoteError::Unsupported(
            "this mount did not start its agent (an agent you run, or none): stop it where it runs"
                .into(),
        ))
    }
}

#[cfg(test)]
mod xattr_value_tests {
    use super::*;

    #[test]
    fn an_xattr_value_over_the_kernel_limit_is_refused_naming_the_path() {
        let p = RemotePath::new(b"d/f".to_vec()).unwrap();
        assert!(check_xattr_value(&p, &vec![0; MAX_XATTR_VALUE_BYTES]).is_ok());
        assert!(check_xattr_value(&p, b"").is_ok());
        match check_xattr_value(&p, &vec![0; MAX_XATTR_VALUE_BYTES + 1]) {
            Err(RemoteError::TooLarge(m)) => {
                assert!(m.starts_with("d/f: "), "{m}");
                assert!(m.contains(&MAX_XATTR_VALUE_BYTES.to_string()), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
