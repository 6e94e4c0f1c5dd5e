//! Fresh reads of what a delete verdict rests on, just before the delete: the caches may be
//! stale, and trusted for nothing that protects a claim. Read-only; what cannot be read comes
//! back unknown, which keeps the claim.
//!
//! A watch can go silent without an error (a wedged API server, a dead connection), so its
//! cache cannot vouch for itself. Unless a round of `daemon::proof` has proven the cache fresh,
//! whatever may protect a claim is therefore read live, by LISTs of the claim's namespace:
//! - every NotebookValidationJob, since any of them may name the claim in its own volumes (and
//!   the same list answers the jobs linking names by reference or by the naming convention);
//! - every PipelineRun and TaskRun, since any of them may bind the claim and no selector finds
//!   them by binding;
//! - every pod that has not finished, since no selector finds a pod by claim.
//!
//! The four namespace LISTs are sent together and shared: [`Snapshots`] gives every re-check
//! that asked before a snapshot started that same snapshot, so a burst of deletes in one
//! namespace costs one or two rounds of LISTs, and every re-check still sees the namespace as
//! it was after it asked. Lists are paged, so no response is held whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cluster::resources::{self, OwnerObject, PodVolumes};
use crate::cluster::served::Served;
use crate::contract::OwnerKind;
use crate::decide::facts::{
    ClaimFacts, JobEntry, ObjectKey, PodEntry, PodUse, RunEntry, VolumeClaims,
};
use crate::decide::linking::{self, Found, Lookup};
use crate::decide::quota::QuotaEntry;
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::{Metrics, Operation};

/// What the API server said, for one claim, moments ago.
#[derive(Debug)]
pub struct LiveView {
    namespace: Arc<Snapshot>,
    /// When the first of its reads was sent: nothing in it is older.
    read_at: Instant,
}

impl LiveView {
    /// Takes a snapshot of the claim's namespace that started after this call, each owner
    /// kind read where `served` says it is.
    pub async fn read(
        client: &Client,
        served: &Served,
        claim: &ClaimFacts,
        snapshots: &Snapshots,
        metrics: &Metrics,
    ) -> Self {
        let read_at = Instant::now();
        let namespace = (snapshots.of(client, served, &claim.key.namespace, metrics)).await;
        LiveView { namespace, read_at }
    }

    /// When the first of its reads was sent: what it says is no older than this.
    pub fn read_at(&self) -> Instant {
        self.read_at
    }
}

/// One namespace as listed live: its NotebookValidationJobs, PipelineRuns, TaskRuns and the
/// pods that have not finished and mount a claim.
#[derive(Debug)]
struct Snapshot {
    jobs: Found<Vec<JobEntry>>,
    runs: Found<Vec<RunEntry>>,
    task_runs: Found<Vec<RunEntry>>,
    pods: Found<Vec<PodEntry>>,
}

impl Snapshot {
    async fn list(client: &Client, served: &Served, namespace: &str, metrics: &Metrics) -> Self {
        // Finished pods never hold a claim (`PodUse::is_active`): let the server leave them out.
        let active = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods_api: Api<PodVolumes> = Api::namespaced(client.clone(), namespace);
        let started = Instant::now();
        let run = |kind| move |run: &OwnerObject| resources::tekton_run_entry(kind, run);
        let (jobs, runs, task_runs, pods) = tokio::join!(
            owners(
                client,
                served,
                OwnerKind::Job,
                namespace,
                started,
                metrics,
                resources::job_entry
            ),
            owners(
                client,
                served,
                OwnerKind::Run,
                namespace,
                started,
                metrics,
                run(OwnerKind::Run)
            ),
            owners(
                client,
                served,
                OwnerKind::TaskRun,
                namespace,
                started,
                metrics,
                run(OwnerKind::TaskRun)
            ),
            list("pods", &pods_api, active, metrics, |pod| {
                Some(resources::pod_entry(pod)).filter(|pod| !pod.claims.is_empty())
            }),
        );
        Snapshot {
            jobs,
            runs,
            task_runs,
            pods,
        }
    }

