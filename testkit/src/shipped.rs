//! The daemon's rights as the manifests ship them, read from `manifests/` whenever a test needs
//! them, never copied: a test runs the daemon with exactly what an installation grants it, so a
//! request the shipped roles deny fails the test that sends it (issue 46, class 1).
//!
//! Which files grant what follows the manifests' own structure: the base's ClusterRole always;
//! the Role on the Lease when leader election is on; the components' ClusterRoles when the
//! configuration turns on what they are for (each component's kustomization sets that switch).

use k8s_openapi::api::rbac::v1::PolicyRule;
use workspace_gc::config::Config;

use super::manifests::{Rendered, manifests};

/// The rules of every ClusterRole and Role in the manifest file `path` (under `manifests/`).
pub fn rules_in(path: &str) -> Vec<PolicyRule> {
    let file = manifests(path);
    let text =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    (Rendered::parse(&text).0.iter())
        .filter(|object| matches!(object["kind"].as_str(), Some("ClusterRole" | "Role")))
        .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
        .map(|rule| {
            serde_json::from_value::<PolicyRule>(rule.clone())
                .unwrap_or_else(|e| panic!("a rule of {}: {e}: {rule}", file.display()))
        })
        .collect()
}

/// The manifest files whose roles grant what `config` needs, cluster-wide: the base's
/// ClusterRole and each component the configuration turns on.
pub fn cluster_role_files(config: &Config) -> Vec<&'static str> {
    let mut files = vec!["base/rbac-cluster.yaml"];
    if config.namespace_policy.enabled {
        files.push("components/namespace-policy/rbac.yaml");
    }
    if config.deletion.read_volumes {
        files.push("components/retained-volumes/rbac.yaml");
    }
    if config.deletion.released_volume_ttl.is_some() {
        files.push("components/released-volumes/rbac.yaml");
    }
    files
}

/// The cluster-wide rules the shipped manifests grant the daemon for `config`.
pub fn cluster_rules(config: &Config) -> Vec<PolicyRule> {
    (cluster_role_files(config).into_iter())
        .flat_map(rules_in)
        .collect()
}

/// The rules on the Lease, granted in the Lease's namespace.
pub fn lease_rules() -> Vec<PolicyRule> {
    rules_in("base/rbac-lease.yaml")
}

/// Whether `rules` grant `verb` on `resource` of `group` (any name).
pub fn grants(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|rule| {
        let has = |items: &Option<Vec<String>>, item: &str| {
            (items.iter().flatten()).any(|i| i == item || i == "*")
        };
        has(&rule.api_groups, group)
            && has(&rule.resources, resource)
            && rule.verbs.iter().any(|v| v == verb || v == "*")
    })
}
