//! The DynamoDB requests behind each kind of effect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::types::{
    AttributeValue as Av, ConsumedCapacity, DeleteRequest, PutRequest, ReturnConsumedCapacity,
    WriteRequest,
};

use super::retry::{sdk, with_retries, ErrorClass, WriteError};
use super::ApplyConfig;
use crate::decode::item_from_sdk;
use crate::plan::{compute_denormalized, SourceQuery};
use crate::record::{AttributeValue, Item, ItemKey};
use crate::spec::{values_equal, ProjectionId, Spec};

/// The attribute that holds a counter shard's value.
pub const COUNT_ATTRIBUTE: &str = "count";

/// Shared state of one batch's writes.
pub(crate) struct Ctx<'a> {
    pub client: &'a aws_sdk_dynamodb::Client,
    pub table: &'a str,
    pub spec: &'a Spec,
    pub config: &'a ApplyConfig,
    /// Write units in millionths (atomics have no f64).
    pub write_micro_units: AtomicU64,
    pub read_micro_units: AtomicU64,
    pub writes: AtomicU64,
    pub retries: AtomicU64,
    /// Requests by purpose.
    pub requests: std::sync::Mutex<Requests>,
    /// Source partitions recomputes read (after every write of the
    /// batch's first phase), and the targets they wrote: the invariant
    /// check reuses a read no later write of the batch fell into.
    pub partitions: std::sync::Mutex<PartitionReads>,
}

/// What recomputes read and wrote, for the invariant check.
#[derive(Debug, Default)]
pub(crate) struct PartitionReads {
    read: HashMap<SourceQuery, Vec<Item>>,
    written: Vec<ItemKey>,
}

/// Whether `key` is one of the items `query` reads.
pub(crate) fn within(query: &SourceQuery, key: &ItemKey) -> bool {
    key.pk == query.pk
        && query
            .sk_prefix
            .as_deref()
            .is_none_or(|prefix| key.sk.as_deref().is_some_and(|sk| sk.starts_with(prefix)))
}

/// Requests a batch sent, by purpose. A retried request counts once (the
/// retries are counted apart); a transaction sent again after a
/// cancellation counts again.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Requests {
    /// Consistent `GetItem`s of the hold set (one per batch with effects).
    pub holds_reads: u64,
    /// Recomputes: consistent `GetItem`s of targets and `Query`s of sources.
    pub recompute_reads: u64,
    /// Consistent `BatchGetItem`s of markers before their transactions.
    pub marker_reads: u64,
    /// Invariant checks: partition and GSI `Query`s, `BatchGetItem`s
    /// confirming holders and reading recorded violations.
    pub check_reads: u64,
    /// `UpdateItem`s: index keys, recompute writes, invariant repairs and
    /// recorded violations.
    pub updates: u64,
    /// `PutItem`s refreshing markers that exist, and `DeleteItem`s of
    /// resolved violations.
    pub single_writes: u64,
    /// `BatchWriteItem`s of plain puts and deletes.
    pub batch_writes: u64,
    /// `TransactWriteItems` of markers and counter shards.
    pub transactions: u64,
    /// Of these, transactions DynamoDB cancelled.
    pub cancelled_transactions: u64,
    /// Items sent in `BatchWriteItem`s (not requests).
    pub batch_write_items: u64,
    /// Items sent in `TransactWriteItems`, condition checks included (not
    /// requests).
    pub transaction_items: u64,
}

impl Requests {
    /// Adds another batch's counts.
    pub fn add(&mut self, other: &Requests) {
        self.holds_reads += other.holds_reads;
        self.recompute_reads += other.recompute_reads;
        self.marker_reads += other.marker_reads;
        self.check_reads += other.check_reads;
        self.updates += other.updates;
        self.single_writes += other.single_writes;
        self.batch_writes += other.batch_writes;
        self.transactions += other.transactions;
        self.cancelled_transactions += other.cancelled_transactions;
        self.batch_write_items += other.batch_write_items;
        self.transaction_items += other.transaction_items;
    }

