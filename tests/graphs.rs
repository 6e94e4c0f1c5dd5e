//! Safety and liveness over generated object graphs: raw objects go through the daemon's own
//! conversion, index, linking and policy, and every claim's verdict is held against the oracle
//! (testkit/src/oracle.rs), which encodes the safety rule apart from the implementation.
//!
//! - SAFETY: the daemon deletes only what the oracle allows.
//! - LIVENESS: it deletes what the oracle requires (owners or their absence say it is due).
//! - A delete's reason names a condition that holds; a kept claim's `recheck_at` comes no
//!   later than the first instant the oracle allows deletion, so the daemon wakes up in time.
//!
//! No server and no Tekton here: every run status is generated or written JSON, in memory,
//! garbage and states real Tekton never writes included (tests/tekton.rs runs the real one).

use std::cell::RefCell;
use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prop_assert_eq;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use testkit::graph::{self, Profile, Seen, check, verdict_problem};
use testkit::oracle::{self, World};
use workspace_gc::decide::policy::{Decision, Policy, Reason, Verdict};
use workspace_gc::decide::provenance::ProvenanceRule;

/// How many graphs the normal test run checks (each has up to two namespaces of ~15 objects).
const CASES: u32 = 4000;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap()
}

fn namespaces() -> Vec<String> {
    vec!["ns-a".to_owned(), "ns-b".to_owned()]
}

