//! The Helm chart (charts/workspace-gc) against the kustomize manifests, its reference: with
//! default values and in each mode it renders the objects the matching kustomization renders
//! (normalising only what the two tools must do differently), its schema refuses bad values, its
//! admission guard is the one `workspace-gc admission-policy` prints for the configuration it
//! installs, and a real Helm (hack/helm, built and cached by scripts/control-plane) lints,
//! installs, upgrades and uninstalls it on the real API server of the test kit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use testkit::{
    ClaimBuilder, ControlPlane, DeployedDaemon, Key, Launch, Overlay, Rendered, TestNamespace,
    claim_exists, helm_binary, manifests, restricted_v2_violations, wait_until,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_workspace-gc");
/// The namespace the manifests install into, and the release namespace of every render here.
const NAMESPACE: &str = "workspace-gc";
const RELEASE: &str = "wg";

fn chart() -> PathBuf {
    Path::new(ROOT).join("charts/workspace-gc")
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("helm-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("create a scratch directory")
}

/// `helm ARGS` with its own empty config, cache and data directories and no proxy: its exit
/// status and output (stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = scratch();
    let output = Command::new(helm_binary())
        .args(args)
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .output()
        .expect("run helm");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `helm template` of the chart in `namespace` with `values` (each `--set`, `--set-file`, ...
/// and its argument): the rendered objects, or helm's error.
fn template_in(namespace: &str, values: &[&str]) -> Result<Rendered, String> {
    let chart = chart();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(values);
    match helm(&args) {
        (true, stdout, _) => Ok(Rendered::parse(&stdout)),
        (false, _, stderr) => Err(stderr),
    }
}

fn template(values: &[&str]) -> Rendered {
    template_in(NAMESPACE, values).unwrap_or_else(|e| panic!("helm template {values:?}:\n{e}"))
}

// --- parity -----------------------------------------------------------------------------------

/// The labels Helm's conventions add to every object; the manifests have none of them.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Kinds that have no namespace (kustomize v5.5 writes its `namespace:` into the guard's two).
const CLUSTER_SCOPED: [&str; 5] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

fn remove_if_empty(object: &mut Value, field: &str) {
    if object
        .get(field)
        .is_some_and(|value| value.as_object().is_some_and(|map| map.is_empty()))
    {
        object.as_object_mut().unwrap().remove(field);
    }
}

/// What may differ between the two tools, made equal: Helm's labels, and how a changed
/// configuration rolls the pods (kustomize: a hash suffix on the ConfigMap's name; Helm: a
/// checksum annotation on the pod template); and kustomize's namespace on cluster-scoped kinds,
/// which the API server drops.
fn normalised(rendered: &Rendered) -> BTreeMap<Key, Value> {
    let hashed: Vec<String> = rendered
        .of_kind("ConfigMap")
        .iter()
        .filter_map(|cm| cm["metadata"]["name"].as_str())
        .filter(|name| is_hashed(name))
        .map(str::to_owned)
        .collect();
    let mut text = serde_json::to_string(&rendered.0).unwrap();
    for name in &hashed {
        text = text.replace(&format!("\"{name}\""), "\"workspace-gc-config\"");
    }
    let objects: Vec<Value> = serde_json::from_str(&text).unwrap();
    objects
        .into_iter()
        .map(|mut object| {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let metadata = &mut object["metadata"];
            if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
                HELM_LABELS.iter().for_each(|label| {
                    labels.remove(*label);
                });
            }
            remove_if_empty(metadata, "labels");
            if CLUSTER_SCOPED.contains(&kind.as_str()) {
                metadata.as_object_mut().unwrap().remove("namespace");
            }
            if kind == "Deployment" {
                let template = &mut object["spec"]["template"]["metadata"];
                if let Some(annotations) = template
                    .get_mut("annotations")
                    .and_then(Value::as_object_mut)
                {
                    annotations.remove("checksum/config");
                }
                remove_if_empty(template, "annotations");
            }
            (testkit::key_of(&object), object)
        })
        .collect()
}

/// `workspace-gc-config-` and kustomize's ten-character content hash.
fn is_hashed(name: &str) -> bool {
    name.strip_prefix("workspace-gc-config-")
        .is_some_and(|hash| hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// Every difference between the chart's objects and kustomize's, described; empty when equal.
fn differences(chart: &Rendered, kustomize: &Rendered) -> Vec<String> {
    let (chart, kustomize) = (normalised(chart), normalised(kustomize));
    let mut out = Vec::new();
    for (key, object) in &kustomize {
        match chart.get(key) {
            None => out.push(format!("only kustomize renders {key:?}")),
            Some(ours) if ours != object => out.push(format!(
                "{key:?} differs:\n--- kustomize\n{}\n--- chart\n{}",
                serde_json::to_string_pretty(object).unwrap(),
                serde_json::to_string_pretty(ours).unwrap()
            )),
            Some(_) => {}
        }
    }
    for key in chart.keys().filter(|key| !kustomize.contains_key(*key)) {
        out.push(format!("only the chart renders {key:?}"));
    }
    out
}

/// The chart with each mode's values renders what the mode's kustomization renders: the base
/// (with the Namespace object on request: Helm's release namespace exists before the install),
/// the audit and namespaced overlays, and the base with each component. The chart's copies of
/// component files (files/) are held to the originals by this comparison too.
#[test]
fn chart_renders_what_the_kustomize_manifests_render_in_every_mode() {
    let with = |components: &[&str]| Overlay::new(&["base"], components, "").render();
    let cases: Vec<(&str, Vec<&str>, Rendered)> = vec![
        (
            "base",
            vec!["--set", "namespace.create=true"],
            Rendered::of(&manifests("base")),
        ),
        (
            "audit",
            vec!["--set", "namespace.create=true,audit=true"],
            Rendered::of(&manifests("overlays/audit")),
        ),
        (
            "namespaced",
            vec!["--set", "namespaced.namespaces={team-a,team-b}"],
            Rendered::of(&manifests("overlays/namespaced")),
        ),
        (
            "prometheus",
            vec!["--set", "namespace.create=true,prometheus.enabled=true"],
            with(&["components/prometheus"]),
        ),
        (
            "metrics-https",
            vec!["--set", "namespace.create=true,metricsHttps.enabled=true"],
            with(&["components/metrics-https"]),
        ),
        (
            "prometheus-https",
            vec![
                "--set",
                "namespace.create=true,metricsHttps.enabled=true,prometheus.enabled=true,\
                 prometheus.https=true",
            ],
            with(&[
                "components/metrics-https",
                "components/prometheus",
                "components/prometheus-https",
            ]),
        ),
        (
            "namespace-policy",
            vec![
                "--set",
                "namespace.create=true,namespacePolicy.enabled=true",
            ],
            with(&["components/namespace-policy"]),
        ),
        (
            "retained-volumes",
            vec![
                "--set",
                "namespace.create=true,retainedVolumes.enabled=true",
            ],
            with(&["components/retained-volumes"]),
        ),
        (
            "retained-volumes and released-volumes",
            vec![
                "--set",
                "namespace.create=true,retainedVolumes.enabled=true,releasedVolumes.enabled=true",
            ],
            with(&["components/retained-volumes", "components/released-volumes"]),
        ),
        (
            "openshift-console",
            vec![
                "--set",
                "namespace.create=true,prometheus.enabled=true,openshiftConsole.enabled=true",
            ],
            with(&["components/prometheus", "components/openshift-console"]),
        ),
        // Together, each of the container's environment variables in kustomize's order.
        (
            "metrics-https, namespace-policy and retained-volumes",
            vec![
                "--set",
                "namespace.create=true,metricsHttps.enabled=true,namespacePolicy.enabled=true,\
                 retainedVolumes.enabled=true",
            ],
            with(&[
                "components/metrics-https",
                "components/namespace-policy",
                "components/retained-volumes",
            ]),
        ),
    ];
    let mut failures = Vec::new();
    for (mode, values, kustomize) in &cases {
        for difference in differences(&template(values), kustomize) {
            failures.push(format!("{mode}: {difference}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    // With no values at all: the base but its Namespace.
    let mut base = Rendered::of(&manifests("base"));
    base.0.retain(|object| object["kind"] != "Namespace");
    assert_eq!(differences(&template(&[]), &base), Vec::<String>::new());
}

/// The comparison sees a difference: a changed value is one, and so is each part of the
/// normalisation left out (the ConfigMap's name, the Helm labels).
#[test]
fn parity_check_reports_a_changed_value() {
    let base = Rendered::of(&manifests("base"));
    let changed = template(&["--set", "namespace.create=true,replicas=3"]);
    let found = differences(&changed, &base);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("\"Deployment\"") && found[0].contains("\"replicas\": 3"));
    let renamed = template(&["--set", "namespace.create=true,config.policy.max_age=3d"]);
    let found = differences(&renamed, &base);
    assert!(
        found.iter().any(|d| d.contains("\"ConfigMap\"")),
        "{found:#?}"
    );
}

// --- values -----------------------------------------------------------------------------------

fn helm_fails(values: &[&str]) -> String {
    match template_in(NAMESPACE, values) {
        Ok(rendered) => panic!("helm template {values:?} rendered:\n{rendered:#?}"),
        Err(error) => error,
    }
}

/// values.schema.json refuses, at install time, what the daemon or the API server would refuse
/// later, and keys nothing reads.
#[test]
fn schema_refuses_bad_values() {
    for bad in [
        "replicas=0",
        "replicas=two",
        "image.pullPolicy=Sometimes",
        "audit=yes",
        "config.policy.max_age=5",
        "config.policy.maxAge=3d",
        "config.deletion.deletes_per_second=0",
        "config.deletion.max_deletions_per_window=0",
        "config.logging.format=xml",
        "config.quota.high_water=2",
        "namespaced.namespaces={Team_A}",
        "replica=2",
        "namespacePolicy.enabled=yes",
        "retainedVolumes=true",
        "releasedVolumes.enabled=yes",
        "releasedVolumes.ttl=",
        "openshiftConsole.enabled=1",
    ] {
        let error = helm_fails(&["--set", bad]);
        assert!(
            error.contains("values don't meet the specifications of the schema"),
            "{bad}: {error}"
        );
    }
    let error = helm_fails(&["--set", "prometheus.enabled=true,prometheus.https=true"]);
    assert!(error.contains("set metricsHttps.enabled"), "{error}");
    // Nor what would leave the daemon without the RBAC a setting needs, or grant cluster-wide
    // reads in namespaced mode.
    for (values, refusal) in [
        ("openshiftConsole.enabled=true", "set prometheus.enabled"),
        (
            "config.namespace_policy.enabled=true",
            "set namespacePolicy.enabled",
        ),
        (
            "config.deletion.read_volumes=true",
            "set retainedVolumes.enabled",
        ),
        (
            "namespacePolicy.enabled=true,namespaced.namespaces={team-a}",
            "not with namespaced.namespaces",
        ),
        (
            "retainedVolumes.enabled=true,namespaced.namespaces={team-a}",
            "not with namespaced.namespaces",
        ),
        (
            "config.deletion.read_volumes=true,retainedVolumes.enabled=true,\
             config.deletion.released_volume_ttl=1d",
            "set releasedVolumes.enabled",
        ),
        (
            "releasedVolumes.enabled=true",
            "needs retainedVolumes.enabled",
        ),
    ] {
        let error = helm_fails(&["--set", values]);
        assert!(error.contains(refusal), "{values}: {error}");
    }
}

/// The values people change reach the objects: image, replicas, resources, labels and
/// annotations, scheduling and the priority class.
#[test]
fn values_reach_the_deployment_and_every_object() {
    let rendered = template(&[
        "--set",
        "image.repository=registry.example/workspace-gc,image.tag=1.2.3,replicas=3",
        "--set",
        "resources.requests.memory=200Mi,resources.limits.memory=400Mi",
        "--set",
        "labels.team=platform,annotations.owner=ops,podLabels.tier=gc,podAnnotations.note=x",
        "--set",
        "nodeSelector.kubernetes\\.io/os=linux,priorityClassName=system-cluster-critical",
        "--set",
        "tolerations[0].key=infra,tolerations[0].operator=Exists",
        "--set",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool,affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ]);
    let deployment = rendered.deployment();
    let pod = &deployment["spec"]["template"];
    let container = rendered.container();
    assert_eq!(container["image"], "registry.example/workspace-gc:1.2.3");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        container["resources"],
        json!({ "requests": { "cpu": "50m", "memory": "200Mi" }, "limits": { "memory": "400Mi" } })
    );
    assert_eq!(pod["metadata"]["labels"]["tier"], "gc");
    assert_eq!(pod["metadata"]["annotations"]["note"], "x");
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({ "kubernetes.io/os": "linux" })
    );
    assert_eq!(pod["spec"]["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{ "key": "infra", "operator": "Exists" }])
    );
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "pool"
    );
    // The selector stays what the manifests write out, or an upgrade could not patch it.
    assert_eq!(
        deployment["spec"]["selector"],
        json!({ "matchLabels": { "app.kubernetes.io/name": "workspace-gc" } })
    );
    for object in &rendered.0 {
        let key = testkit::key_of(object);
        assert_eq!(object["metadata"]["labels"]["team"], "platform", "{key:?}");
        assert_eq!(object["metadata"]["annotations"]["owner"], "ops", "{key:?}");
    }
}

/// `image.digest`, as scripts/release pins it, names the image by digest whatever the tag; the
/// schema takes only a sha256 digest.
#[test]
fn a_digest_pins_the_image() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let rendered = template(&[
        "--set",
        &format!(
            "image.repository=registry.example/workspace-gc,image.tag=1.2.3,image.digest={digest}"
        ),
    ]);
    assert_eq!(
        rendered.container()["image"],
        format!("registry.example/workspace-gc@{digest}")
    );
    for bad in ["latest", "sha256:0123", "sha512:0123456789abcdef"] {
        let error = helm_fails(&["--set", &format!("image.digest={bad}")]);
        assert!(
            error.contains("values don't meet the specifications of the schema"),
            "{bad}: {error}"
        );
    }
}

/// The mounted file's text.
fn config_text(rendered: &Rendered) -> String {
    let config_map = rendered.mounted_config_map();
    config_map["data"]["config.toml"]
        .as_str()
        .expect("the ConfigMap holds config.toml")
        .to_owned()
}

fn checksum(rendered: &Rendered) -> String {
    rendered.deployment()["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .expect("a checksum/config annotation")
        .to_owned()
}

/// The configuration reaches the pod as config.toml, key by key or as a whole file, as the
/// daemon's own loader reads it; a changed configuration, and only that, changes the pod
/// template (which rolls the Deployment).
#[test]
fn configuration_reaches_the_pod_as_config_toml_and_a_change_rolls_the_pods() {
    let dir = scratch();
    let defaults = template(&[]);
    assert_eq!(
        config_text(&defaults),
        std::fs::read_to_string(Path::new(ROOT).join("config.toml")).unwrap()
    );
    assert_eq!(
        defaults.container()["args"],
        json!(["run", "--config=/etc/workspace-gc/config.toml"])
    );

    let keyed = template(&[
        "--set",
        "config.policy.max_age=3d,config.deletion.max_deletions_per_window=20",
        "--set",
        "config.http.listen=0.0.0.0:9090,config.leader_election.lease_name=gc-lease",
        "--set",
        "config.quota.enabled=false",
        // The guard's fence names the Lease: the_guard_follows_… passes a guard printed for it.
        "--set",
        "admissionGuard.enabled=false",
    ]);
    let effective = keyed.effective_config(dir.path());
    assert_eq!(effective["policy"]["max_age"].as_str(), Some("3days"));
    assert_eq!(
        effective["deletion"]["max_deletions_per_window"].as_integer(),
        Some(20)
    );
    // A key set to false overrides a default of true.
    assert_eq!(effective["quota"]["enabled"].as_bool(), Some(false));
    // The rest keeps the defaults.
    assert_eq!(effective["policy"]["orphan_grace"].as_str(), Some("10m"));
    // What depends on a key follows it: the container port, the Lease the Role names.
    assert_eq!(keyed.container()["ports"][0]["containerPort"], 9090);
    assert_eq!(
        keyed.get("Role", "workspace-gc-lease")["rules"][0]["resourceNames"],
        json!(["gc-lease"])
    );

    let file = dir.path().join("whole.toml");
    let whole = "[policy]\nmax_age = \"2d\"\n";
    std::fs::write(&file, whole).unwrap();
    let replaced = template(&["--set-file", &format!("configToml={}", file.display())]);
    assert_eq!(config_text(&replaced), whole);
    assert_eq!(
        replaced.effective_config(dir.path())["policy"]["max_age"].as_str(),
        Some("2days")
    );

    assert_ne!(checksum(&keyed), checksum(&defaults));
    assert_ne!(checksum(&replaced), checksum(&defaults));
    assert_eq!(
        checksum(&template(&["--set", "replicas=3"])),
        checksum(&defaults)
    );
}

// --- the admission guard ----------------------------------------------------------------------

/// `workspace-gc admission-policy` for `config` and ServiceAccount `service_account`, written
/// to a file in `dir`.
fn printed_guard(dir: &Path, config: &str, service_account: &str) -> PathBuf {
    let config_file = dir.join("guard-config.toml");
    std::fs::write(&config_file, config).unwrap();
    let output = Command::new(BINARY)
        .args(["admission-policy", "--config"])
        .arg(&config_file)
        .args(["--service-account", service_account])
        .env_clear()
        .output()
        .expect("run workspace-gc admission-policy");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let path = dir.join(format!("guard-{}.yaml", service_account.replace(':', "-")));
    std::fs::write(&path, &output.stdout).unwrap();
    path
}

/// The guard's two objects, without labels (the chart adds the base's).
fn guard_objects(rendered: &Rendered) -> BTreeMap<Key, Value> {
    normalised(rendered)
        .into_iter()
        .filter(|((kind, _, _), _)| kind.starts_with("ValidatingAdmissionPolicy"))
        .map(|(key, mut object)| {
            object["metadata"].as_object_mut().unwrap().remove("labels");
            (key, object)
        })
        .collect()
}

/// A changed selector or namespace list changes what the guard must say. The chart renders no
/// guard it cannot vouch for: without the guard printed for the new configuration it refuses to
/// render (the old one would refuse every delete, or one for another ServiceAccount guard
/// nothing); with it, it renders exactly that guard. Only the ServiceAccount of another release
/// namespace it fills in itself, and that too is what the binary prints.
#[test]
fn the_guard_follows_the_selector_and_the_release_namespace_or_the_chart_refuses() {
    let dir = scratch();
    let without = |namespace: &str, set: &str| {
        template_in(
            namespace,
            &["--set", set, "--set", "admissionGuard.enabled=false"],
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    for (namespace, set) in [
        (
            NAMESPACE,
            "config.selector.label_selector=team=ml\\,build in (a\\,b)",
        ),
        (NAMESPACE, "config.selector.namespaces={ml-a,ml-b}"),
        (
            NAMESPACE,
            "config.selector.exclude_namespaces={kube-system}",
        ),
        (
            "gc-elsewhere",
            "config.selector.label_selector=mlops.redhat.com/build-workspace=false",
        ),
        // The fence follows the Lease, and there is none without leader election.
        (NAMESPACE, "config.leader_election.lease_namespace=leases"),
        (NAMESPACE, "config.leader_election.lease_name=gc-lease"),
        (NAMESPACE, "config.leader_election.enabled=false"),
    ] {
        let error = template_in(namespace, &["--set", set]).expect_err(set);
        assert!(
            error.contains("workspace-gc admission-policy --config config.toml")
                && error.contains(&format!("--service-account {namespace}:workspace-gc")),
            "{set}: {error}"
        );
        let config = config_text(&without(namespace, set));
        let printed = printed_guard(dir.path(), &config, &format!("{namespace}:workspace-gc"));
        let policy = format!("admissionGuard.policy={}", printed.display());
        let rendered = template_in(namespace, &["--set", set, "--set-file", &policy])
            .unwrap_or_else(|e| panic!("{set}: {e}"));
        let expected = Rendered::parse(&std::fs::read_to_string(&printed).unwrap());
        assert_eq!(guard_objects(&rendered), guard_objects(&expected), "{set}");
        // The guard's policy and binding, the fence's with leader election, the label guard's.
        let fenced = !set.ends_with("enabled=false");
        assert_eq!(guard_objects(&rendered).len(), if fenced { 6 } else { 4 });

        // The default guard passed for this configuration is refused as stale.
        let stale = printed_guard(
            dir.path(),
            &config_text(&template(&[])),
            "workspace-gc:workspace-gc",
        );
        let policy = format!("admissionGuard.policy={}", stale.display());
        template_in(namespace, &["--set", set, "--set-file", &policy]).expect_err(set);
    }
    // The shipped guard is the printed one for the shipped configuration, in the manifests'
    // namespace or any other.
    for namespace in [NAMESPACE, "gc-elsewhere"] {
        let defaults = template_in(namespace, &[]).unwrap_or_else(|e| panic!("{e}"));
        let service_account = format!("{namespace}:workspace-gc");
        let printed = printed_guard(dir.path(), &config_text(&defaults), &service_account);
        let expected = Rendered::parse(&std::fs::read_to_string(printed).unwrap());
        assert_eq!(guard_objects(&defaults), guard_objects(&expected));
    }
    // Off on request; in namespaced mode, only the label guard (as the namespaced overlay).
    assert!(guard_objects(&template(&["--set", "admissionGuard.enabled=false"])).is_empty());
    let namespaced = guard_objects(&template(&["--set", "namespaced.namespaces={team-a}"]));
    assert_eq!(namespaced.len(), 2);
    assert!(
        (namespaced.keys()).all(|(_, _, name)| name == "workspace-gc-label-guard"),
        "{namespaced:?}"
    );
    // A writer listed in the configuration needs a label guard printed for it.
    let writer = "config.provenance.label_writers={system:serviceaccount:op:manager}";
    let error = template_in(NAMESPACE, &["--set", writer]).expect_err(writer);
    assert!(error.contains("provenance.label_writers"), "{error}");
}

// --- a real Helm on the real API server ---------------------------------------------------------

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn helm_on(control_plane: &ControlPlane, args: &[&str]) -> String {
    let kubeconfig = control_plane.kubeconfig_path().to_str().unwrap().to_owned();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--kubeconfig", &kubeconfig, "--namespace", NAMESPACE]);
    let (ok, stdout, stderr) = helm(&all);
    assert!(ok, "helm {args:?} failed:\n{stdout}{stderr}");
    stdout
}

/// Whether `object` (from the release's manifest) still exists on the server.
fn exists(control_plane: &ControlPlane, object: &Value) -> bool {
    let api_version = object["apiVersion"].as_str().unwrap();
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let kind = object["kind"].as_str().unwrap();
    let resource = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig_path())
        .args([
            "get",
            &resource,
            object["metadata"]["name"].as_str().unwrap(),
        ])
        .args(["--ignore-not-found", "-o", "name"]);
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        command.args(["--namespace", namespace]);
    }
    let output = command
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .expect("run kubectl get");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    !output.stdout.is_empty()
}

/// helm lint and template; helm install on the real API server, whose Deployment's pod template
/// passes restricted-v2 and the restricted Pod Security admission, and whose configuration,
/// RBAC and admission guard let the daemon run as the ServiceAccount become ready and delete an
/// expired claim; helm upgrade with a changed value rolls the pod template; helm uninstall
/// leaves nothing of what the chart created.
#[tokio::test(flavor = "multi_thread")]
async fn helm_installs_upgrades_and_uninstalls_the_chart_on_a_real_api_server() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let (ok, stdout, stderr) = helm(&["lint", "--strict", chart, "--namespace", NAMESPACE]);
    assert!(ok, "helm lint:\n{stdout}{stderr}");

    let control_plane = ControlPlane::shared();
    let admin = control_plane.client();
    // The release namespace exists before the install, labelled as manifests/base labels it.
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": { "name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest" } }
    }))
    .unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the release namespace");
    // Without the label guard: it binds every user in every namespace, and the other tests of
    // this binary, on the same control plane, label claims after making them. It is applied as
    // shipped in tests/deploy/label_guard.rs and on the node (tests/node/installed.rs).
    let no_label_guard = ["--set", "admissionGuard.labelGuard=false"];
    let notes = helm_on(
        control_plane,
        &[&["install", RELEASE, chart][..], &no_label_guard].concat(),
    );
    assert!(notes.contains("get lease workspace-gc"), "{notes}");
    let installed = Rendered::parse(&helm_on(control_plane, &["get", "manifest", RELEASE]));
    assert_eq!(
        differences(&installed, &template(&no_label_guard)),
        Vec::<String>::new()
    );

    // The Deployment as the server stored it.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), NAMESPACE);
    let stored = serde_json::to_value(deployments.get("workspace-gc").await.unwrap()).unwrap();
    let template_spec = &stored["spec"]["template"];
    assert_eq!(
        restricted_v2_violations(&template_spec["spec"]),
        Vec::<String>::new()
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "helm-pod-security-check",
                      "labels": template_spec["metadata"]["labels"] },
        "spec": template_spec["spec"],
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(error) = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&dry_run, &pod)
        .await
    {
        panic!("a pod of the installed Deployment is not admitted: {error}");
    }

    // The daemon with the installed Deployment's arguments and environment and the installed
    // ConfigMap, as the installed ServiceAccount, scoped to a test namespace.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let config_map =
        serde_json::to_value(config_maps.get("workspace-gc-config").await.unwrap()).unwrap();
    let server = Rendered(vec![stored.clone(), config_map]);
    let dir = scratch();
    // A token bound to the daemon's pod, as the kubelet mounts it: the guard's fence admits
    // the deletes of the Lease holder's pod only.
    let pod_name = "workspace-gc-helm-test";
    let kubeconfig = testkit::readable_copy(
        &control_plane
            .pod_bound_kubeconfig(NAMESPACE, "workspace-gc", pod_name)
            .await,
        dir.path(),
    );
    let ns = TestNamespace::new(control_plane, "helm").await;
    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    let launch = Launch::from(&server, pod_name, dir.path());
    let daemon = DeployedDaemon::start(
        &launch,
        &kubeconfig,
        dir.path(),
        &[format!("--namespace={}", ns.name())],
        &[("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s")],
    )
    .await;
    assert!(
        wait_until(secs(60), || async { !claim_exists(&ns, claim).await }).await,
        "the daemon as installed did not delete the expired claim:\n{}",
        daemon.log()
    );
    let (status, log) = daemon.stop().await;
    assert_eq!(status.code(), Some(0), "{log}");

    // A changed value: the ConfigMap carries it and the pod template changes, so the pods roll.
    helm_on(
        control_plane,
        &[
            "upgrade",
            RELEASE,
            chart,
            "--set",
            "config.policy.max_age=3d",
            "--set",
            "admissionGuard.labelGuard=false",
        ],
    );
    let upgraded = serde_json::to_value(deployments.get("workspace-gc").await.unwrap()).unwrap();
    let annotation = |deployment: &Value| {
        deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"].clone()
    };
    assert_ne!(annotation(&upgraded), annotation(&stored));
    assert!(
        upgraded["metadata"]["generation"].as_i64() > stored["metadata"]["generation"].as_i64()
    );
    let text = config_maps
        .get("workspace-gc-config")
        .await
        .unwrap()
        .data
        .unwrap()["config.toml"]
        .clone();
    assert!(
        text.contains("max_age = '3d'") || text.contains("max_age = \"3d\""),
        "{text}"
    );

    let upgraded_manifest = Rendered::parse(&helm_on(control_plane, &["get", "manifest", RELEASE]));
    helm_on(control_plane, &["uninstall", RELEASE, "--wait"]);
    let mut left = Vec::new();
    let gone = wait_until(secs(60), || {
        left = upgraded_manifest
            .0
            .iter()
            .filter(|object| exists(control_plane, object))
            .map(testkit::key_of)
            .collect();
        let empty = left.is_empty();
        async move { empty }
    })
    .await;
    assert!(gone, "left behind after helm uninstall: {left:?}");
    // Nor the release's own record.
    let releases: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin, NAMESPACE);
    let records = releases
        .list(&kube::api::ListParams::default().labels("owner=helm"))
        .await
        .unwrap();
    assert!(records.items.is_empty(), "{:?}", records.items);
}
