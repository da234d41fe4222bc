//! Command-line interface: argument parsing and one function per command.

mod offline;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::spec::Spec;

/// Stream-driven projections and invariants for DynamoDB single-table designs.
#[derive(Debug, Parser)]
#[command(name = "ddb-projector", version, about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "PROJECTOR_LOG_FORMAT")]
    pub log: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The log format chosen.
    pub fn log_format(&self) -> LogFormat {
        self.log
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a spec file and summarize its entities and projections.
    Check {
        /// The spec file.
        #[arg(long)]
        spec: PathBuf,
    },
    /// Print the effects a Lambda DynamoDB Streams event would have, as JSON lines.
    Plan {
        /// The spec file.
        #[arg(long)]
        spec: PathBuf,
        /// The event, exactly as Lambda delivers it (`-` for stdin).
        #[arg(long)]
        event: PathBuf,
    },
}

/// Sets up `tracing` output on stderr.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Runs a parsed command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { spec } => Ok(offline::check(&spec)),
        Command::Plan { spec, event } => offline::plan(&spec, &event),
    }
}

/// Loads a spec, printing every problem it has.
fn load_spec(path: &std::path::Path) -> Result<Spec, ExitCode> {
    Spec::from_file(path).map_err(|errors| {
        eprintln!("{errors}");
        ExitCode::from(1)
    })
}
