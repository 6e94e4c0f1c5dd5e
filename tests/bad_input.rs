//! Bad input, through the real binary and the pure parsers: every configuration key malformed
//! in turn, malformed configuration files, missing or malformed kubeconfigs and an unreachable
//! API server, each with its documented exit code (2: configuration, 3: no cluster access) and
//! a message on stderr; then property tests that arbitrary annotations and arbitrary owner
//! statuses never panic and never turn into a deletion they do not justify.
//!
//! No control plane: every case here fails before or at the first connection.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use serde_json::{Value, json};
use workspace_gc::cluster::resources;
use workspace_gc::contract::annotations::{EXPIRES, KEEP, TTL};
use workspace_gc::decide::annotations;
use workspace_gc::decide::facts::Provenance;
use workspace_gc::decide::facts::{ClaimFacts, Facts, FailedRank, ObjectKey, Progress, Users};
use workspace_gc::decide::policy::{self, Policy, Reason, Verdict};
use workspace_gc::surface::commands::exit;

/// The subcommands that load the configuration, with the arguments they require.
const COMMANDS: &[&[&str]] = &[
    &["run"],
    &["audit"],
    &["create", "--namespace", "ml", "--job", "nb"],
    &["check-config"],
];

/// The subcommands that need the cluster.
const CLUSTER_COMMANDS: &[&[&str]] = &[
    &["run", "--listen", "127.0.0.1:0"],
    &["audit"],
    &["create", "--namespace", "ml", "--job", "nb"],
];

/// Every configuration key, with a value its environment variable cannot take.
const MALFORMED: &[(&str, &str)] = &[
    ("selector.label_selector", "a in (b"),
    ("selector.namespaces", "Not_OK"),
    ("selector.exclude_namespaces", "-x"),
    ("policy.ttl_after_finished", "an hour"),
    ("policy.orphan_grace", "0s"),
    ("policy.max_age", "1000y"),
    ("deletion.dry_run", "yes"),
    ("deletion.server_side_dry_run", "maybe"),
    ("deletion.deletes_per_second", "fast"),
    ("deletion.max_deletions_per_window", "-1"),
    ("deletion.window", "0ms"),
    ("leader_election.enabled", "on"),
    ("leader_election.lease_name", "Lease_1"),
    ("leader_election.lease_namespace", "a.b"),
    ("leader_election.lease_duration", "1500ms"),
    ("http.listen", "localhost:8080"),
    ("logging.format", "text"),
    ("logging.level", "workspace_gc=loud"),
    ("creator.storage", "1GB"),
    ("creator.storage_class", "Fast SSD"),
    ("creator.labels", "team"),
    ("creator.annotations", "bad key=x"),
];

fn env_name(key: &str) -> String {
    format!("WORKSPACE_GC_{}", key.replace('.', "_").to_uppercase())
}

/// Runs the binary with a clean environment: no configuration variables, no kubeconfig unless
/// given, a HOME without `.kube`, and not in a cluster.
fn workspace_gc(args: &[&str], vars: &[(&str, &str)], kubeconfig: Option<&Path>) -> Output {
    let home = tempfile::tempdir().expect("an empty HOME");
    let mut command = Command::new(env!("CARGO_BIN_EXE_workspace-gc"));
    command
        .args(args)
        .env("HOME", home.path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("WORKSPACE_GC_") {
            command.env_remove(key);
        }
    }
    if let Some(path) = kubeconfig {
        command.env("KUBECONFIG", path);
    }
    for (key, value) in vars {
        command.env(key, value);
    }
    command.output().expect("run workspace-gc")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: exit {:?}, stderr:\n{}",
        output.status.code(),
        stderr(output)
    );
}

/// Runs `run` with `key` set to `value` through its variable, with no cluster access at all
/// (the configuration is checked first), and checks it exits 2 with one line naming both.
fn assert_refused_from_the_environment(key: &str, value: &str) {
    let var = env_name(key);
    let output = workspace_gc(&["run"], &[(&var, value)], None);
    assert_exit(&output, exit::CONFIG, &format!("{var}={value}"));
    let message = stderr(&output);
    assert!(
        message.starts_with(&format!("error: ${var}: {key}: ")),
        "{var}={value}: {message}"
    );
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(output.stdout.is_empty());
}

