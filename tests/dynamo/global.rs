//! Global tables: one region projects, the others write nothing (see
//! `ddb_projector::global`). DynamoDB Local has no replicas: the
//! `DescribeTable` answers list them the way DynamoDB does for a global
//! table, injected as the fault tests inject errors.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{MultiRegionConsistency, ReplicaDescription, ReplicaStatus};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use ddb_projector::apply::ApplyConfig;
use ddb_projector::audit::{audit, AuditOptions};
use ddb_projector::control;
use ddb_projector::lambda::event::{Payload, StreamsEvent};
use ddb_projector::lambda::{Handler, Regions, Response};
use ddb_projector::record::ChangeKind;
use ddb_projector::source::stream::{RunOptions, StreamRunner};
use ddb_projector::spec::Spec;
use lambda_runtime::diagnostic::Diagnostic;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use super::delivery::runtime;
use super::model::{attrs, change, delete_item, put_item, Attrs, History};
use super::oracle;
use super::replication::{GlobalTable, Region};
use super::specgen::{play, spec_toml, specs, write, Entity, Kind, Projection, Source, Write};
use super::support::{self, s};

/// Lists `regions` as the table's replicas in every `DescribeTable`
/// answer, and the multi-region strong consistency mode when `strong`.
#[derive(Debug, Clone)]
pub(super) struct Replicas {
    pub(super) regions: Vec<&'static str>,
    pub(super) strong: bool,
}

impl Intercept for Replicas {
    fn name(&self) -> &'static str {
        "Replicas"
    }

    fn modify_before_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Ok(output)) = context.output_or_error_mut() else {
            return Ok(());
        };
        let Some(described) = output.downcast_mut::<DescribeTableOutput>() else {
            return Ok(());
        };
        if let Some(table) = described.table.as_mut() {
            table.replicas = Some(
                self.regions
                    .iter()
                    .map(|region| {
                        ReplicaDescription::builder()
                            .region_name(*region)
                            .replica_status(ReplicaStatus::Active)
                            .build()
                    })
                    .collect(),
            );
            if self.strong {
                table.multi_region_consistency = Some(MultiRegionConsistency::Strong);
            }
        }
        Ok(())
    }
}

/// A handler of the social spec on `table`, in `region`, given `home`,
/// whose table answers `DescribeTable` with `replicas`.
async fn handler(table: &str, replicas: Replicas, region: &str, home: Option<&str>) -> Handler {
    let config = support::sdk_config().await;
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(replicas)
            .build(),
    );
    Handler {
        specs: support::shipped_spec("social-service.toml").into(),
        client,
        table: Some(table.to_string()),
        margin: Duration::from_millis(1500),
        config: ApplyConfig::default(),
        metrics: None,
        process_started: SystemTime::now(),
        registered: None,
        regions: Regions::new(
            region.to_string(),
            home.map(str::to_string),
            ddb_projector::global::Writers::HomeOnly,
        ),
    }
}

fn context() -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.request_id = "global".to_string();
    context.deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    context
}

/// A follow of b by a, written to the table, and its stream record.
async fn follow(client: &aws_sdk_dynamodb::Client, table: &str) -> Payload {
    follow_of(client, table, "b").await
}

/// A follow of `followee` by a, written to the table, and its stream
/// record.
async fn follow_of(client: &aws_sdk_dynamodb::Client, table: &str, followee: &str) -> Payload {
    let edge = attrs(&[
        ("PK", s("USER#a")),
        ("SK", s(&format!("FOLLOWS#{followee}"))),
        ("followedAt", s("2026-11-26")),
    ]);
    put_item(client, table, &edge).await;
    Payload::Stream(StreamsEvent::from_records(
        vec![change(1, ChangeKind::Insert, None, Some(&edge))],
        None,
    ))
}

