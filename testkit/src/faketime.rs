//! libfaketime (Debian's `faketime` package, which `scripts/test` installs): a process with its
//! wall clock off, for tests/cluster/clock.rs and the soak's skewed replica.

use std::path::Path;

/// Where Debian (either architecture) and a local build put the library.
const LIBRARIES: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The environment that runs a process with its wall clock `offset` off (libfaketime's syntax:
/// "+2h", "-90m"). The monotonic clock (timers, the fence) stays true, as on a node whose RTC is
/// wrong. Panics when libfaketime is missing.
pub fn faketime(offset: &str) -> Vec<(&'static str, String)> {
    let library = LIBRARIES
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("libfaketime is missing: install Debian's faketime (scripts/test does)");
    vec![
        ("LD_PRELOAD", library.to_owned()),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_DONT_RESET", "1".to_owned()),
    ]
}
