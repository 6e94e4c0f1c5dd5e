//! The in-memory index the watchers feed: stripped entries for claims, jobs, PipelineRuns,
//! TaskRuns, pods and ResourceQuotas,
//! with the secondary indices that map a change of any of them to exactly the claims it can
//! affect. No I/O; the controller applies watcher events and schedules what comes back.
//!
//! This file holds the [`Index`] and how a change is applied to it. Apart from it:
//! `table.rs` (one kind's entries and the rows of a secondary index, the storage),
//! `entries.rs` (each kind's rows and the claims its change affects) and `lookup.rs` (the index
//! answering the linking's questions).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Utc};

use crate::contract::OwnerKind;
use crate::contract::annotations::NS_KEEP_FAILED;
use crate::decide::facts::{
    ClaimFacts, JobEntry, NamespaceEntry, ObjectKey, PodEntry, Progress, RunEntry,
};
use crate::decide::linking::Found;
use crate::decide::provenance::{self, ProvenanceRule};
use crate::decide::quota::QuotaEntry;
use crate::observe::metrics::Kind;

mod entries;
mod lookup;
mod table;

pub use entries::Cached;
pub use table::Table;
use table::{Keyed, Row};

/// The namespace one watch covers; `None` for a cluster-wide watch.
pub type Scope = Option<String>;

/// A watcher event, with the object already converted to its cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<E> {
    Apply(E),
    Delete(ObjectKey),
    /// A (re-)list of a scope starts: entries arrive as `InitApply` and replace that scope's
    /// entries at `InitDone`.
    Init(Scope),
    InitApply(Scope, E),
    InitDone(Scope),
}

/// The candidates the blast-radius cap's share is taken of ([`Index::take_candidates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidates {
    /// How many there are now.
    pub now: usize,
    /// The fewest there were at any moment since they were last taken (since the claims
    /// listed, the first time).
    pub fewest: usize,
}

/// A TaskRun's entry. PipelineRuns and TaskRuns share [`RunEntry`], but not a table: the two
/// kinds may use the same names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRunEntry(pub RunEntry);

/// A change to any of the kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    Claim(Change<ClaimFacts>),
    Job(Change<JobEntry>),
    Run(Change<RunEntry>),
    TaskRun(Change<TaskRunEntry>),
    Pod(Change<PodEntry>),
    Quota(Change<QuotaEntry>),
    Namespace(Change<NamespaceEntry>),
    /// A kind's watch of a scope has delivered everything up to this resourceVersion: sent
    /// after the change that carried it, so the cache never claims more than it holds.
    Delivered(Kind, Scope, u64),
    /// An owner kind is not served where its watch read it (`cluster::served`): its entries in
    /// the scope go, and with them how far its watch delivered. `None`: its group serves it at
    /// no version and it is optional, so the scope is listed and empty. `Some(why)`: its facts
    /// in the scope are unknown until a watch lists it again.
    Unserved(OwnerKind, Scope, Option<String>),
}

