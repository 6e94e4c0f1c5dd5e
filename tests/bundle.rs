//! The OLM bundle (bundle/) against the kustomize base, its reference, as tests/cluster/helm.rs holds
//! the chart to it: its ClusterServiceVersion carries the base's Deployment, ClusterRole and
//! Role, the image pinned by digest, and the base's other objects OLM can install, with nothing
//! left out unsaid; `scripts/bundle generate` reproduces it; and it passes the validators of
//! `operator-sdk bundle validate --select-optional suite=operatorframework` (hack/bundle, built
//! and cached by scripts/control-plane; operator-sdk itself cannot be built from the module
//! proxy, which refuses its go.mod).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use testkit::{Rendered, manifests};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn bundle_dir() -> PathBuf {
    Path::new(ROOT).join("bundle")
}

/// The objects of `dir/manifests`, by file name.
fn bundle_objects(dir: &Path) -> BTreeMap<String, Value> {
    let entries = std::fs::read_dir(dir.join("manifests")).expect("bundle/manifests");
    entries
        .map(|entry| {
            let path = entry.expect("a bundle file").path();
            let text = std::fs::read_to_string(&path).expect("read a bundle file");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_saphyr::from_str(&text).expect("a YAML object"))
        })
        .collect()
}

/// `scripts/bundle ARGS`.
fn bundle_script(args: &[&str]) -> Output {
    Command::new(Path::new(ROOT).join("scripts/bundle"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/bundle")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The base's objects OLM installs as they are (without a namespace: OLM puts them in the
/// operator's); the rest is in the CSV, made by OLM from it, or installed apart.
const CARRIED: [&str; 4] = [
    "ConfigMap",
    "Service",
    "PodDisruptionBudget",
    "NetworkPolicy",
];
/// OLM makes these from the CSV (the namespace is the OperatorGroup's).
const MADE_BY_OLM: [&str; 3] = ["Namespace", "ServiceAccount", "ClusterRoleBinding"];
/// registry+v1 cannot carry them: docs/openshift.md says how to install the guard.
const INSTALLED_APART: [&str; 2] = [
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

fn digest_pinned(image: &str) -> bool {
    image.split_once("@sha256:").is_some_and(|(name, digest)| {
        !name.is_empty()
            && digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Where the bundle in `objects` does not carry what `base` renders, one line each.
fn differences(objects: &BTreeMap<String, Value>, base: &Rendered) -> Vec<String> {
    let mut found = Vec::new();
    let mut say = |what: String| found.push(what);
    let csvs: Vec<&Value> = (objects.values())
        .filter(|o| o["kind"] == "ClusterServiceVersion")
        .collect();
    let [csv] = csvs[..] else {
        return vec![format!(
            "{} ClusterServiceVersions, expected one",
            csvs.len()
        )];
    };
    let spec = &csv["spec"];
    if spec["version"] != VERSION || csv["metadata"]["name"] != format!("workspace-gc.v{VERSION}") {
        say(format!(
            "CSV version {} is not Cargo.toml's {VERSION}",
            spec["version"]
        ));
    }
    let supported: Vec<&Value> = (spec["installModes"].as_array().into_iter().flatten())
        .filter(|mode| mode["supported"] == true)
        .map(|mode| &mode["type"])
        .collect();
    // A ClusterRole and a configuration choosing the namespaces: one install serves them all.
    if supported != [&json!("AllNamespaces")] {
        say(format!(
            "install modes {supported:?}, expected AllNamespaces only"
        ));
    }
    let install = &spec["install"]["spec"];

    // The Deployment, its image pinned by digest and named as the related image.
    let deployment = base.deployment();
    let deployments = install["deployments"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let [carried] = &deployments[..] else {
        return vec![format!(
            "{} deployments in the CSV, expected one",
            deployments.len()
        )];
    };
    let mut carried_spec = carried["spec"].clone();
    let containers = carried_spec["template"]["spec"]["containers"].as_array_mut();
    for container in containers.into_iter().flatten() {
        let image = container["image"].as_str().unwrap_or_default().to_owned();
        let related = (spec["relatedImages"].as_array().into_iter().flatten())
            .any(|related| related["image"] == image.as_str());
        if !digest_pinned(&image)
            || !related
            || csv["metadata"]["annotations"]["containerImage"] != image.as_str()
        {
            say(format!(
                "image {image} is not pinned by digest, a related image and the containerImage"
            ));
        }
        container["image"] = base.container()["image"].clone();
    }
    if carried["name"] != deployment["metadata"]["name"] || carried_spec != deployment["spec"] {
        say(format!(
            "the Deployment differs: bundle {:#}\nbase {:#}",
            carried_spec, deployment["spec"]
        ));
    }

    // The RBAC, for the ServiceAccount the base binds and the Deployment runs as.
    let account = &base.only("ClusterRoleBinding")["subjects"][0]["name"];
    if deployment["spec"]["template"]["spec"]["serviceAccountName"] != *account {
        say("the base's Deployment runs as another ServiceAccount than it binds".to_owned());
    }
    for (field, kind) in [
        ("clusterPermissions", "ClusterRole"),
        ("permissions", "Role"),
    ] {
        let expected = json!([{"serviceAccountName": account, "rules": base.only(kind)["rules"]}]);
        if install[field] != expected {
            say(format!(
                "{field} differ from the base's {kind}: bundle {:#}\nbase {expected:#}",
                install[field]
            ));
        }
    }

    // Every other object of the base: carried as it is, made by OLM, or installed apart.
    let mut rest: Vec<Value> = (objects.values())
        .filter(|o| o["kind"] != "ClusterServiceVersion")
        .cloned()
        .collect();
    for object in &base.0 {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = &object["metadata"]["name"];
        if CARRIED.contains(&kind) {
            let mut expected = object.clone();
            expected["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("namespace");
            match rest.iter().position(|o| *o == expected) {
                Some(at) => drop(rest.remove(at)),
                None => say(format!(
                    "the base's {kind} {name} is not in the bundle as it is"
                )),
            }
        } else if !["Deployment", "ClusterRole", "Role", "RoleBinding"].contains(&kind)
            && !MADE_BY_OLM.contains(&kind)
            && !INSTALLED_APART.contains(&kind)
        {
            say(format!("the base's {kind} {name} is carried nowhere"));
        }
    }
    for object in rest {
        say(format!(
            "the bundle's {} {} is not the base's",
            object["kind"], object["metadata"]["name"]
        ));
    }
    found
}

/// The committed bundle carries the base.
#[test]
fn the_bundle_carries_the_base() {
    let base = Rendered::of(&manifests("base"));
    let found = differences(&bundle_objects(&bundle_dir()), &base);
    assert!(
        found.is_empty(),
        "bundle/ has drifted from manifests/base; run scripts/bundle generate:\n{}",
        found.join("\n")
    );
    let annotations = std::fs::read_to_string(bundle_dir().join("metadata/annotations.yaml"))
        .expect("bundle/metadata/annotations.yaml");
    let annotations: Value = serde_saphyr::from_str(&annotations).unwrap();
    let annotations = &annotations["annotations"];
    assert_eq!(
        annotations["operators.operatorframework.io.bundle.mediatype.v1"],
        "registry+v1"
    );
    assert_eq!(
        annotations["operators.operatorframework.io.bundle.package.v1"],
        "workspace-gc"
    );
}

/// The comparison sees a difference in each part it compares.
#[test]
fn parity_check_reports_a_changed_base() {
    let objects = bundle_objects(&bundle_dir());
    let base = Rendered::of(&manifests("base"));
    fn find(objects: &[Value], kind: &str) -> usize {
        objects.iter().position(|o| o["kind"] == kind).unwrap()
    }
    type Change = fn(&mut Vec<Value>);
    let cases: [(&str, Change); 5] = [
        ("the Deployment differs", |o| {
            let at = find(o, "Deployment");
            o[at]["spec"]["replicas"] = json!(3);
        }),
        ("clusterPermissions differ", |o| {
            let at = find(o, "ClusterRole");
            o[at]["rules"][0]["verbs"] = json!(["list", "watch", "delete", "patch", "get"]);
        }),
        ("permissions differ", |o| {
            let at = find(o, "Role");
            o[at]["rules"][1]["verbs"] = json!(["create", "delete"]);
        }),
        ("Service", |o| {
            let at = find(o, "Service");
            o[at]["spec"]["ports"][0]["port"] = json!(9090);
        }),
        ("carried nowhere", |o| {
            o.push(json!({"kind": "Secret", "metadata": {"name": "extra"}}))
        }),
    ];
    for (expected, change) in cases {
        let mut changed = base.clone();
        change(&mut changed.0);
        let found = differences(&objects, &changed);
        assert!(
            found.iter().any(|d| d.contains(expected)),
            "{expected}: {found:#?}"
        );
    }
}

/// `scripts/bundle generate` writes exactly the committed bundle: nothing edited by hand, and
/// the README or docs index it describes unchanged since.
#[test]
fn generation_reproduces_the_committed_bundle() {
    let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = out.path().join("bundle");
    let generated = bundle_script(&["generate", "--out", dir.to_str().unwrap()]);
    assert!(generated.status.success(), "{}", text(&generated));
    for sub in ["manifests", "metadata"] {
        let files = |root: &Path| -> BTreeMap<String, String> {
            (std::fs::read_dir(root.join(sub)).unwrap())
                .map(|e| {
                    let path = e.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(&path).unwrap())
                })
                .collect()
        };
        assert!(
            files(&dir) == files(&bundle_dir()),
            "bundle/{sub} is not what scripts/bundle generate writes; run it"
        );
    }
    // The image must be pinned by digest.
    let tag = bundle_script(&[
        "generate",
        "--out",
        dir.to_str().unwrap(),
        "--image",
        "x/y:1",
    ]);
    assert!(!tag.status.success());
    assert!(
        text(&tag).contains("not pinned by digest"),
        "{}",
        text(&tag)
    );
}

/// The one warning the validators give, and why it is wrong: the deprecated-API check flags
/// any RBAC rule on `events.k8s.io` `events`, since a rule names no version; only
/// `events.k8s.io/v1beta1` went in 1.25, and the daemon writes `events.k8s.io/v1` (GA in 1.19).
const EVENTS_RULE_WARNING: &str = "Migrate the API(s) for events: \
    ([\"ClusterServiceVersion.Spec.InstallStrategy.StrategySpec.ClusterPermissions[0].Rules[5]\"])";

/// The bundle passes the validators with no error and no warning but the events rule's; a
/// broken copy fails them.
#[test]
fn the_bundle_passes_operator_sdk_validation() {
    let checked = bundle_script(&["validate", bundle_dir().to_str().unwrap()]);
    let report = text(&checked);
    assert!(checked.status.success(), "{report}");
    assert!(!report.contains("ERROR"), "{report}");
    let warnings: Vec<&str> = (report.lines())
        .filter(|line| line.starts_with("WARNING") && !line.ends_with(EVENTS_RULE_WARNING))
        .collect();
    assert_eq!(warnings, Vec::<&str>::new(), "{report}");
    let base = Rendered::of(&manifests("base"));
    let rule = &base.only("ClusterRole")["rules"][5];
    assert_eq!(
        rule["apiGroups"],
        json!(["events.k8s.io"]),
        "the rule the warning names"
    );

    let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let copy = out.path().join("bundle");
    let generated = bundle_script(&["generate", "--out", copy.to_str().unwrap()]);
    assert!(generated.status.success(), "{}", text(&generated));
    let csv = copy.join("manifests/workspace-gc.clusterserviceversion.yaml");
    let broken = std::fs::read_to_string(&csv)
        .unwrap()
        .replace("Storage, Integration & Delivery", "Garbage");
    std::fs::write(&csv, broken).unwrap();
    let refused = bundle_script(&["validate", copy.to_str().unwrap()]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("Garbage"), "{}", text(&refused));
}
