//! Kubernetes 1.37's `Unused` condition on a claim (feature gate
//! `PersistentVolumeClaimUnusedSinceTime`, beta and on by default from 1.37, alpha and off in
//! 1.36), as the real kube-controller-manager keeps it, and what it does to a late DELETE
//! (issue 46, class 6).
//!
//! The condition is written by the `persistentvolumeclaim-protection-controller` (the shared
//! control plane runs it) with an UpdateStatus of the claim, which gives the claim a new
//! resourceVersion. It is kept only on a claim whose `status.phase` is `Bound` and that is not
//! being deleted; "used" means any pod that is not terminated (Succeeded or Failed) names the
//! claim in its volumes: scheduled or not, no kubelet needed. A pod's creation, update or
//! deletion queues the claims it names. So a DELETE that carries the claim's resourceVersion
//! from before a pod started naming it, and that reaches the API server after the controller's
//! write, fails its precondition (409 Conflict): the window a queued DELETE has on a claim a
//! re-run started using closes at that write. On a claim that is not Bound nothing is written,
//! and the window stays open. RELIABILITY.md ("A late DELETE") and docs/deploy.md ("Between the
//! daemon and the API server") state this from these tests.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use testkit::{
    ClaimBuilder, ControlPlane, PodBuilder, TestNamespace, kubernetes_minor, kubernetes_version,
    wait_until,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// How long the controller may take to write the condition after the event that queues the
/// claim. Its work queue has no delay (measured: tens of milliseconds on an idle plane); the
/// bound leaves room for a loaded machine.
const WRITE_BOUND: Duration = Duration::from_secs(10);

/// Whether this release keeps the condition; if not, says why the test does nothing.
fn keeps_the_condition(test: &str) -> bool {
    if kubernetes_minor() >= 37 {
        return true;
    }
    eprintln!(
        "SKIPPED {test}: Kubernetes {} has no `Unused` claim condition on by default \
         (PersistentVolumeClaimUnusedSinceTime is beta, on by default, from 1.37)",
        kubernetes_version()
    );
    false
}

/// The claim's `Unused` condition status (`"True"`, `"False"`), if any.
fn unused(claim: &PersistentVolumeClaim) -> Option<String> {
    let conditions = claim.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|condition| condition.type_ == "Unused")
        .map(|condition| condition.status.clone())
}

fn version(claim: &PersistentVolumeClaim) -> String {
    claim.metadata.resource_version.clone().unwrap()
}

/// The DELETE the daemon sends (src/cluster/writer.rs), with the preconditions of `seen`: the
/// claim as it was when the daemon last checked it.
fn late_delete(seen: &PersistentVolumeClaim, dry_run: bool) -> DeleteParams {
    DeleteParams {
        dry_run,
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: seen.metadata.uid.clone(),
            resource_version: seen.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    }
}

