//! Configuration: `config.toml`, then `WORKSPACE_GC_<SECTION>_<KEY>` environment variables, then
//! command-line flags, each layer overriding the one before.
//!
//! Loading runs in two stages. The layers are first read into a raw `Layer` that mirrors the
//! file's shape and remembers where each value came from (a byte span in the file, a variable,
//! a flag); then `Layer::resolve` turns raw values into typed ones and checks them, so every
//! rejection names the key and points at the value's origin, a file line included.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use toml::de::{DeTable, DeValue};

pub use crate::labels::LabelSelector;
use crate::labels::{dns1123_label, dns1123_subdomain, label_key, label_value};
use crate::policy::Policy;
pub use crate::quantity::Quantity;
use crate::quota::Waters;

/// Process exit code for an invalid configuration (or command line): nothing is started.
pub const EXIT_CONFIG: i32 = 2;

/// The prefix of every environment variable that sets a configuration key.
const ENV_PREFIX: &str = "WORKSPACE_GC_";

/// Names the configuration file; read by the command line, not a configuration key.
pub const ENV_CONFIG_FILE: &str = "WORKSPACE_GC_CONFIG";

/// Durations beyond this are typos, and would overflow timestamp arithmetic in the policy.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub selector: SelectorConfig,
    pub policy: PolicyConfig,
    pub deletion: DeletionConfig,
    pub leader_election: LeaderElectionConfig,
    pub http: HttpConfig,
    pub logging: LoggingConfig,
    pub creator: CreatorConfig,
    pub quota: QuotaConfig,
}

/// Which claims are tracked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectorConfig {
    /// Sent as the `labelSelector` of every claim list and watch.
    pub label_selector: LabelSelector,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Namespaces never touched, even when `namespaces` is empty.
    pub exclude_namespaces: Vec<String>,
}

impl SelectorConfig {
    /// Whether claims in `namespace` are tracked.
    pub fn includes_namespace(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && !self.exclude_namespaces.iter().any(|n| n == namespace)
    }
}

/// The policy's durations, as configured; see [`Config::policy`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyConfig {
    #[serde(serialize_with = "serialize_duration")]
    pub ttl_after_finished: Duration,
    #[serde(serialize_with = "serialize_duration")]
    pub orphan_grace: Duration,
    #[serde(serialize_with = "serialize_duration")]
    pub max_age: Duration,
}

/// How deletions are sent and throttled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeletionConfig {
    /// Decide, log, count and emit events, but delete nothing.
    pub dry_run: bool,
    /// In dry-run, still send each delete with `dryRun=All` so RBAC and admission run.
    pub server_side_dry_run: bool,
    /// Always paced: validation refuses a rate whose [`deletion_interval`] is not representable.
    pub deletes_per_second: f64,
    /// At most this many deletions in any rolling `window`.
    pub max_deletions_per_window: u32,
    #[serde(serialize_with = "serialize_duration")]
    pub window: Duration,
}

/// Lease-based leader election; only the leader deletes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaderElectionConfig {
    pub enabled: bool,
    pub lease_name: String,
    /// `None`: the pod's own namespace; see [`LeaderElectionConfig::lease_namespace`].
    #[serde(serialize_with = "serialize_or_empty")]
    pub lease_namespace: Option<String>,
    /// A whole number of seconds, as the Lease API counts.
    #[serde(serialize_with = "serialize_duration")]
    pub lease_duration: Duration,
}

impl LeaderElectionConfig {
    /// The Lease's namespace: the configured one, else the pod's (`POD_NAMESPACE`, passed in by
    /// the caller so this stays pure), else `workspace-gc`.
    pub fn lease_namespace<'a>(&'a self, pod_namespace: Option<&'a str>) -> &'a str {
        self.lease_namespace
            .as_deref()
            .or(pod_namespace.filter(|ns| !ns.is_empty()))
            .unwrap_or("workspace-gc")
    }
}

/// The metrics and health endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HttpConfig {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing_subscriber::EnvFilter` directive string, checked to parse.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

