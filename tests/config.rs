//! Configuration loading: the shipped default, precedence, every rejection and its message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use workspace_gc::config::{
    Config, ConfigError, LabelSelector, LogFormat, Overrides, deletion_interval,
};

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml")
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Loads `text` as if from a file named `config.toml`, so messages are predictable.
fn with_file(
    text: &str,
    vars: &[(&str, &str)],
    overrides: &Overrides,
) -> Result<Config, ConfigError> {
    Config::parse(Some((Path::new("config.toml"), text)), env(vars), overrides)
}

fn file(text: &str) -> Result<Config, ConfigError> {
    with_file(text, &[], &Overrides::default())
}

fn vars(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::parse(None, env(vars), &Overrides::default())
}

/// The error's message, which must start with `prefix` (location and key) and contain `detail`.
#[track_caller]
fn rejected(result: Result<Config, ConfigError>, prefix: &str, detail: &str) {
    let message = result.expect_err("accepted").to_string();
    assert!(
        message.starts_with(prefix),
        "{message:?} does not start with {prefix:?}"
    );
    assert!(
        message.contains(detail),
        "{message:?} does not contain {detail:?}"
    );
}

#[test]
fn shipped_config_is_the_default() {
    let loaded = Config::load(Some(&shipped()), env(&[]), &Overrides::default()).unwrap();
    assert_eq!(loaded, Config::default());
    assert_eq!(loaded.creator.storage.bytes(), 1 << 30);
    assert_eq!(
        loaded.selector.label_selector.to_string(),
        "mlops.redhat.com/build-workspace=true"
    );
}

#[test]
fn no_file_is_the_default() {
    assert_eq!(vars(&[]).unwrap(), Config::default());
    assert_eq!(file("").unwrap(), Config::default());
}

/// Every key of the shipped file can be set through its environment variable.
#[test]
fn every_key_has_an_environment_variable() {
    let text = std::fs::read_to_string(shipped()).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let mut vars = Vec::new();
    for (section, keys) in &table {
        for (key, value) in keys.as_table().unwrap() {
            let raw = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Array(items) => items
                    .iter()
                    .map(|i| i.as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
                    .join(","),
                toml::Value::Table(t) => t
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            vars.push((env_name(&format!("{section}.{key}")), raw));
        }
    }
    assert_eq!(vars.len(), KEYS.len());
    assert_eq!(
        Config::parse(None, vars, &Overrides::default()).unwrap(),
        Config::default()
    );
}

#[test]
fn effective_configuration_prints_as_toml_that_loads_back() {
    let changed = with_file(
        "[creator]\nstorage_class = \"fast\"\nlabels = { team = \"ml\" }\n",
        &[
            ("WORKSPACE_GC_POLICY_MAX_AGE", "3d 4h"),
            ("WORKSPACE_GC_SELECTOR_LABEL_SELECTOR", "a in (x, y),!b"),
            ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "0.25"),
            ("WORKSPACE_GC_SELECTOR_NAMESPACES", "a,b"),
            ("WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE", "gc"),
        ],
        &Overrides::default(),
    )
    .unwrap();
    for config in [Config::default(), changed] {
        let printed = toml::to_string(&config).unwrap();
        assert_eq!(file(&printed).unwrap(), config, "{printed}");
    }
}

#[test]
fn environment_overrides_file_and_flags_override_both() {
    let text = "[http]\nlisten = \"127.0.0.1:1\"\n[selector]\nnamespaces = [\"a\"]\n\
                [deletion]\ndry_run = false\n[policy]\nmax_age = \"3d\"\n";
    let vars = [
        ("WORKSPACE_GC_HTTP_LISTEN", "127.0.0.1:2"),
        ("WORKSPACE_GC_SELECTOR_NAMESPACES", "b, c"),
        ("WORKSPACE_GC_DELETION_DRY_RUN", "true"),
        ("PATH", "/usr/bin"),
        ("WORKSPACE_GC_CONFIG", "ignored.toml"),
    ];
    let flags = Overrides {
        listen: Some("127.0.0.1:3".parse().unwrap()),
        namespaces: Some(vec!["d".into()]),
        ..Overrides::default()
    };

    let only_file = file(text).unwrap();
    assert_eq!(only_file.http.listen.port(), 1);
    assert_eq!(only_file.selector.namespaces, ["a"]);
    assert!(!only_file.deletion.dry_run);
    assert_eq!(only_file.policy.max_age, Duration::from_secs(3 * 86400));

    let with_env = with_file(text, &vars, &Overrides::default()).unwrap();
    assert_eq!(with_env.http.listen.port(), 2);
    assert_eq!(with_env.selector.namespaces, ["b", "c"]);
    assert!(with_env.deletion.dry_run);
    assert_eq!(with_env.policy.max_age, Duration::from_secs(3 * 86400));

    let with_flags = with_file(text, &vars, &flags).unwrap();
    assert_eq!(with_flags.http.listen.port(), 3);
    assert_eq!(with_flags.selector.namespaces, ["d"]);
    assert!(with_flags.deletion.dry_run);

    // An empty list in the environment clears the file's list.
    let cleared = with_file(
        text,
        &[("WORKSPACE_GC_SELECTOR_NAMESPACES", "")],
        &Overrides::default(),
    );
    assert!(cleared.unwrap().selector.namespaces.is_empty());
}

