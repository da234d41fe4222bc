//! The projection lifecycle on DynamoDB Local, as a team lives it: deploy
//! (the worker takes its leases), `status`, `backfill` of what needs it, a
//! changed definition, a retired projection added back, a stale writer of
//! an old definition, and two backfills racing for one projection.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use ddb_projector::apply::{ApplyConfig, BatchOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control::{self, ClaimOutcome, Registry};
use ddb_projector::decode::decode_scanned_item;
use ddb_projector::spec::Spec;
use serde_json::Value;

use super::model::{follow, put_item, user_counter};
use super::support::{self, repo};

/// Leases of CLI processes last a second, so that a deploy of another
/// definition needs no long wait in a test.
fn cli(args: &[&str]) -> Output {
    Command::new(support::binary())
        .args(args)
        .envs(support::env())
        .env("RUST_LOG", "warn")
        .env("PROJECTOR_LEASE_SECONDS", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the binary")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The shipped social spec, edited, in a file of its own.
/// The shipped social spec without its rollups, edited: these tests follow
/// counters through their lives (`kinds.rs` follows a rollup through its
/// counter's rebuild).
fn social_spec(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("projections/social-service.toml")).unwrap();
    let start = text.find("# The counters' totals on the profile").unwrap();
    let end = text.find("# Leaderboard by tier").unwrap();
    let text = format!("{}{}", &text[..start], &text[end..]);
    let path = dir.join(name);
    std::fs::write(&path, edit(text)).unwrap();
    path
}

type Rows = Vec<(String, String, Option<String>)>;

/// `status --format json`: the exit code and each projection's state and
/// next step.
fn status(spec: &Path, table: &str) -> (i32, Rows) {
    let output = cli(&[
        "status",
        "--spec",
        spec.to_str().unwrap(),
        "--table",
        table,
        "--format",
        "json",
    ]);
    let code = output.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "status failed: {}", stderr(&output));
    let value: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rows = value["projections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["name"].as_str().unwrap().to_string(),
                row["state"].as_str().unwrap().to_string(),
                row["next"].as_str().map(str::to_string),
            )
        })
        .collect();
    (code, rows)
}

fn row<'a>(rows: &'a Rows, name: &str) -> &'a (String, String, Option<String>) {
    rows.iter()
        .find(|r| r.0 == name)
        .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
}

fn state<'a>(rows: &'a Rows, name: &str) -> &'a str {
    &row(rows, name).1
}

fn run_drain(spec: &Path, table: &str) {
    let output = cli(&[
        "run",
        "--drain",
        "--spec",
        spec.to_str().unwrap(),
        "--table",
        table,
    ]);
    assert!(output.status.success(), "run --drain: {}", stderr(&output));
}

fn backfill_cli(spec: &Path, table: &str, extra: &[&str]) -> Output {
    cli(&[
        &[
            "backfill",
            "--spec",
            spec.to_str().unwrap(),
            "--table",
            table,
        ][..],
        extra,
    ]
    .concat())
}