    fn runs(&self, kind: OwnerKind) -> &Found<Vec<RunEntry>> {
        match kind {
            OwnerKind::TaskRun => &self.task_runs,
            OwnerKind::Run | OwnerKind::Job => &self.runs,
        }
    }
}

/// The owners of one kind in `namespace`, listed where `served` says they are read, each as
/// `keep` makes it: none when the kind is optional and its group serves it at no version
/// (asked again, at `since` or later).
async fn owners<E>(
    client: &Client,
    served: &Served,
    kind: OwnerKind,
    namespace: &str,
    since: Instant,
    metrics: &Metrics,
    keep: impl Fn(&OwnerObject) -> E,
) -> Found<Vec<E>> {
    let resource = match served.readable(kind, since).await {
        Ok(Some(resource)) => resource,
        Ok(None) => return Found::Yes(Vec::new()),
        Err(why) => return Found::Unknown(why),
    };
    let api: Api<OwnerObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let what = format!("{}s at {}", kind.as_str(), resource.api_version);
    let found = list(&what, &api, ListParams::default(), metrics, |owner| {
        Some(keep(owner))
    })
    .await;
    if matches!(found, Found::Unknown(_)) {
        served.read_failed(kind).await;
    }
    found
}

/// Page size of the live LISTs: bounds what one response holds in memory.
const PAGE: u32 = 500;

/// Lists every page, keeping what `keep` returns of each object. A 404 says the kind is not
/// served at this version, which tells nothing of its objects: unknown.
async fn list<K, E>(
    what: &str,
    api: &Api<K>,
    params: ListParams,
    metrics: &Metrics,
    keep: impl Fn(&K) -> Option<E>,
) -> Found<Vec<E>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut entries = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let token = match page(api, &params, &keep, &mut entries).await {
            Ok(token) => token,
            Err(error) => {
                metrics.api_error(Operation::List, &error);
                return Found::Unknown(format!("listing {what}: {error}"));
            }
        };
        match token.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Found::Yes(entries),
        }
    }
}

/// Reads one page into `entries` and returns its continue token. The body is gathered into
/// one buffer of its exact size (chunks freed as they are copied) and decoded from it one
/// object at a time: no second copy of the response, and no page of decoded objects, is held;
/// only what `keep` returns.
async fn page<K, E>(
    api: &Api<K>,
    params: &ListParams,
    keep: &impl Fn(&K) -> Option<E>,
    entries: &mut Vec<E>,
) -> kube::Result<Option<String>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    use futures::AsyncBufReadExt;
    let mut request = kube::core::Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("list");
    let body = Client::from(api.clone()).request_stream(request).await?;
    let mut body = std::pin::pin!(body);
    let mut chunks = std::collections::VecDeque::new();
    loop {
        let read = {
            let chunk = body.fill_buf().await.map_err(kube::Error::ReadEvents)?;
            chunks.push_back(chunk.to_vec());
            chunk.len()
        };
        if read == 0 {
            break;
        }
        body.consume_unpin(read);
    }
    let text = contiguous(chunks);
    // From a slice, as kube decodes: a reader would be decoded byte by byte, several times
    // slower.
    let mut decoder = serde_json::Deserializer::from_slice(&text);
    let token = serde::de::DeserializeSeed::deserialize(
        ListSeed {
            keep,
            entries,
            object: std::marker::PhantomData::<K>,
        },
        &mut decoder,
    )
    .and_then(|token| decoder.end().map(|()| token))
    .map_err(kube::Error::SerdeError)?;
    Ok(token)
}

/// The chunks of a body in one buffer of their total size, each freed once copied.
fn contiguous(mut chunks: std::collections::VecDeque<Vec<u8>>) -> Vec<u8> {
    let mut text = Vec::with_capacity(chunks.iter().map(Vec::len).sum());
    while let Some(chunk) = chunks.pop_front() {
        text.extend_from_slice(&chunk);
    }
    text
}

/// Decodes a list response: `items` one object at a time into `entries` (through `keep`),
/// `metadata.continue` as the value; everything else is skipped.
struct ListSeed<'a, K, E, F> {
    keep: &'a F,
    entries: &'a mut Vec<E>,
    object: std::marker::PhantomData<K>,
}

