//! The command line. Flags that mirror a configuration key override it (file < environment <
//! flags); [`Cli::overrides`] is the one place that maps them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::labels::{dns1123_label, dns1123_subdomain};
use crate::config::{ENV_CONFIG_FILE, LogFormat, Overrides};
use crate::surface::admission;

const GLOBAL: &str = "Global options";

const AFTER_HELP: &str = "\
Configuration: built-in defaults (the shipped config.toml), then --config FILE, then
WORKSPACE_GC_<SECTION>_<KEY> environment variables (e.g. WORKSPACE_GC_POLICY_MAX_AGE=3d,
WORKSPACE_GC_DELETION_DRY_RUN=true; lists comma-separated), then flags.
Cluster access: the in-cluster service account, else KUBECONFIG or ~/.kube/config.
Exit code 2: invalid command line or configuration; nothing was started.";

/// Garbage-collects the build-workspace PersistentVolumeClaims that the
/// jupyter-notebook-validator-operator leaves behind.
#[derive(Debug, Parser)]
#[command(name = "workspace-gc", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Configuration file (TOML); without it, the built-in defaults.
    #[arg(long, global = true, env = ENV_CONFIG_FILE, value_name = "FILE", help_heading = GLOBAL)]
    pub config: Option<PathBuf>,

    /// Log format; overrides logging.format.
    #[arg(long, global = true, value_name = "FORMAT", help_heading = GLOBAL)]
    pub log_format: Option<LogFormat>,

    /// Log filter in tracing's EnvFilter syntax (e.g. `info`, `workspace_gc=debug,info`);
    /// overrides logging.level.
    #[arg(long, global = true, value_name = "FILTER", help_heading = GLOBAL)]
    pub log_level: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the collector: watch build-workspace claims and delete each when the policy says so.
    Run(RunArgs),
    /// Decide once for every tracked claim and print the report; deletes nothing.
    Audit(AuditArgs),
    /// Ensure the workspace claim of a NotebookValidationJob, owned by the job, and print it.
    Create(CreateArgs),
    /// Validate the configuration and print the effective result as TOML; exit 2 if invalid.
    CheckConfig(CheckConfigArgs),
    /// Print the admission guard for the configuration: a ValidatingAdmissionPolicy and its
    /// binding that make the API server refuse any claim delete the daemon must never make.
    AdmissionPolicy(AdmissionPolicyArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Decide, log, count and emit events, but delete nothing; overrides deletion.dry_run.
    #[arg(long)]
    pub dry_run: bool,

    /// In dry-run, send each delete with dryRun=All so RBAC and admission run; needs dry-run
    /// (from this command line or the configuration). Overrides deletion.server_side_dry_run.
    #[arg(long)]
    pub server_side_dry_run: bool,

    /// Address of the /metrics, /healthz and /readyz endpoint; overrides http.listen.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Watch only this namespace (repeatable); overrides selector.namespaces.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,

    /// Never touch this namespace (repeatable); overrides selector.exclude_namespaces.
    #[arg(long = "exclude-namespace", value_name = "NS")]
    pub exclude_namespaces: Vec<String>,

    /// Run without a Lease: only safe with a single replica. Overrides leader_election.enabled.
    #[arg(long)]
    pub no_leader_election: bool,

    /// Namespace of the Lease; overrides leader_election.lease_namespace.
    #[arg(long, value_name = "NS")]
    pub lease_namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Report format.
    #[arg(long, value_name = "FORMAT", default_value = "table")]
    pub output: AuditOutput,

    /// Exit non-zero when any claim would be deleted (for pipelines).
    #[arg(long)]
    pub fail_on_delete: bool,

    /// Report only this namespace (repeatable); overrides selector.namespaces.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuditOutput {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Namespace of the NotebookValidationJob (and of the claim).
    #[arg(long, value_name = "NS")]
    pub namespace: String,

    /// Name of the NotebookValidationJob; the claim is named `<job>-build-workspace`.
    #[arg(long, value_name = "NAME")]
    pub job: String,

    /// Format of the printed claim.
    #[arg(long, value_name = "FORMAT", default_value = "yaml")]
    pub output: CreateOutput,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CreateOutput {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Configuration file to check; defaults to --config.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AdmissionPolicyArgs {
    /// The daemon's ServiceAccount, whose requests the guard checks.
    #[arg(long, value_name = "NAMESPACE:NAME", default_value = admission::DEFAULT_SERVICE_ACCOUNT,
          value_parser = service_account)]
    pub service_account: String,

    /// A namespace the daemon watches (repeatable), as its `run --namespace`; overrides
    /// selector.namespaces.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,

    /// A namespace the daemon never touches (repeatable), as its `run --exclude-namespace`;
    /// adds to selector.exclude_namespaces.
    #[arg(long = "exclude-namespace", value_name = "NS")]
    pub exclude_namespaces: Vec<String>,
}

