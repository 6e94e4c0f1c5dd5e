//! Whether a labelled claim is a build workspace at all: the label alone is not enough, since
//! anyone who can edit a claim can add it (a kustomization's `commonLabels`, a chart's common
//! labels, a hand `kubectl label`). A claim is a candidate only when its own record says the
//! operator (or `workspace-gc create`) made it one; see docs/policy.md, "Provenance".
//!
//! The edge ([`crate::cluster::resources`]) reads the claim's labels and `managedFields` once,
//! at ingest, into the compact [`Provenance`] the claim's facts keep (the cache drops the
//! managed fields); here that fact is judged against the configured [`ProvenanceRule`].

use std::fmt;

use serde::Serialize;

use crate::contract::naming::{self, CLAIM_SUFFIX};
use crate::contract::{OwnerKind, labels::BUILD_WORKSPACE};
use crate::decide::facts::ClaimFacts;

/// What a claim's own record says about how it came to carry the build-workspace label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// Every label of the operator's set ([`crate::contract::labels::OPERATOR`]) is there with
    /// the operator's value.
    pub operator_labels: bool,
    pub label: LabelHistory,
}

impl Provenance {
    /// What the operator's claims carry: its labels, set by the write that made the claim.
    pub fn operator(manager: &str) -> Self {
        Provenance {
            operator_labels: true,
            label: LabelHistory::Owners(vec![LabelOwner {
                manager: manager.to_owned(),
                made_claim: true,
            }]),
        }
    }
}

/// Who set the build-workspace label, from `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "history", content = "owners", rename_all = "kebab-case")]
pub enum LabelHistory {
    /// The claim has no managed fields (a client or a cluster cleared them): who set what
    /// cannot be told.
    Unrecorded,
    /// The field managers that own the label's field (none: the record names no owner).
    Owners(Vec<LabelOwner>),
}

/// A field manager that owns the build-workspace label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabelOwner {
    pub manager: String,
    /// The same entry owns `spec.accessModes`, which cannot change once the claim exists: this
    /// manager wrote the claim's spec when it was made, so it set the label in that write (or
    /// set it again later itself; see docs/policy.md for that limit).
    pub made_claim: bool,
}

/// What makes a claim a candidate; the configuration's default (`config::settings`) is the
/// operator's contract, the narrowest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenanceRule {
    /// A candidate's name ends with one of these, after a non-empty prefix.
    pub claim_suffixes: Vec<String>,
    /// Field managers trusted to have set the label after the claim was made.
    pub label_managers: Vec<String>,
    /// A claim with no managed fields at all passes on its name and labels alone.
    pub trust_unrecorded: bool,
}

/// Why a labelled claim is not a candidate: the first part of the contract it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Its name has none of the configured shapes.
    Name,
    /// A label of the operator's set is absent or has another value.
    OperatorLabels,
    /// The build-workspace label is owned by managers that did not make the claim (none
    /// listed: no manager owns it in the record).
    AddedLater { by: Vec<String> },
    /// Its managed fields are empty.
    Unrecorded,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = format!("{}={}", BUILD_WORKSPACE.0, BUILD_WORKSPACE.1);
        match self {
            Missing::Name => write!(
                f,
                "its name has none of the configured shapes (the operator's: {{job}}{CLAIM_SUFFIX})"
            ),
            Missing::OperatorLabels => write!(
                f,
                "it lacks the operator's labels (app.kubernetes.io/managed-by, app.kubernetes.io/component)"
            ),
            Missing::AddedLater { by } if by.is_empty() => {
                write!(f, "its managedFields name no owner of the label {label}")
            }
            Missing::AddedLater { by } => write!(
                f,
                "the label {label} was added after it was made, by {}",
                by.join(", ")
            ),
            Missing::Unrecorded => write!(
                f,
                "its managedFields are empty, so who set the label {label} cannot be told"
            ),
        }
    }
}

/// What the claim lacks to be a build workspace under `rule`; `None`: it is one.
///
/// A claim that names its own job as owner (what `workspace-gc create` makes, and what
/// Kubernetes' garbage collector would delete with that job anyway) is one. Otherwise it needs
/// a name of a configured shape, the operator's labels, and the label set by the write that
/// made the claim, or by a trusted manager.
pub fn missing(claim: &ClaimFacts, rule: &ProvenanceRule) -> Option<Missing> {
    if owned_by_its_job(claim) {
        return None;
    }
    let name = claim.key.name.as_str();
    let shaped = (rule.claim_suffixes.iter()).any(|suffix| {
        name.strip_suffix(suffix.as_str())
            .is_some_and(|p| !p.is_empty())
    });
    if !shaped {
        return Some(Missing::Name);
    }
    let provenance = &claim.provenance;
    if !provenance.operator_labels {
        return Some(Missing::OperatorLabels);
    }
    match &provenance.label {
        LabelHistory::Unrecorded if rule.trust_unrecorded => None,
        LabelHistory::Unrecorded => Some(Missing::Unrecorded),
        LabelHistory::Owners(owners) => {
            let by: Vec<String> = (owners.iter())
                .filter(|o| !o.made_claim && !rule.label_managers.contains(&o.manager))
                .map(|o| o.manager.clone())
                .collect();
            (owners.is_empty() || !by.is_empty()).then_some(Missing::AddedLater { by })
        }
    }
}

