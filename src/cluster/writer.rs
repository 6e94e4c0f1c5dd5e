//! The one place that changes claims, volumes and events: claim deletes and the events that
//! explain them, the revocation of a delete that got no definite answer, and, with
//! `deletion.released_volume_ttl`, the mark on a `Retain` volume and its delete.
//!
//! Deletes carry `{uid, resourceVersion}` preconditions; finalizers are never touched. Every
//! write passes the [`Fence`] first, a delete is recorded on the Lease before it is sent (a dry
//! run records nothing), every request is sent at most once, and a DELETE only before its
//! deadline. A refusal goes back to the controller, which decides again from the start.
//! RELIABILITY.md states each of these promises, with its bounds and tests.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cluster::in_flight::{InFlight, Revocation};
use crate::cluster::leader::{Fence, FenceError};
use crate::cluster::resources;
use crate::cluster::server_clock::TOLERATED_DISAGREEMENT;
use crate::contract::annotations::{self, DELETED_CLAIM_UID, KEEP, REVOKED};
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::namespace::Invalid;
use crate::decide::policy::Reason;
use crate::decide::quota::Pressure;
use crate::decide::volumes::VolumeFacts;
use crate::observe::metrics::{DeleteResult, ErrorCategory, Metrics, Operation};

/// How deletes are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Delete,
    /// Decide and report, delete nothing. With `server_side`, send the delete with
    /// `dryRun=All` so RBAC and admission are exercised.
    DryRun {
        server_side: bool,
    },
}

/// What a DELETE the writer was asked for came to. A dry run's answer is its own: nothing was
/// deleted, whatever the API server said, so the caller matches on the answer and never asks
/// the mode again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A real DELETE, and what came of it.
    Real(DeleteResult),
    /// A dry run: `Deleted` is "would delete" (client side, nothing was sent; server side, the
    /// API server accepted it with `dryRun=All`, RBAC and admission included); any other result
    /// is the API server's refusal of the dry run.
    Dry(DeleteResult),
}

impl Answer {
    /// The result, real or dry.
    pub fn result(self) -> DeleteResult {
        match self {
            Answer::Real(result) | Answer::Dry(result) => result,
        }
    }
}

/// What the daemon tells on a Namespace.
#[derive(Debug, Clone, PartialEq)]
pub enum NamespaceNotice {
    /// Its workspace-gc annotations are not understood: every claim there is kept.
    InvalidPolicy(Vec<Invalid>),
    /// Many claims there gained the build-workspace label without provenance at once.
    UnprovenLabelFlood { claims: usize, within: String },
}

/// What an event on a claim says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Deleted; with the volume a `Retain` reclaim policy keeps, if any.
    Deleted(Reason, Option<String>),
    WouldDelete(Reason),
    InvalidAnnotation(String),
    /// Labelled, but kept as no build workspace: what it lacks.
    NotABuildWorkspace(String),
    CapReached {
        max: u32,
        window: String,
    },
    /// Answers of the API server disagreed about its clock beyond the tolerance: the cap's
    /// window is counted as full until they have agreed within it for this long.
    ClockDisputed {
        window: String,
    },
    /// The claim becomes due at this instant if nothing changes.
    DeletionScheduled {
        at: String,
        reason: Reason,
    },
}

/// Why a delete was not sent.
#[derive(Debug, thiserror::Error)]
pub enum NotSent {
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error("the deadline passed before the delete could go out (the live re-check is too old)")]
    TooLate,
}

pub struct Writer {
    client: Client,
    recorder: Recorder,
    mode: Mode,
    fence: Fence,
}

