//! The live re-check before a DELETE: everything the decision rests on read first, within
//! [`LIVE_BOUND`] (from a cache proven fresh by `daemon::proof`, or live), then the claim
//! decided again for the same cause and no other. The claim itself is read too when a DELETE
//! may have removed it unseen (`in_flight`).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::info;

use crate::cluster::cache::Scope;
use crate::cluster::in_flight;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::watches::PROVEN;
use crate::config::Config;
use crate::daemon::proof::{self, PROOF_BOUND, Proofs, Recheck, Recorded, Way};
use crate::daemon::scheduler::{Failure, Outcome};
use crate::decide::facts::ClaimFacts;
use crate::decide::linking::{self, Found};
use crate::decide::policy::{self, Reason, Verdict};
use crate::decide::quota::{Candidate, LiveQuotas, Present, QuotaEntry};
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::Kind;

use super::in_flight::Unseen;
use super::{Cause, Controller};

/// The oldest a live re-check may be when its DELETE goes out, counted from its first read: a
/// re-check that took longer, or a DELETE held up longer (by the Lease write before it), is
/// not live any more, and the claim is decided again from the start. It bounds how long a pod
/// or a run started after the re-check can go unseen by the delete.
pub const LIVE_BOUND: Duration = Duration::from_secs(5);

/// The cached jobs, runs and pods in a claim's namespace from which its re-check proves the cache
/// fresh (`daemon::proof`) instead of listing the namespace: below it the LISTs are small and
/// answer at once, where a round costs a second or two when a kind is quiet.
pub(super) const PROVE_FROM: usize = 100;

/// How often a proof waiting for the watches to deliver what a replay found looks again.
const CATCH_UP_POLL: Duration = Duration::from_millis(20);

/// What the live re-check confirmed, and until when the DELETE may rest on it.
#[derive(Debug, Clone)]
pub(super) struct Confirmed {
    pub(super) reason: Reason,
    /// The claim's volume, as read (only with `deletion.read_volumes`).
    pub(super) volume: Option<VolumeFacts>,
    /// The verdict's due instant, for the reclaim lag.
    pub(super) due_at: Option<DateTime<Utc>>,
    pub(super) live_until: Instant,
}

/// What a live re-check read, within its bound.
struct Read<L> {
    /// The claim's UID and whether it is being deleted, read when a DELETE may have removed
    /// it unseen.
    state: Option<Found<(String, bool)>>,
    /// Whatever may protect the claim.
    live: Recheck<L>,
    /// When the first of these reads was sent (the proving round's, for a proven cache): the
    /// re-check's bound counts from it.
    read_at: Instant,
    /// The namespace's annotations, when its settings count (`None` also when unreadable).
    notes: Option<BTreeMap<String, String>>,
    /// The claim's volume (only with `deletion.read_volumes`).
    volume: Option<VolumeFacts>,
    /// The namespace's quotas, for a pressure delete.
    quotas: Option<Found<Vec<QuotaEntry>>>,
}

/// What the live re-check reads by.
pub(super) struct Rechecks {
    /// The rounds that prove the cache fresh for the live re-check.
    pub(super) proofs: Proofs,
    /// Whether the watches cover one namespace each (`selector.namespaces`), not the cluster.
    per_namespace: bool,
    /// Whether a bound claim's volume is read before its delete (`deletion.read_volumes`).
    read_volumes: bool,
}

impl Rechecks {
    pub(super) fn new(config: &Config) -> Self {
        Rechecks {
            proofs: Proofs::new(config.deletion.proof_round_interval),
            per_namespace: !config.selector.namespaces.is_empty(),
            read_volumes: config.deletion.read_volumes,
        }
    }
}