    /// The least DynamoDB bills for the writes sent, whatever the endpoint
    /// reports: 1 write unit per KB of each single or batched write (a
    /// failed condition included) and 2 per KB of each transaction item,
    /// counting every item as under 1 KB; the writes to GSIs come on top.
    /// DynamoDB Local reports 2.0 for a whole transaction, so its figure can
    /// be far lower.
    pub fn min_billed_write_units(&self) -> u64 {
        self.updates + self.single_writes + self.batch_write_items + 2 * self.transaction_items
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.holds_reads
            + self.recompute_reads
            + self.marker_reads
            + self.check_reads
            + self.updates
            + self.single_writes
            + self.batch_writes
            + self.transactions
    }
}

impl<'a> Ctx<'a> {
    pub fn new(
        client: &'a aws_sdk_dynamodb::Client,
        table: &'a str,
        spec: &'a Spec,
        config: &'a ApplyConfig,
    ) -> Self {
        Ctx {
            client,
            table,
            spec,
            config,
            write_micro_units: AtomicU64::new(0),
            read_micro_units: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            requests: std::sync::Mutex::new(Requests::default()),
            partitions: std::sync::Mutex::new(PartitionReads::default()),
        }
    }

    fn remember_read(&self, query: &SourceQuery, items: &[Item]) {
        let mut partitions = self.partitions.lock().expect("not poisoned");
        partitions.read.insert(query.clone(), items.to_vec());
    }

    fn remember_written(&self, target: &ItemKey) {
        let mut partitions = self.partitions.lock().expect("not poisoned");
        partitions.written.push(target.clone());
    }

    /// The items of `query` a recompute of this batch read, if no write of
    /// the batch's recomputes fell among them (in whatever order the two
    /// happened). Earlier writes of the batch all came before that read.
    pub(crate) fn partition_read(&self, query: &SourceQuery) -> Option<Vec<Item>> {
        let partitions = self.partitions.lock().expect("not poisoned");
        if partitions.written.iter().any(|key| within(query, key)) {
            return None;
        }
        partitions.read.get(query).cloned()
    }

    /// Counts a request by purpose.
    pub(crate) fn count(&self, purpose: impl FnOnce(&mut Requests) -> &mut u64) {
        self.count_n(purpose, 1);
    }

    /// Adds `n` to a count.
    pub(crate) fn count_n(&self, purpose: impl FnOnce(&mut Requests) -> &mut u64, n: usize) {
        *purpose(&mut self.requests.lock().expect("not poisoned")) += n as u64;
    }

    /// The requests counted so far.
    pub(crate) fn requests(&self) -> Requests {
        self.requests.lock().expect("not poisoned").clone()
    }

    pub(crate) fn key(&self, key: &ItemKey) -> HashMap<String, Av> {
        self.spec.table.key_item(key).into()
    }

