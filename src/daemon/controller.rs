//! The daemon's wiring: watches feed the cache, changes schedule the claims they affect, and
//! each reconcile gathers facts from the cache, asks the pure policy (and, while its namespace's
//! quota is nearly exhausted, the pure quota plan), and acts through the writer — after the
//! limiter admits it and a live re-check confirms it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::FusedFuture;
use futures::{FutureExt, StreamExt};
use kube::Client;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::cache::{Change, Index, Scope, Update};
use crate::cluster::leader::{FenceError, InFlight, Leadership};
use crate::cluster::live::Snapshots;
use crate::cluster::served::Served;
use crate::cluster::server_clock::ServerClock;
use crate::cluster::watches::{self, PROVEN};
use crate::cluster::writer::{Mode, NotSent, Notice, Revocation, Writer};
use crate::config::{Config, MAX_DURATION, deletion_interval};
use crate::daemon::limiter::{Admission, Limiter, Line, Reservation};
use crate::daemon::ports::{Clock, Cluster, KubeCluster};
use crate::daemon::proof::{self, PROOF_BOUND, Proofs, Recheck, Recorded};
use crate::daemon::scheduler::{Failure, Outcome, Schedule, Scheduler};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::{self, Found};
use crate::decide::namespace::Policies;
use crate::decide::policy::{self, Decision, Policy, Reason, Verdict};
use crate::decide::quota::{self, Plan, Present, Rounds, Sent, Waters};
use crate::decide::volumes::{self, Kept, VolumeFacts, VolumeVerdict};
use crate::observe::access::Gate;
use crate::observe::http::{self, BEAT_EVERY, Health};
use crate::observe::metrics::{DeleteResult, ErrorCategory, Kind, Mark, Metrics, Revoked};

/// How many claims are reconciled at once. A reconcile mostly waits: on the limiter, on a
/// shared proof round or namespace snapshot (whose LISTs are bounded apart, in `cluster::live`),
/// so this bounds waiting more than load. At 16, a burst in namespaces whose re-checks are
/// proven (a round of a second or two, each re-check waiting for the next) was held to about
/// 7 claims a second (bench/, 10,000 builds, 16 due a second).
const CONCURRENCY: usize = 64;
/// While the API server cannot be reached, how often to check whether it answers again.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// The oldest a live re-check may be when its DELETE goes out, counted from its first read: a
/// re-check that took longer, or a DELETE held up longer (by the Lease write before it), is
/// not live any more, and the claim is decided again from the start. It bounds how long a pod
/// or a run started after the re-check can go unseen by the delete.
pub const LIVE_BOUND: Duration = Duration::from_secs(5);
/// The cached jobs, runs and pods in a claim's namespace from which its re-check proves the cache
/// fresh (`daemon::proof`) instead of listing the namespace: below it the LISTs are small and
/// answer at once, where a round costs a second or two when a kind is quiet.
const PROVE_FROM: usize = 100;
/// How often a proof waiting for the watches to deliver what a replay found looks again.
const CATCH_UP_POLL: Duration = Duration::from_millis(20);
/// Shutdown must finish within the pod's grace period (30 s) whatever the API server does:
/// the lease release and the HTTP server each get this long.
const SHUTDOWN_STEP: Duration = Duration::from_secs(5);

