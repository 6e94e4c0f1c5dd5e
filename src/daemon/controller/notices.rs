//! What the daemon tells users as Events and warnings, once each: a deletion coming up
//! (`deletion.notice_before`), namespace settings it does not understand, a labelled claim that
//! is no build workspace, and a flood of those in one namespace.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::writer::{NamespaceNotice, Notice};
use crate::config::Config;
use crate::decide::facts::{ClaimFacts, ObjectKey};
use crate::decide::policy::Reason;

use super::Controller;

/// When a kept claim becomes due and why, with the notice's lead time.
pub(super) type Scheduled = Option<((DateTime<Utc>, Reason), chrono::Duration)>;

/// What has been told, so that each notice is told once.
pub(super) struct Notices {
    /// How long before a claim becomes due its `DeletionScheduled` event is written; `None`: never.
    before: Option<chrono::Duration>,
    /// Per claim, the UID and due instant last announced (leader only): once per deadline.
    noticed: Mutex<HashMap<ObjectKey, (String, DateTime<Utc>)>>,
    /// Per namespace, the annotations last warned about (leader only): told once per change.
    warned: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Per claim, the UID and what it lacks, last told (leader only): once per claim and lack.
    unproven: Mutex<HashMap<ObjectKey, (String, String)>>,
    /// Per namespace, when each claim there was first told to lack provenance within the last
    /// [`FLOOD_WINDOW`], and whether the flood was told in it.
    floods: Mutex<HashMap<String, Flood>>,
}

/// A flood of labelled claims without provenance in one namespace: this many first told within
/// this long (the `WorkspaceGCUnprovenLabelFlood` alert's figures) is told on the Namespace.
const FLOOD_CLAIMS: usize = 10;
const FLOOD_WINDOW: Duration = Duration::from_secs(10 * 60);

/// One namespace's claims first told to lack provenance, within the window.
#[derive(Default)]
struct Flood {
    told: VecDeque<tokio::time::Instant>,
    /// When the flood was last told: once a window.
    announced: Option<tokio::time::Instant>,
}

impl Flood {
    /// Counts one more claim at `now`; the number in the window when that makes a flood not
    /// yet told in it.
    fn count(&mut self, now: tokio::time::Instant) -> Option<usize> {
        while (self.told.front()).is_some_and(|first| now.duration_since(*first) >= FLOOD_WINDOW) {
            self.told.pop_front();
        }
        self.told.push_back(now);
        let quiet = (self.announced).is_none_or(|at| now.duration_since(at) >= FLOOD_WINDOW);
        (self.told.len() >= FLOOD_CLAIMS && quiet).then(|| {
            self.announced = Some(now);
            self.told.len()
        })
    }
}

