//! Builds never refused by quota (issue 49, item 3): builds started at a steady rate into a
//! namespace whose ResourceQuota holds only a few builds' claims, each build finishing after a
//! while, and the claim creations the quota refuses, counted as the operator sees them.
//!
//!     cargo bench --bench quota [-- --rates 0.1,0.2,0.3,0.4 --minutes 8]
//!
//! One local control plane with kube-controller-manager (its resource-quota controller writes
//! `status.used`, its PVC-protection controller lets a deleted claim go). Every contender and
//! build rate gets a namespace of its own, all running side by side for `--minutes`, each with a
//! quota of `--quota-claims` claims (`requests.storage` of that many GiB and the same
//! `persistentvolumeclaims` count). A build, as the operator runs one: its NotebookValidationJob
//! (Building), its claim made by `creator::ensure_build_claim` (what `workspace-gc create` runs:
//! a 1Gi claim owned by the job), then its PipelineRun binding the claim (running); after
//! `--build-seconds` the run and the job finish. A creation the API server refuses with 403
//! "exceeded quota" is a refused build: counted, and the build does not start (the offered
//! load stays the same whatever the contender does).
//!
//! The contenders: none; the sweep janitor of the reclaim benchmark (`sweep.rs`, TTL only,
//! every `--sweep-interval`); workspace-gc (the release binary, the shipped Role and
//! configuration, the TTL scaled to `--ttl`) with `quota.enabled = false`; the same with quota
//! pressure (shipped); and with quota pressure and the blast-radius cap raised, which tells the
//! cap's limit apart from the pressure's. Writes bench/QUOTA.md and bench/quota-refused.svg.

mod sweep;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use chrono::{SecondsFormat, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use plotters::prelude::*;
use serde_json::json;
use testkit::{
    ControlPlane, JobBuilder, PipelineRunBuilder, Process, TestNamespace, elected_role, metric,
    notebook_validation_job_resource, pipeline_run_resource, wait_until,
};
use workspace_gc::config::CreatorConfig;
use workspace_gc::creator::{CreateError, ensure_build_claim, read_job};

#[derive(Debug, clap::Parser)]
#[command(
    name = "quota",
    about = "builds refused by a namespace's storage quota"
)]
struct Options {
    /// Builds started per second in each namespace, one namespace a rate and contender.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.3,0.4")]
    rates: Vec<f64>,
    /// How long builds are started, in minutes.
    #[arg(long, default_value_t = 8.0)]
    minutes: f64,
    /// How long a build runs, in seconds.
    #[arg(long = "build-seconds", default_value_t = 20)]
    build_s: u64,
    /// The TTL after a build finishes, in seconds (the shipped 1h, scaled to the builds).
    #[arg(long = "ttl", default_value_t = 60)]
    ttl_s: u64,
    /// The sweep janitor's interval, in seconds.
    #[arg(long = "sweep-interval", default_value_t = 30)]
    sweep_interval_s: u64,
    /// Claims (of 1Gi) the quota holds.
    #[arg(long = "quota-claims", default_value_t = 10)]
    quota_claims: u64,
    /// The contenders.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,sweep,no-pressure,pressure,pressure-uncapped"
    )]
    contenders: Vec<Contender>,
    /// Where the report goes; the figure goes next to it.
    #[arg(long, default_value = "bench/QUOTA.md")]
    out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Contender {
    None,
    Sweep,
    NoPressure,
    Pressure,
    PressureUncapped,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::None => "no collector",
            Contender::Sweep => "sweep janitor (TTL only)",
            Contender::NoPressure => "workspace-gc, quota pressure off",
            Contender::Pressure => "workspace-gc, quota pressure on (shipped)",
            Contender::PressureUncapped => "workspace-gc, quota pressure on, cap raised",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Contender::None => "quota-none",
            Contender::Sweep => "quota-sweep",
            Contender::NoPressure => "quota-ttl",
            Contender::Pressure => "quota-pressure",
            Contender::PressureUncapped => "quota-uncapped",
        }
    }
}

/// What one namespace's builds met.
#[derive(Default)]
struct Tally {
    started: AtomicU64,
    created: AtomicU64,
    /// Refused with 403 "exceeded quota".
    refused: AtomicU64,
    /// Any other failure to create the claim.
    failed: AtomicU64,
}

