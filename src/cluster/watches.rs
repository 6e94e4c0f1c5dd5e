//! The watches that feed the cache: claims (by label selector), NotebookValidationJobs,
//! PipelineRuns, TaskRuns, pods and, with quota pressure enabled, ResourceQuotas, cluster-wide
//! or one watch per configured namespace. Each
//! object is stripped to its cache entry as it arrives, so full objects are never kept.
//!
//! The owner kinds are watched at the version discovery says is served ([`served`]). A watch
//! whose list or watch answers 404 (its CRD was deleted, or stopped serving that version)
//! empties its scope, forgets how far it delivered, and resolves the kind again: watched at
//! the version now served, listed and empty when its group serves it at no version and it is
//! optional (TaskRun), unknown otherwise. A kind not watched is resolved again with backoff (at
//! most about 30 s apart), so a CRD installed later is picked up; until then the live re-check,
//! which asks discovery again for a kind it found absent, still sees its objects.

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use crate::cluster::cache::{Change, Index, Scope, TaskRunEntry, Update};
use crate::cluster::progress;
use crate::cluster::resources::{self, OwnerObject};
use crate::cluster::served::{Served, Serving};
use crate::config::{Config, SelectorConfig};
use crate::contract::OwnerKind;
use crate::decide::facts::ObjectKey;
use crate::decide::linking::Found;
use crate::observe::metrics::Kind;

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
pub fn index(config: &Config) -> Index {
    let selector = &config.selector;
    let mut index = Index::new(&scopes(selector))
        .with_keep_failed(config.policy.keep_failed)
        .with_provenance(config.policy().provenance);
    if config.quota.enabled {
        index = index.with_quotas(&scopes(selector));
    }
    if config.namespace_policy.enabled {
        index = index.with_namespaces();
    }
    index
}

