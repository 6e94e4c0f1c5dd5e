//! The fault tools of the tests, tested: the HTTP fault proxy ([`Proxy::http`]) on its own
//! rules and against the real API server, and the audit-log invariant of claim DELETEs
//! ([`DeleteInvariant`]) on synthetic audit events.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{
    Api, DeleteParams, ObjectMeta, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::{Client, Config};
use serde_json::{Value, json};
use testkit::{
    AuditEvent, ControlPlane, DeleteInvariant, Fault, Proxy, RequestInfo, Rule, TestNamespace,
    ViolationKind, policy_rule, service_account, wait_until,
};
use workspace_gc::contract::annotations;

// --- what a request is, and which rules match it ----------------------------------------------

fn info(method: Method, path: &str) -> RequestInfo {
    RequestInfo::of(&method, path, None)
}

#[test]
fn requests_are_named_as_the_authorizer_names_them() {
    let cases = [
        (
            Method::DELETE,
            "/api/v1/namespaces/ml/persistentvolumeclaims/ws",
            ("delete", "persistentvolumeclaims", "", "ml", "ws"),
        ),
        (
            Method::DELETE,
            "/api/v1/namespaces/ml/persistentvolumeclaims",
            ("deletecollection", "persistentvolumeclaims", "", "ml", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ml/pods?fieldSelector=status.phase%21%3DFailed&limit=500",
            ("list", "pods", "", "ml", ""),
        ),
        (
            Method::GET,
            "/api/v1/pods?watch=true&resourceVersion=12",
            ("watch", "pods", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/pods?watch=1",
            ("watch", "pods", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ml/pods/p",
            ("get", "pods", "", "ml", "p"),
        ),
        (
            Method::PUT,
            "/api/v1/namespaces/ml/pods/p/status",
            ("update", "pods", "status", "ml", "p"),
        ),
        (
            Method::PATCH,
            "/apis/coordination.k8s.io/v1/namespaces/gc/leases/workspace-gc",
            ("patch", "leases", "", "gc", "workspace-gc"),
        ),
        (
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/ml/events",
            ("create", "events", "", "ml", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ml",
            ("get", "namespaces", "", "", "ml"),
        ),
        (
            Method::GET,
            "/api/v1/namespaces",
            ("list", "namespaces", "", "", ""),
        ),
        (
            Method::DELETE,
            "/api/v1/namespaces/ml",
            ("delete", "namespaces", "", "", "ml"),
        ),
        (
            Method::GET,
            "/apis/mlops.mlops.dev/v1alpha1/notebookvalidationjobs?limit=1",
            ("list", "notebookvalidationjobs", "", "", ""),
        ),
        (Method::GET, "/version", ("get", "", "", "", "")),
        (
            Method::GET,
            "/apis/coordination.k8s.io/v1",
            ("get", "", "", "", ""),
        ),
        (Method::GET, "/api", ("get", "", "", "", "")),
    ];
    for (method, path, (verb, resource, subresource, namespace, name)) in cases {
        let got = info(method.clone(), path);
        let want = RequestInfo {
            verb: verb.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            user: None,
        };
        assert_eq!(got, want, "{method} {path}");
    }
}

/// A token shaped like a ServiceAccount's: a JWT whose `sub` is the username.
fn jwt(sub: &str) -> String {
    let part = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2lnbmF0dXJl",
        part(json!({"alg": "RS256"})),
        part(json!({"iss": "https://kubernetes.default.svc.cluster.local", "sub": sub}))
    )
}

#[test]
fn the_user_is_the_subject_of_a_bearer_token() {
    let user = service_account("workspace-gc", "workspace-gc");
    assert_eq!(user, "system:serviceaccount:workspace-gc:workspace-gc");
    let bearer = format!("Bearer {}", jwt(&user));
    let path = "/api/v1/namespaces/ml/pods";
    assert_eq!(
        RequestInfo::of(&Method::GET, path, Some(&bearer)).user,
        Some(user)
    );
    for odd in [
        "Bearer opaque-token",
        "Bearer a.!!!.c",
        "Basic dXNlcjpwYXNz",
        "",
    ] {
        assert_eq!(
            RequestInfo::of(&Method::GET, path, Some(odd)).user,
            None,
            "{odd}"
        );
    }
}

#[test]
fn rules_match_by_verb_resource_user_namespace_and_name() {
    let daemon = service_account("gc", "workspace-gc");
    let mut delete = info(
        Method::DELETE,
        "/api/v1/namespaces/ml/persistentvolumeclaims/ws",
    );
    delete.user = Some(daemon.clone());
    let mut list = info(Method::GET, "/api/v1/namespaces/ml/pods");
    list.user = Some(daemon.clone());
    let throttle = Fault::throttle(2);

    let any = Rule::new("", "", throttle.clone());
    assert!(any.matches(&delete) && any.matches(&list));
    let deletes = Rule::new("delete", "persistentvolumeclaims", throttle.clone());
    assert!(deletes.matches(&delete) && !deletes.matches(&list));
    assert!(deletes.clone().user(&daemon).matches(&delete));
    assert!(
        !deletes
            .clone()
            .user(service_account("gc", "other"))
            .matches(&delete)
    );
    let mut anonymous = delete.clone();
    anonymous.user = None;
    assert!(!deletes.clone().user(&daemon).matches(&anonymous));
    assert!(deletes.clone().namespace("ml").name("ws").matches(&delete));
    assert!(!deletes.clone().namespace("other").matches(&delete));
    assert!(!deletes.clone().name("other").matches(&delete));
    assert!(
        Rule::new("list", "pods", throttle)
            .namespace("ml")
            .matches(&list)
    );
    assert!(Fault::throttle(1).refuses() && Fault::Reset.refuses());
    assert!(!Fault::LoseResponse.refuses() && !Fault::Stall.refuses());
}

// --- the proxy against the real API server ----------------------------------------------------

/// A client as ServiceAccount `name` of `ns`, through `proxy`, that does not retry: each call
/// is one request.
async fn client_through(
    cp: &ControlPlane,
    ns: &TestNamespace,
    name: &str,
    proxy: &Proxy,
) -> Client {
    let direct = cp.service_account_kubeconfig(ns.name(), name).await;
    let via = proxy.kubeconfig(cp, &direct);
    Client::try_from(config(&via)).expect("a client through the proxy")
}

fn config(kubeconfig: &Path) -> Config {
    let mut config = testkit::load_config(kubeconfig);
    config.default_retry = false;
    config
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

async fn exists(ns: &TestNamespace, name: &str) -> bool {
    ns.api::<ConfigMap>()
        .get_opt(name)
        .await
        .expect("get as admin")
        .is_some()
}

fn status_of<T>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Every fault, on a ServiceAccount's requests to the real API server through the proxy:
/// refusals never reach the server and carry their status and `Retry-After`; rules select by
/// verb, resource, user and count; delays, stalls and lost responses; a watch streams through,
/// goes silent under a connection stall while new requests work, and resumes; a cut partitions.
#[tokio::test(flavor = "multi_thread")]
async fn the_fault_proxy_breaks_what_its_rules_name_against_the_real_api_server() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(cp, "fault-proxy").await;
    let role = Role {
        metadata: ObjectMeta {
            name: Some("proxied".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![policy_rule(
            &[""],
            &["configmaps"],
            &["get", "list", "watch", "create", "delete"],
        )]),
    };
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    ns.bind_role("proxied", "proxied").await;
    let proxy = Proxy::http(cp).await;
    let client = client_through(cp, &ns, "proxied", &proxy).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let post = PostParams::default();
    let me = service_account(ns.name(), "proxied");

    // Pass-through, with the ServiceAccount's own identity (its Role allows configmaps only).
    maps.create(&post, &config_map("plain"))
        .await
        .expect("create through the proxy");
    assert!(exists(&ns, "plain").await);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), ns.name());
    assert_eq!(
        status_of(&secrets.list(&Default::default()).await),
        Some(403)
    );

    // A 429 with Retry-After, for this user's creates only, never reaching the server.
    let throttle = proxy.add(Rule::new("create", "configmaps", Fault::throttle(2)).user(&me));
    let refused = maps.create(&post, &config_map("throttled")).await;
    assert_eq!(status_of(&refused), Some(429), "{refused:?}");
    assert!(
        !exists(&ns, "throttled").await,
        "a refused request never reaches the server"
    );
    let request = http::Request::post(format!("/api/v1/namespaces/{}/configmaps", ns.name()))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&config_map("raw")).unwrap())
        .unwrap();
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .expect("an answer");
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(proxy.hits(throttle), 2);
    maps.get("plain").await.expect("reads are not throttled");
    let other = proxy.add(
        Rule::new("get", "configmaps", Fault::throttle(1))
            .user(service_account(ns.name(), "other")),
    );
    maps.get("plain")
        .await
        .expect("another user's rule does not apply");
    assert_eq!(proxy.hits(other), 0);
    proxy.clear();

    // 503 and 504, once each: `times` limits a rule.
    for status in [503, 504] {
        let rule = proxy.add(
            Rule::new(
                "get",
                "configmaps",
                Fault::Refuse {
                    status,
                    retry_after: None,
                },
            )
            .times(1),
        );
        assert_eq!(status_of(&maps.get("plain").await), Some(status));
        maps.get("plain").await.expect("the rule is used up");
        assert_eq!(proxy.hits(rule), 1);
    }
    proxy.clear();

    // A refused DELETE is recorded with its preconditions, for the at-most-once check.
    proxy.add(Rule::new("delete", "configmaps", Fault::throttle(1)).times(1));
    let uid = maps.get("plain").await.unwrap().metadata.uid;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: uid.clone(),
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    assert_eq!(status_of(&maps.delete("plain", &params).await), Some(429));
    let faulted = proxy.faulted();
    let last = faulted.last().expect("recorded");
    assert_eq!(last.request.verb, "delete");
    assert_eq!(last.request.user.as_deref(), Some(me.as_str()));
    assert_eq!(last.preconditions, (uid, Some("1".into())));
    let event = last.as_audit_event();
    assert_eq!((event.code, event.name.as_str()), (429, "plain"));

    // Reset: the client sees a broken connection, the server nothing.
    proxy.add(Rule::new("create", "configmaps", Fault::Reset).times(1));
    let reset = maps.create(&post, &config_map("reset")).await;
    assert!(reset.is_err() && status_of(&reset).is_none(), "{reset:?}");
    assert!(!exists(&ns, "reset").await);
    assert_eq!(
        proxy.refused(),
        2 + 2 + 1 + 1,
        "429 twice, 503, 504, the DELETE, the reset"
    );

    // A lost response: executed, but the client never hears.
    proxy.add(Rule::new("create", "configmaps", Fault::LoseResponse).times(1));
    let lost = maps.create(&post, &config_map("lost")).await;
    assert!(lost.is_err() && status_of(&lost).is_none(), "{lost:?}");
    assert!(exists(&ns, "lost").await, "the server executed it");

    // A delayed response, and one stalled until its rule is lifted.
    proxy.add(
        Rule::new(
            "list",
            "configmaps",
            Fault::DelayResponse(Duration::from_secs(2)),
        )
        .times(1),
    );
    let started = Instant::now();
    maps.list(&Default::default())
        .await
        .expect("a delayed list");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let stall = proxy.add(Rule::new("get", "configmaps", Fault::Stall));
    let stalled = tokio::spawn({
        let maps = maps.clone();
        async move { maps.get("plain").await }
    });
    // The witness: the proxy holds the GET.
    assert!(
        wait_until(Duration::from_secs(10), || async { proxy.hits(stall) == 1 }).await,
        "the GET reached the proxy"
    );
    assert!(!stalled.is_finished(), "the stalled GET waits");
    proxy.remove(stall);
    tokio::time::timeout(Duration::from_secs(20), stalled)
        .await
        .expect("the GET goes on once the rule is lifted")
        .expect("the task")
        .expect("the GET");

    // A watch streams through; a connection stall silences it while new requests work.
    let mut watch = maps
        .watch(&WatchParams::default().timeout(290), "0")
        .await
        .expect("watch through the proxy")
        .boxed();
    ns.api::<ConfigMap>()
        .create(&post, &config_map("watched"))
        .await
        .expect("create as admin");
    assert!(
        next_added(&mut watch, "watched", Duration::from_secs(20)).await,
        "the watch streams"
    );
    proxy.stall();
    ns.api::<ConfigMap>()
        .create(&post, &config_map("silent"))
        .await
        .expect("create as admin");
    maps.get("plain")
        .await
        .expect("a new request works during the stall");
    assert!(
        !next_added(&mut watch, "silent", Duration::from_secs(2)).await,
        "the watch is silent"
    );
    proxy.unstall();
    assert!(
        next_added(&mut watch, "silent", Duration::from_secs(20)).await,
        "and resumes"
    );

    // A cut partitions; healing restores.
    proxy.cut();
    assert!(maps.get("plain").await.is_err(), "cut off");
    proxy.heal();
    assert!(
        wait_until(Duration::from_secs(20), || async {
            maps.get("plain").await.is_ok()
        })
        .await,
        "healed"
    );
}

