//! The cost of a standing failure (issue 46, class 3): the requests a minute the daemon sends
//! while every claim DELETE fails the same way, for one due claim and for many, as the shipped
//! identity (its Role derived from manifests/) with the shipped configuration.
//!
//!     cargo bench --bench failure_cost [-- --claims 1000 --minutes 8]
//!
//! The failures (`--failures`), side by side on one local control plane, each for `--minutes`:
//!
//! - **webhook down**: a validating webhook on claim DELETEs whose pods are down
//!   (`failurePolicy: Fail`): the API server answers every DELETE 500 "failed calling webhook",
//!   a refusal;
//! - **RBAC denied**: the daemon's Role loses `delete` on claims once its token is issued: the
//!   API server's own 403, a refusal;
//! - **unanswered**: a hop that resets every claim DELETE: never carried out, but the daemon
//!   cannot know, so each is revoked;
//! - **cap full**: a hop that resets every claim DELETE and every revocation, so the DELETEs
//!   sent stay outstanding and hold the blast-radius cap (`--claims` only).
//!
//! For each, two daemons (release binary), each in a namespace of its own with its own Lease:
//! one with 1 due claim, one with `--claims`; and one more daemon with nothing due and no
//! failure, whose requests are the fixed cost (Lease renewals, watches) every daemon pays. Each
//! daemon's requests pass an HTTP proxy that counts them by kind; the counts are read every
//! minute. Rewrites bench/FAILURE-COST.md.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::Role;
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
    /// The failures to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "webhook,rbac,unanswered,cap-full"
    )]
    failures: Vec<Failure>,
    /// Where the report goes.
    #[arg(long, default_value = "bench/FAILURE-COST.md")]
    out: PathBuf,
}

/// How every claim DELETE fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Failure {
    /// Nothing due and nothing failing: the fixed cost.
    #[value(skip)]
    None,
    #[value(name = "webhook")]
    WebhookDown,
    #[value(name = "rbac")]
    RbacDenied,
    Unanswered,
    CapFull,
}

impl Failure {
    fn name(self) -> &'static str {
        match self {
            Failure::None => "no failure, nothing due (the fixed cost)",
            Failure::WebhookDown => "webhook down (500, a refusal)",
            Failure::RbacDenied => "RBAC denied (the API server's 403, a refusal)",
            Failure::Unanswered => "unanswered (reset, never carried out)",
            Failure::CapFull => "cap full (DELETEs and revocations reset)",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Failure::None => "cost-idle",
            Failure::WebhookDown => "cost-webhook",
            Failure::RbacDenied => "cost-rbac",
            Failure::Unanswered => "cost-unanswered",
            Failure::CapFull => "cost-capfull",
        }
    }

    /// The numbers of due claims measured: a cap can only fill with more claims than it holds.
    fn sizes(self, claims: usize) -> Vec<usize> {
        match self {
            Failure::None => vec![0],
            Failure::CapFull => vec![claims],
            _ => vec![1, claims],
        }
    }
}

