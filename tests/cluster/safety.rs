//! The object graphs that once made workspace-gc delete a claim it had to keep, each against a
//! real kube-apiserver and etcd with the daemon running: a partial completion time, links that
//! shadowed one another, TaskRuns, a run the stalled watch never delivered, exclusions replaced
//! by an override, and the audit's account of time. Each test failed on the code before its
//! fix (issue 11), as did those of a job's own volumes and the `Unused` condition (issue 34);
//! a finished run held Terminating by a finalizer was already kept within its TTL, and its
//! test holds that.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, JobBuilder, PipelineRunBuilder, PodBuilder, Proxy,
    TestNamespace, assert_decided, claim_exists, metric, metric_sum, reconciles, task_run_resource,
    wait_until,
};
use workspace_gc::cluster::watches;
use workspace_gc::config::{Config, Overrides};
use workspace_gc::contract::annotations;
use workspace_gc::decide::policy::{Reason, VerdictState};
use workspace_gc::surface::audit::{self, Row};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn hours_ago(n: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::hours(n)
}

/// Watches only `ns`, no leader election, a generous rate, and a one-second orphan grace so
/// that a claim no owner protects is due at once.
fn config_for(namespaces: &[&TestNamespace]) -> Config {
    let mut config = Config::default();
    config.selector.namespaces = namespaces.iter().map(|ns| ns.name().to_owned()).collect();
    config.leader_election.enabled = false;
    config.deletion.deletes_per_second = 100.0;
    config.deletion.max_deletions_per_window = 1000;
    config.policy.orphan_grace = secs(1);
    config
}

/// The audit's verdict on every claim in the configured namespaces: the daemon's own watches,
/// cache, linking and policy, listed once.
async fn audit(client: &kube::Client, config: &Config) -> Vec<Row> {
    let index = watches::sync_once(client, config, |kind, error| {
        panic!("listing {}: {error}", kind.as_str())
    })
    .await
    .expect("every kind lists");
    audit::rows(&index, &config.policies(), Utc::now())
}

async fn verdict(ns: &TestNamespace, config: &Config, claim: &str) -> (VerdictState, Reason) {
    let rows = audit(ns.client(), config).await;
    let row = rows
        .iter()
        .find(|row| row.namespace == ns.name() && row.name == claim)
        .unwrap_or_else(|| panic!("claim {claim} is tracked"));
    (row.decision.verdict.state(), row.decision.verdict.reason())
}

/// Waits for the witness that the daemon decided the claims of `ns` as `verdict` (state,
/// reason, count) says, in a reconcile finished after it had finished `since` (read at the
/// moment in question), then asserts `claim` is still there.
async fn survives(
    daemon: &Daemon,
    ns: &TestNamespace,
    claim: &str,
    since: f64,
    verdict: (&str, &str, f64),
) {
    assert_decided(|| daemon.metrics(), since, ns.name(), verdict).await;
    assert!(
        claim_exists(ns, claim).await,
        "{claim} must be kept, yet it was deleted"
    );
}

/// Reconciles the daemon has finished so far: read at a moment a witness must come after.
async fn reconciled(daemon: &Daemon) -> f64 {
    reconciles(&daemon.metrics().await)
}

async fn deleted_within(ns: &TestNamespace, claim: &str, seconds: u64) -> bool {
    wait_until(secs(seconds), || async { !claim_exists(ns, claim).await }).await
}

async fn patch_status(
    ns: &TestNamespace,
    resource: &kube::api::ApiResource,
    name: &str,
    status: serde_json::Value,
) {
    ns.dynamic_api(resource)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("patch the status of {name}: {e}"));
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn go_zero_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap()
}

