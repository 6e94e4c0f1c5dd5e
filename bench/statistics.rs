//! Statistics of a run's figures: lag percentiles and distributions, costs per reclaimed claim,
//! the lag against the reads of each build, the memory line, and counts as the report writes
//! them. Pure; the report (report.rs) and the targets
//! (targets.rs) read the figures through these. Their unit tests run in tests/bench_figures.rs.

use crate::results::{Contender, Counts, EventKind, Role, SizeResult};
use testkit::stats::percentile;

/// Reclaim lags of one kind of event (or of all), in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagStats {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    pub reclaimed: usize,
    pub events: usize,
}

impl LagStats {
    /// Whether every event's claim was reclaimed.
    pub fn complete(&self) -> bool {
        self.reclaimed == self.events
    }
}

/// `lags` holds each event's kind and lag, `None` for a claim not reclaimed in the window: it
/// counts as an event but not in the percentiles.
pub fn lag_stats(lags: &[(EventKind, Option<f64>)], kind: Option<EventKind>) -> LagStats {
    let chosen: Vec<Option<f64>> = lags
        .iter()
        .filter(|(k, _)| kind.is_none_or(|want| *k == want))
        .map(|(_, lag)| *lag)
        .collect();
    let mut sorted: Vec<f64> = chosen.iter().flatten().copied().collect();
    sorted.sort_by(f64::total_cmp);
    LagStats {
        p50: percentile(&sorted, 0.50),
        p99: percentile(&sorted, 0.99),
        max: sorted.last().copied(),
        reclaimed: sorted.len(),
        events: chosen.len(),
    }
}

/// `total` per reclaimed claim; `None` when none was reclaimed.
pub fn per_claim(total: f64, reclaimed: usize) -> Option<f64> {
    (reclaimed > 0).then(|| total / reclaimed as f64)
}

/// Reads (GET and LIST) of the objects decisions rest on, per reclaimed claim: the Lease's
/// GETs are leader election, not a read of the cluster's state, and do not count.
pub fn reads_per_claim(counts: &Counts, reclaimed: usize) -> Option<f64> {
    let reads = counts.verb("get") + counts.verb("list") - counts.lease("get");
    per_claim(reads as f64, reclaimed)
}

/// The verbs that change the cluster: every write a contender sends (its DELETEs, its Events,
/// and its Lease's renewals and the writes that fence its deletes).
pub const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// Writes per reclaimed claim: every request with a verb of [`WRITES`], on any resource.
pub fn writes_per_claim(counts: &Counts, reclaimed: usize) -> Option<f64> {
    let writes: u64 = WRITES.iter().map(|verb| counts.verb(verb)).sum();
    per_claim(writes as f64, reclaimed)
}

/// The distribution of `lags` as steps: for each reclaimed claim, in order of lag, (its lag,
/// the share of all events reclaimed by then). A claim not reclaimed counts among the events
/// and has no step, so the curve ends below 1 by the share not reclaimed.
pub fn cdf(lags: &[(EventKind, Option<f64>)]) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = lags.iter().filter_map(|(_, lag)| *lag).collect();
    sorted.sort_by(f64::total_cmp);
    let events = lags.len() as f64;
    sorted
        .into_iter()
        .enumerate()
        .map(|(i, lag)| (lag, (i + 1) as f64 / events))
        .collect()
}

/// `part` as a multiple of `whole`; `None` without a positive whole.
pub fn ratio(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

/// One contender's churn, as a point of the lag against reads: what it read per reclaimed
/// claim, and how long a claim waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Tradeoff {
    pub name: String,
    pub role: Role,
    /// Reads (GET + LIST, the Lease's GETs left out) per reclaimed claim.
    pub reads: f64,
    /// Writes (every verb of [`WRITES`]) per reclaimed claim.
    pub writes: f64,
    pub lag: LagStats,
}

/// The churn of every contender at size `r` that reclaimed a claim in one (workspace-gc's
/// builds, those run in the churn alone included, and the baselines), in the order measured.
pub fn tradeoffs(r: &SizeResult) -> Vec<Tradeoff> {
    r.contenders
        .iter()
        .filter_map(|c: &Contender| {
            let churn = c.churn.as_ref()?;
            let reclaimed = churn.reclaimed();
            Some(Tradeoff {
                name: c.name.clone(),
                role: c.role,
                reads: reads_per_claim(&churn.requests, reclaimed)?,
                writes: writes_per_claim(&churn.requests, reclaimed)?,
                lag: lag_stats(&churn.lags, None),
            })
        })
        .collect()
}

/// workspace-gc's resident memory as a line through two sizes' readings right after the
/// initial sync: a base and a cost per cached object, and the most that reclaiming added.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryModel {
    pub bytes_per_object: f64,
    pub base_bytes: f64,
    /// The largest peak above the post-sync reading, over the sizes.
    pub in_flight_bytes: f64,
    /// (objects, N) of the two sizes the line goes through.
    pub points: [(f64, usize); 2],
}

impl MemoryModel {
    pub fn bytes_for(&self, objects: f64) -> f64 {
        self.base_bytes + self.bytes_per_object * objects + self.in_flight_bytes
    }
}

/// The line through the sizes with the fewest and the most cached objects; `None` with fewer
/// than two distinct sizes measured.
pub fn memory_model(sizes: &[SizeResult]) -> Option<MemoryModel> {
    // (objects cached, RSS after sync, peak RSS, N)
    let points: Vec<(f64, f64, f64, usize)> = sizes
        .iter()
        .filter_map(|r| {
            let d = r.daemon()?;
            Some((
                d.tracked? as f64,
                d.at_ready?.rss_kib as f64 * 1024.0,
                d.at_end?.hwm_kib as f64 * 1024.0,
                r.n,
            ))
        })
        .collect();
    let first = points.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
    let last = points.iter().max_by(|a, b| a.0.total_cmp(&b.0))?;
    if last.0 <= first.0 {
        return None;
    }
    let slope = (last.1 - first.1) / (last.0 - first.0);
    Some(MemoryModel {
        bytes_per_object: slope,
        base_bytes: first.1 - slope * first.0,
        in_flight_bytes: points.iter().map(|p| p.2 - p.1).fold(0.0, f64::max),
        points: [(first.0, first.3), (last.0, last.3)],
    })
}

/// A count as the report writes it, in groups of three digits: 47,280.
pub fn group(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