fn backfilled(output: &Output) -> Vec<String> {
    assert!(output.status.success(), "backfill: {}", stderr(output));
    let value: Value = serde_json::from_slice(&output.stdout).expect("JSON summary");
    value["backfilled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// v2 of the social spec: the followers counter on 16 shards.
fn v2(t: String) -> String {
    t.replace("shards = 8", "shards = 16")
}

/// v3: v2 without the `following` counter.
fn v3(t: String) -> String {
    let t = v2(t);
    let start = t.find("# Users a follows.").unwrap();
    let end = start + t[start..].find("shards = 4").unwrap() + "shards = 4".len();
    format!("{}{}", &t[..start], &t[end..])
}

#[tokio::test]
async fn status_follows_each_projection_from_deploy_to_live_change_and_retirement() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let client = support::client().await;
    let spec = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec, "lifecycle").await;
    put_item(&client, &table, &follow("a", "b", "2026-11-23")).await;

    // Nothing runs yet: every projection is new, and the first step is the
    // deploy.
    let (code, rows) = status(&v1, &table);
    assert_eq!(code, 1);
    assert!(rows.iter().all(|r| r.1 == "new"), "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.2.as_deref().unwrap().starts_with("deploy this spec")),
        "{rows:?}"
    );
    // Deployed: live changes are projected, the history is not.
    run_drain(&v1, &table);
    // The last change each projection applied, and its lag.
    let output = cli(&[
        "status",
        "--spec",
        v1.to_str().unwrap(),
        "--table",
        &table,
        "--format",
        "json",
    ]);
    let value: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let applied = value["projections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == "followed-by")
        .map(|row| row["applied"].clone())
        .unwrap();
    let (change, at) = (
        applied["changeMs"].as_i64().expect("a change time"),
        applied["appliedMs"].as_i64().expect("an applied time"),
    );
    let now = ddb_projector::dynamo::time::now_ms() as i64;
    assert!(
        change > now - 600_000 && change <= at && at <= now,
        "{applied}"
    );
    let text = String::from_utf8_lossy(
        &cli(&["status", "--spec", v1.to_str().unwrap(), "--table", &table]).stdout,
    )
    .to_string();
    assert!(text.contains("last change applied"), "{text}");
    let (code, rows) = status(&v1, &table);
    assert_eq!(code, 1, "running is not backfilled");
    assert_eq!(
        row(&rows, "followers").2.as_deref(),
        Some(
            format!(
                "ddb-projector backfill --spec {} --table {table} --projection followers",
                v1.display()
            )
            .as_str()
        )
    );

    // `backfill` without --projection backfills what is not live.
    let done = backfilled(&backfill_cli(&v1, &table, &[]));
    assert_eq!(done.len(), spec.projections.len(), "{done:?}");
    let (code, rows) = status(&v1, &table);
    assert_eq!(code, 0, "{rows:?}");
    assert!(rows.iter().all(|r| r.1 == "live"), "{rows:?}");
    // Nothing left: a second one scans nothing.
    let again = backfill_cli(&v1, &table, &[]);
    assert!(
        stderr(&again).contains("nothing to backfill"),
        "{}",
        stderr(&again)
    );

    // v2 changes `followers`. Not deployed: its data is v1's, and the first
    // step is the deploy; the other projections are still live.
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let (code, rows) = status(&v2, &table);
    assert_eq!(code, 1);
    assert_eq!(state(&rows, "followers"), "changed");
    assert!(row(&rows, "followers")
        .2
        .as_deref()
        .unwrap()
        .starts_with("deploy"));
    assert_eq!(state(&rows, "following"), "live");
    // Deployed: v2's `followers` is built beside v1's, which the worker
    // keeps current as `followers~0` and readers read meanwhile.
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    run_drain(&v2, &table);
    let (_, rows) = status(&v2, &table);
    assert_eq!(state(&rows, "followers"), "changed");
    assert_eq!(state(&rows, "followers~0"), "serving", "{rows:?}");
    assert_eq!(row(&rows, "followers~0").2, None);
    // Backfilled: only `followers` is; readers switch to it, and the old
    // version is retired once no worker keeps it current.
    let done = backfilled(&backfill_cli(&v2, &table, &[]));
    assert_eq!(done, vec!["followers".to_string()]);
    // The backfill's lease of what it wrote (the old version's records,
    // on the same edges) runs a lease and its margins past its end.
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    run_drain(&v2, &table);
    let (code, rows) = status(&v2, &table);
    assert_eq!(code, 1, "{rows:?}");
    assert_eq!(state(&rows, "followers"), "live");
    assert_eq!(state(&rows, "followers~0"), "retired");
    assert!(row(&rows, "followers~0").2.as_deref().unwrap().ends_with(
        "prune --spec {} --table {table} --projection followers~0"
            .replace("{}", &v2.display().to_string())
            .replace("{table}", &table)
            .as_str()
    ));
    let pruned = cli(&[
        "prune",
        "--spec",
        v2.to_str().unwrap(),
        "--table",
        &table,
        "--projection",
        "followers~0",
    ]);
    assert!(pruned.status.success(), "prune: {}", stderr(&pruned));
    let (code, rows) = status(&v2, &table);
    assert_eq!(code, 0, "{rows:?}");
    // v1's view now: its followers is not what the table holds.
    assert_eq!(state(&status(&v1, &table).1, "followers"), "changed");

    // v3 drops `following`: retired until pruned, and the worker without it
    // leaves its changes unprojected.
    let v3 = social_spec(dir.path(), "v3.toml", v3);
    run_drain(&v3, &table);
    let (code, rows) = status(&v3, &table);
    assert_eq!(code, 1);
    assert_eq!(state(&rows, "following"), "retired");
    assert!(row(&rows, "following")
        .2
        .as_deref()
        .unwrap()
        .contains("prune"));
    assert_eq!(state(&rows, "followers"), "live");
    // Added back (v2 again, the same definition as its last backfill): the
    // changes made while it was gone were not projected, so it is not live.
    run_drain(&v2, &table);
    let (code, rows) = status(&v2, &table);
    assert_eq!(code, 1);
    assert_eq!(state(&rows, "following"), "new", "{rows:?}");
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    let done = backfilled(&backfill_cli(&v2, &table, &[]));
    assert_eq!(done, vec!["following".to_string()]);
    assert_eq!(status(&v2, &table).0, 0);

    // The text form names each projection, its state and what to run.
    let output = cli(&["status", "--spec", v3.to_str().unwrap(), "--table", &table]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("following") && text.contains("retired"),
        "{text}"
    );
    assert!(text.contains("projections live"), "{text}");
}

#[tokio::test]
async fn a_writer_of_the_old_definition_turns_a_live_projection_back_and_blocks_claims() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let table = support::fresh_table(&client, &spec2, "lifecycle-stale").await;
    put_item(&client, &table, &follow("a", "b", "2026-11-23")).await;
    run_drain(&v2, &table);
    backfilled(&backfill_cli(&v2, &table, &[]));
    assert_eq!(status(&v2, &table).0, 0);

    // A process still on v1 (a stale Lambda environment, or a redrive with
    // an old spec file once v2's worker is idle: while it runs, such a
    // writer refuses) writes a follow.
    let running = definition(&client, &table, &spec2, "followers")
        .await
        .and_then(|d| d.consumed_until)
        .expect("v2 ran");
    let wait = running.saturating_sub(ddb_projector::dynamo::time::now_ms()) + 100;
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    let item = follow("c", "b", "2026-11-24");
    put_item(&client, &table, &item).await;
    let record = decode_scanned_item(&spec1.table, 0, 1, item.into_iter().collect());
    // Straight from its file, v1's `followers` would write over the
    // version readers read: refused.
    let unlaid = control::applier(
        client.clone(),
        spec1.clone(),
        &table,
        ApplyConfig::default(),
    );
    let outcome = unlaid
        .apply_batch(std::slice::from_ref(&record), &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.first_failure(), Some(0));
    // Laid out as every process lays it out, it builds v1 beside v2.
    let registry = Registry::new(client.clone(), &table, &spec1.table);
    let (laid, layouts) = registry.layout(&spec1).await.unwrap();
    let followers = layouts.iter().find(|l| l.name == "followers").unwrap();
    assert_eq!(followers.generation, 1);
    assert_eq!(
        followers.old.as_ref().map(|o| o.not_kept.clone()),
        Some(None)
    );
    let stale = control::applier(
        client.clone(),
        Arc::new(laid),
        &table,
        ApplyConfig::default(),
    );
    let outcome = stale
        .apply_batch(&[record], &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.first_failure(), None);
    let (code, rows) = status(&v2, &table);
    assert_eq!(code, 1);
    assert_eq!(state(&rows, "followers"), "changed", "{rows:?}");
    // Projections whose definition did not change stay live.
    assert_eq!(state(&rows, "following"), "live");

    // While its lease runs, a backfill cannot claim `followers`: the stale
    // writer could undo what it writes.
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let followers = spec2.projection_id("followers").unwrap();
    match registry.claim(&spec2, &[followers], "r1").await.unwrap() {
        ClaimOutcome::Wait {
            projection, until, ..
        } => {
            assert_eq!(projection, "followers");
            assert!(until > ddb_projector::dynamo::time::now_ms());
        }
        other => panic!("claimed beside a live lease of v1: {other:?}"),
    }
    let refused = backfill_cli(&v2, &table, &["--wait", "0s"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("holds a lease until"),
        "{}",
        stderr(&refused)
    );
}

#[tokio::test]
async fn only_the_last_claim_of_a_projection_can_record_its_backfill() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let client = support::client().await;
    let spec = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec, "lifecycle-claims").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a")] {
        put_item(&client, &table, &follow(a, b, "2026-11-23")).await;
    }
    run_drain(&v1, &table);
    let registry = Registry::new(client.clone(), &table, &spec.table);
    let all: Vec<usize> = (0..spec.projections.len()).collect();
    let applier = control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    let segment = |run: &str, i: u32| BackfillOptions {
        segments: vec![i],
        total_segments: 2,
        progress: false,
        resume: true,
        run: Some(run.to_string()),
        ..BackfillOptions::default()
    };
    assert_eq!(
        registry.claim(&spec, &all, "r1").await.unwrap(),
        ClaimOutcome::Claimed
    );
    // One of two segments: nothing recorded yet, and status says so.
    let first = backfill(&applier, &segment("r1", 0)).await.unwrap();
    assert!(first.backfilled.is_empty(), "{first:?}");
    let (_, rows) = status(&v1, &table);
    assert!(rows.iter().all(|r| r.1 == "backfilling"), "{rows:?}");
    // A second backfill claims them; the first one's last segment then
    // cannot record anything, and its progress is not the second's.
    assert_eq!(
        registry.claim(&spec, &all, "r2").await.unwrap(),
        ClaimOutcome::Claimed
    );
    let late = backfill(&applier, &segment("r1", 1)).await.unwrap();
    assert!(late.backfilled.is_empty(), "{late:?}");
    assert_eq!(late.not_backfilled.len(), spec.projections.len());
    assert_ne!(status(&v1, &table).0, 0);
    let r2_first = backfill(&applier, &segment("r2", 0)).await.unwrap();
    assert!(r2_first.scanned > 0 || r2_first.is_done());
    assert!(r2_first.backfilled.is_empty(), "r2 has a segment to go");
    let r2_last = backfill(&applier, &segment("r2", 1)).await.unwrap();
    assert_eq!(r2_last.backfilled.len(), spec.projections.len());
    assert_eq!(status(&v1, &table).0, 0);
    // Claiming again with a finished run's name starts a new claim: the
    // projections are backfilling until that run completes again.
    assert_eq!(
        registry.claimed_run(&spec, &all).await.unwrap(),
        None,
        "a complete run holds no claim"
    );
}

/// The registry's view of one projection's definition.
async fn definition(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    name: &str,
) -> Option<ddb_projector::control::Definition> {
    let registry = Registry::new(client.clone(), table, &spec.table);
    let snapshot = registry.snapshot(spec).await.unwrap();
    let id = spec.projection_id(name).unwrap();
    snapshot
        .record(name)
        .definition(&ddb_projector::control::hex(
            spec.projections[id].fingerprint,
        ))
        .cloned()
}

#[tokio::test]
async fn a_shorter_lease_never_cuts_a_longer_one_of_the_same_definition() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "lifecycle-lease").await;
    let ids: Vec<usize> = (0..spec.projections.len()).collect();
    let now = ddb_projector::dynamo::time::now_ms();
    // A Lambda environment with a long invocation, then a short-lived
    // writer of the same definition (a redrive, another environment).
    let long = ddb_projector::control::Leases::shared(
        &client,
        &table,
        &spec,
        true,
        None,
        std::time::Duration::from_secs(600),
    );
    let short = ddb_projector::control::Leases::shared(
        &client,
        &table,
        &spec,
        false,
        None,
        std::time::Duration::from_secs(1),
    );
    let long_until = long.ensure(&ids, now + 1_000).await.unwrap();
    let short_until = short.ensure(&ids, now + 1_000).await.unwrap();
    assert!(short_until < long_until);
    let followers = definition(&client, &table, &spec, "followers")
        .await
        .expect("leased");
    assert_eq!(
        followers.writes_until, long_until,
        "the registry keeps the longer lease"
    );
}

