//! When a search must stop: its client left, or its deadline passed. Checked inside walks
//! (once per directory read) and searches (once per chunk read), not only when a match is
//! emitted, so a search with nothing to report still stops within a moment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A shared stop signal with an optional deadline; clones see the same signal.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    timed_out: AtomicBool,
    deadline: Option<Instant>,
}

impl Cancel {
    /// Never stops on its own (the local commands, which the user can interrupt).
    pub fn never() -> Self {
        Cancel::default()
    }

    /// Stops once `limit` has passed from now.
    pub fn within(limit: Duration) -> Self {
        Cancel {
            inner: Arc::new(Inner {
                deadline: Instant::now().checked_add(limit),
                ..Inner::default()
            }),
        }
    }

    /// Stop now (the client went away).
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::Relaxed);
    }

    /// Should the work stop?
    pub fn is_cancelled(&self) -> bool {
        if self.inner.cancelled.load(Ordering::Relaxed) {
            return true;
        }
        if self.inner.deadline.is_some_and(|d| Instant::now() >= d) {
            self.inner.timed_out.store(true, Ordering::Relaxed);
            self.inner.cancelled.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Did the deadline (rather than the client) stop the work?
    pub fn timed_out(&self) -> bool {
        self.inner.timed_out.load(Ordering::Relaxed)
    }
}

/// A reader that fails once its [`Cancel`] fires: the searcher reads a file in chunks, so a
/// huge file with no match stops between two chunks.
pub struct Guarded<'a, R> {
    pub inner: R,
    pub cancel: &'a Cancel,
}

impl<R: std::io::Read> std::io::Read for Guarded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.is_cancelled() {
            // Not `Interrupted`: readers retry that; this must end the search.
            return Err(std::io::Error::other("search cancelled"));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_deadline_cancels_and_says_so() {
        let c = Cancel::within(Duration::ZERO);
        assert!(c.is_cancelled());
        assert!(c.timed_out());
        let n = Cancel::never();
        assert!(!n.is_cancelled());
        n.cancel();
        assert!(n.is_cancelled() && !n.timed_out());
    }

    #[test]
    fn a_guarded_reader_stops_reading_once_cancelled() {
        use std::io::Read;
        let c = Cancel::never();
        let mut r = Guarded {
            inner: &b"abcdef"[..],
            cancel: &c,
        };
        let mut buf = [0u8; 3];
        assert_eq!(r.read(&mut buf).unwrap(), 3);
        c.cancel();
        assert!(r.read(&mut buf).is_err());
    }
}
