//! The decision core: one table row per verdict and reason, and property tests for the safety
//! invariants. No cluster: the policy is pure.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use workspace_gc::contract::OwnerKind;
use workspace_gc::contract::annotations::{EXPIRES, KEEP, TTL};
use workspace_gc::decide::annotations;
use workspace_gc::decide::facts::{
    AccessModes, ClaimFacts, Facts, FailedRank, LabelHistory, LabelOwner, LinkRule, ObjectKey,
    Operation, Owner, OwnerRef, OwnerState, PodUse, Progress, Provenance, Users,
};
use workspace_gc::decide::policy::{Collection, Policy, Reason, Verdict, decide, scheduled};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap()
}

fn claim() -> ClaimFacts {
    ClaimFacts {
        key: ObjectKey {
            namespace: "ml".into(),
            name: "nb-build-workspace".into(),
        },
        uid: "claim-uid".into(),
        resource_version: "7".into(),
        created: t0(),
        annotations: BTreeMap::new(),
        owner_references: Vec::new(),
        deletion_timestamp: None,
        requested_bytes: Some(1 << 30),
        storage_class: None,
        volume_name: None,
        reported_in_use: false,
        provenance: Provenance::operator("jupyter-notebook-validator-operator"),
    }
}

fn facts(owners: Vec<Owner>) -> Facts {
    Facts {
        claim: claim(),
        owners,
        users: Users::Known {
            pods: Vec::new(),
            jobs: Vec::new(),
        },
        failed_rank: FailedRank::NotFailed,
    }
}

fn ranked(mut facts: Facts, failed_rank: FailedRank) -> Facts {
    facts.failed_rank = failed_rank;
    facts
}

fn job(state: OwnerState) -> Owner {
    Owner {
        kind: OwnerKind::Job,
        name: "nb".into(),
        rule: LinkRule::Naming,
        state,
    }
}

fn run(state: OwnerState) -> Owner {
    Owner {
        kind: OwnerKind::Run,
        name: "nb-build".into(),
        rule: LinkRule::WorkspaceBinding,
        state,
    }
}

fn running() -> OwnerState {
    OwnerState::Present {
        uid: "u".into(),
        progress: Progress::Running,
    }
}

fn finished(at: Option<DateTime<Utc>>) -> OwnerState {
    OwnerState::Present {
        uid: "u".into(),
        progress: Progress::Finished { at, failed: false },
    }
}

fn failed(at: DateTime<Utc>) -> OwnerState {
    OwnerState::Present {
        uid: "u".into(),
        progress: Progress::Finished {
            at: Some(at),
            failed: true,
        },
    }
}

fn annotated(mut facts: Facts, key: &str, value: &str) -> Facts {
    facts
        .claim
        .annotations
        .insert(key.to_owned(), value.to_owned());
    facts
}

fn with_pod(mut facts: Facts, phase: Option<&str>) -> Facts {
    facts.users = Users::Known {
        pods: vec![PodUse {
            name: "affinity-assistant-0".into(),
            phase: phase.map(str::to_owned),
        }],
        jobs: Vec::new(),
    };
    facts
}

fn hours(n: i64) -> Duration {
    Duration::hours(n)
}

