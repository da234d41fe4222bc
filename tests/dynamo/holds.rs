//! Holds against DynamoDB Local: later records of an item wait behind its
//! dead letter, however many items are held and whatever could not be read
//! of the record that failed.

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, ApplyConfig, BatchOptions, RecordStatus};
use ddb_projector::decode::decode_lambda_event;

use super::model::{attrs, Attrs, History};
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

async fn setup(prefix: &str) -> Applier {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, prefix).await;
    Applier::new(client, spec, &table, ApplyConfig::default())
}

#[tokio::test]
async fn thousands_of_held_items_do_not_stop_the_worker() {
    let applier = setup("many-holds").await;
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
    let applier = setup("undecodable-hold").await;
    // The first record's image holds a type no DynamoDB has; its keys read.
    let event = serde_json::json!({"Records": [
        {
            "eventID": "1", "eventName": "INSERT", "eventSource": "aws:dynamodb",
            "dynamodb": {
                "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
                "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}, "email": {"QQ": "?"}},
                "SequenceNumber": "100", "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        },
        {
            "eventID": "2", "eventName": "MODIFY", "eventSource": "aws:dynamodb",
            "dynamodb": {
                "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
                "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}, "userId": {"S": "u1"},
                             "emailId": {"S": "e1"}, "email": {"S": "a@x.org"}},
                "SequenceNumber": "200", "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        }
    ]});
    let batch = decode_lambda_event(event.to_string().as_bytes()).unwrap();
    assert!(batch[0].is_err() && batch[1].is_ok());
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
