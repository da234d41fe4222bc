//! `rollup` and `aggregate` against DynamoDB Local: the shipped specs'
//! totals under every order of their records, targets that appear late,
//! exact decimals, bad values, replays, backfill and audit.

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, BatchOptions, RecordStatus};
use ddb_projector::audit::{audit, AuditOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;
use ddb_projector::record::ChangeKind;

use super::model::{attrs, campaign, change, follow, profile, user_counter, Attrs, Record, Rng};
use super::support::{self, get, s};

async fn write(client: &aws_sdk_dynamodb::Client, table: &str, item: &Attrs) {
    super::model::put_item(client, table, item).await;
}

fn number(item: &Attrs, name: &str) -> Option<String> {
    match item.get(name) {
        Some(Av::N(n)) => Some(n.clone()),
        _ => None,
    }
}

/// Applies `records` in batches of random sizes, some records twice.
async fn deliver(applier: &Applier, records: &[Record], rng: &mut Rng) -> Vec<RecordStatus> {
    let mut statuses = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let size = 1 + rng.below(3) as usize;
        let end = (at + size).min(records.len());
        let batch = &records[at..end];
        let outcome = applier
            .apply_batch(batch, &BatchOptions::default())
            .await
            .expect("batch");
        statuses.extend(outcome.statuses);
        if rng.chance(30) {
            // A Lambda retry of the same batch.
            applier
                .apply_batch(batch, &BatchOptions::default())
                .await
                .expect("batch again");
        }
        at = end;
    }
    statuses
}

/// Interleaves per-item sequences (each item's records stay in order, as
/// Lambda keeps them) in a random order.
fn interleave(mut streams: Vec<Vec<Record>>, rng: &mut Rng) -> Vec<Record> {
    let mut out = Vec::new();
    for stream in &mut streams {
        stream.reverse();
    }
    loop {
        let open: Vec<usize> = (0..streams.len())
            .filter(|&i| !streams[i].is_empty())
            .collect();
        if open.is_empty() {
            return out;
        }
        let pick = open[rng.below(open.len() as u64) as usize];
        out.push(streams[pick].pop().expect("open"));
    }
}

#[tokio::test]
async fn rollups_equal_their_counters_in_every_order_and_wait_for_the_profile() {
    for seed in 0..4u64 {
        let mut rng = Rng::new(seed);
        let support::Fixture {
            applier,
            client,
            table,
            spec,
        } = support::fixture(support::shipped_spec("social-service.toml"), "rollup").await;
        // b has a profile from the start, a gets one late, d never does.
        let (ab, cb, db, ba) = (
            follow("a", "b", "t1"),
            follow("c", "b", "t2"),
            follow("d", "b", "t3"),
            follow("b", "a", "t4"),
        );
        let (pa, pb) = (profile("a"), profile("b"));
        for item in [&ab, &db, &ba, &pa, &pb] {
            write(&client, &table, item).await;
        }
        let mut seq = 0;
        let mut next = || {
            seq += 1;
            seq
        };
        let streams = vec![
            vec![change(next(), ChangeKind::Insert, None, Some(&pb))],
            vec![change(next(), ChangeKind::Insert, None, Some(&ab))],
            vec![
                change(next(), ChangeKind::Insert, None, Some(&cb)),
                change(next(), ChangeKind::Remove, Some(&cb), None),
            ],
            vec![change(next(), ChangeKind::Insert, None, Some(&db))],
            vec![change(next(), ChangeKind::Insert, None, Some(&ba))],
            vec![change(next(), ChangeKind::Insert, None, Some(&pa))],
        ];
        let records = interleave(streams, &mut rng);
        let statuses = deliver(&applier, &records, &mut rng).await;
        assert!(
            statuses
                .iter()
                .all(|s| matches!(s, RecordStatus::Applied | RecordStatus::Skipped(_))),
            "seed {seed}: {statuses:?}"
        );
        let b = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
        let a = get(&client, &table, "USER#a", "PROFILE").await.unwrap();
        for (user, item, counter, attribute) in [
            ("b", &b, "followers", "followersCount"),
            ("b", &b, "following", "followingCount"),
            ("a", &a, "followers", "followersCount"),
            ("a", &a, "following", "followingCount"),
        ] {
            let want = user_counter(&client, &table, &spec, counter, user).await;
            assert_eq!(
                number(item, attribute),
                Some(want.to_string()),
                "seed {seed}: {user}'s {attribute} against counter {counter}"
            );
        }
        assert_eq!(number(&b, "followersCount").as_deref(), Some("2"));
        assert_eq!(number(&a, "followingCount").as_deref(), Some("1"));
        // d follows b but has no profile: the rollup never creates one.
        assert!(get(&client, &table, "USER#d", "PROFILE").await.is_none());

        // Everything again (a full replay, other batches): the same state.
        // A replay re-lives the history (c follows b and leaves again), so
        // bookkeeping moves: the shards' churn and the totals' tokens.
        let key = |i: &Attrs| (support::text(i, "PK"), support::text(i, "SK"));
        let state = |items: Vec<Attrs>| -> Vec<Attrs> {
            items
                .into_iter()
                .map(|mut item| {
                    item.retain(|name, _| name != "changes" && !name.starts_with("_ddbp#v#"));
                    item
                })
                .collect()
        };
        let mut before = state(support::scan_all(&client, &table).await);
        deliver(&applier, &records, &mut rng).await;
        let mut after = state(support::scan_all(&client, &table).await);
        before.sort_by_key(key);
        after.sort_by_key(key);
        assert_eq!(before, after, "seed {seed}");
    }
}

