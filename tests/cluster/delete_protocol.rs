//! The delete protocol under the answers a real API server and the hops before it give, as the
//! identity the manifests ship (issue 46): every outcome names its next step, a standing failure
//! backs off whatever the answer was, and the reads after a lost answer use only the rights the
//! shipped roles grant. Each replica is a ServiceAccount with the shipped Role, its requests
//! through an HTTP proxy that plays the faults; the proxy also counts the requests it passes.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{
    ClaimBuilder, ControlPlane, DeleteInvariant, Fault, Process, Proxy, Rule, TestNamespace,
    ViolationKind, capped, deleted, deleted_count, elected_vars, expiring, forward_held_delete,
    in_secs, log_dir, metric, overdue_under_a_cap, read_audit, replica_through, service_account,
    set_var, wait_until, webhook_that_is_down,
};
use workspace_gc::contract::annotations::{DELETES_IN_FLIGHT, REVOKED};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A replica's world: its namespace, the proxy between it and the API server (rules are added
/// before [`Replica::spawn`]), its kubeconfig as ServiceAccount `gc` with the shipped Role, and
/// that account's username, which the rules match.
struct Replica {
    ns: TestNamespace,
    proxy: Proxy,
    kubeconfig: std::path::PathBuf,
    user: String,
}

impl Replica {
    async fn new(prefix: &str) -> Replica {
        let cp = ControlPlane::shared();
        let ns = TestNamespace::new(cp, prefix).await;
        let proxy = Proxy::http(cp).await;
        let kubeconfig = replica_through(cp, &ns, "gc", &proxy).await;
        let user = service_account(ns.name(), "gc");
        Replica {
            ns,
            proxy,
            kubeconfig,
            user,
        }
    }

