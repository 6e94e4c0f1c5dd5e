//! The shipped manifests as tests read them: objects rendered by kustomize (or Helm), a
//! throw-away overlay, OpenShift's restricted-v2 check, and the daemon run as the rendered
//! Deployment runs it. Shared by tests/deploy/ and tests/cluster/helm.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::scrape::{free_port, http_get};

use super::paths::{REPOSITORY as ROOT, daemon_binary, scratch_dir};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A path under `manifests/`.
pub fn manifests(path: &str) -> PathBuf {
    Path::new(ROOT).join("manifests").join(path)
}

// --- rendering --------------------------------------------------------------------------------

/// The objects a kustomization renders to, in kustomize's order.
#[derive(Debug, Clone)]
pub struct Rendered(pub Vec<Value>);

pub type Key = (String, String, String);

pub fn key_of(object: &Value) -> Key {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    (
        text("/kind").to_owned(),
        text("/metadata/namespace").to_owned(),
        text("/metadata/name").to_owned(),
    )
}

impl Rendered {
    pub fn of(dir: &Path) -> Rendered {
        let output = Command::new("kubectl")
            .arg("kustomize")
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .expect("run kubectl (v1.32+ with kustomize v5 is expected on PATH)");
        assert!(
            output.status.success(),
            "kubectl kustomize {} failed:\n{}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        Rendered::parse(&String::from_utf8(output.stdout).expect("kustomize prints UTF-8"))
    }

    /// The objects of a multi-document YAML stream (kustomize's or Helm's output).
    pub fn parse(text: &str) -> Rendered {
        let objects = serde_saphyr::from_multiple::<Value>(text)
            .unwrap_or_else(|e| panic!("invalid YAML ({e}):\n{text}"))
            .into_iter()
            .filter(|object| !object.is_null())
            .collect();
        Rendered(objects)
    }

    pub fn by_key(&self) -> BTreeMap<Key, Value> {
        self.0.iter().map(|o| (key_of(o), o.clone())).collect()
    }

    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind` named `name`, in whatever namespace.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<_> = self
            .of_kind(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"] == name)
            .collect();
        assert_eq!(found.len(), 1, "exactly one {kind} {name} in {self:#?}");
        found[0]
    }

    pub fn only(&self, kind: &str) -> &Value {
        let found = self.of_kind(kind);
        assert_eq!(found.len(), 1, "exactly one {kind}");
        found[0]
    }

    pub fn deployment(&self) -> &Value {
        self.only("Deployment")
    }

    pub fn container(&self) -> &Value {
        let containers = self.deployment()["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("containers");
        assert_eq!(containers.len(), 1, "one container");
        &containers[0]
    }

    pub fn args(&self) -> Vec<String> {
        strings(&self.container()["args"])
    }

    /// The ConfigMap the Deployment mounts (its name carries kustomize's content hash).
    pub fn mounted_config_map(&self) -> &Value {
        let volumes = &self.deployment()["spec"]["template"]["spec"]["volumes"];
        let name = (volumes.as_array().into_iter().flatten())
            .find_map(|volume| volume["configMap"]["name"].as_str())
            .expect("a ConfigMap volume");
        self.get("ConfigMap", name)
    }

    /// The configuration the daemon runs with, as `workspace-gc check-config` prints it: the
    /// mounted file and the Deployment's environment, through the binary's own loader.
    pub fn effective_config(&self, dir: &Path) -> toml::Table {
        let launch = Launch::from(self, "check", dir);
        let output = Command::new(daemon_binary())
            .arg("check-config")
            .arg(&launch.config)
            .env_clear()
            .envs(launch.env)
            .output()
            .expect("run workspace-gc check-config");
        assert!(
            output.status.success(),
            "the deployed configuration is invalid:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        toml::from_str(&String::from_utf8_lossy(&output.stdout)).expect("check-config prints TOML")
    }
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A throw-away kustomization (in the target folder's scratch space) over shipped ones, plus `extra` lines.
pub struct Overlay {
    dir: tempfile::TempDir,
}

impl Overlay {
    pub fn new(resources: &[&str], components: &[&str], extra: &str) -> Overlay {
        let dir = tempfile::Builder::new()
            .prefix("deploy-")
            .tempdir_in(scratch_dir())
            .expect("create an overlay directory");
        // kustomize takes other kustomizations only by relative path (any number of `../`).
        let here = dir.path().canonicalize().expect("canonical overlay path");
        let up = "../".repeat(here.components().count() - 1);
        let relative = |path: &str| {
            let target = manifests(path)
                .canonicalize()
                .expect("a shipped kustomization");
            let target = target.strip_prefix("/").expect("an absolute path");
            format!("  - {up}{}\n", target.display())
        };
        let mut text = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
        );
        text.extend(resources.iter().map(|r| relative(r)));
        if !components.is_empty() {
            text.push_str("components:\n");
            text.extend(components.iter().map(|c| relative(c)));
        }
        text.push_str(extra);
        std::fs::write(dir.path().join("kustomization.yaml"), text).expect("write overlay");
        Overlay { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn render(&self) -> Rendered {
        Rendered::of(self.path())
    }
}

// --- OpenShift's restricted-v2 ------------------------------------------------------------------

/// The volume types OpenShift's `restricted-v2` SCC allows.
pub const RESTRICTED_V2_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// What OpenShift's default `restricted-v2` SecurityContextConstraints refuse in a pod spec, as
/// its documentation ("Managing security context constraints") defines the SCC:
/// `runAsUser: MustRunAsRange` and `fsGroup: MustRunAs` take the IDs from the namespace's range
/// (`openshift.io/sa.scc.uid-range`), so a pod may pin none (the range differs per namespace;
/// nor a GID, meaningless under an arbitrary UID); `seLinuxContext: MustRunAs` assigns the
/// namespace's labels; `requiredDropCapabilities: [ALL]` with only `NET_BIND_SERVICE` allowed
/// back; `allowPrivilegeEscalation: false`; no privileged container; `seccompProfiles:
/// [runtime/default]`; no host network, PID or IPC namespace, no host port; volumes of the
/// listed types only. Every violation, described; empty when admitted.
pub fn restricted_v2_violations(pod: &Value) -> Vec<String> {
    let mut violations = Vec::new();
    let mut forbid = |present: bool, what: String| {
        if present {
            violations.push(what);
        }
    };
    let pod_security = &pod["securityContext"];
    for field in ["runAsUser", "runAsGroup", "fsGroup", "seLinuxOptions"] {
        forbid(
            !pod_security[field].is_null(),
            format!("pod securityContext.{field} is set"),
        );
    }
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        forbid(pod[field] == true, format!("pod {field}"));
    }
    let pod_seccomp = pod_security["seccompProfile"]["type"].as_str();
    forbid(
        pod_seccomp.is_some_and(|t| t != "RuntimeDefault"),
        format!("pod seccomp profile {pod_seccomp:?}"),
    );
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default();
        for kind in volume.as_object().unwrap().keys().filter(|k| *k != "name") {
            forbid(
                !RESTRICTED_V2_VOLUMES.contains(&kind.as_str()),
                format!("volume {name} of type {kind}"),
            );
        }
    }
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| pod[*list].as_array().into_iter().flatten());
    for container in containers {
        let name = container["name"].as_str().unwrap_or_default();
        let security = &container["securityContext"];
        for field in ["runAsUser", "runAsGroup", "seLinuxOptions"] {
            forbid(
                !security[field].is_null(),
                format!("{name}: securityContext.{field} is set"),
            );
        }
        forbid(
            security["privileged"] == true,
            format!("{name}: privileged"),
        );
        forbid(
            security["allowPrivilegeEscalation"] != false,
            format!("{name}: allowPrivilegeEscalation is not false"),
        );
        let dropped = strings(&security["capabilities"]["drop"]);
        forbid(
            !dropped.iter().any(|c| c == "ALL"),
            format!("{name}: capabilities not all dropped ({dropped:?})"),
        );
        for added in strings(&security["capabilities"]["add"]) {
            forbid(
                added != "NET_BIND_SERVICE",
                format!("{name}: capability {added} added"),
            );
        }
        let seccomp = security["seccompProfile"]["type"].as_str().or(pod_seccomp);
        forbid(
            seccomp != Some("RuntimeDefault"),
            format!("{name}: seccomp profile {seccomp:?}, not RuntimeDefault"),
        );
        for port in container["ports"].as_array().into_iter().flatten() {
            forbid(
                !port["hostPort"].is_null(),
                format!("{name}: hostPort {}", port["hostPort"]),
            );
        }
    }
    violations
}

