//! The controller against a fake cluster and a fake clock (tokio's paused time): what each
//! stage sends, in what order, and what the reconcile asks the scheduler for next.
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::cache::{Change, Index, Scope, Update};
use crate::cluster::in_flight::{InFlight, Revocation};
use crate::cluster::ports::{Clock, LeaseRecords, LiveReads, Writes};
use crate::cluster::server_clock::Dispute;
use crate::cluster::watches::PROVEN;
use crate::cluster::writer::{Answer, Mode, NamespaceNotice, NotSent, Notice};
use crate::config::Config;
use crate::contract::OwnerKind;
use crate::contract::annotations::{NS_COLLECT, NS_TTL_AFTER_FINISHED};
use crate::daemon::proof::Way;
use crate::daemon::scheduler::{Failure, Outcome, Scheduler};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::facts::{NamespaceEntry, PodEntry, Progress, RunEntry};
use crate::decide::linking::Found;

use crate::decide::policy::Reason;
use crate::decide::quota::{Limit, Pressure, QuotaEntry, Resource};
use crate::decide::volumes::{self, VolumeFacts};
use crate::observe::metrics::{DeleteResult, Kind, Metrics};

use super::delete::SendResult;
use super::recheck::PROVE_FROM;
use super::released::sweep_every;
use super::*;

/// A synced index holding `claims` and `pods`, as the watches would leave it.
fn synced(claims: &[ClaimFacts], pods: &[PodEntry]) -> Index {
    let mut index = Index::listed_empty();
    for claim in claims {
        index.update(Update::Claim(Change::Apply(claim.clone())));
    }
    for pod in pods {
        index.update(Update::Pod(Change::Apply(pod.clone())));
    }
    index
}

fn pod_mounting(claim: &str) -> PodEntry {
    PodEntry {
        key: ObjectKey::new("ml", "build-pod"),
        phase: Some("Running".into()),
        claims: vec![claim.into()],
    }
}

/// One DELETE the controller sent.
#[derive(Debug, Clone, PartialEq)]
struct SentDelete {
    claim: ObjectKey,
    uid: String,
    deadline: Instant,
}

#[derive(Default)]
struct FakeCluster {
    /// The pods the live re-check finds.
    live_pods: Mutex<Vec<PodEntry>>,
    /// How long a live re-check takes.
    read_takes: Mutex<Duration>,
    /// When each live re-check's first read was sent.
    reads: Mutex<Vec<Instant>>,
    /// The answers to the next DELETEs; `Deleted` once none is left.
    answers: Mutex<VecDeque<Result<DeleteResult, NotSent>>>,
    sent: Mutex<Vec<SentDelete>>,
    notices: Mutex<Vec<Notice>>,
    namespace_notices: Mutex<Vec<(String, NamespaceNotice)>>,
    dry_run: bool,
    /// The claim as a live GET finds it (after an unanswered DELETE); `None`: gone.
    claim_state: Mutex<Option<(String, bool)>>,
    /// The one PersistentVolume there is, read and listed.
    volume: Mutex<Option<VolumeFacts>>,
    /// The writes, in order: `delete claim NAME`, `revoke claim NAME RV`,
    /// `mark NAME UID`, `delete NAME` (a volume).
    volume_writes: Mutex<Vec<String>>,
    /// The answers to the next revocations; `Revoked` once none is left.
    revocations: Mutex<VecDeque<Revocation>>,
    /// Flips the controller's leadership, for a hand-over.
    leading: Mutex<Option<watch::Sender<bool>>>,
    /// The claims' Namespace's annotations as a live read finds them; `None`: unreadable.
    live_namespace: Mutex<Option<BTreeMap<String, String>>>,
    /// Every kind's resourceVersion as a consistent read finds it; `None`: unknown. Its
    /// replays never get their bookmark.
    revision: Mutex<Option<u64>>,
    /// The PipelineRuns the live re-check finds.
    live_runs: Mutex<Vec<RunEntry>>,
    /// The ResourceQuotas a live list finds, and how long the list takes.
    live_quotas: Mutex<Vec<QuotaEntry>>,
    quotas_take: Mutex<Duration>,
    /// The receiving end of the controller's schedule: every wake-up it asked for.
    scheduler: Mutex<Option<Scheduler>>,
    /// Where a revocation that changed the claim sends its watch event; none when unset.
    events: Mutex<Option<crate::daemon::scheduler::Schedule>>,
    /// For each revocation answered `Revoked`, whether its watch event reaches the controller
    /// (a watch that lags or restarted may never bring it). `true` once none is left.
    revocation_events: Mutex<VecDeque<bool>>,
    /// Every claim write (its claim's name) with its answer, and when it went out.
    log: Mutex<Vec<(Instant, (String, Write))>>,
    /// Each quota pressure told on its namespace, as `QUOTA RESOURCE`.
    quota_pressure: Mutex<Vec<String>>,
    /// A real election over a fake Lease store (the model): each DELETE is recorded through
    /// its fence, and the cap is recovered from the ledger it found; `None`: unfenced, always
    /// leading as `leading` says.
    fence: Mutex<Option<(crate::cluster::leader::Fence, watch::Receiver<bool>)>>,
    /// Claims by name as a live GET finds them: each with its UID (`NAME-uid`), and whether
    /// it is being deleted; those not here as `claim_state` says.
    claim_states: Mutex<BTreeMap<String, bool>>,
    /// The UIDs of the claims whose DELETE went without an answer and is not revoked: it may
    /// still land.
    may_land: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Each instant a Lease was stored without naming one of `may_land`, with its UID.
    unnamed: Arc<Mutex<Vec<(Instant, String)>>>,
}

/// A claim write as the model test sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Delete(DeleteResult),
    Revoke(Revocation),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap()
}

impl FakeCluster {
    /// A result as the writer answers it in this cluster's mode.
    fn answer(&self, result: DeleteResult) -> Answer {
        if self.dry_run {
            Answer::Dry(result)
        } else {
            Answer::Real(result)
        }
    }
}

impl LiveReads for FakeCluster {
    type Live = Index;

    async fn read_live(&self, claim: &ClaimFacts) -> (Index, Instant) {
        let read_at = Instant::now();
        lock(&self.reads).push(read_at);
        let takes = *lock(&self.read_takes);
        tokio::time::sleep(takes).await;
        let pods = lock(&self.live_pods).clone();
        let mut live = synced(std::slice::from_ref(claim), &pods);
        for run in lock(&self.live_runs).iter() {
            live.update(Update::Run(Change::Apply(run.clone())));
        }
        (live, read_at)
    }

    async fn revision(&self, _: Kind, _: &Scope) -> Found<u64> {
        match *lock(&self.revision) {
            Some(revision) => Found::Yes(revision),
            None => Found::Unknown("the fake cluster proves nothing".into()),
        }
    }

    async fn changes(
        &self,
        _: Kind,
        _: &Scope,
        _: (u64, u64),
    ) -> Option<Vec<crate::cluster::progress::Delivery>> {
        if lock(&self.revision).is_some() {
            std::future::pending::<()>().await;
        }
        None
    }

    async fn claim_state(&self, key: &ObjectKey) -> Found<(String, bool)> {
        if let Some(deleting) = lock(&self.claim_states).get(&key.name) {
            return Found::Yes((format!("{}-uid", key.name), *deleting));
        }
        lock(&self.claim_state)
            .clone()
            .map_or(Found::No, Found::Yes)
    }

    async fn quotas(&self, _: &str) -> Found<Vec<QuotaEntry>> {
        let takes = *lock(&self.quotas_take);
        tokio::time::sleep(takes).await;
        Found::Yes(lock(&self.live_quotas).clone())
    }

    async fn namespace_annotations(&self, _: &str) -> Option<BTreeMap<String, String>> {
        lock(&self.live_namespace).clone()
    }

    async fn volume(&self, _: &str) -> Option<VolumeFacts> {
        lock(&self.volume).clone()
    }

    async fn volumes(&self) -> Option<Vec<VolumeFacts>> {
        Some(lock(&self.volume).iter().cloned().collect())
    }

    async fn answers(&self) -> bool {
        true
    }
}

