//! The real binary run the way the Deployment runs it under OpenShift's restricted-v2: the
//! ServiceAccount's token, the deployed configuration, an arbitrary UID and GID that exist
//! nowhere, and nothing writable.

use std::path::PathBuf;

use crate::server::{
    apply_base, assert_deleted, assert_nothing_forbidden, audit, event_with_reason, lease_holder,
};
use crate::{LEASE, NAMESPACE, scratch, secs};
use testkit::{
    ARBITRARY_UID, ClaimBuilder, ControlPlane, DeployedDaemon as Daemon, Launch, Rendered,
    TestNamespace, confined, credentials, manifests, readable_copy, sample, wait_until,
};

/// The daemon as the Deployment runs it, and as OpenShift's restricted-v2 runs that: the
/// ServiceAccount's token, the deployed configuration, an arbitrary UID and GID that exist
/// nowhere, and nothing writable. It becomes ready, leads, deletes an expired claim and records
/// the event.
#[tokio::test(flavor = "multi_thread")]
async fn base_daemon_deletes_an_expired_claim_with_the_deployed_rbac_and_configuration() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let admin = control_plane.client();
    let ns = TestNamespace::new(control_plane, "deploy-base").await;
    let scratch = scratch();
    let pod_name = "workspace-gc-5d9c7b-test1";
    // The token the kubelet mounts is bound to the pod: the guard's fence admits the deletes
    // of the Lease holder's pod only.
    let token = control_plane
        .pod_bound_kubeconfig(NAMESPACE, "workspace-gc", pod_name)
        .await;
    let kubeconfig = readable_copy(&token, scratch.path());
    let base = Rendered::of(&manifests("base"));
    let launch = Launch::from(&base, pod_name, scratch.path()).confined_as(ARBITRARY_UID);

    // The confinement holds: even the world-writable directories are read-only in there.
    for dir in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let output = confined(ARBITRARY_UID, "touch")
            .arg(dir.join("workspace-gc-write-check"))
            .output()
            .await
            .expect("run touch, confined");
        assert!(
            !output.status.success()
                && String::from_utf8_lossy(&output.stderr).contains("Read-only file system"),
            "a confined process could write to {}: {output:?}",
            dir.display()
        );
    }

    // Cluster-wide reads work with the ClusterRole: the one-shot audit lists every kind in
    // every namespace (read-only) and exits 0.
    let (code, output) = audit(&launch, &kubeconfig, &[]).await;
    assert_eq!(
        code,
        Some(0),
        "cluster-wide audit as the ServiceAccount:\n{output}"
    );
    // The label guard came with the base, and the ServiceAccount may read it: the report says so.
    assert!(
        output.contains("label guard: installed: "),
        "the audit's header:\n{output}"
    );

    // An orphan, expired at once: the operator's claim with no PipelineRun or job.
    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    let _turn = LEASE.lock().await;
    // Scoped to this test's namespace (the ClusterRole covers it) so no other test's claim is
    // touched; otherwise exactly the Deployment's command line and environment.
    let daemon = Daemon::start(
        &launch,
        &kubeconfig,
        scratch.path(),
        &[format!("--namespace={}", ns.name())],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;

    assert_deleted(&admin, ns.name(), claim, &daemon).await;
    assert!(
        wait_until(secs(10), || async {
            event_with_reason(&admin, ns.name(), claim, "Deleted")
                .await
                .is_some()
        })
        .await,
        "a Deleted event:\n{}",
        daemon.log()
    );
    // It ran as the arbitrary UID and GID, with no other group.
    let pid = daemon.child.id().expect("the daemon is running");
    let id = ARBITRARY_UID.to_string();
    let all = [id.as_str(); 4].join(" ");
    assert_eq!(credentials(pid), (all.clone(), all, String::new()));
    let event = event_with_reason(&admin, ns.name(), claim, "Deleted")
        .await
        .unwrap();
    assert_eq!(event.reporting_controller.as_deref(), Some("workspace-gc"));
    assert_eq!(event.reporting_instance.as_deref(), Some(pod_name));
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    // It led through the Lease in its own namespace, under the pod's name.
    assert_eq!(
        lease_holder(&admin, NAMESPACE).await.as_deref(),
        Some(pod_name)
    );

    let deleted = format!(
        "workspace_gc_deletions_total{{claim_namespace=\"{}\",reason=\"orphaned\",result=\"deleted\"}}",
        ns.name()
    );
    let metrics = daemon.metrics_when(&deleted, 1.0).await;
    assert_eq!(sample(&metrics, "workspace_gc_leader"), Some(1.0));
    daemon
        .metrics_when("workspace_gc_label_guard_installed", 1.0)
        .await;
    assert_nothing_forbidden(&metrics);

    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "exit 0 on SIGTERM:\n{log}");
    // It handed the Lease back on the way out, so a standby would not wait for expiry.
    assert_eq!(lease_holder(&admin, NAMESPACE).await, None);
}
