//! The DELETEs already sent. After one answered with success, its claim is read itself in the
//! live re-check before anything is sent again; one without a definite answer is revoked before
//! anything else is decided for it (RELIABILITY.md, "A late DELETE").

use std::collections::HashMap;
use std::sync::Mutex;

use tracing::{info, warn};

use crate::cluster::leader::InFlight;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::Revocation;
use crate::daemon::limiter::Reservation;
use crate::daemon::scheduler::{Failure, Outcome};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::Found;
use crate::observe::metrics::Revoked;

use super::Controller;

/// A claim DELETE without a definite answer, and its slot of the cap while it may land: a
/// revocation that proves it never can frees the slot. `None` for one the Lease named when
/// this replica won it (the ledger recovered from the Lease counts it).
#[derive(Debug, Clone)]
pub(super) struct Outstanding {
    pub(super) delete: InFlight,
    pub(super) reservation: Option<Reservation>,
}

/// Why a claim's live re-check reads the claim itself ([`Controller::removal_unseen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unseen {
    /// This replica's DELETE of it was answered with success.
    Answered,
    /// The claims' watch has failed: a DELETE by the replica that led before may be unseen.
    WatchBroken,
}

/// What is known of the DELETEs already sent.
#[derive(Default)]
pub(super) struct InFlightDeletes {
    /// Claims (by UID) whose DELETE was answered with success: until the watch shows them
    /// gone, the claim is read live before anything is sent again, since a cache the watch
    /// has not caught up on still shows it as it was decided.
    already_sent: Mutex<HashMap<ObjectKey, String>>,
    /// Whether the claims' watch has failed and delivered nothing since: its cache may still
    /// show a claim that is gone (deleted by the replica that led before, while this one's
    /// watch was down), so every claim is read live before its DELETE until it delivers again.
    claims_watch_broken: std::sync::atomic::AtomicBool,
    /// Claims whose DELETE got no definite answer: it may still reach the API server, so the
    /// claim is revoked (changed) before anything else is decided for it.
    outstanding: Mutex<HashMap<ObjectKey, Outstanding>>,
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// Why a DELETE may have removed the claim without the cache showing it, so that its live
    /// re-check reads the claim itself before anything is sent: one was answered with success
    /// and the watch has not shown the claim gone, or the claims' watch is broken. `None` when
    /// the cache can be trusted on it.
    pub(super) fn removal_unseen(&self, claim: &ClaimFacts) -> Option<Unseen> {
        if self.lock_already_sent().get(&claim.key) == Some(&claim.uid) {
            return Some(Unseen::Answered);
        }
        let broken =
            (self.in_flight.claims_watch_broken).load(std::sync::atomic::Ordering::Relaxed);
        broken.then_some(Unseen::WatchBroken)
    }

    pub(super) fn claims_watch_broken(&self, broken: bool) {
        (self.in_flight.claims_watch_broken).store(broken, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn lock_already_sent(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, String>> {
        self.in_flight
            .already_sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_outstanding(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Outstanding>> {
        self.in_flight
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// On winning the lease: every DELETE the Lease names in flight (sent by whoever led
    /// before, maybe still held somewhere on its way) is registered, so that it is revoked at
    /// its claim's next reconcile before anything else is decided for the claim. Registered
    /// before the cap opens, so no reconcile is admitted past one; revoked in one place only,
    /// the claim's reconcile, so each is sent once.
    pub(super) fn register_found(&self) {
        let found = self.cluster.found_in_flight();
        if found.is_empty() {
            return;
        }
        info!(
            count = found.len(),
            "the lease names deletes in flight: each is revoked before its claim is decided"
        );
        let keys: Vec<ObjectKey> = {
            let mut outstanding = self.lock_outstanding();
            (found.into_iter())
                .map(|delete| {
                    let key = delete.key();
                    let found = Outstanding {
                        delete,
                        reservation: None,
                    };
                    outstanding.insert(key.clone(), found);
                    key
                })
                .collect()
        };
        for key in keys {
            self.schedule.now(key);
        }
    }

    /// Revokes this claim's DELETE that got no definite answer, before anything else is
    /// decided for it: until the revocation is answered, the claim is kept and nothing else
    /// is sent for it. `None` when no such DELETE is outstanding.
    pub(super) async fn resolve_outstanding(&self, key: &ObjectKey) -> Option<Outcome> {
        let Outstanding {
            delete,
            reservation,
        } = self.lock_outstanding().get(key).cloned()?;
        if !self.is_leader() {
            // The Lease names it: whoever leads revokes it.
            return Some(Outcome::Done);
        }
        let revocation = match self.cluster.revoke(&delete).await {
            // Refused: the claim may have been re-created, or a guard or RBAC refuses the
            // patch. Only a live read tells whether the DELETE can still land.
            Revocation::Refused => match self.cluster.claim_state(key).await {
                Found::Yes((uid, false)) if uid == delete.uid => Revocation::Refused,
                Found::Unknown(_) => Revocation::Unanswered,
                _ => {
                    self.cluster.settle(&delete);
                    Revocation::Landed
                }
            },
            other => other,
        };
        match revocation {
            Revocation::Revoked => {
                // It can never land: its slot of the cap goes to another claim.
                if let Some(reservation) = reservation {
                    self.release(reservation);
                }
                self.metrics.revocation(Revoked::Revoked);
                info!(claim = %key, resource_version = %delete.resource_version, "revoked a delete without an answer: it fails its precondition whenever it arrives; deciding again after the claim's backoff");
            }
            Revocation::Landed => {
                // Until the watch shows it gone, a live read comes before any other DELETE.
                self.lock_already_sent()
                    .insert(key.clone(), delete.uid.clone());
                self.metrics.delete_late();
                warn!(claim = %key, uid = %delete.uid, "a delete without an answer was carried out after all (it, or another, reached the API server); its volume, if kept by a Retain policy, is not marked and workspace-gc never deletes it");
            }
            Revocation::Refused | Revocation::Unanswered => {
                self.metrics.revocation(Revoked::NotRevoked);
                warn!(claim = %key, "a delete without an answer is not revoked yet; the claim is kept and nothing else is sent for it");
                return Some(Outcome::Retry(Failure::Unanswered));
            }
        }
        let mut outstanding = self.lock_outstanding();
        if outstanding
            .get(key)
            .is_some_and(|o| o.delete.uid == delete.uid)
        {
            outstanding.remove(key);
        }
        // Each names its next step itself, never the watch event of its own write (a revocation
        // that writes the value already there changes nothing and brings no event). Revoked:
        // the DELETE failed to conclude, so the claim is decided again after its backoff, which
        // the revocation does not reset. Landed: decided again at once; its live re-check reads
        // the claim before anything is sent.
        Some(match revocation {
            Revocation::Revoked => Outcome::Retry(Failure::Unanswered),
            _ => Outcome::At(tokio::time::Instant::now()),
        })
    }
}
