//! The in-memory index the watchers feed: stripped entries for claims, jobs, PipelineRuns,
//! TaskRuns, pods and ResourceQuotas,
//! with the secondary indices that map a change of any of them to exactly the claims it can
//! affect. No I/O; the controller applies watcher events and schedules what comes back.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::ops::Bound;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::contract::annotations::NS_KEEP_FAILED;
use crate::contract::{JOB_KIND, OwnerKind, RUN_KIND, TASK_RUN_KIND, naming};
use std::collections::BTreeMap;

use crate::decide::facts::{
    ClaimFacts, JobEntry, MAX_KEEP_FAILED, NamespaceEntry, ObjectKey, PodEntry, PodUse, Progress,
    RunEntry, VolumeClaims,
};
use crate::decide::linking::{Found, Lookup};
use crate::decide::quota::QuotaEntry;
use crate::observe::metrics::Kind;

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

/// One kind's entries, each stored under its own key: a map from key to entry would hold every
/// key twice.
#[derive(Debug)]
pub struct Table<E> {
    items: HashSet<Keyed<E>>,
    /// Scopes that have not finished their first list.
    unsynced: HashSet<Scope>,
    /// Scopes whose kind is not served where it can be read, and why: nothing in them is
    /// known (an owner kind's, [`Update::Unserved`]).
    unknown: HashMap<Scope, String>,
    relists: HashMap<Scope, HashSet<Keyed<E>>>,
}

/// An entry that hashes and compares as its key, so a set of them is looked up by key.
#[derive(Debug)]
struct Keyed<E>(E);

impl<E: Cached> Borrow<ObjectKey> for Keyed<E> {
    fn borrow(&self) -> &ObjectKey {
        self.0.key()
    }
}

impl<E: Cached> Hash for Keyed<E> {
    // As the key hashes, which `Borrow` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

impl<E: Cached> PartialEq for Keyed<E> {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl<E: Cached> Eq for Keyed<E> {}

impl<E> Table<E> {
    fn new(scopes: &[Scope]) -> Self {
        Self {
            items: HashSet::new(),
            unsynced: scopes.iter().cloned().collect(),
            unknown: HashMap::new(),
            relists: HashMap::new(),
        }
    }

    fn synced(&self) -> bool {
        self.unsynced.is_empty()
    }

    /// Why nothing of this kind is known in `namespace`, if so: its scope is unknown.
    fn unknown_in(&self, namespace: &str) -> Option<&str> {
        (self.unknown.iter())
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))
            .map(|(_, why)| why.as_str())
    }

    /// What the table says of the kind in `namespace` as a whole: unknown until listed, or
    /// while not served where it can be read.
    fn known_in(&self, namespace: &str, what: &str) -> Result<(), String> {
        if !self.synced() {
            return Err(format!("the {what} cache has not synced yet"));
        }
        match self.unknown_in(namespace) {
            Some(why) => Err(why.to_owned()),
            None => Ok(()),
        }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn values(&self) -> impl Iterator<Item = &E> {
        self.items.iter().map(|entry| &entry.0)
    }
}

impl<E: Cached> Table<E> {
    fn entry(&self, key: &ObjectKey) -> Option<&E> {
        self.items.get(key).map(|entry| &entry.0)
    }

