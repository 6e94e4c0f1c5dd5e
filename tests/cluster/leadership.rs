//! Leadership against a real kube-apiserver and etcd: two replicas of the real binary share a
//! Lease. The leader killed with SIGKILL is replaced within the lease, a partitioned leader stops
//! deleting before its lease can expire (fencing, read from the API server's audit log), only
//! the leader writes (events included), and the blast-radius cap's count, kept on the Lease,
//! holds across hand-overs and restarts. Each test also checks that every due claim is deleted
//! exactly once and nothing protected is touched. The other faults are in tests/cluster/faults.rs;
//! someone else's changes to the Lease in tests/cluster/lease_tamper.rs. docs/reliability-history.md
//! has the matrix; RELIABILITY.md the promises.
//!
//! scripts/test runs this file again on each older Kubernetes release of its matrix.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::PostParams;
use testkit::{
    AuditEvent, ControlPlane, ControlPlaneOptions, DeleteInvariant, Fate, Fault, PodBuilder,
    Process, Proxy, Rule, RuleId, TestNamespace, assert_decided, capped, deleted, deleted_count,
    deleted_events, elected_role, elected_vars, events, expiring, fate, forward_held_delete,
    in_secs, invariant_audit_rules, leads_within_the_cap, log_dir, metric, overdue_under_a_cap,
    read_audit, reconciles, replica_through, revoked, service_account, wait_until, warned,
};
use workspace_gc::contract::annotations;
use workspace_gc::daemon::controller::LIVE_BOUND;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Two replicas of the real binary with a 4 s lease; the leader is SIGKILLed between two
/// deadlines. The standby takes over within the lease duration (plus the up-to-1 s random
/// wait the lease manager adds), each due claim is deleted exactly once (one `Deleted` event,
/// from the replica that led at its deadline), and nothing protected is touched.
#[tokio::test(flavor = "multi_thread")]
async fn leader_killed_with_sigkill_standby_takes_over() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "leader").await;
    let lease_duration = secs(4);
    let vars = elected_vars(&ns, "4s");
    let logs = log_dir("leadership");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;
    let a = spawn_leader(kubeconfig, &vars, &logs).await;
    let b = Process::spawn(kubeconfig, &vars, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    assert!(!b.leading().await, "one leader at a time");

    // Deadlines a whole second away from the kill on either side, so no delete is in flight
    // when it lands: the kill is at `kill_at`.
    let kill_at = in_secs(10);
    let offsets = [-2, -1, 1, 2, 3, 5, 7, 9];
    let wave: Vec<(String, DateTime<Utc>)> = offsets
        .iter()
        .map(|offset| {
            let name = format!("wave{}-build-workspace", offset + 2);
            (name, kill_at + chrono::Duration::seconds(*offset))
        })
        .collect();
    for (name, due) in &wave {
        expiring(name, *due).create(&ns).await;
    }
    expiring("kept-build-workspace", in_secs(-60))
        .annotation(annotations::KEEP, "true")
        .create(&ns)
        .await;
    // The user first: the replicas are running, and an expired claim without one is due.
    PodBuilder::new("user")
        .mounting("busy-build-workspace")
        .phase("Running")
        .create(&ns)
        .await;
    expiring("busy-build-workspace", in_secs(-60))
        .create(&ns)
        .await;
    let all = (wave.len() + 2) as f64;
    for replica in [&a, &b] {
        assert!(
            wait_until(secs(10), || async {
                metric(
                    &replica.metrics().await,
                    "workspace_gc_cached_objects",
                    "kind=\"claims\"",
                ) == all
            })
            .await,
            "both replicas cached every claim: {}",
            replica.metrics().await
        );
    }

    // Real time: the kill lands at `kill_at`, between the wave's deadlines.
    let wait = (kill_at - Utc::now()).to_std().expect("the kill is ahead");
    tokio::time::sleep(wait).await;
    let killed = Instant::now();
    a.kill().await;
    assert!(
        wait_until(secs(15), || b.leading()).await,
        "replica-b takes over:\n{}",
        b.logs()
    );
    let takeover = killed.elapsed();
    eprintln!(
        "leader: replica-b took over {takeover:?} after the SIGKILL (lease {lease_duration:?})"
    );
    // The lease runs out at most `lease_duration` after the kill; the standby then waits up to
    // 1 s at random before taking it, and polling and a loaded machine add up to a second more.
    assert!(
        takeover <= lease_duration + secs(3),
        "took over after {takeover:?}, lease {lease_duration:?}"
    );

    let last_due = wave.iter().map(|(_, due)| *due).max().unwrap_or(kill_at);
    let wait = (last_due - Utc::now()).to_std().unwrap_or_default() + secs(5);
    for (name, _) in &wave {
        assert!(
            wait_until(wait, || deleted(&ns, name)).await,
            "{name} is deleted:\n{}",
            b.logs()
        );
    }
    for (name, due) in &wave {
        let events = deleted_events(&ns, name).await;
        assert_eq!(events.len(), 1, "{name}: one Deleted event, got {events:?}");
        let by = events[0].reporting_instance.as_deref();
        let expected = if *due < kill_at {
            "replica-a"
        } else {
            "replica-b"
        };
        assert_eq!(
            by,
            Some(expected),
            "{name}, due {due}, deleted by the leader"
        );
    }
    // The witness: the new leader decided both claims protected.
    for verdict in [
        ("protected", "keep-annotation", 1.0),
        ("protected", "in-use", 1.0),
    ] {
        assert_decided(|| b.metrics(), 0.0, ns.name(), verdict).await;
    }
    for name in ["kept-build-workspace", "busy-build-workspace"] {
        assert_eq!(fate(&ns, name).await, Fate::Live, "{name} is protected");
        assert!(deleted_events(&ns, name).await.is_empty());
    }
    let lease = ns
        .api::<Lease>()
        .get("workspace-gc")
        .await
        .expect("the lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-b")
    );
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}