#[test]
fn zero_ttl_is_allowed() {
    let config = vars(&[("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "0s")]).unwrap();
    assert_eq!(config.policy.ttl_after_finished, Duration::ZERO);
    assert_eq!(config.policy().ttl_after_finished, chrono::Duration::zero());
}

#[test]
fn ttl_after_failed_defaults_to_ttl_after_finished() {
    let config = vars(&[("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "2h")]).unwrap();
    assert_eq!(config.policy.ttl_after_failed, None);
    assert_eq!(config.policy().ttl_after_failed, chrono::Duration::hours(2));
    let config =
        file("[policy]\nttl_after_finished = \"2h\"\nttl_after_failed = \"3d\"\n").unwrap();
    assert_eq!(
        config.policy().ttl_after_finished,
        chrono::Duration::hours(2)
    );
    assert_eq!(config.policy().ttl_after_failed, chrono::Duration::days(3));
    // Empty is unset, from the environment too.
    let config = vars(&[
        ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "5m"),
        ("WORKSPACE_GC_POLICY_TTL_AFTER_FAILED", ""),
    ])
    .unwrap();
    assert_eq!(
        config.policy().ttl_after_failed,
        chrono::Duration::minutes(5)
    );
}

#[test]
fn keep_failed_is_off_by_default_and_bounded() {
    assert_eq!(vars(&[]).unwrap().policy().keep_failed, 0);
    let config = file("[policy]\nkeep_failed = 3\n").unwrap();
    assert_eq!(config.policy().keep_failed, 3);
    let config = vars(&[("WORKSPACE_GC_POLICY_KEEP_FAILED", "5")]).unwrap();
    assert_eq!(config.policy().keep_failed, 5);
    for (text, expected) in [
        (
            "[policy]\nkeep_failed = 1001\n",
            "config.toml:2: policy.keep_failed: 1001 is too many; expected at most 1000",
        ),
        (
            "[policy]\nkeep_failed = -1\n",
            "config.toml:2: policy.keep_failed: ",
        ),
        (
            "[policy]\nkeep_failed = \"3\"\n",
            "config.toml:2: policy.keep_failed: ",
        ),
    ] {
        let message = file(text).unwrap_err().to_string();
        assert!(message.contains(expected), "{text:?}: {message}");
    }
    let message = vars(&[("WORKSPACE_GC_POLICY_KEEP_FAILED", "some")])
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("\"some\" is not a whole number"),
        "{message}"
    );
    // Keeping fewer deletes more: an override that lowers it is named.
    let base = file("[policy]\nkeep_failed = 3\n").unwrap();
    let lowered = with_file(
        "[policy]\nkeep_failed = 3\n",
        &[("WORKSPACE_GC_POLICY_KEEP_FAILED", "1")],
        &Overrides::default(),
    )
    .unwrap();
    let warnings = lowered.widenings(&base);
    assert_eq!(
        warnings,
        ["policy.keep_failed is overridden from 3 to 1: more claims may be deleted"]
    );
}

#[test]
fn values_of_every_kind_load() {
    let config = file(
        r#"
[selector]
label_selector = "mlops.redhat.com/build-workspace in (true), tier != test"
exclude_namespaces = ["kube-system"]
[deletion]
dry_run = true
server_side_dry_run = true
read_volumes = true
released_volume_ttl = "2d"
deletes_per_second = 2
max_deletions_per_window = 7
max_deletions_percent = 25
[leader_election]
enabled = false
lease_namespace = "ops"
lease_duration = "1m"
[http]
listen = "[::1]:9100"
[logging]
format = "json"
level = "workspace_gc=debug,kube=info"
[creator]
storage = "500Mi"
storage_class = "fast.ssd"
labels = { "example.com/team" = "ml", empty = "" }
annotations = { "example.com/note" = "anything, at all" }
"#,
    )
    .unwrap();
    assert_eq!(config.deletion.deletes_per_second, 2.0);
    assert_eq!(config.deletion.max_deletions_per_window, 7);
    assert_eq!(config.deletion.max_deletions_percent, Some(25.0));
    assert!(config.deletion.server_side_dry_run);
    assert_eq!(
        config.deletion.released_volume_ttl,
        Some(Duration::from_secs(2 * 86_400))
    );
    assert_eq!(config.leader_election.lease_namespace(Some("pod")), "ops");
    assert_eq!(
        config.leader_election.lease_duration,
        Duration::from_secs(60)
    );
    assert_eq!(config.logging.format, LogFormat::Json);
    assert_eq!(config.creator.storage.bytes(), 500 << 20);
    assert_eq!(config.creator.storage.as_str(), "500Mi");
    assert_eq!(config.creator.storage_class.as_deref(), Some("fast.ssd"));
    assert_eq!(config.creator.labels["empty"], "");
    assert!(config.selector.includes_namespace("ml"));
    assert!(!config.selector.includes_namespace("kube-system"));
}

#[test]
fn unreadable_file_names_the_path() {
    let missing = Path::new("/nonexistent/workspace-gc.toml");
    let error = Config::load(Some(missing), env(&[]), &Overrides::default()).unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }));
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/workspace-gc.toml: cannot read"),
        "{error}"
    );
}

#[test]
fn loaded_file_errors_name_the_given_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gc.toml");
    std::fs::write(&path, "\n[policy]\nmax_age = \"0s\"\n").unwrap();
    let error = Config::load(Some(&path), env(&[]), &Overrides::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:3: policy.max_age: \"0s\" must be greater than zero",
            path.display()
        )
    );
}