#[tokio::test]
async fn a_backfill_of_a_counter_leases_the_edge_it_rides_on() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "lifecycle-rides").await;
    put_item(&client, &table, &follow("a", "b", "2026-11-23")).await;
    let applier = control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    let followers = spec.projection_id("followers").unwrap();
    let summary = backfill(
        &applier,
        &BackfillOptions {
            projections: Some(vec![followers]),
            progress: false,
            ..BackfillOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(summary.writes > 0, "{summary:?}");
    // `followers` keeps its records on `followed-by`'s reverse items, so
    // the backfill wrote those items too: it holds a lease for both.
    for name in ["followers", "followed-by"] {
        assert!(
            definition(&client, &table, &spec, name).await.is_some(),
            "no lease of {name}"
        );
    }
}

#[tokio::test]
async fn a_consumer_without_a_new_projection_holds_off_its_backfill() {
    let dir = tempfile::tempdir().unwrap();
    // v1 lacks `following`; v2 adds it.
    let v1 = social_spec(dir.path(), "v1.toml", |t| {
        let start = t.find("# Users a follows.").unwrap();
        let end = start + t[start..].find("shards = 4").unwrap() + "shards = 4".len();
        format!("{}{}", &t[..start], &t[end..])
    });
    let v2 = social_spec(dir.path(), "v2.toml", |t| t);
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let table = support::fresh_table(&client, &spec2, "lifecycle-new").await;
    // A v1 worker runs (its lease never named `following`).
    let worker1 = control::stream_consumer(
        client.clone(),
        spec1.clone(),
        &table,
        ApplyConfig::default(),
    );
    worker1.take_leases().await.unwrap();
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let following = spec2.projection_id("following").unwrap();
    match registry.claim(&spec2, &[following], "r1").await.unwrap() {
        ClaimOutcome::Wait {
            projection, other, ..
        } => {
            assert_eq!(projection, "following");
            assert_eq!(other, ddb_projector::control::WITHOUT);
        }
        other => panic!("claimed while a worker without it ran: {other:?}"),
    }
    // A run's name claims a projection once.
    let followers = spec2.projection_id("followers").unwrap();
    let same = |run: &'static str| {
        let registry = registry.clone();
        let spec2 = spec2.clone();
        async move { registry.claim(&spec2, &[followers], run).await.unwrap() }
    };
    assert_eq!(same("a").await, ClaimOutcome::Claimed);
    assert_eq!(same("a").await, ClaimOutcome::Claimed, "a retried claim");
    assert_eq!(same("b").await, ClaimOutcome::Claimed);
    assert!(
        matches!(same("a").await, ClaimOutcome::RunUsed { .. }),
        "a superseded run cannot claim again"
    );
}

#[tokio::test]
async fn a_writer_with_another_spec_than_the_running_worker_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let table = support::fresh_table(&client, &spec2, "lifecycle-deployed").await;
    let worker2 = control::stream_consumer(
        client.clone(),
        spec2.clone(),
        &table,
        ApplyConfig::default(),
    );
    worker2.take_leases().await.unwrap();
    // `dlq redrive` or `backfill` with the old spec file while v2 runs.
    let item = follow("c", "b", "2026-11-24");
    put_item(&client, &table, &item).await;
    let stale = control::applier(
        client.clone(),
        spec1.clone(),
        &table,
        ApplyConfig::default(),
    );
    let record = decode_scanned_item(&spec1.table, 0, 1, item.into_iter().collect());
    let outcome = stale
        .apply_batch(&[record], &BatchOptions::default())
        .await
        .unwrap();
    let Some(ddb_projector::apply::RecordStatus::Failed(message)) = outcome.statuses.first() else {
        panic!("the stale writer wrote: {:?}", outcome.statuses);
    };
    assert!(
        message.contains("the deployed worker runs another definition of `followers`"),
        "{message}"
    );
    assert!(
        definition(&client, &table, &spec1, "followers")
            .await
            .is_none(),
        "nothing of v1 leased"
    );
    let reverse = client
        .get_item()
        .table_name(&table)
        .key("PK", support::s("USER#b"))
        .key("SK", support::s("FOLLOWED_BY#c"))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(reverse.item().is_none(), "nothing of v1 written");
}

fn prune_cli(spec: &Path, table: &str, extra: &[&str]) -> Output {
    cli(&[
        &["prune", "--spec", spec.to_str().unwrap(), "--table", table][..],
        extra,
    ]
    .concat())
}

