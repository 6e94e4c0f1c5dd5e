//! Owner kinds served at another version than the one workspace-gc prefers (issue 34, class
//! 3), against a real kube-apiserver with the real binary running. A 404 at the preferred
//! version is not "no such object": TaskRuns served only at `tekton.dev/v1beta1` (an older
//! Tekton, an OpenShift Pipelines upgrade half done) are read there, and jobs served only at a
//! version whose fields workspace-gc does not know keep every claim they could protect. Each
//! test changes CRDs cluster-wide, so it runs on a control plane of its own.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, JobBuilder, Process, TestNamespace, binary_vars, deleted, log_dir,
    metric, set_var, wait_until,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The real binary watching only `ns`, with a one-second orphan grace: a claim no owner
/// protects is due at once.
async fn start_daemon(ns: &TestNamespace, logs: &tempfile::TempDir) -> Process {
    let mut vars = binary_vars(ns);
    set_var(&mut vars, "WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s");
    Process::spawn(
        &ns.daemon_kubeconfig(&vars).await,
        &vars,
        "served",
        &logs.path().join("daemon.log"),
    )
}

async fn served_state(daemon: &Process, kind: &str, state: &str) -> bool {
    let labels = format!("kind=\"{kind}\",state=\"{state}\"");
    metric(&daemon.metrics().await, "workspace_gc_kind_served", &labels) == 1.0
}

/// Claims of `ns` the daemon last decided to keep for `reason`.
async fn kept_for(daemon: &Process, ns: &TestNamespace, reason: &str) -> f64 {
    let labels = format!(
        "claim_namespace=\"{}\",state=\"keep\",reason=\"{reason}\"",
        ns.name()
    );
    metric(&daemon.metrics().await, "workspace_gc_claims", &labels)
}

/// Replaces the versions of CRD `name` with `versions` (each `(name, served, storage)`), all
/// with the schema of the stand-in's first version, and waits until discovery lists exactly the
/// served ones.
async fn serve_versions(cp: &ControlPlane, name: &str, versions: &[(&str, bool, bool)]) {
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    let mut crd = crds.get(name).await.expect("the stand-in CRD");
    let template = crd.spec.versions[0].clone();
    crd.spec.versions = (versions.iter())
        .map(
            |(version, served, storage)| CustomResourceDefinitionVersion {
                name: (*version).to_owned(),
                served: *served,
                storage: *storage,
                ..template.clone()
            },
        )
        .collect();
    crd.metadata.managed_fields = None;
    crds.replace(name, &PostParams::default(), &crd)
        .await
        .unwrap_or_else(|e| panic!("replace CRD {name}: {e}"));
    let group = crd.spec.group.clone();
    let plural = crd.spec.names.plural.clone();
    let client = cp.client();
    assert!(
        wait_until(secs(30), || async {
            let mut listed = Vec::new();
            for (version, served, _) in versions {
                let resources = client
                    .list_api_group_resources(&format!("{group}/{version}"))
                    .await;
                let lists = resources.is_ok_and(|r| r.resources.iter().any(|r| r.name == plural));
                listed.push(lists == *served);
            }
            listed.into_iter().all(|ok| ok)
        })
        .await,
        "discovery lists {name} at {versions:?}"
    );
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Creates a custom object of `resource` with `spec`, then writes `status` through the status
/// subresource.
async fn create(
    ns: &TestNamespace,
    resource: &ApiResource,
    name: &str,
    spec: serde_json::Value,
    status: serde_json::Value,
) {
    let api: Api<DynamicObject> = ns.dynamic_api(resource);
    let object = DynamicObject::new(name, resource).data(json!({ "spec": spec }));
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {} {name}: {e}", resource.api_version));
    let status = Patch::Merge(json!({ "status": status }));
    api.patch_status(name, &PatchParams::default(), &status)
        .await
        .unwrap_or_else(|e| panic!("set the status of {name}: {e}"));
}

/// Running since a minute ago: `Succeeded=Unknown`, no completion time.
fn running() -> serde_json::Value {
    let now = Utc::now();
    json!({
        "startTime": (now - chrono::Duration::minutes(1)).to_rfc3339(),
        "conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Running",
                        "lastTransitionTime": now.to_rfc3339()}],
    })
}

