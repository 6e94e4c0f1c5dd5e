//! The controller: watches feed the cache, changes schedule the claims they affect, and each
//! reconcile gathers facts from the cache, asks the pure policy (and, while its namespace's
//! quota is nearly exhausted, the pure quota plan), and acts through the writer — after the
//! limiter admits it and a live re-check confirms it.
//!
//! [`Controller`] holds what every concern shares: the cache, the cluster, the clock and the
//! schedule. Each concern is a file that owns its state: `run` (the wiring), `feed`,
//! `reconcile`, the delete pipeline (`delete`, with the live re-check in `recheck` and the
//! DELETEs already sent in `in_flight`), `pressure` (quota rounds), `notices` and `released`
//! (Released volumes).

mod delete;
mod feed;
mod in_flight;
mod notices;
mod pressure;
mod recheck;
mod reconcile;
mod released;
mod run;
#[cfg(test)]
mod tests;

pub use recheck::LIVE_BOUND;

pub use run::{RunError, RunOptions, run};

use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::cluster::cache::Index;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::watches;
use crate::config::Config;
use crate::daemon::scheduler::Schedule;
use crate::decide::namespace::Policies;
use crate::decide::policy::Policy;
use crate::observe::metrics::Metrics;

use delete::Deletes;
use in_flight::{DeletesInFlight, InFlightDeletes};
use notices::Notices;
use pressure::Pressure;
use recheck::Rechecks;
use released::Released;

/// Everything a reconcile reads, built once: the cache, the cluster and the clock it reads,
/// the schedule it answers to, and the state each concern owns.
struct Controller<C, K> {
    cluster: C,
    clock: K,
    policies: Policies,
    index: RwLock<Index>,
    metrics: Arc<Metrics>,
    schedule: Schedule,
    leading: watch::Receiver<bool>,
    deletes: Deletes,
    in_flight: InFlightDeletes,
    rechecks: Rechecks,
    pressure: Pressure,
    notices: Notices,
    released: Released,
}

/// Why a claim is deleted: the live re-check confirms that same cause, and no other.
#[derive(Debug, Clone, Copy)]
enum Cause {
    /// Its verdict is delete; the cached verdict's due instant, for the reclaim lag.
    Due(Option<DateTime<Utc>>),
    /// Its namespace's quota plan takes it (see `quota`).
    Pressure,
}

impl Cause {
    /// Where the claim waits while the cap holds: quota pressure first, then by due instant,
    /// one whose instant is not known last.
    fn place_in_line(self) -> DateTime<Utc> {
        match self {
            Cause::Pressure => DateTime::<Utc>::MIN_UTC,
            Cause::Due(due) => due.unwrap_or(DateTime::<Utc>::MAX_UTC),
        }
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    fn new(
        config: &Config,
        cluster: C,
        clock: K,
        metrics: Arc<Metrics>,
        schedule: Schedule,
        leading: watch::Receiver<bool>,
        registry: Arc<DeletesInFlight>,
    ) -> Self {
        Controller {
            cluster,
            clock,
            policies: config.policies(),
            index: RwLock::new(watches::index(config)),
            metrics,
            schedule,
            leading,
            deletes: Deletes::new(config),
            in_flight: InFlightDeletes::new(registry),
            rechecks: Rechecks::new(config),
            pressure: Pressure::new(config),
            notices: Notices::new(config),
            released: Released::default(),
        }
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// The policy for a namespace's claims: the cluster's, refined by the namespace's cached
    /// annotations when per-namespace settings are enabled.
    fn policy_in(&self, index: &Index, namespace: &str) -> Policy {
        (self.policies)
            .for_namespace(index.namespace_annotations(namespace))
            .policy
    }
}
