//! Running as an AWS Lambda function triggered by the table's stream.
//!
//! The same binary serves the command line and Lambda: `ddb-projector
//! lambda` runs the Runtime API loop, and so does a bootstrap started
//! without arguments where `AWS_LAMBDA_RUNTIME_API` is set.
//!
//! Init (once per execution environment) reads the environment, compiles the
//! spec, builds the SDK client and installs the EMF metrics recorder; any
//! failure is posted to the Runtime API's `/init/error` with a message that
//! says what to fix. Each invocation then decodes the event record by record
//! ([`event`]), applies it with a deadline (`handler`) and answers with a
//! `DynamoDbEventResponse` naming the first record that is not handled
//! (`ReportBatchItemFailures`). A payload `{"backfill": {...}}` instead runs
//! one slice of a backfill scan segment ([`backfill`]) and answers whether
//! the segment is done, for a Step Functions loop; `{"audit": {...}}` runs
//! one slice of an audit segment, or the audit's merge ([`audit`]).
//!
//! | variable | meaning |
//! | --- | --- |
//! | `PROJECTOR_SPEC` | the spec file, or a directory of them (one per service), a path inside the deployment package; records are routed to the specs of their stream's table. Unset: the specs registered for each table (`ddb-projector register`), read again every `PROJECTOR_REGISTRY_POLL_SECONDS` (default 10) |
//! | `PROJECTOR_TABLE` | the table to write (default: the table of the records' `eventSourceARN`); with specs of several tables, unset |
//! | `PROJECTOR_TABLE_NAMES` | `SPEC_TABLE=ACTUAL_TABLE,...`: the tables' actual names, when they are not named as the specs say (`UserServiceTable=UserServiceTable-prod`) |
//! | `PROJECTOR_CONSUMER` | the consumer's name, when deployments with different specs share a table (each keeps its own letters of undecodable records, and leaves the other's projections to it) |
//! | `PROJECTOR_DEADLINE_MARGIN_MS` | time kept free before the invocation's deadline (default 1500) |
//! | `PROJECTOR_METRICS_NAMESPACE` | CloudWatch namespace of the EMF metrics (default `DdbProjector`) |
//! | `PROJECTOR_LOG_FORMAT` | `json` (the default for a bootstrap) or `text` |
//!
//! **Architecture Invariant:** a record is reported handled only when the
//! applier says so; a batch that could not finish before the deadline is
//! reported failed from its first unfinished record, never left half-known.
//! Checked by the unit tests of `handler`,
//! `dynamo::lambda::lambda_with_too_little_time_reports_the_batch_failed_and_writes_nothing`,
//! `lambda_reports_a_transient_failure_at_its_sequence_number_and_a_redelivery_converges`
//! and `dynamo::faults::the_lambda_handler_converges_under_every_fault`.

pub mod audit;
pub mod backfill;
pub mod event;
pub mod filters;
mod handler;
mod kinesis;
pub mod metrics;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use handler::{
    batch_response, deadlines, Deadline, Deadlines, Handler, InvocationError, Regions, Response,
    RoleError,
};

use crate::apply::ApplyConfig;
use crate::kinds::custom::CustomProjection;
use crate::spec::{SpecErrors, SpecSet};

/// The spec file's path.
pub const SPEC_VAR: &str = "PROJECTOR_SPEC";
/// The table to write, overriding the event's.
pub const TABLE_VAR: &str = "PROJECTOR_TABLE";
pub use crate::dynamo::names::TABLE_NAMES_VAR;
/// The stream consumer the function is, when several deployments with
/// different specs share a table (see [`crate::apply::ApplyConfig::consumer`]).
pub const CONSUMER_VAR: &str = "PROJECTOR_CONSUMER";
/// The safety margin before the invocation's deadline, in milliseconds.
pub const MARGIN_VAR: &str = "PROJECTOR_DEADLINE_MARGIN_MS";
/// The CloudWatch namespace of the metrics.
pub const NAMESPACE_VAR: &str = "PROJECTOR_METRICS_NAMESPACE";
/// The Runtime API's address, set by Lambda.
pub const RUNTIME_API_VAR: &str = "AWS_LAMBDA_RUNTIME_API";

/// The default safety margin.
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(1500);

