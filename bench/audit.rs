//! Request accounting from the kube-apiserver audit log (level Metadata, read with the test
//! kit's testkit/src/audit_log.rs): every request of the contenders' users and of
//! kube-controller-manager, with its verb, resource, namespace, user agent and the instant the
//! server received it.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Result;
use chrono::{DateTime, Utc};

use crate::cluster::{DAEMON_USER, KCM_USER, SWEEP_USER};
use crate::results::Counts;
use testkit::audit_log;

pub fn policy() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n  \
         - level: Metadata\n    users: [\"{DAEMON_USER}\", \"{SWEEP_USER}\", \"{KCM_USER}\"]\n  \
         - level: None\n"
    )
}

#[derive(Debug, Clone)]
pub struct Request {
    pub user: String,
    /// The last `/`-separated part of the user agent: the controller name for
    /// kube-controller-manager (`generic-garbage-collector`, `pvc-protection-controller`).
    pub agent: String,
    pub verb: String,
    pub resource: String,
    pub namespaced: bool,
    /// The path and query asked for.
    pub uri: String,
    pub at: DateTime<Utc>,
    pub code: u16,
}

/// Every request in the log at `path`, once (from its first record: a watch is logged when
/// its response starts and again when it ends).
pub fn read(path: &Path) -> Result<Vec<Request>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for event in audit_log::read_records(path)? {
        if !seen.insert(event.audit_id.clone()) {
            continue;
        }
        let resource = match (event.resource.as_str(), event.subresource.as_str()) {
            ("", _) => "(non-resource)".to_owned(),
            (resource, "") => resource.to_owned(),
            (resource, sub) => format!("{resource}/{sub}"),
        };
        out.push(Request {
            user: event.user,
            agent: event.agent,
            verb: event.verb,
            resource,
            namespaced: !event.namespace.is_empty(),
            uri: event.uri,
            at: event.at,
            code: u16::try_from(event.code).unwrap_or_default(),
        });
    }
    Ok(out)
}

pub fn count(
    requests: &[Request],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    filter: impl Fn(&Request) -> bool,
) -> Counts {
    let mut counts = Counts::default();
    for r in requests
        .iter()
        .filter(|r| r.at >= from && r.at < to && filter(r))
    {
        *counts.by_verb.entry(r.verb.clone()).or_default() += 1;
        *counts
            .by_verb_resource
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
        if r.verb == "list" {
            if r.namespaced {
                counts.namespaced_lists += 1;
            } else {
                counts.cluster_lists += 1;
            }
        }
        if r.code >= 400 {
            *counts
                .errors
                .entry(format!("{} {} {}", r.verb, r.resource, r.code))
                .or_default() += 1;
        }
        counts.total += 1;
    }
    counts
}
