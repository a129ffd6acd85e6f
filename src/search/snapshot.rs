//! A copy of part of a sandbox's tree held in memory, for searches run here over what a
//! transport without an agent listed (`remote::exec::query`): directories, files (their bytes,
//! or empty stand-ins) and symlinks, by workspace-relative path. The walk sees it as it sees
//! the agent's disk ([`TreeSource`]): symlinks are followed only by `resolve` and on the way
//! to a directory, never out of the tree.

use std::collections::{BTreeMap, VecDeque};

use super::walk::{SourceEntry, SourceKind, TreeSource};

/// Symlinks followed in one resolution before it is refused (as Linux's `ELOOP`).
const MAX_SYMLINKS: usize = 40;

#[derive(Debug, Clone)]
enum Item {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

/// Why a snapshot refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}: its directory is not in the snapshot")]
    NoParent(String),
    #[error("{0}: already in the snapshot as something else")]
    Taken(String),
}

/// The tree; the root (`""`) is always a directory.
#[derive(Debug, Clone)]
pub struct Snapshot {
    items: BTreeMap<Vec<u8>, Item>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            items: BTreeMap::from([(Vec::new(), Item::Dir)]),
        }
    }
}

fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn parent_of(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

impl Snapshot {
    pub fn new() -> Snapshot {
        Snapshot::default()
    }

    /// A directory at `path`, and every directory above it.
    pub fn mkdir_all(&mut self, path: &[u8]) -> Result<(), SnapshotError> {
        let mut at = Vec::new();
        for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            at = join(&at, comp);
            match self.items.get(&at) {
                Some(Item::Dir) => {}
                Some(_) => return Err(SnapshotError::Taken(shown(&at))),
                None => {
                    self.items.insert(at.clone(), Item::Dir);
                }
            }
        }
        Ok(())
    }

    /// A regular file at `path` (its directory must be there).
    pub fn write(&mut self, path: &[u8], bytes: &[u8]) -> Result<(), SnapshotError> {
        self.put(path, Item::File(bytes.to_vec()))
    }

    /// A symlink at `path` leading to `target` (its directory must be there).
    pub fn symlink(&mut self, target: &[u8], path: &[u8]) -> Result<(), SnapshotError> {
        self.put(path, Item::Symlink(target.to_vec()))
    }

    fn put(&mut self, path: &[u8], item: Item) -> Result<(), SnapshotError> {
        if !matches!(self.items.get(parent_of(path)), Some(Item::Dir)) {
            return Err(SnapshotError::NoParent(shown(path)));
        }
        if matches!(self.items.get(path), Some(Item::Dir)) {
            return Err(SnapshotError::Taken(shown(path)));
        }
        self.items.insert(path.to_vec(), item);
        Ok(())
    }

    /// Where `path` leads inside the tree (the final symlink followed when `follow`): `None`
    /// when something on the way is missing or not a directory, a symlink leads out of the
    /// tree (an absolute target, `..` above the root), or symlinks loop.
    fn lookup(&self, path: &[u8], follow: bool) -> Option<Vec<u8>> {
        // The directories walked so far (for `..` in targets) and what is left.
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        let mut rest: VecDeque<Vec<u8>> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        let mut links = 0;
        while let Some(comp) = rest.pop_front() {
            let last = rest.is_empty();
            let dir = stack.last().expect("the root is never popped").clone();
            if comp == b"." {
                continue;
            }
            if comp == b".." {
                if stack.len() == 1 {
                    return None;
                }
                stack.pop();
                continue;
            }
            let at = join(&dir, &comp);
            match self.items.get(&at)? {
                Item::Symlink(target) if !last || follow => {
                    links += 1;
                    if links > MAX_SYMLINKS || target.first() == Some(&b'/') {
                        return None;
                    }
                    for c in target.split(|&b| b == b'/').rev() {
                        if !c.is_empty() {
                            rest.push_front(c.to_vec());
                        }
                    }
                }
                _ if last => return Some(at),
                Item::Dir => stack.push(at),
                _ => return None,
            }
        }
        stack.pop()
    }

    fn item(&self, path: &[u8], follow: bool) -> Option<&Item> {
        self.items.get(&self.lookup(path, follow)?)
    }
}