impl Writer {
    pub fn new(client: Client, mode: Mode, instance: Option<String>, fence: Fence) -> Self {
        let reporter = Reporter {
            controller: "workspace-gc".into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            mode,
            fence,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Deletes the claim as it was when decided, once `ledger` (the cap's count as its
    /// annotation, this delete counted) is on
    /// the Lease and this replica still leads, and only before `deadline` (the bound on the age
    /// of the live re-check); `Err` when it may not, and nothing was sent. In client-side
    /// dry-run no delete is sent and the result is `Deleted` as if it had been.
    /// `ledger`: the cap's ledger as its annotation, and its generation (`Fence::record`).
    pub async fn delete(
        &self,
        claim: &ClaimFacts,
        ledger: (&str, u64),
        deadline: Instant,
        metrics: &Metrics,
    ) -> Result<Answer, NotSent> {
        let in_flight = InFlight::of(claim);
        let server_dry_run = match self.mode {
            Mode::Delete => {
                self.fence.record(ledger, &in_flight).await?;
                false
            }
            Mode::DryRun { server_side } => {
                self.fence.check()?;
                if !server_side {
                    return Ok(Answer::Dry(DeleteResult::Deleted));
                }
                true
            }
        };
        // Checked again immediately before sending: the write above may have waited. Not
        // sent: nothing of it can land.
        let deadline = self.fenced(deadline)?;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.key.namespace);
        let params = DeleteParams {
            dry_run: server_dry_run,
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: Some(claim.uid.clone()),
                resource_version: Some(claim.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        // Past the deadline the request is abandoned, but a hop may still hand it to the API
        // server at any time: without a definite answer it stays named in flight until
        // revoked.
        let sent = tokio::time::timeout_at(deadline, api.delete(&claim.key.name, &params));
        let result = answered(sent.await, ("claim", &claim.key.to_string()), metrics);
        Ok(if server_dry_run {
            Answer::Dry(result)
        } else {
            Answer::Real(result)
        })
    }

    /// Revokes a claim DELETE that got no definite answer: changes the claim (its UID, in the
    /// patch, is a precondition), so that the DELETE, carrying the resourceVersion before,
    /// fails (409) whenever it reaches the API server. Proven by the answer alone: revoked only
    /// when the claim's resourceVersion is no longer the DELETE's precondition. A 200 that
    /// kept it changed nothing (the value was already there), so another value is written,
    /// at most [`REVOKE_WRITES`] in all; never proven, the DELETE stays owed. Sent only while
    /// this replica leads; the entry leaves the Lease once the answer is definite.
    pub async fn revoke(&self, delete: &InFlight, metrics: &Metrics) -> Revocation {
        let bound = Instant::now() + REVOKE_BOUND;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &delete.namespace);
        for _ in 0..REVOKE_WRITES {
            let Ok(deadline) = self.fenced(bound) else {
                return Revocation::Unanswered;
            };
            let Some(nonce) = nonce() else {
                warn!(claim = %delete.key(), "no random nonce for the revocation of a delete without an answer: not sent");
                return Revocation::Unanswered;
            };
            let value = annotations::revocation(&delete.resource_version, nonce);
            let patch = serde_json::json!({"metadata": {
                "uid": delete.uid,
                "annotations": {REVOKED: value},
            }});
            let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
            let sent = tokio::time::timeout_at(deadline, api.patch(&delete.name, &params, &patch));
            match sent.await {
                Ok(Ok(claim)) if claim.metadata.deletion_timestamp.is_some() => {
                    return Revocation::Landed;
                }
                // Proven only by a version the answer carries; none proves nothing.
                Ok(Ok(claim))
                    if (claim.metadata.resource_version.as_deref())
                        .is_some_and(|version| version != delete.resource_version) =>
                {
                    return Revocation::Revoked;
                }
                Ok(Ok(_)) => {
                    warn!(claim = %delete.key(), resource_version = %delete.resource_version, "a revocation was answered with the delete's own resourceVersion: it changed nothing; writing another value");
                }
                Ok(Err(kube::Error::Api(status))) if status.is_not_found() => {
                    return Revocation::Landed;
                }
                Ok(Err(error @ kube::Error::Api(_))) if !is_server_error(&error) => {
                    metrics.api_error(Operation::Patch, &error);
                    warn!(claim = %delete.key(), %error, "the revocation of a delete without an answer was refused");
                    return Revocation::Refused;
                }
                Ok(Err(error)) => {
                    metrics.api_error(Operation::Patch, &error);
                    warn!(claim = %delete.key(), %error, "the revocation of a delete without an answer got no answer");
                    return Revocation::Unanswered;
                }
                Err(_) => {
                    metrics.api_timeout(Operation::Patch);
                    warn!(claim = %delete.key(), "the revocation of a delete without an answer got no answer before its deadline");
                    return Revocation::Unanswered;
                }
            }
        }
        warn!(claim = %delete.key(), writes = REVOKE_WRITES, "no revocation changed the claim: the delete without an answer may still land; the claim is kept and revoked again after a backoff");
        Revocation::Unanswered
    }

    /// The deadline a write must go out by: the earlier of `deadline` and the fence's reach;
    /// `Err` when this replica does not lead, or it has passed.
    fn fenced(&self, deadline: Instant) -> Result<Instant, NotSent> {
        self.fence.check()?;
        let deadline = (self.fence.until()).map_or(deadline, |fenced| fenced.min(deadline));
        if Instant::now() >= deadline {
            return Err(NotSent::TooLate);
        }
        Ok(deadline)
    }

    /// Writes `claim_uid` on `volume` once that claim's DELETE was answered with success, so
    /// that only a volume whose claim workspace-gc deleted may be deleted once `Released`. The
    /// volume's UID is the patch's precondition (a changed UID is refused: 422, immutable);
    /// not its resourceVersion, which the PV controller changes as the claim goes. Sent once,
    /// if this replica leads; the volume as marked once the server took it, `None` if not.
    /// Nothing in dry-run.
    pub async fn mark_volume(
        &self,
        volume: &VolumeFacts,
        claim_uid: &str,
        metrics: &Metrics,
    ) -> Option<VolumeFacts> {
        if !matches!(self.mode, Mode::Delete) {
            return None;
        }
        let deadline = self.fenced(Instant::now() + MARK_BOUND).ok()?;
        let patch = serde_json::json!({"metadata": {
            "uid": volume.uid,
            "annotations": {DELETED_CLAIM_UID: claim_uid},
        }});
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &resources::volume_resource());
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        match tokio::time::timeout_at(deadline, api.patch(&volume.name, &params, &patch)).await {
            Ok(Ok(patched)) => Some(resources::volume_facts(&patched)),
            Ok(Err(error)) => {
                metrics.api_error(Operation::Patch, &error);
                warn!(volume = %volume.name, %error, "volume patch refused");
                None
            }
            Err(_) => {
                metrics.api_timeout(Operation::Patch);
                warn!(volume = %volume.name, "volume patch got no answer before its deadline");
                None
            }
        }
    }

    /// Deletes a `Released` volume as it was judged: its UID and resourceVersion are the
    /// DELETE's preconditions. Sent once, before `deadline`; in client-side dry-run, nothing is
    /// sent and the answer is a dry `Deleted`.
    pub async fn delete_volume(
        &self,
        volume: &VolumeFacts,
        deadline: Instant,
        metrics: &Metrics,
    ) -> Result<Answer, NotSent> {
        let dry_run = match self.mode {
            Mode::Delete => false,
            Mode::DryRun { server_side: false } => {
                self.fence.check()?;
                return Ok(Answer::Dry(DeleteResult::Deleted));
            }
            Mode::DryRun { server_side: true } => true,
        };
        let deadline = self.fenced(deadline)?;
        let params = DeleteParams {
            dry_run,
            preconditions: Some(Preconditions {
                uid: Some(volume.uid.clone()),
                resource_version: Some(volume.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let sent = tokio::time::timeout_at(deadline, api.delete(&volume.name, &params));
        let result = answered(sent.await, ("volume", &volume.name), metrics);
        Ok(if dry_run {
            Answer::Dry(result)
        } else {
            Answer::Real(result)
        })
    }

    /// Publishes an event on the claim, if this replica leads; failures are logged and counted,
    /// never fatal.
    pub async fn notify(&self, claim: &ClaimFacts, notice: Notice, metrics: &Metrics) {
        let (type_, reason, note) = match notice {
            Notice::Deleted(why, retained) => (
                EventType::Normal,
                "Deleted",
                format!(
                    "workspace-gc deleted this claim: {} ({why}){}",
                    why.describe(),
                    retained.map_or_else(String::new, |volume| format!(
                        "; its volume {volume} is kept (reclaim policy Retain): no storage \
                         is freed until it is deleted"
                    ))
                ),
            ),
            Notice::WouldDelete(why) => (
                EventType::Normal,
                "WouldDelete",
                format!(
                    "dry-run: workspace-gc would delete this claim: {} ({why})",
                    why.describe()
                ),
            ),
            Notice::InvalidAnnotation(detail) => (
                EventType::Warning,
                "InvalidAnnotation",
                format!("kept: {detail}"),
            ),
            Notice::NotABuildWorkspace(detail) => (
                EventType::Warning,
                "NotABuildWorkspace",
                format!(
                    "kept, never deleted by workspace-gc: it carries the build-workspace label, \
                     but {detail}; remove the label, or see docs/policy.md#provenance"
                ),
            ),
            Notice::CapReached { max, window } => (
                EventType::Warning,
                "BlastRadiusCapReached",
                if matches!(self.mode, Mode::Delete) {
                    format!(
                        "not deleted yet: {max} claims were deleted within {window}, the \
                         configured maximum; deletions resume when the window allows"
                    )
                } else {
                    format!(
                        "dry-run: not even a would-delete yet: {max} claims would have been \
                         deleted within {window}, the configured maximum; nothing was deleted"
                    )
                },
            ),
            Notice::ClockDisputed { window } => (
                EventType::Warning,
                "ServerClockDisputed",
                format!(
                    "not deleted yet: the API server's answers disagree about its clock by more \
                     than {tolerance} (API servers behind one address whose clocks disagree, or \
                     a clock stepped), so the deletions of the last {window} cannot be dated \
                     for the blast-radius cap; it counts the window as full until answers agree \
                     within {tolerance} for {window}",
                    tolerance = humantime::format_duration(TOLERATED_DISAGREEMENT)
                ),
            ),
            Notice::DeletionScheduled { at, reason } => (
                EventType::Normal,
                "DeletionScheduled",
                format!(
                    "{}workspace-gc will delete this claim at {at}: {} ({reason}); to keep it, \
                     annotate it {KEEP}: \"true\"",
                    if matches!(self.mode, Mode::Delete) {
                        ""
                    } else {
                        "dry-run: "
                    },
                    reason.describe()
                ),
            ),
        };
        self.publish(type_, reason, note, &reference(claim), &claim.key, metrics)
            .await;
    }

    /// A warning on the ResourceQuota that stays at high water with nothing more to delete, if
    /// this replica leads.
    pub async fn notify_quota_pressure(&self, pressure: &Pressure, metrics: &Metrics) {
        let quota = &pressure.quota;
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ResourceQuota".into()),
            namespace: Some(quota.namespace.to_string()),
            name: Some(quota.name.clone()),
            uid: Some(pressure.quota_uid.clone()),
            ..ObjectReference::default()
        };
        let note = format!(
            "{pressure}: workspace-gc has no more finished build workspaces to delete in this \
             namespace; raise the quota or delete claims by hand"
        );
        let reason = "QuotaPressure";
        self.publish(EventType::Warning, reason, note, &reference, quota, metrics)
            .await;
    }

    /// A warning on a Namespace, if this replica leads. Written in that namespace, where its
    /// team looks.
    pub async fn notify_namespace(
        &self,
        namespace: &str,
        notice: &NamespaceNotice,
        metrics: &Metrics,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            namespace: Some(namespace.to_owned()),
            name: Some(namespace.to_owned()),
            ..ObjectReference::default()
        };
        let (reason, note) = match notice {
            NamespaceNotice::InvalidPolicy(invalid) => {
                let problems: Vec<String> = invalid.iter().map(ToString::to_string).collect();
                let note = format!(
                    "workspace-gc keeps every claim in this namespace until its annotations are fixed: {}",
                    problems.join("; ")
                );
                ("InvalidNamespacePolicy", note)
            }
            NamespaceNotice::UnprovenLabelFlood { claims, within } => (
                "UnprovenLabelFlood",
                format!(
                    "{claims} claims here gained the build-workspace label without the provenance \
                     of a build workspace within {within}: a common label applied to the \
                     namespace, most likely; workspace-gc keeps them (reason \
                     not-a-build-workspace); remove the label from claims that are not build \
                     workspaces"
                ),
            ),
        };
        let key = ObjectKey::new(namespace, namespace);
        self.publish(EventType::Warning, reason, note, &reference, &key, metrics)
            .await;
    }

    /// Publishes an event, if this replica leads; failures are logged and counted, never fatal.
    async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        regarding: &ObjectReference,
        key: &ObjectKey,
        metrics: &Metrics,
    ) {
        if let Err(error) = self.fence.check() {
            debug!(object = %key, %error, "event not written");
            return;
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(bounded(note)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            metrics.api_error(Operation::Event, &error);
            warn!(object = %key, %error, "could not publish event");
        }
    }
}

/// How long a mark's write may take: it is not bound to a live re-check, only to the fence.
const MARK_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a revocation may take before it is tried again; the claim is kept meanwhile.
const REVOKE_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// The most writes one revocation makes before it gives up unproven: each carries a fresh
/// nonce, so only a write no one could foresee was answered unchanged.
const REVOKE_WRITES: usize = 3;

/// A nonce no one can foresee, from the system's secure random source; `None` if it fails.
fn nonce() -> Option<u64> {
    let mut bytes = [0; 8];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// Whether the API server answered that it could not call an admission webhook (failurePolicy
/// Fail, the webhook's pods down or slow): its own refusal, given before the request is
/// carried out. Its message is the apiserver's `ErrCallingWebhook`.
fn webhook_failed(status: &kube::core::Status) -> bool {
    status.message.contains("failed calling webhook \"")
}

/// A 5xx, or no HTTP answer at all: nothing says whether the request was carried out.
fn is_server_error(error: &kube::Error) -> bool {
    !matches!(error, kube::Error::Api(status) if status.code < 500)
}

/// What a DELETE's answer (or its absence before the deadline) says, for `(kind, object)`.
fn answered<T>(
    sent: Result<Result<T, kube::Error>, tokio::time::error::Elapsed>,
    (kind, object): (&str, &str),
    metrics: &Metrics,
) -> DeleteResult {
    match sent {
        Ok(Ok(_)) => DeleteResult::Deleted,
        Ok(Err(kube::Error::Api(status))) if status.is_not_found() => DeleteResult::NotFound,
        Ok(Err(kube::Error::Api(status))) if status.is_conflict() => DeleteResult::Conflict,
        // A 5xx (a timeout, a proxy in front of the API server) does not say whether the server
        // carried the delete out; 429 and the other 4xx refuse it beforehand, and so does a
        // 5xx that says an admission webhook could not be called: admission runs before
        // anything is stored.
        Ok(Err(kube::Error::Api(status))) if status.code >= 500 && !webhook_failed(&status) => {
            let error = kube::Error::Api(status);
            metrics.api_error(Operation::Delete, &error);
            warn!(%object, %error, "delete answered with a server error; it may have been carried out");
            DeleteResult::Unanswered
        }
        Ok(Err(kube::Error::Api(status))) if status.code == 429 => {
            let error = kube::Error::Api(status);
            metrics.api_error(Operation::Delete, &error);
            warn!(%object, %error, "delete throttled; tried again soon");
            DeleteResult::Throttled
        }
        Ok(Err(error @ kube::Error::Api(_))) => {
            metrics.api_error(Operation::Delete, &error);
            if ErrorCategory::of(&error) == ErrorCategory::AdmissionDenied {
                // The message names the policy and the rule broken.
                warn!(%object, %error, "delete refused by admission, {kind} kept: \
                      the daemon and its admission guard disagree");
            } else {
                warn!(%object, %error, "delete refused");
            }
            DeleteResult::Denied
        }
        Ok(Err(error)) => {
            metrics.api_error(Operation::Delete, &error);
            warn!(%object, %error, "delete got no answer; it may have been carried out");
            DeleteResult::Unanswered
        }
        Err(_) => {
            metrics.api_timeout(Operation::Delete);
            warn!(%object, "delete got no answer before its deadline; it may have been carried out");
            DeleteResult::Unanswered
        }
    }
}

/// The Events API refuses a note over 1024 bytes; cut at a character boundary.
fn bounded(mut note: String) -> String {
    const LIMIT: usize = 1024;
    if note.len() > LIMIT {
        let mut cut = LIMIT - '…'.len_utf8();
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push('…');
    }
    note
}

fn reference(claim: &ClaimFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(claim.key.namespace.to_string()),
        name: Some(claim.key.name.clone()),
        uid: Some(claim.uid.clone()),
        resource_version: Some(claim.resource_version.clone()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::cap_ledger::Ledger;
    use http::{Request, Response};
    use kube::client::Body;
    use prometheus_client::registry::Registry;
    use serde_json::{Value, json};

    fn claim() -> ClaimFacts {
        ClaimFacts {
            uid: "uid-1".into(),
            resource_version: "42".into(),
            ..ClaimFacts::example("nb-build-workspace")
        }
    }

    fn ledger() -> String {
        Ledger::new(std::time::Duration::from_secs(60)).to_annotation()
    }

    /// A deadline the test's mock server easily meets.
    fn soon() -> Instant {
        Instant::now() + std::time::Duration::from_secs(30)
    }

    /// Sends one delete through a mock API server; returns the request's query and body and
    /// the writer's result for the given response status.
    async fn delete_against(mode: Mode, status: u16) -> Option<(String, Value, Answer)> {
        delete_answered(mode, status, "m").await
    }

    /// [`delete_against`], the answer's message `message`.
    async fn delete_answered(
        mode: Mode,
        status: u16,
        message: &'static str,
    ) -> Option<(String, Value, Answer)> {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = Writer::new(
            kube::Client::new(service, "default"),
            mode,
            None,
            Fence::unfenced(),
        );
        let metrics = Metrics::register(&mut Registry::default());
        let server = tokio::spawn(async move {
            let (request, reply) = handle.next_request().await?;
            assert_eq!(request.method(), http::Method::DELETE);
            assert_eq!(
                request.uri().path(),
                "/api/v1/namespaces/ml/persistentvolumeclaims/nb-build-workspace"
            );
            let query = request.uri().query().unwrap_or("").to_owned();
            let body = request.into_body().collect_bytes().await.ok()?;
            let body: Value = serde_json::from_slice(&body).ok()?;
            let response = if status == 200 {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200})
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                       "reason": match status {
                           409 => "Conflict",
                           404 => "NotFound",
                           429 => "TooManyRequests",
                           500 => "InternalError",
                           503 => "ServiceUnavailable",
                           _ => "Timeout",
                       }, "message": message})
            };
            reply.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&response).ok()?))
                    .ok()?,
            );
            Some((query, body))
        });
        // Bounded both ways: a writer that sends nothing would leave the server waiting, one
        // that waits for a second answer would wait forever.
        let result = bounded_wait(writer.delete(&claim(), (&ledger(), 1), soon(), &metrics))
            .await
            .expect("unfenced");
        let (query, body) = bounded_wait(server).await.ok()??;
        Some((query, body, result))
    }

    /// `future`'s output, or a failed test after a few seconds: a mock server that is never
    /// answered (or never asked) must fail the test, not hang it.
    async fn bounded_wait<F: std::future::Future>(future: F) -> F::Output {
        tokio::time::timeout(std::time::Duration::from_secs(5), future)
            .await
            .expect("the exchange with the mock API server finished within 5 s")
    }

    #[test]
    fn event_notes_fit_the_events_api() {
        assert_eq!(bounded("short".into()), "short");
        let long = bounded("é".repeat(2000));
        assert!(long.len() <= 1024 && long.ends_with('…'), "{}", long.len());
    }

    #[tokio::test]
    async fn deletes_carry_preconditions_and_background_propagation() {
        let (query, body, result) = delete_against(Mode::Delete, 200).await.unwrap();
        assert_eq!(result, Answer::Real(DeleteResult::Deleted));
        assert!(!query.contains("dryRun"), "{query}");
        assert_eq!(
            body["preconditions"],
            json!({"uid": "uid-1", "resourceVersion": "42"})
        );
        assert_eq!(body["propagationPolicy"], "Background");
        assert!(
            body.get("dryRun").is_none() || body["dryRun"] == json!([]),
            "{body}"
        );
    }

    #[tokio::test]
    async fn server_side_dry_run_sends_dry_run_all() {
        let (query, body, result) = delete_against(Mode::DryRun { server_side: true }, 200)
            .await
            .unwrap();
        assert_eq!(result, Answer::Dry(DeleteResult::Deleted));
        let dry_run = query.contains("dryRun=All") || body["dryRun"] == json!(["All"]);
        assert!(dry_run, "query {query}, body {body}");
        assert_eq!(body["preconditions"]["uid"], "uid-1");
    }

    #[tokio::test]
    async fn conflict_and_not_found_are_told_apart() {
        let (_, _, result) = delete_against(Mode::Delete, 409).await.unwrap();
        assert_eq!(result, Answer::Real(DeleteResult::Conflict));
        let (_, _, result) = delete_against(Mode::Delete, 404).await.unwrap();
        assert_eq!(result, Answer::Real(DeleteResult::NotFound));
    }

    #[tokio::test]
    async fn client_side_dry_run_sends_nothing() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = Writer::new(
            kube::Client::new(service, "default"),
            Mode::DryRun { server_side: false },
            None,
            Fence::unfenced(),
        );
        let metrics = Metrics::register(&mut Registry::default());
        // A delete sent by mistake would wait for an answer that never comes: fail on it.
        let result = bounded_wait(writer.delete(&claim(), (&ledger(), 1), soon(), &metrics)).await;
        assert_eq!(result.ok(), Some(Answer::Dry(DeleteResult::Deleted)));
        handle.allow(0);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request())
                .await
                .is_err(),
            "no request reached the server"
        );
    }

    #[tokio::test]
    async fn throttling_and_denial_are_told_apart_and_a_server_error_may_have_been_carried_out() {
        // Each sent once (delete_against's server takes one request).
        let (_, _, result) = delete_against(Mode::Delete, 429).await.unwrap();
        assert_eq!(result, Answer::Real(DeleteResult::Throttled));
        for status in [400, 403, 422] {
            let (_, _, result) = delete_against(Mode::Delete, status).await.unwrap();
            assert_eq!(result, Answer::Real(DeleteResult::Denied), "{status}");
        }
        for status in [500, 503, 504] {
            let (_, _, result) = delete_against(Mode::Delete, status).await.unwrap();
            assert_eq!(result, Answer::Real(DeleteResult::Unanswered), "{status}");
        }
    }

    /// The API server's own 500 when a validating webhook cannot be called (failurePolicy
    /// Fail): admission refused it before anything was stored.
    #[tokio::test]
    async fn a_webhook_that_cannot_be_called_refuses_the_delete() {
        let message = "Internal error occurred: failed calling webhook \"guard.example.com\": \
                       failed to call webhook: Post \"https://guard.svc:443/validate\": \
                       dial tcp 10.0.0.9:443: connect: connection refused";
        let (_, _, result) = delete_answered(Mode::Delete, 500, message).await.unwrap();
        assert_eq!(result, Answer::Real(DeleteResult::Denied));
    }

    /// A writer whose mock server takes every request and answers none unless the test does
    /// through the handle, which counts them.
    fn unanswering() -> (
        Writer,
        tower_test::mock::Handle<Request<Body>, Response<Body>>,
    ) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = Writer::new(
            kube::Client::new(service, "default"),
            Mode::Delete,
            None,
            Fence::unfenced(),
        );
        (writer, handle)
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_past_its_deadline_is_not_sent() {
        let (writer, mut handle) = unanswering();
        let metrics = Metrics::register(&mut Registry::default());
        let result = writer
            .delete(&claim(), (&ledger(), 1), Instant::now(), &metrics)
            .await;
        assert!(matches!(result, Err(NotSent::TooLate)), "{result:?}");
        handle.allow(1);
        let request =
            tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request());
        assert!(request.await.is_err(), "nothing reached the server");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_delete_is_abandoned_at_its_deadline_as_unanswered() {
        let (writer, mut handle) = unanswering();
        let metrics = Metrics::register(&mut Registry::default());
        let started = Instant::now();
        let deadline = started + std::time::Duration::from_secs(3);
        let server = tokio::spawn(async move {
            // Takes the request and holds it unanswered past the deadline.
            let (_request, reply) = handle.next_request().await?;
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            drop(reply);
            Some(())
        });
        let result = writer
            .delete(&claim(), (&ledger(), 1), deadline, &metrics)
            .await;
        assert_eq!(result.ok(), Some(Answer::Real(DeleteResult::Unanswered)));
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(3));
        server.abort();
    }

    /// One revocation through a mock API server answering `status` with `answer`: the
    /// request's method, path and body, and what the writer made of it.
    async fn revoke_against(
        status: u16,
        answer: Value,
    ) -> (http::Method, String, Value, Revocation) {
        let delete = InFlight {
            namespace: "ml".into(),
            name: "nb-build-workspace".into(),
            uid: "uid-1".into(),
            resource_version: "42".into(),
        };
        let revoke = |writer: Writer, metrics: Metrics| async move {
            writer.revoke(&delete, &metrics).await
        };
        one_write(revoke, status, answer).await
    }

    fn claim_object(deleting: bool) -> Value {
        let mut claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "nb-build-workspace", "namespace": "ml", "uid": "uid-1",
                         "resourceVersion": "43"}});
        if deleting {
            claim["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        claim
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
               "reason": reason, "message": "m"})
    }

    #[tokio::test]
    async fn a_revocation_changes_the_claim_as_named_and_reads_what_it_found() {
        let (method, path, body, result) = revoke_against(200, claim_object(false)).await;
        assert_eq!(method, http::Method::PATCH);
        assert_eq!(
            path,
            "/api/v1/namespaces/ml/persistentvolumeclaims/nb-build-workspace"
        );
        // The UID is the precondition; the annotation's value is the revoked resourceVersion
        // and a nonce, so the patch always changes the claim.
        assert_eq!(body["metadata"]["uid"], "uid-1");
        let value = body["metadata"]["annotations"][REVOKED].as_str().unwrap();
        assert_eq!(annotations::revoked_version(value), "42", "{value}");
        assert_eq!(value.len(), "42/".len() + 16, "{value}");
        assert_eq!(body["metadata"].as_object().unwrap().len(), 2, "{body}");
        assert_eq!(
            body["metadata"]["annotations"].as_object().unwrap().len(),
            1
        );
        assert_eq!(result, Revocation::Revoked);
        let (_, _, _, result) = revoke_against(200, claim_object(true)).await;
        assert_eq!(result, Revocation::Landed, "being deleted");
        let (_, _, _, result) = revoke_against(404, status(404, "NotFound")).await;
        assert_eq!(result, Revocation::Landed, "gone");
        for (code, reason) in [(422, "Invalid"), (403, "Forbidden"), (409, "Conflict")] {
            let (_, _, _, result) = revoke_against(code, status(code, reason)).await;
            assert_eq!(result, Revocation::Refused, "{code}");
        }
        for (code, reason) in [(500, "InternalError"), (503, "ServiceUnavailable")] {
            let (_, _, _, result) = revoke_against(code, status(code, reason)).await;
            assert_eq!(result, Revocation::Unanswered, "{code}");
        }
    }

    /// Revocations through a mock API server that answers each PATCH with the claim, its
    /// resourceVersion the next of `versions` (the last repeated; `""`: none): the bodies sent, in order,
    /// and what the writer made of them.
    async fn revoke_through(versions: &[&str]) -> (Vec<Value>, Revocation) {
        let (writer, mut handle) = unanswering();
        let metrics = Metrics::register(&mut Registry::default());
        let versions: Vec<String> = versions.iter().map(|v| (*v).to_owned()).collect();
        let server = tokio::spawn(async move {
            let mut bodies = Vec::new();
            while let Some((request, reply)) = handle.next_request().await {
                let body = request.into_body().collect_bytes().await.unwrap();
                bodies.push(serde_json::from_slice::<Value>(&body).unwrap());
                let version = &versions[(bodies.len() - 1).min(versions.len() - 1)];
                let mut claim = claim_object(false);
                claim["metadata"]["resourceVersion"] = json!(version);
                if version.is_empty() {
                    claim["metadata"]
                        .as_object_mut()
                        .unwrap()
                        .remove("resourceVersion");
                }
                let response = Response::builder()
                    .status(200)
                    .body(Body::from(serde_json::to_vec(&claim).unwrap()))
                    .unwrap();
                reply.send_response(response);
            }
            bodies
        });
        let delete = InFlight {
            namespace: "ml".into(),
            name: "nb-build-workspace".into(),
            uid: "uid-1".into(),
            resource_version: "42".into(),
        };
        let result = bounded_wait(writer.revoke(&delete, &metrics)).await;
        drop(writer);
        let bodies = bounded_wait(server).await.unwrap();
        (bodies, result)
    }

    /// A 200 whose resourceVersion is still the DELETE's precondition changed nothing (the
    /// annotation held the value written): the DELETE can still land. Never taken as revoked:
    /// written again with a value that cannot be there, and, when no write ever changes the
    /// claim, the DELETE stays owed.
    #[tokio::test]
    async fn a_revocation_is_proven_by_a_new_resource_version_not_by_a_200() {
        let (bodies, result) = revoke_through(&["42", "43"]).await;
        assert_eq!(
            result,
            Revocation::Revoked,
            "the second write changed the claim"
        );
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        let value = |body: &Value| body["metadata"]["annotations"][REVOKED].clone();
        assert_ne!(value(&bodies[0]), value(&bodies[1]), "a fresh value");
        for body in &bodies {
            assert_eq!(body["metadata"]["uid"], "uid-1");
        }
        let (bodies, result) = revoke_through(&["42"]).await;
        assert_eq!(result, Revocation::Unanswered, "never proven: still owed");
        assert!(bodies.len() >= 2, "{bodies:?}");
        let (_, result) = revoke_through(&[""]).await;
        assert_eq!(
            result,
            Revocation::Unanswered,
            "an answer without a version proves nothing"
        );
    }

    /// A volume, as judged: its UID and resourceVersion go with every write.
    fn volume() -> VolumeFacts {
        VolumeFacts::example("uid-1")
    }

    /// One write through a mock API server answering `status` with `answer`: the request's
    /// method, path and body, and the writer's result.
    async fn one_write<T, F>(
        write: impl FnOnce(Writer, Metrics) -> F,
        status: u16,
        answer: Value,
    ) -> (http::Method, String, Value, T)
    where
        F: std::future::Future<Output = T>,
    {
        let (writer, mut handle) = unanswering();
        let metrics = Metrics::register(&mut Registry::default());
        let server = tokio::spawn(async move {
            let (request, reply) = handle.next_request().await.expect("a request");
            let (method, path) = (request.method().clone(), request.uri().path().to_owned());
            let body = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            let response = Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap();
            reply.send_response(response);
            (method, path, body)
        });
        let result = bounded_wait(write(writer, metrics)).await;
        let (method, path, body) = bounded_wait(server).await.unwrap();
        (method, path, body, result)
    }

    #[tokio::test]
    async fn a_volume_delete_carries_its_uid_and_resource_version() {
        let status =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200});
        let (method, path, body, result) = one_write(
            |writer, metrics| async move {
                writer.delete_volume(&volume(), soon(), &metrics).await.ok()
            },
            200,
            status,
        )
        .await;
        assert_eq!(result, Some(Answer::Real(DeleteResult::Deleted)));
        assert_eq!(method, http::Method::DELETE);
        assert_eq!(path, "/api/v1/persistentvolumes/pv-1");
        assert_eq!(
            body["preconditions"],
            json!({"uid": "pv-uid", "resourceVersion": "7"})
        );
    }

    #[tokio::test]
    async fn the_mark_carries_the_volumes_uid_not_its_resource_version() {
        let marked = json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1", "uid": "pv-uid", "resourceVersion": "8",
                         "annotations": {DELETED_CLAIM_UID: "uid-1"}}});
        let (method, path, body, result) = one_write(
            |writer, metrics| async move { writer.mark_volume(&volume(), "uid-1", &metrics).await },
            200,
            marked,
        )
        .await;
        assert_eq!(method, http::Method::PATCH);
        assert_eq!(path, "/api/v1/persistentvolumes/pv-1");
        // The PV controller changes the volume as its claim goes: only its UID must hold.
        assert_eq!(
            body,
            json!({"metadata": {"uid": "pv-uid", "annotations": {DELETED_CLAIM_UID: "uid-1"}}})
        );
        let marked = result.expect("marked");
        assert_eq!(marked.resource_version, "8");
        assert_eq!(marked.marked_claim_uid.as_deref(), Some("uid-1"));
    }

    #[tokio::test(start_paused = true)]
    async fn no_volume_write_goes_out_past_its_deadline_or_in_a_dry_run() {
        let (writer, mut handle) = unanswering();
        let metrics = Metrics::register(&mut Registry::default());
        let late = writer
            .delete_volume(&volume(), Instant::now(), &metrics)
            .await;
        assert!(matches!(late, Err(NotSent::TooLate)), "{late:?}");
        let dry = Writer {
            mode: Mode::DryRun { server_side: false },
            ..writer
        };
        let marked = dry.mark_volume(&volume(), "uid-1", &metrics).await;
        assert_eq!(marked, None);
        handle.allow(1);
        let request =
            tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request());
        assert!(request.await.is_err(), "nothing reached the server");
    }
}
