//! The HTTPS `/metrics` (`http.secure_listen`, `manifests/components/metrics-https`) on the real
//! API server: the daemon, running as a ServiceAccount with the component's review rights,
//! answers 401 without a token or with one the API server refuses, 403 to a ServiceAccount
//! without the reader role, and 200 to one bound to `workspace-gc-metrics-reader`; the plain
//! endpoint and the probes stay as they are; a real Prometheus scrapes it with a bearer token
//! over TLS, verifying the certificate; and a renewed certificate is served without a restart.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};
use testkit::{
    ClaimBuilder, ControlPlane, Daemon, TestNamespace, free_port, http_get, policy_rule,
    prometheus_binary, wait_until,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The component's RBAC objects, as shipped.
fn shipped_rbac() -> Vec<Value> {
    let path = Path::new(ROOT).join("manifests/components/metrics-https/rbac.yaml");
    let text = std::fs::read_to_string(path).expect("read rbac.yaml");
    serde_saphyr::from_multiple(&text).expect("YAML")
}

fn shipped_cluster_role(name: &str) -> ClusterRole {
    let object = shipped_rbac()
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("ClusterRole {name} in rbac.yaml"));
    serde_json::from_value(object).unwrap()
}

/// Binds ClusterRole `role` to ServiceAccount `namespace/account`.
async fn bind_cluster_role(client: &Client, role: &str, namespace: &str, account: &str) {
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{role}-{namespace}-{account}")),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the ClusterRoleBinding");
}

/// Waits until RBAC lets ServiceAccount `namespace/account` do what `spec` asks (a new binding
/// reaches the authorizer a moment after it is created).
async fn wait_allowed(client: &Client, namespace: &str, account: &str, spec: Value) {
    let mut spec = spec;
    spec["user"] = json!(format!("system:serviceaccount:{namespace}:{account}"));
    spec["groups"] = json!(["system:serviceaccounts", "system:authenticated"]);
    let review: SubjectAccessReview =
        serde_json::from_value(json!({ "spec": spec })).expect("a SubjectAccessReview");
    let reviews = Api::<SubjectAccessReview>::all(client.clone());
    assert!(
        wait_until(secs(30), || async {
            reviews
                .create(&PostParams::default(), &review)
                .await
                .ok()
                .and_then(|answer| answer.status)
                .is_some_and(|status| status.allowed)
        })
        .await,
        "RBAC allows {account}: {spec}"
    );
}

/// The bearer token in a kubeconfig written by `service_account_kubeconfig`.
fn token_of(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    text.lines()
        .find_map(|line| line.trim().strip_prefix("token: "))
        .expect("a token in the kubeconfig")
        .to_owned()
}

