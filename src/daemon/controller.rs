//! The daemon's wiring: watches feed the cache, changes schedule the claims they affect, and
//! each reconcile gathers facts from the cache, asks the pure policy (and, while its namespace's
//! quota is nearly exhausted, the pure quota plan), and acts through the writer — after the
//! limiter admits it and a live re-check confirms it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::Client;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::cache::{Change, Index, Update};
use crate::cluster::leader::{Fence, FenceError, Leadership};
use crate::cluster::live::{self, LiveView, Snapshots};
use crate::cluster::watches;
use crate::cluster::writer::{Mode, Notice, Writer};
use crate::config::{Config, MAX_DURATION, deletion_interval};
use crate::daemon::limiter::{Admission, Limiter, Reservation};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::{self, Found};
use crate::decide::policy::{self, Decision, Policy, Reason, Verdict};
use crate::decide::quota::{self, Plan, Rounds, Sent, Waters};
use crate::observe::access::Gate;
use crate::observe::http::{self, Health};
use crate::observe::metrics::{DeleteResult, ErrorCategory, Metrics};

/// How many claims are reconciled at once (each may wait on the limiter and live reads).
const CONCURRENCY: usize = 16;
/// When a live re-check or a delete could not conclude, look again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// After a delete conflict, the watch brings the new version within moments.
const RETRY_AFTER_CONFLICT: Duration = Duration::from_secs(1);
/// While the API server cannot be reached, how often to check whether it answers again.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// What `run` needs besides the configuration.
pub struct RunOptions {
    /// This replica's identity for the lease and events (the pod name in a cluster).
    pub identity: String,
    /// The namespace this replica runs in, for the lease.
    pub pod_namespace: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not serve HTTP on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("http.tls_cert_file, http.tls_key_file: {0}")]
    Tls(#[from] http::TlsError),
}

/// Everything a reconcile reads, built once.
struct Controller {
    client: Client,
    policy: Policy,
    index: RwLock<Index>,
    metrics: Arc<Metrics>,
    writer: Writer,
    limiter: Mutex<Limiter>,
    cap: (u32, String),
    schedule: crate::daemon::scheduler::Schedule,
    leading: watch::Receiver<bool>,
    fence: Fence,
    snapshots: Snapshots,
    /// Quota pressure's thresholds; `None` when disabled.
    quota: Option<Waters>,
    rounds: Mutex<Rounds>,
}

/// Why a claim is deleted: the live re-check confirms that same cause, and no other.
#[derive(Debug, Clone, Copy)]
enum Cause {
    /// Its verdict is delete; the cached verdict's due instant, for the reclaim lag.
    Due(Option<DateTime<Utc>>),
    /// Its namespace's quota plan takes it (see `quota`).
    Pressure,
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

    let deletion = &config.deletion;
    let mode = if deletion.dry_run {
        Mode::DryRun {
            server_side: deletion.server_side_dry_run,
        }
    } else {
        Mode::Delete
    };
    info!(?mode, "starting");
    let (schedule, scheduler) = crate::daemon::scheduler::Scheduler::new();
    let controller = Arc::new(Controller {
        policy: config.policy(),
        index: RwLock::new(watches::index(&config.selector, config.quota.enabled)),
        metrics: metrics.clone(),
        writer: Writer::new(
            client.clone(),
            mode,
            Some(options.identity),
            leadership.fence(),
        ),
        limiter: Mutex::new(Limiter::new(
            // Validation refused every rate without an interval; the slowest pace otherwise.
            deletion_interval(deletion.deletes_per_second).unwrap_or(MAX_DURATION),
            deletion.max_deletions_per_window,
            deletion.window,
        )),
        cap: (
            deletion.max_deletions_per_window,
            humantime::format_duration(deletion.window).to_string(),
        ),
        schedule,
        leading: leadership.subscribe(),
        fence: leadership.fence(),
        snapshots: Snapshots::default(),
        client: client.clone(),
        quota: config.quota.waters(),
        rounds: Mutex::default(),
    });

    let feeder = tokio::spawn(feed(
        controller.clone(),
        watches::updates(&client, &config.selector, config.quota.enabled),
        health.clone(),
    ));
    let follower = tokio::spawn(follow_leadership(controller.clone(), health));

    let reconciler = controller.clone();
    scheduler
        .run(
            CONCURRENCY,
            move |key| reconciler.clone().reconcile(key),
            stop.clone(),
        )
        .await;

    feeder.abort();
    follower.abort();
    let _ = feeder.await;
    let _ = follower.await;
    drop(controller);
    leadership.release().await;
    let _ = server.await;
    info!("stopped");
    Ok(())
}

