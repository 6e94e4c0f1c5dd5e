//! The API server's audit log (`--audit-log-path`, one JSON event a line): who sent which
//! request when, and how it was answered.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// One completed request.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The UID precondition of a delete (logged at level Request): the incarnation it named.
    pub uid: Option<String>,
    pub code: i64,
    /// When the API server received it.
    pub at: DateTime<Utc>,
}

/// Every completed request in the log at `path` (none if it cannot be read).
pub fn read_audit(path: &Path) -> Vec<AuditEvent> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter_map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            Some(AuditEvent {
                user: e["user"]["username"].as_str()?.to_owned(),
                verb: text(&e["verb"]),
                resource: text(&e["objectRef"]["resource"]),
                namespace: text(&e["objectRef"]["namespace"]),
                name: text(&e["objectRef"]["name"]),
                uid: e["requestObject"]["preconditions"]["uid"]
                    .as_str()
                    .map(str::to_owned),
                code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
                at: DateTime::parse_from_rfc3339(e["requestReceivedTimestamp"].as_str()?)
                    .ok()?
                    .with_timezone(&Utc),
            })
        })
        .collect()
}
