//! The blast-radius cap's share (`deletion.max_deletions_percent`) on a real API server: a share
//! of the candidates (labelled claims that pass provenance and are not terminating), not of every
//! labelled claim watched, and counted so that claims arriving in a window do not raise that
//! window's allowance (issue 55, case 4).

use std::time::Duration;

use testkit::{
    ClaimBuilder, ControlPlane, Process, TestNamespace, deleted_count, elected_vars, expiring,
    in_secs, log_dir, set_var, wait_until, warned,
};

/// 10 kept candidates, and 40 labelled claims in another watched namespace that are no
/// candidates (their names lack the operator's shape). Then 5 leaked claims arrive at once.
/// 10 % of the candidates the window began with is 1: one is deleted, four wait for the next
/// window. (Before, the share was taken of every labelled claim watched: 10 % of 55 let all
/// five go in one window.)
#[tokio::test(flavor = "multi_thread")]
async fn junk_labelled_claims_and_a_flood_raise_no_windows_share() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "share").await;
    let junk = TestNamespace::new(cp, "share-junk").await;
    for i in 0..10 {
        // Young orphans: kept for the orphan grace (1h), candidates all the same.
        ClaimBuilder::build_workspace(&format!("steady{i}-build-workspace"))
            .create(&ns)
            .await;
    }
    for i in 0..40 {
        ClaimBuilder::build_workspace(&format!("junk-{i}"))
            .create(&junk)
            .await;
    }
    let mut vars = elected_vars(&ns, "4s");
    let both = format!("{},{}", ns.name(), junk.name());
    set_var(&mut vars, "WORKSPACE_GC_SELECTOR_NAMESPACES", &both);
    set_var(
        &mut vars,
        "WORKSPACE_GC_DELETION_MAX_DELETIONS_PERCENT",
        "10",
    );
    set_var(&mut vars, "WORKSPACE_GC_DELETION_WINDOW", "1h");
    let kubeconfig = ns.daemon_kubeconfig(&vars).await;
    let logs = log_dir("share");
    let daemon = Process::spawn(&kubeconfig, &vars, "gc", &logs.path().join("gc.log"));
    // Leading, and its caches listed (ready): what comes next arrives after the count began.
    let started = || async { daemon.leading().await && daemon.ready().await };
    assert!(
        wait_until(Duration::from_secs(30), started).await,
        "{}",
        daemon.logs()
    );
    let leaked: Vec<String> = (0..5)
        .map(|i| format!("leaked{i}-build-workspace"))
        .collect();
    for name in &leaked {
        expiring(name, in_secs(-60)).create(&ns).await;
    }
    // Each is deleted or held back by the cap (and told once).
    let settled = || async {
        deleted_count(&ns, &leaked).await + warned(&daemon.logs(), &ns, &leaked) >= leaked.len()
    };
    let all_settled = wait_until(Duration::from_secs(60), settled).await;
    assert_eq!(
        deleted_count(&ns, &leaked).await,
        1,
        "10 % of the 10 candidates the window began with (settled: {all_settled}):\n{}",
        daemon.logs()
    );
    assert!(all_settled, "{}", daemon.logs());
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}
