//! The fast path of Lambda event decoding: records read with `sonic-rs`
//! straight into the record model.
//!
//! `aws_lambda_events::EventRecord` keeps every unknown field
//! (`#[serde(flatten)]`, which buffers each record before reading it) and
//! owns every string of every image; reading 10,000 records that way cost
//! more than all the planning. [`FastRecord`] reads only what a
//! [`ChangeRecord`] keeps, images straight into [`Image`]s.
//!
//! It is a fast path, not a second definition of the format: it accepts
//! a subset of what `EventRecord` accepts, and whatever it accepts decodes
//! to the record `EventRecord` gives. The tests below compare the two on
//! the fixtures, on JSON edge cases and on generated events; the
//! `lambda_event` fuzz target compares them on every input.
//!
//! - Everything is read through [`Guarded`]: `sonic-rs` recurses without
//!   a depth limit when it skips a value, and under `Guarded` it never does.
//! - It knows every field Lambda writes and refuses any other, so no value
//!   is skipped unread (`serde_json` refuses a number beyond `f64`, even in
//!   a field nothing keeps).
//! - Kept maps and lists nest at most DynamoDB's 32 levels.
//! - It checks the fields `EventRecord` requires, with their types.
//!
//! Anything it refuses (an unknown `eventName`, a malformed field) goes the
//! slow way, which gives the problem its exact message.

use std::fmt;

use chrono::{LocalResult, TimeZone, Utc};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::guarded::Guarded;
use super::{DecodeProblem, Decoded};
use crate::record::{ChangeKind, ChangeRecord, Image, Origin, SequenceNumber, ViewType};

/// One record of a Lambda DynamoDB Streams event; the fields and their
/// rules are `EventRecord`'s.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FastRecord {
    #[serde(rename = "dynamodb")]
    change: FastChange,
    #[serde(rename = "eventID")]
    event_id: String,
    event_name: Kind,
    #[serde(rename = "eventSourceARN", default)]
    event_source_arn: Option<String>,
    #[serde(default)]
    user_identity: Option<Identity>,
    // Read to be checked only (EventRecord requires them to be strings).
    #[allow(dead_code)]
    aws_region: Text,
    #[allow(dead_code)]
    #[serde(default)]
    event_source: Option<Text>,
    #[allow(dead_code)]
    #[serde(default)]
    event_version: Option<Text>,
    #[allow(dead_code)]
    #[serde(default)]
    record_format: Option<Text>,
    #[allow(dead_code)]
    #[serde(default)]
    table_name: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastChange {
    #[serde(rename = "ApproximateCreationDateTime", default)]
    approximate_creation: Millis,
    #[allow(dead_code)]
    #[serde(rename = "ApproximateCreationDateTimePrecision", default)]
    approximate_creation_precision: Option<Text>,
    #[serde(rename = "Keys", default)]
    keys: Option<Keys>,
    #[serde(rename = "NewImage", default)]
    new_image: Option<Image>,
    #[serde(rename = "OldImage", default)]
    old_image: Option<Image>,
    #[serde(rename = "SequenceNumber", default)]
    sequence_number: Option<String>,
    #[serde(rename = "SizeBytes")]
    size_bytes: i64,
    #[serde(rename = "StreamViewType", default)]
    stream_view_type: Option<View>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Identity {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(rename = "principalId", default)]
    principal_id: String,
}

/// `Keys`: an image of one or two attributes.
struct Keys(Image);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Keys, D::Error> {
        Image::deserialize_sized(deserializer, 2, 48).map(Keys)
    }
}

/// `eventName`, one this version knows (any other goes the slow way).
struct Kind(ChangeKind);

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Kind, D::Error> {
        let name = Named("INSERT, MODIFY or REMOVE", ChangeKind::from_event_name);
        deserializer.deserialize_str(name).map(Kind)
    }
}

/// `StreamViewType`, by name (any other form goes the slow way).
struct View(ViewType);

impl<'de> Deserialize<'de> for View {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<View, D::Error> {
        let name = Named("a stream view type", ViewType::from_name);
        deserializer.deserialize_str(name).map(View)
    }
}

