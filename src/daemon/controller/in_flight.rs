//! Drives the registry of the DELETEs that may still land (`cluster::in_flight`): after one
//! answered with success, its claim is read itself in the live re-check before anything is
//! sent again; one without a definite answer, or named on the Lease when this replica won it,
//! is revoked before anything else is decided for it (RELIABILITY.md, "A late DELETE").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{info, warn};

use chrono::{DateTime, Utc};

use crate::cluster::in_flight::{self, InFlight, Revocation, Sent};
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::Answer;
use crate::daemon::cap_ledger::LedgerError;
use crate::daemon::limiter::Reservation;
use crate::daemon::scheduler::{Failure, Outcome};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::observe::metrics::{DeleteResult, Revoked};

use super::Controller;
use super::slots::Slots;

/// The registry, each DELETE holding its slot of the cap while it may land.
pub type DeletesInFlight = in_flight::Shared<Reservation>;

/// Why a claim's live re-check reads the claim itself ([`Controller::removal_unseen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unseen {
    /// This replica's DELETE of it was answered with success.
    Answered,
    /// The claims' watch has failed: a DELETE by the replica that led before may be unseen.
    WatchBroken,
}

/// What is known of the DELETEs already sent.
pub(super) struct InFlightDeletes {
    /// Shared with the elector, which writes on the Lease what it says may still land.
    registry: Arc<DeletesInFlight>,
    /// Whether the claims' watch has failed and delivered nothing since: its cache may still
    /// show a claim that is gone (deleted by the replica that led before, while this one's
    /// watch was down), so every claim is read live before its DELETE until it delivers again.
    claims_watch_broken: AtomicBool,
}

