//! The deployment in `manifests/`: every overlay rendered with `kubectl kustomize` and checked,
//! its pod template against OpenShift's `restricted-v2` SCC too; applied to a real API server
//! with server-side apply, as the README says to; its RBAC checked *as the ServiceAccount* (every
//! call the daemon makes is allowed, a list of neighbouring rights is denied, and per namespace
//! the account holds exactly the expected rules); the real binary run the way the Deployment runs
//! it, with the ServiceAccount's token and the deployed ConfigMap, as an arbitrary UID with
//! nothing writable, until it deletes an expired claim and records the event; and the Prometheus
//! component's alerts and dashboard checked by promtool and by a real Prometheus scraping the
//! daemon.
//!
//! Cluster-scoped names (the `workspace-gc` Namespace, ClusterRole and ClusterRoleBinding) are
//! shared by every test of this binary, so only one test applies the base as shipped; the
//! others apply a throw-away overlay with a name prefix (and, for audit, a namespace of its
//! own), which gives each its own ServiceAccount and so its own identity. Two daemons that
//! compete for the same Lease take turns ([`LEASE`]).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, Pod, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use serde_json::{Value, json};
use support::{
    ARBITRARY_UID, BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, DeployedDaemon as Daemon,
    Key, Launch, Overlay, Rendered, TestNamespace, confined, free_port, http_get, key_of,
    manifests, prometheus_binary, readable_copy, restricted_v2_violations, sample, strings,
    wait_until,
};
use tokio::sync::{Mutex, OnceCell};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_workspace-gc");

/// Where the shipped manifests put the daemon.
const NAMESPACE: &str = "workspace-gc";
/// The namespaces the `namespaced` overlay watches, as shipped.
const WATCHED: [&str; 2] = ["team-a", "team-b"];

