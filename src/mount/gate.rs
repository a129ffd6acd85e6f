//! Owners as the mount shows them, and the permission gate in front of each operation.
//!
//! By default (`idmap=none`) files show the sandbox's own uids and gids, so tools that check
//! ownership (git's "dubious ownership" guard) keep protecting the developer from a sandbox
//! nobody vetted. The mounting user acts as the sandbox's user (the agent's identity from
//! `/v1/info`): their requests are checked as that user against the sandbox's owners, so they
//! may do there what the sandbox's user may. Anyone else (only with `allow_other`) is checked
//! as themselves, with their supplementary groups, against the owners shown. `idmap=user`
//! shows the sandbox's user and group as the mounting user's (and maps a chown back).
//! With `-o default_permissions` the kernel checks instead, everyone (the mounting user too)
//! against the owners shown. The rules themselves are in [`super::access`].

use super::access::{self, Denied, Subject};
use super::core::FsCore;
use super::inode::NodeId;
use super::options::IdMap;
use crate::remote::{Attr, FileKind, Identity, RemoteError, Result};

/// Where Linux keeps a file's access ACL.
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// Most supplementary groups a process can have (`NGROUPS_MAX`): a longer list is cut.
pub const MAX_GROUPS: usize = 65536;

/// Who files are shown as owned by, and whether the daemon checks permissions.
#[derive(Clone, Debug)]
pub struct Owners {
    pub idmap: IdMap,
    /// The user who mounted (the daemon's real uid/gid).
    pub mount_uid: u32,
    pub mount_gid: u32,
    /// The sandbox's user: whom the mounting user acts as.
    pub sandbox: Identity,
    /// The daemon checks permissions (no `default_permissions`: the kernel does not).
    pub checks: bool,
}

/// Who is asking, as the checks see them.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Nothing to check here: the kernel does it (`default_permissions`), or the caller acts as
    /// a sandbox user who is root.
    Unchecked,
    /// Checked as `who` against the sandbox's own owners (`raw`) or the owners shown.
    Checked { who: Identity, raw: bool },
}

impl Owners {
    /// The owner and group a file shows.
    pub fn shown(&self, uid: u32, gid: u32) -> (u32, u32) {
        match self.idmap {
            IdMap::None => (uid, gid),
            IdMap::User => (
                if uid == self.sandbox.uid {
                    self.mount_uid
                } else {
                    uid
                },
                if gid == self.sandbox.gid {
                    self.mount_gid
                } else {
                    gid
                },
            ),
        }
    }

    /// A chown's owner and group in the sandbox's numbers (`idmap=user`: yours are its user's).
    pub fn to_sandbox(&self, uid: Option<u32>, gid: Option<u32>) -> (Option<u32>, Option<u32>) {
        match self.idmap {
            IdMap::None => (uid, gid),
            IdMap::User => (
                uid.map(|u| {
                    if u == self.mount_uid {
                        self.sandbox.uid
                    } else {
                        u
                    }
                }),
                gid.map(|g| {
                    if g == self.mount_gid {
                        self.sandbox.gid
                    } else {
                        g
                    }
                }),
            ),
        }
    }

    /// The caller of a request from `uid`/`gid` in process `pid`.
    pub fn caller(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        if !self.checks {
            return Caller::Unchecked;
        }
        if uid == self.mount_uid {
            if self.sandbox.uid == 0 {
                return Caller::Unchecked;
            }
            return Caller::Checked {
                who: self.sandbox.clone(),
                raw: true,
            };
        }
        Caller::Checked {
            who: Identity {
                uid,
                gid,
                groups: groups_of(pid),
            },
            raw: false,
        }
    }

    fn subject(&self, a: &Attr, raw: bool) -> Subject {
        let (uid, gid) = if raw {
            (a.uid, a.gid)
        } else {
            self.shown(a.uid, a.gid)
        };
        Subject {
            uid,
            gid,
            mode: a.mode & 0o7777,
            is_dir: a.kind == FileKind::Dir,
            is_file_or_dir: matches!(a.kind, FileKind::File | FileKind::Dir),
            acl: None,
        }
    }

