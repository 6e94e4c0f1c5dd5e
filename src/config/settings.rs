//! The settings: one table, from which every other spelling of a setting is derived. A row
//! gives the key's type as the file and the environment spell it and as validated, and a
//! [`Spec`]: the default, the parser, how layers combine, the flag that sets it (where one
//! does), and whether overriding it can widen deletion. From the table come the typed
//! [`Config`] and its sections, the default, the raw `Layer` each source is read into, the
//! environment variable's key, the resolution of raw values into typed ones, and
//! [`Config::widenings`].
//!
//! A row without one of its [`Spec`]'s fields does not compile (`missing field` in the
//! initializer of `Spec`): a new setting cannot be added without saying how it affects deletion.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use super::parse::{
    annotation_map, creator_labels, duration, field_managers, fraction, keep_count, lease_seconds,
    log_filter, log_format, name_suffixes, namespace_list, optional_duration, optional_namespace,
    optional_path, optional_percent, optional_positive_duration, optional_socket_address,
    optional_storage_class, positive_cap, positive_duration, positive_rate, round_interval,
    socket_address, subdomain_name, tracking_selector, usernames,
};
use super::value::{At, FromEnv, Problem, Slot, Val};
use super::{LabelSelector, LogFormat, Quantity};
use crate::contract::labels::BUILD_WORKSPACE;
use crate::contract::naming::CLAIM_SUFFIX;

/// How overriding a setting can change what is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// An override can let more be deleted: it is named in a warning at start.
    Widens,
    /// An override can only let less be deleted.
    Narrows,
    /// An override does not change what is deleted.
    Neither,
}

impl Class {
    /// The word docs/configuration.md gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Widens => "widens",
            Class::Narrows => "narrows",
            Class::Neither => "neither",
        }
    }
}

/// One setting, as the table describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// `section.key`, as in the file.
    pub key: &'static str,
    /// The command-line flag that sets it, where one does.
    pub flag: Option<&'static str>,
    pub class: Class,
    /// The setting whose warning names this one's widening too, where another's does.
    pub widens_with: Option<&'static str>,
}

impl Setting {
    /// `WORKSPACE_GC_<SECTION>_<KEY>`.
    pub fn env(&self) -> String {
        let upper = self.key.replace('.', "_").to_ascii_uppercase();
        format!("{}{upper}", super::ENV_PREFIX)
    }
}

/// A row of the table: everything about one setting but its name and types.
pub(super) struct Spec<R, T> {
    pub(super) flag: Option<&'static str>,
    pub(super) default: T,
    /// From the raw value to the typed one, or what is wrong and what is expected.
    pub(super) parse: fn(R) -> Result<T, String>,
    /// How a later layer's value meets an earlier one's: [`replace`] or [`union`].
    pub(super) combine: fn(&mut Slot<R>, R, At),
    pub(super) effect: Effect<T>,
}

impl<R, T> Spec<R, T> {
    fn setting(&self, key: &'static str) -> Setting {
        let class = match self.effect {
            Effect::Widens(_) | Effect::WidensWith(_) => Class::Widens,
            Effect::Narrows => Class::Narrows,
            Effect::Neither => Class::Neither,
        };
        let widens_with = match self.effect {
            Effect::WidensWith(other) => Some(other),
            _ => None,
        };
        Setting {
            key,
            flag: self.flag,
            class,
            widens_with,
        }
    }
}