/// Whether `watch` delivers the addition of `name` within `within`.
async fn next_added(
    watch: &mut (impl futures::Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>> + Unpin),
    name: &str,
    within: Duration,
) -> bool {
    let found = async {
        while let Some(event) = watch.next().await {
            if matches!(&event, Ok(WatchEvent::Added(m)) if m.metadata.name.as_deref() == Some(name))
            {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(within, found).await.unwrap_or(false)
}

// --- the invariant of claim DELETEs, on synthetic audit events --------------------------------

const A: &str = "system:serviceaccount:gc:replica-a";
const B: &str = "system:serviceaccount:gc:replica-b";

fn t(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

fn event(
    user: &str,
    verb: &str,
    resource: &str,
    namespace: &str,
    name: &str,
    at: i64,
) -> AuditEvent {
    AuditEvent {
        audit_id: String::new(),
        stage: "ResponseComplete".into(),
        user: user.into(),
        agent: String::new(),
        verb: verb.into(),
        resource: resource.into(),
        subresource: String::new(),
        namespace: namespace.into(),
        name: name.into(),
        uri: String::new(),
        uid: None,
        resource_version: None,
        code: 200,
        at: t(at),
        completed: t(at + 20),
        request: Value::Null,
    }
}

/// A Lease write by `user` naming in flight the DELETEs of the claims `uids` (and no other).
fn renew_naming(user: &str, at: i64, uids: &[&str]) -> AuditEvent {
    let named: Vec<Value> = (uids.iter())
        .map(|uid| json!({"namespace": "ml", "name": "ws", "uid": uid, "resourceVersion": "7"}))
        .collect();
    let named = serde_json::to_string(&named).unwrap();
    AuditEvent {
        request: json!({"metadata": {"annotations": {annotations::DELETES_IN_FLIGHT: named}}}),
        ..event(user, "patch", "leases", "gc", "workspace-gc", at)
    }
}

/// A Lease write by `user` that names the DELETEs of these tests in flight, as the daemon's
/// write before each DELETE does.
fn renew(user: &str, at: i64) -> AuditEvent {
    renew_naming(user, at, &["u1", "u9"])
}

fn recheck(user: &str, namespace: &str, at: i64) -> AuditEvent {
    event(user, "list", "pods", namespace, "", at)
}

fn delete(user: &str, uid: &str, rv: &str, at: i64, code: i64) -> AuditEvent {
    AuditEvent {
        uid: Some(uid.into()),
        resource_version: Some(rv.into()),
        code,
        ..event(user, "delete", "persistentvolumeclaims", "ml", "ws", at)
    }
}

fn invariant() -> DeleteInvariant {
    // A 6 s lease: a 4 s renew deadline; a 10 s re-check bound.
    DeleteInvariant::new(
        &[A.into(), B.into()],
        Some(("gc", "workspace-gc")),
        Duration::from_secs(6),
    )
}

fn kinds(audited: &[AuditEvent], refused: &[AuditEvent]) -> Vec<ViolationKind> {
    invariant()
        .check(audited, refused)
        .iter()
        .map(|v| v.kind)
        .collect()
}

#[test]
fn a_fenced_rechecked_single_delete_meets_the_invariant() {
    let audited = [
        renew(A, 0),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&audited, &[]), []);
    // Deletes by others (an admin, the garbage collector) are not the daemon's.
    let mut by_admin = delete("admin", "u2", "8", 60_000, 200);
    by_admin.uid = None;
    assert_eq!(kinds(&[by_admin], &[]), []);
}

#[test]
fn a_delete_by_a_replica_that_does_not_hold_the_lease_is_a_violation() {
    // B took the Lease after A's last write.
    let audited = [
        renew(A, 0),
        renew(B, 300),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&audited, &[]), [ViolationKind::NotHolder]);
    // A released it.
    let mut release = renew(A, 300);
    release.request = json!({"spec": {"holderIdentity": null, "renewTime": null}});
    let audited = [
        renew(A, 0),
        release,
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&audited, &[]), [ViolationKind::NotHolder]);
    // A renewal that names the holder is no release.
    let mut renewal = renew(A, 300);
    renewal.request["spec"] = json!({"holderIdentity": "replica-a"});
    let audited = [
        renewal,
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&audited, &[]), []);
    // No Lease write at all; a write that had not completed when the DELETE arrived: neither
    // says who held the Lease nor named the DELETE.
    let unheld = [ViolationKind::NotHolder, ViolationKind::NotNamed];
    assert_eq!(
        kinds(
            &[recheck(A, "ml", 500), delete(A, "u1", "7", 1_000, 200)],
            &[]
        ),
        unheld
    );
    let mut slow = renew(A, 900);
    slow.completed = t(1_100);
    assert_eq!(
        kinds(
            &[
                slow,
                recheck(A, "ml", 500),
                delete(A, "u1", "7", 1_000, 200)
            ],
            &[]
        ),
        unheld
    );
    // Failed writes do not count.
    let mut refused = renew(B, 300);
    refused.code = 409;
    assert_eq!(
        kinds(
            &[
                renew(A, 0),
                refused,
                recheck(A, "ml", 500),
                delete(A, "u1", "7", 1_000, 200)
            ],
            &[]
        ),
        []
    );
}