/// The operator fails a job through a phase-only status update: `Failed` without a completion
/// time, written on a later reconcile or never. A run that finished long ago must not start
/// the TTL alone. Go's zero time is no completion time either, and never makes the reclaim lag
/// absurd.
///
/// Run statuses written by hand: a run finished two hours ago, and Go's zero time as a completion
/// time, neither of which real Tekton writes in a test.
#[tokio::test(flavor = "multi_thread")]
async fn a_partial_completion_time_never_starts_the_ttl() {
    let ns = TestNamespace::new(ControlPlane::shared(), "partial").await;
    let config = config_for(&[&ns]);
    let long_ago = hours_ago(2);
    // Failed through a phase-only update; the run finished two hours ago.
    JobBuilder::new("failed").phase("Failed").create(&ns).await;
    PipelineRunBuilder::for_job("failed")
        .failed_at(long_ago)
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("failed-build-workspace")
        .create(&ns)
        .await;
    // Go's zero time on both owners.
    JobBuilder::new("zero")
        .phase("Succeeded")
        .completed_at(go_zero_time())
        .create(&ns)
        .await;
    PipelineRunBuilder::for_job("zero")
        .succeeded_at(go_zero_time())
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("zero-build-workspace")
        .create(&ns)
        .await;

    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "partial",
    )
    .await;
    let missing = ("keep", "completion-time-missing", 2.0);
    survives(&daemon, &ns, "failed-build-workspace", 0.0, missing).await;
    assert!(claim_exists(&ns, "zero-build-workspace").await);
    for claim in ["failed-build-workspace", "zero-build-workspace"] {
        assert_eq!(
            verdict(&ns, &config, claim).await,
            (VerdictState::Keep, Reason::CompletionTimeMissing),
            "{claim}"
        );
    }

    // The later reconcile writes the time: the TTL runs from it, long past.
    let job = testkit::notebook_validation_job_resource();
    for name in ["failed", "zero"] {
        patch_status(
            &ns,
            &job,
            name,
            json!({"completionTime": rfc3339(long_ago)}),
        )
        .await;
    }
    patch_status(
        &ns,
        &testkit::pipeline_run_resource(),
        "zero-build",
        json!({"completionTime": rfc3339(long_ago)}),
    )
    .await;
    for claim in ["failed-build-workspace", "zero-build-workspace"] {
        assert!(
            deleted_within(&ns, claim, 15).await,
            "{claim} is deleted once the times are written"
        );
    }
    let metrics = daemon.metrics().await;
    let lag_sum = metric_sum(&metrics, "workspace_gc_reclaim_lag_seconds_sum");
    let lag_count = metric_sum(&metrics, "workspace_gc_reclaim_lag_seconds_count");
    assert_eq!(lag_count, 2.0, "{metrics}");
    // Due an hour after completion, two hours ago, and the claim was created moments ago: the
    // lag is measured from the claim's creation at the earliest.
    assert!(lag_sum < 60.0, "reclaim lag {lag_sum} s for two claims");
    daemon.stop().await;
}

/// An owner reference to one PipelineRun must not stop the workspace binding from linking a
/// re-run that is still running; an owner reference to one job must not stop the naming
/// convention from linking the job of the claim's name.
///
/// Run statuses written by hand: a run finished two hours ago, and a re-run running without pods
/// (real Tekton's would mount the claim and protect it alone).
#[tokio::test(flavor = "multi_thread")]
async fn links_add_up_and_every_owner_must_allow() {
    let ns = TestNamespace::new(ControlPlane::shared(), "links").await;
    let config = config_for(&[&ns]);
    let first = PipelineRunBuilder::for_job("rerun")
        .succeeded_at(hours_ago(2))
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("rerun-build-workspace")
        .owned_by(&first)
        .create(&ns)
        .await;
    PipelineRunBuilder::new("rerun-build-2")
        .workspace_claim("rerun-build-workspace")
        .running()
        .create(&ns)
        .await;

    let old_job = JobBuilder::new("earlier")
        .phase("Succeeded")
        .completed_at(hours_ago(2))
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("again-build-workspace")
        .owned_by(&old_job)
        .create(&ns)
        .await;
    JobBuilder::new("again").phase("Building").create(&ns).await;

    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "links",
    )
    .await;
    let running = ("keep", "owner-running", 2.0);
    survives(&daemon, &ns, "rerun-build-workspace", 0.0, running).await;
    assert!(claim_exists(&ns, "again-build-workspace").await);
    for claim in ["rerun-build-workspace", "again-build-workspace"] {
        assert_eq!(
            verdict(&ns, &config, claim).await,
            (VerdictState::Keep, Reason::OwnerRunning),
            "{claim}"
        );
    }

    // Once the re-run and the job finish past their TTL, every owner allows it.
    let finished = json!({
        "completionTime": rfc3339(hours_ago(2)),
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}],
    });
    patch_status(
        &ns,
        &testkit::pipeline_run_resource(),
        "rerun-build-2",
        finished,
    )
    .await;
    let job_done = json!({"phase": "Succeeded", "completionTime": rfc3339(hours_ago(2))});
    patch_status(
        &ns,
        &testkit::notebook_validation_job_resource(),
        "again",
        job_done,
    )
    .await;
    for claim in ["rerun-build-workspace", "again-build-workspace"] {
        assert!(
            deleted_within(&ns, claim, 15).await,
            "{claim} is deleted once every owner allows it"
        );
    }
    daemon.stop().await;
}

