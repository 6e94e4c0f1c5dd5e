//! Standing by or leading, and the transitions between: every `retry` one round reads the
//! Lease, then renews it (leading), takes it (its holder is empty, or it has not changed for a
//! whole lease by this replica's clock), or stands by; a leader steps down on a 409, when a
//! renewal has not succeeded within the renew deadline, when another holds the Lease, and on
//! shutdown, where it releases the Lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::records::{self, Kept, Records};
use super::store::{Change, LeaseStore, StoreError};
use super::{FenceError, Timing};
use crate::cluster::in_flight::{InFlight, LeaseNames};
use crate::contract::annotations::DELETES_IN_FLIGHT;
use crate::observe::metrics::{LedgerFault, LedgerRead, Metrics, Operation};

pub struct Elector {
    store: Arc<dyn LeaseStore>,
    identity: String,
    timing: Timing,
    pub(super) metrics: Arc<Metrics>,
    /// The DELETEs that may still land (`cluster::in_flight`): what the registry says the
    /// Lease must name is written with every Lease write that differs.
    pub(super) names: Arc<dyn LeaseNames>,
    /// The Lease as this replica last read or wrote it. Its lock serialises every write.
    pub(super) lease: tokio::sync::Mutex<Option<Lease>>,
    /// The rest of what this replica knows, under one lock held for moments, never across a
    /// request.
    state: Mutex<State>,
    leading: watch::Sender<bool>,
}

#[derive(Default)]
pub(super) struct State {
    /// While leading: when the request of the last successful write was sent.
    pub renewed: Option<Instant>,
    /// The records this replica keeps for the Lease.
    pub kept: Kept,
    /// The group commit's asks, and what its last write carried.
    pub batch: Batch,
}

/// The group commit's state (`commit.rs` drives it): what the shared writes are asked for, and
/// what the last one carried.
#[derive(Default)]
pub(super) struct Batch {
    /// The newest ledger asked for, with its generation.
    pub(super) newest: Option<(u64, String)>,
    /// The last successful write's ledger generation and the DELETEs it named, in this
    /// holding of the lease: taking or losing it clears it.
    pub(super) carried: Option<(u64, BTreeMap<String, InFlight>)>,
}

impl Batch {
    pub(super) fn carried(&self, generation: u64, delete: &InFlight) -> bool {
        self.carried.as_ref().is_some_and(|(written, named)| {
            *written >= generation && named.get(&delete.uid) == Some(delete)
        })
    }
}

/// The holder and renew time a standby last saw, and when it first saw them.
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    since: Instant,
}

impl Elector {
    /// A standby for the Lease in `store`, and the channel that says whether it leads.
    pub(super) fn new(
        store: Arc<dyn LeaseStore>,
        timing: Timing,
        identity: String,
        metrics: Arc<Metrics>,
        names: Arc<dyn LeaseNames>,
    ) -> (Self, watch::Receiver<bool>) {
        let (leading, receiver) = watch::channel(false);
        let elector = Self {
            store,
            identity,
            timing,
            metrics,
            names,
            lease: tokio::sync::Mutex::new(None),
            state: Mutex::default(),
            leading,
        };
        (elector, receiver)
    }

