//! The cost of a standing failure (issue 46, class 3): the requests a minute the daemon sends
//! while every claim DELETE fails the same way, for one due claim and for many, as the shipped
//! identity (its Role derived from manifests/) with the shipped configuration.
//!
//!     cargo bench --bench failure_cost [-- --claims 1000 --minutes 8]
//!
//! Two failures, side by side on one local control plane, each for `--minutes`:
//!
//! - **webhook down**: a validating webhook on claim DELETEs whose pods are down
//!   (`failurePolicy: Fail`): the API server answers every DELETE 500 "failed calling webhook",
//!   a refusal;
//! - **unanswered**: a hop that resets every claim DELETE: never carried out, but the daemon
//!   cannot know, so each is revoked.
//!
//! For each, two daemons (release binary), each in a namespace of its own with its own Lease:
//! one with 1 due claim, one with `--claims`. Each daemon's requests pass an HTTP proxy that
//! counts them by kind; the counts are read every minute. Rewrites bench/FAILURE-COST.md.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use testkit::{
    ControlPlane, Fault, Process, Proxy, Rule, RuleId, TestNamespace, expiring, in_secs,
    replica_through, service_account, webhook_that_is_down,
};

#[derive(Debug, Parser)]
#[command(
    name = "failure_cost",
    about = "requests a minute under a standing DELETE failure"
)]
struct Options {
    /// Due claims in the large namespace of each failure.
    #[arg(long, default_value_t = 1000)]
    claims: usize,
    /// How long each failure stands, in minutes.
    #[arg(long, default_value_t = 8)]
    minutes: u64,
    /// Where the report goes.
    #[arg(long, default_value = "bench/FAILURE-COST.md")]
    out: PathBuf,
}

/// How every claim DELETE fails.
#[derive(Debug, Clone, Copy)]
enum Failure {
    WebhookDown,
    Unanswered,
}

impl Failure {
    fn name(self) -> &'static str {
        match self {
            Failure::WebhookDown => "webhook down (500, a refusal)",
            Failure::Unanswered => "unanswered (reset, never carried out)",
        }
    }
}

/// The kinds of request counted, in the report's column order; a request counts in the first
/// that matches, the last counts the rest.
const KINDS: [(&str, &str, &str); 9] = [
    ("claim DELETEs", "delete", "persistentvolumeclaims"),
    (
        "claim PATCHes (revocations)",
        "patch",
        "persistentvolumeclaims",
    ),
    ("Lease writes", "patch", "leases"),
    ("pod LISTs", "list", "pods"),
    ("other LISTs", "list", ""),
    ("events", "", "events"),
    ("watches", "watch", ""),
    ("GETs", "get", ""),
    ("other", "", ""),
];

/// One daemon under one failure, and its counters.
struct Subject {
    failure: Failure,
    claims: usize,
    ns: TestNamespace,
    proxy: Proxy,
    rules: Vec<RuleId>,
    daemon: Option<Process>,
    _logs: tempfile::TempDir,
    /// The counts at the end of each minute.
    minutes: Vec<Vec<u64>>,
}

