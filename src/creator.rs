//! The companion creator; lands with the creator change.

use crate::cli::CreateArgs;
use crate::config::Config;

pub async fn command(_config: &Config, _args: &CreateArgs) -> i32 {
    eprintln!("error: workspace-gc create is not available in this build");
    crate::commands::exit::FAILURE
}
