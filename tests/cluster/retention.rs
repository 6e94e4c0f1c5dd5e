//! The retention policies against a real kube-apiserver and etcd: failed builds kept longer,
//! and per-namespace settings. The daemon runs in-process (`controller::run`) with a
//! configuration scoped to each test's namespaces.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, Fault, JobBuilder, PipelineRunBuilder, Proxy, Rule,
    TestNamespace, assert_decided, claim_exists, finished_build, metric, service_account,
    wait_until,
};
use workspace_gc::cluster::watches;
use workspace_gc::config::Config;
use workspace_gc::contract::annotations;
use workspace_gc::decide::policy::Reason;
use workspace_gc::surface::audit::{self, Row};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn ns(prefix: &str) -> TestNamespace {
    TestNamespace::new(ControlPlane::shared(), prefix).await
}

/// A build of job `name` that finished at `at` with one owner failed, the job (phase `Failed`,
/// its run succeeded) or the run (`Succeeded` condition `False`, its job succeeded), with its
/// workspace claim.
async fn failed_build(ns: &TestNamespace, name: &str, at: DateTime<Utc>, job_failed: bool) {
    let phase = if job_failed { "Failed" } else { "Succeeded" };
    JobBuilder::new(name)
        .phase(phase)
        .completed_at(at)
        .create(ns)
        .await;
    let run = PipelineRunBuilder::for_job(name);
    let run = if job_failed {
        run.succeeded_at(at)
    } else {
        run.failed_at(at)
    };
    run.create(ns).await;
    ClaimBuilder::for_job(name).create(ns).await;
}

