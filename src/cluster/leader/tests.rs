//! The election on paused time, over a fake Lease store that applies each write as the API
//! server does (a merge patch on its resourceVersion precondition, 409 otherwise).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::store::{Change, LeaseStore, StoreError};
use super::{Fence, FenceError, Leadership, Timing};
use crate::cluster::in_flight::{InFlight, LeaseNames, Registry, Sent, Shared};
use crate::contract::annotations::{DELETES_IN_FLIGHT, DELETIONS, QUOTA_ROUNDS};
use crate::observe::metrics::Metrics;

/// Retry 2 s, renew deadline 10.67 s.
const LEASE: Duration = Duration::from_secs(16);

/// How the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Serve,
    /// 500 Internal Server Error to every request.
    Fail,
    /// No answer to any request (a partition).
    Hang,
}

pub(crate) struct Fake {
    lease: Option<Lease>,
    version: u64,
    answer: Answer,
    /// Another replica takes the Lease just before the next write arrives.
    rival: Option<String>,
    /// When each write was refused with a 409.
    conflicts: Vec<Instant>,
    /// When the last successful write arrived.
    written_at: Option<Instant>,
    /// Told every Lease stored, the instant it is stored.
    watcher: Option<Watcher>,
}

/// What is told every Lease the fake stores.
type Watcher = Box<dyn Fn(&Lease) + Send>;

/// The Lease on a fake API server.
pub(crate) struct FakeStore(Mutex<Fake>);

impl FakeStore {
    pub(crate) fn new(lease: Option<Lease>) -> Arc<Self> {
        let mut fake = Fake {
            lease: None,
            version: 1,
            answer: Answer::Serve,
            rival: None,
            conflicts: Vec::new(),
            written_at: None,
            watcher: None,
        };
        if let Some(lease) = lease {
            fake.stored(lease);
        }
        Arc::new(Self(Mutex::new(fake)))
    }

    fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.0.lock().expect("the fake's lock")
    }

    fn answer(&self, answer: Answer) {
        self.fake().answer = answer;
    }

    /// Another replica takes the Lease just before the next write arrives, and then stops
    /// renewing it (it revokes nothing): this one steps down, and takes it back once it
    /// expired.
    pub(crate) fn taken_by_rival(&self) {
        self.fake().rival = Some("rival".into());
    }

    /// The Lease is deleted (`kubectl delete lease`, its namespace re-created): whoever reads
    /// it next creates it again.
    pub(crate) fn remove(&self) {
        self.fake().lease = None;
    }

    /// Tells `watcher` every Lease stored from now on, as it is stored.
    pub(crate) fn watch(&self, watcher: impl Fn(&Lease) + Send + 'static) {
        self.fake().watcher = Some(Box::new(watcher));
    }

    fn lease(&self) -> Lease {
        self.fake().lease.clone().expect("a Lease")
    }

    fn annotation(&self, key: &str) -> Option<String> {
        (self.lease().metadata.annotations).and_then(|annotations| annotations.get(key).cloned())
    }

    fn holder(&self) -> Option<String> {
        self.lease().spec.and_then(|spec| spec.holder_identity)
    }

    fn written_at(&self) -> Instant {
        self.fake().written_at.expect("a write")
    }

    /// The answer due now; `None`: none comes.
    async fn answering(&self) -> Result<(), StoreError> {
        let answer = self.fake().answer;
        match answer {
            Answer::Serve => Ok(()),
            Answer::Fail => Err(StoreError::Api(api_error(500))),
            Answer::Hang => std::future::pending().await,
        }
    }
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status {
        code,
        ..kube::core::Status::default()
    }))
}

/// RFC 7386, as the API server applies a merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("an object");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

impl Fake {
    fn stored(&mut self, mut lease: Lease) -> Lease {
        self.version += 1;
        lease.metadata.resource_version = Some(self.version.to_string());
        self.lease = Some(lease.clone());
        self.written_at = Some(Instant::now());
        if let Some(watcher) = &self.watcher {
            watcher(&lease);
        }
        lease
    }
}

