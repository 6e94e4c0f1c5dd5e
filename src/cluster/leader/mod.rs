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
//!   revocation is answered. A Lease created again names them as it carries the ledger: the
//!   leader's registry says what may land, a standby remembers what the Lease named.
//! - While this replica leads, its own ledger is the record of what it deleted, whatever the
//!   Lease says (RELIABILITY.md, "The ledger rule": written back when changed, remembered by a
//!   standby, written with a Lease created again after `kubectl delete lease`).

//!
//! The parts: `election.rs` (standing by or leading, and the transitions between), `commit.rs`
//! (the group commit of the Lease writes that record DELETEs), `records.rs` (every record the
//! Lease carries, one codec), over the `LeaseStore` of `store.rs` (`kube_store.rs` on the API
//! server, a fake in the unit tests, `tests.rs`).

mod commit;
mod election;
mod kube_store;
mod records;
mod store;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::in_flight::{InFlight, LeaseNames, NotNamed};
use crate::config::LeaderElectionConfig;
use crate::observe::metrics::Metrics;

use election::Elector;
use kube_store::KubeLeaseStore;
use store::LeaseStore;

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
        let store = KubeLeaseStore::new(client, namespace, config.lease_name.clone());
        Self::elect(Arc::new(store), timing, identity, metrics, names)
    }

    /// Competes for the Lease `store` holds.
    fn elect(
        store: Arc<dyn LeaseStore>,
        timing: Timing,
        identity: String,
        metrics: Arc<Metrics>,
        names: Arc<dyn LeaseNames>,
    ) -> Self {
        let (elector, leading) = Elector::new(store, timing, identity, metrics, names);
        let elector = Arc::new(elector);
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
        self.elector
            .as_ref()
            .map_or(Ok(()), |elector| elector.check())
    }

    /// Until when this replica may write: its last successful Lease write's sending plus the
    /// renew deadline (now, when it does not lead). `None` without leader election.
    pub fn until(&self) -> Option<Instant> {
        let elector = self.elector.as_ref()?;
        let renewed = elector.renewed_at();
        Some(renewed.map_or_else(Instant::now, |sent| sent + elector.timing().renew_deadline))
    }

    /// How long after this replica's last successful Lease write it may still send a DELETE:
    /// the renew deadline ([`Fence::check`]). Zero without leader election (no Lease).
    pub fn reach(&self) -> Duration {
        self.elector
            .as_ref()
            .map_or(Duration::ZERO, |elector| elector.timing().renew_deadline)
    }

    /// Has `ledger` (the cap's count as its annotation, `Ledger::to_annotation`, and its
    /// generation, `Limiter::ledger_for`) written to the Lease, renewing it: before a delete,
    /// with that delete counted and named in flight. Fails unless this replica holds the lease
    /// at that moment, as the API server sees it.
    ///
    /// DELETEs recorded at the same time share one write (a group commit, `commit.rs`).
    pub async fn record(&self, ledger: (&str, u64), delete: &InFlight) -> Result<(), FenceError> {
        match &self.elector {
            None => Ok(()),
            Some(elector) => elector.record(ledger, delete).await,
        }
    }

    /// Hands over quota pressure's rounds (`annotations::QUOTA_ROUNDS`), to be written in the
    /// same patch as the next ledger [`Fence::record`] writes.
    pub fn stage_rounds(&self, rounds: String) {
        if let Some(elector) = &self.elector {
            elector.kept(|kept| kept.staged_rounds = Some(rounds));
        }
    }

    /// The quota pressure rounds found on the Lease when it was last won, if it had them.
    pub fn found_rounds(&self) -> Option<String> {
        self.elector
            .as_ref()?
            .kept(|kept| kept.found_rounds.clone())
    }

    /// The deletion ledger found on the Lease when it was last won, or if it had none, the
    /// last this replica read there before (the Lease was deleted and created again).
    pub fn found(&self) -> Option<String> {
        self.elector.as_ref()?.kept(|kept| kept.ledger.clone())
    }
}
