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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

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

/// A claim this daemon deleted in a namespace under pressure (recorded before the DELETE, for
/// any cause): until it leaves the cache, every quota of the namespace may still count it.
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
    sent: Vec<Sent>,
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
pub fn plan(quotas: &[QuotaEntry], claims: &[Claim], round: &Round, waters: Waters) -> Plan {
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
    let mut candidates: Vec<(DateTime<Utc>, &Claim)> = claims
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

/// How long a round read back from the Lease that could not be trusted holds pressure deletes
/// back in a namespace whose quotas show no recount: kube-controller-manager's default
/// `--resource-quota-sync-period`, by which every quota has been recounted at least once.
pub const DOUBT: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// The rounds of pressure per namespace, and whether they are in doubt after a hand-over.
#[derive(Debug, Default)]
pub struct Rounds {
    namespaces: BTreeMap<String, Round>,
    /// Until when the rounds are in doubt (what was on the Lease could not be read), and the
    /// namespaces recounted since, which are not.
    doubt: Option<(DateTime<Utc>, BTreeSet<String>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    #[error("the quota rounds on the Lease do not parse: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("the quota rounds on the Lease are not plausible: {0}")]
    Implausible(String),
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
        claims: &[Claim],
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
        claims: &[Claim],
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

    /// Records a delete about to be sent, before it is, in a namespace under pressure (for any
    /// cause: the round must know every claim of ours that leaves): a claim must never be gone
    /// from the cache without being counted here, or the next plan would take one more.
    pub fn record(&mut self, sent: Sent) {
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
            round.sent.push(Sent {
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
            sent: vec![Sent {
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
        let fast = |name: &str, at| Claim {
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

    fn present(claims: &[Claim], gone: &[&str]) -> Vec<Present> {
        (claims.iter())
            .filter(|c| !gone.contains(&c.key.name.as_str()))
            .map(|c| Present {
                uid: c.uid.clone(),
                bytes: c.bytes,
                class: c.class.clone(),
            })
            .collect()
    }

    fn sent(claim: &Claim) -> Sent {
        Sent {
            key: claim.key.clone(),
            uid: claim.uid.clone(),
            bytes: claim.bytes,
            class: claim.class.clone(),
        }
    }

    fn victims(rounds: &Rounds, quotas: &[QuotaEntry], claims: &[Claim]) -> Vec<String> {
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
        let claims: Vec<Claim> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
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
        let claims: Vec<Claim> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
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
        let claims: Vec<Claim> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
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

    #[test]
    fn rounds_on_the_lease_that_cannot_be_trusted_hold_pressure_back() {
        let claims: Vec<Claim> = (0..6).map(|i| within_ttl(&format!("c{i}"), -i)).collect();
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
            let round = Round {
                sent: self.sent.clone(),
                ..Round::default()
            };
            plan(&self.quotas, &self.claims, &round, self.waters)
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
        claims: Vec<Claim>,
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
        fn new(claims: Vec<Claim>, quotas: Vec<(QuotaEntry, Vec<u64>)>, waters: Waters) -> Self {
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
        fn cache(&self) -> (Vec<Claim>, Vec<Present>) {
            let gone = &self.left[..self.daemon_saw];
            let claims: Vec<&Claim> = (self.claims.iter())
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
    type Setting = (Vec<Claim>, Vec<(QuotaEntry, Vec<u64>)>, Waters);

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