/// A self-signed serving certificate for 127.0.0.1, as (cert, key) paths.
fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let output = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=workspace-gc.test.svc"])
        .args([
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:workspace-gc.test.svc",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(output.status.success(), "openssl: {output:?}");
    (cert, key)
}

/// `GET https://127.0.0.1:port/metrics` with curl, verifying the certificate against `ca`: the
/// status and body, or `None` when no verified TLS connection was made.
async fn try_get_https(port: u16, ca: &Path, token: Option<&str>) -> Option<(u16, String)> {
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(ca)
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdin(Stdio::null());
    if let Some(token) = token {
        command
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"));
    }
    let output = command.output().await.expect("run curl");
    if !output.status.success() {
        return None; // no TLS connection: refused, or a certificate `ca` does not verify
    }
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    Some((code.parse().unwrap(), body.to_owned()))
}

async fn get_https(port: u16, ca: &Path, token: Option<&str>) -> (u16, String) {
    try_get_https(port, ca, token)
        .await
        .expect("curl reaches the HTTPS /metrics and verifies its certificate")
}

#[tokio::test(flavor = "multi_thread")]
async fn https_metrics_answer_only_authorised_callers_and_prometheus_scrapes_them() {
    let control_plane = ControlPlane::shared();
    let admin = control_plane.client();
    let ns = TestNamespace::new(control_plane, "metrics-https").await;
    ClaimBuilder::build_workspace("kept-build-workspace")
        .annotation("workspace-gc.mlops.dev/keep", "true")
        .create(&ns)
        .await;

    // The daemon's identity: its reads in this namespace, and the component's review rights.
    let role = Role {
        metadata: ObjectMeta {
            name: Some("workspace-gc".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            policy_rule(
                &[""],
                &["persistentvolumeclaims", "pods", "resourcequotas"],
                &["list", "watch"],
            ),
            policy_rule(
                &["mlops.mlops.dev"],
                &["notebookvalidationjobs"],
                &["get", "list", "watch"],
            ),
            policy_rule(
                &["tekton.dev"],
                &["pipelineruns", "taskruns"],
                &["list", "watch"],
            ),
        ]),
    };
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("create the Role");
    ns.bind_role("workspace-gc", "workspace-gc").await;
    let roles = Api::<ClusterRole>::all(admin.clone());
    for name in ["workspace-gc-metrics-auth", "workspace-gc-metrics-reader"] {
        roles
            .create(&PostParams::default(), &shipped_cluster_role(name))
            .await
            .unwrap_or_else(|e| panic!("create ClusterRole {name}: {e}"));
    }
    bind_cluster_role(
        &admin,
        "workspace-gc-metrics-auth",
        ns.name(),
        "workspace-gc",
    )
    .await;
    for resource in [
        json!({ "group": "authentication.k8s.io", "resource": "tokenreviews", "verb": "create" }),
        json!({ "group": "authorization.k8s.io", "resource": "subjectaccessreviews", "verb": "create" }),
    ] {
        let spec = json!({ "resourceAttributes": resource });
        wait_allowed(&admin, ns.name(), "workspace-gc", spec).await;
    }

    // A reader, and an account with no rights at all.
    let reader = token_of(
        &control_plane
            .service_account_kubeconfig(ns.name(), "scraper")
            .await,
    );
    bind_cluster_role(&admin, "workspace-gc-metrics-reader", ns.name(), "scraper").await;
    let get_metrics = json!({ "nonResourceAttributes": { "path": "/metrics", "verb": "get" } });
    wait_allowed(&admin, ns.name(), "scraper", get_metrics).await;
    let nobody = token_of(
        &control_plane
            .service_account_kubeconfig(ns.name(), "nobody")
            .await,
    );

    let scratch = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(scratch.path());
    let port = free_port();
    let mut config = ns.config();
    config.http.secure_listen = Some(([127, 0, 0, 1], port).into());
    config.http.tls_cert_file = Some(cert.clone());
    config.http.tls_key_file = Some(key);
    // The shipped rights beside the metrics component's.
    let daemon = Daemon::start(ns.daemon_client(&config).await, config, "https").await;

    assert_eq!(get_https(port, &cert, None).await.0, 401, "no token");
    assert_eq!(
        get_https(port, &cert, Some("not-a-token")).await.0,
        401,
        "a token the API server refuses"
    );
    assert_eq!(
        get_https(port, &cert, Some(&nobody)).await.0,
        403,
        "a ServiceAccount without the reader role"
    );
    let (status, body) = get_https(port, &cert, Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("workspace_gc_ready 1"), "{body}");
    // Plain HTTP keeps serving the probes and /metrics.
    assert_eq!(daemon.get("/readyz").await.0, 200);
    assert_eq!(daemon.get("/metrics").await.0, 200);
    assert_eq!(
        http_get(port, "/metrics").await.0,
        0,
        "no plain HTTP on the TLS port"
    );

    // A real Prometheus, with the reader's token and the certificate's CA.
    std::fs::write(scratch.path().join("token"), &reader).unwrap();
    let prometheus_config = json!({
        "global": { "scrape_interval": "1s" },
        "scrape_configs": [{
            "job_name": "workspace-gc",
            "scheme": "https",
            "authorization": { "type": "Bearer", "credentials_file": "token" },
            "tls_config": { "ca_file": cert, "server_name": "workspace-gc.test.svc" },
            "static_configs": [{ "targets": [format!("127.0.0.1:{port}")] }],
        }],
    });
    std::fs::write(
        scratch.path().join("prometheus.yml"),
        prometheus_config.to_string(),
    )
    .unwrap();
    let web = free_port();
    let log = std::fs::File::create(scratch.path().join("prometheus.log")).unwrap();
    let _prometheus = tokio::process::Command::new(prometheus_binary("prometheus"))
        .arg("--config.file=prometheus.yml")
        .arg("--storage.tsdb.path=data")
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let query = |expr: &'static str| async move {
        let (status, body) = http_get(web, &format!("/api/v1/query?query={expr}")).await;
        if status != 200 {
            return Vec::new();
        }
        let answer: Value = serde_json::from_str(&body).unwrap_or_default();
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let scraped = wait_until(secs(60), || async {
        let up = query("up").await;
        let ready = query("workspace_gc_ready").await;
        up.first().and_then(|s| s["value"][1].as_str()) == Some("1") && !ready.is_empty()
    })
    .await;
    let log = std::fs::read_to_string(scratch.path().join("prometheus.log")).unwrap_or_default();
    let targets = http_get(web, "/api/v1/targets").await.1;
    assert!(
        scraped,
        "Prometheus scraped over TLS with the token:\n{targets}\n{log}"
    );

    // A renewal, as the service CA and the kubelet make it: new files in place of the old ones.
    // The daemon serves the new certificate without a restart.
    let renewed = scratch.path().join("renewed");
    std::fs::create_dir(&renewed).unwrap();
    let (new_cert, new_key) = certificate(&renewed);
    let old_ca = scratch.path().join("old-ca.crt");
    std::fs::copy(&cert, &old_ca).unwrap();
    std::fs::rename(&new_key, scratch.path().join("tls.key")).unwrap();
    std::fs::rename(&new_cert, &cert).unwrap();
    assert!(
        wait_until(secs(40), || async {
            try_get_https(port, &cert, Some(&reader))
                .await
                .map(|(status, _)| status)
                == Some(200)
        })
        .await,
        "the renewed certificate is served"
    );
    assert_eq!(
        try_get_https(port, &old_ca, Some(&reader)).await,
        None,
        "the old certificate is not served any more"
    );
    daemon.stop().await;
}
