//! Invariants and audit against DynamoDB Local: planted drift and
//! violations are found exactly, repaired, and the online check records and
//! clears violations one batch after the change.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, BatchOptions};
use ddb_projector::audit::{audit, merge, AuditOptions, AuditReport, CheckpointStore, Problem};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;
use ddb_projector::counter::read_counter;
use ddb_projector::record::ChangeKind;
use ddb_projector::spec::Spec;

use super::model::{change, email_verified as email};
use super::support::{self, delete, get, put, s, text};

type Attrs = HashMap<String, Av>;

async fn derive_everything(applier: &Applier) {
    let summary = backfill(
        applier,
        &BackfillOptions {
            progress: false,
            ..BackfillOptions::default()
        },
    )
    .await
    .expect("backfill");
    assert!(summary.is_done());
}

async fn run_audit(applier: &Applier, repair: bool) -> AuditReport {
    audit(
        applier,
        &AuditOptions {
            segments: 3,
            repair,
            progress: false,
            page_size: Some(7),
            ..AuditOptions::default()
        },
    )
    .await
    .expect("audit")
}

/// (rule, problem, key) of every finding, sorted.
pub(super) fn found(report: &AuditReport) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = report
        .findings
        .iter()
        .map(|f| (f.rule.clone(), f.problem.label(), f.key.clone()))
        .collect();
    out.sort();
    out
}

fn triple(rule: &str, problem: &str, key: &str) -> (String, String, String) {
    (rule.to_string(), problem.to_string(), key.to_string())
}

async fn follow(client: &aws_sdk_dynamodb::Client, table: &str, a: &str, b: &str) {
    put(
        client,
        table,
        &[
            ("PK", s(&format!("USER#{a}"))),
            ("SK", s(&format!("FOLLOWS#{b}"))),
            ("followedAt", s("2026-11-01")),
        ],
    )
    .await;
}

/// Follows a->b, c->b, d->b, b->a, derived and audited clean; then drift:
/// a deleted inverse edge, an orphan inverse edge, a counter shard off by
/// 3 (see the first test for what the audit finds).
pub(super) async fn drifted_social(prefix: &str) -> (Arc<Spec>, support::Fixture) {
    let spec = support::shipped_spec("social-service.toml");
    let fixture = support::fixture(spec.clone(), prefix).await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    for (a, b) in [("a", "b"), ("c", "b"), ("d", "b"), ("b", "a")] {
        follow(client, table, a, b).await;
    }
    derive_everything(applier).await;
    let clean = run_audit(applier, false).await;
    assert!(clean.is_clean(), "{}", clean.to_text(&spec));
    assert!(clean.scanned > 4);

    delete(client, table, "USER#b", "FOLLOWED_BY#c").await;
    put(
        client,
        table,
        &[
            ("PK", s("USER#a")),
            ("SK", s("FOLLOWED_BY#z")),
            ("followedAt", s("x")),
        ],
    )
    .await;
    let shard = spec.counter_shard_key("followers", &["b".to_string()], 5);
    client
        .update_item()
        .table_name(table)
        .key("PK", s(&shard.pk))
        .key("SK", s(shard.sk.as_deref().unwrap()))
        .update_expression("ADD #c :d")
        .expression_attribute_names("#c", "count")
        .expression_attribute_values(":d", Av::N("3".into()))
        .send()
        .await
        .unwrap();
    (spec, fixture)
}

#[tokio::test]
async fn audit_finds_exactly_the_planted_social_drift_and_repair_makes_it_clean() {
    let (
        spec,
        support::Fixture {
            client,
            table,
            applier,
            ..
        },
    ) = drifted_social("audit-social").await;
    let report = run_audit(&applier, false).await;
    assert_eq!(
        found(&report),
        [
            triple("followed-by", "missing", "USER#b / FOLLOWED_BY#c"),
            triple("followed-by", "orphaned", "USER#a / FOLLOWED_BY#z"),
            // The deleted edge took its counter records with it: the
            // shards still count c, and no record names them for it.
            triple(
                "followers",
                "holds 1, but 0 records name it",
                "COUNTER#followers#b#3 / COUNTER"
            ),
            triple(
                "followers",
                "holds 4, but 1 records name it",
                "COUNTER#followers#b#5 / COUNTER"
            ),
            triple(
                "followers",
                "off by +3 (is 6, should be 3)",
                "COUNTER#followers#b"
            ),
            triple(
                "following",
                "holds 1, but 0 records name it",
                "COUNTER#following#c#3 / COUNTER"
            ),
        ],
        "{}",
        report.to_text(&spec)
    );
    let orphan = report
        .findings
        .iter()
        .find(|f| f.problem == Problem::Orphaned)
        .unwrap();
    assert_eq!(
        orphan.detail,
        "its source USER#z / FOLLOWS#a does not exist"
    );

    let repaired = run_audit(&applier, true).await;
    assert_eq!(repaired.repaired, 6, "{}", repaired.to_text(&spec));
    assert!(repaired.repair_failures.is_empty());
    let after = run_audit(&applier, false).await;
    assert!(after.is_clean(), "{}", after.to_text(&spec));
    let edge = get(&client, &table, "USER#b", "FOLLOWED_BY#c")
        .await
        .unwrap();
    assert_eq!(text(&edge, "followedAt").as_deref(), Some("2026-11-01"));
    assert!(get(&client, &table, "USER#a", "FOLLOWED_BY#z")
        .await
        .is_none());
    let followers = read_counter(
        &client,
        &table,
        &spec,
        "followers",
        &[("userId".into(), "b".into())],
    )
    .await
    .unwrap();
    assert_eq!(followers, 3);
    let following = read_counter(
        &client,
        &table,
        &spec,
        "following",
        &[("userId".into(), "c".into())],
    )
    .await
    .unwrap();
    assert_eq!(following, 1);
}

async fn put_item(client: &aws_sdk_dynamodb::Client, table: &str, item: &Attrs) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item.clone()))
        .send()
        .await
        .unwrap();
}

async fn put_profile(client: &aws_sdk_dynamodb::Client, table: &str, user: &str) {
    put(
        client,
        table,
        &[
            ("PK", s(&format!("USER#{user}"))),
            ("SK", s("PROFILE")),
            ("firstName", s("Sam")),
        ],
    )
    .await;
}

#[tokio::test]
async fn audit_finds_user_drift_and_violations_and_repair_leaves_only_the_violations() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-user").await;
    for user in ["u1", "u2", "u3", "u4"] {
        put_profile(&client, &table, user).await;
    }
    for item in [
        email("u1", "e1", "sam@x.org", true, true),
        email("u1", "e2", "sam.work@x.org", false, true),
        email("u2", "e3", "kim@x.org", true, true),
        // Two primaries, one of them unverified.
        email("u3", "e4", "pat@y.org", true, false),
        email("u3", "e5", "pat.b@y.org", true, true),
        // u1's address, written differently, on another user.
        email("u4", "e6", " SAM@x.org ", true, true),
    ] {
        put_item(&client, &table, &item).await;
    }
    derive_everything(&applier).await;
    let violations = [
        triple("one-primary-email", "violation", "USER#u3"),
        triple("primary-email-verified", "violation", "USER#u3 / EMAIL#e4"),
        triple("unique-email-address", "violation", "EMAIL#sam@x.org"),
    ];
    let before = run_audit(&applier, false).await;
    assert_eq!(found(&before), violations, "{}", before.to_text(&spec));

    // Drift: a stale GSI key, a profile email that is not the primary's.
    client
        .update_item()
        .table_name(&table)
        .key("PK", s("USER#u1"))
        .key("SK", s("EMAIL#e2"))
        .update_expression("SET GSI1PK = :v")
        .expression_attribute_values(":v", s("EMAIL#old@x.org"))
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name(&table)
        .key("PK", s("USER#u2"))
        .key("SK", s("PROFILE"))
        .update_expression("SET email = :v")
        .expression_attribute_values(":v", s("wrong@x.org"))
        .send()
        .await
        .unwrap();
    let report = run_audit(&applier, false).await;
    let mut expected = vec![
        triple("email-gsi1-keys", "stale", "USER#u1 / EMAIL#e2"),
        triple("profile-primary-email", "stale", "USER#u2 / PROFILE"),
    ];
    expected.extend(violations.iter().cloned());
    expected.sort();
    assert_eq!(found(&report), expected, "{}", report.to_text(&spec));
    let unique = report
        .findings
        .iter()
        .find(|f| f.rule == "unique-email-address")
        .unwrap();
    assert_eq!(unique.items, ["USER#u1 / EMAIL#e1", "USER#u4 / EMAIL#e6"]);

    let repaired = run_audit(&applier, true).await;
    assert_eq!(repaired.repaired, 2, "{}", repaired.to_text(&spec));
    assert_eq!(repaired.violations_recorded, 3);
    let after = run_audit(&applier, false).await;
    assert_eq!(found(&after), violations, "{}", after.to_text(&spec));
    let e2 = get(&client, &table, "USER#u1", "EMAIL#e2").await.unwrap();
    assert_eq!(text(&e2, "GSI1PK").as_deref(), Some("EMAIL#sam.work@x.org"));
    let profile = get(&client, &table, "USER#u2", "PROFILE").await.unwrap();
    assert_eq!(text(&profile, "email").as_deref(), Some("kim@x.org"));
    // Source items are never changed without a repair policy.
    let e4 = get(&client, &table, "USER#u3", "EMAIL#e4").await.unwrap();
    assert_eq!(e4.get("isPrimary"), Some(&Av::Bool(true)));
    // The violations are in the store for `violations list`.
    let recorded = applier.recorded_violations().await.unwrap();
    assert_eq!(recorded.len(), 3);
}

