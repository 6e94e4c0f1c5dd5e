//! Builders for the objects workspace-gc reads, shaped like the ones the
//! jupyter-notebook-validator-operator and Tekton create. Each `create` returns the object as the
//! API server stored it; status is always written through the status subresource, as the real
//! controllers do.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use super::TestNamespace;
pub use super::shapes::BUILD_WORKSPACE_LABEL;
use super::shapes::{OPERATOR_CLAIM_LABELS, claim_spec, pod_spec, succeeded_condition, timestamp};

/// `mlops.mlops.dev/v1alpha1` `NotebookValidationJob` (tests/crds).
pub fn notebook_validation_job_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("mlops.mlops.dev", "v1alpha1", "NotebookValidationJob"),
        "notebookvalidationjobs",
    )
}

/// `tekton.dev/v1` `PipelineRun` (tests/crds).
pub fn pipeline_run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tekton.dev", "v1", "PipelineRun"),
        "pipelineruns",
    )
}

/// `tekton.dev/v1` `TaskRun` (tests/crds).
pub fn task_run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tekton.dev", "v1", "TaskRun"),
        "taskruns",
    )
}

/// `tekton.dev/v1` `Pipeline` (the real Tekton's CRDs).
pub fn pipeline_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tekton.dev", "v1", "Pipeline"),
        "pipelines",
    )
}

/// Creates object `name` of `resource` with `labels` and `spec`, as the operator creates its
/// Pipelines and runs for the real Tekton (which writes their status).
pub async fn create_with_spec(
    ns: &TestNamespace,
    resource: &ApiResource,
    name: &str,
    labels: Value,
    spec: Value,
) {
    let mut object = DynamicObject::new(name, resource);
    object.metadata.labels = serde_json::from_value(labels).expect("labels are strings");
    object.data = json!({ "spec": spec });
    (ns.dynamic_api(resource)
        .create(&PostParams::default(), &object))
    .await
    .unwrap_or_else(|e| panic!("create {} {name}: {e}", resource.kind));
}

