//! The delete pipeline after the decision: admit (a slot: the pace and the blast-radius cap,
//! with its line), confirm (the live re-check, in `recheck`), send (the Lease's ledger, then the
//! one DELETE, through the writer), mark a `Retain` volume, and report. Its concerns' state is
//! theirs (`slots`, `recheck`, `in_flight`, `pressure`); this file drives them.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cluster::leader::FenceError;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::{Answer, Mode, NotSent, Notice};
use crate::config::Config;
use crate::daemon::limiter::{Admission, Reservation};
use crate::daemon::scheduler::{Failure, Outcome};
use crate::decide::facts::ClaimFacts;
use crate::decide::volumes;
use crate::observe::metrics::{DeleteResult, Mark};

use super::in_flight::{DeletesInFlight, InFlightDeletes};
use super::pressure::Pressure;
use super::recheck::{Confirmed, Rechecks};
use super::slots::{Admitted, Slots};
use super::{Cause, Controller};

/// The delete pipeline's concerns, each owning its state: the slots (pace, cap and line), the
/// live re-check, the DELETEs that may still land, and quota pressure's rounds; and whether a
/// deleted claim's `Retain` volume is marked.
pub(super) struct Deletes {
    pub(super) slots: Slots,
    pub(super) rechecks: Rechecks,
    pub(super) in_flight: InFlightDeletes,
    pub(super) pressure: Pressure,
    /// Whether a `Retain` volume is marked once its claim's delete succeeded, so that it is
    /// deleted once Released (`deletion.released_volume_ttl`).
    mark_volumes: bool,
}

impl Deletes {
    pub(super) fn new(config: &Config, registry: Arc<DeletesInFlight>) -> Self {
        Deletes {
            slots: Slots::new(config),
            rechecks: Rechecks::new(config),
            in_flight: InFlightDeletes::new(registry),
            pressure: Pressure::new(config),
            mark_volumes: config.deletion.released_volume_ttl.is_some(),
        }
    }
}

