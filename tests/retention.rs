//! The retention policies against a real kube-apiserver and etcd: failed builds kept longer.
//! The daemon runs in-process (`controller::run`) with a configuration scoped to each test's
//! namespace.

mod support;

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use support::{
    ClaimBuilder, ControlPlane, Daemon, JobBuilder, PipelineRunBuilder, TestNamespace,
    claim_exists, finished_build, wait_until,
};

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
    let daemon = Daemon::start(ns.client().clone(), config, "failed").await;

    assert!(
        wait_until(secs(10), || async {
            !claim_exists(&ns, "ok-build-workspace").await
        })
        .await,
        "the succeeded build's workspace goes at once"
    );
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