/// A cap of 2 per hour and 6 claims due: 2 are deleted, and no more within the hour although
/// the leader shuts down and hands over to a standby, and that one is killed and restarted. The
/// count of the window lives on the Lease, so each new leader starts from it.
#[tokio::test(flavor = "multi_thread")]
async fn the_cap_holds_across_restarts_and_hand_overs() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "cap").await;
    let (vars, names) = overdue_under_a_cap(&ns, "due", 6, 2, "1h").await;
    let logs = log_dir("leadership");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;
    let a = Process::spawn(kubeconfig, &vars, "replica-a", &logs.path().join("a.log"));
    assert!(
        wait_until(secs(30), || async {
            capped(&a).await && deleted_count(&ns, &names).await == 2
        })
        .await,
        "replica-a deletes 2 and reaches the cap:\n{}",
        a.logs()
    );

    // Each of the 4 claims held back is told about once per episode of the cap, however often
    // it is retried (once a warning and an event rewrite at every bucket's expiry). The
    // witness: each of the 4 was decided due and held back, and said so.
    assert!(
        wait_until(secs(15), || async { warned(&a.logs(), &ns, &names) == 4 }).await,
        "each claim held back is warned about:\n{}",
        a.logs()
    );
    let warnings = a.logs().matches("blast-radius cap reached").count();
    assert!(warnings <= 4, "{warnings} cap warnings:\n{}", a.logs());

    // A hand-over: the standby takes the released lease at once.
    let b = Process::spawn(kubeconfig, &vars, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    let status = a.terminate().await;
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(logs.path().join("a.log")).unwrap_or_default()
    );
    leads_within_the_cap(&b, &ns, &names, 2, "after the hand-over").await;

    // A crash and a restart of the same pod: it holds its own lease and leads at once.
    b.kill().await;
    let b = Process::spawn(kubeconfig, &vars, "replica-b", &logs.path().join("b2.log"));
    leads_within_the_cap(&b, &ns, &names, 2, "after the restart").await;
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}

