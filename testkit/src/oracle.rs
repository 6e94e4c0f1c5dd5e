//! The safety rule, encoded once and apart from the implementation: which claims MAY be deleted
//! at `now`, and which MUST be by now. It reads raw API objects (`serde_json::Value`) and shares
//! nothing with `linking.rs`, `policy.rs`, `annotations.rs` or `resources/` but the plain
//! [`Policy`] durations, so a mistake there cannot hide here.
//!
//! A claim MAY be deleted only when all hold:
//! 1. it has no `metadata.deletionTimestamp`, and it is a build workspace: (a) an
//!    ownerReference names NotebookValidationJob (`mlops.mlops.dev`) `{job}` where the claim is
//!    `{job}-build-workspace`; or (b) its name ends with one of the policy's
//!    `provenance.claim_suffixes` after at least one character, its labels include
//!    `app.kubernetes.io/managed-by: jupyter-notebook-validator-operator`,
//!    `app.kubernetes.io/component: tekton-build` and `mlops.redhat.com/build-workspace: "true"`,
//!    and either `metadata.managedFields` is empty or absent and the policy's
//!    `provenance.trust_unrecorded` is set, or at least one entry's `fieldsV1` has
//!    `f:metadata.f:labels.f:mlops.redhat.com/build-workspace`, and no such entry has the
//!    `manager` "ancient-changes", and every such entry has a `manager` among the policy's
//!    `provenance.label_managers`, or has `f:spec.f:accessModes` with `operation` "Update", or
//!    with `operation` "Apply" when no other entry has `f:spec.f:accessModes`;
//! 2. every `workspace-gc.mlops.dev/*` annotation is `keep` (exactly "true" or "false"), `ttl` (humantime,
//!    trimmed, fitting `chrono::Duration`), `expires` (RFC 3339, trimmed) or `revoked-delete`
//!    (any string: the daemon's own record of a revocation as versions before wrote it, which
//!    decides nothing; it now writes it outside the prefix, where it is ignored like any other);
//! 3. `keep` is not "true";
//! 4. no pod of its namespace mounts it unless that pod's phase is "Succeeded" or "Failed"; no
//!    `status.conditions` entry of type "Unused" has status "False"; and no job of its namespace
//!    that is not finished (phase not "Succeeded" or "Failed") names it in
//!    `spec.podConfig.volumes[].persistentVolumeClaim.claimName`, or has volumes that cannot be
//!    read: `podConfig` or `volumes` present, not null and of the wrong type, a volume that is
//!    not an object, or a non-null `persistentVolumeClaim` without a string `claimName`;
//! 5. every ownerReference names NotebookValidationJob (`mlops.mlops.dev`), PipelineRun or
//!    TaskRun (`tekton.dev`);
//! 6. and (a) `expires` ≤ now, or (b) created + max_age ≤ now, or (c) every linked owner allows
//!    it, and with no linked owner, created + orphan_grace ≤ now.
//!
//! Linked owners add up: (i) each managed ownerReference (present with its UID, else gone),
//! (ii) every PipelineRun and TaskRun of the namespace binding the claim in a workspace,
//! (iii) for `{job}-build-workspace`, job `{job}` and PipelineRun `{job}-build` if they exist.
//! An owner allows deletion when gone, or finished with a completion time T (not Go's zero
//! time) and T + ttl ≤ now (ttl: the claim's annotation, else the policy's `ttl_after_failed`
//! when any present linked owner finished and failed — a job in phase "Failed", a run whose
//! `Succeeded` condition is "False" — else its `ttl_after_finished`).
//!
//! Keeping by count (`Policy::keep_failed`, N > 0): the owners do not allow it in (c) while
//! one of its present linked owners that finished and failed either records no completion time
//! T, or has fewer than N objects of its own kind in its namespace that finished, failed and
//! record a completion time after T.
//!
//! With per-namespace settings on ([`World::namespace_bounds`]), the durations above are the
//! claim's Namespace's where it sets them: `workspace-gc.mlops.dev/ttl-after-finished`,
//! `ttl-after-failed`, `orphan-grace` and `max-age`. Nothing may be deleted in a namespace
//! whose Namespace is not among the objects, whose `collect` annotation is "false", or that has
//! any `workspace-gc.mlops.dev/*` annotation but these: `collect` exactly "true" or "false",
//! `keep-failed`, a whole number (trimmed) from the cluster's `keep_failed` to 1000, and the
//! four durations, each parsing (humantime, trimmed, at most 100 years) to at least the
//! cluster's or, when namespaces may shorten, to at least `min_ttl` and more than zero, with
//! max-age, the namespace's or the cluster's, at least orphan-grace. With them off, Namespaces
//! count for nothing.

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;
use workspace_gc::decide::policy::Policy;