/// One row per reason: the facts, the moment, and the exact verdict expected.
#[test]
fn every_verdict_and_reason() {
    // Failed builds kept a day: the rows below tell the two TTLs apart.
    let policy = Policy {
        ttl_after_failed: Duration::days(1),
        ..Policy::default()
    };
    let at = |h: i64| t0() + hours(h);
    let done_at_1h = || facts(vec![job(finished(Some(at(1)))), run(finished(Some(at(1))))]);
    // An orphan long past every deadline, even its own `expires`, whose label another manager
    // added after it was made: not workspace-gc's claim.
    let labelled_later = {
        let mut facts = facts(Vec::new());
        facts.claim.provenance.label = LabelHistory::Owners(vec![LabelOwner {
            manager: "kubectl-label".into(),
            operation: Operation::Update,
            access_modes: AccessModes::NotOwned,
        }]);
        facts
            .claim
            .annotations
            .insert(EXPIRES.into(), "2026-11-01T12:00:00Z".into());
        facts
    };
    let rows: Vec<(&str, Facts, DateTime<Utc>, Verdict)> = vec![
        (
            "labelled later by another manager",
            labelled_later,
            at(24 * 365),
            Verdict::Keep {
                reason: Reason::NotABuildWorkspace,
                recheck_at: None,
            },
        ),
        (
            "finished past its TTL",
            done_at_1h(),
            at(3),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(2)),
            },
        ),
        (
            "finished within its TTL",
            done_at_1h(),
            at(1) + Duration::minutes(30),
            Verdict::Keep {
                reason: Reason::WithinTtl,
                recheck_at: Some(at(2)),
            },
        ),
        (
            "TTL runs from the later completion of run and job",
            facts(vec![job(finished(Some(at(2)))), run(finished(Some(at(1))))]),
            at(2) + Duration::minutes(59),
            Verdict::Keep {
                reason: Reason::WithinTtl,
                recheck_at: Some(at(3)),
            },
        ),
        (
            "a failed build is kept by ttl_after_failed",
            facts(vec![job(finished(Some(at(1)))), run(failed(at(1)))]),
            at(3),
            Verdict::Keep {
                reason: Reason::WithinTtl,
                recheck_at: Some(at(25)),
            },
        ),
        (
            "a failed build past ttl_after_failed",
            facts(vec![job(failed(at(1))), run(finished(Some(at(0))))]),
            at(25),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(25)),
            },
        ),
        (
            "a gone owner does not make the build failed",
            facts(vec![job(OwnerState::Gone), run(finished(Some(at(1))))]),
            at(2),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(2)),
            },
        ),
        (
            "ttl annotation replaces the failed TTL too",
            annotated(facts(vec![run(failed(at(1)))]), TTL, "10m"),
            at(1) + Duration::minutes(10),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(1) + Duration::minutes(10)),
            },
        ),
        (
            "ttl annotation replaces the policy TTL",
            annotated(done_at_1h(), TTL, "10m"),
            at(1) + Duration::minutes(10),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(1) + Duration::minutes(10)),
            },
        ),
        (
            "owner running",
            facts(vec![job(running()), run(finished(Some(at(1))))]),
            at(5),
            Verdict::Keep {
                reason: Reason::OwnerRunning,
                recheck_at: Some(t0() + policy.max_age),
            },
        ),
        (
            "max age deletes a run stuck running",
            facts(vec![run(running())]),
            t0() + policy.max_age,
            Verdict::Delete {
                reason: Reason::MaxAgeExceeded,
                due_at: Some(t0() + policy.max_age),
            },
        ),
        (
            "owner referenced by UID is gone",
            facts(vec![job(OwnerState::Gone)]),
            at(0) + Duration::seconds(1),
            Verdict::Delete {
                reason: Reason::OwnerGone,
                due_at: None,
            },
        ),
        (
            "orphan past its grace",
            facts(vec![]),
            t0() + Duration::minutes(10),
            Verdict::Delete {
                reason: Reason::Orphaned,
                due_at: Some(t0() + Duration::minutes(10)),
            },
        ),
        (
            "young orphan",
            facts(vec![]),
            t0() + Duration::minutes(3),
            Verdict::Keep {
                reason: Reason::WithinOrphanGrace,
                recheck_at: Some(t0() + Duration::minutes(10)),
            },
        ),
        (
            "expires annotation passed, owner still running",
            annotated(facts(vec![job(running())]), EXPIRES, "2026-11-01T13:00:00Z"),
            at(1),
            Verdict::Delete {
                reason: Reason::Expired,
                due_at: Some(at(1)),
            },
        ),
        (
            "expires annotation ahead is the recheck instant",
            annotated(facts(vec![job(running())]), EXPIRES, "2026-11-01T13:00:00Z"),
            at(0),
            Verdict::Keep {
                reason: Reason::OwnerRunning,
                recheck_at: Some(at(1)),
            },
        ),
        (
            "in use by a pending pod, however old",
            with_pod(facts(vec![]), Some("Pending")),
            t0() + Duration::days(365),
            Verdict::Protected {
                reason: Reason::InUse,
            },
        ),
        (
            "its Unused condition is False, past every deadline",
            {
                let mut facts = done_at_1h();
                facts.claim.reported_in_use = true;
                facts
            },
            t0() + Duration::days(365),
            Verdict::Protected {
                reason: Reason::InUse,
            },
        ),
        (
            "named in the volumes of an unfinished job, past every deadline",
            {
                let mut facts = done_at_1h();
                facts.users = Users::Known {
                    pods: Vec::new(),
                    jobs: vec!["b".into()],
                };
                facts
            },
            t0() + Duration::days(365),
            Verdict::Protected {
                reason: Reason::ReferencedByJob,
            },
        ),
        (
            "a pod with no phase yet counts as using it",
            with_pod(facts(vec![]), None),
            t0() + Duration::days(365),
            Verdict::Protected {
                reason: Reason::InUse,
            },
        ),
        (
            "a succeeded pod no longer uses it",
            with_pod(facts(vec![]), Some("Succeeded")),
            t0() + Duration::days(1),
            Verdict::Delete {
                reason: Reason::Orphaned,
                due_at: Some(t0() + Duration::minutes(10)),
            },
        ),
        (
            "keep annotation",
            annotated(facts(vec![]), KEEP, "true"),
            t0() + Duration::days(365),
            Verdict::Protected {
                reason: Reason::KeepAnnotation,
            },
        ),
        (
            "invalid annotation",
            annotated(done_at_1h(), TTL, "a while"),
            t0() + Duration::days(365),
            Verdict::Keep {
                reason: Reason::InvalidAnnotation,
                recheck_at: None,
            },
        ),
        (
            "already terminating",
            {
                let mut f = facts(vec![]);
                f.claim.deletion_timestamp = Some(at(1));
                f
            },
            t0() + Duration::days(365),
            Verdict::Keep {
                reason: Reason::AlreadyTerminating,
                recheck_at: None,
            },
        ),
        (
            "owner unknown",
            facts(vec![
                job(OwnerState::Unknown {
                    why: "cache not synced".into(),
                }),
                run(finished(Some(at(1)))),
            ]),
            t0() + Duration::days(365),
            Verdict::Keep {
                reason: Reason::OwnerUnknown,
                recheck_at: None,
            },
        ),
        (
            "users unknown",
            {
                let mut f = facts(vec![]);
                f.users = Users::Unknown {
                    why: "forbidden".into(),
                };
                f
            },
            t0() + Duration::days(365),
            Verdict::Keep {
                reason: Reason::UsersUnknown,
                recheck_at: None,
            },
        ),
        (
            "foreign owner",
            {
                let mut f = facts(vec![]);
                f.claim.owner_references.push(OwnerRef {
                    api_version: "apps/v1".into(),
                    kind: "StatefulSet".into(),
                    name: "db".into(),
                    uid: "x".into(),
                });
                f
            },
            t0() + Duration::days(365),
            Verdict::Keep {
                reason: Reason::ForeignOwner,
                recheck_at: None,
            },
        ),
        (
            "finished without completion time waits for max age",
            facts(vec![run(finished(None))]),
            at(5),
            Verdict::Keep {
                reason: Reason::CompletionTimeMissing,
                recheck_at: Some(t0() + policy.max_age),
            },
        ),
        (
            "completion in the future is not expired",
            facts(vec![run(finished(Some(at(10))))]),
            at(5),
            Verdict::Keep {
                reason: Reason::CompletionInFuture,
                recheck_at: Some(at(10)),
            },
        ),
    ];
    let mut covered = std::collections::BTreeSet::new();
    for (name, facts, now, expected) in rows {
        let decision = decide(&facts, &policy, now);
        assert_eq!(decision.verdict, expected, "{name}");
        covered.insert(expected.reason());
    }
    // A namespace that switches collection off, whose settings could not be read, or that has
    // a setting not understood, keeps even an overdue claim; a protection still reports first.
    for (collection, reason) in [
        (Collection::Off, Reason::CollectionOff),
        (Collection::Unknown, Reason::NamespaceUnknown),
        (Collection::Invalid, Reason::InvalidNamespacePolicy),
    ] {
        let off = Policy {
            collection,
            ..policy.clone()
        };
        let verdict = decide(&done_at_1h(), &off, t0() + Duration::days(365)).verdict;
        assert_eq!(
            verdict,
            Verdict::Keep {
                reason,
                recheck_at: None
            }
        );
        let kept = annotated(done_at_1h(), KEEP, "true");
        assert_eq!(
            decide(&kept, &off, at(3)).verdict.reason(),
            Reason::KeepAnnotation
        );
        covered.insert(reason);
    }
    // Keeping the 2 newest failed builds: only a failed build's rank counts, it keeps whatever
    // the TTL says, and max_age and expires still apply.
    let keep = Policy {
        keep_failed: 2,
        ..policy.clone()
    };
    let failed_at_1h = || facts(vec![job(failed(at(1))), run(failed(at(1)))]);
    let newer = |newer| FailedRank::Ranked { newer };
    let unknown = FailedRank::Unknown {
        why: "the PipelineRun cache has not synced yet".into(),
    };
    let kept = |reason| Verdict::Keep {
        reason,
        recheck_at: Some(t0() + policy.max_age),
    };
    for (name, facts, now, expected) in [
        (
            "one of the 2 newest failed builds, past its TTL",
            ranked(failed_at_1h(), newer(1)),
            at(30),
            kept(Reason::NewestFailed),
        ),
        (
            "one of the 2 newest failed builds, within its TTL (quota pressure never takes it)",
            ranked(failed_at_1h(), newer(0)),
            at(2),
            kept(Reason::NewestFailed),
        ),
        (
            "the third newest failed build",
            ranked(failed_at_1h(), newer(2)),
            at(30),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(25)),
            },
        ),
        (
            "a failed build whose rank cannot be read",
            ranked(failed_at_1h(), unknown.clone()),
            at(30),
            kept(Reason::FailedRankUnknown),
        ),
        (
            "a succeeded build is not ranked",
            done_at_1h(),
            at(3),
            Verdict::Delete {
                reason: Reason::TtlExpired,
                due_at: Some(at(2)),
            },
        ),
        (
            "max age still applies",
            ranked(failed_at_1h(), newer(0)),
            t0() + policy.max_age,
            Verdict::Delete {
                reason: Reason::MaxAgeExceeded,
                due_at: Some(t0() + policy.max_age),
            },
        ),
        (
            "expires still applies",
            annotated(
                ranked(failed_at_1h(), newer(0)),
                EXPIRES,
                "2026-11-02T13:00:00Z",
            ),
            at(30),
            Verdict::Delete {
                reason: Reason::Expired,
                due_at: Some(at(25)),
            },
        ),
    ] {
        let decision = decide(&facts, &keep, now);
        assert_eq!(decision.verdict, expected, "{name}");
        covered.insert(expected.reason());
        // Off, the rank counts for nothing.
        let off = decide(&facts, &policy, now).verdict.reason();
        assert!(
            ![Reason::NewestFailed, Reason::FailedRankUnknown].contains(&off),
            "{name}: {off}"
        );
    }
    let detail = decide(&ranked(failed_at_1h(), unknown), &keep, at(30)).detail;
    assert_eq!(
        detail.as_deref(),
        Some("the PipelineRun cache has not synced yet")
    );
    // `quota-pressure` is chosen by `quota::plan` over a namespace, never by `decide`.
    let missing: Vec<_> = Reason::ALL
        .iter()
        .filter(|r| !covered.contains(r) && **r != Reason::QuotaPressure)
        .collect();
    assert!(missing.is_empty(), "reasons without a row: {missing:?}");
}

