//! Claims due at a set moment, where a claim stands, and the events about it: shared by the
//! tests that break something around deadlines (tests/faults.rs, tests/leadership.rs).

use chrono::{DateTime, SubsecRound, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use workspace_gc::contract::annotations;

use super::graph::rfc3339;
use super::{ClaimBuilder, TestNamespace};

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
