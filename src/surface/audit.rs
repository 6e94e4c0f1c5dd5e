//! The audit report: every tracked claim with its owners, build state, age, size, verdict,
//! reason and when the verdict changes, and each namespace's quota situation. Built from the
//! same cache, linking, policy and quota plan as the daemon's decisions, so the report is what
//! the daemon would do.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::cluster::cache::Index;
use crate::decide::facts::{Facts, Owner, OwnerState, Progress};
use crate::decide::linking::{self, Found};
use crate::decide::namespace::{Policies, PolicySource};
use crate::decide::policy::{self, Decision, Reason, Verdict, VerdictState};
use crate::decide::quota::{self, Waters};

/// One claim's line in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub namespace: String,
    pub name: String,
    pub owners: Vec<Owner>,
    /// A one-word summary of the build: running, finished, gone, none, unknown.
    pub build: &'static str,
    pub created: DateTime<Utc>,
    pub size_bytes: Option<u64>,
    /// Which policy applied: the cluster's, or the namespace annotations that refined it.
    pub policy: PolicySource,
    /// The PersistentVolume the claim is bound to, if any.
    pub volume: Option<String>,
    /// What that volume's reclaim policy does once the claim is deleted (see [`with_volumes`]).
    pub volume_policy: VolumePolicy,
    #[serde(flatten)]
    pub decision: Decision,
}

/// Decides every claim in the index at `now`, sorted by namespace and name.
pub fn rows(index: &Index, policies: &Policies, now: DateTime<Utc>) -> Vec<Row> {
    let mut rows: Vec<Row> = index
        .claims()
        .map(|claim| {
            let facts = linking::facts(claim, index);
            let effective =
                policies.for_namespace(index.namespace_annotations(&claim.key.namespace));
            let decision = effective.explain(policy::decide(&facts, &effective.policy, now));
            row(facts, effective.source, decision)
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// A claim's volume, by what its deletion frees: a `Retain` volume stays, `Released`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum VolumePolicy {
    Delete,
    Retain,
    /// Bound, but the volume could not be read, or has another policy (`Recycle`).
    #[serde(rename = "unknown")]
    Unknown,
    #[serde(rename = "unbound")]
    Unbound,
}

impl VolumePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumePolicy::Delete => "Delete",
            VolumePolicy::Retain => "Retain",
            VolumePolicy::Unknown => "unknown",
            VolumePolicy::Unbound => "unbound",
        }
    }
}

/// Fills in each bound claim's volume policy from the reclaim policies read (by volume name);
/// a volume missing from `read` is `unknown`.
pub fn with_volumes(rows: &mut [Row], read: &BTreeMap<String, String>) {
    for row in rows {
        let Some(volume) = &row.volume else {
            continue;
        };
        row.volume_policy = match read.get(volume).map(String::as_str) {
            Some("Delete") => VolumePolicy::Delete,
            Some("Retain") => VolumePolicy::Retain,
            _ => VolumePolicy::Unknown,
        };
    }
}

/// One quota resource's line in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaRow {
    pub namespace: String,
    pub quota: String,
    pub resource: String,
    pub used: u64,
    pub hard: u64,
    /// `ok`, `pressure` (at high water; the plan deletes claims) or `unrelieved` (at high
    /// water with nothing more that may be deleted).
    pub state: &'static str,
}

