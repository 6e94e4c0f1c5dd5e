//! The daemon's CPU per object decoded, without a control plane: watch events of each kind the
//! cache is fed (one object of each below, as kube-apiserver 1.37.2 serves it, repeated under
//! other names and versions) decoded as kube's watch decodes them, converted to cache entries
//! and applied to an index as an initial list.
//!
//!     cargo run --release --example decode_cost [-- OBJECTS_PER_KIND]
//!
//! Prints, per kind, the microseconds each object costs (the best of three rounds), and the
//! bytes each cached entry holds after the sync, from the allocator's own count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use kube::api::WatchEvent;
use serde::de::DeserializeOwned;
use workspace_gc::cluster::cache::{Change, Index, Update};
use workspace_gc::cluster::resources::{self, ClaimObject, OwnerObject, PodVolumes};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const POD: &str = r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"nb-00001-build-build-pod","namespace":"team-00","uid":"80f5bc67-e774-44d8-9d63-60e8de72d18c","resourceVersion":"232","generation":1,"creationTimestamp":"2026-12-03T13:00:59Z","labels":{"app.kubernetes.io/managed-by":"tekton-pipelines","tekton.dev/pipelineRun":"nb-00001-build","tekton.dev/pipelineTask":"build","tekton.dev/taskRun":"nb-00001-build-build"},"managedFields":[{"manager":"kubectl-create","operation":"Update","apiVersion":"v1","time":"2026-12-03T13:00:59Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app.kubernetes.io/managed-by":{},"f:tekton.dev/pipelineRun":{},"f:tekton.dev/pipelineTask":{},"f:tekton.dev/taskRun":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"build\"}":{".":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:resources":{},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{},"f:volumeMounts":{".":{},"k:{\"mountPath\":\"/workspace/0\"}":{".":{},"f:mountPath":{},"f:name":{}}}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{},"f:volumes":{".":{},"k:{\"name\":\"claim-0\"}":{".":{},"f:name":{},"f:persistentVolumeClaim":{".":{},"f:claimName":{}}}}}}},{"manager":"kubectl-patch","operation":"Update","apiVersion":"v1","time":"2026-12-03T13:00:59Z","fieldsType":"FieldsV1","fieldsV1":{"f:status":{"f:phase":{}}},"subresource":"status"}]},"spec":{"volumes":[{"name":"claim-0","persistentVolumeClaim":{"claimName":"nb-00001-build-workspace"}},{"name":"kube-api-access-whht9","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}},{"downwardAPI":{"items":[{"path":"namespace","fieldRef":{"apiVersion":"v1","fieldPath":"metadata.namespace"}}]}}],"defaultMode":420}}],"containers":[{"name":"build","image":"registry.example.com/notebook-build:latest","resources":{},"volumeMounts":[{"name":"claim-0","mountPath":"/workspace/0"},{"name":"kube-api-access-whht9","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"Always"}],"restartPolicy":"Never","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},"status":{"phase":"Succeeded","qosClass":"BestEffort"}}}"#;

const CLAIM: &str = r#"{"type":"ADDED","object":{"kind":"PersistentVolumeClaim","apiVersion":"v1","metadata":{"name":"nb-00001-build-workspace","namespace":"team-00","uid":"9a0c39c4-b157-4636-95da-2b08ab710f98","resourceVersion":"230","creationTimestamp":"2026-12-03T13:00:59Z","labels":{"app.kubernetes.io/component":"tekton-build","app.kubernetes.io/managed-by":"jupyter-notebook-validator-operator","mlops.redhat.com/build-workspace":"true"},"ownerReferences":[{"apiVersion":"mlops.mlops.dev/v1alpha1","kind":"NotebookValidationJob","name":"nb-00001","uid":"65270e3d-e3af-476e-8672-791403b0dcf5"}],"finalizers":["kubernetes.io/pvc-protection"],"managedFields":[{"manager":"kubectl-create","operation":"Update","apiVersion":"v1","time":"2026-12-03T13:00:59Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app.kubernetes.io/component":{},"f:app.kubernetes.io/managed-by":{},"f:mlops.redhat.com/build-workspace":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"65270e3d-e3af-476e-8672-791403b0dcf5\"}":{}}},"f:spec":{"f:accessModes":{},"f:resources":{"f:requests":{".":{},"f:storage":{}}},"f:volumeMode":{}}}}]},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}},"volumeMode":"Filesystem"},"status":{"phase":"Pending"}}}"#;

const RUN: &str = r#"{"type":"ADDED","object":{"apiVersion":"tekton.dev/v1","kind":"PipelineRun","metadata":{"creationTimestamp":"2026-12-03T13:00:59Z","generation":1,"labels":{"app":"nb-00001","mlops.redhat.com/notebook-validation":"true"},"managedFields":[{"apiVersion":"tekton.dev/v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:mlops.redhat.com/notebook-validation":{}}},"f:spec":{".":{},"f:pipelineRef":{".":{},"f:name":{}},"f:taskRunTemplate":{".":{},"f:serviceAccountName":{}},"f:workspaces":{}}},"manager":"kubectl-create","operation":"Update","time":"2026-12-03T13:00:59Z"},{"apiVersion":"tekton.dev/v1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{".":{},"f:completionTime":{},"f:conditions":{},"f:startTime":{}}},"manager":"kubectl-patch","operation":"Update","subresource":"status","time":"2026-12-03T13:00:59Z"}],"name":"nb-00001-build","namespace":"team-00","resourceVersion":"229","uid":"022df3df-3c57-4136-8403-f2e051556e9c"},"spec":{"pipelineRef":{"name":"nb-00001-pipeline"},"taskRunTemplate":{"serviceAccountName":"pipeline"},"workspaces":[{"name":"shared-workspace","persistentVolumeClaim":{"claimName":"nb-00001-build-workspace"}}]},"status":{"completionTime":"2026-12-03T10:00:00Z","conditions":[{"lastTransitionTime":"2026-12-03T10:00:00Z","message":"PipelineRun Succeeded","reason":"Succeeded","status":"True","type":"Succeeded"}],"startTime":"2026-12-03T09:55:00Z"}}}"#;

const JOB: &str = r#"{"type":"ADDED","object":{"apiVersion":"mlops.mlops.dev/v1alpha1","kind":"NotebookValidationJob","metadata":{"creationTimestamp":"2026-12-03T13:00:58Z","generation":1,"managedFields":[{"apiVersion":"mlops.mlops.dev/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{".":{},"f:notebook":{".":{},"f:git":{".":{},"f:ref":{},"f:url":{}},"f:path":{}}}},"manager":"kubectl-create","operation":"Update","time":"2026-12-03T13:00:58Z"},{"apiVersion":"mlops.mlops.dev/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{".":{},"f:buildStatus":{".":{},"f:buildName":{},"f:completionTime":{},"f:phase":{},"f:strategy":{}},"f:phase":{}}},"manager":"kubectl-patch","operation":"Update","subresource":"status","time":"2026-12-03T13:00:59Z"}],"name":"nb-00001","namespace":"team-00","resourceVersion":"227","uid":"65270e3d-e3af-476e-8672-791403b0dcf5"},"spec":{"notebook":{"git":{"ref":"main","url":"https://git.example.com/notebooks.git"},"path":"notebooks/nb-00001.ipynb"}},"status":{"buildStatus":{"buildName":"nb-00001-build","completionTime":"2026-12-03T10:00:00Z","phase":"Complete","strategy":"tekton"},"phase":"ValidationRunning"}}}"#;

/// `n` watch-event lines from `template`: its build `nb-00001` renamed `nb-{i}`, and its
/// resourceVersion and every UID (its own, its owner's) made unique.
fn events(template: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let line = (template.replace("nb-00001", &format!("nb-{i:06}"))).replacen(
                "\"resourceVersion\":\"",
                &format!("\"resourceVersion\":\"{i}"),
                1,
            );
            let mut parts = line.split("\"uid\":\"");
            let first = parts.next().unwrap_or_default().to_owned();
            parts.fold(first, |line, part| {
                format!(
                    "{line}\"uid\":\"{i:08x}{}",
                    part.get(8..).unwrap_or_default()
                )
            })
        })
        .collect()
}