/// Only the leader writes to the cluster, events included: a standby that sees a claim with an
/// invalid annotation keeps it and says so in its metrics, but writes no event.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_writes_events() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "events").await;
    let vars = elected_vars(&ns, "4s");
    let logs = log_dir("leadership");
    let kubeconfig = &ns.daemon_kubeconfig(&vars).await;
    let a = spawn_leader(kubeconfig, &vars, &logs).await;
    let b = Process::spawn(kubeconfig, &vars, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    assert!(!b.leading().await);

    expiring("odd-build-workspace", in_secs(-60))
        .annotation(annotations::TTL, "a while")
        .create(&ns)
        .await;
    for replica in [&a, &b] {
        assert!(
            wait_until(secs(10), || async {
                metric(
                    &replica.metrics().await,
                    "workspace_gc_claims",
                    "state=\"keep\",reason=\"invalid-annotation\"",
                ) == 1.0
            })
            .await,
            "both replicas decided: {}",
            replica.metrics().await
        );
    }
    assert!(
        wait_until(secs(10), || async {
            !events(&ns, "odd-build-workspace", "InvalidAnnotation")
                .await
                .is_empty()
        })
        .await,
        "the leader explains the kept claim"
    );
    // The witness that the standby's decision is carried out, whatever it did: its reconcile
    // count moves once what a decision does is done.
    assert!(
        wait_until(secs(10), || async { reconciles(&b.metrics().await) >= 1.0 }).await,
        "the standby finished its reconcile: {}",
        b.metrics().await
    );
    // Real time: several of the standby's Lease reads (every half second), for the count of
    // its "standing by" lines below.
    tokio::time::sleep(secs(2)).await;
    let by: Vec<Option<String>> = events(&ns, "odd-build-workspace", "InvalidAnnotation")
        .await
        .into_iter()
        .map(|e| e.reporting_instance)
        .collect();
    assert_eq!(
        by,
        vec![Some("replica-a".to_owned())],
        "only the leader wrote"
    );
    assert_eq!(fate(&ns, "odd-build-workspace").await, Fate::Live);
    // The standby has read the Lease every half second for seconds: it says it stands by once,
    // on the transition, not at every round (once about 1,900 lines an hour).
    let standing_by = b.logs().matches("standing by").count();
    assert_eq!(standing_by, 1, "{}", b.logs());
    for replica in [b, a] {
        let status = replica.terminate().await;
        assert!(status.success(), "{status}");
    }
}

/// What the fencing test's audit log records: what [`DeleteInvariant`] reads, for every user (the
/// namespace, and so the replicas' names, is made after the API server starts).
fn fencing_audit_policy() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n{}  - level: None\n",
        invariant_audit_rules(&[])
    )
}

