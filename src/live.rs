//! Fresh reads of what a delete verdict rests on, just before the delete: the caches may be
//! stale. Read-only; what cannot be read comes back unknown, which keeps the claim.
//!
//! The owners are read by name (a GET each, usually the job and its run). No selector finds
//! the pods that mount a claim, so the namespace's pods are listed — the pod cache cannot vouch
//! for itself: a watch can go silent without an error. [`PodLists`] shares one LIST among the
//! re-checks that asked before it started, so a burst of deletes in a namespace costs one or
//! two LISTs, and every re-check still sees the pods as they were after it asked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use tokio::time::Instant;

use crate::facts::{ClaimFacts, ObjectKey, PodUse};
use crate::linking::{Candidates, Found, Lookup};
use crate::metrics::{Metrics, Operation};
use crate::resources::{self, JobEntry, PodEntry, PodVolumes, RunEntry};

/// What the API server said, for one claim, moments ago.
#[derive(Debug)]
pub struct LiveView {
    jobs: HashMap<String, Found<JobEntry>>,
    runs: HashMap<String, Found<RunEntry>>,
    /// The pods that mount the claim.
    pods: Found<Vec<PodUse>>,
}

impl LiveView {
    /// Reads the candidate owners by name and the pods of the claim's namespace.
    pub async fn read(
        client: &Client,
        claim: &ClaimFacts,
        candidates: &Candidates,
        pod_lists: &PodLists,
        metrics: &Metrics,
    ) -> Self {
        let namespace = &claim.key.namespace;
        let jobs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::job_resource());
        let runs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::run_resource());
        let pods = pod_lists.pods_using(client, &claim.key, metrics).await;
        let mut view = LiveView {
            jobs: HashMap::new(),
            runs: HashMap::new(),
            pods,
        };
        for name in &candidates.jobs {
            let found = get(&jobs_api, name, metrics).await;
            view.jobs
                .insert(name.clone(), map(found, |o| resources::job_entry(&o)));
        }
        for name in &candidates.runs {
            let found = get(&runs_api, name, metrics).await;
            view.runs
                .insert(name.clone(), map(found, |o| resources::run_entry(&o)));
        }
        view
    }
}

/// Pod lists per namespace, each shared by the re-checks that asked before it started.
#[derive(Debug)]
pub struct PodLists {
    namespaces: Mutex<HashMap<String, Arc<Slot>>>,
    /// A LIST response is held whole while it is decoded: bound how many are in memory.
    in_flight: tokio::sync::Semaphore,
}

/// Namespace pod LISTs in flight at once.
const CONCURRENT_LISTS: usize = 2;