impl<'de, K, E, F> serde::de::DeserializeSeed<'de> for ListSeed<'_, K, E, F>
where
    K: DeserializeOwned,
    F: Fn(&K) -> Option<E>,
{
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, K, E, F> serde::de::Visitor<'de> for ListSeed<'_, K, E, F>
where
    K: DeserializeOwned,
    F: Fn(&K) -> Option<E>,
{
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut token, mut items) = (None, false);
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "metadata" => {
                    let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta =
                        map.next_value()?;
                    token = meta.continue_;
                }
                "items" => {
                    map.next_value_seed(Items {
                        keep: self.keep,
                        entries: &mut *self.entries,
                        object: self.object,
                    })?;
                    items = true;
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        // A list without `items` is no answer: it would read as an empty namespace.
        if !items {
            return Err(serde::de::Error::missing_field("items"));
        }
        Ok(token)
    }
}

/// A list's `items` (`null` counts as empty), each object dropped once `keep` has seen it.
struct Items<'a, K, E, F> {
    keep: &'a F,
    entries: &'a mut Vec<E>,
    object: std::marker::PhantomData<K>,
}

impl<'de, K, E, F> serde::de::DeserializeSeed<'de> for Items<'_, K, E, F>
where
    K: DeserializeOwned,
    F: Fn(&K) -> Option<E>,
{
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, K, E, F> serde::de::Visitor<'de> for Items<'_, K, E, F>
where
    K: DeserializeOwned,
    F: Fn(&K) -> Option<E>,
{
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_unit<Err>(self) -> Result<(), Err> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(object) = seq.next_element::<K>()? {
            self.entries.extend((self.keep)(&object));
        }
        Ok(())
    }
}

/// Namespace snapshots, each shared by the re-checks that asked before it started.
#[derive(Debug)]
pub struct Snapshots {
    namespaces: Mutex<HashMap<String, Arc<Slot>>>,
    /// Bound how many namespaces are listed at once.
    in_flight: tokio::sync::Semaphore,
}

/// Namespace snapshots in progress at once.
const CONCURRENT_SNAPSHOTS: usize = 2;

impl Default for Snapshots {
    fn default() -> Self {
        Self {
            namespaces: Mutex::default(),
            in_flight: tokio::sync::Semaphore::new(CONCURRENT_SNAPSHOTS),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// Re-checks that asked and have not yet taken their answer.
    waiting: AtomicUsize,
    /// The latest snapshot and when it started; dropped once no re-check waits, so a
    /// namespace is not held in memory between bursts.
    latest: tokio::sync::Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

impl Snapshots {
    /// A snapshot of `namespace` that started after this call.
    async fn of(
        &self,
        client: &Client,
        served: &Served,
        namespace: &str,
        metrics: &Metrics,
    ) -> Arc<Snapshot> {
        let asked = Instant::now();
        let slot = {
            let mut namespaces = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
            namespaces.entry(namespace.to_owned()).or_default().clone()
        };
        slot.waiting.fetch_add(1, Ordering::SeqCst);
        let mut latest = slot.latest.lock().await;
        let snapshot = match &*latest {
            Some((started, snapshot)) if *started >= asked => snapshot.clone(),
            _ => {
                // Never closed, so acquiring only waits.
                let _permit = self.in_flight.acquire().await;
                let started = Instant::now();
                let snapshot = Arc::new(Snapshot::list(client, served, namespace, metrics).await);
                *latest = Some((started, snapshot.clone()));
                snapshot
            }
        };
        if slot.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            *latest = None;
        }
        snapshot
    }
}

/// The ResourceQuotas of `namespace`, listed live: quota pressure is a reason to delete, so
/// the cache, which may lag, is not trusted to say it still holds.
pub async fn quotas(client: &Client, namespace: &str, metrics: &Metrics) -> Found<Vec<QuotaEntry>> {
    let api: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(client.clone(), namespace);
    list(
        "ResourceQuotas",
        &api,
        ListParams::default(),
        metrics,
        |quota| Some(resources::quota_entry(quota)),
    )
    .await
}

/// A Namespace's workspace-gc annotations, read live (metadata only) before a delete: its
/// settings may have changed since the cache saw them (`collect: "false"` just set). `None`
/// when it could not be read, which keeps its claims.
pub async fn namespace_annotations(
    client: &Client,
    namespace: &str,
    metrics: &Metrics,
) -> Option<BTreeMap<String, String>> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    match api.get_metadata_opt(namespace).await {
        Ok(Some(meta)) => Some(resources::namespace_entry(&meta.metadata).annotations),
        Ok(None) => None,
        Err(error) => {
            metrics.api_error(Operation::Get, &error);
            None
        }
    }
}

/// Claim `key` as the API server has it: its UID, and whether it is being deleted. After a
/// DELETE that got no answer, this tells whether it was carried out.
///
/// A LIST by `metadata.name`, not a GET: the shipped roles grant claims `list` and never `get`
/// (docs/security.md). Without a resourceVersion the list is a consistent read, as a GET is.
pub async fn claim_state(
    client: &Client,
    key: &ObjectKey,
    metrics: &Metrics,
) -> Found<(String, bool)> {
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &key.namespace);
    let by_name = ListParams::default().fields(&format!("metadata.name={}", key.name));
    match api.list_metadata(&by_name).await {
        Ok(list) => match list
            .items
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(&key.name))
        {
            Some(claim) => Found::Yes((
                claim.metadata.uid.unwrap_or_default(),
                claim.metadata.deletion_timestamp.is_some(),
            )),
            None => Found::No,
        },
        Err(error) => {
            metrics.api_error(Operation::List, &error);
            Found::Unknown(format!("reading claim {key}: {error}"))
        }
    }
}

