//! Read-ahead for sequential readers. Each open handle watches where its reads land; while they
//! follow one another, a window of pages ahead of the reader is fetched into the page cache
//! ([`super::pages`]), several remote reads in flight, the window doubling per read from
//! [`FIRST_WINDOW`] up to [`MAX_WINDOW`]. A read elsewhere resets it. The kernel's own
//! read-ahead stays small (its pages arrive as separate FUSE reads, out of order), so the
//! distance to the sandbox is covered here.
//!
//! Memory stays bounded: prefetched pages live in the page cache (within `cache_size`), the
//! window is at most a quarter of it, and at most [`MAX_RUNS_IN_FLIGHT`] remote reads are in
//! flight across all handles. A handle's prefetches are aborted when it is closed.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::pages::PAGE;

/// The window after the first sequential read.
pub const FIRST_WINDOW: u64 = PAGE;
/// The largest window: 8 MiB covers a fast link 80 ms away.
pub const MAX_WINDOW: u64 = 8 * 1024 * 1024;
/// Pages fetched by one remote read (1 MiB): fewer, larger requests.
pub const RUN_PAGES: u64 = 8;
/// Remote reads of read-ahead in flight at once, over all handles (16 MiB).
pub const MAX_RUNS_IN_FLIGHT: usize = 16;
/// How far a read may land from where the last one ended and still count as sequential: the
/// kernel sends its read-ahead as several reads at once, which arrive out of order.
const SLACK: u64 = 2 * 1024 * 1024;

fn page_ceil(offset: u64) -> u64 {
    offset.div_ceil(PAGE) * PAGE
}

/// Where a handle's reader is, and how far ahead of it has been asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// The end of the furthest read so far.
    next: u64,
    /// Bytes to keep fetched ahead of `next`; 0 before any sequential read.
    size: u64,
    /// Fetching has been started for everything below this offset (page aligned).
    issued: u64,
}

impl Window {
    /// A read of `len` bytes at `offset` of a file of `file_size` bytes: the page-aligned range
    /// to fetch ahead now, if any. `max` bounds the window.
    pub fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        file_size: u64,
        max: u64,
    ) -> Option<Range<u64>> {
        let end = offset.saturating_add(len);
        let low = self.next.saturating_sub(SLACK);
        let high = self.next.max(self.issued).saturating_add(SLACK);
        let sequential = (low..=high).contains(&offset);
        if !sequential {
            *self = Window {
                next: end,
                size: 0,
                issued: page_ceil(end),
            };
            return None;
        }
        self.next = self.next.max(end);
        self.size = (self.size * 2).clamp(FIRST_WINDOW, max.max(FIRST_WINDOW));
        let from = self.issued.max(page_ceil(self.next));
        let to = page_ceil(self.next.saturating_add(self.size).min(file_size));
        // Fetch in batches: only once half the window has been read, so runs are large.
        if to <= from || (from > page_ceil(self.next) && to - from < self.size / 2) {
            return None;
        }
        self.issued = to;
        Some(from..to)
    }
}

/// A handle's read-ahead: its window and its prefetches in flight (aborted on drop, that is
/// when the handle is closed).
pub struct ReadAhead {
    window: Mutex<Window>,
    file_size: Mutex<u64>,
    tasks: Mutex<JoinSet<()>>,
}

