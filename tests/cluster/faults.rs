//! The daemon under faults, against a real kube-apiserver and etcd: an API server restart,
//! watches expired by etcd compaction (410 Gone), a network partition, a silently stalled
//! watch, a delete denied by RBAC, a claim re-created just before its delete, clock skew,
//! objects with odd fields; and the limits on deleting: the deletion rate, the blast-radius cap
//! under a dry run and when saturated, a throttled delete, and SIGTERM with deletes in flight.
//! Leadership (a killed or partitioned leader, only the leader writing, the cap across
//! hand-overs) is in tests/cluster/leadership.rs.
//!
//! What every test checks, besides its fault: no claim is deleted before its deadline or while
//! something protects it, every due claim is deleted within a bound once the fault is over, and
//! the daemon stays alive. Tests that break the control plane itself get a dedicated one
//! (without kube-controller-manager, so a deleted claim stays Terminating and its
//! `deletionTimestamp` records when the delete landed); the others share one and break only the
//! daemon's own connection, through a [`Proxy`]. docs/reliability-history.md has the matrix;
//! RELIABILITY.md the promises.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::graph::rfc3339;
use testkit::{
    ClaimBuilder, ControlPlane, ControlPlaneOptions, Daemon, Fate, Fault, JobBuilder,
    PipelineRunBuilder, PodBuilder, Process, Proxy, Rule, TestNamespace, assert_decided,
    binary_vars, capped, daemon_binary, daemon_role, deleted, deleted_count, deleted_events,
    elected_vars, events, expiring, fate, finished_build, forward_held_delete, in_secs, log_dir,
    metric, metric_sum, notebook_validation_job_resource, overdue_under_a_cap,
    pipeline_run_resource, replica_through, revoked, set_var, wait_until,
};
use workspace_gc::config::Config;
use workspace_gc::contract::annotations;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A configuration that watches only `ns`, without leader election, deleting as fast as
/// asked, and with an orphan grace long enough that only the deadlines a test sets apply.
fn config_for(ns: &TestNamespace) -> Config {
    let mut config = ns.config();
    config.policy.orphan_grace = secs(3600);
    config
}

/// When the delete of a claim landed, by the API server's clock (whole seconds): the
/// `deletionTimestamp` of a claim kept Terminating (no kube-controller-manager runs).
async fn deleted_at(ns: &TestNamespace, name: &str) -> DateTime<Utc> {
    match fate(ns, name).await {
        Fate::Terminating(at) => at,
        other => panic!("{name} is {other:?}, expected Terminating"),
    }
}

/// How many claims the daemon's cache holds.
/// What `/readyz` answers during an outage: 200 (ready once synced, kubert's rule), its body
/// telling that the API server cannot be reached.
fn tells_outage((status, body): (u16, String)) -> bool {
    status == 200 && body.contains("cannot be reached")
}

/// What `/readyz` answers once the API server answers again.
fn answers_again((status, body): (u16, String)) -> bool {
    status == 200 && !body.contains("cannot be reached")
}

async fn cached_claims(daemon: &Daemon) -> f64 {
    metric(
        &daemon.metrics().await,
        "workspace_gc_cached_objects",
        "kind=\"claims\"",
    )
}

