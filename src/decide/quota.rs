//! Quota pressure: which finished workspaces to delete early when a namespace's storage quota
//! runs short, so the next build's claim is not refused. Pure: no I/O, no clock; the controller
//! passes in the quotas, the claims with their verdicts, and what it already deleted.
//!
//! A namespace is under pressure while, for any quota in it, `status.used / status.hard`
//! reaches `high_water` for one of the four resources claims count toward. Under pressure the
//! claims whose verdict is keep / `within-ttl` (every linked owner finished with a completion
//! time, nothing protects them) are taken oldest completion first, each only if it counts
//! toward a resource still above `low_water`, until every resource under pressure is projected
//! at or below `low_water × hard`. Nothing else is ever chosen.

use std::collections::HashMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::decide::facts::{ClaimFacts, Facts, ObjectKey};
use crate::decide::linking::{self, Lookup};
use crate::decide::policy::{self, Policy, Reason, Verdict};

/// The suffix of a class-scoped quota resource: `<class>.storageclass.storage.k8s.io/…`.
const CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";
const STORAGE: &str = "requests.storage";
const CLAIMS: &str = "persistentvolumeclaims";

/// A quota resource that build-workspace claims count toward.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// `requests.storage`: bytes requested by every claim.
    Storage,
    /// `persistentvolumeclaims`: the number of claims.
    Claims,
    /// `<class>.storageclass.storage.k8s.io/requests.storage`.
    ClassStorage(String),
    /// `<class>.storageclass.storage.k8s.io/persistentvolumeclaims`.
    ClassClaims(String),
}

/// A [`Resource`] without its class: the bounded `resource` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    Storage,
    Claims,
    ClassStorage,
    ClassClaims,
}

impl ResourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Storage => STORAGE,
            ResourceKind::Claims => CLAIMS,
            ResourceKind::ClassStorage => "storageclass.storage.k8s.io/requests.storage",
            ResourceKind::ClassClaims => "storageclass.storage.k8s.io/persistentvolumeclaims",
        }
    }
}

impl Resource {
    /// The resource a quota's resource name denotes, if claims count toward it.
    pub fn parse(name: &str) -> Option<Resource> {
        match name {
            STORAGE => return Some(Resource::Storage),
            CLAIMS => return Some(Resource::Claims),
            _ => {}
        }
        let (class, rest) = name.split_once(CLASS_SUFFIX)?;
        if class.is_empty() {
            return None;
        }
        match rest {
            STORAGE => Some(Resource::ClassStorage(class.to_owned())),
            CLAIMS => Some(Resource::ClassClaims(class.to_owned())),
            _ => None,
        }
    }

    pub fn kind(&self) -> ResourceKind {
        match self {
            Resource::Storage => ResourceKind::Storage,
            Resource::Claims => ResourceKind::Claims,
            Resource::ClassStorage(_) => ResourceKind::ClassStorage,
            Resource::ClassClaims(_) => ResourceKind::ClassClaims,
        }
    }

    /// How much of this resource a claim takes up, as the quota counts it: a claim of another
    /// class, or with no class, takes up none of a class-scoped resource. An unknown size
    /// counts as zero, so deleting such a claim never counts as relief.
    fn taken_by(&self, bytes: Option<u64>, class: Option<&str>) -> u64 {
        let in_class = |wanted: &str| class == Some(wanted);
        match self {
            Resource::Storage => bytes.unwrap_or(0),
            Resource::Claims => 1,
            Resource::ClassStorage(c) if in_class(c) => bytes.unwrap_or(0),
            Resource::ClassClaims(c) if in_class(c) => 1,
            Resource::ClassStorage(_) | Resource::ClassClaims(_) => 0,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Storage => f.write_str(STORAGE),
            Resource::Claims => f.write_str(CLAIMS),
            Resource::ClassStorage(class) => write!(f, "{class}{CLASS_SUFFIX}{STORAGE}"),
            Resource::ClassClaims(class) => write!(f, "{class}{CLASS_SUFFIX}{CLAIMS}"),
        }
    }
}

/// One resource of a quota: its `status.hard` and `status.used`, in bytes or claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub resource: Resource,
    pub hard: u64,
    pub used: u64,
}

