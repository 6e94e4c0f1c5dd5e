//! The node lane (tests/node/installed.rs): the image built by scripts/image and loaded into the node's
//! containerd, kubectl on a control plane with a node, and what the host sees of a container
//! (its processes' credentials and mounts) to check what the runtime really enforced.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::ControlPlane;
use super::script::SCRIPT;

use super::paths::{REPOSITORY as ROOT, scratch_dir};
/// The name the test image gets in containerd; the manifests' `workspace-gc` is set to it.
pub const IMAGE_REPOSITORY: &str = "localhost/workspace-gc";
pub const IMAGE_TAG: &str = "node-test";

/// Whether the node lane was asked for: it needs root, containerd and minutes, so scripts/test
/// asks for it (`CONTROL_PLANE_NODE=1`) and a plain `cargo test` leaves it out, saying so.
pub fn node_lane(test: &str) -> bool {
    let requested = node_requested();
    if !requested {
        eprintln!(
            "SKIPPED {test}: the node lane runs real pods (root, containerd, a kubelet); \
             run it with CONTROL_PLANE_NODE=1 (scripts/test sets it)"
        );
    }
    requested
}

/// Whether the node lane was asked for (`CONTROL_PLANE_NODE=1`), without a word: for tests that
/// run either way, on the node where there is one (tests/tekton.rs).
pub fn node_requested() -> bool {
    std::env::var("CONTROL_PLANE_NODE").is_ok_and(|v| v == "1")
}

/// One node per host: two kubelets would share the kubepods cgroups and the bridge.
static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// When the lane runs ([`node_lane`]), the test's turn on the host: hold it while its node
/// runs (declared before the control plane, so the node goes first when both are dropped).
pub async fn node_turn(test: &str) -> Option<tokio::sync::MutexGuard<'static, ()>> {
    if !node_lane(test) {
        return None;
    }
    Some(NODE.lock().await)
}

/// The image of the Dockerfile's runtime stage around `binary`, built once per test binary by
/// scripts/image, as a docker-archive containerd imports.
pub fn image_archive(binary: &str) -> &'static Path {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE.get_or_init(|| {
        let archive = scratch_dir().join("workspace-gc-image.tar");
        let status = Command::new(Path::new(ROOT).join("scripts/image"))
            .args(["--binary", binary, "--archive"])
            .arg(&archive)
            .args(["--tag", &format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("run scripts/image");
        assert!(status.success(), "scripts/image failed ({status})");
        archive
    })
}

/// Imports the image into the node's containerd (`scripts/control-plane load-image`).
pub fn load_image(control_plane: &ControlPlane, archive: &Path) {
    let output = Command::new(SCRIPT)
        .arg("load-image")
        .arg(archive)
        .arg("--dir")
        .arg(control_plane.dir())
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/control-plane load-image");
    assert!(
        output.status.success(),
        "load-image failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `kubectl ARGS` as admin; its stdout, or a panic with its stderr.
pub fn kubectl(control_plane: &ControlPlane, args: &[&str]) -> String {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig_path())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The host pid of the container `container_id` (a pod status's `containerd://ID`), from the
/// node's containerd.
pub fn container_pid(control_plane: &ControlPlane, container_id: &str) -> u32 {
    let id = container_id.trim_start_matches("containerd://");
    let socket = control_plane.dir().join("node/containerd/containerd.sock");
    let output = Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["--namespace", "k8s.io", "tasks", "ls"])
        .output()
        .expect("run ctr");
    let tasks = String::from_utf8_lossy(&output.stdout);
    tasks
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(id)).then(|| fields.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no task {id} in containerd:\n{tasks}"))
}

/// The `Uid:`, `Gid:` and `Groups:` lines of /proc/PID/status: the real, effective, saved and
/// filesystem IDs, and the supplementary groups.
pub fn credentials(pid: u32) -> (String, String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|ids| ids.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    (field("Uid:"), field("Gid:"), field("Groups:"))
}

/// The mount options of the process's root, as its own mount namespace has it.
pub fn root_mount_options(pid: u32) -> String {
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    // Fields: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...; the last mount on / is the root.
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(4) == Some(&"/")).then(|| fields.get(5).map(|o| (*o).to_owned()))?
        })
        .next_back()
        .unwrap_or_else(|| panic!("no root mount for pid {pid}:\n{mounts}"))
}

/// A request in the audit log, with the pod whose bound token sent it.
#[derive(Debug, Clone)]
pub struct PodRequest {
    pub pod: String,
    pub verb: String,
    pub resource: String,
    pub name: String,
    /// Sent with `dryRun: [All]` (kube sends it in the DeleteOptions body, which the audit
    /// policy logs for claim deletes).
    pub dry_run: bool,
    pub code: i64,
    pub at: DateTime<Utc>,
}

/// Every completed request sent with a pod-bound ServiceAccount token (the kubelet mounts
/// those): the API server logs the pod's name in the user's extra fields.
pub fn pod_requests(audit_log: &Path) -> Vec<PodRequest> {
    let text = std::fs::read_to_string(audit_log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter_map(|e| {
            let pod = e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0].as_str()?;
            let at = DateTime::parse_from_rfc3339(e["requestReceivedTimestamp"].as_str()?).ok()?;
            Some(PodRequest {
                pod: pod.to_owned(),
                verb: e["verb"].as_str().unwrap_or_default().to_owned(),
                resource: e["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: e["objectRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                dry_run: e["requestObject"]["dryRun"]
                    .as_array()
                    .is_some_and(|modes| modes.iter().any(|m| m == "All"))
                    || e["requestURI"]
                        .as_str()
                        .is_some_and(|uri| uri.contains("dryRun=All")),
                code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
                at: at.with_timezone(&Utc),
            })
        })
        .collect()
}

/// An audit policy that logs every request's metadata (who, what, when), and a claim delete's
/// body too (its dry-run), for `--audit-policy-file`.
pub const METADATA_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [delete]
    resources: [{group: \"\", resources: [persistentvolumeclaims]}]
  - level: Metadata
";

/// Nothing of the node is left once its control plane in `dir` is down: no mount, bridge,
/// iptables rule or process, nor the directory.
pub fn assert_nothing_left(dir: &Path) {
    let dir = dir.to_str().unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(dir)).collect();
    assert!(left.is_empty(), "mounts left: {left:#?}");
    assert!(
        !Path::new("/sys/class/net/wgc0").exists(),
        "the bridge is left"
    );
    for table in ["nat", "filter", "mangle"] {
        let rules = std::process::Command::new("iptables")
            .args(["-w", "-t", table, "-S"])
            .output()
            .unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert!(
            !rules.contains(dir) && !rules.contains("KUBE-"),
            "iptables {table}:\n{rules}"
        );
    }
    for proc in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(proc.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(dir), "a process is left: {cmdline}");
    }
    assert!(!Path::new(dir).exists(), "{dir} is left");
}
