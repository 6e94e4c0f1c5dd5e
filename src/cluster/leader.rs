//! Lease-based leader election with fencing: only the leader writes to the cluster, and it stops
//! the moment it cannot be sure it still holds the Lease. A standby keeps its caches warm and
//! takes over when the lease expires (at once when the leader releases it on shutdown). Without
//! leader election this replica always leads.
//!
//! This follows client-go's leader election rather than using kube-lease-manager, which keeps
//! reporting leadership while its renewals fail (it re-checks only when a call succeeds), so a
//! partitioned leader went on deleting after a standby had taken over:
//!
//! - Every `retry` (an eighth of the lease) each replica reads the Lease. The holder renews it;
//!   a standby takes it when its holder is empty, or when the holder and renew time have not
//!   changed for a whole lease duration *by the standby's own monotonic clock*, so clock skew
//!   between replicas does not matter. Every write is a patch that carries the resourceVersion
//!   read, which the API server checks (409 otherwise), so two replicas cannot both win; and
//!   it needs no right beyond the `get`, `patch` and `create` the Lease Role always granted.
//! - The leader may act only until `renew_deadline` (two thirds of the lease) after it *sent*
//!   its last successful write: [`Fence::check`]. A standby waits a whole lease from when it
//!   *saw* that write, so the old leader has stopped at least a third of the lease before the
//!   new one can start.
//! - The blast-radius cap's ledger lives on the same Lease, as its annotation text (see
//!   `src/daemon/cap_ledger.rs`):
//!   written before each delete ([`Fence::record`]), which also renews the lease and, being
//!   compare-and-swap, proves that this replica still held it an instant before the DELETE;
//!   and read back by whoever wins the lease next ([`Fence::found`]).
//! - The same write names the DELETE about to be sent, and every earlier one not answered for
//!   certain: what the registry of DELETEs in flight says the Lease must name
//!   (`cluster::in_flight`, `annotations::DELETES_IN_FLIGHT`). A DELETE that a proxy holds may
//!   reach the API server long after its sender gave up, or lost the lease. Winning the lease
//!   hands what it named to the registry, and the controller revokes each before deciding
//!   anything for its claim. An entry leaves with the next Lease write once its DELETE or its
//!   revocation is answered.
//! - While this replica leads, its own ledger is the record of what it deleted, whatever the
//!   Lease says (RELIABILITY.md, "The ledger rule": written back when changed, remembered by a
//!   standby, written with a Lease created again after `kubectl delete lease`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::in_flight::{self, InFlight, LeaseNames, NotNamed};
use crate::config::LeaderElectionConfig;
use crate::contract::annotations::{DELETES_IN_FLIGHT, DELETIONS, QUOTA_ROUNDS};
use crate::observe::metrics::{LedgerFault, LedgerRead, Metrics, Operation};

/// Why this replica may not write to the cluster now.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(
        "this replica does not hold the lease, or has not renewed it within the renew deadline"
    )]
    NotLeading,
    #[error("another replica wrote the lease")]
    Lost,
    #[error("could not record the deletion on the lease: {0}")]
    Write(#[source] kube::Error),
    #[error("recording the deletion on the lease took longer than the renew deadline")]
    TimedOut,
    #[error(transparent)]
    NotNamed(#[from] NotNamed),
}

/// How long a Lease write that records a DELETE waits for others decided with it.
const GATHER: Duration = Duration::from_millis(5);

/// The election's periods, all derived from the lease duration in client-go's proportions
/// (15 s, 10 s, 2 s there).
#[derive(Debug, Clone, Copy)]
struct Timing {
    lease: Duration,
    renew_deadline: Duration,
    retry: Duration,
}

impl Timing {
    fn new(lease: Duration) -> Self {
        Self {
            lease,
            renew_deadline: lease * 2 / 3,
            retry: lease / 8,
        }
    }
}

/// This replica's leadership, as a channel that flips when the lease is won or lost, and the
/// [`Fence`] every write passes.
pub struct Leadership {
    fence: Fence,
    leading: watch::Receiver<bool>,
    elector: Option<(JoinHandle<()>, CancellationToken)>,
}

/// Whether this replica may write to the cluster now. Cheap to clone and to check.
#[derive(Clone)]
pub struct Fence {
    /// `None` without leader election: always allowed.
    elector: Option<Arc<Elector>>,
    /// Holds the channel open when election is disabled.
    _always: Option<Arc<watch::Sender<bool>>>,
}

struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    metrics: Arc<Metrics>,
    /// The Lease as this replica last read or wrote it. Its lock serialises every write.
    lease: tokio::sync::Mutex<Option<Lease>>,
    /// While leading: when the request of the last successful write was sent.
    renewed: Mutex<Option<Instant>>,
    /// The ledger annotation as this replica knows it: while leading, the last it wrote (or
    /// found on winning); while standing by, the last it read on the Lease.
    ledger: Mutex<Option<String>>,
    /// Quota pressure's rounds: to write with the next ledger, and as found when last won.
    rounds: Mutex<(Option<String>, Option<String>)>,
    /// The DELETEs that may still land (`cluster::in_flight`): what the registry says the
    /// Lease must name is written with every Lease write that differs.
    names: Arc<dyn LeaseNames>,
    /// The DELETEs named for [`Fence::record`]'s shared writes.
    batch: Mutex<Batch>,
    leading: watch::Sender<bool>,
}

