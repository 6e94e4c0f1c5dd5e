//! The DELETEs that may still land: one registry, with explicit states and pure transitions
//! (RELIABILITY.md, "A late DELETE"). A DELETE is named on the Lease before it is sent; once
//! sent it is answered (success, or a definite refusal), or unanswered; an unanswered one, and
//! one the Lease named when this replica won it, is revoked before anything else is decided
//! for its claim; a revocation says it was revoked (it can never land) or landed.
//!
//! A DELETE's life, each arrow one event, and the slot of the blast-radius cap it holds on
//! the way: the diagram in ARCHITECTURE.md, "A DELETE's life". An owed DELETE (`Unanswered`,
//! `Found`) counts against the cap from the moment a term recovers until its revocation proves
//! it dead, whoever sent it and however many terms that takes.
//!
//! What the Lease names is a view of the registry ([`Registry::on_lease`]): `Sending`,
//! `Unanswered` and `Found`. The elector writes that view with every Lease write, and that is
//! the one place it is persisted. Winning the Lease adds what it named as `Found`; losing it
//! changes nothing here, since the Lease still names them and whoever leads revokes them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::linking::Found;
use crate::observe::metrics::Unresolved;

/// A claim DELETE that may still reach the API server: the claim it named, with the
/// preconditions it carried. Revoked by changing the claim (`Writer::revoke`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

impl InFlight {
    /// The DELETE of `claim` as it was decided: its UID and resourceVersion are the DELETE's
    /// preconditions.
    pub fn of(claim: &ClaimFacts) -> Self {
        Self {
            namespace: claim.key.namespace.to_string(),
            name: claim.key.name.clone(),
            uid: claim.uid.clone(),
            resource_version: claim.resource_version.clone(),
        }
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// The most the Lease's `deletes-in-flight` annotation may take, in bytes: a quarter of the
/// 256 KiB the API server allows for all of an object's annotations, beside the bucketed
/// ledger and the rounds, so no write of the Lease (a renewal included) is ever refused for
/// what DELETEs added. Past it, a DELETE is not sent (its claim retries after its backoff)
/// until earlier ones are answered or revoked (issue 46, class 5).
pub const BUDGET: usize = 64 * 1024;

/// The annotation text for `entries`; `None` (the key removed) when there are none.
pub fn to_text(entries: &BTreeMap<String, InFlight>) -> Option<String> {
    if entries.is_empty() {
        return None;
    }
    let list: Vec<&InFlight> = entries.values().collect();
    serde_json::to_string(&list).ok()
}

/// The entries an annotation names, by claim UID; `Err` when it is not a list of them.
pub fn parse(text: &str) -> Result<BTreeMap<String, InFlight>, serde_json::Error> {
    let list: Vec<InFlight> = serde_json::from_str(text)?;
    Ok(list.into_iter().map(|e| (e.uid.clone(), e)).collect())
}

/// Where a DELETE stands. `S` is the blast-radius cap's slot an owed one holds while it may
/// land: `None` until the cap's count is known (a term recovered), then one counted in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State<S> {
    /// Named on the Lease for a DELETE about to be sent, or sent and not answered yet.
    /// `before`: what stood before, restored if it is not sent after all.
    Sending { before: Option<Box<State<S>>> },
    /// Sent without a definite answer: it may still land. Its slot of the cap stays taken
    /// until a revocation proves it never can.
    Unanswered { slot: Option<S> },
    /// Named on the Lease when this replica won it: sent by whoever led before, maybe still
    /// held somewhere on its way. It holds a slot of the cap from the term's recovery on, as
    /// an unanswered one does.
    Found { slot: Option<S> },
    /// Answered with success, or its revocation found it carried out: off the Lease, but the
    /// claim is read live before anything is sent for it until the watch shows it gone.
    Answered,
}

impl<S> State<S> {
    /// Whether the Lease names it: it may still land.
    fn named(&self) -> bool {
        !matches!(self, State::Answered)
    }

    /// Whether it must be revoked before anything else is decided for its claim.
    fn owed(&self) -> bool {
        matches!(self, State::Unanswered { .. } | State::Found { .. })
    }

    /// The slot of the cap an owed DELETE holds.
    fn slot(&mut self) -> Option<&mut Option<S>> {
        match self {
            State::Unanswered { slot } | State::Found { slot } => Some(slot),
            State::Sending { .. } | State::Answered => None,
        }
    }

