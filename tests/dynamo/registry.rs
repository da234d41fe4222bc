//! A registry of specs on DynamoDB Local: several services' specs served
//! by one deployment.
//!
//! - Generated specs split into two teams' files on one table give, composed,
//!   exactly what each gives on its own copy of the table, and what the
//!   oracle computes from the whole.
//! - One Lambda handler serving two tables routes each record to its
//!   table's spec, and fails a batch of a table no spec describes.
//! - `check --spec DIR` refuses conflicting specs, naming both files.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::ApplyConfig;
use ddb_projector::control;
use ddb_projector::dynamo::names::{RECORDS_ATTRIBUTE, RESERVED_PREFIX};
use ddb_projector::lambda::event::{Payload, StreamsEvent};
use ddb_projector::lambda::{Handler, Response};
use ddb_projector::record::ChangeKind;
use ddb_projector::spec::{Spec, SpecSet};
use lambda_runtime::Diagnostic;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use super::delivery::{deliver, delivery, runtime, snapshot, Delivery, Writer};
use super::model::{change, email, follow, profile, put_item, Attrs, History};
use super::oracle;
use super::specgen::{play, spec_toml, specs, write, Kind, Projection, Write};
use super::support::{self, s};

/// Cases unless `REGISTRY_CASES` says otherwise.
const CASES: u32 = 10;

/// Dead letters whose service the cases checked.
static LETTERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Two teams' files from one generated spec: the projections `split`
/// marks go to team a, the rest to team b, a rollup with its counter.
fn split(projections: &[Projection], split: &[bool]) -> (Vec<Projection>, Vec<Projection>) {
    let team_a = |p: &Projection| -> bool {
        let id = match p.kind {
            Kind::Rollup { counter, .. } => projections
                .iter()
                .position(|q| q.id == counter)
                .unwrap_or(0),
            _ => projections.iter().position(|q| q.id == p.id).unwrap_or(0),
        };
        split[id % split.len()]
    };
    projections.iter().cloned().partition(team_a)
}

fn team(projections: &[Projection], service: &str) -> String {
    spec_toml(projections).replace(
        "service = \"generated\"",
        &format!("service = \"{service}\""),
    )
}

/// What a table holds for readers: every item outside the reserved
/// partitions, keyed.
fn visible(items: Vec<Attrs>, kinesis: bool) -> BTreeMap<(String, String), Attrs> {
    items
        .into_iter()
        .filter(|i| !support::text(i, "PK").is_some_and(|pk| pk.starts_with(RESERVED_PREFIX)))
        .map(|mut i| {
            // A shard's `changes` stamp counts the transactions that moved
            // it, not its state. On a Kinesis delivery each batch derives
            // its items as they are when read, and how one count's moves
            // fall into transactions differs with the other projections of
            // the batch (alone or composed); the counts are still compared.
            if kinesis {
                i.remove("changes");
            }
            (History::key(&i), i)
        })
        .collect()
}

/// What two tables projected by the two teams alone hold together: each
/// item with the attributes either derived, counter records merged.
fn together(
    a: &BTreeMap<(String, String), Attrs>,
    b: &BTreeMap<(String, String), Attrs>,
) -> BTreeMap<(String, String), Attrs> {
    let mut out = a.clone();
    for (key, item) in b {
        let merged = out.entry(key.clone()).or_default();
        for (name, value) in item {
            match (name.as_str(), merged.get_mut(name), value) {
                (RECORDS_ATTRIBUTE, Some(Av::M(mine)), Av::M(theirs)) => {
                    mine.extend(theirs.clone())
                }
                _ => {
                    merged.insert(name.clone(), value.clone());
                }
            }
        }
    }
    out
}