/// What the handler answers: the batch's failures, or the error's type
/// and message.
async fn invoke(handler: &Handler, payload: Payload) -> Result<Vec<String>, (String, String)> {
    let handled = Box::pin(handler.handle(lambda_runtime::LambdaEvent::new(payload, context())));
    match handled.await {
        Ok(Response::Stream(answer)) => Ok(answer
            .batch_item_failures
            .iter()
            .filter_map(|f| f.item_identifier.clone())
            .collect()),
        Ok(other) => panic!("a stream answer, not {other:?}"),
        Err(error) => {
            let diagnostic = Diagnostic::from(error);
            Err((diagnostic.error_type, diagnostic.error_message))
        }
    }
}

/// Items other than the written edge: what the projector derived.
async fn derived(client: &aws_sdk_dynamodb::Client, table: &str) -> usize {
    support::scan_all(client, table)
        .await
        .iter()
        .filter(|item| {
            !support::text(item, "SK").is_some_and(|sk| sk.starts_with("FOLLOWS#"))
                && !support::text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#lifecycle"))
        })
        .count()
}

/// On a global table the Lambda projects in its home region only: without
/// a home region (or with one the table is not in) every batch fails with
/// the reason and writes nothing; outside the home region a batch is
/// answered handled and writes nothing, and a backfill is refused; in the
/// home region it projects as on a table of one region.
#[tokio::test]
async fn on_a_global_table_only_the_home_region_projects() {
    // A large future: on the heap, not the test thread's stack.
    Box::pin(only_the_home_region_projects()).await;
}

async fn only_the_home_region_projects() {
    let config = support::sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "global").await;
    let global = Replicas {
        regions: vec!["us-east-1", "eu-west-1"],
        strong: false,
    };

    for home in [None, Some("ap-south-1")] {
        let handler = handler(&table, global.clone(), "us-east-1", home).await;
        let (error_type, message) = invoke(&handler, follow(&client, &table).await)
            .await
            .unwrap_err();
        assert_eq!(error_type, "Projector.GlobalTable", "{message}");
        let names = match home {
            None => "PROJECTOR_HOME_REGION",
            Some(_) => "home region `ap-south-1` is not a region",
        };
        assert!(message.contains(names), "{message}");
        assert_eq!(derived(&client, &table).await, 0);
    }

    // Home, but writers may write anywhere: the rollups and the keys that
    // write onto writers' items would lose their newer remote writes.
    let mut anywhere = handler(&table, global.clone(), "us-east-1", Some("us-east-1")).await;
    anywhere.regions = Regions::new(
        "us-east-1".to_string(),
        Some("us-east-1".to_string()),
        ddb_projector::global::Writers::Anywhere,
    );
    let (error_type, message) = invoke(&anywhere, follow(&client, &table).await)
        .await
        .unwrap_err();
    assert_eq!(error_type, "Projector.GlobalTable", "{message}");
    assert!(
        message.contains("followers-count (onto profile)")
            && message.contains("PROJECTOR_WRITERS_IN_HOME_REGION"),
        "{message}"
    );
    assert_eq!(derived(&client, &table).await, 0);

    // Away: handled, nothing written; a backfill is refused.
    let away = handler(&table, global.clone(), "eu-west-1", Some("us-east-1")).await;
    let failures = invoke(&away, follow(&client, &table).await).await;
    assert_eq!(failures, Ok(Vec::new()));
    assert_eq!(derived(&client, &table).await, 0);
    let backfill: Payload = serde_json::from_value(serde_json::json!({
        "backfill": { "segment": 0, "totalSegments": 1, "run": "r1" }
    }))
    .expect("a backfill payload");
    let (error_type, message) = invoke(&away, backfill).await.unwrap_err();
    assert_eq!(error_type, "Projector.AwayFromHome", "{message}");
    assert!(message.contains("us-east-1"), "{message}");
    assert_eq!(derived(&client, &table).await, 0);

    // Home: it projects.
    let home = handler(&table, global.clone(), "us-east-1", Some("us-east-1")).await;
    let failures = invoke(&home, follow(&client, &table).await).await;
    assert_eq!(failures, Ok(Vec::new()));
    let reverse = support::get(&client, &table, "USER#b", "FOLLOWED_BY#a").await;
    assert!(reverse.is_some(), "the home region writes the inverse edge");

    // A failover recorded eu-west-1 as home: a worker still configured
    // with us-east-1 writes nothing, in us-east-1 or in eu-west-1 (the
    // record may be an older failover's); eu-west-1 projects once its
    // configuration agrees.
    ddb_projector::control::Registry::new(client.clone(), &table, &spec.table)
        .record_home("eu-west-1")
        .await
        .expect("record the home");
    let before = derived(&client, &table).await;
    let old_home = handler(&table, global.clone(), "us-east-1", Some("us-east-1")).await;
    assert_eq!(
        invoke(&old_home, follow_of(&client, &table, "c").await).await,
        Ok(Vec::new())
    );
    assert_eq!(
        derived(&client, &table).await,
        before,
        "the old home writes nothing"
    );
    let not_yet = handler(&table, global.clone(), "eu-west-1", Some("us-east-1")).await;
    assert_eq!(
        invoke(&not_yet, follow_of(&client, &table, "c").await).await,
        Ok(Vec::new())
    );
    assert_eq!(
        derived(&client, &table).await,
        before,
        "until the configurations agree"
    );
    let new_home = handler(&table, global.clone(), "eu-west-1", Some("eu-west-1")).await;
    assert_eq!(
        invoke(&new_home, follow_of(&client, &table, "c").await).await,
        Ok(Vec::new())
    );
    assert!(
        support::get(&client, &table, "USER#c", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the recorded home projects"
    );

    // Strong consistency has no transactions: a spec with counters is
    // refused, naming them.
    let strong = Replicas {
        regions: vec!["us-east-1", "eu-west-1", "us-west-2"],
        strong: true,
    };
    let handler = handler(&table, strong, "us-east-1", Some("us-east-1")).await;
    let before = support::scan_all(&client, &table).await;
    let (error_type, message) = invoke(&handler, follow(&client, &table).await)
        .await
        .unwrap_err();
    assert_eq!(error_type, "Projector.GlobalTable", "{message}");
    assert!(message.contains("followers"), "{message}");
    assert_eq!(support::scan_all(&client, &table).await, before);
}

