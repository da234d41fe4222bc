//! Dead letters and holds against DynamoDB Local: later records of an item
//! wait behind its dead letter, however many items are held and whatever
//! could not be read of the record that failed; a redrive supersedes what
//! the item's later state makes obsolete, and keeps what still fails.

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{ApplyConfig, BatchOptions, RecordStatus};
use ddb_projector::control;
use ddb_projector::decode::{decode_lambda_event, decode_scanned_item};
use ddb_projector::spec::Spec;

use super::model::{attrs, put_item, Attrs, History};
use super::support::{self, s};

fn email(user: &str, id: &str, address: Av) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s(&format!("EMAIL#{id}"))),
        ("userId", s(user)),
        ("emailId", s(id)),
        ("email", address),
        ("isPrimary", Av::Bool(false)),
    ])
}

/// An address `lower(trim(email))` cannot render: the record is poison
/// for `email-gsi1-keys`.
fn poison() -> Av {
    Av::M([("not".to_string(), s("text"))].into())
}

#[tokio::test]
async fn thousands_of_held_items_do_not_stop_the_worker() {
    let applier = support::fixture(support::shipped_spec("user-service.toml"), "many-holds")
        .await
        .applier;
    // Sort keys near DynamoDB's 1 KB limit: 500 held items would need
    // more than the 400 KB one item can hold.
    let long = "x".repeat(900);
    let mut history = History::default();
    for i in 0..500 {
        history.put(email("u", &format!("{long}{i:04}"), poison()));
    }
    for chunk in history.records.chunks(100) {
        let outcome = applier
            .apply_batch(chunk, &BatchOptions::default())
            .await
            .unwrap();
        assert!(
            outcome
                .statuses
                .iter()
                .all(|s| matches!(s, RecordStatus::DeadLettered(_))),
            "{:?}",
            outcome.statuses.iter().find(|s| !s.is_handled())
        );
    }
    // One more poison item, then a later record of a held item and a
    // record of an item nobody holds.
    let mut more = History::default();
    more.put(email("v", "e1", poison()));
    more.put(email("u", &format!("{long}0007"), s("fixed@x.org")));
    more.put(email("w", "e1", s("w@x.org")));
    let outcome = applier
        .apply_batch(&more.records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(_)),
        "{:?}",
        outcome.statuses[0]
    );
    assert!(
        matches!(&outcome.statuses[1], RecordStatus::DeadLettered(r) if r[0].contains("held")),
        "{:?}",
        outcome.statuses[1]
    );
    assert_eq!(outcome.statuses[2], RecordStatus::Applied);
    assert_eq!(applier.dead_letter_store().list().await.unwrap().len(), 502);
}

#[tokio::test]
async fn records_of_an_item_wait_behind_a_record_that_could_not_be_decoded() {
    let applier = support::fixture(
        support::shipped_spec("user-service.toml"),
        "undecodable-hold",
    )
    .await
    .applier;
    // The first record's image holds a type no DynamoDB has; its keys read.
    let event = serde_json::json!({"Records": [
        {
            "eventID": "1", "eventName": "INSERT", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "eventVersion": "1.1",
            "dynamodb": {
                "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
                "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}, "email": {"QQ": "?"}},
                "SequenceNumber": "100", "SizeBytes": 100, "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        },
        {
            "eventID": "2", "eventName": "MODIFY", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "eventVersion": "1.1",
            "dynamodb": {
                "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
                "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}, "userId": {"S": "u1"},
                             "emailId": {"S": "e1"}, "email": {"S": "a@x.org"}},
                "SequenceNumber": "200", "SizeBytes": 100, "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        }
    ]});
    let batch = decode_lambda_event(event.to_string().as_bytes()).unwrap();
    assert!(batch[0].is_err() && batch[1].is_ok(), "{batch:?}");
    let outcome = applier
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[1], RecordStatus::DeadLettered(r) if r[0].contains("held")),
        "a record of the item after one that could not be decoded was applied: {:?}",
        outcome.statuses
    );
    // Delivered again later, it still waits.
    let outcome = applier
        .apply_batch(&batch[1..], &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("held")),
        "{:?}",
        outcome.statuses
    );
}

