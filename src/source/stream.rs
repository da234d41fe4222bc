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

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};
use backoff::backoff::Backoff;
use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio::sync::watch;

use super::checkpoint::{Checkpoint, CheckpointError, CheckpointStore};
use crate::apply::{
    classify, retry_describe, Applier, ApplyError, BatchOptions, ErrorClass, RecordStatus,
};
use crate::decode::decode_stream_record;
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
    /// once caught up.
    pub fn replay(selection: Option<Vec<ProjectionId>>) -> RunOptions {
        RunOptions {
            checkpoints: false,
            selection,
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
    /// ([`crate::apply::Requests::min_billed_write_units`]).
    pub min_billed_write_units: u64,
    /// Read capacity units DynamoDB reported.
    pub read_units: f64,
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
    streams: aws_sdk_dynamodbstreams::Client,
    stream_arn: String,
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
            streams,
            stream_arn: stream_arn.to_string(),
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
    }

    /// Runs until the stream is caught up (`options.drain`) or `stop`
    /// completes; then lets the current batches finish and returns what
    /// was done.
    pub async fn run(
        &self,
        options: RunOptions,
        stop: impl Future<Output = ()>,
    ) -> Result<Summary, RunError> {
        let started = Instant::now();
        let shared = Arc::new(Shared {
            applier: self.applier.clone(),
            streams: self.streams.clone(),
            stream_arn: self.stream_arn.clone(),
            checkpoints: options.checkpoints.then(|| self.checkpoints()),
            bookkeeping: Skip::Reserved.to_string(),
            batch_options: BatchOptions {
                selection: options.selection.clone(),
                ..BatchOptions::default()
            },
            options,
            summary: Mutex::new(Summary::default()),
        });
        // A consumer of the stream says so at once, not at its first batch,
        // so that `status` sees the deploy of a table without traffic.
        if let Err(message) = self.applier.take_leases().await {
            tracing::warn!(%message, "could not take the lifecycle leases; trying again at the first batch");
        }
        let result = Coordinator::new(shared.clone()).run(stop).await;
        let mut summary = shared.summary.lock().expect("summary lock").clone();
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

/// What every shard task shares.
struct Shared {
    applier: Applier,
    streams: aws_sdk_dynamodbstreams::Client,
    stream_arn: String,
    checkpoints: Option<CheckpointStore>,
    /// The skip reason of the projector's own items.
    bookkeeping: String,
    batch_options: BatchOptions,
    options: RunOptions,
    summary: Mutex<Summary>,
}

impl Shared {
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

    /// Every shard of the stream, in the order `DescribeStream` lists them.
    async fn list_shards(&self) -> Result<Vec<ShardInfo>, RunErrorKind> {
        let mut shards = Vec::new();
        let mut start: Option<String> = None;
        let mut backoff = crate::apply::retry::slow_policy(Some(Duration::from_secs(60)));
        loop {
            let result = self
                .streams
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .set_exclusive_start_shard_id(start.clone())
                .send()
                .await;
            let output = match result {
                Ok(output) => output,
                Err(error) => {
                    if error
                        .as_service_error()
                        .is_some_and(|e| e.is_resource_not_found_exception())
                    {
                        return Err(self.stream_error(
                            "DescribeStream",
                            "the stream does not exist (was it disabled, or the table deleted?)"
                                .to_string(),
                        ));
                    }
                    match classify(&error) {
                        ErrorClass::Retry(reason) => match backoff.next_backoff() {
                            Some(wait) => {
                                tracing::warn!(reason, error = %retry_describe(&error), wait_ms = wait.as_millis() as u64, "listing shards failed; retrying");
                                tokio::time::sleep(wait).await;
                                continue;
                            }
                            None => {
                                return Err(
                                    self.stream_error("DescribeStream", retry_describe(&error))
                                )
                            }
                        },
                        _ => {
                            return Err(self.stream_error("DescribeStream", retry_describe(&error)))
                        }
                    }
                }
            };
            let Some(description) = output.stream_description() else {
                return Ok(shards);
            };
            for shard in description.shards() {
                let Some(shard_id) = shard.shard_id() else {
                    continue;
                };
                shards.push(ShardInfo {
                    shard_id: shard_id.to_string(),
                    parent: shard.parent_shard_id().map(str::to_string),
                    closed: shard
                        .sequence_number_range()
                        .and_then(|r| r.ending_sequence_number())
                        .is_some(),
                });
            }
            match description.last_evaluated_shard_id() {
                Some(last) if !last.is_empty() => start = Some(last.to_string()),
                _ => return Ok(shards),
            }
        }
    }

    /// A fresh iterator after the shard's position (or at its start);
    /// `None` when the shard has nothing more to read.
    async fn shard_iterator(
        &self,
        run: &ShardRun,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<String>, RunErrorKind> {
        let mut backoff = crate::apply::retry::slow_policy(None);
        loop {
            let mut request = self
                .streams
                .get_shard_iterator()
                .stream_arn(&self.stream_arn)
                .shard_id(&run.shard_id);
            request = match &run.position {
                Some(seq) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .sequence_number(seq.as_str()),
                None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let error = match request.send().await {
                Ok(output) => return Ok(output.shard_iterator().map(str::to_string)),
                Err(error) => error,
            };
            let service = error.as_service_error();
            if service.is_some_and(|e| e.is_trimmed_data_access_exception())
                && run.position.is_some()
            {
                return Err(self.records_lost(&run.shard_id, run.position.as_ref(), TRIMMED));
            }
            // DynamoDB refuses a sequence number the shard does not hold
            // (DynamoDB Local says so for any it never had, too): reading on
            // from anywhere else would skip records.
            if let (Some(seq), Some(service)) = (&run.position, service) {
                let message = service.meta().message().unwrap_or_default();
                if service.meta().code() == Some("ValidationException")
                    && message.contains("SequenceNumber")
                {
                    let detail = format!(
                        "DynamoDB Streams does not accept it for this shard (`{message}`), so the records \
                         after it cannot be found"
                    );
                    return Err(self.records_lost(&run.shard_id, Some(seq), &detail));
                }
            }
            if service.is_some_and(|e| e.is_resource_not_found_exception()) {
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
            match classify(&error) {
                ErrorClass::Fatal(message) | ErrorClass::Poison(message) => {
                    return Err(self.stream_error("GetShardIterator", message));
                }
                _ => {
                    let wait = backoff
                        .next_backoff()
                        .unwrap_or(crate::apply::retry::SLOW_MAX_WAIT);
                    tracing::warn!(shard = %run.shard_id, error = %retry_describe(&error), wait_ms = wait.as_millis() as u64, "GetShardIterator failed; retrying");
                    if sleep_or_stop(stop, wait).await {
                        return Ok(None);
                    }
                }
            }
        }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardState {
    /// Not started: waiting for its parent, or for a slot.
    Waiting,
    /// A task is reading it.
    Running,
    /// Open and caught up (drain); started again if it closes.
    CaughtUp,
    /// Read to its end.
    Finished,
}

struct Entry {
    parent: Option<String>,
    closed: bool,
    listed: bool,
    state: ShardState,
    run: Option<ShardRun>,
}

type TaskResult = (ShardRun, Result<ShardExit, RunErrorKind>);

struct Coordinator {
    shared: Arc<Shared>,
    shards: BTreeMap<String, Entry>,
    /// The shard tasks, polled by the coordinator itself: the applier's
    /// batch future is not `Send`, so they cannot be spawned.
    tasks: FuturesUnordered<LocalBoxFuture<'static, TaskResult>>,
    stop_tx: watch::Sender<bool>,
}

impl Coordinator {
    fn new(shared: Arc<Shared>) -> Coordinator {
        let (stop_tx, _) = watch::channel(false);
        Coordinator {
            shared,
            shards: BTreeMap::new(),
            tasks: FuturesUnordered::new(),
            stop_tx,
        }
    }

    async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), RunErrorKind> {
        tokio::pin!(stop);
        let mut stopping = false;
        let mut failure: Option<RunErrorKind> = None;
        // Whether anything changed since the shards were last listed.
        let mut dirty = true;
        let mut next_list = tokio::time::Instant::now();
        loop {
            if !stopping && (dirty || tokio::time::Instant::now() >= next_list) {
                dirty = false;
                next_list = tokio::time::Instant::now() + self.shared.options.relist_interval;
                let listed = tokio::select! {
                    listed = self.relist() => Some(listed),
                    () = &mut stop => None,
                };
                match listed {
                    Some(Ok(())) => self.start_ready(),
                    Some(Err(error)) => {
                        failure = Some(error);
                        stopping = true;
                        self.stop_tx.send_replace(true);
                    }
                    None => {
                        stopping = true;
                        self.stop_tx.send_replace(true);
                    }
                }
            }
            if self.tasks.is_empty() {
                if stopping {
                    break;
                }
                if self.shared.options.drain && !dirty {
                    let waiting: Vec<&String> = self
                        .shards
                        .iter()
                        .filter(|(_, e)| e.listed && e.state == ShardState::Waiting)
                        .map(|(id, _)| id)
                        .collect();
                    if !waiting.is_empty() {
                        tracing::warn!(shards = ?waiting, "shards wait for parents that are neither finished nor readable");
                    }
                    tracing::info!(shards = self.shards.len(), "caught up");
                    break;
                }
            }
            tokio::select! {
                () = &mut stop, if !stopping => {
                    tracing::info!("stopping: finishing the current batches");
                    stopping = true;
                    self.stop_tx.send_replace(true);
                }
                Some((run, result)) = self.tasks.next(), if !self.tasks.is_empty() => {
                    dirty = true;
                    let shard_id = run.shard_id.clone();
                    let entry = self.shards.get_mut(&shard_id).expect("a task's shard is known");
                    entry.run = Some(run);
                    match result {
                        Ok(ShardExit::Finished) => {
                            entry.state = ShardState::Finished;
                            self.shared.summary.lock().expect("summary lock").shards_finished += 1;
                            tracing::info!(shard = %shard_id, "shard finished");
                        }
                        Ok(ShardExit::CaughtUp) => entry.state = ShardState::CaughtUp,
                        Ok(ShardExit::Stopped) => entry.state = ShardState::Waiting,
                        Err(error) => {
                            entry.state = ShardState::Waiting;
                            tracing::error!(shard = %shard_id, %error, "shard stopped the runner");
                            failure.get_or_insert(error);
                            stopping = true;
                            self.stop_tx.send_replace(true);
                        }
                    }
                }
                () = tokio::time::sleep_until(next_list), if !stopping && !self.shared.options.drain => {}
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Lists the shards and learns the new ones (with their checkpoints).
    async fn relist(&mut self) -> Result<(), RunErrorKind> {
        let listed = self.shared.list_shards().await?;
        let listed_ids: std::collections::HashSet<&str> =
            listed.iter().map(|s| s.shard_id.as_str()).collect();
        for info in merge_listing(&mut self.shards, &listed) {
            let mut run = ShardRun {
                shard_id: info.shard_id.clone(),
                parent: info.parent.clone(),
                position: None,
                durable: None,
                unconfirmed: Vec::new(),
                records: 0,
            };
            let mut state = ShardState::Waiting;
            if let Some(store) = &self.shared.checkpoints {
                if let Some(checkpoint) = store.load(&info.shard_id).await? {
                    run.position = checkpoint.sequence_number.clone();
                    run.durable = checkpoint.sequence_number;
                    run.records = checkpoint.records;
                    if checkpoint.finished {
                        state = ShardState::Finished;
                    }
                }
                // A parent trimmed away before it was read to its end: its
                // remaining records are gone.
                if let Some(parent) = &info.parent {
                    if !listed_ids.contains(parent.as_str()) && !self.shards.contains_key(parent) {
                        if let Some(checkpoint) = store.load(parent).await? {
                            if !checkpoint.finished {
                                return Err(self.shared.records_lost(
                                    parent,
                                    checkpoint.sequence_number.as_ref(),
                                    "the shard was trimmed away before it was read to its end",
                                ));
                            }
                        }
                    }
                }
            }
            tracing::debug!(shard = %info.shard_id, parent = ?info.parent, closed = info.closed, position = ?run.position, ?state, "shard found");
            self.shards.insert(
                info.shard_id.clone(),
                Entry {
                    parent: info.parent.clone(),
                    closed: info.closed,
                    listed: true,
                    state,
                    run: Some(run),
                },
            );
        }
        // Finished shards trimmed away need no memory; their children
        // treat an unknown parent as done.
        self.shards
            .retain(|_, entry| entry.listed || entry.state != ShardState::Finished);
        // A known shard that disappeared before it was read to its end.
        if self.shared.checkpoints.is_some() {
            for (shard_id, entry) in &self.shards {
                if !entry.listed && entry.state == ShardState::Waiting {
                    let position = entry.run.as_ref().and_then(|r| r.position.as_ref());
                    return Err(self.shared.records_lost(
                        shard_id,
                        position,
                        "the shard was trimmed away before it was read to its end",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Starts every waiting shard whose parent is done.
    fn start_ready(&mut self) {
        let ready = ready_shards(&self.shards);
        for shard_id in ready {
            let entry = self.shards.get_mut(&shard_id).expect("listed above");
            let run = entry.run.take().expect("a waiting shard has its state");
            entry.state = ShardState::Running;
            tracing::info!(shard = %shard_id, parent = ?entry.parent, closed = entry.closed, position = ?run.position, "reading shard");
            let shared = self.shared.clone();
            let stop = self.stop_tx.subscribe();
            self.tasks.push(Box::pin(walk_shard(shared, run, stop)));
        }
    }
}

/// Marks what a listing says about known shards (listed or not, closed or
/// not; a caught-up shard that closed is read again) and returns the listed
/// shards that are new.
fn merge_listing(shards: &mut BTreeMap<String, Entry>, listed: &[ShardInfo]) -> Vec<ShardInfo> {
    for entry in shards.values_mut() {
        entry.listed = false;
    }
    let mut new = Vec::new();
    for info in listed {
        match shards.get_mut(&info.shard_id) {
            Some(entry) => {
                entry.listed = true;
                entry.closed = info.closed;
                if entry.state == ShardState::CaughtUp && info.closed {
                    // It closed after it caught up: read the rest.
                    entry.state = ShardState::Waiting;
                }
            }
            None => new.push(info.clone()),
        }
    }
    new
}

/// The waiting, listed shards whose parent is finished or unknown (trimmed
/// before this run, or forgotten once finished and trimmed).
fn ready_shards(shards: &BTreeMap<String, Entry>) -> Vec<String> {
    shards
        .iter()
        .filter(|(_, entry)| entry.state == ShardState::Waiting && entry.listed)
        .filter(|(_, entry)| match &entry.parent {
            None => true,
            Some(parent) => shards
                .get(parent)
                .is_none_or(|parent| parent.state == ShardState::Finished),
        })
        .map(|(id, _)| id.clone())
        .collect()
}

async fn walk_shard(
    shared: Arc<Shared>,
    mut run: ShardRun,
    mut stop: watch::Receiver<bool>,
) -> TaskResult {
    let result = walk(&shared, &mut run, &mut stop).await;
    metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone()).set(0.0);
    (run, result)
}

/// Reads one shard in order until it ends, catches up (drain) or is stopped.
async fn walk(
    shared: &Shared,
    run: &mut ShardRun,
    stop: &mut watch::Receiver<bool>,
) -> Result<ShardExit, RunErrorKind> {
    let options = &shared.options;
    let mut iterator: Option<String> = None;
    let mut empty_pages = 0u32;
    let mut failures = crate::apply::retry::slow_policy(None);
    let mut read_errors = crate::apply::retry::slow_policy(None);
    loop {
        if *stop.borrow() {
            return Ok(ShardExit::Stopped);
        }
        let current = match iterator.take() {
            Some(current) => current,
            None => match shared.shard_iterator(run, stop).await? {
                Some(fresh) => fresh,
                None if *stop.borrow() => return Ok(ShardExit::Stopped),
                None => {
                    finish(shared, run).await?;
                    return Ok(ShardExit::Finished);
                }
            },
        };
        let page = match shared
            .streams
            .get_records()
            .shard_iterator(&current)
            .limit(options.batch_limit.clamp(1, MAX_BATCH))
            .send()
            .await
        {
            Ok(page) => {
                read_errors.reset();
                page
            }
            Err(error) => {
                let service = error.as_service_error();
                if service.is_some_and(|e| e.is_expired_iterator_exception()) {
                    tracing::debug!(shard = %run.shard_id, "iterator expired; renewing from the checkpoint");
                    continue;
                }
                if service.is_some_and(|e| e.is_trimmed_data_access_exception()) {
                    if run.position.is_some() {
                        return Err(shared.records_lost(
                            &run.shard_id,
                            run.position.as_ref(),
                            TRIMMED,
                        ));
                    }
                    // The trim horizon moved while we started from it: start
                    // from where it is now.
                    let wait = read_errors
                        .next_backoff()
                        .unwrap_or(crate::apply::retry::SLOW_MAX_WAIT);
                    if sleep_or_stop(stop, wait).await {
                        return Ok(ShardExit::Stopped);
                    }
                    continue;
                }
                if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                    // Let GetShardIterator tell whether the shard is gone.
                    continue;
                }
                match classify(&error) {
                    ErrorClass::Fatal(message) => {
                        return Err(shared.stream_error("GetRecords", message))
                    }
                    _ => {
                        let wait = read_errors
                            .next_backoff()
                            .unwrap_or(crate::apply::retry::SLOW_MAX_WAIT);
                        tracing::warn!(shard = %run.shard_id, error = %retry_describe(&error), wait_ms = wait.as_millis() as u64, "GetRecords failed; retrying");
                        if sleep_or_stop(stop, wait).await {
                            return Ok(ShardExit::Stopped);
                        }
                        // The iterator is still good unless it expired meanwhile.
                        iterator = Some(current);
                        continue;
                    }
                }
            }
        };
        let next = page.next_shard_iterator().map(str::to_string);
        let records = page.records();
        if records.is_empty() {
            let Some(next) = next else {
                finish(shared, run).await?;
                return Ok(ShardExit::Finished);
            };
            empty_pages += 1;
            metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone()).set(0.0);
            if options.drain && empty_pages >= options.empty_polls.max(1) {
                tracing::debug!(shard = %run.shard_id, empty_pages, "shard caught up");
                return Ok(ShardExit::CaughtUp);
            }
            if sleep_or_stop(stop, options.poll_interval).await {
                return Ok(ShardExit::Stopped);
            }
            iterator = Some(next);
            continue;
        }
        empty_pages = 0;
        let handled_all = apply_page(shared, run, records, next.is_none()).await?;
        if !handled_all {
            let wait = failures
                .next_backoff()
                .unwrap_or(crate::apply::retry::SLOW_MAX_WAIT);
            shared.summary.lock().expect("summary lock").rereads += 1;
            metrics::counter!("projector_stream_rereads_total").increment(1);
            if sleep_or_stop(stop, wait).await {
                return Ok(ShardExit::Stopped);
            }
            // Read again from the checkpoint with a fresh iterator.
            continue;
        }
        failures.reset();
        match next {
            Some(next) => iterator = Some(next),
            None => {
                tracing::info!(shard = %run.shard_id, records = run.records, "shard read to its end");
                return Ok(ShardExit::Finished);
            }
        }
    }
}

/// Applies one page; moves the position past its handled prefix and
/// checkpoints. Returns whether every record was handled.
async fn apply_page(
    shared: &Shared,
    run: &mut ShardRun,
    records: &[Record],
    last_page: bool,
) -> Result<bool, RunErrorKind> {
    let batch: Vec<_> = records
        .iter()
        .enumerate()
        .map(|(index, record)| decode_stream_record(index, &run.shard_id, record))
        .collect();
    let applying = Instant::now();
    let outcome = shared
        .applier
        .apply_batch(&batch, &shared.batch_options)
        .await?;
    let apply_ms = applying.elapsed().as_millis() as u64;
    let n = records.len();
    let handled = outcome.first_failure().unwrap_or(n);
    let first_seq = sequence_number(&records[0]);
    let statuses = &outcome.statuses[..handled];
    if handled > 0 {
        if let Some(seq) = records[..handled].iter().rev().find_map(sequence_number) {
            run.position = Some(seq);
        }
        run.records += handled as u64;
    }
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let lag_ms = batch[..handled]
        .iter()
        .rev()
        .find_map(|r| r.as_ref().ok().and_then(|r| r.approximate_creation_ms))
        .map(|created| (now_ms - created).max(0));
    let bookkeeping_only = statuses
        .iter()
        .all(|s| matches!(s, RecordStatus::Skipped(reason) if *reason == shared.bookkeeping));
    let finished = handled == n && last_page;
    {
        let mut summary = shared.summary.lock().expect("summary lock");
        let stats = &outcome.stats;
        summary.records += handled as u64;
        summary.effects += stats.effects as u64;
        summary.writes += stats.writes as u64;
        summary.write_units += stats.write_units;
        summary.min_billed_write_units += stats.requests.min_billed_write_units();
        summary.read_units += stats.read_units;
        summary.retries += stats.retries;
        summary.batches += 1;
        summary.dead_letters += statuses
            .iter()
            .filter(|s| matches!(s, RecordStatus::DeadLettered(_)))
            .count() as u64;
        summary.skipped += statuses
            .iter()
            .filter(|s| matches!(s, RecordStatus::Skipped(_)))
            .count() as u64;
        if let Some(lag) = lag_ms {
            summary.last_lag_ms = Some(lag);
            summary.max_lag_ms = Some(summary.max_lag_ms.map_or(lag, |max| max.max(lag)));
        }
    }
    metrics::counter!("projector_stream_records_total").increment(handled as u64);
    metrics::counter!("projector_stream_batches_total").increment(1);
    if let Some(lag) = lag_ms {
        metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone())
            .set(lag as f64);
    }
    tracing::debug!(
        shard = %run.shard_id,
        first_sequence_number = first_seq.as_ref().map_or("", |s| s.as_str()),
        last_sequence_number = run.position.as_ref().map_or("", |s| s.as_str()),
        records = n,
        handled,
        effects = outcome.stats.effects,
        writes = outcome.stats.writes,
        write_units = outcome.stats.write_units,
        dead_letters = outcome.stats.dead_letters,
        apply_ms,
        "batch applied"
    );
    if handled < n {
        let reason = match &outcome.statuses[handled] {
            RecordStatus::Failed(reason) => reason.as_str(),
            _ => "",
        };
        tracing::warn!(
            shard = %run.shard_id,
            sequence_number = sequence_number(&records[handled]).as_ref().map_or("", |s| s.as_str()),
            failed = n - handled,
            %reason,
            "records failed; reading again from the checkpoint after a pause"
        );
    }
    // The runner's own checkpoint writes come back through the stream; a
    // batch of nothing else must not write another one, or it never ends.
    if (handled > 0 && !bookkeeping_only) || finished {
        save(shared, run, finished).await?;
    }
    Ok(handled == n)
}

/// Marks a shard finished in its checkpoint.
async fn finish(shared: &Shared, run: &mut ShardRun) -> Result<(), RunErrorKind> {
    tracing::info!(shard = %run.shard_id, records = run.records, "shard read to its end");
    save(shared, run, true).await
}

/// Writes the shard's checkpoint at its position. A write that keeps
/// failing transiently is left for the next batch: the position is only
/// ever behind, never ahead.
async fn save(shared: &Shared, run: &mut ShardRun, finished: bool) -> Result<(), RunErrorKind> {
    let Some(store) = &shared.checkpoints else {
        return Ok(());
    };
    let checkpoint = Checkpoint {
        shard_id: run.shard_id.clone(),
        parent_shard_id: run.parent.clone(),
        sequence_number: run.position.clone(),
        finished,
        records: run.records,
        updated_at: String::new(),
    };
    match store
        .save(run.durable.as_ref(), &run.unconfirmed, &checkpoint)
        .await
    {
        Ok(()) => {
            run.durable = run.position.clone();
            run.unconfirmed.clear();
            shared.summary.lock().expect("summary lock").checkpoints += 1;
            metrics::counter!("projector_checkpoints_total").increment(1);
            tracing::debug!(shard = %run.shard_id, sequence_number = run.position.as_ref().map_or("", |s| s.as_str()), finished, "checkpoint written");
            Ok(())
        }
        Err(CheckpointError::Transient { operation, message }) => {
            tracing::warn!(shard = %run.shard_id, operation, %message, "checkpoint not written; trying again after the next batch");
            if let Some(position) = &run.position {
                run.unconfirmed.push(position.clone());
            }
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

fn sequence_number(record: &Record) -> Option<SequenceNumber> {
    record
        .dynamodb()
        .and_then(|s| s.sequence_number())
        .filter(|s| !s.is_empty())
        .map(|s| SequenceNumber(s.to_string()))
}

/// Sleeps unless asked to stop; returns whether it was.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        changed = stop.changed() => changed.is_err() || *stop.borrow(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, parent: Option<&str>, closed: bool) -> ShardInfo {
        ShardInfo {
            shard_id: id.to_string(),
            parent: parent.map(str::to_string),
            closed,
        }
    }

    fn learn(shards: &mut BTreeMap<String, Entry>, listed: &[ShardInfo]) {
        let new = merge_listing(shards, listed);
        insert(shards, &new);
    }

    fn insert(shards: &mut BTreeMap<String, Entry>, new: &[ShardInfo]) {
        for new in new {
            shards.insert(
                new.shard_id.clone(),
                Entry {
                    parent: new.parent.clone(),
                    closed: new.closed,
                    listed: true,
                    state: ShardState::Waiting,
                    run: None,
                },
            );
        }
    }

    #[test]
    fn children_start_only_after_their_parent_is_finished() {
        let mut shards = BTreeMap::new();
        learn(
            &mut shards,
            &[
                info("b-child", Some("a-parent"), false),
                info("a-parent", None, true),
                info("c-grandchild", Some("b-child"), false),
            ],
        );
        assert_eq!(ready_shards(&shards), ["a-parent"]);
        shards.get_mut("a-parent").unwrap().state = ShardState::Running;
        assert!(ready_shards(&shards).is_empty());
        shards.get_mut("a-parent").unwrap().state = ShardState::Finished;
        assert_eq!(ready_shards(&shards), ["b-child"]);
    }

    #[test]
    fn a_trimmed_parent_does_not_block_its_child() {
        let mut shards = BTreeMap::new();
        learn(&mut shards, &[info("child", Some("gone"), false)]);
        assert_eq!(ready_shards(&shards), ["child"]);
    }

    #[test]
    fn a_caught_up_shard_that_closes_is_read_again_and_new_shards_are_found() {
        let mut shards = BTreeMap::new();
        learn(&mut shards, &[info("open", None, false)]);
        shards.get_mut("open").unwrap().state = ShardState::CaughtUp;
        assert!(ready_shards(&shards).is_empty());
        let new = merge_listing(
            &mut shards,
            &[info("open", None, true), info("next", Some("open"), false)],
        );
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].shard_id, "next");
        assert_eq!(shards["open"].state, ShardState::Waiting);
        assert!(shards["open"].closed);
        insert(&mut shards, &new);
        assert_eq!(ready_shards(&shards), ["open"]);
    }

    #[test]
    fn shards_no_longer_listed_are_marked() {
        let mut shards = BTreeMap::new();
        learn(
            &mut shards,
            &[info("a", None, true), info("b", Some("a"), false)],
        );
        let new = merge_listing(&mut shards, &[info("b", Some("a"), false)]);
        assert!(new.is_empty());
        assert!(!shards["a"].listed && shards["b"].listed);
    }
}
