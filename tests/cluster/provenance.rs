//! Provenance (issue 47) on a real API server, whose own `managedFields` say who set the
//! build-workspace label: a claim labelled after it was made, by another field manager, is kept
//! with its reason, one event and the metric; the same claim made labelled in one write, as the
//! operator makes it, is collected. The daemon runs as the shipped identity.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, Daemon, TestNamespace, assert_decided,
    claim_exists, events, reconciles, wait_until,
};

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
