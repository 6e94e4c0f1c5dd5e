//! What the run prints once it is over: the workload and the faults it met, the claims'
//! fates, the reclaim lag, the cap, the audit log and its invariant, and the verdict's lines.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::faults::Faults;
use crate::judge::Verdict;
use crate::replicas::Replica;
use crate::world::World;
use crate::{BOUND, CAP, WINDOW};
use testkit::metric_sum;
use testkit::stats::percentile;

/// When the run's phases began and ended, and the seed of its choices.
pub struct Run {
    pub seed: u64,
    pub started: DateTime<Utc>,
    pub workload_end: DateTime<Utc>,
    /// When every claim had been made collectable, before the drain.
    pub settled: DateTime<Utc>,
    pub checked_at: DateTime<Utc>,
}

/// Prints the report of a run.
pub fn print(run: &Run, world: &World, faults: &Faults, verdict: &Verdict) {
    let restarts = |fault: &str| faults.windows.iter().filter(|w| w.fault == fault).count();
    // A count: summed as one, since a float sum of nothing prints as -0.
    let watch_restarts: u64 = faults
        .replicas
        .iter()
        .map(|r| metric_sum(&r.metrics, "workspace_gc_watch_restarts_total").round() as u64)
        .sum();
    let created = world.incarnations.len();
    let Verdict {
        audit_events,
        claim_deletes,
        refused_deletes,
        wrong,
        twice,
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
        daemon_deletes,
        busiest,
        invariant,
        violations,
    } = verdict;
    println!();
    println!(
        "soak: seed {}; workload {} s, drain {} s after settling at {}",
        run.seed,
        (run.workload_end - run.started).num_seconds(),
        (run.checked_at - run.settled).num_seconds(),
        run.settled.format("%H:%M:%S")
    );
    println!(
        "soak: driver actions: {:?}; failed calls: {}",
        world.actions, world.failures
    );
    println!(
        "soak: faults: {} apiserver restarts, {} etcd restarts, {} compactions, {} partitions, {} stalls, {} leader kills, {} restart storms, {} throttling bursts, {} held-and-forwarded, {} delete-protocol; {} daemon crashes",
        restarts("apiserver-restart"),
        restarts("etcd-restart"),
        restarts("compaction"),
        restarts("partition"),
        restarts("stall"),
        restarts("leader-kill"),
        restarts("restart-storm"),
        restarts("throttle"),
        restarts("hold"),
        restarts("delete-protocol"),
        faults.crashes
    );
    let forwarded = faults.forwarded();
    let count = |resource: &str, landed: bool| {
        (forwarded.iter())
            .filter(|f| f.request.resource == resource && (200..300).contains(&f.status) == landed)
            .count()
    };
    println!(
        "soak: held and forwarded late: {} claim DELETEs refused by the server, {} that landed (checked as any delete); {} Lease writes refused, {} taken",
        count("persistentvolumeclaims", false),
        count("persistentvolumeclaims", true),
        count("leases", false),
        count("leases", true)
    );
    let faulted: i64 = faults
        .windows
        .iter()
        .map(|w| (w.end - w.start).num_seconds())
        .sum();
    println!("soak: {faulted} s of the workload under a fault");
    println!(
        "soak: claims: {created} incarnations; deleted by the daemon {daemon_deletes}, by the driver {}; {by_gc} successful delete calls by the garbage collector; still there at the end: {still_kept} kept, {pending} deletable within their allowance ({BOUND} s, plus the cap's time for the claims ahead)",
        world
            .incarnations
            .iter()
            .filter(|i| i.driver_deleted)
            .count()
    );
    println!(
        "soak: daemon deletes refused: {conflicts} conflict (409), {not_found} not found (404), {other_codes} other; {unmapped} unmapped; {ambiguous} decided during an in-flight change (legitimate either way)"
    );
    println!(
        "soak: reclaim lag after a claim became deletable: p50 {:.2} s, p95 {:.1} s, max {:.1} s ({} deletes)",
        percentile(lags, 0.50).unwrap_or(0.0),
        percentile(lags, 0.95).unwrap_or(0.0),
        lags.last().copied().unwrap_or(0.0),
        lags.len()
    );
    println!(
        "soak: watch restarts counted by the replicas (last lives): {watch_restarts}; replica spawns: {:?}",
        faults
            .replicas
            .iter()
            .map(|r| (r.name, r.spawns))
            .collect::<Vec<_>>()
    );
    println!(
        "soak: most deletions in any {WINDOW} s window: {busiest} (cap {CAP}){}",
        if verdict.cap_exceeded() {
            " CAP EXCEEDED"
        } else {
            ""
        }
    );
    println!(
        "soak: audit log: {} events, {} claim DELETEs{}; {} claims went away without one",
        audit_events,
        claim_deletes,
        if verdict.audit_empty() {
            ", NONE of them a successful one by the daemon"
        } else {
            ""
        },
        unaudited.len()
    );
    let refused_by = |r: &Replica| r.proxy.refused();
    println!(
        "soak: the proxies refused {:?} requests, {} of them DELETE attempts",
        faults
            .replicas
            .iter()
            .map(|r| (r.name, refused_by(r)))
            .collect::<Vec<_>>(),
        refused_deletes
    );
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for violation in violations {
        *by_kind.entry(format!("{:?}", violation.kind)).or_default() += 1;
    }
    println!(
        "soak: audit-log invariant (renew deadline {:?}, re-check bound {:?}): {} violations {by_kind:?}",
        invariant.renew_deadline,
        invariant.bound,
        violations.len()
    );
    for violation in violations.iter().take(40) {
        println!("soak:   {violation}");
    }
    println!(
        "soak: WRONG deletions: {}; deleted twice: {}; MISSED deletions: {}; tainted: {}",
        wrong.len(),
        twice,
        missed.len(),
        world.incarnations.iter().filter(|i| i.tainted).count()
    );
    for line in wrong.iter().chain(missed).chain(unaudited.iter().take(20)) {
        println!("soak:   {line}");
    }
}
