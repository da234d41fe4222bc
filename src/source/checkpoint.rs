//! Durable per-shard checkpoints of the stream runner, kept in the table
//! itself under the reserved prefix (see [`crate::dynamo::names::RESERVED_PREFIX`]),
//! so that no other storage is needed and `_ddbp#` items stay the
//! projector's own.
//!
//! # Layout
//!
//! One item per (stream, shard):
//!
//! | attribute | value |
//! | --- | --- |
//! | partition key | `_ddbp#checkpoint`, or `_ddbp#checkpoint@<consumer>` for a named consumer (`--consumer`); tables without a sort key: that, then `#<stream ARN>#<shard id>` |
//! | sort key | `<stream ARN>#<shard id>` |
//! | `streamArn`, `shardId` | the stream and shard, for people and queries |
//! | `parentShardId` | the shard's parent, when it has one |
//! | `sequenceNumber` | the last record of the shard that is handled (applied, skipped or dead-lettered); absent when none is yet |
//! | `finished` | `true` once the shard is closed and read to its end |
//! | `records` | records handled in the shard up to `sequenceNumber` |
//! | `updatedAt` | when the item was last written (RFC 3339, UTC) |
//!
//! The stream ARN includes the stream's label, so re-enabling the stream
//! (a new ARN) starts from fresh checkpoints. With a sort key, every
//! checkpoint of a stream is one `Query` away:
//! `PK = _ddbp#checkpoint AND begins_with(SK, "<stream ARN>#")`.
//!
//! Writes are conditional on the previous `sequenceNumber`, so a checkpoint
//! only moves from where this runner found it: a second runner on the same
//! stream makes one of them stop with an error instead of interleaving.
//!
//! Checkpoint writes show up in the table's stream like any write. The
//! planner skips them (`projector bookkeeping item`), and the runner writes
//! no checkpoint for a batch of nothing but such records, so a checkpoint
//! never causes another one.
//!
//! Deleting a shard's item (see [`CheckpointStore::reset`]) makes the next
//! run read that shard from `TRIM_HORIZON` again.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue as Av;
use aws_smithy_types::date_time::Format;

use crate::dynamo::names::RESERVED_PREFIX;
use crate::dynamo::retry::{describe as retry_describe, retry_request, ErrorClass, Retrier};
use crate::record::SequenceNumber;
use crate::spec::Spec;

pub use crate::dynamo::names::CHECKPOINT_PK;

/// How long one checkpoint operation is retried before it gives up.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The stored state of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// The shard.
    pub shard_id: String,
    /// The shard's parent, when it has one.
    pub parent_shard_id: Option<String>,
    /// The last handled record of the shard.
    pub sequence_number: Option<SequenceNumber>,
    /// Whether the shard is closed and read to its end.
    pub finished: bool,
    /// Records handled in the shard up to `sequence_number`.
    pub records: u64,
    /// When it was written (empty for one not read from the table).
    pub updated_at: String,
}

/// Why a checkpoint operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Someone else moved the checkpoint: another runner on the same stream.
    #[error(
        "the checkpoint of shard {shard_id} was moved by another process (expected sequence number {expected}, found {found}): \
         is another `ddb-projector run` reading this stream? Run one runner per stream"
    )]
    Conflict {
        /// The shard.
        shard_id: String,
        /// What this runner last wrote or read.
        expected: String,
        /// What the table holds.
        found: String,
    },
    /// Retries ran out; the checkpoint may be written later.
    #[error("checkpoint {operation} failed after retries: {message}")]
    Transient {
        /// Which operation.
        operation: &'static str,
        /// The last error.
        message: String,
    },
    /// The table cannot be used (missing, access denied...).
    #[error("checkpoint {operation} failed: {message}")]
    Fatal {
        /// Which operation.
        operation: &'static str,
        /// What DynamoDB or the SDK said.
        message: String,
    },
}

/// Reads and writes the checkpoints of one stream in one table.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
    pk: String,
    sk: Option<String>,
    stream_arn: String,
    /// `_ddbp#checkpoint`, or `_ddbp#checkpoint@<consumer>` for a named
    /// consumer's own.
    partition: String,
}