/// A TaskRun that binds a claim keeps it while it runs, whether or not its pod exists (a pod
/// refused by an exhausted quota is exactly when claims pile up), and its completion time
/// starts the TTL. A TaskRun named in an owner reference is a managed owner, not a foreign one.
///
/// Run statuses written by hand: a TaskRun running with no pod, and one finished two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn task_runs_are_owners() {
    let ns = TestNamespace::new(ControlPlane::shared(), "taskrun").await;
    let config = config_for(&[&ns]);
    ClaimBuilder::build_workspace("bound-by-task-build-workspace")
        .create(&ns)
        .await;
    PipelineRunBuilder::task_run("build-task-run")
        .workspace_claim("bound-by-task-build-workspace")
        .running()
        .create(&ns)
        .await;
    let owner = PipelineRunBuilder::task_run("owning-task-run")
        .succeeded_at(hours_ago(2))
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("owned-by-task-build-workspace")
        .owned_by(&owner)
        .create(&ns)
        .await;

    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "taskrun",
    )
    .await;
    assert!(
        deleted_within(&ns, "owned-by-task-build-workspace", 10).await,
        "a TaskRun owner finished past its TTL lets its claim go"
    );
    let running = ("keep", "owner-running", 1.0);
    survives(&daemon, &ns, "bound-by-task-build-workspace", 0.0, running).await;
    assert_eq!(
        verdict(&ns, &config, "bound-by-task-build-workspace").await,
        (VerdictState::Keep, Reason::OwnerRunning)
    );

    let finished = json!({
        "completionTime": rfc3339(hours_ago(2)),
        "conditions": [{"type": "Succeeded", "status": "False", "reason": "Failed"}],
    });
    patch_status(&ns, &task_run_resource(), "build-task-run", finished).await;
    assert!(deleted_within(&ns, "bound-by-task-build-workspace", 15).await);
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(&metrics, "workspace_gc_cached_objects", "kind=\"taskruns\""),
        2.0,
        "{metrics}"
    );
    daemon.stop().await;
}

/// A cluster without the TaskRun CRD still works and becomes ready; a CRD installed later is
/// picked up by the watch's next retry, and its runs protect what they bind.
///
/// Run statuses written by hand: the test deletes and re-installs the TaskRun CRD, which real
/// Tekton's controller would need to run.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_without_the_task_run_crd_works_and_picks_it_up_later() {
    let cp = ControlPlane::start(true);
    let client = cp.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("taskruns.tekton.dev").await.expect("the test CRD");
    crds.delete("taskruns.tekton.dev", &DeleteParams::default())
        .await
        .expect("delete the TaskRun CRD");
    assert!(
        wait_until(secs(30), || async {
            crds.get_opt("taskruns.tekton.dev")
                .await
                .ok()
                .flatten()
                .is_none()
        })
        .await
    );
    let ns = TestNamespace::new(&cp, "no-crd").await;
    let config = config_for(&[&ns]);
    ClaimBuilder::build_workspace("orphan-build-workspace")
        .create(&ns)
        .await;
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "no-crd").await;
    assert!(
        deleted_within(&ns, "orphan-build-workspace", 10).await,
        "without the CRD the daemon is ready and collects"
    );

    let mut crd = crd;
    crd.metadata = kube::api::ObjectMeta {
        name: crd.metadata.name.clone(),
        ..Default::default()
    };
    crd.status = None;
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("install the TaskRun CRD again");
    let task_runs: Api<DynamicObject> = ns.dynamic_api(&task_run_resource());
    assert!(
        wait_until(secs(30), || async {
            task_runs.list(&Default::default()).await.is_ok()
        })
        .await,
        "the CRD is served"
    );
    PipelineRunBuilder::task_run("late-task-run")
        .workspace_claim("late-build-workspace")
        .running()
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(60), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_cached_objects",
                "kind=\"taskruns\"",
            ) == 1.0
        })
        .await,
        "the TaskRun watch picks the CRD up"
    );
    let since = reconciled(&daemon).await;
    ClaimBuilder::build_workspace("late-build-workspace")
        .create(&ns)
        .await;
    let running = ("keep", "owner-running", 1.0);
    survives(&daemon, &ns, "late-build-workspace", since, running).await;
    daemon.stop().await;
}