#[tokio::test]
async fn a_writer_that_overwrites_the_profile_gets_its_totals_back() {
    let support::Fixture {
        applier,
        client,
        table,
        ..
    } = support::fixture(support::shipped_spec("social-service.toml"), "rollup-ow").await;
    let ab = follow("a", "b", "t1");
    let pb = profile("b");
    write(&client, &table, &ab).await;
    write(&client, &table, &pb).await;
    let records = [
        change(1, ChangeKind::Insert, None, Some(&pb)),
        change(2, ChangeKind::Insert, None, Some(&ab)),
    ];
    applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    assert_eq!(number(&stored, "followersCount").as_deref(), Some("1"));
    // The writer puts the profile back without the derived attributes.
    let mut renamed = pb.clone();
    renamed.insert("firstName".into(), s("Samantha"));
    write(&client, &table, &renamed).await;
    applier
        .apply_batch(
            &[change(3, ChangeKind::Modify, Some(&stored), Some(&renamed))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    assert_eq!(number(&stored, "followersCount").as_deref(), Some("1"));
    assert_eq!(number(&stored, "followingCount").as_deref(), Some("0"));
    assert_eq!(
        support::text(&stored, "firstName").as_deref(),
        Some("Samantha")
    );
}

fn perf(campaign: &str, date: &str, spend: Option<Av>, clicks: Option<i64>) -> Attrs {
    let mut item = attrs(&[
        ("PK", s(&format!("CAMPAIGN#{campaign}"))),
        ("SK", s(&format!("PERF#{date}"))),
        ("impressions", Av::N("1000".into())),
    ]);
    if let Some(spend) = spend {
        item.insert("spend".into(), spend);
    }
    if let Some(clicks) = clicks {
        item.insert("clicks".into(), Av::N(clicks.to_string()));
    }
    item
}

fn money(text: &str) -> Option<Av> {
    Some(Av::N(text.to_string()))
}

#[tokio::test]
async fn aggregate_totals_are_exact_in_every_order_and_follow_deletes() {
    for seed in 0..3u64 {
        let mut rng = Rng::new(seed);
        let support::Fixture {
            applier,
            client,
            table,
            ..
        } = support::fixture(support::shipped_spec("ads-platform.toml"), "aggregate").await;
        let c1 = campaign("c1", "p1", "ENABLED");
        let d1 = perf("c1", "2026-11-01", money("0.1"), Some(3));
        let d2 = perf("c1", "2026-11-02", money("0.2"), None);
        let d2b = perf("c1", "2026-11-02", money("0.25"), Some(4));
        let d3 = perf(
            "c1",
            "2026-11-03",
            money("12345678901234567890.01"),
            Some(1),
        );
        for item in [&c1, &d1, &d2b, &d3] {
            write(&client, &table, item).await;
        }
        let streams = vec![
            vec![change(1, ChangeKind::Insert, None, Some(&c1))],
            vec![change(2, ChangeKind::Insert, None, Some(&d1))],
            vec![
                change(3, ChangeKind::Insert, None, Some(&d2)),
                change(4, ChangeKind::Modify, Some(&d2), Some(&d2b)),
            ],
            vec![change(5, ChangeKind::Insert, None, Some(&d3))],
        ];
        let records = interleave(streams, &mut rng);
        deliver(&applier, &records, &mut rng).await;
        let stored = get(&client, &table, "CAMPAIGN#c1", "METADATA")
            .await
            .unwrap();
        // 0.1 + 0.25 + 12345678901234567890.01, digit by digit.
        assert_eq!(
            number(&stored, "totalSpend").as_deref(),
            Some("12345678901234567890.36"),
            "seed {seed}"
        );
        assert_eq!(number(&stored, "totalClicks").as_deref(), Some("8"));
        assert_eq!(number(&stored, "totalImpressions").as_deref(), Some("3000"));
        assert_eq!(number(&stored, "days").as_deref(), Some("3"));
        assert_eq!(
            support::text(&stored, "firstDate").as_deref(),
            Some("2026-11-01")
        );
        assert_eq!(
            support::text(&stored, "lastDate").as_deref(),
            Some("2026-11-03")
        );

        // Every snapshot goes: count() is 0, the other totals go.
        for (i, item) in [&d1, &d2b, &d3].into_iter().enumerate() {
            let key = (
                support::text(item, "PK").unwrap(),
                support::text(item, "SK").unwrap(),
            );
            support::delete(&client, &table, &key.0, &key.1).await;
            applier
                .apply_batch(
                    &[change(10 + i as u64, ChangeKind::Remove, Some(item), None)],
                    &BatchOptions::default(),
                )
                .await
                .unwrap();
        }
        let stored = get(&client, &table, "CAMPAIGN#c1", "METADATA")
            .await
            .unwrap();
        assert_eq!(number(&stored, "days").as_deref(), Some("0"));
        for gone in ["totalSpend", "totalClicks", "firstDate", "lastDate"] {
            assert!(!stored.contains_key(gone), "seed {seed}: {gone} stays");
        }
    }
}

#[tokio::test]
async fn aggregate_waits_for_its_target_and_names_a_bad_value() {
    let support::Fixture {
        applier,
        client,
        table,
        ..
    } = support::fixture(support::shipped_spec("ads-platform.toml"), "aggregate-bad").await;
    let d1 = perf("c2", "2026-11-01", money("5"), Some(1));
    write(&client, &table, &d1).await;
    let outcome = applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&d1))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    assert!(get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .is_none());
    // The campaign appears: its totals come with it.
    let c2 = campaign("c2", "p1", "ENABLED");
    write(&client, &table, &c2).await;
    applier
        .apply_batch(
            &[change(2, ChangeKind::Insert, None, Some(&c2))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let stored = get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .unwrap();
    assert_eq!(number(&stored, "totalSpend").as_deref(), Some("5"));

    // A snapshot whose spend is text cannot be summed: its record is a
    // dead letter naming the item, the attribute and the function.
    let bad = perf("c2", "2026-11-02", Some(s("lots")), Some(1));
    write(&client, &table, &bad).await;
    let outcome = applier
        .apply_batch(
            &[change(3, ChangeKind::Insert, None, Some(&bad))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let RecordStatus::DeadLettered(reasons) = &outcome.statuses[0] else {
        panic!("{:?}", outcome.statuses);
    };
    let reason = reasons.join("; ");
    for part in [
        "campaign-totals",
        "CAMPAIGN#c2",
        "PERF#2026-11-02",
        "`spend`",
        "sum(spend)",
    ] {
        assert!(reason.contains(part), "{part} missing from: {reason}");
    }
    // Fixed by the writer: the totals take it in.
    let fixed = perf("c2", "2026-11-02", money("2.5"), Some(1));
    write(&client, &table, &fixed).await;
    let outcome = applier
        .apply_batch(
            &[change(4, ChangeKind::Modify, Some(&bad), Some(&fixed))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    // Held behind the item's dead letter (order per item) until redriven.
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(r) if r[0].contains("held")),
        "{:?}",
        outcome.statuses
    );
    let summary = applier.redrive(None).await.unwrap();
    assert_eq!(summary.still_failing, 0, "{summary:?}");
    let stored = get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .unwrap();
    assert_eq!(number(&stored, "totalSpend").as_deref(), Some("7.5"));
    assert_eq!(number(&stored, "days").as_deref(), Some("2"));
}

#[tokio::test]
async fn backfill_derives_totals_and_audit_finds_and_repairs_drift() {
    for file in ["social-service.toml", "ads-platform.toml"] {
        let support::Fixture {
            applier,
            client,
            table,
            spec,
        } = support::fixture(support::shipped_spec(file), "kinds-audit").await;
        // Source items written without a stream: a backfill derives.
        for item in [
            follow("a", "b", "t1"),
            follow("c", "b", "t2"),
            profile("b"),
            profile("c"),
            campaign("c1", "p1", "ENABLED"),
            perf("c1", "2026-11-01", money("1.5"), Some(2)),
            perf("c1", "2026-11-02", money("2"), Some(3)),
        ] {
            write(&client, &table, &item).await;
        }
        let summary = backfill(
            &applier,
            &BackfillOptions {
                progress: false,
                ..BackfillOptions::default()
            },
        )
        .await
        .expect("backfill");
        assert!(summary.is_done());
        let options = AuditOptions {
            segments: 2,
            repair: false,
            progress: false,
            page_size: Some(3),
            ..AuditOptions::default()
        };
        let clean = audit(&applier, &options).await.expect("audit");
        assert!(clean.is_clean(), "{file}: {}", clean.to_text(&spec));
        let (target, attribute, want) = if file.starts_with("social") {
            (("USER#b", "PROFILE"), "followersCount", "2")
        } else {
            (("CAMPAIGN#c1", "METADATA"), "totalSpend", "3.5")
        };
        let stored = get(&client, &table, target.0, target.1).await.unwrap();
        assert_eq!(number(&stored, attribute).as_deref(), Some(want), "{file}");

        // Drift: a hand-written total.
        let mut drifted = stored.clone();
        drifted.insert(attribute.into(), Av::N("99".into()));
        write(&client, &table, &drifted).await;
        let report = audit(&applier, &options).await.expect("audit");
        let found: Vec<(String, String)> = report
            .findings
            .iter()
            .map(|f| (f.problem.label(), f.key.clone()))
            .collect();
        assert_eq!(
            found,
            [("stale".to_string(), format!("{} / {}", target.0, target.1))],
            "{file}: {}",
            report.to_text(&spec)
        );
        let repaired = audit(
            &applier,
            &AuditOptions {
                repair: true,
                ..options.clone()
            },
        )
        .await
        .expect("repair");
        assert_eq!(repaired.repaired, 1, "{}", repaired.to_text(&spec));
        let stored = get(&client, &table, target.0, target.1).await.unwrap();
        assert_eq!(number(&stored, attribute).as_deref(), Some(want), "{file}");
        let after = audit(&applier, &options).await.expect("audit");
        assert!(after.is_clean(), "{file}: {}", after.to_text(&spec));
    }
}

/// Claims `ids` for `run` (waiting out other definitions' leases) and
/// backfills them; the names recorded as backfilled.
async fn claimed_backfill(applier: &Applier, ids: Vec<usize>, run: &str) -> Vec<String> {
    use ddb_projector::control::{ClaimOutcome, Registry};
    use ddb_projector::dynamo::time::now_ms;
    let registry = Registry::new(
        applier.client().clone(),
        applier.table(),
        &applier.spec().table,
    )
    .with_skew(0);
    loop {
        match registry
            .claim(applier.spec(), &ids, run)
            .await
            .expect("claim")
        {
            ClaimOutcome::Claimed => break,
            ClaimOutcome::Wait { until, .. } => {
                let left = until.saturating_sub(now_ms()) + 20;
                tokio::time::sleep(std::time::Duration::from_millis(left)).await;
            }
            other => panic!("claim: {other:?}"),
        }
    }
    let summary = backfill(
        applier,
        &BackfillOptions {
            projections: Some(ids),
            progress: false,
            run: Some(run.to_string()),
            ..BackfillOptions::default()
        },
    )
    .await
    .expect("backfill");
    assert!(
        summary.is_done() && summary.not_backfilled.is_empty(),
        "{summary:?}"
    );
    summary.backfilled
}

async fn states(applier: &Applier, spec: &ddb_projector::spec::Spec) -> Vec<(String, String)> {
    use ddb_projector::control::{self, Registry};
    let registry = Registry::new(applier.client().clone(), applier.table(), &spec.table);
    let snapshot = registry.snapshot(spec).await.expect("the registry");
    control::states(
        spec,
        &snapshot,
        ddb_projector::dynamo::time::now_ms(),
        0,
        &std::collections::HashMap::new(),
        &control::Commands::default(),
    )
    .into_iter()
    .map(|row| (row.name, format!("{:?}", row.state)))
    .collect()
}

#[tokio::test]
async fn a_rollup_is_rebuilt_with_its_counter_and_ends_live_and_exact() {
    use ddb_projector::apply::ApplyConfig;
    use ddb_projector::control::Registry;
    use ddb_projector::spec::Spec;
    use std::sync::Arc;
    let text =
        std::fs::read_to_string(support::repo().join("projections/social-service.toml")).unwrap();
    // v2 counts close follows only, on 16 shards: other values than v1's.
    let changed = text.replace(
        "of = { userId = \"{followeeId}\" }\nshards = 8",
        "of = { userId = \"{followeeId}\" }\nwhen = { close = true }\nshards = 16",
    );
    assert_ne!(changed, text);
    let v1 = Arc::new(Spec::from_toml(&text, "v1.toml").unwrap());
    let v2 = Arc::new(Spec::from_toml(&changed, "v2.toml").unwrap());
    let config = ApplyConfig {
        lease: std::time::Duration::from_millis(300),
        clock_skew: std::time::Duration::ZERO,
        ..ApplyConfig::default()
    };
    // No fixture: its applier's leases (default length) would be the ones
    // this table's v1 appliers share in this process.
    let client = support::client().await;
    let table = support::fresh_table(&client, &v1, "rollup-life").await;
    for (a, close) in [("a", true), ("c", false), ("d", true)] {
        let mut edge = follow(a, "b", "t");
        edge.insert("close".into(), Av::Bool(close));
        write(&client, &table, &edge).await;
    }
    write(&client, &table, &profile("b")).await;
    // Deployed: a worker of v1 runs (and holds its leases) from here on.
    let worker1 = control::stream_consumer(client.clone(), v1.clone(), &table, config.clone());
    worker1.take_leases().await.unwrap();
    let applier1 = control::applier(client.clone(), v1.clone(), &table, config.clone());
    claimed_backfill(&applier1, (0..v1.projections.len()).collect(), "r1").await;
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    assert_eq!(number(&stored, "followersCount").as_deref(), Some("3"));

    // v2 deployed: the counter and its rollup are changed.
    let registry = Registry::new(client.clone(), &table, &v2.table);
    let (laid, _) = registry.layout(&v2).await.unwrap();
    let laid = Arc::new(laid);
    let before = states(&applier1, &v2).await;
    let changed: Vec<String> = before
        .clone()
        .into_iter()
        .filter(|(_, state)| state != "Live")
        .map(|(name, _)| name)
        .collect();
    assert_eq!(changed, ["followers", "followers-count"], "{before:?}");
    // The team deploys v2 and backfills the counter: its rollup comes
    // with it.
    let worker2 = control::stream_consumer(client.clone(), laid.clone(), &table, config.clone());
    worker2.take_leases().await.unwrap();
    // While the counter is rebuilt, readers read v1's version, kept
    // current: so does the rollup, through a follow and a writer's put.
    let mut eb = follow("e", "b", "t");
    eb.insert("close".into(), Av::Bool(true));
    write(&client, &table, &eb).await;
    let pb = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let mut renamed = profile("b");
    renamed.insert("firstName".into(), s("Bea"));
    write(&client, &table, &renamed).await;
    worker2
        .apply_batch(
            &[
                change(100, ChangeKind::Insert, None, Some(&eb)),
                change(101, ChangeKind::Modify, Some(&pb), Some(&renamed)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let read = user_counter(&client, &table, &v2, "followers", "b").await;
    assert_eq!(
        read, 4,
        "readers read v1's version until the rebuild completes"
    );
    assert_eq!(number(&stored, "followersCount"), Some(read.to_string()));
    // A follow only v1's version counts (not close) moves only its shards:
    // the rollup follows them too.
    let gb = follow("g", "b", "t");
    write(&client, &table, &gb).await;
    worker2
        .apply_batch(
            &[change(103, ChangeKind::Insert, None, Some(&gb))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let read = user_counter(&client, &table, &v2, "followers", "b").await;
    assert_eq!(read, 5);
    assert_eq!(number(&stored, "followersCount"), Some(read.to_string()));
    let applier2 = control::applier(client.clone(), laid.clone(), &table, config);
    let done = claimed_backfill(
        &applier2,
        vec![laid.projection_id("followers").unwrap()],
        "r2",
    )
    .await;
    assert!(done.contains(&"followers-count".to_string()), "{done:?}");
    let after = states(&applier2, &v2).await;
    assert!(
        after.iter().all(|(name, state)| state
            == if v2.projection_id(name).is_some() {
                "Live"
            } else {
                "Retired"
            }),
        "{after:?}"
    );
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let counted = user_counter(&client, &table, &v2, "followers", "b").await;
    assert_eq!(counted, 3, "v2 counts the close follows: a, d, e");
    assert_eq!(number(&stored, "followersCount"), Some(counted.to_string()));
    // The worker laid out before the switch keeps the rollup on the
    // version readers read now.
    let fb = follow("f", "b", "t");
    write(&client, &table, &fb).await;
    worker2
        .apply_batch(
            &[change(102, ChangeKind::Insert, None, Some(&fb))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let counted = user_counter(&client, &table, &v2, "followers", "b").await;
    assert_eq!(counted, 3, "f's follow is not close");
    assert_eq!(number(&stored, "followersCount"), Some(counted.to_string()));
}

/// Reads `user`'s rollup `attribute` and the counter it totals.
async fn total_and_counter(
    fixture: &support::Fixture,
    user: &str,
    attribute: &str,
    counter: &str,
) -> (Option<String>, i64) {
    let stored = get(
        &fixture.client,
        &fixture.table,
        &format!("USER#{user}"),
        "PROFILE",
    )
    .await
    .expect("profile");
    let counted = user_counter(
        &fixture.client,
        &fixture.table,
        &fixture.spec,
        counter,
        user,
    )
    .await;
    (number(&stored, attribute), counted)
}

#[tokio::test]
async fn a_count_the_planner_did_not_foresee_still_moves_the_rollup() {
    // The stream starts mid-history (or the counter was added over live
    // edges): a MODIFY of a follow whose INSERT this worker never saw.
    // The planner guesses the edge is counted already; the applier finds
    // it is not and counts it. The rollup must follow what was applied.
    let fixture =
        support::fixture(support::shipped_spec("social-service.toml"), "rollup-guess").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let pb = profile("b");
    let old = follow("a", "b", "t1");
    let new = follow("a", "b", "t2");
    write(client, table, &pb).await;
    write(client, table, &new).await;
    fixture
        .applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&pb))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    fixture
        .applier
        .apply_batch(
            &[change(2, ChangeKind::Modify, Some(&old), Some(&new))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let (total, counted) = total_and_counter(&fixture, "b", "followersCount", "followers").await;
    assert_eq!(counted, 1);
    assert_eq!(total, Some(counted.to_string()));
}

#[tokio::test]
async fn redriving_a_rollups_letter_brings_the_total() {
    // The profile is too large to take the total: the rollup's write is a
    // dead letter on the follow's record. Once the profile is trimmed, a
    // redrive of that letter alone must bring the total.
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-redrive",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let mut pb = profile("b");
    pb.insert("bio".into(), s(&"x".repeat(409_545)));
    write(client, table, &pb).await;
    let ab = follow("a", "b", "t1");
    write(client, table, &ab).await;
    let outcome = fixture
        .applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&ab))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&outcome.statuses[0], RecordStatus::DeadLettered(_)),
        "{:?}",
        outcome.statuses
    );
    // The writer trims the profile with an update (the token, never
    // written, stays absent; no record of the profile is delivered here).
    client
        .update_item()
        .table_name(table)
        .key("PK", s("USER#b"))
        .key("SK", s("PROFILE"))
        .update_expression("REMOVE bio")
        .send()
        .await
        .unwrap();
    let summary = fixture.applier.redrive(None).await.unwrap();
    assert_eq!(summary.still_failing, 0, "{summary:?}");
    let (total, counted) = total_and_counter(&fixture, "b", "followersCount", "followers").await;
    assert_eq!(counted, 1);
    assert_eq!(total, Some(counted.to_string()));
}

#[tokio::test]
async fn audit_repair_recounts_shards_before_it_recomputes_rollups() {
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-repair",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let pb = profile("b");
    let ab = follow("a", "b", "t1");
    write(client, table, &pb).await;
    write(client, table, &ab).await;
    fixture
        .applier
        .apply_batch(
            &[
                change(1, ChangeKind::Insert, None, Some(&pb)),
                change(2, ChangeKind::Insert, None, Some(&ab)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    // Someone bumps every shard of followers(b) by hand; a later change
    // of the profile makes the rollup take the wrong sum in.
    for shard in 0..8 {
        client
            .update_item()
            .table_name(table)
            .key("PK", s(&format!("COUNTER#followers#b#{shard}")))
            .key("SK", s("COUNTER"))
            .update_expression("ADD #c :n")
            .expression_attribute_names("#c", "count")
            .expression_attribute_values(":n", Av::N("3".into()))
            .send()
            .await
            .unwrap();
    }
    let stored = get(client, table, "USER#b", "PROFILE").await.unwrap();
    let mut renamed = pb.clone();
    renamed.insert("firstName".into(), s("Bea"));
    write(client, table, &renamed).await;
    fixture
        .applier
        .apply_batch(
            &[change(3, ChangeKind::Modify, Some(&stored), Some(&renamed))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let (total, _) = total_and_counter(&fixture, "b", "followersCount", "followers").await;
    assert_eq!(total.as_deref(), Some("25"));
    let options = AuditOptions {
        repair: true,
        progress: false,
        ..AuditOptions::default()
    };
    audit(&fixture.applier, &options).await.expect("repair");
    let (total, counted) = total_and_counter(&fixture, "b", "followersCount", "followers").await;
    assert_eq!(counted, 1);
    assert_eq!(total, Some(counted.to_string()));
    let again = audit(
        &fixture.applier,
        &AuditOptions {
            repair: false,
            ..options
        },
    )
    .await
    .expect("audit");
    assert!(again.is_clean(), "{}", again.to_text(&fixture.spec));
}

#[tokio::test]
async fn an_aggregate_totals_only_the_items_its_target_key_names() {
    // Per-region totals: the target's key binds a variable of the
    // source's sort key, so a partition holds several targets' items.
    let text = std::fs::read_to_string(support::repo().join("projections/ads-platform.toml"))
        .unwrap()
        .replace(
            "[entities.performance]\npk = \"CAMPAIGN#{campaignId}\"\nsk = \"PERF#{date}\"",
            "[entities.performance]\npk = \"CAMPAIGN#{campaignId}\"\nsk = \"PERF#{region}#{date}\"\n\n[entities.region]\npk = \"CAMPAIGN#{campaignId}\"\nsk = \"REGION#{region}\"",
        )
        .replace(
            "source = \"performance\"\ntarget = \"campaign\"",
            "source = \"performance\"\ntarget = \"region\"",
        );
    let spec = std::sync::Arc::new(
        ddb_projector::spec::Spec::from_toml(&text, "regions.toml").expect("compiles"),
    );
    let fixture = support::fixture(spec, "aggregate-region").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let region = |r: &str| {
        attrs(&[
            ("PK", s("CAMPAIGN#c1")),
            ("SK", s(&format!("REGION#{r}"))),
            ("campaignId", s("c1")),
        ])
    };
    let day = |r: &str, spend: &str| {
        attrs(&[
            ("PK", s("CAMPAIGN#c1")),
            ("SK", s(&format!("PERF#{r}#2026-11-01"))),
            ("spend", Av::N(spend.into())),
        ])
    };
    let mut records = Vec::new();
    for (i, item) in [region("eu"), region("us"), day("eu", "1"), day("us", "10")]
        .iter()
        .enumerate()
    {
        write(client, table, item).await;
        records.push(change(i as u64 + 1, ChangeKind::Insert, None, Some(item)));
    }
    fixture
        .applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    for (r, want) in [("eu", "1"), ("us", "10")] {
        let stored = get(client, table, "CAMPAIGN#c1", &format!("REGION#{r}"))
            .await
            .unwrap();
        assert_eq!(number(&stored, "totalSpend").as_deref(), Some(want), "{r}");
        assert_eq!(number(&stored, "days").as_deref(), Some("1"), "{r}");
    }
    let report = audit(
        &fixture.applier,
        &AuditOptions {
            progress: false,
            ..AuditOptions::default()
        },
    )
    .await
    .expect("audit");
    assert!(report.is_clean(), "{}", report.to_text(&fixture.spec));
}

#[tokio::test]
async fn a_rollups_backfill_cut_after_its_counter_completed_resumes_in_a_new_process() {
    use ddb_projector::apply::ApplyConfig;
    use ddb_projector::control::{ClaimOutcome, Registry};
    use ddb_projector::spec::Spec;
    use std::sync::Arc;
    let text =
        std::fs::read_to_string(support::repo().join("projections/social-service.toml")).unwrap();
    let changed = text.replace(
        "of = { userId = \"{followeeId}\" }\nshards = 8",
        "of = { userId = \"{followeeId}\" }\nwhen = { close = true }\nshards = 16",
    );
    let v1 = Arc::new(Spec::from_toml(&text, "v1.toml").unwrap());
    let v2 = Arc::new(Spec::from_toml(&changed, "v2.toml").unwrap());
    let config = ApplyConfig {
        lease: std::time::Duration::from_millis(300),
        clock_skew: std::time::Duration::ZERO,
        ..ApplyConfig::default()
    };
    let client = support::client().await;
    let table = support::fresh_table(&client, &v1, "rollup-resume").await;
    for (a, close) in [("a", true), ("c", false), ("d", true)] {
        let mut edge = follow(a, "b", "t");
        edge.insert("close".into(), Av::Bool(close));
        write(&client, &table, &edge).await;
    }
    for user in ["a", "b", "c", "d"] {
        write(&client, &table, &profile(user)).await;
    }
    let applier1 = control::applier(client.clone(), v1.clone(), &table, config.clone());
    claimed_backfill(&applier1, (0..v1.projections.len()).collect(), "r1").await;

    // v2: the counter is rebuilt. The backfill's first scan completes it,
    // then the process dies one page into the rollups' scan.
    let registry = Registry::new(client.clone(), &table, &v2.table).with_skew(0);
    let (laid, _) = registry.layout(&v2).await.unwrap();
    let laid = Arc::new(laid);
    let worker2 = control::stream_consumer(client.clone(), laid.clone(), &table, config.clone());
    worker2.take_leases().await.unwrap();
    let applier2 = control::applier(client.clone(), laid.clone(), &table, config.clone());
    let followers = laid.projection_id("followers").unwrap();
    loop {
        match registry.claim(&laid, &[followers], "r2").await.unwrap() {
            ClaimOutcome::Claimed => break,
            ClaimOutcome::Wait { .. } => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => panic!("claim: {other:?}"),
        }
    }
    let options = BackfillOptions {
        projections: Some(vec![followers]),
        progress: false,
        run: Some("r2".to_string()),
        page_size: 2,
        max_pages: Some(1),
        resume: true,
        ..BackfillOptions::default()
    };
    let mut cut = false;
    for _ in 0..50 {
        let summary = backfill(&applier2, &options).await.expect("backfill");
        if summary.backfilled.contains(&"followers".to_string()) {
            assert!(
                !summary.is_done(),
                "the rollups' scan reads more than a page"
            );
            cut = true;
            break;
        }
    }
    assert!(cut, "the counter's backfill never completed");

    // A new process lays the spec out anew (the counter is no longer
    // rebuilt) and resumes the run: the rollup alone is left to claim.
    let (relaid, _) = registry.layout(&v2).await.unwrap();
    let relaid = Arc::new(relaid);
    assert!(!relaid.rebuilding(relaid.projection_id("followers").unwrap()));
    let applier3 = control::applier(client.clone(), relaid.clone(), &table, config);
    let rollup3 = relaid.projection_id("followers-count").unwrap();
    assert_eq!(
        registry.claimed_run(&relaid, &[rollup3]).await.unwrap(),
        Some("r2".to_string())
    );
    let claimed = registry.claim(&relaid, &[rollup3], "r2").await.unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed), "{claimed:?}");
    let summary = backfill(
        &applier3,
        &BackfillOptions {
            projections: Some(vec![rollup3]),
            progress: false,
            run: Some("r2".to_string()),
            resume: true,
            ..BackfillOptions::default()
        },
    )
    .await
    .expect("backfill");
    assert!(summary.is_done());
    assert!(
        summary.not_backfilled.is_empty(),
        "{:?}",
        summary.not_backfilled
    );
    assert_eq!(summary.backfilled, ["followers-count"]);
    let states = states(&applier3, &v2).await;
    assert!(
        states.iter().all(|(name, state)| state
            == if v2.projection_id(name).is_some() {
                "Live"
            } else {
                "Retired"
            }),
        "{states:?}"
    );
    let stored = get(&client, &table, "USER#b", "PROFILE").await.unwrap();
    let counted = user_counter(&client, &table, &v2, "followers", "b").await;
    assert_eq!(counted, 2);
    assert_eq!(number(&stored, "followersCount"), Some(counted.to_string()));
}

/// An attribute value as DynamoDB's JSON writes it (the types a profile
/// holds).
fn json_value(value: &Av) -> serde_json::Value {
    match value {
        Av::S(s) => serde_json::json!({ "S": s }),
        Av::N(n) => serde_json::json!({ "N": n }),
        Av::Bool(b) => serde_json::json!({ "BOOL": b }),
        Av::M(map) => serde_json::json!({ "M": json_item(map) }),
        other => panic!("no JSON here for {other:?}"),
    }
}

fn json_item(item: &Attrs) -> serde_json::Value {
    item.iter()
        .map(|(name, value)| (name.clone(), json_value(value)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test]
async fn a_rollup_target_read_ahead_of_a_concurrent_recompute_is_only_a_first_guess() {
    // Worker A reads PROFILE b ahead of its batch (2 followers, token t).
    // Before A's follow moves the shard, worker B applies an unfollow and
    // writes 1 (token t+1). A's move brings the count back to 2, equal to
    // A's early copy: taking that copy as the target's state would leave
    // 1 for good (no record touches the profile again).
    let fixture =
        support::fixture(support::shipped_spec("social-service.toml"), "rollup-ahead").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let pb = profile("b");
    let (cb, db, ab) = (
        follow("c", "b", "t1"),
        follow("d", "b", "t1"),
        follow("a", "b", "t2"),
    );
    for item in [&pb, &cb, &db] {
        write(client, table, item).await;
    }
    let setup = [
        change(1, ChangeKind::Insert, None, Some(&pb)),
        change(2, ChangeKind::Insert, None, Some(&cb)),
        change(3, ChangeKind::Insert, None, Some(&db)),
    ];
    fixture
        .applier
        .apply_batch(&setup, &BatchOptions::default())
        .await
        .unwrap();
    let early = get(client, table, "USER#b", "PROFILE")
        .await
        .expect("the profile");
    assert_eq!(number(&early, "followersCount").as_deref(), Some("2"));

    // B: the unfollow.
    super::model::delete_item(
        client,
        table,
        attrs(&[("PK", s("USER#d")), ("SK", s("FOLLOWS#b"))]),
    )
    .await;
    fixture
        .applier
        .apply_batch(
            &[change(4, ChangeKind::Remove, Some(&db), None)],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let (total, counted) = total_and_counter(&fixture, "b", "followersCount", "followers").await;
    assert_eq!((total.as_deref(), counted), (Some("1"), 1));

    // A: its read-ahead answers what it read before B.
    write(client, table, &ab).await;
    let a = reading_profiles_ahead_as(&fixture, vec![json_item(&early)]).await;
    let outcome = a
        .apply_batch(
            &[change(5, ChangeKind::Insert, None, Some(&ab))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    assert_followers_total_follows_the_counter(&fixture, 2).await;
}

#[tokio::test]
async fn a_batchs_rollups_read_their_targets_and_shards_in_two_requests() {
    // Five users follow each other's neighbour: each profile gets both of
    // its rollups (followers, following) recomputed. Their targets are
    // read ahead together, and, the first phase done, their shards: two
    // requests, where each rollup reading its own took 16 (the targets,
    // the second rollup of each profile its target again, and each its
    // shards).
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-together",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let users = ["a", "b", "c", "d", "e"];
    let mut setup = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let item = profile(user);
        write(client, table, &item).await;
        setup.push(change(i as u64 + 1, ChangeKind::Insert, None, Some(&item)));
    }
    fixture
        .applier
        .apply_batch(&setup, &BatchOptions::default())
        .await
        .unwrap();
    let mut batch = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let item = follow(user, users[(i + 1) % users.len()], "t1");
        write(client, table, &item).await;
        batch.push(change(i as u64 + 10, ChangeKind::Insert, None, Some(&item)));
    }
    let outcome = fixture
        .applier
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| *s == RecordStatus::Applied));
    let requests = &outcome.stats.requests;
    assert_eq!(requests.recomputes, 10, "{requests:?}");
    assert_eq!(requests.recompute_reads, 2, "{requests:?}");
    for user in users {
        for (attribute, counter) in [
            ("followersCount", "followers"),
            ("followingCount", "following"),
        ] {
            let (total, counted) = total_and_counter(&fixture, user, attribute, counter).await;
            assert_eq!(
                (total, counted),
                (Some("1".to_string()), 1),
                "{user} {attribute}"
            );
        }
    }
}

#[tokio::test]
async fn a_rollup_that_starts_after_the_shared_read_reads_its_own_shards() {
    // One recompute at a time: each starts after the read before it was
    // answered, so none may compute from it (a concurrent move since
    // would be missed for as long as it waited for its slot). The first
    // reads every rollup's shards, each later one its own.
    let spec = support::shipped_spec("social-service.toml");
    let fixture = support::fixture(spec.clone(), "rollup-late").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let one_at_a_time = control::applier(
        client.clone(),
        spec,
        table,
        ddb_projector::apply::ApplyConfig {
            concurrency: 1,
            ..Default::default()
        },
    );
    let users = ["a", "b", "c"];
    let mut setup = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let item = profile(user);
        write(client, table, &item).await;
        setup.push(change(i as u64 + 1, ChangeKind::Insert, None, Some(&item)));
    }
    one_at_a_time
        .apply_batch(&setup, &BatchOptions::default())
        .await
        .unwrap();
    let mut batch = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let item = follow(user, users[(i + 1) % users.len()], "t1");
        write(client, table, &item).await;
        batch.push(change(i as u64 + 10, ChangeKind::Insert, None, Some(&item)));
    }
    let outcome = one_at_a_time
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| *s == RecordStatus::Applied));
    let requests = &outcome.stats.requests;
    assert_eq!(requests.recomputes, 6, "{requests:?}");
    // The targets read ahead, then one read per rollup.
    assert_eq!(requests.recompute_reads, 1 + 6, "{requests:?}");
    for user in users {
        assert_followers_total_follows_the_counter_of(&fixture, user, 1).await;
    }
}

#[tokio::test]
async fn a_shard_key_dynamodb_refuses_fails_only_its_own_rollup() {
    // A user id so long that the user's profile key fits DynamoDB's
    // 2,048 bytes and its counter shards' keys do not: its profile's
    // totals can never be recomputed. Read with every other rollup's
    // shards, those keys must not fail them too.
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-poison",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let long = "l".repeat(2_030);
    let (pb, pl, cb) = (profile("b"), profile(&long), follow("c", "b", "t1"));
    for item in [&pb, &pl, &cb] {
        write(client, table, item).await;
    }
    fixture
        .applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&pb))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let outcome = fixture
        .applier
        .apply_batch(
            &[
                change(2, ChangeKind::Insert, None, Some(&pl)),
                change(3, ChangeKind::Insert, None, Some(&cb)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    // (That the long profile's dead letter, keyed by its record's key,
    // cannot be stored either is another matter.)
    assert!(
        !matches!(outcome.statuses[0], RecordStatus::Applied),
        "{:?}",
        outcome.statuses
    );
    assert_eq!(
        outcome.statuses[1],
        RecordStatus::Applied,
        "{:?}",
        outcome.statuses
    );
    assert_followers_total_follows_the_counter(&fixture, 1).await;
}

#[tokio::test]
async fn shards_left_unprocessed_for_good_fail_the_record_in_its_retry_time() {
    // A table that answers every read of counter shards with the keys
    // unprocessed (as a throttled one may): asking again without end held
    // the batch past any deadline. The read is retried like a throttled
    // request and fails once the retry time is spent; the record is
    // delivered again and applied.
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-unprocessed",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let (pb, cb) = (profile("b"), follow("c", "b", "t1"));
    for item in [&pb, &cb] {
        write(client, table, item).await;
    }
    let records = [
        change(1, ChangeKind::Insert, None, Some(&pb)),
        change(2, ChangeKind::Insert, None, Some(&cb)),
    ];
    let throttled = support::Answer {
        operation: "BatchGetItem",
        needle: r#""COUNTER""#,
        body: serde_json::json!({
            "Responses": { table.as_str(): [] },
            "UnprocessedKeys": { table.as_str(): { "Keys": [
                { "PK": { "S": "USER#b" }, "SK": { "S": "COUNTER" } }
            ] } },
        }),
    }
    .client()
    .await;
    let config = ddb_projector::apply::ApplyConfig {
        max_retry_time: std::time::Duration::from_secs(2),
        ..Default::default()
    };
    let worker = control::applier(throttled, fixture.spec.clone(), table, config);
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        worker.apply_batch(&records, &BatchOptions::default()),
    )
    .await
    .expect("the batch ends")
    .unwrap();
    assert!(
        matches!(outcome.statuses[1], RecordStatus::Failed(_)),
        "{:?}",
        outcome.statuses
    );
    let outcome = fixture
        .applier
        .apply_batch(&records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| *s == RecordStatus::Applied));
    assert_followers_total_follows_the_counter(&fixture, 1).await;
}

#[tokio::test]
async fn a_rollup_found_equal_still_turns_back_a_recompute_that_read_before_it() {
    // Worker W counts d's follow of b (2) and is about to write 2 when
    // worker A counts c's unfollow (1 again) and finds the profile's 1
    // equal. Had A written nothing, W's write, on condition of the token
    // it read before A's move, would pass and leave 2 for good. A's shards
    // moved since the profile's write, so A moves the token (the shards'
    // version) though the total is equal; W is turned back, reads again,
    // and finds the total current from the very shards it read.
    let fixture =
        support::fixture(support::shipped_spec("social-service.toml"), "rollup-equal").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let (pb, cb, db) = (profile("b"), follow("c", "b", "t1"), follow("d", "b", "t1"));
    for item in [&pb, &cb] {
        write(client, table, item).await;
    }
    fixture
        .applier
        .apply_batch(
            &[
                change(1, ChangeKind::Insert, None, Some(&pb)),
                change(2, ChangeKind::Insert, None, Some(&cb)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert_followers_total_follows_the_counter(&fixture, 1).await;

    // A, on its own thread and client, right before W's write of b's total.
    let (spec, endpoint, name) = (fixture.spec.clone(), support::endpoint(), table.clone());
    let unfollow = cb.clone();
    let a: std::sync::Arc<dyn Fn() + Send + Sync> = std::sync::Arc::new(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let config = support::sdk_config_for(endpoint).await;
            let client = aws_sdk_dynamodb::Client::new(&config);
            super::model::delete_item(
                &client,
                &name,
                attrs(&[("PK", s("USER#c")), ("SK", s("FOLLOWS#b"))]),
            )
            .await;
            let worker = control::applier(
                client,
                spec.clone(),
                &name,
                ddb_projector::apply::ApplyConfig::default(),
            );
            let outcome = worker
                .apply_batch(
                    &[change(4, ChangeKind::Remove, Some(&unfollow), None)],
                    &BatchOptions::default(),
                )
                .await
                .unwrap();
            assert!(outcome.statuses.iter().all(|s| s.is_handled()));
        })
    });
    let before_w_writes = support::BeforeRequest {
        operation: "UpdateItem",
        needles: &["PROFILE", "followersCount"],
        action: a,
        fired: std::sync::Arc::default(),
    };
    let config = support::sdk_config().await;
    let hooked = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(before_w_writes.clone())
            .build(),
    );
    let w = control::applier(
        hooked,
        fixture.spec.clone(),
        table,
        ddb_projector::apply::ApplyConfig::default(),
    );
    write(client, table, &db).await;
    let outcome = w
        .apply_batch(
            &[change(3, ChangeKind::Insert, None, Some(&db))],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    assert_followers_total_follows_the_counter(&fixture, 1).await;
    assert_eq!(
        before_w_writes
            .fired
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "W wrote once, was turned back, and found the total current"
    );
}

#[tokio::test]
async fn a_rollups_own_write_and_a_replay_find_the_total_current_in_one_read() {
    // The profile's total was written from shards at some version; the
    // MODIFY of that write, and a replay of every record, read the same
    // shards: the token names that version, so each finds the total
    // current and writes nothing, without reading the profile again after
    // the read ahead (an equal total from a read ahead proved nothing).
    let fixture =
        support::fixture(support::shipped_spec("social-service.toml"), "rollup-echo").await;
    let (client, table) = (&fixture.client, &fixture.table);
    let (pb, pc, cb) = (profile("b"), profile("c"), follow("c", "b", "t1"));
    for item in [&pb, &pc, &cb] {
        write(client, table, item).await;
    }
    let history = vec![
        change(1, ChangeKind::Insert, None, Some(&pb)),
        change(2, ChangeKind::Insert, None, Some(&pc)),
        change(3, ChangeKind::Insert, None, Some(&cb)),
    ];
    fixture
        .applier
        .apply_batch(&history, &BatchOptions::default())
        .await
        .unwrap();
    assert_followers_total_follows_the_counter(&fixture, 1).await;
    let written = get(client, table, "USER#b", "PROFILE")
        .await
        .expect("the profile");
    let token = written
        .get("_ddbp#v#followers-count")
        .expect("the total's token");
    let echo = change(4, ChangeKind::Modify, Some(&pb), Some(&written));
    for (what, records) in [
        ("its own write", vec![echo.clone()]),
        ("a replay", {
            let mut all = history.clone();
            all.push(echo.clone());
            all
        }),
    ] {
        let outcome = fixture
            .applier
            .apply_batch(&records, &BatchOptions::default())
            .await
            .unwrap();
        assert!(outcome.statuses.iter().all(|s| s.is_handled()), "{what}");
        let requests = &outcome.stats.requests;
        assert!(requests.recomputes > 0, "{what}: {requests:?}");
        assert_eq!(requests.updates, 0, "{what}: {requests:?}");
        // The profiles read ahead, then the shards of their rollups.
        assert_eq!(requests.recompute_reads, 2, "{what}: {requests:?}");
        let now = get(client, table, "USER#b", "PROFILE").await.unwrap();
        assert_eq!(now.get("_ddbp#v#followers-count"), Some(token), "{what}");
    }
    assert_followers_total_follows_the_counter(&fixture, 1).await;
}

/// An applier on `fixture`'s table whose read ahead of profiles (the
/// batch's first `BatchGetItem` naming one) answers `profiles`: what
/// another worker may have read before a concurrent recompute.
async fn reading_profiles_ahead_as(
    fixture: &support::Fixture,
    profiles: Vec<serde_json::Value>,
) -> Applier {
    let client = support::Answer {
        operation: "BatchGetItem",
        needle: r#""PROFILE""#,
        body: serde_json::json!({
            "Responses": { fixture.table.as_str(): profiles },
            "UnprocessedKeys": {},
        }),
    }
    .client()
    .await;
    control::applier(
        client,
        fixture.spec.clone(),
        &fixture.table,
        ddb_projector::apply::ApplyConfig::default(),
    )
}

/// b's `followersCount` equals its `followers` counter, which is `want`.
async fn assert_followers_total_follows_the_counter(fixture: &support::Fixture, want: i64) {
    assert_followers_total_follows_the_counter_of(fixture, "b", want).await;
}

/// `user`'s `followersCount` equals its `followers` counter, `want`.
async fn assert_followers_total_follows_the_counter_of(
    fixture: &support::Fixture,
    user: &str,
    want: i64,
) {
    let (total, counted) = total_and_counter(fixture, user, "followersCount", "followers").await;
    assert_eq!(counted, want);
    assert_eq!(
        total,
        Some(counted.to_string()),
        "the total follows the counter"
    );
}

#[tokio::test]
async fn a_rollup_target_absent_when_read_ahead_is_read_again() {
    // The profile did not exist when A read ahead; it was created, and its
    // INSERT recomputed, before A's follow moved the shard. A must not
    // take the early absence as the last word.
    let fixture = support::fixture(
        support::shipped_spec("social-service.toml"),
        "rollup-absent",
    )
    .await;
    let (client, table) = (&fixture.client, &fixture.table);
    let (pb, cb, ab) = (profile("b"), follow("c", "b", "t1"), follow("a", "b", "t2"));
    for item in [&pb, &cb, &ab] {
        write(client, table, item).await;
    }
    fixture
        .applier
        .apply_batch(
            &[
                change(1, ChangeKind::Insert, None, Some(&cb)),
                change(2, ChangeKind::Insert, None, Some(&pb)),
            ],
            &BatchOptions::default(),
        )
        .await
        .unwrap();
    let a = reading_profiles_ahead_as(&fixture, Vec::new()).await;
    a.apply_batch(
        &[change(3, ChangeKind::Insert, None, Some(&ab))],
        &BatchOptions::default(),
    )
    .await
    .unwrap();
    assert_followers_total_follows_the_counter(&fixture, 2).await;
}
