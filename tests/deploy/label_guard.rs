//! The label guard (issue 55) in every install: nobody adds the build-workspace label to a claim
//! that exists without it but the identities of `provenance.label_writers`, none as shipped. The
//! base and the audit overlay carry it cluster-wide, the namespaced overlay bound to its watched
//! namespaces with the right to read it, the chart as the manifests do, and the OLM bundle, which
//! cannot carry a ValidatingAdmissionPolicy, the right to read it and the word to install it
//! apart. Applied with the base, the API server refuses a label added later, with the rule's
//! message, and admits a claim made with it.

use std::process::Command;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use testkit::{ClaimBuilder, ControlPlane, Rendered, TestNamespace, manifests};

use crate::rbac::{grants, label_guard_read};
use crate::server::apply_base;
use crate::{BINARY, LABEL_GUARD, NAMESPACE, ROOT, WATCHED, secs};

/// The label guard's policy as printed for the shipped configuration: every user refused
/// (no writers), the rule named, and what to do said.
fn assert_refuses_everyone(policy: &Value) {
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["UPDATE"]),
        "creating a labelled claim is not matched"
    );
    let validation = &spec["validations"][0];
    assert_eq!(validation["expression"], "request.userInfo.username in []");
    let message = validation["message"].as_str().unwrap();
    assert!(
        message.starts_with("workspace-gc admission guard: rule label-only-at-creation: "),
        "{message}"
    );
    assert!(
        message.contains("Create the claim with the label")
            && message.contains("provenance.label_writers"),
        "the refusal says what to do: {message}"
    );
}

/// `policy` without the labels an install adds (the chart's, the namespaced overlay's mark).
fn unlabelled(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("labels");
        metadata.remove("namespace");
    }
    object
}

/// What `workspace-gc admission-policy` prints with `args`, parsed.
fn printed(args: &[&str]) -> Rendered {
    let output = Command::new(BINARY)
        .arg("--config")
        .arg(manifests("base/config.toml"))
        .arg("admission-policy")
        .args(args)
        .env_clear()
        .output()
        .expect("run admission-policy");
    assert!(output.status.success(), "{output:?}");
    Rendered::parse(&String::from_utf8_lossy(&output.stdout))
}

#[test]
fn the_label_guard_renders_in_the_base_the_audit_and_the_namespaced_overlay_and_the_bundle() {
    // The base: cluster-wide, denying, and readable by the daemon by name.
    let base = Rendered::of(&manifests("base"));
    let policy = base.get("ValidatingAdmissionPolicy", LABEL_GUARD);
    assert_refuses_everyone(policy);
    let binding = base.get("ValidatingAdmissionPolicyBinding", LABEL_GUARD);
    assert_eq!(binding["spec"]["policyName"], LABEL_GUARD);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(
        binding["spec"]["matchResources"],
        Value::Null,
        "every namespace"
    );
    let rules = grants(&base.get("ClusterRole", "workspace-gc")["rules"]);
    assert!(rules.is_superset(&label_guard_read()), "{rules:?}");

    // The audit overlay: the same two objects.
    let audit = Rendered::of(&manifests("overlays/audit"));
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert_eq!(audit.get(kind, LABEL_GUARD), base.get(kind, LABEL_GUARD));
    }

    // The namespaced overlay: the same policy, its binding limited to the watched namespaces as
    // `admission-policy --namespace=...` binds it, and a ClusterRole to read the two.
    let namespaced = Rendered::of(&manifests("overlays/namespaced"));
    assert_eq!(
        unlabelled(namespaced.get("ValidatingAdmissionPolicy", LABEL_GUARD)),
        unlabelled(policy)
    );
    let flags: Vec<String> = WATCHED
        .iter()
        .map(|ns| format!("--namespace={ns}"))
        .collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let scoped = printed(&flags);
    assert_eq!(
        unlabelled(namespaced.get("ValidatingAdmissionPolicyBinding", LABEL_GUARD)),
        unlabelled(scoped.get("ValidatingAdmissionPolicyBinding", LABEL_GUARD)),
    );
    assert_eq!(
        namespaced.get("ValidatingAdmissionPolicyBinding", LABEL_GUARD)["spec"]["matchResources"],
        json!({"namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": WATCHED,
        }]}})
    );
    assert_eq!(
        grants(&namespaced.get("ClusterRole", LABEL_GUARD)["rules"]),
        label_guard_read()
    );
    let reader = namespaced.get("ClusterRoleBinding", LABEL_GUARD);
    assert_eq!(reader["roleRef"]["name"], LABEL_GUARD);
    assert_eq!(
        reader["subjects"],
        json!([{ "kind": "ServiceAccount", "name": "workspace-gc", "namespace": NAMESPACE }])
    );

    // The bundle cannot carry a ValidatingAdmissionPolicy (registry+v1): its ClusterRole may
    // read the label guard, and its description says to install it apart.
    let csv = std::fs::read_to_string(
        std::path::Path::new(ROOT).join("bundle/manifests/workspace-gc.clusterserviceversion.yaml"),
    )
    .expect("read the CSV");
    let csv: Value = serde_saphyr::from_str(&csv).expect("the CSV is YAML");
    let permissions = &csv["spec"]["install"]["spec"]["clusterPermissions"][0]["rules"];
    assert!(grants(permissions).is_superset(&label_guard_read()));
    let description = csv["spec"]["description"].as_str().unwrap();
    assert!(
        description.contains("the label guard")
            && description.contains("workspace_gc_label_guard_installed 0"),
        "{description}"
    );
}