/// Why init failed.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The spec cannot be read or compiled.
    #[error("the spec named by {SPEC_VAR} cannot be used:\n{0}")]
    Spec(SpecErrors),
    /// `PROJECTOR_CONSUMER` is not a consumer name.
    #[error("{CONSUMER_VAR}: {0}")]
    Consumer(String),
    /// `PROJECTOR_DEADLINE_MARGIN_MS` is not a number.
    #[error("{MARGIN_VAR}=`{0}` is not a whole number of milliseconds")]
    Margin(String),
    /// A variable Lambda sets is missing.
    #[error("{0} is not set: `ddb-projector lambda` runs inside AWS Lambda, or under an emulator of its Runtime API such as `cargo lambda watch`")]
    NotInLambda(&'static str),
    /// The SDK cannot be configured.
    #[error("{0}")]
    Aws(String),
    /// The metrics recorder cannot be installed.
    #[error("{0}")]
    Metrics(String),
    /// A global table, and no usable home region (see [`crate::global`]).
    #[error("{0}")]
    Global(crate::global::GlobalError),
}

impl InitError {
    /// The `errorType` posted to `/init/error`.
    pub fn error_type(&self) -> &'static str {
        match self {
            InitError::Spec(_) => "Projector.InvalidSpec",
            InitError::Margin(_) | InitError::Consumer(_) => "Projector.InvalidConfiguration",
            InitError::NotInLambda(_) => "Projector.NotInLambda",
            InitError::Aws(_) => "Projector.AwsConfiguration",
            InitError::Metrics(_) => "Projector.Metrics",
            InitError::Global(_) => "Projector.GlobalTable",
        }
    }
}

/// `ddb-projector lambda`: init, then serve invocations until Lambda stops
/// the process.
pub fn run() -> anyhow::Result<()> {
    serve(None, Vec::new())
}

/// Init with the spec at `spec` (`None`: `PROJECTOR_SPEC`'s) and
/// projections written in Rust besides the spec's (each added to the spec
/// of the table that describes its source entity), then serve invocations
/// until Lambda stops the process: a team's own bootstrap (see
/// `crate::embed`).
pub fn serve(spec: Option<PathBuf>, custom: Vec<Arc<dyn CustomProjection>>) -> anyhow::Result<()> {
    let Ok(api) = std::env::var(RUNTIME_API_VAR) else {
        anyhow::bail!(InitError::NotInLambda(RUNTIME_API_VAR));
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| anyhow::anyhow!("cannot start the async runtime: {error}"))?;
    let handler = match runtime.block_on(init(spec, custom)) {
        Ok(handler) => Arc::new(handler),
        Err(error) => {
            if let Err(post) = post_init_error(&api, &error) {
                tracing::error!(error = %post, "cannot report the init error to the Runtime API");
            }
            return Err(error.into());
        }
    };
    tracing::info!(
        specs = if handler.registered.is_some() {
            "registered for each table"
        } else {
            handler.specs.source.as_str()
        },
        tables = handler.specs.specs().len(),
        table = handler.table.as_deref().unwrap_or("(from each event)"),
        "ready"
    );
    let service = lambda_runtime::service_fn(move |event| {
        let handler = handler.clone();
        async move { handler.handle(event).await }
    });
    runtime
        .block_on(lambda_runtime::run(service))
        .map_err(|error| anyhow::anyhow!("the Lambda runtime stopped: {error}"))
}

/// Everything done once per execution environment.
async fn init(
    spec: Option<PathBuf>,
    custom: Vec<Arc<dyn CustomProjection>>,
) -> Result<Handler, InitError> {
    let process_started = std::time::SystemTime::now();
    for var in [
        "AWS_LAMBDA_FUNCTION_NAME",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
        "AWS_LAMBDA_FUNCTION_VERSION",
    ] {
        if std::env::var_os(var).is_none() {
            return Err(InitError::NotInLambda(var));
        }
    }
    let spec_path = spec.or_else(|| {
        std::env::var_os(SPEC_VAR)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
    });
    let margin = match std::env::var(MARGIN_VAR) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| InitError::Margin(text))?,
        Err(_) => DEFAULT_MARGIN,
    };
    let table = std::env::var(TABLE_VAR).ok().filter(|t| !t.is_empty());
    let consumer = match std::env::var(CONSUMER_VAR) {
        Ok(name) if !name.is_empty() => {
            Some(crate::dynamo::names::parse_consumer(&name).map_err(InitError::Consumer)?)
        }
        _ => None,
    };
    let Some(spec_path) = spec_path else {
        if let Some(first) = custom.first() {
            return Err(InitError::Spec(SpecErrors(vec![crate::spec::SpecError {
                file: format!("custom projection `{}`", first.name()),
                context: String::new(),
                problem: format!(
                    "projections written in Rust need a spec file to join: set {SPEC_VAR} (registered specs are composed at run time, without them)"
                ),
            }])));
        }
        return init_registered(process_started, margin, table, consumer).await;
    };
    let mut specs = SpecSet::load(&spec_path)
        .and_then(|set| set.with_custom(&custom))
        .map_err(InitError::Spec)?;
    if let Ok(map) = std::env::var(TABLE_NAMES_VAR) {
        specs.rename_tables(&map).map_err(|problem| {
            InitError::Spec(SpecErrors(vec![crate::spec::SpecError {
                file: specs.source.clone(),
                context: String::new(),
                problem: format!("{TABLE_NAMES_VAR}: {problem}"),
            }]))
        })?;
    }
    if let Some(table) = &table {
        if specs.for_table(table).is_none() {
            return Err(InitError::Spec(SpecErrors(vec![crate::spec::SpecError {
                file: specs.source.clone(),
                context: String::new(),
                problem: format!(
                    "{TABLE_VAR}=`{table}` names no table the specs describe; unset it to route each batch by its stream's table"
                ),
            }])));
        }
    }
    let (client, regions) = clients().await?;
    if let Some(table) = &table {
        let spec = specs.for_table(table).expect("checked above");
        match regions.role(&client, table, spec).await {
            Ok(_) => {}
            Err(handler::RoleError::Global(error)) => return Err(InitError::Global(error)),
            // Described again by the first invocation.
            Err(handler::RoleError::Describe(error)) => {
                tracing::warn!(table, %error, "describing the table failed at init");
            }
        }
    }
    Ok(Handler {
        specs,
        client,
        table,
        margin,
        config: ApplyConfig {
            consumer,
            ..ApplyConfig::default()
        },
        metrics: Some(collector()?),
        process_started,
        regions,
        registered: None,
    })
}

