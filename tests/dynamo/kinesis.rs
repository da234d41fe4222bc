//! Kinesis Data Streams for DynamoDB as a source, end to end: DynamoDB
//! Local's stream is bridged into a Kinesis stream of moto's server (a real
//! Kinesis API), each change encoded as Kinesis Data Streams for DynamoDB
//! writes it (JSON data naming its table, `ApproximateCreationDateTime` in
//! milliseconds or microseconds, no sequence number of its own), and the
//! bridge **duplicates and reorders** changes at random, within a batch and
//! across batches and shards: an item's delete may come before its insert,
//! an old change after a newer one. The runner reads the Kinesis stream
//! (`StreamRunner::kinesis`, the CLI's `run --kinesis-stream`).
//!
//! The property test draws specs as `specgen` does (every kind, over
//! shared source entities, with and without counters and `when`) and
//! histories of writes; writers write while the runner drains. Every case
//! must end exact against `oracle.rs`, with no dead letter and a clean
//! audit, and a replay from an old timestamp (`--from`) must write nothing.
//! `KINESIS_CASES` sets the number of cases.

use std::sync::atomic::{AtomicUsize, Ordering};

use ddb_projector::apply::ApplyConfig;
use ddb_projector::audit::{audit, AuditOptions};
use ddb_projector::control;
use ddb_projector::source::{OtherTables, RunOptions, StreamRunner, Summary};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::{json, Value};

use super::delivery::{runtime, Writer};
use super::model::{check_derived, follow, put_item, History};
use super::oracle;
use super::specgen::{play, spec_toml, specs, write, Specs, Write};
use super::support::{self, moto};

/// A Kinesis client of moto's server.
pub async fn kinesis() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::new(&support::sdk_config_for(moto()).await)
}

/// A new Kinesis stream with `shards` shards; its ARN.
pub async fn create_stream(client: &aws_sdk_kinesis::Client, shards: i32) -> String {
    let name = support::unique_table("changes");
    client
        .create_stream()
        .stream_name(&name)
        .shard_count(shards)
        .send()
        .await
        .expect("create the Kinesis stream");
    client
        .describe_stream_summary()
        .stream_name(&name)
        .send()
        .await
        .expect("describe the Kinesis stream")
        .stream_description_summary()
        .expect("a summary")
        .stream_arn()
        .to_string()
}

/// A DynamoDB Streams record as Lambda delivers it (`lambda.rs`'s shape)
/// re-encoded as the data Kinesis Data Streams for DynamoDB writes for
/// the same change of `table`.
pub fn change_data(record: &Value, table: &str, micro: bool) -> Value {
    let stream = &record["dynamodb"];
    let seconds = stream["ApproximateCreationDateTime"]
        .as_f64()
        .unwrap_or(0.0);
    let (at, precision) = if micro {
        ((seconds * 1e6) as i64, "MICROSECOND")
    } else {
        ((seconds * 1e3) as i64, "MILLISECOND")
    };
    let mut dynamodb = json!({
        "ApproximateCreationDateTime": at,
        "ApproximateCreationDateTimePrecision": precision,
        "Keys": stream["Keys"],
        "SizeBytes": stream["SizeBytes"],
    });
    for image in ["NewImage", "OldImage"] {
        if !stream[image].is_null() {
            dynamodb[image] = stream[image].clone();
        }
    }
    json!({
        "awsRegion": "us-east-1",
        "eventID": record["eventID"],
        "eventName": record["eventName"],
        "userIdentity": null,
        "recordFormat": "application/json",
        "tableName": table,
        "dynamodb": dynamodb,
        "eventSource": "aws:dynamodb",
    })
}

/// A small deterministic generator (SplitMix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Feeds a Kinesis stream as Kinesis Data Streams for DynamoDB may: every
/// change at least once, some twice, some held back to a later send, each
/// send shuffled, each record put under a random partition key (so one
/// item's changes spread over the shards).
pub struct Feed {
    pub client: aws_sdk_kinesis::Client,
    pub arn: String,
    pub rng: Rng,
    /// Percent of changes sent twice.
    pub duplicates: u64,
    /// Percent of changes held back to a later send.
    pub hold: u64,
    held: Vec<Value>,
    /// Records put, duplicates included.
    pub put: usize,
}