/// The kube-apiserver stops (SIGKILL, as a crash) for a quarter of a minute and comes back.
/// Meanwhile the daemon stays alive and says it is not ready; a deadline that passes during the
/// outage is met once the server is back, one set before the outage for after it is met on
/// time, changes made after the restart reach the daemon, and nothing protected is deleted.
/// Run statuses written by hand: a run running without pods (real Tekton's pods would protect
/// the claim by themselves), finished right after the restart at the instant the test times from.
#[tokio::test(flavor = "multi_thread")]
async fn apiserver_restart_mid_run() {
    let cp = ControlPlane::start(false);
    let ns = TestNamespace::new(&cp, "restart").await;
    let outage = secs(15);
    // Due well after the restart: the daemon's timer, set before the outage, must still fire.
    let after_due = in_secs(45);
    expiring("after-build-workspace", after_due)
        .create(&ns)
        .await;
    // Due long ago, but protected.
    expiring("kept-build-workspace", in_secs(-60))
        .annotation(annotations::KEEP, "true")
        .create(&ns)
        .await;
    expiring("busy-build-workspace", in_secs(-60))
        .create(&ns)
        .await;
    PodBuilder::new("affinity-assistant")
        .mounting("busy-build-workspace")
        .phase("Running")
        .create(&ns)
        .await;
    JobBuilder::new("nb").phase("Building").create(&ns).await;
    PipelineRunBuilder::for_job("nb")
        .running()
        .create(&ns)
        .await;
    ClaimBuilder::for_job("nb").create(&ns).await;

    let mut config = config_for(&ns);
    config.policy.ttl_after_finished = Duration::ZERO;
    // A restarted API server answers 403 until its RBAC informers have synced: a watch that
    // reconnects first is refused, by the server's start, not for want of a right.
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "restart")
        .await
        .expecting_denials();
    // Due a few seconds into the outage.
    let during_due = in_secs(5);
    expiring("during-build-workspace", during_due)
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(10), || async { cached_claims(&daemon).await == 5.0 }).await,
        "the daemon saw every claim before the outage"
    );

    let stopped = Instant::now();
    cp.stop_component("kube-apiserver", true).await;
    assert!(
        wait_until(secs(10), || async {
            tells_outage(daemon.get("/readyz").await)
        })
        .await,
        "/readyz tells of the outage, and stays 200"
    );
    assert_eq!(daemon.get("/healthz").await.0, 200, "alive all the same");
    // The outage itself: a fixed length, whatever the checks above took.
    tokio::time::sleep(outage.saturating_sub(stopped.elapsed())).await;
    assert!(daemon.running(), "the daemon survived the outage");
    assert_eq!(daemon.get("/healthz").await.0, 200);
    cp.start_component("kube-apiserver").await;
    let restarted = Utc::now();
    assert!(
        restarted + chrono::Duration::seconds(5) < after_due,
        "the setup assumes the restart ends well before {after_due}"
    );

    assert!(
        wait_until(secs(30), || async {
            answers_again(daemon.get("/readyz").await)
        })
        .await,
        "/readyz tells no outage once the API server answers"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metric_sum(&metrics, "workspace_gc_watch_restarts_total") > 0.0,
        "{metrics}"
    );

    // The deadline that passed in the dark: met on the next retry.
    assert!(
        wait_until(secs(15), || deleted(&ns, "during-build-workspace")).await,
        "a claim due during the outage is deleted soon after it"
    );
    assert!(deleted_at(&ns, "during-build-workspace").await >= during_due);

    // Catching up: a change made after the restart reaches the daemon through its watches.
    let finished = Utc::now();
    let completion = json!({"status": {"phase": "Succeeded", "completionTime": rfc3339(finished)}});
    ns.dynamic_api(&notebook_validation_job_resource())
        .patch_status("nb", &PatchParams::default(), &Patch::Merge(&completion))
        .await
        .expect("finish the job");
    let run_completion = json!({"status": {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}],
        "completionTime": rfc3339(finished)}});
    ns.dynamic_api(&pipeline_run_resource())
        .patch_status(
            "nb-build",
            &PatchParams::default(),
            &Patch::Merge(&run_completion),
        )
        .await
        .expect("finish the run");
    // The watches resume on their own backoff (kube-runtime's default: at most 30 s, with
    // jitter), so the change may wait for it; then TTL 0 collects the claim at once. The bound
    // leaves room for two fault tests sharing two loaded cores.
    let patched = Instant::now();
    assert!(
        wait_until(secs(75), || deleted(&ns, "nb-build-workspace")).await,
        "a build finished after the restart is collected once the watches resume"
    );
    eprintln!(
        "restart: a change {:?} after the restart reached the daemon and was acted on",
        patched.elapsed()
    );

    // The deadline set before the outage, for after it.
    let wait = (after_due - Utc::now()).to_std().unwrap_or_default() + secs(3);
    assert!(
        wait_until(wait, || deleted(&ns, "after-build-workspace")).await,
        "the later deadline is met"
    );
    assert!(deleted_at(&ns, "after-build-workspace").await >= after_due);

    // The witness: after the outage, the daemon decided both claims protected.
    for verdict in [
        ("protected", "keep-annotation", 1.0),
        ("protected", "in-use", 1.0),
    ] {
        assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    }
    for name in ["kept-build-workspace", "busy-build-workspace"] {
        assert_eq!(fate(&ns, name).await, Fate::Live, "{name} is protected");
    }
    for name in [
        "during-build-workspace",
        "nb-build-workspace",
        "after-build-workspace",
    ] {
        assert!(
            wait_until(secs(5), || async {
                deleted_events(&ns, name).await.len() == 1
            })
            .await,
            "exactly one Deleted event for {name}"
        );
    }
    daemon.stop().await;
}