/// A failed build's workspace is kept for `ttl_after_failed` while a succeeded one's goes after
/// `ttl_after_finished`, and goes once its own TTL has passed. "Failed" is any finished linked
/// owner failing: a failed PipelineRun beside a succeeded job, or a failed job.
///
/// Run statuses written by hand: runs finished at one whole-second instant the TTLs of seconds are
/// timed from.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_build_is_kept_for_ttl_after_failed() {
    let ns = ns("failed").await;
    // Kubernetes stores whole seconds: the TTLs run from the truncated instant.
    let done = Utc::now().trunc_subsecs(0);
    finished_build(&ns, "ok", done).await;
    failed_build(&ns, "bad", done, false).await;
    failed_build(&ns, "worse", done, true).await;
    let mut config = ns.config();
    config.policy.ttl_after_finished = Duration::ZERO;
    config.policy.ttl_after_failed = Some(secs(15));
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "failed").await;

    assert!(
        wait_until(secs(10), || async {
            !claim_exists(&ns, "ok-build-workspace").await
        })
        .await,
        "the succeeded build's workspace goes at once"
    );
    // The witness: the daemon decided both failed builds' claims within their TTL.
    let verdict = ("keep", "within-ttl", 2.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    // Until its TTL has passed, every look finds the failed build's workspace.
    let kept_until = done + chrono::Duration::seconds(14);
    while Utc::now() < kept_until {
        for claim in ["bad-build-workspace", "worse-build-workspace"] {
            assert!(
                claim_exists(&ns, claim).await,
                "{claim} was deleted {} after its build failed",
                Utc::now() - done
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        wait_until(secs(15), || async {
            !claim_exists(&ns, "bad-build-workspace").await
                && !claim_exists(&ns, "worse-build-workspace").await
        })
        .await,
        "the failed build's workspace goes once ttl_after_failed has passed"
    );
    daemon.stop().await;
}

/// Sets (or, with `null`, removes) annotations on the Namespace `ns`.
async fn annotate(ns: &TestNamespace, annotations: serde_json::Value) {
    Api::<Namespace>::all(ns.client().clone())
        .patch(
            ns.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate namespace {}: {e}", ns.name()));
}

/// A configuration over `namespaces`, as [`TestNamespace::config`] sets one up, with
/// per-namespace settings enabled (namespaces may not shorten anything) and finished builds due
/// at once.
fn config_over(namespaces: &[&TestNamespace]) -> Config {
    let mut config = namespaces[0].config();
    config.selector.namespaces = namespaces.iter().map(|ns| ns.name().to_owned()).collect();
    config.policy.ttl_after_finished = Duration::ZERO;
    config.namespace_policy.enabled = true;
    config
}

/// The audit's rows for the configured namespaces: the daemon's watches, cache and policy.
async fn audit_rows(ns: &TestNamespace, config: &Config) -> Vec<Row> {
    let index = watches::sync_once(ns.client(), config, |kind, error| {
        panic!("listing {}: {error}", kind.as_str())
    })
    .await
    .expect("every kind lists");
    audit::rows(&index, &config.policies(), Utc::now())
}

async fn has_event(ns: &TestNamespace, reason: &str, note: &str) -> bool {
    ns.events().await.iter().any(|e| {
        e.reason.as_deref() == Some(reason) && e.note.as_deref().is_some_and(|n| n.contains(note))
    })
}

/// Whether none of the workspaces of builds `jobs` is left in `ns`.
async fn gone(ns: &TestNamespace, jobs: &[&str]) -> bool {
    for job in jobs {
        if claim_exists(ns, &format!("{job}-build-workspace")).await {
            return false;
        }
    }
    true
}

/// Keeping by count (`policy.keep_failed`, Tekton's pruner's `keep: N`): with keep 2 and every
/// TTL passed, the workspaces of the two newest failed builds stay while older failed builds'
/// and a succeeded build's go; a namespace annotated `keep-failed: "3"` keeps three. A newer
/// failure pushes the oldest kept one out, and it goes. Failed builds rank by their failed
/// NotebookValidationJobs' completion times (their PipelineRuns succeeded here).
///
/// Strings, not `Reason`s, name the reason. Statuses written by hand, ten seconds apart.
#[tokio::test(flavor = "multi_thread")]
async fn the_newest_failed_builds_keep_their_workspaces_by_count() {
    let (two, three) = (ns("keep-two").await, ns("keep-three").await);
    annotate(&three, json!({annotations::NS_KEEP_FAILED: "3"})).await;
    let done = Utc::now().trunc_subsecs(0);
    for ns in [&two, &three] {
        finished_build(ns, "ok", done).await;
        for (i, name) in ["f1", "f2", "f3", "f4"].into_iter().enumerate() {
            let at = done - chrono::Duration::seconds(40 - 10 * i as i64);
            failed_build(ns, name, at, true).await;
        }
    }
    let mut config = config_over(&[&two, &three]);
    config.policy.keep_failed = 2;
    let daemon = Daemon::start(
        two.daemon_client(&config.clone()).await,
        config.clone(),
        "keep-failed",
    )
    .await;

    let kept = |ns: &TestNamespace| {
        format!(
            "claim_namespace=\"{}\",state=\"keep\",reason=\"newest-failed\"",
            ns.name()
        )
    };
    for (ns, deleted, newest) in [
        (&two, &["ok", "f1", "f2"][..], &["f3", "f4"][..]),
        (&three, &["ok", "f1"][..], &["f2", "f3", "f4"][..]),
    ] {
        assert!(
            wait_until(secs(15), || gone(ns, deleted)).await,
            "{}: the older failed builds' and the succeeded build's workspaces go",
            ns.name()
        );
        let count = newest.len() as f64;
        assert!(
            wait_until(secs(10), || async {
                metric(&daemon.metrics().await, "workspace_gc_claims", &kept(ns)) == count
            })
            .await,
            "{}: {count} claims kept as newest-failed:\n{}",
            ns.name(),
            daemon.metrics().await
        );
        for claim in newest {
            assert!(
                claim_exists(ns, &format!("{claim}-build-workspace")).await,
                "{}: {claim}, one of the newest failed builds, keeps its workspace past its TTL",
                ns.name()
            );
        }
    }
    let rows = audit_rows(&two, &config).await;
    let row = (rows
        .iter()
        .find(|r| r.namespace == two.name() && r.name == "f3-build-workspace"))
    .unwrap_or_else(|| panic!("a row for f3: {rows:#?}"));
    assert_eq!(row.decision.verdict.reason().as_str(), "newest-failed");

    // A newer failure pushes f3 out of the two newest: it goes, f4 and f5 stay.
    failed_build(&two, "f5", Utc::now().trunc_subsecs(0), true).await;
    assert!(
        wait_until(secs(15), || gone(&two, &["f3"])).await,
        "the build a newer failure pushed out loses its workspace"
    );
    assert!(
        wait_until(secs(10), || async {
            metric(&daemon.metrics().await, "workspace_gc_claims", &kept(&two)) == 2.0
        })
        .await,
        "f4 and f5 are kept as newest-failed:\n{}",
        daemon.metrics().await
    );
    for claim in ["f4-build-workspace", "f5-build-workspace"] {
        assert!(claim_exists(&two, claim).await, "{claim} stays");
    }
    daemon.stop().await;
}

/// A namespace's annotations choose when its claims are due: a longer TTL keeps a finished
/// build's workspace and `collect: "false"` keeps everything, while a namespace without any gets
/// the cluster's policy. Changing the annotations re-evaluates the namespace's claims at once.
///
/// Run statuses written by hand: runs finished five minutes ago, between the TTLs compared.
#[tokio::test(flavor = "multi_thread")]
async fn namespace_annotations_choose_when_claims_are_due() {
    let (longer, off, plain) = (
        ns("ns-longer").await,
        ns("ns-off").await,
        ns("ns-plain").await,
    );
    annotate(&longer, json!({annotations::NS_TTL_AFTER_FINISHED: "1h"})).await;
    annotate(&off, json!({annotations::NS_COLLECT: "false"})).await;
    let done = Utc::now() - chrono::Duration::minutes(5);
    for ns in [&longer, &off, &plain] {
        finished_build(ns, "nb", done).await;
    }
    let config = config_over(&[&longer, &off, &plain]);
    let daemon = Daemon::start(
        longer.daemon_client(&config.clone()).await,
        config.clone(),
        "ns-policy",
    )
    .await;

    assert!(
        wait_until(secs(10), || async {
            !claim_exists(&plain, "nb-build-workspace").await
        })
        .await,
        "the cluster's TTL applies where the namespace sets nothing"
    );
    // Decided in the same pass as the claim above.
    for ns in [&longer, &off] {
        assert!(
            claim_exists(ns, "nb-build-workspace").await,
            "{} keeps its claim",
            ns.name()
        );
    }
    let rows = audit_rows(&longer, &config).await;
    let row = |ns: &TestNamespace| {
        rows.iter()
            .find(|r| r.namespace == ns.name())
            .unwrap_or_else(|| panic!("a row for {}: {rows:#?}", ns.name()))
    };
    assert_eq!(
        row(&longer).policy.to_string(),
        "namespace ttl-after-finished=1h"
    );
    assert_eq!(row(&longer).decision.verdict.reason(), Reason::WithinTtl);
    assert_eq!(row(&off).policy.to_string(), "namespace collect=false");
    assert_eq!(row(&off).decision.verdict.reason(), Reason::CollectionOff);

    // Without its annotation, the cluster's TTL applies there too.
    annotate(&longer, json!({annotations::NS_TTL_AFTER_FINISHED: null})).await;
    assert!(
        wait_until(secs(10), || async {
            !claim_exists(&longer, "nb-build-workspace").await
        })
        .await,
        "removing the annotation makes the claim due"
    );
    // The witness: the daemon decided the claim where collection is off.
    let verdict = ("keep", "collection-off", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, off.name(), verdict).await;
    assert!(claim_exists(&off, "nb-build-workspace").await);
    daemon.stop().await;
}

/// A workspace-gc annotation on a Namespace that the daemon does not understand keeps every
/// claim there until it is fixed, where it used to be ignored (the cluster's policy applied,
/// and the claims went): `collect: "False"` (how Python or Ansible render a boolean), a
/// misspelt key, an ISO 8601 TTL (`P7D`), a value that does not parse and one out of bounds.
/// Each keeps an overdue orphan with `invalid-namespace-policy` (metric, audit with the
/// detail), and a warning event in the namespace names the annotation; a control namespace's
/// orphan goes. Fixing the annotation lets the claim go.
///
/// Strings, not `Reason`s, name the reason, so the test also builds (and fails) on code before
/// the rule.
#[tokio::test(flavor = "multi_thread")]
async fn settings_not_understood_keep_every_claim() {
    let (helm, misspelt, iso, bad, control) = (
        ns("ns-false").await,
        ns("ns-misspelt").await,
        ns("ns-iso").await,
        ns("ns-bad").await,
        ns("ns-control").await,
    );
    let cases: [(&TestNamespace, serde_json::Value, &str); 4] = [
        (
            &helm,
            json!({annotations::NS_COLLECT: "False"}),
            "collect=\"False\"",
        ),
        (
            &misspelt,
            json!({"workspace-gc.mlops.dev/colect": "false"}),
            "an unknown workspace-gc namespace annotation",
        ),
        (
            &iso,
            json!({annotations::NS_TTL_AFTER_FINISHED: "P7D"}),
            "ttl-after-finished=\"P7D\"",
        ),
        (
            &bad,
            json!({annotations::NS_ORPHAN_GRACE: "soon", annotations::NS_MAX_AGE: "1m"}),
            "may not shorten",
        ),
    ];
    for (ns, notes, _) in &cases {
        annotate(ns, notes.clone()).await;
    }
    let all = [&helm, &misspelt, &iso, &bad, &control];
    for ns in all {
        ClaimBuilder::build_workspace("orphan-build-workspace")
            .create(ns)
            .await;
    }
    let mut config = config_over(&all);
    config.policy.orphan_grace = secs(1);
    let daemon = Daemon::start(
        helm.daemon_client(&config.clone()).await,
        config.clone(),
        "ns-invalid",
    )
    .await;

    assert!(
        wait_until(secs(15), || async {
            !claim_exists(&control, "orphan-build-workspace").await
        })
        .await,
        "the control namespace's overdue orphan goes"
    );
    let kept = |ns: &TestNamespace| {
        format!(
            "claim_namespace=\"{}\",state=\"keep\",reason=\"invalid-namespace-policy\"",
            ns.name()
        )
    };
    for (ns, _, _) in &cases {
        assert!(
            wait_until(secs(10), || async {
                metric(&daemon.metrics().await, "workspace_gc_claims", &kept(ns)) == 1.0
            })
            .await,
            "{} counts its claim kept with invalid-namespace-policy:\n{}",
            ns.name(),
            daemon.metrics().await
        );
        assert!(
            claim_exists(ns, "orphan-build-workspace").await,
            "{} keeps its overdue orphan",
            ns.name()
        );
    }
    for (ns, _, note) in &cases {
        assert!(
            wait_until(secs(10), || has_event(ns, "InvalidNamespacePolicy", note)).await,
            "a warning event in {} names the annotation ({note}):\n{:#?}",
            ns.name(),
            ns.events().await
        );
    }
    assert!(has_event(&bad, "InvalidNamespacePolicy", "\"soon\"").await);
    let rows = audit_rows(&helm, &config).await;
    for (ns, _, note) in &cases {
        let row = (rows.iter().find(|r| r.namespace == ns.name()))
            .unwrap_or_else(|| panic!("a row for {}: {rows:#?}", ns.name()));
        assert_eq!(
            row.decision.verdict.reason().as_str(),
            "invalid-namespace-policy",
            "{row:#?}"
        );
        let detail = row.decision.detail.as_deref().unwrap_or_default();
        assert!(detail.contains(note), "{detail}");
    }

    // Fixed, the namespace's policy counts again: the orphan goes.
    annotate(&misspelt, json!({"workspace-gc.mlops.dev/colect": null})).await;
    assert!(
        wait_until(secs(10), || async {
            !claim_exists(&misspelt, "orphan-build-workspace").await
        })
        .await,
        "removing the misspelt annotation makes the orphan due"
    );
    assert!(claim_exists(&helm, "orphan-build-workspace").await);
    daemon.stop().await;
}

async fn scheduled_events(ns: &TestNamespace) -> Vec<Event> {
    (ns.events().await.into_iter())
        .filter(|e| e.reason.as_deref() == Some("DeletionScheduled"))
        .collect()
}

async fn annotate_claim(ns: &TestNamespace, key: &str, value: &str) {
    ns.api::<PersistentVolumeClaim>()
        .patch(
            "nb-build-workspace",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate the claim: {e}"));
}

/// `deletion.notice_before` ahead of the instant a claim becomes due, one `DeletionScheduled`
/// event names that instant, the reason and how to keep the claim, and the claim itself is not
/// written; a changed deadline gets a new event, and `keep` keeps it.
///
/// Run statuses written by hand: a run finished at the whole-second instant the notice and the
/// deadline are timed from.
#[tokio::test(flavor = "multi_thread")]
async fn deletion_is_announced_once_per_deadline() {
    let ns = ns("notice").await;
    let done = Utc::now().trunc_subsecs(0);
    finished_build(&ns, "nb", done).await;
    let created = ns
        .api::<PersistentVolumeClaim>()
        .get("nb-build-workspace")
        .await;
    let version = created.expect("the claim").metadata.resource_version;
    let mut config = ns.config();
    config.policy.ttl_after_finished = secs(12);
    config.deletion.notice_before = Some(secs(8));
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "notice").await;

    let due = done + chrono::Duration::seconds(12);
    let stamp = |at: DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        wait_until(secs(15), || async {
            !scheduled_events(&ns).await.is_empty()
        })
        .await,
        "a DeletionScheduled event is written"
    );
    let events = scheduled_events(&ns).await;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains(&stamp(due)), "{note}");
    assert!(note.contains("ttl-expired"), "{note}");
    assert!(
        note.contains("workspace-gc.mlops.dev/keep: \"true\""),
        "{note}"
    );
    let written = events[0].event_time.as_ref().expect("an event time").0;
    assert!(
        written.as_second() < due.timestamp(),
        "written before the claim is due"
    );
    let now = ns
        .api::<PersistentVolumeClaim>()
        .get("nb-build-workspace")
        .await;
    assert_eq!(
        now.expect("still there").metadata.resource_version,
        version,
        "the claim is not written"
    );

    // A later deadline is announced again, once.
    annotate_claim(&ns, annotations::TTL, "30s").await;
    let later = done + chrono::Duration::seconds(30);
    assert!(
        wait_until(secs(30), || async {
            let events = scheduled_events(&ns).await;
            events
                .iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&stamp(later))))
        })
        .await,
        "the new deadline is announced: {:#?}",
        scheduled_events(&ns).await
    );
    let events = scheduled_events(&ns).await;
    assert_eq!(events.len(), 2, "one event per deadline: {events:#?}");
    assert!(
        events.iter().all(|e| e.series.is_none()),
        "never repeated: {events:#?}"
    );
    annotate_claim(&ns, annotations::KEEP, "true").await;
    // The witness: the daemon decided the claim again, protected by the annotation (a verdict
    // that no time changes).
    let verdict = ("protected", "keep-annotation", 1.0);
    assert_decided(|| daemon.metrics(), 0.0, ns.name(), verdict).await;
    assert!(
        claim_exists(&ns, "nb-build-workspace").await,
        "kept as the notice says"
    );
    daemon.stop().await;
}

