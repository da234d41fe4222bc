//! `wait`: read-your-writes. Whether everything the spec derives from one
//! source item's current state is in place, checked with consistent reads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, ApplyConfig};
use ddb_projector::audit::wait::{wait, Status, WaitOptions};
use ddb_projector::control;
use ddb_projector::record::ItemKey;
use ddb_projector::source::stream::{RunOptions, StreamRunner};
use ddb_projector::spec::Spec;

use super::model::{attrs, delete_item, email, follow, profile, put_item};
use super::oracle;
use super::support::{self, s};

async fn runner(applier: &Applier) -> StreamRunner {
    let (arn, _) = ddb_projector::dynamo::client::require_stream(applier.client(), applier.table())
        .await
        .expect("the table has a stream");
    StreamRunner::new(
        applier.clone(),
        aws_sdk_dynamodbstreams::Client::new(&support::sdk_config().await),
        &arn,
    )
}

async fn drain(runner: &StreamRunner) {
    Box::pin(runner.run(
        RunOptions {
            poll_interval: Duration::from_millis(50),
            ..RunOptions::drain()
        },
        std::future::pending(),
    ))
    .await
    .expect("drain");
}

/// `check`, its future on the heap.
async fn check(
    applier: &Applier,
    key: &ItemKey,
) -> Result<Status, ddb_projector::apply::ApplyError> {
    Box::pin(ddb_projector::audit::wait::check(applier, key)).await
}

/// A fresh table for the shipped spec `name`, its applier, and a runner
/// of its stream.
async fn setup(
    name: &str,
    prefix: &str,
) -> (Applier, aws_sdk_dynamodb::Client, String, StreamRunner) {
    let applier = support::fixture(support::shipped_spec(name), prefix)
        .await
        .applier;
    let (client, table) = (applier.client().clone(), applier.table().to_string());
    let runner = runner(&applier).await;
    (applier, client, table, runner)
}

fn key(pk: &str, sk: &str) -> ItemKey {
    ItemKey {
        pk: pk.to_string(),
        sk: Some(sk.to_string()),
    }
}

/// The projections `status` names as pending.
fn pending(status: &Status) -> Vec<String> {
    match status {
        Status::Pending { pending } => {
            let mut names: Vec<String> = pending.iter().map(|p| p.projection.clone()).collect();
            names.sort();
            names.dedup();
            names
        }
        other => panic!("pending, not {other:?}"),
    }
}

fn spec_text(name: &str) -> String {
    std::fs::read_to_string(support::repo().join("projections").join(name)).unwrap()
}

/// A new primary email: pending (its keys, the profile's copy) until the
/// worker runs, then projected, and the table then agrees with the
/// oracle. A poison record answers "held" at the first check, and
/// "projected" once fixed and redriven.
#[tokio::test]
async fn wait_answers_pending_then_projected_and_held_behind_a_dead_letter() {
    // A large future: on the heap, not the test thread's stack.
    Box::pin(wait_answers_pending_then_projected_and_held_behind_a_dead_letter_steps()).await;
}

