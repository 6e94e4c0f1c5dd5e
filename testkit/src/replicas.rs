//! Replicas of the real binary with leader election, their Roles and logs, and the
//! blast-radius cap they share through the Lease: shared by tests/cluster/faults.rs,
//! tests/cluster/leadership.rs and tests/cluster/lease_tamper.rs.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{ObjectMeta, PostParams};

use super::{ControlPlane, Process, Proxy, TestNamespace, metric, wait_until};

/// A directory for the logs of the replicas a test starts, named after the test file.
pub fn log_dir(file: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("workspace-gc-{file}-"))
        .tempdir()
        .expect("a directory for daemon logs")
}

/// The configuration of a replica of the binary that watches only `ns`, without leader
/// election, deleting as fast as asked, and with an orphan grace long enough that only the
/// deadlines a test sets apply; as environment variables.
pub fn binary_vars(ns: &TestNamespace) -> Vec<(&'static str, String)> {
    vec![
        ("WORKSPACE_GC_SELECTOR_NAMESPACES", ns.name().to_owned()),
        ("WORKSPACE_GC_LEADER_ELECTION_ENABLED", "false".into()),
        ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "100".into()),
        (
            "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
            "1000".into(),
        ),
        ("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1h".into()),
    ]
}

/// The variables for a replica of the binary with leader election on a Lease in `ns`.
pub fn elected_vars(ns: &TestNamespace, lease: &str) -> Vec<(&'static str, String)> {
    let mut vars = binary_vars(ns);
    vars.retain(|(key, _)| *key != "WORKSPACE_GC_LEADER_ELECTION_ENABLED");
    vars.push((
        "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
        ns.name().into(),
    ));
    vars.push(("WORKSPACE_GC_LEADER_ELECTION_LEASE_DURATION", lease.into()));
    vars
}

pub fn set_var(vars: &mut Vec<(&'static str, String)>, key: &'static str, value: &str) {
    vars.retain(|(k, _)| *k != key);
    vars.push((key, value.to_owned()));
}

/// Whether claim `name` was deleted: gone, or terminating.
pub async fn deleted(ns: &TestNamespace, name: &str) -> bool {
    ns.api::<PersistentVolumeClaim>()
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get claim {name}: {e}"))
        .is_none_or(|claim| claim.metadata.deletion_timestamp.is_some())
}

pub async fn deleted_count(ns: &TestNamespace, names: &[String]) -> usize {
    let mut count = 0;
    for name in names {
        if deleted(ns, name).await {
            count += 1;
        }
    }
    count
}

pub async fn capped(replica: &Process) -> bool {
    metric(
        &replica.metrics().await,
        "workspace_gc_blast_radius_capped",
        "",
    ) == 1.0
}

/// How many claims of `names` a replica's `log` names in a "blast-radius cap reached" warning
/// since it last won the lease (each claim held back is warned of once per episode of the cap).
pub fn warned(log: &str, ns: &TestNamespace, names: &[String]) -> usize {
    let since = log
        .rsplit_once("won the lease")
        .map_or("", |(_, since)| since);
    let warnings: Vec<&str> = (since.lines())
        .filter(|line| line.contains("blast-radius cap reached"))
        .collect();
    let named = |name: &&String| {
        let key = format!("{}/{name}", ns.name());
        warnings.iter().any(|line| line.contains(&key))
    };
    names.iter().filter(named).count()
}

/// `replica` comes to lead, re-evaluates every claim on winning the lease, finds the cap
/// reached, and `expected` of `names` stay the only ones deleted.
pub async fn leads_within_the_cap(
    replica: &Process,
    ns: &TestNamespace,
    names: &[String],
    expected: usize,
    when: &str,
) {
    assert!(
        wait_until(Duration::from_secs(30), || replica.leading()).await,
        "leads {when}:\n{}",
        replica.logs()
    );
    assert!(
        wait_until(Duration::from_secs(15), || capped(replica)).await,
        "finds the cap reached {when}:\n{}",
        replica.logs()
    );
    // The witness: since it won the lease, the replica decided each claim left due, held it
    // back, and said so.
    let held_back = || async {
        let log = replica.logs();
        for name in names {
            if !deleted(ns, name).await && warned(&log, ns, std::slice::from_ref(name)) == 0 {
                return false;
            }
        }
        true
    };
    assert!(
        wait_until(Duration::from_secs(15), held_back).await,
        "warns of each claim it holds back {when}:\n{}",
        replica.logs()
    );
    assert_eq!(
        deleted_count(ns, names).await,
        expected,
        "no more deletions {when}:\n{}",
        replica.logs()
    );
}

/// `count` claims named `{prefix}{i}-build-workspace`, all overdue, and the variables of an
/// elected replica (4 s lease) with a cap of `max` deletions per `window`.
pub async fn overdue_under_a_cap(
    ns: &TestNamespace,
    prefix: &str,
    count: usize,
    max: u32,
    window: &str,
) -> (Vec<(&'static str, String)>, Vec<String>) {
    let mut vars = elected_vars(ns, "4s");
    set_var(
        &mut vars,
        "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
        &max.to_string(),
    );
    set_var(&mut vars, "WORKSPACE_GC_DELETION_WINDOW", window);
    let names: Vec<String> = (0..count)
        .map(|i| format!("{prefix}{i}-build-workspace"))
        .collect();
    for name in &names {
        super::ClaimBuilder::build_workspace(name)
            .annotation(
                workspace_gc::contract::annotations::EXPIRES,
                &(chrono::Utc::now() - chrono::Duration::minutes(1))
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )
            .create(ns)
            .await;
    }
    (vars, names)
}

/// The daemon's Role: the rules of the shipped ClusterRole (`manifests/base`, read, never
/// copied), or, without `can_delete`, the same less `delete` and `patch` on claims (a cluster
/// whose admin narrowed them).
pub fn daemon_role(can_delete: bool) -> Role {
    let mut rules = super::shipped::rules_in("base/rbac-cluster.yaml");
    if !can_delete {
        for rule in &mut rules {
            if (rule.resources.iter().flatten()).any(|r| r == "persistentvolumeclaims") {
                rule.verbs
                    .retain(|verb| verb != "delete" && verb != "patch");
            }
        }
    }
    Role {
        metadata: ObjectMeta {
            name: Some("workspace-gc".into()),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
    }
}

/// The daemon's Role in the test namespace with the shipped Lease rights
/// (`manifests/base/rbac-lease.yaml`) beside it, as an elected replica has them.
pub fn elected_role(name: &str) -> Role {
    let mut role = daemon_role(true);
    role.metadata.name = Some(name.to_owned());
    if let Some(rules) = role.rules.as_mut() {
        rules.extend(super::shipped::lease_rules());
    }
    role
}

/// A replica as ServiceAccount `name` with the daemon's Role (and the Lease rights), its
/// kubeconfig through `proxy`.
pub async fn replica_through(
    cp: &ControlPlane,
    ns: &TestNamespace,
    name: &str,
    proxy: &Proxy,
) -> std::path::PathBuf {
    ns.api::<Role>()
        .create(&PostParams::default(), &elected_role(name))
        .await
        .expect("role");
    ns.bind_role(name, name).await;
    let direct = cp.service_account_kubeconfig(ns.name(), name).await;
    proxy.kubeconfig(cp, &direct)
}
