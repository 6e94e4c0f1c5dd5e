//! Starting and reaching the control plane, and per-test namespaces.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, Config};
use serde::de::DeserializeOwned;
use workspace_gc::config::Config as DaemonConfig;

use super::script::{self, SCRIPT};

/// What a dedicated control plane runs besides etcd and kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Run kube-controller-manager (garbage collector, PVC protection, namespace deletion,
    /// service accounts, resource quotas).
    pub controller_manager: bool,
    /// Extra kube-apiserver flags, e.g. `--etcd-compaction-interval=1s`.
    pub apiserver_args: Vec<String>,
}

/// An HA control plane (`scripts/control-plane up --apiservers N`): `servers` kube-apiservers
/// over one etcd behind HAProxy, named `kube-apiserver-1` .. `kube-apiserver-N` for
/// [`ControlPlane::stop_component`] and [`ControlPlane::start_component`]. `offsets[i]` (a Go
/// duration: "5ms", "-5s"; empty for none) runs server `i + 1` with its wall clock that far
/// off.
#[derive(Debug, Clone, Default)]
pub struct HaPlane {
    pub servers: usize,
    pub offsets: Vec<String>,
}

impl HaPlane {
    /// `servers` servers, clocks true.
    pub fn servers(servers: usize) -> HaPlane {
        HaPlane {
            servers,
            offsets: Vec::new(),
        }
    }

    /// The script's flags for this plane; with offsets, builds the kube-apiserver that runs
    /// them first (`build-clock-offset`, cached after the first build).
    fn flags(&self) -> Vec<String> {
        let mut flags = vec!["--apiservers".to_owned(), self.servers.to_string()];
        for (i, offset) in self.offsets.iter().enumerate() {
            if !offset.is_empty() {
                flags.push("--apiserver-offset".to_owned());
                flags.push(format!("{}={offset}", i + 1));
            }
        }
        if flags.len() > 2 {
            ensure_binaries("build-clock-offset");
        }
        flags
    }

    /// The server names, `kube-apiserver-1` first.
    pub fn names(&self) -> Vec<String> {
        (1..=self.servers)
            .map(|i| format!("kube-apiserver-{i}"))
            .collect()
    }
}

/// A local etcd + kube-apiserver (+ optionally kube-controller-manager) started by
/// `scripts/control-plane up`. Its processes are stopped by a watchdog when the test process
/// exits, however it exits; a dedicated one is also stopped when dropped.
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    config: Config,
    dedicated: bool,
}

