//! The fault injector: kube-apiserver and etcd killed and restarted, etcd compacted under both
//! replicas, the leader alone partitioned or its watches stalled, the leader SIGKILLed, a restart
//! storm within one window of the cap, throttling bursts on the leader's connection, and
//! requests a hop holds and forwards after the leader gave up (DELETEs and Lease writes, with
//! the leader paused or not), and the delete protocol's ordinary faults (a webhook that is
//! down, lost answers, revocations that change nothing); each recorded as a [`Window`] for the
//! report.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::load::{Driver, Rng};
use crate::replicas::Replica;
use crate::{CAP, LEASE_DURATION, LEASE_NAMESPACE, RECHECK_BOUND, SLOW_LIST, now, seconds};
use testkit::{AuditEvent, ControlPlane, Fault, Forwarded, Rule, webhook_that_is_down};

#[derive(Debug, Clone)]
pub struct Window {
    pub fault: &'static str,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

pub struct Faults {
    pub cp: Arc<ControlPlane>,
    pub driver: Arc<Driver>,
    pub replicas: Vec<Replica>,
    pub windows: Vec<Window>,
    pub crashes: u32,
    /// Throttling bursts so far.
    pub throttles: usize,
    /// The fault kinds left in this round.
    pub order: Vec<usize>,
    /// Held-and-forwarded faults so far.
    pub holds: usize,
    /// Delete-protocol faults so far.
    pub protocol: usize,
}

impl Faults {
    /// A fault every `fault_every` to twice that many seconds until 20 s before `end`,
    /// noticing crashes meanwhile.
    pub async fn run(&mut self, mut rng: Rng, fault_every: u64, end: DateTime<Utc>) {
        loop {
            let wait = Duration::from_secs(rng.between(fault_every, 2 * fault_every));
            let deadline = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.check_crashes();
            }
            if now() + seconds(20) >= end {
                break;
            }
            self.inject(&mut rng).await;
        }
    }

    /// The requests the proxies refused, as the audit log would have recorded them: the API
    /// server never saw them, but the invariant counts them as attempts.
    pub fn refused_requests(&self) -> Vec<AuditEvent> {
        self.replicas
            .iter()
            .flat_map(|r| r.proxy.faulted())
            .filter(|f| f.fault.refuses())
            .map(|f| f.as_audit_event())
            .collect()
    }

    /// The requests the hops held and forwarded late, with the API server's answers.
    pub fn forwarded(&self) -> Vec<Forwarded> {
        self.replicas
            .iter()
            .flat_map(|r| r.proxy.forwarded())
            .collect()
    }

    /// The leader's next DELETEs of claims and its next Lease write are held by the hop on
    /// its connection, with 10 claims due at once, and forwarded only after the leader gave
    /// up on them (its deadline is at most the re-check bound): as an L7 load balancer that
    /// serves requests whose client left. Every other time the leader is paused (SIGSTOP)
    /// meanwhile, for longer than the lease, so that the other replica takes over and must
    /// revoke what the Lease names in flight; the hop forwards once it has.
    async fn hold_and_forward(&mut self, rng: &mut Rng) {
        let target = self.leader().await.unwrap_or(0);
        self.holds += 1;
        let paused = self.holds.is_multiple_of(2);
        println!(
            "soak: holding {}'s DELETEs and a Lease write{}",
            self.replicas[target].name,
            if paused { ", and pausing it" } else { "" }
        );
        let proxy = &self.replicas[target].proxy;
        let held = [
            proxy.add(
                Rule::new("delete", "persistentvolumeclaims", Fault::HoldAndForward)
                    .times(rng.between(1, 4)),
            ),
            proxy.add(Rule::new("patch", "leases", Fault::HoldAndForward).times(1)),
        ];
        self.driver.burst(10).await;
        let pause = self.replicas[target].process.as_ref().map(|p| p.pid());
        let signal = |signal: &str, pid: u32| {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .status();
        };
        if paused && let Some(pid) = pause {
            tokio::time::sleep(Duration::from_secs(rng.between(1, 3))).await;
            signal("STOP", pid);
            // Longer than the lease: the other replica takes over, and revokes first.
            tokio::time::sleep(LEASE_DURATION * 2 + Duration::from_secs(rng.between(2, 6))).await;
        } else {
            tokio::time::sleep(RECHECK_BOUND + Duration::from_secs(rng.between(1, 8))).await;
        }
        let proxy = &self.replicas[target].proxy;
        for rule in held {
            proxy.remove(rule);
        }
        if paused && let Some(pid) = pause {
            signal("CONT", pid);
        }
    }