    /// A file's access ACL (`system.posix_acl_access`) with its ids as shown.
    fn acl(&self, xattr: &[u8]) -> access::Acl {
        access::Acl::parse(xattr, |user, id| {
            if user {
                self.shown(id, self.sandbox.gid).0
            } else {
                self.shown(self.sandbox.uid, id).1
            }
        })
        .unwrap_or_else(access::Acl::unreadable)
    }
}

/// A process's supplementary groups (`Groups:` in `/proc/PID/status`); none when it is gone,
/// which can only deny more, never allow more.
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups(&status)
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .take(MAX_GROUPS)
                .collect()
        })
        .unwrap_or_default()
}

/// The error a denial is answered with.
fn refused(core: &FsCore, node: NodeId, d: Denied) -> RemoteError {
    let path = core
        .path_of(node)
        .map(|p| p.display())
        .unwrap_or_else(|_| format!("node {}", node.0));
    match d {
        Denied::Access => RemoteError::Access(path),
        Denied::Perm => RemoteError::Perm(path),
    }
}

/// The permission gate: each function answers whether the caller may do one operation,
/// fetching the attributes it needs (usually cached) only when there is something to check.
pub struct Gate<'a> {
    pub core: &'a FsCore,
    pub owners: &'a Owners,
    pub caller: &'a Caller,
}

