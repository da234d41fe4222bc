//! The library's face for a team's own binary: a [`Projector`] is a spec
//! plus projections written in Rust, and [`serve_lambda`] serves it as an
//! AWS Lambda function, exactly as the shipped bootstrap serves a spec
//! (partial batch responses, the deadline, EMF metrics, Powertools-style
//! logs, the global-table guard, backfill and audit slices).
//!
//! A projection written in Rust implements [`CustomProjection`]: for each
//! change of its source entity it plans whole-item puts and deletes
//! ([`CustomOp`]), idempotent like the built-in kinds. It joins the spec
//! of the table that describes its source entity and is checked with it.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use ddb_projector::{serve_lambda, CustomOp, CustomProjection, EntityChange, Projector};
//!
//! #[derive(Debug)]
//! struct Nothing;
//!
//! impl CustomProjection for Nothing {
//!     fn name(&self) -> &str {
//!         "nothing"
//!     }
//!     fn source_entity(&self) -> &str {
//!         "email"
//!     }
//!     fn plan(&self, _change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
//!         Ok(Vec::new())
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     // PROJECTOR_SPEC names the spec file inside the package, as for the
//!     // shipped bootstrap; `.spec(path)` names it here instead.
//!     serve_lambda(Projector::new().custom(Arc::new(Nothing)))
//! }
//! ```
//!
//! `examples/custom_projection.rs` is a whole one, tested end to end on
//! DynamoDB Local through the Lambda Runtime API.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::control::Connection;
pub use crate::effect::CustomOp;
pub use crate::kinds::custom::{CustomProjection, EntityChange};
use crate::lambda::SPEC_VAR;
use crate::logging::LogFormat;
pub use crate::record::ValueRef;
pub use crate::record::{AttributeValue, ChangeKind, ChangeRecord, Image, Item, ItemKey};
pub use crate::spec::{Spec, SpecError, SpecErrors, SpecSet};

/// A spec and the projections written in Rust that join it, and where it
/// runs: the table, the consumer, the home region of a global table.
#[derive(Debug, Default, Clone)]
pub struct Projector {
    spec: Option<PathBuf>,
    custom: Vec<Arc<dyn CustomProjection>>,
    table: Option<String>,
    consumer: Option<String>,
    home_region: Option<String>,
    writers_in_home_region: Option<bool>,
}

impl Projector {
    /// The spec `PROJECTOR_SPEC` names (a file, or a directory of them),
    /// with no projection written in Rust yet.
    pub fn new() -> Projector {
        Projector::default()
    }

    /// Reads the spec from `path` (a file, or a directory of them) rather
    /// than from `PROJECTOR_SPEC`.
    pub fn spec(mut self, path: impl AsRef<Path>) -> Projector {
        self.spec = Some(path.as_ref().to_path_buf());
        self
    }

    /// Adds a projection written in Rust: it joins the spec of the table
    /// that describes its source entity.
    pub fn custom(mut self, projection: Arc<dyn CustomProjection>) -> Projector {
        self.custom.push(projection);
        self
    }

    /// The table to work on (default: the one the spec describes). With no
    /// spec ([`Projector::spec`] nor `PROJECTOR_SPEC`), the specs
    /// registered for this table (`ddb-projector register`).
    pub fn table(mut self, table: impl Into<String>) -> Projector {
        self.table = Some(table.into());
        self
    }

    /// The stream consumer this is, when deployments with different specs
    /// share the table (the CLI's `--consumer`; default
    /// `PROJECTOR_CONSUMER`). A name that is not a consumer's is refused
    /// by [`Projector::connect`].
    pub fn consumer(mut self, name: impl Into<String>) -> Projector {
        self.consumer = Some(name.into());
        self
    }

    /// On a global table, the region that projects it (the CLI's
    /// `--home-region`; default `PROJECTOR_HOME_REGION`). Outside it,
    /// [`Connected::run`] stays idle and the commands that write refuse,
    /// as the CLI and the Lambda do.
    pub fn home_region(mut self, region: impl Into<String>) -> Projector {
        self.home_region = Some(region.into());
        self
    }

