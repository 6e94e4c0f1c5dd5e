//! The choice under pressure: which resources of a namespace's quotas are pressed in its
//! round, and which finished claims to delete, oldest completion first, until each is projected
//! at or below low water. Apart from the round's accounting ([`Round`]), whose projection of
//! `used` it reads, because this is the policy and that the bookkeeping.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Candidate, QuotaEntry, Resource, Round, Waters, ratio};
use crate::decide::facts::ObjectKey;

/// One quota resource under pressure: it reached high water in this round, or is at it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pressure {
    pub quota: ObjectKey,
    pub quota_uid: String,
    pub resource: Resource,
    pub used: u64,
    pub hard: u64,
    /// `used` less what the round deleted and this quota has not recounted yet, and, in a
    /// plan's `unrelieved`, less its victims.
    pub projected: u64,
}

impl Pressure {
    pub fn ratio(&self) -> f64 {
        ratio(self.used, self.hard)
    }
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quota {} {} at {:.0}% ({} of {})",
            self.quota.name,
            self.resource,
            self.ratio() * 100.0,
            self.used,
            self.hard
        )
    }
}

/// What pressure asks for in one namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Every resource under pressure; empty when there is none.
    pub pressed: Vec<Pressure>,
    /// The claims to delete, oldest completion first.
    pub victims: Vec<ObjectKey>,
    /// Resources still projected at or above high water with every victim deleted: nothing
    /// more may be deleted, and pressure remains.
    pub unrelieved: Vec<Pressure>,
}

/// The resources of one namespace's quotas under pressure in its `round`: what a plan is for.
/// It reads no claim, so a namespace without pressure (nearly all, nearly always) costs a look
/// at its quotas, not at each of its claims.
pub fn pressure(quotas: &[QuotaEntry], round: &Round, waters: Waters) -> Vec<Pressure> {
    quotas
        .iter()
        .flat_map(|quota| quota.limits.iter().map(move |limit| (quota, limit)))
        .filter_map(|(quota, limit)| {
            let projected = round.projected(&quota.uid, limit);
            let gauge = (quota.uid.clone(), limit.resource.clone());
            let pressed = round.pressed.contains(&gauge) || waters.pressed(projected, limit.hard);
            pressed.then(|| Pressure {
                quota: quota.key.clone(),
                quota_uid: quota.uid.clone(),
                resource: limit.resource.clone(),
                used: limit.used,
                hard: limit.hard,
                projected,
            })
        })
        .collect()
}