#[test]
fn the_daemon_agrees_with_the_oracle_on_generated_graphs() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        // Shrunk counter-examples are kept as the regression tests below instead.
        failure_persistence: None,
        ..Config::default()
    });
    let seen = RefCell::new(Seen::default());
    let started = std::time::Instant::now();
    let result = runner.run(&graph::graph(Profile::Memory), |graph| {
        let world = graph.render(&namespaces(), now(), &graph::memory_uid);
        let policy = graph.memory_policy();
        check(&world, &policy, now(), &mut seen.borrow_mut()).map_err(TestCaseError::fail)
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let seen = seen.into_inner();
    eprintln!("{CASES} graphs in {:?}: {seen:?}", started.elapsed());
    // The generators must reach both sides of the rule, or the run proves little.
    assert!(seen.claims > CASES as usize, "{seen:?}");
    assert!(seen.deleted > seen.claims / 20, "{seen:?}");
    assert!(seen.must > seen.claims / 20, "{seen:?}");
    assert!(seen.deleted < seen.claims * 3 / 4, "{seen:?}");
    assert!(seen.kept_by_count > 10, "{seen:?}");
    assert!(seen.kept_unproven > seen.claims / 10, "{seen:?}");
}

/// The watch path: the same graph reached through watch events from an earlier graph (updates
/// of the same names, deletions, creations) must be decided as when listed at once.
#[test]
fn watch_events_lead_to_the_same_decisions_as_a_list() {
    let mut runner = TestRunner::new(Config {
        cases: CASES / 4,
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let pair = (graph::graph(Profile::Memory), graph::graph(Profile::Memory));
    let result = runner.run(&pair, |(before, after)| {
        let policy = after.memory_policy();
        let before = before.render(&namespaces(), now(), &graph::memory_uid);
        let after = after.render(&namespaces(), now(), &graph::memory_uid);
        let policies = graph::policies(&after, &policy);
        let listed = graph::daemon_decisions(&graph::daemon_index(&after), &policies, now());
        let index = graph::daemon_index_after_events(&before, &after);
        let watched = graph::daemon_decisions(&index, &policies, now());
        prop_assert_eq!(watched, listed);
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    eprintln!("{} graph pairs in {:?}", CASES / 4, started.elapsed());
}

// The oracle itself, by hand, both ways: a rule that always says "keep" would make the safety
// property pass vacuously, one that always says "delete" the liveness property.

const NS: &str = "ml";

fn at(secs_ago: i64) -> String {
    graph::rfc3339(now() - Duration::seconds(secs_ago))
}

/// The claim every hand-made world checks: of the operator's name shape.
const C: &str = "c-build-workspace";

/// A claim as the operator makes it (its labels, set by the write that made it), with `meta`'s
/// fields set over its metadata.
fn claim(name: &str, age: i64, meta: Value) -> Value {
    let mut object = json!({"metadata": {
        "name": name, "namespace": NS, "creationTimestamp": at(age),
        "labels": graph::operator_labels(),
        "managedFields": [graph::made_labelled("manager")],
    }});
    for (key, value) in meta.as_object().into_iter().flatten() {
        object["metadata"][key] = value.clone();
    }
    object
}

fn job(name: &str, status: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")}, "status": status})
}

fn run(name: &str, binds: &[&str], status: Value) -> Value {
    let workspaces: Vec<Value> = (binds.iter())
        .map(|c| json!({"name": "w", "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    json!({"metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
           "spec": {"workspaces": workspaces}, "status": status})
}

fn done(secs_ago: i64) -> Value {
    json!({"conditions": [{"type": "Succeeded", "status": "True"}], "completionTime": at(secs_ago)})
}

fn running() -> Value {
    json!({"conditions": [{"type": "Succeeded", "status": "Unknown"}]})
}

fn reference(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}])
}

/// `(may, must)` for the world's first claim under the default policy.
fn judge(world: &World) -> (bool, bool) {
    let j = oracle::judge(world, &world.claims[0], &Policy::default(), now());
    (j.may_delete, j.must_delete)
}

#[test]
fn the_oracle_deletes_orphans_after_the_grace_only() {
    let old = World {
        claims: vec![claim(C, 601, json!({}))],
        ..World::default()
    };
    assert_eq!(judge(&old), (true, true));
    let young = World {
        claims: vec![claim(C, 599, json!({}))],
        ..World::default()
    };
    assert_eq!(judge(&young), (false, false));
}

#[test]
fn the_oracle_reads_namespace_settings_within_their_bounds() {
    let world = |annotations: Value| World {
        claims: vec![claim(C, 7200, json!({}))],
        runs: vec![run("r", &[C], done(3601))],
        namespaces: vec![json!({"metadata": {"name": NS, "annotations": annotations}})],
        namespace_bounds: Some(graph::MEMORY_BOUNDS),
        ..World::default()
    };
    let ttl = "workspace-gc.mlops.dev/ttl-after-finished";
    assert_eq!(judge(&world(json!({}))), (true, true), "the cluster's 1h");
    assert_eq!(judge(&world(json!({ttl: "2h"}))), (false, false), "longer");
    let failed = json!({"conditions": [{"type": "Succeeded", "status": "False"}],
                        "completionTime": at(3601)});
    let mut failed_world = world(json!({"workspace-gc.mlops.dev/ttl-after-failed": "2h"}));
    failed_world.runs = vec![run("r", &[C], failed)];
    assert_eq!(
        judge(&failed_world),
        (false, false),
        "a failed build, longer"
    );
    // A setting not understood keeps every claim, however due.
    for invalid in ["soon", "P7D", "0s", "10m", "300000000y"] {
        assert_eq!(
            judge(&world(json!({ttl: invalid}))),
            (false, false),
            "{invalid}"
        );
    }
    let collect = "workspace-gc.mlops.dev/collect";
    assert_eq!(judge(&world(json!({collect: "false"}))), (false, false));
    assert_eq!(judge(&world(json!({collect: "true"}))), (true, true));
    for invalid in [" false ", "False", "TRUE", "nope"] {
        assert_eq!(
            judge(&world(json!({collect: invalid}))),
            (false, false),
            "{invalid}"
        );
    }
    let misspelt = json!({"workspace-gc.mlops.dev/ttl-after-finish": "2h"});
    assert_eq!(judge(&world(misspelt)), (false, false), "a misspelt key");
    let foreign = json!({"example.com/collect": "False"});
    assert_eq!(judge(&world(foreign)), (true, true), "not under the prefix");
    let mut unseen = world(json!({}));
    unseen.namespaces.clear();
    assert_eq!(judge(&unseen), (false, false), "no Namespace object");
    // max-age under orphan-grace keeps every claim too.
    let orphan = |annotations: Value| World {
        claims: vec![claim(C, 1900, json!({}))],
        namespaces: vec![json!({"metadata": {"name": NS, "annotations": annotations}})],
        namespace_bounds: Some(graph::MEMORY_BOUNDS),
        ..World::default()
    };
    let (grace, max_age) = (
        "workspace-gc.mlops.dev/orphan-grace",
        "workspace-gc.mlops.dev/max-age",
    );
    assert_eq!(judge(&orphan(json!({grace: "1h"}))), (false, false));
    assert_eq!(
        judge(&orphan(json!({grace: "1h", max_age: "30m"}))),
        (false, false)
    );
    assert_eq!(judge(&orphan(json!({max_age: "30m"}))), (true, true));
}

#[test]
fn the_oracle_adds_up_every_link() {
    let mut world = World {
        claims: vec![claim(C, 7200, json!({}))],
        runs: vec![run("first", &[C], done(3601))],
        ..World::default()
    };
    assert_eq!(judge(&world), (true, true), "one finished run past its TTL");
    world.task_runs.push(run("rerun", &[C], running()));
    assert_eq!(
        judge(&world),
        (false, false),
        "a running TaskRun binds it too"
    );
    world.task_runs[0] = run("rerun", &[C], done(3599));
    assert_eq!(
        judge(&world),
        (false, false),
        "the TaskRun is within its TTL"
    );

    // A reference to one run does not hide the naming rule's job.
    let world = World {
        claims: vec![claim(
            "nb-build-workspace",
            7200,
            json!({"ownerReferences": reference("tekton.dev/v1", "PipelineRun", "r", "uid-r")}),
        )],
        runs: vec![run("r", &[], done(7000))],
        jobs: vec![job("nb", json!({"phase": "Running"}))],
        ..World::default()
    };
    assert_eq!(judge(&world), (false, false));
}

#[test]
fn the_oracle_keeps_claims_unfinished_jobs_name_and_the_server_reports_in_use() {
    let with_job = |phase: &str, pod_config: Value| World {
        claims: vec![claim(C, 7200, json!({}))],
        jobs: vec![{
            let mut b = job("b", json!({"phase": phase}));
            b["spec"] = json!({"podConfig": pod_config});
            b
        }],
        ..World::default()
    };
    let naming = |claim: &str| {
        json!({"volumes": [{"name": "cfg", "configMap": {"name": "x"}},
                           {"name": "d", "persistentVolumeClaim": {"claimName": claim}}]})
    };
    assert_eq!(judge(&with_job("Building", naming("other"))), (true, true));
    assert_eq!(judge(&with_job("Succeeded", naming(C))), (true, true));
    assert_eq!(judge(&with_job("Building", naming(C))), (false, false));
    for odd in [
        json!("x"),
        json!({"volumes": "c"}),
        json!({"volumes": ["c"]}),
        json!({"volumes": [{"persistentVolumeClaim": {"claimName": 7}}]}),
        json!({"volumes": [{"persistentVolumeClaim": "c"}]}),
    ] {
        assert_eq!(
            judge(&with_job("Building", odd.clone())),
            (false, false),
            "{odd}"
        );
        assert_eq!(
            judge(&with_job("Failed", odd.clone())),
            (true, true),
            "{odd}"
        );
    }
    for (status, may) in [("False", false), ("True", true), ("Unknown", true)] {
        let mut world = with_job("Succeeded", json!(null));
        world.claims[0]["status"] = json!({"conditions": [{"type": "Unused", "status": status}]});
        assert_eq!(judge(&world), (may, may), "Unused={status}");
    }
}

#[test]
fn the_oracle_keeps_the_newest_failed_builds_by_count() {
    let failed = |secs_ago: i64| json!({"conditions": [{"type": "Succeeded", "status": "False"}], "completionTime": at(secs_ago)});
    // Three failed builds, two hours and more ago, each past its TTL; one succeeded later.
    let world = World {
        claims: ["a", "b", "c", "d"]
            .map(|c| claim(&format!("{c}-build-workspace"), 86_400, json!({})))
            .to_vec(),
        runs: vec![
            run("a-build", &[], failed(7200)),
            run("b-build", &[], failed(9000)),
            run("c-build", &[], failed(10_800)),
            run("d-build", &[], done(3700)),
        ],
        // A failed job does not count among PipelineRuns.
        jobs: vec![job(
            "other",
            json!({"phase": "Failed", "completionTime": at(60)}),
        )],
        ..World::default()
    };
    let judged = |keep_failed: u32, world: &World| -> Vec<bool> {
        let policy = Policy {
            keep_failed,
            ..Policy::default()
        };
        (world.claims.iter())
            .map(|claim| oracle::judge(world, claim, &policy, now()).must_delete)
            .collect()
    };
    assert_eq!(judged(0, &world), [true, true, true, true]);
    assert_eq!(judged(1, &world), [false, true, true, true]);
    assert_eq!(judged(2, &world), [false, false, true, true]);
    // A failure without a completion time cannot be ranked: its claim is kept, and it pushes
    // no other out.
    let mut unranked = world.clone();
    unranked.runs[2]["status"] = json!({"conditions": [{"type": "Succeeded", "status": "False"}]});
    assert_eq!(judged(1, &unranked), [false, true, false, true]);
    // Deleting a claim changes no rank: the runs are what is counted.
    let mut fewer = world.clone();
    fewer.claims.remove(0);
    assert_eq!(judged(1, &fewer), [true, true, true]);
    // max_age still applies.
    let policy = Policy {
        keep_failed: 3,
        max_age: Duration::hours(1),
        ..Policy::default()
    };
    assert!(oracle::judge(&world, &world.claims[0], &policy, now()).may_delete);
}

#[test]
fn the_oracle_needs_a_real_completion_time() {
    for status in [
        json!({"phase": "Failed"}),
        json!({"phase": "Failed", "completionTime": "0001-01-01T00:00:00Z"}),
        json!({"phase": "Failed", "completionTime": "soon"}),
        json!({"phase": "Failed", "completionTime": 12}),
        json!({"phase": "Failed", "completionTime": at(-60)}),
        json!({"phase": "Building", "completionTime": at(7200)}),
    ] {
        let world = World {
            claims: vec![claim("nb-build-workspace", 7200, json!({}))],
            jobs: vec![job("nb", status.clone())],
            ..World::default()
        };
        assert_eq!(judge(&world), (false, false), "{status}");
    }
    let world = World {
        claims: vec![claim("nb-build-workspace", 7200, json!({}))],
        jobs: vec![job(
            "nb",
            json!({"phase": "Failed", "completionTime": at(3600)}),
        )],
        ..World::default()
    };
    assert_eq!(judge(&world), (true, true), "exactly at the TTL");
}

#[test]
fn the_oracle_reads_references_by_uid_and_kind() {
    let owned = |reference: Value| World {
        claims: vec![claim(C, 60, json!({"ownerReferences": reference}))],
        jobs: vec![job("nb", json!({"phase": "Running"}))],
        ..World::default()
    };
    let stale = reference("mlops.mlops.dev/v1alpha1", JOB, "nb", "uid-old");
    assert_eq!(
        judge(&owned(stale)),
        (true, true),
        "a re-created job is gone"
    );
    let live = reference("mlops.mlops.dev/v1", JOB, "nb", "uid-nb");
    assert_eq!(judge(&owned(live)), (false, false), "any version names it");
    for (api_version, kind) in [
        ("apps/v1", "Deployment"),
        ("example.com/v1", JOB),
        ("tekton.dev", "PipelineRun"),
    ] {
        let foreign = reference(api_version, kind, "nb", "uid-nb");
        assert_eq!(
            judge(&owned(foreign)),
            (false, false),
            "{api_version} {kind}"
        );
    }
}

const JOB: &str = "NotebookValidationJob";

/// An orphan long past its grace is deleted only with provenance: the label added later by
/// another manager (an update, an apply of an existing claim whole or of its labels), merged
/// into `ancient-changes`, a foreign name, the operator's labels missing, or no managedFields
/// keep it; so does the daemon. Its own job as owner, or a widened policy, make it a candidate.
#[test]
fn the_oracle_deletes_only_claims_with_provenance() {
    let label = json!({"f:mlops.redhat.com/build-workspace": {}});
    let later = json!({"manager": "kubectl-label", "operation": "Update",
                       "fieldsV1": {"f:metadata": {"f:labels": label}}});
    let create = json!({"manager": "kubectl-create", "operation": "Update",
                        "fieldsV1": {"f:spec": {"f:accessModes": {}}}});
    let spec = json!({"f:accessModes": {}});
    let apply = |whole: bool| {
        let fields = match whole {
            true => json!({"f:metadata": {"f:labels": label}, "f:spec": spec}),
            false => json!({"f:metadata": {"f:labels": label}}),
        };
        json!({"manager": "argocd", "operation": "Apply", "fieldsV1": fields})
    };
    let merged = json!({"manager": "ancient-changes", "operation": "Update",
                        "fieldsV1": {"f:metadata": {"f:labels": label}, "f:spec": spec}});
    let world = |name: &str, meta: Value| World {
        claims: vec![claim(name, 7200, meta)],
        ..World::default()
    };
    let cases = [
        (world(C, json!({})), true, "the operator's"),
        (
            world(C, json!({"managedFields": [create.clone(), later.clone()]})),
            false,
            "labelled later",
        ),
        (
            world(C, json!({"managedFields": [create]})),
            false,
            "no owner of the label",
        ),
        (world("data", json!({})), false, "a foreign name"),
        (
            world("-build-workspace", json!({})),
            false,
            "no job in the name",
        ),
        (
            world(
                C,
                json!({"labels": {"mlops.redhat.com/build-workspace": "true"}}),
            ),
            false,
            "the label alone",
        ),
        (world(C, json!({"managedFields": []})), false, "no record"),
        (
            world(
                C,
                json!({"managedFields": [], "labels": {},
                       "ownerReferences": reference("mlops.mlops.dev/v1alpha1", JOB, "c", "gone")}),
            ),
            true,
            "owned by its own (gone) job",
        ),
        (
            world(
                C,
                json!({"managedFields": [],
                       "ownerReferences": reference("mlops.mlops.dev/v1alpha1", JOB, "nb", "gone")}),
            ),
            false,
            "owned by another job",
        ),
        (
            world(C, json!({"managedFields": [apply(true)]})),
            true,
            "made by server-side apply alone",
        ),
        (
            world(C, json!({"managedFields": [create.clone(), apply(true)]})),
            false,
            "an existing claim applied whole (issue 55, case 1)",
        ),
        (
            world(C, json!({"managedFields": [create.clone(), apply(false)]})),
            false,
            "its labels applied alone",
        ),
        (
            world(C, json!({"managedFields": [merged]})),
            false,
            "the label's owner merged into ancient-changes (issue 55, case 2)",
        ),
    ];
    for (world, may, what) in &cases {
        assert_eq!(judge(world), (*may, *may), "{what}");
        let checked = check(world, &Policy::default(), now(), &mut Seen::default());
        assert_eq!(checked, Ok(()), "{what}");
    }
    let wider = Policy {
        provenance: Arc::new(ProvenanceRule {
            claim_suffixes: vec!["-build-workspace".into(), "a".into()],
            label_managers: vec!["kubectl-label".into()],
            trust_unrecorded: true,
        }),
        ..Policy::default()
    };
    for (index, may) in [(1, true), (3, true), (6, true), (5, false)] {
        let (world, _, what) = &cases[index];
        let judged = oracle::judge(world, &world.claims[0], &wider, now());
        assert_eq!(judged.may_delete, may, "widened: {what}");
        assert_eq!(
            check(world, &wider, now(), &mut Seen::default()),
            Ok(()),
            "{what}"
        );
    }
}

#[test]
fn the_oracle_keeps_used_kept_and_terminating_claims() {
    let pod = |phase: Option<&str>, ns: &str| {
        json!({"metadata": {"name": "p", "namespace": ns},
               "spec": {"volumes": [{"persistentVolumeClaim": {"claimName": C}}]},
               "status": {"phase": phase}})
    };
    let with_pod = |pod: Value| World {
        claims: vec![claim(C, 7200, json!({}))],
        pods: vec![pod],
        ..World::default()
    };
    for phase in [None, Some("Running"), Some("Pending"), Some("succeeded")] {
        assert_eq!(
            judge(&with_pod(pod(phase, NS))),
            (false, false),
            "{phase:?}"
        );
    }
    for phase in [Some("Succeeded"), Some("Failed")] {
        assert_eq!(judge(&with_pod(pod(phase, NS))), (true, true), "{phase:?}");
    }
    assert_eq!(judge(&with_pod(pod(None, "elsewhere"))), (true, true));

    let annotated = |key: &str, value: &str| World {
        claims: vec![claim(
            C,
            7200,
            json!({"annotations": {format!("workspace-gc.mlops.dev/{key}"): value}}),
        )],
        ..World::default()
    };
    for (key, value) in [
        ("keep", "true"),
        ("keep", "True"),
        ("kep", "false"),
        ("ttl", "soon"),
        ("ttl", "300000000y"),
        ("expires", "tomorrow"),
    ] {
        assert_eq!(
            judge(&annotated(key, value)),
            (false, false),
            "{key}={value}"
        );
    }
    for (key, value) in [
        ("keep", "false"),
        ("ttl", " 1h "),
        ("expires", " 2020-01-01T00:00:00Z "),
    ] {
        assert_eq!(judge(&annotated(key, value)), (true, true), "{key}={value}");
    }
    let terminating = World {
        claims: vec![claim(C, 7200, json!({"deletionTimestamp": at(1)}))],
        ..World::default()
    };
    assert_eq!(judge(&terminating), (false, false));
}

#[test]
fn the_oracle_lets_expires_and_max_age_override_running_owners() {
    let world = |age: i64, annotations: Value| World {
        claims: vec![claim(C, age, json!({"annotations": annotations}))],
        runs: vec![run("r", &[C], running())],
        ..World::default()
    };
    let expires = json!({"workspace-gc.mlops.dev/expires": at(1)});
    assert_eq!(judge(&world(60, expires)), (true, false));
    assert_eq!(judge(&world(7 * 86_400, json!({}))), (true, false));
    assert_eq!(judge(&world(7 * 86_400 - 1, json!({}))), (false, false));
    // The ttl annotation replaces the policy's, both ways.
    let ttl = |ttl: &str, done_ago: i64| World {
        claims: vec![claim(
            C,
            7200,
            json!({"annotations": {"workspace-gc.mlops.dev/ttl": ttl}}),
        )],
        runs: vec![run("r", &[C], done(done_ago))],
        ..World::default()
    };
    assert_eq!(judge(&ttl("2h", 3601)), (false, false));
    assert_eq!(judge(&ttl("10m", 601)), (true, true));
    assert_eq!(judge(&ttl("200000000y", 7000)), (false, false), "overflows");
}

#[test]
fn the_oracle_finds_the_first_instant_a_claim_is_due() {
    let world = World {
        claims: vec![claim(C, 100, json!({}))],
        runs: vec![run("r", &[C], done(60))],
        ..World::default()
    };
    let due = oracle::due_at(&world, &world.claims[0], &Policy::default(), now());
    assert_eq!(due, Some(now() + Duration::seconds(3600 - 60)));
    let running = World {
        runs: vec![run("r", &[C], running())],
        ..world
    };
    let due = oracle::due_at(&running, &running.claims[0], &Policy::default(), now());
    assert_eq!(
        due,
        Some(now() + Duration::seconds(7 * 86_400 - 100)),
        "max_age"
    );
}

/// The property check itself must fail on a daemon verdict the oracle forbids: fed a world
/// where the oracle keeps a claim, a forged `Delete` is reported as a safety violation.
#[test]
fn the_property_check_reports_a_forbidden_delete() {
    let world = World {
        claims: vec![claim(C, 60, json!({}))],
        ..World::default()
    };
    let judged = oracle::judge(&world, &world.claims[0], &Policy::default(), now());
    let forged = Decision {
        verdict: Verdict::Delete {
            reason: Reason::Orphaned,
            due_at: None,
        },
        detail: None,
    };
    let problem = verdict_problem(
        &world,
        &world.claims[0],
        &Policy::default(),
        now(),
        &forged,
        judged,
        &mut Seen::default(),
    );
    assert_eq!(
        problem,
        Some("SAFETY: the daemon deletes a claim the rule keeps")
    );
    let mut seen = Seen::default();
    assert_eq!(check(&world, &Policy::default(), now(), &mut seen), Ok(()));
    assert_eq!(seen.claims, 1);
}

// Counter-examples the generated graphs shrank to against the implementation before the
// issue-11 fixes (commit 19dfef3), kept as regression cases. Each fails there, as noted.

/// Checks the world's first claim: the oracle still says what it said when the case was found,
/// and the daemon agrees with it (safety, liveness, reason, recheck).
fn regression(world: World, may_delete: bool) {
    let judged = oracle::judge(&world, &world.claims[0], &Policy::default(), now());
    assert_eq!(
        judged.may_delete, may_delete,
        "the case still means what it did"
    );
    if let Err(problem) = check(&world, &Policy::default(), now(), &mut Seen::default()) {
        panic!("{problem}");
    }
}

fn references(refs: &[(&str, &str, &str, &str)]) -> Value {
    (refs.iter())
        .map(|(api_version, kind, name, uid)| {
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid})
        })
        .collect()
}

/// Was: a stale reference (job `nb` re-created) made the claim `owner-gone` although the other
/// referenced job, finished without a completion time, must keep it.
#[test]
fn regression_a_gone_owner_hides_no_other_owner() {
    let refs = references(&[
        ("mlops.mlops.dev/v1alpha1", JOB, "nb", "stale-uid-0"),
        ("mlops.mlops.dev/v1alpha1", JOB, "other", "uid-other"),
    ]);
    regression(
        World {
            claims: vec![claim(C, -60, json!({"ownerReferences": refs}))],
            jobs: vec![job("other", json!({"phase": "Succeeded"}))],
            ..World::default()
        },
        false,
    );
}

/// Was: the reference to the finished run stopped the binding rule, so the running re-run that
/// binds the claim was never linked and the TTL deleted it.
#[test]
fn regression_a_reference_hides_no_binding_run() {
    let refs = references(&[("tekton.dev/v1", "PipelineRun", "r", "uid-r")]);
    regression(
        World {
            claims: vec![claim(C, 7200, json!({"ownerReferences": refs}))],
            runs: vec![run("r", &[], done(7000)), run("rerun", &[C], running())],
            ..World::default()
        },
        false,
    );
}

/// Was: the job failed through a phase-only update (no completion time, or Go's zero time),
/// and the TTL ran from the PipelineRun's completion alone.
#[test]
fn regression_a_finished_owner_without_a_completion_time_keeps_the_claim() {
    for status in [
        json!({"phase": "Failed"}),
        json!({"phase": "Succeeded", "completionTime": "0001-01-01T00:00:00Z"}),
    ] {
        regression(
            World {
                claims: vec![claim("nb-build-workspace", 7200, json!({}))],
                jobs: vec![job("nb", status)],
                runs: vec![run("nb-build", &[], done(7000))],
                ..World::default()
            },
            false,
        );
    }
}

/// Was: a running TaskRun binding the claim was not an owner, so the claim was an orphan.
#[test]
fn regression_a_running_task_run_keeps_the_claim() {
    regression(
        World {
            claims: vec![claim(C, 7200, json!({}))],
            task_runs: vec![run("t", &[C], running())],
            ..World::default()
        },
        false,
    );
}

/// Was: a TaskRun owner reference was foreign, so a finished TaskRun's claim was never due.
#[test]
fn regression_a_finished_task_run_owner_lets_the_ttl_run() {
    let refs = references(&[("tekton.dev/v1", "TaskRun", "t", "uid-t")]);
    regression(
        World {
            claims: vec![claim(C, 7200, json!({"ownerReferences": refs}))],
            task_runs: vec![run("t", &[], done(3601))],
            ..World::default()
        },
        true,
    );
}

/// Released volumes over generated PersistentVolumes, through the daemon's own conversion
/// (`resources::volume_facts`) and judgement (`decide::volumes::judge`): deleted exactly when
/// the oracle allows it, whatever the reclaim policy, phase, claimRef, mark, transition time
/// (missing, garbage, past or future) and deletion state.
#[test]
fn released_volumes_are_deleted_exactly_when_the_oracle_allows() {
    use proptest::prelude::*;
    use proptest::sample::select;
    use workspace_gc::cluster::resources::volume_facts;
    use workspace_gc::decide::volumes::{VolumeVerdict, judge};

    let ttl = Duration::hours(1);
    // Weighted towards the one combination that deletes, so that both sides are reached.
    let text = |values: &'static [&'static str]| {
        prop_oneof![
            6 => select(values).prop_map(|v| json!(v)),
            1 => Just(Value::Null),
            1 => Just(json!(7)),
        ]
    };
    let transition = prop_oneof![
        4 => (-7200i64..14400).prop_map(|ago| json!((now() - Duration::seconds(ago)).to_rfc3339())),
        1 => Just(Value::Null),
        1 => Just(json!("yesterday")),
        1 => Just(json!(1_700_000_000)),
    ];
    let volumes = (
        text(&["Retain", "Retain", "Retain", "Delete", "Recycle", "retain"]),
        text(&["Released", "Released", "Released", "Bound", "Available", "Failed", "released"]),
        text(&["claim-1", "claim-1", "claim-2", ""]),
        // Annotations are strings (metadata is typed); absent is the other case.
        prop_oneof![
            4 => select(&["claim-1", "claim-1", "claim-2", ""][..]).prop_map(|v| json!(v)),
            1 => Just(Value::Null),
        ],
        transition,
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(policy, phase, claim, mark, since, deleting)| {
            let mut annotations = serde_json::Map::new();
            if !mark.is_null() {
                annotations.insert("workspace-gc.mlops.dev/deleted-claim-uid".into(), mark);
            }
            json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {
                    "name": "pv", "uid": "pv-uid", "resourceVersion": "3",
                    "annotations": annotations,
                    "deletionTimestamp": if deleting { json!("2026-06-01T11:00:00Z") } else { Value::Null },
                },
                "spec": {"persistentVolumeReclaimPolicy": policy, "claimRef": {"uid": claim}},
                "status": {"phase": phase, "lastPhaseTransitionTime": since},
            })
        });
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        ..Config::default()
    });
    let (deleted, kept) = (RefCell::new(0), RefCell::new(0));
    runner
        .run(&volumes, |volume| {
            // Only metadata is typed: spec and status are read untyped, as the daemon does.
            let object: kube::api::DynamicObject = serde_json::from_value(volume.clone())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let daemon = judge(&volume_facts(&object), ttl, now()) == VolumeVerdict::Delete;
            let allowed = oracle::volume_deletable(&volume, ttl, now());
            *if daemon { &deleted } else { &kept }.borrow_mut() += 1;
            prop_assert_eq!(daemon, allowed, "{}", volume);
            Ok(())
        })
        .unwrap();
    // The generator reaches both sides.
    assert!(*deleted.borrow() > 0 && *kept.borrow() > 0);
}
