//! Every overlay and component rendered with `kubectl kustomize` and checked, without a
//! cluster: the base (hardened Deployment, least-privilege RBAC, the guard), the audit and
//! namespaced overlays, a printed guard patched over the shipped one, and the Prometheus and
//! HTTPS-metrics components.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::monitoring::alert_rules;
use crate::rbac::{CLUSTER_RULES, cluster_grants, grants, lease_grants, table_grants};
use crate::{BINARY, FENCE, GUARD, LABEL_GUARD, NAMESPACE, ROOT, WATCHED, scratch};
use testkit::{Key, Overlay, Rendered, manifests};

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
        key("ValidatingAdmissionPolicy", NAMESPACE, FENCE),
        key("ValidatingAdmissionPolicyBinding", NAMESPACE, FENCE),
        key("ValidatingAdmissionPolicy", NAMESPACE, LABEL_GUARD),
        key("ValidatingAdmissionPolicyBinding", NAMESPACE, LABEL_GUARD),
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

    // RBAC: the ClusterRole is the reviewed table and the label guard's read; the Lease Role
    // names the configured Lease.
    let cluster_role = base.get("ClusterRole", "workspace-gc");
    assert_eq!(grants(&cluster_role["rules"]), cluster_grants());
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
    // (tests/cluster/admission.rs checks it was printed from this config.toml and what it refuses).
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

    // The fence reads the daemon's Lease, where its leader election keeps it, and refuses when
    // it is missing; the Lease's holder is the pod's name (POD_NAME, above), which the fence
    // compares with the pod a token is bound to.
    let fence = base.get("ValidatingAdmissionPolicy", FENCE);
    assert_eq!(
        fence["spec"]["matchConditions"],
        policy["spec"]["matchConditions"]
    );
    assert_eq!(
        fence["spec"]["paramKind"],
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})
    );
    let fence_binding = base.get("ValidatingAdmissionPolicyBinding", FENCE);
    assert_eq!(fence_binding["spec"]["policyName"], FENCE);
    assert_eq!(
        fence_binding["spec"]["paramRef"],
        json!({
            "name": lease_name,
            "namespace": account["metadata"]["namespace"],
            "parameterNotFoundAction": "Allow",
        })
    );
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
            "revocation-only",
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

    // Nothing cluster-scoped but the label guard and the right to read it, all four marked for
    // the cluster admin who applies them (`-l app.kubernetes.io/component=label-guard`): a
    // namespace admin can apply all the rest.
    let mut cluster_scoped = BTreeSet::new();
    for object in &namespaced.0 {
        let kind = object["kind"].as_str().unwrap().to_owned();
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let admission = kind.starts_with("ValidatingAdmissionPolicy");
        if admission || object.pointer("/metadata/namespace").is_none() {
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/component"], "label-guard",
                "cluster-scoped object in the namespaced overlay not marked: {kind} {name}"
            );
            cluster_scoped.insert((kind, name));
        }
    }
    let marked = |kind: &str| (kind.to_owned(), LABEL_GUARD.to_owned());
    assert_eq!(
        cluster_scoped,
        BTreeSet::from([
            marked("ClusterRole"),
            marked("ClusterRoleBinding"),
            marked("ValidatingAdmissionPolicy"),
            marked("ValidatingAdmissionPolicyBinding"),
        ])
    );

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

    // Everything else is the base, minus what needs cluster-admin (the label guard is checked
    // in tests/deploy/label_guard.rs).
    let mut rest = namespaced.by_key();
    rest.retain(|_, o| {
        (o["metadata"]["name"] != "workspace-gc"
            || !o["kind"].as_str().unwrap().starts_with("Role"))
            && o["metadata"]["name"] != LABEL_GUARD
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
    expected.retain(|(kind, _, name), _| {
        !matches!(
            kind.as_str(),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        ) && name != LABEL_GUARD
    });
    assert_eq!(rest, expected);
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
        "WorkspaceGCInvalidNamespacePolicy",
        "WorkspaceGCUnprovenLabelFlood",
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

/// The rights every test runs the daemon with (`testkit::shipped`, issue 46) are the rendered
/// manifests' own: the base's ClusterRole (which the namespaced overlay's Roles and the chart
/// equal, checked above and in tests/cluster/helm.rs), the Lease's Role, and each component's
/// rules when the configuration turns its switch on. And no test kit file writes the daemon's
/// rights on claims by hand: a copy could drift wider than what ships.
#[test]
fn the_test_kits_daemon_rights_are_derived_from_the_rendered_manifests() {
    let rendered = Rendered::of(&manifests("base"));
    let shipped = |rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>| {
        grants(&serde_json::to_value(rules).expect("rules as JSON"))
    };
    let mut config = workspace_gc::config::Config::default();
    assert_eq!(
        shipped(testkit::shipped::cluster_rules(&config)),
        grants(&rendered.get("ClusterRole", "workspace-gc")["rules"])
    );
    assert_eq!(
        shipped(testkit::shipped::lease_rules()),
        grants(&rendered.get("Role", "workspace-gc-lease")["rules"])
    );
    // Each component adds its own rules, and only when switched on.
    config.namespace_policy.enabled = true;
    config.deletion.read_volumes = true;
    config.deletion.released_volume_ttl = Some(std::time::Duration::from_secs(60));
    let overlay = Overlay::new(
        &["base"],
        &[
            "components/namespace-policy",
            "components/retained-volumes",
            "components/released-volumes",
        ],
        "",
    );
    let all: BTreeSet<_> = (overlay.render().of_kind("ClusterRole").iter())
        .flat_map(|role| grants(&role["rules"]))
        .collect();
    assert_eq!(shipped(testkit::shipped::cluster_rules(&config)), all);
    for file in ["testkit/src/replicas.rs", "testkit/src/cluster.rs"] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(file)).expect("read the test kit");
        assert!(
            !text.contains("&[\"persistentvolumeclaims\"]"),
            "{file} writes rights on claims by hand instead of deriving them"
        );
    }
}