/// A claim `{job}-build-workspace` bound to a new PersistentVolume with `policy`, and the
/// finished build it belongs to. Returns the volume's name.
async fn bound_build(ns: &TestNamespace, job: &str, policy: &str) -> String {
    let claim = format!("{job}-build-workspace");
    let volume = format!("{}-{job}", ns.name());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": policy,
            "hostPath": {"path": format!("/tmp/{volume}")},
            "claimRef": {"namespace": ns.name(), "name": claim},
        },
    }))
    .expect("a volume");
    Api::<PersistentVolume>::all(ns.client().clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("create volume {volume}: {e}"));
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        // The operator's claim: its labels, in the write that makes it.
        "metadata": {"name": claim, "labels": testkit::graph::operator_labels()},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": volume, "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .expect("a claim");
    ns.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap_or_else(|e| panic!("create claim {claim}: {e}"));
    let done = Utc::now() - chrono::Duration::hours(2);
    JobBuilder::new(job)
        .phase("Succeeded")
        .completed_at(done)
        .create(ns)
        .await;
    volume
}

/// A claim whose volume a `Retain` policy keeps frees no storage: its bytes count as retained,
/// not reclaimed, and the Deleted event says the volume was kept; a `Delete` volume's claim is
/// reclaimed as before.
#[tokio::test(flavor = "multi_thread")]
async fn storage_a_retain_volume_keeps_is_reported_as_retained() {
    let ns = ns("retain").await;
    let kept = bound_build(&ns, "kept", "Retain").await;
    let freed = bound_build(&ns, "freed", "Delete").await;
    let mut config = ns.config();
    config.deletion.read_volumes = true;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "retain").await;

    let deleted_note = |claim: &'static str| {
        let ns = &ns;
        async move {
            (ns.events().await.into_iter())
                .filter(|e| e.reason.as_deref() == Some("Deleted"))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim))
                .find_map(|e| e.note)
        }
    };
    assert!(
        wait_until(secs(15), || async {
            deleted_note("kept-build-workspace").await.is_some()
                && deleted_note("freed-build-workspace").await.is_some()
        })
        .await,
        "both claims are deleted"
    );
    let note = deleted_note("kept-build-workspace")
        .await
        .unwrap_or_default();
    assert!(
        note.contains(&format!(
            "its volume {kept} is kept (reclaim policy Retain)"
        )),
        "{note}"
    );
    let note = deleted_note("freed-build-workspace")
        .await
        .unwrap_or_default();
    assert!(!note.contains("is kept"), "{note}");
    let metrics = daemon.metrics().await;
    let gib = 1_073_741_824.0;
    assert_eq!(
        metric(&metrics, "workspace_gc_retained_bytes_total", ""),
        gib,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "workspace_gc_reclaimed_bytes_total", ""),
        gib,
        "{metrics}"
    );
    daemon.stop().await;
    for volume in [kept, freed] {
        let _ = Api::<PersistentVolume>::all(ns.client().clone())
            .delete(&volume, &DeleteParams::default())
            .await;
    }
}