/// Applies watch updates to the cache and schedules the claims each one affects. Nothing is
/// scheduled until every watch has listed once; then every claim is.
async fn feed(
    controller: Arc<Controller>,
    mut updates: futures::stream::BoxStream<'static, watches::Item>,
    health: Arc<Health>,
) {
    loop {
        let item = if health.is_unreachable() {
            // A watch that resumes where it left off delivers nothing until something changes,
            // so probe for the way back instead of waiting for an event.
            tokio::select! {
                item = updates.next() => item,
                () = tokio::time::sleep(PROBE_EVERY) => {
                    let probe = controller.client.apiserver_version();
                    if let Ok(Ok(_)) = tokio::time::timeout(PROBE_EVERY, probe).await {
                        reachable(&controller, &health, true);
                    }
                    continue;
                }
            }
        } else {
            updates.next().await
        };
        let Some(item) = item else { break };
        match item {
            Ok(update) => {
                reachable(&controller, &health, true);
                let (affected, all) = {
                    let mut index = controller.write_index();
                    let was_synced = index.synced();
                    let quotas_changed = quota_namespaces_changed(&update);
                    let affected = index.update(update);
                    if let Some(namespace) = quotas_changed {
                        controller.observe_quotas(&index, namespace);
                    }
                    let synced = index.synced();
                    controller.metrics.cached(index.sizes());
                    if synced && !was_synced {
                        let all: BTreeSet<ObjectKey> =
                            index.claims().map(|c| c.key.clone()).collect();
                        (all, true)
                    } else if synced {
                        (affected, false)
                    } else {
                        (BTreeSet::new(), false)
                    }
                };
                if all {
                    info!(
                        claims = affected.len(),
                        "caches synced; evaluating every claim"
                    );
                    health.set_synced();
                    controller.metrics.set_ready(health.is_ready());
                }
                for key in affected {
                    controller.schedule.now(key);
                }
            }
            Err((kind, error)) => {
                controller.metrics.watch_restart(kind);
                warn!(kind = kind.as_str(), %error, "watch failed; retrying with backoff");
                if cannot_connect(&error) {
                    reachable(&controller, &health, false);
                }
            }
        }
    }
}

/// Whether an update may change the quotas of some namespace: `Some(Some(ns))` for one,
/// `Some(None)` for a re-list that may change any; `None` for an update of another kind.
fn quota_namespaces_changed(update: &Update) -> Option<Option<String>> {
    match update {
        Update::Quota(Change::Apply(quota)) => Some(Some(quota.key.namespace.clone())),
        Update::Quota(Change::Delete(key)) => Some(Some(key.namespace.clone())),
        Update::Quota(Change::InitDone(_)) => Some(None),
        _ => None,
    }
}

