//! The pure decision: what to do with one claim, from facts, a policy and `now`.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::decide::annotations::{self, ClaimAnnotations};
use crate::decide::facts::{Facts, FailedRank, OwnerState, Progress, Users};
use crate::decide::provenance::{self, ProvenanceRule};

/// Cluster-wide policy; per-claim annotations refine it. Its `Default` is the configuration's
/// (`config::settings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a finished build's workspace is kept after the later completion time of its
    /// PipelineRun and NotebookValidationJob.
    pub ttl_after_finished: Duration,
    /// The same for a failed build (see [`Facts::build_failed`]): its workspace is what someone
    /// opens to find out why.
    pub ttl_after_failed: Duration,
    /// How long a claim with no owner found is kept after its creation: the operator creates the
    /// claim before its PipelineRun.
    pub orphan_grace: Duration,
    /// Absolute age after which a claim is deleted whatever its owners say, unless in use.
    pub max_age: Duration,
    /// Count-based retention, as Tekton's pruner's `keep: N`: the workspaces of the namespace's
    /// this many newest failed builds are kept whatever their TTL (see [`FailedRank`]); 0: off.
    /// It only narrows deletion: `max_age` and `expires` still apply.
    pub keep_failed: u32,
    /// Whether claims may be deleted at all (a namespace can switch collection off).
    pub collection: Collection,
    /// What makes a labelled claim a build workspace at all. Shared: every namespace's policy
    /// holds the cluster's.
    pub provenance: Arc<ProvenanceRule>,
}

/// Whether a namespace's claims are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collection {
    On,
    /// Its namespace switches collection off: its claims are kept.
    Off,
    /// Its namespace's settings could not be read: its claims are kept.
    Unknown,
    /// Its namespace has a workspace-gc annotation the daemon does not understand: its claims
    /// are kept until it is fixed.
    Invalid,
}

impl Policy {
    /// The TTL after the build finished, unless the claim's `ttl` annotation sets its own.
    pub fn ttl_for(&self, facts: &Facts) -> Duration {
        if facts.build_failed() {
            self.ttl_after_failed
        } else {
            self.ttl_after_finished
        }
    }
}

/// Why a verdict was reached; bounded, so it doubles as a metric label and an event reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    // Delete.
    /// The `expires` annotation's instant has passed.
    Expired,
    /// Every linked owner is gone: the claim referenced it by UID and no object with that UID
    /// exists.
    OwnerGone,
    /// The build finished longer ago than its TTL.
    TtlExpired,
    /// No owner was found and the claim is older than the orphan grace.
    Orphaned,
    /// The claim is older than `max_age`, whatever its owners say.
    MaxAgeExceeded,
    /// Its namespace's storage quota is nearly exhausted and its build finished: taken before
    /// its TTL, oldest completion first (see `quota`). Never a verdict of `decide`.
    QuotaPressure,
    // Protected.
    /// A pod that has not terminated mounts the claim, or its `Unused` condition is `False`.
    InUse,
    /// An unfinished NotebookValidationJob names the claim in its own volumes.
    ReferencedByJob,
    /// The `keep` annotation is `"true"`.
    KeepAnnotation,
    // Keep.
    /// The claim is already being deleted; its finalizers belong to Kubernetes.
    AlreadyTerminating,
    /// Labelled, but its own record does not say the operator (or `workspace-gc create`) made
    /// it a build workspace (see `provenance`).
    NotABuildWorkspace,
    /// A workspace-gc annotation does not parse.
    InvalidAnnotation,
    /// An owner's state could not be read.
    OwnerUnknown,
    /// The pods that might mount the claim could not be read.
    UsersUnknown,
    /// An owner reference names a kind workspace-gc does not manage.
    ForeignOwner,
    /// Its namespace switches collection off.
    CollectionOff,
    /// Its namespace's settings could not be read.
    NamespaceUnknown,
    /// A workspace-gc annotation on its namespace does not parse, is unknown, or breaks a
    /// bound.
    InvalidNamespacePolicy,
    /// A linked owner is still running.
    OwnerRunning,
    /// A linked owner finished but records no completion time (yet); only `max_age` or
    /// `expires` apply until it does.
    CompletionTimeMissing,
    /// The recorded completion time lies in the future (clock skew): not treated as expired.
    CompletionInFuture,
    /// Its build is one of its namespace's `keep_failed` newest failed builds.
    NewestFailed,
    /// Its build failed, and where it ranks among its namespace's failed builds could not be
    /// read, with count-based retention on.
    FailedRankUnknown,
    /// Every linked owner finished, the latest less than its TTL ago.
    WithinTtl,
    /// No owner was found yet, but the claim is younger than the orphan grace.
    WithinOrphanGrace,
}