/// Writes the item as a writer would, then applies its stream record.
async fn write_and_apply(
    applier: &Applier,
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    seq: u64,
    old: Option<&Attrs>,
    new: Option<&Attrs>,
) -> ddb_projector::apply::BatchStats {
    let kind = match (old, new) {
        (None, Some(_)) => ChangeKind::Insert,
        (Some(_), Some(_)) => ChangeKind::Modify,
        _ => ChangeKind::Remove,
    };
    match new {
        Some(item) => put_item(client, table, item).await,
        None => {
            let old = old.unwrap();
            delete(
                client,
                table,
                &text(old, "PK").unwrap(),
                &text(old, "SK").unwrap(),
            )
            .await
        }
    }
    let outcome = applier
        .apply_batch(&[change(seq, kind, old, new)], &BatchOptions::default())
        .await
        .expect("batch");
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    outcome.stats
}

async fn recorded(applier: &Applier) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = applier
        .recorded_violations()
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.invariant, v.scope))
        .collect();
    out.sort();
    out
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[tokio::test]
async fn the_online_check_records_a_violation_in_the_batch_that_causes_it_and_clears_it_when_resolved(
) {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "online-check").await;
    put_profile(&client, &table, "u9").await;
    let e1 = email("u9", "e1", "a@x.org", true, true);
    let stats = write_and_apply(&applier, &client, &table, 1, None, Some(&e1)).await;
    assert_eq!(stats.checks.violations, 0);
    assert!(stats.checks.scopes >= 2, "{stats:?}");
    assert!(recorded(&applier).await.is_empty());

    // A second primary: exactly-one breaks in this very batch.
    let e2 = email("u9", "e2", "b@x.org", true, true);
    let stats = write_and_apply(&applier, &client, &table, 2, None, Some(&e2)).await;
    assert_eq!(stats.checks.recorded, 1, "{stats:?}");
    // The partition's check reused what the profile's recompute read of it
    // (target and emails) after the batch's writes; the check itself read
    // the address's GSI partition and the recorded violations only: those
    // of the address while its GSI partition was read (during the
    // recompute), those of the partition after.
    assert_eq!(stats.requests.recompute_reads, 2, "{stats:?}");
    assert_eq!(stats.requests.check_reads, 3, "{stats:?}");
    assert_eq!(
        recorded(&applier).await,
        [pair("one-primary-email", "USER#u9")]
    );
    let violation = &applier.recorded_violations().await.unwrap()[0];
    assert_eq!(
        violation.revealed_by.get("eventId").map(String::as_str),
        Some("e2")
    );
    assert_eq!(violation.keys, ["USER#u9 / EMAIL#e1", "USER#u9 / EMAIL#e2"]);
    assert!(!violation.since.is_empty());

    // The writer finishes the switch: resolved, cleared.
    let e1_off = email("u9", "e1", "a@x.org", false, true);
    let stats = write_and_apply(&applier, &client, &table, 3, Some(&e1), Some(&e1_off)).await;
    assert_eq!(stats.checks.cleared, 1, "{stats:?}");
    assert!(recorded(&applier).await.is_empty());

    // A change to nothing an invariant reads checks nothing.
    let mut e1_touched = e1_off.clone();
    e1_touched.insert("verifiedAt".to_string(), s("2026-11-22"));
    let stats = write_and_apply(
        &applier,
        &client,
        &table,
        31,
        Some(&e1_off),
        Some(&e1_touched),
    )
    .await;
    assert_eq!(stats.checks.scopes, 0, "{stats:?}");

    // An unverified primary, then verified.
    let e2_unverified = email("u9", "e2", "b@x.org", true, false);
    write_and_apply(
        &applier,
        &client,
        &table,
        4,
        Some(&e2),
        Some(&e2_unverified),
    )
    .await;
    assert_eq!(
        recorded(&applier).await,
        [pair("primary-email-verified", "USER#u9")]
    );
    write_and_apply(
        &applier,
        &client,
        &table,
        5,
        Some(&e2_unverified),
        Some(&e2),
    )
    .await;
    assert!(recorded(&applier).await.is_empty());

    // One address on two users (normalized alike), then the second goes.
    put_profile(&client, &table, "u10").await;
    let dup = email("u10", "e7", "  A@X.org", true, true);
    write_and_apply(&applier, &client, &table, 6, None, Some(&dup)).await;
    assert_eq!(
        recorded(&applier).await,
        [pair("unique-email-address", "EMAIL#a@x.org")]
    );
    write_and_apply(&applier, &client, &table, 7, Some(&dup), None).await;
    // u10 has no email left: nothing required of it; the address is unique again.
    assert!(recorded(&applier).await.is_empty());

    // An address changed: the new one is checked against the index; the
    // old one, released with no violation recorded, is not queried (a
    // holder gone makes no duplicate). Both scopes count as checked.
    let e1_moved = email("u9", "e1", "c@x.org", false, true);
    let stats = write_and_apply(
        &applier,
        &client,
        &table,
        8,
        Some(&e1_touched),
        Some(&e1_moved),
    )
    .await;
    assert_eq!(stats.checks.scopes, 2, "{stats:?}");
    // The GSI query of c@x.org and the read of the recorded violations.
    assert_eq!(stats.requests.check_reads, 2, "{stats:?}");
    assert!(recorded(&applier).await.is_empty());
    // Checking wrote only bookkeeping: the source items are as written.
    assert_eq!(
        get(&client, &table, "USER#u9", "EMAIL#e1")
            .await
            .unwrap()
            .get("isPrimary"),
        Some(&Av::Bool(false))
    );
}

#[tokio::test]
async fn a_declared_keep_latest_policy_repairs_two_primaries_and_nothing_is_recorded() {
    let text_spec = std::fs::read_to_string(support::repo().join("projections/user-service.toml"))
        .unwrap()
        .replace(
            "when = { isPrimary = true }\n\n# \"The primary",
            "when = { isPrimary = true }\nrepair = \"keep-latest\"\n\n# \"The primary",
        );
    let spec = Arc::new(Spec::from_toml(&text_spec, "user-service+repair.toml").unwrap());
    assert!(
        spec.summary().contains("repair: keep-latest"),
        "{}",
        spec.summary()
    );
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec, "keep-latest").await;
    put_profile(&client, &table, "u1").await;
    let e1 = email("u1", "e1", "a@x.org", true, true);
    write_and_apply(&applier, &client, &table, 1, None, Some(&e1)).await;
    // The writer makes e2 primary and forgets to clear e1.
    let e2 = email("u1", "e2", "b@x.org", true, true);
    let stats = write_and_apply(&applier, &client, &table, 2, None, Some(&e2)).await;
    assert_eq!(stats.checks.repaired, 1, "{stats:?}");
    assert_eq!(stats.checks.recorded, 0);
    let e1_now = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(e1_now.get("isPrimary"), Some(&Av::Bool(false)));
    let e2_now = get(&client, &table, "USER#u1", "EMAIL#e2").await.unwrap();
    assert_eq!(e2_now.get("isPrimary"), Some(&Av::Bool(true)));
    assert!(recorded(&applier).await.is_empty());
}

