//! Reclaim benchmark (issue 8): workspace-gc against a periodic sweep janitor and against
//! owner references plus Kubernetes' garbage collector, on one local control plane and the same
//! objects per size.
//!
//!     cargo bench --bench reclaim [-- --sizes 1000,10000]
//!
//! For each size N it starts `scripts/control-plane up --controller-manager` on a tmpfs
//! (/dev/shm), with an audit log of the contenders' requests, creates N builds (job, run,
//! claim, two pods each; see population.rs), then measures three phases one after the other:
//!
//! 1. Kubernetes' garbage collector (kube-controller-manager): claims with an owner reference to
//!    their job; the benchmark deletes jobs at known instants. kube-controller-manager is then
//!    stopped, so that it cannot race the contenders measured after it (PVC protection stops
//!    with it: claims deleted later stay Terminating, which the benchmark's watch counts as
//!    deleted, the instant the delete took effect).
//! 2. workspace-gc, the release binary, as user `bench:workspace-gc`: start to /readyz, its
//!    initial lists sent again by a plain client (plain.rs), then owner-deleted events (as in
//!    the first phase) interleaved with TTL events (a validating job finishes at a known
//!    instant; the claim is due TTL later).
//! 3. The sweep janitor (sweep.rs), as user `bench:sweep`, on the same kinds of events.
//!
//! Reclaim lag is measured by the benchmark's own watch on claims; requests from the audit log;
//! memory and CPU from /proc. bench/RESULTS.md and its SVG plots (plots.rs) are rewritten at
//! the end.

mod audit;
mod busy;
mod cluster;
mod observe;
mod plain;
mod plots;
mod population;
mod report;
mod results;
mod statistics;
mod sweep;
mod targets;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use chrono::{DateTime, Utc};
use kube::Client;
use testkit::{ControlPlane, scrape};
use tokio::io::AsyncBufReadExt;

use crate::cluster::{DAEMON_USER, KCM_USER, Readings, SWEEP_USER};
use crate::observe::Observer;
use crate::population::{Build, Plan, State, Target};
use crate::results::{Contender, Counts, EventKind, ProcSample, Role, Run, SizeResult, Steady};

/// The benchmark's options (`cargo bench --bench reclaim -- --help`).
#[derive(Debug, Clone, serde::Serialize, clap::Parser)]
#[command(
    name = "reclaim",
    about = "workspace-gc against a sweep janitor and Kubernetes' garbage collector, on a local \
             control plane; rewrites bench/RESULTS.md"
)]
pub struct Options {
    /// Sizes to measure, in builds (comma-separated; `_` separators allowed).
    #[arg(long, value_delimiter = ',', value_parser = positive_count, default_value = "1000,10000")]
    pub sizes: Vec<usize>,
    /// Namespaces the builds are spread over.
    #[arg(long, value_parser = positive_count, default_value = "20")]
    pub namespaces: usize,
    /// Events per kind and contender; default min(N/10, 400).
    #[arg(long, value_parser = positive_count)]
    pub events: Option<usize>,
    /// Events per second per kind.
    #[arg(long, value_parser = positive_rate, default_value = "8")]
    pub rate: f64,
    /// The TTL after a build finishes, in seconds.
    #[arg(long = "ttl", default_value_t = 30)]
    pub ttl_s: u64,
    /// The sweep janitor's interval, in seconds.
    #[arg(long = "sweep-interval", default_value_t = 30)]
    pub sweep_interval_s: u64,
    /// Requests in flight while creating the builds.
    #[arg(long, value_parser = positive_count, default_value = "48")]
    pub concurrency: usize,
    /// The report to write.
    #[arg(long, default_value_os_t = cluster::root().join("bench/RESULTS.md"))]
    pub out: PathBuf,
    /// Where etcd's data and the audit log go (a tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    pub workdir: PathBuf,
    /// Other workspace-gc binaries to measure instead of the one built here (variants of src/
    /// built elsewhere), as LABEL,PATH[,KEY=VALUE...]; without --with-baselines the baselines
    /// are then skipped.
    #[arg(long = "variant", value_parser = daemon_spec)]
    pub variants: Vec<DaemonSpec>,
    /// Measure the baselines too when --variant is given.
    #[arg(long)]
    pub with_baselines: bool,
    /// Sizes from this one on are built lean: one pod per build.
    #[arg(long, value_parser = positive_count)]
    pub lean_from: Option<usize>,
    /// Sizes above this one measure workspace-gc's burst alone: no baselines, churn or idle
    /// (0: at every size).
    #[arg(long, default_value = "10000")]
    pub full_up_to: usize,
    /// Claims coming due one at a time, as RATE,SECONDS (claims per second, seconds), per
    /// contender.
    #[arg(long, value_parser = churn)]
    pub churn: Option<(f64, u64)>,
    /// Claims coming due alone, as RATE,SECONDS: after the churn, one at a time further apart
    /// than a proof round's interval, so that no two re-checks could share a round.
    #[arg(long, value_parser = churn)]
    pub lone: Option<(f64, u64)>,
    /// A busy cluster: every contender is measured twice, quiet and then with a background
    /// load of RATE unrelated builds a second started in the same namespaces (busy.rs).
    #[arg(long, value_parser = positive_rate)]
    pub busy: Option<f64>,
    /// Leave the sweep janitor out of the baselines (the garbage collector stays).
    #[arg(long)]
    pub skip_sweep: bool,
    /// Minutes with nothing due, per contender (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub idle_minutes: f64,
    /// Other workspace-gc binaries measured in the churn alone (a build before a change), as
    /// LABEL,PATH[,KEY=VALUE...].
    #[arg(long = "churn-compare", value_parser = daemon_spec)]
    pub churn_compare: Vec<DaemonSpec>,
    /// Every control plane is this many kube-apiservers over one etcd behind HAProxy
    /// (`scripts/control-plane up --apiservers N`), as OpenShift runs three.
    #[arg(long, value_parser = positive_count, default_value = "1")]
    pub apiservers: usize,
    /// With --apiservers: each size is measured on one server first, then once per offset
    /// (a Go duration: 0s, 5ms, 300ms, 5s) on the HA plane with its servers' clocks spread
    /// over that offset (server I of N runs OFFSET × (I − 1) / (N − 1) off); the report then
    /// has the lag table across planes and no figures.
    #[arg(long, value_delimiter = ',', value_parser = go_duration_nanos)]
    pub offsets: Vec<i64>,
    /// Render the report from the figures of an earlier run (its JSON in
    /// target/bench-reclaim/) instead of measuring.
    #[arg(long, value_name = "JSON")]
    pub report_from: Option<PathBuf>,
}

