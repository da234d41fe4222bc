//! Lambda's DynamoDB Streams event (`{"Records": [...]}`).
//!
//! The same shape is what the Streams API's GetRecords returns on the wire
//! (less `eventSourceARN`), so `plan --event` accepts both.

use aws_lambda_events::event::dynamodb::{EventRecord, StreamViewType};

use super::{check, fast, unknown_event_name, DecodeProblem, Decoded};
use crate::record::{ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType};

/// The event as a whole could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LambdaEventError {
    /// Not JSON at all. The parser's message is part of this one (and not
    /// a `source`), so that `{:#}` chains do not print it twice.
    #[error("the event is not valid JSON: {0}")]
    Json(serde_json::Error),
    /// JSON, but not a DynamoDB Streams event.
    #[error("the event has no `Records` array: it is not a DynamoDB Streams event")]
    NoRecords,
}

impl From<serde_json::Error> for LambdaEventError {
    fn from(error: serde_json::Error) -> Self {
        LambdaEventError::Json(error)
    }
}

/// Decodes a Lambda DynamoDB Streams event, record by record.
///
/// The whole event is first decoded in one pass, the fast way
/// (`super::fast`); only when that fails, or a record fails a check, are
/// records decoded on their own from the JSON, the slow way, so that every
/// problem carries its record as received and the exact reason.
pub fn decode_lambda_event(bytes: &[u8]) -> Result<Decoded, LambdaEventError> {
    let mut fast = fast::event(bytes);
    if let Some(decoded) = fast.take_if(|decoded| decoded.iter().all(Result::is_ok)) {
        return Ok(decoded);
    }
    let mut fast = fast.map(Vec::into_iter);
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    let Some(records) = value.get("Records").and_then(|r| r.as_array()) else {
        return Err(LambdaEventError::NoRecords);
    };
    Ok(records
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            // Only the records that failed a check are decoded again.
            match fast.as_mut().and_then(Iterator::next) {
                Some(Ok(record)) => Ok(record),
                _ => decode_lambda_record(index, raw),
            }
        })
        .collect())
}

/// Decodes one record of a Lambda event from its JSON text: the fast way,
/// and only when that fails through a JSON value, so that the problem
/// carries the record as received.
pub fn decode_lambda_record_json(index: usize, json: &str) -> Result<ChangeRecord, DecodeProblem> {
    if let Some(record) = fast::record(json) {
        return Ok(record);
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(raw) => decode_lambda_record(index, &raw),
        Err(error) => Err(DecodeProblem {
            index,
            event_id: None,
            sequence_number: None,
            reason: format!("the record is not valid JSON: {error}"),
            raw: serde_json::Value::String(json.to_string()),
        }),
    }
}

/// Decodes one record of a Lambda event from JSON.
pub fn decode_lambda_record(
    index: usize,
    raw: &serde_json::Value,
) -> Result<ChangeRecord, DecodeProblem> {
    match serde_json::from_value::<EventRecord>(raw.clone()) {
        Ok(record) => from_event_record(index, record, raw),
        Err(error) => Err(DecodeProblem {
            index,
            event_id: raw
                .get("eventID")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            sequence_number: raw
                .pointer("/dynamodb/SequenceNumber")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            reason: format!("the record does not fit the DynamoDB Streams record format: {error}"),
            raw: raw.clone(),
        }),
    }
}

fn view_type(view: &StreamViewType) -> ViewType {
    match view {
        StreamViewType::NewImage => ViewType::NewImage,
        StreamViewType::OldImage => ViewType::OldImage,
        StreamViewType::NewAndOldImages => ViewType::NewAndOldImages,
        _ => ViewType::KeysOnly,
    }
}

fn non_empty(item: Item) -> Option<Image> {
    (!item.is_empty()).then(|| item.into())
}

fn from_event_record(
    index: usize,
    record: EventRecord,
    raw: &serde_json::Value,
) -> Result<ChangeRecord, DecodeProblem> {
    let Some(kind) = ChangeKind::from_event_name(&record.event_name) else {
        return Err(DecodeProblem {
            index,
            event_id: Some(record.event_id.clone()).filter(|id| !id.is_empty()),
            sequence_number: record.change.sequence_number.clone(),
            reason: unknown_event_name(&record.event_name),
            raw: raw.clone(),
        });
    };
    let ttl_expiry = record
        .user_identity
        .as_ref()
        .is_some_and(|id| id.type_ == "Service" && id.principal_id == "dynamodb.amazonaws.com");
    let stream = record.change;
    let millis = stream.approximate_creation_date_time.timestamp_millis();
    // The images move into the record: they are most of its size.
    let change = ChangeRecord {
        event_id: record.event_id,
        kind,
        keys: stream.keys.into(),
        old_image: non_empty(stream.old_image),
        new_image: non_empty(stream.new_image),
        sequence_number: SequenceNumber(stream.sequence_number.unwrap_or_default()),
        approximate_creation_ms: (millis != 0).then_some(millis),
        ttl_expiry,
        view_type: stream.stream_view_type.as_ref().map(view_type),
        size_bytes: Some(stream.size_bytes),
        origin: Origin::Lambda {
            event_source_arn: record.event_source_arn,
        },
    };
    match check(&change) {
        Ok(()) => Ok(change),
        Err(reason) => Err(DecodeProblem {
            index,
            event_id: Some(change.event_id.clone()).filter(|id| !id.is_empty()),
            sequence_number: Some(change.sequence_number.0.clone()).filter(|seq| !seq.is_empty()),
            reason,
            raw: raw.clone(),
        }),
    }
}
