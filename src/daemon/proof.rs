//! Proving the cache fresh before a delete, instead of listing the claim's namespace.
//!
//! A watch can go silent without an error, so the cache cannot vouch for itself; but it can be
//! proven to hold everything the API server held at one instant, at the cost of a few small
//! reads shared by every re-check waiting for them. A *round* proves each kind in
//! [`PROVEN`](crate::cluster::watches::PROVEN) for one watch scope:
//! 1. its collection's resourceVersion `R` is read consistently (a list selecting nothing);
//! 2. if the kind's watch has delivered up to `R` or beyond, it is proven;
//! 3. otherwise a short watch replays the kind's changes since the cache's resourceVersion, up
//!    to a bookmark at `R` or later, and the kind is proven once the cache reflects each of
//!    them: delivered by its watch, or a deletion of an object the cache does not hold; or
//!    sooner, once its watch has delivered up to `R` after all (step 2, checked again).
//!
//! Anything else (a read fails, the replay is refused or gets no bookmark, the watch does not
//! catch up within [`PROOF_BOUND`]) leaves the round unproven, and the re-check lists the
//! namespace live, as without this. A round starts only after every re-check it serves asked
//! for it, and one proven round dates the re-check from its first read. Rounds of a scope
//! start at least `deletion.proof_round_interval` apart: the reads a round costs are shared by
//! more re-checks the longer it is, and each waits longer for its round.
//!
//! A re-check that would be a round's only reader ([`Way::Direct`]: no round of its scope waits
//! to start and no other re-check of the scope asked within the interval) lists its namespace
//! live instead: the same four reads a round sends, answered at once, where a round of quiet
//! kinds waits one to two seconds for its replays' bookmarks (bench/RESULTS.md, "A claim that
//! comes due alone").

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::cache::Scope;
use crate::cluster::progress::Delivery;
use crate::contract::OwnerKind;
use crate::decide::facts::{ClaimFacts, JobEntry, ObjectKey, PodUse, RunEntry};
use crate::decide::linking::{self, Found, Lookup};

/// How long a round may take before the re-check lists instead: its replays get their
/// bookmarks after one to two seconds, and the re-check's own bound
/// ([`LIVE_BOUND`](crate::daemon::controller::LIVE_BOUND), 5 s) counts from the round's first
/// read, so what is left of it stays enough for the DELETE.
pub const PROOF_BOUND: Duration = Duration::from_secs(3);

/// Whether the cache, having delivered up to `delivered`, reflects every change a replay
/// found: each one delivered already, or the deletion of an object the cache does not hold (it
/// never held it, or its deletion came too).
pub fn reflects(
    delivered: Option<u64>,
    changes: &[Delivery],
    holds: impl Fn(&ObjectKey) -> bool,
) -> bool {
    let Some(delivered) = delivered else {
        return false;
    };
    (changes.iter())
        .all(|change| change.revision <= delivered || (change.deleted && !holds(&change.key)))
}

/// The rounds of every scope. Rounds of one scope start at least `interval` apart, and may
/// overlap; a re-check that asks while one waits to start shares it.
pub struct Proofs {
    interval: Duration,
    scopes: Mutex<HashMap<Scope, Arc<Mutex<Schedule>>>>,
}

/// A round's outcome once it finished: when its first read was sent (`None`: unproven).
type Outcome = watch::Sender<Option<Option<Instant>>>;

#[derive(Default)]
struct Schedule {
    /// The round waiting to start, which re-checks asking now share.
    next: Option<Arc<Outcome>>,
    last_start: Option<Instant>,
    /// When a re-check of the scope last asked, by either way.
    last_ask: Option<Instant>,
}

/// How a re-check reads what may protect its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the cache, proven fresh by a round it shares or starts.
    Round,
    /// Listed live: no other re-check would share the round.
    Direct,
}

/// A re-check is alone, and reads directly, when no round of its scope waits to start
/// (`pending`) and no other re-check of the scope asked within `interval` before `now`: a round
/// it started would serve it alone, at the same four reads as the lists and a bookmark's wait
/// more. Otherwise it shares the reads of a round with the others.
pub fn way(pending: bool, last_ask: Option<Instant>, now: Instant, interval: Duration) -> Way {
    let recent = last_ask.is_some_and(|asked| now.saturating_duration_since(asked) < interval);
    if pending || recent {
        Way::Round
    } else {
        Way::Direct
    }
}