impl ReadAhead {
    pub fn new(file_size: u64) -> Self {
        ReadAhead {
            window: Mutex::new(Window::default()),
            file_size: Mutex::new(file_size),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// The file changed (followed in place): its new size bounds what is fetched.
    pub fn set_file_size(&self, size: u64) {
        *self.file_size.lock().expect("read-ahead lock") = size;
        *self.window.lock().expect("read-ahead lock") = Window::default();
    }

    fn plan(&self, offset: u64, len: u64, max: u64) -> Option<Range<u64>> {
        let size = *self.file_size.lock().expect("read-ahead lock");
        self.window
            .lock()
            .expect("read-ahead lock")
            .on_read(offset, len, size, max)
    }

    /// Note a read of `len` bytes at `offset`; if it is sequential, start fetching the
    /// window ahead of it (at most `max` bytes) in runs of [`RUN_PAGES`], each `run(start,
    /// end)` once one of the mount's `permits` is free.
    pub fn start<Fut>(
        &self,
        offset: u64,
        len: u64,
        max: u64,
        permits: &Prefetchers,
        run: impl Fn(u64, u64) -> Fut,
    ) where
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let Some(range) = self.plan(offset, len, max) else {
            return;
        };
        let mut tasks = self.tasks.lock().expect("read-ahead lock");
        while tasks.try_join_next().is_some() {}
        let mut start = range.start;
        while start < range.end {
            let end = (start + RUN_PAGES * PAGE).min(range.end);
            let permits = permits.0.clone();
            let fetch = run(start, end);
            tasks.spawn(async move {
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                fetch.await;
            });
            start = end;
        }
    }
}

/// Large buffers (pages, read-ahead runs, replies) are mapped and unmapped on their own:
/// glibc otherwise raises its mmap threshold after the first free and serves them from heap
/// arenas that fragment, and the daemon's memory grows well past `cache_size`.
pub fn bound_allocator() {
    // SAFETY: mallopt only sets a malloc tunable; called before the runtime's threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 * 1024);
    }
}

/// Remote reads of read-ahead in flight, shared by every handle of the mount.
pub struct Prefetchers(Arc<Semaphore>);

impl Default for Prefetchers {
    fn default() -> Self {
        Prefetchers(Arc::new(Semaphore::new(MAX_RUNS_IN_FLIGHT)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_sequential_reader_gets_a_growing_window() {
        let mut w = Window::default();
        let size = 100 * MIB;
        let mut fetched = Vec::new();
        let mut off = 0;
        while off < 20 * MIB {
            if let Some(r) = w.on_read(off, PAGE, size, MAX_WINDOW) {
                fetched.push(r);
            }
            off += PAGE;
        }
        // Contiguous, never overlapping, and reaching the full window ahead of the reader.
        for pair in fetched.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
        assert_eq!(fetched[0].start, PAGE);
        assert!(fetched.last().unwrap().end >= 20 * MIB + MAX_WINDOW / 2);
        assert!(fetched.iter().any(|r| r.end - r.start >= MAX_WINDOW / 2));
    }

    #[test]
    fn never_past_the_end_of_the_file() {
        let mut w = Window::default();
        let size = 3 * PAGE + 10;
        let mut last_end = 0;
        for i in 0..8 {
            if let Some(r) = w.on_read(i * PAGE, PAGE, size, MAX_WINDOW) {
                last_end = r.end;
            }
        }
        assert_eq!(last_end, 4 * PAGE);
    }

    #[test]
    fn a_random_read_resets_the_window() {
        let mut w = Window::default();
        for i in 0..6 {
            w.on_read(i * PAGE, PAGE, 100 * MIB, MAX_WINDOW);
        }
        assert_eq!(w.on_read(50 * MIB, 4096, 100 * MIB, MAX_WINDOW), None);
        assert_eq!(w.size, 0);
        // Reading on from there starts again small.
        let r = w
            .on_read(50 * MIB + 4096, 4096, 100 * MIB, MAX_WINDOW)
            .unwrap();
        assert_eq!(r.end - r.start, PAGE);
    }

    #[test]
    fn the_window_keeps_within_its_bound() {
        let mut w = Window::default();
        let mut ahead = 0;
        for i in 0..200 {
            w.on_read(i * PAGE, PAGE, 1 << 40, 2 * MIB);
            ahead = ahead.max(w.issued - w.next);
        }
        assert!(ahead <= 2 * MIB + PAGE, "{ahead}");
    }
}
