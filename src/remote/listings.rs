//! A subtree's listings in one call ([`super::Remote::tree_listings`]): what the mount's
//! metadata prefetch asks for. Breadth first, so a size cap cuts the deepest directories and
//! keeps whole listings; [`by_list`] is the answer built from `list` calls, for backends
//! without a cheaper way (and the reference the agent's packed answer is held to).

use std::collections::VecDeque;

use futures_util::stream::{self, BoxStream, StreamExt};

use super::{DirEntry, FileKind, Remote, RemoteError, RemotePath, Result};

/// Entries a tree answer may carry beyond its first listing when the asker gives no cap, and
/// the most any asker gets: a large repository's metadata (about 200 bytes each in memory).
pub const MAX_TREE_ENTRIES: usize = 1_000_000;

/// One directory of a subtree answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeListing {
    pub path: RemotePath,
    /// Its entries, sorted by name; `None`: not descended (beyond the cap, or it vanished or
    /// could not be read while the tree was walked): list it on its own when needed.
    pub entries: Option<Vec<DirEntry>>,
}

/// Which directories a listing of `dir` adds to the walk, in order.
pub fn subdirs(dir: &RemotePath, entries: &[DirEntry]) -> Result<Vec<RemotePath>> {
    entries
        .iter()
        .filter(|e| e.attr.kind == FileKind::Dir)
        .map(|e| dir.join(&e.name.0))
        .collect()
}

/// The breadth-first walk both sides follow: the first listing is always whole; each next one
/// is given while the entries after the first stay within `max_entries`; from the first that
/// does not fit, the rest are not descended.
pub struct Walk {
    queue: VecDeque<RemotePath>,
    budget: usize,
    first: bool,
}

impl Walk {
    pub fn new(path: &RemotePath, max_entries: usize) -> Walk {
        Walk {
            queue: VecDeque::from([path.clone()]),
            budget: max_entries.min(MAX_TREE_ENTRIES),
            first: true,
        }
    }

    /// The next directory to list, if the walk goes on.
    pub fn next_dir(&self) -> Option<&RemotePath> {
        self.queue.front()
    }

    /// `entries` were listed for the directory [`Walk::next_dir`] named: `true` if they fit
    /// (the walk takes them and goes on), `false` if the walk ends here (they are dropped).
    pub fn listed(&mut self, entries: &[DirEntry]) -> Result<bool> {
        if !self.first && entries.len() > self.budget {
            return Ok(false);
        }
        if !self.first {
            self.budget -= entries.len();
        }
        self.first = false;
        let dir = self.queue.pop_front().expect("a directory was next");
        self.queue.extend(subdirs(&dir, entries)?);
        Ok(true)
    }

    /// The next directory vanished or could not be read: skip it.
    pub fn skipped(&mut self) {
        self.first = false;
        self.queue.pop_front();
    }

    /// Directories left when the walk stopped: not descended.
    pub fn rest(self) -> VecDeque<RemotePath> {
        self.queue
    }
}

/// [`super::Remote::tree_listings`] from `list` calls (one round trip per directory).
pub async fn by_list<R: Remote + ?Sized>(
    remote: &R,
    path: &RemotePath,
    max_entries: usize,
) -> Result<BoxStream<'static, Result<TreeListing>>> {
    let mut walk = Walk::new(path, max_entries);
    let mut out = Vec::new();
    while let Some(dir) = walk.next_dir().cloned() {
        match remote.list(&dir).await {
            Ok(entries) => {
                if !walk.listed(&entries)? {
                    break;
                }
                out.push(Ok(TreeListing {
                    path: dir,
                    entries: Some(entries),
                }));
            }
            Err(e) if dir == *path => return Err(e),
            Err(RemoteError::NotFound(_) | RemoteError::Access(_) | RemoteError::NotDir(_)) => {
                walk.skipped();
                out.push(Ok(TreeListing {
                    path: dir,
                    entries: None,
                }));
            }
            Err(e) => return Err(e),
        }
    }
    out.extend(walk.rest().into_iter().map(|path| {
        Ok(TreeListing {
            path,
            entries: None,
        })
    }));
    Ok(stream::iter(out).boxed())
}