#[test]
fn details_name_what_is_wrong() {
    let policy = Policy::default();
    let bad = annotated(facts(vec![]), EXPIRES, "next tuesday");
    let detail = decide(&bad, &policy, t0()).detail.unwrap();
    assert!(detail.contains(EXPIRES), "{detail}");
    assert!(detail.contains("next tuesday"), "{detail}");

    let in_use = with_pod(facts(vec![]), Some("Running"));
    let detail = decide(&in_use, &policy, t0()).detail.unwrap();
    assert!(detail.contains("affinity-assistant-0"), "{detail}");
}

// ---- properties -------------------------------------------------------------------------

fn any_instant() -> impl Strategy<Value = DateTime<Utc>> {
    // Roughly ±2 years around t0, at nanosecond resolution, so boundaries are exercised.
    (-63_072_000i64..63_072_000, 0u32..1_000_000_000)
        .prop_map(|(s, ns)| t0() + Duration::seconds(s) + Duration::nanoseconds(ns.into()))
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::zero()),
        (0i64..2_000_000).prop_map(Duration::seconds),
        Just(Duration::MAX),
    ]
}

fn any_progress() -> impl Strategy<Value = Progress> {
    prop_oneof![
        Just(Progress::Running),
        (proptest::option::of(any_instant()), any::<bool>())
            .prop_map(|(at, failed)| Progress::Finished { at, failed }),
    ]
}

