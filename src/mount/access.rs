//! Who may do what on the mount: the POSIX permission rules, decided from who is asking, the
//! owners and mode of the file in question, and what is wanted. Pure: no I/O, so every rule is
//! unit-tested here; the FUSE adapter (through [`super::gate`]) only fetches the attributes and
//! maps the answer.
//!
//! The daemon checks instead of the kernel (`default_permissions`) because the mounting user
//! acts as the sandbox's user, whose uid the kernel does not know: the mounting user's requests
//! are checked as that identity against the sandbox's own owners, anyone else's (only with
//! `allow_other`) as themselves against the owners shown. The rules are Linux's
//! (`generic_permission`, `may_delete`, `setattr_prepare`, `xattr_permission`): root may do
//! anything except execute a file with no x bit at all. A file's POSIX access ACL, when it has
//! one, decides as Linux's `posix_acl_permission` does ([`Acl`]).

use std::sync::Arc;

use crate::remote::Identity;

/// Read, write and search/execute, as the `rwx` bits of one class.
pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const EXEC: u32 = 1;

/// What a check needs of a file: its owners and mode as the caller is judged against them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits with set-id and sticky (`0o7777`).
    pub mode: u32,
    pub is_dir: bool,
    /// A regular file or directory (the only kinds that carry `user.*` attributes).
    pub is_file_or_dir: bool,
    /// Its access ACL, if it has one (ids as the caller is judged against them).
    pub acl: Option<Arc<Acl>>,
}

/// A POSIX access ACL (`system.posix_acl_access`): the entries beyond the mode bits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    /// Named users and groups: `(id, rwx)`.
    pub users: Vec<(u32, u32)>,
    pub groups: Vec<(u32, u32)>,
    /// The owning group's entry (the mode's group bits are the mask when there is one).
    pub group_obj: u32,
    /// The most a named entry or a group may grant; none: no limit.
    pub mask: Option<u32>,
    /// Unreadable: only the owner's class applies ([`Acl::unreadable`]).
    pub closed: bool,
}

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

impl Acl {
    /// The kernel's xattr form (version 2; entries of tag, perm, id, little-endian), with the
    /// ids mapped by `id` (user ids and group ids as the caller is judged against them). An
    /// ACL the mount cannot read is `None` for the caller to refuse on.
    pub fn parse(xattr: &[u8], map: impl Fn(bool, u32) -> u32) -> Option<Acl> {
        let (head, body) = xattr.split_at_checked(4)?;
        if u32::from_le_bytes(head.try_into().ok()?) != 2 || body.len() % 8 != 0 {
            return None;
        }
        let mut acl = Acl::default();
        for e in body.chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]])) & 7;
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            match tag {
                ACL_USER => acl.users.push((map(true, id), perm)),
                ACL_GROUP => acl.groups.push((map(false, id), perm)),
                ACL_GROUP_OBJ => acl.group_obj = perm,
                ACL_MASK => acl.mask = Some(perm),
                ACL_USER_OBJ | ACL_OTHER => {}
                _ => return None,
            }
        }
        Some(acl)
    }

    /// An ACL the mount could not read: nobody but the owner (and root) gets anything.
    pub fn unreadable() -> Acl {
        Acl {
            closed: true,
            ..Acl::default()
        }
    }

    /// Whether `who` gets `want`, as `posix_acl_permission` decides: the owner's class from
    /// the mode; a named user's entry under the mask; else the first matching group entry
    /// (the owning group's or a named one) that grants all of `want` under the mask, any match
    /// at all shutting out the others' class; else the others' bits.
    fn allows(&self, who: &Identity, f: &Subject, want: u32) -> bool {
        let has = |bits: u32| want & !bits == 0;
        if who.uid == f.uid {
            return has((f.mode >> 6) & 7);
        }
        if self.closed {
            return false;
        }
        let mask = self.mask.unwrap_or(7);
        if let Some((_, perm)) = self.users.iter().find(|(id, _)| *id == who.uid) {
            return has(perm & mask);
        }
        let owning = in_group(who, f.gid).then_some(self.group_obj);
        let named = self
            .groups
            .iter()
            .filter(|(id, _)| in_group(who, *id))
            .map(|(_, perm)| *perm);
        let mut matched = false;
        for perm in owning.into_iter().chain(named) {
            if has(perm & mask) {
                return true;
            }
            matched = true;
        }
        !matched && has(f.mode & 7)
    }
}

