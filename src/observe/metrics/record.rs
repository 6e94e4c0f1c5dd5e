//! What the daemon records: one method a fact (a verdict, a delete, an API error, a watch
//! restart), each moving its families. Apart from the families' registration (`mod.rs`),
//! which runs once, because these run on every reconcile and hold the rules for what a series
//! keeps (a claim's gauges move with its verdict, a gone quota's series go).

use std::collections::HashMap;
use std::time::Duration;

use super::ServedState as Served;
use super::labels::RETRYING_AT_LEAST;
use super::{
    ApiErrorLabels, AtLeastLabels, BoundLabels, CategoryLabels, ClaimLabels, DeleteResult,
    DeletionLabels, ErrorCategory, Kind, KindLabels, LedgerFault, LedgerFaultLabels, LedgerRead,
    Mark, Metrics, Operation, QueueState, QuotaLabels, RecheckLabels, ResultLabels, Revoked,
    ServedLabels, StateLabels, Sweep, Tracked, Unresolved, WouldDeleteLabels,
};
use crate::decide::facts::ObjectKey;
use crate::decide::policy::{Reason, Verdict};
use crate::decide::quota::QuotaEntry;

impl Metrics {
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

    pub fn volume_sweep(&self, result: Sweep) {
        (self.volume_sweeps)
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

    /// How many claims the work queue holds in each state.
    pub fn queue_depth(&self, ready: usize, running: usize, scheduled: usize) {
        for (state, count) in [
            (QueueState::Ready, ready),
            (QueueState::Running, running),
            (QueueState::Scheduled, scheduled),
        ] {
            let state = state.as_str();
            (self.queue_depth.get_or_create(&StateLabels { state })).set(gauge_value(count));
        }
    }

    /// How long the ready claim due the longest has waited, and the longest reconcile running
    /// has run (zero when none).
    pub fn queue_ages(&self, oldest_due: Duration, longest_running: Duration) {
        self.queue_oldest_due.set(oldest_due.as_secs_f64());
        (self.queue_longest_running).set(longest_running.as_secs_f64());
    }

    /// A claim put in the work queue.
    pub fn queue_added(&self) {
        self.queue_adds.inc();
    }

    /// A reconcile started, `waited` after its claim fell due.
    pub fn queue_waited(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// A claim concluded after `attempts` reconciles, the earlier ones failed.
    pub fn queue_settled(&self, attempts: u32) {
        self.queue_settle_attempts.observe(attempts.into());
    }

    /// The failures in a row of each claim that is failing, counted against each threshold.
    pub fn queue_retrying(&self, failures: impl IntoIterator<Item = u32>) {
        let mut counts = [0usize; RETRYING_AT_LEAST.len()];
        for failures in failures {
            for (count, (threshold, _)) in counts.iter_mut().zip(RETRYING_AT_LEAST) {
                *count += usize::from(failures >= threshold);
            }
        }
        for (count, (_, at_least)) in counts.into_iter().zip(RETRYING_AT_LEAST) {
            let labels = AtLeastLabels { at_least };
            self.queue_retrying
                .get_or_create(&labels)
                .set(gauge_value(count));
        }
    }

    /// How many claim DELETEs stand unresolved in each state.
    pub fn deletes_unresolved(&self, counts: impl IntoIterator<Item = (Unresolved, usize)>) {
        for (state, count) in counts {
            let state = state.as_str();
            (self
                .deletes_unresolved
                .get_or_create(&StateLabels { state }))
            .set(gauge_value(count));
        }
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
            self.cached_objects
                .get_or_create(&KindLabels {
                    kind: kind.as_str(),
                })
                .set(gauge_value(size));
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

    pub fn set_label_guard_installed(&self, installed: bool) {
        self.label_guard_installed.set(installed.into());
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

    pub fn set_clock_disputed(&self, disputed: bool) {
        self.blast_radius_clock_disputed.set(disputed.into());
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

    pub fn standby_ledger_read(&self, result: LedgerRead) {
        (self.standby_ledger_reads)
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }
}

/// A count as a gauge's value.
fn gauge_value(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
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
    use prometheus_client::registry::Registry;

    use super::super::tests::{assert_samples, exposition, quota, samples};
    use super::*;

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