fn any_state() -> impl Strategy<Value = OwnerState> {
    prop_oneof![
        4 => any_progress().prop_map(|progress| OwnerState::Present { uid: "u".into(), progress }),
        1 => Just(OwnerState::Gone),
        1 => Just(OwnerState::Unknown { why: "x".into() }),
    ]
}

fn any_owner() -> impl Strategy<Value = Owner> {
    (any::<bool>(), any_state())
        .prop_map(|(is_job, state)| if is_job { job(state) } else { run(state) })
}

fn any_annotation() -> impl Strategy<Value = Option<(&'static str, String)>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some((KEEP, "true".to_owned()))),
        1 => Just(Some((KEEP, "false".to_owned()))),
        1 => Just(Some((KEEP, "maybe".to_owned()))),
        1 => Just(Some((KEEP, "True".to_owned()))),
        1 => (0u64..100_000).prop_map(|s| Some((TTL, format!("{s}s")))),
        1 => Just(Some((TTL, "later".to_owned()))),
        1 => any_instant().prop_map(|t| Some((EXPIRES, t.to_rfc3339()))),
        1 => Just(Some((EXPIRES, "2026-13-01T00:00:00Z".to_owned()))),
    ]
}

fn any_pods() -> impl Strategy<Value = Users> {
    let phase = prop_oneof![
        Just(None),
        Just(Some("Pending".to_owned())),
        Just(Some("Running".to_owned())),
        Just(Some("Succeeded".to_owned())),
        Just(Some("Failed".to_owned())),
        Just(Some("Unknown".to_owned())),
    ];
    let jobs = prop_oneof![
        6 => Just(Vec::new()),
        1 => Just(vec!["b".to_owned()]),
    ];
    prop_oneof![
        8 => (proptest::collection::vec(phase, 0..3), jobs).prop_map(|(phases, jobs)| Users::Known {
            pods: phases
                .into_iter()
                .enumerate()
                .map(|(i, phase)| PodUse { name: format!("p{i}"), phase })
                .collect(),
            jobs,
        }),
        1 => Just(Users::Unknown { why: "x".into() }),
    ]
}

