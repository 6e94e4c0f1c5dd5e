//! Deletion slots: the pace and the blast-radius cap (the pure `daemon::limiter`), the line of
//! claims the cap holds back, and the clock dispute told, under one lock.
//! Each operation takes the instants it judges at; none hands the lock out.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::cluster::cache::Candidates;
use crate::cluster::server_clock::{Dispute, TOLERATED_DISAGREEMENT};
use crate::config::{Config, MAX_DURATION, deletion_interval};
use crate::daemon::cap_ledger::LedgerError;
use crate::daemon::limiter::{Admission, Counted, Limiter, Line, Reservation};
use crate::decide::facts::ObjectKey;

/// The pace, the cap and its line.
pub(super) struct Slots {
    state: Mutex<State>,
    /// The cap's window as its notice tells it.
    window: String,
}

struct State {
    limiter: Limiter,
    /// The claims the cap holds back, earliest due first. Each is told once per episode (until
    /// it gets a slot, is no longer due, or is gone), not at every retry.
    line: Line<ObjectKey>,
    /// The hold of the clock dispute whose notice went out (its start): told once per hold,
    /// not per claim nor per contradiction that extends it.
    disputed_told: Option<Instant>,
}

/// A request for a slot, answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Admitted {
    pub(super) admission: Admission,
    /// Whether the cap is full after it: an admission into a cap with room left ends the
    /// capped state.
    pub(super) full: bool,
    /// Whether a claim held back just joined the line: told once per episode.
    pub(super) first: bool,
    /// The cap as it stands: the absolute one, or the share of the population.
    pub(super) max: u32,
}

/// The clock dispute that holds the cap full, and whether it is new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Disputed {
    pub(super) until: Instant,
    pub(super) first: bool,
}

