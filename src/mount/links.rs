//! How a sandbox symlink's target is shown on the laptop. The kernel resolves a symlink read
//! from the mount against the laptop's own tree, so a target the sandbox chose must never lead
//! to a local file (`ln -s /home/me/.bashrc evil` in the sandbox, then `echo x > MNT/evil`).
//!
//! - An absolute target inside the workspace (beneath the agent's `root`) is shown relative
//!   to the link, as sshfs's `transform_symlinks` does: `/ws/a/b` seen from `x/y/link` is
//!   `../../a/b`, which the kernel resolves inside the mount.
//! - A relative target is shown as it is when it stays beneath the mount, judged lexically:
//!   leading `..` may climb only as far as the link's own depth, and a `..` after any other
//!   component counts as leaving (that component may itself be a link, to anywhere).
//! - Anything else is outside, shown as [`OUTSIDE_PREFIX`] followed by the original target.
//!   `/dev/null` is a character device, so any path through it fails with ENOTDIR: open,
//!   create and write through such a link fail, and no local file is ever reached.
//!
//! The sandbox's own target stays available unaltered through the control surface
//! (`sbxfs ctl readlink`).

/// What an outside target is shown under: a path that cannot resolve on any Linux system.
pub const OUTSIDE_PREFIX: &[u8] = b"/dev/null/sbxfs-outside";

/// The target to show for a symlink at `link` (workspace-relative, its last component the
/// link's name) whose sandbox target is `target`. `root` is the workspace's absolute path in
/// the sandbox, if known (without it, every absolute target counts as outside).
pub fn present_target(root: Option<&[u8]>, link: &[u8], target: &[u8]) -> Vec<u8> {
    if target.is_empty() {
        return Vec::new();
    }
    // The kernel reads a target only up to its first NUL: judged whole, `..\0x` would pass
    // for one name and lead to `..`.
    if target.contains(&0) {
        return outside(target);
    }
    let depth = link.split(|&b| b == b'/').filter(|c| !c.is_empty()).count();
    let depth = depth.saturating_sub(1);
    let shown = if target.first() == Some(&b'/') {
        root.and_then(|r| beneath(r, target))
            .and_then(|rest| relative_from(depth, &rest))
    } else {
        stays_beneath(depth, target).then(|| target.to_vec())
    };
    shown.unwrap_or_else(|| outside(target))
}

/// The target to show for a link reachable by several names (a hard-linked symlink): the
/// kernel reads it through whichever name a path took, so one shown target must be safe from
/// every one of them. That is the target each name would show, when they all agree; outside
/// when they differ (an inside target seen from two depths), or when there is no name.
pub fn present_target_from_all(root: Option<&[u8]>, links: &[&[u8]], target: &[u8]) -> Vec<u8> {
    let mut shown = links.iter().map(|l| present_target(root, l, target));
    let Some(first) = shown.next() else {
        return outside(target);
    };
    if shown.all(|s| s == first) {
        first
    } else {
        outside(target)
    }
}

fn outside(target: &[u8]) -> Vec<u8> {
    let mut v = OUTSIDE_PREFIX.to_vec();
    if target.first() != Some(&b'/') {
        v.push(b'/');
    }
    // A NUL would end the path the kernel sees: shown as `\0`.
    for &b in target {
        match b {
            0 => v.extend_from_slice(b"\\0"),
            b => v.push(b),
        }
    }
    v
}

/// `target`'s components below `root`, if it is `root` or beneath it (component-wise).
fn beneath<'a>(root: &[u8], target: &'a [u8]) -> Option<Vec<&'a [u8]>> {
    if root.first() != Some(&b'/') {
        return None;
    }
    let parts = |p: &'a [u8]| -> Vec<&'a [u8]> {
        p.split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect()
    };
    let root_parts: Vec<&[u8]> = root
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if root_parts.iter().any(|c| *c == b"..") {
        return None;
    }
    let t = parts(target);
    if t.len() < root_parts.len() || t[..root_parts.len()] != root_parts[..] {
        return None;
    }
    Some(t[root_parts.len()..].to_vec())
}

/// The relative target from a link at `depth` (its directory's depth below the root) to the
/// workspace path `rest`; `None` if `rest` climbs (`..`), which is never trusted.
fn relative_from(depth: usize, rest: &[&[u8]]) -> Option<Vec<u8>> {
    if rest.iter().any(|c| *c == b"..") {
        return None;
    }
    let mut parts: Vec<&[u8]> = vec![b".."; depth];
    parts.extend_from_slice(rest);
    if parts.is_empty() {
        return Some(b".".to_vec());
    }
    Some(parts.join(&b'/'))
}

