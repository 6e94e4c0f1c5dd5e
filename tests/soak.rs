//! The randomized safety run: minutes of random workload against a dedicated control plane
//! with faults injected, then a check of every delete the daemon sent against the ground truth
//! this driver kept. Run it with `scripts/soak` (see RELIABILITY.md): an ignored test, so
//! `cargo test` builds it and CI skips it (it takes minutes).
//!
//! - **The cluster**: etcd, kube-apiserver (watch cache off, so that compacting etcd expires
//!   the resourceVersions watches resume from; an audit log of every claim delete) and
//!   kube-controller-manager (garbage collector, PVC protection).
//! - **The daemon**: two replicas of the real binary with leader election, with the shipped
//!   RBAC (manifests/base), each as its own ServiceAccount (bound by the shipped bindings) so
//!   that the audit log tells them apart, each through its own HTTP fault [`Proxy`]. With
//!   `--clock-offset`, the second runs under libfaketime with its wall clock that far off.
//! - **The workload**: builds created, finished, failed and deleted (job and run), claims owned
//!   by reference, orphan claims, pods starting and stopping on claims, the keep, ttl and
//!   expires annotations set and removed, invalid annotations, claims deleted and re-created
//!   under the same name.
//! - **The faults**: kube-apiserver killed and restarted, etcd killed and restarted, etcd
//!   compacted under both replicas, the leader alone partitioned, the leader's watches stalled
//!   silently, the leader killed with SIGKILL (and started again), and a restart storm: a
//!   burst of [`CAP`] claims due at once, then the leader killed and restarted again and again
//!   within one [`WINDOW`] of the tight blast-radius cap; throttling bursts on the leader's
//!   connection: its DELETEs, its live re-check LISTs or its Lease writes answered 429 with
//!   `Retry-After`, everything answered 503, or its re-check LISTs answered too late to be live.
//! - **The ground truth**: for every claim incarnation (UID), the history of the states that
//!   decide its fate, each bracketed by the times before and after the API call that made it.
//!   Protections (a pod, `keep`, a later deadline) are only ever added to a claim that is not
//!   due and will not be for [`MARGIN`], so that a delete that races the change is not mistaken
//!   for a wrong one.
//! - **The check**: every delete in the API server's audit log sent by the daemon's
//!   ServiceAccounts that succeeded must name a claim that was due and unprotected at that moment
//!   (wrong deletions: zero), no claim may be deleted twice, every claim that has been due
//!   for [`BOUND`] must be gone (missed deletions: zero), and no rolling [`WINDOW`] may hold
//!   more than [`CAP`] of them (cap exceeded: never). Every claim that went away must have its
//!   successful DELETE in the audit log (an empty or partial log fails the run), and every
//!   DELETE the daemon sent must meet the audit-log invariant ([`DeleteInvariant`]: from the
//!   Lease holder within its renew deadline, after a live re-check within [`RECHECK_BOUND`],
//!   once per decision, counting the attempts the proxies refused). Exit status 1 otherwise.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use serde_json::{Value, json};
use support::{
    AuditEvent, BUILD_WORKSPACE_LABEL, ClaimBuilder, ControlPlane, ControlPlaneOptions,
    DEFAULT_RECHECK_BOUND, DeleteInvariant, Fault, JobBuilder, PipelineRunBuilder, Process, Proxy,
    Rule, TestNamespace, invariant_audit_rules, metric_sum, notebook_validation_job_resource,
    pipeline_run_resource, read_audit, service_account,
};
use tokio::sync::{Mutex, RwLock};

/// The daemon's policy in this run (set through its environment), and the same numbers for
/// the ground truth.
const TTL: i64 = 20;
const ORPHAN_GRACE: i64 = 30;
const MAX_AGE: i64 = 150;
/// A protection is added only to a claim not due for at least this long.
const MARGIN: i64 = 5;
/// The blast-radius cap: at most this many deletions in any rolling [`WINDOW`] seconds. Tight:
/// about twice the workload's usual rate, so a burst meets it.
const CAP: u32 = 30;
const WINDOW: i64 = 30;
/// A claim due (and unprotected) for this long must be gone: the longest fault (an API server
/// down for 15 s, then kube-runtime's watch backoff of up to 30 s) with room to spare, plus a
/// window in which the cap may hold it back.
const BOUND: i64 = 90 + WINDOW;
/// The replicas and their ServiceAccounts: the shipped one, and a second the shipped bindings
/// also name.
const REPLICAS: [(&str, &str); 2] = [
    ("replica-a", "workspace-gc"),
    ("replica-b", "workspace-gc-b"),
];
const NAMESPACES: [&str; 3] = ["soak-a", "soak-b", "soak-c"];
const LEASE_NAMESPACE: &str = "workspace-gc";
const LEASE_NAME: &str = "workspace-gc";
const LEASE_DURATION: Duration = Duration::from_secs(6);
/// How old the live re-check a DELETE rests on may be, by the API server's clock.
const RECHECK_BOUND: Duration = DEFAULT_RECHECK_BOUND;
/// Longer than [`RECHECK_BOUND`]: a re-check answered this late is not live.
const SLOW_LIST: Duration = Duration::from_secs(12);

/// The daemon's usernames, as the audit log names them.
fn daemon_users() -> Vec<String> {
    REPLICAS
        .iter()
        .map(|(_, account)| service_account(LEASE_NAMESPACE, account))
        .collect()
}

#[derive(Debug, Parser)]
#[command(about = "The randomized safety run; see RELIABILITY.md")]
struct Args {
    /// Minutes of random workload with faults.
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Seed of the random choices (the timing still varies from run to run).
    #[arg(long)]
    seed: Option<u64>,
    /// Workload actions per second.
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// A fault every N to 2N seconds.
    #[arg(long, default_value_t = 15)]
    fault_every: u64,
    /// Seconds to wait after the workload, once every claim has been made collectable.
    #[arg(long, default_value_t = 75)]
    drain: u64,
    /// Self-check of the check: run the daemon with half the orphan grace the ground truth
    /// assumes, so its orphan deletions come too early and the run must report them as wrong.
    #[arg(long)]
    sabotage: bool,
    /// Runs the second replica under libfaketime with its wall clock this far off
    /// (libfaketime's syntax: "+2h", "-90m").
    #[arg(long, allow_hyphen_values = true)]
    clock_offset: Option<String>,
}

/// SplitMix64: reproducible choices without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

fn now() -> DateTime<Utc> {
    Utc::now()
}

fn seconds(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

// --- the ground truth -------------------------------------------------------------------------

/// A NotebookValidationJob's or PipelineRun's state, as the policy reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Absent,
    Running,
    Finished(DateTime<Utc>),
}

/// How a claim is tied to its build.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// `{job}-build-workspace`, with job `{job}` and run `{job}-build`.
    Naming(String),
    /// An owner reference to job `{job}` by UID (as `workspace-gc create` makes them).
    OwnerRef(String),
    /// No owner at all.
    Orphan,
}

/// What decides a claim's fate at one moment.
#[derive(Debug, Clone, PartialEq)]
struct State {
    keep: bool,
    invalid: bool,
    ttl: Option<i64>,
    expires: Option<DateTime<Utc>>,
    active_pods: usize,
    job: Owner,
    run: Owner,
}

#[derive(Debug, Clone)]
struct Snapshot {
    before: DateTime<Utc>,
    after: DateTime<Utc>,
    state: State,
}

