//! `workspace-gc`: parse, load the configuration, start logging, dispatch.

// The same invariants as the library (src/lib.rs).
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use clap::Parser;
use workspace_gc::observe::telemetry;
use workspace_gc::surface::cli::{Cli, Command};
use workspace_gc::surface::commands::{self, exit};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let config = match commands::load_config(&cli) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(exit::CONFIG);
        }
    };
    telemetry::init(&config.logging);
    commands::warn_widenings(&cli, &config);
    let code = match &cli.command {
        // run's flags are all configuration overrides, already in `config`.
        Command::Run(_) => commands::run(config).await,
        Command::Audit(args) => commands::audit(config, args).await,
        Command::Create(args) => commands::create(&config, args).await,
        Command::CheckConfig(_) => commands::check_config(&config),
        Command::AdmissionPolicy(args) => commands::admission_policy(&config, args),
    };
    std::process::exit(code);
}
