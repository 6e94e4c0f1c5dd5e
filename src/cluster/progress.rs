//! The two small reads that prove the cache fresh (`daemon::proof`) instead of listing a
//! namespace: a kind's current resourceVersion, read consistently, and the changes of a kind
//! since a resourceVersion, replayed by a short watch up to a bookmark.

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::cluster::cache::Scope;
use crate::cluster::resources::{self, OwnerObject, PodVolumes};
use crate::cluster::served::Served;
use crate::decide::facts::ObjectKey;
use crate::decide::linking::Found;
use crate::observe::metrics::{Kind, Metrics, Operation};

/// No object carries this label: a list selecting it returns the collection's resourceVersion
/// and no items.
const NEVER_SET: &str = "workspace-gc.mlops.dev/never-set";

/// How long the server keeps a replay watch open. The API server's watch cache sends a watch
/// its bookmark two seconds before the watch's deadline (and never to one of two seconds or
/// less), on a timer of about a second: three seconds gets the bookmark after one to two.
const REPLAY_SECONDS: u32 = 3;

/// The last change of one object among those a replay delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub key: ObjectKey,
    pub revision: u64,
    pub deleted: bool,
}

/// The resourceVersion of a kind's collection in `scope` now: a list with `resourceVersion`
/// unset is served from etcd, or (Kubernetes 1.31+) from the watch cache once it has caught
/// up with etcd's current revision, which also moves the watch cache's bookmarks up to it.
/// An owner kind is read where `served` says; `No` only when discovery, asked now, says its
/// group serves it at no version and it is optional: no such object exists. Errors are
/// counted in `metrics`, when given.
pub async fn revision(
    client: &Client,
    served: &Served,
    kind: Kind,
    scope: &Scope,
    metrics: Option<&Metrics>,
) -> Found<u64> {
    match kind {
        Kind::Pods => {
            let api = resources::scoped_api::<PodVolumes>(client, scope.as_deref());
            collection(&api, metrics).await
        }
        _ => {
            let Some(owner) = kind.owner() else {
                return Found::Unknown(format!("{} carry no revision", kind.as_str()));
            };
            match served.readable(owner, tokio::time::Instant::now()).await {
                Ok(Some(resource)) => {
                    let api = resources::owner_api(client, scope.as_deref(), &resource);
                    collection(&api, metrics).await
                }
                Ok(None) => Found::No,
                Err(why) => Found::Unknown(why),
            }
        }
    }
}

/// The resourceVersion of `api`'s collection now (see [`revision`]). A 404 says the kind is
/// not served at this version, which tells nothing of its objects: unknown.
pub async fn collection<K>(api: &Api<K>, metrics: Option<&Metrics>) -> Found<u64>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = ListParams::default().labels(NEVER_SET).limit(1);
    let what = api.resource_url();
    match api.list_metadata(&params).await {
        Ok(list) => match list.metadata.resource_version.and_then(|v| v.parse().ok()) {
            Some(revision) => Found::Yes(revision),
            None => Found::Unknown(format!("{what}: no resourceVersion")),
        },
        Err(error) => {
            if let Some(metrics) = metrics {
                metrics.api_error(Operation::List, &error);
            }
            Found::Unknown(format!("reading the revision of {what}: {error}"))
        }
    }
}

/// What changed of `kind` in `scope` after resourceVersion `from`, up to `until` at least: the
/// last change of each object (pods that mount no claim left out, as the cache leaves them
/// out). `None` when the replay cannot vouch for it: the server no longer has `from` (410),
/// an error, or no bookmark or change at `until` or later before the server closes the watch
/// (a connection gone silent is given up a second after that).
pub async fn changes(
    client: &Client,
    served: &Served,
    kind: Kind,
    scope: &Scope,
    (from, until): (u64, u64),
    metrics: &Metrics,
) -> Option<Vec<Delivery>> {
    let replay = async {
        match kind {
            Kind::Pods => {
                let relevant = |pod: &PodVolumes| !resources::pod_entry(pod).claims.is_empty();
                replay(
                    &resources::scoped_api::<PodVolumes>(client, scope.as_deref()),
                    from,
                    until,
                    relevant,
                    metrics,
                )
                .await
            }
            _ => {
                replay(
                    &owner_api(client, served, kind, scope)?,
                    from,
                    until,
                    |_| true,
                    metrics,
                )
                .await
            }
        }
    };
    let bound = Duration::from_secs(u64::from(REPLAY_SECONDS) + 1);
    tokio::time::timeout(bound, replay).await.ok().flatten()
}

/// The API of an owner kind in a watch scope, at the version it was last resolved to be read
/// at; `None` for a kind that is not one, or not read anywhere.
fn owner_api(
    client: &Client,
    served: &Served,
    kind: Kind,
    scope: &Scope,
) -> Option<Api<OwnerObject>> {
    let owner = kind.owner()?;
    let serving = served.known(owner)?;
    let resource = serving.readable(owner).ok()??;
    Some(resources::owner_api(client, scope.as_deref(), resource))
}