/// Chooses the claims of one namespace to delete under pressure, given its `round` (the
/// default for an instant's plan, as the audit makes). What the round deleted and a quota has
/// not recounted is subtracted from that quota's `used`, and never chosen again; a resource
/// that reached high water in the round stays pressed until projected at or below low water.
pub fn plan(quotas: &[QuotaEntry], claims: &[Candidate], round: &Round, waters: Waters) -> Plan {
    let pressed = pressure(quotas, round, waters);
    if pressed.is_empty() {
        return Plan::default();
    }
    // A recount seen before the claims it recounted left the cache: they are subtracted twice
    // until they do, a moment later; a plan now could take a claim the exact one would not.
    if round.counts.values().any(|count| count.spare > 0) {
        return Plan {
            pressed,
            ..Plan::default()
        };
    }
    let mut candidates: Vec<(DateTime<Utc>, &Candidate)> = claims
        .iter()
        .filter(|claim| !round.sent.iter().any(|s| s.uid == claim.uid))
        .filter_map(|claim| Some((claim.eligible()?, claim)))
        .collect();
    candidates.sort_by(|(a, x), (b, y)| (a, &x.key).cmp(&(b, &y.key)));

    let mut projected: Vec<u64> = pressed.iter().map(|p| p.projected).collect();
    let mut victims = Vec::new();
    for (_, claim) in candidates {
        let taken = |p: &Pressure| p.resource.taken_by(claim.bytes, claim.class.as_deref());
        let still_high = |(p, used): (&Pressure, &u64)| !waters.relieved(*used, p.hard);
        if !pressed.iter().zip(&projected).any(still_high) {
            break;
        }
        let helps = pressed
            .iter()
            .zip(&projected)
            .any(|(p, used)| still_high((p, used)) && taken(p) > 0);
        if !helps {
            continue;
        }
        for (p, used) in pressed.iter().zip(projected.iter_mut()) {
            *used = used.saturating_sub(taken(p));
        }
        victims.push(claim);
    }
    // A later victim may relieve what an earlier one was taken for (a claim of a class counts
    // toward both the class's resource and the namespace's): newest first, a victim whose
    // resources would all stay at or below low water without it is not needed. So the plan
    // is the same whichever of its claims is deleted first.
    for i in (0..victims.len()).rev() {
        let claim = victims[i];
        let taken = |p: &Pressure| p.resource.taken_by(claim.bytes, claim.class.as_deref());
        let needed = pressed.iter().zip(&projected).any(|(p, used)| {
            taken(p) > 0 && !waters.relieved(used.saturating_add(taken(p)), p.hard)
        });
        if !needed {
            for (p, used) in pressed.iter().zip(projected.iter_mut()) {
                *used = used.saturating_add(taken(p));
            }
            victims.remove(i);
        }
    }
    let victims = victims.into_iter().map(|c| c.key.clone()).collect();
    let unrelieved = pressed
        .iter()
        .zip(&projected)
        .filter(|(p, used)| waters.pressed(**used, p.hard))
        .map(|(p, used)| Pressure {
            projected: *used,
            ..p.clone()
        })
        .collect();
    Plan {
        pressed,
        victims,
        unrelieved,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{
        GI, WATERS, any_claim, any_quotas, any_waters, names, quota, unique, within_ttl,
    };
    use super::*;
    use crate::decide::policy::{Reason, Verdict};
    use crate::decide::quota::Deleting;

    #[test]
    fn takes_the_oldest_completions_until_low_water() {
        // 10 claims of 1Gi in a 10Gi quota: two must go to reach 80%.
        let q = quota(vec![(Resource::Storage, 10 * GI, 10 * GI)]);
        let mut claims: Vec<Candidate> = (0..4).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
        let mut running = within_ttl("running", -100);
        running.verdict = Verdict::Keep {
            reason: Reason::OwnerRunning,
            recheck_at: None,
        };
        let mut kept = within_ttl("kept", -100);
        kept.verdict = Verdict::Protected {
            reason: Reason::KeepAnnotation,
        };
        claims.extend([running, kept]);
        let plan = plan(&[q], &claims, &Round::default(), WATERS);
        assert_eq!(names(&plan.victims), ["c3", "c2"]);
        assert!(plan.unrelieved.is_empty());
        assert_eq!(plan.pressed.len(), 1);
    }

    #[test]
    fn what_the_round_deleted_counts_and_is_not_chosen_again() {
        let q = quota(vec![(Resource::Storage, 10 * GI, 10 * GI)]);
        let claims = vec![
            within_ttl("a", -3),
            within_ttl("b", -2),
            within_ttl("c", -1),
        ];
        let round = Round {
            sent: vec![Deleting {
                key: ObjectKey::new("ml", "a"),
                uid: "a-uid".into(),
                bytes: Some(GI),
                class: None,
            }],
            ..Round::default()
        };
        assert_eq!(names(&plan(&[q], &claims, &round, WATERS).victims), ["b"]);
    }

    #[test]
    fn class_scoped_pressure_takes_only_claims_of_that_class() {
        let fast = |name: &str, at| Candidate {
            class: Some("fast".into()),
            ..within_ttl(name, at)
        };
        let q = quota(vec![(Resource::ClassClaims("fast".into()), 4, 4)]);
        let claims = vec![within_ttl("classless", -10), fast("f1", -2), fast("f2", -1)];
        let plan = plan(&[q], &claims, &Round::default(), WATERS);
        // 4 of 4 claims: one must go to reach 80%; the classless claim does not count.
        assert_eq!(names(&plan.victims), ["f1"]);
    }

    #[test]
    fn pressure_with_nothing_more_to_take_is_unrelieved() {
        // 10 of 10 claims, one finished: deleting it leaves 90%, still at high water.
        let q = quota(vec![(Resource::Claims, 10, 10)]);
        let plan = plan(&[q], &[within_ttl("a", -1)], &Round::default(), WATERS);
        assert_eq!(names(&plan.victims), ["a"]);
        assert_eq!(plan.unrelieved.len(), 1);
        assert_eq!(plan.unrelieved[0].projected, 9);
        assert_eq!(
            plan.unrelieved[0].to_string(),
            "quota storage persistentvolumeclaims at 100% (10 of 10)"
        );
    }

    /// Quotas, claims, what this round already deleted, and the waters.
    #[derive(Debug)]
    struct Scene {
        quotas: Vec<QuotaEntry>,
        claims: Vec<Candidate>,
        sent: Vec<Deleting>,
        waters: Waters,
    }

    impl Scene {
        fn plan(&self) -> Plan {
            let round = Round {
                sent: self.sent.clone(),
                ..Round::default()
            };
            plan(&self.quotas, &self.claims, &round, self.waters)
        }

        fn claim(&self, key: &ObjectKey) -> &Candidate {
            self.claims.iter().find(|c| &c.key == key).unwrap()
        }
    }

    fn any_scene() -> impl Strategy<Value = Scene> {
        let claims = prop::collection::vec(any_claim(), 0..30).prop_map(unique);
        (any_quotas(), claims, any_waters(), any::<u32>()).prop_map(
            |(quotas, claims, waters, picks)| {
                // Some of the claims were deleted earlier in this round (still in the cache).
                let sent = (claims.iter().enumerate())
                    .filter(|(i, _)| picks >> (i % 32) & 1 == 1 && i % 4 == 0)
                    .map(|(_, c)| Deleting {
                        key: c.key.clone(),
                        uid: c.uid.clone(),
                        bytes: c.bytes,
                        class: c.class.clone(),
                    })
                    .collect();
                Scene {
                    quotas,
                    claims,
                    sent,
                    waters,
                }
            },
        )
    }

    proptest! {
        #[test]
        fn only_claims_within_their_ttl_and_not_yet_deleted_are_taken(scene in any_scene()) {
            for victim in &scene.plan().victims {
                let claim = scene.claim(victim);
                let within_ttl = matches!(
                    claim.verdict,
                    Verdict::Keep { reason: Reason::WithinTtl, .. }
                );
                prop_assert!(within_ttl, "{claim:?}");
                prop_assert!(claim.completed.is_some(), "{claim:?}");
                prop_assert!(!scene.sent.iter().any(|s| s.uid == claim.uid), "{claim:?}");
            }
        }

        #[test]
        fn nothing_is_taken_without_pressure(scene in any_scene()) {
            let plan = scene.plan();
            if !scene.waters.under_pressure(&scene.quotas) {
                prop_assert!(plan.victims.is_empty());
                prop_assert!(plan.pressed.is_empty() && plan.unrelieved.is_empty());
            }
        }

        #[test]
        fn oldest_completions_go_first_and_it_stops_at_low_water(scene in any_scene()) {
            let (plan, waters) = (scene.plan(), scene.waters);
            let completed = |key: &ObjectKey| scene.claim(key).completed.unwrap();
            // Oldest first: every victim finished no later than the next one.
            for pair in plan.victims.windows(2) {
                prop_assert!(completed(&pair[0]) <= completed(&pair[1]));
            }
            // Each victim was needed: before it, some pressed resource it counts toward was
            // still projected above low water (what the round deleted already subtracted).
            let mut projected: Vec<u64> = plan.pressed.iter().map(|p| p.projected).collect();
            for victim in &plan.victims {
                let claim = scene.claim(victim);
                let taken = |p: &Pressure| p.resource.taken_by(claim.bytes, claim.class.as_deref());
                let needed = plan.pressed.iter().zip(&projected).any(|(p, used)| {
                    !waters.relieved(*used, p.hard) && taken(p) > 0
                });
                prop_assert!(needed, "{victim} was not needed");
                for (p, used) in plan.pressed.iter().zip(projected.iter_mut()) {
                    *used = used.saturating_sub(taken(p));
                }
            }
            // It stops only at low water, or when no eligible claim is left that would help.
            let relieved = plan.pressed.iter().zip(&projected)
                .all(|(p, used)| waters.relieved(*used, p.hard));
            if !relieved {
                let left = scene.claims.iter().filter(|c| {
                    c.eligible().is_some()
                        && !plan.victims.contains(&c.key)
                        && !scene.sent.iter().any(|s| s.uid == c.uid)
                }).any(|c| plan.pressed.iter().zip(&projected).any(|(p, used)| {
                    !waters.relieved(*used, p.hard)
                        && p.resource.taken_by(c.bytes, c.class.as_deref()) > 0
                }));
                prop_assert!(!left, "an eligible claim that would help was left");
            }
            // Unrelieved is exactly what stays at high water.
            let still_high = plan.pressed.iter().zip(&projected)
                .filter(|(p, used)| waters.pressed(**used, p.hard)).count();
            prop_assert_eq!(plan.unrelieved.len(), still_high);
        }
    }
}
