//! `ddb-projector recover`: the batches Lambda gave up on.
//!
//! After `MaximumRetryAttempts` or `MaximumRecordAgeInSeconds`, Lambda moves
//! past a batch and sends its on-failure destination only where the batch
//! was: the stream, the shard, the first and last sequence numbers
//! (`DDBStreamBatchInfo`). Those records are never projected unless someone
//! reads them again. Recovery reads each failure message from the queue,
//! reads the named range from the stream while DynamoDB Streams still keeps
//! it (24 hours), and derives the current state of every item the range
//! touched, the way a backfill derives a scanned item: read consistently,
//! every write guarded by the state read, through [`Applier::apply_batch`]
//! (holds, dead letters and all). Only then is the message deleted.
//!
//! The range's own images are never applied: Lambda went on past it, so
//! newer records of the same items may have applied already (and ranges
//! come back in any order, some twice), and an old image applied after them
//! would bring back an edge the source no longer has or count a follow
//! twice. The range only says which items changed.
//!
//! A range that is gone (trimmed, or its shard with it) cannot be read: the
//! message does not carry the records' keys, so what they touched is
//! unknown. Such messages are kept, and the summary says that a guarded
//! backfill (or `audit --repair`) is needed; with
//! [`RecoverOptions::backfill_trimmed`], recovery runs that backfill itself,
//! then receives those messages again and deletes them.
//!
//! **Architecture Invariant:** a message is deleted only after every item
//! its range touched is derived from its current state (or its records are
//! dead-lettered with the full record), or after a backfill over the whole
//! table that started after the message was read; anything else leaves it
//! in the queue, visible again at the end of the run. Messages are received
//! one at a time, and a message's visibility is renewed while its range is
//! worked on, so its receipt handle is valid when it is deleted. Checked by
//! `dynamo::recover::recover_applies_the_batches_lambda_gave_up_on_and_deletes_their_messages`,
//! `ranges_the_stream_no_longer_holds_are_kept_until_a_backfill_covers_them`
//! and `a_range_worked_on_past_the_visibility_timeout_stays_hidden_until_deleted`
//! (a range held three visibility timeouts by throttled writes, while
//! another receiver polls the queue and never gets its message).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use aws_sdk_dynamodbstreams::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};
use serde::Serialize;

use crate::apply::{Applier, ApplyError, BatchOptions, RecordStatus};
use crate::decode::decode_stream_record;
use crate::dynamo::retry::{
    describe as retry_describe, retry_request_unless, Retrier, STREAM_REQUEST_TIME,
};
use crate::record::SequenceNumber;

/// Where a failed batch was, as Lambda's failure message says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedBatch {
    /// The stream's ARN.
    pub stream_arn: String,
    /// The shard.
    pub shard_id: String,
    /// The batch's first record.
    pub start: SequenceNumber,
    /// The batch's last record.
    pub end: SequenceNumber,
    /// Records in the batch, when given.
    pub batch_size: Option<u64>,
    /// Why Lambda gave up (`RetryAttemptsExhausted`, `RecordAgeExceeded`, ...).
    pub condition: Option<String>,
    /// When the first record arrived, as Lambda wrote it.
    pub first_arrival: Option<String>,
}

impl FailedBatch {
    /// The table the stream belongs to.
    pub fn table(&self) -> Option<&str> {
        crate::dynamo::arn::table_from_stream_arn(&self.stream_arn)
    }
}

impl fmt::Display for FailedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shard {} records {}..={}",
            self.shard_id, self.start, self.end
        )?;
        if let Some(size) = self.batch_size {
            write!(f, " ({size} records)")?;
        }
        Ok(())
    }
}

/// Why a queue message is not a failure message this command can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The body is not JSON.
    #[error("the body is not JSON ({0})")]
    NotJson(String),
    /// JSON without `DDBStreamBatchInfo`.
    #[error("the body has no `DDBStreamBatchInfo`: it is not the failure record of a DynamoDB stream event source mapping (a Kinesis or SQS source writes other fields)")]
    NoBatchInfo,
    /// A field is missing or not a string.
    #[error("`DDBStreamBatchInfo.{0}` is missing or not a string")]
    Field(&'static str),
    /// The range is backwards.
    #[error("`startSequenceNumber` {start} is after `endSequenceNumber` {end}")]
    Backwards {
        /// The first record.
        start: String,
        /// The last record.
        end: String,
    },
}