impl LeaseStore for FakeStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        async move {
            self.answering().await?;
            Ok(self.fake().lease.clone())
        }
        .boxed()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            self.answering().await?;
            let mut fake = self.fake();
            if fake.lease.is_some() {
                return Err(StoreError::Conflict(api_error(409)));
            }
            Ok(fake.stored(lease))
        }
        .boxed()
    }

    fn replace(&self, change: Change) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            self.answering().await?;
            let mut fake = self.fake();
            if fake.lease.is_none() {
                return Err(StoreError::Api(api_error(404)));
            }
            if let Some(rival) = fake.rival.take() {
                let mut lease = fake.lease.clone().expect("a Lease to take");
                lease.spec = Some(held_by(&rival).spec.expect("a spec"));
                fake.stored(lease);
            }
            let current = fake.lease.clone().expect("a Lease to write");
            if change.resource_version != current.metadata.resource_version {
                fake.conflicts.push(Instant::now());
                return Err(StoreError::Conflict(api_error(409)));
            }
            let mut lease = serde_json::to_value(&current).expect("serialises");
            merge(&mut lease, &change.to_merge_patch());
            Ok(fake.stored(serde_json::from_value(lease).expect("a Lease")))
        }
        .boxed()
    }
}

/// A Lease as `holder` renews it now.
fn held_by(holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_duration_seconds: Some(16),
            ..LeaseSpec::default()
        }),
    }
}

type Names = Shared<()>;

/// A replica named `identity` competing for the Lease in `store` with `names` as its registry,
/// on the timing of these tests (a lease of 16 s): for the controller's model.
pub(crate) fn compete(
    store: &Arc<FakeStore>,
    identity: &str,
    names: Arc<dyn LeaseNames>,
) -> Leadership {
    let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
    Leadership::elect(
        store.clone(),
        Timing::new(LEASE),
        identity.to_owned(),
        Arc::new(metrics),
        names,
    )
}

/// A replica named `identity` competing for the Lease in `store`.
fn elect(store: &Arc<FakeStore>, identity: &str) -> (Leadership, Arc<Names>) {
    let names = Arc::new(Mutex::new(Registry::default()));
    let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
    let leadership = Leadership::elect(
        store.clone(),
        Timing::new(LEASE),
        identity.to_owned(),
        Arc::new(metrics),
        names.clone(),
    );
    (leadership, names)
}

/// `me`, once it leads over `store`.
async fn leader(store: &Arc<FakeStore>) -> (Leadership, Arc<Names>) {
    let (leadership, names) = elect(store, "me");
    leading(&leadership).await;
    (leadership, names)
}

async fn leading(leadership: &Leadership) {
    let mut leading = leadership.subscribe();
    leading.wait_for(|leading| *leading).await.expect("open");
}

fn delete(i: u32) -> InFlight {
    InFlight {
        namespace: "ml".into(),
        name: format!("nb-{i}-build-workspace"),
        uid: format!("u{i}"),
        resource_version: format!("{i}"),
    }
}

fn named(store: &FakeStore) -> Vec<String> {
    named_on(&store.lease())
}

/// The claim UIDs `lease` names in flight.
pub(crate) fn named_on(lease: &Lease) -> Vec<String> {
    let text = (lease.metadata.annotations.as_ref())
        .and_then(|annotations| annotations.get(DELETES_IN_FLIGHT).cloned());
    let named: Vec<InFlight> =
        text.map_or_else(Vec::new, |t| serde_json::from_str(&t).expect("a list"));
    named.into_iter().map(|delete| delete.uid).collect()
}

