//! Lease-based leader election: only the leader deletes; a standby keeps its caches warm and
//! takes over when the lease expires. Without leader election this replica always leads.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::LeaderElectionConfig;

/// This replica's leadership, as a channel that flips when the lease is won or lost.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    /// Holds the channel open when election is disabled.
    _always: Option<watch::Sender<bool>>,
    manager: Option<JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>>,
}

impl Leadership {
    /// Starts competing for the lease (or leads at once when election is disabled).
    pub async fn start(
        client: Client,
        config: &LeaderElectionConfig,
        namespace: &str,
        identity: String,
    ) -> Result<Self, LeaseManagerError> {
        if !config.enabled {
            let (always, leading) = watch::channel(true);
            return Ok(Self {
                leading,
                _always: Some(always),
                manager: None,
            });
        }
        let duration = config.lease_duration.as_secs().max(1);
        // Renew a third of the way before expiry, as client-go's defaults do.
        let grace = (duration / 3).max(1);
        info!(lease = %config.lease_name, %namespace, %identity, duration, "competing for the lease");
        let manager = LeaseManagerBuilder::new(client, config.lease_name.clone())
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(duration)
            .with_grace(grace)
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        Ok(Self {
            leading,
            _always: None,
            manager: Some(task),
        })
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Releases the lease so a standby takes over at once instead of after expiry. Every
    /// receiver from [`Leadership::subscribe`] must be dropped first: the manager releases
    /// when its channel closes.
    pub async fn release(self) {
        let Self {
            leading, manager, ..
        } = self;
        drop(leading);
        if let Some(manager) = manager {
            match manager.await {
                Ok(Ok(_)) => info!("released the lease"),
                Ok(Err(error)) => warn!(%error, "could not release the lease"),
                Err(error) => warn!(%error, "the lease manager task failed"),
            }
        }
    }
}