/// What `run` needs besides the configuration.
pub struct RunOptions {
    /// This replica's identity for the lease and events (the pod name in a cluster).
    pub identity: String,
    /// The namespace this replica runs in, for the lease.
    pub pod_namespace: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub listen: SocketAddr,
    /// The API server's clock, fed by the client's answers: deadlines are judged by it.
    pub clock: ServerClock,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not serve HTTP on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A task the daemon cannot work without ended: exit, so that the pod restarts, rather
    /// than run half alive.
    #[error("the {0} stopped unexpectedly; exiting so that the pod restarts")]
    TaskEnded(&'static str),
    #[error("http.tls_cert_file, http.tls_key_file: {0}")]
    Tls(#[from] http::TlsError),
}

/// The blast-radius cap as its notice tells it: at most `max` deletions in any `window`.
struct Cap {
    max: u32,
    window: String,
}

/// Everything a reconcile reads, built once.
struct Controller<C, K> {
    cluster: C,
    clock: K,
    policies: Policies,
    index: RwLock<Index>,
    metrics: Arc<Metrics>,
    limiter: Mutex<Limiter>,
    cap: Cap,
    schedule: Schedule,
    leading: watch::Receiver<bool>,
    /// Quota pressure's thresholds; `None` when disabled.
    quota: Option<Waters>,
    rounds: Mutex<Rounds>,
    /// The claims the cap holds back, earliest due first. Each is told once per episode (until
    /// it gets a slot, is no longer due, or is gone), not at every retry.
    line: Mutex<Line<ObjectKey>>,
    /// How long before a claim becomes due its `DeletionScheduled` event is written; `None`: never.
    notice_before: Option<chrono::Duration>,
    /// Per claim, the UID and due instant last announced (leader only): once per deadline.
    noticed: Mutex<HashMap<ObjectKey, (String, DateTime<Utc>)>>,
    /// Whether a bound claim's volume is read before its delete (`deletion.read_volumes`).
    read_volumes: bool,
    /// Whether a `Retain` volume is marked once its claim's delete succeeded, so that it is
    /// deleted once Released (`deletion.released_volume_ttl`).
    mark_volumes: bool,
    /// Released volumes warned about (by UID) for a transition time not known: once each.
    unjudged: Mutex<BTreeSet<String>>,
    /// Per namespace, the annotations last warned about (leader only): told once per change.
    warned: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Claims (by UID) whose DELETE was answered with success: until the watch shows them
    /// gone, the claim is read live before anything is sent again, since a cache the watch
    /// has not caught up on still shows it as it was decided.
    already_sent: Mutex<HashMap<ObjectKey, String>>,
    /// Whether the claims' watch has failed and delivered nothing since: its cache may still
    /// show a claim that is gone (deleted by the replica that led before, while this one's
    /// watch was down), so every claim is read live before its DELETE until it delivers again.
    claims_watch_broken: std::sync::atomic::AtomicBool,
    /// Claims whose DELETE got no definite answer: it may still reach the API server, so the
    /// claim is revoked (changed) before anything else is decided for it.
    outstanding: Mutex<HashMap<ObjectKey, Outstanding>>,
    /// The rounds that prove the cache fresh for the live re-check.
    proofs: Proofs,
    /// Whether the watches cover one namespace each (`selector.namespaces`), not the cluster.
    per_namespace: bool,
}

/// A claim DELETE without a definite answer, and its slot of the cap while it may land: a
/// revocation that proves it never can frees the slot. `None` for one the Lease named when
/// this replica won it (the ledger recovered from the Lease counts it).
#[derive(Debug, Clone)]
struct Outstanding {
    delete: InFlight,
    reservation: Option<Reservation>,
}

/// When a kept claim becomes due and why, with the notice's lead time.
type Scheduled = Option<((DateTime<Utc>, Reason), chrono::Duration)>;

/// What the DELETE stage did: its result, or why nothing was sent.
type SendResult = Result<DeleteResult, NotSent>;

/// What the live re-check confirmed, and until when the DELETE may rest on it.
#[derive(Debug, Clone)]
struct Confirmed {
    reason: Reason,
    /// The claim's volume, as read (only with `deletion.read_volumes`).
    volume: Option<VolumeFacts>,
    /// The verdict's due instant, for the reclaim lag.
    due_at: Option<DateTime<Utc>>,
    live_until: Instant,
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

/// Runs the daemon until `stop` is cancelled: finishes the deletes in flight, releases the
/// lease, and returns.
pub async fn run(
    client: Client,
    config: Config,
    options: RunOptions,
    stop: CancellationToken,
) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    options.clock.report_to(metrics.clone());
    // A client built without the clock's layer (in-process tests) tells it nothing by itself.
    if !options.clock.known()
        && let Err(error) = options.clock.ask(&client).await
    {
        warn!(%error, "cannot read the API server's clock yet; nothing is due until it is known");
    }
    let health = Arc::new(Health::default());
    let secure = match (
        &config.http.secure_listen,
        &config.http.tls_cert_file,
        &config.http.tls_key_file,
    ) {
        (Some(addr), Some(cert), Some(key)) => Some(http::Secure {
            addr: *addr,
            tls: Arc::new(http::tls_config(cert, key)?),
            gate: Gate::new(client.clone()),
        }),
        // Validation sets the three together.
        _ => None,
    };
    let server = http::serve(
        options.listen,
        secure,
        registry,
        health.clone(),
        stop.clone(),
    )
    .await
    .map_err(|(addr, source)| RunError::Listen { addr, source })?;

    let lease_namespace = config
        .leader_election
        .lease_namespace(options.pod_namespace.as_deref())
        .to_owned();
    let leadership = Leadership::start(
        client.clone(),
        &config.leader_election,
        &lease_namespace,
        options.identity.clone(),
        metrics.clone(),
    );

    let mode = if config.deletion.dry_run {
        Mode::DryRun {
            server_side: config.deletion.server_side_dry_run,
        }
    } else {
        Mode::Delete
    };
    info!(?mode, "starting");
    let (schedule, scheduler) = Scheduler::new();
    let served = Served::new(client.clone(), Some((metrics.clone(), health.clone())));
    let cluster = KubeCluster {
        writer: Writer::new(
            client.clone(),
            mode,
            Some(options.identity),
            leadership.fence(),
        ),
        fence: leadership.fence(),
        snapshots: Snapshots::default(),
        served: served.clone(),
        client: client.clone(),
    };
    let controller = Arc::new(Controller::new(
        &config,
        cluster,
        options.clock,
        metrics.clone(),
        schedule,
        leadership.subscribe(),
    ));

    // Fused, so that a task already seen to end is not polled again below.
    let feeder = tokio::spawn(feed(
        controller.clone(),
        watches::updates(&client, &config, &served),
        health.clone(),
    ));
    let follower = tokio::spawn(follow_leadership(controller.clone(), health));
    // Not among the tasks the daemon cannot work without: it only ever ends on stop.
    let sweeper = (config.deletion.released_volume_ttl)
        .map(|ttl| tokio::spawn(sweep_released(controller.clone(), ttl, stop.clone())));
    let aborts = [feeder.abort_handle(), follower.abort_handle()];
    let (mut feeder, mut follower, mut server) = (feeder.fuse(), follower.fuse(), server.fuse());

    let reconciler = controller.clone();
    let scheduling = scheduler.run(
        CONCURRENCY,
        move |key| reconciler.clone().reconcile(key),
        stop.clone(),
    );
    tokio::pin!(scheduling);
    // The watches, the election (whose end closes the leadership channel the follower reads)
    // and the HTTP server run until stop; one that ends before is fatal.
    let mut scheduled = false;
    let ended = tokio::select! {
        () = &mut scheduling => {
            scheduled = true;
            None
        }
        _ = &mut feeder => Some("watch stream"),
        _ = &mut follower => Some("leader election"),
        _ = &mut server => Some("HTTP server"),
    };
    // The HTTP server ends on stop too, while the scheduler drains.
    let ended = ended.filter(|_| !stop.is_cancelled());
    if !scheduled {
        stop.cancel();
        scheduling.await;
    }

    for abort in aborts {
        abort.abort();
    }
    if let Some(sweeper) = sweeper {
        let _ = sweeper.await;
    }
    for task in [&mut feeder, &mut follower] {
        if !task.is_terminated() {
            let _ = task.await;
        }
    }
    drop(controller);
    if tokio::time::timeout(SHUTDOWN_STEP, leadership.release())
        .await
        .is_err()
    {
        warn!("releasing the lease took too long; a standby takes over when it expires");
    }
    if !server.is_terminated()
        && tokio::time::timeout(SHUTDOWN_STEP, &mut server)
            .await
            .is_err()
    {
        warn!("the HTTP server did not stop in time; leaving it");
    }
    match ended {
        Some(task) => Err(RunError::TaskEnded(task)),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// The most watch items applied under one hold of the index's write lock: enough that a list's
/// burst costs one wake-up and one lock a chunk rather than one per object, few enough that a
/// reconcile waiting to read is held up for milliseconds at most.
const FEED_CHUNK: usize = 512;

/// Applies watch updates to the cache and schedules the claims each one affects. Nothing is
/// scheduled until every watch has listed once; then every claim is. What the watches have
/// ready is applied as one chunk, in order.
async fn feed<C: Cluster, K: Clock>(
    controller: Arc<Controller<C, K>>,
    updates: futures::stream::BoxStream<'static, watches::Item>,
    health: Arc<Health>,
) {
    let mut chunks = updates.ready_chunks(FEED_CHUNK);
    loop {
        health.beat();
        let chunk = if health.is_unreachable() {
            // A watch that resumes where it left off delivers nothing until something changes,
            // so probe for the way back instead of waiting for an event.
            tokio::select! {
                chunk = chunks.next() => chunk,
                () = tokio::time::sleep(PROBE_EVERY) => {
                    if controller.cluster.answers().await {
                        record_reachability(&health, true);
                    }
                    continue;
                }
            }
        } else {
            // Turns with no event too, so that /healthz tells a quiet cluster from a stuck loop.
            tokio::select! {
                chunk = chunks.next() => chunk,
                () = tokio::time::sleep(BEAT_EVERY) => continue,
            }
        };
        let Some(chunk) = chunk else { break };
        let fed = apply_chunk(&controller, &health, chunk);
        if fed.synced_now {
            info!(
                claims = fed.affected.len(),
                "caches synced; evaluating every claim"
            );
            health.set_synced();
            controller.metrics.set_ready(health.is_ready());
        }
        for key in fed.affected {
            controller.schedule.now(key);
        }
        let namespaces: Vec<String> = if fed.every_namespace {
            controller.read_index().namespace_names()
        } else {
            fed.namespaces.into_iter().collect()
        };
        if !namespaces.is_empty() {
            let controller = controller.clone();
            tokio::spawn(async move {
                for namespace in namespaces {
                    controller.warn_namespace(&namespace).await;
                }
            });
        }
    }
}

/// What a chunk of watch items changed.
#[derive(Default)]
struct Fed {
    /// The claims to evaluate: every claim when the caches have just synced.
    affected: BTreeSet<ObjectKey>,
    /// The caches synced within the chunk.
    synced_now: bool,
    /// Namespaces whose annotations may have changed.
    namespaces: BTreeSet<String>,
    /// The Namespaces were (re-)listed: any of their annotations may have changed.
    every_namespace: bool,
}

/// Applies a chunk of watch items in order, holding the index's write lock once for it.
fn apply_chunk<C: Cluster, K: Clock>(
    controller: &Controller<C, K>,
    health: &Health,
    chunk: Vec<watches::Item>,
) -> Fed {
    let mut fed = Fed::default();
    let mut index = controller.write_index();
    for item in chunk {
        let update = match item {
            Ok(update) => update,
            Err((kind, error)) => {
                controller.metrics.watch_restart(kind);
                if kind == Kind::Claims {
                    controller.claims_watch_broken(true);
                }
                warn!(kind = kind.as_str(), %error, "watch failed; retrying with backoff");
                if cannot_connect(&error) {
                    record_reachability(health, false);
                }
                continue;
            }
        };
        record_reachability(health, true);
        if matches!(update, Update::Claim(_)) {
            controller.claims_watch_broken(false);
        }
        match &update {
            Update::Namespace(Change::Apply(entry)) => {
                fed.namespaces.insert(entry.key.name.clone());
            }
            Update::Namespace(Change::InitDone(_)) => fed.every_namespace = true,
            _ => {}
        }
        let was_synced = index.synced();
        let quotas_changed = quota_namespaces_changed(&update);
        let affected = index.update(update);
        if let Some(namespace) = quotas_changed {
            controller.observe_quotas(&index, namespace);
        }
        if index.synced() && !was_synced {
            fed.affected = index.claims().map(|c| c.key.clone()).collect();
            fed.synced_now = true;
        } else if index.synced() {
            fed.affected.extend(affected);
        }
    }
    controller.metrics.cached(index.sizes());
    fed
}

/// Whether an update may change what quota pressure sees of some namespace (its quotas, or a
/// claim leaving it, which a quota may owe a recount for): `Some(Some(ns))` for one,
/// `Some(None)` for a re-list that may change any; `None` for an update of another kind.
fn quota_namespaces_changed(update: &Update) -> Option<Option<String>> {
    match update {
        Update::Quota(Change::Apply(quota)) => Some(Some(quota.key.namespace.to_string())),
        Update::Quota(Change::Delete(key)) | Update::Claim(Change::Delete(key)) => {
            Some(Some(key.namespace.to_string()))
        }
        Update::Quota(Change::InitDone(_)) | Update::Claim(Change::InitDone(_)) => Some(None),
        _ => None,
    }
}

/// Records whether the API server can be reached, for the probe loop, the log and `/readyz`'s
/// body (not its status: see [`Health::is_ready`]).
fn record_reachability(health: &Health, answers: bool) {
    let unreachable = !answers;
    if health.is_unreachable() == unreachable {
        return;
    }
    health.set_unreachable(unreachable);
    if answers {
        info!("the API server answers again");
    } else {
        warn!("the API server cannot be reached; the watches are retrying");
    }
}

/// A watch failed to connect at all (refused, reset, timed out), as opposed to the API server
/// answering with an error (403, 410, 5xx), which does not make the daemon unready.
fn cannot_connect(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => ErrorCategory::of(e) == ErrorCategory::Connection,
        _ => false,
    }
}

/// How often the leader looks for Released volumes to delete: half their TTL, within 1 s and
/// 1 min (a list of every PersistentVolume, from the API server's cache).
fn sweep_every(ttl: Duration) -> Duration {
    (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Deletes, as the leader, the Released volumes whose claims it deleted, `ttl` after their
/// release (`deletion.released_volume_ttl`), until `stop`.
async fn sweep_released<C: Cluster, K: Clock>(
    controller: Arc<Controller<C, K>>,
    ttl: Duration,
    stop: CancellationToken,
) {
    let every = sweep_every(ttl);
    let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if controller.is_leader() {
            controller.sweep(ttl).await;
        }
    }
}

/// Publishes leadership to metrics and, on winning the lease, re-evaluates every claim: the
/// standby decided but did not act.
async fn follow_leadership<C: Cluster, K: Clock>(
    controller: Arc<Controller<C, K>>,
    health: Arc<Health>,
) {
    let mut leading = controller.leading.clone();
    loop {
        let is_leader = *leading.borrow_and_update();
        controller.metrics.set_leader(is_leader);
        health.set_leader(is_leader);
        if is_leader {
            info!("leading: this replica deletes");
            controller.recover_cap();
            controller.recover_rounds();
            controller.revoke_found().await;
            let keys: Vec<ObjectKey> = {
                let index = controller.read_index();
                if index.synced() {
                    index.claims().map(|c| c.key.clone()).collect()
                } else {
                    Vec::new()
                }
            };
            for key in keys {
                controller.schedule.now(key);
            }
            let namespaces = controller.read_index().namespace_names();
            for namespace in namespaces {
                controller.warn_namespace(&namespace).await;
            }
        } else {
            info!("standing by: another replica holds the lease");
            controller.lock_limiter().forget();
            *controller.lock_line() = Line::default();
            controller
                .warned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        if leading.changed().await.is_err() {
            return;
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
    ) -> Self {
        let deletion = &config.deletion;
        Controller {
            cluster,
            clock,
            policies: config.policies(),
            index: RwLock::new(watches::index(config)),
            metrics,
            limiter: Mutex::new(Limiter::new(
                // Validation refused every rate without an interval; the slowest pace otherwise.
                deletion_interval(deletion.deletes_per_second).unwrap_or(MAX_DURATION),
                deletion.max_deletions_per_window,
                deletion.window,
            )),
            cap: Cap {
                max: deletion.max_deletions_per_window,
                window: humantime::format_duration(deletion.window).to_string(),
            },
            schedule,
            leading,
            quota: config.quota.waters(),
            rounds: Mutex::default(),
            line: Mutex::default(),
            warned: Mutex::default(),
            notice_before: (config.deletion.notice_before)
                .map(|d| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)),
            noticed: Mutex::default(),
            read_volumes: config.deletion.read_volumes,
            mark_volumes: config.deletion.released_volume_ttl.is_some(),
            unjudged: Mutex::default(),
            already_sent: Mutex::default(),
            claims_watch_broken: std::sync::atomic::AtomicBool::new(false),
            outstanding: Mutex::default(),
            proofs: Proofs::new(config.deletion.proof_round_interval),
            per_namespace: !config.selector.namespaces.is_empty(),
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

    /// As the leader, warns on a Namespace whose workspace-gc annotations are not understood (its
    /// claims are kept): once per change of them.
    async fn warn_namespace(&self, namespace: &str) {
        if self.policies.namespaces.is_none() || !self.is_leader() {
            return;
        }
        let Some(annotations) = self.read_index().namespace_annotations(namespace).cloned() else {
            return;
        };
        let invalid = self.policies.for_namespace(Some(&annotations)).problems;
        let first = {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            let known = warned.get(namespace) == Some(&annotations);
            warned.insert(namespace.to_owned(), annotations);
            !known
        };
        if first && !invalid.is_empty() {
            for problem in &invalid {
                warn!(%namespace, %problem, "namespace annotation not understood; keeping every claim there");
            }
            (self.cluster)
                .notify_namespace(namespace, &invalid, &self.metrics)
                .await;
        }
    }

    /// Decides from the cache, with when a kept claim becomes due (only with notices on);
    /// `None` once the claim is gone.
    fn decide_cached(&self, key: &ObjectKey) -> Option<(ClaimFacts, Decision, Scheduled)> {
        let index = self.read_index();
        let claim = index.claim(key)?;
        let facts = linking::facts(claim, &*index);
        let policy = self.policy_in(&index, &key.namespace);
        let now = self.clock.now();
        let decision = policy::decide(&facts, &policy, now);
        let scheduled = (self.notice_before)
            .and_then(|lead| Some((policy::scheduled(&facts, &policy, now)?, lead)));
        Some((facts.claim, decision, scheduled))
    }

    /// When a kept claim wakes next: at its recheck instant, or earlier, when its deletion is
    /// to be announced `notice_before` ahead.
    fn wake_at(
        &self,
        recheck_at: Option<DateTime<Utc>>,
        scheduled: &Scheduled,
    ) -> Option<DateTime<Utc>> {
        match scheduled {
            Some(((due, _), lead)) => {
                let notice_at = due.checked_sub_signed(*lead).unwrap_or(*due);
                if self.clock.now() < notice_at {
                    Some(notice_at)
                } else {
                    recheck_at
                }
            }
            None => recheck_at,
        }
    }

    /// Writes the `DeletionScheduled` event of a kept claim whose notice time has come: once
    /// per claim and deadline, by the leader.
    async fn announce_deletion(&self, claim: &ClaimFacts, scheduled: Scheduled) {
        let Some(((due, reason), lead)) = scheduled else {
            return;
        };
        let notice_at = due.checked_sub_signed(lead).unwrap_or(due);
        if self.clock.now() < notice_at || !self.is_leader() {
            return;
        }
        let first = {
            let mut noticed = self.noticed.lock().unwrap_or_else(|e| e.into_inner());
            let this = (claim.uid.clone(), due);
            noticed.insert(claim.key.clone(), this.clone()) != Some(this)
        };
        if first {
            info!(claim = %claim.key, %due, %reason, "deletion scheduled");
            let at = due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let notice = Notice::DeletionScheduled { at, reason };
            self.cluster.notify(claim, notice, &self.metrics).await;
        }
    }

    async fn reconcile(self: Arc<Self>, key: ObjectKey) -> Outcome {
        let started = std::time::Instant::now();
        let outcome = self.decide_and_act(&key).await;
        if let Outcome::Retry(failure) = outcome {
            self.metrics.reconcile_retry(failure.category());
        }
        self.metrics.reconciled(started.elapsed().as_secs_f64());
        outcome
    }

    async fn decide_and_act(&self, key: &ObjectKey) -> Outcome {
        if let Some(outcome) = self.resolve_outstanding(key).await {
            return outcome;
        }
        let Some((claim, decision, scheduled)) = self.decide_cached(key) else {
            self.metrics.track(key, None);
            self.lock_line().leave(key);
            self.lock_already_sent().remove(key);
            (self.noticed.lock().unwrap_or_else(|e| e.into_inner())).remove(key);
            return Outcome::Done;
        };
        let bytes = claim.requested_bytes.unwrap_or(0);
        self.metrics.track(key, Some((&decision.verdict, bytes)));
        let taken = self.apply_quota_plan(key).await;
        let reason = decision.verdict.reason();
        let deleting = taken || matches!(decision.verdict, Verdict::Delete { .. });
        if !deleting || !self.is_leader() {
            // No longer waiting for a slot: the claims behind it move up.
            self.lock_line().leave(key);
        }
        match decision.verdict {
            Verdict::Keep { recheck_at, .. } => {
                debug!(claim = %key, %reason, ?recheck_at, "keep");
                if reason == Reason::InvalidAnnotation {
                    let detail = decision.detail.unwrap_or_default();
                    warn!(claim = %key, %detail, "keeping a claim with an invalid annotation");
                    self.cluster
                        .notify(&claim, Notice::InvalidAnnotation(detail), &self.metrics)
                        .await;
                }
                let wake = self.wake_at(recheck_at, &scheduled);
                self.announce_deletion(&claim, scheduled).await;
                let recheck =
                    wake.map_or(Outcome::Done, |at| Outcome::At(self.clock.instant_at(at)));
                if taken {
                    self.act(claim, Cause::Pressure).await.and(recheck)
                } else {
                    recheck
                }
            }
            Verdict::Protected { .. } => {
                debug!(claim = %key, %reason, "protected");
                Outcome::Done
            }
            Verdict::Delete { due_at, .. } => {
                if self.is_leader() {
                    self.act(claim, Cause::Due(due_at)).await
                } else {
                    // Winning the lease re-evaluates every claim.
                    debug!(claim = %key, %reason, "due; the leader deletes");
                    Outcome::Done
                }
            }
        }
    }

    /// Deletes a claim for `cause`, in four stages, each taking what the one before returns:
    /// admit (pace and cap), confirm (the live re-check), send (the one DELETE), report.
    async fn act(&self, claim: ClaimFacts, cause: Cause) -> Outcome {
        if let Some(outcome) = self.after_earlier_delete(&claim).await {
            return outcome;
        }
        let reservation = match self.admit(&claim, cause).await {
            Ok(reservation) => reservation,
            Err(outcome) => return outcome,
        };
        tokio::time::sleep_until(reservation.slot).await;
        let confirmed = match self.confirm(&claim, cause).await {
            Ok(confirmed) => confirmed,
            Err(failure) => {
                self.release(reservation);
                return Outcome::Retry(failure);
            }
        };
        let sent = self.send(&claim, cause, reservation, &confirmed).await;
        self.report(&claim, confirmed, sent).await
    }

    /// After a DELETE of this claim answered with success: whether the claim is gone or being
    /// deleted, read live, before anything is sent again. `None` to go on: none was sent, or
    /// the claim is there unchanged and not being deleted.
    async fn after_earlier_delete(&self, claim: &ClaimFacts) -> Option<Outcome> {
        let pending = self.lock_already_sent().get(&claim.key) == Some(&claim.uid);
        let broken = (self.claims_watch_broken).load(std::sync::atomic::Ordering::Relaxed);
        if !pending && !broken {
            return None;
        }
        let outcome = match self.cluster.claim_state(&claim.key, &self.metrics).await {
            Found::Yes((uid, false)) if uid == claim.uid => None,
            Found::Unknown(_) => return Some(Outcome::Retry(Failure::LiveUnread)),
            _ => {
                info!(claim = %claim.key, "the claim is gone or being deleted (an earlier delete was carried out); none is sent again");
                Some(Outcome::Done)
            }
        };
        if pending {
            self.lock_already_sent().remove(&claim.key);
        }
        outcome
    }

    fn claims_watch_broken(&self, broken: bool) {
        (self.claims_watch_broken).store(broken, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock_already_sent(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, String>> {
        self.already_sent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_outstanding(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Outstanding>> {
        self.outstanding.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// On winning the lease: every DELETE the Lease names in flight (sent by whoever led
    /// before, maybe still held somewhere on its way) is revoked before this replica decides
    /// anything for its claim; one not revoked yet is tried again at its claim's reconcile.
    async fn revoke_found(&self) {
        let found = self.cluster.found_in_flight();
        if found.is_empty() {
            return;
        }
        info!(
            count = found.len(),
            "revoking the deletes the lease names in flight"
        );
        let keys: Vec<ObjectKey> = {
            let mut outstanding = self.lock_outstanding();
            (found.into_iter())
                .map(|delete| {
                    let key = delete.key();
                    let found = Outstanding {
                        delete,
                        reservation: None,
                    };
                    outstanding.insert(key.clone(), found);
                    key
                })
                .collect()
        };
        let resolved = keys.iter().map(|key| self.resolve_outstanding(key));
        let outcomes = futures::future::join_all(resolved).await;
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            if let Some(Outcome::Retry(_)) = outcome {
                self.schedule.now(key);
            }
        }
    }

    /// Revokes this claim's DELETE that got no definite answer, before anything else is
    /// decided for it: until the revocation is answered, the claim is kept and nothing else
    /// is sent for it. `None` when no such DELETE is outstanding.
    async fn resolve_outstanding(&self, key: &ObjectKey) -> Option<Outcome> {
        let Outstanding {
            delete,
            reservation,
        } = self.lock_outstanding().get(key).cloned()?;
        if !self.is_leader() {
            // The Lease names it: whoever leads revokes it.
            return Some(Outcome::Done);
        }
        let revocation = match self.cluster.revoke(&delete, &self.metrics).await {
            // Refused: the claim may have been re-created, or a guard or RBAC refuses the
            // patch. Only a live read tells whether the DELETE can still land.
            Revocation::Refused => match self.cluster.claim_state(key, &self.metrics).await {
                Found::Yes((uid, false)) if uid == delete.uid => Revocation::Refused,
                Found::Unknown(_) => Revocation::Unanswered,
                _ => {
                    self.cluster.settle(&delete);
                    Revocation::Landed
                }
            },
            other => other,
        };
        match revocation {
            Revocation::Revoked => {
                // It can never land: its slot of the cap goes to another claim.
                if let Some(reservation) = reservation {
                    self.release(reservation);
                }
                self.metrics.revocation(Revoked::Revoked);
                info!(claim = %key, resource_version = %delete.resource_version, "revoked a delete without an answer: it fails its precondition whenever it arrives; deciding again");
            }
            Revocation::Landed => {
                // Until the watch shows it gone, a live read comes before any other DELETE.
                self.lock_already_sent()
                    .insert(key.clone(), delete.uid.clone());
                self.metrics.delete_late();
                warn!(claim = %key, uid = %delete.uid, "a delete without an answer was carried out after all (it, or another, reached the API server); its volume, if kept by a Retain policy, is not marked and workspace-gc never deletes it");
            }
            Revocation::Refused | Revocation::Unanswered => {
                self.metrics.revocation(Revoked::NotRevoked);
                warn!(claim = %key, "a delete without an answer is not revoked yet; the claim is kept and nothing else is sent for it");
                return Some(Outcome::Retry(Failure::Unanswered));
            }
        }
        let mut outstanding = self.lock_outstanding();
        if outstanding
            .get(key)
            .is_some_and(|o| o.delete.uid == delete.uid)
        {
            outstanding.remove(key);
        }
        // Revoked, the claim's change brings it back through the watch; landed, it goes.
        Some(Outcome::Done)
    }

    /// A deletion slot from the limiter, or the outcome that defers the claim: the cap is
    /// reached (told once per claim per episode of it) or the count is not known.
    async fn admit(&self, claim: &ClaimFacts, cause: Cause) -> Result<Reservation, Outcome> {
        let key = &claim.key;
        let place = cause.place_in_line();
        let (admission, full, first) = {
            let mut limiter = self.lock_limiter();
            let mut line = self.lock_line();
            // Judged at the earliest the API server's clock can read: never shorter windows.
            let (earliest, _) = self.clock.server();
            let ahead = line.ahead(key, place, self.cap.max as usize);
            let admission = limiter.reserve(Instant::now(), earliest, ahead);
            let first = match admission {
                Admission::At(_) => {
                    line.leave(key);
                    false
                }
                Admission::Capped { .. } => line.join(key, place),
                Admission::Unknown => false,
            };
            (admission, limiter.full(earliest), first)
        };
        match admission {
            Admission::At(reservation) => {
                self.metrics.set_cap_unknown(false);
                if !full {
                    self.metrics.set_capped(false);
                }
                // A claim's episode of the cap ends when it gets its slot, whatever the others
                // do: a saturated cap admits one as one expires, several when several expire.
                Ok(reservation)
            }
            Admission::Unknown => {
                debug!(claim = %key, "the count of deletions in the current window is not known; deletion deferred");
                self.metrics.set_cap_unknown(true);
                Err(Outcome::Retry(Failure::CapUnknown))
            }
            Admission::Capped { until } => {
                self.metrics.set_capped(true);
                if first {
                    let Cap { max, window } = &self.cap;
                    warn!(claim = %key, max, %window, "blast-radius cap reached; deletion deferred");
                    let notice = Notice::CapReached {
                        max: *max,
                        window: window.clone(),
                    };
                    self.cluster.notify(claim, notice, &self.metrics).await;
                }
                Err(Outcome::At(until))
            }
        }
    }

    /// The live re-check: the claim is read live and decided again through the same linking
    /// and policy, and must be deleted for the same cause, by a re-check no older than
    /// [`LIVE_BOUND`].
    async fn confirm(&self, claim: &ClaimFacts, cause: Cause) -> Result<Confirmed, Failure> {
        let key = &claim.key;
        // Whatever may protect the claim is read from a cache proven fresh, or live: a watch
        // can go silent without an error (a wedged API server, a dead connection) and its cache
        // would miss a pod or a run started since (tests/faults.rs,
        // silently_stalled_watch_does_not_hide_a_new_user). A small namespace is listed
        // (`PROVE_FROM`).
        let large = self.read_index().namespace_size(&key.namespace) >= PROVE_FROM;
        let proven = if large {
            self.prove_fresh(&key.namespace).await
        } else {
            None
        };
        let read = async {
            let (live, read_at) = match proven {
                Some(read_at) => {
                    let recorded = Recorded::of(claim, &*self.read_index());
                    (Recheck::Proven(Box::new(recorded)), read_at)
                }
                None => {
                    let (live, read_at) = self.cluster.read_live(claim, &self.metrics).await;
                    (Recheck::Listed(live), read_at)
                }
            };
            self.metrics.recheck(proven.is_some());
            // The namespace's settings too, when they count.
            let policy = match self.policies.namespaces {
                None => self.policies.cluster.clone(),
                Some(_) => {
                    let namespace = &key.namespace;
                    let notes = self.cluster.namespace_annotations(namespace, &self.metrics);
                    self.policies.for_namespace(notes.await.as_ref()).policy
                }
            };
            let volume = match claim.volume_name.as_deref().filter(|_| self.read_volumes) {
                Some(name) => self.cluster.volume(name, &self.metrics).await,
                None => None,
            };
            (live, read_at, policy, volume)
        };
        let Ok((live, read_at, policy, volume)) = tokio::time::timeout(LIVE_BOUND, read).await
        else {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Failure::LiveTooSlow);
        };
        let live_until = read_at + LIVE_BOUND;
        let facts = linking::facts(claim, &live);
        let decision = policy::decide(&facts, &policy, self.clock.now());
        let confirmed = match (cause, decision.verdict) {
            (Cause::Due(cached_due_at), Verdict::Delete { reason, due_at }) => {
                Some((reason, due_at.or(cached_due_at)))
            }
            (Cause::Due(_), _) => None,
            (Cause::Pressure, verdict) => self
                .still_taken(&facts, verdict)
                .await
                .then_some((Reason::QuotaPressure, None)),
        };
        let Some((reason, due_at)) = confirmed else {
            let unread = matches!(
                decision.verdict.reason(),
                Reason::OwnerUnknown | Reason::UsersUnknown | Reason::NamespaceUnknown
            );
            info!(
                claim = %key,
                reason = %decision.verdict.reason(),
                detail = decision.detail.as_deref().unwrap_or(""),
                "live re-check kept the claim"
            );
            return Err(if unread {
                Failure::LiveUnread
            } else {
                Failure::LiveDisagrees
            });
        };
        if Instant::now() >= live_until {
            info!(claim = %key, bound = ?LIVE_BOUND, "the live re-check took too long; deciding again");
            return Err(Failure::LiveTooSlow);
        }
        Ok(Confirmed {
            reason,
            volume,
            due_at,
            live_until,
        })
    }

    /// When a round proving the cache fresh for `namespace`'s watches sent its first read,
    /// a round started after this call (`daemon::proof`); `None` when it was not proven and
    /// the re-check must list.
    async fn prove_fresh(&self, namespace: &str) -> Option<Instant> {
        let scope = self.per_namespace.then(|| namespace.to_owned());
        self.proofs
            .prove(&scope, || async {
                let read_at = Instant::now();
                let kinds = PROVEN.map(|kind| self.prove_kind(kind, &scope));
                let proven = tokio::time::timeout(PROOF_BOUND, futures::future::join_all(kinds));
                let proven = proven.await.is_ok_and(|kinds| kinds.into_iter().all(|k| k));
                proven.then_some(read_at)
            })
            .await
    }

    /// Whether the cache holds every change of `kind` in `scope` up to its current
    /// resourceVersion, as `daemon::proof` proves it.
    async fn prove_kind(&self, kind: Kind, scope: &Scope) -> bool {
        let revision = match self.cluster.revision(kind, scope, &self.metrics).await {
            Found::Yes(revision) => revision,
            // Its group serves it at no version (discovery, asked now): no such object exists;
            // one the cache still holds only keeps claims.
            Found::No => return true,
            Found::Unknown(_) => return false,
        };
        let Some(from) = self.read_index().delivered(kind, scope) else {
            return false;
        };
        if from >= revision {
            return true;
        }
        let span = (from, revision);
        let replayed = async {
            let changes = self
                .cluster
                .changes(kind, scope, span, &self.metrics)
                .await?;
            // The watch delivers the same changes, moments later; the caller's bound ends the
            // wait.
            loop {
                let reflected = {
                    let index = self.read_index();
                    let delivered = index.delivered(kind, scope);
                    proof::reflects(delivered, &changes, |key| index.holds(kind, key))
                };
                if reflected {
                    return Some(());
                }
                tokio::time::sleep(CATCH_UP_POLL).await;
            }
        };
        // The replay's bookmark comes a second or two later; a kind whose own watch delivers
        // past the revision meanwhile (it changes, or its watch gets a bookmark) needs none.
        let delivered_past = async {
            while self.read_index().delivered(kind, scope) < Some(revision) {
                tokio::time::sleep(CATCH_UP_POLL).await;
            }
        };
        tokio::select! {
            replayed = replayed => replayed.is_some(),
            () = delivered_past => true,
        }
    }

    /// Sends the one DELETE, with the ledger that counts it (and names it in flight) written
    /// to the Lease first; after it, the mark on a `Retain` volume once the DELETE succeeded,
    /// or the claim's revocation is owed when no answer said whether it was carried out.
    async fn send(
        &self,
        claim: &ClaimFacts,
        cause: Cause,
        reservation: Reservation,
        confirmed: &Confirmed,
    ) -> SendResult {
        let live_until = confirmed.live_until;
        let pressure = matches!(cause, Cause::Pressure);
        let dry_run = matches!(self.cluster.mode(), Mode::DryRun { .. });
        // Every delete of ours in a namespace under pressure is counted in its round, and
        // goes on the Lease with the ledger (a would-delete only under pressure: nothing
        // leaves then, so it would hold the round forever).
        let recorded = pressure || !dry_run;
        if recorded {
            self.record_round(claim);
        }
        // The ledger written to the Lease before the DELETE counts it from the latest instant
        // the DELETE can go out: the fence lets it go at most `reach` after this write. So a
        // replica that recovers the ledger never counts it earlier than the API server saw it
        // (a restart inside a window then cannot open room for one delete too many).
        let reservation = self
            .lock_limiter()
            .count_from(reservation, self.clock.server().1 + self.cluster.reach());
        let ledger = self.lock_limiter().ledger_for(reservation);
        let sent = match &ledger {
            Some(ledger) => {
                (self.cluster)
                    .delete(claim, ledger, live_until, &self.metrics)
                    .await
            }
            None => Err(NotSent::Fence(FenceError::NotLeading)),
        };
        // A delete that was refused frees nothing; one already gone, or unanswered (it may
        // have been carried out), may have: pressure then deletes fewer, never more.
        let not_freed = matches!(
            sent,
            Err(_) | Ok(DeleteResult::Conflict | DeleteResult::Throttled | DeleteResult::Denied)
        );
        if recorded && not_freed {
            self.rounds().withdraw(&claim.key, &claim.uid);
        }
        match &sent {
            // Received by the time it was answered, at the latest.
            Ok(DeleteResult::Deleted) => {
                self.lock_limiter()
                    .count_from(reservation, self.clock.server().1);
            }
            // It may have been carried out: it stays counted until its revocation says.
            Ok(DeleteResult::Unanswered) => {}
            Ok(_) | Err(_) => self.release(reservation),
        }
        if matches!(self.cluster.mode(), Mode::Delete) {
            match &sent {
                Ok(DeleteResult::Deleted) => {
                    self.lock_already_sent()
                        .insert(claim.key.clone(), claim.uid.clone());
                    self.mark(claim, confirmed).await;
                }
                Ok(DeleteResult::Unanswered) => {
                    let delete = InFlight {
                        namespace: claim.key.namespace.to_string(),
                        name: claim.key.name.clone(),
                        uid: claim.uid.clone(),
                        resource_version: claim.resource_version.clone(),
                    };
                    let outstanding = Outstanding {
                        delete,
                        reservation: Some(reservation),
                    };
                    self.lock_outstanding()
                        .insert(claim.key.clone(), outstanding);
                }
                _ => {}
            }
        }
        sent
    }

    /// With `deletion.released_volume_ttl`, writes the claim's UID on its `Retain` volume once
    /// the claim's DELETE was answered with success: a mark stands for a delete carried out,
    /// never one intended. Not written (the write failed), the volume never qualifies: a
    /// leak, which fails closed.
    async fn mark(&self, claim: &ClaimFacts, confirmed: &Confirmed) {
        let volume = confirmed.volume.as_ref().filter(|_| self.mark_volumes);
        let Some(volume) = volume.filter(|volume| volumes::to_mark(volume, &claim.uid)) else {
            return;
        };
        let marked = (self.cluster)
            .mark_volume(volume, &claim.uid, &self.metrics)
            .await;
        if marked.is_some() {
            self.metrics.volume_mark(Mark::Marked);
        } else {
            warn!(claim = %claim.key, volume = %volume.name, "the volume could not be marked: it will not be deleted once Released");
            self.metrics.volume_mark(Mark::Failed);
        }
    }

    /// Metrics, logs and events for what the DELETE did, and what comes next for the claim.
    async fn report(&self, claim: &ClaimFacts, confirmed: Confirmed, sent: SendResult) -> Outcome {
        let key = &claim.key;
        let Confirmed {
            reason,
            due_at,
            volume,
            ..
        } = confirmed;
        let retained = volume
            .filter(|volume| volume.reclaim_policy.as_deref() == Some("Retain"))
            .map(|volume| volume.name);
        let result = match sent {
            Ok(result) => result,
            Err(error) => {
                info!(claim = %key, %error, "not deleted: deciding again");
                return Outcome::Retry(match error {
                    NotSent::Fence(_) => Failure::Fenced,
                    NotSent::TooLate => Failure::TooLate,
                });
            }
        };
        let dry_run = matches!(self.cluster.mode(), Mode::DryRun { .. });
        if dry_run {
            if result == DeleteResult::Deleted {
                info!(claim = %key, %reason, "dry-run: would delete");
                self.metrics.would_delete(&key.namespace, reason);
                (self.cluster)
                    .notify(claim, Notice::WouldDelete(reason), &self.metrics)
                    .await;
            }
        } else {
            self.metrics.deletion(&key.namespace, reason, result);
        }
        match result {
            DeleteResult::Deleted => {
                if !dry_run {
                    let lag = due_at.map(|due| (self.clock.now() - due).as_seconds_f64());
                    info!(claim = %key, %reason, lag_seconds = lag, "deleted");
                    let bytes = claim.requested_bytes.unwrap_or(0);
                    (self.metrics).reclaimed(bytes, retained.is_some(), lag);
                    let notice = Notice::Deleted(reason, retained);
                    self.cluster.notify(claim, notice, &self.metrics).await;
                }
                Outcome::Done
            }
            DeleteResult::NotFound => {
                debug!(claim = %key, "already gone");
                Outcome::Done
            }
            DeleteResult::Conflict => {
                info!(claim = %key, "the claim changed or was re-created since the decision; re-evaluating");
                Outcome::Retry(Failure::Conflict)
            }
            DeleteResult::Throttled => Outcome::Retry(Failure::Throttled),
            DeleteResult::Denied => Outcome::Retry(Failure::Denied),
            // Revoked at once, before anything else is decided for the claim (in a dry run
            // nothing that can land was sent).
            DeleteResult::Unanswered => match self.resolve_outstanding(key).await {
                Some(outcome) => outcome,
                None => Outcome::Retry(Failure::Unanswered),
            },
        }
    }

    /// One look at every PersistentVolume: each the pure judgement lets go is deleted with its
    /// UID and resourceVersion as listed as the DELETE's preconditions; one Released since a
    /// time not known is kept, with a warning once.
    async fn sweep(&self, ttl: chrono::Duration) {
        let Some(listed) = self.cluster.volumes(&self.metrics).await else {
            debug!("cannot list PersistentVolumes; Released volumes are looked at again later");
            return;
        };
        let now = self.clock.now();
        for volume in listed {
            match volumes::judge(&volume, ttl, now) {
                VolumeVerdict::Delete => {
                    let deadline = Instant::now() + LIVE_BOUND;
                    let sent = self.cluster.delete_volume(&volume, deadline, &self.metrics);
                    match sent.await {
                        // A dry run counts nothing (and marks nothing: only a mark left by an
                        // earlier real run makes a volume due then).
                        Ok(result) if matches!(self.cluster.mode(), Mode::DryRun { .. }) => {
                            info!(volume = %volume.name, result = result.as_str(), "dry-run: would delete Released volume");
                        }
                        Ok(result) => {
                            self.metrics.volume_deletion(result);
                            info!(volume = %volume.name, claim_uid = volume.claim_uid.as_deref().unwrap_or(""), result = result.as_str(), "Released volume deleted");
                        }
                        Err(error) => {
                            info!(volume = %volume.name, %error, "Released volume not deleted; looked at again later");
                            return;
                        }
                    }
                }
                VolumeVerdict::Keep(kept @ Kept::TransitionUnknown(_)) => {
                    let first = (self.unjudged.lock().unwrap_or_else(|e| e.into_inner()))
                        .insert(volume.uid.clone());
                    if first {
                        warn!(volume = %volume.name, %kept, "Released volume kept");
                    }
                }
                VolumeVerdict::Keep(_) => {}
            }
        }
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a delete about to be sent in its namespace's round, and hands the rounds to the
    /// fence, which writes them to the Lease in the same patch as the ledger, before the
    /// DELETE: a replica that takes over resumes the round instead of starting a fresh one.
    fn record_round(&self, claim: &ClaimFacts) {
        if self.quota.is_none() {
            return;
        }
        let mut rounds = self.rounds();
        rounds.record(Sent::of(claim));
        self.cluster.stage_rounds(rounds.to_annotation());
    }

    /// Takes over the pressure rounds found on the Lease just won. What cannot be read holds
    /// pressure deletes back for a while (see `quota::Rounds::recover`).
    fn recover_rounds(&self) {
        let Some(waters) = self.quota else {
            return;
        };
        let found = self.cluster.found_rounds();
        if let Err(error) = self
            .rounds()
            .recover(found.as_deref(), self.clock.server().0)
        {
            warn!(%error, doubt = %humantime::format_duration(quota::DOUBT.to_std().unwrap_or_default()), "the quota pressure rounds on the Lease cannot be trusted; no pressure deletes in a namespace until its quotas are seen to recount, or for the doubt period");
        }
        let index = self.read_index();
        for namespace in index.quota_namespaces() {
            self.observe_round(&index, &namespace, waters);
        }
    }

    /// Takes in a namespace's quotas (every namespace with quotas, for `None`) after a change
    /// to them or a claim leaving: their metrics, and the pressure round's bookkeeping.
    fn observe_quotas(&self, index: &Index, namespace: Option<String>) {
        let namespaces = match namespace {
            Some(namespace) => BTreeSet::from([namespace]),
            None => &index.quota_namespaces() | &self.metrics.quota_namespaces(),
        };
        for namespace in namespaces {
            let Found::Yes(quotas) = index.quotas_in(&namespace) else {
                continue;
            };
            self.metrics.quota_ratios(&namespace, &quotas);
            if let Some(waters) = self.quota {
                self.observe_round(index, &namespace, waters);
            }
        }
    }

    /// A round's bookkeeping for one namespace. A claim that left or a recount may raise the
    /// projection (what was subtracted twice no longer is), so the plan's claims are woken.
    fn observe_round(&self, index: &Index, namespace: &str, waters: Waters) {
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return;
        };
        let mut rounds = self.rounds();
        // Asked at every claim's deletion: the namespace's claims are gathered only when a
        // round is open or about to be.
        if !rounds.observes(namespace, &quotas, waters) {
            return;
        }
        let present: Vec<Present> = index.claims_in(namespace).map(Present::of).collect();
        rounds.observe(namespace, &quotas, &present, waters);
        if rounds.round(namespace).is_none() || !self.is_leader() {
            return;
        }
        let claims = quota::Claim::all_of(
            index.claims_in(namespace),
            index,
            &self.policy_in(index, namespace),
            self.clock.now(),
        );
        let plan = rounds.plan(namespace, &quotas, &claims, waters, self.clock.server().0);
        drop(rounds);
        for victim in plan.victims {
            self.schedule.now(victim);
        }
    }

    /// The quota plan of a namespace from the cache; `None` without pressure.
    fn plan_cached(&self, namespace: &str, waters: Waters) -> Option<Plan> {
        let index = self.read_index();
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return None;
        };
        // Asked at every reconcile: deciding each claim of the namespace only under pressure
        // keeps a reconcile's cost off the namespace's size.
        if !self.rounds().pressed(namespace, &quotas, waters) {
            return None;
        }
        let claims = quota::Claim::all_of(
            index.claims_in(namespace),
            &*index,
            &self.policy_in(&index, namespace),
            self.clock.now(),
        );
        let plan = (self.rounds()).plan(namespace, &quotas, &claims, waters, self.clock.server().0);
        (!plan.pressed.is_empty()).then_some(plan)
    }

    /// Under quota pressure, as the leader, acts on the namespace's plan: warns and writes an
    /// event once a round when nothing more may be deleted, and says whether the plan takes
    /// this claim. A claim the plan does not take asks
    /// for the plan's claims to be reconciled: a change to it (a build re-run binding it) may
    /// have passed its place to one nothing else would wake. A claim the plan takes does not,
    /// so two failing deletes cannot wake each other in a loop.
    async fn apply_quota_plan(&self, key: &ObjectKey) -> bool {
        let Some(waters) = self.quota.filter(|_| self.is_leader()) else {
            return false;
        };
        let Some(plan) = self.plan_cached(&key.namespace, waters) else {
            return false;
        };
        let unrelieved =
            (plan.unrelieved.first()).filter(|_| self.rounds().first_warning(&key.namespace));
        if let Some(worst) = unrelieved {
            warn!(
                namespace = %key.namespace,
                quota = %worst.quota.name,
                resource = %worst.resource,
                ratio = worst.ratio(),
                deleting = plan.victims.len(),
                "quota pressure remains and no more finished workspaces may be deleted"
            );
            self.cluster
                .notify_quota_pressure(worst, &self.metrics)
                .await;
        }
        let taken = plan.victims.contains(key);
        if !taken {
            for victim in plan.victims {
                self.schedule.now(victim);
            }
        }
        taken
    }

    /// The live re-check of a pressure delete: the claim must still be within its TTL, live
    /// (every linked owner finished with a completion time, nothing protecting it), and the
    /// plan over the quotas listed live must still take it. Never anything wider.
    async fn still_taken(&self, facts: &crate::decide::facts::Facts, verdict: Verdict) -> bool {
        let within_ttl = matches!(
            verdict,
            Verdict::Keep {
                reason: Reason::WithinTtl,
                ..
            }
        );
        let Some(waters) = self.quota.filter(|_| within_ttl) else {
            return false;
        };
        let namespace = &facts.claim.key.namespace;
        let Found::Yes(quotas) = self.cluster.quotas(namespace, &self.metrics).await else {
            return false;
        };
        let plan = {
            let index = self.read_index();
            let mut claims = quota::Claim::all_of(
                index.claims_in(namespace),
                &*index,
                &self.policy_in(&index, namespace),
                self.clock.now(),
            );
            claims.retain(|claim| claim.key != facts.claim.key);
            claims.push(quota::Claim::of(facts, verdict));
            let present: Vec<Present> = index.claims_in(namespace).map(Present::of).collect();
            // The round's pressed resources and what it owes, over the quotas listed live.
            let rounds = self.rounds();
            rounds.plan_live(
                namespace,
                &quotas,
                &present,
                &claims,
                waters,
                self.clock.server().0,
            )
        };
        plan.victims.contains(&facts.claim.key)
    }

    fn release(&self, reservation: Reservation) {
        self.lock_limiter().release(reservation);
    }

    fn lock_line(&self) -> std::sync::MutexGuard<'_, Line<ObjectKey>> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_limiter(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the cap from the ledger found on the Lease just won; fails closed for a window
    /// when it cannot be read.
    fn recover_cap(&self) {
        let found = self.cluster.found_ledger();
        if let Err(error) = self.lock_limiter().recover(
            found.as_deref(),
            self.clock.server().0,
            self.cluster.reach(),
        ) {
            warn!(%error, "the count of deletions in the current window is not known; counting the cap as reached for one window");
            self.metrics.set_cap_unknown(true);
            self.metrics.ledger_fault(error.fault());
        }
    }
}

#[cfg(test)]
mod tests {
    //! The controller against a fake cluster and a fake clock (tokio's paused time): what each
    //! stage sends, in what order, and what the reconcile asks the scheduler for next.

    use std::collections::VecDeque;

    use super::*;
    use crate::contract::annotations::NS_COLLECT;
    use crate::daemon::limiter::Counted;
    use crate::decide::facts::{NamespaceEntry, PodEntry};
    use crate::decide::namespace::Invalid;
    use crate::decide::quota::{Pressure, QuotaEntry};

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
    struct Sent {
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
        answers: Mutex<VecDeque<SendResult>>,
        sent: Mutex<Vec<Sent>>,
        notices: Mutex<Vec<Notice>>,
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
        /// The DELETEs in flight the Lease named when won.
        found: Mutex<Vec<InFlight>>,
        /// The claims' Namespace's annotations as a live read finds them; `None`: unreadable.
        live_namespace: Mutex<Option<BTreeMap<String, String>>>,
        /// Every kind's resourceVersion as a consistent read finds it; `None`: unknown. Its
        /// replays never get their bookmark.
        revision: Mutex<Option<u64>>,
    }

    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap()
    }

    impl Cluster for FakeCluster {
        type Live = Index;

        async fn read_live(&self, claim: &ClaimFacts, _: &Metrics) -> (Index, Instant) {
            let read_at = Instant::now();
            lock(&self.reads).push(read_at);
            let takes = *lock(&self.read_takes);
            tokio::time::sleep(takes).await;
            let pods = lock(&self.live_pods).clone();
            (synced(std::slice::from_ref(claim), &pods), read_at)
        }

        async fn revision(&self, _: Kind, _: &Scope, _: &Metrics) -> Found<u64> {
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
            _: &Metrics,
        ) -> Option<Vec<crate::cluster::progress::Delivery>> {
            if lock(&self.revision).is_some() {
                std::future::pending::<()>().await;
            }
            None
        }

        async fn claim_state(&self, _: &ObjectKey, _: &Metrics) -> Found<(String, bool)> {
            lock(&self.claim_state)
                .clone()
                .map_or(Found::No, Found::Yes)
        }

        async fn quotas(&self, _: &str, _: &Metrics) -> Found<Vec<QuotaEntry>> {
            Found::Yes(Vec::new())
        }

        async fn delete(
            &self,
            claim: &ClaimFacts,
            _: &Counted,
            deadline: Instant,
            _: &Metrics,
        ) -> SendResult {
            lock(&self.volume_writes).push(format!("delete claim {}", claim.key.name));
            lock(&self.sent).push(Sent {
                claim: claim.key.clone(),
                uid: claim.uid.clone(),
                deadline,
            });
            lock(&self.answers)
                .pop_front()
                .unwrap_or(Ok(DeleteResult::Deleted))
        }

        async fn revoke(&self, delete: &InFlight, _: &Metrics) -> Revocation {
            let write = format!("revoke claim {} {}", delete.name, delete.resource_version);
            lock(&self.volume_writes).push(write);
            lock(&self.revocations)
                .pop_front()
                .unwrap_or(Revocation::Revoked)
        }

        fn settle(&self, _: &InFlight) {}

        fn found_in_flight(&self) -> Vec<InFlight> {
            lock(&self.found).clone()
        }

        async fn notify(&self, _: &ClaimFacts, notice: Notice, _: &Metrics) {
            lock(&self.notices).push(notice);
        }

        async fn notify_quota_pressure(&self, _: &Pressure, _: &Metrics) {}

        async fn notify_namespace(&self, _: &str, _: &[Invalid], _: &Metrics) {}

        async fn namespace_annotations(
            &self,
            _: &str,
            _: &Metrics,
        ) -> Option<BTreeMap<String, String>> {
            lock(&self.live_namespace).clone()
        }

        async fn volume(&self, _: &str, _: &Metrics) -> Option<VolumeFacts> {
            lock(&self.volume).clone()
        }

        async fn volumes(&self, _: &Metrics) -> Option<Vec<VolumeFacts>> {
            Some(lock(&self.volume).iter().cloned().collect())
        }

        async fn mark_volume(
            &self,
            volume: &VolumeFacts,
            claim_uid: &str,
            _: &Metrics,
        ) -> Option<VolumeFacts> {
            lock(&self.volume_writes).push(format!("mark {} {claim_uid}", volume.name));
            Some(VolumeFacts {
                marked_claim_uid: Some(claim_uid.into()),
                ..volume.clone()
            })
        }

        async fn delete_volume(&self, volume: &VolumeFacts, _: Instant, _: &Metrics) -> SendResult {
            lock(&self.volume_writes).push(format!("delete {}", volume.name));
            Ok(DeleteResult::Deleted)
        }

        async fn answers(&self) -> bool {
            true
        }

        fn mode(&self) -> Mode {
            if self.dry_run {
                Mode::DryRun { server_side: false }
            } else {
                Mode::Delete
            }
        }

        fn reach(&self) -> Duration {
            Duration::from_secs(10)
        }

        fn found_ledger(&self) -> Option<String> {
            None
        }

        fn found_rounds(&self) -> Option<String> {
            None
        }

        fn stage_rounds(&self, _: String) {}
    }

    /// Wall time that moves with tokio's (paused) clock, from a fixed start.
    struct FakeClock {
        start: Instant,
        wall: DateTime<Utc>,
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
        let mut config = Config::default();
        edit(&mut config);
        config.deletion.max_deletions_per_window = cap;
        config.deletion.window = Duration::from_secs(3600);
        config.deletion.deletes_per_second = 1000.0;
        config.quota.enabled = false;
        let clock = FakeClock {
            start: Instant::now(),
            wall: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
        };
        let (schedule, _scheduler) = Scheduler::new();
        let (_, leading) = watch::channel(leading);
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let controller = Controller::new(&config, cluster, clock, metrics, schedule, leading);
        *controller.write_index() = synced(claims, &[]);
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
            vec![Sent {
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

    /// A kind whose own watch delivers past the revision read for the proof is proven then,
    /// without waiting for the replay's bookmark (here one that never comes): the re-check
    /// rests on the proven cache and lists nothing.
    #[tokio::test(start_paused = true)]
    async fn a_watch_delivering_past_the_revision_proves_its_kind_without_the_bookmark() {
        let cluster = FakeCluster::default();
        *lock(&cluster.revision) = Some(100);
        let c = controller(cluster, 10, &[due("a")], true);
        {
            let mut index = c.write_index();
            for n in 0..PROVE_FROM {
                let mut pod = pod_mounting("other");
                pod.key.name = format!("pod-{n}");
                index.update(Update::Pod(Change::Apply(pod)));
            }
            for kind in PROVEN {
                index.update(Update::Delivered(kind, None, 90));
            }
        }
        let watches = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut index = watches.write_index();
            for kind in PROVEN {
                index.update(Update::Delivered(kind, None, 101));
            }
        });
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
        assert!(lock(&c.cluster.reads).is_empty(), "nothing listed");
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
        c.write_index()
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
            Outcome::Retry(Failure::Unanswered)
        );
        // It may still land: the cap of one holds `b` back.
        let outcome = c.clone().reconcile(key("b")).await;
        assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
        assert_eq!(lock(&c.cluster.sent).len(), 1);
        // Revoked, it never can: its slot goes to `b`.
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
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
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
        let outcome = c.clone().reconcile(key("b")).await;
        assert!(matches!(outcome, Outcome::At(_)), "{outcome:?}");
        assert_eq!(lock(&c.cluster.sent).len(), 1);
    }

    /// The claim's writes so far, as the fake cluster logged them.
    fn writes(c: &Controller<FakeCluster, FakeClock>) -> Vec<String> {
        lock(&c.cluster.volume_writes).clone()
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
            Outcome::Retry(Failure::Unanswered)
        );
        assert_eq!(writes(&c), ["delete claim a", "revoke claim a 1"]);
        // Whatever the cache says, the revocation comes first, and nothing else is sent.
        lock(&c.cluster.live_pods).push(pod_mounting("a"));
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
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
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
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
            Outcome::Retry(Failure::Unanswered)
        );
        // Refused because the claim was re-created under its name: the DELETE (with the old
        // UID) can land on nothing.
        lock(&c.cluster.revocations).push_back(Revocation::Refused);
        *lock(&c.cluster.claim_state) = Some(("new-uid".into(), false));
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
        assert!(c.lock_outstanding().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_leaves_the_revocation_to_the_leader() {
        let cluster = FakeCluster::default();
        lock(&cluster.answers).push_back(Ok(DeleteResult::Unanswered));
        lock(&cluster.revocations).push_back(Revocation::Unanswered);
        let c = controller(cluster, 10, &[due("a")], true);
        c.clone().reconcile(key("a")).await;
        let standby = Controller {
            leading: watch::channel(false).1,
            ..Arc::into_inner(c).unwrap()
        };
        let standby = Arc::new(standby);
        assert_eq!(standby.clone().reconcile(key("a")).await, Outcome::Done);
        assert_eq!(writes(&standby), ["delete claim a", "revoke claim a 1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deletes_the_lease_names_are_revoked_on_winning() {
        let cluster = FakeCluster::default();
        lock(&cluster.found).push(InFlight {
            namespace: "ml".into(),
            name: "a".into(),
            uid: "a-uid".into(),
            resource_version: "1".into(),
        });
        let c = controller(cluster, 10, &[due("a")], true);
        c.revoke_found().await;
        assert_eq!(writes(&c), ["revoke claim a 1"]);
        assert!(c.lock_outstanding().is_empty());
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

    #[tokio::test]
    async fn while_the_claims_watch_is_broken_a_claim_is_read_live_before_its_delete() {
        let cluster = FakeCluster::default();
        // The replica that led before deleted it; this one's watch is down and still shows it.
        *lock(&cluster.claim_state) = None;
        let c = controller(cluster, 10, &[due("a"), due("b")], true);
        c.claims_watch_broken(true);
        assert_eq!(c.clone().reconcile(key("a")).await, Outcome::Done);
        assert!(
            lock(&c.cluster.sent).is_empty(),
            "nothing sent for a gone claim"
        );
        // Once the watch delivers again, the cache is trusted as before.
        c.claims_watch_broken(false);
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
        *c.write_index() = synced(&[due_later("first", 0), due_later("a", 2)], &[]);
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
        c.write_index()
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
            c.sweep(ttl).await;
            assert!(lock(&c.cluster.volume_writes).is_empty(), "{why}");
        }
        *lock(&c.cluster.volume) = Some(released);
        c.sweep(ttl).await;
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
}