/// One contender at one rate, in its namespace.
struct Subject {
    contender: Contender,
    rate: f64,
    ns: Arc<TestNamespace>,
    tally: Arc<Tally>,
    /// Claims the quota counted (`status.used` of `persistentvolumeclaims`), once a second.
    used: Vec<u64>,
    daemon: Option<Process>,
    sweep: Option<tokio::process::Child>,
    /// Claims deleted by workspace-gc for quota pressure, and in all (its metrics at the end).
    deleted_for_pressure: Option<f64>,
    deleted: Option<f64>,
    /// Claims left at the end.
    left: usize,
}

const QUOTA: &str = "builds";

async fn quota(ns: &TestNamespace, claims: u64) -> Result<()> {
    let hard = [
        ("requests.storage", format!("{claims}Gi")),
        ("persistentvolumeclaims", claims.to_string()),
    ]
    .into_iter()
    .map(|(resource, amount)| (resource.to_owned(), Quantity(amount)))
    .collect();
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some(QUOTA.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    };
    let api = ns.api::<ResourceQuota>();
    api.create(&PostParams::default(), &quota).await?;
    // The quota admits nothing until the quota controller has counted it once.
    let counted = || async {
        (api.get(QUOTA).await.ok())
            .and_then(|q| q.status?.used)
            .is_some_and(|used| used.contains_key("persistentvolumeclaims"))
    };
    anyhow::ensure!(
        wait_until(Duration::from_secs(60), counted).await,
        "the quota controller never counted {}/{QUOTA}",
        ns.name()
    );
    Ok(())
}

/// The claims quota `QUOTA` counts now.
async fn used(ns: &TestNamespace) -> Option<u64> {
    let quota = ns.api::<ResourceQuota>().get(QUOTA).await.ok()?;
    let used = quota.status?.used?;
    used.get("persistentvolumeclaims")?.0.parse().ok()
}

/// A ServiceAccount `name` in `ns` with the daemon's shipped Role (and the Lease rights), and
/// its kubeconfig.
async fn identity(cp: &ControlPlane, ns: &TestNamespace, name: &str) -> Result<PathBuf> {
    ns.api::<Role>()
        .create(&PostParams::default(), &elected_role(name))
        .await?;
    ns.bind_role(name, name).await;
    Ok(cp.service_account_kubeconfig(ns.name(), name).await)
}