#[test]
fn file_shape_errors_name_key_and_line() {
    rejected(
        file("[policy]\nmax_age = \"1d\"\nmaxage = \"2d\"\n"),
        "config.toml:3: policy.maxage: ",
        "unknown field `maxage`, expected one of",
    );
    rejected(
        file("\n[polcy]\n"),
        "config.toml:2: polcy: ",
        "unknown field `polcy`",
    );
    rejected(
        file("policy.max_age = \"1d\"\npolicy.bogus = 1\n"),
        "config.toml:2: policy.bogus: ",
        "unknown field `bogus`",
    );
    rejected(
        file("[deletion]\ndry_run = \"yes\"\n"),
        "config.toml:2: deletion.dry_run: ",
        "invalid type: string \"yes\", expected a boolean",
    );
    rejected(
        file("[selector]\nnamespaces = [\"a\",\n  7]\n"),
        "config.toml:3: selector.namespaces: ",
        "invalid type: integer `7`",
    );
    rejected(
        file("policy = 3\n"),
        "config.toml:1: policy: ",
        "invalid type",
    );
    rejected(
        file("[deletion]\nmax_deletions_per_window = -1\n"),
        "config.toml:2: deletion.max_deletions_per_window: ",
        "invalid value: integer `-1`",
    );
    for percent in ["150", "-5", "nan"] {
        rejected(
            file(&format!("[deletion]\nmax_deletions_percent = {percent}\n")),
            "config.toml:2: deletion.max_deletions_percent: ",
            "must be a percentage",
        );
    }
    rejected(
        file("[policy]\nmax_age = \"1d\"\nmax_age = \"2d\"\n"),
        "config.toml:3: not valid TOML: ",
        "duplicate key",
    );
    rejected(file("[policy\n"), "config.toml:1: not valid TOML: ", "");
}

#[test]
fn unknown_environment_variables_are_named() {
    for var in [
        "WORKSPACE_GC_POLICY_MAXAGE",
        "WORKSPACE_GC_policy_max_age",
        "WORKSPACE_GC_",
        "WORKSPACE_GC_BOGUS_KEY",
        "WORKSPACE_GC_POLICY",
    ] {
        rejected(
            vars(&[(var, "1d")]),
            &format!("${var}: unknown environment variable"),
            "WORKSPACE_GC_<SECTION>_<KEY>",
        );
    }
}

