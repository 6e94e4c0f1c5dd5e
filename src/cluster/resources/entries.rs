//! The decoded objects into what the rest reads: a claim's facts, and the cache's entries for
//! owners, pods, ResourceQuotas, Namespaces and PersistentVolumes. Apart from the slim decode
//! types (`mod.rs`) because these are the rules (which condition finishes a run, which class
//! a quota counts a claim under), and those only what is read.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use serde_json::Value;

use super::{ClaimObject, ClaimRef, OwnerObject, PodConfig, PodVolumes, Shape, to_chrono};
use crate::config::quantity::{self, Quantity};
use crate::contract::{OwnerKind, annotations, labels};
use crate::decide::facts::{
    AccessModes, ClaimFacts, JobEntry, LabelHistory, LabelOwner, NamespaceEntry, ObjectKey,
    Operation, OwnerRef, PodEntry, Progress, Provenance, RunEntry, VolumeClaims,
};
use crate::decide::provenance::MERGED_MANAGER;
use crate::decide::quota::{Limit, QuotaEntry, Resource as QuotaResource};
use crate::decide::volumes::{Transition, VolumeFacts};

pub fn claim_facts(claim: &ClaimObject) -> ClaimFacts {
    let meta = &claim.metadata;
    let key = ObjectKey::of(meta);
    let spec = claim.spec.as_ref();
    ClaimFacts {
        key,
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(DateTime::<Utc>::MAX_UTC, to_chrono),
        // Only workspace-gc's own annotations are read; others (possibly large) are not kept.
        annotations: meta
            .annotations
            .iter()
            .flatten()
            .filter(|(key, _)| key.starts_with(annotations::PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
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
        requested_bytes: spec
            .and_then(|spec| spec.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| q.0.parse::<Quantity>().ok())
            .map(|q| q.bytes()),
        storage_class: storage_class(claim),
        volume_name: spec
            .and_then(|spec| spec.volume_name.clone())
            .filter(|name| !name.is_empty()),
        reported_in_use: (claim.status.as_ref())
            .and_then(|status| status.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == UNUSED_CONDITION && c.status == "False"),
        provenance: provenance(meta),
    }
}

/// The claim's provenance, from its labels and `managedFields`: read here, once, because the
/// cache keeps neither. Each entry that owns the label is kept with what the record says of it
/// (its operation, and whether it owns the access modes alone or beside other entries);
/// [`crate::decide::provenance`] judges what that proves.
fn provenance(meta: &ObjectMeta) -> Provenance {
    let labels = meta.labels.as_ref();
    let operator_labels = (labels::OPERATOR.iter())
        .all(|(key, value)| labels.and_then(|l| l.get(*key)).map(String::as_str) == Some(value));
    let entries = meta.managed_fields.as_deref().unwrap_or_default();
    if entries.is_empty() {
        return Provenance {
            operator_labels,
            label: LabelHistory::Unrecorded,
        };
    }
    let label_field = format!("f:{}", labels::BUILD_WORKSPACE.0);
    let owns = |entry: &ManagedFieldsEntry, path: &[&str]| {
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        (path.iter())
            .fold(fields, |at, key| at.and_then(|v| v.get(key)))
            .is_some()
    };
    const ACCESS_MODES: &[&str] = &["f:spec", "f:accessModes"];
    let access_mode_owners = (entries.iter())
        .filter(|entry| owns(entry, ACCESS_MODES))
        .count();
    let owners = (entries.iter())
        .filter(|entry| owns(entry, &["f:metadata", "f:labels", &label_field]))
        .map(|entry| {
            let manager = entry.manager.clone().unwrap_or_default();
            let operation = match entry.operation.as_deref() {
                // Whatever its operation says: the name is the server's merge (or a client
                // posing as it), and neither names the write that set the label.
                _ if manager == MERGED_MANAGER => Operation::Merged,
                Some("Update") => Operation::Update,
                Some("Apply") => Operation::Apply,
                _ => Operation::Other,
            };
            let access_modes = match (owns(entry, ACCESS_MODES), access_mode_owners) {
                (false, _) => AccessModes::NotOwned,
                (true, 1) => AccessModes::Alone,
                (true, _) => AccessModes::Shared,
            };
            LabelOwner {
                manager,
                operation,
                access_modes,
            }
        })
        .collect();
    Provenance {
        operator_labels,
        label: LabelHistory::Owners(owners),
    }
}

/// The claim condition Kubernetes 1.37 maintains (KEP-5541): `False` while a pod uses it.
const UNUSED_CONDITION: &str = "Unused";

/// The annotation older claims name their class with; it wins over `spec.storageClassName`.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// The class a claim is counted under by class-scoped quotas, read as Kubernetes' quota
/// evaluator reads it: the beta annotation, else `spec.storageClassName`. A claim that names
/// none is counted by no class-scoped quota. The default class is no help here: the API server
/// writes it into the claim at creation (or the volume controller does later), and until it
/// is written the quota does not count the claim under that class either.
fn storage_class(claim: &ClaimObject) -> Option<String> {
    let annotated = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BETA_STORAGE_CLASS));
    let spec = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_ref());
    annotated
        .or(spec)
        .filter(|class| !class.is_empty())
        .cloned()
}