/// Why not: `EACCES` (the mode bits say no) or `EPERM` (only the owner or root may).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    Access,
    Perm,
}

pub type Verdict = Result<(), Denied>;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

fn is_root(who: &Identity) -> bool {
    who.uid == 0
}

fn in_group(who: &Identity, gid: u32) -> bool {
    who.gid == gid || who.groups.contains(&gid)
}

/// `want` (a mask of [`READ`], [`WRITE`], [`EXEC`]) on `f`: the owner's class if the caller
/// owns it, else the group's if the caller is in its group, else the others'.
pub fn may(who: &Identity, f: &Subject, want: u32) -> Verdict {
    if is_root(who) {
        // Root searches any directory and executes any file with at least one x bit.
        let exec_refused = want & EXEC != 0 && !f.is_dir && f.mode & 0o111 == 0;
        return if exec_refused {
            Err(Denied::Access)
        } else {
            Ok(())
        };
    }
    if let Some(acl) = &f.acl {
        return if acl.allows(who, f, want) {
            Ok(())
        } else {
            Err(Denied::Access)
        };
    }
    let bits = if who.uid == f.uid {
        (f.mode >> 6) & 7
    } else if in_group(who, f.gid) {
        (f.mode >> 3) & 7
    } else {
        f.mode & 7
    };
    if want & !bits == 0 {
        Ok(())
    } else {
        Err(Denied::Access)
    }
}

/// What `open(2)` flags ask of the file: the access mode, `O_TRUNC` (write) and an exec's
/// open (`__FMODE_EXEC`, which the kernel passes in the flags).
pub fn open_wants(flags: i32) -> u32 {
    /// `__FMODE_EXEC`: set in the flags of the open `execve` makes.
    const FMODE_EXEC: i32 = 0x20;
    let mut want = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => READ,
        libc::O_WRONLY => WRITE,
        _ => READ | WRITE,
    };
    if flags & libc::O_TRUNC != 0 {
        want |= WRITE;
    }
    if flags & FMODE_EXEC != 0 {
        want |= EXEC;
    }
    want
}

/// Adding a name to directory `dir` (create, mkdir, mknod, symlink, link, a rename's target).
pub fn may_add(who: &Identity, dir: &Subject) -> Verdict {
    may(who, dir, WRITE | EXEC)
}

/// Removing `victim`'s name from `dir` (unlink, rmdir, a rename's source or replaced target):
/// write and search on the directory, and in a sticky directory only the owner of the
/// directory or of the file (or root) may (`EPERM` otherwise, as Linux answers).
pub fn may_delete(who: &Identity, dir: &Subject, victim: &Subject) -> Verdict {
    may(who, dir, WRITE | EXEC)?;
    let sticky = dir.mode & S_ISVTX != 0;
    if sticky && !is_root(who) && who.uid != dir.uid && who.uid != victim.uid {
        return Err(Denied::Perm);
    }
    Ok(())
}

/// The file a hard link is made to (Linux's `protected_hardlinks`, on by default): its owner,
/// root, or someone who may read and write it, and never a set-user-ID file or an executable
/// set-group-ID one (`EPERM`) — so nobody pins a file they could not change where its owner
/// does not expect it.
pub fn may_link_to(who: &Identity, f: &Subject) -> Verdict {
    if is_root(who) || who.uid == f.uid {
        return Ok(());
    }
    let setid = f.mode & S_ISUID != 0 || f.mode & (S_ISGID | 0o010) == S_ISGID | 0o010;
    if f.is_dir || setid || may(who, f, READ | WRITE).is_err() {
        return Err(Denied::Perm);
    }
    Ok(())
}

/// A directory moved to another parent: its `..` changes, so it must be writable too.
pub fn may_reparent(who: &Identity, moved_dir: &Subject) -> Verdict {
    may(who, moved_dir, WRITE)
}