/// With the watch cache off, etcd serves the watches, so compacting its history expires the
/// resourceVersion a watch resumes from: after a short partition the daemon's watches get
/// 410 Gone and must list again. A claim created during the partition is then found, and the
/// deadlines before and after the re-list are met.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_compaction_forces_410_gone_and_a_relist() {
    let cp = ControlPlane::start_with(&ControlPlaneOptions {
        controller_manager: false,
        apiserver_args: vec!["--watch-cache=false".into()],
    });
    let ns = TestNamespace::new(&cp, "compact").await;
    let proxy = Proxy::start(cp.api_address()).await;
    let before_due = in_secs(35);
    expiring("before-build-workspace", before_due)
        .create(&ns)
        .await;
    expiring("kept-build-workspace", in_secs(-60))
        .annotation(annotations::KEEP, "true")
        .create(&ns)
        .await;

    let logs = log_dir("faults");
    let vars = binary_vars(&ns);
    let daemon = Process::spawn(
        &proxy.kubeconfig(&cp, &ns.daemon_kubeconfig(&vars).await),
        &vars,
        "compact",
        &logs.path().join("daemon.log"),
    );
    assert!(
        wait_until(secs(30), || daemon.ready()).await,
        "ready:\n{}",
        daemon.logs()
    );

    proxy.cut();
    assert!(
        wait_until(secs(15), || async {
            tells_outage(daemon.get("/readyz").await)
        })
        .await,
        "/readyz tells of the partition:\n{}",
        daemon.logs()
    );
    // Changes the daemon cannot see, then the history it would resume from is compacted away.
    let during_due = in_secs(8);
    expiring("during-build-workspace", during_due)
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("gone-build-workspace")
        .create(&ns)
        .await;
    ns.api::<PersistentVolumeClaim>()
        .delete("gone-build-workspace", &DeleteParams::default())
        .await
        .expect("delete a claim during the partition");
    let revision = cp.compact_etcd().await;
    proxy.heal();

    assert!(
        wait_until(secs(45), || async {
            let logs = daemon.logs();
            logs.contains("too old") || logs.contains("410")
        })
        .await,
        "a watch resumed from before revision {revision} got 410 Gone:\n{}",
        daemon.logs()
    );
    assert!(
        wait_until(secs(15), || async {
            answers_again(daemon.get("/readyz").await)
        })
        .await,
        "{}",
        daemon.logs()
    );
    let metrics = daemon.metrics().await;
    assert!(
        metric_sum(&metrics, "workspace_gc_watch_restarts_total") > 0.0,
        "{metrics}"
    );

    // Created while the daemon was blind: the re-list found it, and its deadline is met.
    let wait = (during_due - Utc::now()).to_std().unwrap_or_default() + secs(5);
    assert!(
        wait_until(wait, || deleted(&ns, "during-build-workspace")).await,
        "the claim created during the partition is collected:\n{}",
        daemon.logs()
    );
    assert!(deleted_at(&ns, "during-build-workspace").await >= during_due);
    let wait = (before_due - Utc::now()).to_std().unwrap_or_default() + secs(3);
    assert!(
        wait_until(wait, || deleted(&ns, "before-build-workspace")).await,
        "the deadline after the re-list is met:\n{}",
        daemon.logs()
    );
    assert!(deleted_at(&ns, "before-build-workspace").await >= before_due);
    // The witness: the daemon's verdict on the kept claim, the latest it made, is protected.
    let verdict = ("protected", "keep-annotation", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert_eq!(fate(&ns, "kept-build-workspace").await, Fate::Live);
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// The daemon is cut off from the API server for twenty seconds while the cluster carries on.
/// It stays alive and ready, `/readyz` tells of the outage (and no more after), and it deletes
/// nothing on the strength of its stale caches: a claim that got a user and one that got the
/// keep annotation while it was blind survive their deadlines; the claims that became due are
/// deleted after.
#[tokio::test(flavor = "multi_thread")]
async fn partition_from_the_api_server() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "partition").await;
    let proxy = Proxy::start(cp.api_address()).await;
    let due = in_secs(10);
    for name in ["used", "kept", "plain"] {
        expiring(&format!("{name}-build-workspace"), due)
            .create(&ns)
            .await;
    }
    let job = JobBuilder::new("owner").phase("Building").create(&ns).await;
    ClaimBuilder::build_workspace("owned-build-workspace")
        .owned_by(&job)
        .create(&ns)
        .await;

    let daemon = Daemon::start(
        ns.daemon_client_via(&config_for(&ns), &proxy.url()).await,
        config_for(&ns),
        "partition",
    )
    .await;
    proxy.cut();
    let cut = Instant::now();
    assert!(
        wait_until(secs(10), || async {
            tells_outage(daemon.get("/readyz").await)
        })
        .await,
        "/readyz tells that the API server cannot be reached, and stays 200"
    );
    assert_eq!(daemon.get("/healthz").await.0, 200);

    // The world moves on without the daemon.
    PodBuilder::new("late-user")
        .mounting("used-build-workspace")
        .phase("Running")
        .create(&ns)
        .await;
    ns.api::<PersistentVolumeClaim>()
        .patch(
            "kept-build-workspace",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::KEEP: "true"}}})),
        )
        .await
        .expect("annotate");
    ns.dynamic_api(&notebook_validation_job_resource())
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete the owner");

    // The deadline passes in the dark: the live re-check cannot read, so nothing is deleted.
    assert!(
        wait_until(secs(20), || async {
            let metrics = daemon.metrics().await;
            metric(
                &metrics,
                "workspace_gc_api_errors_total",
                "operation=\"get\",category=\"connection\"",
            ) + metric(
                &metrics,
                "workspace_gc_api_errors_total",
                "operation=\"list\",category=\"connection\"",
            ) > 0.0
        })
        .await,
        "the live re-check at the deadline failed to read: {}",
        daemon.metrics().await
    );
    // The partition lasts 20 s in all.
    tokio::time::sleep(secs(20).saturating_sub(cut.elapsed())).await;
    assert!(daemon.running());
    assert_eq!(daemon.get("/healthz").await.0, 200);
    assert!(tells_outage(daemon.get("/readyz").await));
    proxy.heal();

    assert!(
        wait_until(secs(20), || async {
            answers_again(daemon.get("/readyz").await)
        })
        .await,
        "/readyz tells no outage once the API server answers"
    );
    // The watches resume on their own backoff (at most 30 s) after the partition.
    for name in ["plain-build-workspace", "owned-build-workspace"] {
        assert!(
            wait_until(secs(40), || deleted(&ns, name)).await,
            "{name}, due meanwhile, is deleted after the partition"
        );
    }
    assert!(
        wait_until(secs(40), || async {
            let metrics = daemon.metrics().await;
            metric(
                &metrics,
                "workspace_gc_claims",
                "state=\"protected\",reason=\"in-use\"",
            ) == 1.0
                && metric(
                    &metrics,
                    "workspace_gc_claims",
                    "state=\"protected\",reason=\"keep-annotation\"",
                ) == 1.0
        })
        .await,
        "the daemon caught up with the changes: {}",
        daemon.metrics().await
    );
    for name in ["used-build-workspace", "kept-build-workspace"] {
        assert_eq!(fate(&ns, name).await, Fate::Live, "{name} survived");
    }
    daemon.stop().await;
}