/// The daemon's watches go silent without an error while new requests still work. A
/// PipelineRun and a TaskRun that start binding orphaned claims never reach the cache; the
/// live re-check before each delete must find them anyway.
///
/// Run statuses written by hand: runs that keep their claims while running, without pods (real
/// Tekton's pods would protect the claims by themselves).
#[tokio::test(flavor = "multi_thread")]
async fn the_live_recheck_finds_runs_the_stalled_watch_missed() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "live-runs").await;
    let proxy = Proxy::start(cp.api_address()).await;
    let mut config = config_for(&[&ns]);
    config.policy.orphan_grace = secs(8);
    for claim in [
        "by-pipeline-run-build-workspace",
        "by-task-run-build-workspace",
    ] {
        ClaimBuilder::build_workspace(claim).create(&ns).await;
    }
    let daemon = Daemon::start(
        ns.daemon_client_via(&config, &proxy.url()).await,
        config,
        "live-runs",
    )
    .await;
    proxy.stall();
    PipelineRunBuilder::new("late-run")
        .workspace_claim("by-pipeline-run-build-workspace")
        .running()
        .create(&ns)
        .await;
    PipelineRunBuilder::task_run("late-task")
        .workspace_claim("by-task-run-build-workspace")
        .running()
        .create(&ns)
        .await;
    // The witness: past the grace, the cache still blind, the live re-check before each delete
    // found the claim's run and called the delete off.
    assert!(
        wait_until(secs(30), || async {
            let metrics = daemon.metrics().await;
            metric(
                &metrics,
                "workspace_gc_reconcile_retries_total",
                "category=\"live-disagrees\"",
            ) >= 2.0
        })
        .await,
        "the live re-checks found both runs: {}",
        daemon.metrics().await
    );
    assert!(claim_exists(&ns, "by-pipeline-run-build-workspace").await);
    assert!(claim_exists(&ns, "by-task-run-build-workspace").await);
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(&metrics, "workspace_gc_cached_objects", "kind=\"runs\"")
            + metric(&metrics, "workspace_gc_cached_objects", "kind=\"taskruns\""),
        0.0,
        "the stalled watches delivered no run: {metrics}"
    );
    proxy.unstall();
    daemon.stop().await;
}

/// Exclusions from the file, the environment and the flags form one union: an override can
/// add a namespace to exclude, never make an excluded one collectable. An empty variable
/// clears nothing.
#[tokio::test(flavor = "multi_thread")]
async fn exclusions_add_up_across_file_environment_and_flags() {
    let cp = ControlPlane::shared();
    let in_file = TestNamespace::new(cp, "excl-file").await;
    let by_flag = TestNamespace::new(cp, "excl-flag").await;
    let open = TestNamespace::new(cp, "excl-open").await;
    // Cluster-wide, so the exclusions decide; a label unique to this test keeps other tests'
    // claims out of its reach.
    let mark = format!("safety-test={}", open.name());
    let file = format!(
        "[selector]\nlabel_selector = \"mlops.redhat.com/build-workspace=true,{mark}\"\n\
         exclude_namespaces = [\"{}\"]\n[policy]\norphan_grace = \"1s\"\n\
         [leader_election]\nenabled = false\n",
        in_file.name()
    );
    let env = [(
        "WORKSPACE_GC_SELECTOR_EXCLUDE_NAMESPACES".to_owned(),
        String::new(),
    )];
    let overrides = Overrides {
        exclude_namespaces: Some(vec![by_flag.name().to_owned()]),
        ..Overrides::default()
    };
    let config = Config::parse(
        Some((std::path::Path::new("test.toml"), &file)),
        env,
        &overrides,
    )
    .expect("a valid configuration");
    let (key, value) = mark.split_once('=').unwrap();
    for ns in [&in_file, &by_flag, &open] {
        ClaimBuilder::build_workspace("orphan-build-workspace")
            .label(key, value)
            .create(ns)
            .await;
    }
    let daemon = Daemon::start(open.daemon_client(&config).await, config, "exclusions").await;
    assert!(
        deleted_within(&open, "orphan-build-workspace", 10).await,
        "the namespace nobody excluded is collected"
    );
    // The witness: every claim the daemon read is dealt with, none left in its cache to decide
    // (had an excluded one been read, it would be there, due, or deleted).
    assert!(
        wait_until(secs(10), || async {
            let metrics = daemon.metrics().await;
            metric(&metrics, "workspace_gc_cached_objects", "kind=\"claims\"") == 0.0
                && metric_sum(&metrics, "workspace_gc_deletions_total") >= 1.0
        })
        .await,
        "the daemon's cache holds no claim left: {}",
        daemon.metrics().await
    );
    for ns in [&in_file, &by_flag] {
        assert!(
            claim_exists(ns, "orphan-build-workspace").await,
            "{} is excluded",
            ns.name()
        );
    }
    daemon.stop().await;
}