/// PersistentVolume `name` as the API server has it; `None` once it is gone.
async fn volume(ns: &TestNamespace, name: &str) -> Option<PersistentVolume> {
    Api::<PersistentVolume>::all(ns.client().clone())
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get volume {name}: {e}"))
}

async fn phase(ns: &TestNamespace, name: &str) -> Option<String> {
    volume(ns, name).await?.status?.phase
}

async fn wait_for_phase(ns: &TestNamespace, name: &str, wanted: &str) {
    assert!(
        wait_until(secs(60), || async {
            phase(ns, name).await.as_deref() == Some(wanted)
        })
        .await,
        "volume {name} is {wanted}: {:?}",
        volume(ns, name).await
    );
}

fn annotation(volume: &PersistentVolume, key: &str) -> Option<String> {
    volume.metadata.annotations.as_ref()?.get(key).cloned()
}

fn claim_uid(volume: &PersistentVolume) -> Option<String> {
    volume.spec.as_ref()?.claim_ref.as_ref()?.uid.clone()
}

async fn patch_volume(ns: &TestNamespace, name: &str, patch: serde_json::Value, status: bool) {
    let api = Api::<PersistentVolume>::all(ns.client().clone());
    let patch = Patch::Merge(patch);
    let patched = if status {
        api.patch_status(name, &PatchParams::default(), &patch)
            .await
    } else {
        api.patch(name, &PatchParams::default(), &patch).await
    };
    patched.unwrap_or_else(|e| panic!("patch volume {name}: {e}"));
}