/// The annotations the driver set on one claim.
#[derive(Debug, Clone, Default)]
struct Annotations {
    keep: bool,
    invalid: bool,
    ttl: Option<i64>,
    expires: Option<DateTime<Utc>>,
}

/// One claim incarnation: a UID.
#[derive(Debug, Clone)]
struct Incarnation {
    namespace: String,
    name: String,
    uid: String,
    created: DateTime<Utc>,
    link: Link,
    annotations: Annotations,
    history: Vec<Snapshot>,
    /// No longer exists (deleted by someone, seen missing or terminating).
    gone: bool,
    /// The driver deleted it (to re-create the name): not the daemon's to judge.
    driver_deleted: bool,
    /// A driver call about it failed in an unknown way: excluded from the check.
    tainted: bool,
}

impl Incarnation {
    fn deletable(&self, state: &State, at: DateTime<Utc>) -> bool {
        if state.keep || state.invalid || state.active_pods > 0 {
            return false;
        }
        if state.expires.is_some_and(|e| e <= at) || self.created + seconds(MAX_AGE) <= at {
            return true;
        }
        match self.relative(state) {
            Relative::Never => false,
            Relative::Now => true,
            Relative::At(due) => due <= at,
        }
    }

    /// The first moment from `at` on when the claim is deletable if nothing changes.
    fn next_due(&self, state: &State, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if state.keep || state.invalid || state.active_pods > 0 {
            return None;
        }
        let mut due = vec![self.created + seconds(MAX_AGE)];
        due.extend(state.expires);
        match self.relative(state) {
            Relative::Never => {}
            Relative::Now => due.push(at),
            Relative::At(t) => due.push(t),
        }
        due.into_iter().min().map(|t| t.max(at))
    }

    /// The owner-dependent deadline.
    fn relative(&self, state: &State) -> Relative {
        let ttl = seconds(state.ttl.unwrap_or(TTL));
        let owners: Vec<Owner> = [state.job, state.run]
            .into_iter()
            .filter(|o| *o != Owner::Absent)
            .collect();
        if owners.contains(&Owner::Running) {
            return Relative::Never;
        }
        if matches!(self.link, Link::OwnerRef(_)) && state.job == Owner::Absent {
            return Relative::Now;
        }
        let finished = owners.iter().filter_map(|o| match o {
            Owner::Finished(at) => Some(*at),
            _ => None,
        });
        match finished.max() {
            None => Relative::At(self.created + seconds(ORPHAN_GRACE)),
            Some(at) => Relative::At(at + ttl),
        }
    }

    /// The states that may have been in force at `at`: the last one surely applied, and any
    /// whose API call was in flight then.
    fn states_at(&self, at: DateTime<Utc>) -> Vec<&Snapshot> {
        let surely = self
            .history
            .iter()
            .rposition(|s| s.after <= at)
            .unwrap_or(0);
        self.history
            .iter()
            .enumerate()
            .filter(|(i, s)| *i == surely || (*i > surely && s.before <= at))
            .map(|(_, s)| s)
            .collect()
    }

    /// Since when the claim has been deletable without a break, as of `at`; None if it is not.
    fn deletable_since(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let states = self.states_at(at);
        let last = states.last()?;
        if !self.deletable(&last.state, at) {
            return None;
        }
        // The earliest moment this state made it deletable (its own deadline, or its start).
        let due = self.next_due(&last.state, last.before)?;
        let mut since = due.max(last.before);
        // Earlier states may have made it deletable already, back to the last that did not.
        for snapshot in self
            .history
            .iter()
            .rev()
            .skip_while(|s| s.before > last.before)
            .skip(1)
        {
            match self.next_due(&snapshot.state, snapshot.before) {
                Some(due) if due <= since => since = due.max(snapshot.before),
                _ => break,
            }
        }
        Some(since)
    }
}

enum Relative {
    Never,
    Now,
    At(DateTime<Utc>),
}

#[derive(Debug, Clone)]
struct Build {
    namespace: String,
    job: String,
    uid: String,
    /// `Absent` for builds whose claim names the job by reference (no run).
    run: Owner,
    state: Owner,
}

#[derive(Debug, Clone)]
struct PodModel {
    namespace: String,
    claim: String,
    active: bool,
    scheduled: bool,
}

#[derive(Default)]
struct World {
    builds: BTreeMap<(String, String), Build>,
    incarnations: Vec<Incarnation>,
    current: HashMap<(String, String), usize>,
    pods: BTreeMap<String, PodModel>,
    serial: u64,
    actions: BTreeMap<&'static str, u64>,
    failures: u64,
}

impl World {
    fn state_of(&self, namespace: &str, name: &str) -> Option<State> {
        let index = *self.current.get(&(namespace.into(), name.into()))?;
        let inc = &self.incarnations[index];
        let build = |job: &str| self.builds.get(&(namespace.to_owned(), job.to_owned()));
        let (job, run) = match &inc.link {
            Link::Naming(job) => {
                build(job).map_or((Owner::Absent, Owner::Absent), |b| (b.state, b.run))
            }
            Link::OwnerRef(job) => (build(job).map_or(Owner::Absent, |b| b.state), Owner::Absent),
            Link::Orphan => (Owner::Absent, Owner::Absent),
        };
        Some(State {
            keep: inc.annotations.keep,
            invalid: inc.annotations.invalid,
            ttl: inc.annotations.ttl,
            expires: inc.annotations.expires,
            active_pods: self
                .pods
                .values()
                .filter(|p| p.active && p.namespace == namespace && p.claim == name)
                .count(),
            job,
            run,
        })
    }

    /// Appends the current state of the named claims' incarnations, made by a call that
    /// started at `before`.
    fn record(&mut self, namespace: &str, names: &[String], before: DateTime<Utc>) {
        let after = now();
        for name in names {
            if let Some(state) = self.state_of(namespace, name) {
                let index = self.current[&(namespace.to_owned(), name.clone())];
                self.incarnations[index].history.push(Snapshot {
                    before,
                    after,
                    state,
                });
            }
        }
    }

    /// The claims a build's changes affect.
    fn claims_of(&self, build: &Build) -> Vec<String> {
        self.current
            .keys()
            .filter(|(ns, _)| *ns == build.namespace)
            .filter(|key| {
                let inc = &self.incarnations[self.current[*key]];
                matches!(&inc.link, Link::Naming(j) | Link::OwnerRef(j) if *j == build.job)
            })
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// Live incarnations (as far as the driver knows) whose state satisfies `f`, as indices.
    fn live(&self, f: impl Fn(&Incarnation, &State) -> bool) -> Vec<usize> {
        self.current
            .values()
            .copied()
            .filter(|&i| {
                let inc = &self.incarnations[i];
                !inc.gone
                    && !inc.tainted
                    && self
                        .state_of(&inc.namespace, &inc.name)
                        .is_some_and(|state| f(inc, &state))
            })
            .collect()
    }

    /// Claims a protection may be added to: not due, and not for [`MARGIN`].
    fn protectable(&self) -> Vec<usize> {
        let horizon = now() + seconds(MARGIN);
        self.live(|inc, state| inc.next_due(state, now()).is_none_or(|due| due > horizon))
    }

    fn count(&mut self, action: &'static str) {
        *self.actions.entry(action).or_default() += 1;
    }
}

// --- the driver ---------------------------------------------------------------------------

struct Driver {
    client: Client,
    world: Mutex<World>,
    rng: Mutex<Rng>,
    /// Held (read) by each action; held (write) by a fault that takes the control plane down,
    /// so the ground truth never records a call whose outcome is unknown.
    gate: RwLock<()>,
}

impl Driver {
    fn claims(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn jobs(&self, namespace: &str) -> Api<kube::api::DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &notebook_validation_job_resource(),
        )
    }