/// The cache of everything decisions read.
#[derive(Debug)]
pub struct Index {
    claims: Table<ClaimFacts>,
    jobs: Table<JobEntry>,
    runs: Table<RunEntry>,
    task_runs: Table<TaskRunEntry>,
    pods: Table<PodEntry>,
    /// Watched only when quota pressure is enabled ([`Index::with_quotas`]); otherwise synced
    /// and empty from the start.
    quotas: Table<QuotaEntry>,
    /// Watched only with per-namespace settings enabled ([`Index::with_namespaces`]).
    namespaces: Table<NamespaceEntry>,
    /// Claim → kinds and names of the runs in its namespace whose workspaces bind it.
    runs_by_claim: HashMap<ObjectKey, Row<(OwnerKind, String)>>,
    /// Claim → names of the pods in its namespace that mount it.
    pods_by_claim: HashMap<ObjectKey, Row<String>>,
    /// Claim → names of the jobs in its namespace whose own volumes name it.
    jobs_by_claim: HashMap<ObjectKey, Row<String>>,
    /// Namespace → names of the jobs there whose volumes could not be read: any claim of it.
    unreadable_jobs: HashMap<Arc<str>, Row<String>>,
    /// Owner UID → the claims whose ownerReferences name it.
    claims_by_owner: HashMap<String, Row<ObjectKey>>,
    /// Namespace → how many jobs, runs (of both kinds) and pods the cache holds there: asked at
    /// every re-check ([`Index::namespace_size`]), so counted, not scanned.
    sizes_by_namespace: HashMap<Arc<str>, usize>,
    /// Namespace → owner kind and completion time → how many owners of that kind there finished
    /// failed then: what ranks a failed build ([`Lookup::failed_after`]) without a scan.
    failed_by_namespace: HashMap<Arc<str>, Failures>,
    /// The cluster's `keep_failed` ([`Index::with_keep_failed`]): where nothing keeps by count,
    /// a failure re-evaluates only its own claims.
    keep_failed: u32,
    /// How far each kind's watch of each scope has delivered ([`Update::Delivered`]).
    delivered: HashMap<(Kind, Scope), u64>,
    /// What makes a claim a candidate ([`Index::with_provenance`]); `None`: every claim not
    /// terminating is one (an index whose count no cap reads: the audit's, unit tests').
    rule: Option<Arc<ProvenanceRule>>,
    /// The claims that pass `rule` and are not terminating: the population of the cap's
    /// share, asked at every admission, so counted as claims come and go, not scanned.
    candidates: usize,
    /// The fewest `candidates` at the end of any change since they were last taken; atomic,
    /// because taken under the read lock ([`Index::take_candidates`]).
    fewest: AtomicUsize,
}

/// One namespace's failed owners with a completion time: how many of each kind finished then.
type Failures = BTreeMap<(OwnerKind, DateTime<Utc>), u32>;

impl Default for Index {
    /// An index fed by cluster-wide watches.
    fn default() -> Self {
        Self::new(&[None])
    }
}

impl Index {
    /// An index fed by one watch per kind and scope.
    pub fn new(scopes: &[Scope]) -> Self {
        Self {
            claims: Table::new(scopes),
            jobs: Table::new(scopes),
            runs: Table::new(scopes),
            task_runs: Table::new(scopes),
            pods: Table::new(scopes),
            quotas: Table::new(&[]),
            namespaces: Table::new(&[]),
            runs_by_claim: HashMap::new(),
            pods_by_claim: HashMap::new(),
            jobs_by_claim: HashMap::new(),
            unreadable_jobs: HashMap::new(),
            claims_by_owner: HashMap::new(),
            failed_by_namespace: HashMap::new(),
            keep_failed: 0,
            sizes_by_namespace: HashMap::new(),
            delivered: HashMap::new(),
            rule: None,
            candidates: 0,
            fewest: AtomicUsize::new(0),
        }
    }

    /// An index counting as candidates the claims `rule` lets through (the daemon's
    /// `provenance` configuration), not terminating.
    pub fn with_provenance(mut self, rule: Arc<ProvenanceRule>) -> Self {
        self.rule = Some(rule);
        let candidates = self.claims().filter(|c| self.is_candidate(c)).count();
        self.candidates = candidates;
        *self.fewest.get_mut() = candidates;
        self
    }

    /// Whether `claim` counts in the cap's share: a build workspace by its provenance, and
    /// not being deleted.
    fn is_candidate(&self, claim: &ClaimFacts) -> bool {
        claim.deletion_timestamp.is_none()
            && (self.rule.as_ref()).is_none_or(|rule| provenance::missing(claim, rule).is_none())
    }

    /// Counts `claim` in (or out of) the candidates.
    fn count_candidate(&mut self, claim: &ClaimFacts, add: bool) {
        if !self.is_candidate(claim) {
            return;
        }
        if add {
            self.candidates += 1;
        } else {
            self.candidates = self.candidates.saturating_sub(1);
        }
    }

    /// The candidates now, and the fewest since the last call: the cap's share takes the
    /// fewest it was told within a window ([`crate::daemon::limiter`]), so claims arriving
    /// between two admissions cannot raise it before a window has passed.
    pub fn take_candidates(&self) -> Candidates {
        // Relaxed: the lock orders it after every change; the swap alone makes two takes
        // at once each see the low once.
        let fewest = self.fewest.swap(self.candidates, Ordering::Relaxed);
        Candidates {
            now: self.candidates,
            fewest: fewest.min(self.candidates),
        }
    }