impl Default for PodLists {
    fn default() -> Self {
        Self {
            namespaces: Mutex::default(),
            in_flight: tokio::sync::Semaphore::new(CONCURRENT_LISTS),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// Re-checks that asked and have not yet taken their answer.
    waiting: AtomicUsize,
    /// The latest list and when it started; dropped once no re-check waits, so a namespace's
    /// pods are not held in memory between bursts.
    latest: tokio::sync::Mutex<Option<Listed>>,
}

/// A namespace's pods (those that mount a claim), and when the LIST started.
type Listed = (Instant, Arc<Found<Vec<PodEntry>>>);

impl PodLists {
    /// The pods that mount `claim`, from a LIST that started after this call.
    pub async fn pods_using(
        &self,
        client: &Client,
        claim: &ObjectKey,
        metrics: &Metrics,
    ) -> Found<Vec<PodUse>> {
        let asked = Instant::now();
        let slot = {
            let mut namespaces = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
            namespaces
                .entry(claim.namespace.clone())
                .or_default()
                .clone()
        };
        slot.waiting.fetch_add(1, Ordering::SeqCst);
        let pods = {
            let mut latest = slot.latest.lock().await;
            let pods = match &*latest {
                Some((started, pods)) if *started >= asked => pods.clone(),
                _ => {
                    // Never closed, so acquiring only waits.
                    let _permit = self.in_flight.acquire().await;
                    let started = Instant::now();
                    let api: Api<PodVolumes> = Api::namespaced(client.clone(), &claim.namespace);
                    let pods = Arc::new(list_pods(&api, metrics).await);
                    *latest = Some((started, pods.clone()));
                    pods
                }
            };
            if slot.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
                *latest = None;
            }
            pods
        };
        match &*pods {
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

async fn list_pods(api: &Api<PodVolumes>, metrics: &Metrics) -> Found<Vec<PodEntry>> {
    // Finished pods never hold a claim (`PodUse::is_active`): let the server leave them out.
    let active = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    match api.list(&active).await {
        Ok(list) => Found::Yes(
            list.items
                .iter()
                .map(resources::pod_entry)
                .filter(|pod| !pod.claims.is_empty())
                .collect(),
        ),
        Err(error) => {
            metrics.api_error(Operation::List, &error);
            Found::Unknown(format!("listing pods: {error}"))
        }
    }
}

async fn get(api: &Api<DynamicObject>, name: &str, metrics: &Metrics) -> Found<DynamicObject> {
    match api.get_opt(name).await {
        Ok(Some(object)) => Found::Yes(object),
        Ok(None) => Found::No,
        Err(error) => {
            metrics.api_error(Operation::Get, &error);
            Found::Unknown(format!("reading {name}: {error}"))
        }
    }
}

fn map<T, U>(found: Found<T>, f: impl FnOnce(T) -> U) -> Found<U> {
    match found {
        Found::Yes(value) => Found::Yes(f(value)),
        Found::No => Found::No,
        Found::Unknown(why) => Found::Unknown(why),
    }
}

fn not_read(what: &str, name: &str) -> String {
    format!("{what} {name} was not read live")
}

impl Lookup for LiveView {
    fn job(&self, _: &str, name: &str) -> Found<JobEntry> {
        self.jobs
            .get(name)
            .cloned()
            .unwrap_or_else(|| Found::Unknown(not_read("NotebookValidationJob", name)))
    }

    fn run(&self, _: &str, name: &str) -> Found<RunEntry> {
        self.runs
            .get(name)
            .cloned()
            .unwrap_or_else(|| Found::Unknown(not_read("PipelineRun", name)))
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        let binding = self.runs.values().filter_map(|found| match found {
            Found::Yes(run) if run.claims.contains(&claim.name) => Some(Ok(run.clone())),
            Found::Unknown(why) => Some(Err(why.clone())),
            _ => None,
        });
        match binding.collect::<Result<Vec<_>, _>>() {
            Ok(runs) => Found::Yes(runs),
            Err(why) => Found::Unknown(why),
        }
    }

    fn pods_using(&self, _: &ObjectKey) -> Found<Vec<PodUse>> {
        self.pods.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use prometheus_client::registry::Registry;
    use serde_json::json;
    use std::sync::atomic::AtomicUsize;

    /// A mock API server answering pod LISTs (slowly, so callers pile up) with one pod
    /// mounting claim `a`; returns the client and the number of LISTs served.
    fn pods_server() -> (Client, Arc<AtomicUsize>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                assert_eq!(request.uri().path(), "/api/v1/namespaces/ml/pods");
                let query = request.uri().query().unwrap_or_default();
                assert!(
                    query.contains(
                        "fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed"
                    ),
                    "{query}"
                );
                count.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
                    {"metadata": {"name": "p", "namespace": "ml"},
                     "spec": {"containers": [], "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "a"}}]},
                     "status": {"phase": "Running"}}
                ]});
                reply.send_response(
                    Response::builder()
                        .body(Body::from(serde_json::to_vec(&list).unwrap()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), served)
    }

    #[tokio::test]
    async fn a_burst_in_one_namespace_shares_its_lists() {
        let (client, served) = pods_server();
        let lists = Arc::new(PodLists::default());
        let metrics = Arc::new(Metrics::register(&mut Registry::default()));
        let calls = (0..20).map(|i| {
            let (client, lists, metrics) = (client.clone(), lists.clone(), metrics.clone());
            let claim = ObjectKey::new("ml", if i % 2 == 0 { "a" } else { "b" });
            tokio::spawn(async move { lists.pods_using(&client, &claim, &metrics).await })
        });
        let results = futures::future::join_all(calls).await;
        for (i, result) in results.into_iter().enumerate() {
            let pods = match result.unwrap() {
                Found::Yes(pods) => pods,
                other => panic!("{other:?}"),
            };
            assert_eq!(pods.len(), usize::from(i % 2 == 0), "call {i}");
        }
        let served = served.load(Ordering::SeqCst);
        assert!((1..=2).contains(&served), "{served} LISTs for 20 re-checks");
        // Nothing is held between bursts.
        let slot = lists.namespaces.lock().unwrap()["ml"].clone();
        assert!(slot.latest.lock().await.is_none());
    }

    #[tokio::test]
    async fn a_later_recheck_gets_a_later_list() {
        let (client, served) = pods_server();
        let lists = PodLists::default();
        let metrics = Metrics::register(&mut Registry::default());
        let claim = ObjectKey::new("ml", "a");
        lists.pods_using(&client, &claim, &metrics).await;
        lists.pods_using(&client, &claim, &metrics).await;
        assert_eq!(served.load(Ordering::SeqCst), 2);
    }
}
