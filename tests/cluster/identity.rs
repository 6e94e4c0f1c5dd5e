//! Requests that name workspace-gc: every request `run`, `audit` and `create` send carries the
//! User-Agent `workspace-gc/<version> (<command>)`, as the API server's audit log records it, so
//! the traffic can be told apart there and in API Priority and Fairness; and what they write is
//! recorded under the field manager `workspace-gc`.
//!
//! One dedicated control plane with an audit log; each command runs as the real binary under a
//! ServiceAccount of its own, so the log's user names which command sent each request.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;
use testkit::{
    ClaimBuilder, ControlPlane, ControlPlaneOptions, JobBuilder, Process, TestNamespace,
    daemon_binary, wait_until,
};

const NAMESPACE: &str = "identity";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The User-Agent `command` must send.
fn agent(command: &str) -> String {
    format!("workspace-gc/{} ({command})", env!("CARGO_PKG_VERSION"))
}

/// The audit policy: every request, at Metadata level (user, user agent, verb, object).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// A kubeconfig for ServiceAccount `name` of [`NAMESPACE`], bound to cluster-admin: for the
/// one-shot commands a person runs (`audit`, `create`), whose rights are not what this test is
/// about; the daemon runs as it ships.
async fn identity(control_plane: &ControlPlane, name: &str) -> std::path::PathBuf {
    let kubeconfig = control_plane
        .service_account_kubeconfig(NAMESPACE, name)
        .await;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("identity-{name}")),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "cluster-admin".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: name.to_owned(),
            namespace: Some(NAMESPACE.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(control_plane.client())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind cluster-admin");
    kubeconfig
}

/// `workspace-gc ARGS` with `kubeconfig`: its exit code, and what it printed.
async fn run_command(kubeconfig: &Path, args: &[&str]) -> (Option<i32>, String) {
    let output = tokio::process::Command::new(daemon_binary())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .output();
    let output = tokio::time::timeout(secs(60), output)
        .await
        .expect("finishes within a minute")
        .expect("run workspace-gc");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// The audit log's events of user `user`: (verb, resource, user agent).
fn requests_of(log: &Path, user: &str) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["user"]["username"] == user)
        .map(|event| {
            let text = |pointer: &str| {
                event
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            (
                text("/verb"),
                text("/objectRef/resource"),
                text("/userAgent"),
            )
        })
        .collect()
}

/// The field managers recorded on an object.
fn managers(meta: &ObjectMeta) -> Vec<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_names_workspace_gc_and_its_command_in_the_audit_log() {
    let logs = tempfile::Builder::new()
        .prefix("workspace-gc-identity-")
        .tempdir()
        .expect("a directory for the audit log");
    let policy = logs.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).unwrap();
    let audit_log = logs.path().join("audit.log");
    let control_plane = ControlPlane::start_with(&ControlPlaneOptions {
        controller_manager: false,
        apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
        ],
    });
    let ns = TestNamespace::named(&control_plane, NAMESPACE).await;
    let admin = control_plane.client();

    // run: deletes an expired orphan, writes its event and holds the Lease.
    let claim = "orphan-build-workspace";
    ClaimBuilder::build_workspace(claim).create(&ns).await;
    let vars = [
        ("WORKSPACE_GC_SELECTOR_NAMESPACES", NAMESPACE.to_owned()),
        ("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "1s".to_owned()),
        (
            "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
            NAMESPACE.to_owned(),
        ),
    ];
    // The daemon as it ships: its own ServiceAccount with the manifests' rights.
    let kubeconfig = ns.daemon_kubeconfig(&vars).await;
    let daemon = Process::spawn(&kubeconfig, &vars, "gc-run", &logs.path().join("run.log"));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NAMESPACE);
    let events: Api<Event> = Api::namespaced(admin.clone(), NAMESPACE);
    // Without kube-controller-manager the claim stays Terminating on its pvc-protection
    // finalizer: the delete is what counts here.
    assert!(
        wait_until(secs(30), || async {
            let deleting = claims
                .get_opt(claim)
                .await
                .ok()
                .flatten()
                .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
            let recorded = events.list(&Default::default()).await.is_ok_and(|list| {
                list.items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("Deleted"))
            });
            deleting && recorded
        })
        .await,
        "the daemon deleted the claim and recorded it:\n{}",
        daemon.logs()
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "run exits 0 on SIGTERM");

    // audit: lists everything once.
    let kubeconfig = identity(&control_plane, "gc-audit").await;
    let (code, output) = run_command(&kubeconfig, &["audit", "--namespace", NAMESPACE]).await;
    assert_eq!(code, Some(0), "{output}");

    // create: reads the job, creates its claim.
    JobBuilder::new("nb").create(&ns).await;
    let kubeconfig = identity(&control_plane, "gc-create").await;
    let (code, output) = run_command(
        &kubeconfig,
        &["create", "--namespace", NAMESPACE, "--job", "nb"],
    )
    .await;
    assert_eq!(code, Some(0), "{output}");

    // Every request of each identity carries its command's User-Agent, and each sent what the
    // command does.
    for (command, needed) in [
        (
            "run",
            // Lists stream as watches (`sendInitialEvents`); the live re-check still lists.
            &[
                ("watch", "persistentvolumeclaims"),
                ("list", "pods"),
                ("delete", "persistentvolumeclaims"),
                ("create", "events"),
                ("create", "leases"),
            ][..],
        ),
        ("audit", &[("watch", "persistentvolumeclaims")][..]),
        (
            "create",
            &[
                ("get", "notebookvalidationjobs"),
                ("create", "persistentvolumeclaims"),
            ][..],
        ),
    ] {
        let account = match command {
            "run" => testkit::DAEMON_ACCOUNT.to_owned(),
            _ => format!("gc-{command}"),
        };
        let user = format!("system:serviceaccount:{NAMESPACE}:{account}");
        let wanted = agent(command);
        // The log is written as requests complete; the last ones may lag a little.
        assert!(
            wait_until(secs(10), || async {
                let requests = requests_of(&audit_log, &user);
                needed.iter().all(|(verb, resource)| {
                    requests.iter().any(|(v, r, _)| v == verb && r == resource)
                })
            })
            .await,
            "{command} sent {needed:?}: {:?}",
            requests_of(&audit_log, &user)
        );
        let strays: Vec<_> = requests_of(&audit_log, &user)
            .into_iter()
            .filter(|(_, _, agent)| *agent != wanted)
            .collect();
        assert!(
            strays.is_empty(),
            "requests of {command} without the User-Agent {wanted:?}: {strays:?}"
        );
    }

    // The writes carry the field manager workspace-gc: the created claim (named explicitly) and
    // the event (which the server names after the User-Agent).
    let created = claims
        .get("nb-build-workspace")
        .await
        .expect("the created claim");
    assert_eq!(managers(&created.metadata), ["workspace-gc"]);
    let deleted = events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Deleted"))
        .expect("the Deleted event");
    assert_eq!(managers(&deleted.metadata), ["workspace-gc"]);
}
