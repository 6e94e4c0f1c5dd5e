//! Quota pressure end to end, against a real kube-apiserver whose kube-controller-manager runs
//! the resource-quota controller, so `status.used` is the real one: exactly the oldest-completed
//! workspaces needed to fall to low water are deleted, for `requests.storage`, a class-scoped
//! quota and the `persistentvolumeclaims` count, and a namespace left at high water with nothing
//! more to delete gets one `QuotaPressure` warning. The daemon runs with the default TTL (1h)
//! and waters (0.9, 0.8).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, PostParams};
use support::{
    ClaimBuilder, ControlPlane, Daemon, PipelineRunBuilder, TestNamespace, claim_exists, metric,
    wait_until,
};
use workspace_gc::contract::annotations;

/// `{job}-build-workspace`, bound by PipelineRun `{job}-build` that finished `minutes_ago`:
/// within the 1h TTL.
async fn finished(ns: &TestNamespace, job: &str, minutes_ago: i64, class: Option<&str>) {
    let at = Utc::now() - chrono::Duration::minutes(minutes_ago);
    PipelineRunBuilder::for_job(job)
        .succeeded_at(at)
        .create(ns)
        .await;
    let claim = ClaimBuilder::for_job(job);
    match class {
        Some(class) => claim.storage_class(class),
        None => claim,
    }
    .create(ns)
    .await;
}

async fn running(ns: &TestNamespace, job: &str) {
    PipelineRunBuilder::for_job(job).running().create(ns).await;
    ClaimBuilder::for_job(job).create(ns).await;
}

/// A claim whose build finished long ago (1h05m: past the TTL were it not kept), marked keep.
async fn kept(ns: &TestNamespace, job: &str) {
    let at = Utc::now() - chrono::Duration::minutes(65);
    PipelineRunBuilder::for_job(job)
        .succeeded_at(at)
        .create(ns)
        .await;
    ClaimBuilder::for_job(job)
        .annotation(annotations::KEEP, "true")
        .create(ns)
        .await;
}

/// Creates quota `name` with `hard` and waits until the quota controller has written every
/// resource's `status.used` as `hard` (the namespace is exactly full).
async fn full_quota(ns: &TestNamespace, name: &str, hard: &[(&str, &str)]) {
    let hard: BTreeMap<String, Quantity> = hard
        .iter()
        .map(|(resource, amount)| (resource.to_string(), Quantity(amount.to_string())))
        .collect();
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.clone()),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    };
    let api = ns.api::<ResourceQuota>();
    api.create(&PostParams::default(), &quota)
        .await
        .unwrap_or_else(|e| panic!("create quota {}/{name}: {e}", ns.name()));
    let counted = || async {
        let quota = api.get(name).await.expect("read the quota");
        let used = quota.status.and_then(|s| s.used).unwrap_or_default();
        hard.iter().all(|(resource, amount)| {
            used.get(resource)
                .is_some_and(|u| same_amount(&u.0, &amount.0))
        })
    };
    assert!(
        wait_until(Duration::from_secs(30), counted).await,
        "the quota controller counts {}/{name} as full",
        ns.name()
    );
}

/// `1Gi` and `1073741824` are the same amount.
fn same_amount(a: &str, b: &str) -> bool {
    workspace_gc::config::quantity::amount(a) == workspace_gc::config::quantity::amount(b)
}