#[test]
fn a_delete_the_lease_did_not_name_in_flight_is_a_violation() {
    let not_named = ViolationKind::NotNamed;
    // Named by the write it rests on: none.
    let named = [
        renew_naming(A, 0, &["u1"]),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&named, &[]), []);
    // The Lease named another DELETE.
    let other = [
        renew_naming(A, 0, &["u2"]),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&other, &[]), [not_named]);
    // Named, then a later write (a patch carrying the key) named it no more.
    let dropped = [
        renew_naming(A, 0, &["u1"]),
        renew_naming(A, 300, &[]),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&dropped, &[]), [not_named]);
    // A patch without the key leaves what the Lease named.
    let kept = [
        renew_naming(A, 0, &["u1"]),
        event(A, "patch", "leases", "gc", "workspace-gc", 300),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 1_000, 200),
    ];
    assert_eq!(kinds(&kept, &[]), []);
}

#[test]
fn a_delete_past_the_renew_deadline_is_a_violation() {
    let late = [
        renew(A, 0),
        recheck(A, "ml", 3_900),
        delete(A, "u1", "7", 4_000, 200),
    ];
    assert_eq!(kinds(&late, &[]), [ViolationKind::Unfenced]);
    let in_time = [
        renew(A, 0),
        recheck(A, "ml", 3_800),
        delete(A, "u1", "7", 3_999, 200),
    ];
    assert_eq!(kinds(&in_time, &[]), []);
    // Without leader election there is no fence to check.
    let unelected = DeleteInvariant::new(&[A.into()], None, Duration::from_secs(6));
    assert_eq!(
        unelected
            .check(
                &[recheck(A, "ml", 0), delete(A, "u1", "7", 5_000, 200)],
                &[]
            )
            .len(),
        0
    );
}