impl Feed {
    pub fn new(client: aws_sdk_kinesis::Client, arn: String, seed: u64) -> Feed {
        Feed {
            client,
            arn,
            rng: Rng::new(seed),
            duplicates: 30,
            hold: 30,
            held: Vec::new(),
            put: 0,
        }
    }

    /// Sends `changes` (and what was held back), perturbed; `last`: hold
    /// nothing back.
    pub async fn send(&mut self, changes: Vec<Value>, last: bool) {
        let mut out = std::mem::take(&mut self.held);
        for change in changes {
            if self.rng.below(100) < self.duplicates {
                // The copy may come now or later, before or after the first.
                if !last && self.rng.below(2) == 0 {
                    self.held.push(change.clone());
                } else {
                    out.push(change.clone());
                }
            }
            if !last && self.rng.below(100) < self.hold {
                self.held.push(change);
            } else {
                out.push(change);
            }
        }
        self.rng.shuffle(&mut out);
        for chunk in out.chunks(100) {
            let entries: Vec<_> = chunk
                .iter()
                .map(|change| {
                    aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                        .data(aws_smithy_types::Blob::new(change.to_string().into_bytes()))
                        .partition_key(format!("p{}", self.rng.next()))
                        .build()
                        .expect("an entry")
                })
                .collect();
            let sent = self
                .client
                .put_records()
                .stream_arn(&self.arn)
                .set_records(Some(entries))
                .send()
                .await
                .expect("put records");
            assert_eq!(sent.failed_record_count(), Some(0), "moto refused records");
            self.put += chunk.len();
        }
    }

    /// Puts raw data (bad input) as one record.
    pub async fn put_raw(&mut self, data: Vec<u8>) {
        self.client
            .put_record()
            .stream_arn(&self.arn)
            .data(aws_smithy_types::Blob::new(data))
            .partition_key("bad")
            .send()
            .await
            .expect("put record");
        self.put += 1;
    }
}

/// Drains the Kinesis stream `arn` into `table` with `spec`'s stream
/// consumer; `options` starts from [`RunOptions::drain`].
pub async fn drain(
    client: &aws_sdk_dynamodb::Client,
    spec: std::sync::Arc<ddb_projector::spec::Spec>,
    table: &str,
    arn: &str,
    options: RunOptions,
    others: OtherTables,
) -> Summary {
    let applier = control::stream_consumer(
        client.clone(),
        spec,
        table,
        ApplyConfig {
            lease: std::time::Duration::from_millis(300),
            clock_skew: std::time::Duration::ZERO,
            ..ApplyConfig::default()
        },
    );
    let runner = StreamRunner::kinesis(applier, kinesis().await, arn, others);
    runner
        .run(
            RunOptions {
                empty_polls: 2,
                poll_interval: std::time::Duration::from_millis(20),
                ..options
            },
            std::future::pending(),
        )
        .await
        .unwrap_or_else(|error| panic!("the Kinesis runner failed: {error}"))
}

/// The table's stream so far, oldest first, as Kinesis changes.
async fn bridged(client: &aws_sdk_dynamodb::Client, table: &str, micro: bool) -> Vec<Value> {
    super::lambda::stream_records(client, table)
        .await
        .iter()
        .map(|record| change_data(record, table, micro))
        .collect()
}

// ---------------------------------------------------------- the property ---

/// Cases unless `KINESIS_CASES` says otherwise.
const CASES: u32 = 40;

static DUPLICATED: AtomicUsize = AtomicUsize::new(0);
static RECORDS: AtomicUsize = AtomicUsize::new(0);
/// Over the live drains: records read, items read, write requests, batches.
static READ: AtomicUsize = AtomicUsize::new(0);
static ITEMS_READ: AtomicUsize = AtomicUsize::new(0);
static WRITES: AtomicUsize = AtomicUsize::new(0);
static BATCHES: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone)]
struct Plan {
    writes: Vec<Write>,
    /// How many sends the history is cut into (writers write between).
    sends: usize,
    shards: i32,
    micro: bool,
    seed: u64,
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        prop::collection::vec(write(), 1..40),
        1usize..5,
        1i32..4,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(writes, sends, shards, micro, seed)| Plan {
            writes,
            sends,
            shards,
            micro,
            seed,
        })
}

