//! Real builds on the node (`scripts/control-plane up --node --tekton`): the operator's claim
//! and PipelineRun go in, the real Tekton controller makes the TaskRun and its pod, the real
//! scheduler binds the claim to a static local volume and places the pod, the real kubelet runs
//! Tekton's init containers (its entrypoint image, built from the pinned release) and a busybox
//! step that writes through the mounted claim; nothing plays the kubelet. workspace-gc keeps the
//! claim while the step runs and deletes it once Tekton has marked the run Succeeded and the TTL
//! has passed. Tekton's finished pod holds the deleted claim Terminating (pvc-protection counts
//! every scheduled pod naming it) until the run is pruned; then the claim goes and its volume is
//! Released.
//!
//! The node lane's (`CONTROL_PLANE_NODE=1`, root): skipped otherwise, saying so. One node per
//! host: each test takes its turn ([`node_turn`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, Fate, TestNamespace, assert_nothing_left, claim_exists,
    container_pid, create_with_spec, fate, kubectl, metric, node_turn, pipeline_resource,
    pipeline_run_resource, run_condition, task_run_resource, wait_until,
};

/// The operator's names for job `nb`: claim, PipelineRun, Pipeline; Tekton's for the TaskRun of
/// task `build` and its pod.
const CLAIM: &str = "nb-build-workspace";
const RUN: &str = "nb-build";
const PIPELINE: &str = "nb-pipeline";
const TASK_RUN: &str = "nb-build-build";
const POD: &str = "nb-build-build-pod";
/// What `up --node` builds from Debian's busybox-static.
const BUSYBOX: &str = "localhost/busybox:workspace-gc";
/// Up to a scheduled, bound, started pod on a loaded 2-core machine.
const START: Duration = Duration::from_secs(120);
const TEKTON: Duration = Duration::from_secs(60);

/// What to read when the build did not go as expected: pods, runs, claims, volumes, events.
fn describe(control_plane: &ControlPlane, ns: &TestNamespace) -> String {
    let mut text = kubectl(control_plane, &["get", "pods,pvc,pv", "-A", "-o", "wide"]);
    text += &kubectl(
        control_plane,
        &[
            "get",
            "pipelineruns,taskruns",
            "-n",
            ns.name(),
            "-o",
            "yaml",
        ],
    );
    text += &kubectl(control_plane, &["get", "events", "-n", ns.name()]);
    text
}

/// The host directory of the local volume bound to the claim.
async fn volume_path(ns: &TestNamespace, client: kube::Client) -> (String, PathBuf) {
    let volume = (ns.api::<PersistentVolumeClaim>().get(CLAIM).await)
        .expect("get the claim")
        .spec
        .and_then(|s| s.volume_name)
        .expect("the claim is bound");
    let path = (Api::<PersistentVolume>::all(client).get(&volume).await)
        .expect("get the volume")
        .spec
        .and_then(|s| s.local)
        .expect("a local volume")
        .path;
    (volume, PathBuf::from(path))
}

/// The container `step-build` of the build's pod, running, as the kubelet reports it.
fn running_step(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let step = statuses.iter().find(|s| s.name == "step-build")?;
    step.state.as_ref()?.running.as_ref()?;
    step.container_id.clone()
}

