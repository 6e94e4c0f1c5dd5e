//! Provenance (issue 47) on a real API server, whose own `managedFields` say who set the
//! build-workspace label: a claim labelled after it was made, by another field manager, is kept
//! with its reason, one event and the metric; the same claim made labelled in one write, as the
//! operator makes it, is collected. The daemon runs as the shipped identity. The label guard,
//! on by default, refuses adding the label to an existing claim to everyone but the identities
//! listed in `provenance.label_writers` (none as shipped); the daemon and the audit say whether
//! the API server holds it.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, Daemon, TestNamespace, assert_decided,
    claim_exists, events, policy_rule, reconciles, wait_until,
};
use workspace_gc::config::SelectorConfig;
use workspace_gc::surface::admission::{LABEL_GUARD_NAME, label_guard};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Writes `labels` onto claim `name` as field manager `manager`, as `kubectl label` does (a
/// merge patch, an `Update` in the record).
async fn label_as(ns: &TestNamespace, name: &str, manager: &str, labels: serde_json::Value) {
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    let patch = Patch::Merge(json!({"metadata": {"labels": labels}}));
    ns.api::<PersistentVolumeClaim>()
        .patch(name, &params, &patch)
        .await
        .unwrap_or_else(|e| panic!("label {name} as {manager}: {e}"));
}

/// Three orphans past their grace, all of the operator's name shape and labels: one made
/// without the label and labelled later by `kubectl-label`, one made labelled in one write by
/// the operator's field manager, and one of those whose `managedFields` a client cleared.
/// Only the operator's is deleted; the relabelled one is told once, however often it is
/// decided again.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_labelled_after_it_was_made_is_kept_and_the_operators_is_collected() {
    let ns = TestNamespace::new(ControlPlane::shared(), "provenance").await;
    let (later, made, stripped) = (
        "data-build-workspace",
        "made-build-workspace",
        "stripped-build-workspace",
    );
    ClaimBuilder::build_workspace(later)
        .without_label(BUILD_WORKSPACE_LABEL)
        .field_manager("kubectl-create")
        .create(&ns)
        .await;
    label_as(
        &ns,
        later,
        "kubectl-label",
        json!({BUILD_WORKSPACE_LABEL: "true"}),
    )
    .await;
    ClaimBuilder::build_workspace(made)
        .field_manager("manager")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace(stripped)
        .field_manager("manager")
        .create(&ns)
        .await;
    // The documented way to clear them: one empty entry.
    let cleared = ns
        .api::<PersistentVolumeClaim>()
        .patch(
            stripped,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": [{}]}})),
        )
        .await
        .expect("clear the managed fields");
    assert_eq!(
        cleared
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default(),
        [],
        "the server keeps no record of the claim"
    );

    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    // Whole-second creation times: every claim is past its grace when first decided.
    tokio::time::sleep(secs(2)).await;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "provenance").await;

    assert!(
        wait_until(secs(15), || async { !claim_exists(&ns, made).await }).await,
        "the operator's orphan is collected:\n{}",
        daemon.metrics().await
    );
    // The witness, and the metric: both others decided, kept for their provenance.
    let verdict = ("keep", "not-a-build-workspace", 2.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, later).await,
        "the relabelled claim is kept"
    );
    assert!(
        claim_exists(&ns, stripped).await,
        "the unrecorded claim is kept"
    );
    let told = |claim: &'static str| {
        let ns = &ns;
        async move { events(ns, claim, "NotABuildWorkspace").await }
    };
    assert!(
        wait_until(secs(15), || async { told(later).await.len() == 1 }).await,
        "a warning event on the relabelled claim: {:#?}",
        ns.events().await
    );
    let note = told(later).await[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("added after it was made, by kubectl-label"),
        "the event names the hand that added the label: {note}"
    );
    assert!(
        wait_until(secs(15), || async { told(stripped).await.len() == 1 }).await,
        "a warning event on the unrecorded claim"
    );
    let note = told(stripped).await[0].note.clone().unwrap_or_default();
    assert!(note.contains("managedFields are empty"), "{note}");

    // Decided again after a change of the claim that is not the label: told once all the same.
    let since = reconciles(&daemon.metrics().await);
    label_as(&ns, later, "kubectl-label", json!({"team": "data"})).await;
    assert_decided(|| daemon.metrics(), since, ns.name(), verdict).await;
    let events = told(later).await;
    assert_eq!(events.len(), 1, "told once: {events:#?}");
    assert!(events[0].series.is_none(), "never repeated: {events:#?}");
    assert!(claim_exists(&ns, later).await);
    daemon.stop().await;
}

