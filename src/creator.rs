//! The creator: one correct workspace claim per build, owned by its NotebookValidationJob.
//!
//! The operator's own `ensureBuildPVC` creates `{job}-build-workspace` without an owner and
//! reuses whatever claim of that name exists, even one being deleted or one left by an earlier
//! job of the same name. [`ensure_build_claim`] creates the claim with an owner reference to the
//! job, so Kubernetes' garbage collector removes it with the job, and on a name clash reuses a
//! claim only when its owner reference names this job's UID. Every other clash is a typed
//! [`CreateError`] saying what was found; nothing is ever adopted, patched or deleted here.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};

use crate::cluster::resources::{job_resource, to_chrono};
use crate::config::CreatorConfig;
use crate::contract::{JOB_KIND, labels, naming};
use crate::decide::facts::ObjectKey;

/// The field manager recorded on created claims.
const FIELD_MANAGER: &str = "workspace-gc";

/// Creates tried before giving up when the clashing claim keeps vanishing before it can be read.
const MAX_ATTEMPTS: u32 = 3;

/// Kubernetes' limit on label values.
const MAX_LABEL_VALUE: usize = 63;

/// The NotebookValidationJob a claim is created for, as read from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `metadata.creationTimestamp`: an unowned claim older than this cannot be this job's.
    pub created: DateTime<Utc>,
}

impl JobRef {
    /// The job's identity from its metadata; refuses a job that is being deleted, since the
    /// garbage collector would remove a claim created for it straight away.
    pub fn from_meta(meta: &ObjectMeta) -> Result<JobRef, CreateError> {
        let key = ObjectKey::of(meta);
        if meta.deletion_timestamp.is_some() {
            return Err(CreateError::JobTerminating { job: key });
        }
        let missing = |field| CreateError::JobIncomplete {
            job: key.clone(),
            field,
        };
        let uid = meta.uid.clone().ok_or_else(|| missing("metadata.uid"))?;
        let created = meta
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .ok_or_else(|| missing("metadata.creationTimestamp"))?;
        if key.namespace.is_empty() {
            return Err(missing("metadata.namespace"));
        }
        if key.name.is_empty() {
            return Err(missing("metadata.name"));
        }
        Ok(JobRef {
            namespace: key.namespace.to_string(),
            name: key.name,
            uid,
            created,
        })
    }

    /// `{job}-build-workspace`, the name the operator mounts.
    pub fn claim_name(&self) -> String {
        naming::claim(&self.name)
    }

    fn claim_key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.claim_name())
    }

    fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }

    /// The controller reference that makes the garbage collector delete the claim with the job.
    fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: job_resource().api_version,
            kind: JOB_KIND.to_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

/// The claim [`ensure_build_claim`] ended with.
#[derive(Debug, Clone)]
pub struct Ensured {
    /// As the API server returned it.
    pub claim: PersistentVolumeClaim,
    /// `false`: it already existed, owned by this job.
    pub created: bool,
}

