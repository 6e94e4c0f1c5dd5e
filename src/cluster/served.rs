//! Which version of each owner kind the API server serves, told by discovery. A 404 on a list
//! says only that the kind is not served *at that version*: an older Tekton serves TaskRuns at
//! `v1beta1` alone, and an OpenShift Pipelines upgrade can leave one CRD there for a while. So
//! a kind is read at the first of its [readable versions](OwnerKind::readable_versions) its group
//! serves; it is absent (no such object exists) only when its group serves it at no version;
//! served only at versions whose fields workspace-gc does not know, its facts are unknown and
//! every claim it could protect is kept.
//!
//! [`Served`] keeps the latest resolution of each kind for the watches and the live reads, and
//! reports each change of it (a log line, `workspace_gc_kind_served`, `/readyz`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup;
use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::contract::OwnerKind;
use crate::observe::http::Health;
use crate::observe::metrics::{Kind, Metrics, ServedState as State};

/// How an owner kind is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    /// At the version workspace-gc prefers.
    Preferred(ApiResource),
    /// Not at the preferred version, at another whose fields read are the same.
    OtherVersion(ApiResource),
    /// Only at these versions, whose fields workspace-gc does not know: its facts are unknown.
    Unreadable(Vec<String>),
    /// Its group serves it at no version.
    Absent,
}

impl Serving {
    pub fn state(&self) -> State {
        match self {
            Serving::Preferred(_) => State::Preferred,
            Serving::OtherVersion(_) => State::OtherVersion,
            Serving::Unreadable(_) => State::Unreadable,
            Serving::Absent => State::Absent,
        }
    }

    /// What reading `owner` comes to: the resource to read it at (`Ok(Some)`), no such object
    /// (`Ok(None)`: an optional kind that is absent), or why its facts are unknown (`Err`).
    pub fn readable(&self, owner: OwnerKind) -> Result<Option<&ApiResource>, String> {
        match self {
            Serving::Preferred(resource) | Serving::OtherVersion(resource) => Ok(Some(resource)),
            Serving::Absent if owner.optional() => Ok(None),
            Serving::Absent => Err(format!(
                "no {} CRD is installed (group {} serves no such kind)",
                owner.as_str(),
                owner.group()
            )),
            Serving::Unreadable(versions) => Err(format!(
                "{} is served only at {}, whose fields workspace-gc does not read",
                owner.as_str(),
                group_versions(owner, versions)
            )),
        }
    }

    /// What an operator should know of it, for the log and `/readyz`; `None` when it is read
    /// where workspace-gc expects it.
    fn note(&self, owner: OwnerKind) -> Option<String> {
        let kind = owner.as_str();
        match self {
            Serving::Preferred(_) => None,
            Serving::OtherVersion(resource) => Some(format!(
                "{kind} is not served at {}; read at {}, whose fields workspace-gc reads are the same",
                group_versions(owner, &[owner.readable_versions()[0]]),
                resource.api_version
            )),
            Serving::Absent if owner.optional() => {
                Some(format!("no {kind} CRD is installed: no {kind} exists"))
            }
            Serving::Absent | Serving::Unreadable(_) => Some(format!(
                "{}: claims a {kind} could protect are kept (owner-unknown)",
                self.readable(owner).err().unwrap_or_default()
            )),
        }
    }
}

fn group_versions(owner: OwnerKind, versions: &[impl AsRef<str>]) -> String {
    let named: Vec<String> = (versions.iter())
        .map(|version| format!("{}/{}", owner.group(), version.as_ref()))
        .collect();
    named.join(", ")
}

/// One version of a group as discovery lists it: its name, and the kinds it serves with their
/// plurals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub version: String,
    pub kinds: Vec<(String, String)>,
}

impl Discovered {
    fn plural(&self, kind: &str) -> Option<&str> {
        let found = self.kinds.iter().find(|(served, _)| served == kind);
        found.map(|(_, plural)| plural.as_str())
    }
}

