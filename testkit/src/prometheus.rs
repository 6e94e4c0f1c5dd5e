//! Tools built from a wrapper module under hack/ on first use and cached like the control plane:
//! promtool and the Prometheus server (hack/promtool, `scripts/control-plane build-prometheus`)
//! helm (hack/helm, `scripts/control-plane build-helm`), and cosign and crane (hack/release,
//! `scripts/control-plane build-release-tools`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::cluster::script_output;

/// The bin dir `scripts/control-plane VERB` builds (if missing) and prints last, once per verb.
fn built(verb: &str) -> PathBuf {
    static BIN_DIRS: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut dirs = BIN_DIRS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dirs = dirs.get_or_insert_with(HashMap::new);
    if let Some(dir) = dirs.get(verb) {
        return dir.clone();
    }
    let stdout = script_output(verb);
    let dir = PathBuf::from(stdout.lines().last().expect("the bin dir, last").trim());
    dirs.insert(verb.to_owned(), dir.clone());
    dir
}

/// The path of `promtool` or `prometheus`, built if missing.
pub fn prometheus_binary(name: &str) -> PathBuf {
    built("build-prometheus").join(name)
}

/// The path of `helm`, built if missing.
pub fn helm_binary() -> PathBuf {
    built("build-helm").join("helm")
}

/// The path of `cosign` or `crane`, built if missing.
pub fn release_tool(name: &str) -> PathBuf {
    built("build-release-tools").join(name)
}