/// PersistentVolume `name`, read live; `None` when it cannot be read.
pub async fn volume(client: &Client, name: &str, metrics: &Metrics) -> Option<VolumeFacts> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resources::volume_resource());
    match api.get_opt(name).await {
        Ok(volume) => Some(resources::volume_facts(&volume?)),
        Err(error) => {
            metrics.api_error(Operation::Get, &error);
            None
        }
    }
}

/// Every PersistentVolume, from the API server's cache (`resourceVersion=0`): a volume is
/// deleted only with its UID and resourceVersion as a precondition, so one changed since is
/// refused by the server. `None` when they cannot be listed.
pub async fn volumes(client: &Client, metrics: &Metrics) -> Option<Vec<VolumeFacts>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resources::volume_resource());
    match api.list(&ListParams::default().match_any()).await {
        Ok(list) => Some(list.items.iter().map(resources::volume_facts).collect()),
        Err(error) => {
            metrics.api_error(Operation::List, &error);
            None
        }
    }
}

impl Lookup for LiveView {
    fn job(&self, _: &str, name: &str) -> Found<JobEntry> {
        match &self.namespace.jobs {
            Found::Yes(jobs) => (jobs.iter().find(|job| job.key.name == name))
                .cloned()
                .map_or(Found::No, Found::Yes),
            Found::No => Found::No,
            Found::Unknown(why) => Found::Unknown(why.clone()),
        }
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        match &self.namespace.jobs {
            Found::Yes(jobs) => Found::Yes(
                jobs.iter()
                    .filter(|job| match &job.volumes {
                        VolumeClaims::Named(claims) => claims.contains(&claim.name),
                        VolumeClaims::Unreadable => true,
                    })
                    .cloned()
                    .collect(),
            ),
            Found::No => Found::Yes(Vec::new()),
            Found::Unknown(why) => Found::Unknown(why.clone()),
        }
    }

    fn run(&self, kind: OwnerKind, _: &str, name: &str) -> Found<RunEntry> {
        match self.namespace.runs(kind) {
            Found::Yes(runs) => runs
                .iter()
                .find(|run| run.key.name == name)
                .cloned()
                .map_or(Found::No, Found::Yes),
            Found::No => Found::No,
            Found::Unknown(why) => Found::Unknown(why.clone()),
        }
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        let mut binding = Vec::new();
        for kind in [OwnerKind::Run, OwnerKind::TaskRun] {
            match self.namespace.runs(kind) {
                Found::Yes(runs) => binding.extend(
                    runs.iter()
                        .filter(|run| run.claims.contains(&claim.name))
                        .cloned(),
                ),
                Found::No => {}
                Found::Unknown(why) => return Found::Unknown(why.clone()),
            }
        }
        Found::Yes(binding)
    }