    pub async fn leader(&self) -> Option<usize> {
        let lease = Api::<Lease>::namespaced(self.driver.client.clone(), LEASE_NAMESPACE)
            .get_opt("workspace-gc")
            .await
            .ok()??;
        let holder = lease.spec?.holder_identity?;
        self.replicas.iter().position(|r| r.name == holder)
    }

    /// Notices a replica that exited by itself: a crash, which the run reports.
    pub fn check_crashes(&mut self) {
        for replica in &mut self.replicas {
            if let Some(process) = &mut replica.process
                && let Some(status) = process.exited()
            {
                eprintln!("soak: {} exited by itself: {status}", replica.name);
                self.crashes += 1;
                replica.spawn();
            }
        }
    }

    /// SIGKILLs the replica that holds the lease and starts it again after `down`.
    async fn kill_leader(&mut self, down: Duration) {
        let target = self.leader().await.unwrap_or(0);
        let replica = &mut self.replicas[target];
        replica.scrape().await;
        if let Some(process) = replica.process.take() {
            process.kill().await;
        }
        tokio::time::sleep(down).await;
        replica.spawn();
    }

    /// Bursts of one kind of refusal on the leader's connection, on for seconds and off for
    /// seconds, for 10 to 30 s: as an API server whose priority level is saturated answers.
    /// The kinds take turns, DELETEs first, so that a short run has the one that matters most;
    /// each opens with 10 claims due at once.
    pub async fn throttle(&mut self, rng: &mut Rng) {
        let target = self.leader().await.unwrap_or(0);
        let retry_after = rng.between(1, 3);
        self.throttles += 1;
        let (what, rule) = match (self.throttles - 1) % 6 {
            0 => (
                "DELETEs 429",
                Rule::new(
                    "delete",
                    "persistentvolumeclaims",
                    Fault::throttle(retry_after),
                ),
            ),
            1 => (
                "re-check LISTs 429",
                Rule::new("list", "pods", Fault::throttle(retry_after)),
            ),
            2 => (
                "Lease writes 429",
                Rule::new("patch", "leases", Fault::throttle(retry_after)),
            ),
            3 => (
                "everything 503",
                Rule::new(
                    "",
                    "",
                    Fault::Refuse {
                        status: 503,
                        retry_after: Some(retry_after),
                    },
                ),
            ),
            4 => (
                "re-check LISTs answered late",
                Rule::new("list", "pods", Fault::DelayResponse(SLOW_LIST)),
            ),
            // Answered by the hop, which never forwarded them: not carried out, though a 503
            // does not say so.
            _ => (
                "DELETEs 503 from the hop",
                Rule::new("delete", "persistentvolumeclaims", Fault::unavailable()),
            ),
        };
        println!(
            "soak: throttling {} ({what}, Retry-After {retry_after} s)",
            self.replicas[target].name
        );
        let proxy = &self.replicas[target].proxy;
        let end = tokio::time::Instant::now() + Duration::from_secs(rng.between(10, 30));
        let mut first = true;
        while tokio::time::Instant::now() < end {
            let burst = proxy.add(rule.clone());
            if std::mem::take(&mut first) {
                // Claims due at once: the refusals meet deletion work whenever they come.
                self.driver.burst(10).await;
            }
            tokio::time::sleep(Duration::from_secs(rng.between(2, 6))).await;
            proxy.remove(burst);
            tokio::time::sleep(Duration::from_secs(rng.between(1, 3))).await;
        }
    }

    /// The delete protocol's ordinary faults, taking turns, each for 15 to 40 s and opening with
    /// 10 claims due at once: a validating webhook on claim DELETEs whose pods are down
    /// (`failurePolicy: Fail`: the API server answers each 500, a refusal); the leader's claim
    /// DELETEs carried out with their answers lost; and its DELETEs answered 503 by the hop
    /// (never forwarded) with their revocations' answers lost, so that each revocation is sent
    /// again and writes the value already there (no new resourceVersion, no event).
    async fn delete_protocol(&mut self, rng: &mut Rng) {
        let target = self.leader().await.unwrap_or(0);
        self.protocol += 1;
        let proxy = &self.replicas[target].proxy;
        let claims = |verb, fault| Rule::new(verb, "persistentvolumeclaims", fault);
        let (what, rules) = match (self.protocol - 1) % 3 {
            0 => ("a webhook on claim DELETEs is down", Vec::new()),
            1 => (
                "the leader's DELETE answers are lost",
                vec![proxy.add(claims("delete", Fault::LoseResponse))],
            ),
            _ => (
                "the leader's DELETEs 503 from the hop, its revocations' answers lost",
                vec![
                    proxy.add(claims("delete", Fault::unavailable())),
                    proxy.add(claims("patch", Fault::LoseResponse).times(rng.between(1, 6))),
                ],
            ),
        };
        println!("soak: {what} ({})", self.replicas[target].name);
        let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(self.driver.client.clone());
        let webhook = rules
            .is_empty()
            .then(|| webhook_that_is_down(DOWN_WEBHOOK, None));
        if let Some(webhook) = &webhook {
            webhooks
                .create(&PostParams::default(), webhook)
                .await
                .expect("create the webhook that is down");
        }
        self.driver.burst(10).await;
        tokio::time::sleep(Duration::from_secs(rng.between(15, 40))).await;
        if webhook.is_some() {
            webhooks
                .delete(DOWN_WEBHOOK, &DeleteParams::default())
                .await
                .expect("remove the webhook that is down");
        }
        let proxy = &self.replicas[target].proxy;
        for rule in rules {
            proxy.remove(rule);
        }
    }