/// A 409 on a renewal (another replica wrote the Lease in between) closes the fence and stops
/// leading at once: not at the next round, not at the renew deadline.
#[tokio::test(start_paused = true)]
async fn a_conflict_on_renewal_steps_down_at_once() {
    let store = FakeStore::new(None);
    let (leadership, _) = leader(&store).await;
    let fence = leadership.fence();
    assert!(fence.check().is_ok());
    let retry = Timing::new(LEASE).retry;

    store.fake().rival = Some("rival".into());
    let mut leading = leadership.subscribe();
    let within = Instant::now() + LEASE;
    tokio::time::timeout_at(within, leading.wait_for(|leading| !*leading))
        .await
        .expect("stepped down")
        .expect("open");
    let stepped = Instant::now();
    let conflict = *store.fake().conflicts.first().expect("a 409");
    assert!(
        stepped - conflict < retry / 2,
        "stepped down {:?} after the 409",
        stepped - conflict
    );
    assert!(matches!(fence.check(), Err(FenceError::NotLeading)));
    assert_eq!(
        store.holder().as_deref(),
        Some("rival"),
        "left to the rival"
    );
}

/// A 409 on the write that records a DELETE (another replica wrote the Lease in between) is
/// `Lost`: the replica steps down at once, and the DELETE, not sent, is named no more.
#[tokio::test(start_paused = true)]
async fn a_conflict_on_recording_a_delete_steps_down_and_names_it_no_more() {
    let store = FakeStore::new(None);
    let (leadership, names) = leader(&store).await;
    let fence = leadership.fence();
    store.fake().rival = Some("rival".into());
    let lost = fence.record(("ledger-1", 1), &delete(1)).await;
    assert!(matches!(lost, Err(FenceError::Lost)), "{lost:?}");
    assert!(!*leadership.subscribe().borrow(), "stepped down");
    assert!(matches!(fence.check(), Err(FenceError::NotLeading)));
    assert!(names.on_lease().is_empty(), "not named");
    assert_eq!(store.holder().as_deref(), Some("rival"));
    assert_eq!(store.annotation(DELETIONS), None);
}

/// When no renewal succeeds (every request fails, or none is answered), the fence closes at
/// the renew deadline after the last successful write was sent, and the replica stops leading
/// before a standby, which waits a whole lease from when it saw that write, could take over.
#[tokio::test(start_paused = true)]
async fn without_renewals_it_steps_down_before_the_lease_could_be_taken() {
    let timing = Timing::new(LEASE);
    for answer in [Answer::Fail, Answer::Hang] {
        let store = FakeStore::new(None);
        let (leadership, _) = leader(&store).await;
        let fence = leadership.fence();
        store.answer(answer);
        let written = store.written_at();

        tokio::time::sleep_until(written + timing.renew_deadline - Duration::from_millis(1)).await;
        assert!(
            fence.check().is_ok(),
            "{answer:?}: still within the deadline"
        );
        tokio::time::sleep_until(written + timing.renew_deadline).await;
        assert!(fence.check().is_err(), "{answer:?}: past the deadline");

        let mut leading = leadership.subscribe();
        let taken = written + timing.lease;
        tokio::time::timeout_at(taken, leading.wait_for(|leading| !*leading))
            .await
            .unwrap_or_else(|_| panic!("{answer:?}: still leading when the lease could be taken"))
            .expect("open");
        assert!(fence.check().is_err(), "{answer:?}");
    }
}

/// A Lease write that fails takes back what it staged: the DELETE it was to carry is named
/// no more, the ledger known stays the last written; and the next write carries the DELETE
/// asked again, its ledger and the rounds staged before the failure.
#[tokio::test(start_paused = true)]
async fn a_failed_lease_write_rolls_back_what_it_staged() {
    let store = FakeStore::new(None);
    let (leadership, names) = leader(&store).await;
    let fence = leadership.fence();
    fence
        .record(("ledger-1", 1), &delete(1))
        .await
        .expect("recorded");
    names
        .lock()
        .expect("lock")
        .sent(&delete(1), Sent::Carried, None);
    assert_eq!(named(&store), ["u1"]);

    fence.stage_rounds("rounds-2".into());
    store.answer(Answer::Fail);
    let failed = fence.record(("ledger-2", 2), &delete(2)).await;
    assert!(matches!(failed, Err(FenceError::Write(_))), "{failed:?}");
    assert!(
        names.on_lease().is_empty(),
        "the DELETE not sent is not named"
    );
    assert_eq!(
        fence.found().as_deref(),
        Some("ledger-1"),
        "the ledger written"
    );
    assert_eq!(store.annotation(DELETIONS).as_deref(), Some("ledger-1"));
    assert_eq!(store.annotation(QUOTA_ROUNDS), None);

    store.answer(Answer::Serve);
    fence
        .record(("ledger-2", 2), &delete(2))
        .await
        .expect("recorded again");
    assert_eq!(store.annotation(DELETIONS).as_deref(), Some("ledger-2"));
    assert_eq!(store.annotation(QUOTA_ROUNDS).as_deref(), Some("rounds-2"));
    assert_eq!(named(&store), ["u2"]);
    assert_eq!(fence.found().as_deref(), Some("ledger-2"));
}