/// Every namespace's quotas, and the claims pressure would delete now: their rows become
/// `delete` / `quota-pressure` verdicts, as the daemon would act on them.
pub fn quotas(
    index: &Index,
    policies: &Policies,
    waters: Waters,
    now: DateTime<Utc>,
    rows: &mut [Row],
) -> Vec<QuotaRow> {
    let mut out = Vec::new();
    for namespace in index.quota_namespaces() {
        let Found::Yes(quotas) = index.quotas_in(&namespace) else {
            continue;
        };
        let policy = policies.for_namespace(index.namespace_annotations(&namespace));
        let claims =
            quota::Candidate::all_of(index.claims_in(&namespace), index, &policy.policy, now);
        let plan = quota::plan(&quotas, &claims, &quota::Round::default(), waters);
        for row in rows.iter_mut().filter(|r| r.namespace == namespace) {
            let taken = plan.victims.iter().any(|key| key.name == row.name);
            if let (true, Some(pressure)) = (taken, plan.pressed.first()) {
                row.decision = Decision {
                    verdict: Verdict::Delete {
                        reason: Reason::QuotaPressure,
                        due_at: None,
                    },
                    detail: Some(pressure.to_string()),
                };
            }
        }
        for quota in &quotas {
            for limit in &quota.limits {
                let same =
                    |p: &quota::Pressure| p.quota == quota.key && p.resource == limit.resource;
                let state = if plan.unrelieved.iter().any(same) {
                    "unrelieved"
                } else if plan.pressed.iter().any(same) {
                    "pressure"
                } else {
                    "ok"
                };
                out.push(QuotaRow {
                    namespace: namespace.clone(),
                    quota: quota.key.name.clone(),
                    resource: limit.resource.to_string(),
                    used: limit.used,
                    hard: limit.hard,
                    state,
                });
            }
        }
    }
    out
}

fn row(facts: Facts, policy: PolicySource, decision: Decision) -> Row {
    Row {
        policy,
        build: build_state(&facts.owners),
        namespace: facts.claim.key.namespace.to_string(),
        name: facts.claim.key.name,
        owners: facts.owners,
        created: facts.claim.created,
        size_bytes: facts.claim.requested_bytes,
        volume_policy: if facts.claim.volume_name.is_some() {
            VolumePolicy::Unknown
        } else {
            VolumePolicy::Unbound
        },
        volume: facts.claim.volume_name,
        decision,
    }
}

fn build_state(owners: &[Owner]) -> &'static str {
    let states = || owners.iter().map(|o| &o.state);
    if owners.is_empty() {
        "none"
    } else if states().any(|s| matches!(s, OwnerState::Unknown { .. })) {
        "unknown"
    } else if states().any(|s| {
        matches!(
            s,
            OwnerState::Present {
                progress: Progress::Running,
                ..
            }
        )
    }) {
        "running"
    } else if states().all(|s| *s == OwnerState::Gone) {
        "gone"
    } else {
        "finished"
    }
}

/// How many rows would be deleted.
pub fn due(rows: &[Row]) -> usize {
    rows.iter()
        .filter(|r| r.decision.verdict.state() == VerdictState::Delete)
        .count()
}

pub fn json(rows: &[Row]) -> String {
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string_pretty(rows).unwrap_or_default() + "\n"
}

/// The table's first line: whether the API server holds the label guard. Where it does not,
/// the claims' managedFields record alone decides provenance, and the reader must know.
pub fn header(guard: &crate::cluster::label_guard::LabelGuard) -> String {
    use crate::cluster::label_guard::LabelGuard;
    let state = match guard {
        LabelGuard::Installed => "installed",
        LabelGuard::Absent(_) => "NOT INSTALLED",
        LabelGuard::Unreadable(_) => "NOT KNOWN",
    };
    format!("label guard: {state}: {}\n\n", guard.describe())
}

/// A fixed-width table for a terminal, with a summary line.
pub fn table(rows: &[Row], now: DateTime<Utc>) -> String {
    let header = [
        "NAMESPACE",
        "NAME",
        "OWNERS",
        "BUILD",
        "AGE",
        "SIZE",
        "VERDICT",
        "REASON",
        "CHANGES",
        "RECLAIM",
        "POLICY",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.namespace.clone(),
                row.name.clone(),
                owners(&row.owners),
                row.build.to_owned(),
                short(now - row.created),
                row.size_bytes.map_or_else(|| "?".into(), size),
                row.decision.verdict.state().as_str().to_owned(),
                row.decision.verdict.reason().as_str().to_owned(),
                row.decision
                    .verdict
                    .recheck_at()
                    .map_or_else(|| "-".into(), |at| format!("in {}", short(at - now))),
                row.volume_policy.as_str().to_owned(),
                row.policy.to_string(),
            ]
        })
        .collect();
    let mut out = aligned(&header, &cells);
    let _ = writeln!(
        out,
        "\n{} claims: {} to delete, {} protected, {} kept",
        rows.len(),
        due(rows),
        count(rows, VerdictState::Protected),
        count(rows, VerdictState::Keep)
    );
    out.push_str(&unproven(rows));
    out
}

