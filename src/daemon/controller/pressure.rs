//! Quota pressure's bookkeeping: the rounds per namespace, observed as quotas and claims change,
//! recovered from the Lease, and the plan that says which finished claims within their TTL
//! may go early. The pure `decide::quota` decides; [`Pressure`] keeps the rounds under one
//! lock and returns the claims to wake and what to tell, which the controller does.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tracing::warn;

use chrono::{DateTime, Utc};

use crate::cluster::cache::Index;
use crate::cluster::ports::{Clock, Cluster};
use crate::config::Config;
use crate::decide::facts::{ClaimFacts, Facts, ObjectKey};
use crate::decide::linking::Found;
use crate::decide::policy::{Policy, Verdict};
use crate::decide::quota::{self, Deleting, LiveQuotas, Present, Rounds, Waters};

use super::Controller;

/// Quota pressure's thresholds and its rounds.
pub(super) struct Pressure {
    /// `None` when quota pressure is disabled.
    waters: Option<Waters>,
    rounds: Mutex<Rounds>,
}

/// What a plan is judged at: the deadlines' clock, the API server's (the rounds' doubt is
/// dated by it), and whether this replica leads (only the leader plans deletes).
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) now: DateTime<Utc>,
    pub(super) server: DateTime<Utc>,
    pub(super) leading: bool,
}

/// What a namespace's plan says for one of its claims.
#[derive(Debug, Default)]
pub(super) struct Taken {
    /// The plan takes this claim.
    pub(super) taken: bool,
    /// The claims to reconcile at once: the plan's, when it does not take this one (a change to
    /// it, a build re-run binding it, may have passed its place to one nothing else would
    /// wake); none when it does, so that two failing deletes cannot wake each other in a loop.
    pub(super) wake: Vec<ObjectKey>,
    /// Pressure that remains with nothing more to delete, told once a round.
    pub(super) unrelieved: Option<quota::Pressure>,
    /// How many claims the plan takes.
    pub(super) deleting: usize,
}

impl Pressure {
    pub(super) fn new(config: &Config) -> Self {
        Pressure {
            waters: config.quota.waters(),
            rounds: Mutex::default(),
        }
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Quota pressure's thresholds; `None` when it is disabled.
    pub(super) fn waters(&self) -> Option<Waters> {
        self.waters
    }

    /// Counts a delete about to be sent in its namespace's round; the rounds, for the fence to
    /// write to the Lease in the same patch as the ledger, before the DELETE: a replica that
    /// takes over resumes the round instead of starting a fresh one. `None` when disabled.
    pub(super) fn record(&self, claim: &ClaimFacts) -> Option<String> {
        self.waters?;
        let mut rounds = self.rounds();
        rounds.record(Deleting::of(claim));
        Some(rounds.to_annotation())
    }

    /// Forgets a delete that freed nothing.
    pub(super) fn withdraw(&self, key: &ObjectKey, uid: &str) {
        self.rounds().withdraw(key, uid);
    }

    /// A pressure delete's live re-check (see `quota::Rounds::takes_live`).
    pub(super) fn takes_live(&self, live: &LiveQuotas, facts: &Facts, verdict: Verdict) -> bool {
        self.rounds().takes_live(live, facts, verdict)
    }

    /// Takes over the rounds found on the Lease just won, then takes in every namespace with
    /// quotas; the claims to wake. What cannot be read holds pressure deletes back for a while
    /// (see `quota::Rounds::recover`), told once.
    pub(super) fn recover(
        &self,
        found: Option<&str>,
        index: &Index,
        at: At,
        policy_in: impl Fn(&str) -> Policy,
    ) -> Vec<ObjectKey> {
        let Some(waters) = self.waters else {
            return Vec::new();
        };
        if let Err(error) = self.rounds().recover(found, at.server) {
            warn!(%error, doubt = %humantime::format_duration(quota::DOUBT.to_std().unwrap_or_default()), "the quota pressure rounds on the Lease cannot be trusted; no pressure deletes in a namespace until its quotas are seen to recount, or for the doubt period");
        }
        (index.quota_namespaces().iter())
            .flat_map(|namespace| self.observe_round(index, namespace, waters, at, &policy_in))
            .collect()
    }

    /// Takes in a namespace's quotas after a change to them or a claim leaving; the claims to
    /// wake.
    pub(super) fn observe(
        &self,
        index: &Index,
        namespace: &str,
        at: At,
        policy_in: impl Fn(&str) -> Policy,
    ) -> Vec<ObjectKey> {
        match self.waters {
            Some(waters) => self.observe_round(index, namespace, waters, at, &policy_in),
            None => Vec::new(),
        }
    }

    /// A round's bookkeeping for one namespace. A claim that left or a recount may raise the
    /// projection (what was subtracted twice no longer is), so the plan's claims are woken.
    fn observe_round(
        &self,
        index: &Index,
        namespace: &str,
        waters: Waters,
        at: At,
        policy_in: &impl Fn(&str) -> Policy,
    ) -> Vec<ObjectKey> {
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return Vec::new();
        };
        let mut rounds = self.rounds();
        // Asked at every claim's deletion: the namespace's claims are gathered only when a
        // round is open or about to be.
        if !rounds.observes(namespace, &quotas, waters) {
            return Vec::new();
        }
        let present: Vec<Present> = index.claims_in(namespace).map(Present::of).collect();
        rounds.observe(namespace, &quotas, &present, waters);
        if rounds.round(namespace).is_none() || !at.leading {
            return Vec::new();
        }
        let claims = quota::Candidate::all_of(
            index.claims_in(namespace),
            index,
            &policy_in(namespace),
            at.now,
        );
        rounds
            .plan(namespace, &quotas, &claims, waters, at.server)
            .victims
    }