impl Proofs {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            scopes: Mutex::default(),
        }
    }

    /// How a re-check of `scope` asking now reads ([`way`]); the ask is recorded, so that the
    /// re-checks after it within the interval share a round.
    pub fn way(&self, scope: &Scope) -> Way {
        let schedule = self.schedule(scope);
        let mut planned = lock(&schedule);
        let now = Instant::now();
        let way = way(planned.next.is_some(), planned.last_ask, now, self.interval);
        planned.last_ask = Some(now);
        way
    }

    fn schedule(&self, scope: &Scope) -> Arc<Mutex<Schedule>> {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes.entry(scope.clone()).or_default().clone()
    }

    /// The instant a round proven for `scope` sent its first read, a round that started after
    /// this call (run by this caller with `round`, or shared with another's); `None` when it
    /// was not proven.
    pub async fn prove<F>(&self, scope: &Scope, round: impl FnOnce() -> F) -> Option<Instant>
    where
        F: Future<Output = Option<Instant>>,
    {
        let schedule = self.schedule(scope);
        let role = {
            let mut planned = lock(&schedule);
            planned.last_ask = Some(Instant::now());
            match &planned.next {
                Some(next) => Err(next.subscribe()),
                None => {
                    let outcome = Arc::new(watch::channel(None).0);
                    planned.next = Some(outcome.clone());
                    let now = Instant::now();
                    let start_at =
                        (planned.last_start).map_or(now, |last| (last + self.interval).max(now));
                    Ok((outcome, start_at))
                }
            }
        };
        let (outcome, start_at) = match role {
            Ok(running) => running,
            Err(mut shared) => {
                let finished = shared.wait_for(Option::is_some).await;
                return finished.ok().and_then(|outcome| *outcome).flatten();
            }
        };
        let mut running = Running {
            schedule,
            outcome,
            finished: false,
        };
        tokio::time::sleep_until(start_at).await;
        {
            let mut planned = lock(&running.schedule);
            if (planned.next.as_ref()).is_some_and(|next| Arc::ptr_eq(next, &running.outcome)) {
                planned.next = None;
            }
            planned.last_start = Some(Instant::now());
        }
        let proven = round().await;
        running.finish(proven);
        proven
    }
}

fn lock(schedule: &Mutex<Schedule>) -> MutexGuard<'_, Schedule> {
    schedule.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The round this re-check runs: its outcome reaches the re-checks sharing it, and if the
/// re-check is dropped before it finishes, they read it unproven and list.
struct Running {
    schedule: Arc<Mutex<Schedule>>,
    outcome: Arc<Outcome>,
    finished: bool,
}

impl Running {
    fn finish(&mut self, proven: Option<Instant>) {
        self.finished = true;
        self.outcome.send_replace(Some(proven));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut planned = lock(&self.schedule);
        if (planned.next.as_ref()).is_some_and(|next| Arc::ptr_eq(next, &self.outcome)) {
            planned.next = None;
        }
        self.outcome.send_replace(Some(None));
    }
}

/// What the re-check read: the namespace listed live, or the proven cache's answers.
#[derive(Debug)]
pub enum Recheck<L> {
    Listed(L),
    /// Boxed: the answers are a few maps, a listed view one pointer.
    Proven(Box<Recorded>),
}

impl<L: Lookup> Lookup for Recheck<L> {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry> {
        match self {
            Recheck::Listed(live) => live.job(namespace, name),
            Recheck::Proven(recorded) => recorded.job(namespace, name),
        }
    }

    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry> {
        match self {
            Recheck::Listed(live) => live.run(kind, namespace, name),
            Recheck::Proven(recorded) => recorded.run(kind, namespace, name),
        }
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        match self {
            Recheck::Listed(live) => live.runs_binding(claim),
            Recheck::Proven(recorded) => recorded.runs_binding(claim),
        }
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        match self {
            Recheck::Listed(live) => live.pods_using(claim),
            Recheck::Proven(recorded) => recorded.pods_using(claim),
        }
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        match self {
            Recheck::Listed(live) => live.jobs_naming(claim),
            Recheck::Proven(recorded) => recorded.jobs_naming(claim),
        }
    }

    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32> {
        match self {
            Recheck::Listed(live) => live.failed_after(kind, namespace, at),
            Recheck::Proven(recorded) => recorded.failed_after(kind, namespace, at),
        }
    }
}

