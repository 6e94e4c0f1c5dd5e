//! The build lifecycle on the real Tekton Pipelines controller (`scripts/control-plane up
//! --tekton`: the operator's release pinned in hack/tekton, or the one
//! `CONTROL_PLANE_TEKTON_MODULE` selects; scripts/test runs this file on hack/tekton-latest
//! too): the operator's claim and PipelineRun go in, Tekton makes the TaskRuns and pods, the pods
//! move, and at every stage the claim's verdict is read from `workspace-gc audit`; at the end the
//! daemon deletes the claim past its TTL. Nothing here writes a Tekton status by hand.
//!
//! Who moves the pods: where the node lane runs (`CONTROL_PLANE_NODE=1`, root), the node's real
//! kubelet (`up --node --tekton`, one control plane shared by these tests): each step waits for
//! a file `exit-{task}` in the claim, which the test writes into the local volume to end the step
//! with that exit code. Elsewhere, and for the states a kubelet does not produce on cue (a pod
//! the scheduler finds no room for, then succeeding; an assistant's pod held Terminating), the
//! stand-in `testkit::kubelet` writes the pod's status.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, Fate, PodState, TestNamespace, audit_rows, claim_exists,
    create_with_spec, fate, kubelet, metric, node_requested, pipeline_resource,
    pipeline_run_resource, run_condition, task_run_resource, tekton_version, wait_until,
};

/// The operator's names for job `nb`: claim, PipelineRun, Pipeline.
const CLAIM: &str = "nb-build-workspace";
const RUN: &str = "nb-build";
const PIPELINE: &str = "nb-pipeline";
/// How long a Tekton reconcile may take on a loaded 2-core machine.
const TEKTON: Duration = Duration::from_secs(60);

/// A TTL no stage reaches, and one every finished stage is past once a second has gone by.
const LONG_TTL: &str = "1h";
const SHORT_TTL: &str = "1s";

/// A pipeline task `name` with one step, using the shared workspace. On the node the step runs
/// until the test writes `exit-{name}` into the workspace, and exits with the code it holds
/// (consumed, so a retry waits for the next).
fn task(name: &str) -> Value {
    let release = format!("$(workspaces.source.path)/exit-{name}");
    let step = format!(
        "until [ -e {release} ]; do sleep 0.2; done; code=$(cat {release}); rm {release}; exit $code"
    );
    json!({
        "name": name,
        "workspaces": [{ "name": "source", "workspace": "shared-workspace" }],
        "taskSpec": {
            "workspaces": [{ "name": "source" }],
            "steps": [{
                "name": "build",
                "image": "localhost/busybox:workspace-gc",
                "command": ["sh", "-c", step],
            }],
        },
    })
}

/// One build as the operator starts it: its claim, its Pipeline `nb-pipeline` and the
/// PipelineRun `nb-build` binding the claim as `shared-workspace`.
struct Build<'a> {
    control_plane: &'a ControlPlane,
    ns: TestNamespace,
    /// Its pods run on the node, moved by the real kubelet.
    node: bool,
}

impl Build<'static> {
    /// A build on the shared Tekton control plane (Tekton's default feature flags), with the
    /// node where the node lane runs.
    async fn start(prefix: &str, pipeline: Value, run: Value) -> Build<'static> {
        if node_requested() {
            let control_plane = ControlPlane::shared_node_tekton();
            Build::start_with(control_plane, true, prefix, pipeline, run).await
        } else {
            Build::start_without_node(prefix, pipeline, run).await
        }
    }

    /// A build whose pods the stand-in moves, for states a kubelet does not produce on cue.
    async fn start_without_node(prefix: &str, pipeline: Value, run: Value) -> Build<'static> {
        Build::start_with(ControlPlane::shared_tekton(), false, prefix, pipeline, run).await
    }
}

