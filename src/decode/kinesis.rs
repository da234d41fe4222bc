//! Kinesis Data Streams for DynamoDB: each Kinesis record's data is one
//! change record of the table, as JSON (`eventName`, `tableName`,
//! `dynamodb.Keys`, `NewImage`, `OldImage`, `ApproximateCreationDateTime`,
//! `userIdentity`), base64-encoded in a Lambda event and raw bytes from
//! the Kinesis API.
//!
//! Unlike DynamoDB Streams, the change carries no sequence number of its
//! own: the record takes the Kinesis record's, which orders records of one
//! Kinesis shard only (one item's changes may be in several shards, twice,
//! and in any order). So nothing after decoding may read an item's order
//! from these records: a Kinesis source derives every item as it is now
//! ([`crate::apply::Applier::current_states`]).

use super::{unknown_event_name, DecodeProblem};
use crate::record::{ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType};

/// Where a Kinesis record was read, for its [`Origin`] and its problems.
#[derive(Debug, Clone, Copy)]
pub struct KinesisMeta<'a> {
    /// The Kinesis record's sequence number.
    pub sequence_number: &'a str,
    /// The Kinesis stream's ARN, when known.
    pub stream_arn: Option<&'a str>,
    /// The shard the record was read from, when known.
    pub shard_id: Option<&'a str>,
}

/// Decodes one record of a Lambda Kinesis event (`{"kinesis": {"data":
/// <base64>, "sequenceNumber": ...}, "eventSourceARN": ...}`) whose data
/// is a DynamoDB change record. `raw` is the record as received: a
/// problem carries it whole.
pub fn decode_kinesis_lambda_record(
    index: usize,
    raw: &serde_json::Value,
) -> Result<ChangeRecord, DecodeProblem> {
    let kinesis = raw.get("kinesis");
    let sequence_number = kinesis
        .and_then(|k| k.get("sequenceNumber"))
        .and_then(|s| s.as_str());
    let event_id = raw.get("eventID").and_then(|s| s.as_str());
    let problem = |reason: String| DecodeProblem {
        index,
        event_id: event_id.map(str::to_string),
        sequence_number: sequence_number.map(str::to_string),
        reason,
        raw: raw.clone(),
    };
    let Some(sequence_number) = sequence_number.filter(|s| !s.is_empty()) else {
        return Err(problem(
            "the Kinesis record has no `kinesis.sequenceNumber`".to_string(),
        ));
    };
    let Some(data) = kinesis.and_then(|k| k.get("data")).and_then(|d| d.as_str()) else {
        return Err(problem(
            "the Kinesis record has no `kinesis.data` string".to_string(),
        ));
    };
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).map_err(
        |error| {
            problem(format!(
                "the Kinesis record's data is not valid base64 ({} characters): {error}",
                data.len()
            ))
        },
    )?;
    let stream_arn = raw.get("eventSourceARN").and_then(|s| s.as_str());
    // Lambda's eventID is `shardId-...:<sequence number>`.
    let shard_id = event_id
        .and_then(|id| id.split_once(':'))
        .map(|(shard, _)| shard);
    decode_kinesis_data(
        index,
        &bytes,
        KinesisMeta {
            sequence_number,
            stream_arn,
            shard_id,
        },
    )
    .map_err(|mut decoded| {
        decoded.raw = raw.clone();
        decoded.event_id = event_id.map(str::to_string).or(decoded.event_id);
        decoded
    })
}