    fn get(&self, key: &ObjectKey, what: &str) -> Found<E> {
        if let Err(why) = self.known_in(&key.namespace, what) {
            return Found::Unknown(why);
        }
        self.entry(key).cloned().map_or(Found::No, Found::Yes)
    }
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
}

/// One namespace's failed owners with a completion time: how many of each kind finished then.
type Failures = BTreeMap<(OwnerKind, DateTime<Utc>), u32>;

/// A cache entry kind: where it lives in the index and which claims it touches.
pub trait Cached: Clone + PartialEq + Sized {
    /// A name for messages ("PipelineRun").
    const WHAT: &'static str;
    fn key(&self) -> &ObjectKey;
    fn table(index: &mut Index) -> &mut Table<Self>;
    /// Adds (or removes) this entry's secondary-index rows.
    fn index(&self, index: &mut Index, add: bool);
    /// The claims whose facts depend on this entry.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>);
}

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

/// One row of a secondary index: a sorted set with no spare capacity. A row holds one or two
/// values (a claim's pods, the runs binding it), and there is a row per claim: a `BTreeSet`
/// would allocate a whole node (eleven slots) for each, a `Vec` its growth headroom.
type Row<V> = Box<[V]>;

/// Adds or removes `value` under `key`, dropping empty rows so the maps do not grow forever.
/// Rows change only when an object's links do, so re-allocating a row each time costs little.
fn set_row<K, V>(map: &mut HashMap<K, Row<V>>, key: K, value: V, add: bool)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if add {
        let row = map.entry(key).or_default();
        if let Err(at) = row.binary_search(&value) {
            let mut values = std::mem::take(row).into_vec();
            values.insert(at, value);
            *row = values.into_boxed_slice();
        }
    } else if let Some(row) = map.get_mut(&key)
        && let Ok(at) = row.binary_search(&value)
    {
        let mut values = std::mem::take(row).into_vec();
        values.remove(at);
        if values.is_empty() {
            map.remove(&key);
        } else {
            *row = values.into_boxed_slice();
        }
    }
}

fn sibling(key: &ObjectKey, name: String) -> ObjectKey {
    ObjectKey {
        namespace: key.namespace.clone(),
        name,
    }
}

impl Cached for ClaimFacts {
    const WHAT: &'static str = "PersistentVolumeClaim";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.claims
    }

    fn index(&self, index: &mut Index, add: bool) {
        for reference in &self.owner_references {
            set_row(
                &mut index.claims_by_owner,
                reference.uid.clone(),
                self.key.clone(),
                add,
            );
        }
    }

    fn affected(&self, _: &Index, out: &mut BTreeSet<ObjectKey>) {
        // A claim's own change always counts, even its deletion (to drop its schedule).
        out.insert(self.key.clone());
    }
}

impl Cached for JobEntry {
    const WHAT: &'static str = JOB_KIND;

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.jobs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index.count(&self.key, add);
        index.count_failed(OwnerKind::Job, &self.key, &self.progress, add);
        let name = self.key.name.clone();
        match &self.volumes {
            VolumeClaims::Named(claims) => {
                for claim in claims {
                    let claim = sibling(&self.key, claim.clone());
                    set_row(&mut index.jobs_by_claim, claim, name.clone(), add);
                }
            }
            VolumeClaims::Unreadable => {
                let namespace = self.key.namespace.clone();
                set_row(&mut index.unreadable_jobs, namespace, name, add);
            }
        }
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        index.tracked(sibling(&self.key, naming::claim(&self.key.name)), out);
        index.owned_by(&self.uid, out);
        ranked_below(&self.key, &self.progress, index, out);
        match &self.volumes {
            VolumeClaims::Named(claims) => {
                for claim in claims {
                    index.tracked(sibling(&self.key, claim.clone()), out);
                }
            }
            VolumeClaims::Unreadable => {
                out.extend((index.claims_in(&self.key.namespace)).map(|claim| claim.key.clone()))
            }
        }
    }
}

impl Cached for RunEntry {
    const WHAT: &'static str = RUN_KIND;

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.runs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index_bindings(self, index, add);
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        bound_claims(self, index, out);
        ranked_below(&self.key, &self.progress, index, out);
        if let Some(job) = naming::job_of_run(&self.key.name) {
            index.tracked(sibling(&self.key, naming::claim(job)), out);
        }
    }
}

impl Cached for TaskRunEntry {
    const WHAT: &'static str = TASK_RUN_KIND;

