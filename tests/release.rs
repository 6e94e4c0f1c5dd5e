//! The release end to end (scripts/release, docs/release.md): pushed to a local OCI registry
//! (`crane registry serve`), signed with a key this test generates, verified with cosign as a
//! platform team verifies it, a tampered tag refused, and the chart installed from the registry
//! onto a real node (`scripts/control-plane up --node`), whose containerd pulls the image by
//! digest from that registry.
//!
//! The lane needs root, a node and cosign (built once from the Go module proxy), so it runs
//! only when asked (`CONTROL_PLANE_RELEASE=1`, as scripts/test's release lane sets); otherwise
//! it says it was skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;
use testkit::{ControlPlane, helm_binary, kubectl, release_tool, wait_until};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_workspace-gc");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const NAMESPACE: &str = "workspace-gc";
/// The node's bridge address (scripts/lib/node.bash, NODE_GATEWAY): not a loopback address.
const NODE_ADDRESS: &str = "10.244.0.1";
/// What hack/image/rootfs puts in the base, as Debian names the packages.
const BASE_PACKAGES: [&str; 5] = ["base-files", "libc6", "libgcc-s1", "netbase", "tzdata"];

fn release_lane(test: &str) -> bool {
    let requested = std::env::var("CONTROL_PLANE_RELEASE").is_ok_and(|v| v == "1");
    if !requested {
        eprintln!(
            "SKIPPED {test}: the release lane builds cosign, pushes to a local registry and \
             runs a node (root); run it with CONTROL_PLANE_RELEASE=1 (scripts/test's release lane)"
        );
    }
    requested
}

/// go-containerregistry's registry (`crane registry serve`) on a free port of `host`, plain
/// HTTP, blobs on disk, every request in its log. Stopped when dropped.
struct Registry {
    child: Child,
    address: String,
    log: PathBuf,
}