/// What an override of a setting does to deletion.
pub(super) enum Effect<T> {
    /// It can widen deletion; the rule says when, and how to name the change.
    Widens(fn(Sides<'_, T>) -> Option<String>),
    /// It can widen deletion together with the named setting, whose warning names both.
    WidensWith(&'static str),
    Narrows,
    Neither,
}

/// One setting's value in the file alone (`was`) and with the overrides (`now`), and both
/// configurations, for a rule whose setting counts only with another.
pub(super) struct Sides<'a, T> {
    was: &'a T,
    now: &'a T,
    base: &'a Config,
    config: &'a Config,
}

/// A later layer's value replaces an earlier one's.
fn replace<R>(slot: &mut Slot<R>, value: R, at: At) {
    *slot = Some(Val { value, at });
}

/// Exclusions only ever add up: a later layer (environment, flags) adds its namespaces to
/// those the earlier ones excluded, so no override can make an excluded namespace collectable.
fn union(slot: &mut Slot<Vec<String>>, list: Vec<String>, at: At) {
    let mut value = slot.take().map(|earlier| earlier.value).unwrap_or_default();
    for namespace in list {
        if !value.contains(&namespace) {
            value.push(namespace);
        }
    }
    *slot = Some(Val { value, at });
}

/// Converts a raw value with the row's parser, or takes its default; either way keeps the
/// origin.
fn take<R, T>(slot: Slot<R>, key: &'static str, spec: Spec<R, T>) -> Result<Val<T>, Problem> {
    match slot {
        None => Ok(Val {
            value: spec.default,
            at: At::Default,
        }),
        Some(Val { value, at }) => match (spec.parse)(value) {
            Ok(value) => Ok(Val { value, at }),
            Err(message) => Err(Problem { key, at, message }),
        },
    }
}

/// Sets `slot` from a flag's value, if the flag was given.
pub(super) fn flag<R, T>(slot: &mut Slot<R>, value: Option<R>, spec: Spec<R, T>) {
    if let (Some(value), Some(flag)) = (value, spec.flag) {
        (spec.combine)(slot, value, At::Flag(flag));
    }
}

/// `section.key`, as the file spells it.
macro_rules! key {
    ($section:ident, $key:ident) => {
        concat!(stringify!($section), ".", stringify!($key))
    };
}

macro_rules! settings {
    (
        $(
            $(#[$section_meta:meta])*
            [$section:ident] $Section:ident {
                $(
                    $(#[$meta:meta])*
                    $key:ident: $Raw:ty => $Typed:ty = $spec:expr,
                )*
            }
        )*
    ) => {
        /// The effective configuration.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        pub struct Config {
            $(pub $section: $Section,)*
        }

        $(
            $(#[$section_meta])*
            #[derive(Debug, Clone, PartialEq, Serialize)]
            pub struct $Section {
                $($(#[$meta])* pub $key: $Typed,)*
            }

            /// The section's rows, its raw layer and the origins of its values.
            pub(super) mod $section {
                use super::*;

                /// The section's raw values; `None` where a layer leaves a key unset.
                #[derive(Default, Deserialize)]
                #[serde(default, deny_unknown_fields)]
                pub(in crate::config) struct Layer {
                    $(pub(in crate::config) $key: Slot<$Raw>,)*
                }

                /// Where each of the section's values came from.
                #[allow(dead_code, reason = "only the keys that constrain another are read")]
                pub(in crate::config) struct Origins {
                    $(pub(in crate::config) $key: At,)*
                }

                $(
                    pub(in crate::config) fn $key() -> Spec<$Raw, $Typed> {
                        $spec
                    }
                )*
            }
        )*

        /// The configuration's shape with raw values, as one layer (file, environment, flags)
        /// sets them.
        #[derive(Default, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub(super) struct Layer {
            $(pub(super) $section: $section::Layer,)*
        }

        /// Where each resolved value came from, for naming the key to blame in a conflict.
        #[allow(dead_code, reason = "only the keys that constrain another are read")]
        pub(super) struct Origins {
            $(pub(super) $section: $section::Origins,)*
        }

        /// The file's sections, for splitting `WORKSPACE_GC_LEADER_ELECTION_LEASE_NAME` and the
        /// like where underscores separate words as well as section from key.
        pub(super) const SECTIONS: &[&str] = &[$(stringify!($section)),*];

        /// Every setting, in the file's order.
        pub fn settings() -> Vec<Setting> {
            vec![$($($section::$key().setting(key!($section, $key)),)*)*]
        }

        impl Default for Config {
            /// Exactly what the shipped `config.toml` says (a test holds them together).
            fn default() -> Self {
                Config {
                    $($section: $Section {
                        $($key: $section::$key().default,)*
                    },)*
                }
            }
        }

        impl Layer {
            /// Sets `key` from an environment value; `None` if there is no such key.
            pub(super) fn set(&mut self, key: &str, raw: &str, at: At) -> Option<Result<(), String>> {
                match key {
                    $($(
                        key!($section, $key) => {
                            let combine = $section::$key().combine;
                            let value = <$Raw as FromEnv>::from_env(raw);
                            Some(value.map(|value| combine(&mut self.$section.$key, value, at)))
                        }
                    )*)*
                    _ => None,
                }
            }

            /// Each raw value parsed, or its default; and where each came from.
            pub(super) fn typed(self) -> Result<(Config, Origins), Problem> {
                $(
                    let $section = {
                        let $section::Layer { $($key),* } = self.$section;
                        $(let $key = take($key, key!($section, $key), $section::$key())?;)*
                        (
                            $Section { $($key: $key.value,)* },
                            $section::Origins { $($key: $key.at,)* },
                        )
                    };
                )*
                Ok((
                    Config { $($section: $section.0,)* },
                    Origins { $($section: $section.1,)* },
                ))
            }
        }

        impl Config {
            /// How this configuration lets more be deleted than `base` (the file alone): one line
            /// per widening, for a warning at start. Overrides may change anything, but never
            /// silently widen what can be deleted.
            pub fn widenings(&self, base: &Config) -> Vec<String> {
                let mut found = Vec::new();
                $($(
                    let spec = $section::$key();
                    if let Effect::Widens(rule) = spec.effect {
                        let sides = Sides {
                            was: &base.$section.$key,
                            now: &self.$section.$key,
                            base,
                            config: self,
                        };
                        if let Some(change) = rule(sides) {
                            let key = key!($section, $key);
                            found.push(format!("{key} is overridden {change}"));
                        }
                    }
                )*)*
                found
            }
        }
    };
}

settings! {
    /// Which claims are tracked.
    [selector] SelectorConfig {
        /// Sent as the `labelSelector` of every claim list and watch.
        label_selector: String => LabelSelector = Spec {
            flag: None,
            default: LabelSelector::equals(BUILD_WORKSPACE.0, BUILD_WORKSPACE.1),
            parse: tracking_selector,
            combine: replace,
            effect: Effect::Widens(changed_selector),
        },
        /// Namespaces to watch; empty means all.
        namespaces: Vec<String> => Vec<String> = Spec {
            flag: Some("--namespace"),
            default: Vec::new(),
            parse: namespace_list,
            combine: replace,
            effect: Effect::Widens(reaches_more_namespaces),
        },
        /// Namespaces never touched, even when `namespaces` is empty.
        exclude_namespaces: Vec<String> => Vec<String> = Spec {
            flag: Some("--exclude-namespace"),
            default: Vec::new(),
            parse: namespace_list,
            combine: union,
            effect: Effect::Narrows,
        },
    }

    /// The policy's durations, as configured; see [`Config::policy`].
    [policy] PolicyConfig {
        #[serde(serialize_with = "serialize_duration")]
        ttl_after_finished: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(60 * 60),
            parse: duration,
            combine: replace,
            effect: Effect::Widens(shorter),
        },
        /// `None`: the same as `ttl_after_finished`; see [`PolicyConfig::ttl_after_failed`].
        #[serde(serialize_with = "serialize_duration_or_empty")]
        ttl_after_failed: String => Option<Duration> = Spec {
            flag: None,
            default: None,
            parse: optional_duration,
            combine: replace,
            effect: Effect::Widens(shorter_failed_ttl),
        },
        /// Greater than zero: zero would delete claims the operator has just created for a
        /// build about to start.
        #[serde(serialize_with = "serialize_duration")]
        orphan_grace: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(10 * 60),
            parse: positive_duration,
            combine: replace,
            effect: Effect::Widens(shorter),
        },
        #[serde(serialize_with = "serialize_duration")]
        max_age: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(7 * 24 * 60 * 60),
            parse: positive_duration,
            combine: replace,
            effect: Effect::Widens(shorter),
        },
        /// Count-based retention: the workspaces of each namespace's this many newest failed
        /// builds are kept whatever their TTL; 0: off.
        keep_failed: u32 => u32 = Spec {
            flag: None,
            default: 0,
            parse: keep_count,
            combine: replace,
            effect: Effect::Widens(fewer),
        },
    }

    /// How deletions are sent and throttled.
    [deletion] DeletionConfig {
        /// Decide, log, count and emit events, but delete nothing.
        dry_run: bool => bool = Spec {
            flag: Some("--dry-run"),
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::Widens(turned_off),
        },
        /// In dry-run, still send each delete with `dryRun=All` so RBAC and admission run.
        server_side_dry_run: bool => bool = Spec {
            flag: Some("--server-side-dry-run"),
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::Neither,
        },
        /// Always paced: validation refuses a rate whose [`super::deletion_interval`] is not
        /// representable.
        deletes_per_second: f64 => f64 = Spec {
            flag: None,
            default: 5.0,
            parse: positive_rate,
            combine: replace,
            effect: Effect::Widens(faster),
        },
        /// At most this many deletions in any rolling `window`.
        max_deletions_per_window: u32 => u32 = Spec {
            flag: None,
            default: 100,
            parse: positive_cap,
            combine: replace,
            effect: Effect::Widens(larger_cap),
        },
        #[serde(serialize_with = "serialize_duration")]
        window: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(10 * 60),
            parse: positive_duration,
            combine: replace,
            effect: Effect::WidensWith("deletion.max_deletions_per_window"),
        },
        /// Besides the absolute cap, at most this percentage of the claims watched in any
        /// `window` (at least one): a flood of candidates is taken a share at a time. 0: off.
        #[serde(serialize_with = "serialize_percent_or_zero")]
        max_deletions_percent: f64 => Option<f64> = Spec {
            flag: None,
            default: None,
            parse: optional_percent,
            combine: replace,
            effect: Effect::Widens(larger_share),
        },
        /// This long before a claim becomes due, the leader writes one `DeletionScheduled`
        /// event on it; `None`: no notice.
        #[serde(serialize_with = "serialize_duration_or_empty")]
        notice_before: String => Option<Duration> = Spec {
            flag: None,
            default: None,
            parse: optional_positive_duration,
            combine: replace,
            effect: Effect::Neither,
        },
        /// Read a bound claim's PersistentVolume before its delete, to report the storage a
        /// `Retain` reclaim policy keeps (needs `get` on PersistentVolumes).
        read_volumes: bool => bool = Spec {
            flag: None,
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::Neither,
        },
        /// Delete a `Released` volume this long after its claim, which workspace-gc deleted,
        /// released it (needs `read_volumes`, and get, list, patch and delete on
        /// PersistentVolumes); `None`: never.
        #[serde(serialize_with = "serialize_duration_or_empty")]
        released_volume_ttl: String => Option<Duration> = Spec {
            flag: None,
            default: None,
            parse: optional_positive_duration,
            combine: replace,
            effect: Effect::Widens(volumes_sooner),
        },
        /// The least time between two rounds that prove the cache fresh for the live
        /// re-check, in one watch scope (`daemon::proof`): longer shares a round's reads among
        /// more re-checks, shorter lets each wait less for its round.
        #[serde(serialize_with = "serialize_duration")]
        proof_round_interval: String => Duration = Spec {
            flag: None,
            default: Duration::from_millis(1500),
            parse: round_interval,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    /// Lease-based leader election; only the leader deletes.
    [leader_election] LeaderElectionConfig {
        /// Off, every replica deletes and counts its own cap.
        enabled: bool => bool = Spec {
            flag: Some("--no-leader-election"),
            default: true,
            parse: Ok,
            combine: replace,
            effect: Effect::Widens(turned_off),
        },
        lease_name: String => String = Spec {
            flag: None,
            default: "workspace-gc".to_owned(),
            parse: subdomain_name,
            combine: replace,
            effect: Effect::Neither,
        },
        /// `None`: the pod's own namespace; see [`LeaderElectionConfig::lease_namespace`].
        #[serde(serialize_with = "serialize_or_empty")]
        lease_namespace: String => Option<String> = Spec {
            flag: Some("--lease-namespace"),
            default: None,
            parse: optional_namespace,
            combine: replace,
            effect: Effect::Neither,
        },
        /// A whole number of seconds, as the Lease API counts.
        #[serde(serialize_with = "serialize_duration")]
        lease_duration: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(15),
            parse: lease_seconds,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    /// The metrics and health endpoint.
    [http] HttpConfig {
        listen: String => SocketAddr = Spec {
            flag: Some("--listen"),
            default: SocketAddr::from(([0, 0, 0, 0], 8080)),
            parse: socket_address,
            combine: replace,
            effect: Effect::Neither,
        },
        /// HTTPS `/metrics` with TokenReview and SubjectAccessReview; `None`: off.
        secure_listen: String => Option<SocketAddr> = Spec {
            flag: None,
            default: None,
            parse: optional_socket_address,
            combine: replace,
            effect: Effect::Neither,
        },
        /// The serving certificate chain and key (PEM) of `secure_listen`; set exactly when it
        /// is.
        tls_cert_file: String => Option<PathBuf> = Spec {
            flag: None,
            default: None,
            parse: optional_path,
            combine: replace,
            effect: Effect::Neither,
        },
        tls_key_file: String => Option<PathBuf> = Spec {
            flag: None,
            default: None,
            parse: optional_path,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    [logging] LoggingConfig {
        format: String => LogFormat = Spec {
            flag: Some("--log-format"),
            default: LogFormat::Human,
            parse: log_format,
            combine: replace,
            effect: Effect::Neither,
        },
        /// A `tracing_subscriber::EnvFilter` directive string, checked to parse.
        level: String => String = Spec {
            flag: Some("--log-level"),
            default: "info".to_owned(),
            parse: log_filter,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    /// What `workspace-gc create` puts on a new claim besides its fixed labels and owner.
    [creator] CreatorConfig {
        storage: String => Quantity = Spec {
            flag: None,
            default: Quantity::gibibytes(1),
            parse: |raw| raw.parse(),
            combine: replace,
            effect: Effect::Neither,
        },
        /// `None`: the cluster's default storage class.
        #[serde(serialize_with = "serialize_or_empty")]
        storage_class: String => Option<String> = Spec {
            flag: None,
            default: None,
            parse: optional_storage_class,
            combine: replace,
            effect: Effect::Neither,
        },
        labels: BTreeMap<String, String> => BTreeMap<String, String> = Spec {
            flag: None,
            default: BTreeMap::new(),
            parse: creator_labels,
            combine: replace,
            effect: Effect::Neither,
        },
        annotations: BTreeMap<String, String> => BTreeMap<String, String> = Spec {
            flag: None,
            default: BTreeMap::new(),
            parse: annotation_map,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    /// Quota pressure: finished workspaces deleted before their TTL while a namespace's storage
    /// quota is nearly exhausted.
    [quota] QuotaConfig {
        enabled: bool => bool = Spec {
            flag: None,
            default: true,
            parse: Ok,
            combine: replace,
            effect: Effect::Widens(turned_on),
        },
        /// A namespace is under pressure once a quota's used / hard reaches this.
        high_water: f64 => f64 = Spec {
            flag: None,
            default: 0.9,
            parse: fraction,
            combine: replace,
            effect: Effect::Widens(lower_water),
        },
        /// Under pressure, claims are deleted until used / hard is projected at or below this.
        low_water: f64 => f64 = Spec {
            flag: None,
            default: 0.8,
            parse: fraction,
            combine: replace,
            effect: Effect::Widens(lower_water),
        },
    }

    /// What makes a labelled claim a build workspace at all (docs/policy.md, "Provenance"):
    /// the operator's contract by default; each key can only widen it.
    [provenance] ProvenanceConfig {
        /// A candidate's name ends with one of these, after a non-empty prefix.
        claim_suffixes: Vec<String> => Vec<String> = Spec {
            flag: None,
            default: vec![CLAIM_SUFFIX.to_owned()],
            parse: name_suffixes,
            combine: replace,
            effect: Effect::Widens(more_names),
        },
        /// Field managers trusted to add the build-workspace label to a claim they did not make.
        label_managers: Vec<String> => Vec<String> = Spec {
            flag: None,
            default: Vec::new(),
            parse: field_managers,
            combine: replace,
            effect: Effect::Widens(more_names),
        },
        /// A claim with no managedFields passes on its name and labels alone.
        trust_unrecorded: bool => bool = Spec {
            flag: None,
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::Widens(turned_on),
        },
        /// The users the label guard (`workspace-gc admission-policy`, on by default) lets add
        /// the build-workspace label to an existing claim; empty: nobody. Creating a claim
        /// with the label needs no entry.
        label_writers: Vec<String> => Vec<String> = Spec {
            flag: None,
            default: Vec::new(),
            parse: usernames,
            combine: replace,
            effect: Effect::Neither,
        },
    }

    /// Per-namespace settings: annotations on a Namespace refine the policy for its claims,
    /// within these bounds. Needs `list`/`watch` on Namespaces (the namespaced overlay has
    /// neither: the cluster's policy applies there).
    [namespace_policy] NamespacePolicyConfig {
        enabled: bool => bool = Spec {
            flag: None,
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::WidensWith("namespace_policy.may_shorten"),
        },
        /// Whether a namespace may set a duration shorter than the cluster's.
        may_shorten: bool => bool = Spec {
            flag: None,
            default: false,
            parse: Ok,
            combine: replace,
            effect: Effect::Widens(lets_namespaces_shorten),
        },
        /// The shortest duration a namespace may shorten one to.
        #[serde(serialize_with = "serialize_duration")]
        min_ttl: String => Duration = Spec {
            flag: None,
            default: Duration::from_secs(10 * 60),
            parse: positive_duration,
            combine: replace,
            effect: Effect::Widens(shorter_namespace_floor),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// When an override widens deletion: each rule names the change, or says nothing.

/// "from A to B: more claims may be deleted".
fn claims(from: impl std::fmt::Display, to: impl std::fmt::Display) -> Option<String> {
    Some(format!("from {from} to {to}: more claims may be deleted"))
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn changed_selector(s: Sides<'_, LabelSelector>) -> Option<String> {
    let quoted = |selector: &LabelSelector| format!("{:?}", selector.to_string());
    (s.now != s.was).then(|| claims(quoted(s.was), quoted(s.now)))?
}

/// A scope that reaches a namespace the file's did not; empty is all namespaces.
fn reaches_more_namespaces(s: Sides<'_, Vec<String>>) -> Option<String> {
    let scope = |namespaces: &[String]| match namespaces {
        [] => "all namespaces".to_owned(),
        list => format!("{list:?}"),
    };
    let wider =
        !s.was.is_empty() && (s.now.is_empty() || s.now.iter().any(|ns| !s.was.contains(ns)));
    wider.then(|| claims(scope(s.was), scope(s.now)))?
}

fn shorter(s: Sides<'_, Duration>) -> Option<String> {
    (s.now < s.was).then(|| claims(human(*s.was), human(*s.now)))?
}

/// Compared as applied; unset on both sides it follows ttl_after_finished, whose line says it
/// already.
fn shorter_failed_ttl(s: Sides<'_, Option<Duration>>) -> Option<String> {
    let (from, to) = (
        s.base.policy.ttl_after_failed(),
        s.config.policy.ttl_after_failed(),
    );
    let followed = s.now.is_none() && s.was.is_none();
    (to < from && !followed).then(|| claims(human(from), human(to)))?
}

/// Keeping fewer deletes more.
fn fewer(s: Sides<'_, u32>) -> Option<String> {
    (s.now < s.was).then(|| claims(s.was, s.now))?
}

/// A list that accepts a name the file's did not.
fn more_names(s: Sides<'_, Vec<String>>) -> Option<String> {
    let wider = s.now.iter().any(|name| !s.was.contains(name));
    wider.then(|| claims(format!("{:?}", s.was), format!("{:?}", s.now)))?
}

fn turned_off(s: Sides<'_, bool>) -> Option<String> {
    (*s.was && !*s.now).then(|| claims(true, false))?
}

fn turned_on(s: Sides<'_, bool>) -> Option<String> {
    (!*s.was && *s.now).then(|| claims(false, true))?
}

fn faster(s: Sides<'_, f64>) -> Option<String> {
    (s.now > s.was).then(|| claims(s.was, s.now))?
}

/// A higher cap or a shorter window, named together as the cap they make.
fn larger_cap(s: Sides<'_, u32>) -> Option<String> {
    let (was, now) = (&s.base.deletion, &s.config.deletion);
    let cap =
        |d: &DeletionConfig| format!("{} per {}", d.max_deletions_per_window, human(d.window));
    (s.now > s.was || now.window < was.window).then(|| claims(cap(was), cap(now)))?
}

/// A larger share of the population per window, or none at all.
fn larger_share(s: Sides<'_, Option<f64>>) -> Option<String> {
    let show = |share: &Option<f64>| share.map_or_else(|| "off".to_owned(), |p| format!("{p}%"));
    let larger = match (s.was, s.now) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(was), Some(now)) => now > was,
    };
    larger.then(|| claims(show(s.was), show(s.now)))?
}

/// Pressure starts earlier or deletes further; only counts with pressure on.
fn lower_water(s: Sides<'_, f64>) -> Option<String> {
    (s.config.quota.enabled && s.now < s.was).then(|| claims(s.was, s.now))?
}

fn shortens(n: &NamespacePolicyConfig) -> bool {
    n.enabled && n.may_shorten
}

/// Namespaces may now shorten durations (by `enabled` or by `may_shorten`).
fn lets_namespaces_shorten(s: Sides<'_, bool>) -> Option<String> {
    let (was, now) = (&s.base.namespace_policy, &s.config.namespace_policy);
    (shortens(now) && !shortens(was)).then(|| claims(false, true))?
}

/// Namespaces that could already shorten may now shorten further.
fn shorter_namespace_floor(s: Sides<'_, Duration>) -> Option<String> {
    let (was, now) = (&s.base.namespace_policy, &s.config.namespace_policy);
    let floor_lowered = shortens(now) && shortens(was) && s.now < s.was;
    floor_lowered.then(|| claims(human(*s.was), human(*s.now)))?
}

/// Released volumes deleted where they were kept, or sooner.
fn volumes_sooner(s: Sides<'_, Option<Duration>>) -> Option<String> {
    let show = |ttl: &Option<Duration>| ttl.map_or_else(|| "off".to_owned(), human);
    let sooner = match (s.was, s.now) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(was), Some(now)) => now < was,
    };
    sooner.then(|| {
        format!(
            "from {} to {}: more released volumes may be deleted",
            show(s.was),
            show(s.now)
        )
    })
}

// ---------------------------------------------------------------------------------------------
// How typed values print (`check-config`), so the output loads back.

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

fn serialize_percent_or_zero<S: Serializer>(p: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(p.unwrap_or(0.0))
}

fn serialize_or_empty<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_deref().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A setting that widens only with another names one that has a rule of its own.
    #[test]
    fn a_setting_that_widens_with_another_names_one_with_a_rule() {
        let all = settings();
        for setting in &all {
            let Some(with) = setting.widens_with else {
                continue;
            };
            let named = all.iter().find(|other| other.key == with);
            assert!(
                named.is_some_and(|n| n.class == Class::Widens && n.widens_with.is_none()),
                "{} widens with {with}, which does not report a widening itself",
                setting.key
            );
        }
    }

    #[test]
    fn environment_names_follow_the_key() {
        let all = settings();
        let ttl = all.iter().find(|s| s.key == "policy.ttl_after_finished");
        assert_eq!(
            ttl.map(Setting::env).as_deref(),
            Some("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED")
        );
        assert_eq!(SECTIONS.len(), 10);
    }
}
