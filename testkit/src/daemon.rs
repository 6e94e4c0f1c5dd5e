//! Running the daemon for a test: in this process (`controller::run`, as tests/cluster/collector.rs
//! does) or as the real binary in a child process (for leader election across processes and
//! SIGKILL), and reading its HTTP endpoint.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use workspace_gc::cluster::server_clock::ServerClock;
use workspace_gc::config::Config;
use workspace_gc::daemon::controller::{self, RunOptions};

use super::paths::daemon_binary;
use super::{free_port, http_get, metric, wait_until};

/// A daemon running in this process until stopped.
pub struct Daemon {
    stop: CancellationToken,
    task: JoinHandle<()>,
    port: u16,
    denials_expected: bool,
}

/// The daemon runs with the shipped rights ([`super::TestNamespace::daemon_client`]): a
/// `forbidden` answer to one of its own requests means the code asks for what an installation
/// does not grant, and fails the test that reads its metrics. Only a test that takes a right
/// away on purpose, or restarts the API server (which answers 403 until its RBAC informers have
/// synced), says so ([`Daemon::expecting_denials`], [`Process::expecting_denials`]).
fn nothing_forbidden(metrics: String, allowed: bool) -> String {
    let forbidden = metric(
        &metrics,
        "workspace_gc_api_errors_total",
        "category=\"forbidden\"",
    );
    if !allowed && forbidden > 0.0 {
        let refused: Vec<&str> = (metrics.lines())
            .filter(|line| line.starts_with("workspace_gc_api_errors_total{"))
            .filter(|line| line.contains("category=\"forbidden\""))
            .collect();
        panic!("the daemon was refused a request its shipped rights should allow: {refused:?}");
    }
    metrics
}

impl Daemon {
    /// Starts the daemon and waits until `/readyz` answers 200.
    pub async fn start(client: kube::Client, config: Config, identity: &str) -> Daemon {
        let daemon = Self::spawn(client, config, identity);
        assert!(
            wait_until(Duration::from_secs(30), || daemon.ready()).await,
            "the daemon became ready"
        );
        daemon
    }

    /// Starts the daemon without waiting for it to become ready.
    pub fn spawn(client: kube::Client, config: Config, identity: &str) -> Daemon {
        let port = free_port();
        let stop = CancellationToken::new();
        let options = RunOptions {
            identity: identity.to_owned(),
            pod_namespace: None,
            listen: ([127, 0, 0, 1], port).into(),
            // Told by one request at start: this client has no clock layer.
            clock: ServerClock::default(),
        };
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                controller::run(client, config, options, stop)
                    .await
                    .expect("the daemon runs until stopped");
            }
        });
        Daemon {
            stop,
            task,
            port,
            denials_expected: false,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port, path).await
    }

    pub async fn ready(&self) -> bool {
        self.get("/readyz").await.0 == 200
    }

    pub async fn metrics(&self) -> String {
        nothing_forbidden(self.get("/metrics").await.1, self.denials_expected)
    }

    /// For a test whose `forbidden` answers are not the daemon's doing (one that restarts the
    /// API server): they are no failure.
    pub fn expecting_denials(mut self) -> Self {
        self.denials_expected = true;
        self
    }

    /// Whether the daemon task is still running (it has not panicked or returned).
    pub fn running(&self) -> bool {
        !self.task.is_finished()
    }

    pub async fn stop(self) {
        self.metrics().await;
        self.stop.cancel();
        self.task.await.expect("the daemon stopped cleanly");
    }
}

/// The real `workspace-gc run` binary in a child process, killed when dropped. Its stderr (the
/// logs) goes to a file, read with [`Process::logs`].
pub struct Process {
    child: Child,
    port: u16,
    log: PathBuf,
    /// Whether this test takes a right away on purpose: `forbidden` answers are expected.
    denials_expected: bool,
}

