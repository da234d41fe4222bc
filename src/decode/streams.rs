//! Records returned by the DynamoDB Streams API (`aws-sdk-dynamodbstreams`).

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::types::{
    AttributeValue as SdkValue, OperationType, Record, StreamViewType,
};

use super::sdk::{item_from_sdk, item_json};
use super::{check, unknown_event_name, DecodeProblem};
use crate::record::{ChangeKind, ChangeRecord, Image, Origin, SequenceNumber, ViewType};

type SdkImage = HashMap<String, SdkValue>;

/// Decodes one Streams API record read from `shard_id`.
pub fn decode_stream_record(
    index: usize,
    shard_id: &str,
    record: &Record,
) -> Result<ChangeRecord, DecodeProblem> {
    let stream = record.dynamodb();
    let problem = |reason: String| DecodeProblem {
        index,
        event_id: record.event_id().map(str::to_string),
        sequence_number: stream.and_then(|s| s.sequence_number()).map(str::to_string),
        reason,
        raw: raw_json(record),
    };
    let kind = match record.event_name() {
        Some(OperationType::Insert) => ChangeKind::Insert,
        Some(OperationType::Modify) => ChangeKind::Modify,
        Some(OperationType::Remove) => ChangeKind::Remove,
        Some(other) => return Err(problem(unknown_event_name(other.as_str()))),
        None => return Err(problem("the record has no eventName".to_string())),
    };
    let Some(stream) = stream else {
        return Err(problem("the record has no `dynamodb` section".to_string()));
    };
    // Each image converted once; a value the SDK read as `Unknown` is a
    // problem naming the section and the value's path.
    let image = |section: &str, map: Option<&SdkImage>| match map.filter(|m| !m.is_empty()) {
        None => Ok(None),
        Some(map) => item_from_sdk(map.clone())
            .map(Some)
            .map_err(|error| problem(format!("{section} {error}"))),
    };
    let keys = image("Keys", stream.keys())?.unwrap_or_default();
    let new_image = image("NewImage", stream.new_image())?;
    let old_image = image("OldImage", stream.old_image())?;
    let ttl_expiry = record.user_identity().is_some_and(|id| {
        id.r#type() == Some("Service") && id.principal_id() == Some("dynamodb.amazonaws.com")
    });
    let change = ChangeRecord {
        event_id: record.event_id().unwrap_or_default().to_string(),
        kind,
        keys: keys.into(),
        old_image: old_image.map(Image::from),
        new_image: new_image.map(Image::from),
        sequence_number: SequenceNumber(stream.sequence_number().unwrap_or_default().to_string()),
        approximate_creation_ms: stream
            .approximate_creation_date_time()
            .and_then(|t| t.to_millis().ok()),
        ttl_expiry,
        view_type: stream.stream_view_type().map(|v| match v {
            StreamViewType::NewImage => ViewType::NewImage,
            StreamViewType::OldImage => ViewType::OldImage,
            StreamViewType::NewAndOldImages => ViewType::NewAndOldImages,
            _ => ViewType::KeysOnly,
        }),
        size_bytes: stream.size_bytes(),
        origin: Origin::Stream {
            shard_id: shard_id.to_string(),
        },
    };
    check(&change).map_err(problem)?;
    Ok(change)
}

/// The record in the Streams API's JSON shape, for dead letters.
fn raw_json(record: &Record) -> serde_json::Value {
    let image = |map: Option<&SdkImage>| map.map(item_json);
    serde_json::json!({
        "eventID": record.event_id(),
        "eventName": record.event_name().map(|n| n.as_str()),
        "eventSource": record.event_source(),
        "awsRegion": record.aws_region(),
        // An absent section stays absent (null), as the record arrived.
        "dynamodb": record.dynamodb().map(|s| serde_json::json!({
            "ApproximateCreationDateTime": s.approximate_creation_date_time().map(|t| t.secs()),
            "Keys": image(s.keys()),
            "NewImage": image(s.new_image()),
            "OldImage": image(s.old_image()),
            "SequenceNumber": s.sequence_number(),
            "SizeBytes": s.size_bytes(),
            "StreamViewType": s.stream_view_type().map(|v| v.as_str()),
        })),
        "userIdentity": record.user_identity().map(|id| serde_json::json!({
            "type": id.r#type(), "principalId": id.principal_id(),
        })),
    })
}
