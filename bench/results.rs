//! What one run of the benchmark measured: the figures it writes to `target/bench-reclaim/` and
//! the report is rendered from (again, with `--report-from`). Data only: no I/O here.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One run: every size measured, and what it ran on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub started: DateTime<Utc>,
    /// The command that regenerates the run (paths of other builds shown as `PATH`).
    pub command: String,
    pub settings: Settings,
    pub machine: Machine,
    pub measured: Measured,
    pub sizes: Vec<SizeResult>,
}

/// The options every size shares, as the report states them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub namespaces: usize,
    pub ttl_s: u64,
    /// `--events`, when given.
    pub events: Option<usize>,
    pub rate: f64,
    pub sweep_interval_s: u64,
    pub concurrency: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cores: String,
    pub model: String,
    pub memory: String,
}

/// The workspace-gc build measured: the commit, and a fingerprint of uncommitted changes to
/// `src/` when there were any.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    pub git: String,
    pub src_diff: Option<u64>,
    pub rustc: String,
}

/// One contender's figures for one size.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Contender {
    pub name: String,
    pub role: Role,
    /// From process start to /readyz (daemon) or to the end of the first sweep (janitor).
    pub ready_s: Option<f64>,
    /// (kind, lag in seconds or None if not reclaimed in the window).
    pub lags: Vec<(EventKind, Option<f64>)>,
    /// Requests from start to ready.
    pub sync: Counts,
    /// Requests from ready (or the first event) to the end of the phase.
    pub steady: Counts,
    /// For the garbage-collector phase: PVC protection's requests, reported apart.
    pub other: Option<(String, Counts)>,
    /// Bytes the API server returned to LIST requests from ready to the end of the phase.
    pub list_bytes: f64,
    /// The same, from start to ready (the initial lists).
    pub sync_list_bytes: f64,
    pub at_ready: Option<ProcSample>,
    pub at_end: Option<ProcSample>,
    /// Objects held in the contender's caches (the daemon's metric), or in the cluster.
    pub tracked: Option<u64>,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    pub window_s: f64,
    pub unexpected_deletions: usize,
    pub notes: Vec<String>,
    /// The janitor's sweeps: (list seconds, whole sweep seconds).
    pub sweeps: Vec<(f64, f64)>,
    /// Claims coming due one at a time, after the burst.
    pub churn: Option<Steady>,
    /// Claims coming due alone (`--lone`), after the churn (absent from runs before it was
    /// measured).
    #[serde(default)]
    pub lone: Option<Steady>,
    /// Nothing due, after the churn.
    pub idle: Option<Steady>,
    /// Measured in the churn alone, to compare another build of workspace-gc with this one.
    pub churn_only: bool,
    /// workspace-gc's initial lists made again by a plain client right after it was ready
    /// (absent from runs before it was measured).
    #[serde(default)]
    pub plain_lists: Option<PlainLists>,
}

/// The API server's side of ready: the initial lists the daemon made, the same requests
/// (streamed or paged as it made them, through its credentials) sent again by curl, whose
/// output is only searched for the end of a streamed list, right after the daemon was ready.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PlainLists {
    /// From the first request to the end of the last, every kind at once as the daemon lists
    /// them.
    pub wall_s: f64,
    /// Each kind's requests, one after the other as the daemon made them.
    pub requests: Vec<PlainRequest>,
    /// What the API server and etcd spent while serving them (left out of the phase's figures).
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PlainRequest {
    /// `verb resource`, and whether streamed or how many pages.
    pub what: String,
    pub seconds: f64,
    pub bytes: u64,
}

/// A contender's cost over a window of steady churn or idleness.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Steady {
    pub window_s: f64,
    /// (kind, lag in seconds or None if not reclaimed in the window).
    pub lags: Vec<(EventKind, Option<f64>)>,
    pub requests: Counts,
    pub list_bytes: f64,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    /// The contender's own CPU seconds in the window.
    pub cpu_s: Option<f64>,
    pub at_end: Option<ProcSample>,
}

impl Steady {
    pub fn reclaimed(&self) -> usize {
        self.lags.iter().filter(|(_, lag)| lag.is_some()).count()
    }
}

impl SizeResult {
    /// The first workspace-gc measured at this size (a churn-only comparison is not one).
    pub fn daemon(&self) -> Option<&Contender> {
        self.contenders
            .iter()
            .find(|c| c.role == Role::Daemon && !c.churn_only)
    }

    /// A contender of `role`, other than workspace-gc's churn-only comparisons.
    pub fn baseline(&self, role: Role) -> Option<&Contender> {
        self.contenders
            .iter()
            .find(|c| c.role == role && !c.churn_only)
    }
}

impl Contender {
    pub fn reclaimed(&self) -> usize {
        self.lags.iter().filter(|(_, lag)| lag.is_some()).count()
    }
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    pub n: usize,
    /// The control plane, when the run compares planes (`--apiservers`): "1 server",
    /// "3 servers, clocks 5 ms apart". Empty otherwise.
    #[serde(default)]
    pub plane: String,
    pub namespaces: usize,
    pub events: usize,
    pub states: Vec<(String, usize)>,
    pub pods_per_build: usize,
    /// Whether the baselines, churn and idle phases ran at this size.
    pub full: bool,
    pub control_plane_s: f64,
    pub create_s: f64,
    pub create_requests: usize,
    pub create_objects: usize,
    pub etcd_bytes: u64,
    pub etcd_db_bytes: u64,
    /// Events per second per kind actually used: at most --rate, and spread over at least one
    /// sweep interval, so the janitor's lag is not biased by where its cycle happens to be.
    pub rate: f64,
    pub load_before: String,
    pub load_after: String,
    pub contenders: Vec<Contender>,
    pub versions: Vec<(String, String)>,
    pub total_s: f64,
}

/// Which kind of contender a column is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    #[default]
    Daemon,
    Sweep,
    Gc,
}

/// Requests matching `filter` received within `[from, to)`, counted by verb and by
/// `verb resource`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Counts {
    pub by_verb: BTreeMap<String, u64>,
    pub by_verb_resource: BTreeMap<String, u64>,
    /// LIST requests scoped to one namespace (the live re-check's pod lists).
    pub namespaced_lists: u64,
    /// LIST requests across all namespaces (initial lists, watch re-lists, sweeps).
    pub cluster_lists: u64,
    /// Answers of 400 and above, by `verb resource code` (a GET of a deleted owner is a 404).
    pub errors: BTreeMap<String, u64>,
    pub total: u64,
}

impl Counts {
    pub fn verb(&self, verb: &str) -> u64 {
        self.by_verb.get(verb).copied().unwrap_or(0)
    }

    /// Requests with `verb` on Leases (leader election).
    pub fn lease(&self, verb: &str) -> u64 {
        self.by_verb_resource
            .get(&format!("{verb} leases"))
            .copied()
            .unwrap_or(0)
    }

    /// Requests other than watches (a watch is one long-lived request per kind).
    pub fn non_watch(&self) -> u64 {
        self.total - self.verb("watch")
    }
}

/// What /proc says about a process: peak and current resident memory, CPU seconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ProcSample {
    pub hwm_kib: u64,
    pub rss_kib: u64,
    pub cpu_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// The claim's owner (its job, named in ownerReferences) is deleted: due at once.
    OwnerDeleted,
    /// The job finishes now; the claim is due `ttl` after the recorded completion time.
    TtlPassed,
}
