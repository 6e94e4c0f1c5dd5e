//! The bounded values of the metrics' labels: cache kinds, delete results, API operations and
//! error categories, ledger faults and reads, volume marks and sweeps, revocations, the work
//! queue's states and the unresolved DELETEs', each with the one string it writes. Apart from
//! the families (`mod.rs`) because the daemon names these where it acts, and every label but a
//! namespace or a quota's name takes a value listed here.

use crate::contract::OwnerKind;

/// The kinds the watches feed and the cache holds: the `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Claims,
    Jobs,
    Runs,
    TaskRuns,
    Pods,
    Quotas,
    Namespaces,
}

impl Kind {
    /// The owner kind this kind's objects are, if any.
    pub fn owner(self) -> Option<OwnerKind> {
        match self {
            Kind::Jobs => Some(OwnerKind::Job),
            Kind::Runs => Some(OwnerKind::Run),
            Kind::TaskRuns => Some(OwnerKind::TaskRun),
            Kind::Claims | Kind::Pods | Kind::Quotas | Kind::Namespaces => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Claims => "claims",
            Kind::Jobs => "jobs",
            Kind::Runs => "runs",
            Kind::TaskRuns => "taskruns",
            Kind::Pods => "pods",
            Kind::Quotas => "quotas",
            Kind::Namespaces => "namespaces",
        }
    }
}

impl From<OwnerKind> for Kind {
    fn from(owner: OwnerKind) -> Self {
        match owner {
            OwnerKind::Job => Kind::Jobs,
            OwnerKind::Run => Kind::Runs,
            OwnerKind::TaskRun => Kind::TaskRuns,
        }
    }
}

/// How a delete ended: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteResult {
    Deleted,
    /// Already gone: counts as done.
    NotFound,
    /// The claim changed or was re-created since the decision: re-evaluated.
    Conflict,
    /// Throttled (429): not carried out, and worth trying again soon.
    Throttled,
    /// Refused for good as things stand (RBAC, admission, any other 4xx): not carried out, and
    /// not worth trying again often.
    Denied,
    /// No answer that says whether it was carried out (a broken connection, the deadline, a
    /// 5xx): it may have been.
    Unanswered,
}

impl DeleteResult {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteResult::Deleted => "deleted",
            DeleteResult::NotFound => "not-found",
            DeleteResult::Conflict => "conflict",
            DeleteResult::Throttled => "throttled",
            DeleteResult::Denied => "denied",
            DeleteResult::Unanswered => "unanswered",
        }
    }
}

/// The bounded category of an API error: the `category` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCategory {
    /// Refused by an admission policy or webhook, such as the admission guard: for a delete,
    /// the daemon and the guard disagree about what may be deleted.
    AdmissionDenied,
    Forbidden,
    Unauthorized,
    Conflict,
    NotFound,
    Throttled,
    ServerError,
    Connection,
    /// No answer within the request's deadline.
    Timeout,
    Other,
}

impl ErrorCategory {
    pub fn of(error: &kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if admission_denied(&status.message) => {
                ErrorCategory::AdmissionDenied
            }
            kube::Error::Api(status) => match status.code {
                401 => ErrorCategory::Unauthorized,
                403 => ErrorCategory::Forbidden,
                404 => ErrorCategory::NotFound,
                409 => ErrorCategory::Conflict,
                429 => ErrorCategory::Throttled,
                500..=599 => ErrorCategory::ServerError,
                _ => ErrorCategory::Other,
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) => ErrorCategory::Connection,
            _ => ErrorCategory::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::AdmissionDenied => "admission-denied",
            ErrorCategory::Forbidden => "forbidden",
            ErrorCategory::Unauthorized => "unauthorized",
            ErrorCategory::Conflict => "conflict",
            ErrorCategory::NotFound => "not-found",
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::ServerError => "server-error",
            ErrorCategory::Connection => "connection",
            ErrorCategory::Timeout => "timeout",
            ErrorCategory::Other => "other",
        }
    }
}

/// Whether an API error's message is an admission refusal, as the API server words them
/// (`ValidatingAdmissionPolicy 'P' with binding 'B' denied request: …`, `admission webhook "W"
/// denied the request: …`), whatever status code the policy chose.
fn admission_denied(message: &str) -> bool {
    let policy =
        message.contains("ValidatingAdmissionPolicy '") && message.contains("denied request");
    let webhook =
        message.contains("admission webhook \"") && message.contains("denied the request");
    policy || webhook
}

/// The API call an error came from: the `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Watch,
    Get,
    List,
    Delete,
    Patch,
    Event,
    Lease,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Watch => "watch",
            Operation::Get => "get",
            Operation::List => "list",
            Operation::Delete => "delete",
            Operation::Patch => "patch",
            Operation::Event => "event",
            Operation::Lease => "lease",
        }
    }
}

/// What was wrong with the deletion ledger on the Lease: the `fault` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerFault {
    /// Not a ledger at all: counted as a full window.
    Malformed,
    /// Buckets of an implausible size: counted as a full window.
    Bucket,
    /// A bucket dated where no deletion can have been recorded: counted as a full window.
    Date,
    /// Changed by someone else while this replica led: written back.
    Changed,
    /// The Lease was deleted while this replica led or stood by: created again with the ledger.
    Lost,
    /// The DELETEs in flight it names cannot be read: none of them can be revoked.
    InFlight,
}

