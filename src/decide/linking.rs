//! Linking a claim to its owners and users. Pure over a [`Lookup`], which the cache implements
//! for decisions and the live re-check implements from fresh reads before a delete.
//!
//! Every rule adds the owners it finds; none hides what another finds (docs/policy.md repeats
//! them), and the policy deletes a claim only when every linked owner allows it:
//! 1. **Owner references, by UID.** A `NotebookValidationJob` (`mlops.mlops.dev`), a
//!    `PipelineRun` or a `TaskRun` (`tekton.dev`) named in `ownerReferences` is looked up by
//!    name and counts only if its UID matches; otherwise that referenced owner is gone. A job
//!    re-created under the same name is a different object, which rule 3 may still link.
//! 2. **Workspace binding.** Every PipelineRun and TaskRun in the claim's namespace whose
//!    `spec.workspaces[].persistentVolumeClaim.claimName` is the claim.
//! 3. **Naming convention.** `{job}-build-workspace` ↔ job `{job}` and PipelineRun `{job}-build`,
//!    when they exist.

use crate::contract::{OwnerKind, naming};
use crate::decide::facts::{
    ClaimFacts, Facts, JobEntry, LinkRule, ObjectKey, Owner, OwnerState, PodUse, Progress,
    RunEntry, Users,
};

/// The answer to a look-up that may not be possible yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<T> {
    Yes(T),
    No,
    /// Could not be read: the cache has not synced, or the API server refused or failed.
    Unknown(String),
}

impl<T> Found<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Found<U> {
        match self {
            Found::Yes(value) => Found::Yes(f(value)),
            Found::No => Found::No,
            Found::Unknown(why) => Found::Unknown(why),
        }
    }
}

/// Where linking reads owners and users from.
pub trait Lookup {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry>;
    /// A PipelineRun ([`OwnerKind::Run`]) or TaskRun ([`OwnerKind::TaskRun`]) by name.
    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry>;
    /// The PipelineRuns and TaskRuns whose workspaces bind the claim.
    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>>;
    /// Pods that mount the claim, whatever their phase.
    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>>;
}

/// The names of the jobs linking can link to `claim` (by reference or by name): what the live
/// re-check reads by name. Runs need no names: the re-check lists them, since any run in the
/// namespace may bind the claim.
pub fn job_candidates(claim: &ClaimFacts) -> Vec<String> {
    let referenced = claim
        .owner_references
        .iter()
        .filter(|reference| reference.owner_kind() == Some(OwnerKind::Job))
        .map(|reference| reference.name.clone());
    let mut names: Vec<String> = referenced
        .chain(claim.conventional_job_name().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
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

fn owners(claim: &ClaimFacts, lookup: &impl Lookup) -> Vec<Owner> {
    let namespace = &claim.key.namespace;
    let mut owners = Links::default();

    for reference in &claim.owner_references {
        let Some(kind) = reference.owner_kind() else {
            continue;
        };
        let found = match kind {
            OwnerKind::Job => lookup
                .job(namespace, &reference.name)
                .map(JobEntry::into_state),
            OwnerKind::Run | OwnerKind::TaskRun => lookup
                .run(kind, namespace, &reference.name)
                .map(RunEntry::into_state),
        };
        owners.add(Owner {
            kind,
            name: reference.name.clone(),
            rule: LinkRule::OwnerReference,
            state: by_uid(found, &reference.uid),
        });
    }

    match lookup.runs_binding(&claim.key) {
        Found::Yes(runs) => {
            for run in runs {
                owners.add(Owner {
                    kind: run.kind,
                    name: run.key.name,
                    rule: LinkRule::WorkspaceBinding,
                    state: OwnerState::Present {
                        uid: run.uid,
                        progress: run.progress,
                    },
                });
            }
        }
        Found::No => {}
        Found::Unknown(why) => owners.add(Owner {
            kind: OwnerKind::Run,
            name: format!("(runs binding {})", claim.key.name),
            rule: LinkRule::WorkspaceBinding,
            state: OwnerState::Unknown { why },
        }),
    }

    if let Some(job) = claim.conventional_job_name() {
        let found = lookup.job(namespace, job).map(JobEntry::into_state);
        owners.add_named(OwnerKind::Job, job.to_owned(), found);
        let run = naming::run(job);
        let found = lookup
            .run(OwnerKind::Run, namespace, &run)
            .map(RunEntry::into_state);
        owners.add_named(OwnerKind::Run, run, found);
    }
    owners.0
}

/// The owners found so far; an object found by several rules is listed once, under the first.
#[derive(Default)]
struct Links(Vec<Owner>);

impl Links {
    fn add(&mut self, owner: Owner) {
        let same =
            |o: &Owner| o.kind == owner.kind && o.name == owner.name && o.state == owner.state;
        if !self.0.iter().any(same) {
            self.0.push(owner);
        }
    }

    /// An owner found by the naming convention: linked only if it exists (or might).
    fn add_named(&mut self, kind: OwnerKind, name: String, found: Found<(String, Progress)>) {
        let state = match found {
            Found::Yes((uid, progress)) => OwnerState::Present { uid, progress },
            Found::No => return,
            Found::Unknown(why) => OwnerState::Unknown { why },
        };
        self.add(Owner {
            kind,
            name,
            rule: LinkRule::Naming,
            state,
        });
    }
}

impl JobEntry {
    fn into_state(self) -> (String, Progress) {
        (self.uid, self.progress)
    }
}

impl RunEntry {
    fn into_state(self) -> (String, Progress) {
        (self.uid, self.progress)
    }
}

/// An owner named by reference: present only with the referenced UID.
fn by_uid(found: Found<(String, Progress)>, referenced_uid: &str) -> OwnerState {
    match found {
        Found::Yes((uid, progress)) if uid == referenced_uid => {
            OwnerState::Present { uid, progress }
        }
        Found::Yes(_) | Found::No => OwnerState::Gone,
        Found::Unknown(why) => OwnerState::Unknown { why },
    }
}