#[tokio::test]
async fn a_redrive_lets_later_records_supersede_one_no_build_can_decode() {
    let applier = support::fixture(
        support::shipped_spec("user-service.toml"),
        "undecodable-redrive",
    )
    .await
    .applier;
    let client = applier.client().clone();
    let good = email("u1", "e1", s("Sam@X.org"));
    put_item(&client, applier.table(), &good).await;
    let mut history = History::default();
    history.put(good);
    let event = serde_json::json!({"Records": [
        {
            "eventID": "1", "eventName": "INSERT", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "eventVersion": "1.1",
            "dynamodb": {
                "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
                "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}, "email": {"QQ": "?"}},
                "SequenceNumber": "0", "SizeBytes": 100, "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        }
    ]});
    let mut batch = decode_lambda_event(event.to_string().as_bytes()).unwrap();
    batch.extend(history.records.clone());
    let outcome = applier
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome
        .statuses
        .iter()
        .all(|s| matches!(s, RecordStatus::DeadLettered(_))));
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(
        (summary.redriven, summary.superseded, summary.still_failing),
        (1, 1, 0),
        "{summary:?}"
    );
    assert!(applier.dead_letter_store().list().await.unwrap().is_empty());
    let item = support::get(&client, applier.table(), "USER#u1", "EMAIL#e1")
        .await
        .unwrap();
    assert_eq!(
        support::text(&item, "GSI1PK").as_deref(),
        Some("EMAIL#sam@x.org")
    );
    // The item is no longer held.
    let mut later = History::default();
    later.put(email("u1", "e1", s("Kim@X.org")));
    let outcome = applier
        .apply_batch(&later.records, &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
}

#[tokio::test]
async fn a_backfill_letter_is_redriven_from_the_items_current_state() {
    let applier = support::fixture(support::shipped_spec("user-service.toml"), "scan-letter")
        .await
        .applier;
    let client = applier.client().clone();
    let bad = email("u1", "e1", poison());
    put_item(&client, applier.table(), &bad).await;
    // The backfill's scan reads the poison item...
    let scanned = support::get(&client, applier.table(), "USER#u1", "EMAIL#e1")
        .await
        .unwrap();
    // ...a writer fixes it and the live worker applies the fix...
    let fixed = email("u1", "e1", s("Sam@X.org"));
    put_item(&client, applier.table(), &fixed).await;
    let mut history = History::default();
    history.put(fixed);
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    // ...then the backfill's page lands, and dead-letters its stale image.
    let record = decode_scanned_item(&applier.spec().table, 0, 1, scanned);
    let outcome = applier
        .apply_batch(
            &[record],
            &BatchOptions {
                read_markers_first: true,
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        &outcome.statuses[0],
        RecordStatus::DeadLettered(_)
    ));
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(summary.redriven, 1, "{summary:?}");
    assert!(applier.dead_letter_store().list().await.unwrap().is_empty());
    let item = support::get(&client, applier.table(), "USER#u1", "EMAIL#e1")
        .await
        .unwrap();
    assert_eq!(
        support::text(&item, "GSI1PK").as_deref(),
        Some("EMAIL#sam@x.org")
    );
}

/// Found in review: a redrive that failed again replaced the letter's
/// stream record with the item's current state it had tried last.
#[tokio::test]
async fn a_redrive_that_fails_again_keeps_the_letters_full_record() {
    let applier = support::fixture(
        support::shipped_spec("user-service.toml"),
        "redrive-overwrite",
    )
    .await
    .applier;
    let client = applier.client().clone();
    let mut history = History::default();
    for item in [email("u1", "e1", s("a@x.org")), email("u1", "e1", poison())] {
        put_item(&client, applier.table(), &item).await;
        history.put(item);
    }
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(matches!(outcome.statuses[1], RecordStatus::DeadLettered(_)));
    let before = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].record["kind"], serde_json::json!("MODIFY"));
    // No fix yet: the redrive fails again, and the letter is as it was.
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(summary.still_failing, 1, "{summary:?}");
    let after = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].record, before[0].record);
    assert_eq!(after[0].attempts, 2);
}

/// A replay applies an item's current state in the place of its last
/// record, with that record's sequence number. The item is still poison:
/// the current state fails too, and its letter is the record's letter.
/// It keeps the record as delivered and the reason it first failed for,
/// and says the current state's in `lastError`.
#[tokio::test]
async fn a_current_state_that_fails_keeps_the_letter_of_the_record_it_stands_for() {
    let applier = support::fixture(support::shipped_spec("user-service.toml"), "derived-letter")
        .await
        .applier;
    let client = applier.client().clone();
    let mut history = History::default();
    for item in [email("u1", "e1", s("a@x.org")), email("u1", "e1", poison())] {
        put_item(&client, applier.table(), &item).await;
        history.put(item);
    }
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(matches!(outcome.statuses[1], RecordStatus::DeadLettered(_)));
    let before = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(before.len(), 1);
    // What a replay of the two records applies: the item as it is now.
    let states = applier
        .current_states(history.records.clone(), None)
        .await
        .unwrap();
    assert_eq!(states.records.len(), 1);
    let outcome = applier
        .apply_batch(&states.records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(outcome.statuses[0], RecordStatus::DeadLettered(_)),
        "{:?}",
        outcome.statuses
    );
    let after = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(after.len(), 1, "{after:#?}");
    assert_eq!(after[0].record, before[0].record, "the record as delivered");
    assert_eq!(after[0].record["kind"], serde_json::json!("MODIFY"));
    assert_eq!(after[0].error, before[0].error);
    assert_eq!(after[0].attempts, 2);
}

