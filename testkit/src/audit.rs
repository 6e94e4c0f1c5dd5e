//! The invariant every claim DELETE of the daemon must meet in the API server's audit log
//! ([`DeleteInvariant`]), read with [`super::audit_log`], and the policy rules it needs.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::audit_log::AuditEvent;
use serde_json::Value;
use workspace_gc::contract::annotations::{self, REVOKED, REVOKED_UNDER_PREFIX};

/// A Lease write that empties the holder (a release on shutdown). Known only where the body is
/// logged; otherwise taken for a renewal.
fn releases(write: &AuditEvent) -> bool {
    let holder = &write.request["spec"]["holderIdentity"];
    write.request["spec"].get("holderIdentity").is_some()
        && (holder.is_null() || holder.as_str() == Some(""))
}

/// The audit policy rules [`DeleteInvariant`] reads, for the `rules:` list of a policy:
/// claim deletes with their preconditions and claim patches with their bodies (revocations),
/// Lease writes with their bodies, and the pod LISTs of `users` (the live re-checks). Put it
/// before a catch-all `- level: None`.
pub fn invariant_audit_rules(users: &[String]) -> String {
    let users = users
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "  - level: Request
    verbs: [delete, deletecollection, patch]
    resources:
      - group: \"\"
        resources: [persistentvolumeclaims]
  - level: Request
    verbs: [create, update, patch]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: Metadata
    users: [{users}]
    verbs: [list]
    resources:
      - group: \"\"
        resources: [pods]
"
    )
}

/// How long a DELETE may rest on a live re-check, unless a test says otherwise.
pub const DEFAULT_RECHECK_BOUND: Duration = Duration::from_secs(10);

/// What every claim DELETE the daemon sent must meet, read from the audit log (the API
/// server's own clock):
///
/// - **preconditioned**: it names the claim's UID and resourceVersion;
/// - if it took effect (answered with success): **fenced** and **re-checked** when it arrived,
///   or else it arrived late (a hop held it after the daemon gave up); one the daemon
///   **revoked** afterwards (a PATCH of the claim by a daemon user carrying the revocation
///   annotation with its resourceVersion) is told apart as **late, landed**
///   ([`ViolationKind::LateLanded`]): the bound that still holds (a DELETE takes effect before
///   the daemon's next answered write for that claim, or not at all), not the promise;
///   - fenced: it was received from the Lease holder (the writer of the last successful Lease
///     write before it, unless that write released the Lease), within `renew_deadline` of
///     that write;
///   - named: the Lease named it in flight then (its UID in the in-flight annotation), so
///     that a next leader could revoke it;
///   - re-checked: a LIST of pods in its namespace, or of the whole cluster, by the same user
///     finished less than `bound` before it (the live re-check: the namespace listed, or the
///     first read of a round that proved the cache fresh, `daemon::proof`);
/// - **not after its revocation**: no DELETE takes effect once a revocation of it was
///   answered with success (the server's precondition check refuses it);
/// - **once per decision**: no two DELETEs name the same UID and resourceVersion, unless the
///   earlier one was not answered with success and a new live re-check started after that
///   answer and finished before the later one. Attempts the fault proxy refused count too.
#[derive(Debug, Clone)]
pub struct DeleteInvariant {
    /// The daemon's usernames: their claim DELETEs are checked.
    pub users: Vec<String>,
    /// The Lease `(namespace, name)`; `None` without leader election (no fence to check).
    pub lease: Option<(String, String)>,
    /// Two thirds of the Lease duration, as the daemon's fence.
    pub renew_deadline: Duration,
    pub bound: Duration,
}

impl DeleteInvariant {
    /// For the daemon running as `users` with the Lease `namespace/name` of `lease_duration`;
    /// the re-check bound is [`DEFAULT_RECHECK_BOUND`].
    pub fn new(users: &[String], lease: Option<(&str, &str)>, lease_duration: Duration) -> Self {
        DeleteInvariant {
            users: users.to_vec(),
            lease: lease.map(|(ns, name)| (ns.to_owned(), name.to_owned())),
            renew_deadline: lease_duration * 2 / 3,
            bound: DEFAULT_RECHECK_BOUND,
        }
    }