impl Notices {
    pub(super) fn new(config: &Config) -> Self {
        Notices {
            before: (config.deletion.notice_before)
                .map(|d| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)),
            noticed: Mutex::default(),
            warned: Mutex::default(),
            unproven: Mutex::default(),
            floods: Mutex::default(),
        }
    }

    /// How long ahead of its deadline a claim's deletion is announced; `None`: never.
    pub(super) fn lead(&self) -> Option<chrono::Duration> {
        self.before
    }

    /// Forgets a claim that is gone: a claim re-created under its name is told again.
    pub(super) fn forget_claim(&self, key: &ObjectKey) {
        (self.noticed.lock().unwrap_or_else(|e| e.into_inner())).remove(key);
        (self.unproven.lock().unwrap_or_else(|e| e.into_inner())).remove(key);
    }

    /// Forgets the namespace warnings on standing by: the next leader tells them again.
    pub(super) fn forget_warnings(&self) {
        (self.warned.lock().unwrap_or_else(|e| e.into_inner())).clear();
        (self.unproven.lock().unwrap_or_else(|e| e.into_inner())).clear();
        (self.floods.lock().unwrap_or_else(|e| e.into_inner())).clear();
    }

    /// Takes in a namespace's workspace-gc annotations; whether they changed since last told
    /// (or were never told).
    pub(super) fn namespace_changed(
        &self,
        namespace: &str,
        annotations: BTreeMap<String, String>,
    ) -> bool {
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        warned.insert(namespace.to_owned(), annotations.clone()) != Some(annotations)
    }

    /// A labelled claim kept as no build workspace, lacking `detail`, at `now`: what to tell,
    /// once per claim and lack, and a flood in its namespace once a window.
    pub(super) fn unproven(
        &self,
        claim: &ClaimFacts,
        detail: &str,
        now: tokio::time::Instant,
    ) -> Unproven {
        let before = {
            let mut told = (self.unproven.lock()).unwrap_or_else(|e| e.into_inner());
            let this = (claim.uid.clone(), detail.to_owned());
            told.insert(claim.key.clone(), this)
        };
        match before {
            Some((uid, lack)) if uid == claim.uid && lack == detail => return Unproven::Told,
            // A claim told before that lacks something else now: told, counted once.
            Some((uid, _)) if uid == claim.uid => return Unproven::New,
            _ => {}
        }
        let mut floods = (self.floods.lock()).unwrap_or_else(|e| e.into_inner());
        let flood = floods.entry(claim.key.namespace.to_string()).or_default();
        match flood.count(now) {
            Some(claims) => Unproven::Flood { claims },
            None => Unproven::New,
        }
    }

    /// Whether the `DeletionScheduled` notice of `claim`, due at `due`, is still to be told:
    /// once per claim and deadline.
    pub(super) fn deletion_scheduled(&self, claim: &ClaimFacts, due: DateTime<Utc>) -> bool {
        let mut noticed = self.noticed.lock().unwrap_or_else(|e| e.into_inner());
        let this = (claim.uid.clone(), due);
        noticed.insert(claim.key.clone(), this.clone()) != Some(this)
    }
}

/// What to tell of a claim kept as no build workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unproven {
    /// Told already, for this lack.
    Told,
    /// To tell on the claim.
    New,
    /// To tell on the claim, and on its Namespace: this many were first told within the
    /// flood's window.
    Flood { claims: usize },
}

impl<C: Cluster, K: Clock> Controller<C, K> {
    /// As the leader, warns on a Namespace whose workspace-gc annotations are not understood (its
    /// claims are kept): once per change of them.
    pub(super) async fn warn_namespace(&self, namespace: &str) {
        if self.cache.policies.namespaces.is_none() || !self.is_leader() {
            return;
        }
        let Some(annotations) = self.cache.read().namespace_annotations(namespace).cloned() else {
            return;
        };
        let invalid = self
            .cache
            .policies
            .for_namespace(Some(&annotations))
            .problems;
        let first = self.notices.namespace_changed(namespace, annotations);
        if first && !invalid.is_empty() {
            for problem in &invalid {
                warn!(%namespace, %problem, "namespace annotation not understood; keeping every claim there");
            }
            let notice = NamespaceNotice::InvalidPolicy(invalid);
            (self.cluster).notify_namespace(namespace, &notice).await;
        }
    }

    /// As the leader, warns on a labelled claim kept as no build workspace, saying what it
    /// lacks: once per claim and lack, not on every reconcile.
    pub(super) async fn tell_not_a_build_workspace(&self, claim: &ClaimFacts, detail: String) {
        if !self.is_leader() {
            return;
        }
        let told = self
            .notices
            .unproven(claim, &detail, tokio::time::Instant::now());
        if told == Unproven::Told {
            return;
        }
        warn!(claim = %claim.key, %detail, "keeping a labelled claim that is no build workspace");
        let notice = Notice::NotABuildWorkspace(detail);
        self.cluster.notify(claim, notice).await;
        // Many at once in one namespace is the alarm it is (a common label applied to it).
        if let Unproven::Flood { claims } = told {
            let namespace = &claim.key.namespace;
            let within = humantime::format_duration(FLOOD_WINDOW).to_string();
            warn!(%namespace, claims, %within, "a flood of labelled claims without provenance");
            let notice = NamespaceNotice::UnprovenLabelFlood { claims, within };
            (self.cluster).notify_namespace(namespace, &notice).await;
        }
    }

