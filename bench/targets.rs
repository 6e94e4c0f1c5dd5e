//! The benchmark's targets, in one table: each promise, its bound, and how a run's figures
//! measure it. Pure; report.rs renders the verdicts, and tests/bench_figures.rs runs the unit
//! tests. Why a target is missed is explained in docs/performance.md, where it is kept true.

use crate::results::{Counts, Role, SizeResult, Steady};
use crate::statistics::{
    LagStats, group, lag_stats, per_claim, ratio, reads_per_claim, writes_per_claim,
};

/// The size most targets are set at.
pub const REFERENCE_N: usize = 10_000;

const MIB: f64 = 1024.0 * 1024.0;

/// The lag target (burst and churn) and the churn's read target, which the lag-against-reads
/// figure also draws.
pub const LAG_P99_S: f64 = 0.25;
pub const CHURN_READS_PER_CLAIM: f64 = 1.0;

pub const TARGETS: &[Target] = &[
    Target {
        promise: "memory: peak RSS below 64 MiB at N = 10,000",
        bound: Bound::Below(64.0),
        measure: peak_rss_mib,
    },
    Target {
        promise: "scale: ready (start to synced) below 10 s at the largest size",
        bound: Bound::Below(10.0),
        measure: ready_at_largest_s,
    },
    Target {
        promise: "scale: ready at most 1.3× the plain client's time for the same lists, at \
                  every size",
        bound: Bound::AtMost(1.3),
        measure: ready_over_plain_lists,
    },
    Target {
        promise: "burst: lag p99 below 0.25 s, every claim reclaimed",
        bound: Bound::Below(LAG_P99_S),
        measure: burst_lag_p99_s,
    },
    Target {
        promise: "burst: at most 1 DELETE per reclaimed claim",
        bound: Bound::AtMost(1.0),
        measure: burst_deletes_per_claim,
    },
    Target {
        promise: "burst: at most 2 reads (GET + LIST) per reclaimed claim",
        bound: Bound::AtMost(2.0),
        measure: burst_reads_per_claim,
    },
    Target {
        promise: "burst: at most 2.1 writes (DELETE, Event, Lease) per reclaimed claim",
        bound: Bound::AtMost(2.1),
        measure: burst_writes_per_claim,
    },
    Target {
        promise: "churn: lag p99 below 0.25 s, every claim reclaimed",
        bound: Bound::Below(LAG_P99_S),
        measure: churn_lag_p99_s,
    },
    Target {
        promise: "churn: at most 1.0 read (GET + LIST) per reclaimed claim",
        bound: Bound::AtMost(CHURN_READS_PER_CLAIM),
        measure: churn_reads_per_claim,
    },
    Target {
        promise: "churn: at most 2.1 writes (DELETE, Event, Lease) per reclaimed claim",
        bound: Bound::AtMost(2.1),
        measure: churn_writes_per_claim,
    },
    Target {
        promise: "churn: at most 100 KiB of LIST answers per reclaimed claim",
        bound: Bound::AtMost(100.0),
        measure: churn_list_kib_per_claim,
    },
    Target {
        promise: "churn: API server CPU per reclaimed claim at most the Kubernetes GC's",
        bound: Bound::AtMostMeasured,
        measure: churn_apiserver_cpu_per_claim_s,
    },
    Target {
        promise: "idle: no request but its Lease and watch renewals, nothing listed",
        bound: Bound::AtMost(0.0),
        measure: idle_other_requests,
    },
];

/// A promise the benchmark checks.
pub struct Target {
    /// As the report's row states it.
    pub promise: &'static str,
    pub bound: Bound,
    /// The value, in the unit the promise names, with the figures it comes from; `None` when
    /// the run did not measure it (no such size or phase).
    pub measure: fn(&[SizeResult]) -> Option<Reading>,
}

/// What the measured value must stay within.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    Below(f64),
    AtMost(f64),
    /// At most a value measured in the same run (the reading carries it).
    AtMostMeasured,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub value: f64,
    /// The value measured against, for [`Bound::AtMostMeasured`].
    pub against: Option<f64>,
    /// The value and the figures behind it, as the report shows them.
    pub shown: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    NotMeasured,
}

