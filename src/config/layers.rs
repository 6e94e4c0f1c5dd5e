//! The layers of the configuration: the file, then `WORKSPACE_GC_<SECTION>_<KEY>` environment
//! variables, then command-line flags. Each is read into a raw [`Layer`] that mirrors the file's
//! shape and remembers where each value came from, so that validation can name the origin of a
//! rejected value.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Deserializer};
use toml::de::{DeTable, DeValue};

use super::{ConfigError, ENV_CONFIG_FILE, ENV_PREFIX, Location, Overrides};

/// Where a raw value came from.
#[derive(Debug, Clone)]
pub(super) enum At {
    Default,
    File(Range<usize>),
    Env(String),
    Flag(&'static str),
}

impl At {
    /// Precedence: a later layer overrides an earlier one.
    pub(super) fn rank(&self) -> u8 {
        match self {
            At::Default => 0,
            At::File(_) => 1,
            At::Env(_) => 2,
            At::Flag(_) => 3,
        }
    }
}

/// A value and its origin.
pub(super) struct Val<T> {
    pub(super) value: T,
    pub(super) at: At,
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

pub(super) type Slot<T> = Option<Val<T>>;

/// The configuration's shape with raw values; `None` where a layer leaves a key unset.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct Layer {
    pub(super) selector: SelectorLayer,
    pub(super) policy: PolicyLayer,
    pub(super) deletion: DeletionLayer,
    pub(super) leader_election: LeaderElectionLayer,
    pub(super) http: HttpLayer,
    pub(super) logging: LoggingLayer,
    pub(super) creator: CreatorLayer,
    pub(super) quota: QuotaLayer,
    pub(super) namespace_policy: NamespacePolicyLayer,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct SelectorLayer {
    pub(super) label_selector: Slot<String>,
    pub(super) namespaces: Slot<Vec<String>>,
    pub(super) exclude_namespaces: Slot<Vec<String>>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct PolicyLayer {
    pub(super) ttl_after_finished: Slot<String>,
    pub(super) ttl_after_failed: Slot<String>,
    pub(super) orphan_grace: Slot<String>,
    pub(super) max_age: Slot<String>,
    pub(super) keep_failed: Slot<u32>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct DeletionLayer {
    pub(super) dry_run: Slot<bool>,
    pub(super) server_side_dry_run: Slot<bool>,
    pub(super) deletes_per_second: Slot<f64>,
    pub(super) max_deletions_per_window: Slot<u32>,
    pub(super) window: Slot<String>,
    pub(super) notice_before: Slot<String>,
    pub(super) read_volumes: Slot<bool>,
    pub(super) released_volume_ttl: Slot<String>,
    pub(super) proof_round_interval: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct LeaderElectionLayer {
    pub(super) enabled: Slot<bool>,
    pub(super) lease_name: Slot<String>,
    pub(super) lease_namespace: Slot<String>,
    pub(super) lease_duration: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct HttpLayer {
    pub(super) listen: Slot<String>,
    pub(super) secure_listen: Slot<String>,
    pub(super) tls_cert_file: Slot<String>,
    pub(super) tls_key_file: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct LoggingLayer {
    pub(super) format: Slot<String>,
    pub(super) level: Slot<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct CreatorLayer {
    pub(super) storage: Slot<String>,
    pub(super) storage_class: Slot<String>,
    pub(super) labels: Slot<BTreeMap<String, String>>,
    pub(super) annotations: Slot<BTreeMap<String, String>>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct QuotaLayer {
    pub(super) enabled: Slot<bool>,
    pub(super) high_water: Slot<f64>,
    pub(super) low_water: Slot<f64>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct NamespacePolicyLayer {
    pub(super) enabled: Slot<bool>,
    pub(super) may_shorten: Slot<bool>,
    pub(super) min_ttl: Slot<String>,
}

/// The file's sections, for splitting `WORKSPACE_GC_LEADER_ELECTION_LEASE_NAME` and the like
/// where underscores separate words as well as section from key.
const SECTIONS: [&str; 9] = [
    "selector",
    "policy",
    "deletion",
    "leader_election",
    "http",
    "logging",
    "creator",
    "quota",
    "namespace_policy",
];

/// A rejected value, before its origin is turned into a [`Location`].
pub(super) struct Problem {
    pub(super) key: &'static str,
    pub(super) at: At,
    pub(super) message: String,
}

impl Problem {
    pub(super) fn into_error(self, file: Option<(&Path, &str)>) -> ConfigError {
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
    pub(super) fn from_toml(path: &Path, text: &str) -> Result<Layer, ConfigError> {
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

    pub(super) fn apply_env(
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
            namespace_policy: n,
        } = self;
        Some(match key {
            "selector.label_selector" => put(&mut s.label_selector, raw, at),
            "selector.namespaces" => put(&mut s.namespaces, raw, at),
            "selector.exclude_namespaces" => {
                Vec::from_env(raw).map(|list| exclude(&mut s.exclude_namespaces, list, at))
            }
            "policy.ttl_after_finished" => put(&mut p.ttl_after_finished, raw, at),
            "policy.ttl_after_failed" => put(&mut p.ttl_after_failed, raw, at),
            "policy.orphan_grace" => put(&mut p.orphan_grace, raw, at),
            "policy.max_age" => put(&mut p.max_age, raw, at),
            "policy.keep_failed" => put(&mut p.keep_failed, raw, at),
            "deletion.dry_run" => put(&mut d.dry_run, raw, at),
            "deletion.server_side_dry_run" => put(&mut d.server_side_dry_run, raw, at),
            "deletion.deletes_per_second" => put(&mut d.deletes_per_second, raw, at),
            "deletion.max_deletions_per_window" => put(&mut d.max_deletions_per_window, raw, at),
            "deletion.window" => put(&mut d.window, raw, at),
            "deletion.proof_round_interval" => put(&mut d.proof_round_interval, raw, at),
            "deletion.notice_before" => put(&mut d.notice_before, raw, at),
            "deletion.read_volumes" => put(&mut d.read_volumes, raw, at),
            "deletion.released_volume_ttl" => put(&mut d.released_volume_ttl, raw, at),
            "leader_election.enabled" => put(&mut l.enabled, raw, at),
            "leader_election.lease_name" => put(&mut l.lease_name, raw, at),
            "leader_election.lease_namespace" => put(&mut l.lease_namespace, raw, at),
            "leader_election.lease_duration" => put(&mut l.lease_duration, raw, at),
            "http.listen" => put(&mut h.listen, raw, at),
            "http.secure_listen" => put(&mut h.secure_listen, raw, at),
            "http.tls_cert_file" => put(&mut h.tls_cert_file, raw, at),
            "http.tls_key_file" => put(&mut h.tls_key_file, raw, at),
            "logging.format" => put(&mut g.format, raw, at),
            "logging.level" => put(&mut g.level, raw, at),
            "creator.storage" => put(&mut c.storage, raw, at),
            "creator.storage_class" => put(&mut c.storage_class, raw, at),
            "creator.labels" => put(&mut c.labels, raw, at),
            "creator.annotations" => put(&mut c.annotations, raw, at),
            "quota.enabled" => put(&mut q.enabled, raw, at),
            "quota.high_water" => put(&mut q.high_water, raw, at),
            "quota.low_water" => put(&mut q.low_water, raw, at),
            "namespace_policy.enabled" => put(&mut n.enabled, raw, at),
            "namespace_policy.may_shorten" => put(&mut n.may_shorten, raw, at),
            "namespace_policy.min_ttl" => put(&mut n.min_ttl, raw, at),
            _ => return None,
        })
    }

    pub(super) fn apply_overrides(&mut self, overrides: &Overrides) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