    /// When a kept claim wakes next: at its recheck instant, or earlier, when its deletion is
    /// to be announced `notice_before` ahead.
    pub(super) fn wake_at(
        &self,
        recheck_at: Option<DateTime<Utc>>,
        scheduled: &Scheduled,
    ) -> Option<DateTime<Utc>> {
        match scheduled {
            Some(((due, _), lead)) => {
                let notice_at = due.checked_sub_signed(*lead).unwrap_or(*due);
                if self.clock.now() < notice_at {
                    Some(notice_at)
                } else {
                    recheck_at
                }
            }
            None => recheck_at,
        }
    }

    /// Writes the `DeletionScheduled` event of a kept claim whose notice time has come: once
    /// per claim and deadline, by the leader.
    pub(super) async fn announce_deletion(&self, claim: &ClaimFacts, scheduled: Scheduled) {
        let Some(((due, reason), lead)) = scheduled else {
            return;
        };
        let notice_at = due.checked_sub_signed(lead).unwrap_or(due);
        if self.clock.now() < notice_at || !self.is_leader() {
            return;
        }
        if self.notices.deletion_scheduled(claim, due) {
            info!(claim = %claim.key, %due, %reason, "deletion scheduled");
            let at = due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let notice = Notice::DeletionScheduled { at, reason };
            self.cluster.notify(claim, notice).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> ClaimFacts {
        ClaimFacts::example(name)
    }

    #[test]
    fn a_claim_without_provenance_is_told_once_per_lack_and_a_flood_once_a_window() {
        let notices = Notices::new(&Config::default());
        let now = tokio::time::Instant::now();
        assert_eq!(
            notices.unproven(&claim("c0"), "no owner", now),
            Unproven::New
        );
        assert_eq!(
            notices.unproven(&claim("c0"), "no owner", now),
            Unproven::Told
        );
        assert_eq!(
            notices.unproven(&claim("c0"), "other lack", now),
            Unproven::New
        );
        let told: Vec<Unproven> = (1..FLOOD_CLAIMS + 2)
            .map(|n| notices.unproven(&claim(&format!("c{n}")), "no owner", now))
            .collect();
        // The tenth claim first told in the window makes the flood (`c0` counts once, whatever
        // it lacks); told once in it.
        let floods: Vec<usize> = (told.iter().enumerate())
            .filter(|(_, told)| matches!(told, Unproven::Flood { .. }))
            .map(|(at, _)| at)
            .collect();
        assert_eq!(floods, [FLOOD_CLAIMS - 2], "{told:?}");
        let later = now + FLOOD_WINDOW;
        let after: Vec<Unproven> = (0..FLOOD_CLAIMS)
            .map(|n| notices.unproven(&claim(&format!("d{n}")), "no owner", later))
            .collect();
        assert_eq!(
            after.last(),
            Some(&Unproven::Flood {
                claims: FLOOD_CLAIMS
            })
        );
        notices.forget_claim(&claim("c0").key);
        assert_eq!(
            notices.unproven(&claim("c0"), "other lack", later),
            Unproven::New
        );
    }

    #[test]
    fn a_namespace_is_told_once_per_change_and_again_after_standing_by() {
        let notices = Notices::new(&Config::default());
        let annotations = BTreeMap::from([("ttl".to_owned(), "x".to_owned())]);
        assert!(notices.namespace_changed("ml", annotations.clone()));
        assert!(!notices.namespace_changed("ml", annotations.clone()));
        assert!(notices.namespace_changed("ml", BTreeMap::new()));
        notices.forget_warnings();
        assert!(notices.namespace_changed("ml", BTreeMap::new()));
    }

    #[test]
    fn a_deletion_is_announced_once_per_deadline_and_claim() {
        let notices = Notices::new(&Config::default());
        let due = DateTime::<Utc>::UNIX_EPOCH;
        assert!(notices.deletion_scheduled(&claim("a"), due));
        assert!(!notices.deletion_scheduled(&claim("a"), due));
        let later = due + chrono::Duration::hours(1);
        assert!(notices.deletion_scheduled(&claim("a"), later));
        let recreated = ClaimFacts {
            uid: "other".into(),
            ..claim("a")
        };
        assert!(notices.deletion_scheduled(&recreated, later));
    }
}