    fn runs(&self, namespace: &str) -> Api<kube::api::DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &pipeline_run_resource())
    }

    fn namespace(&self, namespace: &str) -> TestNamespace {
        TestNamespace::existing(self.client.clone(), namespace)
    }

    async fn serial(&self) -> u64 {
        let mut world = self.world.lock().await;
        world.serial += 1;
        world.serial
    }

    async fn step(&self) {
        let _gate = self.gate.read().await;
        let choice = self.rng.lock().await.below(100);
        let result = match choice {
            0..=14 => self.new_build().await,
            15..=21 => self.new_owned().await,
            22..=27 => self.new_orphan().await,
            28..=41 => self.finish().await,
            42..=49 => self.delete_owner().await,
            50..=59 => self.start_pod().await,
            60..=69 => self.stop_pod().await,
            70..=73 => self.keep(true).await,
            74..=77 => self.keep(false).await,
            78..=81 => self.set_ttl().await,
            82..=85 => self.set_expires().await,
            86..=88 => self.invalid(true).await,
            89..=91 => self.invalid(false).await,
            92..=96 => self.recreate().await,
            _ => self.delete_finished_pod().await,
        };
        if let Err(error) = result {
            self.world.lock().await.failures += 1;
            eprintln!("soak: driver action failed: {error}");
        }
    }

    async fn pick_namespace(&self) -> &'static str {
        NAMESPACES[self.rng.lock().await.below(NAMESPACES.len())]
    }

    async fn created(
        &self,
        claim: PersistentVolumeClaim,
        link: Link,
        annotations: Annotations,
        before: DateTime<Utc>,
    ) {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let created = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(workspace_gc::cluster::resources::to_chrono)
            .unwrap_or_else(now);
        let mut world = self.world.lock().await;
        world.incarnations.push(Incarnation {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            created,
            link,
            annotations,
            history: Vec::new(),
            gone: false,
            driver_deleted: false,
            tainted: false,
        });
        let index = world.incarnations.len() - 1;
        world
            .current
            .insert((namespace.clone(), name.clone()), index);
        world.record(&namespace, &[name], before);
    }

    async fn new_build(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let job = format!("b{}", self.serial().await);
        let namespace = self.namespace(ns);
        let created = JobBuilder::new(&job)
            .phase("Building")
            .create(&namespace)
            .await;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        {
            let mut world = self.world.lock().await;
            world.builds.insert(
                (ns.into(), job.clone()),
                Build {
                    namespace: ns.into(),
                    job: job.clone(),
                    uid,
                    run: Owner::Absent,
                    state: Owner::Running,
                },
            );
            world.count("new-build");
        }
        // The operator creates the claim before its PipelineRun.
        let before = now();
        let claim = ClaimBuilder::for_job(&job).create(&namespace).await;
        self.created(
            claim,
            Link::Naming(job.clone()),
            Annotations::default(),
            before,
        )
        .await;
        let before = now();
        PipelineRunBuilder::for_job(&job)
            .running()
            .create(&namespace)
            .await;
        let mut world = self.world.lock().await;
        if let Some(build) = world.builds.get_mut(&(ns.into(), job.clone())) {
            build.run = Owner::Running;
        }
        world.record(ns, &[format!("{job}-build-workspace")], before);
        Ok(())
    }

    async fn new_owned(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let job = format!("o{}", self.serial().await);
        let namespace = self.namespace(ns);
        let created = JobBuilder::new(&job)
            .phase("Building")
            .create(&namespace)
            .await;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        {
            let mut world = self.world.lock().await;
            world.builds.insert(
                (ns.into(), job.clone()),
                Build {
                    namespace: ns.into(),
                    job: job.clone(),
                    uid: uid.clone(),
                    run: Owner::Absent,
                    state: Owner::Running,
                },
            );
            world.count("new-owned");
        }
        let before = now();
        let claim = ClaimBuilder::build_workspace(&format!("{job}-ws"))
            .owner_reference(OwnerReference {
                api_version: "mlops.mlops.dev/v1alpha1".into(),
                kind: "NotebookValidationJob".into(),
                name: job.clone(),
                uid,
                controller: None,
                block_owner_deletion: None,
            })
            .create(&namespace)
            .await;
        self.created(claim, Link::OwnerRef(job), Annotations::default(), before)
            .await;
        Ok(())
    }

    async fn new_orphan(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let name = format!("x{}-build-workspace", self.serial().await);
        let before = now();
        let claim = ClaimBuilder::build_workspace(&name)
            .create(&self.namespace(ns))
            .await;
        self.created(claim, Link::Orphan, Annotations::default(), before)
            .await;
        self.world.lock().await.count("new-orphan");
        Ok(())
    }

    /// `count` orphan claims whose `expires` has passed: all due at once.
    async fn burst(&self, count: u32) {
        let _gate = self.gate.read().await;
        let expired = (now() - seconds(1)).trunc_subsecs(0);
        for _ in 0..count {
            let ns = self.pick_namespace().await;
            let name = format!("s{}-build-workspace", self.serial().await);
            let before = now();
            let claim = ClaimBuilder::build_workspace(&name)
                .annotation(
                    workspace_gc::contract::annotations::EXPIRES,
                    &rfc3339(expired),
                )
                .create(&self.namespace(ns))
                .await;
            let annotations = Annotations {
                expires: Some(expired),
                ..Annotations::default()
            };
            self.created(claim, Link::Orphan, annotations, before).await;
            self.world.lock().await.count("burst");
        }
    }

    /// Picks a build with the given state.
    async fn pick_build(&self, f: impl Fn(&Build) -> bool) -> Option<Build> {
        let candidates: Vec<Build> = {
            let world = self.world.lock().await;
            world.builds.values().filter(|b| f(b)).cloned().collect()
        };
        self.rng.lock().await.pick(&candidates).cloned()
    }

    async fn finish(&self) -> Result<(), String> {
        let Some(build) = self.pick_build(|b| b.state == Owner::Running).await else {
            return Ok(());
        };
        let succeeded = self.rng.lock().await.chance(70);
        let at = now().trunc_subsecs(0);
        let phase = if succeeded { "Succeeded" } else { "Failed" };
        let before = now();
        self.jobs(&build.namespace)
            .patch_status(
                &build.job,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "completionTime": rfc3339(at)}})),
            )
            .await
            .map_err(|e| format!("finish job {}: {e}", build.job))?;
        let key = (build.namespace.clone(), build.job.clone());
        {
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.state = Owner::Finished(at);
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
            world.count("finish");
        }
        if build.run == Owner::Running {
            let before = now();
            let outcome = if succeeded { "True" } else { "False" };
            let status = json!({"status": {
                "conditions": [{"type": "Succeeded", "status": outcome, "reason": phase}],
                "completionTime": rfc3339(at)}});
            self.runs(&build.namespace)
                .patch_status(
                    &format!("{}-build", build.job),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .map_err(|e| format!("finish run of {}: {e}", build.job))?;
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.run = Owner::Finished(at);
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
        }
        Ok(())
    }

    async fn delete_owner(&self) -> Result<(), String> {
        let Some(build) = self.pick_build(|b| b.state != Owner::Absent).await else {
            return Ok(());
        };
        let key = (build.namespace.clone(), build.job.clone());
        let before = now();
        self.jobs(&build.namespace)
            .delete(&build.job, &DeleteParams::background())
            .await
            .map_err(|e| format!("delete job {}: {e}", build.job))?;
        {
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.state = Owner::Absent;
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
            world.count("delete-owner");
        }
        if build.run != Owner::Absent {
            let before = now();
            self.runs(&build.namespace)
                .delete(&format!("{}-build", build.job), &DeleteParams::background())
                .await
                .map_err(|e| format!("delete run of {}: {e}", build.job))?;
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.run = Owner::Absent;
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
        }
        self.world.lock().await.builds.remove(&key);
        Ok(())
    }

    /// Picks a claim from `indices`: (index, namespace, name, uid).
    async fn pick_claim(&self, indices: Vec<usize>) -> Option<(usize, String, String, String)> {
        let index = *self.rng.lock().await.pick(&indices)?;
        let world = self.world.lock().await;
        let inc = &world.incarnations[index];
        Some((
            index,
            inc.namespace.clone(),
            inc.name.clone(),
            inc.uid.clone(),
        ))
    }

    async fn start_pod(&self) -> Result<(), String> {
        let candidates = self.world.lock().await.protectable();
        let Some((_, ns, claim, _)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let pod = format!("p{}", self.serial().await);
        let scheduled = self.rng.lock().await.chance(50);
        let mut builder = support::PodBuilder::new(&pod)
            .mounting(&claim)
            .phase("Running");
        if scheduled {
            builder = builder.scheduled_on("node-a");
        }
        let before = now();
        builder.create(&self.namespace(&ns)).await;
        let mut world = self.world.lock().await;
        world.pods.insert(
            pod,
            PodModel {
                namespace: ns.clone(),
                claim: claim.clone(),
                active: true,
                scheduled,
            },
        );
        world.record(&ns, &[claim], before);
        world.count("start-pod");
        Ok(())
    }

    async fn stop_pod(&self) -> Result<(), String> {
        let active: Vec<(String, PodModel)> = {
            let world = self.world.lock().await;
            world
                .pods
                .iter()
                .filter(|(_, p)| p.active)
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect()
        };
        let Some((name, pod)) = self.rng.lock().await.pick(&active).cloned() else {
            return Ok(());
        };
        let phase = if self.rng.lock().await.chance(80) {
            "Succeeded"
        } else {
            "Failed"
        };
        let before = now();
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .map_err(|e| format!("stop pod {name}: {e}"))?;
        let mut world = self.world.lock().await;
        if let Some(p) = world.pods.get_mut(&name) {
            p.active = false;
        }
        world.record(&pod.namespace, &[pod.claim], before);
        world.count("stop-pod");
        Ok(())
    }

    async fn delete_finished_pod(&self) -> Result<(), String> {
        let done: Vec<(String, PodModel)> = {
            let world = self.world.lock().await;
            world
                .pods
                .iter()
                .filter(|(_, p)| !p.active)
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect()
        };
        let Some((name, pod)) = self.rng.lock().await.pick(&done).cloned() else {
            return Ok(());
        };
        // No kubelet confirms a graceful deletion of a scheduled pod.
        let params = if pod.scheduled {
            DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            }
        } else {
            DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .delete(&name, &params)
            .await
            .map_err(|e| format!("delete pod {name}: {e}"))?;
        let mut world = self.world.lock().await;
        world.pods.remove(&name);
        world.count("delete-pod");
        Ok(())
    }

    /// Patches a claim's annotations (None removes one), then records the new state.
    async fn annotate(
        &self,
        index: usize,
        patch: Value,
        update: impl FnOnce(&mut Annotations),
        action: &'static str,
    ) -> Result<(), String> {
        let (ns, name, uid) = {
            let world = self.world.lock().await;
            let inc = &world.incarnations[index];
            (inc.namespace.clone(), inc.name.clone(), inc.uid.clone())
        };
        let before = now();
        // The UID in the patch makes it apply to this incarnation only.
        let body = json!({"metadata": {"uid": uid, "annotations": patch}});
        let result = self
            .claims(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await;
        let mut world = self.world.lock().await;
        match result {
            Ok(claim) if claim.metadata.deletion_timestamp.is_none() => {
                update(&mut world.incarnations[index].annotations);
                world.record(&ns, &[name], before);
                world.count(action);
                Ok(())
            }
            // Deleted meanwhile (the daemon or the garbage collector): nothing to record.
            Ok(_) => {
                world.incarnations[index].gone = true;
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                world.incarnations[index].gone = true;
                Ok(())
            }
            Err(e) => {
                // The change may or may not have landed.
                world.incarnations[index].tainted = true;
                Err(format!("annotate {ns}/{name}: {e}"))
            }
        }
    }

    async fn keep(&self, keep: bool) -> Result<(), String> {
        let candidates = if keep {
            self.world.lock().await.protectable()
        } else {
            self.world.lock().await.live(|_, s| s.keep)
        };
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let value = if keep { json!("true") } else { Value::Null };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::KEEP: value }),
            |a| a.keep = keep,
            if keep { "keep" } else { "unkeep" },
        )
        .await
    }

    async fn set_ttl(&self) -> Result<(), String> {
        let ttl = self.rng.lock().await.between(10, 60) as i64;
        // Both the old and the new TTL leave the claim undue for the margin.
        let horizon = now() + seconds(MARGIN);
        let candidates = self.world.lock().await.live(|inc, state| {
            let mut changed = state.clone();
            // A valid TTL replaces an invalid one: the claim is then judged by its deadlines.
            changed.ttl = Some(ttl);
            changed.invalid = false;
            [state, &changed]
                .iter()
                .all(|s| inc.next_due(s, now()).is_none_or(|due| due > horizon))
        });
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::TTL: format!("{ttl}s") }),
            |a| {
                a.ttl = Some(ttl);
                a.invalid = false;
            },
            "ttl",
        )
        .await
    }

    async fn set_expires(&self) -> Result<(), String> {
        let at = (now() + seconds(self.rng.lock().await.between(8, 60) as i64)).trunc_subsecs(0);
        let candidates = self.world.lock().await.protectable();
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::EXPIRES: rfc3339(at) }),
            |a| a.expires = Some(at),
            "expires",
        )
        .await
    }

    async fn invalid(&self, invalid: bool) -> Result<(), String> {
        let candidates = if invalid {
            self.world.lock().await.protectable()
        } else {
            self.world.lock().await.live(|_, s| s.invalid)
        };
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        // An invalid TTL replaces a valid one; fixing it removes the TTL.
        let value = if invalid {
            json!("a while")
        } else {
            Value::Null
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::TTL: value }),
            |a| {
                a.invalid = invalid;
                a.ttl = None;
            },
            if invalid { "invalid" } else { "fix-invalid" },
        )
        .await
    }

    /// Deletes a claim and creates it again under the same name, as the operator's
    /// `ensureBuildPVC` does for a job re-created under the same name. Any claim will do,
    /// due or not: a delete the daemon decided about the old one must not hit the new one.
    async fn recreate(&self) -> Result<(), String> {
        let candidates = self.world.lock().await.live(|_, s| s.active_pods == 0);
        let Some((index, ns, name, uid)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.claims(&ns).delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                self.world.lock().await.incarnations[index].gone = true;
                return Ok(());
            }
            Err(e) => {
                self.world.lock().await.incarnations[index].tainted = true;
                return Err(format!("delete {ns}/{name} to re-create it: {e}"));
            }
        }
        {
            let mut world = self.world.lock().await;
            world.incarnations[index].gone = true;
            world.incarnations[index].driver_deleted = true;
        }
        // PVC protection lets it go once no pod holds it; kube-controller-manager may lag after
        // a fault, and then the name stays taken: give up on re-creating it.
        let mut free = false;
        for _ in 0..100 {
            if let Ok(None) = self.claims(&ns).get_opt(&name).await {
                free = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !free {
            return Ok(());
        }
        let link = self.world.lock().await.incarnations[index].link.clone();
        let mut builder = ClaimBuilder::build_workspace(&name);
        if let Link::OwnerRef(job) = &link {
            let uid = {
                let world = self.world.lock().await;
                world
                    .builds
                    .get(&(ns.clone(), job.clone()))
                    .map(|b| b.uid.clone())
            };
            let Some(uid) = uid else {
                // The owner is gone: the garbage collector would take the claim at once.
                return Ok(());
            };
            builder = builder.owner_reference(OwnerReference {
                api_version: "mlops.mlops.dev/v1alpha1".into(),
                kind: "NotebookValidationJob".into(),
                name: job.clone(),
                uid,
                controller: None,
                block_owner_deletion: None,
            });
        }
        let before = now();
        let claim = builder.create(&self.namespace(&ns)).await;
        self.created(claim, link, Annotations::default(), before)
            .await;
        self.world.lock().await.count("recreate");
        Ok(())
    }

    /// Marks the claims that no longer exist (or are terminating), so actions skip them.
    async fn refresh(&self) {
        let mut alive = HashMap::new();
        for ns in NAMESPACES {
            let params = ListParams::default().labels(&format!("{BUILD_WORKSPACE_LABEL}=true"));
            match self.claims(ns).list(&params).await {
                Ok(list) => {
                    for claim in list.items {
                        let terminating = claim.metadata.deletion_timestamp.is_some();
                        alive.insert(claim.metadata.uid.unwrap_or_default(), !terminating);
                    }
                }
                Err(_) => return,
            }
        }
        let mut world = self.world.lock().await;
        for inc in &mut world.incarnations {
            if alive.get(&inc.uid) != Some(&true) {
                inc.gone = true;
            }
        }
    }

    /// Makes every claim collectable: stops the pods, removes `keep` and invalid annotations,
    /// finishes the builds. Each loop is bounded, in case a call keeps failing.
    async fn settle(&self) {
        let _gate = self.gate.read().await;
        for _ in 0..10_000 {
            let active = self.world.lock().await.pods.values().any(|p| p.active);
            if !active {
                break;
            }
            if let Err(e) = self.stop_pod().await {
                eprintln!("soak: settle: {e}");
            }
        }
        for _ in 0..10_000 {
            let kept = self.world.lock().await.live(|_, s| s.keep || s.invalid);
            let Some(&index) = kept.first() else { break };
            let patch = json!({
                workspace_gc::contract::annotations::KEEP: Value::Null,
                workspace_gc::contract::annotations::TTL: Value::Null,
            });
            let clear = |a: &mut Annotations| {
                a.keep = false;
                a.invalid = false;
                a.ttl = None;
            };
            if let Err(e) = self.annotate(index, patch, clear, "settle").await {
                eprintln!("soak: settle: {e}");
            }
        }
        for _ in 0..10_000 {
            let running = {
                let world = self.world.lock().await;
                world.builds.values().any(|b| b.state == Owner::Running)
            };
            if !running {
                break;
            }
            if let Err(e) = self.finish().await {
                eprintln!("soak: settle: {e}");
            }
        }
    }
}

