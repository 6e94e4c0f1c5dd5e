//! The delete pipeline after the decision: admit (the pace and the blast-radius cap, with its
//! line), send (the Lease's ledger, then the one DELETE, through the writer), mark a `Retain`
//! volume, and report.

use std::sync::Mutex;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cluster::in_flight::Sent;
use crate::cluster::leader::FenceError;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::{Answer, Mode, NotSent, Notice};
use crate::config::{Config, MAX_DURATION, deletion_interval};
use crate::daemon::limiter::{Admission, Limiter, Line, Reservation};
use crate::daemon::scheduler::{Failure, Outcome};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::volumes;
use crate::observe::metrics::{DeleteResult, Mark};

use super::recheck::Confirmed;
use super::{Cause, Controller};

/// The blast-radius cap's window as its notice tells it (the most it holds is the limiter's).
struct Cap {
    window: String,
    /// The window itself, for how long a clock dispute holds the cap full.
    span: std::time::Duration,
    /// The clock dispute whose notice went out: told once per dispute, not per claim.
    disputed_told: Mutex<Option<Instant>>,
}

/// The delete pipeline's own state: the pace and the cap, the line of claims the cap holds
/// back, and whether a deleted claim's `Retain` volume is marked.
pub(super) struct Deletes {
    limiter: Mutex<Limiter>,
    cap: Cap,
    /// The claims the cap holds back, earliest due first. Each is told once per episode (until
    /// it gets a slot, is no longer due, or is gone), not at every retry.
    line: Mutex<Line<ObjectKey>>,
    /// Whether a `Retain` volume is marked once its claim's delete succeeded, so that it is
    /// deleted once Released (`deletion.released_volume_ttl`).
    mark_volumes: bool,
}

impl Deletes {
    pub(super) fn new(config: &Config) -> Self {
        let deletion = &config.deletion;
        Deletes {
            limiter: Mutex::new(
                Limiter::new(
                    // Validation refused every rate without an interval; the slowest pace
                    // otherwise.
                    deletion_interval(deletion.deletes_per_second).unwrap_or(MAX_DURATION),
                    deletion.max_deletions_per_window,
                    deletion.window,
                )
                .with_share(deletion.max_deletions_percent),
            ),
            cap: Cap {
                window: humantime::format_duration(deletion.window).to_string(),
                span: deletion.window,
                disputed_told: Mutex::default(),
            },
            line: Mutex::default(),
            mark_volumes: deletion.released_volume_ttl.is_some(),
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
        if let Some(until) = self.clock_disputed_until() {
            self.metrics.set_clock_disputed(true);
            let first = {
                let mut told = self.lock_disputed_told();
                told.replace(until) != Some(until)
            };
            if first {
                let window = self.deletes.cap.window.clone();
                warn!(claim = %key, %window, "the API server's clock contradicted its earlier answers: the blast-radius cap counts its window as full; deletion deferred");
                (self.cluster)
                    .notify(claim, Notice::ClockDisputed { window })
                    .await;
            }
            return Err(Outcome::At(until));
        }
        self.metrics.set_clock_disputed(false);
        let place = cause.place_in_line();
        let population = self.read_index().claim_count();
        let (admission, full, first, max) = {
            let mut limiter = self.lock_limiter();
            limiter.population(population);
            let mut line = self.lock_line();
            // Judged at the earliest the API server's clock can read: never shorter windows.
            let (earliest, _) = self.clock.server();
            let ahead = line.ahead(key, place, limiter.max() as usize);
            let admission = limiter.reserve(Instant::now(), earliest, ahead);
            let first = match admission {
                Admission::At(_) => {
                    line.leave(key);
                    false
                }
                Admission::Capped { .. } => line.join(key, place),
                Admission::Unknown => false,
            };
            (admission, limiter.full(earliest), first, limiter.max())
        };
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
                    let window = &self.deletes.cap.window;
                    warn!(claim = %key, max, %window, "blast-radius cap reached; deletion deferred");
                    let notice = Notice::CapReached {
                        max,
                        window: window.clone(),
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
        if recorded {
            self.record_round(claim);
        }
        // The ledger written to the Lease before the DELETE counts it from the latest instant
        // the DELETE can go out: the fence lets it go at most `reach` after this write. So a
        // replica that recovers the ledger never counts it earlier than the API server saw it
        // (a restart inside a window then cannot open room for one delete too many).
        let reservation = self
            .lock_limiter()
            .count_from(reservation, self.clock.server().1 + self.cluster.reach());
        let ledger = self.lock_limiter().ledger_for(reservation);
        let sent = match &ledger {
            Some(counted) => {
                let text = counted.ledger.to_annotation();
                let ledger = (text.as_str(), counted.generation);
                self.cluster.delete(claim, ledger, live_until).await
            }
            None => Err(NotSent::Fence(FenceError::NotLeading)),
        };
        let result = sent.as_ref().ok().map(|answer| answer.result());
        // The cap counts would-deletes as deletes: a dry run shows what the cap lets through.
        match result {
            // Received by the time it was answered, at the latest.
            Some(DeleteResult::Deleted) => {
                self.lock_limiter()
                    .count_from(reservation, self.clock.server().1);
            }
            // It may have been carried out: it stays counted until its revocation says.
            Some(DeleteResult::Unanswered) => {}
            _ => self.release(reservation),
        }
        // The registry learns how a real DELETE ended (a dry run's never could land).
        let ended = match &sent {
            Ok(Answer::Real(DeleteResult::Deleted)) => Some(Sent::Carried),
            Ok(Answer::Real(DeleteResult::Unanswered)) => Some(Sent::Unanswered),
            Ok(Answer::Dry(_)) => None,
            Ok(Answer::Real(_)) | Err(_) => Some(Sent::Settled),
        };
        if let Some(ended) = ended {
            self.sent(claim, ended, reservation);
        }
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
            self.rounds().withdraw(&claim.key, &claim.uid);
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

    /// Until when the cap counts its window as full because the API server's clock
    /// contradicted its earlier answers: the ledger is dated by that clock's estimate, and an
    /// estimate that jumped forward would otherwise forget the deletions dated on the slower
    /// clock, for good (and the Lease's copy with them). `None` once a whole window has passed
    /// since the last contradiction. Fails closed: deletions wait, none is forgotten.
    fn clock_disputed_until(&self) -> Option<Instant> {
        let until = self.clock.contradicted_at()? + self.deletes.cap.span;
        (until > Instant::now()).then_some(until)
    }

    fn lock_disputed_told(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        (self.deletes.cap.disputed_told)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn release(&self, reservation: Reservation) {
        self.lock_limiter().release(reservation);
    }

    pub(super) fn lock_line(&self) -> std::sync::MutexGuard<'_, Line<ObjectKey>> {
        self.deletes.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_limiter(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.deletes
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the cap from the ledger found on the Lease just won; fails closed for a window
    /// when it cannot be read.
    pub(super) fn recover_cap(&self) {
        let found = self.cluster.found_ledger();
        if let Err(error) = self.lock_limiter().recover(
            found.as_deref(),
            self.clock.server().0,
            self.cluster.reach(),
        ) {
            warn!(%error, "the count of deletions in the current window is not known; counting the cap as reached for one window");
            self.metrics.set_cap_unknown(true);
            self.metrics.ledger_fault(error.fault());
        }
    }
}