/// Fencing. Only the leader is partitioned (its proxy cut) while claims fall due every second;
/// the standby takes over. The API server's audit log shows that the old leader sent no DELETE
/// after its lease could have expired (its last successful Lease write plus the lease
/// duration), during the partition or after it heals, and that no claim was deleted twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_leader_stops_deleting_before_its_lease_can_expire() {
    let work = tempfile::tempdir().expect("a directory for the audit log");
    let (cp, audit_log) = audited_plane(&work);
    let ns = TestNamespace::new(&cp, "fencing").await;
    let lease = secs(4);
    let vars = elected_vars(&ns, "4s");
    let server = cp.config().cluster_url.to_string();
    let server = server.trim_end_matches('/').to_owned();
    let kubeconfigs = replica_kubeconfigs(&cp, &ns, &["replica-a", "replica-b"]).await;
    let proxy = Proxy::start(cp.api_address()).await;
    let via_proxy = work.path().join("a.kubeconfig");
    let text = std::fs::read_to_string(&kubeconfigs[0]).expect("read the kubeconfig");
    std::fs::write(&via_proxy, text.replace(&server, &proxy.url())).expect("write it");

    let logs = log_dir("leadership");
    let a = spawn_leader(&via_proxy, &vars, &logs).await;
    let b = Process::spawn(
        &kubeconfigs[1],
        &vars,
        "replica-b",
        &logs.path().join("b.log"),
    );
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    assert!(!b.leading().await, "one leader at a time");

    // Claims due every second from just before the cut until long after the heal.
    let cut_at = in_secs(10);
    let names: Vec<String> = (-2..=24)
        .map(|offset: i64| format!("due{}-build-workspace", offset + 2))
        .collect();
    for (name, offset) in names.iter().zip(-2i64..) {
        expiring(name, cut_at + chrono::Duration::seconds(offset))
            .create(&ns)
            .await;
    }
    for replica in [&a, &b] {
        assert!(
            wait_until(secs(10), || async {
                metric(
                    &replica.metrics().await,
                    "workspace_gc_cached_objects",
                    "kind=\"claims\"",
                ) == names.len() as f64
            })
            .await,
            "both replicas cached every claim"
        );
    }

    // Real time: the cut lands at `cut_at`, amid the deadlines.
    tokio::time::sleep((cut_at - Utc::now()).to_std().unwrap_or_default()).await;
    proxy.cut();
    let cut = Instant::now();
    assert!(
        wait_until(lease + secs(5), || b.leading()).await,
        "the standby takes over:\n{}",
        b.logs()
    );
    eprintln!("fencing: replica-b leads {:?} after the cut", cut.elapsed());
    // Real time: a second with two replicas that each may think they lead, one cut off.
    tokio::time::sleep(secs(1)).await;
    proxy.heal();
    let last = names.last().expect("claims");
    assert!(
        wait_until(secs(40), || deleted(&ns, last)).await,
        "the new leader deletes the last claim:\n{}",
        b.logs()
    );
    assert!(
        wait_until(secs(10), || async { !a.leading().await }).await,
        "the old leader stood down:\n{}",
        a.logs()
    );
    // The standby first, so that no release hands the lease back to it.
    for replica in [a, b] {
        let status = replica.terminate().await;
        assert!(status.success(), "{status}");
    }

    let audited = read_audit(&audit_log);
    let user = |name: &str| format!("system:serviceaccount:{}:{name}", ns.name());
    let (old, new) = (user("replica-a"), user("replica-b"));
    let renewed = audited
        .iter()
        .filter(|e| e.user == old && e.resource == "leases" && (200..300).contains(&e.code))
        .map(|e| e.at)
        .max()
        .expect("the old leader renewed its lease");
    let expiry = renewed + chrono::Duration::from_std(lease).expect("lease");
    let late: Vec<&AuditEvent> = audited
        .iter()
        .filter(|e| e.user == old && e.resource == "persistentvolumeclaims" && e.at >= expiry)
        .collect();
    assert!(
        late.is_empty(),
        "the old leader sent deletes after its lease could have expired at {expiry}: {late:#?}"
    );
    let deletes_by = |who: &str| {
        audited
            .iter()
            .filter(|e| e.user == who && e.resource == "persistentvolumeclaims")
            .count()
    };
    assert!(
        deletes_by(&old) > 0,
        "the old leader deleted before the cut"
    );
    assert!(deletes_by(&new) > 0, "the new leader deleted after it");
    let mut successes: std::collections::HashMap<&str, u32> = Default::default();
    for delete in audited
        .iter()
        .filter(|e| e.resource == "persistentvolumeclaims" && (200..300).contains(&e.code))
    {
        *successes
            .entry(delete.uid.as_deref().unwrap_or("?"))
            .or_default() += 1;
    }
    assert!(
        successes.values().all(|n| *n == 1),
        "no claim deleted twice: {successes:?}"
    );
    // Every DELETE fenced, re-checked live within the bound, preconditioned, once per decision.
    let mut invariant = DeleteInvariant::new(
        &[old.clone(), new.clone()],
        Some((ns.name(), "workspace-gc")),
        lease,
    );
    invariant.bound = LIVE_BOUND;
    let violations = invariant.check(&audited, &[]);
    assert!(violations.is_empty(), "{violations:#?}");
    for name in &names {
        assert!(deleted(&ns, name).await, "{name} is deleted");
    }
}

/// A control plane of its own whose audit log records what [`DeleteInvariant`] reads, and
/// that log's path (in `work`).
pub(crate) fn audited_plane(work: &tempfile::TempDir) -> (ControlPlane, std::path::PathBuf) {
    let audit_log = work.path().join("audit.log");
    let audit_policy = work.path().join("audit-policy.yaml");
    std::fs::write(&audit_policy, fencing_audit_policy()).expect("write the audit policy");
    let cp = ControlPlane::start_with(&ControlPlaneOptions {
        controller_manager: true,
        apiserver_args: vec![
            format!("--audit-log-path={}", audit_log.display()),
            format!("--audit-policy-file={}", audit_policy.display()),
        ],
    });
    (cp, audit_log)
}

