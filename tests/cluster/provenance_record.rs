//! What a claim's `managedFields` can prove (issue 55), on a real API server whose own field
//! managers write the record: the writes other tools really make must not read as the write
//! that made a claim. A GitOps tool that server-side applies an existing claim whole co-owns its
//! unchanged spec; more than ten writers make the server merge the oldest entries into one
//! `ancient-changes` entry. Both are kept, with their reason. The controls: `kubectl label`, a
//! labels-only apply (kept), the operator's create and a claim made by server-side apply alone
//! (collected when orphaned). The daemon runs as the shipped identity.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, Daemon, TestNamespace, assert_decided,
    claim_exists, events, wait_until,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A merge patch of `metadata` by field manager `manager` (an `Update` in the record), as
/// `kubectl label` and `kubectl annotate` write.
async fn patch_as(ns: &TestNamespace, name: &str, manager: &str, metadata: Value) {
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    ns.api::<PersistentVolumeClaim>()
        .patch(
            name,
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await
        .unwrap_or_else(|e| panic!("patch {name} as {manager}: {e}"));
}

/// The claim's record as the server keeps it: each entry's manager, operation and fields.
async fn record(ns: &TestNamespace, name: &str) -> Vec<(String, String, Value)> {
    let claim = ns.api::<PersistentVolumeClaim>().get(name).await;
    let claim = claim.unwrap_or_else(|e| panic!("get {name}: {e}"));
    (claim.metadata.managed_fields.into_iter().flatten())
        .map(|entry| {
            let fields = entry.fields_v1.map_or(Value::Null, |f| f.0);
            let operation = entry.operation.unwrap_or_default();
            (entry.manager.unwrap_or_default(), operation, fields)
        })
        .collect()
}

fn owns_label(fields: &Value) -> bool {
    fields["f:metadata"]["f:labels"][format!("f:{BUILD_WORKSPACE_LABEL}")].is_object()
}

fn owns_access_modes(fields: &Value) -> bool {
    fields["f:spec"]["f:accessModes"].is_object()
}

/// A claim made as the operator makes it: one create with its labels, manager `manager`.
async fn operator_claim(ns: &TestNamespace, name: &str) {
    ClaimBuilder::build_workspace(name)
        .field_manager("manager")
        .create(ns)
        .await;
}

/// Starts the daemon on `ns` with a one-second orphan grace, once every claim made so far is
/// past it, and waits until it has collected `witness` (an operator's orphan): by then it has
/// decided every claim of the namespace once.
async fn daemon_collecting(ns: &TestNamespace, witness: &str) -> Daemon {
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    // Whole-second creation times: every claim is past its grace when first decided.
    tokio::time::sleep(secs(2)).await;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, ns.name()).await;
    assert!(
        wait_until(secs(15), || async { !claim_exists(ns, witness).await }).await,
        "the operator's orphan is collected:\n{}",
        daemon.metrics().await
    );
    daemon
}

/// Runs the daemon beside an operator's orphan and asserts it keeps `claim`, the namespace's
/// one other claim, as no build workspace, with one event that `says` why.
async fn kept_and_told(ns: &TestNamespace, claim: &str, says: &str) {
    let witness = "made-build-workspace";
    operator_claim(ns, witness).await;
    let daemon = daemon_collecting(ns, witness).await;
    let verdict = ("keep", "not-a-build-workspace", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(claim_exists(ns, claim).await, "{claim} is kept");
    let note = told(ns, claim).await;
    assert!(note.contains(says), "the event says {says:?}: {note}");
    daemon.stop().await;
}

/// The note of the one `NotABuildWorkspace` event on `claim`.
async fn told(ns: &TestNamespace, claim: &str) -> String {
    let once = || async { events(ns, claim, "NotABuildWorkspace").await.len() == 1 };
    assert!(
        wait_until(secs(15), once).await,
        "one warning event on {claim}: {:#?}",
        ns.events().await
    );
    let events = events(ns, claim, "NotABuildWorkspace").await;
    events[0].note.clone().unwrap_or_default()
}

/// Case 1: a claim made unlabelled with `kubectl create`, then server-side applied whole by a
/// GitOps controller whose common labels are the operator's. The applier co-owns the unchanged
/// access modes; that is no proof it made the claim: kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_gitops_apply_of_an_existing_claim_does_not_make_it_a_build_workspace() {
    let ns = TestNamespace::new(ControlPlane::shared(), "record-adopt").await;
    let adopted = "cache-build-workspace";
    ClaimBuilder::plain(adopted)
        .field_manager("kubectl-create")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace(adopted)
        .apply(&ns, "argocd-controller")
        .await;
    let entries = record(&ns, adopted).await;
    let applier = entries
        .iter()
        .find(|(manager, ..)| manager == "argocd-controller");
    let creator = entries
        .iter()
        .find(|(manager, ..)| manager == "kubectl-create");
    assert!(
        applier.is_some_and(|(_, operation, fields)| operation == "Apply"
            && owns_label(fields)
            && owns_access_modes(fields))
            && creator.is_some_and(|(_, _, fields)| owns_access_modes(fields)),
        "the applier owns the label and shares the access modes: {entries:#?}"
    );
    kept_and_told(&ns, adopted, "by argocd-controller").await;
}

