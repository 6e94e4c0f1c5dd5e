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
//!
//! The outcome must not depend on when the quota controller recounts, one quota at a time: a
//! [`Round`] keeps, per quota resource, what left the cache and that quota has not yet been
//! seen to recount (its `used` went down by as much), subtracts it in the projection, and keeps
//! every resource that reached high water pressed until it is projected at or below low water.
//! The round is written to the Lease with each delete, so a restart or a hand-over resumes it.
//!
//! This file holds what a plan reads (quotas, claims, waters) and the rounds' accounting: what
//! a round owes each quota resource, and the projection it makes of `used`. Apart from it:
//! `plan.rs` (the choice itself, over a round's projection) and `lease.rs` (the rounds as written
//! to the Lease and read back after a hand-over).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::decide::facts::{ClaimFacts, Facts, ObjectKey};
use crate::decide::linking::{self, Lookup};
use crate::decide::policy::{self, Policy, Reason, Verdict};

mod lease;
mod plan;

pub use lease::{DOUBT, RoundsError};
pub use plan::{Plan, Pressure, plan, pressure};

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

/// What a pressure delete's live re-check plans over: the namespace's quotas as listed within
/// the re-check's bound, and its claims as cached then (present, and decided as candidates),
/// with the waters and the API server's time.
#[derive(Debug, Clone)]
pub struct LiveQuotas {
    pub quotas: Vec<QuotaEntry>,
    pub present: Vec<Present>,
    pub cached: Vec<Candidate>,
    pub waters: Waters,
    pub now: DateTime<Utc>,
}

/// A claim as pressure sees it, a candidate for an early delete: its verdict and what it takes
/// up.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub key: ObjectKey,
    pub uid: String,
    pub verdict: Verdict,
    /// The latest completion time of its linked owners.
    pub completed: Option<DateTime<Utc>>,
    pub bytes: Option<u64>,
    pub class: Option<String>,
}

impl Candidate {
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
                Candidate::of(&facts, policy::decide(&facts, policy, now).verdict)
            })
            .collect()
    }

    pub fn of(facts: &Facts, verdict: Verdict) -> Self {
        Candidate {
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

/// A claim this daemon deleted in a namespace under pressure (recorded before the DELETE, for
/// any cause): until it leaves the cache, every quota of the namespace may still count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleting {
    pub key: ObjectKey,
    pub uid: String,
    pub bytes: Option<u64>,
    pub class: Option<String>,
}

impl Deleting {
    pub fn of(claim: &ClaimFacts) -> Self {
        Deleting {
            key: claim.key.clone(),
            uid: claim.uid.clone(),
            bytes: claim.requested_bytes,
            class: claim.storage_class.clone(),
        }
    }

    fn taken(&self, resource: &Resource) -> u64 {
        resource.taken_by(self.bytes, self.class.as_deref())
    }
}

/// A tracked claim of the namespace as the cache holds it, for a round's bookkeeping.
#[derive(Debug, Clone, PartialEq)]
pub struct Present {
    pub uid: String,
    pub bytes: Option<u64>,
    pub class: Option<String>,
}

impl Present {
    pub fn of(claim: &ClaimFacts) -> Self {
        Present {
            uid: claim.uid.clone(),
            bytes: claim.requested_bytes,
            class: claim.storage_class.clone(),
        }
    }
}

/// One pressed resource of one quota, by the quota's uid (a re-created quota is another one).
type Gauge = (String, Resource);

/// A round's account of one quota resource. The quota controller recounts a resource a
/// moment after a claim leaves, one quota at a time; until then `used` still counts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Count {
    /// `status.used` when last observed.
    used: u64,
    /// What claims that left the cache take up and this quota has not been seen to recount.
    owed: u64,
    /// What this quota was seen to recount before the claims it recounted left the cache
    /// (the two watches are not ordered): matched against them when they do.
    spare: u64,
}