#[test]
fn a_delete_without_a_fresh_recheck_of_its_namespace_is_a_violation() {
    let unchecked = ViolationKind::Unchecked;
    let with = |check: AuditEvent| [renew(A, 10_000), check, delete(A, "u1", "7", 11_000, 200)];
    assert_eq!(
        kinds(&with(recheck(A, "ml", 980)), &[]),
        [unchecked],
        "finished 10 s before (received 20 ms earlier)"
    );
    assert_eq!(
        kinds(&with(recheck(A, "ml", 1_080)), &[]),
        [],
        "finished 9.9 s before"
    );
    assert_eq!(
        kinds(&with(recheck(B, "ml", 10_500)), &[]),
        [unchecked],
        "by another user"
    );
    assert_eq!(
        kinds(&with(recheck(A, "other", 10_500)), &[]),
        [unchecked],
        "of another namespace"
    );
    assert_eq!(
        kinds(&with(recheck(A, "", 10_500)), &[]),
        [],
        "of the whole cluster (a proof's first read)"
    );
    let mut failed = recheck(A, "ml", 10_500);
    failed.code = 429;
    assert_eq!(kinds(&with(failed), &[]), [unchecked], "refused");
    let mut unfinished = recheck(A, "ml", 10_500);
    unfinished.completed = t(11_500);
    assert_eq!(kinds(&with(unfinished), &[]), [unchecked], "still running");
    assert_eq!(
        kinds(&with(event(A, "watch", "pods", "ml", "", 10_500)), &[]),
        [unchecked],
        "a watch"
    );
}

