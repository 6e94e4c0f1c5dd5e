//! Generated object graphs: namespaces of NotebookValidationJobs, PipelineRuns, TaskRuns, pods
//! and claims drawn from small name pools, so that references, workspace bindings and the
//! operator's names collide often. A [`Graph`] holds times relative to `now`; [`Graph::render`]
//! turns it into raw API objects for the oracle, the in-memory daemon path
//! ([`daemon_decisions`]) and the real API server alike.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Namespace;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use serde_json::{Value, json};
use workspace_gc::cluster::cache::{Change, Index, TaskRunEntry, Update};
use workspace_gc::cluster::resources::{self, PodVolumes};
use workspace_gc::contract::annotations;
use workspace_gc::decide::facts::{
    ClaimFacts, JobEntry, NamespaceEntry, ObjectKey, PodEntry, RunEntry,
};
use workspace_gc::decide::linking;
use workspace_gc::decide::namespace::{Bounds, Policies};
use workspace_gc::decide::policy::{self, Decision, Policy, Reason, Verdict};
use workspace_gc::surface::audit;

use super::oracle::{self, NamespaceBounds, World};
use super::shapes::{BUILD_WORKSPACE_LABEL, OPERATOR_CLAIM_LABELS};

pub const JOB_KIND: &str = "NotebookValidationJob";
pub const RUN_KIND: &str = "PipelineRun";
pub const TASK_RUN_KIND: &str = "TaskRun";

/// Names are drawn from these pools: `nb` ↔ `nb-build` ↔ `nb-build-workspace` match by the
/// operator's convention, `x` is both a job and a run, `nb-build` both a PipelineRun and a
/// TaskRun.
const JOBS: &[&str] = &["nb", "other", "x"];
const RUNS: &[&str] = &["nb-build", "other-build", "x", "retry"];
const TASK_RUNS: &[&str] = &["nb-build", "t1", "x"];
const CLAIMS: &[&str] = &[
    "nb-build-workspace",
    "other-build-workspace",
    "x-build-workspace",
    "shared",
    "nb",
];
/// Only an in-memory claim can have an empty `{job}`; the server rejects a leading `-`. Three
/// have a foreign name (no build workspace by provenance): those of the operator's shape that
/// name no job keep orphans, and so deletions, frequent.
const MEMORY_CLAIMS: &[&str] = &[
    "nb-build-workspace",
    "other-build-workspace",
    "x-build-workspace",
    "retry-build-workspace",
    "t1-build-workspace",
    "shared-build-workspace",
    "gone-build-workspace",
    "shared",
    "nb",
    "-build-workspace",
];
const PODS: &[&str] = &["p0", "p1", "p2"];

/// Which values may be generated: the API server rejects some odd ones (a non-string
/// `completionTime`, a name starting with `-`) that only a cache fed by hand can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Anything the in-memory path can be fed, with times on the policy's boundaries.
    Memory,
    /// Only what the CRDs and core validation accept, with times minutes away from every
    /// boundary of [`SERVER_POLICIES`] and of the `ttl` annotations, since the server stamps
    /// creation times and the audit reads its own clock.
    Server,
}

/// The policies the server graphs are audited under; see [`Profile::Server`].
pub const SERVER_POLICIES: [(&str, &str, &str, &str); 3] = [
    // ttl_after_finished, ttl_after_failed, orphan_grace, max_age
    ("1h", "1d", "1h", "7d"),
    ("20m", "2h", "1s", "7d"),
    ("2h", "20m", "1s", "1s"),
];

/// The policy the in-memory graphs are checked under: failed builds kept a day, a TTL whose
/// boundaries [`TTLS`] puts instants on.
pub fn memory_policy() -> Policy {
    Policy {
        ttl_after_failed: Duration::days(1),
        ..Policy::default()
    }
}

#[derive(Debug, Clone)]
pub struct Graph {
    pub namespaces: Vec<Space>,
    /// Namespace annotations count only in memory graphs: the server's namespaces are the
    /// tests' own.
    pub namespace_bounds: Option<NamespaceBounds>,
    /// The cluster's `keep_failed` the graph is checked under (memory graphs only).
    pub keep_failed: u32,
}

impl Graph {
    /// [`memory_policy`], keeping as many failed builds by count as the graph says.
    pub fn memory_policy(&self) -> Policy {
        Policy {
            keep_failed: self.keep_failed,
            ..memory_policy()
        }
    }
}

/// What a memory graph's namespaces may set: shorter than the cluster's down to 30 minutes, a
/// boundary of [`TTLS`].
pub const MEMORY_BOUNDS: NamespaceBounds = NamespaceBounds {
    may_shorten: true,
    min_ttl: Duration::minutes(30),
};

/// One namespace's objects.
#[derive(Debug, Clone)]
pub struct Space {
    pub jobs: Vec<Job>,
    pub runs: Vec<Run>,
    pub task_runs: Vec<Run>,
    pub claims: Vec<Claim>,
    pub pods: Vec<Pod>,
    /// The Namespace's annotations; `None`: no Namespace object (not seen yet).
    pub annotations: Option<Vec<(String, String)>>,
}

#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    /// `status.phase`; `None` for none.
    pub phase: Option<Value>,
    pub completion: Stamp,
    /// `spec.podConfig`; `None` for none.
    pub pod_config: Option<Value>,
}

