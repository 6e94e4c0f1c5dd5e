//! The rounds of pressure as written to the Lease with each delete, and read back by the
//! replica that wins it next, so a restart or a hand-over resumes a round; what cannot be
//! trusted puts pressure deletes in doubt for [`DOUBT`]. Apart from the rounds' accounting
//! because it is only their encoding, and its checks of what comes back.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Count, Deleting, Resource, Round, Rounds};
use crate::decide::facts::ObjectKey;

/// How long a round read back from the Lease that could not be trusted holds pressure deletes
/// back in a namespace whose quotas show no recount: kube-controller-manager's default
/// `--resource-quota-sync-period`, by which every quota has been recounted at least once.
pub const DOUBT: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    #[error("the quota rounds on the Lease do not parse: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("the quota rounds on the Lease are not plausible: {0}")]
    Implausible(String),
}

impl Rounds {
    /// The rounds as written to the Lease with each delete (`annotations::QUOTA_ROUNDS`).
    pub fn to_annotation(&self) -> String {
        let saved = Saved {
            rounds: (self.namespaces.iter())
                .map(|(namespace, round)| (namespace.clone(), SavedRound::of(round)))
                .collect(),
            doubt_until: self
                .doubt
                .as_ref()
                .map(|(until, _)| until.timestamp_millis()),
        };
        serde_json::to_string(&saved).unwrap_or_default()
    }

    /// Takes over the rounds found on the Lease just won (`None`: there were none). What does
    /// not parse or is not plausible puts every namespace in doubt for [`DOUBT`], so a
    /// round it may have held cannot be forgotten into one delete too many.
    pub fn recover(&mut self, found: Option<&str>, now: DateTime<Utc>) -> Result<(), RoundsError> {
        self.namespaces.clear();
        self.doubt = None;
        let Some(found) = found else {
            return Ok(());
        };
        match Saved::parse(found, now) {
            Ok((namespaces, doubt_until)) => {
                self.namespaces = namespaces;
                self.doubt = doubt_until.map(|until| (until, BTreeSet::new()));
                Ok(())
            }
            Err(error) => {
                self.doubt = Some((now + DOUBT, BTreeSet::new()));
                Err(error)
            }
        }
    }
}

