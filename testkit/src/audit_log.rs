//! The API server's audit log (`--audit-log-path`, one JSON event a line): who sent which
//! request when, and how it was answered. The tests and the benchmark (bench/audit.rs) read it.

use std::io::BufRead;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// One record of a request: the log has one per stage the request reached.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// The request's ID, the same in each of its records.
    pub audit_id: String,
    /// `ResponseComplete`, or for a watch also `ResponseStarted` (a watch completes when it
    /// ends).
    pub stage: String,
    pub user: String,
    /// The last `/`-separated part of the user agent: for kube-controller-manager the
    /// controller's name (`generic-garbage-collector`, `pvc-protection-controller`).
    pub agent: String,
    pub verb: String,
    /// Empty for a non-resource request (`/healthz`, `/metrics`).
    pub resource: String,
    pub subresource: String,
    /// Empty for a cluster-wide request.
    pub namespace: String,
    pub name: String,
    /// The path and query asked for (`requestURI`).
    pub uri: String,
    /// The UID precondition of a delete (logged at level Request): the incarnation it named.
    pub uid: Option<String>,
    /// The resourceVersion precondition of a delete (level Request): the version decided on.
    pub resource_version: Option<String>,
    pub code: i64,
    /// When the API server received it.
    pub at: DateTime<Utc>,
    /// When the API server finished answering it (`stageTimestamp`).
    pub completed: DateTime<Utc>,
    /// The request body, where the policy logs it (level Request); `Null` otherwise.
    pub request: Value,
}

impl AuditEvent {
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    fn parse(line: &str) -> Option<AuditEvent> {
        let e = serde_json::from_str::<Value>(line).ok()?;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let time = |v: &Value| {
            DateTime::parse_from_rfc3339(v.as_str()?)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        let precondition = |key: &str| {
            e["requestObject"]["preconditions"][key]
                .as_str()
                .map(str::to_owned)
        };
        let at = time(&e["requestReceivedTimestamp"])?;
        Some(AuditEvent {
            audit_id: text(&e["auditID"]),
            stage: text(&e["stage"]),
            user: e["user"]["username"].as_str()?.to_owned(),
            agent: e["userAgent"]
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            verb: text(&e["verb"]),
            resource: text(&e["objectRef"]["resource"]),
            subresource: text(&e["objectRef"]["subresource"]),
            namespace: text(&e["objectRef"]["namespace"]),
            name: text(&e["objectRef"]["name"]),
            uri: text(&e["requestURI"]),
            uid: precondition("uid"),
            resource_version: precondition("resourceVersion"),
            code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            at,
            completed: time(&e["stageTimestamp"]).unwrap_or(at),
            request: e["requestObject"].clone(),
        })
    }
}

/// Every record in the log at `path`, in the order written; lines that are not an event are
/// passed over.
pub fn read_records(path: &Path) -> std::io::Result<Vec<AuditEvent>> {
    let file = std::fs::File::open(path)?;
    let mut records = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        records.extend(AuditEvent::parse(&line?));
    }
    Ok(records)
}

/// Every completed request in the log at `path` (none if it cannot be read).
pub fn read_audit(path: &Path) -> Vec<AuditEvent> {
    read_records(path)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete")
        .collect()
}