/// Whether the process `pid` has `source` (a host directory) mounted at `target`, in its own
/// mount namespace.
fn mounted(pid: u32, source: &Path, target: &str) -> bool {
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let source = source.to_string_lossy();
    // Fields: ID PARENT MAJ:MIN ROOT MOUNTPOINT ...; a bind mount's ROOT is the path within its
    // filesystem, which ends with the volume's directory.
    mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(4) == Some(&target)
            && fields
                .get(3)
                .is_some_and(|root| *root != "/" && source.ends_with(root))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_build_keeps_its_claim_while_its_step_mounts_it_then_the_daemon_deletes_it() {
    let Some(_turn) = node_turn(
        "a_real_build_keeps_its_claim_while_its_step_mounts_it_then_the_daemon_deletes_it",
    )
    .await
    else {
        return;
    };
    let control_plane = ControlPlane::start_with_node_and_tekton();
    let ns = TestNamespace::new(&control_plane, "build").await;
    let client = control_plane.client();

    // The operator's claim, on the node's storage, and its build: one task whose busybox step
    // writes into the workspace, then runs until the test lets it finish (a file in the volume).
    ClaimBuilder::for_job("nb")
        .storage_class("local")
        .create(&ns)
        .await;
    let step = "echo built > $(workspaces.source.path)/artifact && \
                until [ -e $(workspaces.source.path)/finish ]; do sleep 0.2; done";
    create_with_spec(
        &ns,
        &pipeline_resource(),
        PIPELINE,
        json!({}),
        json!({
            "workspaces": [{ "name": "shared-workspace" }],
            "tasks": [{
                "name": "build",
                "workspaces": [{ "name": "source", "workspace": "shared-workspace" }],
                "taskSpec": {
                    "workspaces": [{ "name": "source" }],
                    "steps": [{ "name": "build", "image": BUSYBOX, "command": ["sh", "-c", step] }],
                },
            }],
        }),
    )
    .await;
    create_with_spec(
        &ns,
        &pipeline_run_resource(),
        RUN,
        json!({ "app": "nb", "mlops.redhat.com/notebook-validation": "true" }),
        json!({
            "pipelineRef": { "name": PIPELINE },
            "workspaces": [{
                "name": "shared-workspace",
                "persistentVolumeClaim": { "claimName": CLAIM },
            }],
        }),
    )
    .await;
    let mut config = ns.config();
    config.policy.ttl_after_finished = Duration::from_secs(1);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "node-build").await;

    // The step runs on the node: scheduled there, started by the kubelet after Tekton's
    // `prepare` init container, and Tekton reports the TaskRun Running.
    let pods: Api<Pod> = ns.api();
    let started = wait_until(START, || async {
        (pods.get_opt(POD).await.ok().flatten()).is_some_and(|pod| running_step(&pod).is_some())
    })
    .await;
    assert!(started, "the step runs:\n{}", describe(&control_plane, &ns));
    let pod = pods.get(POD).await.expect("the build's pod");
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("workspace-gc-node")
    );
    let running = wait_until(TEKTON, || async {
        run_condition(&ns, &task_run_resource(), TASK_RUN).await
            == Some(("Unknown".to_owned(), "Running".to_owned()))
    })
    .await;
    assert!(
        running,
        "Tekton reports the TaskRun Running: {:?}",
        run_condition(&ns, &task_run_resource(), TASK_RUN).await
    );

    // The claim is really mounted: the step's process has the bound volume at the workspace,
    // and what it wrote there is in the volume's directory on the host.
    let (volume, path) = volume_path(&ns, client.clone()).await;
    let pid = container_pid(&control_plane, &running_step(&pod).expect("running"));
    assert!(
        mounted(pid, &path, "/workspace/source"),
        "the step mounts {} at /workspace/source:\n{}",
        path.display(),
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default()
    );
    // Tekton's entrypoint starts the step's command once the pod is ready (a downward file).
    let artifact = path.join("artifact");
    assert!(
        wait_until(TEKTON, || async {
            std::fs::read_to_string(&artifact).is_ok_and(|text| text == "built\n")
        })
        .await,
        "the step wrote into the volume:\n{}",
        describe(&control_plane, &ns)
    );

    // The daemon has judged the claim in use (its TTL of 1 s would let a finished build's claim
    // go), and has not deleted it.
    let in_use = format!(
        "claim_namespace=\"{}\",state=\"protected\",reason=\"in-use\"",
        ns.name()
    );
    assert!(
        wait_until(Duration::from_secs(30), || async {
            metric(&daemon.metrics().await, "workspace_gc_claims", &in_use) == 1.0
        })
        .await,
        "the daemon keeps the claim the running step mounts: {}",
        daemon.metrics().await
    );
    let claim = ns
        .api::<PersistentVolumeClaim>()
        .get(CLAIM)
        .await
        .expect("the claim");
    assert_eq!(claim.metadata.deletion_timestamp, None, "the claim is kept");

    // The step finishes: Tekton marks the TaskRun and the run Succeeded from the pod the kubelet
    // reports, the daemon deletes the claim past its TTL, and the volume is released.
    std::fs::write(path.join("finish"), "").expect("let the step finish");
    let succeeded = wait_until(START, || async {
        run_condition(&ns, &pipeline_run_resource(), RUN).await
            == Some(("True".to_owned(), "Succeeded".to_owned()))
    })
    .await;
    assert!(
        succeeded,
        "the run Succeeded:\n{}",
        describe(&control_plane, &ns)
    );
    assert_eq!(
        run_condition(&ns, &task_run_resource(), TASK_RUN).await,
        Some(("True".to_owned(), "Succeeded".to_owned()))
    );
    // The daemon deletes the claim. Tekton's finished pod, scheduled and naming the claim, holds
    // it Terminating (Kubernetes' pvc-protection counts every scheduled pod that names a claim,
    // finished or not) until the run is pruned.
    let terminating = || async { matches!(fate(&ns, CLAIM).await, Fate::Terminating(_)) };
    assert!(
        wait_until(Duration::from_secs(60), terminating).await,
        "the daemon deletes the finished build's claim:\n{}",
        describe(&control_plane, &ns)
    );
    let deleted = format!(
        "claim_namespace=\"{}\",reason=\"ttl-expired\",result=\"deleted\"",
        ns.name()
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_deletions_total",
                &deleted,
            ) == 1.0
        })
        .await,
        "the delete is counted once, as ttl-expired: {}",
        daemon.metrics().await
    );
    assert!(
        pods.get_opt(POD).await.expect("get the pod").is_some(),
        "Tekton's finished pod is kept"
    );

    // The run pruned (as Tekton's pruner or the operator deletes old runs): the garbage
    // collector deletes its TaskRun and pod, the kubelet lets the pod go, the claim goes, and
    // its volume is Released.
    (ns.dynamic_api(&pipeline_run_resource()))
        .delete(RUN, &DeleteParams::background())
        .await
        .expect("delete the run");
    assert!(
        wait_until(START, || async { !claim_exists(&ns, CLAIM).await }).await,
        "the claim goes with the run's pod:\n{}",
        describe(&control_plane, &ns)
    );
    let volumes: Api<PersistentVolume> = Api::all(client);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            (volumes.get(&volume).await.ok())
                .and_then(|v| v.status?.phase)
                .is_some_and(|phase| phase == "Released")
        })
        .await,
        "volume {volume} is Released:\n{}",
        describe(&control_plane, &ns)
    );
    daemon.stop().await;

    let dir = control_plane.dir().to_owned();
    drop(ns);
    drop(control_plane);
    assert_nothing_left(&dir);
}