impl ControlPlane {
    /// The control plane shared by all tests of this test binary, started on first use. It runs
    /// kube-controller-manager, as every real cluster does: without its PVC-protection
    /// controller a deleted claim would stay Terminating forever (the admission plugin adds
    /// the `kubernetes.io/pvc-protection` finalizer).
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        Self::shared_in(&SHARED, || {
            Self::launch(&Self::with_controller_manager(), false)
        })
    }

    /// Like [`Self::shared`], with the real Tekton Pipelines controller too (`up --tekton`,
    /// tests/tekton.rs): the release's CRDs replace the stand-ins of tests/crds, and pods move
    /// only when a test plays the kubelet ([`super::kubelet`]).
    pub fn shared_tekton() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        Self::shared_in(&SHARED, || {
            Self::launch(&Self::with_controller_manager(), true)
        })
    }

    /// Like [`Self::shared_tekton`], with a node ([`Self::start_with_node_and_tekton`]): Tekton's
    /// pods really run. One node per host: only one test binary may use it at a time (the node
    /// lane's binaries run one after another, and `up --node` waits for the last one's `down`).
    pub fn shared_node_tekton() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        Self::shared_in(&SHARED, Self::start_with_node_and_tekton)
    }

    fn with_controller_manager() -> ControlPlaneOptions {
        ControlPlaneOptions {
            controller_manager: true,
            ..ControlPlaneOptions::default()
        }
    }

    fn shared_in(
        cell: &'static OnceLock<Result<ControlPlane, String>>,
        start: impl FnOnce() -> ControlPlane + std::panic::UnwindSafe,
    ) -> &'static ControlPlane {
        // A failed start is remembered, so the other tests fail at once with its message
        // instead of each retrying a slow start.
        let shared = cell.get_or_init(|| {
            std::panic::catch_unwind(start)
                .map(|mut control_plane| {
                    control_plane.dedicated = false;
                    control_plane
                })
                .map_err(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default()
                })
        });
        match shared {
            Ok(control_plane) => control_plane,
            Err(message) => panic!("the shared control plane failed to start: {message}"),
        }
    }

    /// A control plane for one test alone, stopped on drop. Use it when a test needs
    /// kube-controller-manager or changes cluster-wide state.
    pub fn start(with_controller_manager: bool) -> ControlPlane {
        Self::start_with(&ControlPlaneOptions {
            controller_manager: with_controller_manager,
            ..ControlPlaneOptions::default()
        })
    }

    /// A dedicated control plane with kube-controller-manager and the real Tekton controller
    /// (see [`Self::shared_tekton`]), stopped on drop. Each of `features` (`KEY=VALUE`) is set in
    /// Tekton's `feature-flags` ConfigMap before its controller starts, as OpenShift Pipelines'
    /// TektonConfig sets them.
    pub fn start_tekton(features: &[&str]) -> ControlPlane {
        let flags: Vec<&str> = (features.iter())
            .flat_map(|feature| ["--tekton-feature", feature])
            .collect();
        Self::launch_with(&Self::with_controller_manager(), true, &flags)
    }

    /// A dedicated control plane with the given options, stopped on drop.
    pub fn start_with(options: &ControlPlaneOptions) -> ControlPlane {
        Self::launch(options, false)
    }

    /// A dedicated control plane whose kube-controller-manager also runs the PersistentVolume
    /// controller: volumes bind, and go `Released` when their claim is deleted. Stopped on drop.
    pub fn start_with_volume_controller() -> ControlPlane {
        Self::launch_with(
            &Self::with_controller_manager(),
            false,
            &["--volume-controller"],
        )
    }

    /// A dedicated control plane with a node (`up --node`): containerd, a kubelet and
    /// kube-scheduler, so pods really run; `apiserver_args` go to kube-apiserver (an audit log).
    /// Stopped on drop, which also removes the node's mounts, network and processes.
    pub fn start_with_node(apiserver_args: &[String]) -> ControlPlane {
        ensure_binaries("build-node");
        Self::launch_with(
            &ControlPlaneOptions {
                controller_manager: true,
                apiserver_args: apiserver_args.to_vec(),
            },
            false,
            &["--node"],
        )
    }

    /// A dedicated control plane with a node and the real Tekton controller (`up --node
    /// --tekton`, Tekton's default feature flags): Tekton's pods really run on the node, from
    /// its own entrypoint and nop images. Stopped on drop, as [`Self::start_with_node`].
    pub fn start_with_node_and_tekton() -> ControlPlane {
        ensure_binaries("build-node");
        ensure_binaries("build-tekton-images");
        Self::launch_with(&Self::with_controller_manager(), true, &["--node"])
    }

    fn launch(options: &ControlPlaneOptions, tekton: bool) -> ControlPlane {
        Self::launch_with(options, tekton, &[])
    }

    fn launch_with(options: &ControlPlaneOptions, tekton: bool, extra: &[&str]) -> ControlPlane {
        ensure_binaries("build");
        if tekton {
            ensure_binaries("build-tekton");
        }
        let dir = tempfile::Builder::new()
            .prefix("workspace-gc-control-plane-")
            .tempdir()
            .expect("create a directory for the control plane")
            // The script's `down` (or its watchdog) removes it.
            .keep();
        let mut flags = Vec::new();
        if tekton {
            flags.push("--tekton");
        }
        flags.extend_from_slice(extra);
        Self::up_in(&dir, options, &flags).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A dedicated control plane in `dir` (the benchmark's is on a tmpfs), stopped on drop; what
    /// failed, with the script's output, if it did not start. Its binaries must be built.
    pub fn start_in(dir: &Path, options: &ControlPlaneOptions) -> Result<ControlPlane, String> {
        Self::up_in(dir, options, &[])
    }

    /// A dedicated HA control plane ([`HaPlane`]), stopped on drop. Its clients and the
    /// daemon reach the servers through the balancer.
    pub fn start_ha(options: &ControlPlaneOptions, ha: &HaPlane) -> ControlPlane {
        let flags = ha.flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Self::launch_with(options, false, &flags)
    }

    /// As [`Self::start_ha`], in `dir` (the benchmark's tmpfs); what failed, if it did not
    /// start. Its binaries must be built (with offsets, `build-clock-offset`'s are built here).
    pub fn start_ha_in(
        dir: &Path,
        options: &ControlPlaneOptions,
        ha: &HaPlane,
    ) -> Result<ControlPlane, String> {
        let flags = ha.flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Self::up_in(dir, options, &flags)
    }

    /// The URL of one server of an HA plane (`kube-apiserver-2`), not through the balancer,
    /// as `up` recorded it.
    pub fn server_url(&self, name: &str) -> String {
        let file = self.dir.join("endpoints");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let key = format!("API_URL_{}=", name.trim_start_matches("kube-apiserver-"));
        text.lines()
            .find_map(|line| line.strip_prefix(&key))
            .unwrap_or_else(|| {
                panic!(
                    "{name} is not a server of the HA plane in {}",
                    self.dir.display()
                )
            })
            .to_owned()
    }

    fn up_in(
        dir: &Path,
        options: &ControlPlaneOptions,
        flags: &[&str],
    ) -> Result<ControlPlane, String> {
        let mut flags = flags.to_vec();
        if options.controller_manager {
            flags.push("--controller-manager");
        }
        let kubeconfig = script::up(dir, &flags, &options.apiserver_args)?;
        let config = futures::executor::block_on(script::load_config(&kubeconfig))?;
        Ok(ControlPlane {
            dir: dir.to_owned(),
            kubeconfig,
            config,
            dedicated: true,
        })
    }

    /// A client with cluster-admin rights (system:masters).
    ///
    /// A new client per call: a kube client belongs to the Tokio runtime it was created on, and
    /// every `#[tokio::test]` has its own runtime. Must be called inside a Tokio runtime.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("build a client for the control plane")
    }

    /// The admin kubeconfig, for processes such as the daemon's binary or kubectl.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding the control plane's certificates, logs and data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin client configuration, e.g. to point a client at a [`super::Proxy`] instead.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// An admin client that reaches the API server at `url` (a [`super::Proxy`]).
    pub fn client_via(&self, url: &str) -> Client {
        let mut config = self.config.clone();
        config.cluster_url = url.parse().expect("a valid proxy URL");
        Client::try_from(config).expect("build a client through the proxy")
    }

    /// A copy of the admin kubeconfig that reaches the API server at `url` (a
    /// [`super::Proxy`]), for the daemon's binary.
    pub fn kubeconfig_via(&self, url: &str) -> PathBuf {
        let server = self.config.cluster_url.to_string();
        let server = server.trim_end_matches('/');
        let text = std::fs::read_to_string(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("read {}: {e}", self.kubeconfig.display()));
        assert!(text.contains(server), "the kubeconfig names {server}");
        let port = url.rsplit(':').next().unwrap_or("proxy");
        let path = self.dir.join(format!("via-{port}.kubeconfig"));
        std::fs::write(&path, text.replace(server, url))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// The API server's `host:port`, for a [`super::Proxy`] to forward to.
    pub fn api_address(&self) -> String {
        let url = &self.config.cluster_url;
        format!(
            "{}:{}",
            url.host().expect("the API server URL has a host"),
            url.port_u16().unwrap_or(443)
        )
    }

    /// Stops one component (`etcd`, `kube-apiserver`, `kube-controller-manager`) of this
    /// dedicated control plane: SIGTERM, or SIGKILL with `kill`, as a crash.
    pub async fn stop_component(&self, component: &str, kill: bool) {
        assert!(
            self.dedicated,
            "faults are only for a dedicated control plane"
        );
        let mut args = vec!["stop", component];
        if kill {
            args.push("--kill");
        }
        self.script(&args).await;
    }

    /// Pauses (SIGSTOP) or, with `paused` false, resumes (SIGCONT) one component of this
    /// dedicated control plane, as a loaded machine stalls a process: what its watches deliver
    /// meanwhile waits in their streams.
    pub fn pause_component(&self, component: &str, paused: bool) {
        assert!(
            self.dedicated,
            "faults are only for a dedicated control plane"
        );
        let file = self.dir.join(format!("{component}.pid"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let pid = text.split_whitespace().next().expect("a pid");
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} ({component})");
    }

    /// Starts a stopped component again, with its original flags, and waits until it is healthy.
    pub async fn start_component(&self, component: &str) {
        assert!(
            self.dedicated,
            "faults are only for a dedicated control plane"
        );
        self.script(&["start", component]).await;
    }

    /// Compacts etcd's history to its current revision and returns that revision: watches
    /// resumed from an older resourceVersion get 410 Gone (where etcd serves them, i.e. with
    /// `--watch-cache=false`).
    pub async fn compact_etcd(&self) -> u64 {
        assert!(
            self.dedicated,
            "faults are only for a dedicated control plane"
        );
        let stdout = self.script(&["compact"]).await;
        stdout
            .lines()
            .last()
            .and_then(|line| line.trim().parse().ok())
            .unwrap_or_else(|| panic!("`{SCRIPT} compact` printed no revision: {stdout}"))
    }

    /// Runs `scripts/control-plane ARGS --dir DIR` without blocking the runtime (a daemon under
    /// test runs on it meanwhile); returns its stdout.
    async fn script(&self, args: &[&str]) -> String {
        let output = tokio::process::Command::new(SCRIPT)
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {SCRIPT} {args:?}: {e}"));
        assert!(
            output.status.success(),
            "`{SCRIPT} {args:?}` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A kubeconfig authenticating as ServiceAccount `namespace/name` (created if missing) with a
    /// bound token from the TokenRequest API. It carries no rights beyond what RBAC grants that
    /// account, so tests can check the daemon's Role as the daemon's own identity. The token is
    /// bound to no pod: the admission guard's fence refuses its deletes.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        self.token_kubeconfig(namespace, name, None).await
    }

    /// As [`Self::service_account_kubeconfig`], with a token bound to pod `pod` of that account
    /// in `namespace` (created if missing; no kubelet runs, so it stays Pending), as the kubelet
    /// mounts one: the API server puts the pod's name in the user's extra
    /// (`authentication.kubernetes.io/pod-name`), which the admission guard's fence compares with
    /// the Lease holder.
    pub async fn pod_bound_kubeconfig(&self, namespace: &str, name: &str, pod: &str) -> PathBuf {
        self.token_kubeconfig(namespace, name, Some(pod)).await
    }

    async fn token_kubeconfig(&self, namespace: &str, name: &str, pod: Option<&str>) -> PathBuf {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        create_if_missing(
            &accounts,
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await;
        let bound_object_ref = match pod {
            Some(pod) => Some(self.pod_of(namespace, name, pod).await),
            None => None,
        };
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                // Longer than any test; the audience defaults to the API server's.
                expiration_seconds: Some(24 * 3600),
                bound_object_ref,
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("request a token for {namespace}/{name}: {e}"))
            .status
            .and_then(|status| status.token)
            .expect("the TokenRequest response carries a token");

        let server = self.config.cluster_url.to_string();
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let path = self.dir.join(match pod {
            Some(pod) => format!("serviceaccount-{namespace}-{name}-pod-{pod}.kubeconfig"),
            None => format!("serviceaccount-{namespace}-{name}.kubeconfig"),
        });
        let text = token_kubeconfig(&self.kubeconfig, &server, &user, &token, namespace);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Pod `pod` of ServiceAccount `namespace/name` (created if missing, passing the restricted
    /// Pod Security Standard), as a token's bound object.
    async fn pod_of(&self, namespace: &str, name: &str, pod: &str) -> BoundObjectReference {
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let restricted: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": pod},
            "spec": {
                "serviceAccountName": name,
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "workspace-gc", "image": "workspace-gc",
                    "securityContext": {
                        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                    },
                }],
            },
        }))
        .expect("a pod");
        create_if_missing(&pods, &restricted).await;
        let uid = pods
            .get(pod)
            .await
            .unwrap_or_else(|e| panic!("read pod {namespace}/{pod}: {e}"))
            .metadata
            .uid;
        BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.to_owned()),
            uid,
        }
    }

    /// A client authenticating as ServiceAccount `namespace/name`; see
    /// [`Self::service_account_kubeconfig`].
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        let path = self.service_account_kubeconfig(namespace, name).await;
        Client::try_from(load_config(&path)).expect("build a service-account client")
    }

    /// A client authenticating as ServiceAccount `namespace/name` with a token bound to its pod
    /// `pod`; see [`Self::pod_bound_kubeconfig`].
    pub async fn pod_bound_client(&self, namespace: &str, name: &str, pod: &str) -> Client {
        let path = self.pod_bound_kubeconfig(namespace, name, pod).await;
        Client::try_from(load_config(&path)).expect("build a pod-bound client")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if !self.dedicated {
            return;
        }
        // Errors are only reported: panicking in drop would abort a test that is unwinding.
        if let Err(e) = script::down(&self.dir) {
            eprintln!("{e}");
        }
    }
}

