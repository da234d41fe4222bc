//! End-to-end tests of the stream runner (`run`, `replay`) against DynamoDB
//! Local: writers write source items only, the runner reads the table's
//! stream, and the table is then checked against what the spec computes
//! from the final source items.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::ApplyConfig;
use ddb_projector::control;
use ddb_projector::source::{RunErrorKind, RunOptions, StreamRunner, Summary};
use ddb_projector::spec::Spec;
use futures::stream::{self, StreamExt};

use super::model::{
    achievement, assert_no_problems, attrs, campaign, check_derived, email, follow, performance,
    profile, put_item, seed_from_env, user_counter, user_items, Attrs, Rng, COMBINED_SPEC,
};
use super::support::{self, delete, get, s, text};

// ---------------------------------------------------------------- helpers ---

fn shipped(name: &str) -> PathBuf {
    support::repo().join("projections").join(name)
}

/// The binary with the environment of DynamoDB Local.
pub(super) fn cli(args: &[&str]) -> Command {
    let mut command = Command::new(support::binary());
    command
        .args(args)
        .envs(support::env())
        .env(
            "RUST_LOG",
            std::env::var("RUNNER_TEST_LOG").unwrap_or_else(|_| "warn".to_string()),
        )
        .stdin(Stdio::null());
    command
}