/// The daemon's watch connections go silent without any error, as watches on a wedged API
/// server replica do, while new requests still work. A pod that starts using a claim then
/// never reaches the cache; the claim's deadline passes and the live re-check before the delete
/// must still see the pod.
#[tokio::test(flavor = "multi_thread")]
async fn silently_stalled_watch_does_not_hide_a_new_user() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "stall").await;
    let proxy = Proxy::start(cp.api_address()).await;
    let due = in_secs(6);
    expiring("stale-build-workspace", due).create(&ns).await;
    // Other builds' runs: a namespace this large is proven fresh when it can be, not listed.
    let others = (0..100).map(|i| PipelineRunBuilder::new(&format!("other-{i}")));
    futures::future::join_all(others.map(|run| async { run.create(&ns).await })).await;
    let daemon = Daemon::start(
        ns.daemon_client_via(&config_for(&ns), &proxy.url()).await,
        config_for(&ns),
        "stall",
    )
    .await;

    proxy.stall();
    // A build pod already on its node: deleting the claim now would leave it Terminating, and
    // the pipeline's next pods could not mount it.
    PodBuilder::new("new-user")
        .mounting("stale-build-workspace")
        .scheduled_on("node-a")
        .phase("Running")
        .create(&ns)
        .await;
    // The witness that the deadline has passed in the daemon's view: it decided the claim due,
    // from a cache that still has no pod.
    let verdict = ("delete", "expired", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "workspace_gc_claims",
            "state=\"protected\",reason=\"in-use\""
        ),
        0.0,
        "the stalled pod watch has not delivered the pod"
    );
    // A round that cannot be proven ends at its bound (3 s), and the re-check then lists: on
    // a loaded machine that may come after the deadline's wait, so wait for it, still stalled.
    let rechecks = |text: &str, read: &str| {
        let labels = format!("read=\"{read}\"");
        metric(text, "workspace_gc_rechecks_total", &labels)
    };
    assert!(
        wait_until(secs(15), || async {
            rechecks(&daemon.metrics().await, "listed") >= 1.0
        })
        .await,
        "the re-check listed:\n{}",
        daemon.metrics().await
    );
    let metrics = daemon.metrics().await;
    assert_eq!(
        rechecks(&metrics, "proven"),
        0.0,
        "a stalled watch is never proven fresh\n{metrics}"
    );
    // The witness: the live re-check found the pod and called the delete off.
    assert!(
        wait_until(secs(15), || async {
            let labels = "category=\"live-disagrees\"";
            metric(
                &daemon.metrics().await,
                "workspace_gc_reconcile_retries_total",
                labels,
            ) >= 1.0
        })
        .await,
        "the live re-check disagreed with the cache:\n{}",
        daemon.metrics().await
    );
    assert_eq!(
        fate(&ns, "stale-build-workspace").await,
        Fate::Live,
        "the claim in use survived its deadline"
    );

    proxy.unstall();
    assert!(
        wait_until(secs(10), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_claims",
                "state=\"protected\",reason=\"in-use\"",
            ) == 1.0
        })
        .await,
        "the watch delivers again"
    );
    assert_eq!(fate(&ns, "stale-build-workspace").await, Fate::Live);
    daemon.stop().await;
}

/// The daemon may read everything but not delete claims: each delete gets 403. It logs a clear
/// error naming the claim, counts it under `operation="delete",category="forbidden"`, stays
/// alive and ready, and deletes the claim once the right is granted. Its events reach the API
/// server a second late (through the fault proxy), as on a loaded one: nothing is asserted
/// before the write it depends on has landed.
#[tokio::test(flavor = "multi_thread")]
async fn delete_denied_by_rbac_is_reported_and_recovers() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "forbidden").await;
    expiring("denied-build-workspace", in_secs(-60))
        .create(&ns)
        .await;
    let roles = ns.api::<Role>();
    roles
        .create(&PostParams::default(), &daemon_role(false))
        .await
        .expect("role");
    ns.bind_role("workspace-gc", "workspace-gc").await;
    let direct = cp
        .service_account_kubeconfig(ns.name(), "workspace-gc")
        .await;
    let proxy = Proxy::http(cp).await;
    proxy.add(testkit::Rule::new(
        "",
        "events",
        testkit::Fault::DelayRequest(secs(1)),
    ));
    let kubeconfig = proxy.kubeconfig(cp, &direct);
    let logs = log_dir("faults");
    let daemon = Process::spawn(
        &kubeconfig,
        &binary_vars(&ns),
        "forbidden",
        &logs.path().join("daemon.log"),
    )
    .expecting_denials();
    assert!(
        wait_until(secs(30), || daemon.ready()).await,
        "{}",
        daemon.logs()
    );
    assert!(
        wait_until(secs(10), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_api_errors_total",
                "operation=\"delete\",category=\"forbidden\"",
            ) >= 1.0
        })
        .await,
        "the denied delete is counted: {}",
        daemon.metrics().await
    );
    // The log line and the counter are two writes: either may come first.
    let names_the_denial = || async {
        daemon.logs().lines().any(|line| {
            line.contains("delete refused")
                && line.contains("denied-build-workspace")
                && line.contains("forbidden")
        })
    };
    assert!(
        wait_until(secs(10), names_the_denial).await,
        "a clear error names the claim and the denial:\n{}",
        daemon.logs()
    );
    assert_eq!(fate(&ns, "denied-build-workspace").await, Fate::Live);
    assert!(
        daemon.ready().await,
        "a denied delete does not make it unready"
    );
    assert_eq!(daemon.get("/healthz").await.0, 200);

    roles
        .replace("workspace-gc", &PostParams::default(), &daemon_role(true))
        .await
        .expect("grant delete");
    // A refused delete is retried with a backoff that doubles from 1 s (up to 5 min): refused
    // at about 0, 1, 3, 7, 15, 31, 63 s, so a grant up to two minutes after the first refusal
    // is acted on within about a minute.
    assert!(
        wait_until(secs(90), || deleted(&ns, "denied-build-workspace")).await,
        "deleted once allowed:\n{}",
        daemon.logs()
    );
    // The event is written after the delete, asynchronously: wait for it, then check that
    // one delete made one event.
    assert!(
        wait_until(secs(15), || async {
            !deleted_events(&ns, "denied-build-workspace")
                .await
                .is_empty()
        })
        .await,
        "a Deleted event follows the delete:\n{}",
        daemon.logs()
    );
    assert_eq!(deleted_events(&ns, "denied-build-workspace").await.len(), 1);
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// With one delete per 10 s, the second of two due claims waits for its slot with its
/// decision made; meanwhile it is deleted and re-created under the same name (with the keep
/// annotation). The delete that finally goes out carries the old claim's UID and
/// resourceVersion: the API server refuses it (409) and the new claim survives. The writer-level
/// version is `claim_recreated_between_decision_and_delete_survives` in tests/cluster/collector.rs.
#[tokio::test(flavor = "multi_thread")]
async fn claim_recreated_just_before_its_delete_survives() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "recreate").await;
    let names = ["one-build-workspace", "two-build-workspace"];
    for name in names {
        expiring(name, in_secs(-60)).create(&ns).await;
    }
    let mut config = config_for(&ns);
    config.deletion.deletes_per_second = 0.1;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "recreate").await;
    assert!(
        wait_until(secs(10), || async {
            deleted(&ns, names[0]).await || deleted(&ns, names[1]).await
        })
        .await,
        "the first claim is deleted at once"
    );
    // The limiter picks the order; the other one waits for its slot.
    let second = if deleted(&ns, names[0]).await {
        names[1]
    } else {
        names[0]
    };
    assert_eq!(fate(&ns, second).await, Fate::Live, "one slot per 10 s");

    let api = ns.api::<PersistentVolumeClaim>();
    let old_uid = api
        .get(second)
        .await
        .expect("the second claim")
        .metadata
        .uid;
    api.delete(second, &DeleteParams::default())
        .await
        .expect("delete the second claim");
    assert!(wait_until(secs(8), || async { fate(&ns, second).await == Fate::Gone }).await);
    let new = expiring(second, in_secs(-60))
        .annotation(annotations::KEEP, "true")
        .create(&ns)
        .await;
    assert_ne!(new.metadata.uid, old_uid);

    let conflict = format!(
        "claim_namespace=\"{}\",reason=\"expired\",result=\"conflict\"",
        ns.name()
    );
    assert!(
        wait_until(secs(15), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_deletions_total",
                &conflict,
            ) >= 1.0
        })
        .await,
        "the stale delete went out and was refused: {}",
        daemon.metrics().await
    );
    let survivor = api.get(second).await.expect("the new claim");
    assert_eq!(survivor.metadata.uid, new.metadata.uid);
    assert!(survivor.metadata.deletion_timestamp.is_none());
    assert!(deleted_events(&ns, second).await.iter().all(|e| {
        e.regarding.as_ref().and_then(|r| r.uid.as_deref()) != new.metadata.uid.as_deref()
    }));
    daemon.stop().await;
}

