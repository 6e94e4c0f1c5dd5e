//! The edge between API objects and facts: the two owner kinds' API resources, and the
//! conversion of claims, PipelineRuns, NotebookValidationJobs and pods into the small entries
//! the cache keeps. Timestamps become `chrono` here, once.
//!
//! Claims, owners and pods are decoded into types that hold only the fields their entries read
//! ([`ClaimObject`], [`OwnerObject`], [`PodVolumes`]); the parser skips the rest. An owner's
//! fields are read leniently ([`Shape`]), so that an owner with odd or missing fields still
//! converts (to a state that keeps the claim) instead of failing a whole list.
//!
//! This file holds the API resources and those slim decode types. Apart from it: `entries.rs`
//! (the decoded objects into the cache's entries and the decision's facts) and `shape.rs` (the
//! lenient reading of a JSON value, which knows nothing of Kubernetes).

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::{NamespaceResourceScope, Resource as _};
use kube::Resource;
use kube::api::{ApiResource, GroupVersionKind};
use kube::core::DynamicResourceScope;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess};

use crate::contract::{
    JOB_GROUP, JOB_KIND, JOB_VERSION, OwnerKind, RUN_GROUP, RUN_KIND, RUN_VERSION, TASK_RUN_KIND,
};

mod entries;
mod shape;

pub use entries::{
    claim_facts, job_entry, namespace_entry, pod_entry, quota_entry, run_entry, task_run_entry,
    tekton_run_entry, volume_facts,
};
pub use shape::Shape;
use shape::{Shaped, fields, shaped_struct};

/// The API of a namespaced kind in one namespace, or the whole cluster (`None`): a watch's
/// scope.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => kube::Api::namespaced(client.clone(), namespace),
        None => kube::Api::all(client.clone()),
    }
}

/// The API of an owner kind (`resource`: NotebookValidationJobs, PipelineRuns, TaskRuns) in
/// one namespace, or the whole cluster (`None`).
pub fn owner_api(
    client: &kube::Client,
    namespace: Option<&str>,
    resource: &ApiResource,
) -> kube::Api<OwnerObject> {
    match namespace {
        Some(namespace) => kube::Api::namespaced_with(client.clone(), namespace, resource),
        None => kube::Api::all_with(client.clone(), resource),
    }
}

/// `mlops.mlops.dev/v1alpha1` NotebookValidationJob.
pub fn job_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(JOB_GROUP, JOB_VERSION, JOB_KIND),
        "notebookvalidationjobs",
    )
}

/// `tekton.dev/v1` PipelineRun.
pub fn run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(RUN_GROUP, RUN_VERSION, RUN_KIND),
        "pipelineruns",
    )
}

/// `tekton.dev/v1` TaskRun.
pub fn task_run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(RUN_GROUP, RUN_VERSION, TASK_RUN_KIND),
        "taskruns",
    )
}

/// The API resource of a run kind ([`OwnerKind::Run`] or [`OwnerKind::TaskRun`]).
pub fn run_kind_resource(kind: OwnerKind) -> ApiResource {
    match kind {
        OwnerKind::TaskRun => task_run_resource(),
        OwnerKind::Run | OwnerKind::Job => run_resource(),
    }
}

/// A 404 on a list or a watch: the kind is not served at the version asked (its CRD is not
/// installed, or does not serve that version). Judged by the code alone: for a kind that is
/// not served the API server answers a plain-text "404 page not found", which carries no
/// `NotFound` reason.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
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

pub fn volume_resource() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::PersistentVolume>(&())
}

/// A `deserialize_with` function (`$name`) that reads the listed fields of an `ObjectMeta`, by
/// their API names and types, and skips the rest (managed fields above all) unallocated.
macro_rules! slim_meta {
    ($name:ident { $($field:ident: $type:ty),* $(,)? }) => {
        fn $name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Fields {
                $($field: Option<$type>,)*
            }
            let Fields { $($field),* } = Fields::deserialize(d)?;
            Ok(ObjectMeta {
                $($field,)*
                ..ObjectMeta::default()
            })
        }
    };
}

