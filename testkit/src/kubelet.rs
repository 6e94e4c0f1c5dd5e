//! A kubelet stand-in for the real Tekton controller (`scripts/control-plane up --tekton`). Where
//! the control plane has no node (or for a state no kubelet produces on cue), a test moves
//! Tekton's pods along with [`kubelet`]: it writes only what a kubelet writes to a pod's status
//! subresource (phase, conditions, start time and container states) and touches nothing else,
//! so every other object stays Tekton's and the API server's.

use chrono::{SecondsFormat, Utc};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::TestNamespace;

/// What the stand-in kubelet makes of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Not scheduled: `Pending`, `PodScheduled=False/Unschedulable`, as the scheduler leaves a
    /// pod that fits no node.
    Unschedulable,
    /// Init containers (Tekton's `prepare`, ...) done, every container running.
    Running,
    /// Every step exited 0.
    Succeeded,
    /// The first step exited with `exit_code` (not 0); the steps after it (Tekton's entrypoint
    /// skips them) are reported terminated with exit code 1.
    Failed { exit_code: i32 },
}

/// Writes `state` into the status of pod `name` in `ns`, as the kubelet would. Finished steps
/// carry the termination message Tekton's entrypoint writes (its start time, as result type 3),
/// which the TaskRun reconciler parses.
pub async fn kubelet(ns: &TestNamespace, name: &str, state: PodState) {
    let api = ns.api::<Pod>();
    let pod = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("kubelet: get pod {}/{name}: {e}", ns.name()));
    let spec = pod.spec.unwrap_or_default();
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let status = match state {
        PodState::Unschedulable => json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient cpu.",
                "lastTransitionTime": now,
            }],
        }),
        _ => {
            let (phase, ready) = match state {
                PodState::Running => ("Running", "True"),
                PodState::Succeeded => ("Succeeded", "False"),
                _ => ("Failed", "False"),
            };
            let conditions: Vec<Value> =
                ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
                    .iter()
                    .map(|kind| {
                        let status = if matches!(*kind, "ContainersReady" | "Ready") {
                            ready
                        } else {
                            "True"
                        };
                        json!({ "type": kind, "status": status, "lastTransitionTime": now })
                    })
                    .collect();
            let init: Vec<Value> = (spec.init_containers.iter().flatten())
                .map(|container| container_status(container, Some(0), &now))
                .collect();
            let mut failed = false;
            let containers: Vec<Value> = (spec.containers.iter())
                .map(|container| {
                    let exit_code = match state {
                        PodState::Running => None,
                        PodState::Failed { exit_code } if !failed => {
                            failed = true;
                            Some(exit_code)
                        }
                        PodState::Failed { .. } => Some(1),
                        _ => Some(0),
                    };
                    container_status(container, exit_code, &now)
                })
                .collect();
            json!({
                "phase": phase,
                "conditions": conditions,
                // Set once, when the kubelet first accepts the pod.
                "startTime": (pod.status.and_then(|s| s.start_time))
                    .map_or(json!(now), |t| json!(t)),
                "initContainerStatuses": init,
                "containerStatuses": containers,
            })
        }
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("kubelet: write the status of pod {}/{name}: {e}", ns.name()));
}

/// A container's status: running, or terminated with `exit_code`.
fn container_status(container: &Container, exit_code: Option<i32>, now: &str) -> Value {
    let state = match exit_code {
        None => json!({ "running": { "startedAt": now } }),
        Some(code) => json!({ "terminated": {
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "message": format!(r#"[{{"key":"StartedAt","value":"{now}","type":3}}]"#),
            "startedAt": now,
            "finishedAt": now,
        }}),
    };
    json!({
        "name": container.name,
        "image": container.image.clone().unwrap_or_default(),
        "imageID": "",
        "ready": exit_code.is_none(),
        "started": exit_code.is_none(),
        "restartCount": 0,
        "state": state,
    })
}