/// With `deletion.released_volume_ttl`, the Retain volume of a claim workspace-gc deleted is
/// deleted once Released for the TTL; kept are the one whose claim someone else deleted, one
/// still bound (even carrying its claim's UID as the mark), a Delete volume's (never marked),
/// and one Released since a time not known. The real PV controller binds the volumes and
/// releases them.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_released_volume_of_a_claim_workspace_gc_deleted_is_deleted() {
    let cp = ControlPlane::start_with_volume_controller();
    let ns = TestNamespace::new(&cp, "released").await;
    let ours = bound_build(&ns, "ours", "Retain").await;
    let theirs = bound_build(&ns, "theirs", "Retain").await;
    let bound = bound_build(&ns, "bound", "Retain").await;
    let freed = bound_build(&ns, "freed", "Delete").await;
    for volume in [&ours, &theirs, &bound, &freed] {
        wait_for_phase(&ns, volume, "Bound").await;
    }
    let claims = ns.api::<PersistentVolumeClaim>();
    for claim in ["theirs-build-workspace", "bound-build-workspace"] {
        let keep = json!({"metadata": {"annotations": {annotations::KEEP: "true"}}});
        claims
            .patch(claim, &PatchParams::default(), &Patch::Merge(keep))
            .await
            .unwrap_or_else(|e| panic!("keep {claim}: {e}"));
    }
    // Someone else deletes this claim: its volume goes Released, without workspace-gc's mark.
    claims
        .delete("theirs-build-workspace", &DeleteParams::default())
        .await
        .expect("delete the claim by hand");
    wait_for_phase(&ns, &theirs, "Released").await;
    // Still bound, though it carries its claim's UID as workspace-gc's mark would.
    let bound_uid = claim_uid(&volume(&ns, &bound).await.expect("bound volume")).expect("a UID");
    let mark = json!({"metadata": {"annotations": {annotations::DELETED_CLAIM_UID: bound_uid}}});
    patch_volume(&ns, &bound, mark, false).await;
    // Marked and Released, but since an instant that cannot be right: the PV controller
    // releases it (its claim is gone), then its lastPhaseTransitionTime is set far ahead. (A
    // missing one cannot be made here: the API server refills a cleared one. Volumes from
    // before 1.31 lack it; decide::volumes and the controller's sweep test keep those.)
    let unknown = format!("{}-unknown", ns.name());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": unknown, "annotations": {annotations::DELETED_CLAIM_UID: "gone-uid"}},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": format!("/tmp/{unknown}")},
            "claimRef": {"namespace": ns.name(), "name": "gone-build-workspace", "uid": "gone-uid"},
        },
    }))
    .expect("a volume");
    Api::<PersistentVolume>::all(ns.client().clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("create the volume");
    wait_for_phase(&ns, &unknown, "Released").await;
    let ahead = "2100-01-01T00:00:00Z";
    let bad = json!({"status": {"lastPhaseTransitionTime": ahead}});
    patch_volume(&ns, &unknown, bad, true).await;
    let transition = |pv: Option<PersistentVolume>| Some(pv?.status?.last_phase_transition_time?.0);
    let read = transition(volume(&ns, &unknown).await).map(|t| t.to_string());
    assert_eq!(read.as_deref(), Some(ahead), "set ahead");

    let mut config = ns.config();
    config.deletion.read_volumes = true;
    config.deletion.released_volume_ttl = Some(secs(6));
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "released").await;

    // Ours: marked before its claim's delete, then Released, then deleted after the TTL.
    assert!(
        wait_until(secs(90), || async { volume(&ns, &ours).await.is_none() }).await,
        "the Released volume of the claim workspace-gc deleted is deleted: {:?}",
        volume(&ns, &ours).await
    );
    assert!(!claim_exists(&ns, "freed-build-workspace").await);
    // Two more sweeps completed (every 3 s): the second began after ours was gone, so it
    // judged every other volume past the moment ours went, with their TTLs long passed.
    let sweeps = |metrics: &str| {
        metric(
            metrics,
            "workspace_gc_volume_sweeps_total",
            "result=\"completed\"",
        )
    };
    let gone = sweeps(&daemon.metrics().await);
    assert!(
        wait_until(secs(30), || async {
            sweeps(&daemon.metrics().await) >= gone + 2.0
        })
        .await,
        "two more sweeps after {gone}: {}",
        daemon.metrics().await
    );
    for kept in [&theirs, &bound, &unknown] {
        // Not deleted at all: a bound volume's pv-protection finalizer would hide a DELETE.
        let found = volume(&ns, kept)
            .await
            .map(|pv| pv.metadata.deletion_timestamp);
        assert_eq!(found, Some(None), "{kept} is kept");
    }
    assert_eq!(phase(&ns, &bound).await.as_deref(), Some("Bound"));
    assert!(claim_exists(&ns, "bound-build-workspace").await);
    // The Delete volume's claim was deleted, its volume never marked (the PV controller may
    // have deleted it itself, or failed to: hostPath has no deleter here).
    if let Some(freed) = volume(&ns, &freed).await {
        assert_eq!(annotation(&freed, annotations::DELETED_CLAIM_UID), None);
    }
    let theirs = volume(&ns, &theirs).await.expect("theirs");
    assert_eq!(annotation(&theirs, annotations::DELETED_CLAIM_UID), None);
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "workspace_gc_volume_marks_total",
            "result=\"marked\""
        ),
        1.0,
        "only ours: {metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "workspace_gc_volume_deletions_total",
            "result=\"deleted\""
        ),
        1.0,
        "{metrics}"
    );
    daemon.stop().await;
}