pub(super) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `run --drain`, which must succeed; returns its stderr (the summary).
fn drain(spec: &Path, table: &str) -> String {
    let output = cli(&["run", "--drain", "--spec", path(spec), "--table", table])
        .output()
        .expect("run the binary");
    assert!(
        output.status.success(),
        "run --drain failed: {}",
        stderr(&output)
    );
    stderr(&output)
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A number from the printed summary (`  write units      12.0 (...)`).
pub(super) fn summary_value(stderr: &str, name: &str) -> f64 {
    stderr
        .lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix(name)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no `{name}` in the summary:\n{stderr}"))
}

/// A runner over the library API.
pub(super) async fn runner(
    client: &aws_sdk_dynamodb::Client,
    spec: Arc<Spec>,
    table: &str,
) -> StreamRunner {
    let (arn, _) = ddb_projector::dynamo::client::require_stream(client, table)
        .await
        .expect("the table has a stream");
    let streams = aws_sdk_dynamodbstreams::Client::new(&support::sdk_config().await);
    StreamRunner::new(
        control::applier(client.clone(), spec, table, ApplyConfig::default()),
        streams,
        &arn,
    )
}

async fn drain_library(runner: &StreamRunner) -> Summary {
    runner
        .run(RunOptions::drain(), std::future::pending())
        .await
        .unwrap_or_else(|error| panic!("drain failed: {error}"))
}

fn timed(name: &str, started: Instant) {
    eprintln!(
        "timing: {name} took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn seed() -> u64 {
    seed_from_env("RUNNER_TEST_SEED", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    })
}

// ------------------------------------------------------------ the checker ---

/// The combined spec, compiled and written to a file for the binary.
fn combined_spec() -> (Arc<Spec>, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("runner-test.toml");
    std::fs::write(&file, COMBINED_SPEC).expect("write spec");
    let spec = Arc::new(Spec::from_file(&file).expect("the combined spec compiles"));
    (spec, dir, file)
}

// ------------------------------------------------------------------ tests ---

#[tokio::test]
async fn user_service_end_to_end_through_run_drain() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "run-user").await;
    for user in ["u1", "u2", "u3"] {
        put_item(&client, &table, &profile(user)).await;
    }
    // u1: two addresses, then the primary switches as two plain writes.
    put_item(
        &client,
        &table,
        &email("u1", "e1", "  Alice@Example.COM ", true),
    )
    .await;
    put_item(
        &client,
        &table,
        &email("u1", "e2", "alice.work@example.com", false),
    )
    .await;
    put_item(
        &client,
        &table,
        &email("u1", "e1", "  Alice@Example.COM ", false),
    )
    .await;
    put_item(
        &client,
        &table,
        &email("u1", "e2", "alice.work@example.com", true),
    )
    .await;
    // u2: an address, never primary.
    put_item(
        &client,
        &table,
        &email("u2", "e1", "Bob@Example.com", false),
    )
    .await;
    // u3: a primary address that is then deleted.
    put_item(
        &client,
        &table,
        &email("u3", "e1", "carol@example.com", true),
    )
    .await;
    delete(&client, &table, "USER#u3", "EMAIL#e1").await;

    let summary = drain(&shipped("user-service.toml"), &table);
    eprintln!("{summary}");

    let e1 = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&e1, "GSI1PK").as_deref(),
        Some("EMAIL#alice@example.com")
    );
    assert_eq!(text(&e1, "GSI1SK").as_deref(), Some("USER#u1"));
    let e2 = get(&client, &table, "USER#u1", "EMAIL#e2").await.unwrap();
    assert_eq!(
        text(&e2, "GSI1PK").as_deref(),
        Some("EMAIL#alice.work@example.com")
    );
    let bob = get(&client, &table, "USER#u2", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&bob, "GSI1PK").as_deref(),
        Some("EMAIL#bob@example.com")
    );
    let u1 = get(&client, &table, "USER#u1", "PROFILE").await.unwrap();
    assert_eq!(
        text(&u1, "email").as_deref(),
        Some("alice.work@example.com")
    );
    for user in ["u1", "u2", "u3"] {
        let profile = get(&client, &table, &format!("USER#{user}"), "PROFILE")
            .await
            .unwrap();
        assert!(
            !profile.contains_key("GSI1PK") && !profile.contains_key("GSI1SK"),
            "{profile:?}"
        );
        if user != "u1" {
            assert!(!profile.contains_key("email"), "{user}: {profile:?}");
        }
    }
    // A lookup by address finds the email item once.
    let found = client
        .query()
        .table_name(&table)
        .index_name("GSI1")
        .key_condition_expression("GSI1PK = :pk")
        .expression_attribute_values(":pk", s("EMAIL#alice.work@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(found.items().len(), 1);
    assert_eq!(text(&found.items()[0], "SK").as_deref(), Some("EMAIL#e2"));
    timed("user_service_end_to_end_through_run_drain", started);
}

#[tokio::test]
async fn social_service_end_to_end_through_run_drain() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "run-social").await;
    // A hot user with hundreds of followers, written concurrently.
    let n_hot = 300;
    stream::iter(0..n_hot)
        .map(|i| {
            let (client, table) = (client.clone(), table.clone());
            async move {
                let at = format!("2024-05-01T00:{:02}:{:02}Z", i / 60, i % 60);
                put_item(&client, &table, &follow(&format!("f{i}"), "hot", &at)).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    put_item(&client, &table, &follow("a", "b", "2024-05-02T10:00:00Z")).await;
    put_item(&client, &table, &follow("a", "c", "2024-05-02T10:01:00Z")).await;
    put_item(&client, &table, &follow("b", "a", "2024-05-02T10:02:00Z")).await;
    // Unfollows: a stops following c; ten of the hot user's followers leave.
    delete(&client, &table, "USER#a", "FOLLOWS#c").await;
    for i in 0..10 {
        delete(&client, &table, &format!("USER#f{i}"), "FOLLOWS#hot").await;
    }
    // Achievements for a leaderboard.
    for (user, badge, tier, score) in [
        ("a", "b1", "gold", 850),
        ("b", "b1", "gold", 990),
        ("c", "b1", "gold", 5),
        ("c", "b2", "silver", 700),
    ] {
        put_item(
            &client,
            &table,
            &achievement(user, badge, tier, support::n(score)),
        )
        .await;
    }

    let summary = drain(&shipped("social-service.toml"), &table);
    eprintln!("{summary}");

    let edge = get(&client, &table, "USER#b", "FOLLOWED_BY#a")
        .await
        .unwrap();
    assert_eq!(
        text(&edge, "followedAt").as_deref(),
        Some("2024-05-02T10:00:00Z")
    );
    assert!(
        get(&client, &table, "USER#c", "FOLLOWED_BY#a")
            .await
            .is_none(),
        "unfollow removes the edge"
    );
    assert!(get(&client, &table, "USER#hot", "FOLLOWED_BY#f0")
        .await
        .is_none());
    assert!(get(&client, &table, "USER#hot", "FOLLOWED_BY#f10")
        .await
        .is_some());
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "hot").await,
        n_hot - 10
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "b").await,
        1
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "c").await,
        0
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "a").await,
        1
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "f42").await,
        1
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "following", "f3").await,
        0
    );

    let a = get(&client, &table, "USER#a", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert_eq!(text(&a, "GSI1PK").as_deref(), Some("TIER#gold"));
    assert_eq!(text(&a, "GSI1SK").as_deref(), Some("SCORE#0850"));
    let board = client
        .query()
        .table_name(&table)
        .index_name("GSI1")
        .key_condition_expression("GSI1PK = :pk")
        .expression_attribute_values(":pk", s("TIER#gold"))
        .scan_index_forward(false)
        .send()
        .await
        .unwrap();
    let ranking: Vec<(String, String)> = board
        .items()
        .iter()
        .map(|item| (text(item, "PK").unwrap(), text(item, "GSI1SK").unwrap()))
        .collect();
    assert_eq!(
        ranking,
        [
            ("USER#b".to_string(), "SCORE#0990".to_string()),
            ("USER#a".to_string(), "SCORE#0850".to_string()),
            ("USER#c".to_string(), "SCORE#0005".to_string()),
        ]
    );
    timed("social_service_end_to_end_through_run_drain", started);
}