/// Decodes and converts every line; the entries and the seconds it took.
fn decode<K: DeserializeOwned + Clone, E>(lines: &[String], convert: fn(&K) -> E) -> (Vec<E>, f64) {
    let start = Instant::now();
    let entries = lines
        .iter()
        .map(|line| match serde_json::from_str::<WatchEvent<K>>(line) {
            Ok(WatchEvent::Added(object)) => convert(&object),
            other => panic!("not an ADDED event: {:?}", other.map(|_| ())),
        })
        .collect();
    (entries, start.elapsed().as_secs_f64())
}

/// One kind: decoding and converting (best of three), applying as an initial list, and the
/// bytes the index holds per entry.
fn measure<K: DeserializeOwned + Clone, E>(
    what: &str,
    template: &str,
    n: usize,
    convert: fn(&K) -> E,
    wrap: fn(Change<E>) -> Update,
) -> f64 {
    let lines = events(template, n);
    let bytes = lines.iter().map(String::len).sum::<usize>() / n;
    let decoding = (0..3)
        .map(|_| decode(&lines, convert).1)
        .fold(f64::MAX, f64::min);
    let held = HELD.load(Ordering::Relaxed);
    let (entries, _) = decode(&lines, convert);
    let mut index = Index::default();
    let start = Instant::now();
    index.update(wrap(Change::Init(None)));
    for entry in entries {
        index.update(wrap(Change::InitApply(None, entry)));
    }
    index.update(wrap(Change::InitDone(None)));
    let applying = start.elapsed().as_secs_f64();
    let kept = HELD.load(Ordering::Relaxed) - held;
    let per = |seconds: f64| seconds * 1e6 / n as f64;
    println!(
        "{what:<9} {bytes:>5} B an event   decode {:>5.2} µs   index {:>5.2} µs   held {:>4} B an entry",
        per(decoding),
        per(applying),
        kept / n as isize,
    );
    drop(index);
    per(decoding)
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .map_or(50_000, |n| n.parse().expect("OBJECTS_PER_KIND is a number"));
    println!("{n} objects of each kind");
    let pod = measure::<PodVolumes, _>("pods", POD, n, resources::pod_entry, Update::Pod);
    let claim =
        measure::<ClaimObject, _>("claims", CLAIM, n, resources::claim_facts, Update::Claim);
    let run = measure::<OwnerObject, _>("runs", RUN, n, resources::run_entry, Update::Run);
    let job = measure::<OwnerObject, _>("jobs", JOB, n, resources::job_entry, Update::Job);
    println!(
        "decode per build: {:.1} µs with two pods, {:.1} µs with one",
        claim + run + job + 2.0 * pod,
        claim + run + job + pod
    );
}