/// An owner reference to the NotebookValidationJob its name says it belongs to.
fn owned_by_its_job(claim: &ClaimFacts) -> bool {
    let Some(job) = naming::job_of_claim(&claim.key.name) else {
        return false;
    };
    (claim.owner_references.iter()).any(|r| r.owner_kind() == Some(OwnerKind::Job) && r.name == job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{JOB_GROUP, JOB_KIND, JOB_VERSION};
    use crate::decide::facts::OwnerRef;
    use crate::decide::policy::Policy;

    /// The configuration's: the operator's contract.
    fn contract() -> ProvenanceRule {
        (*Policy::default().provenance).clone()
    }

    fn claim(name: &str, provenance: Provenance) -> ClaimFacts {
        ClaimFacts {
            provenance,
            ..ClaimFacts::example(name)
        }
    }

    fn owners(owners: &[(&str, bool)]) -> Provenance {
        Provenance {
            operator_labels: true,
            label: LabelHistory::Owners(
                (owners.iter())
                    .map(|(manager, made_claim)| LabelOwner {
                        manager: (*manager).to_owned(),
                        made_claim: *made_claim,
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn the_operators_claim_is_a_build_workspace() {
        let rule = contract();
        let made = claim("nb-build-workspace", Provenance::operator("manager"));
        assert_eq!(missing(&made, &rule), None);
        let shared = claim(
            "nb-build-workspace",
            owners(&[("manager", true), ("argocd", true)]),
        );
        assert_eq!(missing(&shared, &rule), None, "every owner made it");
    }

    #[test]
    fn a_label_added_later_is_not_provenance() {
        let rule = contract();
        let later = claim("data-build-workspace", owners(&[("kubectl-label", false)]));
        let by = vec!["kubectl-label".to_owned()];
        assert_eq!(missing(&later, &rule), Some(Missing::AddedLater { by }));
        let nobody = claim("data-build-workspace", owners(&[]));
        assert_eq!(
            missing(&nobody, &rule),
            Some(Missing::AddedLater { by: Vec::new() })
        );
        // Shared: one owner made it, another set it again later.
        let both = claim(
            "data-build-workspace",
            owners(&[("op", true), ("helm", false)]),
        );
        assert!(matches!(
            missing(&both, &rule),
            Some(Missing::AddedLater { .. })
        ));
        let trusted = ProvenanceRule {
            label_managers: vec!["helm".into()],
            ..contract()
        };
        assert_eq!(missing(&both, &trusted), None);
    }

    #[test]
    fn a_foreign_name_or_missing_labels_are_not_provenance() {
        let rule = contract();
        for name in ["data", "-build-workspace", "nb-build-workspace-2"] {
            let odd = claim(name, Provenance::operator("manager"));
            assert_eq!(missing(&odd, &rule), Some(Missing::Name), "{name}");
        }
        let wider = ProvenanceRule {
            claim_suffixes: vec![CLAIM_SUFFIX.into(), "-ws".into()],
            ..contract()
        };
        assert_eq!(
            missing(&claim("nb-ws", Provenance::operator("m")), &wider),
            None
        );
        let unlabelled = Provenance {
            operator_labels: false,
            ..Provenance::operator("manager")
        };
        let odd = claim("nb-build-workspace", unlabelled);
        assert_eq!(missing(&odd, &rule), Some(Missing::OperatorLabels));
    }

    #[test]
    fn no_record_is_kept_unless_trusted() {
        let unrecorded = Provenance {
            operator_labels: true,
            label: LabelHistory::Unrecorded,
        };
        let stripped = claim("nb-build-workspace", unrecorded);
        let rule = contract();
        assert_eq!(missing(&stripped, &rule), Some(Missing::Unrecorded));
        let trusting = ProvenanceRule {
            trust_unrecorded: true,
            ..rule
        };
        assert_eq!(missing(&stripped, &trusting), None);
    }

    #[test]
    fn a_claim_owned_by_its_own_job_is_a_build_workspace() {
        let job = |name: &str, kind: &str| OwnerRef {
            api_version: format!("{JOB_GROUP}/{JOB_VERSION}"),
            kind: kind.to_owned(),
            name: name.to_owned(),
            uid: "u".to_owned(),
        };
        let unrecorded = Provenance {
            operator_labels: false,
            label: LabelHistory::Unrecorded,
        };
        let mut created = claim("nb-build-workspace", unrecorded);
        created.owner_references = vec![job("nb", JOB_KIND)];
        assert_eq!(missing(&created, &contract()), None);
        // Another job's claim, or a claim not named for a job, proves nothing by its owner.
        created.owner_references = vec![job("other", JOB_KIND)];
        assert!(missing(&created, &contract()).is_some());
    }
}