    /// An index that also waits for the ResourceQuota watches to list once.
    pub fn with_quotas(mut self, scopes: &[Scope]) -> Self {
        self.quotas = Table::new(scopes);
        self
    }

    /// An index for a cluster keeping `keep` failed builds by count (`policy.keep_failed`).
    pub fn with_keep_failed(mut self, keep: u32) -> Self {
        self.keep_failed = keep;
        self
    }

    /// Whether claims of `namespace` may be kept by count: the cluster keeps some, or the
    /// namespace sets its own `keep-failed`.
    fn keeps_by_count(&self, namespace: &str) -> bool {
        self.keep_failed > 0
            || (self.namespace_annotations(namespace))
                .is_some_and(|annotations| annotations.contains_key(NS_KEEP_FAILED))
    }

    /// `affected`, each key with an empty name (which no object has) standing for every claim
    /// of its namespace: expanded once per change, however many entries asked for it.
    fn expand(&self, mut affected: BTreeSet<ObjectKey>) -> BTreeSet<ObjectKey> {
        let whole: Vec<Arc<str>> = (affected.iter())
            .filter(|key| key.name.is_empty())
            .map(|key| key.namespace.clone())
            .collect();
        affected.retain(|key| !key.name.is_empty());
        for namespace in whole {
            affected.extend(self.claims_in(&namespace).map(|claim| claim.key.clone()));
        }
        affected
    }

    /// An index that also waits for the Namespace watch (cluster-wide) to list once.
    pub fn with_namespaces(mut self) -> Self {
        self.namespaces = Table::new(&[None]);
        self
    }

    /// A namespace's workspace-gc annotations; `None` until the Namespace watch listed, or
    /// while it has not seen the namespace.
    pub fn namespace_annotations(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        if !self.namespaces.synced() {
            return None;
        }
        let key = ObjectKey::new("", namespace);
        self.namespaces.entry(&key).map(|entry| &entry.annotations)
    }

    /// The names of the cached Namespaces.
    pub fn namespace_names(&self) -> Vec<String> {
        (self.namespaces.values())
            .map(|entry| entry.key.name.clone())
            .collect()
    }

    /// Applies a change of any kind and returns the claims to re-evaluate.
    pub fn update(&mut self, update: Update) -> BTreeSet<ObjectKey> {
        match update {
            Update::Claim(change) => self.apply(change),
            Update::Job(change) => self.apply(change),
            Update::Run(change) => self.apply(change),
            Update::TaskRun(change) => self.apply(change),
            Update::Pod(change) => self.apply(change),
            Update::Quota(change) => self.apply(change),
            Update::Namespace(change) => self.apply(change),
            Update::Delivered(kind, scope, revision) => {
                let delivered = self.delivered.entry((kind, scope)).or_default();
                *delivered = (*delivered).max(revision);
                BTreeSet::new()
            }
            Update::Unserved(owner, scope, why) => {
                // What it delivered was of a version no longer read: no proof may rest on it.
                self.delivered.remove(&(Kind::from(owner), scope.clone()));
                match owner {
                    OwnerKind::Job => self.unserved::<JobEntry>(scope, why),
                    OwnerKind::Run => self.unserved::<RunEntry>(scope, why),
                    OwnerKind::TaskRun => self.unserved::<TaskRunEntry>(scope, why),
                }
            }
        }
    }

    /// Empties a scope of an owner kind that is not served where it was read, known empty
    /// (`why` is `None`) or unknown. Each claim of the scope is affected when whether the kind
    /// is known there changes.
    fn unserved<E: Cached>(&mut self, scope: Scope, why: Option<String>) -> BTreeSet<ObjectKey> {
        let mut affected = BTreeSet::new();
        let table = E::table(self);
        table.relists.remove(&scope);
        table.unsynced.remove(&scope);
        let was_unknown = match why {
            Some(why) => table.unknown.insert(scope.clone(), why).is_some(),
            None => table.unknown.remove(&scope).is_some(),
        };
        let is_unknown = table.unknown.contains_key(&scope);
        let held: Vec<ObjectKey> = (table.values().map(Cached::key))
            .filter(|key| in_scope(&scope, key))
            .cloned()
            .collect();
        for key in held {
            self.remove::<E>(&key, &mut affected);
        }
        if was_unknown != is_unknown {
            self.claims_of(&scope, &mut affected);
        }
        affected
    }

