//! The self-hosted DynamoDB Streams runner: `ddb-projector run` and `replay`.
//!
//! A coordinator lists the stream's shards (`DescribeStream`, paginated) and
//! starts one task per shard that may run: a child only once its parent is
//! finished (or trimmed away), so an item's records, which move from a
//! parent shard to a child when DynamoDB splits or rotates shards, are
//! applied in order. It lists again periodically, and at once when a shard
//! finishes, to find new shards.
//!
//! A shard task reads its shard strictly in order: an iterator after the
//! checkpoint (else `TRIM_HORIZON`), `GetRecords` pages of up to 1000
//! records, each decoded and applied as one batch. The checkpoint then
//! moves to the last record of the *handled prefix* of the batch. On the
//! first record that failed (transient), the task backs off and reads again
//! from the checkpoint with a fresh iterator; expired iterators are renewed
//! the same way. A checkpoint trimmed away (records older than 24 hours
//! were never applied) stops the runner with [`RunErrorKind::RecordsLost`]:
//! records are never skipped silently.
//!
//! Shard tasks run concurrently; within a shard, batches run one after the
//! other. The tasks are futures polled by the coordinator itself rather than
//! spawned tasks, because the applier's batch future is not `Send` (rustc
//! cannot prove it for the closures in `Applier::write_phase`); the work is
//! I/O-bound, so one thread drives them well. See
//! [`crate::source::checkpoint`] for the checkpoint items.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use super::checkpoint::{CheckpointError, CheckpointStore};
use super::observe::Health;
use crate::apply::{Applier, ApplyError, BatchOptions};
use crate::dynamo::retry::{ErrorClass, Retrier, UntilStopped, STREAM_REQUEST_TIME};
use crate::plan::Skip;
use crate::record::SequenceNumber;
use crate::spec::ProjectionId;

/// Why records after a checkpoint are gone, in the usual case.
const TRIMMED: &str =
    "DynamoDB Streams keeps records for 24 hours, and they were trimmed before the runner \
     applied them (it was stopped, or behind, for longer)";

/// The most records `GetRecords` returns at once.
pub const MAX_BATCH: i32 = 1000;

/// How the runner runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Exit once the stream is caught up (otherwise run until stopped).
    pub drain: bool,
    /// Start from and write checkpoints (off: read every shard from
    /// `TRIM_HORIZON` and write none, as `replay` does).
    pub checkpoints: bool,
    /// Only these projections (`None`: all).
    pub selection: Option<Vec<ProjectionId>>,
    /// Consecutive empty pages of an open shard that mean "caught up" when
    /// draining. DynamoDB Streams may return empty pages before it reaches
    /// a shard's records, so one is not enough.
    pub empty_polls: u32,
    /// The pause after an empty page.
    pub poll_interval: Duration,
    /// How often shards are listed again to find new ones.
    pub relist_interval: Duration,
    /// Records per `GetRecords` call (at most 1000).
    pub batch_limit: i32,
    /// Apply each page's items as they are now rather than the records'
    /// images (`replay`): every item a page's records touched is read
    /// consistently, once, and derived like a scanned item, guarded by
    /// the state read ([`Applier::current_states`]). An image older than
    /// what the table already shows is then never applied again, so
    /// readers never see the past, and an exact table is not written.
    /// Off for `run` on DynamoDB Streams: its records are new, and
    /// reading each item would cost a read per record. Always on for a
    /// Kinesis stream, whose records of one item come twice and in any
    /// order.
    pub derive_current: bool,
    /// Where shards without a checkpoint start on a Kinesis stream: the
    /// first record written at or after this time (ms since the epoch;
    /// `None`: the trim horizon). DynamoDB Streams always starts at its
    /// trim horizon.
    pub from_ms: Option<i64>,
    /// Read this Kinesis data stream rather than the table's DynamoDB
    /// stream (the CLI's `--kinesis-stream`; used by
    /// `crate::global::run_stream`).
    pub kinesis: Option<KinesisStream>,
    /// Where the runner reports its health (`run --metrics-addr`'s
    /// `/healthz`); while it runs, an idle runner renews its leases too.
    pub health: Option<Health>,
    /// With a replay (no checkpoints): keep each shard's position under
    /// this run (`_ddbp#replay#<run>`, laid out as checkpoints), read
    /// from there, so a replay stopped anywhere continues (`replay
    /// --resume`, `--run NAME`); the positions are deleted once it caught
    /// up.
    pub replay_run: Option<String>,
    /// Stops the run, as SIGTERM does, once it says `true` or its sender
    /// is gone (a library caller that dropped the run's future;
    /// `crate::global::work` listens to it).
    pub stop: Option<watch::Receiver<bool>>,
}

