//! A raw configuration value as the layers read it: the value, where it came from ([`At`]),
//! and what was wrong with it ([`Problem`]); and how an environment variable's text becomes
//! one ([`FromEnv`]). Below the layers, the table and the validation, which all speak of it.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Deserializer};

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
