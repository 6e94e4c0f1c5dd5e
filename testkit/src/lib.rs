//! workspace-gc's test kit: a real local control plane (`scripts/control-plane`), per-test
//! namespaces, the daemon's process, HTTP fault proxies, builders for the objects workspace-gc
//! reads, and the policy oracle. One library for every test binary in `tests/` and for the
//! benchmark (`bench/`), which uses the audit log, a process's HTTP endpoints and metrics,
//! `scripts/control-plane`, the objects' shapes and the percentile from here.

mod audit;
pub mod audit_log;
mod claims;
mod cluster;
mod daemon;
mod faketime;
pub mod graph;
mod http_proxy;
mod kubelet;
mod manifests;
mod node;
mod objects;
pub mod oracle;
mod paths;
mod prometheus;
mod proxy;
mod replicas;
pub mod scrape;
pub mod script;
pub mod shapes;
pub mod shipped;
pub mod stats;
mod witness;

pub use audit::{
    DEFAULT_RECHECK_BOUND, DeleteInvariant, Violation, ViolationKind, invariant_audit_rules,
};
pub use audit_log::{AuditEvent, read_audit};
pub use claims::{
    Fate, deleted_events, events, expiring, fate, forward_held_delete, in_secs, revoked,
};
pub use cluster::{
    ControlPlane, ControlPlaneOptions, DAEMON_ACCOUNT, HaPlane, TestNamespace, kubernetes_minor,
    kubernetes_version, load_config, policy_rule, tekton_version,
};
pub use daemon::{Daemon, Process, audit_output, audit_rows};
pub use faketime::faketime;
pub use http_proxy::{Fault, Faulted, Forwarded, RequestInfo, Rule, RuleId, service_account};
pub use kubelet::{PodState, kubelet};
pub use manifests::{
    ARBITRARY_UID, DeployedDaemon, Key, Launch, Overlay, RESTRICTED_V2_VOLUMES, Rendered, confined,
    key_of, manifests, readable_copy, restricted_v2_violations, sample, strings,
};
pub use node::{
    IMAGE_REPOSITORY, IMAGE_TAG, METADATA_AUDIT_POLICY, PodRequest, assert_nothing_left,
    container_pid, credentials, image_archive, kubectl, load_image, node_lane, node_requested,
    node_turn, pod_requests, root_mount_options,
};
pub use objects::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, JobBuilder, PipelineRunBuilder, PodBuilder, claim_exists,
    create_with_spec, finished_build, notebook_validation_job_resource, pipeline_resource,
    pipeline_run_resource, run_condition, task_run_resource, webhook_that_is_down,
};
pub use paths::daemon_binary;
pub use prometheus::{helm_binary, prometheus_binary, release_tool};
pub use proxy::Proxy;
pub use replicas::{
    binary_vars, capped, daemon_role, deleted, deleted_count, elected_role, elected_vars,
    leads_within_the_cap, log_dir, overdue_under_a_cap, replica_through, set_var, warned,
};
pub use scrape::{free_port, http_get, metric, metric_sum};
pub use witness::{assert_decided, decided, decided_since, reconciles};

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `condition` every 100 ms until it returns true or `timeout` passes; returns whether it
/// became true. Meant for `assert!(wait_until(..).await, "what we waited for")`.
pub async fn wait_until<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
