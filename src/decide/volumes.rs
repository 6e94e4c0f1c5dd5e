//! Released volumes (`deletion.released_volume_ttl`): which PersistentVolume a `Retain` reclaim
//! policy kept may be deleted, and which volume to mark before its claim's DELETE.
//!
//! Only a volume whose claim workspace-gc itself deleted qualifies: the claim's UID is written
//! on the volume ([`DELETED_CLAIM_UID`](crate::contract::annotations::DELETED_CLAIM_UID))
//! before the claim's DELETE, and the volume's `spec.claimRef.uid` must still equal it. A
//! volume bound to anything else, one whose claim someone else deleted, or one whose phase or
//! transition time is not known is kept.

use std::fmt;

use chrono::{DateTime, Duration, Utc};

/// What the edge read of one PersistentVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFacts {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub being_deleted: bool,
    pub reclaim_policy: Option<String>,
    pub phase: Option<String>,
    /// `spec.claimRef.uid`: the claim it is (or was last) bound to.
    pub claim_uid: Option<String>,
    /// The UID workspace-gc wrote before deleting that claim.
    pub marked_claim_uid: Option<String>,
    /// `status.lastPhaseTransitionTime`.
    pub transition: Transition,
}

#[cfg(test)]
impl VolumeFacts {
    /// Volume `pv-1`, Retain, Released and marked with the UID of the claim it was bound to,
    /// `claim_uid`; released since a time not known. For unit tests.
    pub(crate) fn example(claim_uid: &str) -> Self {
        VolumeFacts {
            name: "pv-1".into(),
            uid: "pv-uid".into(),
            resource_version: "7".into(),
            being_deleted: false,
            reclaim_policy: Some("Retain".into()),
            phase: Some("Released".into()),
            claim_uid: Some(claim_uid.into()),
            marked_claim_uid: Some(claim_uid.into()),
            transition: Transition::Missing,
        }
    }
}

/// `status.lastPhaseTransitionTime`, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    At(DateTime<Utc>),
    Missing,
    /// Not an RFC 3339 instant: the raw value.
    Unparsable(String),
}

/// Why a volume is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// No claim UID of workspace-gc's on it: its claim was deleted by someone else, or never.
    NotMarked,
    /// Its claimRef is not the claim workspace-gc deleted: bound to something else.
    OtherClaim,
    NotReleased,
    NotRetain,
    BeingDeleted,
    /// Released, but since when is not known: kept, with a warning.
    TransitionUnknown(String),
    /// Released since less than the TTL: deleted from this instant.
    Waiting(DateTime<Utc>),
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::NotMarked => f.write_str("its claim was not deleted by workspace-gc"),
            Kept::OtherClaim => f.write_str("its claimRef is not the claim workspace-gc deleted"),
            Kept::NotReleased => f.write_str("not Released"),
            Kept::NotRetain => f.write_str("its reclaim policy is not Retain"),
            Kept::BeingDeleted => f.write_str("already being deleted"),
            Kept::TransitionUnknown(detail) => write!(
                f,
                "status.lastPhaseTransitionTime {detail}: since when it is Released is not known"
            ),
            Kept::Waiting(at) => write!(f, "released_volume_ttl has not passed (until {at})"),
        }
    }
}

/// Whether a Released volume is deleted now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeVerdict {
    Delete,
    Keep(Kept),
}

/// Judges a volume at `now` with `ttl`, counted from its transition to `Released`.
pub fn judge(volume: &VolumeFacts, ttl: Duration, now: DateTime<Utc>) -> VolumeVerdict {
    let keep = VolumeVerdict::Keep;
    let Some(marked) = volume
        .marked_claim_uid
        .as_deref()
        .filter(|uid| !uid.is_empty())
    else {
        return keep(Kept::NotMarked);
    };
    if volume.claim_uid.as_deref() != Some(marked) {
        return keep(Kept::OtherClaim);
    }
    if volume.reclaim_policy.as_deref() != Some("Retain") {
        return keep(Kept::NotRetain);
    }
    if volume.phase.as_deref() != Some("Released") {
        return keep(Kept::NotReleased);
    }
    if volume.being_deleted {
        return keep(Kept::BeingDeleted);
    }
    let since = match &volume.transition {
        Transition::At(at) => *at,
        Transition::Missing => return keep(Kept::TransitionUnknown("is missing".into())),
        Transition::Unparsable(raw) => {
            return keep(Kept::TransitionUnknown(format!("{raw:?} does not parse")));
        }
    };
    match since.checked_add_signed(ttl) {
        Some(due) if now >= due => VolumeVerdict::Delete,
        Some(due) => keep(Kept::Waiting(due)),
        // Beyond any representable instant: never due.
        None => keep(Kept::Waiting(DateTime::<Utc>::MAX_UTC)),
    }
}

