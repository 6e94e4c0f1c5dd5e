//! The generated graphs of tests/graphs.rs on the real API server: a few dozen graphs (fixed
//! seed) are created through the API, statuses through the status subresource, then the real
//! binary's `audit --output json` must give every claim the verdict and reason that the
//! in-memory daemon path gives the objects as read back from the server, and those must be
//! safe and live by the oracle. This proves the list → cache path agrees with the model.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use serde_json::Value;
use testkit::graph::{self, Graph, Profile, SERVER_POLICIES, Seen};
use testkit::oracle::World;
use testkit::{ControlPlane, TestNamespace, audit_rows};
use workspace_gc::cluster::resources::{job_resource, run_resource, task_run_resource};
use workspace_gc::decide::facts::ObjectKey;

/// How many graphs are applied; each holds one or two namespaces.
const GRAPHS: usize = 40;

/// Run statuses written by hand: generated graphs, with completion times hours ago, missing or
/// garbage, which real Tekton cannot produce.
#[tokio::test(flavor = "multi_thread")]
async fn the_binary_audits_generated_graphs_as_the_model_does() {
    // A control plane of its own, without kube-controller-manager: its garbage collector would
    // delete the claims whose generated owner references name no existing object.
    let control_plane = ControlPlane::start(false);
    let client = control_plane.client();
    let mut runner = TestRunner::deterministic();
    let strategy = graph::graph(Profile::Server);
    let graphs: Vec<Graph> = (0..GRAPHS)
        .map(|_| strategy.new_tree(&mut runner).expect("a graph").current())
        .collect();

    let now = Utc::now();
    let mut namespaces = Vec::new();
    for graph in &graphs {
        let mut names = Vec::new();
        for _ in &graph.namespaces {
            names.push(
                TestNamespace::new(&control_plane, "graph")
                    .await
                    .name()
                    .to_owned(),
            );
        }
        namespaces.push(names);
    }
    stream::iter(graphs.iter().zip(&namespaces))
        .for_each_concurrent(8, |(graph, names)| apply(&client, graph, names, now))
        .await;
    let all: Vec<String> = namespaces.into_iter().flatten().collect();
    let world = read_back(&client, &all).await;
    assert!(world.claims.len() > GRAPHS, "{} claims", world.claims.len());

    // The short policies need every claim past a 1 s orphan grace and max_age.
    let newest = (world.claims.iter())
        .filter_map(|c| c["metadata"]["creationTimestamp"].as_str())
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .max()
        .expect("claims have creation times");
    let wait = newest.to_utc() + chrono::Duration::seconds(3) - Utc::now();
    tokio::time::sleep(wait.to_std().unwrap_or_default()).await;

    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    for durations in SERVER_POLICIES {
        let rows = audit_rows(&control_plane, &all, durations).await;
        let now = Utc::now();
        let policy = graph::policy_of(durations);
        let index = graph::daemon_index(&world);
        let model = graph::daemon_decisions(&index, &graph::policies(&world, &policy), now);
        assert_eq!(rows.len(), model.len(), "{durations:?}: one row per claim");
        for row in &rows {
            let key = ObjectKey::new(text(&row["namespace"]), text(&row["name"]));
            let decision = model
                .get(&key)
                .unwrap_or_else(|| panic!("{durations:?}: {key} is audited but not read back"));
            let verdict = serde_json::to_value(decision).expect("a decision serializes");
            assert_eq!(
                (&row["verdict"], &row["reason"]),
                (&verdict["verdict"], &verdict["reason"]),
                "{durations:?}: {key}: the binary's audit and the model disagree\n{row:#}\n{}",
                claim_of(&world, &key)
            );
            *verdicts
                .entry(format!(
                    "{}/{}",
                    text(&row["verdict"]),
                    text(&row["reason"])
                ))
                .or_default() += 1;
        }
        let mut seen = Seen::default();
        if let Err(problem) = graph::check(&world, &policy, now, &mut seen) {
            panic!("{durations:?}: {problem}");
        }
    }
    eprintln!(
        "{} claims in {GRAPHS} graphs, verdicts: {verdicts:?}",
        world.claims.len()
    );
    // The graphs must reach both sides of the rule, for several reasons.
    for wanted in [
        "delete/ttl-expired",
        "delete/orphaned",
        "delete/max-age-exceeded",
        "delete/owner-gone",
        "keep/owner-running",
        "keep/within-ttl",
        "keep/completion-time-missing",
        "protected/in-use",
        "protected/referenced-by-job",
    ] {
        assert!(verdicts.contains_key(wanted), "no {wanted} in {verdicts:?}");
    }
}

