//! The product as installed: the image of the Dockerfile's runtime stage (scripts/image) loaded
//! into containerd, and the Deployment of `manifests/base` and of the Helm chart's default
//! install as real pods on a real kubelet (`scripts/control-plane up --node`): real probes, the
//! security context as the runtime enforces it, SIGTERM at pod deletion, the Lease handed over
//! when the leader's pod goes, a claim a running container really mounts, and the label guard
//! the install ships, in force (`kubectl label` refused) and seen by the pods.
//!
//! The lane needs root and minutes, so it runs only when asked (`CONTROL_PLANE_NODE=1`, as
//! scripts/test sets); otherwise each test says it was skipped. One node per host: the tests
//! take turns, each on a control plane and node of its own.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use testkit::{
    ClaimBuilder, ControlPlane, IMAGE_REPOSITORY, IMAGE_TAG, METADATA_AUDIT_POLICY, Overlay,
    TestNamespace, assert_nothing_left, claim_exists, container_pid, credentials, helm_binary,
    image_archive, kubectl, load_image, node_lane, node_turn, pod_requests, root_mount_options,
    wait_until,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_workspace-gc");
const NAMESPACE: &str = "workspace-gc";
const SELECTOR: &str = "app.kubernetes.io/name=workspace-gc";
/// The Deployment's terminationGracePeriodSeconds and config.toml's lease_duration.
const GRACE: Duration = Duration::from_secs(30);
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// The image's user: distroless's `nonroot`, all four IDs.
const NONROOT: &str = "65532 65532 65532 65532";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The manifests with the test's image.
const IMAGE_OVERLAY: &str = "images:
  - name: workspace-gc
    newName: localhost/workspace-gc
    newTag: node-test
";

/// The manifests with the test's image and a one-second orphan grace (10 minutes as shipped),
/// and nothing else changed.
const BASE_OVERLAY: &str = "images:
  - name: workspace-gc
    newName: localhost/workspace-gc
    newTag: node-test
patches:
  - target: {kind: Deployment, name: workspace-gc}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {name: WORKSPACE_GC_POLICY_ORPHAN_GRACE, value: 1s}
";

/// When the lane runs, the test's turn on the host and a node of its own; the node goes first
/// when both are dropped.
async fn node_for(test: &str) -> Option<(tokio::sync::MutexGuard<'static, ()>, Installed)> {
    let turn = node_turn(test).await?;
    Some((turn, Installed::node()))
}

/// A control plane with a node, an audit log of every request's metadata, and the image loaded.
struct Installed {
    control_plane: ControlPlane,
    audit_log: std::path::PathBuf,
    _scratch: tempfile::TempDir,
}

impl Installed {
    fn node() -> Installed {
        let scratch = tempfile::Builder::new()
            .prefix("node-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a scratch directory");
        let policy = scratch.path().join("audit-policy.yaml");
        std::fs::write(&policy, METADATA_AUDIT_POLICY).expect("write the audit policy");
        let audit_log = scratch.path().join("audit.log");
        let control_plane = ControlPlane::start_with_node(&[
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
        ]);
        load_image(&control_plane, image_archive(BINARY));
        Installed {
            control_plane,
            audit_log,
            _scratch: scratch,
        }
    }

    /// `kubectl apply --server-side -k manifests/base` with [`BASE_OVERLAY`].
    fn install_base(&self) {
        let overlay = Overlay::new(&["base"], &[], BASE_OVERLAY);
        kubectl(
            &self.control_plane,
            &[
                "apply",
                "--server-side",
                "-k",
                overlay.path().to_str().unwrap(),
            ],
        );
    }