async fn case(specs: &Specs, plan: &Plan) -> Result<(), TestCaseError> {
    let toml = spec_toml(&specs.v1);
    let spec = std::sync::Arc::new(
        ddb_projector::spec::Spec::from_toml(&toml, "v1.toml").expect("filtered to compile"),
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec, "kinesis").await;
    let kinesis = kinesis().await;
    let arn = create_stream(&kinesis, plan.shards).await;
    let started_ms = ddb_projector::dynamo::time::now_ms();
    let mut history = History::default();
    play(&mut history, &plan.writes);
    RECORDS.fetch_add(history.records.len(), Ordering::Relaxed);
    let mut writer = Writer {
        client: &client,
        table: &table,
        history: &history,
        written: 0,
    };
    let mut feed = Feed::new(kinesis.clone(), arn.clone(), plan.seed);
    let mut sent = 0;
    let n = history.records.len();
    // Writers write the next part while the runner drains what was sent:
    // an item may change between the read that derives it and the write.
    writer.write_until(n / plan.sends).await;
    for send in 1..=plan.sends + 1 {
        let changes = bridged(&client, &table, plan.micro).await;
        let new = changes[sent..].to_vec();
        sent = changes.len();
        feed.send(new, send == plan.sends + 1).await;
        let next = (n * (send + 1) / plan.sends).min(n);
        let ((), summary) = tokio::join!(
            writer.write_until(next),
            drain(
                &client,
                spec.clone(),
                &table,
                &arn,
                RunOptions::drain(),
                OtherTables::default(),
            )
        );
        READ.fetch_add(summary.records as usize, Ordering::Relaxed);
        ITEMS_READ.fetch_add(summary.items_read as usize, Ordering::Relaxed);
        WRITES.fetch_add(summary.writes as usize, Ordering::Relaxed);
        BATCHES.fetch_add(summary.batches as usize, Ordering::Relaxed);
    }
    DUPLICATED.fetch_add(feed.put - sent, Ordering::Relaxed);
    // A poison state read while it was poison left a letter; the item is
    // fixed since, and the redrive applies it as it is now.
    let applier = control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    applier
        .redrive(None)
        .await
        .map_err(|error| TestCaseError::fail(format!("redrive: {error}")))?;
    let letters = applier.dead_letter_store().list().await.expect("list");
    prop_assert!(
        letters.is_empty(),
        "dead letters left: {:?}",
        letters
            .iter()
            .map(|l| (&l.source_key, &l.error))
            .collect::<Vec<_>>()
    );
    let items = support::scan_all(&client, &table).await;
    let problems = oracle::differences(&toml, &items);
    prop_assert!(
        problems.is_empty(),
        "after the Kinesis stream ({} records put for {} changes): the table differs from what the spec computes:\n  {}",
        feed.put,
        sent,
        problems.join("\n  ")
    );
    let report = audit(
        &applier,
        &AuditOptions {
            progress: false,
            ..AuditOptions::default()
        },
    )
    .await
    .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
    prop_assert!(
        report.is_clean(),
        "the audit found:\n{}",
        report.to_text(&spec)
    );
    // A replay from before the first change writes nothing.
    let replayed = drain(
        &client,
        spec.clone(),
        &table,
        &arn,
        RunOptions {
            from_ms: Some(started_ms as i64 - 60_000),
            ..RunOptions::replay(None)
        },
        OtherTables::default(),
    )
    .await;
    prop_assert_eq!(
        replayed.records as usize,
        feed.put,
        "the replay read every record put"
    );
    prop_assert_eq!(replayed.writes, 0, "a replay of an exact table wrote");
    prop_assert_eq!(
        derived(&support::scan_all(&client, &table).await),
        derived(&items)
    );
    Ok(())
}