/// When a `ttl` annotation reaches past `max_age`, `max_age` wins: the audit reports the
/// instant the verdict really changes, and the daemon deletes then.
///
/// Run statuses written by hand: a run finished a minute ago, at a precise instant the asserted
/// recheck time follows from.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_reports_the_earliest_change() {
    let ns = TestNamespace::new(ControlPlane::shared(), "audit-time").await;
    let mut config = config_for(&[&ns]);
    config.policy.max_age = secs(6);
    let done = Utc::now() - chrono::Duration::minutes(1);
    JobBuilder::new("long")
        .phase("Succeeded")
        .completed_at(done)
        .create(&ns)
        .await;
    PipelineRunBuilder::for_job("long")
        .succeeded_at(done)
        .create(&ns)
        .await;
    let claim: PersistentVolumeClaim = ClaimBuilder::build_workspace("long-build-workspace")
        .annotation(annotations::TTL, "30d")
        .create(&ns)
        .await;
    let created = workspace_gc::cluster::resources::to_chrono(
        claim.metadata.creation_timestamp.as_ref().expect("created"),
    );
    let rows = audit(ns.client(), &config).await;
    let row = &rows[0];
    assert_eq!(row.decision.verdict.reason(), Reason::WithinTtl);
    assert_eq!(
        row.decision.verdict.recheck_at(),
        Some(created + chrono::Duration::seconds(6)),
        "max_age comes before the TTL"
    );
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "audit-time").await;
    assert!(deleted_within(&ns, "long-build-workspace", 15).await);
    daemon.stop().await;
}

// --- OpenShift Pipelines' pruner --------------------------------------------------------------

/// The build of job `job` as Tekton leaves it, finished at `at`: the PipelineRun `{job}-build`
/// binding the claim, the TaskRun it owns binding it too, and the TaskRun's pod (`Succeeded`)
/// mounting it, owned by the TaskRun. The owner references are what lets the garbage collector
/// take the TaskRun and pod once the pruner deletes the run.
async fn tekton_build(ns: &TestNamespace, job: &str, at: DateTime<Utc>) {
    let claim = format!("{job}-build-workspace");
    let run = PipelineRunBuilder::for_job(job)
        .succeeded_at(at)
        .create(ns)
        .await;
    let task_run = PipelineRunBuilder::task_run(&format!("{job}-build-buildah"))
        .workspace_claim(&claim)
        .succeeded_at(at)
        .create(ns)
        .await;
    set_owner(ns, &task_run_resource(), &task_run, &run).await;
    let pod = PodBuilder::new(&format!("{job}-build-buildah-pod"))
        .mounting(&claim)
        .phase("Succeeded")
        .create(ns)
        .await;
    let pod = ns
        .dynamic_api(&pod_resource())
        .get(pod.metadata.name.as_deref().unwrap())
        .await
        .expect("read the pod");
    set_owner(ns, &pod_resource(), &pod, &task_run).await;
}

fn pod_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&())
}

/// Makes `owner` the controlling owner of `object` (of `resource`), as Tekton sets it.
async fn set_owner(
    ns: &TestNamespace,
    resource: &kube::api::ApiResource,
    object: &DynamicObject,
    owner: &DynamicObject,
) {
    let types = owner.types.as_ref().expect("the owner's kind");
    let reference = json!({
        "apiVersion": types.api_version,
        "kind": types.kind,
        "name": owner.metadata.name,
        "uid": owner.metadata.uid,
        "controller": true,
    });
    let name = object.metadata.name.as_deref().unwrap();
    ns.dynamic_api(resource)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "ownerReferences": [reference] } })),
        )
        .await
        .unwrap_or_else(|e| panic!("set the owner of {name}: {e}"));
}

/// What OpenShift Pipelines' pruner does to a build (`tkn pipelinerun delete --keep`): deletes
/// its PipelineRun; the garbage collector then deletes the TaskRun and the pod. Returns once
/// all three are gone.
async fn prune(ns: &TestNamespace, job: &str) {
    let run = format!("{job}-build");
    ns.dynamic_api(&testkit::pipeline_run_resource())
        .delete(&run, &DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("prune {run}: {e}"));
    let task_run = format!("{run}-buildah");
    let pod = format!("{run}-buildah-pod");
    let gone = || async {
        let absent = |resource: kube::api::ApiResource, name: String| async move {
            ns.dynamic_api(&resource)
                .get_opt(&name)
                .await
                .expect("read")
                .is_none()
        };
        absent(testkit::pipeline_run_resource(), run.clone()).await
            && absent(task_run_resource(), task_run.clone()).await
            && absent(pod_resource(), pod.clone()).await
    };
    assert!(
        wait_until(secs(60), gone).await,
        "the garbage collector deletes {run}'s TaskRun and pod"
    );
}