#[tokio::test]
async fn ads_platform_campaigns_get_gsi1_keys_through_run_drain() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("ads-platform.toml");
    let table = support::fresh_table(&client, &spec, "run-ads").await;
    put_item(&client, &table, &campaign("c1", "p1", "ENABLED")).await;
    put_item(&client, &table, &campaign("c2", "p1", "ENABLED")).await;
    put_item(&client, &table, &campaign("c3", "p2", "ENABLED")).await;
    put_item(&client, &table, &campaign("c2", "p1", "PAUSED")).await;
    // An ad group is not a campaign: it gets no keys.
    put_item(
        &client,
        &table,
        &attrs(&[
            ("PK", s("CAMPAIGN#c1")),
            ("SK", s("ADGROUP#g1")),
            ("campaignId", s("c1")),
            ("adGroupId", s("g1")),
            ("status", s("ENABLED")),
        ]),
    )
    .await;

    let summary = drain(&shipped("ads-platform.toml"), &table);
    eprintln!("{summary}");

    let c2 = get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .unwrap();
    assert_eq!(text(&c2, "GSI1PK").as_deref(), Some("PROFILE#p1"));
    assert_eq!(
        text(&c2, "GSI1SK").as_deref(),
        Some("STATUS#PAUSED#CAMPAIGN#c2")
    );
    let group = get(&client, &table, "CAMPAIGN#c1", "ADGROUP#g1")
        .await
        .unwrap();
    assert!(!group.contains_key("GSI1PK"));
    let enabled = client
        .query()
        .table_name(&table)
        .index_name("GSI1")
        .key_condition_expression("GSI1PK = :pk AND begins_with(GSI1SK, :status)")
        .expression_attribute_values(":pk", s("PROFILE#p1"))
        .expression_attribute_values(":status", s("STATUS#ENABLED#"))
        .send()
        .await
        .unwrap();
    let ids: Vec<String> = enabled
        .items()
        .iter()
        .map(|item| text(item, "campaignId").unwrap())
        .collect();
    assert_eq!(ids, ["c1"]);
    timed(
        "ads_platform_campaigns_get_gsi1_keys_through_run_drain",
        started,
    );
}

#[tokio::test]
async fn a_full_replay_after_draining_changes_nothing() {
    let started = Instant::now();
    let client = support::client().await;
    let (spec, _dir, spec_file) = combined_spec();
    let table = support::fresh_table(&client, &spec, "run-replay").await;
    let mut rng = Rng::new(seed());
    for user in 0..20 {
        let user = format!("u{user}");
        put_item(&client, &table, &profile(&user)).await;
        put_item(
            &client,
            &table,
            &email(&user, "e1", &format!(" {user}@Example.com"), true),
        )
        .await;
        put_item(
            &client,
            &table,
            &email(&user, "e2", &format!("{user}.alt@example.com"), false),
        )
        .await;
    }
    // Churn: follows and unfollows, primary switches, achievements.
    for i in 0..300 {
        let a = format!("u{}", rng.below(20));
        let b = if rng.below(3) == 0 {
            "hot".to_string()
        } else {
            format!("u{}", rng.below(20))
        };
        match rng.below(6) {
            0..=2 => put_item(&client, &table, &follow(&a, &b, &format!("t{i}"))).await,
            3 => {
                delete(
                    &client,
                    &table,
                    &format!("USER#{a}"),
                    &format!("FOLLOWS#{b}"),
                )
                .await
            }
            4 => {
                put_item(
                    &client,
                    &table,
                    &email(&a, "e1", &format!("{a}@example.com"), false),
                )
                .await;
                put_item(
                    &client,
                    &table,
                    &email(&a, "e2", &format!("{a}.{i}@example.com"), true),
                )
                .await;
            }
            _ => {
                let score = support::n(rng.below(1000) as i64);
                put_item(
                    &client,
                    &table,
                    &achievement(&a, "b1", ["gold", "silver"][i % 2], score),
                )
                .await;
            }
        }
    }
    drain(&spec_file, &table);
    assert_no_problems(
        &check_derived(&client, &table, &spec, &[]).await,
        "the table",
    );
    let before = user_items(&client, &table).await;
    let hot_before = user_counter(&client, &table, &spec, "followers", "hot").await;

    let replayed = Instant::now();
    let output = cli(&["replay", "--spec", path(&spec_file), "--table", &table])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    eprintln!("{}", stderr(&output));
    eprintln!(
        "timing: the replay took {:.1} s",
        replayed.elapsed().as_secs_f64()
    );
    assert!(summary_value(&stderr(&output), "records") > 0.0);

    let after = user_items(&client, &table).await;
    assert_eq!(before.len(), after.len());
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old, new, "the replay changed an item");
    }
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "hot").await,
        hot_before
    );

    // A replay of one projection; unknown names are refused with the list.
    let output = cli(&[
        "replay",
        "--spec",
        path(&spec_file),
        "--table",
        &table,
        "--projection",
        "followers",
    ])
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(user_items(&client, &table).await, after);
    let output = cli(&[
        "replay",
        "--spec",
        path(&spec_file),
        "--table",
        &table,
        "--projection",
        "nope",
    ])
    .output()
    .unwrap();
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("no projection `nope`") && message.contains("followed-by"),
        "{message}"
    );
    timed("a_full_replay_after_draining_changes_nothing", started);
}

/// One writer lane's operations on the users it owns (`user % lanes == lane`),
/// in order, so that a user's two-write primary switch never interleaves
/// with another switch of the same user.
/// The crash-restart workload's shape.
#[derive(Debug, Clone, Copy)]
struct Workload {
    /// Users `u0..u{users}`, each with a profile and two emails.
    users: u64,
    /// Concurrent writers.
    lanes: u64,
    /// Operations per writer.
    ops: u64,
    /// The pause after every 10 operations.
    pace: Duration,
    seed: u64,
}

