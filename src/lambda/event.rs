//! The invocation payload: a Lambda DynamoDB Streams event, decoded record
//! by record while it is read.
//!
//! Each record is read as JSON on its own and decoded with
//! [`decode_lambda_record`], so one malformed record becomes a
//! [`crate::decode::DecodeProblem`] in its place (and is dead-lettered)
//! instead of failing the whole event, and the event is never held twice in
//! memory (once as JSON, once decoded). A body that is not a Streams event
//! at all fails deserialization, which the runtime reports as an
//! invocation error before anything is written.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::decode::{decode_lambda_record, Decoded, LambdaEventError};

/// A decoded DynamoDB Streams event.
#[derive(Debug, Default)]
pub struct StreamsEvent {
    /// The records, in stream order.
    pub records: Decoded,
    /// The first `eventSourceARN` of the batch (the stream ARN).
    pub event_source_arn: Option<String>,
}

impl<'de> Deserialize<'de> for StreamsEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = StreamsEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a DynamoDB Streams event (an object with a `Records` array)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StreamsEvent, A::Error> {
        let mut event = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "Records" && event.is_none() {
                event = Some(map.next_value_seed(RecordsSeed)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        event.ok_or_else(|| de::Error::custom(LambdaEventError::NoRecords))
    }
}

struct RecordsSeed;

impl<'de> DeserializeSeed<'de> for RecordsSeed {
    type Value = StreamsEvent;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<StreamsEvent, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RecordsSeed {
    type Value = StreamsEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the `Records` array of a DynamoDB Streams event")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StreamsEvent, A::Error> {
        let mut event = StreamsEvent {
            records: Vec::with_capacity(seq.size_hint().unwrap_or(0)),
            event_source_arn: None,
        };
        while let Some(raw) = seq.next_element::<serde_json::Value>()? {
            if event.event_source_arn.is_none() {
                event.event_source_arn = raw
                    .get("eventSourceARN")
                    .and_then(|arn| arn.as_str())
                    .map(str::to_string);
            }
            let index = event.records.len();
            event.records.push(decode_lambda_record(index, &raw));
        }
        // The records stay for the whole invocation; the growth slack need not.
        event.records.shrink_to_fit();
        Ok(event)
    }
}

/// The table name in a stream ARN
/// (`arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL`).
pub fn table_from_stream_arn(arn: &str) -> Option<&str> {
    let resource = arn.splitn(6, ':').nth(5)?;
    let rest = resource.strip_prefix("table/")?;
    let (name, _) = rest.split_once("/stream/")?;
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_lambda_event;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        std::fs::read(path).expect("fixture")
    }

    #[test]
    fn decodes_like_decode_lambda_event() {
        for name in ["lambda-event.json", "lambda-event-ttl.json"] {
            let bytes = fixture(name);
            let event: StreamsEvent = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                event.records,
                decode_lambda_event(&bytes).unwrap(),
                "{name}"
            );
            assert_eq!(
                event.event_source_arn.as_deref(),
                Some("arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210")
            );
        }
    }

    #[test]
    fn one_bad_record_stays_in_its_place() {
        let mut event: serde_json::Value =
            serde_json::from_slice(&fixture("lambda-event.json")).unwrap();
        event["Records"][2]["eventName"] = "TRUNCATE".into();
        event["Records"][4]["dynamodb"] = serde_json::json!(7);
        let bytes = serde_json::to_vec(&event).unwrap();
        let decoded: StreamsEvent = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(decoded.records.len(), 6);
        let bad: Vec<usize> = decoded
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_err())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(bad, [2, 4]);
        assert_eq!(decoded.records, decode_lambda_event(&bytes).unwrap());
    }

    #[test]
    fn a_body_that_is_not_a_streams_event_is_refused() {
        let no_records = serde_json::from_str::<StreamsEvent>(r#"{"Items": []}"#).unwrap_err();
        assert!(
            no_records.to_string().contains("no `Records` array"),
            "{no_records}"
        );
        let array = serde_json::from_str::<StreamsEvent>("[1, 2]").unwrap_err();
        assert!(
            array.to_string().contains("a DynamoDB Streams event"),
            "{array}"
        );
        let bad_records = serde_json::from_str::<StreamsEvent>(r#"{"Records": 3}"#).unwrap_err();
        assert!(
            bad_records.to_string().contains("`Records` array"),
            "{bad_records}"
        );
        assert!(serde_json::from_str::<StreamsEvent>("not json").is_err());
    }

    #[test]
    fn tables_come_from_stream_arns() {
        assert_eq!(
            table_from_stream_arn(
                "arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210"
            ),
            Some("UserServiceTable")
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:dynamodb:ddblocal:000000000000:table/a-b.c_1/stream/2026-01-01T00:00:00.000"),
            Some("a-b.c_1")
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:dynamodb:us-east-1:1:table/T"),
            None
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:kinesis:us-east-1:1:stream/T"),
            None
        );
        assert_eq!(table_from_stream_arn("nonsense"), None);
    }
}