/// Completion times in the future (the operator's or Tekton's clock ahead of ours) are not
/// expired: such a claim is kept, and one whose completion time comes in a few seconds is
/// deleted only once it has come, as the Job TTL controller does. Run statuses written by
/// hand: completion times an hour ago, and an hour or 8 s ahead (a skewed clock), which real
/// Tekton never stamps.
#[tokio::test(flavor = "multi_thread")]
async fn completion_times_in_the_future_are_not_expired() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "skew").await;
    finished_build(&ns, "past", in_secs(-3600)).await;
    finished_build(&ns, "skewed", in_secs(3600)).await;
    let soon = in_secs(8);
    finished_build(&ns, "soon", soon).await;
    let mut config = config_for(&ns);
    config.policy.ttl_after_finished = Duration::ZERO;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "skew").await;

    assert!(
        wait_until(secs(5), || deleted(&ns, "past-build-workspace")).await,
        "the control: a build finished in the past is collected (TTL 0)"
    );
    let in_future = "state=\"keep\",reason=\"completion-in-future\"";
    assert_eq!(
        metric(&daemon.metrics().await, "workspace_gc_claims", in_future),
        2.0
    );
    let wait = (soon - Utc::now()).to_std().unwrap_or_default() + secs(3);
    assert!(
        wait_until(wait, || deleted(&ns, "soon-build-workspace")).await,
        "collected right after its completion time comes"
    );
    let observed = Utc::now();
    assert!(observed >= soon, "not before its completion time");
    assert_eq!(fate(&ns, "skewed-build-workspace").await, Fate::Live);
    assert_eq!(
        metric(&daemon.metrics().await, "workspace_gc_claims", in_future),
        1.0
    );
    daemon.stop().await;
}