/// The ClusterRole, one line per (API group, resource, verbs): what a reviewer signs off.
/// Changing it must be deliberate: both the manifest and this table.
const CLUSTER_RULES: &[(&str, &str, &[&str])] = &[
    ("", "persistentvolumeclaims", &["list", "watch", "delete"]),
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

/// The admission guard's policy and binding (manifests/components/admission-guard).
const GUARD: &str = "workspace-gc-guard";

/// Serializes the daemons that use the Lease `workspace-gc` in namespace `workspace-gc` (the
/// base's and the namespaced overlay's): a second one would stand by and never delete.
static LEASE: Mutex<()> = Mutex::const_new(());

/// The base is applied once per test binary, by whichever test needs it first.
static BASE_APPLIED: OnceCell<()> = OnceCell::const_new();

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A scratch directory for configuration files and logs.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("deploy-run-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("create a scratch directory")
}

/// Every (group, resource, verb, resourceName) a list of PolicyRules grants; "" for any name.
type Grant = (String, String, String, String);

fn grants(rules: &Value) -> BTreeSet<Grant> {
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

fn table_grants(table: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    let rules: Vec<Value> = table
        .iter()
        .map(|(group, resource, verbs)| {
            json!({ "apiGroups": [group], "resources": [resource], "verbs": verbs })
        })
        .collect();
    grants(&Value::Array(rules))
}

/// The Lease Role's grants: read and renew one Lease by name, create (unrestrictable by name).
fn lease_grants(lease_name: &str) -> BTreeSet<Grant> {
    grants(&json!([
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
          "resourceNames": [lease_name], "verbs": ["get", "patch"] },
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"] },
    ]))
}

// --- rendering tests --------------------------------------------------------------------------

/// kustomize reads no file outside its root, so the ConfigMap is generated from a copy of the
/// documented defaults: the copy must never drift.
#[test]
fn base_config_is_a_byte_for_byte_copy_of_the_root_config() {
    let root = std::fs::read(Path::new(ROOT).join("config.toml")).expect("read config.toml");
    let copy = std::fs::read(manifests("base/config.toml")).expect("read the base's copy");
    assert!(
        root == copy,
        "manifests/base/config.toml differs from config.toml; copy it: \
         cp config.toml manifests/base/config.toml"
    );
}

#[test]
fn base_renders_a_hardened_two_replica_deployment_with_least_privilege_rbac() {
    let base = Rendered::of(&manifests("base"));
    let config_map = base.mounted_config_map().clone();
    let config_map_name = config_map["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(config_map_name.starts_with("workspace-gc-config-"));

    // Exactly these objects: a new one must show up here, in review.
    let keys: BTreeSet<Key> = base.by_key().into_keys().collect();
    let key = |kind: &str, ns: &str, name: &str| (kind.to_owned(), ns.to_owned(), name.to_owned());
    let expected = BTreeSet::from([
        key("Namespace", "", NAMESPACE),
        key("ServiceAccount", NAMESPACE, "workspace-gc"),
        key("ClusterRole", "", "workspace-gc"),
        key("ClusterRoleBinding", "", "workspace-gc"),
        key("Role", NAMESPACE, "workspace-gc-lease"),
        key("RoleBinding", NAMESPACE, "workspace-gc-lease"),
        key("ConfigMap", NAMESPACE, &config_map_name),
        key("Deployment", NAMESPACE, "workspace-gc"),
        key("Service", NAMESPACE, "workspace-gc"),
        key("PodDisruptionBudget", NAMESPACE, "workspace-gc"),
        key("NetworkPolicy", NAMESPACE, "workspace-gc"),
        // Cluster-scoped; kustomize writes the namespace in, the API server ignores it.
        key("ValidatingAdmissionPolicy", NAMESPACE, GUARD),
        key("ValidatingAdmissionPolicyBinding", NAMESPACE, GUARD),
    ]);
    assert_eq!(keys, expected);

    // The ConfigMap is config.toml, verbatim.
    let root = std::fs::read_to_string(Path::new(ROOT).join("config.toml")).unwrap();
    assert_eq!(
        config_map["data"]["config.toml"].as_str(),
        Some(root.as_str())
    );
    assert_eq!(
        config_map["data"].as_object().unwrap().len(),
        1,
        "config.toml only"
    );

    let deployment = base.deployment();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = base.container();
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(pod["serviceAccountName"], "workspace-gc");
    assert_eq!(container["image"], "workspace-gc:0.1.0");
    assert_eq!(
        base.args(),
        ["run", "--config=/etc/workspace-gc/config.toml"]
    );
    // The file named by --config is the ConfigMap's, mounted read-only.
    assert_eq!(
        container["volumeMounts"],
        json!([{ "name": "config", "mountPath": "/etc/workspace-gc", "readOnly": true }])
    );
    assert_eq!(
        pod["volumes"],
        json!([{ "name": "config", "configMap": { "name": config_map_name } }])
    );
    // Lease identity and namespace from the downward API.
    assert_eq!(
        container["env"],
        json!([
            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
            { "name": "POD_NAMESPACE",
              "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
        ])
    );

    // Hardening: the restricted Pod Security Standard and then some.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"], json!({ "drop": ["ALL"] }));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    assert!(security.get("privileged").is_none());
    assert_eq!(
        base.get("Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );

    // Probes on the daemon's endpoints, through the named port, which is http.listen's port.
    assert_eq!(
        container["ports"],
        json!([{ "name": "http", "containerPort": 8080, "protocol": "TCP" }])
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(
            container[probe]["httpGet"],
            json!({ "path": path, "port": "http" }),
            "{probe}"
        );
    }
    // Sizes change with the benchmark; that they are set does not.
    let resources = &container["resources"];
    for pointer in ["/requests/cpu", "/requests/memory", "/limits/memory"] {
        assert!(resources.pointer(pointer).is_some(), "resources{pointer}");
    }

    // The Service and the PodDisruptionBudget select exactly the Deployment's pods.
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    for (label, value) in selector.as_object().unwrap() {
        assert_eq!(pod_labels.get(label), Some(value), "pod label {label}");
    }
    let service = base.only("Service");
    assert_eq!(&service["spec"]["selector"], selector);
    assert_eq!(
        service["spec"]["ports"],
        json!([{ "name": "http-metrics", "port": 8080, "targetPort": "http", "protocol": "TCP" }])
    );
    let budget = base.only("PodDisruptionBudget");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], selector);

    // Inbound: only the container's one port, which serves metrics and the probes (the pod's
    // node may always reach it); everything else is denied. Egress is left open.
    let network = base.only("NetworkPolicy");
    assert_eq!(&network["spec"]["podSelector"]["matchLabels"], selector);
    assert_eq!(network["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        network["spec"]["ingress"],
        json!([{ "ports": [{ "port": "http", "protocol": "TCP" }] }])
    );
    assert_eq!(
        container["ports"].as_array().map(Vec::len),
        Some(1),
        "a new port needs a rule"
    );

    // RBAC: the ClusterRole is the reviewed table; the Lease Role names the configured Lease.
    let cluster_role = base.get("ClusterRole", "workspace-gc");
    assert_eq!(grants(&cluster_role["rules"]), table_grants(CLUSTER_RULES));
    let binding = base.get("ClusterRoleBinding", "workspace-gc");
    assert_eq!(
        binding["roleRef"],
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "workspace-gc" })
    );
    let subject =
        json!([{ "kind": "ServiceAccount", "name": "workspace-gc", "namespace": NAMESPACE }]);
    assert_eq!(binding["subjects"], subject);
    let lease_binding = base.get("RoleBinding", "workspace-gc-lease");
    assert_eq!(lease_binding["roleRef"]["name"], "workspace-gc-lease");
    assert_eq!(lease_binding["subjects"], subject);

    // The binary accepts the deployed configuration, and it agrees with the manifests.
    let scratch = scratch();
    let config = base.effective_config(scratch.path());
    assert_eq!(config["deletion"]["dry_run"].as_bool(), Some(false));
    assert_eq!(config["leader_election"]["enabled"].as_bool(), Some(true));
    let lease_name = config["leader_election"]["lease_name"].as_str().unwrap();
    assert_eq!(
        grants(&base.get("Role", "workspace-gc-lease")["rules"]),
        lease_grants(lease_name),
        "the Lease Role must name leader_election.lease_name"
    );
    assert_eq!(
        config["leader_election"]["lease_namespace"].as_str(),
        Some(""),
        "the Lease is in the pod's namespace, where its Role is"
    );
    assert_eq!(config["http"]["listen"].as_str(), Some("0.0.0.0:8080"));
    assert_eq!(
        config["selector"]["namespaces"].as_array().map(Vec::len),
        Some(0),
        "cluster-wide, as the ClusterRole allows"
    );

    // The admission guard guards this ServiceAccount, with every refusal in force
    // (tests/admission.rs checks it was printed from this config.toml and what it refuses).
    let policy = base.get("ValidatingAdmissionPolicy", GUARD);
    let account = base.only("ServiceAccount");
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!(
            "request.userInfo.username == 'system:serviceaccount:{}:{}'",
            account["metadata"]["namespace"].as_str().unwrap(),
            account["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let guard_binding = base.get("ValidatingAdmissionPolicyBinding", GUARD);
    assert_eq!(guard_binding["spec"]["policyName"], GUARD);
    assert_eq!(guard_binding["spec"]["validationActions"], json!(["Deny"]));
}

/// The README's way to change the guard with the configuration: print it for your config.toml
/// and patch it over the shipped one; the printed rules replace the shipped ones, none is left.
#[test]
fn a_printed_guard_patched_in_an_overlay_replaces_the_shipped_rules() {
    let scratch = scratch();
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        "[selector]\nlabel_selector = \"team=ml\"\nexclude_namespaces = [\"kube-system\"]\n",
    )
    .unwrap();
    let printed = Command::new(BINARY)
        .arg("--config")
        .arg(&config)
        .arg("admission-policy")
        .env_clear()
        .output()
        .expect("run admission-policy");
    assert!(printed.status.success(), "{printed:?}");
    let overlay = Overlay::new(&["base"], &[], "patches:\n  - path: guard.yaml\n");
    std::fs::write(overlay.path().join("guard.yaml"), &printed.stdout).unwrap();
    let rendered = overlay.render();
    let messages: Vec<String> =
        rendered.get("ValidatingAdmissionPolicy", GUARD)["spec"]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["message"].as_str().unwrap().to_owned())
            .collect();
    let rules: Vec<&str> = messages
        .iter()
        .map(|m| m.split("rule ").nth(1).unwrap().split(':').next().unwrap())
        .collect();
    assert_eq!(
        rules,
        [
            "no-update",
            "uid-precondition",
            "volume-marked",
            "volume-released",
            "volume-mark-only",
            "excluded-namespace",
            "label-selector"
        ]
    );
    assert!(messages[6].contains("team=ml"), "{messages:?}");
    assert!(!messages[6].contains("build-workspace"), "{messages:?}");
}

#[test]
fn audit_overlay_only_switches_on_server_side_dry_run() {
    let base = Rendered::of(&manifests("base"));
    let audit = Rendered::of(&manifests("overlays/audit"));
    let dry_run = [
        json!({ "name": "WORKSPACE_GC_DELETION_DRY_RUN", "value": "true" }),
        json!({ "name": "WORKSPACE_GC_DELETION_SERVER_SIDE_DRY_RUN", "value": "true" }),
    ];
    let env = audit.container()["env"].as_array().unwrap().clone();
    for variable in &dry_run {
        assert!(env.contains(variable), "{variable} in {env:#?}");
    }

    // Without those two variables, the audit overlay is the base, object for object.
    let mut objects = audit.by_key();
    let deployment = objects
        .values_mut()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let env = deployment
        .pointer_mut("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array_mut)
        .unwrap();
    env.retain(|variable| !dry_run.contains(variable));
    assert_eq!(objects, base.by_key());

    let scratch = scratch();
    let config = audit.effective_config(scratch.path());
    assert_eq!(config["deletion"]["dry_run"].as_bool(), Some(true));
    assert_eq!(
        config["deletion"]["server_side_dry_run"].as_bool(),
        Some(true)
    );
}

#[test]
fn namespaced_overlay_has_roles_in_the_watched_namespaces_and_nothing_cluster_wide() {
    let base = Rendered::of(&manifests("base"));
    let namespaced = Rendered::of(&manifests("overlays/namespaced"));

    // Nothing cluster-scoped: a namespace admin can apply all of it.
    for object in &namespaced.0 {
        assert!(
            object.pointer("/metadata/namespace").is_some(),
            "cluster-scoped object in the namespaced overlay: {:?}",
            key_of(object)
        );
    }

    // One Role and RoleBinding per watched namespace, with the ClusterRole's rules, bound to
    // the daemon's ServiceAccount in the daemon's namespace.
    let watched: BTreeSet<String> = WATCHED.iter().map(|s| s.to_string()).collect();
    let namespaces_of = |kind: &str| -> BTreeSet<String> {
        namespaced
            .of_kind(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"] == "workspace-gc")
            .map(|o| o["metadata"]["namespace"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(namespaces_of("Role"), watched);
    assert_eq!(namespaces_of("RoleBinding"), watched);
    let service_account = namespaced.get("ServiceAccount", "workspace-gc");
    for role in namespaced.of_kind("Role") {
        if role["metadata"]["name"] == "workspace-gc" {
            assert_eq!(grants(&role["rules"]), table_grants(CLUSTER_RULES));
        }
    }
    for binding in namespaced.of_kind("RoleBinding") {
        if binding["metadata"]["name"] == "workspace-gc" {
            assert_eq!(binding["roleRef"]["kind"], "Role");
            assert_eq!(binding["roleRef"]["name"], "workspace-gc");
            assert_eq!(
                binding["subjects"],
                json!([{ "kind": "ServiceAccount", "name": "workspace-gc",
                         "namespace": service_account["metadata"]["namespace"] }])
            );
        }
    }

    // The daemon watches exactly those namespaces: the two lists in the kustomization agree.
    let args = namespaced.args();
    let flags: BTreeSet<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--namespace="))
        .map(str::to_owned)
        .collect();
    assert_eq!(flags, watched, "--namespace flags vs Roles");

    // Everything else is the base, minus what needs cluster-admin.
    let mut rest = namespaced.by_key();
    rest.retain(|_, o| {
        o["metadata"]["name"] != "workspace-gc" || !o["kind"].as_str().unwrap().starts_with("Role")
    });
    let deployment = rest
        .values_mut()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0]["args"] = json!(
        args.iter()
            .filter(|a| !a.starts_with("--namespace="))
            .collect::<Vec<_>>()
    );
    let mut expected = base.by_key();
    expected.retain(|(kind, _, _), _| {
        !matches!(
            kind.as_str(),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        )
    });
    assert_eq!(rest, expected);
}

/// Every overlay's pod template is admissible under OpenShift's `restricted-v2` SCC. The check
/// itself refuses each thing that SCC refuses, starting with the UID this base used to pin.
#[test]
fn every_overlay_runs_under_openshift_restricted_v2() {
    let overlays = [
        ("base", Rendered::of(&manifests("base"))),
        ("overlays/audit", Rendered::of(&manifests("overlays/audit"))),
        (
            "overlays/namespaced",
            Rendered::of(&manifests("overlays/namespaced")),
        ),
        ("base + components/prometheus", monitoring()),
        (
            "base + components/metrics-https",
            Overlay::new(&["base"], &["components/metrics-https"], "").render(),
        ),
    ];
    for (name, rendered) in &overlays {
        let pod = &rendered.deployment()["spec"]["template"]["spec"];
        assert_eq!(
            restricted_v2_violations(pod),
            Vec::<String>::new(),
            "{name} under restricted-v2"
        );
    }

    let pod = &overlays[0].1.deployment()["spec"]["template"]["spec"];
    let refused = |pointer: &str, value: Value| {
        let mut changed = pod.clone();
        let (parent, field) = pointer.rsplit_once('/').unwrap();
        changed
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{parent} in the pod template"))
            .insert(field.to_owned(), value.clone());
        assert!(
            !restricted_v2_violations(&changed).is_empty(),
            "{pointer} = {value} is refused by restricted-v2"
        );
    };
    refused("/securityContext/runAsUser", json!(65532));
    refused("/securityContext/runAsGroup", json!(65532));
    refused("/securityContext/fsGroup", json!(65532));
    refused(
        "/securityContext/seLinuxOptions",
        json!({ "level": "s0:c1,c2" }),
    );
    refused("/hostNetwork", json!(true));
    refused(
        "/volumes/0/hostPath",
        json!({ "path": "/var/run/docker.sock" }),
    );
    let container = "/containers/0/securityContext";
    refused(&format!("{container}/runAsUser"), json!(0));
    refused(&format!("{container}/privileged"), json!(true));
    refused(
        &format!("{container}/allowPrivilegeEscalation"),
        json!(true),
    );
    refused(
        &format!("{container}/capabilities"),
        json!({ "add": ["SYS_ADMIN"], "drop": ["ALL"] }),
    );
    refused(&format!("{container}/capabilities"), json!({}));
    refused(
        &format!("{container}/seccompProfile"),
        json!({ "type": "Unconfined" }),
    );
    refused("/containers/0/ports/0/hostPort", json!(8080));
}

#[test]
fn prometheus_component_scrapes_the_service_and_alerts_on_the_failure_modes() {
    let overlay = Overlay::new(&["base"], &["components/prometheus"], "");
    let rendered = overlay.render();
    let service = rendered.only("Service");
    let monitor = rendered.only("ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][label], value, "{label}");
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        endpoint["honorLabels"], true,
        "keeps the claims' namespace label"
    );

    let rule = rendered.only("PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let alerts: BTreeSet<String> = alert_rules(&rendered)
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect();
    for wanted in [
        "WorkspaceGCDeletionsFailing",
        "WorkspaceGCBlastRadiusCapReached",
        "WorkspaceGCCapCountUnknown",
        "WorkspaceGCNotReady",
        "WorkspaceGCReclaimLagHigh",
        "WorkspaceGCQuotaPressureUnrelieved",
        "WorkspaceGCClockOffset",
        "WorkspaceGCAdmissionDenied",
    ] {
        assert!(alerts.contains(wanted), "{wanted} in {alerts:?}");
    }
    for alert in alert_rules(&rendered) {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            alert["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
            "{name}: expr"
        );
        assert!(alert["labels"]["severity"].is_string(), "{name}: severity");
        assert!(
            alert["annotations"]["summary"].is_string(),
            "{name}: summary"
        );
        assert!(
            alert["annotations"]["description"].is_string(),
            "{name}: description"
        );
    }
    // promtool checks and unit-tests the rules (`alerts_pass_promtool_check_and_unit_tests`), and
    // a real Prometheus evaluates them on the daemon's series
    // (`prometheus_scrapes_the_daemon_and_evaluates_every_alert_and_panel`).
}

/// HTTPS metrics as the components ship them: the daemon serves them on a port of its own with
/// the mounted serving certificate, which OpenShift's service CA writes for the Service; the
/// NetworkPolicy admits that port; the daemon may make the reviews; and the ServiceMonitor
/// scrapes that port with the token of an account bound to the reader role, verifying the
/// certificate for the Service's name.
#[test]
fn metrics_https_components_serve_tls_to_the_reader_role_and_scrape_it() {
    let overlay = Overlay::new(
        &["base"],
        &[
            "components/metrics-https",
            "components/prometheus",
            "components/prometheus-https",
        ],
        "",
    );
    let rendered = overlay.render();
    let container = rendered.container();
    let scratch = scratch();
    let config = rendered.effective_config(scratch.path());
    let secure = config["http"]["secure_listen"].as_str().unwrap();
    let https_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .expect("a port named https");
    assert_eq!(
        secure.rsplit_once(':').unwrap().1,
        https_port["containerPort"].to_string()
    );
    // The probes stay plain.
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    // The certificate and key come from the mounted Secret the Service annotation names.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "metrics-tls")
        .expect("the TLS mount");
    assert_eq!(mount["readOnly"], true);
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(
        config["http"]["tls_cert_file"].as_str(),
        Some(format!("{dir}/tls.crt").as_str())
    );
    assert_eq!(
        config["http"]["tls_key_file"].as_str(),
        Some(format!("{dir}/tls.key").as_str())
    );
    let volume = rendered.deployment()["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "metrics-tls")
        .unwrap()
        .clone();
    let service = rendered.only("Service");
    assert_eq!(
        service["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"],
        volume["secret"]["secretName"]
    );
    let service_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["targetPort"] == "https")
        .expect("a Service port for https")
        .clone();
    let network = rendered.only("NetworkPolicy");
    assert_eq!(
        network["spec"]["ingress"][0]["ports"],
        json!([{ "port": "http", "protocol": "TCP" }, { "port": "https", "protocol": "TCP" }])
    );

    // RBAC: the reader may get /metrics and nothing else; the daemon may ask the reviews.
    let reader = rendered.get("ClusterRole", "workspace-gc-metrics-reader");
    assert_eq!(
        reader["rules"],
        json!([{ "nonResourceURLs": ["/metrics"], "verbs": ["get"] }])
    );
    let auth = rendered.get("ClusterRole", "workspace-gc-metrics-auth");
    assert_eq!(
        grants(&auth["rules"]),
        table_grants(&[
            ("authentication.k8s.io", "tokenreviews", &["create"]),
            ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
        ])
    );
    let daemon_account =
        json!([{ "kind": "ServiceAccount", "name": "workspace-gc", "namespace": NAMESPACE }]);
    assert_eq!(
        rendered.get("ClusterRoleBinding", "workspace-gc-metrics-auth")["subjects"],
        daemon_account
    );

    // The ServiceMonitor: that port, over TLS for the Service's name, with the scraper's token.
    let endpoints = rendered.only("ServiceMonitor")["spec"]["endpoints"].clone();
    assert_eq!(endpoints.as_array().map(Vec::len), Some(1));
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["port"], service_port["name"]);
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["honorLabels"], true);
    assert_eq!(
        endpoint["tlsConfig"]["serverName"],
        format!(
            "{}.{NAMESPACE}.svc",
            service["metadata"]["name"].as_str().unwrap()
        )
    );
    let secret_name = endpoint["authorization"]["credentials"]["name"]
        .as_str()
        .unwrap();
    let secret = rendered.get("Secret", secret_name);
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    let scraper = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        .as_str()
        .unwrap();
    let binding = rendered.get("ClusterRoleBinding", "workspace-gc-metrics-scraper");
    assert_eq!(binding["roleRef"]["name"], "workspace-gc-metrics-reader");
    assert_eq!(
        binding["subjects"],
        json!([{ "kind": "ServiceAccount", "name": scraper, "namespace": NAMESPACE }])
    );
}

fn alert_rules(rendered: &Rendered) -> Vec<Value> {
    rendered.only("PrometheusRule")["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

/// The base with the Prometheus component, rendered.
fn monitoring() -> Rendered {
    Overlay::new(&["base"], &["components/prometheus"], "").render()
}

/// The PrometheusRule's groups as a Prometheus rule file (JSON is YAML).
fn rule_file(rendered: &Rendered) -> String {
    let groups = &rendered.only("PrometheusRule")["spec"]["groups"];
    serde_json::to_string_pretty(&json!({ "groups": groups })).unwrap()
}

/// Every alert's name and expression.
fn alert_exprs(rendered: &Rendered) -> Vec<(String, String)> {
    alert_rules(rendered)
        .iter()
        .map(|rule| {
            let text = |field: &str| rule[field].as_str().unwrap_or_default().to_owned();
            (text("alert"), text("expr"))
        })
        .collect()
}

/// The Grafana dashboard the component's ConfigMap carries.
fn dashboard(rendered: &Rendered) -> Value {
    let config_map = rendered.get("ConfigMap", "workspace-gc-dashboard");
    let text = config_map["data"]["workspace-gc.json"]
        .as_str()
        .expect("the dashboard JSON");
    serde_json::from_str(text).expect("the dashboard is JSON")
}

/// Every panel's title and queries.
fn panel_queries(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|panel| {
            let title = panel["title"].as_str().expect("a title").to_owned();
            let queries = panel["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| t["expr"].as_str().expect("a PromQL expr").to_owned())
                .collect();
            (title, queries)
        })
        .collect()
}

/// A rule file with each query as a recording rule, so promtool parses and checks every one.
fn recording_rules(queries: &[String]) -> String {
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, expr)| json!({ "record": format!("dashboard:query_{i}"), "expr": expr }))
        .collect();
    serde_json::to_string_pretty(&json!({ "groups": [{ "name": "dashboard", "rules": rules }] }))
        .unwrap()
}

/// Runs `promtool ARGS` in `dir` with `stdin` as its input: whether it succeeded, and what it
/// printed.
fn promtool(dir: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write as _;
    let mut child = Command::new(prometheus_binary("promtool"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    let mut input = child.stdin.take().expect("promtool's stdin");
    input
        .write_all(stdin.as_bytes())
        .expect("write promtool's input");
    drop(input);
    let output = child.wait_with_output().expect("wait for promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// `promtool check rules` and `promtool test rules` (tests/prometheus/alerts.test.yaml, next to
/// the rule file rendered from the component): every alert parses, fires on the series that
/// should fire it and stays silent on healthy ones. Then the same unit tests against rules
/// that never fire, and rules that always do: both fail for every alert, so each alert has a
/// case that fires and one that stays silent.
#[test]
fn alerts_pass_promtool_check_and_unit_tests() {
    let rendered = monitoring();
    let dir = scratch();
    let tests = Path::new(ROOT).join("tests/prometheus/alerts.test.yaml");
    std::fs::copy(&tests, dir.path().join("alerts.test.yaml")).expect("copy the rule tests");
    let rules = rule_file(&rendered);
    std::fs::write(dir.path().join("rules.yaml"), &rules).unwrap();

    let (ok, output) = promtool(dir.path(), &["check", "rules", "rules.yaml"], "");
    assert!(ok, "promtool check rules:\n{output}");
    let alerts = alert_exprs(&rendered);
    assert!(
        output.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{output}"
    );
    let (ok, output) = promtool(dir.path(), &["test", "rules", "alerts.test.yaml"], "");
    assert!(ok, "promtool test rules:\n{output}");

    for (mutation, expr) in [
        ("never fires", "vector(1) > 2"),
        ("always fires", "vector(1)"),
    ] {
        let mutated = alerts.iter().fold(rules.clone(), |text, (_, original)| {
            let quoted = serde_json::to_string(original).unwrap();
            text.replace(&quoted, &format!("\"{expr}\""))
        });
        assert_ne!(mutated, rules);
        std::fs::write(dir.path().join("rules.yaml"), mutated).unwrap();
        let (ok, output) = promtool(dir.path(), &["test", "rules", "alerts.test.yaml"], "");
        assert!(!ok, "the unit tests pass although every alert {mutation}");
        for (name, _) in &alerts {
            assert!(
                output.contains(&format!("alertname: {name},")),
                "no unit test notices that {name} {mutation}:\n{output}"
            );
        }
    }
}

/// The dashboard ConfigMap is labelled for the Grafana sidecar, has the panels an operations
/// team asks for, and promtool parses and checks every panel's query (a broken one fails).
#[test]
fn dashboard_is_labelled_for_grafana_and_promtool_checks_every_query() {
    let rendered = monitoring();
    let config_map = rendered.get("ConfigMap", "workspace-gc-dashboard");
    assert_eq!(config_map["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        config_map["metadata"]["labels"]["grafana_dashboard"], "1",
        "the Grafana sidecar's label"
    );
    let dashboard = dashboard(&rendered);
    assert_eq!(dashboard["uid"], "workspace-gc");
    let panels = panel_queries(&dashboard);
    let titles: Vec<&str> = panels.iter().map(|(title, _)| title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "Tracked claims by namespace and verdict",
            "Tracked storage by namespace and verdict",
            "Deletions by reason and result",
            "Reclaim lag percentiles",
            "API errors by operation and category",
            "Watch restarts by kind",
            "Leader and readiness",
            "Blast-radius cap",
        ]
    );
    // Every panel and query reads the data source the user picks.
    for panel in dashboard["panels"].as_array().unwrap() {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(target["datasource"]["uid"], "${datasource}");
        }
    }

    let queries: Vec<String> = panels.into_iter().flat_map(|(_, q)| q).collect();
    let dir = scratch();
    std::fs::write(dir.path().join("dashboard.yaml"), recording_rules(&queries)).unwrap();
    let (ok, output) = promtool(dir.path(), &["check", "rules", "dashboard.yaml"], "");
    assert!(
        ok,
        "promtool check rules on the dashboard's queries:\n{output}"
    );
    assert!(
        output.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{output}"
    );
    let broken = [queries[0].trim_end_matches(')').to_owned()];
    std::fs::write(dir.path().join("broken.yaml"), recording_rules(&broken)).unwrap();
    let (ok, output) = promtool(dir.path(), &["check", "rules", "broken.yaml"], "");
    assert!(!ok, "promtool accepted a broken query:\n{output}");
}

/// Each panel's title, and its queries with their legends.
fn panels_with_legends(dashboard: &Value) -> Vec<(String, Vec<(String, String)>)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|panel| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let targets = panel["targets"].as_array().expect("targets");
            let queries = targets
                .iter()
                .map(|t| (text(&t["expr"]), text(&t["legendFormat"])))
                .collect();
            (text(&panel["title"]), queries)
        })
        .collect()
}

/// The OpenShift console component adds one ConfigMap, in openshift-config-managed with the
/// console's dashboard label, whose dashboard has the Grafana dashboard's panels, queries and
/// legends as `graph` panels (the type every console release renders); promtool checks every
/// query (the real Prometheus evaluates them with the Grafana dashboard's).
#[test]
fn console_dashboard_is_labelled_for_openshift_and_has_the_grafana_panels() {
    let with_console = Overlay::new(
        &["base"],
        &["components/prometheus", "components/openshift-console"],
        "",
    )
    .render();
    let without = monitoring();
    let before = without.by_key();
    let added: Vec<Key> = with_console
        .by_key()
        .into_keys()
        .filter(|key| !before.contains_key(key))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    let config_map = with_console.get("ConfigMap", "grafana-dashboard-workspace-gc");
    assert_eq!(
        config_map["metadata"]["namespace"], "openshift-config-managed",
        "where the console looks"
    );
    assert_eq!(
        config_map["metadata"]["labels"]["console.openshift.io/dashboard"], "true",
        "the console's label"
    );
    let console: Value = serde_json::from_str(
        config_map["data"]["workspace-gc.json"]
            .as_str()
            .expect("the dashboard JSON"),
    )
    .expect("the dashboard is JSON");
    for panel in console["panels"].as_array().unwrap() {
        assert_eq!(panel["type"], "graph", "{}", panel["title"]);
    }
    assert_eq!(
        panels_with_legends(&console),
        panels_with_legends(&dashboard(&without)),
        "the console shows what Grafana shows"
    );

    let queries: Vec<String> = panel_queries(&console)
        .into_iter()
        .flat_map(|(_, q)| q)
        .collect();
    let dir = scratch();
    std::fs::write(dir.path().join("console.yaml"), recording_rules(&queries)).unwrap();
    let (ok, output) = promtool(dir.path(), &["check", "rules", "console.yaml"], "");
    assert!(
        ok,
        "promtool check rules on the console's queries:\n{output}"
    );
    assert!(
        output.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{output}"
    );
}

// --- the API server ---------------------------------------------------------------------------

/// `kubectl apply --server-side -k DIR` as cluster-admin, exactly as the README says.
fn apply(control_plane: &ControlPlane, dir: &Path) {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig_path())
        .args(["apply", "--server-side", "-k"])
        .arg(dir)
        .stdin(Stdio::null())
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .expect("run kubectl apply");
    assert!(
        output.status.success(),
        "kubectl apply --server-side -k {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn apply_base(control_plane: &ControlPlane) {
    BASE_APPLIED
        .get_or_init(|| async {
            // The namespaced overlay's test creates this namespace too; creating it first here
            // as well leaves one create to win and kubectl only patching, never racing a create.
            ensure_namespace(&control_plane.client(), NAMESPACE).await;
            apply(control_plane, &manifests("base"));
        })
        .await;
}

/// Creates namespace `name` unless it exists (for the fixed names of the shipped overlays).
async fn ensure_namespace(client: &Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(error) => panic!("create namespace {name}: {error}"),
    }
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
        ask("patch", c, "persistentvolumeclaims", test_ns),
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
    ]
}

const CORE: &str = "";

/// The daemon's calls in one namespace it watches.
fn needed_in(ns: &str) -> Vec<Ask> {
    vec![
        ask("list", CORE, "persistentvolumeclaims", ns),
        ask("watch", CORE, "persistentvolumeclaims", ns),
        ask("delete", CORE, "persistentvolumeclaims", ns),
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

/// The real and effective UID and GID of process `pid`, and its supplementary groups.
fn credentials(pid: u32) -> (String, String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read its status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| rest.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    (field("Uid:"), field("Gid:"), field("Groups:"))
}

/// `workspace-gc audit` with the deployed configuration and the given credentials: its exit
/// code and output.
async fn audit(launch: &Launch, kubeconfig: &Path, extra: &[String]) -> (Option<i32>, String) {
    let output = launch
        .command(kubeconfig)
        .arg("audit")
        .arg(format!("--config={}", launch.config.display()))
        .args(extra)
        .output();
    let output = tokio::time::timeout(secs(60), output)
        .await
        .expect("audit finishes within a minute")
        .expect("run workspace-gc audit");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// No API call of the daemon was forbidden: its rights were enough.
fn assert_nothing_forbidden(metrics: &str) {
    let forbidden: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("workspace_gc_api_errors_total") && l.contains("forbidden"))
        .collect();
    assert!(forbidden.is_empty(), "forbidden API calls: {forbidden:?}");
}

/// The events.k8s.io events about claim `name` in `namespace`.
async fn events_about(client: &Client, namespace: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

async fn event_with_reason(
    client: &Client,
    namespace: &str,
    claim: &str,
    reason: &str,
) -> Option<Event> {
    events_about(client, namespace, claim)
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(reason))
}

async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt("workspace-gc")
        .await
        .expect("read the Lease")
        .and_then(|lease| lease.spec?.holder_identity)
}

/// Waits until `daemon` has deleted claim `name`.
async fn assert_deleted(client: &Client, namespace: &str, name: &str, daemon: &Daemon) {
    assert!(
        wait_until(secs(30), || claim_is_gone(client, namespace, name)).await,
        "the expired claim was deleted:\n{}",
        daemon.log()
    );
}

async fn claim_is_gone(client: &Client, namespace: &str, name: &str) -> bool {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .expect("read the claim")
        .is_none()
}

// --- applied ------------------------------------------------------------------------------------

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
    assert_access(&sa, &allowed, &never(ns.name())).await;

    // And nothing else at all, in a namespace it watches and in its own.
    let cluster = table_grants(CLUSTER_RULES);
    assert_eq!(rules_in(control_plane, &sa, ns.name()).await, cluster);
    let own: BTreeSet<Grant> = cluster
        .union(&lease_grants("workspace-gc"))
        .cloned()
        .collect();
    assert_eq!(rules_in(control_plane, &sa, NAMESPACE).await, own);
}

/// The guard, applied with the base as shipped, is in force for the ServiceAccount: a delete of
/// an unlabelled claim, which RBAC allows, is refused by the API server with the rule's message
/// (for real and as a server-side dry run), and the account's own kind of delete passes.
#[tokio::test(flavor = "multi_thread")]
async fn base_guard_applied_refuses_the_service_accounts_delete_of_an_unlabelled_claim() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let ns = TestNamespace::new(control_plane, "deploy-guard").await;
    let sa = control_plane
        .service_account_client(NAMESPACE, "workspace-gc")
        .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(sa, ns.name());
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
    // The API server loads a new policy a moment after it is created.
    let rule = "workspace-gc admission guard: rule label-selector:";
    assert!(
        wait_until(secs(30), || async {
            refusal(
                claims
                    .delete("user-data", &preconditions(&plain, true))
                    .await,
            )
            .is_some_and(|message| message.contains(rule))
        })
        .await,
        "the guard refuses a dry-run delete of an unlabelled claim"
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

    let labelled = ClaimBuilder::build_workspace("due-build-workspace")
        .create(&ns)
        .await;
    claims
        .delete("due-build-workspace", &preconditions(&labelled, true))
        .await
        .expect("the daemon's kind of delete is admitted");
}

/// The Namespace enforces the "restricted" Pod Security Standard, and the Deployment's pods pass
/// it: a pod from its template is admitted (server-side dry run; no scheduler runs here), one
/// with privilege escalation allowed is not, which shows the check is live.
#[tokio::test(flavor = "multi_thread")]
async fn base_pods_pass_the_restricted_pod_security_standard() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let base = Rendered::of(&manifests("base"));
    let template = &base.deployment()["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "pod-security-check", "labels": template["metadata"]["labels"] },
        "spec": template["spec"],
    }))
    .expect("the template is a pod");
    let pods = Api::<Pod>::namespaced(control_plane.client(), NAMESPACE);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(error) = pods.create(&dry_run, &pod).await {
        panic!("a pod of the Deployment is not admitted: {error}");
    }

    let mut escalating = serde_json::to_value(&pod).unwrap();
    escalating["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
        json!(true);
    let escalating: Pod = serde_json::from_value(escalating).unwrap();
    match pods.create(&dry_run, &escalating).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(status.message.contains("PodSecurity"), "{status:?}");
        }
        other => panic!("an escalating pod was not refused: {other:?}"),
    }
}