impl InFlightDeletes {
    pub(super) fn new(registry: Arc<DeletesInFlight>) -> Self {
        Self {
            registry,
            claims_watch_broken: AtomicBool::new(false),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, in_flight::Registry<Reservation>> {
        (self.registry).lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registry as the elector drives it (winning the Lease), for the tests.
    #[cfg(test)]
    pub(super) fn lease_side(&self) -> std::sync::MutexGuard<'_, in_flight::Registry<Reservation>> {
        self.registry()
    }

    /// Why a DELETE may have removed the claim without the cache showing it, so that its live
    /// re-check reads the claim itself before anything is sent: one was answered with success
    /// and the watch has not shown the claim gone, or the claims' watch is broken. `None` when
    /// the cache can be trusted on it.
    pub(super) fn removal_unseen(&self, claim: &ClaimFacts) -> Option<Unseen> {
        if self.registry().carried(&claim.key, &claim.uid) {
            return Some(Unseen::Answered);
        }
        let broken = self.claims_watch_broken.load(Ordering::Relaxed);
        broken.then_some(Unseen::WatchBroken)
    }

    /// Whether the claims' watch has failed and delivered nothing since.
    pub(super) fn claims_watch_broken(&self, broken: bool) {
        self.claims_watch_broken.store(broken, Ordering::Relaxed);
    }

    /// The DELETE of `claim`, sent on `reservation`, ended its request answered `answer`
    /// (`None`: not sent; `at`: the latest the API server's clock reads now). Its slot of the cap: counted from `at` when it
    /// was carried out (received by then), the DELETE's own while it may land, and freed when
    /// it can never land; the registry learns how a real one ended (a dry run's never could
    /// land).
    pub(super) fn sent(
        &self,
        slots: &Slots,
        claim: &ClaimFacts,
        answer: Option<Answer>,
        reservation: Reservation,
        at: DateTime<Utc>,
    ) {
        // The cap counts would-deletes as deletes: a dry run shows what the cap lets through.
        let result = answer.map(|answer| answer.result());
        let real = !matches!(answer, Some(Answer::Dry(_)));
        let mut registry = self.registry();
        let slot = match result {
            Some(DeleteResult::Deleted) => {
                slots.count_from(reservation, at);
                None
            }
            // It may have been carried out: it stays counted until its revocation says (in
            // the current count, should the term have changed while it was on its way).
            Some(DeleteResult::Unanswered) => slots.keep(reservation, at),
            _ => {
                slots.release(reservation);
                None
            }
        };
        let ended = match result {
            Some(DeleteResult::Deleted) => Sent::Carried,
            Some(DeleteResult::Unanswered) => Sent::Unanswered,
            _ => Sent::Settled,
        };
        if real {
            registry.sent(&InFlight::of(claim), ended, slot);
        }
    }

    /// The claim is seen gone (or re-created): nothing of it can land any more.
    pub(super) fn seen_gone(&self, key: &ObjectKey) {
        self.registry().seen_gone(key);
    }

    /// The DELETE of this claim owed a revocation, if any.
    pub(super) fn owed(&self, key: &ObjectKey) -> Option<InFlight> {
        self.registry().owed(key)
    }

    /// The claims owed a revocation.
    pub(super) fn owed_keys(&self) -> Vec<ObjectKey> {
        self.registry().owed_keys()
    }

    /// The revocation of `delete` ended as `revocation` (`at`: the latest the API server's
    /// clock reads now). Revoked, it can never land: its slot of the cap goes to another claim.
    /// Landed, its slot stays counted as a deletion. Neither known, it may land from now on:
    /// its slot is counted from `at`, so that the cap's window holds it while it is owed (else,
    /// a window later, the cap would let as many more DELETEs go beside every one still owed).
    pub(super) fn revoked(
        &self,
        slots: &Slots,
        delete: &InFlight,
        revocation: Revocation,
        at: DateTime<Utc>,
    ) {
        let mut registry = self.registry();
        match revocation {
            Revocation::Refused | Revocation::Unanswered => {
                registry.unrevoked(delete, |slot| slots.count_from(slot, at));
            }
            Revocation::Revoked | Revocation::Landed => {
                if let Some(slot) = registry.revoked(delete, revocation) {
                    slots.release(slot);
                }
            }
        }
    }

    /// A term began: the cap counts from the ledger found on the Lease just won (see
    /// `Limiter::recover`), and every DELETE owed a revocation (found on the Lease, or this
    /// replica's own from an earlier term) holds a slot in it from `at` until its revocation
    /// proves it dead. A slot of an earlier term is not in the ledger recovered, so without
    /// this it would stop counting once its last record's window passed. Its record in the
    /// ledger found, if any, counts too until its window passes: an owed DELETE may count
    /// twice for a window after a recovery, which fails closed.
    pub(super) fn recovered(
        &self,
        slots: &Slots,
        found: Option<&str>,
        (earliest, at): (DateTime<Utc>, DateTime<Utc>),
        reach: std::time::Duration,
    ) -> Result<(), LedgerError> {
        let mut registry = self.registry();
        let recovered = slots.recover(found, earliest, reach);
        registry.recovered(|_| slots.hold(at));
        recovered
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// On winning the lease: every claim owed a revocation (the DELETEs the Lease named,
    /// sent by whoever led before, maybe still held somewhere on its way) is reconciled, which
    /// revokes it before anything else is decided for the claim. The elector registered them
    /// before the lease was won, so before the cap opens; revoked in one place only, the
    /// claim's reconcile, so each is sent once.
    pub(super) fn reconcile_owed(&self) {
        let owed = self.deletes.in_flight.owed_keys();
        if owed.is_empty() {
            return;
        }
        info!(
            count = owed.len(),
            "the lease names deletes in flight: each is revoked before its claim is decided"
        );
        self.wake(owed);
    }

    /// Revokes this claim's DELETE that got no definite answer, before anything else is
    /// decided for it: until the revocation is answered, the claim is kept and nothing else
    /// is sent for it. `None` when no such DELETE is outstanding.
    pub(super) async fn resolve_outstanding(&self, key: &ObjectKey) -> Option<Outcome> {
        let in_flight = &self.deletes.in_flight;
        let delete = in_flight.owed(key)?;
        if !self.is_leader() {
            // The Lease names it: whoever leads revokes it.
            return Some(Outcome::Done);
        }
        let revocation = match self.cluster.revoke(&delete).await {
            // Refused: the claim may have been re-created, or a guard or RBAC refuses the
            // patch. Only a live read tells whether the DELETE can still land.
            Revocation::Refused => {
                match in_flight::gone(&self.cluster.claim_state(key).await, &delete.uid) {
                    Some(false) => Revocation::Refused,
                    None => Revocation::Unanswered,
                    Some(true) => Revocation::Landed,
                }
            }
            other => other,
        };
        let slots = &self.deletes.slots;
        in_flight.revoked(slots, &delete, revocation, self.clock.server().1);
        match revocation {
            Revocation::Revoked => {
                self.metrics.revocation(Revoked::Revoked);
                info!(claim = %key, resource_version = %delete.resource_version, "revoked a delete without an answer: it fails its precondition whenever it arrives; deciding again after the claim's backoff");
            }
            Revocation::Landed => {
                // Until the watch shows it gone, a live read comes before any other DELETE.
                self.metrics.delete_late();
                warn!(claim = %key, uid = %delete.uid, "a delete without an answer was carried out after all (it, or another, reached the API server); its volume, if kept by a Retain policy, is not marked and workspace-gc never deletes it");
            }
            Revocation::Refused | Revocation::Unanswered => {
                self.metrics.revocation(Revoked::NotRevoked);
                warn!(claim = %key, "a delete without an answer is not revoked yet; the claim is kept and nothing else is sent for it");
                return Some(Outcome::Retry(Failure::Unrevoked));
            }
        }
        // Each names its next step itself, never the watch event of its own write (a watch that
        // lags, restarts or moved to another API server may bring it late or never). Revoked:
        // the DELETE failed to conclude, so the claim is decided again after its backoff, which
        // the revocation does not reset. Landed: decided again at once; its live re-check reads
        // the claim before anything is sent.
        Some(match revocation {
            Revocation::Revoked => Outcome::Retry(Failure::Unanswered),
            _ => Outcome::At(tokio::time::Instant::now()),
        })
    }
}
