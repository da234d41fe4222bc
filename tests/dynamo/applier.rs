//! The applier against DynamoDB Local: records built by hand (as the stream
//! would deliver them) go through `apply_batch`; the table is then read.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{ApplyConfig, BatchOptions, RecordStatus};
use ddb_projector::control;
use ddb_projector::decode::DecodeProblem;
use ddb_projector::record::{ChangeKind, Image, ValueRef};
use ddb_projector::spec::Spec;

use super::model::{change, email, follow, profile, user_counter};
use super::support::{self, get, n, put, s, text};

/// When the hand-written follows were made.
const FOLLOWED_AT: &str = "2026-11-01T10:00:00Z";

type Attrs = HashMap<String, Av>;

fn attrs(pairs: &[(&str, Av)]) -> Attrs {
    support::item(pairs)
}

async fn write(client: &aws_sdk_dynamodb::Client, table: &str, item: &Attrs) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item.clone()))
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn index_keys_are_derived_once_and_stale_records_do_not_overwrite() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "ik").await;
    let v1 = email("u1", "e1", "  Sam@X.org ", true);
    write(&client, &table, &v1).await;
    let insert = change(1, ChangeKind::Insert, None, Some(&v1));
    let outcome = applier
        .apply_batch(std::slice::from_ref(&insert), &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(text(&stored, "GSI1PK").as_deref(), Some("EMAIL#sam@x.org"));
    assert_eq!(text(&stored, "GSI1SK").as_deref(), Some("USER#u1"));

    // The writer changes the address; the projector has not seen it yet
    // when the old insert is delivered again: it must not win.
    let v2 = email("u1", "e1", "new@x.org", true);
    write(&client, &table, &v2).await;
    let outcome = applier
        .apply_batch(&[insert], &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(text(&stored, "email").as_deref(), Some("new@x.org"));
    assert_eq!(
        text(&stored, "GSI1PK").as_deref(),
        None,
        "stale keys were not written onto the new state"
    );

    let modify = change(2, ChangeKind::Modify, Some(&v1), Some(&v2));
    applier
        .apply_batch(std::slice::from_ref(&modify), &BatchOptions::default())
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(text(&stored, "GSI1PK").as_deref(), Some("EMAIL#new@x.org"));
    // Delivered again: nothing changes.
    let before = support::scan_all(&client, &table).await;
    applier
        .apply_batch(&[modify], &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(support::scan_all(&client, &table).await, before);
}

/// The three changes of the engine issue: e1 becomes primary, e2 becomes
/// primary, e1 stops being primary. Whatever order they are processed in,
/// the profile ends with e2's address.
#[tokio::test]
async fn denormalized_profile_email_converges_in_every_order() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "dn").await;
    let e1_plain = email("u1", "e1", "one@x.org", false);
    let e1_primary = email("u1", "e1", "one@x.org", true);
    let e2_plain = email("u1", "e2", "two@x.org", false);
    let e2_primary = email("u1", "e2", "two@x.org", true);
    let records = [
        change(1, ChangeKind::Modify, Some(&e1_plain), Some(&e1_primary)),
        change(2, ChangeKind::Modify, Some(&e2_plain), Some(&e2_primary)),
        change(3, ChangeKind::Modify, Some(&e1_primary), Some(&e1_plain)),
    ];
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for (n_order, order) in orders.iter().enumerate() {
        let user = format!("u{n_order}");
        let records: Vec<_> = records
            .iter()
            .map(|r| {
                let mut r = r.clone().unwrap();
                let pk = format!("USER#{user}");
                let fix = |item: &mut Image| item.insert("PK", ValueRef::S(&pk));
                fix(&mut r.keys);
                r.old_image.as_mut().map(fix);
                r.new_image.as_mut().map(fix);
                Ok(r)
            })
            .collect();
        // Final source state: e2 primary, e1 not.
        let mut p = profile(&user);
        p.insert("email".into(), s("stale@x.org"));
        write(&client, &table, &p).await;
        for (address, id, primary) in [("one@x.org", "e1", false), ("two@x.org", "e2", true)] {
            write(&client, &table, &email(&user, id, address, primary)).await;
        }
        for &i in order {
            // One record per batch: the worst case for convergence.
            let outcome = applier
                .apply_batch(&records[i..=i], &BatchOptions::default())
                .await
                .unwrap();
            assert!(
                outcome.statuses.iter().all(RecordStatus::is_handled),
                "{outcome:?}"
            );
        }
        let stored = get(&client, &table, &format!("USER#{user}"), "PROFILE")
            .await
            .unwrap();
        assert_eq!(
            text(&stored, "email").as_deref(),
            Some("two@x.org"),
            "order {order:?}"
        );
    }
}

#[tokio::test]
async fn profile_email_is_removed_when_no_email_is_primary() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "dn0").await;
    let mut p = profile("u1");
    p.insert("email".into(), s("old@x.org"));
    write(&client, &table, &p).await;
    let e1 = email("u1", "e1", "old@x.org", true);
    // The primary email was deleted.
    let remove = change(1, ChangeKind::Remove, Some(&e1), None);
    applier
        .apply_batch(&[remove], &BatchOptions::default())
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#u1", "PROFILE").await.unwrap();
    assert_eq!(text(&stored, "email"), None);
    assert_eq!(
        text(&stored, "firstName").as_deref(),
        Some("Sam"),
        "other attributes untouched"
    );
    assert!(
        !stored.contains_key("GSI1PK"),
        "the profile never gets GSI1 keys"
    );
}

#[tokio::test]
async fn counters_stay_exact_under_duplicates_bisection_and_replay() {
    let support::Fixture {
        applier,
        client,
        table,
        spec,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "cnt").await;
    let follows: Vec<Attrs> = (0..40)
        .map(|i| follow(&format!("f{i}"), "hot", FOLLOWED_AT))
        .collect();
    let mut records: Vec<_> = follows
        .iter()
        .enumerate()
        .map(|(i, f)| change(i as u64 + 1, ChangeKind::Insert, None, Some(f)))
        .collect();
    // Ten of them unfollow again.
    for (i, f) in follows.iter().take(10).enumerate() {
        records.push(change(100 + i as u64, ChangeKind::Remove, Some(f), None));
    }
    let all = BatchOptions::default();
    let outcome = applier.apply_batch(&records, &all).await.unwrap();
    assert!(
        outcome.statuses.iter().all(|s| *s == RecordStatus::Applied),
        "{outcome:?}"
    );
    assert!(
        outcome.stats.writes < records.len(),
        "coalesced: {} writes for {} records",
        outcome.stats.writes,
        records.len()
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "hot").await,
        30
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "f20").await,
        1
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "f0").await,
        0
    );

    // Lambda retries the whole batch, then bisects it, then replays suffixes.
    applier.apply_batch(&records, &all).await.unwrap();
    let (left, right) = records.split_at(records.len() / 2);
    applier.apply_batch(left, &all).await.unwrap();
    applier.apply_batch(right, &all).await.unwrap();
    for start in [5, 17, 39, 45] {
        applier.apply_batch(&records[start..], &all).await.unwrap();
    }
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "hot").await,
        30
    );
    for i in 0..40 {
        let expected = if i < 10 { 0 } else { 1 };
        assert_eq!(
            user_counter(&client, &table, &spec, "following", &format!("f{i}")).await,
            expected,
            "f{i}"
        );
        let edge = get(&client, &table, "USER#hot", &format!("FOLLOWED_BY#f{i}")).await;
        assert_eq!(edge.is_some(), i >= 10, "edge of f{i}");
    }
    let edge = get(&client, &table, "USER#hot", "FOLLOWED_BY#f15")
        .await
        .unwrap();
    assert_eq!(
        text(&edge, "followedAt").as_deref(),
        Some("2026-11-01T10:00:00Z")
    );
}