async fn replay<K>(
    api: &Api<K>,
    from: u64,
    until: u64,
    relevant: impl Fn(&K) -> bool,
    metrics: &Metrics,
) -> Option<Vec<Delivery>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let params = WatchParams::default().timeout(REPLAY_SECONDS);
    let stream = match api.watch(&params, &from.to_string()).await {
        Ok(stream) => stream,
        Err(error) => {
            metrics.api_error(Operation::Watch, &error);
            return None;
        }
    };
    let mut stream = std::pin::pin!(stream.into_stream());
    let mut last: HashMap<ObjectKey, Delivery> = HashMap::new();
    while let Some(event) = stream.next().await {
        let (object, deleted) = match event {
            Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => (object, false),
            Ok(WatchEvent::Deleted(object)) => (object, true),
            Ok(WatchEvent::Bookmark(bookmark)) => {
                match bookmark.metadata.resource_version.parse::<u64>() {
                    Ok(revision) if revision >= until => return Some(last.into_values().collect()),
                    Ok(_) => continue,
                    Err(_) => return None,
                }
            }
            // 410 Gone included: `from` is no longer in the server's history.
            Ok(WatchEvent::Error(_)) => return None,
            Err(error) => {
                metrics.api_error(Operation::Watch, &error);
                return None;
            }
        };
        let revision = object
            .meta()
            .resource_version
            .as_deref()?
            .parse::<u64>()
            .ok()?;
        if revision > until {
            // Changes reach a watch in order: everything up to `until` has been delivered.
            return Some(last.into_values().collect());
        }
        if relevant(&object) || deleted {
            let key = ObjectKey::of(object.meta());
            last.insert(
                key.clone(),
                Delivery {
                    key,
                    revision,
                    deleted,
                },
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    /// A mock API server answering every request with `body` (status 200).
    fn answering(body: String) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            while let Some((_, reply)) = handle.next_request().await {
                let response = Response::builder().status(200);
                reply.send_response(
                    response
                        .body(Body::from(body.clone().into_bytes()))
                        .unwrap(),
                );
            }
        });
        Client::new(service, "default")
    }

    fn pod(name: &str, revision: &str, claim: Option<&str>) -> serde_json::Value {
        let volumes = claim.map_or_else(Vec::new, |c| {
            vec![json!({"name": "w", "persistentVolumeClaim": {"claimName": c}})]
        });
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ml", "resourceVersion": revision},
               "spec": {"volumes": volumes}})
    }

    fn events(events: &[serde_json::Value]) -> String {
        events.iter().map(|e| format!("{e}\n")).collect()
    }

    async fn pod_changes(body: String, until: u64) -> Option<Vec<Delivery>> {
        let metrics = Metrics::register(&mut Default::default());
        let client = answering(body);
        let served = Served::new(client.clone(), None);
        let found = changes(&client, &served, Kind::Pods, &None, (10, until), &metrics);
        found.await.map(|mut found| {
            found.sort_by(|a, b| a.key.name.cmp(&b.key.name));
            found
        })
    }

    fn delivery(name: &str, revision: u64, deleted: bool) -> Delivery {
        let key = ObjectKey::new("ml", name);
        Delivery {
            key,
            revision,
            deleted,
        }
    }

    #[tokio::test]
    async fn a_replay_keeps_the_last_change_of_each_object_up_to_its_bookmark() {
        let body = events(&[
            json!({"type": "ADDED", "object": pod("a", "11", Some("c"))}),
            json!({"type": "ADDED", "object": pod("plain", "12", None)}),
            json!({"type": "MODIFIED", "object": pod("a", "13", Some("c"))}),
            json!({"type": "DELETED", "object": pod("b", "14", Some("c"))}),
            json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                   "metadata": {"resourceVersion": "20"}}}),
        ]);
        let found = pod_changes(body, 20).await;
        let expected = vec![delivery("a", 13, false), delivery("b", 14, true)];
        assert_eq!(
            found,
            Some(expected),
            "a pod that mounts no claim is left out"
        );
    }

    #[tokio::test]
    async fn a_change_past_the_revision_ends_the_replay_without_it() {
        let body = events(&[
            json!({"type": "ADDED", "object": pod("a", "11", Some("c"))}),
            json!({"type": "ADDED", "object": pod("late", "21", Some("c"))}),
        ]);
        assert_eq!(
            pod_changes(body, 20).await,
            Some(vec![delivery("a", 11, false)])
        );
    }

    #[tokio::test]
    async fn a_replay_that_cannot_vouch_is_none() {
        let low_bookmark = events(&[json!({"type": "BOOKMARK", "object": {"kind": "Pod",
            "apiVersion": "v1", "metadata": {"resourceVersion": "15"}}})]);
        assert_eq!(pod_changes(low_bookmark, 20).await, None, "ends below 20");
        let gone = events(&[json!({"type": "ERROR", "object": {"kind": "Status",
            "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version"}})]);
        assert_eq!(pod_changes(gone, 20).await, None, "410 Gone");
        let garbled = events(&[json!({"type": "ADDED", "object": pod("a", "x1", Some("c"))})]);
        assert_eq!(
            pod_changes(garbled, 20).await,
            None,
            "an unparsable resourceVersion"
        );
    }

    #[tokio::test]
    async fn a_revision_is_the_collections_resource_version() {
        let pods_at = |version: &'static str| async move {
            let list = json!({"apiVersion": "v1", "kind": "PodList",
                              "metadata": {"resourceVersion": version}, "items": []});
            let client = answering(list.to_string());
            let served = Served::new(client.clone(), None);
            revision(&client, &served, Kind::Pods, &None, None).await
        };
        assert_eq!(pods_at("42").await, Found::Yes(42));
        let garbled = pods_at("abc").await;
        assert!(matches!(garbled, Found::Unknown(_)), "{garbled:?}");
    }
}