/// The Kubernetes release the control planes run (`v1.31.14`): the newest pinned in hack/k8s,
/// or the one `CONTROL_PLANE_K8S` selects (scripts/test runs part of the suite on each).
pub fn kubernetes_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| script_output("version"))
}

/// The Tekton release `up --tekton` runs (`v0.68.0`): the operator's, pinned in hack/tekton, or
/// the one `CONTROL_PLANE_TEKTON_MODULE` selects (scripts/test runs tests/tekton.rs on each).
pub fn tekton_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| script_output("tekton-version"))
}

/// What `scripts/control-plane VERB` prints, trimmed.
pub(super) fn script_output(verb: &str) -> String {
    let output = Command::new(SCRIPT)
        .arg(verb)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {SCRIPT} {verb}: {e}"));
    assert!(
        output.status.success(),
        "`{SCRIPT} {verb}` failed ({})",
        output.status
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The minor of [`kubernetes_version`]: 31 for `v1.31.14`.
pub fn kubernetes_minor() -> u32 {
    kubernetes_version()
        .split('.')
        .nth(1)
        .and_then(|minor| minor.parse().ok())
        .unwrap_or_else(|| panic!("no minor in {}", kubernetes_version()))
}

/// Runs `scripts/control-plane BUILD` (`build`, `build-tekton`), which builds the binaries if the
/// cache misses, with progress on the terminal: a cold build takes many minutes and should not
/// look like a hung test. Concurrent callers are serialised by the script's lock.
fn ensure_binaries(build: &str) {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if built.iter().any(|b| b == build) {
        return;
    }
    {
        let status = Command::new(SCRIPT)
            .arg(build)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .unwrap_or_else(|e| panic!("run {SCRIPT} {build}: {e}"));
        assert!(status.success(), "`{SCRIPT} {build}` failed ({status})");
    }
    built.push(build.to_owned());
}

/// The client configuration in `kubeconfig` (never through an HTTPS_PROXY), for a client that
/// is not the admin's.
pub fn load_config(kubeconfig: &Path) -> Config {
    // Loading a kubeconfig from a file does no network I/O, so blocking on it is harmless even
    // inside a Tokio runtime.
    futures::executor::block_on(script::load_config(kubeconfig)).unwrap_or_else(|e| panic!("{e}"))
}

/// Creates `object`, treating "already exists" as success.
async fn create_if_missing<K>(api: &Api<K>, object: &K)
where
    K: Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(e) => panic!("create {object:?}: {e}"),
    }
}