/// The bench's cancelled transactions: a follow removed in the batch that
/// created it (the edge never existed), or removed and made again (the
/// edge never went away). Their markers are read first, not sent in a
/// transaction DynamoDB would cancel; redeliveries, where the marker is
/// not where the batch suggests, still count exactly.
#[tokio::test]
async fn a_follow_undone_or_redone_within_a_batch_cancels_no_transaction() {
    let support::Fixture {
        applier,
        client,
        table,
        spec,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "undo").await;
    let all = BatchOptions::default();
    let old = follow("old", "hot", "t1");
    let first = vec![change(1, ChangeKind::Insert, None, Some(&old))];
    applier.apply_batch(&first, &all).await.unwrap();

    let again = follow("old", "hot", "t2");
    let brief = follow("brief", "hot", "t3");
    let other = follow("other", "hot", "t4");
    let records = vec![
        change(2, ChangeKind::Remove, Some(&old), None),
        change(3, ChangeKind::Insert, None, Some(&brief)),
        change(4, ChangeKind::Insert, None, Some(&other)),
        change(5, ChangeKind::Insert, None, Some(&again)),
        change(6, ChangeKind::Remove, Some(&brief), None),
    ];
    let outcome = applier.apply_batch(&records, &all).await.unwrap();
    assert!(
        outcome.statuses.iter().all(|s| *s == RecordStatus::Applied),
        "{outcome:?}"
    );
    let requests = &outcome.stats.requests;
    assert_eq!(requests.cancelled_transactions, 0, "{requests:?}");
    assert_eq!(requests.transactions, 1, "{requests:?}");
    assert_eq!(requests.marker_reads, 1, "{requests:?}");

    // The edges to `hot` expected: `old` (with its `followedAt`), `brief`;
    // `other` always. Counters must match them exactly.
    let check = |old: Option<&'static str>, brief: bool| {
        let (client, table, spec) = (&client, &table, &spec);
        async move {
            let followers = 1 + i64::from(old.is_some()) + i64::from(brief);
            assert_eq!(
                user_counter(client, table, spec, "followers", "hot").await,
                followers
            );
            for (user, following) in [
                ("old", i64::from(old.is_some())),
                ("other", 1),
                ("brief", i64::from(brief)),
            ] {
                assert_eq!(
                    user_counter(client, table, spec, "following", user).await,
                    following,
                    "{user}"
                );
            }
            let edge = get(client, table, "USER#hot", "FOLLOWED_BY#old").await;
            assert_eq!(
                edge.as_ref().and_then(|e| text(e, "followedAt")).as_deref(),
                old
            );
            let brief_edge = get(client, table, "USER#hot", "FOLLOWED_BY#brief").await;
            assert_eq!(brief_edge.is_some(), brief);
        }
    };
    check(Some("t2"), false).await;

    // Delivered again, whole and in parts, so that the markers are not
    // always where the batch suggests.
    applier.apply_batch(&records, &all).await.unwrap();
    check(Some("t2"), false).await;
    applier.apply_batch(&records[..3], &all).await.unwrap();
    check(None, true).await;
    // `brief` exists although its batch creates and removes it.
    applier.apply_batch(&records[1..], &all).await.unwrap();
    check(Some("t2"), false).await;
    applier.apply_batch(&records[..1], &all).await.unwrap();
    check(None, false).await;
    // `old` is gone although its batch removes and makes it again.
    applier.apply_batch(&records, &all).await.unwrap();
    check(Some("t2"), false).await;
}

#[tokio::test]
async fn concurrent_deliveries_of_one_batch_count_once() {
    let support::Fixture {
        applier,
        client,
        table,
        spec,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "conc").await;
    let records: Vec<_> = (0..60)
        .map(|i| {
            change(
                i + 1,
                ChangeKind::Insert,
                None,
                Some(&follow(&format!("c{i}"), "star", FOLLOWED_AT)),
            )
        })
        .collect();
    // Two workers get the same batch at once (a retry racing the original).
    let options = BatchOptions::default();
    let (a, b) = tokio::join!(
        applier.apply_batch(&records, &options),
        applier.apply_batch(&records, &options)
    );
    for outcome in [a.unwrap(), b.unwrap()] {
        assert!(
            outcome.statuses.iter().all(RecordStatus::is_handled),
            "{outcome:?}"
        );
    }
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "star").await,
        60
    );
}