/// A claim as workspace-gc reads it: the metadata the facts keep (labels and managed fields
/// only as long as it takes to read its provenance), and of the rest only
/// `spec.{resources.requests, storageClassName, volumeName}` and `status.conditions`' types and
/// statuses. Watching claims decodes into this instead of `PersistentVolumeClaim`, so the rest
/// of the status is skipped by the parser. The fields read keep their API types, so a claim
/// the full type would refuse for them is refused as before.
#[derive(Debug, Clone, Deserialize)]
pub struct ClaimObject {
    #[serde(deserialize_with = "claim_meta")]
    metadata: ObjectMeta,
    spec: Option<ClaimSpec>,
    status: Option<ClaimStatus>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimSpec {
    resources: Option<ClaimResources>,
    storage_class_name: Option<String>,
    volume_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimResources {
    requests: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimStatus {
    conditions: Option<Vec<ClaimCondition>>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

// A claim's metadata: identity and version, and what its facts keep.
slim_meta!(claim_meta {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
    creation_timestamp: Time,
    deletion_timestamp: Time,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerReference>,
    labels: BTreeMap<String, String>,
    managed_fields: Vec<ManagedFieldsEntry>,
});

/// A NotebookValidationJob, PipelineRun or TaskRun as workspace-gc reads it: its identity and,
/// of the rest, only `spec.{workspaces, podConfig.volumes}` and `status.{phase,
/// completionTime, conditions}`. Owners are listed and watched by the thousand, and an owner's
/// bulk (managed fields, labels, a PipelineRun's inlined pipeline spec and child references,
/// a condition's reason and message) is skipped by the parser rather than allocated and
/// dropped. Every field below the top is read as a [`Shape`], because an owner of any shape
/// must still decode: a `status` that is not an object, or odd fields in it, convert to a
/// state that keeps the claim.
#[derive(Debug, Clone, Deserialize)]
pub struct OwnerObject {
    #[serde(deserialize_with = "identity_only")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Shape<OwnerSpec>,
    #[serde(default)]
    status: Shape<OwnerStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct OwnerSpec {
    /// A PipelineRun's or TaskRun's.
    workspaces: Shape<Vec<Shape<Mount>>>,
    /// A NotebookValidationJob's.
    pod_config: Shape<PodConfig>,
}
shaped_struct!(OwnerSpec {
    workspaces: "workspaces",
    pod_config: "podConfig"
});

/// A run's workspace or a job's volume: the claim it binds, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Mount {
    claim: Shape<ClaimRef>,
}
shaped_struct!(Mount {
    claim: "persistentVolumeClaim"
});

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PodConfig {
    volumes: Shape<Vec<Shape<Mount>>>,
}
shaped_struct!(PodConfig { volumes: "volumes" });

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ClaimRef {
    claim_name: Shape<String>,
}
shaped_struct!(ClaimRef {
    claim_name: "claimName"
});

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct OwnerStatus {
    /// A NotebookValidationJob's.
    phase: Shape<String>,
    completion_time: Shape<String>,
    /// A PipelineRun's or TaskRun's.
    conditions: Shape<Vec<Shape<Condition>>>,
}
shaped_struct!(OwnerStatus {
    phase: "phase",
    completion_time: "completionTime",
    conditions: "conditions",
});

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Condition {
    type_: Shape<String>,
    status: Shape<String>,
}
shaped_struct!(Condition {
    type_: "type",
    status: "status"
});

impl Resource for OwnerObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(resource: &ApiResource) -> Cow<'_, str> {
        resource.kind.as_str().into()
    }

    fn group(resource: &ApiResource) -> Cow<'_, str> {
        resource.group.as_str().into()
    }

    fn version(resource: &ApiResource) -> Cow<'_, str> {
        resource.version.as_str().into()
    }

    fn api_version(resource: &ApiResource) -> Cow<'_, str> {
        resource.api_version.as_str().into()
    }

    fn plural(resource: &ApiResource) -> Cow<'_, str> {
        resource.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A pod as workspace-gc reads it: name, the claims its volumes mount, and its phase. Listing