impl Reason {
    pub const ALL: [Reason; 25] = [
        Reason::Expired,
        Reason::OwnerGone,
        Reason::TtlExpired,
        Reason::Orphaned,
        Reason::MaxAgeExceeded,
        Reason::QuotaPressure,
        Reason::InUse,
        Reason::ReferencedByJob,
        Reason::KeepAnnotation,
        Reason::AlreadyTerminating,
        Reason::NotABuildWorkspace,
        Reason::InvalidAnnotation,
        Reason::OwnerUnknown,
        Reason::UsersUnknown,
        Reason::ForeignOwner,
        Reason::CollectionOff,
        Reason::NamespaceUnknown,
        Reason::InvalidNamespacePolicy,
        Reason::OwnerRunning,
        Reason::CompletionTimeMissing,
        Reason::CompletionInFuture,
        Reason::NewestFailed,
        Reason::FailedRankUnknown,
        Reason::WithinTtl,
        Reason::WithinOrphanGrace,
    ];

    /// The kebab-case name used in metrics, logs and the audit report.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Expired => "expired",
            Reason::OwnerGone => "owner-gone",
            Reason::TtlExpired => "ttl-expired",
            Reason::Orphaned => "orphaned",
            Reason::MaxAgeExceeded => "max-age-exceeded",
            Reason::QuotaPressure => "quota-pressure",
            Reason::InUse => "in-use",
            Reason::ReferencedByJob => "referenced-by-job",
            Reason::KeepAnnotation => "keep-annotation",
            Reason::AlreadyTerminating => "already-terminating",
            Reason::NotABuildWorkspace => "not-a-build-workspace",
            Reason::InvalidAnnotation => "invalid-annotation",
            Reason::OwnerUnknown => "owner-unknown",
            Reason::UsersUnknown => "users-unknown",
            Reason::ForeignOwner => "foreign-owner",
            Reason::CollectionOff => "collection-off",
            Reason::NamespaceUnknown => "namespace-unknown",
            Reason::InvalidNamespacePolicy => "invalid-namespace-policy",
            Reason::OwnerRunning => "owner-running",
            Reason::CompletionTimeMissing => "completion-time-missing",
            Reason::CompletionInFuture => "completion-in-future",
            Reason::NewestFailed => "newest-failed",
            Reason::FailedRankUnknown => "failed-rank-unknown",
            Reason::WithinTtl => "within-ttl",
            Reason::WithinOrphanGrace => "within-orphan-grace",
        }
    }

    /// A sentence for events and the audit report.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Expired => "the expires annotation's time has passed",
            Reason::OwnerGone => "every owner it referenced is gone",
            Reason::TtlExpired => "the build finished longer ago than its TTL",
            Reason::Orphaned => "no owner was found and the orphan grace has passed",
            Reason::MaxAgeExceeded => "it is older than the maximum age",
            Reason::QuotaPressure => {
                "its namespace's storage quota is nearly exhausted and its build has finished"
            }
            Reason::InUse => "a running pod mounts it",
            Reason::ReferencedByJob => {
                "an unfinished NotebookValidationJob names it in its volumes"
            }
            Reason::KeepAnnotation => "it is annotated keep=true",
            Reason::AlreadyTerminating => "it is already being deleted",
            Reason::NotABuildWorkspace => {
                "it is labelled, but nothing shows the operator made it a build workspace"
            }
            Reason::InvalidAnnotation => "a workspace-gc annotation does not parse",
            Reason::OwnerUnknown => "an owner's state could not be read",
            Reason::UsersUnknown => "the pods that may mount it could not be read",
            Reason::ForeignOwner => "it is owned by a kind workspace-gc does not manage",
            Reason::CollectionOff => "its namespace switches collection off",
            Reason::NamespaceUnknown => "its namespace's settings could not be read",
            Reason::InvalidNamespacePolicy => {
                "a workspace-gc annotation on its namespace is not understood"
            }
            Reason::OwnerRunning => "its build is still running",
            Reason::CompletionTimeMissing => "its build finished but records no completion time",
            Reason::CompletionInFuture => {
                "its build's completion time lies in the future (clock skew)"
            }
            Reason::NewestFailed => "its build is one of its namespace's newest failed builds",
            Reason::FailedRankUnknown => {
                "its build failed, and its rank among its namespace's failed builds is unknown"
            }
            Reason::WithinTtl => "its build finished less than its TTL ago",
            Reason::WithinOrphanGrace => "no owner yet, but it is within the orphan grace",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// Not due: `recheck_at` is the exact instant the verdict changes if no fact changes.
    Keep {
        reason: Reason,
        recheck_at: Option<DateTime<Utc>>,
    },
    /// Due since `due_at` (when the policy can tell), the start of the reclaim lag.
    Delete {
        reason: Reason,
        due_at: Option<DateTime<Utc>>,
    },
    /// Must not be deleted whatever else holds, until a fact changes.
    Protected { reason: Reason },
}