    /// The chart's default install, but for the image and the orphan grace.
    fn install_chart(&self) {
        kubectl(&self.control_plane, &["create", "namespace", NAMESPACE]);
        let chart = Path::new(ROOT).join("charts/workspace-gc");
        let kubeconfig = self.control_plane.kubeconfig_path();
        let home = tempfile::tempdir().expect("a helm home");
        let output = std::process::Command::new(helm_binary())
            .args(["install", "wg", chart.to_str().unwrap()])
            .args(["--namespace", NAMESPACE, "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--set", &format!("image.repository={IMAGE_REPOSITORY}")])
            .args(["--set", &format!("image.tag={IMAGE_TAG}")])
            .args(["--set", "config.policy.orphan_grace=1s"])
            .env("HELM_CONFIG_HOME", home.path().join("config"))
            .env("HELM_CACHE_HOME", home.path().join("cache"))
            .env("HELM_DATA_HOME", home.path().join("data"))
            .output()
            .expect("run helm");
        assert!(
            output.status.success(),
            "helm install:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn client(&self) -> Client {
        self.control_plane.client()
    }

    /// The daemon's pods that are Ready and not being deleted, once there are `n` of them.
    async fn ready_pods(&self, n: usize, within: Duration) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client(), NAMESPACE);
        let deadline = Instant::now() + within;
        let ready = loop {
            let ready: Vec<Pod> = (pods.list(&ListParams::default().labels(SELECTOR)).await)
                .map(|list| list.items)
                .unwrap_or_default()
                .into_iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_none() && is_ready(pod))
                .collect();
            if ready.len() == n || Instant::now() >= deadline {
                break ready;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            ready.len() == n,
            "{n} ready pods within {within:?}; ready: {:?}\n{}",
            names(&ready),
            self.describe()
        );
        ready
    }

    /// What to read when a pod did not come up: the pods, events, and each pod's log.
    fn describe(&self) -> String {
        let cp = &self.control_plane;
        let mut text = kubectl(cp, &["get", "pods", "-A", "-o", "wide"]);
        text += &kubectl(cp, &["get", "events", "-n", NAMESPACE]);
        text += &pod_logs(cp.dir());
        text
    }

    async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client(), NAMESPACE);
        leases
            .get_opt("workspace-gc")
            .await
            .ok()
            .flatten()
            .and_then(|lease| lease.spec?.holder_identity)
    }
}

fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c["status"] == "True")
}

fn ready_condition(pod: &Pod) -> Option<Value> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    serde_json::to_value(ready).ok()
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().expect("a pod has a name")
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|statuses| statuses.iter().map(|s| s.restart_count).sum())
        .unwrap_or_default()
}

fn container_id(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.first())
        .and_then(|s| s.container_id.clone())
        .unwrap_or_else(|| panic!("{} has no container", name(pod)))
}

/// Every container log on the node (the kubelet writes them under DIR/node/pod-logs).
fn pod_logs(dir: &Path) -> String {
    let mut text = String::new();
    let Ok(pods) = std::fs::read_dir(dir.join("node/pod-logs")) else {
        return text;
    };
    for pod in pods.flatten() {
        for container in std::fs::read_dir(pod.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for log in std::fs::read_dir(container.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let content = std::fs::read_to_string(log.path()).unwrap_or_default();
                text += &format!("--- {}\n{content}", log.path().display());
            }
        }
    }
    text
}

/// The log of `pod`'s container as the kubelet keeps it on the node.
fn pod_log(dir: &Path, pod: &str) -> String {
    let prefix = format!("{NAMESPACE}_{pod}_");
    let Ok(pods) = std::fs::read_dir(dir.join("node/pod-logs")) else {
        return String::new();
    };
    pods.flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .flat_map(|entry| {
            std::fs::read_dir(entry.path().join("workspace-gc"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|log| std::fs::read_to_string(log.path()).unwrap_or_default())
        .collect()
}

/// What the runtime enforced, seen from the host: the container's process runs as 65532 (the
/// image's USER; the Deployment pins none), on a read-only root.
fn assert_enforced(control_plane: &ControlPlane, pods: &[Pod]) {
    for pod in pods {
        let pid = container_pid(control_plane, &container_id(pod));
        let (uid, gid, _) = credentials(pid);
        assert_eq!(
            (uid.as_str(), gid.as_str()),
            (NONROOT, NONROOT),
            "{}",
            name(pod)
        );
        let root = root_mount_options(pid);
        assert!(
            root.split(',').any(|o| o == "ro"),
            "{}'s root is mounted {root}",
            name(pod)
        );
    }
}

/// `/metrics` of `pod`, read from the host as a scraper reads it; empty without an answer.
async fn pod_metrics(pod: &Pod) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(address) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
        return String::new();
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((address.as_str(), 8080))
            .await
            .ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).into_owned())
    };
    (tokio::time::timeout(secs(5), exchange).await)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The label guard came with the install (issue 55): `kubectl label` adding the build-workspace
