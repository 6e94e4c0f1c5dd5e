//! One function per subcommand, each returning the process exit code. `main` only parses,
//! loads the configuration and dispatches here.

use std::time::Duration;

use http::HeaderValue;
use http::header::USER_AGENT;
use kube::Client;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cluster::label_guard;
use crate::cluster::server_clock::ServerClock;
use crate::cluster::watches;
use crate::config::{self, Config};
use crate::creator::{self, Ensured};
use crate::daemon::controller::{self, RunOptions};
use crate::decide::facts::ObjectKey;
use crate::surface::cli::{AdmissionPolicyArgs, AuditArgs, AuditOutput, CreateArgs, CreateOutput};
use crate::surface::{admission, audit};

/// Exit codes, documented in docs/commands.md.
pub mod exit {
    pub const OK: i32 = 0;
    /// The daemon or a command failed while running.
    pub const FAILURE: i32 = 1;
    /// Invalid command line or configuration: nothing was started.
    pub const CONFIG: i32 = crate::config::EXIT_CONFIG;
    /// No usable cluster access: kubeconfig missing or malformed, or the API server unreachable.
    pub const CLUSTER: i32 = 3;
    /// `audit --fail-on-delete` found claims that would be deleted.
    pub const WOULD_DELETE: i32 = 4;
    /// `create`: the claim was created.
    pub const CREATED: i32 = OK;
    /// `create`: the claim already existed, owned by this job, and was left as it was.
    pub const ALREADY_PRESENT: i32 = 5;
    /// `create`: nothing was created and retrying as is will not help: the job is missing or
    /// being deleted, or a claim of that name exists that is not this job's (terminating, owned
    /// by another object, or unowned). The message says which and what to do.
    pub const REFUSED: i32 = 6;

    /// The `create` exit code for `error`: [`REFUSED`] when the cluster's state forbids the
    /// claim, [`FAILURE`] when the attempt failed and a retry may succeed.
    pub fn of_create(error: &crate::creator::CreateError) -> i32 {
        if error.is_refusal() { REFUSED } else { FAILURE }
    }
}

/// How long start-up waits for the API server before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The User-Agent of every request a `command` (`run`, `audit`, `create`) sends, such as
/// `workspace-gc/0.1.0 (run)`: it names this traffic in the API server's audit log and to API
/// Priority and Fairness, and the server takes the default field manager of a write (the events)
/// from it: the part before the `/`, `workspace-gc`.
pub fn user_agent(command: &str) -> String {
    format!("workspace-gc/{} ({command})", env!("CARGO_PKG_VERSION"))
}

/// A client for the cluster for `command` and the API server's clock its answers tell, or the
/// exit code after saying why there is none.
pub async fn connect_or_exit(command: &str) -> Result<(Client, ServerClock), i32> {
    connect(command).await.map_err(|message| {
        error!("{message}");
        exit::CLUSTER
    })
}

