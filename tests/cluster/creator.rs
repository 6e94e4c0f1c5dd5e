//! The creator against a real control plane: the claim it creates, idempotence and races, the
//! clashes it refuses, cascading deletion through kube-controller-manager's garbage collector,
//! the collector's view of a created claim, and `workspace-gc create` as a process.

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use kube::api::{DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, JobBuilder, TestNamespace,
    notebook_validation_job_resource, wait_until,
};
use workspace_gc::cluster::watches;
use workspace_gc::config::{Config, CreatorConfig};
use workspace_gc::contract::OwnerKind;
use workspace_gc::contract::labels::JOB as JOB_LABEL;
use workspace_gc::creator::{CreateError, Ensured, ensure_build_claim, read_job};
use workspace_gc::decide::facts::{LinkRule, OwnerState};
use workspace_gc::surface::audit;
use workspace_gc::surface::commands::exit::{self, ALREADY_PRESENT, CREATED, REFUSED};

/// A finalizer of the test's own, to hold a deleted claim in Terminating.
const HOLD: &str = "example.com/hold";

fn settings() -> CreatorConfig {
    Config::default().creator
}

/// Reads job `name` in `ns` and ensures its claim with `settings`, as `create` does.
async fn ensure_with(
    ns: &TestNamespace,
    name: &str,
    settings: &CreatorConfig,
) -> Result<Ensured, CreateError> {
    let job = read_job(ns.client(), ns.name(), name).await?;
    ensure_build_claim(ns.client(), &job, settings).await
}

async fn ensure(ns: &TestNamespace, name: &str) -> Result<Ensured, CreateError> {
    ensure_with(ns, name, &settings()).await
}

fn uid_of(object: &DynamicObject) -> String {
    object
        .metadata
        .uid
        .clone()
        .expect("a stored object has a uid")
}

fn claim_uid(ensured: &Ensured) -> String {
    ensured.claim.metadata.uid.clone().expect("claim uid")
}

async fn get_claim(ns: &TestNamespace, name: &str) -> PersistentVolumeClaim {
    ns.api::<PersistentVolumeClaim>()
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get claim {}/{name}: {e}", ns.name()))
}

async fn delete_job(ns: &TestNamespace, name: &str) {
    ns.dynamic_api(&notebook_validation_job_resource())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete job {}/{name}: {e}", ns.name()));
}

