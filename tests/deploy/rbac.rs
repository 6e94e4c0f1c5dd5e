//! The RBAC as applied, checked as the ServiceAccount itself: every call the daemon makes is
//! allowed, a list of neighbouring rights is denied, and per namespace the account holds exactly
//! the expected rules; the admission guard refuses what RBAC allows; the audit overlay's
//! dry-run deletes and the namespaced overlay's daemon need nothing more.

use std::collections::BTreeSet;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use crate::server::{
    apply, apply_base, apply_with, assert_nothing_forbidden, audit, claim_is_gone,
    ensure_namespace, event_with_reason,
};
use crate::{LABEL_GUARD, LEASE, NAMESPACE, WATCHED, scratch, secs};
use testkit::{
    ClaimBuilder, ControlPlane, DeployedDaemon as Daemon, Launch, Overlay, TestNamespace, strings,
    wait_until,
};

/// The ClusterRole, one line per (API group, resource, verbs): what a reviewer signs off.
/// Changing it must be deliberate: both the manifest and this table.
pub const CLUSTER_RULES: &[(&str, &str, &[&str])] = &[
    (
        "",
        "persistentvolumeclaims",
        &["list", "watch", "delete", "patch"],
    ),
    ("", "pods", &["list", "watch"]),
    (
        "mlops.mlops.dev",
        "notebookvalidationjobs",
        &["get", "list", "watch"],
    ),
    ("tekton.dev", "pipelineruns", &["list", "watch"]),
    ("tekton.dev", "taskruns", &["list", "watch"]),
    ("", "resourcequotas", &["list", "watch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// The one cluster-wide right beyond the table, granted by name: reading the label guard's
/// policy and binding, to tell whether the API server holds it. The base's ClusterRole has it;
/// the namespaced overlay's ClusterRole `workspace-gc-label-guard` has only it.
pub fn label_guard_read() -> BTreeSet<Grant> {
    grants(&json!([{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        "resourceNames": [LABEL_GUARD],
        "verbs": ["get"],
    }]))
}

/// The base's ClusterRole: the table and the label guard's read.
pub fn cluster_grants() -> BTreeSet<Grant> {
    table_grants(CLUSTER_RULES)
        .union(&label_guard_read())
        .cloned()
        .collect()
}

/// Every (group, resource, verb, resourceName) a list of PolicyRules grants; "" for any name.
type Grant = (String, String, String, String);

pub fn grants(rules: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().expect("rules") {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in &names {
                        out.insert((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
    }
    out
}

pub fn table_grants(table: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    let rules: Vec<Value> = table
        .iter()
        .map(|(group, resource, verbs)| {
            json!({ "apiGroups": [group], "resources": [resource], "verbs": verbs })
        })
        .collect();
    grants(&Value::Array(rules))
}

/// The Lease Role's grants: read and renew one Lease by name, create (unrestrictable by name).
pub fn lease_grants(lease_name: &str) -> BTreeSet<Grant> {
    grants(&json!([
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
          "resourceNames": [lease_name], "verbs": ["get", "patch"] },
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"] },
    ]))
}

/// One access question, asked by the ServiceAccount about itself.
#[derive(Debug, Clone)]
struct Ask {
    verb: &'static str,
    group: &'static str,
    /// `resource` or `resource/subresource`.
    resource: &'static str,
    /// "" asks about every namespace at once (a cluster-wide list or watch), or a
    /// cluster-scoped resource.
    namespace: String,
    name: &'static str,
}

fn ask(verb: &'static str, group: &'static str, resource: &'static str, namespace: &str) -> Ask {
    Ask {
        verb,
        group,
        resource,
        namespace: namespace.to_owned(),
        name: "",
    }
}

impl Ask {
    fn named(mut self, name: &'static str) -> Ask {
        self.name = name;
        self
    }
}

async fn can(client: &Client, ask: &Ask) -> bool {
    let (resource, subresource) = match ask.resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_owned())),
        None => (ask.resource, None),
    };
    let some = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: some(ask.verb),
                group: Some(ask.group.to_owned()),
                resource: some(resource),
                subresource,
                namespace: some(&ask.namespace),
                name: some(ask.name),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectAccessReview {ask:?}: {e}"))
        .status
        .is_some_and(|status| status.allowed)
}

/// Asks every question and reports every wrong answer at once.
async fn assert_access(client: &Client, allowed: &[Ask], denied: &[Ask]) {
    let mut wrong = Vec::new();
    for (ask, expected) in allowed
        .iter()
        .map(|a| (a, true))
        .chain(denied.iter().map(|a| (a, false)))
    {
        if can(client, ask).await != expected {
            let expected = if expected { "allowed" } else { "denied" };
            wrong.push(format!("  should be {expected}: {ask:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the ServiceAccount's access differs:\n{}",
        wrong.join("\n")
    );
}

/// Everything `client` may do in `namespace`, cluster-wide grants included.
async fn all_rules_in(client: &Client, namespace: &str) -> BTreeSet<Grant> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_owned()),
        },
        ..SelfSubjectRulesReview::default()
    };
    let status = Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectRulesReview in {namespace}: {e}"))
        .status
        .expect("a rules review has a status");
    assert!(!status.incomplete, "the rules review is complete");
    grants(&serde_json::to_value(&status.resource_rules).unwrap())
}

/// What the ServiceAccount may do in `namespace` beyond what any ServiceAccount may (asking
/// about its own access, reading ClusterTrustBundles, ...): measured with an account bound to
/// nothing, since those defaults vary with the Kubernetes version.
async fn rules_in(
    control_plane: &ControlPlane,
    client: &Client,
    namespace: &str,
) -> BTreeSet<Grant> {
    let nobody = control_plane
        .service_account_client("default", "deploy-nobody")
        .await;
    let everyone = all_rules_in(&nobody, namespace).await;
    all_rules_in(client, namespace)
        .await
        .difference(&everyone)
        .cloned()
        .collect()
}

/// What the daemon must never be able to do, wherever it runs: write to what it only reads,
/// read what it never needs, or grow its own rights.
fn never(test_ns: &str) -> Vec<Ask> {
    let c = CORE;
    vec![
        ask("get", c, "persistentvolumeclaims", test_ns),
        ask("create", c, "persistentvolumeclaims", test_ns),
        ask("update", c, "persistentvolumeclaims", test_ns),
        ask("deletecollection", c, "persistentvolumeclaims", test_ns),
        ask("delete", c, "pods", test_ns),
        ask("create", c, "pods", test_ns),
        ask("get", c, "pods", test_ns),
        ask("create", c, "pods/exec", test_ns),
        ask("create", c, "pods/eviction", test_ns),
        ask("get", c, "secrets", test_ns),
        ask("list", c, "secrets", ""),
        ask("get", c, "configmaps", NAMESPACE),
        ask("create", c, "events", test_ns),
        ask("list", "events.k8s.io", "events", test_ns),
        ask("delete", "events.k8s.io", "events", test_ns),
        // The live re-check lists runs; it never reads one by name.
        ask("get", "tekton.dev", "pipelineruns", test_ns),
        ask("get", "tekton.dev", "taskruns", test_ns),
        ask("delete", "tekton.dev", "pipelineruns", test_ns),
        ask("patch", "tekton.dev", "pipelineruns", test_ns),
        ask("create", "tekton.dev", "pipelineruns", test_ns),
        ask("delete", "tekton.dev", "taskruns", test_ns),
        ask("patch", "tekton.dev", "taskruns", test_ns),
        ask("get", c, "resourcequotas", test_ns),
        ask("update", c, "resourcequotas", test_ns),
        ask(
            "delete",
            "mlops.mlops.dev",
            "notebookvalidationjobs",
            test_ns,
        ),
        ask(
            "update",
            "mlops.mlops.dev",
            "notebookvalidationjobs/status",
            test_ns,
        ),
        ask("list", c, "persistentvolumes", ""),
        ask("delete", c, "persistentvolumes", ""),
        ask("list", c, "namespaces", ""),
        ask("list", c, "nodes", ""),
        ask("list", "coordination.k8s.io", "leases", NAMESPACE),
        ask("get", "coordination.k8s.io", "leases", NAMESPACE).named("another-lease"),
        ask("patch", "coordination.k8s.io", "leases", NAMESPACE).named("another-lease"),
        ask("update", "coordination.k8s.io", "leases", NAMESPACE).named("workspace-gc"),
        ask("delete", "coordination.k8s.io", "leases", NAMESPACE).named("workspace-gc"),
        ask("get", "coordination.k8s.io", "leases", "kube-system").named("workspace-gc"),
        ask("patch", "apps", "deployments", NAMESPACE),
        ask("create", c, "serviceaccounts/token", NAMESPACE),
        ask("impersonate", c, "serviceaccounts", ""),
        ask(
            "create",
            "rbac.authorization.k8s.io",
            "rolebindings",
            NAMESPACE,
        ),
        ask("escalate", "rbac.authorization.k8s.io", "clusterroles", ""),
        ask("bind", "rbac.authorization.k8s.io", "clusterroles", ""),
        // It reads the label guard by name; it never lists, changes or reads another policy.
        ask("list", ADMISSION, "validatingadmissionpolicies", ""),
        ask("get", ADMISSION, "validatingadmissionpolicies", "").named("workspace-gc-guard"),
        ask("patch", ADMISSION, "validatingadmissionpolicies", "").named(LABEL_GUARD),
        ask("delete", ADMISSION, "validatingadmissionpolicybindings", "").named(LABEL_GUARD),
        ask("create", ADMISSION, "validatingadmissionpolicybindings", ""),
    ]
}

const ADMISSION: &str = "admissionregistration.k8s.io";

/// Reading the label guard (cluster-scoped, by name).
fn label_guard_reads() -> Vec<Ask> {
    vec![
        ask("get", ADMISSION, "validatingadmissionpolicies", "").named(LABEL_GUARD),
        ask("get", ADMISSION, "validatingadmissionpolicybindings", "").named(LABEL_GUARD),
    ]
}

const CORE: &str = "";

/// The daemon's calls in one namespace it watches.
fn needed_in(ns: &str) -> Vec<Ask> {
    vec![
        ask("list", CORE, "persistentvolumeclaims", ns),
        ask("watch", CORE, "persistentvolumeclaims", ns),
        ask("delete", CORE, "persistentvolumeclaims", ns),
        // The revocation of a delete that got no answer (the guard limits it to that).
        ask("patch", CORE, "persistentvolumeclaims", ns),
        ask("list", CORE, "pods", ns),
        ask("watch", CORE, "pods", ns),
        ask("list", "tekton.dev", "pipelineruns", ns),
        ask("watch", "tekton.dev", "pipelineruns", ns),
        ask("get", "mlops.mlops.dev", "notebookvalidationjobs", ns),
        ask("list", "mlops.mlops.dev", "notebookvalidationjobs", ns),
        ask("watch", "mlops.mlops.dev", "notebookvalidationjobs", ns),
        ask("list", "tekton.dev", "taskruns", ns),
        ask("watch", "tekton.dev", "taskruns", ns),
        ask("list", CORE, "resourcequotas", ns),
        ask("watch", CORE, "resourcequotas", ns),
        ask("create", "events.k8s.io", "events", ns),
        ask("patch", "events.k8s.io", "events", ns),
    ]
}

/// Its cluster-wide watches (every namespace at once).
fn watched_cluster_wide() -> Vec<Ask> {
    vec![
        ask("list", CORE, "persistentvolumeclaims", ""),
        ask("watch", CORE, "persistentvolumeclaims", ""),
        ask("list", CORE, "pods", ""),
        ask("watch", CORE, "pods", ""),
        ask("list", "tekton.dev", "pipelineruns", ""),
        ask("watch", "tekton.dev", "pipelineruns", ""),
        ask("list", "mlops.mlops.dev", "notebookvalidationjobs", ""),
        ask("watch", "mlops.mlops.dev", "notebookvalidationjobs", ""),
        ask("list", "tekton.dev", "taskruns", ""),
        ask("watch", "tekton.dev", "taskruns", ""),
        ask("list", CORE, "resourcequotas", ""),
        ask("watch", CORE, "resourcequotas", ""),
    ]
}

/// Its Lease, in its own namespace `ns`.
fn lease_in(ns: &str) -> Vec<Ask> {
    vec![
        ask("get", "coordination.k8s.io", "leases", ns).named("workspace-gc"),
        ask("patch", "coordination.k8s.io", "leases", ns).named("workspace-gc"),
        ask("create", "coordination.k8s.io", "leases", ns),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn base_grants_its_service_account_what_the_daemon_needs_and_nothing_more() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let ns = TestNamespace::new(control_plane, "deploy-rbac").await;
    let sa = control_plane
        .service_account_client(NAMESPACE, "workspace-gc")
        .await;

    let mut allowed = needed_in(ns.name());
    allowed.extend(watched_cluster_wide());
    allowed.extend(lease_in(NAMESPACE));
    allowed.extend(label_guard_reads());
    assert_access(&sa, &allowed, &never(ns.name())).await;

    // And nothing else at all, in a namespace it watches and in its own.
    let cluster = cluster_grants();
    assert_eq!(rules_in(control_plane, &sa, ns.name()).await, cluster);
    let own: BTreeSet<Grant> = cluster
        .union(&lease_grants("workspace-gc"))
        .cloned()
        .collect();
    assert_eq!(rules_in(control_plane, &sa, NAMESPACE).await, own);
}

/// The guard, applied with the base as shipped, is in force for the ServiceAccount: a delete of
/// an unlabelled claim, which RBAC allows, is refused by the API server with the rule's message
/// (for real and as a server-side dry run), and the account's own kind of delete passes, from
/// the pod that holds the Lease; its fence refuses the same delete from another pod, and from a
/// token bound to no pod.
#[tokio::test(flavor = "multi_thread")]
async fn base_guard_applied_refuses_the_service_accounts_delete_of_an_unlabelled_claim() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let ns = TestNamespace::new(control_plane, "deploy-guard").await;
    // This test holds the base's Lease, as a leader would, and hands it back at the end.
    let _turn = LEASE.lock().await;
    let holder = "workspace-gc-guard-test";
    let leases = Api::<Lease>::namespaced(control_plane.client(), NAMESPACE);
    let renewed = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    leases
        .patch(
            "workspace-gc",
            &PatchParams::apply("deploy-guard-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "workspace-gc"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
            })),
        )
        .await
        .expect("hold the Lease");
    let sa = control_plane
        .pod_bound_client(NAMESPACE, "workspace-gc", holder)
        .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(sa, ns.name());
    let other_pod = control_plane
        .pod_bound_client(NAMESPACE, "workspace-gc", "workspace-gc-not-leader")
        .await;
    let no_pod = control_plane
        .service_account_client(NAMESPACE, "workspace-gc")
        .await;
    let plain = ClaimBuilder::plain("user-data").create(&ns).await;
    let preconditions = |claim: &PersistentVolumeClaim, dry_run: bool| DeleteParams {
        dry_run,
        preconditions: Some(Preconditions {
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    let refusal = |answer: Result<_, kube::Error>| match answer {
        Err(kube::Error::Api(status)) => Some(status.message),
        Ok(_) => None,
        Err(other) => panic!("{other}"),
    };
    // The API server loads a new policy, and sees a Lease write, a moment after it is made.
    let rule = "workspace-gc admission guard: rule label-selector:";
    let labelled = ClaimBuilder::build_workspace("due-build-workspace")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(30), || async {
            refusal(
                claims
                    .delete("user-data", &preconditions(&plain, true))
                    .await,
            )
            .is_some_and(|message| message.contains(rule))
                && claims
                    .delete("due-build-workspace", &preconditions(&labelled, true))
                    .await
                    .is_ok()
        })
        .await,
        "the guard refuses a dry-run delete of an unlabelled claim, and admits the holder's"
    );
    let message = refusal(
        claims
            .delete("user-data", &preconditions(&plain, false))
            .await,
    );
    assert!(
        message.as_deref().is_some_and(|m| m.contains(rule)),
        "{message:?}"
    );
    assert!(!claim_is_gone(&control_plane.client(), ns.name(), "user-data").await);

    let fence = "workspace-gc admission guard: rule lease-holder:";
    for client in [other_pod, no_pod] {
        let message = refusal(
            Api::<PersistentVolumeClaim>::namespaced(client, ns.name())
                .delete("due-build-workspace", &preconditions(&labelled, false))
                .await,
        );
        assert!(
            message.as_deref().is_some_and(|m| m.contains(fence)),
            "{message:?}"
        );
    }
    claims
        .delete("due-build-workspace", &preconditions(&labelled, true))
        .await
        .expect("the daemon's kind of delete is admitted from the holder's pod");
    assert!(!claim_is_gone(&control_plane.client(), ns.name(), "due-build-workspace").await);
    leases
        .patch(
            "workspace-gc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .expect("hand the Lease back");
}

/// The audit overlay, applied in a namespace of its own: the daemon sends only dry-run deletes
/// (which RBAC and admission accept), so the expired claim stays and a WouldDelete event says
/// why; re-applying the base over it switches to real mode.
#[tokio::test(flavor = "multi_thread")]
async fn audit_overlay_applied_exercises_rbac_with_dry_run_deletes_and_deletes_nothing() {
    let control_plane = ControlPlane::shared();
    let admin = control_plane.client();
    let own = "workspace-gc-audit";
    let extra = format!("namespace: {own}\nnamePrefix: audit-\n");
    let audit_overlay = Overlay::new(&["overlays/audit"], &[], &extra);
    apply(control_plane, audit_overlay.path());
    let rendered = audit_overlay.render();
    let ns = TestNamespace::new(control_plane, "deploy-audit").await;
    let kubeconfig = control_plane
        .service_account_kubeconfig(own, "audit-workspace-gc")
        .await;
    let sa = control_plane
        .service_account_client(own, "audit-workspace-gc")
        .await;
    // The same rights as the base: a dry-run delete is authorized as a delete.
    let mut allowed = needed_in(ns.name());
    allowed.extend(lease_in(own));
    assert_access(&sa, &allowed, &[]).await;

    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    let scratch = scratch();
    let pod_name = "audit-workspace-gc-test";
    let launch = Launch::from(&rendered, pod_name, scratch.path());
    // Its Lease is in its own namespace, so it competes with no other test's daemon.
    let daemon = Daemon::start(
        &launch,
        &kubeconfig,
        scratch.path(),
        &[format!("--namespace={}", ns.name())],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;
    assert!(
        wait_until(secs(30), || async {
            event_with_reason(&admin, ns.name(), claim, "WouldDelete")
                .await
                .is_some()
        })
        .await,
        "a WouldDelete event:\n{}",
        daemon.log()
    );
    let would = format!(
        "workspace_gc_dry_run_would_delete_total{{claim_namespace=\"{}\",reason=\"orphaned\"}}",
        ns.name()
    );
    let metrics = daemon.metrics_when(&would, 1.0).await;
    assert_nothing_forbidden(&metrics);
    assert!(
        !metrics.contains("workspace_gc_deletions_total{"),
        "{metrics}"
    );
    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "exit 0 on SIGTERM:\n{log}");
    assert!(
        !claim_is_gone(&admin, ns.name(), claim).await,
        "dry-run deleted nothing"
    );
    assert!(
        event_with_reason(&admin, ns.name(), claim, "Deleted")
            .await
            .is_none()
    );

    // Audit first, then real mode: apply the base (same names) over it; server-side apply
    // drops the dry-run variables it set before.
    let real = Overlay::new(&["base"], &[], &extra);
    apply(control_plane, real.path());
    let deployment: Value = serde_json::to_value(
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(admin.clone(), own)
            .get("audit-workspace-gc")
            .await
            .expect("read the Deployment"),
    )
    .unwrap();
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    let names: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["POD_NAME", "POD_NAMESPACE"]);
}