/// Decodes the data of one Kinesis record: a DynamoDB change record as
/// Kinesis Data Streams for DynamoDB writes it. A problem carries the
/// record as JSON (`kinesis.data` base64, as Lambda would show it).
pub fn decode_kinesis_data(
    index: usize,
    data: &[u8],
    meta: KinesisMeta<'_>,
) -> Result<ChangeRecord, DecodeProblem> {
    let problem = |reason: String, event_id: Option<&str>| DecodeProblem {
        index,
        event_id: event_id.map(str::to_string),
        sequence_number: Some(meta.sequence_number.to_string()),
        reason,
        raw: serde_json::json!({
            "eventSource": "aws:kinesis",
            "eventSourceARN": meta.stream_arn,
            "kinesis": {
                "sequenceNumber": meta.sequence_number,
                "data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, data),
            },
            "shardId": meta.shard_id,
        }),
    };
    let value: serde_json::Value = serde_json::from_slice(data).map_err(|error| {
        problem(
            format!(
                "the Kinesis record's data is not a DynamoDB change record: it is not JSON ({error})"
            ),
            None,
        )
    })?;
    let event_id = value.get("eventID").and_then(|s| s.as_str());
    let not_a_change = |what: &str| {
        problem(
            format!("the Kinesis record's data is not a DynamoDB change record (Kinesis Data Streams for DynamoDB): {what}"),
            event_id,
        )
    };
    if !value.is_object() {
        return Err(not_a_change("it is not a JSON object"));
    }
    let Some(stream) = value.get("dynamodb").filter(|d| d.is_object()) else {
        return Err(not_a_change("it has no `dynamodb` object"));
    };
    let Some(name) = value.get("eventName").and_then(|n| n.as_str()) else {
        return Err(not_a_change("it has no `eventName`"));
    };
    let Some(kind) = ChangeKind::from_event_name(name) else {
        return Err(problem(unknown_event_name(name), event_id));
    };
    let Some(table_name) = value
        .get("tableName")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
    else {
        return Err(not_a_change(
            "it has no `tableName` (every change Kinesis Data Streams for DynamoDB writes names its table)",
        ));
    };
    let image = |section: &str| -> Result<Option<Image>, DecodeProblem> {
        match stream.get(section) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(json) => match serde_json::from_value::<Item>(json.clone()) {
                Ok(item) if item.is_empty() => Ok(None),
                Ok(item) => Ok(Some(item.into())),
                Err(error) => Err(problem(
                    format!("`dynamodb.{section}` is not a DynamoDB item: {error}"),
                    event_id,
                )),
            },
        }
    };
    let Some(keys) = image("Keys")? else {
        return Err(problem("the change has no Keys".to_string(), event_id));
    };
    let new_image = image("NewImage")?;
    let old_image = image("OldImage")?;
    let ttl_expiry = value.get("userIdentity").is_some_and(|id| {
        id.get("type").and_then(|t| t.as_str()) == Some("Service")
            && id.get("principalId").and_then(|p| p.as_str()) == Some("dynamodb.amazonaws.com")
    });
    let approximate_creation_ms = creation_ms(stream);
    let change = ChangeRecord {
        event_id: event_id.unwrap_or_default().to_string(),
        kind,
        keys,
        old_image,
        new_image,
        sequence_number: SequenceNumber(meta.sequence_number.to_string()),
        approximate_creation_ms,
        ttl_expiry,
        view_type: Some(ViewType::NewAndOldImages).filter(|_| kind != ChangeKind::Remove),
        size_bytes: stream.get("SizeBytes").and_then(|s| s.as_i64()),
        origin: Origin::Kinesis {
            stream_arn: meta.stream_arn.map(str::to_string),
            shard_id: meta.shard_id.map(str::to_string),
            table_name: table_name.to_string(),
        },
    };
    super::check(&change).map_err(|reason| problem(reason, event_id))?;
    Ok(change)
}

