//! The edge between API objects and facts: the two owner kinds' API resources, and the
//! conversion of claims, PipelineRuns, NotebookValidationJobs and pods into the small entries
//! the cache keeps. Timestamps become `chrono` here, once.
//!
//! Owner objects are read as `DynamicObject`s so that an owner with odd or missing fields
//! still converts (to a state that keeps the claim) instead of failing a whole list.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use crate::facts::{
    ClaimFacts, JOB_GROUP, JOB_KIND, ObjectKey, OwnerRef, Progress, RUN_GROUP, RUN_KIND,
};
use crate::quantity::Quantity;

/// `mlops.mlops.dev/v1alpha1` NotebookValidationJob.
pub fn job_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(JOB_GROUP, "v1alpha1", JOB_KIND),
        "notebookvalidationjobs",
    )
}

/// `tekton.dev/v1` PipelineRun.
pub fn run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(RUN_GROUP, "v1", RUN_KIND),
        "pipelineruns",
    )
}

/// Converts a k8s-openapi timestamp into the domain's time type.
pub fn to_chrono(time: &Time) -> DateTime<Utc> {
    let nanos = time.0.as_nanosecond();
    match i64::try_from(nanos) {
        Ok(nanos) => DateTime::from_timestamp_nanos(nanos),
        // Beyond 1677..2262: clamp; no build workspace lives there.
        Err(_) if nanos < 0 => DateTime::<Utc>::MIN_UTC,
        Err(_) => DateTime::<Utc>::MAX_UTC,
    }
}

/// What the cache keeps of a NotebookValidationJob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEntry {
    pub key: ObjectKey,
    pub uid: String,
    pub progress: Progress,
}

/// What the cache keeps of a PipelineRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    pub key: ObjectKey,
    pub uid: String,
    /// The claims its workspaces bind.
    pub claims: Vec<String>,
    pub progress: Progress,
}

/// What the cache keeps of a pod: only whether it may still use the claims it mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    pub key: ObjectKey,
    pub phase: Option<String>,
    pub claims: Vec<String>,
}

pub fn claim_facts(claim: &PersistentVolumeClaim) -> ClaimFacts {
    let meta = &claim.metadata;
    let key = ObjectKey::of(meta);
    ClaimFacts {
        key,
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(DateTime::<Utc>::MAX_UTC, to_chrono),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        owner_references: meta
            .owner_references
            .iter()
            .flatten()
            .map(|r| OwnerRef {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
            })
            .collect(),
        deletion_timestamp: meta.deletion_timestamp.as_ref().map(to_chrono),
        requested_bytes: claim
            .spec
            .as_ref()
            .and_then(|spec| spec.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| q.0.parse::<Quantity>().ok())
            .map(|q| q.bytes()),
    }
}

pub fn job_entry(job: &DynamicObject) -> JobEntry {
    let status = job.data.get("status");
    let phase = status.and_then(|s| s.get("phase")).and_then(Value::as_str);
    let progress = match phase {
        Some("Succeeded" | "Failed") => Progress::Finished {
            at: status.and_then(|s| timestamp(s.get("completionTime"))),
        },
        // Every other phase, a legacy one, an unknown one or none yet, is still running.
        _ => Progress::Running,
    };
    JobEntry {
        key: ObjectKey::of(&job.metadata),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        progress,
    }
}

pub fn run_entry(run: &DynamicObject) -> RunEntry {
    let status = run.data.get("status");
    let succeeded = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Succeeded"))
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str);
    let progress = match succeeded {
        Some("True" | "False") => Progress::Finished {
            at: status.and_then(|s| timestamp(s.get("completionTime"))),
        },
        // `Unknown`, no condition yet (pending) or anything odd: running.
        _ => Progress::Running,
    };
    let claims = run
        .data
        .get("spec")
        .and_then(|s| s.get("workspaces"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|w| w.get("persistentVolumeClaim")?.get("claimName")?.as_str())
        .map(str::to_owned)
        .collect();
    RunEntry {
        key: ObjectKey::of(&run.metadata),
        uid: run.metadata.uid.clone().unwrap_or_default(),
        claims,
        progress,
    }
}

pub fn pod_entry(pod: &Pod) -> PodEntry {
    let claims = pod
        .spec
        .as_ref()
        .map(|spec| spec.volumes.iter().flatten())
        .into_iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|pvc| pvc.claim_name.clone())
        .collect();
    PodEntry {
        key: ObjectKey::of(&pod.metadata),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        claims,
    }
}

/// An RFC 3339 string; anything else is treated as no timestamp (which keeps the claim).
fn timestamp(value: Option<&Value>) -> Option<DateTime<Utc>> {
    let text = value?.as_str()?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn dynamic(resource: &ApiResource, value: Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(value).unwrap();
        object.types = Some(kube::api::TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        });
        object
    }

    #[test]
    fn runs_finish_on_the_succeeded_condition() {
        let run = dynamic(
            &run_resource(),
            json!({
                "metadata": {"name": "nb-build", "namespace": "ml", "uid": "r1"},
                "spec": {"workspaces": [
                    {"name": "shared-workspace", "persistentVolumeClaim": {"claimName": "nb-build-workspace"}},
                    {"name": "cfg", "configMap": {"name": "x"}}
                ]},
                "status": {
                    "conditions": [{"type": "Succeeded", "status": "False", "reason": "PipelineRunTimeout"}],
                    "completionTime": "2026-11-01T12:00:00Z"
                }
            }),
        );
        let entry = run_entry(&run);
        assert_eq!(entry.claims, vec!["nb-build-workspace".to_owned()]);
        assert_eq!(
            entry.progress,
            Progress::Finished {
                at: Some(Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap())
            }
        );
    }

    #[test]
    fn odd_owner_objects_count_as_running() {
        for status in [
            json!(null),
            json!("weird"),
            json!({"conditions": "nope"}),
            json!({"conditions": [{"type": "Succeeded", "status": "Unknown"}]}),
            json!({"conditions": [{"type": "Ready", "status": "True"}]}),
        ] {
            let run = dynamic(
                &run_resource(),
                json!({"metadata": {"name": "r", "namespace": "ml"}, "spec": {"workspaces": 7}, "status": status}),
            );
            assert_eq!(run_entry(&run).progress, Progress::Running, "{status}");
        }
        for status in [
            json!(null),
            json!({"phase": "Building"}),
            json!({"phase": 42}),
            json!({"phase": "ValidationRunning"}),
        ] {
            let job = dynamic(
                &job_resource(),
                json!({"metadata": {"name": "j", "namespace": "ml"}, "status": status}),
            );
            assert_eq!(job_entry(&job).progress, Progress::Running, "{status}");
        }
    }

    #[test]
    fn a_finished_job_with_a_malformed_completion_time_has_none() {
        let job = dynamic(
            &job_resource(),
            json!({"metadata": {"name": "j", "namespace": "ml"},
                   "status": {"phase": "Succeeded", "completionTime": "yesterday"}}),
        );
        assert_eq!(job_entry(&job).progress, Progress::Finished { at: None });
    }
}