/// All watches merged into one stream of cache updates (ResourceQuotas only with quota pressure
/// enabled, Namespaces only with per-namespace settings), the owner kinds where `served`
/// resolves them. Watch errors are yielded (to be logged and counted) and the watch retries
/// with kube-runtime's default backoff.
pub fn updates(client: &Client, config: &Config, served: &Served) -> BoxStream<'static, Item> {
    let (selector, quotas) = (&config.selector, config.quota.enabled);
    let mut streams: Vec<BoxStream<'static, Item>> = Vec::new();
    if config.namespace_policy.enabled {
        streams.push(namespaces(client));
    }
    let claims = watcher::Config::default().labels(&selector.label_selector.to_string());
    for scope in scopes(selector) {
        streams.push(kind(
            Kind::Claims,
            resources::scoped_api::<resources::ClaimObject>(client, scope.as_deref()),
            claims.clone(),
            scope.clone(),
            resources::claim_facts,
            Update::Claim,
        ));
        let owners = Owners {
            client: client.clone(),
            served: served.clone(),
            scope: scope.clone(),
        };
        streams.push(owners.watch(OwnerKind::Job, resources::job_entry, Update::Job));
        streams.push(owners.watch(OwnerKind::Run, resources::run_entry, Update::Run));
        streams.push(owners.watch(
            OwnerKind::TaskRun,
            |run| TaskRunEntry(resources::task_run_entry(run)),
            Update::TaskRun,
        ));
        streams.push(kind(
            Kind::Pods,
            resources::scoped_api::<resources::PodVolumes>(client, scope.as_deref()),
            watcher::Config::default(),
            scope.clone(),
            resources::pod_entry,
            Update::Pod,
        ));
        if quotas {
            streams.push(kind(
                Kind::Quotas,
                resources::scoped_api::<ResourceQuota>(client, scope.as_deref()),
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
    config: &Config,
    mut on_error: impl FnMut(Kind, &watcher::Error) -> bool,
) -> Option<Index> {
    let mut index = index(config);
    let served = Served::new(client.clone(), None);
    let mut updates = updates(client, config, &served);
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

/// Namespaces, cluster-wide and as metadata only (`PartialObjectMeta` makes every request
/// ask for metadata alone): of each only its workspace-gc annotations are kept.
fn namespaces(client: &Client) -> BoxStream<'static, Item> {
    kind(
        Kind::Namespaces,
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
        None,
        |meta| resources::namespace_entry(&meta.metadata),
        Update::Namespace,
    )
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
    let floor = {
        let api = api.clone();
        async move { progress::collection(&api, None).await }
    };
    after_floor(name, floor, move |mut progress| {
        watch(name, api, config)
            .default_backoff()
            .flat_map(move |event| {
                stream::iter(match event {
                    Ok(event) => progress.updates(event, &scope, convert, wrap),
                    Err(error) => vec![Err((name, error))],
                })
            })
            .boxed()
    })
}

/// The kinds whose watches say how far they have delivered ([`Update::Delivered`]): what the
/// live re-check can prove fresh instead of listing (`daemon::proof`).
pub const PROVEN: [Kind; 4] = [Kind::Jobs, Kind::Runs, Kind::TaskRuns, Kind::Pods];

/// `events` (given the watch's [`Progress`]), after, for a kind in [`PROVEN`], its
/// collection's revision is read (`floor`): every list of the watch is served at that revision
/// or later, so once one is done the cache holds every change up to it, even of a kind that
/// has no objects and so no event to tell.
fn after_floor(
    name: Kind,
    floor: impl Future<Output = Found<u64>> + Send + 'static,
    events: impl FnOnce(Progress) -> BoxStream<'static, Item> + Send + 'static,
) -> BoxStream<'static, Item> {
    stream::once(async move {
        // Not counted: a failure leaves the floor at 0, and the watch's own list fails and is
        // counted.
        let floor = match PROVEN.contains(&name) {
            true => floor.await,
            false => Found::No,
        };
        let floor = match floor {
            Found::Yes(revision) => revision,
            _ => 0,
        };
        events(Progress::of(name, floor))
    })
    .flatten()
    .boxed()
}

/// How far one watch has delivered: the resourceVersion of each event, once applied, and of the
/// newest object of a (re-)list once it is done (the list itself was served at that or later).
/// Only for the kinds in [`PROVEN`].
struct Progress {
    name: Kind,
    tracked: bool,
    /// The revision read before the watch started (0 if it could not be read).
    floor: u64,
    /// The newest object of the (re-)list in progress.
    listing: u64,
}

impl Progress {
    fn of(name: Kind, floor: u64) -> Self {
        let tracked = PROVEN.contains(&name);
        Progress {
            name,
            tracked,
            floor,
            listing: 0,
        }
    }

    /// The cache updates for one watcher event: its change, then how far it has delivered.
    fn updates<K: Resource, E>(
        &mut self,
        event: Event<K>,
        scope: &Scope,
        convert: fn(&K) -> E,
        wrap: fn(Change<E>) -> Update,
    ) -> Vec<Item> {
        let revision = |object: &K| {
            let version = object.meta().resource_version.as_deref();
            version.and_then(|version| version.parse::<u64>().ok())
        };
        let delivered = match &event {
            _ if !self.tracked => None,
            Event::Apply(object) | Event::Delete(object) => revision(object),
            Event::Init => {
                self.listing = 0;
                None
            }
            Event::InitApply(object) => {
                self.listing = self.listing.max(revision(object).unwrap_or(0));
                None
            }
            Event::InitDone => {
                Some(std::mem::take(&mut self.listing).max(self.floor)).filter(|r| *r > 0)
            }
        };
        let change = Ok(wrap(change(event, scope, convert)));
        let delivered = delivered.map(|r| Ok(Update::Delivered(self.name, scope.clone(), r)));
        std::iter::once(change).chain(delivered).collect()
    }
}

/// What the watches of the owner kinds in one scope share.
#[derive(Clone)]
struct Owners {
    client: Client,
    served: Served,
    scope: Scope,
}

impl Owners {
    /// The watch of an owner kind, at the version discovery says is served, resolved again
    /// whenever that version stops being served (its list or watch answers 404). A kind not
    /// served where it can be read empties the scope, as listed and empty (an optional kind
    /// its group serves at no version) or unknown, and is resolved again with backoff.
    fn watch<E: Send + 'static>(
        &self,
        owner: OwnerKind,
        convert: fn(&OwnerObject) -> E,
        wrap: fn(Change<E>) -> Update,
    ) -> BoxStream<'static, Item> {
        let this = self.clone();
        let rounds = stream::unfold(Resolutions::default(), move |mut resolutions| {
            let owners = this.clone();
            async move {
                if let Some(delay) = resolutions.delay() {
                    tokio::time::sleep(delay).await;
                }
                let items = match owners.served.resolve(owner).await {
                    Ok(serving) => owners.round(owner, serving, &mut resolutions, convert, wrap),
                    Err(error) => {
                        let error = watcher::Error::InitialListFailed(error);
                        stream::iter([Err((Kind::from(owner), error))]).boxed()
                    }
                };
                Some((items, resolutions))
            }
        });
        rounds.flatten().boxed()
    }

    /// The updates of one resolution: a watch where the kind can be read, until that version
    /// is no longer served; otherwise the one update that empties the scope.
    fn round<E: Send + 'static>(
        self,
        owner: OwnerKind,
        serving: Serving,
        resolutions: &mut Resolutions,
        convert: fn(&OwnerObject) -> E,
        wrap: fn(Change<E>) -> Update,
    ) -> BoxStream<'static, Item> {
        let resource = match serving.readable(owner) {
            Ok(Some(resource)) => resource.clone(),
            unserved => {
                resolutions.unserved();
                let why = unserved.err();
                let update = Update::Unserved(owner, self.scope, why);
                return stream::iter([Ok(update)]).boxed();
            }
        };
        resolutions.watching();
        let name = Kind::from(owner);
        let api = resources::owner_api(&self.client, self.scope.as_deref(), &resource);
        let floor = {
            let api = api.clone();
            async move { progress::collection(&api, None).await }
        };
        let scope = self.scope;
        after_floor(name, floor, move |progress| {
            let events = (watch(name, api, watcher::Config::default()).default_backoff()).boxed();
            let until_unserved = stream::unfold(Some((events, progress)), move |watching| {
                let scope = scope.clone();
                let at = resource.api_version.clone();
                async move {
                    let (mut events, mut progress) = watching?;
                    let items = match events.next().await? {
                        // A streamed list starts as a watch, so its 404 comes as the watch's.
                        Err(
                            watcher::Error::InitialListFailed(error)
                            | watcher::Error::WatchStartFailed(error)
                            | watcher::Error::WatchFailed(error),
                        ) if resources::is_not_found(&error) => {
                            let why = format!(
                                "{} is no longer served at {at}; asking discovery again",
                                owner.as_str()
                            );
                            let update = Update::Unserved(owner, scope, Some(why));
                            return Some((vec![Ok(update)], None));
                        }
                        Ok(event) => progress.updates(event, &scope, convert, wrap),
                        Err(error) => vec![Err((name, error))],
                    };
                    Some((items, Some((events, progress))))
                }
            });
            until_unserved.flat_map(stream::iter).boxed()
        })
    }
}

