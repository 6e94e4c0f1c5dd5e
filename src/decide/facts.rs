//! What the policy decides from: plain values about one claim, its linked owners and its users.
//!
//! These types carry no API objects: the edge (`resources`) turns API objects into them,
//! converting timestamps into `chrono` once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::contract::{OwnerKind, naming};

/// Identifies one namespaced object (a claim, a run, a job, a pod).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    /// Interned (`intern`): every cached object and index row holds a key, and a cluster has
    /// few namespaces, so the keys of one namespace share one allocation.
    #[serde(serialize_with = "serialize_str")]
    pub namespace: Arc<str>,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: intern(namespace),
            name: name.to_owned(),
        }
    }

    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

fn serialize_str<S: serde::Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

/// Interned namespace names, pruned of the ones no key holds any more whenever the set has
/// doubled since the last pruning: it stays within twice the namespaces in use, however many
/// come and go.
struct Interned {
    names: BTreeSet<Arc<str>>,
    prune_at: usize,
}

/// Names below which the set is never pruned.
const PRUNE_FLOOR: usize = 64;

static INTERNED: Mutex<Interned> = Mutex::new(Interned {
    names: BTreeSet::new(),
    prune_at: PRUNE_FLOOR,
});

/// The shared copy of `namespace`. Interning changes no behaviour: only where the bytes live.
fn intern(namespace: &str) -> Arc<str> {
    // A panic while holding the lock cannot leave the set inconsistent: take it over.
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(name) = interned.names.get(namespace) {
        return name.clone();
    }
    if interned.names.len() >= interned.prune_at {
        interned.names.retain(|name| Arc::strong_count(name) > 1);
        interned.prune_at = (interned.names.len() * 2).max(PRUNE_FLOOR);
    }
    let name: Arc<str> = Arc::from(namespace);
    interned.names.insert(name.clone());
    name
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An owner reference as the claim carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerRef {
    /// The owner kind, matched on group and kind (any version names the same object).
    pub fn owner_kind(&self) -> Option<OwnerKind> {
        OwnerKind::of(&self.api_version, &self.kind)
    }
}

/// Everything the policy reads about the claim itself (labels are matched by the API server's
/// label selector and kept only as [`Provenance`]; of the annotations only workspace-gc's own
/// are).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimFacts {
    pub key: ObjectKey,
    pub uid: String,
    pub resource_version: String,
    pub created: DateTime<Utc>,
    pub annotations: BTreeMap<String, String>,
    pub owner_references: Vec<OwnerRef>,
    pub deletion_timestamp: Option<DateTime<Utc>>,
    /// `spec.resources.requests.storage` in bytes, when it parses.
    pub requested_bytes: Option<u64>,
    /// The storage class the claim is counted under by class-scoped quotas, as Kubernetes'
    /// quota evaluator reads it; `None` when it names none (such a claim counts toward no
    /// class-scoped quota).
    pub storage_class: Option<String>,
    /// `spec.volumeName`: the PersistentVolume it is bound to, if any.
    pub volume_name: Option<String>,
    /// Its `Unused` condition (Kubernetes 1.37, KEP-5541) is `False`: the API server's
    /// controller saw a pod using it. It only ever keeps a claim: it lags that controller, and
    /// older releases write none.
    pub reported_in_use: bool,
    /// How it came to carry the build-workspace label, read at ingest (the cache drops the
    /// managed fields it is read from).
    pub provenance: Provenance,
}

impl ClaimFacts {
    /// The job name the operator's naming convention implies (`{job}-build-workspace`).
    pub fn conventional_job_name(&self) -> Option<&str> {
        naming::job_of_claim(&self.key.name)
    }
}

#[cfg(test)]
impl ClaimFacts {
    /// A bare claim in namespace `ml` created at the Unix epoch, for unit tests.
    pub(crate) fn example(name: &str) -> Self {
        ClaimFacts {
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            resource_version: "1".into(),
            created: DateTime::<Utc>::UNIX_EPOCH,
            annotations: BTreeMap::new(),
            owner_references: Vec::new(),
            deletion_timestamp: None,
            requested_bytes: None,
            storage_class: None,
            volume_name: None,
            reported_in_use: false,
            provenance: Provenance::operator("example"),
        }
    }
}