    /// The daemon's binary with `vars`, elected on a 4 s Lease in the namespace unless `vars`
    /// say otherwise; its log lives as long as the returned directory.
    fn spawn(&self, vars: Option<&[(&'static str, String)]>) -> (Process, tempfile::TempDir) {
        let logs = log_dir("delete-protocol");
        let elected = elected_vars(&self.ns, "4s");
        let vars = vars.unwrap_or(&elected);
        let daemon = Process::spawn(&self.kubeconfig, vars, "gc", &logs.path().join("gc.log"));
        (daemon, logs)
    }
}

/// A rule that only counts: the request is forwarded at once.
fn counted(verb: &'static str, user: &str, claim: &str) -> Rule {
    Rule::new(
        verb,
        "persistentvolumeclaims",
        Fault::DelayRequest(Duration::ZERO),
    )
    .user(user.to_owned())
    .name(claim.to_owned())
}

/// The claim's UID, if it exists.
async fn uid_of(ns: &TestNamespace, claim: &str) -> Option<String> {
    (ns.api::<PersistentVolumeClaim>().get_opt(claim).await)
        .unwrap_or_else(|e| panic!("get claim {claim}: {e}"))
        .and_then(|claim| claim.metadata.uid)
}

/// A DELETE carried out whose answer was lost, and the re-run's new claim of the same name at
/// once: the revocation is refused (the UID differs), and the daemon reads the claim, as the
/// shipped roles allow (a LIST by name: they grant no `get`), finds another claim there, and
/// knows the DELETE landed. The new claim is left alone.
/// (Before, the read was a GET, forbidden as shipped: the claim was kept and the revocation
/// retried every 10 s, for good.)
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_then_a_new_claim_of_the_name_is_settled_with_the_shipped_rights() {
    let replica = Replica::new("lost-rerun").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let claim = "rerun-build-workspace";
    // The DELETE is carried out; its answer never comes back.
    let lost = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::LoseResponse)
            .user(user.clone())
            .name(claim)
            .times(1),
    );
    // The revocation reaches the API server late: by then the re-run has made its claim.
    proxy.add(
        Rule::new(
            "patch",
            "persistentvolumeclaims",
            Fault::DelayRequest(secs(3)),
        )
        .user(user.clone())
        .name(claim)
        .times(1),
    );
    let (daemon, _logs) = replica.spawn(None);
    expiring(claim, in_secs(-60)).create(ns).await;
    let first = uid_of(ns, claim).await;
    assert!(
        wait_until(secs(30), || async {
            proxy.hits(lost) == 1 && uid_of(ns, claim).await != first
        })
        .await,
        "the DELETE was carried out:\n{}",
        daemon.logs()
    );
    // The re-run's workspace, young and without an owner: kept for the orphan grace (1h).
    ClaimBuilder::build_workspace(claim).create(ns).await;
    let rerun = uid_of(ns, claim).await;
    assert!(
        wait_until(secs(30), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_deletes_late_total",
                "",
            ) == 1.0
        })
        .await,
        "the daemon found the DELETE landed:\n{}",
        daemon.logs()
    );
    // Every read it made was one its shipped rights allow (`metrics` checks it), and the
    // re-run's claim was left alone.
    daemon.metrics().await;
    assert_eq!(uid_of(ns, claim).await, rerun, "the re-run's claim stays");
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// The first DELETE is answered 503 by a hop that never forwarded it; its revocation is carried
/// out but the answer lost; the retry of the revocation is answered 503; the next is answered
/// 200. The claim, due, is still decided again and deleted once the faults end: no outcome
/// waits for an event its own write is expected to cause. (Before, a revocation that wrote the
/// value already there, with no new resourceVersion and no watch event, ended the reconcile for
/// good: a leak. Each revocation now writes a fresh value.)
#[tokio::test(flavor = "multi_thread")]
async fn a_revocation_that_changes_nothing_still_leads_to_the_delete() {
    let replica = Replica::new("noop-revoke").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let claim = "noop-build-workspace";
    let rule = |verb, fault| {
        Rule::new(verb, "persistentvolumeclaims", fault)
            .user(user.clone())
            .name(claim)
            .times(1)
    };
    proxy.add(rule("delete", Fault::unavailable()));
    proxy.add(rule("patch", Fault::LoseResponse));
    proxy.add(rule("patch", Fault::unavailable()));
    let revocations = proxy.add(counted("patch", &user, claim));
    let (daemon, _logs) = replica.spawn(None);
    expiring(claim, in_secs(-60)).create(ns).await;
    assert!(
        wait_until(secs(60), || deleted(ns, claim)).await,
        "the due claim is deleted once the faults end:\n{}",
        daemon.logs()
    );
    assert!(
        proxy.hits(revocations) >= 1,
        "a revocation reached the API server"
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// Anyone who may annotate a claim can pre-set the revocation annotation to the value a
/// revocation would write: the claim's next resourceVersion, which is foreseeable. Here it is
/// set so (guessing, and trying again until the guess is the resourceVersion the write itself
/// gets), then the daemon decides the claim, its DELETE is held in a hop past the deadline, and
/// the daemon revokes it. The revocation must change the claim: released late, the held DELETE
/// fails its precondition (409) and the claim lives. (Before, the revocation wrote the value
/// already there, the API server stored nothing, the 200 was taken as revoked, and the late
/// DELETE took the claim.)
#[tokio::test(flavor = "multi_thread")]
async fn a_revocation_pre_set_to_the_claims_next_version_still_changes_the_claim() {
    let replica = Replica::new("pre-set").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let claim = "preset-build-workspace";
    let created = expiring(claim, in_secs(-60)).create(ns).await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let mut version: u64 = created.metadata.resource_version.unwrap().parse().unwrap();
    let mut trapped = false;
    for _ in 0..100 {
        let guess = (version + 1).to_string();
        let patch = json!({"metadata": {"annotations": {REVOKED: guess}}});
        let written = claims
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate the claim");
        let now = written.metadata.resource_version.unwrap();
        if now == guess {
            trapped = true;
            break;
        }
        version = now.parse().unwrap();
    }
    assert!(
        trapped,
        "the annotation holds the claim's own resourceVersion"
    );
    let held = proxy.add(
        Rule::new("delete", "persistentvolumeclaims", Fault::HoldAndForward)
            .user(user)
            .name(claim)
            .times(1),
    );
    let (daemon, _logs) = replica.spawn(None);
    assert!(
        wait_until(secs(30), || async { proxy.hits(held) == 1 }).await,
        "the DELETE was sent, and is held:\n{}",
        daemon.logs()
    );
    let revoked = || async {
        metric(
            &daemon.metrics().await,
            "workspace_gc_revocations_total",
            "result=\"revoked\"",
        ) >= 1.0
    };
    // Waited for, not asserted yet: what matters is what the late DELETE does.
    let was_revoked = wait_until(secs(30), revoked).await;
    forward_held_delete(proxy, held, ns, claim, || daemon.logs()).await;
    assert!(was_revoked, "the DELETE was revoked:\n{}", daemon.logs());
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// A validating webhook on claim DELETEs whose pods are down (failurePolicy Fail): the API
/// server answers every DELETE 500, "failed calling webhook". That answer is the API server's
/// own refusal, given before anything is stored, so nothing is revoked, and the DELETEs back off
/// as refusals do: 1, 2, 4, 8 s apart and on up to 5 minutes. Once the webhook is gone the
/// claim is deleted at the next attempt. (Before, each 500 was taken for a lost answer: a
/// revocation, whose own event ran the claim again at once, 5 DELETEs, 5 PATCHes and 5 Lease
/// writes a second for the whole outage.)
#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_is_down_costs_a_backoff_not_a_storm() {
    let replica = Replica::new("webhook-down").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let claim = "guarded-build-workspace";
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(ns.client().clone());
    let name = format!("{}-down", ns.name());
    let webhook = webhook_that_is_down(&name, Some(ns.name()));
    webhooks
        .create(&PostParams::default(), &webhook)
        .await
        .expect("create the webhook configuration");
    let deletes = proxy.add(counted("delete", &user, claim));
    let revocations = proxy.add(counted("patch", &user, claim));
    let (daemon, _logs) = replica.spawn(None);
    expiring(claim, in_secs(-60)).create(ns).await;
    assert!(
        wait_until(secs(30), || async { proxy.hits(deletes) >= 1 }).await,
        "the DELETE was sent:\n{}",
        daemon.logs()
    );
    // 20 s of outage: attempts at about 0, 1, 3, 7 and 15 s.
    tokio::time::sleep(secs(20)).await;
    let (sent, patched) = (proxy.hits(deletes), proxy.hits(revocations));
    assert!(
        (3..=6).contains(&sent),
        "{sent} DELETEs in 20 s, not a backoff:\n{}",
        daemon.logs()
    );
    assert_eq!(patched, 0, "a refusal is not revoked:\n{}", daemon.logs());
    let text = daemon.metrics().await;
    assert!(
        metric(&text, "workspace_gc_deletions_total", "result=\"denied\"") >= 3.0,
        "{text}"
    );
    assert!(uid_of(ns, claim).await.is_some(), "kept meanwhile");
    webhooks
        .delete(&name, &DeleteParams::default())
        .await
        .expect("the webhook is removed");
    // The next attempt, about 31 s after the first, goes through.
    assert!(
        wait_until(secs(60), || deleted(ns, claim)).await,
        "deleted once the webhook is gone:\n{}",
        daemon.logs()
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// API servers behind one load balancer whose clocks disagree. The replica deletes the 2 its cap
/// of 2 per 10 minutes allows; then a second API server, 11 minutes ahead, answers its Lease
/// requests, and the replica's estimate of the server's clock jumps forward. The held claims
/// are decided again (a change to each wakes it): the cap still holds, because the answer that
/// contradicted the earlier ones makes it count its window as full for a window, which it says
/// in a metric and an event. (Before, the ledger forgot the deletions dated on the slower clock
/// for good, and 2 more were deleted: 4 under a cap of 2.)
#[tokio::test(flavor = "multi_thread")]
async fn api_servers_whose_clocks_disagree_never_open_the_cap() {
    let replica = Replica::new("clock-lb").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let (vars, names) = overdue_under_a_cap(ns, "skew", 6, 2, "10m").await;
    let (daemon, _logs) = replica.spawn(Some(&vars));
    assert!(
        wait_until(secs(30), || async {
            capped(&daemon).await && deleted_count(ns, &names).await == 2
        })
        .await,
        "the cap's 2 are deleted:\n{}",
        daemon.logs()
    );
    proxy.add(Rule::new("", "leases", Fault::DateAhead(secs(11 * 60))).user(user));
    let offset = || async {
        let text = daemon.metrics().await;
        metric(
            &text,
            "workspace_gc_clock_offset_seconds",
            "bound=\"lower\"",
        )
    };
    assert!(
        wait_until(secs(30), || async { offset().await > 600.0 }).await,
        "the replica's estimate of the server's clock jumped:\n{}",
        daemon.logs()
    );
    let claims = ns.api::<PersistentVolumeClaim>();
    let touch = Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}));
    for name in &names {
        if let Ok(Some(_)) = claims.get_opt(name).await {
            (claims.patch(name, &PatchParams::default(), &touch).await)
                .unwrap_or_else(|e| panic!("touch {name}: {e}"));
        }
    }
    let disputed = || async {
        let text = daemon.metrics().await;
        metric(&text, "workspace_gc_blast_radius_clock_disputed", "") == 1.0
    };
    let decided = wait_until(secs(30), || async {
        disputed().await || deleted_count(ns, &names).await > 2
    })
    .await;
    assert_eq!(
        deleted_count(ns, &names).await,
        2,
        "no more than the cap:\n{}",
        daemon.logs()
    );
    assert!(decided && disputed().await, "{}", daemon.logs());
    let told = ns
        .events()
        .await
        .iter()
        .any(|event| event.reason.as_deref() == Some("ServerClockDisputed"));
    assert!(told, "an event says why:\n{}", daemon.logs());
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// API servers behind one load balancer whose clocks are a second apart (NTP keeps them within
/// milliseconds; a second is what the tolerance is made to absorb): the Lease's answers come
/// from a server a second ahead, the rest from the other. Their answers contradict each other,
/// each measured within 4 s, so nothing holds the cap: every claim due is deleted at once, no
/// dispute is published or told. (Before, each contradiction held the cap full for a window,
/// here 10 minutes.)
#[tokio::test(flavor = "multi_thread")]
async fn api_servers_a_second_apart_never_hold_the_cap() {
    let replica = Replica::new("clock-near").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    proxy.add(Rule::new("", "leases", Fault::DateAhead(secs(1))).user(user));
    let (vars, names) = overdue_under_a_cap(ns, "near", 6, 6, "10m").await;
    let (daemon, _logs) = replica.spawn(Some(&vars));
    assert!(
        wait_until(secs(60), || async {
            deleted_count(ns, &names).await == names.len()
        })
        .await,
        "every claim due is deleted:\n{}",
        daemon.logs()
    );
    let text = daemon.metrics().await;
    let disputed = metric(&text, "workspace_gc_blast_radius_clock_disputed", "");
    assert_eq!(disputed, 0.0, "{}", daemon.logs());
    let told = ns
        .events()
        .await
        .iter()
        .any(|event| event.reason.as_deref() == Some("ServerClockDisputed"));
    assert!(!told, "no dispute told:\n{}", daemon.logs());
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// A large cap and a standing failure: every DELETE is reset by a hop (never carried out) and
/// every revocation too, so each claim's DELETE stays named in flight on the Lease. What the
/// Lease names stops at its budget, a quarter of the 256 KiB its annotations may take: further
/// DELETEs are not sent, and the renewals, which carry the names, go on being accepted, so the
/// replica keeps the Lease. (Before, the names grew past the API server's limit, and every Lease
/// write, renewals included, was refused 422: the replica lost the Lease and stopped.)
#[tokio::test(flavor = "multi_thread")]
async fn what_the_lease_names_in_flight_never_stops_its_renewals() {
    const CLAIMS: usize = 2_000;
    let replica = Replica::new("lease-budget").await;
    let (ns, proxy, user) = (&replica.ns, &replica.proxy, replica.user.clone());
    let reset = |verb| Rule::new(verb, "persistentvolumeclaims", Fault::Reset).user(user.clone());
    let deletes = proxy.add(reset("delete"));
    proxy.add(reset("patch"));
    let expired = in_secs(-60);
    let names: Vec<String> = (0..CLAIMS)
        .map(|i| format!("many-{i:04}-build-workspace"))
        .collect();
    futures::stream::iter(&names)
        .map(|name| expiring(name, expired).create(ns))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let mut vars = elected_vars(ns, "4s");
    set_var(
        &mut vars,
        "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
        &CLAIMS.to_string(),
    );
    let (daemon, _logs) = replica.spawn(Some(&vars));
    let leases: Api<Lease> = ns.api();
    let named = || async {
        let lease = leases.get("workspace-gc").await.expect("the Lease");
        let text = (lease.metadata.annotations.unwrap_or_default())
            .remove(DELETES_IN_FLIGHT)
            .unwrap_or_default();
        let renewed = lease.spec.and_then(|spec| spec.renew_time).map(|t| t.0);
        (text.len(), renewed)
    };
    // The DELETEs stop at the budget: the count holds still for seconds.
    assert!(
        wait_until(secs(120), || async {
            let before = proxy.hits(deletes);
            tokio::time::sleep(secs(3)).await;
            before > 100 && proxy.hits(deletes) == before
        })
        .await,
        "the DELETEs stop at the budget ({} sent):\n{}",
        proxy.hits(deletes),
        daemon.logs()
    );
    let sent = proxy.hits(deletes);
    assert!(
        (sent as usize) < CLAIMS,
        "{sent} DELETEs: the budget stopped none"
    );
    let (size, renewed) = named().await;
    assert!(
        size <= 64 * 1024 && size > 48 * 1024,
        "the Lease names {size} bytes in flight"
    );
    // Renewals still land with the names at their budget: the renew time moves (within twice
    // the lease), and the holder stays.
    assert!(
        wait_until(secs(8), || async { named().await.1 > renewed }).await,
        "not renewed since {renewed:?}:\n{}",
        daemon.logs()
    );
    let text = daemon.metrics().await;
    assert_eq!(
        metric(&text, "workspace_gc_leader", ""),
        1.0,
        "still leading:\n{}",
        daemon.logs()
    );
    assert_eq!(
        metric(
            &text,
            "workspace_gc_api_errors_total",
            "operation=\"lease\""
        ),
        0.0,
        "no Lease write refused:\n{text}"
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

/// A hop that queues requests in order and serves those whose client left (HAProxy's server
/// queue without `abortonclose`): the leader's DELETE is held, and every revocation of it queues
/// behind. The hop forwards them, in order, long after the DELETE's deadline: the DELETE lands
/// (nothing changed the claim, so its precondition holds), and the revocations find the claim
/// gone, so the daemon counts a late DELETE. No write of the client can overtake an earlier one
/// in such a queue (RELIABILITY.md, "Never wrong"). The audit-log invariant tells that DELETE
/// apart as late, landed, and nothing else. (Before, the invariant passed it.)
#[tokio::test(flavor = "multi_thread")]
async fn an_in_order_hop_lands_a_late_delete_and_the_invariant_tells_it_apart() {
    let work = tempfile::tempdir().expect("a directory for the audit log");
    let (cp, audit_log) = crate::leadership::audited_plane(&work);
    let ns = TestNamespace::new(&cp, "in-order").await;
    let proxy = Proxy::http(&cp).await;
    let kubeconfig = replica_through(&cp, &ns, "gc", &proxy).await;
    let user = service_account(ns.name(), "gc");
    let held =
        |verb| Rule::new(verb, "persistentvolumeclaims", Fault::HoldAndForward).user(user.clone());
    let delete = proxy.add(held("delete").times(1));
    let revocations = proxy.add(held("patch"));
    let logs = log_dir("delete-protocol");
    let vars = elected_vars(&ns, "4s");
    let daemon = Process::spawn(&kubeconfig, &vars, "gc", &logs.path().join("gc.log"));
    let claim = "queued-build-workspace";
    expiring(claim, in_secs(-60)).create(&ns).await;
    assert!(
        wait_until(secs(60), || async {
            proxy.hits(delete) == 1 && proxy.hits(revocations) >= 1
        })
        .await,
        "the DELETE, then its revocation, queue at the hop:\n{}",
        daemon.logs()
    );
    // Well past the DELETE's deadline and the fence's reach, the queue moves, in order.
    tokio::time::sleep(secs(8)).await;
    assert!(
        !deleted(&ns, claim).await,
        "nothing reached the API server yet"
    );
    proxy.remove(delete);
    assert!(
        wait_until(secs(20), || deleted(&ns, claim)).await,
        "the late DELETE lands"
    );
    proxy.remove(revocations);
    assert!(
        wait_until(secs(60), || async {
            metric(
                &daemon.metrics().await,
                "workspace_gc_deletes_late_total",
                "",
            ) == 1.0
        })
        .await,
        "the daemon learns it landed:\n{}",
        daemon.logs()
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}");
    let invariant = DeleteInvariant::new(&[user], Some((ns.name(), "workspace-gc")), secs(4));
    let violations = invariant.check(&read_audit(&audit_log), &[]);
    let kinds: Vec<ViolationKind> = violations.iter().map(|v| v.kind).collect();
    assert_eq!(kinds, [ViolationKind::LateLanded], "{violations:#?}");
}