    fn failed_after(&self, kind: OwnerKind, _: &str, at: DateTime<Utc>) -> Found<u32> {
        let counted = match kind {
            OwnerKind::Job => match &self.namespace.jobs {
                Found::Yes(jobs) => Ok(linking::failed_after(jobs.iter().map(|j| &j.progress), at)),
                Found::No => Ok(0),
                Found::Unknown(why) => Err(why),
            },
            OwnerKind::Run | OwnerKind::TaskRun => match self.namespace.runs(kind) {
                Found::Yes(runs) => Ok(linking::failed_after(runs.iter().map(|r| &r.progress), at)),
                Found::No => Ok(0),
                Found::Unknown(why) => Err(why),
            },
        };
        counted.map_or_else(|why| Found::Unknown(why.clone()), Found::Yes)
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        match &self.namespace.pods {
            Found::Yes(pods) => Found::Yes(
                pods.iter()
                    .filter(|pod| pod.claims.contains(&claim.name))
                    .map(|pod| PodUse {
                        name: pod.key.name.clone(),
                        phase: pod.phase.clone(),
                    })
                    .collect(),
            ),
            Found::No => Found::Yes(Vec::new()),
            Found::Unknown(why) => Found::Unknown(why.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use prometheus_client::registry::Registry;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// LISTs served, by path.
    type Counted = Arc<Mutex<BTreeMap<String, usize>>>;

    /// A mock API server for namespace `ml`, answering slowly (so callers pile up): pods with
    /// one pod mounting claim `a`, PipelineRuns with a run binding `b`, jobs with one naming
    /// `b` in its volumes, and no TaskRun CRD (discovery lists `tekton.dev/v1` without
    /// TaskRuns).
    fn namespace_server() -> (Client, Counted) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let counted = Counted::default();
        let count = counted.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                let discovery = [
                    "/apis/tekton.dev",
                    "/apis/tekton.dev/v1",
                    "/apis/mlops.mlops.dev",
                    "/apis/mlops.mlops.dev/v1alpha1",
                ]
                .contains(&path.as_str());
                assert!(discovery || query.contains("limit=500"), "{path}?{query}");
                *count.lock().unwrap().entry(path.clone()).or_default() += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let (status, body) = match path.as_str() {
                    "/apis/tekton.dev" => (
                        200,
                        json!({"kind": "APIGroup", "apiVersion": "v1", "name": "tekton.dev",
                               "versions": [{"groupVersion": "tekton.dev/v1", "version": "v1"}]}),
                    ),
                    "/apis/mlops.mlops.dev" => (
                        200,
                        json!({"kind": "APIGroup", "apiVersion": "v1", "name": "mlops.mlops.dev",
                               "versions": [{"groupVersion": "mlops.mlops.dev/v1alpha1", "version": "v1alpha1"}]}),
                    ),
                    "/apis/mlops.mlops.dev/v1alpha1" => (
                        200,
                        json!({"kind": "APIResourceList", "apiVersion": "v1",
                               "groupVersion": "mlops.mlops.dev/v1alpha1", "resources": [
                                   {"name": "notebookvalidationjobs", "singularName": "notebookvalidationjob",
                                    "namespaced": true, "kind": "NotebookValidationJob", "verbs": ["list"]}]}),
                    ),
                    "/apis/tekton.dev/v1" => (
                        200,
                        json!({"kind": "APIResourceList", "apiVersion": "v1",
                               "groupVersion": "tekton.dev/v1", "resources": [
                                   {"name": "pipelineruns", "singularName": "pipelinerun",
                                    "namespaced": true, "kind": "PipelineRun", "verbs": ["list"]},
                                   {"name": "pipelineruns/status", "singularName": "",
                                    "namespaced": true, "kind": "PipelineRun", "verbs": ["get"]}]}),
                    ),
                    "/api/v1/namespaces/ml/pods" => {
                        assert!(
                            query.contains(
                                "fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed"
                            ),
                            "{query}"
                        );
                        (
                            200,
                            list(
                                "PodList",
                                json!([
                                    {"metadata": {"name": "p", "namespace": "ml"},
                                     "spec": {"containers": [], "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "a"}}]},
                                     "status": {"phase": "Running"}}
                                ]),
                            ),
                        )
                    }
                    "/apis/tekton.dev/v1/namespaces/ml/pipelineruns" => (
                        200,
                        list(
                            "PipelineRunList",
                            json!([
                                {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
                                 "metadata": {"name": "rerun", "namespace": "ml", "uid": "r2"},
                                 "spec": {"workspaces": [{"name": "w", "persistentVolumeClaim": {"claimName": "b"}}]}}
                            ]),
                        ),
                    ),
                    "/apis/mlops.mlops.dev/v1alpha1/namespaces/ml/notebookvalidationjobs" => (
                        200,
                        list(
                            "NotebookValidationJobList",
                            json!([
                                {"apiVersion": "mlops.mlops.dev/v1alpha1", "kind": "NotebookValidationJob",
                                 "metadata": {"name": "validating", "namespace": "ml", "uid": "j1"},
                                 "spec": {"podConfig": {"volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "b"}}]}},
                                 "status": {"phase": "ValidationRunning"}}
                            ]),
                        ),
                    ),
                    other => panic!("unexpected request {other}"),
                };
                reply.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), counted)
    }

    fn list(kind: &str, items: Value) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items})
    }

