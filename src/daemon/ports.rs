//! What the controller needs from outside itself, as two traits: the [`Cluster`] (the live
//! re-check, the live quotas, the one DELETE, the events, the Lease's records) and the
//! [`Clock`]. The daemon runs on [`KubeCluster`] and the API server's clock; the controller's
//! unit tests run on a fake cluster and a fake clock, so its behaviour is checked without a
//! server, and the real-server tests prove the wiring.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::time::Instant;

use crate::cluster::cache::Scope;
use crate::cluster::leader::{Fence, InFlight};
use crate::cluster::live::{self, LiveView, Snapshots};
use crate::cluster::progress::{self, Delivery};
use crate::cluster::served::Served;
use crate::cluster::server_clock::ServerClock;
use crate::cluster::writer::{Answer, Mode, NotSent, Notice, Revocation, Writer};
use crate::daemon::limiter::Counted;
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::{Found, Lookup};
use crate::decide::namespace::Invalid;
use crate::decide::quota::{Pressure, QuotaEntry};
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::{Kind, Metrics};

/// The cluster as the controller sees it.
pub trait Cluster: Send + Sync + 'static {
    /// What a live re-check read.
    type Live: Lookup + Send;

    /// Reads live whatever may protect `claim`; also the instant its first read was sent.
    fn read_live(
        &self,
        claim: &ClaimFacts,
        metrics: &Metrics,
    ) -> impl Future<Output = (Self::Live, Instant)> + Send;

    /// A kind's current resourceVersion in a watch scope, read consistently (`No`: discovery,
    /// asked now, says no such object exists: an optional kind its group serves at no version).
    fn revision(
        &self,
        kind: Kind,
        scope: &Scope,
        metrics: &Metrics,
    ) -> impl Future<Output = Found<u64>> + Send;

    /// The last change of each object of a kind in a watch scope after resourceVersion
    /// `span.0`, up to `span.1` at least; `None` when they cannot be told.
    fn changes(
        &self,
        kind: Kind,
        scope: &Scope,
        span: (u64, u64),
        metrics: &Metrics,
    ) -> impl Future<Output = Option<Vec<Delivery>>> + Send;

    /// The claim as the API server has it now: its UID, and whether it is being deleted.
    fn claim_state(
        &self,
        claim: &ObjectKey,
        metrics: &Metrics,
    ) -> impl Future<Output = Found<(String, bool)>> + Send;

    /// The ResourceQuotas of a namespace, listed live.
    fn quotas(
        &self,
        namespace: &str,
        metrics: &Metrics,
    ) -> impl Future<Output = Found<Vec<QuotaEntry>>> + Send;

    /// The one DELETE of a decision, with `ledger` on the Lease first, before `deadline`.
    fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: &Counted,
        deadline: Instant,
        metrics: &Metrics,
    ) -> impl Future<Output = Result<Answer, NotSent>> + Send;

    /// Revokes a DELETE without a definite answer by changing its claim (see
    /// [`Writer::revoke`]).
    fn revoke(
        &self,
        delete: &InFlight,
        metrics: &Metrics,
    ) -> impl Future<Output = Revocation> + Send;

    /// A DELETE without a definite answer can no longer land: its claim was found gone,
    /// re-created or being deleted. It leaves the Lease.
    fn settle(&self, delete: &InFlight);

    /// The DELETEs in flight the Lease named when this replica won it.
    fn found_in_flight(&self) -> Vec<InFlight>;

    fn notify(
        &self,
        claim: &ClaimFacts,
        notice: Notice,
        metrics: &Metrics,
    ) -> impl Future<Output = ()> + Send;

    fn notify_quota_pressure(
        &self,
        pressure: &Pressure,
        metrics: &Metrics,
    ) -> impl Future<Output = ()> + Send;

    /// A warning on a Namespace whose workspace-gc annotations are not understood.
    fn notify_namespace(
        &self,
        namespace: &str,
        invalid: &[Invalid],
        metrics: &Metrics,
    ) -> impl Future<Output = ()> + Send;

    /// A Namespace's annotations, read live; `None` when it cannot be read.
    fn namespace_annotations(
        &self,
        namespace: &str,
        metrics: &Metrics,
    ) -> impl Future<Output = Option<BTreeMap<String, String>>> + Send;

    /// A PersistentVolume, read live; `None` when it cannot be read.
    fn volume(
        &self,
        volume: &str,
        metrics: &Metrics,
    ) -> impl Future<Output = Option<VolumeFacts>> + Send;

    /// Every PersistentVolume; `None` when they cannot be listed.
    fn volumes(&self, metrics: &Metrics) -> impl Future<Output = Option<Vec<VolumeFacts>>> + Send;

    /// Writes the UID of the claim just deleted on its volume (see [`Writer::mark_volume`]);
    /// the volume as marked, `None` if not.
    fn mark_volume(
        &self,
        volume: &VolumeFacts,
        claim_uid: &str,
        metrics: &Metrics,
    ) -> impl Future<Output = Option<VolumeFacts>> + Send;

    /// Deletes a Released volume as judged (see [`Writer::delete_volume`]).
    fn delete_volume(
        &self,
        volume: &VolumeFacts,
        deadline: Instant,
        metrics: &Metrics,
    ) -> impl Future<Output = Result<Answer, NotSent>> + Send;

    /// Whether the API server answers at all.
    fn answers(&self) -> impl Future<Output = bool> + Send;

    fn mode(&self) -> Mode;

    /// How long after its last Lease write this replica may still send a DELETE.
    fn reach(&self) -> Duration;

    /// The deletion ledger found on the Lease when it was won.
    fn found_ledger(&self) -> Option<String>;

    /// The quota pressure rounds found on the Lease when it was won.
    fn found_rounds(&self) -> Option<String>;

    /// Quota pressure's rounds, to be written with the next ledger.
    fn stage_rounds(&self, rounds: String);
}