/// What a claim's own record says about how it came to carry the build-workspace label, judged
/// by [`crate::decide::provenance`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// Every label of the operator's set ([`crate::contract::labels::OPERATOR`]) is there with
    /// the operator's value.
    pub operator_labels: bool,
    pub label: LabelHistory,
}

impl Provenance {
    /// What the operator's claims carry: its labels, set by the create that made the claim
    /// (one `Update` entry, the only owner of the access modes).
    pub fn operator(manager: &str) -> Self {
        Provenance {
            operator_labels: true,
            label: LabelHistory::Owners(vec![LabelOwner {
                manager: manager.to_owned(),
                operation: Operation::Update,
                access_modes: AccessModes::Alone,
            }]),
        }
    }
}

/// Who set the build-workspace label, from `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "history", content = "owners", rename_all = "kebab-case")]
pub enum LabelHistory {
    /// The claim has no managed fields (a client or a cluster cleared them): who set what
    /// cannot be told.
    Unrecorded,
    /// The entries that own the label's field (none: the record names no owner).
    Owners(Vec<LabelOwner>),
}

/// A `managedFields` entry that owns the build-workspace label, as the record states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabelOwner {
    pub manager: String,
    pub operation: Operation,
    /// Whether the entry owns `spec.accessModes`, which cannot change once the claim exists.
    pub access_modes: AccessModes,
}

/// The operation an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// A create, an update or a non-apply patch: the entry owns only the fields it changed.
    Update,
    /// A server-side apply: the entry owns every field the applier declared, changed or not.
    Apply,
    /// The API server's `ancient-changes` entry: its oldest `Update` entries, merged once a
    /// claim has more than ten, owning the union of their fields.
    Merged,
    /// None, or one this version does not know.
    Other,
}

/// Which entries own `spec.accessModes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessModes {
    /// This entry does not.
    NotOwned,
    /// This entry alone.
    Alone,
    /// This entry and at least one other.
    Shared,
}

/// How a claim was linked to an owner. Every rule adds the owners it finds; docs/policy.md
/// documents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkRule {
    /// The claim's ownerReferences name the owner's UID.
    OwnerReference,
    /// A PipelineRun or TaskRun binds the claim in
    /// `spec.workspaces[].persistentVolumeClaim.claimName`.
    WorkspaceBinding,
    /// The operator's names: `{job}-build-workspace` ↔ job `{job}`, run `{job}-build`.
    Naming,
}

/// Where a NotebookValidationJob, a PipelineRun or a TaskRun stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Progress {
    /// Not finished (or in a state workspace-gc does not recognise, which counts as running).
    Running,
    /// Finished; `at` is the completion time when the object records one. `failed`: a job in
    /// phase `Failed`, or a run whose `Succeeded` condition is `False`.
    Finished {
        at: Option<DateTime<Utc>>,
        failed: bool,
    },
}

/// One linked owner and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub kind: OwnerKind,
    pub name: String,
    pub rule: LinkRule,
    pub state: OwnerState,
}

/// An owner's state as far as it could be established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "presence", rename_all = "kebab-case")]
pub enum OwnerState {
    Present {
        uid: String,
        progress: Progress,
    },
    /// Referenced by UID but no object with that UID exists (deleted, or re-created under the
    /// same name with another UID).
    Gone,
    /// Could not be read (cache not synced, API error): the claim must be kept.
    Unknown {
        why: String,
    },
}

/// A pod that mounts the claim, with its phase as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodUse {
    pub name: String,
    pub phase: Option<String>,
}

impl PodUse {
    /// Pods in `Succeeded` or `Failed` no longer use their volumes; every other phase, including
    /// `Pending`, an unknown one or none yet, does.
    pub fn is_active(&self) -> bool {
        !matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// What is known of the claim's users: the pods that mount it, and the unfinished jobs whose
/// own volumes name it (their validation pods will mount it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "known", rename_all = "kebab-case")]
pub enum Users {
    Known {
        pods: Vec<PodUse>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        jobs: Vec<String>,
    },
    Unknown {
        why: String,
    },
}

/// What the cache and the live re-check keep of a NotebookValidationJob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEntry {
    pub key: ObjectKey,
    pub uid: String,
    pub progress: Progress,
    /// The claims `spec.podConfig.volumes[].persistentVolumeClaim.claimName` names.
    pub volumes: VolumeClaims,
}

/// The claims a job's own volumes name, as far as they could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeClaims {
    Named(Vec<String>),
    /// A field of an odd shape (volumes not a list, a `claimName` not a string): the job may
    /// name any claim of its namespace.
    Unreadable,
}