/// A PipelineRun or TaskRun.
#[derive(Debug, Clone)]
pub struct Run {
    pub name: String,
    /// Claims bound in `spec.workspaces`.
    pub binds: Vec<String>,
    pub conditions: Conditions,
    pub completion: Stamp,
}

#[derive(Debug, Clone)]
pub enum Conditions {
    Absent,
    NotAList,
    /// `(type, status)` pairs.
    List(Vec<(Value, Value)>),
}

/// A `completionTime`.
#[derive(Debug, Clone)]
pub enum Stamp {
    Absent,
    GoZero,
    Unparsable,
    NotAString,
    /// Seconds before `now` (negative: in the future).
    Ago(i64),
}

#[derive(Debug, Clone)]
pub struct Claim {
    pub name: String,
    /// Seconds before `now` it was created (the server sets its own).
    pub age: i64,
    pub annotations: Vec<(String, Text)>,
    pub references: Vec<Reference>,
    pub deleting: bool,
    /// The status of its `Unused` condition; `None` for none.
    pub unused: Option<&'static str>,
    pub made: Made,
}

/// How a claim came to carry the build-workspace label, as its labels and `managedFields`
/// record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// By the operator: its labels, in the create that made the claim (an `Update` entry).
    Operator,
    /// Made by one server-side apply with the operator's labels: its entry alone owns the spec.
    Applied,
    /// Made unlabelled by `kubectl create`, then server-side applied whole with the operator's
    /// labels by a GitOps controller, which shares the unchanged spec (issue 55, case 1).
    Adopted,
    /// Made unlabelled by `kubectl create`, then given the operator's labels by a server-side
    /// apply of labels only.
    LabelsApplied,
    /// Made without the label by one manager, labelled later by another (`kubectl-label`).
    LabelledLater,
    /// Labelled later, then annotated by more writers than the server keeps entries for: it
    /// merged the creator's and the labeller's into `ancient-changes` (issue 55, case 2).
    Merged,
    /// The operator's write, but only the build-workspace label of its set.
    LabelOnly,
    /// No `managedFields` at all (a client cleared them).
    Unrecorded,
}

