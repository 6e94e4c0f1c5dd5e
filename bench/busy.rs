//! A busy cluster's background load (`--busy RATE`): unrelated builds in the same namespaces,
//! none linking to a build workspace, so that every kind the daemon watches moves between the
//! benchmark's events, as in a CI cluster whose other pipelines keep running.
//!
//! Each unrelated build, started RATE a second round-robin over the namespaces, is a
//! NotebookValidationJob, a PipelineRun with an `emptyDir` workspace, two TaskRuns and their two
//! pods (no claim mounted): created and set running, finished [`LIFETIME`] later, then deleted.
//! That is 24 writes a build: per kind and build, a create, two status writes and a delete
//! (four watch events a job and a run, eight TaskRun and pod events).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::shapes::{pod_spec, succeeded_condition, timestamp};
use tokio::sync::watch;
use workspace_gc::cluster::resources::{job_resource, run_resource, task_run_resource};

/// Writes an unrelated build sends: six objects, each created, set running, finished and
/// deleted.
pub const WRITES: usize = 24;

/// How long an unrelated build runs before it finishes and is deleted.
pub const LIFETIME: Duration = Duration::from_secs(20);

/// The load while it runs.
pub struct Load {
    ticker: tokio::task::JoinHandle<()>,
    builds: Arc<tokio::sync::Mutex<tokio::task::JoinSet<()>>>,
    stopping: watch::Sender<bool>,
    started: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

/// What the load did: unrelated builds started, and writes refused.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub builds: usize,
    pub failed_writes: usize,
}

/// Starts RATE unrelated builds a second in `namespaces`.
pub fn start(client: &Client, namespaces: &[String], rate: f64) -> Load {
    let (stopping, stop_rx) = watch::channel(false);
    let builds: Arc<tokio::sync::Mutex<tokio::task::JoinSet<()>>> = Arc::default();
    let (started, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let ticker = {
        let (client, namespaces) = (client.clone(), namespaces.to_vec());
        let (builds, started, failed) = (builds.clone(), started.clone(), Arc::clone(&failed));
        tokio::spawn(async move {
            let begin = tokio::time::Instant::now();
            for i in 0usize.. {
                tokio::time::sleep_until(begin + Duration::from_secs_f64(i as f64 / rate)).await;
                let namespace = namespaces[i % namespaces.len()].clone();
                let name = format!("busy-{}-{i}", std::process::id());
                let (client, failed, stop) = (client.clone(), failed.clone(), stop_rx.clone());
                started.fetch_add(1, Ordering::Relaxed);
                builds.lock().await.spawn(async move {
                    let refused = build(&client, &namespace, &name, stop).await;
                    failed.fetch_add(refused, Ordering::Relaxed);
                });
            }
        })
    };
    Load {
        ticker,
        builds,
        stopping,
        started,
        failed,
    }
}

impl Load {
    /// Stops starting builds, deletes the running ones at once, and waits for them.
    pub async fn stop(self) -> Done {
        self.ticker.abort();
        let _ = self.ticker.await;
        self.stopping.send_replace(true);
        let mut builds = self.builds.lock().await;
        while builds.join_next().await.is_some() {}
        Done {
            builds: self.started.load(Ordering::Relaxed),
            failed_writes: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// One unrelated build's life; returns how many of its writes were refused.
async fn build(client: &Client, ns: &str, name: &str, mut stop: watch::Receiver<bool>) -> usize {
    let dynamic = |resource| Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource);
    let (job_api, run_api, task_api) = (
        dynamic(&job_resource()),
        dynamic(&run_resource()),
        dynamic(&task_run_resource()),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (pp, pa) = (PostParams::default(), PatchParams::default());
    let run = format!("{name}-run");
    let tasks = [format!("{run}-fetch"), format!("{run}-build")];
    let mut refused = 0;
    let mut check = |result: Result<(), kube::Error>| refused += usize::from(result.is_err());

    let job = DynamicObject::new(name, &job_resource()).data(json!({ "spec": {
        "notebook": {
            "git": { "url": "https://git.example.com/other.git", "ref": "main" },
            "path": "notebooks/other.ipynb",
        },
    }}));
    check(job_api.create(&pp, &job).await.map(drop));
    let pipeline = DynamicObject::new(&run, &run_resource()).data(json!({ "spec": {
        "pipelineRef": { "name": "other-pipeline" },
        "workspaces": [{ "name": "source", "emptyDir": {} }],
    }}));
    check(run_api.create(&pp, &pipeline).await.map(drop));
    for task in &tasks {
        let task_run = DynamicObject::new(task, &task_run_resource()).data(json!({ "spec": {
            "taskRef": { "name": "other-task" },
            "workspaces": [{ "name": "source", "emptyDir": {} }],
        }}));
        check(task_api.create(&pp, &task_run).await.map(drop));
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("{task}-pod")),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec(&[], None)),
            status: None,
        };
        check(pods.create(&pp, &pod).await.map(drop));
    }
    let now = chrono::Utc::now();
    let running = Patch::Merge(json!({ "status": {
        "startTime": timestamp(now),
        "conditions": [succeeded_condition("Unknown", "Running", now)],
    }}));
    let building = Patch::Merge(json!({ "status": { "phase": "Building" } }));
    let pod_running = Patch::Merge(json!({ "status": { "phase": "Running" } }));
    check(job_api.patch_status(name, &pa, &building).await.map(drop));
    check(run_api.patch_status(&run, &pa, &running).await.map(drop));
    for task in &tasks {
        check(task_api.patch_status(task, &pa, &running).await.map(drop));
        let pod = format!("{task}-pod");
        check(pods.patch_status(&pod, &pa, &pod_running).await.map(drop));
    }
    // Stopping cuts the build short: it finishes and goes at once.
    let _ = tokio::time::timeout(LIFETIME, stop.wait_for(|stopping| *stopping)).await;
    let now = chrono::Utc::now();
    let finished = Patch::Merge(json!({ "status": {
        "completionTime": timestamp(now),
        "conditions": [succeeded_condition("True", "Succeeded", now)],
    }}));
    let job_done = Patch::Merge(json!({ "status": {
        "phase": "Succeeded", "completionTime": timestamp(now),
    }}));
    let pod_done = Patch::Merge(json!({ "status": { "phase": "Succeeded" } }));
    check(job_api.patch_status(name, &pa, &job_done).await.map(drop));
    check(run_api.patch_status(&run, &pa, &finished).await.map(drop));
    for task in &tasks {
        check(task_api.patch_status(task, &pa, &finished).await.map(drop));
        let pod = format!("{task}-pod");
        check(pods.patch_status(&pod, &pa, &pod_done).await.map(drop));
    }
    let dp = DeleteParams::default();
    check(job_api.delete(name, &dp).await.map(drop));
    check(run_api.delete(&run, &dp).await.map(drop));
    for task in &tasks {
        check(task_api.delete(task, &dp).await.map(drop));
        check(pods.delete(&format!("{task}-pod"), &dp).await.map(drop));
    }
    refused
}