/// Reads a string naming one of a type's values: what it expects, and
/// the name's parser.
struct Named<T>(&'static str, fn(&str) -> Option<T>);

impl<T> Visitor<'_> for Named<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<T, E> {
        (self.1)(name).ok_or_else(|| E::invalid_value(de::Unexpected::Str(name), &self))
    }
}

/// A string whose value is not kept.
struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        deserializer.deserialize_str(Named("a string", |_| Some(Text)))
    }
}

/// `ApproximateCreationDateTime` in milliseconds, converted as
/// `aws_lambda_events` converts it (whole seconds; a fraction as it does).
#[derive(Default)]
struct Millis(i64);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Millis, D::Error> {
        struct SecondsVisitor;
        impl Visitor<'_> for SecondsVisitor {
            type Value = Millis;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a unix timestamp")
            }

            fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Millis, E> {
                millis(Utc.timestamp_opt(seconds as i64, 0))
            }

            fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Millis, E> {
                millis(Utc.timestamp_opt(seconds, 0))
            }

            fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Millis, E> {
                let nanos = (seconds.fract() * 1_000_000.).floor() as u32;
                millis(Utc.timestamp_opt(seconds.trunc() as i64, nanos))
            }
        }
        deserializer.deserialize_f64(SecondsVisitor)
    }
}

fn millis<E: de::Error>(time: LocalResult<chrono::DateTime<Utc>>) -> Result<Millis, E> {
    match time {
        LocalResult::Single(time) => Ok(Millis(time.timestamp_millis())),
        _ => Err(E::custom("not a legal timestamp")),
    }
}

impl FastRecord {
    /// The record, or `None` when it fails a check (the caller decodes it
    /// the slow way, which says why).
    fn into_record(self) -> Option<ChangeRecord> {
        let ttl_expiry = self
            .user_identity
            .is_some_and(|id| id.kind == "Service" && id.principal_id == "dynamodb.amazonaws.com");
        let change = self.change;
        let non_empty = |image: Option<Image>| image.filter(|image| !image.is_empty());
        let record = ChangeRecord {
            event_id: self.event_id,
            kind: self.event_name.0,
            keys: change.keys.map(|keys| keys.0).unwrap_or_default(),
            old_image: non_empty(change.old_image),
            new_image: non_empty(change.new_image),
            sequence_number: SequenceNumber(change.sequence_number.unwrap_or_default()),
            approximate_creation_ms: (change.approximate_creation.0 != 0)
                .then_some(change.approximate_creation.0),
            ttl_expiry,
            view_type: change.stream_view_type.map(|view| view.0),
            size_bytes: Some(change.size_bytes),
            origin: Origin::Lambda {
                event_source_arn: self.event_source_arn,
            },
        };
        super::check(&record).is_ok().then_some(record)
    }
}

/// Decodes a whole event the fast way, straight into the batch: a record
/// that fails a check is an `Err` without a reason, for the caller to
/// decode the slow way. `None` if the event does not fit as a whole.
pub(super) fn event(bytes: &[u8]) -> Option<Decoded> {
    read::<FastEvent>(bytes).map(|event| event.0)
}

/// One JSON value of type `T`, read through [`Guarded`] (so `sonic-rs`
/// never skips a value), and nothing after it but whitespace.
fn read<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Option<T> {
    let mut deserializer = sonic_rs::Deserializer::from_slice(bytes);
    let value = T::deserialize(Guarded(&mut deserializer)).ok()?;
    deserializer.end().ok()?;
    Some(value)
}

/// `{"Records": [...]}`. Another key sends the event the slow way, whose
/// parser ignores it (`sonic-rs` would skip its value, which `Guarded`
/// refuses).
struct FastEvent(Decoded);

impl<'de> Deserialize<'de> for FastEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<FastEvent, D::Error> {
        struct EventVisitor;
        impl<'de> Visitor<'de> for EventVisitor {
            type Value = FastEvent;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a DynamoDB Streams event")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FastEvent, A::Error> {
                let mut records = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key != "Records" {
                        return Err(de::Error::unknown_field(&key, &["Records"]));
                    } else if records.is_some() {
                        return Err(de::Error::duplicate_field("Records"));
                    } else {
                        records = Some(map.next_value_seed(RecordsSeed)?);
                    }
                }
                records
                    .map(FastEvent)
                    .ok_or_else(|| de::Error::missing_field("Records"))
            }
        }
        deserializer.deserialize_map(EventVisitor)
    }
}

