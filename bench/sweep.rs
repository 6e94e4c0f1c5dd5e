//! Baseline (a): a periodic sweep janitor, in its best honest form. Every interval it lists
//! every build-workspace claim, PipelineRun, TaskRun, NotebookValidationJob and pod (pages of
//! 500, as kubectl does; the five kinds concurrently, each decoded into only the fields read,
//! as workspace-gc decodes them), decides each claim with workspace-gc's own
//! policy and linking (so both contenders delete exactly the same claims), and deletes the due
//! ones with `{uid, resourceVersion}` preconditions, 16 at a time. It needs no live re-check:
//! what it decides from was listed moments ago. It runs as its own process (this benchmark's
//! binary, `sweep-janitor` subcommand) with its own user, so its memory, CPU and requests are
//! its alone. With `--namespace` it lists that namespace only (the quota benchmark gives each
//! contender a namespace of its own).

use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Preconditions, PropagationPolicy};
use serde::de::DeserializeOwned;
use workspace_gc::cluster::cache::{Change, Index, TaskRunEntry, Update};
use workspace_gc::cluster::resources;
use workspace_gc::cluster::resources::{ClaimObject, OwnerObject, PodVolumes};
use workspace_gc::decide::facts::ClaimFacts;
use workspace_gc::decide::linking;
use workspace_gc::decide::policy::{self, Policy};

pub const SUBCOMMAND: &str = "sweep-janitor";
const PAGE: u32 = 500;
const DELETE_CONCURRENCY: usize = 16;
const SELECTOR: &str = "mlops.redhat.com/build-workspace=true";

pub fn main(args: &[String]) -> Result<()> {
    let mut interval = 30.0;
    let mut ttl = 30.0;
    let mut namespace = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut text = || it.next().ok_or_else(|| anyhow!("{arg} needs a value"));
        let mut value = || -> Result<f64> { text()?.parse().map_err(|e| anyhow!("{arg}: {e}")) };
        match arg.as_str() {
            "--interval" => interval = value()?,
            "--ttl" => ttl = value()?,
            "--namespace" => namespace = Some(text()?.clone()),
            other => return Err(anyhow!("sweep-janitor: unknown argument {other}")),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(
            Duration::from_secs_f64(interval),
            chrono::Duration::milliseconds((ttl * 1000.0) as i64),
            namespace,
        ))
}

async fn run(interval: Duration, ttl: chrono::Duration, namespace: Option<String>) -> Result<()> {
    let client = Client::try_default().await?;
    let policy = Policy {
        ttl_after_finished: ttl,
        ttl_after_failed: ttl,
        ..Policy::default()
    };
    let mut sweep = 0u64;
    loop {
        let started = Instant::now();
        sweep += 1;
        match sweep_once(&client, &policy, namespace.as_deref()).await {
            Ok(stats) => println!(
                "{}",
                serde_json::json!({
                    "sweep": sweep,
                    "at": Utc::now().to_rfc3339(),
                    "list_s": stats.list_s,
                    "claims": stats.claims,
                    "objects": stats.objects,
                    "due": stats.due,
                    "deleted": stats.deleted,
                    "conflicts": stats.conflicts,
                    "duration_s": started.elapsed().as_secs_f64(),
                })
            ),
            Err(error) => eprintln!("sweep {sweep} failed: {error}"),
        }
        tokio::time::sleep_until((started + interval).into()).await;
    }
}

struct Stats {
    list_s: f64,
    claims: usize,
    /// Claims, jobs, runs and pods listed.
    objects: usize,
    due: usize,
    deleted: usize,
    conflicts: usize,
}

async fn sweep_once(client: &Client, policy: &Policy, namespace: Option<&str>) -> Result<Stats> {
    let started = Instant::now();
    let client = client.clone();
    let scoped = |resource: &kube::discovery::ApiResource| match namespace {
        Some(ns) => Api::<OwnerObject>::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let (claims_api, pods_api): (Api<ClaimObject>, Api<PodVolumes>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let jobs_api = scoped(&resources::job_resource());
    let runs_api = scoped(&resources::run_resource());
    let task_runs_api = scoped(&resources::task_run_resource());
    let (claims, jobs, runs, task_runs, pods) = tokio::try_join!(
        list(
            &claims_api,
            ListParams::default().labels(SELECTOR),
            resources::claim_facts
        ),
        list(&jobs_api, ListParams::default(), resources::job_entry),
        list(&runs_api, ListParams::default(), resources::run_entry),
        list(&task_runs_api, ListParams::default(), |run| {
            TaskRunEntry(resources::task_run_entry(run))
        }),
        list(&pods_api, ListParams::default(), resources::pod_entry),
    )?;
    let list_s = started.elapsed().as_secs_f64();
    let objects = claims.len() + jobs.len() + runs.len() + task_runs.len() + pods.len();

    let mut index = Index::default();
    macro_rules! load {
        ($variant:path, $entries:expr) => {
            index.update($variant(Change::Init(None)));
            for entry in $entries {
                index.update($variant(Change::InitApply(None, entry)));
            }
            index.update($variant(Change::InitDone(None)));
        };
    }
    load!(Update::Claim, claims);
    load!(Update::Job, jobs);
    load!(Update::Run, runs);
    load!(Update::TaskRun, task_runs);
    load!(Update::Pod, pods);

    let now = Utc::now();
    let due: Vec<ClaimFacts> = index
        .claims()
        .filter(|claim| {
            let facts = linking::facts(claim, &index);
            policy::decide(&facts, policy, now).verdict.is_delete()
        })
        .cloned()
        .collect();
    let claims = index.claims().count();
    drop(index);

    let results: Vec<Result<(), kube::Error>> = futures::stream::iter(due.iter().map(|claim| {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &claim.key.namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: Some(claim.uid.clone()),
                resource_version: Some(claim.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        async move { api.delete(&claim.key.name, &params).await.map(|_| ()) }
    }))
    .buffer_unordered(DELETE_CONCURRENCY)
    .collect()
    .await;
    let deleted = results.iter().filter(|r| r.is_ok()).count();
    let conflicts = results
        .iter()
        .filter(|r| matches!(r, Err(kube::Error::Api(s)) if s.is_conflict()))
        .count();
    Ok(Stats {
        list_s,
        claims,
        objects,
        due: due.len(),
        deleted,
        conflicts,
    })
}

/// Lists every object of one kind in pages, converting each page as it arrives, so the full
/// objects of only one page are held at a time.
async fn list<K, E>(api: &Api<K>, params: ListParams, convert: fn(&K) -> E) -> Result<Vec<E>>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut page_params = params.clone().limit(PAGE);
        if let Some(token) = &token {
            page_params = page_params.continue_token(token);
        }
        let page = api.list(&page_params).await?;
        out.extend(page.items.iter().map(convert));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}