impl Writes for FakeCluster {
    async fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: (&str, u64),
        deadline: Instant,
    ) -> SendResult {
        let fence = lock(&self.fence).as_ref().map(|(fence, _)| fence.clone());
        if let Some(fence) = fence {
            (fence.record(ledger, &InFlight::of(claim)).await).map_err(NotSent::Fence)?;
        }
        lock(&self.volume_writes).push(format!("delete claim {}", claim.key.name));
        lock(&self.sent).push(SentDelete {
            claim: claim.key.clone(),
            uid: claim.uid.clone(),
            deadline,
        });
        let answer = lock(&self.answers).pop_front();
        let answer = answer.unwrap_or(Ok(DeleteResult::Deleted));
        if let Ok(result) = answer {
            let write = (claim.key.name.clone(), Write::Delete(result));
            lock(&self.log).push((Instant::now(), write));
        }
        // Carried out: as the API server does, the claim is being deleted from then on (its
        // pvc-protection finalizer), and a live read says so.
        if matches!(answer, Ok(DeleteResult::Deleted)) && !self.dry_run {
            if let Some((_, deleting)) = lock(&self.claim_state).as_mut() {
                *deleting = true;
            }
            if let Some(deleting) = lock(&self.claim_states).get_mut(&claim.key.name) {
                *deleting = true;
            }
        }
        if matches!(answer, Ok(DeleteResult::Unanswered)) {
            lock(&self.may_land).insert(claim.uid.clone());
        }
        answer.map(|result| self.answer(result))
    }

    async fn revoke(&self, delete: &InFlight) -> Revocation {
        let write = format!("revoke claim {} {}", delete.name, delete.resource_version);
        lock(&self.volume_writes).push(write);
        let revocation = lock(&self.revocations)
            .pop_front()
            .unwrap_or(Revocation::Revoked);
        let write = (delete.name.clone(), Write::Revoke(revocation));
        lock(&self.log).push((Instant::now(), write));
        if matches!(revocation, Revocation::Revoked | Revocation::Landed) {
            lock(&self.may_land).remove(&delete.uid);
        }
        if revocation == Revocation::Revoked
            && lock(&self.revocation_events).pop_front().unwrap_or(true)
            && let Some(events) = lock(&self.events).as_ref()
        {
            events.now(delete.key());
        }
        revocation
    }

    async fn notify(&self, _: &ClaimFacts, notice: Notice) {
        lock(&self.notices).push(notice);
    }

    async fn notify_quota_pressure(&self, pressure: &Pressure) {
        let told = format!("{} {}", pressure.quota.name, pressure.resource);
        lock(&self.quota_pressure).push(told);
    }

    async fn notify_namespace(&self, namespace: &str, notice: &NamespaceNotice) {
        lock(&self.namespace_notices).push((namespace.to_owned(), notice.clone()));
    }

    async fn mark_volume(&self, volume: &VolumeFacts, claim_uid: &str) -> Option<VolumeFacts> {
        lock(&self.volume_writes).push(format!("mark {} {claim_uid}", volume.name));
        Some(VolumeFacts {
            marked_claim_uid: Some(claim_uid.into()),
            ..volume.clone()
        })
    }

    async fn delete_volume(&self, volume: &VolumeFacts, _: Instant) -> SendResult {
        lock(&self.volume_writes).push(format!("delete {}", volume.name));
        Ok(self.answer(DeleteResult::Deleted))
    }

    fn mode(&self) -> Mode {
        if self.dry_run {
            Mode::DryRun { server_side: false }
        } else {
            Mode::Delete
        }
    }
}

impl LeaseRecords for FakeCluster {
    fn leadership(&self) -> watch::Receiver<bool> {
        if let Some((_, leading)) = lock(&self.fence).as_ref() {
            return leading.clone();
        }
        lock(&self.leading)
            .as_ref()
            .expect("the leadership")
            .subscribe()
    }
    fn reach(&self) -> Duration {
        (lock(&self.fence).as_ref()).map_or(Duration::from_secs(10), |(fence, _)| fence.reach())
    }

    fn found_ledger(&self) -> Option<String> {
        lock(&self.fence).as_ref()?.0.found()
    }

    fn found_rounds(&self) -> Option<String> {
        None
    }

    fn stage_rounds(&self, rounds: String) {
        // In order with the writes: the rounds go on the Lease with the DELETE's ledger.
        let naming = |claim: &str| rounds.contains(&format!("{claim}-uid"));
        let named: Vec<&str> = ["older", "newer"]
            .into_iter()
            .filter(|c| naming(c))
            .collect();
        lock(&self.volume_writes).push(format!("stage rounds naming {}", named.join(",")));
    }
}

/// Wall time that moves with tokio's (paused) clock, from a fixed start.
struct FakeClock {
    start: Instant,
    wall: DateTime<Utc>,
    /// The hold of the cap a clock dispute put, standing until its end.
    dispute: Mutex<Option<Dispute>>,
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = chrono::Duration::from_std(self.start.elapsed()).unwrap();
        self.wall + elapsed
    }

    fn server(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        (self.now(), self.now())
    }

    fn instant_at(&self, deadline: DateTime<Utc>) -> Instant {
        Instant::now() + (deadline - self.now()).to_std().unwrap_or(Duration::ZERO)
    }

    fn dispute(&self) -> Option<Dispute> {
        lock(&self.dispute).filter(|dispute| Instant::now() < dispute.until)
    }
}

/// The claims are orphans long past the orphan grace: due.
fn due(name: &str) -> ClaimFacts {
    ClaimFacts::example(name)
}

/// A leading controller on `cluster`, with at most `cap` deletions an hour, whose cache
/// holds `claims`.
fn controller(
    cluster: FakeCluster,
    cap: u32,
    claims: &[ClaimFacts],
    leading: bool,
) -> Arc<Controller<FakeCluster, FakeClock>> {
    controller_with(cluster, cap, claims, leading, |_| {})
}

/// [`controller`], with `edit` applied to its configuration.
fn controller_with(
    cluster: FakeCluster,
    cap: u32,
    claims: &[ClaimFacts],
    leading: bool,
    edit: impl FnOnce(&mut Config),
) -> Arc<Controller<FakeCluster, FakeClock>> {
    *lock(&cluster.leading) = Some(watch::channel(leading).0);
    controller_on(cluster, cap, claims, Arc::default(), edit)
}

/// [`controller_with`] on `cluster` as it is (its leadership set), with `registry` as the
/// registry of DELETEs in flight (shared with an election in the model).
fn controller_on(
    cluster: FakeCluster,
    cap: u32,
    claims: &[ClaimFacts],
    registry: Arc<DeletesInFlight>,
    edit: impl FnOnce(&mut Config),
) -> Arc<Controller<FakeCluster, FakeClock>> {
    let mut config = Config::default();
    config.quota.enabled = false;
    // Claims named `a`, `b`: the delete protocol is under test here, provenance in its module.
    config.provenance.claim_suffixes = vec![String::new()];
    config.deletion.window = Duration::from_secs(3600);
    edit(&mut config);
    config.deletion.max_deletions_per_window = cap;
    config.deletion.deletes_per_second = 1000.0;
    let clock = FakeClock {
        start: Instant::now(),
        wall: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
        dispute: Mutex::default(),
    };
    let (schedule, scheduler) = Scheduler::new();
    *lock(&cluster.scheduler) = Some(scheduler);
    let metrics = Arc::new(Metrics::register(&mut Registry::default()));
    let controller = Controller::new(&config, cluster, clock, metrics, schedule, registry);
    *controller.cache.write() = synced(claims, &[]);
    controller.recover_cap();
    Arc::new(controller)
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ml", name)
}

#[tokio::test(start_paused = true)]
async fn a_due_claim_is_deleted_once_before_its_live_re_check_is_too_old() {
    let c = controller(FakeCluster::default(), 10, &[due("a")], true);
    let outcome = c.clone().reconcile(key("a")).await;
    assert_eq!(outcome, Outcome::Done);
    let sent = lock(&c.cluster.sent).clone();
    let reads = lock(&c.cluster.reads).clone();
    assert_eq!(reads.len(), 1);
    assert_eq!(
        sent,
        vec![SentDelete {
            claim: key("a"),
            uid: "a-uid".into(),
            deadline: reads[0] + LIVE_BOUND,
        }]
    );
    assert_eq!(
        lock(&c.cluster.notices).clone(),
        vec![Notice::Deleted(Reason::Orphaned, None)]
    );
}

/// Enough cached pods in the claims' namespace for a proof, and every proven kind's watch
/// delivered up to `delivered`.
fn large_namespace<C: Cluster, K: Clock>(c: &Controller<C, K>, delivered: u64) {
    let mut index = c.cache.write();
    for n in 0..PROVE_FROM {
        let mut pod = pod_mounting("other");
        pod.key.name = format!("pod-{n}");
        index.update(Update::Pod(Change::Apply(pod)));
    }
    for kind in PROVEN {
        index.update(Update::Delivered(kind, None, delivered));
    }
}

