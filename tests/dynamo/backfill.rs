//! Backfill against DynamoDB Local: items written before a projection
//! existed get their derived state from a scan.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use ddb_projector::apply::{ApplyConfig, BatchOptions, RecordStatus};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;

use super::model;
use super::support::{self, get, s, text};

/// Writes items with `BatchWriteItem`, 25 a call, 8 calls at a time.
async fn load(client: &aws_sdk_dynamodb::Client, table: &str, items: Vec<HashMap<String, Av>>) {
    use futures::stream::StreamExt;
    let chunks: Vec<Vec<HashMap<String, Av>>> = items.chunks(25).map(|c| c.to_vec()).collect();
    futures::stream::iter(chunks)
        .for_each_concurrent(8, |chunk| async move {
            let mut requests: Vec<WriteRequest> = chunk
                .into_iter()
                .map(|item| {
                    WriteRequest::builder()
                        .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                        .build()
                })
                .collect();
            while !requests.is_empty() {
                let output = client
                    .batch_write_item()
                    .request_items(table, requests.clone())
                    .send()
                    .await
                    .unwrap();
                requests = output
                    .unprocessed_items()
                    .and_then(|u| u.get(table))
                    .cloned()
                    .unwrap_or_default();
            }
        })
        .await;
}

fn email_item(i: usize) -> HashMap<String, Av> {
    support::item(&[
        ("PK", s(&format!("USER#u{i}"))),
        ("SK", s("EMAIL#e1")),
        ("emailId", s("e1")),
        ("userId", s(&format!("u{i}"))),
        ("email", s(&format!(" User{i}@Example.ORG"))),
        ("isPrimary", Av::Bool(false)),
    ])
}

fn quiet(options: BackfillOptions) -> BackfillOptions {
    BackfillOptions {
        progress: false,
        ..options
    }
}

