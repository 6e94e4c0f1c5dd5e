//! Validation: turns a raw [`Layer`] into the typed [`Config`], value by value, and rejects a
//! value that does not parse, is out of range, or conflicts with another key, naming the key
//! and the value's origin.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::labels::{LabelSelector, dns1123_label, dns1123_subdomain, label_key, label_value};
use super::layers::{At, HttpLayer, Layer, Problem, QuotaLayer, Slot, Val};
use super::{
    Config, CreatorConfig, DeletionConfig, HttpConfig, LeaderElectionConfig, LogFormat,
    LoggingConfig, MAX_DURATION, NamespacePolicyConfig, PolicyConfig, QuotaConfig, SelectorConfig,
    deletion_interval,
};
use crate::contract::labels;
use crate::decide::facts::MAX_KEEP_FAILED;

impl Layer {
    /// Turns raw values into typed ones, falling back to [`Config::default`] for unset keys.
    pub(super) fn resolve(self) -> Result<Config, Problem> {
        let d = Config::default();
        let Layer {
            selector: sel,
            policy: pol,
            deletion: del,
            leader_election: le,
            http,
            logging: log,
            creator: cr,
            quota,
            namespace_policy: nsp,
        } = self;

        let label_selector = take(
            sel.label_selector,
            "selector.label_selector",
            d.selector.label_selector,
            tracking_selector,
        )?;
        let namespaces = take(
            sel.namespaces,
            "selector.namespaces",
            d.selector.namespaces,
            namespace_list,
        )?;
        let exclude_namespaces = take(
            sel.exclude_namespaces,
            "selector.exclude_namespaces",
            d.selector.exclude_namespaces,
            namespace_list,
        )?;
        let overlap = (namespaces.value.iter()).find(|ns| exclude_namespaces.value.contains(ns));
        if let Some(ns) = overlap {
            let (key, at) = blame(
                ("selector.exclude_namespaces", &exclude_namespaces.at),
                ("selector.namespaces", &namespaces.at),
            );
            let message = format!(
                "namespace {ns:?} is both in selector.namespaces and in \
                 selector.exclude_namespaces; expected each namespace in at most one of them"
            );
            return Err(problem(key, at, message));
        }

        let ttl_after_finished = take(
            pol.ttl_after_finished,
            "policy.ttl_after_finished",
            d.policy.ttl_after_finished,
            duration,
        )?;
        let ttl_after_failed = take(
            pol.ttl_after_failed,
            "policy.ttl_after_failed",
            d.policy.ttl_after_failed,
            optional_duration,
        )?;
        // Zero would delete claims the operator has just created for a build about to start.
        let orphan_grace = take(
            pol.orphan_grace,
            "policy.orphan_grace",
            d.policy.orphan_grace,
            positive_duration,
        )?;
        let max_age = take(
            pol.max_age,
            "policy.max_age",
            d.policy.max_age,
            positive_duration,
        )?;
        if max_age.value < orphan_grace.value {
            let (key, at) = blame(
                ("policy.max_age", &max_age.at),
                ("policy.orphan_grace", &orphan_grace.at),
            );
            let message = format!(
                "policy.max_age ({}) is shorter than policy.orphan_grace ({}); expected max_age \
                 at least orphan_grace, which protects every claim younger than it",
                humantime::format_duration(max_age.value),
                humantime::format_duration(orphan_grace.value),
            );
            return Err(problem(key, at, message));
        }

        let dry_run = take(del.dry_run, "deletion.dry_run", d.deletion.dry_run, Ok)?;
        let server_side_dry_run = take(
            del.server_side_dry_run,
            "deletion.server_side_dry_run",
            d.deletion.server_side_dry_run,
            Ok,
        )?;
        // Refused rather than guessed: asking for a server-side dry run must never delete.
        if server_side_dry_run.value && !dry_run.value {
            let (key, at) = blame(
                ("deletion.server_side_dry_run", &server_side_dry_run.at),
                ("deletion.dry_run", &dry_run.at),
            );
            let message = "deletion.server_side_dry_run is true but deletion.dry_run is false; \
                           expected dry_run = true as well (a server-side dry run is a dry run)";
            return Err(problem(key, at, message));
        }
        let read_volumes = take(
            del.read_volumes,
            "deletion.read_volumes",
            d.deletion.read_volumes,
            Ok,
        )?;
        let released_volume_ttl = take(
            del.released_volume_ttl,
            "deletion.released_volume_ttl",
            d.deletion.released_volume_ttl,
            optional_positive_duration,
        )?;
        // Only a volume read before its claim's delete is marked, and only a marked one is
        // ever deleted: without the read, the TTL could never apply.
        if released_volume_ttl.value.is_some() && !read_volumes.value {
            let (key, at) = blame(
                ("deletion.released_volume_ttl", &released_volume_ttl.at),
                ("deletion.read_volumes", &read_volumes.at),
            );
            let message = "deletion.released_volume_ttl is set but deletion.read_volumes is \
                           false; expected read_volumes = true as well (a volume is marked for \
                           deletion when it is read, before its claim is deleted)";
            return Err(problem(key, at, message));
        }
        let deletes_per_second = take(
            del.deletes_per_second,
            "deletion.deletes_per_second",
            d.deletion.deletes_per_second,
            positive_rate,
        )?;
        let max_deletions_per_window = take(
            del.max_deletions_per_window,
            "deletion.max_deletions_per_window",
            d.deletion.max_deletions_per_window,
            positive_cap,
        )?;
        let window = take(
            del.window,
            "deletion.window",
            d.deletion.window,
            positive_duration,
        )?;

        let enabled = take(
            le.enabled,
            "leader_election.enabled",
            d.leader_election.enabled,
            Ok,
        )?;
        let lease_name = take(
            le.lease_name,
            "leader_election.lease_name",
            d.leader_election.lease_name,
            subdomain_name,
        )?;
        let lease_namespace = take(
            le.lease_namespace,
            "leader_election.lease_namespace",
            d.leader_election.lease_namespace,
            optional_namespace,
        )?;
        let lease_duration = take(
            le.lease_duration,
            "leader_election.lease_duration",
            d.leader_election.lease_duration,
            lease_seconds,
        )?;

        let HttpLayer {
            listen,
            secure_listen,
            tls_cert_file,
            tls_key_file,
        } = http;
        let listen = take(listen, "http.listen", d.http.listen, socket_address)?;
        let secure = resolve_secure_metrics([secure_listen, tls_cert_file, tls_key_file])?;
        let format = take(log.format, "logging.format", d.logging.format, log_format)?;
        let level = take(log.level, "logging.level", d.logging.level, log_filter)?;

        let storage = take(cr.storage, "creator.storage", d.creator.storage, |raw| {
            raw.parse()
        })?;
        let storage_class = take(
            cr.storage_class,
            "creator.storage_class",
            d.creator.storage_class,
            optional_storage_class,
        )?;
        let labels = take(
            cr.labels,
            "creator.labels",
            d.creator.labels,
            creator_labels,
        )?;
        let annotations = take(
            cr.annotations,
            "creator.annotations",
            d.creator.annotations,
            annotation_map,
        )?;

        let quota = resolve_quota(quota, d.quota)?;
        let namespace_policy = NamespacePolicyConfig {
            enabled: take(
                nsp.enabled,
                "namespace_policy.enabled",
                d.namespace_policy.enabled,
                Ok,
            )?
            .value,
            may_shorten: take(
                nsp.may_shorten,
                "namespace_policy.may_shorten",
                d.namespace_policy.may_shorten,
                Ok,
            )?
            .value,
            min_ttl: take(
                nsp.min_ttl,
                "namespace_policy.min_ttl",
                d.namespace_policy.min_ttl,
                positive_duration,
            )?
            .value,
        };

        Ok(Config {
            selector: SelectorConfig {
                label_selector: label_selector.value,
                namespaces: namespaces.value,
                exclude_namespaces: exclude_namespaces.value,
            },
            policy: PolicyConfig {
                ttl_after_finished: ttl_after_finished.value,
                ttl_after_failed: ttl_after_failed.value,
                orphan_grace: orphan_grace.value,
                max_age: max_age.value,
                keep_failed: take(
                    pol.keep_failed,
                    "policy.keep_failed",
                    d.policy.keep_failed,
                    keep_count,
                )?
                .value,
            },
            deletion: DeletionConfig {
                dry_run: dry_run.value,
                server_side_dry_run: server_side_dry_run.value,
                deletes_per_second: deletes_per_second.value,
                max_deletions_per_window: max_deletions_per_window.value,
                window: window.value,
                notice_before: take(
                    del.notice_before,
                    "deletion.notice_before",
                    d.deletion.notice_before,
                    optional_positive_duration,
                )?
                .value,
                read_volumes: read_volumes.value,
                released_volume_ttl: released_volume_ttl.value,
                proof_round_interval: take(
                    del.proof_round_interval,
                    "deletion.proof_round_interval",
                    d.deletion.proof_round_interval,
                    round_interval,
                )?
                .value,
            },
            leader_election: LeaderElectionConfig {
                enabled: enabled.value,
                lease_name: lease_name.value,
                lease_namespace: lease_namespace.value,
                lease_duration: lease_duration.value,
            },
            http: HttpConfig {
                listen: listen.value,
                ..secure
            },
            logging: LoggingConfig {
                format: format.value,
                level: level.value,
            },
            creator: CreatorConfig {
                storage: storage.value,
                storage_class: storage_class.value,
                labels: labels.value,
                annotations: annotations.value,
            },
            quota,
            namespace_policy,
        })
    }
}