/// A claim DELETE answered 503 by a hop that never forwarded it was not carried out, so its
/// Retain volume must not be marked: the claim lives on (kept: a re-run, here `keep`), and
/// when someone else deletes it later, its Released volume and the data on it stay. (Before,
/// the mark was written ahead of the DELETE and stayed, and the sweep deleted the volume.) A
/// claim workspace-gc did delete, released after it, is the witness that the sweep judged
/// the first volume past its TTL.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_not_known_to_be_carried_out_leaves_the_retain_volume_alone() {
    let cp = ControlPlane::start_with_volume_controller();
    let ns = TestNamespace::new(&cp, "unmarked").await;
    let lost = bound_build(&ns, "lost", "Retain").await;
    let ours = bound_build(&ns, "ours", "Retain").await;
    for volume in [&lost, &ours] {
        wait_for_phase(&ns, volume, "Bound").await;
    }
    let claims = ns.api::<PersistentVolumeClaim>();
    let keep = |value: Option<&str>| {
        Patch::Merge(json!({"metadata": {"annotations": {annotations::KEEP: value}}}))
    };
    (claims.patch(
        "ours-build-workspace",
        &PatchParams::default(),
        &keep(Some("true")),
    ))
    .await
    .expect("keep ours for now");
    let proxy = Proxy::http(&cp).await;
    let mut config = ns.config();
    config.deletion.read_volumes = true;
    config.deletion.released_volume_ttl = Some(secs(6));
    let client = ns.daemon_client_via(&config, &proxy.url()).await;
    let user = service_account(ns.name(), testkit::DAEMON_ACCOUNT);
    let lost_claim = "lost-build-workspace";
    // The hop answers every DELETE of this claim 503 and never forwards one.
    let unanswered = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::unavailable())
            .user(user.clone())
            .name(lost_claim),
    );
    let daemon = Daemon::start(client, config, "unmarked").await;
    assert!(
        wait_until(secs(30), || async { proxy.hits(unanswered) >= 1 }).await,
        "the DELETE was sent and answered 503"
    );
    // Reads of the claim fail for a while too, so that what the daemon does after a 503
    // settles before the claim is kept.
    let unread = proxy.add(
        Rule::new("get", "persistentvolumeclaims", Fault::unavailable())
            .user(user)
            .name(lost_claim),
    );
    let hits = proxy.hits(unanswered);
    assert!(
        wait_until(secs(30), || async {
            proxy.hits(unread) >= 1 || proxy.hits(unanswered) > hits + 1
        })
        .await,
        "the daemon went on after the 503"
    );
    (claims.patch(lost_claim, &PatchParams::default(), &keep(Some("true"))))
        .await
        .expect("keep the claim");
    assert!(
        wait_until(secs(30), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_claims",
                "state=\"protected\",reason=\"keep-annotation\"",
            ) == 2.0
        })
        .await,
        "the daemon keeps both claims: {}",
        daemon.metrics().await
    );
    proxy.remove(unanswered);
    proxy.remove(unread);
    // Months later, someone else deletes the claim: its volume is Released.
    (claims.delete(lost_claim, &DeleteParams::default()))
        .await
        .expect("delete the claim by hand");
    wait_for_phase(&ns, &lost, "Released").await;
    // Now workspace-gc deletes the other claim; its volume, Released after the first, goes
    // after the TTL.
    (claims.patch("ours-build-workspace", &PatchParams::default(), &keep(None)))
        .await
        .expect("let ours go");
    assert!(
        wait_until(secs(90), || async { volume(&ns, &ours).await.is_none() }).await,
        "the Released volume of the claim workspace-gc deleted is deleted: {:?}",
        volume(&ns, &ours).await
    );
    let kept = volume(&ns, &lost).await;
    let marked = kept
        .as_ref()
        .and_then(|pv| annotation(pv, annotations::DELETED_CLAIM_UID));
    assert!(
        kept.as_ref()
            .is_some_and(|pv| pv.metadata.deletion_timestamp.is_none()),
        "the volume of the claim whose DELETE was never carried out is kept (marked {marked:?})"
    );
    assert_eq!(marked, None);
    daemon.stop().await;
}