/// The answers linking got for one claim from a lookup (the proven cache, under its lock),
/// kept to be asked again without it. A question not asked then is answered unknown.
#[derive(Debug, Default)]
pub struct Recorded {
    jobs: HashMap<(String, String), Found<JobEntry>>,
    runs: HashMap<(OwnerKind, String, String), Found<RunEntry>>,
    runs_binding: HashMap<ObjectKey, Found<Vec<RunEntry>>>,
    pods_using: HashMap<ObjectKey, Found<Vec<PodUse>>>,
    jobs_naming: HashMap<ObjectKey, Found<Vec<JobEntry>>>,
    failed_after: HashMap<(OwnerKind, String, DateTime<Utc>), Found<u32>>,
}

impl Recorded {
    pub fn of(claim: &ClaimFacts, lookup: &impl Lookup) -> Self {
        let recorder = Recorder {
            lookup,
            seen: RefCell::default(),
        };
        linking::facts(claim, &recorder);
        recorder.seen.into_inner()
    }
}

fn not_asked<T>() -> Found<T> {
    Found::Unknown("not read when the cache was proven fresh".to_owned())
}

impl Lookup for Recorded {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry> {
        let key = (namespace.to_owned(), name.to_owned());
        self.jobs.get(&key).cloned().unwrap_or_else(not_asked)
    }

    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        self.runs.get(&key).cloned().unwrap_or_else(not_asked)
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        self.runs_binding
            .get(claim)
            .cloned()
            .unwrap_or_else(not_asked)
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        self.pods_using
            .get(claim)
            .cloned()
            .unwrap_or_else(not_asked)
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        self.jobs_naming
            .get(claim)
            .cloned()
            .unwrap_or_else(not_asked)
    }

    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32> {
        let key = (kind, namespace.to_owned(), at);
        self.failed_after
            .get(&key)
            .cloned()
            .unwrap_or_else(not_asked)
    }
}

struct Recorder<'a, L> {
    lookup: &'a L,
    seen: RefCell<Recorded>,
}

