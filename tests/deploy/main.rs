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
//! shared by every test of this daemon_binary, so only one test applies the base as shipped; the
//! others apply a throw-away overlay with a name prefix (and, for audit, a namespace of its
//! own), which gives each its own ServiceAccount and so its own identity. Two daemons that
//! compete for the same Lease take turns ([`LEASE`]).
//!
//! One daemon_binary, so that those shared names are applied once and the Lease is taken in turns; one
//! module per concern:
//! - `rendering`: every overlay and component rendered and checked, without a cluster;
//! - `rbac`: the rights as applied, asked as the ServiceAccount; the admission guard in force;
//! - `label_guard`: the label guard rendered in every install, and in force as applied;
//! - `restricted_v2`: OpenShift's `restricted-v2` SCC and the restricted Pod Security Standard;
//! - `arbitrary_uid`: the binary as the Deployment runs it, as an arbitrary UID, read-only;
//! - `promtool`: the alerts' unit tests and every dashboard query, by promtool;
//! - `prometheus`: a real Prometheus scraping the daemon and evaluating every alert and panel;
//! - `monitoring` and `server`: what those share (the rendered component; apply and read back).

mod arbitrary_uid;
mod label_guard;
mod monitoring;
mod prometheus;
mod promtool;
mod rbac;
mod rendering;
mod restricted_v2;
mod server;

use std::time::Duration;
use tokio::sync::{Mutex, OnceCell};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

const BINARY: &str = env!("CARGO_BIN_EXE_workspace-gc");

/// Where the shipped manifests put the daemon.
const NAMESPACE: &str = "workspace-gc";

/// The namespaces the `namespaced` overlay watches, as shipped.
const WATCHED: [&str; 2] = ["team-a", "team-b"];

/// The admission guard's policy and binding (manifests/components/admission-guard).
const GUARD: &str = "workspace-gc-guard";
/// The fence (the same component): claim and volume deletes only from the Lease holder's pod.
const FENCE: &str = "workspace-gc-fence";
/// The label guard (the same component, on in every install): nobody adds the build-workspace
/// label to an existing claim but `provenance.label_writers`.
const LABEL_GUARD: &str = "workspace-gc-label-guard";

/// Serializes the daemons that use the Lease `workspace-gc` in namespace `workspace-gc` (the
/// base's and the namespaced overlay's): a second one would stand by and never delete.
static LEASE: Mutex<()> = Mutex::const_new(());

/// The base is applied once per test daemon_binary, by whichever test needs it first.
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