/// and watching pods decode into this instead of `Pod`, so the rest of each pod (containers,
/// managed fields, status details) is skipped by the parser rather than allocated and dropped:
/// pods are the largest and most numerous objects read.
#[derive(Debug, Clone, Deserialize)]
pub struct PodVolumes {
    #[serde(deserialize_with = "identity_only")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: PodVolumesSpec,
    #[serde(default)]
    status: PodPhase,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct PodVolumesSpec {
    #[serde(default)]
    volumes: Vec<Volume>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Volume {
    #[serde(default, rename = "persistentVolumeClaim")]
    claim: Option<ClaimSource>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimSource {
    #[serde(rename = "claimName")]
    claim_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct PodPhase {
    phase: Option<String>,
}

// The metadata the watcher and the cache need: identity and version.
slim_meta!(identity_only {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
});

/// The `kube::Resource` of a slim decode type of a core kind (`$full`, the full type).
macro_rules! core_resource {
    ($slim:ty, $full:ty) => {
        impl Resource for $slim {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$full>::KIND.into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                <$full>::GROUP.into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                <$full>::VERSION.into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                <$full>::URL_PATH_SEGMENT.into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

core_resource!(PodVolumes, Pod);
core_resource!(ClaimObject, PersistentVolumeClaim);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::annotations;
    use crate::decide::facts::{
        AccessModes, LabelHistory, LabelOwner, ObjectKey, Operation, PodEntry, Provenance,
    };
    use chrono::TimeZone;
    use serde_json::{Value, json};

    pub(super) fn owner(value: Value) -> OwnerObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn owners_decode_to_the_fields_read_only() {
        let run = owner(json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "r", "namespace": "ml", "uid": "u", "resourceVersion": "7",
                         "managedFields": [{"manager": "tekton", "fieldsV1": {"f:status": {}}}]},
            "spec": {"pipelineSpec": {"tasks": [{"name": "t"}]},
                     "workspaces": [{"name": "w", "persistentVolumeClaim": {"claimName": "c"}}]},
            "status": {"childReferences": [{"name": "r-t"}], "completionTime": null,
                       "conditions": [{"type": "Succeeded", "status": "Unknown"}]}
        }));
        assert_eq!(run.meta().resource_version.as_deref(), Some("7"));
        assert!(run.meta().managed_fields.is_none(), "only identity is kept");
        let spec = run.spec.get().unwrap();
        assert_eq!(spec.pod_config, Shape::Absent);
        let status = run.status.get().unwrap();
        assert_eq!(status.completion_time, Shape::Absent, "null is absent");
        assert_eq!(status.phase, Shape::Absent);
        let conditions = status.conditions.get().unwrap();
        let only = Condition {
            type_: Shape::Is("Succeeded".into()),
            status: Shape::Is("Unknown".into()),
        };
        assert_eq!(
            conditions,
            &[Shape::Is(only)],
            "reason and message are skipped"
        );
        assert_eq!(run_entry(&run).claims, ["c"]);
    }

    #[test]
    fn claims_decode_to_the_fields_their_facts_read() {
        let claim: ClaimObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "ml", "uid": "u", "resourceVersion": "5",
                         "creationTimestamp": "2026-11-01T12:00:00Z",
                         "deletionTimestamp": "2026-11-02T12:00:00Z",
                         "labels": {"mlops.redhat.com/build-workspace": "true"},
                         "annotations": {"workspace-gc.mlops.dev/keep": "true", "other": "x"},
                         "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
                                              "name": "r", "uid": "o", "controller": true}],
                         "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1",
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "conditions": [{"type": "Unused", "status": "False", "reason": "InUse"}]}
        }))
        .unwrap();
        let facts = claim_facts(&claim);
        // Labels and managed fields are kept only as the provenance read from them.
        let provenance = Provenance {
            operator_labels: false,
            label: LabelHistory::Owners(Vec::new()),
        };
        assert_eq!(facts.provenance, provenance);
        assert_eq!(
            (facts.uid.as_str(), facts.resource_version.as_str()),
            ("u", "5")
        );
        assert_eq!(
            facts.created,
            Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap()
        );
        assert_eq!(
            facts.deletion_timestamp,
            Some(Utc.with_ymd_and_hms(2026, 11, 2, 12, 0, 0).unwrap())
        );
        let keep = (annotations::KEEP.to_owned(), "true".to_owned());
        assert_eq!(facts.annotations.into_iter().collect::<Vec<_>>(), [keep]);
        assert_eq!(facts.owner_references[0].uid, "o");
        assert_eq!(facts.requested_bytes, Some(1 << 30));
        assert_eq!(facts.volume_name.as_deref(), Some("pv-1"));
        assert!(facts.reported_in_use);
        // The fields read keep their API types: the full type's verdict on them stands.
        for (odd, refused) in [
            (json!({"creationTimestamp": "yesterday"}), true),
            (json!({"annotations": {"a": 1}}), true),
            (json!({"ownerReferences": [{"name": "r"}]}), false),
            (json!({"ownerReferences": [{"name": 7}]}), true),
            (json!({"labels": {"a": 1}}), true),
            (json!({"managedFields": "x"}), true),
            (json!({"managedFields": [{"manager": 7}]}), true),
            (json!({"managedFields": [{"fieldsV1": "x"}]}), false),
        ] {
            let mut claim = json!({"metadata": {"name": "c", "namespace": "ml"}});
            claim["metadata"]
                .as_object_mut()
                .unwrap()
                .extend(odd.as_object().unwrap().clone());
            let full = serde_json::from_value::<PersistentVolumeClaim>(claim.clone());
            let slim = serde_json::from_value::<ClaimObject>(claim);
            assert_eq!((full.is_err(), slim.is_err()), (refused, refused), "{odd}");
        }
    }

    /// `managedFields` as the API server records them, one of each kind of record: the
    /// operator's create, a create by server-side apply, a GitOps apply of an existing claim
    /// whole or of its labels only, a later `kubectl label`, the server's `ancient-changes`
    /// merge, and none; the API server's own binder owns no label.
    #[test]
    fn a_claims_provenance_is_read_from_who_set_its_label() {
        let label = json!({"f:mlops.redhat.com/build-workspace": {}});
        let entry = |manager: &str, operation: &str, labels: Value, spec: bool| {
            let mut fields = json!({"f:metadata": {"f:labels": labels}});
            if spec {
                fields["f:spec"] = json!({"f:accessModes": {}, "f:resources": {"f:requests": {}}});
            }
            json!({"manager": manager, "operation": operation, "apiVersion": "v1",
                   "fieldsV1": fields})
        };
        let binder = json!({"manager": "kube-controller-manager", "operation": "Update",
                            "fieldsV1": {"f:spec": {"f:volumeName": {}}}});
        let decode = |managed: Value| {
            let mut labels = serde_json::Map::new();
            for (key, value) in crate::contract::labels::OPERATOR {
                labels.insert(key.to_owned(), value.into());
            }
            claim_facts(
                &serde_json::from_value::<ClaimObject>(json!({
                    "metadata": {"name": "nb-build-workspace", "namespace": "ml",
                                 "labels": labels, "managedFields": managed}
                }))
                .unwrap(),
            )
            .provenance
        };
        let owner = |manager: &str, operation, access_modes| LabelOwner {
            manager: manager.to_owned(),
            operation,
            access_modes,
        };
        let owners = |managed: Value| decode(managed).label;
        use AccessModes::{Alone, NotOwned, Shared};
        use Operation::{Apply, Merged, Other, Update};
        let created = |manager: &str| entry(manager, "Update", json!({}), true);

        let operator = decode(json!([
            entry("manager", "Update", label.clone(), true),
            binder.clone()
        ]));
        assert!(operator.operator_labels);
        assert_eq!(operator, Provenance::operator("manager"));
        assert_eq!(
            owners(json!([entry("argocd", "Apply", label.clone(), true)])),
            LabelHistory::Owners(vec![owner("argocd", Apply, Alone)])
        );
        let adopted = json!([
            created("kubectl-create"),
            entry("argocd", "Apply", label.clone(), true)
        ]);
        assert_eq!(
            owners(adopted),
            LabelHistory::Owners(vec![owner("argocd", Apply, Shared)])
        );
        let labels_only = json!([
            created("kubectl-create"),
            entry("flux", "Apply", label.clone(), false)
        ]);
        assert_eq!(
            owners(labels_only),
            LabelHistory::Owners(vec![owner("flux", Apply, NotOwned)])
        );
        let relabelled = json!([
            created("kubectl-create"),
            binder,
            entry("kubectl-label", "Update", label.clone(), false)
        ]);
        assert_eq!(
            owners(relabelled),
            LabelHistory::Owners(vec![owner("kubectl-label", Update, NotOwned)])
        );
        let merged = json!([
            entry("ancient-changes", "Update", label.clone(), true),
            entry("velero", "Update", json!({}), false)
        ]);
        assert_eq!(
            owners(merged),
            LabelHistory::Owners(vec![owner("ancient-changes", Merged, Alone)])
        );
        let posing = json!([entry("ancient-changes", "Apply", label.clone(), true)]);
        assert_eq!(
            owners(posing),
            LabelHistory::Owners(vec![owner("ancient-changes", Merged, Alone)])
        );
        let odd_operation = json!([entry("m", "Patch", label, true)]);
        assert_eq!(
            owners(odd_operation),
            LabelHistory::Owners(vec![owner("m", Other, Alone)])
        );
        assert_eq!(owners(json!([])), LabelHistory::Unrecorded);
        // Fields of an odd shape own nothing: the label has no owner that made the claim.
        assert_eq!(
            owners(json!([{"manager": "m", "fieldsV1": "x"}])),
            LabelHistory::Owners(Vec::new())
        );
        assert_eq!(owners(Value::Null), LabelHistory::Unrecorded);
    }

    #[test]
    fn pods_decode_to_their_claims_and_phase_only() {
        let pod: PodVolumes = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "uid": "u", "resourceVersion": "9",
                         "labels": {"a": "b"}, "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [
                {"name": "ws", "persistentVolumeClaim": {"claimName": "nb-build-workspace"}},
                {"name": "cfg", "configMap": {"name": "x"}}
            ]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert_eq!(pod.meta().resource_version.as_deref(), Some("9"));
        assert!(pod.meta().labels.is_none(), "only identity is kept");
        assert_eq!(
            pod_entry(&pod),
            PodEntry {
                key: ObjectKey::new("ml", "p"),
                phase: Some("Running".into()),
                claims: vec!["nb-build-workspace".into()],
            }
        );
        let bare: PodVolumes =
            serde_json::from_value(json!({"metadata": {"name": "q", "namespace": "ml"}})).unwrap();
        assert_eq!(pod_entry(&bare).claims, Vec::<String>::new());
    }
}
