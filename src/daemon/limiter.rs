//! Deletion pacing and the blast-radius cap: at most one deletion per `interval`, and at most
//! `max_per_window` in any rolling `window` (fewer when a `share` of the candidates is
//! smaller), so that a wrong selector cannot wipe a cluster.
//! Pure: the caller passes the instant. While the cap holds claims back they wait in a
//! [`Line`], earliest due first: a slot that frees goes to the claim that has waited longest
//! for it, not to whichever retry comes first (under a saturated cap that would leave some
//! claims waiting without end).
//!
//! The cap counts through a [`Ledger`] that outlives this process (kept on the Lease by
//! `src/cluster/leader/records.rs`). Until the ledger of the current window is known — at
//! start, and from the moment leadership is lost until it is won again and the ledger read
//! back — nothing is admitted: the cap fails closed.
//!
//! The window is judged a tolerance earlier than the instant it is asked at
//! ([`Limiter::with_tolerance`]): the API servers behind one address may date deletions by
//! clocks that disagree within it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use crate::cluster::cache::Candidates;
use crate::daemon::cap_ledger::{Ledger, LedgerError};

/// The answer to a request for a deletion slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send the delete at the reservation's slot (now, or later to keep the pace).
    At(Reservation),
    /// The cap is reached: nothing may be deleted before this instant.
    Capped { until: Instant },
    /// The count of the current window is not known: nothing may be deleted.
    Unknown,
}

/// A granted deletion slot, counted in the ledger until released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub slot: Instant,
    /// The slot on the wall clock, as the ledger counts it.
    at: DateTime<Utc>,
    /// The ledger it was counted in: one restored since does not hold it.
    term: u64,
}

#[derive(Debug)]
pub struct Limiter {
    interval: Duration,
    max_per_window: u32,
    /// At most this percentage of the candidates in any window ([`Limiter::population`]);
    /// `None`: the absolute cap alone.
    share: Option<f64>,
    population: Population,
    window: Duration,
    /// How much earlier than asked the window is judged ([`Limiter::with_tolerance`]).
    tolerance: TimeDelta,
    next_slot: Option<Instant>,
    /// `None` while the count of the current window is unknown.
    ledger: Option<Ledger>,
    term: u64,
    /// How many times the count has changed: orders the ledgers handed out to be written.
    changes: u64,
}

/// The candidates the share is taken of: the fewest the cache counted at any moment within
/// the last window. Claims that arrive (a flood, or a namespace relabelled) cannot raise the
/// allowance of the window they arrive in: they count once a whole window has passed since,
/// while candidates that go count less at once. Of the rules that hold a flood to its
/// window's share, this one needs no window boundaries, which a rolling window lacks: the
/// smallest count in the window is the count any deletion in it was allowed against.
#[derive(Debug, Default)]
struct Population {
    /// The candidates now.
    now: usize,
    /// Earlier counts, each with the last instant it is known to have held, rising in both:
    /// a count no smaller than a later one can never be the fewest again. The first is the
    /// fewest within the window.
    lows: VecDeque<(Instant, usize)>,
}

impl Population {
    /// The cache's count at `at`, and the fewest since the last: that fewest held at some
    /// moment up to `at`, so it counts as holding until `at` (never shorter).
    fn observe(&mut self, at: Instant, candidates: Candidates, window: Duration) {
        let at = (self.lows.back()).map_or(at, |&(last, _)| last.max(at));
        let fewest = candidates.fewest.min(candidates.now);
        while (self.lows.back()).is_some_and(|&(_, count)| count >= fewest) {
            self.lows.pop_back();
        }
        self.lows.push_back((at, fewest));
        if let Some(start) = at.checked_sub(window) {
            while (self.lows.front()).is_some_and(|&(last, _)| last < start) {
                self.lows.pop_front();
            }
        }
        self.now = candidates.now;
    }

    fn fewest(&self) -> usize {
        (self.lows.front()).map_or(self.now, |&(_, count)| count.min(self.now))
    }
}

