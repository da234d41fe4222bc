//! Reading write-sharded counters: the sum of their shards.

use std::collections::HashMap;

use anyhow::{bail, Context};
use aws_sdk_dynamodb::types::{AttributeValue as Av, KeysAndAttributes};

use crate::dynamo::retry::{Retrier, UNPROCESSED_RETRIES};
use crate::spec::Spec;

/// The attribute that holds a counter shard's value.
pub use crate::dynamo::names::COUNT_ATTRIBUTE;

/// The value of counter `name` for `vars` (`[("userId", "u42")]`): the sum
/// of its shards, read consistently, in the version readers read.
///
/// A changed counter is rebuilt beside the version readers read, which the
/// worker keeps current meanwhile; readers switch when the rebuild's
/// backfill completes. So the shards read are those the lifecycle registry
/// names (`_ddbp#lifecycle` / `p#<name>`: `readStorage`, `readShards`),
/// one consistent `GetItem` before the shards' `BatchGetItem`; a counter
/// no backfill completed yet is read where its definition writes it.
pub async fn read_counter(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    name: &str,
    vars: &[(String, String)],
) -> anyhow::Result<i64> {
    let Some(id) = spec.projection_id(name) else {
        let counters: Vec<&str> = spec.counters().map(|(_, p, _)| p.name.as_str()).collect();
        bail!(
            "no counter `{name}` in {} (counters: {})",
            spec.file,
            counters.join(", ")
        );
    };
    let Some(counter) = spec.counter(id) else {
        bail!(
            "projection `{name}` is a {}, not a counter",
            spec.projections[id].kind_name()
        );
    };
    let registry = crate::control::Registry::new(client.clone(), table, &spec.table);
    let read = registry
        .read_version(name)
        .await
        .map_err(|error| anyhow::anyhow!("reading which version of `{name}` to read: {error}"))?;
    let (storage, shards, names) = match read {
        // The read version's own variables: a rebuilt counter's may be
        // others than the spec's (a global count made per user).
        Some(read) => (read.storage, read.shards, read.vars),
        // No version recorded yet: a counter never backfilled (where its
        // definition writes it), or a registry from before versions were
        // recorded, whose old version the layout finds.
        None => {
            let (laid, _) = registry.layout(spec).await.map_err(|error| {
                anyhow::anyhow!("reading which version of `{name}` to read: {error}")
            })?;
            let read = laid
                .projection_id(name)
                .map(|id| laid.old_version(id).unwrap_or(id));
            match read.and_then(|id| laid.counter(id)) {
                Some(c) => (
                    c.storage.clone(),
                    c.shards,
                    c.of.iter().map(|(v, _)| v.clone()).collect(),
                ),
                _ => (
                    name.to_string(),
                    counter.shards,
                    counter.of.iter().map(|(v, _)| v.clone()).collect(),
                ),
            }
        }
    };
    let mut values = Vec::new();
    for var in &names {
        let Some((_, value)) = vars.iter().find(|(k, _)| k == var) else {
            bail!("counter `{name}` needs {var}=VALUE");
        };
        values.push(value.clone());
    }
    if let Some((extra, _)) = vars.iter().find(|(k, _)| !names.contains(k)) {
        bail!(
            "counter `{name}` has no variable `{extra}` (it has: {})",
            names.join(", ")
        );
    }
    let keys: Vec<HashMap<String, Av>> = (0..shards)
        .map(|shard| {
            spec.table
                .key_item(&spec.counter_shard_key(&storage, &values, shard))
                .into()
        })
        .collect();
    let mut total = 0i64;
    let mut pending = keys;
    let mut leftovers = Retrier::scheduled(UNPROCESSED_RETRIES);
    while !pending.is_empty() {
        if leftovers.is_spent() {
            bail!("DynamoDB kept leaving counter shards unprocessed");
        }
        let chunk: Vec<_> = pending.drain(..pending.len().min(100)).collect();
        let request = KeysAndAttributes::builder()
            .set_keys(Some(chunk))
            .consistent_read(true)
            .build()
            .context("building the shard read")?;
        let output = client
            .batch_get_item()
            .request_items(table, request)
            .send()
            .await
            .map_err(|error| {
                anyhow::anyhow!(
                    "reading counter `{name}` from `{table}`: {}",
                    crate::dynamo::retry::describe(&error)
                )
            })?;
        for item in output
            .responses()
            .and_then(|r| r.get(table))
            .into_iter()
            .flatten()
        {
            if let Some(Av::N(n)) = item.get(COUNT_ATTRIBUTE) {
                total += n
                    .parse::<i64>()
                    .with_context(|| format!("counter shard holds `{n}`"))?;
            }
        }
        if let Some(left) = output.unprocessed_keys().and_then(|u| u.get(table)) {
            pending.extend(left.keys().iter().cloned());
            leftovers.wait(|_| {}).await;
        }
    }
    Ok(total)
}
