//! A namespace's own policy: annotations on the Namespace choose when its claims become due,
//! within the bounds the cluster's configuration sets, or switch collection off there.
//!
//! A setting only chooses *when* a claim becomes due: every protection of `policy::decide`
//! still comes first. A workspace-gc annotation the daemon does not understand (a value that
//! does not parse, an unknown key, a value outside the bounds) keeps every claim of the
//! namespace until it is fixed (`invalid-namespace-policy`): guessing what it meant, or
//! falling back to the cluster's values, could delete what the namespace meant to keep.

use std::collections::BTreeMap;
use std::fmt;

use chrono::Duration;
use serde::Serialize;
use thiserror::Error;

use crate::contract::annotations::{
    NS_COLLECT, NS_KEEP_FAILED, NS_MAX_AGE, NS_ORPHAN_GRACE, NS_TTL_AFTER_FAILED,
    NS_TTL_AFTER_FINISHED, PREFIX,
};
use crate::decide::annotations::{EXPECTED_BOOLEAN, boolean, quote};
use crate::decide::facts::MAX_KEEP_FAILED;
use crate::decide::policy::{Collection, Decision, Policy, Reason};

/// Durations beyond this are typos (the configuration's own limit).
const MAX_DAYS: i64 = 100 * 365;

/// What the cluster lets a namespace set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// Whether a namespace may set a duration shorter than the cluster's.
    pub may_shorten: bool,
    /// A duration shorter than the cluster's must still be at least this long.
    pub min_ttl: Duration,
}

/// The cluster's policy and, when namespaces may refine it, the bounds they must keep within.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policies {
    pub cluster: Policy,
    /// `None`: namespace annotations are not read; the cluster's policy applies everywhere.
    pub namespaces: Option<Bounds>,
}

impl Policies {
    /// The cluster's policy everywhere.
    pub fn cluster_only(cluster: Policy) -> Self {
        Self {
            cluster,
            namespaces: None,
        }
    }

    /// The policy for a namespace whose workspace-gc annotations are `annotations`: `None`
    /// when they could not be read (its claims are then kept), `Some` of an empty map for a
    /// namespace without any.
    pub fn for_namespace(&self, annotations: Option<&BTreeMap<String, String>>) -> Effective {
        match (&self.namespaces, annotations) {
            (None, _) => Effective::cluster(&self.cluster),
            (Some(bounds), Some(annotations)) => effective(&self.cluster, bounds, annotations),
            (Some(_), None) => Effective {
                policy: Policy {
                    collection: Collection::Unknown,
                    ..self.cluster.clone()
                },
                source: PolicySource::default(),
                problems: Vec::new(),
            },
        }
    }
}

/// Where a claim's policy came from: the namespace annotations that changed the cluster's,
/// as written (trimmed). Empty: the cluster's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicySource {
    pub namespace: BTreeMap<String, String>,
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            return f.write_str("cluster");
        }
        let settings: Vec<String> = (self.namespace.iter())
            .map(|(key, value)| format!("{}={value}", key.trim_start_matches(PREFIX)))
            .collect();
        write!(f, "namespace {}", settings.join(","))
    }
}

/// A namespace's policy, where it came from, and the annotations not understood on the way
/// (when there are any, the policy's collection is [`Collection::Invalid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    pub policy: Policy,
    pub source: PolicySource,
    pub problems: Vec<Invalid>,
}

impl Effective {
    fn cluster(cluster: &Policy) -> Self {
        Self {
            policy: cluster.clone(),
            source: PolicySource::default(),
            problems: Vec::new(),
        }
    }

    /// `decision`, with the annotations not understood as its detail when they decided it.
    pub fn explain(&self, mut decision: Decision) -> Decision {
        if decision.verdict.reason() == Reason::InvalidNamespacePolicy {
            let problems: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
            decision.detail = Some(problems.join("; "));
        }
        decision
    }
}

/// A namespace annotation the daemon does not understand: every claim there is kept.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {key}={value:?} is not understood: {why}")]
pub struct Invalid {
    pub key: String,
    /// The value as given, shortened to a bounded length.
    pub value: String,
    pub why: String,
}

impl Invalid {
    fn new(key: &str, value: &str, why: impl Into<String>) -> Self {
        Self {
            key: quote(key),
            value: quote(value),
            why: why.into(),
        }
    }
}

/// The policy field a namespace annotation sets.
type Field = fn(&mut Policy) -> &mut Duration;

/// The durations a namespace may set, each with the policy field it sets.
const DURATIONS: [(&str, Field); 4] = [
    (NS_TTL_AFTER_FINISHED, |p| &mut p.ttl_after_finished),
    (NS_TTL_AFTER_FAILED, |p| &mut p.ttl_after_failed),
    (NS_ORPHAN_GRACE, |p| &mut p.orphan_grace),
    (NS_MAX_AGE, |p| &mut p.max_age),
];