/// The daemon as the Deployment runs it, and as OpenShift's restricted-v2 runs that: the
/// ServiceAccount's token, the deployed configuration, an arbitrary UID and GID that exist
/// nowhere, and nothing writable. It becomes ready, leads, deletes an expired claim and records
/// the event.
#[tokio::test(flavor = "multi_thread")]
async fn base_daemon_deletes_an_expired_claim_with_the_deployed_rbac_and_configuration() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let admin = control_plane.client();
    let ns = TestNamespace::new(control_plane, "deploy-base").await;
    let scratch = scratch();
    let token = control_plane
        .service_account_kubeconfig(NAMESPACE, "workspace-gc")
        .await;
    let kubeconfig = readable_copy(&token, scratch.path());
    let base = Rendered::of(&manifests("base"));
    let pod_name = "workspace-gc-5d9c7b-test1";
    let launch = Launch::from(&base, pod_name, scratch.path()).confined_as(ARBITRARY_UID);

    // The confinement holds: even the world-writable directories are read-only in there.
    for dir in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let output = confined(ARBITRARY_UID, "touch")
            .arg(dir.join("workspace-gc-write-check"))
            .output()
            .await
            .expect("run touch, confined");
        assert!(
            !output.status.success()
                && String::from_utf8_lossy(&output.stderr).contains("Read-only file system"),
            "a confined process could write to {}: {output:?}",
            dir.display()
        );
    }

    // Cluster-wide reads work with the ClusterRole: the one-shot audit lists every kind in
    // every namespace (read-only) and exits 0.
    let (code, output) = audit(&launch, &kubeconfig, &[]).await;
    assert_eq!(
        code,
        Some(0),
        "cluster-wide audit as the ServiceAccount:\n{output}"
    );

    // An orphan, expired at once: the operator's claim with no PipelineRun or job.
    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    let _turn = LEASE.lock().await;
    // Scoped to this test's namespace (the ClusterRole covers it) so no other test's claim is
    // touched; otherwise exactly the Deployment's command line and environment.
    let daemon = Daemon::start(
        &launch,
        &kubeconfig,
        scratch.path(),
        &[format!("--namespace={}", ns.name())],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;

    assert_deleted(&admin, ns.name(), claim, &daemon).await;
    assert!(
        wait_until(secs(10), || async {
            event_with_reason(&admin, ns.name(), claim, "Deleted")
                .await
                .is_some()
        })
        .await,
        "a Deleted event:\n{}",
        daemon.log()
    );
    // It ran as the arbitrary UID and GID, with no other group.
    let pid = daemon.child.id().expect("the daemon is running");
    let id = ARBITRARY_UID.to_string();
    let all = [id.as_str(); 4].join(" ");
    assert_eq!(credentials(pid), (all.clone(), all, String::new()));
    let event = event_with_reason(&admin, ns.name(), claim, "Deleted")
        .await
        .unwrap();
    assert_eq!(event.reporting_controller.as_deref(), Some("workspace-gc"));
    assert_eq!(event.reporting_instance.as_deref(), Some(pod_name));
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    // It led through the Lease in its own namespace, under the pod's name.
    assert_eq!(
        lease_holder(&admin, NAMESPACE).await.as_deref(),
        Some(pod_name)
    );

    let deleted = format!(
        "workspace_gc_deletions_total{{claim_namespace=\"{}\",reason=\"orphaned\",result=\"deleted\"}}",
        ns.name()
    );
    let metrics = daemon.metrics_when(&deleted, 1.0).await;
    assert_eq!(sample(&metrics, "workspace_gc_leader"), Some(1.0));
    assert_nothing_forbidden(&metrics);

    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "exit 0 on SIGTERM:\n{log}");
    // It handed the Lease back on the way out, so a standby would not wait for expiry.
    assert_eq!(lease_holder(&admin, NAMESPACE).await, None);
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
    apply(control_plane, overlay.path());
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
    let mut denied = never(WATCHED[0]);
    // Nothing cluster-wide, and nothing in a namespace that is not listed.
    denied.extend(watched_cluster_wide());
    denied.extend(needed_in(elsewhere.name()));
    assert_access(&sa, &allowed, &denied).await;
    let cluster = table_grants(CLUSTER_RULES);
    for watched in WATCHED {
        assert_eq!(
            rules_in(control_plane, &sa, watched).await,
            cluster,
            "in {watched}"
        );
    }
    assert_eq!(
        rules_in(control_plane, &sa, elsewhere.name()).await,
        BTreeSet::new()
    );
    assert_eq!(
        rules_in(control_plane, &sa, NAMESPACE).await,
        lease_grants("workspace-gc"),
        "only its Lease in its own namespace"
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
        "metadata": { "name": claim, "labels": { BUILD_WORKSPACE_LABEL: "true" } },
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

// --- a real Prometheus --------------------------------------------------------------------------

/// How a Prometheus labels what it scrapes from the daemon.
#[derive(Debug, Clone, Copy)]
enum Scrape {
    /// The Prometheus Operator with the ServiceMonitor's `honorLabels: true`: a label the daemon
    /// exports wins over the target's.
    HonorLabels,
    /// OpenShift's user-workload monitoring: `honorLabels` forced off (a clashing exported label
    /// becomes `exported_<name>`), and `namespace` enforced to the target's namespace by a
    /// metric relabelling, as the Prometheus Operator's `enforcedNamespaceLabel` writes it.
    UserWorkload,
}

impl Scrape {
    fn job(self, target_port: u16, pod: &str) -> Value {
        let mut job = json!({
            "job_name": "workspace-gc",
            "honor_labels": matches!(self, Scrape::HonorLabels),
            "static_configs": [{
                "targets": [format!("127.0.0.1:{target_port}")],
                "labels": { "namespace": NAMESPACE, "pod": pod },
            }],
        });
        if let Scrape::UserWorkload = self {
            job["metric_relabel_configs"] = json!([
                { "action": "replace", "target_label": "namespace", "replacement": NAMESPACE }
            ]);
        }
        job
    }
}

/// A Prometheus server scraping one daemon every second with the component's rules loaded,
/// labelled as the ServiceMonitor's targets are (`namespace`, `pod`) under `scrape`'s semantics.
struct Prometheus {
    /// Killed when dropped.
    _child: tokio::process::Child,
    port: u16,
    log: PathBuf,
}

impl Prometheus {
    async fn start(
        dir: &Path,
        target_port: u16,
        pod: &str,
        rules: &str,
        scrape: Scrape,
    ) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("rules.yaml"), rules).unwrap();
        let config = json!({
            "global": { "scrape_interval": "1s", "evaluation_interval": "1s" },
            "rule_files": ["rules.yaml"],
            "scrape_configs": [scrape.job(target_port, pod)],
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).unwrap();
        let port = free_port();
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = tokio::process::Command::new(prometheus_binary("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            _child: child,
            port,
            log,
        };
        assert!(
            wait_until(secs(60), || async {
                http_get(prometheus.port, "/-/ready").await.0 == 200
            })
            .await,
            "Prometheus became ready:\n{}",
            prometheus.log()
        );
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `data` of an API answer, which must be a success.
    async fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, path).await;
        let answer: Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("GET {path}: {status} {body}"));
        assert_eq!(answer["status"], "success", "GET {path}: {answer}");
        answer["data"].clone()
    }

    /// The result vector of an instant query.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The labels a Grafana legend shows for one series: `{{label}}` replaced by its value.