    /// Under quota pressure, as the leader, the namespace's plan for one of its claims, from
    /// the cache, under one hold of the rounds. Nothing without pressure.
    pub(super) fn plan(
        &self,
        index: &Index,
        key: &ObjectKey,
        at: At,
        policy_in: impl Fn(&str) -> Policy,
    ) -> Taken {
        let Some(waters) = self.waters.filter(|_| at.leading) else {
            return Taken::default();
        };
        let namespace = &*key.namespace;
        let Found::Yes(quotas) = index.quotas_in(namespace) else {
            return Taken::default();
        };
        let mut rounds = self.rounds();
        // Asked at every reconcile: deciding each claim of the namespace only under pressure
        // keeps a reconcile's cost off the namespace's size.
        if !rounds.pressed(namespace, &quotas, waters) {
            return Taken::default();
        }
        let claims = quota::Candidate::all_of(
            index.claims_in(namespace),
            index,
            &policy_in(namespace),
            at.now,
        );
        let plan = rounds.plan(namespace, &quotas, &claims, waters, at.server);
        if plan.pressed.is_empty() {
            return Taken::default();
        }
        let unrelieved =
            (plan.unrelieved.into_iter().next()).filter(|_| rounds.first_warning(namespace));
        let taken = plan.victims.contains(key);
        let deleting = plan.victims.len();
        Taken {
            taken,
            wake: if taken { Vec::new() } else { plan.victims },
            unrelieved,
            deleting,
        }
    }
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// What plans are judged at now.
    fn plan_at(&self) -> At {
        At {
            now: self.clock.now(),
            server: self.clock.server().0,
            leading: self.is_leader(),
        }
    }

    /// Takes over the pressure rounds found on the Lease just won, and wakes the claims their
    /// plans take.
    pub(super) fn recover_rounds(&self) {
        let found = self.cluster.found_rounds();
        let index = self.cache.read();
        let wake = self
            .deletes
            .pressure
            .recover(found.as_deref(), &index, self.plan_at(), |ns| {
                self.cache.policy_in(&index, ns)
            });
        drop(index);
        self.wake(wake);
    }

    /// Takes in a namespace's quotas (every namespace with quotas, for `None`) after a change
    /// to them or a claim leaving: their metrics, and the pressure round's bookkeeping.
    pub(super) fn observe_quotas(&self, index: &Index, namespace: Option<String>) {
        let namespaces = match namespace {
            Some(namespace) => BTreeSet::from([namespace]),
            None => &index.quota_namespaces() | &self.metrics.quota_namespaces(),
        };
        let at = self.plan_at();
        for namespace in namespaces {
            let Found::Yes(quotas) = index.quotas_in(&namespace) else {
                continue;
            };
            self.metrics.quota_ratios(&namespace, &quotas);
            let wake = (self.deletes.pressure)
                .observe(index, &namespace, at, |ns| self.cache.policy_in(index, ns));
            self.wake(wake);
        }
    }

    /// Under quota pressure, as the leader, acts on the namespace's plan: warns and writes an
    /// event once a round when nothing more may be deleted, wakes the plan's claims when it
    /// does not take this one, and says whether it does.
    pub(super) async fn apply_quota_plan(&self, key: &ObjectKey) -> bool {
        let Taken {
            taken,
            wake,
            unrelieved,
            deleting,
        } = {
            let index = self.cache.read();
            (self.deletes.pressure).plan(&index, key, self.plan_at(), |ns| {
                self.cache.policy_in(&index, ns)
            })
        };
        if let Some(worst) = unrelieved {
            warn!(
                namespace = %key.namespace,
                quota = %worst.quota.name,
                resource = %worst.resource,
                ratio = worst.ratio(),
                deleting,
                "quota pressure remains and no more finished workspaces may be deleted"
            );
            self.cluster.notify_quota_pressure(&worst).await;
        }
        self.wake(wake);
        taken
    }
}