impl Slots {
    pub(super) fn new(config: &Config) -> Self {
        let deletion = &config.deletion;
        let limiter = Limiter::new(
            // Validation refused every rate without an interval; the slowest pace otherwise.
            deletion_interval(deletion.deletes_per_second).unwrap_or(MAX_DURATION),
            deletion.max_deletions_per_window,
            deletion.window,
        )
        .with_share(deletion.max_deletions_percent)
        .with_tolerance(TOLERATED_DISAGREEMENT);
        Slots {
            state: Mutex::new(State {
                limiter,
                line: Line::default(),
                disputed_told: None,
            }),
            window: humantime::format_duration(deletion.window).to_string(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cap's window as a notice tells it.
    pub(super) fn window(&self) -> &str {
        &self.window
    }

    /// Until when the cap counts its window as full because answers of the API server
    /// disagreed beyond the tolerance (`dispute`, standing): the ledger is dated by that
    /// clock's estimate, and an estimate that jumped forward would otherwise forget the
    /// deletions dated on the slower clock, for good (and the Lease's copy with them). Fails
    /// closed: deletions wait, none is forgotten. Slots granted before it are not taken back.
    pub(super) fn disputed(&self, dispute: Option<Dispute>) -> Option<Disputed> {
        let Dispute { since, until } = dispute?;
        let first = self.state().disputed_told.replace(since) != Some(since);
        Some(Disputed { until, first })
    }

    /// A slot for `key`, waiting at `place` in line, among `population` candidates: judged at
    /// `now` and at `earliest`, the earliest the API server's clock can read (never shorter
    /// windows).
    pub(super) fn admit(
        &self,
        key: &ObjectKey,
        place: DateTime<Utc>,
        population: Candidates,
        now: Instant,
        earliest: DateTime<Utc>,
    ) -> Admitted {
        let mut state = self.state();
        let State { limiter, line, .. } = &mut *state;
        limiter.population(now, population);
        let ahead = line.ahead(key, place, limiter.max() as usize);
        let admission = limiter.reserve(now, earliest, ahead);
        let first = match admission {
            Admission::At(_) => {
                line.leave(key);
                false
            }
            Admission::Capped { .. } => line.join(key, place),
            Admission::Unknown => false,
        };
        Admitted {
            admission,
            full: limiter.full(earliest),
            first,
            max: limiter.max(),
        }
    }

    /// Counts `reservation` from `at`, the latest instant its DELETE can go out, and the
    /// ledger to write before it; `None` when the count it was taken in is gone (leadership
    /// lost since).
    pub(super) fn count_for_send(
        &self,
        reservation: Reservation,
        at: DateTime<Utc>,
    ) -> (Reservation, Option<Counted>) {
        let mut state = self.state();
        let reservation = state.limiter.count_from(reservation, at);
        let counted = state.limiter.ledger_for(reservation);
        (reservation, counted)
    }

    /// Counts `reservation` from `at`: when its DELETE was answered (received by then), or
    /// when its revocation failed again (it may land from then on).
    pub(super) fn count_from(&self, reservation: Reservation, at: DateTime<Utc>) -> Reservation {
        self.state().limiter.count_from(reservation, at)
    }

    /// A slot for a DELETE owed a revocation, counted from `at` in the count just recovered
    /// (see `Limiter::hold`).
    pub(super) fn hold(&self, at: DateTime<Utc>) -> Option<Reservation> {
        self.state().limiter.hold(Instant::now(), at)
    }

    /// `reservation`, kept by a DELETE that may still land, in the current count (see
    /// `Limiter::keep`).
    pub(super) fn keep(&self, reservation: Reservation, at: DateTime<Utc>) -> Option<Reservation> {
        self.state().limiter.keep(reservation, Instant::now(), at)
    }

    /// Gives a slot back: its DELETE was not sent, was refused, or can never land.
    pub(super) fn release(&self, reservation: Reservation) {
        self.state().limiter.release(reservation);
    }

    /// Takes `key` out of line: it is no longer waiting for a slot (kept, gone, or not leading).
    pub(super) fn leave(&self, key: &ObjectKey) {
        self.state().line.leave(key);
    }

    /// Counts from the ledger found on the Lease just won (see `Limiter::recover`).
    pub(super) fn recover(
        &self,
        found: Option<&str>,
        wall: DateTime<Utc>,
        reach: std::time::Duration,
    ) -> Result<(), LedgerError> {
        self.state().limiter.recover(found, wall, reach)
    }

    /// On standing by: the count is forgotten (nothing is admitted until the next recovery)
    /// and the line emptied.
    pub(super) fn forget(&self) {
        let mut state = self.state();
        state.limiter.forget();
        state.line = Line::default();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn slots(max: u32) -> Slots {
        let mut config = Config::default();
        config.deletion.deletes_per_second = 1000.0;
        config.deletion.max_deletions_per_window = max;
        let slots = Slots::new(&config);
        slots.recover(None, Utc::now(), Duration::ZERO).unwrap();
        slots
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ml", name)
    }

    /// Ten candidates, as many as ever.
    const TEN: Candidates = Candidates {
        now: 10,
        fewest: 10,
    };

    #[test]
    fn a_claim_held_back_is_told_once_an_episode_and_a_released_slot_admits_it() {
        let slots = slots(1);
        let (now, wall) = (Instant::now(), Utc::now());
        let first = slots.admit(&key("a"), wall, TEN, now, wall);
        let Admission::At(reservation) = first.admission else {
            panic!("the first claim gets a slot: {first:?}");
        };
        let held = slots.admit(&key("b"), wall, TEN, now, wall);
        assert!(matches!(held.admission, Admission::Capped { .. }));
        assert!(held.first && held.full);
        let again = slots.admit(&key("b"), wall, TEN, now, wall);
        assert!(!again.first, "told once per episode");
        slots.release(reservation);
        let admitted = slots.admit(&key("b"), wall, TEN, now, wall);
        assert!(matches!(admitted.admission, Admission::At(_)));
        // Its episode ended with the slot: held back again, it is told again.
        assert!(slots.admit(&key("b"), wall, TEN, now, wall).first);
    }

    #[test]
    fn standing_by_forgets_the_count_and_the_line() {
        let slots = slots(1);
        let (now, wall) = (Instant::now(), Utc::now());
        slots.admit(&key("a"), wall, TEN, now, wall);
        assert!(slots.admit(&key("b"), wall, TEN, now, wall).first);
        slots.forget();
        let unknown = slots.admit(&key("b"), wall, TEN, now, wall);
        assert_eq!(unknown.admission, Admission::Unknown);
        slots.recover(None, wall, Duration::ZERO).unwrap();
        assert!(matches!(
            slots.admit(&key("b"), wall, TEN, now, wall).admission,
            Admission::At(_)
        ));
    }

    /// Slots with a cap of one whose one deletion was counted at the last instant of a bucket
    /// of the default window (so it counts exactly a window past it, and a millisecond), and
    /// the instants it was asked at, and that window.
    fn one_counted() -> (Slots, Option<Counted>, Instant, DateTime<Utc>, Duration) {
        let slots = slots(1);
        let window = Config::default().deletion.window;
        let now = Instant::now();
        let wall = DateTime::from_timestamp_millis(1_800_000_000_000 - 1).unwrap();
        let admitted = slots.admit(&key("a"), wall, TEN, now, wall).admission;
        let Admission::At(reservation) = admitted else {
            panic!("the first claim gets a slot: {admitted:?}");
        };
        let (_, counted) = slots.count_for_send(reservation, wall);
        (slots, counted, now, wall, window)
    }

    /// The balancer now answers from a server 3 s ahead of the one whose clock dated a
    /// deletion: judged on it, the deletion still counts a whole window of real time; a window
    /// and the tolerance later, it no longer does.
    #[test]
    fn a_deletion_counts_a_whole_window_on_a_clock_within_the_tolerance_ahead() {
        let (slots, _, now, wall, window) = one_counted();
        let ahead = Duration::from_secs(3);
        let later = window - Duration::from_secs(1);
        let judged = slots.admit(&key("b"), wall, TEN, now + later, wall + later + ahead);
        assert!(
            matches!(judged.admission, Admission::Capped { .. }),
            "{judged:?}"
        );
        let after = window + TOLERATED_DISAGREEMENT + Duration::from_millis(1);
        let judged = slots.admit(&key("b"), wall, TEN, now + after, wall + after);
        assert!(matches!(judged.admission, Admission::At(_)), "{judged:?}");
    }

    /// A hand-over: the next leader recovers the ledger from the Lease judged as it judges a
    /// slot, so a deletion the tolerance still counts is not dropped on the way.
    #[test]
    fn a_recovered_ledger_keeps_what_the_tolerance_still_counts() {
        let (_, counted, now, wall, window) = one_counted();
        let text = counted.expect("counted").ledger.to_annotation();
        // Past the window, within the tolerance, on the next leader's estimate.
        let then = wall + window + Duration::from_secs(1);
        let next = slots(1);
        next.recover(Some(&text), then, Duration::ZERO).unwrap();
        let judged = next.admit(&key("b"), then, TEN, now, then);
        assert!(
            matches!(judged.admission, Admission::Capped { .. }),
            "{judged:?}"
        );
    }

    #[test]
    fn a_clock_dispute_is_told_once_per_hold() {
        let slots = slots(1);
        let now = Instant::now();
        assert_eq!(slots.disputed(None), None);
        let window = Duration::from_secs(600);
        let hold = |since: Instant, last: Instant| {
            Some(Dispute {
                since,
                until: last + window,
            })
        };
        assert!(slots.disputed(hold(now, now)).unwrap().first);
        let extended = slots.disputed(hold(now, now + window / 2)).unwrap();
        assert!(!extended.first, "extended, not a new hold");
        assert_eq!(extended.until, now + window / 2 + window);
        let later = now + window * 2;
        assert!(slots.disputed(hold(later, later)).unwrap().first);
    }
}
