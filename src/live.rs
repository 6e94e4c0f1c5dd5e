//! Fresh reads of what a delete verdict rests on, just before the delete: the caches may be
//! stale. Read-only; what cannot be read comes back unknown, which keeps the claim.
//!
//! The owners are read by name (a GET each, usually the job and its run). The pods come from
//! the pod watch while it is delivering — its events are as fresh as a read, and a pod on a
//! node also holds the claim through Kubernetes' `pvc-protection` finalizer — and from a LIST
//! of the namespace's pods only while that watch is interrupted.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};

use crate::facts::{ClaimFacts, ObjectKey, PodUse};
use crate::linking::{Candidates, Found, Lookup};
use crate::metrics::{Metrics, Operation};
use crate::resources::{self, JobEntry, RunEntry};

/// What the API server said, for one claim, moments ago.
#[derive(Debug)]
pub struct LiveView {
    jobs: HashMap<String, Found<JobEntry>>,
    runs: HashMap<String, Found<RunEntry>>,
    /// The pods that mount the claim.
    pods: Found<Vec<PodUse>>,
}

impl LiveView {
    /// Reads the candidate owners by name, and the pods of the claim's namespace unless the
    /// pod watch vouches for `current_pods`.
    pub async fn read(
        client: &Client,
        claim: &ClaimFacts,
        candidates: &Candidates,
        current_pods: Option<Vec<PodUse>>,
        metrics: &Metrics,
    ) -> Self {
        let namespace = &claim.key.namespace;
        let jobs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::job_resource());
        let runs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::run_resource());
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);

        let pods = match current_pods {
            Some(pods) => Found::Yes(pods),
            None => list_pods_using(&pods_api, &claim.key.name, metrics).await,
        };
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

/// No selector finds the pods that mount a claim: list the namespace's pods.
async fn list_pods_using(api: &Api<Pod>, claim: &str, metrics: &Metrics) -> Found<Vec<PodUse>> {
    match api.list(&ListParams::default()).await {
        Ok(list) => Found::Yes(
            list.items
                .iter()
                .map(resources::pod_entry)
                .filter(|pod| pod.claims.iter().any(|c| c == claim))
                .map(|pod| PodUse {
                    name: pod.key.name,
                    phase: pod.phase,
                })
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
