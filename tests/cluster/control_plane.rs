//! Smoke tests of the test control plane itself (testkit/, scripts/control-plane): if one of
//! these fails, the other integration tests' failures say little.

use std::time::Duration;

use chrono::{Duration as TimeDelta, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, JobBuilder, PipelineRunBuilder, PodBuilder,
    TestNamespace, claim_exists, kubernetes_minor, kubernetes_version,
    notebook_validation_job_resource, pipeline_run_resource, wait_until,
};

/// The server is the release pinned in hack/k8s (the newest, or the one `CONTROL_PLANE_K8S`
/// selects), and no newer than the API k8s-openapi is built for (its `v1_37` feature).
#[tokio::test]
async fn server_is_the_pinned_kubernetes_release() {
    let version = ControlPlane::shared()
        .client()
        .apiserver_version()
        .await
        .expect("GET /version");
    assert_eq!(version.major, "1");
    assert_eq!(version.git_version, kubernetes_version(), "{version:?}");
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .expect("a numeric minor");
    assert_eq!(minor, kubernetes_minor(), "{version:?}");
    assert!(
        minor <= 37,
        "k8s-openapi's v1_37 feature is older than the server: {version:?}"
    );
}

/// Run statuses written by hand: this tests the stand-in CRDs of tests/crds themselves.
#[tokio::test]
async fn crds_are_established_and_status_round_trips() {
    let control_plane = ControlPlane::shared();
    let crds: Api<CustomResourceDefinition> = Api::all(control_plane.client());
    for name in [
        "notebookvalidationjobs.mlops.mlops.dev",
        "pipelineruns.tekton.dev",
    ] {
        let crd = crds.get(name).await.expect("CRD installed by `up`");
        let established = crd
            .status
            .and_then(|status| status.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "{name} is not Established");
    }

    let ns = TestNamespace::new(control_plane, "crds").await;
    let finished = Utc::now() - TimeDelta::hours(3);
    JobBuilder::new("demo")
        .phase("Succeeded")
        .completed_at(finished)
        .tekton_build("Complete", Some(finished - TimeDelta::minutes(10)))
        .create(&ns)
        .await;
    PipelineRunBuilder::for_job("demo")
        .failed_at(finished)
        .create(&ns)
        .await;

    // Read back fresh, so what we check is what the server stored.
    let job = ns
        .dynamic_api(&notebook_validation_job_resource())
        .get("demo")
        .await
        .expect("get job");
    let status = &job.data["status"];
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(
        status["completionTime"],
        finished.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
    assert_eq!(status["buildStatus"]["buildName"], "demo-build");
    assert_eq!(status["buildStatus"]["strategy"], "tekton");
    assert_eq!(status["buildStatus"]["phase"], "Complete");
    // Fields the minimal CRD does not declare survive.
    assert_eq!(job.data["spec"]["notebook"]["path"], "notebooks/demo.ipynb");

    let run = ns
        .dynamic_api(&pipeline_run_resource())
        .get("demo-build")
        .await
        .expect("get run");
    assert_eq!(
        run.data["spec"]["workspaces"][0]["persistentVolumeClaim"]["claimName"],
        "demo-build-workspace"
    );
    assert_eq!(run.data["spec"]["pipelineRef"]["name"], "demo-pipeline");
    let condition = &run.data["status"]["conditions"][0];
    assert_eq!(condition["type"], "Succeeded");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "Failed");
    assert!(run.data["status"]["completionTime"].is_string());
    assert_eq!(
        run.metadata.labels.unwrap_or_default().get("app"),
        Some(&"demo".to_owned())
    );
}

#[tokio::test]
async fn claim_mounted_by_a_pod() {
    let ns = TestNamespace::new(ControlPlane::shared(), "in-use").await;
    let claim = ClaimBuilder::for_job("busy")
        .annotation("example.com/note", "kept")
        .bound()
        .create(&ns)
        .await;
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(BUILD_WORKSPACE_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.len(), 3, "{labels:?}");
    // The StorageObjectInUseProtection admission plugin adds the finalizer, as on real clusters.
    assert!(
        claim
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"kubernetes.io/pvc-protection".to_owned()),
    );

    let pod = PodBuilder::new("busy-build-pod")
        .mounting("busy-build-workspace")
        .scheduled_on("node-1")
        .phase("Running")
        .create(&ns)
        .await;
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    let pod = ns
        .api::<Pod>()
        .get("busy-build-pod")
        .await
        .expect("get pod");
    let mounted: Vec<_> = pod
        .spec
        .and_then(|spec| spec.volumes)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name))
        .collect();
    assert_eq!(mounted, ["busy-build-workspace"]);
    assert!(claim_exists(&ns, "busy-build-workspace").await);
    assert!(!claim_exists(&ns, "no-such-claim").await);

    // The shared control plane runs the PVC-protection controller: a claim in use stays
    // Terminating until its pod is gone, and from 1.37 on bound claims carry the `Unused`
    // condition (older releases write none; nothing in workspace-gc reads it).
    let claims = ns.api::<PersistentVolumeClaim>();
    ClaimBuilder::for_job("idle").bound().create(&ns).await;
    let unused = |name: &'static str, expected: &'static str| {
        let claims = claims.clone();
        async move {
            let claim = claims.get(name).await.expect("get claim");
            claim
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Unused" && c.status == expected)
        }
    };
    if kubernetes_minor() >= 37 {
        assert!(
            wait_until(Duration::from_secs(30), || unused(
                "idle-build-workspace",
                "True"
            ))
            .await,
            "no Unused=True condition on a claim no pod uses"
        );
        assert!(
            wait_until(Duration::from_secs(30), || unused(
                "busy-build-workspace",
                "False"
            ))
            .await,
            "no Unused=False condition on a claim a pod uses"
        );
    }
    claims
        .delete("busy-build-workspace", &DeleteParams::default())
        .await
        .expect("delete claim");
    // The witness that the delete was taken: the claim is Terminating, held by its finalizer.
    let terminating = || async {
        let claim = claims.get("busy-build-workspace").await.expect("get claim");
        let finalizers = claim.metadata.finalizers.unwrap_or_default();
        claim.metadata.deletion_timestamp.is_some()
            && finalizers
                .iter()
                .any(|f| f == "kubernetes.io/pvc-protection")
    };
    assert!(
        wait_until(Duration::from_secs(10), terminating).await,
        "the claim is Terminating under kubernetes.io/pvc-protection"
    );
    // Real time for the PVC-protection controller, whose decision to keep the finalizer leaves
    // no witness this test can read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(claim_exists(&ns, "busy-build-workspace").await);
    // Grace period 0: no kubelet would confirm a graceful deletion of a scheduled pod.
    ns.api::<Pod>()
        .delete("busy-build-pod", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    let released = wait_until(Duration::from_secs(30), || async {
        !claim_exists(&ns, "busy-build-workspace").await
    })
    .await;
    assert!(
        released,
        "claim still Terminating after its pod was deleted"
    );
}

