//! Pod security: every overlay's pod template is admissible under OpenShift's `restricted-v2`
//! SCC, and the base's pods pass the "restricted" Pod Security Standard its Namespace enforces
//! on a real API server.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::NAMESPACE;
use crate::monitoring::monitoring;
use crate::server::apply_base;
use testkit::{ControlPlane, Overlay, Rendered, manifests, restricted_v2_violations};

/// Every overlay's pod template is admissible under OpenShift's `restricted-v2` SCC. The check
/// itself refuses each thing that SCC refuses, starting with the UID this base used to pin.
#[test]
fn every_overlay_runs_under_openshift_restricted_v2() {
    let overlays = [
        ("base", Rendered::of(&manifests("base"))),
        ("overlays/audit", Rendered::of(&manifests("overlays/audit"))),
        (
            "overlays/namespaced",
            Rendered::of(&manifests("overlays/namespaced")),
        ),
        ("base + components/prometheus", monitoring()),
        (
            "base + components/metrics-https",
            Overlay::new(&["base"], &["components/metrics-https"], "").render(),
        ),
    ];
    for (name, rendered) in &overlays {
        let pod = &rendered.deployment()["spec"]["template"]["spec"];
        assert_eq!(
            restricted_v2_violations(pod),
            Vec::<String>::new(),
            "{name} under restricted-v2"
        );
    }

    let pod = &overlays[0].1.deployment()["spec"]["template"]["spec"];
    let refused = |pointer: &str, value: Value| {
        let mut changed = pod.clone();
        let (parent, field) = pointer.rsplit_once('/').unwrap();
        changed
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{parent} in the pod template"))
            .insert(field.to_owned(), value.clone());
        assert!(
            !restricted_v2_violations(&changed).is_empty(),
            "{pointer} = {value} is refused by restricted-v2"
        );
    };
    refused("/securityContext/runAsUser", json!(65532));
    refused("/securityContext/runAsGroup", json!(65532));
    refused("/securityContext/fsGroup", json!(65532));
    refused(
        "/securityContext/seLinuxOptions",
        json!({ "level": "s0:c1,c2" }),
    );
    refused("/hostNetwork", json!(true));
    refused(
        "/volumes/0/hostPath",
        json!({ "path": "/var/run/docker.sock" }),
    );
    let container = "/containers/0/securityContext";
    refused(&format!("{container}/runAsUser"), json!(0));
    refused(&format!("{container}/privileged"), json!(true));
    refused(
        &format!("{container}/allowPrivilegeEscalation"),
        json!(true),
    );
    refused(
        &format!("{container}/capabilities"),
        json!({ "add": ["SYS_ADMIN"], "drop": ["ALL"] }),
    );
    refused(&format!("{container}/capabilities"), json!({}));
    refused(
        &format!("{container}/seccompProfile"),
        json!({ "type": "Unconfined" }),
    );
    refused("/containers/0/ports/0/hostPort", json!(8080));
}

/// The Namespace enforces the "restricted" Pod Security Standard, and the Deployment's pods pass
/// it: a pod from its template is admitted (server-side dry run; no scheduler runs here), one
/// with privilege escalation allowed is not, which shows the check is live.
#[tokio::test(flavor = "multi_thread")]
async fn base_pods_pass_the_restricted_pod_security_standard() {
    let control_plane = ControlPlane::shared();
    apply_base(control_plane).await;
    let base = Rendered::of(&manifests("base"));
    let template = &base.deployment()["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "pod-security-check", "labels": template["metadata"]["labels"] },
        "spec": template["spec"],
    }))
    .expect("the template is a pod");
    let pods = Api::<Pod>::namespaced(control_plane.client(), NAMESPACE);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(error) = pods.create(&dry_run, &pod).await {
        panic!("a pod of the Deployment is not admitted: {error}");
    }

    let mut escalating = serde_json::to_value(&pod).unwrap();
    escalating["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
        json!(true);
    let escalating: Pod = serde_json::from_value(escalating).unwrap();
    match pods.create(&dry_run, &escalating).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(status.message.contains("PodSecurity"), "{status:?}");
        }
        other => panic!("an escalating pod was not refused: {other:?}"),
    }
}