impl Limit {
    pub fn ratio(&self) -> f64 {
        ratio(self.used, self.hard)
    }
}

/// `used / hard`; the conversion rounds only beyond 2^53 bytes, far past any quota.
#[allow(clippy::cast_precision_loss)]
fn ratio(used: u64, hard: u64) -> f64 {
    used as f64 / hard as f64
}

/// What the cache keeps of a ResourceQuota: the limits claims count toward. A quota with
/// scopes, a resource whose hard or used is missing or does not parse, and a hard of zero are
/// left out (see `resources::quota_entry`): what cannot be judged never causes a delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuotaEntry {
    pub key: ObjectKey,
    pub uid: String,
    pub limits: Vec<Limit>,
}

/// `quota.high_water` and `quota.low_water`, validated `0 < low < high <= 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waters {
    pub high: f64,
    pub low: f64,
}

impl Waters {
    fn pressed(&self, used: u64, hard: u64) -> bool {
        ratio(used, hard) >= self.high
    }

    fn relieved(&self, used: u64, hard: u64) -> bool {
        ratio(used, hard) <= self.low
    }

    /// Whether any limit of `quotas` has reached high water.
    pub fn under_pressure<'a>(&self, quotas: impl IntoIterator<Item = &'a QuotaEntry>) -> bool {
        quotas
            .into_iter()
            .flat_map(|quota| &quota.limits)
            .any(|limit| self.pressed(limit.used, limit.hard))
    }
}

/// A claim as pressure sees it: its verdict and what it takes up.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub key: ObjectKey,
    pub uid: String,
    pub verdict: Verdict,
    /// The latest completion time of its linked owners.
    pub completed: Option<DateTime<Utc>>,
    pub bytes: Option<u64>,
    pub class: Option<String>,
}

impl Claim {
    /// Each of `claims` (a namespace's), linked through `lookup` and decided at `now`.
    pub fn all_of<'a>(
        claims: impl IntoIterator<Item = &'a ClaimFacts>,
        lookup: &impl Lookup,
        policy: &Policy,
        now: DateTime<Utc>,
    ) -> Vec<Self> {
        claims
            .into_iter()
            .map(|claim| {
                let facts = linking::facts(claim, lookup);
                Claim::of(&facts, policy::decide(&facts, policy, now).verdict)
            })
            .collect()
    }

    pub fn of(facts: &Facts, verdict: Verdict) -> Self {
        Claim {
            key: facts.claim.key.clone(),
            uid: facts.claim.uid.clone(),
            verdict,
            completed: facts.latest_completion(),
            bytes: facts.claim.requested_bytes,
            class: facts.claim.storage_class.clone(),
        }
    }

    /// Only a claim whose build finished, with a completion time, less than its TTL ago may be
    /// taken early: every other verdict either deletes it anyway or must keep it.
    fn eligible(&self) -> Option<DateTime<Utc>> {
        match self.verdict {
            Verdict::Keep {
                reason: Reason::WithinTtl,
                ..
            } => self.completed,
            _ => None,
        }
    }
}

/// A claim deleted under pressure in the current round: the quota may still count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub key: ObjectKey,
    pub uid: String,
    pub bytes: Option<u64>,
    pub class: Option<String>,
}

impl Sent {
    pub fn of(claim: &ClaimFacts) -> Self {
        Sent {
            key: claim.key.clone(),
            uid: claim.uid.clone(),
            bytes: claim.requested_bytes,
            class: claim.storage_class.clone(),
        }
    }
}

/// One quota resource at or above high water.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pressure {
    pub quota: ObjectKey,
    pub quota_uid: String,
    pub resource: Resource,
    pub used: u64,
    pub hard: u64,
    /// `used` less what this round deleted, and, in a plan's `unrelieved`, less its victims.
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
    /// Every resource at or above high water; empty when there is no pressure.
    pub pressed: Vec<Pressure>,
    /// The claims to delete, oldest completion first.
    pub victims: Vec<ObjectKey>,
    /// Resources still projected at or above high water with every victim deleted: nothing
    /// more may be deleted, and pressure remains.
    pub unrelieved: Vec<Pressure>,
}

