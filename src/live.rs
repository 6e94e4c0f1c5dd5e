//! Fresh reads of what a delete verdict rests on, just before the delete: the caches may be
//! stale. Read-only; what cannot be read comes back unknown, which keeps the claim.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};

use crate::facts::{ClaimFacts, ObjectKey, PodUse};
use crate::linking::{Candidates, Found, Lookup};
use crate::metrics::{Metrics, Operation};
use crate::resources::{self, JobEntry, PodEntry, RunEntry};

/// What the API server said, for one claim, moments ago.
#[derive(Debug, Default)]
pub struct LiveView {
    jobs: HashMap<String, Found<JobEntry>>,
    runs: HashMap<String, Found<RunEntry>>,
    pods: Option<Found<Vec<PodEntry>>>,
}

impl LiveView {
    /// Reads the candidate owners by name and the pods of the claim's namespace.
    pub async fn read(
        client: &Client,
        claim: &ClaimFacts,
        candidates: &Candidates,
        metrics: &Metrics,
    ) -> Self {
        let namespace = &claim.key.namespace;
        let jobs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::job_resource());
        let runs_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resources::run_resource());
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);

        let mut view = LiveView::default();
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
        // No selector can find the pods that mount a claim: list the namespace's pods.
        let pods = match pods_api.list(&ListParams::default()).await {
            Ok(list) => Found::Yes(list.items.iter().map(resources::pod_entry).collect()),
            Err(error) => {
                metrics.api_error(Operation::List, &error);
                Found::Unknown(format!("listing pods: {error}"))
            }
        };
        view.pods = Some(pods);
        view
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

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        match &self.pods {
            Some(Found::Yes(pods)) => Found::Yes(
                pods.iter()
                    .filter(|pod| pod.claims.contains(&claim.name))
                    .map(|pod| PodUse {
                        name: pod.key.name.clone(),
                        phase: pod.phase.clone(),
                    })
                    .collect(),
            ),
            Some(Found::Unknown(why)) => Found::Unknown(why.clone()),
            Some(Found::No) | None => Found::Unknown(not_read("pods of", &claim.namespace)),
        }
    }
}
