//! AWS clients and the table checks every online command starts with.
//!
//! Region, credentials and endpoint come from the standard SDK chain
//! (`AWS_REGION`, `AWS_ENDPOINT_URL`, profiles, ...). Timeouts are short so
//! a wrong endpoint fails within seconds instead of hanging.

use std::time::Duration;

use anyhow::{bail, Context};
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::types::StreamViewType;

use crate::dynamo::retry::describe as retry_describe;

/// Loads the SDK configuration, failing clearly when no region is set.
pub async fn load_config() -> anyhow::Result<SdkConfig> {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30))
        .build();
    let config = aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(timeouts)
        .load()
        .await;
    if config.region().is_none() {
        bail!("no AWS region is configured: set AWS_REGION (for DynamoDB Local any region works, e.g. AWS_REGION=us-east-1)");
    }
    Ok(config)
}

/// A DynamoDB client for `config`.
pub fn dynamodb(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(config)
}

/// A DynamoDB client for a caller that retries every call itself within a
/// deadline (the Lambda): the SDK's own retries (three attempts, backoff of
/// seconds) would not see the deadline, so they are cut to one quick retry.
pub fn dynamodb_within_deadline(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(config)
            .retry_config(
                aws_sdk_dynamodb::config::retry::RetryConfig::standard()
                    .with_max_attempts(2)
                    .with_initial_backoff(Duration::from_millis(20)),
            )
            .build(),
    )
}

/// A DynamoDB Streams client for `config`.
pub fn streams(config: &SdkConfig) -> aws_sdk_dynamodbstreams::Client {
    aws_sdk_dynamodbstreams::Client::new(config)
}

/// What a table looks like, for the commands that need its stream.
#[derive(Debug, Clone)]
pub struct TableInfo {
    /// The table name.
    pub name: String,
    /// The partition key attribute's name.
    pub partition_key: String,
    /// The sort key attribute's name, when the table has one.
    pub sort_key: Option<String>,
    /// The latest stream's ARN, when a stream is enabled.
    pub stream_arn: Option<String>,
    /// The stream's view type.
    pub view_type: Option<StreamViewType>,
    /// The regions of the table's replicas (a global table), as
    /// `DescribeTable` lists them; empty for a table of one region.
    pub replicas: Vec<String>,
    /// A global table in multi-region strong consistency (no
    /// transactions).
    pub strong_consistency: bool,
    /// The global tables version, when the table is one
    /// (`2019.11.21`, or the legacy `2017.11.29`).
    pub global_version: Option<String>,
    /// Replicas whose status is not `ACTIVE`: (region, status).
    pub inactive: Vec<(String, String)>,
}

/// Describes a table, turning the usual mistakes into clear errors.
pub async fn describe_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<TableInfo> {
    let output = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|error| anyhow::anyhow!(explain(table, &error, retry_describe(&error))))?;
    let description = output.table().context("DescribeTable returned no table")?;
    let stream = description.stream_specification();
    let enabled = stream.is_some_and(|s| s.stream_enabled());
    let key = |kind: aws_sdk_dynamodb::types::KeyType| {
        description
            .key_schema()
            .iter()
            .find(|k| *k.key_type() == kind)
            .map(|k| k.attribute_name().to_string())
    };
    Ok(TableInfo {
        name: table.to_string(),
        partition_key: key(aws_sdk_dynamodb::types::KeyType::Hash).unwrap_or_default(),
        sort_key: key(aws_sdk_dynamodb::types::KeyType::Range),
        stream_arn: if enabled {
            description.latest_stream_arn().map(str::to_string)
        } else {
            None
        },
        view_type: stream.and_then(|s| s.stream_view_type()).cloned(),
        replicas: description
            .replicas()
            .iter()
            .filter_map(|replica| replica.region_name().map(str::to_string))
            .collect(),
        strong_consistency: description.multi_region_consistency()
            == Some(&aws_sdk_dynamodb::types::MultiRegionConsistency::Strong),
        global_version: description.global_table_version().map(str::to_string),
        inactive: description
            .replicas()
            .iter()
            .filter_map(
                |replica| match (replica.region_name(), replica.replica_status()) {
                    (Some(region), Some(status))
                        if *status != aws_sdk_dynamodb::types::ReplicaStatus::Active =>
                    {
                        Some((region.to_string(), status.as_str().to_string()))
                    }
                    _ => None,
                },
            )
            .collect(),
    })
}

/// The table's stream ARN, or a clear error when it has none.
pub async fn require_stream(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<(String, StreamViewType)> {
    let info = describe_table(client, table).await?;
    match (info.stream_arn, info.view_type) {
        (Some(arn), Some(view)) => {
            if view != StreamViewType::NewAndOldImages {
                tracing::warn!(table, view = view.as_str(), "the stream does not carry both images; projections that need them will dead-letter records");
            }
            Ok((arn, view))
        }
        _ => bail!(
            "table `{table}` has no stream enabled: enable a stream with NEW_AND_OLD_IMAGES \
             (aws dynamodb update-table --table-name {table} --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES), \
             or create the table with `ddb-projector table create`"
        ),
    }
}

fn explain<E: std::error::Error>(table: &str, error: &E, detail: String) -> String {
    let _ = error;
    if detail.contains("ResourceNotFoundException")
        || detail.contains("non-existent table")
        || detail.contains("Cannot do operations on a non-existent table")
    {
        format!("table `{table}` does not exist (create it with `ddb-projector table create --spec FILE`)")
    } else if detail.contains("credentials") || detail.contains("Credentials") {
        // Checked before the connection errors: the SDK reports a failed
        // credentials lookup as a dispatch failure too.
        format!("no AWS credentials found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (for DynamoDB Local any values work): {detail}")
    } else if detail.contains("dispatch failure")
        || detail.contains("Connection refused")
        || detail.contains("timeout")
        || detail.contains("timed out")
    {
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .unwrap_or_else(|_| "the default AWS endpoint".to_string());
        format!("cannot reach DynamoDB at {endpoint}: {detail}")
    } else {
        format!("DescribeTable `{table}` failed: {detail}")
    }
}