impl Subject {
    async fn start(
        cp: &ControlPlane,
        failure: Failure,
        claims: usize,
        prefix: &str,
    ) -> Result<Subject> {
        let ns = TestNamespace::new(cp, prefix).await;
        let proxy = Proxy::http(cp).await;
        let kubeconfig = replica_through(cp, &ns, "gc", &proxy).await;
        let user = service_account(ns.name(), "gc");
        if let Failure::WebhookDown = failure {
            webhook_down(&ns).await?;
        }
        // First match wins: the failure's own rule, then one counter a kind.
        let mut rules = Vec::new();
        for (_, verb, resource) in KINDS {
            let fault = match (failure, verb, resource) {
                (Failure::Unanswered, "delete", "persistentvolumeclaims") => Fault::Reset,
                _ => Fault::DelayRequest(Duration::ZERO),
            };
            rules.push(proxy.add(Rule::new(verb, resource, fault).user(user.clone())));
        }
        futures::stream::iter(0..claims)
            .map(|i| {
                let ns = &ns;
                async move {
                    let name = format!("job-{i:05}-build-workspace");
                    expiring(&name, in_secs(-60)).create(ns).await;
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
        let logs = tempfile::tempdir().context("a log directory")?;
        let vars = vec![
            ("WORKSPACE_GC_SELECTOR_NAMESPACES", ns.name().to_owned()),
            (
                "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
                ns.name().to_owned(),
            ),
        ];
        let daemon = Process::spawn(&kubeconfig, &vars, "gc", &logs.path().join("gc.log"));
        Ok(Subject {
            failure,
            claims,
            ns,
            proxy,
            rules,
            daemon: Some(daemon),
            _logs: logs,
            minutes: Vec::new(),
        })
    }

    fn count(&mut self) {
        let counts = self
            .rules
            .iter()
            .map(|rule| self.proxy.hits(*rule))
            .collect();
        self.minutes.push(counts);
    }

    /// The requests of each kind in minute `m` (from 0).
    fn in_minute(&self, m: usize) -> Vec<u64> {
        let before = m.checked_sub(1).map(|b| self.minutes[b].clone());
        let after = &self.minutes[m];
        (0..after.len())
            .map(|k| after[k] - before.as_ref().map_or(0, |b| b[k]))
            .collect()
    }
}

/// A validating webhook on the namespace's claim DELETEs that nothing serves.
async fn webhook_down(ns: &TestNamespace) -> Result<()> {
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(ns.client().clone());
    let name = format!("{}-down", ns.name());
    let webhook = webhook_that_is_down(&name, Some(ns.name()));
    webhooks.create(&PostParams::default(), &webhook).await?;
    Ok(())
}

fn report(options: &Options, subjects: &[Subject], version: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# The cost of a standing DELETE failure\n");
    let _ = writeln!(
        out,
        "Written by `cargo bench --bench failure_cost -- --claims {} --minutes {}` ({}; \
         Kubernetes {version}; the shipped configuration: 5 deletes a second, at most 100 \
         deletions in 10 minutes; the shipped Role). Requests the daemon sent in each minute \
         of the failure, counted by the proxy in front of it. See RELIABILITY.md, \"What a \
         standing failure costs\".\n",
        options.claims,
        options.minutes,
        chrono::Utc::now().format("%Y-%m-%d"),
    );
    for subject in subjects {
        let _ = writeln!(
            out,
            "## {}, {} due claim{}\n",
            subject.failure.name(),
            subject.claims,
            if subject.claims == 1 { "" } else { "s" }
        );
        let header: Vec<&str> = KINDS.iter().map(|(name, _, _)| *name).collect();
        let _ = writeln!(out, "| minute | {} | all |", header.join(" | "));
        let _ = writeln!(out, "|---:|{}---:|", "---:|".repeat(KINDS.len()));
        for m in 0..subject.minutes.len() {
            let counts = subject.in_minute(m);
            let cells: Vec<String> = counts.iter().map(u64::to_string).collect();
            let all: u64 = counts.iter().sum();
            let _ = writeln!(out, "| {} | {} | {all} |", m + 1, cells.join(" | "));
        }
        let _ = writeln!(out);
    }
    out
}

#[tokio::main]
async fn main() -> Result<()> {
    // `cargo bench` passes `--bench`.
    let args = std::env::args().filter(|arg| arg != "--bench");
    let options = Options::parse_from(args);
    let cp = ControlPlane::start(true);
    let version = testkit::kubernetes_version();
    let mut subjects = Vec::new();
    for (failure, prefix) in [
        (Failure::WebhookDown, "cost-webhook"),
        (Failure::Unanswered, "cost-unanswered"),
    ] {
        for claims in [1, options.claims] {
            let prefix = format!("{prefix}-{claims}");
            println!("failure_cost: {} with {claims} claims", failure.name());
            subjects.push(Subject::start(&cp, failure, claims, &prefix).await?);
        }
    }
    for minute in 1..=options.minutes {
        tokio::time::sleep(Duration::from_secs(60)).await;
        for subject in &mut subjects {
            subject.count();
        }
        let last: Vec<String> = (subjects.iter())
            .map(|s| format!("{:?}", s.in_minute(s.minutes.len() - 1)))
            .collect();
        println!("failure_cost: minute {minute}: {}", last.join(" "));
    }
    let text = report(&options, &subjects, version);
    for subject in &mut subjects {
        if let Some(daemon) = subject.daemon.take() {
            // A `forbidden` answer to any of its requests fails the run.
            daemon.metrics().await;
            let status = daemon.terminate().await;
            anyhow::ensure!(status.success(), "{}: exit {status}", subject.ns.name());
        }
    }
    std::fs::write(&options.out, &text)
        .with_context(|| format!("write {}", options.out.display()))?;
    println!("{text}");
    Ok(())
}
