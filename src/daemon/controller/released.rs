//! The sweep of Released volumes whose claims the daemon deleted, once their TTL has passed
//! (`deletion.released_volume_ttl`); the pure `decide::volumes` judges each.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::Answer;
use crate::decide::volumes::{self, Kept, VolumeVerdict};
use crate::observe::metrics::Sweep;

use super::Controller;
use super::recheck::LIVE_BOUND;

/// How often the leader looks for Released volumes to delete: half their TTL, within 1 s and
/// 1 min (a list of every PersistentVolume, from the API server's cache).
pub(super) fn sweep_every(ttl: Duration) -> Duration {
    (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Deletes, as the leader, the Released volumes whose claims it deleted, `ttl` after their
/// release (`deletion.released_volume_ttl`), until `stop`.
pub(super) async fn sweep_released<C: Cluster, K: Clock>(
    controller: Arc<Controller<C, K>>,
    ttl: Duration,
    stop: CancellationToken,
) {
    let every = sweep_every(ttl);
    let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
    // Released volumes warned about (by UID) for a transition time not known: once each.
    let mut unjudged = BTreeSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if controller.is_leader() {
            controller.sweep(ttl, &mut unjudged).await;
        }
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// One look at every PersistentVolume: each the pure judgement lets go is deleted with its
    /// UID and resourceVersion as listed as the DELETE's preconditions; one Released since a
    /// time not known is kept, with a warning once (`unjudged` holds those warned about).
    /// Counted by how it ended.
    pub(super) async fn sweep(&self, ttl: chrono::Duration, unjudged: &mut BTreeSet<String>) {
        let Some(listed) = self.cluster.volumes().await else {
            debug!("cannot list PersistentVolumes; Released volumes are looked at again later");
            self.metrics.volume_sweep(Sweep::Unlisted);
            return;
        };
        let now = self.clock.now();
        for volume in listed {
            match volumes::judge(&volume, ttl, now) {
                VolumeVerdict::Delete => {
                    let deadline = Instant::now() + LIVE_BOUND;
                    let sent = self.cluster.delete_volume(&volume, deadline);
                    match sent.await {
                        // A dry run counts nothing (and marks nothing: only a mark left by an
                        // earlier real run makes a volume due then).
                        Ok(Answer::Dry(result)) => {
                            info!(volume = %volume.name, result = result.as_str(), "dry-run: would delete Released volume");
                        }
                        Ok(Answer::Real(result)) => {
                            self.metrics.volume_deletion(result);
                            info!(volume = %volume.name, claim_uid = volume.claim_uid.as_deref().unwrap_or(""), result = result.as_str(), "Released volume deleted");
                        }
                        Err(error) => {
                            info!(volume = %volume.name, %error, "Released volume not deleted; looked at again later");
                            self.metrics.volume_sweep(Sweep::Interrupted);
                            return;
                        }
                    }
                }
                VolumeVerdict::Keep(kept @ Kept::TransitionUnknown(_)) => {
                    if unjudged.insert(volume.uid.clone()) {
                        warn!(volume = %volume.name, %kept, "Released volume kept");
                    }
                }
                VolumeVerdict::Keep(_) => {}
            }
        }
        self.metrics.volume_sweep(Sweep::Completed);
    }
}