/// The ledger to write before a delete, and when it was taken among the count's changes: a
/// Lease write carrying a ledger of the same or a later generation counts that delete too.
#[derive(Debug, Clone)]
pub struct Counted {
    pub ledger: Ledger,
    pub generation: u64,
}

impl Limiter {
    /// A limiter whose count is unknown until [`Limiter::recover`]. `interval` comes from
    /// `config::deletion_interval`, which never turns a small rate into no pacing.
    pub fn new(interval: Duration, max_per_window: u32, window: Duration) -> Self {
        Self {
            interval,
            max_per_window,
            share: None,
            population: Population::default(),
            window,
            tolerance: TimeDelta::zero(),
            next_slot: None,
            ledger: None,
            term: 0,
            changes: 0,
        }
    }

    /// Caps each window at `percent` of the candidates too (`deletion.max_deletions_percent`):
    /// a flood of new candidates (a whole namespace relabelled at once) is taken a share at a
    /// time, whatever the absolute cap allows.
    pub fn with_share(mut self, percent: Option<f64>) -> Self {
        self.share = percent;
        self
    }

    /// Judges the window `tolerance` earlier than the instant asked, the earliest the API
    /// server's clock can read: every deletion then counts `tolerance` longer than its window.
    /// Deletions are dated at the latest the server's clock can read, which no honest server's
    /// clock has passed; the earliest is at most the fastest server's clock. So as long as the
    /// API servers behind one address disagree by at most `tolerance`, a deletion counts a
    /// whole window on the slowest server's clock, whichever server's clock dated it and
    /// whichever judges it: on this replica or on the next leader, which recovers the ledger
    /// from the Lease with the same tolerance (`server_clock::TOLERATED_DISAGREEMENT`, beyond
    /// which a clock dispute holds the cap instead).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = TimeDelta::from_std(tolerance).unwrap_or(TimeDelta::MAX);
        self
    }

    /// The instant the window is judged at when asked at `wall`.
    fn judged(&self, wall: DateTime<Utc>) -> DateTime<Utc> {
        (wall.checked_sub_signed(self.tolerance)).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The candidates the cache counts, taken at `now`: the share is of the fewest there were
    /// within the last window.
    pub fn population(&mut self, now: Instant, candidates: Candidates) {
        self.population.observe(now, candidates, self.window);
    }

    /// The most deletions any window may hold now: the absolute cap, or the share of the
    /// population when that is smaller, and never less than one.
    pub fn max(&self) -> u32 {
        let Some(percent) = self.share else {
            return self.max_per_window;
        };
        let share = (percent / 100.0 * self.population.fewest() as f64).ceil();
        // Saturating: a share beyond u32 is the absolute cap anyway.
        let share = if share >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            share as u32
        };
        self.max_per_window.min(share.max(1))
    }

    /// Reserves a deletion slot, or says until when the cap holds. `ahead` claims wait in line
    /// before this one ([`Line::ahead`]): the slots they are owed are not this one's.
    pub fn reserve(&mut self, now: Instant, wall: DateTime<Utc>, ahead: usize) -> Admission {
        let max = self.max();
        let judged = self.judged(wall);
        let Some(ledger) = &mut self.ledger else {
            return Admission::Unknown;
        };
        ledger.forget_before(judged);
        let slot = self.next_slot.map_or(now, |next| next.max(now));
        let at = wall + (slot - now);
        let judged_at = judged + (slot - now);
        let ahead = u32::try_from(ahead).unwrap_or(u32::MAX);
        let capped = match max.saturating_sub(ahead) {
            // Once the whole window has turned over, at least; a second if it is empty (those
            // ahead are taking their slots).
            0 => Some(
                ledger
                    .capped_until(judged_at, 1)
                    .unwrap_or(judged_at + Duration::from_secs(1)),
            ),
            room => ledger.capped_until(judged_at, room),
        };
        if let Some(until) = capped {
            let wait = (until - judged).to_std().unwrap_or(Duration::ZERO);
            return Admission::Capped {
                until: now.checked_add(wait).unwrap_or(now + self.window),
            };
        }
        ledger.record(at);
        self.changes += 1;
        self.next_slot = Some(
            slot.checked_add(self.interval)
                .unwrap_or(slot + self.window),
        );
        Admission::At(Reservation {
            slot,
            at,
            term: self.term,
        })
    }

    /// Whether the window ending at `wall` holds the maximum: the next request is capped, unless
    /// a deletion stops counting first. Unknown counts as full.
    pub fn full(&self, wall: DateTime<Utc>) -> bool {
        let max = u64::from(self.max());
        self.ledger
            .as_ref()
            .is_none_or(|ledger| ledger.count(self.judged(wall)) >= max)
    }

    /// Returns a slot that was not used (the live re-check kept the claim, or the delete was
    /// refused), so it does not count against the cap.
    pub fn release(&mut self, reservation: Reservation) {
        if reservation.term == self.term
            && let Some(ledger) = &mut self.ledger
        {
            ledger.unrecord(reservation.at);
            self.changes += 1;
        }
    }

    /// Moves a reservation's record to no earlier than `at`, and returns it moved. The window
    /// must count a delete from no earlier than the API server received it: the slot comes
    /// before the live re-check, which can take seconds, and a replica that recovers the
    /// ledger from the Lease knows only the instant written there.
    pub fn count_from(&mut self, reservation: Reservation, at: DateTime<Utc>) -> Reservation {
        let at = at.max(reservation.at);
        if reservation.term == self.term
            && let Some(ledger) = &mut self.ledger
        {
            ledger.unrecord(reservation.at);
            ledger.record(at);
            self.changes += 1;
        }
        Reservation { at, ..reservation }
    }

    /// Counts a DELETE that may still land from `at` in the current term's ledger, however
    /// full it is (it may land whatever the cap says), and returns its slot; `None` while the
    /// count is unknown. A DELETE owed a revocation holds one from each recovery on: a slot
    /// of an earlier term is not in the ledger recovered since, and would stop counting once
    /// the window of its last record passed.
    pub fn hold(&mut self, now: Instant, at: DateTime<Utc>) -> Option<Reservation> {
        let ledger = self.ledger.as_mut()?;
        ledger.record(at);
        self.changes += 1;
        Some(Reservation {
            slot: now,
            at,
            term: self.term,
        })
    }

    /// `reservation`, kept by a DELETE that may still land: as it is if the current ledger
    /// counts it, held again from `at` if it was granted before the count was last recovered
    /// (`None` while the count is unknown: the next recovery holds it).
    pub fn keep(
        &mut self,
        reservation: Reservation,
        now: Instant,
        at: DateTime<Utc>,
    ) -> Option<Reservation> {
        if reservation.term == self.term {
            return Some(reservation);
        }
        self.hold(now, at)
    }

    /// The ledger to persist before `reservation`'s delete: every reservation granted so far
    /// and not released, this one included. `None` if it was granted before the count was
    /// last forgotten or recovered: the ledger since then does not count it.
    pub fn ledger_for(&self, reservation: Reservation) -> Option<Counted> {
        let ledger = self
            .ledger
            .clone()
            .filter(|_| reservation.term == self.term)?;
        Some(Counted {
            ledger,
            generation: self.changes,
        })
    }

    /// Counts from the ledger found on the Lease when it was won (`None`: it had none), judged
    /// at `wall` with the fence's `reach` ([`Ledger::from_annotation`]). One that cannot be read
    /// or is not plausible counts as full for a window from `wall`: the cap fails closed.
    pub fn recover(
        &mut self,
        found: Option<&str>,
        wall: DateTime<Utc>,
        reach: Duration,
    ) -> Result<(), LedgerError> {
        // Judged as `reserve` judges, so what still counts there is kept; the dates allowed
        // ahead of `wall` stay those the reach allows.
        let judged = self.judged(wall);
        let ahead = reach.saturating_add((wall - judged).to_std().unwrap_or(Duration::ZERO));
        let found = found.map(|text| Ledger::from_annotation(text, self.window, judged, ahead));
        let (ledger, result) = match found {
            None => (Ledger::new(self.window), Ok(())),
            Some(Ok(ledger)) => (ledger, Ok(())),
            Some(Err(error)) => (
                Ledger::full(self.window, wall, self.max_per_window),
                Err(error),
            ),
        };
        self.restore(ledger);
        result
    }

    fn restore(&mut self, ledger: Ledger) {
        self.ledger = Some(ledger);
        self.term += 1;
        self.changes += 1;
    }

    /// Forgets the count (leadership lost): nothing is admitted until the next recovery.
    pub fn forget(&mut self) {
        self.ledger = None;
        self.term += 1;
        self.changes += 1;
    }
}