/// Whether the volume of a claim about to be deleted gets that claim's UID written on it: only
/// a `Retain` volume bound to that very claim, and not already marked with it.
pub fn to_mark(volume: &VolumeFacts, claim_uid: &str) -> bool {
    volume.reclaim_policy.as_deref() == Some("Retain")
        && volume.claim_uid.as_deref() == Some(claim_uid)
        && !claim_uid.is_empty()
        && !volume.being_deleted
        && volume.marked_claim_uid.as_deref() != Some(claim_uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
    }

    fn ttl() -> Duration {
        Duration::hours(1)
    }

    /// Released two hours ago from the claim workspace-gc deleted: due.
    fn released() -> VolumeFacts {
        VolumeFacts {
            transition: Transition::At(now() - Duration::hours(2)),
            ..VolumeFacts::example("claim-uid")
        }
    }

    #[test]
    fn a_retained_volume_of_a_claim_workspace_gc_deleted_goes_after_the_ttl() {
        assert_eq!(judge(&released(), ttl(), now()), VolumeVerdict::Delete);
        let recent = VolumeFacts {
            transition: Transition::At(now() - Duration::minutes(10)),
            ..released()
        };
        assert_eq!(
            judge(&recent, ttl(), now()),
            VolumeVerdict::Keep(Kept::Waiting(now() + Duration::minutes(50)))
        );
        let exactly = VolumeFacts {
            transition: Transition::At(now() - ttl()),
            ..released()
        };
        assert_eq!(judge(&exactly, ttl(), now()), VolumeVerdict::Delete);
    }

    #[test]
    fn every_other_volume_is_kept() {
        let cases = [
            (
                VolumeFacts {
                    marked_claim_uid: None,
                    ..released()
                },
                Kept::NotMarked,
            ),
            (
                VolumeFacts {
                    marked_claim_uid: Some(String::new()),
                    claim_uid: Some(String::new()),
                    ..released()
                },
                Kept::NotMarked,
            ),
            (
                VolumeFacts {
                    claim_uid: Some("another".into()),
                    ..released()
                },
                Kept::OtherClaim,
            ),
            (
                VolumeFacts {
                    claim_uid: None,
                    ..released()
                },
                Kept::OtherClaim,
            ),
            (
                VolumeFacts {
                    reclaim_policy: Some("Delete".into()),
                    ..released()
                },
                Kept::NotRetain,
            ),
            (
                VolumeFacts {
                    phase: Some("Bound".into()),
                    ..released()
                },
                Kept::NotReleased,
            ),
            (
                VolumeFacts {
                    phase: None,
                    ..released()
                },
                Kept::NotReleased,
            ),
            (
                VolumeFacts {
                    being_deleted: true,
                    ..released()
                },
                Kept::BeingDeleted,
            ),
            (
                VolumeFacts {
                    transition: Transition::Missing,
                    ..released()
                },
                Kept::TransitionUnknown("is missing".into()),
            ),
            (
                VolumeFacts {
                    transition: Transition::Unparsable("yesterday".into()),
                    ..released()
                },
                Kept::TransitionUnknown("\"yesterday\" does not parse".into()),
            ),
        ];
        for (volume, kept) in cases {
            assert_eq!(
                judge(&volume, ttl(), now()),
                VolumeVerdict::Keep(kept),
                "{volume:?}"
            );
        }
    }

    #[test]
    fn a_ttl_past_any_instant_never_deletes() {
        let verdict = judge(&released(), Duration::MAX, now());
        assert!(matches!(verdict, VolumeVerdict::Keep(Kept::Waiting(_))));
    }

    #[test]
    fn only_a_retain_volume_bound_to_the_claim_is_marked() {
        let bound = VolumeFacts {
            phase: Some("Bound".into()),
            marked_claim_uid: None,
            ..released()
        };
        assert!(to_mark(&bound, "claim-uid"));
        assert!(!to_mark(&bound, "another-uid"), "bound to another claim");
        assert!(!to_mark(&bound, ""), "no UID");
        let delete = VolumeFacts {
            reclaim_policy: Some("Delete".into()),
            ..bound.clone()
        };
        assert!(
            !to_mark(&delete, "claim-uid"),
            "a Delete volume goes with its claim"
        );
        let marked = VolumeFacts {
            marked_claim_uid: Some("claim-uid".into()),
            ..bound.clone()
        };
        assert!(!to_mark(&marked, "claim-uid"), "already marked");
        let remarked = VolumeFacts {
            marked_claim_uid: Some("an-earlier-claim".into()),
            ..bound
        };
        assert!(
            to_mark(&remarked, "claim-uid"),
            "marked for an earlier claim"
        );
    }
}
