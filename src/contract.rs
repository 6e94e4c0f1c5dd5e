//! The contract workspace-gc rests on: what the jupyter-notebook-validator-operator and Tekton
//! put on the objects it reads (ADR-040), and the annotation keys workspace-gc itself reads and
//! writes. Linking, the creator, the configuration and the audit all take these from here, so a
//! change on the operator's side is one change here.

use serde::Serialize;

/// The API group of the operator's `NotebookValidationJob`.
pub const JOB_GROUP: &str = "mlops.mlops.dev";
/// The version of `NotebookValidationJob` workspace-gc reads.
pub const JOB_VERSION: &str = "v1alpha1";
/// The older Tekton version whose PipelineRuns and TaskRuns carry every field workspace-gc
/// reads at the same path as [`RUN_VERSION`]'s: `spec.workspaces[].persistentVolumeClaim
/// .claimName`, `status.conditions[type=Succeeded]`, `status.completionTime`, and the metadata.
/// Older Tekton releases serve only it, and an OpenShift Pipelines upgrade can leave one CRD
/// serving only it for a while.
pub const RUN_VERSION_BETA: &str = "v1beta1";
/// The kind of the operator's custom resource.
pub const JOB_KIND: &str = "NotebookValidationJob";
/// Tekton's API group.
pub const RUN_GROUP: &str = "tekton.dev";
/// The version of PipelineRun and TaskRun workspace-gc reads.
pub const RUN_VERSION: &str = "v1";
/// Tekton's PipelineRun kind.
pub const RUN_KIND: &str = "PipelineRun";
/// Tekton's TaskRun kind: it binds a claim the same way a PipelineRun does.
pub const TASK_RUN_KIND: &str = "TaskRun";

/// The kinds that can own a build's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum OwnerKind {
    Job,
    /// A Tekton PipelineRun.
    Run,
    /// A Tekton TaskRun.
    TaskRun,
}

impl OwnerKind {
    /// Every owner kind.
    pub const ALL: [OwnerKind; 3] = [OwnerKind::Job, OwnerKind::Run, OwnerKind::TaskRun];

    /// Its API group.
    pub fn group(self) -> &'static str {
        match self {
            OwnerKind::Job => JOB_GROUP,
            OwnerKind::Run | OwnerKind::TaskRun => RUN_GROUP,
        }
    }

    /// The versions of the kind whose fields workspace-gc reads, the one it prefers first. A
    /// version not listed may move or retype a field, so its objects are never read.
    pub fn readable_versions(self) -> &'static [&'static str] {
        match self {
            OwnerKind::Job => &[JOB_VERSION],
            OwnerKind::Run | OwnerKind::TaskRun => &[RUN_VERSION, RUN_VERSION_BETA],
        }
    }

    /// Whether a cluster may lack the kind altogether: then no such object exists. Without
    /// the operator's or Tekton's PipelineRun CRD no build runs at all, so their absence is a
    /// broken install, whose facts are unknown.
    pub fn optional(self) -> bool {
        self == OwnerKind::TaskRun
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::Job => JOB_KIND,
            OwnerKind::Run => RUN_KIND,
            OwnerKind::TaskRun => TASK_RUN_KIND,
        }
    }

    /// The owner kind of an `apiVersion` and `kind`, matched on group and kind: any version
    /// names the same object.
    pub fn of(api_version: &str, kind: &str) -> Option<OwnerKind> {
        let group = api_version.split_once('/').map_or("", |(group, _)| group);
        match (group, kind) {
            (JOB_GROUP, JOB_KIND) => Some(OwnerKind::Job),
            (RUN_GROUP, RUN_KIND) => Some(OwnerKind::Run),
            (RUN_GROUP, TASK_RUN_KIND) => Some(OwnerKind::TaskRun),
            _ => None,
        }
    }
}

/// The operator's names: job `{job}` builds in PipelineRun `{job}-build` on the claim
/// `{job}-build-workspace`.
pub mod naming {
    /// The suffix the operator appends to a job's name to name its workspace claim.
    pub const CLAIM_SUFFIX: &str = "-build-workspace";
    /// The suffix the operator appends to a job's name to name its PipelineRun.
    const RUN_SUFFIX: &str = "-build";

    /// The workspace claim of job `job`.
    pub fn claim(job: &str) -> String {
        format!("{job}{CLAIM_SUFFIX}")
    }

    /// The PipelineRun of job `job`.
    pub fn run(job: &str) -> String {
        format!("{job}{RUN_SUFFIX}")
    }

    /// The job whose workspace claim is named `claim`, if the name follows the convention.
    pub fn job_of_claim(claim: &str) -> Option<&str> {
        claim
            .strip_suffix(CLAIM_SUFFIX)
            .filter(|job| !job.is_empty())
    }

    /// The job whose PipelineRun is named `run`, if the name follows the convention.
    pub fn job_of_run(run: &str) -> Option<&str> {
        run.strip_suffix(RUN_SUFFIX).filter(|job| !job.is_empty())
    }
}

/// The name of the label guard's ValidatingAdmissionPolicy and of its binding (rendered by
/// `src/surface/admission.rs`): the daemon reads the two by this name, and the shipped roles
/// grant `get` on it alone.
pub const LABEL_GUARD: &str = "workspace-gc-label-guard";

