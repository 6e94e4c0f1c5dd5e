//! The objects: N builds, each a NotebookValidationJob `{job}`, a PipelineRun `{job}-build`
//! binding claim `{job}-build-workspace`, and two pods mounting the claim (one in a lean plan),
//! shaped as the operator and Tekton create them (see testkit/src/objects.rs); and the
//! deadline events the benchmark fires at known instants.
//!
//! States, chosen so that nothing is due when a contender starts (a TTL of seconds reclaims a
//! finished build within seconds, so in a collected cluster the claims that remain are those of
//! builds still in progress):
//! - `Running`: job `Building`, run `Succeeded=Unknown`, a TaskRun pod and Tekton's
//!   affinity-assistant pod `Running`, both mounting the claim (in use);
//! - `Validating`: the build finished at a varied time in the past (run `Succeeded`, `Failed` or
//!   `PipelineRunTimeout`, two TaskRun pods `Succeeded`), the job is `ValidationRunning`;
//!   finishing the job at a known instant starts the TTL (the TTL events);
//! - `Owned`: as `Validating`, but the claim carries an owner reference to its job (as
//!   `workspace-gc create` makes it); deleting the job is the owner-deleted event;
//! - `Kept`: job and run finished hours ago, the claim annotated `keep=true`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use workspace_gc::cluster::resources::{job_resource, run_resource};

use crate::results::EventKind;
use testkit::shapes::{
    OPERATOR_CLAIM_LABELS, claim_spec, pod_spec, succeeded_condition, timestamp,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Running,
    Validating,
    Owned,
    Kept,
}

#[derive(Debug, Clone)]
pub struct Build {
    pub namespace: String,
    pub job: String,
    pub state: State,
    /// When the PipelineRun finished (all states but `Running`).
    pub finished: Option<DateTime<Utc>>,
    /// 0 Succeeded, 1 Failed, 2 PipelineRunTimeout.
    pub outcome: u8,
}

impl Build {
    pub fn claim_key(&self) -> String {
        format!("{}/{}-build-workspace", self.namespace, self.job)
    }
}

/// The builds, by state, in the order their events are fired.
pub struct Plan {
    pub builds: Vec<Build>,
    pub namespaces: Vec<String>,
    /// One pod per build (the build's TaskRun pod) instead of two, so that the largest sizes
    /// can be created on a small machine.
    pub lean: bool,
}

/// Deterministic, dependency-free pseudo-random numbers (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

impl Plan {
    /// `owned` builds have owner references (one set per contender that gets owner-deleted
    /// events), `validating` at least as many as the TTL events need.
    pub fn new(
        n: usize,
        namespaces: usize,
        owned: usize,
        validating_min: usize,
        lean: bool,
    ) -> Result<Self> {
        let running = n / 5;
        let kept = n / 20;
        let validating = n.saturating_sub(running + kept + owned);
        if validating < validating_min {
            return Err(anyhow!(
                "{n} builds leave {validating} validating builds; the TTL events need \
                 {validating_min}: lower --events"
            ));
        }
        let mut states: Vec<State> = std::iter::repeat_n(State::Running, running)
            .chain(std::iter::repeat_n(State::Kept, kept))
            .chain(std::iter::repeat_n(State::Owned, owned))
            .chain(std::iter::repeat_n(State::Validating, validating))
            .collect();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ n as u64);
        // Fisher–Yates, so every state is spread over every namespace.
        for i in (1..states.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            states.swap(i, j);
        }
        let now = Utc::now();
        let namespaces: Vec<String> = (0..namespaces).map(|i| format!("team-{i:02}")).collect();
        let builds = states
            .into_iter()
            .enumerate()
            .map(|(i, state)| {
                // Finished between 5 minutes and 6 hours ago.
                let ago = 300 + rng.below(6 * 3600 - 300) as i64;
                let roll = rng.below(100);
                Build {
                    namespace: namespaces[i % namespaces.len()].clone(),
                    job: format!("nb-{i:05}"),
                    state,
                    finished: (state != State::Running)
                        .then(|| now - chrono::Duration::seconds(ago)),
                    outcome: match roll {
                        0..85 => 0,
                        85..95 => 1,
                        _ => 2,
                    },
                }
            })
            .collect();
        Ok(Self {
            builds,
            namespaces,
            lean,
        })
    }

    pub fn pods_per_build(&self) -> usize {
        if self.lean { 1 } else { 2 }
    }

    pub fn count(&self, state: State) -> usize {
        self.builds.iter().filter(|b| b.state == state).count()
    }

    /// Takes the next `count` builds in `state` not yet given out.
    pub fn take(&self, state: State, used: &mut usize, count: usize) -> Vec<Build> {
        let picked: Vec<Build> = self
            .builds
            .iter()
            .filter(|b| b.state == state)
            .skip(*used)
            .take(count)
            .cloned()
            .collect();
        *used += picked.len();
        picked
    }
}