/// `helm template` of the chart with `values`.
fn chart(values: &[&str]) -> Rendered {
    let home = tempfile::tempdir().expect("a helm home");
    let output = Command::new(testkit::helm_binary())
        .args(["template", "wg"])
        .arg(std::path::Path::new(ROOT).join("charts/workspace-gc"))
        .args(["--namespace", NAMESPACE])
        .args(values)
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "helm template {values:?}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Rendered::parse(&String::from_utf8_lossy(&output.stdout))
}

/// The chart with its default values renders the manifests' label guard; in namespaced mode,
/// the namespaced overlay's; a writer listed in the configuration needs a guard printed for it.
#[test]
fn the_charts_default_and_namespaced_installs_render_the_label_guard() {
    let base = Rendered::of(&manifests("base"));
    let default = chart(&[]);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert_eq!(
            unlabelled(default.get(kind, LABEL_GUARD)),
            unlabelled(base.get(kind, LABEL_GUARD)),
            "{kind}"
        );
    }
    let rules = grants(&default.get("ClusterRole", "workspace-gc")["rules"]);
    assert!(rules.is_superset(&label_guard_read()), "{rules:?}");

    let namespaced = chart(&["--set", "namespaced.namespaces={team-a,team-b}"]);
    let overlay = Rendered::of(&manifests("overlays/namespaced"));
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        let object = namespaced.get(kind, LABEL_GUARD);
        assert_eq!(
            object["metadata"]["labels"]["app.kubernetes.io/component"],
            "label-guard"
        );
        assert_eq!(
            unlabelled(object),
            unlabelled(overlay.get(kind, LABEL_GUARD))
        );
    }
    assert_refuses_everyone(namespaced.get("ValidatingAdmissionPolicy", LABEL_GUARD));
}

/// Applied with the base, as the README says, the label guard is in force for everyone: a label
/// added to an existing claim, by a merge patch as `kubectl label` sends or by a server-side
/// apply, is refused with the rule's message; a claim made with it is admitted.
#[tokio::test(flavor = "multi_thread")]
async fn the_label_guard_applied_with_the_base_refuses_a_label_added_later() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let ns = TestNamespace::new(control_plane, "deploy-label-guard").await;
    ClaimBuilder::build_workspace("made-build-workspace")
        .create(&ns)
        .await;
    ClaimBuilder::build_workspace("later-build-workspace")
        .without_label(testkit::BUILD_WORKSPACE_LABEL)
        .create(&ns)
        .await;
    let claims = ns.api::<PersistentVolumeClaim>();
    let label = json!({"metadata": {"labels": {testkit::BUILD_WORKSPACE_LABEL: "true"}}});
    let refused = |answer: Result<PersistentVolumeClaim, kube::Error>| match answer {
        Err(kube::Error::Api(status)) => {
            status.code == 403 && status.message.contains("rule label-only-at-creation")
        }
        _ => false,
    };
    // In force once the API server has loaded it: probed with dry runs, which change nothing.
    let patch = Patch::Merge(label);
    let probe = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    assert!(
        testkit::wait_until(secs(30), || async {
            refused(claims.patch("later-build-workspace", &probe, &patch).await)
        })
        .await,
        "the label guard did not come into force"
    );
    let answer = claims
        .patch("later-build-workspace", &PatchParams::default(), &patch)
        .await;
    assert!(refused(answer), "a label added later is refused");
    let apply = Patch::Apply(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "later-build-workspace",
                     "labels": {testkit::BUILD_WORKSPACE_LABEL: "true"}},
    }));
    let answer = claims
        .patch(
            "later-build-workspace",
            &PatchParams::apply("gitops").force(),
            &apply,
        )
        .await;
    assert!(refused(answer), "a server-side apply adding it is refused");
    let claim = claims.get("later-build-workspace").await.unwrap();
    let labels = claim.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key(testkit::BUILD_WORKSPACE_LABEL));
}