/// Whether a relative target read from a link at `depth` stays beneath the workspace root.
fn stays_beneath(depth: usize, target: &[u8]) -> bool {
    let mut level = depth;
    let mut after_name = false;
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." if after_name => return false,
            b".." => match level.checked_sub(1) {
                Some(l) => level = l,
                None => return false,
            },
            _ => after_name = true,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(root: &str, link: &str, target: &str) -> String {
        String::from_utf8(present_target(
            Some(root.as_bytes()),
            link.as_bytes(),
            target.as_bytes(),
        ))
        .unwrap()
    }

    #[test]
    fn a_link_with_several_names_shows_a_target_safe_from_every_one() {
        let root = Some(b"/ws".as_slice());
        let deep = b"d1/d2/d3/d4/d5/d6/d7/d8/link".as_slice();
        let climb = b"../../../../../../../../tmp/victim".as_slice();
        // From depth 8 it stays inside; from the top it would leave: never shown as is.
        assert_eq!(present_target(root, deep, climb), climb);
        let both = present_target_from_all(root, &[deep, b"top"], climb);
        assert!(both.starts_with(OUTSIDE_PREFIX), "{both:?}");
        let both = present_target_from_all(root, &[b"top", deep], climb);
        assert!(both.starts_with(OUTSIDE_PREFIX), "{both:?}");
        // An absolute target inside, from two depths: two different relative forms.
        let both = present_target_from_all(root, &[b"a/l", b"l"], b"/ws/x");
        assert!(both.starts_with(OUTSIDE_PREFIX), "{both:?}");
        // Names that agree (same depth) show what each would.
        assert_eq!(
            present_target_from_all(root, &[b"a/l", b"b/m"], b"/ws/x"),
            b"../x"
        );
        assert_eq!(present_target_from_all(root, &[b"l", b"m"], b"x"), b"x");
        assert!(present_target_from_all(root, &[], b"x").starts_with(OUTSIDE_PREFIX));
    }

    #[test]
    fn an_absolute_target_inside_the_workspace_is_shown_relative_to_the_link() {
        assert_eq!(shown("/ws", "x/y/link", "/ws/a/b"), "../../a/b");
        assert_eq!(shown("/ws", "link", "/ws/a/b"), "a/b");
        assert_eq!(shown("/ws/", "link", "/ws//a/./b"), "a/b");
        assert_eq!(shown("/ws", "link", "/ws"), ".");
        assert_eq!(shown("/ws", "d/link", "/ws/"), "..");
        assert_eq!(shown("/", "d/link", "/etc/passwd"), "../etc/passwd");
    }

    #[test]
    fn an_absolute_target_outside_the_workspace_cannot_resolve() {
        assert_eq!(
            shown("/ws", "evil", "/home/me/.bashrc"),
            "/dev/null/sbxfs-outside/home/me/.bashrc"
        );
        // A sibling whose name starts with the root's is not beneath it.
        assert_eq!(shown("/ws", "l", "/wsx/f"), "/dev/null/sbxfs-outside/wsx/f");
        // `..` inside an absolute target is never trusted.
        assert_eq!(
            shown("/ws", "l", "/ws/a/../../etc"),
            "/dev/null/sbxfs-outside/ws/a/../../etc"
        );
        // Without a known root, every absolute target is outside.
        assert_eq!(
            present_target(None, b"l", b"/ws/a"),
            b"/dev/null/sbxfs-outside/ws/a".to_vec()
        );
        assert_eq!(
            present_target(Some(b"relative"), b"l", b"/relative/a"),
            b"/dev/null/sbxfs-outside/relative/a".to_vec()
        );
    }

    #[test]
    fn a_relative_target_is_kept_while_it_stays_beneath_the_mount() {
        assert_eq!(shown("/ws", "alias", "target.txt"), "target.txt");
        assert_eq!(shown("/ws", "a/b/l", "../../c"), "../../c");
        assert_eq!(shown("/ws", "a/b/l", "./../x/./y"), "./../x/./y");
        assert_eq!(shown("/ws", "l", "."), ".");
    }

    #[test]
    fn a_target_with_a_nul_cannot_resolve() {
        // The kernel would follow `..\0x` as `..`: the mountpoint's parent, a laptop directory.
        assert_eq!(
            shown("/ws", "evil", "..\0x"),
            "/dev/null/sbxfs-outside/..\\0x"
        );
        assert_eq!(
            shown("/ws", "a/b/evil", "../../..\0"),
            "/dev/null/sbxfs-outside/../../..\\0"
        );
        assert_eq!(
            shown("/ws", "evil", "/ws/a\0/../../etc"),
            "/dev/null/sbxfs-outside/ws/a\\0/../../etc"
        );
    }

    #[test]
    fn a_relative_target_that_climbs_out_cannot_resolve() {
        assert_eq!(
            shown("/ws", "a/b/l", "../../../etc"),
            "/dev/null/sbxfs-outside/../../../etc"
        );
        assert_eq!(shown("/ws", "l", ".."), "/dev/null/sbxfs-outside/..");
        // `x/..` is only `.` if `x` is a directory; `x` may be a link to anywhere.
        assert_eq!(
            shown("/ws", "a/l", "x/../y"),
            "/dev/null/sbxfs-outside/x/../y"
        );
    }

    #[test]
    fn every_shown_target_is_relative_or_under_the_outside_prefix() {
        for t in ["/", "//", "/ws/..", "../", "a/../../..", "/dev/null", "x"] {
            let s = present_target(Some(b"/ws"), b"d/l", t.as_bytes());
            assert!(
                s.first() != Some(&b'/') || s.starts_with(OUTSIDE_PREFIX),
                "{t} → {}",
                String::from_utf8_lossy(&s)
            );
        }
    }

    use proptest::prelude::*;

    /// Where `target`, read from a link in the directory `dir` (components), leads when every
    /// name is a plain directory: `None` if it climbs above the root.
    fn resolve(dir: &[&[u8]], target: &[u8]) -> Option<Vec<Vec<u8>>> {
        // As the kernel reads it: up to the first NUL.
        let target = target.split(|&b| b == 0).next().unwrap_or_default();
        let mut at: Vec<Vec<u8>> = if target.first() == Some(&b'/') {
            Vec::new()
        } else {
            dir.iter().map(|c| c.to_vec()).collect()
        };
        for c in target.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => {
                    at.pop()?;
                }
                n => at.push(n.to_vec()),
            }
        }
        Some(at)
    }

    proptest! {
        #[test]
        fn a_shown_target_stays_in_the_mount_or_cannot_resolve(
            link in proptest::collection::vec("[a-c]{1,2}", 1..5),
            target in "[/.a-c\x00]{0,24}",
        ) {
            let link = link.join("/");
            let shown = present_target(Some(b"/ws"), link.as_bytes(), target.as_bytes());
            if shown.first() == Some(&b'/') {
                prop_assert!(shown.starts_with(OUTSIDE_PREFIX));
            } else {
                let parts: Vec<&[u8]> = link.as_bytes().split(|&b| b == b'/').collect();
                let dir = &parts[..parts.len() - 1];
                prop_assert!(resolve(dir, &shown).is_some(), "{link} → {}", String::from_utf8_lossy(&shown));
            }
        }

        #[test]
        fn an_absolute_target_inside_leads_where_it_pointed(
            link in proptest::collection::vec("[a-c]{1,2}", 1..5),
            inside in proptest::collection::vec("[a-c]{1,2}", 0..5),
        ) {
            let link = link.join("/");
            let target = format!("/ws/{}", inside.join("/"));
            let shown = present_target(Some(b"/ws"), link.as_bytes(), target.as_bytes());
            let parts: Vec<&[u8]> = link.as_bytes().split(|&b| b == b'/').collect();
            let dir = &parts[..parts.len() - 1];
            let want: Vec<Vec<u8>> = inside.iter().map(|c| c.as_bytes().to_vec()).collect();
            prop_assert_eq!(resolve(dir, &shown), Some(want));
        }

        #[test]
        fn any_bytes_are_shown_without_panicking(
            root in proptest::collection::vec(any::<u8>(), 0..20),
            link in proptest::collection::vec(any::<u8>(), 0..40),
            target in proptest::collection::vec(any::<u8>(), 0..60),
        ) {
            let shown = present_target(Some(&root), &link, &target);
            // Never an absolute path of the laptop's, whatever the root, and never a NUL
            // (which would end the path the kernel follows).
            prop_assert!(shown.first() != Some(&b'/') || shown.starts_with(OUTSIDE_PREFIX));
            prop_assert!(!shown.contains(&0));
        }
    }
}