/// The `Records` array, each record converted as soon as it is read.
struct RecordsSeed;

impl<'de> DeserializeSeed<'de> for RecordsSeed {
    type Value = Decoded;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Decoded, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RecordsSeed {
    type Value = Decoded;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Decoded, A::Error> {
        let mut records = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(record) = seq.next_element::<FastRecord>()? {
            let index = records.len();
            records.push(record.into_record().ok_or_else(|| DecodeProblem {
                index,
                event_id: None,
                sequence_number: None,
                reason: String::new(),
                raw: serde_json::Value::Null,
            }));
        }
        Ok(records)
    }
}

/// Decodes one record's JSON the fast way; `None` if it does not fit.
pub(super) fn record(json: &str) -> Option<ChangeRecord> {
    read::<FastRecord>(json.as_bytes())?.into_record()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;
    use crate::decode::decode_lambda_record;

    /// The slow way, record by record from JSON values.
    fn slow(event: &Value) -> Vec<Result<ChangeRecord, String>> {
        event["Records"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(index, raw)| decode_lambda_record(index, raw).map_err(|p| p.reason))
            .collect()
    }

    #[test]
    fn the_fixtures_decode_the_fast_way_exactly_as_the_slow_way() {
        for name in ["lambda-event.json", "lambda-event-ttl.json"] {
            let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
            let bytes = std::fs::read(&path).unwrap();
            let fast: Vec<ChangeRecord> = event(&bytes)
                .unwrap_or_else(|| panic!("{name}: the fast way refused the event"))
                .into_iter()
                .map(|record| record.expect("every fixture record"))
                .collect();
            let slow = slow(&serde_json::from_slice(&bytes).unwrap());
            assert_eq!(fast.len(), slow.len(), "{name}");
            for (fast, slow) in fast.iter().zip(&slow) {
                assert_eq!(Ok(fast), slow.as_ref(), "{name}");
            }
            assert!(fast.iter().any(|r| r.ttl_expiry) == name.contains("ttl"));
        }
    }

    fn text() -> impl Strategy<Value = String> {
        // Escapes, quotes, non-ASCII and astral characters, empty strings.
        prop_oneof![
            "[a-zA-Z0-9#@._-]{0,12}",
            any::<String>(),
            Just("caf\u{e9} \"q\" \\ \n \u{1f600}".to_string()),
        ]
    }

    fn value(depth: u32) -> BoxedStrategy<Value> {
        let leaf = prop_oneof![
            text().prop_map(|s| json!({ "S": s })),
            prop_oneof![
                Just("0850".to_string()),
                Just("-1.5e3".to_string()),
                "[0-9]{1,6}"
            ]
            .prop_map(|n| json!({ "N": n })),
            any::<bool>().prop_map(|b| json!({ "BOOL": b })),
            any::<bool>().prop_map(|b| json!({ "NULL": b })),
            Just(json!({ "B": "aGVsbG8=" })),
            prop::collection::vec(text(), 1..3).prop_map(|s| json!({ "SS": s })),
            Just(json!({ "NS": ["1", "2.5"] })),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        prop_oneof![
            4 => leaf,
            1 => prop::collection::vec(value(depth - 1), 0..3).prop_map(|l| json!({ "L": l })),
            1 => prop::collection::btree_map(text(), value(depth - 1), 0..3)
                .prop_map(|m| json!({ "M": m })),
        ]
        .boxed()
    }

    fn image() -> impl Strategy<Value = Option<Value>> {
        prop::option::of(
            prop::collection::btree_map(text(), value(2), 0..8).prop_map(|attributes| {
                let mut map = serde_json::Map::new();
                map.insert("PK".into(), json!({ "S": "USER#u1" }));
                for (name, value) in attributes {
                    map.insert(name, value);
                }
                Value::Object(map)
            }),
        )
    }

    prop_compose! {
        fn raw_record()(
            name in prop::sample::select(vec!["INSERT", "MODIFY", "REMOVE"]),
            old in image(),
            new in image(),
            ttl in any::<bool>(),
            seconds in prop_oneof![
                Just(json!(1_795_326_360)),
                Just(json!(1_795_326_360.5)),
                Just(json!(0)),
                (0i64..4_000_000_000).prop_map(|s| json!(s)),
            ],
            view in prop::sample::select(vec![
                "KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES",
            ]),
            arn in prop::option::of(text()),
            seq in "[0-9]{1,40}",
        ) -> Value {
            let mut change = json!({
                "ApproximateCreationDateTime": seconds,
                "Keys": { "PK": { "S": "USER#u1" } },
                "SequenceNumber": seq,
                "SizeBytes": 180,
                "StreamViewType": view,
            });
            if let Some(old) = old {
                change["OldImage"] = old;
            }
            if let Some(new) = new {
                change["NewImage"] = new;
            }
            let mut record = json!({
                "eventID": "e1",
                "eventName": name,
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": "eu-west-1",
                "dynamodb": change,
            });
            if let Some(arn) = arn {
                record["eventSourceARN"] = json!(arn);
            }
            if ttl {
                record["userIdentity"] =
                    json!({ "type": "Service", "principalId": "dynamodb.amazonaws.com" });
            }
            record
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// What the fast way accepts, it decodes as the slow way does; what
        /// it refuses, the slow way decodes (or explains) instead.
        #[test]
        fn generated_records_decode_the_fast_way_exactly_as_the_slow_way(
            records in prop::collection::vec(raw_record(), 1..6),
        ) {
            let event = json!({ "Records": records });
            let slow = slow(&event);
            let text = serde_json::to_string(&event).unwrap();
            let decoded = crate::decode::decode_lambda_event(text.as_bytes()).unwrap();
            let decoded: Vec<_> = decoded.into_iter().map(|r| r.map_err(|p| p.reason)).collect();
            prop_assert_eq!(&decoded, &slow);
            for (raw, slow) in records.iter().zip(&slow) {
                let fast = record(&raw.to_string());
                match (fast, slow) {
                    (Some(fast), Ok(slow)) => prop_assert_eq!(&fast, slow),
                    (Some(fast), Err(reason)) => {
                        prop_assert!(false, "fast accepted {fast:?}; slow: {reason}")
                    }
                    // Refused records that pass the checks are the slow way's
                    // to decode; here only a failed check may refuse one.
                    (None, Ok(slow)) => prop_assert!(false, "fast refused {slow:?}"),
                    (None, Err(_)) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;
    use crate::decode::{decode_lambda_event, decode_lambda_record};

    /// Every value of the fixture, in turn, replaced by 100,000 nested
    /// arrays or objects, and an unknown key with such a value added to
    /// every object: the fast way refuses each at once, on a 256 KiB stack
    /// (`sonic-rs` skipping or describing the value would recurse 100,000
    /// levels and overflow it, aborting this test).
    #[test]
    fn a_deeply_nested_value_anywhere_is_refused_without_recursion() {
        const DEPTH: usize = 100_000;
        const HOLE: &str = "\u{1}deep\u{1}";
        fn paths(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    out.push(format!("{at}/\u{1}new"));
                    for (key, child) in map {
                        let key = key.replace('~', "~0").replace('/', "~1");
                        paths(child, format!("{at}/{key}"), out);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (index, child) in items.iter().enumerate() {
                        paths(child, format!("{at}/{index}"), out);
                    }
                }
                _ => {}
            }
            if !at.is_empty() {
                out.push(at);
            }
        }
        let path = format!(
            "{}/tests/fixtures/lambda-event.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let fixture: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let arrays = format!("{}{}", "[".repeat(DEPTH), "]".repeat(DEPTH));
        let objects = format!("{}1{}", r#"{"a":"#.repeat(DEPTH), "}".repeat(DEPTH));
        let mut all = Vec::new();
        paths(&fixture, String::new(), &mut all);
        assert!(all.len() > 100, "{} paths", all.len());
        let checked = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                assert!(event(fixture.to_string().as_bytes()).is_some());
                let mut checked = 0;
                for at in &all {
                    let mut holed = fixture.clone();
                    match at.strip_suffix("/\u{1}new") {
                        Some(parent) => {
                            let object = holed.pointer_mut(parent).unwrap();
                            let object = object.as_object_mut().unwrap();
                            object.insert("unknown".into(), HOLE.into());
                        }
                        None => *holed.pointer_mut(at).unwrap() = HOLE.into(),
                    }
                    let text = holed.to_string();
                    let hole = serde_json::to_string(HOLE).unwrap();
                    for deep in [&arrays, &objects] {
                        let text = text.replace(&hole, deep);
                        assert!(event(text.as_bytes()).is_none(), "{at}");
                        if let Some(record) = at.strip_prefix("/Records/") {
                            let index: usize = record.split('/').next().unwrap().parse().unwrap();
                            let record = holed["Records"][index].to_string().replace(&hole, deep);
                            assert!(super::record(&record).is_none(), "{at}");
                        }
                        checked += 1;
                    }
                }
                checked
            })
            .unwrap()
            .join()
            .expect("no overflow");
        assert!(checked > 200, "{checked}");
    }

    #[test]
    fn json_edge_cases_decode_the_fast_way_only_as_the_slow_way_does() {
        let base = r#"{"eventID":"e1","eventName":"INSERT","awsRegion":"r","dynamodb":{"Keys":{"PK":{"S":"USER#u1"}},"NewImage":{"PK":{"S":"USER#u1"},"v":VALUE},"SequenceNumber":"1","SizeBytes":SIZE,"ApproximateCreationDateTime":TIME}}"#;
        let values = [
            r#"{"S":"\ud800"}"#,
            r#"{"S":"\udc00x"}"#,
            r#"{"S":"\ud83d\ude00"}"#,
            "{\"S\":\"tab\there\"}",
            "{\"S\":\"nl\nhere\"}",
            r#"{"S":"\x"}"#,
            r#"{"S":"\u00e9\u0000"}"#,
            r#"{"N":"01"}"#,
            r#"{"BOOL":1}"#,
            r#"{"NULL":null}"#,
            r#"{"S":"a",}"#,
            r#"{"S":"a"} "#,
            r#"{"L":[{"S":"a"},]}"#,
            r#"{"M":{"x":{"S":"y"},"x":{"N":"1"}}}"#,
            r#"{"S":"a","S":"b"}"#,
            r#"{"B":"aGVsbG8"}"#,
            r#"{"NS":[1]}"#,
        ];
        let sizes = ["1", "1.0", "-0", "01", "1e2", "9223372036854775808", "-1"];
        let times = [
            "1",
            "1.5",
            "-1.5",
            "1e20",
            "18446744073709551615",
            "0",
            "\"1\"",
            "null",
        ];
        let mut cases = Vec::new();
        for value in values {
            cases.push(
                base.replace("VALUE", value)
                    .replace("SIZE", "1")
                    .replace("TIME", "1"),
            );
        }
        for size in sizes {
            cases.push(
                base.replace("VALUE", r#"{"S":"x"}"#)
                    .replace("SIZE", size)
                    .replace("TIME", "1"),
            );
        }
        for time in times {
            cases.push(
                base.replace("VALUE", r#"{"S":"x"}"#)
                    .replace("SIZE", "1")
                    .replace("TIME", time),
            );
        }
        cases.push(
            base.replace("VALUE", r#"{"S":"x"}"#)
                .replace("SIZE", "1")
                .replace("TIME", "1")
                + ",",
        );
        let mut accepted = 0;
        for case in &cases {
            let slow = serde_json::from_str::<serde_json::Value>(case)
                .ok()
                .map(|raw| decode_lambda_record(0, &raw).map_err(|p| p.reason));
            match (record(case), &slow) {
                (Some(fast), Some(Ok(slow))) => {
                    assert_eq!(&fast, slow, "{case}");
                    accepted += 1;
                }
                (Some(fast), _) => panic!("fast accepted {case}\n as {fast:?}\n slow: {slow:?}"),
                (None, _) => {}
            }
            let event = format!(r#"{{"Records":[{case}]}}"#);
            let whole = decode_lambda_event(event.as_bytes()).map(|d| {
                d.into_iter()
                    .map(|r| r.map_err(|p| p.reason))
                    .collect::<Vec<_>>()
            });
            if let (Ok(whole), Some(slow)) = (&whole, &slow) {
                assert_eq!(whole, &vec![slow.clone()], "{case}");
            }
        }
        assert!(accepted > 10, "{accepted} cases accepted");
    }
}
