//! The Lease on the API server: `get`, `create` and a merge `patch` that carries the
//! resourceVersion read, the rights the Lease Role always granted (no `update`).

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::store::{Change, LeaseStore, StoreError};

/// The Lease `name` in its namespace.
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
}

impl KubeLeaseStore {
    pub fn new(client: Client, namespace: &str, name: String) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name,
        }
    }
}

impl LeaseStore for KubeLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        async move { Ok(self.api.get_opt(&self.name).await?) }.boxed()
    }

    fn create(&self, mut lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        lease.metadata.name = Some(self.name.clone());
        async move { Ok(self.api.create(&PostParams::default(), &lease).await?) }.boxed()
    }

    fn replace(&self, change: Change) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            let patch = Patch::Merge(change.to_merge_patch());
            Ok(self
                .api
                .patch(&self.name, &PatchParams::default(), &patch)
                .await?)
        }
        .boxed()
    }
}
