//! A real Prometheus scraping the daemon with the shipped rules: every alert evaluates, every
//! panel shows data, per-namespace series name their claim's namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use kube::api::{ObjectMeta, PostParams};
use serde_json::{Value, json};

use crate::monitoring::{alert_exprs, dashboard, monitoring, rule_file};
use crate::promtool::promtool;
use crate::server::assert_deleted;
use crate::{NAMESPACE, scratch, secs};
use testkit::{
    ClaimBuilder, ControlPlane, DeployedDaemon as Daemon, Launch, Rendered, TestNamespace,
    free_port, http_get, manifests, prometheus_binary, sample, wait_until,
};

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
/// exported, including counters nothing here increments, is a unit test in src/observe/metrics/mod.rs.)
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