impl Subject {
    async fn start(
        cp: &ControlPlane,
        options: &Options,
        contender: Contender,
        rate: f64,
        logs: &Path,
    ) -> Result<Subject> {
        let prefix = format!("{}-{}", contender.prefix(), (rate * 100.0).round());
        let ns = TestNamespace::new(cp, &prefix).await;
        quota(&ns, options.quota_claims).await?;
        let ttl = format!("{}s", options.ttl_s);
        let log = logs.join(format!("{}.log", ns.name()));
        let mut daemon = None;
        let mut sweep = None;
        match contender {
            Contender::None => {}
            Contender::Sweep => {
                let kubeconfig = identity(cp, &ns, "sweep").await?;
                let child = tokio::process::Command::new(std::env::current_exe()?)
                    .arg(sweep::SUBCOMMAND)
                    .args(["--interval", &options.sweep_interval_s.to_string()])
                    .args(["--ttl", &options.ttl_s.to_string()])
                    .args(["--namespace", ns.name()])
                    .env("KUBECONFIG", kubeconfig)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::File::create(&log)?)
                    .kill_on_drop(true)
                    .spawn()
                    .context("start the sweep janitor")?;
                sweep = Some(child);
            }
            Contender::NoPressure | Contender::Pressure | Contender::PressureUncapped => {
                let kubeconfig = identity(cp, &ns, "gc").await?;
                let mut vars = vec![
                    ("WORKSPACE_GC_SELECTOR_NAMESPACES", ns.name().to_owned()),
                    (
                        "WORKSPACE_GC_LEADER_ELECTION_LEASE_NAMESPACE",
                        ns.name().to_owned(),
                    ),
                    ("WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED", ttl.clone()),
                ];
                match contender {
                    Contender::NoPressure => {
                        vars.push(("WORKSPACE_GC_QUOTA_ENABLED", "false".to_owned()));
                    }
                    Contender::PressureUncapped => vars.push((
                        "WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW",
                        "1000000".to_owned(),
                    )),
                    _ => {}
                }
                daemon = Some(Process::spawn(&kubeconfig, &vars, "gc", &log));
            }
        }
        Ok(Subject {
            contender,
            rate,
            ns: Arc::new(ns),
            tally: Arc::default(),
            used: Vec::new(),
            daemon,
            sweep,
            deleted_for_pressure: None,
            deleted: None,
            left: 0,
        })
    }

    /// Whether its collector is ready (workspace-gc's /readyz; the others at once).
    async fn ready(&self) -> bool {
        match &self.daemon {
            Some(daemon) => daemon.ready().await,
            None => true,
        }
    }

    /// Builds started at `rate` a second until `until`, each a task of its own.
    fn builds(&self, options: &Options, until: Instant) -> tokio::task::JoinHandle<()> {
        let (ns, tally, rate) = (self.ns.clone(), self.tally.clone(), self.rate);
        let build = Duration::from_secs(options.build_s);
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let settings = workspace_gc::config::Config::default().creator;
            for i in 0.. {
                let at = start + Duration::from_secs_f64(i as f64 / rate);
                if at.into_std() >= until {
                    break;
                }
                tokio::time::sleep_until(at).await;
                let (ns, tally, settings) = (ns.clone(), tally.clone(), settings.clone());
                tokio::spawn(async move {
                    one_build(&ns, &format!("b{i:04}"), &settings, build, &tally).await;
                });
            }
        })
    }

    /// Reads what is left once the builds stopped: the collector's deletions, the claims left.
    async fn finish(&mut self) -> Result<()> {
        if let Some(daemon) = self.daemon.take() {
            // A `forbidden` answer to any of its requests fails the run.
            let metrics = daemon.metrics().await;
            let labels = |reason: &str| format!("reason=\"{reason}\",result=\"deleted\"");
            self.deleted_for_pressure = Some(metric(
                &metrics,
                "workspace_gc_deletions_total",
                &labels("quota-pressure"),
            ));
            self.deleted = Some(metric(
                &metrics,
                "workspace_gc_deletions_total",
                "result=\"deleted\"",
            ));
            let status = daemon.terminate().await;
            anyhow::ensure!(status.success(), "{}: exit {status}", self.ns.name());
        }
        if let Some(mut sweep) = self.sweep.take() {
            sweep.kill().await?;
        }
        let claims = self.ns.api::<PersistentVolumeClaim>();
        self.left = claims.list(&ListParams::default()).await?.items.len();
        Ok(())
    }
}