// --- the daemon replicas -------------------------------------------------------------------

struct Replica {
    name: &'static str,
    orphan_grace: i64,
    /// libfaketime's variables, for a replica with a skewed clock.
    clock: Vec<(&'static str, String)>,
    proxy: Proxy,
    kubeconfig: PathBuf,
    logs: PathBuf,
    process: Option<Process>,
    spawns: u32,
    metrics: String,
}

impl Replica {
    fn spawn(&mut self) {
        self.spawns += 1;
        let log = self.logs.join(format!("{}.{}.log", self.name, self.spawns));
        let vars: Vec<(&str, String)> = vec![
            ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", format!("{TTL}s")),
            (
                "WORKSPACE_GC_POLICY_ORPHAN_GRACE",
                format!("{}s", self.orphan_grace),
            ),
            ("WORKSPACE_GC_POLICY_MAX_AGE", format!("{MAX_AGE}s")),
            ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "50".into()),
            (
                "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
                CAP.to_string(),
            ),
            ("WORKSPACE_GC_DELETION_WINDOW", format!("{WINDOW}s")),
            (
                "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
                LEASE_NAMESPACE.into(),
            ),
            (
                "WORKSPACE_GC_LEADER_ELECTION_LEASE_DURATION",
                format!("{}s", LEASE_DURATION.as_secs()),
            ),
        ];
        let vars = [vars, self.clock.clone()].concat();
        self.process = Some(Process::spawn(&self.kubeconfig, &vars, self.name, &log));
    }