    fn claim(name: &str) -> ClaimFacts {
        ClaimFacts::example(name)
    }

    #[tokio::test]
    async fn a_burst_in_one_namespace_shares_its_snapshots() {
        let (client, counted) = namespace_server();
        let served = Served::new(client.clone(), None);
        let snapshots = Arc::new(Snapshots::default());
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let calls = (0..20).map(|i| {
            let (client, snapshots, metrics) = (client.clone(), snapshots.clone(), metrics.clone());
            let served = served.clone();
            let claim = claim(if i % 2 == 0 { "a" } else { "b" });
            tokio::spawn(async move {
                LiveView::read(&client, &served, &claim, &snapshots, &metrics).await
            })
        });
        let views = futures::future::join_all(calls).await;
        for (i, view) in views.into_iter().enumerate() {
            let view = view.unwrap();
            let name = if i % 2 == 0 { "a" } else { "b" };
            let key = ObjectKey::new("ml", name);
            let Found::Yes(pods) = view.pods_using(&key) else {
                panic!("call {i}: pods unknown")
            };
            assert_eq!(pods.len(), usize::from(name == "a"), "call {i}");
            let Found::Yes(runs) = view.runs_binding(&key) else {
                panic!("call {i}: runs unknown")
            };
            let names: Vec<_> = runs.iter().map(|r| r.key.name.as_str()).collect();
            assert_eq!(
                names,
                if name == "b" { vec!["rerun"] } else { vec![] },
                "call {i}"
            );
            assert_eq!(
                view.run(OwnerKind::TaskRun, "ml", "anything"),
                Found::No,
                "no TaskRun CRD: no TaskRun"
            );
            let Found::Yes(jobs) = view.jobs_naming(&key) else {
                panic!("call {i}: jobs unknown")
            };
            assert_eq!(jobs.len(), usize::from(name == "b"), "call {i}");
            assert!(matches!(view.job("ml", "validating"), Found::Yes(_)));
            assert_eq!(view.job("ml", "nb"), Found::No);
        }
        for (path, lists) in counted.lock().unwrap().iter() {
            assert!(
                (1..=2).contains(lists),
                "{lists} LISTs of {path} for 20 re-checks"
            );
        }
        // Nothing is held between bursts.
        let slot = snapshots.namespaces.lock().unwrap()["ml"].clone();
        assert!(slot.latest.lock().await.is_none());
    }

