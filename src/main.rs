//! The `ddb-projector` command line. Errors become exit codes here only:
//! 0 success, 1 problems found (invalid spec, unplannable records, drift),
//! 2 the command could not run.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Lambda starts the bootstrap without arguments.
    let cli = ddb_projector::lambda::bootstrap_cli().unwrap_or_else(ddb_projector::cli::Cli::parse);
    ddb_projector::cli::init_logging(cli.log_format());
    match ddb_projector::cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
