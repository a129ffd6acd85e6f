//! What the mount knows about the sandbox without asking it now.
//!
//! `sbxfs ctl status` and `stats` must answer at once, even while the sandbox hangs: a status
//! that waits for the remote is useless exactly when it is wanted. So nothing answering a control
//! request calls the remote; a background probe asks the agent's `info` every
//! [`PROBE_INTERVAL`], bounded by [`PROBE_TIMEOUT`], and records whether it answered, how fast,
//! when it last did and the last error. The answer is therefore "as last seen", and says when
//! that was.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::remote::Remote;

/// As often as failed pushes are retried: what status reports is never older than that.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// A probe that has not answered by then counts as unreachable: a hung sandbox shows within
/// interval + timeout (7 s), sooner than the client's own 10 s call timeout would report it.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Seen {
    /// The outcome of the last probe (or of the mount's first call, before any probe).
    reachable: bool,
    /// When the sandbox last answered.
    last_answer: Option<Instant>,
    /// When the last probe finished.
    last_check: Option<Instant>,
    last_error: Option<String>,
    round_trip: Option<Duration>,
}

/// The sandbox's reachability as last seen. Cheap to read; written by the probe only.
#[derive(Default)]
pub struct Health {
    seen: Mutex<Seen>,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// The sandbox answered a call that took `rtt`.
    pub fn answered(&self, rtt: Duration) {
        let mut s = self.seen.lock().expect("health lock");
        let now = Instant::now();
        s.reachable = true;
        s.last_answer = Some(now);
        s.last_check = Some(now);
        s.round_trip = Some(rtt);
        s.last_error = None;
    }

    /// The sandbox did not answer (an error or the probe's timeout).
    pub fn failed(&self, error: String) {
        let mut s = self.seen.lock().expect("health lock");
        s.reachable = false;
        s.last_check = Some(Instant::now());
        s.last_error = Some(error);
    }

    pub fn reachable(&self) -> bool {
        self.seen.lock().expect("health lock").reachable
    }

    /// Why the sandbox is taken for hung, if a probe that ended after `start` failed: a call
    /// begun then is not going to be answered either.
    pub fn failed_since(&self, start: Instant) -> Option<String> {
        let s = self.seen.lock().expect("health lock");
        (!s.reachable && s.last_check.is_some_and(|t| t > start))
            .then(|| s.last_error.clone().unwrap_or_default())
    }

    /// Resolves once a probe ending after now fails (never while the sandbox answers): what
    /// a long call (a query, given a minute) races, so a sandbox that stopped answering is
    /// given up within a probe's interval and timeout (7 s), not the call's whole deadline.
    pub async fn hung(&self) -> crate::remote::RemoteError {
        let start = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Some(why) = self.failed_since(start) {
                return crate::remote::RemoteError::TimedOut(format!(
                    "the sandbox stopped answering ({why}); the query was given up"
                ));
            }
        }
    }

    /// The round trip of the last answered probe, in milliseconds.
    pub fn round_trip_ms(&self) -> Option<f64> {
        let s = self.seen.lock().expect("health lock");
        s.round_trip.map(|d| d.as_secs_f64() * 1000.0)
    }

    /// What status reports: `reachable`, when it was last checked and last answered (ms ago),
    /// the last error, the last round trip.
    pub fn snapshot(&self) -> serde_json::Value {
        let s = self.seen.lock().expect("health lock");
        let ago = |t: Option<Instant>| t.map(|t| t.elapsed().as_millis() as u64);
        json!({
            "reachable": s.reachable,
            "checked_ms_ago": ago(s.last_check),
            "last_answer_ms_ago": ago(s.last_answer),
            "last_error": s.last_error,
            "round_trip_ms": s.round_trip.map(|d| d.as_secs_f64() * 1000.0),
        })
    }

    /// Ask the sandbox once, within [`PROBE_TIMEOUT`], and record the outcome; answers how
    /// long the answer took, if one came.
    pub async fn probe(&self, remote: &dyn Remote) -> Option<Duration> {
        let start = Instant::now();
        match tokio::time::timeout(PROBE_TIMEOUT, remote.info()).await {
            Ok(Ok(_)) => {
                let took = start.elapsed();
                self.answered(took);
                return Some(took);
            }
            Ok(Err(e)) => self.failed(e.to_string()),
            Err(_) => self.failed(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
        }
        None
    }
}

/// Probe the sandbox every [`PROBE_INTERVAL`] until the runtime stops; `answered` hears how
/// long each answer took (the mount's sense of the sandbox's pace).
pub async fn watch(
    health: Arc<Health>,
    remote: Arc<dyn Remote>,
    answered: impl Fn(Duration) + Send + 'static,
) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        if let Some(took) = health.probe(remote.as_ref()).await {
            answered(took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_when_the_sandbox_last_answered() {
        let h = Health::default();
        assert!(!h.reachable(), "unknown until something answered");
        h.answered(Duration::from_millis(3));
        assert!(h.reachable());
        h.failed("connection refused".into());
        let s = h.snapshot();
        assert_eq!(s["reachable"], false);
        assert_eq!(s["last_error"], "connection refused");
        assert!(s["last_answer_ms_ago"].as_u64().is_some());
        assert_eq!(h.round_trip_ms(), Some(3.0));
    }

    #[test]
    fn only_a_probe_failed_after_a_call_began_gives_it_up() {
        let h = Health::default();
        h.failed("no answer within 5 s".into());
        let start = Instant::now();
        assert_eq!(h.failed_since(start), None, "failed before the call began");
        std::thread::sleep(Duration::from_millis(2));
        h.answered(Duration::from_millis(3));
        assert_eq!(h.failed_since(start), None, "answering");
        h.failed("no answer within 5 s".into());
        assert_eq!(
            h.failed_since(start).as_deref(),
            Some("no answer within 5 s")
        );
    }
}