/// One build as the operator runs it; a refused claim ends it before its run starts.
async fn one_build(
    ns: &TestNamespace,
    job: &str,
    settings: &CreatorConfig,
    build: Duration,
    tally: &Tally,
) {
    tally.started.fetch_add(1, Ordering::Relaxed);
    JobBuilder::new(job)
        .phase("Building")
        .tekton_build("Running", None)
        .create(ns)
        .await;
    let ensured = match read_job(ns.client(), ns.name(), job).await {
        Ok(found) => ensure_build_claim(ns.client(), &found, settings).await,
        Err(error) => Err(error),
    };
    match ensured {
        Ok(_) => {
            tally.created.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) if refused_by_quota(&error) => {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(error) => {
            eprintln!("quota: {}/{job}: {error}", ns.name());
            tally.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    PipelineRunBuilder::for_job(job).running().create(ns).await;
    tokio::time::sleep(build).await;
    if let Err(error) = finished(ns, job).await {
        eprintln!("quota: finish {}/{job}: {error}", ns.name());
    }
}

/// What the operator sees when the quota is full: the API server's 403 "exceeded quota".
fn refused_by_quota(error: &CreateError) -> bool {
    matches!(error, CreateError::Api { source, .. }
        if matches!(source.as_ref(), kube::Error::Api(status)
            if status.code == 403 && status.message.contains("exceeded quota")))
}

/// The build's run and job finish now, as Tekton and the operator write it.
async fn finished(ns: &TestNamespace, job: &str) -> Result<()> {
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let run = json!({ "status": {
        "completionTime": now,
        "conditions": [{
            "type": "Succeeded", "status": "True", "reason": "Succeeded",
            "lastTransitionTime": now,
        }],
    }});
    let done = json!({ "status": {
        "phase": "Succeeded",
        "completionTime": now,
        "buildStatus": {
            "phase": "Complete", "buildName": format!("{job}-build"), "strategy": "tekton",
            "completionTime": now,
        },
    }});
    let params = PatchParams::default();
    ns.dynamic_api(&pipeline_run_resource())
        .patch_status(&format!("{job}-build"), &params, &Patch::Merge(run))
        .await?;
    ns.dynamic_api(&notebook_validation_job_resource())
        .patch_status(job, &params, &Patch::Merge(done))
        .await?;
    Ok(())
}

fn report(options: &Options, subjects: &[Subject], load: &[String]) -> String {
    let mut out = String::new();
    let contenders: Vec<Contender> = options.contenders.clone();
    let rates: Vec<String> = options.rates.iter().map(|r| format!("{r}")).collect();
    let names: Vec<String> = (contenders.iter())
        .map(|c| {
            clap::ValueEnum::to_possible_value(c).map_or_else(String::new, |v| v.get_name().into())
        })
        .collect();
    let _ = writeln!(out, "# Builds refused by a full storage quota\n");
    let _ = writeln!(
        out,
        "Written by `cargo bench --bench quota -- --rates {} --minutes {} --build-seconds {} \
         --ttl {} --sweep-interval {} --quota-claims {} --contenders {}` ({}; Kubernetes {}; \
         load average before / after: {}). The code is `bench/quota.rs`; \
         [RESULTS.md](RESULTS.md#quota-scenario) reads it.\n",
        rates.join(","),
        options.minutes,
        options.build_s,
        options.ttl_s,
        options.sweep_interval_s,
        options.quota_claims,
        names.join(","),
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        testkit::kubernetes_version(),
        load.join(" / "),
    );
    let q = options.quota_claims;
    let warm = (options.build_s + options.ttl_s + options.sweep_interval_s) as usize;
    let _ = writeln!(
        out,
        "Each namespace's quota holds {q} claims ({q}Gi of `requests.storage`, {q} \
         `persistentvolumeclaims`); a build's claim is 1Gi, made by `creator::ensure_build_claim` \
         (`workspace-gc create`), and the build runs {} s, so at a rate r about r × {} claims \
         belong to running builds and can never be freed: the quota can carry at most {:.2} \
         builds a second, and quota pressure, which deletes down to low water (80 %: {} claims), \
         no more than about {:.2}. TTL {} s after the build finishes (the shipped 1h, scaled to \
         the builds). workspace-gc runs the release binary as a ServiceAccount with the shipped \
         Role and the shipped configuration (5 deletes a second, at most 100 deletions in 10 \
         minutes, waters 0.9 / 0.8) but for the TTL; one daemon per namespace, with its Lease \
         there. A refused build is counted and does not start (no retry): the offered load is \
         the same for every contender.\n",
        options.build_s,
        options.build_s,
        q as f64 / options.build_s as f64,
        q * 8 / 10,
        (q * 8 / 10) as f64 / options.build_s as f64,
        options.ttl_s,
    );
    let header = |out: &mut String, title: &str| {
        let _ = writeln!(out, "{title}\n");
        let _ = writeln!(out, "| contender | {} |", {
            let cells: Vec<String> = (options.rates.iter())
                .map(|r| format!("{r} builds/s"))
                .collect();
            cells.join(" | ")
        });
        let _ = writeln!(out, "|---|{}", "---:|".repeat(options.rates.len()));
    };
    let row = |out: &mut String, contender: Contender, cell: &dyn Fn(&Subject) -> String| {
        let cells: Vec<String> = (subjects.iter())
            .filter(|s| s.contender == contender)
            .map(cell)
            .collect();
        let _ = writeln!(out, "| {} | {} |", contender.name(), cells.join(" | "));
    };
    header(&mut out, "## Refused creations (refused / builds started)");
    for c in &contenders {
        row(&mut out, *c, &|s| {
            let t = &s.tally;
            let failed = t.failed.load(Ordering::Relaxed);
            format!(
                "{} / {}{}",
                t.refused.load(Ordering::Relaxed),
                t.started.load(Ordering::Relaxed),
                if failed > 0 {
                    format!(" ({failed} failed otherwise)")
                } else {
                    String::new()
                }
            )
        });
    }
    let _ = writeln!(out);
    header(
        &mut out,
        &format!(
            "## Claims the quota counted, of {q}: peak / mean once settled (sampled each \
             second; the mean from {warm} s on, a build, a TTL and a sweep interval after the \
             first build)"
        ),
    );
    for c in &contenders {
        row(&mut out, *c, &|s| {
            let peak = s.used.iter().max().copied().unwrap_or(0);
            let settled = s.used.get(warm..).unwrap_or_default();
            let mean = settled.iter().sum::<u64>() as f64 / settled.len().max(1) as f64;
            format!("{peak} / {mean:.1}")
        });
    }
    let _ = writeln!(out);
    header(
        &mut out,
        "## Claims deleted: for quota pressure / in all (workspace-gc's metrics); claims left at the end",
    );
    for c in &contenders {
        row(
            &mut out,
            *c,
            &|s| match (s.deleted_for_pressure, s.deleted) {
                // abs: a metric absent reads -0.
                (Some(pressure), Some(all)) => {
                    format!("{} / {}; {} left", pressure.abs(), all.abs(), s.left)
                }
                _ => format!("{} left", s.left),
            },
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "![Refused creations against the build rate](quota-refused.svg)\n"
    );
    out
}

/// Refused creations (share of builds started) against the build rate, one line a contender.
fn figure(options: &Options, subjects: &[Subject]) -> Result<String> {
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, (900, 460)).into_drawing_area();
        area.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
        let max_rate = options.rates.iter().copied().fold(0.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&area)
            .caption(
                format!(
                    "Builds refused by a quota of {} claims ({} s builds, TTL {} s)",
                    options.quota_claims, options.build_s, options.ttl_s
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..max_rate, 0.0..100.0)
            .map_err(|e| anyhow!("{e:?}"))?;
        chart
            .configure_mesh()
            .x_desc("builds started per second")
            .y_desc("creations refused, % of builds")
            .draw()
            .map_err(|e| anyhow!("{e:?}"))?;
        let palette = [RED, BLUE, GREEN, MAGENTA, BLACK];
        for (i, contender) in options.contenders.iter().enumerate() {
            let colour = palette[i % palette.len()];
            let points: Vec<(f64, f64)> = (subjects.iter())
                .filter(|s| s.contender == *contender)
                .map(|s| {
                    let started = s.tally.started.load(Ordering::Relaxed).max(1) as f64;
                    let refused = s.tally.refused.load(Ordering::Relaxed) as f64;
                    (s.rate, 100.0 * refused / started)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(|e| anyhow!("{e:?}"))?
                .label(contender.name())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour));
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 4, colour.filled())))
                .map_err(|e| anyhow!("{e:?}"))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e:?}"))?;
        area.present().map_err(|e| anyhow!("{e:?}"))?;
    }
    Ok(svg)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some(sweep::SUBCOMMAND) {
        return sweep::main(&args[1..]);
    }
    let options =
        <Options as clap::Parser>::parse_from(std::iter::once("quota".into()).chain(args));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(options))
}

