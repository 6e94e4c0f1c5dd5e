//! The real cluster behind the controller's ports (`cluster::ports`): reads through the client
//! (`live`, `progress`), writes through the [`Writer`], the Lease's records through the
//! [`Fence`]; every request counted in the metrics it was built with.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::cache::Scope;
use crate::cluster::in_flight::{InFlight, Revocation};
use crate::cluster::leader::Fence;
use crate::cluster::live::{self, LiveView, Snapshots};
use crate::cluster::ports::{LeaseRecords, LiveReads, Writes};
use crate::cluster::progress::{self, Delivery};
use crate::cluster::served::Served;
use crate::cluster::writer::{Answer, Mode, NamespaceNotice, NotSent, Notice, Writer};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::Found;

use crate::decide::quota::{Pressure, QuotaEntry};
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::{Kind, Metrics};

/// The real cluster: reads through the client, writes through the [`Writer`].
pub struct KubeCluster {
    pub client: Client,
    pub writer: Writer,
    pub fence: Fence,
    /// Whether this replica holds the Lease, as the elector publishes it.
    pub leading: watch::Receiver<bool>,
    pub snapshots: Snapshots,
    /// Where each owner kind is read, shared with the watches.
    pub served: Served,
    /// Where every request it sends is counted, from its construction.
    pub metrics: Arc<Metrics>,
}

impl LiveReads for KubeCluster {
    type Live = LiveView;

    async fn read_live(&self, claim: &ClaimFacts) -> (LiveView, Instant) {
        let (client, served) = (&self.client, &self.served);
        let live = LiveView::read(client, served, claim, &self.snapshots, &self.metrics).await;
        let read_at = live.read_at();
        (live, read_at)
    }

    async fn revision(&self, kind: Kind, scope: &Scope) -> Found<u64> {
        progress::revision(&self.client, &self.served, kind, scope, Some(&self.metrics)).await
    }

    async fn changes(&self, kind: Kind, scope: &Scope, span: (u64, u64)) -> Option<Vec<Delivery>> {
        progress::changes(&self.client, &self.served, kind, scope, span, &self.metrics).await
    }

    async fn claim_state(&self, claim: &ObjectKey) -> Found<(String, bool)> {
        live::claim_state(&self.client, claim, &self.metrics).await
    }

    async fn quotas(&self, namespace: &str) -> Found<Vec<QuotaEntry>> {
        live::quotas(&self.client, namespace, &self.metrics).await
    }

    async fn namespace_annotations(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        live::namespace_annotations(&self.client, namespace, &self.metrics).await
    }

    async fn volume(&self, volume: &str) -> Option<VolumeFacts> {
        live::volume(&self.client, volume, &self.metrics).await
    }

    async fn volumes(&self) -> Option<Vec<VolumeFacts>> {
        live::volumes(&self.client, &self.metrics).await
    }

    async fn answers(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.client.apiserver_version()).await,
            Ok(Ok(_))
        )
    }
}

impl Writes for KubeCluster {
    async fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: (&str, u64),
        deadline: Instant,
    ) -> Result<Answer, NotSent> {
        self.writer
            .delete(claim, ledger, deadline, &self.metrics)
            .await
    }

    async fn revoke(&self, delete: &InFlight) -> Revocation {
        self.writer.revoke(delete, &self.metrics).await
    }

    async fn notify(&self, claim: &ClaimFacts, notice: Notice) {
        self.writer.notify(claim, notice, &self.metrics).await;
    }

    async fn notify_quota_pressure(&self, pressure: &Pressure) {
        self.writer
            .notify_quota_pressure(pressure, &self.metrics)
            .await;
    }

    async fn notify_namespace(&self, namespace: &str, notice: &NamespaceNotice) {
        (self.writer)
            .notify_namespace(namespace, notice, &self.metrics)
            .await;
    }

    async fn mark_volume(&self, volume: &VolumeFacts, claim_uid: &str) -> Option<VolumeFacts> {
        self.writer
            .mark_volume(volume, claim_uid, &self.metrics)
            .await
    }

    async fn delete_volume(
        &self,
        volume: &VolumeFacts,
        deadline: Instant,
    ) -> Result<Answer, NotSent> {
        self.writer
            .delete_volume(volume, deadline, &self.metrics)
            .await
    }

    fn mode(&self) -> Mode {
        self.writer.mode()
    }
}

impl LeaseRecords for KubeCluster {
    fn leadership(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    fn reach(&self) -> Duration {
        self.fence.reach()
    }

    fn found_ledger(&self) -> Option<String> {
        self.fence.found()
    }

    fn found_rounds(&self) -> Option<String> {
        self.fence.found_rounds()
    }

    fn stage_rounds(&self, rounds: String) {
        self.fence.stage_rounds(rounds);
    }
}