/// Grants `subjects` what a person or a controller editing claims has: read, patch, update.
async fn claim_editors(ns: &TestNamespace, subjects: Vec<Subject>) {
    let role = Role {
        metadata: ObjectMeta {
            name: Some("claim-editor".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![policy_rule(
            &[""],
            &["persistentvolumeclaims"],
            &["get", "list", "create", "patch", "update"],
        )]),
    };
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("create the Role");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("claim-editor".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "claim-editor".into(),
        },
        subjects: Some(subjects),
    };
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
}

fn service_account(ns: &TestNamespace, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(ns.name().to_owned()),
        ..Subject::default()
    }
}

/// Adds the build-workspace label to `claim` as `client` (a merge patch, as `kubectl label`).
async fn add_label(
    client: &Client,
    ns: &TestNamespace,
    claim: &str,
    dry_run: bool,
) -> Result<PersistentVolumeClaim, kube::Error> {
    let params = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    let patch = Patch::Merge(json!({"metadata": {"labels": {BUILD_WORKSPACE_LABEL: "true"}}}));
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns.name())
        .patch(claim, &params, &patch)
        .await
}

/// Waits until the label guard is in force once the API server's informers have it: probed
/// with dry runs of `client` adding the label to `claim`, which change nothing.
async fn wait_for_label_guard(client: &Client, ns: &TestNamespace, claim: &str) {
    let deadline = std::time::Instant::now() + secs(30);
    loop {
        match add_label(client, ns, claim, true).await {
            Err(kube::Error::Api(status)) if status.message.contains("label-only-at-creation") => {
                return;
            }
            answer if std::time::Instant::now() > deadline => {
                panic!("the label guard did not come into force: {answer:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `result` is the label guard's refusal: 403, naming its rule.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, who: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{who}: {status:?}");
            assert!(
                status
                    .message
                    .contains("workspace-gc admission guard: rule label-only-at-creation: "),
                "{who}: refused by the label guard, not RBAC: {status:?}"
            );
        }
        other => panic!("{who}: not refused: {other:?}"),
    }
}

/// The label guard (`provenance.label_writers`) on the real API server, with the identities real
/// clusters use: a person (`alice`), a GitOps controller's ServiceAccount, and the operator's.
/// Only the operator's may add the build-workspace label to an existing claim; a patch or an
/// update by the others is refused, and so is a dry run. Creating a labelled claim, changing
/// another label and removing it stay open to all. The guard is bound to this test's namespace
/// alone: the control plane is shared.
#[tokio::test(flavor = "multi_thread")]
async fn the_label_guard_lets_only_the_operator_add_the_label_to_an_existing_claim() {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "label-guard").await;
    let (gitops, operator) = (
        "argocd-application-controller",
        "notebook-validator-operator",
    );
    claim_editors(
        &ns,
        vec![
            Subject {
                kind: "User".into(),
                name: "alice".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Subject::default()
            },
            service_account(&ns, gitops),
            service_account(&ns, operator),
        ],
    )
    .await;
    let alice = {
        let mut config = control_plane.config();
        config.auth_info.impersonate = Some("alice".into());
        Client::try_from(config).expect("a client as alice")
    };
    let gitops = control_plane
        .service_account_client(ns.name(), gitops)
        .await;
    let operator_name = format!("system:serviceaccount:{}:{operator}", ns.name());
    let operator = control_plane
        .service_account_client(ns.name(), operator)
        .await;

    // As `admission-policy` prints it with the operator listed, for a daemon watching this
    // namespace alone: bound to it (the control plane is shared).
    let name = format!("{LABEL_GUARD_NAME}-{}", ns.name());
    let (policy, binding) = label_guard(&watching(&ns), &[operator_name]);
    install_label_guard(control_plane, &name, policy, binding).await;
    let (policies, bindings) = label_guard_apis(control_plane);

    for claim in [
        "data-build-workspace",
        "other-build-workspace",
        "third-build-workspace",
    ] {
        ClaimBuilder::build_workspace(claim)
            .without_label(BUILD_WORKSPACE_LABEL)
            .create(&ns)
            .await;
    }
    wait_for_label_guard(&alice, &ns, "data-build-workspace").await;

    refused(
        add_label(&alice, &ns, "data-build-workspace", false).await,
        "alice",
    );
    refused(
        add_label(&gitops, &ns, "data-build-workspace", false).await,
        "gitops patch",
    );
    // An update of the whole claim, as a GitOps controller replaces it.
    let claims = Api::<PersistentVolumeClaim>::namespaced(gitops.clone(), ns.name());
    let mut whole = claims
        .get("other-build-workspace")
        .await
        .expect("read the claim");
    (whole.metadata.labels.get_or_insert_default())
        .insert(BUILD_WORKSPACE_LABEL.into(), "true".into());
    refused(
        claims
            .replace("other-build-workspace", &PostParams::default(), &whole)
            .await,
        "gitops update",
    );
    // Another value is no build workspace; turning it into `true` is adding it.
    let other_value = Patch::Merge(json!({"metadata": {"labels": {BUILD_WORKSPACE_LABEL: "no"}}}));
    Api::<PersistentVolumeClaim>::namespaced(alice.clone(), ns.name())
        .patch(
            "third-build-workspace",
            &PatchParams::default(),
            &other_value,
        )
        .await
        .expect("a value other than true is not the label");
    refused(
        add_label(&alice, &ns, "third-build-workspace", false).await,
        "alice, from no",
    );

    let labelled = add_label(&operator, &ns, "data-build-workspace", false)
        .await
        .expect("the operator may add the label");
    assert_eq!(
        labelled.metadata.labels.unwrap_or_default()[BUILD_WORKSPACE_LABEL],
        "true"
    );
    // Once there, other changes are anyone's: another label, the label's removal.
    let alice_claims = Api::<PersistentVolumeClaim>::namespaced(alice.clone(), ns.name());
    alice_claims
        .patch(
            "data-build-workspace",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "data"}}})),
        )
        .await
        .expect("changing another label is not adding it");
    alice_claims
        .patch(
            "data-build-workspace",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {BUILD_WORKSPACE_LABEL: null}}})),
        )
        .await
        .expect("removing the label is allowed");
    // Made labelled: a create is not an addition (the provenance rule reads who made it).
    ClaimBuilder::build_workspace("made-build-workspace")
        .create(&ns)
        .await;
    alice_claims
        .create(
            &PostParams::default(),
            &PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("alices-build-workspace".into()),
                    labels: Some([(BUILD_WORKSPACE_LABEL.to_owned(), "true".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                spec: whole.spec.clone(),
                status: None,
            },
        )
        .await
        .expect("creating a labelled claim is not refused by the label guard");

    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .expect("remove the binding");
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .expect("remove the policy");
}

/// A daemon's selector that watches `ns` alone: the label guard printed for it is bound to `ns`
/// only (the control plane is shared).
fn watching(ns: &TestNamespace) -> SelectorConfig {
    let mut selector = workspace_gc::config::Config::default().selector;
    selector.namespaces = vec![ns.name().to_owned()];
    selector
}

fn label_guard_apis(
    control_plane: &ControlPlane,
) -> (
    Api<ValidatingAdmissionPolicy>,
    Api<ValidatingAdmissionPolicyBinding>,
) {
    (
        Api::all(control_plane.client()),
        Api::all(control_plane.client()),
    )
}

/// Creates `policy` and `binding` under `name`, the binding naming the policy.
async fn install_label_guard(
    control_plane: &ControlPlane,
    name: &str,
    mut policy: ValidatingAdmissionPolicy,
    mut binding: ValidatingAdmissionPolicyBinding,
) {
    policy.metadata.name = Some(name.to_owned());
    binding.metadata.name = Some(name.to_owned());
    binding.spec.policy_name = name.to_owned();
    let (policies, bindings) = label_guard_apis(control_plane);
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the label guard");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the label guard");
}