async fn churn(
    client: aws_sdk_dynamodb::Client,
    table: String,
    lane: u64,
    workload: Workload,
) -> u64 {
    let Workload {
        users,
        lanes,
        ops,
        pace,
        seed,
    } = workload;
    let mut rng = Rng::new(seed ^ (lane + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut writes = 0;
    for i in 0..ops {
        let a = format!("u{}", rng.below(users / lanes) * lanes + lane);
        let b = match rng.below(4) {
            0 | 1 => "hot".to_string(),
            _ => format!("u{}", rng.below(users)),
        };
        match rng.below(12) {
            0..=3 => put_item(&client, &table, &follow(&a, &b, &format!("{lane}.{i}"))).await,
            10 => {
                // Profiles go and come back: the rollups' targets.
                let key = (format!("USER#{a}"), "PROFILE".to_string());
                if rng.chance(40) {
                    delete(&client, &table, &key.0, &key.1).await;
                } else {
                    put_item(&client, &table, &profile(&a)).await;
                }
            }
            11 => {
                // A campaign of this lane, and its daily snapshots.
                let c = format!("c{lane}.{}", rng.below(3));
                match rng.below(10) {
                    0 => put_item(&client, &table, &campaign(&c, &a, "ENABLED")).await,
                    1 => {
                        let date = format!("PERF#2026-11-{:02}", rng.below(9) + 1);
                        delete(&client, &table, &format!("CAMPAIGN#{c}"), &date).await
                    }
                    _ => {
                        let item = performance(&c, rng.below(9), rng.below(50_000), rng.below(90));
                        put_item(&client, &table, &item).await
                    }
                }
            }
            4 | 5 => {
                delete(
                    &client,
                    &table,
                    &format!("USER#{a}"),
                    &format!("FOLLOWS#{b}"),
                )
                .await
            }
            6 => {
                let id = ["e1", "e2"][rng.below(2) as usize];
                let current = get(
                    &client,
                    &table,
                    &format!("USER#{a}"),
                    &format!("EMAIL#{id}"),
                )
                .await
                .expect("emails are never deleted");
                let primary = current.get("isPrimary") == Some(&Av::Bool(true));
                let address = format!(" {a}.{i}@Example.COM");
                put_item(&client, &table, &email(&a, id, &address, primary)).await;
            }
            7 | 8 => {
                // The primary switch, as two plain writes.
                let e1 = get(&client, &table, &format!("USER#{a}"), "EMAIL#e1")
                    .await
                    .unwrap();
                let e2 = get(&client, &table, &format!("USER#{a}"), "EMAIL#e2")
                    .await
                    .unwrap();
                let (from, to) = if e1.get("isPrimary") == Some(&Av::Bool(true)) {
                    (("e1", e1), ("e2", e2))
                } else {
                    (("e2", e2), ("e1", e1))
                };
                let address = |item: &Attrs| text(item, "email").unwrap();
                put_item(
                    &client,
                    &table,
                    &email(&a, from.0, &address(&from.1), false),
                )
                .await;
                put_item(&client, &table, &email(&a, to.0, &address(&to.1), true)).await;
                writes += 1;
            }
            _ => {
                let score = support::n(rng.below(10_000) as i64);
                let tier = ["gold", "silver", "bronze"][rng.below(3) as usize];
                put_item(&client, &table, &achievement(&a, "b1", tier, score)).await;
            }
        }
        writes += 1;
        if i % 10 == 9 {
            tokio::time::sleep(pace).await;
        }
    }
    writes
}

/// Records the runner's checkpoints are past, over all shards.
pub(super) async fn checkpointed_records(runner: &StreamRunner) -> u64 {
    runner
        .checkpoints()
        .list()
        .await
        .unwrap()
        .iter()
        .map(|c| c.records)
        .sum()
}

/// Kills of the runner in the crash-restart test.
const KILLS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_runner_at_random_points_loses_and_double_counts_nothing() {
    let started = Instant::now();
    let seed = seed();
    let mut rng = Rng::new(seed);
    // A server of its own: over 10,000 writes plus the runner's on the
    // shared DynamoDB Local would time out the other tests' requests.
    let endpoint = support::dedicated_endpoint();
    let client = aws_sdk_dynamodb::Client::new(&support::sdk_config_for(&endpoint).await);
    let (spec, _dir, spec_file) = combined_spec();
    let table = support::fresh_table(&client, &spec, "run-crash").await;
    let workload = Workload {
        users: 64,
        lanes: 4,
        ops: 2_500,
        pace: Duration::from_millis(5),
        seed,
    };
    let users = workload.users;
    stream::iter(0..users)
        .map(|user| {
            let (client, table) = (client.clone(), table.clone());
            async move {
                let user = format!("u{user}");
                put_item(&client, &table, &profile(&user)).await;
                put_item(
                    &client,
                    &table,
                    &email(&user, "e1", &format!("{user}@example.com"), true),
                )
                .await;
                put_item(
                    &client,
                    &table,
                    &email(&user, "e2", &format!("{user}@work.example"), false),
                )
                .await;
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;

    let writers: Vec<_> = (0..workload.lanes)
        .map(|lane| tokio::spawn(churn(client.clone(), table.clone(), lane, workload)))
        .collect();
    // The killed runners' logs (RUNNER_TEST_LOG=debug fills them).
    let log = tempfile::NamedTempFile::new().unwrap();
    eprintln!("killed runners log to {}", log.path().display());
    let runner = runner(&client, spec.clone(), &table).await;
    let mut landed = 0;
    let mut checkpointed = Vec::new();
    while landed < KILLS {
        // Small batches, so that kills land between many checkpoints.
        let mut child = cli(&["run", "--spec", path(&spec_file), "--table", &table])
            .env("AWS_ENDPOINT_URL", &endpoint)
            .env("PROJECTOR_BATCH_LIMIT", "100")
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(log.path())
                    .unwrap(),
            )
            .spawn()
            .expect("start the runner");
        // Kill at a random point after this run has checkpointed something
        // (polling the checkpoints, so a slow machine still kills mid-work).
        let before = checkpointed.last().copied().unwrap_or(0);
        let waited = Instant::now();
        let mut records = before;
        while records <= before && waited.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            records = checkpointed_records(&runner).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "seed {seed}: the runner stopped by itself; see {}",
            log.path().display()
        );
        child.kill().expect("SIGKILL the runner");
        child.wait().unwrap();
        landed += 1;
        checkpointed.push(checkpointed_records(&runner).await);
    }
    let mut source_writes = users * 3;
    for writer in writers {
        source_writes += writer.await.unwrap();
    }
    eprintln!(
        "timing: {source_writes} source writes and {KILLS} kills took {:.1} s; \
         records checkpointed after each kill: {checkpointed:?}",
        started.elapsed().as_secs_f64()
    );
    assert!(source_writes >= 10_000, "{source_writes} source writes");
    // The kills landed while there was work: the checkpoints moved between
    // most of them, and not all work was done before the last.
    let moved = checkpointed.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        moved >= KILLS / 2,
        "seed {seed}: checkpoints moved between only {moved} kills: {checkpointed:?}"
    );

    let finished = Instant::now();
    let output = cli(&[
        "run",
        "--drain",
        "--spec",
        path(&spec_file),
        "--table",
        &table,
    ])
    .env("AWS_ENDPOINT_URL", &endpoint)
    .output()
    .expect("run the binary");
    let summary = stderr(&output);
    assert!(output.status.success(), "run --drain failed: {summary}");
    eprintln!("{summary}");
    let drained = summary_value(&summary, "records");
    assert!(drained > 0.0, "the final drain had work left: {summary}");
    eprintln!(
        "final drain: {drained} records in {:.1} s, write units per source write {:.2}",
        finished.elapsed().as_secs_f64(),
        summary_value(&summary, "write units") / source_writes as f64
    );
    assert_no_problems(
        &check_derived(&client, &table, &spec, &[]).await,
        &format!("seed {seed}"),
    );
    // The check covered rollups and aggregates: their targets and sources
    // are in the table.
    let items = user_items(&client, &table).await;
    let has = |f: &dyn Fn(&str, &str) -> bool| {
        items
            .iter()
            .any(|item| f(&text(item, "PK").unwrap(), &text(item, "SK").unwrap()))
    };
    assert!(has(&|pk, sk| pk.starts_with("USER#") && sk == "PROFILE"));
    assert!(has(
        &|pk, sk| pk.starts_with("CAMPAIGN#") && sk == "METADATA"
    ));
    assert!(has(
        &|pk, sk| pk.starts_with("CAMPAIGN#") && sk.starts_with("PERF#")
    ));
    let output = cli(&["dlq", "list", "--spec", path(&spec_file), "--table", &table])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .output()
        .unwrap();
    assert!(
        output.stdout.is_empty(),
        "no dead letters: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    if std::env::var_os("RUNNER_TEST_LOG").is_some() {
        let _ = log.keep();
    }
    timed(
        "killing_the_runner_at_random_points_loses_and_double_counts_nothing",
        started,
    );
}

/// `dlq list` as parsed JSON lines.
fn dead_letters(spec_file: &Path, table: &str) -> Vec<serde_json::Value> {
    let output = cli(&["dlq", "list", "--spec", path(spec_file), "--table", table])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("dlq list prints JSON lines"))
        .collect()
}

fn letter_of<'a>(
    letters: &'a [serde_json::Value],
    projection: &str,
    pk: &str,
    sk: &str,
) -> Vec<&'a serde_json::Value> {
    letters
        .iter()
        .filter(|l| {
            l["projection"] == projection
                && l["sourceKey"]["pk"] == pk
                && l["sourceKey"]["sk"] == sk
        })
        .collect()
}

