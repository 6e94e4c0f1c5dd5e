//! Quota pressure's bookkeeping: the rounds per namespace, observed as quotas and claims change,
//! recovered from the Lease, and the plan that says which finished claims within their TTL
//! may go early (the pure `decide::quota` decides; this keeps its state and wakes its claims).

use std::collections::BTreeSet;
use std::sync::Mutex;

use tracing::warn;

use crate::cluster::cache::Index;
use crate::cluster::ports::{Clock, Cluster};
use crate::config::Config;
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::Found;
use crate::decide::quota::{self, Deleting, Plan, Present, Rounds, Waters};

use super::Controller;

/// Quota pressure's thresholds and its rounds.
pub(super) struct Pressure {
    /// `None` when quota pressure is disabled.
    waters: Option<Waters>,
    rounds: Mutex<Rounds>,
}

impl Pressure {
    pub(super) fn new(config: &Config) -> Self {
        Pressure {
            waters: config.quota.waters(),
            rounds: Mutex::default(),
        }
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    pub(super) fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.pressure
            .rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a delete about to be sent in its namespace's round, and hands the rounds to the
    /// fence, which writes them to the Lease in the same patch as the ledger, before the
    /// DELETE: a replica that takes over resumes the round instead of starting a fresh one.
    pub(super) fn record_round(&self, claim: &ClaimFacts) {
        if self.pressure.waters.is_none() {
            return;
        }
        let mut rounds = self.rounds();
        rounds.record(Deleting::of(claim));
        self.cluster.stage_rounds(rounds.to_annotation());
    }

    /// Takes over the pressure rounds found on the Lease just won. What cannot be read holds
    /// pressure deletes back for a while (see `quota::Rounds::recover`).
    pub(super) fn recover_rounds(&self) {
        let Some(waters) = self.pressure.waters else {
            return;
        };
        let found = self.cluster.found_rounds();
        if let Err(error) = self
            .rounds()
            .recover(found.as_deref(), self.clock.server().0)
        {
            warn!(%error, doubt = %humantime::format_duration(quota::DOUBT.to_std().unwrap_or_default()), "the quota pressure rounds on the Lease cannot be trusted; no pressure deletes in a namespace until its quotas are seen to recount, or for the doubt period");
        }
        let index = self.read_index();
        for namespace in index.quota_namespaces() {
            self.observe_round(&index, &namespace, waters);
        }
    }

    /// Takes in a namespace's quotas (every namespace with quotas, for `None`) after a change
    /// to them or a claim leaving: their metrics, and the pressure round's bookkeeping.
    pub(super) fn observe_quotas(&self, index: &Index, namespace: Option<String>) {
        let namespaces = match namespace {
            Some(namespace) => BTreeSet::from([namespace]),
            None => &index.quota_namespaces() | &self.metrics.quota_namespaces(),
        };
        for namespace in namespaces {
            let Found::Yes(quotas) = index.quotas_in(&namespace) else {
                continue;
            };
            self.metrics.quota_ratios(&namespace, &quotas);
            if let Some(waters) = self.pressure.waters {
                self.observe_round(index, &namespace, waters);
            }
        }
    }

    /// A round's bookkeeping for one namespace. A claim that left or a recount may raise the
    /// projection (what was subtracted twice no longer is), so the plan's claims are woken.
    fn observe_round(&self, index: &Index, namespace: &str, waters: Waters) {
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return;
        };
        let mut rounds = self.rounds();
        // Asked at every claim's deletion: the namespace's claims are gathered only when a
        // round is open or about to be.
        if !rounds.observes(namespace, &quotas, waters) {
            return;
        }
        let present: Vec<Present> = index.claims_in(namespace).map(Present::of).collect();
        rounds.observe(namespace, &quotas, &present, waters);
        if rounds.round(namespace).is_none() || !self.is_leader() {
            return;
        }
        let claims = quota::Candidate::all_of(
            index.claims_in(namespace),
            index,
            &self.policy_in(index, namespace),
            self.clock.now(),
        );
        let plan = rounds.plan(namespace, &quotas, &claims, waters, self.clock.server().0);
        drop(rounds);
        for victim in plan.victims {
            self.schedule.now(victim);
        }
    }

    /// The quota plan of a namespace from the cache; `None` without pressure.
    fn plan_cached(&self, namespace: &str, waters: Waters) -> Option<Plan> {
        let index = self.read_index();
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return None;
        };
        // Asked at every reconcile: deciding each claim of the namespace only under pressure
        // keeps a reconcile's cost off the namespace's size.
        if !self.rounds().pressed(namespace, &quotas, waters) {
            return None;
        }
        let claims = quota::Candidate::all_of(
            index.claims_in(namespace),
            &*index,
            &self.policy_in(&index, namespace),
            self.clock.now(),
        );
        let plan = (self.rounds()).plan(namespace, &quotas, &claims, waters, self.clock.server().0);
        (!plan.pressed.is_empty()).then_some(plan)
    }

    /// Under quota pressure, as the leader, acts on the namespace's plan: warns and writes an
    /// event once a round when nothing more may be deleted, and says whether the plan takes
    /// this claim. A claim the plan does not take asks
    /// for the plan's claims to be reconciled: a change to it (a build re-run binding it) may
    /// have passed its place to one nothing else would wake. A claim the plan takes does not,
    /// so two failing deletes cannot wake each other in a loop.
    pub(super) async fn apply_quota_plan(&self, key: &ObjectKey) -> bool {
        let Some(waters) = self.pressure.waters.filter(|_| self.is_leader()) else {
            return false;
        };
        let Some(plan) = self.plan_cached(&key.namespace, waters) else {
            return false;
        };
        let unrelieved =
            (plan.unrelieved.first()).filter(|_| self.rounds().first_warning(&key.namespace));
        if let Some(worst) = unrelieved {
            warn!(
                namespace = %key.namespace,
                quota = %worst.quota.name,
                resource = %worst.resource,
                ratio = worst.ratio(),
                deleting = plan.victims.len(),
                "quota pressure remains and no more finished workspaces may be deleted"
            );
            self.cluster.notify_quota_pressure(worst).await;
        }
        let taken = plan.victims.contains(key);
        if !taken {
            for victim in plan.victims {
                self.schedule.now(victim);
            }
        }
        taken
    }

    /// Quota pressure's thresholds; `None` when it is disabled.
    pub(super) fn pressure_waters(&self) -> Option<Waters> {
        self.pressure.waters
    }
}