/// A kind whose own watch delivers past the revision read for the proof is proven then,
/// without waiting for the replay's bookmark (here one that never comes): the re-check
/// rests on the proven cache and lists nothing.
#[tokio::test(start_paused = true)]
async fn a_watch_delivering_past_the_revision_proves_its_kind_without_the_bookmark() {
    let cluster = FakeCluster::default();
    *lock(&cluster.revision) = Some(100);
    let c = controller(cluster, 10, &[due("a")], true);
    large_namespace(&c, 90);
    let watches = c.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut index = watches.cache.write();
        for kind in PROVEN {
            index.update(Update::Delivered(kind, None, 101));
        }
    });
    // Another re-check asked just now, so this one shares a round (`proof::way`).
    assert_eq!(c.deletes.rechecks.way(&None), Way::Direct);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert!(lock(&c.cluster.reads).is_empty(), "nothing listed");
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// A claim whose re-check no other would share lists its namespace at once instead of
/// starting a round of its own, in a namespace large enough for rounds.
#[tokio::test(start_paused = true)]
async fn a_lone_re_check_lists_at_once_instead_of_starting_a_round() {
    let cluster = FakeCluster::default();
    *lock(&cluster.revision) = Some(100);
    let c = controller(cluster, 10, &[due("a")], true);
    large_namespace(&c, 100);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.reads).len(), 1, "listed, not proven");
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_user_the_live_re_check_finds_keeps_the_claim_and_frees_its_slot() {
    let cluster = FakeCluster::default();
    lock(&cluster.live_pods).push(pod_mounting("a"));
    let c = controller(cluster, 1, &[due("a"), due("b")], true);
    let outcome = c.clone().reconcile(key("a")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::LiveDisagrees));
    assert!(lock(&c.cluster.sent).is_empty());
    // The slot `a` took is free again: `b` (whose live view has no user) gets the cap's one.
    lock(&c.cluster.live_pods).clear();
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// A Namespace annotation not understood, as the live re-check reads it, keeps a claim the
/// cache found due; once it is fixed, the claim goes.
#[tokio::test(start_paused = true)]
async fn namespace_settings_not_understood_in_the_live_read_keep_the_claim() {
    let cluster = FakeCluster::default();
    let helm = BTreeMap::from([(NS_COLLECT.to_owned(), "False".to_owned())]);
    *lock(&cluster.live_namespace) = Some(helm);
    let c = controller_with(cluster, 10, &[due("a")], true, |config| {
        config.namespace_policy.enabled = true;
    });
    c.cache
        .write()
        .update(Update::Namespace(Change::Apply(NamespaceEntry {
            key: ObjectKey::new("", "ml"),
            annotations: BTreeMap::new(),
        })));
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::LiveDisagrees)
    );
    assert!(lock(&c.cluster.sent).is_empty());
    *lock(&c.cluster.live_namespace) = Some(BTreeMap::new());
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_delete_goes_back_through_the_whole_path() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Denied));
    let c = controller(cluster, 1, &[due("a")], true);
    let outcome = c.clone().reconcile(key("a")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::Denied));
    assert_eq!(lock(&c.cluster.sent).len(), 1, "sent once, never re-sent");
    // The retry admits it again within the cap of one (the refusal was not counted) and
    // re-checks it live before the second DELETE.
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.reads).len(), 2);
    assert_eq!(lock(&c.cluster.sent).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_live_re_check_slower_than_its_bound_is_not_live() {
    let cluster = FakeCluster::default();
    *lock(&cluster.read_takes) = LIVE_BOUND + Duration::from_secs(1);
    let c = controller(cluster, 10, &[due("a")], true);
    let outcome = c.clone().reconcile(key("a")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::LiveTooSlow));
    assert!(lock(&c.cluster.sent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_delete_stays_counted_against_the_cap_until_revoked() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Unanswered);
    let c = controller(cluster, 1, &[due("a"), due("b")], true);
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unrevoked)
    );
    // It may still land: the cap of one holds `b` back.
    let outcome = c.clone().reconcile(key("b")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    assert_eq!(lock(&c.cluster.sent).len(), 1);
    // Revoked, it never can: its slot goes to `b`.
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unanswered)
    );
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_delete_that_landed_late_stays_counted_against_the_cap() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Landed);
    *lock(&cluster.claim_state) = Some(("a-uid".into(), true));
    let c = controller(cluster, 1, &[due("a"), due("b")], true);
    assert_eq!(c.clone().reconcile(key("a")).await, at_once());
    let outcome = c.clone().reconcile(key("b")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// Decide again at once: what follows a revocation that found its DELETE landed.
fn at_once() -> Outcome {
    Outcome::At(Instant::now())
}

/// API servers behind one address whose clocks disagree: once an answer contradicts the
/// earlier ones, the cap counts its window as full for a whole window (the ledger's dates
/// cannot be trusted to expire), tells it once, and deletes again after.
#[tokio::test(start_paused = true)]
async fn a_clock_contradiction_holds_the_cap_full_for_a_window() {
    let c = controller(FakeCluster::default(), 10, &[due("a"), due("b")], true);
    *lock(&c.clock.dispute) = Some(hold(Instant::now(), Instant::now()));
    let held = Outcome::At(Instant::now() + Duration::from_secs(3600));
    assert_eq!(c.clone().reconcile(key("a")).await, held);
    assert_eq!(c.clone().reconcile(key("b")).await, held);
    assert!(
        lock(&c.cluster.sent).is_empty(),
        "nothing deleted meanwhile"
    );
    let told = lock(&c.cluster.notices)
        .iter()
        .filter(|n| matches!(n, Notice::ClockDisputed { .. }))
        .count();
    assert_eq!(told, 1, "told once per dispute");
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// The hold of a clock dispute that began at `since` and was last extended at `last`, as the
/// API server's clock reports it for the controller's hour-long window.
fn hold(since: Instant, last: Instant) -> Dispute {
    Dispute {
        since,
        until: last + Duration::from_secs(3600),
    }
}

/// The `ServerClockDisputed` events told so far.
fn disputes_told(c: &Controller<FakeCluster, FakeClock>) -> usize {
    (lock(&c.cluster.notices).iter())
        .filter(|n| matches!(n, Notice::ClockDisputed { .. }))
        .count()
}

/// Contradictions that go on arriving extend one hold of the cap: it is told once, however
/// many extend it (before, once per contradiction a claim saw); a hold that begins after the
/// last ended is told again.
#[tokio::test(start_paused = true)]
async fn a_hold_is_told_once_however_many_contradictions_extend_it() {
    let c = controller(FakeCluster::default(), 10, &[due("a"), due("b")], true);
    let since = Instant::now();
    *lock(&c.clock.dispute) = Some(hold(since, since));
    let outcome = c.clone().reconcile(key("a")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    tokio::time::advance(Duration::from_secs(60)).await;
    *lock(&c.clock.dispute) = Some(hold(since, Instant::now()));
    let outcome = c.clone().reconcile(key("b")).await;
    assert_eq!(
        outcome,
        Outcome::At(Instant::now() + Duration::from_secs(3600))
    );
    assert_eq!(disputes_told(&c), 1, "told once per hold");
    assert!(lock(&c.cluster.sent).is_empty());
    tokio::time::advance(Duration::from_secs(3600)).await;
    let again = Instant::now();
    *lock(&c.clock.dispute) = Some(hold(again, again));
    let outcome = c.clone().reconcile(key("b")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    assert_eq!(disputes_told(&c), 2, "a new hold is told");
}

/// The claim's writes so far, as the fake cluster logged them.
fn writes(c: &Controller<FakeCluster, FakeClock>) -> Vec<String> {
    lock(&c.cluster.volume_writes).clone()
}

/// The claims the controller asked to have reconciled since the last call, each with how long
/// from now (`None`: at once).
fn wakes(c: &Controller<FakeCluster, FakeClock>) -> Vec<(String, Option<Duration>)> {
    let mut scheduler = lock(&c.cluster.scheduler);
    let scheduler = scheduler.as_mut().expect("the fake keeps the scheduler");
    (scheduler.take_requests().into_iter())
        .map(|(key, at)| (key.name, at.map(|at| at - Instant::now())))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_delete_is_revoked_before_anything_else_is_sent() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Unanswered);
    let c = controller(cluster, 10, &[due("a")], true);
    // Revoked at once, in the same reconcile; no answer to that either: kept, retried.
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unrevoked)
    );
    assert_eq!(writes(&c), ["delete claim a", "revoke claim a 1"]);
    // Whatever the cache says, the revocation comes first, and nothing else is sent.
    lock(&c.cluster.live_pods).push(pod_mounting("a"));
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unanswered)
    );
    assert_eq!(
        writes(&c),
        ["delete claim a", "revoke claim a 1", "revoke claim a 1"]
    );
    assert_eq!(lock(&c.cluster.sent).len(), 1, "no DELETE sent meanwhile");
    // Revoked: the claim is decided again from the start (here a build uses it).
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::LiveDisagrees)
    );
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_revocation_that_finds_the_delete_landed_sends_nothing_again() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Landed);
    // Being deleted, as the revocation found it; the cache has not caught up.
    *lock(&cluster.claim_state) = Some(("a-uid".into(), true));
    let c = controller(cluster, 10, &[due("a")], true);
    // Landed: decided again at once, where its live re-check finds it being deleted.
    assert_eq!(c.clone().reconcile(key("a")).await, at_once());
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(writes(&c), ["delete claim a", "revoke claim a 1"]);
}

#[tokio::test(start_paused = true)]
async fn a_refused_revocation_is_read_live() {
    // Refused, and the claim is there as it was: the DELETE may still land. Kept, retried.
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Refused);
    *lock(&cluster.claim_state) = Some(("a-uid".into(), false));
    let c = controller(cluster, 10, &[due("a")], true);
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unrevoked)
    );
    // Refused because the claim was re-created under its name: the DELETE (with the old
    // UID) can land on nothing.
    lock(&c.cluster.revocations).push_back(Revocation::Refused);
    *lock(&c.cluster.claim_state) = Some(("new-uid".into(), false));
    assert_eq!(c.clone().reconcile(key("a")).await, at_once());
    assert_eq!(c.deletes.in_flight.lease_side().owed(&key("a")), None);
    assert!(c.deletes.in_flight.lease_side().on_lease().is_empty());
}

