//! The library's face on DynamoDB Local: a [`Projector`] connected to its
//! table runs the stream, backfills, audits and waits as the CLI does,
//! through the same checks (a home region the table is not in refuses).

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::{ItemKey, Projector, WaitStatus};

use super::global::Replicas;
use super::support::{self, s};

#[tokio::test]
async fn a_connected_projector_runs_backfills_audits_and_waits_like_the_cli() {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "embed").await;
    let email = |user: &str, address: &str| {
        vec![
            ("PK", s(&format!("USER#{user}"))),
            ("SK", s("EMAIL#e1")),
            ("emailId", s("e1")),
            ("email", s(address)),
            ("isPrimary", Av::Bool(true)),
            ("isVerified", Av::Bool(true)),
        ]
    };
    support::put(&client, &table, &email("u1", " Ada@Example.org ")).await;
    let projector = Projector::new()
        .spec(support::repo().join("projections/user-service.toml"))
        .table(&table)
        .connect_with(support::sdk_config().await)
        .await
        .expect("connect");
    assert_eq!(projector.table(), table);

    // The stream, drained: the item gets its GSI keys.
    let ran = projector
        .run(true)
        .await
        .expect("run")
        .expect("a table of one region runs here");
    assert!(ran.records >= 1, "{ran:?}");
    let key = ItemKey::new("USER#u1", "EMAIL#e1");
    let waited = projector
        .wait(key.clone(), Duration::from_secs(10))
        .await
        .expect("wait");
    assert_eq!(waited.status, WaitStatus::Projected, "{waited:?}");
    let item = support::get(&client, &table, "USER#u1", "EMAIL#e1")
        .await
        .unwrap();
    assert_eq!(
        support::text(&item, "GSI1PK").as_deref(),
        Some("EMAIL#ada@example.org")
    );

    // Drift the audit finds, and repairs.
    client
        .update_item()
        .table_name(&table)
        .key("PK", s("USER#u1"))
        .key("SK", s("EMAIL#e1"))
        .update_expression("REMOVE GSI1PK")
        .send()
        .await
        .unwrap();
    assert!(!projector.audit(false).await.expect("audit").is_clean());
    projector.audit(true).await.expect("audit --repair");
    let after = projector.audit(false).await.expect("audit");
    assert!(after.is_clean(), "{after:#?}");

    // A run whose future is dropped (here by a timeout) stops, as on
    // SIGTERM: a change made after it is not projected by it.
    let following = tokio::time::timeout(Duration::from_secs(3), projector.run(false)).await;
    assert!(following.is_err(), "a follow run returns only when stopped");
    tokio::time::sleep(Duration::from_secs(3)).await;
    support::put(&client, &table, &email("u3", "cy@example.org")).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let u3 = support::get(&client, &table, "USER#u3", "EMAIL#e1")
        .await
        .unwrap();
    assert!(!u3.contains_key("GSI1PK"), "the dropped run still projects");
    projector.run(true).await.expect("drain").expect("ran");
    let u3 = support::get(&client, &table, "USER#u3", "EMAIL#e1")
        .await
        .unwrap();
    assert!(
        u3.contains_key("GSI1PK"),
        "a drain projects what came after"
    );

    // What status says is not live is backfilled: the items from before.
    let backfilled = projector.backfill().await.expect("backfill");
    assert!(backfilled.scanned >= 1, "{backfilled:?}");

    // The same checks as the CLI: on a global table (its replicas listed
    // by DescribeTable, as DynamoDB lists them), a projector outside the
    // home region writes nothing: its runner stays idle and its backfill
    // and repair are refused, naming the home region.
    let config = support::sdk_config().await;
    let replicated = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(Replicas {
                regions: vec!["us-east-1", "eu-west-1"],
                strong: false,
            })
            .build(),
    );
    let elsewhere = Projector::new()
        .spec(support::repo().join("projections/user-service.toml"))
        .table(&table)
        .home_region("eu-west-1")
        .writers_in_home_region(true)
        .connect_with_client(config, replicated)
        .await
        .expect("connect");
    let before = support::scan_all(&client, &table).await;
    support::put(&client, &table, &email("u2", "bo@example.org")).await;
    let ran = elsewhere.run(true).await.expect("run");
    assert!(
        ran.is_none(),
        "a runner outside the home region ran: {ran:?}"
    );
    let refused = elsewhere.backfill().await.expect_err("refused");
    assert!(refused.to_string().contains("eu-west-1"), "{refused:#}");
    let refused = elsewhere.audit(true).await.expect_err("refused");
    assert!(refused.to_string().contains("eu-west-1"), "{refused:#}");
    let u2 = support::get(&client, &table, "USER#u2", "EMAIL#e1")
        .await
        .unwrap();
    assert!(
        !u2.contains_key("GSI1PK"),
        "written outside the home region"
    );
    assert_eq!(
        support::scan_all(&client, &table).await.len(),
        before.len() + 1
    );
}