/// One namespace's round of pressure: it begins when a quota resource is projected at high
/// water and lasts until every resource that reached it is projected at or below low water
/// and every delete of the round has been recounted by every quota.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    /// The resources that reached high water in this round: hysteresis.
    pressed: BTreeSet<Gauge>,
    /// Deletes recorded and not yet seen to leave the cache.
    sent: Vec<Deleting>,
    counts: BTreeMap<Gauge, Count>,
    /// The tracked claims when last observed (uid → what they take up), to tell which left.
    /// Not persisted: after a restart only the round's own deletes are known to have left.
    seen: BTreeMap<String, (Option<u64>, Option<String>)>,
    warned: bool,
}

impl Round {
    /// What the round still expects `resource` of quota `uid` to lose at a recount.
    fn outstanding(&self, uid: &str, resource: &Resource) -> u64 {
        let sent: u64 = self.sent.iter().map(|s| s.taken(resource)).sum();
        let owed = self
            .counts
            .get(&(uid.to_owned(), resource.clone()))
            .map_or(0, |c| c.owed);
        sent.saturating_add(owed)
    }

    fn projected(&self, uid: &str, limit: &Limit) -> u64 {
        limit
            .used
            .saturating_sub(self.outstanding(uid, &limit.resource))
    }

    /// Takes in the namespace's quotas and tracked claims as the cache holds them now.
    fn observe(&mut self, quotas: &[QuotaEntry], present: &[Present], waters: Waters) -> bool {
        let here: HashMap<&str, &Present> = present.iter().map(|p| (p.uid.as_str(), p)).collect();
        // Claims that left: what they take up is owed by every quota until it recounts.
        let mut left: Vec<(Option<u64>, Option<String>)> = Vec::new();
        for (uid, size) in &self.seen {
            let sent = self.sent.iter().any(|s| &s.uid == uid);
            if !here.contains_key(uid.as_str()) && !sent {
                left.push(size.clone());
            }
        }
        self.sent.retain(|s| {
            let stays = here.contains_key(s.uid.as_str());
            if !stays {
                left.push((s.bytes, s.class.clone()));
            }
            stays
        });
        self.seen = present
            .iter()
            .map(|p| (p.uid.clone(), (p.bytes, p.class.clone())))
            .collect();
        let mut recounted = false;
        let mut counts = BTreeMap::new();
        for quota in quotas {
            for limit in &quota.limits {
                let gauge = (quota.uid.clone(), limit.resource.clone());
                let mut count = self.counts.remove(&gauge).unwrap_or(Count {
                    used: limit.used,
                    ..Count::default()
                });
                let taken =
                    |bytes: Option<u64>, class: Option<&str>| limit.resource.taken_by(bytes, class);
                for (bytes, class) in &left {
                    count.owed = count.owed.saturating_add(taken(*bytes, class.as_deref()));
                }
                if limit.used < count.used {
                    recounted = true;
                    count.spare = count.spare.saturating_add(count.used - limit.used);
                }
                count.used = limit.used;
                let matched = count.owed.min(count.spare);
                count.owed -= matched;
                count.spare -= matched;
                // A recount can run ahead of the cache only for our deletes still in it: a drop
                // beyond those is someone else's claim, never credit for ours.
                let leaving: u64 = (self.sent.iter())
                    .map(|s| taken(s.bytes, s.class.as_deref()))
                    .sum();
                count.spare = count.spare.min(leaving);
                counts.insert(gauge, count);
            }
        }
        self.counts = counts;
        self.pressed.retain(|gauge| self.counts.contains_key(gauge));
        for quota in quotas {
            for limit in &quota.limits {
                if waters.pressed(self.projected(&quota.uid, limit), limit.hard) {
                    self.pressed
                        .insert((quota.uid.clone(), limit.resource.clone()));
                }
            }
        }
        recounted
    }

    /// Over: every pressed resource is projected at or below low water, and nothing of the
    /// round is still to be recounted.
    fn over(&self, quotas: &[QuotaEntry], waters: Waters) -> bool {
        let settled = self.sent.is_empty() && self.counts.values().all(|c| c.owed == 0);
        let relieved = quotas.iter().all(|quota| {
            quota.limits.iter().all(|limit| {
                let gauge = (quota.uid.clone(), limit.resource.clone());
                !self.pressed.contains(&gauge)
                    || waters.relieved(self.projected(&quota.uid, limit), limit.hard)
            })
        });
        settled && relieved
    }
}