    pub(super) fn timing(&self) -> Timing {
        self.timing
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads or changes the records kept, under the state's lock.
    pub(super) fn kept<T>(&self, f: impl FnOnce(&mut Kept) -> T) -> T {
        f(&mut self.state().kept)
    }

    pub(super) fn renewed_at(&self) -> Option<Instant> {
        self.state().renewed
    }

    pub(super) fn renewed(&self, sent: Instant) {
        self.state().renewed = Some(sent);
    }

    /// Whether it leads and sent its last successful write less than the renew deadline ago.
    pub(super) fn fresh(&self) -> bool {
        self.renewed_at()
            .is_some_and(|sent| sent.elapsed() < self.timing.renew_deadline)
    }

    pub(super) fn check(&self) -> Result<(), FenceError> {
        if self.fresh() {
            Ok(())
        } else {
            Err(FenceError::NotLeading)
        }
    }

    pub(super) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut observed = None;
        let mut failing = false;
        loop {
            let step = tokio::time::timeout(self.timing.renew_deadline, self.step(&mut observed));
            match step.await {
                Ok(Ok(())) => {
                    if failing {
                        info!("the lease can be read and written again");
                    }
                    failing = false;
                }
                Ok(Err(error)) => {
                    self.metrics.api_error(Operation::Lease, error.cause());
                    if failing {
                        debug!(%error, "the lease still cannot be read or written");
                    } else {
                        warn!(%error, "the lease cannot be read or written; retrying");
                    }
                    failing = true;
                }
                Err(_) => {
                    warn!(timeout = ?self.timing.renew_deadline, "reading or writing the lease timed out");
                    failing = true;
                }
            }
            if !self.fresh() {
                self.step_down("the lease was not renewed within the renew deadline");
            }
            let mut next = Instant::now() + self.timing.retry;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return self.release().await,
                    () = tokio::time::sleep_until(next) => {}
                }
                // A write that recorded DELETEs renewed the lease too: the renewal counts
                // from it, so a busy leader writes the Lease only to record its DELETEs.
                match self.renewed_at() {
                    Some(renewed) if renewed + self.timing.retry > next => {
                        next = renewed + self.timing.retry;
                    }
                    _ => break,
                }
            }
        }
    }

    /// One round: read the Lease, then renew it, take it, or stand by.
    async fn step(&self, observed: &mut Option<Observed>) -> Result<(), StoreError> {
        let mut held = self.lease.lock().await;
        let Some(current) = self.store.get().await? else {
            // Leading, the registry says what may still land; standing by, what the Lease
            // named when last read (whoever led may have DELETEs on their way).
            let leading = *self.leading.borrow();
            let named = if leading {
                Some(self.names.on_lease())
            } else {
                None
            };
            let annotations = {
                let state = self.state();
                let named = named.as_ref().unwrap_or(&state.kept.in_flight);
                records::created(state.kept.known(), named)
            };
            if annotations.is_some() {
                warn!(
                    leading,
                    "the lease is gone; creating it again with the deletion ledger and the deletes in flight this replica knows"
                );
                self.metrics.ledger_fault(LedgerFault::Lost);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    annotations,
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            // Another replica may create it first: a 409, and the next round reads it.
            return self.claim(&mut held, lease, true, None).await;
        };
        let rewrite = self.compare_ledger(&current);
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let seen = observed
            .as_ref()
            .is_some_and(|o| o.holder == holder && o.renew_time == spec.renew_time);
        if !seen {
            *observed = Some(Observed {
                holder: holder.clone(),
                renew_time: spec.renew_time.clone(),
                since: Instant::now(),
            });
        }
        let stated = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.lease, Duration::from_secs);
        let expired = observed
            .as_ref()
            .is_none_or(|o| o.since.elapsed() >= stated);
        match holder {
            Some(holder) if holder == self.identity => {
                self.claim(&mut held, current, false, rewrite).await
            }
            Some(holder) if !expired => {
                *held = Some(current);
                if *self.leading.borrow() {
                    self.step_down(&format!("{holder} holds the lease"));
                }
                Ok(())
            }
            _ => self.claim(&mut held, current, true, rewrite).await,
        }
    }

    /// Remembers the ledger on `lease` as read (counting the read), unless this replica leads:
    /// then its own is the record of what it deleted, and if the Lease holds another (someone
    /// edited or removed it), returns its own for the renewal to write back.
    fn compare_ledger(&self, lease: &Lease) -> Option<String> {
        let records = Records::read(lease);
        let on_lease = records.ledger.clone();
        let standby = !*self.leading.borrow();
        // Unreadable, it names nothing this replica could revoke (told when it is won).
        let named = standby.then(|| records.in_flight().unwrap_or_default());
        let mut state = self.state();
        if let Some(named) = named {
            state.kept.in_flight = named;
        }
        let known = &mut state.kept.ledger;
        if standby {
            let read = match on_lease {
                Some(on_lease) => {
                    *known = Some(on_lease);
                    LedgerRead::Remembered
                }
                None => LedgerRead::Absent,
            };
            self.metrics.standby_ledger_read(read);
            return None;
        }
        let own = known
            .as_ref()
            .filter(|&own| on_lease.as_ref() != Some(own))?;
        warn!(
            found_bytes = on_lease.as_ref().map_or(0, String::len),
            "the deletion ledger on the lease was changed by someone else; writing back this replica's"
        );
        self.metrics.ledger_fault(LedgerFault::Changed);
        Some(own.clone())
    }

    /// Renews the lease (`take`: takes it), as read in `lease`, with this replica as holder,
    /// writing `ledger` with it if given.
    async fn claim(
        &self,
        held: &mut Option<Lease>,
        lease: Lease,
        take: bool,
        ledger: Option<String>,
    ) -> Result<(), StoreError> {
        let now = MicroTime(Timestamp::now());
        let mut spec = json!({
            "renewTime": now,
            "leaseDurationSeconds": self.timing.lease.as_secs(),
        });
        if take {
            let transitions = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0);
            spec["holderIdentity"] = json!(self.identity);
            spec["acquireTime"] = json!(now);
            spec["leaseTransitions"] = json!(transitions.saturating_add(1));
        }
        let read = Records::read(&lease);
        if take {
            // Whoever led before may have DELETEs on their way: they stay named, as the Lease
            // has them, until this replica has revoked them.
            self.names.won(self.found_on(&read));
            self.state().batch.carried = None;
        }
        let sent = Instant::now();
        let written = if lease.metadata.resource_version.is_some() {
            let named = self.names.on_lease();
            self.write(&lease, spec, ledger.as_deref(), &named).await
        } else {
            let created = Lease {
                metadata: lease.metadata,
                spec: serde_json::from_value(spec).ok(),
            };
            self.store.create(created).await
        };
        let written = match written {
            Ok(written) => written,
            Err(StoreError::Conflict(_)) => {
                self.step_down("another replica wrote the lease first");
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        *held = Some(written);
        self.renewed(sent);
        if !*self.leading.borrow() {
            self.kept(|kept| {
                kept.staged_rounds = None;
                kept.found_rounds = read.rounds;
            });
            info!(identity = %self.identity, "won the lease");
            self.leading.send_replace(true);
        }
        Ok(())
    }

    /// Writes `spec`, the ledger if given (with the rounds staged) and what is in flight
    /// (`named`) into the Lease; refused (409) if anyone wrote it since it was `read`: the
    /// write carries the resourceVersion read, a precondition.
    pub(super) async fn write(
        &self,
        read: &Lease,
        spec: Value,
        ledger: Option<&str>,
        named: &BTreeMap<String, InFlight>,
    ) -> Result<Lease, StoreError> {
        let annotations = {
            let state = self.state();
            let counted = ledger.map(|ledger| state.kept.counted(ledger));
            records::patch(&Records::read(read), counted, named)
        };
        let change = Change {
            resource_version: read.metadata.resource_version.clone(),
            spec,
            annotations,
        };
        self.store.replace(change).await
    }

    /// The DELETEs in flight the Lease read names. One it cannot read names nothing this
    /// replica can revoke: it says so, and the admission guard's fence is left to refuse them.
    fn found_on(&self, read: &Records) -> BTreeMap<String, InFlight> {
        read.in_flight().unwrap_or_else(|error| {
            warn!(%error, annotation = DELETES_IN_FLIGHT, "the lease names DELETEs in flight unreadably; they cannot be revoked");
            self.metrics.ledger_fault(LedgerFault::InFlight);
            BTreeMap::new()
        })
    }

    pub(super) fn step_down(&self, why: &str) {
        {
            let mut state = self.state();
            state.renewed = None;
            state.batch.carried = None;
        }
        // Wakes the followers only on a change: a standby steps down every round.
        let was_leading = self
            .leading
            .send_if_modified(|leading| std::mem::replace(leading, false));
        if was_leading {
            warn!(
                reason = why,
                "no longer leading: this replica stops deleting"
            );
        }
    }

    /// On shutdown: stops acting, then empties the holder so a standby takes over at once.
    async fn release(&self) {
        let mut held = self.lease.lock().await;
        let leading = self.fresh();
        self.step_down("shutting down");
        let Some(lease) = held.take().filter(|_| leading) else {
            return;
        };
        let spec = json!({ "holderIdentity": null, "renewTime": null, "acquireTime": null });
        let named = self.names.on_lease();
        match self.write(&lease, spec, None, &named).await {
            Ok(_) => info!("released the lease"),
            Err(error) => {
                self.metrics.api_error(Operation::Lease, error.cause());
                warn!(%error, "could not release the lease; a standby takes over when it expires");
            }
        }
    }
}