    fn key(&self) -> &ObjectKey {
        &self.0.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.task_runs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index_bindings(&self.0, index, add);
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        bound_claims(&self.0, index, out);
        ranked_below(&self.0.key, &self.0.progress, index, out);
    }
}

/// Adds (or removes) a run's rows in the claim → binding runs index, and counts it.
fn index_bindings(run: &RunEntry, index: &mut Index, add: bool) {
    index.count(&run.key, add);
    index.count_failed(run.kind, &run.key, &run.progress, add);
    for claim in &run.claims {
        let claim = sibling(&run.key, claim.clone());
        let row = (run.kind, run.key.name.clone());
        set_row(&mut index.runs_by_claim, claim, row, add);
    }
}

/// A failed owner with a completion time ranks every other failed build of its namespace: where
/// claims may be kept by count (`Policy::keep_failed`), a new one may push one out, so each
/// claim there is re-evaluated (once per change, see [`Index::expand`]).
fn ranked_below(
    key: &ObjectKey,
    progress: &Progress,
    index: &Index,
    out: &mut BTreeSet<ObjectKey>,
) {
    if matches!(
        progress,
        Progress::Finished {
            at: Some(_),
            failed: true
        }
    ) && index.keeps_by_count(&key.namespace)
    {
        out.insert(ObjectKey::new(&key.namespace, ""));
    }
}

/// The claims a run touches through its bindings and its UID.
fn bound_claims(run: &RunEntry, index: &Index, out: &mut BTreeSet<ObjectKey>) {
    for claim in &run.claims {
        index.tracked(sibling(&run.key, claim.clone()), out);
    }
    index.owned_by(&run.uid, out);
}

impl Cached for PodEntry {
    const WHAT: &'static str = "Pod";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.pods
    }

    fn index(&self, index: &mut Index, add: bool) {
        index.count(&self.key, add);
        for claim in &self.claims {
            let claim = sibling(&self.key, claim.clone());
            set_row(&mut index.pods_by_claim, claim, self.key.name.clone(), add);
        }
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        for claim in &self.claims {
            index.tracked(sibling(&self.key, claim.clone()), out);
        }
    }
}

impl Cached for QuotaEntry {
    const WHAT: &'static str = "ResourceQuota";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.quotas
    }

    fn index(&self, _: &mut Index, _: bool) {}

    /// Pressure in a namespace may choose any of its claims.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        out.extend(
            index
                .claims_in(&self.key.namespace)
                .map(|claim| claim.key.clone()),
        );
    }
}

impl Cached for NamespaceEntry {
    const WHAT: &'static str = "Namespace";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.namespaces
    }

    fn index(&self, _: &mut Index, _: bool) {}

    /// Its settings apply to every claim in it.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        out.extend(
            index
                .claims_in(&self.key.name)
                .map(|claim| claim.key.clone()),
        );
    }
}