    /// Where it stands if it is neither answered nor revoked.
    fn unresolved(&self) -> Option<Unresolved> {
        match self {
            State::Sending { .. } => Some(Unresolved::Sending),
            State::Unanswered { .. } => Some(Unresolved::Unanswered),
            State::Found { .. } => Some(Unresolved::Found),
            State::Answered => None,
        }
    }
}

/// What a revocation of a DELETE without a definite answer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// The claim changed (the answer's resourceVersion is not the DELETE's precondition): the
    /// DELETE fails its precondition whenever it arrives.
    Revoked,
    /// The claim is gone or being deleted: the DELETE, or someone else's, was carried out.
    Landed,
    /// Refused (the claim re-created under the name, a guard, RBAC): what it means is read.
    Refused,
    /// No definite answer, no write that changed the claim, or this replica may not write:
    /// the DELETE may still land.
    Unanswered,
}

/// Whether claim `uid` is gone, re-created under its name, or being deleted, as a live read of
/// its name found it (`state`: its UID, and whether it is being deleted); `None` when the read
/// could not tell. A DELETE of `uid` can no longer land on it when it is.
pub fn gone(state: &Found<(String, bool)>, uid: &str) -> Option<bool> {
    match state {
        Found::Yes((found, being_deleted)) => Some(*being_deleted || found != uid),
        Found::No => Some(true),
        Found::Unknown(_) => None,
    }
}

/// How a DELETE that was named ended its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Answered with success: carried out.
    Carried,
    /// Answered for certain without being carried out (refused, conflict, already gone), or
    /// never sent: it can no longer land.
    Settled,
    /// No definite answer: it may still land.
    Unanswered,
}

/// Why a DELETE may not be named, and so is not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotNamed {
    #[error(
        "the lease names as many DELETEs in flight as it can hold; this one waits until earlier ones are answered"
    )]
    Full,
    #[error("an earlier DELETE of this claim may still land and is not revoked yet")]
    Owed,
}

#[derive(Debug, Clone)]
struct Entry<S> {
    delete: InFlight,
    state: State<S>,
}

/// Every DELETE that may still land, and every one carried out whose claim the watch has not
/// shown gone, by claim UID.
#[derive(Debug)]
pub struct Registry<S> {
    entries: BTreeMap<String, Entry<S>>,
    budget: usize,
}

impl<S> Default for Registry<S> {
    fn default() -> Self {
        Self::with_budget(BUDGET)
    }
}