#[test]
fn generated_specs_end_exact_on_a_kinesis_stream_that_duplicates_and_reorders() {
    let cases = std::env::var("KINESIS_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/dynamo/properties/kinesis.txt",
        ))),
        max_shrink_iters: 100,
        max_shrink_time: 300_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let started = std::time::Instant::now();
    let result = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            runner
                .run(&(specs(), plan()), |(specs, plan)| {
                    runtime().block_on(case(&specs, &plan))
                })
                .map_err(|error| error.to_string())
        })
        .expect("a thread")
        .join()
        .expect("the property test thread");
    let n = |what: &AtomicUsize| what.load(Ordering::Relaxed);
    eprintln!(
        "timing: Kinesis: {cases} cases took {:.1} s; {} changes, {} extra copies put; the live drains read {} records (the projector's own writes come back through the stream too) in {} batches, read {} items and sent {} write requests",
        started.elapsed().as_secs_f64(),
        n(&RECORDS),
        n(&DUPLICATED),
        n(&READ),
        n(&BATCHES),
        n(&ITEMS_READ),
        n(&WRITES),
    );
    if let Err(error) = result {
        panic!("{error}");
    }
}

// ------------------------------------------------------- shipped specs ---

/// The table's items but the projector's own (leases, checkpoints, letters).
fn derived(items: &[super::model::Attrs]) -> Vec<super::model::Attrs> {
    items
        .iter()
        .filter(|i| !support::text(i, "PK").is_some_and(|pk| pk.starts_with("_ddbp#")))
        .cloned()
        .collect()
}

/// An item's delete delivered before its insert, an old change after a
/// newer one, every change twice: the social table ends exact, a replay
/// writes nothing, and changes of other tables are skipped when another
/// consumer serves their table and dead-lettered naming it otherwise, with
/// bad data dead-lettered naming the problem.
#[tokio::test]
async fn a_delete_before_its_insert_and_other_tables_changes_on_one_kinesis_stream() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "kinesis-social").await;
    let kinesis = kinesis().await;
    let arn = create_stream(&kinesis, 2).await;
    // u1 and u2 follow star; u1 unfollows star.
    for a in ["u1", "u2"] {
        put_item(&client, &table, &follow(a, "star", "2026-11-01")).await;
    }
    support::delete(&client, &table, "USER#u1", "FOLLOWS#star").await;
    let changes = bridged(&client, &table, true).await;
    assert_eq!(changes.len(), 3);
    // Newest first, then each again oldest first: the unfollow comes
    // before the follow, and the follow again after the unfollow.
    let mut feed = Feed::new(kinesis.clone(), arn.clone(), 7);
    feed.duplicates = 0;
    feed.hold = 0;
    for change in changes.iter().rev().chain(changes.iter()) {
        feed.send(vec![change.clone()], true).await;
    }
    let summary = drain(
        &client,
        spec.clone(),
        &table,
        &arn,
        RunOptions::drain(),
        OtherTables::default(),
    )
    .await;
    assert_eq!(summary.records, 6, "{summary}");
    let users = vec!["u1".to_string(), "u2".to_string(), "star".to_string()];
    let problems = check_derived(&client, &table, &spec, &users).await;
    assert!(problems.is_empty(), "{problems:#?}");
    let items = support::scan_all(&client, &table).await;
    let edges: Vec<String> = items
        .iter()
        .filter_map(|item| support::text(item, "SK"))
        .filter(|sk| sk.starts_with("FOLLOWED_BY#"))
        .collect();
    assert_eq!(edges, ["FOLLOWED_BY#u2"], "{items:#?}");

    // The CLI's replay from a timestamp over the same stream writes nothing.
    let from = chrono::DateTime::from_timestamp_millis(
        ddb_projector::dynamo::time::now_ms() as i64 - 3_600_000,
    )
    .expect("a time")
    .to_rfc3339();
    let output = std::process::Command::new(support::binary())
        .args([
            "replay",
            "--spec",
            &support::repo()
                .join("projections/social-service.toml")
                .display()
                .to_string(),
            "--table",
            &table,
            "--kinesis-stream",
            &arn,
            "--from",
            &from,
        ])
        .envs(support::env())
        .env("AWS_ENDPOINT_URL_KINESIS", moto())
        .output()
        .expect("run the CLI");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("writes           0"),
        "the replay wrote:\n{stderr}"
    );
    assert!(stderr.contains("records          6"), "{stderr}");
    assert_eq!(
        derived(&support::scan_all(&client, &table).await),
        derived(&items)
    );

    // Another table's change: skipped when another consumer serves its
    // table (a spec names it), a dead letter naming it when nothing does;
    // data that is not a DynamoDB change is a dead letter naming that.
    let mut other = changes[1].clone();
    other["tableName"] = json!("someone-elses");
    feed.send(vec![other.clone()], true).await;
    other["tableName"] = json!("nobody-serves-this");
    feed.send(vec![other], true).await;
    feed.put_raw(b"{\"hello\": \"world\"}".to_vec()).await;
    feed.put_raw(b"\x00\x01 not json".to_vec()).await;
    let summary = drain(
        &client,
        spec.clone(),
        &table,
        &arn,
        RunOptions::drain(),
        OtherTables::new(["someone-elses".to_string()], Some(client.clone())),
    )
    .await;
    assert_eq!(summary.records, 4, "{summary}");
    assert_eq!(summary.dead_letters, 3, "{summary}");
    let letters = super::lambda::dead_letters(&client, &table).await;
    let errors: Vec<String> = letters
        .iter()
        .filter_map(|l| support::text(l, "error"))
        .collect();
    assert_eq!(letters.len(), 3, "{errors:#?}");
    assert!(
        errors.iter().any(|e| e.contains("`nobody-serves-this`")),
        "{errors:#?}"
    );
    assert!(
        !errors.iter().any(|e| e.contains("someone-elses")),
        "{errors:#?}"
    );
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.contains("not a DynamoDB change record"))
            .count(),
        2,
        "{errors:#?}"
    );
    // Nothing derived moved.
    assert_eq!(
        derived(&support::scan_all(&client, &table).await),
        derived(&items)
    );
}