/// What of the rounds goes on the Lease. Small: a round holds its deletes only until they
/// leave the cache; then they are amounts per quota resource.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Saved {
    rounds: BTreeMap<String, SavedRound>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    doubt_until: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRound {
    pressed: Vec<(String, String)>,
    sent: Vec<SavedSent>,
    counts: Vec<SavedCount>,
    warned: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSent {
    name: String,
    uid: String,
    bytes: Option<u64>,
    class: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedCount {
    quota: String,
    resource: String,
    used: u64,
    owed: u64,
    spare: u64,
}

impl SavedRound {
    fn of(round: &Round) -> Self {
        SavedRound {
            pressed: (round.pressed.iter())
                .map(|(uid, resource)| (uid.clone(), resource.to_string()))
                .collect(),
            sent: (round.sent.iter())
                .map(|s| SavedSent {
                    name: s.key.name.clone(),
                    uid: s.uid.clone(),
                    bytes: s.bytes,
                    class: s.class.clone(),
                })
                .collect(),
            counts: (round.counts.iter())
                .map(|((uid, resource), count)| SavedCount {
                    quota: uid.clone(),
                    resource: resource.to_string(),
                    used: count.used,
                    owed: count.owed,
                    spare: count.spare,
                })
                .collect(),
            warned: round.warned,
        }
    }

    fn round(self, namespace: &str) -> Result<Round, RoundsError> {
        let implausible = |what: &str| RoundsError::Implausible(format!("{namespace}: {what}"));
        let resource = |name: &str| Resource::parse(name).ok_or_else(|| implausible(name));
        let uid = |uid: String| {
            if uid.is_empty() {
                Err(implausible("an empty uid"))
            } else {
                Ok(uid)
            }
        };
        let mut round = Round {
            warned: self.warned,
            ..Round::default()
        };
        for (quota, name) in self.pressed {
            round.pressed.insert((uid(quota)?, resource(&name)?));
        }
        for s in self.sent {
            if s.name.is_empty() {
                return Err(implausible("an empty claim name"));
            }
            round.sent.push(Deleting {
                key: ObjectKey::new(namespace, &s.name),
                uid: uid(s.uid)?,
                bytes: s.bytes,
                class: s.class,
            });
        }
        for c in self.counts {
            let gauge = (uid(c.quota)?, resource(&c.resource)?);
            let count = Count {
                used: c.used,
                owed: c.owed,
                spare: c.spare,
            };
            if round.counts.insert(gauge, count).is_some() {
                return Err(implausible("a quota resource counted twice"));
            }
        }
        Ok(round)
    }
}

/// The rounds read back from the Lease, and until when they are in doubt.
type Recovered = (BTreeMap<String, Round>, Option<DateTime<Utc>>);

impl Saved {
    fn parse(found: &str, now: DateTime<Utc>) -> Result<Recovered, RoundsError> {
        let saved: Saved = serde_json::from_str(found)?;
        let mut namespaces = BTreeMap::new();
        for (namespace, round) in saved.rounds {
            if namespace.is_empty() {
                return Err(RoundsError::Implausible("an empty namespace".into()));
            }
            let round = round.round(&namespace)?;
            namespaces.insert(namespace, round);
        }
        // A doubt never lasts longer than it could have when it began.
        let doubt_until = saved
            .doubt_until
            .map(|millis| {
                DateTime::from_timestamp_millis(millis)
                    .filter(|until| *until <= now + DOUBT)
                    .ok_or_else(|| RoundsError::Implausible(format!("doubt until {millis}")))
            })
            .transpose()?
            .filter(|until| now < *until);
        Ok((namespaces, doubt_until))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{GI, WATERS, names, present, quota, t, victims, within_ttl};
    use super::*;
    use crate::decide::quota::{Candidate, Resource};

    #[test]
    fn rounds_on_the_lease_that_cannot_be_trusted_hold_pressure_back() {
        let claims: Vec<Candidate> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
        let q = |used| quota(vec![(Resource::Storage, 6 * GI, used * GI)]);
        let garbage = [
            "not json",
            r#"{"rounds":{"ml":{"pressed":[["q1","requests.cpu"]],"sent":[],"counts":[],"warned":false}}}"#,
            r#"{"rounds":{},"doubtUntil":9223372036854775807}"#,
            r#"{"rounds":{"ml":{"pressed":[],"sent":[{"name":"","uid":"u","bytes":1,"class":null}],"counts":[],"warned":false}}}"#,
            r#"{"rounds":{},"extra":1}"#,
        ];
        for found in garbage {
            let mut rounds = Rounds::default();
            assert!(rounds.recover(Some(found), t(0)).is_err(), "{found}");
            rounds.observe("ml", &[q(6)], &present(&claims, &[]), WATERS);
            assert!(victims(&rounds, &[q(6)], &claims).is_empty(), "{found}");
            // After DOUBT, or once a recount of the namespace was seen, pressure acts again.
            let later = rounds.plan("ml", &[q(6)], &claims, WATERS, t(0) + DOUBT);
            assert_eq!(names(&later.victims), ["c5", "c4"], "{found}");
            rounds.observe("ml", &[q(5)], &present(&claims, &[]), WATERS);
            assert_eq!(victims(&rounds, &[q(5)], &claims), ["c5"], "{found}");
            // The doubt itself goes on the Lease, and comes back.
            let mut again = Rounds::default();
            again.recover(Some(&rounds.to_annotation()), t(1)).unwrap();
            let other = rounds.plan("other", &[q(6)], &claims, WATERS, t(1));
            let other_again = again.plan("other", &[q(6)], &claims, WATERS, t(1));
            assert!(other.victims.is_empty() && other_again.victims.is_empty());
        }
    }
}