    /// Every tracked claim in `scope`.
    fn claims_of(&self, scope: &Scope, out: &mut BTreeSet<ObjectKey>) {
        let claims = self.claims().filter(|claim| in_scope(scope, &claim.key));
        out.extend(claims.map(|claim| claim.key.clone()));
    }

    /// The resourceVersion up to which `kind`'s watch of `scope` has delivered every change:
    /// `None` until it has said.
    pub fn delivered(&self, kind: Kind, scope: &Scope) -> Option<u64> {
        self.delivered.get(&(kind, scope.clone())).copied()
    }

    /// How many jobs, runs (PipelineRuns and TaskRuns) and pods mounting a claim the cache
    /// holds in `namespace`: what a live LIST of it would carry.
    pub fn namespace_size(&self, namespace: &str) -> usize {
        self.sizes_by_namespace.get(namespace).copied().unwrap_or(0)
    }

    /// Counts an entry of a kind [`Index::namespace_size`] counts in (or out of) its namespace.
    fn count(&mut self, key: &ObjectKey, add: bool) {
        let count = self
            .sizes_by_namespace
            .entry(key.namespace.clone())
            .or_default();
        if add {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.sizes_by_namespace.remove(&key.namespace);
            }
        }
    }

    /// Counts a failed owner of `kind` with a completion time in (or out of) its namespace's
    /// ranking.
    fn count_failed(&mut self, kind: OwnerKind, key: &ObjectKey, progress: &Progress, add: bool) {
        let Progress::Finished {
            at: Some(at),
            failed: true,
        } = progress
        else {
            return;
        };
        let namespace = &key.namespace;
        let times = (self.failed_by_namespace.entry(namespace.clone())).or_default();
        let count = times.entry((kind, *at)).or_default();
        if add {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                times.remove(&(kind, *at));
            }
            if times.is_empty() {
                self.failed_by_namespace.remove(namespace);
            }
        }
    }

    /// Whether the cache holds an object of `kind` under `key`.
    pub fn holds(&self, kind: Kind, key: &ObjectKey) -> bool {
        match kind {
            Kind::Claims => self.claims.entry(key).is_some(),
            Kind::Jobs => self.jobs.entry(key).is_some(),
            Kind::Runs => self.runs.entry(key).is_some(),
            Kind::TaskRuns => self.task_runs.entry(key).is_some(),
            Kind::Pods => self.pods.entry(key).is_some(),
            Kind::Quotas => self.quotas.entry(key).is_some(),
            Kind::Namespaces => self.namespaces.entry(key).is_some(),
        }
    }

    /// Applies one watcher event and returns the claims to re-evaluate.
    pub fn apply<E: Cached>(&mut self, change: Change<E>) -> BTreeSet<ObjectKey> {
        let listed = self.claims.synced();
        let affected = self.apply_change(change);
        // Until the claims have listed, the count is filling, not falling.
        let fewest = self.fewest.get_mut();
        *fewest = if listed {
            (*fewest).min(self.candidates)
        } else {
            self.candidates
        };
        affected
    }

    fn apply_change<E: Cached>(&mut self, change: Change<E>) -> BTreeSet<ObjectKey> {
        let mut affected = BTreeSet::new();
        match change {
            Change::Apply(entry) => self.upsert(entry, &mut affected),
            Change::Delete(key) => self.remove::<E>(&key, &mut affected),
            Change::Init(scope) => {
                E::table(self).relists.insert(scope, HashSet::new());
            }
            Change::InitApply(scope, entry) => {
                // `replace`, not `insert`: a later event of the same object wins.
                E::table(self)
                    .relists
                    .entry(scope)
                    .or_default()
                    .replace(Keyed(entry));
            }
            Change::InitDone(scope) => {
                let table = E::table(self);
                let fresh = table.relists.remove(&scope).unwrap_or_default();
                let vanished: Vec<ObjectKey> = table
                    .values()
                    .map(Cached::key)
                    .filter(|key| in_scope(&scope, key) && !fresh.contains(*key))
                    .cloned()
                    .collect();
                for key in vanished {
                    self.remove::<E>(&key, &mut affected);
                }
                for entry in fresh {
                    self.upsert(entry.0, &mut affected);
                }
                let table = E::table(self);
                table.unsynced.remove(&scope);
                // Listed where it can be read again: what it keeps unknown is known now.
                if table.unknown.remove(&scope).is_some() {
                    self.claims_of(&scope, &mut affected);
                }
            }
        }
        self.expand(affected)
    }

    fn upsert<E: Cached>(&mut self, entry: E, affected: &mut BTreeSet<ObjectKey>) {
        if let Some(Keyed(old)) = E::table(self).items.take(entry.key()) {
            if old == entry {
                E::table(self).items.insert(Keyed(old));
                return;
            }
            old.affected(self, affected);
            old.index(self, false);
        }
        entry.index(self, true);
        entry.affected(self, affected);
        E::table(self).items.insert(Keyed(entry));
    }

    fn remove<E: Cached>(&mut self, key: &ObjectKey, affected: &mut BTreeSet<ObjectKey>) {
        if let Some(Keyed(old)) = E::table(self).items.take(key) {
            old.affected(self, affected);
            old.index(self, false);
        }
    }

    /// Every watch has listed once: decisions may be made.
    pub fn synced(&self) -> bool {
        self.claims.synced()
            && self.jobs.synced()
            && self.runs.synced()
            && self.task_runs.synced()
            && self.pods.synced()
            && self.quotas.synced()
            && self.namespaces.synced()
    }

    pub fn claim(&self, key: &ObjectKey) -> Option<&ClaimFacts> {
        self.claims.entry(key)
    }

    pub fn claims(&self) -> impl Iterator<Item = &ClaimFacts> {
        self.claims.values()
    }

    /// The tracked claims of one namespace.
    pub fn claims_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a ClaimFacts> {
        self.claims()
            .filter(move |claim| *claim.key.namespace == *namespace)
    }

    /// The ResourceQuotas of one namespace, sorted by name; unknown until their watch listed.
    pub fn quotas_in(&self, namespace: &str) -> Found<Vec<QuotaEntry>> {
        if !self.quotas.synced() {
            return Found::Unknown(format!("the {} cache has not synced yet", QuotaEntry::WHAT));
        }
        let mut quotas: Vec<QuotaEntry> = (self.quotas.values())
            .filter(|quota| *quota.key.namespace == *namespace)
            .cloned()
            .collect();
        quotas.sort_by(|a, b| a.key.cmp(&b.key));
        Found::Yes(quotas)
    }

    /// The namespaces that hold a cached ResourceQuota.
    pub fn quota_namespaces(&self) -> BTreeSet<String> {
        (self.quotas.values())
            .map(|quota| quota.key.namespace.to_string())
            .collect()
    }

    /// Entries cached per kind, for metrics.
    pub fn sizes(&self) -> [(Kind, usize); 7] {
        [
            (Kind::Claims, self.claims.len()),
            (Kind::Jobs, self.jobs.len()),
            (Kind::Runs, self.runs.len()),
            (Kind::TaskRuns, self.task_runs.len()),
            (Kind::Pods, self.pods.len()),
            (Kind::Quotas, self.quotas.len()),
            (Kind::Namespaces, self.namespaces.len()),
        ]
    }

    fn tracked(&self, key: ObjectKey, out: &mut BTreeSet<ObjectKey>) {
        if self.claims.items.contains(&key) {
            out.insert(key);
        }
    }

    fn owned_by(&self, uid: &str, out: &mut BTreeSet<ObjectKey>) {
        if let Some(claims) = self.claims_by_owner.get(uid) {
            out.extend(claims.iter().cloned());
        }
    }
}