/// A kubeconfig for each replica in `names`, as its own service account with the elected role.
async fn replica_kubeconfigs(
    cp: &ControlPlane,
    ns: &TestNamespace,
    names: &[&str],
) -> Vec<std::path::PathBuf> {
    let mut kubeconfigs = Vec::new();
    for name in names {
        ns.api::<Role>()
            .create(&PostParams::default(), &elected_role(name))
            .await
            .expect("role");
        ns.bind_role(name, name).await;
        kubeconfigs.push(cp.service_account_kubeconfig(ns.name(), name).await);
    }
    kubeconfigs
}

/// DELETEs decided together share their Lease writes (a group commit, `Fence::record`): a
/// burst of due claims costs fewer Lease writes than DELETEs, and the audit log still shows
/// every DELETE named in flight on the Lease, fenced and re-checked when it arrived. (Before,
/// each DELETE had a Lease write of its own.)
#[tokio::test(flavor = "multi_thread")]
async fn deletes_decided_together_share_their_lease_writes() {
    let work = tempfile::tempdir().expect("a directory for the audit log");
    let (cp, audit_log) = audited_plane(&work);
    let ns = TestNamespace::new(&cp, "batched").await;
    let lease = secs(15);
    let vars = elected_vars(&ns, "15s");
    let kubeconfigs = replica_kubeconfigs(&cp, &ns, &["replica-a"]).await;
    let logs = log_dir("leadership");
    let a = spawn_leader(&kubeconfigs[0], &vars, &logs).await;
    let names: Vec<String> = (0..24)
        .map(|i| format!("burst{i}-build-workspace"))
        .collect();
    for name in &names {
        expiring(name, in_secs(-60)).create(&ns).await;
    }
    assert!(
        wait_until(secs(60), || async {
            deleted_count(&ns, &names).await == names.len()
        })
        .await,
        "every due claim is deleted:\n{}",
        a.logs()
    );
    let status = a.terminate().await;
    assert!(status.success(), "{status}");

    let audited = read_audit(&audit_log);
    let user = service_account(ns.name(), "replica-a");
    let by_a = |resource: &str, verb: &str| -> Vec<&AuditEvent> {
        (audited.iter())
            .filter(|e| e.user == user && e.resource == resource && e.verb == verb)
            .filter(|e| e.succeeded())
            .collect()
    };
    let deletes = by_a("persistentvolumeclaims", "delete");
    assert_eq!(deletes.len(), names.len(), "one DELETE a claim");
    let first = deletes.iter().map(|d| d.at).min().expect("deletes");
    let last = deletes.iter().map(|d| d.at).max().expect("deletes");
    let writes = by_a("leases", "patch");
    // From the write the first DELETE rested on to the last DELETE.
    let since = (writes.iter().map(|w| w.at))
        .filter(|at| *at <= first)
        .max()
        .expect("a Lease write before the first DELETE");
    let shared = writes
        .iter()
        .filter(|w| w.at >= since && w.at <= last)
        .count();
    assert!(
        shared < deletes.len(),
        "{shared} Lease writes for {} DELETEs",
        deletes.len()
    );
    eprintln!(
        "group commit: {shared} Lease writes for {} DELETEs",
        deletes.len()
    );
    let mut invariant = DeleteInvariant::new(
        std::slice::from_ref(&user),
        Some((ns.name(), "workspace-gc")),
        lease,
    );
    invariant.bound = LIVE_BOUND;
    let violations = invariant.check(&audited, &[]);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Sends `signal` (`STOP`, `CONT`) to a replica.
fn signal(replica: &Process, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &replica.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// A build's pod starts on `claim`: from now on it is in use.
async fn a_build_starts_on(ns: &TestNamespace, claim: &str) {
    PodBuilder::new("rerun")
        .mounting(claim)
        .scheduled_on("node-a")
        .phase("Running")
        .create(ns)
        .await;
}

/// Two replicas through one hop, replica-a leading and paused (SIGSTOP: a long GC pause, a
/// frozen VM) while the hop holds its DELETE of a due claim, before it can learn that it got no
/// answer; replica-b stands by.
struct Paused {
    ns: TestNamespace,
    proxy: Proxy,
    held: RuleId,
    a: Process,
    b: Process,
    _logs: tempfile::TempDir,
    /// The claim's UID.
    uid: String,
}

async fn paused_with_its_delete_held(prefix: &str, claim: &str) -> Paused {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, prefix).await;
    let proxy = Proxy::http(cp).await;
    let config_a = replica_through(cp, &ns, "replica-a", &proxy).await;
    let config_b = replica_through(cp, &ns, "replica-b", &proxy).await;
    let held = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::HoldAndForward)
            .user(service_account(ns.name(), "replica-a"))
            .times(1),
    );
    let vars = elected_vars(&ns, "4s");
    let logs = log_dir("leadership");
    let a = spawn_leader(&config_a, &vars, &logs).await;
    let b = Process::spawn(&config_b, &vars, "replica-b", &logs.path().join("b.log"));
    assert!(wait_until(secs(30), || b.ready()).await, "{}", b.logs());
    let uid = (expiring(claim, in_secs(-60)).create(&ns).await)
        .metadata
        .uid
        .expect("a uid");
    assert!(
        wait_until(secs(30), || async { proxy.hits(held) == 1 }).await,
        "replica-a sent the DELETE, and it is held:\n{}",
        a.logs()
    );
    signal(&a, "STOP");
    Paused {
        ns,
        proxy,
        held,
        a,
        b,
        _logs: logs,
        uid,
    }
}

