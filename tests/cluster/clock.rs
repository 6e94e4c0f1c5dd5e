//! A wrong clock on the daemon's node, against a real kube-apiserver: the real binary runs under
//! libfaketime (Debian's `faketime`, which `scripts/test` installs) with its wall clock hours
//! ahead or behind, while the API server keeps the true time. Only the wall clock is shifted
//! (`FAKETIME_DONT_FAKE_MONOTONIC`): the daemon's timers run on the monotonic clock. A deadline
//! is met only once it has passed by the API server's clock too, so a clock ahead deletes
//! nothing early; one behind deletes late, as it always did.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tempfile::TempDir;
use testkit::{
    ControlPlane, Process, TestNamespace, capped, claim_exists, daemon_binary, deleted_count,
    faketime, finished_build, leads_within_the_cap, metric, overdue_under_a_cap, wait_until,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ago(minutes: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::minutes(minutes)
}

fn daemon_vars(ns: &TestNamespace, shift: &str) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("WORKSPACE_GC_SELECTOR_NAMESPACES", ns.name().to_owned()),
        ("WORKSPACE_GC_LEADER_ELECTION_ENABLED", "false".into()),
        ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "100".into()),
        (
            "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
            "1000".into(),
        ),
        ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "1h".into()),
    ];
    vars.extend(faketime(shift));
    vars
}

/// The daemon's binary on `ns` with its clock `shift` off, once ready, and once it deleted the
/// workspace of build `due` (due by both clocks).
async fn start(ns: &TestNamespace, shift: &str, due: &str) -> (Process, TempDir) {
    let logs = tempfile::tempdir().expect("a directory for the logs");
    let vars = daemon_vars(ns, shift);
    let daemon = Process::spawn(
        &ns.daemon_kubeconfig(&vars).await,
        &vars,
        ns.name(),
        &logs.path().join("daemon.log"),
    );
    assert!(
        wait_until(secs(30), || daemon.ready()).await,
        "ready:\n{}",
        daemon.logs()
    );
    let claim = format!("{due}-build-workspace");
    assert!(
        wait_until(secs(20), || async { !claim_exists(ns, &claim).await }).await,
        "{claim}, due by both clocks, is deleted:\n{}",
        daemon.logs()
    );
    (daemon, logs)
}

/// How many claims of `ns` the daemon last decided to keep for `reason`.
async fn kept(daemon: &Process, ns: &TestNamespace, reason: &str) -> f64 {
    let labels = format!(
        "claim_namespace=\"{}\",state=\"keep\",reason=\"{reason}\"",
        ns.name()
    );
    metric(&daemon.metrics().await, "workspace_gc_claims", &labels)
}

/// Asserts the offset the daemon reports (the API server's clock minus its own) lies within a
/// few seconds of `expected`, within bounds less than 5 s apart.
async fn assert_offset_near(daemon: &Process, expected: f64) {
    let text = daemon.metrics().await;
    let bound = |b: &str| {
        let labels = format!("bound=\"{b}\"");
        metric(&text, "workspace_gc_clock_offset_seconds", &labels)
    };
    let (lower, upper) = (bound("lower"), bound("upper"));
    assert!(
        expected - 10.0 < lower && lower <= upper && upper < expected + 10.0 && upper - lower < 5.0,
        "offset about {expected} s: [{lower}, {upper}]\n{text}"
    );
}

/// `workspace-gc audit --output json --fail-on-delete` under the same clock shift: its exit code
/// and report.
fn audit(kubeconfig: &Path, ns: &TestNamespace, shift: &str) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(daemon_binary());
    command
        .args(["audit", "--output", "json", "--fail-on-delete"])
        .env("KUBECONFIG", kubeconfig)
        .env("WORKSPACE_GC_SELECTOR_NAMESPACES", ns.name())
        .env("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "1h")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (key, value) in faketime(shift) {
        command.env(key, value);
    }
    let output = command.output().expect("run workspace-gc audit");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// A daemon whose clock runs two hours ahead: the build that finished 10 minutes ago (70 by its