/// label to a claim made without it is refused by the API server with the rule's message, and
/// every pod reads the guard as installed (`workspace_gc_label_guard_installed 1`).
async fn assert_label_guard_in_force(installed: &Installed, pods: &[Pod]) {
    let ns = TestNamespace::new(&installed.control_plane, "node-label").await;
    let claim = "unlabelled-build-workspace";
    ClaimBuilder::build_workspace(claim)
        .without_label(testkit::BUILD_WORKSPACE_LABEL)
        .storage_class("local")
        .create(&ns)
        .await;
    let label = format!("{}=true", testkit::BUILD_WORKSPACE_LABEL);
    let output = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(installed.control_plane.kubeconfig_path())
        .args(["label", "pvc", claim, &label, "--namespace", ns.name()])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run kubectl label");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("rule label-only-at-creation"),
        "kubectl label is refused by the label guard: {output:?}"
    );
    for pod in pods {
        assert!(
            wait_until(secs(30), || async {
                testkit::metric(
                    &pod_metrics(pod).await,
                    "workspace_gc_label_guard_installed",
                    "",
                ) == 1.0
            })
            .await,
            "{} reads the label guard as installed:\n{}",
            name(pod),
            installed.describe()
        );
    }
}

/// An orphan (the operator's claim with no owner) is deleted; a claim a running container has
/// mounted, orphaned as long, is kept until that pod is gone.
async fn assert_orphan_deleted_and_mounted_kept(installed: &Installed) {
    let ns = TestNamespace::new(&installed.control_plane, "node").await;
    let mounted = "mounted-build-workspace";
    ClaimBuilder::build_workspace(mounted)
        .storage_class("local")
        .create(&ns)
        .await;
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "mounter"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "mounter",
                "image": "localhost/busybox:workspace-gc",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo mounted > /workspace/in-use && exec sleep 3600"],
                "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
            }],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": mounted}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = wait_until(secs(60), || async {
        pods.get("mounter").await.is_ok_and(|p| is_ready(&p))
    })
    .await;
    assert!(running, "the mounting pod runs:\n{}", installed.describe());
    // The container really wrote through the mount into the local volume bound to the claim.
    let volume = (ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>())
        .get(mounted)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .expect("the claim is bound");
    let path = (Api::<PersistentVolume>::all(installed.client()))
        .get(&volume)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.local)
        .expect("a local volume")
        .path;
    assert_eq!(
        std::fs::read_to_string(Path::new(&path).join("in-use"))
            .ok()
            .as_deref(),
        Some("mounted\n")
    );

    // Created after the mounted one: by the time it is deleted, the mounted claim has been past
    // its grace for longer.
    let orphan = "orphan-build-workspace";
    ClaimBuilder::build_workspace(orphan)
        .storage_class("local")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(60), || async { !claim_exists(&ns, orphan).await }).await,
        "the orphan was not deleted:\n{}",
        installed.describe()
    );
    assert!(claim_exists(&ns, mounted).await);
    let kept = (ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>())
        .get(mounted)
        .await
        .unwrap();
    assert_eq!(
        kept.metadata.deletion_timestamp, None,
        "the mounted claim was deleted"
    );

    pods.delete("mounter", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        wait_until(secs(60), || async { !claim_exists(&ns, mounted).await }).await,
        "the claim was not deleted once its pod was gone:\n{}",
        installed.describe()
    );
    // The deletes came from the daemon's pods, through the kubelet's bound tokens.
    let requests = pod_requests(&installed.audit_log);
    for claim in [orphan, mounted] {
        assert!(
            requests.iter().any(|r| r.verb == "delete"
                && r.resource == "persistentvolumeclaims"
                && r.name == claim
                && !r.dry_run),
            "no DELETE of {claim} from a daemon pod in the audit log"
        );
    }
}