impl CheckpointStore {
    /// The checkpoints of `stream_arn` in `table`, whose key attributes the
    /// spec names.
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: &str,
        spec: &Spec,
        stream_arn: &str,
    ) -> CheckpointStore {
        debug_assert!(CHECKPOINT_PK.starts_with(RESERVED_PREFIX));
        CheckpointStore {
            client,
            table: table.to_string(),
            pk: spec.table.partition_key.clone(),
            sk: spec.table.sort_key.clone(),
            stream_arn: stream_arn.to_string(),
            partition: CHECKPOINT_PK.to_string(),
        }
    }

    /// The checkpoints of consumer `consumer` (none: the unnamed one, whose
    /// items are where they always were): two runners of different specs
    /// on one stream each keep their own, so neither skips what only the
    /// other applied.
    pub fn for_consumer(mut self, consumer: Option<&str>) -> CheckpointStore {
        self.partition = match consumer {
            Some(name) => format!("{CHECKPOINT_PK}@{name}"),
            None => CHECKPOINT_PK.to_string(),
        };
        self
    }

    /// The positions of replay `run` rather than a consumer's checkpoints
    /// (`_ddbp#replay#<run>`): a replay resumed reads on from them.
    pub fn for_replay(mut self, run: &str) -> CheckpointStore {
        self.partition = format!("{}{run}", crate::dynamo::names::REPLAY_PK_PREFIX);
        self
    }

    /// The stream whose checkpoints these are.
    pub fn stream_arn(&self) -> &str {
        &self.stream_arn
    }

    /// The table key of a shard's checkpoint item.
    pub fn key(&self, shard_id: &str) -> HashMap<String, Av> {
        let member = format!("{}#{}", self.stream_arn, shard_id);
        let mut key = HashMap::new();
        match &self.sk {
            Some(sk) => {
                key.insert(self.pk.clone(), Av::S(self.partition.clone()));
                key.insert(sk.clone(), Av::S(member));
            }
            None => {
                key.insert(
                    self.pk.clone(),
                    Av::S(format!("{}#{member}", self.partition)),
                );
            }
        }
        key
    }

    /// A human-readable description of a shard's checkpoint key, for messages.
    pub fn describe_key(&self, shard_id: &str) -> String {
        let key = self.key(shard_id);
        let mut parts: Vec<String> = key
            .iter()
            .map(|(name, value)| match value {
                Av::S(text) => format!("{name} = {text}"),
                other => format!("{name} = {other:?}"),
            })
            .collect();
        parts.sort();
        parts.join(", ")
    }

    /// A shard's checkpoint, read consistently.
    pub async fn load(&self, shard_id: &str) -> Result<Option<Checkpoint>, CheckpointError> {
        let key = self.key(shard_id);
        let output = retry("read", || {
            self.client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key.clone()))
                .consistent_read(true)
                .send()
        })
        .await?;
        Ok(output.item().map(|item| from_item(shard_id, item)))
    }

    /// Every checkpoint of the stream (tables with a sort key only; an empty
    /// list otherwise).
    pub async fn list(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let Some(sk) = &self.sk else {
            return Ok(Vec::new());
        };
        let prefix = format!("{}#", self.stream_arn);
        let mut checkpoints = Vec::new();
        let mut start: Option<HashMap<String, Av>> = None;
        loop {
            let page = retry("list", || {
                self.client
                    .query()
                    .table_name(&self.table)
                    .consistent_read(true)
                    .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
                    .expression_attribute_names("#pk", &self.pk)
                    .expression_attribute_names("#sk", sk)
                    .expression_attribute_values(":pk", Av::S(self.partition.clone()))
                    .expression_attribute_values(":prefix", Av::S(prefix.clone()))
                    .set_exclusive_start_key(start.clone())
                    .send()
            })
            .await?;
            for item in page.items() {
                let shard_id = match item.get(sk) {
                    Some(Av::S(member)) => member.strip_prefix(&prefix).unwrap_or(member),
                    _ => "",
                };
                checkpoints.push(from_item(shard_id, item));
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(checkpoints),
            }
        }
    }

    /// Writes a checkpoint, only if the stored sequence number is still
    /// `previous` (what this runner read or last wrote) or one of
    /// `unconfirmed` (positions this runner wrote whose answer was lost:
    /// the write may have landed).
    pub async fn save(
        &self,
        previous: Option<&SequenceNumber>,
        unconfirmed: &[SequenceNumber],
        checkpoint: &Checkpoint,
    ) -> Result<(), CheckpointError> {
        match self.save_from(previous, checkpoint).await {
            Err(CheckpointError::Conflict { found, .. })
                if unconfirmed
                    .iter()
                    .any(|mine| *mine == SequenceNumber(found.clone())) =>
            {
                // Our own earlier write landed after all: go on from it.
                let found = SequenceNumber(found);
                self.save_from(Some(&found), checkpoint).await
            }
            other => other,
        }
    }

    async fn save_from(
        &self,
        previous: Option<&SequenceNumber>,
        checkpoint: &Checkpoint,
    ) -> Result<(), CheckpointError> {
        let key = self.key(&checkpoint.shard_id);
        let mut values = HashMap::from([
            (":arn".to_string(), Av::S(self.stream_arn.clone())),
            (":shard".to_string(), Av::S(checkpoint.shard_id.clone())),
            (":finished".to_string(), Av::Bool(checkpoint.finished)),
            (
                ":records".to_string(),
                Av::N(checkpoint.records.to_string()),
            ),
            (":at".to_string(), Av::S(now())),
        ]);
        let mut update = "SET streamArn = :arn, shardId = :shard, finished = :finished, #records = :records, updatedAt = :at".to_string();
        if let Some(parent) = &checkpoint.parent_shard_id {
            values.insert(":parent".to_string(), Av::S(parent.clone()));
            update.push_str(", parentShardId = :parent");
        }
        if let Some(seq) = &checkpoint.sequence_number {
            values.insert(":seq".to_string(), Av::S(seq.0.clone()));
            update.push_str(", sequenceNumber = :seq");
        }
        let condition = match previous {
            Some(seq) => {
                values.insert(":prev".to_string(), Av::S(seq.0.clone()));
                "sequenceNumber = :prev"
            }
            None => "attribute_not_exists(sequenceNumber)",
        };
        let result = retry("write", || {
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key.clone()))
                .update_expression(&update)
                .condition_expression(condition)
                .expression_attribute_names("#records", "records")
                .set_expression_attribute_values(Some(values.clone()))
                .send()
        })
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(Failure::Conditional) => {
                // A retried write may have landed the first time: then the
                // table already holds exactly what we meant to write.
                let stored = self.load(&checkpoint.shard_id).await?;
                let found = stored.as_ref().and_then(|c| c.sequence_number.clone());
                if found.is_some() && found == checkpoint.sequence_number {
                    return Ok(());
                }
                Err(CheckpointError::Conflict {
                    shard_id: checkpoint.shard_id.clone(),
                    expected: previous.map_or("none".to_string(), |s| s.0.clone()),
                    found: found.map_or("none".to_string(), |s| s.0),
                })
            }
            Err(Failure::Error(error)) => Err(error),
        }
    }

    /// Deletes the checkpoints of the given shards, or of every shard the
    /// store can list (tables with a sort key), so the next run reads them
    /// from `TRIM_HORIZON`. Returns how many were deleted.
    pub async fn reset(&self, shards: Option<&[String]>) -> Result<usize, CheckpointError> {
        let shard_ids: Vec<String> = match shards {
            Some(shards) => shards.to_vec(),
            None => self.list().await?.into_iter().map(|c| c.shard_id).collect(),
        };
        for shard_id in &shard_ids {
            let key = self.key(shard_id);
            retry("reset", || {
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .send()
            })
            .await
            .map_err(|failure| match failure {
                Failure::Error(error) => error,
                Failure::Conditional => CheckpointError::Transient {
                    operation: "reset",
                    message: "unexpected condition failure".to_string(),
                },
            })?;
        }
        Ok(shard_ids.len())
    }
}