impl Rechecks {
    /// How a re-check of `scope` asking now reads (`proof::way`); the ask is counted.
    pub(super) fn way(&self, scope: &Scope) -> Way {
        self.proofs.way(scope)
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// The live re-check: the claim is read live and decided again through the same linking
    /// and policy, and must be deleted for the same cause, by a re-check no older than
    /// [`LIVE_BOUND`]. The outcome when it must not: a claim found gone is done.
    pub(super) async fn confirm(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
    ) -> Result<Confirmed, Outcome> {
        let key = &claim.key;
        let unseen = self.deletes.in_flight.removal_unseen(claim);
        // Whatever may protect the claim is read from a cache proven fresh, or live: a watch
        // can go silent without an error (a wedged API server, a dead connection) and its cache
        // would miss a pod or a run started since (tests/cluster/faults.rs,
        // silently_stalled_watch_does_not_hide_a_new_user). A small namespace is listed
        // (`PROVE_FROM`), and so is a claim no other re-check would share a round with
        // (`proof::way`).
        let rechecks = &self.deletes.rechecks;
        let scope = rechecks.per_namespace.then(|| key.namespace.to_string());
        let large = self.cache.read().namespace_size(&key.namespace) >= PROVE_FROM;
        let proven = if large && rechecks.way(&scope) == Way::Round {
            self.prove_fresh(&scope).await
        } else {
            None
        };
        // Everything the decision rests on is read first, within the bound; then it is decided.
        let read = self.read_for_recheck(claim, cause, proven, unseen);
        let Ok(read) = tokio::time::timeout(LIVE_BOUND, read).await else {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Outcome::Retry(Failure::LiveTooSlow));
        };
        if let Some(state) = read.state {
            let Some(gone) = in_flight::gone(&state, &claim.uid) else {
                return Err(Outcome::Retry(Failure::LiveUnread));
            };
            if unseen == Some(Unseen::Answered) {
                self.deletes.in_flight.seen_gone(key);
            }
            if gone {
                info!(claim = %key, "the claim is gone or being deleted (an earlier delete was carried out); none is sent again");
                return Err(Outcome::Done);
            }
        }
        let live_until = read.read_at + LIVE_BOUND;
        let index = self.cache.read();
        // A pressure delete is planned over the namespace's claims as cached now.
        let cached: Vec<&ClaimFacts> = match (&read.quotas, self.deletes.pressure.waters()) {
            (Some(Found::Yes(_)), Some(_)) => index.claims_in(&key.namespace).collect(),
            _ => Vec::new(),
        };
        self.metrics.recheck(proven.is_some());
        let policy = self
            .cache
            .policies
            .for_namespace(read.notes.as_ref())
            .policy;
        let facts = linking::facts(claim, &read.live);
        let now = self.clock.now();
        let decision = policy::decide(&facts, &policy, now);
        // A pressure delete's plan: over the quotas as listed and the claims as cached, each
        // decided under the same settings as this one.
        let live_quotas = match (read.quotas, self.deletes.pressure.waters()) {
            (Some(Found::Yes(quotas)), Some(waters)) => Some(LiveQuotas {
                quotas,
                present: cached.iter().copied().map(Present::of).collect(),
                cached: Candidate::all_of(cached, &*index, &policy, now),
                waters,
                now: self.clock.server().0,
            }),
            _ => None,
        };
        // Released before the plan is made: the feed's writes wait on it.
        drop(index);
        let confirmed = match (cause, decision.verdict) {
            (Cause::Due(cached_due_at), Verdict::Delete { reason, due_at }) => {
                Some((reason, due_at.or(cached_due_at)))
            }
            (Cause::Due(_), _) => None,
            // Taken early only if still within its TTL and the plan over the live quotas takes
            // it: never anything wider.
            (Cause::Pressure, verdict) => live_quotas
                .is_some_and(|live| self.deletes.pressure.takes_live(&live, &facts, verdict))
                .then_some((Reason::QuotaPressure, None)),
        };
        let Some((reason, due_at)) = confirmed else {
            let unread = matches!(
                decision.verdict.reason(),
                Reason::OwnerUnknown | Reason::UsersUnknown | Reason::NamespaceUnknown
            );
            info!(
                claim = %key,
                reason = %decision.verdict.reason(),
                detail = decision.detail.as_deref().unwrap_or(""),
                "live re-check kept the claim"
            );
            return Err(Outcome::Retry(if unread {
                Failure::LiveUnread
            } else {
                Failure::LiveDisagrees
            }));
        };
        if Instant::now() >= live_until {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Outcome::Retry(Failure::LiveTooSlow));
        }
        Ok(Confirmed {
            reason,
            volume: read.volume,
            due_at,
            live_until,
        })
    }

    /// Everything a live re-check decides from: the cache proven fresh (when `proven` says
    /// when its round read) or the live reads, the claim itself when a DELETE may have removed
    /// it unseen, the namespace's settings, a pressure delete's quotas, and the volume.
    async fn read_for_recheck(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
        proven: Option<Instant>,
        unseen: Option<Unseen>,
    ) -> Read<C::Live> {
        let key = &claim.key;
        let (live, read_at) = match proven {
            Some(read_at) => {
                let recorded = Recorded::of(claim, &*self.cache.read());
                (Recheck::Proven(Box::new(recorded)), read_at)
            }
            None => {
                let (live, read_at) = self.cluster.read_live(claim).await;
                (Recheck::Listed(live), read_at)
            }
        };
        let state = match unseen {
            Some(_) => Some(self.cluster.claim_state(key).await),
            None => None,
        };
        let notes = match self.cache.policies.namespaces {
            None => None,
            Some(_) => self.cluster.namespace_annotations(&key.namespace).await,
        };
        let quotas = match cause {
            Cause::Pressure => Some(self.cluster.quotas(&key.namespace).await),
            Cause::Due(_) => None,
        };
        let volume = match claim
            .volume_name
            .as_deref()
            .filter(|_| self.deletes.rechecks.read_volumes)
        {
            Some(name) => self.cluster.volume(name).await,
            None => None,
        };
        Read {
            state,
            live,
            read_at,
            notes,
            volume,
            quotas,
        }
    }

    /// When a round proving the cache fresh for the watches of `scope` sent its first read,
    /// a round started after this call (`daemon::proof`); `None` when it was not proven and
    /// the re-check must list.
    async fn prove_fresh(&self, scope: &Scope) -> Option<Instant> {
        (self.deletes.rechecks.proofs)
            .prove(scope, || async {
                let read_at = Instant::now();
                let kinds = PROVEN.map(|kind| self.prove_kind(kind, scope));
                let proven = tokio::time::timeout(PROOF_BOUND, futures::future::join_all(kinds));
                let proven = proven.await.is_ok_and(|kinds| kinds.into_iter().all(|k| k));
                proven.then_some(read_at)
            })
            .await
    }

    /// Whether the cache holds every change of `kind` in `scope` up to its current
    /// resourceVersion, as `daemon::proof` proves it.
    async fn prove_kind(&self, kind: Kind, scope: &Scope) -> bool {
        let revision = match self.cluster.revision(kind, scope).await {
            Found::Yes(revision) => revision,
            // Its group serves it at no version (discovery, asked now): no such object exists;
            // one the cache still holds only keeps claims.
            Found::No => return true,
            Found::Unknown(_) => return false,
        };
        let Some(from) = self.cache.read().delivered(kind, scope) else {
            return false;
        };
        if from >= revision {
            return true;
        }
        let span = (from, revision);
        let replayed = async {
            let changes = self.cluster.changes(kind, scope, span).await?;
            // The watch delivers the same changes, moments later; the caller's bound ends the
            // wait.
            loop {
                let reflected = {
                    let index = self.cache.read();
                    let delivered = index.delivered(kind, scope);
                    proof::reflects(delivered, &changes, |key| index.holds(kind, key))
                };
                if reflected {
                    return Some(());
                }
                tokio::time::sleep(CATCH_UP_POLL).await;
            }
        };
        // The replay's bookmark comes a second or two later; a kind whose own watch delivers
        // past the revision meanwhile (it changes, or its watch gets a bookmark) needs none.
        let delivered_past = async {
            while self.cache.read().delivered(kind, scope) < Some(revision) {
                tokio::time::sleep(CATCH_UP_POLL).await;
            }
        };
        tokio::select! {
            replayed = replayed => replayed.is_some(),
            () = delivered_past => true,
        }
    }
}