/// The leader's pod deleted: a standby holds the Lease within its duration, and the old pod
/// ends within its grace period, by itself (exit status 0), sending no DELETE after its
/// SIGTERM.
async fn assert_hand_over(installed: &Installed) {
    let leader = wait_for_holder(installed, None).await;
    let pods: Api<Pod> = Api::namespaced(installed.client(), NAMESPACE);
    // Every state the kubelet reports of the pod until it is removed: the exit is reported,
    // then the pod is gone within a second, too fast to poll for.
    let exits = tokio::spawn(container_exits(pods.clone(), leader.clone()));
    let asked = Utc::now();
    let start = Instant::now();
    pods.delete(&leader, &DeleteParams::default())
        .await
        .unwrap();
    let successor = wait_for_holder(installed, Some(&leader)).await;
    let handed_over = start.elapsed();
    assert!(
        handed_over < LEASE_DURATION,
        "the Lease went from {leader} to {successor} after {handed_over:?}"
    );
    let exits = tokio::time::timeout(GRACE + secs(10), exits)
        .await
        .unwrap_or_else(|_| panic!("{leader} still exists after {:?}", start.elapsed()))
        .unwrap();
    let ended = start.elapsed();
    assert!(ended < GRACE, "{leader} took {ended:?} to end");
    // Exit status 0: the daemon stopped by itself on SIGTERM, not killed at the grace's end.
    assert_eq!(
        exits,
        vec![(0, "Completed".to_owned())],
        "{leader}'s container exits"
    );
    let requests = pod_requests(&installed.audit_log);
    assert!(
        requests.iter().any(|r| r.pod == leader),
        "the audit log names the leader's pod"
    );
    let late: Vec<_> = (requests.iter())
        .filter(|r| r.pod == leader && r.verb == "delete" && r.resource == "persistentvolumeclaims")
        .filter(|r| r.at > asked)
        .collect();
    assert!(late.is_empty(), "DELETEs after SIGTERM: {late:?}");
    eprintln!(
        "hand-over: Lease to {successor} after {handed_over:?}; {leader} gone after {ended:?}"
    );
    // The Deployment replaces the pod, and the new one is ready too.
    installed.ready_pods(2, secs(60)).await;
}

/// The exit codes and reasons the kubelet reports for pod `name`'s container, until the pod is
/// removed.
async fn container_exits(pods: Api<Pod>, name: String) -> Vec<(i32, String)> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(pods, config));
    let mut exits = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let terminated = (pod.status.and_then(|s| s.container_statuses))
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|s| s.state?.terminated)
                    .map(|t| (t.exit_code, t.reason.unwrap_or_default()));
                for exit in terminated {
                    if !exits.contains(&exit) {
                        exits.push(exit);
                    }
                }
            }
            Ok(watcher::Event::Delete(_)) => break,
            _ => {}
        }
    }
    exits
}