fn from_item(shard_id: &str, item: &HashMap<String, Av>) -> Checkpoint {
    let text = |name: &str| match item.get(name) {
        Some(Av::S(value)) => Some(value.clone()),
        _ => None,
    };
    Checkpoint {
        shard_id: text("shardId").unwrap_or_else(|| shard_id.to_string()),
        parent_shard_id: text("parentShardId"),
        sequence_number: text("sequenceNumber").map(SequenceNumber),
        finished: matches!(item.get("finished"), Some(Av::Bool(true))),
        records: match item.get("records") {
            Some(Av::N(n)) => n.parse().unwrap_or(0),
            _ => 0,
        },
        updated_at: text("updatedAt").unwrap_or_default(),
    }
}

fn now() -> String {
    aws_smithy_types::DateTime::from(SystemTime::now())
        .fmt(Format::DateTime)
        .unwrap_or_default()
}

/// A checkpoint request's final failure.
enum Failure {
    /// The condition failed (an answer, not an error).
    Conditional,
    /// Anything else.
    Error(CheckpointError),
}

impl From<Failure> for CheckpointError {
    fn from(failure: Failure) -> CheckpointError {
        match failure {
            Failure::Error(error) => error,
            Failure::Conditional => CheckpointError::Transient {
                operation: "read",
                message: "unexpected condition failure".to_string(),
            },
        }
    }
}

/// Sends a request with bounded, jittered retries for throttling, 5xx and
/// network trouble.
async fn retry<T, E, R, F, Fut>(operation: &'static str, send: F) -> Result<T, Failure>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<
        Output = Result<T, aws_smithy_runtime_api::client::result::SdkError<E, R>>,
    >,
{
    let mut retrier = Retrier::slow(Some(MAX_RETRY));
    retry_request(&mut retrier, send, |_reason, _error, wait| {
        metrics::counter!("projector_retries_total", "operation" => "checkpoint", "reason" => operation)
            .increment(1);
        tracing::debug!(operation, wait_ms = wait.as_millis() as u64, "retrying checkpoint");
    })
    .await
    .map_err(|(class, error)| match class {
        ErrorClass::Retry(_) => Failure::Error(CheckpointError::Transient {
            operation,
            message: retry_describe(&error),
        }),
        ErrorClass::Conditional => Failure::Conditional,
        ErrorClass::Poison(message) | ErrorClass::Fatal(message) => {
            Failure::Error(CheckpointError::Fatal { operation, message })
        }
    })
}