/// Waits until the daemon deleted `witness` (it acts in the namespace) and decided `claim`:
/// deleted it, or keeps it for `reason`.
async fn decided(
    daemon: &Process,
    ns: &TestNamespace,
    (witness, claim, reason): (&str, &str, &str),
) -> bool {
    wait_until(secs(60), || async {
        deleted(ns, witness).await
            && (deleted(ns, claim).await || kept_for(daemon, ns, reason).await >= 1.0)
    })
    .await
}

/// TaskRuns served only at `tekton.dev/v1beta1`: a running one keeps the claim it binds. Then
/// the CRD serves `v1` alone: the watch at `v1beta1` answers 404 and the kind is read at `v1`.
/// Then the CRD goes: no TaskRun exists, and the claim is collected as before.
///
/// On the code before (TaskRuns read at `v1` only, a 404 taken as "the CRD is not installed")
/// the claim was deleted while its TaskRun ran.
#[tokio::test(flavor = "multi_thread")]
async fn task_runs_served_only_at_v1beta1_protect_their_claims() {
    let cp = ControlPlane::start(false);
    // A CRD not yet upgraded: v1 listed (it was stored) but not served.
    serve_versions(
        &cp,
        "taskruns.tekton.dev",
        &[("v1", false, false), ("v1beta1", true, true)],
    )
    .await;
    let ns = TestNamespace::new(&cp, "v1beta1").await;
    let beta = resource("tekton.dev", "v1beta1", "TaskRun", "taskruns");
    let spec = json!({
        "taskRef": {"name": "buildah"}, "serviceAccountName": "pipeline",
        "workspaces": [{"name": "shared-workspace",
                        "persistentVolumeClaim": {"claimName": "bound-build-workspace"}}],
    });
    create(&ns, &beta, "bound-task-run", spec, running()).await;
    ClaimBuilder::build_workspace("bound-build-workspace")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("orphan-build-workspace")
        .create(&ns)
        .await;

    let logs = log_dir("served-versions");
    let daemon = start_daemon(&ns, &logs).await;
    let witness = (
        "orphan-build-workspace",
        "bound-build-workspace",
        "owner-running",
    );
    assert!(
        decided(&daemon, &ns, witness).await,
        "the daemon decided both claims:\n{}",
        daemon.logs()
    );
    assert!(
        !deleted(&ns, "bound-build-workspace").await,
        "the claim of a running v1beta1 TaskRun must be kept, yet it was deleted:\n{}",
        daemon.logs()
    );
    assert!(served_state(&daemon, "taskruns", "other-version").await);
    let (status, body) = daemon.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("read at tekton.dev/v1beta1"), "{body}");

    // The upgrade completes: v1 alone is served. The watch at v1beta1 gets its 404 and the
    // kind is resolved again.
    serve_versions(
        &cp,
        "taskruns.tekton.dev",
        &[("v1", true, true), ("v1beta1", false, false)],
    )
    .await;
    ClaimBuilder::build_workspace("later-build-workspace")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(60), || served_state(&daemon, "taskruns", "preferred")).await,
        "read at v1 once v1beta1 is no longer served:\n{}",
        daemon.logs()
    );
    let witness = (
        "later-build-workspace",
        "bound-build-workspace",
        "owner-running",
    );
    assert!(decided(&daemon, &ns, witness).await, "{}", daemon.logs());
    assert_eq!(kept_for(&daemon, &ns, "owner-running").await, 1.0);
    assert!(
        !deleted(&ns, "bound-build-workspace").await,
        "the TaskRun, read at v1 now, still protects its claim:\n{}",
        daemon.logs()
    );

    // No TaskRun CRD at all: no TaskRun exists, as before.
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    crds.delete("taskruns.tekton.dev", &DeleteParams::default())
        .await
        .expect("delete the TaskRun CRD");
    assert!(
        wait_until(secs(60), || deleted(&ns, "bound-build-workspace")).await,
        "with its CRD gone the TaskRun is gone, and its claim is collected:\n{}",
        daemon.logs()
    );
    assert!(
        wait_until(secs(60), || served_state(&daemon, "taskruns", "absent")).await,
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.get("/readyz").await.0, 200);
}