/// The Lease's holder once there is one other than `not`.
async fn wait_for_holder(installed: &Installed, not: Option<&str>) -> String {
    let deadline = Instant::now() + LEASE_DURATION + secs(15);
    loop {
        let holder = installed.lease_holder().await;
        if let Some(holder) = holder.filter(|h| Some(h.as_str()) != not) {
            return holder;
        }
        assert!(
            Instant::now() < deadline,
            "no Lease holder other than {not:?}:\n{}",
            installed.describe()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn base_install_runs_as_real_pods() {
    let Some((_turn, installed)) = node_for("base_install_runs_as_real_pods").await else {
        return;
    };
    let start = Instant::now();
    installed.install_base();
    let pods = installed.ready_pods(2, secs(90)).await;
    eprintln!("manifests/base: 2 pods ready after {:?}", start.elapsed());
    assert_enforced(&installed.control_plane, &pods);
    assert_label_guard_in_force(&installed, &pods).await;
    assert_orphan_deleted_and_mounted_kept(&installed).await;
    assert_hand_over(&installed).await;

    let dir = installed.control_plane.dir().to_owned();
    drop(installed);
    assert_nothing_left(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_default_install_runs_as_real_pods() {
    let Some((_turn, installed)) = node_for("helm_default_install_runs_as_real_pods").await else {
        return;
    };
    installed.install_chart();
    let pods = installed.ready_pods(2, secs(90)).await;
    assert_enforced(&installed.control_plane, &pods);
    assert_label_guard_in_force(&installed, &pods).await;
    assert_orphan_deleted_and_mounted_kept(&installed).await;
    assert_hand_over(&installed).await;
}

/// The audit overlay as installed: the daemon's pods decide, record WouldDelete, and send each
/// delete with `dryRun: [All]`, which the API server answers through its admission (the guard
/// included) while the claim stays.
#[tokio::test(flavor = "multi_thread")]
async fn audit_overlay_dry_runs_from_its_pods() {
    let Some((_turn, installed)) = node_for("audit_overlay_dry_runs_from_its_pods").await else {
        return;
    };
    let overlay = Overlay::new(&["overlays/audit"], &[], IMAGE_OVERLAY);
    kubectl(
        &installed.control_plane,
        &[
            "apply",
            "--server-side",
            "-k",
            overlay.path().to_str().unwrap(),
        ],
    );
    installed.ready_pods(2, secs(90)).await;
    let ns = TestNamespace::new(&installed.control_plane, "audit").await;
    let claim = "due-build-workspace";
    testkit::expiring(claim, testkit::in_secs(-60))
        .storage_class("local")
        .create(&ns)
        .await;
    assert!(
        wait_until(secs(60), || async {
            !testkit::events(&ns, claim, "WouldDelete").await.is_empty()
        })
        .await,
        "no WouldDelete event:\n{}",
        installed.describe()
    );
    let leader = installed.lease_holder().await.expect("a leader");
    let event = testkit::events(&ns, claim, "WouldDelete").await.remove(0);
    assert_eq!(event.reporting_instance.as_deref(), Some(leader.as_str()));
    let deletes: Vec<_> = (pod_requests(&installed.audit_log).into_iter())
        .filter(|r| r.verb == "delete" && r.resource == "persistentvolumeclaims" && r.name == claim)
        .collect();
    assert!(!deletes.is_empty(), "no DELETE of {claim} from a pod");
    for delete in &deletes {
        assert!(delete.dry_run, "a DELETE without dryRun: {delete:?}");
        assert_eq!(delete.code, 200, "{delete:?}");
        assert_eq!(delete.pod, leader);
    }
    assert!(claim_exists(&ns, claim).await);
}

/// An API-server outage longer than both probes' failure thresholds (readiness 3 × 5 s,
/// liveness 3 × 10 s): the pods stay ready (kubert's rule: ready once started and synced) and
/// are not restarted (liveness is about the daemon, not its API server).
#[tokio::test(flavor = "multi_thread")]
async fn pods_stay_ready_and_running_through_an_api_server_outage() {
    let Some((_turn, installed)) =
        node_for("pods_stay_ready_and_running_through_an_api_server_outage").await
    else {
        return;
    };
    installed.install_base();
    let before = installed.ready_pods(2, secs(90)).await;
    let addresses: Vec<String> = (before.iter())
        .map(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .expect("a pod IP")
        })
        .collect();
    let client = installed.client();

    let counts_before = probe_counts(&installed.control_plane);
    installed
        .control_plane
        .stop_component("kube-apiserver", false)
        .await;
    let stopped = Instant::now();
    // What the kubelet's probes get, asked the same way from the host meanwhile.
    let mut answers = Vec::new();
    while stopped.elapsed() < secs(40) {
        for address in &addresses {
            answers.push((
                address.clone(),
                probe(address, "/readyz").await,
                probe(address, "/healthz").await,
            ));
        }
        tokio::time::sleep(secs(1)).await;
    }
    // The daemons did notice the outage.
    let dir = installed.control_plane.dir().to_owned();
    for pod in &before {
        let log = pod_log(&dir, &name(pod));
        assert!(
            log.contains("cannot be reached"),
            "{} saw no outage:\n{log}",
            name(pod)
        );
    }
    installed
        .control_plane
        .start_component("kube-apiserver")
        .await;
    let restarted = k8s_openapi::jiff::Timestamp::now();
    // The kubelet reports again: its node status is newer than the restart.
    let nodes: Api<Node> = Api::all(client.clone());
    let reported = wait_until(secs(60), || async {
        let Ok(node) = nodes.get("workspace-gc-node").await else {
            return false;
        };
        (node.status.and_then(|s| s.conditions))
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.type_ == "Ready"
                    && c.last_heartbeat_time
                        .as_ref()
                        .is_some_and(|t| t.0 > restarted)
            })
    })
    .await;
    assert!(reported, "the kubelet did not report after the restart");
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    for pod in &before {
        let now = pods.get(&name(pod)).await.expect("the pod is still there");
        assert_eq!(
            restarts(&now),
            0,
            "{} restarted:\n{}",
            name(pod),
            pod_log(&dir, &name(pod))
        );
        assert!(is_ready(&now), "{} is not ready", name(pod));
        assert_eq!(
            ready_condition(&now).map(|c| c["lastTransitionTime"].clone()),
            ready_condition(pod).map(|c| c["lastTransitionTime"].clone()),
            "{} went unready and back",
            name(pod)
        );
    }
    // The kubelet's own count of its probes' results over the outage: none failed, and it did
    // probe (each pod's first readiness probe, before its watches synced, failed before it).
    let after = probe_counts(&installed.control_plane);
    for probe in ["Readiness", "Liveness"] {
        let delta = |result: &str| {
            after.get(&(probe, result)).copied().unwrap_or_default()
                - counts_before
                    .get(&(probe, result))
                    .copied()
                    .unwrap_or_default()
        };
        assert!(
            delta("successful") > 0.0,
            "no {probe} probe counted: {after:?}"
        );
        assert_eq!(
            delta("failed") + delta("unknown"),
            0.0,
            "{probe} probes failed, as the kubelet counts them: {counts_before:?} then {after:?}"
        );
    }
    let failed: Vec<_> = answers
        .iter()
        .filter(|(_, r, h)| *r != 200 || *h != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "probes failed during the outage ({} of {}): {failed:?}",
        failed.len(),
        answers.len()
    );
}

/// The kubelet's count of the daemon's pods' probes (`prober_probe_total`, through the API
/// server's node proxy), by probe type and result, summed over the pods.
fn probe_counts(control_plane: &ControlPlane) -> BTreeMap<(&'static str, &'static str), f64> {
    let text = kubectl(
        control_plane,
        &[
            "get",
            "--raw",
            "/api/v1/nodes/workspace-gc-node/proxy/metrics/probes",
        ],
    );
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|line| line.starts_with("prober_probe_total{"))
    {
        if !line.contains(&format!("namespace=\"{NAMESPACE}\"")) {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or_default();
        for probe in ["Readiness", "Liveness"] {
            for result in ["successful", "failed", "unknown"] {
                if series.contains(&format!("probe_type=\"{probe}\""))
                    && series.contains(&format!("result=\"{result}\""))
                {
                    *counts.entry((probe, result)).or_default() += value;
                }
            }
        }
    }
    counts
}

/// GET http://ADDRESS:8080PATH from the host, as the kubelet probes: the status, or 0 without
/// an answer within 2 s (the probes' timeoutSeconds).
async fn probe(address: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((address, 8080)).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        String::from_utf8_lossy(&response)
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    (tokio::time::timeout(secs(2), exchange).await)
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// The Dockerfile's runtime stage, its instructions with continuation lines joined: (keyword,
/// arguments).
fn runtime_stage() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let stage = text
        .split_once("FROM scratch AS runtime\n")
        .expect("the Dockerfile has a runtime stage")
        .1;
    let joined = stage.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (keyword, args) = line.split_once(' ').unwrap_or((line, ""));
            (keyword.to_owned(), args.trim().to_owned())
        })
        .collect()
}