/// One resume model for `prune`: `--resume` continues the last prune of
/// the projections where it stopped (a segment it finished is not scanned
/// again, so what it holds stays), and a prune without it starts from the
/// beginning (and prunes the rest).
#[tokio::test]
async fn prune_resume_continues_the_last_run_and_a_new_prune_starts_over() {
    use aws_sdk_dynamodb::types::AttributeValue as Av;
    use ddb_projector::control::{Job, Runs};
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v3 = social_spec(dir.path(), "v3.toml", v3);
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec1, "prune-resume").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a"), ("d", "e"), ("e", "f")] {
        put_item(&client, &table, &follow(a, b, "2026-11-23")).await;
    }
    run_drain(&v1, &table);
    run_drain(&v3, &table);
    let following = |items: &[super::model::Attrs]| {
        items
            .iter()
            .filter(|i| {
                support::text(i, "PK").is_some_and(|pk| pk.starts_with("COUNTER#following#"))
            })
            .count()
    };
    let shards = following(&support::scan_all(&client, &table).await);
    assert!(shards > 1, "{shards}");
    // A prune `p1` of 2 segments stopped after segment 0 was done (and an
    // earlier attempt of it scanned in 4).
    let retired = ddb_projector::prune::Retired::new("following", spec1.clone()).unwrap();
    let scope = ddb_projector::prune::scope(&table, &[retired]);
    assert!(scope.starts_with(&format!("{table}#following#")), "{scope}");
    Runs::new(client.clone(), &table, &spec1.table)
        .choose(Job::Prune, &scope, Some("p1"), false, &mut |_| {})
        .await
        .unwrap();
    for (sk, done) in [("0/2", true), ("3/4", false)] {
        client
            .put_item()
            .table_name(&table)
            .item("PK", Av::S("_ddbp#prune".into()))
            .item("SK", Av::S(format!("{scope}#p1#{sk}")))
            .item("done", Av::Bool(done))
            .send()
            .await
            .unwrap();
    }
    // While no prune runs, a v1 writer runs again: it may have written
    // into segment 0, which the resumed run does not scan again.
    let late = control::stream_consumer(
        client.clone(),
        spec1.clone(),
        &table,
        ApplyConfig {
            lease: std::time::Duration::from_secs(1),
            ..ApplyConfig::default()
        },
    );
    late.take_leases().await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    let args = ["--projection", "following", "--segments", "2"];
    let resumed = prune_cli(&v3, &table, &[&args[..], &["--resume"]].concat());
    assert_eq!(resumed.status.code(), Some(1), "{}", stderr(&resumed));
    assert!(
        stderr(&resumed).contains("resuming prune `p1`")
            && stderr(&resumed).contains("not forgotten (a writer ran during the prune"),
        "{}",
        stderr(&resumed)
    );
    let left = following(&support::scan_all(&client, &table).await);
    assert!(left > 0 && left < shards, "{left} of {shards} left");
    let again = prune_cli(&v3, &table, &[&args[..], &["--resume"]].concat());
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("the last prune, `p1`, ran to its end: starting `prune-"),
        "{}",
        stderr(&again)
    );
    assert_eq!(following(&support::scan_all(&client, &table).await), 0);
    let progress = client
        .query()
        .table_name(&table)
        .key_condition_expression("PK = :pk")
        .expression_attribute_values(":pk", Av::S("_ddbp#prune".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(progress.count(), 0, "{:?}", progress.items());
}

#[tokio::test]
async fn prune_removes_what_retired_projections_derived_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    // v3 retires the `following` counter (it rides on `followed-by`, like
    // `followers`) and the leaderboard's index keys.
    let v3 = social_spec(dir.path(), "v3.toml", |t| {
        let t = v3(t).replace("shards = 16", "shards = 8");
        let start = t.find("# Leaderboard by tier").unwrap();
        t[..start].to_string()
    });
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec3 = Arc::new(Spec::from_file(&v3).unwrap());
    let table = support::fresh_table(&client, &spec1, "lifecycle-prune").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a")] {
        put_item(&client, &table, &follow(a, b, "2026-11-23")).await;
    }
    put_item(
        &client,
        &table,
        &super::model::achievement("a", "b1", "gold", support::n(7)),
    )
    .await;
    run_drain(&v1, &table);
    let followers_before = user_counter(&client, &table, &spec1, "followers", "b").await;
    assert_eq!(followers_before, 2);

    // Still in the spec: refused.
    let refused = prune_cli(&v1, &table, &["--projection", "following"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("is in"), "{}", stderr(&refused));
    // Retired, but a v1 worker still runs (a drained runner gave its
    // leases back: this one holds them for a second): refused.
    run_drain(&v3, &table);
    let still = control::stream_consumer(
        client.clone(),
        spec1.clone(),
        &table,
        ApplyConfig {
            lease: std::time::Duration::from_secs(1),
            ..ApplyConfig::default()
        },
    );
    still.take_leases().await.unwrap();
    let (_, rows) = status(&v3, &table);
    assert_eq!(state(&rows, "following"), "retired");
    assert_eq!(state(&rows, "achievement-leaderboard-keys"), "retired");
    let early = prune_cli(&v3, &table, &["--projection", "following"]);
    assert!(!early.status.success());
    assert!(
        stderr(&early).contains("holds a lease until"),
        "{}",
        stderr(&early)
    );
    std::thread::sleep(std::time::Duration::from_millis(3_000));

    let counted = |items: &[super::model::Attrs]| {
        let following_items = items
            .iter()
            .filter(|i| {
                support::text(i, "PK").is_some_and(|pk| pk.starts_with("COUNTER#following#"))
            })
            .count();
        let records = items
            .iter()
            .filter(|i| match i.get("_ddbp#c") {
                Some(aws_sdk_dynamodb::types::AttributeValue::M(m)) => m.contains_key("following"),
                _ => false,
            })
            .count();
        let keys = items.iter().filter(|i| i.contains_key("GSI1PK")).count();
        (following_items, records, keys)
    };
    let before = support::scan_all(&client, &table).await;
    let (shards, records, keys) = counted(&before);
    assert!(
        shards > 0 && records == 3 && keys == 1,
        "{shards} {records} {keys}"
    );

    // A dry run counts and writes nothing.
    let args = [
        "--projection",
        "following",
        "--projection",
        "achievement-leaderboard-keys",
    ];
    let dry = prune_cli(&v3, &table, &[&args[..], &["--dry-run"]].concat());
    assert!(dry.status.success(), "{}", stderr(&dry));
    let summary: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(summary["deletedItems"], shards as u64, "{summary}");
    assert_eq!(summary["removedRecords"], 3, "{summary}");
    assert_eq!(summary["strippedItems"], 1, "{summary}");
    assert_eq!(
        counted(&support::scan_all(&client, &table).await),
        (shards, records, keys)
    );

    let pruned = prune_cli(&v3, &table, &args);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    let summary: Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(
        summary["forgotten"],
        serde_json::json!(["following", "achievement-leaderboard-keys"]),
        "{summary}"
    );
    let after = support::scan_all(&client, &table).await;
    assert_eq!(counted(&after), (0, 0, 0));
    // What the current spec derives stays: the reverse edges and the
    // followers counter.
    let reverse = after
        .iter()
        .filter(|i| support::text(i, "SK").is_some_and(|sk| sk.starts_with("FOLLOWED_BY#")))
        .count();
    assert_eq!(reverse, 3);
    let followers_after = user_counter(&client, &table, &spec3, "followers", "b").await;
    assert_eq!(followers_after, followers_before);
    // Forgotten: status lists no retired projection, and a second prune
    // names what the registry knows.
    let (_, rows) = status(&v3, &table);
    assert!(rows.iter().all(|r| r.1 != "retired"), "{rows:?}");
    let again = prune_cli(&v3, &table, &["--projection", "following"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("knows no definition of `following`"),
        "{}",
        stderr(&again)
    );
    // The audit of v3 finds nothing left over.
    let audit = cli(&["audit", "--spec", v3.to_str().unwrap(), "--table", &table]);
    assert!(
        audit.status.success(),
        "{}",
        String::from_utf8_lossy(&audit.stdout)
    );

    // Added back, the counter starts in a generation its first life never
    // wrote, and counts exactly once backfilled.
    let registry = Registry::new(client.clone(), &table, &spec1.table);
    let (_, layouts) = registry.layout(&spec1).await.unwrap();
    let following = layouts.iter().find(|l| l.name == "following").unwrap();
    assert_eq!((following.generation, following.old.clone()), (1, None));
    run_drain(&v1, &table);
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    let done = backfilled(&backfill_cli(&v1, &table, &[]));
    assert!(done.contains(&"following".to_string()), "{done:?}");
    let (laid, _) = registry.layout(&spec1).await.unwrap();
    for (user, want) in [("a", 1), ("b", 1), ("c", 1)] {
        let value = user_counter(&client, &table, &laid, "following", user).await;
        assert_eq!(value, want, "{user} follows");
    }
}

/// A rebuild rolled back before its backfill: the old version `followers~0`
/// is retired, but its storage (`followers`, generation 0) is where the
/// current spec's `followers` writes again. Pruning it would delete the
/// current counter's shards and records: refused, and nothing is written.
#[tokio::test]
async fn prune_refuses_an_old_version_whose_storage_the_current_counter_writes() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec1, "lifecycle-prune-current").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a")] {
        put_item(&client, &table, &follow(a, b, "2026-11-27")).await;
    }
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    // v2 deployed: `followers` built in generation 1, v1's kept current
    // beside it as `followers~0` (storage `followers`).
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    run_drain(&v2, &table);
    // Rolled back before v2's backfill: v1's `followers` is what readers
    // read, in generation 0, and `followers~0` is retired.
    run_drain(&v1, &table);
    let registry = Registry::new(client.clone(), &table, &spec1.table);
    let (laid, _) = registry.layout(&spec1).await.unwrap();
    let id = laid.projection_id("followers").unwrap();
    assert_eq!(laid.counter(id).unwrap().storage, "followers");
    assert!(laid.projection_id("followers~0").is_none());
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    let (_, rows) = status(&v1, &table);
    assert_eq!(state(&rows, "followers~0"), "retired", "{rows:?}");

    let shards = |items: &[super::model::Attrs]| {
        items
            .iter()
            .filter(|i| {
                support::text(i, "PK").is_some_and(|pk| pk.starts_with("COUNTER#followers#"))
            })
            .count()
    };
    let before = support::scan_all(&client, &table).await;
    assert!(shards(&before) > 0);
    assert_eq!(
        user_counter(&client, &table, &laid, "followers", "b").await,
        2
    );
    for extra in [&[][..], &["--dry-run"]] {
        let refused = prune_cli(
            &v1,
            &table,
            &[&["--projection", "followers~0"][..], extra].concat(),
        );
        assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
        assert!(
            stderr(&refused).contains(
                "`followers~0` kept its shards and records under `followers`, where `followers` of the current spec keeps its own now"
            ),
            "{}",
            stderr(&refused)
        );
        assert_eq!(
            support::scan_all(&client, &table).await,
            before,
            "a refused prune wrote something"
        );
    }
    assert_eq!(
        user_counter(&client, &table, &laid, "followers", "b").await,
        2
    );
}

/// v2 of the social spec for the rebuild test: `followers` counts close
/// follows only, on 16 shards (a definition whose values differ from v1's).
fn close_followers(t: String) -> String {
    t.replace(
        "of = { userId = \"{followeeId}\" }\nshards = 8",
        "of = { userId = \"{followeeId}\" }\nwhen = { close = true }\nshards = 16",
    )
}

/// Each user's followers as a definition computes them from the follows in
/// the table (independent of `src/`): every follow, or the close ones.
async fn followers_of(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    close_only: bool,
) -> std::collections::BTreeMap<String, i64> {
    let mut out = std::collections::BTreeMap::new();
    for item in support::scan_all(client, table).await {
        let pk = support::text(&item, "PK").unwrap_or_default();
        let sk = support::text(&item, "SK").unwrap_or_default();
        let Some(followee) = sk
            .strip_prefix("FOLLOWS#")
            .filter(|_| pk.starts_with("USER#"))
        else {
            continue;
        };
        if close_only
            && item.get("close") != Some(&aws_sdk_dynamodb::types::AttributeValue::Bool(true))
        {
            continue;
        }
        *out.entry(followee.to_string()).or_insert(0) += 1;
    }
    out
}

