//! The blast-radius cap's record of deletions: how many fell in each slice of time, so that the
//! count of any rolling window can be told after a restart or by the next leader.
//!
//! It is kept on the leader-election Lease (`src/cluster/leader/records.rs`), not in the
//! daemon's memory nor in its `Deleted` events: the Lease is read and written by exactly one replica at a time, every
//! write is compare-and-swap on its resourceVersion (so a write also proves the writer still
//! holds it), and the daemon already has `get`, `create` and `update` on that one object, so no
//! new RBAC is needed. Events would need `list` on events in every namespace, may fail to be
//! written after the delete they record, and expire.
//!
//! A deletion is recorded before its DELETE is sent. A record whose delete was then refused is
//! taken out again; if that fails, or the process dies in between, the ledger over-counts,
//! which only delays deletions.
//!
//! Deletions are counted per bucket of a hundredth of the window (at least a millisecond), which
//! bounds the record at about a hundred entries whatever the cap. A deletion counts until its
//! bucket's *end* plus the window: never less than the window after it happened, at most one
//! bucket longer. So the cap is never exceeded, and deletions resume at most 1% of the window
//! later than an exact record would allow.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::contract::annotations::DELETIONS;
use crate::observe::metrics::LedgerFault;

/// How much later than the reader's clock, beyond the fence's reach, an honest record may be
/// dated: the clock skew between replicas that is tolerated. A record dated later can be no
/// deletion of this window; counting it would hold the cap for longer than a window past now.
pub const MAX_SKEW: Duration = Duration::from_secs(60);

/// The blast-radius count, kept in the Lease's [`DELETIONS`] annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    window_ms: i64,
    bucket_ms: i64,
    /// Deletions per bucket, by the bucket's start in milliseconds since the epoch. Never a
    /// zero count, and every start within chrono's range.
    counts: BTreeMap<i64, u32>,
}

/// The annotation's form: `{"bucketMillis":6000,"deletions":[[1764500000000,3],...]}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Stored {
    bucket_millis: i64,
    deletions: Vec<(i64, u32)>,
}

/// Why a ledger read from the Lease is not taken as the count: the caller counts the window as
/// full instead ([`Ledger::full`]).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the annotation {DELETIONS} is not a deletion ledger: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error(
        "the annotation {DELETIONS} has buckets of {found} ms; this window's are {expected} ms, \
         and none may be longer than the window ({window} ms)"
    )]
    Bucket {
        found: i64,
        expected: i64,
        window: i64,
    },
    #[error(
        "the annotation {DELETIONS} dates a bucket at {start} ms since the epoch, outside chrono's \
         range or more than {ahead} ms after now ({now} ms): no deletion can have been recorded there"
    )]
    Date { start: i64, now: i64, ahead: i64 },
}

impl LedgerError {
    /// The `fault` label of `workspace_gc_blast_radius_ledger_faults_total`.
    pub fn fault(&self) -> LedgerFault {
        match self {
            LedgerError::Malformed(_) => LedgerFault::Malformed,
            LedgerError::Bucket { .. } => LedgerFault::Bucket,
            LedgerError::Date { .. } => LedgerFault::Date,
        }
    }
}