#[tokio::test]
async fn service_account_needs_rbac_to_list_claims() {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "rbac").await;
    let as_daemon = control_plane
        .service_account_client(ns.name(), "workspace-gc")
        .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(as_daemon, ns.name());

    match claims.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            // 403, not 401: the token authenticated, RBAC said no.
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains(&format!("system:serviceaccount:{}:workspace-gc", ns.name())),
                "{status:?}"
            );
        }
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }

    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    ns.api::<Role>()
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta("claim-reader"),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["persistentvolumeclaims".to_owned()]),
                    verbs: vec!["list".to_owned()],
                    ..PolicyRule::default()
                }]),
            },
        )
        .await
        .expect("create role");
    ns.bind_role("claim-reader", "workspace-gc").await;

    // The authorizer reads RBAC objects from an informer, so the grant lands a moment later.
    let allowed = wait_until(Duration::from_secs(10), || async {
        claims.list(&ListParams::default()).await.is_ok()
    })
    .await;
    assert!(allowed, "listing claims still denied after the RoleBinding");
}

#[tokio::test]
async fn garbage_collector_deletes_claim_of_deleted_job() {
    let control_plane = ControlPlane::start(true);
    let dir = control_plane.dir().to_owned();
    {
        let ns = TestNamespace::new(&control_plane, "gc").await;
        let job = JobBuilder::new("owner").phase("Building").create(&ns).await;
        ClaimBuilder::for_job("owner")
            .owned_by(&job)
            .create(&ns)
            .await;
        ns.dynamic_api(&notebook_validation_job_resource())
            .delete("owner", &DeleteParams::default())
            .await
            .expect("delete job");
        let collected = wait_until(Duration::from_secs(30), || async {
            !claim_exists(&ns, "owner-build-workspace").await
        })
        .await;
        assert!(
            collected,
            "kube-controller-manager did not delete the claim of a deleted job"
        );
    }
    drop(control_plane);
    assert!(!dir.exists(), "`down` left {} behind", dir.display());
}

/// The quota controller counts a new quota from its own watch of the claims, and a claim's
/// creation never makes it count again: when its first count runs before that watch has
/// delivered the claims (a loaded machine; here kube-controller-manager paused while the claims
/// and the quota are made), the quota stays short until the next full recount. With the
/// default period, 5 minutes; the test plane's, 5 s (scripts/control-plane), so a test that
/// waits for a quota to be counted waits seconds. Issue 50: the API-contract lane's quota
/// tests failed after the earlier lanes had loaded the machine, never alone.
#[tokio::test]
async fn a_quota_first_counted_before_its_claims_were_seen_is_recounted_within_seconds() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let control_plane = ControlPlane::start(true);
    let ns = TestNamespace::new(&control_plane, "quota-recount").await;
    let quotas = ns.api::<ResourceQuota>();
    let quota = |name: &str, resource: &str, amount: usize| -> ResourceQuota {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"hard": {resource: amount.to_string()}},
        }))
        .expect("a quota")
    };
    let used = |name: &'static str| {
        let quotas = quotas.clone();
        async move {
            let quota = quotas.get(name).await.expect("read the quota");
            let used = quota.status.and_then(|status| status.used)?;
            used.values().next().map(|q| q.0.clone())
        }
    };
    // The quota controller is running: a first quota, of something else, is counted.
    let first = quota("first", "configmaps", 10);
    (quotas.create(&PostParams::default(), &first).await).expect("create a quota");
    assert!(
        wait_until(Duration::from_secs(60), || async {
            used("first").await.is_some()
        })
        .await,
        "the quota controller counts a first quota"
    );
    control_plane.pause_component("kube-controller-manager", true);
    const CLAIMS: usize = 100;
    for i in 0..CLAIMS {
        ClaimBuilder::build_workspace(&format!("c{i}-build-workspace"))
            .create(&ns)
            .await;
    }
    let claims = quota("claims", "persistentvolumeclaims", CLAIMS);
    (quotas.create(&PostParams::default(), &claims).await).expect("create the quota");
    control_plane.pause_component("kube-controller-manager", false);
    let counted = wait_until(Duration::from_secs(30), || async {
        used("claims").await == Some(CLAIMS.to_string())
    })
    .await;
    assert!(
        counted,
        "the quota counts all {CLAIMS} claims within 30 s: {:?}",
        used("claims").await
    );
}