/// Found in review: in a table without a sort key every dead letter was
/// written to the one item `PK = _ddbp#dlq`, each overwriting the one
/// before: two poison records of two items left one letter.
#[tokio::test]
async fn every_dead_letter_is_kept_in_a_table_without_a_sort_key() {
    let spec = Arc::new(
        Spec::from_toml(
            r#"
service = "nosk"
[table]
name = "NoSk"
sort_key = ""
[entities.user]
pk = "USER#{userId}"
[[projections]]
name = "user-keys"
kind = "index-keys"
entity = "user"
set = { lx = "X#{lower(x)}" }
"#,
            "nosk.toml",
        )
        .unwrap(),
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec, "nosk-dlq").await;
    let applier = control::applier(client.clone(), spec, &table, ApplyConfig::default());
    let poison =
        aws_sdk_dynamodb::types::AttributeValue::M([("not".to_string(), s("text"))].into());
    use ddb_projector::record::{
        ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType,
    };
    let mut records: Vec<super::model::Record> = Vec::new();
    for (i, user) in ["u1", "u2"].into_iter().enumerate() {
        let item = attrs(&[
            ("PK", s(&format!("USER#{user}"))),
            ("userId", s(user)),
            ("x", poison.clone()),
        ]);
        put_item(&client, &table, &item).await;
        let keys = attrs(&[("PK", s(&format!("USER#{user}")))]);
        records.push(Ok(ChangeRecord {
            event_id: format!("e{i}"),
            kind: ChangeKind::Insert,
            keys: Image::from(Item::from(keys)),
            old_image: None,
            new_image: Some(Image::from(Item::from(item))),
            sequence_number: SequenceNumber(format!("{:021}", i + 1)),
            approximate_creation_ms: None,
            ttl_expiry: false,
            view_type: Some(ViewType::NewAndOldImages),
            size_bytes: None,
            origin: Origin::Synthetic,
        }));
    }
    let outcome = applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        outcome
            .statuses
            .iter()
            .all(|s| matches!(s, RecordStatus::DeadLettered(_))),
        "{:?}",
        outcome.statuses
    );
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(
        letters.len(),
        2,
        "two records were dead-lettered, the store kept: {letters:?}"
    );
    // One item is fixed: its letter goes on redrive, the other stays.
    put_item(
        &client,
        &table,
        &attrs(&[("PK", s("USER#u1")), ("userId", s("u1")), ("x", s("Fixed"))]),
    )
    .await;
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(
        (summary.redriven + summary.superseded, summary.still_failing),
        (1, 1)
    );
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].source_key.as_ref().unwrap().pk, "USER#u2");
}

/// Letters of one item from two streams (a global table's old home
/// lettered some, the new home's replay others) do not sort in the order
/// the item changed: a stale image may sort last. A redrive ends with the
/// item as it is now, whatever order its letters applied in.
#[tokio::test]
async fn a_redrive_ends_at_the_items_current_state_whatever_its_letters_order() {
    use super::model::change;
    use ddb_projector::record::ChangeKind;
    let applier = support::fixture(support::shipped_spec("user-service.toml"), "two-streams")
        .await
        .applier;
    let client = applier.client().clone();
    let (old, now) = (
        email("u1", "e1", s("Sam@X.org")),
        email("u1", "e1", s("Kim@X.org")),
    );
    put_item(&client, applier.table(), &now).await;
    let bad = email("u1", "e1", poison());
    // The poison record holds the item; the other two wait behind it.
    // Kim's (the item as it is) sorts before Sam's (an older write whose
    // record came from the other region's stream, numbered higher).
    for record in [
        change(100, ChangeKind::Insert, None, Some(&bad)),
        change(300, ChangeKind::Modify, Some(&bad), Some(&now)),
        change(900, ChangeKind::Modify, Some(&bad), Some(&old)),
    ] {
        let outcome = applier
            .apply_batch(&[record], &BatchOptions::default())
            .await
            .unwrap();
        assert!(
            matches!(outcome.statuses[..], [RecordStatus::DeadLettered(_)]),
            "{:?}",
            outcome.statuses
        );
    }
    applier.redrive(None).await.unwrap();
    assert!(applier.dead_letter_store().list().await.unwrap().is_empty());
    let item = support::get(&client, applier.table(), "USER#u1", "EMAIL#e1")
        .await
        .unwrap();
    assert_eq!(
        support::text(&item, "GSI1PK").as_deref(),
        Some("EMAIL#kim@x.org"),
        "the keys of the item as it is, not of the letter applied last"
    );
}