    /// On a global table, whether the writers write the items projections
    /// write onto in the home region only (the CLI's
    /// `--writers-in-home-region`; default
    /// `PROJECTOR_WRITERS_IN_HOME_REGION`). Without it, such a table is
    /// refused: a projection's write would replace newer writes made in
    /// another region.
    pub fn writers_in_home_region(mut self, home_only: bool) -> Projector {
        self.writers_in_home_region = Some(home_only);
        self
    }

    /// Connects to the table with the AWS configuration of the environment
    /// (credentials, region, `AWS_ENDPOINT_URL`): the spec compiled with
    /// the projections written in Rust and laid out as the table's
    /// registry has it. Every problem of the spec is reported at once.
    pub async fn connect(&self) -> anyhow::Result<Connected> {
        let config = crate::dynamo::client::load_config().await?;
        self.connect_with(config).await
    }

    /// [`Projector::connect`] with an AWS SDK configuration of the
    /// caller's (its credentials, region, endpoint, retry settings).
    pub async fn connect_with(&self, config: aws_config::SdkConfig) -> anyhow::Result<Connected> {
        let dynamodb = crate::dynamo::client::dynamodb(&config);
        self.connect_with_client(config, dynamodb).await
    }

    /// [`Projector::connect_with`] and a DynamoDB client of the caller's
    /// (its interceptors, timeouts, retry settings) for every request to
    /// the table.
    pub async fn connect_with_client(
        &self,
        config: aws_config::SdkConfig,
        dynamodb: aws_sdk_dynamodb::Client,
    ) -> anyhow::Result<Connected> {
        let consumer = match self
            .consumer
            .clone()
            .or_else(|| std::env::var(crate::lambda::CONSUMER_VAR).ok())
            .filter(|name| !name.is_empty())
        {
            Some(name) => {
                Some(crate::dynamo::names::parse_consumer(&name).map_err(anyhow::Error::msg)?)
            }
            None => None,
        };
        let from_env = std::env::var_os(SPEC_VAR).filter(|p| !p.is_empty());
        let connection = match (&self.spec, from_env, &self.table) {
            (None, None, Some(table)) => {
                if let Some(first) = self.custom.first() {
                    anyhow::bail!(
                        "custom projection `{}`: projections written in Rust need a spec file to join (registered specs are composed at run time, without them)",
                        first.name()
                    );
                }
                if let Some(consumer) = &consumer {
                    anyhow::bail!(
                        "registrations are served by the table's unnamed consumer; consumer `{consumer}` runs a spec file"
                    );
                }
                crate::control::connect_registered_with(table.clone(), config, dynamodb).await?
            }
            _ => {
                let mut set = self.load().map_err(|errors| anyhow::anyhow!("{errors}"))?;
                if let Ok(map) = std::env::var(crate::lambda::TABLE_NAMES_VAR) {
                    set.rename_tables(&map).map_err(|problem| {
                        anyhow::anyhow!("{}: {problem}", crate::lambda::TABLE_NAMES_VAR)
                    })?;
                }
                let spec = set
                    .select(self.table.as_deref())
                    .map_err(anyhow::Error::msg)?
                    .as_ref()
                    .clone();
                let table = self
                    .table
                    .clone()
                    .unwrap_or_else(|| spec.table.name.clone());
                crate::control::connect_with(spec, table, consumer.clone(), config, dynamodb)
                    .await?
            }
        };
        let home_region = self
            .home_region
            .clone()
            .or_else(|| std::env::var(crate::global::HOME_REGION_VAR).ok())
            .filter(|h| !h.trim().is_empty());
        let writers = match self.writers_in_home_region {
            Some(true) => crate::global::Writers::HomeOnly,
            Some(false) => crate::global::Writers::Anywhere,
            None => crate::global::Writers::from_flag(
                std::env::var(crate::global::WRITERS_IN_HOME_VAR)
                    .ok()
                    .as_deref(),
            ),
        };
        Ok(Connected {
            connection,
            deployment: crate::global::Deployment {
                home_region,
                writers,
            },
        })
    }