/// What [`Fence::record`]'s shared writes are asked for, and what the last one carried.
#[derive(Default)]
struct Batch {
    /// The newest ledger asked for, with its generation.
    newest: Option<(u64, String)>,
    /// The last successful write's ledger generation and the DELETEs it named, in this
    /// holding of the lease: taking or losing it clears it.
    carried: Option<(u64, BTreeMap<String, InFlight>)>,
}

impl Batch {
    fn carried(&self, generation: u64, delete: &InFlight) -> bool {
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

impl Leadership {
    /// Starts competing for the lease (or leads at once when election is disabled).
    pub fn start(
        client: Client,
        config: &LeaderElectionConfig,
        namespace: &str,
        identity: String,
        metrics: Arc<Metrics>,
        names: Arc<dyn LeaseNames>,
    ) -> Self {
        if !config.enabled {
            let (always, leading) = watch::channel(true);
            return Self {
                fence: Fence {
                    elector: None,
                    _always: Some(Arc::new(always)),
                },
                leading,
                elector: None,
            };
        }
        let timing = Timing::new(config.lease_duration);
        info!(lease = %config.lease_name, %namespace, %identity, ?timing, "competing for the lease");
        let (sender, leading) = watch::channel(false);
        let elector = Arc::new(Elector {
            api: Api::namespaced(client, namespace),
            name: config.lease_name.clone(),
            identity,
            timing,
            metrics,
            lease: tokio::sync::Mutex::new(None),
            renewed: Mutex::new(None),
            ledger: Mutex::new(None),
            rounds: Mutex::default(),
            names,
            batch: Mutex::default(),
            leading: sender,
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(elector.clone().run(stop.clone()));
        Self {
            fence: Fence {
                elector: Some(elector),
                _always: None,
            },
            leading,
            elector: Some((task, stop)),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops acting and releases the lease, so a standby takes over at once instead of after
    /// expiry.
    pub async fn release(self) {
        if let Some((task, stop)) = self.elector {
            stop.cancel();
            if let Err(error) = task.await {
                warn!(%error, "the leader election task failed");
            }
        }
    }
}

impl Fence {
    /// A fence that always allows: for a replica without leader election, and for tests.
    pub fn unfenced() -> Self {
        Self {
            elector: None,
            _always: None,
        }
    }

    /// Whether this replica may write now: it holds the lease and sent its last successful
    /// renewal less than the renew deadline ago.
    pub fn check(&self) -> Result<(), FenceError> {
        match &self.elector {
            None => Ok(()),
            Some(elector) if elector.fresh() => Ok(()),
            Some(_) => Err(FenceError::NotLeading),
        }
    }

    /// Until when this replica may write: its last successful Lease write's sending plus the
    /// renew deadline (now, when it does not lead). `None` without leader election.
    pub fn until(&self) -> Option<Instant> {
        let elector = self.elector.as_ref()?;
        let renewed = elector.renewed_at();
        Some(renewed.map_or_else(Instant::now, |sent| sent + elector.timing.renew_deadline))
    }

    /// How long after this replica's last successful Lease write it may still send a DELETE:
    /// the renew deadline ([`Fence::check`]). Zero without leader election (no Lease).
    pub fn reach(&self) -> Duration {
        self.elector
            .as_ref()
            .map_or(Duration::ZERO, |elector| elector.timing.renew_deadline)
    }

    /// Has `ledger` (the cap's count as its annotation, `Ledger::to_annotation`, and its
    /// generation, `Limiter::ledger_for`) written to the Lease, renewing it: before a delete,
    /// with that delete counted and named in flight. Fails unless this replica holds the lease
    /// at that moment, as the API server sees it.
    ///
    /// DELETEs recorded at the same time share one write (a group commit): a DELETE is named
    /// as soon as it asks, so a write that another caller sends meanwhile may carry it. One
    /// needs no write of its own when a successful write in this holding of the lease named it
    /// and carried a ledger of its generation or a later one.
    pub async fn record(&self, ledger: (&str, u64), delete: &InFlight) -> Result<(), FenceError> {
        let Some(elector) = &self.elector else {
            return Ok(());
        };
        elector.name(ledger, delete)?;
        let mut held = elector.lease.lock().await;
        let written = self.carry(elector, &mut held, ledger.1, delete).await;
        if written.is_err() {
            // Nothing is sent: this DELETE cannot land, and no later write may name it (the
            // next leader would revoke a claim nobody deleted).
            elector.names.not_named(delete);
        }
        written
    }

    /// Makes sure a successful Lease write in this holding carried `delete` and a ledger of
    /// `generation` or later: one already sent, or one written now.
    async fn carry(
        &self,
        elector: &Elector,
        held: &mut Option<Lease>,
        generation: u64,
        delete: &InFlight,
    ) -> Result<(), FenceError> {
        self.check()?;
        if elector.batch().carried(generation, delete) {
            return Ok(());
        }
        // The DELETEs of one proof round are confirmed within microseconds of each other: a
        // moment's wait lets them all be named before the write that carries them.
        tokio::time::sleep(GATHER).await;
        self.check()?;
        let read = held.as_ref().ok_or(FenceError::NotLeading)?;
        let (named, (written_generation, ledger)) = {
            let batch = elector.batch();
            let newest = batch.newest.clone().ok_or(FenceError::NotLeading)?;
            (elector.names.on_lease(), newest)
        };
        let spec = json!({ "renewTime": MicroTime(Timestamp::now()) });
        let sent = Instant::now();
        // Bounded: the lock it holds also holds up the renewals.
        let write = elector.write(read, spec, Some(&ledger), &named);
        match tokio::time::timeout(elector.timing.renew_deadline, write).await {
            Ok(Ok(written)) => {
                *held = Some(written);
                elector.renewed(sent);
                // Only once written: a write that failed carried a delete that is not sent.
                // (One that timed out but landed then reads as changed, and is written back.)
                *elector.known() = Some(ledger);
                elector.batch().carried = Some((written_generation, named));
                Ok(())
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                elector.step_down("another replica wrote the lease");
                Err(FenceError::Lost)
            }
            Ok(Err(error)) => {
                elector.metrics.api_error(Operation::Lease, &error);
                Err(FenceError::Write(error))
            }
            Err(_) => Err(FenceError::TimedOut),
        }
    }

    /// Hands over quota pressure's rounds (`annotations::QUOTA_ROUNDS`), to be written in the
    /// same patch as the next ledger [`Fence::record`] writes.
    pub fn stage_rounds(&self, rounds: String) {
        if let Some(elector) = &self.elector {
            elector.rounds().0 = Some(rounds);
        }
    }

    /// The quota pressure rounds found on the Lease when it was last won, if it had them.
    pub fn found_rounds(&self) -> Option<String> {
        self.elector.as_ref()?.rounds().1.clone()
    }

    /// The deletion ledger found on the Lease when it was last won, or if it had none, the
    /// last this replica read there before (the Lease was deleted and created again).
    pub fn found(&self) -> Option<String> {
        self.elector.as_ref()?.known().clone()
    }
}

impl Elector {
    async fn run(self: Arc<Self>, stop: CancellationToken) {
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
                    self.metrics.api_error(Operation::Lease, &error);
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
    async fn step(&self, observed: &mut Option<Observed>) -> Result<(), kube::Error> {
        let mut held = self.lease.lock().await;
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let ledger = self.known().clone();
            if ledger.is_some() {
                warn!(
                    leading = *self.leading.borrow(),
                    "the lease is gone; creating it again with the deletion ledger this replica knows"
                );
                self.metrics.ledger_fault(LedgerFault::Lost);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    annotations: ledger.map(|l| {
                        let rounds = self.rounds().0.clone();
                        let rounds = rounds.map(|r| (QUOTA_ROUNDS.to_owned(), r));
                        [(DELETIONS.to_owned(), l)]
                            .into_iter()
                            .chain(rounds)
                            .collect()
                    }),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            return match self.claim(&mut held, lease, true, None).await {
                // Another replica created it first: the next round reads it.
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                other => other,
            };
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
        let on_lease = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DELETIONS));
        let mut known = self.known();
        if !*self.leading.borrow() {
            let read = match on_lease {
                Some(on_lease) => {
                    *known = Some(on_lease.clone());
                    LedgerRead::Remembered
                }
                None => LedgerRead::Absent,
            };
            self.metrics.standby_ledger_read(read);
            return None;
        }
        let own = known.as_ref().filter(|&own| on_lease != Some(own))?;
        warn!(
            found_bytes = on_lease.map_or(0, String::len),
            "the deletion ledger on the lease was changed by someone else; writing back this replica's"
        );
        self.metrics.ledger_fault(LedgerFault::Changed);
        Some(own.clone())
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews the lease (`take`: takes it), as read in `lease`, with this replica as holder,
    /// writing `ledger` with it if given.
    async fn claim(
        &self,
        held: &mut Option<Lease>,
        lease: Lease,
        take: bool,
        ledger: Option<String>,
    ) -> Result<(), kube::Error> {
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
        let found_rounds = (lease.metadata.annotations.as_ref())
            .and_then(|annotations| annotations.get(QUOTA_ROUNDS))
            .cloned();
        if take {
            // Whoever led before may have DELETEs on their way: they stay named, as the Lease
            // has them, until this replica has revoked them.
            self.names.won(self.found_on(&lease));
            self.batch().carried = None;
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
            self.api.create(&PostParams::default(), &created).await
        };
        let written = match written {
            Ok(written) => written,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.step_down("another replica wrote the lease first");
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        *held = Some(written);
        self.renewed(sent);
        if !*self.leading.borrow() {
            *self.rounds() = (None, found_rounds);
            info!(identity = %self.identity, "won the lease");
            self.leading.send_replace(true);
        }
        Ok(())
    }

    /// Patches `spec` (and the ledger annotation) into the Lease; refused (409) if anyone wrote
    /// it since it was `read`: the patch carries the resourceVersion read, a precondition.
    async fn write(
        &self,
        read: &Lease,
        spec: Value,
        ledger: Option<&str>,
        named: &BTreeMap<String, InFlight>,
    ) -> Result<Lease, kube::Error> {
        let mut patch = json!({
            "metadata": { "resourceVersion": read.metadata.resource_version },
            "spec": spec,
        });
        if let Some(ledger) = ledger {
            patch["metadata"]["annotations"] = json!({ DELETIONS: ledger });
            if let Some(rounds) = &self.rounds().0 {
                patch["metadata"]["annotations"][QUOTA_ROUNDS] = json!(rounds);
            }
        }
        let named = in_flight::to_text(named);
        let on_lease = (read.metadata.annotations.as_ref())
            .and_then(|annotations| annotations.get(DELETES_IN_FLIGHT));
        if named.as_ref() != on_lease {
            // Null removes the key: nothing is in flight any more.
            patch["metadata"]["annotations"][DELETES_IN_FLIGHT] = json!(named);
        }
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
    }

    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names `delete` in flight, to be carried by the next write with `ledger` or a newer
    /// one.
    fn name(&self, (ledger, generation): (&str, u64), delete: &InFlight) -> Result<(), NotNamed> {
        self.names.name(delete)?;
        let mut batch = self.batch();
        if batch
            .newest
            .as_ref()
            .is_none_or(|(newest, _)| generation >= *newest)
        {
            batch.newest = Some((generation, ledger.to_owned()));
        }
        Ok(())
    }

    /// The DELETEs in flight `lease` names. One it cannot read names nothing this replica can
    /// revoke: it says so, and the admission guard's fence is left to refuse them.
    fn found_on(&self, lease: &Lease) -> BTreeMap<String, InFlight> {
        let text = (lease.metadata.annotations.as_ref())
            .and_then(|annotations| annotations.get(DELETES_IN_FLIGHT));
        let Some(text) = text else {
            return BTreeMap::new();
        };
        in_flight::parse(text).unwrap_or_else(|error| {
            warn!(%error, annotation = DELETES_IN_FLIGHT, "the lease names DELETEs in flight unreadably; they cannot be revoked");
            self.metrics.ledger_fault(LedgerFault::InFlight);
            BTreeMap::new()
        })
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, (Option<String>, Option<String>)> {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed_at(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, sent: Instant) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
    }

    fn fresh(&self) -> bool {
        self.renewed_at()
            .is_some_and(|sent| sent.elapsed() < self.timing.renew_deadline)
    }

    fn step_down(&self, why: &str) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.batch().carried = None;
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
                self.metrics.api_error(Operation::Lease, &error);
                warn!(%error, "could not release the lease; a standby takes over when it expires");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_election_the_fence_always_allows() {
        assert!(Fence::unfenced().check().is_ok());
    }
}