impl<S> Registry<S> {
    pub fn with_budget(budget: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            budget,
        }
    }

    /// What the Lease must name: every DELETE that may still land.
    pub fn on_lease(&self) -> BTreeMap<String, InFlight> {
        (self.entries.iter())
            .filter(|(_, entry)| entry.state.named())
            .map(|(uid, entry)| (uid.clone(), entry.delete.clone()))
            .collect()
    }

    /// Names `delete` before it is sent; nothing changes when it may not be.
    pub fn name(&mut self, delete: &InFlight) -> Result<(), NotNamed> {
        // Never one past a DELETE of the same claim that may still land (the controller
        // revokes that first): a second could land where the first's revocation meant to stop it.
        if self.owed(&delete.key()).is_some() {
            return Err(NotNamed::Owed);
        }
        let mut named = self.on_lease();
        if named.insert(delete.uid.clone(), delete.clone()).is_none()
            && to_text(&named).is_none_or(|text| text.len() > self.budget)
        {
            return Err(NotNamed::Full);
        }
        let before = (self.entries.remove(&delete.uid)).map(|entry| Box::new(entry.state));
        let state = State::Sending { before };
        let delete = delete.clone();
        self.entries
            .insert(delete.uid.clone(), Entry { delete, state });
        Ok(())
    }

    /// The DELETE of `delete` ended its request as `sent`; `slot` is the cap's slot it holds,
    /// kept while it may land. One never named (a replica without the Lease) is registered
    /// as it ended.
    pub fn sent(&mut self, delete: &InFlight, sent: Sent, slot: Option<S>) {
        let state = match sent {
            Sent::Carried => State::Answered,
            Sent::Unanswered => State::Unanswered { slot },
            Sent::Settled => {
                // Only a DELETE named for sending ends here; what stood before it comes back.
                let Some(entry) = self.entries.get_mut(&delete.uid) else {
                    return;
                };
                let State::Sending { before } = &mut entry.state else {
                    return;
                };
                match before.take() {
                    Some(before) => entry.state = *before,
                    None => {
                        self.entries.remove(&delete.uid);
                    }
                }
                return;
            }
        };
        let delete = delete.clone();
        self.entries
            .insert(delete.uid.clone(), Entry { delete, state });
    }

    /// The DELETE owed a revocation for claim `key`, if one is: it is revoked before anything
    /// else is decided for the claim.
    pub fn owed(&self, key: &ObjectKey) -> Option<InFlight> {
        (self.entries.values())
            .find(|entry| entry.state.owed() && entry.delete.key() == *key)
            .map(|entry| entry.delete.clone())
    }

    /// The revocation of `delete` said `revoked`. The slot to free when it can never land.
    pub fn revoked(&mut self, delete: &InFlight, revoked: Revocation) -> Option<S> {
        let entry = self.entries.get_mut(&delete.uid)?;
        if !entry.state.owed() {
            return None;
        }
        match revoked {
            // Neither is known yet: it is revoked again.
            Revocation::Refused | Revocation::Unanswered => None,
            Revocation::Landed => {
                entry.state = State::Answered;
                None
            }
            Revocation::Revoked => self.entries.remove(&delete.uid)?.state.slot()?.take(),
        }
    }

    /// The revocation of `delete` said nothing certain: it may land from now on, and its slot
    /// is counted again by `recount` (from now: while it may land, it stays in the cap's
    /// window).
    pub fn unrevoked(&mut self, delete: &InFlight, recount: impl FnOnce(S) -> S) {
        let slot = (self.entries.get_mut(&delete.uid)).and_then(|entry| entry.state.slot());
        if let Some(slot) = slot {
            *slot = slot.take().map(recount);
        }
    }

    /// The cap's count was recovered (a term began): each DELETE owed a revocation, found on
    /// the Lease or this replica's own, counts in it from now, its slot of an earlier term
    /// replaced by what `hold` gives (`None`: the count is not known).
    pub fn recovered(&mut self, mut hold: impl FnMut(Option<S>) -> Option<S>) {
        for entry in self.entries.values_mut() {
            if let Some(slot) = entry.state.slot() {
                *slot = hold(slot.take());
            }
        }
    }

    /// Whether this claim's DELETE (the claim `key` with `uid`) was carried out, and the watch
    /// has not shown the claim gone since.
    pub fn carried(&self, key: &ObjectKey, uid: &str) -> bool {
        self.entries.get(uid).is_some_and(|entry| {
            matches!(entry.state, State::Answered) && entry.delete.key() == *key
        })
    }

    /// Claim `key` was seen gone, re-created or being deleted, by the watch or a live read:
    /// what was carried out for it needs no live read any more. One that may still land stays.
    pub fn seen_gone(&mut self, key: &ObjectKey) {
        (self.entries).retain(|_, entry| {
            !matches!(entry.state, State::Answered) || entry.delete.key() != *key
        });
    }

    /// This replica won the Lease, which named `found`: each is owed a revocation (kept as it
    /// stands if already known). Those of an earlier holding stay: a revocation too many is
    /// one PATCH; one too few may let a DELETE land.
    pub fn won(&mut self, found: BTreeMap<String, InFlight>) {
        for (uid, delete) in found {
            let entry = self.entries.entry(uid).or_insert(Entry {
                delete: delete.clone(),
                state: State::Found { slot: None },
            });
            if matches!(entry.state, State::Answered) {
                // Carried out by this replica, but named again by whoever led since: it
                // is revoked, which finds it landed.
                *entry = Entry {
                    delete,
                    state: State::Found { slot: None },
                };
            }
        }
    }

    /// How many DELETEs stand in each state that is neither answered nor revoked: a count for
    /// the metrics, which changes nothing.
    pub fn unresolved(&self) -> [(Unresolved, usize); 3] {
        Unresolved::ALL.map(|state| {
            let count = (self.entries.values())
                .filter(|entry| entry.state.unresolved() == Some(state))
                .count();
            (state, count)
        })
    }

    /// The claims owed a revocation: each is reconciled on winning the Lease, whether or not
    /// the cache still shows it.
    pub fn owed_keys(&self) -> Vec<ObjectKey> {
        (self.entries.values())
            .filter(|entry| entry.state.owed())
            .map(|entry| entry.delete.key())
            .collect()
    }
}

/// The registry as the elector sees it: what to write on the Lease, and the transitions a
/// Lease write drives. Object safe, so the election needs no slot type.
pub trait LeaseNames: Send + Sync {
    /// What the Lease must name now.
    fn on_lease(&self) -> BTreeMap<String, InFlight>;
    /// Names `delete` before the write that carries it.
    fn name(&self, delete: &InFlight) -> Result<(), NotNamed>;
    /// The write that was to carry `delete` failed: it is not sent.
    fn not_named(&self, delete: &InFlight);
    /// The Lease just won named `found`.
    fn won(&self, found: BTreeMap<String, InFlight>);
}

/// The registry shared by the controller and the elector.
pub type Shared<S> = Mutex<Registry<S>>;