/// A Kinesis data stream the table sends its changes to.
#[derive(Debug, Clone)]
pub struct KinesisStream {
    /// Its ARN.
    pub arn: String,
    /// Tables the spec files given describe: their changes are another
    /// consumer's ([`OtherTables`]).
    pub described: Vec<String>,
}

impl RunOptions {
    /// Tail the stream until stopped, with checkpoints.
    pub fn follow() -> RunOptions {
        RunOptions {
            drain: false,
            checkpoints: true,
            selection: None,
            empty_polls: 3,
            poll_interval: Duration::from_millis(1000),
            relist_interval: Duration::from_secs(10),
            batch_limit: MAX_BATCH,
            derive_current: false,
            from_ms: None,
            kinesis: None,
            health: None,
            replay_run: None,
            stop: None,
        }
    }

    /// Process what the stream holds, with checkpoints, and exit once caught up.
    pub fn drain() -> RunOptions {
        RunOptions {
            drain: true,
            poll_interval: Duration::from_millis(200),
            ..RunOptions::follow()
        }
    }

    /// Process the whole retained stream again without checkpoints, and exit
    /// once caught up: each record a hint that its item changed, the item
    /// derived as it is now ([`RunOptions::derive_current`]).
    pub fn replay(selection: Option<Vec<ProjectionId>>) -> RunOptions {
        RunOptions {
            checkpoints: false,
            selection,
            derive_current: true,
            ..RunOptions::drain()
        }
    }
}

/// What a run did, for the summary printed on stop.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Records handled (applied, skipped or dead-lettered).
    pub records: u64,
    /// Effects planned.
    pub effects: u64,
    /// Write requests sent.
    pub writes: u64,
    /// Write capacity units DynamoDB reported.
    pub write_units: f64,
    /// The least DynamoDB bills for the writes sent
    /// (`crate::apply::Requests::min_billed_write_units`).
    pub min_billed_write_units: u64,
    /// Read capacity units DynamoDB reported.
    pub read_units: f64,
    /// Items read consistently to derive them as they are now
    /// (`RunOptions::derive_current`; 0 otherwise).
    pub items_read: u64,
    /// Requests the applier retried.
    pub retries: u64,
    /// Times a batch had a failed record and was read again from its checkpoint.
    pub rereads: u64,
    /// Records dead-lettered.
    pub dead_letters: u64,
    /// Records skipped (nothing applies to them).
    pub skipped: u64,
    /// Batches applied.
    pub batches: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Shards read to their end.
    pub shards_finished: u64,
    /// How long the run took.
    pub elapsed: Duration,
    /// Records per second over the run.
    pub records_per_second: f64,
    /// The age of the last record applied when it was applied, from its
    /// `ApproximateCreationDateTime` (which DynamoDB Local rounds down to
    /// the minute).
    pub last_lag_ms: Option<i64>,
    /// The largest such age seen.
    pub max_lag_ms: Option<i64>,
    /// A drain (`run --drain`, `replay`) ended because every shard was
    /// read to where the stream ends, not because it was stopped.
    pub caught_up: bool,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_record = if self.records > 0 {
            self.write_units / self.records as f64
        } else {
            0.0
        };
        let lag = |ms: Option<i64>| ms.map_or("-".to_string(), |ms| format!("{ms} ms"));
        writeln!(f, "  records          {}", self.records)?;
        writeln!(f, "  effects          {}", self.effects)?;
        writeln!(f, "  writes           {}", self.writes)?;
        writeln!(
            f,
            "  write units      {:.1} reported ({per_record:.2} per record)",
            self.write_units
        )?;
        let billed = self.min_billed_write_units as f64;
        writeln!(
            f,
            "  billed at least  {billed:.1} ({:.2} per record; DynamoDB bills 2 per transaction item and 1 per other write, per KB, GSI writes extra; DynamoDB Local reports 2.0 for a whole transaction)",
            if self.records > 0 { billed / self.records as f64 } else { 0.0 }
        )?;
        writeln!(f, "  items read       {}", self.items_read)?;
        writeln!(f, "  retries          {}", self.retries)?;
        writeln!(f, "  re-reads         {}", self.rereads)?;
        writeln!(f, "  dead letters     {}", self.dead_letters)?;
        writeln!(f, "  skipped          {}", self.skipped)?;
        writeln!(f, "  batches          {}", self.batches)?;
        writeln!(f, "  checkpoints      {}", self.checkpoints)?;
        writeln!(f, "  shards finished  {}", self.shards_finished)?;
        writeln!(f, "  elapsed          {:.2} s", self.elapsed.as_secs_f64())?;
        writeln!(f, "  records/s        {:.1}", self.records_per_second)?;
        write!(
            f,
            "  lag              {} (max {}; record times are approximate, to the minute on DynamoDB Local)",
            lag(self.last_lag_ms),
            lag(self.max_lag_ms)
        )
    }
}

