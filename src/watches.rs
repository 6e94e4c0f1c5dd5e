//! The watches that feed the cache: claims (by label selector), NotebookValidationJobs,
//! PipelineRuns, TaskRuns, pods and, with quota pressure enabled, ResourceQuotas, cluster-wide
//! or one watch per configured namespace. Each
//! object is stripped to its cache entry as it arrives, so full objects are never kept.
//!
//! The TaskRun kind is optional: where its CRD is not installed the list answers 404, which
//! means no TaskRun exists, so the kind counts as listed and empty. The watch keeps retrying
//! with kube-runtime's backoff (at most about 30 s apart), so a CRD installed later is picked
//! up by the next retry; until then the live re-check, which lists TaskRuns itself before any
//! delete, still sees them.

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ResourceQuota};
use kube::api::{Api, ApiResource};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use crate::cache::{Change, Index, Kind, Scope, TaskRunEntry, Update};
use crate::config::SelectorConfig;
use crate::facts::ObjectKey;
use crate::resources::{self, OwnerObject};

/// One item of the merged watch streams.
pub type Item = Result<Update, (Kind, watcher::Error)>;

/// The scopes the watches cover: one per configured namespace, or the whole cluster.
pub fn scopes(selector: &SelectorConfig) -> Vec<Scope> {
    if selector.namespaces.is_empty() {
        vec![None]
    } else {
        selector.namespaces.iter().cloned().map(Some).collect()
    }
}

/// The index the watches of [`updates`] fill: it is synced once each of them has listed.
pub fn index(selector: &SelectorConfig, quotas: bool) -> Index {
    let index = Index::new(&scopes(selector));
    if quotas {
        index.with_quotas(&scopes(selector))
    } else {
        index
    }
}

/// All watches merged into one stream of cache updates (ResourceQuotas only with `quotas`).
/// Watch errors are yielded (to be logged and counted) and the watch retries with
/// kube-runtime's default backoff.
pub fn updates(
    client: &Client,
    selector: &SelectorConfig,
    quotas: bool,
) -> BoxStream<'static, Item> {
    let mut streams: Vec<BoxStream<'static, Item>> = Vec::new();
    let claims = watcher::Config::default().labels(&selector.label_selector.to_string());
    for scope in scopes(selector) {
        streams.push(kind(
            Kind::Claims,
            typed::<PersistentVolumeClaim>(client, &scope),
            claims.clone(),
            scope.clone(),
            resources::claim_facts,
            Update::Claim,
        ));
        streams.push(kind(
            Kind::Jobs,
            owners(client, &scope, &resources::job_resource()),
            watcher::Config::default(),
            scope.clone(),
            resources::job_entry,
            Update::Job,
        ));
        streams.push(kind(
            Kind::Runs,
            owners(client, &scope, &resources::run_resource()),
            watcher::Config::default(),
            scope.clone(),
            resources::run_entry,
            Update::Run,
        ));
        streams.push(optional_kind(
            Kind::TaskRuns,
            owners(client, &scope, &resources::task_run_resource()),
            scope.clone(),
            |run| TaskRunEntry(resources::task_run_entry(run)),
            Update::TaskRun,
        ));
        streams.push(kind(
            Kind::Pods,
            typed::<resources::PodVolumes>(client, &scope),
            watcher::Config::default(),
            scope.clone(),
            resources::pod_entry,
            Update::Pod,
        ));
        if quotas {
            streams.push(kind(
                Kind::Quotas,
                typed::<ResourceQuota>(client, &scope),
                watcher::Config::default(),
                scope.clone(),
                resources::quota_entry,
                Update::Quota,
            ));
        }
    }
    let excluded = selector.exclude_namespaces.clone();
    stream::select_all(streams)
        .filter(move |item| {
            let keep = match item {
                // A pod's volumes are immutable: one that mounts no claim never will, so it is
                // not cached at all and memory follows the build pods, not the cluster's.
                Ok(Update::Pod(Change::Apply(pod) | Change::InitApply(_, pod)))
                    if pod.claims.is_empty() =>
                {
                    false
                }
                Ok(update) => {
                    namespace_of(update).is_none_or(|ns| !excluded.iter().any(|e| e == ns))
                }
                Err(_) => true,
            };
            futures::future::ready(keep)
        })
        .boxed()
}