/// Chooses the claims of one namespace to delete under pressure. `sent` are the claims this
/// round already deleted: the quota may still count them, so they are subtracted from `used`
/// and never chosen again.
pub fn plan(quotas: &[QuotaEntry], claims: &[Claim], sent: &[Sent], waters: Waters) -> Plan {
    let pressed: Vec<Pressure> = quotas
        .iter()
        .flat_map(|quota| quota.limits.iter().map(move |limit| (quota, limit)))
        .filter(|(_, limit)| waters.pressed(limit.used, limit.hard))
        .map(|(quota, limit)| {
            let freed: u64 = sent
                .iter()
                .map(|s| limit.resource.taken_by(s.bytes, s.class.as_deref()))
                .sum();
            Pressure {
                quota: quota.key.clone(),
                quota_uid: quota.uid.clone(),
                resource: limit.resource.clone(),
                used: limit.used,
                hard: limit.hard,
                projected: limit.used.saturating_sub(freed),
            }
        })
        .collect();
    if pressed.is_empty() {
        return Plan::default();
    }
    let mut candidates: Vec<(DateTime<Utc>, &Claim)> = claims
        .iter()
        .filter(|claim| !sent.iter().any(|s| s.uid == claim.uid))
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
        victims.push(claim.key.clone());
    }
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

/// The rounds of pressure per namespace: what was deleted since pressure began, and whether
/// the warning that nothing more may be deleted was given. A round ends when no quota of the
/// namespace is at high water any more.
#[derive(Debug, Default)]
pub struct Rounds {
    namespaces: HashMap<String, Round>,
}

#[derive(Debug, Default)]
struct Round {
    sent: Vec<Sent>,
    warned: bool,
    /// The namespace's quotas when last observed, to tell a recount.
    quotas: Vec<QuotaEntry>,
}

impl Rounds {
    /// What this round deleted in `namespace`.
    pub fn sent(&self, namespace: &str) -> &[Sent] {
        self.namespaces
            .get(namespace)
            .map_or(&[], |round| &round.sent)
    }

    /// Records a delete about to be sent, before it is: a claim must never be gone from the
    /// cache without being counted here, or the next plan would take one more.
    pub fn record(&mut self, sent: Sent) {
        let round = self
            .namespaces
            .entry(sent.key.namespace.clone())
            .or_default();
        round.sent.retain(|s| s.uid != sent.uid);
        round.sent.push(sent);
    }

    /// Forgets a delete that did not happen.
    pub fn withdraw(&mut self, key: &ObjectKey, uid: &str) {
        if let Some(round) = self.namespaces.get_mut(&key.namespace) {
            round.sent.retain(|s| s.uid != uid);
        }
    }

    /// Whether to warn now that pressure remains with nothing more to delete: once a round.
    pub fn first_warning(&mut self, namespace: &str) -> bool {
        let round = self.namespaces.entry(namespace.to_owned()).or_default();
        !std::mem::replace(&mut round.warned, true)
    }

    /// Takes in the namespace's quotas after a change. No pressure ends the round. A used
    /// value that went down is the quota controller's recount (admission only adds), which no
    /// longer counts the claims gone from the cache (`present` says which are still there), so
    /// they stop being subtracted.
    pub fn observe(
        &mut self,
        namespace: &str,
        quotas: &[QuotaEntry],
        waters: Waters,
        present: impl Fn(&ObjectKey) -> bool,
    ) {
        if !waters.under_pressure(quotas) {
            self.namespaces.remove(namespace);
            return;
        }
        let round = self.namespaces.entry(namespace.to_owned()).or_default();
        if recounted(&round.quotas, quotas) {
            round.sent.retain(|s| present(&s.key));
        }
        round.quotas = quotas.to_vec();
    }
}