#[tokio::test]
async fn creates_the_claim_with_labels_and_owner() {
    let ns = TestNamespace::new(ControlPlane::shared(), "create").await;
    let job = JobBuilder::new("nb").phase("Building").create(&ns).await;

    let ensured = ensure(&ns, "nb").await.expect("ensure");
    assert!(ensured.created);

    // What the server stored, not what the call returned.
    let claim = get_claim(&ns, "nb-build-workspace").await;
    assert_eq!(claim.metadata.uid, ensured.claim.metadata.uid);
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels,
        BTreeMap::from(
            [
                (
                    "app.kubernetes.io/managed-by",
                    "jupyter-notebook-validator-operator"
                ),
                ("app.kubernetes.io/component", "tekton-build"),
                (BUILD_WORKSPACE_LABEL, "true"),
                (JOB_LABEL, "nb"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        )
    );
    assert_eq!(claim.metadata.annotations, None);
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(owner.api_version, "mlops.mlops.dev/v1alpha1");
    assert_eq!(owner.kind, "NotebookValidationJob");
    assert_eq!(owner.name, "nb");
    assert_eq!(owner.uid, uid_of(&job));
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    let spec = claim.spec.expect("spec");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    let requests = spec.resources.and_then(|r| r.requests).unwrap_or_default();
    assert_eq!(requests.get("storage").map(|q| q.0.as_str()), Some("1Gi"));
    // No class configured and none is the cluster default: left for the cluster to decide.
    assert_eq!(spec.storage_class_name, None);
}

#[tokio::test]
async fn configured_size_class_labels_and_annotations_are_stored() {
    let ns = TestNamespace::new(ControlPlane::shared(), "create-config").await;
    JobBuilder::new("nb").create(&ns).await;
    let mut settings = settings();
    settings.storage = "2Gi".parse().expect("quantity");
    settings.storage_class = Some("fast-ssd".to_owned());
    settings.labels = BTreeMap::from([("team".to_owned(), "ml".to_owned())]);
    settings.annotations =
        BTreeMap::from([("example.com/purpose".to_owned(), "build cache".to_owned())]);

    ensure_with(&ns, "nb", &settings).await.expect("ensure");
    let claim = get_claim(&ns, "nb-build-workspace").await;
    let labels = claim.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    assert_eq!(
        labels.get(BUILD_WORKSPACE_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        claim.metadata.annotations.unwrap_or_default(),
        settings.annotations
    );
    let spec = claim.spec.expect("spec");
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast-ssd"));
    let requests = spec.resources.and_then(|r| r.requests).unwrap_or_default();
    assert_eq!(requests.get("storage").map(|q| q.0.as_str()), Some("2Gi"));
}

#[tokio::test]
async fn a_second_call_returns_the_same_claim() {
    let ns = TestNamespace::new(ControlPlane::shared(), "idempotent").await;
    JobBuilder::new("nb").create(&ns).await;

    let first = ensure(&ns, "nb").await.expect("first ensure");
    let second = ensure(&ns, "nb").await.expect("second ensure");
    assert!(first.created);
    assert!(!second.created);
    assert_eq!(claim_uid(&first), claim_uid(&second));
    // Left as it was: not even rewritten.
    assert_eq!(
        first.claim.metadata.resource_version,
        second.claim.metadata.resource_version
    );
}

#[tokio::test]
async fn concurrent_calls_end_with_one_claim_and_no_error() {
    let ns = TestNamespace::new(ControlPlane::shared(), "concurrent").await;
    JobBuilder::new("nb").create(&ns).await;
    let job = read_job(ns.client(), ns.name(), "nb").await.expect("job");
    let settings = settings();

    let results =
        futures::future::join_all((0..6).map(|_| ensure_build_claim(ns.client(), &job, &settings)))
            .await;
    let ensured: Vec<Ensured> = results
        .into_iter()
        .map(|r| r.expect("every concurrent call succeeds"))
        .collect();
    assert_eq!(ensured.iter().filter(|e| e.created).count(), 1);
    let uid = claim_uid(&ensured[0]);
    assert!(ensured.iter().all(|e| claim_uid(e) == uid));
    let claims = ns
        .api::<PersistentVolumeClaim>()
        .list(&Default::default())
        .await
        .expect("list claims");
    assert_eq!(claims.items.len(), 1);
}

#[tokio::test]
async fn refuses_a_terminating_claim() {
    let ns = TestNamespace::new(ControlPlane::shared(), "terminating").await;
    let job = JobBuilder::new("nb").create(&ns).await;
    // Even owned by this very job: a claim on its way out must not be handed to a new build.
    ClaimBuilder::for_job("nb").owned_by(&job).create(&ns).await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let held = get_claim(&ns, "nb-build-workspace").await;
    let mut finalizers = held.metadata.finalizers.unwrap_or_default();
    finalizers.push(HOLD.to_owned());
    claims
        .patch(
            "nb-build-workspace",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .expect("add the hold finalizer");
    claims
        .delete("nb-build-workspace", &DeleteParams::default())
        .await
        .expect("delete the claim");

    let error = ensure(&ns, "nb").await.expect_err("a terminating claim");
    let message = error.to_string();
    assert!(
        matches!(error, CreateError::Terminating { .. }),
        "{message}"
    );
    assert!(message.contains(HOLD), "{message}");
    assert_eq!(exit::of_create(&error), REFUSED);

    // kube-controller-manager's PVC protection may take its own finalizer off meanwhile: the
    // patch carries the resourceVersion read, and is read and sent again when refused.
    for attempt in 1.. {
        let read = get_claim(&ns, "nb-build-workspace").await.metadata;
        let remaining: Vec<String> = (read.finalizers.unwrap_or_default().into_iter())
            .filter(|f| f != HOLD)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": remaining,
            "resourceVersion": read.resource_version,
        }});
        let patched = claims
            .patch(
                "nb-build-workspace",
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await;
        match patched {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if attempt < 10 && [409, 422].contains(&status.code) => {}
            Err(error) => panic!("remove the hold finalizer: {error}"),
        }
    }
}

#[tokio::test]
async fn refuses_a_claim_owned_by_another_object() {
    let ns = TestNamespace::new(ControlPlane::shared(), "foreign").await;
    // The owner must exist: the garbage collector deletes a claim whose owners are all gone.
    let other = JobBuilder::new("other").create(&ns).await;
    ClaimBuilder::for_job("nb")
        .owned_by(&other)
        .create(&ns)
        .await;
    let job = JobBuilder::new("nb").create(&ns).await;

    let error = ensure(&ns, "nb").await.expect_err("a foreign claim");
    match &error {
        CreateError::ForeignOwner {
            owner,
            uid,
            job_uid,
            ..
        } => {
            assert_eq!(owner, "NotebookValidationJob other");
            assert_eq!(uid, &uid_of(&other));
            assert_eq!(job_uid, &uid_of(&job));
        }
        other => panic!("expected ForeignOwner, got {other}"),
    }
    assert_eq!(exit::of_create(&error), REFUSED);
}

#[tokio::test]
async fn refuses_the_claim_an_earlier_job_of_the_same_name_left_behind() {
    let ns = TestNamespace::new(ControlPlane::shared(), "earlier").await;
    JobBuilder::new("nb").create(&ns).await;
    ensure(&ns, "nb").await.expect("the earlier job's claim");
    // Orphan propagation: the garbage collector strips the owner reference and keeps the
    // claim, as when a job is deleted with `--cascade=orphan`.
    ns.dynamic_api(&notebook_validation_job_resource())
        .delete("nb", &DeleteParams::orphan())
        .await
        .expect("delete the earlier job");
    let claims = ns.api::<PersistentVolumeClaim>();
    let orphaned = wait_until(Duration::from_secs(30), || async {
        claims
            .get_opt("nb-build-workspace")
            .await
            .ok()
            .flatten()
            .is_some_and(|c| c.metadata.owner_references.unwrap_or_default().is_empty())
    })
    .await;
    assert!(orphaned, "the garbage collector did not orphan the claim");
    // Creation timestamps have whole seconds: wait one so the new job is provably younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    JobBuilder::new("nb").create(&ns).await;

    let error = ensure(&ns, "nb").await.expect_err("a stale claim");
    assert!(matches!(error, CreateError::StaleUnowned { .. }), "{error}");
    assert_eq!(exit::of_create(&error), REFUSED);
}

#[tokio::test]
async fn refuses_a_stale_unowned_claim() {
    let ns = TestNamespace::new(ControlPlane::shared(), "stale").await;
    // As the operator leaves it: unowned, from before the job.
    ClaimBuilder::for_job("nb").create(&ns).await;
    // Creation timestamps have whole seconds: wait one so the job is provably younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    JobBuilder::new("nb").create(&ns).await;

    let error = ensure(&ns, "nb").await.expect_err("a stale claim");
    assert!(matches!(error, CreateError::StaleUnowned { .. }), "{error}");
    assert_eq!(exit::of_create(&error), REFUSED);
}

#[tokio::test]
async fn refuses_to_adopt_an_unowned_claim_newer_than_the_job() {
    let ns = TestNamespace::new(ControlPlane::shared(), "unowned").await;
    JobBuilder::new("nb").create(&ns).await;
    // As the operator's ensureBuildPVC would create it for this job.
    ClaimBuilder::for_job("nb").create(&ns).await;

    let error = ensure(&ns, "nb").await.expect_err("an unowned claim");
    assert!(matches!(error, CreateError::Unowned { .. }), "{error}");
    assert_eq!(exit::of_create(&error), REFUSED);
    let claim = get_claim(&ns, "nb-build-workspace").await;
    assert_eq!(claim.metadata.owner_references, None, "adopted");
}

#[tokio::test]
async fn refuses_a_job_that_does_not_exist() {
    let ns = TestNamespace::new(ControlPlane::shared(), "no-job").await;
    let error = ensure(&ns, "nb").await.expect_err("no job");
    assert!(matches!(error, CreateError::JobNotFound { .. }), "{error}");
    assert_eq!(exit::of_create(&error), REFUSED);
}

#[tokio::test]
async fn deleting_the_job_removes_the_claim_through_its_owner_reference() {
    // The shared control plane runs kube-controller-manager's garbage collector.
    let ns = TestNamespace::new(ControlPlane::shared(), "cascade").await;
    JobBuilder::new("nb").create(&ns).await;
    ensure(&ns, "nb").await.expect("ensure");

    delete_job(&ns, "nb").await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let gone = wait_until(Duration::from_secs(60), || async {
        matches!(claims.get_opt("nb-build-workspace").await, Ok(None))
    })
    .await;
    assert!(
        gone,
        "the garbage collector did not delete the claim in 60 s"
    );
}

#[tokio::test]
async fn foreground_deletion_of_the_job_waits_for_the_claim() {
    let ns = TestNamespace::new(ControlPlane::shared(), "foreground").await;
    JobBuilder::new("nb").create(&ns).await;
    ensure(&ns, "nb").await.expect("ensure");

    let jobs = ns.dynamic_api(&notebook_validation_job_resource());
    jobs.delete("nb", &DeleteParams::foreground())
        .await
        .expect("delete the job");
    let claims = ns.api::<PersistentVolumeClaim>();
    // blockOwnerDeletion: the job stays until its claim is gone, so it can never be observed
    // gone while the claim remains.
    let both_gone = wait_until(Duration::from_secs(60), || async {
        let job_gone = matches!(jobs.get_opt("nb").await, Ok(None));
        let claim_gone = matches!(claims.get_opt("nb-build-workspace").await, Ok(None));
        assert!(!job_gone || claim_gone, "the job went before its claim");
        job_gone
    })
    .await;
    assert!(both_gone, "foreground deletion did not finish in 60 s");
}

/// What `workspace-gc create` needs in the job's namespace. Setting `blockOwnerDeletion` on a
/// reference to the job needs `update` on its `finalizers` subresource, because the control
/// plane enforces owner-reference permissions (OwnerReferencesPermissionEnforcement), as
/// OpenShift does.
fn creator_rules(with_finalizers: bool) -> Vec<PolicyRule> {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let mut rules = vec![
        rule("mlops.mlops.dev", &["notebookvalidationjobs"], &["get"]),
        rule("", &["persistentvolumeclaims"], &["create", "get"]),
    ];
    if with_finalizers {
        rules.push(rule(
            "mlops.mlops.dev",
            &["notebookvalidationjobs/finalizers"],
            &["update"],
        ));
    }
    rules
}

#[tokio::test]
async fn the_creator_needs_update_on_the_jobs_finalizers() {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "rbac").await;
    JobBuilder::new("nb").create(&ns).await;
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    let roles = ns.api::<Role>();
    roles
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta("creator"),
                rules: Some(creator_rules(false)),
            },
        )
        .await
        .expect("create role");
    ns.bind_role("creator", "creator").await;
    let as_creator = control_plane
        .service_account_client(ns.name(), "creator")
        .await;
    let job = read_job(&as_creator, ns.name(), "nb").await.expect("job");

    let error = ensure_build_claim(&as_creator, &job, &settings())
        .await
        .expect_err("no right to block the job's deletion");
    assert!(
        matches!(&error, CreateError::Api { source, .. }
            if matches!(source.as_ref(), kube::Error::Api(s)
                if s.code == 403 && s.message.contains("blockOwnerDeletion"))),
        "{error}"
    );
    assert_eq!(exit::of_create(&error), exit::FAILURE);

    roles
        .patch(
            "creator",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": creator_rules(true) })),
        )
        .await
        .expect("grant update on the job's finalizers");
    // RBAC changes reach the authorizer through a watch: allow it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ensured = loop {
        match ensure_build_claim(&as_creator, &job, &settings()).await {
            Err(CreateError::Api { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            result => break result,
        }
    };
    assert!(ensured.expect("allowed with the finalizers rule").created);
}

