//! Configuration: `config.toml`, then `WORKSPACE_GC_<SECTION>_<KEY>` environment variables, then
//! command-line flags, each layer overriding the one before.
//!
//! This file holds the schema and its defaults. Loading runs in two stages. The layers are first
//! read into a raw `Layer` that mirrors the file's shape and remembers where each value came
//! from, a byte span in the file, a variable or a flag (`layers.rs`). Then `Layer::resolve` turns
//! raw values into typed ones and checks them (`validate.rs`), so every rejection names the key
//! and points at the value's origin, a file line included.

mod layers;
mod validate;

pub mod labels;
pub mod quantity;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Serialize, Serializer};

pub use self::labels::LabelSelector;
use self::layers::Layer;
pub use self::quantity::Quantity;
use crate::contract::labels::BUILD_WORKSPACE;
use crate::decide::namespace::{Bounds, Policies};
use crate::decide::policy::{Collection, Policy};
use crate::decide::quota::Waters;

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
    pub namespace_policy: NamespacePolicyConfig,
}

/// Per-namespace settings: annotations on a Namespace refine the policy for its claims, within
/// these bounds. Needs `list`/`watch` on Namespaces (the namespaced overlay has neither: the
/// cluster's policy applies there).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamespacePolicyConfig {
    pub enabled: bool,
    /// Whether a namespace may set a duration shorter than the cluster's.
    pub may_shorten: bool,
    /// The shortest duration a namespace may shorten one to.
    #[serde(serialize_with = "serialize_duration")]
    pub min_ttl: Duration,
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
    /// `None`: the same as `ttl_after_finished`; see [`PolicyConfig::ttl_after_failed`].
    #[serde(serialize_with = "serialize_duration_or_empty")]
    pub ttl_after_failed: Option<Duration>,
    #[serde(serialize_with = "serialize_duration")]
    pub orphan_grace: Duration,
    #[serde(serialize_with = "serialize_duration")]
    pub max_age: Duration,
    /// Count-based retention: the workspaces of each namespace's this many newest failed builds
    /// are kept whatever their TTL; 0: off.
    pub keep_failed: u32,
}

impl PolicyConfig {
    /// The TTL of a failed build's workspace: the configured one, else `ttl_after_finished`.
    pub fn ttl_after_failed(&self) -> Duration {
        self.ttl_after_failed.unwrap_or(self.ttl_after_finished)
    }
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
    /// This long before a claim becomes due, the leader writes one `DeletionScheduled` event on
    /// it; `None`: no notice.
    #[serde(serialize_with = "serialize_duration_or_empty")]
    pub notice_before: Option<Duration>,
    /// Read a bound claim's PersistentVolume before its delete, to report the storage a
    /// `Retain` reclaim policy keeps (needs `get` on PersistentVolumes).
    pub read_volumes: bool,
    /// Delete a `Released` volume this long after its claim, which workspace-gc deleted,
    /// released it (needs `read_volumes`, and get, list, patch and delete on
    /// PersistentVolumes); `None`: never.
    #[serde(serialize_with = "serialize_duration_or_empty")]
    pub released_volume_ttl: Option<Duration>,
    /// The least time between two rounds that prove the cache fresh for the live re-check, in
    /// one watch scope (`daemon::proof`): longer shares a round's reads among more re-checks,
    /// shorter lets each wait less for its round.
    #[serde(serialize_with = "serialize_duration")]
    pub proof_round_interval: Duration,
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
    /// HTTPS `/metrics` with TokenReview and SubjectAccessReview; `None`: off.
    pub secure_listen: Option<SocketAddr>,
    /// The serving certificate chain and key (PEM) of `secure_listen`; set exactly when it is.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
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
                label_selector: LabelSelector::equals(BUILD_WORKSPACE.0, BUILD_WORKSPACE.1),
                namespaces: Vec::new(),
                exclude_namespaces: Vec::new(),
            },
            policy: PolicyConfig {
                ttl_after_finished: Duration::from_secs(60 * 60),
                ttl_after_failed: None,
                orphan_grace: Duration::from_secs(10 * 60),
                max_age: Duration::from_secs(7 * 24 * 60 * 60),
                keep_failed: 0,
            },
            deletion: DeletionConfig {
                dry_run: false,
                server_side_dry_run: false,
                deletes_per_second: 5.0,
                max_deletions_per_window: 100,
                window: Duration::from_secs(10 * 60),
                notice_before: None,
                read_volumes: false,
                released_volume_ttl: None,
                proof_round_interval: Duration::from_millis(1500),
            },
            leader_election: LeaderElectionConfig {
                enabled: true,
                lease_name: "workspace-gc".to_owned(),
                lease_namespace: None,
                lease_duration: Duration::from_secs(15),
            },
            http: HttpConfig {
                listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
                secure_listen: None,
                tls_cert_file: None,
                tls_key_file: None,
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
            namespace_policy: NamespacePolicyConfig {
                enabled: false,
                may_shorten: false,
                min_ttl: Duration::from_secs(10 * 60),
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
        // Unset on both sides it follows ttl_after_finished, whose line says it already.
        let (to, from) = (pol.ttl_after_failed(), was.ttl_after_failed());
        let followed = pol.ttl_after_failed.is_none() && was.ttl_after_failed.is_none();
        if to < from && !followed {
            say("policy.ttl_after_failed", human(from), human(to));
        }
        if pol.keep_failed < was.keep_failed {
            let (from, to) = (was.keep_failed.to_string(), pol.keep_failed.to_string());
            say("policy.keep_failed", from, to);
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
        let (nsp, was) = (&self.namespace_policy, &base.namespace_policy);
        let shortens = |n: &NamespacePolicyConfig| n.enabled && n.may_shorten;
        if shortens(nsp) && !shortens(was) {
            say(
                "namespace_policy.may_shorten",
                "false".into(),
                "true".into(),
            );
        } else if shortens(nsp) && nsp.min_ttl < was.min_ttl {
            let (from, to) = (human(was.min_ttl), human(nsp.min_ttl));
            say("namespace_policy.min_ttl", from, to);
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

    /// The cluster's policy and, with per-namespace settings enabled, their bounds.
    pub fn policies(&self) -> Policies {
        let nsp = &self.namespace_policy;
        Policies {
            cluster: self.policy(),
            namespaces: nsp.enabled.then(|| Bounds {
                may_shorten: nsp.may_shorten,
                // MAX_DURATION keeps it within chrono's range.
                min_ttl: chrono::Duration::from_std(nsp.min_ttl).unwrap_or(chrono::Duration::MAX),
            }),
        }
    }

    /// The cluster's policy, as the decision core applies it.
    pub fn policy(&self) -> Policy {
        // MAX_DURATION keeps every duration within chrono's range, so the fallback never applies.
        let chrono = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        Policy {
            ttl_after_finished: chrono(self.policy.ttl_after_finished),
            ttl_after_failed: chrono(self.policy.ttl_after_failed()),
            orphan_grace: chrono(self.policy.orphan_grace),
            max_age: chrono(self.policy.max_age),
            keep_failed: self.policy.keep_failed,
            collection: Collection::On,
        }
    }
}

/// Configuration values given on the command line; `None` leaves the key as the file and the
/// environment set it. Built by [`crate::surface::cli::Cli::overrides`].
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

fn serialize_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

fn serialize_duration_or_empty<S: Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => serialize_duration(d, s),
        None => s.serialize_str(""),
    }
}

fn serialize_or_empty<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_deref().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::labels::{dns1123_label, dns1123_subdomain, label_key, label_value};
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
        let shipped = (Path::new("config.toml"), include_str!("../../config.toml"));
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