impl Ledger {
    /// An empty ledger for a rolling window of `window`.
    pub fn new(window: Duration) -> Self {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 4);
        Self {
            window_ms,
            bucket_ms: (window_ms / 100).max(1),
            counts: BTreeMap::new(),
        }
    }

    /// Reads the annotation written by [`Ledger::to_annotation`], for a window of `window`, at
    /// `now`, where an honest writer dates a deletion at most `reach` (the fence's) after its
    /// own now. Only a plausible record is taken:
    ///
    /// - Buckets of another size than this window's are accepted up to the window itself (the
    ///   configuration may have changed since it was written): each record moves into the
    ///   bucket of its latest possible instant, which never shortens how long it counts and
    ///   lengthens it by less than a window.
    /// - Every bucket starts within chrono's range and at most `reach` + [`MAX_SKEW`] after
    ///   `now`. Buckets that stopped counting before `now` are dropped however old: a Lease
    ///   that saw no deletion for a while holds them.
    /// - Any count is taken as it is (a count above the cap only holds the cap).
    ///
    /// All arithmetic on what was read is checked, so no value overflows or panics.
    pub fn from_annotation(
        text: &str,
        window: Duration,
        now: DateTime<Utc>,
        reach: Duration,
    ) -> Result<Self, LedgerError> {
        let stored: Stored = serde_json::from_str(text)?;
        let mut ledger = Self::new(window);
        let most = ledger.window_ms.max(ledger.bucket_ms);
        if !(1..=most).contains(&stored.bucket_millis) {
            return Err(LedgerError::Bucket {
                found: stored.bucket_millis,
                expected: ledger.bucket_ms,
                window: ledger.window_ms,
            });
        }
        let now = now.timestamp_millis();
        let ahead = i64::try_from(reach.saturating_add(MAX_SKEW).as_millis()).unwrap_or(i64::MAX);
        for (start, count) in stored.deletions {
            // The latest instant the record may stand for, within chrono's range.
            let latest = start
                .checked_add(stored.bucket_millis - 1)
                .filter(|_| start <= now.saturating_add(ahead))
                .filter(|&latest| {
                    DateTime::from_timestamp_millis(start).is_some()
                        && DateTime::from_timestamp_millis(latest).is_some()
                })
                .ok_or(LedgerError::Date { start, now, ahead })?;
            ledger.add(latest, count);
        }
        ledger.forget_before_millis(now);
        Ok(ledger)
    }

    pub fn to_annotation(&self) -> String {
        let stored = Stored {
            bucket_millis: self.bucket_ms,
            deletions: self.counts.iter().map(|(&s, &c)| (s, c)).collect(),
        };
        // Serialising integers cannot fail.
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// Records a deletion sent at `at`.
    pub fn record(&mut self, at: DateTime<Utc>) {
        self.add(at.timestamp_millis(), 1);
    }

    /// Takes back a deletion recorded at `at` that was not carried out.
    pub fn unrecord(&mut self, at: DateTime<Utc>) {
        let start = self.bucket_of(at.timestamp_millis());
        if let Some(count) = self.counts.get_mut(&start) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.counts.remove(&start);
            }
        }
    }

    /// How many deletions count against a window ending at `at`.
    pub fn count(&self, at: DateTime<Utc>) -> u64 {
        let at = at.timestamp_millis();
        self.counts
            .iter()
            .filter(|&(&start, _)| self.expiry(start) > at)
            .fold(0, |sum, (_, &count)| sum.saturating_add(u64::from(count)))
    }

    /// `None` if one more deletion at `at` keeps the window within `max`; otherwise the first
    /// instant at which one more would (the end of chrono's range if it has none).
    pub fn capped_until(&self, at: DateTime<Utc>, max: u32) -> Option<DateTime<Utc>> {
        let count = self.count(at);
        if count < u64::from(max) {
            return None;
        }
        // How many must stop counting before one more fits.
        let mut excess = count - u64::from(max) + 1;
        let millis = at.timestamp_millis();
        for (&start, &count) in &self.counts {
            if self.expiry(start) <= millis {
                continue;
            }
            excess = excess.saturating_sub(u64::from(count));
            if excess == 0 {
                let until = DateTime::from_timestamp_millis(self.expiry(start));
                return Some(until.unwrap_or(DateTime::<Utc>::MAX_UTC));
            }
        }
        // Unreachable when the counts add up; the far future is the safe answer.
        Some(DateTime::<Utc>::MAX_UTC)
    }

    /// Drops the buckets that no longer count at `at`, so the record stays small.
    pub fn forget_before(&mut self, at: DateTime<Utc>) {
        self.forget_before_millis(at.timestamp_millis());
    }

    fn forget_before_millis(&mut self, at: i64) {
        let (window_ms, bucket_ms) = (self.window_ms, self.bucket_ms);
        self.counts
            .retain(|&start, _| start.saturating_add(bucket_ms).saturating_add(window_ms) > at);
    }

    /// A ledger that counts `max` deletions at `at`: what the leader assumes when the record it
    /// found cannot be read or is not plausible, so that nothing is deleted for a whole window.
    pub fn full(window: Duration, at: DateTime<Utc>, max: u32) -> Self {
        let mut ledger = Self::new(window);
        ledger.add(at.timestamp_millis(), max);
        ledger
    }

    fn add(&mut self, millis: i64, count: u32) {
        if count == 0 {
            return;
        }
        let start = self.bucket_of(millis);
        let entry = self.counts.entry(start).or_default();
        *entry = entry.saturating_add(count);
    }

    /// The start of the bucket holding `millis`. Saturates only below chrono's range, where no
    /// record is.
    fn bucket_of(&self, millis: i64) -> i64 {
        millis.saturating_sub(millis.rem_euclid(self.bucket_ms))
    }

    /// The first instant at which the deletions of the bucket starting at `start` stop counting.
    fn expiry(&self, start: i64) -> i64 {
        start
            .saturating_add(self.bucket_ms)
            .saturating_add(self.window_ms)
    }
}