#[tokio::test]
async fn a_created_claim_is_tracked_and_linked_to_its_job_by_owner_reference() {
    let ns = TestNamespace::new(ControlPlane::shared(), "tracked").await;
    let job = JobBuilder::new("nb").phase("Building").create(&ns).await;
    ensure(&ns, "nb").await.expect("ensure");

    let mut config = Config::default();
    config.selector.namespaces = vec![ns.name().to_owned()];
    let mut failures = 0;
    let synced = watches::sync_once(ns.client(), &config, |kind, error| {
        failures += 1;
        eprintln!("listing {kind:?} failed: {error}");
        failures < 5
    });
    let index = tokio::time::timeout(Duration::from_secs(30), synced)
        .await
        .expect("the watches sync within 30 s")
        .expect("the watches sync");

    let rows = audit::rows(&index, &config.policies(), Utc::now());
    let row = rows
        .iter()
        .find(|row| row.name == "nb-build-workspace")
        .unwrap_or_else(|| panic!("the claim is not tracked: {rows:?}"));
    let job_owner = row
        .owners
        .iter()
        .find(|owner| owner.kind == OwnerKind::Job)
        .unwrap_or_else(|| panic!("no job linked: {:?}", row.owners));
    assert_eq!(job_owner.name, "nb");
    assert_eq!(job_owner.rule, LinkRule::OwnerReference);
    assert!(
        matches!(&job_owner.state, OwnerState::Present { uid, .. } if *uid == uid_of(&job)),
        "{:?}",
        job_owner.state
    );
}