/// Reads a failure message's body: the JSON Lambda writes to an SQS
/// on-failure destination, or the same wrapped in an SNS notification (an
/// SNS topic subscribed by the queue without raw delivery).
pub fn parse_failure(body: &str) -> Result<FailedBatch, MessageError> {
    let mut value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| MessageError::NotJson(e.to_string()))?;
    if value.get("DDBStreamBatchInfo").is_none() && value.get("Type").is_some() {
        if let Some(inner) = value.get("Message").and_then(|m| m.as_str()) {
            value =
                serde_json::from_str(inner).map_err(|e| MessageError::NotJson(e.to_string()))?;
        }
    }
    let info = value
        .get("DDBStreamBatchInfo")
        .ok_or(MessageError::NoBatchInfo)?;
    let text = |name: &'static str| {
        info.get(name)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or(MessageError::Field(name))
    };
    let start = SequenceNumber(text("startSequenceNumber")?);
    let end = SequenceNumber(text("endSequenceNumber")?);
    if start > end {
        return Err(MessageError::Backwards {
            start: start.0,
            end: end.0,
        });
    }
    Ok(FailedBatch {
        stream_arn: text("streamArn")?,
        shard_id: text("shardId")?,
        start,
        end,
        batch_size: info.get("batchSize").and_then(|v| v.as_u64()),
        condition: value
            .pointer("/requestContext/condition")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        first_arrival: info
            .get("approximateArrivalOfFirstRecord")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    })
}

/// How recovery runs.
#[derive(Debug, Clone)]
pub struct RecoverOptions {
    /// For ranges the stream no longer holds: run a guarded backfill of the
    /// whole table, then delete their messages (otherwise they are kept).
    pub backfill_trimmed: bool,
    /// How long a received message stays invisible to other readers while
    /// its range is applied.
    pub visibility_timeout: Duration,
    /// How long the records of one range may keep failing (throttling, an
    /// outage) before its message is left for a later run.
    pub max_apply_time: Duration,
    /// Show a progress bar (when stderr is a terminal) or log lines.
    pub progress: bool,
    /// Read and report, write and delete nothing.
    pub dry_run: bool,
}

impl Default for RecoverOptions {
    fn default() -> RecoverOptions {
        RecoverOptions {
            backfill_trimmed: false,
            visibility_timeout: Duration::from_secs(300),
            max_apply_time: Duration::from_secs(120),
            progress: true,
            dry_run: false,
        }
    }
}

/// What happened to one message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Its range was read and handled; the message is deleted.
    Recovered {
        /// Records in the range.
        records: u64,
        /// Items they touched, each derived once from its current state.
        items: u64,
        /// Of them, dead-lettered.
        dead_lettered: u64,
        /// Of them, skipped (nothing applies).
        skipped: u64,
    },
    /// The stream no longer holds the range; kept unless a backfill ran.
    Trimmed {
        /// What DynamoDB Streams said.
        detail: String,
        /// Whether the backfill ran and the message was deleted.
        backfilled: bool,
    },
    /// Not a usable failure message, or not this table's; kept.
    Refused {
        /// Why.
        reason: String,
    },
    /// Its records kept failing; kept for a later run.
    Failed {
        /// The last failure.
        reason: String,
    },
    /// A dry run read the range; nothing written or deleted.
    Readable {
        /// Records in the range.
        records: u64,
    },
}

/// One message and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageReport {
    /// The SQS message id.
    pub message_id: String,
    /// The batch it names, when it could be read.
    pub batch: Option<FailedBatch>,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What a recovery did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoverSummary {
    /// Every message received, in the order received.
    pub messages: Vec<MessageReport>,
    /// Records applied again (all ranges).
    pub records: u64,
    /// Whether a backfill ran for trimmed ranges.
    pub backfilled: bool,
    /// Messages the queue still showed visible when the run stopped
    /// (approximate; they were never received).
    pub unread: u64,
    /// How long it took.
    pub elapsed_ms: u64,
}

