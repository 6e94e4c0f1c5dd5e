//! The per-claim annotations users set to refine the policy, and their strict parsing.
//!
//! A value that does not parse keeps the claim: bad input must never cause a deletion.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use thiserror::Error;

use crate::contract::annotations::{EXPIRES, KEEP, PREFIX, REVOKED_UNDER_PREFIX, TTL};

/// Longest part of an offending value quoted back in an error, so a huge annotation cannot
/// bloat logs and events.
const QUOTE_LIMIT: usize = 64;

/// The parsed annotations of one claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimAnnotations {
    pub keep: bool,
    pub ttl: Option<Duration>,
    pub expires: Option<DateTime<Utc>>,
}

/// An annotation whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {key}={value:?} is invalid: {expected}")]
pub struct AnnotationError {
    pub key: &'static str,
    /// The value as given, shortened to a bounded length.
    pub value: String,
    pub expected: String,
}

impl AnnotationError {
    fn new(key: &'static str, value: &str, expected: impl Into<String>) -> Self {
        Self {
            key,
            value: quote(value),
            expected: expected.into(),
        }
    }
}

/// `value`, shortened to a bounded length for logs and events.
pub(crate) fn quote(value: &str) -> String {
    match value.char_indices().nth(QUOTE_LIMIT) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

/// Parses the workspace-gc annotations, ignoring every other key.
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<ClaimAnnotations, AnnotationError> {
    // A misspelt key (`…/kep`) must not silently lose its meaning: it keeps the claim too.
    if let Some(key) = annotations.keys().find(|key| {
        key.starts_with(PREFIX)
            && ![KEEP, TTL, EXPIRES, REVOKED_UNDER_PREFIX].contains(&key.as_str())
    }) {
        return Err(AnnotationError {
            key: "workspace-gc.mlops.dev/*",
            value: quote(key),
            expected: format!(
                "an unknown workspace-gc annotation; expected {KEEP}, {TTL} or {EXPIRES}"
            ),
        });
    }
    let keep = match annotations.get(KEEP) {
        None => false,
        Some(value) => {
            boolean(value).ok_or_else(|| AnnotationError::new(KEEP, value, EXPECTED_BOOLEAN))?
        }
    };
    let ttl = annotations.get(TTL).map(|v| parse_ttl(v)).transpose()?;
    let expires = annotations
        .get(EXPIRES)
        .map(|v| parse_expires(v))
        .transpose()?;
    Ok(ClaimAnnotations { keep, ttl, expires })
}

/// What a boolean annotation must be, for errors.
pub(crate) const EXPECTED_BOOLEAN: &str = "expected \"true\" or \"false\" (lowercase, no spaces)";

/// A boolean annotation, on a claim or a Namespace: exactly `"true"` or `"false"`. Nothing
/// else is guessed at (`"False"`, `"yes"`, `" true"`): a value not understood keeps claims.
pub(crate) fn boolean(value: &str) -> Option<bool> {
    match value {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn parse_ttl(value: &str) -> Result<Duration, AnnotationError> {
    let std = humantime::parse_duration(value.trim()).map_err(|e| {
        // humantime quotes an unknown unit verbatim, however long: bound it like the value,
        // or an event explaining the error exceeds the Events API's 1024 bytes and is refused.
        let why = quote(&e.to_string());
        AnnotationError::new(
            TTL,
            value,
            format!("expected a duration like \"2h\" ({why})"),
        )
    })?;
    Duration::from_std(std)
        .map_err(|_| AnnotationError::new(TTL, value, "the duration is out of range"))
}

fn parse_expires(value: &str) -> Result<DateTime<Utc>, AnnotationError> {
    DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            AnnotationError::new(
                EXPIRES,
                value,
                format!("expected an RFC 3339 time like \"2026-12-01T00:00:00Z\" ({e})"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn with(key: &str, value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_owned(), value.to_owned())])
    }

    #[test]
    fn absent_annotations_parse_to_defaults() {
        assert_eq!(parse(&BTreeMap::new()), Ok(ClaimAnnotations::default()));
    }

    #[test]
    fn valid_values_parse() {
        assert!(parse(&with(KEEP, "true")).unwrap().keep);
        assert!(!parse(&with(KEEP, "false")).unwrap().keep);
        assert_eq!(
            parse(&with(TTL, "90m")).unwrap().ttl,
            Some(Duration::minutes(90))
        );
        assert_eq!(
            parse(&with(EXPIRES, "2026-12-01T10:00:00+02:00"))
                .unwrap()
                .expires
                .unwrap()
                .to_rfc3339(),
            "2026-12-01T08:00:00+00:00"
        );
    }

    #[test]
    fn invalid_values_are_errors_naming_the_key() {
        for (key, value) in [
            (KEEP, "yes"),
            (KEEP, "TRUE"),
            (KEEP, "False"),
            (KEEP, " true"),
            (KEEP, "1"),
            (TTL, "soon"),
            (TTL, "-1h"),
            (TTL, "99999999999999999999y"),
            (EXPIRES, "tomorrow"),
            (EXPIRES, "2026-12-01"),
        ] {
            let err = parse(&with(key, value)).unwrap_err();
            assert_eq!(err.key, key, "{value}");
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn unknown_keys_under_our_prefix_are_errors() {
        let err = parse(&with("workspace-gc.mlops.dev/kep", "true")).unwrap_err();
        assert!(
            err.to_string().contains("workspace-gc.mlops.dev/kep"),
            "{err}"
        );
        assert!(parse(&with("example.com/keep", "true")).is_ok());
    }

    /// The revocation decides nothing, under the key written now and the one versions before
    /// wrote under the prefix; the key written now is outside the prefix, so that a version
    /// from before the revocation, which refuses any unknown key under it, ignores it.
    #[test]
    fn the_revocation_is_known_under_either_key_and_written_outside_the_prefix() {
        use crate::contract::annotations::REVOKED;
        for key in [REVOKED, REVOKED_UNDER_PREFIX] {
            assert_eq!(
                parse(&with(key, "4711")),
                Ok(ClaimAnnotations::default()),
                "{key}"
            );
        }
        assert!(!REVOKED.starts_with(PREFIX), "{REVOKED}");
    }

    #[test]
    fn huge_values_are_quoted_shortened() {
        let value = "é".repeat(10_000);
        let err = parse(&with(TTL, &value)).unwrap_err();
        assert_eq!(err.value.chars().count(), QUOTE_LIMIT + 1);
        assert!(err.to_string().len() < 400);
        // A number then a huge unknown unit, which humantime's message quotes in full.
        let err = parse(&with(TTL, &format!("1{}", "x".repeat(10_000)))).unwrap_err();
        assert!(err.to_string().len() < 400, "{}", err.to_string().len());
    }

    proptest! {
        #[test]
        fn arbitrary_values_never_panic(key in prop::sample::select(vec![KEEP, TTL, EXPIRES]), value in ".*") {
            let _ = parse(&with(key, &value));
        }
    }
}