/// The operator's labels on a claim, as a JSON object.
pub fn operator_labels() -> Value {
    (OPERATOR_CLAIM_LABELS.iter())
        .map(|(key, value)| ((*key).to_owned(), json!(value)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The `managedFields` entry of `manager`'s create of a claim with the build-workspace label
/// (and the rest of the operator's labels): it owns the labels and the spec.
pub fn made_labelled(manager: &str) -> Value {
    made(manager, operator_label_fields())
}

/// The operator's labels as `managedFields` records their ownership (a `fieldsV1` object).
fn operator_label_fields() -> Value {
    (OPERATOR_CLAIM_LABELS.iter())
        .map(|(key, _)| (format!("f:{key}"), json!({})))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A create's entry: it owns `labels` (a `fieldsV1` object) and the claim's spec.
fn made(manager: &str, labels: Value) -> Value {
    entry(manager, "Update", labels, true)
}

/// A server-side apply's entry: it owns the operator's labels, and the claim's spec if `whole`.
fn applied(manager: &str, whole: bool) -> Value {
    entry(manager, "Apply", operator_label_fields(), whole)
}

/// A `managedFields` entry of `operation` owning `labels`, and the claim's spec if `spec`.
fn entry(manager: &str, operation: &str, labels: Value, spec: bool) -> Value {
    let mut fields = json!({"f:metadata": {"f:labels": labels}});
    if spec {
        fields["f:spec"] =
            json!({"f:accessModes": {}, "f:resources": {"f:requests": {"f:storage": {}}}});
    }
    json!({"manager": manager, "operation": operation, "apiVersion": "v1",
           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
}

/// An annotation value.
#[derive(Debug, Clone)]
pub enum Text {
    Plain(String),
    /// An RFC 3339 instant this many seconds before `now`, padded with spaces if asked.
    Ago(i64, bool),
}

#[derive(Debug, Clone)]
pub struct Reference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// The UID of the object of that kind and name, or a stale one.
    pub right_uid: bool,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub phase: Option<String>,
    pub mounts: Vec<String>,
}

/// 1–2 namespaces of a handful of objects each.
pub fn graph(profile: Profile) -> impl Strategy<Value = Graph> {
    let namespace_bounds = match profile {
        Profile::Memory => Some(MEMORY_BOUNDS),
        Profile::Server => None,
    };
    let keep_failed = match profile {
        Profile::Memory => prop_oneof![1 => Just(0u32), 3 => 1..=2u32].boxed(),
        Profile::Server => Just(0u32).boxed(),
    };
    (prop::collection::vec(space(profile), 1..=2), keep_failed).prop_map(
        move |(namespaces, keep_failed)| Graph {
            namespaces,
            namespace_bounds,
            keep_failed,
        },
    )
}

/// A namespace's annotations, valid, invalid and out of bounds, on the boundaries of [`TTLS`].
fn namespace_annotations(profile: Profile) -> BoxedStrategy<Option<Vec<(String, String)>>> {
    if profile == Profile::Server {
        return Just(Some(Vec::new())).boxed();
    }
    let key = |k: &str| format!("workspace-gc.mlops.dev/{k}");
    let keys = select(vec![
        "ttl-after-finished",
        "ttl-after-failed",
        "orphan-grace",
        "max-age",
    ]);
    // Within and outside the bounds, and then values that do not parse: those keep every claim
    // of the namespace, so they are rarer, or the valid ones would seldom count.
    let durations = ["2h", "30m", " 1d ", "0s", "10m", "90m"];
    let duration =
        (keys.clone(), select(durations.to_vec())).prop_map(move |(k, v)| (key(k), v.to_owned()));
    let unparsed = (keys, select(vec!["soon", "P7D", "300000000y"]))
        .prop_map(move |(k, v)| (key(k), v.to_owned()));
    let collect = select(vec!["false", "true"]).prop_map(move |v| (key("collect"), v.to_owned()));
    // Fewer than a graph's cluster keeps (up to 2) is not understood there.
    let keep_failed = select(vec!["0", "1", " 3 ", "1001", "x"])
        .prop_map(move |v| (key("keep-failed"), v.to_owned()));
    let not_understood = select(vec![
        (key("collect"), "nope"),
        (key("collect"), "False"),
        (key("collect"), " false"),
        (key("ttl"), "1h"),
        (key("ttl-after-finish"), "2h"),
    ])
    .prop_map(|(k, v)| (k, v.to_owned()));
    let annotation = prop_oneof![
        8 => duration,
        1 => unparsed,
        2 => collect,
        2 => keep_failed,
        1 => not_understood,
    ];
    prop_oneof![
        1 => Just(None),
        8 => prop::collection::vec(annotation, 0..=3).prop_map(Some),
    ]
    .boxed()
}

fn space(profile: Profile) -> impl Strategy<Value = Space> {
    let names = |pool: &'static [&'static str]| {
        subsequence(pool.to_vec(), 0..=pool.len())
            .prop_map(|names| names.into_iter().map(str::to_owned).collect::<Vec<_>>())
    };
    let jobs = names(JOBS).prop_flat_map(move |names| {
        names
            .into_iter()
            .map(|name| job(name, profile))
            .collect::<Vec<_>>()
    });
    let runs = move |pool| {
        names(pool).prop_flat_map(move |names| {
            names
                .into_iter()
                .map(|name| run(name, profile))
                .collect::<Vec<_>>()
        })
    };
    let claim_names = match profile {
        Profile::Memory => MEMORY_CLAIMS,
        Profile::Server => CLAIMS,
    };
    let claims = names(claim_names).prop_flat_map(move |names| {
        names
            .into_iter()
            .map(|name| claim(name, profile))
            .collect::<Vec<_>>()
    });
    let pods = names(PODS).prop_flat_map(move |names| {
        names
            .into_iter()
            .map(|name| pod(name, profile))
            .collect::<Vec<_>>()
    });
    let annotations = namespace_annotations(profile);
    (jobs, runs(RUNS), runs(TASK_RUNS), claims, pods, annotations).prop_map(
        |(jobs, runs, task_runs, claims, pods, annotations)| Space {
            jobs,
            runs,
            task_runs,
            claims,
            pods,
            annotations,
        },
    )
}

fn job(name: String, profile: Profile) -> impl Strategy<Value = Job> {
    let strings = prop_oneof![
        3 => Just(Some(json!("Succeeded"))),
        3 => Just(Some(json!("Failed"))),
        1 => Just(None),
        1 => Just(Some(json!("Running"))),
        1 => Just(Some(json!("ValidationRunning"))),
        1 => Just(Some(json!("succeeded"))),
    ];
    let phase = match profile {
        Profile::Server => strings.boxed(),
        Profile::Memory => prop_oneof![9 => strings, 1 => Just(Some(json!(42)))].boxed(),
    };
    (phase, stamp(profile), pod_config(profile)).prop_map(move |(phase, completion, pod_config)| {
        Job {
            name: name.clone(),
            phase,
            completion,
            pod_config,
        }
    })
}

/// A job's `spec.podConfig`: mostly none or volumes naming claims (another job's workspace
/// among them); in memory also the odd shapes that cannot be read.
fn pod_config(profile: Profile) -> BoxedStrategy<Option<Value>> {
    let mut targets: Vec<&str> = CLAIMS.to_vec();
    targets.push("absent-claim");
    let volumes = subsequence(targets, 1..=2).prop_map(|claims| {
        let volumes: Vec<Value> = (claims.iter().enumerate())
            .map(|(i, c)| json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        Some(json!({ "volumes": volumes }))
    });
    let common = prop_oneof![
        4 => Just(None),
        1 => Just(Some(json!({"volumes": [{"name": "cfg", "configMap": {"name": "x"}}]}))),
        3 => volumes,
    ];
    match profile {
        Profile::Server => common.boxed(),
        Profile::Memory => prop_oneof![
            8 => common,
            1 => select(vec![
                json!({"volumes": "shared"}),
                json!({"volumes": [{"persistentVolumeClaim": {"claimName": 7}}]}),
                json!({"volumes": ["shared"]}),
                json!("podConfig"),
            ])
            .prop_map(Some),
        ]
        .boxed(),
    }
}

fn run(name: String, profile: Profile) -> impl Strategy<Value = Run> {
    let mut targets: Vec<&str> = CLAIMS.to_vec();
    targets.push("absent-claim");
    let pair = |t: &str, s: &str| (json!(t), json!(s));
    let mut pairs = vec![
        pair("Succeeded", "True"),
        pair("Succeeded", "True"),
        pair("Succeeded", "False"),
        pair("Succeeded", "Unknown"),
        pair("Ready", "True"),
        pair("Succeeded", "true"),
    ];
    let conditions = match profile {
        Profile::Server => prop_oneof![
            1 => Just(Conditions::Absent),
            4 => select(pairs).prop_map(|p| Conditions::List(vec![p])),
        ]
        .boxed(),
        Profile::Memory => {
            pairs.push((json!("Succeeded"), json!(true)));
            pairs.push((json!(1), json!("True")));
            prop_oneof![
                1 => Just(Conditions::Absent),
                1 => Just(Conditions::NotAList),
                // Knative keys conditions by type: never two `Succeeded` entries (which one
                // would count is left open by the rule).
                6 => prop::collection::vec(select(pairs), 1..=2).prop_map(|mut pairs| {
                    if pairs.len() == 2 && pairs[0].0 == pairs[1].0 {
                        pairs.pop();
                    }
                    Conditions::List(pairs)
                }),
            ]
            .boxed()
        }
    };
    let binds = subsequence(targets.clone(), 0..=2)
        .prop_map(|names| names.into_iter().map(str::to_owned).collect());
    (binds, conditions, stamp(profile)).prop_map(move |(binds, conditions, completion)| Run {
        name: name.clone(),
        binds,
        conditions,
        completion,
    })
}

/// Policy TTLs and the `ttl` annotations below: the memory profile puts instants on and just
/// beside each boundary.
const TTLS: [i64; 6] = [3600, 1800, 7200, 0, 86_400, 5400];
/// Minutes clear of every boundary the server profile can meet (TTLs 0, 20m, 30m, 1h, 2h, 1d).
const SERVER_AGES: [i64; 6] = [-3600, 600, 2700, 5400, 10_800, 172_800];

fn ago(profile: Profile) -> BoxedStrategy<i64> {
    match profile {
        Profile::Server => select(SERVER_AGES.to_vec()).boxed(),
        Profile::Memory => {
            let mut edges: Vec<i64> = TTLS.iter().flat_map(|t| [t - 1, *t, t + 1]).collect();
            edges.extend([-3600, -1, 600, 3 * 86_400]);
            prop_oneof![3 => select(edges), 1 => -7200i64..10 * 86_400].boxed()
        }
    }
}

fn stamp(profile: Profile) -> impl Strategy<Value = Stamp> {
    let common = prop_oneof![
        6 => ago(profile).prop_map(Stamp::Ago),
        1 => Just(Stamp::Absent),
        1 => Just(Stamp::GoZero),
    ];
    match profile {
        Profile::Server => common.boxed(),
        Profile::Memory => prop_oneof![
            8 => common,
            1 => Just(Stamp::Unparsable),
            1 => Just(Stamp::NotAString),
        ]
        .boxed(),
    }
}

fn claim(name: String, profile: Profile) -> impl Strategy<Value = Claim> {
    const GRACE: i64 = 600;
    const MAX_AGE: i64 = 7 * 86_400;
    let age = prop_oneof![
        3 => select(vec![
            -60, 0, 30, GRACE - 1, GRACE, GRACE + 1, 7200,
            MAX_AGE - 1, MAX_AGE, MAX_AGE + 1, 30 * 86_400,
        ]),
        1 => 0i64..14 * 86_400,
    ];
    let references = prop::collection::vec(reference(), 0..=2);
    // Few server graphs: fewer annotations leave more claims to their owners.
    let annotations = match profile {
        Profile::Memory => 0..=2,
        Profile::Server => 0..=1,
    };
    let unused = prop_oneof![
        6 => Just(None),
        1 => Just(Some("False")),
        1 => Just(Some("True")),
    ];
    // The server records its own managedFields (tests/cluster/graphs_cluster.rs drops these):
    // its claims are all made labelled in one write.
    let made = match profile {
        Profile::Memory => prop_oneof![
            // As often the operator's as before the other kinds were added: the rule's other side
            // (deletions due) stays well reached.
            45 => Just(Made::Operator),
            1 => Just(Made::Applied),
            1 => Just(Made::Adopted),
            1 => Just(Made::LabelsApplied),
            1 => Just(Made::LabelledLater),
            1 => Just(Made::Merged),
            1 => Just(Made::LabelOnly),
            1 => Just(Made::Unrecorded),
        ]
        .boxed(),
        Profile::Server => Just(Made::Operator).boxed(),
    };
    (
        age,
        prop::collection::vec(annotation(profile), annotations),
        references,
        prop::bool::weighted(0.1),
        unused,
        made,
    )
        .prop_map(
            move |(age, annotations, references, deleting, unused, made)| Claim {
                name: name.clone(),
                age,
                annotations,
                references,
                deleting,
                unused,
                made,
            },
        )
}

fn annotation(profile: Profile) -> impl Strategy<Value = (String, Text)> {
    let key = |k: &str| format!("workspace-gc.mlops.dev/{k}");
    let plain = |key: String, values: &[&str]| {
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        select(values).prop_map(move |v| (key.clone(), Text::Plain(v)))
    };
    let (keeps, ttls): (&[&str], &[&str]) = match profile {
        Profile::Server => (
            &["true", "false", "yes"],
            &["30m", " 2h ", "0s", "1d", "soon"],
        ),
        Profile::Memory => (
            &["true", "false", "True", "yes", ""],
            // 300000000y does not fit chrono; 200000000y does, but overflows any instant.
            &[
                "30m",
                " 2h ",
                "0s",
                "1d",
                "1h 30m",
                "soon",
                "",
                "300000000y",
                "200000000y",
            ],
        ),
    };
    let expires = key("expires");
    // The daemon's own, as a revocation leaves it (a resourceVersion), or odd, under the key
    // it writes and the one versions before wrote under the prefix: in memory graphs, so the server graphs' draws (and the verdicts they reach) stay as they were.
    let revoked = match profile {
        Profile::Memory => 1,
        Profile::Server => 0,
    };
    prop_oneof![
        2 => plain(key("keep"), keeps),
        4 => plain(key("ttl"), ttls),
        3 => (ago(profile), any::<bool>())
            .prop_map(move |(secs, pad)| (expires.clone(), Text::Ago(secs, pad))),
        1 => plain(key("expires"), &["garbage", "2026-13-01T00:00:00Z"]),
        1 => plain(key("kep"), &["true"]),
        1 => plain("example.com/keep".to_owned(), &["true"]),
        revoked => plain(key("revoked-delete"), &["4711", ""]),
        revoked => plain(annotations::REVOKED.to_owned(), &["4711", ""]),
    ]
}

fn reference() -> impl Strategy<Value = Reference> {
    let to = |api_version: &'static str, kind: &'static str, pool: &'static [&'static str]| {
        (select(pool.to_vec()), any::<bool>()).prop_map(move |(name, right_uid)| Reference {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            right_uid,
        })
    };
    let foreign = select(vec![
        ("apps/v1", "Deployment", "x"),
        ("v1", "ConfigMap", "nb"),
        ("tekton.dev/v1", "Pipeline", "nb-build"),
        ("example.com/v1", "PipelineRun", "nb-build"),
        // No group at all: `tekton.dev` reads as a core version.
        ("tekton.dev", "PipelineRun", "nb-build"),
    ])
    .prop_map(|(api_version, kind, name)| Reference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        right_uid: true,
    });
    prop_oneof![
        3 => to("mlops.mlops.dev/v1alpha1", JOB_KIND, JOBS),
        1 => to("mlops.mlops.dev/v1", JOB_KIND, JOBS),
        3 => to("tekton.dev/v1", RUN_KIND, RUNS),
        1 => to("tekton.dev/v1beta1", RUN_KIND, RUNS),
        3 => to("tekton.dev/v1", TASK_RUN_KIND, TASK_RUNS),
        2 => foreign,
    ]
}

fn pod(name: String, profile: Profile) -> impl Strategy<Value = Pod> {
    let mut phases = vec![
        Some("Pending"),
        Some("Running"),
        Some("Succeeded"),
        Some("Succeeded"),
        Some("Failed"),
        Some("Unknown"),
    ];
    if profile == Profile::Memory {
        phases.extend([None, Some("weird")]);
    }
    let phase = select(phases).prop_map(|p| p.map(str::to_owned));
    let mounts = subsequence(CLAIMS.to_vec(), 0..=2)
        .prop_map(|names| names.into_iter().map(str::to_owned).collect());
    (phase, mounts).prop_map(move |(phase, mounts)| Pod {
        name: name.clone(),
        phase,
        mounts,
    })
}

/// Finds the UID of an owner by namespace, kind and name, when it has one.
pub type Uids<'a> = &'a dyn Fn(&str, &str, &str) -> Option<String>;

/// The UIDs the in-memory graphs give their owners.
pub fn memory_uid(namespace: &str, kind: &str, name: &str) -> Option<String> {
    Some(format!("uid-{namespace}-{kind}-{name}"))
}

/// Kubernetes writes times in RFC 3339 with whole seconds and `Z`.
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Graph {
    /// The raw objects, namespace `i` named `namespaces[i]`; owners get `uids`' answer as their
    /// UID, and references with the right UID name it too.
    pub fn render(&self, namespaces: &[String], now: DateTime<Utc>, uids: Uids) -> World {
        let mut world = World {
            namespace_bounds: self.namespace_bounds,
            ..World::default()
        };
        for (space, namespace) in self.namespaces.iter().zip(namespaces) {
            space.render(namespace, now, uids, &mut world);
        }
        world
    }
}

impl Space {
    fn render(&self, ns: &str, now: DateTime<Utc>, uids: Uids, world: &mut World) {
        if let Some(annotations) = &self.annotations {
            let annotations: BTreeMap<&str, &str> = (annotations.iter())
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            world.namespaces.push(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "annotations": annotations},
            }));
        }
        let at = |secs: i64| rfc3339(now - Duration::seconds(secs));
        let meta = |kind: &str, name: &str| {
            let mut meta = json!({"name": name, "namespace": ns, "creationTimestamp": at(0)});
            if let Some(uid) = uids(ns, kind, name) {
                meta["uid"] = uid.into();
            }
            meta
        };
        let stamp = |stamp: &Stamp| match stamp {
            Stamp::Absent => None,
            Stamp::GoZero => Some(json!("0001-01-01T00:00:00Z")),
            Stamp::Unparsable => Some(json!("yesterday")),
            Stamp::NotAString => Some(json!(1_700_000_000)),
            Stamp::Ago(secs) => Some(json!(at(*secs))),
        };
        for job in &self.jobs {
            let mut object = json!({
                "apiVersion": "mlops.mlops.dev/v1alpha1", "kind": JOB_KIND,
                "metadata": meta(JOB_KIND, &job.name), "spec": {},
            });
            if let Some(pod_config) = &job.pod_config {
                object["spec"]["podConfig"] = pod_config.clone();
            }
            let mut status = serde_json::Map::new();
            if let Some(phase) = &job.phase {
                status.insert("phase".into(), phase.clone());
            }
            if let Some(time) = stamp(&job.completion) {
                status.insert("completionTime".into(), time);
            }
            if !status.is_empty() {
                object["status"] = status.into();
            }
            world.jobs.push(object);
        }
        for (kind, runs, out) in [
            (RUN_KIND, &self.runs, &mut world.runs),
            (TASK_RUN_KIND, &self.task_runs, &mut world.task_runs),
        ] {
            for run in runs {
                let workspaces: Vec<Value> = (run.binds.iter().enumerate())
                    .map(|(i, c)| json!({"name": format!("w{i}"), "persistentVolumeClaim": {"claimName": c}}))
                    .collect();
                let mut object = json!({
                    "apiVersion": "tekton.dev/v1", "kind": kind,
                    "metadata": meta(kind, &run.name), "spec": {"workspaces": workspaces},
                });
                let mut status = serde_json::Map::new();
                match &run.conditions {
                    Conditions::Absent => {}
                    Conditions::NotAList => {
                        status.insert("conditions".into(), json!("nope"));
                    }
                    Conditions::List(pairs) => {
                        let list = pairs.iter().map(|(t, s)| json!({"type": t, "status": s}));
                        status.insert("conditions".into(), list.collect::<Vec<_>>().into());
                    }
                }
                if let Some(time) = stamp(&run.completion) {
                    status.insert("completionTime".into(), time);
                }
                if !status.is_empty() {
                    object["status"] = status.into();
                }
                out.push(object);
            }
        }
        for claim in &self.claims {
            world.claims.push(claim.render(ns, now, uids));
        }
        for pod in &self.pods {
            let volumes: Vec<Value> = (pod.mounts.iter().enumerate())
                .map(|(i, c)| json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": c}}))
                .collect();
            let mut object = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": ns},
                "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": volumes},
            });
            if let Some(phase) = &pod.phase {
                object["status"] = json!({ "phase": phase });
            }
            world.pods.push(object);
        }
    }
}