/// Generators of what the Lease's annotation may hold, for the property tests here and in
/// `src/daemon/limiter.rs`.
#[cfg(test)]
pub(crate) mod strategies {
    use proptest::prelude::*;

    use super::Stored;

    /// An instant of 2025, a multiple of every bucket size the unit tests use.
    pub const T0: i64 = 1_764_000_000_000;

    /// Any i64, with its extremes and values near `T0` (the tests' now) made likely.
    pub fn millis() -> impl Strategy<Value = i64> {
        prop_oneof![
            1 => any::<i64>(),
            1 => Just(i64::MAX),
            1 => Just(i64::MIN),
            1 => -2i64..=2,
            12 => (-4_000_000_000i64..4_000_000_000).prop_map(|d| T0 + d),
        ]
    }

    /// A window in milliseconds, and an annotation for it: any text, or a well-formed ledger of
    /// any values, often of the window's own bucket size.
    pub fn annotation() -> impl Strategy<Value = (i64, String)> {
        (1i64..4_000_000_000).prop_flat_map(|window_ms| {
            let bucket = prop_oneof![
                4 => Just((window_ms / 100).max(1)),
                1 => millis(),
                2 => 1..=window_ms.saturating_mul(2),
            ];
            let count = prop_oneof![any::<u32>(), Just(u32::MAX), 0u32..4];
            let stored = (bucket, prop::collection::vec((millis(), count), 0..6)).prop_map(
                |(bucket_millis, deletions)| {
                    serde_json::to_string(&Stored {
                        bucket_millis,
                        deletions,
                    })
                    .expect("integers serialise")
                },
            );
            (
                Just(window_ms),
                prop_oneof![1 => any::<String>(), 6 => stored],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::strategies::{T0, annotation};
    use super::*;
    use proptest::prelude::*;

    fn at(millis: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(millis).unwrap()
    }

    fn read(text: &str, window: Duration, now: i64) -> Result<Ledger, LedgerError> {
        Ledger::from_annotation(text, window, at(now), Duration::ZERO)
    }

    #[test]
    fn counts_within_the_window_and_says_when_the_cap_lifts() {
        let window = Duration::from_secs(100); // buckets of 1 s
        let mut ledger = Ledger::new(window);
        ledger.record(at(T0 + 200));
        ledger.record(at(T0 + 5_000));
        assert_eq!(ledger.count(at(T0 + 6_000)), 2);
        assert_eq!(ledger.capped_until(at(T0 + 6_000), 3), None);
        // The first counts until the end of its bucket plus the window.
        assert_eq!(
            ledger.capped_until(at(T0 + 6_000), 2),
            Some(at(T0 + 1_000 + 100_000))
        );
        assert_eq!(
            ledger.capped_until(at(T0 + 6_000), 1),
            Some(at(T0 + 6_000 + 100_000))
        );
        assert_eq!(ledger.count(at(T0 + 101_000)), 1);
        assert_eq!(ledger.capped_until(at(T0 + 101_000), 2), None);
    }

    #[test]
    fn survives_the_annotation_and_a_change_of_window() {
        let mut ledger = Ledger::new(Duration::from_secs(100));
        ledger.record(at(T0 + 1_500));
        ledger.record(at(T0 + 1_700));
        let text = ledger.to_annotation();
        assert_eq!(
            text,
            format!(r#"{{"bucketMillis":1000,"deletions":[[{},2]]}}"#, T0 + 1000)
        );
        let now = T0 + 2_000;
        assert_eq!(read(&text, Duration::from_secs(100), now).unwrap(), ledger);
        // A ten times longer window: buckets of 10 s; the record moves to the bucket of the
        // latest instant it may stand for (T0 + 1999 ms), so it counts at least as long.
        let longer = read(&text, Duration::from_secs(1000), now).unwrap();
        assert_eq!(longer.count(at(T0 + 1_001_999)), 2);
        // A ten times shorter one: buckets of 100 ms, the record in the last of its second.
        let shorter = read(&text, Duration::from_secs(10), now).unwrap();
        assert_eq!(shorter.count(at(T0 + 1_900 + 100 + 9_999)), 2);
        // A window shorter than the bucket read: that record could be of any instant of it.
        let error = read(&text, Duration::from_millis(999), now).unwrap_err();
        assert_eq!(error.fault(), LedgerFault::Bucket);
    }

    #[test]
    fn old_buckets_are_dropped_whatever_their_age() {
        // What a Lease holds after a quiet week, or one that said 1970.
        for start in [T0 - 7 * 24 * 3_600_000, 0, -1_000] {
            let text = format!(r#"{{"bucketMillis":1000,"deletions":[[{start},5]]}}"#);
            let ledger = read(&text, Duration::from_secs(100), T0).unwrap();
            assert_eq!(ledger, Ledger::new(Duration::from_secs(100)));
        }
    }

    #[test]
    fn implausible_ledgers_are_refused() {
        let window = Duration::from_secs(100);
        let reach = Duration::from_secs(10);
        let ahead = T0 + 10_000 + 60_000;
        for (text, fault) in [
            ("garbage".to_owned(), LedgerFault::Malformed),
            ("{}".to_owned(), LedgerFault::Malformed),
            (
                r#"{"bucketMillis":1000,"deletions":[[1,-1]]}"#.to_owned(),
                LedgerFault::Malformed,
            ),
            (
                r#"{"bucketMillis":1000,"deletions":[],"x":1}"#.to_owned(),
                LedgerFault::Malformed,
            ),
            (
                r#"{"bucketMillis":0,"deletions":[]}"#.to_owned(),
                LedgerFault::Bucket,
            ),
            (
                r#"{"bucketMillis":-1000,"deletions":[]}"#.to_owned(),
                LedgerFault::Bucket,
            ),
            (
                format!(r#"{{"bucketMillis":{},"deletions":[[0,1]]}}"#, i64::MAX),
                LedgerFault::Bucket,
            ),
            (
                r#"{"bucketMillis":100001,"deletions":[]}"#.to_owned(),
                LedgerFault::Bucket,
            ),
            (
                format!(r#"{{"bucketMillis":1000,"deletions":[[{},1]]}}"#, i64::MAX),
                LedgerFault::Date,
            ),
            (
                format!(r#"{{"bucketMillis":1000,"deletions":[[{},1]]}}"#, i64::MIN),
                LedgerFault::Date,
            ),
            (
                format!(r#"{{"bucketMillis":1000,"deletions":[[{},1]]}}"#, ahead + 1),
                LedgerFault::Date,
            ),
        ] {
            let error = Ledger::from_annotation(&text, window, at(T0), reach)
                .expect_err(&text)
                .fault();
            assert_eq!(error, fault, "{text}");
        }
        // As late as an honest writer may date a delete: its reach, and the skew allowed.
        let text = format!(r#"{{"bucketMillis":1000,"deletions":[[{ahead},1]]}}"#);
        let ledger = Ledger::from_annotation(&text, window, at(T0), reach).unwrap();
        assert_eq!(ledger.count(at(T0)), 1);
    }

    #[test]
    fn extreme_values_keep_the_cap_closed() {
        let window = Duration::from_secs(100);
        // Counting past the end of chrono's range is capped until its end, not "not capped".
        let last = Ledger::full(window, DateTime::<Utc>::MAX_UTC, 1);
        assert_eq!(
            last.capped_until(DateTime::<Utc>::MAX_UTC, 1),
            Some(DateTime::<Utc>::MAX_UTC)
        );
        let mut first = Ledger::full(window, DateTime::<Utc>::MIN_UTC, 1);
        assert!(first.capped_until(DateTime::<Utc>::MIN_UTC, 1).is_some());
        first.unrecord(DateTime::<Utc>::MIN_UTC);
        first.unrecord(DateTime::<Utc>::MIN_UTC);
        // Counts that cannot be added up in a u32.
        let text = format!(
            r#"{{"bucketMillis":1000,"deletions":[[{T0},{m}],[{T0},{m}],[{},{m}],[{},0]]}}"#,
            T0 + 1_000,
            T0 + 2_000,
            m = u32::MAX
        );
        let ledger = read(&text, window, T0).unwrap();
        assert_eq!(ledger.count(at(T0)), 2 * u64::from(u32::MAX));
        assert_eq!(
            ledger.capped_until(at(T0), u32::MAX),
            Some(at(T0 + 2_000 + 100_000))
        );
        // A zero count is no record: taking one back from it does not wrap.
        let mut ledger = read(&text, window, T0).unwrap();
        ledger.unrecord(at(T0 + 2_000));
        assert_eq!(ledger.count(at(T0)), 2 * u64::from(u32::MAX));
    }

    #[test]
    fn a_full_ledger_holds_everything_for_a_window() {
        let window = Duration::from_secs(60);
        let ledger = Ledger::full(window, at(T0), 5);
        assert_eq!(ledger.capped_until(at(T0), 5), Some(at(T0 + 600 + 60_000)));
        assert_eq!(ledger.capped_until(at(T0 + 60_600), 5), None);
    }

    #[test]
    fn unrecording_takes_back_one_deletion() {
        let mut ledger = Ledger::new(Duration::from_secs(10));
        ledger.record(at(T0));
        ledger.unrecord(at(T0));
        ledger.unrecord(at(T0));
        assert_eq!(ledger.count(at(T0)), 0);
        assert_eq!(
            ledger.to_annotation(),
            r#"{"bucketMillis":100,"deletions":[]}"#
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Whatever the window and the deletion times, a ledger that admits a deletion only
        /// when `capped_until` says so never has more than `max` deletions in any window of
        /// the configured length, and once it refuses, it admits again exactly at the instant
        /// it named.
        #[test]
        fn never_more_than_max_in_any_window(
            window_ms in 1i64..10_000_000,
            max in 1u32..6,
            steps in prop::collection::vec(0i64..3_000_000, 1..40),
            later in 0i64..100_000_000,
        ) {
            let window = Duration::from_millis(window_ms as u64);
            let mut ledger = Ledger::new(window);
            let mut sent: Vec<i64> = Vec::new();
            let mut now = T0;
            for step in steps {
                now += step;
                match ledger.capped_until(at(now), max) {
                    None => {
                        ledger.record(at(now));
                        sent.push(now);
                    }
                    Some(until) => {
                        let until = until.timestamp_millis();
                        prop_assert!(until > now);
                        prop_assert_eq!(ledger.capped_until(at(until), max), None);
                        prop_assert!(ledger.capped_until(at(until - 1), max).is_some());
                    }
                }
                ledger.forget_before(at(now));
                // Round-trips through the annotation without losing a deletion, and an honest
                // ledger is plausible to whoever reads it later.
                let text = ledger.to_annotation();
                prop_assert_eq!(&read(&text, window, now).unwrap(), &ledger);
                let mut aged = ledger.clone();
                aged.forget_before(at(now + later));
                prop_assert_eq!(read(&text, window, now + later).unwrap(), aged);
            }
            for (i, &start) in sent.iter().enumerate() {
                let within = sent[i..].iter().take_while(|&&t| t < start + window_ms).count();
                prop_assert!(within <= max as usize, "{within} deletions within {window_ms} ms");
            }
        }

        /// Whatever the Lease holds, reading it and counting never panic, and either it is
        /// refused (the caller counts a full window) or it is a plausible ledger of this
        /// window's buckets that counts every deletion it records at least as long as its
        /// writer's buckets did, and whose cap lifts only after now.
        #[test]
        fn any_annotation_is_a_plausible_ledger_or_refused(
            (window_ms, text) in annotation(),
            now in (0i64..1_000_000_000).prop_map(|d| T0 + d),
            reach_ms in 0u64..3_600_000,
            max in prop_oneof![1u32..4, Just(u32::MAX)],
        ) {
            let window = Duration::from_millis(window_ms as u64);
            let reach = Duration::from_millis(reach_ms);
            let Ok(ledger) = Ledger::from_annotation(&text, window, at(now), reach) else {
                return Ok(());
            };
            let stored: Stored = serde_json::from_str(&text).expect("it was read");
            let bucket = stored.bucket_millis;
            prop_assert_eq!(ledger.bucket_ms, (window_ms / 100).max(1));
            prop_assert!((1..=window_ms.max(ledger.bucket_ms)).contains(&bucket));
            let ahead = now + reach_ms as i64 + MAX_SKEW.as_millis() as i64;
            for (&start, &count) in &ledger.counts {
                prop_assert!(count > 0);
                prop_assert!(start <= ahead + bucket);
                prop_assert!(ledger.expiry(start) > now);
            }
            // Every deletion counts at least until its writer's bucket ends plus the window.
            for &(start, _) in &stored.deletions {
                prop_assert!(start <= ahead);
                let until = start + bucket + window_ms;
                for t in [now, until - 1] {
                    if t < now || t >= until {
                        continue;
                    }
                    let recorded = stored
                        .deletions
                        .iter()
                        .filter(|&&(s, _)| s <= t && s + bucket + window_ms > t)
                        .fold(0u64, |sum, &(_, c)| sum + u64::from(c));
                    prop_assert!(ledger.count(at(t)) >= recorded.min(u64::from(u32::MAX)));
                }
            }
            match ledger.capped_until(at(now), max) {
                None => prop_assert!(ledger.count(at(now)) < u64::from(max)),
                Some(until) => prop_assert!(until > at(now)),
            }
        }
    }
}
