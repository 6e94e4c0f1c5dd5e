//! What each kind of entry means to the [`Index`]: which table holds it, the secondary-index
//! rows it adds, and the claims a change of it affects. Apart from the index, which applies
//! changes of any kind the same way, because these rules are where the kinds differ.

use std::collections::BTreeSet;

use super::table::{Table, set_row};
use super::{Index, TaskRunEntry, sibling};
use crate::contract::{JOB_KIND, OwnerKind, RUN_KIND, TASK_RUN_KIND, naming};
use crate::decide::facts::{
    ClaimFacts, JobEntry, NamespaceEntry, ObjectKey, PodEntry, Progress, RunEntry, VolumeClaims,
};
use crate::decide::quota::QuotaEntry;

/// A cache entry kind: where it lives in the index and which claims it touches.
pub trait Cached: Clone + PartialEq + Sized {
    /// A name for messages ("PipelineRun").
    const WHAT: &'static str;
    fn key(&self) -> &ObjectKey;
    fn table(index: &mut Index) -> &mut Table<Self>;
    /// Adds (or removes) this entry's secondary-index rows.
    fn index(&self, index: &mut Index, add: bool);
    /// The claims whose facts depend on this entry.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>);
}

impl Cached for ClaimFacts {
    const WHAT: &'static str = "PersistentVolumeClaim";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.claims
    }

    fn index(&self, index: &mut Index, add: bool) {
        index.count_candidate(self, add);
        for reference in &self.owner_references {
            set_row(
                &mut index.claims_by_owner,
                reference.uid.clone(),
                self.key.clone(),
                add,
            );
        }
    }

    fn affected(&self, _: &Index, out: &mut BTreeSet<ObjectKey>) {
        // A claim's own change always counts, even its deletion (to drop its schedule).
        out.insert(self.key.clone());
    }
}

impl Cached for JobEntry {
    const WHAT: &'static str = JOB_KIND;

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.jobs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index.count(&self.key, add);
        index.count_failed(OwnerKind::Job, &self.key, &self.progress, add);
        let name = self.key.name.clone();
        match &self.volumes {
            VolumeClaims::Named(claims) => {
                for claim in claims {
                    let claim = sibling(&self.key, claim.clone());
                    set_row(&mut index.jobs_by_claim, claim, name.clone(), add);
                }
            }
            VolumeClaims::Unreadable => {
                let namespace = self.key.namespace.clone();
                set_row(&mut index.unreadable_jobs, namespace, name, add);
            }
        }
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        index.tracked(sibling(&self.key, naming::claim(&self.key.name)), out);
        index.owned_by(&self.uid, out);
        ranked_below(&self.key, &self.progress, index, out);
        match &self.volumes {
            VolumeClaims::Named(claims) => {
                for claim in claims {
                    index.tracked(sibling(&self.key, claim.clone()), out);
                }
            }
            VolumeClaims::Unreadable => {
                out.extend((index.claims_in(&self.key.namespace)).map(|claim| claim.key.clone()))
            }
        }
    }
}

impl Cached for RunEntry {
    const WHAT: &'static str = RUN_KIND;

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.runs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index_bindings(self, index, add);
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        bound_claims(self, index, out);
        ranked_below(&self.key, &self.progress, index, out);
        if let Some(job) = naming::job_of_run(&self.key.name) {
            index.tracked(sibling(&self.key, naming::claim(job)), out);
        }
    }
}

impl Cached for TaskRunEntry {
    const WHAT: &'static str = TASK_RUN_KIND;

    fn key(&self) -> &ObjectKey {
        &self.0.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.task_runs
    }

    fn index(&self, index: &mut Index, add: bool) {
        index_bindings(&self.0, index, add);
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        bound_claims(&self.0, index, out);
        ranked_below(&self.0.key, &self.0.progress, index, out);
    }
}

/// Adds (or removes) a run's rows in the claim → binding runs index, and counts it.
fn index_bindings(run: &RunEntry, index: &mut Index, add: bool) {
    index.count(&run.key, add);
    index.count_failed(run.kind, &run.key, &run.progress, add);
    for claim in &run.claims {
        let claim = sibling(&run.key, claim.clone());
        let row = (run.kind, run.key.name.clone());
        set_row(&mut index.runs_by_claim, claim, row, add);
    }
}