/// The namespace's policy: each valid setting within `bounds` replaces the cluster's, and any
/// setting not understood makes the collection [`Collection::Invalid`].
pub fn effective(
    cluster: &Policy,
    bounds: &Bounds,
    annotations: &BTreeMap<String, String>,
) -> Effective {
    let mut policy = cluster.clone();
    let mut source = PolicySource::default();
    let mut problems = Vec::new();
    for (key, raw) in annotations.iter().filter(|(k, _)| k.starts_with(PREFIX)) {
        if key == NS_COLLECT {
            match boolean(raw) {
                Some(false) => {
                    policy.collection = Collection::Off;
                    source.namespace.insert(key.clone(), raw.clone());
                }
                Some(true) => {}
                None => problems.push(Invalid::new(key, raw, EXPECTED_BOOLEAN)),
            }
            continue;
        }
        let value = raw.trim();
        if key == NS_KEEP_FAILED {
            match at_least(value, cluster.keep_failed) {
                Ok(keep) => {
                    policy.keep_failed = keep;
                    source.namespace.insert(key.clone(), value.to_owned());
                }
                Err(why) => problems.push(Invalid::new(key, raw, why)),
            }
            continue;
        }
        let Some((_, field)) = DURATIONS.iter().find(|(k, _)| k == key) else {
            let why = format!(
                "an unknown workspace-gc namespace annotation; expected {NS_TTL_AFTER_FINISHED}, \
                 {NS_TTL_AFTER_FAILED}, {NS_ORPHAN_GRACE}, {NS_MAX_AGE}, {NS_KEEP_FAILED} or \
                 {NS_COLLECT}"
            );
            problems.push(Invalid::new(key, raw, why));
            continue;
        };
        let theirs = *field(&mut policy.clone());
        match bounded(value, theirs, bounds) {
            Ok(duration) => {
                *field(&mut policy) = duration;
                source.namespace.insert(key.clone(), value.to_owned());
            }
            Err(why) => problems.push(Invalid::new(key, raw, why)),
        }
    }
    // As the configuration requires: max_age at least orphan_grace, which protects every claim
    // younger than it. The configuration keeps it, so the namespace set one of them.
    if policy.max_age < policy.orphan_grace {
        let key = [NS_MAX_AGE, NS_ORPHAN_GRACE]
            .into_iter()
            .find(|key| source.namespace.contains_key(*key))
            .unwrap_or(NS_MAX_AGE);
        let value = source.namespace.get(key).map_or("", String::as_str);
        problems.push(Invalid::new(
            key,
            value,
            "max-age would be shorter than orphan-grace",
        ));
    }
    if !problems.is_empty() {
        policy.collection = Collection::Invalid;
    }
    Effective {
        policy,
        source,
        problems,
    }
}

/// A namespace's `keep-failed`, if it parses: a namespace may keep more failed builds than the
/// cluster, never fewer, whatever the bounds say of durations.
fn at_least(value: &str, cluster: u32) -> Result<u32, String> {
    let keep: u32 = value.parse().map_err(|_| {
        format!("expected a whole number of failed builds to keep, like \"3\", at most {MAX_KEEP_FAILED}")
    })?;
    if keep > MAX_KEEP_FAILED {
        return Err(format!("more than {MAX_KEEP_FAILED} failed builds"));
    }
    if keep < cluster {
        return Err(format!(
            "fewer than the cluster's {cluster}; a namespace may keep more failed builds, never fewer"
        ));
    }
    Ok(keep)
}