/// What the cache and the live re-check keep of a PipelineRun or a TaskRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    /// [`OwnerKind::Run`] or [`OwnerKind::TaskRun`].
    pub kind: OwnerKind,
    pub key: ObjectKey,
    pub uid: String,
    /// The claims its workspaces bind.
    pub claims: Vec<String>,
    pub progress: Progress,
}

/// What the cache keeps of a Namespace: its workspace-gc annotations. Cluster-scoped: its key
/// has an empty namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceEntry {
    pub key: ObjectKey,
    pub annotations: BTreeMap<String, String>,
}

/// What the cache keeps of a pod: only whether it may still use the claims it mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    pub key: ObjectKey,
    pub phase: Option<String>,
    pub claims: Vec<String>,
}

/// The most builds a namespace may keep by count (`keep_failed`), and so the most newer failed
/// builds a rank counts: counting stops there.
pub const MAX_KEEP_FAILED: u32 = 1000;

/// Where the claim's build ranks among its namespace's failed builds, for count-based
/// retention. Builds are ranked per owner kind (NotebookValidationJobs, PipelineRuns,
/// TaskRuns), as Tekton's pruner counts runs: a build failed at `T` ranks by how many owners of
/// the same kind in the namespace finished failed strictly after `T`. The rank counts owner
/// objects, never claims, so deleting a claim changes no rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rank", rename_all = "kebab-case")]
pub enum FailedRank {
    /// No present linked owner finished failed.
    NotFailed,
    /// The fewest newer failed owners of one kind, over its failed owners (at most
    /// [`MAX_KEEP_FAILED`]).
    Ranked { newer: u32 },
    /// A failed owner records no completion time, or its kind's owners in the namespace could
    /// not be read.
    Unknown { why: String },
}

/// All facts about one claim at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    pub claim: ClaimFacts,
    pub owners: Vec<Owner>,
    pub users: Users,
    #[serde(skip_serializing_if = "FailedRank::is_not_failed")]
    pub failed_rank: FailedRank,
}

impl FailedRank {
    fn is_not_failed(&self) -> bool {
        *self == FailedRank::NotFailed
    }
}

impl Facts {
    /// The latest completion time a present linked owner records: where a finished build's TTL
    /// starts, and the order in which quota pressure takes finished workspaces.
    pub fn latest_completion(&self) -> Option<DateTime<Utc>> {
        self.owners
            .iter()
            .filter_map(|owner| match &owner.state {
                OwnerState::Present {
                    progress: Progress::Finished { at, .. },
                    ..
                } => *at,
                _ => None,
            })
            .max()
    }

    /// Whether the build failed: a present linked owner finished and failed. Its workspace is
    /// what someone opens to find out why, so `ttl_after_failed` applies instead.
    pub fn build_failed(&self) -> bool {
        self.owners.iter().any(|owner| {
            matches!(
                owner.state,
                OwnerState::Present {
                    progress: Progress::Finished { failed: true, .. },
                    ..
                }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_namespace_share_its_name() {
        let (a, b) = (
            ObjectKey::new("interned", "a"),
            ObjectKey::new("interned", "b"),
        );
        assert!(Arc::ptr_eq(&a.namespace, &b.namespace));
        assert_eq!(&*a.namespace, "interned");
        assert_eq!(a.to_string(), "interned/a");
        assert_eq!(a, ObjectKey::new(&String::from("interned"), "a"));
    }

    #[test]
    fn names_no_key_holds_are_pruned() {
        let held = ObjectKey::new("held-while-others-come-and-go", "a");
        for i in 0..10_000 {
            ObjectKey::new(&format!("gone-{i}"), "a");
        }
        let interned = INTERNED.lock().unwrap();
        // Twice what is held at most (other tests hold a few names at once).
        assert!(interned.names.len() < 1_000, "{}", interned.names.len());
        assert!(interned.names.contains("held-while-others-come-and-go"));
        drop(interned);
        assert!(Arc::ptr_eq(
            &held.namespace,
            &ObjectKey::new("held-while-others-come-and-go", "b").namespace
        ));
    }
}