impl LedgerFault {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerFault::Malformed => "malformed",
            LedgerFault::Bucket => "bucket",
            LedgerFault::Date => "date",
            LedgerFault::Changed => "changed",
            LedgerFault::Lost => "lost",
            LedgerFault::InFlight => "in-flight",
        }
    }
}

/// What became of the mark on a `Retain` volume after its claim's delete: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Written: the volume may be deleted once Released.
    Marked,
    /// Not written: the claim is deleted all the same, and its volume never qualifies.
    Failed,
}

/// What a revocation of a DELETE without a definite answer found: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// The claim changed: the DELETE fails its precondition whenever it arrives.
    Revoked,
    /// No definite answer, or refused: the claim stays kept and it is tried again.
    NotRevoked,
}

impl Revoked {
    pub fn as_str(self) -> &'static str {
        match self {
            Revoked::Revoked => "revoked",
            Revoked::NotRevoked => "not-revoked",
        }
    }
}

impl Mark {
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Marked => "marked",
            Mark::Failed => "failed",
        }
    }
}

/// How one sweep of Released volumes ended: the `result` label of `volume_sweeps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Every volume listed was judged, and every DELETE sent answered.
    Completed,
    /// The volumes could not be listed: none was looked at.
    Unlisted,
    /// A volume's DELETE failed: the rest wait for the next sweep.
    Interrupted,
}

impl Sweep {
    pub fn as_str(self) -> &'static str {
        match self {
            Sweep::Completed => "completed",
            Sweep::Unlisted => "unlisted",
            Sweep::Interrupted => "interrupted",
        }
    }
}

/// What a standby found reading the Lease: the `result` label of `standby_ledger_reads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerRead {
    /// A deletion ledger: remembered, to be written on the Lease should it be created again.
    Remembered,
    /// None: the last one read stays remembered.
    Absent,
}

impl LedgerRead {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerRead::Remembered => "remembered",
            LedgerRead::Absent => "absent",
        }
    }
}

/// How an owner kind is served (`cluster::served`): the `state` label of
/// `workspace_gc_kind_served`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedState {
    Preferred,
    OtherVersion,
    Unreadable,
    Absent,
}

impl ServedState {
    pub const ALL: [ServedState; 4] = [
        ServedState::Preferred,
        ServedState::OtherVersion,
        ServedState::Unreadable,
        ServedState::Absent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ServedState::Preferred => "preferred",
            ServedState::OtherVersion => "other-version",
            ServedState::Unreadable => "unreadable",
            ServedState::Absent => "absent",
        }
    }
}

/// Where a claim stands in the work queue: the `state` label of `queue_depth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    /// Due, waiting for a worker (client-go's depth).
    Ready,
    /// Being reconciled.
    Running,
    /// Waiting for a later instant: its deadline, or the end of its backoff.
    Scheduled,
}

impl QueueState {
    pub const ALL: [QueueState; 3] = [
        QueueState::Ready,
        QueueState::Running,
        QueueState::Scheduled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            QueueState::Ready => "ready",
            QueueState::Running => "running",
            QueueState::Scheduled => "scheduled",
        }
    }
}

/// Where a claim DELETE that is neither answered nor revoked stands (`cluster::in_flight`): the
/// `state` label of `deletes_unresolved`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// Named on the Lease and about to be sent, or sent and waiting for its answer.
    Sending,
    /// Sent without a definite answer: it may still land until it is revoked.
    Unanswered,
    /// Named on the Lease when this replica won it: sent by whoever led before.
    Found,
}

impl Unresolved {
    pub const ALL: [Unresolved; 3] = [
        Unresolved::Sending,
        Unresolved::Unanswered,
        Unresolved::Found,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unresolved::Sending => "sending",
            Unresolved::Unanswered => "unanswered",
            Unresolved::Found => "found",
        }
    }
}

/// The failures in a row past which a claim counts in `queue_retrying_claims`, each its
/// `at_least` label: any, a fault of seconds (1, 2, 4, 8 s of backoff), one that has lasted
/// minutes.
pub const RETRYING_AT_LEAST: [(u32, &str); 3] = [(1, "1"), (5, "5"), (20, "20")];

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages as kube-apiserver 1.37 words them (the guard's, from tests/cluster/admission.rs).
    #[test]
    fn admission_refusals_are_told_apart_from_rbac() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.into(),
                ..kube::core::Status::default()
            }))
        };
        let guard = "persistentvolumeclaims \"a\" is forbidden: ValidatingAdmissionPolicy \
                     'workspace-gc-guard' with binding 'workspace-gc-guard' denied request: \
                     workspace-gc admission guard: rule label-selector: …";
        let webhook = "admission webhook \"deny.example.com\" denied the request: no";
        let rbac = "persistentvolumeclaims \"a\" is forbidden: User \"system:serviceaccount:gc:gc\" \
                    cannot patch resource \"persistentvolumeclaims\" in API group \"\"";
        for (error, category) in [
            (api(403, guard), ErrorCategory::AdmissionDenied),
            (api(422, guard), ErrorCategory::AdmissionDenied),
            (api(400, webhook), ErrorCategory::AdmissionDenied),
            (api(403, rbac), ErrorCategory::Forbidden),
        ] {
            assert_eq!(ErrorCategory::of(&error), category, "{error}");
        }
        assert_eq!(ErrorCategory::AdmissionDenied.as_str(), "admission-denied");
    }
}