/// `chmod` to `mode`: only the owner or root (`EPERM`). The mode actually set: set-group-ID
/// is dropped when a non-root caller is not in the file's group (`gid`, the new group if the
/// same call changes it). A change that only clears a file's set-id bits (the kernel's own,
/// after a write) is anyone's who may write the file.
pub fn may_chmod(who: &Identity, f: &Subject, mode: u32, gid: u32) -> Result<u32, Denied> {
    let only_clears_setid = mode == f.mode & !(S_ISUID | S_ISGID) && mode != f.mode;
    if only_clears_setid && !f.is_dir && may(who, f, WRITE).is_ok() {
        return Ok(mode);
    }
    if !is_root(who) && who.uid != f.uid {
        return Err(Denied::Perm);
    }
    if !is_root(who) && !in_group(who, gid) {
        return Ok(mode & !S_ISGID);
    }
    Ok(mode)
}

/// `chown`: root changes anything; the owner may "change" the owner to itself and the group to
/// one it is in; anyone else gets `EPERM` (as Linux answers even for a chown to the same owner).
pub fn may_chown(who: &Identity, f: &Subject, uid: Option<u32>, gid: Option<u32>) -> Verdict {
    if is_root(who) {
        return Ok(());
    }
    let owner = who.uid == f.uid;
    if uid.is_some_and(|u| !owner || u != f.uid) {
        return Err(Denied::Perm);
    }
    if gid.is_some_and(|g| !owner || (g != f.gid && !in_group(who, g))) {
        return Err(Denied::Perm);
    }
    Ok(())
}

/// Setting times: explicit times only by the owner or root (`EPERM`); "now" also by anyone
/// who may write (`EACCES` otherwise).
pub fn may_set_times(who: &Identity, f: &Subject, explicit: bool) -> Verdict {
    if is_root(who) || who.uid == f.uid {
        return Ok(());
    }
    if explicit {
        return Err(Denied::Perm);
    }
    may(who, f, WRITE)
}

/// Which extended attribute is asked about, and whether to change it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrUse {
    Get,
    Set,
}

/// An extended attribute by name: `user.*` needs read (get) or write (set/remove) permission
/// and exists only on regular files and directories (`EPERM` to set one elsewhere), and a
/// sticky directory's only for its owner; `trusted.*` is root's (`EPERM` to set, "no such
/// attribute" to read, as Linux answers); any other namespace (ACLs, `security.*`) is changed
/// only by the owner or root. `Ok(false)`: answer "no such attribute".
pub fn may_xattr(who: &Identity, f: &Subject, name: &[u8], what: XattrUse) -> Result<bool, Denied> {
    if name.starts_with(b"trusted.") && !is_root(who) {
        return match what {
            XattrUse::Set => Err(Denied::Perm),
            XattrUse::Get => Ok(false),
        };
    }
    if !name.starts_with(b"user.") {
        // ACLs (`system.posix_acl_*`) and `security.*`: read by anyone, changed only by the
        // owner or root (an ACL is a chmod by other means).
        let owner = is_root(who) || who.uid == f.uid;
        return match what {
            XattrUse::Set if !owner => Err(Denied::Perm),
            _ => Ok(true),
        };
    }
    if !f.is_file_or_dir {
        return match what {
            XattrUse::Set => Err(Denied::Perm),
            XattrUse::Get => Ok(false),
        };
    }
    match what {
        XattrUse::Get => may(who, f, READ)?,
        XattrUse::Set => {
            let sticky_dir = f.is_dir && f.mode & S_ISVTX != 0;
            if sticky_dir && !is_root(who) && who.uid != f.uid {
                return Err(Denied::Perm);
            }
            may(who, f, WRITE)?
        }
    }
    Ok(true)
}

/// The access ACL a file has when it has none: the owner's, group's and others' bits.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL (what new names in it inherit).
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The permission bits a POSIX access ACL stands for when it is *minimal* (the owner, group
/// and other entries only, in the kernel's xattr format: version 2, then 8-byte entries of
/// tag, permissions, id): setting it is a chmod, and a file holds no ACL after it, as
/// `posix_acl_equiv_mode` decides. `None`: an extended ACL, or not an ACL at all.
pub fn minimal_acl_mode(value: &[u8]) -> Option<u32> {
    const USER_OBJ: u16 = 0x01;
    const GROUP_OBJ: u16 = 0x04;
    const OTHER: u16 = 0x20;
    let (version, entries) = value.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*version) != 2 || entries.len() != 3 * 8 {
        return None;
    }
    let mut bits = [None; 3];
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        if perm & !7 != 0 {
            return None;
        }
        let slot = match tag {
            USER_OBJ => 0,
            GROUP_OBJ => 1,
            OTHER => 2,
            _ => return None,
        };
        if bits[slot].replace(u32::from(perm)).is_some() {
            return None;
        }
    }
    let [Some(u), Some(g), Some(o)] = bits else {
        return None;
    };
    Some(u << 6 | g << 3 | o)
}