/// The namespaced overlay, applied as shipped (with a name prefix, so that its ServiceAccount
/// is not the base's): rights only in the listed namespaces, none cluster-wide, and the daemon
/// with the overlay's own `--namespace` flags deletes with nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn namespaced_overlay_applied_grants_rights_only_in_the_listed_namespaces() {
    let control_plane = ControlPlane::shared();
    let admin = control_plane.client();
    // The overlay ships no Namespace objects: the daemon's and the watched ones must exist.
    for namespace in [NAMESPACE].iter().chain(WATCHED.iter()) {
        ensure_namespace(&admin, namespace).await;
    }
    let overlay = Overlay::new(&["overlays/namespaced"], &[], "namePrefix: ns-\n");
    // In two parts, as docs/deploy.md says: the team's, then the cluster admin's label guard.
    let marked = "app.kubernetes.io/component=label-guard";
    let unmarked = "app.kubernetes.io/component!=label-guard";
    apply_with(control_plane, overlay.path(), &["-l", unmarked]);
    apply_with(control_plane, overlay.path(), &["-l", marked]);
    let rendered = overlay.render();
    let elsewhere = TestNamespace::new(control_plane, "deploy-unlisted").await;
    let account = "ns-workspace-gc";
    let kubeconfig = control_plane
        .service_account_kubeconfig(NAMESPACE, account)
        .await;
    let sa = control_plane
        .service_account_client(NAMESPACE, account)
        .await;

    let mut allowed: Vec<Ask> = WATCHED.iter().flat_map(|ns| needed_in(ns)).collect();
    allowed.extend(lease_in(NAMESPACE));
    allowed.extend(label_guard_reads());
    let mut denied = never(WATCHED[0]);
    // Nothing cluster-wide but reading the label guard, and nothing in a namespace that is not
    // listed.
    denied.extend(watched_cluster_wide());
    denied.extend(needed_in(elsewhere.name()));
    assert_access(&sa, &allowed, &denied).await;
    let with_read = |grants: BTreeSet<Grant>| -> BTreeSet<Grant> {
        grants.union(&label_guard_read()).cloned().collect()
    };
    for watched in WATCHED {
        assert_eq!(
            rules_in(control_plane, &sa, watched).await,
            with_read(table_grants(CLUSTER_RULES)),
            "in {watched}"
        );
    }
    assert_eq!(
        rules_in(control_plane, &sa, elsewhere.name()).await,
        label_guard_read()
    );
    assert_eq!(
        rules_in(control_plane, &sa, NAMESPACE).await,
        with_read(lease_grants("workspace-gc")),
        "only its Lease in its own namespace, and the label guard's read"
    );

    // The one-shot audit shows the difference: cluster-wide it is refused (no cluster access,
    // exit 3); over the listed namespaces it works.
    let scratch = scratch();
    let pod_name = "ns-workspace-gc-test";
    let launch = Launch::from(&rendered, pod_name, scratch.path());
    let (code, output) = audit(&launch, &kubeconfig, &[]).await;
    assert_eq!(code, Some(3), "cluster-wide audit is forbidden:\n{output}");
    assert!(output.contains("forbidden"), "{output}");
    let listed: Vec<String> = launch
        .args
        .iter()
        .filter(|a| a.starts_with("--namespace="))
        .cloned()
        .collect();
    let (code, output) = audit(&launch, &kubeconfig, &listed).await;
    assert_eq!(code, Some(0), "audit of the listed namespaces:\n{output}");

    // The daemon, with exactly the overlay's flags, deletes an expired claim in team-a.
    let claim = format!("orphan-{}-build-workspace", std::process::id());
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        // The operator's claim: its labels, in the write that makes it.
        "metadata": { "name": claim, "labels": testkit::graph::operator_labels() },
        "spec": { "accessModes": ["ReadWriteOnce"],
                  "resources": { "requests": { "storage": "1Gi" } } },
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), WATCHED[0])
        .create(&PostParams::default(), &pvc)
        .await
        .expect("create the claim");
    let _turn = LEASE.lock().await;
    let daemon = Daemon::start(
        &launch,
        &kubeconfig,
        scratch.path(),
        &[],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;
    assert!(
        wait_until(secs(30), || claim_is_gone(&admin, WATCHED[0], &claim)).await,
        "the expired claim was deleted:\n{}",
        daemon.log()
    );
    assert!(
        wait_until(secs(10), || async {
            event_with_reason(&admin, WATCHED[0], &claim, "Deleted")
                .await
                .is_some()
        })
        .await,
        "a Deleted event:\n{}",
        daemon.log()
    );
    assert_nothing_forbidden(&daemon.metrics().await);
    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "exit 0 on SIGTERM:\n{log}");
}