impl Claim {
    fn render(&self, ns: &str, now: DateTime<Utc>, uids: Uids) -> Value {
        let at = |secs: i64| rfc3339(now - Duration::seconds(secs));
        let annotations: BTreeMap<&str, String> = (self.annotations.iter())
            .map(|(key, text)| {
                let value = match text {
                    Text::Plain(value) => value.clone(),
                    Text::Ago(secs, false) => at(*secs),
                    Text::Ago(secs, true) => format!(" {} ", at(*secs)),
                };
                (key.as_str(), value)
            })
            .collect();
        let references: Vec<Value> = (self.references.iter().enumerate())
            .map(|(i, r)| {
                let uid = match r.right_uid {
                    true => uids(ns, &r.kind, &r.name),
                    false => None,
                };
                json!({
                    "apiVersion": r.api_version, "kind": r.kind, "name": r.name,
                    "uid": uid.unwrap_or_else(|| format!("stale-uid-{i}")),
                })
            })
            .collect();
        let label = format!("f:{BUILD_WORKSPACE_LABEL}");
        let later = json!({"manager": "kubectl-label", "operation": "Update",
                           "fieldsV1": {"f:metadata": {"f:labels": {&label: {}}}}});
        let unlabelled = || made("kubectl-create", json!({}));
        let (labels, managed) = match self.made {
            Made::Operator => (operator_labels(), json!([made_labelled("manager")])),
            Made::Applied => (operator_labels(), json!([applied("argocd", true)])),
            Made::Adopted => (
                operator_labels(),
                json!([unlabelled(), applied("argocd", true)]),
            ),
            Made::LabelsApplied => (
                operator_labels(),
                json!([unlabelled(), applied("flux", false)]),
            ),
            Made::LabelledLater => (operator_labels(), json!([unlabelled(), later])),
            Made::Merged => {
                // The union the server writes: the creator's spec and the labeller's label.
                let mut merged = made("ancient-changes", json!({&label: {}}));
                merged["time"] = json!("2026-01-02T00:00:00Z");
                let tool = json!({"manager": "velero", "operation": "Update",
                                  "fieldsV1": {"f:metadata": {"f:annotations": {"f:backup": {}}}}});
                (operator_labels(), json!([merged, tool]))
            }
            Made::LabelOnly => (
                json!({BUILD_WORKSPACE_LABEL: "true"}),
                json!([made("manager", json!({&label: {}}))]),
            ),
            Made::Unrecorded => (operator_labels(), json!([])),
        };
        let mut meta = json!({
            "name": self.name, "namespace": ns,
            "creationTimestamp": at(self.age),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": references,
            "managedFields": managed,
        });
        if self.deleting {
            // The server only sets this on a delete, which a finalizer holds.
            meta["deletionTimestamp"] = at(60).into();
            meta["finalizers"] = json!(["workspace-gc.test/hold"]);
        }
        let mut claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        });
        if let Some(status) = self.unused {
            claim["status"] = json!({"conditions": [{"type": "Unused", "status": status}]});
        }
        claim
    }
}

