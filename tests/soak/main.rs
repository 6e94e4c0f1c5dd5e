//! The randomized safety run: minutes of random workload against a dedicated control plane
//! with faults injected, then a check of every delete the daemon sent against the ground truth
//! this driver kept. Run it with `scripts/soak` (docs/reliability-history.md keeps each run's
//! figures): an ignored test, so `cargo test` builds it and CI skips it (it takes minutes).
//!
//! - **The cluster**: etcd, kube-apiserver (watch cache off, so that compacting etcd expires
//!   the resourceVersions watches resume from; an audit log of every claim delete) and
//!   kube-controller-manager (garbage collector, PVC protection).
//! - **The daemon**: two replicas of the real binary with leader election, with the shipped
//!   RBAC (manifests/base), each as its own ServiceAccount (bound by the shipped bindings) so
//!   that the audit log tells them apart, each through its own HTTP fault [`Proxy`]. With
//!   `--clock-offset`, the second runs under libfaketime with its wall clock that far off.
//! - **The workload**: builds created, finished, failed and deleted (job and run), claims owned
//!   by reference, orphan claims, pods starting and stopping on claims, the keep, ttl and
//!   expires annotations set and removed, invalid annotations, claims deleted and re-created
//!   under the same name.
//! - **The faults**: kube-apiserver killed and restarted, etcd killed and restarted, etcd
//!   compacted under both replicas, the leader alone partitioned, the leader's watches stalled
//!   silently, the leader killed with SIGKILL (and started again), and a restart storm: a
//!   burst of [`CAP`] claims due at once, then the leader killed and restarted again and again
//!   within one [`WINDOW`] of the tight blast-radius cap; throttling bursts on the leader's
//!   connection: its DELETEs, its live re-check LISTs or its Lease writes answered 429 with
//!   `Retry-After`, everything answered 503, its re-check LISTs answered too late to be live,
//!   or its DELETEs answered 503 by the hop without being forwarded; and held-and-forwarded
//!   requests: the leader's next claim DELETEs and a Lease write held by its hop and forwarded
//!   after the leader gave up on them, every other time with the leader paused (SIGSTOP) for
//!   longer than the lease, so that the other replica takes over and revokes them; and the
//!   delete protocol's ordinary faults: a validating webhook on claim DELETEs that is down
//!   (every DELETE answered 500, a refusal), the leader's DELETEs carried out with their answers
//!   lost, and its DELETEs refused by the hop with its revocations' answers lost (the retried
//!   revocation writes the value already there: no new resourceVersion, no event).
//! - **The ground truth**: for every claim incarnation (UID), the history of the states that
//!   decide its fate, each bracketed by the times before and after the API call that made it.
//!   Protections (a pod, `keep`, a later deadline) are only ever added to a claim that is not
//!   due and will not be for [`MARGIN`], so that a delete that races the change is not mistaken
//!   for a wrong one.
//! - **The check**: every delete in the API server's audit log sent by the daemon's
//!   ServiceAccounts that succeeded must name a claim that was due and unprotected at that moment
//!   (wrong deletions: zero), no claim may be deleted twice, every claim that has been due
//!   for [`BOUND`], plus the time the cap needs for the claims due before it and still there
//!   then (at [`CAP`] per [`WINDOW`]: the daemon cannot go faster, and serves the claim due
//!   first), must be gone (missed deletions: zero), and no rolling [`WINDOW`] may hold
//!   more than [`CAP`] of them (cap exceeded: never). Every claim that went away must have its
//!   successful DELETE in the audit log (an empty or partial log fails the run), and every
//!   DELETE the daemon sent must meet the audit-log invariant ([`DeleteInvariant`]: one that
//!   took effect came from the Lease holder within its renew deadline, after a live re-check
//!   within [`RECHECK_BOUND`], or else landed before the daemon revoked it, and never after;
//!   once per decision, counting the attempts the proxies refused). Exit status 1 otherwise.
//!
//! The modules, one part each: [`world`] the ground truth, [`load`] the load generator that
//! drives the workload and records it in the ground truth, [`replicas`] the daemon's identity
//! and replicas, [`faults`] the fault injector, [`judge`] the check of the audit log against
//! the ground truth, and [`report`] what the run prints.