#[tokio::test]
async fn a_poison_record_is_dead_lettered_and_later_records_of_its_item_are_held() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "dlq").await;
    let bad = attrs(&[
        ("PK", s("USER#u1")),
        ("SK", s("ACHIEVEMENT#b1")),
        ("tier", s("gold")),
        ("score", s("high")),
    ]);
    let good = attrs(&[
        ("PK", s("USER#u2")),
        ("SK", s("ACHIEVEMENT#b1")),
        ("tier", s("gold")),
        ("score", n(850)),
    ]);
    let fixed = attrs(&[
        ("PK", s("USER#u1")),
        ("SK", s("ACHIEVEMENT#b1")),
        ("tier", s("silver")),
        ("score", n(12)),
    ]);
    write(&client, &table, &good).await;
    write(&client, &table, &fixed).await;
    let records = vec![
        change(1, ChangeKind::Insert, None, Some(&bad)),
        change(2, ChangeKind::Insert, None, Some(&good)),
    ];
    let outcome = applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("score")),
        "{outcome:?}"
    );
    assert_eq!(outcome.statuses[1], RecordStatus::Applied);
    let stored = get(&client, &table, "USER#u2", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert_eq!(text(&stored, "GSI1SK").as_deref(), Some("SCORE#0850"));

    // A later, good record of the same item waits behind the dead letter.
    let later = change(3, ChangeKind::Modify, Some(&bad), Some(&fixed));
    let outcome = applier
        .apply_batch(&[later], &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("held")),
        "{outcome:?}"
    );
    assert!(!get(&client, &table, "USER#u1", "ACHIEVEMENT#b1")
        .await
        .unwrap()
        .contains_key("GSI1PK"));

    let store = applier.dead_letter_store();
    let letters = store.list().await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:#?}");
    assert_eq!(letters[0].projection, "achievement-leaderboard-keys");
    assert!(
        letters[0]
            .error
            .contains("`high` is not a non-negative whole number"),
        "{}",
        letters[0].error
    );
    assert!(!letters[0].held && letters[1].held);
    assert_eq!(
        letters[0].record["new_image"]["score"],
        serde_json::json!({"S": "high"}),
        "the full record is kept"
    );

    // Redrive: the first letter still fails (its image says "high"), but the
    // writer's fix behind it applies, and its state supersedes the first.
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(
        (summary.redriven, summary.superseded, summary.still_failing),
        (1, 1, 0)
    );
    assert!(store.list().await.unwrap().is_empty());
    let stored = get(&client, &table, "USER#u1", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert_eq!(text(&stored, "GSI1PK").as_deref(), Some("TIER#silver"));
    assert_eq!(text(&stored, "GSI1SK").as_deref(), Some("SCORE#0012"));
}

/// A spec whose GSI key template reads `{attr}` from email items.
fn email_spec(attr: &str) -> Arc<Spec> {
    let text = format!(
        r#"
service = "redrive-test"
[table]
name = "unused"
[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"
[entities.email]
pk = "USER#{{userId}}"
sk = "EMAIL#{{emailId}}"
[[projections]]
name = "email-gsi1-keys"
kind = "index-keys"
entity = "email"
set = {{ GSI1PK = "EMAIL#{{lower({attr})}}", GSI1SK = "USER#{{userId}}" }}
"#
    );
    Arc::new(Spec::from_toml(&text, "redrive-test.toml").unwrap())
}

#[tokio::test]
async fn redrive_after_a_spec_fix_applies_letters_in_order_and_releases_the_hold() {
    let client = support::client().await;
    let buggy = email_spec("address");
    let table = support::fresh_table(&client, &buggy, "redrive").await;
    let applier = control::applier(client.clone(), buggy, &table, ApplyConfig::default());
    let v1 = email("u1", "e1", "First@X.org", false);
    let v2 = email("u1", "e1", "Second@X.org", false);
    write(&client, &table, &v2).await;
    let records = [
        change(1, ChangeKind::Insert, None, Some(&v1)),
        change(2, ChangeKind::Modify, Some(&v1), Some(&v2)),
    ];
    let outcome = applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("attribute `address` is missing")),
        "{outcome:?}"
    );
    assert!(
        matches!(&outcome.statuses[1], RecordStatus::DeadLettered(_)),
        "{outcome:?}"
    );
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(
        letters.iter().map(|l| l.held).collect::<Vec<_>>(),
        vec![false, true]
    );
    // Redrive with the bug still there changes nothing and counts attempts.
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!((summary.redriven, summary.still_failing), (0, 2));

    // The team fixes the spec and redrives.
    let fixed = control::applier(
        client.clone(),
        email_spec("email"),
        &table,
        ApplyConfig::default(),
    );
    let summary = fixed.redrive(None).await.unwrap();
    assert_eq!((summary.redriven, summary.still_failing), (2, 0));
    assert!(fixed.dead_letter_store().list().await.unwrap().is_empty());
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&stored, "GSI1PK").as_deref(),
        Some("EMAIL#second@x.org"),
        "letters applied in stream order"
    );
    // The hold is released: new records apply directly.
    let v3 = email("u1", "e1", "third@x.org", false);
    write(&client, &table, &v3).await;
    let outcome = fixed
        .apply_batch(
            &[change(3, ChangeKind::Modify, Some(&v2), Some(&v3))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&stored, "GSI1PK").as_deref(),
        Some("EMAIL#third@x.org")
    );
}

#[tokio::test]
async fn a_derived_write_dynamodb_rejects_is_dead_lettered() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "reject").await;
    // A GSI partition key may be at most 2048 bytes: DynamoDB rejects the write.
    let long = format!("{}@x.org", "a".repeat(3000));
    let e = email("u1", "e1", &long, false);
    write(&client, &table, &e).await;
    let ok = email("u2", "e1", "fine@x.org", false);
    write(&client, &table, &ok).await;
    let outcome = applier
        .apply_batch(
            &[
                change(1, ChangeKind::Insert, None, Some(&e)),
                change(2, ChangeKind::Insert, None, Some(&ok)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("email-gsi1-keys")),
        "{outcome:?}"
    );
    assert_eq!(outcome.statuses[1], RecordStatus::Applied);
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].error.contains("Validation"),
        "{}",
        letters[0].error
    );
}

#[tokio::test]
async fn undecodable_records_are_dead_lettered_whole() {
    let support::Fixture {
        applier,
        client: _client,
        table: _table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "undec").await;
    let problem = DecodeProblem {
        index: 0,
        event_id: Some("bad-1".into()),
        sequence_number: Some("7".into()),
        reason: "the record has no Keys".into(),
        raw: serde_json::json!({"eventID": "bad-1", "eventName": "INSERT", "dynamodb": {"SequenceNumber": "7"}}),
    };
    let outcome = applier
        .apply_batch(&[Err(problem)], &BatchOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("no Keys"))
    );
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters[0].projection, "*");
    assert_eq!(letters[0].record["eventID"], "bad-1");
}

#[tokio::test]
async fn unrelated_and_bookkeeping_records_write_nothing() {
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "skip").await;
    let other = attrs(&[("PK", s("ORDER#1")), ("SK", s("ITEM#1"))]);
    let mine = attrs(&[("PK", s("_ddbp#checkpoint")), ("SK", s("x"))]);
    put(
        &client,
        &table,
        &[("PK", s("ORDER#1")), ("SK", s("ITEM#1"))],
    )
    .await;
    let outcome = applier
        .apply_batch(
            &[
                change(1, ChangeKind::Insert, None, Some(&other)),
                change(2, ChangeKind::Insert, None, Some(&mine)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(matches!(&outcome.statuses[0], RecordStatus::Skipped(r) if r.contains("no entity")));
    assert!(matches!(&outcome.statuses[1], RecordStatus::Skipped(r) if r.contains("bookkeeping")));
    assert_eq!(outcome.stats.writes, 0);
}

/// An email item of exactly `size` bytes as DynamoDB counts them (names
/// plus values, one byte per boolean), padded by a `notes` attribute.
fn email_of_size(user: &str, size: usize) -> Attrs {
    let mut item = email(user, "e1", "sam@x.org", false);
    let used: usize = item
        .iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    Av::S(text) => text.len(),
                    Av::Bool(_) => 1,
                    other => panic!("unexpected {other:?}"),
                }
        })
        .sum();
    let pad = size - used - "notes".len();
    item.insert("notes".to_string(), s(&"n".repeat(pad)));
    item
}