impl Registry {
    fn start(dir: &Path, host: &str) -> Registry {
        let log = dir.join("registry.log");
        let disk = dir.join("registry");
        std::fs::create_dir_all(&disk).unwrap();
        let child = Command::new(release_tool("crane"))
            .args([
                "registry",
                "serve",
                "--address",
                &format!("{host}:0"),
                "--disk",
            ])
            .arg(&disk)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start crane registry serve");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .find_map(|l| Some(l.split("serving on port ").nth(1)?.trim().to_owned()))
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "the registry did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Registry {
            child,
            address: format!("{host}:{port}"),
            log,
        }
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(program)
        .args(args)
        // The registry is local: never through a proxy from the environment.
        .env("NO_PROXY", format!("{NODE_ADDRESS},127.0.0.1,localhost"))
        .env("no_proxy", format!("{NODE_ADDRESS},127.0.0.1,localhost"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn succeeded(what: &str, output: &Output) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// cosign as a platform team runs it against this registry: a key, no transparency log (the
/// release signs with a key and records nothing in Rekor), plain HTTP.
fn cosign(args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend(["--allow-http-registry", "--allow-insecure-registry"]);
    run(&release_tool("cosign"), &all, &[("COSIGN_PASSWORD", "")])
}

fn verify(public_key: &str, reference: &str) -> Output {
    cosign(&[
        "verify",
        "--key",
        public_key,
        "--insecure-ignore-tlog=true",
        reference,
    ])
}

/// A cosign key pair in `dir`: (private, public).
fn key_pair(dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir).unwrap();
    let output = Command::new(release_tool("cosign"))
        .arg("generate-key-pair")
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        .stdin(Stdio::null())
        .output()
        .expect("run cosign generate-key-pair");
    succeeded("cosign generate-key-pair", &output);
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    (path("cosign.key"), path("cosign.pub"))
}

/// Every crate in Cargo.lock: (name, version).
fn locked_crates() -> BTreeSet<(String, String)> {
    let lock: toml::Table = std::fs::read_to_string(Path::new(ROOT).join("Cargo.lock"))
        .unwrap()
        .parse()
        .unwrap();
    let packages = lock["package"].as_array().expect("[[package]]");
    packages
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The SBOM's packages of one purl type (`cargo`, `deb`): (name, version).
fn listed(sbom: &Value, purl_type: &str) -> BTreeSet<(String, String)> {
    let prefix = format!("pkg:{purl_type}/");
    (sbom["packages"].as_array().expect("packages").iter())
        .filter(|p| {
            p["externalRefs"].as_array().into_iter().flatten().any(|r| {
                r["referenceType"] == "purl"
                    && r["referenceLocator"]
                        .as_str()
                        .is_some_and(|l| l.starts_with(&prefix))
            })
        })
        .map(|p| {
            let field = |key: &str| p[key].as_str().unwrap_or_default().to_owned();
            (field("name"), field("versionInfo"))
        })
        .collect()
}

/// The in-toto statement of `reference`'s attestation of `predicate_type`, once
/// `cosign verify-attestation` has verified it with `public_key` (its output: one DSSE envelope
/// per line, the payload the statement).
fn attested(public_key: &str, reference: &str, predicate_type: &str) -> Value {
    let output = succeeded(
        &format!("cosign verify-attestation --type {predicate_type}"),
        &cosign(&[
            "verify-attestation",
            "--key",
            public_key,
            "--insecure-ignore-tlog=true",
            "--type",
            predicate_type,
            reference,
        ]),
    );
    let envelope: Value = serde_json::from_str(output.lines().next().expect("an attestation"))
        .expect("a DSSE envelope");
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().expect("a payload"))
        .expect("base64");
    serde_json::from_slice(&payload).expect("an in-toto statement")
}

/// The output of `program args` run in the repository.
fn in_repository(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    succeeded(program, &output).trim().to_owned()
}

fn helm(args: &[&str], home: &Path) -> Output {
    let home = home.to_str().unwrap().to_owned();
    run(
        &helm_binary(),
        args,
        &[
            ("HELM_CONFIG_HOME", &format!("{home}/config")),
            ("HELM_CACHE_HOME", &format!("{home}/cache")),
            ("HELM_DATA_HOME", &format!("{home}/data")),
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn release_is_signed_verified_and_installed_from_the_registry() {
    if !release_lane("release_is_signed_verified_and_installed_from_the_registry") {
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("release-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a scratch directory");
    let dir = scratch.path();
    // The node first: the registry listens on the node's bridge address, as a registry on
    // another host would be reached. containerd speaks plain HTTP to a registry on a loopback
    // address by itself, but to this one only as its hosts.toml (trust-registry) says.
    let control_plane = ControlPlane::start_with_node(&[]);
    let registry = Registry::start(dir, NODE_ADDRESS);
    let registry_address = registry.address.clone();
    let trust = Command::new(Path::new(ROOT).join("scripts/control-plane"))
        .args(["trust-registry", &registry_address, "--dir"])
        .arg(control_plane.dir())
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/control-plane trust-registry");
    succeeded("trust-registry", &trust);
    let (private_key, public_key) = key_pair(&dir.join("keys"));

    // --- the release ---
    let out = dir.join("out");
    let start = Instant::now();
    let output = run(
        &Path::new(ROOT).join("scripts/release"),
        &[
            "--registry",
            &registry_address,
            "--plain-http",
            "--key",
            &private_key,
            "--binary",
            BINARY,
            "--out",
            out.to_str().unwrap(),
        ],
        &[("COSIGN_PASSWORD", "")],
    );
    let stdout = succeeded("scripts/release", &output);
    eprintln!("scripts/release took {:?}", start.elapsed());
    let image_ref = stdout
        .lines()
        .last()
        .expect("the image reference")
        .to_owned();
    let image = format!("{registry_address}/workspace-gc");
    let digest = image_ref
        .strip_prefix(&format!("{image}@"))
        .unwrap_or_else(|| panic!("{image_ref} is not {image}@DIGEST"))
        .to_owned();
    assert!(digest.starts_with("sha256:"), "{image_ref}");
    assert_eq!(
        std::fs::read_to_string(out.join("image-ref"))
            .unwrap()
            .trim(),
        image_ref
    );
    // The OLM bundle of the release runs the image it pushed, by digest.
    let csv = std::fs::read_to_string(
        out.join("bundle/manifests/workspace-gc.clusterserviceversion.yaml"),
    )
    .expect("the release writes the OLM bundle");
    assert!(csv.contains(&image_ref), "the bundle names {image_ref}");
    assert!(!csv.contains("registry.example.com"), "no placeholder left");
    let chart_ref = std::fs::read_to_string(out.join("chart-ref"))
        .unwrap()
        .trim()
        .to_owned();
    let crane = release_tool("crane");
    let index: Value = serde_json::from_str(&succeeded(
        "crane manifest",
        &run(&crane, &["manifest", "--insecure", &image_ref], &[]),
    ))
    .unwrap();
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms = index["manifests"].as_array().expect("manifests");
    assert!(!platforms.is_empty(), "{index}");
    for platform in platforms {
        assert_eq!(platform["platform"]["os"], "linux", "{index}");
    }
    // This host's platform, as OCI names it, is one of them (the only one built here).
    let host = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert!(
        platforms
            .iter()
            .any(|p| p["platform"]["architecture"] == host),
        "{index}"
    );

    // --- verification: the image by digest and by its tag, each platform's image ---
    let tag = format!("{image}:{VERSION}");
    for reference in [image_ref.as_str(), tag.as_str()] {
        let verified = succeeded(
            &format!("cosign verify {reference}"),
            &verify(&public_key, reference),
        );
        assert!(verified.contains(&digest), "{verified}");
    }
    for platform in platforms {
        let reference = format!("{image}@{}", platform["digest"].as_str().unwrap());
        succeeded(
            &format!("cosign verify {reference}"),
            &verify(&public_key, &reference),
        );
    }

    // --- the SBOM: attested and signed, naming this image, listing every crate and package ---
    let statement = attested(&public_key, &image_ref, "spdxjson");
    assert_eq!(statement["predicateType"], "https://spdx.dev/Document");
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        digest.trim_start_matches("sha256:")
    );
    let sbom = &statement["predicate"];
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let crates = listed(sbom, "cargo");
    let missing: Vec<_> = locked_crates().difference(&crates).cloned().collect();
    assert!(
        missing.is_empty(),
        "crates of Cargo.lock not in the SBOM: {missing:?}"
    );
    let debs = listed(sbom, "deb");
    for package in BASE_PACKAGES {
        assert!(
            debs.iter().any(|(name, _)| name == package),
            "{package} not in the SBOM: {debs:?}"
        );
    }
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sbom.spdx.json")).unwrap())
            .unwrap();
    assert_eq!(&written, sbom, "the attested SBOM is the one written");

    // --- the provenance: attested and signed, naming this commit and Cargo.lock ---
    let statement = attested(&public_key, &image_ref, "slsaprovenance1");
    assert_eq!(statement["predicateType"], "https://slsa.dev/provenance/v1");
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        digest.trim_start_matches("sha256:")
    );
    let dependencies = &statement["predicate"]["buildDefinition"]["resolvedDependencies"];
    assert_eq!(
        dependencies[0]["digest"]["gitCommit"],
        in_repository("git", &["rev-parse", "HEAD"]),
        "{statement}"
    );
    let lock = in_repository("sha256sum", &["Cargo.lock"]);
    assert_eq!(
        Some(
            dependencies[1]["digest"]["sha256"]
                .as_str()
                .unwrap_or_default()
        ),
        lock.split_whitespace().next(),
        "{statement}"
    );

    // --- the chart: signed, its version Cargo.toml's, the image pinned by digest ---
    succeeded(
        &format!("cosign verify {chart_ref}"),
        &verify(&public_key, &chart_ref),
    );
    let helm_home = dir.join("helm");
    let chart_url = format!("oci://{registry_address}/charts/workspace-gc");
    // `helm show chart|values` of the pushed chart.
    let show = |what: &str| {
        let args = [
            "show",
            what,
            &chart_url,
            "--version",
            VERSION,
            "--plain-http",
        ];
        succeeded(&format!("helm show {what}"), &helm(&args, &helm_home))
    };
    let chart = show("chart");
    for field in ["version", "appVersion"] {
        assert!(
            chart.contains(&format!("\n{field}: {VERSION}\n")),
            "{chart}"
        );
    }
    let values = show("values");
    for pin in [
        format!("repository: {image}"),
        format!("digest: \"{digest}\""),
    ] {
        assert!(values.contains(&format!("\n  {pin}\n")), "{values}");
    }

    // --- a tampered tag: another image under the release's tag, signed with another key ---
    let tampered = succeeded(
        "crane mutate",
        &run(
            &crane,
            &[
                "mutate",
                "--insecure",
                &format!("{image}@{}", platforms[0]["digest"].as_str().unwrap()),
                "--label",
                "tampered=true",
                "--tag",
                &tag,
            ],
            &[],
        ),
    );
    let (other_key, _) = key_pair(&dir.join("other-keys"));
    succeeded(
        "cosign sign (the other key)",
        &cosign(&[
            "sign",
            "--yes",
            "--key",
            &other_key,
            "--tlog-upload=false",
            tampered.trim(),
        ]),
    );
    let refused = verify(&public_key, &tag);
    assert!(
        !refused.status.success(),
        "cosign verified the tampered tag:\n{}",
        String::from_utf8_lossy(&refused.stdout)
    );
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(
        reason.contains("no matching signatures"),
        "refused for another reason:\n{reason}"
    );

    // --- installed from the registry onto the node, the image pulled by digest ---
    kubectl(&control_plane, &["create", "namespace", NAMESPACE]);
    // What the registry is asked from here on: the node's pulls (helm fetches only the chart).
    let before_install = registry.requests().len();
    let kubeconfig = control_plane.kubeconfig_path().to_str().unwrap().to_owned();
    succeeded(
        "helm install",
        &helm(
            &[
                "install",
                "wg",
                &chart_url,
                "--version",
                VERSION,
                "--plain-http",
                "--namespace",
                NAMESPACE,
                "--kubeconfig",
                &kubeconfig,
            ],
            &helm_home,
        ),
    );
    let pods: Api<Pod> = Api::namespaced(control_plane.client(), NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/name=workspace-gc");
    let ready = wait_until(Duration::from_secs(120), || async {
        let Ok(list) = pods.list(&selector).await else {
            return false;
        };
        list.items.len() == 2 && list.items.iter().all(is_ready)
    })
    .await;
    assert!(
        ready,
        "two ready pods of the released image:\n{}{}",
        kubectl(&control_plane, &["get", "pods", "-A", "-o", "wide"]),
        kubectl(&control_plane, &["get", "events", "-n", NAMESPACE])
    );
    for pod in pods.list(&selector).await.unwrap().items {
        let spec_image = pod.spec.as_ref().unwrap().containers[0].image.clone();
        assert_eq!(spec_image.as_deref(), Some(image_ref.as_str()));
        let status = &pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert_eq!(status.image_id, image_ref, "the node ran what was signed");
    }
    // containerd asked the registry for the index by its digest (the node had only its pause
    // and busybox images before), and never for the tag.
    let requests = registry.requests().split_off(before_install);
    assert!(
        requests.contains(&format!("/v2/workspace-gc/manifests/{digest}")),
        "the registry saw no pull of {digest}:\n{requests}"
    );
    assert!(
        !requests.contains(&format!("/v2/workspace-gc/manifests/{VERSION}")),
        "the node asked for the tag:\n{requests}"
    );
}

fn is_ready(pod: &Pod) -> bool {
    (pod.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
