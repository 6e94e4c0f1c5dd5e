//! The seam under the election: the one Lease it competes for, read, created, or changed on
//! the resourceVersion read. The API server's is `kube_store.rs`; the unit tests give a fake
//! on paused time.

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Map, Value};

/// Why the Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// 409: someone wrote the Lease since it was read, or created it first.
    #[error("another replica wrote the lease first: {0}")]
    Conflict(#[source] kube::Error),
    /// Any other failure: the request may or may not have been carried out.
    #[error(transparent)]
    Api(kube::Error),
}

impl StoreError {
    /// The API's error, to count in the metrics.
    pub fn cause(&self) -> &kube::Error {
        match self {
            StoreError::Conflict(error) | StoreError::Api(error) => error,
        }
    }
}

impl From<kube::Error> for StoreError {
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if status.code == 409 => {
                StoreError::Conflict(kube::Error::Api(status))
            }
            other => StoreError::Api(other),
        }
    }
}

/// A write of the Lease as a JSON merge patch: refused with [`StoreError::Conflict`] unless the
/// Lease is still at `resource_version` (always that of a Lease the API server returned).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub resource_version: Option<String>,
    /// Merged into `spec`: a null removes a field.
    pub spec: Value,
    /// Merged into `metadata.annotations` (a null removes a key); `None` changes none.
    pub annotations: Option<Map<String, Value>>,
}

impl Change {
    /// The merge patch the API server is sent: the resourceVersion in it is its precondition.
    pub fn to_merge_patch(&self) -> Value {
        let mut patch = serde_json::json!({
            "metadata": { "resourceVersion": self.resource_version },
            "spec": self.spec,
        });
        if let Some(annotations) = &self.annotations {
            patch["metadata"]["annotations"] = Value::Object(annotations.clone());
        }
        patch
    }
}

/// The Lease this replica competes for. Object safe, so the election is one type whatever
/// stands behind it.
pub trait LeaseStore: Send + Sync + 'static {
    /// The Lease, `None` when there is none.
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>>;
    /// Creates the Lease (named as this store names it); [`StoreError::Conflict`] when it exists.
    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>>;
    /// Writes `change` on its precondition; the Lease as written.
    fn replace(&self, change: Change) -> BoxFuture<'_, Result<Lease, StoreError>>;
}
