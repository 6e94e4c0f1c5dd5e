//! The load generator: random workload actions against the cluster (builds created, finished,
//! failed and deleted; claims owned by reference or orphaned; pods starting and stopping on
//! claims; annotations set and removed; claims re-created under the same name), each recorded
//! in the ground truth of [`World`] bracketed by the times before and after its API call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::{Mutex, RwLock};

use crate::world::{Annotations, Build, Incarnation, Link, Owner, PodModel, World};
use crate::{MARGIN, NAMESPACES, now, seconds};
use testkit::graph::rfc3339;
use testkit::{
    BUILD_WORKSPACE_LABEL, ClaimBuilder, JobBuilder, PipelineRunBuilder, TestNamespace,
    notebook_validation_job_resource, pipeline_run_resource,
};

/// SplitMix64: reproducible choices without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

pub struct Driver {
    pub client: Client,
    pub world: Mutex<World>,
    pub rng: Mutex<Rng>,
    /// Held (read) by each action; held (write) by a fault that takes the control plane down,
    /// so the ground truth never records a call whose outcome is unknown.
    pub gate: RwLock<()>,
}

/// The workload: a random action every `interval` until `end`, the ground truth refreshed from
/// the cluster every 15 actions and a line of progress every 90.
pub async fn run(
    driver: Arc<Driver>,
    started: DateTime<Utc>,
    end: DateTime<Utc>,
    interval: Duration,
) {
    let mut ticks = 0u64;
    while now() < end {
        // The builders panic on API errors: a panic is a failed call, not the end.
        let step = tokio::spawn({
            let driver = driver.clone();
            async move { driver.step().await }
        });
        if step.await.is_err() {
            driver.world.lock().await.failures += 1;
        }
        ticks += 1;
        if ticks.is_multiple_of(15) {
            driver.refresh().await;
        }
        if ticks.is_multiple_of(90) {
            let world = driver.world.lock().await;
            let live = world.incarnations.iter().filter(|i| !i.gone).count();
            println!(
                "soak: {:>4} s: {} claims created, {} live, {} pods",
                (now() - started).num_seconds(),
                world.incarnations.len(),
                live,
                world.pods.values().filter(|p| p.active).count()
            );
        }
        tokio::time::sleep(interval).await;
    }
}

