//! The collector end to end, against a real kube-apiserver and etcd: one test per reason at
//! least, dry-run, the blast-radius cap, leader election, metrics and readiness. The daemon
//! runs in-process (`controller::run`) with a configuration scoped to each test's namespace.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, JobBuilder, PipelineRunBuilder, PodBuilder, TestNamespace,
    assert_decided, claim_exists, free_port, http_get, metric, policy_rule, wait_until,
};
use tokio_util::sync::CancellationToken;
use workspace_gc::cluster::leader::Fence;
use workspace_gc::cluster::resources;
use workspace_gc::cluster::server_clock::ServerClock;
use workspace_gc::cluster::writer::{Mode, Writer};
use workspace_gc::contract::annotations;
use workspace_gc::daemon::cap_ledger::Ledger;
use workspace_gc::daemon::controller::{self, RunOptions};
use workspace_gc::observe::metrics::Metrics;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn events_for(ns: &TestNamespace, claim: &str) -> Vec<Event> {
    ns.events()
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim))
        .collect()
}

async fn has_event(ns: &TestNamespace, claim: &str, reason: &str) -> bool {
    events_for(ns, claim)
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some(reason))
}

async fn gone(ns: &TestNamespace, claim: &str) -> bool {
    !claim_exists(ns, claim).await
}

async fn ns(prefix: &str) -> TestNamespace {
    TestNamespace::new(ControlPlane::shared(), prefix).await
}

/// Run statuses written by hand: two runs finished two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn finished_build_past_its_ttl_is_deleted_with_an_event() {
    let ns = ns("ttl").await;
    let done = Utc::now() - chrono::Duration::hours(2);
    for job in ["nb", "nb2"] {
        JobBuilder::new(job)
            .phase("Succeeded")
            .completed_at(done)
            .create(&ns)
            .await;
        PipelineRunBuilder::for_job(job)
            .succeeded_at(done)
            .create(&ns)
            .await;
        ClaimBuilder::for_job(job).create(&ns).await;
    }
    // Not a build workspace: the label selector keeps it out of reach.
    ClaimBuilder::plain("nb-user-data").create(&ns).await;
    // Other builds' runs: a namespace this large is proven fresh rather than listed.
    let others = (0..100).map(|i| PipelineRunBuilder::new(&format!("other-{i}")));
    futures::future::join_all(others.map(|run| async { run.create(&ns).await })).await;

    let daemon = Daemon::start(ns.daemon_client(&ns.config()).await, ns.config(), "ttl").await;
    assert!(
        wait_until(secs(10), || async {
            gone(&ns, "nb-build-workspace").await && gone(&ns, "nb2-build-workspace").await
        })
        .await,
        "the expired workspaces are deleted"
    );
    assert!(
        wait_until(secs(10), || has_event(&ns, "nb-build-workspace", "Deleted")).await,
        "a Deleted event explains it"
    );
    // The witness: every claim the daemon read is dealt with, none left in its cache (the
    // unlabelled one, had it been read, would be there).
    assert!(
        wait_until(secs(10), || async {
            let metrics = daemon.metrics().await;
            metric(&metrics, "workspace_gc_cached_objects", "kind=\"claims\"") == 0.0
        })
        .await,
        "the daemon's cache holds no claim left: {}",
        daemon.metrics().await
    );
    assert!(
        claim_exists(&ns, "nb-user-data").await,
        "unlabelled claim untouched"
    );
    let metrics = daemon.metrics().await;
    let labels = format!(
        "claim_namespace=\"{}\",reason=\"ttl-expired\",result=\"deleted\"",
        ns.name()
    );
    assert_eq!(
        metric(&metrics, "workspace_gc_deletions_total", &labels),
        2.0,
        "metrics report the deletions:\n{metrics}"
    );
    assert_eq!(
        metric(&metrics, "workspace_gc_reclaimed_bytes_total", ""),
        2.0 * 1_073_741_824.0,
        "{metrics}"
    );
    // The namespace is large: the first re-check, alone, lists it at once (`proof::way`); the
    // second, asking within the round interval (the pace spaces them 200 ms), proves the cache
    // fresh by a round of small reads instead of listing its runs and pods again.
    let rechecks = |read: &str| {
        let labels = format!("read=\"{read}\"");
        metric(&metrics, "workspace_gc_rechecks_total", &labels)
    };
    assert_eq!(
        (rechecks("proven"), rechecks("listed")),
        (1.0, 1.0),
        "{metrics}"
    );
    daemon.stop().await;
}

