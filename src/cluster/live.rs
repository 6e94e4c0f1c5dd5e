//! Fresh reads of what a delete verdict rests on, just before the delete: the caches may be
//! stale, and trusted for nothing that protects a claim. Read-only; what cannot be read comes
//! back unknown, which keeps the claim.
//!
//! A watch can go silent without an error (a wedged API server, a dead connection), so its
//! cache cannot vouch for itself. Whatever may protect a claim is therefore read live:
//! - the jobs linking can name (by reference or by the naming convention), one GET each;
//! - every PipelineRun and TaskRun of the claim's namespace, since any of them may bind the
//!   claim and no selector finds them by binding;
//! - every pod of the namespace that has not finished, since no selector finds a pod by claim.
//!
//! The three namespace LISTs are sent together and shared: [`Snapshots`] gives every re-check
//! that asked before a snapshot started that same snapshot, so a burst of deletes in one
//! namespace costs one or two rounds of LISTs, and every re-check still sees the namespace as
//! it was after it asked. Lists are paged, so no response is held whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectList};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cluster::resources::{self, OwnerObject, PodVolumes};
use crate::contract::OwnerKind;
use crate::decide::facts::{ClaimFacts, JobEntry, ObjectKey, PodEntry, PodUse, RunEntry};
use crate::decide::linking::{self, Found, Lookup};
use crate::decide::quota::QuotaEntry;
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::{Metrics, Operation};

/// What the API server said, for one claim, moments ago.
#[derive(Debug)]
pub struct LiveView {
    jobs: HashMap<String, Found<JobEntry>>,
    namespace: Arc<Snapshot>,
    /// When the first of its reads was sent: nothing in it is older.
    read_at: Instant,
}

impl LiveView {
    /// Reads the claim's candidate jobs by name and takes a snapshot of its namespace that
    /// started after this call, concurrently.
    pub async fn read(
        client: &Client,
        claim: &ClaimFacts,
        snapshots: &Snapshots,
        metrics: &Metrics,
    ) -> Self {
        let read_at = Instant::now();
        let namespace = &claim.key.namespace;
        let jobs_api: Api<OwnerObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::job_resource());
        let names = linking::job_candidates(claim);
        let jobs =
            futures::future::join_all(names.iter().map(|name| get(&jobs_api, name, metrics)));
        let (jobs, namespace) = tokio::join!(jobs, snapshots.of(client, namespace, metrics));
        let jobs = names
            .into_iter()
            .zip(jobs)
            .map(|(name, found)| (name, found.map(|job| resources::job_entry(&job))))
            .collect();
        LiveView {
            jobs,
            namespace,
            read_at,
        }
    }

    /// When the first of its reads was sent: what it says is no older than this.
    pub fn read_at(&self) -> Instant {
        self.read_at
    }
}

/// One namespace as listed live: its PipelineRuns, TaskRuns and the pods that have not
/// finished and mount a claim.
#[derive(Debug)]
struct Snapshot {
    runs: Found<Vec<RunEntry>>,
    task_runs: Found<Vec<RunEntry>>,
    pods: Found<Vec<PodEntry>>,
}

impl Snapshot {
    async fn list(client: &Client, namespace: &str, metrics: &Metrics) -> Self {
        let owners = |resource: ApiResource| -> Api<OwnerObject> {
            Api::namespaced_with(client.clone(), namespace, &resource)
        };
        let (runs_api, task_runs_api) = (
            owners(resources::run_resource()),
            owners(resources::task_run_resource()),
        );
        // Finished pods never hold a claim (`PodUse::is_active`): let the server leave them out.
        let active = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods_api: Api<PodVolumes> = Api::namespaced(client.clone(), namespace);
        let (runs, task_runs, pods) = tokio::join!(
            list(
                "PipelineRuns",
                &runs_api,
                ListParams::default(),
                metrics,
                |run| Some(resources::run_entry(run))
            ),
            list(
                "TaskRuns",
                &task_runs_api,
                ListParams::default(),
                metrics,
                |run| Some(resources::task_run_entry(run))
            ),
            list("pods", &pods_api, active, metrics, |pod| {
                Some(resources::pod_entry(pod)).filter(|pod| !pod.claims.is_empty())
            }),
        );
        Snapshot {
            runs: served(runs, "PipelineRuns"),
            // No TaskRun CRD: no TaskRun exists (see `watches`).
            task_runs: match task_runs {
                Found::No => Found::Yes(Vec::new()),
                found => found,
            },
            pods: served(pods, "pods"),
        }
    }

    fn runs(&self, kind: OwnerKind) -> &Found<Vec<RunEntry>> {
        match kind {
            OwnerKind::TaskRun => &self.task_runs,
            OwnerKind::Run | OwnerKind::Job => &self.runs,
        }
    }
}

