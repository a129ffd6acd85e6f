//! Fetching ahead of a sequential reader: the core's side of [`crate::mount::readahead`].

use std::sync::Arc;

use super::FsCore;
use crate::mount::handles::OpenFile;
use crate::mount::pages::{PageIndex, PAGE};
use crate::mount::readahead::*;
use crate::remote::{RemotePath, Version};

impl FsCore {
    /// Note a read through `h` and start fetching ahead of it if it is sequential.
    pub(in crate::mount) fn read_ahead(
        self: &Arc<Self>,
        h: &OpenFile,
        path: &RemotePath,
        version: &Version,
        offset: u64,
        len: u64,
    ) {
        // Prefetched pages wait in the cache until read: never more than a quarter of it.
        let max = MAX_WINDOW.min(self.cfg.cache_bytes / 4);
        h.readahead
            .start(offset, len, max, &self.prefetchers, |start, end| {
                let (core, path, version) = (self.clone(), path.clone(), version.clone());
                async move { core.prefetch_run(&path, &version, start, end).await }
            });
    }

    /// Fetch the pages of `[start, end)` into the cache with one remote read. Errors are left
    /// for the reader's own fetch to meet and report.
    async fn prefetch_run(&self, path: &RemotePath, version: &Version, start: u64, end: u64) {
        let first = PageIndex::containing(start);
        let pages = (end - start).div_ceil(PAGE);
        self.pages
            .fetch_run(
                (version, self.disk_ctime(path, version)),
                first,
                pages,
                |from, count| async move {
                    self.read_checked(path, version, from.start(), (count * PAGE) as u32)
                        .await
                },
            )
            .await;
    }
}