/// Why the runner stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunErrorKind {
    /// The checkpoint's records were trimmed from the stream before they
    /// were applied.
    #[error(
        "records were lost: shard {shard_id} of stream {stream_arn} cannot be read after its checkpoint \
         (sequence number {sequence_number}): {detail}. Changes after the checkpoint were never applied and derived \
         items may be stale. To recover: \
         (1) rebuild derived state with `ddb-projector backfill --all --spec FILE --table {table}`; \
         (2) reset the checkpoint by deleting its item ({key}), e.g. \
         `aws dynamodb delete-item --table-name {table} --key '{key_json}'`; \
         (3) start `ddb-projector run` again"
    )]
    RecordsLost {
        /// The table.
        table: String,
        /// The stream.
        stream_arn: String,
        /// The shard.
        shard_id: String,
        /// The checkpoint's sequence number.
        sequence_number: String,
        /// Why the records cannot be read.
        detail: String,
        /// The checkpoint item's key, for people.
        key: String,
        /// The checkpoint item's key as DynamoDB JSON, for the AWS CLI.
        key_json: String,
    },
    /// The applier cannot write (no table, no access...).
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The Streams API refuses the stream (gone, access denied...).
    #[error("{operation} on stream {stream_arn} failed: {message}")]
    Stream {
        /// The operation.
        operation: &'static str,
        /// The stream.
        stream_arn: String,
        /// What DynamoDB Streams or the SDK said.
        message: String,
    },
    /// Checkpoints cannot be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// The runner's error, with what it did before it stopped.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct RunError {
    /// What went wrong.
    pub kind: RunErrorKind,
    /// What the run did until then.
    pub summary: Summary,
}

/// Reads one table's stream and applies projections.
#[derive(Debug, Clone)]
pub struct StreamRunner {
    applier: Applier,
    streams: StreamApi,
    stream_arn: String,
    others: OtherTables,
}

impl StreamRunner {
    /// A runner for `stream_arn` (the stream of the applier's table).
    pub fn new(
        applier: Applier,
        streams: aws_sdk_dynamodbstreams::Client,
        stream_arn: &str,
    ) -> StreamRunner {
        StreamRunner {
            applier,
            streams: StreamApi::Dynamo(streams),
            stream_arn: stream_arn.to_string(),
            others: OtherTables::default(),
        }
    }

    /// A runner for the Kinesis data stream `stream_arn`, which Kinesis
    /// Data Streams for DynamoDB feeds with the changes of the applier's
    /// table (and maybe of others). Every page's items are derived as they
    /// are now ([`RunOptions::derive_current`]): the stream may hold one
    /// change twice, and one item's changes in any order. A change of
    /// another table is skipped when `others` says another consumer
    /// serves it, and dead-lettered naming its table otherwise.
    pub fn kinesis(
        applier: Applier,
        kinesis: aws_sdk_kinesis::Client,
        stream_arn: &str,
        others: OtherTables,
    ) -> StreamRunner {
        StreamRunner {
            applier,
            streams: StreamApi::Kinesis(kinesis),
            stream_arn: stream_arn.to_string(),
            others,
        }
    }

