//! The Prometheus component's alerts and dashboards checked by promtool: rules parse and pass
//! their unit tests (each alert fires and stays silent where it should), every dashboard query
//! parses, and the OpenShift console dashboard matches the Grafana one.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::monitoring::{
    alert_exprs, dashboard, monitoring, panel_queries, panels_with_legends, rule_file,
};
use crate::{NAMESPACE, ROOT, scratch};
use testkit::{Key, Overlay, prometheus_binary};

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
pub fn promtool(dir: &Path, args: &[&str], stdin: &str) -> (bool, String) {
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
            "Storage freed and kept by Retain (1h)",
            "Work queue depth by state",
            "Work queue wait",
            "Retries by category and claims failing",
            "Claim DELETEs unresolved",
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