/// The `Succeeded` condition's status and reason of the PipelineRun or TaskRun `name`, as Tekton
/// wrote it.
pub async fn run_condition(
    ns: &TestNamespace,
    resource: &ApiResource,
    name: &str,
) -> Option<(String, String)> {
    let object = (ns.dynamic_api(resource).get_opt(name).await)
        .unwrap_or_else(|e| panic!("get {} {name}: {e}", resource.kind))?;
    let conditions = object.data["status"]["conditions"].as_array()?.clone();
    let succeeded = conditions.iter().find(|c| c["type"] == "Succeeded")?;
    Some((
        succeeded["status"].as_str()?.to_owned(),
        succeeded["reason"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Creates a custom object, then writes `status` (if any) through the status subresource: the
/// main resource ignores status for CRDs that declare the subresource.
async fn create_dynamic(
    ns: &TestNamespace,
    resource: &ApiResource,
    name: &str,
    labels: BTreeMap<String, String>,
    spec: Value,
    status: Option<Value>,
) -> DynamicObject {
    let api: Api<DynamicObject> = ns.dynamic_api(resource);
    let mut object = DynamicObject::new(name, resource).data(json!({ "spec": spec }));
    object.metadata.labels = Some(labels).filter(|labels| !labels.is_empty());
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {} {}/{name}: {e}", resource.kind, ns.name()));
    match status {
        None => created,
        Some(status) => {
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("set status of {} {}/{name}: {e}", resource.kind, ns.name()))
        }
    }
}

/// A `NotebookValidationJob`; without further calls it has no status at all, as right after
/// creation.
pub struct JobBuilder {
    name: String,
    status: serde_json::Map<String, Value>,
    pod_config: Option<Value>,
}

impl JobBuilder {
    pub fn new(name: &str) -> Self {
        JobBuilder {
            name: name.to_owned(),
            status: serde_json::Map::new(),
            pod_config: None,
        }
    }

    /// `spec.podConfig.volumes[]`: one volume per claim, as a user names them.
    pub fn volume_claims(self, claims: &[&str]) -> Self {
        let volumes: Vec<Value> = (claims.iter().enumerate())
            .map(|(i, c)| json!({"name": format!("data-{i}"), "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        self.pod_config(json!({ "volumes": volumes }))
    }

    /// `spec.podConfig` as given, odd shapes included.
    pub fn pod_config(mut self, pod_config: Value) -> Self {
        self.pod_config = Some(pod_config);
        self
    }

    /// `status.phase`: `Initializing`, `Building`, `BuildComplete`, `ValidationRunning`,
    /// `Succeeded`, `Failed` (or legacy `Pending`, `Running`).
    pub fn phase(mut self, phase: &str) -> Self {
        self.status.insert("phase".into(), phase.into());
        self
    }

    /// `status.completionTime`, which the operator sets when the phase becomes terminal.
    pub fn completed_at(mut self, at: DateTime<Utc>) -> Self {
        self.status
            .insert("completionTime".into(), timestamp(at).into());
        self
    }

    /// `status.buildStatus` of a Tekton build: `buildName` `{job}-build`, `phase` one of
    /// `Pending`, `Running`, `Complete`, `Failed`.
    pub fn tekton_build(self, phase: &str, completed_at: Option<DateTime<Utc>>) -> Self {
        let build_name = format!("{}-build", self.name);
        self.build_status(phase, completed_at, &build_name, "tekton")
    }

    /// `status.buildStatus` in full.
    pub fn build_status(
        mut self,
        phase: &str,
        completed_at: Option<DateTime<Utc>>,
        build_name: &str,
        strategy: &str,
    ) -> Self {
        let mut build = json!({ "phase": phase, "buildName": build_name, "strategy": strategy });
        if let Some(at) = completed_at {
            build["completionTime"] = timestamp(at).into();
        }
        self.status.insert("buildStatus".into(), build);
        self
    }

    pub async fn create(self, ns: &TestNamespace) -> DynamicObject {
        let mut spec = json!({
            "notebook": {
                "git": { "url": "https://git.example.com/notebooks.git", "ref": "main" },
                "path": format!("notebooks/{}.ipynb", self.name),
            },
        });
        if let Some(pod_config) = self.pod_config {
            spec["podConfig"] = pod_config;
        }
        let status = Some(Value::Object(self.status)).filter(|s| s != &json!({}));
        create_dynamic(
            ns,
            &notebook_validation_job_resource(),
            &self.name,
            BTreeMap::new(),
            spec,
            status,
        )
        .await
    }
}

/// A Tekton `PipelineRun`; without a state call it has no status, as before Tekton saw it.
pub struct PipelineRunBuilder {
    /// A PipelineRun, or a TaskRun ([`Self::task_run`]).
    task_run: bool,
    name: String,
    labels: BTreeMap<String, String>,
    pipeline: String,
    claim: Option<String>,
    pending: bool,
    status: Option<Value>,
}

impl PipelineRunBuilder {
    /// A bare run: no labels, no workspace.
    pub fn new(name: &str) -> Self {
        PipelineRunBuilder {
            task_run: false,
            name: name.to_owned(),
            labels: BTreeMap::new(),
            pipeline: "build-pipeline".to_owned(),
            claim: None,
            pending: false,
            status: None,
        }
    }

    /// A bare TaskRun: its status and workspaces have a PipelineRun's shape.
    pub fn task_run(name: &str) -> Self {
        let mut run = Self::new(name);
        run.task_run = true;
        run
    }

    /// The run the operator creates for job `job`: `{job}-build`, labelled `app={job}` and
    /// `mlops.redhat.com/notebook-validation=true`, workspace `shared-workspace` bound to claim
    /// `{job}-build-workspace`.
    pub fn for_job(job: &str) -> Self {
        let mut run = Self::new(&format!("{job}-build"))
            .workspace_claim(&format!("{job}-build-workspace"))
            .label("app", job)
            .label("mlops.redhat.com/notebook-validation", "true");
        run.pipeline = format!("{job}-pipeline");
        run
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Binds workspace `shared-workspace` to `claim` (replacing an earlier binding).
    pub fn workspace_claim(mut self, claim: &str) -> Self {
        self.claim = Some(claim.to_owned());
        self
    }

    /// Held before starting (`spec.status: PipelineRunPending`), condition `Succeeded=Unknown`.
    pub fn pending(mut self) -> Self {
        self.pending = true;
        self.status = Some(json!({
            "conditions": [succeeded_condition("Unknown", "PipelineRunPending", Utc::now())],
        }));
        self
    }

    /// Started a minute ago and still running: `Succeeded=Unknown`, no completion time.
    pub fn running(mut self) -> Self {
        let now = Utc::now();
        self.status = Some(json!({
            "startTime": timestamp(now - Duration::minutes(1)),
            "conditions": [succeeded_condition("Unknown", "Running", now)],
        }));
        self
    }

    /// Finished successfully at `at`.
    pub fn succeeded_at(self, at: DateTime<Utc>) -> Self {
        self.finished(true, "Succeeded", at)
    }

    /// Finished unsuccessfully at `at`.
    pub fn failed_at(self, at: DateTime<Utc>) -> Self {
        self.finished(false, "Failed", at)
    }

    /// Finished at `at` with the given outcome and reason, e.g. `PipelineRunTimeout`,
    /// `Cancelled`, `StoppedRunFinally`.
    pub fn finished(mut self, succeeded: bool, reason: &str, at: DateTime<Utc>) -> Self {
        let outcome = if succeeded { "True" } else { "False" };
        self.status = Some(json!({
            "startTime": timestamp(at - Duration::minutes(5)),
            "completionTime": timestamp(at),
            "conditions": [succeeded_condition(outcome, reason, at)],
        }));
        self
    }

    pub async fn create(self, ns: &TestNamespace) -> DynamicObject {
        let (mut spec, resource) = if self.task_run {
            let spec =
                json!({ "taskRef": { "name": "buildah" }, "serviceAccountName": "pipeline" });
            (spec, task_run_resource())
        } else {
            let spec = json!({
                "pipelineRef": { "name": self.pipeline },
                "taskRunTemplate": { "serviceAccountName": "pipeline" },
            });
            (spec, pipeline_run_resource())
        };
        if let Some(claim) = &self.claim {
            spec["workspaces"] = json!([{
                "name": "shared-workspace",
                "persistentVolumeClaim": { "claimName": claim },
            }]);
        }
        if self.pending {
            spec["status"] = "PipelineRunPending".into();
        }
        create_dynamic(ns, &resource, &self.name, self.labels, spec, self.status).await
    }
}

/// A `PersistentVolumeClaim` (ReadWriteOnce, 1Gi, no storage class). No provisioner runs, so it
/// stays `Pending` unless [`Self::bound`] is called.
///
/// Its `creationTimestamp` is always "now": the API server sets it and it cannot be backdated.
/// Tests of age-based rules should use policy durations relative to now (e.g. a grace period of
/// zero or a second) or completion times in the past on the run or job.
pub struct ClaimBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerReference>,
    bound: bool,
    storage_class: Option<String>,
    /// The create's field manager, as `metadata.managedFields` records it; `None`: the
    /// client's default.
    field_manager: Option<String>,
}

impl ClaimBuilder {
    /// A build-workspace claim exactly as the operator creates it: its three labels, no owner
    /// references, no annotations.
    pub fn build_workspace(name: &str) -> Self {
        OPERATOR_CLAIM_LABELS
            .iter()
            .fold(Self::plain(name), |claim, (key, value)| {
                claim.label(key, value)
            })
    }

    /// The operator's workspace for job `job`: `{job}-build-workspace`.
    pub fn for_job(job: &str) -> Self {
        Self::build_workspace(&format!("{job}-build-workspace"))
    }

    /// A claim without the operator's labels, such as user data the daemon must never touch.
    pub fn plain(name: &str) -> Self {
        ClaimBuilder {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            owner_references: Vec::new(),
            bound: false,
            storage_class: None,
            field_manager: None,
        }
    }

    /// Creates it as field manager `manager` (the operator's binary, `kubectl-create`).
    pub fn field_manager(mut self, manager: &str) -> Self {
        self.field_manager = Some(manager.to_owned());
        self
    }

    /// `spec.storageClassName` (no StorageClass object is needed: nothing provisions it).
    pub fn storage_class(mut self, class: &str) -> Self {
        self.storage_class = Some(class.to_owned());
        self
    }

    /// Writes `status.phase: Bound` (and capacity 1Gi), as a provisioner would. The
    /// PVC-protection controller maintains the `Unused` condition only on bound claims.
    pub fn bound(mut self) -> Self {
        self.bound = true;
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn without_label(mut self, key: &str) -> Self {
        self.labels.remove(key);
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an owner reference to `owner` (a created object, e.g. from [`JobBuilder::create`]),
    /// not marked as controller and without `blockOwnerDeletion`.
    pub fn owned_by(self, owner: &DynamicObject) -> Self {
        let types = owner
            .types
            .as_ref()
            .expect("the owner came from the API server, so it has apiVersion and kind");
        self.owner_reference(OwnerReference {
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            name: owner.metadata.name.clone().expect("owner name"),
            uid: owner.metadata.uid.clone().expect("owner uid"),
            controller: None,
            block_owner_deletion: None,
        })
    }

    /// Adds an arbitrary owner reference (e.g. one naming a UID that does not exist).
    pub fn owner_reference(mut self, reference: OwnerReference) -> Self {
        self.owner_references.push(reference);
        self
    }

    /// The claim as written: its metadata and spec.
    fn object(&self) -> PersistentVolumeClaim {
        let non_empty =
            |map: &BTreeMap<String, String>| Some(map.clone()).filter(|m| !m.is_empty());
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: non_empty(&self.labels),
                annotations: non_empty(&self.annotations),
                owner_references: Some(self.owner_references.clone()).filter(|r| !r.is_empty()),
                ..ObjectMeta::default()
            },
            spec: Some(claim_spec(self.storage_class.clone())),
            status: None,
        }
    }

    /// Server-side applies the whole claim (metadata and spec) as field manager `manager`, as
    /// a GitOps controller does (Flux; Argo CD with `ServerSideApply=true`): it creates the
    /// claim, or takes a share of the fields an existing one already has. Not bound.
    pub async fn apply(self, ns: &TestNamespace, manager: &str) -> PersistentVolumeClaim {
        ns.api::<PersistentVolumeClaim>()
            .patch(
                &self.name,
                &PatchParams::apply(manager),
                &Patch::Apply(self.object()),
            )
            .await
            .unwrap_or_else(|e| panic!("apply claim {}/{} as {manager}: {e}", ns.name(), self.name))
    }

    pub async fn create(self, ns: &TestNamespace) -> PersistentVolumeClaim {
        let claim = self.object();
        let api = ns.api::<PersistentVolumeClaim>();
        let params = PostParams {
            field_manager: self.field_manager,
            ..PostParams::default()
        };
        let created = api
            .create(&params, &claim)
            .await
            .unwrap_or_else(|e| panic!("create claim {}/{}: {e}", ns.name(), self.name));
        if !self.bound {
            return created;
        }
        let status = json!({ "status": {
            "phase": "Bound",
            "accessModes": ["ReadWriteOnce"],
            "capacity": { "storage": "1Gi" },
        }});
        api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap_or_else(|e| panic!("bind claim {}/{}: {e}", ns.name(), self.name))
    }
}

/// A `Pod` mounting claims. No scheduler or kubelet runs, so it never starts: its phase is
/// whatever [`Self::phase`] writes through the status subresource, which is what in-use checks
/// read.
///
/// By default it is not bound to a node, so deleting it removes it at once, and the
/// PVC-protection controller ignores it: that controller counts only scheduled pods, of any
/// phase, as holding a claim. See [`Self::scheduled_on`].
pub struct PodBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    claims: Vec<String>,
    phase: Option<String>,
    node: Option<String>,
}

impl PodBuilder {
    pub fn new(name: &str) -> Self {
        PodBuilder {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            claims: Vec::new(),
            phase: None,
            node: None,
        }
    }

    /// Sets `spec.nodeName` (no Node object is needed), as if scheduled. PVC protection then
    /// keeps a deleted claim it mounts Terminating until the pod object is gone. With no kubelet
    /// to confirm a graceful deletion, delete such a pod with `DeleteParams` grace period 0.
    pub fn scheduled_on(mut self, node: &str) -> Self {
        self.node = Some(node.to_owned());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Mounts `claim` as a volume (call repeatedly for several).
    pub fn mounting(mut self, claim: &str) -> Self {
        self.claims.push(claim.to_owned());
        self
    }

    /// `status.phase`: `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`. Without it the
    /// pod has the server's default, `Pending`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = Some(phase.to_owned());
        self
    }

    pub async fn create(self, ns: &TestNamespace) -> Pod {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels).filter(|l| !l.is_empty()),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec(&self.claims, self.node)),
            status: None,
        };
        let api = ns.api::<Pod>();
        let created = api
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {}/{}: {e}", ns.name(), self.name));
        match self.phase {
            None => created,
            Some(phase) => api
                .patch_status(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "phase": phase } })),
                )
                .await
                .unwrap_or_else(|e| panic!("set phase of pod {}/{}: {e}", ns.name(), self.name)),
        }
    }
}

