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
//! for it, and one proven round dates the re-check from its first read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
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

/// The rounds of every scope: at most one in flight per scope, and re-checks that asked
/// while one was in flight share the next.
#[derive(Default)]
pub struct Proofs {
    scopes: Mutex<HashMap<Scope, Arc<ScopeRounds>>>,
}

#[derive(Default)]
struct ScopeRounds {
    /// Held by the re-check running a round.
    turn: tokio::sync::Mutex<()>,
    tally: Mutex<Tally>,
}

#[derive(Default)]
struct Tally {
    started: u64,
    /// The latest round finished: its number and when its first read was sent (`None`:
    /// unproven).
    finished: Option<(u64, Option<Instant>)>,
}

impl ScopeRounds {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The outcome of the latest round, if it is round `ticket` or later.
    fn done(&self, ticket: u64) -> Option<Option<Instant>> {
        let finished = self.tally().finished;
        finished
            .filter(|(number, _)| *number >= ticket)
            .map(|(_, at)| at)
    }
}

impl Proofs {
    /// The instant a round proven for `scope` sent its first read, a round that started after
    /// this call (run by this caller with `round`, or shared with another's); `None` when it
    /// was not proven.
    pub async fn prove<F>(&self, scope: &Scope, round: impl FnOnce() -> F) -> Option<Instant>
    where
        F: Future<Output = Option<Instant>>,
    {
        let rounds = {
            let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
            scopes.entry(scope.clone()).or_default().clone()
        };
        let ticket = rounds.tally().started + 1;
        let _turn = rounds.turn.lock().await;
        if let Some(outcome) = rounds.done(ticket) {
            return outcome;
        }
        let number = {
            let mut tally = rounds.tally();
            tally.started += 1;
            tally.started
        };
        let outcome = round().await;
        rounds.tally().finished = Some((number, outcome));
        outcome
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
    use std::sync::atomic::{AtomicU32, Ordering};

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

    #[tokio::test]
    async fn re_checks_that_ask_during_a_round_share_the_next() {
        let rounds = Arc::new(Proofs::default());
        let runs = Arc::new(AtomicU32::new(0));
        let (release, held) = tokio::sync::watch::channel(false);
        let round = |runs: Arc<AtomicU32>, mut held: tokio::sync::watch::Receiver<bool>| {
            move || async move {
                let number = runs.fetch_add(1, Ordering::SeqCst);
                // The first round waits until the others have asked.
                if number == 0 {
                    let _ = held.wait_for(|go| *go).await;
                }
                Some(Instant::now())
            }
        };
        let first = {
            let (rounds, runs, held) = (rounds.clone(), runs.clone(), held.clone());
            tokio::spawn(async move { rounds.prove(&None, round(runs, held)).await })
        };
        tokio::task::yield_now().await;
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..3)
            .map(|_| {
                let (rounds, runs, held) = (rounds.clone(), runs.clone(), held.clone());
                tokio::spawn(async move { rounds.prove(&None, round(runs, held)).await })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(true).expect("receivers");
        let first = first.await.expect("joined");
        let mut later_at = Vec::new();
        for task in later {
            later_at.push(task.await.expect("joined"));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2, "one round, then one shared");
        assert!(later_at.iter().all(|at| at.is_some() && *at > first));
        assert!(later_at.windows(2).all(|w| w[0] == w[1]), "the same round");
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
