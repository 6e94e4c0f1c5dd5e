//! Linking a claim to its owners and users. Pure over a [`Lookup`], which the cache implements
//! for decisions and the live re-check implements from fresh reads before a delete.
//!
//! The rules, in order (the README repeats them):
//! 1. **Owner references, by UID.** A `NotebookValidationJob` (`mlops.mlops.dev`) or a
//!    `PipelineRun` (`tekton.dev`) named in `ownerReferences` is looked up by name and counts
//!    only if its UID matches; otherwise that owner is gone. A job re-created under the same
//!    name is a different owner.
//! 2. **Workspace binding.** A PipelineRun in the claim's namespace whose
//!    `spec.workspaces[].persistentVolumeClaim.claimName` is the claim.
//! 3. **Naming convention.** `{job}-build-workspace` ↔ job `{job}` and PipelineRun `{job}-build`,
//!    for a kind that rules 1 and 2 did not link.

use crate::facts::{
    ClaimFacts, Facts, LinkRule, ObjectKey, Owner, OwnerKind, OwnerState, PodUse, Progress,
    RUN_SUFFIX, Users,
};
use crate::resources::{JobEntry, RunEntry};

/// The answer to a look-up that may not be possible yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<T> {
    Yes(T),
    No,
    /// Could not be read: the cache has not synced, or the API server refused or failed.
    Unknown(String),
}

/// Where linking reads owners and users from.
pub trait Lookup {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry>;
    fn run(&self, namespace: &str, name: &str) -> Found<RunEntry>;
    /// Runs whose workspaces bind the claim.
    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>>;
    /// Pods that mount the claim, whatever their phase.
    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>>;
}

/// The names linking will look up for a claim: what the live re-check must read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    pub jobs: Vec<String>,
    pub runs: Vec<String>,
}

/// Gathers the facts about one claim.
pub fn facts(claim: &ClaimFacts, lookup: &impl Lookup) -> Facts {
    let users = match lookup.pods_using(&claim.key) {
        Found::Yes(pods) => Users::Known { pods },
        Found::No => Users::Known { pods: Vec::new() },
        Found::Unknown(why) => Users::Unknown { why },
    };
    Facts {
        claim: claim.clone(),
        owners: owners(claim, lookup),
        users,
    }
}

/// The names of the jobs and runs that could be linked to `claim` by reference or by name,
/// plus the runs `lookup` knows to bind it.
pub fn candidates(claim: &ClaimFacts, lookup: &impl Lookup) -> Candidates {
    let mut candidates = Candidates::default();
    for reference in &claim.owner_references {
        match reference.owner_kind() {
            Some(OwnerKind::Job) => candidates.jobs.push(reference.name.clone()),
            Some(OwnerKind::Run) => candidates.runs.push(reference.name.clone()),
            None => {}
        }
    }
    if let Found::Yes(runs) = lookup.runs_binding(&claim.key) {
        candidates
            .runs
            .extend(runs.into_iter().map(|run| run.key.name));
    }
    if let Some(job) = claim.conventional_job_name() {
        candidates.jobs.push(job.to_owned());
        candidates.runs.push(format!("{job}{RUN_SUFFIX}"));
    }
    for names in [&mut candidates.jobs, &mut candidates.runs] {
        names.sort();
        names.dedup();
    }
    candidates
}

fn owners(claim: &ClaimFacts, lookup: &impl Lookup) -> Vec<Owner> {
    let namespace = &claim.key.namespace;
    let mut owners = Vec::new();
    let (mut job_referenced, mut run_referenced) = (false, false);

    for reference in &claim.owner_references {
        let Some(kind) = reference.owner_kind() else {
            continue;
        };
        let state = match kind {
            OwnerKind::Job => {
                job_referenced = true;
                by_uid(lookup.job(namespace, &reference.name), &reference.uid)
            }
            OwnerKind::Run => {
                run_referenced = true;
                by_uid(lookup.run(namespace, &reference.name), &reference.uid)
            }
        };
        owners.push(Owner {
            kind,
            name: reference.name.clone(),
            rule: LinkRule::OwnerReference,
            state,
        });
    }

    let conventional_job = claim.conventional_job_name();
    if !run_referenced {
        match lookup.runs_binding(&claim.key) {
            Found::Yes(runs) if !runs.is_empty() => {
                owners.extend(runs.into_iter().map(|run| Owner {
                    kind: OwnerKind::Run,
                    name: run.key.name,
                    rule: LinkRule::WorkspaceBinding,
                    state: OwnerState::Present {
                        uid: run.uid,
                        progress: run.progress,
                    },
                }));
            }
            Found::Unknown(why) => owners.push(Owner {
                kind: OwnerKind::Run,
                name: claim.key.name.clone(),
                rule: LinkRule::WorkspaceBinding,
                state: OwnerState::Unknown { why },
            }),
            Found::Yes(_) | Found::No => {
                if let Some(job) = conventional_job {
                    let name = format!("{job}{RUN_SUFFIX}");
                    let found = lookup.run(namespace, &name);
                    owners.extend(by_name(OwnerKind::Run, name, found));
                }
            }
        }
    }
    if !job_referenced && let Some(job) = conventional_job {
        owners.extend(by_name(
            OwnerKind::Job,
            job.to_owned(),
            lookup.job(namespace, job),
        ));
    }
    owners
}

/// The two owner kinds' entries, as linking reads them.
trait OwnerEntry {
    fn into_state(self) -> (String, Progress);
}

impl OwnerEntry for JobEntry {
    fn into_state(self) -> (String, Progress) {
        (self.uid, self.progress)
    }
}

impl OwnerEntry for RunEntry {
    fn into_state(self) -> (String, Progress) {
        (self.uid, self.progress)
    }
}

/// An owner named by reference: present only with the referenced UID.
fn by_uid(found: Found<impl OwnerEntry>, referenced_uid: &str) -> OwnerState {
    match found {
        Found::Yes(entry) => match entry.into_state() {
            (uid, progress) if uid == referenced_uid => OwnerState::Present { uid, progress },
            _ => OwnerState::Gone,
        },
        Found::No => OwnerState::Gone,
        Found::Unknown(why) => OwnerState::Unknown { why },
    }
}

/// An owner found by the naming convention: linked only if it exists (or might).
fn by_name(kind: OwnerKind, name: String, found: Found<impl OwnerEntry>) -> Option<Owner> {
    let state = match found {
        Found::Yes(entry) => {
            let (uid, progress) = entry.into_state();
            OwnerState::Present { uid, progress }
        }
        Found::No => return None,
        Found::Unknown(why) => OwnerState::Unknown { why },
    };
    Some(Owner {
        kind,
        name,
        rule: LinkRule::Naming,
        state,
    })
}