impl<'a> Build<'a> {
    /// `pipeline` is the Pipeline's spec less its workspaces; `run` is merged into the run's
    /// spec (`status`, `timeouts`).
    async fn start_on(
        control_plane: &'a ControlPlane,
        prefix: &str,
        pipeline: Value,
        run: Value,
    ) -> Build<'a> {
        Build::start_with(control_plane, false, prefix, pipeline, run).await
    }

    async fn start_with(
        control_plane: &'a ControlPlane,
        node: bool,
        prefix: &str,
        pipeline: Value,
        run: Value,
    ) -> Build<'a> {
        let ns = TestNamespace::new(control_plane, prefix).await;
        let claim = ClaimBuilder::for_job("nb");
        // On the node: a static local volume, bound when the build's first pod is scheduled.
        let claim = if node {
            claim.storage_class("local")
        } else {
            claim
        };
        claim.create(&ns).await;
        let mut pipeline_spec = pipeline;
        pipeline_spec["workspaces"] = json!([{ "name": "shared-workspace" }]);
        create_with_spec(
            &ns,
            &pipeline_resource(),
            PIPELINE,
            json!({}),
            pipeline_spec,
        )
        .await;
        let mut run_spec = json!({
            "pipelineRef": { "name": PIPELINE },
            "workspaces": [{
                "name": "shared-workspace",
                "persistentVolumeClaim": { "claimName": CLAIM },
            }],
        });
        for (key, value) in run.as_object().into_iter().flatten() {
            run_spec[key] = value.clone();
        }
        let labels = json!({ "app": "nb", "mlops.redhat.com/notebook-validation": "true" });
        create_with_spec(&ns, &pipeline_run_resource(), RUN, labels, run_spec).await;
        Build {
            control_plane,
            ns,
            node,
        }
    }

    /// Moves pod `name` to `state`: on the node, the real kubelet does, the step ended through
    /// its `exit-{task}` file; elsewhere the stand-in writes the state.
    async fn move_pod(&self, name: &str, state: PodState) {
        if !self.node {
            kubelet(&self.ns, name, state).await;
            return;
        }
        let (exit_code, phase) = match state {
            PodState::Running => (None, "Running"),
            PodState::Succeeded => (Some(0), "Succeeded"),
            PodState::Failed { exit_code } => (Some(exit_code), "Failed"),
            PodState::Unschedulable => {
                panic!("a kubelet makes no pod unschedulable on cue: use the stand-in")
            }
        };
        if let Some(code) = exit_code {
            // Pod `nb-build-{task}-pod`, or `...-pod-retry{n}` for a retry.
            let task = (name.strip_prefix("nb-build-"))
                .and_then(|rest| rest.split("-pod").next())
                .unwrap_or_else(|| panic!("pod {name} is no task's"));
            let release = self.volume_dir().await.join(format!("exit-{task}"));
            std::fs::write(&release, code.to_string())
                .unwrap_or_else(|e| panic!("write {}: {e}", release.display()));
        }
        let reached = wait_until(TEKTON, || async {
            (self.pod(name).await)
                .and_then(|pod| pod.status?.phase)
                .is_some_and(|p| p == phase)
        })
        .await;
        assert!(
            reached,
            "the kubelet reports pod {name} {phase}: {:?}",
            self.pod(name).await.and_then(|pod| pod.status)
        );
    }

    /// The host directory of the local volume the claim is bound to, once it is.
    async fn volume_dir(&self) -> PathBuf {
        let claims = self.ns.api::<PersistentVolumeClaim>();
        let volume = || async {
            (claims.get_opt(CLAIM).await.ok().flatten()).and_then(|claim| claim.spec?.volume_name)
        };
        assert!(
            wait_until(TEKTON, || async { volume().await.is_some() }).await,
            "the claim is bound"
        );
        let volume = volume().await.expect("bound");
        let path = (Api::<PersistentVolume>::all(self.ns.client().clone())
            .get(&volume)
            .await)
            .unwrap_or_else(|e| panic!("get volume {volume}: {e}"))
            .spec
            .and_then(|spec| spec.local)
            .expect("a local volume")
            .path;
        PathBuf::from(path)
    }

    async fn get(&self, resource: &ApiResource, name: &str) -> Option<DynamicObject> {
        (self.ns.dynamic_api(resource).get_opt(name).await)
            .unwrap_or_else(|e| panic!("get {} {name}: {e}", resource.kind))
    }

    async fn condition(&self, resource: &ApiResource, name: &str) -> Option<(String, String)> {
        run_condition(&self.ns, resource, name).await
    }

    /// Waits until the PipelineRun (`task` None) or TaskRun `nb-build-{task}` reports
    /// `status`/`reason`; panics with what it reported instead.
    async fn wait_for(&self, task: Option<&str>, status: &str, reason: &str) {
        self.wait_for_one_of(task, status, &[reason]).await;
    }

    /// [`Self::wait_for`] with any of `reasons`, where Tekton releases differ.
    async fn wait_for_one_of(&self, task: Option<&str>, status: &str, reasons: &[&str]) {
        let (resource, name) = match task {
            None => (pipeline_run_resource(), RUN.to_owned()),
            Some(task) => (task_run_resource(), format!("{RUN}-{task}")),
        };
        let reached = wait_until(TEKTON, || async {
            (self.condition(&resource, &name).await)
                .is_some_and(|(s, reason)| s == status && reasons.contains(&reason.as_str()))
        })
        .await;
        assert!(
            reached,
            "{} {name} reaches {status}/{reasons:?}; it has {:?}",
            resource.kind,
            self.condition(&resource, &name).await
        );
    }

    async fn pod(&self, name: &str) -> Option<Pod> {
        (self.ns.api::<Pod>().get_opt(name).await).unwrap_or_else(|e| panic!("get pod {name}: {e}"))
    }

    /// Waits until Tekton has created pod `name` and returns it, checking that it mounts the
    /// claim from the moment it exists.
    async fn wait_for_pod(&self, name: &str) -> Pod {
        assert!(
            wait_until(TEKTON, || async { self.pod(name).await.is_some() }).await,
            "Tekton creates pod {name}"
        );
        let pod = self.pod(name).await.expect("the pod exists");
        assert!(mounts_claim(&pod), "pod {name} mounts {CLAIM}: {pod:?}");
        pod
    }

    async fn wait_for_no_pod(&self, name: &str) {
        assert!(
            wait_until(TEKTON, || async { self.pod(name).await.is_none() }).await,
            "pod {name} is deleted"
        );
    }

    /// The claim's verdict and reason from `workspace-gc audit` under `ttl`.
    async fn verdict(&self, ttl: &str) -> (String, String) {
        let rows = audit_rows(
            self.control_plane,
            &[self.ns.name().to_owned()],
            (ttl, ttl, "1h", "24h"),
        )
        .await;
        let row = (rows.iter().find(|row| row["name"] == CLAIM))
            .unwrap_or_else(|| panic!("the audit has a row for {CLAIM}: {rows:?}"));
        let text = |key: &str| row[key].as_str().unwrap_or_default().to_owned();
        (text("verdict"), text("reason"))
    }

    async fn assert_verdict(&self, stage: &str, ttl: &str, verdict: &str, reason: &str) {
        assert_eq!(
            self.verdict(ttl).await,
            (verdict.to_owned(), reason.to_owned()),
            "{stage}: the claim's verdict"
        );
    }

    /// The pods of the affinity assistant, whose StatefulSet Tekton deletes when the run ends
    /// (the garbage collector then deletes the pod): until then the claim is in use.
    async fn assistant_pods(&self) -> Vec<String> {
        (self.ns.api::<Pod>().list(&Default::default()).await)
            .expect("list pods")
            .items
            .into_iter()
            .filter_map(|pod| pod.metadata.name)
            .filter(|name| name.starts_with("affinity-assistant-"))
            .collect()
    }

    /// The run has finished: within the TTL the claim is kept, past it the audit would delete
    /// it, and the daemon does, counting it as `ttl-expired`.
    async fn assert_reclaimed_after_ttl(&self) {
        assert!(
            wait_until(TEKTON, || async { self.assistant_pods().await.is_empty() }).await,
            "the affinity assistant's pod is deleted after the run: {:?}",
            self.assistant_pods().await
        );
        self.assert_verdict("finished, within the TTL", LONG_TTL, "keep", "within-ttl")
            .await;
        // Completion times have whole seconds: past a 1 s TTL for certain two seconds later.
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.assert_verdict("finished, past the TTL", SHORT_TTL, "delete", "ttl-expired")
            .await;
        let mut config = self.ns.config();
        config.policy.ttl_after_finished = Duration::from_secs(1);
        let daemon = Daemon::start(self.ns.daemon_client(&config).await, config, "tekton").await;
        // On the node, a finished pod of the build, scheduled and naming the claim, holds it
        // Terminating (pvc-protection) until the run is pruned; without one no pod is scheduled.
        let deleted = || async {
            match fate(&self.ns, CLAIM).await {
                Fate::Gone => true,
                Fate::Terminating(_) => self.node,
                Fate::Live => false,
            }
        };
        assert!(
            wait_until(Duration::from_secs(30), deleted).await,
            "the daemon deletes the claim past its TTL"
        );
        let labels = format!(
            "claim_namespace=\"{}\",reason=\"ttl-expired\",result=\"deleted\"",
            self.ns.name()
        );
        // The claim can be gone before the daemon has read the DELETE's answer.
        let counted = || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_deletions_total",
                &labels,
            )
        };
        assert!(
            wait_until(Duration::from_secs(10), || async { counted().await == 1.0 }).await,
            "the delete is counted once: {}",
            daemon.metrics().await
        );
        daemon.stop().await;
    }

    /// Sets pod `name`'s finalizers (`null` removes them).
    async fn set_finalizers(&self, name: &str, finalizers: Value) {
        (self.ns.api::<Pod>())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": finalizers } })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch pod {name}: {e}"));
    }

    async fn patch_run_spec(&self, spec: Value) {
        (self.ns.dynamic_api(&pipeline_run_resource()))
            .patch(
                RUN,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch {RUN}: {e}"));
    }
}