/// The claims the cap holds back, in the order they get slots: earliest due first (a claim
/// taken for quota pressure before any), then by key.
#[derive(Debug)]
pub struct Line<K: Ord + Clone> {
    order: BTreeSet<(DateTime<Utc>, K)>,
    places: BTreeMap<K, DateTime<Utc>>,
}

// Derived, it would ask the key for a default too.
impl<K: Ord + Clone> Default for Line<K> {
    fn default() -> Self {
        Self {
            order: BTreeSet::new(),
            places: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Line<K> {
    /// How many wait before `key`, due at `due`, whether it is in line or not, counted up to
    /// `at_most` (the cap: more ahead than it holds changes nothing, and a long line is
    /// not walked at every retry).
    pub fn ahead(&self, key: &K, due: DateTime<Utc>, at_most: usize) -> usize {
        let own = self.places.get(key).map(|&at| (at, key.clone()));
        let place = (due, key.clone());
        self.order
            .range(..&place)
            .filter(|entry| Some(*entry) != own.as_ref())
            .take(at_most)
            .count()
    }

    /// Puts `key` in line (again) at `due`; true if it was not in line: a new episode.
    pub fn join(&mut self, key: &K, due: DateTime<Utc>) -> bool {
        let before = self.places.insert(key.clone(), due);
        if let Some(at) = before {
            self.order.remove(&(at, key.clone()));
        }
        self.order.insert((due, key.clone()));
        before.is_none()
    }

    /// Takes `key` out of line: it got its slot, is no longer due, or is gone.
    pub fn leave(&mut self, key: &K) {
        if let Some(at) = self.places.remove(key) {
            self.order.remove(&(at, key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::cap_ledger::strategies::{T0, annotation};
    use proptest::prelude::*;

    fn limiter(interval: Duration, max: u32, window: Duration) -> Limiter {
        let mut limiter = Limiter::new(interval, max, window);
        limiter.restore(Ledger::new(window));
        limiter
    }

    fn capped(limiter: &Limiter, wall: DateTime<Utc>) -> bool {
        let ledger = limiter.ledger.as_ref().expect("known");
        ledger.capped_until(wall, limiter.max_per_window).is_some()
    }

    fn candidates(now: usize, fewest: usize) -> Candidates {
        Candidates { now, fewest }
    }

    /// With a share, a window holds at most that percentage of the candidates (at least
    /// one), and never more than the absolute cap.
    #[test]
    fn a_share_of_the_population_caps_each_window_below_the_absolute_cap() {
        let (now, wall, window) = (Instant::now(), Utc::now(), Duration::from_secs(600));
        let later = |i: usize| now + window * 2 * u32::try_from(i).unwrap();
        let mut shared = limiter(Duration::ZERO, 100, window).with_share(Some(10.0));
        for (i, (population, max)) in [(0, 1), (5, 1), (11, 2), (400, 40), (5_000, 100)]
            .into_iter()
            .enumerate()
        {
            // Each a window apart: a count that rose counts once a window has passed.
            shared.population(later(i), candidates(population, population));
            assert_eq!(shared.max(), max, "{population} candidates");
        }
        let mut shared = limiter(Duration::ZERO, 100, window).with_share(Some(10.0));
        shared.population(now, candidates(30, 30));
        for _ in 0..3 {
            assert!(matches!(shared.reserve(now, wall, 0), Admission::At(_)));
        }
        assert!(shared.full(wall), "3 of 30 candidates: 10%");
        assert!(matches!(
            shared.reserve(now, wall, 0),
            Admission::Capped { .. }
        ));
        shared.population(now + window * 2, candidates(40, 40));
        assert!(
            !shared.full(wall),
            "more candidates, a window later: a larger share"
        );
        let unshared = limiter(Duration::ZERO, 100, window);
        assert_eq!(unshared.max(), 100, "no share: the absolute cap");
    }

    /// On a fake clock: candidates that arrive raise the share only once a whole window has
    /// passed since the count was last seen low, whether the low was seen at an admission or
    /// between two (the cache's fewest since the last); candidates that go lower it at once.
    #[test]
    fn a_flood_of_candidates_raises_no_share_within_the_window_it_arrives_in() {
        let (t0, window) = (Instant::now(), Duration::from_secs(600));
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let mut shared = limiter(Duration::ZERO, 1000, window).with_share(Some(10.0));
        // (seconds, candidates now, the fewest since the last, the share, why)
        let steps = [
            (0, 10, 10, 1, "10 candidates"),
            // 300 arrive; the next admission sees them, and the low held until it.
            (100, 310, 10, 1, "the window they arrive in"),
            (
                650,
                310,
                310,
                1,
                "a window after they came, not after the low's last sight",
            ),
            (
                701,
                310,
                310,
                31,
                "a whole window since the low was last seen",
            ),
            // Fewer at once: a dip between two admissions counts, and holds a window.
            (800, 310, 50, 5, "a dip"),
            (1000, 200, 200, 5, "the dip is within the window"),
            (1401, 200, 200, 20, "a window after the dip"),
            // Rising step by step: each step waits a window from the last sight of the one
            // before (the cache's fewest since 1500 s is the 400 it had then).
            (1500, 400, 400, 20, "400 arrive"),
            (1600, 600, 400, 20, "600 arrive"),
            (
                2101,
                600,
                600,
                40,
                "the 400 last seen at 1600 s is within the window",
            ),
            (2201, 600, 600, 60, "a window after the 400"),
        ];
        for (at, now, fewest, max, why) in steps {
            shared.population(secs(at), candidates(now, fewest));
            assert_eq!(shared.max(), max, "at {at} s: {why}");
        }
        assert!(
            shared.population.lows.len() <= 2,
            "{:?}",
            shared.population.lows
        );
    }

    fn slot(admission: Admission) -> Instant {
        match admission {
            Admission::At(reservation) => reservation.slot,
            other => panic!("expected a slot, got {other:?}"),
        }
    }

    #[test]
    fn paces_deletions() {
        let (now, wall) = (Instant::now(), Utc::now());
        let mut limiter = limiter(Duration::from_millis(250), 100, Duration::from_secs(600));
        assert_eq!(slot(limiter.reserve(now, wall, 0)), now);
        assert_eq!(
            slot(limiter.reserve(now, wall, 0)),
            now + Duration::from_millis(250)
        );
        let later = Duration::from_secs(5);
        assert_eq!(
            slot(limiter.reserve(now + later, wall + later, 0)),
            now + later
        );
    }

    #[test]
    fn the_slowest_accepted_rate_still_paces() {
        let interval =
            crate::config::deletion_interval(1.0 / crate::config::MAX_DURATION.as_secs_f64())
                .expect("one deletion per 100 years is accepted");
        let (now, wall) = (Instant::now(), Utc::now());
        let mut limiter = limiter(interval, 100, Duration::from_secs(600));
        assert_eq!(slot(limiter.reserve(now, wall, 0)), now);
        assert!(slot(limiter.reserve(now, wall, 0)) >= now + interval);
    }

    #[test]
    fn caps_within_the_window_and_resumes_after_it() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(60);
        let mut limiter = limiter(Duration::ZERO, 3, window);
        for _ in 0..3 {
            assert!(matches!(limiter.reserve(now, wall, 0), Admission::At(_)));
        }
        assert!(capped(&limiter, wall));
        let half = Duration::from_secs(30);
        let Admission::Capped { until } = limiter.reserve(now + half, wall + half, 0) else {
            panic!("capped")
        };
        // The window, plus at most one bucket (a hundredth of it).
        assert!(until >= now + window && until <= now + window + window / 100);
        assert!(matches!(
            limiter.reserve(until, wall + (until - now), 0),
            Admission::At(_)
        ));
    }

    #[test]
    fn released_slots_do_not_count() {
        let (now, wall) = (Instant::now(), Utc::now());
        let mut limiter = limiter(Duration::ZERO, 1, Duration::from_secs(60));
        let Admission::At(reservation) = limiter.reserve(now, wall, 0) else {
            panic!("first reservation must be admitted")
        };
        limiter.release(reservation);
        assert!(!capped(&limiter, wall));
        assert!(matches!(limiter.reserve(now, wall, 0), Admission::At(_)));
    }

    #[test]
    fn a_delete_counts_from_when_it_was_answered() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(60);
        let mut limiter = limiter(Duration::ZERO, 1, window);
        let Admission::At(reservation) = limiter.reserve(now, wall, 0) else {
            panic!("admitted")
        };
        let slow = Duration::from_secs(5);
        let moved = limiter.count_from(reservation, wall + slow);
        // Moving never brings a record forward in time.
        assert_eq!(limiter.count_from(moved, wall), moved);
        let Admission::Capped { until } = limiter.reserve(now + window, wall + window, 0) else {
            panic!("still capped a window after the slot: the delete landed later")
        };
        assert!(until >= now + slow + window);
    }

    #[test]
    fn a_ledger_handed_out_later_is_of_a_later_generation_and_counts_the_moved_slot() {
        let (now, wall) = (Instant::now(), Utc::now());
        let mut leader = limiter(Duration::ZERO, 10, Duration::from_secs(30));
        let Admission::At(first) = leader.reserve(now, wall, 0) else {
            panic!("admitted")
        };
        let before = leader.ledger_for(first).expect("current");
        let moved = leader.count_from(first, wall + Duration::from_secs(5));
        let after = leader.ledger_for(moved).expect("current");
        // A Lease write of `before` does not count the slot where it now stands: a DELETE
        // whose ledger is `after` cannot rest on it.
        assert!(after.generation > before.generation);
        assert_ne!(after.ledger.to_annotation(), before.ledger.to_annotation());
        let Admission::At(second) = leader.reserve(now, wall, 0) else {
            panic!("admitted")
        };
        let newest = leader.ledger_for(second).expect("current");
        assert!(newest.generation > after.generation);
        leader.forget();
        leader
            .recover(None, wall, Duration::ZERO)
            .expect("recovered");
        assert!(
            leader.ledger_for(second).is_none(),
            "granted before the recovery"
        );
    }

    #[test]
    fn a_recovered_ledger_counts_a_delete_from_when_it_could_go_out() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(30);
        let mut leader = limiter(Duration::ZERO, 1, window);
        let Admission::At(reservation) = leader.reserve(now, wall, 0) else {
            panic!("admitted")
        };
        // The live re-check took 5 s; the ledger is written just before the DELETE.
        let late = wall + Duration::from_secs(5);
        let reservation = leader.count_from(reservation, late);
        let persisted = leader
            .ledger_for(reservation)
            .expect("current")
            .ledger
            .to_annotation();

        // The leader dies; another recovers the ledger a window after the slot.
        let mut next = limiter(Duration::ZERO, 1, window);
        next.recover(Some(&persisted), wall, Duration::ZERO)
            .unwrap();
        let after_slot = wall + window + Duration::from_secs(1);
        assert!(
            matches!(
                next.reserve(now + window + Duration::from_secs(1), after_slot, 0),
                Admission::Capped { .. }
            ),
            "a window after the slot, but not after the delete: still capped"
        );
    }

    #[test]
    fn unknown_until_restored_and_after_forgetting() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(60);
        let mut limiter = Limiter::new(Duration::ZERO, 1, window);
        assert_eq!(limiter.reserve(now, wall, 0), Admission::Unknown);
        limiter.restore(Ledger::new(window));
        let Admission::At(old) = limiter.reserve(now, wall, 0) else {
            panic!("admitted once known")
        };
        limiter.forget();
        assert_eq!(limiter.reserve(now, wall, 0), Admission::Unknown);
        // The ledger read back from the Lease holds that deletion; a release from the term
        // before must not take it out.
        let mut recovered = Ledger::new(window);
        recovered.record(wall);
        limiter.restore(recovered);
        limiter.release(old);
        assert!(capped(&limiter, wall));
    }

    /// A DELETE owed a revocation holds a slot in every term: one granted before a recovery is
    /// held again in the recovered ledger, one of this term stays as it is.
    #[test]
    fn a_slot_kept_across_a_recovery_is_held_again_in_the_new_count() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(60);
        let mut limiter = limiter(Duration::ZERO, 1, window);
        let Admission::At(old) = limiter.reserve(now, wall, 0) else {
            panic!("admitted")
        };
        assert_eq!(limiter.keep(old, now, wall), Some(old), "this term's");
        limiter.forget();
        assert_eq!(
            limiter.keep(old, now, wall),
            None,
            "unknown: held on recovery"
        );
        limiter
            .recover(None, wall, Duration::ZERO)
            .expect("recovered");
        let later = wall + window;
        let held = limiter.keep(old, now, later).expect("held again");
        assert!(capped(&limiter, later), "it fills the cap a window later");
        limiter.release(held);
        assert!(!capped(&limiter, later), "freed once revoked");
    }

    #[test]
    fn an_unreadable_ledger_holds_deletions_for_a_window() {
        let (now, wall) = (Instant::now(), Utc::now());
        let window = Duration::from_secs(60);
        let mut limiter = Limiter::new(Duration::ZERO, 5, window);
        assert!(
            limiter
                .recover(Some("not a ledger"), wall, Duration::ZERO)
                .is_err()
        );
        let Admission::Capped { until } = limiter.reserve(now, wall, 0) else {
            panic!("capped")
        };
        assert!(until >= now + window);
        assert!(limiter.recover(None, wall, Duration::ZERO).is_ok());
        assert!(matches!(limiter.reserve(now, wall, 0), Admission::At(_)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Whatever the Lease holds: a ledger refused on recovery admits no delete for a whole
        /// window from then, and reserving never panics.
        #[test]
        fn a_refused_ledger_admits_nothing_for_a_window(
            (window_ms, text) in annotation(),
            now in (0i64..1_000_000_000).prop_map(|d| T0 + d),
            reach_ms in 0u64..3_600_000,
            max in 1u32..4,
            within in prop::collection::vec(0.0f64..1.0, 1..8),
        ) {
            let window = Duration::from_millis(window_ms as u64);
            let mut limiter = Limiter::new(Duration::ZERO, max, window);
            let wall = DateTime::from_timestamp_millis(now).expect("in range");
            let refused = limiter
                .recover(Some(&text), wall, Duration::from_millis(reach_ms))
                .is_err();
            let start = Instant::now();
            for fraction in within {
                let later = window.mul_f64(fraction);
                let admission = limiter.reserve(start + later, wall + later, 0);
                prop_assert!(!(refused && matches!(admission, Admission::At(_))), "{admission:?}");
            }
        }
    }
}