    /// A mock API server answering each pods LIST with the next of `bodies`.
    fn paged_server(bodies: Vec<&'static str>) -> (Client, Arc<Mutex<Vec<String>>>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let queries = Arc::new(Mutex::new(Vec::new()));
        let seen = queries.clone();
        tokio::spawn(async move {
            let mut bodies = bodies.into_iter();
            while let Some((request, reply)) = handle.next_request().await {
                let query = request.uri().query().unwrap_or_default().to_owned();
                seen.lock().unwrap().push(query);
                let body = Body::from(bodies.next().unwrap().as_bytes().to_vec());
                reply.send_response(Response::builder().status(200).body(body).unwrap());
            }
        });
        (Client::new(service, "default"), queries)
    }

    #[test]
    fn chunks_are_joined_in_order() {
        let chunks = ["{\"a\"", "", ":[1,", "2]}"].map(|c| c.as_bytes().to_vec());
        let text = contiguous(chunks.into_iter().collect());
        assert_eq!(String::from_utf8(text).unwrap(), "{\"a\":[1,2]}");
    }

    fn pod_names(found: Found<Vec<PodEntry>>) -> Vec<String> {
        let Found::Yes(pods) = found else {
            panic!("{found:?}")
        };
        pods.into_iter().map(|pod| pod.key.name).collect()
    }

    #[tokio::test]
    async fn pages_are_decoded_object_by_object_and_followed_to_the_end() {
        let (client, queries) = paged_server(vec![
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{"continue":"next","resourceVersion":"9"},
               "items":[{"metadata":{"name":"p1","namespace":"ml","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"x"}]}},
                        {"metadata":{"name":"p2","namespace":"ml"},"spec":{}}],"extra":[1,{"x":null}]}"#,
            r#"{"items":null,"metadata":{}}"#,
        ]);
        let api: Api<PodVolumes> = Api::namespaced(client, "ml");
        let metrics = Metrics::register(&mut Registry::default());
        let found = super::list("pods", &api, ListParams::default(), &metrics, |pod| {
            Some(resources::pod_entry(pod))
        })
        .await;
        assert_eq!(pod_names(found), ["p1", "p2"]);
        let queries = queries.lock().unwrap().clone();
        assert_eq!(queries.len(), 2, "{queries:?}");
        assert!(queries[1].contains("continue=next"), "{queries:?}");
    }

    #[tokio::test]
    async fn a_cut_or_garbled_page_is_unknown() {
        for body in [
            r#"{"metadata":{},"items":[{"metadata":{"name":"p1","namespace":"ml"}}"#,
            r#"{"metadata":{},"items":[{"metadata":{"name":"p1","namespace":"ml"}}]} trailing"#,
            r#"{"metadata":{},"items":{"not":"a list"}}"#,
            r#"{"kind":"PodList","metadata":{}}"#,
        ] {
            let (client, _) = paged_server(vec![body]);
            let api: Api<PodVolumes> = Api::namespaced(client, "ml");
            let metrics = Metrics::register(&mut Registry::default());
            let found = super::list("pods", &api, ListParams::default(), &metrics, |pod| {
                Some(resources::pod_entry(pod))
            })
            .await;
            assert!(matches!(found, Found::Unknown(_)), "{body}: {found:?}");
        }
    }

    #[tokio::test]
    async fn a_later_recheck_gets_a_later_snapshot() {
        let (client, counted) = namespace_server();
        let served = Served::new(client.clone(), None);
        let snapshots = Snapshots::default();
        let metrics = Metrics::register(&mut Registry::default());
        for _ in 0..2 {
            LiveView::read(&client, &served, &claim("a"), &snapshots, &metrics).await;
        }
        let counted = counted.lock().unwrap();
        assert_eq!(counted["/api/v1/namespaces/ml/pods"], 2);
        // No TaskRun CRD: discovery is asked again for each snapshot, none is listed.
        assert_eq!(counted["/apis/tekton.dev"], 2);
        assert!(
            !counted.keys().any(|path| path.ends_with("/taskruns")),
            "{counted:?}"
        );
    }
}
