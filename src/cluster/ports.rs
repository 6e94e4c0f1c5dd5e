//! What the controller needs from outside itself, as ports: the cluster, by role ([`LiveReads`],
//! [`Writes`], [`LeaseRecords`], together a [`Cluster`]), and the [`Clock`]. The daemon runs on
//! [`KubeCluster`](crate::cluster::adapter::KubeCluster) and the API server's clock; the
//! controller's unit tests run on a fake cluster and a fake clock, so its behaviour is checked
//! without a server, and the real-server tests prove the wiring. Each implementation counts
//! its requests in the metrics it was built with.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::cache::Scope;
use crate::cluster::in_flight::{InFlight, Revocation};
use crate::cluster::progress::Delivery;
use crate::cluster::server_clock::{Dispute, ServerClock};
use crate::cluster::writer::{Answer, Mode, NamespaceNotice, NotSent, Notice};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::{Found, Lookup};
use crate::decide::quota::{Pressure, QuotaEntry};
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::Kind;

/// The cluster as the controller sees it: its live reads, its writes, and its Lease's records.
pub trait Cluster: LiveReads + Writes + LeaseRecords {}

impl<T: LiveReads + Writes + LeaseRecords> Cluster for T {}

/// What the controller reads live, past the cache: the re-check before a DELETE, the proof of
/// the cache's freshness, quotas, namespaces and volumes.
pub trait LiveReads: Send + Sync + 'static {
    /// What a live re-check read.
    type Live: Lookup + Send;

    /// Reads live whatever may protect `claim`; also the instant its first read was sent.
    fn read_live(&self, claim: &ClaimFacts) -> impl Future<Output = (Self::Live, Instant)> + Send;

    /// A kind's current resourceVersion in a watch scope, read consistently (`No`: discovery,
    /// asked now, says no such object exists: an optional kind its group serves at no version).
    fn revision(&self, kind: Kind, scope: &Scope) -> impl Future<Output = Found<u64>> + Send;

    /// The last change of each object of a kind in a watch scope after resourceVersion
    /// `span.0`, up to `span.1` at least; `None` when they cannot be told.
    fn changes(
        &self,
        kind: Kind,
        scope: &Scope,
        span: (u64, u64),
    ) -> impl Future<Output = Option<Vec<Delivery>>> + Send;

    /// The claim as the API server has it now: its UID, and whether it is being deleted.
    fn claim_state(&self, claim: &ObjectKey) -> impl Future<Output = Found<(String, bool)>> + Send;

    /// The ResourceQuotas of a namespace, listed live.
    fn quotas(&self, namespace: &str) -> impl Future<Output = Found<Vec<QuotaEntry>>> + Send;

    /// A Namespace's annotations, read live; `None` when it cannot be read.
    fn namespace_annotations(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Option<BTreeMap<String, String>>> + Send;

    /// A PersistentVolume, read live; `None` when it cannot be read.
    fn volume(&self, volume: &str) -> impl Future<Output = Option<VolumeFacts>> + Send;

    /// Every PersistentVolume; `None` when they cannot be listed.
    fn volumes(&self) -> impl Future<Output = Option<Vec<VolumeFacts>>> + Send;

    /// Whether the API server answers at all.
    fn answers(&self) -> impl Future<Output = bool> + Send;
}

/// What the controller changes in the cluster, all through the writer: the one DELETE of a
/// decision, its revocation, events, and volume marks and deletes.
pub trait Writes: Send + Sync + 'static {
    /// The one DELETE of a decision, with `ledger` on the Lease first, before `deadline`.
    fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: (&str, u64),
        deadline: Instant,
    ) -> impl Future<Output = Result<Answer, NotSent>> + Send;

    /// Revokes a DELETE without a definite answer by changing its claim (see
    /// [`Writer::revoke`](crate::cluster::writer::Writer::revoke)).
    fn revoke(&self, delete: &InFlight) -> impl Future<Output = Revocation> + Send;

    fn notify(&self, claim: &ClaimFacts, notice: Notice) -> impl Future<Output = ()> + Send;

    fn notify_quota_pressure(&self, pressure: &Pressure) -> impl Future<Output = ()> + Send;

    /// A warning on a Namespace.
    fn notify_namespace(
        &self,
        namespace: &str,
        notice: &NamespaceNotice,
    ) -> impl Future<Output = ()> + Send;

    /// Writes the UID of the claim just deleted on its volume (see [`Writer::mark_volume`](crate::cluster::writer::Writer::mark_volume));
    /// the volume as marked, `None` if not.
    fn mark_volume(
        &self,
        volume: &VolumeFacts,
        claim_uid: &str,
    ) -> impl Future<Output = Option<VolumeFacts>> + Send;

    /// Deletes a Released volume as judged (see [`Writer::delete_volume`](crate::cluster::writer::Writer::delete_volume)).
    fn delete_volume(
        &self,
        volume: &VolumeFacts,
        deadline: Instant,
    ) -> impl Future<Output = Result<Answer, NotSent>> + Send;

    fn mode(&self) -> Mode;
}

/// The Lease as the controller sees it: whether this replica holds it, what it keeps there
/// besides the DELETEs in flight (those are the registry's, `cluster::in_flight`): the cap's
/// ledger and quota pressure's rounds, and how long the fence lets a DELETE go after a Lease
/// write.
pub trait LeaseRecords: Send + Sync + 'static {
    /// Whether this replica holds the Lease, as the elector publishes it.
    fn leadership(&self) -> watch::Receiver<bool>;

    /// Whether this replica holds the Lease now.
    fn is_leader(&self) -> bool {
        *self.leadership().borrow()
    }

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
    /// The hold of the cap standing now: answers of the API server disagreed beyond the
    /// tolerance within the last window. The cap's ledger is dated by the estimate, so after
    /// such a jump it could forget deletions dated on the other clock.
    fn dispute(&self) -> Option<Dispute>;
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

    fn dispute(&self) -> Option<Dispute> {
        ServerClock::dispute(self)
    }
}
