//! The check: every claim DELETE in the API server's audit log against the ground truth. Wrong
//! deletions (a claim not due, or protected, at that moment), repeated ones, missed ones (due
//! for [`BOUND`] and still there), the cap over any rolling [`WINDOW`], claims that went away
//! without a DELETE in the log, and the audit-log invariant ([`DeleteInvariant`]).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::world::{Incarnation, World};
use crate::{BOUND, CAP, LEASE_DURATION, LEASE_NAME, LEASE_NAMESPACE, RECHECK_BOUND, WINDOW};
use crate::{daemon_users, seconds};
use testkit::{AuditEvent, DeleteInvariant, Violation, invariant_audit_rules};

/// Every claim delete with its preconditions, and what the invariant reads besides.
pub fn audit_policy_yaml() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
{}  - level: None
",
        invariant_audit_rules(&daemon_users())
    )
}

/// What the check found.
pub struct Verdict {
    /// Events in the audit log, and claim DELETEs among them, by anyone.
    pub audit_events: usize,
    pub claim_deletes: usize,
    /// DELETE attempts of the daemon that the fault proxies refused.
    pub refused_deletes: usize,
    /// Successful daemon deletes of a claim that was not deletable then.
    pub wrong: Vec<String>,
    /// Claims the daemon deleted more than once.
    pub twice: usize,
    /// Claims deletable for longer than their allowance (`allowance`) and still there.
    pub missed: Vec<String>,
    /// Claims that went away without a successful DELETE in the audit log.
    pub unaudited: Vec<String>,
    /// Deletes decided while a change was in flight (legitimate either way).
    pub ambiguous: usize,
    /// Still there at the end: deletable but within their allowance, and kept.
    pub pending: usize,
    pub still_kept: usize,
    /// Seconds from deletable to deleted, sorted.
    pub lags: Vec<f64>,
    /// Daemon deletes answered 409, 404 and otherwise, and those that named no known claim.
    pub conflicts: usize,
    pub not_found: usize,
    pub other_codes: usize,
    pub unmapped: usize,
    /// Successful deletes by the garbage collector (kube-controller-manager).
    pub by_gc: usize,
    /// Successful daemon deletes, and the most of them in any rolling [`WINDOW`].
    pub daemon_deletes: u32,
    pub busiest: usize,
    pub invariant: DeleteInvariant,
    pub violations: Vec<Violation>,
}

impl Verdict {
    pub fn cap_exceeded(&self) -> bool {
        self.busiest > CAP as usize
    }

    /// An audit log without one successful delete by the daemon cannot have checked anything.
    pub fn audit_empty(&self) -> bool {
        self.daemon_deletes == 0
    }

    /// Whether the run failed, given the daemon's crashes.
    pub fn failed(&self, crashes: u32) -> bool {
        !self.wrong.is_empty()
            || self.twice > 0
            || !self.missed.is_empty()
            || self.cap_exceeded()
            || crashes > 0
            || self.audit_empty()
            || !self.unaudited.is_empty()
            || !self.violations.is_empty()
    }
}

