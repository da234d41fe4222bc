//! The DynamoDB writes behind each kind of effect.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue as Av, DeleteRequest, PutRequest, ReturnConsumedCapacity, WriteRequest,
};

use crate::decode::item_from_sdk;
use crate::dynamo::retry::{sdk, with_retries, ErrorClass, WriteError};
use crate::plan::Sources;
use crate::record::{AttributeValue, Item, ItemKey};
use crate::spec::{values_equal, ProjectionId};

use super::ctx::Ctx;
use super::reads::{read_markers, read_sources};

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

/// The shards of counter `counter`'s instance `values` in the version
/// readers read, as the lifecycle registry names it now (read after the
/// target: a backfill that switches readers completes before it recomputes
/// the targets, so a recompute that read the version before the switch
/// read the target before that recompute's write, and its conditional
/// write fails). A version counting other variables than the spec's is
/// read where the spec writes it; with none recorded, the old version the
/// layout keeps (as `counter get` does).
async fn readers_shards(
    ctx: &Ctx<'_>,
    counter: ProjectionId,
    values: &[String],
) -> Result<Vec<ItemKey>, WriteError> {
    let (storage, shards) = readers_storage(ctx, counter).await?;
    Ok((0..shards)
        .map(|shard| ctx.spec.counter_shard_key(&storage, values, shard))
        .collect())
}

/// The storage and shard count of the version of `counter` readers read
/// ([`readers_shards`]): one consistent read of the registry.
async fn readers_storage(
    ctx: &Ctx<'_>,
    counter: ProjectionId,
) -> Result<(String, u32), WriteError> {
    let spec = ctx.spec;
    let Some(c) = spec.counter(counter) else {
        return Err(WriteError::Fatal(format!(
            "`{}` is not a counter",
            spec.projections[counter].name
        )));
    };
    let name = &spec.projections[counter].name;
    ctx.count(|r| &mut r.recompute_reads);
    // The SDK retries throttling; anything else has the records redelivered.
    let read = ctx
        .control
        .readers_version(name)
        .await
        .map_err(|error| WriteError::Transient(error.to_string()))?;
    let ours: Vec<&String> = c.of.iter().map(|(v, _)| v).collect();
    Ok(match read {
        Some(read) if read.vars.iter().collect::<Vec<_>>() == ours => (read.storage, read.shards),
        Some(_) => (c.storage.clone(), c.shards),
        // None recorded (a registry from before versions were recorded):
        // the version the layout keeps beside it, as `counter get` reads.
        None => match spec.old_version(counter).and_then(|old| spec.counter(old)) {
            Some(old) => (old.storage.clone(), old.shards),
            None => (c.storage.clone(), c.shards),
        },
    })
}

/// What a recompute of `target` computes from: its sources, read
/// consistently (the query's items, or the shards of the counter version
/// readers read), of `target` only.
pub(crate) async fn read_recompute_sources(
    ctx: &Ctx<'_>,
    projection: ProjectionId,
    target: &ItemKey,
    sources: &Sources,
) -> Result<Vec<Item>, WriteError> {
    read_sources_of(ctx, projection, target, sources, false).await
}

/// [`read_recompute_sources`]; with `shared`, a query's items are the
/// read shared with the batch's invariant checks ([`Ctx::read_shared`]):
/// for a target read before the batch's first phase.
async fn read_sources_of(
    ctx: &Ctx<'_>,
    projection: ProjectionId,
    target: &ItemKey,
    sources: &Sources,
    shared: bool,
) -> Result<Vec<Item>, WriteError> {
    let items = match sources {
        Sources::Query(query) => {
            let items = match shared {
                true => ctx.read_shared(query, |r| &mut r.recompute_reads).await?,
                false => {
                    ctx.count(|r| &mut r.recompute_reads);
                    read_sources(ctx, query).await?
                }
            };
            ctx.remember_read(query, &items);
            items
        }
        Sources::Items(keys) => {
            let together = match shared {
                true => ctx.shared_items(keys).await?,
                false => None,
            };
            match together {
                Some(items) => items,
                None => {
                    ctx.count(|r| &mut r.recompute_reads);
                    read_markers(ctx, keys.iter().collect())
                        .await?
                        .into_values()
                        .collect()
                }
            }
        }
        Sources::Counter { counter, values } => {
            let keys = readers_shards(ctx, *counter, values).await?;
            ctx.count(|r| &mut r.recompute_reads);
            read_markers(ctx, keys.iter().collect())
                .await?
                .into_values()
                .collect()
        }
    };
    Ok(crate::kinds::of_target(ctx.spec, projection, target, items))
}

