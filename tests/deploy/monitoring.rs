//! The Prometheus component rendered: its alert rules and dashboards, for promtool.rs and
//! prometheus.rs.

use serde_json::{Value, json};

use testkit::{Overlay, Rendered};

pub fn alert_rules(rendered: &Rendered) -> Vec<Value> {
    rendered.only("PrometheusRule")["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

/// The base with the Prometheus component, rendered.
pub fn monitoring() -> Rendered {
    Overlay::new(&["base"], &["components/prometheus"], "").render()
}

/// The PrometheusRule's groups as a Prometheus rule file (JSON is YAML).
pub fn rule_file(rendered: &Rendered) -> String {
    let groups = &rendered.only("PrometheusRule")["spec"]["groups"];
    serde_json::to_string_pretty(&json!({ "groups": groups })).unwrap()
}

/// Every alert's name and expression.
pub fn alert_exprs(rendered: &Rendered) -> Vec<(String, String)> {
    alert_rules(rendered)
        .iter()
        .map(|rule| {
            let text = |field: &str| rule[field].as_str().unwrap_or_default().to_owned();
            (text("alert"), text("expr"))
        })
        .collect()
}

/// The Grafana dashboard the component's ConfigMap carries.
pub fn dashboard(rendered: &Rendered) -> Value {
    let config_map = rendered.get("ConfigMap", "workspace-gc-dashboard");
    let text = config_map["data"]["workspace-gc.json"]
        .as_str()
        .expect("the dashboard JSON");
    serde_json::from_str(text).expect("the dashboard is JSON")
}

/// Every panel's title and queries.
pub fn panel_queries(dashboard: &Value) -> Vec<(String, Vec<String>)> {
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

/// Each panel's title, and its queries with their legends.
pub fn panels_with_legends(dashboard: &Value) -> Vec<(String, Vec<(String, String)>)> {
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
