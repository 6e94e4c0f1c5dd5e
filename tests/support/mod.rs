//! Test support: a real local control plane (`scripts/control-plane`), per-test namespaces, and
//! builders for the objects workspace-gc reads. Included by integration tests with `mod support;`.
//! A few files depend on nothing else here and are shared with the benchmark, which includes
//! them with `#[path]` (bench/reclaim.rs): audit_log.rs (the API server's audit log), scrape.rs
//! (a process's HTTP endpoints and metrics), script.rs (scripts/control-plane up and down),
//! shapes.rs (the objects' specs, labels and conditions) and stats.rs (the one percentile; the soak includes
//! it the same way, so that its unit tests run once, in the soak's binary).
// Each test binary compiles this module but uses only part of it.
#![allow(dead_code)]

mod audit;
mod audit_log;
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
mod prometheus;
mod proxy;
mod replicas;
mod scrape;
mod script;
mod shapes;
mod witness;

// Each test binary uses a different subset of these re-exports, too.
#[allow(unused_imports)]
pub use audit::{
    DEFAULT_RECHECK_BOUND, DeleteInvariant, Violation, ViolationKind, invariant_audit_rules,
};
#[allow(unused_imports)]
pub use audit_log::{AuditEvent, read_audit};
#[allow(unused_imports)]
pub use claims::{
    Fate, deleted_events, events, expiring, fate, forward_held_delete, in_secs, revoked,
};
#[allow(unused_imports)]
pub use cluster::{
    ControlPlane, ControlPlaneOptions, TestNamespace, kubernetes_minor, kubernetes_version,
    load_config, policy_rule, tekton_version,
};
#[allow(unused_imports)]
pub use daemon::{Daemon, Process, audit_rows, binary};
#[allow(unused_imports)]
pub use faketime::faketime;
#[allow(unused_imports)]
pub use http_proxy::{Fault, Faulted, Forwarded, RequestInfo, Rule, RuleId, service_account};
#[allow(unused_imports)]
pub use kubelet::{PodState, kubelet};
#[allow(unused_imports)]
pub use manifests::{
    ARBITRARY_UID, DeployedDaemon, Key, Launch, Overlay, RESTRICTED_V2_VOLUMES, Rendered, confined,
    key_of, manifests, readable_copy, restricted_v2_violations, sample, strings,
};
#[allow(unused_imports)]
pub use node::{
    IMAGE_REPOSITORY, IMAGE_TAG, METADATA_AUDIT_POLICY, PodRequest, assert_nothing_left,
    container_pid, credentials, image_archive, kubectl, load_image, node_lane, node_requested,
    node_turn, pod_requests, root_mount_options,
};
#[allow(unused_imports)]
pub use objects::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, JobBuilder, PipelineRunBuilder, PodBuilder, claim_exists,
    create_with_spec, finished_build, notebook_validation_job_resource, pipeline_resource,
    pipeline_run_resource, run_condition, task_run_resource,
};
#[allow(unused_imports)]
pub use prometheus::{helm_binary, prometheus_binary, release_tool};
#[allow(unused_imports)]
pub use proxy::Proxy;
#[allow(unused_imports)]
pub use replicas::{
    binary_vars, capped, daemon_role, deleted, deleted_count, elected_role, elected_vars,
    leads_within_the_cap, log_dir, overdue_under_a_cap, replica_through, set_var, warned,
};
#[allow(unused_imports)]
pub use scrape::{free_port, http_get, metric, metric_sum};
#[allow(unused_imports)]
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
