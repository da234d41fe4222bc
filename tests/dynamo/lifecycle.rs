//! The projection lifecycle on DynamoDB Local, as a team lives it: deploy
//! (the worker takes its leases), `status`, `backfill` of what needs it, a
//! changed definition, a retired projection added back, a stale writer of
//! an old definition, and two backfills racing for one projection.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use ddb_projector::apply::{Applier, ApplyConfig, BatchOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::decode::decode_scanned_item;
use ddb_projector::lifecycle::{ClaimOutcome, Registry};
use ddb_projector::spec::Spec;
use serde_json::Value;

use super::model::{follow, put_item};
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
fn social_spec(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("projections/social-service.toml")).unwrap();
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
    // Deployed, then backfilled: only `followers` is backfilled.
    std::thread::sleep(std::time::Duration::from_millis(1_600));
    run_drain(&v2, &table);
    assert_eq!(state(&status(&v2, &table).1, "followers"), "changed");
    let done = backfilled(&backfill_cli(&v2, &table, &[]));
    assert_eq!(done, vec!["followers".to_string()]);
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

    // A process still on v1 (a stale Lambda environment, a redrive with an
    // old spec file) writes a follow.
    let item = follow("c", "b", "2026-11-24");
    put_item(&client, &table, &item).await;
    let stale = Applier::new(
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
            assert!(until > ddb_projector::lifecycle::now_ms());
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
    let applier = Applier::new(client.clone(), spec.clone(), &table, ApplyConfig::default());
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