const PREFIX: &str = "workspace-gc.mlops.dev/";

/// Raw objects of every kind the rule reads, from any number of namespaces.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub claims: Vec<Value>,
    pub jobs: Vec<Value>,
    pub runs: Vec<Value>,
    pub task_runs: Vec<Value>,
    pub pods: Vec<Value>,
    pub namespaces: Vec<Value>,
    /// `None`: namespace annotations do not count.
    pub namespace_bounds: Option<NamespaceBounds>,
}

/// What a namespace may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceBounds {
    pub may_shorten: bool,
    pub min_ttl: Duration,
}

/// The oracle's answer for one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Judgement {
    /// Conditions 1–6: deleting it now is allowed.
    pub may_delete: bool,
    /// Conditions 1–5 and 6(c): the owners (or their absence) say it is due, so it must go.
    pub must_delete: bool,
    /// Conditions 1–5 and 6(a): its `expires` instant has passed.
    pub expired: bool,
    /// Conditions 1–5 and 6(b): it is older than `max_age`.
    pub too_old: bool,
}

/// The rule for `claim` (one of `world.claims`) at `now`.
pub fn judge(world: &World, claim: &Value, policy: &Policy, now: DateTime<Utc>) -> Judgement {
    let keep = Judgement::default();
    let meta = &claim["metadata"];
    let namespace = text(&meta["namespace"]);
    if !meta["deletionTimestamp"].is_null() || !build_workspace(meta, policy) {
        return keep;
    }
    let Some(policy) = namespace_policy(world, namespace, policy) else {
        return keep;
    };
    let policy = &policy;
    let Some(notes) = notes(meta) else {
        return keep;
    };
    let foreign = list(&meta["ownerReferences"]).any(|r| managed_kind(r).is_none());
    if notes.keep || foreign || in_use(world, claim) {
        return keep;
    }
    let created = instant(&meta["creationTimestamp"]);
    let passed = |since: Option<DateTime<Utc>>, after: Duration| {
        since
            .and_then(|t| t.checked_add_signed(after))
            .is_some_and(|t| t <= now)
    };
    let owners = linked(world, claim);
    let ttl = notes.ttl.unwrap_or_else(|| policy_ttl(&owners, policy));
    let counted = newest_failed(world, namespace, &owners, policy.keep_failed);
    let owners_allow = if counted {
        false
    } else if owners.is_empty() {
        passed(created, policy.orphan_grace)
    } else {
        owners.into_iter().all(|owner| match owner {
            None => true,
            Some((kind, object)) => finished(kind, object) && passed(completion(object), ttl),
        })
    };
    let expired = notes.expires.is_some_and(|t| t <= now);
    let too_old = passed(created, policy.max_age);
    Judgement {
        may_delete: expired || too_old || owners_allow,
        must_delete: owners_allow,
        expired,
        too_old,
    }
}

/// The earliest instant after `now` at which [`judge`] allows deletion, if the objects stay
/// as they are. The rule is monotone in time, so only the instants it compares can be it.
pub fn due_at(
    world: &World,
    claim: &Value,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let meta = &claim["metadata"];
    if !build_workspace(meta, policy) {
        return None;
    }
    let notes = notes(meta)?;
    let policy = &namespace_policy(world, text(&meta["namespace"]), policy)?;
    let created = instant(&meta["creationTimestamp"]);
    let owners = linked(world, claim);
    let ttl = notes.ttl.unwrap_or_else(|| policy_ttl(&owners, policy));
    let mut candidates: Vec<DateTime<Utc>> = notes.expires.into_iter().collect();
    candidates.extend(created.and_then(|t| t.checked_add_signed(policy.max_age)));
    candidates.extend(created.and_then(|t| t.checked_add_signed(policy.orphan_grace)));
    for owner in owners.into_iter().flatten() {
        candidates.extend(completion(owner.1).and_then(|t| t.checked_add_signed(ttl)));
    }
    candidates
        .into_iter()
        .filter(|t| *t > now && judge(world, claim, policy, *t).may_delete)
        .min()
}

