//! The two streams the runner reads, behind one face: DynamoDB Streams
//! (the table's own stream) and Kinesis Data Streams for DynamoDB (a
//! Kinesis stream the table sends its changes to). Both list shards with
//! parents, hand out iterators (after a sequence number, at the trim
//! horizon, at a time) and return pages with the next iterator; each
//! page's records are decoded here, so the shard tasks see only
//! [`ChangeRecord`]s and their positions.

use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use aws_sdk_kinesis::types::ShardIteratorType as KinesisIteratorType;

use crate::decode::{decode_kinesis_data, decode_stream_record, Decoded, KinesisMeta};
use crate::dynamo::retry::{classify, describe, ErrorClass};
use crate::record::SequenceNumber;

/// A client of one of the two streams.
#[derive(Debug, Clone)]
pub(crate) enum StreamApi {
    /// The table's DynamoDB stream.
    Dynamo(aws_sdk_dynamodbstreams::Client),
    /// A Kinesis data stream the table streams its changes to.
    Kinesis(aws_sdk_kinesis::Client),
}

/// A shard as the stream lists it.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub shard_id: String,
    pub parent: Option<String>,
    pub closed: bool,
}

/// Where an iterator starts.
#[derive(Debug, Clone)]
pub(crate) enum Start<'a> {
    /// Just after a record.
    After(&'a SequenceNumber),
    /// At the oldest record kept.
    TrimHorizon,
    /// At the first record written at or after a time (ms; Kinesis only).
    At(i64),
}

/// One page of a shard.
#[derive(Debug, Default)]
pub(crate) struct Page {
    /// Its records, decoded, in shard order.
    pub records: Decoded,
    /// Each record's position in its shard.
    pub positions: Vec<Option<SequenceNumber>>,
    /// The iterator of the next page (`None`: the shard is closed and read).
    pub next: Option<String>,
    /// How far the page is behind the shard's tip (Kinesis says so).
    pub behind_ms: Option<i64>,
}

/// Why a request failed, as the shard tasks tell cases apart.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The iterator expired (15 minutes on DynamoDB Streams, 5 on Kinesis).
    Expired,
    /// The records asked for were trimmed.
    Trimmed,
    /// The stream or the shard is gone.
    NotFound(String),
    /// The stream does not accept the sequence number for the shard.
    BadSequenceNumber(String),
    /// Anything else, classified for retries.
    Other(ErrorClass, String),
}

fn other<E, R>(error: &aws_smithy_runtime_api::client::result::SdkError<E, R>) -> ApiError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    ApiError::Other(classify(error), describe(error))
}