/// Case 2: a claim labelled by `kubectl label` after it was made, then annotated once by each
/// of nine tools with field managers of their own. Past ten `Update` entries the server merges
/// the oldest, the creator's and the labeller's, into one `ancient-changes` entry that owns the
/// access modes and the label; it proves nothing: kept, and the admin is told why.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_merged_into_ancient_changes_proves_nothing() {
    let ns = TestNamespace::new(ControlPlane::shared(), "record-merged").await;
    let merged = "data-build-workspace";
    ClaimBuilder::build_workspace(merged)
        .without_label(BUILD_WORKSPACE_LABEL)
        .field_manager("kubectl-create")
        .create(&ns)
        .await;
    patch_as(
        &ns,
        merged,
        "kubectl-label",
        json!({"labels": {BUILD_WORKSPACE_LABEL: "true"}}),
    )
    .await;
    // Entries of one second are merged in their managers' order: these sort after `kubectl-*`.
    let tools = [
        "velero",
        "opencost",
        "kyverno",
        "policy-reporter",
        "team-lead",
        "oncall-person",
        "restic",
        "trivy",
        "sealer",
    ];
    for tool in tools {
        let note = json!({"annotations": {format!("example.com/{tool}"): "seen"}});
        patch_as(&ns, merged, tool, note).await;
    }
    let entries = record(&ns, merged).await;
    let managers: Vec<&str> = (entries.iter()).map(|(m, ..)| m.as_str()).collect();
    let bucket = entries
        .iter()
        .find(|(manager, ..)| manager == "ancient-changes");
    assert!(
        bucket.is_some_and(|(_, _, fields)| owns_label(fields) && owns_access_modes(fields))
            && !managers.contains(&"kubectl-create")
            && !managers.contains(&"kubectl-label"),
        "the server merged the creator and the labeller into one entry: {entries:#?}"
    );
    kept_and_told(&ns, merged, "ancient-changes").await;
}

/// The records that must keep their verdicts: a label added by `kubectl label` or by a
/// labels-only server-side apply is kept; the operator's create (manager `manager`, one write
/// with its labels) and a claim made by server-side apply alone are candidates, collected as
/// orphans.
#[tokio::test(flavor = "multi_thread")]
async fn the_records_that_prove_a_making_still_do() {
    let ns = TestNamespace::new(ControlPlane::shared(), "record-controls").await;
    let (labelled, labels_applied, operator, applied) = (
        "labelled-build-workspace",
        "labels-applied-build-workspace",
        "operator-build-workspace",
        "applied-build-workspace",
    );
    for plain in [labelled, labels_applied] {
        ClaimBuilder::plain(plain)
            .field_manager("kubectl-create")
            .create(&ns)
            .await;
    }
    let labels = testkit::graph::operator_labels();
    patch_as(&ns, labelled, "kubectl-label", json!({ "labels": labels })).await;
    let labels_only = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": labels_applied, "labels": labels},
    });
    ns.api::<PersistentVolumeClaim>()
        .patch(
            labels_applied,
            &PatchParams::apply("flux"),
            &Patch::Apply(labels_only),
        )
        .await
        .expect("apply the labels alone");
    ClaimBuilder::build_workspace(applied)
        .apply(&ns, "argocd-controller")
        .await;
    let entries = record(&ns, applied).await;
    assert!(
        matches!(&entries[..], [(manager, operation, fields)]
            if manager == "argocd-controller" && operation == "Apply" && owns_access_modes(fields)),
        "the apply that made the claim is the only owner of its spec: {entries:#?}"
    );
    operator_claim(&ns, operator).await;

    let daemon = daemon_collecting(&ns, operator).await;
    assert!(
        wait_until(secs(15), || async { !claim_exists(&ns, applied).await }).await,
        "the claim made by server-side apply is collected:\n{}",
        daemon.metrics().await
    );
    assert_decided(
        || daemon.metrics(),
        0.0,
        ns.name(),
        ("keep", "not-a-build-workspace", 2.0),
    )
    .await;
    for kept in [labelled, labels_applied] {
        assert!(claim_exists(&ns, kept).await, "{kept} is kept");
    }
    assert!(told(&ns, labelled).await.contains("by kubectl-label"));
    assert!(told(&ns, labels_applied).await.contains("by flux"));
    daemon.stop().await;
}