/// Condition 1's provenance: the claim names its own job as owner, or the operator made it
/// labelled (name, labels, and who owns the label in `managedFields`).
fn build_workspace(meta: &Value, policy: &Policy) -> bool {
    const LABEL: &str = "mlops.redhat.com/build-workspace";
    let name = text(&meta["name"]);
    let rule = &policy.provenance;
    let its_job = name
        .strip_suffix("-build-workspace")
        .filter(|job| !job.is_empty());
    let owned_by_its_job = list(&meta["ownerReferences"])
        .any(|r| managed_kind(r) == Some(Kind::Job) && Some(text(&r["name"])) == its_job);
    if owned_by_its_job {
        return true;
    }
    let shaped = (rule.claim_suffixes.iter())
        .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix.as_str()));
    let labels = &meta["labels"];
    let labelled = [
        (
            "app.kubernetes.io/managed-by",
            "jupyter-notebook-validator-operator",
        ),
        ("app.kubernetes.io/component", "tekton-build"),
        (LABEL, "true"),
    ]
    .iter()
    .all(|(key, value)| labels[key].as_str() == Some(value));
    let entries: Vec<&Value> = list(&meta["managedFields"]).collect();
    let owners: Vec<&&Value> = (entries.iter())
        .filter(|e| e["fieldsV1"]["f:metadata"]["f:labels"][format!("f:{LABEL}")].is_object())
        .collect();
    let access_modes = |e: &Value| e["fieldsV1"]["f:spec"]["f:accessModes"].is_object();
    let spec_owners = entries.iter().filter(|e| access_modes(e)).count();
    let proves = |e: &Value| match text(&e["operation"]) {
        _ if text(&e["manager"]) == "ancient-changes" => false,
        _ if rule.label_managers.iter().any(|m| m == text(&e["manager"])) => true,
        "Update" => access_modes(e),
        "Apply" => access_modes(e) && spec_owners == 1,
        _ => false,
    };
    let recorded = if entries.is_empty() {
        rule.trust_unrecorded
    } else {
        !owners.is_empty() && owners.iter().all(|e| proves(e))
    };
    shaped && labelled && recorded
}

/// The policy in `namespace`; `None` when nothing may be deleted there.
fn namespace_policy(world: &World, namespace: &str, cluster: &Policy) -> Option<Policy> {
    let Some(bounds) = world.namespace_bounds else {
        return Some(cluster.clone());
    };
    let object = world
        .namespaces
        .iter()
        .find(|n| text(&n["metadata"]["name"]) == namespace)?;
    let mut policy = cluster.clone();
    let empty = serde_json::Map::new();
    let notes = object["metadata"]["annotations"]
        .as_object()
        .unwrap_or(&empty);
    for (key, value) in notes {
        let Some(setting) = key.strip_prefix(PREFIX) else {
            continue;
        };
        let value = value.as_str()?;
        if setting == "keep-failed" {
            let keep: u32 = value.trim().parse().ok()?;
            policy.keep_failed = (cluster.keep_failed..=1000)
                .contains(&keep)
                .then_some(keep)?;
            continue;
        }
        let (field, theirs) = match setting {
            "collect" if value == "true" => continue,
            "ttl-after-finished" => (&mut policy.ttl_after_finished, cluster.ttl_after_finished),
            "ttl-after-failed" => (&mut policy.ttl_after_failed, cluster.ttl_after_failed),
            "orphan-grace" => (&mut policy.orphan_grace, cluster.orphan_grace),
            "max-age" => (&mut policy.max_age, cluster.max_age),
            // `collect: "false"`, and anything not understood.
            _ => return None,
        };
        let d = Duration::from_std(humantime::parse_duration(value.trim()).ok()?).ok()?;
        let allowed = d <= Duration::days(36_500)
            && (d >= theirs || (bounds.may_shorten && d >= bounds.min_ttl && d > Duration::zero()));
        *field = allowed.then_some(d)?;
    }
    (policy.max_age >= policy.orphan_grace).then_some(policy)
}

