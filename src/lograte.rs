//! Repeated failures logged once per window: the first is logged, the repeats are counted, and
//! the next one after the window says how many there were ("… 57 more in the last 60 s"), so a
//! file failing on every retry does not drown the useful lines.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long repeats of one failure are only counted.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Distinct failures tracked at once; past it the oldest windows are forgotten (and their next
/// failure is logged again), so memory stays bounded.
const MAX_KEYS: usize = 1024;

/// What to do with one occurrence of a failure.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `repeats` more happened (unlogged) in the window that just ended.
    Log { repeats: u64 },
    /// Count it only.
    Quiet,
}

#[derive(Default)]
pub struct RateLimit {
    windows: Mutex<HashMap<String, (Instant, u64)>>,
}

impl RateLimit {
    pub fn new() -> RateLimit {
        RateLimit::default()
    }

    /// One occurrence of the failure `key` at `now`.
    pub fn check(&self, key: &str, now: Instant) -> Verdict {
        let mut w = self.windows.lock().expect("rate limit lock");
        if let Some((start, repeats)) = w.get_mut(key) {
            if now.duration_since(*start) < WINDOW {
                *repeats += 1;
                return Verdict::Quiet;
            }
            let ended = *repeats;
            *start = now;
            *repeats = 0;
            return Verdict::Log { repeats: ended };
        }
        if w.len() >= MAX_KEYS {
            w.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            if w.len() >= MAX_KEYS {
                w.clear();
            }
        }
        w.insert(key.to_string(), (now, 0));
        Verdict::Log { repeats: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_repeats_are_counted_until_the_window_ends() {
        let r = RateLimit::new();
        let t0 = Instant::now();
        assert_eq!(r.check("a", t0), Verdict::Log { repeats: 0 });
        for i in 1..=57 {
            assert_eq!(r.check("a", t0 + Duration::from_secs(i)), Verdict::Quiet);
        }
        // Another failure has its own window.
        assert_eq!(r.check("b", t0), Verdict::Log { repeats: 0 });
        assert_eq!(
            r.check("a", t0 + WINDOW + Duration::from_secs(1)),
            Verdict::Log { repeats: 57 }
        );
    }
}
