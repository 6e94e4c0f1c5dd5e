//! The live re-check before a DELETE: the claim decided again from a cache proven fresh
//! (`daemon::proof`), or from live reads, within [`LIVE_BOUND`], for the same cause and no
//! other.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::info;

use crate::cluster::cache::Scope;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::watches::PROVEN;
use crate::config::Config;
use crate::daemon::proof::{self, PROOF_BOUND, Proofs, Recheck, Recorded};
use crate::daemon::scheduler::Failure;
use crate::decide::facts::ClaimFacts;
use crate::decide::linking::{self, Found};
use crate::decide::policy::{self, Reason, Verdict};
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::Kind;

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

/// What the live re-check reads by.
pub(super) struct Rechecks {
    /// The rounds that prove the cache fresh for the live re-check.
    proofs: Proofs,
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

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// The live re-check: the claim is read live and decided again through the same linking
    /// and policy, and must be deleted for the same cause, by a re-check no older than
    /// [`LIVE_BOUND`].
    pub(super) async fn confirm(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
    ) -> Result<Confirmed, Failure> {
        let key = &claim.key;
        // Whatever may protect the claim is read from a cache proven fresh, or live: a watch
        // can go silent without an error (a wedged API server, a dead connection) and its cache
        // would miss a pod or a run started since (tests/cluster/faults.rs,
        // silently_stalled_watch_does_not_hide_a_new_user). A small namespace is listed
        // (`PROVE_FROM`).
        let large = self.read_index().namespace_size(&key.namespace) >= PROVE_FROM;
        let proven = if large {
            self.prove_fresh(&key.namespace).await
        } else {
            None
        };
        let read = async {
            let (live, read_at) = match proven {
                Some(read_at) => {
                    let recorded = Recorded::of(claim, &*self.read_index());
                    (Recheck::Proven(Box::new(recorded)), read_at)
                }
                None => {
                    let (live, read_at) = self.cluster.read_live(claim).await;
                    (Recheck::Listed(live), read_at)
                }
            };
            self.metrics.recheck(proven.is_some());
            // The namespace's settings too, when they count.
            let policy = match self.policies.namespaces {
                None => self.policies.cluster.clone(),
                Some(_) => {
                    let namespace = &key.namespace;
                    let notes = self.cluster.namespace_annotations(namespace);
                    self.policies.for_namespace(notes.await.as_ref()).policy
                }
            };
            // A pressure delete is planned again over the quotas as listed now.
            let quotas = match cause {
                Cause::Pressure => Some(self.cluster.quotas(&key.namespace).await),
                Cause::Due(_) => None,
            };
            let volume = match claim
                .volume_name
                .as_deref()
                .filter(|_| self.rechecks.read_volumes)
            {
                Some(name) => self.cluster.volume(name).await,
                None => None,
            };
            (live, read_at, policy, volume, quotas)
        };
        let Ok((live, read_at, policy, volume, quotas)) =
            tokio::time::timeout(LIVE_BOUND, read).await
        else {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Failure::LiveTooSlow);
        };
        let live_until = read_at + LIVE_BOUND;
        let quotas = quotas.and_then(|listed| self.live_quotas(&key.namespace, listed));
        let facts = linking::facts(claim, &live);
        let decision = policy::decide(&facts, &policy, self.clock.now());
        let confirmed = match (cause, decision.verdict) {
            (Cause::Due(cached_due_at), Verdict::Delete { reason, due_at }) => {
                Some((reason, due_at.or(cached_due_at)))
            }
            (Cause::Due(_), _) => None,
            // Taken early only if still within its TTL and the plan over the live quotas takes
            // it: never anything wider.
            (Cause::Pressure, verdict) => quotas
                .is_some_and(|live| self.rounds().takes_live(&live, &facts, verdict))
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
            return Err(if unread {
                Failure::LiveUnread
            } else {
                Failure::LiveDisagrees
            });
        };
        if Instant::now() >= live_until {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Failure::LiveTooSlow);
        }
        Ok(Confirmed {
            reason,
            volume,
            due_at,
            live_until,
        })
    }

    /// When a round proving the cache fresh for `namespace`'s watches sent its first read,
    /// a round started after this call (`daemon::proof`); `None` when it was not proven and
    /// the re-check must list.
    async fn prove_fresh(&self, namespace: &str) -> Option<Instant> {
        let scope = self.rechecks.per_namespace.then(|| namespace.to_owned());
        self.rechecks
            .proofs
            .prove(&scope, || async {
                let read_at = Instant::now();
                let kinds = PROVEN.map(|kind| self.prove_kind(kind, &scope));
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
        let Some(from) = self.read_index().delivered(kind, scope) else {
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
                    let index = self.read_index();
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
            while self.read_index().delivered(kind, scope) < Some(revision) {
                tokio::time::sleep(CATCH_UP_POLL).await;
            }
        };
        tokio::select! {
            replayed = replayed => replayed.is_some(),
            () = delivered_past => true,
        }
    }
}