/// `(section, key, bad value as TOML, expected detail)`: each is rejected from the file with its
/// line, and from the environment (when the value has an environment form) with its variable.
const BAD_VALUES: &[(&str, &str, &str, &str)] = &[
    (
        "selector",
        "label_selector",
        r#""a=b,""#,
        "is not a valid label selector",
    ),
    (
        "selector",
        "label_selector",
        r#""a in (b""#,
        "is not a valid label selector",
    ),
    (
        "selector",
        "label_selector",
        r#""Bad Key=x""#,
        "is not a valid label selector",
    ),
    (
        "selector",
        "label_selector",
        r#""""#,
        "is empty, and would select every object",
    ),
    (
        "selector",
        "label_selector",
        r#""!a,b!=c""#,
        "would select claims without any required label",
    ),
    (
        "selector",
        "namespaces",
        r#"["ok", "Not_OK"]"#,
        "\"Not_OK\" is not a valid namespace name",
    ),
    (
        "selector",
        "exclude_namespaces",
        r#"["-x"]"#,
        "\"-x\" is not a valid namespace name",
    ),
    (
        "policy",
        "ttl_after_finished",
        r#""1 hour and a bit""#,
        "is not a duration",
    ),
    (
        "policy",
        "ttl_after_finished",
        r#""-1h""#,
        "is not a duration",
    ),
    (
        "policy",
        "ttl_after_finished",
        r#""1000y""#,
        "is too long; expected at most 100 years",
    ),
    (
        "policy",
        "ttl_after_failed",
        r#""a day""#,
        "is not a duration",
    ),
    (
        "deletion",
        "notice_before",
        r#""0s""#,
        "\"0s\" must be greater than zero",
    ),
    (
        "namespace_policy",
        "min_ttl",
        r#""0s""#,
        "\"0s\" must be greater than zero",
    ),
    (
        "policy",
        "orphan_grace",
        r#""0s""#,
        "\"0s\" must be greater than zero",
    ),
    (
        "policy",
        "max_age",
        r#""0""#,
        "\"0\" must be greater than zero",
    ),
    (
        "policy",
        "max_age",
        r#""5m""#,
        "policy.max_age (5m) is shorter than policy.orphan_grace (10m)",
    ),
    (
        "deletion",
        "deletes_per_second",
        "0.0",
        "0 must be a finite number greater than zero",
    ),
    (
        "deletion",
        "deletes_per_second",
        "-1.0",
        "-1 must be a finite number greater than zero",
    ),
    (
        "deletion",
        "deletes_per_second",
        "inf",
        "inf must be a finite number greater than zero",
    ),
    (
        "deletion",
        "deletes_per_second",
        "nan",
        "NaN must be a finite number greater than zero",
    ),
    // Accepted before, then overflowed into "no pacing at all".
    (
        "deletion",
        "deletes_per_second",
        "1e-30",
        "1e-30 is too small: it means one deletion every 1.0e30 s; expected at least 3.2e-10",
    ),
    (
        "deletion",
        "deletes_per_second",
        "3e-10",
        "3e-10 is too small",
    ),
    (
        "deletion",
        "max_deletions_per_window",
        "0",
        "0 must be at least 1",
    ),
    (
        "deletion",
        "window",
        r#""0ms""#,
        "\"0ms\" must be greater than zero",
    ),
    (
        "deletion",
        "server_side_dry_run",
        "true",
        "expected dry_run = true as well",
    ),
    (
        "deletion",
        "released_volume_ttl",
        r#""0s""#,
        "\"0s\" must be greater than zero",
    ),
    (
        "deletion",
        "released_volume_ttl",
        r#""a week""#,
        "is not a duration",
    ),
    (
        "deletion",
        "released_volume_ttl",
        r#""1h""#,
        "expected read_volumes = true as well",
    ),
    (
        "leader_election",
        "lease_name",
        r#""Lease_1""#,
        "is not a valid Lease name",
    ),
    (
        "leader_election",
        "lease_namespace",
        r#""a.b""#,
        "is not a valid namespace name",
    ),
    (
        "leader_election",
        "lease_duration",
        r#""0s""#,
        "must be a whole number of seconds from 2s to 1h",
    ),
    (
        "leader_election",
        "lease_duration",
        r#""1500ms""#,
        "must be a whole number of seconds from 2s to 1h",
    ),
    (
        "leader_election",
        "lease_duration",
        r#""2h""#,
        "must be a whole number of seconds from 2s to 1h",
    ),
    (
        "http",
        "listen",
        r#""localhost:8080""#,
        "is not a socket address; expected IP:PORT",
    ),
    ("http", "listen", r#""0.0.0.0""#, "is not a socket address"),
    (
        "logging",
        "format",
        r#""text""#,
        "\"text\" is not a log format; expected \"human\" or \"json\"",
    ),
    (
        "logging",
        "level",
        r#""workspace_gc=loud""#,
        "is not a log filter",
    ),
    (
        "logging",
        "level",
        r#""""#,
        "is empty; expected a log filter",
    ),
    (
        "creator",
        "storage",
        r#""1GB""#,
        "\"1GB\" is not a quantity",
    ),
    (
        "creator",
        "storage",
        r#""0""#,
        "\"0\" is zero, negative or too large",
    ),
    (
        "creator",
        "storage",
        r#""-1Gi""#,
        "is zero, negative or too large",
    ),
    (
        "creator",
        "storage_class",
        r#""Fast SSD""#,
        "is not a valid storage class name",
    ),
    (
        "creator",
        "labels",
        r#"{ "-bad" = "x" }"#,
        "\"-bad\" is not a valid label key",
    ),
    (
        "creator",
        "labels",
        r#"{ "a/b/c" = "x" }"#,
        "\"a/b/c\" is not a valid label key",
    ),
    (
        "creator",
        "labels",
        r#"{ ok = "not ok" }"#,
        "\"not ok\" (of \"ok\") is not a valid label value",
    ),
    (
        "creator",
        "annotations",
        r#"{ "bad key" = "x" }"#,
        "\"bad key\" is not a valid annotation key",
    ),
    (
        "quota",
        "high_water",
        "1.5",
        "1.5 must be a fraction greater than 0 and at most 1",
    ),
    (
        "quota",
        "high_water",
        "nan",
        "NaN must be a fraction greater than 0 and at most 1",
    ),
    (
        "quota",
        "low_water",
        "0.0",
        "0 must be a fraction greater than 0 and at most 1",
    ),
    (
        "quota",
        "low_water",
        "0.95",
        "quota.low_water (0.95) is not below quota.high_water (0.9)",
    ),
];

#[test]
fn bad_values_from_the_file_name_key_and_line() {
    for (section, key, value, detail) in BAD_VALUES {
        let text = format!("# comment\n[{section}]\n{key} = {value}\n");
        rejected(
            file(&text),
            &format!("config.toml:3: {section}.{key}: "),
            detail,
        );
    }
}

#[test]
fn bad_values_from_the_environment_name_variable_and_key() {
    for (section, key, value, detail) in BAD_VALUES {
        // The environment form of a TOML value: strings unquoted, lists and tables flattened.
        if value.starts_with(['[', '{']) {
            continue; // covered by bad_environment_forms_are_named
        }
        let raw = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        let var = env_name(&format!("{section}.{key}"));
        rejected(
            vars(&[(&var, raw)]),
            &format!("${var}: {section}.{key}: "),
            detail,
        );
    }
}

#[test]
fn bad_environment_forms_are_named() {
    for (var, raw, key, detail) in [
        (
            "WORKSPACE_GC_DELETION_DRY_RUN",
            "yes",
            "deletion.dry_run",
            "\"yes\" is not a boolean; expected \"true\" or \"false\"",
        ),
        (
            "WORKSPACE_GC_DELETION_DELETES_PER_SECOND",
            "fast",
            "deletion.deletes_per_second",
            "is not a number",
        ),
        (
            "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
            "-1",
            "deletion.max_deletions_per_window",
            "is not a whole number",
        ),
        (
            "WORKSPACE_GC_CREATOR_LABELS",
            "team",
            "creator.labels",
            "\"team\" is not a key=value pair",
        ),
        (
            "WORKSPACE_GC_SELECTOR_NAMESPACES",
            "a,,b",
            "selector.namespaces",
            "\"\" is not a valid namespace name",
        ),
        (
            "WORKSPACE_GC_CREATOR_LABELS",
            "-x=y",
            "creator.labels",
            "is not a valid label key",
        ),
        (
            "WORKSPACE_GC_CREATOR_LABELS",
            "mlops.redhat.com/build-workspace=false",
            "creator.labels",
            "is set by workspace-gc create itself",
        ),
    ] {
        rejected(vars(&[(var, raw)]), &format!("${var}: {key}: "), detail);
    }
}

#[test]
fn conflicts_blame_the_value_set_last() {
    let text = "[selector]\nnamespaces = [\"a\"]\nexclude_namespaces = [\"b\", \"a\"]\n";
    rejected(
        file(text),
        "config.toml:3: selector.exclude_namespaces: ",
        "namespace \"a\" is both in selector.namespaces and in selector.exclude_namespaces",
    );

    let flags = Overrides {
        namespaces: Some(vec!["b".into()]),
        ..Overrides::default()
    };
    rejected(
        with_file(text, &[], &flags),
        "--namespace: selector.namespaces: ",
        "namespace \"b\" is both",
    );

    let grace = [("WORKSPACE_GC_POLICY_ORPHAN_GRACE", "8d")];
    rejected(
        vars(&grace),
        "$WORKSPACE_GC_POLICY_ORPHAN_GRACE: policy.orphan_grace: ",
        "policy.max_age (7days) is shorter than policy.orphan_grace (8days)",
    );

    let flags = Overrides {
        server_side_dry_run: Some(true),
        ..Overrides::default()
    };
    rejected(
        with_file("[deletion]\ndry_run = false\n", &[], &flags),
        "--server-side-dry-run: deletion.server_side_dry_run: ",
        "expected dry_run = true as well",
    );
    let both = Overrides {
        dry_run: Some(true),
        ..flags
    };
    assert!(
        with_file("[deletion]\ndry_run = false\n", &[], &both)
            .unwrap()
            .deletion
            .server_side_dry_run
    );
}

#[test]
fn bad_flag_values_name_the_flag() {
    let flags = Overrides {
        log_level: Some("x=nope".into()),
        ..Overrides::default()
    };
    rejected(
        Config::parse(None, env(&[]), &flags),
        "--log-level: logging.level: ",
        "is not a log filter",
    );
    let flags = Overrides {
        lease_namespace: Some("NS".into()),
        ..Overrides::default()
    };
    rejected(
        Config::parse(None, env(&[]), &flags),
        "--lease-namespace: leader_election.lease_namespace: ",
        "\"NS\" is not a valid namespace name",
    );
}

#[test]
fn selector_parses_prints_and_matches() {
    let selector: LabelSelector =
        " app in (b, a) , tier!=test,!legacy , mlops.redhat.com/build-workspace==true"
            .parse()
            .unwrap();
    assert_eq!(
        selector.to_string(),
        "app in (a,b),tier!=test,!legacy,mlops.redhat.com/build-workspace=true"
    );
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(selector.matches(&labels(&[
        ("app", "a"),
        ("mlops.redhat.com/build-workspace", "true")
    ])));
    assert!(!selector.matches(&labels(&[
        ("app", "a"),
        ("mlops.redhat.com/build-workspace", "true"),
        ("legacy", "")
    ])));
    assert!(!selector.matches(&labels(&[
        ("app", "c"),
        ("mlops.redhat.com/build-workspace", "true")
    ])));
    assert!(!selector.matches(&labels(&[
        ("app", "a"),
        ("tier", "test"),
        ("mlops.redhat.com/build-workspace", "true")
    ])));
    assert!(!selector.matches(&BTreeMap::new()));
}

// ---------------------------------------------------------------------------------------------
// Properties

const KEYS: &[&str] = &[
    "selector.label_selector",
    "selector.namespaces",
    "selector.exclude_namespaces",
    "policy.ttl_after_finished",
    "policy.ttl_after_failed",
    "policy.orphan_grace",
    "policy.max_age",
    "policy.keep_failed",
    "deletion.dry_run",
    "deletion.server_side_dry_run",
    "deletion.deletes_per_second",
    "deletion.max_deletions_per_window",
    "deletion.window",
    "deletion.max_deletions_percent",
    "deletion.notice_before",
    "deletion.read_volumes",
    "deletion.released_volume_ttl",
    "deletion.proof_round_interval",
    "leader_election.enabled",
    "leader_election.lease_name",
    "leader_election.lease_namespace",
    "leader_election.lease_duration",
    "http.listen",
    "http.secure_listen",
    "http.tls_cert_file",
    "http.tls_key_file",
    "logging.format",
    "logging.level",
    "creator.storage",
    "creator.storage_class",
    "creator.labels",
    "creator.annotations",
    "quota.enabled",
    "quota.high_water",
    "quota.low_water",
    "provenance.claim_suffixes",
    "provenance.label_managers",
    "provenance.trust_unrecorded",
    "provenance.label_writers",
    "namespace_policy.enabled",
    "namespace_policy.may_shorten",
    "namespace_policy.min_ttl",
];

fn env_name(key: &str) -> String {
    format!("WORKSPACE_GC_{}", key.replace('.', "_").to_uppercase())
}

/// Text that looks like a configuration file often enough to reach every stage: mostly
/// `section.key = value` lines (dotted keys, so repeated sections stay valid TOML), with values
/// near the accepted forms, and some noise.
fn tomlish() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        8 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}\\.[a-z_]{1,8}",
    ];
    let value = prop_oneof![
        "\"[0-9]{1,4}(ns|ms|s|m|h|d|w|y|Ki|Mi|Gi|e9|)\"",
        "\"[a-z0-9=!,() ./-]{0,16}\"",
        "\"[0-9.:\\[\\]]{0,14}\"",
        "-?[0-9]{1,25}(\\.[0-9]{1,5})?(e[0-9]{1,3})?",
        prop::sample::select(vec!["inf", "nan", "true", "false", "\"json\"", "\"info\""])
            .prop_map(str::to_owned),
        "\\[(\"[a-z-]{0,5}\", ?){0,3}\\]",
        "\\{ ?(\"[ -~]{0,6}\" = \"[ -~]{0,6}\")? ?\\}",
    ];
    let line = prop_oneof![
        8 => (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop::sample::select(vec!["[policy]", "[creator.labels]", "[[policy]]", "[bogus", "#"]).prop_map(str::to_owned),
        1 => "\\PC{0,20}",
    ];
    prop::collection::vec(line, 0..8).prop_map(|lines| lines.join("\n"))
}