mod faults;
mod judge;
mod load;
mod replicas;
mod report;
mod world;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Parser;
use testkit::{
    ControlPlane, ControlPlaneOptions, DEFAULT_RECHECK_BOUND, Proxy, TestNamespace, faketime,
    read_audit, service_account,
};
use tokio::sync::{Mutex, RwLock};

use crate::faults::Faults;
use crate::load::{Driver, Rng};
use crate::replicas::{Replica, install_daemon_identity};
use crate::world::World;

/// The daemon's policy in this run (set through its environment), and the same numbers for
/// the ground truth.
const TTL: i64 = 20;
const ORPHAN_GRACE: i64 = 30;
const MAX_AGE: i64 = 150;
/// A protection is added only to a claim not due for at least this long.
const MARGIN: i64 = 5;
/// The blast-radius cap: at most this many deletions in any rolling [`WINDOW`] seconds. Tight:
/// about twice the workload's usual rate, so a burst meets it.
const CAP: u32 = 30;
const WINDOW: i64 = 30;
/// A claim due (and unprotected) for this long must be gone: the longest fault (an API server
/// down for 15 s, then kube-runtime's watch backoff of up to 30 s) with room to spare, plus a
/// window in which the cap may hold it back.
const BOUND: i64 = 90 + WINDOW;
/// The replicas and their ServiceAccounts: the shipped one, and a second the shipped bindings
/// also name.
const REPLICAS: [(&str, &str); 2] = [
    ("replica-a", "workspace-gc"),
    ("replica-b", "workspace-gc-b"),
];
const NAMESPACES: [&str; 3] = ["soak-a", "soak-b", "soak-c"];
const LEASE_NAMESPACE: &str = "workspace-gc";
const LEASE_NAME: &str = "workspace-gc";
const LEASE_DURATION: Duration = Duration::from_secs(6);
/// How old the live re-check a DELETE rests on may be, by the API server's clock.
const RECHECK_BOUND: Duration = DEFAULT_RECHECK_BOUND;
/// Longer than [`RECHECK_BOUND`]: a re-check answered this late is not live.
const SLOW_LIST: Duration = Duration::from_secs(12);

/// The daemon's usernames, as the audit log names them.
fn daemon_users() -> Vec<String> {
    REPLICAS
        .iter()
        .map(|(_, account)| service_account(LEASE_NAMESPACE, account))
        .collect()
}

#[derive(Debug, Parser)]
#[command(about = "The randomized safety run; see RELIABILITY.md")]
struct Args {
    /// Minutes of random workload with faults.
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Seed of the random choices (the timing still varies from run to run).
    #[arg(long)]
    seed: Option<u64>,
    /// Workload actions per second.
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// A fault every N to 2N seconds.
    #[arg(long, default_value_t = 15)]
    fault_every: u64,
    /// Seconds to wait after the workload, once every claim has been made collectable.
    #[arg(long, default_value_t = 75)]
    drain: u64,
    /// Self-check of the check: run the daemon with half the orphan grace the ground truth
    /// assumes, so its orphan deletions come too early and the run must report them as wrong.
    #[arg(long)]
    sabotage: bool,
    /// Runs the second replica under libfaketime with its wall clock this far off
    /// (libfaketime's syntax: "+2h", "-90m").
    #[arg(long, allow_hyphen_values = true)]
    clock_offset: Option<String>,
}

fn now() -> DateTime<Utc> {
    Utc::now()
}

