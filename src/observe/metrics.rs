//! Prometheus metrics, registered once. Every label comes from a bounded enum (reason, state,
//! result, error category, cache kind, quota resource) or is the claim's namespace; never an
//! object name, except a ResourceQuota's: a namespace holds a handful, set by its admins.
//!
//! The claim's namespace is `claim_namespace`, never `namespace`: a Prometheus that does not
//! honor the target's labels (OpenShift's user-workload monitoring) overwrites `namespace` with
//! the daemon's own, which would merge every claim namespace into one series.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cluster::served::State as Served;
use crate::contract::OwnerKind;
use crate::decide::facts::ObjectKey;
use crate::decide::policy::{Reason, Verdict};
use crate::decide::quota::QuotaEntry;

/// The labels of `claims` and `tracked_bytes`: a verdict, and where, so a dashboard shows which
/// namespace fills up.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    claim_namespace: String,
    state: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeletionLabels {
    claim_namespace: String,
    reason: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WouldDeleteLabels {
    claim_namespace: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecheckLabels {
    read: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    operation: &'static str,
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    claim_namespace: String,
    quota: String,
    resource: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    bound: &'static str,
}

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServedLabels {
    kind: &'static str,
    state: &'static str,
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LedgerFaultLabels {
    fault: &'static str,
}

/// What the daemon last decided about a claim, so the `claims` gauges move, not accumulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tracked {
    state: &'static str,
    reason: &'static str,
    bytes: u64,
}

pub struct Metrics {
    claims: Family<ClaimLabels, Gauge>,
    tracked_bytes: Family<ClaimLabels, Gauge<u64, AtomicU64>>,
    deletions: Family<DeletionLabels, Counter>,
    would_delete: Family<WouldDeleteLabels, Counter>,
    reclaimed_bytes: Counter,
    retained_bytes: Counter,
    volume_marks: Family<ResultLabels, Counter>,
    volume_deletions: Family<ResultLabels, Counter>,
    revocations: Family<ResultLabels, Counter>,
    deletes_late: Counter,
    reconcile_duration: Histogram,
    reclaim_lag: Histogram,
    api_errors: Family<ApiErrorLabels, Counter>,
    rechecks: Family<RecheckLabels, Counter>,
    reconcile_retries: Family<CategoryLabels, Counter>,
    watch_restarts: Family<KindLabels, Counter>,
    cached_objects: Family<KindLabels, Gauge>,
    kind_served: Family<ServedLabels, Gauge>,
    leader: Gauge,
    ready: Gauge,
    blast_radius_capped: Gauge,
    blast_radius_cap_reached: Counter,
    blast_radius_unknown: Gauge,
    blast_radius_ledger_faults: Family<LedgerFaultLabels, Counter>,
    quota_used_ratio: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    clock_offset: Family<BoundLabels, Gauge<f64, AtomicU64>>,
    tracked: Mutex<HashMap<ObjectKey, Tracked>>,
    /// The `quota_used_ratio` series of each namespace, so the ones no longer there go.
    quota_series: Mutex<HashMap<String, HashSet<QuotaLabels>>>,
}

impl Metrics {
    /// Builds the metrics and registers them under the `workspace_gc` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            claims: Family::default(),
            tracked_bytes: Family::default(),
            deletions: Family::default(),
            would_delete: Family::default(),
            reclaimed_bytes: Counter::default(),
            retained_bytes: Counter::default(),
            volume_marks: Family::default(),
            volume_deletions: Family::default(),
            revocations: Family::default(),
            deletes_late: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            reclaim_lag: Histogram::new([0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
            api_errors: Family::default(),
            rechecks: Family::default(),
            reconcile_retries: Family::default(),
            watch_restarts: Family::default(),
            cached_objects: Family::default(),
            kind_served: Family::default(),
            leader: Gauge::default(),
            ready: Gauge::default(),
            blast_radius_capped: Gauge::default(),
            blast_radius_cap_reached: Counter::default(),
            blast_radius_unknown: Gauge::default(),
            blast_radius_ledger_faults: Family::default(),
            quota_used_ratio: Family::default(),
            clock_offset: Family::default(),
            tracked: Mutex::default(),
            quota_series: Mutex::default(),
        };
        let r = registry.sub_registry_with_prefix("workspace_gc");
        r.register(
            "claims",
            "Tracked claims by namespace and the state and reason of their last verdict",
            metrics.claims.clone(),
        );
        r.register(
            "tracked_bytes",
            "Storage requested by the tracked claims, by namespace, state and reason",
            metrics.tracked_bytes.clone(),
        );
        r.register(
            "deletions",
            "Delete requests sent, by namespace, reason and result",
            metrics.deletions.clone(),
        );
        r.register(
            "dry_run_would_delete",
            "Claims dry-run mode would have deleted",
            metrics.would_delete.clone(),
        );
        r.register(
            "reclaimed_bytes",
            "Storage requested by the claims deleted, but for those whose volume a Retain \
             reclaim policy keeps",
            metrics.reclaimed_bytes.clone(),
        );
        r.register(
            "retained_bytes",
            "Storage requested by the claims deleted whose volume a Retain reclaim policy keeps \
             (Released, still allocated)",
            metrics.retained_bytes.clone(),
        );
        r.register(
            "volume_marks",
            "Claim UIDs written on Retain volumes once their claims' deletes were answered with \
             success (deletion.released_volume_ttl), by result: marked or failed (the volume never \
             qualifies)",
            metrics.volume_marks.clone(),
        );
        r.register(
            "revocations",
            "Claim DELETEs without a definite answer revoked by changing the claim, by result: \
             revoked (the DELETE fails its precondition whenever it arrives) or not-revoked \
             (tried again; the claim is kept meanwhile)",
            metrics.revocations.clone(),
        );
        r.register(
            "deletes_late",
            "Claim DELETEs without a definite answer found carried out when revoked: the claim \
             was gone, being deleted or re-created. Counted against the blast-radius cap",
            metrics.deletes_late.clone(),
        );
        r.register(
            "volume_deletions",
            "Delete requests sent for Released volumes whose claims workspace-gc deleted, by result",
            metrics.volume_deletions.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time to decide about one claim",
            metrics.reconcile_duration.clone(),
        );
        r.register(
            "reclaim_lag_seconds",
            "Time from a claim's deadline to its deletion",
            metrics.reclaim_lag.clone(),
        );
        r.register(
            "api_errors",
            "Kubernetes API errors by operation and category",
            metrics.api_errors.clone(),
        );
        r.register(
            "rechecks",
            "Live re-checks before a delete, by how they read: `proven` (the cache proven fresh \
             by a shared round of small reads) or `listed` (the claim's namespace listed)",
            metrics.rechecks.clone(),
        );
        r.register(
            "reconcile_retries",
            "Reconciles that could not conclude and are retried after a per-claim backoff, by \
             category",
            metrics.reconcile_retries.clone(),
        );
        r.register(
            "watch_restarts",
            "Watch streams that failed and were restarted, by kind",
            metrics.watch_restarts.clone(),
        );
        r.register(
            "cached_objects",
            "Objects held in the caches, by kind",
            metrics.cached_objects.clone(),
        );
        r.register(
            "kind_served",
            "1 for how each owner kind is served, by discovery: preferred (the version \
             workspace-gc reads first), other-version (another whose fields read are the same), \
             unreadable (only versions whose fields it does not know: claims it could protect are \
             kept) or absent (its group serves it at no version)",
            metrics.kind_served.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the lease and may delete",
            metrics.leader.clone(),
        );
        r.register(
            "ready",
            "1 while /readyz answers 200: every watch synced once",
            metrics.ready.clone(),
        );
        r.register(
            "blast_radius_capped",
            "1 while the maximum deletions per window is reached",
            metrics.blast_radius_capped.clone(),
        );
        r.register(
            "blast_radius_cap_reached",
            "Times the maximum deletions per window was reached",
            metrics.blast_radius_cap_reached.clone(),
        );
        r.register(
            "blast_radius_unknown",
            "1 while deletions are held back because the count of the current window is not known",
            metrics.blast_radius_unknown.clone(),
        );
        r.register(
            "blast_radius_ledger_faults",
            "Deletion ledgers on the Lease not taken as they were, by fault: unreadable or \
             implausible ones count as a full window, one changed or lost while leading is \
             written back",
            metrics.blast_radius_ledger_faults.clone(),
        );
        r.register(
            "quota_used_ratio",
            "status.used / status.hard of the ResourceQuota resources claims count toward, the \
             highest over storage classes for the class-scoped ones",
            metrics.quota_used_ratio.clone(),
        );
        r.register(
            "clock_offset_seconds",
            "The API server's clock minus this replica's: the lower and upper bound of the estimate \
             from the Date headers of its answers. Negative while this replica's clock runs ahead",
            metrics.clock_offset.clone(),
        );
        metrics
    }

    /// The namespaces that have `quota_used_ratio` series.
    pub fn quota_namespaces(&self) -> std::collections::BTreeSet<String> {
        let series = self.quota_series.lock().unwrap_or_else(|e| e.into_inner());
        series.keys().cloned().collect()
    }

    /// Sets the used ratios of one namespace's quotas, dropping the series of quotas and
    /// resources no longer there.
    pub fn quota_ratios(&self, namespace: &str, quotas: &[QuotaEntry]) {
        let mut highest: HashMap<QuotaLabels, f64> = HashMap::new();
        for quota in quotas {
            for limit in &quota.limits {
                let labels = QuotaLabels {
                    claim_namespace: namespace.to_owned(),
                    quota: quota.key.name.clone(),
                    resource: limit.resource.kind().as_str(),
                };
                let ratio = highest.entry(labels).or_insert(0.0);
                *ratio = ratio.max(limit.ratio());
            }
        }
        let mut series = self.quota_series.lock().unwrap_or_else(|e| e.into_inner());
        let known = series.entry(namespace.to_owned()).or_default();
        for gone in known.iter().filter(|labels| !highest.contains_key(*labels)) {
            self.quota_used_ratio.remove(gone);
        }
        for (labels, ratio) in &highest {
            self.quota_used_ratio.get_or_create(labels).set(*ratio);
        }
        *known = highest.into_keys().collect();
        if known.is_empty() {
            series.remove(namespace);
        }
    }

    /// Records the latest verdict for a claim (`None` once it is gone).
    pub fn track(&self, key: &ObjectKey, verdict: Option<(&Verdict, u64)>) {
        let mut tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        let new = verdict.map(|(verdict, bytes)| Tracked {
            state: verdict.state().as_str(),
            reason: verdict.reason().as_str(),
            bytes,
        });
        let old = match new {
            Some(new) => tracked.insert(key.clone(), new),
            None => tracked.remove(key),
        };
        if old == new {
            return;
        }
        if let Some(old) = old {
            let labels = claim_labels(key, old);
            // Separate statements: `remove` waits for the guard `get_or_create` returns.
            let before = self.claims.get_or_create(&labels).dec();
            self.tracked_bytes.get_or_create(&labels).dec_by(old.bytes);
            // The last claim of these labels is gone: drop the series, so namespaces that come
            // and go (one per team or per test run) do not leave zeros behind for good.
            if before == 1 {
                self.claims.remove(&labels);
                self.tracked_bytes.remove(&labels);
            }
        }
        if let Some(new) = new {
            let labels = claim_labels(key, new);
            self.claims.get_or_create(&labels).inc();
            self.tracked_bytes.get_or_create(&labels).inc_by(new.bytes);
        }
    }

    pub fn deletion(&self, namespace: &str, reason: Reason, result: DeleteResult) {
        self.deletions
            .get_or_create(&DeletionLabels {
                claim_namespace: namespace.to_owned(),
                reason: reason.as_str(),
                result: result.as_str(),
            })
            .inc();
    }

    /// A claim deleted: its bytes are freed, unless `retained` (its volume's reclaim policy is
    /// `Retain`).
    pub fn reclaimed(&self, bytes: u64, retained: bool, lag_seconds: Option<f64>) {
        if retained {
            self.retained_bytes.inc_by(bytes);
        } else {
            self.reclaimed_bytes.inc_by(bytes);
        }
        if let Some(lag) = lag_seconds {
            self.reclaim_lag.observe(lag.max(0.0));
        }
    }

    pub fn volume_mark(&self, result: Mark) {
        (self.volume_marks)
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }

    pub fn revocation(&self, result: Revoked) {
        (self.revocations)
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }

    pub fn delete_late(&self) {
        self.deletes_late.inc();
    }

    pub fn volume_deletion(&self, result: DeleteResult) {
        (self.volume_deletions)
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }

    pub fn would_delete(&self, namespace: &str, reason: Reason) {
        self.would_delete
            .get_or_create(&WouldDeleteLabels {
                claim_namespace: namespace.to_owned(),
                reason: reason.as_str(),
            })
            .inc();
    }

    pub fn reconciled(&self, seconds: f64) {
        self.reconcile_duration.observe(seconds);
    }

    pub fn api_error(&self, operation: Operation, error: &kube::Error) {
        self.api_errors
            .get_or_create(&ApiErrorLabels {
                operation: operation.as_str(),
                category: ErrorCategory::of(error).as_str(),
            })
            .inc();
    }

    /// A live re-check, read from the cache proven fresh or by listing.
    pub fn recheck(&self, proven: bool) {
        let read = if proven { "proven" } else { "listed" };
        self.rechecks.get_or_create(&RecheckLabels { read }).inc();
    }

    /// A request abandoned at its deadline, unanswered.
    pub fn api_timeout(&self, operation: Operation) {
        self.api_errors
            .get_or_create(&ApiErrorLabels {
                operation: operation.as_str(),
                category: ErrorCategory::Timeout.as_str(),
            })
            .inc();
    }

    /// A reconcile that could not conclude and is retried after its backoff.
    pub fn reconcile_retry(&self, category: &'static str) {
        self.reconcile_retries
            .get_or_create(&CategoryLabels { category })
            .inc();
    }

    pub fn watch_restart(&self, kind: Kind) {
        self.watch_restarts
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    pub fn cached(&self, sizes: impl IntoIterator<Item = (Kind, usize)>) {
        for (kind, size) in sizes {
            let size = i64::try_from(size).unwrap_or(i64::MAX);
            self.cached_objects
                .get_or_create(&KindLabels {
                    kind: kind.as_str(),
                })
                .set(size);
        }
    }

    /// How an owner kind is served now: its state 1, the others 0.
    pub fn kind_served(&self, kind: Kind, now: Served) {
        for state in Served::ALL {
            let labels = ServedLabels {
                kind: kind.as_str(),
                state: state.as_str(),
            };
            self.kind_served
                .get_or_create(&labels)
                .set((state == now).into());
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader.into());
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(ready.into());
    }

    pub fn set_capped(&self, capped: bool) {
        let before = self.blast_radius_capped.set(capped.into());
        if capped && before == 0 {
            self.blast_radius_cap_reached.inc();
        }
    }

    pub fn set_cap_unknown(&self, unknown: bool) {
        self.blast_radius_unknown.set(unknown.into());
    }

    /// The bounds of the API server's clock minus this replica's, in seconds.
    pub fn set_clock_offset(&self, lower: f64, upper: f64) {
        for (bound, value) in [("lower", lower), ("upper", upper)] {
            self.clock_offset
                .get_or_create(&BoundLabels { bound })
                .set(value);
        }
    }

    pub fn ledger_fault(&self, fault: LedgerFault) {
        self.blast_radius_ledger_faults
            .get_or_create(&LedgerFaultLabels {
                fault: fault.as_str(),
            })
            .inc();
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition, for clients that do not ask
/// for OpenMetrics (`curl`, `promtool check metrics`, older scrapers), which would otherwise
/// read every counter as an untyped `_total` series without help: there, a counter's HELP and
/// TYPE lines name its `_total` sample. No `# EOF` and no `# UNIT` either (none is registered).
pub fn classic_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let counter_meta = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let (name, rest) = line.strip_prefix(prefix)?.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {rest}"))
        });
        out.push_str(counter_meta.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn claim_labels(key: &ObjectKey, tracked: Tracked) -> ClaimLabels {
    ClaimLabels {
        claim_namespace: key.namespace.to_string(),
        state: tracked.state,
        reason: tracked.reason,
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    /// The samples of `name`, sorted: a family prints its series in no particular order.
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let prefix = format!("{name}{{");
        let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
        lines.sort_unstable();
        lines
    }

    /// The messages as kube-apiserver 1.37 words them (the guard's, from tests/admission.rs).
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

    fn assert_samples(text: &str, name: &str, expected: [&str; 2]) {
        assert_eq!(samples(text, name), expected, "{text}");
    }

    #[test]
    fn the_classic_format_names_counters_by_their_total_sample() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.reclaimed(1024, false, Some(2.0));
        let openmetrics = exposition(&registry);
        let classic = classic_text(&openmetrics);
        assert!(openmetrics.contains("# TYPE workspace_gc_reclaimed_bytes counter\n"));
        assert!(classic.contains(
            "# HELP workspace_gc_reclaimed_bytes_total Storage requested by the claims deleted, \
             but for those whose volume a Retain reclaim policy keeps.\n\
             # TYPE workspace_gc_reclaimed_bytes_total counter\n\
             workspace_gc_reclaimed_bytes_total 1024\n"
        ));
        // Gauges and histograms read the same in both formats.
        assert!(classic.contains("# TYPE workspace_gc_leader gauge\nworkspace_gc_leader 0\n"));
        assert!(classic.contains("# TYPE workspace_gc_reclaim_lag_seconds histogram\n"));
        assert!(!classic.contains("# EOF"), "{classic}");
        // Only the counters' metadata lines differ; every sample is kept.
        let samples = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&classic), samples(&openmetrics));
    }

    /// Every `workspace_gc_*` name the shipped alerts and dashboard mention is one the daemon
    /// exports once each metric has recorded something: a labelled counter appears only then, so
    /// a live scrape cannot show them all.
    #[test]
    fn every_metric_the_shipped_alerts_and_dashboard_read_is_exported() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let key = ObjectKey::new("team-a", "one");
        let protected = Verdict::Protected {
            reason: Reason::InUse,
        };
        metrics.track(&key, Some((&protected, 1024)));
        metrics.deletion("team-a", Reason::Orphaned, DeleteResult::Deleted);
        metrics.would_delete("team-a", Reason::Orphaned);
        metrics.reclaimed(1024, false, Some(1.0));
        metrics.reconciled(0.001);
        metrics.api_error(Operation::Watch, &kube::Error::TlsRequired);
        metrics.watch_restart(Kind::Claims);
        metrics.cached([(Kind::Claims, 1)]);
        metrics.kind_served(Kind::TaskRuns, Served::Preferred);
        metrics.revocation(Revoked::NotRevoked);
        metrics.set_leader(true);
        metrics.set_ready(true);
        metrics.set_capped(true);
        metrics.set_clock_offset(-0.5, 0.5);
        metrics.quota_ratios(
            "team-a",
            &[quota("storage", crate::decide::quota::Resource::Storage)],
        );
        let text = classic_text(&exposition(&registry));
        let shipped = concat!(
            include_str!("../../manifests/components/prometheus/prometheusrule.yaml"),
            include_str!("../../manifests/components/prometheus/dashboard.json"),
        );
        let mut read = 0;
        for (at, _) in shipped.match_indices("workspace_gc_") {
            let tail = &shipped[at..];
            let name = &tail[..tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len())];
            // The prefix alone: a comment about `workspace_gc_*`.
            if name == "workspace_gc_" {
                continue;
            }
            let exported = text.lines().any(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with([' ', '{']))
            });
            assert!(exported, "{name} is read but not exported:\n{text}");
            read += 1;
        }
        assert!(read > 10, "the shipped rules and dashboard read metrics");
    }

    fn quota(name: &str, resource: crate::decide::quota::Resource) -> QuotaEntry {
        QuotaEntry {
            key: ObjectKey::new("team-a", name),
            uid: name.into(),
            limits: vec![crate::decide::quota::Limit {
                resource,
                hard: 4,
                used: 3,
            }],
        }
    }

    #[test]
    fn quota_ratios_take_the_highest_class_and_drop_what_is_gone() {
        use crate::decide::quota::Resource;
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let mut classes = quota("classes", Resource::ClassClaims("fast".into()));
        classes.limits.push(crate::decide::quota::Limit {
            resource: Resource::ClassClaims("slow".into()),
            hard: 4,
            used: 4,
        });
        metrics.quota_ratios("team-a", &[quota("storage", Resource::Storage), classes]);
        assert_samples(
            &exposition(&registry),
            "workspace_gc_quota_used_ratio",
            [
                "workspace_gc_quota_used_ratio{claim_namespace=\"team-a\",quota=\"classes\",resource=\"storageclass.storage.k8s.io/persistentvolumeclaims\"} 1.0",
                "workspace_gc_quota_used_ratio{claim_namespace=\"team-a\",quota=\"storage\",resource=\"requests.storage\"} 0.75",
            ],
        );
        metrics.quota_ratios("team-a", &[]);
        assert!(samples(&exposition(&registry), "workspace_gc_quota_used_ratio").is_empty());
    }

    #[test]
    fn claims_and_bytes_follow_each_claim_by_namespace_and_drop_empty_series() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let delete = Verdict::Delete {
            reason: Reason::Orphaned,
            due_at: None,
        };
        let protected = Verdict::Protected {
            reason: Reason::InUse,
        };
        let a1 = ObjectKey::new("team-a", "one");
        let a2 = ObjectKey::new("team-a", "two");
        let b1 = ObjectKey::new("team-b", "one");
        metrics.track(&a1, Some((&delete, 1024)));
        metrics.track(&a2, Some((&delete, 2048)));
        metrics.track(&b1, Some((&protected, 512)));
        let text = exposition(&registry);
        assert_samples(
            &text,
            "workspace_gc_claims",
            [
                "workspace_gc_claims{claim_namespace=\"team-a\",state=\"delete\",reason=\"orphaned\"} 2",
                "workspace_gc_claims{claim_namespace=\"team-b\",state=\"protected\",reason=\"in-use\"} 1",
            ],
        );
        assert_samples(
            &text,
            "workspace_gc_tracked_bytes",
            [
                "workspace_gc_tracked_bytes{claim_namespace=\"team-a\",state=\"delete\",reason=\"orphaned\"} 3072",
                "workspace_gc_tracked_bytes{claim_namespace=\"team-b\",state=\"protected\",reason=\"in-use\"} 512",
            ],
        );

        // A verdict that changes moves the claim; the namespace's last claim takes its series.
        metrics.track(&a1, Some((&protected, 1024)));
        metrics.track(&b1, None);
        let text = exposition(&registry);
        assert_samples(
            &text,
            "workspace_gc_claims",
            [
                "workspace_gc_claims{claim_namespace=\"team-a\",state=\"delete\",reason=\"orphaned\"} 1",
                "workspace_gc_claims{claim_namespace=\"team-a\",state=\"protected\",reason=\"in-use\"} 1",
            ],
        );
        assert_samples(
            &text,
            "workspace_gc_tracked_bytes",
            [
                "workspace_gc_tracked_bytes{claim_namespace=\"team-a\",state=\"delete\",reason=\"orphaned\"} 2048",
                "workspace_gc_tracked_bytes{claim_namespace=\"team-a\",state=\"protected\",reason=\"in-use\"} 1024",
            ],
        );
    }
}