impl Process {
    /// Runs `workspace-gc run` against `kubeconfig` with the given configuration variables
    /// (`WORKSPACE_GC_<SECTION>_<KEY>`), as pod `identity`, serving HTTP on a free port.
    /// Every other `WORKSPACE_GC_` variable of the test's environment is removed.
    pub fn spawn(kubeconfig: &Path, vars: &[(&str, String)], identity: &str, log: &Path) -> Self {
        Self::spawn_binary(&daemon_binary(), kubeconfig, vars, identity, log)
    }

    /// [`Process::spawn`] of another build of the daemon (an earlier version, for upgrades).
    pub fn spawn_binary(
        binary: &Path,
        kubeconfig: &Path,
        vars: &[(&str, String)],
        identity: &str,
        log: &Path,
    ) -> Self {
        let port = free_port();
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("create the log {}: {e}", log.display()));
        let mut command = Command::new(binary);
        command
            .args(["run", "--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("WORKSPACE_GC_") {
                command.env_remove(key);
            }
        }
        for (key, value) in vars {
            command.env(key, value);
        }
        let child = command.spawn().expect("start workspace-gc run");
        Process {
            child,
            port,
            log: log.to_owned(),
            denials_expected: false,
        }
    }

    /// For a test that denies the daemon a right on purpose: its `forbidden` answers are
    /// what the test looks for, not a failure.
    pub fn expecting_denials(mut self) -> Self {
        self.denials_expected = true;
        self
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the process has not been reaped")
    }

    /// The port it serves HTTP on, for a task polling it while the test holds the process.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port, path).await
    }

    pub async fn ready(&self) -> bool {
        self.get("/readyz").await.0 == 200
    }

    pub async fn metrics(&self) -> String {
        nothing_forbidden(self.get("/metrics").await.1, self.denials_expected)
    }

    /// Whether `/metrics` says this replica holds the lease. (Not a substring test: the
    /// metric's HELP line reads "workspace_gc_leader 1 while this replica holds the lease".)
    pub async fn leading(&self) -> bool {
        metric(&self.metrics().await, "workspace_gc_leader", "") == 1.0
    }

    /// The exit status if the process has exited (a crash, for a daemon nobody stopped).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its logs so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no drain, no lease release, as when a node dies.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("send SIGKILL");
        self.child.wait().await.expect("reap the killed daemon");
    }

    /// SIGTERM, then its exit status once it has drained.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the daemon exits within 30 s of SIGTERM")
            .expect("reap the daemon")
    }
}

/// `workspace-gc audit ARGS` against `control_plane` as cluster-admin, with no `WORKSPACE_GC_*`
/// variable of this process but `env`: its stdout, once it exited with success within a minute.
pub async fn audit_output(
    control_plane: &super::ControlPlane,
    args: &[&str],
    env: &[(&str, &str)],
) -> Vec<u8> {
    let mut command = tokio::process::Command::new(daemon_binary());
    command.arg("audit").args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("WORKSPACE_GC_") {
            command.env_remove(key);
        }
    }
    let output = command
        .env("KUBECONFIG", control_plane.kubeconfig_path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("the audit ends within a minute")
        .expect("run workspace-gc audit");
    assert!(
        output.status.success(),
        "audit failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// `workspace-gc audit --output json` over `namespaces` under a policy, as rows.
pub async fn audit_rows(
    control_plane: &super::ControlPlane,
    namespaces: &[String],
    (ttl, failed, grace, max_age): (&str, &str, &str, &str),
) -> Vec<serde_json::Value> {
    let mut args = vec!["--output", "json"];
    for ns in namespaces {
        args.extend(["--namespace", ns.as_str()]);
    }
    let env = [
        ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", ttl),
        ("WORKSPACE_GC_POLICY_TTL_AFTER_FAILED", failed),
        ("WORKSPACE_GC_POLICY_ORPHAN_GRACE", grace),
        ("WORKSPACE_GC_POLICY_MAX_AGE", max_age),
    ];
    let stdout = audit_output(control_plane, &args, &env).await;
    serde_json::from_slice(&stdout).expect("the audit prints JSON rows")
}