/// Waits until exactly `deleted` are gone, then checks for a few seconds that `kept` stay.
async fn exactly_deleted(ns: &TestNamespace, deleted: &[&str], kept: &[&str]) {
    let all_gone = || async {
        for job in deleted {
            if claim_exists(ns, &format!("{job}-build-workspace")).await {
                return false;
            }
        }
        true
    };
    assert!(
        wait_until(Duration::from_secs(30), all_gone).await,
        "{deleted:?} are deleted under pressure"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    for job in kept {
        assert!(
            claim_exists(ns, &format!("{job}-build-workspace")).await,
            "{job}-build-workspace survives"
        );
    }
}

async fn ns(prefix: &str) -> TestNamespace {
    TestNamespace::new(ControlPlane::shared(), prefix).await
}

async fn events(ns: &TestNamespace, reason: &str) -> Vec<Event> {
    ns.events()
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_storage_quota_loses_exactly_its_oldest_finished_workspaces() {
    let ns = ns("quota-storage").await;
    for (job, minutes_ago) in [("old", 50), ("older", 55), ("recent", 10), ("newer", 20)] {
        finished(&ns, job, minutes_ago, None).await;
    }
    running(&ns, "busy").await;
    kept(&ns, "debug").await;
    // 6 claims of 1Gi at 100%: 80% is 4.8Gi, so two must go, the two oldest completions.
    full_quota(&ns, "storage", &[("requests.storage", "6Gi")]).await;

    let daemon = Daemon::start(ns.client().clone(), ns.config(), "quota-storage").await;
    exactly_deleted(
        &ns,
        &["older", "old"],
        &["newer", "recent", "busy", "debug"],
    )
    .await;

    let metrics = daemon.metrics().await;
    let deleted = format!(
        "namespace=\"{}\",reason=\"quota-pressure\",result=\"deleted\"",
        ns.name()
    );
    assert_eq!(
        metric(&metrics, "workspace_gc_deletions_total", &deleted),
        2.0,
        "{metrics}"
    );
    let ratio = format!(
        "namespace=\"{}\",quota=\"storage\",resource=\"requests.storage\"",
        ns.name()
    );
    let recounted = || async {
        let metrics = daemon.metrics().await;
        (metric(&metrics, "workspace_gc_quota_used_ratio", &ratio) - 4.0 / 6.0).abs() < 1e-9
    };
    assert!(
        wait_until(Duration::from_secs(30), recounted).await,
        "the ratio follows the recount: {}",
        daemon.metrics().await
    );
    assert!(events(&ns, "QuotaPressure").await.is_empty(), "relieved");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_scoped_quota_takes_only_claims_of_its_class() {
    let ns = ns("quota-class").await;
    // The classless claims finished earliest, but a `fast` quota does not count them.
    finished(&ns, "plain-a", 58, None).await;
    finished(&ns, "plain-b", 57, None).await;
    for (job, minutes_ago) in [("fast-a", 30), ("fast-b", 40), ("fast-c", 20)] {
        finished(&ns, job, minutes_ago, Some("fast")).await;
    }
    // 3 of 3 fast claims: 80% is 2.4, so the oldest fast one goes.
    full_quota(
        &ns,
        "fast",
        &[(
            "fast.storageclass.storage.k8s.io/persistentvolumeclaims",
            "3",
        )],
    )
    .await;

    let daemon = Daemon::start(ns.client().clone(), ns.config(), "quota-class").await;
    exactly_deleted(
        &ns,
        &["fast-b"],
        &["fast-a", "fast-c", "plain-a", "plain-b"],
    )
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_claim_count_with_nothing_more_to_take_warns_once() {
    let ns = ns("quota-count").await;
    finished(&ns, "done", 30, None).await;
    for i in 0..9 {
        kept(&ns, &format!("debug-{i}")).await;
    }
    // 10 of 10 claims: deleting the one finished workspace leaves 90%, still at high water.
    full_quota(&ns, "claims", &[("persistentvolumeclaims", "10")]).await;

    let daemon = Daemon::start(ns.client().clone(), ns.config(), "quota-count").await;
    let kept: Vec<String> = (0..9).map(|i| format!("debug-{i}")).collect();
    let kept: Vec<&str> = kept.iter().map(String::as_str).collect();
    exactly_deleted(&ns, &["done"], &kept).await;

    let warned = || async { !events(&ns, "QuotaPressure").await.is_empty() };
    assert!(
        wait_until(Duration::from_secs(10), warned).await,
        "a QuotaPressure warning"
    );
    let warnings = events(&ns, "QuotaPressure").await;
    assert_eq!(warnings.len(), 1, "once per round: {warnings:?}");
    let warning = &warnings[0];
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let regarding = warning.regarding.as_ref().expect("regarding");
    assert_eq!(regarding.kind.as_deref(), Some("ResourceQuota"));
    assert_eq!(regarding.name.as_deref(), Some("claims"));
    let note = warning.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("quota claims persistentvolumeclaims at 100% (10 of 10)"),
        "{note}"
    );
    daemon.stop().await;
}