/// On a Kinesis stream an item's records come in any order: a late copy
/// of the record that made e1 primary, derived as e1 is now, tells
/// nothing of which email became primary last. keep-latest must not
/// repair from it (it would clear e2, the user's newer choice): the
/// violation is recorded, nothing is changed.
#[tokio::test]
async fn keep_latest_repairs_nothing_from_items_derived_as_they_are_now() {
    let text_spec = std::fs::read_to_string(support::repo().join("projections/user-service.toml"))
        .unwrap()
        .replace(
            "when = { isPrimary = true }\n\n# \"The primary",
            "when = { isPrimary = true }\nrepair = \"keep-latest\"\n\n# \"The primary",
        );
    let spec = Arc::new(Spec::from_toml(&text_spec, "user-service+repair.toml").unwrap());
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec, "keep-latest-kinesis").await;
    put_profile(&client, &table, "u1").await;
    let e1 = email("u1", "e1", "a@x.org", true, true);
    let e2 = email("u1", "e2", "b@x.org", true, true);
    put_item(&client, &table, &e1).await;
    put_item(&client, &table, &e2).await;
    let late = change(1, ChangeKind::Insert, None, Some(&e1));
    let states = applier
        .current_states(vec![late], None)
        .await
        .expect("current states");
    let options = BatchOptions {
        read_markers_first: true,
        check_states: true,
        ..BatchOptions::default()
    };
    let outcome = applier
        .apply_batch(&states.records, &options)
        .await
        .expect("applied");
    assert_eq!(outcome.stats.checks.repaired, 0, "{:?}", outcome.stats);
    for id in ["e1", "e2"] {
        let now = get(&client, &table, "USER#u1", &format!("EMAIL#{id}"))
            .await
            .unwrap();
        assert_eq!(now.get("isPrimary"), Some(&Av::Bool(true)), "{id}");
    }
    assert!(
        !recorded(&applier).await.is_empty(),
        "the violation is recorded"
    );
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(support::binary())
        .args(args)
        .envs(support::env())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the binary")
}

