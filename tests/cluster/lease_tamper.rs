//! The blast-radius cap against a Lease that someone else changes, on the real control plane:
//! a deletion ledger that parses but cannot be an honest record of the window, one edited while
//! a replica leads, and a Lease deleted while a replica leads (`kubectl delete lease`, the usual
//! way to force a re-election). In every case no more claims are deleted than the cap allows in
//! a window. RELIABILITY.md, "The ledger rule", states the rule.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, Process, TestNamespace, capped, deleted_count, elected_vars,
    leads_within_the_cap, log_dir, metric, set_var, wait_until,
};
use workspace_gc::config::Config;
use workspace_gc::contract::annotations;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The cap: 2 per hour, so buckets of 36 s.
const MAX: usize = 2;
const BUCKET_MILLIS: i64 = 36_000;

fn lease_name() -> String {
    Config::default().leader_election.lease_name
}

/// A namespace with six claims long due, and the variables of a replica with a 4 s lease and a
/// cap of 2 per hour there.
async fn six_due(prefix: &str) -> (TestNamespace, Vec<String>, Vec<(&'static str, String)>) {
    let ns = TestNamespace::new(ControlPlane::shared(), prefix).await;
    let mut vars = elected_vars(&ns, "4s");
    set_var(
        &mut vars,
        "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
        &MAX.to_string(),
    );
    set_var(&mut vars, "WORKSPACE_GC_DELETION_WINDOW", "1h");
    let names: Vec<String> = (0..6).map(|i| format!("due{i}-build-workspace")).collect();
    for name in &names {
        ClaimBuilder::build_workspace(name)
            .annotation(annotations::EXPIRES, "2000-01-01T00:00:00Z")
            .create(&ns)
            .await;
    }
    (ns, names, vars)
}

async fn ledger_on(ns: &TestNamespace) -> Option<String> {
    ns.api::<Lease>()
        .get_opt(&lease_name())
        .await
        .expect("get the lease")?
        .metadata
        .annotations?
        .remove(annotations::DELETIONS)
}

async fn faults(replica: &Process, fault: &str) -> f64 {
    metric(
        &replica.metrics().await,
        "workspace_gc_blast_radius_ledger_faults_total",
        &format!("fault=\"{fault}\""),
    )
}

/// A replica that wins a Lease whose ledger parses but is not plausible (`fault` says why)
/// counts the window as full: it deletes nothing, says so, and counts the fault.
async fn an_implausible_ledger_holds_a_window(prefix: &str, ledger: &str, fault: &str) {
    let (ns, names, vars) = six_due(prefix).await;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name()),
            annotations: Some([(annotations::DELETIONS.to_owned(), ledger.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: None,
    };
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .expect("create the tampered lease");
    let logs = log_dir("lease-tamper");
    let kubeconfig = ns.daemon_kubeconfig(&vars).await;
    let a = Process::spawn(&kubeconfig, &vars, "replica-a", &logs.path().join("a.log"));
    leads_within_the_cap(&a, &ns, &names, 0, "on a tampered ledger").await;
    assert_eq!(faults(&a, fault).await, 1.0, "{}", a.logs());
    assert!(
        a.logs()
            .contains("counting the cap as reached for one window"),
        "{}",
        a.logs()
    );
    let status = a.terminate().await;
    assert!(status.success(), "{status}");
}

/// A bucket dated at the end of i64, past chrono's range: it once counted forever and so
/// never let the cap name an instant, which read as "not capped".
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_dated_past_chronos_range_counts_as_a_full_window() {
    let ledger = format!(
        r#"{{"bucketMillis":{BUCKET_MILLIS},"deletions":[[{},{MAX}]]}}"#,
        i64::MAX
    );
    an_implausible_ledger_holds_a_window("tamper-date", &ledger, "date").await;
}

/// A bucket of i64::MAX milliseconds: its record moved to the latest instant it could stand
/// for, past chrono's range, with the same effect.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_with_a_huge_bucket_counts_as_a_full_window() {
    let ledger = format!(r#"{{"bucketMillis":{},"deletions":[[0,{MAX}]]}}"#, i64::MAX);
    an_implausible_ledger_holds_a_window("tamper-bucket", &ledger, "bucket").await;
}

/// Starts `replica-a` and waits until it has deleted the 2 the cap allows.
async fn deletes_up_to_the_cap(
    ns: &TestNamespace,
    names: &[String],
    vars: &[(&'static str, String)],
    log: &std::path::Path,
) -> Process {
    let kubeconfig = ns.daemon_kubeconfig(vars).await;
    let a = Process::spawn(&kubeconfig, vars, "replica-a", log);
    assert!(
        wait_until(secs(30), || async {
            capped(&a).await && deleted_count(ns, names).await == MAX
        })
        .await,
        "replica-a deletes {MAX} and reaches the cap:\n{}",
        a.logs()
    );
    a
}

/// Someone replaces the ledger with an empty, plausible one while a replica leads. Its own
/// count is the record of what it deleted: its next renewal writes it back, so a crash and a
/// restart then still find the window full.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_emptied_while_leading_is_written_back() {
    let (ns, names, vars) = six_due("tamper-emptied").await;
    let logs = log_dir("lease-tamper");
    let a = deletes_up_to_the_cap(&ns, &names, &vars, &logs.path().join("a.log")).await;
    let empty = format!(r#"{{"bucketMillis":{BUCKET_MILLIS},"deletions":[]}}"#);
    let patch = json!({ "metadata": { "annotations": { annotations::DELETIONS: empty } } });
    ns.api::<Lease>()
        .patch(&lease_name(), &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("empty the ledger");
    assert!(
        wait_until(secs(15), || async {
            ledger_on(&ns).await.is_some_and(|l| l != empty)
        })
        .await,
        "the leader writes its ledger back:\n{}",
        a.logs()
    );
    assert_eq!(faults(&a, "changed").await, 1.0, "{}", a.logs());

    a.kill().await;
    let kubeconfig = ns.daemon_kubeconfig(&vars).await;
    let a = Process::spawn(&kubeconfig, &vars, "replica-a", &logs.path().join("a2.log"));
    leads_within_the_cap(&a, &ns, &names, MAX, "after the restart").await;
    let status = a.terminate().await;
    assert!(status.success(), "{status}");
}

/// Deletes the Lease and waits until a replica has created it again and holds it.
async fn delete_the_lease(ns: &TestNamespace, holder: &str, watching: &Process) {
    let api = ns.api::<Lease>();
    let old = api.get(&lease_name()).await.expect("get the lease");
    api.delete(&lease_name(), &DeleteParams::default())
        .await
        .expect("delete the lease");
    assert!(
        wait_until(secs(15), || async {
            api.get_opt(&lease_name())
                .await
                .expect("get the lease")
                .is_some_and(|lease| {
                    lease.metadata.uid != old.metadata.uid
                        && lease.spec.and_then(|s| s.holder_identity).as_deref() == Some(holder)
                })
        })
        .await,
        "{holder} creates the lease again:\n{}",
        watching.logs()
    );
}

/// The Lease is deleted while a replica leads: the leader creates it again with its ledger, so
/// a restart still finds the window full. Then the leader dies and the Lease is deleted again:
/// the standby creates it with the last ledger it read, and leads within the cap.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_deleted_while_leading_keeps_the_cap() {
    let (ns, names, vars) = six_due("tamper-deleted").await;
    let logs = log_dir("lease-tamper");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;
    let a = deletes_up_to_the_cap(&ns, &names, &vars, &logs.path().join("a.log")).await;
    delete_the_lease(&ns, "replica-a", &a).await;
    a.kill().await;
    let a = Process::spawn(kubeconfig, &vars, "replica-a", &logs.path().join("a2.log"));
    leads_within_the_cap(
        &a,
        &ns,
        &names,
        MAX,
        "after the leader re-created the lease",
    )
    .await;

    let b = Process::spawn(kubeconfig, &vars, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    // The standby has read the ledger: it started after the last deletion, so any ledger it
    // remembers counts them.
    assert!(
        wait_until(secs(15), || async {
            metric(
                &b.metrics().await,
                "workspace_gc_standby_ledger_reads_total",
                "result=\"remembered\"",
            ) > 0.0
        })
        .await,
        "replica-b reads the ledger:\n{}",
        b.logs()
    );
    a.kill().await;
    delete_the_lease(&ns, "replica-b", &b).await;
    leads_within_the_cap(
        &b,
        &ns,
        &names,
        MAX,
        "after the standby re-created the lease",
    )
    .await;
    assert_eq!(faults(&b, "lost").await, 1.0, "{}", b.logs());
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}