#[test]
fn every_malformed_key_exits_2_naming_variable_and_key() {
    for (key, value) in MALFORMED {
        assert_refused_from_the_environment(key, value);
    }
}

#[test]
fn every_subcommand_checks_the_configuration_first() {
    for args in COMMANDS {
        for (key, value) in [
            ("policy.max_age", "soon"),
            ("http.listen", "nope"),
            ("creator.storage", "lots"),
        ] {
            let var = env_name(key);
            let output = workspace_gc(args, &[(&var, value)], None);
            assert_exit(&output, exit::CONFIG, &format!("{args:?} {var}={value}"));
            assert!(stderr(&output).contains(key), "{}", stderr(&output));
        }
        let output = workspace_gc(args, &[("WORKSPACE_GC_POLICY_MAXAGE", "1d")], None);
        assert_exit(&output, exit::CONFIG, &format!("{args:?} unknown variable"));
        assert!(
            stderr(&output).contains("unknown environment variable"),
            "{}",
            stderr(&output)
        );
    }
}

/// Well-formed values that cannot be honoured as written: refused before anything runs, rather
/// than turned into their opposite (`1e-30` deletions a second once became no pacing at all).
#[test]
fn values_that_cannot_be_honoured_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().expect("a directory");
    for (key, value) in [
        ("deletion.deletes_per_second", "1e-30"),
        ("deletion.deletes_per_second", "3e-10"),
        ("deletion.deletes_per_second", "5e-324"),
        ("policy.max_age", "101y"),
        ("deletion.window", "200y"),
        ("leader_election.lease_duration", "1s"),
    ] {
        assert_refused_from_the_environment(key, value);
        let (section, name) = key.split_once('.').expect("section.key");
        let path = dir.path().join("config.toml");
        let quoted = if value.ends_with(char::is_alphabetic) {
            format!("\"{value}\"")
        } else {
            value.to_owned()
        };
        std::fs::write(&path, format!("[{section}]\n{name} = {quoted}\n")).expect("write");
        let flag = path.to_str().expect("a UTF-8 temp path");
        let output = workspace_gc(&["--config", flag, "run"], &[], None);
        assert_exit(&output, exit::CONFIG, &format!("{key} = {quoted}"));
        assert!(
            stderr(&output).contains(&format!("config.toml:2: {key}: ")),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn malformed_configuration_files_exit_2_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("a directory");
    let cases: &[(&str, &[u8], &str)] = &[
        (
            "broken.toml",
            b"[policy\nmax_age = \"1d\"\n",
            "broken.toml:1",
        ),
        (
            "unknown.toml",
            b"[policy]\nmaxage = \"1d\"\n",
            "policy.maxage",
        ),
        (
            "type.toml",
            b"[deletion]\ndry_run = \"yes\"\n",
            "deletion.dry_run",
        ),
        ("section.toml", b"[nonsense]\nkey = 1\n", "nonsense"),
        ("binary.toml", b"\xff\xfe\x00garbage", "binary.toml"),
    ];
    for (name, text, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write the file");
        for args in COMMANDS {
            let mut args: Vec<&str> = args.to_vec();
            let flag = path.to_str().expect("a UTF-8 temp path");
            args.splice(0..0, ["--config", flag]);
            let output = workspace_gc(&args, &[], None);
            assert_exit(&output, exit::CONFIG, &format!("{name} {args:?}"));
            let message = stderr(&output);
            assert!(message.starts_with("error: "), "{name}: {message}");
            assert!(message.contains(expected), "{name}: {message}");
        }
    }
    let missing = dir.path().join("missing.toml");
    let output = workspace_gc(
        &["--config", missing.to_str().expect("UTF-8"), "run"],
        &[],
        None,
    );
    assert_exit(&output, exit::CONFIG, "missing file");
    assert!(
        stderr(&output).contains("missing.toml"),
        "{}",
        stderr(&output)
    );
    let output = workspace_gc(
        &["--config", dir.path().to_str().expect("UTF-8"), "run"],
        &[],
        None,
    );
    assert_exit(&output, exit::CONFIG, "a directory as the file");
}

#[test]
fn malformed_command_lines_exit_2() {
    for args in [
        &["run", "--listen", "nope"][..],
        &["--log-format", "text", "run"],
        &["audit", "--output", "xml"],
        &["create", "--job", "nb"],
        &["frobnicate"],
        &[],
    ] {
        let output = workspace_gc(args, &[], None);
        assert_exit(&output, exit::CONFIG, &format!("{args:?}"));
        assert!(!stderr(&output).is_empty());
    }
}

/// A kubeconfig whose server is `server`, with a token (nothing checks it before connecting).
fn kubeconfig_for(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: c
    cluster:
      server: {server}
      insecure-skip-tls-verify: true
users:
  - name: u
    user:
      token: not-a-real-token
contexts:
  - name: x
    context:
      cluster: c
      user: u
current-context: x
"
    );
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

#[test]
fn missing_or_malformed_kubeconfig_exits_3() {
    let dir = tempfile::tempdir().expect("a directory");
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "{{{ this is not yaml").expect("write");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").expect("write");
    let no_context = dir.path().join("no-context");
    std::fs::write(
        &no_context,
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\ncurrent-context: gone\n",
    )
    .expect("write");
    let cases: [(&str, Option<&Path>); 5] = [
        ("no kubeconfig at all", None),
        (
            "a path that does not exist",
            Some(Path::new("/nonexistent/kubeconfig")),
        ),
        ("not YAML", Some(&garbage)),
        ("an empty file", Some(&empty)),
        ("a current context that does not exist", Some(&no_context)),
    ];
    for (what, kubeconfig) in cases {
        for args in CLUSTER_COMMANDS {
            let output = workspace_gc(args, &[], kubeconfig);
            assert_exit(&output, exit::CLUSTER, &format!("{what}, {args:?}"));
            assert!(
                stderr(&output).contains("no usable cluster access"),
                "{what}, {args:?}: {}",
                stderr(&output)
            );
        }
    }
}

