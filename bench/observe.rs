//! The benchmark's own watch on build-workspace claims: the instant each claim's delete was
//! seen, i.e. the first event carrying its `deletionTimestamp` (the PVC-protection finalizer
//! keeps it a moment longer) or its removal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::oneshot;

pub struct Observer {
    deleted: Arc<Mutex<HashMap<String, DateTime<Utc>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Starts watching and returns once the initial list is in.
    pub async fn start(client: &Client) -> Self {
        let deleted = Arc::new(Mutex::new(HashMap::new()));
        let seen = deleted.clone();
        let api: Api<PersistentVolumeClaim> = Api::all(client.clone());
        let config = watcher::Config::default().labels("mlops.redhat.com/build-workspace=true");
        let (synced, on_synced) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced);
            let mut stream = watcher(api, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let now = Utc::now();
                let (object, gone) = match event {
                    Ok(Event::Apply(o) | Event::InitApply(o)) => (o, false),
                    Ok(Event::Delete(o)) => (o, true),
                    Ok(Event::InitDone) => {
                        if let Some(tx) = synced.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(Event::Init) => continue,
                    Err(error) => {
                        eprintln!("bench: claim watch: {error}");
                        continue;
                    }
                };
                if gone || object.metadata.deletion_timestamp.is_some() {
                    let key = format!(
                        "{}/{}",
                        object.metadata.namespace.unwrap_or_default(),
                        object.metadata.name.unwrap_or_default()
                    );
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(key)
                        .or_insert(now);
                }
            }
        });
        let _ = on_synced.await;
        Self { deleted, task }
    }

    /// When `claim` (`namespace/name`) was seen deleted, if it was.
    pub fn deleted_at(&self, claim: &str) -> Option<DateTime<Utc>> {
        self.lock().get(claim).copied()
    }

    /// Every deletion seen, for spotting deletions nobody asked for.
    pub fn all(&self) -> HashMap<String, DateTime<Utc>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, DateTime<Utc>>> {
        self.deleted.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stop(self) {
        self.task.abort();
    }
}