#[tokio::test]
async fn the_audit_command_exits_0_clean_1_found_2_error_and_lists_violations() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-cli").await;
    let spec_path = support::repo().join("projections/user-service.toml");
    let spec_arg = spec_path.to_str().unwrap();
    put_profile(&client, &table, "u1").await;
    put_item(&client, &table, &email("u1", "e1", "a@x.org", true, true)).await;
    derive_everything(&applier).await;

    let clean = cli(&["audit", "--spec", spec_arg, "--table", &table]);
    let out = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{out}");
    assert!(out.contains("one-primary-email (exactly-one): ok"), "{out}");

    put_item(&client, &table, &email("u1", "e2", "b@x.org", true, false)).await;
    let dirty = cli(&[
        "audit", "--spec", spec_arg, "--table", &table, "--format", "json",
    ]);
    assert_eq!(dirty.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&dirty.stdout).expect("json report");
    let rules: Vec<&str> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    // e2 lacks its GSI keys too (no worker ran): the audit says so.
    assert_eq!(
        rules,
        [
            "email-gsi1-keys",
            "one-primary-email",
            "primary-email-verified"
        ],
        "{json:#}"
    );
    assert_eq!(json["findings"][0]["problem"], "missing");

    // Nothing recorded yet; `--repair` records the violations.
    let none = cli(&["violations", "list", "--spec", spec_arg, "--table", &table]);
    assert_eq!(none.status.code(), Some(0));
    let repair = cli(&["audit", "--spec", spec_arg, "--table", &table, "--repair"]);
    assert_eq!(repair.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&repair.stdout).contains("[repaired]"));
    let listed = cli(&[
        "violations",
        "list",
        "--spec",
        spec_arg,
        "--table",
        &table,
        "--format",
        "json",
    ]);
    assert_eq!(listed.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");

    let missing = cli(&["audit", "--spec", spec_arg, "--table", "no-such-table"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no-such-table"));
    let bad_spec = cli(&["audit", "--spec", "/nonexistent/spec.toml"]);
    assert_eq!(bad_spec.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_spec.stderr).contains("/nonexistent/spec.toml"));
}

#[tokio::test]
async fn checking_stops_at_the_deadline_and_records_nothing() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec, "check-deadline").await;
    put_profile(&client, &table, "u1").await;
    let e1 = email("u1", "e1", "a@x.org", true, false);
    put_item(&client, &table, &e1).await;
    let outcome = applier
        .apply_batch(
            &[change(1, ChangeKind::Insert, None, Some(&e1))],
            &BatchOptions {
                deadline: Some(tokio::time::Instant::now()),
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    let checks = &outcome.stats.checks;
    assert!(checks.scopes > 0, "{checks:?}");
    assert_eq!(checks.unchecked, checks.scopes, "{checks:?}");
    assert!(recorded(&applier).await.is_empty());
    // The record is not handled (its writes hit the deadline too): it
    // comes again, and then the check records the unverified primary.
    assert!(!outcome.statuses[0].is_handled());
    write_and_apply(&applier, &client, &table, 1, None, Some(&e1)).await;
    assert_eq!(
        recorded(&applier).await,
        [pair("primary-email-verified", "USER#u1")]
    );
}

#[tokio::test]
async fn repairing_a_counter_loses_no_follow_counted_meanwhile() {
    let spec = support::shipped_spec("social-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-race").await;
    let mut history = super::model::History::default();
    for a in ["a", "c"] {
        history.put(super::model::follow(a, "b", "t1"));
    }
    history.write_final(&client, &table).await;
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    // Someone moves a shard by hand: the counter is off by 5.
    let shard = spec.counter_shard_key("followers", &["b".to_string()], 6);
    client
        .update_item()
        .table_name(&table)
        .key("PK", s(&shard.pk))
        .key("SK", s(shard.sk.as_deref().unwrap()))
        .update_expression("ADD #c :d")
        .expression_attribute_names("#c", "count")
        .expression_attribute_values(":d", Av::N("5".into()))
        .send()
        .await
        .unwrap();
    let mut report = run_audit(&applier, false).await;
    assert!(
        report.findings.iter().any(|f| f.problem
            == (Problem::CounterOff {
                expected: 2,
                actual: 7
            })),
        "{}",
        report.to_text(&spec)
    );
    // Between the audit's scan and its repair, d follows b live.
    let before = history.records.len();
    history.put(super::model::follow("d", "b", "t2"));
    history.write_final(&client, &table).await;
    let outcome = applier
        .apply_batch(&history.records[before..], &BatchOptions::default())
        .await
        .unwrap();
    assert!(outcome.statuses.iter().all(|s| s.is_handled()));
    ddb_projector::audit::repair(&applier, &mut report)
        .await
        .unwrap();
    assert!(
        report.repair_failures.is_empty(),
        "{:?}",
        report.repair_failures
    );
    let followers = read_counter(
        &client,
        &table,
        &spec,
        "followers",
        &[("userId".into(), "b".into())],
    )
    .await
    .unwrap();
    assert_eq!(followers, 3, "the repair lost the follow counted meanwhile");
    assert!(run_audit(&applier, false).await.is_clean());
}

/// Merges `reports` with `--repair`: no repair fails, and an audit then
/// finds the table clean.
async fn merge_repairs_to_clean(applier: &Applier, spec: &Spec, reports: Vec<AuditReport>) {
    let merged = merge(applier, reports, true, None)
        .await
        .expect("merge --repair");
    assert!(
        merged.repair_failures.is_empty(),
        "{:?}",
        merged.repair_failures
    );
    let after = run_audit(applier, false).await;
    assert!(after.is_clean(), "{}", after.to_text(spec));
}

/// A report as a file carries it.
fn through_json(report: AuditReport) -> AuditReport {
    serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap()
}

/// Each segment of `options.segments` audited apart, its report as a file
/// carries it.
async fn segment_reports(applier: &Applier, options: AuditOptions) -> Vec<AuditReport> {
    let mut reports = Vec::new();
    for segment in 0..options.segments {
        let options = AuditOptions {
            segment: Some(segment),
            ..options.clone()
        };
        let report = audit(applier, &options).await.expect("audit a segment");
        assert_eq!(report.segment, Some(segment));
        assert!(report.sketch.is_some());
        reports.push(through_json(report));
    }
    reports
}

#[tokio::test]
async fn segments_audited_apart_and_merged_find_what_one_audit_finds() {
    let (spec, fixture) = drifted_social("audit-merge").await;
    let applier = &fixture.applier;
    let whole = run_audit(applier, false).await;
    assert!(!whole.is_clean());
    let options = |repair| AuditOptions {
        segments: 3,
        repair,
        page_size: Some(4),
        ..AuditOptions::default()
    };
    let reports = segment_reports(applier, options(false)).await;
    // The counters are off by facts that lie in other segments: no
    // segment concludes them alone.
    assert!(reports.iter().all(|r| r
        .findings
        .iter()
        .all(|f| f.rule != "followers" && f.rule != "following")));
    let merged = merge(applier, reports.clone(), false, None)
        .await
        .expect("merge");
    assert_eq!(found(&merged), found(&whole), "{}", merged.to_text(&spec));
    assert_eq!(merged.scanned, whole.scanned);

    // Every segment once.
    let refused = |reports: Vec<AuditReport>| async move {
        merge(applier, reports, false, None)
            .await
            .expect_err("refused")
            .to_string()
    };
    let missing = refused(reports[..2].to_vec()).await;
    assert!(missing.contains("segments 2 of 3 are missing"), "{missing}");
    let twice = refused(vec![
        reports[0].clone(),
        reports[0].clone(),
        reports[2].clone(),
    ])
    .await;
    assert!(twice.contains("segment 0 is given twice"), "{twice}");
    let whole_report = refused(vec![through_json(whole.clone())]).await;
    assert!(whole_report.contains("not one segment"), "{whole_report}");
    let mut elsewhere = reports.clone();
    elsewhere[1].table = "another-table".to_string();
    let elsewhere = refused(elsewhere).await;
    assert!(
        elsewhere.contains("segment 1 is of the table `another-table`"),
        "{elsewhere}"
    );

    // Recounting alone cannot make a counter right while a membership it
    // counts is missing (the segments did not repair): not claimed fixed.
    let recounted = merge(applier, reports.clone(), true, None)
        .await
        .expect("merge --repair");
    let off = recounted
        .findings
        .iter()
        .find(|f| f.key == "COUNTER#followers#b")
        .expect("the counter off");
    assert!(!off.repaired, "{}", recounted.to_text(&spec));
    assert!(
        recounted
            .repair_failures
            .iter()
            .any(|f| f.contains("findings that change its members are not repaired")),
        "{:?}",
        recounted.repair_failures
    );

    // Each segment repairs what it found; the merge recounts the counters.
    let repaired = segment_reports(applier, options(true)).await;
    merge_repairs_to_clean(applier, &spec, repaired).await;
}

#[tokio::test]
async fn audit_merge_combines_segment_reports_from_files() {
    let (_spec, fixture) = drifted_social("audit-merge-cli").await;
    let spec_path = support::repo().join("projections/social-service.toml");
    let spec_arg = spec_path.to_str().unwrap();
    let table = fixture.table.as_str();
    let dir = std::env::temp_dir().join(format!("audit-merge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for i in ["0", "1"] {
        let out = cli(&[
            "audit",
            "--spec",
            spec_arg,
            "--table",
            table,
            "--segment",
            i,
            "--total-segments",
            "2",
            "--format",
            "json",
        ]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = dir.join(format!("segment-{i}.json"));
        std::fs::write(&file, &out.stdout).unwrap();
        files.push(file.to_str().unwrap().to_string());
    }
    let merged = cli(&[
        "audit-merge",
        "--spec",
        spec_arg,
        "--table",
        table,
        &files[0],
        &files[1],
    ]);
    let text = String::from_utf8_lossy(&merged.stdout);
    assert_eq!(merged.status.code(), Some(1), "{text}");
    assert!(text.contains("off by +3 (is 6, should be 3)"), "{text}");
    assert!(text.contains("orphaned"), "{text}");

    let one = cli(&[
        "audit-merge",
        "--spec",
        spec_arg,
        "--table",
        table,
        &files[1],
    ]);
    assert_eq!(one.status.code(), Some(2));
    let error = String::from_utf8_lossy(&one.stderr);
    assert!(error.contains("segments 0 of 2 are missing"), "{error}");
    std::fs::write(dir.join("bad.json"), "{ not json").unwrap();
    let bad = dir.join("bad.json");
    let bad = cli(&[
        "audit-merge",
        "--spec",
        spec_arg,
        "--table",
        table,
        bad.to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let error = String::from_utf8_lossy(&bad.stderr);
    assert!(
        error.contains("bad.json is not a segment report"),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn max_rcu_bounds_the_read_rate() {
    let (spec, fixture) = drifted_social("audit-rcu").await;
    let applier = &fixture.applier;
    let options = AuditOptions {
        segments: 3,
        page_size: Some(4),
        ..AuditOptions::default()
    };
    let free = audit(applier, &options).await.expect("audit");
    // The limit lets the scan take about two seconds.
    let limit = free.read_units / 2.0;
    let paced = audit(
        applier,
        &AuditOptions {
            max_rcu: Some(limit),
            ..options
        },
    )
    .await
    .expect("audit");
    assert_eq!(found(&paced), found(&free), "{}", paced.to_text(&spec));
    assert!(
        paced.seconds >= 1.5,
        "{:.1} RCU at most {limit:.1}/s took {:.2} s",
        paced.read_units,
        paced.seconds
    );
}

/// u0, u1 and u2, each with a profile and a primary email `dup@x.org`,
/// derived: one `unique` violation with three holders.
async fn three_users_sharing_an_address(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    applier: &Applier,
) {
    for user in ["u0", "u1", "u2"] {
        put_profile(client, table, user).await;
        let id = user.replace('u', "e");
        put_item(client, table, &email(user, &id, "dup@x.org", true, true)).await;
    }
    derive_everything(applier).await;
}

/// Removes the index keys `email-gsi1-keys` wrote on an email: drift that
/// takes the item out of the index the `unique` check queries.
async fn drop_index_keys(client: &aws_sdk_dynamodb::Client, table: &str, user: &str, id: &str) {
    client
        .update_item()
        .table_name(table)
        .key("PK", s(&format!("USER#{user}")))
        .key("SK", s(&format!("EMAIL#{id}")))
        .update_expression("REMOVE GSI1PK, GSI1SK")
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_unique_violation_is_found_once_when_a_holder_lost_its_index_key() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-unique").await;
    three_users_sharing_an_address(&client, &table, &applier).await;
    let violation = triple("unique-email-address", "violation", "EMAIL#dup@x.org");
    let holders = |report: &AuditReport| -> Vec<Vec<String>> {
        report
            .findings
            .iter()
            .filter(|f| f.rule == "unique-email-address")
            .map(|f| f.items.clone())
            .collect()
    };

    // The first holder is out of the index: the others' pages see it only
    // through their own item, and must not report the value twice.
    drop_index_keys(&client, &table, "u0", "e0").await;
    let report = run_audit(&applier, false).await;
    assert_eq!(
        found(&report),
        [
            triple("email-gsi1-keys", "missing", "USER#u0 / EMAIL#e0"),
            violation.clone(),
        ],
        "{}",
        report.to_text(&spec)
    );
    assert_eq!(
        holders(&report),
        [[
            "USER#u0 / EMAIL#e0",
            "USER#u1 / EMAIL#e1",
            "USER#u2 / EMAIL#e2"
        ]]
    );

    // Two holders, one of them out of the index: the index alone shows
    // one owner, yet the value is held twice.
    put_item(
        &client,
        &table,
        &email("u2", "e2", "solo@x.org", true, true),
    )
    .await;
    derive_everything(&applier).await;
    drop_index_keys(&client, &table, "u0", "e0").await;
    let report = run_audit(&applier, false).await;
    assert_eq!(
        found(&report),
        [
            triple("email-gsi1-keys", "missing", "USER#u0 / EMAIL#e0"),
            violation,
        ],
        "{}",
        report.to_text(&spec)
    );
    assert_eq!(
        holders(&report),
        [["USER#u0 / EMAIL#e0", "USER#u1 / EMAIL#e1"]]
    );
}

#[tokio::test]
async fn a_global_counter_is_audited_exactly() {
    let toml = std::fs::read_to_string(support::repo().join("projections/social-service.toml"))
        .unwrap()
        .replace(
            "of = { userId = \"{followeeId}\" }\nshards = 8",
            "of = {}\nshards = 8",
        )
        // A total per profile cannot count a table-wide counter.
        .replace(
            "[[projections]]\nname = \"followers-count\"\nkind = \"rollup\"\ncounter = \"followers\"\ntarget = \"profile\"\nattribute = \"followersCount\"\n",
            "",
        );
    let spec = Arc::new(Spec::from_toml(&toml, "global.toml").expect("compiles"));
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-global").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("d", "e")] {
        follow(&client, &table, a, b).await;
    }
    derive_everything(&applier).await;
    let clean = run_audit(&applier, false).await;
    assert!(clean.is_clean(), "{}", clean.to_text(&spec));

    let shard = support::scan_all(&client, &table)
        .await
        .into_iter()
        .filter_map(|item| text(&item, "PK"))
        .find(|pk| pk.starts_with("COUNTER#followers#"))
        .expect("a shard of the global counter");
    client
        .update_item()
        .table_name(&table)
        .key("PK", s(&shard))
        .key("SK", s("COUNTER"))
        .update_expression("ADD #c :d")
        .expression_attribute_names("#c", "count")
        .expression_attribute_values(":d", Av::N("2".into()))
        .send()
        .await
        .unwrap();
    let report = run_audit(&applier, false).await;
    let shard_off = report
        .findings
        .iter()
        .find(|f| f.rule == "followers" && f.key == format!("{shard} / COUNTER"))
        .map(|f| f.problem.label());
    assert!(
        shard_off.is_some_and(|label| label.ends_with("but 1 records name it")
            || label.ends_with("but 2 records name it")
            || label.ends_with("but 3 records name it")),
        "{}",
        report.to_text(&spec)
    );
    assert!(
        found(&report).contains(&triple(
            "followers",
            "off by +2 (is 5, should be 3)",
            "COUNTER#followers"
        )),
        "{}",
        report.to_text(&spec)
    );
    let repaired = run_audit(&applier, true).await;
    assert!(
        repaired.repair_failures.is_empty(),
        "{:?}",
        repaired.repair_failures
    );
    let after = run_audit(&applier, false).await;
    assert!(after.is_clean(), "{}", after.to_text(&spec));
    let total = read_counter(&client, &table, &spec, "followers", &[])
        .await
        .unwrap();
    assert_eq!(total, 3);
}

#[tokio::test]
async fn a_merge_keeps_the_violations_recorded_after_its_segments_began() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-merge-late").await;
    put_profile(&client, &table, "u1").await;
    put_item(&client, &table, &email("u1", "e1", "a@x.org", true, true)).await;
    derive_everything(&applier).await;
    let two = AuditOptions {
        segments: 2,
        ..AuditOptions::default()
    };
    let reports = segment_reports(&applier, two).await;
    // After the segments read the table, a writer breaks an invariant and
    // the worker records it.
    let second = email("u1", "e2", "b@x.org", true, true);
    write_and_apply(&applier, &client, &table, 10, None, Some(&second)).await;
    assert_eq!(
        recorded(&applier).await,
        [pair("one-primary-email", "USER#u1")]
    );
    let merged = merge(&applier, reports, true, None).await.expect("merge");
    assert!(merged.is_clean(), "{}", merged.to_text(&spec));
    assert_eq!(merged.violations_cleared, 0);
    assert_eq!(
        recorded(&applier).await,
        [pair("one-primary-email", "USER#u1")],
        "a violation newer than the audit's read stays recorded"
    );
}

#[tokio::test]
async fn a_violation_broken_again_after_the_audit_read_it_stays_recorded() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-again").await;
    put_profile(&client, &table, "u1").await;
    let first = email("u1", "e1", "a@x.org", true, true);
    write_and_apply(&applier, &client, &table, 1, None, Some(&first)).await;
    let second = email("u1", "e2", "b@x.org", true, true);
    write_and_apply(&applier, &client, &table, 2, None, Some(&second)).await;
    let broken = [pair("one-primary-email", "USER#u1")];
    assert_eq!(recorded(&applier).await, broken);

    // Resolved while the segments read the table (the worker has not seen
    // it yet), broken again the same way before the merge. No clock skew
    // is allowed: the record is older than the audit, and only reading
    // the scope again tells it holds.
    let applier = control::applier(
        client.clone(),
        spec.clone(),
        &table,
        ddb_projector::apply::ApplyConfig {
            clock_skew: std::time::Duration::ZERO,
            ..ddb_projector::apply::ApplyConfig::default()
        },
    );
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    put_item(&client, &table, &email("u1", "e2", "b@x.org", false, true)).await;
    let two = AuditOptions {
        segments: 2,
        ..AuditOptions::default()
    };
    let reports = segment_reports(&applier, two).await;
    assert!(reports.iter().all(|r| r.violation_keys.is_empty()));
    put_item(&client, &table, &second).await;
    let merged = merge(&applier, reports, true, None).await.expect("merge");
    assert_eq!(merged.violations_cleared, 0);
    assert_eq!(
        recorded(&applier).await,
        broken,
        "what holds again when the audit clears stays recorded"
    );
}

#[tokio::test]
async fn segments_merge_a_unique_violation_whose_holders_each_saw_part() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-unique-merge").await;
    three_users_sharing_an_address(&client, &table, &applier).await;
    // Two holders out of the index: each one's page sees itself and u1.
    drop_index_keys(&client, &table, "u0", "e0").await;
    drop_index_keys(&client, &table, "u2", "e2").await;
    let unique = |report: &AuditReport| -> Vec<(Vec<String>, String)> {
        report
            .findings
            .iter()
            .filter(|f| f.rule == "unique-email-address")
            .map(|f| (f.items.clone(), f.detail.clone()))
            .collect()
    };
    let all = vec![
        "USER#u0 / EMAIL#e0".to_string(),
        "USER#u1 / EMAIL#e1".to_string(),
        "USER#u2 / EMAIL#e2".to_string(),
    ];
    let three = "EMAIL#dup@x.org belongs to 3 owners: USER#u0, USER#u1, USER#u2".to_string();
    let whole = run_audit(&applier, false).await;
    assert_eq!(unique(&whole), [(all.clone(), three.clone())]);

    let segments = |repair| AuditOptions {
        segments: 3,
        repair,
        page_size: Some(2),
        ..AuditOptions::default()
    };
    let merged = merge(
        &applier,
        segment_reports(&applier, segments(false)).await,
        false,
        None,
    )
    .await
    .expect("merge");
    assert_eq!(found(&merged), found(&whole), "{}", merged.to_text(&spec));
    assert_eq!(unique(&merged), [(all.clone(), three)]);

    // Repaired by segments, the store holds every holder once merged.
    let merged = merge(
        &applier,
        segment_reports(&applier, segments(true)).await,
        true,
        None,
    )
    .await
    .expect("merge --repair");
    assert!(
        merged.repair_failures.is_empty(),
        "{:?}",
        merged.repair_failures
    );
    let stored = applier.recorded_violations().await.unwrap();
    let keys: Vec<Vec<String>> = stored
        .iter()
        .filter(|v| v.invariant == "unique-email-address")
        .map(|v| v.keys.clone())
        .collect();
    assert_eq!(keys, [all]);
}

#[tokio::test]
async fn a_segment_audited_in_slices_from_a_checkpoint_equals_one_run() {
    let (_spec, fixture) = drifted_social("audit-slices").await;
    let applier = &fixture.applier;
    let dir = tempfile::tempdir().unwrap();
    for segment in 0..2 {
        let base = AuditOptions {
            segments: 2,
            segment: Some(segment),
            page_size: Some(2),
            ..AuditOptions::default()
        };
        let whole = audit(applier, &base).await.expect("audit");
        let path = dir.path().join(format!("segment-{segment}.json"));
        let sliced_options = AuditOptions {
            checkpoint: Some(CheckpointStore::File(path.clone())),
            max_pages: Some(1),
            ..base.clone()
        };
        let mut slices = 0;
        let sliced = loop {
            let report = audit(applier, &sliced_options).await.expect("a slice");
            slices += 1;
            if report.complete {
                break report;
            }
            assert!(!report.complete && slices < 100);
        };
        assert!(slices > 2, "{slices} slices");
        assert_eq!(found(&sliced), found(&whole), "segment {segment}");
        assert_eq!(sliced.scanned, whole.scanned);
        assert_eq!(sliced.sketch, whole.sketch);
        // Run again, the checkpoint answers: nothing is read twice.
        let again = audit(applier, &sliced_options).await.expect("again");
        assert!(again.complete);
        assert_eq!(again.scanned, whole.scanned);
    }
    let elsewhere = audit(
        applier,
        &AuditOptions {
            segments: 2,
            segment: Some(1),
            checkpoint: Some(CheckpointStore::File(dir.path().join("segment-0.json"))),
            ..AuditOptions::default()
        },
    )
    .await
    .expect_err("another segment's checkpoint")
    .to_string();
    assert!(
        elsewhere.contains("is the checkpoint of segment 0 of 2"),
        "{elsewhere}"
    );
}

/// What the Lambda's slices do: each segment in slices of one page,
/// checkpointed in the table itself; the run read back and merged finds
/// what one audit finds, and a stale page item beyond what a segment's
/// state counts (a slice cut short after writing it) is not read.
#[tokio::test]
async fn segments_checkpointed_in_the_table_merge_to_what_one_audit_finds() {
    use ddb_projector::audit::checkpoint::{load_run, LoadedRun};
    let (spec, fixture) = drifted_social("audit-table-slices").await;
    let applier = &fixture.applier;
    let whole = run_audit(applier, false).await;
    assert!(!whole.is_clean());
    const TOTAL: u32 = 2;
    let store = CheckpointStore::Table {
        run: "nightly-1".to_string(),
    };
    let not_yet = load_run(applier, "nightly-1", TOTAL).await.unwrap();
    let LoadedRun::Incomplete(why) = not_yet else {
        panic!("a run not started merged: {not_yet:?}");
    };
    assert!(why.contains("segments 0, 1 have not started"), "{why}");
    let mut slices = 0;
    for segment in 0..TOTAL {
        let options = AuditOptions {
            segments: TOTAL,
            segment: Some(segment),
            page_size: Some(2),
            checkpoint: Some(store.clone()),
            max_pages: Some(1),
            ..AuditOptions::default()
        };
        loop {
            let report = audit(applier, &options).await.expect("a slice");
            slices += 1;
            // The findings stay in the table, not in the worker.
            assert!(report.findings.is_empty(), "{:?}", report.findings);
            if report.complete {
                break;
            }
            assert!(slices < 200);
        }
        if segment == 0 {
            let half = load_run(applier, "nightly-1", TOTAL).await.unwrap();
            let LoadedRun::Incomplete(why) = half else {
                panic!("a run with a segment not started merged");
            };
            assert!(why.contains("segments 1 have not started"), "{why}");
        }
    }
    assert!(slices > 4, "{slices} slices");
    // A page item past the state's count, as a slice cut short between
    // writing a page's findings and its state leaves.
    let table = &fixture.table;
    let stale = serde_json::json!({
        "findings": [{
            "rule": "followers", "rule_kind": "counter",
            "problem": "Orphaned", "counters": [],
            "key": "USER#nobody", "items": [], "detail": "stale", "repaired": false
        }]
    });
    put(
        &fixture.client,
        table,
        &[
            ("PK", s("_ddbp#audit")),
            ("SK", s("nightly-1#0/2#p09999999#0000000000000000#000")),
            ("parts", Av::N("1".into())),
            ("findings", s(&stale.to_string())),
        ],
    )
    .await;
    let LoadedRun::Ready(reports, keys) = load_run(applier, "nightly-1", TOTAL).await.unwrap()
    else {
        panic!("a finished run did not load");
    };
    // Both states, and only the pages that found something (fewer than
    // the pages read).
    assert!(
        keys.len() > TOTAL as usize && keys.len() < slices,
        "{} items for {slices} slices",
        keys.len()
    );
    assert!(keys
        .iter()
        .all(|k| k.sk.as_deref() != Some("nightly-1#0/2#p09999999#0000000000000000#000")));
    let merged = merge(applier, reports, false, None).await.expect("merge");
    assert_eq!(found(&merged), found(&whole), "{}", merged.to_text(&spec));
    assert_eq!(merged.scanned, whole.scanned);
}

/// A `unique` violation whose holders lie on several pages of one
/// checkpointed segment is recorded page by page in parts; repaired, the
/// store must hold it whole, from a file and from the table.
#[tokio::test]
async fn a_unique_violation_on_several_pages_of_a_sliced_segment_is_recorded_whole() {
    use ddb_projector::audit::checkpoint::{load_run, LoadedRun};
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-unique-pages").await;
    three_users_sharing_an_address(&client, &table, &applier).await;
    drop_index_keys(&client, &table, "u0", "e0").await;
    drop_index_keys(&client, &table, "u2", "e2").await;
    let all = vec![
        "USER#u0 / EMAIL#e0".to_string(),
        "USER#u1 / EMAIL#e1".to_string(),
        "USER#u2 / EMAIL#e2".to_string(),
    ];
    let stored = || async {
        applier
            .recorded_violations()
            .await
            .unwrap()
            .into_iter()
            .filter(|v| v.invariant == "unique-email-address")
            .map(|v| v.keys)
            .collect::<Vec<_>>()
    };
    let dir = tempfile::tempdir().unwrap();
    let stores = [
        CheckpointStore::File(dir.path().join("segment.json")),
        CheckpointStore::Table {
            run: "pages".to_string(),
        },
    ];
    for store in stores {
        // Clear what the last store recorded.
        for item in support::scan_all(&client, &table).await {
            let pk = text(&item, "PK").unwrap_or_default();
            if pk.starts_with("_ddbp#violation") {
                delete(&client, &table, &pk, &text(&item, "SK").unwrap()).await;
            }
        }
        let options = AuditOptions {
            segments: 1,
            segment: Some(0),
            repair: true,
            page_size: Some(1),
            checkpoint: Some(store.clone()),
            ..AuditOptions::default()
        };
        let report = audit(&applier, &options).await.expect("the segment");
        assert!(report.complete);
        let report = match &store {
            CheckpointStore::File(_) => report,
            CheckpointStore::Table { run } => {
                let LoadedRun::Ready(reports, _) = load_run(&applier, run, 1).await.unwrap() else {
                    panic!("the run did not load");
                };
                merge(&applier, reports, true, None).await.expect("merge")
            }
        };
        let found: Vec<&Vec<String>> = report
            .findings
            .iter()
            .filter(|f| f.rule == "unique-email-address")
            .map(|f| &f.items)
            .collect();
        assert_eq!(found, [&all], "{store:?}");
        assert_eq!(stored().await, std::slice::from_ref(&all), "{store:?}");
    }
}

/// Four invocations of one checkpointed segment at once, each sliced
/// until it answers complete; the run read back.
async fn four_at_once(applier: &Applier, options: &AuditOptions, run: &str) -> Vec<AuditReport> {
    use ddb_projector::audit::checkpoint::{load_run, LoadedRun};
    let invocation = || async {
        let mut slices = 0;
        while !audit(applier, options).await.expect("a slice").complete {
            slices += 1;
            assert!(slices < 500);
        }
    };
    futures::future::join_all((0..4).map(|_| invocation())).await;
    let LoadedRun::Ready(reports, keys) = load_run(applier, run, 1).await.unwrap() else {
        panic!("the run did not load");
    };
    // What the losing invocations stored is gone with them: the run's
    // items are the ones its state names.
    let items = audit_items(applier.client(), applier.table(), &format!("{run}#")).await;
    let mut named: Vec<String> = keys.into_iter().filter_map(|key| key.sk).collect();
    named.sort();
    assert_eq!(items, named);
    reports
}

/// The sort keys of the audit's own items (`_ddbp#audit`) that start
/// with `prefix`, sorted.
pub(super) async fn audit_items(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    prefix: &str,
) -> Vec<String> {
    let mut items: Vec<String> = support::scan_all(client, table)
        .await
        .iter()
        .filter(|item| text(item, "PK").as_deref() == Some("_ddbp#audit"))
        .filter_map(|item| text(item, "SK").filter(|sk| sk.starts_with(prefix)))
        .collect();
    items.sort();
    items
}

/// Duplicate invocations of one segment at once (a retry while the first
/// still runs): none moves the checkpoint back, and the merge finds what
/// one audit finds.
#[tokio::test]
async fn duplicate_slices_of_one_segment_at_once_merge_to_what_one_audit_finds() {
    let (spec, fixture) = drifted_social("audit-duplicate-slices").await;
    let applier = &fixture.applier;
    let whole = run_audit(applier, false).await;
    let options = AuditOptions {
        segments: 1,
        segment: Some(0),
        page_size: Some(1),
        checkpoint: Some(CheckpointStore::Table {
            run: "twice".to_string(),
        }),
        max_pages: Some(2),
        ..AuditOptions::default()
    };
    let reports = four_at_once(applier, &options, "twice").await;
    let merged = merge(applier, reports, false, None).await.expect("merge");
    assert_eq!(found(&merged), found(&whole), "{}", merged.to_text(&spec));
    assert_eq!(merged.scanned, whole.scanned);

    // Repairing at once too: one invocation's repair changes what the
    // others read, and the one that loses the race to save a page must
    // not replace what the winner stored for it.
    let repairing = AuditOptions {
        repair: true,
        checkpoint: Some(CheckpointStore::Table {
            run: "twice-repair".to_string(),
        }),
        ..options.clone()
    };
    let reports = four_at_once(applier, &repairing, "twice-repair").await;
    merge_repairs_to_clean(applier, &spec, reports).await;
}

/// A segment repaired page by page changes what the rest of its scan
/// reads: a reverse edge restored with its record moves its shard after
/// the shard was read, and the shard's and the record's facts then cancel
/// in the sketch while the shard is one too many. The merge counts again
/// every shard a repair moved. Thirty pairs: the scan order that hides the
/// shard (shard, then the source, then the restored edge) is drawn with
/// probability 1/6 for each.
#[tokio::test]
async fn a_segment_repaired_page_by_page_leaves_no_shard_it_moved_off() {
    use ddb_projector::audit::checkpoint::{load_run, LoadedRun};
    let spec = support::shipped_spec("social-service.toml");
    let fixture = support::fixture(spec.clone(), "audit-page-repair").await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    let pairs: Vec<(String, String)> = (0..30)
        .map(|i| (format!("x{i:02}"), format!("y{i:02}")))
        .collect();
    for (x, y) in &pairs {
        follow(client, table, x, y).await;
    }
    derive_everything(applier).await;
    for (x, y) in &pairs {
        delete(
            client,
            table,
            &format!("USER#{y}"),
            &format!("FOLLOWED_BY#{x}"),
        )
        .await;
    }
    let options = AuditOptions {
        segments: 1,
        segment: Some(0),
        repair: true,
        page_size: Some(1),
        checkpoint: Some(CheckpointStore::Table {
            run: "page-repair".to_string(),
        }),
        ..AuditOptions::default()
    };
    let slice = audit(applier, &options).await.expect("the segment");
    assert!(slice.complete);
    let LoadedRun::Ready(reports, _) = load_run(applier, "page-repair", 1).await.unwrap() else {
        panic!("the run did not load");
    };
    merge_repairs_to_clean(applier, &spec, reports).await;
    for (_, y) in &pairs {
        let followers = read_counter(
            client,
            table,
            &spec,
            "followers",
            &[("userId".into(), y.clone())],
        )
        .await
        .unwrap();
        assert_eq!(followers, 1, "followers of {y}");
    }
}

/// Runs counting pass `pass` of `run` over its `total` segments, each by
/// four invocations at once, in slices of `page_size` items.
async fn count_pass_four_at_once(
    applier: &Applier,
    run: &str,
    pass: u32,
    total: u32,
    page_size: i32,
) {
    use ddb_projector::audit::passes::count_slice;
    let options = AuditOptions {
        segments: total,
        page_size: Some(page_size),
        max_pages: Some(2),
        ..AuditOptions::default()
    };
    for segment in 0..total {
        let invocation = || async {
            for slices in 1.. {
                assert!(slices < 500, "segment {segment} of pass {pass} never ends");
                let counted = Box::pin(count_slice(applier, run, pass, segment, &options))
                    .await
                    .expect("a counting slice");
                if counted.done {
                    break;
                }
            }
        };
        futures::future::join_all((0..4).map(|_| invocation())).await;
    }
    // Each segment's state and its tally (one part): what the losing
    // invocations saved went with them.
    let items = audit_items(
        applier.client(),
        applier.table(),
        &format!("{run}#c{pass}#"),
    )
    .await;
    assert_eq!(items.len(), 2 * total as usize, "{items:#?}");
}

/// The merge of a sliced audit reads the table again in counting passes
/// sliced like the audit's own (locate, then recount), each segment here
/// by four invocations at once: it finds what one audit finds and repairs
/// to clean. A shard the live worker moves between the recount's plan and
/// its settling is never set from the count: it is reported, and the next
/// run repairs it.
#[tokio::test]
async fn a_merge_counts_in_sliced_passes_and_never_sets_a_shard_moved_meanwhile() {
    use ddb_projector::audit::passes::{merge_step, Step};
    const TOTAL: u32 = 2;
    let (spec, fixture) = drifted_social("audit-passes").await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    let whole = run_audit(applier, false).await;
    let slices = |run: &str, repair: bool| {
        let run = run.to_string();
        async move {
            for segment in 0..TOTAL {
                let options = AuditOptions {
                    segments: TOTAL,
                    segment: Some(segment),
                    repair,
                    page_size: Some(2),
                    checkpoint: Some(CheckpointStore::Table { run: run.clone() }),
                    max_pages: Some(1),
                    ..AuditOptions::default()
                };
                while !Box::pin(audit(applier, &options))
                    .await
                    .expect("a slice")
                    .complete
                {}
            }
        }
    };
    let step = |run: &'static str, repair: bool| async move {
        Box::pin(merge_step(applier, run, TOTAL, repair))
            .await
            .expect("a merge step")
    };

    // Read-only: one pass that locates the counters.
    slices("passes-1", false).await;
    let Step::Pass { pass: 1, purpose } = step("passes-1", false).await else {
        panic!("the counters are off: a locate pass first");
    };
    assert_eq!(purpose, "locate");
    // A merge before the pass is counted (a retried merge whose answer
    // was lost, a run started again under its name) answers it again.
    let Step::Pass { pass: 1, .. } = step("passes-1", false).await else {
        panic!("a merge before the pass is counted answers it again");
    };
    count_pass_four_at_once(applier, "passes-1", 1, TOTAL, 3).await;
    let Step::Merged(merged, _) = step("passes-1", false).await else {
        panic!("merged after the locate pass");
    };
    assert_eq!(found(&merged), found(&whole), "{}", merged.to_text(&spec));

    // Repairing: locate, then recount. The worker moves the planted shard
    // after the recount is planned (a follower counted on it).
    slices("passes-2", true).await;
    let Step::Pass { pass: 1, .. } = step("passes-2", true).await else {
        panic!("a locate pass first");
    };
    count_pass_four_at_once(applier, "passes-2", 1, TOTAL, 3).await;
    let Step::Pass {
        pass: 2,
        purpose: "recount",
    } = step("passes-2", true).await
    else {
        panic!("a recount pass");
    };
    let shard = spec.counter_shard_key("followers", &["b".to_string()], 5);
    let moved = || async {
        client
            .update_item()
            .table_name(table)
            .key("PK", s(&shard.pk))
            .key("SK", s(shard.sk.as_deref().unwrap()))
            .update_expression("ADD #c :one, #n :one")
            .expression_attribute_names("#c", "count")
            .expression_attribute_names("#n", "changes")
            .expression_attribute_values(":one", Av::N("1".into()))
            .send()
            .await
            .unwrap()
    };
    let count = || async {
        let stored = get(client, table, &shard.pk, shard.sk.as_deref().unwrap())
            .await
            .expect("the shard");
        stored
            .get("count")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<i64>().ok())
            .expect("a count")
    };
    let planned = count().await;
    moved().await;
    count_pass_four_at_once(applier, "passes-2", 2, TOTAL, 3).await;
    // Two merges at once (a duplicate invocation) settle the recount
    // together: each knows the other's writes for what they are.
    let (one, other) = tokio::join!(step("passes-2", true), step("passes-2", true));
    let shard_text = format!("shard {} changed while its records were counted", shard.pk);
    for merged in [one, other] {
        let Step::Merged(repaired, _) = merged else {
            panic!("merged after the recount pass");
        };
        assert!(
            !repaired.repair_failures.is_empty()
                && repaired
                    .repair_failures
                    .iter()
                    .all(|f| f.contains(&shard_text)),
            "{:?}",
            repaired.repair_failures
        );
    }
    let Step::Merged(repaired, _) = step("passes-2", true).await else {
        panic!("merged after the recount pass");
    };
    // The recount left it as the worker did.
    assert_eq!(count().await, planned + 1);
    // Answered again (a retried merge), the settled recount is not redone.
    let Step::Merged(again, _) = step("passes-2", true).await else {
        panic!("merged again");
    };
    assert_eq!(again.repair_failures, repaired.repair_failures);

    // The next run repairs what moved; then the table is clean.
    let next = run_audit(applier, true).await;
    assert!(
        next.repair_failures.is_empty(),
        "{:?}",
        next.repair_failures
    );
    let after = run_audit(applier, false).await;
    assert!(after.is_clean(), "{}", after.to_text(&spec));
}

/// A counter's sources and shards are read at different times: one the
/// worker moves while the merge's locate pass counts it may look off only
/// because of it. The merge sets a counter aside (for the next audit)
/// only when its shards moved since the pass read them by as much as it
/// looks off: a follower whose membership was still on its way, yes; the
/// planted drift, off by more than one late follower explains, no.
#[tokio::test]
async fn a_counter_off_by_what_moved_while_counted_is_set_aside_and_no_more() {
    use ddb_projector::audit::passes::{count_slice, merge_step, Step};
    let (spec, fixture) = drifted_social("audit-moved").await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    let located = |run: &'static str| async move {
        let options = AuditOptions {
            segments: 1,
            segment: Some(0),
            page_size: Some(5),
            checkpoint: Some(CheckpointStore::Table {
                run: run.to_string(),
            }),
            ..AuditOptions::default()
        };
        assert!(Box::pin(audit(applier, &options)).await.unwrap().complete);
        let Step::Pass { pass: 1, .. } =
            Box::pin(merge_step(applier, run, 1, false)).await.unwrap()
        else {
            panic!("a locate pass");
        };
        let counted = Box::pin(count_slice(applier, run, 1, 0, &options))
            .await
            .unwrap();
        assert!(counted.done);
    };
    let merged = |run: &'static str| async move {
        let Step::Merged(merged, _) = Box::pin(merge_step(applier, run, 1, false)).await.unwrap()
        else {
            panic!("merged");
        };
        merged
    };
    // A follower of `late` written; the worker has not applied it yet
    // (the stream lags): its source counts, its shard does not yet.
    let edge = super::model::attrs(&[
        ("PK", s("USER#a")),
        ("SK", s("FOLLOWS#late")),
        ("followedAt", s("2026-11-02")),
    ]);
    put_item(client, table, &edge).await;
    let whole = run_audit(applier, false).await;
    let lagging = "COUNTER#followers#late";
    let drifted = "COUNTER#followers#b";
    for key in [lagging, drifted] {
        assert!(
            whole.findings.iter().any(|f| f.key == key),
            "{key}: {}",
            whole.to_text(&spec)
        );
    }
    located("moved").await;
    // The worker applies it, and a follower of b too, after the pass
    // counted both counters.
    write_and_apply(applier, client, table, 1, None, Some(&edge)).await;
    let late_b = super::model::attrs(&[
        ("PK", s("USER#late")),
        ("SK", s("FOLLOWS#b")),
        ("followedAt", s("2026-11-02")),
    ]);
    write_and_apply(applier, client, table, 2, None, Some(&late_b)).await;
    let merged = merged("moved").await;
    let keys: Vec<&str> = merged.findings.iter().map(|f| f.key.as_str()).collect();
    assert!(!keys.contains(&lagging), "{}", merged.to_text(&spec));
    assert!(merged.moved_while_counted.iter().any(|k| k == lagging));
    // b's counter is off by the planted 3: more than one move explains.
    assert!(keys.contains(&drifted), "{}", merged.to_text(&spec));
    assert!(!merged.moved_while_counted.iter().any(|k| k == drifted));
    // Judged again, the counter that lagged is right.
    let again = run_audit(applier, false).await;
    assert!(
        !again.findings.iter().any(|f| f.key == lagging),
        "{}",
        again.to_text(&spec)
    );
}