/// Checks the audit log's `events` (and the `refused` attempts that never reached the API
/// server) against the ground truth as of `checked_at`.
pub fn judge(
    events: &[AuditEvent],
    refused: &[AuditEvent],
    world: &World,
    checked_at: DateTime<Utc>,
) -> Verdict {
    let users = daemon_users();
    let audited: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.verb == "delete" && e.resource == "persistentvolumeclaims")
        .collect();
    let by_uid: HashMap<&str, &Incarnation> = world
        .incarnations
        .iter()
        .map(|i| (i.uid.as_str(), i))
        .collect();
    let mut wrong = Vec::new();
    let mut ambiguous = 0;
    let mut daemon_deleted: HashMap<&str, u32> = HashMap::new();
    let mut lags = Vec::new();
    // Each deletable stretch that ended in the daemon's delete, or lasts to the end: who
    // stood in the cap's line, and when.
    let mut waited: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)> = Vec::new();
    let (mut conflicts, mut not_found, mut other_codes) = (0, 0, 0);
    let mut by_gc = 0;
    let mut unmapped = 0;
    for delete in &audited {
        if !users.contains(&delete.user) {
            if delete.user.contains("kube-controller-manager") && (200..300).contains(&delete.code)
            {
                by_gc += 1;
            }
            continue;
        }
        match delete.code {
            200..=299 => {}
            409 => {
                conflicts += 1;
                continue;
            }
            404 => {
                not_found += 1;
                continue;
            }
            _ => {
                other_codes += 1;
                continue;
            }
        }
        let Some(inc) = delete.uid.as_deref().and_then(|uid| by_uid.get(uid)) else {
            unmapped += 1;
            eprintln!(
                "soak: a delete of {}/{} names no known claim",
                delete.namespace, delete.name
            );
            continue;
        };
        *daemon_deleted.entry(inc.uid.as_str()).or_default() += 1;
        if inc.tainted {
            continue;
        }
        let states = inc.states_at(delete.at);
        let legit = states.iter().any(|s| inc.deletable(&s.state, delete.at));
        if !legit {
            // The whole bracketed history, so that a race with the driver can be told from a
            // decision made on stale facts.
            let history: String = inc
                .history
                .iter()
                .map(|s| format!("\n    [{} .. {}] {:?}", s.before, s.after, s.state))
                .collect();
            wrong.push(format!(
                "{}/{} (uid {}, created {}) deleted: received {}, completed {}; history:{history}",
                inc.namespace, inc.name, inc.uid, inc.created, delete.at, delete.completed
            ));
        } else if !states
            .last()
            .is_some_and(|s| inc.deletable(&s.state, delete.at))
        {
            ambiguous += 1;
        }
        if let Some(since) = inc.deletable_since(delete.at) {
            lags.push((delete.at - since).as_seconds_f64());
            waited.push((since, Some(delete.at)));
        }
    }
    // The cap: successful daemon deletes in any rolling window, by the API server's clock.
    let mut sent: Vec<DateTime<Utc>> = audited
        .iter()
        .filter(|d| users.contains(&d.user) && d.succeeded())
        .map(|d| d.at)
        .collect();
    sent.sort();
    let busiest = (0..sent.len())
        .map(|i| {
            sent[i..]
                .iter()
                .take_while(|t| **t < sent[i] + seconds(WINDOW))
                .count()
        })
        .max()
        .unwrap_or(0);
    let twice: Vec<&&str> = daemon_deleted
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(u, _)| u)
        .collect();

    let mut missed = Vec::new();
    let mut pending = 0;
    let mut still_kept = 0;
    let left: Vec<(&Incarnation, Option<DateTime<Utc>>)> = (world.incarnations.iter())
        .filter(|inc| !inc.gone && !inc.driver_deleted && !inc.tainted)
        .map(|inc| (inc, inc.deletable_since(checked_at)))
        .collect();
    waited.extend(
        left.iter()
            .filter_map(|(_, since)| since.map(|s| (s, None))),
    );
    for (inc, since) in left {
        let Some(since) = since else {
            still_kept += 1;
            continue;
        };
        let allowed = allowance(&waited, since);
        if (checked_at - since).num_seconds() >= allowed {
            missed.push(format!(
                "{}/{} (uid {}) deletable since {since}, still there at {checked_at} (allowed {allowed} s)",
                inc.namespace, inc.name, inc.uid
            ));
        } else {
            pending += 1;
        }
    }

    // The audit log must account for every claim that went away: a log that recorded nothing,
    // or lost part of the run, would let every delete, wrong ones included, drop out of the
    // check above.
    let audited_uids: HashSet<&str> = audited
        .iter()
        .filter(|d| d.succeeded())
        .filter_map(|d| d.uid.as_deref())
        .collect();
    let unaudited: Vec<String> = world
        .incarnations
        .iter()
        .filter(|i| i.gone && !i.driver_deleted && !i.tainted)
        .filter(|i| !audited_uids.contains(i.uid.as_str()))
        .map(|i| {
            format!(
                "{}/{} (uid {}) went away without a successful DELETE in the audit log",
                i.namespace, i.name, i.uid
            )
        })
        .collect();
    // Every DELETE the daemon sent: fenced, re-checked, once per decision, counting the
    // attempts the proxies refused (the API server never saw those).
    let invariant = DeleteInvariant {
        bound: RECHECK_BOUND,
        ..DeleteInvariant::new(&users, Some((LEASE_NAMESPACE, LEASE_NAME)), LEASE_DURATION)
    };
    let violations = invariant.check(events, refused);
    lags.sort_by(f64::total_cmp);
    Verdict {
        audit_events: events.len(),
        claim_deletes: audited.len(),
        refused_deletes: refused
            .iter()
            .filter(|e| e.verb == "delete" && e.resource == "persistentvolumeclaims")
            .count(),
        wrong,
        twice: twice.len(),
        missed,
        unaudited,
        ambiguous,
        pending,
        still_kept,
        lags,
        conflicts,
        not_found,
        other_codes,
        unmapped,
        by_gc,
        daemon_deletes: daemon_deleted.values().sum(),
        busiest,
        invariant,
        violations,
    }
}

/// How long a claim deletable since `since` may wait: [`BOUND`], plus the time the cap needs
/// for the claims ahead of it in its line (deletable before it, still there then) at
/// [`CAP`] per [`WINDOW`]. The daemon cannot delete faster than the cap, and gives freed
/// slots to the claim due first; one that falls behind that pace is missed.
fn allowance(waited: &[(DateTime<Utc>, Option<DateTime<Utc>>)], since: DateTime<Utc>) -> i64 {
    let ahead = (waited.iter())
        .filter(|(their_since, removed)| *their_since < since && removed.is_none_or(|r| r > since))
        .count();
    BOUND + i64::try_from(ahead).unwrap_or(i64::MAX / 2) * WINDOW / i64::from(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_may_wait_for_the_caps_pace_through_the_claims_ahead_of_it() {
        let at = |s: i64| DateTime::<Utc>::UNIX_EPOCH + seconds(s);
        let waited = [
            // Ahead of it: deletable before, still there or deleted after it became so.
            (at(0), None),
            (at(5), Some(at(20))),
            // Not ahead: deleted before it became deletable, or deletable after it.
            (at(1), Some(at(9))),
            (at(15), None),
        ];
        let per_claim = WINDOW / i64::from(CAP);
        assert_eq!(allowance(&waited, at(10)), BOUND + 2 * per_claim);
        assert_eq!(allowance(&waited, at(0)), BOUND);
    }
}