/// Records whether the API server can be reached: `/readyz` and the `ready` gauge follow it.
fn reachable(controller: &Controller, health: &Health, reachable: bool) {
    let unreachable = !reachable;
    if health.is_unreachable() == unreachable {
        return;
    }
    health.set_unreachable(unreachable);
    controller.metrics.set_ready(health.is_ready());
    if reachable {
        info!("the API server answers again");
    } else {
        warn!("the API server cannot be reached; not ready until it answers");
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

/// Publishes leadership to metrics and, on winning the lease, re-evaluates every claim: the
/// standby decided but did not act.
async fn follow_leadership(controller: Arc<Controller>, health: Arc<Health>) {
    let mut leading = controller.leading.clone();
    loop {
        let is_leader = *leading.borrow_and_update();
        controller.metrics.set_leader(is_leader);
        health.set_leader(is_leader);
        if is_leader {
            info!("leading: this replica deletes");
            controller.recover_cap();
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
        } else {
            info!("standing by: another replica holds the lease");
            controller.lock_limiter().forget();
        }
        if leading.changed().await.is_err() {
            return;
        }
    }
}

impl Controller {
    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Decides from the cache; `None` once the claim is gone.
    fn decide_cached(&self, key: &ObjectKey) -> Option<(ClaimFacts, Decision)> {
        let index = self.read_index();
        let claim = index.claim(key)?;
        let facts = linking::facts(claim, &*index);
        let decision = policy::decide(&facts, &self.policy, Utc::now());
        Some((facts.claim, decision))
    }

    async fn reconcile(self: Arc<Self>, key: ObjectKey) {
        let started = std::time::Instant::now();
        let Some((claim, decision)) = self.decide_cached(&key) else {
            self.metrics.track(&key, None);
            return;
        };
        let bytes = claim.requested_bytes.unwrap_or(0);
        self.metrics.track(&key, Some((&decision.verdict, bytes)));
        let taken = self.relieve(&key).await;
        let reason = decision.verdict.reason();
        match decision.verdict {
            Verdict::Keep { recheck_at, .. } => {
                debug!(claim = %key, %reason, ?recheck_at, "keep");
                if reason == Reason::InvalidAnnotation {
                    let detail = decision.detail.unwrap_or_default();
                    warn!(claim = %key, %detail, "keeping a claim with an invalid annotation");
                    self.writer
                        .notify(&claim, Notice::InvalidAnnotation(detail), &self.metrics)
                        .await;
                }
                if taken {
                    self.act(claim, Cause::Pressure).await;
                }
                if let Some(at) = recheck_at {
                    self.schedule.at(key, instant_at(at));
                }
            }
            Verdict::Protected { .. } => debug!(claim = %key, %reason, "protected"),
            Verdict::Delete { due_at, .. } => {
                if self.is_leader() {
                    self.act(claim, Cause::Due(due_at)).await;
                } else {
                    debug!(claim = %key, %reason, "due; the leader deletes");
                }
            }
        }
        self.metrics.reconciled(started.elapsed().as_secs_f64());
    }

    /// Deletes a claim for `cause`: within the limits, after a live re-check.
    async fn act(&self, claim: ClaimFacts, cause: Cause) {
        let key = claim.key.clone();
        let admission = self.lock_limiter().reserve(Instant::now(), Utc::now());
        let reservation = match admission {
            Admission::At(reservation) => {
                self.metrics.set_capped(false);
                self.metrics.set_cap_unknown(false);
                reservation
            }
            Admission::Unknown => {
                warn!(claim = %key, "the count of deletions in the current window is not known; deletion deferred");
                self.metrics.set_cap_unknown(true);
                self.schedule.at(key, Instant::now() + RETRY_AFTER_CONFLICT);
                return;
            }
            Admission::Capped { until } => {
                let (max, window) = &self.cap;
                warn!(claim = %key, max, %window, "blast-radius cap reached; deletion deferred");
                self.metrics.set_capped(true);
                self.writer
                    .notify(
                        &claim,
                        Notice::CapReached {
                            max: *max,
                            window: window.clone(),
                        },
                        &self.metrics,
                    )
                    .await;
                self.schedule.at(key, until);
                return;
            }
        };
        tokio::time::sleep_until(reservation.slot).await;

        // Whatever may protect the claim is read live: a watch can go silent without an error
        // (a wedged API server, a dead connection) and its cache would miss a pod or a run
        // started since (tests/faults.rs, silently_stalled_watch_does_not_hide_a_new_user).
        let live = LiveView::read(&self.client, &claim, &self.snapshots, &self.metrics).await;
        let facts = linking::facts(&claim, &live);
        let decision = policy::decide(&facts, &self.policy, Utc::now());
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
            self.release(reservation);
            info!(
                claim = %key,
                reason = %decision.verdict.reason(),
                detail = decision.detail.as_deref().unwrap_or(""),
                "live re-check kept the claim"
            );
            self.schedule.at(key, Instant::now() + RETRY_AFTER);
            return;
        };

        let dry_run = matches!(self.writer.mode(), Mode::DryRun { .. });
        let pressure = matches!(cause, Cause::Pressure);
        if pressure {
            self.rounds().record(Sent::of(&claim));
        }
        // The ledger written to the Lease before the DELETE counts it from the latest instant
        // the DELETE can go out: the fence lets it go at most `reach` after this write. So a
        // replica that recovers the ledger never counts it earlier than the API server saw it
        // (a restart inside a window then cannot open room for one delete too many).
        let reservation = self
            .lock_limiter()
            .count_from(reservation, Utc::now() + self.fence.reach());
        let ledger = self.lock_limiter().ledger_for(reservation);
        let sent = match &ledger {
            Some(ledger) => self.writer.delete(&claim, ledger, &self.metrics).await,
            None => Err(FenceError::NotLeading),
        };
        // A delete that did not happen frees nothing (a claim already gone does).
        let freed = matches!(sent, Ok(DeleteResult::Deleted | DeleteResult::NotFound));
        if pressure && !freed {
            self.rounds().withdraw(&key, &claim.uid);
        }
        let result = match sent {
            Ok(DeleteResult::Deleted) => {
                // Received by the time it was answered, at the latest.
                self.lock_limiter().count_from(reservation, Utc::now());
                DeleteResult::Deleted
            }
            Ok(result) => result,
            Err(error) => {
                self.release(reservation);
                info!(claim = %key, %error, "not deleted: this replica may not act");
                self.schedule.at(key, Instant::now() + RETRY_AFTER);
                return;
            }
        };
        match (result, dry_run) {
            (DeleteResult::Deleted, true) => {
                info!(claim = %key, %reason, "dry-run: would delete");
                self.metrics.would_delete(&key.namespace, reason);
                self.writer
                    .notify(&claim, Notice::WouldDelete(reason), &self.metrics)
                    .await;
            }
            (DeleteResult::Deleted, false) => {
                let lag = due_at.map(|due| (Utc::now() - due).as_seconds_f64());
                info!(claim = %key, %reason, lag_seconds = lag, "deleted");
                self.metrics.deletion(&key.namespace, reason, result);
                self.metrics
                    .reclaimed(claim.requested_bytes.unwrap_or(0), lag);
                self.writer
                    .notify(&claim, Notice::Deleted(reason), &self.metrics)
                    .await;
            }
            (DeleteResult::NotFound, _) => {
                self.release(reservation);
                self.count(dry_run, &key, reason, result);
                debug!(claim = %key, "already gone");
            }
            (DeleteResult::Conflict, _) => {
                self.release(reservation);
                self.count(dry_run, &key, reason, result);
                info!(claim = %key, "the claim changed or was re-created since the decision; re-evaluating");
                self.schedule.at(key, Instant::now() + RETRY_AFTER_CONFLICT);
            }
            (DeleteResult::Failed, _) => {
                self.release(reservation);
                self.count(dry_run, &key, reason, result);
                self.schedule.at(key, Instant::now() + RETRY_AFTER);
            }
        }
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in a namespace's quotas (every namespace with quotas, for `None`) after a change:
    /// their metrics, and the pressure round's bookkeeping.
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
                let present = |key: &ObjectKey| index.claim(key).is_some();
                self.rounds().observe(&namespace, &quotas, waters, present);
            }
        }
    }

    /// The quota plan of a namespace from the cache; `None` without pressure.
    fn plan_cached(&self, namespace: &str, waters: Waters) -> Option<Plan> {
        let index = self.read_index();
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return None;
        };
        if !waters.under_pressure(&quotas) {
            return None;
        }
        let claims = quota::Claim::all_of(
            index.claims_in(namespace),
            &*index,
            &self.policy,
            Utc::now(),
        );
        Some(quota::plan(
            &quotas,
            &claims,
            self.rounds().sent(namespace),
            waters,
        ))
    }

    /// Under quota pressure, as the leader: warns once a round when nothing more may be
    /// deleted, and says whether the plan takes this claim. A claim the plan does not take asks
    /// for the plan's claims to be reconciled: a change to it (a build re-run binding it) may
    /// have passed its place to one nothing else would wake. A claim the plan takes does not,
    /// so two failing deletes cannot wake each other in a loop.
    async fn relieve(&self, key: &ObjectKey) -> bool {
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
            self.writer
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
        let Found::Yes(quotas) = live::quotas(&self.client, namespace, &self.metrics).await else {
            return false;
        };
        let plan = {
            let index = self.read_index();
            let mut claims = quota::Claim::all_of(
                index.claims_in(namespace),
                &*index,
                &self.policy,
                Utc::now(),
            );
            claims.retain(|claim| claim.key != facts.claim.key);
            claims.push(quota::Claim::of(facts, verdict));
            quota::plan(&quotas, &claims, self.rounds().sent(namespace), waters)
        };
        plan.victims.contains(&facts.claim.key)
    }

    fn count(&self, dry_run: bool, key: &ObjectKey, reason: Reason, result: DeleteResult) {
        if !dry_run {
            self.metrics.deletion(&key.namespace, reason, result);
        }
    }

    fn release(&self, reservation: Reservation) {
        self.lock_limiter().release(reservation);
    }

    fn lock_limiter(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the cap from the ledger found on the Lease just won; fails closed for a window
    /// when it cannot be read.
    fn recover_cap(&self) {
        let found = self.fence.found();
        if let Err(error) = self.lock_limiter().recover(found.as_deref(), Utc::now()) {
            warn!(%error, "the count of deletions in the current window is not known; counting the cap as reached for one window");
            self.metrics.set_cap_unknown(true);
        }
    }
}

/// The monotonic instant matching a wall-clock deadline; a deadline already past is now.
fn instant_at(at: DateTime<Utc>) -> Instant {
    let now = Instant::now();
    let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    now.checked_add(wait).unwrap_or(now)
}