/// Why no claim was ensured. Each message says what was found and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("NotebookValidationJob {job} does not exist: check the namespace and the name")]
    JobNotFound { job: ObjectKey },

    #[error(
        "NotebookValidationJob {job} is being deleted: a claim owned by it would be \
         garbage-collected at once; create the job again first"
    )]
    JobTerminating { job: ObjectKey },

    #[error("NotebookValidationJob {job} as read has no {field}; nothing was created")]
    JobIncomplete { job: ObjectKey, field: &'static str },

    #[error(
        "claim {claim} is being deleted (since {since}, finalizers: {finalizers}); it will not \
         be reused: wait until it is gone, then retry (kubernetes.io/pvc-protection holds it \
         while a pod still uses it)"
    )]
    Terminating {
        claim: ObjectKey,
        since: DateTime<Utc>,
        finalizers: String,
    },

    #[error(
        "claim {claim} is owned by {owner} (uid {uid}), not by this job \
         (uid {job_uid}); if that owner was an earlier job of the same name its workspace is \
         stale: delete the claim once nothing uses it, then retry"
    )]
    ForeignOwner {
        claim: ObjectKey,
        /// Kind and name, e.g. `NotebookValidationJob nb`.
        owner: String,
        uid: String,
        job_uid: String,
    },

    #[error(
        "claim {claim} has no owner and was created at {created}, before job {job} \
         ({job_created}): it was probably left by an earlier job of the same name and holds a \
         stale workspace; delete it once nothing uses it, then retry"
    )]
    StaleUnowned {
        claim: ObjectKey,
        created: DateTime<Utc>,
        job: ObjectKey,
        job_created: DateTime<Utc>,
    },

    /// Unowned but not older than the job: most likely the operator's own claim for this very
    /// job, but nothing proves it, and adopting a workspace that may be someone else's is what
    /// this creator exists to avoid.
    #[error(
        "claim {claim} has no owner and was created at {}, not before job {job} \
         ({job_created}); it is probably the operator's claim for this job, but it is never \
         adopted silently: add an owner reference to the job yourself, or delete the claim \
         once nothing uses it and retry",
        .created.map_or_else(|| "an unknown time".to_owned(), |t| t.to_string())
    )]
    Unowned {
        claim: ObjectKey,
        created: Option<DateTime<Utc>>,
        job: ObjectKey,
        job_created: DateTime<Utc>,
    },

    #[error(
        "claim {claim} already existed but was gone when read, {attempts} times in a row; \
         something keeps deleting it: find out what, then retry"
    )]
    Contended { claim: ObjectKey, attempts: u32 },

    #[error("cannot {action} {object}: {source}")]
    Api {
        action: &'static str,
        object: ObjectKey,
        // Boxed: a kube::Error would make every Result of this module large.
        #[source]
        source: Box<kube::Error>,
    },
}

impl CreateError {
    /// Whether the cluster's state forbids the claim, so that retrying as is cannot help (the job
    /// is missing or being deleted, or a claim of that name exists that is not this job's); else
    /// the attempt failed and a retry may succeed.
    pub fn is_refusal(&self) -> bool {
        match self {
            CreateError::JobNotFound { .. }
            | CreateError::JobTerminating { .. }
            | CreateError::Terminating { .. }
            | CreateError::ForeignOwner { .. }
            | CreateError::StaleUnowned { .. }
            | CreateError::Unowned { .. } => true,
            CreateError::JobIncomplete { .. }
            | CreateError::Contended { .. }
            | CreateError::Api { .. } => false,
        }
    }
}

/// Reads the job's identity (metadata only).
pub async fn read_job(client: &Client, namespace: &str, name: &str) -> Result<JobRef, CreateError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &job_resource());
    let job = ObjectKey::new(namespace, name);
    match api.get_metadata(name).await {
        Ok(found) => JobRef::from_meta(&found.metadata),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            Err(CreateError::JobNotFound { job })
        }
        Err(source) => Err(CreateError::Api {
            action: "read NotebookValidationJob",
            object: job,
            source: Box::new(source),
        }),
    }
}

/// Ensures the claim `{job}-build-workspace` in the job's namespace, owned by the job.
///
/// Creates it; if a claim of that name exists, returns it only when one of its owner
/// references names this job's UID and it is not being deleted, and otherwise says why not.
/// Two concurrent calls for the same job both succeed, one of them with `created: false`.
pub async fn ensure_build_claim(
    client: &Client,
    job: &JobRef,
    settings: &CreatorConfig,
) -> Result<Ensured, CreateError> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &job.namespace);
    let desired = build_claim(job, settings);
    let name = job.claim_name();
    let params = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let api_error = |action, source| CreateError::Api {
        action,
        object: job.claim_key(),
        source: Box::new(source),
    };
    for _ in 0..MAX_ATTEMPTS {
        match api.create(&params, &desired).await {
            Ok(claim) => {
                return Ok(Ensured {
                    claim,
                    created: true,
                });
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(source) => return Err(api_error("create claim", source)),
        }
        // A plain GET reads from etcd (quorum), so it sees the claim the create clashed with.
        match api.get_opt(&name).await {
            Ok(Some(existing)) => {
                check_existing(&existing, job)?;
                return Ok(Ensured {
                    claim: existing,
                    created: false,
                });
            }
            // Deleted between our create and our read: the name is free again.
            Ok(None) => {}
            Err(source) => return Err(api_error("read claim", source)),
        }
    }
    Err(CreateError::Contended {
        claim: job.claim_key(),
        attempts: MAX_ATTEMPTS,
    })
}