fn legend(format: &str, series: &Value) -> String {
    let mut text = format.to_owned();
    if let Some(labels) = series["metric"].as_object() {
        for (name, value) in labels {
            text = text.replace(
                &format!("{{{{{name}}}}}"),
                value.as_str().unwrap_or_default(),
            );
        }
    }
    text
}

/// The metrics that carry a claim's namespace.
const PER_NAMESPACE: [&str; 5] = [
    "workspace_gc_claims",
    "workspace_gc_tracked_bytes",
    "workspace_gc_deletions_total",
    "workspace_gc_dry_run_would_delete_total",
    "workspace_gc_quota_used_ratio",
];

/// The daemon watching two namespaces (one claim deleted and one protected in the first; one
/// protected in the second, under a full storage quota), scraped by a real Prometheus with the
/// shipped rules, once under each scrape semantics of [`Scrape`]. `promtool check metrics` passes
/// on its `/metrics` as plain clients get it; Prometheus parses what it negotiates
/// (OpenMetrics). On each: every per-namespace series names its claim's namespace apart from the
/// target's; every alert evaluates without error, and the only one pending is the quota alert,
/// for the full namespace alone; every panel shows data, its series told apart by their
/// legends, and the per-namespace panels show each namespace. (That every name they read is
/// exported, including counters nothing here increments, is a unit test in src/observe/metrics.rs.)
#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_daemon_and_evaluates_every_alert_and_panel() {
    let control_plane = ControlPlane::shared();
    let admin = control_plane.client();
    let ns = TestNamespace::new(control_plane, "deploy-prometheus").await;
    let full = TestNamespace::new(control_plane, "deploy-prometheus-full").await;
    let base = Rendered::of(&manifests("base"));
    let scratch = scratch();
    let pod = "workspace-gc-prometheus";
    let launch = Launch::from(&base, pod, scratch.path());
    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    ClaimBuilder::build_workspace("kept-build-workspace")
        .annotation("workspace-gc.mlops.dev/keep", "true")
        .create(&ns)
        .await;
    let held = ClaimBuilder::build_workspace("held-build-workspace")
        .annotation("workspace-gc.mlops.dev/keep", "true")
        .create(&full)
        .await;
    let request = held
        .spec
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned())
        .expect("the claim requests storage");
    // Exactly full, with nothing workspace-gc may take: the quota alert stays pending there.
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some("storage".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(BTreeMap::from([("requests.storage".to_owned(), request)])),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    };
    full.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    // Its own Lease-free run: the RBAC is another test's concern.
    let daemon = Daemon::start(
        &launch,
        control_plane.kubeconfig_path(),
        scratch.path(),
        &[
            format!("--namespace={}", ns.name()),
            format!("--namespace={}", full.name()),
            "--no-leader-election".to_owned(),
        ],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;
    assert_deleted(&admin, ns.name(), claim, &daemon).await;
    let ratio = format!(
        r#"workspace_gc_quota_used_ratio{{claim_namespace="{}",quota="storage",resource="requests.storage"}}"#,
        full.name()
    );
    assert!(
        wait_until(secs(60), || async {
            sample(&daemon.metrics().await, &ratio) == Some(1.0)
        })
        .await,
        "the daemon sees {}'s quota full:\n{}",
        full.name(),
        daemon.metrics().await
    );

    let (status, text) = daemon.get("/metrics").await;
    assert_eq!(status, 200);
    let (ok, output) = promtool(scratch.path(), &["check", "metrics"], &text);
    assert!(
        ok && output.trim().is_empty(),
        "promtool check metrics:\n{output}\n{text}"
    );

    let monitoring = monitoring();
    let dashboard = dashboard(&monitoring);
    let alerts = alert_exprs(&monitoring);
    for scrape in [Scrape::HonorLabels, Scrape::UserWorkload] {
        let dir = scratch.path().join(format!("{scrape:?}"));
        let prometheus =
            Prometheus::start(&dir, daemon.port, pod, &rule_file(&monitoring), scrape).await;
        evaluate_every_alert_and_panel(&prometheus, &dashboard, &alerts, [&ns, &full]).await;
    }

    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "{log}");
}