    /// The Lambda event source mapping's `FilterCriteria` for this
    /// projector, as `ddb-projector filters --spec` prints them, with the
    /// projections written in Rust counted in: a record of an entity only a
    /// custom projection uses must reach the function. For several tables,
    /// an object of them by table name.
    pub fn filters(&self) -> Result<serde_json::Value, SpecErrors> {
        let set = self.load()?;
        let by_table = crate::lambda::filters::by_table(set.specs(), &mut |table, note| {
            tracing::warn!(table, "{note}")
        });
        Ok(crate::lambda::filters::criteria_json(by_table))
    }

    /// Loads and compiles the spec with the projections written in Rust,
    /// as init does: for a team's own tests, or `main` before serving.
    /// Every problem is reported at once, naming the file or projection.
    pub fn load(&self) -> Result<SpecSet, SpecErrors> {
        let path = match &self.spec {
            Some(path) => path.clone(),
            None => match std::env::var_os(SPEC_VAR).filter(|p| !p.is_empty()) {
                Some(path) => PathBuf::from(path),
                None => {
                    return Err(SpecErrors(vec![crate::spec::SpecError {
                        file: SPEC_VAR.to_string(),
                        context: String::new(),
                        problem: format!("no spec: set {SPEC_VAR} or call Projector::spec(path)"),
                    }]))
                }
            },
        };
        SpecSet::load(&path).and_then(|set| set.with_custom(&self.custom))
    }
}

/// Serves `projector` as an AWS Lambda function until Lambda stops the
/// process: sets up JSON logs (`PROJECTOR_LOG_FORMAT=text` for text),
/// then runs the same init and invocation loop as the shipped bootstrap
/// (its variables: `crate::lambda`). Init problems are posted to the
/// Runtime API's `/init/error` and returned.
///
/// Run with the arguments `filters [--spec FILE]` (outside Lambda), it
/// prints [`Projector::filters`] instead, as `ddb-projector filters` does:
/// `PROJECTOR_BIN=<your binary> infra/deploy ...` then deploys the
/// filters your projections need.
pub fn serve_lambda(projector: Projector) -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("filters") {
        let projector = match args.iter().position(|a| a == "--spec") {
            Some(i) => match args.get(i + 1) {
                Some(path) => projector.spec(path),
                None => anyhow::bail!("filters --spec: a spec file or directory is needed"),
            },
            None => projector,
        };
        let filters = projector
            .filters()
            .map_err(|errors| anyhow::anyhow!("{errors}"))?;
        println!("{}", serde_json::to_string_pretty(&filters)?);
        return Ok(());
    }
    let format = match std::env::var("PROJECTOR_LOG_FORMAT").as_deref() {
        Ok("text") => LogFormat::Text,
        _ => LogFormat::Json,
    };
    crate::logging::init(format);
    crate::lambda::serve(projector.spec, projector.custom)
}

/// The stack of the thread the runner runs on: what `main` has on Linux.
const RUNNER_STACK: usize = 8 << 20;

/// A projector connected to its table: the runner, backfill, audit and
/// `wait` as methods, each through the same checks as the CLI's command
/// (a global table's home region among them).
pub struct Connected {
    connection: Connection,
    deployment: crate::global::Deployment,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected")
            .field("table", &self.connection.table)
            .field("service", &self.connection.spec.service)
            .field("consumer", &self.connection.consumer)
            .field("home_region", &self.deployment.home_region)
            .finish()
    }
}

/// Whether an item's derived state is projected, pending or held.
pub use crate::audit::wait::{Pending, Status as WaitStatus, Waited};
/// What an audit found (and repaired).
pub use crate::audit::AuditReport;
/// What a backfill did.
pub use crate::backfill::BackfillSummary;
/// What a run of the stream did (records, writes, capacity, lag).
pub use crate::source::Summary as RunSummary;

impl Connected {
    /// The table it works on.
    pub fn table(&self) -> &str {
        &self.connection.table
    }