/// One row of the targets table.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub promise: &'static str,
    pub shown: String,
    pub verdict: Verdict,
}

impl Bound {
    pub fn holds(self, reading: &Reading) -> bool {
        match self {
            Bound::Below(limit) => reading.value < limit,
            Bound::AtMost(limit) => reading.value <= limit + 1e-9,
            Bound::AtMostMeasured => reading
                .against
                .is_some_and(|against| reading.value <= against + 1e-9),
        }
    }
}

/// Every target against the run's figures, in the table's order.
pub fn judge(sizes: &[SizeResult]) -> Vec<Judged> {
    TARGETS
        .iter()
        .map(|target| match (target.measure)(sizes) {
            Some(reading) => Judged {
                promise: target.promise,
                verdict: if target.bound.holds(&reading) {
                    Verdict::Met
                } else {
                    Verdict::Missed
                },
                shown: reading.shown,
            },
            None => Judged {
                promise: target.promise,
                shown: "not measured in this run".into(),
                verdict: Verdict::NotMeasured,
            },
        })
        .collect()
}

/// The size the targets are set at: N = 10,000, else the largest size that ran every phase.
pub fn reference(sizes: &[SizeResult]) -> Option<&SizeResult> {
    sizes
        .iter()
        .rev()
        .find(|r| r.n == REFERENCE_N)
        .or_else(|| sizes.iter().filter(|r| r.full).max_by_key(|r| r.n))
}

fn reading(value: f64, shown: String) -> Option<Reading> {
    Some(Reading {
        value,
        against: None,
        shown,
    })
}

/// A lag percentile that counts as missed when a claim was not reclaimed.
fn lag_reading(stats: LagStats) -> Option<Reading> {
    let p99 = stats.p99?;
    if stats.complete() {
        reading(p99, format!("{p99:.3} s"))
    } else {
        reading(
            f64::INFINITY,
            format!(
                "{p99:.3} s, {} of {} not reclaimed",
                stats.events - stats.reclaimed,
                stats.events
            ),
        )
    }
}

fn peak_rss_mib(sizes: &[SizeResult]) -> Option<Reading> {
    let r = sizes.iter().find(|r| r.n == REFERENCE_N)?;
    let d = r.daemon()?;
    let peak = d.at_end?.hwm_kib as f64 * 1024.0 / MIB;
    let cached = d
        .tracked
        .map(|t| format!(" ({} objects cached)", group(t as usize)))
        .unwrap_or_default();
    reading(peak, format!("{peak:.1} MiB{cached}"))
}

fn ready_at_largest_s(sizes: &[SizeResult]) -> Option<Reading> {
    let r = sizes.iter().max_by_key(|r| r.n)?;
    let ready = r.daemon()?.ready_s?;
    let lean = if r.pods_per_build == 1 {
        ", one pod per build"
    } else {
        ""
    };
    reading(ready, format!("{ready:.2} s at N = {}{lean}", group(r.n)))
}

/// The daemon's ready over the plain client's time for the same lists, at every size that
/// measured both: the largest ratio is the value, each size's is shown.
fn ready_over_plain_lists(sizes: &[SizeResult]) -> Option<Reading> {
    let ratios: Vec<(f64, String)> = sizes
        .iter()
        .filter_map(|r| {
            let d = r.daemon()?;
            let (ready, plain) = (d.ready_s?, d.plain_lists.as_ref()?.wall_s);
            let times = ratio(ready, plain)?;
            let shown = format!(
                "{times:.2}× at N = {} ({ready:.2} s against {plain:.2} s)",
                group(r.n)
            );
            Some((times, shown))
        })
        .collect();
    let worst = ratios.iter().map(|(times, _)| *times).reduce(f64::max)?;
    let shown: Vec<String> = ratios.into_iter().map(|(_, shown)| shown).collect();
    reading(worst, shown.join("; "))
}

fn burst_lag_p99_s(sizes: &[SizeResult]) -> Option<Reading> {
    lag_reading(lag_stats(&reference(sizes)?.daemon()?.lags, None))
}