impl Gate<'_> {
    async fn subject(&self, node: NodeId) -> Result<Option<(Identity, Subject)>> {
        let Caller::Checked { who, raw } = self.caller else {
            return Ok(None);
        };
        let attr = self.core.getattr(node).await?.attr;
        let mut subject = self.owners.subject(&attr, *raw);
        // Another local user: the daemon is the only check, so the file's ACL counts here.
        // (The mounting user acts as the sandbox's user, whose requests the sandbox's own
        // kernel checks against the ACL.)
        if !*raw && matches!(attr.kind, FileKind::File | FileKind::Dir) {
            match self.core.getxattr(node, ACL_ACCESS).await {
                Ok(x) => subject.acl = Some(std::sync::Arc::new(self.owners.acl(&x))),
                Err(RemoteError::NoAttr(_) | RemoteError::Unsupported(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some((who.clone(), subject)))
    }

    async fn child_subject(&self, parent: NodeId, name: &[u8]) -> Result<Subject> {
        let raw = matches!(self.caller, Caller::Checked { raw: true, .. });
        let attr = self.core.child_attr(parent, name).await?;
        Ok(self.owners.subject(&attr, raw))
    }

    /// `want` ([`access::READ`] etc.) on `node`.
    pub async fn may(&self, node: NodeId, want: u32) -> Result<()> {
        match self.subject(node).await? {
            Some((who, f)) => access::may(&who, &f, want).map_err(|d| refused(self.core, node, d)),
            None => Ok(()),
        }
    }

    /// Looking a name up in `dir`: search permission on it.
    pub async fn lookup(&self, dir: NodeId) -> Result<()> {
        self.may(dir, access::EXEC).await
    }

    /// Opening `node` with `open(2)` flags.
    pub async fn open(&self, node: NodeId, flags: i32) -> Result<()> {
        self.may(node, access::open_wants(flags)).await
    }

    /// Adding a name to `dir`.
    pub async fn add(&self, dir: NodeId) -> Result<()> {
        match self.subject(dir).await? {
            Some((who, d)) => access::may_add(&who, &d).map_err(|e| refused(self.core, dir, e)),
            None => Ok(()),
        }
    }

    /// Who owns a file that the caller makes in `dir`, in the sandbox's numbers, when that is
    /// not the sandbox's user: another local user (`allow_other`) owns what it makes, with its
    /// group (the directory's in a set-group-ID directory), as on a local disk, so it may
    /// chmod, truncate and rename its own files. Only where the sandbox's user may give files
    /// away (root); otherwise `None` and the sandbox's user owns it, as before.
    pub async fn new_owner(&self, dir: NodeId) -> Option<(u32, u32)> {
        let Caller::Checked { who, raw: false } = self.caller else {
            return None;
        };
        if self.owners.sandbox.uid != 0 {
            return None;
        }
        let parent = self.core.getattr(dir).await.ok()?.attr;
        let (uid, gid) = self.owners.to_sandbox(Some(who.uid), Some(who.gid));
        let gid = if parent.mode & libc::S_ISGID != 0 {
            parent.gid
        } else {
            gid?
        };
        Some((uid?, gid))
    }

    /// `open(2)` with `O_CREAT` of `name` in `dir`: adding the name, or, when it is already
    /// there (and not `O_EXCL`), opening that file with `flags`.
    pub async fn create(
        &self,
        dir: NodeId,
        name: &[u8],
        exclusive: bool,
        flags: i32,
    ) -> Result<()> {
        let Some((who, _)) = self.subject(dir).await? else {
            return Ok(());
        };
        self.lookup(dir).await?;
        match self.child_subject(dir, name).await {
            Ok(f) if !exclusive => access::may(&who, &f, access::open_wants(flags))
                .map_err(|e| refused(self.core, dir, e)),
            Ok(_) | Err(RemoteError::NotFound(_)) => self.add(dir).await,
            Err(e) => Err(e),
        }
    }

    /// A hard link to `node` in `dir`.
    pub async fn link(&self, node: NodeId, dir: NodeId) -> Result<()> {
        let Some((who, f)) = self.subject(node).await? else {
            return Ok(());
        };
        self.add(dir).await?;
        access::may_link_to(&who, &f).map_err(|e| refused(self.core, node, e))
    }

    /// `access(2)`: as [`Gate::may`]; a caller nothing is checked for is root, who still
    /// executes only a file with an x bit.
    pub async fn access(&self, node: NodeId, want: u32) -> Result<()> {
        if let Caller::Unchecked = self.caller {
            let attr = self.core.getattr(node).await?.attr;
            let root = Identity::default();
            return access::may(&root, &self.owners.subject(&attr, true), want)
                .map_err(|d| refused(self.core, node, d));
        }
        self.may(node, want).await
    }

    /// Removing `name` from `dir`.
    pub async fn delete(&self, dir: NodeId, name: &[u8]) -> Result<()> {
        let Some((who, d)) = self.subject(dir).await? else {
            return Ok(());
        };
        // Search and write on the directory come first: without them even whether the name
        // exists is not the caller's to learn.
        access::may_add(&who, &d).map_err(|e| refused(self.core, dir, e))?;
        let victim = self.child_subject(dir, name).await?;
        access::may_delete(&who, &d, &victim).map_err(|e| refused(self.core, dir, e))
    }

    /// Renaming `name` in `dir` to `new_name` in `new_dir` (both names, for an exchange).
    pub async fn rename(
        &self,
        dir: NodeId,
        name: &[u8],
        new_dir: NodeId,
        new_name: &[u8],
        exchange: bool,
    ) -> Result<()> {
        let Some((who, _)) = self.subject(dir).await? else {
            return Ok(());
        };
        self.delete(dir, name).await?;
        let moved = self.child_subject(dir, name).await?;
        match self.child_subject(new_dir, new_name).await {
            Ok(_) => self.delete(new_dir, new_name).await?,
            Err(RemoteError::NotFound(_)) if !exchange => self.add(new_dir).await?,
            Err(e) => return Err(e),
        }
        if moved.is_dir && dir != new_dir {
            access::may_reparent(&who, &moved).map_err(|e| refused(self.core, dir, e))?;
        }
        Ok(())
    }

    /// A SETATTR: the mode to set (set-group-ID dropped where POSIX drops it). `uid`/`gid` are
    /// as the caller sees owners (shown numbers for anyone but the mounting user).
    #[allow(clippy::too_many_arguments)]
    pub async fn setattr(
        &self,
        node: NodeId,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        truncate_by_path: bool,
        times: Option<bool>,
    ) -> Result<Option<u32>> {
        let Some((who, f)) = self.subject(node).await? else {
            return Ok(mode);
        };
        let no = |d| refused(self.core, node, d);
        if uid.is_some() || gid.is_some() {
            access::may_chown(&who, &f, uid, gid).map_err(no)?;
        }
        let mode = match mode {
            Some(m) => Some(access::may_chmod(&who, &f, m, gid.unwrap_or(f.gid)).map_err(no)?),
            None => None,
        };
        if truncate_by_path {
            access::may(&who, &f, access::WRITE).map_err(no)?;
        }
        if let Some(explicit) = times {
            access::may_set_times(&who, &f, explicit).map_err(no)?;
        }
        Ok(mode)
    }

    /// Reading (`Get`) or changing (`Set`) the extended attribute `name`: `Ok(false)` when the
    /// answer is "no such attribute".
    pub async fn xattr(&self, node: NodeId, name: &[u8], what: access::XattrUse) -> Result<bool> {
        match self.subject(node).await? {
            Some((who, f)) => {
                access::may_xattr(&who, &f, name, what).map_err(|d| refused(self.core, node, d))
            }
            None => Ok(true),
        }
    }

    /// [`Self::xattr`] for a node known to have no extended attribute (so no ACL), from its
    /// trusted attributes; `None` when they are not at hand.
    pub fn xattr_known(
        &self,
        node: NodeId,
        name: &[u8],
        what: access::XattrUse,
    ) -> Option<Result<bool>> {
        let attr = self.core.attr_without_xattrs(node)?;
        Some(match self.caller {
            Caller::Checked { who, raw } => {
                let subject = self.owners.subject(&attr, *raw);
                access::may_xattr(who, &subject, name, what)
                    .map_err(|d| refused(self.core, node, d))
            }
            Caller::Unchecked => Ok(true),
        })
    }

    /// Whether a listed attribute name is shown to the caller.
    pub fn lists_xattr(&self, name: &[u8]) -> bool {
        match self.caller {
            Caller::Checked { who, .. } => access::lists_xattr(who, name),
            Caller::Unchecked => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(idmap: IdMap, checks: bool) -> Owners {
        Owners {
            idmap,
            mount_uid: 1000,
            mount_gid: 1000,
            sandbox: Identity {
                uid: 4242,
                gid: 4343,
                groups: vec![4343, 27],
            },
            checks,
        }
    }

    #[test]
    fn idmap_none_shows_the_sandbox_owners_and_user_maps_its_user_to_you() {
        assert_eq!(owners(IdMap::None, true).shown(4242, 4343), (4242, 4343));
        let user = owners(IdMap::User, true);
        assert_eq!(user.shown(4242, 4343), (1000, 1000));
        assert_eq!(user.shown(0, 27), (0, 27));
        assert_eq!(
            user.to_sandbox(Some(1000), Some(1000)),
            (Some(4242), Some(4343))
        );
        assert_eq!(user.to_sandbox(Some(7), None), (Some(7), None));
        assert_eq!(
            owners(IdMap::None, true).to_sandbox(Some(1000), None),
            (Some(1000), None)
        );
    }

    #[test]
    fn the_mounting_user_acts_as_the_sandbox_user_and_others_as_themselves() {
        let o = owners(IdMap::None, true);
        match o.caller(1000, 1000, 1) {
            Caller::Checked { who, raw } => {
                assert_eq!(who, o.sandbox);
                assert!(raw);
            }
            c => panic!("{c:?}"),
        }
        match o.caller(2000, 2001, u32::MAX) {
            Caller::Checked { who, raw } => {
                assert_eq!((who.uid, who.gid, who.groups.len()), (2000, 2001, 0));
                assert!(!raw);
            }
            c => panic!("{c:?}"),
        }
        assert!(matches!(
            owners(IdMap::None, false).caller(2000, 2000, 1),
            Caller::Unchecked
        ));
        let root_sandbox = Owners {
            sandbox: Identity::default(),
            ..o
        };
        assert!(matches!(
            root_sandbox.caller(1000, 1000, 1),
            Caller::Unchecked
        ));
    }

    proptest::proptest! {
        /// A status file is the kernel's, but a parser never panics on any text.
        #[test]
        fn any_status_text_parses_to_at_most_max_groups(text in ".{0,400}") {
            proptest::prop_assert!(parse_groups(&text).len() <= MAX_GROUPS);
        }
    }

    #[test]
    fn supplementary_groups_are_read_from_the_status_line() {
        let status = "Name:\tbash\nUid:\t1\t1\t1\t1\nGroups:\t4 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), vec![4, 27, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
    }
}
