//! The shapes of the objects the tests and the benchmark create, one definition each and no
//! cluster behind them: objects.rs builds on these, and so does the benchmark
//! (bench/population.rs).

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSpec, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

/// The label that marks a claim as a build workspace.
pub const BUILD_WORKSPACE_LABEL: &str = "mlops.redhat.com/build-workspace";

/// The labels the operator puts on every build-workspace claim.
pub const OPERATOR_CLAIM_LABELS: [(&str, &str); 3] = [
    (
        "app.kubernetes.io/managed-by",
        "jupyter-notebook-validator-operator",
    ),
    ("app.kubernetes.io/component", "tekton-build"),
    (BUILD_WORKSPACE_LABEL, "true"),
];

/// Kubernetes writes times in RFC 3339 with whole seconds and `Z`.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A Tekton run's `Succeeded` condition.
pub fn succeeded_condition(status: &str, reason: &str, at: DateTime<Utc>) -> Value {
    json!({
        "type": "Succeeded",
        "status": status,
        "reason": reason,
        "message": format!("PipelineRun {reason}"),
        "lastTransitionTime": timestamp(at),
    })
}

/// A claim's spec: ReadWriteOnce, 1Gi, of `storage_class` (none: the cluster's default).
pub fn claim_spec(storage_class: Option<String>) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".to_owned()),
            )])),
            ..VolumeResourceRequirements::default()
        }),
        storage_class_name: storage_class,
        ..PersistentVolumeClaimSpec::default()
    }
}

/// A build pod's spec: one container mounting each of `claims`, never restarted, on `node` if
/// scheduled.
pub fn pod_spec(claims: &[String], node: Option<String>) -> PodSpec {
    let volume_name = |i: usize| format!("claim-{i}");
    PodSpec {
        containers: vec![Container {
            name: "build".to_owned(),
            image: Some("registry.example.com/notebook-build:latest".to_owned()),
            volume_mounts: Some(
                (0..claims.len())
                    .map(|i| VolumeMount {
                        name: volume_name(i),
                        mount_path: format!("/workspace/{i}"),
                        ..VolumeMount::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        }],
        volumes: Some(
            claims
                .iter()
                .enumerate()
                .map(|(i, claim)| Volume {
                    name: volume_name(i),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.clone(),
                        read_only: None,
                    }),
                    ..Volume::default()
                })
                .collect(),
        ),
        restart_policy: Some("Never".to_owned()),
        node_name: node,
        ..PodSpec::default()
    }
}