impl Verdict {
    pub fn reason(&self) -> Reason {
        match *self {
            Verdict::Keep { reason, .. }
            | Verdict::Delete { reason, .. }
            | Verdict::Protected { reason } => reason,
        }
    }

    pub fn state(&self) -> VerdictState {
        match self {
            Verdict::Keep { .. } => VerdictState::Keep,
            Verdict::Delete { .. } => VerdictState::Delete,
            Verdict::Protected { .. } => VerdictState::Protected,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(self, Verdict::Delete { .. })
    }

    /// When the verdict changes with time alone, if ever.
    pub fn recheck_at(&self) -> Option<DateTime<Utc>> {
        match *self {
            Verdict::Keep { recheck_at, .. } => recheck_at,
            _ => None,
        }
    }
}

/// The verdict's kind, a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictState {
    Keep,
    Delete,
    Protected,
}

impl VerdictState {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictState::Keep => "keep",
            VerdictState::Delete => "delete",
            VerdictState::Protected => "protected",
        }
    }
}

/// A verdict with the detail a person needs to act on it (which annotation is wrong, which
/// owner could not be read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    #[serde(flatten)]
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Decision {
    fn plain(verdict: Verdict) -> Self {
        Self {
            verdict,
            detail: None,
        }
    }

    fn keep(reason: Reason, recheck_at: Option<DateTime<Utc>>) -> Self {
        Self::plain(Verdict::Keep { reason, recheck_at })
    }

    fn with_detail(verdict: Verdict, detail: String) -> Self {
        Self {
            verdict,
            detail: Some(detail),
        }
    }
}