    /// The checkpoint store of this runner's stream.
    pub fn checkpoints(&self) -> CheckpointStore {
        CheckpointStore::new(
            self.applier.client().clone(),
            self.applier.table(),
            self.applier.spec(),
            &self.stream_arn,
        )
        .for_consumer(self.applier.config().consumer.as_deref())
    }

    /// Runs until the stream is caught up (`options.drain`) or `stop`
    /// completes; then lets the current batches finish and returns what
    /// was done.
    pub async fn run(
        &self,
        options: RunOptions,
        stop: impl Future<Output = ()>,
    ) -> Result<Summary, RunError> {
        // Every log line names the spec's service, table and consumer.
        let spec = self.applier.spec();
        let span = tracing::info_span!(
            "spec",
            spec_service = %spec.service,
            table = self.applier.table(),
            consumer = self.applier.config().consumer.as_deref().unwrap_or("")
        );
        tracing::Instrument::instrument(self.run_in_span(options, stop), span).await
    }

    async fn run_in_span(
        &self,
        options: RunOptions,
        stop: impl Future<Output = ()>,
    ) -> Result<Summary, RunError> {
        let started = Instant::now();
        let mut options = options;
        if self.streams.is_kinesis() {
            options.derive_current = true;
        }
        let shared = Arc::new(Shared {
            applier: self.applier.clone(),
            streams: self.streams.clone(),
            stream_arn: self.stream_arn.clone(),
            checkpoints: options.checkpoints.then(|| self.checkpoints()),
            replay_progress: options
                .replay_run
                .as_deref()
                .filter(|_| !options.checkpoints)
                .map(|run| self.checkpoints().for_replay(run)),
            bookkeeping: Skip::Reserved.to_string(),
            batch_options: BatchOptions {
                selection: options.selection.clone(),
                // Items derived as they are now are mostly in their state
                // already: a marker read costs less than a cancelled
                // transaction (as for a backfill and `recover`).
                read_markers_first: options.derive_current,
                // A Kinesis stream's records are live: its items' invariants
                // are checked as the DynamoDB stream's are.
                check_states: self.streams.is_kinesis() && options.checkpoints,
                ..BatchOptions::default()
            },
            others: self.others.clone(),
            options,
            summary: Mutex::new(Summary::default()),
        });
        // A consumer of the stream says so at once, not at its first batch,
        // so that `status` sees the deploy of a table without traffic.
        let health = shared.options.health.clone();
        if let Some(health) = &health {
            health.set_running(true);
        }
        self.renew_leases(health.as_ref()).await;
        // The keeper stops once the coordinator is done, but never in the
        // middle of a renewal: one still on the wire could land after the
        // leases are given back and hold them for another period.
        let (done, finished) = watch::channel(false);
        let coordinate = async {
            let result = Coordinator::new(shared.clone()).run(stop).await;
            done.send_replace(true);
            result
        };
        let (result, ()) = tokio::join!(coordinate, self.keep_leases(health.as_ref(), finished));
        if let Some(health) = &health {
            health.set_running(false);
        }
        // A replay that caught up needs its positions no more: the next
        // one under this run starts from the trim horizon.
        if let (Ok(true), Some(store)) = (&result, &shared.replay_progress) {
            if let Err(error) = store.reset(None).await {
                tracing::warn!(%error, "the replay's positions were not deleted: the next replay under its run reads on from them");
            }
        }
        let mut summary = shared.summary.lock().expect("summary lock").clone();
        summary.caught_up = matches!(result, Ok(true));
        let result = result.map(|_| ());
        summary.elapsed = started.elapsed();
        summary.records_per_second = if summary.elapsed.as_secs_f64() > 0.0 {
            summary.records as f64 / summary.elapsed.as_secs_f64()
        } else {
            0.0
        };
        match result {
            Ok(()) => Ok(summary),
            Err(kind) => Err(RunError { kind, summary }),
        }
    }
}

impl StreamRunner {
    /// Takes or renews the leases, and says so to `health`.
    async fn renew_leases(&self, health: Option<&Health>) {
        match self.applier.take_leases().await {
            Ok(until) => {
                if let Some(health) = health {
                    health.leased(until);
                }
            }
            Err(message) => {
                tracing::warn!(%message, "could not take the lifecycle leases; trying again");
                if let Some(health) = health {
                    health.lease_failed(message);
                }
            }
        }
    }