async fn wait_answers_pending_then_projected_and_held_behind_a_dead_letter_steps() {
    let (applier, client, table, runner) = setup("user-service.toml", "wait-user").await;
    put_item(&client, &table, &profile("u1")).await;
    put_item(&client, &table, &email("u1", "e1", "Sam@X.org", true)).await;
    let e1 = key("USER#u1", "EMAIL#e1");
    let quick = WaitOptions {
        timeout: Duration::from_millis(1000),
        ..WaitOptions::default()
    };
    let waited = wait(&applier, &e1, &quick).await.unwrap();
    assert_eq!(
        pending(&waited.status),
        ["email-gsi1-keys", "profile-primary-email"],
        "{waited:?}"
    );
    assert!(waited.checks > 1, "it polled: {waited:?}");
    drain(&runner).await;
    let waited = wait(&applier, &e1, &quick).await.unwrap();
    assert_eq!(waited.status, Status::Projected);
    let items = support::scan_all(&client, &table).await;
    let problems = oracle::differences(&spec_text("user-service.toml"), &items);
    assert!(problems.is_empty(), "{problems:#?}");

    // No longer primary, not applied yet: the profile still shows e1, so
    // e1 is pending though it no longer counts for the copy; deleted, not
    // applied yet: the same.
    // (The writer's put also dropped the item's index keys.)
    put_item(&client, &table, &email("u1", "e1", "Sam@X.org", false)).await;
    assert_eq!(
        pending(&check(&applier, &e1).await.unwrap()),
        ["email-gsi1-keys", "profile-primary-email"]
    );
    drain(&runner).await;
    assert_eq!(check(&applier, &e1).await.unwrap(), Status::Projected);
    put_item(&client, &table, &email("u1", "e1", "Sam@X.org", true)).await;
    drain(&runner).await;
    delete_item(
        &client,
        &table,
        attrs(&[("PK", s("USER#u1")), ("SK", s("EMAIL#e1"))]),
    )
    .await;
    assert_eq!(
        pending(&check(&applier, &e1).await.unwrap()),
        ["profile-primary-email"]
    );
    drain(&runner).await;
    assert_eq!(check(&applier, &e1).await.unwrap(), Status::Projected);

    // Poison: held at once, naming the letter.
    let mut bad = email("u1", "e2", "x", false);
    bad.insert(
        "email".into(),
        Av::M([("not".to_string(), s("text"))].into()),
    );
    put_item(&client, &table, &bad).await;
    drain(&runner).await;
    let e2 = key("USER#u1", "EMAIL#e2");
    let waited = wait(&applier, &e2, &WaitOptions::default()).await.unwrap();
    let Status::Held { letters } = &waited.status else {
        panic!("held, not {waited:?}");
    };
    assert_eq!(waited.checks, 1);
    assert!(
        letters
            .iter()
            .any(|(projection, error)| projection == "email-gsi1-keys" && error.contains("map")),
        "{letters:?}"
    );
    // Fixed, the fix waits behind the letter until the redrive.
    put_item(&client, &table, &email("u1", "e2", "kim@x.org", false)).await;
    drain(&runner).await;
    assert!(matches!(
        check(&applier, &e2).await.unwrap(),
        Status::Held { .. }
    ));
    applier.redrive(None).await.unwrap();
    assert_eq!(check(&applier, &e2).await.unwrap(), Status::Projected);
}

/// A follow: the inverse edge, the counters' marker, pending until the
/// worker runs; an unfollow: the edge pending removal until it runs again.
/// Through the CLI, a timeout exits 1 naming what is pending.
#[tokio::test]
async fn wait_follows_memberships_in_and_out_and_the_cli_names_what_is_pending() {
    // A large future: on the heap, not the test thread's stack.
    Box::pin(wait_follows_memberships_in_and_out_and_the_cli_names_what_is_pending_steps()).await;
}