fn differences(
    a: &BTreeMap<(String, String), Attrs>,
    b: &BTreeMap<(String, String), Attrs>,
) -> String {
    let keys: BTreeSet<&(String, String)> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("  {k:?}: {:?}\n    vs {:?}", a.get(k), b.get(k)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes the history to `table` as `plan` delivers it to `spec`'s
/// applier, then redrives what was dead-lettered while poison.
async fn project(
    spec: Arc<Spec>,
    table: &str,
    history: &History,
    plan: &Delivery,
    a_names: &BTreeSet<String>,
) -> Result<Vec<Attrs>, TestCaseError> {
    let client = support::client().await;
    let applier = control::applier(client.clone(), spec, table, ApplyConfig::default());
    let mut writer = Writer {
        client: &client,
        table,
        history,
        written: 0,
    };
    deliver(&applier, &mut writer, 0, plan).await?;
    // Letters name the service that registered their projection.
    let letters = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|error| TestCaseError::fail(format!("listing letters: {error}")))?;
    LETTERS.fetch_add(letters.len(), std::sync::atomic::Ordering::Relaxed);
    for letter in &letters {
        let team = if a_names.contains(&letter.projection) {
            "team-a"
        } else {
            "team-b"
        };
        prop_assert_eq!(
            letter.service.as_deref(),
            Some(team),
            "the letter of `{}` on {}",
            &letter.projection,
            table
        );
    }
    applier
        .redrive(None)
        .await
        .map_err(|error| TestCaseError::fail(format!("redrive on {table}: {error}")))?;
    let left = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|error| TestCaseError::fail(format!("listing letters: {error}")))?;
    prop_assert!(
        left.is_empty(),
        "left after the redrive on {}: {:#?}",
        table,
        left
    );
    Ok(snapshot(&client, table).await)
}

async fn composed_case(
    projections: &[Projection],
    marks: &[bool],
    writes: &[Write],
    plan: &Delivery,
) -> Result<(), TestCaseError> {
    let (a, b) = split(projections, marks);
    if a.is_empty() || b.is_empty() {
        return Err(TestCaseError::reject("one team has no projection"));
    }
    let (text_a, text_b) = (team(&a, "team-a"), team(&b, "team-b"));
    let (Ok(alone_a), Ok(alone_b)) = (
        Spec::from_toml(&text_a, "a.toml"),
        Spec::from_toml(&text_b, "b.toml"),
    ) else {
        return Err(TestCaseError::reject(
            "a team's part does not compile alone",
        ));
    };
    let set = SpecSet::from_texts(&[
        ("a.toml".to_string(), text_a.clone()),
        ("b.toml".to_string(), text_b.clone()),
    ])
    .map_err(|errors| TestCaseError::fail(format!("the parts do not compose: {errors}")))?;
    prop_assert_eq!(set.specs().len(), 1, "one table, one composed spec");
    let composed = set.specs()[0].clone();
    let client = support::client().await;
    let tables = [
        support::fresh_table(&client, &composed, "reg-a").await,
        support::fresh_table(&client, &composed, "reg-b").await,
        support::fresh_table(&client, &composed, "reg-ab").await,
    ];
    let mut history = History::default();
    play(&mut history, writes);
    let a_names: BTreeSet<String> = a.iter().map(Projection::name).collect();
    let items_a = project(Arc::new(alone_a), &tables[0], &history, plan, &a_names).await?;
    let items_b = project(Arc::new(alone_b), &tables[1], &history, plan, &a_names).await?;
    let items_ab = project(composed, &tables[2], &history, plan, &a_names).await?;
    for (toml, items, who) in [
        (&text_a, &items_a, "team a alone"),
        (&text_b, &items_b, "team b alone"),
    ] {
        let problems = oracle::differences(toml, items);
        prop_assert!(
            problems.is_empty(),
            "{who}: the table differs from its spec:\n  {}",
            problems.join("\n  ")
        );
    }
    let whole: Vec<Projection> = a.iter().chain(&b).cloned().collect();
    let problems = oracle::differences(&spec_toml(&whole), &items_ab);
    prop_assert!(
        problems.is_empty(),
        "composed: the table differs from the two specs together:\n  {}",
        problems.join("\n  ")
    );
    let expected = together(
        &visible(items_a, plan.kinesis),
        &visible(items_b, plan.kinesis),
    );
    let got = visible(items_ab, plan.kinesis);
    prop_assert!(
        got == expected,
        "composed, the table is not what the two teams give alone:\n{}",
        differences(&expected, &got)
    );
    for table in &tables {
        client.delete_table().table_name(table).send().await.ok();
    }
    Ok(())
}