impl Driver {
    pub fn claims(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn jobs(&self, namespace: &str) -> Api<kube::api::DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &notebook_validation_job_resource(),
        )
    }

    pub fn runs(&self, namespace: &str) -> Api<kube::api::DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &pipeline_run_resource())
    }

    pub fn namespace(&self, namespace: &str) -> TestNamespace {
        TestNamespace::existing(self.client.clone(), namespace)
    }

    pub async fn serial(&self) -> u64 {
        let mut world = self.world.lock().await;
        world.serial += 1;
        world.serial
    }

    async fn step(&self) {
        let _gate = self.gate.read().await;
        let choice = self.rng.lock().await.below(100);
        let result = match choice {
            0..=14 => self.new_build().await,
            15..=21 => self.new_owned().await,
            22..=27 => self.new_orphan().await,
            28..=41 => self.finish().await,
            42..=49 => self.delete_owner().await,
            50..=59 => self.start_pod().await,
            60..=69 => self.stop_pod().await,
            70..=73 => self.keep(true).await,
            74..=77 => self.keep(false).await,
            78..=81 => self.set_ttl().await,
            82..=85 => self.set_expires().await,
            86..=88 => self.invalid(true).await,
            89..=91 => self.invalid(false).await,
            92..=96 => self.recreate().await,
            _ => self.delete_finished_pod().await,
        };
        if let Err(error) = result {
            self.world.lock().await.failures += 1;
            eprintln!("soak: driver action failed: {error}");
        }
    }

    async fn pick_namespace(&self) -> &'static str {
        NAMESPACES[self.rng.lock().await.below(NAMESPACES.len())]
    }

    pub async fn created(
        &self,
        claim: PersistentVolumeClaim,
        link: Link,
        annotations: Annotations,
        before: DateTime<Utc>,
    ) {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let created = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(workspace_gc::cluster::resources::to_chrono)
            .unwrap_or_else(now);
        let mut world = self.world.lock().await;
        world.incarnations.push(Incarnation {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            created,
            link,
            annotations,
            history: Vec::new(),
            gone: false,
            driver_deleted: false,
            tainted: false,
        });
        let index = world.incarnations.len() - 1;
        world
            .current
            .insert((namespace.clone(), name.clone()), index);
        world.record(&namespace, &[name], before);
    }

    async fn new_build(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let job = format!("b{}", self.serial().await);
        let namespace = self.namespace(ns);
        let created = JobBuilder::new(&job)
            .phase("Building")
            .create(&namespace)
            .await;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        {
            let mut world = self.world.lock().await;
            world.builds.insert(
                (ns.into(), job.clone()),
                Build {
                    namespace: ns.into(),
                    job: job.clone(),
                    uid,
                    run: Owner::Absent,
                    state: Owner::Running,
                },
            );
            world.count("new-build");
        }
        // The operator creates the claim before its PipelineRun.
        let before = now();
        let claim = ClaimBuilder::for_job(&job).create(&namespace).await;
        self.created(
            claim,
            Link::Naming(job.clone()),
            Annotations::default(),
            before,
        )
        .await;
        let before = now();
        PipelineRunBuilder::for_job(&job)
            .running()
            .create(&namespace)
            .await;
        let mut world = self.world.lock().await;
        if let Some(build) = world.builds.get_mut(&(ns.into(), job.clone())) {
            build.run = Owner::Running;
        }
        world.record(ns, &[format!("{job}-build-workspace")], before);
        Ok(())
    }

    async fn new_owned(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let job = format!("o{}", self.serial().await);
        let namespace = self.namespace(ns);
        let created = JobBuilder::new(&job)
            .phase("Building")
            .create(&namespace)
            .await;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        {
            let mut world = self.world.lock().await;
            world.builds.insert(
                (ns.into(), job.clone()),
                Build {
                    namespace: ns.into(),
                    job: job.clone(),
                    uid: uid.clone(),
                    run: Owner::Absent,
                    state: Owner::Running,
                },
            );
            world.count("new-owned");
        }
        let before = now();
        // Of the operator's shape (provenance) but for no job's name: only the owner links it.
        let claim = ClaimBuilder::build_workspace(&format!("{job}-owned-build-workspace"))
            .owner_reference(OwnerReference {
                api_version: "mlops.mlops.dev/v1alpha1".into(),
                kind: "NotebookValidationJob".into(),
                name: job.clone(),
                uid,
                controller: None,
                block_owner_deletion: None,
            })
            .create(&namespace)
            .await;
        self.created(claim, Link::OwnerRef(job), Annotations::default(), before)
            .await;
        Ok(())
    }

    async fn new_orphan(&self) -> Result<(), String> {
        let ns = self.pick_namespace().await;
        let name = format!("x{}-build-workspace", self.serial().await);
        let before = now();
        let claim = ClaimBuilder::build_workspace(&name)
            .create(&self.namespace(ns))
            .await;
        self.created(claim, Link::Orphan, Annotations::default(), before)
            .await;
        self.world.lock().await.count("new-orphan");
        Ok(())
    }

    /// `count` orphan claims whose `expires` has passed: all due at once.
    pub async fn burst(&self, count: u32) {
        let _gate = self.gate.read().await;
        let expired = (now() - seconds(1)).trunc_subsecs(0);
        for _ in 0..count {
            let ns = self.pick_namespace().await;
            let name = format!("s{}-build-workspace", self.serial().await);
            let before = now();
            let claim = ClaimBuilder::build_workspace(&name)
                .annotation(
                    workspace_gc::contract::annotations::EXPIRES,
                    &rfc3339(expired),
                )
                .create(&self.namespace(ns))
                .await;
            let annotations = Annotations {
                expires: Some(expired),
                ..Annotations::default()
            };
            self.created(claim, Link::Orphan, annotations, before).await;
            self.world.lock().await.count("burst");
        }
    }

    /// Picks a build with the given state.
    async fn pick_build(&self, f: impl Fn(&World, &Build) -> bool) -> Option<Build> {
        let candidates: Vec<Build> = {
            let world = self.world.lock().await;
            world
                .builds
                .values()
                .filter(|b| f(&world, b))
                .cloned()
                .collect()
        };
        self.rng.lock().await.pick(&candidates).cloned()
    }

    async fn finish(&self) -> Result<(), String> {
        let Some(build) = self.pick_build(|_, b| b.state == Owner::Running).await else {
            return Ok(());
        };
        let succeeded = self.rng.lock().await.chance(70);
        let at = now().trunc_subsecs(0);
        let phase = if succeeded { "Succeeded" } else { "Failed" };
        let before = now();
        self.jobs(&build.namespace)
            .patch_status(
                &build.job,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "completionTime": rfc3339(at)}})),
            )
            .await
            .map_err(|e| format!("finish job {}: {e}", build.job))?;
        let key = (build.namespace.clone(), build.job.clone());
        {
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.state = Owner::Finished(at);
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
            world.count("finish");
        }
        if build.run == Owner::Running {
            let before = now();
            let outcome = if succeeded { "True" } else { "False" };
            let status = json!({"status": {
                "conditions": [{"type": "Succeeded", "status": outcome, "reason": phase}],
                "completionTime": rfc3339(at)}});
            self.runs(&build.namespace)
                .patch_status(
                    &format!("{}-build", build.job),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .map_err(|e| format!("finish run of {}: {e}", build.job))?;
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.run = Owner::Finished(at);
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
        }
        Ok(())
    }

    async fn delete_owner(&self) -> Result<(), String> {
        let Some(build) = self
            .pick_build(|world, b| b.state != Owner::Absent && world.owners_deletable(b))
            .await
        else {
            return Ok(());
        };
        let key = (build.namespace.clone(), build.job.clone());
        let before = now();
        self.jobs(&build.namespace)
            .delete(&build.job, &DeleteParams::background())
            .await
            .map_err(|e| format!("delete job {}: {e}", build.job))?;
        {
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.state = Owner::Absent;
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
            world.count("delete-owner");
        }
        if build.run != Owner::Absent {
            let before = now();
            self.runs(&build.namespace)
                .delete(&format!("{}-build", build.job), &DeleteParams::background())
                .await
                .map_err(|e| format!("delete run of {}: {e}", build.job))?;
            let mut world = self.world.lock().await;
            if let Some(b) = world.builds.get_mut(&key) {
                b.run = Owner::Absent;
            }
            let claims = world.claims_of(&build);
            world.record(&build.namespace, &claims, before);
        }
        self.world.lock().await.builds.remove(&key);
        Ok(())
    }

    /// Picks a claim from `indices`: (index, namespace, name, uid).
    async fn pick_claim(&self, indices: Vec<usize>) -> Option<(usize, String, String, String)> {
        let index = *self.rng.lock().await.pick(&indices)?;
        let world = self.world.lock().await;
        let inc = &world.incarnations[index];
        Some((
            index,
            inc.namespace.clone(),
            inc.name.clone(),
            inc.uid.clone(),
        ))
    }

    async fn start_pod(&self) -> Result<(), String> {
        let candidates = self.world.lock().await.protectable();
        let Some((_, ns, claim, _)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let pod = format!("p{}", self.serial().await);
        let scheduled = self.rng.lock().await.chance(50);
        let mut builder = testkit::PodBuilder::new(&pod)
            .mounting(&claim)
            .phase("Running");
        if scheduled {
            builder = builder.scheduled_on("node-a");
        }
        let before = now();
        builder.create(&self.namespace(&ns)).await;
        let mut world = self.world.lock().await;
        world.pods.insert(
            pod,
            PodModel {
                namespace: ns.clone(),
                claim: claim.clone(),
                active: true,
                scheduled,
            },
        );
        world.record(&ns, &[claim], before);
        world.count("start-pod");
        Ok(())
    }

    async fn stop_pod(&self) -> Result<(), String> {
        let active: Vec<(String, PodModel)> = {
            let world = self.world.lock().await;
            world
                .pods
                .iter()
                .filter(|(_, p)| p.active)
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect()
        };
        let Some((name, pod)) = self.rng.lock().await.pick(&active).cloned() else {
            return Ok(());
        };
        let phase = if self.rng.lock().await.chance(80) {
            "Succeeded"
        } else {
            "Failed"
        };
        let before = now();
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .map_err(|e| format!("stop pod {name}: {e}"))?;
        let mut world = self.world.lock().await;
        if let Some(p) = world.pods.get_mut(&name) {
            p.active = false;
        }
        world.record(&pod.namespace, &[pod.claim], before);
        world.count("stop-pod");
        Ok(())
    }

    async fn delete_finished_pod(&self) -> Result<(), String> {
        let done: Vec<(String, PodModel)> = {
            let world = self.world.lock().await;
            world
                .pods
                .iter()
                .filter(|(_, p)| !p.active)
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect()
        };
        let Some((name, pod)) = self.rng.lock().await.pick(&done).cloned() else {
            return Ok(());
        };
        // No kubelet confirms a graceful deletion of a scheduled pod.
        let params = if pod.scheduled {
            DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            }
        } else {
            DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .delete(&name, &params)
            .await
            .map_err(|e| format!("delete pod {name}: {e}"))?;
        let mut world = self.world.lock().await;
        world.pods.remove(&name);
        world.count("delete-pod");
        Ok(())
    }

    /// Patches a claim's annotations (None removes one), then records the new state.
    async fn annotate(
        &self,
        index: usize,
        patch: Value,
        update: impl FnOnce(&mut Annotations),
        action: &'static str,
    ) -> Result<(), String> {
        let (ns, name, uid) = {
            let world = self.world.lock().await;
            let inc = &world.incarnations[index];
            (inc.namespace.clone(), inc.name.clone(), inc.uid.clone())
        };
        let before = now();
        // The UID in the patch makes it apply to this incarnation only.
        let body = json!({"metadata": {"uid": uid, "annotations": patch}});
        let result = self
            .claims(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await;
        let mut world = self.world.lock().await;
        match result {
            Ok(claim) if claim.metadata.deletion_timestamp.is_none() => {
                update(&mut world.incarnations[index].annotations);
                world.record(&ns, &[name], before);
                world.count(action);
                Ok(())
            }
            // Deleted meanwhile (the daemon or the garbage collector): nothing to record.
            Ok(_) => {
                world.incarnations[index].gone = true;
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                world.incarnations[index].gone = true;
                Ok(())
            }
            Err(e) => {
                // The change may or may not have landed.
                world.incarnations[index].tainted = true;
                Err(format!("annotate {ns}/{name}: {e}"))
            }
        }
    }

    pub async fn keep(&self, keep: bool) -> Result<(), String> {
        let candidates = if keep {
            self.world.lock().await.protectable()
        } else {
            self.world.lock().await.live(|_, s| s.keep)
        };
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let value = if keep { json!("true") } else { Value::Null };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::KEEP: value }),
            |a| a.keep = keep,
            if keep { "keep" } else { "unkeep" },
        )
        .await
    }

    async fn set_ttl(&self) -> Result<(), String> {
        let ttl = self.rng.lock().await.between(10, 60) as i64;
        // Both the old and the new TTL leave the claim undue for the margin.
        let horizon = now() + seconds(MARGIN);
        let candidates = self.world.lock().await.live(|inc, state| {
            let mut changed = state.clone();
            // A valid TTL replaces an invalid one: the claim is then judged by its deadlines.
            changed.ttl = Some(ttl);
            changed.invalid = false;
            [state, &changed]
                .iter()
                .all(|s| inc.next_due(s, now()).is_none_or(|due| due > horizon))
        });
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::TTL: format!("{ttl}s") }),
            |a| {
                a.ttl = Some(ttl);
                a.invalid = false;
            },
            "ttl",
        )
        .await
    }

    async fn set_expires(&self) -> Result<(), String> {
        let at = (now() + seconds(self.rng.lock().await.between(8, 60) as i64)).trunc_subsecs(0);
        let candidates = self.world.lock().await.protectable();
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::EXPIRES: rfc3339(at) }),
            |a| a.expires = Some(at),
            "expires",
        )
        .await
    }

    pub async fn invalid(&self, invalid: bool) -> Result<(), String> {
        let candidates = if invalid {
            self.world.lock().await.protectable()
        } else {
            self.world.lock().await.live(|_, s| s.invalid)
        };
        let Some((index, ..)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        // An invalid TTL replaces a valid one; fixing it removes the TTL.
        let value = if invalid {
            json!("a while")
        } else {
            Value::Null
        };
        self.annotate(
            index,
            json!({ workspace_gc::contract::annotations::TTL: value }),
            |a| {
                a.invalid = invalid;
                a.ttl = None;
            },
            if invalid { "invalid" } else { "fix-invalid" },
        )
        .await
    }

    /// Deletes a claim and creates it again under the same name, as the operator's
    /// `ensureBuildPVC` does for a job re-created under the same name. Any claim will do,
    /// due or not: a delete the daemon decided about the old one must not hit the new one.
    async fn recreate(&self) -> Result<(), String> {
        let candidates = self.world.lock().await.live(|_, s| s.active_pods == 0);
        let Some((index, ns, name, uid)) = self.pick_claim(candidates).await else {
            return Ok(());
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.claims(&ns).delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                self.world.lock().await.incarnations[index].gone = true;
                return Ok(());
            }
            Err(e) => {
                self.world.lock().await.incarnations[index].tainted = true;
                return Err(format!("delete {ns}/{name} to re-create it: {e}"));
            }
        }
        {
            let mut world = self.world.lock().await;
            world.incarnations[index].gone = true;
            world.incarnations[index].driver_deleted = true;
        }
        // PVC protection lets it go once no pod holds it; kube-controller-manager may lag after
        // a fault, and then the name stays taken: give up on re-creating it.
        let mut free = false;
        for _ in 0..100 {
            if let Ok(None) = self.claims(&ns).get_opt(&name).await {
                free = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !free {
            return Ok(());
        }
        let link = self.world.lock().await.incarnations[index].link.clone();
        let mut builder = ClaimBuilder::build_workspace(&name);
        if let Link::OwnerRef(job) = &link {
            let uid = {
                let world = self.world.lock().await;
                world
                    .builds
                    .get(&(ns.clone(), job.clone()))
                    .map(|b| b.uid.clone())
            };
            let Some(uid) = uid else {
                // The owner is gone: the garbage collector would take the claim at once.
                return Ok(());
            };
            builder = builder.owner_reference(OwnerReference {
                api_version: "mlops.mlops.dev/v1alpha1".into(),
                kind: "NotebookValidationJob".into(),
                name: job.clone(),
                uid,
                controller: None,
                block_owner_deletion: None,
            });
        }
        let before = now();
        let claim = builder.create(&self.namespace(&ns)).await;
        self.created(claim, link, Annotations::default(), before)
            .await;
        self.world.lock().await.count("recreate");
        Ok(())
    }

    /// Marks the claims that no longer exist (or are terminating), so actions skip them.
    pub async fn refresh(&self) {
        let mut alive = HashMap::new();
        for ns in NAMESPACES {
            let params = ListParams::default().labels(&format!("{BUILD_WORKSPACE_LABEL}=true"));
            match self.claims(ns).list(&params).await {
                Ok(list) => {
                    for claim in list.items {
                        let terminating = claim.metadata.deletion_timestamp.is_some();
                        alive.insert(claim.metadata.uid.unwrap_or_default(), !terminating);
                    }
                }
                Err(_) => return,
            }
        }
        let mut world = self.world.lock().await;
        for inc in &mut world.incarnations {
            if alive.get(&inc.uid) != Some(&true) {
                inc.gone = true;
            }
        }
    }

    /// Makes every claim collectable: stops the pods, removes `keep` and invalid annotations,
    /// finishes the builds. Each loop is bounded, in case a call keeps failing.
    pub async fn settle(&self) {
        let _gate = self.gate.read().await;
        for _ in 0..10_000 {
            let active = self.world.lock().await.pods.values().any(|p| p.active);
            if !active {
                break;
            }
            if let Err(e) = self.stop_pod().await {
                eprintln!("soak: settle: {e}");
            }
        }
        for _ in 0..10_000 {
            let kept = self.world.lock().await.live(|_, s| s.keep || s.invalid);
            let Some(&index) = kept.first() else { break };
            let patch = json!({
                workspace_gc::contract::annotations::KEEP: Value::Null,
                workspace_gc::contract::annotations::TTL: Value::Null,
            });
            let clear = |a: &mut Annotations| {
                a.keep = false;
                a.invalid = false;
                a.ttl = None;
            };
            if let Err(e) = self.annotate(index, patch, clear, "settle").await {
                eprintln!("soak: settle: {e}");
            }
        }
        for _ in 0..10_000 {
            let running = {
                let world = self.world.lock().await;
                world.builds.values().any(|b| b.state == Owner::Running)
            };
            if !running {
                break;
            }
            if let Err(e) = self.finish().await {
                eprintln!("soak: settle: {e}");
            }
        }
    }
}
