//! Creating the table a spec describes.

use anyhow::{bail, Context};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    TimeToLiveSpecification,
};

use crate::spec::Spec;

/// What `create_table` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The table was created.
    Created,
    /// It existed already with the right shape.
    AlreadyRight,
}

fn key(name: &str, kind: KeyType) -> anyhow::Result<KeySchemaElement> {
    Ok(KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()?)
}

/// Creates `table` as the spec describes it: key schema, GSIs, a
/// NEW_AND_OLD_IMAGES stream and TTL; or checks an existing one's shape.
pub async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    spec: &Spec,
    table: &str,
) -> anyhow::Result<Created> {
    let t = &spec.table;
    let mut attributes = vec![t.partition_key.clone()];
    attributes.extend(t.sort_key.clone());
    for gsi in &t.gsis {
        attributes.push(gsi.partition_key.clone());
        attributes.extend(gsi.sort_key.clone());
    }
    attributes.sort();
    attributes.dedup();
    let mut request = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()?,
        )
        .key_schema(key(&t.partition_key, KeyType::Hash)?);
    if let Some(sk) = &t.sort_key {
        request = request.key_schema(key(sk, KeyType::Range)?);
    }
    for name in &attributes {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        );
    }
    for gsi in &t.gsis {
        let mut index = GlobalSecondaryIndex::builder()
            .index_name(&gsi.name)
            .key_schema(key(&gsi.partition_key, KeyType::Hash)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build(),
            );
        if let Some(sk) = &gsi.sort_key {
            index = index.key_schema(key(sk, KeyType::Range)?);
        }
        request = request.global_secondary_indexes(index.build()?);
    }
    match request.send().await {
        Ok(_) => {}
        Err(error) => {
            let text = crate::dynamo::retry::describe(&error);
            if text.contains("ResourceInUseException")
                || text.contains("already exists")
                || text.contains("Table already")
            {
                check_shape(client, spec, table).await?;
                return Ok(Created::AlreadyRight);
            }
            let detail = error
                .as_service_error()
                .map(|e| e.to_string())
                .unwrap_or(text);
            bail!("creating table `{table}` failed: {detail}");
        }
    }
    wait_active(client, table).await?;
    if let Some(ttl) = &t.ttl_attribute {
        client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(ttl)
                    .build()?,
            )
            .send()
            .await
            .with_context(|| format!("enabling TTL on `{ttl}`"))?;
    }
    Ok(Created::Created)
}

async fn wait_active(client: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    for _ in 0..120 {
        let output = client.describe_table().table_name(table).send().await?;
        let status = output
            .table()
            .and_then(|t| t.table_status())
            .map(|s| s.as_str().to_string());
        if status.as_deref() == Some("ACTIVE") {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    bail!("table `{table}` did not become ACTIVE within 60 s")
}

/// Compares an existing table with the spec; lists every difference.
async fn check_shape(
    client: &aws_sdk_dynamodb::Client,
    spec: &Spec,
    table: &str,
) -> anyhow::Result<()> {
    let output = client.describe_table().table_name(table).send().await?;
    let description = output.table().context("DescribeTable returned no table")?;
    let mut problems = Vec::new();
    let key_of = |schema: &[KeySchemaElement], kind: KeyType| {
        schema
            .iter()
            .find(|k| *k.key_type() == kind)
            .map(|k| k.attribute_name().to_string())
    };
    let schema = description.key_schema();
    let t = &spec.table;
    if key_of(schema, KeyType::Hash).as_deref() != Some(t.partition_key.as_str()) {
        problems.push(format!(
            "partition key is {:?}, the spec says `{}`",
            key_of(schema, KeyType::Hash),
            t.partition_key
        ));
    }
    if key_of(schema, KeyType::Range) != t.sort_key {
        problems.push(format!(
            "sort key is {:?}, the spec says {:?}",
            key_of(schema, KeyType::Range),
            t.sort_key
        ));
    }
    for gsi in &t.gsis {
        match description
            .global_secondary_indexes()
            .iter()
            .find(|g| g.index_name() == Some(gsi.name.as_str()))
        {
            None => problems.push(format!(
                "index `{}` is missing (add it, then run `ddb-projector backfill --all` for its keys)",
                gsi.name
            )),
            Some(index) => {
                let schema = index.key_schema();
                if key_of(schema, KeyType::Hash).as_deref() != Some(gsi.partition_key.as_str())
                    || key_of(schema, KeyType::Range) != gsi.sort_key
                {
                    problems.push(format!(
                        "index `{}` has different key attributes than the spec",
                        gsi.name
                    ));
                }
            }
        }
    }
    let stream = description.stream_specification();
    if !stream.is_some_and(|s| s.stream_enabled()) {
        problems.push("no stream is enabled".to_string());
    } else if stream.and_then(|s| s.stream_view_type()) != Some(&StreamViewType::NewAndOldImages) {
        problems.push("the stream's view type is not NEW_AND_OLD_IMAGES".to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!(
            "table `{table}` exists with a different shape than {} describes:\n  - {}",
            spec.file,
            problems.join("\n  - ")
        )
    }
}