/// The pruner deletes a build's runs while its job still validates the notebook: the job
/// still links the claim (naming convention), so it is kept while the job runs, and the TTL
/// then runs from the job's completion, not from the pruned run's.
///
/// Run statuses written by hand: a run finished two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn runs_pruned_while_the_job_validates_leave_the_claim_to_the_job() {
    let ns = TestNamespace::new(ControlPlane::shared(), "pruned-validating").await;
    let config = config_for(&[&ns]);
    let built = hours_ago(2);
    JobBuilder::new("nb")
        .phase("ValidationRunning")
        .tekton_build("Complete", Some(built))
        .create(&ns)
        .await;
    tekton_build(&ns, "nb", built).await;
    ClaimBuilder::for_job("nb").create(&ns).await;
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "pruned-validating",
    )
    .await;

    let since = reconciled(&daemon).await;
    prune(&ns, "nb").await;
    let running = ("keep", "owner-running", 1.0);
    survives(&daemon, &ns, "nb-build-workspace", since, running).await;
    assert_eq!(
        verdict(&ns, &config, "nb-build-workspace").await,
        (VerdictState::Keep, Reason::OwnerRunning),
        "the validating job keeps its claim, its runs pruned"
    );

    // The job finishes now: its TTL starts now, though its run finished two hours ago.
    let job = testkit::notebook_validation_job_resource();
    let done = json!({"phase": "Succeeded", "completionTime": rfc3339(Utc::now())});
    let since = reconciled(&daemon).await;
    patch_status(&ns, &job, "nb", done).await;
    let within = ("keep", "within-ttl", 1.0);
    survives(&daemon, &ns, "nb-build-workspace", since, within).await;
    assert_eq!(
        verdict(&ns, &config, "nb-build-workspace").await,
        (VerdictState::Keep, Reason::WithinTtl)
    );
    // As if the TTL had passed since: the claim goes.
    let long_done = json!({"completionTime": rfc3339(hours_ago(2))});
    patch_status(&ns, &job, "nb", long_done).await;
    assert!(deleted_within(&ns, "nb-build-workspace", 15).await);
    daemon.stop().await;
}

/// The pruner deletes the runs of jobs that finished: a claim whose job finished within the
/// TTL stays until the TTL after the job's completion; one past it goes, as it would have with
/// its runs.
///
/// Run statuses written by hand: runs finished 10 minutes and two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn runs_pruned_after_the_job_finished_keep_the_ttl_of_the_job() {
    let ns = TestNamespace::new(ControlPlane::shared(), "pruned-finished").await;
    let config = config_for(&[&ns]);
    for (job, finished) in [
        ("recent", Utc::now() - chrono::Duration::minutes(10)),
        ("old", hours_ago(2)),
    ] {
        JobBuilder::new(job)
            .phase("Succeeded")
            .completed_at(finished)
            .tekton_build("Complete", Some(finished))
            .create(&ns)
            .await;
        tekton_build(&ns, job, finished).await;
        ClaimBuilder::for_job(job).create(&ns).await;
    }
    // One pruned while workspace-gc was down, one while it runs.
    prune(&ns, "old").await;
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "pruned-finished",
    )
    .await;
    let within = ("keep", "within-ttl", 1.0);
    survives(&daemon, &ns, "recent-build-workspace", 0.0, within).await;
    let since = reconciled(&daemon).await;
    prune(&ns, "recent").await;
    assert!(
        deleted_within(&ns, "old-build-workspace", 15).await,
        "the job finished past its TTL: its claim goes"
    );
    survives(&daemon, &ns, "recent-build-workspace", since, within).await;
    assert_eq!(
        verdict(&ns, &config, "recent-build-workspace").await,
        (VerdictState::Keep, Reason::WithinTtl),
        "within the TTL of the job's completion, runs pruned or not"
    );
    daemon.stop().await;
}