#[test]
fn a_delete_without_preconditions_is_a_violation() {
    let mut bare = delete(A, "u1", "7", 1_000, 200);
    bare.resource_version = None;
    assert_eq!(
        kinds(&[renew(A, 0), recheck(A, "ml", 500), bare], &[]),
        [ViolationKind::NoPreconditions]
    );
}

#[test]
fn one_decision_reaches_the_server_once() {
    let with = |extra: Vec<AuditEvent>| {
        [
            vec![renew(A, 0), recheck(A, "ml", 100), renew(A, 1_500)],
            extra,
        ]
        .concat()
    };
    let twice = [ViolationKind::Twice];
    // Sent again after success: twice, whatever came between.
    let again = with(vec![
        delete(A, "u1", "7", 200, 200),
        recheck(A, "ml", 1_600),
        delete(A, "u1", "7", 2_000, 409),
    ]);
    assert_eq!(kinds(&again, &[]), twice);
    // Refused by the server (429), then re-sent as a client's retry: twice.
    let retried = with(vec![
        delete(A, "u1", "7", 200, 429),
        delete(A, "u1", "7", 2_000, 200),
    ]);
    assert_eq!(kinds(&retried, &[]), twice);
    // A re-check that started before the refusal was answered does not make it a new decision.
    let early = with(vec![
        delete(A, "u1", "7", 200, 429),
        recheck(A, "ml", 210),
        delete(A, "u1", "7", 2_000, 200),
    ]);
    assert_eq!(kinds(&early, &[]), twice);
    // Through the whole path again: a new live re-check after the refusal.
    let rechecked = with(vec![
        delete(A, "u1", "7", 200, 429),
        recheck(A, "ml", 1_000),
        delete(A, "u1", "7", 2_000, 200),
    ]);
    assert_eq!(kinds(&rechecked, &[]), []);
    // Refused by the proxy (never in the audit log), then re-sent: it counts the same.
    let refused = [delete(A, "u1", "7", 200, 429)];
    let resent = with(vec![delete(A, "u1", "7", 2_000, 200)]);
    assert_eq!(kinds(&resent, &refused), twice);
    let resent = with(vec![
        recheck(A, "ml", 1_000),
        delete(A, "u1", "7", 2_000, 200),
    ]);
    assert_eq!(kinds(&resent, &refused), []);
    // A refused attempt alone is not checked for its fence: the server never saw it.
    assert_eq!(kinds(&[], &[delete(B, "u9", "1", 200, 429)]), []);
    // A changed claim is a new decision.
    let changed = with(vec![
        delete(A, "u1", "7", 200, 409),
        delete(A, "u1", "8", 2_000, 200),
    ]);
    assert_eq!(kinds(&changed, &[]), []);
    // The violation says what happened.
    let violations = invariant().check(&retried, &[]);
    let text = violations[0].to_string();
    assert!(
        text.contains("Twice") && text.contains("u1") && text.contains("no live re-check"),
        "{text}"
    );
}