impl RecoverSummary {
    /// Messages left in the queue (not deleted), the unread included.
    pub fn kept(&self) -> usize {
        self.unread as usize
            + self
                .messages
                .iter()
                .filter(|m| match &m.outcome {
                    Outcome::Recovered { .. } => false,
                    Outcome::Trimmed { backfilled, .. } => !backfilled,
                    _ => true,
                })
                .count()
    }

    /// Whether some messages name ranges the stream no longer holds and
    /// no backfill covered: what they touched is unknown.
    pub fn trimmed_left(&self) -> bool {
        self.messages.iter().any(|m| {
            matches!(
                m.outcome,
                Outcome::Trimmed {
                    backfilled: false,
                    ..
                }
            )
        })
    }

    fn count(&self, pick: fn(&Outcome) -> bool) -> usize {
        self.messages.iter().filter(|m| pick(&m.outcome)).count()
    }
}

/// `recover`: the batches Lambda gave up on, named by the messages of
/// the on-failure queue at `queue_url`, applied again on `c`'s table.
pub async fn recover(
    c: &crate::control::Connection,
    queue_url: &str,
    options: &RecoverOptions,
) -> anyhow::Result<RecoverSummary> {
    let recovery = Recovery::new(
        c.applier(),
        crate::dynamo::client::streams(&c.config),
        aws_sdk_sqs::Client::new(&c.config),
        queue_url,
    );
    Ok(recovery.run(options).await?)
}

impl fmt::Display for RecoverSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.messages {
            let batch = m
                .batch
                .as_ref()
                .map_or("-".to_string(), ToString::to_string);
            let what = match &m.outcome {
                Outcome::Recovered {
                    records,
                    items,
                    dead_lettered,
                    skipped,
                } => format!(
                    "recovered: {records} records, {items} items derived from their current state ({dead_lettered} dead-lettered, {skipped} skipped); message deleted"
                ),
                Outcome::Trimmed { detail, backfilled: true } => {
                    format!("trimmed ({detail}); the backfill covered it; message deleted")
                }
                Outcome::Trimmed { detail, backfilled: false } => {
                    format!("trimmed ({detail}); message kept")
                }
                Outcome::Refused { reason } => format!("refused: {reason}; message kept"),
                Outcome::Failed { reason } => format!("failed: {reason}; message kept"),
                Outcome::Readable { records } => {
                    format!("readable: {records} records (dry run: nothing written or deleted)")
                }
            };
            writeln!(f, "  message {}  {batch}: {what}", m.message_id)?;
        }
        let recovered = self.count(|o| matches!(o, Outcome::Recovered { .. }));
        let trimmed = self.count(|o| matches!(o, Outcome::Trimmed { .. }));
        write!(
            f,
            "  {} messages: {recovered} recovered ({} records), {trimmed} trimmed, {} kept in the queue; {:.1} s",
            self.messages.len(),
            self.records,
            self.kept(),
            self.elapsed_ms as f64 / 1000.0
        )?;
        if self.backfilled {
            write!(
                f,
                "; a guarded backfill of the whole table ran for the trimmed ranges"
            )?;
        }
        Ok(())
    }
}

/// Why recovery could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The queue cannot be read or its messages deleted.
    #[error("{operation} on queue {queue_url} failed: {message}")]
    Queue {
        /// The SQS operation.
        operation: &'static str,
        /// The queue.
        queue_url: String,
        /// What SQS or the SDK said.
        message: String,
    },
    /// The applier cannot write (no table, no access...).
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

/// What reading a range found.
enum Range {
    /// Every record of the range, in stream order.
    Records(Vec<Record>),
    /// The stream no longer holds (all of) it.
    Gone(String),
    /// The reading stopped before the range's last record.
    Incomplete(String),
}