/// A build of job `name` that finished at `at` (the job and its PipelineRun), with its
/// workspace claim.
pub async fn finished_build(ns: &TestNamespace, name: &str, at: DateTime<Utc>) {
    JobBuilder::new(name)
        .phase("Succeeded")
        .completed_at(at)
        .create(ns)
        .await;
    PipelineRunBuilder::for_job(name)
        .succeeded_at(at)
        .create(ns)
        .await;
    ClaimBuilder::for_job(name).create(ns).await;
}

/// Whether claim `name` exists in `ns`, including one that is terminating (held by the
/// `kubernetes.io/pvc-protection` finalizer).
pub async fn claim_exists(ns: &TestNamespace, name: &str) -> bool {
    ns.api::<PersistentVolumeClaim>()
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get claim {}/{name}: {e}", ns.name()))
        .is_some()
}

/// A validating webhook on claim DELETEs whose pods are down (`failurePolicy: Fail`, nothing
/// listens at its URL): the API server answers each DELETE 500 "failed calling webhook", for the
/// claims of `namespace`, or of every namespace.
pub fn webhook_that_is_down(
    name: &str,
    namespace: Option<&str>,
) -> k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration {
    let mut webhook = json!({
        "name": "down.workspace-gc.test",
        "clientConfig": {"url": "https://127.0.0.1:1/validate"},
        "rules": [{
            "operations": ["DELETE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["persistentvolumeclaims"],
        }],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 2,
    });
    if let Some(namespace) = namespace {
        webhook["namespaceSelector"] =
            json!({"matchLabels": {"kubernetes.io/metadata.name": namespace}});
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": [webhook]}))
        .expect("a webhook configuration")
}