/// The labelled claims kept as no build workspace, each with what it lacks: a mislabelled
/// claim is for an admin to see, not to lose. Empty when there are none.
fn unproven(rows: &[Row]) -> String {
    let unproven: Vec<&Row> = (rows.iter())
        .filter(|r| r.decision.verdict.reason() == Reason::NotABuildWorkspace)
        .collect();
    if unproven.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "{} labelled claims are no build workspace (kept; docs/policy.md#provenance):\n",
        unproven.len()
    );
    for row in unproven {
        let detail = row.decision.detail.as_deref().unwrap_or_default();
        let _ = writeln!(out, "  {}/{}: {detail}", row.namespace, row.name);
    }
    out
}

/// The quota table, after the claims'; empty when no namespace has a quota claims count toward.
pub fn quota_table(quotas: &[QuotaRow]) -> String {
    if quotas.is_empty() {
        return String::new();
    }
    let header = [
        "NAMESPACE",
        "QUOTA",
        "RESOURCE",
        "USED",
        "HARD",
        "RATIO",
        "STATE",
    ];
    let amount = |q: &QuotaRow, n: u64| {
        if q.resource.ends_with("requests.storage") {
            size(n)
        } else {
            n.to_string()
        }
    };
    let cells: Vec<Vec<String>> = quotas
        .iter()
        .map(|q| {
            #[allow(clippy::cast_precision_loss)]
            let percent = q.used as f64 / q.hard as f64 * 100.0;
            vec![
                q.namespace.clone(),
                q.quota.clone(),
                q.resource.clone(),
                amount(q, q.used),
                amount(q, q.hard),
                format!("{percent:.0}%"),
                q.state.to_owned(),
            ]
        })
        .collect();
    format!("\n{}", aligned(&header, &cells))
}