/// Reads failure messages from a queue and applies their ranges again.
#[derive(Debug, Clone)]
pub struct Recovery {
    applier: Applier,
    streams: aws_sdk_dynamodbstreams::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

impl Recovery {
    /// Recovery of the failure messages in `queue_url` for the applier's table.
    pub fn new(
        applier: Applier,
        streams: aws_sdk_dynamodbstreams::Client,
        sqs: aws_sdk_sqs::Client,
        queue_url: &str,
    ) -> Recovery {
        Recovery {
            applier,
            streams,
            sqs,
            queue_url: queue_url.to_string(),
        }
    }

    fn queue_error(
        &self,
        operation: &'static str,
        error: impl std::error::Error + 'static,
    ) -> RecoverError {
        RecoverError::Queue {
            operation,
            queue_url: self.queue_url.clone(),
            message: retry_describe(&error),
        }
    }

    /// Reads the queue until it has nothing visible left, recovering each
    /// message; see the module's documentation.
    pub async fn run(&self, options: &RecoverOptions) -> Result<RecoverSummary, RecoverError> {
        let started = Instant::now();
        let mut summary = RecoverSummary::default();
        let bar = progress_bar(options.progress, self.approximate_messages().await);
        let visibility = options.visibility_timeout.as_secs().clamp(1, 43_200) as i32;
        // Messages kept, by id: their newest receipt handle, so that they
        // can be made visible again at the end (for the next run, after a
        // fix) and, for trimmed ranges, found again after the backfill.
        let mut kept: HashMap<String, String> = HashMap::new();
        let mut trimmed: HashSet<String> = HashSet::new();
        let mut seen: HashSet<String> = HashSet::new();
        // Receives that brought only messages already handled in this run.
        let mut idle = 0;
        while idle < 3 {
            let Some(message) = self.receive_one(visibility).await? else {
                break;
            };
            let id = message.message_id().unwrap_or_default().to_string();
            let receipt = message.receipt_handle().unwrap_or_default().to_string();
            if !seen.insert(id.clone()) {
                // A kept message back after its visibility timeout.
                if let Some(handle) = kept.get_mut(&id) {
                    *handle = receipt;
                }
                idle += 1;
                continue;
            }
            idle = 0;
            let body = message.body().unwrap_or_default();
            // The message stays invisible while its range is applied.
            let (batch, outcome) = self
                .with_heartbeat(&receipt, visibility, self.handle(body, options))
                .await?;
            let label = match &outcome {
                Outcome::Recovered { .. } => "recovered",
                Outcome::Trimmed { .. } => "trimmed",
                Outcome::Refused { .. } => "refused",
                Outcome::Failed { .. } => "failed",
                Outcome::Readable { .. } => "readable",
            };
            metrics::counter!("projector_recover_messages_total", "outcome" => label).increment(1);
            let described = batch.as_ref().map(ToString::to_string);
            match &outcome {
                Outcome::Recovered { records, .. } => {
                    summary.records += records;
                    self.delete(&receipt).await?;
                    tracing::info!(message = %id, batch = ?described, ?outcome, "range recovered; message deleted");
                }
                Outcome::Trimmed { detail, .. } => {
                    tracing::warn!(message = %id, batch = ?described, detail, "the stream no longer holds this range");
                    trimmed.insert(id.clone());
                    kept.insert(id.clone(), receipt);
                }
                Outcome::Readable { .. } => {
                    tracing::info!(message = %id, batch = ?described, ?outcome, "dry run: range readable");
                    kept.insert(id.clone(), receipt);
                }
                Outcome::Refused { reason } | Outcome::Failed { reason } => {
                    tracing::error!(message = %id, batch = ?described, reason, "message kept in the queue");
                    kept.insert(id.clone(), receipt);
                }
            }
            summary.messages.push(MessageReport {
                message_id: id,
                batch,
                outcome,
            });
            bar.inc(1);
        }
        bar.finish_and_clear();
        // What is still visible now was never received: the loop stopped on
        // answers of only messages it had handled.
        summary.unread = self.approximate_messages().await.unwrap_or(0);
        if !trimmed.is_empty() && options.backfill_trimmed && !options.dry_run {
            self.backfill_trimmed(options, &mut kept, &trimmed, &mut summary)
                .await?;
        }
        for receipt in kept.values() {
            self.hide(receipt, 0).await?;
        }
        summary.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(summary)
    }

