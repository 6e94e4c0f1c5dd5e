//! Where the kit finds the repository, the daemon's binary and scratch space. The kit is a
//! library, so Cargo gives it neither `CARGO_BIN_EXE_workspace-gc` nor `CARGO_TARGET_TMPDIR`:
//! both are found from the running test binary, which Cargo puts in `<target>/<profile>/deps/`,
//! one folder below the daemon's binary (Cargo builds the binary before it runs any integration
//! test or benchmark of the daemon's package).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository's root: the kit lives in its `testkit/`.
pub const REPOSITORY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// `scripts/control-plane`, the one way the tests and the benchmark start a control plane.
pub const CONTROL_PLANE_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/control-plane");

/// `<target>/<profile>`, the folder of the running test binary's `deps/`.
fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let deps = exe.parent().expect("the test binary is in a folder");
        let profile = if deps.ends_with("deps") {
            deps.parent().expect("deps/ has a parent")
        } else {
            deps
        };
        profile.to_path_buf()
    })
}

/// The daemon's binary that Cargo built for this test run.
pub fn daemon_binary() -> PathBuf {
    let binary = profile_dir().join("workspace-gc");
    assert!(
        binary.is_file(),
        "{} is missing: run the tests with `cargo test`, which builds it",
        binary.display()
    );
    binary
}

/// Scratch space inside the target folder (`<target>/tmp`, what Cargo names
/// `CARGO_TARGET_TMPDIR`), created on first use.
pub fn scratch_dir() -> PathBuf {
    let dir = (profile_dir().parent())
        .unwrap_or_else(|| profile_dir())
        .join("tmp");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}