impl Lookup for Index {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry> {
        self.jobs
            .get(&ObjectKey::new(namespace, name), JobEntry::WHAT)
    }

    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry> {
        let key = ObjectKey::new(namespace, name);
        match kind {
            OwnerKind::TaskRun => self
                .task_runs
                .get(&key, TaskRunEntry::WHAT)
                .map(|entry| entry.0),
            OwnerKind::Run | OwnerKind::Job => self.runs.get(&key, RunEntry::WHAT),
        }
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        let namespace = &claim.namespace;
        for known in [
            self.runs.known_in(namespace, RunEntry::WHAT),
            self.task_runs.known_in(namespace, TaskRunEntry::WHAT),
        ] {
            if let Err(why) = known {
                return Found::Unknown(why);
            }
        }
        let runs = self.runs_by_claim.get(claim).into_iter().flatten();
        Found::Yes(
            runs.filter_map(|(kind, name)| {
                let key = sibling(claim, name.clone());
                match kind {
                    OwnerKind::TaskRun => self.task_runs.entry(&key).map(|e| e.0.clone()),
                    OwnerKind::Run | OwnerKind::Job => self.runs.entry(&key).cloned(),
                }
            })
            .collect(),
        )
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        // Jobs not served where they can be read may name any claim of the namespace.
        if let Err(why) = self.jobs.known_in(&claim.namespace, JobEntry::WHAT) {
            return Found::Unknown(why);
        }
        let named = self.jobs_by_claim.get(claim).into_iter().flatten();
        let unreadable = (self.unreadable_jobs.get(&*claim.namespace))
            .into_iter()
            .flatten();
        Found::Yes(
            named
                .chain(unreadable)
                .filter_map(|name| self.jobs.entry(&sibling(claim, name.clone())))
                .cloned()
                .collect(),
        )
    }

    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32> {
        let known = match kind {
            OwnerKind::Job => self.jobs.known_in(namespace, JobEntry::WHAT),
            OwnerKind::Run => self.runs.known_in(namespace, RunEntry::WHAT),
            OwnerKind::TaskRun => self.task_runs.known_in(namespace, TaskRunEntry::WHAT),
        };
        if let Err(why) = known {
            return Found::Unknown(why);
        }
        let Some(times) = self.failed_by_namespace.get(namespace) else {
            return Found::Yes(0);
        };
        let later = (
            Bound::Excluded((kind, at)),
            Bound::Included((kind, DateTime::<Utc>::MAX_UTC)),
        );
        let mut newer = 0u32;
        for count in times.range(later).map(|(_, n)| *n) {
            newer = newer.saturating_add(count);
            if newer >= MAX_KEEP_FAILED {
                return Found::Yes(MAX_KEEP_FAILED);
            }
        }
        Found::Yes(newer)
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        if !self.pods.synced() {
            return Found::Unknown(format!("the {} cache has not synced yet", PodEntry::WHAT));
        }
        let pods = self.pods_by_claim.get(claim).into_iter().flatten();
        Found::Yes(
            pods.filter_map(|name| self.pods.entry(&sibling(claim, name.clone())))
                .map(|pod| PodUse {
                    name: pod.key.name.clone(),
                    phase: pod.phase.clone(),
                })
                .collect(),
        )
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
    use crate::contract::OwnerKind;
    use crate::decide::facts::{LinkRule, OwnerRef, OwnerState, Progress, Users};
    use crate::decide::linking;

    fn claim(name: &str) -> ClaimFacts {
        ClaimFacts::example(name)
    }

    fn job(name: &str, uid: &str) -> JobEntry {
        JobEntry {
            key: ObjectKey::new("ml", name),
            uid: uid.into(),
            progress: Progress::Running,
            volumes: VolumeClaims::Named(Vec::new()),
        }
    }

    fn run(name: &str, claims: &[&str]) -> RunEntry {
        RunEntry {
            kind: OwnerKind::Run,
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            claims: claims.iter().map(|c| c.to_string()).collect(),
            progress: Progress::Running,
        }
    }

    fn pod(name: &str, claims: &[&str], phase: &str) -> PodEntry {
        PodEntry {
            key: ObjectKey::new("ml", name),
            phase: Some(phase.into()),
            claims: claims.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// An index whose four kinds have listed once, empty.
    fn synced() -> Index {
        let index = Index::listed_empty();
        assert!(index.synced());
        index
    }

    fn keys(names: &[&str]) -> BTreeSet<ObjectKey> {
        names.iter().map(|n| ObjectKey::new("ml", n)).collect()
    }

    #[test]
    fn unsynced_kinds_are_unknown_not_absent() {
        let mut index = Index::default();
        index.apply(Change::Apply(claim("a-build-workspace")));
        let facts = linking::facts(
            index
                .claim(&ObjectKey::new("ml", "a-build-workspace"))
                .unwrap(),
            &index,
        );
        assert!(matches!(facts.users, Users::Unknown { .. }));
        assert!(
            facts
                .owners
                .iter()
                .all(|o| matches!(o.state, OwnerState::Unknown { .. }))
        );
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
    fn changes_affect_exactly_the_linked_claims() {
        let mut index = synced();
        for name in ["nb-build-workspace", "other-build-workspace", "shared"] {
            assert_eq!(index.apply(Change::Apply(claim(name))), keys(&[name]));
        }
        // A job affects its conventional claim.
        assert_eq!(
            index.apply(Change::Apply(job("nb", "j1"))),
            keys(&["nb-build-workspace"])
        );
        // A run affects the claims it binds and its conventional one.
        assert_eq!(
            index.apply(Change::Apply(run("nb-build", &["shared"]))),
            keys(&["nb-build-workspace", "shared"])
        );
        // A pod affects the claims it mounts (untracked ones are dropped).
        assert_eq!(
            index.apply(Change::Apply(pod(
                "p",
                &["shared", "not-tracked"],
                "Running"
            ))),
            keys(&["shared"])
        );
        // An unchanged object affects nothing.
        assert!(
            index
                .apply(Change::Apply(pod(
                    "p",
                    &["shared", "not-tracked"],
                    "Running"
                )))
                .is_empty()
        );
        // Re-binding affects the old and the new claim.
        assert_eq!(
            index.apply(Change::Apply(run("nb-build", &["other-build-workspace"]))),
            keys(&["nb-build-workspace", "shared", "other-build-workspace"])
        );
        assert_eq!(
            index.apply::<PodEntry>(Change::Delete(ObjectKey::new("ml", "p"))),
            keys(&["shared"])
        );
    }

    #[test]
    fn a_job_reaches_the_claims_its_volumes_name() {
        let mut index = synced();
        for name in ["a-build-workspace", "other", "b-build-workspace"] {
            index.apply(Change::Apply(claim(name)));
        }
        let mut b = job("b", "j2");
        b.volumes = VolumeClaims::Named(vec!["a-build-workspace".into()]);
        assert_eq!(
            index.apply(Change::Apply(b.clone())),
            keys(&["a-build-workspace", "b-build-workspace"])
        );
        let naming_a =
            |index: &Index| index.jobs_naming(&ObjectKey::new("ml", "a-build-workspace"));
        assert_eq!(naming_a(&index), Found::Yes(vec![b.clone()]));
        assert_eq!(
            index.jobs_naming(&ObjectKey::new("ml", "other")),
            Found::Yes(vec![])
        );
        // It finishes: the claim it named is decided again.
        let mut finished = b.clone();
        finished.progress = Progress::Finished {
            at: None,
            failed: false,
        };
        assert_eq!(
            index.apply(Change::Apply(finished)),
            keys(&["a-build-workspace", "b-build-workspace"])
        );
        // Volumes that cannot be read may name any claim of the namespace.
        let mut odd = job("odd", "j3");
        odd.volumes = VolumeClaims::Unreadable;
        assert_eq!(
            index.apply(Change::Apply(odd.clone())),
            keys(&["a-build-workspace", "other", "b-build-workspace"])
        );
        assert!(matches!(naming_a(&index), Found::Yes(jobs) if jobs.len() == 2));
        assert_eq!(
            index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "odd"))),
            keys(&["a-build-workspace", "other", "b-build-workspace"])
        );
        index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "b")));
        assert_eq!(naming_a(&index), Found::Yes(vec![]));
        assert!(index.jobs_by_claim.is_empty() && index.unreadable_jobs.is_empty());
    }

    #[test]
    fn owner_reference_changes_reach_the_owned_claim() {
        let mut index = synced();
        let mut owned = claim("custom-name");
        owned.owner_references.push(OwnerRef {
            api_version: "mlops.mlops.dev/v1alpha1".into(),
            kind: "NotebookValidationJob".into(),
            name: "nb".into(),
            uid: "j1".into(),
        });
        index.apply(Change::Apply(owned.clone()));
        assert_eq!(
            index.apply(Change::Apply(job("nb", "j1"))),
            keys(&["custom-name"])
        );
        let facts = linking::facts(&owned, &index);
        assert_eq!(facts.owners.len(), 1);
        assert_eq!(facts.owners[0].rule, LinkRule::OwnerReference);
        assert!(matches!(facts.owners[0].state, OwnerState::Present { .. }));

        // Re-created under the same name: a different owner, so the referenced one is gone.
        index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "nb")));
        index.apply(Change::Apply(job("nb", "j2")));
        let facts = linking::facts(&owned, &index);
        assert_eq!(facts.owners[0].state, OwnerState::Gone);
    }

    #[test]
    fn every_rule_adds_its_owners() {
        let mut index = synced();
        let key = ObjectKey::new("ml", "nb-build-workspace");
        index.apply(Change::Apply(claim("nb-build-workspace")));
        index.apply(Change::Apply(job("nb", "j1")));
        index.apply(Change::Apply(run("nb-build", &[])));
        let owners = |index: &Index| {
            let facts = linking::facts(index.claim(&key).unwrap(), index);
            facts
                .owners
                .iter()
                .map(|o| (o.kind, o.name.clone(), o.rule))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            owners(&index),
            vec![
                (OwnerKind::Job, "nb".into(), LinkRule::Naming),
                (OwnerKind::Run, "nb-build".into(), LinkRule::Naming)
            ]
        );

        // A re-run and a TaskRun that bind the claim add to the owners found by name; a TaskRun
        // touches the claim it binds.
        index.apply(Change::Apply(run("retry-7", &["nb-build-workspace"])));
        let mut task_run = run("nb-build", &["nb-build-workspace"]);
        task_run.kind = OwnerKind::TaskRun;
        assert_eq!(
            index.apply(Change::Apply(TaskRunEntry(task_run))),
            keys(&["nb-build-workspace"])
        );
        assert_eq!(
            owners(&index),
            vec![
                (OwnerKind::Run, "retry-7".into(), LinkRule::WorkspaceBinding),
                (
                    OwnerKind::TaskRun,
                    "nb-build".into(),
                    LinkRule::WorkspaceBinding
                ),
                (OwnerKind::Job, "nb".into(), LinkRule::Naming),
                (OwnerKind::Run, "nb-build".into(), LinkRule::Naming)
            ]
        );
    }

    #[test]
    fn a_quota_change_affects_every_claim_of_its_namespace_only() {
        use crate::decide::quota::{Limit, QuotaEntry, Resource};
        let mut index = synced();
        let mut elsewhere = claim("b");
        elsewhere.key.namespace = "other".into();
        index.apply(Change::Apply(claim("a")));
        index.apply(Change::Apply(claim("c")));
        index.apply(Change::Apply(elsewhere));
        let quota = |used| QuotaEntry {
            key: ObjectKey::new("ml", "q"),
            uid: "q".into(),
            limits: vec![Limit {
                resource: Resource::Claims,
                hard: 10,
                used,
            }],
        };
        assert_eq!(index.apply(Change::Apply(quota(9))), keys(&["a", "c"]));
        assert!(index.apply(Change::Apply(quota(9))).is_empty(), "unchanged");
        assert_eq!(index.quotas_in("ml"), Found::Yes(vec![quota(9)]));
        assert_eq!(index.quotas_in("other"), Found::Yes(vec![]));
        assert_eq!(index.quota_namespaces(), ["ml".to_owned()].into());
        let waiting = Index::default().with_quotas(&[None]);
        assert!(!waiting.synced(), "waits for the quota watch to list");
        assert!(matches!(waiting.quotas_in("ml"), Found::Unknown(_)));
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

    fn task_run(name: &str, claims: &[&str]) -> TaskRunEntry {
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
