//! Global tables: one region projects, the others write nothing (see
//! `ddb_projector::global`). DynamoDB Local has no replicas: the
//! `DescribeTable` answers list them the way DynamoDB does for a global
//! table, injected as the fault tests inject errors.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{MultiRegionConsistency, ReplicaDescription, ReplicaStatus};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use ddb_projector::apply::ApplyConfig;
use ddb_projector::lambda::event::{Payload, StreamsEvent};
use ddb_projector::lambda::{Handler, Regions, Response};
use ddb_projector::record::ChangeKind;
use lambda_runtime::diagnostic::Diagnostic;

use super::model::{attrs, change, put_item};
use super::support::{self, s};

/// Lists `regions` as the table's replicas in every `DescribeTable`
/// answer, and the multi-region strong consistency mode when `strong`.
#[derive(Debug, Clone)]
struct Replicas {
    regions: Vec<&'static str>,
    strong: bool,
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
        spec: support::shipped_spec("social-service.toml"),
        client,
        table: Some(table.to_string()),
        margin: Duration::from_millis(1500),
        config: ApplyConfig::default(),
        metrics: None,
        process_started: SystemTime::now(),
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
    let edge = attrs(&[
        ("PK", s("USER#a")),
        ("SK", s("FOLLOWS#b")),
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
    match handler
        .handle(lambda_runtime::LambdaEvent::new(payload, context()))
        .await
    {
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
        .filter(|item| support::text(item, "SK").as_deref() != Some("FOLLOWS#b"))
        .count()
}

/// On a global table the Lambda projects in its home region only: without
/// a home region (or with one the table is not in) every batch fails with
/// the reason and writes nothing; outside the home region a batch is
/// answered handled and writes nothing, and a backfill is refused; in the
/// home region it projects as on a table of one region.
#[tokio::test]
async fn on_a_global_table_only_the_home_region_projects() {
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