/// Whether some used value of `after` is lower than the same quota's in `before`.
fn recounted(before: &[QuotaEntry], after: &[QuotaEntry]) -> bool {
    after.iter().any(|quota| {
        let Some(old) = before.iter().find(|q| q.uid == quota.uid) else {
            return false;
        };
        quota.limits.iter().any(|limit| {
            old.limits
                .iter()
                .any(|o| o.resource == limit.resource && limit.used < o.used)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};
    use proptest::prelude::*;

    const GI: u64 = 1 << 30;
    const WATERS: Waters = Waters {
        high: 0.9,
        low: 0.8,
    };

    fn t(minutes: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap() + Duration::minutes(minutes)
    }

    fn quota(limits: Vec<(Resource, u64, u64)>) -> QuotaEntry {
        QuotaEntry {
            key: ObjectKey::new("ml", "storage"),
            uid: "q1".into(),
            limits: limits
                .into_iter()
                .map(|(resource, hard, used)| Limit {
                    resource,
                    hard,
                    used,
                })
                .collect(),
        }
    }

    fn within_ttl(name: &str, completed: i64) -> Claim {
        Claim {
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            verdict: Verdict::Keep {
                reason: Reason::WithinTtl,
                recheck_at: None,
            },
            completed: Some(t(completed)),
            bytes: Some(GI),
            class: None,
        }
    }

    fn names(keys: &[ObjectKey]) -> Vec<&str> {
        keys.iter().map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn resource_names_parse_and_print_back() {
        for name in [
            "requests.storage",
            "persistentvolumeclaims",
            "fast.storageclass.storage.k8s.io/requests.storage",
            "fast.storageclass.storage.k8s.io/persistentvolumeclaims",
        ] {
            assert_eq!(Resource::parse(name).unwrap().to_string(), name);
        }
        for name in [
            "requests.cpu",
            "pods",
            ".storageclass.storage.k8s.io/requests.storage",
            "fast.storageclass.storage.k8s.io/requests.cpu",
            "count/persistentvolumeclaims",
        ] {
            assert_eq!(Resource::parse(name), None, "{name}");
        }
    }

    #[test]
    fn takes_the_oldest_completions_until_low_water() {
        // 10 claims of 1Gi in a 10Gi quota: two must go to reach 80%.
        let q = quota(vec![(Resource::Storage, 10 * GI, 10 * GI)]);
        let mut claims: Vec<Claim> = (0..4).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
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
        let plan = plan(&[q], &claims, &[], WATERS);
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
        let sent = [Sent {
            key: ObjectKey::new("ml", "a"),
            uid: "a-uid".into(),
            bytes: Some(GI),
            class: None,
        }];
        assert_eq!(names(&plan(&[q], &claims, &sent, WATERS).victims), ["b"]);
    }

    #[test]
    fn class_scoped_pressure_takes_only_claims_of_that_class() {
        let fast = |name: &str, at| Claim {
            class: Some("fast".into()),
            ..within_ttl(name, at)
        };
        let q = quota(vec![(Resource::ClassClaims("fast".into()), 4, 4)]);
        let claims = vec![within_ttl("classless", -10), fast("f1", -2), fast("f2", -1)];
        let plan = plan(&[q], &claims, &[], WATERS);
        // 4 of 4 claims: one must go to reach 80%; the classless claim does not count.
        assert_eq!(names(&plan.victims), ["f1"]);
    }

    #[test]
    fn pressure_with_nothing_more_to_take_is_unrelieved() {
        // 10 of 10 claims, one finished: deleting it leaves 90%, still at high water.
        let q = quota(vec![(Resource::Claims, 10, 10)]);
        let plan = plan(&[q], &[within_ttl("a", -1)], &[], WATERS);
        assert_eq!(names(&plan.victims), ["a"]);
        assert_eq!(plan.unrelieved.len(), 1);
        assert_eq!(plan.unrelieved[0].projected, 9);
        assert_eq!(
            plan.unrelieved[0].to_string(),
            "quota storage persistentvolumeclaims at 100% (10 of 10)"
        );
    }

    #[test]
    fn a_round_ends_without_pressure_and_forgets_recounted_claims() {
        let mut rounds = Rounds::default();
        let high = quota(vec![(Resource::Claims, 10, 10)]);
        rounds.observe("ml", std::slice::from_ref(&high), WATERS, |_| true);
        let a = ClaimFacts::example("a");
        rounds.record(Sent::of(&a));
        assert!(rounds.first_warning("ml"));
        assert!(!rounds.first_warning("ml"));
        // A new claim admitted (used goes up): not a recount, `a` stays subtracted.
        rounds.observe("ml", std::slice::from_ref(&high), WATERS, |_| false);
        assert_eq!(rounds.sent("ml").len(), 1);
        // The controller's recount, with `a` gone from the cache: no longer subtracted.
        let recount = quota(vec![(Resource::Claims, 10, 9)]);
        rounds.observe("ml", std::slice::from_ref(&recount), WATERS, |_| false);
        assert!(rounds.sent("ml").is_empty());
        assert!(!rounds.first_warning("ml"), "still the same round");
        let low = quota(vec![(Resource::Claims, 10, 5)]);
        rounds.observe("ml", &[low], WATERS, |_| true);
        assert!(rounds.first_warning("ml"), "a new round warns again");
    }

    fn any_verdict() -> impl Strategy<Value = Verdict> {
        (0..Reason::ALL.len(), 0..3u8).prop_map(|(r, state)| {
            let reason = Reason::ALL[r];
            match state {
                0 => Verdict::Keep {
                    reason,
                    recheck_at: None,
                },
                1 => Verdict::Delete {
                    reason,
                    due_at: None,
                },
                _ => Verdict::Protected { reason },
            }
        })
    }

    fn any_claim() -> impl Strategy<Value = Claim> {
        (
            0..1000u32,
            any_verdict(),
            prop::option::weighted(0.9, -600..0i64),
            prop::option::weighted(0.9, 1..4u64),
            prop::option::of(prop::sample::select(vec!["fast", "slow"])),
            any::<bool>(),
        )
            .prop_map(|(id, verdict, completed, gib, class, likely)| Claim {
                key: ObjectKey::new("ml", &format!("c{id}")),
                uid: format!("u{id}"),
                // Most generated claims are within their TTL, so the interesting cases arise.
                verdict: if likely {
                    Verdict::Keep {
                        reason: Reason::WithinTtl,
                        recheck_at: None,
                    }
                } else {
                    verdict
                },
                completed: completed.map(t),
                bytes: gib.map(|g| g * GI),
                class: class.map(str::to_owned),
            })
    }

    fn any_resource() -> impl Strategy<Value = Resource> {
        prop_oneof![
            Just(Resource::Storage),
            Just(Resource::Claims),
            Just(Resource::ClassStorage("fast".into())),
            Just(Resource::ClassClaims("fast".into())),
        ]
    }

    fn any_quotas() -> impl Strategy<Value = Vec<QuotaEntry>> {
        prop::collection::vec((any_resource(), 1..40u64, 0..45u64), 1..4).prop_map(|limits| {
            vec![quota(
                limits
                    .into_iter()
                    .map(|(resource, hard, used)| {
                        let scale = match resource {
                            Resource::Storage | Resource::ClassStorage(_) => GI,
                            _ => 1,
                        };
                        (resource, hard * scale, used * scale)
                    })
                    .collect(),
            )]
        })
    }

    fn unique(claims: Vec<Claim>) -> Vec<Claim> {
        let mut seen = std::collections::HashSet::new();
        claims
            .into_iter()
            .filter(|c| seen.insert(c.uid.clone()))
            .collect()
    }

    fn any_waters() -> impl Strategy<Value = Waters> {
        (1..99u32, 1..100u32).prop_filter_map("low < high", |(low, high)| {
            (low < high).then(|| Waters {
                high: f64::from(high) / 100.0,
                low: f64::from(low) / 100.0,
            })
        })
    }

    /// Quotas, claims, what this round already deleted, and the waters.
    #[derive(Debug)]
    struct Scene {
        quotas: Vec<QuotaEntry>,
        claims: Vec<Claim>,
        sent: Vec<Sent>,
        waters: Waters,
    }

    impl Scene {
        fn plan(&self) -> Plan {
            plan(&self.quotas, &self.claims, &self.sent, self.waters)
        }

        fn claim(&self, key: &ObjectKey) -> &Claim {
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
                    .map(|(_, c)| Sent {
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