/// The report's columns that are the fixed cost: the election's Lease reads and writes, and the
/// watches' renewals (the idle daemon's of the same minute).
const FIXED: [&str; 3] = ["Lease writes", "GETs", "watches"];

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
        match failure {
            Failure::WebhookDown => webhook_down(&ns).await?,
            // The token was issued once every shipped right was granted; now one is taken.
            Failure::RbacDenied => deny_deletes(&ns, "gc").await?,
            Failure::None | Failure::Unanswered | Failure::CapFull => {}
        }
        // First match wins: the failure's own rule, then one counter a kind.
        let mut rules = Vec::new();
        for (_, verb, resource) in KINDS {
            let fault = match (failure, verb, resource) {
                (Failure::Unanswered | Failure::CapFull, "delete", "persistentvolumeclaims")
                | (Failure::CapFull, "patch", "persistentvolumeclaims") => Fault::Reset,
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
        let daemon = match failure {
            Failure::RbacDenied => daemon.expecting_denials(),
            _ => daemon,
        };
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

/// Takes `delete` on claims from the Role `role` (the shipped rules), as an admin who narrowed
/// it would: the API server then answers every claim DELETE 403.
async fn deny_deletes(ns: &TestNamespace, role: &str) -> Result<()> {
    let roles: Api<Role> = ns.api();
    let mut narrowed = roles.get(role).await?;
    for rule in narrowed.rules.iter_mut().flatten() {
        if (rule.resources.iter().flatten()).any(|r| r == "persistentvolumeclaims") {
            rule.verbs.retain(|verb| verb != "delete");
        }
    }
    roles
        .replace(role, &PostParams::default(), &narrowed)
        .await?;
    Ok(())
}

/// The sum of the kinds in `FIXED` of one minute's counts.
fn fixed_of(counts: &[u64]) -> u64 {
    (KINDS.iter().zip(counts))
        .filter(|((name, _, _), _)| FIXED.contains(name))
        .map(|(_, count)| count)
        .sum()
}

/// The minutes shown: every one of the first ten, then every fifth, and the last.
fn shown(minutes: usize) -> impl Iterator<Item = usize> {
    (0..minutes).filter(move |m| *m < 10 || (m + 1) % 5 == 0 || m + 1 == minutes)
}

/// Mean over the last (up to) five minutes of `per_minute`.
fn settled(per_minute: &[u64]) -> f64 {
    let last = &per_minute[per_minute.len().saturating_sub(5)..];
    last.iter().sum::<u64>() as f64 / last.len().max(1) as f64
}

fn report(options: &Options, subjects: &[Subject], version: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# The cost of a standing DELETE failure\n");
    let failures: Vec<String> = (options.failures.iter())
        .map(|f| {
            clap::ValueEnum::to_possible_value(f)
                .map_or_else(String::new, |v| v.get_name().to_owned())
        })
        .collect();
    let _ = writeln!(
        out,
        "Written by `cargo bench --bench failure_cost -- --claims {} --minutes {} --failures {}` \
         ({}; Kubernetes {version}; the shipped configuration: 5 deletes a second, at most 100 \
         deletions in 10 minutes; the shipped Role). Requests the daemon sent in each minute \
         of the failure, counted by the proxy in front of it. **Fixed** is what a daemon with \
         nothing due sent in the same minute (its Lease writes and reads, and its watches' \
         renewals: the election's and the cache's cost, there whatever the claims do); \
         **retries** is the rest (all − fixed), the cost of the failing claims. With many claims \
         due, each DELETE's fencing Lease write also renews the Lease, so the renewals' own \
         reads and writes stop and retries is then a slight underestimate. Minutes 1 to 10 are \
         shown, then every fifth. See RELIABILITY.md, \"What a standing failure costs\".\n",
        options.claims,
        options.minutes,
        failures.join(","),
        chrono::Utc::now().format("%Y-%m-%d"),
    );
    let idle = subjects.iter().find(|s| s.failure == Failure::None);
    let fixed_in = |m: usize| idle.map_or(0, |idle| fixed_of(&idle.in_minute(m)));
    let _ = writeln!(
        out,
        "## Settled: the mean of the last five minutes\n\n\
         | failure | due claims | claim DELETEs a minute | all requests a minute | fixed | \
         retries | retries a minute per due claim |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for subject in subjects.iter().filter(|s| s.failure != Failure::None) {
        let minutes = subject.minutes.len();
        let per_minute = |f: &dyn Fn(usize) -> u64| (0..minutes).map(f).collect::<Vec<u64>>();
        let deletes = settled(&per_minute(&|m| subject.in_minute(m)[0]));
        let all = settled(&per_minute(&|m| subject.in_minute(m).iter().sum()));
        let fixed = settled(&per_minute(&fixed_in));
        let retries = (all - fixed).max(0.0);
        let _ = writeln!(
            out,
            "| {} | {} | {deletes:.1} | {all:.1} | {fixed:.1} | {retries:.1} | {:.2} |",
            subject.failure.name(),
            subject.claims,
            retries / subject.claims.max(1) as f64,
        );
    }
    let _ = writeln!(out);
    for subject in subjects {
        let _ = writeln!(
            out,
            "## {}, {} due claim{}\n",
            subject.failure.name(),
            subject.claims,
            if subject.claims == 1 { "" } else { "s" }
        );
        let header: Vec<&str> = KINDS.iter().map(|(name, _, _)| *name).collect();
        let _ = writeln!(
            out,
            "| minute | {} | all | fixed | retries | retries per due claim |",
            header.join(" | ")
        );
        let _ = writeln!(
            out,
            "|---:|{}---:|---:|---:|---:|",
            "---:|".repeat(KINDS.len())
        );
        for m in shown(subject.minutes.len()) {
            let counts = subject.in_minute(m);
            let cells: Vec<String> = counts.iter().map(u64::to_string).collect();
            let all: u64 = counts.iter().sum();
            let fixed = fixed_in(m);
            let retries = all.saturating_sub(fixed);
            let per_claim = match subject.claims {
                0 => "–".to_owned(),
                n => format!("{:.2}", retries as f64 / n as f64),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {all} | {fixed} | {retries} | {per_claim} |",
                m + 1,
                cells.join(" | ")
            );
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
    let failures = std::iter::once(Failure::None).chain(options.failures.iter().copied());
    for failure in failures {
        for claims in failure.sizes(options.claims) {
            let prefix = format!("{}-{claims}", failure.prefix());
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