/// When an owner kind is resolved again: at once the first time and after a watch that ran
/// [`CALM`], otherwise with kube-runtime's backoff (0.8 s doubling up to 30 s), so that a kind
/// not served, or a version discovery lists but the server does not serve yet, is not asked
/// about every second forever.
#[derive(Default)]
struct Resolutions {
    backoff: watcher::DefaultBackoff,
    /// When the last watch started; `None` when the last round watched nothing.
    watched: Option<std::time::Instant>,
    started: bool,
}

impl Resolutions {
    fn delay(&mut self) -> Option<std::time::Duration> {
        if !std::mem::replace(&mut self.started, true) {
            return None;
        }
        if self.watched.take().is_some_and(|at| at.elapsed() >= CALM) {
            kube::runtime::utils::Backoff::reset(&mut self.backoff);
            return None;
        }
        // Never ends; were it to, the longest of its delays.
        Some(
            self.backoff
                .next()
                .unwrap_or(std::time::Duration::from_secs(30)),
        )
    }

    fn watching(&mut self) {
        self.watched = Some(std::time::Instant::now());
    }

    fn unserved(&mut self) {
        self.watched = None;
    }
}

/// A kind's watcher. Its initial list, and every re-list, streams as watch events
/// (`sendInitialEvents`, on by default from Kubernetes 1.34): objects arrive and are stripped
/// one at a time, where a paged list holds a page of up to 500 full objects of every kind at
/// once during the initial sync. An API server that refuses it (Kubernetes 1.33, or the
/// `WatchList` feature gate off: 422 Invalid) is listed in pages instead, for the life of the
/// watch.
fn watch<K>(
    name: Kind,
    api: Api<K>,
    config: watcher::Config,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let streaming = watcher(api.clone(), config.clone().streaming_lists()).boxed();
    stream::unfold(
        Lists::Streaming(streaming, Box::new((api, config))),
        move |lists| async move {
            match lists {
                Lists::Streaming(mut events, fallback) => match events.next().await? {
                    Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
                        if status.code == 422 =>
                    {
                        info!(
                            kind = name.as_str(),
                            message = status.message,
                            "the API server does not stream lists; listing in pages"
                        );
                        let (api, config) = *fallback;
                        let mut paged = watcher(api, config).boxed();
                        let event = paged.next().await?;
                        Some((event, Lists::Paged(paged)))
                    }
                    event => Some((event, Lists::Streaming(events, fallback))),
                },
                Lists::Paged(mut events) => {
                    let event = events.next().await?;
                    Some((event, Lists::Paged(events)))
                }
            }
        },
    )
    .boxed()
}

