//! bench/RESULTS.md, written from the measurements alone.

use std::fmt::Write as _;
use std::process::Command;

use chrono::{DateTime, Utc};

use crate::plots::{Figure, FigureKind};
use crate::results::{
    Contender, Counts, EventKind, Machine, Measured, Role, Run, Settings, SizeResult, Steady,
};
use crate::statistics::{
    LagStats, group, lag_stats, memory_model, per_claim, ratio, reads_per_claim, tradeoffs,
    writes_per_claim,
};
use crate::targets::{self, Verdict};
use crate::{Options, cluster};

fn s(value: Option<f64>) -> String {
    match value {
        None => "–".into(),
        Some(v) if v.abs() < 10.0 => format!("{v:.3} s"),
        Some(v) => format!("{v:.1} s"),
    }
}

fn lag_cell(stats: LagStats) -> String {
    if stats.events == 0 {
        return "n/a".into();
    }
    let missing = stats.events - stats.reclaimed;
    let mut cell = format!("{} / {} / {}", s(stats.p50), s(stats.p99), s(stats.max));
    if missing > 0 {
        let _ = write!(cell, " ({missing} of {} not reclaimed)", stats.events);
    }
    cell
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Bytes per reclaimed claim, in KiB.
fn kib_per(bytes: f64, reclaimed: usize) -> String {
    per_claim(bytes / 1024.0, reclaimed).map_or("–".into(), |kib| format!("{kib:.0} KiB"))
}

fn per(count: u64, reclaimed: usize) -> String {
    per_claim(count as f64, reclaimed).map_or("–".into(), |per| format!("{per:.2}"))
}

/// Requests per reclaimed claim by verb; those on the Lease (leader election: its renewals and
/// the write that fences each delete) apart.
fn verbs(counts: &Counts, reclaimed: usize) -> String {
    let mut parts = Vec::new();
    for verb in ["get", "list", "delete", "create", "patch", "update"] {
        let count = counts.verb(verb) - counts.lease(verb);
        if count > 0 {
            parts.push(format!("{verb} {}", per(count, reclaimed)));
        }
    }
    let lease: Vec<String> = ["get", "patch", "create"]
        .into_iter()
        .filter(|verb| counts.lease(verb) > 0)
        .map(|verb| format!("{verb} {}", per(counts.lease(verb), reclaimed)))
        .collect();
    if !lease.is_empty() {
        parts.push(format!("Lease: {}", lease.join(", ")));
    }
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

/// Reads per reclaimed claim, to two decimals.
fn reads(counts: &Counts, reclaimed: usize) -> String {
    reads_per_claim(counts, reclaimed).map_or("–".into(), |reads| format!("{reads:.2}"))
}

/// Writes per reclaimed claim, to two decimals.
fn writes(counts: &Counts, reclaimed: usize) -> String {
    writes_per_claim(counts, reclaimed).map_or("–".into(), |writes| format!("{writes:.2}"))
}

fn ratio_of(a: Option<f64>, b: Option<f64>) -> String {
    a.zip(b)
        .and_then(|(a, b)| ratio(a, b))
        .map_or("–".into(), times)
}

/// A figure of the report, as Markdown: an image the report's directory holds.
fn embed(out: &mut String, figures: &[Figure], n: usize, kind: FigureKind) {
    for f in figures.iter().filter(|f| f.n == n && f.kind == kind) {
        let _ = writeln!(out, "![{}]({})\n", f.title, f.file);
    }
}

/// Two significant digits below 1 (so the garbage collector's 0.013× does not print as 0.0×),
/// one decimal up to 10, none above.
fn times(x: f64) -> String {
    let decimals = match x {
        x if x >= 10.0 => 0,
        x if x >= 1.0 => 1,
        x if x > 0.0 => (1.0 - x.log10().floor()).min(6.0) as usize,
        _ => 0,
    };
    format!("{x:.decimals$}×")
}

fn command_line(options: &Options) -> String {
    let sizes: Vec<String> = options.sizes.iter().map(|n| n.to_string()).collect();
    let mut line = format!("cargo bench --bench reclaim -- --sizes {}", sizes.join(","));
    let defaults = [
        (
            options.namespaces != 20,
            format!(" --namespaces {}", options.namespaces),
        ),
        (
            options.events.is_some(),
            format!(" --events {}", options.events.unwrap_or(0)),
        ),
        (options.rate != 8.0, format!(" --rate {}", options.rate)),
        (options.ttl_s != 30, format!(" --ttl {}", options.ttl_s)),
        (
            options.sweep_interval_s != 30,
            format!(" --sweep-interval {}", options.sweep_interval_s),
        ),
        (
            options.lean_from.is_some(),
            format!(" --lean-from {}", options.lean_from.unwrap_or(0)),
        ),
        (
            options.full_up_to != 10_000,
            format!(" --full-up-to {}", options.full_up_to),
        ),
        (
            options.churn.is_some(),
            options
                .churn
                .map(|(rate, seconds)| format!(" --churn {rate},{seconds}"))
                .unwrap_or_default(),
        ),
        (
            options.lone.is_some(),
            options
                .lone
                .map(|(rate, seconds)| format!(" --lone {rate},{seconds}"))
                .unwrap_or_default(),
        ),
        (
            options.busy.is_some(),
            format!(" --busy {}", options.busy.unwrap_or_default()),
        ),
        (options.skip_sweep, " --skip-sweep".into()),
        (
            options.idle_minutes > 0.0,
            format!(" --idle-minutes {}", options.idle_minutes),
        ),
        (options.with_baselines, " --with-baselines".into()),
        (
            options.apiservers != 1,
            format!(" --apiservers {}", options.apiservers),
        ),
        (
            !options.offsets.is_empty(),
            format!(
                " --offsets {}",
                (options.offsets.iter())
                    .map(|&ns| format!("{ns}ns"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ),
        (
            options.out != cluster::root().join("bench/RESULTS.md"),
            format!(" --out {}", options.out.display()),
        ),
    ];
    for (changed, arg) in defaults {
        if changed {
            line.push_str(&arg);
        }
    }
    // Other builds are named by label, with the settings they ran with; their paths are this
    // machine's.
    for (flag, specs) in [
        ("--variant", &options.variants),
        ("--churn-compare", &options.churn_compare),
    ] {
        for spec in specs {
            line.push_str(&format!(" {flag} {},PATH", spec.label));
            for (key, value) in &spec.env {
                line.push_str(&format!(",{key}={value}"));
            }
        }
    }
    line
}

fn shell(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(cluster::root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// FNV-1a, to name the uncommitted state of src/ that was measured.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| format!("{:.1} GiB", kib as f64 / 1048576.0))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_default();
    Machine {
        cores,
        model,
        memory,
    }
}

/// The build measured: this commit, and whether `src/` had uncommitted changes.
fn measured() -> Measured {
    let dirty = !shell("git", &["status", "--porcelain", "--", "src"]).is_empty();
    let src_diff = dirty.then(|| {
        let diff = Command::new("git")
            .args(["diff", "HEAD", "--", "src"])
            .current_dir(cluster::root())
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default();
        fnv1a(&diff)
    });
    Measured {
        git: shell("git", &["rev-parse", "--short", "HEAD"]),
        src_diff,
        rustc: shell("rustc", &["--version"]),
    }
}

/// A run about to measure, with what it runs on and no sizes yet.
pub fn start(options: &Options, started: DateTime<Utc>) -> Run {
    Run {
        started,
        command: command_line(options),
        settings: Settings {
            namespaces: options.namespaces,
            ttl_s: options.ttl_s,
            events: options.events,
            rate: options.rate,
            sweep_interval_s: options.sweep_interval_s,
            concurrency: options.concurrency,
        },
        machine: machine(),
        measured: measured(),
        sizes: Vec::new(),
    }
}

/// The report of `run`, with `figures` (drawn from it) linked where they belong.
pub fn render(run: &Run, figures: &[Figure]) -> String {
    let results = &run.sizes;
    let settings = &run.settings;
    let Machine {
        cores,
        model,
        memory,
    } = &run.machine;
    let mut out = String::new();
    let versions = results
        .first()
        .map(|r| r.versions.clone())
        .unwrap_or_default();

    let _ = writeln!(
        out,
        "# Reclaim benchmark: workspace-gc, a sweep janitor, and Kubernetes' garbage collector\n"
    );
    let _ = writeln!(
        out,
        "Generated by `{}` (started {}, {:.0} s in all). Rerunning the command regenerates this \
         file; its figures are in `target/bench-reclaim/`, in the JSON file named after it \
         (`--report-from` renders this file from them again). The code is in `bench/` (`reclaim.rs` drives it).\n",
        run.command,
        run.started.format("%Y-%m-%d %H:%M UTC"),
        results.iter().map(|r| r.total_s).sum::<f64>()
    );
    let _ = writeln!(out, "## Machine and versions\n");
    let _ = writeln!(out, "- CPU: {cores} cores ({model}); memory {memory}");
    for r in results {
        let _ = writeln!(
            out,
            "- Load average (1, 5, 15 min) before / after N = {}: {} / {}",
            r.n, r.load_before, r.load_after
        );
    }
    for (name, version) in &versions {
        let _ = writeln!(out, "- {name}: {version}");
    }
    let _ = writeln!(
        out,
        "- workspace-gc: git {} (release build of `src/` as in the working tree{}); {}",
        run.measured.git,
        run.measured
            .src_diff
            .map(|hash| format!(", with uncommitted changes: diff fingerprint {hash:016x}"))
            .unwrap_or_default(),
        run.measured.rustc
    );
    let _ = writeln!(
        out,
        "- Settings: {} namespaces; TTL after finished {} s; per size, E = min(N/10, 400, \
         what the finished builds can supply) events of each kind per contender{}, fired at up to \
         {} per second per kind and over at least one sweep interval; sweep interval {} s; creation with {} requests in flight. etcd and the audit log on tmpfs (/dev/shm).\n",
        settings.namespaces,
        settings.ttl_s,
        settings
            .events
            .map(|e| format!(" (overridden: {e})"))
            .unwrap_or_default(),
        settings.rate,
        settings.sweep_interval_s,
        settings.concurrency
    );

    out.push_str(METHOD);

    render_planes(&mut out, results);
    for r in results {
        render_size(&mut out, r, figures);
    }
    render_targets(&mut out, results);
    render_memory(&mut out, results);
    render_limits(&mut out, results);
    out
}

const METHOD: &str = "## Method\n\n\
One control plane per size (`scripts/control-plane up --controller-manager`, etcd with \
`--unsafe-no-fsync` on tmpfs) holds N builds, each a NotebookValidationJob, a PipelineRun \
binding the claim `{job}-build-workspace`, the claim, and two pods mounting it (2N pods). \
States: 20 % running (job `Building`, run `Unknown`, TaskRun pod and affinity-assistant pod \
`Running`: in use), 5 % finished hours ago with `keep=true`, the rest with their build finished \
at varied times (5 min to 6 h ago: run `Succeeded`, two TaskRun pods `Succeeded`) and the job \
still `ValidationRunning`; 3E of those have claims with an owner reference to their job, as \
`workspace-gc create` makes them. With a TTL of seconds nothing else can be waiting: nothing is \
due when a contender starts (checked: no unexpected deletions).\n\n\
Deadline events, fired by the benchmark at known instants: **owner deleted** — the job a claim \
references is deleted; the deadline is the instant the API server answered the delete. \
**TTL passed** — a validating job finishes (`phase: Succeeded`, `completionTime` = the current \
second); the deadline is completionTime + TTL. Reclaim lag = the instant the benchmark's own \
watch on claims first sees the claim deleted (`deletionTimestamp` set, or removed) minus the \
deadline.\n\n\
Phases, one after the other on the same objects (each contender gets its own E claims of each \
kind): (1) **Kubernetes GC**: owner-deleted events only (it has no TTL); kube-controller-manager \
is then stopped so that it cannot race the others (its PVC protection goes with it: later claims \
stay Terminating, which the watch counts as deleted). (2) **workspace-gc**: the release binary, \
`run` with leader election as deployed (one replica; its Lease in namespace `workspace-gc`), TTL via `WORKSPACE_GC_POLICY_TTL_AFTER_FINISHED`, pacing and cap \
raised (`WORKSPACE_GC_DELETION_DELETES_PER_SECOND=1000`, \
`WORKSPACE_GC_DELETION_MAX_DELETIONS_PER_WINDOW=1000000`), authenticated as user \
`bench:workspace-gc` with the ClusterRole of `manifests/base/rbac-cluster.yaml`. \
(3) **sweep janitor** (`bench/sweep.rs`): a separate process, user `bench:sweep`, same role; \
every 30 s it lists claims (by label), PipelineRuns, TaskRuns, jobs and pods in pages of 500, decides with \
workspace-gc's own `linking` and `policy::decide`, and deletes the due claims with \
`{uid, resourceVersion}` preconditions, 16 at a time.\n\n\
After its burst, each contender (at the sizes where every phase runs) gets a **churn** — claims \
coming due one at a time at a steady rate, half owner deletions and half TTLs (the garbage \
collector's all owner deletions, before kube-controller-manager is stopped) — measured from the \
first event until every claim was reclaimed; then an **idle** window with nothing due \
(workspace-gc and the sweep). `--churn-compare` runs another build of workspace-gc through the \
churn alone, for a before/after on the same objects. Sizes above `--full-up-to` measure \
workspace-gc's burst alone, and sizes from `--lean-from` on are built lean: one pod per build \
(the build's TaskRun pod) instead of two.\n\n\
Requests come from the kube-apiserver audit log (level Metadata; the policy records only the \
contenders' users and kube-controller-manager), counted from ready to the end of the phase \
and divided by the claims reclaimed; the garbage collector's are those of \
kube-controller-manager with user agent `…/generic-garbage-collector`. LIST bytes: the API \
server's `apiserver_response_sizes_sum{verb=\"LIST\"}` from ready to the end of the phase (only the \
contender lists then; the initial lists are shown apart, and where they are streamed as watch \
events they are not LISTs at all). Memory and CPU: `/proc/PID/status` VmHWM/VmRSS and `/proc/PID/stat` \
utime+stime. API server and etcd CPU: the same, over each phase's window.\n\n\
Writes per reclaimed claim count every mutating verb a contender sends (create, update, patch, \
delete, deletecollection): workspace-gc's DELETEs, its Events and its Lease's writes (the \
renewals and the write that fences each DELETE); the garbage collector's DELETEs. Right after \
each workspace-gc build is ready, a **plain client** sends its initial lists again: the \
requests the audit log recorded from its start to ready (its streamed lists, or the first page \
of each paged list, with the pages after it followed again), with curl through the daemon's own \
kubeconfig over HTTP/1.1, every kind at once and each kind's requests in order, as the daemon \
sent them. curl's output is not decoded: a streamed list is read up to the bookmark that ends \
its initial events. That time is what the API server needs to serve the lists, and ready is \
shown as a ratio to it; the plain client's requests (told apart by their user agent), and the \
API server and etcd CPU spent meanwhile, are left out of the phase's figures.\n\n\
The figures (SVG, next to this file, drawn by the same command and by `--report-from`) show \
each size's reclaim-lag distributions, burst and churn, on a log axis (lags up to 1 ms drawn at \
1 ms), and where a churn ran, each build's churn lag against its reads.\n\n\
Other builds of workspace-gc (a proposed change to `src/`, or the same build with other \
settings) can be measured on the same objects with `--variant LABEL,PATH[,ENV=VALUE...]` \
(repeatable; add `--with-baselines` to keep the baselines; with `--churn`, each is a point of \
the lag against reads) and `--out` another file.\n\n";

fn render_size(out: &mut String, r: &SizeResult, figures: &[Figure]) {
    match r.plane.as_str() {
        "" => writeln!(out, "## N = {}\n", group(r.n)),
        plane => writeln!(out, "## N = {}, {plane}\n", group(r.n)),
    }
    .ok();
    let states: Vec<String> = r
        .states
        .iter()
        .map(|(name, count)| format!("{} {name}", group(*count)))
        .collect();
    let _ = writeln!(
        out,
        "Objects: {} claims, {} runs, {} jobs, {} pods in {} namespaces ({} pods per \
         namespace{}); builds: {}. E = {} events of each kind per contender, {:.1} per second per \
         kind{}.\n",
        group(r.n),
        group(r.n),
        group(r.n),
        group(r.pods_per_build * r.n),
        r.namespaces,
        group(r.pods_per_build * r.n / r.namespaces.max(1)),
        if r.pods_per_build == 1 {
            "; lean: one pod per build"
        } else {
            ""
        },
        states.join(", "),
        r.events,
        r.rate,
        if r.full {
            ""
        } else {
            "; workspace-gc's burst alone at this size"
        }
    );
    let _ = writeln!(
        out,
        "Control plane up in {:.0} s. Creation: {} objects with {} requests in {:.0} s = {:.0} \
         requests/s ({:.0} builds/s) through one client; etcd afterwards: database {:.0} MiB \
         (data directory with preallocated WAL {:.0} MiB).\n",
        r.control_plane_s,
        group(r.create_objects),
        group(r.create_requests),
        r.create_s,
        r.create_requests as f64 / r.create_s.max(0.001),
        r.n as f64 / r.create_s.max(0.001),
        r.etcd_db_bytes as f64 / 1048576.0,
        r.etcd_bytes as f64 / 1048576.0
    );

    let cs: Vec<&Contender> = [Role::Daemon, Role::Sweep, Role::Gc]
        .iter()
        .flat_map(|role| r.contenders.iter().filter(move |c| c.role == *role))
        .collect();
    let compared: Vec<&Contender> = cs.iter().copied().filter(|c| c.churn_only).collect();
    let cs: Vec<&Contender> = cs.into_iter().filter(|c| !c.churn_only).collect();
    let _ = write!(out, "| |");
    for c in &cs {
        let _ = write!(out, " {} |", c.name);
    }
    let _ = write!(out, "\n|---|");
    for _ in &cs {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    let row = |out: &mut String, label: &str, f: &dyn Fn(&Contender) -> String| {
        let _ = write!(out, "| {label} |");
        for c in &cs {
            let _ = write!(out, " {} |", f(c));
        }
        out.push('\n');
    };
    row(out, "ready (start → synced / first sweep done)", &|c| {
        c.ready_s
            .map(|v| format!("{v:.2} s"))
            .unwrap_or_else(|| "already running".into())
    });
    row(
        out,
        "ready ÷ a plain client's time for the same lists",
        &|c| match (c.ready_s, &c.plain_lists) {
            (Some(ready), Some(lists)) => format!(
                "{} ({:.2} s; {:.0} MiB)",
                ratio_of(Some(ready), Some(lists.wall_s)),
                lists.wall_s,
                lists.requests.iter().map(|q| q.bytes).sum::<u64>() as f64 / 1048576.0
            ),
            _ if c.role == Role::Daemon => "not measured in this run".into(),
            _ => "–".into(),
        },
    );
    row(out, "lag, owner deleted: p50 / p99 / max", &|c| {
        lag_cell(lag_stats(&c.lags, Some(EventKind::OwnerDeleted)))
    });
    row(out, "lag, TTL passed: p50 / p99 / max", &|c| {
        lag_cell(lag_stats(&c.lags, Some(EventKind::TtlPassed)))
    });
    row(out, "lag, all events: p50 / p99 / max", &|c| {
        lag_cell(lag_stats(&c.lags, None))
    });
    row(out, "claims reclaimed / events", &|c| {
        format!("{} / {}", c.reclaimed(), c.lags.len())
    });
    row(out, "requests per reclaimed claim, by verb", &|c| {
        verbs(&c.steady, c.reclaimed())
    });
    row(out, "reads (get + list) per reclaimed claim", &|c| {
        reads(&c.steady, c.reclaimed())
    });
    row(
        out,
        "writes (every mutating verb: DELETE, Event, Lease) per reclaimed claim",
        &|c| writes(&c.steady, c.reclaimed()),
    );
    row(
        out,
        "LIST calls after initial sync: namespaced / cluster-wide",
        &|c| format!("{} / {}", c.steady.namespaced_lists, c.steady.cluster_lists),
    );
    row(
        out,
        "LIST bytes served after sync, per reclaimed claim",
        &|c| kib_per(c.list_bytes, c.reclaimed()),
    );
    row(
        out,
        "requests during initial sync (list pages + watches)",
        &|c| {
            if c.sync.total == 0 {
                "–".into()
            } else if c.sync.verb("list") == 0 {
                format!(
                    "{} (watch {}: lists streamed as watch events)",
                    c.sync.total,
                    c.sync.verb("watch")
                )
            } else {
                format!(
                    "{} (list {}, watch {}; {:.0} MiB listed)",
                    c.sync.total,
                    c.sync.verb("list"),
                    c.sync.verb("watch"),
                    c.sync_list_bytes / 1048576.0
                )
            }
        },
    );
    row(out, "peak RSS (VmHWM)", &|c| {
        c.at_end
            .map(|p| mib(p.hwm_kib))
            .unwrap_or_else(|| "–".into())
    });
    row(
        out,
        "RSS after sync / at end",
        &|c| match (c.at_ready, c.at_end) {
            (Some(a), Some(b)) => format!("{} / {}", mib(a.rss_kib), mib(b.rss_kib)),
            (None, Some(b)) => format!("– / {}", mib(b.rss_kib)),
            _ => "–".into(),
        },
    );
    row(
        out,
        "peak RSS per object tracked",
        &|c| match (c.at_end, c.tracked) {
            (Some(p), Some(t)) if t > 0 && c.role != Role::Gc => {
                format!(
                    "{:.0} B ({} objects)",
                    p.hwm_kib as f64 * 1024.0 / t as f64,
                    group(t as usize)
                )
            }
            _ => "–".into(),
        },
    );
    row(
        out,
        "CPU: to ready / whole phase",
        &|c| match (c.at_ready, c.at_end) {
            (Some(a), Some(b)) => format!("{:.2} s / {:.2} s", a.cpu_s, b.cpu_s),
            (None, Some(b)) => format!("– / {:.2} s (since start)", b.cpu_s),
            _ => "–".into(),
        },
    );
    row(out, "API server / etcd CPU during the phase", &|c| {
        format!(
            "{:.1} s / {:.1} s over {:.0} s",
            c.apiserver_cpu_s, c.etcd_cpu_s, c.window_s
        )
    });
    row(out, "unexpected deletions", &|c| {
        c.unexpected_deletions.to_string()
    });
    out.push('\n');
    embed(out, figures, r.n, FigureKind::LagCdf);

    // Ratios against the baselines.
    let daemon = cs.iter().find(|c| c.role == Role::Daemon);
    let sweep = cs.iter().find(|c| c.role == Role::Sweep);
    let gc = cs.iter().find(|c| c.role == Role::Gc);
    if let Some(d) = daemon
        && (sweep.is_some() || gc.is_some())
    {
        let _ = writeln!(
            out,
            "Ratios (baseline ÷ workspace-gc; above 1× favours workspace-gc):\n"
        );
        let _ = writeln!(out, "| | sweep janitor | Kubernetes GC |\n|---|---|---|");
        let lag = |c: Option<&&Contender>, kind, f: fn(LagStats) -> Option<f64>| {
            c.and_then(|c| f(lag_stats(&c.lags, kind)))
        };
        let owner = Some(EventKind::OwnerDeleted);
        let ttl = Some(EventKind::TtlPassed);
        let dl = |kind, f: fn(LagStats) -> Option<f64>| f(lag_stats(&d.lags, kind));
        let _ = writeln!(
            out,
            "| p50 lag, owner deleted | {} | {} |",
            ratio_of(lag(sweep, owner, |s| s.p50), dl(owner, |s| s.p50)),
            ratio_of(lag(gc, owner, |s| s.p50), dl(owner, |s| s.p50))
        );
        let _ = writeln!(
            out,
            "| p99 lag, owner deleted | {} | {} |",
            ratio_of(lag(sweep, owner, |s| s.p99), dl(owner, |s| s.p99)),
            ratio_of(lag(gc, owner, |s| s.p99), dl(owner, |s| s.p99))
        );
        let _ = writeln!(
            out,
            "| p99 lag, TTL passed | {} | n/a (no TTL) |",
            ratio_of(lag(sweep, ttl, |s| s.p99), dl(ttl, |s| s.p99))
        );
        let req = |c: &Contender| {
            (c.reclaimed() > 0).then(|| c.steady.non_watch() as f64 / c.reclaimed() as f64)
        };
        let _ = writeln!(
            out,
            "| requests per reclaimed claim (all verbs but watch) | {} | {} |",
            ratio_of(sweep.and_then(|c| req(c)), req(d)),
            ratio_of(gc.and_then(|c| req(c)), req(d))
        );
        let bytes =
            |c: &Contender| (c.reclaimed() > 0).then(|| c.list_bytes / c.reclaimed() as f64);
        let _ = writeln!(
            out,
            "| LIST bytes after sync per reclaimed claim | {} | – |",
            ratio_of(sweep.and_then(|c| bytes(c)), bytes(d))
        );
        let peak = |c: &Contender| c.at_end.map(|p| p.hwm_kib as f64);
        let _ = writeln!(
            out,
            "| peak RSS | {} | {} (all of kube-controller-manager) |",
            ratio_of(sweep.and_then(|c| peak(c)), peak(d)),
            ratio_of(gc.and_then(|c| peak(c)), peak(d))
        );
        out.push('\n');
    }

    let steady: Vec<&Contender> = cs.iter().chain(&compared).copied().collect();
    render_steady(out, r, &steady);
    render_tradeoffs(out, r, figures);

    // Detail: requests by verb and resource.
    let _ = writeln!(
        out,
        "<details><summary>Requests after sync by verb and resource</summary>\n"
    );
    for c in &cs {
        let _ = writeln!(out, "- **{}**: {:?}", c.name, c.steady.by_verb_resource);
        if c.sync.total > 0 {
            let _ = writeln!(out, "  - initial sync: {:?}", c.sync.by_verb_resource);
        }
        if !c.steady.errors.is_empty() {
            let _ = writeln!(out, "  - answered ≥ 400: {:?}", c.steady.errors);
        }
        if let Some((what, counts)) = &c.other {
            let _ = writeln!(out, "  - {what}: {:?}", counts.by_verb_resource);
        }
        if let Some(lists) = &c.plain_lists {
            let each: Vec<String> = lists
                .requests
                .iter()
                .map(|q| {
                    format!(
                        "{} {:.2} s, {:.1} MiB",
                        q.what,
                        q.seconds,
                        q.bytes as f64 / 1048576.0
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  - the same lists by a plain client, {:.2} s in all (API server / etcd CPU \
                 {:.2} s / {:.2} s): {}",
                lists.wall_s,
                lists.apiserver_cpu_s,
                lists.etcd_cpu_s,
                each.join("; ")
            );
        }
        for note in &c.notes {
            let _ = writeln!(out, "  - note: {note}");
        }
        if !c.sweeps.is_empty() {
            let list: Vec<String> = c
                .sweeps
                .iter()
                .map(|(l, d)| format!("{l:.1}/{d:.1}"))
                .collect();
            let _ = writeln!(
                out,
                "  - sweeps (list s / whole sweep s): {}",
                list.join(", ")
            );
        }
    }
    let _ = writeln!(out, "\n</details>\n");
}

/// The churn and idle tables of one size.
fn render_steady(out: &mut String, r: &SizeResult, cs: &[&Contender]) {
    let churned: Vec<(&Contender, &Steady)> = cs
        .iter()
        .filter_map(|c| Some((*c, c.churn.as_ref()?)))
        .collect();
    let idled: Vec<(&Contender, &Steady)> = cs
        .iter()
        .filter_map(|c| Some((*c, c.idle.as_ref()?)))
        .collect();
    // The API server's own rate: while workspace-gc idles, it asks nothing of it.
    let idle_rate = idled
        .iter()
        .find(|(c, _)| c.role == Role::Daemon)
        .map(|(_, idle)| idle.apiserver_cpu_s / idle.window_s.max(1.0));
    let table = |out: &mut String, columns: &[(&Contender, &Steady)]| {
        let _ = write!(out, "| |");
        for (c, _) in columns {
            let _ = write!(out, " {} |", c.name);
        }
        let _ = write!(out, "\n|---|");
        for _ in columns {
            let _ = write!(out, "---|");
        }
        out.push('\n');
    };
    let row = |out: &mut String,
               columns: &[(&Contender, &Steady)],
               label: &str,
               f: &dyn Fn(&Steady) -> String| {
        let _ = write!(out, "| {label} |");
        for (_, steady) in columns {
            let _ = write!(out, " {} |", f(steady));
        }
        out.push('\n');
    };
    let churn_table = |out: &mut String, columns: &[(&Contender, &Steady)]| {
        table(out, columns);
        let per = |steady: &Steady, value: f64| {
            if steady.reclaimed() == 0 {
                "–".to_owned()
            } else {
                format!("{:.3}", value / steady.reclaimed() as f64)
            }
        };
        row(out, columns, "claims reclaimed / events", &|c| {
            format!("{} / {}", c.reclaimed(), c.lags.len())
        });
        row(out, columns, "lag p50 / p99 / max", &|c| {
            lag_cell(lag_stats(&c.lags, None))
        });
        row(
            out,
            columns,
            "requests per reclaimed claim, by verb",
            &|c| verbs(&c.requests, c.reclaimed()),
        );
        row(
            out,
            columns,
            "reads (get + list) per reclaimed claim",
            &|c| reads(&c.requests, c.reclaimed()),
        );
        row(
            out,
            columns,
            "writes (every mutating verb) per reclaimed claim",
            &|c| writes(&c.requests, c.reclaimed()),
        );
        row(out, columns, "LIST bytes per reclaimed claim", &|c| {
            kib_per(c.list_bytes, c.reclaimed())
        });
        row(out, columns, "API server CPU s per reclaimed claim", &|c| {
            per(c, c.apiserver_cpu_s)
        });
        row(
            out,
            columns,
            "API server CPU s per reclaimed claim, above idle",
            &|c| match idle_rate {
                Some(rate) => per(c, (c.apiserver_cpu_s - rate * c.window_s).max(0.0)),
                None => "–".into(),
            },
        );
        row(out, columns, "etcd CPU s per reclaimed claim", &|c| {
            per(c, c.etcd_cpu_s)
        });
        row(out, columns, "contender CPU s per reclaimed claim", &|c| {
            c.cpu_s.map_or("–".into(), |cpu| per(c, cpu))
        });
        row(out, columns, "window", &|c| format!("{:.0} s", c.window_s));
        out.push('\n');
    };
    if let Some((_, first)) = churned.first() {
        let _ = writeln!(
            out,
            "### Steady churn (N = {})\n\n{} claims per contender came due one at a time, \
             {:.1} per second (workspace-gc's and the sweep's half owner deletions, half TTLs; \
             the garbage collector's owner deletions only), measured from the first event until \
             every claim was reclaimed and 2 s more. API server CPU above idle subtracts what the \
             API server spent per second while workspace-gc idled{}.\n",
            group(r.n),
            first.lags.len(),
            first.lags.len() as f64 / first.window_s.max(1.0),
            idle_rate
                .map(|rate| format!(" ({:.3} s per second)", rate))
                .unwrap_or_else(|| " (not measured: no idle window)".into())
        );
        churn_table(out, &churned);
    }
    let alone: Vec<(&Contender, &Steady)> = cs
        .iter()
        .filter_map(|c| Some((*c, c.lone.as_ref()?)))
        .collect();
    if let Some((_, first)) = alone.first() {
        let _ = writeln!(
            out,
            "### Claims coming due alone (N = {})\n\n{} claims per contender came due one at a \
             time, {:.2} per second, further apart than a proof round's interval, so that no two \
             re-checks could share a round (`--lone`), after the churn; measured as the churn.\n",
            group(r.n),
            first.lags.len(),
            first.lags.len() as f64 / first.window_s.max(1.0),
        );
        churn_table(out, &alone);
    }
    if let Some((_, first)) = idled.first() {
        let _ = writeln!(
            out,
            "### Idle (N = {})\n\n{:.1} minutes with nothing due, after the churn.\n",
            group(r.n),
            first.window_s / 60.0
        );
        table(out, &idled);
        row(out, &idled, "requests, by verb and resource", &|c| {
            if c.requests.total == 0 {
                "none".into()
            } else {
                format!("{} {:?}", c.requests.total, c.requests.by_verb_resource)
            }
        });
        row(out, &idled, "requests per minute", &|c| {
            format!(
                "{:.1}",
                c.requests.total as f64 * 60.0 / c.window_s.max(1.0)
            )
        });
        row(out, &idled, "LIST bytes served", &|c| {
            format!("{:.1} MiB", c.list_bytes / 1048576.0)
        });
        row(out, &idled, "API server / etcd CPU", &|c| {
            format!(
                "{:.1} s / {:.1} s ({:.1} % / {:.1} % of a core)",
                c.apiserver_cpu_s,
                c.etcd_cpu_s,
                100.0 * c.apiserver_cpu_s / c.window_s.max(1.0),
                100.0 * c.etcd_cpu_s / c.window_s.max(1.0)
            )
        });
        row(out, &idled, "contender CPU", &|c| {
            c.cpu_s.map_or("–".into(), |cpu| format!("{cpu:.2} s"))
        });
        row(out, &idled, "RSS at the end", &|c| {
            c.at_end.map_or("–".into(), |p| mib(p.rss_kib))
        });
        out.push('\n');
    }
}

/// The churn's lag against reads, one row and one point per build (and baseline) churned.
fn render_tradeoffs(out: &mut String, r: &SizeResult, figures: &[Figure]) {
    let points = tradeoffs(r);
    if points.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Lag against reads (churn, N = {})\n\nEach build's churn (and each baseline's) as \
         one point: reads (GET + LIST, the Lease's GETs left out) per reclaimed claim against \
         the lag of its claims. `--variant` and `--churn-compare` add builds, or settings of one \
         build, as points.\n",
        group(r.n)
    );
    let _ = writeln!(
        out,
        "| | reads per reclaimed claim | lag p50 / p99 / max | writes per reclaimed claim |\n\
         |---|---|---|---|"
    );
    for t in &points {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {} | {:.2} |",
            t.name,
            t.reads,
            lag_cell(t.lag),
            t.writes
        );
    }
    out.push('\n');
    embed(out, figures, r.n, FigureKind::LagReads);
}

/// A clock spread as the report writes it: 0, 5 ms, 300 ms, 5 s.
pub fn nanos(ns: i64) -> String {
    match ns.unsigned_abs() {
        0 => "0".to_owned(),
        a if a < 1_000_000 => format!("{} µs", ns as f64 / 1e3),
        a if a < 1_000_000_000 => format!("{} ms", ns as f64 / 1e6),
        _ => format!("{} s", ns as f64 / 1e9),
    }
}

/// With `--apiservers` and `--offsets`: workspace-gc's reclaim lag on each plane, the single
/// server's first, per size.
fn render_planes(out: &mut String, results: &[SizeResult]) {
    if results.iter().all(|r| r.plane.is_empty()) {
        return;
    }
    let _ = writeln!(
        out,
        "## Reclaim lag across control planes\n\nworkspace-gc's reclaim lag, p50 / p99 / max, on \
         each control plane of this run: one kube-apiserver, then several behind HAProxy with \
         their clocks spread over the offset named (server I of N that far × (I − 1) / (N − 1)).\n"
    );
    let _ = writeln!(
        out,
        "| N | control plane | owner deleted | TTL passed | all |\n|---|---|---|---|---|"
    );
    for r in results {
        for c in r.contenders.iter().filter(|c| c.role == Role::Daemon) {
            let _ = writeln!(
                out,
                "| {} | {} ({}) | {} | {} | {} |",
                group(r.n),
                r.plane,
                c.name,
                lag_cell(lag_stats(&c.lags, Some(EventKind::OwnerDeleted))),
                lag_cell(lag_stats(&c.lags, Some(EventKind::TtlPassed))),
                lag_cell(lag_stats(&c.lags, None)),
            );
        }
    }
    out.push('\n');
}

fn render_targets(out: &mut String, sizes: &[SizeResult]) {
    let at = targets::reference(sizes).map_or(targets::REFERENCE_N, |r| r.n);
    let _ = writeln!(
        out,
        "## Targets\n\nworkspace-gc at N = {} unless the row names another size. Why a target \
         is missed: [docs/performance.md](../docs/performance.md#why-a-target-is-missed).\n",
        group(at)
    );
    let _ = writeln!(out, "| target | measured | verdict |\n|---|---|---|");
    for row in targets::judge(sizes) {
        let verdict = match row.verdict {
            Verdict::Met => "met",
            Verdict::Missed => "**missed** ([why](../docs/performance.md#why-a-target-is-missed))",
            Verdict::NotMeasured => "not measured",
        };
        let _ = writeln!(out, "| {} | {} | {verdict} |", row.promise, row.shown);
    }
    out.push('\n');
}

fn render_memory(out: &mut String, results: &[SizeResult]) {
    let Some(m) = memory_model(results) else {
        return;
    };
    let mib_of = |bytes: f64| bytes / 1048576.0;
    let _ = writeln!(
        out,
        "## Memory per object\n\nworkspace-gc's RSS right after the initial sync grows by {:.0} \
         bytes per cached object (the daemon's count of the objects it holds) between {} objects \
         (N = {}) and {} objects (N = {}): the difference of the two readings over the difference \
         of the object counts. The same line meets zero objects at {:.1} MiB. The most a size's \
         peak rose above its post-sync reading while reclaiming: {:.1} MiB.\n\n\
         By these figures: **memory ≈ {:.0} MiB + {:.0} B × cached objects, plus {:.0} MiB**. At \
         10,000 builds of two pods (50,000 objects) that is {:.0} MiB; at 50,000 (250,000 \
         objects) {:.0} MiB.\n",
        m.bytes_per_object,
        group(m.points[0].0 as usize),
        group(m.points[0].1),
        group(m.points[1].0 as usize),
        group(m.points[1].1),
        mib_of(m.base_bytes),
        mib_of(m.in_flight_bytes),
        mib_of(m.base_bytes),
        m.bytes_per_object,
        mib_of(m.in_flight_bytes),
        mib_of(m.bytes_for(50_000.0)),
        mib_of(m.bytes_for(250_000.0)),
    );
}

fn render_limits(out: &mut String, results: &[SizeResult]) {
    out.push_str(
        "## What limits each figure\n\n\
- **One 2-core machine runs everything**: etcd, kube-apiserver, kube-controller-manager (until \
the end of phase 1), the contender, and the benchmark's watch and event generator (see the \
load averages above). Every latency includes CPU contention; the API server / etcd CPU rows \
show how much of the machine each phase took. Absolute numbers are pessimistic against a real \
control plane; the ratios between contenders, measured on the same machine minutes apart, are \
the meaningful part.\n\
- **Lag resolution**: TTL deadlines are whole seconds (`completionTime` has second precision, \
as Tekton and the operator write it); the benchmark's watch adds its delivery delay \
(milliseconds); owner-deleted deadlines are taken when the benchmark's DELETE returns, so a \
contender that sees the deletion before the benchmark's own client does can show a lag \
slightly below zero.\n\
- **Sweep janitor**: its lag includes where in its 30 s cycle the deadline falls (uniform over \
0–30 s, hence events spread over at least one interval); it lists everything every interval \
whether or not anything is due, so its requests per reclaimed claim fall as more claims fall \
due per interval, and its LIST bytes grow with the cluster.\n\
- **Kubernetes GC**: kube-controller-manager runs with its default client rate limit \
(`--kube-api-qps` 20). It reclaims on owner deletion only (no TTL here), and deletes a claim \
whether or not a pod mounts it.\n",
    );
    if let Some(big) = results.iter().max_by_key(|r| r.n)
        && big.create_s > 0.0
    {
        let rate = big.create_requests as f64 / big.create_s;
        let per_build = big.create_requests as f64 / big.n as f64;
        let db_per_build = big.etcd_db_bytes as f64 / big.n as f64;
        if let Some(lean) = results.iter().find(|r| r.pods_per_build == 1) {
            out.push_str(&format!(
                "- **N = {} is built lean** (one pod per build) and measures workspace-gc's burst \
alone: creating its objects through one API server took {:.0} min at {rate:.0} requests/s.\n",
                group(lean.n),
                lean.create_s / 60.0
            ));
        }
        if !results.iter().any(|r| r.n >= 50_000) {
            out.push_str(&format!(
                "- **50,000 builds were not run**: at the creation rate measured at N = {} \
({rate:.0} requests/s, {per_build:.1} requests per build) they would take about {:.0} min to \
create, and etcd would hold about {:.0} MiB ({:.1} KiB per build).\n",
                group(big.n),
                50_000.0 * per_build / rate / 60.0,
                50_000.0 * db_per_build / 1048576.0,
                db_per_build / 1024.0
            ));
        }
    }
}