/// The `[quota]` section: each water a fraction in (0, 1], and low water below high water, or
/// pressure would delete without ever reaching its goal.
fn resolve_quota(layer: QuotaLayer, d: QuotaConfig) -> Result<QuotaConfig, Problem> {
    let enabled = take(layer.enabled, "quota.enabled", d.enabled, Ok)?;
    let high = take(layer.high_water, "quota.high_water", d.high_water, fraction)?;
    let low = take(layer.low_water, "quota.low_water", d.low_water, fraction)?;
    if low.value >= high.value {
        let (key, at) = blame(("quota.low_water", &low.at), ("quota.high_water", &high.at));
        let message = format!(
            "quota.low_water ({}) is not below quota.high_water ({}); expected \
             0 < low_water < high_water <= 1",
            low.value, high.value
        );
        return Err(problem(key, at, message));
    }
    Ok(QuotaConfig {
        enabled: enabled.value,
        high_water: high.value,
        low_water: low.value,
    })
}

/// The HTTPS metrics keys: an address and both files, or none of them ("" is none).
fn resolve_secure_metrics(
    [secure_listen, tls_cert_file, tls_key_file]: [Slot<String>; 3],
) -> Result<HttpConfig, Problem> {
    let optional = |raw: String| Ok((!raw.is_empty()).then_some(raw));
    let listen = take(secure_listen, "http.secure_listen", None, |raw| {
        optional(raw)?.map(socket_address).transpose()
    })?;
    let cert = take(tls_cert_file, "http.tls_cert_file", None, optional)?;
    let key = take(tls_key_file, "http.tls_key_file", None, optional)?;
    for (name, file) in [("http.tls_cert_file", &cert), ("http.tls_key_file", &key)] {
        if listen.value.is_some() != file.value.is_some() {
            let (blamed, at) = blame((name, &file.at), ("http.secure_listen", &listen.at));
            let message = format!(
                "http.secure_listen, http.tls_cert_file and http.tls_key_file are set together \
                 or not at all; {name} is {}",
                if file.value.is_some() { "set" } else { "empty" }
            );
            return Err(problem(blamed, at, message));
        }
    }
    Ok(HttpConfig {
        secure_listen: listen.value,
        tls_cert_file: cert.value.map(PathBuf::from),
        tls_key_file: key.value.map(PathBuf::from),
        ..Config::default().http
    })
}