// --- running the binary as the Deployment does -------------------------------------------------

/// The command line and environment of the Deployment's container, made runnable here: the
/// mounted ConfigMap written to a directory (and the paths into its mount rewritten to it), and
/// the downward-API variables filled in as the kubelet would.
pub struct Launch {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The configuration file, here.
    pub config: PathBuf,
    /// The UID and GID to run as, confined ([`confined`]); `None`: as the test runs.
    pub run_as: Option<u32>,
}

impl Launch {
    pub fn from(rendered: &Rendered, pod_name: &str, dir: &Path) -> Launch {
        let deployment = rendered.deployment();
        let container = rendered.container();
        // The configuration's mount (components may add others, e.g. the TLS Secret).
        let mount = (container["volumeMounts"].as_array().into_iter().flatten())
            .find(|mount| mount["name"] == "config")
            .expect("the config volume is mounted");
        let mount_path = mount["mountPath"].as_str().expect("a mounted volume");
        let config_map = rendered.mounted_config_map();
        for (file, content) in config_map["data"].as_object().unwrap() {
            std::fs::write(dir.join(file), content.as_str().unwrap()).expect("write config");
        }
        let here = dir.to_str().expect("a UTF-8 path");
        let args: Vec<String> = rendered
            .args()
            .iter()
            .map(|arg| arg.replace(mount_path, here))
            .collect();
        let config = args
            .iter()
            .find_map(|a| a.strip_prefix("--config="))
            .map(PathBuf::from)
            .expect("the Deployment passes --config");
        let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
        let env = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|variable| {
                let name = variable["name"].as_str().unwrap().to_owned();
                let value = match (
                    variable["value"].as_str(),
                    variable["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
                ) {
                    (Some(value), _) => value.to_owned(),
                    (None, Some("metadata.name")) => pod_name.to_owned(),
                    (None, Some("metadata.namespace")) => namespace.to_owned(),
                    _ => panic!("an environment variable this test cannot provide: {variable}"),
                };
                (name, value)
            })
            .collect();
        Launch {
            args,
            env,
            config,
            run_as: None,
        }
    }