/// Writes the poison items of the dead-letter tests, drains, and checks
/// that they are dead-lettered (later records of one held behind it) while
/// every other item is projected.
async fn poison_then_drain(client: &aws_sdk_dynamodb::Client, table: &str, spec_file: &Path) {
    let score_map = Av::M(HashMap::from([("value".to_string(), support::n(1))]));
    put_item(client, table, &achievement("u1", "b1", "gold", s("high"))).await;
    put_item(client, table, &achievement("u2", "b1", "gold", score_map)).await;
    let mut no_address = email("u3", "e1", "", false);
    no_address.remove("email");
    put_item(client, table, &no_address).await;
    // Good items around them.
    put_item(
        client,
        table,
        &achievement("u4", "b1", "gold", support::n(850)),
    )
    .await;
    put_item(client, table, &email("u5", "e1", "Eve@Example.com", false)).await;
    put_item(client, table, &follow("x", "y", "2024-05-01")).await;
    // A later, valid record of a poisoned item and projection.
    put_item(
        client,
        table,
        &achievement("u1", "b1", "silver", support::n(900)),
    )
    .await;

    drain(spec_file, table);

    let letters = dead_letters(spec_file, table);
    let board = "achievement-leaderboard-keys";
    let u1 = letter_of(&letters, board, "USER#u1", "ACHIEVEMENT#b1");
    assert_eq!(u1.len(), 2, "{letters:#?}");
    assert_eq!(u1[0]["held"], false);
    assert!(
        u1[0]["error"].as_str().unwrap().contains("high"),
        "{}",
        u1[0]
    );
    assert_eq!(
        u1[1]["held"], true,
        "the later record waits behind the first"
    );
    assert_eq!(
        letter_of(&letters, board, "USER#u2", "ACHIEVEMENT#b1").len(),
        1,
        "{letters:#?}"
    );
    let u3 = letter_of(&letters, "email-gsi1-keys", "USER#u3", "EMAIL#e1");
    assert_eq!(u3.len(), 1, "{letters:#?}");
    assert!(
        u3[0]["error"].as_str().unwrap().contains("email"),
        "{}",
        u3[0]
    );
    assert!(
        u3[0]["record"]["new_image"].is_object(),
        "the full record is kept"
    );

    // Held: the valid later record did not apply.
    let u1 = get(client, table, "USER#u1", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert!(!u1.contains_key("GSI1PK"), "{u1:?}");
    // The others went on.
    let u4 = get(client, table, "USER#u4", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert_eq!(text(&u4, "GSI1SK").as_deref(), Some("SCORE#0850"));
    let u5 = get(client, table, "USER#u5", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&u5, "GSI1PK").as_deref(),
        Some("EMAIL#eve@example.com")
    );
    assert!(get(client, table, "USER#y", "FOLLOWED_BY#x")
        .await
        .is_some());
}

#[tokio::test]
async fn malformed_items_are_dead_lettered_and_hold_their_item_but_not_the_others() {
    let started = Instant::now();
    let client = support::client().await;
    let (spec, _dir, spec_file) = combined_spec();
    let table = support::fresh_table(&client, &spec, "run-dlq").await;
    poison_then_drain(&client, &table, &spec_file).await;

    // A record of the held item written later is held as well, and a
    // second drain neither applies it nor stops on it.
    put_item(
        &client,
        &table,
        &achievement("u1", "b1", "gold", support::n(10)),
    )
    .await;
    drain(&spec_file, &table);
    let letters = dead_letters(&spec_file, &table);
    assert_eq!(
        letter_of(
            &letters,
            "achievement-leaderboard-keys",
            "USER#u1",
            "ACHIEVEMENT#b1"
        )
        .len(),
        3
    );
    let u1 = get(&client, &table, "USER#u1", "ACHIEVEMENT#b1")
        .await
        .unwrap();
    assert!(!u1.contains_key("GSI1PK"), "{u1:?}");
    timed(
        "malformed_items_are_dead_lettered_and_hold_their_item_but_not_the_others",
        started,
    );
}

/// The fix-and-redrive half of the dead-letter story: a letter whose
/// stored record can never apply (its image says `score = "high"`) is
/// superseded once the writer's fix behind it applies.
#[tokio::test]
async fn after_a_data_fix_redrive_converges_and_empties_the_store() {
    let client = support::client().await;
    let (spec, _dir, spec_file) = combined_spec();
    let table = support::fresh_table(&client, &spec, "run-redrive").await;
    poison_then_drain(&client, &table, &spec_file).await;

    // The team fixes the items; the fixes are held behind the letters.
    put_item(
        &client,
        &table,
        &achievement("u1", "b1", "gold", support::n(850)),
    )
    .await;
    put_item(
        &client,
        &table,
        &achievement("u2", "b1", "gold", support::n(42)),
    )
    .await;
    put_item(
        &client,
        &table,
        &email("u3", "e1", "Zed@Example.com", false),
    )
    .await;
    drain(&spec_file, &table);
    let output = cli(&[
        "dlq",
        "redrive",
        "--spec",
        path(&spec_file),
        "--table",
        &table,
    ])
    .output()
    .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
    assert_no_problems(
        &check_derived(&client, &table, &spec, &[]).await,
        "the table",
    );
    assert_eq!(
        dead_letters(&spec_file, &table),
        Vec::<serde_json::Value>::new()
    );
}

#[tokio::test]
async fn many_keys_changed_many_times_end_in_their_final_state() {
    let started = Instant::now();
    let client = support::client().await;
    let (spec, _dir, _spec_file) = combined_spec();
    let table = support::fresh_table(&client, &spec, "run-order").await;
    let keys = 24;
    let changes = 12;
    // Every key's changes in order, the keys concurrently.
    stream::iter(0..keys)
        .map(|k| {
            let (client, table) = (client.clone(), table.clone());
            async move {
                let user = format!("u{k}");
                put_item(&client, &table, &profile(&user)).await;
                for i in 0..changes {
                    let address = format!(" {user}.V{i}@Example.com ");
                    put_item(&client, &table, &email(&user, "e1", &address, i % 3 != 1)).await;
                    let score = support::n((k * 100 + i) as i64);
                    let tier = ["gold", "silver"][i as usize % 2];
                    put_item(&client, &table, &achievement(&user, "b1", tier, score)).await;
                    let followee = format!("u{}", (k + 1) % keys);
                    if i % 2 == 0 {
                        put_item(&client, &table, &follow(&user, &followee, &format!("t{i}")))
                            .await;
                    } else {
                        delete(
                            &client,
                            &table,
                            &format!("USER#{user}"),
                            &format!("FOLLOWS#{followee}"),
                        )
                        .await;
                    }
                    // Ends followed (the last change of an even count is an unfollow
                    // only when `changes` is even): the hot user too.
                    if k % 2 == 0 {
                        put_item(&client, &table, &follow(&user, "hot", &format!("h{i}"))).await;
                    }
                }
            }
        })
        .buffer_unordered(keys as usize)
        .collect::<Vec<_>>()
        .await;
    let runner = runner(&client, spec.clone(), &table).await;
    let summary = drain_library(&runner).await;
    eprintln!("{summary}");
    assert_no_problems(
        &check_derived(&client, &table, &spec, &[]).await,
        "the table",
    );
    assert_eq!(
        user_counter(&client, &table, &spec, "followers", "hot").await,
        keys as i64 / 2
    );
    let e1 = get(&client, &table, "USER#u7", "EMAIL#e1").await.unwrap();
    assert_eq!(
        text(&e1, "GSI1PK"),
        Some(format!("EMAIL#u7.v{}@example.com", changes - 1))
    );
    // A second drain finds only the runner's own writes and writes no
    // checkpoint for them.
    let again = drain_library(&runner).await;
    assert_eq!(again.effects, 0, "{again:?}");
    assert_eq!(again.checkpoints, 0, "{again:?}");
    timed(
        "many_keys_changed_many_times_end_in_their_final_state",
        started,
    );
}

#[tokio::test]
async fn sigterm_stops_the_runner_cleanly_with_a_summary() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("ads-platform.toml");
    let table = support::fresh_table(&client, &spec, "run-term").await;
    put_item(&client, &table, &campaign("c1", "p1", "ENABLED")).await;
    let spec_file = shipped("ads-platform.toml");
    let child = cli(&["run", "--spec", path(&spec_file), "--table", &table])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the record is applied, then ask the runner to stop.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c1 = get(&client, &table, "CAMPAIGN#c1", "METADATA")
            .await
            .unwrap();
        if c1.contains_key("GSI1PK") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the runner never applied the record"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(summary_value(&text, "records") >= 1.0, "{text}");
    timed("sigterm_stops_the_runner_cleanly_with_a_summary", started);
}

