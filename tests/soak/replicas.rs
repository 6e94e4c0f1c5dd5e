//! The daemon under test: its identity (the shipped RBAC, one ServiceAccount per replica, so
//! that the audit log tells them apart) and its replicas, each the real binary through its own
//! fault proxy, one of them optionally under libfaketime.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;

use crate::{CAP, LEASE_DURATION, LEASE_NAMESPACE, MAX_AGE, REPLICAS, TTL, WINDOW};
use testkit::{Process, Proxy};

pub struct Replica {
    pub name: &'static str,
    pub orphan_grace: i64,
    /// libfaketime's variables, for a replica with a skewed clock.
    pub clock: Vec<(&'static str, String)>,
    pub proxy: Proxy,
    pub kubeconfig: PathBuf,
    pub logs: PathBuf,
    pub process: Option<Process>,
    pub spawns: u32,
    pub metrics: String,
}

impl Replica {
    pub fn spawn(&mut self) {
        self.spawns += 1;
        let log = self.logs.join(format!("{}.{}.log", self.name, self.spawns));
        let vars: Vec<(&str, String)> = vec![
            ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", format!("{TTL}s")),
            (
                "WORKSPACE_GC_POLICY_ORPHAN_GRACE",
                format!("{}s", self.orphan_grace),
            ),
            ("WORKSPACE_GC_POLICY_MAX_AGE", format!("{MAX_AGE}s")),
            ("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "50".into()),
            (
                "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
                CAP.to_string(),
            ),
            ("WORKSPACE_GC_DELETION_WINDOW", format!("{WINDOW}s")),
            (
                "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
                LEASE_NAMESPACE.into(),
            ),
            (
                "WORKSPACE_GC_LEADER_ELECTION_LEASE_DURATION",
                format!("{}s", LEASE_DURATION.as_secs()),
            ),
        ];
        let vars = [vars, self.clock.clone()].concat();
        self.process = Some(Process::spawn(&self.kubeconfig, &vars, self.name, &log));
    }

    pub async fn scrape(&mut self) {
        if let Some(process) = &self.process {
            let (status, body) = process.get("/metrics").await;
            if status == 200 {
                self.metrics = body;
            }
        }
    }
}

pub async fn install_daemon_identity(client: &Client) {
    let post = PostParams::default();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(LEASE_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&post, &ns)
        .await
        .expect("the daemon's namespace");
    for name in REPLICAS
        .iter()
        .map(|(_, account)| *account)
        .chain(["default"])
    {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        let _ = Api::<ServiceAccount>::namespaced(client.clone(), LEASE_NAMESPACE)
            .create(&post, &account)
            .await;
    }
    // The shipped RBAC, with the binding subjects' namespace that kustomize would set, and
    // each binding naming every replica's account.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base");
    for file in ["rbac-cluster.yaml", "rbac-lease.yaml"] {
        let text = std::fs::read_to_string(base.join(file)).expect("read the shipped RBAC");
        for mut value in serde_saphyr::from_multiple::<Value>(&text).expect("YAML documents") {
            if let Some(subjects) = value.get_mut("subjects").and_then(Value::as_array_mut) {
                for subject in subjects.iter_mut() {
                    subject["namespace"] = LEASE_NAMESPACE.into();
                }
                let shipped = subjects.clone();
                for (_, account) in &REPLICAS[1..] {
                    subjects.extend(shipped.iter().map(|subject| {
                        let mut subject = subject.clone();
                        subject["name"] = (*account).into();
                        subject
                    }));
                }
            }
            match value["kind"].as_str() {
                Some("ClusterRole") => {
                    let role: ClusterRole = serde_json::from_value(value).expect("ClusterRole");
                    Api::<ClusterRole>::all(client.clone())
                        .create(&post, &role)
                        .await
                        .map(|_| ())
                }
                Some("ClusterRoleBinding") => {
                    let binding: ClusterRoleBinding =
                        serde_json::from_value(value).expect("ClusterRoleBinding");
                    Api::<ClusterRoleBinding>::all(client.clone())
                        .create(&post, &binding)
                        .await
                        .map(|_| ())
                }
                Some("Role") => {
                    let role: Role = serde_json::from_value(value).expect("Role");
                    Api::<Role>::namespaced(client.clone(), LEASE_NAMESPACE)
                        .create(&post, &role)
                        .await
                        .map(|_| ())
                }
                Some("RoleBinding") => {
                    let binding: RoleBinding = serde_json::from_value(value).expect("RoleBinding");
                    Api::<RoleBinding>::namespaced(client.clone(), LEASE_NAMESPACE)
                        .create(&post, &binding)
                        .await
                        .map(|_| ())
                }
                other => panic!("unexpected {other:?} in {file}"),
            }
            .expect("install the shipped RBAC");
        }
    }
}