/// The claim to create for `job`.
fn build_claim(job: &JobRef, settings: &CreatorConfig) -> PersistentVolumeClaim {
    // Configured labels first, so they can never replace the fixed ones the collector and the
    // operator rely on.
    let mut labels = settings.labels.clone();
    for (key, value) in labels::OPERATOR {
        labels.insert(key.to_owned(), value.to_owned());
    }
    if job.name.len() <= MAX_LABEL_VALUE {
        labels.insert(labels::JOB.to_owned(), job.name.clone());
    } else {
        labels.remove(labels::JOB);
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(job.claim_name()),
            namespace: Some(job.namespace.clone()),
            labels: Some(labels),
            annotations: Some(settings.annotations.clone()).filter(|a| !a.is_empty()),
            owner_references: Some(vec![job.owner_reference()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(settings.storage.as_str().to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: settings.storage_class.clone(),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Whether an existing claim of the workspace's name may be returned as this job's.
fn check_existing(existing: &PersistentVolumeClaim, job: &JobRef) -> Result<(), CreateError> {
    let meta = &existing.metadata;
    let claim = ObjectKey::of(meta);
    if let Some(since) = &meta.deletion_timestamp {
        return Err(CreateError::Terminating {
            claim,
            since: to_chrono(since),
            finalizers: meta
                .finalizers
                .as_deref()
                .filter(|f| !f.is_empty())
                .map_or_else(|| "none".to_owned(), |f| f.join(", ")),
        });
    }
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    if owners.iter().any(|owner| owner.uid == job.uid) {
        return Ok(());
    }
    // Name the controlling owner if there is one: it is the one that decides the claim's fate.
    if let Some(owner) = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| owners.first())
    {
        return Err(CreateError::ForeignOwner {
            claim,
            owner: format!("{} {}", owner.kind, owner.name),
            uid: owner.uid.clone(),
            job_uid: job.uid.clone(),
        });
    }
    // Timestamps have whole seconds: a claim from the job's own second is not provably older.
    let created = meta.creation_timestamp.as_ref().map(to_chrono);
    match created {
        Some(created) if created < job.created => Err(CreateError::StaleUnowned {
            claim,
            created,
            job: job.key(),
            job_created: job.created,
        }),
        _ => Err(CreateError::Unowned {
            claim,
            created,
            job: job.key(),
            job_created: job.created,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use chrono::TimeZone;
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tokio::task::JoinHandle;
    use tower_test::mock;

    const UID: &str = "0b6b1c4e-0000-4000-8000-000000000001";

    fn job(name: &str) -> JobRef {
        JobRef {
            namespace: "ml".to_owned(),
            name: name.to_owned(),
            uid: UID.to_owned(),
            created: Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap(),
        }
    }

    /// An API timestamp this many seconds after the job's creation.
    fn stamp(seconds_after_job: i64) -> String {
        let at = job("nb").created + chrono::Duration::seconds(seconds_after_job);
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn settings() -> CreatorConfig {
        Config::default().creator
    }

    /// What the mock API server expects, and what it answers.
    struct Exchange {
        method: Method,
        path: String,
        status: StatusCode,
        body: Value,
    }

    fn exchange(method: Method, path: &str, status: StatusCode, body: Value) -> Exchange {
        Exchange {
            method,
            path: path.to_owned(),
            status,
            body,
        }
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": format!("{reason} (test)"), "reason": reason, "code": code})
    }

    const CLAIMS: &str = "/api/v1/namespaces/ml/persistentvolumeclaims";

    /// A client whose API server plays `script` in order, checking each request's method and
    /// path; the task returns the request bodies. A request beyond the script fails.
    fn scripted(script: Vec<Exchange>) -> (Client, JoinHandle<Vec<Value>>) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut bodies = Vec::new();
            for step in script {
                let (request, respond) = handle.next_request().await.expect("a request");
                assert_eq!(request.method(), step.method);
                assert_eq!(request.uri().path(), step.path);
                let bytes = request.into_body().collect_bytes().await.unwrap();
                bodies.push(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
                respond.send_response(
                    Response::builder()
                        .status(step.status)
                        .body(Body::from(serde_json::to_vec(&step.body).unwrap()))
                        .unwrap(),
                );
            }
            bodies
        });
        (Client::new(service, "default"), server)
    }

    fn stored(mut claim: Value, uid: &str) -> Value {
        claim["metadata"]["uid"] = uid.into();
        claim["metadata"]["creationTimestamp"] = "2026-03-01T12:00:05Z".into();
        claim
    }

    #[tokio::test]
    async fn creates_exactly_the_claim_described() {
        let expected = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "nb-build-workspace",
                "namespace": "ml",
                "labels": {
                    "app.kubernetes.io/managed-by": "jupyter-notebook-validator-operator",
                    "app.kubernetes.io/component": "tekton-build",
                    "mlops.redhat.com/build-workspace": "true",
                    "mlops.redhat.com/notebook-validation-job": "nb",
                },
                "ownerReferences": [{
                    "apiVersion": "mlops.mlops.dev/v1alpha1",
                    "kind": "NotebookValidationJob",
                    "name": "nb",
                    "uid": UID,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        });
        let (client, server) = scripted(vec![exchange(
            Method::POST,
            CLAIMS,
            StatusCode::CREATED,
            stored(expected.clone(), "c1"),
        )]);
        let ensured = ensure_build_claim(&client, &job("nb"), &settings())
            .await
            .unwrap();
        assert!(ensured.created);
        assert_eq!(ensured.claim.metadata.uid.as_deref(), Some("c1"));
        assert_eq!(server.await.unwrap(), vec![expected]);
    }

    #[tokio::test]
    async fn configured_class_labels_and_annotations_are_sent() {
        let mut settings = settings();
        settings.storage = "5Gi".parse().unwrap();
        settings.storage_class = Some("fast".to_owned());
        settings.labels = BTreeMap::from([
            ("team".to_owned(), "ml".to_owned()),
            // Must not replace the label the collector selects on.
            (
                "mlops.redhat.com/build-workspace".to_owned(),
                "false".to_owned(),
            ),
        ]);
        settings.annotations = BTreeMap::from([("example.com/note".to_owned(), "x y".to_owned())]);
        let (client, server) = scripted(vec![exchange(
            Method::POST,
            CLAIMS,
            StatusCode::CREATED,
            stored(
                serde_json::to_value(build_claim(&job("nb"), &settings)).unwrap(),
                "c1",
            ),
        )]);
        ensure_build_claim(&client, &job("nb"), &settings)
            .await
            .unwrap();
        let body = &server.await.unwrap()[0];
        assert_eq!(body["spec"]["storageClassName"], "fast");
        assert_eq!(body["spec"]["resources"]["requests"]["storage"], "5Gi");
        assert_eq!(body["metadata"]["labels"]["team"], "ml");
        assert_eq!(
            body["metadata"]["labels"]["mlops.redhat.com/build-workspace"],
            "true"
        );
        assert_eq!(
            body["metadata"]["annotations"],
            json!({"example.com/note": "x y"})
        );
    }

    #[test]
    fn a_job_name_too_long_for_a_label_value_gets_no_job_label() {
        let mut settings = settings();
        settings
            .labels
            .insert(labels::JOB.to_owned(), "other".to_owned());
        let long = "j".repeat(64);
        let labels = build_claim(&job(&long), &settings).metadata.labels.unwrap();
        assert!(!labels.contains_key(labels::JOB), "{labels:?}");
        let fits = "j".repeat(63);
        let labels = build_claim(&job(&fits), &settings).metadata.labels.unwrap();
        assert_eq!(labels.get(labels::JOB), Some(&fits));
    }

    fn existing(owner_uid: Option<&str>, created: i64) -> Value {
        let mut claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "nb-build-workspace", "namespace": "ml", "uid": "c0",
                         "creationTimestamp": stamp(created)},
            "spec": {"accessModes": ["ReadWriteOnce"]},
        });
        if let Some(uid) = owner_uid {
            claim["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "mlops.mlops.dev/v1alpha1", "kind": "NotebookValidationJob",
                "name": "nb", "uid": uid, "controller": true,
            }]);
        }
        claim
    }

    #[tokio::test]
    async fn an_existing_claim_owned_by_the_job_is_returned() {
        let path = format!("{CLAIMS}/nb-build-workspace");
        let (client, server) = scripted(vec![
            exchange(
                Method::POST,
                CLAIMS,
                StatusCode::CONFLICT,
                status(409, "AlreadyExists"),
            ),
            exchange(Method::GET, &path, StatusCode::OK, existing(Some(UID), 5)),
        ]);
        let ensured = ensure_build_claim(&client, &job("nb"), &settings())
            .await
            .unwrap();
        assert!(!ensured.created);
        assert_eq!(ensured.claim.metadata.uid.as_deref(), Some("c0"));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_claim_deleted_between_create_and_read_is_created_again() {
        let path = format!("{CLAIMS}/nb-build-workspace");
        let created = stored(
            serde_json::to_value(build_claim(&job("nb"), &settings())).unwrap(),
            "c2",
        );
        let (client, server) = scripted(vec![
            exchange(
                Method::POST,
                CLAIMS,
                StatusCode::CONFLICT,
                status(409, "AlreadyExists"),
            ),
            exchange(
                Method::GET,
                &path,
                StatusCode::NOT_FOUND,
                status(404, "NotFound"),
            ),
            exchange(Method::POST, CLAIMS, StatusCode::CREATED, created),
        ]);
        let ensured = ensure_build_claim(&client, &job("nb"), &settings())
            .await
            .unwrap();
        assert!(ensured.created);
        assert_eq!(ensured.claim.metadata.uid.as_deref(), Some("c2"));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_claim_that_keeps_vanishing_ends_in_a_bounded_error() {
        let path = format!("{CLAIMS}/nb-build-workspace");
        let script = (0..MAX_ATTEMPTS)
            .flat_map(|_| {
                [
                    exchange(
                        Method::POST,
                        CLAIMS,
                        StatusCode::CONFLICT,
                        status(409, "AlreadyExists"),
                    ),
                    exchange(
                        Method::GET,
                        &path,
                        StatusCode::NOT_FOUND,
                        status(404, "NotFound"),
                    ),
                ]
            })
            .collect();
        let (client, server) = scripted(script);
        let error = ensure_build_claim(&client, &job("nb"), &settings())
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                CreateError::Contended {
                    attempts: MAX_ATTEMPTS,
                    ..
                }
            ),
            "{error}"
        );
        assert!(!error.is_refusal(), "{error}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn other_api_errors_are_failures_not_refusals() {
        let (client, server) = scripted(vec![exchange(
            Method::POST,
            CLAIMS,
            StatusCode::FORBIDDEN,
            status(403, "Forbidden"),
        )]);
        let error = ensure_build_claim(&client, &job("nb"), &settings())
            .await
            .unwrap_err();
        assert!(matches!(error, CreateError::Api { .. }), "{error}");
        assert!(
            error.to_string().contains("ml/nb-build-workspace"),
            "{error}"
        );
        assert!(!error.is_refusal(), "{error}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn reading_a_missing_job_is_a_refusal() {
        let (client, server) = scripted(vec![exchange(
            Method::GET,
            "/apis/mlops.mlops.dev/v1alpha1/namespaces/ml/notebookvalidationjobs/nb",
            StatusCode::NOT_FOUND,
            status(404, "NotFound"),
        )]);
        let error = read_job(&client, "ml", "nb").await.unwrap_err();
        assert!(matches!(error, CreateError::JobNotFound { .. }), "{error}");
        assert!(error.is_refusal(), "{error}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn reading_a_job_takes_its_uid_and_creation_time() {
        let (client, server) = scripted(vec![exchange(
            Method::GET,
            "/apis/mlops.mlops.dev/v1alpha1/namespaces/ml/notebookvalidationjobs/nb",
            StatusCode::OK,
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": {"name": "nb", "namespace": "ml", "uid": UID,
                                "creationTimestamp": "2026-03-01T12:00:00Z"}}),
        )]);
        assert_eq!(read_job(&client, "ml", "nb").await.unwrap(), job("nb"));
        server.await.unwrap();
    }

    #[test]
    fn odd_jobs_are_refused_or_fail_without_panicking() {
        let meta = |value: Value| -> ObjectMeta { serde_json::from_value(value).unwrap() };
        let complete = json!({"name": "nb", "namespace": "ml", "uid": UID,
                              "creationTimestamp": "2026-03-01T12:00:00Z"});
        assert_eq!(
            JobRef::from_meta(&meta(complete.clone())).unwrap(),
            job("nb")
        );

        let mut deleting = complete.clone();
        deleting["deletionTimestamp"] = "2026-03-01T13:00:00Z".into();
        let error = JobRef::from_meta(&meta(deleting)).unwrap_err();
        assert!(
            matches!(error, CreateError::JobTerminating { .. }),
            "{error}"
        );
        assert!(error.is_refusal(), "{error}");

        for field in ["uid", "creationTimestamp", "namespace", "name"] {
            let mut partial = complete.clone();
            partial.as_object_mut().unwrap().remove(field);
            let error = JobRef::from_meta(&meta(partial)).unwrap_err();
            assert!(
                matches!(error, CreateError::JobIncomplete { field: f, .. } if f.ends_with(field)),
                "{field}: {error}"
            );
            assert!(!error.is_refusal(), "{error}");
        }
    }

    fn check(claim: Value) -> Result<(), CreateError> {
        check_existing(&serde_json::from_value(claim).unwrap(), &job("nb"))
    }

    #[test]
    fn existing_claims_are_judged_by_owner_uid_deletion_and_age() {
        assert!(check(existing(Some(UID), 5)).is_ok());
        // Owned by this job among other owners: still this job's.
        let mut shared = existing(Some(UID), 5);
        shared["metadata"]["ownerReferences"]
            .as_array_mut()
            .unwrap()
            .insert(
                0,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u9"}),
            );
        assert!(check(shared).is_ok());

        let mut terminating = existing(Some(UID), 5);
        terminating["metadata"]["deletionTimestamp"] = stamp(60).into();
        terminating["metadata"]["finalizers"] = json!(["kubernetes.io/pvc-protection"]);
        let error = check(terminating).unwrap_err();
        assert!(matches!(error, CreateError::Terminating { .. }), "{error}");
        assert!(error.to_string().contains("kubernetes.io/pvc-protection"));

        let error = check(existing(Some("earlier-uid"), -60)).unwrap_err();
        assert!(
            matches!(&error, CreateError::ForeignOwner { uid, .. } if uid == "earlier-uid"),
            "{error}"
        );

        let error = check(existing(None, -60)).unwrap_err();
        assert!(matches!(error, CreateError::StaleUnowned { .. }), "{error}");

        // The same second as the job, or later: not provably stale, but still not adopted.
        for created in [0, 5] {
            let error = check(existing(None, created)).unwrap_err();
            assert!(matches!(error, CreateError::Unowned { .. }), "{error}");
        }
        let mut undated = existing(None, 0);
        undated["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("creationTimestamp");
        let error = check(undated).unwrap_err();
        assert!(
            matches!(error, CreateError::Unowned { created: None, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("an unknown time"), "{error}");
        assert!(error.is_refusal(), "{error}");
    }
}