fn lock<S>(shared: &Shared<S>) -> std::sync::MutexGuard<'_, Registry<S>> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`Registry::unresolved`] of the shared registry, for whoever samples the metrics: the lock
/// is held for the count alone.
pub fn unresolved<S>(shared: &Shared<S>) -> [(Unresolved, usize); 3] {
    lock(shared).unresolved()
}

impl<S: Send> LeaseNames for Shared<S> {
    fn on_lease(&self) -> BTreeMap<String, InFlight> {
        lock(self).on_lease()
    }

    fn name(&self, delete: &InFlight) -> Result<(), NotNamed> {
        lock(self).name(delete)
    }

    fn not_named(&self, delete: &InFlight) {
        lock(self).sent(delete, Sent::Settled, None);
    }

    fn won(&self, found: BTreeMap<String, InFlight>) {
        lock(self).won(found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delete(i: usize) -> InFlight {
        InFlight {
            namespace: "a-namespace-of-a-realistic-length".into(),
            name: format!("job-{i:05}-with-a-realistic-name-build-workspace"),
            uid: format!("0b6f7c2e-5d1a-4a8b-9c3e-{i:012}"),
            resource_version: format!("{}", 1_000_000 + i),
        }
    }

    /// However many DELETEs stay unanswered, what the Lease names stays within its budget: a
    /// new one is refused past it, one already named always fits again.
    #[test]
    fn what_the_lease_names_stays_within_its_budget() {
        let mut registry = Registry::<()>::default();
        let mut named = 0;
        while registry.name(&delete(named)).is_ok() {
            registry.sent(&delete(named), Sent::Unanswered, None);
            named += 1;
        }
        let text = to_text(&registry.on_lease()).expect("named");
        assert!(text.len() <= BUDGET, "{} bytes", text.len());
        assert!(named > 100, "only {named} fit");
        assert_eq!(registry.name(&delete(named)), Err(NotNamed::Full));
        assert!(registry.owed(&delete(named).key()).is_none(), "refused");
        // Revoked, one leaves room for another.
        registry.revoked(&delete(0), Revocation::Revoked);
        assert_eq!(registry.name(&delete(named)), Ok(()));
    }

    #[test]
    fn the_deletes_in_flight_read_back_as_written_and_garbage_names_none() {
        let one = InFlight {
            namespace: "ml".into(),
            name: "nb-build-workspace".into(),
            uid: "u1".into(),
            resource_version: "42".into(),
        };
        let named = BTreeMap::from([(one.uid.clone(), one)]);
        let text = to_text(&named).expect("one named");
        assert_eq!(
            text,
            r#"[{"namespace":"ml","name":"nb-build-workspace","uid":"u1","resourceVersion":"42"}]"#,
            "the format every version reads"
        );
        assert_eq!(parse(&text).ok(), Some(named));
        assert_eq!(to_text(&BTreeMap::new()), None, "none: the key goes");
        for garbage in ["", "{}", "[{\"uid\": 1}]", "[1]", "not json"] {
            assert!(parse(garbage).is_err(), "{garbage}");
        }
    }

    /// Every path of the diagram above, and what the Lease names along it.
    #[test]
    fn each_delete_is_named_until_it_can_no_longer_land() {
        let mut registry = Registry::<&str>::default();
        let (a, b, c) = (delete(1), delete(2), delete(3));
        for d in [&a, &b, &c] {
            assert_eq!(registry.name(d), Ok(()));
        }
        assert_eq!(registry.on_lease().len(), 3, "named before sent");
        registry.sent(&a, Sent::Carried, Some("a"));
        registry.sent(&b, Sent::Settled, Some("b"));
        registry.sent(&c, Sent::Unanswered, Some("c"));
        assert_eq!(registry.on_lease().keys().collect::<Vec<_>>(), [&c.uid]);
        assert!(
            registry.carried(&a.key(), &a.uid),
            "read live until seen gone"
        );
        assert!(!registry.carried(&a.key(), "another uid"));
        assert_eq!(registry.owed(&c.key()), Some(c.clone()));
        assert_eq!(registry.owed(&a.key()), None);
        let again = InFlight {
            resource_version: "2".into(),
            ..c.clone()
        };
        assert_eq!(registry.name(&again), Err(NotNamed::Owed), "not past it");

        assert_eq!(registry.revoked(&c, Revocation::Unanswered), None);
        assert_eq!(registry.owed(&c.key()), Some(c.clone()), "still owed");
        assert_eq!(
            registry.revoked(&c, Revocation::Revoked),
            Some("c"),
            "slot freed"
        );
        assert_eq!(registry.revoked(&c, Revocation::Revoked), None, "once");
        assert!(registry.on_lease().is_empty());

        registry.seen_gone(&a.key());
        assert!(!registry.carried(&a.key(), &a.uid));
    }

    /// The count for the metrics follows each DELETE through its states, and leaves out one
    /// answered: it can no longer land.
    #[test]
    fn the_unresolved_count_follows_each_state_and_leaves_out_the_answered() {
        let mut registry = Registry::<()>::default();
        let count = |registry: &Registry<()>| registry.unresolved().map(|(_, n)| n);
        assert_eq!(count(&registry), [0, 0, 0]);
        let (a, b, c) = (delete(1), delete(2), delete(3));
        for d in [&a, &b] {
            registry.name(d).unwrap();
        }
        registry.won(BTreeMap::from([(c.uid.clone(), c.clone())]));
        assert_eq!(count(&registry), [2, 0, 1], "sending, unanswered, found");
        registry.sent(&a, Sent::Unanswered, None);
        registry.sent(&b, Sent::Carried, None);
        assert_eq!(count(&registry), [0, 1, 1]);
        registry.revoked(&a, Revocation::Revoked);
        registry.revoked(&c, Revocation::Landed);
        assert_eq!(count(&registry), [0, 0, 0], "revoked, or found carried out");
        assert_eq!(
            registry.unresolved().map(|(state, _)| state),
            Unresolved::ALL,
            "each state once"
        );
    }

    /// A DELETE whose Lease write failed, or that was not sent after it, is not named: the
    /// next leader would revoke a claim nobody deleted.
    #[test]
    fn a_delete_not_sent_is_not_named_and_what_stood_before_is_restored() {
        let mut registry = Registry::<()>::default();
        let a = delete(1);
        registry.sent(&a, Sent::Carried, None);
        assert_eq!(registry.name(&a), Ok(()));
        registry.sent(&a, Sent::Settled, None);
        assert!(registry.on_lease().is_empty());
        assert!(registry.carried(&a.key(), &a.uid), "restored");
        // Told twice (the Lease write failed, then the writer said it was not sent): once.
        registry.sent(&a, Sent::Settled, None);
        assert!(registry.carried(&a.key(), &a.uid), "still restored");
        let b = delete(2);
        assert_eq!(registry.name(&b), Ok(()));
        registry.sent(&b, Sent::Settled, None);
        assert_eq!(registry.owed(&b.key()), None);
        assert!(!registry.carried(&b.key(), &b.uid));
    }

    /// Each owed DELETE holds a slot from a recovery on, found ones included; a revocation
    /// without an answer counts it again, and a revoked one gives it back.
    #[test]
    fn owed_deletes_hold_a_slot_from_each_recovery_until_revoked() {
        let mut registry = Registry::<u32>::default();
        let (own, found, carried) = (delete(1), delete(2), delete(3));
        registry.sent(&own, Sent::Unanswered, Some(1));
        registry.sent(&carried, Sent::Carried, None);
        registry.won(BTreeMap::from([(found.uid.clone(), found.clone())]));
        let mut held = Vec::new();
        registry.recovered(|before| {
            held.push(before);
            Some(10)
        });
        assert_eq!(
            held,
            [Some(1), None],
            "the own one's old slot, none for the found one"
        );
        registry.unrevoked(&found, |slot| slot + 1);
        assert_eq!(registry.revoked(&found, Revocation::Revoked), Some(11));
        assert_eq!(registry.revoked(&own, Revocation::Revoked), Some(10));
        assert!(
            registry.carried(&carried.key(), &carried.uid),
            "no slot: untouched"
        );
    }

    /// Winning adds what the Lease named as owed, keeps this replica's own, and a revocation
    /// that finds one landed turns it into one carried out.
    #[test]
    fn winning_the_lease_owes_a_revocation_for_each_delete_it_names() {
        let mut registry = Registry::<&str>::default();
        let (own, found) = (delete(1), delete(2));
        registry.sent(&own, Sent::Unanswered, Some("own"));
        registry.won(BTreeMap::from([(found.uid.clone(), found.clone())]));
        assert_eq!(registry.owed_keys(), [own.key(), found.key()]);
        assert_eq!(registry.owed(&own.key()), Some(own.clone()), "own kept");
        assert_eq!(registry.owed(&found.key()), Some(found.clone()));
        assert_eq!(registry.on_lease().len(), 2);
        assert_eq!(registry.revoked(&found, Revocation::Landed), None);
        assert!(registry.carried(&found.key(), &found.uid));
        assert_eq!(registry.on_lease().len(), 1);
    }
}