/// Run statuses written by hand: a run running without pods (real Tekton's would protect the claim
/// by themselves), then finished at the instant the reclaim lag is measured from.
#[tokio::test(flavor = "multi_thread")]
async fn running_build_is_kept_then_deleted_right_after_its_ttl() {
    let ns = ns("running").await;
    JobBuilder::new("nb").phase("Building").create(&ns).await;
    PipelineRunBuilder::for_job("nb")
        .running()
        .create(&ns)
        .await;
    ClaimBuilder::for_job("nb").create(&ns).await;
    let mut config = ns.config();
    config.policy.ttl_after_finished = secs(3);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "running").await;

    // The witness: the daemon decided the claim of the running build.
    let verdict = ("keep", "owner-running", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, "nb-build-workspace").await,
        "kept while running"
    );

    let finished = Utc::now();
    let status = json!({"status": {"phase": "Succeeded", "completionTime": finished.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}});
    ns.dynamic_api(&resources::job_resource())
        .patch_status("nb", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("finish the job");
    let run_status = json!({"status": {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}],
        "completionTime": finished.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}});
    ns.dynamic_api(&resources::run_resource())
        .patch_status(
            "nb-build",
            &PatchParams::default(),
            &Patch::Merge(&run_status),
        )
        .await
        .expect("finish the run");

    // A new verdict: the daemon saw the build finish.
    let verdict = ("keep", "within-ttl", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, "nb-build-workspace").await,
        "kept within the TTL"
    );
    assert!(
        wait_until(secs(5), || gone(&ns, "nb-build-workspace")).await,
        "deleted within a second or two of the TTL"
    );
    let lag = Utc::now() - (finished + chrono::Duration::seconds(3));
    assert!(
        lag < chrono::Duration::milliseconds(2500),
        "reclaim lag {lag}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn orphan_is_deleted_after_its_grace_and_a_young_one_is_kept() {
    let ns = ns("orphan").await;
    ClaimBuilder::build_workspace("leftover-build-workspace")
        .create(&ns)
        .await;
    let mut config = ns.config();
    config.policy.orphan_grace = secs(3);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "orphan").await;
    // The witness: the daemon decided the orphan, young (the grace is 3 s).
    let verdict = ("keep", "within-orphan-grace", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, "leftover-build-workspace").await,
        "young orphan kept"
    );
    assert!(
        wait_until(secs(6), || gone(&ns, "leftover-build-workspace")).await,
        "orphan deleted after its grace"
    );
    assert!(has_event(&ns, "leftover-build-workspace", "Deleted").await);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn young_orphan_is_kept() {
    let ns = ns("young").await;
    ClaimBuilder::build_workspace("fresh-build-workspace")
        .create(&ns)
        .await;
    let daemon = Daemon::start(ns.daemon_client(&ns.config()).await, ns.config(), "young").await;
    // The witness: the daemon decided the orphan, young.
    let verdict = ("keep", "within-orphan-grace", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(claim_exists(&ns, "fresh-build-workspace").await);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_use_claim_is_kept_however_old_until_its_pod_finishes() {
    let ns = ns("inuse").await;
    ClaimBuilder::build_workspace("busy-build-workspace")
        .create(&ns)
        .await;
    PodBuilder::new("affinity-assistant-0")
        .mounting("busy-build-workspace")
        .phase("Running")
        .create(&ns)
        .await;
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    config.policy.max_age = secs(1);
    // Real time: the claim must be past max_age and the grace (whole-second timestamps) when
    // first decided, as a protected verdict is not decided again as time passes.
    tokio::time::sleep(secs(2)).await;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "inuse").await;
    // The witness: the daemon decided the claim in use, past max_age.
    let verdict = ("protected", "in-use", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, "busy-build-workspace").await,
        "in use: kept"
    );

    ns.api::<Pod>()
        .patch_status(
            "affinity-assistant-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("finish the pod");
    assert!(
        wait_until(secs(5), || gone(&ns, "busy-build-workspace")).await,
        "deleted once no pod uses it"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_annotation_and_malformed_annotations_keep_the_claim() {
    let ns = ns("annot").await;
    ClaimBuilder::build_workspace("kept-build-workspace")
        .annotation(annotations::KEEP, "true")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("odd-build-workspace")
        .annotation(annotations::TTL, "soon-ish")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("plain-build-workspace")
        .create(&ns)
        .await;
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "annot").await;
    assert!(
        wait_until(secs(5), || gone(&ns, "plain-build-workspace")).await,
        "the control claim is deleted"
    );
    assert!(
        wait_until(secs(5), || has_event(
            &ns,
            "odd-build-workspace",
            "InvalidAnnotation"
        ))
        .await,
        "a warning event names the bad annotation"
    );
    let warning = events_for(&ns, "odd-build-workspace").await;
    let warning = warning
        .iter()
        .find(|e| e.reason.as_deref() == Some("InvalidAnnotation"))
        .expect("the warning");
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning
            .note
            .as_deref()
            .unwrap_or("")
            .contains(annotations::TTL)
    );
    // The witness for the kept claim: the daemon decided it protected by its annotation.
    let verdict = ("protected", "keep-annotation", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(claim_exists(&ns, "kept-build-workspace").await);
    assert!(claim_exists(&ns, "odd-build-workspace").await);
    daemon.stop().await;
}

/// Run statuses written by hand: a run stuck running without pods (real Tekton's would protect the
/// claim from max_age).
#[tokio::test(flavor = "multi_thread")]
async fn max_age_deletes_a_claim_whose_run_never_finishes() {
    let ns = ns("maxage").await;
    PipelineRunBuilder::for_job("stuck")
        .running()
        .create(&ns)
        .await;
    ClaimBuilder::for_job("stuck").create(&ns).await;
    let mut config = ns.config();
    config.policy.max_age = secs(3);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "maxage").await;
    // The witness: the daemon decided the claim of the running build, before max_age.
    let verdict = ("keep", "owner-running", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(claim_exists(&ns, "stuck-build-workspace").await);
    assert!(
        wait_until(secs(6), || gone(&ns, "stuck-build-workspace")).await,
        "max_age deletes a run stuck running"
    );
    daemon.stop().await;
}

/// A deadline the delete easily meets.
fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + secs(30)
}

/// The facts of `claim` as the daemon's watch decodes them.
fn facts(claim: &PersistentVolumeClaim) -> workspace_gc::decide::facts::ClaimFacts {
    let value = serde_json::to_value(claim).expect("a claim serializes");
    resources::claim_facts(&serde_json::from_value(value).expect("a claim decodes"))
}

/// The decision was made about one claim; before the delete lands, the claim is deleted and
/// re-created under the same name. The `{uid, resourceVersion}` preconditions protect the new one.
#[tokio::test(flavor = "multi_thread")]
async fn claim_recreated_between_decision_and_delete_survives() {
    let ns = ns("recreate").await;
    let old = ClaimBuilder::build_workspace("re-build-workspace")
        .create(&ns)
        .await;
    let decided_about = facts(&old);
    let api = ns.api::<PersistentVolumeClaim>();
    api.delete("re-build-workspace", &DeleteParams::default())
        .await
        .expect("delete the old claim");
    assert!(wait_until(secs(10), || gone(&ns, "re-build-workspace")).await);
    let new = ClaimBuilder::build_workspace("re-build-workspace")
        .create(&ns)
        .await;
    assert_ne!(new.metadata.uid, old.metadata.uid);

    let metrics = Metrics::register(&mut Default::default());
    let writer = Writer::new(ns.client().clone(), Mode::Delete, None, Fence::unfenced());
    let ledger = Ledger::new(secs(60)).to_annotation();
    let result = writer
        .delete(&decided_about, (&ledger, 1), deadline(), &metrics)
        .await;
    assert_eq!(
        result.ok(),
        Some(workspace_gc::cluster::writer::Answer::Real(
            workspace_gc::observe::metrics::DeleteResult::Conflict,
        ))
    );
    let survivor = api.get("re-build-workspace").await.expect("the new claim");
    assert_eq!(survivor.metadata.uid, new.metadata.uid);

    // A change since the decision (same UID, new resourceVersion) is protected too.
    let decided_about = facts(&survivor);
    api.patch(
        "re-build-workspace",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {annotations::KEEP: "true"}}})),
    )
    .await
    .expect("annotate");
    let result = writer
        .delete(&decided_about, (&ledger, 1), deadline(), &metrics)
        .await;
    assert_eq!(
        result.ok(),
        Some(workspace_gc::cluster::writer::Answer::Real(
            workspace_gc::observe::metrics::DeleteResult::Conflict,
        ))
    );
    assert!(claim_exists(&ns, "re-build-workspace").await);
}