    /// Every breach in `audited` (the audit log's events) and `refused` (the fault proxy's
    /// refused attempts, [`super::Faulted::as_audit_event`]: they count only as attempts).
    pub fn check(&self, audited: &[AuditEvent], refused: &[AuditEvent]) -> Vec<Violation> {
        let checked = |e: &&AuditEvent| {
            e.verb == "delete"
                && e.resource == "persistentvolumeclaims"
                && self.users.contains(&e.user)
        };
        let mut deletes: Vec<&AuditEvent> = audited.iter().filter(checked).collect();
        deletes.sort_by_key(|e| e.at);
        let mut writes: Vec<&AuditEvent> = audited
            .iter()
            .filter(|e| {
                self.lease.as_ref().is_some_and(|(ns, name)| {
                    e.resource == "leases" && e.namespace == *ns && e.name == *name
                })
            })
            .filter(|e| matches!(e.verb.as_str(), "create" | "update" | "patch") && e.succeeded())
            .collect();
        writes.sort_by_key(|e| e.at);
        // The daemon's revocations of its DELETEs: (namespace, name, revoked resourceVersion),
        // the version read off the value as it is written (`annotations::revocation`).
        let revocations: Vec<(&AuditEvent, &str)> = audited
            .iter()
            .filter(|e| {
                e.verb == "patch"
                    && e.resource == "persistentvolumeclaims"
                    && self.users.contains(&e.user)
            })
            .filter_map(|e| {
                let written = &e.request["metadata"]["annotations"];
                let version = written[REVOKED].as_str();
                let value = version.or(written[REVOKED_UNDER_PREFIX].as_str())?;
                Some((e, annotations::revoked_version(value)))
            })
            .collect();
        let revocations_of = |delete: &AuditEvent| {
            revocations
                .iter()
                .filter(|(r, rv)| {
                    r.namespace == delete.namespace
                        && r.name == delete.name
                        && Some(*rv) == delete.resource_version.as_deref()
                })
                .map(|(r, _)| *r)
                .collect::<Vec<_>>()
        };
        let rechecks: Vec<&AuditEvent> = audited
            .iter()
            .filter(|e| e.verb == "list" && e.resource == "pods" && e.succeeded())
            .collect();
        // The latest re-check by `user` of `namespace` that finished by `at` and (optionally)
        // started no earlier than `since`.
        let recheck = |user: &str, namespace: &str, at, since: Option<DateTime<Utc>>| {
            rechecks
                .iter()
                .filter(|r| r.user == user && (r.namespace == namespace || r.namespace.is_empty()))
                .filter(|r| r.completed <= at && since.is_none_or(|s| r.at >= s))
                .max_by_key(|r| r.completed)
                .copied()
        };
        let mut violations = Vec::new();
        let mut breach = |kind, delete: &AuditEvent, detail: String| {
            violations.push(Violation {
                kind,
                delete: delete.clone(),
                detail,
            });
        };
        for delete in &deletes {
            if delete.uid.is_none() || delete.resource_version.is_none() {
                breach(
                    ViolationKind::NoPreconditions,
                    delete,
                    format!(
                        "preconditions uid {:?}, resourceVersion {:?}",
                        delete.uid, delete.resource_version
                    ),
                );
            }
            // Refused by the server (its precondition, a guard): it changed nothing.
            if !delete.succeeded() {
                continue;
            }
            let revoked = revocations_of(delete);
            if let Some(r) = revoked
                .iter()
                .find(|r| r.succeeded() && r.completed <= delete.at)
            {
                breach(
                    ViolationKind::AfterRevocation,
                    delete,
                    format!(
                        "took effect after its revocation by {}, answered at {}",
                        r.user, r.completed
                    ),
                );
            }
            // Whether it met the fence and the re-check bound when it arrived.
            let mut late: Vec<(ViolationKind, String)> = Vec::new();
            if self.lease.is_some() {
                // What the server had acknowledged when the DELETE arrived.
                let last = writes.iter().rev().find(|w| w.completed <= delete.at);
                match last {
                    None => late.push((
                        ViolationKind::NotHolder,
                        "no successful Lease write before it".into(),
                    )),
                    Some(w) if w.user != delete.user || releases(w) => late.push((
                        ViolationKind::NotHolder,
                        format!(
                            "the last Lease write before it, at {}, was {} by {}",
                            w.at,
                            if releases(w) { "a release" } else { "a write" },
                            w.user
                        ),
                    )),
                    Some(w) if age(w.at, delete.at) >= self.renew_deadline => late.push((
                        ViolationKind::Unfenced,
                        format!(
                            "{:?} after its last Lease write at {} (renew deadline {:?})",
                            age(w.at, delete.at),
                            w.at,
                            self.renew_deadline
                        ),
                    )),
                    Some(_) => {}
                }
                if !named_in_flight(&writes, delete) {
                    late.push((
                        ViolationKind::NotNamed,
                        "the Lease did not name it in flight when it arrived".into(),
                    ));
                }
            }
            match recheck(&delete.user, &delete.namespace, delete.at, None) {
                Some(r) if age(r.completed, delete.at) < self.bound => {}
                found => late.push((
                    ViolationKind::Unchecked,
                    match found {
                        Some(r) => format!(
                            "its last pod LIST of the namespace finished {:?} before (at {}; bound {:?})",
                            age(r.completed, delete.at),
                            r.completed,
                            self.bound
                        ),
                        None => "no pod LIST of the namespace or the cluster by it before".into(),
                    },
                )),
            }
            // Late, and the daemon's revocation after it found it landed: the bound that holds
            // (taken before the daemon's next answered write), but not the promise the re-check
            // and the fence make. Told apart, never passed: only a hop that holds requests and
            // delivers them in order makes it (RELIABILITY.md, "Never wrong").
            if !late.is_empty() && revoked.iter().any(|r| r.at >= delete.at) {
                let why: Vec<String> = late.drain(..).map(|(_, detail)| detail).collect();
                late.push((
                    ViolationKind::LateLanded,
                    format!(
                        "late and carried out, revoked after it landed: {}",
                        why.join("; ")
                    ),
                ));
            }
            for (kind, detail) in late {
                breach(kind, delete, detail);
            }
        }

        // Once per decision: the attempts on one (uid, resourceVersion), in order.
        let mut decisions: BTreeMap<(Option<&str>, Option<&str>), Vec<&AuditEvent>> =
            BTreeMap::new();
        for attempt in deletes
            .iter()
            .copied()
            .chain(refused.iter().filter(checked))
        {
            if attempt.uid.is_some() {
                decisions
                    .entry((attempt.uid.as_deref(), attempt.resource_version.as_deref()))
                    .or_default()
                    .push(attempt);
            }
        }
        for attempts in decisions.values_mut() {
            attempts.sort_by_key(|e| e.at);
            for pair in attempts.windows(2) {
                let (first, second) = (pair[0], pair[1]);
                let again = recheck(
                    &second.user,
                    &second.namespace,
                    second.at,
                    Some(first.completed),
                );
                if first.succeeded() || again.is_none() {
                    breach(
                        ViolationKind::Twice,
                        second,
                        format!(
                            "the same decision was sent at {} by {} (answered {}){}",
                            first.at,
                            first.user,
                            first.code,
                            if first.succeeded() {
                                ""
                            } else {
                                " and no live re-check started after that answer"
                            }
                        ),
                    );
                }
            }
        }
        violations.sort_by_key(|v| v.delete.at);
        violations
    }
}

