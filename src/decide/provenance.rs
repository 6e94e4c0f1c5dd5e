//! Whether a labelled claim is a build workspace at all: the label alone is not enough, since
//! anyone who can edit a claim can add it (a kustomization's `commonLabels`, a chart's common
//! labels, a hand `kubectl label`). A claim is a candidate only when its own record says the
//! operator (or `workspace-gc create`) made it one; see docs/policy.md, "Provenance".
//!
//! The edge ([`crate::cluster::resources`]) reads the claim's labels and `managedFields` once,
//! at ingest, into the compact [`crate::decide::facts::Provenance`] the claim's facts keep (the
//! cache drops the managed fields); here that fact is judged against the configured
//! [`ProvenanceRule`]: what the record can prove, and no more.

use std::fmt;

use crate::contract::naming::{self, CLAIM_SUFFIX};
use crate::contract::{OwnerKind, labels::BUILD_WORKSPACE};
use crate::decide::facts::{AccessModes, ClaimFacts, LabelHistory, LabelOwner, Operation};

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
    /// The build-workspace label is owned by managers whose entries do not prove they made the
    /// claim (none listed: no manager owns it in the record).
    AddedLater { by: Vec<String> },
    /// The label's owner was merged into the API server's `ancient-changes` entry, which no
    /// longer says which write set it.
    Merged,
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
            Missing::Merged => write!(
                f,
                "the owner of the label {label} was merged into the API server's \
                 {MERGED_MANAGER} entry (more than ten field managers updated the claim), which no \
                 longer says which write set it"
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
            let unproven = |o: &&LabelOwner| {
                o.operation != Operation::Merged
                    && !made_claim(o)
                    && !rule.label_managers.contains(&o.manager)
            };
            let by: Vec<String> = (owners.iter().filter(unproven))
                .map(|o| o.manager.clone())
                .collect();
            if owners.is_empty() || !by.is_empty() {
                Some(Missing::AddedLater { by })
            } else if owners.iter().any(|o| o.operation == Operation::Merged) {
                Some(Missing::Merged)
            } else {
                None
            }
        }
    }
}

/// The manager the API server merges a claim's oldest `Update` entries into.
pub const MERGED_MANAGER: &str = "ancient-changes";

/// Whether the entry proves its write made the claim: an `Update` takes ownership only of the
/// fields it changes, and access modes cannot change once the claim exists, so an `Update` that
/// owns them made it; an `Apply` owns all it declares, so only as their one owner (a claim made
/// by server-side apply), never beside the entry of the write that did make it. The
/// `ancient-changes` entry proves nothing: it merges several writers.
fn made_claim(owner: &LabelOwner) -> bool {
    matches!(
        (owner.operation, owner.access_modes),
        (Operation::Update, AccessModes::Alone | AccessModes::Shared)
            | (Operation::Apply, AccessModes::Alone)
    )
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
    use crate::decide::facts::{OwnerRef, Provenance};
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

    fn owners(owners: &[(&str, Operation, AccessModes)]) -> Provenance {
        Provenance {
            operator_labels: true,
            label: LabelHistory::Owners(
                (owners.iter())
                    .map(|&(manager, operation, access_modes)| LabelOwner {
                        manager: manager.to_owned(),
                        operation,
                        access_modes,
                    })
                    .collect(),
            ),
        }
    }

    use AccessModes::{Alone, NotOwned, Shared};
    use Operation::{Apply, Merged, Other, Update};

    #[test]
    fn the_write_that_made_the_claim_is_provenance() {
        let rule = contract();
        let made = claim("nb-build-workspace", Provenance::operator("manager"));
        assert_eq!(missing(&made, &rule), None, "the operator's create");
        let applied = claim("nb-build-workspace", owners(&[("argocd", Apply, Alone)]));
        assert_eq!(missing(&applied, &rule), None, "made by server-side apply");
        // The creator's entry proves its making even once another apply shares its spec.
        let adopted = claim("nb-build-workspace", owners(&[("manager", Update, Shared)]));
        assert_eq!(missing(&adopted, &rule), None);
    }

    /// Issue 55, case 1: an apply of the whole claim by a GitOps controller shares the access
    /// modes the creator's `Update` owns; that is no proof it made the claim.
    #[test]
    fn an_apply_that_shares_the_spec_did_not_make_the_claim() {
        let rule = contract();
        let adopted = claim(
            "cache-build-workspace",
            owners(&[("argocd", Apply, Shared)]),
        );
        let by = vec!["argocd".to_owned()];
        assert_eq!(missing(&adopted, &rule), Some(Missing::AddedLater { by }));
        // The operator's claim applied again whole by a GitOps tool: that tool owns the label
        // too, and proves nothing.
        let both = owners(&[("manager", Update, Shared), ("argocd", Apply, Shared)]);
        let by = vec!["argocd".to_owned()];
        let both = claim("nb-build-workspace", both);
        assert_eq!(missing(&both, &rule), Some(Missing::AddedLater { by }));
        let labels_only = claim(
            "cache-build-workspace",
            owners(&[("flux", Apply, NotOwned)]),
        );
        assert!(missing(&labels_only, &rule).is_some());
    }

    /// Issue 55, case 2: the server's merge of its oldest entries owns the creator's access
    /// modes and the labeller's label in one entry; it proves nothing, and says so.
    #[test]
    fn a_merged_record_proves_nothing() {
        let rule = contract();
        let merged = claim(
            "data-build-workspace",
            owners(&[(MERGED_MANAGER, Merged, Alone)]),
        );
        assert_eq!(missing(&merged, &rule), Some(Missing::Merged));
        let text = Missing::Merged.to_string();
        assert!(
            text.contains("merged into the API server's ancient-changes"),
            "{text}"
        );
        // Not even when named trusted: the entry names no writer.
        let trusting = ProvenanceRule {
            label_managers: vec![MERGED_MANAGER.into()],
            ..contract()
        };
        assert_eq!(missing(&merged, &trusting), Some(Missing::Merged));
        // A later labeller beside it is the first thing missing.
        let later = owners(&[
            (MERGED_MANAGER, Merged, Alone),
            ("kubectl-label", Update, NotOwned),
        ]);
        let by = vec!["kubectl-label".to_owned()];
        let later = claim("data-build-workspace", later);
        assert_eq!(missing(&later, &rule), Some(Missing::AddedLater { by }));
        let odd = claim("data-build-workspace", owners(&[("m", Other, Alone)]));
        assert!(
            missing(&odd, &rule).is_some(),
            "an unknown operation proves nothing"
        );
    }

    #[test]
    fn a_label_added_later_is_not_provenance() {
        let rule = contract();
        let later = claim(
            "data-build-workspace",
            owners(&[("kubectl-label", Update, NotOwned)]),
        );
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
            owners(&[("op", Update, Alone), ("helm", Update, NotOwned)]),
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