    /// One message, received with `visibility`, or `None` when the queue
    /// has nothing visible.
    async fn receive_one(
        &self,
        visibility: i32,
    ) -> Result<Option<aws_sdk_sqs::types::Message>, RecoverError> {
        let received = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(1)
            .visibility_timeout(visibility)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| self.queue_error("ReceiveMessage", e))?;
        Ok(received.messages().first().cloned())
    }

    /// Runs `work` while keeping the message invisible: its visibility is
    /// renewed every third of `visibility`.
    async fn with_heartbeat<F: std::future::Future>(
        &self,
        receipt: &str,
        visibility: i32,
        work: F,
    ) -> F::Output {
        tokio::pin!(work);
        let period = Duration::from_secs((visibility as u64 / 3).max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                output = &mut work => return output,
                _ = tick.tick() => {
                    if let Err(error) = self.hide(receipt, visibility).await {
                        tracing::warn!(%error, "could not extend the message's visibility");
                    }
                }
            }
        }
    }

    /// Runs a guarded backfill of the whole table for the ranges the stream
    /// no longer holds, then deletes their messages, received again for
    /// fresh receipt handles (the backfill may outlast any visibility
    /// timeout SQS allows).
    async fn backfill_trimmed(
        &self,
        options: &RecoverOptions,
        kept: &mut HashMap<String, String>,
        trimmed: &HashSet<String>,
        summary: &mut RecoverSummary,
    ) -> Result<(), RecoverError> {
        tracing::info!(
            ranges = trimmed.len(),
            "running a guarded backfill of the whole table for the trimmed ranges"
        );
        // Visible again while the backfill runs: no handle has to outlive it.
        for receipt in kept.values() {
            self.hide(receipt, 0).await?;
        }
        kept.clear();
        let backfill_options = crate::backfill::BackfillOptions {
            progress: options.progress,
            ..crate::backfill::BackfillOptions::default()
        };
        let done = crate::backfill::backfill(&self.applier, &backfill_options).await?;
        tracing::info!(?done, "backfill done");
        summary.backfilled = true;
        let visibility = options.visibility_timeout.as_secs().clamp(1, 43_200) as i32;
        let mut deleted: HashSet<String> = HashSet::new();
        let mut idle = 0;
        while deleted.len() < trimmed.len() && idle < 3 {
            let Some(message) = self.receive_one(visibility).await? else {
                break;
            };
            let id = message.message_id().unwrap_or_default().to_string();
            let receipt = message.receipt_handle().unwrap_or_default().to_string();
            if trimmed.contains(&id) && !deleted.contains(&id) {
                self.delete(&receipt).await?;
                deleted.insert(id);
                idle = 0;
            } else {
                // Another message (kept, or new since): made visible again
                // at the end, for the next run.
                if kept.insert(id, receipt).is_some() {
                    idle += 1;
                }
            }
        }
        for report in &mut summary.messages {
            if let Outcome::Trimmed { backfilled, .. } = &mut report.outcome {
                *backfilled = deleted.contains(&report.message_id);
            }
        }
        Ok(())
    }

    /// The queue's approximate visible messages, for the progress bar.
    async fn approximate_messages(&self) -> Option<u64> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let output = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .ok()?;
        output
            .attributes()?
            .get(&QueueAttributeName::ApproximateNumberOfMessages)?
            .parse()
            .ok()
    }

    async fn delete(&self, receipt: &str) -> Result<(), RecoverError> {
        self.sqs
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| self.queue_error("DeleteMessage", e))?;
        Ok(())
    }

    async fn hide(&self, receipt: &str, seconds: i32) -> Result<(), RecoverError> {
        self.sqs
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds)
            .send()
            .await
            .map_err(|e| self.queue_error("ChangeMessageVisibility", e))?;
        Ok(())
    }

    /// One message: its range read again, and the current state of every
    /// item it touched derived (or why not).
    async fn handle(
        &self,
        body: &str,
        options: &RecoverOptions,
    ) -> Result<(Option<FailedBatch>, Outcome), RecoverError> {
        match parse_failure(body) {
            Err(error) => Ok((
                None,
                Outcome::Refused {
                    reason: error.to_string(),
                },
            )),
            Ok(batch) => {
                let outcome = self.recover(&batch, options).await?;
                Ok((Some(batch), outcome))
            }
        }
    }

    /// Reads one range and derives the current state of every item its
    /// records touched.
    ///
    /// The records' own images are not applied: Lambda went on past the
    /// range, so newer records of the same items may have applied already,
    /// and an older image applied after them would bring back an edge the
    /// source no longer has, or count a follow twice. What the range tells
    /// is which items changed; each is read consistently and derived like a
    /// scanned item, every write guarded by the state read (as a backfill
    /// does), so a newer live change is never undone and the order of
    /// messages does not matter. An item held behind dead letters is held
    /// as usual: its letter then stands for its current state.
    async fn recover(
        &self,
        batch: &FailedBatch,
        options: &RecoverOptions,
    ) -> Result<Outcome, RecoverError> {
        let table = self.applier.table();
        if batch.table() != Some(table) {
            return Ok(Outcome::Refused {
                reason: format!(
                    "the message is for the stream {} (table {}), not for table {table}: recover it with that table's spec and --table",
                    batch.stream_arn,
                    batch.table().unwrap_or("?")
                ),
            });
        }
        let records = match self.read_range(batch).await? {
            Range::Gone(detail) => {
                return Ok(Outcome::Trimmed {
                    detail,
                    backfilled: false,
                })
            }
            Range::Incomplete(reason) => return Ok(Outcome::Failed { reason }),
            Range::Records(records) => records,
        };
        if options.dry_run {
            return Ok(Outcome::Readable {
                records: records.len() as u64,
            });
        }
        // The items the range touched, each read once (with the others)
        // and standing where its last record stood; the records whose item
        // cannot be told stay as they are (dead-lettered with the full
        // record and the reason).
        let n = records.len() as u64;
        let decoded: Vec<_> = records
            .iter()
            .enumerate()
            .map(|(index, record)| decode_stream_record(index, &batch.shard_id, record))
            .collect();
        let states = match self.applier.current_states(decoded, None).await {
            Ok(states) => states,
            Err(error) => {
                return Ok(Outcome::Failed {
                    reason: format!("reading the items' current state: {error}"),
                })
            }
        };
        let n_items = states.items_read as u64;
        let mut counts = (0, 0);
        let mut states = states.records;
        while !states.is_empty() {
            let rest = states.split_off(states.len().min(super::stream::MAX_BATCH as usize));
            let chunk = std::mem::replace(&mut states, rest);
            if let Some(reason) = self.apply_all(chunk, options, &mut counts).await? {
                return Ok(Outcome::Failed { reason });
            }
        }
        metrics::counter!("projector_recover_records_total").increment(n);
        Ok(Outcome::Recovered {
            records: n,
            items: n_items,
            dead_lettered: counts.0,
            skipped: counts.1,
        })
    }

    /// Applies `batch` until every record is handled, retrying the
    /// unhandled suffix (in order) for up to `max_apply_time`; the last
    /// failure when it is not.
    async fn apply_all(
        &self,
        mut batch: Vec<Result<crate::record::ChangeRecord, crate::decode::DecodeProblem>>,
        options: &RecoverOptions,
        counts: &mut (u64, u64),
    ) -> Result<Option<String>, RecoverError> {
        let batch_options = BatchOptions {
            read_markers_first: true,
            ..BatchOptions::default()
        };
        let mut retrier = Retrier::slow(Some(options.max_apply_time));
        while !batch.is_empty() {
            let outcome = self.applier.apply_batch(&batch, &batch_options).await?;
            let handled = outcome.first_failure().unwrap_or(batch.len());
            for status in &outcome.statuses[..handled] {
                match status {
                    RecordStatus::DeadLettered(_) => counts.0 += 1,
                    RecordStatus::Skipped(_) => counts.1 += 1,
                    _ => {}
                }
            }
            if handled == batch.len() {
                return Ok(None);
            }
            let reason = match &outcome.statuses[handled] {
                RecordStatus::Failed(reason) => reason.clone(),
                other => format!("{other:?}"),
            };
            batch.drain(..handled);
            let waited = retrier
                .wait(|wait| {
                    tracing::warn!(
                        reason,
                        wait_ms = wait.as_millis() as u64,
                        "records of the range failed; retrying"
                    );
                })
                .await;
            if !waited {
                return Ok(Some(reason));
            }
        }
        Ok(None)
    }

    /// Reads `batch`'s records from the stream, or says why it cannot.
    async fn read_range(&self, batch: &FailedBatch) -> Result<Range, RecoverError> {
        let mut retrier = Retrier::slow(Some(STREAM_REQUEST_TIME));
        let sent = retry_request_unless(
            &mut retrier,
            trimmed,
            || {
                self.streams
                    .get_shard_iterator()
                    .stream_arn(&batch.stream_arn)
                    .shard_id(&batch.shard_id)
                    .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                    .sequence_number(batch.start.as_str())
                    .send()
            },
            |_, _, _| {},
        )
        .await;
        let iterator = match sent {
            Ok(output) => match output.shard_iterator() {
                Some(iterator) => iterator.to_string(),
                None => return Ok(Range::Gone("the shard has no records left".to_string())),
            },
            Err((_, error)) => {
                let service = error.as_service_error();
                if service.is_some_and(|e| e.is_trimmed_data_access_exception()) {
                    return Ok(Range::Gone(
                        "DynamoDB Streams keeps records for 24 hours and these were trimmed"
                            .to_string(),
                    ));
                }
                if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                    return Ok(Range::Gone(
                        "the stream or the shard no longer exists (trimmed, or the stream was disabled)"
                            .to_string(),
                    ));
                }
                if let Some(service) = service {
                    let message = service.meta().message().unwrap_or_default();
                    if service.meta().code() == Some("ValidationException")
                        && message.contains("equence")
                    {
                        return Ok(Range::Gone(format!(
                            "the shard does not hold sequence number {} (`{message}`)",
                            batch.start
                        )));
                    }
                }
                return Ok(Range::Incomplete(format!(
                    "GetShardIterator failed: {}",
                    retry_describe(&error)
                )));
            }
        };
        let mut records = Vec::new();
        let mut next = Some(iterator);
        let mut empty_pages = 0;
        while let Some(iterator) = next.take() {
            let sent = retry_request_unless(
                &mut retrier,
                trimmed,
                || {
                    self.streams
                        .get_records()
                        .shard_iterator(&iterator)
                        .limit(super::stream::MAX_BATCH)
                        .send()
                },
                |_, _, _| {},
            )
            .await;
            let page = match sent {
                Ok(page) => page,
                Err((_, error)) => {
                    if error
                        .as_service_error()
                        .is_some_and(|e| e.is_trimmed_data_access_exception())
                    {
                        return Ok(Range::Gone(
                            "the range was trimmed while it was being read".to_string(),
                        ));
                    }
                    return Ok(Range::Incomplete(format!(
                        "GetRecords failed after {} records of the range: {}",
                        records.len(),
                        retry_describe(&error)
                    )));
                }
            };
            // Each page gets the whole retry budget again.
            retrier.reset();
            if page.records().is_empty() {
                empty_pages += 1;
            } else {
                empty_pages = 0;
            }
            for record in page.records() {
                let Some(seq) = record
                    .dynamodb()
                    .and_then(|s| s.sequence_number())
                    .map(|s| SequenceNumber(s.to_string()))
                else {
                    return Ok(Range::Incomplete(
                        "a record of the range has no sequence number".to_string(),
                    ));
                };
                if records.is_empty() && seq != batch.start {
                    return Ok(Range::Gone(format!(
                        "the range's first record {} is gone (the shard starts at {seq})",
                        batch.start
                    )));
                }
                if seq > batch.end {
                    return Ok(Range::Records(records));
                }
                let last = seq == batch.end;
                records.push(record.clone());
                if last {
                    return Ok(Range::Records(records));
                }
            }
            // DynamoDB Streams may answer empty pages before it reaches
            // records; a closed shard ends with no next iterator.
            next = page.next_shard_iterator().map(str::to_string);
            if empty_pages > 20 {
                break;
            }
        }
        // Read to the end of a closed shard without finding its first
        // record: the shard does not hold the range.
        if records.is_empty() && next.is_none() {
            return Ok(Range::Gone(format!(
                "the shard has no record {} (read to its end)",
                batch.start
            )));
        }
        // Lambda read the last record, so the stream has it: a range read
        // only in part is not applied, and its message stays.
        Ok(Range::Incomplete(format!(
            "read {} records of the range but not its last, {}",
            records.len(),
            batch.end
        )))
    }
}