/// Left-aligned columns, two spaces apart, the last one unpadded.
fn aligned(header: &[&str], cells: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for line in cells {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for line in std::iter::once(&header).chain(cells) {
        let mut text = String::new();
        for (i, (cell, width)) in line.iter().zip(&widths).enumerate() {
            if i + 1 == line.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn count(rows: &[Row], state: VerdictState) -> usize {
    rows.iter()
        .filter(|r| r.decision.verdict.state() == state)
        .count()
}

fn owners(owners: &[Owner]) -> String {
    if owners.is_empty() {
        return "-".into();
    }
    owners
        .iter()
        .map(|o| {
            let state = match &o.state {
                OwnerState::Present { .. } => "",
                OwnerState::Gone => " (gone)",
                OwnerState::Unknown { .. } => " (unknown)",
            };
            format!("{}/{}{state}", short_kind(o.kind), o.name)
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn short_kind(kind: crate::contract::OwnerKind) -> &'static str {
    match kind {
        crate::contract::OwnerKind::Job => "nvj",
        crate::contract::OwnerKind::Run => "pr",
        crate::contract::OwnerKind::TaskRun => "tr",
    }
}

/// `3d4h`, `45m`, `12s`: two units at most, like kubectl's ages.
pub fn short(duration: Duration) -> String {
    let seconds = duration.num_seconds().max(0);
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds % 86_400 / 3_600,
        seconds % 3_600 / 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) if s == 0 => format!("{m}m"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) if m == 0 => format!("{h}h"),
        (0, _, _) => format!("{h}h{m}m"),
        _ if h == 0 => format!("{d}d"),
        _ => format!("{d}d{h}h"),
    }
}

fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (unit, scale) in UNITS {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cache::{Change, Update};
    use crate::contract::OwnerKind;
    use crate::decide::facts::{
        AccessModes, ClaimFacts, JobEntry, LabelHistory, LabelOwner, ObjectKey, Operation,
        Provenance, RunEntry, VolumeClaims,
    };
    use crate::decide::policy::Policy;
    use chrono::TimeZone;
    use std::collections::BTreeMap;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 2, 12, 0, 0).unwrap()
    }

    fn claim(name: &str, created: DateTime<Utc>) -> ClaimFacts {
        ClaimFacts {
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            resource_version: "1".into(),
            created,
            annotations: BTreeMap::new(),
            owner_references: Vec::new(),
            deletion_timestamp: None,
            requested_bytes: Some(1 << 30),
            storage_class: None,
            volume_name: None,
            reported_in_use: false,
            provenance: Provenance::operator("manager"),
        }
    }

    fn index() -> Index {
        let mut index = Index::default();
        let finished = Progress::Finished {
            at: Some(now() - Duration::hours(3)),
            failed: false,
        };
        for update in [
            Update::Claim(Change::Init(None)),
            Update::Claim(Change::InitApply(
                None,
                claim("done-build-workspace", now() - Duration::hours(4)),
            )),
            Update::Claim(Change::InitApply(
                None,
                claim("young-build-workspace", now() - Duration::minutes(2)),
            )),
            Update::Claim(Change::InitDone(None)),
            Update::Job(Change::Init(None)),
            Update::Job(Change::InitApply(
                None,
                JobEntry {
                    key: ObjectKey::new("ml", "done"),
                    uid: "j1".into(),
                    progress: finished.clone(),
                    volumes: VolumeClaims::Named(Vec::new()),
                },
            )),
            Update::Job(Change::InitDone(None)),
            Update::Run(Change::Init(None)),
            Update::Run(Change::InitApply(
                None,
                RunEntry {
                    kind: OwnerKind::Run,
                    key: ObjectKey::new("ml", "done-build"),
                    uid: "r1".into(),
                    claims: vec!["done-build-workspace".into()],
                    progress: finished,
                },
            )),
            Update::Run(Change::InitDone(None)),
            Update::TaskRun(Change::InitDone(None)),
            Update::Pod(Change::Init(None)),
            Update::Pod(Change::InitDone(None)),
        ] {
            index.update(update);
        }
        assert!(index.synced());
        index
    }

    #[test]
    fn rows_carry_the_daemons_decisions() {
        let rows = rows(&index(), &Policies::cluster_only(Policy::default()), now());
        let summary: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.build,
                    r.decision.verdict.reason().as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("done-build-workspace", "finished", "ttl-expired"),
                ("young-build-workspace", "none", "within-orphan-grace"),
            ]
        );
        assert_eq!(due(&rows), 1);
    }

    /// A labelled claim without provenance is a row like any other, and a line under the table
    /// saying what it lacks; the table has no such lines when every claim is a build workspace.
    #[test]
    fn claims_without_provenance_are_listed_with_what_they_lack() {
        let policies = Policies::cluster_only(Policy::default());
        let plain = table(&rows(&index(), &policies, now()), now());
        assert!(!plain.contains("no build workspace"), "{plain}");
        let mut index = index();
        let mut data = claim("team-data", now() - Duration::days(30));
        data.provenance.label = LabelHistory::Owners(vec![LabelOwner {
            manager: "kubectl-label".into(),
            operation: Operation::Update,
            access_modes: AccessModes::NotOwned,
        }]);
        index.update(Update::Claim(Change::Apply(data)));
        let rows = rows(&index, &policies, now());
        let text = table(&rows, now());
        assert!(
            text.contains("not-a-build-workspace")
                && text.contains("1 labelled claims are no build workspace")
                && text.contains("  ml/team-data: its name has none of the configured shapes"),
            "{text}"
        );
        assert_eq!(due(&rows), 1, "only the finished build's claim is due");
    }

    #[test]
    fn table_lists_every_column() {
        let text = table(
            &rows(&index(), &Policies::cluster_only(Policy::default()), now()),
            now(),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE  NAME"), "{text}");
        assert!(
            lines[1].contains("nvj/done,pr/done-build")
                || lines[1].contains("pr/done-build,nvj/done"),
            "{text}"
        );
        assert!(
            lines[1].contains("4h") && lines[1].contains("1Gi"),
            "{text}"
        );
        assert!(
            lines[1].contains("delete") && lines[1].contains("ttl-expired"),
            "{text}"
        );
        assert!(lines[2].contains("in 8m"), "{text}");
        assert!(lines[1].ends_with("cluster"), "{text}");
        assert!(
            text.contains("2 claims: 1 to delete, 0 protected, 1 kept"),
            "{text}"
        );
    }

    #[test]
    fn each_claim_shows_what_its_volume_keeps() {
        let mut index = index();
        let bound = |name: &str, volume: &str| ClaimFacts {
            volume_name: Some(volume.into()),
            ..claim(name, now() - Duration::hours(4))
        };
        for claim in [
            bound("a-build-workspace", "pv-a"),
            bound("b-build-workspace", "pv-b"),
            bound("c-build-workspace", "pv-c"),
        ] {
            index.update(Update::Claim(Change::Apply(claim)));
        }
        let mut rows = rows(&index, &Policies::cluster_only(Policy::default()), now());
        let read = BTreeMap::from([
            ("pv-a".to_owned(), "Retain".to_owned()),
            ("pv-b".to_owned(), "Delete".to_owned()),
        ]);
        with_volumes(&mut rows, &read);
        let policies: Vec<_> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.volume_policy))
            .collect();
        assert_eq!(
            policies,
            vec![
                ("a-build-workspace", VolumePolicy::Retain),
                ("b-build-workspace", VolumePolicy::Delete),
                // Bound, but its volume was not read.
                ("c-build-workspace", VolumePolicy::Unknown),
                ("done-build-workspace", VolumePolicy::Unbound),
                ("young-build-workspace", VolumePolicy::Unbound),
            ]
        );
        let text = table(&rows, now());
        let columns = |line: usize| -> Vec<String> {
            let words = text.lines().nth(line).unwrap().split_whitespace();
            words.rev().take(2).map(str::to_owned).collect()
        };
        assert_eq!(columns(0), ["POLICY", "RECLAIM"], "{text}");
        assert_eq!(columns(1), ["cluster", "Retain"], "{text}");
        assert_eq!(columns(4), ["cluster", "unbound"], "{text}");
        let value: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(value[0]["volume"], "pv-a");
        assert_eq!(value[0]["volume_policy"], "Retain");
        assert_eq!(value[2]["volume_policy"], "unknown");
        assert_eq!(value[3]["volume_policy"], "unbound");
        assert_eq!(value[3]["volume"], serde_json::Value::Null);
    }

    #[test]
    fn json_is_machine_readable() {
        let text = json(&rows(
            &index(),
            &Policies::cluster_only(Policy::default()),
            now(),
        ));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value[0]["verdict"], "delete");
        assert_eq!(value[0]["reason"], "ttl-expired");
        assert_eq!(value[1]["recheck_at"], "2026-11-02T12:08:00Z");
    }

    #[test]
    fn quotas_show_and_pressure_takes_what_it_would_delete() {
        use crate::decide::quota::{Limit, QuotaEntry, Resource};
        let mut index = index();
        index.update(Update::Quota(Change::Apply(QuotaEntry {
            key: ObjectKey::new("ml", "claims"),
            uid: "q".into(),
            limits: vec![Limit {
                resource: Resource::Claims,
                hard: 2,
                used: 2,
            }],
        })));
        // A 4h TTL: the build that finished 3h ago is within it, so pressure may take it.
        let policy = Policies::cluster_only(Policy {
            ttl_after_finished: Duration::hours(4),
            ..Policy::default()
        });
        let mut rows = rows(&index, &policy, now());
        let waters = Waters {
            high: 0.9,
            low: 0.8,
        };
        let quotas = quotas(&index, &policy, waters, now(), &mut rows);
        assert_eq!(rows[0].decision.verdict.reason(), Reason::QuotaPressure);
        assert_eq!(
            rows[0].decision.detail.as_deref(),
            Some("quota claims persistentvolumeclaims at 100% (2 of 2)")
        );
        assert_eq!(rows[1].decision.verdict.reason(), Reason::WithinOrphanGrace);
        assert_eq!(due(&rows), 1);
        let text = quota_table(&quotas);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "NAMESPACE  QUOTA   RESOURCE                USED  HARD  RATIO  STATE"
        );
        assert_eq!(
            lines[2],
            "ml         claims  persistentvolumeclaims  2     2     100%   pressure"
        );
        assert_eq!(quota_table(&[]), "");
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::seconds(12)), "12s");
        assert_eq!(short(Duration::minutes(45)), "45m");
        assert_eq!(short(Duration::seconds(3 * 3600 + 120)), "3h2m");
        assert_eq!(short(Duration::days(7)), "7d");
        assert_eq!(short(Duration::seconds(-5)), "0s");
    }
}
