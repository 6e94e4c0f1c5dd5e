//! The ground truth: for every claim incarnation (UID), the history of the states that decide
//! its fate, and when each was in force; and whether, by the policy the daemon runs with, it
//! was deletable at a given moment.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

use crate::{MARGIN, MAX_AGE, ORPHAN_GRACE, TTL, now, seconds};

/// A NotebookValidationJob's or PipelineRun's state, as the policy reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Absent,
    Running,
    Finished(DateTime<Utc>),
}

/// How a claim is tied to its build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// `{job}-build-workspace`, with job `{job}` and run `{job}-build`.
    Naming(String),
    /// An owner reference to job `{job}` by UID (as `workspace-gc create` makes them).
    OwnerRef(String),
    /// No owner at all.
    Orphan,
}

/// What decides a claim's fate at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub keep: bool,
    pub invalid: bool,
    pub ttl: Option<i64>,
    pub expires: Option<DateTime<Utc>>,
    pub active_pods: usize,
    pub job: Owner,
    pub run: Owner,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub before: DateTime<Utc>,
    pub after: DateTime<Utc>,
    pub state: State,
}

/// The annotations the driver set on one claim.
#[derive(Debug, Clone, Default)]
pub struct Annotations {
    pub keep: bool,
    pub invalid: bool,
    pub ttl: Option<i64>,
    pub expires: Option<DateTime<Utc>>,
}

/// One claim incarnation: a UID.
#[derive(Debug, Clone)]
pub struct Incarnation {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub created: DateTime<Utc>,
    pub link: Link,
    pub annotations: Annotations,
    pub history: Vec<Snapshot>,
    /// No longer exists (deleted by someone, seen missing or terminating).
    pub gone: bool,
    /// The driver deleted it (to re-create the name): not the daemon's to judge.
    pub driver_deleted: bool,
    /// A driver call about it failed in an unknown way: excluded from the check.
    pub tainted: bool,
}

impl Incarnation {
    pub fn deletable(&self, state: &State, at: DateTime<Utc>) -> bool {
        if state.keep || state.invalid || state.active_pods > 0 {
            return false;
        }
        if state.expires.is_some_and(|e| e <= at) || self.created + seconds(MAX_AGE) <= at {
            return true;
        }
        match self.relative(state) {
            Relative::Never => false,
            Relative::Now => true,
            Relative::At(due) => due <= at,
        }
    }

    /// The first moment from `at` on when the claim is deletable if nothing changes.
    pub fn next_due(&self, state: &State, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if state.keep || state.invalid || state.active_pods > 0 {
            return None;
        }
        let mut due = vec![self.created + seconds(MAX_AGE)];
        due.extend(state.expires);
        match self.relative(state) {
            Relative::Never => {}
            Relative::Now => due.push(at),
            Relative::At(t) => due.push(t),
        }
        due.into_iter().min().map(|t| t.max(at))
    }

    /// The owner-dependent deadline.
    fn relative(&self, state: &State) -> Relative {
        let ttl = seconds(state.ttl.unwrap_or(TTL));
        let owners: Vec<Owner> = [state.job, state.run]
            .into_iter()
            .filter(|o| *o != Owner::Absent)
            .collect();
        if owners.contains(&Owner::Running) {
            return Relative::Never;
        }
        if matches!(self.link, Link::OwnerRef(_)) && state.job == Owner::Absent {
            return Relative::Now;
        }
        let finished = owners.iter().filter_map(|o| match o {
            Owner::Finished(at) => Some(*at),
            _ => None,
        });
        match finished.max() {
            None => Relative::At(self.created + seconds(ORPHAN_GRACE)),
            Some(at) => Relative::At(at + ttl),
        }
    }

    /// The states that may have been in force at `at`: the last one surely applied, and any
    /// whose API call was in flight then.
    pub fn states_at(&self, at: DateTime<Utc>) -> Vec<&Snapshot> {
        let surely = self
            .history
            .iter()
            .rposition(|s| s.after <= at)
            .unwrap_or(0);
        self.history
            .iter()
            .enumerate()
            .filter(|(i, s)| *i == surely || (*i > surely && s.before <= at))
            .map(|(_, s)| s)
            .collect()
    }

    /// Since when the claim has been deletable without a break, as of `at`; None if it is not.
    pub fn deletable_since(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let states = self.states_at(at);
        let last = states.last()?;
        if !self.deletable(&last.state, at) {
            return None;
        }
        // The earliest moment this state made it deletable (its own deadline, or its start).
        let due = self.next_due(&last.state, last.before)?;
        let mut since = due.max(last.before);
        // Earlier states may have made it deletable already, back to the last that did not.
        for snapshot in self
            .history
            .iter()
            .rev()
            .skip_while(|s| s.before > last.before)
            .skip(1)
        {
            match self.next_due(&snapshot.state, snapshot.before) {
                Some(due) if due <= since => since = due.max(snapshot.before),
                _ => break,
            }
        }
        Some(since)
    }
}

