//! Counter membership and the marker items that carry it, against DynamoDB
//! Local, for specs other than the shipped ones and through spec changes:
//! edges without counters, counters added over live edges, one projection
//! replayed alone, backfills racing the live worker.

use std::sync::Arc;

use ddb_projector::apply::{Applier, ApplyConfig, BatchOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;
use ddb_projector::counter::read_counter;
use ddb_projector::decode::decode_scanned_item;
use ddb_projector::spec::{Marker, ProjectionKind, Spec};

use super::model::{attrs, delete_item, put_item, Attrs, History, Record};
use super::support::{self, get, s, text};

/// The social service's entities with the given projections.
fn social(projections: &str) -> Arc<Spec> {
    let text = format!(
        r#"
service = "membership-test"

[table]
name = "MembershipTest"
ttl_attribute = "ttl"

[entities.follow]
pk = "USER#{{followerId}}"
sk = "FOLLOWS#{{followeeId}}"

[entities.followed_by]
pk = "USER#{{followeeId}}"
sk = "FOLLOWED_BY#{{followerId}}"

{projections}
"#
    );
    Arc::new(Spec::from_toml(&text, "membership-test.toml").expect("the test spec compiles"))
}

const EDGE: &str = r#"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { followedAt = "{followedAt}", note = "{note}" }
"#;

const FOLLOWERS: &str = r#"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 8
"#;

const FOLLOWING: &str = r#"
[[projections]]
name = "following"
kind = "counter"
source = "follow"
of = { userId = "{followerId}" }
shards = 4
"#;

/// Both counters.
fn counters() -> String {
    format!("{FOLLOWERS}{FOLLOWING}")
}

fn follow(a: &str, b: &str, at: &str, note: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{a}"))),
        ("SK", s(&format!("FOLLOWS#{b}"))),
        ("followerId", s(a)),
        ("followeeId", s(b)),
        ("followedAt", s(at)),
        ("note", s(note)),
    ])
}

/// Writers and the live worker: writes go to the table and the stream
/// (the history); `drain` applies what the worker has not seen yet.
struct Live {
    client: aws_sdk_dynamodb::Client,
    table: String,
    history: History,
    applied: usize,
}

impl Live {
    async fn new(spec: &Spec, prefix: &str) -> Live {
        let client = support::client().await;
        let table = support::fresh_table(&client, spec, prefix).await;
        Live {
            client,
            table,
            history: History::default(),
            applied: 0,
        }
    }

    fn applier(&self, spec: &Arc<Spec>) -> Applier {
        control::applier(
            self.client.clone(),
            spec.clone(),
            &self.table,
            ApplyConfig::default(),
        )
    }

    async fn put(&mut self, item: Attrs) {
        put_item(&self.client, &self.table, &item).await;
        self.history.put(item);
    }

    async fn delete(&mut self, pk: &str, sk: &str) {
        delete_item(
            &self.client,
            &self.table,
            attrs(&[("PK", s(pk)), ("SK", s(sk))]),
        )
        .await;
        self.history.delete(pk, sk);
    }

    /// Applies the records not applied yet with `spec`'s worker.
    async fn drain(&mut self, spec: &Arc<Spec>) {
        let records = self.history.records[self.applied..].to_vec();
        apply_all(&self.applier(spec), &records, &BatchOptions::default()).await;
        self.applied = self.history.records.len();
    }

    async fn counter(&self, spec: &Spec, name: &str, user: &str) -> i64 {
        let vars = [("userId".to_string(), user.to_string())];
        read_counter(&self.client, &self.table, spec, name, &vars)
            .await
            .expect("read counter")
    }

    async fn item(&self, pk: &str, sk: &str) -> Option<Attrs> {
        get(&self.client, &self.table, pk, sk).await
    }

    async fn backfill(&self, spec: &Arc<Spec>, projections: &[&str]) {
        let selection = (!projections.is_empty()).then(|| {
            projections
                .iter()
                .map(|name| spec.projection_id(name).expect("a projection of the spec"))
                .collect()
        });
        let summary = backfill(
            &self.applier(spec),
            &BackfillOptions {
                projections: selection,
                progress: false,
                ..BackfillOptions::default()
            },
        )
        .await
        .expect("backfill");
        assert!(summary.is_done(), "{summary:?}");
    }
}