/// A recomputed target (`denormalize`, `rollup`, `aggregate`): reads the
/// target and what it is computed from, computes its attributes and
/// writes them if they differ, on condition that the target still holds
/// what was read (for kinds with a token, the token it carried). A failed
/// condition means someone else wrote in between: read again.
pub(crate) async fn recompute(
    ctx: &Ctx<'_>,
    projection: ProjectionId,
    target: &ItemKey,
    sources: &Sources,
) -> Result<(), WriteError> {
    const ATTEMPTS: usize = 6;
    let token = crate::kinds::uses_token(ctx.spec, projection)
        .then(|| crate::dynamo::names::token_attribute(&ctx.spec.projections[projection].name));
    let key = ctx.key(target);
    ctx.count(|r| &mut r.recomputes);
    let read_target = || async {
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
        Ok::<_, WriteError>(current.item().cloned())
    };
    let convert = |read: HashMap<String, Av>| {
        item_from_sdk(read)
            .map_err(|error| WriteError::Poison(format!("the target {target}: {error}")))
    };
    // The target as read before the next attempt's sources, when the
    // attempt before read it.
    let mut before: Option<HashMap<String, Av>> = None;
    for _ in 0..ATTEMPTS {
        // A target read ahead serves as the token to write on condition
        // of. That it was absent is not trusted: a target created since
        // may have been recomputed before this batch's first phase
        // landed, so absence is read again, now.
        let (current, ahead) = match before.take() {
            Some(read) => (Some(read), false),
            None => match token
                .as_ref()
                .and_then(|_| ctx.target_read_ahead(projection, target))
            {
                Some(Some(read)) => (Some(read), true),
                Some(None) | None => (read_target().await?, false),
            },
        };
        let Some(current) = current else {
            // No target item (yet): its INSERT will trigger a recompute.
            return Ok(());
        };
        let current = convert(current)?;
        let items = read_sources_of(ctx, projection, target, sources, ahead).await?;
        let wanted = crate::kinds::compute(ctx.spec, projection, &items).map_err(|error| {
            WriteError::Poison(format!("cannot compute the target {target}: {error}"))
        })?;
        let holds_wanted = |current: &Item| {
            wanted
                .iter()
                .all(|(name, value)| match (current.get(name), value) {
                    (Some(have), Some(want)) => values_equal(have, want),
                    (None, None) => true,
                    _ => false,
                })
        };
        // The version of the sources read, for kinds whose token is one.
        let version = token
            .as_ref()
            .and_then(|_| crate::kinds::version(ctx.spec, projection, &items));
        let recorded = token.as_ref().and_then(|token| current.get(token));
        if holds_wanted(&current) {
            match &version {
                // Computed from the very sources read: current, however
                // long ago the target was read.
                Some(version) if recorded.is_some_and(|r| values_equal(version, r)) => {
                    return Ok(());
                }
                // Equal, but from sources that moved since the target's
                // write: the token moves, turning back any recompute that
                // read the token before this one and its sources before
                // they moved (it would write an older result over this).
                Some(_) => {}
                None if !ahead => return Ok(()),
                None => {
                    // Equal to a target read ahead, before this batch's
                    // first phase, says nothing of the target now: a
                    // recompute of another batch may have written since,
                    // from sources this batch had not moved yet. Read it
                    // again: equal now, after the sources were read, it
                    // is done; otherwise that read is the next attempt's
                    // target, read before its sources.
                    let Some(now) = read_target().await? else {
                        return Ok(());
                    };
                    if holds_wanted(&convert(now.clone())?) {
                        return Ok(());
                    }
                    before = Some(now);
                    continue;
                }
            }
        }
        let mut expr = Expr::default();
        let pk = expr.name(ctx.pk_name());
        let mut sets = Vec::new();
        let mut removes = Vec::new();
        let mut condition = vec![format!("attribute_exists({pk})")];
        if let Some(token) = &token {
            let t = expr.name(token);
            match recorded {
                Some(value) => {
                    let v = expr.value(av(value));
                    condition.push(format!("{t} = {v}"));
                }
                None => condition.push(format!("attribute_not_exists({t})")),
            }
            // The sources' version, or the count of writes: one more, or 1
            // over what is not a number (a writer put something else there).
            let next = match (&version, recorded) {
                (Some(version), _) => av(version),
                (None, Some(AttributeValue::N(n))) => match n.parse::<u64>() {
                    Ok(n) => Av::N((n + 1).to_string()),
                    Err(_) => Av::N("1".to_string()),
                },
                (None, _) => Av::N("1".to_string()),
            };
            let next = expr.value(next);
            sets.push(format!("{t} = {next}"));
        }
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

/// A custom projection's put or delete that lands only while its source is
/// as its guard says, in one `TransactWriteItems`. A source that moved on
/// means a newer record of it decides: done.
pub(crate) async fn guarded_custom(
    ctx: &Ctx<'_>,
    op: &crate::plan::CustomOp,
    guard: &crate::plan::SourceGuard,
) -> Result<(), WriteError> {
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem};
    let write = match op {
        crate::plan::CustomOp::Put(item) => TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(ctx.table)
                    .set_item(Some(item.clone().into()))
                    .build()
                    .expect("table and item are set"),
            )
            .build(),
        crate::plan::CustomOp::Delete(key) => TransactWriteItem::builder()
            .delete(
                Delete::builder()
                    .table_name(ctx.table)
                    .set_key(Some(ctx.key(key)))
                    .build()
                    .expect("table and key are set"),
            )
            .build(),
    };
    let items = vec![write, super::markers::guard_check(ctx, guard)];
    ctx.count(|r| &mut r.transactions);
    with_retries(
        "custom_guarded",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
            ctx.sent();
            let request = ctx
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move {
                match request.send().await {
                    Ok(output) => {
                        ctx.count_units(output.consumed_capacity(), true);
                        ctx.count_n(|r| &mut r.transaction_items, 2);
                        Ok(())
                    }
                    Err(error) => {
                        let guard_failed = match error.as_service_error() {
                            Some(TransactWriteItemsError::TransactionCanceledException(c)) => c
                                .cancellation_reasons()
                                .get(1)
                                .is_some_and(|r| r.code() == Some("ConditionalCheckFailed")),
                            _ => false,
                        };
                        if guard_failed {
                            // Superseded: the source's newer record decides.
                            return Ok(());
                        }
                        Err(sdk(error))
                    }
                }
            }
        },
    )
    .await
}