fn seconds(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

/// The soak's options come from `SOAK_ARGS` (the flags of [`Args`]), which `scripts/soak` sets
/// from its own command line. Run statuses written by hand: thousands of runs started and
/// finished on the soak's own schedule, which its ground truth must know exactly; real Tekton
/// would add pods and timing of its own.
#[test]
#[ignore = "minutes long; run by scripts/soak"]
fn randomized_safety_run() {
    let flags = std::env::var("SOAK_ARGS").unwrap_or_default();
    let args = Args::parse_from(std::iter::once("soak").chain(flags.split_whitespace()));
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    assert!(
        !runtime.block_on(soak(args)),
        "wrong, repeated or missed deletions, an exceeded cap, a crash, an audit log that misses deletions or a breach of its invariant: see the report above"
    );
}

/// Runs the soak and prints its report; true when it failed.
async fn soak(args: Args) -> bool {
    let seed = args
        .seed
        .unwrap_or_else(|| now().timestamp_nanos_opt().unwrap_or(0) as u64);
    println!(
        "soak: seed {seed}, {} min of workload, then {} s of drain",
        args.minutes, args.drain
    );
    let work = tempfile::Builder::new()
        .prefix("workspace-gc-soak-")
        .tempdir()
        .expect("a work directory")
        .keep();
    let audit_log = work.join("audit.log");
    let audit_policy = work.join("audit-policy.yaml");
    std::fs::write(&audit_policy, judge::audit_policy_yaml()).expect("write the audit policy");
    let cp = Arc::new(ControlPlane::start_with(&ControlPlaneOptions {
        controller_manager: true,
        apiserver_args: vec![
            "--watch-cache=false".into(),
            format!("--audit-log-path={}", audit_log.display()),
            format!("--audit-policy-file={}", audit_policy.display()),
        ],
    }));
    println!(
        "soak: control plane in {}; logs in {}",
        cp.dir().display(),
        work.display()
    );
    let client = cp.client();
    install_daemon_identity(&client).await;
    for ns in NAMESPACES {
        TestNamespace::named(&cp, ns).await;
    }
    let mut replicas = Vec::new();
    for (index, (name, account)) in REPLICAS.into_iter().enumerate() {
        let account = cp
            .service_account_kubeconfig(LEASE_NAMESPACE, account)
            .await;
        let proxy = Proxy::http(&cp).await;
        let kubeconfig = proxy.kubeconfig(&cp, &account);
        let clock = match (&args.clock_offset, index) {
            (Some(offset), 1) => faketime(offset),
            _ => Vec::new(),
        };
        let mut replica = Replica {
            name,
            orphan_grace: if args.sabotage {
                ORPHAN_GRACE / 2
            } else {
                ORPHAN_GRACE
            },
            clock,
            proxy,
            kubeconfig,
            logs: work.clone(),
            process: None,
            spawns: 0,
            metrics: String::new(),
        };
        replica.spawn();
        replicas.push(replica);
    }

    let driver = Arc::new(Driver {
        client: client.clone(),
        world: Mutex::new(World::default()),
        rng: Mutex::new(Rng(seed)),
        gate: RwLock::new(()),
    });
    let mut faults = Faults {
        cp: cp.clone(),
        driver: driver.clone(),
        replicas,
        windows: Vec::new(),
        crashes: 0,
        throttles: 0,
        order: Vec::new(),
        holds: 0,
        protocol: 0,
    };
    let started = now();
    let workload_end = started + chrono::Duration::milliseconds((args.minutes * 60_000.0) as i64);

    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.1));
    let workload = tokio::spawn(load::run(driver.clone(), started, workload_end, interval));
    faults
        .run(Rng(seed ^ 0x5eed), args.fault_every, workload_end)
        .await;
    workload.await.expect("the workload task");

    println!(
        "soak: workload over; making every claim collectable and draining {} s",
        args.drain
    );
    driver.settle().await;
    let settled = now();
    let drain_end = tokio::time::Instant::now() + Duration::from_secs(args.drain);
    while tokio::time::Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        faults.check_crashes();
    }
    for replica in &mut faults.replicas {
        replica.scrape().await;
    }
    driver.refresh().await;
    let checked_at = now();

    let refused = faults.refused_requests();
    let events = read_audit(&audit_log);
    let world = driver.world.lock().await;
    let verdict = judge::judge(&events, &refused, &world, checked_at);
    let run = report::Run {
        seed,
        started,
        workload_end,
        settled,
        checked_at,
    };
    report::print(&run, &world, &faults, &verdict);
    let failed = verdict.failed(faults.crashes);
    drop(world);
    for replica in &mut faults.replicas {
        if let Some(process) = replica.process.take() {
            let _ = process.terminate().await;
        }
    }
    println!("soak: {}", if failed { "FAILED" } else { "passed" });
    failed
}