impl<L: Lookup> Lookup for Recorder<'_, L> {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry> {
        let found = self.lookup.job(namespace, name);
        let key = (namespace.to_owned(), name.to_owned());
        self.seen.borrow_mut().jobs.insert(key, found.clone());
        found
    }

    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry> {
        let found = self.lookup.run(kind, namespace, name);
        let key = (kind, namespace.to_owned(), name.to_owned());
        self.seen.borrow_mut().runs.insert(key, found.clone());
        found
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        let found = self.lookup.runs_binding(claim);
        (self.seen.borrow_mut().runs_binding).insert(claim.clone(), found.clone());
        found
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        let found = self.lookup.pods_using(claim);
        (self.seen.borrow_mut().pods_using).insert(claim.clone(), found.clone());
        found
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        let found = self.lookup.jobs_naming(claim);
        (self.seen.borrow_mut().jobs_naming).insert(claim.clone(), found.clone());
        found
    }

    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32> {
        let found = self.lookup.failed_after(kind, namespace, at);
        let key = (kind, namespace.to_owned(), at);
        (self.seen.borrow_mut().failed_after).insert(key, found.clone());
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, revision: u64, deleted: bool) -> Delivery {
        Delivery {
            key: ObjectKey::new("ml", name),
            revision,
            deleted,
        }
    }

    #[test]
    fn the_cache_reflects_what_it_delivered_and_deletions_it_does_not_hold() {
        let held = |key: &ObjectKey| key.name == "held";
        let changes = [change("a", 5, false), change("gone", 9, true)];
        assert!(reflects(Some(5), &changes, held));
        assert!(
            !reflects(Some(4), &changes, held),
            "a change past the cache"
        );
        assert!(
            !reflects(Some(5), &[change("held", 9, true)], held),
            "a deletion the cache has not seen"
        );
        assert!(!reflects(None, &[], held), "a watch that never said");
        assert!(reflects(Some(1), &[], held), "nothing changed");
    }

    /// Proofs of one scope, each round taking `takes` and recording when it started.
    fn ask(
        proofs: &Arc<Proofs>,
        starts: &Arc<Mutex<Vec<Instant>>>,
        takes: Duration,
    ) -> tokio::task::JoinHandle<Option<Instant>> {
        let (proofs, starts) = (proofs.clone(), starts.clone());
        tokio::spawn(async move {
            let round = || async move {
                let start = Instant::now();
                starts.lock().unwrap().push(start);
                tokio::time::sleep(takes).await;
                Some(start)
            };
            proofs.prove(&None, round).await
        })
    }

    async fn after(millis: u64) {
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn re_checks_that_ask_while_a_round_waits_share_it_and_rounds_start_an_interval_apart() {
        let proofs = Arc::new(Proofs::new(Duration::from_secs(1)));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let first = ask(&proofs, &starts, Duration::from_secs(2));
        after(100).await;
        let second = ask(&proofs, &starts, Duration::from_secs(2));
        after(100).await;
        let third = ask(&proofs, &starts, Duration::from_secs(2));
        let (first, second, third) = (first.await.unwrap(), second.await.unwrap(), third.await);
        let starts = starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 2, "one round, then one shared: {starts:?}");
        assert_eq!(first, Some(t0));
        assert_eq!(
            second,
            Some(t0 + Duration::from_secs(1)),
            "an interval after the first"
        );
        assert_eq!(third.unwrap(), second, "the same round");
        assert!(
            starts[1] < starts[0] + Duration::from_secs(2),
            "it did not wait for the first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_dropped_before_it_starts_reads_unproven_and_the_next_asks_anew() {
        let proofs = Arc::new(Proofs::new(Duration::from_secs(1)));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let first = ask(&proofs, &starts, Duration::from_millis(10));
        after(100).await;
        let dropped = ask(&proofs, &starts, Duration::from_millis(10));
        after(100).await;
        let sharing = ask(&proofs, &starts, Duration::from_millis(10));
        after(100).await;
        dropped.abort();
        assert_eq!(sharing.await.unwrap(), None, "unproven: it lists");
        let next = ask(&proofs, &starts, Duration::from_millis(10));
        assert!(next.await.unwrap().is_some());
        assert!(first.await.unwrap().is_some());
        assert_eq!(starts.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_re_check_reads_directly_only_when_no_other_would_share_its_round() {
        let interval = Duration::from_millis(1500);
        let now = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            way(false, None, now, interval),
            Way::Direct,
            "the first ever"
        );
        let long_ago = now - Duration::from_secs(4);
        assert_eq!(way(false, Some(long_ago), now, interval), Way::Direct);
        let just_now = now - Duration::from_millis(300);
        assert_eq!(
            way(false, Some(just_now), now, interval),
            Way::Round,
            "another asked within the interval"
        );
        assert_eq!(
            way(true, Some(long_ago), now, interval),
            Way::Round,
            "a round waits to start: share it"
        );
        assert_eq!(way(false, Some(now - interval), now, interval), Way::Direct);
    }

    #[tokio::test(start_paused = true)]
    async fn in_a_burst_the_first_re_check_reads_directly_and_the_rest_share_rounds() {
        let proofs = Arc::new(Proofs::new(Duration::from_secs(1)));
        let scope = Some("ml".to_owned());
        assert_eq!(proofs.way(&scope), Way::Direct);
        after(100).await;
        assert_eq!(proofs.way(&scope), Way::Round, "one asked 100 ms ago");
        assert_eq!(proofs.way(&None), Way::Direct, "another scope is alone");
        after(2000).await;
        assert_eq!(proofs.way(&scope), Way::Direct, "alone again");
        // A round asked for counts as an ask: the next re-check shares rounds.
        let starts = Arc::new(Mutex::new(Vec::new()));
        after(2000).await;
        let round = ask(&proofs, &starts, Duration::from_millis(10));
        after(50).await;
        assert_eq!(proofs.way(&None), Way::Round);
        assert!(round.await.unwrap().is_some());
    }

    #[test]
    fn a_recording_answers_what_was_asked_and_nothing_else() {
        use crate::cluster::cache::{Change, Index, Update};
        use crate::decide::facts::PodEntry;
        let claim = ClaimFacts::example("build-workspace");
        let mut index = Index::listed_empty();
        index.update(Update::Pod(Change::Apply(PodEntry {
            key: ObjectKey::new(&claim.key.namespace, "build-pod"),
            phase: Some("Running".into()),
            claims: vec![claim.key.name.clone()],
        })));
        let recorded = Recorded::of(&claim, &index);
        let pods = recorded.pods_using(&claim.key);
        assert!(
            matches!(&pods, Found::Yes(pods) if pods.len() == 1),
            "{pods:?}"
        );
        assert_eq!(pods, index.pods_using(&claim.key));
        assert_eq!(
            recorded.runs_binding(&claim.key),
            index.runs_binding(&claim.key)
        );
        let other = ObjectKey::new(&claim.key.namespace, "other");
        assert!(matches!(recorded.pods_using(&other), Found::Unknown(_)));
    }
}