fn env_vars() -> impl Strategy<Value = Vec<(String, String)>> {
    let var = prop_oneof![
        prop::sample::select(KEYS.to_vec()).prop_map(env_name),
        "WORKSPACE_GC_[A-Z_]{0,10}",
        "[A-Z_]{1,10}",
    ];
    let value = prop_oneof!["\\PC{0,16}", "[0-9a-z=,. ()!-]{0,16}"];
    prop::collection::vec((var, value), 0..4)
}

proptest! {
    #[test]
    fn loading_never_panics(text in tomlish(), vars in env_vars()) {
        if let Err(error) = Config::parse(Some((Path::new("c.toml"), &text)), vars, &Overrides::default()) {
            let message = error.to_string();
            prop_assert!(!message.is_empty());
        }
    }

    #[test]
    fn loading_arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = Config::parse(Some((Path::new("c.toml"), &text)), Vec::new(), &Overrides::default());
    }

    #[test]
    fn arbitrary_selectors_never_panic(text in "[a-z0-9=!,() ./<>_-]{0,30}") {
        if let Ok(selector) = text.parse::<LabelSelector>() {
            prop_assert_eq!(selector.to_string().parse::<LabelSelector>(), Ok(selector));
        }
    }

    #[test]
    fn selector_round_trips_and_matches(
        requirements in prop::collection::vec((label_key(), 0..7u8, prop::collection::btree_set("[a-z0-9]([a-z0-9._-]{0,4}[a-z0-9])?", 1..4)), 1..5),
        labels in prop::collection::btree_map(prop::sample::select(vec!["a", "b", "x.io/c"]), "[a-z0-9]{0,2}", 0..3),
    ) {
        let labels: BTreeMap<String, String> = labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let mut text = Vec::new();
        let mut expected = true;
        for (key, op, values) in &requirements {
            let first = values.iter().next().unwrap();
            let joined = values.iter().cloned().collect::<Vec<_>>().join(" , ");
            let value = labels.get(key);
            let (part, holds) = match op {
                0 => (format!("{key} = {first}"), value == Some(first)),
                1 => (format!("{key}=={first}"), value == Some(first)),
                2 => (format!("{key} != {first}"), value != Some(first)),
                3 => (format!("{key} in ( {joined} )"), value.is_some_and(|v| values.contains(v))),
                4 => (format!("{key} notin ({joined})"), value.is_none_or(|v| !values.contains(v))),
                5 => (format!("!{key}"), value.is_none()),
                _ => (key.clone(), value.is_some()),
            };
            text.push(part);
            expected &= holds;
        }
        let parsed: LabelSelector = text.join(" , ").parse().unwrap();
        let canonical = parsed.to_string();
        let reparsed: LabelSelector = canonical.parse().unwrap();
        prop_assert_eq!(&reparsed, &parsed);
        prop_assert_eq!(reparsed.to_string(), canonical);
        prop_assert_eq!(parsed.matches(&labels), expected);
    }

    /// No accepted rate turns into its opposite: each has an interval to pace by.
    #[test]
    fn every_accepted_rate_paces(rate in any::<f64>()) {
        let vars = vec![("WORKSPACE_GC_DELETION_DELETES_PER_SECOND".to_owned(), format!("{rate:e}"))];
        if let Ok(config) = Config::parse(None, vars, &Overrides::default()) {
            prop_assert!(deletion_interval(config.deletion.deletes_per_second).is_some(), "{rate:e}");
        }
    }

    #[test]
    fn printed_configuration_loads_back(
        minutes in 1u64..100_000, rate in 0.001f64..1e6, cap in 1u32.., dry in any::<bool>(),
        namespaces in prop::collection::vec("[a-z]([a-z0-9-]{0,8}[a-z0-9])?", 0..3),
    ) {
        let vars = vec![
            ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED".to_owned(), format!("{minutes}m")),
            ("WORKSPACE_GC_POLICY_MAX_AGE".to_owned(), format!("{}m", minutes + 10)),
            ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND".to_owned(), rate.to_string()),
            ("WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW".to_owned(), cap.to_string()),
            ("WORKSPACE_GC_DELETION_DRY_RUN".to_owned(), dry.to_string()),
            ("WORKSPACE_GC_SELECTOR_NAMESPACES".to_owned(), namespaces.join(",")),
        ];
        let config = Config::parse(None, vars, &Overrides::default()).unwrap();
        let printed = toml::to_string(&config).unwrap();
        prop_assert_eq!(file(&printed).unwrap(), config);
    }
}

