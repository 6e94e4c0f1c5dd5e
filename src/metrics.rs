//! Prometheus metrics, registered once. Every label comes from a bounded enum (reason, state,
//! result, error category, cache kind) or is the claim's namespace; never an object name.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::facts::ObjectKey;
use crate::policy::{Reason, Verdict};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeletionLabels {
    namespace: String,
    reason: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WouldDeleteLabels {
    namespace: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    operation: &'static str,
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// How a delete ended: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteResult {
    Deleted,
    /// Already gone: counts as done.
    NotFound,
    /// The claim changed or was re-created since the decision: re-evaluated.
    Conflict,
    Failed,
}

impl DeleteResult {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteResult::Deleted => "deleted",
            DeleteResult::NotFound => "not-found",
            DeleteResult::Conflict => "conflict",
            DeleteResult::Failed => "failed",
        }
    }
}

/// The bounded category of an API error: the `category` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCategory {
    Forbidden,
    Unauthorized,
    Conflict,
    NotFound,
    Throttled,
    ServerError,
    Connection,
    Other,
}

impl ErrorCategory {
    pub fn of(error: &kube::Error) -> Self {
        match error {
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
            ErrorCategory::Forbidden => "forbidden",
            ErrorCategory::Unauthorized => "unauthorized",
            ErrorCategory::Conflict => "conflict",
            ErrorCategory::NotFound => "not-found",
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::ServerError => "server-error",
            ErrorCategory::Connection => "connection",
            ErrorCategory::Other => "other",
        }
    }
}

/// The API call an error came from: the `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Watch,
    Get,
    List,
    Delete,
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
            Operation::Event => "event",
            Operation::Lease => "lease",
        }
    }
}

/// What the daemon last decided about a claim, so the `claims` gauges move, not accumulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tracked {
    labels: (&'static str, &'static str),
    bytes: u64,
}

pub struct Metrics {
    claims: Family<StateLabels, Gauge>,
    tracked_bytes: Gauge<u64, AtomicU64>,
    deletions: Family<DeletionLabels, Counter>,
    would_delete: Family<WouldDeleteLabels, Counter>,
    reclaimed_bytes: Counter,
    reconcile_duration: Histogram,
    reclaim_lag: Histogram,
    api_errors: Family<ApiErrorLabels, Counter>,
    watch_restarts: Family<KindLabels, Counter>,
    cached_objects: Family<KindLabels, Gauge>,
    leader: Gauge,
    ready: Gauge,
    blast_radius_capped: Gauge,
    blast_radius_cap_reached: Counter,
    blast_radius_unknown: Gauge,
    tracked: Mutex<HashMap<ObjectKey, Tracked>>,
}

impl Metrics {
    /// Builds the metrics and registers them under the `workspace_gc` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            claims: Family::default(),
            tracked_bytes: Gauge::default(),
            deletions: Family::default(),
            would_delete: Family::default(),
            reclaimed_bytes: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            reclaim_lag: Histogram::new([0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
            api_errors: Family::default(),
            watch_restarts: Family::default(),
            cached_objects: Family::default(),
            leader: Gauge::default(),
            ready: Gauge::default(),
            blast_radius_capped: Gauge::default(),
            blast_radius_cap_reached: Counter::default(),
            blast_radius_unknown: Gauge::default(),
            tracked: Mutex::default(),
        };
        let r = registry.sub_registry_with_prefix("workspace_gc");
        r.register(
            "claims",
            "Tracked claims by the state and reason of their last verdict",
            metrics.claims.clone(),
        );
        r.register(
            "tracked_bytes",
            "Storage requested by the tracked claims",
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
            "Storage requested by the claims deleted",
            metrics.reclaimed_bytes.clone(),
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
            "leader",
            "1 while this replica holds the lease and may delete",
            metrics.leader.clone(),
        );
        r.register(
            "ready",
            "1 while /readyz answers 200: synced once, and the API server reachable",
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
        metrics
    }

    /// Records the latest verdict for a claim (`None` once it is gone).
    pub fn track(&self, key: &ObjectKey, verdict: Option<(&Verdict, u64)>) {
        let mut tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        let new = verdict.map(|(verdict, bytes)| Tracked {
            labels: (verdict.state().as_str(), verdict.reason().as_str()),
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
            self.claims.get_or_create(&state_labels(old)).dec();
            self.tracked_bytes.dec_by(old.bytes);
        }
        if let Some(new) = new {
            self.claims.get_or_create(&state_labels(new)).inc();
            self.tracked_bytes.inc_by(new.bytes);
        }
    }

    pub fn deletion(&self, namespace: &str, reason: Reason, result: DeleteResult) {
        self.deletions
            .get_or_create(&DeletionLabels {
                namespace: namespace.to_owned(),
                reason: reason.as_str(),
                result: result.as_str(),
            })
            .inc();
    }

    pub fn reclaimed(&self, bytes: u64, lag_seconds: Option<f64>) {
        self.reclaimed_bytes.inc_by(bytes);
        if let Some(lag) = lag_seconds {
            self.reclaim_lag.observe(lag.max(0.0));
        }
    }

    pub fn would_delete(&self, namespace: &str, reason: Reason) {
        self.would_delete
            .get_or_create(&WouldDeleteLabels {
                namespace: namespace.to_owned(),
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

    pub fn watch_restart(&self, kind: &'static str) {
        self.watch_restarts
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    pub fn cached(&self, sizes: [(&'static str, usize); 4]) {
        for (kind, size) in sizes {
            let size = i64::try_from(size).unwrap_or(i64::MAX);
            self.cached_objects
                .get_or_create(&KindLabels { kind })
                .set(size);
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
}

fn state_labels(tracked: Tracked) -> StateLabels {
    StateLabels {
        state: tracked.labels.0,
        reason: tracked.labels.1,
    }
}