// ------------------------------------------- a replicated global table ---

/// A spec with an inverse edge and a counter riding on it: items of its
/// own only, no writes onto writers' items.
const FOLLOWERS: &str = r#"
service = "followers"

[table]
name = "Followers"

[entities.follow]
pk = "USER#{a}"
sk = "FOLLOWS#{b}"

[entities.followed_by]
pk = "USER#{b}"
sk = "FOLLOWED_BY#{a}"

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { u = "{b}" }
shards = 2
"#;

/// A runner of `spec` in `region`, with short leases and polls.
async fn region_runner(region: &Region, spec: Arc<Spec>) -> StreamRunner {
    let (arn, _) = ddb_projector::dynamo::client::require_stream(&region.client, &region.table)
        .await
        .expect("the table has a stream");
    let config = ApplyConfig {
        lease: Duration::from_millis(300),
        clock_skew: Duration::ZERO,
        ..ApplyConfig::default()
    };
    StreamRunner::new(
        control::applier(region.client.clone(), spec, &region.table, config),
        aws_sdk_dynamodbstreams::Client::new(&region.config),
        &arn,
    )
}

fn quick(options: RunOptions) -> RunOptions {
    RunOptions {
        poll_interval: Duration::from_millis(50),
        ..options
    }
}

/// Drains each runner's stream, lets replication settle, and again,
/// until a round of drains writes nothing.
async fn project_until_quiet(table: &GlobalTable, runners: &[&StreamRunner]) {
    for _ in 0..20 {
        table.settle(Duration::from_secs(60)).await;
        let mut writes = 0;
        for runner in runners {
            writes += runner
                .run(quick(RunOptions::drain()), std::future::pending())
                .await
                .unwrap_or_else(|error| panic!("drain: {error}"))
                .writes;
        }
        if writes == 0 {
            table.settle(Duration::from_secs(60)).await;
            return;
        }
    }
    panic!("the runners kept writing after 20 rounds");
}

/// Writes `n` follows of `followee` in `region`.
async fn follows(region: &Region, prefix: &str, followee: &str, n: usize) {
    for i in 0..n {
        put_item(
            &region.client,
            &region.table,
            &attrs(&[
                ("PK", s(&format!("USER#{prefix}{i}"))),
                ("SK", s(&format!("FOLLOWS#{followee}"))),
            ]),
        )
        .await;
    }
}