/// `later - earlier`, zero if negative.
fn age(earlier: DateTime<Utc>, later: DateTime<Utc>) -> Duration {
    (later - earlier).to_std().unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// Not sent by the Lease holder.
    NotHolder,
    /// Sent by the holder, but later than the renew deadline after its last Lease write.
    Unfenced,
    /// No live re-check of the namespace finished less than the bound before it.
    Unchecked,
    /// Without the UID and resourceVersion preconditions.
    NoPreconditions,
    /// A second DELETE for one decision.
    Twice,
    /// It took effect after the daemon's revocation of it was answered.
    AfterRevocation,
    /// The Lease did not name it in flight when it arrived: a next leader could not revoke it.
    NotNamed,
    /// Late, landed: it arrived past the fence or the re-check bound and was carried out, and
    /// the daemon's revocation only found it landed. No client-side write can stop one that a
    /// hop queues in order ahead of its revocation.
    LateLanded,
}

/// Whether the Lease named `delete`'s UID in flight when it arrived: the in-flight
/// annotation as the last successful write before it that set it (a create or an update
/// sets it, to nothing when absent; a patch when it carries the key) left it.
fn named_in_flight(writes: &[&AuditEvent], delete: &AuditEvent) -> bool {
    let mut named = None;
    for write in writes.iter().filter(|w| w.completed <= delete.at) {
        let annotations = &write.request["metadata"]["annotations"];
        match annotations.get(annotations::DELETES_IN_FLIGHT) {
            Some(value) => named = value.as_str(),
            None if write.verb != "patch" => named = None,
            None => {}
        }
    }
    let Some(uid) = delete.uid.as_deref() else {
        return false;
    };
    named
        .and_then(|text| serde_json::from_str::<Vec<Value>>(text).ok())
        .is_some_and(|deletes| deletes.iter().any(|d| d["uid"].as_str() == Some(uid)))
}

/// One DELETE that breaks the [`DeleteInvariant`], and why.
#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: ViolationKind,
    pub delete: AuditEvent,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.delete;
        write!(
            f,
            "{:?}: DELETE {}/{} (uid {}, resourceVersion {}) by {} received {} answered {}: {}",
            self.kind,
            d.namespace,
            d.name,
            d.uid.as_deref().unwrap_or("-"),
            d.resource_version.as_deref().unwrap_or("-"),
            d.user,
            d.at,
            d.code,
            self.detail
        )
    }
}