#[tokio::test]
async fn a_table_without_a_stream_or_an_unreachable_endpoint_fails_within_seconds() {
    let client = support::client().await;
    let spec = support::shipped_spec("ads-platform.toml");
    let spec_file = shipped("ads-platform.toml");
    let table = support::unique_table("run-nostream");
    client
        .create_table()
        .table_name(&table)
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("PK")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .unwrap(),
        )
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("SK")
                .key_type(aws_sdk_dynamodb::types::KeyType::Range)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("PK")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("SK")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("create a table without a stream");
    let _ = spec;

    let started = Instant::now();
    let output = cli(&[
        "run",
        "--drain",
        "--spec",
        path(&spec_file),
        "--table",
        &table,
    ])
    .output()
    .unwrap();
    eprintln!(
        "timing: no stream failed after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains("has no stream enabled"), "{message}");

    let started = Instant::now();
    let output = cli(&[
        "run",
        "--spec",
        path(&spec_file),
        "--table",
        "missing-table",
    ])
    .output()
    .unwrap();
    eprintln!(
        "timing: a missing table failed after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("does not exist"),
        "{}",
        stderr(&output)
    );

    let started = Instant::now();
    let output = cli(&["replay", "--spec", path(&spec_file), "--table", &table])
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    eprintln!(
        "timing: a closed port failed after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("cannot reach DynamoDB at http://127.0.0.1:9"),
        "{message}"
    );
}