/// Two tables send their changes to one Kinesis stream, each served by its
/// own runner. Each runner's checkpoints are changes of its table, which
/// the other reads: they are bookkeeping, so the two reach quiet (no
/// checkpoint answering a checkpoint, and so on). A change of a table
/// another consumer serves, keyed unlike this table, is skipped: no letter.
#[tokio::test]
async fn two_tables_on_one_kinesis_stream_reach_quiet_and_leave_each_other_alone() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let a = support::fresh_table(&client, &spec, "kinesis-a").await;
    let b = support::fresh_table(&client, &spec, "kinesis-b").await;
    let kinesis = kinesis().await;
    let arn = create_stream(&kinesis, 2).await;
    let mut feed = Feed::new(kinesis.clone(), arn.clone(), 11);
    feed.duplicates = 0;
    feed.hold = 0;
    let mut sent: std::collections::BTreeMap<String, usize> = Default::default();
    let others = |me: &str, other: &str| {
        OtherTables::new(
            [other.to_string(), "orders".to_string()]
                .into_iter()
                .filter(|t| t != me),
            None,
        )
    };
    // Rounds: writes in the first two, then none; each round bridges what
    // both tables' streams hold since, and drains both runners. Once the
    // writes stop, a checkpoint written only because the other runner's
    // checkpoint came by would make another, round after round.
    let mut checkpoints = Vec::new();
    for round in 0..6 {
        if round < 2 {
            for (table, user) in [(&a, "u1"), (&b, "u2")] {
                put_item(&client, table, &follow(user, &format!("s{round}"), "t")).await;
            }
        }
        let mut new = Vec::new();
        for table in [&a, &b] {
            let changes = bridged(&client, table, false).await;
            let from = sent.get(table.as_str()).copied().unwrap_or(0);
            new.extend(changes[from..].iter().cloned());
            sent.insert(table.to_string(), changes.len());
        }
        checkpoints.push(
            new.iter()
                .filter(|c| {
                    c["dynamodb"]["Keys"]["PK"]["S"]
                        .as_str()
                        .is_some_and(|pk| pk.starts_with("_ddbp#checkpoint"))
                })
                .count(),
        );
        if round == 0 {
            // A table keyed otherwise, served by another consumer.
            new.push(json!({
                "eventID": "orders-1",
                "eventName": "INSERT",
                "tableName": "orders",
                "eventSource": "aws:dynamodb",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1_764_000_000_000_i64,
                    "Keys": {"id": {"N": "5"}},
                    "NewImage": {"id": {"N": "5"}, "total": {"N": "12"}},
                },
            }));
        }
        feed.send(new, true).await;
        for (me, other) in [(&a, &b), (&b, &a)] {
            drain(
                &client,
                spec.clone(),
                me,
                &arn,
                RunOptions::drain(),
                others(me, other),
            )
            .await;
        }
    }
    assert_eq!(
        checkpoints[4..],
        [0, 0],
        "checkpoint changes per round: the runners answered each other's checkpoints ({checkpoints:?})"
    );
    for table in [&a, &b] {
        let users = vec!["u1".to_string(), "u2".to_string()];
        let problems = check_derived(&client, table, &spec, &users).await;
        assert!(problems.is_empty(), "{table}: {problems:#?}");
        let letters = super::lambda::dead_letters(&client, table).await;
        assert!(letters.is_empty(), "{table}: {letters:#?}");
    }
}