    async fn scrape(&mut self) {
        if let Some(process) = &self.process {
            let (status, body) = process.get("/metrics").await;
            if status == 200 {
                self.metrics = body;
            }
        }
    }
}

// --- faults ------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Window {
    fault: &'static str,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

struct Faults {
    cp: Arc<ControlPlane>,
    driver: Arc<Driver>,
    replicas: Vec<Replica>,
    windows: Vec<Window>,
    crashes: u32,
    /// Throttling bursts so far.
    throttles: usize,
    /// The fault kinds left in this round.
    order: Vec<usize>,
}

impl Faults {
    async fn leader(&self) -> Option<usize> {
        let lease = Api::<Lease>::namespaced(self.driver.client.clone(), LEASE_NAMESPACE)
            .get_opt("workspace-gc")
            .await
            .ok()??;
        let holder = lease.spec?.holder_identity?;
        self.replicas.iter().position(|r| r.name == holder)
    }

    /// Notices a replica that exited by itself: a crash, which the run reports.
    fn check_crashes(&mut self) {
        for replica in &mut self.replicas {
            if let Some(process) = &mut replica.process
                && let Some(status) = process.exited()
            {
                eprintln!("soak: {} exited by itself: {status}", replica.name);
                self.crashes += 1;
                replica.spawn();
            }
        }
    }

    /// SIGKILLs the replica that holds the lease and starts it again after `down`.
    async fn kill_leader(&mut self, down: Duration) {
        let target = self.leader().await.unwrap_or(0);
        let replica = &mut self.replicas[target];
        replica.scrape().await;
        if let Some(process) = replica.process.take() {
            process.kill().await;
        }
        tokio::time::sleep(down).await;
        replica.spawn();
    }