async fn wait_follows_memberships_in_and_out_and_the_cli_names_what_is_pending_steps() {
    let (applier, client, table, runner) = setup("social-service.toml", "wait-social").await;
    let edge = key("USER#a", "FOLLOWS#b");
    put_item(&client, &table, &follow("a", "b", "2026-11-26")).await;
    // The counters ride on the inverse edge: its marker.
    let status = check(&applier, &edge).await.unwrap();
    assert_eq!(pending(&status), ["followed-by"], "{status:?}");
    let Status::Pending { pending: effects } = &status else {
        unreachable!()
    };
    assert!(
        effects[0].item == "USER#b / FOLLOWED_BY#a"
            && effects[0]
                .detail
                .contains("counted in followers, following"),
        "{effects:?}"
    );
    let spec_path = support::repo().join("projections/social-service.toml");
    // `wait` on this table with `keys` and options.
    let cli = |args: &[&str]| {
        std::process::Command::new(support::binary())
            .args([
                "wait",
                "--spec",
                spec_path.to_str().unwrap(),
                "--table",
                &table,
            ])
            .args(args)
            .envs(support::env())
            .output()
            .unwrap()
    };
    let edge_keys = ["--key", "PK=USER#a", "--key", "SK=FOLLOWS#b"];
    let output = cli(&[&edge_keys[..], &["--timeout", "300ms"]].concat());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("still pending") && stdout.contains("followed-by"),
        "{stdout}"
    );
    drain(&runner).await;
    assert_eq!(check(&applier, &edge).await.unwrap(), Status::Projected);
    let output = cli(&[&edge_keys[..], &["--timeout", "2s"]].concat());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("projected"), "{stdout}");

    // Unfollowed: the edge and the marker must go.
    delete_item(
        &client,
        &table,
        attrs(&[("PK", s("USER#a")), ("SK", s("FOLLOWS#b"))]),
    )
    .await;
    let status = check(&applier, &edge).await.unwrap();
    assert!(
        pending(&status).contains(&"followed-by".to_string()),
        "{status:?}"
    );
    drain(&runner).await;
    assert_eq!(check(&applier, &edge).await.unwrap(), Status::Projected);
    let output = cli(&["--key", "PK=USER#a"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--key SK=VALUE is needed"), "{stderr}");
    // A spec that does not load is an error, not "pending".
    let output = std::process::Command::new(support::binary())
        .args([
            "wait",
            "--spec",
            "no-such-spec.toml",
            "--key",
            "PK=USER#a",
            "--key",
            "SK=FOLLOWS#b",
        ])
        .envs(support::env())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// With the runner following the stream, the time from a write to `wait`
/// answering "projected": reported, and every answer agrees with a
/// consistent read judged by the oracle.
#[tokio::test]
async fn time_from_a_write_to_projected_with_the_runner() {
    // A large future: on the heap, not the test thread's stack.
    Box::pin(time_from_a_write_to_projected_with_the_runner_steps()).await;
}

async fn time_from_a_write_to_projected_with_the_runner_steps() {
    let spec: Arc<Spec> = support::shipped_spec("social-service.toml");
    let applier = control::applier(
        support::client().await,
        spec.clone(),
        &support::fresh_table(&support::client().await, &spec, "wait-lag").await,
        ApplyConfig::default(),
    );
    let (client, table) = (applier.client().clone(), applier.table().to_string());
    let runner = runner(&applier).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let text = spec_text("social-service.toml");
    let writes = async {
        let mut times = Vec::new();
        for i in 0..12 {
            let written = Instant::now();
            put_item(
                &client,
                &table,
                &follow(&format!("u{i}"), "b", "2026-11-26"),
            )
            .await;
            let waited = wait(
                &applier,
                &key(&format!("USER#u{i}"), "FOLLOWS#b"),
                &WaitOptions {
                    timeout: Duration::from_secs(20),
                    ..WaitOptions::default()
                },
            )
            .await
            .unwrap();
            assert_eq!(waited.status, Status::Projected, "follow {i}");
            times.push(written.elapsed());
            // Projected for this write: the table, read now, holds its
            // inverse edge and its marker.
            let items = support::scan_all(&client, &table).await;
            assert!(
                items.iter().any(|item| {
                    support::text(item, "PK").as_deref() == Some("USER#b")
                        && support::text(item, "SK").as_deref()
                            == Some(&format!("FOLLOWED_BY#u{i}"))
                }),
                "follow {i}: projected, but the edge is not there"
            );
        }
        let _ = stop.send(());
        times
    };
    let (ran, mut times) = tokio::join!(
        runner.run(
            RunOptions {
                poll_interval: Duration::from_millis(100),
                ..RunOptions::follow()
            },
            async {
                let _ = stopped.await;
            }
        ),
        writes
    );
    ran.expect("the runner");
    drain(&runner).await;
    let problems = oracle::differences(&text, &support::scan_all(&client, &table).await);
    assert!(problems.is_empty(), "{problems:#?}");
    times.sort();
    eprintln!(
        "timing: write to projected with the runner (poll 100 ms), {} writes: median {} ms, max {} ms",
        times.len(),
        times[times.len() / 2].as_millis(),
        times.last().unwrap().as_millis()
    );
}

/// Generated specs and histories: every record applied but the last ones
/// of one item X (the others' letters redriven), so the table holds what
/// an older state of X derived (a `when` since turned, a delete not yet
/// applied). Then `check(X)` must agree with the oracle judging the table,
/// read at once: "projected" only when the table is exact, "pending" only
/// when it is not, "held" only with a letter of X; and once X's records
/// are applied and redriven, "projected" and exact.
#[test]
fn wait_agrees_with_the_oracle_on_generated_specs_and_histories() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let cases = std::env::var("WAIT_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 50,
        ..Config::default()
    });
    let strategy = (
        super::specgen::specs(),
        prop::collection::vec(super::specgen::write(), 1..25),
        any::<u8>(),
        any::<u8>(),
    );
    let outcomes = std::sync::Mutex::new([0usize; 3]);
    let result = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            runner
                .run(&strategy, |(specs, writes, pick, split)| {
                    super::delivery::runtime().block_on(Box::pin(generated_case(
                        &specs.v2, &writes, pick, split, &outcomes,
                    )))
                })
                .map_err(|error| error.to_string())
                .map(|()| *outcomes.lock().unwrap())
        })
        .expect("a thread")
        .join()
        .expect("the property test thread");
    match result {
        Ok([projected, pending, held]) => eprintln!(
            "timing: wait on generated specs: {cases} cases, X answered projected {projected} times, pending {pending} times and held {held} times before its last records applied"
        ),
        Err(error) => panic!("{error}"),
    }
}