#[test]
fn unreachable_api_server_at_start_exits_3() {
    let dir = tempfile::tempdir().expect("a directory");
    // A port that was free a moment ago: connections are refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a port");
    let kubeconfig = kubeconfig_for(dir.path(), &format!("https://127.0.0.1:{port}"));
    for args in CLUSTER_COMMANDS {
        let started = Instant::now();
        let output = workspace_gc(args, &[], Some(&kubeconfig));
        assert_exit(&output, exit::CLUSTER, &format!("{args:?}"));
        let message = stderr(&output);
        assert!(
            message.contains(&format!("127.0.0.1:{port}")) && message.contains("did not answer"),
            "{args:?}: {message}"
        );
        // A refused connection fails fast; only a silent one waits for the 15 s timeout.
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");
    }
    // And a configuration error still wins over the cluster error.
    let output = workspace_gc(
        &["run"],
        &[("WORKSPACE_GC_POLICY_MAX_AGE", "x")],
        Some(&kubeconfig),
    );
    assert_exit(&output, exit::CONFIG, "configuration before cluster");
}

#[test]
fn a_server_that_never_answers_times_out_at_start_with_exit_3() {
    let dir = tempfile::tempdir().expect("a directory");
    // Bound but never accepted: the kernel completes the TCP handshake, then nothing answers,
    // as with a server behind a black hole.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = silent.local_addr().expect("its address").port();
    let kubeconfig = kubeconfig_for(dir.path(), &format!("https://127.0.0.1:{port}"));
    let started = Instant::now();
    let output = workspace_gc(&["audit"], &[], Some(&kubeconfig));
    let took = started.elapsed();
    assert_exit(&output, exit::CLUSTER, "a silent server");
    assert!(
        stderr(&output).contains("did not answer within 15s"),
        "{}",
        stderr(&output)
    );
    assert!(
        (Duration::from_secs(14)..Duration::from_secs(30)).contains(&took),
        "gave up after {took:?}"
    );
    drop(silent);
}