    /// Bursts of one kind of refusal on the leader's connection, on for seconds and off for
    /// seconds, for 10 to 30 s: as an API server whose priority level is saturated answers.
    /// The kinds take turns, DELETEs first, so that a short run has the one that matters most;
    /// each opens with 10 claims due at once.
    async fn throttle(&mut self, rng: &mut Rng) {
        let target = self.leader().await.unwrap_or(0);
        let retry_after = rng.between(1, 3);
        self.throttles += 1;
        let (what, rule) = match (self.throttles - 1) % 5 {
            0 => (
                "DELETEs 429",
                Rule::new(
                    "delete",
                    "persistentvolumeclaims",
                    Fault::throttle(retry_after),
                ),
            ),
            1 => (
                "re-check LISTs 429",
                Rule::new("list", "pods", Fault::throttle(retry_after)),
            ),
            2 => (
                "Lease writes 429",
                Rule::new("patch", "leases", Fault::throttle(retry_after)),
            ),
            3 => (
                "everything 503",
                Rule::new(
                    "",
                    "",
                    Fault::Refuse {
                        status: 503,
                        retry_after: Some(retry_after),
                    },
                ),
            ),
            _ => (
                "re-check LISTs answered late",
                Rule::new("list", "pods", Fault::DelayResponse(SLOW_LIST)),
            ),
        };
        println!(
            "soak: throttling {} ({what}, Retry-After {retry_after} s)",
            self.replicas[target].name
        );
        let proxy = &self.replicas[target].proxy;
        let end = tokio::time::Instant::now() + Duration::from_secs(rng.between(10, 30));
        let mut first = true;
        while tokio::time::Instant::now() < end {
            let burst = proxy.add(rule.clone());
            if std::mem::take(&mut first) {
                // Claims due at once: the refusals meet deletion work whenever they come.
                self.driver.burst(10).await;
            }
            tokio::time::sleep(Duration::from_secs(rng.between(2, 6))).await;
            proxy.remove(burst);
            tokio::time::sleep(Duration::from_secs(rng.between(1, 3))).await;
        }
    }

    /// Injects the next fault: each kind in turn, in an order shuffled per round, so a run of
    /// eight faults or more has every kind.
    async fn inject(&mut self, rng: &mut Rng) {
        if self.order.is_empty() {
            let mut kinds: Vec<usize> = (0..8).collect();
            for i in (1..kinds.len()).rev() {
                kinds.swap(i, rng.below(i + 1));
            }
            if self.windows.is_empty() {
                // The first round opens with a throttling burst, the restart storm and the
                // leader's partition, so that even a short run has them.
                kinds.retain(|&k| k != 7 && k != 6 && k != 3);
                kinds.extend([3, 6, 7]);
            }
            self.order = kinds;
        }
        let kind = self.order.pop().unwrap_or(0);
        let start = now();
        let fault = match kind {
            0 => {
                let _pause = self.driver.gate.write().await;
                self.cp.stop_component("kube-apiserver", true).await;
                tokio::time::sleep(Duration::from_secs(rng.between(5, 15))).await;
                self.cp.start_component("kube-apiserver").await;
                "apiserver-restart"
            }
            1 => {
                let _pause = self.driver.gate.write().await;
                self.cp.stop_component("etcd", true).await;
                tokio::time::sleep(Duration::from_secs(rng.between(3, 8))).await;
                self.cp.start_component("etcd").await;
                // The API server answers again once it has reconnected to etcd.
                for _ in 0..300 {
                    if self.driver.client.apiserver_version().await.is_ok()
                        && Api::<Namespace>::all(self.driver.client.clone())
                            .list(&ListParams::default().limit(1))
                            .await
                            .is_ok()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                "etcd-restart"
            }
            2 => {
                // Both replicas lose their watches while etcd forgets the history they would
                // resume from: 410 Gone and a re-list each.
                for replica in &self.replicas {
                    replica.proxy.cut();
                }
                tokio::time::sleep(Duration::from_secs(rng.between(2, 6))).await;
                self.cp.compact_etcd().await;
                for replica in &self.replicas {
                    replica.proxy.heal();
                }
                "compaction"
            }
            3 => {
                let target = self.leader().await.unwrap_or(0);
                self.replicas[target].proxy.cut();
                tokio::time::sleep(Duration::from_secs(rng.between(5, 25))).await;
                self.replicas[target].proxy.heal();
                "partition"
            }
            4 => {
                let target = self.leader().await.unwrap_or(0);
                self.replicas[target].proxy.stall();
                tokio::time::sleep(Duration::from_secs(rng.between(10, 30))).await;
                self.replicas[target].proxy.unstall();
                "stall"
            }
            5 => {
                self.kill_leader(Duration::from_secs(rng.between(3, 10)))
                    .await;
                "leader-kill"
            }
            7 => {
                self.throttle(rng).await;
                "throttle"
            }
            _ => {
                // A burst that meets the cap, then whoever leads is killed and restarted four
                // times within one window: each new process must count from the Lease.
                self.driver.burst(CAP).await;
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_secs(rng.between(1, 3))).await;
                    self.kill_leader(Duration::from_millis(rng.between(200, 1500)))
                        .await;
                }
                "restart-storm"
            }
        };
        let end = now();
        println!(
            "soak: {fault} from {} to {} ({} s)",
            start.format("%H:%M:%S"),
            end.format("%H:%M:%S"),
            (end - start).num_seconds()
        );
        self.windows.push(Window { fault, start, end });
    }
}

// --- setup -------------------------------------------------------------------------------

async fn install_daemon_identity(client: &Client) {
    let post = PostParams::default();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(LEASE_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&post, &ns)
        .await
        .expect("the daemon's namespace");
    for name in REPLICAS
        .iter()
        .map(|(_, account)| *account)
        .chain(["default"])
    {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        let _ = Api::<ServiceAccount>::namespaced(client.clone(), LEASE_NAMESPACE)
            .create(&post, &account)
            .await;
    }
    // The shipped RBAC, with the binding subjects' namespace that kustomize would set, and
    // each binding naming every replica's account.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base");
    for file in ["rbac-cluster.yaml", "rbac-lease.yaml"] {
        let text = std::fs::read_to_string(base.join(file)).expect("read the shipped RBAC");
        for mut value in serde_saphyr::from_multiple::<Value>(&text).expect("YAML documents") {
            if let Some(subjects) = value.get_mut("subjects").and_then(Value::as_array_mut) {
                for subject in subjects.iter_mut() {
                    subject["namespace"] = LEASE_NAMESPACE.into();
                }
                let shipped = subjects.clone();
                for (_, account) in &REPLICAS[1..] {
                    subjects.extend(shipped.iter().map(|subject| {
                        let mut subject = subject.clone();
                        subject["name"] = (*account).into();
                        subject
                    }));
                }
            }
            match value["kind"].as_str() {
                Some("ClusterRole") => {
                    let role: ClusterRole = serde_json::from_value(value).expect("ClusterRole");
                    Api::<ClusterRole>::all(client.clone())
                        .create(&post, &role)
                        .await
                        .map(|_| ())
                }
                Some("ClusterRoleBinding") => {
                    let binding: ClusterRoleBinding =
                        serde_json::from_value(value).expect("ClusterRoleBinding");
                    Api::<ClusterRoleBinding>::all(client.clone())
                        .create(&post, &binding)
                        .await
                        .map(|_| ())
                }
                Some("Role") => {
                    let role: Role = serde_json::from_value(value).expect("Role");
                    Api::<Role>::namespaced(client.clone(), LEASE_NAMESPACE)
                        .create(&post, &role)
                        .await
                        .map(|_| ())
                }
                Some("RoleBinding") => {
                    let binding: RoleBinding = serde_json::from_value(value).expect("RoleBinding");
                    Api::<RoleBinding>::namespaced(client.clone(), LEASE_NAMESPACE)
                        .create(&post, &binding)
                        .await
                        .map(|_| ())
                }
                other => panic!("unexpected {other:?} in {file}"),
            }
            .expect("install the shipped RBAC");
        }
    }
}

/// Every claim delete with its preconditions, and what the invariant reads besides.
fn audit_policy_yaml() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
{}  - level: None
",
        invariant_audit_rules(&daemon_users())
    )
}