/// `audit --resume` continues the run a killed `audit --run r1` left in
/// the table: a segment it had read to its end is not read again (its
/// findings come from the table, though the drift was repaired since: a
/// new run would be clean), the other continues from its checkpoint. The
/// run leaves nothing in the table, and `--resume` after it starts anew.
#[tokio::test]
async fn an_audit_resumed_from_the_table_continues_the_run_it_left() {
    use ddb_projector::control::{Job, Runs};
    let (spec, fixture) = drifted_social("audit-resume").await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    let of_items = |report: &AuditReport| -> Vec<(String, String, String)> {
        found(report)
            .into_iter()
            .filter(|(rule, _, _)| rule != "followers" && rule != "following")
            .collect()
    };
    let mut per_segment = Vec::new();
    for segment in 0..2 {
        let options = AuditOptions {
            segments: 2,
            segment: Some(segment),
            page_size: Some(2),
            ..AuditOptions::default()
        };
        per_segment.push(of_items(&audit(applier, &options).await.unwrap()));
    }
    let done = per_segment
        .iter()
        .position(|f| !f.is_empty())
        .expect("a segment with findings") as u32;
    let runs = Runs::new(client.clone(), table, &spec.table);
    let scope = format!("{table}#all/2");
    let chosen = runs
        .choose(Job::Audit, &scope, Some("r1"), false, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(chosen.run, "r1");
    // The CLI stores a run under its name and scan.
    let whole_scan = AuditOptions {
        segments: 2,
        ..AuditOptions::default()
    };
    let stored = ddb_projector::audit::storage_run("r1", &whole_scan);
    assert_eq!(stored, "r1@all2");
    let slice = |segment: u32| AuditOptions {
        segments: 2,
        segment: Some(segment),
        page_size: Some(2),
        checkpoint: Some(CheckpointStore::Table {
            run: stored.clone(),
        }),
        max_pages: Some(1),
        ..AuditOptions::default()
    };
    let mut slices = 0;
    while !audit(applier, &slice(done)).await.unwrap().complete {
        slices += 1;
        assert!(slices < 100);
    }
    assert!(!audit(applier, &slice(1 - done)).await.unwrap().complete);
    run_audit(applier, true).await;
    assert!(run_audit(applier, false).await.is_clean());

    let spec_path = support::repo().join("projections/social-service.toml");
    let args = [
        "audit",
        "--spec",
        spec_path.to_str().unwrap(),
        "--table",
        table,
        "--segments",
        "2",
        "--page-size",
        "2",
        "--resume",
        "--format",
        "json",
    ];
    let resumed = cli(&args);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(1), "{err}");
    assert!(err.contains("resuming audit `r1`"), "{err}");
    let report: AuditReport = serde_json::from_slice(&resumed.stdout).expect("a json report");
    assert!(report.complete);
    assert_eq!(of_items(&report), per_segment[done as usize]);
    let left = client
        .query()
        .table_name(table)
        .key_condition_expression("PK = :pk")
        .expression_attribute_values(":pk", s("_ddbp#audit"))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert_eq!(left.count(), 0, "{:?}", left.items());
    assert!(runs.last(Job::Audit, &scope).await.unwrap().unwrap().done);

    let again = cli(&args);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{err}");
    assert!(
        err.contains("the last audit, `r1`, ran to its end: starting `audit-"),
        "{err}"
    );
    let named = cli(&[
        "audit",
        "--spec",
        spec_path.to_str().unwrap(),
        "--table",
        table,
        "--run",
        "has space",
    ]);
    assert_eq!(named.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&named.stderr).contains("is not a run name"));
}