/// Generated specs split into two teams' files on one table: composed,
/// the table is exactly what each team's spec gives on its own copy,
/// under Lambda's deliveries (batches, crashes, bisection, redelivery).
#[test]
fn two_specs_on_one_table_give_what_each_gives_alone() {
    let cases = std::env::var("REGISTRY_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/dynamo/properties/registry.txt",
        ))),
        max_shrink_iters: 50,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let started = Instant::now();
    let result = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let strategy = (
                specs(),
                prop::collection::vec(any::<bool>(), 8),
                prop::collection::vec(write(), 10..60),
                delivery(),
            );
            runner
                .run(&strategy, |(specs, marks, writes, plan)| {
                    runtime().block_on(Box::pin(composed_case(&specs.v1, &marks, &writes, &plan)))
                })
                .map_err(|error| error.to_string())
        })
        .expect("a thread")
        .join()
        .expect("the property test thread");
    eprintln!(
        "timing: two specs on one table: {cases} cases took {:.1} s; {} dead letters named their service",
        started.elapsed().as_secs_f64(),
        LETTERS.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Err(error) = result {
        panic!("{error}");
    }
}

fn shipped_text(name: &str, table: &str) -> String {
    let text = std::fs::read_to_string(support::repo().join("projections").join(name)).unwrap();
    let start = text.find("[table]\nname = \"").expect("a table name") + "[table]\nname = \"".len();
    let end = start + text[start..].find('"').unwrap();
    format!("{}{table}{}", &text[..start], &text[end..])
}

/// A marketing team's spec on `table` that also copies the primary email
/// onto the profile, as user-service does.
fn rival(table: &str) -> String {
    r#"
service = "marketing"
[table]
name = "TABLE"
[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"
[[projections]]
name = "marketing-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = true }
copy = { email = "{email}" }
"#
    .replace("TABLE", table)
}

fn stream_arn(table: &str) -> String {
    format!("arn:aws:dynamodb:us-east-1:000000000000:table/{table}/stream/2026-11-26T00:00:00.000")
}

fn context() -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.request_id = "registry".to_string();
    context.deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    context
}

async fn invoke(handler: &Handler, payload: Payload) -> Result<usize, (String, String)> {
    let handled = Box::pin(handler.handle(lambda_runtime::LambdaEvent::new(payload, context())));
    match handled.await {
        Ok(Response::Stream(answer)) => Ok(answer.batch_item_failures.len()),
        Ok(other) => panic!("a stream answer, not {other:?}"),
        Err(error) => {
            let diagnostic = Diagnostic::from(error);
            Err((diagnostic.error_type, diagnostic.error_message))
        }
    }
}