fn positive_count(text: &str) -> Result<usize, String> {
    match text.trim().replace('_', "").parse() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate.is_finite() => Ok(rate),
        Ok(_) => Err("must be positive".into()),
        Err(e) => Err(format!("{e}")),
    }
}

/// RATE,SECONDS, both positive.
fn churn(text: &str) -> Result<(f64, u64), String> {
    let (rate, seconds) = text.split_once(',').ok_or("RATE,SECONDS")?;
    let seconds = positive_count(seconds)?;
    Ok((positive_rate(rate)?, seconds as u64))
}

/// LABEL,PATH[,KEY=VALUE...]
fn daemon_spec(text: &str) -> Result<DaemonSpec, String> {
    let mut parts = text.split(',');
    let label = parts.next().unwrap_or_default().to_owned();
    let path = PathBuf::from(parts.next().ok_or("LABEL,PATH[,KEY=VALUE...]")?);
    let env = parts
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("{kv} is not KEY=VALUE"))
        })
        .collect::<Result<_, _>>()?;
    Ok(DaemonSpec { label, path, env })
}

impl Options {
    /// Whether the baselines run at size `n`.
    fn baselines(&self, n: usize) -> bool {
        (self.variants.is_empty() || self.with_baselines) && self.full(n)
    }

    /// Whether size `n` gets every phase (baselines, churn, idle) or workspace-gc's burst alone.
    fn full(&self, n: usize) -> bool {
        n <= self.full_up_to
    }

    /// Events per contender in a churn at size `n` (0: none).
    fn churn_events(&self, n: usize) -> usize {
        steady_events(self.churn, self.full(n))
    }

    /// Events per contender in the lone claims' churn at size `n` (0: none).
    fn lone_events(&self, n: usize) -> usize {
        steady_events(self.lone, self.full(n))
    }

    /// How many times each contender is measured: quiet, and busy with `--busy`.
    fn loads(&self) -> usize {
        1 + usize::from(self.busy.is_some())
    }

    /// Whether the sweep janitor runs at size `n`.
    fn sweep(&self, n: usize) -> bool {
        self.baselines(n) && !self.skip_sweep
    }

    /// The builds the churns at size `n` use: (owned, validating). The garbage collector's
    /// churn is owner deletions only; the others' half owner deletions, half TTLs.
    fn churn_builds(&self, n: usize) -> (usize, usize) {
        let c = self.churn_events(n) + self.lone_events(n);
        let (owner, ttl) = (c / 2, c - c / 2);
        let mixed = (self.daemons().len() + usize::from(self.sweep(n))) * self.loads()
            + self.churn_compare.len();
        let gc = if self.baselines(n) {
            c * self.loads()
        } else {
            0
        };
        (gc + mixed * owner, mixed * ttl)
    }

    /// The workspace-gc binaries measured, in order.
    fn daemons(&self) -> Vec<DaemonSpec> {
        if self.variants.is_empty() {
            vec![DaemonSpec {
                label: "workspace-gc".into(),
                path: PathBuf::from(env!("CARGO_BIN_EXE_workspace-gc")),
                env: Vec::new(),
            }]
        } else {
            self.variants.clone()
        }
    }

    /// Burst phases at size `n` that consume owner-deleted and TTL events.
    fn owner_phases(&self, n: usize) -> usize {
        let baselines = usize::from(self.baselines(n)) + usize::from(self.sweep(n));
        (self.daemons().len() + baselines) * self.loads()
    }

    fn ttl_phases(&self, n: usize) -> usize {
        (self.daemons().len() + usize::from(self.sweep(n))) * self.loads()
    }

    fn events_for(&self, n: usize) -> usize {
        // As many as the builds that are not running or kept can supply to every phase, after
        // the churns.
        let (owned, validating) = self.churn_builds(n);
        let spare = (n - n / 5 - n / 20).saturating_sub(owned + validating);
        let fits = spare / (self.owner_phases(n) + self.ttl_phases(n)).max(1);
        self.events.unwrap_or((n / 10).min(400).min(fits)).max(1)
    }
}

/// Events in a steady phase given as RATE,SECONDS, at a size where steady phases run.
fn steady_events(steady: Option<(f64, u64)>, full: bool) -> usize {
    match steady {
        Some((rate, seconds)) if full => (rate * seconds as f64).round() as usize,
        _ => 0,
    }
}

/// A Go duration (`5ms`, `-5s`, `0`) as nanoseconds, the unit the plane's offsets are
/// passed in.
fn go_duration_nanos(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (sign, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, text),
    };
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, unit) = unsigned.split_at(split);
    let scale = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "" if number.parse::<f64>() == Ok(0.0) => 0.0,
        _ => return Err(format!("{text}: not a Go duration (5ms, 300ms, 5s)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text}: not a Go duration (5ms, 300ms, 5s)"))?;
    Ok((sign * value * scale).round() as i64)
}

