//! What a user runs: the command line ([`cli`]), one function per subcommand ([`commands`]),
//! and the [`audit`] report.

pub mod admission;
pub mod audit;
pub mod cli;
pub mod commands;