/// A failed owner with a completion time ranks every other failed build of its namespace: where
/// claims may be kept by count (`Policy::keep_failed`), a new one may push one out, so each
/// claim there is re-evaluated (once per change, see [`Index::expand`]).
fn ranked_below(
    key: &ObjectKey,
    progress: &Progress,
    index: &Index,
    out: &mut BTreeSet<ObjectKey>,
) {
    if matches!(
        progress,
        Progress::Finished {
            at: Some(_),
            failed: true
        }
    ) && index.keeps_by_count(&key.namespace)
    {
        out.insert(ObjectKey::new(&key.namespace, ""));
    }
}

/// The claims a run touches through its bindings and its UID.
fn bound_claims(run: &RunEntry, index: &Index, out: &mut BTreeSet<ObjectKey>) {
    for claim in &run.claims {
        index.tracked(sibling(&run.key, claim.clone()), out);
    }
    index.owned_by(&run.uid, out);
}

impl Cached for PodEntry {
    const WHAT: &'static str = "Pod";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.pods
    }

    fn index(&self, index: &mut Index, add: bool) {
        index.count(&self.key, add);
        for claim in &self.claims {
            let claim = sibling(&self.key, claim.clone());
            set_row(&mut index.pods_by_claim, claim, self.key.name.clone(), add);
        }
    }

    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        for claim in &self.claims {
            index.tracked(sibling(&self.key, claim.clone()), out);
        }
    }
}

impl Cached for QuotaEntry {
    const WHAT: &'static str = "ResourceQuota";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.quotas
    }

    fn index(&self, _: &mut Index, _: bool) {}

    /// Pressure in a namespace may choose any of its claims.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        out.extend(
            index
                .claims_in(&self.key.namespace)
                .map(|claim| claim.key.clone()),
        );
    }
}

impl Cached for NamespaceEntry {
    const WHAT: &'static str = "Namespace";

    fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn table(index: &mut Index) -> &mut Table<Self> {
        &mut index.namespaces
    }

    fn index(&self, _: &mut Index, _: bool) {}