/// The labels on a build's workspace claim.
pub mod labels {
    /// The label the operator puts on every build-workspace claim, and its value: what
    /// workspace-gc selects on by default.
    pub const BUILD_WORKSPACE: (&str, &str) = ("mlops.redhat.com/build-workspace", "true");

    /// Every label the operator puts on a build-workspace claim (ADR-040).
    pub const OPERATOR: [(&str, &str); 3] = [
        (
            "app.kubernetes.io/managed-by",
            "jupyter-notebook-validator-operator",
        ),
        ("app.kubernetes.io/component", "tekton-build"),
        BUILD_WORKSPACE,
    ];

    /// Names the job a created claim belongs to, for label selectors (set by `create`).
    pub const JOB: &str = "mlops.redhat.com/notebook-validation-job";
}

/// The annotation keys workspace-gc reads on claims, and the one it writes on its Lease.
pub mod annotations {
    /// The prefix of every workspace-gc annotation.
    pub const PREFIX: &str = "workspace-gc.mlops.dev/";
    /// Time to keep the workspace after the build finished, in humantime form (`30m`, `2d`).
    pub const TTL: &str = "workspace-gc.mlops.dev/ttl";
    /// Absolute RFC 3339 instant after which the claim is deleted, unless in use.
    pub const EXPIRES: &str = "workspace-gc.mlops.dev/expires";
    /// `"true"` keeps the claim forever (to debug a build); `"false"` is the same as absent.
    pub const KEEP: &str = "workspace-gc.mlops.dev/keep";
    /// On a Namespace: its own policy durations (humantime), within the cluster's bounds.
    pub const NS_TTL_AFTER_FINISHED: &str = "workspace-gc.mlops.dev/ttl-after-finished";
    pub const NS_TTL_AFTER_FAILED: &str = "workspace-gc.mlops.dev/ttl-after-failed";
    pub const NS_ORPHAN_GRACE: &str = "workspace-gc.mlops.dev/orphan-grace";
    pub const NS_MAX_AGE: &str = "workspace-gc.mlops.dev/max-age";
    /// How many of the namespace's newest failed builds keep their workspaces, at least the
    /// cluster's `keep_failed`.
    pub const NS_KEEP_FAILED: &str = "workspace-gc.mlops.dev/keep-failed";
    /// On a Namespace: `"false"` switches collection off there; `"true"` is the same as absent.
    pub const NS_COLLECT: &str = "workspace-gc.mlops.dev/collect";
    /// On the leader-election Lease: the blast-radius cap's count of recent deletions.
    pub const DELETIONS: &str = "workspace-gc.mlops.dev/deletions";
    /// On the leader-election Lease: quota pressure's rounds, written with the count.
    pub const QUOTA_ROUNDS: &str = "workspace-gc.mlops.dev/quota-rounds";
    /// On the leader-election Lease: the claim DELETEs that may still reach the API server
    /// (sent, and not answered for certain), so that whoever leads next revokes them.
    pub const DELETES_IN_FLIGHT: &str = "workspace-gc.mlops.dev/deletes-in-flight";
    /// On a `Retain` PersistentVolume (with `deletion.released_volume_ttl`): the UID of the
    /// claim workspace-gc deleted, written once that claim's DELETE was answered with success. Only a volume whose
    /// `spec.claimRef.uid` equals it may be deleted once `Released`.
    pub const DELETED_CLAIM_UID: &str = "workspace-gc.mlops.dev/deleted-claim-uid";
    /// On a claim, written by workspace-gc alone: the resourceVersion of a DELETE of it that
    /// got no definite answer, a `/` and a nonce ([`revocation`]). Writing it gives the claim
    /// a new resourceVersion, so that DELETE fails its precondition (409) whenever it reaches
    /// the API server. Never read as policy. Outside [`PREFIX`]: a version from before the revocation (7c806ec and earlier)
    /// takes any unknown key under the prefix for an invalid annotation and keeps the claim
    /// for good, so a downgrade to it would strand every claim ever revoked; one outside the
    /// prefix it ignores.
    pub const REVOKED: &str = "revocation.workspace-gc.mlops.dev/revoked-delete";
    /// Where versions before [`REVOKED`] moved out of [`PREFIX`] wrote it: read as known (never
    /// an invalid annotation), and the guard admits a revocation under it, so those versions
    /// still revoke during a rolling upgrade. Never written.
    pub const REVOKED_UNDER_PREFIX: &str = "workspace-gc.mlops.dev/revoked-delete";

    /// The value [`REVOKED`] is written with: the revoked DELETE's resourceVersion, `/`, and a
    /// nonce no one can foresee. Anyone who may annotate the claim could pre-set the version
    /// alone (the claim's next resourceVersion is foreseeable): writing a value already there
    /// changes nothing, and the DELETE could still land.
    pub fn revocation(resource_version: &str, nonce: u64) -> String {
        format!("{resource_version}/{nonce:016x}")
    }

    /// The resourceVersion of the DELETE a [`REVOKED`] value revokes: what comes before its
    /// last `/` (the nonce has none), or the whole value, as versions before wrote it.
    pub fn revoked_version(value: &str) -> &str {
        value.rsplit_once('/').map_or(value, |(version, _)| version)
    }
}