/// The harness reproduces the problem: a worker in each region, writers in
/// both, the regions cut apart for a moment. Each region counts its own
/// follows into the same shards from the same value; replication keeps
/// one region's shard per shard, and the markers replicated beside them
/// say every follow is counted. The counter ends short, in both regions
/// alike. With the home region alone projecting, the same history ends
/// exact.
#[tokio::test]
async fn projecting_in_every_region_loses_counts_and_the_home_region_alone_does_not() {
    let spec = Arc::new(Spec::from_toml(FOLLOWERS, "followers.toml").expect("compiles"));
    for home_only in [false, true] {
        let table = GlobalTable::new(&spec, "gt-baseline", Duration::from_millis(50), 7).await;
        let mut runners = vec![region_runner(&table.regions[0], spec.clone()).await];
        if !home_only {
            runners.push(region_runner(&table.regions[1], spec.clone()).await);
        }
        let runners: Vec<&StreamRunner> = runners.iter().collect();
        table.pause();
        follows(&table.regions[0], "east", "b", 10).await;
        follows(&table.regions[1], "west", "b", 10).await;
        for runner in &runners {
            runner
                .run(quick(RunOptions::drain()), std::future::pending())
                .await
                .expect("drain");
        }
        table.resume();
        project_until_quiet(&table, &runners).await;
        let east = table.items(0).await;
        assert_eq!(east, table.items(1).await, "the replicas agree");
        let follows = east
            .iter()
            .filter(|i| support::text(i, "SK").is_some_and(|sk| sk.starts_with("FOLLOWS#")))
            .count();
        assert_eq!(follows, 20);
        let problems = oracle::differences(FOLLOWERS, &east);
        if home_only {
            assert!(problems.is_empty(), "home region only: {problems:#?}");
        } else {
            assert!(
                problems.iter().any(|p| p.contains("followers")),
                "a worker per region should have lost counts: {problems:#?}"
            );
        }
    }
}