/// Creates a graph's objects: owners first, so the claims' references can name their UIDs.
async fn apply(client: &Client, graph: &Graph, namespaces: &[String], now: DateTime<Utc>) {
    let owners = graph.render(namespaces, now, &|_, _, _| None);
    let mut uids = HashMap::new();
    for (resource, objects) in [
        (job_resource(), &owners.jobs),
        (run_resource(), &owners.runs),
        (task_run_resource(), &owners.task_runs),
    ] {
        for object in objects {
            let created = create(client, &resource, object).await;
            let key = (
                text(&object["metadata"]["namespace"]).to_owned(),
                resource.kind.clone(),
                text(&object["metadata"]["name"]).to_owned(),
            );
            uids.insert(key, created.metadata.uid.expect("the server assigns a UID"));
        }
    }
    let world = graph.render(namespaces, now, &|ns, kind, name| {
        uids.get(&(ns.to_owned(), kind.to_owned(), name.to_owned()))
            .cloned()
    });
    let claims = ApiResource::erase::<PersistentVolumeClaim>(&());
    for claim in &world.claims {
        create(client, &claims, claim).await;
        if !claim["metadata"]["deletionTimestamp"].is_null() {
            // Its finalizer holds it, terminating, as the generated one is.
            api(client, &claims, claim)
                .delete(text(&claim["metadata"]["name"]), &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("delete {claim}: {e}"));
        }
    }
    for pod in &world.pods {
        create(client, &ApiResource::erase::<Pod>(&()), pod).await;
    }
}

/// Creates `object`, then writes its status through the status subresource, as controllers do.
async fn create(client: &Client, resource: &ApiResource, object: &Value) -> DynamicObject {
    let mut body = object.clone();
    let status = body.as_object_mut().and_then(|o| o.remove("status"));
    if let Some(meta) = body["metadata"].as_object_mut() {
        // Set by the server alone (it records the create's managed fields itself: the
        // generated server claims are all made labelled in one write).
        meta.remove("creationTimestamp");
        meta.remove("deletionTimestamp");
        meta.remove("managedFields");
    }
    let api = api(client, resource, object);
    let body: DynamicObject = serde_json::from_value(body).expect("a generated object decodes");
    let created = api
        .create(&PostParams::default(), &body)
        .await
        .unwrap_or_else(|e| panic!("create {object}: {e}"));
    match status {
        None => created,
        Some(status) => api
            .patch_status(
                text(&object["metadata"]["name"]),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("set the status of {object}: {e}")),
    }
}

fn api(client: &Client, resource: &ApiResource, object: &Value) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        text(&object["metadata"]["namespace"]),
        resource,
    )
}

/// Every object of the five kinds in `namespaces`, as the server returns them.
async fn read_back(client: &Client, namespaces: &[String]) -> World {
    let list = |resource: ApiResource| async move {
        let mut objects = Vec::new();
        for ns in namespaces {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
            let listed = (api.list(&ListParams::default()).await)
                .unwrap_or_else(|e| panic!("list {} in {ns}: {e}", resource.plural));
            objects.extend(
                listed
                    .items
                    .into_iter()
                    .map(|object| serde_json::to_value(object).expect("an object serializes")),
            );
        }
        objects
    };
    World {
        claims: list(ApiResource::erase::<PersistentVolumeClaim>(&())).await,
        jobs: list(job_resource()).await,
        runs: list(run_resource()).await,
        task_runs: list(task_run_resource()).await,
        pods: list(ApiResource::erase::<Pod>(&())).await,
        ..World::default()
    }
}

fn claim_of(world: &World, key: &ObjectKey) -> String {
    let claim = world.claims.iter().find(|c| graph::key_of(c) == *key);
    serde_json::to_string_pretty(&claim).unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}
