//! `scripts/control-plane`, the one way the tests and the benchmark start and stop a local
//! control plane, and the admin configuration it writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use crate::paths::CONTROL_PLANE_SCRIPT as SCRIPT;

/// Starts a control plane in `dir` (`scripts/control-plane up`) owned by this process: the
/// script's watchdog stops it when this process exits, however it exits. `flags` are the
/// script's own (`--controller-manager`, `--tekton`, ...), `apiserver_args` go to
/// kube-apiserver besides its own flags. The admin kubeconfig it wrote, or what failed, with
/// the script's stderr.
pub fn up(dir: &Path, flags: &[&str], apiserver_args: &[String]) -> Result<PathBuf, String> {
    let mut up = Command::new(SCRIPT);
    up.arg("up")
        .arg("--dir")
        .arg(dir)
        .arg("--owner-pid")
        .arg(std::process::id().to_string())
        .args(flags);
    for arg in apiserver_args {
        up.arg("--apiserver-arg").arg(arg);
    }
    let output = up
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {SCRIPT}: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "`{SCRIPT} up` failed ({}):\n{stderr}",
            output.status
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let kubeconfig = stdout
        .lines()
        .last()
        .ok_or_else(|| format!("`{SCRIPT} up` printed no kubeconfig path:\n{stderr}"))?;
    Ok(PathBuf::from(kubeconfig.trim()))
}

/// Stops the control plane in `dir` (`scripts/control-plane down`); what failed, if anything.
pub fn down(dir: &Path) -> Result<(), String> {
    let output = Command::new(SCRIPT)
        .arg("down")
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {SCRIPT} down: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{SCRIPT} down` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The client configuration in `kubeconfig`, never through an HTTPS_PROXY of the environment:
/// it must not intercept 127.0.0.1.
pub async fn load_config(kubeconfig: &Path) -> Result<Config, String> {
    let parsed = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| format!("read {}: {e}", kubeconfig.display()))?;
    let mut config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("load {}: {e}", kubeconfig.display()))?;
    config.proxy_url = None;
    Ok(config)
}