/// Why writes onto writers' items are refused on a global table: a
/// projection's write in the home region replicates as the whole item,
/// and being the last, it replaces a writer's newer write made in another
/// region that had not replicated yet, in both regions.
#[tokio::test]
async fn a_write_onto_a_source_in_the_home_region_can_erase_a_newer_remote_write() {
    let spec = support::shipped_spec("user-service.toml");
    let table = GlobalTable::new(&spec, "gt-lww", Duration::ZERO, 11).await;
    let runner = region_runner(&table.regions[0], spec.clone()).await;
    let (west, east) = (&table.regions[1], &table.regions[0]);
    put_item(
        &west.client,
        &west.table,
        &super::model::email("u1", "e1", "sam@x.org", false),
    )
    .await;
    table.settle(Duration::from_secs(30)).await;
    // Cut apart, the user changes the address in the west; the east
    // projects the first version (its keys) meanwhile.
    table.pause();
    put_item(
        &west.client,
        &west.table,
        &super::model::email("u1", "e1", "kim@x.org", false),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    runner
        .run(quick(RunOptions::drain()), std::future::pending())
        .await
        .expect("drain");
    table.resume();
    table.settle(Duration::from_secs(30)).await;
    for region in [east, west] {
        let email = support::get(&region.client, &region.table, "USER#u1", "EMAIL#e1")
            .await
            .expect("the email");
        assert_eq!(
            support::text(&email, "email").as_deref(),
            Some("sam@x.org"),
            "{}: the user's newer address is lost to the projection's write",
            region.name
        );
    }
}

/// The entities the generated spec's projections write attributes onto,
/// judged from the generator's own kinds (independent of `src/global`):
/// their writers write in the home region only.
fn written_onto(projections: &[Projection]) -> Vec<Entity> {
    let mut onto = Vec::new();
    for p in projections {
        match p.kind {
            Kind::IndexKeys {
                source: Source::Attr,
                ..
            } => onto.push(Entity::Attr),
            Kind::IndexKeys {
                source: Source::Link,
                ..
            } => onto.push(Entity::Link),
            Kind::Denormalize { .. } => onto.push(Entity::Node),
            Kind::Rollup { .. } => onto.push(Entity::Tally),
            Kind::Aggregate { group: true, .. } => onto.push(Entity::Group),
            Kind::Aggregate { group: false, .. } => onto.push(Entity::Node),
            Kind::Edge { .. } | Kind::Counter { .. } => {}
        }
    }
    onto
}

/// The entity of an item the generator writes.
fn entity_of(sk: &str, pk: &str) -> Entity {
    match () {
        _ if pk.starts_with("T#") => Entity::Tally,
        _ if sk == "META" => Entity::Node,
        _ if sk.starts_with("A#") => Entity::Attr,
        _ if sk.starts_with("L#") => Entity::Link,
        _ => Entity::Group,
    }
}

/// Replicated writes of the generated cases: made, applied, dropped as
/// older than the target's (last writer wins), put back after a
/// replicated write replaced a newer local one.
static REPLICATED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// What one generated case draws besides its spec.
#[derive(Debug, Clone)]
struct Replicated {
    writes: Vec<Write>,
    /// The most a replicated write waits, in ms.
    lag_ms: u64,
    /// For each write: in the west (if its entity allows), then a pause
    /// of the replication around it, and a pause of the writer.
    regions: Vec<(bool, bool, u8)>,
    seed: u64,
}

fn replicated() -> impl Strategy<Value = Replicated> {
    (
        prop::collection::vec(write(), 1..40),
        0u64..=500,
        prop::collection::vec((any::<bool>(), prop::bool::weighted(0.1), 0u8..20), 40),
        any::<u64>(),
    )
        .prop_map(|(writes, lag_ms, regions, seed)| Replicated {
            writes,
            lag_ms,
            regions,
            seed,
        })
}

/// Generated specs on a global table, writers in both regions, the home
/// region projecting while replication lags 0-500 ms and is cut now and
/// then: once drained and replicated, both replicas are identical and
/// exact against the oracle, the audit is clean, and a replay changes
/// nothing.
#[test]
fn generated_specs_on_a_global_table_end_exact_in_both_regions() {
    let cases = std::env::var("GLOBAL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/dynamo/properties/global.txt",
        ))),
        max_shrink_iters: 50,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let started = Instant::now();
    let result = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            runner
                .run(&(specs(), replicated()), |(specs, drawn)| {
                    runtime().block_on(Box::pin(global_case(&specs.v2, &drawn)))
                })
                .map_err(|error| error.to_string())
        })
        .expect("a thread")
        .join()
        .expect("the property test thread");
    let [local, applied, dropped, restored] =
        REPLICATED.each_ref().map(|n| n.load(Ordering::Relaxed));
    eprintln!(
        "timing: generated specs on a global table: {cases} cases took {:.1} s; {local} writes \
         replicated, {applied} applied, {dropped} dropped as older than the target's, {restored} \
         put back",
        started.elapsed().as_secs_f64()
    );
    if let Err(error) = result {
        panic!("{error}");
    }
}