#[tokio::test]
async fn a_checkpoint_whose_records_are_gone_stops_the_runner_loudly() {
    let client = support::client().await;
    let spec = support::shipped_spec("ads-platform.toml");
    let table = support::fresh_table(&client, &spec, "run-trimmed").await;
    put_item(&client, &table, &campaign("c1", "p1", "ENABLED")).await;
    let runner = runner(&client, spec.clone(), &table).await;
    drain_library(&runner).await;
    // Pretend the runner was away for days: its checkpoint points before
    // what the shard still holds.
    let store = runner.checkpoints();
    let checkpoints = store.list().await.unwrap();
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    let mut old = checkpoints[0].clone();
    old.sequence_number = Some(ddb_projector::record::SequenceNumber(format!("{:021}", 1)));
    store.reset(None).await.unwrap();
    store.save(None, &[], &old).await.unwrap();
    put_item(&client, &table, &campaign("c2", "p1", "ENABLED")).await;

    let error = runner
        .run(RunOptions::drain(), std::future::pending())
        .await
        .expect_err("the runner must not skip lost records");
    let message = error.to_string();
    eprintln!("{message}");
    assert!(
        matches!(error.kind, RunErrorKind::RecordsLost { .. }),
        "{message}"
    );
    assert!(
        message.contains("records were lost") && message.contains("ddb-projector backfill"),
        "{message}"
    );
    assert!(message.contains("_ddbp#checkpoint"), "{message}");
    let c2 = get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .unwrap();
    assert!(
        !c2.contains_key("GSI1PK"),
        "nothing after the gap is applied silently"
    );

    // The recovery the message describes: reset, run again.
    store.reset(None).await.unwrap();
    drain_library(&runner).await;
    let c2 = get(&client, &table, "CAMPAIGN#c2", "METADATA")
        .await
        .unwrap();
    assert_eq!(text(&c2, "GSI1PK").as_deref(), Some("PROFILE#p1"));
}