/// A ResourceQuota's limits that claims count toward, from its status (what the quota
/// controller enforces). Left out, so they never cause a delete: every limit of a quota with
/// scopes (its used counts only some claims, which workspace-gc cannot tell apart), a resource
/// with no used value yet or a value that does not parse, and a hard limit of zero.
pub fn quota_entry(quota: &ResourceQuota) -> QuotaEntry {
    let scoped = quota.spec.as_ref().is_some_and(|spec| {
        spec.scope_selector.is_some() || spec.scopes.as_ref().is_some_and(|s| !s.is_empty())
    });
    let status = quota.status.as_ref().filter(|_| !scoped);
    let used = status.and_then(|s| s.used.as_ref());
    let limits = status
        .and_then(|s| s.hard.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|(name, hard)| {
            let resource = QuotaResource::parse(name)?;
            let hard = quantity::amount(&hard.0).filter(|&h| h > 0)?;
            let used = quantity::amount(&used?.get(name)?.0)?;
            Some(Limit {
                resource,
                hard,
                used,
            })
        })
        .collect();
    QuotaEntry {
        key: ObjectKey::of(&quota.metadata),
        uid: quota.metadata.uid.clone().unwrap_or_default(),
        limits,
    }
}

/// A Namespace's entry: only its workspace-gc annotations are kept.
pub fn namespace_entry(meta: &ObjectMeta) -> NamespaceEntry {
    NamespaceEntry {
        key: ObjectKey::of(meta),
        annotations: (meta.annotations.iter().flatten())
            .filter(|(key, _)| key.starts_with(annotations::PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    }
}

pub fn job_entry(job: &OwnerObject) -> JobEntry {
    let status = job.status.get();
    let progress = match status.and_then(|s| s.phase.get()).map(String::as_str) {
        Some(phase @ ("Succeeded" | "Failed")) => Progress::Finished {
            at: timestamp(status.and_then(|s| s.completion_time.get())),
            failed: phase == "Failed",
        },
        // Every other phase, a legacy one, an unknown one or none yet, is still running.
        _ => Progress::Running,
    };
    JobEntry {
        key: ObjectKey::of(&job.metadata),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        progress,
        volumes: volume_claims(job.spec.get().map_or(&Shape::Absent, |s| &s.pod_config)),
    }
}

/// The claims a job's `spec.podConfig.volumes[]` name. Absent or null fields name none; any
/// other odd shape (a field of the wrong type, a volume that is not an object, a
/// `persistentVolumeClaim` without a string `claimName`) is unreadable, which keeps every claim
/// the job might name while it runs.
fn volume_claims(pod_config: &Shape<PodConfig>) -> VolumeClaims {
    let volumes = match pod_config {
        Shape::Absent => return VolumeClaims::Named(Vec::new()),
        Shape::Is(pod) => &pod.volumes,
        Shape::Odd => return VolumeClaims::Unreadable,
    };
    let volumes = match volumes {
        Shape::Absent => return VolumeClaims::Named(Vec::new()),
        Shape::Is(volumes) => volumes,
        Shape::Odd => return VolumeClaims::Unreadable,
    };
    let mut names = Vec::new();
    for volume in volumes {
        let Shape::Is(volume) = volume else {
            return VolumeClaims::Unreadable;
        };
        match &volume.claim {
            Shape::Absent => {}
            Shape::Is(ClaimRef {
                claim_name: Shape::Is(name),
            }) => names.push(name.clone()),
            _ => return VolumeClaims::Unreadable,
        }
    }
    VolumeClaims::Named(names)
}

/// A PipelineRun's entry.
pub fn run_entry(run: &OwnerObject) -> RunEntry {
    tekton_run_entry(OwnerKind::Run, run)
}

/// A TaskRun's entry: its status and workspaces have the same shape as a PipelineRun's.
pub fn task_run_entry(run: &OwnerObject) -> RunEntry {
    tekton_run_entry(OwnerKind::TaskRun, run)
}

/// The entry of a PipelineRun or TaskRun (`kind`).
pub fn tekton_run_entry(kind: OwnerKind, run: &OwnerObject) -> RunEntry {
    let status = run.status.get();
    let succeeded = (status
        .and_then(|s| s.conditions.get())
        .into_iter()
        .flatten())
    .filter_map(Shape::get)
    .find(|c| c.type_.get().map(String::as_str) == Some("Succeeded"))
    .and_then(|c| c.status.get())
    .map(String::as_str);
    let progress = match succeeded {
        Some(state @ ("True" | "False")) => Progress::Finished {
            at: timestamp(status.and_then(|s| s.completion_time.get())),
            failed: state == "False",
        },
        // `Unknown`, no condition yet (pending) or anything odd: running.
        _ => Progress::Running,
    };
    let claims = (run
        .spec
        .get()
        .and_then(|s| s.workspaces.get())
        .into_iter()
        .flatten())
    .filter_map(|w| w.get()?.claim.get()?.claim_name.get())
    .cloned()
    .collect();
    RunEntry {
        kind,
        key: ObjectKey::of(&run.metadata),
        uid: run.metadata.uid.clone().unwrap_or_default(),
        claims,
        progress,
    }
}

/// A PersistentVolume's facts for [`crate::decide::volumes`]. Read from the untyped object, so a
/// `status.lastPhaseTransitionTime` that does not parse keeps that volume alone (the typed one
/// would fail the whole list).
pub fn volume_facts(volume: &kube::api::DynamicObject) -> VolumeFacts {
    let meta = &volume.metadata;
    let text = |value: &Value| value.as_str().map(str::to_owned);
    let (spec, status) = (&volume.data["spec"], &volume.data["status"]);
    let transition = match &status["lastPhaseTransitionTime"] {
        Value::Null => Transition::Missing,
        Value::String(raw) => DateTime::parse_from_rfc3339(raw).map_or_else(
            |_| Transition::Unparsable(raw.clone()),
            |at| Transition::At(at.with_timezone(&Utc)),
        ),
        other => Transition::Unparsable(other.to_string()),
    };
    VolumeFacts {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        being_deleted: meta.deletion_timestamp.is_some(),
        reclaim_policy: text(&spec["persistentVolumeReclaimPolicy"]),
        phase: text(&status["phase"]),
        claim_uid: text(&spec["claimRef"]["uid"]),
        marked_claim_uid: (meta.annotations.as_ref())
            .and_then(|notes| notes.get(annotations::DELETED_CLAIM_UID).cloned()),
        transition,
    }
}

pub fn pod_entry(pod: &PodVolumes) -> PodEntry {
    PodEntry {
        key: ObjectKey::of(&pod.metadata),
        phase: pod.status.phase.clone(),
        claims: pod
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect(),
    }
}

/// An RFC 3339 string; anything else is treated as no timestamp (which keeps the claim). Go's
/// zero time (`0001-01-01T00:00:00Z`, what a Go client writes for an unset `metav1.Time` that
/// is not a pointer) is no timestamp either: no build finished then.
fn timestamp(text: Option<&String>) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .filter(|t| t.timestamp() != GO_ZERO_TIME_SECONDS)
}

/// `0001-01-01T00:00:00Z` in Unix seconds.
const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::super::tests::owner;
    use super::*;

    #[test]
    fn runs_finish_on_the_succeeded_condition() {
        let run = owner(json!({
            "metadata": {"name": "nb-build", "namespace": "ml", "uid": "r1"},
            "spec": {"workspaces": [
                {"name": "shared-workspace", "persistentVolumeClaim": {"claimName": "nb-build-workspace"}},
                {"name": "cfg", "configMap": {"name": "x"}}
            ]},
            "status": {
                "conditions": [{"type": "Succeeded", "status": "False", "reason": "PipelineRunTimeout"}],
                "completionTime": "2026-11-01T12:00:00Z"
            }
        }));
        let entry = run_entry(&run);
        assert_eq!(entry.claims, vec!["nb-build-workspace".to_owned()]);
        assert_eq!(
            entry.progress,
            Progress::Finished {
                at: Some(Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap()),
                failed: true,
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
            let run = owner(
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
            let job =
                owner(json!({"metadata": {"name": "j", "namespace": "ml"}, "status": status}));
            assert_eq!(job_entry(&job).progress, Progress::Running, "{status}");
        }
    }

    #[test]
    fn a_job_names_the_claims_of_its_own_volumes_and_odd_shapes_are_unreadable() {
        let volumes_of = |spec: Value| {
            job_entry(&owner(
                json!({"metadata": {"name": "b", "namespace": "ml"}, "spec": spec}),
            ))
            .volumes
        };
        let named = |names: &[&str]| {
            VolumeClaims::Named(names.iter().map(|name| (*name).to_owned()).collect())
        };
        assert_eq!(
            volumes_of(json!({"notebook": {}, "podConfig": {"volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "a-build-workspace"}},
                {"name": "cfg", "configMap": {"name": "x"}},
                {"name": "none", "persistentVolumeClaim": null}
            ]}})),
            named(&["a-build-workspace"])
        );
        for spec in [
            json!({}),
            json!({"podConfig": null}),
            json!({"podConfig": {"containerImage": "x"}}),
            json!({"podConfig": {"volumes": null}}),
        ] {
            assert_eq!(volumes_of(spec.clone()), named(&[]), "{spec}");
        }
        for spec in [
            json!({"podConfig": "x"}),
            json!({"podConfig": {"volumes": "a-build-workspace"}}),
            json!({"podConfig": {"volumes": {"persistentVolumeClaim": {"claimName": "a"}}}}),
            json!({"podConfig": {"volumes": ["a-build-workspace"]}}),
            json!({"podConfig": {"volumes": [{"persistentVolumeClaim": {"claimName": 7}}]}}),
            json!({"podConfig": {"volumes": [{"persistentVolumeClaim": {}}]}}),
            json!({"podConfig": {"volumes": [{"persistentVolumeClaim": "a"}]}}),
        ] {
            assert_eq!(volumes_of(spec.clone()), VolumeClaims::Unreadable, "{spec}");
        }
    }

    #[test]
    fn only_an_unused_condition_that_is_false_reports_use() {
        let reported = |conditions: Value| {
            let claim: ClaimObject = serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "ml"},
                "status": {"conditions": conditions}
            }))
            .unwrap();
            claim_facts(&claim).reported_in_use
        };
        let condition = |kind: &str, status: &str| json!({"type": kind, "status": status});
        assert!(reported(json!([
            condition("Resizing", "True"),
            condition("Unused", "False")
        ])));
        for conditions in [
            json!([]),
            json!(null),
            json!([condition("Unused", "True")]),
            json!([condition("Unused", "Unknown")]),
            json!([condition("Resizing", "False")]),
        ] {
            assert!(!reported(conditions.clone()), "{conditions}");
        }
    }

    #[test]
    fn a_finished_job_with_a_malformed_completion_time_has_none() {
        let job = owner(json!({"metadata": {"name": "j", "namespace": "ml"},
                   "status": {"phase": "Succeeded", "completionTime": "yesterday"}}));
        assert_eq!(
            job_entry(&job).progress,
            Progress::Finished {
                at: None,
                failed: false
            }
        );
    }

    #[test]
    fn go_zero_time_is_no_completion_time() {
        for at in ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000000Z"] {
            let run = owner(json!({"metadata": {"name": "t", "namespace": "ml"},
                       "status": {"completionTime": at,
                                  "conditions": [{"type": "Succeeded", "status": "True"}]}}));
            let entry = task_run_entry(&run);
            assert_eq!(entry.kind, OwnerKind::TaskRun);
            let progress = Progress::Finished {
                at: None,
                failed: false,
            };
            assert_eq!(entry.progress, progress, "{at}");
        }
    }

    #[test]
    fn runs_skip_workspaces_and_conditions_of_odd_shapes() {
        let run = owner(json!({
            "metadata": {"name": "r", "namespace": "ml"},
            "spec": {"workspaces": [7, null, {"persistentVolumeClaim": "c"},
                                    {"persistentVolumeClaim": {"claimName": ["c"]}},
                                    {"persistentVolumeClaim": {"claimName": "w"}}]},
            "status": {"completionTime": "2026-11-01T12:00:00Z",
                       "conditions": ["Succeeded", {"type": 1, "status": "True"},
                                      {"type": "Succeeded", "status": "True"}]}
        }));
        let entry = run_entry(&run);
        assert_eq!(entry.claims, ["w"]);
        let at = Some(Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap());
        let failed = false;
        assert_eq!(entry.progress, Progress::Finished { at, failed });
    }

    #[test]
    fn claims_are_counted_under_the_class_quota_counts_them_under() {
        let claim = |value: Value| -> ClaimObject { serde_json::from_value(value).unwrap() };
        let class_of = |value| claim_facts(&claim(value)).storage_class;
        let meta = json!({"name": "c", "namespace": "ml"});
        assert_eq!(class_of(json!({"metadata": meta, "spec": {}})), None);
        assert_eq!(
            class_of(json!({"metadata": meta, "spec": {"storageClassName": ""}})),
            None
        );
        assert_eq!(
            class_of(json!({"metadata": meta, "spec": {"storageClassName": "fast"}})),
            Some("fast".into())
        );
        let annotated = json!({"name": "c", "namespace": "ml",
                               "annotations": {"volume.beta.kubernetes.io/storage-class": "old"}});
        assert_eq!(
            class_of(json!({"metadata": annotated, "spec": {"storageClassName": "fast"}})),
            Some("old".into())
        );
    }

    #[test]
    fn quotas_keep_only_what_claims_count_toward_and_can_be_judged() {
        let quota = |value: Value| -> ResourceQuota { serde_json::from_value(value).unwrap() };
        let entry = quota_entry(&quota(json!({
            "metadata": {"name": "q", "namespace": "ml", "uid": "u"},
            "spec": {"hard": {"requests.storage": "10Gi"}},
            "status": {
                "hard": {"requests.storage": "10Gi", "persistentvolumeclaims": "5",
                         "fast.storageclass.storage.k8s.io/requests.storage": "2Gi",
                         "requests.cpu": "4", "pods": "0", "count/persistentvolumeclaims": "1",
                         "slow.storageclass.storage.k8s.io/persistentvolumeclaims": "3"},
                "used": {"requests.storage": "0", "persistentvolumeclaims": "5",
                         "fast.storageclass.storage.k8s.io/requests.storage": "bogus",
                         "requests.cpu": "1", "pods": "0"}
            }
        })));
        assert_eq!(
            entry.limits,
            vec![
                Limit {
                    resource: QuotaResource::Claims,
                    hard: 5,
                    used: 5
                },
                Limit {
                    resource: QuotaResource::Storage,
                    hard: 10 << 30,
                    used: 0
                },
            ]
        );
        for odd in [
            json!({"metadata": {"name": "q"}}),
            json!({"metadata": {"name": "q"}, "status": {"hard": {"requests.storage": "0"},
                                                     "used": {"requests.storage": "1Gi"}}}),
            json!({"metadata": {"name": "q"}, "status": {"hard": {"requests.storage": "1Gi"}}}),
            json!({"metadata": {"name": "q"}, "spec": {"scopes": ["Terminating"]},
                   "status": {"hard": {"requests.storage": "1Gi"},
                              "used": {"requests.storage": "1Gi"}}}),
        ] {
            assert!(quota_entry(&quota(odd.clone())).limits.is_empty(), "{odd}");
        }
    }
}