fn mounts_claim(pod: &Pod) -> bool {
    (pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten()))
    .filter_map(|volume| volume.persistent_volume_claim.as_ref())
    .any(|source| source.claim_name == CLAIM)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_successful_build_keeps_its_claim_while_a_pod_mounts_it_then_within_its_ttl() {
    let build = Build::start("tk-success", json!({ "tasks": [task("build")] }), json!({})).await;
    // On the node the kubelet may have started the step by now.
    let started: &[&str] = if build.node {
        &["Pending", "Running"]
    } else {
        &["Pending"]
    };
    build
        .wait_for_one_of(Some("build"), "Unknown", started)
        .await;
    // Tekton's naming: TaskRun {run}-{task}, owned by the run and binding the same claim.
    let task_run = (build.get(&task_run_resource(), "nb-build-build").await).expect("the TaskRun");
    assert_eq!(
        task_run.metadata.owner_references.unwrap_or_default()[0].name,
        RUN,
        "the TaskRun is owned by the run"
    );
    assert_eq!(
        task_run.data["spec"]["workspaces"][0]["persistentVolumeClaim"]["claimName"],
        CLAIM
    );
    assert_eq!(
        (build
            .get(&pipeline_run_resource(), RUN)
            .await
            .expect("the run"))
        .metadata
        .labels
        .unwrap_or_default()["tekton.dev/pipeline"],
        PIPELINE,
        "Tekton labels the run with its Pipeline, which the operator finds it by"
    );
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .assert_verdict("pod created, not started", LONG_TTL, "protected", "in-use")
        .await;
    // With the default coschedule (workspaces), the affinity assistant's pod mounts the claim
    // too while the run is active.
    let assistants = build
        .ns
        .api::<StatefulSet>()
        .list(&Default::default())
        .await;
    let assistant = (assistants
        .expect("list StatefulSets")
        .items
        .into_iter()
        .next())
    .expect("Tekton creates an affinity-assistant StatefulSet");
    let assistant_pod = format!("{}-0", assistant.metadata.name.clone().unwrap_or_default());
    build.wait_for_pod(&assistant_pod).await;

    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build.wait_for(Some("build"), "Unknown", "Running").await;
    build
        .assert_verdict("step running", SHORT_TTL, "protected", "in-use")
        .await;

    build
        .move_pod("nb-build-build-pod", PodState::Succeeded)
        .await;
    build.wait_for(None, "True", "Succeeded").await;
    // Tekton removes the affinity assistant when the run completes.
    build.wait_for_no_pod(&assistant_pod).await;
    build.assert_reclaimed_after_ttl().await;
}