/// A policy from the duration strings of [`SERVER_POLICIES`].
pub fn policy_of((ttl, failed, grace, max_age): (&str, &str, &str, &str)) -> Policy {
    let parse = |text: &str| Duration::from_std(humantime::parse_duration(text).unwrap()).unwrap();
    Policy {
        ttl_after_finished: parse(ttl),
        ttl_after_failed: parse(failed),
        orphan_grace: parse(grace),
        max_age: parse(max_age),
        keep_failed: 0,
        collection: policy::Collection::On,
        provenance: Policy::default().provenance,
    }
}

/// The daemon's index, filled from raw objects the way its watches fill it: each kind converted
/// by `resources` and delivered as one initial list.
pub fn daemon_index(world: &World) -> Index {
    let mut index = empty_index(world);
    mark_lists(&mut index, false);
    for entry in entries(world) {
        entry.send(&mut index, Event::Listed);
    }
    mark_lists(&mut index, true);
    assert!(index.synced(), "every kind has listed");
    index
}

/// The daemon's index after empty initial lists and then watch events only: every object of
/// `before` applied, then those of `before` missing from `after` deleted, then every object of
/// `after` applied. It must decide as [`daemon_index`] of `after` does: the secondary indices
/// must follow every change.
pub fn daemon_index_after_events(before: &World, after: &World) -> Index {
    let mut index = empty_index(after);
    mark_lists(&mut index, true);
    for entry in entries(before) {
        entry.send(&mut index, Event::Applied);
    }
    let after = entries(after);
    let remaining: HashSet<(usize, ObjectKey)> = after.iter().map(Entry::id).collect();
    for entry in entries(before) {
        if !remaining.contains(&entry.id()) {
            entry.delete(&mut index);
        }
    }
    for entry in after {
        entry.send(&mut index, Event::Applied);
    }
    index
}