/// clock, with a 1 h TTL) keeps its workspace; the one that finished 2 hours ago loses it. The
/// offset is reported as about -7200 s and warned about, and the audit judges the same way.
///
/// Run statuses written by hand: runs finished 10 minutes and two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn a_clock_two_hours_ahead_deletes_nothing_early() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "ahead").await;
    finished_build(&ns, "fresh", ago(10)).await;
    finished_build(&ns, "old", ago(120)).await;

    let (daemon, _logs) = start(&ns, "+2h", "old").await;
    // Decided, and kept: not merely not reached yet.
    assert!(
        wait_until(secs(20), || async {
            kept(&daemon, &ns, "within-ttl").await == 1.0
        })
        .await,
        "the fresh workspace is kept within its TTL:\n{}\n{}",
        daemon.metrics().await,
        daemon.logs()
    );
    assert!(
        claim_exists(&ns, "fresh-build-workspace").await,
        "the workspace of the build that finished 10 minutes ago is kept:\n{}",
        daemon.logs()
    );
    assert_offset_near(&daemon, -7200.0).await;
    let logs_text = daemon.logs();
    assert!(
        logs_text.contains("differ by more than the bound"),
        "the offset is warned about:\n{logs_text}"
    );

    let (code, report) = audit(cp.kubeconfig_path(), &ns, "+2h");
    assert_eq!(
        code,
        Some(0),
        "the audit under the same clock finds nothing due:\n{report}"
    );
    assert!(
        report.contains("\"within-ttl\""),
        "the audit keeps the fresh workspace within its TTL:\n{report}"
    );
    assert!(
        claim_exists(&ns, "fresh-build-workspace").await,
        "still kept:\n{}",
        daemon.logs()
    );
    daemon.terminate().await;
}

/// A daemon whose clock runs two hours behind judges by its own clock, as before: what is due
/// by it (a build finished 4 h ago) is deleted; what is due by the API server's clock but not
/// by its own (finished 2 h ago, 1 h TTL) waits; a build that finished 10 minutes ago lies in
/// its future. The offset is reported as about +7200 s.
///
/// Run statuses written by hand: runs finished 10 minutes, two and four hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn a_clock_two_hours_behind_deletes_only_what_its_own_clock_finds_due() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "behind").await;
    finished_build(&ns, "fresh", ago(10)).await;
    finished_build(&ns, "due", ago(120)).await;
    finished_build(&ns, "long-due", ago(240)).await;

    let (daemon, _logs) = start(&ns, "-2h", "long-due").await;
    assert!(
        wait_until(secs(20), || async {
            kept(&daemon, &ns, "within-ttl").await == 1.0
                && kept(&daemon, &ns, "completion-in-future").await == 1.0
        })
        .await,
        "one kept within its TTL by the local clock, one finished in its future:\n{}\n{}",
        daemon.metrics().await,
        daemon.logs()
    );
    for name in ["due-build-workspace", "fresh-build-workspace"] {
        assert!(
            claim_exists(&ns, name).await,
            "{name} is kept:\n{}",
            daemon.logs()
        );
    }
    assert_offset_near(&daemon, 7200.0).await;
    daemon.terminate().await;
}

/// The blast-radius count lives on the Lease, shared by the replicas: it is dated by the API
/// server's clock, not by each replica's. A cap of 2 per hour, 6 claims due: replica-a (true
/// clock) deletes 2 and is capped; it hands over to replica-b, whose clock runs 2 h ahead. Dated
/// by replica-a's clock, the 2 deletions lay 2 h in replica-b's past, out of its window, and it
/// deleted 2 more.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_whose_clocks_disagree_count_the_same_window() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "clock-cap").await;
    let (vars, names) = overdue_under_a_cap(&ns, "cap", 6, 2, "1h").await;
    let logs = tempfile::tempdir().expect("a directory for logs");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;
    let a = Process::spawn(kubeconfig, &vars, "replica-a", &logs.path().join("a.log"));
    assert!(
        wait_until(secs(30), || async {
            capped(&a).await && deleted_count(&ns, &names).await == 2
        })
        .await,
        "replica-a deletes 2 and reaches the cap:\n{}",
        a.logs()
    );
    let mut ahead = vars.clone();
    ahead.extend(faketime("+2h"));
    let b = Process::spawn(kubeconfig, &ahead, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    let status = a.terminate().await;
    assert!(status.success(), "{status}");
    leads_within_the_cap(&b, &ns, &names, 2, "on a clock 2 h ahead").await;
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}