#[tokio::test]
async fn a_changed_counter_is_rebuilt_beside_the_old_one_and_readers_never_see_a_wrong_value() {
    use super::model::{delete_item, Rng};
    use aws_sdk_dynamodb::types::AttributeValue as Av;

    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", close_followers);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    assert_ne!(
        spec1.projections[spec1.projection_id("followers").unwrap()].fingerprint,
        spec2.projections[spec2.projection_id("followers").unwrap()].fingerprint
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-rebuild").await;
    let users: Vec<String> = (0..6).map(|i| format!("u{i}")).collect();
    let mut rng = Rng::new(0x5eed_c0de);
    let write = |rng: &mut Rng| {
        let a = users[rng.below(users.len() as u64) as usize].clone();
        let b = users[rng.below(users.len() as u64) as usize].clone();
        let delete = rng.below(4) == 0;
        let close = rng.below(2) == 0;
        (a, b, delete, close)
    };
    let apply = |(a, b, delete, close): (String, String, bool, bool)| {
        let client = client.clone();
        let table = table.clone();
        async move {
            if a == b {
                return;
            }
            let mut item = follow(&a, &b, "2026-11-24");
            if delete {
                let key = [("PK", item["PK"].clone()), ("SK", item["SK"].clone())]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                delete_item(&client, &table, key).await;
            } else {
                item.insert("close".to_string(), Av::Bool(close));
                put_item(&client, &table, &item).await;
            }
        }
    };
    // What `counter get` and the documented read path give for each user.
    let read = |spec: Arc<Spec>| {
        let client = client.clone();
        let table = table.clone();
        let users = users.clone();
        async move {
            let mut out = std::collections::BTreeMap::new();
            for user in &users {
                let value = ddb_projector::counter::read_counter(
                    &client,
                    &table,
                    &spec,
                    "followers",
                    &[("userId".to_string(), user.clone())],
                )
                .await
                .unwrap();
                if value != 0 {
                    out.insert(user.clone(), value);
                }
            }
            out
        }
    };

    // v1 deployed, written to and backfilled: live.
    for _ in 0..30 {
        apply(write(&mut rng)).await;
    }
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    assert_eq!(status(&v1, &table).0, 0);
    assert_eq!(
        read(spec1.clone()).await,
        followers_of(&client, &table, false).await
    );

    // v2 deployed: its worker builds `followers` beside v1's, which it keeps
    // current; writers go on while a backfill builds v2 a page at a time.
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    run_drain(&v2, &table);
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (laid, layouts) = registry.layout(&spec2).await.unwrap();
    let followers = layouts.iter().find(|l| l.name == "followers").unwrap();
    assert_eq!(
        (
            followers.generation,
            followers
                .old
                .as_ref()
                .map(|o| (o.generation, o.not_kept.clone()))
        ),
        (1, Some((0, None)))
    );
    let laid = Arc::new(laid);
    let id = laid.projection_id("followers").unwrap();
    // The claim waits out v1's last leases, as `backfill --wait` does.
    loop {
        match registry.claim(&laid, &[id], "rebuild").await.unwrap() {
            ClaimOutcome::Claimed => break,
            ClaimOutcome::Wait { until, .. } => {
                let left = until.saturating_sub(ddb_projector::dynamo::time::now_ms()) + 100;
                tokio::time::sleep(std::time::Duration::from_millis(left)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    let filler = control::applier(client.clone(), laid.clone(), &table, ApplyConfig::default());
    let mut slices = 0;
    loop {
        for _ in 0..4 {
            apply(write(&mut rng)).await;
        }
        run_drain(&v2, &table);
        // Between every slice, readers read exactly what one definition
        // computes from the current follows: v1's until the switch.
        assert_eq!(
            read(spec2.clone()).await,
            followers_of(&client, &table, false).await,
            "readers saw a value v1 does not give, {slices} slices into v2's backfill"
        );
        let summary = backfill(
            &filler,
            &BackfillOptions {
                projections: Some(vec![id]),
                page_size: 3,
                max_pages: Some(1),
                resume: true,
                progress: false,
                run: Some("rebuild".to_string()),
                ..BackfillOptions::default()
            },
        )
        .await
        .unwrap();
        slices += 1;
        if summary.is_done() {
            assert_eq!(summary.backfilled, vec!["followers".to_string()]);
            break;
        }
        assert!(slices < 200, "the backfill never finished");
    }
    assert!(
        slices > 3,
        "the rebuild took {slices} slices: too few to show anything"
    );
    // Switched: readers read v2's version, which the worker keeps current.
    assert_eq!(
        read(spec2.clone()).await,
        followers_of(&client, &table, true).await
    );
    for _ in 0..10 {
        apply(write(&mut rng)).await;
    }
    run_drain(&v2, &table);
    assert_eq!(
        read(spec2.clone()).await,
        followers_of(&client, &table, true).await
    );
    assert_eq!(
        read(laid.clone()).await,
        followers_of(&client, &table, true).await
    );
    let want = followers_of(&client, &table, true)
        .await
        .get("u1")
        .copied()
        .unwrap_or(0);
    // `--key VAR=VALUE`, as `wait` takes keys; the older positional form
    // still works.
    for key in [&["--key", "userId=u1"][..], &["userId=u1"][..]] {
        let mut args = vec!["counter", "get", "followers"];
        args.extend_from_slice(key);
        args.extend_from_slice(&["--spec", v2.to_str().unwrap(), "--table", &table]);
        let cli_value = cli(&args);
        assert!(cli_value.status.success(), "{}", stderr(&cli_value));
        assert_eq!(
            String::from_utf8_lossy(&cli_value.stdout).trim(),
            want.to_string()
        );
    }
    let json = cli(&[
        "counter",
        "get",
        "followers",
        "--key",
        "userId=u1",
        "--format",
        "json",
        "--spec",
        v2.to_str().unwrap(),
        "--table",
        &table,
    ]);
    assert!(json.status.success(), "{}", stderr(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({"counter": "followers", "vars": {"userId": "u1"}, "value": want})
    );

    // The old version is pruned once no worker keeps it: nothing of its
    // storage is left, what v2 derives is untouched, the audit is clean.
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    let pruned = cli(&[
        "prune",
        "--spec",
        v2.to_str().unwrap(),
        "--table",
        &table,
        "--projection",
        "followers~0",
    ]);
    assert!(pruned.status.success(), "prune: {}", stderr(&pruned));
    for item in support::scan_all(&client, &table).await {
        let pk = support::text(&item, "PK").unwrap_or_default();
        assert!(!pk.starts_with("COUNTER#followers#"), "left: {item:?}");
        assert!(
            !matches!(item.get("_ddbp#c"), Some(Av::M(m)) if m.contains_key("followers")),
            "a record of the old version is left: {item:?}"
        );
    }
    assert_eq!(
        read(spec2.clone()).await,
        followers_of(&client, &table, true).await
    );
    let audit = cli(&["audit", "--spec", v2.to_str().unwrap(), "--table", &table]);
    assert!(
        audit.status.success(),
        "audit: {}{}",
        String::from_utf8_lossy(&audit.stdout),
        stderr(&audit)
    );
    assert_eq!(status(&v2, &table).0, 0, "{:?}", status(&v2, &table).1);
}

/// A rebuild abandoned by a rollback leaves counts behind that nothing
/// keeps current (the rolled-back worker deletes edges without knowing the
/// new version's records on them): the next rebuild must not start from
/// them.
#[tokio::test]
async fn a_rebuild_after_a_rollback_starts_from_nothing_the_abandoned_one_wrote() {
    use super::model::delete_item;
    use aws_sdk_dynamodb::types::AttributeValue as Av;

    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", close_followers);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-rollback").await;
    let close_follow = |a: &str, b: &str| {
        let mut item = follow(a, b, "2026-11-25");
        item.insert("close".to_string(), Av::Bool(true));
        item
    };
    let lease = std::time::Duration::from_millis(2_600);

    // v1 live.
    put_item(&client, &table, &close_follow("a", "b")).await;
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    // v2 deployed: its rebuild counts d's follow.
    std::thread::sleep(lease);
    run_drain(&v2, &table);
    put_item(&client, &table, &close_follow("d", "b")).await;
    run_drain(&v2, &table);
    // Rolled back before its backfill: v1's worker deletes d's follow.
    std::thread::sleep(lease);
    let gone = close_follow("d", "b");
    let key = [("PK", gone["PK"].clone()), ("SK", gone["SK"].clone())]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    delete_item(&client, &table, key).await;
    run_drain(&v1, &table);
    // v2 again, deployed and backfilled.
    std::thread::sleep(lease);
    run_drain(&v2, &table);
    std::thread::sleep(lease);
    let done = backfilled(&backfill_cli(&v2, &table, &[]));
    assert_eq!(done, vec!["followers".to_string()]);

    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (laid, _) = registry.layout(&spec2).await.unwrap();
    let want = followers_of(&client, &table, true).await;
    assert_eq!(want.get("b"), Some(&1));
    let value = user_counter(&client, &table, &laid, "followers", "b").await;
    assert_eq!(value, 1, "b has one close follower (a)");
    let audit = cli(&["audit", "--spec", v2.to_str().unwrap(), "--table", &table]);
    assert!(
        audit.status.success(),
        "audit: {}{}",
        String::from_utf8_lossy(&audit.stdout),
        stderr(&audit)
    );
}

/// A global counter made per user: while it is rebuilt, readers read the
/// global count, in its own terms (no variables), never a per-user shard
/// the old version never wrote.
#[tokio::test]
async fn readers_of_a_global_counter_made_per_user_read_the_global_count_until_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let global = |t: String| {
        t.replace(
            "of = { userId = \"{followeeId}\" }\nshards = 8",
            "of = {}\nshards = 8",
        )
    };
    let v1 = social_spec(dir.path(), "v1.toml", global);
    let v2 = social_spec(dir.path(), "v2.toml", |t| t);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    assert_ne!(
        spec1.projections[spec1.projection_id("followers").unwrap()].fingerprint,
        spec2.projections[spec2.projection_id("followers").unwrap()].fingerprint
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-global").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("a", "d")] {
        put_item(&client, &table, &follow(a, b, "2026-11-25")).await;
    }
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    run_drain(&v2, &table);
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (laid, layouts) = registry.layout(&spec2).await.unwrap();
    let followers = layouts.iter().find(|l| l.name == "followers").unwrap();
    assert_eq!(
        followers.old.as_ref().map(|o| o.not_kept.clone()),
        Some(None)
    );
    let read = |vars: Vec<(String, String)>| {
        let client = client.clone();
        let table = table.clone();
        let laid = laid.clone();
        async move {
            ddb_projector::counter::read_counter(&client, &table, &laid, "followers", &vars).await
        }
    };
    assert_eq!(read(Vec::new()).await.unwrap(), 3, "v1's global count");
    let keyed = read(vec![("userId".to_string(), "b".to_string())]).await;
    assert!(
        keyed
            .as_ref()
            .is_err_and(|e| e.to_string().contains("no variable `userId`")),
        "{keyed:?}"
    );
    // Rebuilt: readers switch to v2's per-user counts.
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    assert_eq!(
        backfilled(&backfill_cli(&v2, &table, &[])),
        vec!["followers".to_string()]
    );
    let (laid, _) = registry.layout(&spec2).await.unwrap();
    let value = user_counter(&client, &table, &laid, "followers", "b").await;
    assert_eq!(value, 2);
}

/// The tests that make writers refuse a stale layout run one at a time:
/// a refusal wakes every runner of the process to read its layout again
/// (`control::layout_refusals` counts them process-wide), so one test's
/// refusal could relay another's runner before it is refused itself.
static REFUSING_LAYOUTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A writer that held no lease for a while (a long replay, a redrive) may
/// have missed a rebuild's completion: it is checked again before it
/// writes, and refused rather than write its definition into the
/// generation readers now read as another's.
#[tokio::test]
async fn a_writer_whose_lease_ran_out_is_checked_again_before_it_writes() {
    let _one_at_a_time = REFUSING_LAYOUTS.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let v3 = social_spec(dir.path(), "v3.toml", close_followers);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-lapse").await;
    let pause = std::time::Duration::from_millis(2_600);
    put_item(&client, &table, &follow("a", "b", "2026-11-25")).await;
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    std::thread::sleep(pause);
    run_drain(&v2, &table);

    // A writer of v2, laid out: followers in generation 1.
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (laid, _) = registry.layout(&spec2).await.unwrap();
    let writer = control::applier(
        client.clone(),
        Arc::new(laid),
        &table,
        ApplyConfig {
            lease: std::time::Duration::from_millis(300),
            ..ApplyConfig::default()
        },
    );
    let item = follow("c", "b", "2026-11-25");
    put_item(&client, &table, &item).await;
    let record = decode_scanned_item(&spec1.table, 0, 1, item.into_iter().collect());
    let outcome = writer
        .apply_batch(std::slice::from_ref(&record), &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.first_failure(), None);

    // While it holds no lease, v3 is deployed and rebuilt: generation 1
    // is now what readers read, as v3's.
    std::thread::sleep(pause);
    run_drain(&v3, &table);
    std::thread::sleep(pause);
    assert_eq!(
        backfilled(&backfill_cli(&v3, &table, &[])),
        vec!["followers".to_string()]
    );
    let outcome = writer
        .apply_batch(&[record], &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.first_failure(), Some(0), "{outcome:?}");
}

/// A close follow of `b` by `a`.
fn close_follow(a: &str, b: &str) -> super::model::Attrs {
    let mut item = follow(a, b, "2026-11-28");
    item.insert(
        "close".to_string(),
        aws_sdk_dynamodb::types::AttributeValue::Bool(true),
    );
    item
}

/// The sum of `user`'s shards of counter storage `storage`, read from the
/// shard items themselves (not through the registry or `src/`).
async fn stored_count(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    storage: &str,
    user: &str,
) -> i64 {
    let prefix = format!("COUNTER#{storage}#{user}#");
    support::scan_all(client, table)
        .await
        .iter()
        .filter(|item| support::text(item, "PK").is_some_and(|pk| pk.starts_with(&prefix)))
        .map(|item| {
            support::text(item, "count")
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Dead letters in the table.
async fn letters(client: &aws_sdk_dynamodb::Client, table: &str) -> usize {
    support::scan_all(client, table)
        .await
        .iter()
        .filter(|item| support::text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#dlq")))
        .count()
}

/// While a worker of v2 holds its layout (`followers` built in generation
/// 1 beside v1's generation 0), v3 is deployed elsewhere and rebuilt:
/// generation 1 is now what readers read, as v3's, and v2 is laid out in
/// generation 2. Waits for the writers of other definitions to stop, as a
/// deploy does.
fn v3_rebuilt_elsewhere(v3: &Path, table: &str) {
    let pause = std::time::Duration::from_millis(2_600);
    std::thread::sleep(pause);
    run_drain(v3, table);
    std::thread::sleep(pause);
    assert_eq!(
        backfilled(&backfill_cli(v3, table, &[])),
        vec!["followers".to_string()]
    );
}

/// The runner holds its layout between re-reads (one per lease period,
/// two minutes here). One laid out before a counter's rebuild completed
/// elsewhere is refused at its first counter write (`check_layout`), lays
/// the spec out again at once, and applies the record where the registry
/// now puts v2: nothing lost, nothing counted twice.
#[tokio::test]
async fn a_runner_refused_for_a_stale_layout_lays_the_spec_out_again_at_once() {
    let _one_at_a_time = REFUSING_LAYOUTS.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let v3 = social_spec(dir.path(), "v3.toml", close_followers);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-runner-relaid").await;
    put_item(&client, &table, &close_follow("a", "b")).await;
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    std::thread::sleep(std::time::Duration::from_millis(2_600));
    put_item(&client, &table, &close_follow("d", "b")).await;
    run_drain(&v2, &table);
    // The runner's layout, read when v2 was deployed.
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (stale, _) = registry.layout(&spec2).await.unwrap();
    let id = stale.projection_id("followers").unwrap();
    assert_eq!(stale.counter(id).unwrap().storage, "followers~1");
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 1);

    v3_rebuilt_elsewhere(&v3, &table);
    let read = registry.read_version("followers").await.unwrap().unwrap();
    assert_eq!((read.generation, read.storage.as_str()), (1, "followers~1"));
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 2);

    put_item(&client, &table, &close_follow("e", "b")).await;
    assert!(ddb_projector::apply::lease_length() >= std::time::Duration::from_secs(60));
    let refusals = control::layout_refusals();
    // The runner's futures nest deep: on a thread with a large stack, with
    // clients of its own runtime (of this test's DynamoDB Local).
    let endpoint = support::endpoint().to_string();
    let file_spec = spec2.clone();
    let runner_table = table.clone();
    let ran = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let config = support::sdk_config_for(&endpoint).await;
                let c = control::Connection {
                    spec: Arc::new(stale),
                    file_spec,
                    table: runner_table,
                    dynamodb: aws_sdk_dynamodb::Client::new(&config),
                    config,
                    consumer: None,
                    registered: None,
                };
                let deployment = ddb_projector::global::Deployment::default();
                let run = ddb_projector::global::run_stream(
                    &c,
                    &deployment,
                    ddb_projector::source::RunOptions {
                        poll_interval: std::time::Duration::from_millis(50),
                        ..ddb_projector::source::RunOptions::drain()
                    },
                    "run",
                );
                tokio::time::timeout(std::time::Duration::from_secs(30), Box::pin(run))
                    .await
                    .map(|ran| {
                        ran.map(|ran| ran.summary)
                            .map_err(|failed| format!("{:#}", failed.error))
                    })
            })
        })
        .expect("a thread")
        .join()
        .expect("the runner's thread")
        .expect("the runner did not lay its spec out again within 30 s")
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        control::layout_refusals() > refusals,
        "the runner was never refused: {ran:?}"
    );
    // v2's generation 2 counts what v2 applied since (e); readers read v3's
    // generation 1, kept current beside it: a, d and e.
    assert_eq!(stored_count(&client, &table, "followers~2", "b").await, 1);
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 3);
    assert_eq!(
        user_counter(&client, &table, &spec2, "followers", "b").await,
        followers_of(&client, &table, true).await["b"]
    );
    assert_eq!(letters(&client, &table).await, 0);
}