/// NotebookValidationJobs served only at `v1alpha2`, whose fields workspace-gc does not know
/// (an operator upgrade): every claim of the namespace is kept, since any unfinished job may
/// name any claim in its own volumes (the claim of a job created there among them, owner
/// unknown), and the daemon says so in its log, its metrics and `/readyz`. An orphan deleted
/// before the switch is the witness that the daemon collects there.
///
/// On the code before (jobs read at `v1alpha1` only, a 404 on a GET taken as "the job is
/// gone") the claim was deleted.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_served_only_at_an_unknown_version_keep_their_claims() {
    let cp = ControlPlane::start(false);
    let ns = TestNamespace::new(&cp, "v1alpha2").await;
    let logs = log_dir("served-versions");
    let daemon = start_daemon(&ns, &logs).await;
    assert!(
        wait_until(secs(30), || daemon.ready()).await,
        "{}",
        daemon.logs()
    );
    JobBuilder::new("before")
        .phase("Building")
        .create(&ns)
        .await;
    ClaimBuilder::for_job("before").create(&ns).await;
    ClaimBuilder::build_workspace("early-build-workspace")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(60), || deleted(&ns, "early-build-workspace")).await,
        "an orphan is collected while the jobs can be read:\n{}",
        daemon.logs()
    );

    serve_versions(
        &cp,
        "notebookvalidationjobs.mlops.mlops.dev",
        &[("v1alpha1", false, false), ("v1alpha2", true, true)],
    )
    .await;
    let alpha2 = resource(
        "mlops.mlops.dev",
        "v1alpha2",
        "NotebookValidationJob",
        "notebookvalidationjobs",
    );
    let spec = json!({"notebook": {"git": {"url": "https://git.example.com/n.git", "ref": "main"},
                                   "path": "notebooks/after.ipynb"}});
    create(&ns, &alpha2, "after", spec, json!({"phase": "Building"})).await;
    ClaimBuilder::for_job("after").create(&ns).await;
    // Labelled, named for no job: only a job's own volumes could protect it, and they cannot
    // be read.
    ClaimBuilder::build_workspace("scratch-build-workspace")
        .create(&ns)
        .await;

    let unknown = || async {
        kept_for(&daemon, &ns, "owner-unknown").await
            + kept_for(&daemon, &ns, "users-unknown").await
    };
    assert!(
        wait_until(secs(60), || async { unknown().await == 3.0 }).await,
        "every claim is kept, what protects it unknown:\n{}\n{}",
        daemon.metrics().await,
        daemon.logs()
    );
    for claim in [
        "after-build-workspace",
        "before-build-workspace",
        "scratch-build-workspace",
    ] {
        assert!(
            !deleted(&ns, claim).await,
            "{claim} must be kept while the jobs cannot be read, yet it was deleted:\n{}",
            daemon.logs()
        );
    }
    // The claims are kept as soon as the jobs' watch fails; discovery, which names why, may
    // come a moment later.
    assert!(
        wait_until(secs(30), || served_state(&daemon, "jobs", "unreadable")).await,
        "{}\n{}",
        daemon.metrics().await,
        daemon.logs()
    );
    let readyz_names_the_version = || async {
        let (status, body) = daemon.get("/readyz").await;
        status == 200 && body.contains("mlops.mlops.dev/v1alpha2")
    };
    assert!(
        wait_until(secs(10), readyz_names_the_version).await,
        "{:?}",
        daemon.get("/readyz").await
    );
    let logs = daemon.logs();
    assert!(
        logs.lines()
            .any(|line| line.contains("WARN") && line.contains("mlops.mlops.dev/v1alpha2")),
        "{logs}"
    );
}
