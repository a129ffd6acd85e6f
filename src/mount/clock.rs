//! The time attribute and listing TTLs count in: the system's monotonic clock in a mount, a
//! clock that moves only when told in tests (`Clock::manual`), so a test of expiry steps past
//! a TTL instead of sleeping through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// `None`: the system's clock.
    manual: Option<Arc<Manual>>,
}

#[derive(Debug)]
struct Manual {
    start: Instant,
    /// Nanoseconds moved since `start`.
    moved_ns: AtomicU64,
}

impl Clock {
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock standing still until [`Clock::advance`] moves it.
    pub fn manual() -> Clock {
        Clock {
            manual: Some(Arc::new(Manual {
                start: Instant::now(),
                moved_ns: AtomicU64::new(0),
            })),
        }
    }

    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => m.start + Duration::from_nanos(m.moved_ns.load(Ordering::SeqCst)),
        }
    }

    /// How long ago `then` was (zero for a time ahead of now).
    pub fn since(&self, then: Instant) -> Duration {
        self.now().saturating_duration_since(then)
    }

    /// Move a manual clock on (the system clock moves by itself: nothing happens).
    pub fn advance(&self, by: Duration) {
        if let Some(m) = &self.manual {
            m.moved_ns.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = Clock::manual();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(2));
        assert_eq!(c.since(t0), Duration::from_secs(2));
        assert_eq!(c.clone().now(), c.now(), "clones share the time");
    }
}