/// A DELETE without an answer whose revocation keeps failing holds its slot of the cap in the
/// current window, however long it stays owed: a window later, the cap still counts it, and
/// lets no other DELETE go beside it; once revoked, the slot as counted last is freed.
#[tokio::test(start_paused = true)]
async fn a_delete_still_owed_a_window_later_still_fills_the_cap() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).extend([Revocation::Unanswered; 3]);
    let c = controller(cluster, 1, &[due("a"), due("b")], true);
    let unrevoked = Outcome::Retry(Failure::Unrevoked);
    assert_eq!(c.clone().reconcile(key("a")).await, unrevoked);
    // Its revocation fails again within the window, and once more after it.
    tokio::time::sleep(Duration::from_secs(50 * 60)).await;
    assert_eq!(c.clone().reconcile(key("a")).await, unrevoked);
    tokio::time::sleep(Duration::from_secs(20 * 60)).await;
    assert_eq!(c.clone().reconcile(key("a")).await, unrevoked);
    // An hour and ten minutes after it was sent, the cap's one slot is still its.
    let outcome = c.clone().reconcile(key("b")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    // Revoked at last: the slot it held, as counted last, is free for `b`.
    let revoked = c.clone().reconcile(key("a")).await;
    assert_eq!(revoked, Outcome::Retry(Failure::Unanswered));
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(
        writes(&c),
        [
            "delete claim a",
            "revoke claim a 1",
            "revoke claim a 1",
            "revoke claim a 1",
            "revoke claim a 1",
            "delete claim b"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_standby_leaves_the_revocation_to_the_leader() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.revocations).push_back(Revocation::Unanswered);
    let c = controller(cluster, 10, &[due("a")], true);
    c.clone().reconcile(key("a")).await;
    lock(&c.cluster.leading)
        .as_ref()
        .unwrap()
        .send_replace(false);
    let standby = c;
    assert_eq!(standby.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(writes(&standby), ["delete claim a", "revoke claim a 1"]);
}

/// On winning, the DELETEs the Lease names are registered and their claims woken; each is
/// revoked once, by its claim's reconcile, and the claim is then decided again after its
/// backoff (the revocation's own event is not relied on).
#[tokio::test(start_paused = true)]
async fn the_deletes_the_lease_names_are_revoked_once_by_their_claims_reconcile() {
    let found = InFlight {
        namespace: "ml".into(),
        name: "a".into(),
        uid: "a-uid".into(),
        resource_version: "1".into(),
    };
    let c = controller(FakeCluster::default(), 10, &[due("a")], true);
    c.deletes
        .in_flight
        .lease_side()
        .won([(found.uid.clone(), found)].into());
    c.reconcile_owed();
    assert!(writes(&c).is_empty(), "nothing sent on registering");
    assert_eq!(wakes(&c), [("a".to_owned(), None)]);
    assert_eq!(
        c.clone().reconcile(key("a")).await,
        Outcome::Retry(Failure::Unanswered)
    );
    assert_eq!(writes(&c), ["revoke claim a 1"]);
    assert_eq!(c.deletes.in_flight.lease_side().owed(&key("a")), None);
    assert!(
        c.deletes.in_flight.lease_side().on_lease().is_empty(),
        "off the Lease once revoked"
    );
}

/// A revocation whose watch event never reaches the controller (the watch lagged or restarted)
/// still ends its reconcile with a timer, never `Done`.
#[tokio::test(start_paused = true)]
async fn a_revoked_delete_ends_its_reconcile_with_a_retry_not_done() {
    let cluster = FakeCluster::default();
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
    let c = controller(cluster, 10, &[due("a")], true);
    for _ in 0..2 {
        assert_eq!(
            c.clone().reconcile(key("a")).await,
            Outcome::Retry(Failure::Unanswered)
        );
    }
    assert_eq!(
        writes(&c),
        [
            "delete claim a",
            "revoke claim a 1",
            "delete claim a",
            "revoke claim a 1"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_delete_carried_out_is_not_sent_again_while_the_cache_still_shows_the_claim() {
    let cluster = FakeCluster::default();
    // The DELETE was answered 200; the claim is being deleted (its finalizer holds it).
    *lock(&cluster.claim_state) = Some(("a-uid".into(), true));
    let c = controller(cluster, 10, &[due("a")], true);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    // A watch that has not caught up still shows the claim as decided: deciding it again
    // reads it live instead of sending the same DELETE a second time.
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 1, "not sent again");
}

#[tokio::test(start_paused = true)]
async fn a_claim_found_gone_by_its_re_check_gives_its_slot_of_the_cap_back() {
    let cluster = FakeCluster::default();
    *lock(&cluster.claim_state) = Some(("a-uid".into(), true));
    let c = controller(cluster, 2, &[due("a"), due("b")], true);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    // Admitted, then read live in its re-check and found being deleted: the slot it took
    // goes back, and the cap's second slot is b's.
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 2, "a once, then b");
}

#[tokio::test]
async fn while_the_claims_watch_is_broken_a_claim_is_read_live_before_its_delete() {
    let cluster = FakeCluster::default();
    // The replica that led before deleted it; this one's watch is down and still shows it.
    *lock(&cluster.claim_state) = None;
    let c = controller(cluster, 10, &[due("a"), due("b")], true);
    c.deletes.in_flight.claims_watch_broken(true);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert!(
        lock(&c.cluster.sent).is_empty(),
        "nothing sent for a gone claim"
    );
    // Once the watch delivers again, the cache is trusted as before.
    c.deletes.in_flight.claims_watch_broken(false);
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// An orphan created `seconds` after the epoch: the later, the later it is due.
fn due_later(name: &str, seconds: i64) -> ClaimFacts {
    let mut claim = due(name);
    claim.created = DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(seconds);
    claim
}

#[tokio::test(start_paused = true)]
async fn under_a_saturated_cap_a_freed_slot_goes_to_the_claim_due_first() {
    let claims = [
        due_later("first", 0),
        due_later("a", 3),
        due_later("b", 2),
        due_later("c", 1),
    ];
    let c = controller(FakeCluster::default(), 1, &claims, true);
    for name in ["first", "a", "b", "c"] {
        c.clone().reconcile(key(name)).await;
    }
    tokio::time::advance(Duration::from_secs(3700)).await;
    // `a` and `b` retry first, but `c` has waited longest for its slot.
    for name in ["a", "b"] {
        let outcome = c.clone().reconcile(key(name)).await;
        assert!(matches!(outcome, Outcome::At(_)), "{name}: {outcome:?}");
    }
    assert_eq!(c.clone().reconcile(key("c")).await, Outcome::Done);
    let sent: Vec<ObjectKey> = lock(&c.cluster.sent)
        .iter()
        .map(|s| s.claim.clone())
        .collect();
    assert_eq!(sent, vec![key("first"), key("c")]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_no_longer_due_leaves_the_line() {
    let claims = [due_later("first", 0), due_later("a", 2), due_later("b", 1)];
    let c = controller(FakeCluster::default(), 1, &claims, true);
    for name in ["first", "a", "b"] {
        c.clone().reconcile(key(name)).await;
    }
    tokio::time::advance(Duration::from_secs(3700)).await;
    // `b` is gone before its turn: `a` is next.
    *c.cache.write() = synced(&[due_later("first", 0), due_later("a", 2)], &[]);
    assert_eq!(c.clone().reconcile(key("b")).await, Outcome::Done);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.sent).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn each_claim_held_back_by_the_cap_is_told_once() {
    let claims = [due("a"), due("b"), due("c")];
    let c = controller(FakeCluster::default(), 1, &claims, true);
    for name in ["a", "b", "c", "b", "c", "b"] {
        c.clone().reconcile(key(name)).await;
    }
    let capped = lock(&c.cluster.notices)
        .iter()
        .filter(|notice| matches!(notice, Notice::CapReached { .. }))
        .count();
    assert_eq!(capped, 2);
    assert_eq!(lock(&c.cluster.sent).len(), 1);
}

/// Labelled claims without provenance, many at once in one namespace (a common label applied
/// to it): each is told on the claim, and the flood once on the Namespace, not on every claim
/// past the threshold nor again within its window.
#[tokio::test(start_paused = true)]
async fn a_flood_of_claims_without_provenance_is_told_once_on_the_namespace() {
    use crate::decide::facts::{AccessModes, LabelHistory, LabelOwner, Operation, Provenance};
    let labelled_later = |name: &str| ClaimFacts {
        provenance: Provenance {
            operator_labels: true,
            label: LabelHistory::Owners(vec![LabelOwner {
                manager: "kubectl-label".into(),
                operation: Operation::Update,
                access_modes: AccessModes::NotOwned,
            }]),
        },
        ..due(name)
    };
    let names: Vec<String> = (0..25).map(|i| format!("data-{i}")).collect();
    let claims: Vec<ClaimFacts> = names.iter().map(|name| labelled_later(name)).collect();
    let c = controller(FakeCluster::default(), 100, &claims, true);
    for name in &names {
        c.clone().reconcile(key(name)).await;
    }
    assert!(lock(&c.cluster.sent).is_empty(), "none deleted");
    let told = (lock(&c.cluster.notices).iter())
        .filter(|notice| matches!(notice, Notice::NotABuildWorkspace(_)))
        .count();
    assert_eq!(told, 25, "each claim told");
    let floods = lock(&c.cluster.namespace_notices).clone();
    assert_eq!(
        floods,
        [(
            "ml".to_owned(),
            NamespaceNotice::UnprovenLabelFlood {
                claims: 10,
                within: "10m".into()
            }
        )]
    );
}

/// With a share of the candidates, due claims listed at start are taken that share a window
/// at a time, below the absolute cap, and the notice names the cap as it stands.
#[tokio::test(start_paused = true)]
async fn a_share_of_the_candidates_caps_a_flood() {
    let names: Vec<String> = (0..20).map(|i| format!("flood-{i}")).collect();
    let claims: Vec<ClaimFacts> = names.iter().map(|name| due(name)).collect();
    let edit = |config: &mut Config| config.deletion.max_deletions_percent = Some(10.0);
    let c = controller_with(FakeCluster::default(), 100, &[], true, edit);
    let mut config = Config::default();
    config.quota.enabled = false;
    config.provenance.claim_suffixes = vec![String::new()];
    edit(&mut config);
    // Listed at start: a window's share of the claims there when the watch listed.
    *c.cache.write() = listed(&config, &claims);
    for name in &names {
        c.clone().reconcile(key(name)).await;
    }
    assert_eq!(lock(&c.cluster.sent).len(), 2, "10% of 20 claims a window");
    let notices = lock(&c.cluster.notices);
    assert!(
        (notices.iter()).any(|notice| matches!(notice, Notice::CapReached { max: 2, .. })),
        "{notices:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_held_back_is_told_once_however_the_window_moves() {
    let claims = [due("a"), due("b"), due("c"), due("d"), due("e")];
    let c = controller(FakeCluster::default(), 2, &claims, true);
    for name in ["a", "b", "c", "d", "e"] {
        c.clone().reconcile(key(name)).await;
    }
    // The window moves past both deletions at once: two slots open together, `e` waits on.
    tokio::time::advance(Duration::from_secs(3700)).await;
    for name in ["c", "d", "e"] {
        c.clone().reconcile(key(name)).await;
    }
    let capped = lock(&c.cluster.notices)
        .iter()
        .filter(|notice| matches!(notice, Notice::CapReached { .. }))
        .count();
    assert_eq!(capped, 3, "c, d and e, once each");
    assert_eq!(lock(&c.cluster.sent).len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_reports_would_delete_and_never_deleted() {
    let cluster = FakeCluster {
        dry_run: true,
        ..FakeCluster::default()
    };
    let c = controller(cluster, 10, &[due("a")], true);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(
        lock(&c.cluster.notices).clone(),
        vec![Notice::WouldDelete(Reason::Orphaned)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_standby_decides_but_sends_nothing() {
    let c = controller(FakeCluster::default(), 10, &[due("a")], false);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert!(lock(&c.cluster.reads).is_empty());
    assert!(lock(&c.cluster.sent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_use_in_the_cache_is_never_re_checked_or_sent() {
    let c = controller(FakeCluster::default(), 10, &[due("a")], true);
    c.cache
        .write()
        .update(Update::Pod(Change::Apply(pod_mounting("a"))));
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert!(lock(&c.cluster.reads).is_empty());
    assert!(lock(&c.cluster.sent).is_empty());
}

/// A claim bound to volume `pv-1`, and that volume: `Retain`, bound to it.
fn bound_to_a_retain_volume() -> (ClaimFacts, VolumeFacts) {
    let claim = ClaimFacts {
        volume_name: Some("pv-1".into()),
        ..due("a")
    };
    let volume = VolumeFacts {
        phase: Some("Bound".into()),
        marked_claim_uid: None,
        ..VolumeFacts::example(&claim.uid)
    };
    (claim, volume)
}

fn releasing(config: &mut Config) {
    config.deletion.read_volumes = true;
    config.deletion.released_volume_ttl = Some(Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_retain_volume_is_marked_once_its_claims_delete_succeeded() {
    let (claim, volume) = bound_to_a_retain_volume();
    let cluster = FakeCluster::default();
    *lock(&cluster.volume) = Some(volume);
    let c = controller_with(cluster, 10, &[claim], true, releasing);
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(writes(&c), ["delete claim a", "mark pv-1 a-uid"]);
    // Reported as kept, as with read_volumes alone.
    assert_eq!(
        lock(&c.cluster.notices).clone(),
        vec![Notice::Deleted(Reason::Orphaned, Some("pv-1".into()))]
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_ttl_nothing_is_marked() {
    let (claim, volume) = bound_to_a_retain_volume();
    let cluster = FakeCluster::default();
    *lock(&cluster.volume) = Some(volume);
    let c = controller_with(cluster, 10, &[claim], true, |config| {
        config.deletion.read_volumes = true;
    });
    assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
    assert_eq!(lock(&c.cluster.volume_writes).clone(), ["delete claim a"]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_delete_not_known_to_have_been_carried_out_marks_nothing() {
    for (answer, revocation) in [
        (DeleteResult::Denied, None),
        (DeleteResult::Conflict, None),
        (DeleteResult::NotFound, None),
        (DeleteResult::Unanswered, Some(Revocation::Revoked)),
        // It landed late: carried out, but whether by this DELETE is not known.
        (DeleteResult::Unanswered, Some(Revocation::Landed)),
    ] {
        let (claim, volume) = bound_to_a_retain_volume();
        let cluster = FakeCluster::default();
        *lock(&cluster.volume) = Some(volume);
        lock(&cluster.answers).push_back(Ok(answer));
        lock(&cluster.revocations).extend(revocation);
        let c = controller_with(cluster, 10, &[claim], true, releasing);
        c.clone().reconcile(key("a")).await;
        let marks = writes(&c).into_iter().filter(|w| w.starts_with("mark"));
        assert_eq!(marks.count(), 0, "{answer:?} {revocation:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_sweep_deletes_only_what_the_judgement_lets_go() {
    let (_, volume) = bound_to_a_retain_volume();
    let c = controller_with(FakeCluster::default(), 10, &[], true, releasing);
    let now = c.clock.now();
    let released = VolumeFacts {
        phase: Some("Released".into()),
        marked_claim_uid: volume.claim_uid.clone(),
        transition: volumes::Transition::At(now - chrono::Duration::minutes(2)),
        ..volume
    };
    let ttl = chrono::Duration::minutes(1);
    let mut unjudged = std::collections::BTreeSet::new();
    for (kept, why) in [
        (
            VolumeFacts {
                marked_claim_uid: None,
                ..released.clone()
            },
            "its claim deleted by someone else",
        ),
        (
            VolumeFacts {
                transition: volumes::Transition::Missing,
                ..released.clone()
            },
            "released since when is not known",
        ),
        (
            VolumeFacts {
                transition: volumes::Transition::At(now),
                ..released.clone()
            },
            "within its TTL",
        ),
    ] {
        *lock(&c.cluster.volume) = Some(kept);
        c.sweep(ttl, &mut unjudged).await;
        assert!(lock(&c.cluster.volume_writes).is_empty(), "{why}");
    }
    assert_eq!(
        unjudged.len(),
        1,
        "the volume released since a time not known is warned about"
    );
    *lock(&c.cluster.volume) = Some(released);
    c.sweep(ttl, &mut unjudged).await;
    assert_eq!(lock(&c.cluster.volume_writes).clone(), ["delete pv-1"]);
}

#[test]
fn the_sweep_runs_at_half_the_ttl_within_bounds() {
    assert_eq!(
        sweep_every(Duration::from_millis(10)),
        Duration::from_secs(1)
    );
    assert_eq!(sweep_every(Duration::from_secs(10)), Duration::from_secs(5));
    assert_eq!(
        sweep_every(Duration::from_secs(86_400)),
        Duration::from_secs(60)
    );
}

/// A 2 GiB `requests.storage` quota of namespace `ml` with `used` GiB used.
fn storage_quota(used: u64) -> QuotaEntry {
    const GI: u64 = 1 << 30;
    QuotaEntry {
        key: ObjectKey::new("ml", "storage"),
        uid: "storage-uid".into(),
        limits: vec![Limit {
            resource: Resource::Storage,
            hard: 2 * GI,
            used: used * GI,
        }],
    }
}

/// Two 1 GiB workspaces whose runs succeeded 10 and 5 minutes ago, within their hour's TTL,
/// under a full quota as cached: pressure takes `older` early, the one completed first. The
/// live re-check finds the runs as cached and the quota as `live_quotas` says.
fn under_pressure(
    cluster: FakeCluster,
    edit: impl FnOnce(&mut Config),
) -> Arc<Controller<FakeCluster, FakeClock>> {
    let wall = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let build = |name: &str, minutes_ago: i64| {
        let mut claim = due(name);
        claim.created = wall - chrono::Duration::minutes(30);
        claim.requested_bytes = Some(1 << 30);
        let run = RunEntry {
            kind: OwnerKind::Run,
            key: ObjectKey::new("ml", &format!("{name}-run")),
            uid: format!("{name}-run-uid"),
            claims: vec![name.into()],
            progress: Progress::Finished {
                at: Some(wall - chrono::Duration::minutes(minutes_ago)),
                failed: false,
            },
        };
        (claim, run)
    };
    let (claims, runs): (Vec<_>, Vec<_>) =
        [build("older", 10), build("newer", 5)].into_iter().unzip();
    *lock(&cluster.live_runs) = runs.clone();
    let c = controller_with(cluster, 10, &claims, true, |config| {
        config.policy.ttl_after_finished = Duration::from_secs(3600);
        config.quota.enabled = true;
        edit(config);
    });
    {
        let mut index = c.cache.write();
        for run in runs {
            index.update(Update::Run(Change::Apply(run)));
        }
        index.apply::<QuotaEntry>(Change::InitDone(None));
        index.update(Update::Quota(Change::Apply(storage_quota(2))));
    }
    // As the feed does after a quota changes: the namespace's round opens.
    c.observe_quotas(&c.cache.read(), None);
    c
}

/// The plan a pressure delete's re-check confirms is made again over the quotas as listed live:
/// a quota the list finds relieved (a delete the cache has not seen yet) takes nothing, and the
/// claim is kept; one still full takes the same claim, which is then deleted for pressure.
#[tokio::test(start_paused = true)]
async fn a_pressure_delete_is_planned_again_over_the_quotas_listed_live() {
    let cluster = FakeCluster::default();
    *lock(&cluster.live_quotas) = vec![storage_quota(1)];
    let c = under_pressure(cluster, |_| {});
    let outcome = c.clone().reconcile(key("older")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::LiveDisagrees));
    assert!(lock(&c.cluster.sent).is_empty());

    *lock(&c.cluster.live_quotas) = vec![storage_quota(2)];
    // Sent; the claim stays cached until the watch brings its deletion, woken at its TTL.
    let outcome = c.clone().reconcile(key("older")).await;
    assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
    let sent: Vec<ObjectKey> = (lock(&c.cluster.sent).iter())
        .map(|sent| sent.claim.clone())
        .collect();
    assert_eq!(sent, [key("older")]);
    assert_eq!(
        lock(&c.cluster.notices).clone(),
        vec![Notice::Deleted(Reason::QuotaPressure, None)]
    );
    // Counted in its round, which goes to the Lease with the ledger, before the DELETE: a
    // replica taking over resumes the round instead of taking one more.
    assert_eq!(
        writes(&c),
        ["stage rounds naming older", "delete claim older"]
    );
}

/// Pressure that no delete can relieve (every workspace in use) is told on the namespace once
/// a round, not at every reconcile of its claims.
#[tokio::test(start_paused = true)]
async fn pressure_nothing_can_relieve_is_told_once_a_round() {
    let c = under_pressure(FakeCluster::default(), |_| {});
    {
        let mut index = c.cache.write();
        for claim in ["older", "newer"] {
            let pod = PodEntry {
                key: ObjectKey::new("ml", &format!("{claim}-pod")),
                ..pod_mounting(claim)
            };
            index.update(Update::Pod(Change::Apply(pod)));
        }
    }
    for claim in ["older", "newer", "older"] {
        assert_eq!(c.clone().reconcile(key(claim)).await, Outcome::Done);
    }
    assert_eq!(
        lock(&c.cluster.quota_pressure).clone(),
        ["storage requests.storage"]
    );
    assert!(writes(&c).is_empty(), "nothing deleted, nothing staged");
}

/// The live quota list is part of the re-check and within its bound: a list slower than the
/// bound ends the re-check at the bound, and nothing is sent.
#[tokio::test(start_paused = true)]
async fn a_quota_list_slower_than_the_live_bound_ends_the_re_check_at_the_bound() {
    let cluster = FakeCluster::default();
    *lock(&cluster.live_quotas) = vec![storage_quota(2)];
    *lock(&cluster.quotas_take) = Duration::from_secs(60);
    let c = under_pressure(cluster, |_| {});
    let started = Instant::now();
    let outcome = c.clone().reconcile(key("older")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::LiveTooSlow));
    assert!(lock(&c.cluster.sent).is_empty());
    assert!(
        started.elapsed() <= LIVE_BOUND + Duration::from_millis(100),
        "gave up after {:?}",
        started.elapsed()
    );
}

/// A pressure delete's plan decides the namespace's other claims under the settings its live
/// re-check read, as it decides the claim itself. As cached, the namespace's TTL is 7 minutes:
/// `older` (completed 10 minutes ago) is due, not a candidate, and the plan takes `newer`. As
/// read live, the namespace has no TTL of its own: `older` is within the cluster's hour again
/// and, completed first, is the one the plan takes; `newer` is kept.
#[tokio::test(start_paused = true)]
async fn a_pressure_plan_decides_the_other_claims_under_the_settings_read_live() {
    let cluster = FakeCluster::default();
    *lock(&cluster.live_quotas) = vec![storage_quota(2)];
    *lock(&cluster.live_namespace) = Some(BTreeMap::new());
    let c = under_pressure(cluster, |config| {
        config.namespace_policy.enabled = true;
        config.namespace_policy.may_shorten = true;
        config.namespace_policy.min_ttl = Duration::ZERO;
    });
    let ttl = BTreeMap::from([(NS_TTL_AFTER_FINISHED.to_owned(), "7m".to_owned())]);
    c.cache
        .write()
        .update(Update::Namespace(Change::Apply(NamespaceEntry {
            key: ObjectKey::new("", "ml"),
            annotations: ttl,
        })));
    let outcome = c.clone().reconcile(key("newer")).await;
    assert_eq!(outcome, Outcome::Retry(Failure::LiveDisagrees));
    assert!(lock(&c.cluster.sent).is_empty());
}

/// What the world does to the claims' writes, in the model test: DELETEs refused, throttled,
/// unanswered (a 5xx, a lost answer), or in conflict; revocations carried out (changing the
/// claim, with its watch event or with none reaching the controller), unanswered or
/// refused with the claim as it was. Once they run out, every write succeeds. Besides, at
/// instants of its own, the Lease is handed over and back (a real step-down and take: the
/// election runs over a fake Lease store, the cap is forgotten and recovered from the Lease),
/// deleted and created again, or the API server's clock contradicts its earlier answers. Each
/// DELETE goes through the election's fence, so naming, the sending state, `NotNamed` and the
/// group commit run as in the daemon; the cap is small and binds.
mod model {
    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::cluster::leader::tests::{FakeStore, compete, named_on};
    use crate::daemon::scheduler::{BACKOFF_MAX, DENIED_BACKOFF_MAX, UNREVOKED_BACKOFF_MAX};
    use crate::observe::http::Health;

    /// How long a hand-over keeps this replica standing by, at most: the rival's lease (16 s,
    /// `leader::tests`) from the round that saw it take the Lease, and the round that takes it
    /// back.
    const STANDBY: Duration = Duration::from_secs(20);
    /// How much longer a clock dispute holds the cap full (it began earlier than seen here).
    const DISPUTED: Duration = Duration::from_secs(60);
    /// The cap's window: short, so that a DELETE owed a revocation outlives it.
    const WINDOW: Duration = Duration::from_secs(60);

    /// What else happens, `.0` seconds after the claims are first decided.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Event {
        /// Another replica takes the Lease (this one steps down at its next write) and stops
        /// renewing it, revoking nothing; this replica takes it back once it expired.
        HandOver,
        /// The Lease is deleted (`kubectl delete lease`, its namespace re-created): the next
        /// round creates it again.
        LeaseRecreated,
        /// An answer's `Date` contradicts the earlier ones: the cap counts its window as full.
        ClockDisputed,
    }

    fn delete_fault() -> impl Strategy<Value = DeleteResult> {
        prop_oneof![
            4 => Just(DeleteResult::Unanswered),
            2 => Just(DeleteResult::Denied),
            1 => Just(DeleteResult::Throttled),
            1 => Just(DeleteResult::Conflict),
        ]
    }

    fn revocation_fault() -> impl Strategy<Value = (Revocation, bool)> {
        prop_oneof![
            2 => Just((Revocation::Revoked, true)),
            2 => Just((Revocation::Revoked, false)),
            2 => Just((Revocation::Unanswered, false)),
            1 => Just((Revocation::Refused, false)),
        ]
    }

    /// Revocations: a few of any kind, or a run that keeps failing past the cap's window.
    fn revocations() -> impl Strategy<Value = Vec<(Revocation, bool)>> {
        prop_oneof![
            prop::collection::vec(revocation_fault(), 0..8),
            (0..4usize, 6..12usize).prop_map(|(revoked, failing)| {
                let mut run = vec![(Revocation::Revoked, true); revoked];
                run.extend(vec![(Revocation::Unanswered, false); failing]);
                run
            }),
        ]
    }

    fn event() -> impl Strategy<Value = (u64, Event)> {
        (
            0..120u64,
            prop_oneof![
                Just(Event::HandOver),
                Just(Event::LeaseRecreated),
                Just(Event::ClockDisputed)
            ],
        )
    }

    /// The claims (each due), the cap on them in each window, and what the world does.
    struct World<'a> {
        claims: &'a [&'a str],
        cap: u32,
        answers: &'a [DeleteResult],
        revocations: &'a [(Revocation, bool)],
        events: &'a [(u64, Event)],
    }

    /// What the model saw, from the claims' start: every claim write (the claim's name, the
    /// write), when the cap was held full by a dispute, and each Lease stored while a DELETE
    /// that may still land (sent without an answer, not revoked) was not named on it.
    struct Seen {
        log: Vec<(Duration, String, Write)>,
        disputed: Vec<(Duration, Duration)>,
        unnamed: Vec<(Duration, String)>,
    }

    impl Seen {
        fn deleted(&self, claim: &str) -> Option<Duration> {
            (self.log.iter())
                .find(|(_, c, w)| c == claim && *w == Write::Delete(DeleteResult::Deleted))
                .map(|(at, _, _)| *at)
        }
    }

    /// Runs `world` under the scheduler and a real election, in paused time, until every
    /// claim is deleted or `limit` has passed.
    fn run(world: &World<'_>, limit: Duration) -> Seen {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let cluster = FakeCluster::default();
            lock(&cluster.answers).extend(world.answers.iter().map(|a| Ok(*a)));
            lock(&cluster.revocations).extend(world.revocations.iter().map(|r| r.0));
            lock(&cluster.revocation_events).extend(world.revocations.iter().map(|r| r.1));
            // A refused revocation reads the claim as it was: the DELETE may still land.
            for claim in world.claims {
                lock(&cluster.claim_states).insert((*claim).to_owned(), false);
            }
            let registry = Arc::<DeletesInFlight>::default();
            let store = FakeStore::new(None);
            let started = Instant::now();
            {
                let (may_land, unnamed) = (cluster.may_land.clone(), cluster.unnamed.clone());
                store.watch(move |lease| {
                    let named = named_on(lease);
                    for uid in lock(&may_land).iter().filter(|uid| !named.contains(uid)) {
                        lock(&unnamed).push((Instant::now(), uid.clone()));
                    }
                });
            }
            let leadership = compete(&store, "me", registry.clone());
            *lock(&cluster.fence) = Some((leadership.fence(), leadership.subscribe()));
            let claims: Vec<ClaimFacts> = world.claims.iter().map(|name| due(name)).collect();
            let c = controller_on(cluster, world.cap, &claims, registry, |config| {
                config.deletion.window = WINDOW;
            });
            let scheduler = lock(&c.cluster.scheduler).take().expect("the scheduler");
            *lock(&c.cluster.events) = Some(c.schedule.clone());
            let follower = tokio::spawn(super::super::run::follow_leadership(
                c.clone(),
                Arc::new(Health::default()),
            ));
            let stop = CancellationToken::new();
            let reconcile = {
                let c = c.clone();
                move |key| c.clone().reconcile(key)
            };
            let task = tokio::spawn(scheduler.run(4, reconcile, stop.clone()));
            // Winning the Lease wakes every claim, as in the daemon.
            let mut leading = leadership.subscribe();
            leading.wait_for(|leading| *leading).await.expect("open");
            let start = Instant::now();
            let done = |c: &Controller<FakeCluster, FakeClock>| {
                let log = lock(&c.cluster.log);
                (world.claims.iter()).all(|claim| {
                    (log.iter()).any(|(_, (name, write))| {
                        name == claim && *write == Write::Delete(DeleteResult::Deleted)
                    })
                })
            };
            let mut events: VecDeque<(u64, Event)> = {
                let mut sorted = world.events.to_vec();
                sorted.sort_by_key(|(at, _)| *at);
                sorted.into()
            };
            let mut disputed = Vec::new();
            while !done(&c) && start.elapsed() < limit {
                while let Some((at, event)) = events.front().copied()
                    && start.elapsed() >= Duration::from_secs(at)
                {
                    events.pop_front();
                    match event {
                        Event::HandOver => store.taken_by_rival(),
                        Event::LeaseRecreated => store.remove(),
                        Event::ClockDisputed => {
                            let now = Instant::now();
                            *lock(&c.clock.dispute) = Some(Dispute {
                                since: now,
                                until: now + DISPUTED,
                            });
                            // A DELETE admitted at that instant still goes, once the
                            // Lease write that records it (5 ms, `leader/commit.rs`) is done.
                            let admitted = Duration::from_millis(10);
                            disputed.push((now - start + admitted, now - start + DISPUTED));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop.cancel();
            task.await.expect("the scheduler stops");
            follower.abort();
            let since = |at: Instant| at.saturating_duration_since(start);
            let log = (lock(&c.cluster.log).iter())
                .map(|(at, (claim, write))| (since(*at), claim.clone(), *write))
                .collect();
            let unnamed = (lock(&c.cluster.unnamed).iter())
                .map(|(at, uid)| (since(*at.max(&started)), uid.clone()))
                .collect();
            Seen {
                log,
                disputed,
                unnamed,
            }
        })
    }

    /// The blast-radius cap as RELIABILITY.md promises it: at no DELETE do more than `cap`
    /// DELETEs that may land count in its window, one carried out for a window from when it
    /// was sent, one without an answer from then until its revocation proves it never landed
    /// (or that it did), however long that takes and whoever leads meanwhile. `Err`: the
    /// DELETE that went past the cap.
    fn within_the_cap(log: &[(Duration, String, Write)], cap: u32) -> Result<(), String> {
        let mut counted: Vec<(Duration, Option<Duration>)> = Vec::new();
        for (i, (at, claim, write)) in log.iter().enumerate() {
            let until = match write {
                Write::Delete(DeleteResult::Deleted) => Some(*at + WINDOW),
                Write::Delete(DeleteResult::Unanswered) => (log[i + 1..].iter())
                    .find(|(_, c, w)| {
                        c == claim
                            && matches!(w, Write::Revoke(Revocation::Revoked | Revocation::Landed))
                    })
                    .map(|(revoked, _, _)| *revoked),
                _ => continue,
            };
            let holding = (counted.iter())
                .filter(|(from, until)| *from <= *at && until.is_none_or(|until| *at < until))
                .count();
            if holding >= cap as usize {
                return Err(format!(
                    "the DELETE of {claim} at {at:?} beside {holding} counted: {log:?}"
                ));
            }
            counted.push((*at, until));
        }
        Ok(())
    }

    /// Safety: after a DELETE without a definite answer nothing but its revocation is sent
    /// for its claim until one is answered; none while a clock dispute holds the cap full;
    /// the cap holds across terms (`within_the_cap`); every Lease stored while a DELETE may
    /// land names it. Cost: a DELETE that failed is followed by another of its claim no sooner
    /// than the first backoff, whatever wakes it.
    fn safe(world: &World<'_>, seen: &Seen) -> Result<(), String> {
        let Seen {
            log,
            disputed,
            unnamed,
        } = seen;
        if !unnamed.is_empty() {
            return Err(format!(
                "Leases not naming a DELETE that may land: {unnamed:?}"
            ));
        }
        within_the_cap(log, world.cap)?;
        let mut outstanding = BTreeSet::new();
        let mut last_delete: BTreeMap<&str, Duration> = BTreeMap::new();
        for (at, claim, write) in log {
            match write {
                Write::Delete(result) => {
                    if outstanding.contains(claim) {
                        return Err(format!(
                            "a DELETE of {claim} past an unrevoked one: {log:?}"
                        ));
                    }
                    if disputed.iter().any(|(from, to)| from <= at && at < to) {
                        return Err(format!("a DELETE at {at:?} while disputed {disputed:?}"));
                    }
                    if let Some(before) = last_delete.insert(claim, *at)
                        && *at - before < Duration::from_secs(1)
                    {
                        return Err(format!("DELETEs {:?} apart: {log:?}", *at - before));
                    }
                    if *result == DeleteResult::Unanswered {
                        outstanding.insert(claim.clone());
                    }
                }
                Write::Revoke(Revocation::Revoked | Revocation::Landed) => {
                    outstanding.remove(claim);
                }
                Write::Revoke(_) => {}
            }
        }
        Ok(())
    }

    /// How long the world may take to delete every claim once its faults end: the backoffs
    /// the faults cost, a standby for each hand-over, the rest of each dispute, and a window
    /// of the cap for each DELETE that may hold a slot.
    fn bound(world: &World<'_>) -> Duration {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let ceiling = |answer: &DeleteResult| match answer {
            DeleteResult::Denied => DENIED_BACKOFF_MAX,
            _ => BACKOFF_MAX,
        };
        let delay = |event: &(u64, Event)| match event.1 {
            // A revocation owed again on winning costs one more failure at worst.
            Event::HandOver | Event::LeaseRecreated => STANDBY + UNREVOKED_BACKOFF_MAX * 2,
            Event::ClockDisputed => DISPUTED + BACKOFF_MAX,
        };
        let last_event = (world.events.iter())
            .map(|(at, _)| Duration::from_secs(*at))
            .max();
        let slots = world.answers.len() + world.claims.len();
        (world.answers.iter().map(ceiling).sum::<Duration>())
            + UNREVOKED_BACKOFF_MAX * count(world.revocations.len())
            + world.events.iter().map(delay).sum::<Duration>()
            + last_event.unwrap_or_default()
            + WINDOW * count(slots).div_ceil(world.cap)
            + Duration::from_secs(60)
    }

    /// Runs `world` and checks it is safe, and live: every claim deleted within its bound.
    fn check(world: &World<'_>) -> Result<(), String> {
        let bound = bound(world);
        let seen = run(world, bound + Duration::from_secs(60));
        safe(world, &seen)?;
        for claim in world.claims {
            if seen.deleted(claim).is_none_or(|at| at > bound) {
                return Err(format!(
                    "{claim} not deleted within {bound:?}: {:?}",
                    seen.log
                ));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Two claims under a cap of one DELETE a window (`safe`), and any answers end in
        /// both deleted within the bound their faults cost.
        #[test]
        fn any_answers_end_in_the_deletes_within_the_cap_and_nothing_sent_past_a_revocation(
            answers in prop::collection::vec(delete_fault(), 0..8),
            revocations in revocations(),
            events in prop::collection::vec(event(), 0..3),
        ) {
            let world = World {
                claims: &["a", "b"],
                cap: 1,
                answers: &answers,
                revocations: &revocations,
                events: &events,
            };
            if let Err(failed) = check(&world) {
                prop_assert!(false, "{failed}");
            }
        }
    }

    /// A DELETE without an answer whose revocation keeps failing, through a hand-over (the cap
    /// forgotten and recovered from the Lease), still fills a cap of one a window later: the
    /// other claim waits until it is revoked.
    #[test]
    fn an_owed_delete_fills_the_cap_across_a_hand_over() {
        let world = World {
            claims: &["a", "b"],
            cap: 1,
            answers: &[DeleteResult::Unanswered],
            revocations: &[(Revocation::Unanswered, false); 10],
            events: &[(5, Event::HandOver)],
        };
        check(&world).unwrap();
    }

    /// A Lease deleted and created again while a DELETE may still land names it, as the ledger
    /// survives it: the next leader revokes it.
    #[test]
    fn a_lease_created_again_names_the_deletes_that_may_still_land() {
        let world = World {
            claims: &["a", "b"],
            cap: 1,
            answers: &[DeleteResult::Unanswered],
            revocations: &[(Revocation::Unanswered, false); 4],
            events: &[(5, Event::LeaseRecreated)],
        };
        check(&world).unwrap();
    }

    /// Cost under a standing failure, once its backoff has reached its ceiling: at most one
    /// DELETE and one revocation each backoff for one that goes unanswered (a lost answer, a
    /// 5xx not forwarded), one DELETE each denied backoff for a refusal (a webhook that is
    /// down), and never a write storm (RELIABILITY.md, "Cost").
    #[test]
    fn a_standing_failure_costs_one_attempt_a_backoff() {
        let minute = Duration::from_secs(60);
        let per_minute = |log: &[(Duration, String, Write)], from: Duration, to: Duration| {
            let deletes = (log.iter())
                .filter(|(at, _, w)| (from..to).contains(at) && matches!(w, Write::Delete(_)))
                .count();
            let revocations = (log.iter())
                .filter(|(at, _, w)| (from..to).contains(at) && matches!(w, Write::Revoke(_)))
                .count();
            let minutes = (to - from).as_secs_f64() / 60.0;
            (deletes as f64 / minutes, revocations as f64 / minutes)
        };
        let one = |answers: &[DeleteResult], revocations: &[(Revocation, bool)], limit| {
            let world = World {
                claims: &["a"],
                cap: 1000,
                answers,
                revocations,
                events: &[],
            };
            run(&world, limit).log
        };
        // Unanswered every time, each revocation carried out with its own watch event.
        let answers = vec![DeleteResult::Unanswered; 500];
        let revocations = vec![(Revocation::Revoked, true); 500];
        let log = one(&answers, &revocations, minute * 30);
        let ceiling = minute.as_secs_f64() / BACKOFF_MAX.as_secs_f64();
        let (ramp, _) = per_minute(&log, Duration::ZERO, minute * 10);
        assert!(
            ramp <= ceiling * 1.5,
            "{ramp} DELETEs a minute while backing off"
        );
        let (deletes, revoked) = per_minute(&log, minute * 10, minute * 30);
        assert!(
            deletes >= ceiling * 0.9,
            "still retried: {deletes} a minute"
        );
        assert!(deletes <= ceiling * 1.1, "{deletes} DELETEs a minute");
        assert!(revoked <= ceiling * 1.1, "{revoked} revocations a minute");
        // Unanswered once, and its revocation never answered: one revocation a minute,
        // nothing else sent for the claim.
        let revocations = vec![(Revocation::Unanswered, false); 500];
        let log = one(&[DeleteResult::Unanswered], &revocations, minute * 30);
        let (deletes, revoked) = per_minute(&log, minute * 10, minute * 30);
        let ceiling = minute.as_secs_f64() / UNREVOKED_BACKOFF_MAX.as_secs_f64();
        assert_eq!(deletes, 0.0, "nothing sent past an unrevoked DELETE");
        assert!(
            (ceiling * 0.9..=ceiling * 1.1).contains(&revoked),
            "{revoked} revocations a minute"
        );
        // Denied every time: the refusal's own, longer, backoff.
        let answers = vec![DeleteResult::Denied; 500];
        let log = one(&answers, &[], minute * 60);
        let (deletes, revoked) = per_minute(&log, minute * 30, minute * 60);
        let ceiling = minute.as_secs_f64() / DENIED_BACKOFF_MAX.as_secs_f64();
        assert!(
            deletes <= ceiling * 1.1 && revoked == 0.0,
            "{deletes} a minute"
        );
    }
}

/// Every function of the controller's files that returns a lock guard, as (file, name, whether
/// it is visible outside its own file).
fn guard_handouts() -> Vec<(String, String, bool)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon/controller");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let code = std::fs::read_to_string(&path).unwrap();
        for (at, _) in code.match_indices("fn ") {
            let signature = &code[at..];
            let signature = &signature[..signature.find(['{', ';']).unwrap_or(signature.len())];
            if !signature.contains("Guard<") {
                continue;
            }
            let name = signature[3..].split(['(', '<']).next().unwrap().to_owned();
            let line = code[..at].rsplit('\n').next().unwrap();
            // A child module sees its parent's private items: mod.rs's count as visible.
            let visible = line.contains("pub") || file == "mod.rs";
            found.push((file.clone(), name, visible));
        }
    }
    found.sort();
    found
}

/// Each concern's state is in private fields of a type in its own file, so only that file can
/// change it (the compiler refuses any other); and no concern hands its lock out, so no caller
/// holds another's. The cache is the one lock shared, written by the feed alone; the registry
/// is driven as the elector drives it only by the tests.
#[test]
fn no_concern_hands_its_lock_to_another() {
    let visible: Vec<_> = (guard_handouts().into_iter())
        .filter(|(_, _, visible)| *visible)
        .map(|(file, name, _)| format!("{file} {name}"))
        .collect();
    assert_eq!(
        visible,
        ["in_flight.rs lease_side", "mod.rs read", "mod.rs write"]
    );
    let writers: Vec<_> = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/daemon/controller"
    ))
    .unwrap()
    .map(|entry| entry.unwrap().path())
    .filter(|path| !path.ends_with("tests.rs"))
    .filter(|path| {
        std::fs::read_to_string(path)
            .unwrap()
            .contains("cache.write()")
    })
    .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
    .collect();
    assert_eq!(writers, ["feed.rs"], "the feed alone writes the cache");
}

/// The controller holds what every concern shares and the concerns, no more than seven.
#[test]
fn the_controller_holds_at_most_seven_fields() {
    let code = include_str!("mod.rs");
    let body = &code[code.find("struct Controller<C, K> {").unwrap()..];
    let body = &body[..body.find('}').unwrap()];
    let fields = body
        .lines()
        .filter(|line| line.trim_end().ends_with(','))
        .count();
    assert!((1..=7).contains(&fields), "{fields} fields");
}

/// The index the watches leave once they listed `claims` (the claims' list first), built for
/// `config` as the daemon builds it: the cap's share is taken of the candidates it held when it
/// synced.
fn listed(config: &Config, claims: &[ClaimFacts]) -> Index {
    let mut index = crate::cluster::watches::index(config);
    index.update(Update::Claim(Change::Init(None)));
    for claim in claims {
        index.update(Update::Claim(Change::InitApply(None, claim.clone())));
    }
    index.update(Update::Claim(Change::InitDone(None)));
    index.update(Update::Job(Change::InitDone(None)));
    index.update(Update::Run(Change::InitDone(None)));
    index.update(Update::TaskRun(Change::InitDone(None)));
    index.update(Update::Pod(Change::InitDone(None)));
    index
}

/// The share is of the candidates: 300 labelled claims in another namespace that fail
/// provenance (their names lack the operator's shape) raise nothing; and a flood of new
/// candidates arriving within a window does not raise that window's allowance, only the next
/// one's. (Before, the share was taken of every labelled claim: 10 % of 310 let both due
/// claims go at once, and the flood raised its own window's share.)
#[tokio::test(start_paused = true)]
async fn the_share_is_of_the_candidates_the_window_began_with() {
    let edit = |config: &mut Config| {
        config.deletion.max_deletions_percent = Some(10.0);
        config.provenance.claim_suffixes = vec!["-build-workspace".into()];
    };
    let kept = |name: &str| {
        let mut claim = due(name);
        (claim.annotations).insert(crate::contract::annotations::KEEP.into(), "true".into());
        claim
    };
    let mut claims: Vec<ClaimFacts> = (0..8)
        .map(|i| kept(&format!("steady{i}-build-workspace")))
        .collect();
    claims.extend(["a-build-workspace", "b-build-workspace"].map(due));
    claims.extend((0..300).map(|i| {
        let mut junk = due(&format!("junk-{i}"));
        junk.key = ObjectKey::new("other", &format!("junk-{i}"));
        junk
    }));
    let c = controller_with(FakeCluster::default(), 100, &[], true, edit);
    let mut config = Config::default();
    config.quota.enabled = false;
    edit(&mut config);
    *c.cache.write() = listed(&config, &claims);
    for name in ["a-build-workspace", "b-build-workspace"] {
        c.clone().reconcile(key(name)).await;
    }
    assert_eq!(
        lock(&c.cluster.sent).len(),
        1,
        "10 % of the 10 candidates; the 300 without provenance are none"
    );
    let flood: Vec<String> = (0..10).map(|i| format!("new{i}-build-workspace")).collect();
    for name in &flood {
        (c.cache.write()).update(Update::Claim(Change::Apply(due(name))));
    }
    for name in &flood {
        c.clone().reconcile(key(name)).await;
    }
    assert_eq!(
        lock(&c.cluster.sent).len(),
        1,
        "20 candidates now, but the window began with 10"
    );
    tokio::time::advance(Duration::from_secs(3700)).await;
    let waiting: Vec<&str> = (flood.iter().map(String::as_str))
        .chain(["b-build-workspace"])
        .collect();
    for _ in 0..2 {
        for name in &waiting {
            c.clone().reconcile(key(name)).await;
        }
    }
    assert_eq!(
        lock(&c.cluster.sent).len(),
        3,
        "a window later, 10 % of the 20 candidates"
    );
}