    pub(crate) fn count_units<'c>(
        &self,
        consumed: impl IntoIterator<Item = &'c ConsumedCapacity>,
        write: bool,
    ) {
        for capacity in consumed {
            let units = if write {
                capacity
                    .write_capacity_units()
                    .or(capacity.capacity_units())
            } else {
                capacity.read_capacity_units().or(capacity.capacity_units())
            };
            let micro = (units.unwrap_or(0.0) * 1e6) as u64;
            if write {
                self.write_micro_units.fetch_add(micro, Ordering::Relaxed);
            } else {
                self.read_micro_units.fetch_add(micro, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn sent(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    fn pk_name(&self) -> &str {
        &self.spec.table.partition_key
    }
}

pub(crate) fn av(value: &AttributeValue) -> Av {
    value.clone().into()
}

/// Builds expression attribute names and values without collisions.
#[derive(Default)]
pub(crate) struct Expr {
    names: HashMap<String, String>,
    values: HashMap<String, Av>,
}

impl Expr {
    pub(crate) fn name(&mut self, name: &str) -> String {
        let placeholder = format!("#n{}", self.names.len());
        for (k, v) in &self.names {
            if v == name {
                return k.clone();
            }
        }
        self.names.insert(placeholder.clone(), name.to_string());
        placeholder
    }

    pub(crate) fn value(&mut self, value: Av) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    pub(crate) fn values(self) -> (HashMap<String, String>, Option<HashMap<String, Av>>) {
        let values = (!self.values.is_empty()).then_some(self.values);
        (self.names, values)
    }
}

/// `index-keys`: sets derived attributes while the item still holds the
/// values they were derived from. A failed condition means the item moved
/// on (a later record carries its newer state), was deleted, or already has
/// the values: done in every case.
pub(crate) async fn set_attributes(
    ctx: &Ctx<'_>,
    key: &ItemKey,
    set: &[(String, AttributeValue)],
    expect: &[(String, AttributeValue)],
) -> Result<(), WriteError> {
    let mut expr = Expr::default();
    let pk = expr.name(ctx.pk_name());
    let mut assignments = Vec::new();
    let mut differs = Vec::new();
    for (name, value) in set {
        let n = expr.name(name);
        let v = expr.value(av(value));
        assignments.push(format!("{n} = {v}"));
        differs.push(format!("attribute_not_exists({n}) OR {n} <> {v}"));
    }
    let mut condition = vec![format!("attribute_exists({pk})")];
    for (name, value) in expect {
        let n = expr.name(name);
        let v = expr.value(av(value));
        condition.push(format!("{n} = {v}"));
    }
    condition.push(format!("({})", differs.join(" OR ")));
    let update = format!("SET {}", assignments.join(", "));
    let condition = condition.join(" AND ");
    let (names, values) = expr.values();
    let key = ctx.key(key);
    ctx.count(|r| &mut r.updates);
    with_retries(
        "set_attributes",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
            ctx.sent();
            let request = ctx
                .client
                .update_item()
                .table_name(ctx.table)
                .set_key(Some(key.clone()))
                .update_expression(&update)
                .condition_expression(&condition)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(values.clone())
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move {
                match request.send().await {
                    Ok(output) => {
                        ctx.count_units(output.consumed_capacity(), true);
                        Ok(())
                    }
                    Err(error) => {
                        let (class, text) = sdk(error);
                        if class == ErrorClass::Conditional {
                            // Superseded, deleted or already set: all done.
                            Ok(())
                        } else {
                            Err((class, text))
                        }
                    }
                }
            }
        },
    )
    .await
}

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

/// `denormalize`: reads the target and its sources, computes the copied
/// attributes and writes them if they differ, on condition that the target
/// still holds what was read. A failed condition means someone else wrote
/// in between: read again.
pub(crate) async fn recompute(
    ctx: &Ctx<'_>,
    projection: ProjectionId,
    target: &ItemKey,
    sources: &SourceQuery,
) -> Result<(), WriteError> {
    const ATTEMPTS: usize = 6;
    let key = ctx.key(target);
    for _ in 0..ATTEMPTS {
        ctx.count(|r| &mut r.recompute_reads);
        let current = with_retries(
            "read_target",
            ctx.config.max_retry_time,
            &ctx.retries,
            || {
                let request = ctx
                    .client
                    .get_item()
                    .table_name(ctx.table)
                    .set_key(Some(key.clone()))
                    .consistent_read(true)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                async move { request.send().await.map_err(sdk) }
            },
        )
        .await?;
        ctx.count_units(current.consumed_capacity(), false);
        let Some(current) = current.item() else {
            // No target item (yet): its INSERT will trigger a recompute.
            return Ok(());
        };
        ctx.count(|r| &mut r.recompute_reads);
        let current = item_from_sdk(current.clone())
            .map_err(|error| WriteError::Poison(format!("the target {target}: {error}")))?;
        let items = read_sources(ctx, sources).await?;
        ctx.remember_read(sources, &items);
        let wanted = compute_denormalized(ctx.spec, projection, &items).map_err(|error| {
            WriteError::Poison(format!(
                "cannot compute the target {target} from its sources: {error}"
            ))
        })?;
        let same = wanted
            .iter()
            .all(|(name, value)| match (current.get(name), value) {
                (Some(have), Some(want)) => values_equal(have, want),
                (None, None) => true,
                _ => false,
            });
        if same {
            return Ok(());
        }
        let mut expr = Expr::default();
        let pk = expr.name(ctx.pk_name());
        let mut sets = Vec::new();
        let mut removes = Vec::new();
        let mut condition = vec![format!("attribute_exists({pk})")];
        for (name, value) in &wanted {
            let n = expr.name(name);
            match value {
                Some(value) => {
                    let v = expr.value(av(value));
                    sets.push(format!("{n} = {v}"));
                }
                None => removes.push(n.clone()),
            }
            match current.get(name) {
                Some(seen) => {
                    let v = expr.value(av(seen));
                    condition.push(format!("{n} = {v}"));
                }
                None => condition.push(format!("attribute_not_exists({n})")),
            }
        }
        let mut update = String::new();
        if !sets.is_empty() {
            update.push_str(&format!("SET {}", sets.join(", ")));
        }
        if !removes.is_empty() {
            update.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        let condition = condition.join(" AND ");
        let (names, values) = expr.values();
        ctx.count(|r| &mut r.updates);
        // Counted as written before it is sent: a write that lands after a
        // failed attempt still invalidates the reads it falls among.
        ctx.remember_written(target);
        let written = with_retries(
            "write_target",
            ctx.config.max_retry_time,
            &ctx.retries,
            || {
                ctx.sent();
                let request = ctx
                    .client
                    .update_item()
                    .table_name(ctx.table)
                    .set_key(Some(key.clone()))
                    .update_expression(update.trim())
                    .condition_expression(&condition)
                    .set_expression_attribute_names(Some(names.clone()))
                    .set_expression_attribute_values(values.clone())
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                async move {
                    match request.send().await {
                        Ok(output) => {
                            ctx.count_units(output.consumed_capacity(), true);
                            Ok(true)
                        }
                        Err(error) => match sdk(error) {
                            (ErrorClass::Conditional, _) => Ok(false),
                            other => Err(other),
                        },
                    }
                }
            },
        )
        .await?;
        if written {
            return Ok(());
        }
    }
    Err(WriteError::Transient(format!(
        "target {target} kept changing during {ATTEMPTS} recomputes"
    )))
}

/// Writes plain puts and deletes with `BatchWriteItem`, 25 at a time,
/// retrying `UnprocessedItems`. Returns one result per request, in order.
pub(crate) async fn batch_write(
    ctx: &Ctx<'_>,
    requests: Vec<WriteRequest>,
) -> Vec<Result<(), WriteError>> {
    let mut results: Vec<Result<(), WriteError>> = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(25) {
        let outcome = write_chunk(ctx, chunk.to_vec()).await;
        match outcome {
            Ok(()) => results.extend(chunk.iter().map(|_| Ok(()))),
            // A poison chunk: try each request alone to find the bad one.
            Err(WriteError::Poison(_)) if chunk.len() > 1 => {
                for request in chunk {
                    results.push(write_chunk(ctx, vec![request.clone()]).await);
                }
            }
            Err(error) => results.extend(chunk.iter().map(|_| Err(error.clone()))),
        }
    }
    results
}

async fn write_chunk(ctx: &Ctx<'_>, chunk: Vec<WriteRequest>) -> Result<(), WriteError> {
    ctx.count(|r| &mut r.batch_writes);
    let pending = std::sync::Mutex::new(chunk);
    let pending = &pending;
    with_retries(
        "batch_write",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
            ctx.sent();
            let request = ctx
                .client
                .batch_write_item()
                .request_items(ctx.table, pending.lock().expect("not poisoned").clone())
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move {
                let output = request.send().await.map_err(sdk)?;
                ctx.count_units(output.consumed_capacity(), true);
                let unprocessed = output
                    .unprocessed_items()
                    .and_then(|items| items.get(ctx.table))
                    .cloned()
                    .unwrap_or_default();
                // Billed: the items DynamoDB processed.
                let sent = pending.lock().expect("not poisoned").len();
                ctx.count_n(
                    |r| &mut r.batch_write_items,
                    sent.saturating_sub(unprocessed.len()),
                );
                if unprocessed.is_empty() {
                    Ok(())
                } else {
                    // Keep only what DynamoDB did not write, and back off.
                    *pending.lock().expect("not poisoned") = unprocessed;
                    Err((
                        ErrorClass::Retry("unprocessed items"),
                        "BatchWriteItem left items unprocessed".to_string(),
                    ))
                }
            }
        },
    )
    .await
}

/// A put request for `BatchWriteItem`.
pub(crate) fn put_request(item: &Item) -> WriteRequest {
    WriteRequest::builder()
        .put_request(
            PutRequest::builder()
                .set_item(Some(item.clone().into()))
                .build()
                .expect("item is set"),
        )
        .build()
}

/// A delete request for `BatchWriteItem`.
pub(crate) fn delete_request(ctx: &Ctx<'_>, key: &ItemKey) -> WriteRequest {
    WriteRequest::builder()
        .delete_request(
            DeleteRequest::builder()
                .set_key(Some(ctx.key(key)))
                .build()
                .expect("key is set"),
        )
        .build()
}

/// Reads markers consistently (`BatchGetItem`, 100 keys a call), for
/// memberships planned from a scan: most are already in their state, and a
/// read costs less than a cancelled transaction.
pub(crate) async fn read_markers(
    ctx: &Ctx<'_>,
    keys: Vec<&ItemKey>,
) -> Result<HashMap<ItemKey, Item>, WriteError> {
    use aws_sdk_dynamodb::types::KeysAndAttributes;
    let mut found = HashMap::new();
    let mut by_key: HashMap<Vec<(String, String)>, ItemKey> = HashMap::new();
    let mut pending: Vec<HashMap<String, Av>> = Vec::new();
    for key in keys {
        let map = ctx.key(key);
        by_key.insert(flat(&map), key.clone());
        pending.push(map);
    }
    while !pending.is_empty() {
        let chunk: Vec<_> = pending.drain(..pending.len().min(100)).collect();
        let output = with_retries(
            "read_markers",
            ctx.config.max_retry_time,
            &ctx.retries,
            || {
                let request = ctx
                    .client
                    .batch_get_item()
                    .request_items(
                        ctx.table,
                        KeysAndAttributes::builder()
                            .set_keys(Some(chunk.clone()))
                            .consistent_read(true)
                            .build()
                            .expect("keys are set"),
                    )
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                async move { request.send().await.map_err(sdk) }
            },
        )
        .await?;
        ctx.count_units(output.consumed_capacity(), false);
        for item in output
            .responses()
            .and_then(|r| r.get(ctx.table))
            .into_iter()
            .flatten()
        {
            let key_map = ctx.spec.table.key_attributes(item);
            if let Some(key) = by_key.get(&flat(&key_map)) {
                let item = item_from_sdk(item.clone()).unwrap_or_else(|error| {
                    // It exists; with its key alone it equals no wanted
                    // state, so the conditional write that follows decides.
                    tracing::warn!(%key, %error, "a marker this build cannot read");
                    Item::from(key_map)
                });
                found.insert(key.clone(), item);
            }
        }
        if let Some(left) = output.unprocessed_keys().and_then(|u| u.get(ctx.table)) {
            pending.extend(left.keys().iter().cloned());
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_read_is_reused_only_if_no_recompute_wrote_among_its_items() {
        let spec = crate::spec::Spec::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("projections/user-service.toml"),
        )
        .expect("the shipped spec");
        let config = ApplyConfig::default();
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let ctx = Ctx::new(&client, "t", &spec, &config);
        let emails = SourceQuery {
            pk: "USER#u".into(),
            sk_prefix: Some("EMAIL#".into()),
        };
        assert_eq!(ctx.partition_read(&emails), None);
        ctx.remember_read(&emails, &[Item::default()]);
        // The profile is not among the emails.
        ctx.remember_written(&ItemKey::new("USER#u", "PROFILE"));
        assert_eq!(ctx.partition_read(&emails).map(|i| i.len()), Some(1));
        ctx.remember_written(&ItemKey::new("USER#u", "EMAIL#e1"));
        assert_eq!(ctx.partition_read(&emails), None);
        let whole = SourceQuery {
            pk: "USER#v".into(),
            sk_prefix: None,
        };
        assert!(within(&whole, &ItemKey::new("USER#v", "PROFILE")));
        assert!(!within(&whole, &ItemKey::new("USER#u", "PROFILE")));
    }
}