    /// Its settings apply to every claim in it.
    fn affected(&self, index: &Index, out: &mut BTreeSet<ObjectKey>) {
        out.extend(
            index
                .claims_in(&self.key.name)
                .map(|claim| claim.key.clone()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{claim, job, keys, pod, run, synced};
    use super::*;
    use crate::cluster::cache::Change;
    use crate::decide::facts::{LinkRule, OwnerRef, OwnerState};
    use crate::decide::linking::{self, Found, Lookup};

    #[test]
    fn changes_affect_exactly_the_linked_claims() {
        let mut index = synced();
        for name in ["nb-build-workspace", "other-build-workspace", "shared"] {
            assert_eq!(index.apply(Change::Apply(claim(name))), keys(&[name]));
        }
        // A job affects its conventional claim.
        assert_eq!(
            index.apply(Change::Apply(job("nb", "j1"))),
            keys(&["nb-build-workspace"])
        );
        // A run affects the claims it binds and its conventional one.
        assert_eq!(
            index.apply(Change::Apply(run("nb-build", &["shared"]))),
            keys(&["nb-build-workspace", "shared"])
        );
        // A pod affects the claims it mounts (untracked ones are dropped).
        assert_eq!(
            index.apply(Change::Apply(pod(
                "p",
                &["shared", "not-tracked"],
                "Running"
            ))),
            keys(&["shared"])
        );
        // An unchanged object affects nothing.
        assert!(
            index
                .apply(Change::Apply(pod(
                    "p",
                    &["shared", "not-tracked"],
                    "Running"
                )))
                .is_empty()
        );
        // Re-binding affects the old and the new claim.
        assert_eq!(
            index.apply(Change::Apply(run("nb-build", &["other-build-workspace"]))),
            keys(&["nb-build-workspace", "shared", "other-build-workspace"])
        );
        assert_eq!(
            index.apply::<PodEntry>(Change::Delete(ObjectKey::new("ml", "p"))),
            keys(&["shared"])
        );
    }

    #[test]
    fn a_job_reaches_the_claims_its_volumes_name() {
        let mut index = synced();
        for name in ["a-build-workspace", "other", "b-build-workspace"] {
            index.apply(Change::Apply(claim(name)));
        }
        let mut b = job("b", "j2");
        b.volumes = VolumeClaims::Named(vec!["a-build-workspace".into()]);
        assert_eq!(
            index.apply(Change::Apply(b.clone())),
            keys(&["a-build-workspace", "b-build-workspace"])
        );
        let naming_a =
            |index: &Index| index.jobs_naming(&ObjectKey::new("ml", "a-build-workspace"));
        assert_eq!(naming_a(&index), Found::Yes(vec![b.clone()]));
        assert_eq!(
            index.jobs_naming(&ObjectKey::new("ml", "other")),
            Found::Yes(vec![])
        );
        // It finishes: the claim it named is decided again.
        let mut finished = b.clone();
        finished.progress = Progress::Finished {
            at: None,
            failed: false,
        };
        assert_eq!(
            index.apply(Change::Apply(finished)),
            keys(&["a-build-workspace", "b-build-workspace"])
        );
        // Volumes that cannot be read may name any claim of the namespace.
        let mut odd = job("odd", "j3");
        odd.volumes = VolumeClaims::Unreadable;
        assert_eq!(
            index.apply(Change::Apply(odd.clone())),
            keys(&["a-build-workspace", "other", "b-build-workspace"])
        );
        assert!(matches!(naming_a(&index), Found::Yes(jobs) if jobs.len() == 2));
        assert_eq!(
            index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "odd"))),
            keys(&["a-build-workspace", "other", "b-build-workspace"])
        );
        index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "b")));
        assert_eq!(naming_a(&index), Found::Yes(vec![]));
        assert!(index.jobs_by_claim.is_empty() && index.unreadable_jobs.is_empty());
    }

    #[test]
    fn owner_reference_changes_reach_the_owned_claim() {
        let mut index = synced();
        let mut owned = claim("custom-name");
        owned.owner_references.push(OwnerRef {
            api_version: "mlops.mlops.dev/v1alpha1".into(),
            kind: "NotebookValidationJob".into(),
            name: "nb".into(),
            uid: "j1".into(),
        });
        index.apply(Change::Apply(owned.clone()));
        assert_eq!(
            index.apply(Change::Apply(job("nb", "j1"))),
            keys(&["custom-name"])
        );
        let facts = linking::facts(&owned, &index);
        assert_eq!(facts.owners.len(), 1);
        assert_eq!(facts.owners[0].rule, LinkRule::OwnerReference);
        assert!(matches!(facts.owners[0].state, OwnerState::Present { .. }));

        // Re-created under the same name: a different owner, so the referenced one is gone.
        index.apply::<JobEntry>(Change::Delete(ObjectKey::new("ml", "nb")));
        index.apply(Change::Apply(job("nb", "j2")));
        let facts = linking::facts(&owned, &index);
        assert_eq!(facts.owners[0].state, OwnerState::Gone);
    }

    #[test]
    fn a_quota_change_affects_every_claim_of_its_namespace_only() {
        use crate::decide::quota::{Limit, QuotaEntry, Resource};
        let mut index = synced();
        let mut elsewhere = claim("b");
        elsewhere.key.namespace = "other".into();
        index.apply(Change::Apply(claim("a")));
        index.apply(Change::Apply(claim("c")));
        index.apply(Change::Apply(elsewhere));
        let quota = |used| QuotaEntry {
            key: ObjectKey::new("ml", "q"),
            uid: "q".into(),
            limits: vec![Limit {
                resource: Resource::Claims,
                hard: 10,
                used,
            }],
        };
        assert_eq!(index.apply(Change::Apply(quota(9))), keys(&["a", "c"]));
        assert!(index.apply(Change::Apply(quota(9))).is_empty(), "unchanged");
        assert_eq!(index.quotas_in("ml"), Found::Yes(vec![quota(9)]));
        assert_eq!(index.quotas_in("other"), Found::Yes(vec![]));
        assert_eq!(index.quota_namespaces(), ["ml".to_owned()].into());
        let waiting = Index::default().with_quotas(&[None]);
        assert!(!waiting.synced(), "waits for the quota watch to list");
        assert!(matches!(waiting.quotas_in("ml"), Found::Unknown(_)));
    }
}