/// The rounds of pressure per namespace, and whether they are in doubt after a hand-over.
#[derive(Debug, Default)]
pub struct Rounds {
    namespaces: BTreeMap<String, Round>,
    /// Until when the rounds are in doubt (what was on the Lease could not be read), and the
    /// namespaces recounted since, which are not.
    doubt: Option<(DateTime<Utc>, BTreeSet<String>)>,
}

impl Rounds {
    /// The round of `namespace`, if pressure is on there.
    pub fn round(&self, namespace: &str) -> Option<&Round> {
        self.namespaces.get(namespace)
    }

    /// Whether any of `namespace`'s quotas is under pressure in its round: unless one is, its
    /// plan takes nothing, and its claims need not be decided to make it.
    pub fn pressed(&self, namespace: &str, quotas: &[QuotaEntry], waters: Waters) -> bool {
        let none = Round::default();
        let round = self.namespaces.get(namespace).unwrap_or(&none);
        !pressure(quotas, round, waters).is_empty()
    }

    /// Plans `namespace` with its round; nothing is taken while the rounds are in doubt there.
    pub fn plan(
        &self,
        namespace: &str,
        quotas: &[QuotaEntry],
        claims: &[Candidate],
        waters: Waters,
        now: DateTime<Utc>,
    ) -> Plan {
        let round = self.namespaces.get(namespace).cloned().unwrap_or_default();
        let mut plan = plan(quotas, claims, &round, waters);
        let doubted = self
            .doubt
            .as_ref()
            .is_some_and(|(until, sure)| now < *until && !sure.contains(namespace));
        if doubted {
            plan.victims.clear();
            plan.unrelieved.clear();
        }
        plan
    }

    /// Plans `namespace` over its quotas as listed live (the live re-check), with the cache's
    /// claims: the live quotas are taken in by a copy of the round, so a recount the watch has
    /// not brought yet is matched with the claims that left, or holds the plan back.
    pub fn plan_live(
        &self,
        namespace: &str,
        live: &[QuotaEntry],
        present: &[Present],
        claims: &[Candidate],
        waters: Waters,
        now: DateTime<Utc>,
    ) -> Plan {
        let mut live_rounds = Rounds {
            namespaces: BTreeMap::new(),
            doubt: self.doubt.clone(),
        };
        if let Some(round) = self.namespaces.get(namespace) {
            live_rounds
                .namespaces
                .insert(namespace.to_owned(), round.clone());
        }
        if let Some(round) = live_rounds.namespaces.get_mut(namespace) {
            round.observe(live, present, waters);
        }
        live_rounds.plan(namespace, live, claims, waters, now)
    }

    /// A pressure delete's live re-check: whether the plan over `live` still takes the claim of
    /// `facts`, decided live as `verdict`, among the namespace's other claims as cached. Only a
    /// claim still within its TTL is taken early; never anything wider.
    pub fn takes_live(&self, live: &LiveQuotas, facts: &Facts, verdict: Verdict) -> bool {
        let within_ttl = matches!(
            verdict,
            Verdict::Keep {
                reason: Reason::WithinTtl,
                ..
            }
        );
        if !within_ttl {
            return false;
        }
        let key = &facts.claim.key;
        let others = live.cached.iter().filter(|claim| claim.key != *key);
        let mut claims: Vec<Candidate> = others.cloned().collect();
        claims.push(Candidate::of(facts, verdict));
        let plan = self.plan_live(
            &key.namespace,
            &live.quotas,
            &live.present,
            &claims,
            live.waters,
            live.now,
        );
        plan.victims.contains(key)
    }

    /// Records a delete about to be sent, before it is, in a namespace under pressure (for any
    /// cause: the round must know every claim of ours that leaves): a claim must never be gone
    /// from the cache without being counted here, or the next plan would take one more.
    pub fn record(&mut self, sent: Deleting) {
        let Some(round) = self.namespaces.get_mut(&*sent.key.namespace) else {
            return;
        };
        round.sent.retain(|s| s.uid != sent.uid);
        round.sent.push(sent);
    }