/// Whether `listxattr` shows `name` to this caller (`trusted.*` only to root).
pub fn lists_xattr(who: &Identity, name: &[u8]) -> bool {
    is_root(who) || !name.starts_with(b"trusted.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_acl_is_a_mode_and_an_extended_one_is_not() {
        let acl = |entries: &[(u16, u16, u32)]| {
            let mut v = 2u32.to_le_bytes().to_vec();
            for (tag, perm, id) in entries {
                v.extend_from_slice(&tag.to_le_bytes());
                v.extend_from_slice(&perm.to_le_bytes());
                v.extend_from_slice(&id.to_le_bytes());
            }
            v
        };
        let any = u32::MAX;
        // What `cp -a` sets on a 0644 file (and 0755 on a directory).
        assert_eq!(
            minimal_acl_mode(&acl(&[(0x01, 6, any), (0x04, 4, any), (0x20, 4, any)])),
            Some(0o644)
        );
        assert_eq!(
            minimal_acl_mode(&acl(&[(0x01, 7, any), (0x04, 5, any), (0x20, 5, any)])),
            Some(0o755)
        );
        // A named user, a mask, a repeated entry, a missing one, bad bits, another version.
        let extended = [
            acl(&[
                (0x01, 6, any),
                (0x02, 6, 1000),
                (0x04, 4, any),
                (0x20, 4, any),
            ]),
            acl(&[(0x01, 6, any), (0x04, 4, any), (0x10, 4, any)]),
            acl(&[(0x01, 6, any), (0x01, 4, any), (0x20, 4, any)]),
            acl(&[(0x01, 6, any), (0x04, 4, any)]),
            acl(&[(0x01, 8, any), (0x04, 4, any), (0x20, 4, any)]),
        ];
        for v in extended {
            assert_eq!(minimal_acl_mode(&v), None, "{v:?}");
        }
        let mut v1 = acl(&[(0x01, 6, any), (0x04, 4, any), (0x20, 4, any)]);
        v1[0] = 1;
        assert_eq!(minimal_acl_mode(&v1), None);
        assert_eq!(minimal_acl_mode(b""), None);
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Identity {
        Identity {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    fn file(uid: u32, gid: u32, mode: u32) -> Subject {
        Subject {
            uid,
            gid,
            mode,
            is_dir: false,
            is_file_or_dir: true,
            acl: None,
        }
    }

    fn dir(uid: u32, gid: u32, mode: u32) -> Subject {
        Subject {
            is_dir: true,
            ..file(uid, gid, mode)
        }
    }

    const ROOT: Identity = Identity {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };

    proptest::proptest! {
        /// Whoever asks, a non-root caller is never granted a bit its class does not have,
        /// and root is refused only execution of a file with no x bit.
        #[test]
        fn no_caller_gets_more_than_its_class(
            uid in 0u32..4, gid in 0u32..4, groups in proptest::collection::vec(0u32..4, 0..3),
            fuid in 0u32..4, fgid in 0u32..4, mode in 0u32..0o10000, is_dir: bool, want in 0u32..8,
        ) {
            let who = user(uid, gid, &groups);
            let f = Subject { uid: fuid, gid: fgid, mode, is_dir, is_file_or_dir: true, acl: None };
            let class = if uid == fuid {
                mode >> 6
            } else if gid == fgid || groups.contains(&fgid) {
                mode >> 3
            } else {
                mode
            } & 7;
            let allowed = may(&who, &f, want).is_ok();
            if uid == 0 {
                proptest::prop_assert_eq!(allowed, want & EXEC == 0 || is_dir || mode & 0o111 != 0);
            } else {
                proptest::prop_assert_eq!(allowed, want & !class == 0);
            }
        }
    }

    #[test]
    fn the_owner_class_applies_to_the_owner_even_when_the_others_have_more() {
        let f = file(1000, 1000, 0o077);
        assert_eq!(may(&user(1000, 1000, &[]), &f, READ), Err(Denied::Access));
        assert_eq!(may(&user(2000, 2000, &[]), &f, READ | WRITE), Ok(()));
    }

    #[test]
    fn the_group_class_applies_through_the_primary_or_a_supplementary_group() {
        let f = file(1000, 50, 0o640);
        assert_eq!(may(&user(2000, 50, &[]), &f, READ), Ok(()));
        assert_eq!(may(&user(2000, 7, &[50]), &f, READ), Ok(()));
        assert_eq!(may(&user(2000, 7, &[50]), &f, WRITE), Err(Denied::Access));
        assert_eq!(may(&user(2000, 7, &[8]), &f, READ), Err(Denied::Access));
    }

    #[test]
    fn root_reads_and_writes_anything_but_executes_only_a_file_with_an_x_bit() {
        assert_eq!(may(&ROOT, &file(5, 5, 0o000), READ | WRITE), Ok(()));
        assert_eq!(may(&ROOT, &file(5, 5, 0o600), EXEC), Err(Denied::Access));
        assert_eq!(may(&ROOT, &file(5, 5, 0o001), EXEC), Ok(()));
        assert_eq!(may(&ROOT, &dir(5, 5, 0o000), EXEC), Ok(()));
    }

    #[test]
    fn open_flags_ask_for_read_write_and_exec_as_the_call_does() {
        assert_eq!(open_wants(libc::O_RDONLY), READ);
        assert_eq!(open_wants(libc::O_WRONLY), WRITE);
        assert_eq!(open_wants(libc::O_RDWR), READ | WRITE);
        assert_eq!(open_wants(libc::O_RDONLY | libc::O_TRUNC), READ | WRITE);
        assert_eq!(open_wants(libc::O_RDONLY | 0x20), READ | EXEC);
    }

    #[test]
    fn adding_a_name_needs_write_and_search_on_the_directory() {
        let d = dir(1000, 1000, 0o755);
        assert_eq!(may_add(&user(1000, 1000, &[]), &d), Ok(()));
        assert_eq!(may_add(&user(2000, 2000, &[]), &d), Err(Denied::Access));
        let write_only = dir(1000, 1000, 0o300);
        assert_eq!(may_add(&user(1000, 1000, &[]), &write_only), Ok(()));
        let no_search = dir(1000, 1000, 0o600);
        assert_eq!(
            may_add(&user(1000, 1000, &[]), &no_search),
            Err(Denied::Access)
        );
    }

    #[test]
    fn in_a_sticky_directory_only_the_owners_or_root_delete() {
        let tmp = dir(0, 0, 0o1777);
        let theirs = file(1000, 1000, 0o666);
        assert_eq!(
            may_delete(&user(2000, 2000, &[]), &tmp, &theirs),
            Err(Denied::Perm)
        );
        assert_eq!(may_delete(&user(1000, 1000, &[]), &tmp, &theirs), Ok(()));
        assert_eq!(may_delete(&ROOT, &tmp, &theirs), Ok(()));
        let own_sticky = dir(2000, 2000, 0o1777);
        assert_eq!(
            may_delete(&user(2000, 2000, &[]), &own_sticky, &theirs),
            Ok(())
        );
        // Without the sticky bit, write on the directory is all it takes.
        let open = dir(0, 0, 0o777);
        assert_eq!(may_delete(&user(2000, 2000, &[]), &open, &theirs), Ok(()));
        let closed = dir(0, 0, 0o755);
        assert_eq!(
            may_delete(&user(1000, 1000, &[]), &closed, &theirs),
            Err(Denied::Access)
        );
    }

    #[test]
    fn a_hard_link_is_to_a_file_of_ones_own_or_one_that_may_be_read_and_written() {
        let other = user(2000, 2000, &[]);
        assert_eq!(
            may_link_to(&other, &file(1000, 1000, 0o644)),
            Err(Denied::Perm)
        );
        assert_eq!(may_link_to(&other, &file(1000, 1000, 0o666)), Ok(()));
        assert_eq!(
            may_link_to(&other, &file(1000, 1000, 0o4777)),
            Err(Denied::Perm)
        );
        assert_eq!(
            may_link_to(&user(1000, 1, &[]), &file(1000, 1000, 0o400)),
            Ok(())
        );
        assert_eq!(may_link_to(&ROOT, &file(1000, 1000, 0o4700)), Ok(()));
    }

    #[test]
    fn chmod_is_the_owners_and_drops_setgid_outside_the_group() {
        let f = file(1000, 50, 0o644);
        assert_eq!(
            may_chmod(&user(2000, 50, &[]), &f, 0o600, 50),
            Err(Denied::Perm)
        );
        assert_eq!(may_chmod(&user(1000, 1000, &[]), &f, 0o2755, 50), Ok(0o755));
        assert_eq!(
            may_chmod(&user(1000, 1000, &[50]), &f, 0o2755, 50),
            Ok(0o2755)
        );
        assert_eq!(may_chmod(&ROOT, &f, 0o6755, 50), Ok(0o6755));
    }

    #[test]
    fn clearing_set_id_bits_after_a_write_is_not_a_chmod() {
        let f = file(1000, 50, 0o6777);
        assert_eq!(may_chmod(&user(2000, 2000, &[]), &f, 0o777, 50), Ok(0o777));
        // Not for one who could not have written, nor on a directory.
        let ro = file(1000, 50, 0o6755);
        assert_eq!(
            may_chmod(&user(2000, 2000, &[]), &ro, 0o755, 50),
            Err(Denied::Perm)
        );
        let d = dir(1000, 50, 0o2777);
        assert_eq!(
            may_chmod(&user(2000, 2000, &[]), &d, 0o777, 50),
            Err(Denied::Perm)
        );
        assert_eq!(
            may_chmod(&user(2000, 2000, &[]), &f, 0o6755, 50),
            Err(Denied::Perm)
        );
    }

    #[test]
    fn chown_is_roots_and_chgrp_the_owners_to_a_group_of_theirs() {
        let f = file(1000, 1000, 0o644);
        let owner = user(1000, 1000, &[50]);
        assert_eq!(may_chown(&owner, &f, Some(2000), None), Err(Denied::Perm));
        assert_eq!(may_chown(&owner, &f, Some(1000), Some(50)), Ok(()));
        assert_eq!(may_chown(&owner, &f, None, Some(60)), Err(Denied::Perm));
        assert_eq!(
            may_chown(&user(2000, 50, &[]), &f, None, Some(50)),
            Err(Denied::Perm)
        );
        // Linux refuses a non-owner's chown even to the owner the file already has.
        assert_eq!(
            may_chown(&user(2000, 2000, &[]), &f, Some(1000), None),
            Err(Denied::Perm)
        );
        assert_eq!(may_chown(&ROOT, &f, Some(7), Some(7)), Ok(()));
    }

    #[test]
    fn times_are_set_by_the_owner_and_now_by_anyone_who_may_write() {
        let f = file(1000, 1000, 0o666);
        let other = user(2000, 2000, &[]);
        assert_eq!(may_set_times(&other, &f, true), Err(Denied::Perm));
        assert_eq!(may_set_times(&other, &f, false), Ok(()));
        let ro = file(1000, 1000, 0o644);
        assert_eq!(may_set_times(&other, &ro, false), Err(Denied::Access));
        assert_eq!(may_set_times(&user(1000, 1, &[]), &ro, true), Ok(()));
    }

    #[test]
    fn user_xattrs_follow_the_mode_and_trusted_ones_are_roots() {
        let f = file(1000, 1000, 0o644);
        let other = user(2000, 2000, &[]);
        assert_eq!(may_xattr(&other, &f, b"user.k", XattrUse::Get), Ok(true));
        assert_eq!(
            may_xattr(&other, &f, b"user.k", XattrUse::Set),
            Err(Denied::Access)
        );
        let private = file(1000, 1000, 0o600);
        assert_eq!(
            may_xattr(&other, &private, b"user.k", XattrUse::Get),
            Err(Denied::Access)
        );
        assert_eq!(
            may_xattr(&other, &f, b"trusted.k", XattrUse::Set),
            Err(Denied::Perm)
        );
        assert_eq!(
            may_xattr(&other, &f, b"trusted.k", XattrUse::Get),
            Ok(false)
        );
        assert_eq!(may_xattr(&ROOT, &f, b"trusted.k", XattrUse::Set), Ok(true));
        let fifo = Subject {
            is_file_or_dir: false,
            ..f.clone()
        };
        assert_eq!(
            may_xattr(&user(1000, 1000, &[]), &fifo, b"user.k", XattrUse::Set),
            Err(Denied::Perm)
        );
        let sticky = dir(1000, 1000, 0o1777);
        assert_eq!(
            may_xattr(&other, &sticky, b"user.k", XattrUse::Set),
            Err(Denied::Perm)
        );
        assert_eq!(
            may_xattr(&other, &f, b"system.posix_acl_access", XattrUse::Set),
            Err(Denied::Perm)
        );
        assert_eq!(
            may_xattr(&other, &f, b"system.posix_acl_access", XattrUse::Get),
            Ok(true)
        );
        assert_eq!(
            may_xattr(
                &user(1000, 1, &[]),
                &f,
                b"system.posix_acl_access",
                XattrUse::Set
            ),
            Ok(true)
        );
        assert!(!lists_xattr(&other, b"trusted.k"));
        assert!(lists_xattr(&other, b"user.k"));
    }

    /// The kernel's xattr form of an ACL: (tag, perm, id) entries after the version.
    fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    fn with_acl(f: Subject, entries: &[(u16, u16, u32)]) -> Subject {
        let acl = Acl::parse(&acl_xattr(entries), |_, id| id).expect("a valid ACL");
        Subject {
            acl: Some(Arc::new(acl)),
            ..f
        }
    }

    #[test]
    fn an_acl_decides_for_named_users_and_groups_under_its_mask() {
        const NOBODY: u32 = u32::MAX;
        let them = user(3001, 3001, &[]);
        // 0644 with `u:3001:---`: the others' r no longer reaches them.
        let f = with_acl(
            file(1000, 1000, 0o644),
            &[
                (1, 6, NOBODY),
                (2, 0, 3001),
                (4, 4, NOBODY),
                (0x10, 4, NOBODY),
                (0x20, 4, NOBODY),
            ],
        );
        assert_eq!(may(&them, &f, READ), Err(Denied::Access));
        assert_eq!(may(&user(3002, 3002, &[]), &f, READ), Ok(()));
        assert_eq!(may(&user(1000, 1000, &[]), &f, READ | WRITE), Ok(()));
        // 0646 (mask r--) with `u:3001:rw-`: the mask leaves them read only, though the
        // others' class would let them write.
        let f = with_acl(
            file(1000, 1000, 0o646),
            &[
                (1, 6, NOBODY),
                (2, 6, 3001),
                (4, 4, NOBODY),
                (0x10, 4, NOBODY),
                (0x20, 6, NOBODY),
            ],
        );
        assert_eq!(may(&them, &f, READ), Ok(()));
        assert_eq!(may(&them, &f, WRITE), Err(Denied::Access));
        assert_eq!(may(&user(3002, 3002, &[]), &f, WRITE), Ok(()));
        // Groups: one matching entry must grant all that is wanted; a match shuts out others.
        let f = with_acl(
            file(1000, 1000, 0o606),
            &[
                (1, 6, NOBODY),
                (4, 0, NOBODY),
                (8, 4, 50),
                (8, 2, 51),
                (0x10, 6, NOBODY),
                (0x20, 6, NOBODY),
            ],
        );
        let in_both = user(3003, 3003, &[50, 51]);
        assert_eq!(may(&in_both, &f, READ), Ok(()));
        assert_eq!(may(&in_both, &f, WRITE), Ok(()));
        assert_eq!(may(&in_both, &f, READ | WRITE), Err(Denied::Access));
        assert_eq!(may(&user(3004, 1000, &[]), &f, READ), Err(Denied::Access));
        // Root is root.
        assert_eq!(may(&ROOT, &f, READ | WRITE), Ok(()));
    }

    #[test]
    fn an_acl_the_mount_cannot_read_lets_only_the_owner_in() {
        assert!(Acl::parse(b"junk", |_, id| id).is_none());
        assert!(Acl::parse(&acl_xattr(&[(0x40, 7, 0)]), |_, id| id).is_none());
        let f = Subject {
            acl: Some(Arc::new(Acl::unreadable())),
            ..file(1000, 1000, 0o666)
        };
        assert_eq!(may(&user(3001, 3001, &[]), &f, READ), Err(Denied::Access));
        assert_eq!(may(&user(1000, 1000, &[]), &f, READ), Ok(()));
    }
}
