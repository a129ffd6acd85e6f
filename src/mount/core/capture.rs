//! Keeping a staged file's base: the bytes of its base version the user did not write.
//!
//! A push sends only what was written, over the base, and the sandbox checks the base is
//! still its file. When it is not (a conflict), the user's version (the base plus every
//! write) is saved beside the file — and the base's untouched bytes can then no longer be
//! fetched: the sandbox replaced them. So a file opened to write over a base has that base
//! captured into its staging image: at the open (before it answers, for a small base; in the
//! background for a larger one), and finished before any push (a file appended to across
//! pushes would otherwise lose, at its next conflict, all it had before its last push). The
//! journal records the captured pages, so a remount uses them too. Files past
//! [`MAX_CAPTURE_BYTES`] are not captured: their conflict copies take untouched bytes from the
//! sandbox's file as it is then (said so).

use super::{local_io, FsCore};
use crate::mount::inode::NodeId;
use crate::mount::pages::{PageIndex, PAGE};
use crate::mount::staging::Staged;
use crate::remote::{RemotePath, Result, Version};

/// Largest base captured: one read of a few pages. Past it an edit of a byte would move the
/// whole file over the link, where a patch moves only the byte.
pub(in crate::mount) const MAX_CAPTURE_BYTES: u64 = 1024 * 1024;
/// A base up to this size is captured before an open for writing answers (one read); a
/// larger one in the background.
pub(in crate::mount) const CAPTURE_AT_OPEN_BYTES: u64 = 64 * 1024;
/// Pages fetched with one remote read while capturing.
const RUN_PAGES: u64 = crate::mount::readahead::MAX_WINDOW / PAGE;

impl FsCore {
    /// Is this image's base worth capturing (and not yet wholly local)?
    pub(in crate::mount) fn wants_capture(s: &Staged) -> bool {
        s.base.is_some() && s.base_size <= MAX_CAPTURE_BYTES && !s.complete()
    }

    /// Capture the base of `node`'s image in the background, a run of pages at a time, the
    /// image locked only to put each run in place (writes go on meanwhile). Stops when the
    /// image is gone, wholly local, or follows another version.
    pub(in crate::mount) fn capture_in_background(&self, node: NodeId) {
        let Some(core) = self.arc() else {
            return;
        };
        tokio::spawn(async move {
            loop {
                let Some(entry) = core.staged_of(node) else {
                    return;
                };
                let (base, run) = {
                    let g = entry.lock().await;
                    match (&g.base, next_run(&g)) {
                        (Some(b), Some(run)) if FsCore::wants_capture(&g) => (b.clone(), run),
                        _ => return,
                    }
                };
                let Ok(path) = core.path_of(node) else {
                    return;
                };
                core.fetch_base_run(&path, &base, run).await;
                let mut g = entry.lock().await;
                if g.base.as_ref() != Some(&base) {
                    return;
                }
                for page in run.0..run.1 {
                    match core
                        .pages
                        .get(&base, core.disk_ctime(&path, &base), PageIndex(page))
                    {
                        Some(d) if g.fill_page(page, &d).is_ok() => {}
                        _ => return,
                    }
                }
            }
        });
    }

    /// Take what the page cache holds of the base (no remote call): at an open for
    /// writing, so a sandbox that stops answering right then (or a daemon killed right
    /// after) still leaves the base's known bytes in the image and its journal.
    pub(in crate::mount) fn capture_cached(&self, s: &mut Staged) {
        let Some(base) = s.base.clone() else {
            return;
        };
        for page in s.missing_pages() {
            // Memory only: no remote path here to know the ctime by.
            if let Some(d) = self.pages.get(&base, None, PageIndex(page)) {
                if s.fill_page(page, &d).is_err() {
                    return;
                }
            }
        }
    }

    /// Capture the whole base now (before a push), lock held: every page not local is
    /// fetched at the base version. `Stale` when the sandbox's file is no longer the base.
    pub(in crate::mount) async fn capture_base(
        &self,
        path: &RemotePath,
        s: &mut Staged,
    ) -> Result<()> {
        let Some(base) = s.base.clone() else {
            return Ok(());
        };
        while let Some(run) = next_run(s) {
            self.fetch_base_run(path, &base, run).await;
            for page in run.0..run.1 {
                let data = self.page_at(path, &base, PageIndex(page)).await?;
                s.fill_page(page, &data).map_err(|e| local_io(&e))?;
            }
        }
        Ok(())
    }

    /// Fetch pages `[run.0, run.1)` into the page cache with one read (filed under the
    /// version they came from: a base replaced meanwhile leaves its pages missing).
    async fn fetch_base_run(&self, path: &RemotePath, base: &Version, run: (u64, u64)) {
        self.pages
            .fetch_run(
                (base, self.disk_ctime(path, base)),
                PageIndex(run.0),
                run.1 - run.0,
                |from, n| async move {
                    self.read_checked(path, base, from.start(), (n * PAGE) as u32)
                        .await
                },
            )
            .await;
    }
}

/// The first run of missing pages, at most [`RUN_PAGES`] long: `[start, end)`.
fn next_run(s: &Staged) -> Option<(u64, u64)> {
    let missing = s.missing_pages();
    let start = *missing.first()?;
    let mut end = start + 1;
    for &p in &missing[1..] {
        if p != end || end - start == RUN_PAGES {
            break;
        }
        end += 1;
    }
    Some((start, end))
}