/// Runs `workspace-gc create` against `control_plane` (or `kubeconfig` when given), with no
/// configuration from the environment.
async fn run_create(
    control_plane: &ControlPlane,
    kubeconfig: Option<&str>,
    namespace: &str,
    job: &str,
    output: &str,
) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_workspace-gc"));
    command
        .args(["create", "--namespace", namespace, "--job", job])
        .args(["--output", output])
        .env(
            "KUBECONFIG",
            kubeconfig.map_or_else(|| control_plane.kubeconfig_path(), std::path::Path::new),
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("WORKSPACE_GC_") {
            command.env_remove(key);
        }
    }
    command.output().await.expect("run workspace-gc create")
}

fn describe(output: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn the_create_command_prints_the_claim_and_exits_by_outcome() {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "command").await;
    let job = JobBuilder::new("nb").create(&ns).await;

    let output = run_create(control_plane, None, ns.name(), "nb", "json").await;
    assert_eq!(output.status.code(), Some(CREATED), "{}", describe(&output));
    let printed: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(&output)));
    assert_eq!(printed["kind"], "PersistentVolumeClaim");
    assert_eq!(printed["metadata"]["name"], "nb-build-workspace");
    assert_eq!(
        printed["metadata"]["ownerReferences"][0]["uid"],
        uid_of(&job)
    );
    assert!(printed["metadata"].get("managedFields").is_none());
    let stored = get_claim(&ns, "nb-build-workspace").await;
    assert_eq!(
        printed["metadata"]["uid"].as_str(),
        stored.metadata.uid.as_deref()
    );

    let output = run_create(control_plane, None, ns.name(), "nb", "yaml").await;
    assert_eq!(
        output.status.code(),
        Some(ALREADY_PRESENT),
        "{}",
        describe(&output)
    );
    let printed: PersistentVolumeClaim = serde_saphyr::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a claim in YAML ({e}): {}", describe(&output)));
    assert_eq!(printed.metadata.uid, stored.metadata.uid);

    // Refused: a stale claim of an earlier job, and a job that does not exist. Nothing printed.
    ClaimBuilder::for_job("old").create(&ns).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    JobBuilder::new("old").create(&ns).await;
    for job in ["old", "missing"] {
        let output = run_create(control_plane, None, ns.name(), job, "json").await;
        assert_eq!(output.status.code(), Some(REFUSED), "{}", describe(&output));
        assert!(output.stdout.is_empty(), "{}", describe(&output));
    }

    let output = run_create(
        control_plane,
        Some("/nonexistent/kubeconfig"),
        ns.name(),
        "nb",
        "json",
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(workspace_gc::surface::commands::exit::CLUSTER),
        "{}",
        describe(&output)
    );
}