// --- property tests ---------------------------------------------------------------------------

/// A claim that every deadline has passed for: created long ago, no owner, no user. Only its
/// annotations can keep it.
fn overdue(annotations: BTreeMap<String, String>) -> Facts {
    Facts {
        claim: ClaimFacts {
            key: ObjectKey::new("ml", "nb-build-workspace"),
            uid: "uid".into(),
            resource_version: "1".into(),
            created: DateTime::<Utc>::UNIX_EPOCH,
            annotations,
            owner_references: Vec::new(),
            deletion_timestamp: None,
            requested_bytes: None,
            storage_class: None,
            volume_name: None,
            reported_in_use: false,
            provenance: Provenance::operator("jupyter-notebook-validator-operator"),
        },
        owners: Vec::new(),
        failed_rank: FailedRank::NotFailed,
        users: Users::Known {
            pods: Vec::new(),
            jobs: Vec::new(),
        },
    }
}

/// Annotation values: arbitrary text, and near misses of valid ones.
fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "\\PC{0,300}",
        prop::sample::select(vec![
            "true",
            "false",
            "TRUE",
            "True",
            " true",
            "1",
            "yes",
            "2h",
            "-2h",
            "0s",
            "99999999999y",
            "１時間",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:00Z",
            "2026-01-01",
            "",
        ])
        .prop_map(String::from),
    ]
}

/// JSON trees shaped loosely like an owner's status, with the words that matter.
fn status_json() -> impl Strategy<Value = Value> {
    let word = prop::sample::select(vec![
        "Succeeded",
        "Failed",
        "True",
        "False",
        "Unknown",
        "Running",
        "Building",
        "2026-01-01T00:00:00Z",
        "yesterday",
        "",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        word.prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    let key = prop::sample::select(vec![
        "phase",
        "completionTime",
        "conditions",
        "type",
        "status",
        "reason",
        "other",
    ]);
    let tree = leaf.clone().prop_recursive(4, 32, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key.clone().prop_map(String::from), inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    });
    // Statuses shaped as the real ones, so that both directions of "finished" come up often:
    // a phase, and conditions of the types and statuses that matter (or odd values).
    let condition_word =
        prop::sample::select(vec!["Succeeded", "Ready", "True", "False", "Unknown", ""]);
    let odd = || prop_oneof![4 => condition_word.clone().prop_map(Value::from), 1 => leaf.clone()];
    let condition = (odd(), odd(), odd()).prop_map(
        |(type_, status, reason)| json!({"type": type_, "status": status, "reason": reason}),
    );
    let shaped = (
        prop::option::of(odd()),
        prop::collection::vec(condition, 0..3),
        any::<bool>(),
    )
        .prop_map(|(phase, conditions, completed)| {
            let mut status = json!({ "conditions": conditions });
            if let Some(phase) = phase {
                status["phase"] = phase;
            }
            if completed {
                status["completionTime"] = json!("2026-01-01T00:00:00Z");
            }
            status
        });
    prop_oneof![tree, shaped]
}

fn owner(kind: &str, api_version: &str, status: &Value) -> resources::OwnerObject {
    serde_json::from_value(json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "nb", "namespace": "ml", "uid": "u"},
        "spec": {"workspaces": status},
        "status": status,
    }))
    .expect("any JSON status makes an object")
}

