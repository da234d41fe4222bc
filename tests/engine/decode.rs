//! Decoding real-format records: the Lambda event and GetRecords body
//! captured from DynamoDB Local (`tests/fixtures/`), Streams API records
//! built with the SDK, scanned items, and every way a record can be bad.

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::primitives::DateTime;
use aws_sdk_dynamodbstreams::types::{
    AttributeValue as StreamValue, Identity, OperationType, Record, StreamRecord, StreamViewType,
};
use ddb_projector::decode::{
    decode_lambda_event, decode_scanned_item, decode_stream_record, DecodeProblem, Decoded,
};
use ddb_projector::record::{
    item_to_json, ChangeKind, ChangeRecord, Image, Origin, SequenceNumber,
};
use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::util::{render_plan, repo_path, user_service};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo_path(&format!("tests/fixtures/{name}")))
        .unwrap_or_else(|error| panic!("tests/fixtures/{name}: {error}"))
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fixture(name)).unwrap()
}

/// One record, a few lines: what the rest of the pipeline sees of it.
fn describe(record: &ChangeRecord) -> String {
    let image = |image: &Option<Image>| match image {
        Some(image) => item_to_json(&image.to_item()).to_string(),
        None => "-".to_string(),
    };
    let origin = match &record.origin {
        Origin::Lambda { event_source_arn } => format!(
            "lambda {}",
            event_source_arn.as_deref().unwrap_or("(no ARN)")
        ),
        Origin::Stream { shard_id } => format!("stream {shard_id}"),
        Origin::Kinesis { table_name, .. } => format!("kinesis {table_name}"),
        Origin::Scan { segment } => format!("scan segment {segment}"),
        Origin::Synthetic => "synthetic".to_string(),
    };
    format!(
        "{} {} keys {} seq {} at {:?} view {} ttl {} size {:?}\n  from {origin}\n  old {}\n  new {}\n",
        record.event_id,
        record.kind.as_str(),
        item_to_json(&record.keys.to_item()),
        record.sequence_number,
        record.approximate_creation_ms,
        record.view_type.map_or("-", |v| v.as_str()),
        record.ttl_expiry,
        record.size_bytes,
        image(&record.old_image),
        image(&record.new_image),
    )
}

fn describe_problem(problem: &DecodeProblem) -> String {
    format!("problem: {problem}\n  raw {}\n", problem.raw)
}

fn describe_all(decoded: &Decoded) -> String {
    decoded
        .iter()
        .map(|result| match result {
            Ok(record) => describe(record),
            Err(problem) => describe_problem(problem),
        })
        .collect()
}

fn check_event(event: &Value, expect: Expect) {
    let bytes = serde_json::to_vec(event).unwrap();
    match decode_lambda_event(&bytes) {
        Ok(decoded) => expect.assert_eq(&describe_all(&decoded)),
        Err(error) => expect.assert_eq(&format!("event error: {error}\n")),
    }
}

fn records_of(name: &str) -> Vec<ChangeRecord> {
    decode_lambda_event(&fixture(name))
        .unwrap()
        .into_iter()
        .map(|result| result.unwrap_or_else(|problem| panic!("{problem}")))
        .collect()
}

// ---------------------------------------------------------------------------
// the captured fixtures