async fn remove_label_guard(control_plane: &ControlPlane, name: &str) {
    let (policies, bindings) = label_guard_apis(control_plane);
    bindings
        .delete(name, &DeleteParams::default())
        .await
        .expect("remove the binding");
    policies
        .delete(name, &DeleteParams::default())
        .await
        .expect("remove the policy");
}

/// The shipped label guard's policy (manifests/components/admission-guard/guard.yaml, which the
/// base, the overlays and the chart install), as printed for the shipped configuration.
fn shipped_label_guard_policy() -> ValidatingAdmissionPolicy {
    let path = testkit::manifests("components/admission-guard/guard.yaml");
    let text = std::fs::read_to_string(&path).expect("read the shipped guard");
    let shipped = testkit::Rendered::parse(&text);
    serde_json::from_value(
        shipped
            .get("ValidatingAdmissionPolicy", LABEL_GUARD_NAME)
            .clone(),
    )
    .expect("the shipped label guard's policy")
}

/// The label guard as shipped, with no writers listed (issue 55), on the real API server: a
/// label added to a claim made without it is refused to everyone, with the rule's message, be it
/// a merge patch as `kubectl label` sends, a server-side apply of the whole claim as a GitOps
/// controller sends, or the operator's own ServiceAccount (it labels at creation and needs no
/// entry). Creating a claim with the label is admitted, and so is applying a claim that already
/// has it. Bound to this test's namespace: the control plane is shared.
#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_label_guard_refuses_adding_the_label_to_everyone_and_admits_claims_made_with_it()
 {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "label-guard-shipped").await;
    let (gitops, operator) = (
        "argocd-application-controller",
        "notebook-validator-operator",
    );
    claim_editors(
        &ns,
        vec![service_account(&ns, gitops), service_account(&ns, operator)],
    )
    .await;
    let gitops = control_plane
        .service_account_client(ns.name(), gitops)
        .await;
    let operator = control_plane
        .service_account_client(ns.name(), operator)
        .await;
    let name = format!("{LABEL_GUARD_NAME}-{}", ns.name());
    let (_, binding) = label_guard(&watching(&ns), &[]);
    install_label_guard(control_plane, &name, shipped_label_guard_policy(), binding).await;

    ClaimBuilder::build_workspace("cache-build-workspace")
        .without_label(BUILD_WORKSPACE_LABEL)
        .field_manager("kubectl-create")
        .create(&ns)
        .await;
    wait_for_label_guard(&gitops, &ns, "cache-build-workspace").await;

    // kubectl label, as anyone: refused, and the message says what to do.
    let answer = add_label(&gitops, &ns, "cache-build-workspace", false).await;
    if let Err(kube::Error::Api(status)) = &answer {
        assert!(
            status.message.contains("by nobody")
                && status.message.contains("Create the claim with the label")
                && status.message.contains("provenance.label_writers"),
            "{status:?}"
        );
    }
    refused(answer, "kubectl-style label");
    refused(
        add_label(&operator, &ns, "cache-build-workspace", false).await,
        "the operator",
    );
    // The GitOps adoption: the whole claim applied server-side with the label.
    let claims = Api::<PersistentVolumeClaim>::namespaced(gitops.clone(), ns.name());
    let existing = claims
        .get("cache-build-workspace")
        .await
        .expect("read the claim");
    let whole = |name: &str| {
        Patch::Apply(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {BUILD_WORKSPACE_LABEL: "true"}},
            "spec": {
                "accessModes": existing.spec.as_ref().and_then(|s| s.access_modes.clone()),
                "resources": existing.spec.as_ref().and_then(|s| s.resources.clone()),
            },
        }))
    };
    let apply = PatchParams::apply("argocd-controller").force();
    refused(
        claims
            .patch(
                "cache-build-workspace",
                &apply,
                &whole("cache-build-workspace"),
            )
            .await,
        "a server-side apply adding the label",
    );
    let kept = claims.get("cache-build-workspace").await.unwrap();
    assert!(
        !(kept.metadata.labels.unwrap_or_default()).contains_key(BUILD_WORKSPACE_LABEL),
        "the claim is still unlabelled"
    );

    // Made with the label, by the operator or by an apply that creates: admitted; applied again
    // with the label it has: admitted.
    ClaimBuilder::build_workspace("made-build-workspace")
        .field_manager("manager")
        .create(&ns)
        .await;
    claims
        .patch(
            "applied-build-workspace",
            &apply,
            &whole("applied-build-workspace"),
        )
        .await
        .expect("a server-side apply that creates the claim labelled is admitted");
    claims
        .patch(
            "applied-build-workspace",
            &apply,
            &whole("applied-build-workspace"),
        )
        .await
        .expect("applying it again, the label unchanged, is admitted");

    remove_label_guard(control_plane, &name).await;
}