/// Waits until claim `name` satisfies `done`; returns it and how long it took.
async fn wait_for_claim(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    bound: Duration,
    done: impl Fn(&PersistentVolumeClaim) -> bool,
) -> Option<(PersistentVolumeClaim, Duration)> {
    let start = Instant::now();
    let deadline = start + bound;
    loop {
        let claim = claims.get(name).await.expect("read the claim");
        if done(&claim) {
            return Some((claim, start.elapsed()));
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A bound claim no pod uses gets `Unused=True`; a pod that names it, created and never
/// scheduled (no kubelet, no scheduler, `Pending`), makes the controller write `Unused=False`
/// within [`WRITE_BOUND`], a new resourceVersion; and a DELETE carrying the resourceVersion
/// the claim had before the pod was created is then refused 409 (for real, not a dry run), the
/// claim untouched. The times measured are printed.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_naming_a_bound_claim_moves_its_version_so_a_late_delete_is_refused() {
    if !keeps_the_condition("a_pod_naming_a_bound_claim_moves_its_version") {
        return;
    }
    let ns = TestNamespace::new(ControlPlane::shared(), "unused").await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let name = "a-build-workspace";
    let created = Instant::now();
    ClaimBuilder::build_workspace(name)
        .bound()
        .create(&ns)
        .await;
    // The first write: a bound claim with no condition is queued and marked unused.
    let (quiet, took) = wait_for_claim(&claims, name, WRITE_BOUND, |claim| {
        unused(claim).as_deref() == Some("True")
    })
    .await
    .expect("a bound claim no pod names gets Unused=True");
    eprintln!(
        "{}: Unused=True {} ms after the claim was created and bound",
        kubernetes_version(),
        took.as_millis()
    );
    // Quiet: nothing writes it again while nothing changes (what the daemon re-checks).
    tokio::time::sleep(secs(2)).await;
    let still = claims.get(name).await.expect("read the claim");
    assert_eq!(
        version(&still),
        version(&quiet),
        "a quiet claim is not rewritten"
    );
    assert!(created.elapsed() > secs(2));

    // A re-run starts using it: a pod that names it, not scheduled, no kubelet.
    let pod_created = Instant::now();
    PodBuilder::new("rerun-pod")
        .mounting(name)
        .create(&ns)
        .await;
    let (used, took) = wait_for_claim(&claims, name, WRITE_BOUND, |claim| {
        version(claim) != version(&quiet)
    })
    .await
    .expect("a pod naming the claim moves its resourceVersion");
    eprintln!(
        "{}: the claim's resourceVersion moved {} ms after the pod was created (Unused={:?})",
        kubernetes_version(),
        took.as_millis(),
        unused(&used)
    );
    assert_eq!(unused(&used).as_deref(), Some("False"), "{used:?}");
    assert!(pod_created.elapsed() < WRITE_BOUND + secs(1));

    // The late DELETE, with the version the daemon saw before the pod: refused 409.
    match claims.delete(name, &late_delete(&quiet, false)).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409, "{status:?}");
            assert_eq!(status.reason, "Conflict", "{status:?}");
            eprintln!(
                "{}: the late DELETE was refused: {}",
                kubernetes_version(),
                status.message
            );
        }
        other => panic!("a DELETE with the version from before the pod is refused: {other:?}"),
    }
    let after = claims.get(name).await.expect("the claim is still there");
    assert!(after.metadata.deletion_timestamp.is_none());
    // The same DELETE with the current version is admitted (dry run): the 409 was the version.
    claims
        .delete(name, &late_delete(&after, true))
        .await
        .expect("a DELETE with the current version passes its preconditions");

    // The pod finishing is a write too: Unused=True again, another version.
    ns.api::<k8s_openapi::api::core::v1::Pod>()
        .delete("rerun-pod", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the pod");
    let (done, took) = wait_for_claim(&claims, name, WRITE_BOUND, |claim| {
        unused(claim).as_deref() == Some("True")
    })
    .await
    .expect("with its pod gone the claim is Unused=True again");
    assert_ne!(version(&done), version(&after));
    eprintln!(
        "{}: Unused=True again {} ms after the pod was deleted",
        kubernetes_version(),
        took.as_millis()
    );
}

/// The negative: a claim that is not `Bound` (a provisioner has not bound it yet, as with a
/// `WaitForFirstConsumer` class before the pod is scheduled) gets no condition, and a pod that
/// names it writes nothing: its resourceVersion stays, and a DELETE carrying the version from
/// before the pod passes its preconditions (dry run). The condition closes nothing there.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_naming_a_claim_that_is_not_bound_writes_nothing() {
    if !keeps_the_condition("a_pod_naming_a_claim_that_is_not_bound_writes_nothing") {
        return;
    }
    let ns = TestNamespace::new(ControlPlane::shared(), "unused-pending").await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let name = "a-build-workspace";
    let seen = ClaimBuilder::build_workspace(name).create(&ns).await;
    PodBuilder::new("rerun-pod")
        .mounting(name)
        .create(&ns)
        .await;
    assert!(
        !wait_until(secs(5), || async {
            let claim = claims.get(name).await.expect("read the claim");
            version(&claim) != version(&seen) || unused(&claim).is_some()
        })
        .await,
        "a claim that is not Bound is not written for its pods"
    );
    claims
        .delete(name, &late_delete(&seen, true))
        .await
        .expect("the DELETE from before the pod passes its preconditions");
}