/// What the DELETE stage did: its result, or why nothing was sent.
pub(super) type SendResult = Result<Answer, NotSent>;

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// A deletion slot from the limiter, or the outcome that defers the claim: the cap is
    /// reached (told once per claim per episode of it) or the count is not known.
    pub(super) async fn admit(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
    ) -> Result<Reservation, Outcome> {
        let key = &claim.key;
        let slots = &self.deletes.slots;
        // The clock publishes the dispute's gauge itself, from the contradiction on.
        if let Some(disputed) = slots.disputed(self.clock.dispute()) {
            if disputed.first {
                let window = slots.window().to_owned();
                warn!(claim = %key, %window, "the API server's clock contradicted its earlier answers: the blast-radius cap counts its window as full; deletion deferred");
                (self.cluster)
                    .notify(claim, Notice::ClockDisputed { window })
                    .await;
            }
            return Err(Outcome::At(disputed.until));
        }
        // The share's population: the candidates, not every labelled claim watched.
        let population = self.cache.read().take_candidates();
        // Judged at the earliest the API server's clock can read: never shorter windows.
        let (earliest, _) = self.clock.server();
        let Admitted {
            admission,
            full,
            first,
            max,
        } = slots.admit(
            key,
            cause.place_in_line(),
            population,
            Instant::now(),
            earliest,
        );
        match admission {
            Admission::At(reservation) => {
                self.metrics.set_cap_unknown(false);
                if !full {
                    self.metrics.set_capped(false);
                }
                // A claim's episode of the cap ends when it gets its slot, whatever the others
                // do: a saturated cap admits one as one expires, several when several expire.
                Ok(reservation)
            }
            Admission::Unknown => {
                debug!(claim = %key, "the count of deletions in the current window is not known; deletion deferred");
                self.metrics.set_cap_unknown(true);
                Err(Outcome::Retry(Failure::CapUnknown))
            }
            Admission::Capped { until } => {
                self.metrics.set_capped(true);
                if first {
                    // The cap as it stands: the absolute one, or the share of the population.
                    let window = slots.window();
                    warn!(claim = %key, max, %window, "blast-radius cap reached; deletion deferred");
                    let notice = Notice::CapReached {
                        max,
                        window: window.to_owned(),
                    };
                    self.cluster.notify(claim, notice).await;
                }
                Err(Outcome::At(until))
            }
        }
    }

    /// Sends the one DELETE, with the ledger that counts it (and names it in flight) written
    /// to the Lease first; after it, the mark on a `Retain` volume once the DELETE succeeded,
    /// or the claim's revocation is owed when no answer said whether it was carried out.
    pub(super) async fn send(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
        reservation: Reservation,
        confirmed: &Confirmed,
    ) -> SendResult {
        let live_until = confirmed.live_until;
        let pressure = matches!(cause, Cause::Pressure);
        // Every delete of ours in a namespace under pressure is counted in its round, and
        // goes on the Lease with the ledger (a would-delete only under pressure: nothing
        // leaves then, so it would hold the round forever). The one question of the mode:
        // it is asked before the answer that tells a dry run from a real one.
        let recorded = pressure || self.cluster.mode() == Mode::Delete;
        if recorded && let Some(rounds) = self.deletes.pressure.record(claim) {
            self.cluster.stage_rounds(rounds);
        }
        // The ledger written to the Lease before the DELETE counts it from the latest instant
        // the DELETE can go out: the fence lets it go at most `reach` after this write. So a
        // replica that recovers the ledger never counts it earlier than the API server saw it
        // (a restart inside a window then cannot open room for one delete too many).
        let slots = &self.deletes.slots;
        let latest = self.clock.server().1 + self.cluster.reach();
        let (reservation, ledger) = slots.count_for_send(reservation, latest);
        let sent = match &ledger {
            Some(counted) => {
                let text = counted.ledger.to_annotation();
                let ledger = (text.as_str(), counted.generation);
                self.cluster.delete(claim, ledger, live_until).await
            }
            None => Err(NotSent::Fence(FenceError::NotLeading)),
        };
        // Received by the time it was answered, at the latest.
        let answered = self.clock.server().1;
        let answer = sent.as_ref().ok().copied();
        (self.deletes.in_flight).sent(slots, claim, answer, reservation, answered);
        let result = sent.as_ref().ok().map(|answer| answer.result());
        if let Ok(Answer::Real(DeleteResult::Deleted)) = &sent {
            self.mark(claim, confirmed).await;
        }
        // A delete that was refused frees nothing; one already gone, or unanswered (it may
        // have been carried out), may have: pressure then deletes fewer, never more.
        let not_freed = matches!(
            result,
            None | Some(DeleteResult::Conflict | DeleteResult::Throttled | DeleteResult::Denied)
        );
        if recorded && not_freed {
            self.deletes.pressure.withdraw(&claim.key, &claim.uid);
        }
        sent
    }

    /// With `deletion.released_volume_ttl`, writes the claim's UID on its `Retain` volume once
    /// the claim's DELETE was answered with success: a mark stands for a delete carried out,
    /// never one intended. Not written (the write failed), the volume never qualifies: a
    /// leak, which fails closed.
    pub(super) async fn mark(&self, claim: &ClaimFacts, confirmed: &Confirmed) {
        let volume = confirmed
            .volume
            .as_ref()
            .filter(|_| self.deletes.mark_volumes);
        let Some(volume) = volume.filter(|volume| volumes::to_mark(volume, &claim.uid)) else {
            return;
        };
        let marked = (self.cluster).mark_volume(volume, &claim.uid).await;
        if marked.is_some() {
            self.metrics.volume_mark(Mark::Marked);
        } else {
            warn!(claim = %claim.key, volume = %volume.name, "the volume could not be marked: it will not be deleted once Released");
            self.metrics.volume_mark(Mark::Failed);
        }
    }

    /// Metrics, logs and events for what the DELETE did, and what comes next for the claim.
    pub(super) async fn report(
        &self,
        claim: &ClaimFacts,
        confirmed: Confirmed,
        sent: SendResult,
    ) -> Outcome {
        let key = &claim.key;
        let Confirmed {
            reason,
            due_at,
            volume,
            ..
        } = confirmed;
        let retained = volume
            .filter(|volume| volume.reclaim_policy.as_deref() == Some("Retain"))
            .map(|volume| volume.name);
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) => {
                info!(claim = %key, %error, "not deleted: deciding again");
                return Outcome::Retry(match error {
                    NotSent::Fence(_) => Failure::Fenced,
                    NotSent::TooLate => Failure::TooLate,
                });
            }
        };
        // Revoked at once, before anything else is done for the claim (in a dry run nothing
        // that can land was sent).
        let revoked = match answer.result() {
            DeleteResult::Unanswered => Some(self.resolve_outstanding(key).await),
            _ => None,
        };
        match answer {
            Answer::Dry(DeleteResult::Deleted) => {
                info!(claim = %key, %reason, "dry-run: would delete");
                self.metrics.would_delete(&key.namespace, reason);
                (self.cluster)
                    .notify(claim, Notice::WouldDelete(reason))
                    .await;
                return Outcome::Done;
            }
            Answer::Real(result) => self.metrics.deletion(&key.namespace, reason, result),
            Answer::Dry(_) => {}
        }
        match answer.result() {
            // Real: a dry run's ended above.
            DeleteResult::Deleted => {
                let lag = due_at.map(|due| (self.clock.now() - due).as_seconds_f64());
                info!(claim = %key, %reason, lag_seconds = lag, "deleted");
                let bytes = claim.requested_bytes.unwrap_or(0);
                (self.metrics).reclaimed(bytes, retained.is_some(), lag);
                let notice = Notice::Deleted(reason, retained);
                self.cluster.notify(claim, notice).await;
                Outcome::Done
            }
            DeleteResult::NotFound => {
                debug!(claim = %key, "already gone");
                Outcome::Done
            }
            DeleteResult::Conflict => {
                info!(claim = %key, "the claim changed or was re-created since the decision; re-evaluating");
                Outcome::Retry(Failure::Conflict)
            }
            DeleteResult::Throttled => Outcome::Retry(Failure::Throttled),
            DeleteResult::Denied => Outcome::Retry(Failure::Denied),
            DeleteResult::Unanswered => revoked
                .flatten()
                .unwrap_or(Outcome::Retry(Failure::Unanswered)),
        }
    }

    /// Counts the cap from the ledger found on the Lease just won; fails closed for a window
    /// when it cannot be read.
    pub(super) fn recover_cap(&self) {
        let found = self.cluster.found_ledger();
        let recovered = self.deletes.in_flight.recovered(
            &self.deletes.slots,
            found.as_deref(),
            self.clock.server(),
            self.cluster.reach(),
        );
        if let Err(error) = recovered {
            warn!(%error, "the count of deletions in the current window is not known; counting the cap as reached for one window");
            self.metrics.set_cap_unknown(true);
            self.metrics.ledger_fault(error.fault());
        }
    }
}
