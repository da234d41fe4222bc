//! The reads behind effects and checks: queries page by page, the
//! sources of a denormalized target, markers in batches.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};

use super::ctx::Ctx;
use super::writes::Expr;
use crate::decode::item_from_sdk;
use crate::dynamo::retry::{sdk, wait_for_unprocessed, with_retries, ErrorClass, WriteError};
use crate::plan::SourceQuery;
use crate::record::{Item, ItemKey};

/// A key condition to query with: on the table (read consistently) or on
/// a GSI (eventually consistent, the only way a GSI reads).
pub(crate) struct KeyQuery<'q> {
    /// Names the operation in retry metrics.
    pub what: &'static str,
    /// The GSI, if any.
    pub index: Option<&'q str>,
    /// The key condition expression.
    pub condition: String,
    /// Its attribute names and values.
    pub expr: Expr,
    /// Stop paging once this many items are read.
    pub limit: Option<usize>,
}

/// Every item a query returns, page after page, with retries; read
/// capacity is counted.
pub(crate) async fn query_all(
    ctx: &Ctx<'_>,
    query: KeyQuery<'_>,
) -> Result<Vec<HashMap<String, Av>>, WriteError> {
    let (names, values) = query.expr.values();
    let mut items = Vec::new();
    let mut start: Option<HashMap<String, Av>> = None;
    loop {
        let page = with_retries(query.what, ctx.config.max_retry_time, &ctx.retries, || {
            let request = ctx
                .client
                .query()
                .table_name(ctx.table)
                .set_index_name(query.index.map(str::to_string))
                .consistent_read(query.index.is_none())
                .key_condition_expression(&query.condition)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(values.clone())
                .set_exclusive_start_key(start.clone())
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move { request.send().await.map_err(sdk) }
        })
        .await?;
        ctx.count_units(page.consumed_capacity(), false);
        items.extend(page.items().iter().cloned());
        let full = query.limit.is_some_and(|limit| items.len() >= limit);
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() && !full => start = Some(key.clone()),
            _ => return Ok(items),
        }
    }
}

/// Reads every source item of a denormalized target, consistently.
pub(crate) async fn read_sources(
    ctx: &Ctx<'_>,
    sources: &SourceQuery,
) -> Result<Vec<Item>, WriteError> {
    let mut expr = Expr::default();
    let pk = expr.name(ctx.pk_name());
    let pk_value = expr.value(Av::S(sources.pk.clone()));
    let mut condition = format!("{pk} = {pk_value}");
    if let (Some(prefix), Some(sk_name)) = (&sources.sk_prefix, &ctx.spec.table.sort_key) {
        let sk = expr.name(sk_name);
        let p = expr.value(Av::S(prefix.clone()));
        condition.push_str(&format!(" AND begins_with({sk}, {p})"));
    }
    let query = KeyQuery {
        what: "read_sources",
        index: None,
        condition,
        expr,
        limit: None,
    };
    query_all(ctx, query)
        .await?
        .into_iter()
        .map(|item| {
            item_from_sdk(item)
                .map_err(|error| WriteError::Poison(format!("a source item of the query: {error}")))
        })
        .collect()
}

/// Reads markers consistently (`BatchGetItem`, 100 keys a call), for
/// memberships planned from a scan: most are already in their state, and a
/// read costs less than a cancelled transaction.
pub(crate) async fn read_markers(
    ctx: &Ctx<'_>,
    keys: Vec<&ItemKey>,
) -> Result<HashMap<ItemKey, Item>, WriteError> {
    Ok(read_items(ctx, keys, "read_markers")
        .await?
        .into_iter()
        .map(|(key, item)| {
            let item = item_from_sdk(item.clone()).unwrap_or_else(|error| {
                // It exists; with its key alone it equals no wanted state,
                // so the conditional write that follows decides.
                tracing::warn!(%key, %error, "a marker this build cannot read");
                Item::from(ctx.spec.table.key_attributes(&item))
            });
            (key, item)
        })
        .collect())
}

/// Reads items consistently as DynamoDB returns them: `BatchGetItem`s of
/// 100 keys, all in flight together (bounded by the concurrency), so one
/// round trip however many keys, unless DynamoDB leaves some unprocessed.
pub(crate) async fn read_items(
    ctx: &Ctx<'_>,
    keys: Vec<&ItemKey>,
    what: &'static str,
) -> Result<HashMap<ItemKey, HashMap<String, Av>>, WriteError> {
    use futures::stream::{StreamExt, TryStreamExt};
    let mut by_key: HashMap<Vec<(String, String)>, ItemKey> = HashMap::new();
    let mut maps: Vec<HashMap<String, Av>> = Vec::new();
    for key in keys {
        let map = ctx.key(key);
        if by_key.insert(flat(&map), key.clone()).is_none() {
            maps.push(map);
        }
    }
    let chunks: Vec<Vec<HashMap<String, Av>>> = maps.chunks(100).map(<[_]>::to_vec).collect();
    let pages: Vec<Vec<HashMap<String, Av>>> = futures::stream::iter(chunks)
        .map(|chunk| read_chunk(ctx, chunk, what))
        .buffer_unordered(ctx.config.concurrency.max(1))
        .try_collect()
        .await?;
    let mut found = HashMap::new();
    for item in pages.into_iter().flatten() {
        let key_map = ctx.spec.table.key_attributes(&item);
        if let Some(key) = by_key.get(&flat(&key_map)) {
            found.insert(key.clone(), item);
        }
    }
    Ok(found)
}

/// One `BatchGetItem` of at most 100 keys, and again for what DynamoDB
/// leaves unprocessed. An answer that reads none of the keys asked for is
/// a retry like a throttled request's, so a table that keeps leaving them
/// all unprocessed fails the read once the retry time is spent instead of
/// holding the batch past its deadline; an answer that reads some starts
/// the retry time again.
async fn read_chunk(
    ctx: &Ctx<'_>,
    chunk: Vec<HashMap<String, Av>>,
    what: &'static str,
) -> Result<Vec<HashMap<String, Av>>, WriteError> {
    use aws_sdk_dynamodb::types::KeysAndAttributes;
    let mut found = Vec::new();
    let mut pending = chunk;
    while !pending.is_empty() {
        let asked = &pending;
        let (items, left) = with_retries(what, ctx.config.max_retry_time, &ctx.retries, || {
            let request = ctx
                .client
                .batch_get_item()
                .request_items(
                    ctx.table,
                    KeysAndAttributes::builder()
                        .set_keys(Some(asked.clone()))
                        .consistent_read(true)
                        .build()
                        .expect("keys are set"),
                )
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move {
                let output = request.send().await.map_err(sdk)?;
                ctx.count_units(output.consumed_capacity(), false);
                let items: Vec<HashMap<String, Av>> = output
                    .responses()
                    .and_then(|r| r.get(ctx.table))
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                let left: Vec<HashMap<String, Av>> = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(ctx.table))
                    .map(|left| left.keys().to_vec())
                    .unwrap_or_default();
                if items.is_empty() && left.len() >= asked.len() {
                    return Err((
                        ErrorClass::Retry("unprocessed keys"),
                        "BatchGetItem left every key unprocessed".to_string(),
                    ));
                }
                Ok((items, left))
            }
        })
        .await?;
        found.extend(items);
        if !left.is_empty() {
            wait_for_unprocessed().await;
        }
        pending = left;
    }
    Ok(found)
}

fn flat(map: &HashMap<String, Av>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = map
        .iter()
        .map(|(k, v)| (k.clone(), v.as_s().cloned().unwrap_or_default()))
        .collect();
    pairs.sort();
    pairs
}