/// `ApproximateCreationDateTime` in milliseconds: the table's setting says
/// whether it is in milliseconds (the default) or microseconds
/// (`ApproximateCreationDateTimePrecision`); without the setting, a value
/// past the year 5138 in milliseconds is taken for microseconds.
fn creation_ms(stream: &serde_json::Value) -> Option<i64> {
    let value = stream.get("ApproximateCreationDateTime")?;
    let number = value
        .as_i64()
        .or_else(|| value.as_f64().map(|f| f as i64))?;
    let micro = match stream
        .get("ApproximateCreationDateTimePrecision")
        .and_then(|p| p.as_str())
    {
        Some("MICROSECOND") => true,
        Some(_) => false,
        None => number > 100_000_000_000_000,
    };
    Some(if micro { number / 1000 } else { number })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> KinesisMeta<'static> {
        KinesisMeta {
            sequence_number: "49590338271490256608559692538361571095921575989136588898",
            stream_arn: Some("arn:aws:kinesis:us-east-1:123456789012:stream/changes"),
            shard_id: Some("shardId-000000000000"),
        }
    }

    fn change(precision: Option<&str>, at: i64) -> serde_json::Value {
        let mut stream = serde_json::json!({
            "ApproximateCreationDateTime": at,
            "Keys": {"PK": {"S": "USER#1"}, "SK": {"S": "PROFILE"}},
            "NewImage": {"PK": {"S": "USER#1"}, "SK": {"S": "PROFILE"}, "name": {"S": "Sam"}},
            "SizeBytes": 60,
        });
        if let Some(precision) = precision {
            stream["ApproximateCreationDateTimePrecision"] = precision.into();
        }
        serde_json::json!({
            "awsRegion": "us-east-1",
            "eventID": "0a1b",
            "eventName": "INSERT",
            "userIdentity": null,
            "recordFormat": "application/json",
            "tableName": "social",
            "dynamodb": stream,
            "eventSource": "aws:dynamodb",
        })
    }

    #[test]
    fn a_change_decodes_with_the_kinesis_sequence_number_and_its_table() {
        let data = change(None, 1_646_958_389_419).to_string();
        let record = decode_kinesis_data(0, data.as_bytes(), meta()).expect("decodes");
        assert_eq!(record.kind, ChangeKind::Insert);
        assert_eq!(record.sequence_number.as_str(), meta().sequence_number);
        assert_eq!(record.approximate_creation_ms, Some(1_646_958_389_419));
        assert_eq!(record.event_id, "0a1b");
        assert!(
            matches!(&record.origin, Origin::Kinesis { table_name, .. } if table_name == "social")
        );
        assert_eq!(record.key_string("PK"), Some("USER#1"));
    }

    #[test]
    fn microsecond_times_become_milliseconds() {
        for (precision, at) in [
            (Some("MICROSECOND"), 1_646_958_389_419_123),
            (Some("MILLISECOND"), 1_646_958_389_419),
            (None, 1_646_958_389_419_123),
        ] {
            let data = change(precision, at).to_string();
            let record = decode_kinesis_data(0, data.as_bytes(), meta()).expect("decodes");
            assert_eq!(
                record.approximate_creation_ms,
                Some(1_646_958_389_419),
                "{precision:?}"
            );
        }
    }

    #[test]
    fn a_ttl_delete_is_told() {
        let mut value = change(None, 1);
        value["eventName"] = "REMOVE".into();
        value["dynamodb"]
            .as_object_mut()
            .unwrap()
            .remove("NewImage");
        value["userIdentity"] =
            serde_json::json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"});
        let record = decode_kinesis_data(0, value.to_string().as_bytes(), meta()).expect("decodes");
        assert!(record.ttl_expiry);
        assert_eq!(record.kind, ChangeKind::Remove);
    }

    #[test]
    fn bad_data_is_a_problem_naming_what_is_wrong_and_keeping_the_record() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{\"hello\": 1}".to_vec(), "no `dynamodb` object"),
            (b"not json".to_vec(), "not JSON"),
            (b"[1,2]".to_vec(), "not a JSON object"),
            (
                {
                    let mut v = change(None, 1);
                    v.as_object_mut().unwrap().remove("tableName");
                    v.to_string().into_bytes()
                },
                "no `tableName`",
            ),
            (
                {
                    let mut v = change(None, 1);
                    v["eventName"] = "PUT".into();
                    v.to_string().into_bytes()
                },
                "unknown eventName `PUT`",
            ),
            (
                {
                    let mut v = change(None, 1);
                    v["dynamodb"]["Keys"] = serde_json::json!({"PK": {"Q": 1}});
                    v.to_string().into_bytes()
                },
                "`dynamodb.Keys` is not a DynamoDB item",
            ),
        ];
        for (data, expected) in cases {
            let problem = decode_kinesis_data(3, &data, meta()).expect_err("a problem");
            assert!(problem.reason.contains(expected), "{}", problem.reason);
            assert_eq!(problem.index, 3);
            assert_eq!(
                problem.sequence_number.as_deref(),
                Some(meta().sequence_number)
            );
            let kept = problem.raw["kinesis"]["data"].as_str().unwrap();
            assert_eq!(aws_smithy_types::base64::decode(kept).unwrap(), data);
        }
    }

    #[test]
    fn a_lambda_record_with_truncated_base64_is_a_problem_with_its_sequence_number() {
        let data = aws_smithy_types::base64::encode(change(None, 1).to_string());
        let raw = serde_json::json!({
            "eventSource": "aws:kinesis",
            "eventID": "shardId-000000000000:4959",
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/changes",
            "kinesis": {"sequenceNumber": "4959", "data": &data[..data.len() - 3], "partitionKey": "x"},
        });
        let problem = decode_kinesis_lambda_record(0, &raw).expect_err("a problem");
        assert!(
            problem.reason.contains("not valid base64"),
            "{}",
            problem.reason
        );
        assert_eq!(problem.sequence_number.as_deref(), Some("4959"));
        assert_eq!(problem.raw, raw);
        // The whole data decodes, with the shard from the event id.
        let mut whole = raw.clone();
        whole["kinesis"]["data"] = data.into();
        let record = decode_kinesis_lambda_record(0, &whole).expect("decodes");
        assert!(
            matches!(&record.origin, Origin::Kinesis { shard_id: Some(s), .. } if s == "shardId-000000000000")
        );
    }
}