/// Decides what to do with one claim. Pure: the same facts, policy and `now` give the same
/// decision.
///
/// Order matters and is the safety argument: terminating, a claim that is no build workspace
/// (a label without provenance), bad annotations, use, `keep`, unreadable or foreign owners,
/// and a namespace that switches collection off (or could not be read, or has a setting not
/// understood) all keep the claim before any deadline is looked at.
pub fn decide(facts: &Facts, policy: &Policy, now: DateTime<Utc>) -> Decision {
    let claim = &facts.claim;
    if claim.deletion_timestamp.is_some() {
        return Decision::keep(Reason::AlreadyTerminating, None);
    }
    // Not workspace-gc's claim: nothing else about it counts, not even its own `expires`.
    if let Some(missing) = provenance::missing(claim, &policy.provenance) {
        return Decision::with_detail(
            Verdict::Keep {
                reason: Reason::NotABuildWorkspace,
                recheck_at: None,
            },
            missing.to_string(),
        );
    }
    let annotations = match annotations::parse(&claim.annotations) {
        Ok(parsed) => parsed,
        Err(error) => {
            return Decision::with_detail(
                Verdict::Keep {
                    reason: Reason::InvalidAnnotation,
                    recheck_at: None,
                },
                error.to_string(),
            );
        }
    };
    match &facts.users {
        Users::Unknown { why } => {
            return Decision::with_detail(
                Verdict::Keep {
                    reason: Reason::UsersUnknown,
                    recheck_at: None,
                },
                why.clone(),
            );
        }
        Users::Known { pods, jobs } => {
            if let Some(pod) = pods.iter().find(|pod| pod.is_active()) {
                return Decision::with_detail(
                    Verdict::Protected {
                        reason: Reason::InUse,
                    },
                    format!("mounted by pod {}", pod.name),
                );
            }
            // The API server's own account of use; `True` or none proves nothing.
            if claim.reported_in_use {
                return Decision::with_detail(
                    Verdict::Protected {
                        reason: Reason::InUse,
                    },
                    "its Unused condition is False".to_owned(),
                );
            }
            if let Some(job) = jobs.first() {
                return Decision::with_detail(
                    Verdict::Protected {
                        reason: Reason::ReferencedByJob,
                    },
                    format!("named in the volumes of NotebookValidationJob {job}"),
                );
            }
        }
    }
    if annotations.keep {
        return Decision::plain(Verdict::Protected {
            reason: Reason::KeepAnnotation,
        });
    }
    if let Some((owner, why)) = facts.owners.iter().find_map(|owner| match &owner.state {
        OwnerState::Unknown { why } => Some((owner, why)),
        _ => None,
    }) {
        return Decision::with_detail(
            Verdict::Keep {
                reason: Reason::OwnerUnknown,
                recheck_at: None,
            },
            format!("{} {}: {why}", owner.kind.as_str(), owner.name),
        );
    }
    if let Some(foreign) = claim
        .owner_references
        .iter()
        .find(|r| r.owner_kind().is_none())
    {
        return Decision::with_detail(
            Verdict::Keep {
                reason: Reason::ForeignOwner,
                recheck_at: None,
            },
            format!("owned by {} {}", foreign.kind, foreign.name),
        );
    }
    match policy.collection {
        Collection::On => {}
        Collection::Off => return Decision::keep(Reason::CollectionOff, None),
        Collection::Unknown => return Decision::keep(Reason::NamespaceUnknown, None),
        Collection::Invalid => return Decision::keep(Reason::InvalidNamespacePolicy, None),
    }
    let verdict = decide_by_time(facts, &annotations, policy, now);
    match (verdict.reason(), &facts.failed_rank) {
        (Reason::NewestFailed, FailedRank::Ranked { newer }) => {
            let detail = format!(
                "{newer} failed later in its namespace (of its kind); the newest {} are kept",
                policy.keep_failed
            );
            Decision::with_detail(verdict, detail)
        }
        (Reason::FailedRankUnknown, FailedRank::Unknown { why }) => {
            Decision::with_detail(verdict, why.clone())
        }
        _ => Decision::plain(verdict),
    }
}

/// When a kept claim becomes due if no fact changes, and why: its verdict at the instant the
/// keep verdict changes, when that is a delete. What a notice before deletion announces.
pub fn scheduled(
    facts: &Facts,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, Reason)> {
    let at = decide(facts, policy, now).verdict.recheck_at()?;
    match decide(facts, policy, at).verdict {
        Verdict::Delete { reason, .. } => Some((at, reason)),
        _ => None,
    }
}