    /// Runs the binary as OpenShift's restricted-v2 would: as `uid` and GID `uid`, which exist
    /// nowhere, with nothing writable.
    pub fn confined_as(self, uid: u32) -> Launch {
        Launch {
            run_as: Some(uid),
            ..self
        }
    }

    pub fn command(&self, kubeconfig: &Path) -> tokio::process::Command {
        let mut command = match self.run_as {
            Some(uid) => confined(uid, daemon_binary()),
            None => tokio::process::Command::new(daemon_binary()),
        };
        // Only what the pod would have: no proxy, no stray WORKSPACE_GC_ variable.
        command
            .env_clear()
            .envs(self.env.iter().cloned())
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null());
        command
    }
}

/// An arbitrary UID, as OpenShift assigns from a namespace's range (1000680000/10000, say).
pub const ARBITRARY_UID: u32 = 1_000_680_000;

/// `program` (its arguments appended by the caller) as UID and GID `uid` with no supplementary
/// groups, in a mount namespace of its own where every mount is remounted read-only: a
/// container with `readOnlyRootFilesystem` and only read-only mounts, as the Deployment has.
/// Needs root, as the test runs (`unshare`, `mount` and `setpriv` come with util-linux).
pub fn confined(uid: u32, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    const SCRIPT: &str = r#"uid=$1; shift
awk '{ print $2 }' /proc/self/mounts | while read -r mount; do
    mount -o remount,bind,ro "$mount" 2>/dev/null || true
done
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@""#;
    let mut command = tokio::process::Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            SCRIPT,
        ])
        .args(["sh", &uid.to_string()])
        .arg(program);
    command
}

/// A copy of `file` in `dir` that any UID can read, as the kubelet mounts the token and the
/// ConfigMap; `dir` becomes readable too.
pub fn readable_copy(file: &Path, dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let copy = dir.join(file.file_name().expect("a file name"));
    std::fs::copy(file, &copy).expect("copy the file");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// The daemon binary, running.
pub struct DeployedDaemon {
    pub child: tokio::process::Child,
    pub port: u16,
    pub log: PathBuf,
}

impl DeployedDaemon {
    /// Starts `workspace-gc` with the Deployment's arguments and environment plus `extra_args`
    /// and `extra_env`, listening on a free loopback port, and waits until it is ready.
    pub async fn start(
        launch: &Launch,
        kubeconfig: &Path,
        dir: &Path,
        extra_args: &[String],
        extra_env: &[(&str, &str)],
    ) -> DeployedDaemon {
        let port = free_port();
        let log = dir.join("daemon.log");
        let file = std::fs::File::create(&log).expect("create the daemon log");
        let child = launch
            .command(kubeconfig)
            .args(&launch.args)
            .arg(format!("--listen=127.0.0.1:{port}"))
            .args(extra_args)
            .envs(extra_env.iter().copied())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            // A failed assertion must not leave it running.
            .kill_on_drop(true)
            .spawn()
            .expect("start workspace-gc");
        let mut daemon = DeployedDaemon { child, port, log };
        let deadline = tokio::time::Instant::now() + secs(60);
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("the daemon exited early ({status}):\n{}", daemon.log());
            }
            if daemon.get("/readyz").await.0 == 200 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the daemon did not become ready:\n{}",
                daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        daemon
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port, path).await
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.1
    }

    /// Waits until `/metrics` shows `series` at `value`: a counter is bumped after the write it
    /// counts, so it may lag what the API server already shows. Returns the last scrape.
    pub async fn metrics_when(&self, series: &str, value: f64) -> String {
        let reached = super::wait_until(Duration::from_secs(10), || async {
            sample(&self.metrics().await, series) == Some(value)
        })
        .await;
        let metrics = self.metrics().await;
        assert!(reached, "{series} reaches {value}:\n{metrics}");
        metrics
    }

    /// SIGTERM, as the kubelet sends, and the exit status.
    pub async fn stop(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().expect("the daemon is running");
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIGTERM sent");
        let status = tokio::time::timeout(secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the daemon did not stop on SIGTERM:\n{}", self.log()))
            .expect("wait for the daemon");
        (status, self.log())
    }
}

/// The value of one sample line, e.g. `workspace_gc_leader`, or with its labels.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
    })
}