/// A run that finishes after another became its job's last leaves the
/// pointer to the other: `--resume` continues the newer run, not a new one.
#[tokio::test]
async fn a_run_finishing_late_never_overwrites_a_newer_runs_pointer() {
    use ddb_projector::control::{Job, Runs};
    let spec = support::shipped_spec("social-service.toml");
    let fixture = support::fixture(spec.clone(), "runs-pointer").await;
    let runs = Runs::new(fixture.client.clone(), &fixture.table, &spec.table);
    let scope = "t#all/4";
    let a = runs
        .clone()
        .start(Job::Audit, scope.to_string(), None, false, &mut |_| {})
        .await
        .unwrap();
    let b = runs
        .clone()
        .start(Job::Audit, scope.to_string(), Some("b"), false, &mut |_| {})
        .await
        .unwrap();
    a.finish().await.unwrap();
    let last = runs.last(Job::Audit, scope).await.unwrap().unwrap();
    assert_eq!((last.run.as_str(), last.done), ("b", false));
    let resumed = runs
        .choose(Job::Audit, scope, None, true, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(resumed.run, "b");
    b.finish().await.unwrap();
    assert!(runs.last(Job::Audit, scope).await.unwrap().unwrap().done);
}

/// `audit --segment I --run NAME --repair` audits page by page from the
/// table: a `unique` violation whose holders lie on several pages is
/// recorded whole, as an audit without a run records it.
#[tokio::test]
async fn a_segment_audited_under_a_run_records_a_unique_violation_whole() {
    let spec = support::shipped_spec("user-service.toml");
    let support::Fixture {
        client,
        table,
        applier,
        ..
    } = support::fixture(spec.clone(), "audit-run-unique").await;
    three_users_sharing_an_address(&client, &table, &applier).await;
    drop_index_keys(&client, &table, "u0", "e0").await;
    drop_index_keys(&client, &table, "u2", "e2").await;
    let options = AuditOptions {
        segments: 1,
        segment: Some(0),
        repair: true,
        page_size: Some(1),
        ..AuditOptions::default()
    };
    let (report, finished) = ddb_projector::audit::audit_run(&applier, &options, "uq")
        .await
        .expect("audit under a run");
    assert!(report.complete && finished.is_some());
    let stored = applier.recorded_violations().await.unwrap();
    let keys: Vec<Vec<String>> = stored
        .iter()
        .filter(|v| v.invariant == "unique-email-address")
        .map(|v| v.keys.clone())
        .collect();
    assert_eq!(
        keys,
        [vec![
            "USER#u0 / EMAIL#e0".to_string(),
            "USER#u1 / EMAIL#e1".to_string(),
            "USER#u2 / EMAIL#e2".to_string(),
        ]]
    );
}
