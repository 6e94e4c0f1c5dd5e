//! The blast-radius cap's record of deletions: how many fell in each slice of time, so that the
//! count of any rolling window can be told after a restart or by the next leader.
//!
//! It is kept on the leader-election Lease (`src/cluster/leader.rs`), not in the daemon's memory nor in
//! its `Deleted` events: the Lease is read and written by exactly one replica at a time, every
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

/// The blast-radius count, kept in the Lease's [`DELETIONS`] annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    window_ms: i64,
    bucket_ms: i64,
    /// Deletions per bucket, by the bucket's start in milliseconds since the epoch.
    counts: BTreeMap<i64, u32>,
}

/// The annotation's form: `{"bucketMillis":6000,"deletions":[[1764500000000,3],...]}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Stored {
    bucket_millis: i64,
    deletions: Vec<(i64, u32)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the annotation {DELETIONS} is not a deletion ledger: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("the annotation {DELETIONS} has a bucket of {0} ms; expected at least 1")]
    Bucket(i64),
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

    /// Reads the annotation written by [`Ledger::to_annotation`], for a window of `window`
    /// (the configuration may have changed since it was written). A record of another bucket
    /// size is moved into the bucket of its latest possible instant, which never shortens how
    /// long it counts.
    pub fn from_annotation(text: &str, window: Duration) -> Result<Self, LedgerError> {
        let stored: Stored = serde_json::from_str(text)?;
        if stored.bucket_millis < 1 {
            return Err(LedgerError::Bucket(stored.bucket_millis));
        }
        let mut ledger = Self::new(window);
        for (start, count) in stored.deletions {
            let latest = start.saturating_add(stored.bucket_millis - 1);
            ledger.add(latest, count);
        }
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
            *count -= 1;
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
            .map(|(_, &count)| u64::from(count))
            .sum()
    }

    /// `None` if one more deletion at `at` keeps the window within `max`; otherwise the first
    /// instant at which one more would.
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
                return DateTime::from_timestamp_millis(self.expiry(start));
            }
        }
        // Unreachable when the counts add up; the far future is the safe answer.
        Some(DateTime::<Utc>::MAX_UTC)
    }

    /// Drops the buckets that no longer count at `at`, so the record stays small.
    pub fn forget_before(&mut self, at: DateTime<Utc>) {
        let at = at.timestamp_millis();
        let (window_ms, bucket_ms) = (self.window_ms, self.bucket_ms);
        self.counts
            .retain(|&start, _| start.saturating_add(bucket_ms + window_ms) > at);
    }

    /// A ledger that counts `max` deletions at `at`: what the leader assumes when the record it
    /// found cannot be read, so that nothing is deleted for a whole window.
    pub fn full(window: Duration, at: DateTime<Utc>, max: u32) -> Self {
        let mut ledger = Self::new(window);
        ledger.add(at.timestamp_millis(), max);
        ledger
    }

    fn add(&mut self, millis: i64, count: u32) {
        let start = self.bucket_of(millis);
        let entry = self.counts.entry(start).or_default();
        *entry = entry.saturating_add(count);
    }

    fn bucket_of(&self, millis: i64) -> i64 {
        millis - millis.rem_euclid(self.bucket_ms)
    }

    /// The first instant at which the deletions of the bucket starting at `start` stop counting.
    fn expiry(&self, start: i64) -> i64 {
        start
            .saturating_add(self.bucket_ms)
            .saturating_add(self.window_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(millis: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(millis).unwrap()
    }

    // A multiple of every bucket size used below.
    const T0: i64 = 1_764_000_000_000;

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
        assert_eq!(
            Ledger::from_annotation(&text, Duration::from_secs(100)).unwrap(),
            ledger
        );
        // A ten times longer window: buckets of 10 s; the record moves to the bucket of the
        // latest instant it may stand for (T0 + 1999 ms), so it counts at least as long.
        let longer = Ledger::from_annotation(&text, Duration::from_secs(1000)).unwrap();
        assert_eq!(longer.count(at(T0 + 1_001_999)), 2);
        assert!(Ledger::from_annotation("{}", Duration::from_secs(1)).is_err());
        assert!(Ledger::from_annotation("garbage", Duration::from_secs(1)).is_err());
        let zero = r#"{"bucketMillis":0,"deletions":[]}"#;
        assert!(Ledger::from_annotation(zero, Duration::from_secs(1)).is_err());
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
        /// Whatever the window and the deletion times, a ledger that admits a deletion only
        /// when `capped_until` says so never has more than `max` deletions in any window of
        /// the configured length, and once it refuses, it admits again exactly at the instant
        /// it named.
        #[test]
        fn never_more_than_max_in_any_window(
            window_ms in 1i64..10_000_000,
            max in 1u32..6,
            steps in prop::collection::vec(0i64..3_000_000, 1..40),
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
                // Round-trips through the annotation without losing a deletion.
                let back = Ledger::from_annotation(&ledger.to_annotation(), window).unwrap();
                prop_assert_eq!(&back, &ledger);
            }
            for (i, &start) in sent.iter().enumerate() {
                let within = sent[i..].iter().take_while(|&&t| t < start + window_ms).count();
                prop_assert!(within <= max as usize, "{within} deletions within {window_ms} ms");
            }
        }
    }
}
