//! The watches' feed: applies what they deliver to the cache, in chunks under one hold of the
//! index's lock, and schedules the claims each change affects once every watch has listed.
//! Also what `/healthz` and `/readyz` learn from it: beats, sync, and whether the API server
//! answers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use tracing::{info, warn};

use crate::cluster::cache::{Change, Update};
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::watches;
use crate::decide::facts::ObjectKey;
use crate::observe::http::{BEAT_EVERY, Health};
use crate::observe::metrics::{ErrorCategory, Kind, Metrics, Operation};

use super::Controller;

/// While the API server cannot be reached, how often to check whether it answers again.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// The most watch items applied under one hold of the index's write lock: enough that a list's
/// burst costs one wake-up and one lock a chunk rather than one per object, few enough that a
/// reconcile waiting to read is held up for milliseconds at most.
const FEED_CHUNK: usize = 512;

/// Applies watch updates to the cache and schedules the claims each one affects. Nothing is
/// scheduled until every watch has listed once; then every claim is. What the watches have
/// ready is applied as one chunk, in order.
pub(super) async fn apply_watches<C: Cluster, K: Clock>(
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
        controller.wake(fed.affected);
        let namespaces: Vec<String> = if fed.every_namespace {
            controller.cache.read().namespace_names()
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
    /// Namespaces where quota pressure may see something new (see `quota_namespaces_changed`).
    quota_namespaces: BTreeSet<String>,
    /// A re-list that may change what quota pressure sees in any namespace.
    every_quota_namespace: bool,
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
    let mut index = controller.cache.write();
    for item in chunk {
        let update = match item {
            Ok(update) => update,
            Err((kind, error)) => {
                controller.metrics.watch_restart(kind);
                record_watch_error(&controller.metrics, &error);
                if kind == Kind::Claims {
                    controller.deletes.in_flight.claims_watch_broken(true);
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
            controller.deletes.in_flight.claims_watch_broken(false);
        }
        match &update {
            Update::Namespace(Change::Apply(entry)) => {
                fed.namespaces.insert(entry.key.name.clone());
            }
            Update::Namespace(Change::InitDone(_)) => fed.every_namespace = true,
            _ => {}
        }
        let was_synced = index.synced();
        match quota_namespaces_changed(&update) {
            Some(Some(namespace)) => {
                fed.quota_namespaces.insert(namespace);
            }
            Some(None) => fed.every_quota_namespace = true,
            None => {}
        }
        let affected = index.update(update);
        if index.synced() && !was_synced {
            fed.affected = index.claims().map(|c| c.key.clone()).collect();
            fed.synced_now = true;
        } else if index.synced() {
            fed.affected.extend(affected);
        }
    }
    controller.metrics.cached(index.sizes());
    drop(index);
    // Quota pressure's bookkeeping reads the cache as the chunk left it, under the read lock:
    // the watches wait for no plan.
    let index = controller.cache.read();
    if fed.every_quota_namespace {
        controller.observe_quotas(&index, None);
    } else {
        for namespace in &fed.quota_namespaces {
            controller.observe_quotas(&index, Some(namespace.clone()));
        }
    }
    drop(index);
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
/// Counts a failed list or watch in `workspace_gc_api_errors_total{operation="watch"}` by its
/// category, as every other request's failure is: a watch the daemon's RBAC forbids shows there.
fn record_watch_error(metrics: &Metrics, error: &watcher::Error) {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => metrics.api_error(Operation::Watch, e),
        watcher::Error::WatchError(status) => {
            metrics.api_error(Operation::Watch, &kube::Error::Api(status.clone()));
        }
        watcher::Error::NoResourceVersion => {}
    }
}

fn cannot_connect(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => ErrorCategory::of(e) == ErrorCategory::Connection,
        _ => false,
    }
}