/// Runs the watches until every one has listed once and returns the filled index: the
/// one-shot path `audit` takes, through the same code as the daemon.
pub async fn sync_once(
    client: &Client,
    selector: &SelectorConfig,
    quotas: bool,
    mut on_error: impl FnMut(Kind, &watcher::Error) -> bool,
) -> Option<Index> {
    let mut index = index(selector, quotas);
    let mut updates = updates(client, selector, quotas);
    while let Some(item) = updates.next().await {
        match item {
            Ok(update) => {
                index.update(update);
                if index.synced() {
                    return Some(index);
                }
            }
            Err((kind, error)) => {
                if !on_error(kind, &error) {
                    return None;
                }
            }
        }
    }
    None
}

fn typed<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

fn owners(client: &Client, scope: &Scope, resource: &ApiResource) -> Api<OwnerObject> {
    match scope {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// One kind's watch, converted to cache updates as objects arrive.
fn kind<K, E>(
    name: Kind,
    api: Api<K>,
    config: watcher::Config,
    scope: Scope,
    convert: fn(&K) -> E,
    wrap: fn(Change<E>) -> Update,
) -> BoxStream<'static, Item>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    E: Send + 'static,
{
    watcher(api, config)
        .default_backoff()
        .map(move |event| match event {
            Ok(event) => Ok(wrap(change(event, &scope, convert))),
            Err(error) => Err((name, error)),
        })
        .boxed()
}

/// A kind whose CRD may be missing: a list that answers 404 means no such object exists, so
/// the scope is reported listed and empty (logged once each time the CRD goes or comes).
fn optional_kind<E: Send + 'static>(
    name: Kind,
    api: Api<OwnerObject>,
    scope: Scope,
    convert: fn(&OwnerObject) -> E,
    wrap: fn(Change<E>) -> Update,
) -> BoxStream<'static, Item> {
    let mut absent = false;
    watcher(api, watcher::Config::default())
        .backoff(PatientBackoff::default())
        .map(move |event| match event {
            Err(watcher::Error::InitialListFailed(error)) if resources::is_not_found(&error) => {
                if !absent {
                    absent = true;
                    info!(
                        kind = name.as_str(),
                        "the CRD is not installed: no such objects exist; checking again with backoff"
                    );
                }
                Ok(wrap(Change::InitDone(scope.clone())))
            }
            Ok(event) => {
                // `Init` comes before every list attempt, so only what follows it shows the
                // kind is served.
                if !matches!(event, Event::Init) && std::mem::take(&mut absent) {
                    info!(kind = name.as_str(), "the CRD is installed now");
                }
                Ok(wrap(change(event, &scope, convert)))
            }
            Err(error) => Err((name, error)),
        })
        .boxed()
}

/// kube-runtime's exponential backoff (0.8 s doubling up to 30 s), reset by a success only
/// once no error came for a minute. The watcher reports `Init`, a success, before every list
/// attempt, so a reset on any success would retry a list that keeps failing (a CRD that is not
/// installed) about every second forever.
#[derive(Default)]
struct PatientBackoff {
    inner: watcher::DefaultBackoff,
    last_error: Option<std::time::Instant>,
}

/// How long a watch must go without an error before its backoff starts over.
const CALM: std::time::Duration = std::time::Duration::from_secs(60);

impl Iterator for PatientBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        self.last_error = Some(std::time::Instant::now());
        self.inner.next()
    }
}

impl kube::runtime::utils::Backoff for PatientBackoff {
    fn reset(&mut self) {
        if self.last_error.is_none_or(|at| at.elapsed() >= CALM) {
            self.inner.reset();
        }
    }
}

fn change<K: Resource, E>(event: Event<K>, scope: &Scope, convert: fn(&K) -> E) -> Change<E> {
    match event {
        Event::Apply(object) => Change::Apply(convert(&object)),
        Event::Delete(object) => Change::Delete(ObjectKey::of(object.meta())),
        Event::Init => Change::Init(scope.clone()),
        Event::InitApply(object) => Change::InitApply(scope.clone(), convert(&object)),
        Event::InitDone => Change::InitDone(scope.clone()),
    }
}

fn namespace_of(update: &Update) -> Option<&str> {
    fn of<E: crate::cache::Cached>(change: &Change<E>) -> Option<&str> {
        match change {
            Change::Apply(entry) | Change::InitApply(_, entry) => Some(&entry.key().namespace),
            Change::Delete(key) => Some(&key.namespace),
            Change::Init(_) | Change::InitDone(_) => None,
        }
    }
    match update {
        Update::Claim(c) => of(c),
        Update::Job(c) => of(c),
        Update::Run(c) => of(c),
        Update::TaskRun(c) => of(c),
        Update::Pod(c) => of(c),
        Update::Quota(c) => of(c),
    }
}