/// The daemon's index before any list: it waits for Namespaces when their annotations count.
fn empty_index(world: &World) -> Index {
    match world.namespace_bounds {
        Some(_) => Index::default().with_namespaces(),
        None => Index::default(),
    }
}

/// The cluster's policy, refined by namespaces as `world` says they may.
pub fn policies(world: &World, policy: &Policy) -> Policies {
    Policies {
        cluster: policy.clone(),
        namespaces: world.namespace_bounds.map(|b| Bounds {
            may_shorten: b.may_shorten,
            min_ttl: b.min_ttl,
        }),
    }
}

/// Starts (`done` false) or ends the initial list of every kind.
fn mark_lists(index: &mut Index, done: bool) {
    fn marker<E>(done: bool) -> Change<E> {
        if done {
            Change::InitDone(None)
        } else {
            Change::Init(None)
        }
    }
    for update in [
        Update::Claim(marker(done)),
        Update::Job(marker(done)),
        Update::Run(marker(done)),
        Update::TaskRun(marker(done)),
        Update::Pod(marker(done)),
        Update::Namespace(marker(done)),
    ] {
        index.update(update);
    }
}

/// One object converted as the daemon converts it.
enum Entry {
    Claim(ClaimFacts),
    Job(JobEntry),
    Run(RunEntry),
    TaskRun(TaskRunEntry),
    Pod(PodEntry),
    Namespace(NamespaceEntry),
}

