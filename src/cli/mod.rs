//! Command-line interface: argument parsing and one function per command.

mod audit;
mod lifecycle;
mod offline;
mod online;
mod register;
mod stream;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

pub use crate::dynamo::names::parse_consumer;
pub use crate::logging::LogFormat;
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

    /// The command line of a bootstrap started by Lambda without
    /// arguments: `lambda`, logging JSON unless `PROJECTOR_LOG_FORMAT`
    /// says otherwise.
    pub fn lambda_bootstrap() -> Option<Cli> {
        if std::env::var_os(crate::lambda::RUNTIME_API_VAR).is_none()
            || std::env::args_os().len() > 1
        {
            return None;
        }
        let log = match std::env::var("PROJECTOR_LOG_FORMAT").as_deref() {
            Ok("text") => LogFormat::Text,
            _ => LogFormat::Json,
        };
        Some(Cli {
            log,
            command: Command::Lambda,
        })
    }
}

impl Target {
    /// Where the spec comes from, for messages: the file, or the registry.
    pub fn source(&self) -> String {
        match (&self.spec, &self.table) {
            (Some(path), _) => path.display().to_string(),
            (None, Some(table)) => format!("the specs registered for `{table}`"),
            (None, None) => "no spec".to_string(),
        }
    }

    /// The arguments that name this spec and table again in a suggested
    /// command (`--spec FILE --table T`, or `--table T`).
    pub fn args(&self) -> String {
        let mut line = String::new();
        if let Some(path) = &self.spec {
            line.push_str(&format!("--spec {}", path.display()));
        }
        if let Some(table) = &self.table {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&format!("--table {table}"));
        }
        line
    }

    /// What the deployment says of a global table: its home region, and
    /// where the writers write.
    pub fn deployment(&self) -> crate::global::Deployment {
        crate::global::Deployment {
            home_region: self.home_region.clone(),
            writers: if self.writers_in_home_region {
                crate::global::Writers::HomeOnly
            } else {
                crate::global::Writers::Anywhere
            },
        }
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a spec file and summarize its entities and projections.
    /// With `--table` or `--home-region`, also where a worker in this
    /// region stands on the table: a table of one region, or a global
    /// table's home region or another one (exit 2, saying what to set,
    /// when a worker would refuse it: a home region the table is not in,
    /// none on a global table, ...).
    Check {
        /// Spec, and the table to check against.
        #[command(flatten)]
        target: Target,
        /// Output format: the summary as text, or one JSON object (the
        /// tables' entities, projections and invariants, or every
        /// problem).
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Print the effects a Lambda DynamoDB Streams event would have, as JSON lines.
    Plan {
        /// The spec file.
        #[arg(long)]
        spec: PathBuf,
        /// The event, exactly as Lambda delivers it (`-` for stdin).
        #[arg(long)]
        event: PathBuf,
        /// Output format: JSON lines (the default), or a line of text each.
        #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
        format: OutputFormat,
    },
    /// Manage the table a spec describes.
    Table {
        /// What to do.
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Tail the table's stream and apply projections (the self-hosted runner).
    Run {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Exit 0 once the stream is caught up.
        #[arg(long)]
        drain: bool,
        /// Where the changes come from, when not the table's own stream.
        #[command(flatten)]
        source: KinesisSource,
        /// Serve Prometheus metrics at http://ADDR/metrics and the runner's
        /// health at /healthz (200 while it runs, holds its leases and gets
        /// through its pages; 503 otherwise), e.g. 0.0.0.0:9464.
        #[arg(long, env = "PROJECTOR_METRICS_ADDR", value_name = "ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Output format: the summary as text on stderr, or also as JSON
        /// on stdout.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Process the whole retained stream again from its start, each record
    /// a hint: the items a page of records names are read consistently
    /// (one read per item per page) and derived as they are now, so readers
    /// never see an older state and a table already right gets no write.
    Replay {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Only these projections (repeatable; default all).
        #[arg(long = "projection")]
        projections: Vec<String>,
        /// Where the changes come from, when not the table's own stream.
        #[command(flatten)]
        source: KinesisSource,
        /// Keep each shard's position in the table under this name, so
        /// that the same command continues the replay after a crash or a
        /// kill.
        #[arg(long)]
        run: Option<String>,
        /// Continue the last replay of this stream and these projections
        /// if it did not catch up (a new one when there is none); without
        /// --resume or --run, a replay keeps no position.
        #[arg(long)]
        resume: bool,
        /// Output format: the summary as text on stderr, or also as JSON
        /// on stdout.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Wait until everything the spec derives from one source item's
    /// current state is in place (read-your-writes), with consistent
    /// reads; writes nothing. Exit 0 projected; 1 still pending at the
    /// timeout (naming what) or held behind a dead letter (at once,
    /// naming it); 2 error.
    Wait {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// A key attribute of the source item, `NAME=VALUE` (the partition
        /// key, and the sort key on a table with one).
        #[arg(long = "key", required = true)]
        keys: Vec<String>,
        /// How long to wait.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: std::time::Duration,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Make this region the home region of a global table whose home was
    /// lost: replay this region's whole retained stream, then `audit
    /// --repair` (counters moved by transactions that replicated only in
    /// part), then print what to switch. Run it in REGION, with every
    /// worker of the old home stopped.
    Failover {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// The new home region: the region this runs in.
        #[arg(long)]
        to: String,
        /// Parallel scan segments of the audit.
        #[arg(long, default_value_t = 4)]
        segments: u32,
        /// Output format: the steps as text, or also one JSON object at the
        /// end (the replay's summary, the redrive's, the last audit's
        /// report).
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Apply again the batches Lambda gave up on (after MaximumRetryAttempts
    /// or MaximumRecordAgeInSeconds), named by the messages of its on-failure
    /// queue; delete each message once its records are applied. Exit 0 when
    /// every message was recovered, 1 when some are kept, 2 on errors.
    Recover {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// The on-failure destination's queue (the stack's FailureQueueUrl
        /// output). For a local queue set AWS_ENDPOINT_URL_SQS.
        #[arg(long)]
        queue_url: String,
        /// For ranges the stream no longer holds (older than 24 hours): run a
        /// guarded backfill of the whole table, then delete their messages.
        #[arg(long)]
        backfill_trimmed: bool,
        /// Read the queue and the stream; write and delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Scan the table and bring derived state up to date for existing items
    /// (a new GSI, a new projection). Parallel, resumable, rate-limited.
    /// Exit 1 when a projection could not be recorded as backfilled (it
    /// says why and what to run), 2 on errors and refusals.
    Backfill {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// What to backfill and how.
        #[command(flatten)]
        args: lifecycle::BackfillArgs,
        /// Output format: the summary as JSON on stdout (the default, as
        /// it always was) beside the text on stderr, or the text alone.
        #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
        format: OutputFormat,
    },
    /// Where each projection is in its life (new, backfilling, live,
    /// changed, retired), since when, what it needs next, its open dead
    /// letters and the recorded violations. Exit 0 when every projection is
    /// live, 1 otherwise, 2 on errors.
    Status {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Delete what a retired projection (in the table, no longer in the
    /// spec) derived: counter shards, markers and records, reverse items,
    /// index keys and copied attributes, its dead letters and registry
    /// entries. Resumable (run it again), rate-limited, with progress.
    /// Refuses a projection still in the spec or still being written.
    Prune {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// The retired projection (repeatable).
        #[arg(long = "projection", required = true)]
        projections: Vec<String>,
        /// A spec file that defines the retired projections (default: the
        /// registry's copy of the spec that last ran them).
        #[arg(long)]
        from_spec: Option<PathBuf>,
        /// Count what would change without writing.
        #[arg(long)]
        dry_run: bool,
        /// Consumed write capacity units per second to stay under.
        #[arg(long)]
        max_wcu: Option<f64>,
        /// Consumed read capacity units per second (the scan's) to stay under.
        #[arg(long)]
        max_rcu: Option<f64>,
        /// Scan segments in parallel.
        #[arg(long, default_value_t = 4)]
        segments: u32,
        /// Keep the prune's progress in the table under this name, so that
        /// the same command continues it after a crash or a kill.
        #[arg(long)]
        run: Option<String>,
        /// Continue the last prune of these projections if it did not
        /// finish (a new one when there is none); without --resume or
        /// --run, a prune starts from the beginning.
        #[arg(long)]
        resume: bool,
        /// Output format: the summary as JSON on stdout (the default, as
        /// it always was) beside the text on stderr, or the text alone.
        #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
        format: OutputFormat,
    },
    /// Serve DynamoDB Streams events as an AWS Lambda function (the default
    /// when AWS_LAMBDA_RUNTIME_API is set and no command is given).
    Lambda,
    /// Print the Lambda event source mapping FilterCriteria (JSON) that lets
    /// through only records some projection of the spec uses.
    Filters {
        /// The spec file.
        #[arg(long)]
        spec: PathBuf,
        /// Output format: the FilterCriteria JSON (the default, what
        /// infra/deploy reads), or each table's patterns as text.
        #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
        format: OutputFormat,
    },
    /// Read counters.
    Counter {
        /// What to do.
        #[command(subcommand)]
        command: CounterCommand,
    },
    /// Inspect and redrive dead letters.
    Dlq {
        /// What to do.
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Recompute every derived item and counter from the source items and
    /// check every invariant (full scan). Exit 0 clean, 1 found, 2 error.
    Audit {
        #[command(flatten)]
        target: Target,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
        /// Rewrite derived state to what it should be (never source items)
        /// and record the violations found.
        #[arg(long)]
        repair: bool,
        /// Parallel scan segments.
        #[arg(long, default_value_t = 4, conflicts_with = "total_segments")]
        segments: u32,
        /// Audit only this segment (of --total-segments); other processes
        /// or machines audit the others, and `audit-merge` combines their
        /// JSON reports and concludes the counters.
        #[arg(long, requires = "total_segments")]
        segment: Option<u32>,
        /// The scan's segments, with --segment.
        #[arg(long, requires = "segment")]
        total_segments: Option<u32>,
        /// Read capacity units per second, averaged over the run.
        #[arg(long)]
        max_rcu: Option<f64>,
        /// Items per scan page: what each segment holds at a time.
        #[arg(long, default_value_t = 1000)]
        page_size: i32,
        /// Keep the audit's progress and findings in the table under this
        /// name after every page, so that the same command continues it
        /// after a crash or a kill (with --segment: the same name on every
        /// machine).
        #[arg(long)]
        run: Option<String>,
        /// Continue the last audit of this table (and segment) that was
        /// started with --run or --resume and did not finish; a new one
        /// when there is none.
        #[arg(long)]
        resume: bool,
    },
    /// Combine the JSON reports of `audit --segment I --total-segments N`
    /// (every segment once): their findings, and the counters, concluded
    /// from the segments' sketches. Exit 0 clean, 1 found, 2 error.
    AuditMerge {
        #[command(flatten)]
        target: Target,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
        /// Recount the counters found off (the segments' own --repair
        /// fixed the rest) and clear the recorded violations no segment
        /// found.
        #[arg(long)]
        repair: bool,
        /// Read capacity units per second for the counters' second scan,
        /// when one is needed.
        #[arg(long)]
        max_rcu: Option<f64>,
        /// The segments' reports (`audit --format json` output).
        #[arg(required = true)]
        reports: Vec<PathBuf>,
    },
    /// Register a service's spec into a table's registry: the table's
    /// workers (`run --table T`, the Lambda without PROJECTOR_SPEC) serve
    /// it within seconds (PROJECTOR_REGISTRY_POLL_SECONDS), without a rebuild or a redeploy. The
    /// spec is composed with the other services' registered specs (every
    /// rule of `check --spec DIR`), and what changes is printed, with what
    /// the lifecycle will ask for next. Registering an earlier version's
    /// text (`specs --service S --version N`) is the rollback. Exit 0
    /// registered (or would be, with --dry-run), 1 refused (a conflict, a
    /// spec that does not compile; nothing stored), 2 error.
    Register {
        /// The service's spec file (its `service` names the service).
        #[arg(long)]
        spec: PathBuf,
        /// Table, dry run, who, format, home region.
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Unregister a service: its projections become retired (the
    /// workers stop projecting them within seconds); `prune`
    /// then deletes what they derived. Exit codes as `register`.
    Unregister {
        /// The service.
        #[arg(long)]
        service: String,
        /// Table, dry run, who, format, home region.
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// What is registered for a table: each service's current version;
    /// with --service, its text (or --version N's, or --history: every
    /// version). Exit 0, 1 when the service or version is unknown, 2 error.
    Specs {
        /// The table.
        #[arg(long, env = "PROJECTOR_TABLE")]
        table: String,
        /// One service.
        #[arg(long)]
        service: Option<String>,
        /// Every version of the service, oldest first.
        #[arg(long, requires = "service")]
        history: bool,
        /// The text of this version of the service.
        #[arg(long, requires = "service", conflicts_with = "history")]
        version: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Invariant violations recorded by the online check.
    Violations {
        /// What to do.
        #[command(subcommand)]
        command: ViolationsCommand,
    },
}

/// Output formats of `audit` and `violations list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// For programs.
    Json,
}

/// `violations` subcommands.
#[derive(Debug, Subcommand)]
pub enum ViolationsCommand {
    /// Print the recorded violations (exit 1 when there are any).
    List {
        #[command(flatten)]
        target: Target,
        /// Output format (`json`: one object per line).
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
}

/// The spec file and the table it applies to.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The spec file, or a directory of them (one per service; the specs
    /// of one table compose into one). Without it, `--table` names the
    /// table and the specs registered for it are served (`register`).
    #[arg(long, env = "PROJECTOR_SPEC", required_unless_present = "table")]
    pub spec: Option<PathBuf>,
    /// The table (default: the spec's table name; with a directory
    /// describing several tables, the one to use).
    #[arg(long)]
    pub table: Option<String>,
    /// On a global table, the one region whose worker projects; commands
    /// that write run there only (see `docs/global-tables.md`).
    #[arg(long, env = "PROJECTOR_HOME_REGION")]
    pub home_region: Option<String>,
    /// On a global table, the writers write the items projections write
    /// attributes onto (`index-keys` sources; `denormalize`, `rollup` and
    /// `aggregate` targets) in the home region only; without it those
    /// projections are refused there (replication's last writer wins would
    /// lose writes made elsewhere).
    #[arg(long, env = "PROJECTOR_WRITERS_IN_HOME_REGION", value_parser = clap::builder::BoolishValueParser::new())]
    pub writers_in_home_region: bool,
    /// The stream consumer this command works for, when several
    /// deployments with different specs share the table: each keeps its
    /// own runner checkpoints and letters of undecodable records, and
    /// leaves the other's projections to it. Letters, numbers, `.`, `_`
    /// and `-`. Unset: the unnamed consumer (one deployment per table, or
    /// one serving every spec of the table).
    #[arg(long, env = "PROJECTOR_CONSUMER", value_parser = parse_consumer)]
    pub consumer: Option<String>,
}

/// A Kinesis data stream as the source of `run` and `replay`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KinesisSource {
    /// Read this Kinesis data stream (its ARN), to which the table sends
    /// its changes with Kinesis Data Streams for DynamoDB, instead of the
    /// table's DynamoDB stream. Each page's items are derived as they are
    /// now (one consistent read per item per page): Kinesis may deliver a
    /// change twice, and one item's changes in any order. Changes of other
    /// tables are left to the consumer that serves them, or dead-lettered
    /// naming their table when nothing does.
    #[arg(
        long = "kinesis-stream",
        env = "PROJECTOR_KINESIS_STREAM",
        value_name = "ARN"
    )]
    pub kinesis_stream: Option<String>,
    /// With --kinesis-stream: shards without a checkpoint (every shard, for
    /// `replay`) start at the first change written at or after this time
    /// (RFC 3339, e.g. 2026-11-20T00:00:00Z) rather than the oldest kept.
    #[arg(long, value_name = "TIMESTAMP", requires = "kinesis_stream", value_parser = parse_rfc3339_ms)]
    pub from: Option<i64>,
}

/// An RFC 3339 time as milliseconds since the epoch.
fn parse_rfc3339_ms(text: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|error| {
            format!("`{text}` is not an RFC 3339 time such as 2026-11-20T00:00:00Z: {error}")
        })
}

/// What `register` and `unregister` share.
#[derive(Debug, Clone, clap::Args)]
pub struct ChangeArgs {
    /// The table.
    #[arg(long, env = "PROJECTOR_TABLE")]
    pub table: String,
    /// Print what would change; store nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Who makes the change (default: the OS user).
    #[arg(long)]
    pub by: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// On a global table, its home region: registrations are made there.
    #[arg(long, env = "PROJECTOR_HOME_REGION")]
    pub home_region: Option<String>,
}

/// `table` subcommands.
#[derive(Debug, Subcommand)]
pub enum TableCommand {
    /// Create the table: keys, GSIs, a NEW_AND_OLD_IMAGES stream, TTL.
    Create {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Output format: a sentence, or `{"table", "created"}`.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
}

/// `counter` subcommands.
#[derive(Debug, Subcommand)]
pub enum CounterCommand {
    /// Print a counter's value (the sum of its shards).
    Get {
        /// The counter projection's name (`followers`).
        name: String,
        /// A variable of the counter's `of` (repeatable): `--key userId=u42`.
        #[arg(long = "key", value_name = "VAR=VALUE")]
        keys: Vec<String>,
        /// The same as positional `VAR=VALUE` words (the older form).
        #[arg(hide = true)]
        vars: Vec<String>,
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Output format: the value, or `{"counter", "vars", "value"}`.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
}

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Print dead letters: JSON lines (the default), or a line of text each.
    List {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
        format: OutputFormat,
    },
    /// Apply dead letters again (after a fix) and remove those that succeed.
    Redrive {
        /// Spec and table.
        #[command(flatten)]
        target: Target,
        /// Only letters of these projections (repeatable; `*`: records
        /// that could not be decoded; default all).
        #[arg(long = "projection")]
        projections: Vec<String>,
        /// Output format: a sentence, or the summary as JSON.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
}

/// What a command came to, when it could run: [`exit_code`] turns it
/// into the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: exit 0.
    Done,
    /// Problems found or work pending, and said so: exit 1.
    Found,
    /// The command could not run, and said why already (a spec's
    /// problems printed): exit 2.
    Failed,
}

impl Outcome {
    /// [`Outcome::Done`] when `done`, else [`Outcome::Found`].
    pub fn done_if(done: bool) -> Outcome {
        if done {
            Outcome::Done
        } else {
            Outcome::Found
        }
    }
}

/// The one place a command's result becomes an exit code: 0 done, 1
/// problems found (invalid spec, unplannable records, drift, violations,
/// a worker's conflicts `check --table` finds, pending), 2 the command
/// could not run or refused to (its error printed here: `prune` and
/// `backfill` refuse with an error saying what to do first).
pub fn exit_code(result: anyhow::Result<Outcome>) -> ExitCode {
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Found) => ExitCode::from(1),
        Ok(Outcome::Failed) => ExitCode::from(2),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// The `ddb-projector` binary's `main`: parses the command line (or,
/// started without arguments as a Lambda bootstrap, serves Lambda), sets
/// up logs, runs the command and turns its result into the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::lambda_bootstrap().unwrap_or_else(Cli::parse);
    crate::logging::init(cli.log_format());
    exit_code(run(cli))
}

/// Runs a parsed command.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check { target, format } => match (&target.table, &target.home_region) {
            (None, None) => match &target.spec {
                Some(path) => Ok(offline::check(path, format)),
                None => unreachable!("clap requires --spec or --table"),
            },
            _ => block_on(online::check_table(target, format)),
        },
        Command::Plan {
            spec,
            event,
            format,
        } => offline::plan(&spec, &event, format),
        Command::Table {
            command: TableCommand::Create { target, format },
        } => block_on(online::table_create(target, format)),
        Command::Run {
            target,
            drain,
            source,
            metrics_addr,
            format,
        } => block_on(stream::run(target, drain, source, metrics_addr, format)),
        Command::Replay {
            target,
            projections,
            source,
            run,
            resume,
            format,
        } => block_on(stream::replay(
            target,
            projections,
            source,
            Resume { run, resume },
            format,
        )),
        Command::Wait {
            target,
            keys,
            timeout,
            format,
        } => block_on(online::wait(target, keys, timeout, format)),
        Command::Failover {
            target,
            to,
            segments,
            format,
        } => block_on(stream::failover(target, to, segments, format)),
        Command::Recover {
            target,
            queue_url,
            backfill_trimmed,
            dry_run,
            format,
        } => block_on(stream::recover(
            target,
            queue_url,
            backfill_trimmed,
            dry_run,
            format,
        )),
        Command::Backfill {
            target,
            args,
            format,
        } => {
            let request = args.request()?;
            block_on(lifecycle::backfill(target, request, format))
        }
        Command::Status { target, format } => block_on(lifecycle::status(target, format)),
        Command::Prune {
            target,
            projections,
            from_spec,
            dry_run,
            max_wcu,
            max_rcu,
            segments,
            run,
            resume,
            format,
        } => block_on(lifecycle::prune(
            target,
            projections,
            from_spec,
            format,
            crate::prune::PruneOptions {
                dry_run,
                max_wcu,
                max_rcu,
                segments,
                run,
                resume,
                ..Default::default()
            },
        )),

        Command::Lambda => crate::lambda::run().map(|()| Outcome::Done),
        Command::Filters { spec, format } => Ok(offline::filters(&spec, format)),
        Command::Counter {
            command:
                CounterCommand::Get {
                    name,
                    keys,
                    vars,
                    target,
                    format,
                },
        } => block_on(online::counter_get(
            target,
            name,
            keys.into_iter().chain(vars).collect(),
            format,
        )),
        Command::Dlq {
            command: DlqCommand::List { target, format },
        } => block_on(online::dlq_list(target, format)),
        Command::Dlq {
            command:
                DlqCommand::Redrive {
                    target,
                    projections,
                    format,
                },
        } => block_on(online::dlq_redrive(target, projections, format)),
        Command::Audit {
            target,
            format,
            repair,
            segments,
            segment,
            total_segments,
            max_rcu,
            page_size,
            run,
            resume,
        } => block_on(audit::audit(
            target,
            format,
            crate::audit::AuditOptions {
                segments: total_segments.unwrap_or(segments).max(1),
                repair,
                progress: true,
                page_size: Some(page_size.max(1)),
                segment,
                max_rcu,
                checkpoint: None,
                max_pages: None,
                deadline: None,
            },
            Resume { run, resume },
        )),
        Command::AuditMerge {
            target,
            format,
            repair,
            max_rcu,
            reports,
        } => block_on(audit::merge(target, format, repair, max_rcu, reports)),
        Command::Violations {
            command: ViolationsCommand::List { target, format },
        } => block_on(audit::violations_list(target, format)),
        Command::Register { spec, change } => block_on(register::register(&spec, change)),
        Command::Unregister { service, change } => block_on(register::unregister(service, change)),
        Command::Specs {
            table,
            service,
            history,
            version,
            format,
        } => block_on(register::specs(table, service, history, version, format)),
    }
}

/// `--run NAME` and `--resume`, as the long jobs take them (see
/// `crate::control::Runs`).
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// `--run NAME`.
    pub run: Option<String>,
    /// `--resume`.
    pub resume: bool,
}

impl Resume {
    /// Whether either was given.
    fn asked(&self) -> bool {
        self.run.is_some() || self.resume
    }

    /// The run `job` over `scope` of `table` goes under, recorded as its
    /// last; what was chosen is said on stderr.
    async fn start(
        &self,
        client: &aws_sdk_dynamodb::Client,
        table: &str,
        keys: &crate::spec::TableSpec,
        job: crate::control::Job,
        scope: String,
    ) -> anyhow::Result<crate::control::JobRun> {
        Ok(crate::control::Runs::new(client.clone(), table, keys)
            .start(job, scope, self.run.as_deref(), self.resume, &mut |note| {
                eprintln!("{note}")
            })
            .await?)
    }
}

fn block_on<F: std::future::Future<Output = anyhow::Result<Outcome>>>(
    future: F,
) -> anyhow::Result<Outcome> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| anyhow::anyhow!("cannot start the async runtime: {error}"))?
        // On the heap: a command's future (the runner's, in a debug build)
        // is megabytes, and `block_on` would keep it on main's stack.
        .block_on(Box::pin(future))
}

pub use crate::control::Connection;

/// Loads the spec and connects; a spec error is printed and becomes exit 1.
/// Without `--spec`, the specs registered for `--table`.
pub async fn connect(target: &Target) -> Result<Connection, anyhow::Result<Outcome>> {
    let Some(path) = &target.spec else {
        let Some(table) = target.table.clone() else {
            return Err(Err(anyhow::anyhow!(
                "name a spec (--spec FILE or PROJECTOR_SPEC) or a table whose registered specs to serve (--table)"
            )));
        };
        return crate::control::connect_registered(table, target.consumer.clone())
            .await
            .map_err(Err);
    };
    let spec = match load_spec(path, target.table.as_deref()) {
        Ok(spec) => spec,
        Err(code) => return Err(Ok(code)),
    };
    let table = target
        .table
        .clone()
        .unwrap_or_else(|| spec.table.name.clone());
    crate::control::connect(spec, table, target.consumer.clone())
        .await
        .map_err(Err)
}

/// Loads a spec file or directory, printing every problem it has.
/// `PROJECTOR_TABLE_NAMES` renames the tables the specs describe to their
/// actual names (see [`crate::spec::SpecSet::rename_tables`]).
fn load_specs(path: &std::path::Path) -> Result<crate::spec::SpecSet, Outcome> {
    let mut set = crate::spec::SpecSet::load(path).map_err(|errors| {
        eprintln!("{errors}");
        Outcome::Found
    })?;
    if let Ok(map) = std::env::var(crate::lambda::TABLE_NAMES_VAR) {
        if let Err(problem) = set.rename_tables(&map) {
            eprintln!("{}: {problem}", crate::lambda::TABLE_NAMES_VAR);
            return Err(Outcome::Failed);
        }
    }
    Ok(set)
}

/// Loads the spec of `table` (none: the only table) from a spec file or
/// directory, printing every problem.
fn load_spec(path: &std::path::Path, table: Option<&str>) -> Result<Spec, Outcome> {
    let set = load_specs(path)?;
    match set.select(table) {
        Ok(spec) => Ok(Spec::clone(spec)),
        Err(problem) => {
            eprintln!("{problem}");
            Err(Outcome::Failed)
        }
    }
}

/// A duration as `90s`, `20m`, `1h`, `500ms` or plain seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 90s, 20m, 1h)"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    Ok(std::time::Duration::from_secs_f64(seconds))
}