    /// Tails the table's stream and applies the projections, checkpointing
    /// per shard, until SIGINT or SIGTERM, or until this future is dropped
    /// (`drain`: until caught up). Outside a global table's home region it
    /// writes nothing and returns `None` at once. While it runs, the
    /// runner listens for SIGINT and SIGTERM itself (tokio's handlers):
    /// they stop it cleanly rather than the process.
    pub async fn run(&self, drain: bool) -> anyhow::Result<Option<RunSummary>> {
        let options = if drain {
            crate::source::RunOptions::drain()
        } else {
            crate::source::RunOptions::follow()
        };
        let verb = if drain { "run --drain" } else { "run" };
        // Dropping this future (a `select!`, a timeout, shutting down)
        // drops `_cancel`, which stops the runner as SIGTERM does: it
        // finishes its batches, checkpoints and gives its leases back.
        let (_cancel, stop) = tokio::sync::watch::channel(false);
        let options = crate::source::RunOptions {
            stop: Some(stop),
            ..options
        };
        let connection = self.connection.clone();
        let deployment = self.deployment.clone();
        // The runner polls every shard's batch in one task, whose frames
        // outgrow a 2 MiB thread (tokio's workers, a test's) in a debug
        // build: it runs on a thread of its own with the stack `main` has.
        let (answer, answered) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("ddb-projector-run".into())
            .stack_size(RUNNER_STACK)
            .spawn(move || {
                let worked = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|runtime| {
                        runtime
                            .block_on(crate::global::work(&connection, &deployment, options, verb))
                            .map_err(|failed| failed.error)
                    });
                let _ = answer.send(worked);
            })?;
        let worked = answered.await.map_err(|_| {
            anyhow::anyhow!("the runner's thread panicked (its message is in the log)")
        })??;
        match worked {
            crate::global::Worked::Idle { .. } => Ok(None),
            crate::global::Worked::Ran(ran) => Ok(Some(ran.summary)),
        }
    }

    /// Backfills what `status` says is not live (the CLI's `backfill` with
    /// no projection named): 4 segments, a new run, no rate limit.
    /// Refused outside a global table's home region. `Ok` means it ran:
    /// a projection it could not record as backfilled (a writer of another
    /// definition wrote meanwhile) is in `not_backfilled`, with why, where
    /// the CLI exits 1.
    pub async fn backfill(&self) -> anyhow::Result<BackfillSummary> {
        Box::pin(crate::global::require_home(
            &self.connection,
            &self.deployment,
            "backfill",
        ))
        .await?;
        let request = crate::backfill::Request::default();
        // What the messages suggest running: the CLI on this table, as
        // this consumer (it cannot run projections written in Rust).
        let mut target = format!("--table {}", self.connection.table);
        if let Some(consumer) = &self.connection.consumer {
            target.push_str(&format!(" --consumer {consumer}"));
        }
        let commands = crate::control::Commands {
            target,
            consumer: self.connection.consumer.clone(),
            registered: self.connection.registered.is_some(),
        };
        let mut note = |note: &str| tracing::info!("{note}");
        let done = Box::pin(crate::backfill::lifecycle(
            &self.connection,
            &request,
            &commands,
            &mut note,
        ))
        .await?;
        Ok(match done {
            crate::backfill::Backfilled::AllLive => BackfillSummary::default(),
            crate::backfill::Backfilled::Ran { summary, .. } => summary,
        })
    }

    /// Checks every derived item, counter and invariant from a full scan;
    /// with `repair`, rewrites derived state to what it should be (never a
    /// source item), which only the home region of a global table may.
    pub async fn audit(&self, repair: bool) -> anyhow::Result<AuditReport> {
        if repair {
            crate::global::require_home(&self.connection, &self.deployment, "audit --repair")
                .await?;
        } else {
            // As the CLI: a missing table is named before the scan.
            crate::dynamo::client::describe_table(
                &self.connection.dynamodb,
                &self.connection.table,
            )
            .await?;
        }
        let options = crate::audit::AuditOptions {
            repair,
            ..Default::default()
        };
        let applier = self.connection.applier();
        Ok(Box::pin(crate::audit::audit(&applier, &options)).await?)
    }

    /// Waits until the derived state of the item `key` is projected (read
    /// consistently), for at most `timeout`: read-your-writes for an API
    /// that has just written it.
    pub async fn wait(&self, key: ItemKey, timeout: std::time::Duration) -> anyhow::Result<Waited> {
        let options = crate::audit::wait::WaitOptions {
            timeout,
            ..Default::default()
        };
        let applier = self.connection.applier();
        Ok(Box::pin(crate::audit::wait::wait(&applier, &key, &options)).await?)
    }
}
