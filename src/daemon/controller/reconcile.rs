//! One claim's reconcile: decide from the cache with the pure policy (and, under quota pressure,
//! the pure plan), keep or hand it to the delete pipeline, and return when to look again.

use std::sync::Arc;

use tracing::{debug, warn};

use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::Notice;
use crate::daemon::scheduler::Outcome;
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::{self};
use crate::decide::policy::{self, Decision, Reason, Verdict};

use super::notices::Scheduled;
use super::{Cause, Controller};

impl<C: Cluster, K: Clock> Controller<C, K> {
    pub(super) async fn reconcile(self: Arc<Self>, key: ObjectKey) -> Outcome {
        let started = std::time::Instant::now();
        let outcome = self.decide_and_act(&key).await;
        self.metrics.reconciled(started.elapsed().as_secs_f64());
        outcome
    }

    async fn decide_and_act(&self, key: &ObjectKey) -> Outcome {
        if let Some(outcome) = self.resolve_outstanding(key).await {
            return outcome;
        }
        let Some((claim, decision, scheduled)) = self.decide_cached(key) else {
            self.metrics.track(key, None);
            self.deletes.slots.leave(key);
            self.deletes.in_flight.seen_gone(key);
            self.notices.forget_claim(key);
            return Outcome::Done;
        };
        let bytes = claim.requested_bytes.unwrap_or(0);
        self.metrics.track(key, Some((&decision.verdict, bytes)));
        let taken = self.apply_quota_plan(key).await;
        let reason = decision.verdict.reason();
        let deleting = taken || matches!(decision.verdict, Verdict::Delete { .. });
        if !deleting || !self.is_leader() {
            // No longer waiting for a slot: the claims behind it move up.
            self.deletes.slots.leave(key);
        }
        match decision.verdict {
            Verdict::Keep { recheck_at, .. } => {
                debug!(claim = %key, %reason, ?recheck_at, "keep");
                if reason == Reason::InvalidAnnotation {
                    let detail = decision.detail.unwrap_or_default();
                    warn!(claim = %key, %detail, "keeping a claim with an invalid annotation");
                    self.cluster
                        .notify(&claim, Notice::InvalidAnnotation(detail))
                        .await;
                } else if reason == Reason::NotABuildWorkspace {
                    let detail = decision.detail.unwrap_or_default();
                    self.tell_not_a_build_workspace(&claim, detail).await;
                }
                let wake = self.wake_at(recheck_at, &scheduled);
                self.announce_deletion(&claim, scheduled).await;
                let recheck =
                    wake.map_or(Outcome::Done, |at| Outcome::At(self.clock.instant_at(at)));
                if taken {
                    self.act(claim, Cause::Pressure).await.and(recheck)
                } else {
                    recheck
                }
            }
            Verdict::Protected { .. } => {
                debug!(claim = %key, %reason, "protected");
                Outcome::Done
            }
            Verdict::Delete { due_at, .. } => {
                if self.is_leader() {
                    self.act(claim, Cause::Due(due_at)).await
                } else {
                    // Winning the lease re-evaluates every claim.
                    debug!(claim = %key, %reason, "due; the leader deletes");
                    Outcome::Done
                }
            }
        }
    }

    /// Decides from the cache, with when a kept claim becomes due (only with notices on);
    /// `None` once the claim is gone.
    fn decide_cached(&self, key: &ObjectKey) -> Option<(ClaimFacts, Decision, Scheduled)> {
        let index = self.cache.read();
        let claim = index.claim(key)?;
        let facts = linking::facts(claim, &*index);
        let policy = self.cache.policy_in(&index, &key.namespace);
        let now = self.clock.now();
        let decision = policy::decide(&facts, &policy, now);
        let scheduled = self
            .notices
            .lead()
            .and_then(|lead| Some((policy::scheduled(&facts, &policy, now)?, lead)));
        Some((facts.claim, decision, scheduled))
    }

    /// Deletes a claim for `cause`, in four stages, each taking what the one before returns:
    /// admit (pace and cap), confirm (the live re-check), send (the one DELETE), report.
    pub(super) async fn act(&self, claim: ClaimFacts, cause: Cause) -> Outcome {
        let reservation = match self.admit(&claim, cause).await {
            Ok(reservation) => reservation,
            Err(outcome) => return outcome,
        };
        tokio::time::sleep_until(reservation.slot).await;
        let confirmed = match self.confirm(&claim, cause).await {
            Ok(confirmed) => confirmed,
            Err(outcome) => {
                self.deletes.slots.release(reservation);
                return outcome;
            }
        };
        let sent = self.send(&claim, cause, reservation, &confirmed).await;
        self.report(&claim, confirmed, sent).await
    }
}