fn any_facts() -> impl Strategy<Value = Facts> {
    (
        any_instant(),
        proptest::collection::vec(any_owner(), 0..3),
        proptest::collection::vec(any_annotation(), 0..3),
        any_pods(),
        proptest::option::of(any_instant()),
        proptest::bool::weighted(0.1),
        prop_oneof![
            (0..5u32).prop_map(|newer| FailedRank::Ranked { newer }),
            Just(FailedRank::Unknown {
                why: "unread".into()
            }),
        ],
        any_provenance(),
    )
        .prop_map(
            |(created, owners, notes, users, deleting, reported_in_use, rank, provenance)| {
                let mut facts = facts(owners);
                // Linking ranks exactly the claims with a failed owner.
                let failed = facts.owners.iter().any(|o| {
                    matches!(
                        o.state,
                        OwnerState::Present {
                            progress: Progress::Finished { failed: true, .. },
                            ..
                        }
                    )
                });
                if failed {
                    facts.failed_rank = rank;
                }
                facts.claim.created = created;
                facts.claim.reported_in_use = reported_in_use;
                facts.claim.deletion_timestamp = deleting.filter(|_| created.timestamp() % 7 == 0);
                for (key, value) in notes.into_iter().flatten() {
                    facts.claim.annotations.insert(key.to_owned(), value);
                }
                facts.users = users;
                facts.claim.provenance = provenance;
                facts
            },
        )
}

