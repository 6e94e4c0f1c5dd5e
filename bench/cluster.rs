//! The control plane for one benchmark size: the test kit's ([`testkit::ControlPlane`], started
//! the one way the project starts one, `scripts/control-plane`), plus what the benchmark adds on
//! top: an identity (client certificate) per contender, RBAC, and readings of processes and API
//! server metrics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::results::ProcSample;
use testkit::{ControlPlane, ControlPlaneOptions, HaPlane, script};

/// The user names the contenders authenticate as (the CN of their client certificates). The
/// audit policy records exactly these and the controller manager.
pub const DAEMON_USER: &str = "bench:workspace-gc";
pub const SWEEP_USER: &str = "bench:sweep";
pub const KCM_USER: &str = "system:kube-controller-manager";

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Starts the control plane of one size in `dir` (a tmpfs) the way the tests start theirs, with
/// kube-controller-manager and `apiserver_args`, as the HA plane `ha` if given; how long it
/// took to be ready. Stopped on drop.
pub fn start(
    dir: &Path,
    apiserver_args: &[String],
    ha: Option<&HaPlane>,
) -> Result<(ControlPlane, Duration)> {
    let started = Instant::now();
    let options = ControlPlaneOptions {
        controller_manager: true,
        apiserver_args: apiserver_args.to_vec(),
    };
    let plane = match ha {
        Some(ha) => ControlPlane::start_ha_in(dir, &options, ha),
        None => ControlPlane::start_in(dir, &options),
    }
    .map_err(|e| anyhow!(e))?;
    Ok((plane, started.elapsed()))
}

/// What the benchmark reads of the test kit's control plane beyond what the tests read: its
/// processes, its binaries' versions, etcd's size, and identities (client certificates) that
/// the audit log tells apart.
pub trait Readings {
    /// The pid of one of the daemons the script started (etcd, kube-apiserver,
    /// kube-controller-manager), checked against its recorded start time.
    fn pid(&self, name: &str) -> Option<u32>;
    /// Version lines of the control plane's binaries.
    fn versions(&self) -> BTreeMap<&'static str, String>;
    /// Bytes etcd keeps on disk (its data directory on the tmpfs).
    fn etcd_bytes(&self) -> u64;
    /// Bytes of etcd's database file (the data itself, without the preallocated WAL).
    fn etcd_db_bytes(&self) -> u64;
    /// A client certificate for `user`, signed by the cluster CA, and a kubeconfig using it.
    fn identity_kubeconfig(&self, aux: &Path, user: &str) -> Result<PathBuf>;
}