    /// Renews the leases a quarter of their length apart, whether batches
    /// come or not (a request only when they run out within half their
    /// length), so that an idle runner keeps them and `/healthz` tells a
    /// quiet table from a runner that lost them. Returns once `finished`
    /// says the run is over, after the renewal under way, if any.
    async fn keep_leases(&self, health: Option<&Health>, mut finished: watch::Receiver<bool>) {
        let period = (self.applier.config().lease / 4).max(Duration::from_millis(250));
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = finished.changed() => return,
            }
            if *finished.borrow() {
                return;
            }
            self.renew_leases(health).await;
        }
    }
}

mod api;
mod coordinator;
mod others;
mod shard;

pub use others::OtherTables;

pub(crate) use api::StreamApi;
use api::{ApiError, Start};

use coordinator::Coordinator;

/// What every shard task shares.
struct Shared {
    applier: Applier,
    streams: StreamApi,
    stream_arn: String,
    others: OtherTables,
    checkpoints: Option<CheckpointStore>,
    /// A replay's positions ([`RunOptions::replay_run`]).
    replay_progress: Option<CheckpointStore>,
    /// The skip reason of the projector's own items.
    bookkeeping: String,
    batch_options: BatchOptions,
    options: RunOptions,
    summary: Mutex<Summary>,
}

impl Shared {
    /// Where each shard's position is kept: the consumer's checkpoints,
    /// or a replay's positions.
    fn positions(&self) -> Option<&CheckpointStore> {
        self.checkpoints.as_ref().or(self.replay_progress.as_ref())
    }

    fn records_lost(
        &self,
        shard_id: &str,
        sequence_number: Option<&SequenceNumber>,
        detail: &str,
    ) -> RunErrorKind {
        let store = self.checkpoints.clone().unwrap_or_else(|| {
            CheckpointStore::new(
                self.applier.client().clone(),
                self.applier.table(),
                self.applier.spec(),
                &self.stream_arn,
            )
            .for_consumer(self.applier.config().consumer.as_deref())
        });
        let key_json = serde_json::Value::Object(
            store
                .key(shard_id)
                .into_iter()
                .map(|(name, value)| {
                    let text = match value {
                        aws_sdk_dynamodb::types::AttributeValue::S(text) => text,
                        other => format!("{other:?}"),
                    };
                    (name, serde_json::json!({ "S": text }))
                })
                .collect(),
        )
        .to_string();
        RunErrorKind::RecordsLost {
            table: self.applier.table().to_string(),
            stream_arn: self.stream_arn.clone(),
            shard_id: shard_id.to_string(),
            sequence_number: sequence_number.map_or("none".to_string(), |s| s.0.clone()),
            detail: detail.to_string(),
            key: store.describe_key(shard_id),
            key_json,
        }
    }

    fn stream_error(&self, operation: &'static str, message: String) -> RunErrorKind {
        RunErrorKind::Stream {
            operation,
            stream_arn: self.stream_arn.clone(),
            message,
        }
    }

    /// Every shard of the stream, in the order the stream lists them.
    async fn list_shards(&self) -> Result<Vec<ShardInfo>, RunErrorKind> {
        let operation = if self.streams.is_kinesis() {
            "ListShards"
        } else {
            "DescribeStream"
        };
        let mut retrier = Retrier::slow(Some(STREAM_REQUEST_TIME));
        loop {
            match self.streams.list_shards(&self.stream_arn).await {
                Ok(listed) => {
                    return Ok(listed
                        .into_iter()
                        .map(|shard| ShardInfo {
                            shard_id: shard.shard_id,
                            parent: shard.parent,
                            closed: shard.closed,
                        })
                        .collect())
                }
                Err(ApiError::NotFound(message)) => {
                    return Err(self.stream_error(operation, message))
                }
                Err(ApiError::Other(ErrorClass::Retry(reason), message)) => {
                    let waited = retrier
                        .wait(|wait| {
                            tracing::warn!(reason, error = %message, wait_ms = wait.as_millis() as u64, "listing shards failed; retrying");
                        })
                        .await;
                    if !waited {
                        return Err(self.stream_error(operation, message));
                    }
                }
                Err(error) => return Err(self.stream_error(operation, api_message(&error))),
            }
        }
    }