/// Applies records as Lambda delivers them: again from the first record
/// not handled, until all are.
async fn apply_all(applier: &Applier, records: &[Record], options: &BatchOptions) {
    let mut start = 0;
    for _ in 0..20 {
        if start >= records.len() {
            return;
        }
        let outcome = applier
            .apply_batch(&records[start..], options)
            .await
            .expect("the batch applies");
        match outcome.first_failure() {
            Some(index) => start += index,
            None => return,
        }
    }
    panic!("records were not handled after 20 deliveries");
}

#[tokio::test]
async fn an_inverse_edge_without_counters_keeps_its_edge_when_a_copied_attribute_changes() {
    let spec = social(EDGE);
    let mut live = Live::new(&spec, "edge-only").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.drain(&spec).await;
    let edge = live
        .item("USER#b", "FOLLOWED_BY#a")
        .await
        .expect("the edge");
    assert_eq!(text(&edge, "note").as_deref(), Some("x"));

    live.put(follow("a", "b", "t1", "y")).await;
    live.drain(&spec).await;
    let edge = live
        .item("USER#b", "FOLLOWED_BY#a")
        .await
        .expect("the edge survives a change of a copied attribute");
    assert_eq!(text(&edge, "note").as_deref(), Some("y"));
    assert_eq!(text(&edge, "followedAt").as_deref(), Some("t1"));
}

#[tokio::test]
async fn counters_added_over_live_edges_are_filled_by_backfill() {
    let v1 = social(EDGE);
    let v2 = social(&format!("{EDGE}{}", counters()));
    let mut live = Live::new(&v2, "counter-added").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("a", "c"), ("d", "b"), ("b", "a")] {
        live.put(follow(a, b, "t1", "x")).await;
    }
    live.drain(&v1).await;
    // v2 deployed: the counters see one more follow live, then a backfill.
    live.put(follow("c", "a", "t2", "x")).await;
    live.drain(&v2).await;
    live.backfill(&v2, &[]).await;
    for (user, followers, following) in [("a", 2, 2), ("b", 3, 1), ("c", 1, 2), ("d", 0, 1)] {
        assert_eq!(
            live.counter(&v2, "followers", user).await,
            followers,
            "followers of {user}"
        );
        assert_eq!(
            live.counter(&v2, "following", user).await,
            following,
            "following of {user}"
        );
    }
    // Later changes keep them exact.
    live.delete("USER#a", "FOLLOWS#b").await;
    live.drain(&v2).await;
    assert_eq!(live.counter(&v2, "followers", "b").await, 2);
    assert_eq!(live.counter(&v2, "following", "a").await, 1);
}

#[tokio::test]
async fn one_counter_replayed_or_backfilled_alone_leaves_the_other_exact() {
    let spec = social(&format!("{EDGE}{}", counters()));
    let mut live = Live::new(&spec, "one-counter").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.put(follow("c", "b", "t1", "x")).await;
    live.drain(&spec).await;
    live.delete("USER#a", "FOLLOWS#b").await;
    live.drain(&spec).await;
    // `replay --projection followers` of the whole stream, then a backfill
    // of `following` alone.
    let only = BatchOptions {
        selection: Some(vec![spec.projection_id("followers").unwrap()]),
        ..BatchOptions::default()
    };
    let records = live.history.records.clone();
    apply_all(&live.applier(&spec), &records, &only).await;
    live.backfill(&spec, &["following"]).await;
    assert_eq!(live.counter(&spec, "followers", "b").await, 1);
    assert_eq!(live.counter(&spec, "following", "a").await, 0);
    assert_eq!(live.counter(&spec, "following", "c").await, 1);

    // A replay of one counter, or a backfill of one, gets to a follow
    // before the live worker does: the other counter must still count it.
    live.put(follow("e", "f", "t1", "x")).await;
    let tail = live.history.records[live.applied..].to_vec();
    apply_all(&live.applier(&spec), &tail, &only).await;
    live.put(follow("g", "h", "t1", "x")).await;
    live.backfill(&spec, &["following"]).await;
    live.drain(&spec).await;
    for (name, user, want) in [
        ("followers", "f", 1),
        ("following", "e", 1),
        ("followers", "h", 1),
        ("following", "g", 1),
    ] {
        assert_eq!(
            live.counter(&spec, name, user).await,
            want,
            "{name} of {user}"
        );
    }
}