#[tokio::test]
async fn an_item_near_the_400_kb_limit_whose_derived_keys_do_not_fit_is_dead_lettered_without_its_images(
) {
    const LIMIT: usize = 400 * 1024;
    let support::Fixture {
        applier,
        client,
        table,
        spec: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "big").await;
    // GSI1PK = EMAIL#sam@x.org and GSI1SK = USER#uN add 34 bytes.
    let too_big = email_of_size("u1", LIMIT - 10);
    let fits = email_of_size("u2", LIMIT - 100);
    let small = email("u3", "e1", "fine@x.org", false);
    for item in [&too_big, &fits, &small] {
        write(&client, &table, item).await;
    }
    let batch = [
        change(1, ChangeKind::Insert, None, Some(&too_big)),
        change(2, ChangeKind::Insert, None, Some(&fits)),
        change(3, ChangeKind::Insert, None, Some(&small)),
    ];
    let outcome = applier
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .unwrap();
    // DynamoDB rejects the derived write. The letter cannot carry the
    // ~400 KB image, so it is stored without the images, with the size of
    // the whole record: the record is handled and the shard goes on.
    assert_eq!(
        outcome.statuses[0],
        RecordStatus::DeadLettered(vec![
            "email-gsi1-keys: ValidationException: Item size to update has exceeded the maximum allowed size"
                .to_string()
        ]),
        "{outcome:?}"
    );
    assert_eq!(outcome.statuses[1], RecordStatus::Applied, "{outcome:?}");
    assert_eq!(outcome.statuses[2], RecordStatus::Applied, "{outcome:?}");
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert!(
        letter.images_omitted.unwrap() > LIMIT,
        "{:?}",
        letter.images_omitted
    );
    assert_eq!(letter.record["event_id"], "e1", "{}", letter.record);
    assert!(letter.record.get("new_image").is_none());
    // Delivered again, it is the same letter (one more attempt), not lost.
    let again = applier
        .apply_batch(&batch[..1], &BatchOptions::default())
        .await
        .unwrap();
    assert!(again.statuses[0].is_handled(), "{again:?}");
    assert_eq!(
        applier.dead_letter_store().list().await.unwrap()[0].attempts,
        2
    );
    // The item is untouched; the other two carry their derived keys.
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert!(!stored.contains_key("GSI1PK"));
    assert_eq!(stored["notes"], too_big["notes"]);
    for user in ["u2", "u3"] {
        let stored = get(&client, &table, &format!("USER#{user}"), "EMAIL#e1")
            .await
            .unwrap();
        assert_eq!(
            text(&stored, "GSI1SK").as_deref(),
            Some(format!("USER#{user}").as_str())
        );
    }
    // After a data fix (the notes shrink), redrive reads the item's current
    // state, applies it and empties the store.
    let fixed = email_of_size("u1", 2_000);
    write(&client, &table, &fixed).await;
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(summary.redriven, 1, "{summary:?}");
    assert!(applier.dead_letter_store().list().await.unwrap().is_empty());
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(text(&stored, "GSI1PK").as_deref(), Some("EMAIL#sam@x.org"));
}

#[tokio::test]
async fn a_source_read_holding_a_type_newer_than_this_build_dead_letters_its_record_only() {
    let support::Fixture {
        applier: _,
        client,
        table,
        spec,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "dnunk").await;
    let (one, two) = (
        email("u1", "e1", "one@x.org", true),
        email("u2", "e1", "two@x.org", true),
    );
    for item in [&profile("u1"), &profile("u2"), &one, &two] {
        write(&client, &table, item).await;
    }
    // u1's partition comes back with `isVerified` of a type newer than
    // this build.
    let item = serde_json::json!({
        "PK": { "S": "USER#u1" }, "SK": { "S": "EMAIL#e1" },
        "emailId": { "S": "e1" }, "userId": { "S": "u1" },
        "email": { "S": "one@x.org" }, "isPrimary": { "BOOL": true },
        "isVerified": { "VECTOR": [1, 2] },
    });
    let odd = support::Answer {
        operation: "Query",
        needle: r#""USER#u1""#,
        body: serde_json::json!({ "Items": [item], "Count": 1, "ScannedCount": 1 }),
    }
    .client()
    .await;
    let applier = control::applier(odd, spec, &table, ApplyConfig::default());
    let records = [
        change(1, ChangeKind::Insert, None, Some(&one)),
        change(2, ChangeKind::Insert, None, Some(&two)),
    ];
    let outcome = applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    let RecordStatus::DeadLettered(reasons) = &outcome.statuses[0] else {
        panic!(
            "u1's record is dead-lettered, not {:?}",
            outcome.statuses[0]
        );
    };
    assert!(
        reasons
            .iter()
            .any(|r| r
                .contains("attribute `isVerified` has a DynamoDB type this build does not know")),
        "{reasons:?}"
    );
    assert_eq!(outcome.statuses[1], RecordStatus::Applied);
    let profile_two = get(&client, &table, "USER#u2", "PROFILE").await.unwrap();
    assert_eq!(text(&profile_two, "email").as_deref(), Some("two@x.org"));
    let profile_one = get(&client, &table, "USER#u1", "PROFILE").await.unwrap();
    assert_eq!(text(&profile_one, "email"), None);
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].projection, "profile-primary-email");
}

/// Found in review: numbers were compared through `f64`, so a copied
/// number that changed past its 17th digit (a nanosecond timestamp, a
/// snowflake id) was taken for unchanged and never written.
#[tokio::test]
async fn a_copied_number_that_changes_past_f64_precision_is_copied() {
    let spec = Arc::new(
        Spec::from_toml(
            r#"
service = "devices"

[table]
name = "Devices"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"

[entities.device]
pk = "USER#{userId}"
sk = "DEVICE#{deviceId}"

[[projections]]
name = "last-seen"
kind = "denormalize"
source = "device"
target = "profile"
when = { isPrimary = true }
copy = { lastSeenNs = "{seenNs}" }
"#,
            "devices.toml",
        )
        .unwrap(),
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec, "f64").await;
    let applier = control::applier(client.clone(), spec, &table, ApplyConfig::default());
    let device = |seen: &str| {
        attrs(&[
            ("PK", s("USER#u")),
            ("SK", s("DEVICE#d")),
            ("userId", s("u")),
            ("deviceId", s("d")),
            ("isPrimary", Av::Bool(true)),
            ("seenNs", Av::N(seen.to_string())),
        ])
    };
    let mut history = super::model::History::default();
    for item in [
        attrs(&[
            ("PK", s("USER#u")),
            ("SK", s("PROFILE")),
            ("userId", s("u")),
        ]),
        device("1700000000000000001"),
        device("1700000000000000002"),
    ] {
        write(&client, &table, &item).await;
        history.put(item);
        let outcome = applier
            .apply_batch(
                &history.records[history.records.len() - 1..],
                &BatchOptions::default(),
            )
            .await
            .unwrap();
        assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    }
    let profile = get(&client, &table, "USER#u", "PROFILE").await.unwrap();
    assert_eq!(
        profile.get("lastSeenNs"),
        Some(&Av::N("1700000000000000002".into()))
    );
}