    /// Injects the next fault: each kind in turn, in an order shuffled per round, so a run of
    /// eight faults or more has every kind.
    async fn inject(&mut self, rng: &mut Rng) {
        if self.order.is_empty() {
            let mut kinds: Vec<usize> = (0..10).collect();
            for i in (1..kinds.len()).rev() {
                kinds.swap(i, rng.below(i + 1));
            }
            if self.windows.is_empty() {
                // The first round opens with a throttling burst, held-and-forwarded requests,
                // a delete-protocol fault, the restart storm and the leader's partition, so that
                // even a short run has them.
                kinds.retain(|&k| ![3, 6, 7, 8, 9].contains(&k));
                kinds.extend([3, 6, 9, 8, 7]);
            }
            self.order = kinds;
        }
        let kind = self.order.pop().unwrap_or(0);
        let start = now();
        let fault = match kind {
            0 => {
                let _pause = self.driver.gate.write().await;
                self.cp.stop_component("kube-apiserver", true).await;
                tokio::time::sleep(Duration::from_secs(rng.between(5, 15))).await;
                self.cp.start_component("kube-apiserver").await;
                "apiserver-restart"
            }
            1 => {
                let _pause = self.driver.gate.write().await;
                self.cp.stop_component("etcd", true).await;
                tokio::time::sleep(Duration::from_secs(rng.between(3, 8))).await;
                self.cp.start_component("etcd").await;
                // The API server answers again once it has reconnected to etcd.
                for _ in 0..300 {
                    if self.driver.client.apiserver_version().await.is_ok()
                        && Api::<Namespace>::all(self.driver.client.clone())
                            .list(&ListParams::default().limit(1))
                            .await
                            .is_ok()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                "etcd-restart"
            }
            2 => {
                // Both replicas lose their watches while etcd forgets the history they would
                // resume from: 410 Gone and a re-list each.
                for replica in &self.replicas {
                    replica.proxy.cut();
                }
                tokio::time::sleep(Duration::from_secs(rng.between(2, 6))).await;
                self.cp.compact_etcd().await;
                for replica in &self.replicas {
                    replica.proxy.heal();
                }
                "compaction"
            }
            3 => {
                let target = self.leader().await.unwrap_or(0);
                self.replicas[target].proxy.cut();
                tokio::time::sleep(Duration::from_secs(rng.between(5, 25))).await;
                self.replicas[target].proxy.heal();
                "partition"
            }
            4 => {
                let target = self.leader().await.unwrap_or(0);
                self.replicas[target].proxy.stall();
                tokio::time::sleep(Duration::from_secs(rng.between(10, 30))).await;
                self.replicas[target].proxy.unstall();
                "stall"
            }
            5 => {
                self.kill_leader(Duration::from_secs(rng.between(3, 10)))
                    .await;
                "leader-kill"
            }
            7 => {
                self.throttle(rng).await;
                "throttle"
            }
            8 => {
                self.hold_and_forward(rng).await;
                "hold"
            }
            9 => {
                self.delete_protocol(rng).await;
                "delete-protocol"
            }
            _ => {
                // A burst that meets the cap, then whoever leads is killed and restarted four
                // times within one window: each new process must count from the Lease.
                self.driver.burst(CAP).await;
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_secs(rng.between(1, 3))).await;
                    self.kill_leader(Duration::from_millis(rng.between(200, 1500)))
                        .await;
                }
                "restart-storm"
            }
        };
        let end = now();
        println!(
            "soak: {fault} from {} to {} ({} s)",
            start.format("%H:%M:%S"),
            end.format("%H:%M:%S"),
            (end - start).num_seconds()
        );
        self.windows.push(Window { fault, start, end });
    }
}

const DOWN_WEBHOOK: &str = "soak-webhook-down";