proptest! {
    /// However the three workspace-gc annotations are spelled, an overdue claim is deleted
    /// only if they all parse and `keep` is not "true"; otherwise it is kept with the reason.
    #[test]
    fn annotations_delete_only_when_they_parse_and_do_not_keep(
        values in prop::collection::vec(
            (prop::sample::select(vec![KEEP, TTL, EXPIRES]),
             annotation_value()),
            0..4,
        ),
        other in "\\PC{0,200}",
    ) {
        let mut map: BTreeMap<String, String> = values
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        map.insert("example.com/other".into(), other);
        let parsed = annotations::parse(&map);
        let decision = policy::decide(&overdue(map.clone()), &Policy::default(), Utc::now());
        match (&parsed, &decision.verdict) {
            (Err(_), Verdict::Keep { reason: Reason::InvalidAnnotation, .. }) => {
                prop_assert!(decision.detail.is_some());
            }
            (Ok(a), Verdict::Protected { reason: Reason::KeepAnnotation }) => prop_assert!(a.keep),
            (Ok(a), Verdict::Delete { .. }) => prop_assert!(!a.keep),
            (parsed, verdict) => prop_assert!(false, "{map:?}: {parsed:?} gave {verdict:?}"),
        }
    }

    /// An owner's status of any shape converts without panicking. A job counts as finished
    /// exactly in phase `Succeeded` or `Failed`; a run (or task run) read as finished has a
    /// `Succeeded` condition that says `True` or `False` somewhere in its status, the direction
    /// that matters most: a running build read as finished loses its workspace. Which of several
    /// conditions decides is the table's to say (`run_statuses_read_as_documented`).
    ///
    /// Run statuses written by hand (in memory): generated statuses of any shape, garbage included,
    /// which real Tekton never writes.
    #[test]
    fn owner_statuses_of_any_shape_convert_and_finish_only_when_they_say_so(status in status_json()) {
        let job = resources::job_entry(&owner("NotebookValidationJob", "mlops.mlops.dev/v1alpha1", &status));
        let phase = status.get("phase").and_then(Value::as_str);
        prop_assert_eq!(
            matches!(job.progress, Progress::Finished { .. }),
            matches!(phase, Some("Succeeded" | "Failed")),
            "job {}", status
        );
        let says_finished = status
            .get("conditions")
            .and_then(Value::as_array)
            .is_some_and(|conditions| conditions.iter().any(|c| {
                c.get("type") == Some(&json!("Succeeded"))
                    && matches!(c.get("status").and_then(Value::as_str), Some("True" | "False"))
            }));
        let run = resources::run_entry(&owner("PipelineRun", "tekton.dev/v1", &status));
        let task_run = resources::task_run_entry(&owner("TaskRun", "tekton.dev/v1", &status));
        for (what, progress) in [("run", run.progress), ("task run", task_run.progress)] {
            if matches!(progress, Progress::Finished { .. }) {
                prop_assert!(says_finished, "{} read as finished: {}", what, status);
            }
        }
    }
}

/// How an owner's status must read, by the documented semantics (docs/policy.md: a job is
/// finished only in phase `Succeeded` or `Failed`; a PipelineRun or TaskRun only when its first
/// condition of type `Succeeded` is `True` or `False`, `False` meaning failed; a missing status,
/// an unknown phase or an odd field counts as running; a finished owner with no completion time,
/// or Go's zero time, records none; domain-facts.md: `Unknown` means running).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    Running,
    /// Finished, failed or not, with the completion time it records (RFC 3339), if any.
    Finished {
        failed: bool,
        at: Option<&'static str>,
    },
}

const DONE_AT: &str = "2026-01-01T00:00:00Z";

fn reads(progress: &Progress) -> Reads {
    match progress {
        Progress::Running => Reads::Running,
        Progress::Finished { at, failed } => Reads::Finished {
            failed: *failed,
            at: at.map(|at| {
                assert_eq!(
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    DONE_AT
                );
                DONE_AT
            }),
        },
    }
}

fn condition(type_: Value, status: Value) -> Value {
    json!({"type": type_, "status": status, "reason": "Whatever"})
}