/// A namespace's duration, if it parses and keeps within the bounds: longer than the
/// cluster's is always allowed (it keeps claims longer), shorter only as the bounds allow.
fn bounded(value: &str, cluster: Duration, bounds: &Bounds) -> Result<Duration, String> {
    let std = humantime::parse_duration(value).map_err(|e| {
        format!(
            "expected a duration like \"2h\" ({})",
            quote(&e.to_string())
        )
    })?;
    let duration = Duration::from_std(std)
        .ok()
        .filter(|d| *d <= Duration::days(MAX_DAYS))
        .ok_or("the duration is longer than 100 years")?;
    if duration >= cluster {
        return Ok(duration);
    }
    let human = |d: Duration| humantime::format_duration(d.to_std().unwrap_or_default());
    if !bounds.may_shorten {
        return Err(format!(
            "shorter than the cluster's {}, and namespaces may not shorten it",
            human(cluster)
        ));
    }
    if duration < bounds.min_ttl || duration.is_zero() {
        return Err(format!(
            "shorter than the cluster's minimum for namespaces, {}",
            human(bounds.min_ttl)
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::policy::Verdict;
    use proptest::prelude::*;

    fn bounds(may_shorten: bool) -> Bounds {
        Bounds {
            may_shorten,
            min_ttl: Duration::minutes(10),
        }
    }

    fn with(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn valid_settings_replace_the_clusters() {
        let got = effective(
            &Policy::default(),
            &bounds(false),
            &with(&[
                (NS_TTL_AFTER_FINISHED, "2h"),
                (NS_TTL_AFTER_FAILED, " 3d "),
                (NS_MAX_AGE, "30d"),
                (NS_COLLECT, "true"),
                ("example.com/other", "x"),
            ]),
        );
        assert_eq!(got.problems, []);
        assert_eq!(got.policy.ttl_after_finished, Duration::hours(2));
        assert_eq!(got.policy.ttl_after_failed, Duration::days(3));
        assert_eq!(got.policy.max_age, Duration::days(30));
        assert_eq!(got.policy.orphan_grace, Policy::default().orphan_grace);
        assert_eq!(got.policy.collection, Collection::On);
        assert_eq!(
            got.source.to_string(),
            "namespace max-age=30d,ttl-after-failed=3d,ttl-after-finished=2h"
        );
        let off = effective(
            &Policy::default(),
            &bounds(false),
            &with(&[(NS_COLLECT, "false")]),
        );
        assert_eq!(off.policy.collection, Collection::Off);
        assert_eq!(off.source.to_string(), "namespace collect=false");
    }

    #[test]
    fn settings_not_understood_keep_every_claim() {
        for (may_shorten, key, value, why) in [
            (false, NS_TTL_AFTER_FINISHED, "5m", "may not shorten"),
            (
                true,
                NS_TTL_AFTER_FINISHED,
                "5m",
                "minimum for namespaces, 10m",
            ),
            (true, NS_ORPHAN_GRACE, "0s", "minimum"),
            (true, NS_TTL_AFTER_FAILED, "soon", "expected a duration"),
            (true, NS_TTL_AFTER_FINISHED, "P7D", "expected a duration"),
            (true, NS_MAX_AGE, "-1d", "expected a duration"),
            (true, NS_MAX_AGE, "1000y", "longer than 100 years"),
            (true, NS_COLLECT, "no", EXPECTED_BOOLEAN),
            // How Helm, Ansible or Python may render a boolean: not guessed at.
            (true, NS_COLLECT, "False", EXPECTED_BOOLEAN),
            (true, NS_COLLECT, "TRUE", EXPECTED_BOOLEAN),
            (true, NS_COLLECT, " false", EXPECTED_BOOLEAN),
            (true, "workspace-gc.mlops.dev/keep", "true", "unknown"),
            (
                true,
                "workspace-gc.mlops.dev/ttl-after-finish",
                "2h",
                "unknown",
            ),
            (
                true,
                NS_MAX_AGE,
                "11m",
                "max-age would be shorter than orphan-grace",
            ),
        ] {
            let mut annotations = with(&[(NS_ORPHAN_GRACE, "1h")]);
            annotations.insert(key.to_owned(), value.to_owned());
            let got = effective(&Policy::default(), &bounds(may_shorten), &annotations);
            assert_eq!(got.policy.collection, Collection::Invalid, "{key}={value}");
            let problem = got.problems.iter().find(|p| p.key == key);
            let problem = problem.unwrap_or_else(|| panic!("{key}={value}: {got:?}"));
            assert!(problem.to_string().contains(why), "{problem}");
        }
        // Switching collection off does not hide a mistake beside it.
        let both = effective(
            &Policy::default(),
            &bounds(true),
            &with(&[(NS_COLLECT, "false"), (NS_MAX_AGE, "soon")]),
        );
        assert_eq!(both.policy.collection, Collection::Invalid);
        let shorter = effective(
            &Policy::default(),
            &bounds(true),
            &with(&[(NS_TTL_AFTER_FINISHED, "10m")]),
        );
        assert_eq!(shorter.problems, []);
        assert_eq!(shorter.policy.ttl_after_finished, Duration::minutes(10));
        assert_eq!(shorter.policy.collection, Collection::On);
    }

    #[test]
    fn a_namespace_may_keep_more_failed_builds_never_fewer() {
        let cluster = Policy {
            keep_failed: 2,
            ..Policy::default()
        };
        for may_shorten in [false, true] {
            let more = effective(
                &cluster,
                &bounds(may_shorten),
                &with(&[(NS_KEEP_FAILED, " 5 ")]),
            );
            assert_eq!(more.problems, []);
            assert_eq!(more.policy.keep_failed, 5);
            assert_eq!(more.source.to_string(), "namespace keep-failed=5");
            for (value, why) in [
                ("1", "never fewer"),
                ("0", "never fewer"),
                ("-1", "whole number"),
                ("three", "whole number"),
                ("1001", "more than 1000"),
            ] {
                let got = effective(
                    &cluster,
                    &bounds(may_shorten),
                    &with(&[(NS_KEEP_FAILED, value)]),
                );
                assert_eq!(got.policy.collection, Collection::Invalid, "{value}");
                assert!(
                    got.problems[0].to_string().contains(why),
                    "{:?}",
                    got.problems
                );
            }
        }
    }

    #[test]
    fn a_decision_by_settings_not_understood_names_them() {
        let got = effective(
            &Policy::default(),
            &bounds(true),
            &with(&[(NS_COLLECT, "False"), (NS_TTL_AFTER_FINISHED, "P7D")]),
        );
        let keep = |reason| Decision {
            verdict: Verdict::Keep {
                reason,
                recheck_at: None,
            },
            detail: None,
        };
        let detail = got.explain(keep(Reason::InvalidNamespacePolicy)).detail;
        let detail = detail.unwrap_or_default();
        assert!(detail.contains("collect=\"False\""), "{detail}");
        assert!(detail.contains("ttl-after-finished=\"P7D\""), "{detail}");
        assert_eq!(got.explain(keep(Reason::WithinTtl)).detail, None);
    }

    #[test]
    fn unreadable_namespaces_keep_their_claims() {
        let policies = Policies {
            cluster: Policy::default(),
            namespaces: Some(bounds(true)),
        };
        assert_eq!(
            policies.for_namespace(None).policy.collection,
            Collection::Unknown
        );
        let off = Policies::cluster_only(Policy::default());
        assert_eq!(off.for_namespace(None).policy, Policy::default());
    }

    proptest! {
        /// Whatever the annotations, a namespace never gets a duration shorter than both the
        /// cluster's and the bounds allow, and max_age stays at least orphan_grace where claims
        /// may be deleted.
        #[test]
        fn never_shorter_than_the_bounds(
            values in prop::collection::vec(("[0-9]{1,3}(s|m|h|d)|soon|", 0..5usize), 0..6),
            may_shorten in any::<bool>(),
        ) {
            let keys = [NS_TTL_AFTER_FINISHED, NS_TTL_AFTER_FAILED, NS_ORPHAN_GRACE, NS_MAX_AGE, NS_COLLECT];
            let annotations: BTreeMap<String, String> =
                values.into_iter().map(|(v, k)| (keys[k].to_owned(), v)).collect();
            let cluster = Policy::default();
            let got = effective(&cluster, &bounds(may_shorten), &annotations);
            let floor = |theirs: Duration| if may_shorten { theirs.min(Duration::minutes(10)) } else { theirs };
            let p = &got.policy;
            prop_assert!(p.ttl_after_finished >= floor(cluster.ttl_after_finished));
            prop_assert!(p.ttl_after_failed >= floor(cluster.ttl_after_failed));
            prop_assert!(p.orphan_grace >= floor(cluster.orphan_grace));
            prop_assert!(p.max_age >= floor(cluster.max_age));
            // Or nothing is deleted there.
            prop_assert!(p.max_age >= p.orphan_grace || p.collection == Collection::Invalid);
        }

        /// No workspace-gc annotation is dropped silently: each one either counts, or is
        /// named as not understood and keeps every claim.
        #[test]
        fn every_annotation_counts_or_keeps_every_claim(
            values in prop::collection::vec(("[0-9]{1,3}(s|m|h|d)|P7D|soon|true|false|False| false|", 0..7usize), 0..6),
            may_shorten in any::<bool>(),
        ) {
            let keys = [NS_TTL_AFTER_FINISHED, NS_TTL_AFTER_FAILED, NS_ORPHAN_GRACE, NS_MAX_AGE, NS_COLLECT, "workspace-gc.mlops.dev/colect", "example.com/collect"];
            let annotations: BTreeMap<String, String> =
                values.into_iter().map(|(v, k)| (keys[k].to_owned(), v)).collect();
            let got = effective(&Policy::default(), &bounds(may_shorten), &annotations);
            prop_assert_eq!(got.problems.is_empty(), got.policy.collection != Collection::Invalid);
            for (key, value) in annotations.iter().filter(|(k, _)| k.starts_with(PREFIX)) {
                let counts = got.source.namespace.contains_key(key)
                    || (key == NS_COLLECT && value == "true");
                let named = got.problems.iter().any(|p| &p.key == key);
                prop_assert!(counts || named, "{}={:?} dropped: {:?}", key, value, got);
            }
        }
    }
}