/// OpenShift Pipelines runs Tekton with `coschedule: pipelineruns`: one affinity assistant per
/// run, a StatefulSet whose pod mounts the run's claims, deleted when the run completes.
#[tokio::test(flavor = "multi_thread")]
async fn under_coschedule_pipelineruns_the_claim_is_kept_until_the_runs_assistant_pod_is_gone() {
    claim_kept_until_the_runs_assistant_pod_is_gone("pipelineruns").await;
}

/// `coschedule: isolate-pipelinerun`: the same, and the assistant keeps other runs off its node.
#[tokio::test(flavor = "multi_thread")]
async fn under_coschedule_isolate_pipelinerun_the_claim_is_kept_until_the_assistant_pod_is_gone() {
    claim_kept_until_the_runs_assistant_pod_is_gone("isolate-pipelinerun").await;
}

/// Under `coschedule` `mode` (one assistant per run) the claim is kept while the run's
/// assistant pod exists, after the run has finished and past its TTL, and is collected once
/// the pod is gone. (`disable-affinity-assistant=true`, which v0.68.0 requires for any mode but
/// `workspaces`, is gone from v1.15.1, which ignores it.) No kubelet runs here, and a deleted
/// pod that was never scheduled goes at once: a finalizer of the test holds the assistant's
/// pod, as a kubelet holds a deleted pod Terminating while it stops its container and unmounts
/// its volumes.
async fn claim_kept_until_the_runs_assistant_pod_is_gone(mode: &str) {
    const KUBELET: &str = "workspace-gc.test/kubelet";
    let coschedule = format!("coschedule={mode}");
    let control_plane =
        ControlPlane::start_tekton(&["disable-affinity-assistant=true", &coschedule]);
    let build = Build::start_on(
        &control_plane,
        &format!("tk-{mode}"),
        json!({ "tasks": [task("build")] }),
        json!({}),
    )
    .await;
    build.wait_for(Some("build"), "Unknown", "Pending").await;
    build.wait_for_pod("nb-build-build-pod").await;
    // Tekton names a run's assistant after the run alone (one per workspace: after the workspace
    // and the run), and only an isolating one requires other assistants off its node: together
    // they show the mode in force.
    let assistant = format!("affinity-assistant-{}", &sha256_hex(RUN)[..10]);
    let statefulsets = (build.ns.api::<StatefulSet>())
        .list(&Default::default())
        .await
        .expect("list StatefulSets")
        .items;
    let names: Vec<_> = (statefulsets.iter())
        .filter_map(|statefulset| statefulset.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        [assistant.as_str()],
        "one affinity assistant, the run's"
    );
    let isolating = (statefulsets.iter())
        .filter_map(|statefulset| statefulset.spec.template.spec.as_ref())
        .filter_map(|pod| pod.affinity.as_ref()?.pod_anti_affinity.as_ref())
        .any(|anti| {
            !(anti.required_during_scheduling_ignored_during_execution)
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        });
    assert_eq!(
        isolating,
        mode == "isolate-pipelinerun",
        "the assistant keeps other runs off its node only when isolating"
    );
    let assistant_pod = format!("{assistant}-0");
    build.wait_for_pod(&assistant_pod).await;
    build.set_finalizers(&assistant_pod, json!([KUBELET])).await;

    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build.wait_for(Some("build"), "Unknown", "Running").await;
    build
        .move_pod("nb-build-build-pod", PodState::Succeeded)
        .await;
    build.wait_for(None, "True", "Succeeded").await;
    // Tekton deletes the assistant at completion; the garbage collector deletes its pod, which
    // the kubelet still holds.
    assert!(
        wait_until(TEKTON, || async {
            (build.pod(&assistant_pod).await)
                .is_some_and(|pod| pod.metadata.deletion_timestamp.is_some())
        })
        .await,
        "the assistant's pod is being deleted after the run: {:?}",
        build.pod(&assistant_pod).await.map(|pod| pod.metadata)
    );
    // Completion times have whole seconds: past a 1 s TTL for certain two seconds later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    build
        .assert_verdict(
            "finished, the assistant's pod terminating",
            SHORT_TTL,
            "protected",
            "in-use",
        )
        .await;
    let mut config = build.ns.config();
    config.policy.ttl_after_finished = Duration::from_secs(1);
    let daemon = Daemon::start(build.ns.daemon_client(&config).await, config, "tekton").await;
    let in_use = format!(
        "claim_namespace=\"{}\",state=\"protected\",reason=\"in-use\"",
        build.ns.name()
    );
    assert!(
        wait_until(Duration::from_secs(15), || async {
            metric(&daemon.metrics().await, "workspace_gc_claims", &in_use) == 1.0
        })
        .await,
        "the daemon keeps the claim in use by the terminating pod: {}",
        daemon.metrics().await
    );
    assert!(claim_exists(&build.ns, CLAIM).await, "the claim is kept");

    // The kubelet has unmounted the claim: the pod goes, and so does the claim.
    build.set_finalizers(&assistant_pod, Value::Null).await;
    build.wait_for_no_pod(&assistant_pod).await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            !claim_exists(&build.ns, CLAIM).await
        })
        .await,
        "the daemon deletes the claim once the assistant's pod is gone"
    );
    let labels = format!(
        "claim_namespace=\"{}\",reason=\"ttl-expired\",result=\"deleted\"",
        build.ns.name()
    );
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(&metrics, "workspace_gc_deletions_total", &labels),
        1.0,
        "{metrics}"
    );
    daemon.stop().await;
}

