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
//!
//! Users are not owners: the pods that mount the claim, and every unfinished job whose own
//! `spec.podConfig.volumes[]` names it (its validation pod will mount it).

use chrono::{DateTime, Utc};

use crate::contract::{OwnerKind, naming};
use crate::decide::facts::{
    ClaimFacts, Facts, FailedRank, JobEntry, LinkRule, MAX_KEEP_FAILED, ObjectKey, Owner,
    OwnerState, PodUse, Progress, RunEntry, Users, VolumeClaims,
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
    /// The jobs of the claim's namespace whose own volumes name the claim, or could not be
    /// read, whatever their progress.
    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>>;
    /// How many owners of `kind` in `namespace` finished failed with a completion time after
    /// `at`, counted up to [`MAX_KEEP_FAILED`] (see [`failed_after`]).
    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32>;
}

/// Gathers the facts about one claim.
pub fn facts(claim: &ClaimFacts, lookup: &impl Lookup) -> Facts {
    let owners = owners(claim, lookup);
    Facts {
        failed_rank: failed_rank(claim, &owners, lookup),
        claim: claim.clone(),
        owners,
        users: users(claim, lookup),
    }
}

/// How many of `progresses` (one kind's, in one namespace) finished failed with a completion
/// time after `at`, up to [`MAX_KEEP_FAILED`]. A failure without a completion time is not
/// counted: where it ranks is unknown, and leaving it out only ranks others higher.
pub fn failed_after<'a>(
    progresses: impl IntoIterator<Item = &'a Progress>,
    at: DateTime<Utc>,
) -> u32 {
    let newer = progresses.into_iter().filter(|progress| {
        matches!(progress, Progress::Finished { at: Some(done), failed: true } if *done > at)
    });
    let newer = newer.take(MAX_KEEP_FAILED as usize).count();
    u32::try_from(newer).unwrap_or(MAX_KEEP_FAILED)
}

/// Where the claim's build ranks among its namespace's failed builds: the best rank of its
/// failed owners, each among the owners of its kind; unknown as soon as one cannot be ranked.
fn failed_rank(claim: &ClaimFacts, owners: &[Owner], lookup: &impl Lookup) -> FailedRank {
    let mut rank = FailedRank::NotFailed;
    for owner in owners {
        let OwnerState::Present {
            progress: Progress::Finished { at, failed: true },
            ..
        } = &owner.state
        else {
            continue;
        };
        let Some(at) = at else {
            let why = format!(
                "{} {} failed but records no completion time",
                owner.kind.as_str(),
                owner.name
            );
            return FailedRank::Unknown { why };
        };
        match lookup.failed_after(owner.kind, &claim.key.namespace, *at) {
            Found::Yes(newer) => {
                rank = match rank {
                    FailedRank::Ranked { newer: best } => FailedRank::Ranked {
                        newer: best.min(newer),
                    },
                    _ => FailedRank::Ranked { newer },
                };
            }
            Found::No => rank = FailedRank::Ranked { newer: 0 },
            Found::Unknown(why) => return FailedRank::Unknown { why },
        }
    }
    rank
}

