//! Validation: raw values into typed ones through each row's parser (`parse.rs`), then the
//! checks of keys that constrain one another. A value that does not parse, is out of range, or
//! conflicts with another key is rejected, naming the key and the value's origin.

use super::Config;
use super::settings::{Layer, Origins};
use super::value::{At, Problem};

impl Layer {
    /// Turns raw values into typed ones, falling back to the defaults for unset keys, and
    /// checks the keys that constrain one another.
    pub(super) fn resolve(self) -> Result<Config, Problem> {
        let (config, origins) = self.typed()?;
        check(&config, &origins)?;
        Ok(config)
    }
}

/// The keys that constrain one another; a conflict blames the key set last.
fn check(c: &Config, at: &Origins) -> Result<(), Problem> {
    let (sel, sel_at) = (&c.selector, &at.selector);
    if let Some(ns) = (sel.namespaces.iter()).find(|ns| sel.exclude_namespaces.contains(ns)) {
        let (key, at) = blame(
            ("selector.exclude_namespaces", &sel_at.exclude_namespaces),
            ("selector.namespaces", &sel_at.namespaces),
        );
        let message = format!(
            "namespace {ns:?} is both in selector.namespaces and in \
             selector.exclude_namespaces; expected each namespace in at most one of them"
        );
        return Err(problem(key, at, message));
    }

    let (pol, pol_at) = (&c.policy, &at.policy);
    if pol.max_age < pol.orphan_grace {
        let (key, at) = blame(
            ("policy.max_age", &pol_at.max_age),
            ("policy.orphan_grace", &pol_at.orphan_grace),
        );
        let message = format!(
            "policy.max_age ({}) is shorter than policy.orphan_grace ({}); expected max_age \
             at least orphan_grace, which protects every claim younger than it",
            humantime::format_duration(pol.max_age),
            humantime::format_duration(pol.orphan_grace),
        );
        return Err(problem(key, at, message));
    }

    let (del, del_at) = (&c.deletion, &at.deletion);
    // Refused rather than guessed: asking for a server-side dry run must never delete.
    if del.server_side_dry_run && !del.dry_run {
        let (key, at) = blame(
            ("deletion.server_side_dry_run", &del_at.server_side_dry_run),
            ("deletion.dry_run", &del_at.dry_run),
        );
        let message = "deletion.server_side_dry_run is true but deletion.dry_run is false; \
                       expected dry_run = true as well (a server-side dry run is a dry run)";
        return Err(problem(key, at, message));
    }
    // Only a volume read before its claim's delete is marked, and only a marked one is
    // ever deleted: without the read, the TTL could never apply.
    if del.released_volume_ttl.is_some() && !del.read_volumes {
        let (key, at) = blame(
            ("deletion.released_volume_ttl", &del_at.released_volume_ttl),
            ("deletion.read_volumes", &del_at.read_volumes),
        );
        let message = "deletion.released_volume_ttl is set but deletion.read_volumes is \
                       false; expected read_volumes = true as well (a volume is marked for \
                       deletion when it is read, before its claim is deleted)";
        return Err(problem(key, at, message));
    }

    // The HTTPS metrics keys: an address and both files, or none of them.
    let (http, http_at) = (&c.http, &at.http);
    for (name, set, file_at) in [
        (
            "http.tls_cert_file",
            http.tls_cert_file.is_some(),
            &http_at.tls_cert_file,
        ),
        (
            "http.tls_key_file",
            http.tls_key_file.is_some(),
            &http_at.tls_key_file,
        ),
    ] {
        if http.secure_listen.is_some() != set {
            let (blamed, at) = blame(
                (name, file_at),
                ("http.secure_listen", &http_at.secure_listen),
            );
            let message = format!(
                "http.secure_listen, http.tls_cert_file and http.tls_key_file are set together \
                 or not at all; {name} is {}",
                if set { "set" } else { "empty" }
            );
            return Err(problem(blamed, at, message));
        }
    }

    // Each water is a fraction in (0, 1], and low water below high water, or pressure would
    // delete without ever reaching its goal.
    let (quota, quota_at) = (&c.quota, &at.quota);
    if quota.low_water >= quota.high_water {
        let (key, at) = blame(
            ("quota.low_water", &quota_at.low_water),
            ("quota.high_water", &quota_at.high_water),
        );
        let message = format!(
            "quota.low_water ({}) is not below quota.high_water ({}); expected \
             0 < low_water < high_water <= 1",
            quota.low_water, quota.high_water
        );
        return Err(problem(key, at, message));
    }
    Ok(())
}

fn problem(key: &'static str, at: &At, message: impl Into<String>) -> Problem {
    Problem {
        key,
        at: at.clone(),
        message: message.into(),
    }
}

/// For a conflict between two keys, the one set by the later layer: that is what the user
/// just changed. On a tie, the first.
fn blame<'a>(
    first: (&'static str, &'a At),
    second: (&'static str, &'a At),
) -> (&'static str, &'a At) {
    if second.1.rank() > first.1.rank() {
        second
    } else {
        first
    }
}