/// The Lambda caches its layout for a lease period. A warm one whose
/// cached layout went stale (a rebuild completed elsewhere while its
/// lease had run out) is refused at its first counter write: the batch
/// fails, the cache is dropped, and the batch delivered again is applied
/// with the spec laid out anew, where the registry now puts v2.
#[tokio::test]
async fn a_lambda_refused_for_a_stale_layout_lays_the_spec_out_again_for_the_redelivery() {
    let _one_at_a_time = REFUSING_LAYOUTS.lock().await;
    use ddb_projector::lambda::event::{Payload, StreamsEvent};
    use ddb_projector::lambda::{Handler, Regions, Response};
    use ddb_projector::record::ChangeKind;

    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let v3 = social_spec(dir.path(), "v3.toml", close_followers);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-lambda-relaid").await;
    put_item(&client, &table, &close_follow("a", "b")).await;
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    std::thread::sleep(std::time::Duration::from_millis(2_600));

    // v2's Lambda; its leases last as long as an invocation (3 s).
    let handler = Handler {
        specs: spec2.clone().into(),
        client: client.clone(),
        table: Some(table.clone()),
        margin: std::time::Duration::from_millis(1_000),
        config: ApplyConfig {
            lease: std::time::Duration::from_millis(500),
            ..ApplyConfig::default()
        },
        metrics: None,
        process_started: std::time::SystemTime::now(),
        registered: None,
        regions: Regions::new(
            "us-east-1".to_string(),
            None,
            ddb_projector::global::Writers::Anywhere,
        ),
    };
    let invoke = |seq: u64, edge: super::model::Attrs| {
        let handler = &handler;
        async move {
            let payload = Payload::Stream(StreamsEvent::from_records(
                vec![super::model::change(
                    seq,
                    ChangeKind::Insert,
                    None,
                    Some(&edge),
                )],
                None,
            ));
            let mut context = lambda_runtime::Context::default();
            context.request_id = format!("relaid-{seq}");
            context.deadline = ddb_projector::dynamo::time::now_ms() + 60_000;
            let answer =
                Box::pin(handler.handle(lambda_runtime::LambdaEvent::new(payload, context)))
                    .await
                    .unwrap_or_else(|error| panic!("invocation failed: {error:?}"));
            let Response::Stream(answer) = answer else {
                panic!("a stream answer, not {answer:?}");
            };
            answer
                .batch_item_failures
                .iter()
                .filter_map(|f| f.item_identifier.clone())
                .collect::<Vec<String>>()
        }
    };
    // A first batch lays v2 out (`followers` in generation 1) and caches it.
    let d = close_follow("d", "b");
    put_item(&client, &table, &d).await;
    assert_eq!(invoke(1, d).await, Vec::<String>::new());
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 1);

    v3_rebuilt_elsewhere(&v3, &table);
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let read = registry.read_version("followers").await.unwrap().unwrap();
    assert_eq!((read.generation, read.storage.as_str()), (1, "followers~1"));
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 2);

    // The warm Lambda's next batch: refused, nothing written.
    let e = close_follow("e", "b");
    put_item(&client, &table, &e).await;
    let refusals = control::layout_refusals();
    assert_eq!(invoke(2, e.clone()).await, vec![format!("{:021}", 2)]);
    assert!(control::layout_refusals() > refusals);
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 2);
    assert_eq!(stored_count(&client, &table, "followers~2", "b").await, 0);
    // Delivered again: laid out anew, applied once.
    assert_eq!(invoke(2, e).await, Vec::<String>::new());
    assert_eq!(stored_count(&client, &table, "followers~2", "b").await, 1);
    assert_eq!(stored_count(&client, &table, "followers~1", "b").await, 3);
    assert_eq!(
        user_counter(&client, &table, &spec2, "followers", "b").await,
        followers_of(&client, &table, true).await["b"]
    );
    assert_eq!(letters(&client, &table).await, 0);
}