/// How an entry reaches the index: in an initial list, or as a watch event.
#[derive(Clone, Copy)]
enum Event {
    Listed,
    Applied,
}

fn entries(world: &World) -> Vec<Entry> {
    fn decode<T: serde::de::DeserializeOwned>(value: &Value) -> T {
        serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("decode {value}: {e}"))
    }
    let claims = (world.claims.iter()).map(|c| Entry::Claim(resources::claim_facts(&decode(c))));
    let jobs = (world.jobs.iter()).map(|j| Entry::Job(resources::job_entry(&decode(j))));
    let runs = (world.runs.iter()).map(|r| Entry::Run(resources::run_entry(&decode(r))));
    let task_runs = (world.task_runs.iter())
        .map(|r| Entry::TaskRun(TaskRunEntry(resources::task_run_entry(&decode(r)))));
    let pods =
        (world.pods.iter()).map(|p| Entry::Pod(resources::pod_entry(&decode::<PodVolumes>(p))));
    let namespaces = (world.namespaces.iter())
        .map(|n| Entry::Namespace(resources::namespace_entry(&decode::<Namespace>(n).metadata)));
    claims
        .chain(jobs)
        .chain(runs)
        .chain(task_runs)
        .chain(pods)
        .chain(namespaces)
        .collect()
}

impl Entry {
    fn send(self, index: &mut Index, event: Event) {
        fn change<E>(entry: E, event: Event) -> Change<E> {
            match event {
                Event::Listed => Change::InitApply(None, entry),
                Event::Applied => Change::Apply(entry),
            }
        }
        index.update(match self {
            Entry::Claim(e) => Update::Claim(change(e, event)),
            Entry::Job(e) => Update::Job(change(e, event)),
            Entry::Run(e) => Update::Run(change(e, event)),
            Entry::TaskRun(e) => Update::TaskRun(change(e, event)),
            Entry::Pod(e) => Update::Pod(change(e, event)),
            Entry::Namespace(e) => Update::Namespace(change(e, event)),
        });
    }

    fn delete(&self, index: &mut Index) {
        let key = self.id().1;
        index.update(match self {
            Entry::Claim(_) => Update::Claim(Change::Delete(key)),
            Entry::Job(_) => Update::Job(Change::Delete(key)),
            Entry::Run(_) => Update::Run(Change::Delete(key)),
            Entry::TaskRun(_) => Update::TaskRun(Change::Delete(key)),
            Entry::Pod(_) => Update::Pod(Change::Delete(key)),
            Entry::Namespace(_) => Update::Namespace(Change::Delete(key)),
        });
    }