/// The control plane a size is measured on: one server, or an HA plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plane {
    pub servers: usize,
    /// How far apart the first and the last server's clocks are, in nanoseconds.
    pub spread_ns: i64,
}

impl Plane {
    /// How the report names it.
    pub fn label(&self) -> String {
        match self.servers {
            1 => "1 server".to_owned(),
            n => format!(
                "{n} servers, clocks {} apart",
                report::nanos(self.spread_ns)
            ),
        }
    }

    /// The test kit's HA plane: server I runs `spread × (I − 1) / (N − 1)` off.
    pub fn ha(&self) -> Option<testkit::HaPlane> {
        (self.servers > 1).then(|| {
            let last = (self.servers - 1) as i64;
            testkit::HaPlane {
                servers: self.servers,
                offsets: (0..self.servers as i64)
                    .map(|i| match self.spread_ns * i / last {
                        0 => String::new(),
                        ns => format!("{ns}ns"),
                    })
                    .collect(),
            }
        })
    }
}

impl Options {
    /// The planes each size is measured on, in order.
    fn planes(&self) -> Vec<Plane> {
        let ha = |spread_ns| Plane {
            servers: self.apiservers,
            spread_ns,
        };
        if self.offsets.is_empty() {
            return vec![ha(0)];
        }
        std::iter::once(Plane {
            servers: 1,
            spread_ns: 0,
        })
        .chain(self.offsets.iter().map(|&spread| ha(spread)))
        .collect()
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some(sweep::SUBCOMMAND) {
        return sweep::main(&args[1..]);
    }
    let options =
        <Options as clap::Parser>::parse_from(std::iter::once("reclaim".to_owned()).chain(args));
    if let Some(saved) = &options.report_from {
        let text = std::fs::read_to_string(saved)
            .with_context(|| format!("reading {}", saved.display()))?;
        let run: Run = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a benchmark run", saved.display()))?;
        return write_report(&options, &run);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut run = report::start(&options, Utc::now());
    let stem = options
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "results".into());
    let raw = cluster::root().join(format!("target/bench-reclaim/{stem}.json"));
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if !options.offsets.is_empty() && options.apiservers < 2 {
        bail!("--offsets needs --apiservers 2 or more");
    }
    for &n in &options.sizes {
        for plane in options.planes() {
            eprintln!("bench: === N = {n}, {} ===", plane.label());
            run.sizes
                .push(runtime.block_on(run_size(n, &options, &plane))?);
            // After every size, so that a later failure keeps what was measured.
            std::fs::write(&raw, serde_json::to_string_pretty(&run)?)?;
            eprintln!("bench: figures so far in {}", raw.display());
        }
    }
    write_report(&options, &run)
}

/// The report and its figures, next to it.
fn write_report(options: &Options, run: &Run) -> Result<()> {
    // Across planes, one size's figures would overwrite each other (their files are named by
    // size): the lag table stands for them.
    let figures = if run.sizes.iter().any(|r| !r.plane.is_empty()) {
        Vec::new()
    } else {
        plots::figures(run).map_err(|e| anyhow!(e))?
    };
    let dir = options.out.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for figure in &figures {
        let path = dir.join(&figure.file);
        std::fs::write(&path, &figure.svg)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    std::fs::write(&options.out, report::render(run, &figures))
        .with_context(|| format!("writing {}", options.out.display()))?;
    eprintln!(
        "bench: wrote {} and {} figures",
        options.out.display(),
        figures.len()
    );
    Ok(())
}

/// Everything a phase needs.
struct Ctx {
    cp: ControlPlane,
    admin: Client,
    observer: Observer,
    aux: PathBuf,
    options: Options,
    audit_log: PathBuf,
}

async fn run_size(n: usize, options: &Options, plane: &Plane) -> Result<SizeResult> {
    let size_started = std::time::Instant::now();
    let events = options.events_for(n);
    let (churn_owned, churn_validating) = options.churn_builds(n);
    let plan = Plan::new(
        n,
        options.namespaces,
        options.owner_phases(n) * events + churn_owned,
        options.ttl_phases(n) * events + churn_validating,
        options.lean_from.is_some_and(|from| n >= from),
    )?;
    let base = options
        .workdir
        .join(format!("workspace-gc-bench-{}-{n}", std::process::id()));
    let aux = base.join("aux");
    std::fs::create_dir_all(&aux)?;
    let policy = aux.join("audit-policy.yaml");
    std::fs::write(&policy, audit::policy())?;
    let audit_log = aux.join("audit.log");
    let load_before = cluster::loadavg();

    eprintln!("bench: starting the control plane in {}", base.display());
    let (cp, started_in) = cluster::start(
        &base.join("cp"),
        &[
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
        ],
        plane.ha().as_ref(),
    )?;
    let outcome = run_phases(
        n,
        events,
        options,
        &plan,
        (cp, started_in),
        aux.clone(),
        audit_log,
    )
    .await;
    let _ = std::fs::remove_dir_all(&base);
    let mut result = outcome?;
    if options.apiservers > 1 {
        result.plane = plane.label();
    }
    result.load_before = load_before;
    result.load_after = cluster::loadavg();
    result.total_s = size_started.elapsed().as_secs_f64();
    Ok(result)
}

async fn run_phases(
    n: usize,
    events: usize,
    options: &Options,
    plan: &Plan,
    (cp, started_in): (ControlPlane, Duration),
    aux: PathBuf,
    audit_log: PathBuf,
) -> Result<SizeResult> {
    // Dropped when this returns, as soon as a step fails: the control plane then stops.
    let admin = cluster::client_from(cp.kubeconfig_path()).await?;
    let mut result = SizeResult {
        n,
        namespaces: options.namespaces,
        pods_per_build: plan.pods_per_build(),
        full: options.full(n),
        events,
        control_plane_s: started_in.as_secs_f64(),
        versions: cp
            .versions()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        states: [
            ("running (in use)", State::Running),
            ("validating (build finished)", State::Validating),
            ("owned by their job (build finished)", State::Owned),
            ("finished, keep=true", State::Kept),
        ]
        .into_iter()
        .map(|(name, state)| (name.to_owned(), plan.count(state)))
        .collect(),
        ..SizeResult::default()
    };
    let body = async {
        cluster::grant(&admin).await?;
        eprintln!(
            "bench: creating {n} builds ({} objects) with {} requests in flight",
            n * (3 + plan.pods_per_build()),
            options.concurrency
        );
        let created = population::create(&admin, plan, options.concurrency).await?;
        result.create_s = created.elapsed.as_secs_f64();
        result.create_requests = created.requests;
        result.create_objects = created.objects;
        result.etcd_bytes = cp.etcd_bytes();
        result.etcd_db_bytes = cp.etcd_db_bytes();
        eprintln!(
            "bench: created in {:.0} s ({:.0} requests/s); etcd {:.0} MiB",
            result.create_s,
            created.requests as f64 / result.create_s,
            result.etcd_bytes as f64 / 1048576.0
        );
        let observer = Observer::start(&admin).await;
        let ctx = Ctx {
            cp,
            admin: admin.clone(),
            observer,
            aux,
            options: options.clone(),
            audit_log,
        };
        let outcome = phases(&ctx, plan, events, &mut result).await;
        ctx.observer.stop();
        drop(ctx.cp);
        outcome
    };
    body.await?;
    Ok(result)
}

/// A workspace-gc binary to measure: the one built with this benchmark, or a variant.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DaemonSpec {
    pub label: String,
    pub path: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Which builds have been given out to events so far.
#[derive(Default)]
struct Used {
    owned: usize,
    validating: usize,
}

async fn phases(ctx: &Ctx, plan: &Plan, events: usize, result: &mut SizeResult) -> Result<()> {
    let mut used = Used::default();
    let rate = ctx
        .options
        .rate
        .min(events as f64 / ctx.options.sweep_interval_s.max(1) as f64);
    result.rate = rate;
    // Per contender: the burst window (for the garbage collector's requests) and the window of
    // all its phases (for deletions nobody asked for).
    let mut windows = Vec::new();
    let mut spans = Vec::new();
    let mut asked: Vec<String> = Vec::new();
    let baselines = ctx.options.baselines(result.n);
    // Quiet, then busy (`--busy`).
    let passes: Vec<Option<f64>> = std::iter::once(None)
        .chain(ctx.options.busy.map(Some))
        .collect();

    if baselines {
        for &busy in &passes {
            eprintln!(
                "bench: phase: kube-controller-manager's garbage collector{}",
                suffix(busy)
            );
            let load = start_load(ctx, plan, busy);
            let (mut gc, window, span, targets) =
                gc_phase(ctx, plan, &mut used, events, rate).await?;
            end_load(load, busy, &mut gc).await;
            windows.push(window);
            spans.push(span);
            asked.extend(targets.iter().map(|t| t.claim.clone()));
            result.contenders.push(gc);
        }
    }
    // From here on the garbage collector must not race the contenders.
    ctx.cp
        .stop_component("kube-controller-manager", false)
        .await;

    for spec in ctx.options.daemons() {
        for &busy in &passes {
            eprintln!("bench: phase: {}{}", spec.label, suffix(busy));
            let load = start_load(ctx, plan, busy);
            let (mut daemon, window, span, targets) =
                daemon_phase(ctx, plan, &mut used, events, rate, &spec, false).await?;
            end_load(load, busy, &mut daemon).await;
            windows.push(window);
            spans.push(span);
            asked.extend(targets.iter().map(|t| t.claim.clone()));
            result.contenders.push(daemon);
        }
    }
    if ctx.options.churn_events(result.n) > 0 {
        for spec in &ctx.options.churn_compare {
            eprintln!("bench: phase: {} (churn only)", spec.label);
            let (daemon, window, span, targets) =
                daemon_phase(ctx, plan, &mut used, 0, rate, spec, true).await?;
            windows.push(window);
            spans.push(span);
            asked.extend(targets.iter().map(|t| t.claim.clone()));
            result.contenders.push(daemon);
        }
    }

    if ctx.options.sweep(result.n) {
        for &busy in &passes {
            eprintln!("bench: phase: sweep janitor{}", suffix(busy));
            let load = start_load(ctx, plan, busy);
            let (mut janitor, window, span, targets) =
                sweep_phase(ctx, plan, &mut used, events, rate).await?;
            end_load(load, busy, &mut janitor).await;
            windows.push(window);
            spans.push(span);
            asked.extend(targets.iter().map(|t| t.claim.clone()));
            result.contenders.push(janitor);
        }
    }

    // The garbage collector's requests, now that the log is complete.
    let requests = audit::read(&ctx.audit_log)?;
    for (contender, (from, to)) in result.contenders.iter_mut().zip(&windows) {
        if contender.role != Role::Gc {
            continue;
        }
        let (from, to) = (*from, *to);
        contender.steady = audit::count(&requests, from, to, GC);
        contender.other = Some((
            "PVC protection (kube-controller-manager, every contender's deletes in a real cluster)"
                .into(),
            audit::count(&requests, from, to, |r| {
                r.user == KCM_USER && r.agent == "pvc-protection-controller"
            }),
        ));
        let rest = audit::count(&requests, from, to, |r| {
            r.user == KCM_USER
                && r.agent != "generic-garbage-collector"
                && r.agent != "pvc-protection-controller"
        });
        if rest.total > 0 {
            contender.notes.push(format!(
                "other kube-controller-manager requests in the window: {:?}",
                rest.by_verb_resource
            ));
        }
    }
    // Deletions nobody asked for (there must be none: nothing else is due), by phase.
    let asked: std::collections::HashSet<String> = asked.into_iter().collect();
    let seen = ctx.observer.all();
    for (contender, (from, to)) in result.contenders.iter_mut().zip(spans) {
        contender.unexpected_deletions = seen
            .iter()
            .filter(|(key, at)| **at >= from && **at <= to && !asked.contains(*key))
            .count();
    }
    Ok(())
}

fn suffix(busy: Option<f64>) -> &'static str {
    if busy.is_some() { " (busy)" } else { "" }
}

/// The background load of a busy pass; none for the quiet one.
fn start_load(ctx: &Ctx, plan: &Plan, busy: Option<f64>) -> Option<busy::Load> {
    busy.map(|rate| busy::start(&ctx.admin, &plan.namespaces, rate))
}

/// Stops a busy pass's load, naming the contender's figures as busy and noting what the load
/// did.
async fn end_load(load: Option<busy::Load>, busy: Option<f64>, contender: &mut Contender) {
    let (Some(load), Some(rate)) = (load, busy) else {
        return;
    };
    let done = load.stop().await;
    contender.name.push_str(suffix(busy));
    contender.notes.push(format!(
        "busy: {} unrelated builds started, {rate} a second ({} writes each; {} refused)",
        done.builds,
        busy::WRITES,
        done.failed_writes
    ));
}

/// A measured contender, its burst window, the window of all its phases (burst, churn, idle),
/// and the claims it was asked to reclaim.
type Phase = (Contender, Span, Span, Vec<Target>);
type Span = (DateTime<Utc>, DateTime<Utc>);

async fn gc_phase(
    ctx: &Ctx,
    plan: &Plan,
    used: &mut Used,
    events: usize,
    rate: f64,
) -> Result<Phase> {
    let mut gc = Contender {
        name: "Kubernetes GC".into(),
        role: Role::Gc,
        ..Contender::default()
    };
    let kcm = ctx.cp.pid("kube-controller-manager");
    let fired = plan
        .take(State::Owned, &mut used.owned, events)
        .into_iter()
        .map(|b| (b, EventKind::OwnerDeleted))
        .collect();
    let window = Window::open(ctx).await;
    let targets = fire_and_wait(ctx, fired, rate, Duration::from_secs(60)).await?;
    gc.at_end = kcm.and_then(cluster::sample);
    let span = window.close(ctx, &mut gc).await;
    gc.lags = lags(&ctx.observer, &targets);
    gc.notes.push(
        "kube-controller-manager's peak RSS and CPU cover every controller it runs (garbage \
         collector, PVC protection, namespace, service accounts) since the control plane started"
            .into(),
    );
    let (end, mut targets) = (span.1, targets);
    let end = steady_phases(ctx, plan, used, &mut gc, kcm, GC, &mut targets)
        .await?
        .unwrap_or(end);
    Ok((gc, span, (span.0, end), targets))
}

async fn daemon_phase(
    ctx: &Ctx,
    plan: &Plan,
    used: &mut Used,
    events: usize,
    rate: f64,
    spec: &DaemonSpec,
    churn_only: bool,
) -> Result<Phase> {
    let mut daemon = Contender {
        name: spec.label.clone(),
        role: Role::Daemon,
        churn_only,
        ..Contender::default()
    };
    let kubeconfig = ctx.cp.identity_kubeconfig(&ctx.aux, DAEMON_USER)?;
    let port = scrape::free_port();
    let log_path = ctx
        .aux
        .join(format!("{}.log", spec.label.replace('/', "_")));
    let log = std::fs::File::create(&log_path)?;
    // Run a private copy: others' `cargo build --release` in the same target directory must not
    // swap the binary during the run.
    let binary = ctx
        .aux
        .join(format!("bin-{}", spec.label.replace(['/', ' '], "_")));
    std::fs::copy(&spec.path, &binary).with_context(|| format!("copy {}", spec.path.display()))?;
    let mut command = tokio::process::Command::new(&binary);
    command
        .args(["run", "--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    clean_env(&mut command);
    // Leader election as deployed (one replica): its Lease reads and renewals, and the write
    // to the Lease that fences each delete, are part of what a deployment costs.
    command
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", cluster::DAEMON_NAMESPACE)
        .env(
            "POD_NAME",
            format!("bench-{}", spec.label.replace(['/', ' '], "-")),
        )
        .env(
            "WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED",
            format!("{}s", ctx.options.ttl_s),
        )
        .env("WORKSPACE_GC_DELETION_DELETES_PER_SECOND", "1000")
        .env("WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW", "1000000");
    for (key, value) in &spec.env {
        command.env(key, value);
    }
    let mut window = Window::open(ctx).await;
    let spawned = Utc::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("start {}", spec.path.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("workspace-gc has no pid"))?;
    let ready = loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "workspace-gc exited ({status}) before it was ready; see its log: {}",
                log_path.display()
            );
        }
        if scrape::http_get(port, "/readyz").await.0 == 200 {
            break Utc::now();
        }
        if (Utc::now() - spawned).num_seconds() > 300 {
            bail!("workspace-gc not ready after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    window.ready(ctx).await;
    daemon.ready_s = Some(secs(ready - spawned));
    daemon.at_ready = cluster::sample(pid);
    let (status, metrics) = scrape::http_get(port, "/metrics").await;
    if status != 0 {
        daemon.tracked = Some(scrape::metric_sum(&metrics, "workspace_gc_cached_objects") as u64);
    }
    eprintln!(
        "bench:   ready after {:.2} s, {} objects cached",
        daemon.ready_s.unwrap_or_default(),
        daemon.tracked.unwrap_or_default()
    );
    if !churn_only {
        // Left out of the phase's figures: the plain client's lists are not the daemon's cost.
        let before = Meter::read(ctx, None).await;
        let replayed = plain_lists(ctx, &kubeconfig, spawned, ready).await;
        let after = Meter::read(ctx, None).await;
        window.exclude(&before, &after);
        match replayed {
            Ok(mut lists) => {
                lists.apiserver_cpu_s = after.apiserver_cpu - before.apiserver_cpu;
                lists.etcd_cpu_s = after.etcd_cpu - before.etcd_cpu;
                eprintln!(
                    "bench:   the same lists by a plain client: {:.2} s",
                    lists.wall_s
                );
                daemon.plain_lists = Some(lists);
            }
            Err(error) => daemon
                .notes
                .push(format!("the plain client's lists failed: {error:#}")),
        }
    }
    // Nothing in the population is due: the first seconds after ready must delete nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut fired = Vec::new();
    let owner = plan.take(State::Owned, &mut used.owned, events);
    let ttl = plan.take(State::Validating, &mut used.validating, events);
    interleave(&mut fired, owner, ttl);
    let targets = fire_and_wait(ctx, fired, 2.0 * rate, Duration::from_secs(60)).await?;
    // Let trailing requests (the Event after the last delete) land in the window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    daemon.at_end = cluster::sample(pid);
    let (status, metrics) = scrape::http_get(port, "/metrics").await;
    if status != 0 {
        let restarts = scrape::metric_sum(&metrics, "workspace_gc_watch_restarts_total");
        let errors = scrape::metric_sum(&metrics, "workspace_gc_api_errors_total");
        if restarts > 0.0 || errors > 0.0 {
            daemon.notes.push(format!(
                "the daemon counted {restarts} watch restarts and {errors} API errors"
            ));
        }
    }
    let span = window.close(ctx, &mut daemon).await;
    daemon.lags = lags(&ctx.observer, &targets);
    let mut targets = targets;
    let end = steady_phases(
        ctx,
        plan,
        used,
        &mut daemon,
        Some(pid),
        DAEMON,
        &mut targets,
    )
    .await?
    .unwrap_or(span.1);
    stop(&mut child, pid).await;
    daemon.sync = count(ctx, DAEMON, spawned, ready)?;
    daemon.steady = count(ctx, DAEMON, ready, span.1)?;
    Ok((daemon, span, (span.0, end), targets))
}

async fn sweep_phase(
    ctx: &Ctx,
    plan: &Plan,
    used: &mut Used,
    events: usize,
    rate: f64,
) -> Result<Phase> {
    let mut janitor = Contender {
        name: format!("sweep janitor ({} s)", ctx.options.sweep_interval_s),
        role: Role::Sweep,
        ..Contender::default()
    };
    let kubeconfig = ctx.cp.identity_kubeconfig(&ctx.aux, SWEEP_USER)?;
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command
        .arg(sweep::SUBCOMMAND)
        .args(["--interval", &ctx.options.sweep_interval_s.to_string()])
        .args(["--ttl", &ctx.options.ttl_s.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(ctx.aux.join("sweep.log"))?)
        .kill_on_drop(true);
    clean_env(&mut command);
    command.env("KUBECONFIG", &kubeconfig);
    let mut window = Window::open(ctx).await;
    let spawned = Utc::now();
    let mut child = command.spawn().context("start the sweep janitor")?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the janitor has no pid"))?;
    let lines: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let sink = lines.clone();
    let reader = tokio::spawn(async move {
        let mut first = Some(first_tx);
        let mut stdout = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = stdout.next_line().await {
            if let Ok(value) = serde_json::from_str(&line) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(value);
                if let Some(tx) = first.take() {
                    let _ = tx.send(Utc::now());
                }
            }
        }
    });
    let ready = tokio::time::timeout(Duration::from_secs(300), first_rx)
        .await
        .map_err(|_| anyhow!("the janitor's first sweep did not finish in 300 s"))?
        .map_err(|_| {
            anyhow!(
                "the janitor exited before its first sweep; see {}",
                ctx.aux.join("sweep.log").display()
            )
        })?;
    window.ready(ctx).await;
    janitor.ready_s = Some(secs(ready - spawned));
    janitor.at_ready = cluster::sample(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut fired = Vec::new();
    let owner = plan.take(State::Owned, &mut used.owned, events);
    let ttl = plan.take(State::Validating, &mut used.validating, events);
    interleave(&mut fired, owner, ttl);
    let grace = Duration::from_secs(2 * ctx.options.sweep_interval_s + 60);
    let targets = fire_and_wait(ctx, fired, 2.0 * rate, grace).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    janitor.at_end = cluster::sample(pid);
    let span = window.close(ctx, &mut janitor).await;
    janitor.lags = lags(&ctx.observer, &targets);
    let mut targets = targets;
    let end = steady_phases(
        ctx,
        plan,
        used,
        &mut janitor,
        Some(pid),
        SWEEP,
        &mut targets,
    )
    .await?
    .unwrap_or(span.1);
    stop(&mut child, pid).await;
    reader.abort();
    janitor.sync = count(ctx, SWEEP, spawned, ready)?;
    janitor.steady = count(ctx, SWEEP, ready, span.1)?;
    let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
    janitor.tracked = lines.iter().filter_map(|v| v["objects"].as_u64()).max();
    janitor.sweeps = lines
        .iter()
        .map(|v| {
            (
                v["list_s"].as_f64().unwrap_or_default(),
                v["duration_s"].as_f64().unwrap_or_default(),
            )
        })
        .collect();
    drop(lines);
    Ok((janitor, span, (span.0, end), targets))
}

/// Which requests in the audit log are a contender's.
type Who = fn(&audit::Request) -> bool;
/// The daemon's; the plain client that lists again with its credentials is told apart by its
/// user agent.
const DAEMON: Who = |r| r.user == DAEMON_USER && r.agent != plain::AGENT_NAME;
const SWEEP: Who = |r| r.user == SWEEP_USER;
const GC: Who = |r| r.user == KCM_USER && r.agent == "generic-garbage-collector";

/// After a contender's burst, as configured for the size: the churn (claims coming due one at
/// a time; the garbage collector's are owner deletions only, the others' half owner deletions,
/// half TTLs), the lone claims (`--lone`: the same, further apart), then the idle window (nothing due; not for the garbage collector, which is
/// stopped before the others run). Adds the churn's targets; returns when the last window
/// closed, if any ran.
async fn steady_phases(
    ctx: &Ctx,
    plan: &Plan,
    used: &mut Used,
    contender: &mut Contender,
    pid: Option<u32>,
    who: Who,
    targets: &mut Vec<Target>,
) -> Result<Option<DateTime<Utc>>> {
    let n = plan.builds.len();
    let mut end = None;
    type Field = fn(&mut Contender) -> &mut Option<Steady>;
    let steady: [(_, _, _, Field); 2] = [
        (
            ctx.options.churn,
            ctx.options.churn_events(n),
            "one at a time",
            |c| &mut c.churn,
        ),
        (ctx.options.lone, ctx.options.lone_events(n), "alone", |c| {
            &mut c.lone
        }),
    ];
    for (steady, count, how, field) in steady {
        let Some((rate, _)) = steady.filter(|_| count > 0) else {
            continue;
        };
        eprintln!("bench:   {count} claims coming due {how}");
        let work = (count, rate);
        let ((measured, at), churned) =
            churn_phase(ctx, plan, used, contender.role, pid, who, work).await?;
        *field(contender) = Some(measured);
        targets.extend(churned);
        end = Some(at);
    }
    let minutes = ctx.options.idle_minutes;
    if minutes > 0.0 && ctx.options.full(n) && contender.role != Role::Gc && !contender.churn_only {
        eprintln!("bench:   idle for {minutes} min");
        let start = Meter::read(ctx, pid).await;
        tokio::time::sleep(Duration::from_secs_f64(minutes * 60.0)).await;
        let stop = Meter::read(ctx, pid).await;
        contender.idle = Some(Steady::between(ctx, &start, &stop, who)?);
        end = Some(stop.at);
    }
    Ok(end)
}

/// `count` claims coming due one at a time at `rate` a second (the garbage collector's owner
/// deletions, the others' half owner deletions, half TTLs), measured from the first event until
/// every claim was reclaimed; with the window's end and the claims.
async fn churn_phase(
    ctx: &Ctx,
    plan: &Plan,
    used: &mut Used,
    role: Role,
    pid: Option<u32>,
    who: Who,
    (count, rate): (usize, f64),
) -> Result<((Steady, DateTime<Utc>), Vec<Target>)> {
    let mut fired = Vec::new();
    if role == Role::Gc {
        let owner = plan.take(State::Owned, &mut used.owned, count);
        fired.extend(owner.into_iter().map(|b| (b, EventKind::OwnerDeleted)));
    } else {
        let owner = plan.take(State::Owned, &mut used.owned, count / 2);
        let ttl = plan.take(State::Validating, &mut used.validating, count - count / 2);
        interleave(&mut fired, owner, ttl);
    }
    let grace = match role {
        Role::Sweep => 2 * ctx.options.sweep_interval_s + 60,
        Role::Daemon | Role::Gc => 60,
    };
    let start = Meter::read(ctx, pid).await;
    let churned = fire_and_wait(ctx, fired, rate, Duration::from_secs(grace)).await?;
    // Let trailing requests (the Event after the last delete) land in the window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stop = Meter::read(ctx, pid).await;
    let mut measured = Steady::between(ctx, &start, &stop, who)?;
    measured.lags = lags(&ctx.observer, &churned);
    Ok(((measured, stop.at), churned))
}

impl Steady {
    /// The cost between two readings; the requests from the audit log.
    fn between(ctx: &Ctx, start: &Meter, stop: &Meter, who: Who) -> Result<Self> {
        let requests = audit::read(&ctx.audit_log)?;
        Ok(Self {
            window_s: secs(stop.at - start.at),
            lags: Vec::new(),
            requests: audit::count(&requests, start.at, stop.at, who),
            list_bytes: stop.list_bytes - start.list_bytes,
            apiserver_cpu_s: stop.apiserver_cpu - start.apiserver_cpu,
            etcd_cpu_s: stop.etcd_cpu - start.etcd_cpu,
            cpu_s: start
                .process
                .zip(stop.process)
                .map(|(a, b)| b.cpu_s - a.cpu_s),
            at_end: stop.process,
        })
    }
}

fn interleave(out: &mut Vec<(Build, EventKind)>, owner: Vec<Build>, ttl: Vec<Build>) {
    let mut owner = owner.into_iter();
    let mut ttl = ttl.into_iter();
    loop {
        let a = owner.next();
        let b = ttl.next();
        if a.is_none() && b.is_none() {
            break;
        }
        out.extend(a.map(|b| (b, EventKind::OwnerDeleted)));
        out.extend(b.map(|b| (b, EventKind::TtlPassed)));
    }
}

/// What the control plane and a contender have spent up to an instant: API server and etcd
/// CPU, LIST bytes served, and the contender's memory and CPU.
struct Meter {
    at: DateTime<Utc>,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    list_bytes: f64,
    process: Option<ProcSample>,
}

impl Meter {
    async fn read(ctx: &Ctx, pid: Option<u32>) -> Self {
        Self {
            at: Utc::now(),
            apiserver_cpu: cpu(ctx, "kube-apiserver"),
            etcd_cpu: cpu(ctx, "etcd"),
            list_bytes: list_bytes(&ctx.admin).await,
            process: pid.and_then(cluster::sample),
        }
    }
}

/// A phase's measuring window: API server and etcd CPU and LIST bytes between open and close.
struct Window {
    opened: Meter,
    /// LIST bytes when the contender became ready.
    ready_list_bytes: Option<f64>,
    /// API server CPU, etcd CPU and LIST bytes spent on others' requests within the window
    /// (the plain client's lists), left out of it.
    excluded: (f64, f64, f64),
}

const LISTED: [&str; 5] = [
    "resource=\"pods\"",
    "resource=\"persistentvolumeclaims\"",
    "resource=\"pipelineruns\"",
    "resource=\"taskruns\"",
    "resource=\"notebookvalidationjobs\"",
];

async fn list_bytes(admin: &Client) -> f64 {
    let Ok(text) = cluster::apiserver_metrics(admin).await else {
        return 0.0;
    };
    LISTED
        .iter()
        .map(|r| {
            scrape::metric(
                &text,
                "apiserver_response_sizes_sum",
                &format!("verb=\"LIST\",{r}"),
            )
        })
        .sum()
}

impl Window {
    async fn open(ctx: &Ctx) -> Self {
        Self {
            opened: Meter::read(ctx, None).await,
            ready_list_bytes: None,
            excluded: (0.0, 0.0, 0.0),
        }
    }

    /// Leaves what was spent between `from` and `to` out of the window.
    fn exclude(&mut self, from: &Meter, to: &Meter) {
        self.excluded.0 += to.apiserver_cpu - from.apiserver_cpu;
        self.excluded.1 += to.etcd_cpu - from.etcd_cpu;
        self.excluded.2 += to.list_bytes - from.list_bytes;
    }

    /// Splits the LIST bytes: before this, the initial lists; after it, the steady state.
    async fn ready(&mut self, ctx: &Ctx) {
        self.ready_list_bytes = Some(list_bytes(&ctx.admin).await);
    }

    async fn close(self, ctx: &Ctx, into: &mut Contender) -> Span {
        let closed = Meter::read(ctx, None).await;
        let opened = &self.opened;
        into.window_s = secs(closed.at - opened.at);
        let (apiserver, etcd, listed) = self.excluded;
        into.apiserver_cpu_s = closed.apiserver_cpu - opened.apiserver_cpu - apiserver;
        into.etcd_cpu_s = closed.etcd_cpu - opened.etcd_cpu - etcd;
        let ready = self.ready_list_bytes.unwrap_or(opened.list_bytes);
        into.sync_list_bytes = ready - opened.list_bytes;
        into.list_bytes = closed.list_bytes - ready - listed;
        (opened.at, closed.at)
    }
}

fn cpu(ctx: &Ctx, name: &str) -> f64 {
    // On an HA plane (`--apiservers`) the servers are kube-apiserver-1 .. -N: their sum.
    let servers = (1..=ctx.options.apiservers).map(|i| format!("{name}-{i}"));
    (std::iter::once(name.to_owned()).chain(servers))
        .filter_map(|name| ctx.cp.pid(&name))
        .filter_map(cluster::cpu_seconds)
        .sum()
}

fn secs(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// Fires the events and waits until every target claim is seen deleted, or `grace` after the
/// last deadline.
async fn fire_and_wait(
    ctx: &Ctx,
    events: Vec<(Build, EventKind)>,
    rate: f64,
    grace: Duration,
) -> Result<Vec<Target>> {
    let count = events.len();
    eprintln!("bench:   firing {count} events at {rate}/s");
    let ttl = Duration::from_secs(ctx.options.ttl_s);
    let targets = population::fire(&ctx.admin, events, rate, ttl).await?;
    let last = targets
        .iter()
        .map(|t| t.deadline)
        .max()
        .unwrap_or_else(Utc::now);
    let give_up = last + chrono::Duration::from_std(grace)?;
    loop {
        let missing = targets
            .iter()
            .filter(|t| ctx.observer.deleted_at(&t.claim).is_none())
            .count();
        if missing == 0 {
            break;
        }
        if Utc::now() > give_up {
            eprintln!("bench:   {missing} of {count} claims not reclaimed in time");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(targets)
}

fn lags(observer: &Observer, targets: &[Target]) -> Vec<(EventKind, Option<f64>)> {
    targets
        .iter()
        .map(|t| {
            (
                t.kind,
                observer
                    .deleted_at(&t.claim)
                    .map(|at| secs(at - t.deadline)),
            )
        })
        .collect()
}

fn count(ctx: &Ctx, who: Who, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Counts> {
    let requests = audit::read(&ctx.audit_log)?;
    Ok(audit::count(&requests, from, to, who))
}

/// The daemon's initial lists (its requests from `spawned` to `ready`), sent again by a plain
/// client through the daemon's kubeconfig.
async fn plain_lists(
    ctx: &Ctx,
    kubeconfig: &std::path::Path,
    spawned: DateTime<Utc>,
    ready: DateTime<Utc>,
) -> Result<results::PlainLists> {
    let requests = audit::read(&ctx.audit_log)?;
    let sent = requests
        .iter()
        .filter(|r| r.at >= spawned && r.at < ready && DAEMON(r))
        .map(|r| plain::Sent {
            verb: &r.verb,
            resource: &r.resource,
            uri: &r.uri,
            code: r.code,
        });
    plain::replay(kubeconfig, &plain::initial_lists(sent)).await
}

/// A child process inherits nothing that could change what it does: no proxy, no stray
/// workspace-gc configuration.
fn clean_env(command: &mut tokio::process::Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("WORKSPACE_GC_") || key.to_ascii_lowercase().ends_with("_proxy") {
            command.env_remove(key.as_ref());
        }
    }
    command.env("NO_PROXY", "127.0.0.1,localhost");
}

async fn stop(child: &mut tokio::process::Child, pid: u32) {
    cluster::signal(pid, "TERM");
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
