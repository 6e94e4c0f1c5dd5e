//! The layers of the configuration: the file, then `WORKSPACE_GC_<SECTION>_<KEY>` environment
//! variables, then command-line flags. Each is read into the raw `Layer` (its shape comes from
//! the table in `settings.rs`) that remembers where each value came from, so that validation can
//! name the origin of a rejected value.

use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};

use super::settings::{Layer, SECTIONS, deletion, flag, http, leader_election, logging, selector};
use super::value::{At, Problem};
use super::{ConfigError, ENV_CONFIG_FILE, ENV_PREFIX, Location, Overrides};

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