async fn run(options: Options) -> Result<()> {
    let load_before = loadavg();
    let cp = ControlPlane::start(true);
    let logs = tempfile::Builder::new()
        .prefix("workspace-gc-bench-quota-")
        .tempdir()?;
    let mut subjects = Vec::new();
    for contender in &options.contenders {
        for rate in &options.rates {
            println!("quota: {} at {rate} builds/s", contender.name());
            subjects.push(Subject::start(&cp, &options, *contender, *rate, logs.path()).await?);
        }
    }
    for subject in &subjects {
        anyhow::ensure!(
            wait_until(Duration::from_secs(60), || subject.ready()).await,
            "{} is not ready",
            subject.ns.name()
        );
    }
    let until = Instant::now() + Duration::from_secs_f64(options.minutes * 60.0);
    let generators: Vec<_> = (subjects.iter())
        .map(|s| s.builds(&options, until))
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while Instant::now() < until {
        tick.tick().await;
        for subject in &mut subjects {
            if let Some(used) = used(&subject.ns).await {
                subject.used.push(used);
            }
        }
    }
    for generator in generators {
        generator.await?;
    }
    for subject in &mut subjects {
        subject.finish().await?;
    }
    let load = [load_before, loadavg()];
    let text = report(&options, &subjects, &load);
    let svg = figure(&options, &subjects)?;
    std::fs::write(&options.out, &text)
        .with_context(|| format!("write {}", options.out.display()))?;
    let figure_path = options.out.with_file_name("quota-refused.svg");
    std::fs::write(&figure_path, svg)
        .with_context(|| format!("write {}", figure_path.display()))?;
    println!("{text}");
    Ok(())
}
