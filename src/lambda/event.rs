//! The invocation payload: a Lambda DynamoDB Streams event, decoded record
//! by record while it is read, or a backfill request.
//!
//! [`Payload`] tells the two apart by shape while reading: an object with a
//! `Records` array is a stream event, an object with a `backfill` object is
//! a backfill request ([`BackfillRequest`]), an object with an `audit`
//! object an audit request ([`AuditRequest`]); anything else is refused
//! with a message naming all three.
//!
//! Each record is kept as its JSON text and decoded on its own, a chunk at
//! a time, with [`decode_lambda_record_json`], so one malformed record
//! becomes a [`crate::decode::DecodeProblem`] in its place (and is
//! dead-lettered) instead of failing the whole event, and the batch is
//! never held decoded whole. A body that is not a Streams event
//! at all fails deserialization, which the runtime reports as an
//! invocation error before anything is written.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::audit::AuditRequest;
use super::backfill::BackfillRequest;
use crate::decode::{decode_lambda_record_json, Decoded, LambdaEventError};

/// Decodes one record of a Lambda Kinesis event from its JSON text.
fn decode_kinesis_record_json(
    index: usize,
    json: &str,
) -> Result<crate::record::ChangeRecord, crate::decode::DecodeProblem> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(raw) => crate::decode::decode_kinesis_lambda_record(index, &raw),
        Err(error) => Err(crate::decode::DecodeProblem {
            index,
            event_id: None,
            sequence_number: None,
            reason: format!("the record is not valid JSON: {error}"),
            raw: serde_json::Value::String(json.to_string()),
        }),
    }
}