/// Builds a client from the in-cluster service account or the kubeconfig, and checks the
/// API server answers, with its time: deadlines are judged by it.
async fn connect(command: &str) -> Result<(Client, ServerClock), String> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no usable cluster access (in-cluster or KUBECONFIG): {e}"))?;
    let agent = HeaderValue::from_str(&user_agent(command))
        .map_err(|e| format!("invalid User-Agent for {command}: {e}"))?;
    config.headers.push((USER_AGENT, agent));
    // kube retries 429, 503 and 504 by itself, for minutes and invisibly: a DELETE that passed
    // the live re-check and the fence would go out again after both had lapsed. Every request
    // is sent once; the daemon decides again after a refusal (see `daemon::controller`).
    config.default_retry = false;
    let url = config.cluster_url.clone();
    let clock = ServerClock::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| format!("cannot build a client for {url}: {e}"))?
        .with_layer(&clock.layer())
        .build();
    match tokio::time::timeout(CONNECT_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(_)) if !clock.known() => Err(format!(
            "the API server at {url} answered without a valid Date header: its clock, by which \
             deadlines are judged, cannot be known"
        )),
        Ok(Ok(version)) => {
            info!(server = %url, version = %version.git_version, "connected");
            Ok((client, clock))
        }
        Ok(Err(e)) => Err(format!("the API server at {url} did not answer: {e}")),
        Err(_) => Err(format!(
            "the API server at {url} did not answer within {}s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// `workspace-gc run`: the daemon, until SIGTERM or SIGINT.
pub async fn run(config: Config) -> i32 {
    let (client, clock) = match connect_or_exit("run").await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| default_identity());
    let options = RunOptions {
        identity,
        pod_namespace: std::env::var("POD_NAMESPACE").ok(),
        listen: config.http.listen,
        clock,
    };
    match controller::run(client, config, options, stop).await {
        Ok(()) => exit::OK,
        Err(e) => {
            error!("{e}");
            exit::FAILURE
        }
    }
}

/// `workspace-gc audit`: list once, decide every claim, print, exit.
pub async fn audit(config: Config, args: &AuditArgs) -> i32 {
    let (client, clock) = match connect_or_exit("audit").await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let mut failures = 0;
    let synced = watches::sync_once(&client, &config, |kind, error| {
        failures += 1;
        warn!(kind = kind.as_str(), %error, "listing failed");
        // A few retries ride out a blip; a persistent error (RBAC, missing CRD) ends the audit.
        failures < 5
    });
    let Some(index) = synced.await else {
        error!("could not list every kind the audit needs; see the errors above");
        return exit::CLUSTER;
    };
    // Judged as the daemon judges: never later than the API server's clock.
    let now = clock.now();
    let policies = config.policies();
    let mut rows = audit::rows(&index, &policies, now);
    let volumes = volume_policies(&client, &rows).await;
    audit::with_volumes(&mut rows, &volumes);
    let quotas = match config.quota.waters() {
        Some(waters) => audit::quotas(&index, &policies, waters, now, &mut rows),
        None => Vec::new(),
    };
    let guard = label_guard::read(&client).await;
    if !guard.installed() {
        warn!("{}", guard.describe());
    }
    let report = match args.output {
        AuditOutput::Table => {
            audit::header(&guard) + &audit::table(&rows, now) + &audit::quota_table(&quotas)
        }
        AuditOutput::Json => audit::json(&rows),
    };
    print!("{report}");
    if args.fail_on_delete && audit::due(&rows) > 0 {
        exit::WOULD_DELETE
    } else {
        exit::OK
    }
}

/// The reclaim policy of each bound claim's volume, read by name; a volume that cannot be read
/// (no `get` on PersistentVolumes, or gone) is left out, and its claims show `unknown`.
async fn volume_policies(
    client: &Client,
    rows: &[audit::Row],
) -> std::collections::BTreeMap<String, String> {
    let metrics = crate::observe::metrics::Metrics::register(&mut Default::default());
    let volumes: std::collections::BTreeSet<&String> =
        rows.iter().filter_map(|row| row.volume.as_ref()).collect();
    let mut read = std::collections::BTreeMap::new();
    for volume in volumes {
        let found = crate::cluster::live::volume(client, volume, &metrics).await;
        if let Some(policy) = found.and_then(|found| found.reclaim_policy) {
            read.insert(volume.clone(), policy);
        }
    }
    let unread = rows.iter().filter(|row| {
        row.volume
            .as_ref()
            .is_some_and(|volume| !read.contains_key(volume))
    });
    let unread = unread.count();
    if unread > 0 {
        warn!(
            claims = unread,
            "the volumes of some bound claims could not be read (get persistentvolumes); their volume policy shows unknown"
        );
    }
    read
}

/// `workspace-gc create`: reads the job, ensures its claim, prints the claim on stdout.
/// Returns [`exit::CREATED`], [`exit::ALREADY_PRESENT`], [`exit::REFUSED`], [`exit::CLUSTER`]
/// or [`exit::FAILURE`].
pub async fn create(config: &Config, args: &CreateArgs) -> i32 {
    let (client, _) = match connect_or_exit("create").await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let ensured = match creator::read_job(&client, &args.namespace, &args.job).await {
        Ok(job) => creator::ensure_build_claim(&client, &job, &config.creator).await,
        Err(e) => Err(e),
    };
    let Ensured { mut claim, created } = match ensured {
        Ok(ensured) => ensured,
        Err(e) => {
            error!("{e}");
            return exit::of_create(&e);
        }
    };
    let key = ObjectKey::of(&claim.metadata);
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if created {
        info!(claim = %key, %uid, "created the workspace claim");
    } else {
        info!(claim = %key, %uid, "the workspace claim is already present, owned by this job");
    }
    // Bookkeeping of the API server's, not part of the claim a reader wants to see.
    claim.metadata.managed_fields = None;
    match render(&claim, args.output) {
        Ok(text) => {
            print!("{text}");
            if created {
                exit::CREATED
            } else {
                exit::ALREADY_PRESENT
            }
        }
        Err(e) => {
            error!("cannot print claim {key}: {e}");
            exit::FAILURE
        }
    }
}

fn render(value: &impl Serialize, output: CreateOutput) -> Result<String, String> {
    match output {
        CreateOutput::Yaml => serde_saphyr::to_string(value).map_err(|e| e.to_string()),
        CreateOutput::Json => serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|e| e.to_string()),
    }
}

