//! The edge between API objects and facts: the two owner kinds' API resources, and the
//! conversion of claims, PipelineRuns, NotebookValidationJobs and pods into the small entries
//! the cache keeps. Timestamps become `chrono` here, once.
//!
//! Claims, owners and pods are decoded into types that hold only the fields their entries read
//! ([`ClaimObject`], [`OwnerObject`], [`PodVolumes`]); the parser skips the rest. An owner's
//! fields are read leniently ([`Shape`]), so that an owner with odd or missing fields still
//! converts (to a state that keeps the claim) instead of failing a whole list.

use chrono::{DateTime, Utc};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::{NamespaceResourceScope, Resource as _};
use kube::Resource;
use kube::api::{ApiResource, GroupVersionKind};
use kube::core::DynamicResourceScope;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::config::quantity::{self, Quantity};
use crate::contract::{
    JOB_GROUP, JOB_KIND, JOB_VERSION, OwnerKind, RUN_GROUP, RUN_KIND, RUN_VERSION, TASK_RUN_KIND,
    annotations,
};
use crate::decide::facts::{
    ClaimFacts, JobEntry, NamespaceEntry, ObjectKey, OwnerRef, PodEntry, Progress, RunEntry,
    VolumeClaims,
};
use crate::decide::quota::{Limit, QuotaEntry, Resource as QuotaResource};
use crate::decide::volumes::{Transition, VolumeFacts};

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

/// A claim as workspace-gc reads it: the metadata the facts keep, and of the rest only
/// `spec.{resources.requests, storageClassName, volumeName}` and `status.conditions`' types and
/// statuses. Watching claims decodes into this instead of `PersistentVolumeClaim`, so managed
/// fields, labels and the rest of the status are skipped by the parser. The fields read keep
/// their API types, so a claim the full type would refuse for them is refused as before.
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
});

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

/// A JSON value read as a `T` where it has `T`'s shape, and never an error: `null` or absent is
/// `Absent`, a value of another shape `Odd` (skipped, not allocated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Shape<T> {
    #[default]
    Absent,
    Is(T),
    Odd,
}

impl<T> Shape<T> {
    fn get(&self) -> Option<&T> {
        match self {
            Shape::Is(value) => Some(value),
            Shape::Absent | Shape::Odd => None,
        }
    }
}

/// What a [`Shape`] reads: the JSON values of `T`'s shape. Each reader consumes its value and
/// answers `None` when it does not have the shape.
trait Shaped: Sized {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn from_str(_: &str) -> Option<Self> {
        None
    }
}

impl Shaped for String {
    fn from_str(text: &str) -> Option<Self> {
        Some(text.to_owned())
    }
}

impl<T: Shaped> Shaped for Vec<Shape<T>> {
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Some(items))
    }
}

impl<'de, T: Shaped> Deserialize<'de> for Shape<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(std::marker::PhantomData))
    }
}

struct ShapeVisitor<T>(std::marker::PhantomData<T>);

fn shaped<T>(value: Option<T>) -> Shape<T> {
    value.map_or(Shape::Odd, Shape::Is)
}

impl<'de, T: Shaped> Visitor<'de> for ShapeVisitor<T> {
    type Value = Shape<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::from_map(map).map(shaped)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::from_seq(seq).map(shaped)
    }

    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(shaped(T::from_str(text)))
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Shape::Absent)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Shape::Absent)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }
}

/// Reads the entries of a JSON object named in `names` with `read`, which is given the name
/// and must consume the value; every other entry is skipped unallocated. A name given twice:
/// the last value wins.
fn fields<'de, A: MapAccess<'de>>(
    mut map: A,
    names: &'static [&'static str],
    mut read: impl FnMut(&'static str, &mut A) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    while let Some(name) = map.next_key_seed(FieldName(names))? {
        match name {
            Some(name) => read(name, &mut map)?,
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(())
}

/// A key of a JSON object, as the one of the names it is, if any (compared, not allocated).
struct FieldName(&'static [&'static str]);

impl<'de> serde::de::DeserializeSeed<'de> for FieldName {
    type Value = Option<&'static str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().copied().find(|name| *name == key))
    }
}

/// Implements [`Shaped`] for a struct read from a JSON object: each listed field from its
/// JSON name, as a [`Shape`] (absent ones stay `Absent`).
macro_rules! shaped_struct {
    ($name:ident { $($field:ident: $json:literal),* $(,)? }) => {
        impl Shaped for $name {
            fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
                let mut value = Self::default();
                fields(map, &[$($json),*], |name, map| {
                    match name {
                        $($json => value.$field = map.next_value()?,)*
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(())
                })?;
                Ok(Some(value))
            }
        }
    };
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
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn owner(value: Value) -> OwnerObject {
        serde_json::from_value(value).unwrap()
    }

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
        assert!(claim.meta().labels.is_none() && claim.meta().managed_fields.is_none());
        let facts = claim_facts(&claim);
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