/// `workspace-gc audit` over `ns` as cluster-admin, its table as printed.
async fn audit_table(control_plane: &ControlPlane, ns: &TestNamespace) -> String {
    let stdout = testkit::audit_output(control_plane, &["--namespace", ns.name()], &[]).await;
    String::from_utf8_lossy(&stdout).into_owned()
}

/// Where the label guard is not installed, the managedFields record is the only line, and the
/// admin is told: the audit's header says NOT INSTALLED until the API server holds the policy and
/// a binding that denies under the shipped name, then installed; the daemon's
/// `workspace_gc_label_guard_installed` is 1 while it is there and falls to 0 once it is removed
/// (read every minute). No other test of this binary installs it under that name; this one binds
/// it to its own namespace.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_and_the_audit_say_whether_the_label_guard_is_installed() {
    let control_plane = ControlPlane::shared();
    let ns = TestNamespace::new(control_plane, "label-guard-signal").await;
    let (policies, _) = label_guard_apis(control_plane);
    assert!(
        policies.get_opt(LABEL_GUARD_NAME).await.unwrap().is_none(),
        "no test of this binary installs the label guard under its shipped name but this one"
    );
    let table = audit_table(control_plane, &ns).await;
    assert!(
        table.starts_with("label guard: NOT INSTALLED: ")
            && table.contains("managedFields record is the only line"),
        "{table}"
    );

    let (_, binding) = label_guard(&watching(&ns), &[]);
    install_label_guard(
        control_plane,
        LABEL_GUARD_NAME,
        shipped_label_guard_policy(),
        binding,
    )
    .await;
    let table = audit_table(control_plane, &ns).await;
    assert!(table.starts_with("label guard: installed: "), "{table}");

    let config = ns.config();
    let daemon = Daemon::start(
        ns.daemon_client(&config).await,
        config,
        "label-guard-signal",
    )
    .await;
    let installed = || async {
        testkit::metric(
            &daemon.metrics().await,
            "workspace_gc_label_guard_installed",
            "",
        )
    };
    assert!(
        wait_until(secs(30), || async { installed().await == 1.0 }).await,
        "the daemon reads the label guard as installed, with its shipped rights"
    );
    remove_label_guard(control_plane, LABEL_GUARD_NAME).await;
    assert!(
        wait_until(secs(150), || async { installed().await == 0.0 }).await,
        "the daemon tells the label guard is gone within its period"
    );
    daemon.stop().await;
}
