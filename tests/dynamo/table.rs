//! `table create` against DynamoDB Local.

use ddb_projector::spec::Spec;
use ddb_projector::table::{create_table, Created};

use super::support;

#[tokio::test]
async fn creates_the_table_with_stream_and_indexes_and_accepts_it_again() {
    let client = support::client().await;
    let spec = support::shipped_spec("social-service.toml");
    let table = support::unique_table("create");
    assert_eq!(
        create_table(&client, &spec, &table).await.unwrap(),
        Created::Created
    );
    let info = ddb_projector::dynamo::client::describe_table(&client, &table)
        .await
        .unwrap();
    assert!(info.stream_arn.is_some());
    let description = client
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let gsis = description.table().unwrap().global_secondary_indexes();
    assert_eq!(gsis.len(), 1);
    assert_eq!(gsis[0].index_name(), Some("GSI1"));
    assert_eq!(
        create_table(&client, &spec, &table).await.unwrap(),
        Created::AlreadyRight
    );
}

#[tokio::test]
async fn an_existing_table_of_another_shape_is_a_clear_error() {
    let client = support::client().await;
    let table = support::unique_table("shape");
    // The table exists without GSI1 and without a stream.
    let bare = Spec::from_toml(
        "service = \"s\"\n[table]\nname = \"x\"\n[entities.a]\npk = \"A#{a}\"\nsk = \"B\"\n",
        "bare.toml",
    )
    .unwrap();
    create_table(&client, &bare, &table).await.unwrap();
    client
        .update_table()
        .table_name(&table)
        .stream_specification(
            aws_sdk_dynamodb::types::StreamSpecification::builder()
                .stream_enabled(false)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let spec = support::shipped_spec("user-service.toml");
    let error = create_table(&client, &spec, &table)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("table `{table}` exists with a different shape")),
        "{error}"
    );
    assert!(error.contains("index `GSI1` is missing"), "{error}");
    assert!(error.contains("no stream is enabled"), "{error}");
}

#[tokio::test]
async fn a_missing_table_is_named_in_the_error() {
    let client = support::client().await;
    let error = ddb_projector::dynamo::client::describe_table(&client, "no-such-table-xyz")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("table `no-such-table-xyz` does not exist"),
        "{error}"
    );
}

/// `table create`, `dlq list` and `dlq redrive` print JSON when asked:
/// whether the table was created, the letters, the redrive's summary.
#[tokio::test]
async fn table_and_dlq_commands_print_json_when_asked() {
    let table = support::unique_table("cli-json");
    let spec = support::repo().join("projections/user-service.toml");
    let spec = spec.to_str().unwrap();
    let run = |args: &[&str]| {
        let output = super::runner::cli(args).output().expect("the binary runs");
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    for created in [true, false] {
        let out = run(&[
            "table", "create", "--spec", spec, "--table", &table, "--format", "json",
        ]);
        let answer: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
        assert_eq!(
            answer,
            serde_json::json!({"table": table, "created": created})
        );
    }
    assert_eq!(
        run(&["dlq", "list", "--spec", spec, "--table", &table, "--format", "text"]),
        ""
    );
    let out = run(&[
        "dlq", "redrive", "--spec", spec, "--table", &table, "--format", "json",
    ]);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(summary["redriven"], 0, "{summary}");
    assert_eq!(summary["still_failing"], 0, "{summary}");
}