/// Seeds one claim of each kind; returns the names real mode must delete.
async fn seed_mix(ns: &TestNamespace) -> BTreeSet<String> {
    let long_ago = Utc::now() - chrono::Duration::hours(5);
    JobBuilder::new("done")
        .phase("Failed")
        .completed_at(long_ago)
        .create(ns)
        .await;
    PipelineRunBuilder::for_job("done")
        .failed_at(long_ago)
        .create(ns)
        .await;
    ClaimBuilder::for_job("done").create(ns).await;
    ClaimBuilder::build_workspace("orphan-build-workspace")
        .create(ns)
        .await;
    PipelineRunBuilder::for_job("live")
        .running()
        .create(ns)
        .await;
    ClaimBuilder::for_job("live").create(ns).await;
    ClaimBuilder::build_workspace("kept-build-workspace")
        .annotation(annotations::KEEP, "true")
        .create(ns)
        .await;
    ["done-build-workspace", "orphan-build-workspace"]
        .into_iter()
        .map(str::to_owned)
        .collect()
}

async fn claim_names(ns: &TestNamespace) -> BTreeSet<String> {
    ns.api::<PersistentVolumeClaim>()
        .list(&Default::default())
        .await
        .expect("list claims")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// Run statuses written by hand: a run failed long ago, and one running without pods.
#[tokio::test(flavor = "multi_thread")]
async fn dry_run_deletes_nothing_and_reports_exactly_what_real_mode_deletes() {
    let ns = ns("dryrun").await;
    let due = seed_mix(&ns).await;
    let before = claim_names(&ns).await;
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    config.deletion.dry_run = true;
    config.deletion.server_side_dry_run = true;
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "dry",
    )
    .await;
    let would = || async {
        let mut names = BTreeSet::new();
        for name in &before {
            if has_event(&ns, name, "WouldDelete").await {
                names.insert(name.clone());
            }
        }
        names
    };
    assert!(
        wait_until(secs(10), || async { would().await == due }).await,
        "dry-run reports the due claims: {:?}",
        would().await
    );
    // The witness: the due claims went through the delete path as far as dry-run goes, where a
    // real delete would have been sent.
    let would_delete = format!("claim_namespace=\"{}\"", ns.name());
    assert!(
        wait_until(secs(10), || async {
            let metrics = daemon.metrics().await;
            metric(
                &metrics,
                "workspace_gc_dry_run_would_delete_total",
                &would_delete,
            ) >= due.len() as f64
        })
        .await,
        "counted as would-deletes: {}",
        daemon.metrics().await
    );
    assert_eq!(claim_names(&ns).await, before, "dry-run mutated nothing");
    daemon.stop().await;

    config.deletion.dry_run = false;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "real").await;
    let expected: BTreeSet<String> = before.difference(&due).cloned().collect();
    assert!(
        wait_until(secs(10), || async { claim_names(&ns).await == expected }).await,
        "real mode deletes exactly the reported claims: left {:?}",
        claim_names(&ns).await
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blast_radius_cap_stops_deletions_at_the_cap() {
    let ns = ns("cap").await;
    for i in 0..5 {
        ClaimBuilder::build_workspace(&format!("o{i}-build-workspace"))
            .create(&ns)
            .await;
    }
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    config.deletion.max_deletions_per_window = 2;
    config.deletion.window = Duration::from_secs(600);
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "cap").await;
    assert!(
        wait_until(secs(10), || async { claim_names(&ns).await.len() == 3 }).await,
        "two deleted"
    );
    // The witness: each of the three left was decided due and held back by the cap, and says so
    // (once per claim and episode of the cap).
    let held_back = || async {
        let claims: BTreeSet<String> = (ns.events().await.into_iter())
            .filter(|e| e.reason.as_deref() == Some("BlastRadiusCapReached"))
            .filter_map(|e| e.regarding?.name)
            .collect();
        claims.len()
    };
    assert!(
        wait_until(secs(10), || async { held_back().await == 3 }).await,
        "three claims held back by the cap say so: {}",
        held_back().await
    );
    let left = claim_names(&ns).await;
    assert_eq!(left.len(), 3, "the cap holds: {left:?}");
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(&metrics, "workspace_gc_blast_radius_capped", ""),
        1.0,
        "{metrics}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_deletes_and_the_standby_takes_over() {
    let ns = ns("leader").await;
    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    config.leader_election.enabled = true;
    config.leader_election.lease_namespace = Some(ns.name().to_owned());
    config.leader_election.lease_duration = secs(3);
    let first = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "replica-a",
    )
    .await;
    assert!(
        wait_until(secs(10), || async {
            metric(&first.metrics().await, "workspace_gc_leader", "") == 1.0
        })
        .await,
        "the first replica leads"
    );
    let second = Daemon::start(ns.daemon_client(&config).await, config, "replica-b").await;
    assert_eq!(
        metric(&second.metrics().await, "workspace_gc_leader", ""),
        0.0
    );

    ClaimBuilder::build_workspace("a-build-workspace")
        .create(&ns)
        .await;
    assert!(wait_until(secs(10), || gone(&ns, "a-build-workspace")).await);
    let deleted_by = |claim: &'static str| {
        let ns = &ns;
        async move {
            events_for(ns, claim)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("Deleted"))
                .and_then(|e| e.reporting_instance)
        }
    };
    assert!(
        wait_until(secs(5), || async {
            deleted_by("a-build-workspace").await.is_some()
        })
        .await
    );
    assert_eq!(
        deleted_by("a-build-workspace").await.as_deref(),
        Some("replica-a")
    );

    first.stop().await;
    assert!(
        wait_until(secs(10), || async {
            metric(&second.metrics().await, "workspace_gc_leader", "") == 1.0
        })
        .await,
        "the standby takes over"
    );
    ClaimBuilder::build_workspace("b-build-workspace")
        .create(&ns)
        .await;
    assert!(wait_until(secs(10), || gone(&ns, "b-build-workspace")).await);
    assert!(
        wait_until(secs(5), || async {
            deleted_by("b-build-workspace").await.is_some()
        })
        .await
    );
    assert_eq!(
        deleted_by("b-build-workspace").await.as_deref(),
        Some("replica-b")
    );
    second.stop().await;
}