/// A kubeconfig for `user` with bearer `token`, reaching `server` with the CA embedded in the
/// admin kubeconfig `admin`, in namespace `namespace`.
fn token_kubeconfig(
    admin: &Path,
    server: &str,
    user: &str,
    token: &str,
    namespace: &str,
) -> String {
    let admin = Kubeconfig::read_from(admin).expect("read the admin kubeconfig");
    let ca = admin
        .clusters
        .first()
        .and_then(|named| named.cluster.as_ref())
        .and_then(|cluster| cluster.certificate_authority_data.clone())
        .expect("the admin kubeconfig embeds the cluster CA");
    let server = server.trim_end_matches('/');
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: workspace-gc-test
    cluster:
      server: {server}
      certificate-authority-data: {ca}
users:
  - name: \"{user}\"
    user:
      token: {token}
contexts:
  - name: workspace-gc-test
    context:
      cluster: workspace-gc-test
      user: \"{user}\"
      namespace: {namespace}
current-context: workspace-gc-test
"
    )
}

/// The daemon's ServiceAccount, as the manifests name it.
pub const DAEMON_ACCOUNT: &str = "workspace-gc";

/// A namespace of its own for one test, named `{prefix}-xxxxx` by the API server.
///
/// It is not deleted afterwards: the whole control plane is thrown away when the test binary
/// exits, and on a control plane without kube-controller-manager a namespace never finishes
/// terminating anyway.
pub struct TestNamespace {
    name: String,
    client: Client,
    /// The control plane's admin configuration and kubeconfig, from which the daemon's own
    /// identity is made; `None` for a namespace reached with a client alone
    /// ([`Self::existing`]).
    admin: Option<(Config, PathBuf)>,
}