    /// The kind (as an ordinal) and key.
    fn id(&self) -> (usize, ObjectKey) {
        match self {
            Entry::Claim(e) => (0, e.key.clone()),
            Entry::Job(e) => (1, e.key.clone()),
            Entry::Run(e) => (2, e.key.clone()),
            Entry::TaskRun(e) => (3, e.0.key.clone()),
            Entry::Pod(e) => (4, e.key.clone()),
            Entry::Namespace(e) => (5, e.key.clone()),
        }
    }
}

/// What the daemon decides for each claim of `index`, by `namespace/name`.
pub fn daemon_decisions(
    index: &Index,
    policies: &Policies,
    now: DateTime<Utc>,
) -> HashMap<ObjectKey, Decision> {
    index
        .claims()
        .map(|claim| {
            let facts = linking::facts(claim, index);
            let annotations = index.namespace_annotations(&claim.key.namespace);
            let effective = policies.for_namespace(annotations);
            // The detail names the namespace's annotations not understood, as the audit does.
            let decision = policy::decide(&facts, &effective.policy, now);
            (claim.key.clone(), effective.explain(decision))
        })
        .collect()
}

/// A claim's `namespace/name` key.
pub fn key_of(object: &Value) -> ObjectKey {
    let meta = &object["metadata"];
    ObjectKey::new(
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default(),
    )
}

// The properties, shared by the in-memory and the real-server tests.

/// What the generated run saw besides failures, for the summary line: how often the daemon
/// keeps a claim the oracle would allow it to delete (by `expires` or `max_age` only), and how
/// often it wakes up earlier than needed.
#[derive(Debug, Default)]
pub struct Seen {
    pub claims: usize,
    pub deleted: usize,
    pub must: usize,
    pub may_but_kept: usize,
    /// Keep verdicts by count-based retention (`newest-failed`).
    pub kept_by_count: usize,
    /// Keep verdicts of labelled claims without provenance (`not-a-build-workspace`).
    pub kept_unproven: usize,
    /// Keep verdicts whose recheck comes before the claim is due, by reason.
    pub early_recheck: std::collections::BTreeMap<Reason, usize>,
}

/// Checks every claim of one world; `Err` describes the first disagreement.
pub fn check(
    world: &World,
    policy: &Policy,
    now: DateTime<Utc>,
    seen: &mut Seen,
) -> Result<(), String> {
    let index = daemon_index(world);
    let policies = policies(world, policy);
    let decisions = daemon_decisions(&index, &policies, now);
    // The audit is the same decisions, row by row.
    for row in audit::rows(&index, &policies, now) {
        let key = ObjectKey::new(&row.namespace, &row.name);
        if decisions.get(&key) != Some(&row.decision) {
            return Err(format!("audit row {key} differs: {row:?}"));
        }
    }
    for claim in &world.claims {
        let key = key_of(claim);
        let decision = &decisions[&key];
        let judged = oracle::judge(world, claim, policy, now);
        let problem = verdict_problem(world, claim, policy, now, decision, judged, seen);
        if let Some(problem) = problem {
            let objects = serde_json::to_string_pretty(&json!({
                "claim": claim, "jobs": world.jobs, "pipelineRuns": world.runs,
                "taskRuns": world.task_runs, "pods": world.pods,
            }))
            .unwrap_or_default();
            return Err(format!(
                "{problem}\nclaim {key}\ndaemon: {decision:?}\noracle: {judged:?}\nnow: {now}\n{objects}"
            ));
        }
    }
    Ok(())
}

pub fn verdict_problem(
    world: &World,
    claim: &Value,
    policy: &Policy,
    now: DateTime<Utc>,
    decision: &Decision,
    judged: oracle::Judgement,
    seen: &mut Seen,
) -> Option<&'static str> {
    seen.claims += 1;
    seen.must += usize::from(judged.must_delete);
    match decision.verdict {
        Verdict::Delete { reason, .. } => {
            seen.deleted += 1;
            if !judged.may_delete {
                return Some("SAFETY: the daemon deletes a claim the rule keeps");
            }
            let holds = match reason {
                Reason::Expired => judged.expired,
                Reason::MaxAgeExceeded => judged.too_old,
                _ => judged.must_delete,
            };
            if !holds {
                return Some("the delete's reason names a condition that does not hold");
            }
        }
        Verdict::Keep { .. } | Verdict::Protected { .. } if judged.must_delete => {
            return Some("LIVENESS: the daemon keeps a claim the rule says is due");
        }
        Verdict::Keep { reason, recheck_at } => {
            seen.may_but_kept += usize::from(judged.may_delete);
            seen.kept_by_count += usize::from(reason == Reason::NewestFailed);
            seen.kept_unproven += usize::from(reason == Reason::NotABuildWorkspace);
            if let Some(due) = oracle::due_at(world, claim, policy, now) {
                match recheck_at {
                    None => return Some("TIMELINESS: no recheck, but the claim becomes due"),
                    Some(at) if at > due => {
                        return Some("TIMELINESS: the recheck comes after the claim is due");
                    }
                    Some(at) if at < due => *seen.early_recheck.entry(reason).or_default() += 1,
                    Some(_) => {}
                }
            }
        }
        Verdict::Protected { .. } => {
            seen.may_but_kept += usize::from(judged.may_delete);
        }
    }
    None
}
