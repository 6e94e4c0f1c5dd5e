//! Claims due at a set moment, where a claim stands, and the events about it: shared by the
//! tests that break something around deadlines (tests/cluster/faults.rs, tests/cluster/leadership.rs).

use chrono::{DateTime, SubsecRound, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use workspace_gc::contract::annotations;

use super::graph::rfc3339;
use super::{ClaimBuilder, Proxy, RuleId, TestNamespace, wait_until};

/// Whole seconds from now, as the `expires` annotation states deadlines.
pub fn in_secs(n: i64) -> DateTime<Utc> {
    (Utc::now() + chrono::Duration::seconds(n)).trunc_subsecs(0)
}

/// A build-workspace claim due at `at` through the `expires` annotation: a per-claim deadline,
/// so one test can have claims due before, during and after a fault.
pub fn expiring(name: &str, at: DateTime<Utc>) -> ClaimBuilder {
    ClaimBuilder::build_workspace(name).annotation(annotations::EXPIRES, &rfc3339(at))
}

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Live,
    /// Deleted, held by the `pvc-protection` finalizer; the time is its `deletionTimestamp`.
    Terminating(DateTime<Utc>),
    Gone,
}

pub async fn fate(ns: &TestNamespace, name: &str) -> Fate {
    let claim = ns
        .api::<PersistentVolumeClaim>()
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get claim {name}: {e}"));
    match claim {
        None => Fate::Gone,
        Some(claim) => match claim.metadata.deletion_timestamp {
            Some(at) => Fate::Terminating(workspace_gc::cluster::resources::to_chrono(&at)),
            None => Fate::Live,
        },
    }
}

/// The events about claim `claim` with reason `reason`.
pub async fn events(ns: &TestNamespace, claim: &str, reason: &str) -> Vec<Event> {
    ns.api::<Event>()
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

pub async fn deleted_events(ns: &TestNamespace, claim: &str) -> Vec<Event> {
    events(ns, claim, "Deleted").await
}

/// Whether claim `name` carries the revocation annotation: the daemon changed it after a
/// DELETE of it got no definite answer.
pub async fn revoked(ns: &TestNamespace, name: &str) -> bool {
    ns.api::<PersistentVolumeClaim>()
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get claim {name}: {e}"))
        .and_then(|claim| claim.metadata.annotations)
        .is_some_and(|notes| {
            notes.contains_key(annotations::REVOKED)
                || notes.contains_key(annotations::REVOKED_UNDER_PREFIX)
        })
}

/// Lets the one DELETE of claim `name` that rule `held` holds go on to the API server (the
/// client gave up on it long ago), and checks what it did: nothing. The claim must live, and
/// the server must have refused the DELETE by its precondition (409). `logs` is shown when not.
pub async fn forward_held_delete(
    proxy: &Proxy,
    held: RuleId,
    ns: &TestNamespace,
    name: &str,
    logs: impl Fn() -> String,
) {
    proxy.remove(held);
    assert!(
        wait_until(std::time::Duration::from_secs(15), || async {
            proxy.forwarded().len() == 1
        })
        .await,
        "the hop forwarded the held DELETE"
    );
    let status = proxy.forwarded()[0].status;
    assert_eq!(
        fate(ns, name).await,
        Fate::Live,
        "the late DELETE (answered {status}) must not take the claim a build now uses:\n{}",
        logs()
    );
    assert_eq!(status, 409, "refused by its precondition");
}
