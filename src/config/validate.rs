//! Validation: each raw value's parser (a row of `settings.rs` names it), and the checks of
//! keys that constrain one another. Each rejects a value that does not parse, is out of range,
//! or conflicts with another key, naming the key and the value's origin.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::labels::{LabelSelector, dns1123_label, dns1123_subdomain, label_key, label_value};
use super::layers::{At, Problem};
use super::settings::{Layer, Origins};
use super::{Config, LogFormat, MAX_DURATION, deletion_interval};
use crate::contract::labels;
use crate::decide::facts::MAX_KEEP_FAILED;

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

// ---------------------------------------------------------------------------------------------
// Value syntax

// Each parser takes a raw value and returns the typed one, or what was wrong and what is expected.

pub(super) fn duration(raw: String) -> Result<Duration, String> {
    let d = humantime::parse_duration(&raw).map_err(|e| {
        format!(
            "{raw:?} is not a duration ({e}); expected a number and a unit, \
             e.g. \"90s\", \"10m\", \"1h\" or \"7d\""
        )
    })?;
    if d > MAX_DURATION {
        return Err(format!("{raw:?} is too long; expected at most 100 years"));
    }
    Ok(d)
}

/// Empty: not set, another key's value applies.
pub(super) fn optional_duration(raw: String) -> Result<Option<Duration>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    duration(raw).map(Some)
}

/// Empty: off.
pub(super) fn optional_positive_duration(raw: String) -> Result<Option<Duration>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    positive_duration(raw).map(Some)
}

pub(super) fn positive_duration(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d.is_zero() {
        return Err(format!("{raw:?} must be greater than zero"));
    }
    Ok(d)
}

/// Zero allowed (a round for every re-check that finds none waiting); at most a minute, which
/// would already hold each due claim that long.
pub(super) fn round_interval(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d > Duration::from_secs(60) {
        return Err(format!("{raw:?} is too long; expected at most 1m"));
    }
    Ok(d)
}

/// The Lease API counts whole seconds, and the renew deadline derived from it must be shorter.
pub(super) fn lease_seconds(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d.subsec_nanos() != 0 || !(2..=3600).contains(&d.as_secs()) {
        return Err(format!(
            "{raw:?} must be a whole number of seconds from 2s to 1h"
        ));
    }
    Ok(d)
}

pub(super) fn positive_rate(rate: f64) -> Result<f64, String> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("{rate} must be a finite number greater than zero"));
    }
    // A rate too small to state as an interval must not silently become "no pacing at all".
    match deletion_interval(rate) {
        Some(_) => Ok(rate),
        None => Err(format!(
            "{rate:e} is too small: it means one deletion every {:.1e} s; expected at least \
             {:.1e} (one deletion per 100 years)",
            1.0 / rate,
            1.0 / MAX_DURATION.as_secs_f64()
        )),
    }
}

/// A share of a quota: greater than zero, at most one.
pub(super) fn fraction(value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "{value} must be a fraction greater than 0 and at most 1, e.g. 0.9"
        ))
    }
}

/// A number of failed builds to keep: a larger one is a typo, and would make every decision
/// count that many newer failures.
pub(super) fn keep_count(keep: u32) -> Result<u32, String> {
    if keep > MAX_KEEP_FAILED {
        return Err(format!(
            "{keep} is too many; expected at most {MAX_KEEP_FAILED} failed builds per namespace (0 turns keeping by count off)"
        ));
    }
    Ok(keep)
}

pub(super) fn positive_cap(cap: u32) -> Result<u32, String> {
    match cap {
        0 => Err("0 must be at least 1; to delete nothing, set deletion.dry_run".to_owned()),
        cap => Ok(cap),
    }
}