/// The checks of [`prometheus_scrapes_the_daemon_and_evaluates_every_alert_and_panel`] on one
/// Prometheus: `namespaces` are the one with the deleted claim and the one with a full quota.
async fn evaluate_every_alert_and_panel(
    prometheus: &Prometheus,
    dashboard: &Value,
    alerts: &[(String, String)],
    [ns, full]: [&TestNamespace; 2],
) {
    // Rates need two samples of the deletion counter, and the rules one evaluation.
    assert!(
        wait_until(secs(30), || async {
            let samples = prometheus
                .query("count_over_time(workspace_gc_deletions_total[1m])")
                .await;
            // A sample's value is a decimal string: compare it as a number ("10" < "3").
            samples
                .first()
                .and_then(|s| s["value"][1].as_str())
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|n| n >= 3.0)
        })
        .await,
        "Prometheus scraped the daemon's deletion:\n{}",
        prometheus.log()
    );
    // The reclaim-lag alert's bucket bound is spelled as Prometheus stores it.
    let bucket = r#"workspace_gc_reclaim_lag_seconds_bucket{le="300.0"}"#;
    assert_eq!(prometheus.query(bucket).await.len(), 1, "{bucket}");

    // Every per-namespace series keeps its claim's namespace, whatever became of `namespace`.
    let both = BTreeSet::from([ns.name().to_owned(), full.name().to_owned()]);
    for name in PER_NAMESPACE {
        for series in prometheus.query(name).await {
            let labels = &series["metric"];
            assert_eq!(
                labels["namespace"], NAMESPACE,
                "the target's namespace: {series}"
            );
            assert!(labels.get("exported_namespace").is_none(), "{series}");
            let claim_ns = labels["claim_namespace"].as_str().unwrap_or_default();
            assert!(both.contains(claim_ns), "a claim's namespace: {series}");
        }
    }

    // Every alert evaluates without error; the only one pending is the quota alert, for the
    // full namespace alone (and in the daemon's namespace, where OpenShift evaluates it).
    assert!(
        wait_until(secs(15), || async {
            let rules = prometheus.api("/api/v1/rules").await;
            let health: Vec<&str> = rules["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap())
                .map(|r| r["health"].as_str().unwrap_or_default())
                .collect();
            health.len() == alerts.len() && health.iter().all(|h| *h == "ok")
        })
        .await,
        "every rule evaluated without error: {}",
        prometheus.api("/api/v1/rules").await
    );
    let pending = || async {
        let alerts = prometheus.api("/api/v1/alerts").await["alerts"].clone();
        alerts
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let label = |name: &str| a["labels"][name].as_str().unwrap_or_default().to_owned();
                (
                    label("alertname"),
                    label("namespace"),
                    label("claim_namespace"),
                )
            })
            .collect::<Vec<_>>()
    };
    let wanted = vec![(
        "WorkspaceGCQuotaPressureUnrelieved".to_owned(),
        NAMESPACE.to_owned(),
        full.name().to_owned(),
    )];
    assert!(
        wait_until(secs(15), || async { pending().await == wanted }).await,
        "pending alerts {:?}, wanted {wanted:?}",
        pending().await
    );

    // Every panel's queries evaluate; each shows data (one of its queries has a result) but
    // those of errors, which a healthy daemon has none of. Each query's series have distinct
    // legends, and the per-namespace panels show both namespaces.
    let mut blank = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        let mut shown = BTreeSet::new();
        for target in panel["targets"].as_array().unwrap() {
            let format = target["legendFormat"].as_str().unwrap_or_default();
            let series = prometheus.query(target["expr"].as_str().unwrap()).await;
            let legends: Vec<String> = series.iter().map(|s| legend(format, s)).collect();
            let distinct: BTreeSet<&String> = legends.iter().collect();
            assert_eq!(distinct.len(), legends.len(), "{title}: {legends:?}");
            shown.extend(legends);
        }
        if shown.is_empty() {
            blank.push(title);
        }
        if title.contains("by namespace") {
            for name in &both {
                assert!(
                    shown.iter().any(|l| l.split(' ').any(|word| word == name)),
                    "{title} shows {name}: {shown:?}"
                );
            }
        }
    }
    assert_eq!(
        blank,
        [
            "API errors by operation and category",
            "Watch restarts by kind"
        ]
    );
}