/// Converts a raw value with `parse`, or takes the default; either way keeps the origin.
fn take<R, T>(
    slot: Slot<R>,
    key: &'static str,
    default: T,
    parse: impl FnOnce(R) -> Result<T, String>,
) -> Result<Val<T>, Problem> {
    match slot {
        None => Ok(Val {
            value: default,
            at: At::Default,
        }),
        Some(Val { value, at }) => match parse(value) {
            Ok(value) => Ok(Val { value, at }),
            Err(message) => Err(problem(key, &at, message)),
        },
    }
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

fn duration(raw: String) -> Result<Duration, String> {
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
fn optional_duration(raw: String) -> Result<Option<Duration>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    duration(raw).map(Some)
}

/// Empty: off.
fn optional_positive_duration(raw: String) -> Result<Option<Duration>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    positive_duration(raw).map(Some)
}

fn positive_duration(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d.is_zero() {
        return Err(format!("{raw:?} must be greater than zero"));
    }
    Ok(d)
}

/// Zero allowed (a round for every re-check that finds none waiting); at most a minute, which
/// would already hold each due claim that long.
fn round_interval(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d > Duration::from_secs(60) {
        return Err(format!("{raw:?} is too long; expected at most 1m"));
    }
    Ok(d)
}

/// The Lease API counts whole seconds, and the renew deadline derived from it must be shorter.
fn lease_seconds(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d.subsec_nanos() != 0 || !(2..=3600).contains(&d.as_secs()) {
        return Err(format!(
            "{raw:?} must be a whole number of seconds from 2s to 1h"
        ));
    }
    Ok(d)
}