/// Retries a request a few times on errors a loaded 2-core API server may return.
async fn retry<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(value) => return Ok(value),
            Err(kube::Error::Api(status)) if status.is_already_exists() && attempt > 0 => {
                // A retried create whose first attempt did land.
                return Err(anyhow!("{what}: already exists after a retry"));
            }
            Err(error) if attempt < 5 => {
                attempt += 1;
                let transient = match &error {
                    kube::Error::Api(s) => s.code == 429 || s.code >= 500,
                    _ => true,
                };
                if !transient {
                    return Err(anyhow!("{what}: {error}"));
                }
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(error) => return Err(anyhow!("{what}: {error}")),
        }
    }
}

/// How long creation took and how many requests it sent.
pub struct Created {
    pub elapsed: Duration,
    pub requests: usize,
    pub objects: usize,
}

pub async fn create(client: &Client, plan: &Plan, concurrency: usize) -> Result<Created> {
    let started = Instant::now();
    for namespace in &plan.namespaces {
        crate::cluster::create_namespace(client, namespace).await?;
        // ServiceAccount admission rejects pods whose account does not exist yet.
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
        match accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: ObjectMeta {
                        name: Some("default".into()),
                        ..ObjectMeta::default()
                    },
                    ..ServiceAccount::default()
                },
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let requests = Arc::new(AtomicUsize::new(2 * plan.namespaces.len()));
    let done = Arc::new(AtomicUsize::new(0));
    let total = plan.builds.len();
    futures::stream::iter(plan.builds.iter().map(|build| {
        let requests = requests.clone();
        let done = done.clone();
        async move {
            let sent = create_build(client, build, plan.pods_per_build()).await?;
            requests.fetch_add(sent, Ordering::Relaxed);
            let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
            if finished.is_multiple_of(1000) || finished == total {
                eprintln!(
                    "bench:   created {finished}/{total} builds in {:.0} s",
                    started.elapsed().as_secs_f64()
                );
            }
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .try_for_each(|()| futures::future::ready(Ok(())))
    .await?;
    Ok(Created {
        elapsed: started.elapsed(),
        requests: requests.load(Ordering::Relaxed),
        objects: plan.builds.len() * (3 + plan.pods_per_build()) + 2 * plan.namespaces.len(),
    })
}

/// Creates one build's objects with `pods` pods (1 or 2); returns the number of requests sent.
async fn create_build(client: &Client, build: &Build, pod_count: usize) -> Result<usize> {
    let ns = build.namespace.as_str();
    let job = build.job.as_str();
    let run_name = format!("{job}-build");
    let claim_name = format!("{job}-build-workspace");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &job_resource());
    let runs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &run_resource());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let pa = PatchParams::default();
    let outcome = match build.outcome {
        0 => ("True", "Succeeded"),
        1 => ("False", "Failed"),
        _ => ("False", "PipelineRunTimeout"),
    };
    // Builds that are still validating completed their build step successfully.
    let outcome = match build.state {
        State::Validating | State::Owned => ("True", "Succeeded"),
        _ => outcome,
    };

    // The NotebookValidationJob.
    let object = DynamicObject::new(job, &job_resource()).data(json!({ "spec": {
        "notebook": {
            "git": { "url": "https://git.example.com/notebooks.git", "ref": "main" },
            "path": format!("notebooks/{job}.ipynb"),
        },
    }}));
    let created = retry("create job", || jobs.create(&pp, &object)).await?;
    let job_uid = created.metadata.uid.clone().unwrap_or_default();
    let status = match (build.state, build.finished) {
        (State::Running, _) | (_, None) => json!({
            "phase": "Building",
            "buildStatus": { "phase": "Running", "buildName": run_name, "strategy": "tekton" },
        }),
        (State::Validating | State::Owned, Some(at)) => json!({
            "phase": "ValidationRunning",
            "buildStatus": { "phase": "Complete", "buildName": run_name, "strategy": "tekton",
                             "completionTime": timestamp(at) },
        }),
        (State::Kept, Some(at)) => {
            let succeeded = outcome.0 == "True";
            let done = if succeeded {
                at + chrono::Duration::minutes(2)
            } else {
                at
            };
            json!({
                "phase": if succeeded { "Succeeded" } else { "Failed" },
                "completionTime": timestamp(done),
                "buildStatus": { "phase": if succeeded { "Complete" } else { "Failed" },
                                 "buildName": run_name, "strategy": "tekton",
                                 "completionTime": timestamp(at) },
            })
        }
    };
    let patch = Patch::Merge(json!({ "status": status }));
    retry("job status", || jobs.patch_status(job, &pa, &patch)).await?;

    // The PipelineRun.
    let mut run = DynamicObject::new(&run_name, &run_resource()).data(json!({ "spec": {
        "pipelineRef": { "name": format!("{job}-pipeline") },
        "taskRunTemplate": { "serviceAccountName": "pipeline" },
        "workspaces": [{
            "name": "shared-workspace",
            "persistentVolumeClaim": { "claimName": claim_name },
        }],
    }}));
    run.metadata.labels = Some(BTreeMap::from([
        ("app".to_owned(), job.to_owned()),
        (
            "mlops.redhat.com/notebook-validation".to_owned(),
            "true".to_owned(),
        ),
    ]));
    retry("create run", || runs.create(&pp, &run)).await?;
    let status = match build.finished {
        None => {
            let now = Utc::now();
            json!({
                "startTime": timestamp(now - chrono::Duration::minutes(1)),
                "conditions": [succeeded_condition("Unknown", "Running", now)],
            })
        }
        Some(at) => json!({
            "startTime": timestamp(at - chrono::Duration::minutes(5)),
            "completionTime": timestamp(at),
            "conditions": [succeeded_condition(outcome.0, outcome.1, at)],
        }),
    };
    let patch = Patch::Merge(json!({ "status": status }));
    retry("run status", || runs.patch_status(&run_name, &pa, &patch)).await?;

    // The claim, as the operator makes it (plus an owner reference or keep annotation).
    let labels = OPERATOR_CLAIM_LABELS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name.clone()),
            labels: Some(labels),
            annotations: (build.state == State::Kept).then(|| {
                BTreeMap::from([("workspace-gc.mlops.dev/keep".to_owned(), "true".to_owned())])
            }),
            owner_references: (build.state == State::Owned).then(|| {
                vec![OwnerReference {
                    api_version: "mlops.mlops.dev/v1alpha1".into(),
                    kind: "NotebookValidationJob".into(),
                    name: job.to_owned(),
                    uid: job_uid.clone(),
                    controller: None,
                    block_owner_deletion: None,
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(claim_spec(None)),
        status: None,
    };
    retry("create claim", || claims.create(&pp, &claim)).await?;

    // Pods mounting the claim: a running build has its TaskRun pod and Tekton's
    // affinity-assistant pod; a finished one its two TaskRun pods, Succeeded. A lean build has
    // only its build pod.
    let (names, phase) = if build.state == State::Running {
        (
            [
                (format!("{run_name}-build-pod"), "build"),
                (format!("affinity-assistant-{job}-0"), "affinity-assistant"),
            ],
            "Running",
        )
    } else {
        (
            [
                (format!("{run_name}-build-pod"), "build"),
                (format!("{run_name}-fetch-pod"), "fetch"),
            ],
            "Succeeded",
        )
    };
    for (pod_name, task) in names.into_iter().take(pod_count) {
        let pod = pod(&pod_name, &run_name, task, &claim_name);
        retry("create pod", || pods.create(&pp, &pod)).await?;
        let patch = Patch::Merge(json!({ "status": { "phase": phase } }));
        retry("pod status", || pods.patch_status(&pod_name, &pa, &patch)).await?;
    }
    Ok(5 + 2 * pod_count)
}

fn pod(name: &str, run: &str, task: &str, claim: &str) -> Pod {
    let mut labels = BTreeMap::from([
        ("tekton.dev/pipelineRun".to_owned(), run.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "tekton-pipelines".to_owned(),
        ),
    ]);
    if task == "affinity-assistant" {
        labels.insert(
            "app.kubernetes.io/component".into(),
            "affinity-assistant".into(),
        );
    } else {
        labels.insert("tekton.dev/pipelineTask".into(), task.to_owned());
        labels.insert("tekton.dev/taskRun".into(), format!("{run}-{task}"));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec(&[claim.to_owned()], None)),
        status: None,
    }
}

// --- deadline events ---------------------------------------------------------------------------

/// A claim the benchmark made due, and when.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Target {
    pub claim: String,
    pub kind: EventKind,
    pub deadline: DateTime<Utc>,
}

/// Fires `events` one after the other at `rate` per second (each request on its own task, so
/// a slow answer does not delay the next), and returns each claim's deadline.
pub async fn fire(
    client: &Client,
    events: Vec<(Build, EventKind)>,
    rate: f64,
    ttl: Duration,
) -> Result<Vec<Target>> {
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (build, kind)) in events.into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let jobs: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &build.namespace, &job_resource());
        tasks.spawn(async move {
            let deadline = match kind {
                EventKind::OwnerDeleted => {
                    jobs.delete(&build.job, &DeleteParams::default())
                        .await
                        .map_err(|e| anyhow!("delete job {}: {e}", build.job))?;
                    Utc::now()
                }
                EventKind::TtlPassed => {
                    let now = Utc::now();
                    let at = DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
                    let patch = Patch::Merge(json!({ "status": {
                        "phase": "Succeeded",
                        "completionTime": timestamp(at),
                    }}));
                    jobs.patch_status(&build.job, &PatchParams::default(), &patch)
                        .await
                        .map_err(|e| anyhow!("finish job {}: {e}", build.job))?;
                    at + chrono::Duration::from_std(ttl)?
                }
            };
            Ok::<_, anyhow::Error>(Target {
                claim: build.claim_key(),
                kind,
                deadline,
            })
        });
    }
    let mut targets = Vec::new();
    while let Some(result) = tasks.join_next().await {
        targets.push(result??);
    }
    Ok(targets)
}
