//! promtool and the Prometheus server, built from the release pinned in hack/promtool by
//! `scripts/control-plane build-prometheus` on first use, and cached like the control plane.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::cluster::SCRIPT;

/// The path of `promtool` or `prometheus`, built if missing.
pub fn prometheus_binary(name: &str) -> PathBuf {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = BIN_DIR.get_or_init(|| {
        let output = Command::new(SCRIPT)
            .arg("build-prometheus")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run {SCRIPT} build-prometheus: {e}"));
        assert!(
            output.status.success(),
            "`{SCRIPT} build-prometheus` failed ({})",
            output.status
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        PathBuf::from(stdout.lines().last().expect("the bin dir, last").trim())
    });
    dir.join(name)
}