/// Owners and claims with missing, unknown or odd fields: no status, unknown conditions and
/// phases, finished without a completion time, a pod of unknown phase, annotations that are
/// huge or not ASCII. No panic; each claim is kept and the reason is visible in the metrics,
/// in an event for a bad annotation, and in `workspace-gc audit --output json`. A claim with
/// harmless odd annotations is still collected. Run statuses written by hand: missing, unknown
/// and garbage fields (unknown conditions, finished without a completion time), which real
/// Tekton never writes.
#[tokio::test(flavor = "multi_thread")]
async fn odd_objects_keep_their_claims_and_say_why() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "odd").await;
    let runs = ns.dynamic_api(&pipeline_run_resource());
    let set_run_status = |name: &'static str, status: Value| {
        let runs = runs.clone();
        async move {
            runs.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("status of {name}: {e}"));
        }
    };
    let mut expected: Vec<(&str, &str, &str)> = Vec::new();

    // No status at all: the operator has not seen it yet.
    JobBuilder::new("nostatus").create(&ns).await;
    ClaimBuilder::for_job("nostatus").create(&ns).await;
    expected.push(("nostatus-build-workspace", "keep", "owner-running"));
    // A phase this version does not know.
    JobBuilder::new("exploded")
        .phase("Exploded")
        .create(&ns)
        .await;
    ClaimBuilder::for_job("exploded").create(&ns).await;
    expected.push(("exploded-build-workspace", "keep", "owner-running"));
    // Only conditions of other types.
    PipelineRunBuilder::for_job("weird").create(&ns).await;
    set_run_status(
        "weird-build",
        json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Sideways", "status": "Yes"}]}),
    )
    .await;
    ClaimBuilder::for_job("weird").create(&ns).await;
    expected.push(("weird-build-workspace", "keep", "owner-running"));
    // The Succeeded condition with a status that is none of True, False, Unknown.
    PipelineRunBuilder::for_job("maybe").create(&ns).await;
    set_run_status(
        "maybe-build",
        json!({"conditions": [{"type": "Succeeded", "status": "Maybe"}], "completionTime": rfc3339(in_secs(-7200))}),
    )
    .await;
    ClaimBuilder::for_job("maybe").create(&ns).await;
    expected.push(("maybe-build-workspace", "keep", "owner-running"));
    // Finished, but neither owner recorded when.
    JobBuilder::new("notime")
        .phase("Succeeded")
        .create(&ns)
        .await;
    PipelineRunBuilder::for_job("notime").create(&ns).await;
    set_run_status(
        "notime-build",
        json!({"conditions": [{"type": "Succeeded", "status": "True"}]}),
    )
    .await;
    ClaimBuilder::for_job("notime").create(&ns).await;
    expected.push(("notime-build-workspace", "keep", "completion-time-missing"));
    // A pod whose phase is Unknown (its node stopped reporting) still uses the claim.
    expiring("limbo-build-workspace", in_secs(-60))
        .create(&ns)
        .await;
    PodBuilder::new("limbo")
        .mounting("limbo-build-workspace")
        .phase("Unknown")
        .create(&ns)
        .await;
    expected.push(("limbo-build-workspace", "protected", "in-use"));
    // Bad annotations: huge, full-width digits and Japanese, an emoji after a valid instant,
    // characters that print escaped.
    let huge = format!("1{}", "x".repeat(100_000));
    ClaimBuilder::build_workspace("huge-build-workspace")
        .annotation(annotations::TTL, &huge)
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("kanji-build-workspace")
        .annotation(annotations::TTL, "１時間")
        .annotation(annotations::KEEP, "はい")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("emoji-build-workspace")
        .annotation(annotations::EXPIRES, "2020-01-01T00:00:00Z🙂")
        .create(&ns)
        .await;
    // Characters that print escaped, which makes a quoted value longer than the value.
    let escaped = format!("1{}", "\u{10ffff}\u{1b}".repeat(100));
    ClaimBuilder::build_workspace("escaped-build-workspace")
        .annotation(annotations::TTL, &escaped)
        .create(&ns)
        .await;
    let invalid = [
        ("huge-build-workspace", annotations::TTL),
        ("escaped-build-workspace", annotations::TTL),
        ("kanji-build-workspace", annotations::KEEP),
        ("emoji-build-workspace", annotations::EXPIRES),
    ];
    for (name, _) in invalid {
        expected.push((name, "keep", "invalid-annotation"));
    }
    // Odd but harmless annotations do not stand in the way of a due claim.
    expiring("harmless-build-workspace", in_secs(-60))
        .annotation("example.com/description", "ünïcødé ✓ 工作区 🙂")
        .annotation("example.com/blob", &"z".repeat(100_000))
        .create(&ns)
        .await;

    let daemon = Daemon::start(
        ns.daemon_client(&config_for(&ns)).await,
        config_for(&ns),
        "odd",
    )
    .await;
    assert!(
        wait_until(secs(5), || deleted(&ns, "harmless-build-workspace")).await,
        "odd unrelated annotations do not block a due claim"
    );
    let mut counts = std::collections::BTreeMap::<(&str, &str), f64>::new();
    for (_, state, reason) in &expected {
        *counts.entry((state, reason)).or_default() += 1.0;
    }
    assert!(
        wait_until(secs(10), || async {
            let metrics = daemon.metrics().await;
            counts.iter().all(|((state, reason), count)| {
                let labels = format!("state=\"{state}\",reason=\"{reason}\"");
                metric(&metrics, "workspace_gc_claims", &labels) == *count
            })
        })
        .await,
        "every claim's reason is counted: want {counts:?}\n{}",
        daemon.metrics().await
    );
    for (name, key) in invalid {
        assert!(
            wait_until(secs(10), || async {
                !events(&ns, name, "InvalidAnnotation").await.is_empty()
            })
            .await,
            "an InvalidAnnotation event explains {name}"
        );
        let note = events(&ns, name, "InvalidAnnotation").await[0]
            .note
            .clone()
            .unwrap_or_default();
        assert!(note.contains(key), "{name}: {note}");
    }

    let audit = tokio::process::Command::new(daemon_binary())
        .args(["audit", "--output", "json", "--namespace", ns.name()])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .output()
        .await
        .expect("run workspace-gc audit");
    assert!(
        audit.status.success(),
        "{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&audit.stdout).expect("audit JSON");
    for (name, state, reason) in &expected {
        let row = rows
            .iter()
            .find(|row| row["name"] == *name)
            .unwrap_or_else(|| panic!("{name} is in the audit"));
        assert_eq!(row["verdict"], *state, "{name}: {row}");
        assert_eq!(row["reason"], *reason, "{name}: {row}");
    }
    for (name, key) in invalid {
        let row = rows.iter().find(|row| row["name"] == name).expect("row");
        let detail = row["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(key), "{name}: {detail}");
    }
    for (name, _, _) in &expected {
        assert_eq!(fate(&ns, name).await, Fate::Live, "{name} is kept");
    }
    assert!(daemon.running());
    daemon.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Limits on deleting: the rate, the cap, a throttled delete, and a stop in time

/// Every accepted deletion rate paces as configured, and one that cannot be honoured is refused
/// before anything is deleted: `1e-30` once overflowed into "no pacing at all".
#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_rate_paces_as_configured_or_is_refused() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "rate").await;
    let names: Vec<String> = (0..3)
        .map(|i| format!("paced{i}-build-workspace"))
        .collect();
    for name in &names {
        expiring(name, in_secs(-60)).create(&ns).await;
    }
    let logs = log_dir("faults");
    let mut vars = binary_vars(&ns);
    set_var(
        &mut vars,
        "WORKSPACE_GC_DELETION_DELETES_PER_SECOND",
        "1e-30",
    );
    let mut refused = Process::spawn(
        &ns.daemon_kubeconfig(&binary_vars(&ns)).await,
        &vars,
        "rate",
        &logs.path().join("refused.log"),
    );
    let mut status = None;
    for _ in 0..100 {
        status = refused.exited();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(2),
        "exit 2:\n{}",
        refused.logs()
    );
    assert!(
        refused.logs().contains("deletion.deletes_per_second"),
        "{}",
        refused.logs()
    );
    assert_eq!(deleted_count(&ns, &names).await, 0, "nothing deleted");

    // Half a deletion a second: one every 2 s.
    set_var(&mut vars, "WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "0.5");
    let daemon = Process::spawn(
        &ns.daemon_kubeconfig(&vars).await,
        &vars,
        "rate",
        &logs.path().join("paced.log"),
    );
    let mut seen: Vec<Instant> = Vec::new();
    let started = Instant::now();
    while seen.len() < names.len() && started.elapsed() < secs(30) {
        let count = deleted_count(&ns, &names).await;
        while seen.len() < count {
            seen.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen.len(), names.len(), "all deleted:\n{}", daemon.logs());
    for pair in seen.windows(2) {
        let gap = pair[1] - pair[0];
        // 2 s apart, less the polling.
        assert!(gap >= Duration::from_millis(1700), "deleted {gap:?} apart");
    }
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// The README's install path: the audit overlay (dry-run) first, then the real daemon on the same
/// Lease. A dry run must neither spend the real cap nor say that anything was deleted: its
/// would-deletes once filled the Lease's ledger, so the real daemon then deleted nothing for a
/// window, and its `BlastRadiusCapReached` events said claims "were deleted".
#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_spends_none_of_the_real_cap() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "dry-cap").await;
    let (vars, names) = overdue_under_a_cap(&ns, "dry", 6, 3, "1h").await;
    let logs = log_dir("faults");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;

    let mut dry_vars = vars.clone();
    set_var(&mut dry_vars, "WORKSPACE_GC_DELETION_DRY_RUN", "true");
    let audit = Process::spawn(
        kubeconfig,
        &dry_vars,
        "audit",
        &logs.path().join("audit.log"),
    );
    assert!(
        wait_until(secs(30), || async {
            let text = audit.metrics().await;
            metric_sum(&text, "workspace_gc_dry_run_would_delete_total") == 3.0
                && capped(&audit).await
        })
        .await,
        "the dry run would delete 3 and then reaches the cap:\n{}",
        audit.logs()
    );
    let status = audit.terminate().await;
    assert!(status.success(), "{status}");
    assert_eq!(
        deleted_count(&ns, &names).await,
        0,
        "a dry run deletes nothing"
    );
    let events = ns.events().await;
    let notes: Vec<&str> = events.iter().filter_map(|e| e.note.as_deref()).collect();
    assert!(
        notes.iter().any(|note| note.starts_with("dry-run:")),
        "the dry run explains itself: {notes:?}"
    );
    assert!(
        !notes.iter().any(|note| note.contains("were deleted")),
        "no event of the dry run says claims were deleted: {notes:?}"
    );

    let real = Process::spawn(kubeconfig, &vars, "real", &logs.path().join("real.log"));
    assert!(
        wait_until(secs(30), || async {
            deleted_count(&ns, &names).await == 3 && capped(&real).await
        })
        .await,
        "the real daemon deletes its full cap of 3 (deleted: {}):\n{}",
        deleted_count(&ns, &names).await,
        real.logs()
    );
    let status = real.terminate().await;
    assert!(status.success(), "{status}");
}

/// A saturated cap admits one delete as one leaves the window: each claim held back is told once
/// for the whole episode, not again each time the window moves (once about 250 warnings in 35 s
/// for 38 claims).
#[tokio::test(flavor = "multi_thread")]
async fn a_saturated_cap_tells_each_held_claim_once() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "cap-noise").await;
    let (vars, names) = overdue_under_a_cap(&ns, "held", 6, 2, "10s").await;
    let logs = log_dir("faults");
    let daemon = Process::spawn(
        &ns.daemon_kubeconfig(&vars).await,
        &vars,
        "noise",
        &logs.path().join("d.log"),
    );
    // Two deleted at once, two more once the first two leave the window.
    assert!(
        wait_until(secs(40), || async { deleted_count(&ns, &names).await >= 4 }).await,
        "{}",
        daemon.logs()
    );
    let warnings = daemon.logs().matches("blast-radius cap reached").count();
    assert_eq!(
        warnings,
        4,
        "one warning per claim held back:\n{}",
        daemon.logs()
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// A saturated API Priority and Fairness level answers a DELETE 429 with `Retry-After`. kube's
/// client used to re-send it by itself a couple of seconds later, after the live re-check and
/// the fence it rested on: here, after a build had started using the claim. Now the refusal goes
/// back to the controller, which decides again from the start and keeps the claim; the refusal
/// is counted as `throttled`, and no second DELETE of that decision is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_delete_is_never_sent_again_for_the_same_decision() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "throttled").await;
    let proxy = Proxy::http(cp).await;
    let kubeconfig = replica_through(cp, &ns, "gc", &proxy).await;
    let user = testkit::service_account(ns.name(), "gc");
    let refused = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::throttle(2))
            .user(user.clone())
            .times(1),
    );
    // Lets every other DELETE through, counting it.
    let passed = proxy.add(
        Rule::new(
            "delete",
            "persistentvolumeclaims",
            Fault::DelayRequest(Duration::ZERO),
        )
        .user(user),
    );
    let vars = elected_vars(&ns, "4s");
    let logs = log_dir("faults");
    let daemon = Process::spawn(&kubeconfig, &vars, "gc", &logs.path().join("gc.log"));
    expiring("busy-build-workspace", in_secs(-60))
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(30), || async { proxy.hits(refused) == 1 }).await,
        "the delete was sent and throttled:\n{}",
        daemon.logs()
    );
    // A build starts using the claim right after the throttled DELETE.
    PodBuilder::new("build")
        .mounting("busy-build-workspace")
        .scheduled_on("node-a")
        .phase("Running")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(15), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_claims",
                "state=\"protected\",reason=\"in-use\"",
            ) == 1.0
        })
        .await,
        "the daemon sees the new user:\n{}",
        daemon.logs()
    );
    // Real time, past the Retry-After and kube's backoff, when the old client had sent it
    // again; the witness that the daemon decided again is the in-use verdict above.
    tokio::time::sleep(secs(6)).await;
    assert_eq!(fate(&ns, "busy-build-workspace").await, Fate::Live);
    assert_eq!(proxy.hits(passed), 0, "no DELETE was sent again");
    let text = daemon.metrics().await;
    assert_eq!(
        metric(
            &text,
            "workspace_gc_api_errors_total",
            "operation=\"delete\",category=\"throttled\""
        ),
        1.0,
        "{text}"
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// A hop between the daemon and the API server (an L7 load balancer, a mesh sidecar) holds
/// the claim's DELETE past the daemon's deadline and forwards it after the daemon gave up,
/// with its preconditions still matching. Meanwhile a build starts on the claim. The daemon
/// revokes the DELETE it got no answer for by changing the claim, so the late DELETE fails its
/// precondition (409) and the build keeps its workspace. (Before, the late DELETE landed.)
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_forwarded_after_the_daemon_gave_up_fails_its_precondition() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "late").await;
    let proxy = Proxy::http(cp).await;
    let kubeconfig = replica_through(cp, &ns, "gc", &proxy).await;
    let user = testkit::service_account(ns.name(), "gc");
    let held = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::HoldAndForward)
            .user(user)
            .times(1),
    );
    let logs = log_dir("faults");
    let daemon = Process::spawn(
        &kubeconfig,
        &elected_vars(&ns, "4s"),
        "gc",
        &logs.path().join("gc.log"),
    );
    let claim = "late-build-workspace";
    expiring(claim, in_secs(-60)).create(&ns).await;
    assert!(
        wait_until(secs(30), || async { proxy.hits(held) == 1 }).await,
        "the DELETE was sent, and is held:\n{}",
        daemon.logs()
    );
    // A re-run starts on the claim while the DELETE is on its way.
    PodBuilder::new("rerun")
        .mounting(claim)
        .scheduled_on("node-a")
        .phase("Running")
        .create(&ns)
        .await;
    // The daemon gives up at its deadline (LIVE_BOUND) and revokes; waited for, not asserted
    // yet: what matters is what the late DELETE does.
    let was_revoked = wait_until(secs(20), || revoked(&ns, claim)).await;
    forward_held_delete(&proxy, held, &ns, claim, || daemon.logs()).await;
    assert!(was_revoked, "the claim was revoked:\n{}", daemon.logs());
    let text = daemon.metrics().await;
    assert_eq!(
        metric(
            &text,
            "workspace_gc_revocations_total",
            "result=\"revoked\""
        ),
        1.0,
        "{text}"
    );
    assert_eq!(metric(&text, "workspace_gc_deletes_late_total", ""), 0.0);
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// Whatever the API server does to the DELETEs in flight (here it never answers them), SIGTERM
/// ends the process well within the Deployment's 30 s grace period.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_process_within_the_grace_period_whatever_the_api_server_answers() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "grace").await;
    let proxy = Proxy::http(cp).await;
    let kubeconfig = replica_through(cp, &ns, "gc", &proxy).await;
    let user = testkit::service_account(ns.name(), "gc");
    let stalled = proxy.add(Rule::new("delete", "persistentvolumeclaims", Fault::Stall).user(user));
    let vars = elected_vars(&ns, "4s");
    let logs = log_dir("faults");
    let daemon = Process::spawn(&kubeconfig, &vars, "gc", &logs.path().join("gc.log"));
    for i in 0..4 {
        expiring(&format!("stuck{i}-build-workspace"), in_secs(-60))
            .create(&ns)
            .await;
    }
    assert!(
        wait_until(secs(30), || async { proxy.hits(stalled) >= 1 }).await,
        "a delete is in flight:\n{}",
        daemon.logs()
    );
    let asked = Instant::now();
    let status = daemon.terminate().await;
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < secs(20), "stopped after {took:?}");
}