fn positive_rate(rate: f64) -> Result<f64, String> {
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
fn fraction(value: f64) -> Result<f64, String> {
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
fn keep_count(keep: u32) -> Result<u32, String> {
    if keep > MAX_KEEP_FAILED {
        return Err(format!(
            "{keep} is too many; expected at most {MAX_KEEP_FAILED} failed builds per namespace (0 turns keeping by count off)"
        ));
    }
    Ok(keep)
}

fn positive_cap(cap: u32) -> Result<u32, String> {
    match cap {
        0 => Err("0 must be at least 1; to delete nothing, set deletion.dry_run".to_owned()),
        cap => Ok(cap),
    }
}

/// A valid label selector that requires some label to be present: anything broader reaches
/// claims the operator never created.
fn tracking_selector(raw: String) -> Result<LabelSelector, String> {
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

fn namespace_list(list: Vec<String>) -> Result<Vec<String>, String> {
    for ns in &list {
        dns1123_label(ns).map_err(|why| format!("{ns:?} is not a valid namespace name: {why}"))?;
    }
    Ok(list)
}

/// Empty means "the pod's namespace".
fn optional_namespace(ns: String) -> Result<Option<String>, String> {
    if ns.is_empty() {
        return Ok(None);
    }
    dns1123_label(&ns).map_err(|why| format!("{ns:?} is not a valid namespace name: {why}"))?;
    Ok(Some(ns))
}

fn subdomain_name(name: String) -> Result<String, String> {
    dns1123_subdomain(&name).map_err(|why| format!("{name:?} is not a valid Lease name: {why}"))?;
    Ok(name)
}

/// Empty means "the cluster's default class".
fn optional_storage_class(class: String) -> Result<Option<String>, String> {
    if class.is_empty() {
        return Ok(None);
    }
    dns1123_subdomain(&class)
        .map_err(|why| format!("{class:?} is not a valid storage class name: {why}"))?;
    Ok(Some(class))
}

fn socket_address(raw: String) -> Result<SocketAddr, String> {
    raw.parse().map_err(|_| {
        format!(
            "{raw:?} is not a socket address; expected IP:PORT, \
             e.g. \"0.0.0.0:8080\" or \"[::]:8080\""
        )
    })
}

fn log_format(raw: String) -> Result<LogFormat, String> {
    match raw.as_str() {
        "human" => Ok(LogFormat::Human),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!(
            "{raw:?} is not a log format; expected \"human\" or \"json\""
        )),
    }
}

fn log_filter(raw: String) -> Result<String, String> {
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
fn creator_labels(labels: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
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
fn annotation_map(map: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    for key in map.keys() {
        label_key(key).map_err(|why| format!("{key:?} is not a valid annotation key: {why}"))?;
    }
    Ok(map)
}