fn label_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("b".to_owned()),
        Just("x.io/c".to_owned()),
        "[a-z]{1,5}(\\.[a-z0-9]{1,5})?/[A-Za-z0-9]([A-Za-z0-9_.-]{0,6}[A-Za-z0-9])?",
    ]
}

#[test]
fn exclusions_from_every_layer_add_up() {
    let text = "[selector]\nexclude_namespaces = [\"from-file\"]\n";
    let flags = Overrides {
        exclude_namespaces: Some(vec!["from-flag".into()]),
        ..Overrides::default()
    };
    for variable in ["", "from-env"] {
        let config = with_file(
            text,
            &[("WORKSPACE_GC_SELECTOR_EXCLUDE_NAMESPACES", variable)],
            &flags,
        )
        .unwrap();
        let mut expected = vec!["from-file", "from-flag"];
        if !variable.is_empty() {
            expected.insert(1, variable);
        }
        assert_eq!(config.selector.exclude_namespaces, expected, "{variable:?}");
    }
}

#[test]
fn overrides_that_widen_deletion_are_named() {
    let text = "[selector]\nnamespaces = [\"ml\"]\n[deletion]\ndry_run = true\n";
    let base = file(text).unwrap();
    assert!(base.widenings(&base).is_empty());
    let widened = with_file(
        text,
        &[
            ("WORKSPACE_GC_SELECTOR_NAMESPACES", ""),
            ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", "5m"),
            ("WORKSPACE_GC_DELETION_DRY_RUN", "false"),
        ],
        &Overrides::default(),
    )
    .unwrap();
    let warnings = widened.widenings(&base);
    let keys: Vec<&str> = warnings
        .iter()
        .map(|w| w.split_once(' ').unwrap().0)
        .collect();
    assert_eq!(
        keys,
        [
            "selector.namespaces",
            "policy.ttl_after_finished",
            "deletion.dry_run"
        ],
        "{warnings:?}"
    );
    assert!(
        warnings[0].contains("from [\"ml\"] to all namespaces"),
        "{warnings:?}"
    );
    // Narrowing says nothing.
    let narrowed = with_file(
        text,
        &[
            ("WORKSPACE_GC_POLICY_MAX_AGE", "30d"),
            ("WORKSPACE_GC_QUOTA_HIGH_WATER", "0.95"),
        ],
        &Overrides::default(),
    )
    .unwrap();
    assert!(narrowed.widenings(&base).is_empty());
    // A failed build's TTL shortened on its own is named; following ttl_after_finished it
    // is named under that key alone.
    let failed = with_file(
        text,
        &[("WORKSPACE_GC_POLICY_TTL_AFTER_FAILED", "30m")],
        &Overrides::default(),
    )
    .unwrap();
    let warnings = failed.widenings(&base);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("policy.ttl_after_failed is overridden from 1h to 30m"),
        "{warnings:?}"
    );
    // Letting namespaces shorten durations, or shorten them further, is named too.
    let shorten = |vars: &[(&str, &str)]| {
        let mut all = vec![
            ("WORKSPACE_GC_NAMESPACE_POLICY_ENABLED", "true"),
            ("WORKSPACE_GC_NAMESPACE_POLICY_MAY_SHORTEN", "true"),
        ];
        all.extend_from_slice(vars);
        with_file(text, &all, &Overrides::default()).unwrap()
    };
    let first = shorten(&[]).widenings(&base);
    assert!(
        first[0].starts_with("namespace_policy.may_shorten is overridden from false to true"),
        "{first:?}"
    );
    let further = shorten(&[("WORKSPACE_GC_NAMESPACE_POLICY_MIN_TTL", "1m")]);
    let warnings = further.widenings(&shorten(&[]));
    assert!(
        warnings[0].starts_with("namespace_policy.min_ttl is overridden from 10m to 1m"),
        "{warnings:?}"
    );
}

