//! Positive witnesses, read from the daemon's metrics, that it looked at what a test then finds
//! unchanged: a negative assertion (a claim not deleted, no event, no request) waits for one
//! first, so that it cannot pass only because the daemon had not got round to the claim yet.

use std::future::Future;
use std::time::Duration;

use super::{metric, wait_until};

/// Reconciles the daemon has finished: the count of `workspace_gc_reconcile_duration_seconds`,
/// observed once per decision, after what the decision did (a delete, an event).
pub fn reconciles(metrics: &str) -> f64 {
    metric(metrics, "workspace_gc_reconcile_duration_seconds_count", "")
}

/// Claims of namespace `ns` whose last verdict is `state` for `reason` (`workspace_gc_claims`).
pub fn decided(metrics: &str, ns: &str, state: &str, reason: &str) -> f64 {
    let labels = format!("claim_namespace=\"{ns}\",state=\"{state}\",reason=\"{reason}\"");
    metric(metrics, "workspace_gc_claims", &labels)
}

/// Waits up to 30 s until the metrics `scrape` reads show `count` claims of `ns` decided
/// `state` for `reason`, and more than `since` reconciles finished: a decision made, and carried
/// out, after the moment `since` was read. With one claim in the daemon's scope, that is the
/// claim's own.
pub async fn decided_since<F, Fut>(
    scrape: F,
    since: f64,
    ns: &str,
    (state, reason, count): (&str, &str, f64),
) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    wait_until(Duration::from_secs(30), || async {
        let text = scrape().await;
        reconciles(&text) > since && decided(&text, ns, state, reason) == count
    })
    .await
}

/// Asserts [`decided_since`]; a failure shows the daemon's metrics.
pub async fn assert_decided<F, Fut>(scrape: F, since: f64, ns: &str, verdict: (&str, &str, f64))
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    assert!(
        decided_since(&scrape, since, ns, verdict).await,
        "no witness: {verdict:?} in {ns} after {since} reconciles:\n{}",
        scrape().await
    );
}