#[tokio::test]
async fn a_backfill_never_writes_an_older_copy_over_a_newer_one() {
    let spec = social(&format!("{EDGE}{}", counters()));
    let mut live = Live::new(&spec, "stale-scan").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.drain(&spec).await;
    // The backfill's scan saw t1...
    let scanned = live.item("USER#a", "FOLLOWS#b").await.unwrap();
    // ...then the writer re-follows with t2 and the worker refreshes the edge.
    live.put(follow("a", "b", "t2", "x")).await;
    live.drain(&spec).await;
    // The backfill now applies what it planned from its snapshot.
    let record = decode_scanned_item(&spec.table, 0, 1, scanned);
    let backfill_options = BatchOptions {
        read_markers_first: true,
        ..BatchOptions::default()
    };
    apply_all(&live.applier(&spec), &[record], &backfill_options).await;
    let edge = live.item("USER#b", "FOLLOWED_BY#a").await.unwrap();
    assert_eq!(
        text(&edge, "followedAt").as_deref(),
        Some("t2"),
        "the backfill wrote its stale snapshot over the live worker's newer edge"
    );
    assert_eq!(live.counter(&spec, "followers", "b").await, 1);
}

#[tokio::test]
async fn guarded_transactions_hold_at_most_one_hundred_items() {
    // One counter with one shard: every backfilled follow is a marker, a
    // guard and the shared shard in the transaction.
    let spec = social(
        r#"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 1
"#,
    );
    let live = Live::new(&spec, "hundred").await;
    let mut records = Vec::new();
    for i in 0..90 {
        let item = follow(&format!("u{i}"), "star", "t1", "x");
        put_item(&live.client, &live.table, &item).await;
        records.push(decode_scanned_item(
            &spec.table,
            0,
            i as u64,
            support::item(
                &item
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.clone()))
                    .collect::<Vec<_>>(),
            ),
        ));
    }
    let outcome = live
        .applier(&spec)
        .apply_batch(
            &records,
            &BatchOptions {
                read_markers_first: true,
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    assert_eq!(live.counter(&spec, "followers", "star").await, 90);
    // 90 markers and 90 guards and one shard: two transactions, not one
    // DynamoDB refuses followed by one per item.
    assert_eq!(
        outcome.stats.requests.transactions, 2,
        "{:?}",
        outcome.stats.requests
    );
}

#[tokio::test]
async fn an_edge_given_another_source_uncounts_the_records_its_old_items_carry() {
    // v1: follows have reverse edges and `followers` rides on them.
    let v1 = social(&format!("{EDGE}{FOLLOWERS}"));
    // v2: the edge is built from blocks instead; `followers` keeps its
    // own markers now.
    let v2_text = format!(
        r#"
service = "membership-test"

[table]
name = "MembershipTest"

[entities.follow]
pk = "USER#{{followerId}}"
sk = "FOLLOWS#{{followeeId}}"

[entities.block]
pk = "USER#{{followerId}}"
sk = "BLOCKS#{{followeeId}}"

[entities.followed_by]
pk = "USER#{{followeeId}}"
sk = "FOLLOWED_BY#{{followerId}}"

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "block"
target = "followed_by"

{FOLLOWERS}"#
    );
    let v2 = Arc::new(Spec::from_toml(&v2_text, "v2.toml").expect("v2 compiles"));
    let mut live = Live::new(&v1, "edge-source").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.put(follow("c", "b", "t1", "x")).await;
    live.drain(&v1).await;
    assert_eq!(live.counter(&v1, "followers", "b").await, 2);
    // v2 deployed: backfill the changed edge and the counter it carried.
    live.backfill(&v2, &["followed-by"]).await;
    live.backfill(&v2, &["followers"]).await;
    assert_eq!(live.counter(&v2, "followers", "b").await, 2);
    // The reverse items of follows are gone (no block made them).
    assert!(live.item("USER#b", "FOLLOWED_BY#a").await.is_none());
    live.delete("USER#a", "FOLLOWS#b").await;
    live.drain(&v2).await;
    assert_eq!(live.counter(&v2, "followers", "b").await, 1);
}

/// Found in review: a counter taken out of the spec and put back (a
/// rolled-back deploy) counted wrong after its backfill, because the spec
/// without it dropped its records with the reverse items without moving
/// its shards.
#[tokio::test]
async fn a_counter_removed_and_added_back_is_exact_after_its_backfill() {
    let v1 = social(&format!("{EDGE}{FOLLOWERS}"));
    let v2 = social(EDGE);
    let mut live = Live::new(&v1, "readd").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.put(follow("c", "b", "t1", "x")).await;
    live.drain(&v1).await;
    assert_eq!(live.counter(&v1, "followers", "b").await, 2);
    // v2 drops `followers`; a follow goes, another one's copy changes.
    live.delete("USER#a", "FOLLOWS#b").await;
    live.put(follow("c", "b", "t1", "y")).await;
    live.drain(&v2).await;
    assert!(live.item("USER#b", "FOLLOWED_BY#a").await.is_none());
    // v1 again (a rollback): `followers` is new to the running spec, so it
    // is backfilled.
    live.put(follow("d", "b", "t1", "x")).await;
    live.drain(&v1).await;
    live.backfill(&v1, &["followers"]).await;
    assert_eq!(
        live.counter(&v1, "followers", "b").await,
        2,
        "followers of b: c and d follow b"
    );
}

/// Found in review: backfill progress was keyed by table, projection names
/// and segment, and a Lambda (Step Functions) backfill resumes by default:
/// after a spec change, the backfill of the changed projection found the
/// earlier run's `done` and did nothing.
#[tokio::test]
async fn a_backfill_after_a_spec_change_is_not_skipped_as_already_done() {
    use ddb_projector::lambda::backfill::BackfillRequest;
    let v1 = social(&format!("{EDGE}{FOLLOWERS}"));
    // v2: `followers` counts only follows with note "y".
    let v2 = social(&format!(
        "{EDGE}{}",
        FOLLOWERS.replace("shards = 8", "shards = 8\nwhen = { note = \"y\" }")
    ));
    let mut live = Live::new(&v1, "resume-scope").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.put(follow("c", "b", "t1", "x")).await;
    live.put(follow("d", "b", "t1", "y")).await;
    live.drain(&v1).await;

    // A Lambda backfill, as the Step Functions input
    // {"totalSegments": 1, "projections": ["followers"]} runs it.
    let lambda_backfill = |spec: &Arc<Spec>| {
        let request = BackfillRequest {
            projections: Some(vec!["followers".to_string()]),
            ..BackfillRequest::default()
        };
        request.plan(spec).expect("a valid request").options
    };
    let summary = backfill(&live.applier(&v1), &lambda_backfill(&v1))
        .await
        .unwrap();
    assert!(summary.is_done());
    assert_eq!(live.counter(&v1, "followers", "b").await, 3);

    // v2 is deployed; `followers` changed, so it is backfilled.
    let summary = backfill(&live.applier(&v2), &lambda_backfill(&v2))
        .await
        .unwrap();
    assert!(summary.is_done());
    assert_eq!(
        live.counter(&v2, "followers", "b").await,
        1,
        "only d's follow has note y (the backfill scanned {} items)",
        summary.scanned
    );
}

/// Found in review: the audit counted the records on every item but
/// planned only items of the spec's entities and own markers: after an
/// edge and its target entity were removed, the records left on the old
/// reverse items kept the counter off, and a repair reported it fixed.
#[tokio::test]
async fn audit_repair_leaves_a_clean_table_after_an_edge_and_its_entity_go() {
    let v1 = social(&format!("{EDGE}{FOLLOWERS}"));
    let v2 = Arc::new(
        Spec::from_toml(
            &format!(
                r#"
service = "membership-test"

[table]
name = "MembershipTest"

[entities.follow]
pk = "USER#{{followerId}}"
sk = "FOLLOWS#{{followeeId}}"
{FOLLOWERS}"#
            ),
            "v2.toml",
        )
        .unwrap(),
    );
    let mut live = Live::new(&v1, "audit-old-entity").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.put(follow("c", "b", "t1", "x")).await;
    live.drain(&v1).await;
    assert_eq!(live.counter(&v1, "followers", "b").await, 2);

    let options = |repair| ddb_projector::audit::AuditOptions {
        segments: 1,
        repair,
        progress: false,
        page_size: None,
        ..ddb_projector::audit::AuditOptions::default()
    };
    let report = ddb_projector::audit::audit(&live.applier(&v2), &options(true))
        .await
        .unwrap();
    assert!(
        report.repair_failures.is_empty(),
        "{:?}",
        report.repair_failures
    );
    assert_eq!(
        report.repaired,
        report.findings.len(),
        "{}",
        report.to_text(&v2)
    );
    let again = ddb_projector::audit::audit(&live.applier(&v2), &options(false))
        .await
        .unwrap();
    assert!(
        again.is_clean(),
        "after a repair that reported every finding repaired, the audit finds:\n{}\nfollowers of b: {}",
        again.to_text(&v2),
        live.counter(&v2, "followers", "b").await
    );
    assert_eq!(live.counter(&v2, "followers", "b").await, 2);
}

/// A reverse item may carry another projection's attributes (a copy from
/// a friendship item onto the edge): the edge's own writes, exact ones
/// included, leave them alone.
#[tokio::test]
async fn an_edge_leaves_alone_what_another_projection_writes_on_its_items() {
    let spec = Arc::new(
        Spec::from_toml(
            &format!(
                r#"
service = "membership-test"

[table]
name = "MembershipTest"

[entities.follow]
pk = "USER#{{followerId}}"
sk = "FOLLOWS#{{followeeId}}"

[entities.followed_by]
pk = "USER#{{followeeId}}"
sk = "FOLLOWED_BY#{{followerId}}"

[entities.friendship]
pk = "PAIR#{{followerId}}#{{followeeId}}"
sk = "LABEL"

{EDGE}{FOLLOWERS}
[[projections]]
name = "edge-label"
kind = "denormalize"
source = "friendship"
target = "followed_by"
copy = {{ label = "{{label}}" }}
"#
            ),
            "shared.toml",
        )
        .expect("the spec compiles"),
    );
    let mut live = Live::new(&spec, "shared-edge").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.drain(&spec).await;
    live.put(attrs(&[
        ("PK", s("PAIR#a#b")),
        ("SK", s("LABEL")),
        ("followerId", s("a")),
        ("followeeId", s("b")),
        ("label", s("close")),
    ]))
    .await;
    live.drain(&spec).await;
    let label = |item: Option<Attrs>| item.and_then(|item| text(&item, "label"));
    assert_eq!(
        label(live.item("USER#b", "FOLLOWED_BY#a").await).as_deref(),
        Some("close")
    );
    // A copied attribute changes live, then a backfill writes the edge
    // from what it reads: the label stays.
    live.put(follow("a", "b", "t2", "y")).await;
    live.drain(&spec).await;
    live.backfill(&spec, &["followed-by"]).await;
    let edge = live.item("USER#b", "FOLLOWED_BY#a").await;
    assert_eq!(
        edge.as_ref().and_then(|e| text(e, "note")).as_deref(),
        Some("y")
    );
    assert_eq!(label(edge).as_deref(), Some("close"));
    assert_eq!(live.counter(&spec, "followers", "b").await, 1);
}

/// The upgrade path docs/lifecycle.md gives: a table an older build left (reverse
/// edges without records, shards counting them) is exact after a backfill
/// of every counter and one `audit --repair`.
#[tokio::test]
async fn a_table_from_before_counter_records_is_exact_after_backfill_and_repair() {
    let spec = social(&format!("{EDGE}{}", counters()));
    let live = Live::new(&spec, "upgrade").await;
    for (a, b) in [("a", "b"), ("c", "b")] {
        put_item(&live.client, &live.table, &follow(a, b, "t1", "x")).await;
        put_item(
            &live.client,
            &live.table,
            &attrs(&[
                ("PK", s(&format!("USER#{b}"))),
                ("SK", s(&format!("FOLLOWED_BY#{a}"))),
                ("followedAt", s("t1")),
                ("note", s("x")),
            ]),
        )
        .await;
    }
    for (counter, user, count) in [
        ("followers", "b", 2),
        ("following", "a", 1),
        ("following", "c", 1),
    ] {
        let shard = spec.counter_shard_key(counter, &[user.to_string()], 0);
        put_item(
            &live.client,
            &live.table,
            &attrs(&[
                ("PK", s(&shard.pk)),
                ("SK", s("COUNTER")),
                ("count", support::n(count)),
            ]),
        )
        .await;
    }
    live.backfill(&spec, &["followers", "following"]).await;
    let report = ddb_projector::audit::audit(
        &live.applier(&spec),
        &ddb_projector::audit::AuditOptions {
            repair: true,
            progress: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        report.repair_failures.is_empty(),
        "{:?}",
        report.repair_failures
    );
    for (counter, user, count) in [
        ("followers", "b", 2),
        ("following", "a", 1),
        ("following", "c", 1),
    ] {
        assert_eq!(
            live.counter(&spec, counter, user).await,
            count,
            "{counter} of {user}"
        );
    }
    let again = ddb_projector::audit::audit(
        &live.applier(&spec),
        &ddb_projector::audit::AuditOptions {
            progress: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(again.is_clean(), "{}", again.to_text(&spec));
}

/// Entities for two inverse edges over follows.
const TWO_EDGES: &str = r#"
service = "membership-test"

[table]
name = "MembershipTest"

[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"

[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"

[entities.follow_log]
pk = "LOG#{followeeId}"
sk = "FOLLOW#{followerId}"
"#;

const FOLLOW_LOG: &str = r#"
[[projections]]
name = "follow-log"
kind = "inverse-edge"
source = "follow"
target = "follow_log"
copy = { note = "{note}" }
"#;

fn compiled(text: &str) -> Arc<Spec> {
    Arc::new(Spec::from_toml(text, "spec.toml").expect("the spec compiles"))
}

/// Found in review: a counter rode on the first of two fitting edges in
/// file order, so swapping them in the file moved it to the other edge
/// with nothing to say so, and a follow was counted twice.
#[tokio::test]
async fn the_order_of_the_projections_does_not_move_a_counter() {
    let v1 = compiled(&format!("{TWO_EDGES}{EDGE}{FOLLOW_LOG}{FOLLOWERS}"));
    let v2 = compiled(&format!("{TWO_EDGES}{FOLLOW_LOG}{EDGE}{FOLLOWERS}"));
    let rides_on = |spec: &Spec| {
        let id = spec.projection_id("followers").unwrap();
        match &spec.projections[id].kind {
            ProjectionKind::Counter(counter) => match counter.marker {
                Marker::Edge(edge) => spec.projections[edge].name.clone(),
                Marker::Own => "its own markers".to_string(),
            },
            _ => unreachable!("a counter"),
        }
    };
    // The first fitting edge by name, in either file order.
    assert_eq!(rides_on(&v1), "follow-log");
    assert_eq!(rides_on(&v2), "follow-log");
    for p in &v1.projections {
        let q = &v2.projections[v2.projection_id(&p.name).unwrap()];
        assert_eq!(p.fingerprint, q.fingerprint, "{}", p.name);
    }
    let mut live = Live::new(&v1, "reorder").await;
    live.put(follow("a", "b", "t1", "x")).await;
    live.drain(&v1).await;
    live.put(follow("a", "b", "t1", "y")).await;
    live.drain(&v2).await;
    assert_eq!(live.counter(&v2, "followers", "b").await, 1);
}

/// Found in review: the backfill's progress was keyed by the projections'
/// own text only; a spec that moved the reverse edges to another key
/// pattern had the same fingerprint, and `--resume` took the earlier
/// backfill's `done` for its own.
#[tokio::test]
async fn a_backfill_after_an_entity_key_change_starts_over() {
    let v1 = compiled(&format!("{TWO_EDGES}{EDGE}{FOLLOWERS}"));
    let v2 = compiled(&format!(
        "{}{EDGE}{FOLLOWERS}",
        TWO_EDGES.replace("FOLLOWED_BY#{followerId}", "FOLLOWER#{followerId}")
    ));
    assert_ne!(v1.projections_fingerprint(), v2.projections_fingerprint());
    let live = Live::new(&v1, "entity-change").await;
    put_item(&live.client, &live.table, &follow("a", "b", "t1", "x")).await;
    let resumed = |spec: &Arc<Spec>| {
        let applier = live.applier(spec);
        async move {
            backfill(
                &applier,
                &BackfillOptions {
                    resume: true,
                    progress: false,
                    ..BackfillOptions::default()
                },
            )
            .await
            .expect("backfill")
        }
    };
    assert!(resumed(&v1).await.is_done());
    assert!(live.item("USER#b", "FOLLOWED_BY#a").await.is_some());
    assert!(resumed(&v2).await.is_done());
    assert!(live.item("USER#b", "FOLLOWER#a").await.is_some());
    assert_eq!(live.counter(&v2, "followers", "b").await, 1);
}

const LABELLED: &str = r#"
service = "membership-test"

[table]
name = "MembershipTest"

[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"

[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { label = "{a}-{b}" }

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 2
"#;

/// A follow whose label renders only when `b` is given.
fn labelled(follower: &str, followee: &str, a: &str, b: Option<&str>) -> Attrs {
    let mut item = attrs(&[
        ("PK", s(&format!("USER#{follower}"))),
        ("SK", s(&format!("FOLLOWS#{followee}"))),
        ("followerId", s(follower)),
        ("followeeId", s(followee)),
        ("a", s(a)),
    ]);
    if let Some(b) = b {
        item.insert("b".to_string(), s(b));
    }
    item
}

/// Found in review: a record held (dead-lettered behind its item's letter)
/// while a redrive ran lost its hold when the redrive ended, because the
/// redrive released holds from a listing made before that letter existed;
/// the item's next record then overtook the older letter, and a later
/// redrive brought an unfollowed edge back, counted.
#[tokio::test]
async fn a_letter_held_during_a_redrive_keeps_its_hold() {
    let spec = compiled(LABELLED);
    let mut live = Live::new(&spec, "review-redrive-race").await;
    // a follows b, but the label cannot render yet: dead-lettered, held.
    live.put(labelled("a", "b", "x", None)).await;
    // Many other poison follows: the redrive has work after item a's.
    for i in 0..60 {
        live.put(labelled(&format!("z{i:03}"), "c", "x", None))
            .await;
    }
    live.drain(&spec).await;
    // The writer fixes a's follow: held behind its letter.
    live.put(labelled("a", "b", "x", Some("y"))).await;
    live.drain(&spec).await;
    assert!(live.item("USER#b", "FOLLOWED_BY#a").await.is_none());

    // The operator redrives while the worker runs; a's follow changes
    // during the redrive, after the redrive applied a's letters.
    live.put(labelled("a", "b", "x", Some("z"))).await;
    let applier = live.applier(&spec);
    let pending: Vec<Record> = live.history.records[live.applied..].to_vec();
    let during = async {
        for _ in 0..500 {
            if live.item("USER#b", "FOLLOWED_BY#a").await.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        applier
            .apply_batch(&pending, &BatchOptions::default())
            .await
            .expect("the live batch")
    };
    let (summary, outcome) = tokio::join!(applier.redrive(None), during);
    let summary = summary.expect("redrive");
    eprintln!("redrive: {summary:?}; live record: {:?}", outcome.statuses);
    live.applied = live.history.records.len();
    assert_eq!(live.counter(&spec, "followers", "b").await, 1);
    let store = applier.dead_letter_store();
    let pair = (
        "followed-by".to_string(),
        ddb_projector::record::ItemKey::new("USER#a", "FOLLOWS#b"),
    );
    let held = store
        .held(
            &[pair].into_iter().collect(),
            std::time::Duration::from_secs(5),
        )
        .await
        .expect("holds");
    let letters_of_a = store
        .list()
        .await
        .expect("letters")
        .into_iter()
        .filter(|l| l.source_key.as_ref().is_some_and(|k| k.pk == "USER#a"))
        .count();
    eprintln!(
        "after the redrive: {letters_of_a} letter(s) of a's follow, holds of the pair: {held:?}"
    );

    // a unfollows b, and the worker applies it.
    live.history.delete("USER#a", "FOLLOWS#b");
    super::model::delete_item(
        &live.client,
        &live.table,
        attrs(&[("PK", s("USER#a")), ("SK", s("FOLLOWS#b"))]),
    )
    .await;
    live.drain(&spec).await;
    // Later, another redrive.
    let summary = applier.redrive(None).await.expect("redrive");
    eprintln!("second redrive: {summary:?}");
    let letters = applier.dead_letter_store().list().await.expect("letters");
    let of_a = letters
        .iter()
        .filter(|l| l.source_key.as_ref().is_some_and(|k| k.pk == "USER#a"))
        .count();
    assert_eq!(
        (
            live.item("USER#b", "FOLLOWED_BY#a").await.is_some(),
            live.counter(&spec, "followers", "b").await,
            of_a
        ),
        (false, 0, 0),
        "a no longer follows b: no reverse edge, b has no follower"
    );
}

/// Found in review: the audit skipped a counter's own markers once the
/// counter counted another entity (the markers no longer parse as the
/// counter's), so their records kept the counter off after a repair.
/// Until the changed counter's backfill, the audit does not judge it (its
/// storage holds the other definition's count, which readers read); once
/// the backfill made it live, the repair drops the old source's markers.
#[tokio::test]
async fn an_audit_repair_drops_the_markers_a_counter_left_on_its_old_source() {
    let v1 = compiled(&format!("{TWO_EDGES}{FOLLOWERS}"));
    let v2 = compiled(&format!(
        "{TWO_EDGES}\n[entities.block]\npk = \"USER#{{followerId}}\"\nsk = \"BLOCKS#{{followeeId}}\"\n{}",
        FOLLOWERS.replace("source = \"follow\"", "source = \"block\"")
    ));
    let mut live = Live::new(&v1, "audit-old-source").await;
    // Short leases: v2's backfill waits out v1's writer.
    let config = ApplyConfig {
        lease: std::time::Duration::from_millis(300),
        clock_skew: std::time::Duration::ZERO,
        ..ApplyConfig::default()
    };
    live.put(follow("a", "b", "t1", "x")).await;
    let (client, table) = (live.client.clone(), live.table.clone());
    let applier =
        |spec: &Arc<Spec>| control::applier(client.clone(), spec.clone(), &table, config.clone());
    apply_all(
        &applier(&v1),
        &live.history.records,
        &BatchOptions::default(),
    )
    .await;
    assert_eq!(live.counter(&v1, "followers", "b").await, 1);
    let options = |repair| ddb_projector::audit::AuditOptions {
        repair,
        progress: false,
        ..Default::default()
    };
    let before = ddb_projector::audit::audit(&applier(&v2), &options(true))
        .await
        .unwrap();
    assert!(before.is_clean(), "{}", before.to_text(&v2));
    assert!(
        before
            .not_live
            .iter()
            .any(|n| n.projection == "followers" && n.state == "changed" && !n.judged),
        "{:?}",
        before.not_live
    );
    assert_eq!(
        live.counter(&v2, "followers", "b").await,
        1,
        "the repair wrote v2's count where v1's is read"
    );
    // v2 deployed (its worker takes its leases), then backfilled.
    control::stream_consumer(client.clone(), v2.clone(), &table, config.clone())
        .take_leases()
        .await
        .unwrap();
    let id = v2.projection_id("followers").unwrap();
    super::specgen::claim(&applier(&v2), &[id], "v2")
        .await
        .unwrap();
    let summary = backfill(
        &applier(&v2),
        &BackfillOptions {
            projections: Some(vec![id]),
            progress: false,
            resume: true,
            run: Some("v2".to_string()),
            ..BackfillOptions::default()
        },
    )
    .await
    .expect("backfill");
    assert_eq!(summary.backfilled, vec!["followers".to_string()]);
    let report = ddb_projector::audit::audit(&applier(&v2), &options(true))
        .await
        .unwrap();
    assert!(
        report.repair_failures.is_empty(),
        "{:?}",
        report.repair_failures
    );
    let again = ddb_projector::audit::audit(&applier(&v2), &options(false))
        .await
        .unwrap();
    assert!(again.is_clean(), "{}", again.to_text(&v2));
    assert!(again.not_live.is_empty(), "{:?}", again.not_live);
    assert_eq!(live.counter(&v2, "followers", "b").await, 0);
}