/// A revocation of the DELETE that carried resourceVersion `rv` of claim `ml/ws`, by `user`.
fn revoke(user: &str, rv: &str, at: i64, code: i64) -> AuditEvent {
    AuditEvent {
        code,
        request: json!({"metadata": {"uid": "u1", "annotations": {
            annotations::REVOKED: annotations::revocation(rv, 0x2a),
        }}}),
        ..event(user, "patch", "persistentvolumeclaims", "ml", "ws", at)
    }
}

#[test]
fn a_late_delete_that_took_effect_is_a_violation_and_late_landed_when_revoked_after() {
    // Decided and fenced at 0–1 s; a hop delivers the DELETE 30 s later, and it lands.
    let landed_late = vec![
        renew(A, 0),
        recheck(A, "ml", 500),
        delete(A, "u1", "7", 30_000, 200),
    ];
    assert_eq!(
        kinds(&landed_late, &[]),
        [ViolationKind::Unfenced, ViolationKind::Unchecked],
        "the daemon never knew"
    );
    // The daemon revoked it after it landed: the revocation found the claim being deleted.
    // The bound that holds, told apart from a DELETE on time: late, landed.
    let revoked_after = [landed_late.clone(), vec![revoke(A, "7", 31_000, 200)]].concat();
    assert_eq!(kinds(&revoked_after, &[]), [ViolationKind::LateLanded]);
    let told = invariant().check(&revoked_after, &[])[0].to_string();
    assert!(
        told.contains("renew deadline") && told.contains("bound"),
        "{told}"
    );
    // Refused by its precondition when it arrived: it changed nothing.
    let refused = [
        renew(A, 0),
        recheck(A, "ml", 500),
        revoke(A, "7", 6_000, 200),
        delete(A, "u1", "7", 30_000, 409),
    ];
    assert_eq!(kinds(&refused, &[]), []);
    // Taking effect after a revocation answered with success cannot be.
    let after = [
        renew(A, 0),
        recheck(A, "ml", 500),
        revoke(A, "7", 6_000, 200),
        delete(A, "u1", "7", 30_000, 200),
    ];
    assert_eq!(
        kinds(&after, &[]),
        [
            ViolationKind::AfterRevocation,
            ViolationKind::Unfenced,
            ViolationKind::Unchecked
        ]
    );
    // A revocation of another resourceVersion, or by someone else, is no revocation of it.
    for other in [
        revoke(A, "8", 31_000, 200),
        revoke("admin", "7", 31_000, 200),
    ] {
        let audited = [landed_late.clone(), vec![other]].concat();
        assert_eq!(
            kinds(&audited, &[]),
            [ViolationKind::Unfenced, ViolationKind::Unchecked]
        );
    }
}
