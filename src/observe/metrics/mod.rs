//! Prometheus metrics, registered once. Every label comes from a bounded enum (reason, state,
//! result, error category, cache kind, quota resource) or is the claim's namespace; never an
//! object name, except a ResourceQuota's: a namespace holds a handful, set by its admins.
//!
//! The claim's namespace is `claim_namespace`, never `namespace`: a Prometheus that does not
//! honor the target's labels (OpenShift's user-workload monitoring) overwrites `namespace` with
//! the daemon's own, which would merge every claim namespace into one series.
//!
//! This file holds the families: their label sets, and each registered once with its help.
//! Apart from it: `labels.rs` (the bounded values a label takes) and `record.rs` (what the
//! daemon records, one method a fact, each moving its families).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::decide::facts::ObjectKey;

mod labels;
mod record;

pub use labels::{
    DeleteResult, ErrorCategory, Kind, LedgerFault, LedgerRead, Mark, Operation, QueueState,
    Revoked, ServedState, Sweep, Unresolved,
};

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServedLabels {
    kind: &'static str,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AtLeastLabels {
    at_least: &'static str,
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
    volume_sweeps: Family<ResultLabels, Counter>,
    revocations: Family<ResultLabels, Counter>,
    deletes_late: Counter,
    reconcile_duration: Histogram,
    reclaim_lag: Histogram,
    api_errors: Family<ApiErrorLabels, Counter>,
    rechecks: Family<RecheckLabels, Counter>,
    reconcile_retries: Family<CategoryLabels, Counter>,
    queue_depth: Family<StateLabels, Gauge>,
    queue_oldest_due: Gauge<f64, AtomicU64>,
    queue_longest_running: Gauge<f64, AtomicU64>,
    queue_wait: Histogram,
    queue_adds: Counter,
    queue_settle_attempts: Histogram,
    queue_retrying: Family<AtLeastLabels, Gauge>,
    deletes_unresolved: Family<StateLabels, Gauge>,
    watch_restarts: Family<KindLabels, Counter>,
    cached_objects: Family<KindLabels, Gauge>,
    kind_served: Family<ServedLabels, Gauge>,
    leader: Gauge,
    label_guard_installed: Gauge,
    ready: Gauge,
    blast_radius_capped: Gauge,
    blast_radius_cap_reached: Counter,
    blast_radius_unknown: Gauge,
    blast_radius_clock_disputed: Gauge,
    blast_radius_ledger_faults: Family<LedgerFaultLabels, Counter>,
    standby_ledger_reads: Family<ResultLabels, Counter>,
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
            volume_sweeps: Family::default(),
            revocations: Family::default(),
            deletes_late: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            reclaim_lag: Histogram::new([0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
            api_errors: Family::default(),
            rechecks: Family::default(),
            reconcile_retries: Family::default(),
            queue_depth: Family::default(),
            queue_oldest_due: Gauge::default(),
            queue_longest_running: Gauge::default(),
            queue_wait: Histogram::new([
                0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
            ]),
            queue_adds: Counter::default(),
            queue_settle_attempts: Histogram::new([1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0]),
            queue_retrying: Family::default(),
            deletes_unresolved: Family::default(),
            watch_restarts: Family::default(),
            cached_objects: Family::default(),
            kind_served: Family::default(),
            leader: Gauge::default(),
            label_guard_installed: Gauge::default(),
            ready: Gauge::default(),
            blast_radius_capped: Gauge::default(),
            blast_radius_cap_reached: Counter::default(),
            blast_radius_unknown: Gauge::default(),
            blast_radius_clock_disputed: Gauge::default(),
            blast_radius_ledger_faults: Family::default(),
            standby_ledger_reads: Family::default(),
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
            "volume_sweeps",
            "Looks at every PersistentVolume for Released ones to delete \
             (deletion.released_volume_ttl), by result: completed, unlisted (the list failed) or \
             interrupted (a DELETE failed; the rest wait for the next sweep)",
            metrics.volume_sweeps.clone(),
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
            "queue_depth",
            "Claims in the work queue, by state: ready (due, waiting for a worker), running (being \
             reconciled) or scheduled (waiting for a later instant: a deadline or a backoff)",
            metrics.queue_depth.clone(),
        );
        r.register(
            "queue_oldest_due_seconds",
            "How long the ready claim due the longest has waited for a worker; 0 when none waits",
            metrics.queue_oldest_due.clone(),
        );
        r.register(
            "queue_longest_running_seconds",
            "How long the reconcile running the longest has run; 0 when none runs",
            metrics.queue_longest_running.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Time from a claim falling due to its reconcile starting",
            metrics.queue_wait.clone(),
        );
        r.register(
            "queue_adds",
            "Claims put in the work queue: due, and not already waiting to run",
            metrics.queue_adds.clone(),
        );
        r.register(
            "queue_settle_attempts",
            "Reconciles a claim took to conclude, counted when one concludes (1: the first try; \
             more: failures in a row before it)",
            metrics.queue_settle_attempts.clone(),
        );
        r.register(
            "queue_retrying_claims",
            "Claims whose last reconciles failed at least `at_least` times in a row",
            metrics.queue_retrying.clone(),
        );
        r.register(
            "deletes_unresolved",
            "Claim DELETEs neither answered nor revoked, by state: sending (named on the Lease, \
             sent or about to be), unanswered (no definite answer: it may still land until \
             revoked) or found (named on the Lease this replica won)",
            metrics.deletes_unresolved.clone(),
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
            "label_guard_installed",
            "1 while the API server holds the label guard (workspace-gc-label-guard, its policy \
             and a Deny binding), read every minute; 0 when it is absent or cannot be read: \
             then the claims' managedFields record alone tells a build workspace from a claim \
             labelled later",
            metrics.label_guard_installed.clone(),
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
            "blast_radius_clock_disputed",
            "1 while the blast-radius cap admits no deletion because answers of the API server \
             disagreed about its clock beyond the tolerance within the last window: the cap's \
             window is counted as full",
            metrics.blast_radius_clock_disputed.clone(),
        );
        r.register(
            "blast_radius_ledger_faults",
            "Deletion ledgers on the Lease not taken as they were, by fault: unreadable or \
             implausible ones count as a full window, one changed or lost while leading is \
             written back",
            metrics.blast_radius_ledger_faults.clone(),
        );
        r.register(
            "standby_ledger_reads",
            "Lease reads while standing by, by result: remembered (the Lease had a deletion \
             ledger, kept to be written on the Lease should it be created again) or absent (none; \
             the last one read stays remembered)",
            metrics.standby_ledger_reads.clone(),
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
        // Every series of the bounded gauges from the start: a panel or alert reads 0, not
        // nothing, before the first sample.
        metrics.queue_depth(0, 0, 0);
        metrics.queue_retrying(std::iter::empty());
        metrics.deletes_unresolved(Unresolved::ALL.map(|state| (state, 0)));
        metrics
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

#[cfg(test)]
pub(crate) mod tests {
    use prometheus_client::encoding::text::encode;

    use super::ServedState as Served;
    use super::*;
    use crate::decide::policy::{Reason, Verdict};
    use crate::decide::quota::QuotaEntry;

    pub(super) fn quota(name: &str, resource: crate::decide::quota::Resource) -> QuotaEntry {
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

    pub(crate) fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    /// The samples of `name`, sorted: a family prints its series in no particular order.
    pub(super) fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let prefix = format!("{name}{{");
        let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
        lines.sort_unstable();
        lines
    }

    pub(super) fn assert_samples(text: &str, name: &str, expected: [&str; 2]) {
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
        metrics.reconcile_retry("throttled");
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
            include_str!("../../../manifests/components/prometheus/prometheusrule.yaml"),
            include_str!("../../../manifests/components/prometheus/dashboard.json"),
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
}