#[tokio::test]
async fn missing_credentials_fail_within_seconds_and_write_nothing() {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "run-nocreds").await;
    support::put(
        &client,
        &table,
        &[
            ("PK", s("USER#u1")),
            ("SK", s("EMAIL#e1")),
            ("email", s("sam@x.org")),
            ("isPrimary", Av::Bool(true)),
        ],
    )
    .await;
    let spec_file = shipped("user-service.toml");
    // An empty HOME: no ~/.aws; no instance metadata to fall back on.
    let home = std::env::temp_dir().join(format!("ddbp-nocreds-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    for endpoint in [support::endpoint(), "http://127.0.0.1:9"] {
        let started = Instant::now();
        let output = Command::new(support::binary())
            .args([
                "run",
                "--drain",
                "--spec",
                path(&spec_file),
                "--table",
                &table,
            ])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let elapsed = started.elapsed();
        let message = stderr(&output);
        eprintln!("timing: no credentials ({endpoint}) failed after {elapsed:?}: {message}");
        assert_eq!(output.status.code(), Some(2), "{message}");
        assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
        assert!(
            message.contains("no AWS credentials found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
            "{message}"
        );
    }
    let _ = std::fs::remove_dir_all(&home);
    let stored = get(&client, &table, "USER#u1", "EMAIL#e1").await.unwrap();
    assert!(!stored.contains_key("GSI1PK"), "nothing was written");
}

#[tokio::test]
async fn a_checkpoint_write_that_landed_unanswered_is_not_taken_for_another_runner() {
    use ddb_projector::record::SequenceNumber;
    use ddb_projector::source::checkpoint::CheckpointError;
    use ddb_projector::source::{Checkpoint, CheckpointStore};
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "ckpt-lost").await;
    let store = CheckpointStore::new(
        client,
        &table,
        &spec,
        "arn:aws:dynamodb:us-east-1:1:table/T/stream/1",
    );
    let seq = |n: &str| SequenceNumber(n.to_string());
    let at = |n: &str| Checkpoint {
        shard_id: "shardId-1".to_string(),
        sequence_number: Some(seq(n)),
        ..Checkpoint::default()
    };
    store.save(None, &[], &at("100")).await.unwrap();
    // The write of 200 lands, but every answer to it is lost: the runner
    // still believes 100 is stored, and remembers 200 as unconfirmed.
    store
        .save(Some(&seq("100")), &[], &at("200"))
        .await
        .unwrap();
    // Unaware, its next write would look like another runner's doing...
    assert!(matches!(
        store.save(Some(&seq("100")), &[], &at("300")).await,
        Err(CheckpointError::Conflict { .. })
    ));
    // ...knowing its own unconfirmed write, it goes on.
    store
        .save(Some(&seq("100")), &[seq("200")], &at("300"))
        .await
        .unwrap();
    let stored = store.load("shardId-1").await.unwrap().unwrap();
    assert_eq!(stored.sequence_number, Some(seq("300")));
    // A position this runner never wrote is still another runner's.
    assert!(matches!(
        store
            .save(Some(&seq("100")), &[seq("250")], &at("400"))
            .await,
        Err(CheckpointError::Conflict { .. })
    ));
}

#[tokio::test]
async fn the_summary_gives_what_dynamodb_bills_beside_what_the_endpoint_reports() {
    // One follow: its reverse edge and both counters' shards move in one
    // transaction of 3 items, which DynamoDB bills 2 units each (6), while
    // DynamoDB Local reports 2.0 for the whole transaction; the page's
    // entry in the ledger of deliveries is one more write (7).
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "billed").await;
    put_item(&client, &table, &follow("a", "b", "2026-11-23")).await;
    let summary = drain_library(&runner(&client, spec.clone(), &table).await).await;
    // (The stream also carries the projector's own writes, skipped.)
    assert_eq!(summary.min_billed_write_units, 7, "{summary}");
    assert!(summary.write_units < 7.0, "{summary}");
    let text = summary.to_string();
    assert!(text.contains("billed at least  7.0 ("), "{text}");
}