/// libfaketime's variables that set the wall clock `offset` off ("+2h"); the monotonic clock
/// (timers, the fence) stays true, as on a node whose RTC is wrong.
fn faketime(offset: &str) -> Vec<(&'static str, String)> {
    let library = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|path| Path::new(path).exists())
    .expect("--clock-offset needs libfaketime (Debian's faketime package)");
    vec![
        ("LD_PRELOAD", library.to_owned()),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_DONT_RESET", "1".to_owned()),
    ]
}

// --- the check ---------------------------------------------------------------------------

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The soak's options come from `SOAK_ARGS` (the flags of [`Args`]), which `scripts/soak` sets
/// from its own command line.
#[test]
#[ignore = "minutes long; run by scripts/soak"]
fn randomized_safety_run() {
    let flags = std::env::var("SOAK_ARGS").unwrap_or_default();
    let args = Args::parse_from(std::iter::once("soak").chain(flags.split_whitespace()));
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    assert!(
        !runtime.block_on(soak(args)),
        "wrong, repeated or missed deletions, an exceeded cap, a crash, an audit log that misses deletions or a breach of its invariant: see the report above"
    );
}

/// Runs the soak and prints its report; true when it failed.
async fn soak(args: Args) -> bool {
    let seed = args
        .seed
        .unwrap_or_else(|| now().timestamp_nanos_opt().unwrap_or(0) as u64);
    println!(
        "soak: seed {seed}, {} min of workload, then {} s of drain",
        args.minutes, args.drain
    );
    let work = tempfile::Builder::new()
        .prefix("workspace-gc-soak-")
        .tempdir()
        .expect("a work directory")
        .keep();
    let audit_log = work.join("audit.log");
    let audit_policy = work.join("audit-policy.yaml");
    std::fs::write(&audit_policy, audit_policy_yaml()).expect("write the audit policy");
    let cp = Arc::new(ControlPlane::start_with(&ControlPlaneOptions {
        controller_manager: true,
        apiserver_args: vec![
            "--watch-cache=false".into(),
            format!("--audit-log-path={}", audit_log.display()),
            format!("--audit-policy-file={}", audit_policy.display()),
        ],
    }));
    println!(
        "soak: control plane in {}; logs in {}",
        cp.dir().display(),
        work.display()
    );
    let client = cp.client();
    install_daemon_identity(&client).await;
    for ns in NAMESPACES {
        TestNamespace::named(&cp, ns).await;
    }
    let mut replicas = Vec::new();
    for (index, (name, account)) in REPLICAS.into_iter().enumerate() {
        let account = cp
            .service_account_kubeconfig(LEASE_NAMESPACE, account)
            .await;
        let proxy = Proxy::http(&cp).await;
        let kubeconfig = proxy.kubeconfig(&cp, &account);
        let clock = match (&args.clock_offset, index) {
            (Some(offset), 1) => faketime(offset),
            _ => Vec::new(),
        };
        let mut replica = Replica {
            name,
            orphan_grace: if args.sabotage {
                ORPHAN_GRACE / 2
            } else {
                ORPHAN_GRACE
            },
            clock,
            proxy,
            kubeconfig,
            logs: work.clone(),
            process: None,
            spawns: 0,
            metrics: String::new(),
        };
        replica.spawn();
        replicas.push(replica);
    }

    let driver = Arc::new(Driver {
        client: client.clone(),
        world: Mutex::new(World::default()),
        rng: Mutex::new(Rng(seed)),
        gate: RwLock::new(()),
    });
    let mut faults = Faults {
        cp: cp.clone(),
        driver: driver.clone(),
        replicas,
        windows: Vec::new(),
        crashes: 0,
        throttles: 0,
        order: Vec::new(),
    };
    let started = now();
    let workload_end = started + chrono::Duration::milliseconds((args.minutes * 60_000.0) as i64);

    let workload = tokio::spawn({
        let driver = driver.clone();
        let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.1));
        async move {
            let mut ticks = 0u64;
            while now() < workload_end {
                // The builders panic on API errors: a panic is a failed call, not the end.
                let step = tokio::spawn({
                    let driver = driver.clone();
                    async move { driver.step().await }
                });
                if step.await.is_err() {
                    driver.world.lock().await.failures += 1;
                }
                ticks += 1;
                if ticks.is_multiple_of(15) {
                    driver.refresh().await;
                }
                if ticks.is_multiple_of(90) {
                    let world = driver.world.lock().await;
                    let live = world.incarnations.iter().filter(|i| !i.gone).count();
                    println!(
                        "soak: {:>4} s: {} claims created, {} live, {} pods",
                        (now() - started).num_seconds(),
                        world.incarnations.len(),
                        live,
                        world.pods.values().filter(|p| p.active).count()
                    );
                }
                tokio::time::sleep(interval).await;
            }
        }
    });
    let mut fault_rng = Rng(seed ^ 0x5eed);
    loop {
        let wait = Duration::from_secs(fault_rng.between(args.fault_every, 2 * args.fault_every));
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
            faults.check_crashes();
        }
        if now() + seconds(20) >= workload_end {
            break;
        }
        faults.inject(&mut fault_rng).await;
    }
    workload.await.expect("the workload task");

    println!(
        "soak: workload over; making every claim collectable and draining {} s",
        args.drain
    );
    driver.settle().await;
    let settled = now();
    let drain_end = tokio::time::Instant::now() + Duration::from_secs(args.drain);
    while tokio::time::Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        faults.check_crashes();
    }
    for replica in &mut faults.replicas {
        replica.scrape().await;
    }
    driver.refresh().await;
    let checked_at = now();

    // The verdict.
    let users = daemon_users();
    let events = read_audit(&audit_log);
    let audited: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.verb == "delete" && e.resource == "persistentvolumeclaims")
        .collect();
    let world = driver.world.lock().await;
    let by_uid: HashMap<&str, &Incarnation> = world
        .incarnations
        .iter()
        .map(|i| (i.uid.as_str(), i))
        .collect();
    let mut wrong = Vec::new();
    let mut ambiguous = 0;
    let mut daemon_deleted: HashMap<&str, u32> = HashMap::new();
    let mut lags = Vec::new();
    let (mut conflicts, mut not_found, mut other_codes) = (0, 0, 0);
    let mut by_gc = 0;
    let mut unmapped = 0;
    for delete in &audited {
        if !users.contains(&delete.user) {
            if delete.user.contains("kube-controller-manager") && (200..300).contains(&delete.code)
            {
                by_gc += 1;
            }
            continue;
        }
        match delete.code {
            200..=299 => {}
            409 => {
                conflicts += 1;
                continue;
            }
            404 => {
                not_found += 1;
                continue;
            }
            _ => {
                other_codes += 1;
                continue;
            }
        }
        let Some(inc) = delete.uid.as_deref().and_then(|uid| by_uid.get(uid)) else {
            unmapped += 1;
            eprintln!(
                "soak: a delete of {}/{} names no known claim",
                delete.namespace, delete.name
            );
            continue;
        };
        *daemon_deleted.entry(inc.uid.as_str()).or_default() += 1;
        if inc.tainted {
            continue;
        }
        let states = inc.states_at(delete.at);
        let legit = states.iter().any(|s| inc.deletable(&s.state, delete.at));
        if !legit {
            wrong.push(format!(
                "{}/{} (uid {}) deleted at {} in state {:?}",
                inc.namespace,
                inc.name,
                inc.uid,
                delete.at,
                states.last().map(|s| &s.state)
            ));
        } else if !states
            .last()
            .is_some_and(|s| inc.deletable(&s.state, delete.at))
        {
            ambiguous += 1;
        }
        if let Some(since) = inc.deletable_since(delete.at) {
            lags.push((delete.at - since).as_seconds_f64());
        }
    }
    // The cap: successful daemon deletes in any rolling window, by the API server's clock.
    let mut sent: Vec<DateTime<Utc>> = audited
        .iter()
        .filter(|d| users.contains(&d.user) && d.succeeded())
        .map(|d| d.at)
        .collect();
    sent.sort();
    let busiest = (0..sent.len())
        .map(|i| {
            sent[i..]
                .iter()
                .take_while(|t| **t < sent[i] + seconds(WINDOW))
                .count()
        })
        .max()
        .unwrap_or(0);
    let cap_exceeded = busiest > CAP as usize;
    let twice: Vec<&&str> = daemon_deleted
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(u, _)| u)
        .collect();

    let mut missed = Vec::new();
    let mut pending = 0;
    let mut still_kept = 0;
    for inc in &world.incarnations {
        if inc.gone || inc.driver_deleted || inc.tainted {
            continue;
        }
        match inc.deletable_since(checked_at) {
            Some(since) if (checked_at - since).num_seconds() >= BOUND => missed.push(format!(
                "{}/{} (uid {}) deletable since {since}, still there at {checked_at}",
                inc.namespace, inc.name, inc.uid
            )),
            Some(_) => pending += 1,
            None => still_kept += 1,
        }
    }

    // The audit log must account for every claim that went away: a log that recorded nothing,
    // or lost part of the run, would let every delete, wrong ones included, drop out of the
    // check above.
    let audited_uids: std::collections::HashSet<&str> = audited
        .iter()
        .filter(|d| d.succeeded())
        .filter_map(|d| d.uid.as_deref())
        .collect();
    let unaudited: Vec<String> = world
        .incarnations
        .iter()
        .filter(|i| i.gone && !i.driver_deleted && !i.tainted)
        .filter(|i| !audited_uids.contains(i.uid.as_str()))
        .map(|i| {
            format!(
                "{}/{} (uid {}) went away without a successful DELETE in the audit log",
                i.namespace, i.name, i.uid
            )
        })
        .collect();
    // Every DELETE the daemon sent: fenced, re-checked, once per decision, counting the
    // attempts the proxies refused (the API server never saw those).
    let refused: Vec<AuditEvent> = faults
        .replicas
        .iter()
        .flat_map(|r| r.proxy.faulted())
        .filter(|f| f.fault.refuses())
        .map(|f| f.as_audit_event())
        .collect();
    let invariant = DeleteInvariant {
        bound: RECHECK_BOUND,
        ..DeleteInvariant::new(&users, Some((LEASE_NAMESPACE, LEASE_NAME)), LEASE_DURATION)
    };
    let violations = invariant.check(&events, &refused);

    lags.sort_by(f64::total_cmp);
    let restarts = |fault: &str| faults.windows.iter().filter(|w| w.fault == fault).count();
    let watch_restarts: f64 = faults
        .replicas
        .iter()
        .map(|r| metric_sum(&r.metrics, "workspace_gc_watch_restarts_total"))
        .sum();
    let created = world.incarnations.len();
    let daemon_deletes: u32 = daemon_deleted.values().sum();
    let audit_empty = daemon_deletes == 0;
    println!();
    println!(
        "soak: seed {seed}; workload {} s, drain {} s after settling at {}",
        (workload_end - started).num_seconds(),
        (checked_at - settled).num_seconds(),
        settled.format("%H:%M:%S")
    );
    println!(
        "soak: driver actions: {:?}; failed calls: {}",
        world.actions, world.failures
    );
    println!(
        "soak: faults: {} apiserver restarts, {} etcd restarts, {} compactions, {} partitions, {} stalls, {} leader kills, {} restart storms, {} throttling bursts; {} daemon crashes",
        restarts("apiserver-restart"),
        restarts("etcd-restart"),
        restarts("compaction"),
        restarts("partition"),
        restarts("stall"),
        restarts("leader-kill"),
        restarts("restart-storm"),
        restarts("throttle"),
        faults.crashes
    );
    let faulted: i64 = faults
        .windows
        .iter()
        .map(|w| (w.end - w.start).num_seconds())
        .sum();
    println!("soak: {faulted} s of the workload under a fault");
    println!(
        "soak: claims: {created} incarnations; deleted by the daemon {daemon_deletes}, by the driver {}; {by_gc} successful delete calls by the garbage collector; still there at the end: {still_kept} kept, {pending} not yet due for {BOUND} s",
        world
            .incarnations
            .iter()
            .filter(|i| i.driver_deleted)
            .count()
    );
    println!(
        "soak: daemon deletes refused: {conflicts} conflict (409), {not_found} not found (404), {other_codes} other; {unmapped} unmapped; {ambiguous} decided during an in-flight change (legitimate either way)"
    );
    println!(
        "soak: reclaim lag after a claim became deletable: p50 {:.2} s, p95 {:.1} s, max {:.1} s ({} deletes)",
        percentile(&lags, 50.0),
        percentile(&lags, 95.0),
        lags.last().copied().unwrap_or(0.0),
        lags.len()
    );
    println!(
        "soak: watch restarts counted by the replicas (last lives): {watch_restarts}; replica spawns: {:?}",
        faults
            .replicas
            .iter()
            .map(|r| (r.name, r.spawns))
            .collect::<Vec<_>>()
    );
    println!(
        "soak: most deletions in any {WINDOW} s window: {busiest} (cap {CAP}){}",
        if cap_exceeded { " CAP EXCEEDED" } else { "" }
    );
    println!(
        "soak: audit log: {} events, {} claim DELETEs{}; {} claims went away without one",
        events.len(),
        audited.len(),
        if audit_empty {
            ", NONE of them a successful one by the daemon"
        } else {
            ""
        },
        unaudited.len()
    );
    let refused_by = |r: &Replica| r.proxy.refused();
    println!(
        "soak: the proxies refused {:?} requests, {} of them DELETE attempts",
        faults
            .replicas
            .iter()
            .map(|r| (r.name, refused_by(r)))
            .collect::<Vec<_>>(),
        refused
            .iter()
            .filter(|e| e.verb == "delete" && e.resource == "persistentvolumeclaims")
            .count()
    );
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for violation in &violations {
        *by_kind.entry(format!("{:?}", violation.kind)).or_default() += 1;
    }
    println!(
        "soak: audit-log invariant (renew deadline {:?}, re-check bound {:?}): {} violations {by_kind:?}",
        invariant.renew_deadline,
        invariant.bound,
        violations.len()
    );
    for violation in violations.iter().take(40) {
        println!("soak:   {violation}");
    }
    println!(
        "soak: WRONG deletions: {}; deleted twice: {}; MISSED deletions: {}; tainted: {}",
        wrong.len(),
        twice.len(),
        missed.len(),
        world.incarnations.iter().filter(|i| i.tainted).count()
    );
    for line in wrong.iter().chain(&missed).chain(unaudited.iter().take(20)) {
        println!("soak:   {line}");
    }
    let failed = !wrong.is_empty()
        || !twice.is_empty()
        || !missed.is_empty()
        || cap_exceeded
        || faults.crashes > 0
        || audit_empty
        || !unaudited.is_empty()
        || !violations.is_empty();
    drop(world);
    for replica in &mut faults.replicas {
        if let Some(process) = replica.process.take() {
            let _ = process.terminate().await;
        }
    }
    println!("soak: {}", if failed { "FAILED" } else { "passed" });
    failed
}
