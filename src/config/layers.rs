//! The layers of the configuration: the file, then `WORKSPACE_GC_<SECTION>_<KEY>` environment
//! variables, then command-line flags. Each is read into the raw `Layer` (its shape comes from
//! the table in `settings.rs`) that remembers where each value came from, so that validation can
//! name the origin of a rejected value.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Deserializer};
use toml::de::{DeTable, DeValue};

use super::settings::{Layer, SECTIONS, deletion, flag, http, leader_election, logging, selector};
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

    /// Sets the keys the command line gives, each naming its flag (the table's) as origin.
    pub(super) fn apply_overrides(&mut self, overrides: &Overrides) {
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
        let format = log_format.map(|f| f.as_str().to_owned());
        flag(&mut self.logging.format, format, logging::format());
        flag(&mut self.logging.level, log_level, logging::level());
        flag(&mut self.deletion.dry_run, dry_run, deletion::dry_run());
        let server_side = deletion::server_side_dry_run();
        flag(
            &mut self.deletion.server_side_dry_run,
            server_side_dry_run,
            server_side,
        );
        let listen = listen.map(|address| address.to_string());
        flag(&mut self.http.listen, listen, http::listen());
        flag(
            &mut self.selector.namespaces,
            namespaces,
            selector::namespaces(),
        );
        let exclude = selector::exclude_namespaces();
        flag(
            &mut self.selector.exclude_namespaces,
            exclude_namespaces,
            exclude,
        );
        let enabled = leader_election::enabled();
        flag(&mut self.leader_election.enabled, leader_election, enabled);
        let namespace = leader_election::lease_namespace();
        flag(
            &mut self.leader_election.lease_namespace,
            lease_namespace,
            namespace,
        );
    }
}

/// Conversion of an environment variable's text into a raw value.
pub(super) trait FromEnv: Sized {
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