/// A kind that must be served: a 404 is an error, which keeps the claim.
fn served<E>(found: Found<Vec<E>>, what: &str) -> Found<Vec<E>> {
    match found {
        Found::No => Found::Unknown(format!("the API server does not serve {what}")),
        found => found,
    }
}

/// Page size of the live LISTs: bounds what one response holds in memory.
const PAGE: u32 = 500;

/// Lists every page, keeping what `keep` returns of each object. `Found::No` when the kind is
/// not served (404: its CRD is not installed).
async fn list<K, E>(
    what: &str,
    api: &Api<K>,
    params: ListParams,
    metrics: &Metrics,
    keep: impl Fn(&K) -> Option<E>,
) -> Found<Vec<E>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut entries = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page: ObjectList<K> = match api.list(&params).await {
            Ok(page) => page,
            Err(error) if resources::is_not_found(&error) => return Found::No,
            Err(error) => {
                metrics.api_error(Operation::List, &error);
                return Found::Unknown(format!("listing {what}: {error}"));
            }
        };
        entries.extend(page.items.iter().filter_map(&keep));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Found::Yes(entries),
        }
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
    async fn of(&self, client: &Client, namespace: &str, metrics: &Metrics) -> Arc<Snapshot> {
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
                let snapshot = Arc::new(Snapshot::list(client, namespace, metrics).await);
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
    let found = list(
        "ResourceQuotas",
        &api,
        ListParams::default(),
        metrics,
        |quota| Some(resources::quota_entry(quota)),
    )
    .await;
    served(found, "ResourceQuotas")
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
pub async fn claim_state(
    client: &Client,
    key: &ObjectKey,
    metrics: &Metrics,
) -> Found<(String, bool)> {
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &key.namespace);
    match api.get_metadata_opt(&key.name).await {
        Ok(Some(claim)) => {
            let meta = claim.metadata;
            Found::Yes((
                meta.uid.unwrap_or_default(),
                meta.deletion_timestamp.is_some(),
            ))
        }
        Ok(None) => Found::No,
        Err(error) => {
            metrics.api_error(Operation::Get, &error);
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

async fn get(api: &Api<OwnerObject>, name: &str, metrics: &Metrics) -> Found<OwnerObject> {
    match api.get_opt(name).await {
        Ok(Some(object)) => Found::Yes(object),
        Ok(None) => Found::No,
        Err(error) => {
            metrics.api_error(Operation::Get, &error);
            Found::Unknown(format!("reading {name}: {error}"))
        }
    }
}

impl Lookup for LiveView {
    fn job(&self, _: &str, name: &str) -> Found<JobEntry> {
        self.jobs.get(name).cloned().unwrap_or_else(|| {
            Found::Unknown(format!("NotebookValidationJob {name} was not read live"))
        })
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
    type Served = Arc<Mutex<BTreeMap<String, usize>>>;

    /// A mock API server for namespace `ml`, answering slowly (so callers pile up): pods with
    /// one pod mounting claim `a`, PipelineRuns with a run binding `b`, and 404 for TaskRuns
    /// (CRD not installed).
    fn namespace_server() -> (Client, Served) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let served = Served::default();
        let count = served.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                assert!(query.contains("limit=500"), "{query}");
                *count.lock().unwrap().entry(path.clone()).or_default() += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let (status, body) = match path.as_str() {
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
                    "/apis/tekton.dev/v1/namespaces/ml/taskruns" => (
                        404,
                        json!({
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": "the server could not find the requested resource"
                        }),
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
        (Client::new(service, "default"), served)
    }

    fn list(kind: &str, items: Value) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items})
    }

    fn claim(name: &str) -> ClaimFacts {
        ClaimFacts::example(name)
    }

    #[tokio::test]
    async fn a_burst_in_one_namespace_shares_its_snapshots() {
        let (client, served) = namespace_server();
        let snapshots = Arc::new(Snapshots::default());
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let calls = (0..20).map(|i| {
            let (client, snapshots, metrics) = (client.clone(), snapshots.clone(), metrics.clone());
            let claim = claim(if i % 2 == 0 { "a" } else { "b" });
            tokio::spawn(async move { LiveView::read(&client, &claim, &snapshots, &metrics).await })
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
        }
        for (path, lists) in served.lock().unwrap().iter() {
            assert!(
                (1..=2).contains(lists),
                "{lists} LISTs of {path} for 20 re-checks"
            );
        }
        // Nothing is held between bursts.
        let slot = snapshots.namespaces.lock().unwrap()["ml"].clone();
        assert!(slot.latest.lock().await.is_none());
    }

    #[tokio::test]
    async fn a_later_recheck_gets_a_later_snapshot() {
        let (client, served) = namespace_server();
        let snapshots = Snapshots::default();
        let metrics = Metrics::register(&mut Registry::default());
        for _ in 0..2 {
            LiveView::read(&client, &claim("a"), &snapshots, &metrics).await;
        }
        assert_eq!(served.lock().unwrap()["/api/v1/namespaces/ml/pods"], 2);
    }
}