/// The leader's DELETE is held by a hop on its way, and the leader pauses (SIGSTOP: a long GC
/// pause, a frozen VM) before it can learn that it got no answer. The standby takes the
/// Lease, finds the DELETE named there in flight, and revokes it before deciding anything for
/// the claim, on which a build has started meanwhile. When the hop forwards the DELETE, its
/// precondition fails. (Before, the new leader knew nothing of it and the DELETE landed.)
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_leaders_late_delete_is_revoked_by_the_next_leader() {
    let claim = "paused-build-workspace";
    let Paused {
        ns,
        proxy,
        held,
        a,
        b,
        _logs,
        ..
    } = paused_with_its_delete_held("paused", claim).await;
    a_build_starts_on(&ns, claim).await;
    assert!(
        wait_until(secs(20), || b.leading()).await,
        "replica-b takes over from the paused leader:\n{}",
        b.logs()
    );
    let was_revoked = wait_until(secs(15), || revoked(&ns, claim)).await;
    forward_held_delete(&proxy, held, &ns, claim, || b.logs()).await;
    assert!(was_revoked, "replica-b revoked it:\n{}", b.logs());
    // Resumed only to be stopped: what it does afterwards is not what this test checks.
    signal(&a, "CONT");
    a.kill().await;
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}

/// The leader's DELETE is held by a hop on its way and the leader pauses (SIGSTOP); then the
/// Lease is deleted (`kubectl delete lease`, a namespace re-created). The standby creates it
/// again naming the DELETE it read there, as it carries the ledger, takes it, and revokes the
/// DELETE before deciding anything for the claim, on which a build has started meanwhile.
/// (Before, a Lease created again carried the ledger alone: the next leader revoked nothing,
/// and the late DELETE took the claim the build uses.)
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_created_again_still_names_a_held_delete_and_the_next_leader_revokes_it() {
    let claim = "recreated-build-workspace";
    let Paused {
        ns,
        proxy,
        held,
        a,
        b,
        _logs,
        uid,
    } = paused_with_its_delete_held("recreated", claim).await;
    // The standby reads the Lease once more: it names the DELETE, named before it was sent.
    let reads = || async {
        metric(
            &b.metrics().await,
            "workspace_gc_standby_ledger_reads_total",
            "result=\"remembered\"",
        )
    };
    let before = reads().await;
    assert!(
        wait_until(secs(15), || async { reads().await > before }).await,
        "replica-b reads the Lease:\n{}",
        b.logs()
    );
    let leases = ns.api::<Lease>();
    let old = leases.get("workspace-gc").await.expect("the lease");
    leases
        .delete("workspace-gc", &Default::default())
        .await
        .expect("delete the lease");
    a_build_starts_on(&ns, claim).await;
    assert!(
        wait_until(secs(20), || async {
            let lease = leases.get_opt("workspace-gc").await.expect("get the lease");
            lease.is_some_and(|lease| lease.metadata.uid != old.metadata.uid)
        })
        .await,
        "replica-b creates the Lease again:\n{}",
        b.logs()
    );
    assert!(
        wait_until(secs(20), || b.leading()).await,
        "replica-b leads:\n{}",
        b.logs()
    );
    let was_revoked = wait_until(secs(15), || revoked(&ns, claim)).await;
    let named = (leases.get("workspace-gc").await.expect("the lease"))
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(annotations::DELETES_IN_FLIGHT)
        .unwrap_or_default();
    forward_held_delete(&proxy, held, &ns, claim, || b.logs()).await;
    assert!(
        was_revoked,
        "replica-b revoked it (the Lease names {named:?}, the DELETE was of {uid}):\n{}",
        b.logs()
    );
    signal(&a, "CONT");
    a.kill().await;
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
}

