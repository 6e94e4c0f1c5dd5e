//! Upgrades and downgrades between the code as it stood at 7c806ec (before the DELETEs named in
//! flight on the Lease and the revocation annotation on claims) and this one, on the real
//! control plane, under load, with one Lease: one version leads, the other stands by, and the
//! leader dies as a node does. No claim that must be kept is deleted, and none is stranded by
//! what the other version wrote on the Lease or on a claim.
//!
//! The earlier version's binary is named by `EARLIER_WORKSPACE_GC_BINARY`; scripts/test builds it
//! from 7c806ec's tree (`scripts/upgrade-from build`) and sets it. Without it these tests say
//! so and check nothing.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use testkit::{
    ControlPlane, Fault, PodBuilder, Process, Proxy, Rule, TestNamespace, deleted, elected_vars,
    expiring, in_secs, log_dir, replica_through, service_account, wait_until,
};
use workspace_gc::contract::annotations::KEEP;

/// How many claims of each kind: due ones, and ones that must be kept (`keep`, or mounted by a
/// pod that has not ended).
const DUE: usize = 40;
const KEPT: usize = 4;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The earlier version's binary, or `None` (said on stderr) when none was built.
fn earlier() -> Option<PathBuf> {
    let binary = std::env::var_os("EARLIER_WORKSPACE_GC_BINARY").map(PathBuf::from);
    if binary.is_none() {
        eprintln!(
            "upgrade: EARLIER_WORKSPACE_GC_BINARY is not set (scripts/test builds 7c806ec and sets it); nothing checked"
        );
    }
    binary
}

/// The two versions' world: one namespace and Lease, a proxy and a ServiceAccount with the
/// shipped Role for each.
struct Versions {
    ns: TestNamespace,
    proxies: [Proxy; 2],
    kubeconfigs: [PathBuf; 2],
    logs: tempfile::TempDir,
}

const NEW: usize = 0;
const OLD: usize = 1;
const NAMES: [&str; 2] = ["new", "old"];

impl Versions {
    async fn new(prefix: &str) -> Versions {
        let cp = ControlPlane::shared();
        let ns = TestNamespace::new(cp, prefix).await;
        let proxies = [Proxy::http(cp).await, Proxy::http(cp).await];
        let kubeconfigs = [
            replica_through(cp, &ns, NAMES[NEW], &proxies[NEW]).await,
            replica_through(cp, &ns, NAMES[OLD], &proxies[OLD]).await,
        ];
        Versions {
            ns,
            proxies,
            kubeconfigs,
            logs: log_dir("upgrade"),
        }
    }

    fn user(&self, which: usize) -> String {
        service_account(self.ns.name(), NAMES[which])
    }

    /// Starts version `which` (`earlier` is the binary of [`OLD`]) on the shared Lease.
    fn spawn(&self, which: usize, earlier: &std::path::Path) -> Process {
        let vars = elected_vars(&self.ns, "4s");
        let log = self.logs.path().join(format!("{}.log", NAMES[which]));
        let (kubeconfig, identity) = (&self.kubeconfigs[which], NAMES[which]);
        match which {
            NEW => Process::spawn(kubeconfig, &vars, identity, &log),
            // Its `forbidden` answers are its own (the roles are this version's).
            _ => Process::spawn_binary(earlier, kubeconfig, &vars, identity, &log)
                .expecting_denials(),
        }
    }

    async fn holder(&self) -> Option<String> {
        let leases: Api<Lease> = self.ns.api();
        let lease = leases.get_opt("workspace-gc").await.ok()??;
        lease.spec?.holder_identity
    }

    async fn leads_within(&self, which: usize, within: Duration) -> bool {
        let name = NAMES[which];
        wait_until(within, || async {
            self.holder().await.as_deref() == Some(name)
        })
        .await
    }