/// How a watcher lists: streamed until the API server refuses, then paged (with what the paged
/// watcher needs).
enum Lists<K> {
    Streaming(
        BoxStream<'static, watcher::Result<Event<K>>>,
        Box<(Api<K>, watcher::Config)>,
    ),
    Paged(BoxStream<'static, watcher::Result<Event<K>>>),
}

/// How long a watch must run before its kind's next resolution starts without backoff.
const CALM: std::time::Duration = std::time::Duration::from_secs(60);

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
    fn of<E: crate::cluster::cache::Cached>(change: &Change<E>) -> Option<&str> {
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
        Update::Namespace(c) => of(c),
        Update::Delivered(..) | Update::Unserved(..) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    /// The requests a mock API server saw, as `path?query`.
    type Seen = Arc<Mutex<Vec<String>>>;

    /// A mock API server for pods: a watch asking for initial events is answered by `streamed`
    /// (a status code and body), a list by one page holding pod `p`.
    fn server(streamed: (u16, String)) -> (Client, Seen) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen = Seen::default();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let query = request.uri().query().unwrap_or_default().to_owned();
                log.lock()
                    .unwrap()
                    .push(format!("{}?{query}", request.uri().path()));
                let (status, body) = if query.contains("sendInitialEvents=true") {
                    streamed.clone()
                } else if !query.contains("watch=true") {
                    let list = json!({"apiVersion": "v1", "kind": "PodList",
                                      "metadata": {"resourceVersion": "10"}, "items": [pod()]});
                    (200, list.to_string())
                } else {
                    panic!("unexpected request {query}")
                };
                reply.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), seen)
    }

    fn pod() -> serde_json::Value {
        json!({"metadata": {"name": "p", "namespace": "ml", "resourceVersion": "9"},
               "spec": {"volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "c"}}]}})
    }

    /// The first three events: `Init`, the pod, `InitDone`.
    async fn initial_list(client: Client) -> Vec<String> {
        let api: Api<resources::PodVolumes> = Api::all(client);
        watch(Kind::Pods, api, watcher::Config::default())
            .take(3)
            .map(|event| match event.expect("no error") {
                Event::Init => "init".to_owned(),
                Event::InitApply(pod) => format!("pod {}", pod.meta().name.clone().unwrap()),
                Event::InitDone => "done".to_owned(),
                other => format!("{other:?}"),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn the_initial_list_streams_as_watch_events() {
        let events = [
            json!({"type": "ADDED", "object": pod()}),
            json!({"type": "BOOKMARK", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "resourceVersion": "10", "annotations": {"k8s.io/initial-events-end": "true"}}}}),
        ];
        let body = events.map(|e| format!("{e}\n")).concat();
        let (client, seen) = server((200, body));
        assert_eq!(initial_list(client).await, ["init", "pod p", "done"]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "one watch, no list: {seen:?}");
        assert!(
            seen[0].contains("resourceVersionMatch=NotOlderThan"),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_server_that_refuses_streaming_is_listed_in_pages() {
        // What kube-apiserver answers with the WatchList feature gate off (as on 1.33).
        let refusal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Invalid", "code": 422,
            "message": "The ListOptions \"\" is invalid: sendInitialEvents: Forbidden: \
                        sendInitialEvents is forbidden for watch unless the WatchList feature \
                        gate is enabled"});
        let (client, seen) = server((422, refusal.to_string()));
        assert_eq!(initial_list(client).await, ["init", "pod p", "done"]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[1].contains("limit=500"), "a paged list: {seen:?}");
    }
}