/// Whether one of `owners` failed and is among the `keep` newest failed objects of its kind in
/// `namespace`, or failed without a completion time to rank it by.
fn newest_failed(
    world: &World,
    namespace: &str,
    owners: &[Option<(Kind, &Value)>],
    keep: u32,
) -> bool {
    if keep == 0 {
        return false;
    }
    let failed_owners = owners.iter().flatten().filter(|(kind, o)| failed(*kind, o));
    failed_owners.into_iter().any(|(kind, owner)| {
        let Some(at) = completion(owner) else {
            return true;
        };
        let later = objects(world, *kind).filter(|other| {
            text(&other["metadata"]["namespace"]) == namespace
                && failed(*kind, other)
                && completion(other).is_some_and(|t| t > at)
        });
        later.count() < keep as usize
    })
}

/// The policy's TTL for these owners: the failed one when any of them finished and failed.
fn policy_ttl(owners: &[Option<(Kind, &Value)>], policy: &Policy) -> Duration {
    if owners.iter().flatten().any(|(kind, o)| failed(*kind, o)) {
        policy.ttl_after_failed
    } else {
        policy.ttl_after_finished
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Job,
    PipelineRun,
    TaskRun,
}

/// The claim's linked owners: `None` for a gone one, else its kind and object.
fn linked<'w>(world: &'w World, claim: &Value) -> Vec<Option<(Kind, &'w Value)>> {
    let meta = &claim["metadata"];
    let (namespace, name) = (text(&meta["namespace"]), text(&meta["name"]));
    let find = |kind: Kind, wanted: &str| {
        objects(world, kind).find(|o| {
            text(&o["metadata"]["namespace"]) == namespace && text(&o["metadata"]["name"]) == wanted
        })
    };
    let mut owners = Vec::new();
    // (i) ownerReferences, by UID.
    for reference in list(&meta["ownerReferences"]) {
        if let Some(kind) = managed_kind(reference) {
            let object = find(kind, text(&reference["name"]))
                .filter(|o| o["metadata"]["uid"].as_str() == Some(text(&reference["uid"])));
            owners.push(object.map(|o| (kind, o)));
        }
    }
    // (ii) workspace bindings of either run kind.
    for kind in [Kind::PipelineRun, Kind::TaskRun] {
        for run in objects(world, kind) {
            let binds = list(&run["spec"]["workspaces"])
                .any(|w| text(&w["persistentVolumeClaim"]["claimName"]) == name);
            if binds && text(&run["metadata"]["namespace"]) == namespace {
                owners.push(Some((kind, run)));
            }
        }
    }
    // (iii) the operator's names.
    if let Some(job) = name
        .strip_suffix("-build-workspace")
        .filter(|j| !j.is_empty())
    {
        owners.extend(find(Kind::Job, job).map(|o| Some((Kind::Job, o))));
        let run = format!("{job}-build");
        owners.extend(find(Kind::PipelineRun, &run).map(|o| Some((Kind::PipelineRun, o))));
    }
    owners
}

fn objects(world: &World, kind: Kind) -> impl Iterator<Item = &Value> {
    match kind {
        Kind::Job => &world.jobs,
        Kind::PipelineRun => &world.runs,
        Kind::TaskRun => &world.task_runs,
    }
    .iter()
}

fn managed_kind(reference: &Value) -> Option<Kind> {
    let group = text(&reference["apiVersion"])
        .split_once('/')
        .map_or("", |(group, _)| group);
    match (group, text(&reference["kind"])) {
        ("mlops.mlops.dev", "NotebookValidationJob") => Some(Kind::Job),
        ("tekton.dev", "PipelineRun") => Some(Kind::PipelineRun),
        ("tekton.dev", "TaskRun") => Some(Kind::TaskRun),
        _ => None,
    }
}

fn finished(kind: Kind, object: &Value) -> bool {
    let status = &object["status"];
    match kind {
        Kind::Job => matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")),
        Kind::PipelineRun | Kind::TaskRun => list(&status["conditions"]).any(|c| {
            c["type"].as_str() == Some("Succeeded")
                && matches!(c["status"].as_str(), Some("True" | "False"))
        }),
    }
}

fn failed(kind: Kind, object: &Value) -> bool {
    let status = &object["status"];
    match kind {
        Kind::Job => status["phase"].as_str() == Some("Failed"),
        Kind::PipelineRun | Kind::TaskRun => list(&status["conditions"]).any(|c| {
            c["type"].as_str() == Some("Succeeded") && c["status"].as_str() == Some("False")
        }),
    }
}