/// The clocks the controller reads.
pub trait Clock: Send + Sync + 'static {
    /// The instant deadlines are judged at (never later than the API server's clock).
    fn now(&self) -> DateTime<Utc>;
    /// The earliest and the latest the API server's clock can read now (this replica's clock,
    /// twice, before any answer). The blast-radius ledger, shared by every replica through the
    /// Lease, is dated by it: a deletion at the latest, the window judged at the earliest, so
    /// it never counts shorter than the server saw it, however the replicas' clocks disagree.
    fn server(&self) -> (DateTime<Utc>, DateTime<Utc>);
    /// The monotonic instant at which a deadline is met, as [`Clock::now`] judges it.
    fn instant_at(&self, deadline: DateTime<Utc>) -> Instant;
}

impl Clock for ServerClock {
    fn now(&self) -> DateTime<Utc> {
        ServerClock::now(self)
    }

    fn server(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        self.server_bounds().map_or_else(
            || (Utc::now(), Utc::now()),
            |bounds| (bounds.earliest, bounds.latest),
        )
    }

    fn instant_at(&self, deadline: DateTime<Utc>) -> Instant {
        ServerClock::instant_at(self, deadline)
    }
}

/// The real cluster: reads through the client, writes through the [`Writer`].
pub struct KubeCluster {
    pub client: Client,
    pub writer: Writer,
    pub fence: Fence,
    pub snapshots: Snapshots,
    /// Where each owner kind is read, shared with the watches.
    pub served: Served,
}

impl Cluster for KubeCluster {
    type Live = LiveView;

    async fn read_live(&self, claim: &ClaimFacts, metrics: &Metrics) -> (LiveView, Instant) {
        let (client, served) = (&self.client, &self.served);
        let live = LiveView::read(client, served, claim, &self.snapshots, metrics).await;
        let read_at = live.read_at();
        (live, read_at)
    }

    async fn revision(&self, kind: Kind, scope: &Scope, metrics: &Metrics) -> Found<u64> {
        progress::revision(&self.client, &self.served, kind, scope, Some(metrics)).await
    }

    async fn changes(
        &self,
        kind: Kind,
        scope: &Scope,
        span: (u64, u64),
        metrics: &Metrics,
    ) -> Option<Vec<Delivery>> {
        progress::changes(&self.client, &self.served, kind, scope, span, metrics).await
    }

    async fn claim_state(&self, claim: &ObjectKey, metrics: &Metrics) -> Found<(String, bool)> {
        live::claim_state(&self.client, claim, metrics).await
    }

    async fn quotas(&self, namespace: &str, metrics: &Metrics) -> Found<Vec<QuotaEntry>> {
        live::quotas(&self.client, namespace, metrics).await
    }

    async fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: &Counted,
        deadline: Instant,
        metrics: &Metrics,
    ) -> Result<Answer, NotSent> {
        let text = ledger.ledger.to_annotation();
        let ledger = (text.as_str(), ledger.generation);
        self.writer.delete(claim, ledger, deadline, metrics).await
    }

    async fn revoke(&self, delete: &InFlight, metrics: &Metrics) -> Revocation {
        self.writer.revoke(delete, metrics).await
    }

    fn settle(&self, delete: &InFlight) {
        self.writer.settle(delete);
    }

    fn found_in_flight(&self) -> Vec<InFlight> {
        self.fence.found_in_flight()
    }

    async fn notify(&self, claim: &ClaimFacts, notice: Notice, metrics: &Metrics) {
        self.writer.notify(claim, notice, metrics).await;
    }

    async fn notify_quota_pressure(&self, pressure: &Pressure, metrics: &Metrics) {
        self.writer.notify_quota_pressure(pressure, metrics).await;
    }

    async fn notify_namespace(&self, namespace: &str, invalid: &[Invalid], metrics: &Metrics) {
        (self.writer)
            .notify_namespace(namespace, invalid, metrics)
            .await;
    }

    async fn namespace_annotations(
        &self,
        namespace: &str,
        metrics: &Metrics,
    ) -> Option<BTreeMap<String, String>> {
        live::namespace_annotations(&self.client, namespace, metrics).await
    }

    async fn volume(&self, volume: &str, metrics: &Metrics) -> Option<VolumeFacts> {
        live::volume(&self.client, volume, metrics).await
    }

    async fn volumes(&self, metrics: &Metrics) -> Option<Vec<VolumeFacts>> {
        live::volumes(&self.client, metrics).await
    }

    async fn mark_volume(
        &self,
        volume: &VolumeFacts,
        claim_uid: &str,
        metrics: &Metrics,
    ) -> Option<VolumeFacts> {
        self.writer.mark_volume(volume, claim_uid, metrics).await
    }

    async fn delete_volume(
        &self,
        volume: &VolumeFacts,
        deadline: Instant,
        metrics: &Metrics,
    ) -> Result<Answer, NotSent> {
        self.writer.delete_volume(volume, deadline, metrics).await
    }

    async fn answers(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.client.apiserver_version()).await,
            Ok(Ok(_))
        )
    }

    fn mode(&self) -> Mode {
        self.writer.mode()
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