/// Runs `lease` (blocking) before the first `TransactWriteItems` whose
/// request names `needle` is sent: between the snapshot a completion reads
/// and the transaction it writes.
#[derive(Clone)]
struct BeforeTransaction {
    needle: &'static str,
    lease: Arc<dyn Fn() + Send + Sync>,
    fired: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for BeforeTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeTransaction")
            .field("needle", &self.needle)
            .finish()
    }
}

impl Intercept for BeforeTransaction {
    fn name(&self) -> &'static str {
        "BeforeTransaction"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let body = String::from_utf8_lossy(request.body().bytes().unwrap_or_default());
        if request.headers().get("x-amz-target") == Some("DynamoDB_20120810.TransactWriteItems")
            && body.contains(self.needle)
            && self.fired.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0
        {
            (self.lease)();
        }
        Ok(())
    }
}

/// A writer of another definition takes its lease after the snapshot that
/// vouches for a completion and before the completion's transaction: the
/// leases' version moved, so the transaction is refused, and the
/// completion, looking again, sees the lease and names no new generation.
#[tokio::test]
async fn a_lease_taken_after_the_completions_snapshot_keeps_the_old_generation_read() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "lifecycle-fence").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a")] {
        put_item(&client, &table, &follow(a, b, "2026-11-27")).await;
    }
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let v1_read = registry.read_version("followers").await.unwrap().unwrap();
    assert_eq!(v1_read.generation, 0);

    // v2 deployed; its rebuild of `followers` (generation 1) claimed once
    // v1's leases ended.
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    run_drain(&v2, &table);
    let (laid, _) = registry.layout(&spec2).await.unwrap();
    let laid = Arc::new(laid);
    let id = laid.projection_id("followers").unwrap();
    assert_eq!(laid.counter(id).unwrap().storage, "followers~1");
    loop {
        match registry.claim(&laid, &[id], "rebuild").await.unwrap() {
            ClaimOutcome::Claimed => break,
            ClaimOutcome::Wait { until, .. } => {
                let left = until.saturating_sub(ddb_projector::dynamo::time::now_ms()) + 100;
                tokio::time::sleep(std::time::Duration::from_millis(left)).await;
            }
            other => panic!("{other:?}"),
        }
    }

    // The backfill's completion reads its snapshot; before its transaction
    // goes out, v1's worker starts again (a rollback) and takes its lease.
    let rollback = {
        let v1 = v1.clone();
        let table = table.clone();
        move || run_drain(&v1, &table)
    };
    let interceptor = BeforeTransaction {
        needle: "doneRun",
        lease: Arc::new(rollback),
        fired: Arc::default(),
    };
    let config = support::sdk_config().await;
    let raced = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(interceptor.clone())
            .build(),
    );
    let filler = control::applier(raced, laid.clone(), &table, ApplyConfig::default());
    let summary = backfill(
        &filler,
        &BackfillOptions {
            projections: Some(vec![id]),
            progress: false,
            run: Some("rebuild".to_string()),
            ..BackfillOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(summary.is_done(), "{summary:?}");
    // At least one completion transaction, sent after the lease (an SDK
    // retry of it, on a DynamoDB Local 500, is seen again).
    assert!(
        interceptor.fired.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "no completion transaction was sent"
    );
    assert!(summary.backfilled.is_empty(), "{summary:?}");
    assert!(
        matches!(
            summary.not_backfilled.as_slice(),
            [(name, why)] if name == "followers" && why.contains("a writer of another definition")
        ),
        "{summary:?}"
    );
    // Readers still read v1's generation, and v2 is not live.
    assert_eq!(
        registry.read_version("followers").await.unwrap(),
        Some(v1_read)
    );
    let (_, rows) = status(&v2, &table);
    assert_ne!(state(&rows, "followers"), "live", "{rows:?}");
}

/// A changed counter whose old version cannot be kept current (a worker
/// without it ran after readers' version was built): readers read that
/// version's last values until the switch, and the worker, which no
/// longer counts it, leaves its records where they are instead of
/// draining its shards as it rewrites the edges they sit on.
#[tokio::test]
async fn an_old_version_that_cannot_be_kept_is_read_as_it_was_until_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let without = social_spec(dir.path(), "without.toml", |t| {
        let start = t.find("# Followers of b.").unwrap();
        let end = start + t[start..].find("shards = 8").unwrap() + "shards = 8".len();
        format!("{}{}", &t[..start], &t[end..])
    });
    let v2 = social_spec(dir.path(), "v2.toml", v2);
    let spec2 = Arc::new(Spec::from_file(&v2).unwrap());
    let client = support::client().await;
    let spec1 = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec1, "lifecycle-frozen").await;
    let pause = std::time::Duration::from_millis(2_600);
    for a in ["a", "c", "d"] {
        put_item(&client, &table, &follow(a, "b", "2026-11-25")).await;
    }
    run_drain(&v1, &table);
    backfilled(&backfill_cli(&v1, &table, &[]));
    std::thread::sleep(pause);
    run_drain(&without, &table);
    std::thread::sleep(pause);
    run_drain(&v2, &table);
    let registry = Registry::new(client.clone(), &table, &spec2.table);
    let (laid, layouts) = registry.layout(&spec2).await.unwrap();
    let followers = layouts.iter().find(|l| l.name == "followers").unwrap();
    assert_eq!(followers.generation, 1);
    assert!(
        followers
            .old
            .as_ref()
            .is_some_and(|o| o.not_kept.as_deref().is_some_and(|w| w.contains("without"))),
        "{followers:?}"
    );
    // The follows change (their edges are rewritten with the new time).
    for a in ["a", "c", "d"] {
        put_item(&client, &table, &follow(a, "b", "2026-11-26")).await;
    }
    run_drain(&v2, &table);
    let value = user_counter(&client, &table, &laid, "followers", "b").await;
    assert_eq!(value, 3, "v1's count, as it was");
    std::thread::sleep(pause);
    assert_eq!(
        backfilled(&backfill_cli(&v2, &table, &[])),
        vec!["followers".to_string()]
    );
    let value = user_counter(&client, &table, &laid, "followers", "b").await;
    assert_eq!(value, 3, "v2's count");
}