async fn global_case(projections: &[Projection], drawn: &Replicated) -> Result<(), TestCaseError> {
    let toml = spec_toml(projections);
    let spec = Arc::new(Spec::from_toml(&toml, "global.toml").expect("filtered to compile"));
    let table = GlobalTable::new(
        &spec,
        "gt-gen",
        Duration::from_millis(drawn.lag_ms),
        drawn.seed,
    )
    .await;
    let home = region_runner(&table.regions[0], spec.clone()).await;
    let onto = written_onto(projections);
    let mut history = History::default();
    play(&mut history, &drawn.writes);
    // The home region projects while the writers write in both regions.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let writers = async {
        for (i, record) in history.records.iter().enumerate() {
            let record = record.as_ref().expect("generated records decode");
            let keys: Attrs = record.keys.to_item().into();
            let (pk, sk) = (
                support::text(&keys, "PK").unwrap_or_default(),
                support::text(&keys, "SK").unwrap_or_default(),
            );
            let (west, cut, pause) = drawn.regions[i % drawn.regions.len()];
            let region = if west && !onto.contains(&entity_of(&sk, &pk)) {
                &table.regions[1]
            } else {
                &table.regions[0]
            };
            if cut {
                table.pause();
            }
            match &record.new_image {
                Some(image) => {
                    put_item(&region.client, &region.table, &image.to_item().into()).await
                }
                None => delete_item(&region.client, &region.table, keys).await,
            }
            if pause > 15 {
                tokio::time::sleep(Duration::from_millis(u64::from(pause) * 5)).await;
            }
            if cut {
                tokio::time::sleep(Duration::from_millis(100)).await;
                table.resume();
            }
        }
        table.resume();
        table.settle(Duration::from_secs(60)).await;
        let _ = stop.send(());
    };
    let (ran, ()) = tokio::join!(
        home.run(quick(RunOptions::follow()), async {
            let _ = stopped.await;
        }),
        writers
    );
    ran.map_err(|error| TestCaseError::fail(format!("the home runner: {error}")))?;
    project_until_quiet(&table, &[&home]).await;
    // Poison fixed by a later write leaves letters; the home region
    // redrives them.
    let applier = control::applier(
        table.regions[0].client.clone(),
        spec.clone(),
        &table.regions[0].table,
        ApplyConfig::default(),
    );
    applier
        .redrive(None)
        .await
        .map_err(|error| TestCaseError::fail(format!("redrive: {error}")))?;
    project_until_quiet(&table, &[&home]).await;
    // Every poison record was fixed by a later write: nothing is left.
    let letters = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|error| TestCaseError::fail(format!("listing letters: {error}")))?;
    prop_assert!(letters.is_empty(), "left after the redrive: {:#?}", letters);
    let east = table.items(0).await;
    let west = table.items(1).await;
    prop_assert!(east == west, "the replicas differ:\n{}", diff(&east, &west));
    let problems = oracle::differences(&toml, &east);
    prop_assert!(
        problems.is_empty(),
        "the table differs from what the spec computes:\n  {}",
        problems.join("\n  ")
    );
    let report = audit(
        &applier,
        &AuditOptions {
            segments: 2,
            progress: false,
            ..AuditOptions::default()
        },
    )
    .await
    .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
    prop_assert!(report.is_clean(), "the audit found {:#?}", report.findings);
    // A replay of the home region's whole stream changes nothing (the
    // poison records it meets again are redriven, as after any replay).
    home.run(quick(RunOptions::replay(None)), std::future::pending())
        .await
        .map_err(|error| TestCaseError::fail(format!("replay: {error}")))?;
    applier
        .redrive(None)
        .await
        .map_err(|error| TestCaseError::fail(format!("redrive after the replay: {error}")))?;
    project_until_quiet(&table, &[&home]).await;
    let letters = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|error| TestCaseError::fail(format!("listing letters: {error}")))?;
    prop_assert!(
        letters.is_empty(),
        "left after the replay's redrive: {:#?}",
        letters
    );
    // The leases item says when the worker last ran, and the runner's
    // checkpoints how far it read (the replay's redrive deletes letters,
    // whose records it reads next); the spec's text is stored with the
    // first lease a worker takes, which may be the replay's when the live
    // worker never had to write (a source outside every `when`), and each
    // writer's holder item the end of its latest lease. Nothing else
    // moves.
    let unleased = |items: Vec<Attrs>| -> Vec<Attrs> {
        items
            .into_iter()
            .filter(|i| support::text(i, "SK").as_deref() != Some("leases"))
            .filter(|i| {
                support::text(i, "PK").as_deref() != Some("_ddbp#lifecycle")
                    || !support::text(i, "SK")
                        .is_some_and(|sk| sk.starts_with("spec#") || sk.starts_with("h#"))
            })
            .filter(|i| support::text(i, "PK").as_deref() != Some("_ddbp#checkpoint"))
            .collect()
    };
    let east = unleased(east);
    let replayed = unleased(table.items(0).await);
    prop_assert!(
        replayed == east,
        "the replay changed the table:\n{}",
        diff(&east, &replayed)
    );
    prop_assert!(
        unleased(table.items(1).await) == east,
        "the replay changed the west"
    );
    let (local, applied, dropped, restored) = table.counts();
    for (total, n) in REPLICATED.iter().zip([local, applied, dropped, restored]) {
        total.fetch_add(n, Ordering::Relaxed);
    }
    Ok(())
}