#[tokio::test]
async fn twenty_thousand_items_get_their_gsi_keys_with_four_segments_and_a_second_run_writes_nothing(
) {
    // A server of its own: 20,000 items on a shared DynamoDB Local time out
    // the other tests' requests (and theirs ours), which DynamoDB never does.
    let client = aws_sdk_dynamodb::Client::new(
        &support::sdk_config_for(&support::dedicated_endpoint()).await,
    );
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "bf20k").await;
    let applier = control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    let n = 20_000;
    load(&client, &table, (0..n).map(email_item).collect()).await;
    let only = Some(vec![spec.projection_id("email-gsi1-keys").unwrap()]);
    let options = quiet(BackfillOptions {
        projections: only.clone(),
        segments: vec![0, 1, 2, 3],
        total_segments: 4,
        ..Default::default()
    });
    let first = backfill(&applier, &options).await.unwrap();
    // The scan also reads the backfill's own progress items.
    assert!(first.scanned >= n as u64, "{first:?}");
    assert_eq!(first.planned, n as u64);
    assert_eq!(first.segments_done, 4);
    eprintln!(
        "backfill of {n} items, 4 segments: {:.0} items/s, {:.0} WCU",
        first.items_per_second(),
        first.write_units
    );
    for i in [0, 1, 4_999, 12_345, n - 1] {
        let item = get(&client, &table, &format!("USER#u{i}"), "EMAIL#e1")
            .await
            .unwrap();
        assert_eq!(
            text(&item, "GSI1PK").as_deref(),
            Some(format!("EMAIL#user{i}@example.org").as_str())
        );
        assert_eq!(
            text(&item, "GSI1SK").as_deref(),
            Some(format!("USER#u{i}").as_str())
        );
    }
    let found = client
        .query()
        .table_name(&table)
        .index_name("GSI1")
        .key_condition_expression("GSI1PK = :pk")
        .expression_attribute_values(":pk", s("EMAIL#user777@example.org"))
        .send()
        .await
        .unwrap();
    assert_eq!(found.count, 1);
    assert_eq!(text(&found.items()[0], "PK").as_deref(), Some("USER#u777"));

    let second = backfill(&applier, &options).await.unwrap();
    assert!(second.scanned >= n as u64);
    assert_eq!(
        (second.planned, second.writes, second.write_units),
        (0, 0, 0.0),
        "{second:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_killed_twenty_times_resumes_and_ends_exact() {
    // A server of its own, as for the 20k test.
    let endpoint = support::dedicated_endpoint();
    let client = aws_sdk_dynamodb::Client::new(&support::sdk_config_for(&endpoint).await);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "bfkill").await;
    // 10,000 follows of 7 users (inverse edges and both counters) and 2,000
    // achievements (GSI keys), written before the projections existed.
    let n = 10_000;
    let mut items: Vec<_> = (0..n)
        .map(|i| model::follow(&format!("a{i}"), &format!("b{}", i % 7), "2026-11-01"))
        .collect();
    items.extend((0..2_000).map(|i| {
        model::achievement(
            &format!("a{i}"),
            "b1",
            ["gold", "silver"][i % 2],
            support::n(i as i64),
        )
    }));
    load(&client, &table, items).await;
    let args = |resume: bool| {
        let mut args = vec![
            "backfill".to_string(),
            "--spec".to_string(),
            support::repo()
                .join("projections/social-service.toml")
                .display()
                .to_string(),
            "--table".to_string(),
            table.clone(),
            "--segments".to_string(),
            "2".to_string(),
        ];
        if resume {
            args.push("--resume".to_string());
        }
        args
    };
    let backfill = |resume: bool| {
        let mut command = std::process::Command::new(support::binary());
        command
            .args(args(resume))
            .envs(support::env())
            .env("AWS_ENDPOINT_URL", &endpoint)
            .env("RUST_LOG", "warn");
        command
    };
    let seed = model::seed_from_env("BACKFILL_KILL_SEED", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let mut rng = model::Rng::new(seed);
    // SIGKILL it 20 times at random points, resuming each time.
    let mut edges = Vec::new();
    for kill in 0..20 {
        let mut child = backfill(kill > 0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill at a random point after this run has written something
        // (polled, so a slow machine still kills mid-work).
        let before = edges.last().copied().unwrap_or(0);
        let waited = std::time::Instant::now();
        while count(&client, &table, "USER#b0").await <= before
            && waited.elapsed() < std::time::Duration::from_secs(120)
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(rng.below(600))).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "seed {seed}: the backfill ended before kill {}; edges so far {edges:?}",
            kill + 1
        );
        child.kill().unwrap();
        child.wait().unwrap();
        edges.push(count(&client, &table, "USER#b0").await);
    }
    let output = backfill(true).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    eprintln!(
        "b0's edges after each of 20 kills: {edges:?}; resumed: {}",
        stderr.lines().last().unwrap_or("")
    );
    let expected_b0 = (0..n).filter(|i| i % 7 == 0).count();
    assert!(
        edges.last().is_some_and(|&last| last < expected_b0),
        "seed {seed}: the kills came after the work was done: {edges:?}"
    );
    model::assert_no_problems(
        &model::check_derived(&client, &table, &spec, &[]).await,
        &format!("seed {seed}"),
    );
    for b in 0..7 {
        let expected = (0..n).filter(|i| i % 7 == b).count() as i64;
        let value = ddb_projector::counter::read_counter(
            &client,
            &table,
            &spec,
            "followers",
            &[("userId".into(), format!("b{b}"))],
        )
        .await
        .unwrap();
        assert_eq!(value, expected, "followers of b{b}");
    }
}

async fn count(client: &aws_sdk_dynamodb::Client, table: &str, pk: &str) -> usize {
    let mut n = 0;
    let mut start = None;
    loop {
        let page = client
            .query()
            .table_name(table)
            .key_condition_expression("PK = :pk AND begins_with(SK, :p)")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":p", s("FOLLOWED_BY#"))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        n += page.count as usize;
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return n,
        }
    }
}