impl Readings for ControlPlane {
    fn pid(&self, name: &str) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir().join(format!("{name}.pid"))).ok()?;
        let mut fields = text.split_whitespace();
        let pid: u32 = fields.next()?.parse().ok()?;
        let start = fields.next()?;
        (proc_start_time(pid)?.as_str() == start).then_some(pid)
    }

    fn versions(&self) -> BTreeMap<&'static str, String> {
        let mut out = BTreeMap::new();
        let bin = Command::new(script::SCRIPT)
            .arg("build")
            .stderr(Stdio::null())
            .output();
        let Some(bin) = bin
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().last().map(|l| PathBuf::from(l.trim())))
        else {
            return out;
        };
        let run = |binary: &str, arg: &str| {
            Command::new(bin.join(binary))
                .arg(arg)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        if let Some(v) = run("kube-apiserver", "--version") {
            out.insert("kube-apiserver", v);
        }
        if let Some(v) = run("etcd", "--version") {
            out.insert("etcd", v.lines().next().unwrap_or_default().to_owned());
        }
        out
    }

    fn etcd_bytes(&self) -> u64 {
        dir_size(&self.dir().join("etcd"))
    }

    fn etcd_db_bytes(&self) -> u64 {
        std::fs::metadata(self.dir().join("etcd/member/snap/db"))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    fn identity_kubeconfig(&self, aux: &Path, user: &str) -> Result<PathBuf> {
        let pki = self.dir().join("pki");
        let stem = user.replace(':', "-");
        let key = aux.join(format!("{stem}.key"));
        let csr = aux.join(format!("{stem}.csr"));
        let crt = aux.join(format!("{stem}.crt"));
        let ext = aux.join(format!("{stem}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n\
             extendedKeyUsage = clientAuth\n",
        )?;
        let serial = format!(
            "0x{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        );
        openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            path_str(&key)?,
        ])?;
        openssl(&[
            "req",
            "-new",
            "-config",
            path_str(&pki.join("openssl.cnf"))?,
            "-key",
            path_str(&key)?,
            "-subj",
            &format!("/CN={user}"),
            "-out",
            path_str(&csr)?,
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            path_str(&csr)?,
            "-CA",
            path_str(&pki.join("ca.crt"))?,
            "-CAkey",
            path_str(&pki.join("ca.key"))?,
            "-set_serial",
            &serial,
            "-days",
            "2",
            "-extfile",
            path_str(&ext)?,
            "-out",
            path_str(&crt)?,
        ])?;
        let kubeconfig = aux.join(format!("{stem}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: bench\n    cluster:\n      \
             server: {server}\n      certificate-authority: {ca}\nusers:\n  - name: \"{user}\"\n    \
             user:\n      client-certificate: {crt}\n      client-key: {key}\ncontexts:\n  - name: \
             bench\n    context:\n      cluster: bench\n      user: \"{user}\"\n      namespace: \
             default\ncurrent-context: bench\n",
            server = self.config().cluster_url.to_string().trim_end_matches('/'),
            ca = pki.join("ca.crt").display(),
            crt = crt.display(),
            key = key.display(),
        );
        std::fs::write(&kubeconfig, text)?;
        Ok(kubeconfig)
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", path.display()))
}

fn openssl(args: &[&str]) -> Result<()> {
    let output = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run openssl")?;
    if !output.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let mut config = script::load_config(kubeconfig)
        .await
        .map_err(|e| anyhow!(e))?;
    // Creation pushes many requests at once through one client; the default 295 s read
    // timeout is fine, but connects must not hang.
    config.connect_timeout = Some(Duration::from_secs(10));
    Ok(Client::try_from(config)?)
}

/// The namespace the daemon runs in, for its Lease (leader election, as deployed).
pub const DAEMON_NAMESPACE: &str = "workspace-gc";

/// The first object of `kind` in a manifest of manifests/base.
fn manifest<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> Result<T> {
    let text = std::fs::read_to_string(root().join("manifests/base").join(file))?;
    for value in serde_saphyr::from_multiple::<serde_json::Value>(&text)? {
        if value.get("kind").and_then(|k| k.as_str()) == Some(kind) {
            return Ok(serde_json::from_value(value)?);
        }
    }
    bail!("no {kind} in {file}")
}

pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}

/// Grants the daemon's own ClusterRole (manifests/base/rbac-cluster.yaml, so the benchmark
/// runs with exactly the rights a deployment has) to both contenders' users, and the daemon
/// its Lease Role (rbac-lease.yaml) in its namespace.
pub async fn grant(client: &Client) -> Result<()> {
    let mut lease_role: Role = manifest("rbac-lease.yaml", "Role")?;
    lease_role.metadata.namespace = Some(DAEMON_NAMESPACE.into());
    create_namespace(client, DAEMON_NAMESPACE).await?;
    let roles: Api<Role> = Api::namespaced(client.clone(), DAEMON_NAMESPACE);
    roles.create(&PostParams::default(), &lease_role).await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: lease_role.metadata.name.clone(),
            namespace: Some(DAEMON_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: lease_role.metadata.name.clone().unwrap_or_default(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: DAEMON_USER.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), DAEMON_NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await?;

    let role: ClusterRole = manifest("rbac-cluster.yaml", "ClusterRole")?;
    let role_name = role.metadata.name.clone().unwrap_or_default();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    for user in [DAEMON_USER, SWEEP_USER] {
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(user.replace(':', "-")),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: role_name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                name: user.into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                namespace: None,
            }]),
        };
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await?;
    }
    Ok(())
}

// --- processes ---------------------------------------------------------------------------------

/// Field 22 of /proc/PID/stat (start time in ticks), or `None` if gone or a zombie.
pub fn proc_start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19).map(|s| (*s).to_owned())
}

pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

pub fn sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some(ProcSample {
        hwm_kib: kib("VmHWM:")?,
        rss_kib: kib("VmRSS:")?,
        cpu_s: cpu_seconds(pid)?,
    })
}

pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

// --- metrics -----------------------------------------------------------------------------------

/// Fetches a Prometheus text endpoint over the API server (`/metrics`).
pub async fn apiserver_metrics(client: &Client) -> Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// The load average line of /proc/loadavg (1, 5, 15 minutes).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