enum Relative {
    Never,
    Now,
    At(DateTime<Utc>),
}

#[derive(Debug, Clone)]
pub struct Build {
    pub namespace: String,
    pub job: String,
    pub uid: String,
    /// `Absent` for builds whose claim names the job by reference (no run).
    pub run: Owner,
    pub state: Owner,
}

#[derive(Debug, Clone)]
pub struct PodModel {
    pub namespace: String,
    pub claim: String,
    pub active: bool,
    pub scheduled: bool,
}

#[derive(Default)]
pub struct World {
    pub builds: BTreeMap<(String, String), Build>,
    pub incarnations: Vec<Incarnation>,
    pub current: HashMap<(String, String), usize>,
    pub pods: BTreeMap<String, PodModel>,
    pub serial: u64,
    pub actions: BTreeMap<&'static str, u64>,
    pub failures: u64,
}

impl World {
    fn state_of(&self, namespace: &str, name: &str) -> Option<State> {
        let index = *self.current.get(&(namespace.into(), name.into()))?;
        let inc = &self.incarnations[index];
        let build = |job: &str| self.builds.get(&(namespace.to_owned(), job.to_owned()));
        let (job, run) = match &inc.link {
            Link::Naming(job) => {
                build(job).map_or((Owner::Absent, Owner::Absent), |b| (b.state, b.run))
            }
            Link::OwnerRef(job) => (build(job).map_or(Owner::Absent, |b| b.state), Owner::Absent),
            Link::Orphan => (Owner::Absent, Owner::Absent),
        };
        Some(State {
            keep: inc.annotations.keep,
            invalid: inc.annotations.invalid,
            ttl: inc.annotations.ttl,
            expires: inc.annotations.expires,
            active_pods: self
                .pods
                .values()
                .filter(|p| p.active && p.namespace == namespace && p.claim == name)
                .count(),
            job,
            run,
        })
    }

    /// Appends the current state of the named claims' incarnations, made by a call that
    /// started at `before`.
    pub fn record(&mut self, namespace: &str, names: &[String], before: DateTime<Utc>) {
        let after = now();
        for name in names {
            if let Some(state) = self.state_of(namespace, name) {
                let index = self.current[&(namespace.to_owned(), name.clone())];
                self.incarnations[index].history.push(Snapshot {
                    before,
                    after,
                    state,
                });
            }
        }
    }

    /// The claims a build's changes affect.
    pub fn claims_of(&self, build: &Build) -> Vec<String> {
        self.current
            .keys()
            .filter(|(ns, _)| *ns == build.namespace)
            .filter(|key| {
                let inc = &self.incarnations[self.current[*key]];
                matches!(&inc.link, Link::Naming(j) | Link::OwnerRef(j) if *j == build.job)
            })
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// Live incarnations (as far as the driver knows) whose state satisfies `f`, as indices.
    pub fn live(&self, f: impl Fn(&Incarnation, &State) -> bool) -> Vec<usize> {
        self.current
            .values()
            .copied()
            .filter(|&i| {
                let inc = &self.incarnations[i];
                !inc.gone
                    && !inc.tainted
                    && self
                        .state_of(&inc.namespace, &inc.name)
                        .is_some_and(|state| f(inc, &state))
            })
            .collect()
    }

    /// Claims a protection may be added to: not due, and not for [`MARGIN`].
    pub fn protectable(&self) -> Vec<usize> {
        let horizon = now() + seconds(MARGIN);
        self.live(|inc, state| inc.next_due(state, now()).is_none_or(|due| due > horizon))
    }

    /// Whether the driver may delete a build's job, then its run. That takes a young claim that
    /// its finished build made due to an orphan within its grace, not due: a protection like
    /// any other, so it is only made where the claim is not due for [`MARGIN`], or where the
    /// claim stays due through both deletions.
    pub fn owners_deletable(&self, build: &Build) -> bool {
        let at = now();
        let horizon = at + seconds(MARGIN);
        self.claims_of(build).iter().all(|name| {
            let inc = &self.incarnations[self.current[&(build.namespace.clone(), name.clone())]];
            let Some(state) = self.state_of(&build.namespace, name) else {
                return true;
            };
            if inc.next_due(&state, at).is_none_or(|due| due > horizon) {
                return true;
            }
            let job_gone = State {
                job: Owner::Absent,
                ..state.clone()
            };
            let both_gone = State {
                run: Owner::Absent,
                ..job_gone.clone()
            };
            [job_gone, both_gone]
                .iter()
                .all(|after| inc.next_due(after, at).is_some_and(|due| due <= at))
        })
    }

    pub fn count(&mut self, action: &'static str) {
        *self.actions.entry(action).or_default() += 1;
    }
}