/// The ledger of deliveries cleans up after processes that ended before
/// deleting their entries: the first batch of a table with a delivery, in
/// a process, starts deleting the entries that expired (in every partition
/// of the ledger), and records its own.
#[tokio::test]
async fn expired_entries_of_the_ledger_of_deliveries_are_deleted() {
    use ddb_projector::apply::{Delivered, Delivery};
    use ddb_projector::record::SequenceNumber;

    let support::Fixture {
        applier,
        client,
        table,
        ..
    } = support::fixture(
        support::shipped_spec("social-service.toml"),
        "ledger-expired",
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let partitions: Vec<String> = (0..16).map(|n| format!("_ddbp#delivered#{n:x}")).collect();
    for pk in &partitions {
        for (sk, expires) in [("long-gone", 1), ("still-current", now + 3600)] {
            write(
                &client,
                &table,
                &attrs(&[
                    ("PK", s(pk)),
                    ("SK", s(sk)),
                    ("through", s("1")),
                    ("expires", n(expires)),
                ]),
            )
            .await;
        }
    }
    let records = vec![change(
        1,
        ChangeKind::Insert,
        None,
        Some(&follow("a", "b", FOLLOWED_AT)),
    )];
    let delivered: Vec<Delivered> = records
        .iter()
        .flatten()
        .map(|r| Delivered {
            event_id: r.event_id.clone(),
            item: applier.spec().table.item_key(&r.keys),
            sequence_number: r.sequence_number.clone(),
        })
        .collect();
    let delivery = Delivery::new(
        "e1",
        SequenceNumber("1".into()),
        SequenceNumber("1".into()),
        Box::new(move || delivered.clone()),
    )
    .map(Arc::new);
    let outcome = applier
        .apply_batch(
            &records,
            &BatchOptions {
                delivery,
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
    assert_eq!(
        outcome.stats.requests.deliveries, 1,
        "{:?}",
        outcome.stats.requests
    );
    // The ledger's own items, by sort key (the deletes run on their own).
    let ledger = || async {
        let mut keys = Vec::new();
        for item in support::scan_all(&client, &table).await {
            if text(&item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#delivered#")) {
                keys.push(text(&item, "SK").unwrap());
            }
        }
        keys
    };
    let mut left = ledger().await;
    for _ in 0..50 {
        if !left.iter().any(|sk| sk == "long-gone") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        left = ledger().await;
    }
    assert!(!left.iter().any(|sk| sk == "long-gone"), "{left:?}");
    assert_eq!(
        left.iter().filter(|sk| *sk == "still-current").count(),
        16,
        "{left:?}"
    );
    assert_eq!(
        left.iter().filter(|sk| sk.starts_with("id#")).count(),
        1,
        "the batch's own entry: {left:?}"
    );
}

/// The sort key of a Lambda delivery's entry in the ledger: the FNV-1a
/// hash of the event id it is keyed by.
fn ledger_key(event_id: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in event_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("id#{hash:016x}")
}

/// Delivered records as the ledger of deliveries records them.
fn delivered_of(
    applier: &ddb_projector::apply::Applier,
    records: &[super::model::Record],
) -> Vec<ddb_projector::apply::Delivered> {
    records
        .iter()
        .flatten()
        .map(|r| ddb_projector::apply::Delivered {
            event_id: r.event_id.clone(),
            item: applier.spec().table.item_key(&r.keys),
            sequence_number: r.sequence_number.clone(),
        })
        .collect()
}

/// Found in review: a re-delivery skipped a follow because the delivery
/// before it held a later record of the same edge, but that record (a
/// change of an attribute no projection reads) plans nothing on its own.
/// The follow's write had failed, so the edge and its count were lost for
/// good. The item's last record is now planned as the item, wherever it
/// stands: in the re-delivery (a retry from the failed record), past what
/// the first delivery held, or alone in a piece that plans nothing
/// (bisection).
#[tokio::test]
async fn a_record_a_redelivery_skips_leaves_its_writes_to_its_items_last_record() {
    use ddb_projector::apply::Delivery;

    let support::Fixture {
        applier,
        client,
        table,
        spec,
    } = support::fixture(
        support::shipped_spec("social-service.toml"),
        "ledger-complete",
    )
    .await;
    let mut noted = follow("a", "b", FOLLOWED_AT);
    noted.insert("note".to_string(), s("read by no projection"));
    write(&client, &table, &follow("c", "d", FOLLOWED_AT)).await;
    write(&client, &table, &noted).await;
    let other = follow("c", "d", FOLLOWED_AT);
    let first = follow("a", "b", FOLLOWED_AT);
    let records = [
        change(1, ChangeKind::Insert, None, Some(&other)),
        change(2, ChangeKind::Insert, None, Some(&first)),
        change(3, ChangeKind::Modify, Some(&first), Some(&noted)),
    ];
    let delivery = |part: &[super::model::Record]| {
        let all = delivered_of(&applier, part);
        let first = all[0].sequence_number.clone();
        let through = all.last().unwrap().sequence_number.clone();
        let id = all[0].event_id.clone();
        Arc::new(Delivery::new(&id, first, through, Box::new(move || all.clone())).unwrap())
    };
    let apply = |part: &'static [usize], delivery: Arc<Delivery>| {
        let batch: Vec<_> = part.iter().map(|&i| records[i].clone()).collect();
        let applier = applier.clone();
        async move {
            let outcome = applier
                .apply_batch(
                    &batch,
                    &BatchOptions {
                        delivery: Some(delivery),
                        ..BatchOptions::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
        }
    };
    let exact = || async {
        assert!(
            get(&client, &table, "USER#b", "FOLLOWED_BY#a")
                .await
                .is_some(),
            "the edge a->b is lost"
        );
        assert_eq!(
            user_counter(&client, &table, &spec, "followers", "b").await,
            1
        );
        assert_eq!(
            user_counter(&client, &table, &spec, "following", "a").await,
            1
        );
        assert_eq!(
            user_counter(&client, &table, &spec, "followers", "d").await,
            1
        );
    };
    // 1. The first invocation, of [other, follow], writes only the other
    // follow (the edge a->b failed, throttled past its retries); the
    // change to `note` comes in the retry from the follow.
    apply(&[0], delivery(&records[..2])).await;
    applier
        .delivery_restarts_at(&delivery(&records[..2]), "e2")
        .await
        .unwrap();
    apply(&[1, 2], delivery(&records[1..])).await;
    exact().await;
    // 2. Bisected: the first invocation of all three wrote only the other
    // follow and crashed; Lambda sends [other, follow], then [note] alone.
    let fixture =
        support::fixture(support::shipped_spec("social-service.toml"), "ledger-piece").await;
    let (applier, client, table) = (fixture.applier, fixture.client, fixture.table);
    write(&client, &table, &follow("c", "d", FOLLOWED_AT)).await;
    write(&client, &table, &noted).await;
    let whole = delivery(&records);
    let run = |part: &'static [usize], delivery: Arc<Delivery>| {
        let batch: Vec<_> = part.iter().map(|&i| records[i].clone()).collect();
        let applier = applier.clone();
        async move {
            let options = BatchOptions {
                delivery: Some(delivery),
                ..BatchOptions::default()
            };
            let outcome = applier.apply_batch(&batch, &options).await.unwrap();
            assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
        }
    };
    run(&[0], whole).await;
    run(&[0, 1], delivery(&records[..2])).await;
    run(&[2], delivery(&records[2..])).await;
    assert!(
        get(&client, &table, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the edge a->b is lost when its last record comes alone"
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "b").await,
        1
    );
}

/// Found by the generated specs, under CI's load: a re-delivery whose
/// first record failed (its lease renewal met a transaction conflict)
/// noted that Lambda restarts there, at the delivery's own key. The
/// pointer took the place of the root the delivery had stored there, so
/// the retry found no root: it applied its item's last record as it was
/// (a change no projection reads, planning nothing), and the follow the
/// piece before it had skipped was lost with its count. A restart at a
/// delivery's own first record now leaves its entry as it is.
#[tokio::test]
async fn a_piece_failing_at_its_first_record_keeps_what_earlier_deliveries_held() {
    use super::faults::{Fault, Faults};
    use ddb_projector::apply::Delivery;

    let support::Fixture {
        applier,
        client,
        table,
        spec,
    } = support::fixture(
        support::shipped_spec("social-service.toml"),
        "ledger-restart",
    )
    .await;
    let mut noted = follow("a", "b", FOLLOWED_AT);
    noted.insert("note".to_string(), s("read by no projection"));
    write(&client, &table, &follow("c", "d", FOLLOWED_AT)).await;
    write(&client, &table, &noted).await;
    let other = follow("c", "d", FOLLOWED_AT);
    let first = follow("a", "b", FOLLOWED_AT);
    let records = [
        change(1, ChangeKind::Insert, None, Some(&other)),
        change(2, ChangeKind::Insert, None, Some(&first)),
        change(3, ChangeKind::Modify, Some(&first), Some(&noted)),
    ];
    let delivery = |part: &[super::model::Record]| {
        let all = delivered_of(&applier, part);
        let first = all[0].sequence_number.clone();
        let through = all.last().unwrap().sequence_number.clone();
        let id = all[0].event_id.clone();
        Arc::new(Delivery::new(&id, first, through, Box::new(move || all.clone())).unwrap())
    };
    let run = |applier: ddb_projector::apply::Applier,
               part: &'static [usize],
               delivery: Arc<Delivery>| {
        let batch: Vec<_> = part.iter().map(|&i| records[i].clone()).collect();
        async move {
            let options = BatchOptions {
                delivery: Some(delivery),
                ..BatchOptions::default()
            };
            applier.apply_batch(&batch, &options).await.unwrap()
        }
    };
    // Bisected: the first invocation of all three wrote only the other
    // follow and crashed; Lambda sends [other, follow] (the follow writes
    // nothing: the delivery before held a later record of its edge), then
    // [note] alone.
    let outcome = run(applier.clone(), &[0], delivery(&records)).await;
    assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
    let outcome = run(applier.clone(), &[0, 1], delivery(&records[..2])).await;
    assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
    // [note]'s invocation fails at its one record (DynamoDB refuses its
    // transaction), so the handler notes that Lambda restarts there.
    let faults = Faults::always(Fault::ServerError, &["TransactWriteItems"]);
    let failing = control::applier(
        faults.dynamodb(&support::sdk_config().await, false),
        spec.clone(),
        &table,
        ApplyConfig {
            max_retry_time: std::time::Duration::from_millis(200),
            ..ApplyConfig::default()
        },
    );
    let piece = delivery(&records[2..]);
    let outcome = run(failing.clone(), &[2], piece.clone()).await;
    assert_eq!(outcome.first_failure(), Some(0), "{:?}", outcome.statuses);
    assert!(
        piece.recorded(),
        "the piece found what was delivered before"
    );
    failing.delivery_restarts_at(&piece, "e3").await.unwrap();
    // Lambda delivers [note] again.
    let outcome = run(applier.clone(), &[2], delivery(&records[2..])).await;
    assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
    assert!(
        get(&client, &table, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the edge a->b is lost when the piece of its last record failed at its start"
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "b").await,
        1
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "a").await,
        1
    );
}

/// Found in review: the sweep deleted a completed delivery's entries an
/// hour later whatever they held by then. Lambda may send records again
/// after a batch succeeded (a restarted event source mapping); a delivery
/// of them in that hour rewrites the same entries, and its pieces need
/// them: deleted, the piece holding an item's last record found nothing,
/// applied it as it was, and the follow an earlier piece skipped was lost.
/// Each entry now carries its writer's mark, and the sweep deletes only
/// what is still its delivery's own.
#[tokio::test]
async fn the_sweep_leaves_the_entries_a_later_delivery_rewrote() {
    use ddb_projector::apply::Delivery;

    let support::Fixture {
        client,
        table,
        spec,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "ledger-sweep").await;
    // Completed deliveries' entries fall due after a second.
    let keep = std::time::Duration::from_millis(1000);
    let applier = control::applier(
        client.clone(),
        spec.clone(),
        &table,
        ApplyConfig {
            keep_deliveries: keep,
            ..ApplyConfig::default()
        },
    );
    let mut noted = follow("a", "b", FOLLOWED_AT);
    noted.insert("note".to_string(), s("read by no projection"));
    for item in [
        follow("c", "d", FOLLOWED_AT),
        noted.clone(),
        follow("x", "y", FOLLOWED_AT),
        follow("p", "q", FOLLOWED_AT),
    ] {
        write(&client, &table, &item).await;
    }
    let first = follow("a", "b", FOLLOWED_AT);
    let records = [
        change(
            1,
            ChangeKind::Insert,
            None,
            Some(&follow("c", "d", FOLLOWED_AT)),
        ),
        change(2, ChangeKind::Insert, None, Some(&first)),
        change(3, ChangeKind::Modify, Some(&first), Some(&noted)),
        change(
            4,
            ChangeKind::Insert,
            None,
            Some(&follow("x", "y", FOLLOWED_AT)),
        ),
        change(
            5,
            ChangeKind::Insert,
            None,
            Some(&follow("p", "q", FOLLOWED_AT)),
        ),
    ];
    let delivery = |part: &[super::model::Record]| {
        let all = delivered_of(&applier, part);
        let first = all[0].sequence_number.clone();
        let through = all.last().unwrap().sequence_number.clone();
        let id = all[0].event_id.clone();
        Arc::new(Delivery::new(&id, first, through, Box::new(move || all.clone())).unwrap())
    };
    let run = |part: &'static [usize], delivery: Arc<Delivery>| {
        let batch: Vec<_> = part.iter().map(|&i| records[i].clone()).collect();
        let applier = applier.clone();
        async move {
            let options = BatchOptions {
                delivery: Some(delivery),
                ..BatchOptions::default()
            };
            let outcome = applier.apply_batch(&batch, &options).await.unwrap();
            assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
        }
    };
    let ledger = || async {
        support::scan_all(&client, &table)
            .await
            .into_iter()
            .filter(|item| text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#delivered#")))
            .filter_map(|item| text(&item, "SK"))
            .collect::<Vec<String>>()
    };
    // The batch of the first three wrote only the other follow and
    // crashed; its first half came again and completed.
    run(&[0], delivery(&records[..3])).await;
    let half = delivery(&records[..2]);
    run(&[0, 1], half.clone()).await;
    applier.delivery_completed(&half);
    // The mapping restarted and sent [follow, note] again: the follow
    // writes nothing (a later record of its edge was delivered), and the
    // invocation ends before the note is applied.
    run(&[1], delivery(&records[1..3])).await;
    // Another batch completes; once both are due, the next batch starts
    // the sweep.
    let other = delivery(&records[3..4]);
    run(&[3], other.clone()).await;
    applier.delivery_completed(&other);
    tokio::time::sleep(keep + std::time::Duration::from_millis(100)).await;
    run(&[4], delivery(&records[4..])).await;
    let mut left = ledger().await;
    for _ in 0..50 {
        if !left.contains(&ledger_key("e4")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        left = ledger().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let left = ledger().await;
    assert!(
        !left.contains(&ledger_key("e4")),
        "the other batch's entry is swept: {left:?}"
    );
    for id in ["e1", "e2", "e3"] {
        assert!(
            left.contains(&ledger_key(id)),
            "the sweep leaves the entry at {id}, which [follow, note] rewrote: {left:?}"
        );
    }
    // The note comes alone.
    run(&[2], delivery(&records[2..3])).await;
    assert!(
        get(&client, &table, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the edge a->b is lost when the sweep deletes entries a later delivery rewrote"
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "b").await,
        1
    );
}

/// Found in review: a delivery whose entry in the ledger would pass its
/// size limit was stored without its event ids, but with its items' last
/// records. A re-delivery of its first half found it, skipped each
/// follow whose later record (a change no projection reads) was in the
/// second half, and pointed only from its own records; the second half
/// found nothing and applied those records as they came, planning
/// nothing: the edges and their counts were lost. Such a root is now
/// stored with neither, and a merge too large is not stored at all.
#[tokio::test]
async fn a_delivery_too_large_for_its_entry_loses_nothing_when_bisected() {
    use ddb_projector::apply::Delivery;

    let support::Fixture {
        applier,
        client,
        table,
        spec,
    } = support::fixture(support::shipped_spec("social-service.toml"), "ledger-large").await;
    // Keys of about 500 bytes: 320 items with two records each make an
    // entry of about 320 KB, past the ledger's 300 KB.
    let n = 320;
    let a = "a".repeat(480);
    let b = |k: usize| format!("{}{k:03}", "b".repeat(480));
    let mut records = Vec::new();
    for k in 0..n {
        records.push(change(
            k as u64 + 1,
            ChangeKind::Insert,
            None,
            Some(&follow(&a, &b(k), FOLLOWED_AT)),
        ));
    }
    for k in 0..n {
        let first = follow(&a, &b(k), FOLLOWED_AT);
        let mut noted = first.clone();
        noted.insert("note".to_string(), s("read by no projection"));
        write(&client, &table, &noted).await;
        records.push(change(
            (n + k) as u64 + 1,
            ChangeKind::Modify,
            Some(&first),
            Some(&noted),
        ));
    }
    let delivery = |part: &[super::model::Record]| {
        let all = delivered_of(&applier, part);
        let first = all[0].sequence_number.clone();
        let through = all.last().unwrap().sequence_number.clone();
        let id = all[0].event_id.clone();
        Arc::new(Delivery::new(&id, first, through, Box::new(move || all.clone())).unwrap())
    };
    let run = |batch: Vec<super::model::Record>, delivery: Arc<Delivery>| {
        let applier = applier.clone();
        async move {
            let options = BatchOptions {
                delivery: Some(delivery),
                ..BatchOptions::default()
            };
            let outcome = applier.apply_batch(&batch, &options).await.unwrap();
            assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
        }
    };
    // The first invocation of all of them wrote the first follow and
    // crashed; Lambda bisects.
    run(records[..1].to_vec(), delivery(&records)).await;
    run(records[..n].to_vec(), delivery(&records[..n])).await;
    run(records[n..].to_vec(), delivery(&records[n..])).await;
    let mut lost = Vec::new();
    for k in 0..n {
        if get(
            &client,
            &table,
            &format!("USER#{}", b(k)),
            &format!("FOLLOWED_BY#{a}"),
        )
        .await
        .is_none()
        {
            lost.push(k);
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {n} edges lost: {lost:?}",
        lost.len()
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", &a).await,
        n as i64
    );
}

/// Found in review: a re-delivery too large to store its merge plans by
/// the root it found, but its restart pointers pointed at its own key,
/// which holds only a pointer to that root. Each such retry that failed
/// again added a hop, and past four hops the root counted as gone: the
/// item's last record then applied as it came after the retries had
/// skipped the record before it. Restarts now point at the root itself.
#[tokio::test]
async fn a_restart_of_a_delivery_too_large_to_store_points_at_its_root() {
    use ddb_projector::apply::Delivery;

    let support::Fixture {
        applier,
        client,
        table,
        spec,
    } = support::fixture(
        support::shipped_spec("social-service.toml"),
        "ledger-anchor",
    )
    .await;
    // 200 items with two records fit an entry (about 200 KB); 350 do not.
    let (fit, n) = (200, 350);
    let a = "a".repeat(480);
    let b = |k: usize| format!("{}{k:03}", "b".repeat(480));
    let mut inserts = Vec::new();
    let mut modifies = Vec::new();
    for k in 0..n {
        let first = follow(&a, &b(k), FOLLOWED_AT);
        let mut noted = first.clone();
        noted.insert("note".to_string(), s("read by no projection"));
        write(&client, &table, &noted).await;
        inserts.push(change(k as u64 + 1, ChangeKind::Insert, None, Some(&first)));
        modifies.push(change(
            (n + k) as u64 + 1,
            ChangeKind::Modify,
            Some(&first),
            Some(&noted),
        ));
    }
    let delivery = |part: &[super::model::Record]| {
        let all = delivered_of(&applier, part);
        let first = all[0].sequence_number.clone();
        let through = all.iter().map(|d| d.sequence_number.clone()).max().unwrap();
        let id = all[0].event_id.clone();
        Arc::new(Delivery::new(&id, first, through, Box::new(move || all.clone())).unwrap())
    };
    let run = |batch: Vec<super::model::Record>, delivery: Arc<Delivery>| {
        let applier = applier.clone();
        async move {
            let options = BatchOptions {
                delivery: Some(delivery),
                ..BatchOptions::default()
            };
            let outcome = applier.apply_batch(&batch, &options).await.unwrap();
            assert_eq!(outcome.first_failure(), None, "{:?}", outcome.statuses);
        }
    };
    // D1: the first 200 items' records; it wrote its first record and
    // failed from the second on.
    let d1: Vec<_> = inserts[..fit]
        .iter()
        .chain(&modifies[..fit])
        .cloned()
        .collect();
    let first = delivery(&d1);
    run(d1[..1].to_vec(), first.clone()).await;
    applier.delivery_restarts_at(&first, "e2").await.unwrap();
    // D2, from the second record, with 150 more items: too large to store
    // its merge, it plans by D1's root; it fails at the sixth item's
    // modify.
    let d2: Vec<_> = inserts[1..].iter().chain(&modifies).cloned().collect();
    let second = delivery(&d2);
    run(d2[..1].to_vec(), second.clone()).await;
    let restart = &modifies[5].as_ref().unwrap().event_id;
    applier
        .delivery_restarts_at(&second, restart)
        .await
        .unwrap();
    let pointer = support::scan_all(&client, &table)
        .await
        .into_iter()
        .find(|item| text(item, "SK").as_deref() == Some(ledger_key(restart).as_str()))
        .expect("the restart's pointer");
    assert_eq!(
        text(&pointer, "root"),
        Some(ledger_key("e1")),
        "the restart points at the root D2 planned by, not at its own key"
    );
    // D3, from the restart, applies the rest.
    let d3: Vec<_> = modifies[5..].to_vec();
    run(d3, delivery(&modifies[5..])).await;
    run(d2[1..].to_vec(), delivery(&d2[1..])).await;
    let mut lost = Vec::new();
    for k in 0..n {
        if get(
            &client,
            &table,
            &format!("USER#{}", b(k)),
            &format!("FOLLOWED_BY#{a}"),
        )
        .await
        .is_none()
        {
            lost.push(k);
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {n} edges lost: {lost:?}",
        lost.len()
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", &a).await,
        n as i64
    );
}

/// A `denormalize` writes on condition of the values it copies, which can
/// go from A to B and back to A. A batch that read its target before its
/// first phase would let its write of B pass over that return: the copy
/// on the profile would stay B while the primary email says A. Read right
/// before its sources, the target already shows B and nothing is written.
#[tokio::test]
async fn a_denormalized_copy_is_never_written_over_a_return_to_its_value() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        applier,
        client,
        table,
        ..
    } = support::fixture(spec.clone(), "aba").await;
    write(&client, &table, &profile("u1")).await;
    let a = email("u1", "e1", "a@x.org", true);
    let b = email("u1", "e1", "b@x.org", true);
    write(&client, &table, &a).await;
    let outcome = applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&a))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));

    // Another worker (another stream shard) applies the email's changes.
    let endpoint = support::endpoint();
    let other = |from: Attrs, to: Attrs, seq: u64| {
        let (spec, table) = (spec.clone(), table.clone());
        move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let config = support::sdk_config_for(endpoint).await;
                let client = aws_sdk_dynamodb::Client::new(&config);
                write(&client, &table, &to).await;
                let worker = control::applier(client, spec.clone(), &table, ApplyConfig::default());
                let records = [change(seq, ChangeKind::Modify, Some(&from), Some(&to))];
                let outcome = worker
                    .apply_batch(&records, &BatchOptions::default())
                    .await
                    .unwrap();
                assert!(outcome.statuses.iter().all(|s| s.is_handled()));
            })
        }
    };
    // A to B while this batch writes its first phase (the email's index
    // keys); B back to A before this batch's write of the profile.
    let to_b: Arc<dyn Fn() + Send + Sync> = Arc::new(other(a.clone(), b.clone(), 10));
    let to_a: Arc<dyn Fn() + Send + Sync> = Arc::new(other(b.clone(), a.clone(), 11));
    let first_phase = support::BeforeRequest {
        operation: "UpdateItem",
        needles: &["EMAIL#e1", "GSI1PK"],
        action: to_b,
        fired: Arc::default(),
    };
    let profile_write = support::BeforeRequest {
        operation: "UpdateItem",
        needles: &["PROFILE"],
        action: to_a.clone(),
        fired: Arc::default(),
    };
    let config = support::sdk_config().await;
    let hooked = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(first_phase)
            .interceptor(profile_write.clone())
            .build(),
    );
    let batch = control::applier(hooked, spec.clone(), &table, ApplyConfig::default());
    // The email's change to A, delivered late (its GSI keys are written).
    let z = email("u1", "e1", "z@x.org", true);
    let outcome = batch
        .apply_batch(
            &[change(5, ChangeKind::Modify, Some(&z), Some(&a))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    if profile_write
        .fired
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        // The batch wrote no profile: the return to A happens now.
        std::thread::spawn(move || to_a()).join().unwrap();
    }
    let primary = text(
        &get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap(),
        "email",
    );
    assert_eq!(primary.as_deref(), Some("a@x.org"));
    let copied = text(
        &get(&client, &table, "USER#u1", "PROFILE").await.unwrap(),
        "email",
    );
    assert_eq!(
        copied, primary,
        "the profile's copy against its primary email"
    );
}
