//! Configuration: `config.toml`, then `WORKSPACE_GC_<SECTION>_<KEY>` environment variables, then
//! command-line flags, each layer overriding the one before.
//!
//! Every setting is one row of the table in `settings.rs`, which gives its default, parser,
//! flag and effect on deletion; the typed [`Config`], the raw layers and the widening warnings
//! are derived from it. Loading runs in two stages. The layers are first read into a raw `Layer`
//! that mirrors the file's shape and remembers where each value came from, a byte span in the
//! file, a variable or a flag (`layers.rs`). Then each raw value is parsed by its row's parser,
//! and the keys that constrain one another are checked together (`validate.rs`), so every
//! rejection names the key and points at the value's origin, a file line included.

mod layers;
mod parse;
mod settings;
mod validate;
mod value;

pub mod labels;
pub mod quantity;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use self::labels::LabelSelector;
pub use self::quantity::Quantity;
use self::settings::Layer;
pub use self::settings::{
    Class, Config, CreatorConfig, DeletionConfig, HttpConfig, LeaderElectionConfig, LoggingConfig,
    NamespacePolicyConfig, PolicyConfig, QuotaConfig, SelectorConfig, Setting, settings,
};
use crate::decide::namespace::{Bounds, Policies};
use crate::decide::policy::{Collection, Policy};
use crate::decide::provenance::ProvenanceRule;
use crate::decide::quota::Waters;

/// Process exit code for an invalid configuration (or command line): nothing is started.
pub const EXIT_CONFIG: i32 = 2;

/// The prefix of every environment variable that sets a configuration key.
const ENV_PREFIX: &str = "WORKSPACE_GC_";

/// Names the configuration file; read by the command line, not a configuration key.
pub const ENV_CONFIG_FILE: &str = "WORKSPACE_GC_CONFIG";

/// Durations beyond this are typos, and would overflow timestamp arithmetic in the policy.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl SelectorConfig {
    /// Whether claims in `namespace` are tracked.
    pub fn includes_namespace(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && !self.exclude_namespaces.iter().any(|n| n == namespace)
    }
}

impl PolicyConfig {
    /// The TTL of a failed build's workspace: the configured one, else `ttl_after_finished`.
    pub fn ttl_after_failed(&self) -> Duration {
        self.ttl_after_failed.unwrap_or(self.ttl_after_finished)
    }
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

impl QuotaConfig {
    /// The thresholds, when quota pressure is enabled.
    pub fn waters(&self) -> Option<Waters> {
        self.enabled.then_some(Waters {
            high: self.high_water,
            low: self.low_water,
        })
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
            provenance: Arc::new(ProvenanceRule {
                claim_suffixes: self.provenance.claim_suffixes.clone(),
                label_managers: self.provenance.label_managers.clone(),
                trust_unrecorded: self.provenance.trust_unrecorded,
            }),
        }
    }
}

/// The cluster's policy with the configuration's defaults: the decision core keeps no defaults
/// of its own.
impl Default for Policy {
    fn default() -> Self {
        Config::default().policy()
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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

    /// `Policy::default()` is the configuration's default (no second set of numbers), in
    /// chrono's terms; an unset failed-build TTL follows the finished one.
    #[test]
    fn policy_converts_to_chrono() {
        let mut config = Config::default();
        config.policy.ttl_after_finished = Duration::from_secs(90);
        config.policy.max_age = MAX_DURATION;
        let policy = config.policy();
        assert_eq!(policy.ttl_after_finished, chrono::Duration::seconds(90));
        assert_eq!(policy.ttl_after_failed, chrono::Duration::seconds(90));
        assert_eq!(policy.max_age, chrono::Duration::days(100 * 365));
        assert_eq!(policy.orphan_grace, chrono::Duration::minutes(10));
        assert_eq!(
            Policy::default().ttl_after_finished,
            chrono::Duration::hours(1)
        );
        assert_eq!(Policy::default().collection, Collection::On);
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