/// The Kinesis stream is resharded while changes flow: its shard split in
/// two, and the changes after the split land in the children. The runner
/// reads parent and children (children at once: order does not matter)
/// and the table ends exact; a restarted runner reads nothing again.
#[tokio::test]
async fn a_kinesis_stream_split_while_changes_flow_ends_exact() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "kinesis-split").await;
    let kinesis = kinesis().await;
    let arn = create_stream(&kinesis, 1).await;
    let mut feed = Feed::new(kinesis.clone(), arn.clone(), 5);
    let users: Vec<String> = (0..6).map(|i| format!("u{i}")).collect();
    let mut sent = 0;
    for round in 0..3 {
        for (i, a) in users.iter().enumerate() {
            let b = &users[(i + round + 1) % users.len()];
            put_item(&client, &table, &follow(a, b, &format!("r{round}"))).await;
            if round == 2 && i % 2 == 0 {
                support::delete(
                    &client,
                    &table,
                    &format!("USER#{a}"),
                    &format!("FOLLOWS#{b}"),
                )
                .await;
            }
        }
        let changes = bridged(&client, &table, false).await;
        feed.send(changes[sent..].to_vec(), round == 2).await;
        sent = changes.len();
        if round == 0 {
            drain(
                &client,
                spec.clone(),
                &table,
                &arn,
                RunOptions::drain(),
                OtherTables::default(),
            )
            .await;
            let shards = kinesis
                .list_shards()
                .stream_arn(&arn)
                .send()
                .await
                .expect("list shards");
            let parent = shards.shards()[0].shard_id().to_string();
            kinesis
                .split_shard()
                .stream_arn(&arn)
                .shard_to_split(&parent)
                .new_starting_hash_key("170141183460469231731687303715884105728")
                .send()
                .await
                .expect("split the shard");
        }
    }
    let shards = kinesis
        .list_shards()
        .stream_arn(&arn)
        .send()
        .await
        .expect("list shards")
        .shards()
        .len();
    assert_eq!(shards, 3, "a parent and two children");
    let last = drain(
        &client,
        spec.clone(),
        &table,
        &arn,
        RunOptions::drain(),
        OtherTables::default(),
    )
    .await;
    assert_eq!(
        last.shards_finished, 1,
        "the closed parent is finished: {last}"
    );
    let problems = check_derived(&client, &table, &spec, &users).await;
    assert!(problems.is_empty(), "{problems:#?}");
    let again = drain(
        &client,
        spec.clone(),
        &table,
        &arn,
        RunOptions::drain(),
        OtherTables::default(),
    )
    .await;
    assert_eq!(again.records, 0, "a restarted runner read again: {again}");
}
