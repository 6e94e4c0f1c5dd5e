//! Each value's syntax: a parser takes a raw value and returns the typed one, or what was wrong
//! and what is expected. A row of the table in `settings.rs` names its parser.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::labels::{LabelSelector, dns1123_label, dns1123_subdomain, label_key, label_value};
use super::{LogFormat, MAX_DURATION, deletion_interval};
use crate::contract::labels;
use crate::decide::facts::MAX_KEEP_FAILED;

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
/// The least time between proof rounds: at least half a second, since every round costs four
/// consistent reads and replay watches, and without a floor a burst starts one round per due
/// claim (at 0 the benchmark's API server answered the reads 500 and 429, and 572 of 636 due
/// claims were not reclaimed: docs/performance.md, "Lag against reads").
pub(super) fn round_interval(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d < Duration::from_millis(500) {
        return Err(format!(
            "{raw:?} is too short; expected at least 500ms: each round costs four reads and \
             short watches, and shorter rounds overload the API server in a burst"
        ));
    }
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

/// A percentage in (0, 100]; 0 is off.
pub(super) fn optional_percent(percent: f64) -> Result<Option<f64>, String> {
    if percent == 0.0 {
        return Ok(None);
    }
    if percent.is_finite() && percent > 0.0 && percent <= 100.0 {
        return Ok(Some(percent));
    }
    Err(format!(
        "{percent} must be a percentage, greater than 0 and at most 100 (0: off)"
    ))
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

/// Name suffixes: each non-empty and of characters a claim's name may hold, since an empty
/// one would make every name a candidate's.
pub(super) fn name_suffixes(list: Vec<String>) -> Result<Vec<String>, String> {
    for suffix in &list {
        let fits = !suffix.is_empty()
            && (suffix.bytes())
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !fits {
            return Err(format!(
                "{suffix:?} is not a claim name suffix (lowercase letters, digits, '-' and '.', not empty)"
            ));
        }
    }
    Ok(list)
}

/// Field manager names, as `metadata.managedFields[].manager` records them: not empty.
pub(super) fn field_managers(list: Vec<String>) -> Result<Vec<String>, String> {
    match list.iter().find(|manager| manager.trim().is_empty()) {
        Some(empty) => Err(format!("{empty:?} is not a field manager name")),
        None => Ok(list),
    }
}

/// Usernames as `request.userInfo.username` carries them: not empty, no quote (they are
/// written into the admission guard's CEL).
pub(super) fn usernames(list: Vec<String>) -> Result<Vec<String>, String> {
    match (list.iter()).find(|user| user.trim().is_empty() || user.contains(['\'', '"', '\\'])) {
        Some(odd) => Err(format!("{odd:?} is not a username")),
        None => Ok(list),
    }
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
