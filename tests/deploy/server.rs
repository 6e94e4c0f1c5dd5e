//! The API server side of the applied tests: `kubectl apply --server-side -k` as the README
//! says, `workspace-gc audit` as deployed, and reading back what a daemon did (claims, events,
//! the Lease).

use std::path::Path;
use std::process::{Command, Stdio};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::{BASE_APPLIED, NAMESPACE, secs};
use testkit::{ControlPlane, DeployedDaemon as Daemon, Launch, manifests, wait_until};

/// `kubectl apply --server-side -k DIR` as cluster-admin, exactly as the README says.
pub fn apply(control_plane: &ControlPlane, dir: &Path) {
    apply_with(control_plane, dir, &[]);
}

/// [`apply`] with more arguments, such as a label selector (`-l`) that picks some objects.
pub fn apply_with(control_plane: &ControlPlane, dir: &Path, extra: &[&str]) {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig_path())
        .args(["apply", "--server-side", "-k"])
        .arg(dir)
        .args(extra)
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

pub async fn apply_base(control_plane: &ControlPlane) {
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
pub async fn ensure_namespace(client: &Client, name: &str) {
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

/// `workspace-gc audit` with the deployed configuration and the given credentials: its exit
/// code and output.
pub async fn audit(launch: &Launch, kubeconfig: &Path, extra: &[String]) -> (Option<i32>, String) {
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
pub fn assert_nothing_forbidden(metrics: &str) {
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

pub async fn event_with_reason(
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

pub async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt("workspace-gc")
        .await
        .expect("read the Lease")
        .and_then(|lease| lease.spec?.holder_identity)
}

/// Waits until `daemon` has deleted claim `name`.
pub async fn assert_deleted(client: &Client, namespace: &str, name: &str, daemon: &Daemon) {
    assert!(
        wait_until(secs(30), || claim_is_gone(client, namespace, name)).await,
        "the expired claim was deleted:\n{}",
        daemon.log()
    );
}

pub async fn claim_is_gone(client: &Client, namespace: &str, name: &str) -> bool {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .expect("read the claim")
        .is_none()
}