impl LogFormat {
    fn as_str(self) -> &'static str {
        match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        }
    }
}

/// What `workspace-gc create` puts on a new claim besides its fixed labels and owner.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CreatorConfig {
    pub storage: Quantity,
    /// `None`: the cluster's default storage class.
    #[serde(serialize_with = "serialize_or_empty")]
    pub storage_class: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Quota pressure: finished workspaces deleted before their TTL while a namespace's storage
/// quota is nearly exhausted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaConfig {
    pub enabled: bool,
    /// A namespace is under pressure once a quota's used / hard reaches this.
    pub high_water: f64,
    /// Under pressure, claims are deleted until used / hard is projected at or below this.
    pub low_water: f64,
}

impl QuotaConfig {
    /// The thresholds, when quota pressure is enabled.
    pub fn waters(&self) -> Option<Waters> {
        self.enabled.then_some(Waters {
            high: self.high_water,
            low: self.low_water,
        })
    }
}

impl Default for Config {
    /// Exactly what the shipped `config.toml` says (a test holds them together).
    fn default() -> Self {
        Self {
            selector: SelectorConfig {
                label_selector: LabelSelector::equals("mlops.redhat.com/build-workspace", "true"),
                namespaces: Vec::new(),
                exclude_namespaces: Vec::new(),
            },
            policy: PolicyConfig {
                ttl_after_finished: Duration::from_secs(60 * 60),
                orphan_grace: Duration::from_secs(10 * 60),
                max_age: Duration::from_secs(7 * 24 * 60 * 60),
            },
            deletion: DeletionConfig {
                dry_run: false,
                server_side_dry_run: false,
                deletes_per_second: 5.0,
                max_deletions_per_window: 100,
                window: Duration::from_secs(10 * 60),
            },
            leader_election: LeaderElectionConfig {
                enabled: true,
                lease_name: "workspace-gc".to_owned(),
                lease_namespace: None,
                lease_duration: Duration::from_secs(15),
            },
            http: HttpConfig {
                listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            },
            logging: LoggingConfig {
                format: LogFormat::Human,
                level: "info".to_owned(),
            },
            creator: CreatorConfig {
                storage: Quantity::gibibytes(1),
                storage_class: None,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
            quota: QuotaConfig {
                enabled: true,
                high_water: 0.9,
                low_water: 0.8,
            },
        }
    }
}

impl Config {
    /// Reads `file` (if any), then applies `env` (the process environment; variables without the
    /// `WORKSPACE_GC_` prefix are ignored) and the command-line `overrides`, and validates the
    /// result. Without a file, the defaults stand in for it.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let text = file
            .map(|path| {
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })
            })
            .transpose()?;
        Self::parse(file.zip(text.as_deref()), env, overrides)
    }

    /// [`Config::load`] with the file's contents already read: `(path for messages, text)`.
    pub fn parse(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut layer = match file {
            Some((path, text)) => Layer::from_toml(path, text)?,
            None => Layer::default(),
        };
        layer.apply_env(env)?;
        layer.apply_overrides(overrides);
        layer.resolve().map_err(|problem| problem.into_error(file))
    }

    /// How this configuration lets more be deleted than `base` (the file alone): one line per
    /// widening, for a warning at start. Overrides may change anything, but never silently
    /// widen what can be deleted.
    pub fn widenings(&self, base: &Config) -> Vec<String> {
        let mut found = Vec::new();
        let mut say = |key: &str, from: String, to: String| {
            found.push(format!(
                "{key} is overridden from {from} to {to}: more claims may be deleted"
            ));
        };
        let (sel, was) = (&self.selector, &base.selector);
        if sel.label_selector != was.label_selector {
            let (to, from) = (
                sel.label_selector.to_string(),
                was.label_selector.to_string(),
            );
            say(
                "selector.label_selector",
                format!("{from:?}"),
                format!("{to:?}"),
            );
        }
        let scope = |namespaces: &[String]| match namespaces {
            [] => "all namespaces".to_owned(),
            list => format!("{list:?}"),
        };
        let narrower = !was.namespaces.is_empty()
            && (sel.namespaces.is_empty()
                || sel.namespaces.iter().any(|ns| !was.namespaces.contains(ns)));
        if narrower {
            let (from, to) = (scope(&was.namespaces), scope(&sel.namespaces));
            say("selector.namespaces", from, to);
        }
        let human = |d: Duration| humantime::format_duration(d).to_string();
        let (pol, was) = (&self.policy, &base.policy);
        for (key, to, from) in [
            (
                "policy.ttl_after_finished",
                pol.ttl_after_finished,
                was.ttl_after_finished,
            ),
            ("policy.orphan_grace", pol.orphan_grace, was.orphan_grace),
            ("policy.max_age", pol.max_age, was.max_age),
        ] {
            if to < from {
                say(key, human(from), human(to));
            }
        }
        let (del, was) = (&self.deletion, &base.deletion);
        if was.dry_run && !del.dry_run {
            say("deletion.dry_run", "true".into(), "false".into());
        }
        if del.deletes_per_second > was.deletes_per_second {
            let (from, to) = (was.deletes_per_second, del.deletes_per_second);
            say(
                "deletion.deletes_per_second",
                from.to_string(),
                to.to_string(),
            );
        }
        if del.max_deletions_per_window > was.max_deletions_per_window || del.window < was.window {
            let cap = |d: &DeletionConfig| {
                format!("{} per {}", d.max_deletions_per_window, human(d.window))
            };
            say("deletion.max_deletions_per_window", cap(was), cap(del));
        }
        let (quota, was) = (&self.quota, &base.quota);
        if quota.enabled && !was.enabled {
            say("quota.enabled", "false".into(), "true".into());
        }
        if quota.enabled {
            for (key, to, from) in [
                ("quota.high_water", quota.high_water, was.high_water),
                ("quota.low_water", quota.low_water, was.low_water),
            ] {
                if to < from {
                    say(key, from.to_string(), to.to_string());
                }
            }
        }
        found
    }

    /// The policy the decision core applies.
    pub fn policy(&self) -> Policy {
        // MAX_DURATION keeps every duration within chrono's range, so the fallback never applies.
        let chrono = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        Policy {
            ttl_after_finished: chrono(self.policy.ttl_after_finished),
            orphan_grace: chrono(self.policy.orphan_grace),
            max_age: chrono(self.policy.max_age),
        }
    }
}