impl TestNamespace {
    /// Creates the namespace. `prefix` must be a DNS label of at most 57 characters.
    pub async fn new(control_plane: &ControlPlane, prefix: &str) -> TestNamespace {
        let client = control_plane.client();
        let namespace = Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        generate_name: Some(format!("{prefix}-")),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("create a namespace {prefix}-*: {e}"));
        let name = namespace
            .metadata
            .name
            .expect("a created namespace has a name");
        // ServiceAccount admission rejects pods whose account does not exist; without
        // kube-controller-manager nothing creates `default`, with it its creation races the
        // test's first pod.
        create_if_missing(
            &Api::<ServiceAccount>::namespaced(client.clone(), &name),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("default".to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await;
        TestNamespace {
            name,
            client,
            admin: Some((
                control_plane.config(),
                control_plane.kubeconfig_path().to_owned(),
            )),
        }
    }

    /// Creates the namespace `name` (for a run that wants fixed names, such as the soak run).
    pub async fn named(control_plane: &ControlPlane, name: &str) -> TestNamespace {
        let client = control_plane.client();
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        create_if_missing(
            &Api::<ServiceAccount>::namespaced(client.clone(), name),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("default".to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await;
        TestNamespace {
            name: name.to_owned(),
            client,
            admin: Some((
                control_plane.config(),
                control_plane.kubeconfig_path().to_owned(),
            )),
        }
    }

    /// A namespace that already exists, reached with `client`.
    pub fn existing(client: Client, name: &str) -> TestNamespace {
        TestNamespace {
            name: name.to_owned(),
            client,
            admin: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A daemon configuration that watches only this namespace, without leader election,
    /// deleting as fast as a test asks.
    pub fn config(&self) -> DaemonConfig {
        let mut config = DaemonConfig::default();
        config.selector.namespaces = vec![self.name.clone()];
        config.leader_election.enabled = false;
        config.deletion.deletes_per_second = 100.0;
        config.deletion.max_deletions_per_window = 1000;
        config
    }

    /// Every `events.k8s.io` event in this namespace.
    pub async fn events(&self) -> Vec<Event> {
        self.api::<Event>()
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list events in {}: {e}", self.name))
            .items
    }

    /// A client as the daemon runs when installed: ServiceAccount `workspace-gc` of this
    /// namespace, authenticated by a bound token from the TokenRequest API, with exactly the
    /// rights the shipped manifests grant for `config` ([`super::shipped`]): their ClusterRoles
    /// bound cluster-wide, as the base binds its own, and the Lease's Role in the Lease's
    /// namespace when leader election is on. Every daemon a test runs uses it (or
    /// [`Self::daemon_config`] through a proxy), never the admin client.
    pub async fn daemon_client(&self, config: &DaemonConfig) -> Client {
        Client::try_from(self.daemon_config(config).await).expect("build the daemon's client")
    }

    /// [`Self::daemon_client`], reaching the API server at `url` (a [`super::Proxy`]).
    pub async fn daemon_client_via(&self, config: &DaemonConfig, url: &str) -> Client {
        let mut daemon = self.daemon_config(config).await;
        daemon.cluster_url = url.parse().expect("a valid proxy URL");
        Client::try_from(daemon).expect("build the daemon's client through the proxy")
    }

    /// The client configuration of [`Self::daemon_client`].
    pub async fn daemon_config(&self, config: &DaemonConfig) -> Config {
        let (admin, _) = self
            .admin
            .clone()
            .expect("a namespace the test kit created");
        let token = self.daemon_token(config).await;
        let mut daemon = admin;
        daemon.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..kube::config::AuthInfo::default()
        };
        daemon.default_namespace = self.name.clone();
        daemon
    }

    /// A kubeconfig file of [`Self::daemon_client`]'s identity, for the daemon's binary run
    /// with the configuration variables `vars` (`WORKSPACE_GC_<SECTION>_<KEY>`): its rights
    /// follow from the same variables the binary reads.
    pub async fn daemon_kubeconfig(&self, vars: &[(&str, String)]) -> PathBuf {
        let env = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone()));
        let config = DaemonConfig::parse(None, env, &Default::default())
            .unwrap_or_else(|e| panic!("the daemon's variables are valid: {e}"));
        let token = self.daemon_token(&config).await;
        let (admin, kubeconfig) = self
            .admin
            .clone()
            .expect("a namespace the test kit created");
        let user = super::http_proxy::service_account(&self.name, DAEMON_ACCOUNT);
        let text = token_kubeconfig(
            &kubeconfig,
            &admin.cluster_url.to_string(),
            &user,
            &token,
            &self.name,
        );
        let file = tempfile::Builder::new()
            .prefix("workspace-gc-daemon-")
            .suffix(".kubeconfig")
            .tempfile()
            .expect("create the daemon's kubeconfig");
        std::fs::write(file.path(), text).expect("write the daemon's kubeconfig");
        file.into_temp_path()
            .keep()
            .expect("keep the daemon's kubeconfig")
    }

    /// A token of the daemon's ServiceAccount in this namespace, with exactly the shipped rights
    /// for `config` granted to it.
    async fn daemon_token(&self, config: &DaemonConfig) -> String {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
        let account = DAEMON_ACCOUNT;
        let subject = Subject {
            kind: "ServiceAccount".to_owned(),
            name: account.to_owned(),
            namespace: Some(self.name.clone()),
            ..Subject::default()
        };
        let files = super::shipped::cluster_role_files(config);
        // One ClusterRole per namespace and set of files: daemons of one test may differ.
        let role = format!("{}-{account}-{}", self.name, files.len());
        let meta = |name: &str| ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        };
        create_if_missing(
            &self.api::<ServiceAccount>(),
            &ServiceAccount {
                metadata: meta(account),
                ..ServiceAccount::default()
            },
        )
        .await;
        let cluster_roles = Api::<ClusterRole>::all(self.client.clone());
        let cluster_role = ClusterRole {
            metadata: meta(&role),
            rules: Some(super::shipped::cluster_rules(config)),
            ..ClusterRole::default()
        };
        create_if_missing(&cluster_roles, &cluster_role).await;
        let binding = ClusterRoleBinding {
            metadata: meta(&role),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: role.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        };
        create_if_missing(&Api::all(self.client.clone()), &binding).await;
        if config.leader_election.enabled {
            let lease_namespace = (config.leader_election.lease_namespace.clone())
                .unwrap_or_else(|| self.name.clone());
            let lease_role = format!("{}-{account}-lease", self.name);
            let roles: Api<Role> = Api::namespaced(self.client.clone(), &lease_namespace);
            let rules = Some(super::shipped::lease_rules());
            create_if_missing(
                &roles,
                &Role {
                    metadata: meta(&lease_role),
                    rules,
                },
            )
            .await;
            let binding = RoleBinding {
                metadata: meta(&lease_role),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".to_owned()),
                    kind: "Role".to_owned(),
                    name: lease_role.clone(),
                },
                subjects: Some(vec![subject]),
            };
            create_if_missing(
                &Api::<RoleBinding>::namespaced(self.client.clone(), &lease_namespace),
                &binding,
            )
            .await;
        }
        // The API server's authorizer learns the roles and bindings from its informers, a
        // moment after they are written: a daemon started at once can be refused its first
        // requests, which would read as a right the manifests lack. Wait until each rule holds.
        let user = super::http_proxy::service_account(&self.name, account);
        let mut granted: Vec<(PolicyRule, String)> = (super::shipped::cluster_rules(config))
            .into_iter()
            .map(|rule| (rule, self.name.clone()))
            .collect();
        if config.leader_election.enabled {
            let lease_namespace = (config.leader_election.lease_namespace.clone())
                .unwrap_or_else(|| self.name.clone());
            granted.extend(
                (super::shipped::lease_rules().into_iter())
                    .map(|rule| (rule, lease_namespace.clone())),
            );
        }
        self.wait_for_rights(&user, &granted).await;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        (self.api::<ServiceAccount>())
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("request a token for {}/{account}: {e}", self.name))
            .status
            .and_then(|status| status.token)
            .expect("the TokenRequest response carries a token")
    }

    /// Waits until the API server's authorizer grants `user` every verb on every resource of
    /// each rule, in its namespace (a cluster-wide grant answers there too).
    async fn wait_for_rights(&self, user: &str, rules: &[(PolicyRule, String)]) {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let mut asks = Vec::new();
        for (rule, namespace) in rules {
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            // A rule for named objects is asked of its first name.
            let name = (rule.resource_names.as_ref()).and_then(|names| names.first().cloned());
            for group in &groups {
                for resource in &resources {
                    for verb in &rule.verbs {
                        asks.push(ResourceAttributes {
                            namespace: Some(namespace.clone()),
                            verb: Some(verb.clone()),
                            group: Some(group.clone()),
                            resource: Some(resource.clone()),
                            name: name.clone(),
                            ..ResourceAttributes::default()
                        });
                    }
                }
            }
        }
        for ask in asks {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.to_owned()),
                    groups: Some(vec!["system:serviceaccounts".to_owned()]),
                    resource_attributes: Some(ask.clone()),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let allowed = super::wait_until(std::time::Duration::from_secs(30), || async {
                (reviews.create(&PostParams::default(), &review).await)
                    .ok()
                    .and_then(|answer| answer.status)
                    .is_some_and(|status| status.allowed)
            })
            .await;
            assert!(allowed, "{user} is never granted {ask:?}");
        }
    }

    /// The admin client this namespace was created with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A typed API for namespaced objects in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A dynamic API in this namespace, e.g. for [`super::notebook_validation_job_resource`].
    pub fn dynamic_api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.name, resource)
    }

    /// Binds Role `role` of this namespace to ServiceAccount `service_account` of it, with a
    /// RoleBinding named after the role.
    pub async fn bind_role(&self, role: &str, service_account: &str) {
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(role.to_owned()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "Role".to_owned(),
                name: role.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: service_account.to_owned(),
                namespace: Some(self.name.clone()),
                ..Subject::default()
            }]),
        };
        self.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("bind role {role} in {}: {e}", self.name));
    }
}

/// An RBAC rule granting `verbs` on `resources` of `groups`.
pub fn policy_rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let owned = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(owned(groups)),
        resources: Some(owned(resources)),
        verbs: owned(verbs),
        ..PolicyRule::default()
    }
}