    /// Forgets a delete that did not happen.
    pub fn withdraw(&mut self, key: &ObjectKey, uid: &str) {
        if let Some(round) = self.namespaces.get_mut(&*key.namespace) {
            round.sent.retain(|s| s.uid != uid);
        }
    }

    /// Whether to warn now that pressure remains with nothing more to delete: once a round.
    pub fn first_warning(&mut self, namespace: &str) -> bool {
        self.namespaces
            .get_mut(namespace)
            .is_some_and(|round| !std::mem::replace(&mut round.warned, true))
    }

    /// Whether [`Rounds::observe`] has anything to take in for `namespace`: a round is open
    /// there, or pressure starts one. Without either, its claims need not be gathered.
    pub fn observes(&self, namespace: &str, quotas: &[QuotaEntry], waters: Waters) -> bool {
        self.namespaces.contains_key(namespace) || waters.under_pressure(quotas)
    }

    /// Takes in the namespace's quotas and tracked claims after either changed. A round begins
    /// when a resource is projected at high water and ends when [`Round::over`].
    pub fn observe(
        &mut self,
        namespace: &str,
        quotas: &[QuotaEntry],
        present: &[Present],
        waters: Waters,
    ) {
        if !self.observes(namespace, quotas, waters) {
            return;
        }
        let round = self.namespaces.entry(namespace.to_owned()).or_default();
        if round.observe(quotas, present, waters)
            && let Some((_, sure)) = &mut self.doubt
        {
            sure.insert(namespace.to_owned());
        }
        if round.over(quotas, waters) {
            self.namespaces.remove(namespace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};
    use proptest::prelude::*;

    pub(super) const GI: u64 = 1 << 30;
    pub(super) const WATERS: Waters = Waters {
        high: 0.9,
        low: 0.8,
    };

    pub(super) fn t(minutes: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap() + Duration::minutes(minutes)
    }

    pub(super) fn quota(limits: Vec<(Resource, u64, u64)>) -> QuotaEntry {
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

    pub(super) fn within_ttl(name: &str, completed: i64) -> Candidate {
        Candidate {
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

    pub(super) fn names(keys: &[ObjectKey]) -> Vec<&str> {
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

    pub(super) fn present(claims: &[Candidate], gone: &[&str]) -> Vec<Present> {
        (claims.iter())
            .filter(|c| !gone.contains(&c.key.name.as_str()))
            .map(|c| Present {
                uid: c.uid.clone(),
                bytes: c.bytes,
                class: c.class.clone(),
            })
            .collect()
    }

    fn sent(claim: &Candidate) -> Deleting {
        Deleting {
            key: claim.key.clone(),
            uid: claim.uid.clone(),
            bytes: claim.bytes,
            class: claim.class.clone(),
        }
    }

    pub(super) fn victims(
        rounds: &Rounds,
        quotas: &[QuotaEntry],
        claims: &[Candidate],
    ) -> Vec<String> {
        let plan = rounds.plan("ml", quotas, claims, WATERS, t(0));
        names(&plan.victims)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Two quotas in one namespace: the recount of the first does not end the round for the
    /// second, which still counts what was deleted.
    #[test]
    fn each_quota_owes_its_own_recount() {
        let claims: Vec<Candidate> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
        let storage = |used| QuotaEntry {
            uid: "q-storage".into(),
            ..quota(vec![(Resource::Storage, 6 * GI, used * GI)])
        };
        let count = |used| QuotaEntry {
            key: ObjectKey::new("ml", "count"),
            uid: "q-count".into(),
            ..quota(vec![(Resource::Claims, 6, used)])
        };
        let mut rounds = Rounds::default();
        let all = present(&claims, &[]);
        rounds.observe("ml", &[storage(6), count(6)], &all, WATERS);
        assert_eq!(
            victims(&rounds, &[storage(6), count(6)], &claims),
            ["c5", "c4"]
        );
        rounds.record(sent(&claims[5]));
        rounds.record(sent(&claims[4]));
        let left = present(&claims, &["c5", "c4"]);
        rounds.observe("ml", &[storage(6), count(6)], &left, WATERS);
        assert!(victims(&rounds, &[storage(6), count(6)], &claims).is_empty());
        // `storage` recounts first: `count` still counts both.
        rounds.observe("ml", &[storage(4), count(6)], &left, WATERS);
        assert!(victims(&rounds, &[storage(4), count(6)], &claims).is_empty());
        rounds.observe("ml", &[storage(4), count(4)], &left, WATERS);
        assert!(rounds.round("ml").is_none(), "relieved and recounted: over");
    }

    /// Between the waters, pressure goes on until low water: 100% → 83% after the first
    /// recount still needs the second delete.
    #[test]
    fn pressure_lasts_until_low_water() {
        let claims: Vec<Candidate> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
        let q = |used| quota(vec![(Resource::Storage, 6 * GI, used * GI)]);
        let mut rounds = Rounds::default();
        rounds.observe("ml", &[q(6)], &present(&claims, &[]), WATERS);
        rounds.record(sent(&claims[5]));
        let left = present(&claims, &["c5"]);
        rounds.observe("ml", &[q(6)], &left, WATERS);
        rounds.observe("ml", &[q(5)], &left, WATERS);
        let cached = &claims[..5];
        assert_eq!(victims(&rounds, &[q(5)], cached), ["c4"]);
        // The live re-check plans over the quota as listed live: the same claim.
        let live = rounds.plan_live("ml", &[q(5)], &left, cached, WATERS, t(0));
        assert_eq!(names(&live.victims), ["c4"]);
    }

    /// A recount seen before the claim leaves the cache (the two watches are not ordered) is
    /// matched when it does; a restart from what the Lease holds resumes the round.
    #[test]
    fn a_recount_ahead_of_the_cache_and_a_restart_count_once() {
        let claims: Vec<Candidate> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
        let q = |used| quota(vec![(Resource::Storage, 6 * GI, used * GI)]);
        let mut rounds = Rounds::default();
        rounds.observe("ml", &[q(6)], &present(&claims, &[]), WATERS);
        rounds.record(sent(&claims[5]));
        rounds.record(sent(&claims[4]));
        let saved = rounds.to_annotation();
        rounds.observe("ml", &[q(4)], &present(&claims, &[]), WATERS);
        assert!(
            victims(&rounds, &[q(4)], &claims).is_empty(),
            "double-counted: fewer"
        );
        rounds.observe("ml", &[q(4)], &present(&claims, &["c5", "c4"]), WATERS);
        assert!(rounds.round("ml").is_none());

        let mut restarted = Rounds::default();
        restarted.recover(Some(&saved), t(0)).unwrap();
        let left = present(&claims, &["c5", "c4"]);
        assert!(
            victims(&restarted, &[q(6)], &claims).is_empty(),
            "not recounted yet"
        );
        restarted.observe("ml", &[q(6)], &left, WATERS);
        assert!(victims(&restarted, &[q(6)], &claims).is_empty());
        restarted.observe("ml", &[q(4)], &left, WATERS);
        assert!(restarted.round("ml").is_none());
    }

    #[test]
    fn a_round_warns_once() {
        let mut rounds = Rounds::default();
        let high = quota(vec![(Resource::Claims, 10, 10)]);
        rounds.observe("ml", std::slice::from_ref(&high), &[], WATERS);
        assert!(rounds.first_warning("ml"));
        assert!(!rounds.first_warning("ml"));
        let low = quota(vec![(Resource::Claims, 10, 5)]);
        rounds.observe("ml", &[low], &[], WATERS);
        assert!(rounds.round("ml").is_none());
        rounds.observe("ml", &[high], &[], WATERS);
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

    pub(super) fn any_claim() -> impl Strategy<Value = Candidate> {
        (
            0..1000u32,
            any_verdict(),
            prop::option::weighted(0.9, -600..0i64),
            prop::option::weighted(0.9, 1..4u64),
            prop::option::of(prop::sample::select(vec!["fast", "slow"])),
            any::<bool>(),
        )
            .prop_map(|(id, verdict, completed, gib, class, likely)| Candidate {
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

    pub(super) fn any_quotas() -> impl Strategy<Value = Vec<QuotaEntry>> {
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

    pub(super) fn unique(claims: Vec<Candidate>) -> Vec<Candidate> {
        let mut seen = std::collections::HashSet::new();
        claims
            .into_iter()
            .filter(|c| seen.insert(c.uid.clone()))
            .collect()
    }

    pub(super) fn any_waters() -> impl Strategy<Value = Waters> {
        (1..99u32, 1..100u32).prop_filter_map("low < high", |(low, high)| {
            (low < high).then(|| Waters {
                high: f64::from(high) / 100.0,
                low: f64::from(low) / 100.0,
            })
        })
    }

    /// What the adversary does next, in the simulation below.
    #[derive(Debug, Clone)]
    enum Op {
        /// The daemon reconciles the `n`th claim of its plan: live re-check, record, DELETE.
        Reconcile(usize),
        /// The `n`th deleted claim still on the server leaves it (its finalizer removed).
        Leave(usize),
        /// The quota controller's informer sees the next claim leave.
        ControllerSees,
        /// The quota controller recounts quota `n` (one quota at a time) from its informer.
        Recount(usize),
        /// The daemon's claim watch delivers the next claim leaving.
        ClaimWatch,
        /// The daemon's quota watch delivers the next status the controller wrote.
        QuotaWatch,
        /// The daemon restarts (or another replica takes over): what is in memory is lost, what
        /// the Lease holds is read back, and the caches list afresh.
        Restart,
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..8usize).prop_map(Op::Reconcile),
            2 => (0..8usize).prop_map(Op::Leave),
            2 => Just(Op::ControllerSees),
            3 => (0..2usize).prop_map(Op::Recount),
            2 => Just(Op::ClaimWatch),
            2 => Just(Op::QuotaWatch),
            1 => Just(Op::Restart),
        ]
    }

    /// A namespace whose quotas are recounted by a simulated quota controller, one quota at a
    /// time, from its own informer, while the daemon's two watches each lag on their own.
    struct World {
        waters: Waters,
        claims: Vec<Candidate>,
        /// Per quota: its key and uid, and per resource hard and what untracked claims take.
        quotas: Vec<(QuotaEntry, Vec<u64>)>,
        /// Claims deleted (DELETE answered), in order; those still on the server.
        deleted: Vec<String>,
        terminating: Vec<String>,
        /// Claims that left the server, in order; how many the controller's informer and the
        /// daemon's claim watch have seen.
        left: Vec<String>,
        controller_saw: usize,
        daemon_saw: usize,
        /// Quota statuses as the server holds them, the statuses written in order, and how
        /// many the daemon's quota watch delivered.
        live: Vec<QuotaEntry>,
        written: Vec<QuotaEntry>,
        delivered: usize,
        cached: Vec<QuotaEntry>,
        rounds: Rounds,
        lease: Option<String>,
    }

    impl World {
        fn new(
            claims: Vec<Candidate>,
            quotas: Vec<(QuotaEntry, Vec<u64>)>,
            waters: Waters,
        ) -> Self {
            let mut world = World {
                waters,
                claims,
                quotas,
                deleted: Vec::new(),
                terminating: Vec::new(),
                left: Vec::new(),
                controller_saw: 0,
                daemon_saw: 0,
                live: Vec::new(),
                written: Vec::new(),
                delivered: 0,
                cached: Vec::new(),
                rounds: Rounds::default(),
                lease: None,
            };
            world.live = (0..world.quotas.len()).map(|q| world.count(q)).collect();
            world.cached = world.live.clone();
            world.observe();
            world
        }

        /// Quota `q` as the controller counts it from what its informer has seen.
        fn count(&self, q: usize) -> QuotaEntry {
            let (quota, untracked) = &self.quotas[q];
            let gone = &self.left[..self.controller_saw];
            let mut quota = quota.clone();
            for (limit, untracked) in quota.limits.iter_mut().zip(untracked) {
                limit.used = (self.claims.iter())
                    .filter(|c| !gone.contains(&c.uid))
                    .map(|c| limit.resource.taken_by(c.bytes, c.class.as_deref()))
                    .sum::<u64>()
                    + untracked;
            }
            quota
        }

        /// The claims in the daemon's cache; a deleted one is terminating there, not eligible.
        fn cache(&self) -> (Vec<Candidate>, Vec<Present>) {
            let gone = &self.left[..self.daemon_saw];
            let claims: Vec<&Candidate> = (self.claims.iter())
                .filter(|c| !gone.contains(&c.uid))
                .collect();
            let present = (claims.iter())
                .map(|c| Present {
                    uid: c.uid.clone(),
                    bytes: c.bytes,
                    class: c.class.clone(),
                })
                .collect();
            let claims = (claims.into_iter())
                .filter(|c| !self.deleted.contains(&c.uid))
                .cloned()
                .collect();
            (claims, present)
        }

        fn observe(&mut self) {
            let (_, present) = self.cache();
            (self.rounds).observe("ml", &self.cached, &present, self.waters);
        }

        fn apply(&mut self, op: &Op) {
            match *op {
                Op::Reconcile(n) => {
                    let (claims, present) = self.cache();
                    let plan = self
                        .rounds
                        .plan("ml", &self.cached, &claims, self.waters, t(0));
                    let Some(victim) = plan.victims.get(n % plan.victims.len().max(1)) else {
                        return;
                    };
                    let live = (self.rounds).plan_live(
                        "ml",
                        &self.live,
                        &present,
                        &claims,
                        self.waters,
                        t(0),
                    );
                    if !live.victims.contains(victim) {
                        return;
                    }
                    let claim = claims.iter().find(|c| &c.key == victim).unwrap();
                    self.rounds.record(sent(claim));
                    self.lease = Some(self.rounds.to_annotation());
                    self.deleted.push(claim.uid.clone());
                    self.terminating.push(claim.uid.clone());
                }
                Op::Leave(n) => {
                    if !self.terminating.is_empty() {
                        let uid = self.terminating.remove(n % self.terminating.len());
                        self.left.push(uid);
                    }
                }
                Op::ControllerSees => {
                    self.controller_saw = (self.controller_saw + 1).min(self.left.len());
                }
                Op::Recount(q) => {
                    let q = q % self.quotas.len();
                    let counted = self.count(q);
                    if counted != self.live[q] {
                        self.live[q] = counted.clone();
                        self.written.push(counted);
                    }
                }
                Op::ClaimWatch => {
                    if self.daemon_saw < self.left.len() {
                        self.daemon_saw += 1;
                        self.observe();
                    }
                }
                Op::QuotaWatch => {
                    if let Some(status) = self.written.get(self.delivered).cloned() {
                        self.delivered += 1;
                        let cached = self.cached.iter_mut().find(|q| q.uid == status.uid);
                        *cached.unwrap() = status;
                        self.observe();
                    }
                }
                Op::Restart => {
                    self.rounds = Rounds::default();
                    self.rounds.recover(self.lease.as_deref(), t(0)).unwrap();
                    self.daemon_saw = self.left.len();
                    self.delivered = self.written.len();
                    self.cached = self.live.clone();
                    self.observe();
                }
            }
        }

        /// Every fault over: everything leaves, is recounted and delivered, and the daemon
        /// reconciles until its plan is empty.
        fn settle(&mut self) {
            for _ in 0..40 {
                let mut ops = vec![Op::Leave(0); self.terminating.len()];
                ops.extend(vec![
                    Op::ControllerSees;
                    self.left.len() + self.terminating.len()
                ]);
                ops.extend((0..self.quotas.len()).map(Op::Recount));
                ops.extend(vec![Op::ClaimWatch; self.claims.len()]);
                ops.extend(vec![Op::QuotaWatch; self.written.len() + self.quotas.len()]);
                ops.push(Op::Reconcile(0));
                let before = self.deleted.len();
                for op in &ops {
                    self.apply(op);
                }
                if self.deleted.len() == before && self.terminating.is_empty() {
                    return;
                }
            }
        }
    }

    /// A world's claims, quotas (with what untracked claims take up of each resource), waters.
    type Setting = (Vec<Candidate>, Vec<(QuotaEntry, Vec<u64>)>, Waters);

    fn any_world() -> impl Strategy<Value = Setting> {
        let claims = prop::collection::vec(any_claim(), 1..14).prop_map(unique);
        let limit = (any_resource(), 0..110u32, 0..3u64);
        let quotas = prop::collection::vec(prop::collection::vec(limit, 1..3), 1..3);
        (claims, quotas, any_waters()).prop_map(|(claims, quotas, waters)| {
            let quotas = (quotas.into_iter().enumerate())
                .map(|(i, limits)| {
                    let mut limits: Vec<(Resource, u32, u64)> = limits;
                    limits.sort_by(|a, b| a.0.cmp(&b.0));
                    limits.dedup_by(|a, b| a.0 == b.0);
                    let mut untracked = Vec::new();
                    let mut quota = QuotaEntry {
                        key: ObjectKey::new("ml", &format!("q{i}")),
                        uid: format!("q{i}-uid"),
                        limits: Vec::new(),
                    };
                    for (resource, percent, other) in limits {
                        let unit = match resource {
                            Resource::Storage | Resource::ClassStorage(_) => GI,
                            _ => 1,
                        };
                        let taken: u64 = (claims.iter())
                            .map(|c| resource.taken_by(c.bytes, c.class.as_deref()))
                            .sum::<u64>()
                            + other * unit;
                        // hard is `used` at 0..110%: some quotas full, some not.
                        let hard = (taken * 100 / u64::from(percent.max(1))).max(1);
                        untracked.push(other * unit);
                        quota.limits.push(Limit {
                            resource,
                            hard,
                            used: 0,
                        });
                    }
                    (quota, untracked)
                })
                .collect();
            (claims, quotas, waters)
        })
    }

    proptest! {
        /// Whatever the order and timing of the recounts (per quota), of the claims leaving
        /// and of the daemon's watches, and across restarts that keep only what the Lease holds,
        /// the claims deleted are exactly those one plan at the start would take: never one
        /// more (checked after every step), never one fewer (once everything has settled).
        #[test]
        fn recounts_in_any_order_delete_exactly_what_one_plan_would(
            (claims, quotas, waters) in any_world(),
            ops in prop::collection::vec(any_op(), 0..60),
        ) {
            let mut world = World::new(claims, quotas, waters);
            let expected: BTreeSet<String> = {
                let at_start = (0..world.quotas.len()).map(|q| world.count(q)).collect::<Vec<_>>();
                let plan = plan(&at_start, &world.claims, &Round::default(), waters);
                (plan.victims.iter())
                    .map(|key| world.claims.iter().find(|c| &c.key == key).unwrap().uid.clone())
                    .collect()
            };
            for op in &ops {
                world.apply(op);
                let deleted: BTreeSet<String> = world.deleted.iter().cloned().collect();
                prop_assert!(deleted.is_subset(&expected), "after {op:?}: {deleted:?} ⊄ {expected:?}");
                // The daemon asks `pressed` before deciding a namespace's claims for a plan.
                let now = world.rounds.plan("ml", &world.cached, &world.cache().0, waters, t(0));
                let pressed = world.rounds.pressed("ml", &world.cached, waters);
                prop_assert_eq!(pressed, !now.pressed.is_empty(), "after {:?}: {:?}", op, now);
            }
            world.settle();
            let deleted: BTreeSet<String> = world.deleted.iter().cloned().collect();
            prop_assert_eq!(deleted, expected);
            // Everything recounted: the round is over unless a pressed resource stays above
            // low water with nothing more to take (hysteresis).
            let last = world.rounds.plan("ml", &world.cached, &world.cache().0, waters, t(0));
            let relieved = last.pressed.iter().all(|p| waters.relieved(p.projected, p.hard));
            prop_assert_eq!(world.rounds.round("ml").is_none(), relieved, "{:?}", last);
        }

    }
}