/// Init without a spec file: the function serves the specs registered
/// for each table (the unnamed consumer's).
async fn init_registered(
    process_started: std::time::SystemTime,
    margin: Duration,
    table: Option<String>,
    consumer: Option<String>,
) -> Result<Handler, InitError> {
    if let Some(consumer) = consumer {
        return Err(InitError::Consumer(format!(
            "`{consumer}`: registrations are served by the table's unnamed consumer; a named consumer runs a spec file ({SPEC_VAR})"
        )));
    }
    let (client, regions) = clients().await?;
    let registered = handler::RegisteredSpecs::default();
    if let Some(table) = &table {
        // Read at init so that a table with no registry access fails here.
        if let Err(error) = registered.spec(&client, table).await {
            tracing::warn!(table, %error, "reading the registered specs failed at init");
        }
    }
    Ok(Handler {
        specs: SpecSet::compose(Vec::new()).expect("no spec composes"),
        client,
        table,
        margin,
        config: ApplyConfig::default(),
        metrics: Some(collector()?),
        process_started,
        regions,
        registered: Some(registered),
    })
}

/// The DynamoDB client (its retries bounded by the invocation's deadline
/// by the applier) and the function's regions (see `crate::global`: a
/// global table's home region is checked when a table is first seen).
async fn clients() -> Result<(aws_sdk_dynamodb::Client, handler::Regions), InitError> {
    let config = crate::dynamo::client::load_config()
        .await
        .map_err(|error| InitError::Aws(format!("{error:#}")))?;
    let client = crate::dynamo::client::dynamodb_within_deadline(&config);
    let region = config.region().map(|r| r.to_string()).unwrap_or_default();
    let home = std::env::var(crate::global::HOME_REGION_VAR)
        .ok()
        .filter(|h| !h.trim().is_empty());
    let writers = crate::global::Writers::from_flag(
        std::env::var(crate::global::WRITERS_IN_HOME_VAR)
            .ok()
            .as_deref(),
    );
    Ok((client, handler::Regions::new(region, home, writers)))
}

/// The EMF metrics recorder.
fn collector() -> Result<&'static metrics_cloudwatch_embedded::Collector, InitError> {
    let namespace = std::env::var(NAMESPACE_VAR).unwrap_or_else(|_| metrics::NAMESPACE.to_string());
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    metrics::install(&namespace, &function).map_err(InitError::Metrics)
}

/// Posts an init failure to `/2018-06-01/runtime/init/error`, so that Lambda
/// shows its message instead of a bare exit status. The Runtime API is plain
/// HTTP/1.1 on a local address.
fn post_init_error(api: &str, error: &InitError) -> std::io::Result<()> {
    let body = serde_json::json!({
        "errorType": error.error_type(),
        "errorMessage": error.to_string(),
    })
    .to_string();
    let mut stream = std::net::TcpStream::connect(api)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nLambda-Runtime-Function-Error-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        error.error_type(),
        body.len()
    )?;
    stream.flush()?;
    // Lambda answers 202 and then stops the environment; the answer itself
    // is not needed, only that it was received.
    let mut status = [0u8; 12];
    let _ = stream.read(&mut status)?;
    Ok(())
}