/// The operator's record mostly; else one of every kind of record the writers of a claim make
/// (issue 55): a create by server-side apply, a GitOps apply sharing the spec of a claim that
/// exists, an apply of labels only, a later `kubectl label`, the server's `ancient-changes`
/// merge, an unknown operation, a record that names no owner, none at all; or labels missing.
fn any_provenance() -> impl Strategy<Value = Provenance> {
    use AccessModes::{Alone, NotOwned, Shared};
    use Operation::{Apply, Merged, Other, Update};
    let owner = |(manager, operation, access_modes): (&str, Operation, AccessModes)| LabelOwner {
        manager: manager.into(),
        operation,
        access_modes,
    };
    let operator = Provenance::operator("manager");
    let records: [&[(&str, Operation, AccessModes)]; 9] = [
        &[("argocd", Apply, Alone)],
        &[("argocd", Apply, Shared)],
        &[("manager", Update, Shared), ("argocd", Apply, Shared)],
        &[("flux", Apply, NotOwned)],
        &[
            ("manager", Update, Alone),
            ("kubectl-label", Update, NotOwned),
        ],
        &[("kubectl-label", Update, NotOwned)],
        &[("ancient-changes", Merged, Alone)],
        &[
            ("ancient-changes", Merged, Shared),
            ("argocd", Apply, Shared),
        ],
        &[("m", Other, Alone)],
    ];
    let recorded = (0..records.len()).prop_map(move |i| Provenance {
        label: LabelHistory::Owners(records[i].iter().copied().map(owner).collect()),
        ..Provenance::operator("manager")
    });
    prop_oneof![
        6 => Just(operator.clone()),
        6 => recorded,
        1 => Just(Provenance {
            label: LabelHistory::Owners(Vec::new()),
            ..operator.clone()
        }),
        1 => Just(Provenance {
            label: LabelHistory::Unrecorded,
            ..operator.clone()
        }),
        1 => Just(Provenance {
            operator_labels: false,
            ..operator
        }),
    ]
}