/// The job is deleted first (its run still links the claim, within its TTL), then the pruner
/// deletes the run: with no owner left the claim is an orphan, deleted after the grace.
///
/// Run statuses written by hand: a run finished 10 minutes ago, within the TTL for the whole test.
#[tokio::test(flavor = "multi_thread")]
async fn runs_pruned_after_the_job_is_gone_leave_an_orphan() {
    let ns = TestNamespace::new(ControlPlane::shared(), "pruned-gone").await;
    let config = config_for(&[&ns]);
    let finished = Utc::now() - chrono::Duration::minutes(10);
    JobBuilder::new("gone")
        .phase("Succeeded")
        .completed_at(finished)
        .create(&ns)
        .await;
    tekton_build(&ns, "gone", finished).await;
    ClaimBuilder::for_job("gone").create(&ns).await;
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "pruned-gone",
    )
    .await;
    let within = ("keep", "within-ttl", 1.0);
    survives(&daemon, &ns, "gone-build-workspace", 0.0, within).await;
    let since = reconciled(&daemon).await;
    ns.dynamic_api(&testkit::notebook_validation_job_resource())
        .delete("gone", &DeleteParams::background())
        .await
        .expect("delete the job");
    survives(&daemon, &ns, "gone-build-workspace", since, within).await;
    assert_eq!(
        verdict(&ns, &config, "gone-build-workspace").await,
        (VerdictState::Keep, Reason::WithinTtl),
        "the run, finished within its TTL, still links the claim"
    );

    prune(&ns, "gone").await;
    assert!(
        deleted_within(&ns, "gone-build-workspace", 15).await,
        "no owner is left: an orphan past its grace"
    );
    assert_eq!(
        metric(
            &daemon.metrics().await,
            "workspace_gc_deletions_total",
            &format!(
                "claim_namespace=\"{}\",reason=\"orphaned\",result=\"deleted\"",
                ns.name()
            ),
        ),
        1.0
    );
    daemon.stop().await;
}

/// Waits until the daemon's gauge counts `count` claims of `ns` in `state` for `reason`: a
/// positive witness that it decided them so.
async fn counted(
    daemon: &Daemon,
    ns: &TestNamespace,
    state: &str,
    reason: &str,
    count: f64,
) -> bool {
    let labels = format!(
        "claim_namespace=\"{}\",state=\"{state}\",reason=\"{reason}\"",
        ns.name()
    );
    wait_until(secs(15), || async {
        metric(&daemon.metrics().await, "workspace_gc_claims", &labels) == count
    })
    .await
}

/// Job `b` names job `a`'s workspace in its own `spec.podConfig.volumes` (the operator's webhook
/// reserves only volume names): while `b` has not finished, `a`'s claim is kept whatever `a`'s
/// TTL says, and once `b` finishes it goes. A job whose volumes cannot be read keeps every
/// claim of its namespace while it runs.
///
/// Job statuses written by hand: jobs finished two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_names_a_claim_in_its_volumes_keeps_it_until_it_finishes() {
    let ns = TestNamespace::new(ControlPlane::shared(), "job-volumes").await;
    let odd = TestNamespace::new(ControlPlane::shared(), "job-volumes-odd").await;
    let config = config_for(&[&ns, &odd]);
    let long_ago = hours_ago(2);
    for (ns, job) in [(&ns, "a"), (&ns, "witness"), (&odd, "c")] {
        JobBuilder::new(job)
            .phase("Succeeded")
            .completed_at(long_ago)
            .create(ns)
            .await;
        ClaimBuilder::for_job(job).create(ns).await;
    }
    JobBuilder::new("b")
        .phase("Building")
        .volume_claims(&["a-build-workspace"])
        .create(&ns)
        .await;
    JobBuilder::new("odd")
        .phase("ValidationRunning")
        .pod_config(
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": 7}}]}),
        )
        .create(&odd)
        .await;
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "job-volumes",
    )
    .await;

    assert!(
        deleted_within(&ns, "witness-build-workspace", 15).await,
        "a claim past its TTL that no job names goes"
    );
    assert!(
        counted(&daemon, &ns, "protected", "referenced-by-job", 1.0).await,
        "the daemon decided a's claim: {}",
        daemon.metrics().await
    );
    assert!(
        claim_exists(&ns, "a-build-workspace").await,
        "job b names a's workspace in its volumes and has not finished, yet it was deleted"
    );
    assert!(
        counted(&daemon, &odd, "keep", "users-unknown", 1.0).await,
        "a running job whose volumes cannot be read keeps its namespace's claims"
    );
    assert!(claim_exists(&odd, "c-build-workspace").await);

    // b finishes: its volumes hold nothing any more.
    let job = testkit::notebook_validation_job_resource();
    let done = json!({"phase": "Succeeded", "completionTime": rfc3339(Utc::now())});
    patch_status(&ns, &job, "b", done.clone()).await;
    assert!(
        deleted_within(&ns, "a-build-workspace", 15).await,
        "once b finished, a's TTL decides"
    );
    patch_status(&odd, &job, "odd", done).await;
    assert!(deleted_within(&odd, "c-build-workspace", 15).await);
    daemon.stop().await;
}