impl TreeSource for Snapshot {
    fn kind(&self, path: &[u8]) -> Option<SourceKind> {
        Some(match self.item(path, false)? {
            Item::Dir => SourceKind::Dir,
            Item::File(_) => SourceKind::File,
            Item::Symlink(_) => SourceKind::Symlink,
        })
    }

    fn entries(&self, dir: &[u8]) -> Vec<SourceEntry> {
        let Some(dir) = self.lookup(dir, true) else {
            return Vec::new();
        };
        if !matches!(self.items.get(&dir), Some(Item::Dir)) {
            return Vec::new();
        }
        let prefix = if dir.is_empty() {
            Vec::new()
        } else {
            join(&dir, b"")
        };
        self.items
            .range(prefix.clone()..)
            .skip_while(|(p, _)| p.is_empty())
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter_map(|(p, item)| {
                let name = &p[prefix.len()..];
                (!name.contains(&b'/')).then(|| SourceEntry {
                    name: name.to_vec(),
                    kind: match item {
                        Item::Dir => SourceKind::Dir,
                        Item::File(_) => SourceKind::File,
                        Item::Symlink(_) => SourceKind::Symlink,
                    },
                    size: match item {
                        Item::File(b) => b.len() as u64,
                        Item::Symlink(t) => t.len() as u64,
                        Item::Dir => 0,
                    },
                })
            })
            .collect()
    }

    fn content(&self, path: &[u8]) -> Option<Vec<u8>> {
        match self.item(path, true)? {
            Item::File(b) => Some(b.clone()),
            _ => None,
        }
    }

    fn resolve(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.lookup(path, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Snapshot {
        let mut s = Snapshot::new();
        s.mkdir_all(b"a/b").unwrap();
        s.write(b"a/b/f", b"bytes").unwrap();
        s.write(b"a/b-c", b"sibling").unwrap();
        s.symlink(b"b", b"a/to_b").unwrap();
        s.symlink(b"../a/b/f", b"a/to_f").unwrap();
        s.symlink(b"/etc/passwd", b"a/out").unwrap();
        s.symlink(b"../../x", b"a/above").unwrap();
        s.symlink(b"loop", b"a/loop").unwrap();
        s
    }

    #[test]
    fn entries_are_a_directorys_own_sorted_by_name() {
        let s = tree();
        let names = |d: &[u8]| -> Vec<String> {
            s.entries(d).into_iter().map(|e| shown(&e.name)).collect()
        };
        assert_eq!(names(b""), ["a"]);
        assert_eq!(
            names(b"a"),
            ["above", "b", "b-c", "loop", "out", "to_b", "to_f"]
        );
        assert_eq!(names(b"a/b"), ["f"]);
        assert_eq!(names(b"a/to_b"), ["f"], "a symlink on the way is followed");
        assert!(names(b"a/b/f").is_empty());
        assert_eq!(s.entries(b"a/b")[0].size, 5);
    }

    #[test]
    fn symlinks_are_followed_inside_the_tree_only() {
        let s = tree();
        assert_eq!(s.kind(b"a/to_f"), Some(SourceKind::Symlink));
        assert_eq!(s.resolve(b"a/to_f").as_deref(), Some(&b"a/b/f"[..]));
        assert_eq!(s.content(b"a/to_f").as_deref(), Some(&b"bytes"[..]));
        assert_eq!(s.resolve(b"a/to_b/../b-c").as_deref(), Some(&b"a/b-c"[..]));
        assert_eq!(s.resolve(b""), Some(Vec::new()));
        assert_eq!(s.resolve(b"a/.."), Some(Vec::new()));
        for out in [
            &b"a/out"[..],
            b"a/above",
            b"a/loop",
            b"..",
            b"a/missing",
            b"a/b/f/x",
        ] {
            assert_eq!(s.resolve(out), None, "{}", shown(out));
        }
    }

    #[test]
    fn a_change_needs_its_directory_and_keeps_kinds_apart() {
        let mut s = tree();
        assert!(matches!(
            s.write(b"nope/f", b""),
            Err(SnapshotError::NoParent(_))
        ));
        assert!(matches!(s.write(b"a/b", b""), Err(SnapshotError::Taken(_))));
        assert!(matches!(
            s.mkdir_all(b"a/b/f/g"),
            Err(SnapshotError::Taken(_))
        ));
        s.write(b"a/b/f", b"new").unwrap();
        assert_eq!(s.content(b"a/b/f").as_deref(), Some(&b"new"[..]));
    }
}