/// On shutdown the leader stops acting, then writes the release (holder, renew and acquire
/// times cleared; the duration and transitions stay), and a standby takes over at its next
/// round instead of after a whole lease.
#[tokio::test(start_paused = true)]
async fn release_on_shutdown_clears_the_holder_and_stops_leading() {
    let store = FakeStore::new(None);
    let (leadership, _) = leader(&store).await;
    let (standby, _) = elect(&store, "standby");
    let fence = leadership.fence();
    let following = leadership.subscribe();
    let timing = Timing::new(LEASE);
    // Between two rounds of each.
    tokio::time::sleep(timing.retry * 5 / 2).await;
    assert_eq!(store.holder().as_deref(), Some("me"));

    leadership.release().await;
    assert!(!*following.borrow(), "stopped leading");
    assert!(fence.check().is_err());
    let spec = store.lease().spec.expect("a spec");
    assert_eq!(spec.holder_identity, None);
    assert_eq!(spec.renew_time, None);
    assert_eq!(spec.acquire_time, None);
    assert_eq!(spec.lease_duration_seconds, Some(16));
    assert_eq!(spec.lease_transitions, Some(1));

    let released = Instant::now();
    leading(&standby).await;
    assert!(Instant::now() - released <= timing.retry, "taken at once");
    assert_eq!(store.holder().as_deref(), Some("standby"));
}

/// Without election the fence allows and records nothing; a fence whose election does not
/// hold the Lease refuses, and what it was asked to record is not named.
#[tokio::test(start_paused = true)]
async fn the_unfenced_fence_allows_and_one_without_the_lease_refuses() {
    let unfenced = Fence::unfenced();
    assert!(unfenced.check().is_ok());
    assert_eq!(unfenced.until(), None);
    assert_eq!(unfenced.reach(), Duration::ZERO);
    assert!(unfenced.record(("ledger", 1), &delete(1)).await.is_ok());

    let store = FakeStore::new(Some(held_by("rival")));
    let (leadership, names) = elect(&store, "me");
    let timing = Timing::new(LEASE);
    tokio::time::sleep(timing.retry * 2).await;
    let fence = leadership.fence();
    assert!(matches!(fence.check(), Err(FenceError::NotLeading)));
    assert_eq!(fence.until(), Some(Instant::now()));
    assert_eq!(fence.reach(), timing.renew_deadline);
    let refused = fence.record(("ledger", 1), &delete(1)).await;
    assert!(
        matches!(refused, Err(FenceError::NotLeading)),
        "{refused:?}"
    );
    assert!(names.on_lease().is_empty(), "not named");
    assert_eq!(store.holder().as_deref(), Some("rival"));
    assert_eq!(store.annotation(DELETIONS), None);
}

/// The fake applies a write as the API server does, so what it proves holds there.
#[test]
fn the_fake_merges_as_the_api_server_does() {
    let mut lease =
        json!({ "metadata": { "annotations": { "a": "1", "b": "2" } }, "spec": { "x": 1 } });
    merge(
        &mut lease,
        &json!({ "metadata": { "annotations": { "a": null, "c": "3" } }, "spec": { "y": 2 } }),
    );
    assert_eq!(
        lease,
        json!({ "metadata": { "annotations": { "b": "2", "c": "3" } }, "spec": { "x": 1, "y": 2 } })
    );
}