fn in_scope(scope: &Scope, key: &ObjectKey) -> bool {
    scope
        .as_ref()
        .is_none_or(|namespace| **namespace == *key.namespace)
}

fn sibling(key: &ObjectKey, name: String) -> ObjectKey {
    ObjectKey {
        namespace: key.namespace.clone(),
        name,
    }
}

#[cfg(test)]
impl Index {
    /// A cluster-wide index whose claim, job, run, TaskRun and pod watches have each listed
    /// nothing: synced and empty.
    pub(crate) fn listed_empty() -> Index {
        let mut index = Index::default();
        index.apply::<ClaimFacts>(Change::InitDone(None));
        index.apply::<JobEntry>(Change::InitDone(None));
        index.apply::<RunEntry>(Change::InitDone(None));
        index.apply::<TaskRunEntry>(Change::InitDone(None));
        index.apply::<PodEntry>(Change::InitDone(None));
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::facts::VolumeClaims;
    use crate::decide::linking::Lookup;

    pub(super) fn claim(name: &str) -> ClaimFacts {
        ClaimFacts::example(name)
    }

    pub(super) fn job(name: &str, uid: &str) -> JobEntry {
        JobEntry {
            key: ObjectKey::new("ml", name),
            uid: uid.into(),
            progress: Progress::Running,
            volumes: VolumeClaims::Named(Vec::new()),
        }
    }

    pub(super) fn run(name: &str, claims: &[&str]) -> RunEntry {
        RunEntry {
            kind: OwnerKind::Run,
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            claims: claims.iter().map(|c| c.to_string()).collect(),
            progress: Progress::Running,
        }
    }

    pub(super) fn pod(name: &str, claims: &[&str], phase: &str) -> PodEntry {
        PodEntry {
            key: ObjectKey::new("ml", name),
            phase: Some(phase.into()),
            claims: claims.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// An index whose four kinds have listed once, empty.
    pub(super) fn synced() -> Index {
        let index = Index::listed_empty();
        assert!(index.synced());
        index
    }

    pub(super) fn keys(names: &[&str]) -> BTreeSet<ObjectKey> {
        names.iter().map(|n| ObjectKey::new("ml", n)).collect()
    }

    #[test]
    fn failed_runs_rank_through_changes_and_wake_their_namespace() {
        let at = |minute| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::minutes(minute);
        let failed = |name: &str, minute| RunEntry {
            progress: Progress::Finished {
                at: Some(at(minute)),
                failed: true,
            },
            ..run(name, &[])
        };
        let mut off = synced();
        off.apply(Change::Apply(claim("x")));
        let woken = off.apply(Change::Apply(failed("r1", 5)));
        assert!(woken.is_empty(), "nothing keeps by count: {woken:?}");
        // A namespace that sets its own keep-failed keeps by count.
        let mut annotated = Index::listed_empty().with_namespaces();
        annotated.apply::<NamespaceEntry>(Change::InitDone(None));
        annotated.apply(Change::Apply(claim("x")));
        annotated.apply(Change::Apply(NamespaceEntry {
            key: ObjectKey::new("", "ml"),
            annotations: [(NS_KEEP_FAILED.to_owned(), "1".to_owned())].into(),
        }));
        let woken = annotated.apply(Change::Apply(failed("r1", 5)));
        assert_eq!(woken, keys(&["x"]));
        let mut index = synced().with_keep_failed(2);
        index.apply(Change::Apply(claim("x")));
        index.apply(Change::Apply(claim("y")));
        let count = |index: &Index| index.failed_after(OwnerKind::Run, "ml", at(1));
        assert_eq!(count(&index), Found::Yes(0));
        let woken = index.apply(Change::Apply(failed("r1", 5)));
        assert_eq!(woken, keys(&["x", "y"]), "every claim of its namespace");
        index.apply(Change::Apply(failed("r2", 5)));
        index.apply(Change::Apply(failed("r3", 1)));
        index.apply(Change::Apply(TaskRunEntry(RunEntry {
            kind: OwnerKind::TaskRun,
            ..failed("t1", 9)
        })));
        assert_eq!(
            count(&index),
            Found::Yes(2),
            "later failures of its kind only"
        );
        assert_eq!(
            index.failed_after(OwnerKind::Run, "other", at(1)),
            Found::Yes(0)
        );
        index.apply(Change::Apply(run("r1", &[])));
        assert_eq!(
            count(&index),
            Found::Yes(1),
            "a changed run counts as it is now"
        );
        index.apply::<RunEntry>(Change::Delete(ObjectKey::new("ml", "r2")));
        assert_eq!(count(&index), Found::Yes(0));
        index.apply::<RunEntry>(Change::Delete(ObjectKey::new("ml", "r3")));
        let left: Vec<_> = index.failed_by_namespace["ml"].keys().collect();
        assert_eq!(
            left,
            [&(OwnerKind::TaskRun, at(9))],
            "only the TaskRun's is left"
        );
        assert!(matches!(
            Index::default().failed_after(OwnerKind::Run, "ml", at(1)),
            Found::Unknown(_)
        ));
    }

    #[test]
    fn namespace_size_counts_runs_and_pods_through_changes_and_relists() {
        let mut index = synced();
        index.apply(Change::Apply(run("r1", &["a"])));
        index.apply(Change::Apply(run("r1", &["a", "b"])));
        index.apply(Change::Apply(TaskRunEntry(run("t1", &["a"]))));
        index.apply(Change::Apply(pod("p1", &["a"], "Running")));
        index.apply(Change::Apply(pod("p2", &["a"], "Running")));
        index.apply(Change::Apply(claim("a")));
        assert_eq!(index.namespace_size("ml"), 4, "a changed run counts once");
        assert_eq!(index.namespace_size("other"), 0);
        index.apply::<PodEntry>(Change::Delete(ObjectKey::new("ml", "p1")));
        index.apply::<PodEntry>(Change::Delete(ObjectKey::new("ml", "p1")));
        assert_eq!(index.namespace_size("ml"), 3, "a deletion counts once");
        // A re-list that no longer has the run and the TaskRun drops them.
        for kind in [Change::Init(None), Change::InitDone(None)] {
            index.apply::<RunEntry>(kind);
        }
        index.apply::<TaskRunEntry>(Change::Init(None));
        index.apply::<TaskRunEntry>(Change::InitDone(None));
        assert_eq!(index.namespace_size("ml"), 1);
        index.apply::<PodEntry>(Change::Delete(ObjectKey::new("ml", "p2")));
        assert_eq!(index.namespace_size("ml"), 0);
        assert!(
            index.sizes_by_namespace.is_empty(),
            "no namespace left behind"
        );
    }

    #[test]
    fn a_relist_replaces_its_scope_and_reports_what_vanished() {
        let mut index = Index::new(&[Some("ml".into()), Some("other".into())]);
        let in_other = |name: &str| {
            let mut c = claim(name);
            c.key.namespace = "other".into();
            c
        };
        for scope in ["ml", "other"] {
            index.apply::<ClaimFacts>(Change::Init(Some(scope.into())));
        }
        index.apply(Change::InitApply(Some("ml".into()), claim("a")));
        index.apply(Change::InitApply(Some("other".into()), in_other("b")));
        index.apply::<ClaimFacts>(Change::InitDone(Some("ml".into())));
        assert!(!index.claims.synced(), "one scope is still listing");
        index.apply::<ClaimFacts>(Change::InitDone(Some("other".into())));
        assert!(index.claims.synced());
        assert_eq!(index.claims.len(), 2);

        // A re-list of "ml" that no longer has `a` removes it and leaves "other" alone.
        index.apply::<ClaimFacts>(Change::Init(Some("ml".into())));
        index.apply(Change::InitApply(Some("ml".into()), claim("c")));
        let affected = index.apply::<ClaimFacts>(Change::InitDone(Some("ml".into())));
        assert_eq!(affected, keys(&["a", "c"]));
        let names: BTreeSet<_> = index.claims().map(|c| c.key.name.clone()).collect();
        assert_eq!(names, ["b", "c"].into_iter().map(String::from).collect());

        // Of two events of one object during a re-list, the later one is kept.
        let mut changed = claim("c");
        changed.resource_version = "2".into();
        index.apply::<ClaimFacts>(Change::Init(Some("ml".into())));
        index.apply(Change::InitApply(Some("ml".into()), claim("c")));
        index.apply(Change::InitApply(Some("ml".into()), changed.clone()));
        let affected = index.apply::<ClaimFacts>(Change::InitDone(Some("ml".into())));
        assert_eq!(affected, keys(&["c"]));
        assert_eq!(index.claim(&ObjectKey::new("ml", "c")), Some(&changed));
    }

    pub(super) fn task_run(name: &str, claims: &[&str]) -> TaskRunEntry {
        let mut run = run(name, claims);
        run.kind = OwnerKind::TaskRun;
        TaskRunEntry(run)
    }

    #[test]
    fn an_owner_kind_not_served_where_it_can_be_read_is_unknown_until_listed_again() {
        let mut index = synced();
        for name in ["a", "b"] {
            index.apply(Change::Apply(claim(name)));
        }
        index.apply(Change::Apply(task_run("t1", &["a"])));
        index.update(Update::Delivered(Kind::TaskRuns, None, 40));
        let binding = |index: &Index, name| index.runs_binding(&ObjectKey::new("ml", name));

        let why = "TaskRun is served only at tekton.dev/v2".to_owned();
        let affected = index.update(Update::Unserved(OwnerKind::TaskRun, None, Some(why)));
        assert_eq!(affected, keys(&["a", "b"]), "every claim it could protect");
        assert!(index.synced(), "decided, and kept");
        for name in ["a", "b"] {
            let Found::Unknown(said) = binding(&index, name) else {
                panic!("{name}: known")
            };
            assert!(said.contains("tekton.dev/v2"), "{said}");
        }
        assert!(matches!(
            index.run(OwnerKind::TaskRun, "ml", "t1"),
            Found::Unknown(_)
        ));
        assert_eq!(index.run(OwnerKind::Run, "ml", "r1"), Found::No);
        assert_eq!(index.delivered(Kind::TaskRuns, &None), None, "forgotten");
        assert_eq!(index.namespace_size("ml"), 0, "its entries went");

        // Served again where it can be read: a list makes it known, and every claim is decided
        // again.
        index.apply::<TaskRunEntry>(Change::Init(None));
        index.apply(Change::InitApply(None, task_run("t2", &["b"])));
        let affected = index.apply::<TaskRunEntry>(Change::InitDone(None));
        assert_eq!(affected, keys(&["a", "b"]));
        assert_eq!(binding(&index, "a"), Found::Yes(Vec::new()));
        assert!(matches!(binding(&index, "b"), Found::Yes(runs) if runs.len() == 1));
    }

    #[test]
    fn jobs_not_served_where_they_can_be_read_may_name_any_claim() {
        let mut index = synced();
        index.apply(Change::Apply(claim("a")));
        let naming = |index: &Index| index.jobs_naming(&ObjectKey::new("ml", "a"));
        assert_eq!(naming(&index), Found::Yes(Vec::new()));
        let why = "NotebookValidationJob is served only at mlops.mlops.dev/v1alpha2".to_owned();
        let affected = index.update(Update::Unserved(OwnerKind::Job, None, Some(why)));
        assert_eq!(affected, keys(&["a"]));
        let Found::Unknown(said) = naming(&index) else {
            panic!("known: {:?}", naming(&index))
        };
        assert!(said.contains("v1alpha2"), "{said}");
    }

    #[test]
    fn an_optional_kind_its_group_serves_at_no_version_is_listed_and_empty() {
        let mut index = Index::default();
        for kind in [Change::InitDone(None), Change::Apply(claim("a"))] {
            index.apply::<ClaimFacts>(kind);
        }
        index.apply::<JobEntry>(Change::InitDone(None));
        index.apply::<RunEntry>(Change::InitDone(None));
        index.apply::<PodEntry>(Change::InitDone(None));
        assert!(!index.synced(), "the TaskRuns have not been told");
        index.update(Update::Delivered(Kind::TaskRuns, None, 40));
        let affected = index.update(Update::Unserved(OwnerKind::TaskRun, None, None));
        assert!(index.synced());
        assert!(affected.is_empty(), "known before and after: {affected:?}");
        assert_eq!(index.run(OwnerKind::TaskRun, "ml", "t1"), Found::No);
        let claim = ObjectKey::new("ml", "a");
        assert_eq!(index.runs_binding(&claim), Found::Yes(Vec::new()));
        assert_eq!(index.delivered(Kind::TaskRuns, &None), None, "forgotten");
    }
}