/// What one invocation carries.
#[derive(Debug)]
pub enum Payload {
    /// A batch of the table's stream (`{"Records": [...]}`).
    Stream(StreamsEvent),
    /// A backfill slice (`{"backfill": {...}}`).
    Backfill(BackfillRequest),
    /// An audit slice or merge (`{"audit": {...}}`).
    Audit(AuditRequest),
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PayloadVisitor)
    }
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a DynamoDB Streams event (an object with a `Records` array), a backfill request (an object with a `backfill` object) or an audit request (an object with an `audit` object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
        let mut stream = None;
        let mut backfill = None;
        let mut audit = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "Records" && stream.is_none() {
                // Decoded record by record, as a plain stream event is.
                stream = Some(map.next_value_seed(RecordsSeed)?);
            } else if key == "backfill" && backfill.is_none() {
                backfill = Some(map.next_value_seed(BackfillSeed)?);
            } else if key == "audit" && audit.is_none() {
                audit = Some(map.next_value_seed(AuditSeed)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        match (stream, backfill, audit) {
            (Some(event), None, None) => Ok(Payload::Stream(event)),
            (None, Some(request), None) => Ok(Payload::Backfill(request)),
            (None, None, Some(request)) => Ok(Payload::Audit(request)),
            (None, None, None) => Err(de::Error::custom(
                "the payload has no `Records` array, no `backfill` object and no `audit` object: it is neither a DynamoDB Streams event nor a backfill request ({\"backfill\": {\"segment\": 0, \"totalSegments\": 1}}) nor an audit request ({\"audit\": {\"run\": \"nightly\", \"segment\": 0, \"totalSegments\": 1}})",
            )),
            (stream, backfill, audit) => {
                let named: Vec<&str> = [
                    stream.map(|_| "a `Records` array"),
                    backfill.map(|_| "a `backfill` object"),
                    audit.map(|_| "an `audit` object"),
                ]
                .into_iter()
                .flatten()
                .collect();
                Err(de::Error::custom(format!(
                    "the payload has both {}: send a DynamoDB Streams event, a backfill request or an audit request, one at a time",
                    named.join(" and ")
                )))
            }
        }
    }
}

/// A DynamoDB Streams event: its records as received, decoded a chunk at a
/// time ([`StreamsEvent::decode`]), so that a batch of 10,000 records is
/// never held decoded whole (the JSON is a third of the decoded size).
#[derive(Debug, Default)]
pub struct StreamsEvent {
    records: Records,
    /// The first `eventSourceARN` of the batch (the stream ARN).
    pub event_source_arn: Option<String>,
    /// The first record whose `eventSourceARN` names another table than
    /// the first record's (a hand-made pipeline mixing streams): its
    /// index and ARN.
    other_table: Option<(usize, String)>,
    /// The records are a Kinesis stream's (`eventSource` `aws:kinesis`),
    /// each carrying a DynamoDB change of the table it names.
    pub kinesis: bool,
}

#[derive(Debug)]
enum Records {
    /// Each record's JSON, in stream order (an invocation's payload).
    Json(Vec<Box<RawValue>>),
    /// Records decoded already (built by a caller of the library).
    Decoded(Decoded),
}

impl Default for Records {
    fn default() -> Self {
        Records::Json(Vec::new())
    }
}

impl StreamsEvent {
    /// An event of records decoded already (for callers of the handler
    /// that read records some other way, and tests).
    pub fn from_records(records: Decoded, event_source_arn: Option<String>) -> StreamsEvent {
        StreamsEvent {
            records: Records::Decoded(records),
            event_source_arn,
            other_table: None,
            kinesis: false,
        }
    }

    /// An event of Kinesis records decoded already: each a DynamoDB change
    /// routed by its table (for callers of the handler and tests).
    pub fn from_kinesis_records(
        records: Decoded,
        event_source_arn: Option<String>,
    ) -> StreamsEvent {
        StreamsEvent {
            kinesis: true,
            ..StreamsEvent::from_records(records, event_source_arn)
        }
    }

    /// The first record of another table than the first record's: its
    /// index and its stream's ARN.
    pub fn other_table(&self) -> Option<&(usize, String)> {
        self.other_table.as_ref()
    }

    /// The records of the first record's table, and, when the batch goes
    /// on with another table's records, the first of them (index, its
    /// stream's ARN): those are left out, to be delivered again.
    pub fn split_at_other_table(mut self) -> (StreamsEvent, Option<(usize, String)>) {
        let other = self.other_table.take();
        if let (Some((index, _)), Records::Json(raw)) = (&other, &mut self.records) {
            raw.truncate(*index);
        }
        (self, other)
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        match &self.records {
            Records::Json(raw) => raw.len(),
            Records::Decoded(records) => records.len(),
        }
    }

    /// Whether the batch has no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decodes the records in `range` (indexes are the batch's); a record
    /// that does not decode is a [`crate::decode::DecodeProblem`] in its place.
    pub fn decode(&self, range: Range<usize>) -> Decoded {
        match &self.records {
            Records::Json(raw) if self.kinesis => range
                .map(|index| decode_kinesis_record_json(index, raw[index].get()))
                .collect(),
            Records::Json(raw) => range
                .map(|index| decode_lambda_record_json(index, raw[index].get()))
                .collect(),
            Records::Decoded(records) => records[range].to_vec(),
        }
    }

    /// Decodes every record.
    pub fn records(&self) -> Decoded {
        self.decode(0..self.len())
    }

    /// The event id and sequence number of record `index`, if it has them.
    pub fn identity(&self, index: usize) -> (Option<String>, Option<String>) {
        match self.decode(index..index + 1).pop() {
            Some(Ok(record)) => (Some(record.event_id), Some(record.sequence_number.0)),
            Some(Err(problem)) => (problem.event_id, problem.sequence_number),
            None => (None, None),
        }
    }

    /// Every record as the ledger of deliveries records it: its event id,
    /// its item in `table`, its sequence number.
    pub fn delivered(&self, table: &crate::spec::TableSpec) -> Vec<crate::apply::Delivered> {
        // A chunk at a time: what is kept of a record is small.
        (0..self.len())
            .step_by(1000)
            .flat_map(|start| self.decode(start..(start + 1000).min(self.len())))
            .map(|decoded| match decoded {
                Ok(record) => crate::apply::Delivered {
                    item: table.item_key(&record.keys),
                    event_id: record.event_id,
                    sequence_number: record.sequence_number,
                },
                Err(problem) => crate::apply::Delivered {
                    item: crate::apply::problem_key(&problem, table),
                    event_id: problem.event_id.unwrap_or_default(),
                    sequence_number: crate::record::SequenceNumber(
                        problem.sequence_number.unwrap_or_default(),
                    ),
                },
            })
            .collect()
    }
}

impl<'de> Deserialize<'de> for StreamsEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

/// Reads the `backfill` object, and only an object: a derived struct would
/// also take an array of its fields in order, whose errors mislead.
struct AuditSeed;

impl<'de> DeserializeSeed<'de> for AuditSeed {
    type Value = AuditRequest;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<AuditRequest, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AuditSeed {
    type Value = AuditRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "an `audit` object such as {\"run\": \"nightly\", \"segment\": 0, \"totalSegments\": 4}",
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<AuditRequest, A::Error> {
        AuditRequest::deserialize(de::value::MapAccessDeserializer::new(map))
    }
}

struct BackfillSeed;

impl<'de> DeserializeSeed<'de> for BackfillSeed {
    type Value = BackfillRequest;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<BackfillRequest, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BackfillSeed {
    type Value = BackfillRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a `backfill` object such as {\"segment\": 0, \"totalSegments\": 4}")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BackfillRequest, A::Error> {
        BackfillRequest::deserialize(de::value::MapAccessDeserializer::new(map))
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
        #[derive(Deserialize)]
        struct Source<'a> {
            #[serde(rename = "eventSourceARN", borrow)]
            arn: Option<std::borrow::Cow<'a, str>>,
            #[serde(rename = "eventSource", borrow)]
            source: Option<std::borrow::Cow<'a, str>>,
        }
        let mut raw: Vec<Box<RawValue>> = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        let mut event_source_arn: Option<String> = None;
        let mut other_table = None;
        let mut kinesis = false;
        while let Some(record) = seq.next_element::<Box<RawValue>>()? {
            let source = serde_json::from_str::<Source>(record.get()).ok();
            let (arn, from) = match source {
                Some(source) => (source.arn, source.source),
                None => (None, None),
            };
            match (&event_source_arn, arn) {
                (None, arn) if raw.is_empty() => {
                    kinesis = from.as_deref() == Some("aws:kinesis");
                    event_source_arn = arn.map(|arn| arn.into_owned());
                }
                // A Kinesis stream's records name their tables in their data.
                _ if kinesis => {}
                (Some(first), Some(arn))
                    if other_table.is_none()
                        && table_from_stream_arn(first) != table_from_stream_arn(&arn) =>
                {
                    other_table = Some((raw.len(), arn.into_owned()));
                }
                _ => {}
            }
            raw.push(record);
        }
        // The records stay for the whole invocation; the growth slack need not.
        raw.shrink_to_fit();
        Ok(StreamsEvent {
            records: Records::Json(raw),
            event_source_arn,
            other_table,
            kinesis,
        })
    }
}

pub use crate::dynamo::arn::table_from_stream_arn;

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
                event.records(),
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
        assert_eq!(decoded.len(), 6);
        let bad: Vec<usize> = decoded
            .records()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_err())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(bad, [2, 4]);
        assert_eq!(decoded.records(), decode_lambda_event(&bytes).unwrap());
        assert_eq!(decoded.decode(2..5)[..], decoded.records()[2..5]);
    }

    #[test]
    fn a_payload_with_records_is_a_stream_event_decoded_as_before() {
        for name in ["lambda-event.json", "lambda-event-ttl.json"] {
            let bytes = fixture(name);
            let Payload::Stream(event) = serde_json::from_slice::<Payload>(&bytes).unwrap() else {
                panic!("{name}: not read as a stream event");
            };
            assert_eq!(
                event.records(),
                decode_lambda_event(&bytes).unwrap(),
                "{name}"
            );
            assert!(event.event_source_arn.is_some());
        }
        // Other keys beside `Records` are ignored, as before.
        let payload: Payload =
            serde_json::from_str(r#"{"note": {"backfill": 1}, "Records": []}"#).unwrap();
        assert!(matches!(payload, Payload::Stream(event) if event.is_empty()));
    }

    #[test]
    fn a_payload_with_backfill_is_a_backfill_request() {
        let payload: Payload = serde_json::from_str(
            r#"{"backfill": {"projections": ["email-gsi1-keys"], "segment": 1, "totalSegments": 4, "maxWcu": 100}}"#,
        )
        .unwrap();
        let Payload::Backfill(request) = payload else {
            panic!("not read as a backfill request");
        };
        assert_eq!(
            request,
            BackfillRequest {
                projections: Some(vec!["email-gsi1-keys".to_string()]),
                segment: 1,
                total_segments: 4,
                max_wcu: Some(100.0),
                ..BackfillRequest::default()
            }
        );
        let payload: Payload = serde_json::from_str(r#"{"backfill": {}}"#).unwrap();
        assert!(matches!(payload, Payload::Backfill(r) if r == BackfillRequest::default()));
    }

    #[test]
    fn a_payload_with_audit_is_an_audit_request() {
        let payload: Payload = serde_json::from_str(
            r#"{"audit": {"run": "nightly", "segment": 2, "totalSegments": 4, "repair": true}}"#,
        )
        .unwrap();
        let Payload::Audit(request) = payload else {
            panic!("not read as an audit request");
        };
        assert_eq!(request.run, "nightly");
        assert_eq!((request.segment, request.total_segments), (2, 4));
        assert_eq!(request.repair, Some(true));
        assert_eq!(request.merge, None);
    }

    #[test]
    fn a_payload_of_another_shape_is_refused_naming_every_kind() {
        let message = |body: &str| {
            serde_json::from_str::<Payload>(body)
                .unwrap_err()
                .to_string()
        };
        for body in [r#"{"Items": []}"#, "{}", r#"{"Backfill": {}}"#] {
            let text = message(body);
            assert!(
                text.contains("no `Records` array, no `backfill` object and no `audit` object"),
                "{body}: {text}"
            );
        }
        for body in ["[1, 2]", "3", r#""backfill""#, "null"] {
            let text = message(body);
            assert!(
                text.contains("a DynamoDB Streams event")
                    && text.contains("a backfill request")
                    && text.contains("an audit request"),
                "{body}: {text}"
            );
        }
        let both = message(r#"{"Records": [], "backfill": {}}"#);
        assert!(
            both.contains("both a `Records` array and a `backfill` object"),
            "{both}"
        );
        let three = message(r#"{"Records": [], "audit": {"run": "r"}, "backfill": {}}"#);
        assert!(
            three.contains("both a `Records` array and a `backfill` object and an `audit` object"),
            "{three}"
        );
        let audit = message(r#"{"audit": {"run": "r", "segmnet": 1}}"#);
        assert!(audit.contains("unknown field `segmnet`"), "{audit}");
        let records = message(r#"{"Records": 3}"#);
        assert!(records.contains("`Records` array"), "{records}");
        let backfill = message(r#"{"backfill": [0, 4]}"#);
        assert!(backfill.contains("a `backfill` object"), "{backfill}");
        let field = message(r#"{"backfill": {"segments": [0, 1]}}"#);
        assert!(field.contains("unknown field `segments`"), "{field}");
        assert!(serde_json::from_str::<Payload>("not json").is_err());
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
}