async fn generated_case(
    projections: &[super::specgen::Projection],
    writes: &[super::specgen::Write],
    pick: u8,
    split: u8,
    outcomes: &std::sync::Mutex<[usize; 3]>,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert;
    use proptest::test_runner::TestCaseError;
    let toml = super::specgen::spec_toml(projections);
    let spec = Arc::new(Spec::from_toml(&toml, "wait.toml").expect("filtered to compile"));
    let fixture = support::fixture(spec.clone(), "wait-gen").await;
    let (client, table, applier) = (fixture.client, fixture.table, fixture.applier);
    let mut history = super::model::History::default();
    super::specgen::play(&mut history, writes);
    let keys: Vec<ItemKey> = history
        .records
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|r| spec.table.item_key(&r.keys).expect("keyed"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let Some(x) = keys.get(usize::from(pick) % keys.len().max(1)).cloned() else {
        return Ok(()); // Nothing written.
    };
    let of_x = |r: &super::model::Record| {
        r.as_ref()
            .ok()
            .and_then(|r| spec.table.item_key(&r.keys))
            .as_ref()
            == Some(&x)
    };
    let options = ddb_projector::apply::BatchOptions::default();
    let redrive = || async {
        applier
            .redrive(None)
            .await
            .map_err(|e| TestCaseError::fail(format!("redrive: {e}")))
    };
    // Written and applied one by one as a live worker would, but X's
    // records after its first `split` are held back: the table holds
    // what an older state of X derived (a `when` since turned, a delete
    // not applied yet), and later records of other items may or may not
    // have recomputed what X moves.
    let split = usize::from(split) % (history.records.iter().filter(|r| of_x(r)).count() + 1);
    let mut writer = super::delivery::Writer {
        client: &client,
        table: &table,
        history: &history,
        written: 0,
    };
    let mut held_back = Vec::new();
    let mut seen_x = 0;
    for (i, record) in history.records.iter().enumerate() {
        writer.write_until(i + 1).await;
        if of_x(record) {
            seen_x += 1;
            if seen_x > split {
                held_back.push(record.clone());
                continue;
            }
        }
        super::delivery::apply_with(&applier, std::slice::from_ref(record), &options).await?;
    }
    // The others' letters redriven, unless X has letters too (a redrive
    // would bring X to its current state).
    let lettered = |letters: &[ddb_projector::apply::DeadLetter]| {
        letters.iter().any(|l| l.source_key.as_ref() == Some(&x))
    };
    let x_lettered = lettered(&applier.dead_letter_store().list().await.unwrap());
    if !x_lettered {
        redrive().await?;
    }
    let status = check(&applier, &x)
        .await
        .map_err(|e| TestCaseError::fail(format!("check: {e}")))?;
    let problems = oracle::differences(&toml, &support::scan_all(&client, &table).await);
    match &status {
        _ if x_lettered => {
            outcomes.lock().unwrap()[2] += 1;
            prop_assert!(
                matches!(status, Status::Held { .. }),
                "{} has letters, but answered {:?}",
                x,
                status
            );
        }
        Status::Projected => {
            outcomes.lock().unwrap()[0] += 1;
            prop_assert!(
                problems.is_empty(),
                "{} answered projected, but the table is not exact:\n  {}",
                x,
                problems.join("\n  ")
            );
        }
        Status::Pending { pending } => {
            outcomes.lock().unwrap()[1] += 1;
            prop_assert!(
                !problems.is_empty(),
                "{} answered pending ({:?}), but the table is exact",
                x,
                pending
            );
        }
        Status::Held { letters } => {
            return Err(TestCaseError::fail(format!(
                "{x} held, but it has no letter: {letters:?}"
            )));
        }
    }
    super::delivery::apply_with(&applier, &held_back, &options).await?;
    redrive().await?;
    let status = check(&applier, &x)
        .await
        .map_err(|e| TestCaseError::fail(format!("check: {e}")))?;
    prop_assert!(
        status == Status::Projected,
        "{} after its records: {:?}",
        x,
        status
    );
    let problems = oracle::differences(&toml, &support::scan_all(&client, &table).await);
    prop_assert!(problems.is_empty(), "{}", problems.join("\n  "));
    // Every poison item was fixed by a later write: nothing is left.
    let letters = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|e| TestCaseError::fail(format!("listing letters: {e}")))?;
    prop_assert!(letters.is_empty(), "left after the redrive: {:?}", letters);
    Ok(())
}