/// `workspace-gc check-config`: the effective configuration as TOML.
pub fn check_config(config: &Config) -> i32 {
    match toml::to_string(config) {
        Ok(text) => {
            print!("{text}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot print the configuration: {e}");
            exit::FAILURE
        }
    }
}

/// `workspace-gc admission-policy`: the admission guard for the configuration, as YAML: the
/// guard, the fence with leader election, and the label guard, always (its writers are
/// `provenance.label_writers`, none by default).
pub fn admission_policy(config: &Config, args: &AdmissionPolicyArgs) -> i32 {
    let lease = admission::Lease::of(&config.leader_election, &args.service_account);
    let writers = &config.provenance.label_writers;
    match admission::render(
        &config.selector,
        lease.as_ref(),
        &args.service_account,
        writers,
    ) {
        Ok(text) => {
            print!("{text}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot print the admission guard: {e}");
            exit::FAILURE
        }
    }
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "workspace-gc".into());
    format!("{host}-{}", std::process::id())
}

/// Cancels `stop` on the first SIGTERM or SIGINT (drain), exits on the second (abort).
async fn stop_on_signal(stop: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(e) => {
            warn!(%e, "cannot listen for SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    info!("stopping: finishing deletes in flight and releasing the lease");
    stop.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    warn!("second signal: exiting now");
    std::process::exit(exit::FAILURE);
}

/// Loads the configuration for a parsed command line, or says why not.
pub fn load_config(cli: &crate::surface::cli::Cli) -> Result<Config, config::ConfigError> {
    // `vars_os`: a variable that is not UTF-8 must not panic; lossy text still fails
    // validation with a message if it is one of ours.
    let env = std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    });
    Config::load(cli.config_file(), env, &cli.overrides())
}

/// Warns about every way the environment and flags widen what the file alone would delete.
pub fn warn_widenings(cli: &crate::surface::cli::Cli, config: &Config) {
    let base = Config::load(cli.config_file(), [], &config::Overrides::default());
    // A file that is invalid alone (made valid by an override) has nothing to compare with.
    let Ok(base) = base else { return };
    for widening in config.widenings(&base) {
        warn!("{widening}");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn the_claim_renders_as_yaml_and_json() {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("nb-build-workspace".into()),
                namespace: Some("ml".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        let yaml = render(&claim, CreateOutput::Yaml).unwrap();
        let back: PersistentVolumeClaim = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, claim);
        let json = render(&claim, CreateOutput::Json).unwrap();
        let back: PersistentVolumeClaim = serde_json::from_str(&json).unwrap();
        assert_eq!(back, claim);
        assert!(yaml.contains("kind: PersistentVolumeClaim"), "{yaml}");
    }

    #[test]
    fn exit_codes_are_distinct() {
        let codes = [
            exit::CREATED,
            exit::ALREADY_PRESENT,
            exit::REFUSED,
            exit::FAILURE,
            exit::CONFIG,
            exit::CLUSTER,
            exit::WOULD_DELETE,
        ];
        let mut unique = codes.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
    }
}