/// The SHA-256 of `text` in hex, as Tekton hashes names (coreutils' `sha256sum`).
fn sha256_hex(text: &str) -> String {
    let output = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh", text])
        .output()
        .expect("run sha256sum");
    assert!(output.status.success(), "sha256sum: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum prints the hash")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_build_keeps_its_claim_within_its_ttl_only() {
    let build = Build::start("tk-failure", json!({ "tasks": [task("build")] }), json!({})).await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build
        .assert_verdict("step running", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-build-pod", PodState::Failed { exit_code: 2 })
        .await;
    // v0.68.0 reports a failed step as Failed, v1.15.1 as StepFailed.
    build
        .wait_for_one_of(Some("build"), "False", &["Failed", "StepFailed"])
        .await;
    build.wait_for(None, "False", "Failed").await;
    build.assert_reclaimed_after_ttl().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_build_loses_its_pods_and_keeps_its_claim_within_its_ttl() {
    let build = Build::start("tk-cancel", json!({ "tasks": [task("build")] }), json!({})).await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build.wait_for(Some("build"), "Unknown", "Running").await;
    build
        .assert_verdict("step running", SHORT_TTL, "protected", "in-use")
        .await;
    build.patch_run_spec(json!({ "status": "Cancelled" })).await;
    build.wait_for(None, "False", "Cancelled").await;
    // Cancellation deletes the TaskRun's pods (keep-pod-on-cancel is off by default).
    build.wait_for_no_pod("nb-build-build-pod").await;
    build.assert_reclaimed_after_ttl().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_build_keeps_its_claim_within_its_ttl() {
    let build = Build::start(
        "tk-timeout",
        json!({ "tasks": [task("build")] }),
        // Long enough for the running stage to be judged first on a loaded machine.
        json!({ "timeouts": { "pipeline": "30s" } }),
    )
    .await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build
        .assert_verdict("step running", SHORT_TTL, "protected", "in-use")
        .await;
    // Tekton times the run out over its TaskRuns' cancellation.
    build.wait_for(None, "False", "PipelineRunTimeout").await;
    build
        .wait_for(Some("build"), "False", "TaskRunCancelled")
        .await;
    build.wait_for_no_pod("nb-build-build-pod").await;
    build.assert_reclaimed_after_ttl().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_build_keeps_its_claim_between_attempts() {
    let mut retried = task("build");
    retried["retries"] = json!(1);
    let build = Build::start("tk-retry", json!({ "tasks": [retried] }), json!({})).await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Failed { exit_code: 1 })
        .await;
    // The first attempt failed: Tekton records it in the TaskRun's retriesStatus and starts a
    // second pod; the TaskRun stays unfinished meanwhile.
    build.wait_for_pod("nb-build-build-pod-retry1").await;
    let attempts = || async {
        let task_run = build.get(&task_run_resource(), "nb-build-build").await;
        let retries = task_run.map(|t| t.data["status"]["retriesStatus"].clone());
        retries.and_then(|r| r.as_array().map(Vec::len))
    };
    assert!(
        wait_until(TEKTON, || async { attempts().await == Some(1) }).await,
        "the TaskRun records one failed attempt: {:?}",
        attempts().await
    );
    assert_eq!(
        build
            .condition(&task_run_resource(), "nb-build-build")
            .await
            .map(|c| c.0),
        Some("Unknown".to_owned()),
        "the TaskRun is not finished between attempts"
    );
    build
        .assert_verdict("between attempts", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-build-pod-retry1", PodState::Running)
        .await;
    build
        .assert_verdict("second attempt running", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-build-pod-retry1", PodState::Succeeded)
        .await;
    build.wait_for(None, "True", "Succeeded").await;
    build.assert_reclaimed_after_ttl().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_build_cancelled_while_its_finally_task_runs_keeps_its_claim_until_that_ends() {
    let build = Build::start(
        "tk-finally",
        json!({ "tasks": [task("build")], "finally": [task("report")] }),
        json!({}),
    )
    .await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Running)
        .await;
    build.wait_for(Some("build"), "Unknown", "Running").await;
    build
        .patch_run_spec(json!({ "status": "CancelledRunFinally" }))
        .await;
    build.wait_for_no_pod("nb-build-build-pod").await;
    build.wait_for_pod("nb-build-report-pod").await;
    build
        .wait_for(None, "Unknown", "CancelledRunningFinally")
        .await;
    build
        .assert_verdict("finally task pending", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-report-pod", PodState::Running)
        .await;
    build
        .assert_verdict("finally task running", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-report-pod", PodState::Succeeded)
        .await;
    build.wait_for(None, "False", "Cancelled").await;
    build.assert_reclaimed_after_ttl().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_build_and_an_unschedulable_pod_keep_their_claim() {
    // The stand-in, even where the node runs: the scheduler finds room, or never does, but a
    // pod it found none for does not then succeed on cue.
    let build = Build::start_without_node(
        "tk-pending",
        json!({ "tasks": [task("build")] }),
        json!({ "status": "PipelineRunPending" }),
    )
    .await;
    build.wait_for(None, "Unknown", "PipelineRunPending").await;
    assert!(
        build
            .get(&task_run_resource(), "nb-build-build")
            .await
            .is_none(),
        "a pending run starts no TaskRun"
    );
    build
        .assert_verdict("run pending", SHORT_TTL, "keep", "owner-running")
        .await;
    build.patch_run_spec(json!({ "status": null })).await;
    build.wait_for_pod("nb-build-build-pod").await;
    build
        .move_pod("nb-build-build-pod", PodState::Unschedulable)
        .await;
    // Tekton reads the scheduler's "Insufficient cpu" as ExceededNodeResources.
    build
        .wait_for(Some("build"), "Unknown", "ExceededNodeResources")
        .await;
    build
        .assert_verdict("pod unschedulable", SHORT_TTL, "protected", "in-use")
        .await;
    build
        .move_pod("nb-build-build-pod", PodState::Succeeded)
        .await;
    build.wait_for(None, "True", "Succeeded").await;
    build.assert_reclaimed_after_ttl().await;
}

/// The pid recorded for `name` in a control plane's directory (`scripts/control-plane`).
fn recorded_pid(dir: &std::path::Path, name: &str) -> u32 {
    let text = std::fs::read_to_string(dir.join(format!("{name}.pid")))
        .unwrap_or_else(|e| panic!("read {name}.pid: {e}"));
    let pid = text.split_whitespace().next().unwrap_or_default();
    pid.parse()
        .unwrap_or_else(|e| panic!("{name}.pid holds {text:?}: {e}"))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_selected_tekton_release_runs_in_a_network_namespace_of_its_own_and_stops_with_down() {
    let control_plane = ControlPlane::start_tekton(&[]);
    let netns = recorded_pid(control_plane.dir(), "tekton-controller");
    // A child is listed under the thread that forked it: tekton-netns forks from a locked
    // thread of its own, which is its main thread only by chance.
    let tasks =
        std::fs::read_dir(format!("/proc/{netns}/task")).expect("list tekton-netns' threads");
    let children: String = (tasks.flatten())
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .collect();
    let controller: u32 = (children.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .expect("tekton-netns runs the controller as its child");
    // scripts/test runs this file on each Tekton release: each run must test the one it names.
    let executable = std::fs::read_link(format!("/proc/{controller}/exe"))
        .expect("read the controller's executable");
    assert!(
        executable
            .to_string_lossy()
            .contains(&format!("/tekton-{}/", tekton_version())),
        "the controller is Tekton {}: {}",
        tekton_version(),
        executable.display()
    );
    let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    assert!(
        namespace(&controller.to_string()).is_some(),
        "the controller's network namespace is readable"
    );
    assert_ne!(
        namespace(&controller.to_string()),
        namespace("self"),
        "the controller's fixed ports (8080, 9090, 8008) are in a namespace of its own"
    );
    drop(control_plane);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            !alive(netns) && !alive(controller)
        })
        .await,
        "down stops tekton-netns and the controller"
    );
}