#[tokio::test]
async fn max_wcu_bounds_the_write_rate() {
    let support::Fixture {
        client,
        table,
        spec,
        applier,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "bfwcu").await;
    load(&client, &table, (0..1_500).map(email_item).collect()).await;
    let limit = 400.0;
    let summary = backfill(
        &applier,
        &quiet(BackfillOptions {
            projections: Some(vec![spec.projection_id("email-gsi1-keys").unwrap()]),
            segments: vec![0, 1],
            total_segments: 2,
            max_wcu: Some(limit),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    let rate = summary.write_units / summary.seconds;
    eprintln!(
        "--max-wcu {limit}: {:.0} WCU in {:.2} s = {rate:.0} WCU/s",
        summary.write_units, summary.seconds
    );
    assert!(
        summary.write_units >= 1_500.0,
        "every item was written: {summary:?}"
    );
    assert!(
        rate <= limit * 1.2,
        "{rate:.0} WCU/s exceeds the limit {limit} by more than 20%"
    );
}

#[tokio::test]
async fn a_counter_rebuild_equals_the_true_counts_and_a_stale_scan_never_undoes_a_live_change() {
    let support::Fixture {
        client,
        table,
        spec,
        applier,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "bfcnt").await;
    // Follows written before the counters existed; one of them already
    // counted by the live worker (its edge exists and the shard has 1).
    let follows: Vec<(usize, usize)> = (0..400).map(|i| (i, (i * 31) % 13)).collect();
    load(
        &client,
        &table,
        follows
            .iter()
            .map(|(a, b)| {
                support::item(&[
                    ("PK", s(&format!("USER#a{a}"))),
                    ("SK", s(&format!("FOLLOWS#b{b}"))),
                    ("followedAt", s("2026-11-01T00:00:00Z")),
                ])
            })
            .collect(),
    )
    .await;
    let summary = backfill(
        &applier,
        &quiet(BackfillOptions {
            segments: vec![0, 1, 2],
            total_segments: 3,
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    assert!(summary.scanned >= 400);
    for b in 0..13 {
        let truth = follows.iter().filter(|(_, x)| *x == b).count() as i64;
        let value = ddb_projector::counter::read_counter(
            &client,
            &table,
            &spec,
            "followers",
            &[("userId".into(), format!("b{b}"))],
        )
        .await
        .unwrap();
        assert_eq!(value, truth, "followers of b{b}");
    }
    // Again: nothing changes, nothing is counted twice.
    let again = backfill(&applier, &quiet(BackfillOptions::default()))
        .await
        .unwrap();
    assert_eq!(again.writes, 0, "{again:?}");

    // A scan read a follow that a writer deletes before the backfill writes
    // its marker: the guard keeps the backfill from resurrecting it.
    let ghost = support::item(&[
        ("PK", s("USER#ghost")),
        ("SK", s("FOLLOWS#b0")),
        ("followedAt", s("x")),
    ]);
    let record = ddb_projector::decode::decode_scanned_item(&spec.table, 0, 1, ghost);
    let outcome = applier
        .apply_batch(
            &[record],
            &BatchOptions {
                read_markers_first: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    assert!(get(&client, &table, "USER#b0", "FOLLOWED_BY#ghost")
        .await
        .is_none());
    let truth = follows.iter().filter(|(_, x)| *x == 0).count() as i64;
    let value = ddb_projector::counter::read_counter(
        &client,
        &table,
        &spec,
        "followers",
        &[("userId".into(), "b0".into())],
    )
    .await
    .unwrap();
    assert_eq!(value, truth);
}

#[tokio::test]
async fn dry_run_counts_without_writing_and_unknown_projections_are_listed() {
    let support::Fixture {
        client,
        table,
        spec: _spec,
        applier: _applier,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "bfdry").await;
    load(&client, &table, (0..50).map(email_item).collect()).await;
    let spec_path = support::repo().join("projections/user-service.toml");
    let output = std::process::Command::new(support::binary())
        .args([
            "backfill",
            "--spec",
            spec_path.to_str().unwrap(),
            "--table",
            &table,
            "--dry-run",
            "--projection",
            "email-gsi1-keys",
        ])
        .envs(support::env())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["scanned"], 50);
    assert_eq!(summary["planned"], 50);
    assert_eq!(summary["writes"], 0);
    assert!(!get(&client, &table, "USER#u1", "EMAIL#e1")
        .await
        .unwrap()
        .contains_key("GSI1PK"));

    let output = std::process::Command::new(support::binary())
        .args([
            "backfill",
            "--spec",
            spec_path.to_str().unwrap(),
            "--table",
            &table,
            "--projection",
            "email-keys",
        ])
        .envs(support::env())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no projection `email-keys`")
            && stderr.contains("email-gsi1-keys, profile-primary-email"),
        "{stderr}"
    );
}

/// What the Step Functions state machine does: one short slice per call,
/// each continuing from the segment's checkpoint, until the segment is done.
#[tokio::test]
async fn slices_resumed_call_after_call_finish_the_segment_exactly() {
    let support::Fixture {
        client,
        table,
        spec,
        applier,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "bfslice").await;
    load(&client, &table, (0..1_000).map(email_item).collect()).await;
    let projection = spec.projection_id("email-gsi1-keys").unwrap();
    let mut calls = 0;
    let mut planned = 0;
    loop {
        calls += 1;
        let slice = backfill(
            &applier,
            &quiet(BackfillOptions {
                projections: Some(vec![projection]),
                segments: vec![1],
                total_segments: 2,
                resume: true,
                max_pages: Some(1),
                ..Default::default()
            }),
        )
        .await
        .unwrap();
        planned += slice.planned;
        if slice.is_done() {
            break;
        }
        assert!(calls < 100, "the segment never finished");
    }
    assert!(calls > 2, "{calls} calls: slices were not short");
    // Segment 1 of 2 is about half the items; run segment 0 in one go.
    let rest = backfill(
        &applier,
        &quiet(BackfillOptions {
            projections: Some(vec![projection]),
            segments: vec![0],
            total_segments: 2,
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        planned + rest.planned,
        1_000,
        "every item planned exactly once"
    );
    for i in (0..1_000).step_by(97) {
        let item = get(&client, &table, &format!("USER#u{i}"), "EMAIL#e1")
            .await
            .unwrap();
        assert_eq!(
            text(&item, "GSI1SK").as_deref(),
            Some(format!("USER#u{i}").as_str())
        );
    }
}

#[tokio::test]
async fn a_scanned_value_of_an_unknown_type_is_dead_lettered_and_the_rest_backfilled() {
    let support::Fixture {
        client,
        table,
        spec,
        applier: _,
        ..
    } = support::fixture(support::shipped_spec("user-service.toml"), "bfunk").await;
    load(&client, &table, (0..10).map(email_item).collect()).await;
    // Every scan answers with the ten items, u3's `email` of a type newer
    // than this build.
    let items: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            let email = if i == 3 {
                serde_json::json!({ "VECTOR": [1, 2] })
            } else {
                serde_json::json!({ "S": format!(" User{i}@Example.ORG") })
            };
            serde_json::json!({
                "PK": { "S": format!("USER#u{i}") }, "SK": { "S": "EMAIL#e1" },
                "emailId": { "S": "e1" }, "userId": { "S": format!("u{i}") },
                "email": email, "isPrimary": { "BOOL": false },
            })
        })
        .collect();
    let odd = support::Answer {
        operation: "Scan",
        needle: "",
        body: serde_json::json!({ "Items": items, "Count": 10, "ScannedCount": 10 }),
    }
    .client()
    .await;
    let applier = control::applier(odd, spec.clone(), &table, ApplyConfig::default());
    let summary = backfill(&applier, &quiet(BackfillOptions::default()))
        .await
        .unwrap();
    assert_eq!(
        (summary.planned, summary.dead_letters),
        (9, 1),
        "{summary:?}"
    );
    for i in (0..10).filter(|&i| i != 3) {
        let item = get(&client, &table, &format!("USER#u{i}"), "EMAIL#e1")
            .await
            .unwrap();
        assert_eq!(
            text(&item, "GSI1PK"),
            Some(format!("EMAIL#user{i}@example.org"))
        );
    }
    let untouched = get(&client, &table, "USER#u3", "EMAIL#e1").await.unwrap();
    assert_eq!(untouched.get("GSI1PK"), None);
    let letters = applier.dead_letter_store().list().await.unwrap();
    let [letter] = letters.as_slice() else {
        panic!("one letter, not {letters:?}");
    };
    assert!(
        letter
            .error
            .contains("attribute `email` has a DynamoDB type this build does not know"),
        "{}",
        letter.error
    );
    // The letter keeps what the SDK kept of the item.
    assert_eq!(letter.record["PK"], serde_json::json!({ "S": "USER#u3" }));
    assert_eq!(
        letter.record["email"],
        serde_json::json!({ "UNKNOWN": null })
    );
}