#[test]
fn lambda_fixture_decodes_every_record() {
    let decoded = decode_lambda_event(&fixture("lambda-event.json")).unwrap();
    expect![[r#"
        e8f0cbbf-5012-4d90-989c-042337d9ec0a INSERT keys {"PK":"USER#u1","SK":"PROFILE"} seq 000000000000000000001 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(158)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old -
          new {"PK":"USER#u1","SK":"PROFILE","createdAt":"2026-01-15T09:30:00.000Z","firstName":"Alice","lastName":"Smith","status":"ACTIVE","updatedAt":"2026-01-15T09:30:00.000Z","userId":"u1","version":1}
        b9713a9e-92f4-4512-bd98-a76b670678d8 INSERT keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 000000000000000000002 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(131)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old -
          new {"PK":"USER#u1","SK":"EMAIL#e1","createdAt":"2026-01-15T09:30:00.000Z","email":"alice@example.com","emailId":"e1","isPrimary":true,"isVerified":true,"userId":"u1"}
        06eaa26a-4cc7-4c61-9d14-ed847f358396 INSERT keys {"PK":"USER#u1","SK":"EMAIL#e2"} seq 000000000000000000003 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(142)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old -
          new {"PK":"USER#u1","SK":"EMAIL#e2","createdAt":"2026-02-03T14:12:45.000Z","email":"Alice.Smith@Work.Example.com","emailId":"e2","isPrimary":false,"isVerified":true,"userId":"u1"}
        227a3e28-ff8b-47b4-8b76-75607c8c577f MODIFY keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 000000000000000000004 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(243)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old {"PK":"USER#u1","SK":"EMAIL#e1","createdAt":"2026-01-15T09:30:00.000Z","email":"alice@example.com","emailId":"e1","isPrimary":true,"isVerified":true,"userId":"u1"}
          new {"PK":"USER#u1","SK":"EMAIL#e1","createdAt":"2026-01-15T09:30:00.000Z","email":"alice@example.com","emailId":"e1","isPrimary":false,"isVerified":true,"userId":"u1"}
        643adf00-574d-444f-8053-09b44a1e2036 MODIFY keys {"PK":"USER#u1","SK":"EMAIL#e2"} seq 000000000000000000005 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(265)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old {"PK":"USER#u1","SK":"EMAIL#e2","createdAt":"2026-02-03T14:12:45.000Z","email":"Alice.Smith@Work.Example.com","emailId":"e2","isPrimary":false,"isVerified":true,"userId":"u1"}
          new {"PK":"USER#u1","SK":"EMAIL#e2","createdAt":"2026-02-03T14:12:45.000Z","email":"Alice.Smith@Work.Example.com","emailId":"e2","isPrimary":true,"isVerified":true,"userId":"u1"}
        cda40065-fc65-4f41-86fd-dad91bfb83e5 REMOVE keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 000000000000000000006 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(131)
          from lambda arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210
          old {"PK":"USER#u1","SK":"EMAIL#e1","createdAt":"2026-01-15T09:30:00.000Z","email":"alice@example.com","emailId":"e1","isPrimary":false,"isVerified":true,"userId":"u1"}
          new -
    "#]]
    .assert_eq(&describe_all(&decoded));
}

#[test]
fn lambda_fixture_sequence_numbers_increase_as_numbers() {
    let records = records_of("lambda-event.json");
    assert_eq!(records.len(), 6);
    for pair in records.windows(2) {
        assert!(pair[0].sequence_number < pair[1].sequence_number);
    }
    // Zero-padded local numbers and unpadded AWS ones compare by value.
    let local = &records[5].sequence_number;
    assert!(*local > SequenceNumber("5".into()));
    assert!(*local < SequenceNumber("10".into()));
    assert_eq!(*local, SequenceNumber("6".into()));
    assert!(
        SequenceNumber("99999999999999999999".into())
            < SequenceNumber("111100000000000000000000000000000001".into())
    );
}

#[test]
fn lambda_fixture_plans_the_primary_switch() {
    let spec = user_service();
    let plans: String = records_of("lambda-event.json")
        .iter()
        .map(|record| {
            format!(
                "{} {} {}\n{}",
                record.sequence_number,
                record.kind.as_str(),
                record.key_string("SK").unwrap(),
                render_plan(spec, record, None)
            )
        })
        .collect();
    expect![[r#"
        000000000000000000001 INSERT PROFILE
        {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        000000000000000000002 INSERT EMAIL#e1
        {"if":{"email":"alice@example.com"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#alice@example.com","GSI1SK":"USER#u1"}}
        {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        000000000000000000003 INSERT EMAIL#e2
        {"if":{"email":"Alice.Smith@Work.Example.com"},"key":{"PK":"USER#u1","SK":"EMAIL#e2"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#alice.smith@work.example.com","GSI1SK":"USER#u1"}}
        000000000000000000004 MODIFY EMAIL#e1
        {"if":{"email":"alice@example.com"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#alice@example.com","GSI1SK":"USER#u1"}}
        {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        000000000000000000005 MODIFY EMAIL#e2
        {"if":{"email":"Alice.Smith@Work.Example.com"},"key":{"PK":"USER#u1","SK":"EMAIL#e2"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#alice.smith@work.example.com","GSI1SK":"USER#u1"}}
        {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        000000000000000000006 REMOVE EMAIL#e1
        skip: Unchanged("email"): change to `email` touches nothing a projection reads
    "#]]
    .assert_eq(&plans);
}

#[test]
fn ttl_fixture_sets_ttl_expiry() {
    let records = records_of("lambda-event-ttl.json");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.kind, ChangeKind::Remove);
    assert!(record.ttl_expiry);
    // The same removal by a writer is not a TTL expiry.
    let by_writer = &records_of("lambda-event.json")[5];
    assert!(!by_writer.ttl_expiry);
    assert_eq!(by_writer.keys, record.keys);
    assert_eq!(by_writer.old_image, record.old_image);
}

#[test]
fn get_records_body_decodes_like_the_lambda_event() {
    let from_streams = records_of("streams-get-records.json");
    let from_lambda = records_of("lambda-event.json");
    assert_eq!(from_streams.len(), from_lambda.len());
    for (streams, lambda) in from_streams.iter().zip(&from_lambda) {
        // GetRecords carries no eventSourceARN; everything else is equal.
        assert_eq!(
            streams.origin,
            Origin::Lambda {
                event_source_arn: None
            }
        );
        let lambda = ChangeRecord {
            origin: streams.origin.clone(),
            ..lambda.clone()
        };
        assert_eq!(*streams, lambda);
    }
}

#[test]
fn lambda_fixture_round_trips_through_serde() {
    // The fixture is the shape `aws_lambda_events` reads and writes.
    let event: aws_lambda_events::event::dynamodb::Event =
        serde_json::from_slice(&fixture("lambda-event.json")).unwrap();
    let again = serde_json::to_vec(&event).unwrap();
    assert_eq!(
        decode_lambda_event(&again).unwrap(),
        decode_lambda_event(&fixture("lambda-event.json")).unwrap()
    );
}

// ---------------------------------------------------------------------------
// bad events and bad records: never a panic, never a silent drop

#[test]
fn malformed_json_is_an_event_error() {
    let error = decode_lambda_event(br#"{"Records": [{"eventID": "#).unwrap_err();
    expect![[r#"
        the event is not valid JSON: EOF while parsing a value at line 1 column 25
    "#]]
    .assert_eq(&format!("{error}\n"));
}

#[test]
fn event_without_a_records_array_is_an_event_error() {
    check_event(
        &json!({"Records": {"0": {}}}),
        expect![[r#"
            event error: the event has no `Records` array: it is not a DynamoDB Streams event
        "#]],
    );
    check_event(
        &json!({"detail-type": "Scheduled Event"}),
        expect![[r#"
            event error: the event has no `Records` array: it is not a DynamoDB Streams event
        "#]],
    );
}

#[test]
fn empty_event_decodes_to_nothing() {
    assert!(decode_lambda_event(br#"{"Records": []}"#)
        .unwrap()
        .is_empty());
}

/// The Lambda fixture's first three records with record 1 changed.
fn with_bad_record(change: impl FnOnce(&mut Value)) -> Value {
    let mut event = fixture_json("lambda-event.json");
    let records = event["Records"].as_array_mut().unwrap();
    records.truncate(3);
    change(&mut records[1]);
    event
}

/// Decodes, checks that records 0 and 2 are intact and that record 1 is a
/// problem carrying the record exactly as received, and renders the problem.
fn check_bad_record(event: Value, expect: Expect) {
    let bytes = serde_json::to_vec(&event).unwrap();
    let decoded = decode_lambda_event(&bytes).unwrap();
    assert_eq!(decoded.len(), 3, "no record is dropped");
    let good = records_of("lambda-event.json");
    assert_eq!(decoded[0].as_ref().unwrap(), &good[0]);
    assert_eq!(decoded[2].as_ref().unwrap(), &good[2]);
    let problem = decoded[1].as_ref().unwrap_err();
    assert_eq!(problem.index, 1);
    assert_eq!(problem.raw, event["Records"][1], "the raw record, whole");
    expect.assert_eq(&format!("{problem}\n"));
}

#[test]
fn record_that_does_not_fit_the_format() {
    check_bad_record(
        with_bad_record(|record| record["dynamodb"]["Keys"]["PK"] = json!({"X": "?"})),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8) (sequence number 000000000000000000002): the record does not fit the DynamoDB Streams record format: The key 'X' is not a known DynamoDB prefix
        "#]],
    );
    check_bad_record(
        with_bad_record(|record| record["dynamodb"] = json!("gone")),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8): the record does not fit the DynamoDB Streams record format: invalid type: string "gone", expected struct StreamRecord
        "#]],
    );
}

#[test]
fn record_without_keys() {
    check_bad_record(
        with_bad_record(|record| {
            record["dynamodb"].as_object_mut().unwrap().remove("Keys");
        }),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8) (sequence number 000000000000000000002): the record has no Keys
        "#]],
    );
}

#[test]
fn record_with_an_unknown_event_name() {
    check_bad_record(
        with_bad_record(|record| record["eventName"] = json!("UPSERT")),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8) (sequence number 000000000000000000002): unknown eventName `UPSERT`: this version knows INSERT, MODIFY and REMOVE
        "#]],
    );
}

#[test]
fn insert_carrying_an_old_image() {
    check_bad_record(
        with_bad_record(|record| {
            record["dynamodb"]["OldImage"] = record["dynamodb"]["NewImage"].clone();
        }),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8) (sequence number 000000000000000000002): an INSERT record carries an OldImage
        "#]],
    );
}

#[test]
fn remove_carrying_a_new_image() {
    let mut event = fixture_json("lambda-event-ttl.json");
    let record = &mut event["Records"][0];
    record["dynamodb"]["NewImage"] = record["dynamodb"]["OldImage"].clone();
    check_event(
        &event,
        expect![[r#"
            problem: record 0 (eventID cda40065-fc65-4f41-86fd-dad91bfb83e5) (sequence number 000000000000000000006): a REMOVE record carries a NewImage
              raw {"awsRegion":"us-east-1","dynamodb":{"ApproximateCreationDateTime":1795326360,"Keys":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"}},"NewImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"createdAt":{"S":"2026-01-15T09:30:00.000Z"},"email":{"S":"alice@example.com"},"emailId":{"S":"e1"},"isPrimary":{"BOOL":false},"isVerified":{"BOOL":true},"userId":{"S":"u1"}},"OldImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"createdAt":{"S":"2026-01-15T09:30:00.000Z"},"email":{"S":"alice@example.com"},"emailId":{"S":"e1"},"isPrimary":{"BOOL":false},"isVerified":{"BOOL":true},"userId":{"S":"u1"}},"SequenceNumber":"000000000000000000006","SizeBytes":131,"StreamViewType":"NEW_AND_OLD_IMAGES"},"eventID":"cda40065-fc65-4f41-86fd-dad91bfb83e5","eventName":"REMOVE","eventSource":"aws:dynamodb","eventSourceARN":"arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210","eventVersion":"1.1","userIdentity":{"principalId":"dynamodb.amazonaws.com","type":"Service"}}
        "#]],
    );
}

#[test]
fn non_numeric_sequence_number() {
    check_bad_record(
        with_bad_record(|record| {
            record["dynamodb"]["SequenceNumber"] = json!("49-abc");
        }),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8) (sequence number 49-abc): SequenceNumber `49-abc` is not a decimal number
        "#]],
    );
}

#[test]
fn record_without_a_sequence_number() {
    check_bad_record(
        with_bad_record(|record| {
            record["dynamodb"]
                .as_object_mut()
                .unwrap()
                .remove("SequenceNumber");
        }),
        expect![[r#"
            record 1 (eventID b9713a9e-92f4-4512-bd98-a76b670678d8): the record has no SequenceNumber
        "#]],
    );
}

#[test]
fn several_bad_records_keep_their_places() {
    let mut event = fixture_json("lambda-event.json");
    let records = event["Records"].as_array_mut().unwrap();
    records[0]["eventName"] = json!("UPSERT");
    records[3] = json!("not a record");
    records[5]["dynamodb"]
        .as_object_mut()
        .unwrap()
        .remove("Keys");
    let decoded = decode_lambda_event(&serde_json::to_vec(&event).unwrap()).unwrap();
    let shape: Vec<String> = decoded
        .iter()
        .enumerate()
        .map(|(i, result)| match result {
            Ok(record) => format!("{i} ok {}", record.sequence_number),
            Err(problem) => format!("{i} problem at {}", problem.index),
        })
        .collect();
    expect![[r#"
        0 problem at 0
        1 ok 000000000000000000002
        2 ok 000000000000000000003
        3 problem at 3
        4 ok 000000000000000000005
        5 problem at 5
    "#]]
    .assert_eq(&(shape.join("\n") + "\n"));
}

// ---------------------------------------------------------------------------
// Streams API records (aws-sdk-dynamodbstreams)

fn s(value: &str) -> StreamValue {
    StreamValue::S(value.to_string())
}

fn stream_record(name: Option<OperationType>, images: bool) -> Record {
    let mut change = StreamRecord::builder()
        .approximate_creation_date_time(DateTime::from_secs(1_795_326_360))
        .keys("PK", s("USER#u1"))
        .keys("SK", s("EMAIL#e1"))
        .sequence_number("49668000000000000000001234")
        .size_bytes(131)
        .stream_view_type(StreamViewType::NewAndOldImages);
    if images {
        let kind = name.as_ref().map(|n| n.as_str().to_string());
        if kind.as_deref() != Some("INSERT") {
            change = change
                .old_image("PK", s("USER#u1"))
                .old_image("SK", s("EMAIL#e1"))
                .old_image("email", s("old@x.org"));
        }
        if kind.as_deref() != Some("REMOVE") {
            change = change
                .new_image("PK", s("USER#u1"))
                .new_image("SK", s("EMAIL#e1"))
                .new_image("email", s("new@x.org"))
                .new_image("isPrimary", StreamValue::Bool(true));
        }
    }
    let mut record = Record::builder()
        .event_id("4b25bd0da9a181a155114127e4837252")
        .event_source("aws:dynamodb")
        .aws_region("eu-west-1")
        .dynamodb(change.build());
    if let Some(name) = name {
        record = record.event_name(name);
    }
    record.build()
}

fn check_stream(record: &Record, expect: Expect) {
    let shard = "shardId-00000001700000000000-abcdef01";
    expect.assert_eq(&match decode_stream_record(4, shard, record) {
        Ok(record) => describe(&record),
        Err(problem) => describe_problem(&problem),
    });
}

#[test]
fn stream_insert_modify_remove() {
    check_stream(
        &stream_record(Some(OperationType::Insert), true),
        expect![[r#"
            4b25bd0da9a181a155114127e4837252 INSERT keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 49668000000000000000001234 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(131)
              from stream shardId-00000001700000000000-abcdef01
              old -
              new {"PK":"USER#u1","SK":"EMAIL#e1","email":"new@x.org","isPrimary":true}
        "#]],
    );
    check_stream(
        &stream_record(Some(OperationType::Modify), true),
        expect![[r#"
            4b25bd0da9a181a155114127e4837252 MODIFY keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 49668000000000000000001234 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(131)
              from stream shardId-00000001700000000000-abcdef01
              old {"PK":"USER#u1","SK":"EMAIL#e1","email":"old@x.org"}
              new {"PK":"USER#u1","SK":"EMAIL#e1","email":"new@x.org","isPrimary":true}
        "#]],
    );
    check_stream(
        &stream_record(Some(OperationType::Remove), true),
        expect![[r#"
            4b25bd0da9a181a155114127e4837252 REMOVE keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 49668000000000000000001234 at Some(1795326360000) view NEW_AND_OLD_IMAGES ttl false size Some(131)
              from stream shardId-00000001700000000000-abcdef01
              old {"PK":"USER#u1","SK":"EMAIL#e1","email":"old@x.org"}
              new -
        "#]],
    );
}

#[test]
fn stream_ttl_removal_is_marked() {
    let mut record = stream_record(Some(OperationType::Remove), true);
    record.user_identity = Some(
        Identity::builder()
            .r#type("Service")
            .principal_id("dynamodb.amazonaws.com")
            .build(),
    );
    let decoded = decode_stream_record(0, "shard-1", &record).unwrap();
    assert!(decoded.ttl_expiry);
    // Another service's identity is not TTL.
    record.user_identity = Some(
        Identity::builder()
            .r#type("Service")
            .principal_id("replication.dynamodb.amazonaws.com")
            .build(),
    );
    assert!(
        !decode_stream_record(0, "shard-1", &record)
            .unwrap()
            .ttl_expiry
    );
}

#[test]
fn stream_record_without_a_dynamodb_section() {
    let record = Record::builder()
        .event_id("4b25bd0da9a181a155114127e4837252")
        .event_name(OperationType::Insert)
        .build();
    check_stream(
        &record,
        expect![[r#"
            problem: record 4 (eventID 4b25bd0da9a181a155114127e4837252): the record has no `dynamodb` section
              raw {"awsRegion":null,"dynamodb":null,"eventID":"4b25bd0da9a181a155114127e4837252","eventName":"INSERT","eventSource":null,"userIdentity":null}
        "#]],
    );
}

#[test]
fn stream_record_with_an_unknown_or_missing_event_name() {
    check_stream(
        &stream_record(Some(OperationType::from("UPSERT")), true),
        expect![[r#"
            problem: record 4 (eventID 4b25bd0da9a181a155114127e4837252) (sequence number 49668000000000000000001234): unknown eventName `UPSERT`: this version knows INSERT, MODIFY and REMOVE
              raw {"awsRegion":"eu-west-1","dynamodb":{"ApproximateCreationDateTime":1795326360,"Keys":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"}},"NewImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"email":{"S":"new@x.org"},"isPrimary":{"BOOL":true}},"OldImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"email":{"S":"old@x.org"}},"SequenceNumber":"49668000000000000000001234","SizeBytes":131,"StreamViewType":"NEW_AND_OLD_IMAGES"},"eventID":"4b25bd0da9a181a155114127e4837252","eventName":"UPSERT","eventSource":"aws:dynamodb","userIdentity":null}
        "#]],
    );
    check_stream(
        &stream_record(None, true),
        expect![[r#"
            problem: record 4 (eventID 4b25bd0da9a181a155114127e4837252) (sequence number 49668000000000000000001234): the record has no eventName
              raw {"awsRegion":"eu-west-1","dynamodb":{"ApproximateCreationDateTime":1795326360,"Keys":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"}},"NewImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"email":{"S":"new@x.org"},"isPrimary":{"BOOL":true}},"OldImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"email":{"S":"old@x.org"}},"SequenceNumber":"49668000000000000000001234","SizeBytes":131,"StreamViewType":"NEW_AND_OLD_IMAGES"},"eventID":"4b25bd0da9a181a155114127e4837252","eventName":null,"eventSource":"aws:dynamodb","userIdentity":null}
        "#]],
    );
}

// ---------------------------------------------------------------------------
// scanned items

#[test]
fn scanned_item_is_an_insert_of_its_state() {
    use aws_sdk_dynamodb::types::AttributeValue as Value;
    let item = HashMap::from([
        ("PK".to_string(), Value::S("USER#u1".into())),
        ("SK".to_string(), Value::S("EMAIL#e1".into())),
        ("email".to_string(), Value::S("sam@x.org".into())),
        ("isPrimary".to_string(), Value::Bool(true)),
        ("logins".to_string(), Value::N("17".into())),
    ]);
    let table = &user_service().table;
    let record = decode_scanned_item(table, 2, 17, item.clone()).unwrap();
    expect![[r#"
        scan:2:17 INSERT keys {"PK":"USER#u1","SK":"EMAIL#e1"} seq 0 at None view NEW_IMAGE ttl false size None
          from scan segment 2
          old -
          new {"PK":"USER#u1","SK":"EMAIL#e1","email":"sam@x.org","isPrimary":true,"logins":17}
    "#]]
    .assert_eq(&describe(&record));
    // A scanned item plans like a stream insert.
    expect![[r#"
        {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1"}}
        {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
    "#]]
    .assert_eq(&render_plan(user_service(), &record, None));
    let mut keyless = item;
    keyless.remove("SK");
    let problem = decode_scanned_item(table, 2, 18, keyless).unwrap_err();
    expect![[r#"
        record 18: scanned item has no key attribute `SK`
    "#]]
    .assert_eq(&format!("{problem}\n"));
}