/// Configuration values given on the command line; `None` leaves the key as the file and the
/// environment set it. Built by [`crate::cli::Cli::overrides`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
    pub dry_run: Option<bool>,
    pub server_side_dry_run: Option<bool>,
    pub listen: Option<SocketAddr>,
    pub namespaces: Option<Vec<String>>,
    pub exclude_namespaces: Option<Vec<String>>,
    pub leader_election: Option<bool>,
    pub lease_namespace: Option<String>,
}

/// A rejected configuration. Each message names where the value came from, the key, what was
/// wrong and what is expected, e.g. `config.toml:12: policy.max_age: "0s" must be greater than zero`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read the configuration file: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: not valid TOML: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{location}: {key}: {message}")]
    Invalid {
        location: Location,
        key: String,
        message: String,
    },
    #[error(
        "${var}: unknown environment variable; expected WORKSPACE_GC_<SECTION>_<KEY> for a key of \
         config.toml (e.g. WORKSPACE_GC_POLICY_MAX_AGE), or WORKSPACE_GC_CONFIG"
    )]
    UnknownEnv { var: String },
}

/// Where a rejected value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    File { path: PathBuf, line: usize },
    Env { var: String },
    Flag { flag: &'static str },
    Default,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File { path, line } => write!(f, "{}:{line}", path.display()),
            Location::Env { var } => write!(f, "${var}"),
            Location::Flag { flag } => f.write_str(flag),
            Location::Default => f.write_str("default"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layers

/// Where a raw value came from.
#[derive(Debug, Clone)]
enum At {
    Default,
    File(Range<usize>),
    Env(String),
    Flag(&'static str),
}

impl At {
    /// Precedence: a later layer overrides an earlier one.
    fn rank(&self) -> u8 {
        match self {
            At::Default => 0,
            At::File(_) => 1,
            At::Env(_) => 2,
            At::Flag(_) => 3,
        }
    }
}

/// A value and its origin.
struct Val<T> {
    value: T,
    at: At,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Val<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = toml::Spanned::<T>::deserialize(deserializer)?;
        Ok(Val {
            at: At::File(spanned.span()),
            value: spanned.into_inner(),
        })
    }
}

type Slot<T> = Option<Val<T>>;

/// The configuration's shape with raw values; `None` where a layer leaves a key unset.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Layer {
    selector: SelectorLayer,
    policy: PolicyLayer,
    deletion: DeletionLayer,
    leader_election: LeaderElectionLayer,
    http: HttpLayer,
    logging: LoggingLayer,
    creator: CreatorLayer,
    quota: QuotaLayer,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SelectorLayer {
    label_selector: Slot<String>,
    namespaces: Slot<Vec<String>>,
    exclude_namespaces: Slot<Vec<String>>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PolicyLayer {
    ttl_after_finished: Slot<String>,
    orphan_grace: Slot<String>,
    max_age: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DeletionLayer {
    dry_run: Slot<bool>,
    server_side_dry_run: Slot<bool>,
    deletes_per_second: Slot<f64>,
    max_deletions_per_window: Slot<u32>,
    window: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LeaderElectionLayer {
    enabled: Slot<bool>,
    lease_name: Slot<String>,
    lease_namespace: Slot<String>,
    lease_duration: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct HttpLayer {
    listen: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LoggingLayer {
    format: Slot<String>,
    level: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CreatorLayer {
    storage: Slot<String>,
    storage_class: Slot<String>,
    labels: Slot<BTreeMap<String, String>>,
    annotations: Slot<BTreeMap<String, String>>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct QuotaLayer {
    enabled: Slot<bool>,
    high_water: Slot<f64>,
    low_water: Slot<f64>,
}

/// The file's sections, for splitting `WORKSPACE_GC_LEADER_ELECTION_LEASE_NAME` and the like
/// where underscores separate words as well as section from key.
const SECTIONS: [&str; 8] = [
    "selector",
    "policy",
    "deletion",
    "leader_election",
    "http",
    "logging",
    "creator",
    "quota",
];

/// A rejected value, before its origin is turned into a [`Location`].
struct Problem {
    key: &'static str,
    at: At,
    message: String,
}

impl Problem {
    fn into_error(self, file: Option<(&Path, &str)>) -> ConfigError {
        let location = match (self.at, file) {
            (At::File(span), Some((path, text))) => Location::File {
                path: path.to_owned(),
                line: line_of(text, span.start),
            },
            (At::Env(var), _) => Location::Env { var },
            (At::Flag(flag), _) => Location::Flag { flag },
            (At::Default | At::File(_), _) => Location::Default,
        };
        ConfigError::Invalid {
            location,
            key: self.key.to_owned(),
            message: self.message,
        }
    }
}

/// The 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The dotted key path of the innermost key or value whose span holds `offset`.
fn key_at(table: &DeTable<'_>, offset: usize) -> Option<String> {
    let holds = |span: Range<usize>| span.contains(&offset);
    table.iter().find_map(|(key, value)| {
        let inner = match value.get_ref() {
            // A `[section]` header's span is the header alone, so always look inside.
            DeValue::Table(inner) => key_at(inner, offset),
            _ => None,
        };
        match inner {
            Some(path) => Some(format!("{}.{path}", key.get_ref())),
            None if holds(key.span()) || holds(value.span()) => Some(key.get_ref().to_string()),
            None => None,
        }
    })
}

/// Exclusions only ever add up: a later layer (environment, flags) adds its namespaces to
/// those the earlier ones excluded, so no override can make an excluded namespace collectable.
fn exclude(slot: &mut Slot<Vec<String>>, list: Vec<String>, at: At) {
    let mut value = slot.take().map(|earlier| earlier.value).unwrap_or_default();
    for namespace in list {
        if !value.contains(&namespace) {
            value.push(namespace);
        }
    }
    *slot = Some(Val { value, at });
}

impl Layer {
    fn from_toml(path: &Path, text: &str) -> Result<Layer, ConfigError> {
        let syntax = |error: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            line: line_of(text, error.span().map_or(0, |span| span.start)),
            message: error.message().to_owned(),
        };
        let table = DeTable::parse(text).map_err(syntax)?;
        let deserializer = toml::de::Deserializer::parse(text).map_err(syntax)?;
        Layer::deserialize(deserializer).map_err(|error| {
            let offset = error.span().map_or(0, |span| span.start);
            match key_at(table.get_ref(), offset) {
                Some(key) => ConfigError::Invalid {
                    location: Location::File {
                        path: path.to_owned(),
                        line: line_of(text, offset),
                    },
                    key,
                    message: error.message().to_owned(),
                },
                None => syntax(error),
            }
        })
    }

    fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (var, raw) in env {
            let Some(suffix) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            if var == ENV_CONFIG_FILE {
                continue;
            }
            // Only the exact upper-case spelling of a key; anything else is a typo to report.
            let key = SECTIONS.iter().find_map(|section| {
                let rest = suffix
                    .strip_prefix(&*section.to_uppercase())?
                    .strip_prefix('_')?;
                let upper = rest.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
                upper.then(|| format!("{section}.{}", rest.to_ascii_lowercase()))
            });
            let unknown = || ConfigError::UnknownEnv { var: var.clone() };
            let key = key.ok_or_else(unknown)?;
            let at = At::Env(var.clone());
            match self.set(&key, &raw, at) {
                Some(Ok(())) => {}
                Some(Err(message)) => {
                    return Err(ConfigError::Invalid {
                        location: Location::Env { var },
                        key,
                        message,
                    });
                }
                None => return Err(unknown()),
            }
        }
        Ok(())
    }

    /// Sets `key` from an environment value; `None` if there is no such key.
    fn set(&mut self, key: &str, raw: &str, at: At) -> Option<Result<(), String>> {
        fn put<T: FromEnv>(slot: &mut Slot<T>, raw: &str, at: At) -> Result<(), String> {
            *slot = Some(Val {
                value: T::from_env(raw)?,
                at,
            });
            Ok(())
        }
        let Layer {
            selector: s,
            policy: p,
            deletion: d,
            leader_election: l,
            http: h,
            logging: g,
            creator: c,
            quota: q,
        } = self;
        Some(match key {
            "selector.label_selector" => put(&mut s.label_selector, raw, at),
            "selector.namespaces" => put(&mut s.namespaces, raw, at),
            "selector.exclude_namespaces" => {
                Vec::from_env(raw).map(|list| exclude(&mut s.exclude_namespaces, list, at))
            }
            "policy.ttl_after_finished" => put(&mut p.ttl_after_finished, raw, at),
            "policy.orphan_grace" => put(&mut p.orphan_grace, raw, at),
            "policy.max_age" => put(&mut p.max_age, raw, at),
            "deletion.dry_run" => put(&mut d.dry_run, raw, at),
            "deletion.server_side_dry_run" => put(&mut d.server_side_dry_run, raw, at),
            "deletion.deletes_per_second" => put(&mut d.deletes_per_second, raw, at),
            "deletion.max_deletions_per_window" => put(&mut d.max_deletions_per_window, raw, at),
            "deletion.window" => put(&mut d.window, raw, at),
            "leader_election.enabled" => put(&mut l.enabled, raw, at),
            "leader_election.lease_name" => put(&mut l.lease_name, raw, at),
            "leader_election.lease_namespace" => put(&mut l.lease_namespace, raw, at),
            "leader_election.lease_duration" => put(&mut l.lease_duration, raw, at),
            "http.listen" => put(&mut h.listen, raw, at),
            "logging.format" => put(&mut g.format, raw, at),
            "logging.level" => put(&mut g.level, raw, at),
            "creator.storage" => put(&mut c.storage, raw, at),
            "creator.storage_class" => put(&mut c.storage_class, raw, at),
            "creator.labels" => put(&mut c.labels, raw, at),
            "creator.annotations" => put(&mut c.annotations, raw, at),
            "quota.enabled" => put(&mut q.enabled, raw, at),
            "quota.high_water" => put(&mut q.high_water, raw, at),
            "quota.low_water" => put(&mut q.low_water, raw, at),
            _ => return None,
        })
    }

    fn apply_overrides(&mut self, overrides: &Overrides) {
        fn put<T>(slot: &mut Slot<T>, value: Option<T>, flag: &'static str) {
            if let Some(value) = value {
                *slot = Some(Val {
                    value,
                    at: At::Flag(flag),
                });
            }
        }
        // Destructured so that a new override cannot be forgotten here.
        let Overrides {
            log_format,
            log_level,
            dry_run,
            server_side_dry_run,
            listen,
            namespaces,
            exclude_namespaces,
            leader_election,
            lease_namespace,
        } = overrides.clone();
        put(
            &mut self.logging.format,
            log_format.map(|f| f.as_str().to_owned()),
            "--log-format",
        );
        put(&mut self.logging.level, log_level, "--log-level");
        put(&mut self.deletion.dry_run, dry_run, "--dry-run");
        put(
            &mut self.deletion.server_side_dry_run,
            server_side_dry_run,
            "--server-side-dry-run",
        );
        put(
            &mut self.http.listen,
            listen.map(|a| a.to_string()),
            "--listen",
        );
        put(&mut self.selector.namespaces, namespaces, "--namespace");
        if let Some(list) = exclude_namespaces {
            let at = At::Flag("--exclude-namespace");
            exclude(&mut self.selector.exclude_namespaces, list, at);
        }
        put(
            &mut self.leader_election.enabled,
            leader_election,
            "--no-leader-election",
        );
        put(
            &mut self.leader_election.lease_namespace,
            lease_namespace,
            "--lease-namespace",
        );
    }

    /// Turns raw values into typed ones, falling back to [`Config::default`] for unset keys.
    fn resolve(self) -> Result<Config, Problem> {
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

        let listen = take(http.listen, "http.listen", d.http.listen, socket_address)?;
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

        Ok(Config {
            selector: SelectorConfig {
                label_selector: label_selector.value,
                namespaces: namespaces.value,
                exclude_namespaces: exclude_namespaces.value,
            },
            policy: PolicyConfig {
                ttl_after_finished: ttl_after_finished.value,
                orphan_grace: orphan_grace.value,
                max_age: max_age.value,
            },
            deletion: DeletionConfig {
                dry_run: dry_run.value,
                server_side_dry_run: server_side_dry_run.value,
                deletes_per_second: deletes_per_second.value,
                max_deletions_per_window: max_deletions_per_window.value,
                window: window.value,
            },
            leader_election: LeaderElectionConfig {
                enabled: enabled.value,
                lease_name: lease_name.value,
                lease_namespace: lease_namespace.value,
                lease_duration: lease_duration.value,
            },
            http: HttpConfig {
                listen: listen.value,
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

/// Conversion of an environment variable's text into a raw value.
trait FromEnv: Sized {
    fn from_env(raw: &str) -> Result<Self, String>;
}

impl FromEnv for String {
    fn from_env(raw: &str) -> Result<Self, String> {
        Ok(raw.to_owned())
    }
}

impl FromEnv for bool {
    fn from_env(raw: &str) -> Result<Self, String> {
        raw.parse()
            .map_err(|_| format!("{raw:?} is not a boolean; expected \"true\" or \"false\""))
    }
}

impl FromEnv for f64 {
    fn from_env(raw: &str) -> Result<Self, String> {
        raw.parse()
            .map_err(|_| format!("{raw:?} is not a number; expected e.g. \"5\" or \"0.5\""))
    }
}

impl FromEnv for u32 {
    fn from_env(raw: &str) -> Result<Self, String> {
        raw.parse()
            .map_err(|_| format!("{raw:?} is not a whole number; expected e.g. \"100\""))
    }
}

/// A comma-separated list; empty text is the empty list.
impl FromEnv for Vec<String> {
    fn from_env(raw: &str) -> Result<Self, String> {
        if raw.trim().is_empty() {
            return Ok(Vec::new());
        }
        Ok(raw.split(',').map(|item| item.trim().to_owned()).collect())
    }
}

/// Comma-separated `key=value` pairs; empty text is the empty map.
impl FromEnv for BTreeMap<String, String> {
    fn from_env(raw: &str) -> Result<Self, String> {
        Vec::<String>::from_env(raw)?
            .into_iter()
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) => Ok((key.trim().to_owned(), value.trim().to_owned())),
                None => Err(format!(
                    "{pair:?} is not a key=value pair; expected e.g. \"team=ml,tier=build\""
                )),
            })
            .collect()
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

fn positive_duration(raw: String) -> Result<Duration, String> {
    let d = duration(raw.clone())?;
    if d.is_zero() {
        return Err(format!("{raw:?} must be greater than zero"));
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

/// The time between two deletions at `per_second`, or `None` when it is not a positive rate or
/// the interval would exceed [`MAX_DURATION`]. A rate too high for a nanosecond interval
/// rounds to zero: as fast as the API server answers, which is what it asks for.
pub fn deletion_interval(per_second: f64) -> Option<Duration> {
    if !(per_second.is_finite() && per_second > 0.0) {
        return None;
    }
    Duration::try_from_secs_f64(1.0 / per_second)
        .ok()
        .filter(|interval| *interval <= MAX_DURATION)
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
    let fixed = crate::creator::OPERATOR_LABELS
        .iter()
        .map(|(key, _)| *key)
        .chain([crate::creator::JOB_LABEL]);
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

fn serialize_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

fn serialize_or_empty<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_deref().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_forms_parse_to_canonical_text() {
        for (input, canonical) in [
            ("a=b", "a=b"),
            ("a==b", "a=b"),
            (" a = b , c != d ", "a=b,c!=d"),
            ("a=", "a="),
            ("env in (prod, dev)", "env in (dev,prod)"),
            ("env notin (x)", "env notin (x)"),
            ("example.com/x,!y", "example.com/x,!y"),
            ("in in (in)", "in in (in)"),
        ] {
            let parsed: LabelSelector = input.parse().unwrap();
            assert_eq!(parsed.to_string(), canonical, "{input}");
            assert_eq!(canonical.parse::<LabelSelector>().unwrap(), parsed);
        }
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        for input in [
            "",
            " ",
            "a=b,",
            ",a",
            "a b",
            "a in b",
            "a in ()",
            "a in (b",
            "a in (b,)",
            "!a=b",
            "a>1",
            "a<1",
            "-a=b",
            "a=b=c",
            "a=-b",
            "a/b/c",
            "UPPER.com/x",
            "a!",
        ] {
            assert!(
                input.parse::<LabelSelector>().is_err(),
                "{input:?} accepted"
            );
        }
    }

    #[test]
    fn selector_matches_like_the_api_server() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        for (selector, expected) in [
            ("a=1", true),
            ("a=2", false),
            ("a!=2", true),
            ("z!=2", true),
            ("a in (1,3)", true),
            ("z in (1)", false),
            ("a notin (1)", false),
            ("z notin (1)", true),
            ("a", true),
            ("z", false),
            ("!z", true),
            ("!a", false),
            ("a=1,b=2", true),
            ("a=1,b=3", false),
        ] {
            let parsed: LabelSelector = selector.parse().unwrap();
            assert_eq!(parsed.matches(&l), expected, "{selector}");
        }
    }

    #[test]
    fn quantities_convert_to_bytes() {
        for (text, bytes) in [
            ("1Gi", 1 << 30),
            ("500Mi", 500 << 20),
            ("2G", 2_000_000_000),
            ("1.5Gi", 3 << 29),
            ("1e3", 1000),
            ("1E3", 1000),
            ("+5k", 5000),
            ("1500m", 2),
            (".5Ki", 512),
            ("5.", 5),
            ("1m", 1),
        ] {
            assert_eq!(
                text.parse::<Quantity>().map(|q| q.bytes()),
                Ok(bytes),
                "{text}"
            );
        }
        for text in [
            "", "Gi", "1Gb", "1 Gi", "1..5", "-1Gi", "0", "0Gi", "1e", "1e+", "1Ei0", "99999E",
            "1e99",
        ] {
            assert!(text.parse::<Quantity>().is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn names_follow_kubernetes_syntax() {
        assert!(dns1123_label("build-1").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1123_subdomain("fast.ssd-1").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
        assert!(label_key("example.com/Name_1.x").is_ok());
        for bad in [
            "",
            "/a",
            "a/",
            "Example.com/a",
            "a/b/c",
            "_a",
            &"a".repeat(64),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?}");
        }
        assert!(label_value("").is_ok());
        assert!(label_value("a b").is_err());
    }

    #[test]
    fn errors_in_the_file_name_the_dotted_key_and_line() {
        let text = "[policy]\nmax_age = \"1h\"\n\n[deletion]\nwindow = 5\n";
        let table = DeTable::parse(text).unwrap();
        let offset = text.find('5').unwrap();
        assert_eq!(
            key_at(table.get_ref(), offset).as_deref(),
            Some("deletion.window")
        );
        assert_eq!(line_of(text, offset), 5);
        assert_eq!(line_of(text, usize::MAX), 6);
    }

    #[test]
    fn every_flag_override_is_applied() {
        let overrides = Overrides {
            log_format: Some(LogFormat::Json),
            log_level: Some("debug".into()),
            dry_run: Some(true),
            server_side_dry_run: Some(true),
            listen: Some("127.0.0.1:9090".parse().unwrap()),
            namespaces: Some(vec!["a".into()]),
            exclude_namespaces: Some(vec!["b".into()]),
            leader_election: Some(false),
            lease_namespace: Some("gc".into()),
        };
        let c = Config::parse(None, [], &overrides).unwrap();
        assert_eq!(c.logging.format, LogFormat::Json);
        assert_eq!(c.logging.level, "debug");
        assert!(c.deletion.dry_run && c.deletion.server_side_dry_run);
        assert_eq!(c.http.listen.port(), 9090);
        assert_eq!(c.selector.namespaces, ["a"]);
        assert_eq!(c.selector.exclude_namespaces, ["b"]);
        assert!(!c.leader_election.enabled);
        assert_eq!(c.leader_election.lease_namespace.as_deref(), Some("gc"));
    }

    #[test]
    fn shipped_file_is_the_default() {
        let shipped = (Path::new("config.toml"), include_str!("../config.toml"));
        let loaded = Config::parse(Some(shipped), [], &Overrides::default());
        assert_eq!(loaded.unwrap(), Config::default());
    }

    #[test]
    fn policy_converts_to_chrono() {
        assert_eq!(Config::default().policy(), Policy::default());
    }

    #[test]
    fn lease_namespace_falls_back_to_the_pod_then_a_constant() {
        let mut le = Config::default().leader_election;
        assert_eq!(le.lease_namespace(None), "workspace-gc");
        assert_eq!(le.lease_namespace(Some("")), "workspace-gc");
        assert_eq!(le.lease_namespace(Some("pod-ns")), "pod-ns");
        le.lease_namespace = Some("set".into());
        assert_eq!(le.lease_namespace(Some("pod-ns")), "set");
    }

    #[test]
    fn namespace_inclusion() {
        let mut s = Config::default().selector;
        assert!(s.includes_namespace("any"));
        s.exclude_namespaces = vec!["kube-system".into()];
        assert!(!s.includes_namespace("kube-system"));
        s.namespaces = vec!["ml".into()];
        assert!(s.includes_namespace("ml"));
        assert!(!s.includes_namespace("other"));
    }
}