/// Tricky run statuses, each with the reading the documentation gives it, for PipelineRuns and
/// TaskRuns alike. Not derived from the code's lookup: duplicates, odd values and case
/// variations, each chosen for what a reader of the documentation would expect.
///
/// Run statuses written by hand (in memory), as Tekton writes them and as it never does.
#[test]
fn run_statuses_read_as_documented() {
    use Reads::{Finished, Running};
    let done = |failed| Finished {
        failed,
        at: Some(DONE_AT),
    };
    let succeeded = |status: &str| condition(json!("Succeeded"), json!(status));
    let with_time =
        |conditions: Value| json!({"conditions": conditions, "completionTime": DONE_AT});
    let cases: Vec<(&str, Value, Reads)> = vec![
        ("no status", Value::Null, Running),
        ("an empty status", json!({}), Running),
        ("an empty list of conditions", with_time(json!([])), Running),
        (
            "conditions that are not a list",
            with_time(json!({"type": "Succeeded", "status": "True"})),
            Running,
        ),
        (
            "conditions as a string",
            with_time(json!("Succeeded")),
            Running,
        ),
        (
            "Succeeded True",
            with_time(json!([succeeded("True")])),
            done(false),
        ),
        (
            "Succeeded False",
            with_time(json!([succeeded("False")])),
            done(true),
        ),
        (
            "Succeeded Unknown",
            json!({"conditions": [succeeded("Unknown")]}),
            Running,
        ),
        (
            "Succeeded Unknown with a completion time",
            with_time(json!([succeeded("Unknown")])),
            Running,
        ),
        (
            "Succeeded True without a completion time",
            json!({"conditions": [succeeded("True")]}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        (
            "Succeeded False without a completion time",
            json!({"conditions": [succeeded("False")]}),
            Finished {
                failed: true,
                at: None,
            },
        ),
        (
            "Succeeded True at Go's zero time",
            json!({"conditions": [succeeded("True")], "completionTime": "0001-01-01T00:00:00Z"}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        (
            "Succeeded True at a time that does not parse",
            json!({"conditions": [succeeded("True")], "completionTime": "yesterday"}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        (
            "Succeeded True at a time that is a number",
            json!({"conditions": [succeeded("True")], "completionTime": 1_767_225_600}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        (
            "Succeeded True without a reason",
            with_time(json!([{"type": "Succeeded", "status": "True"}])),
            done(false),
        ),
        (
            "type in lower case",
            with_time(json!([condition(json!("succeeded"), json!("True"))])),
            Running,
        ),
        (
            "type in upper case",
            with_time(json!([condition(json!("SUCCEEDED"), json!("True"))])),
            Running,
        ),
        (
            "type with a space",
            with_time(json!([condition(json!("Succeeded "), json!("True"))])),
            Running,
        ),
        (
            "status true in lower case",
            with_time(json!([succeeded("true")])),
            Running,
        ),
        (
            "status FALSE in upper case",
            with_time(json!([succeeded("FALSE")])),
            Running,
        ),
        (
            "status with a space",
            with_time(json!([succeeded(" True")])),
            Running,
        ),
        (
            "status an unknown word",
            with_time(json!([succeeded("Done")])),
            Running,
        ),
        ("status empty", with_time(json!([succeeded("")])), Running),
        (
            "status a boolean",
            with_time(json!([condition(json!("Succeeded"), json!(true))])),
            Running,
        ),
        (
            "status a number",
            with_time(json!([condition(json!("Succeeded"), json!(1))])),
            Running,
        ),
        (
            "status null",
            with_time(json!([condition(json!("Succeeded"), Value::Null)])),
            Running,
        ),
        (
            "status missing",
            with_time(json!([{"type": "Succeeded"}])),
            Running,
        ),
        (
            "type a number",
            with_time(json!([condition(json!(7), json!("True"))])),
            Running,
        ),
        (
            "type missing",
            with_time(json!([{"status": "True"}])),
            Running,
        ),
        (
            "only another type",
            with_time(json!([condition(json!("Ready"), json!("True"))])),
            Running,
        ),
        (
            "another type True before Succeeded Unknown",
            with_time(json!([
                condition(json!("Ready"), json!("True")),
                succeeded("Unknown")
            ])),
            Running,
        ),
        (
            "another type False before Succeeded True",
            with_time(json!([
                condition(json!("Ready"), json!("False")),
                succeeded("True")
            ])),
            done(false),
        ),
        (
            "duplicates: Unknown first, then True",
            with_time(json!([succeeded("Unknown"), succeeded("True")])),
            Running,
        ),
        (
            "duplicates: True first, then Unknown",
            with_time(json!([succeeded("True"), succeeded("Unknown")])),
            done(false),
        ),
        (
            "duplicates: False first, then True",
            with_time(json!([succeeded("False"), succeeded("True")])),
            done(true),
        ),
        (
            "duplicates: True first, then False",
            with_time(json!([succeeded("True"), succeeded("False")])),
            done(false),
        ),
        (
            "duplicates: an odd status first, then True",
            with_time(json!([
                condition(json!("Succeeded"), json!(1)),
                succeeded("True")
            ])),
            Running,
        ),
        (
            "a null before Succeeded True",
            with_time(json!([Value::Null, succeeded("True")])),
            done(false),
        ),
        (
            "a job's phase on a run",
            json!({"phase": "Succeeded", "completionTime": DONE_AT}),
            Running,
        ),
    ];
    for (what, status, expected) in &cases {
        for (kind, entry) in [
            (
                "PipelineRun",
                resources::run_entry as fn(&resources::OwnerObject) -> _,
            ),
            ("TaskRun", resources::task_run_entry),
        ] {
            let read = reads(&entry(&owner(kind, "tekton.dev/v1", status)).progress);
            assert_eq!(read, *expected, "{kind}, {what}: {status}");
        }
    }
}

/// Tricky job statuses, each with the reading the documentation gives it.
#[test]
fn job_statuses_read_as_documented() {
    use Reads::{Finished, Running};
    let phase = |phase: Value| json!({"phase": phase, "completionTime": DONE_AT});
    let cases: Vec<(&str, Value, Reads)> = vec![
        ("no status", Value::Null, Running),
        ("an empty status", json!({}), Running),
        (
            "Succeeded",
            phase(json!("Succeeded")),
            Finished {
                failed: false,
                at: Some(DONE_AT),
            },
        ),
        (
            "Failed",
            phase(json!("Failed")),
            Finished {
                failed: true,
                at: Some(DONE_AT),
            },
        ),
        (
            "Failed through a phase-only update",
            json!({"phase": "Failed"}),
            Finished {
                failed: true,
                at: None,
            },
        ),
        (
            "Succeeded at Go's zero time",
            json!({"phase": "Succeeded", "completionTime": "0001-01-01T00:00:00Z"}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        (
            "Succeeded at a time that does not parse",
            json!({"phase": "Succeeded", "completionTime": "soon"}),
            Finished {
                failed: false,
                at: None,
            },
        ),
        ("a phase in lower case", phase(json!("succeeded")), Running),
        ("a phase in upper case", phase(json!("FAILED")), Running),
        ("a phase with a space", phase(json!("Succeeded ")), Running),
        (
            "the build complete, validation to come",
            phase(json!("BuildComplete")),
            Running,
        ),
        ("validating", phase(json!("ValidationRunning")), Running),
        ("an unknown phase", phase(json!("Done")), Running),
        ("an empty phase", phase(json!("")), Running),
        ("a phase that is a number", phase(json!(3)), Running),
        ("a phase that is a boolean", phase(json!(true)), Running),
        ("a phase that is null", phase(Value::Null), Running),
        (
            "a run's condition on a job",
            json!({"phase": "Building", "conditions": [condition(json!("Succeeded"), json!("True"))], "completionTime": DONE_AT}),
            Running,
        ),
    ];
    for (what, status, expected) in &cases {
        let job = resources::job_entry(&owner(
            "NotebookValidationJob",
            "mlops.mlops.dev/v1alpha1",
            status,
        ));
        assert_eq!(reads(&job.progress), *expected, "job, {what}: {status}");
    }
}