#[test]
fn quota_pressure_that_starts_earlier_or_deletes_further_is_named() {
    let text = "[quota]
enabled = false
";
    let base = file(text).unwrap();
    let widened = with_file(
        text,
        &[
            ("WORKSPACE_GC_QUOTA_ENABLED", "true"),
            ("WORKSPACE_GC_QUOTA_HIGH_WATER", "0.7"),
            ("WORKSPACE_GC_QUOTA_LOW_WATER", "0.5"),
        ],
        &Overrides::default(),
    )
    .unwrap();
    let warnings = widened.widenings(&base);
    assert_eq!(
        warnings,
        [
            "quota.enabled is overridden from false to true: more claims may be deleted",
            "quota.high_water is overridden from 0.9 to 0.7: more claims may be deleted",
            "quota.low_water is overridden from 0.8 to 0.5: more claims may be deleted",
        ]
    );
    // The low water is checked against the high water of whichever layer set it.
    rejected(
        vars(&[("WORKSPACE_GC_QUOTA_HIGH_WATER", "0.8")]),
        "$WORKSPACE_GC_QUOTA_HIGH_WATER: quota.high_water: ",
        "quota.low_water (0.8) is not below quota.high_water (0.8)",
    );
    assert_eq!(
        vars(&[("WORKSPACE_GC_QUOTA_ENABLED", "false")])
            .unwrap()
            .quota
            .waters(),
        None
    );
}

/// The HTTPS metrics keys come together: an address without its certificate and key (or the
/// files without an address) is refused, naming the key.
#[test]
fn secure_metrics_keys_are_set_together() {
    let ok = file(
        "[http]\nsecure_listen = \"0.0.0.0:8443\"\ntls_cert_file = \"/tls/tls.crt\"\n\
         tls_key_file = \"/tls/tls.key\"\n",
    )
    .unwrap();
    assert_eq!(ok.http.secure_listen, Some("0.0.0.0:8443".parse().unwrap()));
    assert_eq!(ok.http.tls_key_file, Some(PathBuf::from("/tls/tls.key")));
    rejected(
        file("[http]\nsecure_listen = \"0.0.0.0:8443\"\ntls_cert_file = \"/tls/tls.crt\"\n"),
        "config.toml:2: http.secure_listen: ",
        "http.tls_key_file is empty",
    );
    rejected(
        vars(&[("WORKSPACE_GC_HTTP_TLS_CERT_FILE", "/tls/tls.crt")]),
        "$WORKSPACE_GC_HTTP_TLS_CERT_FILE: http.tls_cert_file: ",
        "set together",
    );
    rejected(
        file("[http]\nsecure_listen = \"8443\"\n"),
        "config.toml:2: http.secure_listen: ",
        "not a socket address",
    );
}