/// One handler, the social and user services' specs on two tables: each
/// batch is routed by its stream's table to that table's spec; a batch of
/// a table no spec describes fails whole, naming the tables served.
#[tokio::test]
async fn one_lambda_handler_routes_each_table_to_its_spec() {
    let client = support::client().await;
    let social_table = support::unique_table("reg-social");
    let user_table = support::unique_table("reg-user");
    let set = SpecSet::from_texts(&[
        (
            "social-service.toml".to_string(),
            shipped_text("social-service.toml", &social_table),
        ),
        (
            "user-service.toml".to_string(),
            shipped_text("user-service.toml", &user_table),
        ),
    ])
    .expect("the shipped specs compose");
    assert_eq!(set.specs().len(), 2);
    for spec in set.specs() {
        ddb_projector::table::create_table(&client, spec, &spec.table.name)
            .await
            .expect("table created");
    }
    let config = support::sdk_config().await;
    let handler = Handler {
        specs: set,
        client: aws_sdk_dynamodb::Client::new(&config),
        table: None,
        margin: Duration::from_millis(1500),
        config: ApplyConfig::default(),
        metrics: None,
        process_started: SystemTime::now(),
        registered: None,
        regions: Default::default(),
    };

    let edge = follow("a", "b", "2026-11-26");
    put_item(&client, &social_table, &edge).await;
    let mail = email("u1", "e1", "sam@x.org", true);
    put_item(&client, &user_table, &profile("u1")).await;
    put_item(&client, &user_table, &mail).await;
    let social = Payload::Stream(StreamsEvent::from_records(
        vec![change(1, ChangeKind::Insert, None, Some(&edge))],
        Some(stream_arn(&social_table)),
    ));
    let user = Payload::Stream(StreamsEvent::from_records(
        vec![change(2, ChangeKind::Insert, None, Some(&mail))],
        Some(stream_arn(&user_table)),
    ));
    assert_eq!(invoke(&handler, social).await, Ok(0));
    assert_eq!(invoke(&handler, user).await, Ok(0));

    let reverse = support::get(&client, &social_table, "USER#b", "FOLLOWED_BY#a").await;
    assert!(reverse.is_some(), "the social spec projected the follow");
    let profile_item = support::get(&client, &user_table, "USER#u1", "PROFILE")
        .await
        .expect("the profile");
    assert_eq!(
        profile_item.get("email"),
        Some(&s("sam@x.org")),
        "the user spec copied the primary email: {profile_item:?}"
    );
    // Neither spec wrote onto the other's table.
    assert!(
        support::get(&client, &user_table, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_none()
    );
    let stray = visible(support::scan_all(&client, &social_table).await, false);
    assert!(
        stray.keys().all(|(_, sk)| !sk.starts_with("EMAIL#")),
        "{stray:?}"
    );

    let elsewhere = Payload::Stream(StreamsEvent::from_records(
        vec![change(3, ChangeKind::Insert, None, Some(&edge))],
        Some(stream_arn("SomeoneElsesTable")),
    ));
    let (kind, message) = invoke(&handler, elsewhere).await.expect_err("refused");
    assert_eq!(kind, "Projector.UnregisteredTable");
    assert!(
        message.contains("`SomeoneElsesTable`") && message.contains(&social_table),
        "{message}"
    );
}

/// `check --spec DIR`: a directory of compatible specs passes, listing
/// who registered each projection; two specs deriving one attribute of one
/// entity fail, naming both files.
#[test]
fn check_refuses_conflicting_specs_naming_both_files() {
    let dir = std::env::temp_dir().join(format!("ddbp-registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let user = shipped_text("user-service.toml", "Shared");
    let social = shipped_text("social-service.toml", "Shared");
    std::fs::write(dir.join("user-service.toml"), &user).unwrap();
    std::fs::write(dir.join("social-service.toml"), &social).unwrap();
    let check = |dir: &std::path::Path| {
        Command::new(support::binary())
            .args(["check", "--spec"])
            .arg(dir)
            .output()
            .expect("the binary runs")
    };
    let ok = check(&dir);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        stdout.contains("registered by social-service") && stdout.contains("[user-service]"),
        "{stdout}"
    );
    // A third team also copies the primary email onto the profile.
    std::fs::write(dir.join("marketing.toml"), rival("Shared")).unwrap();
    let refused = check(&dir);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("marketing.toml") && stderr.contains("user-service.toml"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A runner of `spec` on `table` as consumer `consumer`.
async fn consumer_runner(
    table: &str,
    spec: Arc<Spec>,
    consumer: &str,
) -> ddb_projector::source::StreamRunner {
    let client = support::client().await;
    let (arn, _) = ddb_projector::dynamo::client::require_stream(&client, table)
        .await
        .expect("the table has a stream");
    let config = ApplyConfig {
        stream_consumer: true,
        consumer: Some(consumer.to_string()),
        clock_skew: Duration::ZERO,
        ..ApplyConfig::default()
    };
    ddb_projector::source::StreamRunner::new(
        control::applier(client, spec, table, config),
        aws_sdk_dynamodbstreams::Client::new(&support::sdk_config().await),
        &arn,
    )
}

/// Two deployments with different specs on one table, each its own named
/// consumer: each runner reads the stream from its own checkpoints, so
/// neither skips what only the other applies; each team's backfill makes
/// its projections live while the other team's consumer runs without
/// them; and neither team's `status` or `prune` takes the other's
/// projections for retired ones.
#[tokio::test]
async fn two_consumers_of_one_table_keep_their_own_checkpoints() {
    use ddb_projector::backfill::{backfill, BackfillOptions};
    use ddb_projector::control::{self, ClaimOutcome, Registry, State};
    use ddb_projector::source::RunOptions;

    let client = support::client().await;
    let table = support::unique_table("reg-consumers");
    let users_text = shipped_text("user-service.toml", &table);
    let social_text = shipped_text("social-service.toml", &table);
    let users = Arc::new(Spec::from_toml(&users_text, "user-service.toml").unwrap());
    let social = Arc::new(Spec::from_toml(&social_text, "social-service.toml").unwrap());
    let both = SpecSet::from_texts(&[
        ("user-service.toml".to_string(), users_text),
        ("social-service.toml".to_string(), social_text),
    ])
    .unwrap();
    ddb_projector::table::create_table(&client, &both.specs()[0], &table)
        .await
        .unwrap();
    let users_runner = consumer_runner(&table, users.clone(), "users").await;
    let social_runner = consumer_runner(&table, social.clone(), "social").await;

    put_item(&client, &table, &profile("u1")).await;
    put_item(&client, &table, &email("u1", "e1", "sam@x.org", true)).await;
    put_item(&client, &table, &profile("b")).await;
    for follower in ["a", "c"] {
        put_item(&client, &table, &follow(follower, "b", "2026-11-26")).await;
    }
    let drain = || RunOptions {
        poll_interval: Duration::from_millis(50),
        ..RunOptions::drain()
    };
    // The users' runner reads first and checkpoints past every record.
    Box::pin(users_runner.run(drain(), std::future::pending()))
        .await
        .expect("the users' runner");
    Box::pin(social_runner.run(drain(), std::future::pending()))
        .await
        .expect("the social runner");

    let profile_item = support::get(&client, &table, "USER#u1", "PROFILE")
        .await
        .unwrap();
    assert_eq!(profile_item.get("email"), Some(&s("sam@x.org")));
    assert!(
        support::get(&client, &table, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the social runner applied what the users' runner had read past"
    );
    let followers = super::model::user_counter(&client, &table, &social, "followers", "b").await;
    assert_eq!(followers, 2);
    let partitions: BTreeSet<String> = support::scan_all(&client, &table)
        .await
        .iter()
        .filter_map(|i| support::text(i, "PK"))
        .filter(|pk| pk.starts_with("_ddbp#checkpoint"))
        .collect();
    assert_eq!(
        partitions,
        BTreeSet::from([
            "_ddbp#checkpoint@social".to_string(),
            "_ddbp#checkpoint@users".to_string()
        ])
    );

    // Each team backfills its own; both consumers' leases run meanwhile.
    for (spec, consumer) in [(&users, "users"), (&social, "social")] {
        let config = ApplyConfig {
            consumer: Some(consumer.to_string()),
            clock_skew: Duration::ZERO,
            ..ApplyConfig::default()
        };
        let applier = control::applier(client.clone(), spec.clone(), &table, config);
        let registry = Registry::new(client.clone(), &table, &spec.table).with_skew(0);
        let ids = spec.backfilled_projections();
        let run = format!("{consumer}-1");
        let claimed = registry.claim(spec, &ids, &run).await.unwrap();
        assert_eq!(claimed, ClaimOutcome::Claimed, "{consumer}");
        let summary = Box::pin(backfill(
            &applier,
            &BackfillOptions {
                projections: Some(ids),
                progress: false,
                run: Some(run),
                ..BackfillOptions::default()
            },
        ))
        .await
        .unwrap();
        assert!(
            summary.not_backfilled.is_empty(),
            "{consumer}: the other team's consumer kept its projections from live: {:?}",
            summary.not_backfilled
        );
    }
    for (spec, consumer) in [(&users, "users"), (&social, "social")] {
        let registry = Registry::new(client.clone(), &table, &spec.table);
        let snapshot = registry.snapshot(spec).await.unwrap();
        let commands = control::Commands {
            consumer: Some(consumer.to_string()),
            ..control::Commands::default()
        };
        let rows = control::states(
            spec,
            &snapshot,
            ddb_projector::dynamo::time::now_ms(),
            0,
            &std::collections::HashMap::new(),
            &commands,
        );
        for row in &rows {
            assert!(
                spec.projection_id(&row.name).is_some(),
                "{consumer}: `{}` of the other team listed as {:?}",
                row.name,
                row.state
            );
            assert_eq!(row.state, State::Live, "{consumer}: {row:?}");
        }
        assert_eq!(rows.len(), spec.projections.len());
    }
}

/// A consumer whose spec conflicts with the spec another named consumer
/// runs on the table: `check --table` and `run` refuse it, naming both and
/// the conflict (a running Lambda logs it: refusing its batches would send
/// them to the failure queue); one running the same definitions beside it
/// (a consumer renamed, for a lease) is no conflict; nor is writing onto
/// another consumer's reverse items missed, which composing would allow.
#[tokio::test]
async fn a_consumer_conflicting_with_another_is_refused() {
    use ddb_projector::apply::BatchOptions;
    use ddb_projector::control::Registry;

    let client = support::client().await;
    let table = support::unique_table("reg-conflict");
    let users = Arc::new(
        Spec::from_toml(
            &shipped_text("user-service.toml", &table),
            "user-service.toml",
        )
        .unwrap(),
    );
    let social = Arc::new(
        Spec::from_toml(
            &shipped_text("social-service.toml", &table),
            "social-service.toml",
        )
        .unwrap(),
    );
    let marketing = Arc::new(Spec::from_toml(&rival(&table), "marketing.toml").unwrap());
    // Another team keys the reverse follow items for an index of its own.
    let tagger = Arc::new(
        Spec::from_toml(
            &format!(
                r#"
service = "tagging"
[table]
name = "{table}"
[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"
[entities.followed_by]
pk = "USER#{{followeeId}}"
sk = "FOLLOWED_BY#{{followerId}}"
[[projections]]
name = "follower-keys"
kind = "index-keys"
entity = "followed_by"
set = {{ GSI1PK = "FAN#{{followerId}}" }}
"#
            ),
            "tagging.toml",
        )
        .unwrap(),
    );
    ddb_projector::table::create_table(&client, &social, &table)
        .await
        .unwrap();
    // `users` and `social` run (a batch each takes their leases).
    let mail = email("u1", "e1", "sam@x.org", true);
    put_item(&client, &table, &mail).await;
    let batch = vec![change(1, ChangeKind::Insert, None, Some(&mail))];
    for (spec, consumer) in [(&users, "users"), (&social, "social")] {
        let applier = control::applier(
            client.clone(),
            spec.clone(),
            &table,
            ApplyConfig {
                stream_consumer: true,
                consumer: Some(consumer.to_string()),
                ..ApplyConfig::default()
            },
        );
        Box::pin(applier.apply_batch(&batch, &BatchOptions::default()))
            .await
            .unwrap();
    }
    let registry = Registry::new(client.clone(), &table, &users.table);
    let conflicts = |spec: Arc<Spec>, consumer: &'static str| {
        let registry = &registry;
        async move {
            registry
                .consumer_conflicts(&spec, Some(consumer))
                .await
                .unwrap()
                .join("\n")
        }
    };
    let text = conflicts(marketing.clone(), "marketing").await;
    assert!(
        text.contains("conflicts with the spec consumer `users` runs")
            && text.contains("write `email` on entity `profile`")
            && text.contains("`marketing-email`")
            && text.contains("`profile-primary-email`")
            && !text.contains("consumer `social`"),
        "{text}"
    );
    let text = conflicts(tagger.clone(), "tagging").await;
    assert!(
        text.contains("conflicts with the spec consumer `social` runs")
            && text.contains("`follower-keys` writes onto entity `followed_by`, the reverse items of consumer `social`'s inverse edge `followed-by`"),
        "{text}"
    );
    // The same definitions under another name run beside it.
    assert_eq!(conflicts(users.clone(), "main").await, "");

    // `run` refuses to start; `check --table` refuses the deploy.
    let dir = std::env::temp_dir().join(format!("ddbp-conflict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("marketing.toml");
    std::fs::write(&file, rival(&table)).unwrap();
    for args in [vec!["run", "--drain"], vec!["check"]] {
        let out = Command::new(support::binary())
            .args(&args)
            .arg("--spec")
            .arg(&file)
            .args(["--table", &table, "--consumer", "marketing"])
            .envs(support::env())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("conflicts with the spec consumer `users` runs"),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A team joining a running registry: its spec composed with the running
/// team's changes none of the running team's definitions, so those stay
/// live, and only the new team's projections ask for a backfill.
#[tokio::test]
async fn a_team_joining_the_table_sends_no_one_else_back_to_a_backfill() {
    use ddb_projector::backfill::{backfill, BackfillOptions};
    use ddb_projector::control::{self, ClaimOutcome, Registry, State};

    let client = support::client().await;
    let table = support::unique_table("reg-join");
    let users_text = shipped_text("user-service.toml", &table);
    let social_text = shipped_text("social-service.toml", &table);
    let alone = SpecSet::from_texts(&[("user-service.toml".to_string(), users_text.clone())])
        .unwrap()
        .specs()[0]
        .clone();
    let joined = SpecSet::from_texts(&[
        ("user-service.toml".to_string(), users_text),
        ("social-service.toml".to_string(), social_text),
    ])
    .unwrap()
    .specs()[0]
        .clone();
    ddb_projector::table::create_table(&client, &joined, &table)
        .await
        .unwrap();
    put_item(&client, &table, &profile("u1")).await;
    put_item(&client, &table, &email("u1", "e1", "sam@x.org", true)).await;
    put_item(&client, &table, &follow("a", "u1", "2026-11-26")).await;
    let config = ApplyConfig {
        stream_consumer: true,
        clock_skew: Duration::ZERO,
        lease: Duration::from_millis(400),
        ..ApplyConfig::default()
    };
    let states = |spec: Arc<Spec>| {
        let client = client.clone();
        let table = table.clone();
        async move {
            let registry = Registry::new(client, &table, &spec.table);
            let snapshot = registry.snapshot(&spec).await.unwrap();
            control::states(
                &spec,
                &snapshot,
                ddb_projector::dynamo::time::now_ms(),
                0,
                &std::collections::HashMap::new(),
                &control::Commands::default(),
            )
            .into_iter()
            .map(|row| (row.name, row.state))
            .collect::<BTreeMap<String, State>>()
        }
    };
    let backfilled = |spec: Arc<Spec>, run: &'static str| {
        let client = client.clone();
        let table = table.clone();
        let config = config.clone();
        async move {
            let applier = control::applier(client.clone(), spec.clone(), &table, config);
            let registry = Registry::new(client, &table, &spec.table).with_skew(0);
            let ids: Vec<usize> = states(spec.clone())
                .await
                .into_iter()
                .filter(|(_, state)| *state != State::Live)
                .filter_map(|(name, _)| spec.projection_id(&name))
                .collect();
            for _ in 0..50 {
                match registry.claim(&spec, &ids, run).await.unwrap() {
                    ClaimOutcome::Claimed => break,
                    ClaimOutcome::Wait { .. } => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    other => panic!("{other:?}"),
                }
            }
            let summary = Box::pin(backfill(
                &applier,
                &BackfillOptions {
                    projections: Some(ids.clone()),
                    progress: false,
                    run: Some(run.to_string()),
                    ..BackfillOptions::default()
                },
            ))
            .await
            .unwrap();
            assert!(
                summary.not_backfilled.is_empty(),
                "{run}: {:?}",
                summary.not_backfilled
            );
            ids.iter()
                .map(|&id| spec.projections[id].name.clone())
                .collect::<BTreeSet<_>>()
        }
    };
    // The users' team alone: deployed (a batch as its consumer), backfilled.
    let worker = control::applier(client.clone(), alone.clone(), &table, config.clone());
    let batch = vec![change(1, ChangeKind::Insert, None, Some(&profile("u1")))];
    Box::pin(worker.apply_batch(&batch, &Default::default()))
        .await
        .unwrap();
    backfilled(alone.clone(), "users-1").await;
    assert!(states(alone.clone())
        .await
        .values()
        .all(|s| *s == State::Live));

    // The social team joins: the composed spec's worker replaces it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let worker = control::applier(client.clone(), joined.clone(), &table, config.clone());
    Box::pin(worker.apply_batch(&batch, &Default::default()))
        .await
        .unwrap();
    let after = states(joined.clone()).await;
    for projection in &alone.projections {
        assert_eq!(
            after[&projection.name],
            State::Live,
            "{}: {after:?}",
            projection.name
        );
    }
    let asked = backfilled(joined.clone(), "joined-1").await;
    let social: BTreeSet<String> = joined
        .projections
        .iter()
        .filter(|p| joined.service_of(&p.name) == "social-service")
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(
        asked, social,
        "only the joining team's projections are backfilled"
    );
    assert!(states(joined).await.values().all(|s| *s == State::Live));
}