/// `NAMESPACE:NAME`, both DNS labels or subdomains as Kubernetes requires.
fn service_account(text: &str) -> Result<String, String> {
    let (namespace, name) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected NAMESPACE:NAME"))?;
    dns1123_label(namespace).map_err(|why| format!("namespace {namespace:?}: {why}"))?;
    dns1123_subdomain(name).map_err(|why| format!("name {name:?}: {why}"))?;
    Ok(text.to_owned())
}

impl Cli {
    /// The configuration file to load: `check-config FILE` first, then `--config`.
    pub fn config_file(&self) -> Option<&Path> {
        match &self.command {
            Command::CheckConfig(CheckConfigArgs { file: Some(file) }) => Some(file),
            _ => self.config.as_deref(),
        }
    }

    /// The configuration keys set on this command line. Every argument struct is destructured
    /// in full, so a new flag does not compile until it is either mapped here or marked as the
    /// command's own.
    pub fn overrides(&self) -> Overrides {
        let Cli {
            config: _, // names the file; see `config_file`
            log_format,
            log_level,
            command,
        } = self;
        let mut overrides = Overrides {
            log_format: *log_format,
            log_level: log_level.clone(),
            ..Overrides::default()
        };
        // A bool flag can only switch its behaviour on; absent, it leaves the key alone.
        let given = |flag: bool, value: bool| flag.then_some(value);
        let list = |values: &Vec<String>| (!values.is_empty()).then(|| values.clone());
        match command {
            Command::Run(RunArgs {
                dry_run,
                server_side_dry_run,
                listen,
                namespaces,
                exclude_namespaces,
                no_leader_election,
                lease_namespace,
            }) => {
                overrides.dry_run = given(*dry_run, true);
                overrides.server_side_dry_run = given(*server_side_dry_run, true);
                overrides.listen = *listen;
                overrides.namespaces = list(namespaces);
                overrides.exclude_namespaces = list(exclude_namespaces);
                overrides.leader_election = given(*no_leader_election, false);
                overrides.lease_namespace = lease_namespace.clone();
            }
            Command::Audit(AuditArgs {
                output: _,         // the report's own
                fail_on_delete: _, // the report's own
                namespaces,
            }) => overrides.namespaces = list(namespaces),
            // The job's namespace and name select what to create; they configure nothing.
            Command::Create(CreateArgs {
                namespace: _,
                job: _,
                output: _,
            }) => {}
            Command::CheckConfig(CheckConfigArgs { file: _ }) => {} // see `config_file`
            // The guard must agree with the daemon it guards: the same namespace flags.
            Command::AdmissionPolicy(AdmissionPolicyArgs {
                service_account: _, // the guard's own
                namespaces,
                exclude_namespaces,
            }) => {
                overrides.namespaces = list(namespaces);
                overrides.exclude_namespaces = list(exclude_namespaces);
            }
        }
        overrides
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("workspace-gc").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_subcommand_has_help() {
        for sub in Cli::command().get_subcommands() {
            assert!(sub.get_about().is_some(), "{} has no help", sub.get_name());
        }
    }

    #[test]
    fn run_flags_become_overrides() {
        let cli = parse(&[
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "run",
            "--dry-run",
            "--server-side-dry-run",
            "--listen",
            "127.0.0.1:9000",
            "--namespace",
            "a",
            "--namespace",
            "b",
            "--exclude-namespace",
            "c",
            "--no-leader-election",
            "--lease-namespace",
            "gc",
        ]);
        assert_eq!(
            cli.overrides(),
            Overrides {
                log_format: Some(LogFormat::Json),
                log_level: Some("debug".into()),
                dry_run: Some(true),
                server_side_dry_run: Some(true),
                listen: Some("127.0.0.1:9000".parse().unwrap()),
                namespaces: Some(vec!["a".into(), "b".into()]),
                exclude_namespaces: Some(vec!["c".into()]),
                leader_election: Some(false),
                lease_namespace: Some("gc".into()),
            }
        );
    }

    /// The guard is printed for the namespaces the daemon is run with.
    #[test]
    fn admission_policy_takes_the_daemons_namespace_flags() {
        let cli = parse(&[
            "admission-policy",
            "--namespace=a",
            "--exclude-namespace=b",
            "--service-account=gc:daemon",
        ]);
        let overrides = cli.overrides();
        assert_eq!(overrides.namespaces, Some(vec!["a".into()]));
        assert_eq!(overrides.exclude_namespaces, Some(vec!["b".into()]));
        let Command::AdmissionPolicy(args) = cli.command else {
            panic!("admission-policy")
        };
        assert_eq!(args.service_account, "gc:daemon");
    }

    /// The flag each row of the settings table names, as the origin of its value, is a flag of
    /// the command line.
    #[test]
    fn every_flag_the_settings_table_names_exists() {
        let cli = Cli::command();
        let arguments = cli
            .get_arguments()
            .chain(cli.get_subcommands().flat_map(|sub| sub.get_arguments()));
        let longs: Vec<String> = arguments
            .filter_map(|argument| argument.get_long())
            .map(|long| format!("--{long}"))
            .collect();
        let flags: Vec<&str> = (crate::config::settings().into_iter())
            .filter_map(|setting| setting.flag)
            .collect();
        assert_eq!(flags.len(), 9);
        for flag in flags {
            assert!(longs.iter().any(|long| long == flag), "{flag} is no flag");
        }
    }

    #[test]
    fn absent_flags_override_nothing() {
        for args in [
            &["run"][..],
            &["audit"],
            &["check-config"],
            &["admission-policy"],
            &["create", "--namespace", "n", "--job", "j"],
        ] {
            assert_eq!(parse(args).overrides(), Overrides::default(), "{args:?}");
        }
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let cli = parse(&[
            "audit",
            "--log-level",
            "warn",
            "--namespace",
            "x",
            "--output",
            "json",
        ]);
        let overrides = cli.overrides();
        assert_eq!(overrides.log_level.as_deref(), Some("warn"));
        assert_eq!(overrides.namespaces, Some(vec!["x".into()]));
        assert!(matches!(
            cli.command,
            Command::Audit(AuditArgs {
                output: AuditOutput::Json,
                ..
            })
        ));
    }

    #[test]
    fn check_config_file_wins_over_config_flag() {
        let cli = parse(&["--config", "a.toml", "check-config", "b.toml"]);
        assert_eq!(cli.config_file(), Some(Path::new("b.toml")));
        let cli = parse(&["--config", "a.toml", "check-config"]);
        assert_eq!(cli.config_file(), Some(Path::new("a.toml")));
        let cli = parse(&["--config", "a.toml", "run"]);
        assert_eq!(cli.config_file(), Some(Path::new("a.toml")));
    }

    #[test]
    fn defaults_and_rejections() {
        let cli = parse(&["create", "--namespace", "n", "--job", "j"]);
        assert!(matches!(
            cli.command,
            Command::Create(CreateArgs {
                output: CreateOutput::Yaml,
                ..
            })
        ));
        for bad in [
            &["run", "--listen", "nope"][..],
            &["audit", "--output", "xml"],
            &["create", "--job", "j"],
            &["--log-format", "text", "run"],
            &["admission-policy", "--service-account", "workspace-gc"],
            &[
                "admission-policy",
                "--service-account",
                "Bad_NS:workspace-gc",
            ],
            &[],
        ] {
            let args = std::iter::once("workspace-gc").chain(bad.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} accepted");
        }
    }
}