/// A CLI process with the default lease length (two minutes).
fn cli_full_lease(args: &[&str]) -> Command {
    let mut command = Command::new(support::binary());
    command
        .args(args)
        .envs(support::env())
        .env("RUST_LOG", "warn")
        .env_remove("PROJECTOR_LEASE_SECONDS")
        .stdin(Stdio::null());
    command
}

/// The ends of the writers' leases of the projections (`w#...`), in ms.
async fn consumer_leases(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<u64> {
    let item = support::get(client, table, "_ddbp#lifecycle", "leases")
        .await
        .expect("the leases item");
    item.iter()
        .filter(|(name, _)| name.starts_with("w#"))
        .filter_map(|(_, value)| match value {
            aws_sdk_dynamodb::types::AttributeValue::N(n) => n.parse().ok(),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_that_stops_cleanly_gives_its_leases_back_unless_another_still_writes() {
    let started = std::time::Instant::now();
    let client = support::client().await;
    let dir = tempfile::tempdir().unwrap();
    let v1 = social_spec(dir.path(), "v1.toml", |t| t);
    let v2 = social_spec(dir.path(), "v2.toml", |t| {
        t.replace("copy = { followedAt = \"{followedAt}\" }\n", "")
    });
    let spec = Arc::new(Spec::from_file(&v1).unwrap());
    let table = support::fresh_table(&client, &spec, "give-back").await;
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "d")] {
        put_item(&client, &table, &follow(a, b, "2026-11-28")).await;
    }
    let (v1_arg, v2_arg) = (v1.to_str().unwrap(), v2.to_str().unwrap());

    // Another process still writing v1 (the runner of another consumer
    // with the same spec, which shares the projections' leases): a
    // drained runner's leases stay, and the other's with them.
    let mut other = cli_full_lease(&[
        "run",
        "--spec",
        v1_arg,
        "--table",
        &table,
        "--consumer",
        "other",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let since = std::time::Instant::now();
    while consumer_leases_or_none(&client, &table).await.is_empty() {
        assert!(since.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let drained = cli_full_lease(&["run", "--drain", "--spec", v1_arg, "--table", &table])
        .output()
        .unwrap();
    assert!(drained.status.success(), "{}", stderr(&drained));
    let now = ddb_projector::dynamo::time::now_ms();
    let leases = consumer_leases(&client, &table).await;
    assert!(
        leases.iter().all(|until| *until > now + 60_000),
        "another process still runs v1: its lease stays ({leases:?}, now {now})"
    );
    let _ = other.kill();
    let _ = other.wait();

    // The other process was killed, not stopped: its lease runs to its end.
    // A runner that stops cleanly alone gives its own back, and a backfill
    // of a changed definition then waits for nobody.
    wait_out_killed(&client, &table).await;
    let drained = cli_full_lease(&["run", "--drain", "--spec", v1_arg, "--table", &table])
        .output()
        .unwrap();
    assert!(drained.status.success(), "{}", stderr(&drained));
    let now = ddb_projector::dynamo::time::now_ms();
    let leases = consumer_leases(&client, &table).await;
    assert!(
        leases.iter().all(|until| *until <= now),
        "the drained runner's lease ends when it stopped ({leases:?}, now {now})"
    );
    let backfill_started = std::time::Instant::now();
    let backfill = cli_full_lease(&[
        "backfill",
        "--spec",
        v2_arg,
        "--table",
        &table,
        "--projection",
        "followed-by",
        "--wait",
        "30s",
    ])
    .output()
    .unwrap();
    assert!(backfill.status.success(), "{}", stderr(&backfill));
    // What it may wait is the clock skew allowed past the leases' ends
    // (2 s), not the two minutes of a lease.
    let waited = backfill_started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(20),
        "the backfill waited {waited:?} for a runner that stopped: {}",
        stderr(&backfill)
    );
    eprintln!(
        "timing: give back took {:.1} s (backfill {:.1} s)",
        started.elapsed().as_secs_f64(),
        waited.as_secs_f64()
    );
}

async fn consumer_leases_or_none(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<u64> {
    match support::get(client, table, "_ddbp#lifecycle", "leases").await {
        Some(_) => consumer_leases(client, table).await,
        None => Vec::new(),
    }
}

/// Lets the killed runner's lease run out: its holder item is moved into
/// the past as two minutes would, so the test need not wait them.
async fn wait_out_killed(client: &aws_sdk_dynamodb::Client, table: &str) {
    let items = support::scan_all(client, table).await;
    let past = ddb_projector::dynamo::time::now_ms() - 600_000;
    for item in items {
        let holder = support::text(&item, "PK").as_deref() == Some("_ddbp#lifecycle")
            && support::text(&item, "SK").is_some_and(|sk| sk.starts_with("h#"));
        if holder {
            let mut item = item.clone();
            item.insert(
                "until".to_string(),
                aws_sdk_dynamodb::types::AttributeValue::N(past.to_string()),
            );
            client
                .put_item()
                .table_name(table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
    }
}