fn burst_deletes_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let d = reference(sizes)?.daemon()?;
    let deletes = per_claim(d.steady.verb("delete") as f64, d.reclaimed())?;
    reading(deletes, format!("{deletes:.2}"))
}

fn burst_reads_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let d = reference(sizes)?.daemon()?;
    reads_reading(&d.steady, d.reclaimed())
}

fn burst_writes_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let d = reference(sizes)?.daemon()?;
    writes_reading(&d.steady, d.reclaimed())
}

fn churn_writes_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let churn = reference(sizes)?.daemon()?.churn.as_ref()?;
    writes_reading(&churn.requests, churn.reclaimed())
}

/// Writes per reclaimed claim, with the DELETEs, the Events and the Lease's writes apart.
fn writes_reading(requests: &Counts, reclaimed: usize) -> Option<Reading> {
    let writes = writes_per_claim(requests, reclaimed)?;
    let of = |count: u64| count as f64 / reclaimed as f64;
    let lease = requests.lease("patch") + requests.lease("update") + requests.lease("create");
    let events = requests
        .by_verb_resource
        .get("create events")
        .copied()
        .unwrap_or(0);
    reading(
        writes,
        format!(
            "{writes:.2} (DELETE {:.2}, Event {:.2}, Lease {:.2})",
            of(requests.verb("delete")),
            of(events),
            of(lease)
        ),
    )
}

fn churn_lag_p99_s(sizes: &[SizeResult]) -> Option<Reading> {
    let churn = reference(sizes)?.daemon()?.churn.as_ref()?;
    lag_reading(lag_stats(&churn.lags, None))
}

fn churn_reads_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let churn = reference(sizes)?.daemon()?.churn.as_ref()?;
    reads_reading(&churn.requests, churn.reclaimed())
}

/// Reads per reclaimed claim, with the GETs and LISTs apart.
fn reads_reading(requests: &Counts, reclaimed: usize) -> Option<Reading> {
    let reads = reads_per_claim(requests, reclaimed)?;
    let gets = per_claim(
        requests.verb("get") as f64 - requests.lease("get") as f64,
        reclaimed,
    )?;
    let lists = per_claim(requests.verb("list") as f64, reclaimed)?;
    reading(
        reads,
        format!(
            "{reads:.2} (GET {gets:.2}, LIST {lists:.2}: {} namespaced, {} cluster-wide)",
            requests.namespaced_lists, requests.cluster_lists
        ),
    )
}

fn churn_list_kib_per_claim(sizes: &[SizeResult]) -> Option<Reading> {
    let churn = reference(sizes)?.daemon()?.churn.as_ref()?;
    let kib = per_claim(churn.list_bytes / 1024.0, churn.reclaimed())?;
    reading(kib, format!("{kib:.1} KiB"))
}

fn churn_apiserver_cpu_per_claim_s(sizes: &[SizeResult]) -> Option<Reading> {
    let r = reference(sizes)?;
    let cpu = |churn: &Steady| per_claim(churn.apiserver_cpu_s, churn.reclaimed());
    let ours = cpu(r.daemon()?.churn.as_ref()?)?;
    let gc = cpu(r.baseline(Role::Gc)?.churn.as_ref()?)?;
    Some(Reading {
        value: ours,
        against: Some(gc),
        shown: format!("{ours:.3} s against {gc:.3} s"),
    })
}

fn idle_other_requests(sizes: &[SizeResult]) -> Option<Reading> {
    let idle = reference(sizes)?.daemon()?.idle.as_ref()?;
    let requests = &idle.requests;
    let lease: u64 = requests
        .by_verb_resource
        .iter()
        .filter(|(key, _)| key.ends_with(" leases"))
        .map(|(_, n)| n)
        .sum();
    let watches = requests.verb("watch");
    let others = requests.total.saturating_sub(lease + watches);
    // Anything listed counts against it as much as another request does.
    reading(
        others as f64 + idle.list_bytes,
        format!(
            "{:.0} min: {} requests ({lease} on its Lease, {watches} watch renewals, {others} \
             others); {:.1} MiB listed",
            idle.window_s / 60.0,
            requests.total,
            idle.list_bytes / MIB
        ),
    )
}
