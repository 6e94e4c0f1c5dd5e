//! The controller: watches feed the cache, changes schedule the claims they affect, and each
//! reconcile gathers facts from the cache, asks the pure policy (and, while its namespace's
//! quota is nearly exhausted, the pure quota plan), and acts through the writer — after the
//! limiter admits it and a live re-check confirms it.
//!
//! [`Controller`] holds what every concern shares: the cluster, the clock, the metrics, the
//! cache and the schedule. Each concern is a file whose type owns its state and changes it only
//! through its own operations, handing out no lock: the delete pipeline (`delete`, made of
//! `slots` (the pace, the cap and its line), `recheck` (the live re-check), `in_flight` (the
//! DELETEs that may still land) and `pressure` (quota rounds)), and `notices`. Those that tell
//! or wake return what to tell and whom to wake, and the controller does it. The rest is
//! behaviour over them: `run` (the wiring), `feed`, `reconcile` and `released` (the sweep of
//! Released volumes, whose state is its loop's).

mod delete;
mod feed;
mod in_flight;
mod notices;
mod pressure;
mod recheck;
mod reconcile;
mod released;
mod run;
mod slots;
#[cfg(test)]
mod tests;

pub use recheck::LIVE_BOUND;

pub use run::{RunError, RunOptions, run};

use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};

use crate::cluster::cache::Index;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::watches;
use crate::config::Config;
use crate::daemon::scheduler::Schedule;
use crate::decide::facts::ObjectKey;
use crate::decide::namespace::Policies;
use crate::decide::policy::Policy;
use crate::observe::metrics::Metrics;

use delete::Deletes;
use in_flight::DeletesInFlight;
use notices::Notices;

/// Everything a reconcile reads, built once: the cluster, the clock and the metrics it talks
/// to, the cache, the schedule it answers to, and the two concerns that keep state (each in
/// its own file, its state changed only through its own operations, no lock handed out).
struct Controller<C, K> {
    cluster: C,
    clock: K,
    metrics: Arc<Metrics>,
    cache: Cache,
    schedule: Schedule,
    deletes: Deletes,
    notices: Notices,
}

/// The watches' cache and the settings it is read with. The feed alone writes it
/// (`feed::apply_chunk`); everything else reads it, never across an await.
struct Cache {
    index: RwLock<Index>,
    policies: Policies,
}

impl Cache {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy for a namespace's claims: the cluster's, refined by the namespace's cached
    /// annotations when per-namespace settings are enabled.
    fn policy_in(&self, index: &Index, namespace: &str) -> Policy {
        (self.policies)
            .for_namespace(index.namespace_annotations(namespace))
            .policy
    }
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
        registry: Arc<DeletesInFlight>,
    ) -> Self {
        Controller {
            cluster,
            clock,
            metrics,
            cache: Cache {
                index: RwLock::new(watches::index(config)),
                policies: config.policies(),
            },
            schedule,
            deletes: Deletes::new(config, registry),
            notices: Notices::new(config),
        }
    }

    fn is_leader(&self) -> bool {
        self.cluster.is_leader()
    }

    /// Reconciles each of `keys` at once.
    fn wake(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for key in keys {
            self.schedule.now(key);
        }
    }
}