/// Kubernetes 1.37 writes an `Unused` condition on claims (KEP-5541). Where it says `False`
/// (in use), the claim is kept, whatever the daemon's own view of pods; `True` changes
/// nothing. Written by hand through the status subresource on unbound claims, which the
/// PVC-protection controller leaves alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_the_server_reports_in_use_is_kept() {
    let ns = TestNamespace::new(ControlPlane::shared(), "unused-false").await;
    let config = config_for(&[&ns]);
    for (claim, status) in [
        ("in-use-build-workspace", "False"),
        ("unused-build-workspace", "True"),
    ] {
        ClaimBuilder::build_workspace(claim).create(&ns).await;
        let conditions = json!({"conditions": [{"type": "Unused", "status": status}]});
        let claims = kube::api::ApiResource::erase::<PersistentVolumeClaim>(&());
        patch_status(&ns, &claims, claim, conditions).await;
    }
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "unused-false",
    )
    .await;
    assert!(
        deleted_within(&ns, "unused-build-workspace", 15).await,
        "an orphan reported unused goes"
    );
    assert!(
        counted(&daemon, &ns, "protected", "in-use", 1.0).await,
        "the daemon decided the claim reported in use: {}",
        daemon.metrics().await
    );
    assert!(
        claim_exists(&ns, "in-use-build-workspace").await,
        "its Unused condition is False, yet it was deleted"
    );
    daemon.stop().await;
}

/// A finished PipelineRun held in Terminating by a finalizer (Tekton Results adds one) is
/// still a finished run: the claim it links is kept within its TTL from the run's completion,
/// not deleted as if its owner were gone, and goes once the TTL has passed.
///
/// Run statuses written by hand: a run finished 10 minutes ago, then two hours ago.
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_run_held_by_a_finalizer_keeps_its_ttl() {
    let ns = TestNamespace::new(ControlPlane::shared(), "terminating-run").await;
    let config = config_for(&[&ns]);
    let finished = Utc::now() - chrono::Duration::minutes(10);
    let runs = ns.dynamic_api(&testkit::pipeline_run_resource());
    for job in ["held", "witness"] {
        PipelineRunBuilder::for_job(job)
            .succeeded_at(finished)
            .create(&ns)
            .await;
        ClaimBuilder::for_job(job).create(&ns).await;
    }
    let finalizer = json!({"metadata": {"finalizers": ["results.tekton.dev/pipelinerun"]}});
    runs.patch(
        "held-build",
        &PatchParams::default(),
        &Patch::Merge(&finalizer),
    )
    .await
    .expect("add the finalizer");
    let daemon = Daemon::start(
        ns.daemon_client(&config.clone()).await,
        config.clone(),
        "terminating-run",
    )
    .await;
    assert!(counted(&daemon, &ns, "keep", "within-ttl", 2.0).await);

    // Deleted: `held-build` stays, Terminating; `witness-build` is gone after it (one watch,
    // in order), and its claim with it, an orphan.
    for run in ["held-build", "witness-build"] {
        runs.delete(run, &DeleteParams::background())
            .await
            .unwrap_or_else(|e| panic!("delete {run}: {e}"));
    }
    let held = runs.get("held-build").await.expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        deleted_within(&ns, "witness-build-workspace", 15).await,
        "the claim of a run that is gone goes"
    );
    assert!(
        counted(&daemon, &ns, "keep", "within-ttl", 1.0).await,
        "{}",
        daemon.metrics().await
    );
    assert!(
        claim_exists(&ns, "held-build-workspace").await,
        "a Terminating run that finished within its TTL still links its claim"
    );
    assert_eq!(
        verdict(&ns, &config, "held-build-workspace").await,
        (VerdictState::Keep, Reason::WithinTtl)
    );

    // Its TTL passes (as if it had finished two hours ago): the claim goes, by TTL.
    patch_status(
        &ns,
        &testkit::pipeline_run_resource(),
        "held-build",
        json!({"completionTime": rfc3339(hours_ago(2))}),
    )
    .await;
    assert!(deleted_within(&ns, "held-build-workspace", 15).await);
    let deleted = format!(
        "claim_namespace=\"{}\",reason=\"ttl-expired\",result=\"deleted\"",
        ns.name()
    );
    assert_eq!(
        metric(
            &daemon.metrics().await,
            "workspace_gc_deletions_total",
            &deleted
        ),
        1.0
    );
    let release = json!({"metadata": {"finalizers": null}});
    runs.patch(
        "held-build",
        &PatchParams::default(),
        &Patch::Merge(&release),
    )
    .await
    .expect("release the run");
    daemon.stop().await;
}