/// A valid label selector that requires some label to be present: anything broader reaches
/// claims the operator never created.
pub(super) fn tracking_selector(raw: String) -> Result<LabelSelector, String> {
    let selector: LabelSelector = raw.parse()?;
    if !selector.requires_a_label() {
        return Err(format!(
            "{raw:?} would select claims without any required label; expected at least one \
             `key=value`, `key in (...)` or `key` requirement, \
             e.g. \"mlops.redhat.com/build-workspace=true\""
        ));
    }
    Ok(selector)
}

pub(super) fn namespace_list(list: Vec<String>) -> Result<Vec<String>, String> {
    for ns in &list {
        dns1123_label(ns).map_err(|why| format!("{ns:?} is not a valid namespace name: {why}"))?;
    }
    Ok(list)
}

/// Empty means "the pod's namespace".
pub(super) fn optional_namespace(ns: String) -> Result<Option<String>, String> {
    if ns.is_empty() {
        return Ok(None);
    }
    dns1123_label(&ns).map_err(|why| format!("{ns:?} is not a valid namespace name: {why}"))?;
    Ok(Some(ns))
}

pub(super) fn subdomain_name(name: String) -> Result<String, String> {
    dns1123_subdomain(&name).map_err(|why| format!("{name:?} is not a valid Lease name: {why}"))?;
    Ok(name)
}

/// Empty means "the cluster's default class".
pub(super) fn optional_storage_class(class: String) -> Result<Option<String>, String> {
    if class.is_empty() {
        return Ok(None);
    }
    dns1123_subdomain(&class)
        .map_err(|why| format!("{class:?} is not a valid storage class name: {why}"))?;
    Ok(Some(class))
}

/// Empty: off.
pub(super) fn optional_socket_address(raw: String) -> Result<Option<SocketAddr>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    socket_address(raw).map(Some)
}

/// Empty: none.
pub(super) fn optional_path(raw: String) -> Result<Option<PathBuf>, String> {
    Ok((!raw.is_empty()).then(|| PathBuf::from(raw)))
}

pub(super) fn socket_address(raw: String) -> Result<SocketAddr, String> {
    raw.parse().map_err(|_| {
        format!(
            "{raw:?} is not a socket address; expected IP:PORT, \
             e.g. \"0.0.0.0:8080\" or \"[::]:8080\""
        )
    })
}

pub(super) fn log_format(raw: String) -> Result<LogFormat, String> {
    match raw.as_str() {
        "human" => Ok(LogFormat::Human),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!(
            "{raw:?} is not a log format; expected \"human\" or \"json\""
        )),
    }
}

pub(super) fn log_filter(raw: String) -> Result<String, String> {
    let example = "e.g. \"info\" or \"workspace_gc=debug,info\"";
    if raw.trim().is_empty() {
        return Err(format!(
            "{raw:?} is empty; expected a log filter, {example}"
        ));
    }
    match tracing_subscriber::EnvFilter::try_new(&raw) {
        Ok(_) => Ok(raw),
        Err(e) => Err(format!(
            "{raw:?} is not a log filter ({e}); expected {example}"
        )),
    }
}

fn label_map(labels: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    for (key, value) in &labels {
        label_key(key).map_err(|why| format!("{key:?} is not a valid label key: {why}"))?;
        label_value(value)
            .map_err(|why| format!("{value:?} (of {key:?}) is not a valid label value: {why}"))?;
    }
    Ok(labels)
}

/// Extra labels for created claims; the ones `create` sets itself cannot be overridden.
pub(super) fn creator_labels(
    labels: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let fixed = labels::OPERATOR
        .iter()
        .map(|(key, _)| *key)
        .chain([labels::JOB]);
    for key in fixed {
        if labels.contains_key(key) {
            return Err(format!(
                "{key:?} is set by workspace-gc create itself and cannot be configured"
            ));
        }
    }
    label_map(labels)
}

/// Annotation values are free text; only the keys have a syntax.
pub(super) fn annotation_map(
    map: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    for key in map.keys() {
        label_key(key).map_err(|why| format!("{key:?} is not a valid annotation key: {why}"))?;
    }
    Ok(map)
}