/// The pods that mount the claim and the unfinished jobs whose volumes name it. An unfinished
/// job whose volumes cannot be read might name it: its users are unknown. A finished job's
/// volumes hold nothing.
fn users(claim: &ClaimFacts, lookup: &impl Lookup) -> Users {
    let pods = match lookup.pods_using(&claim.key) {
        Found::Yes(pods) => pods,
        Found::No => Vec::new(),
        Found::Unknown(why) => return Users::Unknown { why },
    };
    let found = match lookup.jobs_naming(&claim.key) {
        Found::Yes(jobs) => jobs,
        Found::No => Vec::new(),
        Found::Unknown(why) => return Users::Unknown { why },
    };
    let mut jobs = Vec::new();
    for job in found
        .into_iter()
        .filter(|job| job.progress == Progress::Running)
    {
        match job.volumes {
            VolumeClaims::Named(names) if names.contains(&claim.key.name) => {
                jobs.push(job.key.name);
            }
            VolumeClaims::Named(_) => {}
            VolumeClaims::Unreadable => {
                let why = format!(
                    "the volumes of NotebookValidationJob {} could not be read",
                    job.key.name
                );
                return Users::Unknown { why };
            }
        }
    }
    Users::Known { pods, jobs }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace holding only `jobs` (no pod, no run).
    struct Jobs(Vec<JobEntry>);

    impl Lookup for Jobs {
        fn job(&self, _: &str, name: &str) -> Found<JobEntry> {
            let job = self.0.iter().find(|job| job.key.name == name);
            job.cloned().map_or(Found::No, Found::Yes)
        }

        fn run(&self, _: OwnerKind, _: &str, _: &str) -> Found<RunEntry> {
            Found::No
        }

        fn runs_binding(&self, _: &ObjectKey) -> Found<Vec<RunEntry>> {
            Found::Yes(Vec::new())
        }

        fn pods_using(&self, _: &ObjectKey) -> Found<Vec<PodUse>> {
            Found::Yes(Vec::new())
        }

        /// Every job, as a lookup may over-answer: linking reads the volumes itself.
        fn jobs_naming(&self, _: &ObjectKey) -> Found<Vec<JobEntry>> {
            Found::Yes(self.0.clone())
        }

        fn failed_after(&self, kind: OwnerKind, _: &str, at: DateTime<Utc>) -> Found<u32> {
            match kind {
                OwnerKind::Job => Found::Yes(failed_after(self.0.iter().map(|j| &j.progress), at)),
                OwnerKind::Run | OwnerKind::TaskRun => Found::Yes(0),
            }
        }
    }

    fn job(name: &str, progress: Progress, volumes: VolumeClaims) -> JobEntry {
        JobEntry {
            key: ObjectKey::new("ml", name),
            uid: format!("{name}-uid"),
            progress,
            volumes,
        }
    }

    fn naming(claims: &[&str]) -> VolumeClaims {
        VolumeClaims::Named(claims.iter().map(|c| (*c).to_owned()).collect())
    }

    fn users(jobs: Vec<JobEntry>) -> Users {
        facts(&ClaimFacts::example("a-build-workspace"), &Jobs(jobs)).users
    }

    #[test]
    fn unfinished_jobs_naming_the_claim_in_their_volumes_use_it() {
        let done = Progress::Finished {
            at: None,
            failed: false,
        };
        let found = users(vec![
            job(
                "b",
                Progress::Running,
                naming(&["data", "a-build-workspace"]),
            ),
            job("c", done.clone(), naming(&["a-build-workspace"])),
            job("d", Progress::Running, naming(&["other"])),
            job("e", done, VolumeClaims::Unreadable),
        ]);
        let expected = Users::Known {
            pods: Vec::new(),
            jobs: vec!["b".into()],
        };
        assert_eq!(found, expected, "a finished job's volumes hold nothing");
    }

    #[test]
    fn a_failed_build_ranks_by_the_failures_of_its_kind_after_it() {
        let at = |minute: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::minutes(minute);
        let failed = |minute| Progress::Finished {
            at: Some(at(minute)),
            failed: true,
        };
        let succeeded = Progress::Finished {
            at: Some(at(9)),
            failed: false,
        };
        let unnamed = || naming(&[]);
        let rank = |jobs: Vec<JobEntry>| {
            facts(&ClaimFacts::example("a-build-workspace"), &Jobs(jobs)).failed_rank
        };
        let others = || {
            vec![
                job("b", failed(5), unnamed()),
                job("c", failed(3), unnamed()),
                job("d", succeeded.clone(), unnamed()),
                job(
                    "e",
                    Progress::Finished {
                        at: None,
                        failed: true,
                    },
                    unnamed(),
                ),
            ]
        };
        let mut jobs = others();
        jobs.push(job("a", failed(2), unnamed()));
        assert_eq!(rank(jobs), FailedRank::Ranked { newer: 2 });
        let mut jobs = others();
        jobs.push(job("a", failed(5), unnamed()));
        assert_eq!(
            rank(jobs),
            FailedRank::Ranked { newer: 0 },
            "a tie ranks both"
        );
        let mut jobs = others();
        jobs.push(job("a", succeeded.clone(), unnamed()));
        assert_eq!(rank(jobs), FailedRank::NotFailed);
        let mut jobs = others();
        jobs.push(job(
            "a",
            Progress::Finished {
                at: None,
                failed: true,
            },
            unnamed(),
        ));
        assert!(matches!(rank(jobs), FailedRank::Unknown { .. }));
    }

    #[test]
    fn an_unfinished_job_whose_volumes_cannot_be_read_may_use_any_claim() {
        let found = users(vec![
            job("b", Progress::Running, naming(&["a-build-workspace"])),
            job("odd", Progress::Running, VolumeClaims::Unreadable),
        ]);
        let Users::Unknown { why } = found else {
            panic!("{found:?}")
        };
        assert!(why.contains("odd"), "{why}");
    }
}