/// `status.completionTime`; Go's zero time is what a Go client writes for "unset".
fn completion(object: &Value) -> Option<DateTime<Utc>> {
    let go_zero = DateTime::parse_from_rfc3339("0001-01-01T00:00:00Z").ok()?;
    instant(&object["status"]["completionTime"]).filter(|t| *t != go_zero)
}

/// Condition 4, for `claim` (its raw object).
fn in_use(world: &World, claim: &Value) -> bool {
    let meta = &claim["metadata"];
    let (namespace, name) = (text(&meta["namespace"]), text(&meta["name"]));
    let unused_false = list(&claim["status"]["conditions"])
        .any(|c| c["type"].as_str() == Some("Unused") && c["status"].as_str() == Some("False"));
    let named_by_a_job = world.jobs.iter().any(|job| {
        text(&job["metadata"]["namespace"]) == namespace
            && !finished(Kind::Job, job)
            && job_volume_claims(job).is_none_or(|claims| claims.contains(&name))
    });
    unused_false || named_by_a_job || mounted(world, namespace, name)
}

/// The claims a job's own volumes name; `None` when they cannot be read.
fn job_volume_claims(job: &Value) -> Option<Vec<&str>> {
    let pod = &job["spec"]["podConfig"];
    if !(pod.is_null() || pod.is_object()) {
        return None;
    }
    let volumes = &pod["volumes"];
    if volumes.is_null() {
        return Some(Vec::new());
    }
    let mut claims = Vec::new();
    for volume in volumes.as_array()? {
        volume.as_object()?;
        let source = &volume["persistentVolumeClaim"];
        if !source.is_null() {
            claims.push(source["claimName"].as_str()?);
        }
    }
    Some(claims)
}

fn mounted(world: &World, namespace: &str, claim: &str) -> bool {
    world.pods.iter().any(|pod| {
        text(&pod["metadata"]["namespace"]) == namespace
            && list(&pod["spec"]["volumes"])
                .any(|v| text(&v["persistentVolumeClaim"]["claimName"]) == claim)
            && !matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            )
    })
}

struct Notes {
    keep: bool,
    ttl: Option<Duration>,
    expires: Option<DateTime<Utc>>,
}

/// The claim's workspace-gc annotations; `None` when one of them forbids deletion (condition 2).
fn notes(meta: &Value) -> Option<Notes> {
    let mut notes = Notes {
        keep: false,
        ttl: None,
        expires: None,
    };
    for (key, value) in meta["annotations"].as_object().into_iter().flatten() {
        let Some(which) = key.strip_prefix(PREFIX) else {
            continue;
        };
        let value = value.as_str()?;
        match which {
            "keep" if value == "true" => notes.keep = true,
            "keep" if value == "false" => {}
            "ttl" => {
                let std = humantime::parse_duration(value.trim()).ok()?;
                notes.ttl = Some(Duration::from_std(std).ok()?);
            }
            "expires" => {
                notes.expires = Some(DateTime::parse_from_rfc3339(value.trim()).ok()?.into())
            }
            "revoked-delete" => {}
            _ => return None,
        }
    }
    Some(notes)
}

fn instant(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(Into::into)
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// The rule for a Released volume (`deletion.released_volume_ttl`), from the raw object: it MAY
/// be deleted at `now` only when it has no `metadata.deletionTimestamp`, its
/// `spec.persistentVolumeReclaimPolicy` is "Retain", its `status.phase` is "Released", its
/// `workspace-gc.mlops.dev/deleted-claim-uid` annotation is a non-empty string equal to
/// `spec.claimRef.uid`, and `status.lastPhaseTransitionTime` is an RFC 3339 instant T with
/// T + ttl ≤ now. Everything else keeps it.
pub fn volume_deletable(volume: &Value, ttl: Duration, now: DateTime<Utc>) -> bool {
    let mark = volume["metadata"]["annotations"][format!("{PREFIX}deleted-claim-uid")].as_str();
    let claim = volume["spec"]["claimRef"]["uid"].as_str();
    volume["metadata"]["deletionTimestamp"].is_null()
        && volume["spec"]["persistentVolumeReclaimPolicy"].as_str() == Some("Retain")
        && volume["status"]["phase"].as_str() == Some("Released")
        && mark.is_some_and(|mark| !mark.is_empty() && Some(mark) == claim)
        && instant(&volume["status"]["lastPhaseTransitionTime"])
            .and_then(|since| since.checked_add_signed(ttl))
            .is_some_and(|due| due <= now)
}