/// How `owner` is served, from its group's versions in discovery (`None`: the group is not
/// served at all).
pub fn resolve(owner: OwnerKind, group: Option<&[Discovered]>) -> Serving {
    let kind = owner.as_str();
    let serving: Vec<(&str, &str)> = (group.into_iter().flatten())
        .filter_map(|version| Some((version.version.as_str(), version.plural(kind)?)))
        .collect();
    let readable = owner.readable_versions();
    let chosen = readable.iter().enumerate().find_map(|(rank, wanted)| {
        let found = serving.iter().find(|(version, _)| version == wanted)?;
        Some((rank, found))
    });
    match chosen {
        Some((rank, (version, plural))) => {
            let gvk = GroupVersionKind::gvk(owner.group(), version, kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            if rank == 0 {
                Serving::Preferred(resource)
            } else {
                Serving::OtherVersion(resource)
            }
        }
        None if serving.is_empty() => Serving::Absent,
        None => Serving::Unreadable(serving.iter().map(|(v, _)| (*v).to_owned()).collect()),
    }
}

/// Asks discovery for `group` (a 404 means it is not served at all), then for each of its
/// versions.
async fn discover(client: &Client, group: &str) -> Result<Option<Vec<Discovered>>, kube::Error> {
    let request = http::Request::get(format!("/apis/{group}"))
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let served: APIGroup = match client.request(request).await {
        Ok(served) => served,
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut versions = Vec::new();
    for version in served.versions {
        let resources = client
            .list_api_group_resources(&version.group_version)
            .await?;
        let kinds = (resources.resources.into_iter())
            // Subresources (`taskruns/status`) name their parent's kind too.
            .filter(|resource| !resource.name.contains('/'))
            .map(|resource| (resource.kind, resource.name))
            .collect();
        versions.push(Discovered {
            version: version.version,
            kinds,
        });
    }
    Ok(Some(versions))
}

/// Where a change of resolution is told.
struct Report {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The latest resolution of each owner kind, shared by the watches and the live reads.
#[derive(Clone)]
pub struct Served(Arc<Inner>);

struct Inner {
    client: Client,
    /// One per API group: the kinds of one group are resolved by one discovery.
    groups: HashMap<&'static str, Slot>,
    report: Option<Report>,
}

#[derive(Default)]
struct Slot {
    /// Held while discovery is asked, so that callers waiting share one answer.
    turn: tokio::sync::Mutex<()>,
    /// When the latest answer was asked, and what it said of each kind of the group.
    latest: Mutex<Option<(Instant, HashMap<OwnerKind, Serving>)>>,
}

impl Slot {
    fn latest(&self) -> std::sync::MutexGuard<'_, Option<(Instant, HashMap<OwnerKind, Serving>)>> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answered(&self, owner: OwnerKind) -> Option<(Instant, Serving)> {
        let latest = self.latest();
        let (at, kinds) = latest.as_ref()?;
        Some((*at, kinds.get(&owner)?.clone()))
    }
}

impl Served {
    /// Resolves through `client`; changes are reported to `metrics` and `health` when given
    /// (the daemon), and logged either way.
    pub fn new(client: Client, report: Option<(Arc<Metrics>, Arc<Health>)>) -> Self {
        let groups = OwnerKind::ALL.map(|kind| (kind.group(), Slot::default()));
        Served(Arc::new(Inner {
            client,
            groups: groups.into_iter().collect(),
            report: report.map(|(metrics, health)| Report { metrics, health }),
        }))
    }

    fn slot(&self, owner: OwnerKind) -> &Slot {
        // Built with every kind's group.
        &self.0.groups[owner.group()]
    }

    /// The latest resolution of `owner`; `None` before the first.
    pub fn known(&self, owner: OwnerKind) -> Option<Serving> {
        self.slot(owner).answered(owner).map(|(_, serving)| serving)
    }

    /// How `owner` is served, by discovery asked after this call (shared with the callers that
    /// waited for the same answer).
    pub async fn resolve(&self, owner: OwnerKind) -> Result<Serving, kube::Error> {
        let asked = Instant::now();
        self.resolve_unless(owner, |at, _| at >= asked).await
    }

    /// What reading `owner` live comes to (see [`Serving::readable`]): where it was last
    /// resolved to be served (should that version stop being served, the read fails: unknown);
    /// but when it was absent, or not resolved yet, by discovery asked at `since` or later, so
    /// that a CRD installed since is read at once, as its objects may protect a claim already.
    pub async fn readable(
        &self,
        owner: OwnerKind,
        since: Instant,
    ) -> Result<Option<ApiResource>, String> {
        let answered = |at: Instant, serving: &Serving| at >= since || *serving != Serving::Absent;
        let serving = match self.slot(owner).answered(owner) {
            Some((at, serving)) if answered(at, &serving) => serving,
            _ => (self.resolve_unless(owner, answered).await)
                .map_err(|error| format!("discovering {}: {error}", owner.as_str()))?,
        };
        serving.readable(owner).map(Option::<&ApiResource>::cloned)
    }

    /// Asks discovery again after a live read of `owner` failed: the version it was read at
    /// may no longer be served. The API server ends the watches of a version it stopped
    /// serving only once that version's storage is torn down, which can take minutes, so the
    /// watch's 404 alone would tell late. The read that failed is unknown whatever the answer.
    pub async fn read_failed(&self, owner: OwnerKind) {
        if let Err(error) = self.resolve(owner).await {
            debug!(kind = owner.as_str(), %error, "cannot ask discovery");
        }
    }

    /// The latest resolution of `owner` if `enough` says it will do, else a new one.
    async fn resolve_unless(
        &self,
        owner: OwnerKind,
        enough: impl Fn(Instant, &Serving) -> bool,
    ) -> Result<Serving, kube::Error> {
        let slot = self.slot(owner);
        let _turn = slot.turn.lock().await;
        let latest = slot
            .answered(owner)
            .filter(|(at, serving)| enough(*at, serving));
        if let Some((_, serving)) = latest {
            return Ok(serving);
        }
        let started = Instant::now();
        let group = discover(&self.0.client, owner.group()).await?;
        let kinds: HashMap<OwnerKind, Serving> = (OwnerKind::ALL.into_iter())
            .filter(|kind| kind.group() == owner.group())
            .map(|kind| (kind, resolve(kind, group.as_deref())))
            .collect();
        let before = slot.latest().replace((started, kinds.clone()));
        for (kind, now) in &kinds {
            let before = before.as_ref().and_then(|(_, kinds)| kinds.get(kind));
            if before != Some(now) {
                self.changed(*kind, before, now);
            }
        }
        Ok(resolve(owner, group.as_deref()))
    }

    fn changed(&self, owner: OwnerKind, before: Option<&Serving>, now: &Serving) {
        let note = now.note(owner);
        let kind = owner.as_str();
        match (now, &note) {
            (Serving::Unreadable(_), Some(note)) => warn!(kind, "{note}"),
            (Serving::Absent, Some(note)) if !owner.optional() => warn!(kind, "{note}"),
            (_, Some(note)) => info!(kind, "{note}"),
            // Read where expected: worth a line only once it was not.
            (_, None) if before.is_some() => {
                info!(kind, "served at its preferred version again")
            }
            (_, None) => {}
        }
        if let Some(report) = &self.0.report {
            report.metrics.kind_served(Kind::from(owner), now.state());
            report.health.set_kind_note(owner, note);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version serving PipelineRuns and, if named, the owner kind `kind` as `plural`.
    fn version(name: &str, plural: Option<&str>) -> Discovered {
        let kind = match plural {
            Some("taskruns") => "TaskRun",
            Some("notebookvalidationjobs") => "NotebookValidationJob",
            _ => "PipelineRun",
        };
        let mut kinds = vec![("Condition".to_owned(), "conditions".to_owned())];
        kinds.extend(plural.map(|plural| (kind.to_owned(), plural.to_owned())));
        Discovered {
            version: name.to_owned(),
            kinds,
        }
    }

    fn read_at(serving: &Serving) -> Option<String> {
        match serving {
            Serving::Preferred(r) | Serving::OtherVersion(r) => Some(r.api_version.clone()),
            _ => None,
        }
    }

    #[test]
    fn a_kind_is_read_at_its_first_readable_version_served() {
        let both = [
            version("v1", Some("taskruns")),
            version("v1beta1", Some("taskruns")),
        ];
        let serving = resolve(OwnerKind::TaskRun, Some(&both));
        assert_eq!(serving.state(), State::Preferred);
        assert_eq!(read_at(&serving).as_deref(), Some("tekton.dev/v1"));

        // The group serves v1, but TaskRuns only at v1beta1 (a CRD not yet upgraded).
        let mixed = [version("v1", None), version("v1beta1", Some("taskruns"))];
        let serving = resolve(OwnerKind::TaskRun, Some(&mixed));
        assert_eq!(serving.state(), State::OtherVersion);
        assert_eq!(read_at(&serving).as_deref(), Some("tekton.dev/v1beta1"));
        let Serving::OtherVersion(resource) = &serving else {
            unreachable!()
        };
        assert_eq!(
            (resource.kind.as_str(), resource.plural.as_str()),
            ("TaskRun", "taskruns")
        );
    }

    #[test]
    fn a_kind_served_only_where_its_fields_are_not_known_is_unreadable() {
        let v2 = [version("v1", None), version("v2", Some("taskruns"))];
        assert_eq!(
            resolve(OwnerKind::TaskRun, Some(&v2)),
            Serving::Unreadable(vec!["v2".into()])
        );
        // v1beta1 is readable for Tekton's kinds, not for the operator's.
        let job = [version("v1alpha2", Some("notebookvalidationjobs"))];
        let serving = resolve(OwnerKind::Job, Some(&job));
        assert_eq!(serving.state(), State::Unreadable);
        let why = serving.readable(OwnerKind::Job).unwrap_err();
        assert!(why.contains("mlops.mlops.dev/v1alpha2"), "{why}");
    }

    #[test]
    fn a_kind_is_absent_only_when_its_group_serves_it_at_no_version() {
        assert_eq!(resolve(OwnerKind::TaskRun, None), Serving::Absent);
        let without = [version("v1", None), version("v1beta1", None)];
        assert_eq!(resolve(OwnerKind::TaskRun, Some(&without)), Serving::Absent);
        // No TaskRun: none exists. No PipelineRun or job CRD: a broken install, unknown.
        assert_eq!(Serving::Absent.readable(OwnerKind::TaskRun), Ok(None));
        for required in [OwnerKind::Run, OwnerKind::Job] {
            assert!(Serving::Absent.readable(required).is_err(), "{required:?}");
        }
    }

    #[test]
    fn only_what_is_not_read_as_expected_is_noted() {
        let preferred = resolve(OwnerKind::Run, Some(&[version("v1", Some("pipelineruns"))]));
        assert_eq!(preferred.note(OwnerKind::Run), None);
        let other = resolve(
            OwnerKind::Run,
            Some(&[version("v1beta1", Some("pipelineruns"))]),
        );
        let note = other.note(OwnerKind::Run).unwrap();
        assert!(
            note.contains("tekton.dev/v1;") && note.contains("tekton.dev/v1beta1"),
            "{note}"
        );
        let unreadable = Serving::Unreadable(vec!["v2".into()]);
        let note = unreadable.note(OwnerKind::TaskRun).unwrap();
        assert!(note.contains("kept (owner-unknown)"), "{note}");
    }
}