impl StreamApi {
    /// Every shard of the stream.
    pub(crate) async fn list_shards(&self, arn: &str) -> Result<Vec<Listed>, ApiError> {
        let mut shards = Vec::new();
        match self {
            StreamApi::Dynamo(client) => {
                let mut start: Option<String> = None;
                loop {
                    let output = client
                        .describe_stream()
                        .stream_arn(arn)
                        .set_exclusive_start_shard_id(start.clone())
                        .send()
                        .await
                        .map_err(|error| {
                            if error
                                .as_service_error()
                                .is_some_and(|e| e.is_resource_not_found_exception())
                            {
                                ApiError::NotFound(
                                    "the stream does not exist (was it disabled, or the table deleted?)"
                                        .to_string(),
                                )
                            } else {
                                other(&error)
                            }
                        })?;
                    let Some(description) = output.stream_description() else {
                        return Ok(shards);
                    };
                    for shard in description.shards() {
                        let Some(shard_id) = shard.shard_id() else {
                            continue;
                        };
                        shards.push(Listed {
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
            StreamApi::Kinesis(client) => {
                let mut token: Option<String> = None;
                loop {
                    // A request with a token names no stream.
                    let request = match &token {
                        Some(token) => client.list_shards().next_token(token),
                        None => client.list_shards().stream_arn(arn),
                    };
                    let output = request.send().await.map_err(|error| {
                        if error
                            .as_service_error()
                            .is_some_and(|e| e.is_resource_not_found_exception())
                        {
                            ApiError::NotFound("the Kinesis stream does not exist".to_string())
                        } else {
                            other(&error)
                        }
                    })?;
                    for shard in output.shards() {
                        shards.push(Listed {
                            shard_id: shard.shard_id().to_string(),
                            // Kept to tell a parent trimmed before it was
                            // read; a child need not wait for it (records
                            // are derived as their items are now, whatever
                            // their order: see `ready_shards`).
                            parent: shard.parent_shard_id().map(str::to_string),
                            closed: shard
                                .sequence_number_range()
                                .and_then(|r| r.ending_sequence_number())
                                .is_some(),
                        });
                    }
                    match output.next_token() {
                        Some(next) if !next.is_empty() => token = Some(next.to_string()),
                        _ => return Ok(shards),
                    }
                }
            }
        }
    }

    /// An iterator of `shard_id` from `start`; `None`: nothing more to read.
    pub(crate) async fn shard_iterator(
        &self,
        arn: &str,
        shard_id: &str,
        start: Start<'_>,
    ) -> Result<Option<String>, ApiError> {
        match self {
            StreamApi::Dynamo(client) => {
                let mut request = client
                    .get_shard_iterator()
                    .stream_arn(arn)
                    .shard_id(shard_id);
                request = match &start {
                    Start::After(seq) => request
                        .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                        .sequence_number(seq.as_str()),
                    Start::TrimHorizon | Start::At(_) => {
                        request.shard_iterator_type(ShardIteratorType::TrimHorizon)
                    }
                };
                match request.send().await {
                    Ok(output) => Ok(output.shard_iterator().map(str::to_string)),
                    Err(error) => {
                        let service = error.as_service_error();
                        if service.is_some_and(|e| e.is_trimmed_data_access_exception()) {
                            return Err(ApiError::Trimmed);
                        }
                        if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                            return Err(ApiError::NotFound(format!(
                                "shard {shard_id} no longer exists"
                            )));
                        }
                        // DynamoDB refuses a sequence number the shard does
                        // not hold (DynamoDB Local: any it never had, too).
                        if let (Start::After(_), Some(service)) = (&start, service) {
                            let message = service.meta().message().unwrap_or_default();
                            if service.meta().code() == Some("ValidationException")
                                && message.contains("SequenceNumber")
                            {
                                return Err(ApiError::BadSequenceNumber(message.to_string()));
                            }
                        }
                        Err(other(&error))
                    }
                }
            }
            StreamApi::Kinesis(client) => {
                let mut request = client
                    .get_shard_iterator()
                    .stream_arn(arn)
                    .shard_id(shard_id);
                request = match &start {
                    Start::After(seq) => request
                        .shard_iterator_type(KinesisIteratorType::AfterSequenceNumber)
                        .starting_sequence_number(seq.as_str()),
                    Start::TrimHorizon => {
                        request.shard_iterator_type(KinesisIteratorType::TrimHorizon)
                    }
                    Start::At(ms) => request
                        .shard_iterator_type(KinesisIteratorType::AtTimestamp)
                        .timestamp(aws_smithy_types::DateTime::from_millis(*ms)),
                };
                match request.send().await {
                    Ok(output) => Ok(output.shard_iterator().map(str::to_string)),
                    Err(error) => {
                        let service = error.as_service_error();
                        if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                            return Err(ApiError::NotFound(format!(
                                "shard {shard_id} no longer exists"
                            )));
                        }
                        if let (Start::After(_), Some(service)) = (&start, service) {
                            if service.is_invalid_argument_exception() {
                                return Err(ApiError::BadSequenceNumber(
                                    service.meta().message().unwrap_or_default().to_string(),
                                ));
                            }
                        }
                        Err(other(&error))
                    }
                }
            }
        }
    }

    /// One page from `iterator`, decoded; `shard_id` and `arn` name where
    /// its records came from.
    pub(crate) async fn get_records(
        &self,
        arn: &str,
        shard_id: &str,
        iterator: &str,
        limit: i32,
    ) -> Result<Page, ApiError> {
        match self {
            StreamApi::Dynamo(client) => {
                let output = client
                    .get_records()
                    .shard_iterator(iterator)
                    .limit(limit)
                    .send()
                    .await
                    .map_err(|error| {
                        let service = error.as_service_error();
                        if service.is_some_and(|e| e.is_expired_iterator_exception()) {
                            ApiError::Expired
                        } else if service.is_some_and(|e| e.is_trimmed_data_access_exception()) {
                            ApiError::Trimmed
                        } else if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                            ApiError::NotFound(describe(&error))
                        } else {
                            other(&error)
                        }
                    })?;
                let records = output.records();
                Ok(Page {
                    records: records
                        .iter()
                        .enumerate()
                        .map(|(index, record)| decode_stream_record(index, shard_id, record))
                        .collect(),
                    positions: records
                        .iter()
                        .map(|record| {
                            record
                                .dynamodb()
                                .and_then(|s| s.sequence_number())
                                .filter(|s| !s.is_empty())
                                .map(|s| SequenceNumber(s.to_string()))
                        })
                        .collect(),
                    next: output.next_shard_iterator().map(str::to_string),
                    behind_ms: None,
                })
            }
            StreamApi::Kinesis(client) => {
                // The stream's ARN goes along (Kinesis accepts it; moto's
                // server cannot find the stream from the iterator alone).
                let output = client
                    .get_records()
                    .stream_arn(arn)
                    .shard_iterator(iterator)
                    .limit(limit)
                    .send()
                    .await
                    .map_err(|error| {
                        let service = error.as_service_error();
                        if service.is_some_and(|e| e.is_expired_iterator_exception()) {
                            ApiError::Expired
                        } else if service.is_some_and(|e| e.is_resource_not_found_exception()) {
                            ApiError::NotFound(describe(&error))
                        } else {
                            other(&error)
                        }
                    })?;
                let records = output.records();
                Ok(Page {
                    records: records
                        .iter()
                        .enumerate()
                        .map(|(index, record)| {
                            decode_kinesis_data(
                                index,
                                record.data().as_ref(),
                                KinesisMeta {
                                    sequence_number: record.sequence_number(),
                                    stream_arn: Some(arn),
                                    shard_id: Some(shard_id),
                                },
                            )
                        })
                        .collect(),
                    positions: records
                        .iter()
                        .map(|record| Some(SequenceNumber(record.sequence_number().to_string())))
                        .collect(),
                    next: output.next_shard_iterator().map(str::to_string),
                    behind_ms: output.millis_behind_latest(),
                })
            }
        }
    }

    /// Whether this is a Kinesis stream (records derived as items are now).
    pub(crate) fn is_kinesis(&self) -> bool {
        matches!(self, StreamApi::Kinesis(_))
    }
}