/// Two overrides that widen deletion outside the policy: leader election turned off (with two
/// replicas each deletes and counts its own cap), and a released-volume TTL set or shortened
/// (volume deletes turned on, or sooner). Turning them back is not named.
#[test]
fn leader_election_off_and_released_volume_deletes_are_named() {
    let text = "[deletion]\nread_volumes = true\n";
    let base = file(text).unwrap();
    let widened = with_file(
        text,
        &[
            ("WORKSPACE_GC_DELETION_RELEASED_VOLUME_TTL", "1d"),
            ("WORKSPACE_GC_LEADER_ELECTION_ENABLED", "false"),
        ],
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        widened.widenings(&base),
        [
            "deletion.released_volume_ttl is overridden from off to 1day: more released \
             volumes may be deleted",
            "leader_election.enabled is overridden from true to false: more claims may be deleted",
        ]
    );
    let flag = Overrides {
        leader_election: Some(false),
        ..Overrides::default()
    };
    let keys: Vec<String> = with_file(text, &[], &flag).unwrap().widenings(&base);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("leader_election.enabled "), "{keys:?}");
    // Shorter is named; longer, or off, is not.
    let with_ttl = "[deletion]\nread_volumes = true\nreleased_volume_ttl = \"2d\"\n";
    let base = file(with_ttl).unwrap();
    for (ttl, named) in [("1d", true), ("3d", false), ("", false)] {
        let vars = [("WORKSPACE_GC_DELETION_RELEASED_VOLUME_TTL", ttl)];
        let warnings = with_file(with_ttl, &vars, &Overrides::default())
            .unwrap()
            .widenings(&base);
        assert_eq!(!warnings.is_empty(), named, "{ttl:?}: {warnings:?}");
    }
    assert!(base.widenings(&widened).is_empty());
}

/// The warnings reach the operator: every command logs them at start, `check-config` too.
#[test]
fn check_config_warns_of_each_widening_override() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_workspace-gc"))
        .args(["--config", shipped().to_str().unwrap(), "check-config"])
        .env("WORKSPACE_GC_LEADER_ELECTION_ENABLED", "false")
        .env("WORKSPACE_GC_DELETION_READ_VOLUMES", "true")
        .env("WORKSPACE_GC_DELETION_RELEASED_VOLUME_TTL", "12h")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in ["leader_election.enabled", "deletion.released_volume_ttl"] {
        assert!(
            stderr
                .lines()
                .any(|line| line.contains("WARN") && line.contains(&format!("{key} is overridden"))),
            "no warning for {key}:\n{stderr}"
        );
    }
}

/// The environment variable the settings table derives for each key is the one loading reads
/// for it: a value from it is taken (or refused naming that variable and key), never reported
/// as an unknown variable.
#[test]
fn every_setting_is_read_from_the_variable_the_table_names() {
    let settings = workspace_gc::config::settings();
    assert_eq!(
        settings.iter().map(|s| s.key).collect::<Vec<_>>(),
        KEYS,
        "the settings table and the keys users rely on"
    );
    for setting in settings {
        let var = setting.env();
        assert_eq!(var, env_name(setting.key));
        if let Err(error) = vars(&[(&var, "!!")]) {
            let message = error.to_string();
            let named = format!("${var}: {}: ", setting.key);
            assert!(message.starts_with(&named), "{message}");
        }
    }
}

/// A proof round costs four consistent reads and short watches: below half a second between
/// rounds a burst starts one round per due claim and overloads the API server, so the interval
/// has a floor, named with the key.
#[test]
fn proof_rounds_are_at_least_half_a_second_apart() {
    for short in ["0s", "100ms", "499ms"] {
        rejected(
            file(&format!("[deletion]\nproof_round_interval = \"{short}\"\n")),
            "config.toml:2: deletion.proof_round_interval: ",
            "too short; expected at least 500ms",
        );
    }
    let config = vars(&[("WORKSPACE_GC_DELETION_PROOF_ROUND_INTERVAL", "500ms")]).unwrap();
    assert_eq!(
        config.deletion.proof_round_interval,
        std::time::Duration::from_millis(500)
    );
}

/// Provenance is the operator's contract by default, and each key only widens it: a name
/// suffix or a trusted manager the file did not list, or trusting claims without managed
/// fields, is named at start; dropping one is not. An empty suffix (every name) is refused.
#[test]
fn widening_provenance_is_named_and_an_empty_suffix_refused() {
    let base = Config::default();
    let policy = base.policy();
    assert_eq!(policy.provenance.claim_suffixes, ["-build-workspace"]);
    assert!(policy.provenance.label_managers.is_empty() && !policy.provenance.trust_unrecorded);
    let widened = vars(&[
        (
            "WORKSPACE_GC_PROVENANCE_CLAIM_SUFFIXES",
            "-build-workspace,-ws",
        ),
        (
            "WORKSPACE_GC_PROVENANCE_LABEL_MANAGERS",
            "argocd-controller",
        ),
        ("WORKSPACE_GC_PROVENANCE_TRUST_UNRECORDED", "true"),
    ])
    .unwrap();
    let warnings = widened.widenings(&base);
    for key in [
        "provenance.claim_suffixes",
        "provenance.label_managers",
        "provenance.trust_unrecorded",
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(&format!("{key} is overridden"))),
            "{key}: {warnings:?}"
        );
    }
    assert_eq!(
        widened.policy().provenance.label_managers,
        ["argocd-controller"]
    );
    assert!(
        base.widenings(&widened).is_empty(),
        "narrowing is not named"
    );
    for odd in ["\"\"", "\"-Build\"", "\"a b\""] {
        rejected(
            file(&format!("[provenance]\nclaim_suffixes = [{odd}]\n")),
            "config.toml:2: provenance.claim_suffixes: ",
            "is not a claim name suffix",
        );
    }
    rejected(
        file("[provenance]\nlabel_managers = [\" \"]\n"),
        "config.toml:2: provenance.label_managers: ",
        "is not a field manager name",
    );
}