/// `KEY="VALUE" KEY2="VALUE 2"` as a LABEL instruction writes them.
fn labels(args: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = args.trim();
    while let Some((key, after)) = rest.split_once("=\"") {
        let (value, tail) = after.split_once('"').expect("a closing quote");
        labels.push((key.trim().to_owned(), value.to_owned()));
        rest = tail.trim();
    }
    labels
}

/// `tar -xOf ARCHIVE MEMBER`: one file of the image archive.
fn archive_member(archive: &Path, member: &str) -> Vec<u8> {
    let output = std::process::Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(member)
        .output()
        .expect("run tar");
    assert!(
        output.status.success(),
        "no {member} in {}",
        archive.display()
    );
    output.stdout
}

/// The image the node tests run is the Dockerfile's runtime stage: the same user, entrypoint,
/// command, port and labels, the CA bundle and the binary where the stage puts them, the
/// base's `nonroot` user; and the Deployment runs it as the stage means (its port, its command).
#[test]
fn the_image_tested_is_the_dockerfiles_runtime_stage() {
    if !node_lane("the_image_tested_is_the_dockerfiles_runtime_stage") {
        return;
    }
    let archive = image_archive(BINARY);
    let manifest: Value =
        serde_json::from_slice(&archive_member(archive, "manifest.json")).unwrap();
    let config: Value = serde_json::from_slice(&archive_member(
        archive,
        manifest[0]["Config"].as_str().unwrap(),
    ))
    .unwrap();
    let config = &config["config"];
    let stage = runtime_stage();
    let one = |keyword: &str| -> String {
        let found: Vec<&String> = (stage.iter())
            .filter(|(k, _)| k == keyword)
            .map(|(_, args)| args)
            .collect();
        assert_eq!(found.len(), 1, "one {keyword} in the runtime stage");
        found[0].clone()
    };
    assert_eq!(config["User"].as_str(), Some(one("USER").as_str()));
    let json = |args: String| serde_json::from_str::<Value>(&args).unwrap();
    assert_eq!(config["Entrypoint"], json(one("ENTRYPOINT")));
    assert_eq!(config["Cmd"], json(one("CMD")));
    let port = one("EXPOSE");
    let ports: Vec<&String> = config["ExposedPorts"].as_object().unwrap().keys().collect();
    assert_eq!(ports, vec![&format!("{port}/tcp")]);
    let expected = labels(&one("LABEL"));
    assert_eq!(expected.len(), 3, "{expected:?}");
    for (key, value) in &expected {
        assert_eq!(
            config["Labels"][key].as_str(),
            Some(value.as_str()),
            "label {key}"
        );
    }

    // Where the stage's COPYs put the CA bundle and the binary.
    let mut files = Vec::new();
    for layer in manifest[0]["Layers"].as_array().unwrap() {
        let layer = archive_member(archive, layer.as_str().unwrap());
        let mut list = std::process::Command::new("tar")
            .arg("-t")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        list.stdin.take().unwrap().write_all(&layer).unwrap();
        let listed = list.wait_with_output().unwrap();
        files.extend(
            String::from_utf8_lossy(&listed.stdout)
                .lines()
                .map(|l| l.trim_start_matches("./").to_owned()),
        );
    }
    let entrypoint = json(one("ENTRYPOINT"))[0].as_str().unwrap().to_owned();
    for file in [
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        &entrypoint[1..],
    ] {
        assert!(files.iter().any(|f| f == file), "no {file} in the image");
    }
    let rootfs = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(Path::new(ROOT).join("hack/image/rootfs"))
        .arg(rootfs.path())
        .status()
        .unwrap();
    assert!(status.success());
    let passwd = std::fs::read_to_string(rootfs.path().join("etc/passwd")).unwrap();
    let user = one("USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with(&format!("nonroot:x:{uid}:"))),
        "{passwd}"
    );

    // The Deployment's port and command are the image's.
    let rendered = testkit::Rendered::of(&testkit::manifests("base"));
    let container = rendered.container();
    assert_eq!(
        container["ports"][0]["containerPort"]
            .as_u64()
            .map(|p| p.to_string()),
        Some(port)
    );
    assert_eq!(container["args"][0], config["Cmd"][0]);
}

/// The kubelet and kube-scheduler (hack/kubelet) are the release the plane runs (the newest in
/// hack/k8s), so the node's version skew is none.
#[test]
fn the_node_runs_the_planes_release() {
    let version = |go_mod: &str| {
        let text = std::fs::read_to_string(Path::new(ROOT).join(go_mod)).unwrap();
        text.lines()
            .map(str::split_whitespace)
            .find_map(|mut fields| {
                let first = fields.next()?;
                let module = if first == "require" {
                    fields.next()?
                } else {
                    first
                };
                (module == "k8s.io/kubernetes").then(|| fields.next().map(str::to_owned))?
            })
            .unwrap_or_else(|| panic!("no k8s.io/kubernetes in {go_mod}"))
    };
    let newest = std::fs::read_dir(Path::new(ROOT).join("hack/k8s"))
        .unwrap()
        .flatten()
        .filter(|d| d.path().join("go.mod").exists())
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .max_by_key(|minor| {
            let (major, minor) = minor.split_once('.').unwrap();
            (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap())
        })
        .unwrap();
    assert_eq!(
        version("hack/kubelet/go.mod"),
        version(&format!("hack/k8s/{newest}/go.mod"))
    );
}