    /// Claims that must be kept: `keep`, and mounted by a pod that has not ended; all past
    /// their `expires`, so only what protects them keeps them.
    async fn kept(&self) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..KEPT {
            let name = format!("kept-{i}-build-workspace");
            (expiring(&name, in_secs(-60)).annotation(KEEP, "true"))
                .create(&self.ns)
                .await;
            names.push(name);
            let name = format!("mounted-{i}-build-workspace");
            expiring(&name, in_secs(-60)).create(&self.ns).await;
            (PodBuilder::new(&format!("user-{i}")).mounting(&name))
                .create(&self.ns)
                .await;
            names.push(name);
        }
        names
    }

    /// Due claims, made while a version leads: the load the hand-over happens under.
    async fn due(&self) -> Vec<String> {
        let names: Vec<String> = (0..DUE)
            .map(|i| format!("due-{i}-build-workspace"))
            .collect();
        let expired = in_secs(-60);
        futures::future::join_all(
            (names.iter()).map(|name| expiring(name, expired).create(&self.ns)),
        )
        .await;
        names
    }

    /// Every due claim deleted within `within`, and every kept one still there.
    async fn settled(
        &self,
        due: &[String],
        kept: &[String],
        within: Duration,
    ) -> Result<(), String> {
        let all_gone = wait_until(within, || async {
            futures::future::join_all(due.iter().map(|name| deleted(&self.ns, name)))
                .await
                .into_iter()
                .all(|gone| gone)
        })
        .await;
        let mut left = Vec::new();
        for name in due {
            if !deleted(&self.ns, name).await {
                left.push(name.clone());
            }
        }
        let mut wrong = Vec::new();
        for name in kept {
            if deleted(&self.ns, name).await {
                wrong.push(name.clone());
            }
        }
        if all_gone && wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "due and left: {left:?}; kept but deleted: {wrong:?}"
            ))
        }
    }
}

/// Downgrade: this version leads, and every DELETE it sends goes unanswered (a hop resets it;
/// it is never carried out), so it revokes each, writing its revocation on the claim and naming
/// its DELETEs in flight on the Lease. It dies; 7c806ec takes over. Every due claim is deleted,
/// the revoked ones too, and none that must be kept. (Before, the revocation was written under
/// `workspace-gc.mlops.dev/`, which 7c806ec takes for an unknown, invalid annotation: each
/// revoked claim was kept for good.)
#[tokio::test(flavor = "multi_thread")]
async fn a_downgrade_to_7c806ec_strands_no_revoked_claim_and_deletes_nothing_kept() {
    let Some(earlier) = earlier() else { return };
    let versions = Versions::new("downgrade").await;
    let kept = versions.kept().await;
    let user = versions.user(NEW);
    let proxy = &versions.proxies[NEW];
    proxy.add(Rule::new("delete", "persistentvolumeclaims", Fault::Reset).user(user.clone()));
    let revocations = proxy.add(
        Rule::new(
            "patch",
            "persistentvolumeclaims",
            Fault::DelayRequest(Duration::ZERO),
        )
        .user(user),
    );
    let new = versions.spawn(NEW, &earlier);
    assert!(
        versions.leads_within(NEW, secs(30)).await,
        "this version leads:\n{}",
        new.logs()
    );
    let old = versions.spawn(OLD, &earlier);
    let due = versions.due().await;
    assert!(
        wait_until(secs(60), || async { proxy.hits(revocations) >= 10 }).await,
        "this version revokes its unanswered DELETEs:\n{}",
        new.logs()
    );
    new.kill().await;
    assert!(
        versions.leads_within(OLD, secs(30)).await,
        "7c806ec takes over:\n{}",
        old.logs()
    );
    if let Err(error) = versions.settled(&due, &kept, secs(90)).await {
        panic!("after the downgrade, {error}:\n{}", old.logs());
    }
    let status = old.terminate().await;
    assert!(status.success(), "{status}");
}

/// Upgrade: 7c806ec leads and deletes under load; it dies mid-way; this version takes over
/// from a Lease 7c806ec wrote (its ledger, no DELETEs named in flight) and deletes the rest,
/// and nothing that must be kept; with the shipped rights, nothing it asks is refused.
#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_from_7c806ec_takes_over_its_lease_and_deletes_nothing_kept() {
    let Some(earlier) = earlier() else { return };
    let versions = Versions::new("upgrade").await;
    let kept = versions.kept().await;
    let old = versions.spawn(OLD, &earlier);
    assert!(
        versions.leads_within(OLD, secs(30)).await,
        "7c806ec leads:\n{}",
        old.logs()
    );
    let new = versions.spawn(NEW, &earlier);
    let due = versions.due().await;
    assert!(
        wait_until(secs(60), || async {
            futures::future::join_all(due.iter().map(|name| deleted(&versions.ns, name)))
                .await
                .into_iter()
                .any(|gone| gone)
        })
        .await,
        "7c806ec deletes:\n{}",
        old.logs()
    );
    old.kill().await;
    assert!(
        versions.leads_within(NEW, secs(30)).await,
        "this version takes over:\n{}",
        new.logs()
    );
    if let Err(error) = versions.settled(&due, &kept, secs(90)).await {
        panic!("after the upgrade, {error}:\n{}", new.logs());
    }
    // Panics on any `forbidden` answer to its requests.
    new.metrics().await;
    let status = new.terminate().await;
    assert!(status.success(), "{status}");
}