/// The items of `a` and `b` that differ, by key.
fn diff(a: &[Attrs], b: &[Attrs]) -> String {
    let keyed = |items: &[Attrs]| -> BTreeMap<String, Attrs> {
        items
            .iter()
            .map(|i| (format!("{:?}/{:?}", i.get("PK"), i.get("SK")), i.clone()))
            .collect()
    };
    let (a, b) = (keyed(a), keyed(b));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("  {k}: {:?}\n    vs {:?}", a.get(k), b.get(k)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Failover: the home region is lost while it projects, replication cut
/// with some of its writes (parts of its transactions) delivered and some
/// not, writers in both regions throughout. The other region becomes home
/// as `ddb-projector failover` does it: a replay of everything its stream
/// retains, a redrive, then `audit --repair`; its table is exact against
/// the oracle, counters included. Then the old home comes back, its worker
/// stood down: its backlog replicates (older writes than the new home's,
/// some of them winning), the new home projects what arrives, and the
/// `audit --repair` the runbook asks for then ends exact in both regions.
#[tokio::test]
async fn after_the_home_region_is_lost_the_other_one_takes_over_and_ends_exact() {
    let spec = Arc::new(Spec::from_toml(FOLLOWERS, "followers.toml").expect("compiles"));
    let mut rng = super::model::Rng::new(super::model::seed_from_env("FAILOVER_SEED", || 21));
    let mut before_repair = Vec::new();
    let mut after_return = Vec::new();
    for round in 0..3 {
        let table =
            GlobalTable::new(&spec, "gt-failover", Duration::from_millis(200), rng.next()).await;
        let east = region_runner(&table.regions[0], spec.clone()).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let cut_after = 20 + rng.below(30) as usize;
        let mut writes = Vec::new();
        for _ in 0..80 {
            let (a, b) = (rng.below(6), rng.below(3));
            let follow = attrs(&[
                ("PK", s(&format!("USER#u{a}"))),
                ("SK", s(&format!("FOLLOWS#f{b}"))),
            ]);
            writes.push((rng.chance(50), rng.chance(25), follow));
        }
        let writers = async {
            for (i, (west, unfollow, follow)) in writes.iter().enumerate() {
                if i == cut_after {
                    // The home region is lost mid-batch: replication stops
                    // with what it had not delivered, and its worker with it.
                    table.pause();
                    let _ = stop.send(());
                    break;
                }
                let region = &table.regions[usize::from(*west)];
                if *unfollow {
                    delete_item(
                        &region.client,
                        &region.table,
                        attrs(&[("PK", follow["PK"].clone()), ("SK", follow["SK"].clone())]),
                    )
                    .await;
                } else {
                    put_item(&region.client, &region.table, follow).await;
                }
                tokio::time::sleep(Duration::from_millis(rng_delay(i))).await;
            }
        };
        let (ran, ()) = tokio::join!(
            east.run(quick(RunOptions::follow()), async {
                let _ = stopped.await;
            }),
            writers
        );
        ran.expect("the east runner");
        // The writers fail over too: the rest is written in the west.
        let west = &table.regions[1];
        for (_, unfollow, follow) in &writes[cut_after..] {
            if *unfollow {
                delete_item(
                    &west.client,
                    &west.table,
                    attrs(&[("PK", follow["PK"].clone()), ("SK", follow["SK"].clone())]),
                )
                .await;
            } else {
                put_item(&west.client, &west.table, follow).await;
            }
        }
        before_repair.push(
            oracle::differences(
                FOLLOWERS,
                &support::scan_all(&west.client, &west.table).await,
            )
            .len(),
        );
        // The west takes over.
        let new_home = region_runner(west, spec.clone()).await;
        new_home
            .run(quick(RunOptions::replay(None)), std::future::pending())
            .await
            .expect("the failover's replay");
        let applier = control::applier(
            west.client.clone(),
            spec.clone(),
            &west.table,
            ApplyConfig::default(),
        );
        let options = AuditOptions {
            segments: 2,
            progress: false,
            ..AuditOptions::default()
        };
        applier.redrive(None).await.expect("the failover's redrive");
        let repair = AuditOptions {
            repair: true,
            ..options.clone()
        };
        let repaired = audit(&applier, &repair)
            .await
            .expect("the failover's audit --repair");
        // Then it runs as the home region.
        new_home
            .run(quick(RunOptions::drain()), std::future::pending())
            .await
            .expect("the new home's worker");
        let items = support::scan_all(&west.client, &west.table).await;
        let problems = oracle::differences(FOLLOWERS, &items);
        assert!(
            problems.is_empty(),
            "round {round}: after the failover (repair found {:?}): {problems:#?}",
            repaired.counts()
        );
        let clean = audit(&applier, &options).await.expect("audit");
        assert!(clean.is_clean(), "round {round}: {:#?}", clean.findings);
        // The old home comes back, its worker stood down: its backlog
        // replicates both ways.
        table.resume();
        project_until_quiet(&table, &[&new_home]).await;
        after_return.push(oracle::differences(FOLLOWERS, &table.items(1).await).len());
        let repaired = audit(&applier, &repair)
            .await
            .expect("audit --repair after the return");
        project_until_quiet(&table, &[&new_home]).await;
        let west_items = table.items(1).await;
        assert_eq!(
            west_items,
            table.items(0).await,
            "round {round}: the replicas agree"
        );
        let problems = oracle::differences(FOLLOWERS, &west_items);
        assert!(
            problems.is_empty(),
            "round {round}: after the old home's return (repair found {:?}): {problems:#?}",
            repaired.counts()
        );
    }
    eprintln!(
        "failover: differences before the repair, per round: {before_repair:?}; after the old home's backlog arrived: {after_return:?}"
    );
}

/// A writer's pause after write `i`: now and then long enough for the
/// home worker to take a batch.
fn rng_delay(i: usize) -> u64 {
    if i.is_multiple_of(7) {
        60
    } else {
        3
    }
}

/// `failover` runs in the new home region of a global table only: in
/// another region, or on a table of one region, it says why and does
/// nothing. `check --table` says where a worker stands.
#[tokio::test]
async fn failover_refuses_outside_its_region_and_on_a_table_of_one_region() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "gt-cli").await;
    put_item(
        &client,
        &table,
        &attrs(&[("PK", s("USER#a")), ("SK", s("FOLLOWS#b"))]),
    )
    .await;
    let spec_path = support::repo().join("projections/social-service.toml");
    let failover = |to: &str| {
        std::process::Command::new(support::binary())
            .args([
                "failover",
                "--spec",
                spec_path.to_str().unwrap(),
                "--table",
                &table,
                "--to",
                to,
            ])
            .envs(support::env())
            .output()
            .unwrap()
    };
    let output = failover("eu-west-1");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("runs in eu-west-1, the new home region (this runs in us-east-1)"),
        "{stderr}"
    );
    let output = failover("us-east-1");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not a global table"), "{stderr}");
    // Its replay reads PROJECTOR_BATCH_LIMIT as `replay` does: a bad
    // value is refused before anything is read or written.
    let output = std::process::Command::new(support::binary())
        .args(["failover", "--spec", spec_path.to_str().unwrap()])
        .args(["--table", &table, "--to", "us-east-1"])
        .envs(support::env())
        .env("PROJECTOR_BATCH_LIMIT", "abc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("PROJECTOR_BATCH_LIMIT must be a whole number from 1 to 1000, not `abc`"),
        "{stderr}"
    );
    assert_eq!(derived(&client, &table).await, 0, "nothing done");
    // `check --table` says where a worker here stands.
    let output = std::process::Command::new(support::binary())
        .args([
            "check",
            "--spec",
            spec_path.to_str().unwrap(),
            "--table",
            &table,
        ])
        .envs(support::env())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("table {table}: a table of one region")),
        "{stdout}"
    );
}