/// The Lease write that must name a DELETE before it is sent fails (503 from a hop), so the
/// DELETE is not sent; then a build starts on the claim, and the claim is kept. The next Lease
/// write must not name that DELETE in flight: it was never sent, and a next leader would revoke
/// a claim nobody deleted. (Before, the failed write's entry stayed and every later write
/// carried it.)
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_not_sent_because_its_lease_write_failed_is_not_named_in_flight() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "unnamed").await;
    let proxy = Proxy::http(cp).await;
    let config = replica_through(cp, &ns, "replica-a", &proxy).await;
    let vars = elected_vars(&ns, "30s");
    let logs = log_dir("leadership");
    let a = spawn_leader(&config, &vars, &logs).await;
    let refused = proxy.add(
        Rule::new("patch", "leases", Fault::unavailable())
            .user(service_account(ns.name(), "replica-a")),
    );
    let claim = "unsent-build-workspace";
    let uid = (expiring(claim, in_secs(-60)).create(&ns).await)
        .metadata
        .uid
        .expect("a uid");
    let not_sent = format!("claim={}/{claim}", ns.name());
    assert!(
        wait_until(secs(20), || async {
            a.logs()
                .lines()
                .any(|l| l.contains("not deleted: deciding again") && l.contains(&not_sent))
        })
        .await,
        "the DELETE is held back by the failed Lease write:\n{}",
        a.logs()
    );
    a_build_starts_on(&ns, claim).await;
    let in_use = format!(
        "workspace_gc_claims{{claim_namespace=\"{}\",state=\"protected\",reason=\"in-use\"}} 1",
        ns.name()
    );
    assert!(
        wait_until(secs(20), || async { a.metrics().await.contains(&in_use) }).await,
        "the claim is kept in use:\n{}",
        a.logs()
    );
    proxy.remove(refused);
    let healed = k8s_openapi::jiff::Timestamp::now();
    let leases = ns.api::<Lease>();
    let lease = || async { leases.get("workspace-gc").await.expect("the lease") };
    assert!(
        wait_until(secs(20), || async {
            let renewed = lease().await.spec.and_then(|s| s.renew_time);
            renewed.is_some_and(|t| t.0 > healed)
        })
        .await,
        "the leader writes the Lease again:\n{}",
        a.logs()
    );
    let named = lease()
        .await
        .metadata
        .annotations
        .unwrap_or_default()
        .get(annotations::DELETES_IN_FLIGHT)
        .cloned()
        .unwrap_or_default();
    assert!(
        !named.contains(&uid),
        "the Lease names a DELETE that was never sent: {named}"
    );
    assert_eq!(fate(&ns, claim).await, Fate::Live);
    let status = a.terminate().await;
    assert!(status.success(), "{status}");
}

/// Spawns replica-a with `vars`, logging into `logs`, and waits until it leads.
async fn spawn_leader(
    kubeconfig: &std::path::Path,
    vars: &[(&'static str, String)],
    logs: &tempfile::TempDir,
) -> Process {
    let a = Process::spawn(kubeconfig, vars, "replica-a", &logs.path().join("a.log"));
    assert!(
        wait_until(secs(30), || a.leading()).await,
        "replica-a leads:\n{}",
        a.logs()
    );
    a
}
