//! The state of one staged file, and the only ways it moves. Write-back
//! ([`super::writeback`]) records each step; `ctl status`, `flush` and `umount` report the
//! state, so a file the sandbox refused is never silently "pushed".
//!
//! ```text
//!            change               close                 push starts
//!   Clean ───────────► Dirty ───────────► Queued ───────────────► Pushing
//!     ▲                  ▲                                      │ │ │ │
//!     │ landed, clean    │ landed, changed meanwhile            │ │ │ │
//!     ├──────────────────┼──────────────────────────────────────┘ │ │ │
//!     │                  └────────────────────────────────────────┘ │ │
//!     │   the sandbox did not answer: Retrying (backoff) ───────────┘ │
//!     │   the sandbox refused: Refused (kept, until asked again) ─────┘
//!     │   conflict: the user's version saved beside it; the file follows the sandbox's
//!     └── Conflict (until the next change)
//! ```

/// Where a staged file is on its way to the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Nothing unpushed: the sandbox has every byte.
    Clean,
    /// Changed here, not asked to be pushed yet (open, or not closed).
    Dirty,
    /// A push is queued (`close` returned) and waits for a slot.
    Queued,
    /// A commit is on its way.
    Pushing,
    /// The last push did not reach the sandbox (or it failed on its side): retried with
    /// backoff, and at once when the sandbox answers again.
    Retrying,
    /// The sandbox refused the last push (no space, no permission, too large): kept with its
    /// content, tried again only when asked (a write, `fsync`, `ctl flush`, `umount`).
    RefusedKept,
    /// The sandbox changed the file meanwhile: the user's version was saved beside it and the
    /// file now follows the sandbox's.
    Conflict,
}

/// What happened to a staged file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its image changed (a write, truncate, fill); `dirty`: something is unpushed now.
    Changed { dirty: bool },
    /// `close` queued a push.
    Queued,
    /// A push began.
    Started,
    /// The push landed; `dirty`: the image changed again meanwhile.
    Landed { dirty: bool },
    /// The push failed; `transient`: worth retrying by itself.
    Failed { transient: bool },
    /// The push met a change made in the sandbox; the user's version was saved as a copy.
    Conflicted,
}

impl Stage {
    /// The state after `step`.
    pub fn after(self, step: Step) -> Stage {
        use Stage::*;
        match (self, step) {
            // A failure stays visible through later changes until a push is tried again.
            (RefusedKept | Retrying, Step::Changed { .. }) => self,
            // Queued and pushing files change too; the push in flight takes what it finds.
            (Queued | Pushing, Step::Changed { .. }) => self,
            // A read filling pages of a conflicted file is no news.
            (Conflict, Step::Changed { dirty: false }) => Conflict,
            (_, Step::Changed { dirty: false }) => Clean,
            (Clean | Dirty | Conflict, Step::Changed { dirty: true }) => Dirty,
            // A file being pushed is queued again behind that push.
            (Pushing, Step::Queued) => Pushing,
            (_, Step::Queued) => Queued,
            (_, Step::Started) => Pushing,
            (_, Step::Landed { dirty: false }) => Clean,
            (_, Step::Landed { dirty: true }) => Dirty,
            (_, Step::Failed { transient: true }) => Retrying,
            (_, Step::Failed { transient: false }) => RefusedKept,
            (_, Step::Conflicted) => Conflict,
        }
    }

    /// Does the sandbox lack something of this file?
    pub fn unpushed(self) -> bool {
        !matches!(self, Stage::Clean | Stage::Conflict)
    }

    /// A push that did not land, for `ctl status` and `umount`.
    pub fn failed(self) -> bool {
        matches!(self, Stage::Retrying | Stage::RefusedKept)
    }
}

#[cfg(test)]
mod tests {
    use super::Stage::*;
    use super::*;

    /// Every state and step, in order: the whole transition table, written once.
    const STATES: [Stage; 7] = [
        Clean,
        Dirty,
        Queued,
        Pushing,
        Retrying,
        RefusedKept,
        Conflict,
    ];
    const STEPS: [Step; 9] = [
        Step::Changed { dirty: false },
        Step::Changed { dirty: true },
        Step::Queued,
        Step::Started,
        Step::Landed { dirty: false },
        Step::Landed { dirty: true },
        Step::Failed { transient: true },
        Step::Failed { transient: false },
        Step::Conflicted,
    ];

    #[test]
    fn the_transition_table() {
        // Rows: states; columns: STEPS in order.
        let table: [(Stage, [Stage; 9]); 7] = [
            (
                Clean,
                [
                    Clean,
                    Dirty,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                Dirty,
                [
                    Clean,
                    Dirty,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                Queued,
                [
                    Queued,
                    Queued,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                Pushing,
                [
                    Pushing,
                    Pushing,
                    Pushing,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                Retrying,
                [
                    Retrying,
                    Retrying,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                RefusedKept,
                [
                    RefusedKept,
                    RefusedKept,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
            (
                Conflict,
                [
                    Conflict,
                    Dirty,
                    Queued,
                    Pushing,
                    Clean,
                    Dirty,
                    Retrying,
                    RefusedKept,
                    Conflict,
                ],
            ),
        ];
        for (from, row) in table {
            for (step, want) in STEPS.iter().zip(row) {
                assert_eq!(from.after(*step), want, "{from:?} after {step:?}");
            }
        }
        assert_eq!(table.map(|(s, _)| s), STATES);
    }

    #[test]
    fn a_refused_file_stays_reported_until_a_push_is_tried_again() {
        let s = Pushing.after(Step::Failed { transient: false });
        assert_eq!(s, RefusedKept);
        let s = s.after(Step::Changed { dirty: true });
        assert!(
            s.failed() && s.unpushed(),
            "a later write hides the refusal"
        );
        let s = s.after(Step::Started).after(Step::Landed { dirty: false });
        assert!(!s.failed() && !s.unpushed());
    }

    #[test]
    fn only_clean_and_conflict_have_nothing_unpushed() {
        let unpushed: Vec<Stage> = STATES.into_iter().filter(|s| s.unpushed()).collect();
        assert_eq!(unpushed, [Dirty, Queued, Pushing, Retrying, RefusedKept]);
    }
}