/// Readiness waits for every watch to sync; a watch denied by RBAC (403) keeps the daemon
/// running and unready, with the error counted, until access is granted.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_flips_after_sync_and_a_denied_watch_recovers() {
    let control_plane = ControlPlane::shared();
    let ns = ns("rbac").await;
    ClaimBuilder::build_workspace("gone-build-workspace")
        .create(&ns)
        .await;
    let sa_client = control_plane
        .service_account_client(ns.name(), "workspace-gc")
        .await;
    // The shipped rules but pods'.
    let mut shipped = testkit::daemon_role(true);
    if let Some(rules) = shipped.rules.as_mut() {
        rules.retain(|rule| !(rule.resources.iter().flatten()).any(|r| r == "pods"));
    }
    let role = shipped;
    let roles = ns.api::<Role>();
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    ns.bind_role("workspace-gc", "workspace-gc").await;

    let mut config = ns.config();
    config.policy.orphan_grace = secs(1);
    let port = free_port();
    let stop = CancellationToken::new();
    let options = RunOptions {
        identity: "rbac".into(),
        pod_namespace: None,
        listen: ([127, 0, 0, 1], port).into(),
        clock: ServerClock::default(),
    };
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { controller::run(sa_client, config, options, stop).await }
    });
    assert!(
        wait_until(secs(10), || async {
            http_get(port, "/metrics")
                .await
                .1
                .contains("workspace_gc_watch_restarts_total{kind=\"pods\"}")
        })
        .await,
        "the denied watch is counted"
    );
    assert_eq!(
        http_get(port, "/readyz").await.0,
        503,
        "not ready without pods"
    );
    assert_eq!(
        http_get(port, "/healthz").await.0,
        200,
        "alive all the same"
    );
    assert!(
        claim_exists(&ns, "gone-build-workspace").await,
        "nothing deleted while unsynced"
    );

    let mut granted = role.clone();
    granted.rules.get_or_insert_with(Vec::new).push(policy_rule(
        &[""],
        &["pods"],
        &["list", "watch"],
    ));
    roles
        .replace("workspace-gc", &PostParams::default(), &granted)
        .await
        .expect("grant pods");
    assert!(
        wait_until(secs(60), || async {
            http_get(port, "/readyz").await.0 == 200
        })
        .await,
        "ready once the watch recovers"
    );
    assert!(wait_until(secs(10), || gone(&ns, "gone-build-workspace")).await);
    stop.cancel();
    task.await.expect("join").expect("clean stop");
}
