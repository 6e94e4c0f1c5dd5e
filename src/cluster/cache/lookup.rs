//! The [`Index`] as the linking's [`Lookup`]: a claim's owners and users as the cache holds
//! them, `Unknown` where a kind has not listed or is not served. Apart from the index because
//! it only reads it, through the rows `entries.rs` keeps.

use std::ops::Bound;

use chrono::{DateTime, Utc};

use super::{Cached, Index, TaskRunEntry, sibling};
use crate::contract::OwnerKind;
use crate::decide::facts::{JobEntry, MAX_KEEP_FAILED, ObjectKey, PodEntry, PodUse, RunEntry};
use crate::decide::linking::{Found, Lookup};

impl Lookup for Index {
    fn job(&self, namespace: &str, name: &str) -> Found<JobEntry> {
        self.jobs
            .get(&ObjectKey::new(namespace, name), JobEntry::WHAT)
    }

    fn run(&self, kind: OwnerKind, namespace: &str, name: &str) -> Found<RunEntry> {
        let key = ObjectKey::new(namespace, name);
        match kind {
            OwnerKind::TaskRun => self
                .task_runs
                .get(&key, TaskRunEntry::WHAT)
                .map(|entry| entry.0),
            OwnerKind::Run | OwnerKind::Job => self.runs.get(&key, RunEntry::WHAT),
        }
    }

    fn runs_binding(&self, claim: &ObjectKey) -> Found<Vec<RunEntry>> {
        let namespace = &claim.namespace;
        for known in [
            self.runs.known_in(namespace, RunEntry::WHAT),
            self.task_runs.known_in(namespace, TaskRunEntry::WHAT),
        ] {
            if let Err(why) = known {
                return Found::Unknown(why);
            }
        }
        let runs = self.runs_by_claim.get(claim).into_iter().flatten();
        Found::Yes(
            runs.filter_map(|(kind, name)| {
                let key = sibling(claim, name.clone());
                match kind {
                    OwnerKind::TaskRun => self.task_runs.entry(&key).map(|e| e.0.clone()),
                    OwnerKind::Run | OwnerKind::Job => self.runs.entry(&key).cloned(),
                }
            })
            .collect(),
        )
    }

    fn jobs_naming(&self, claim: &ObjectKey) -> Found<Vec<JobEntry>> {
        // Jobs not served where they can be read may name any claim of the namespace.
        if let Err(why) = self.jobs.known_in(&claim.namespace, JobEntry::WHAT) {
            return Found::Unknown(why);
        }
        let named = self.jobs_by_claim.get(claim).into_iter().flatten();
        let unreadable = (self.unreadable_jobs.get(&*claim.namespace))
            .into_iter()
            .flatten();
        Found::Yes(
            named
                .chain(unreadable)
                .filter_map(|name| self.jobs.entry(&sibling(claim, name.clone())))
                .cloned()
                .collect(),
        )
    }

    fn failed_after(&self, kind: OwnerKind, namespace: &str, at: DateTime<Utc>) -> Found<u32> {
        let known = match kind {
            OwnerKind::Job => self.jobs.known_in(namespace, JobEntry::WHAT),
            OwnerKind::Run => self.runs.known_in(namespace, RunEntry::WHAT),
            OwnerKind::TaskRun => self.task_runs.known_in(namespace, TaskRunEntry::WHAT),
        };
        if let Err(why) = known {
            return Found::Unknown(why);
        }
        let Some(times) = self.failed_by_namespace.get(namespace) else {
            return Found::Yes(0);
        };
        let later = (
            Bound::Excluded((kind, at)),
            Bound::Included((kind, DateTime::<Utc>::MAX_UTC)),
        );
        let mut newer = 0u32;
        for count in times.range(later).map(|(_, n)| *n) {
            newer = newer.saturating_add(count);
            if newer >= MAX_KEEP_FAILED {
                return Found::Yes(MAX_KEEP_FAILED);
            }
        }
        Found::Yes(newer)
    }

    fn pods_using(&self, claim: &ObjectKey) -> Found<Vec<PodUse>> {
        if !self.pods.synced() {
            return Found::Unknown(format!("the {} cache has not synced yet", PodEntry::WHAT));
        }
        let pods = self.pods_by_claim.get(claim).into_iter().flatten();
        Found::Yes(
            pods.filter_map(|name| self.pods.entry(&sibling(claim, name.clone())))
                .map(|pod| PodUse {
                    name: pod.key.name.clone(),
                    phase: pod.phase.clone(),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{claim, job, keys, run, synced};
    use super::*;
    use crate::cluster::cache::Change;
    use crate::decide::facts::{LinkRule, OwnerState, Users};
    use crate::decide::linking;

    #[test]
    fn unsynced_kinds_are_unknown_not_absent() {
        let mut index = Index::default();
        index.apply(Change::Apply(claim("a-build-workspace")));
        let facts = linking::facts(
            index
                .claim(&ObjectKey::new("ml", "a-build-workspace"))
                .unwrap(),
            &index,
        );
        assert!(matches!(facts.users, Users::Unknown { .. }));
        assert!(
            facts
                .owners
                .iter()
                .all(|o| matches!(o.state, OwnerState::Unknown { .. }))
        );
    }

    #[test]
    fn every_rule_adds_its_owners() {
        let mut index = synced();
        let key = ObjectKey::new("ml", "nb-build-workspace");
        index.apply(Change::Apply(claim("nb-build-workspace")));
        index.apply(Change::Apply(job("nb", "j1")));
        index.apply(Change::Apply(run("nb-build", &[])));
        let owners = |index: &Index| {
            let facts = linking::facts(index.claim(&key).unwrap(), index);
            facts
                .owners
                .iter()
                .map(|o| (o.kind, o.name.clone(), o.rule))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            owners(&index),
            vec![
                (OwnerKind::Job, "nb".into(), LinkRule::Naming),
                (OwnerKind::Run, "nb-build".into(), LinkRule::Naming)
            ]
        );

        // A re-run and a TaskRun that bind the claim add to the owners found by name; a TaskRun
        // touches the claim it binds.
        index.apply(Change::Apply(run("retry-7", &["nb-build-workspace"])));
        let mut task_run = run("nb-build", &["nb-build-workspace"]);
        task_run.kind = OwnerKind::TaskRun;
        assert_eq!(
            index.apply(Change::Apply(TaskRunEntry(task_run))),
            keys(&["nb-build-workspace"])
        );
        assert_eq!(
            owners(&index),
            vec![
                (OwnerKind::Run, "retry-7".into(), LinkRule::WorkspaceBinding),
                (
                    OwnerKind::TaskRun,
                    "nb-build".into(),
                    LinkRule::WorkspaceBinding
                ),
                (OwnerKind::Job, "nb".into(), LinkRule::Naming),
                (OwnerKind::Run, "nb-build".into(), LinkRule::Naming)
            ]
        );
    }
}