/// The deadlines, once nothing protects the claim.
fn decide_by_time(
    facts: &Facts,
    annotations: &ClaimAnnotations,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Verdict {
    let created = facts.claim.created;
    // Absolute deadlines hold whatever the owners say.
    let mut deadlines = Deadlines::new(now, created);
    deadlines.absolute(Reason::Expired, annotations.expires);
    deadlines.absolute(Reason::MaxAgeExceeded, add(created, policy.max_age));

    let ttl = annotations.ttl.unwrap_or(policy.ttl_for(facts));
    deadlines.decide(owners_relative(facts, ttl, policy, now))
}

/// What the linked owners allow: the claim is due only once every one of them allows it. A
/// gone owner allows it at once; a finished one when its TTL has passed since the latest
/// completion time; a running one, or a finished one that records no completion time, not
/// until that changes. With no owner at all, the orphan grace applies.
fn owners_relative(facts: &Facts, ttl: Duration, policy: &Policy, now: DateTime<Utc>) -> Relative {
    let (mut running, mut time_missing, mut any_gone) = (false, false, false);
    for owner in &facts.owners {
        match &owner.state {
            OwnerState::Present { progress, .. } => match progress {
                Progress::Running => running = true,
                Progress::Finished { at: None, .. } => time_missing = true,
                Progress::Finished { at: Some(_), .. } => {}
            },
            OwnerState::Gone => any_gone = true,
            // `decide` keeps every claim with an unknown owner before deadlines are looked at.
            OwnerState::Unknown { .. } => return Relative::Keep(Reason::OwnerUnknown, None),
        }
    }
    if running {
        return Relative::Keep(Reason::OwnerRunning, None);
    }
    if time_missing {
        return Relative::Keep(Reason::CompletionTimeMissing, None);
    }
    if let Some(finished_at) = facts.latest_completion() {
        if finished_at > now {
            return Relative::Keep(Reason::CompletionInFuture, Some(finished_at));
        }
        if let Some(reason) = retained(facts, policy) {
            return Relative::Keep(reason, None);
        }
        return match add(finished_at, ttl) {
            Some(due) if due <= now => Relative::Due(Reason::TtlExpired, Some(due)),
            due => Relative::Keep(Reason::WithinTtl, due),
        };
    }
    if any_gone {
        return Relative::Due(Reason::OwnerGone, None);
    }
    match add(facts.claim.created, policy.orphan_grace) {
        Some(due) if due <= now => Relative::Due(Reason::Orphaned, Some(due)),
        due => Relative::Keep(Reason::WithinOrphanGrace, due),
    }
}

/// Count-based retention: a failed build among its namespace's `keep_failed` newest keeps its
/// workspace, and so does one whose rank cannot be read. Before the TTL, so quota pressure,
/// which takes only `within-ttl` claims, never takes it either; only new failures (or someone
/// deleting a newer failed owner) change a rank, never workspace-gc's own deletes of claims.
fn retained(facts: &Facts, policy: &Policy) -> Option<Reason> {
    if policy.keep_failed == 0 {
        return None;
    }
    match &facts.failed_rank {
        FailedRank::NotFailed => None,
        FailedRank::Ranked { newer } => {
            (*newer < policy.keep_failed).then_some(Reason::NewestFailed)
        }
        FailedRank::Unknown { .. } => Some(Reason::FailedRankUnknown),
    }
}

/// The owner-dependent part of a decision.
enum Relative {
    Due(Reason, Option<DateTime<Utc>>),
    /// Keep, and the instant this part's answer changes, if it does.
    Keep(Reason, Option<DateTime<Utc>>),
}

/// Absolute deadlines (`expires`, `max_age`) combined with the owner-dependent part.
struct Deadlines {
    now: DateTime<Utc>,
    /// The claim's creation: nothing was due before it existed, so no reclaim lag starts earlier.
    created: DateTime<Utc>,
    /// The first absolute deadline already passed, in precedence order.
    passed: Option<(Reason, DateTime<Utc>)>,
    /// The earliest absolute deadline still ahead.
    ahead: Option<DateTime<Utc>>,
}

impl Deadlines {
    fn new(now: DateTime<Utc>, created: DateTime<Utc>) -> Self {
        Self {
            now,
            created,
            passed: None,
            ahead: None,
        }
    }

    fn absolute(&mut self, reason: Reason, deadline: Option<DateTime<Utc>>) {
        let Some(deadline) = deadline else { return };
        if deadline <= self.now {
            let earliest = self.passed.map_or(deadline, |(_, at)| at.min(deadline));
            let first_reason = self.passed.map_or(reason, |(r, _)| r);
            self.passed = Some((first_reason, earliest));
        } else {
            self.ahead = Some(self.ahead.map_or(deadline, |at| at.min(deadline)));
        }
    }

    fn decide(self, relative: Relative) -> Verdict {
        // A claim's clock may run ahead of ours: `now` bounds the instant too.
        let since_created =
            |due: Option<DateTime<Utc>>| due.map(|due| due.max(self.created).min(self.now));
        match (relative, self.passed) {
            (Relative::Due(reason, due), passed) => Verdict::Delete {
                reason,
                due_at: since_created(earliest(due, passed.map(|(_, at)| at))),
            },
            (Relative::Keep(_, _), Some((reason, at))) => Verdict::Delete {
                reason,
                due_at: since_created(Some(at)),
            },
            (Relative::Keep(reason, changes_at), None) => Verdict::Keep {
                reason,
                recheck_at: earliest(changes_at, self.ahead),
            },
        }
    }
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `None` when the sum is beyond what time can represent: such a deadline never comes.
fn add(at: DateTime<Utc>, duration: Duration) -> Option<DateTime<Utc>> {
    at.checked_add_signed(duration)
}