    /// A fresh iterator after the shard's position (or at its start: the
    /// trim horizon, or the run's start time on Kinesis); `None` when the
    /// shard has nothing more to read.
    async fn shard_iterator(
        &self,
        run: &ShardRun,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<String>, RunErrorKind> {
        let mut waits = UntilStopped::new();
        loop {
            let start = match (&run.position, self.options.from_ms) {
                (Some(seq), _) => Start::After(seq),
                (None, Some(ms)) => Start::At(ms),
                (None, None) => Start::TrimHorizon,
            };
            let error = match self
                .streams
                .shard_iterator(&self.stream_arn, &run.shard_id, start)
                .await
            {
                Ok(iterator) => return Ok(iterator),
                Err(error) => error,
            };
            match error {
                ApiError::Trimmed if run.position.is_some() => {
                    return Err(self.records_lost(&run.shard_id, run.position.as_ref(), TRIMMED));
                }
                // Reading on from anywhere else would skip records.
                ApiError::BadSequenceNumber(message) if run.position.is_some() => {
                    let detail = format!(
                        "the stream does not accept it for this shard (`{message}`), so the records \
                         after it cannot be found"
                    );
                    return Err(self.records_lost(&run.shard_id, run.position.as_ref(), &detail));
                }
                ApiError::NotFound(_) => {
                    return Err(self.stream_error(
                        "GetShardIterator",
                        format!(
                            "shard {} no longer exists before it was read to its end (the stream was disabled, \
                             or the shard was trimmed: then records after sequence number {} were lost; see \
                             `ddb-projector backfill --all`)",
                            run.shard_id,
                            run.position.as_ref().map_or("none", |s| s.as_str())
                        ),
                    ));
                }
                ApiError::Other(ErrorClass::Fatal(message) | ErrorClass::Poison(message), _) => {
                    return Err(self.stream_error("GetShardIterator", message));
                }
                error => {
                    let message = api_message(&error);
                    let stopped = waits
                        .wait_or_stop(stop, |wait| {
                            tracing::warn!(shard = %run.shard_id, error = %message, wait_ms = wait.as_millis() as u64, "GetShardIterator failed; retrying");
                        })
                        .await;
                    if stopped {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// What a failed stream request says, for people.
fn api_message(error: &ApiError) -> String {
    match error {
        ApiError::Expired => "the shard iterator expired".to_string(),
        ApiError::Trimmed => "the records were trimmed from the stream".to_string(),
        ApiError::NotFound(message)
        | ApiError::BadSequenceNumber(message)
        | ApiError::Other(_, message) => message.clone(),
    }
}

/// A shard as `DescribeStream` lists it.
#[derive(Debug, Clone)]
struct ShardInfo {
    shard_id: String,
    parent: Option<String>,
    closed: bool,
}

/// Where a shard is, carried into and out of its task.
#[derive(Debug, Clone)]
struct ShardRun {
    shard_id: String,
    parent: Option<String>,
    /// The last handled record (in memory; may be ahead of the checkpoint
    /// when only bookkeeping records followed it).
    position: Option<SequenceNumber>,
    /// The sequence number the checkpoint item holds.
    durable: Option<SequenceNumber>,
    /// Positions whose checkpoint write failed after retries: each may
    /// have landed all the same (an answer lost after the write).
    unconfirmed: Vec<SequenceNumber>,
    /// Records handled in the shard up to `position`.
    records: u64,
    /// What the runner keeps of the shard in the ledger of deliveries,
    /// once its entry was read (`None`: not yet, or no checkpoints).
    ledger: Option<Arc<std::sync::Mutex<crate::apply::ShardLedger>>>,
    /// The checkpoint is behind where the shard was read before (up to
    /// this sequence number): pages apply their items as they are now
    /// until the shard is past it and caught up.
    catching_up: Option<SequenceNumber>,
    /// The shard was closed when its task started: on Kinesis, caught up
    /// at its tip, it is read to its end (moto's server never answers a
    /// closed shard with no next iterator).
    closed: bool,
}

/// How a shard task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardExit {
    /// Closed and read to its end.
    Finished,
    /// Open, and several reads in a row returned nothing (drain only).
    CaughtUp,
    /// Asked to stop.
    Stopped,
}

type TaskResult = (ShardRun, Result<ShardExit, RunErrorKind>);