/// Whether a stream read failed because its records were trimmed: an
/// answer (they are gone), never retried.
fn trimmed<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        == Some("TrimmedDataAccessException")
}

fn progress_bar(progress: bool, total: Option<u64>) -> indicatif::ProgressBar {
    if !progress || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => indicatif::ProgressBar::new(total),
        None => indicatif::ProgressBar::new_spinner(),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "recover {bar:30} {pos}/{len} messages ({eta} left)",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message exactly as Lambda writes it to an SQS on-failure
    /// destination (AWS Lambda Developer Guide, "Retain discarded records
    /// for a DynamoDB event source").
    const LAMBDA: &str = r#"{
      "requestContext": {
        "requestId": "316aa6d0-8154-xmpl-9af7-85d5f4a6bc81",
        "functionArn": "arn:aws:lambda:us-east-2:123456789012:function:myfunction",
        "condition": "RetryAttemptsExhausted",
        "approximateInvokeCount": 1
      },
      "responseContext": {
        "statusCode": 200,
        "executedVersion": "$LATEST",
        "functionError": "Unhandled"
      },
      "version": "1.0",
      "timestamp": "2019-11-14T00:13:49.717Z",
      "DDBStreamBatchInfo": {
        "shardId": "shardId-00000001573689847184-864758bb",
        "startSequenceNumber": "800000000003126276362",
        "endSequenceNumber": "800000000003126276363",
        "approximateArrivalOfFirstRecord": "2019-11-14T00:13:19Z",
        "approximateArrivalOfLastRecord": "2019-11-14T00:13:19Z",
        "batchSize": 2,
        "streamArn": "arn:aws:dynamodb:us-east-2:123456789012:table/mytable/stream/2019-11-14T00:04:06.388"
      }
    }"#;

    #[test]
    fn lambdas_failure_record_names_the_range() {
        let batch = parse_failure(LAMBDA).expect("parses");
        assert_eq!(batch.shard_id, "shardId-00000001573689847184-864758bb");
        assert_eq!(batch.start.as_str(), "800000000003126276362");
        assert_eq!(batch.end.as_str(), "800000000003126276363");
        assert_eq!(batch.batch_size, Some(2));
        assert_eq!(batch.condition.as_deref(), Some("RetryAttemptsExhausted"));
        assert_eq!(batch.table(), Some("mytable"));
    }

    #[test]
    fn an_sns_wrapped_record_is_read_too() {
        let wrapped = serde_json::json!({
            "Type": "Notification",
            "MessageId": "x",
            "Message": LAMBDA,
        })
        .to_string();
        assert_eq!(parse_failure(&wrapped), parse_failure(LAMBDA));
    }

    #[test]
    fn other_messages_say_what_they_lack() {
        assert!(matches!(
            parse_failure("not json"),
            Err(MessageError::NotJson(_))
        ));
        assert_eq!(
            parse_failure(r#"{"KinesisBatchInfo": {}}"#),
            Err(MessageError::NoBatchInfo)
        );
        let no_shard = LAMBDA.replace("\"shardId\"", "\"shard\"");
        assert_eq!(
            parse_failure(&no_shard),
            Err(MessageError::Field("shardId"))
        );
        let backwards = LAMBDA.replace("276363", "276361");
        assert!(matches!(
            parse_failure(&backwards),
            Err(MessageError::Backwards { .. })
        ));
    }
}