fn any_policy() -> impl Strategy<Value = Policy> {
    let collection = prop_oneof![
        6 => Just(Collection::On),
        1 => Just(Collection::Off),
        1 => Just(Collection::Unknown),
        1 => Just(Collection::Invalid),
    ];
    let durations = (
        any_duration(),
        any_duration(),
        any_duration(),
        any_duration(),
    );
    (
        durations,
        collection,
        prop_oneof![2 => Just(0u32), 1 => 1..4u32],
    )
        .prop_map(
            |(
                (ttl_after_finished, ttl_after_failed, orphan_grace, max_age),
                collection,
                keep_failed,
            )| {
                Policy {
                    ttl_after_finished,
                    ttl_after_failed,
                    orphan_grace,
                    max_age,
                    keep_failed,
                    collection,
                    provenance: Policy::default().provenance,
                }
            },
        )
}

fn verdict_key(verdict: &Verdict) -> (workspace_gc::decide::policy::VerdictState, Reason) {
    (verdict.state(), verdict.reason())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Never delete a claim in use, kept, with a bad annotation, terminating, without
    /// provenance, with an owner or users of unknown state, or (with no owner found) younger
    /// than the orphan grace.
    #[test]
    fn never_deletes_what_must_be_kept(facts in any_facts(), policy in any_policy(), now in any_instant()) {
        let verdict = decide(&facts, &policy, now).verdict;
        if !verdict.is_delete() {
            return Ok(());
        }
        let in_use = facts.claim.reported_in_use || match &facts.users {
            Users::Known { pods, jobs } => pods.iter().any(PodUse::is_active) || !jobs.is_empty(),
            Users::Unknown { .. } => true,
        };
        prop_assert!(!in_use, "deleted a claim in use");
        prop_assert!(facts.claim.deletion_timestamp.is_none(), "acted on a terminating claim");
        let provenance = &facts.claim.provenance;
        // An Update owning the access modes, or an Apply owning them alone; never the merge.
        let made = |o: &LabelOwner| o.manager != "ancient-changes" && match o.operation {
            Operation::Update => o.access_modes != AccessModes::NotOwned,
            Operation::Apply => o.access_modes == AccessModes::Alone,
            Operation::Merged | Operation::Other => false,
        };
        let made_labelled = matches!(&provenance.label,
            LabelHistory::Owners(owners) if !owners.is_empty() && owners.iter().all(made));
        prop_assert!(provenance.operator_labels && made_labelled, "deleted a claim without provenance");
        prop_assert_eq!(policy.collection, Collection::On, "deleted where collection is not on");
        let parsed = annotations::parse(&facts.claim.annotations);
        prop_assert!(parsed.is_ok(), "deleted despite an invalid annotation");
        prop_assert!(!parsed.unwrap().keep, "deleted a claim marked keep");
        prop_assert!(
            !facts.owners.iter().any(|o| matches!(o.state, OwnerState::Unknown { .. })),
            "deleted with an owner of unknown state"
        );
        if verdict.reason() == Reason::Orphaned {
            prop_assert!(facts.owners.is_empty());
            prop_assert!(facts.claim.created.checked_add_signed(policy.orphan_grace).is_some_and(|due| due <= now));
        }
        // Unless an absolute deadline passed, every linked owner allows it: gone, or finished
        // with a completion time at least the TTL ago.
        // Keeping by count, only a failed build ranked below the newest `keep_failed` goes.
        if policy.keep_failed > 0 && !matches!(verdict.reason(), Reason::Expired | Reason::MaxAgeExceeded) {
            let ranked_out = match &facts.failed_rank {
                FailedRank::NotFailed => true,
                FailedRank::Ranked { newer } => *newer >= policy.keep_failed,
                FailedRank::Unknown { .. } => false,
            };
            prop_assert!(ranked_out, "deleted one of the newest failed builds: {:?}", facts.failed_rank);
        }
        if !matches!(verdict.reason(), Reason::Expired | Reason::MaxAgeExceeded) {
            // A failed build's workspace is kept by the failed TTL, unless annotated.
            let failed = facts.owners.iter().any(|o| matches!(o.state,
                OwnerState::Present { progress: Progress::Finished { failed: true, .. }, .. }));
            let by_policy = if failed { policy.ttl_after_failed } else { policy.ttl_after_finished };
            let ttl = annotations::parse(&facts.claim.annotations).unwrap().ttl.unwrap_or(by_policy);
            for owner in &facts.owners {
                let allows = match &owner.state {
                    OwnerState::Gone => true,
                    OwnerState::Present { progress: Progress::Finished { at: Some(at), .. }, .. } => {
                        at.checked_add_signed(ttl).is_some_and(|due| due <= now)
                    }
                    _ => false,
                };
                prop_assert!(allows, "deleted while {owner:?} does not allow it");
            }
        }
    }

    /// The reclaim lag starts no earlier than the claim's creation (or now, for a claim whose
    /// creation lies ahead of our clock), whatever the times say.
    #[test]
    fn nothing_is_due_before_the_claim_existed(facts in any_facts(), policy in any_policy(), now in any_instant()) {
        if let Verdict::Delete { due_at: Some(due), .. } = decide(&facts, &policy, now).verdict {
            prop_assert!(due >= facts.claim.created.min(now), "due at {due}, created {}", facts.claim.created);
            prop_assert!(due <= now, "due at {due}, after now {now}");
        }
    }

    /// The recheck instant lies in the future and is the exact boundary: a nanosecond before it
    /// the verdict is unchanged, at it the verdict changes.
    #[test]
    fn recheck_is_the_exact_boundary(facts in any_facts(), policy in any_policy(), now in any_instant()) {
        let verdict = decide(&facts, &policy, now).verdict;
        if let Some(at) = verdict.recheck_at() {
            prop_assert!(at > now, "recheck {at} not after now {now}");
            let before = decide(&facts, &policy, at - Duration::nanoseconds(1)).verdict;
            prop_assert_eq!(before, verdict);
            let after = decide(&facts, &policy, at).verdict;
            prop_assert_ne!(verdict_key(&after), verdict_key(&verdict));
        }
    }

    /// What a notice announces is exact: the claim is not due a nanosecond before the
    /// instant, and is due at it, for the reason named.
    #[test]
    fn the_scheduled_instant_is_when_the_claim_becomes_due(facts in any_facts(), policy in any_policy(), now in any_instant()) {
        if let Some((at, reason)) = scheduled(&facts, &policy, now) {
            prop_assert!(at > now);
            prop_assert!(!decide(&facts, &policy, at - Duration::nanoseconds(1)).verdict.is_delete());
            let verdict = decide(&facts, &policy, at).verdict;
            prop_assert!(verdict.is_delete() && verdict.reason() == reason, "{verdict:?}");
        } else if let Some(at) = decide(&facts, &policy, now).verdict.recheck_at() {
            prop_assert!(!decide(&facts, &policy, at).verdict.is_delete());
        }
    }

    /// Once due, a claim stays due as time passes (for the same facts).
    #[test]
    fn delete_is_monotone_in_time(facts in any_facts(), policy in any_policy(), now in any_instant(), later in 0i64..100_000_000) {
        if decide(&facts, &policy, now).verdict.is_delete() {
            let verdict = decide(&facts, &policy, now + Duration::seconds(later)).verdict;
            prop_assert!(verdict.is_delete(), "{verdict:?}");
        }
    }

    /// A verdict that is not delete and names no recheck does not change with time alone.
    #[test]
    fn no_recheck_means_time_does_not_matter(facts in any_facts(), policy in any_policy(), now in any_instant(), later in 0i64..100_000_000) {
        let verdict = decide(&facts, &policy, now).verdict;
        if !verdict.is_delete() && verdict.recheck_at().is_none() {
            let after = decide(&facts, &policy, now + Duration::seconds(later)).verdict;
            prop_assert_eq!(after, verdict);
        }
    }
}
