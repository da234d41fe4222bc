//! Online invariant checking, after a batch is written.
//!
//! For every invariant whose scope the batch touched (the partition of a
//! changed item for `exactly-one`, `at-most-one` and `implies`; the old and
//! new derived value for `unique`), the checker reads the current state
//! (a strongly consistent query of the partition; the GSI for `unique`,
//! with holders confirmed by consistent reads) and brings the recorded
//! violations of that scope in step: new ones are recorded (with the record
//! that revealed them and since when), resolved ones are deleted.
//!
//! **Architecture Invariant:** checking never blocks projection. It runs
//! after the writes its scope reads are made (the values of `unique`
//! invariants may be checked while the batch's recomputes are written, when
//! no recompute writes on their entity; everything else after the batch's
//! effects and dead letters are durable), its errors are logged and counted
//! but change no record's status, and it is skipped when the deadline has
//! come. `audit` finds whatever a skipped check missed.
//!
//! A declared repair policy (`keep-latest`) is the only way the projector
//! writes a source item: when several items satisfy a count invariant's
//! condition and the batch shows which one came to satisfy it last, the
//! others are made to stop satisfying it, each on condition that it still
//! does. Those writes come back through the stream and are checked again.

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};
use futures::stream::StreamExt;

use super::ctx::{within, Ctx};
use super::dlq::now;
use super::reads::{query_all, read_markers, read_sources, KeyQuery};
use super::writes::{av, Expr};
use crate::decode::DecodeProblem;
use crate::dynamo::names::violation_pk;
use crate::dynamo::retry::{sdk, with_retries, ErrorClass, WriteError};
use crate::invariant::{
    check_partition, check_unique, keep_latest, scope_prefix, unique_value, RepairWrite, Violation,
};
use crate::plan::SourceQuery;
use crate::record::{AttributeValue, ChangeKind, ChangeRecord, Image, Item, ItemKey, Origin};
use crate::spec::{InvariantKind, RepairPolicy};

/// What the check after a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Scopes (partitions, unique values) checked.
    pub scopes: usize,
    /// Violations found (new or still there).
    pub violations: usize,
    /// Violations newly recorded.
    pub recorded: usize,
    /// Recorded violations deleted because they are resolved.
    pub cleared: usize,
    /// Source items changed by a repair policy.
    pub repaired: usize,
    /// Scopes not checked (deadline, or an error reading them).
    pub unchecked: usize,
}

impl CheckStats {
    pub(crate) fn add(&mut self, other: &CheckStats) {
        self.scopes += other.scopes;
        self.violations += other.violations;
        self.recorded += other.recorded;
        self.cleared += other.cleared;
        self.repaired += other.repaired;
        self.unchecked += other.unchecked;
    }
}

/// One scope to check, with the record that touched it last.
enum Scope<'a> {
    Partition {
        entity: usize,
        pk: String,
        record: &'a ChangeRecord,
        /// Items of the entity the batch changed there (removed ones too).
        touched: Vec<ItemKey>,
    },
    Value {
        invariant: usize,
        value: String,
        record: &'a ChangeRecord,
    },
}

/// What checking one (invariant, scope) found, before the store is synced.
struct Checked<'a> {
    invariant: usize,
    scope: String,
    found: Vec<Violation>,
    /// Sort keys under which a violation of this scope may be recorded.
    candidates: Vec<String>,
    record: &'a ChangeRecord,
}

/// Scopes are checked this many at a time, to bound memory on big batches.
const SCOPES_PER_ROUND: usize = 2_000;

/// The attributes an invariant reads: a change to none of them cannot
/// change its verdict.
fn reads(invariant: &crate::spec::Invariant) -> Vec<String> {
    match &invariant.kind {
        InvariantKind::Count { when, .. } => when.0.iter().map(|(n, _)| n.clone()).collect(),
        InvariantKind::Implies { premise, then } => premise
            .0
            .iter()
            .chain(then.0.iter())
            .map(|(n, _)| n.clone())
            .collect(),
        InvariantKind::Unique { template, .. } => template.names().map(str::to_string).collect(),
    }
}

/// Which of a batch's scopes to check.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part<'t> {
    /// What the batch's recomputes cannot change, checked while they run:
    /// the values of `unique` invariants when no recompute writes on their
    /// entity, and the partitions no target falls in, read once with the
    /// recomputes that read them ahead of their target.
    Early(Recomputed<'t>),
    /// The rest, checked after the recomputes.
    Late(Recomputed<'t>),
}

/// What a batch's recomputes write and read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recomputed<'t> {
    /// Their targets.
    pub targets: &'t [ItemKey],
    /// The partitions read by those that read their target right before
    /// (`denormalize`): checked after them, reusing that read.
    pub read: &'t [SourceQuery],
}

/// Whether no recompute writes on an entity a `unique` invariant checks:
/// then the values can be checked while the recomputes run, right after
/// the batch's other writes.
pub(crate) fn values_precede_recomputes(spec: &crate::spec::Spec) -> bool {
    let recomputed: Vec<usize> = (0..spec.projections.len())
        .filter_map(|id| spec.kind(id).recompute().map(|r| r.target()))
        .collect();
    spec.invariants.iter().all(|invariant| {
        !matches!(invariant.kind, InvariantKind::Unique { .. })
            || !recomputed.contains(&invariant.entity)
    })
}

/// Checks what the batch touched. Never fails: problems are logged,
/// counted, and left to the next check or to `audit`.
pub(crate) async fn check_batch(
    ctx: &Ctx<'_>,
    batch: &[Result<ChangeRecord, DecodeProblem>],
    options: &super::BatchOptions,
    concurrency: usize,
    part: Part<'_>,
) -> CheckStats {
    let deadline = options.deadline;
    let spec = ctx.spec;
    if spec.invariants.is_empty() {
        return CheckStats::default();
    }
    let invariant_reads: Vec<Vec<String>> = spec.invariants.iter().map(reads).collect();
    let mut partitions: BTreeMap<(usize, String), (&ChangeRecord, Vec<ItemKey>)> = BTreeMap::new();
    let mut values: BTreeMap<(usize, String), &ChangeRecord> = BTreeMap::new();
    // For keep-latest: the item that most recently came to satisfy a count
    // invariant's condition, per (invariant, partition).
    let mut latest: HashMap<(usize, String), ItemKey> = HashMap::new();
    // The last state the batch shows of each item (None: removed).
    let mut last_state: HashMap<ItemKey, Option<&Image>> = HashMap::new();
    for record in batch.iter().flatten() {
        if matches!(record.origin, Origin::Scan { .. }) && !options.check_states {
            continue;
        }
        let Some(key) = spec.table.item_key(&record.keys) else {
            continue;
        };
        let mut vars = Vec::new();
        let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) else {
            continue;
        };
        let removed = record.kind == ChangeKind::Remove;
        let new_image = if removed {
            None
        } else {
            record.new_image.as_ref()
        };
        for (id, invariant) in spec.invariants.iter().enumerate() {
            if invariant.entity != entity
                || (record.kind == ChangeKind::Modify
                    && !crate::plan::changed(record, &invariant_reads[id]))
            {
                continue;
            }
            match &invariant.kind {
                InvariantKind::Count {
                    when,
                    repair: Some(RepairPolicy::KeepLatest),
                    ..
                } => {
                    let slot = (id, key.pk.clone());
                    let now_member = when.holds(new_image);
                    let was_member = when.holds(record.old_image.as_ref());
                    // An item derived as it is now (a Kinesis source's, in
                    // any order) tells nothing of which came to satisfy the
                    // condition last: its violation is recorded, not repaired.
                    let derived = matches!(record.origin, Origin::Scan { .. });
                    if derived {
                        latest.remove(&slot);
                    } else if now_member && (!was_member || record.kind == ChangeKind::Insert) {
                        latest.insert(slot, key.clone());
                    } else if !now_member && latest.get(&slot) == Some(&key) {
                        latest.remove(&slot);
                    }
                }
                InvariantKind::Unique { .. } => {
                    for image in [record.old_image.as_ref(), new_image].into_iter().flatten() {
                        if let Some(value) = unique_value(spec, invariant, image) {
                            values.insert((id, value), record);
                        }
                    }
                }
                _ => {}
            }
            if invariant.is_partition_scoped() {
                let slot = partitions
                    .entry((entity, key.pk.clone()))
                    .or_insert_with(|| (record, Vec::new()));
                slot.0 = record;
                if !slot.1.contains(&key) {
                    slot.1.push(key.clone());
                }
            }
        }
        last_state.insert(key, new_image);
    }
    let values_early = values_precede_recomputes(spec);
    let (early, recomputed) = match part {
        Part::Early(recomputed) => (true, recomputed),
        Part::Late(recomputed) => (false, recomputed),
    };
    values.retain(|_, _| values_early == early);
    partitions.retain(|(entity, pk), _| {
        let query = partition_query(spec, *entity, pk);
        let untouched = !recomputed
            .targets
            .iter()
            .any(|target| within(&query, target))
            && !recomputed.read.contains(&query);
        untouched == early
    });
    let shared = early;
    let scopes: Vec<Scope<'_>> = partitions
        .into_iter()
        .map(|((entity, pk), (record, touched))| Scope::Partition {
            entity,
            pk,
            record,
            touched,
        })
        .chain(
            values
                .into_iter()
                .map(|((invariant, value), record)| Scope::Value {
                    invariant,
                    value,
                    record,
                }),
        )
        .collect();
    // The values some item of the batch holds after it. A value the batch
    // only released can have no new violation (a holder gone makes no
    // duplicate): it is checked only if a violation is recorded for it,
    // once the read of the recorded ones says so.
    let held: HashSet<(usize, String)> = spec
        .invariants
        .iter()
        .enumerate()
        .filter(|(_, invariant)| matches!(invariant.kind, InvariantKind::Unique { .. }))
        .flat_map(|(id, invariant)| {
            last_state
                .values()
                .flatten()
                .filter_map(move |image| unique_value(spec, invariant, *image).map(|v| (id, v)))
        })
        .collect();
    let released = |scope: &Scope<'_>| match scope {
        Scope::Value {
            invariant, value, ..
        } => !held.contains(&(*invariant, value.clone())),
        Scope::Partition { .. } => false,
    };
    let mut total = CheckStats::default();
    for round in scopes.chunks(SCOPES_PER_ROUND) {
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            total.scopes += round.len();
            total.unchecked += round.len();
            metrics::counter!("projector_invariant_checks_skipped_total", "reason" => "deadline")
                .increment(round.len() as u64);
            continue;
        }
        let (now, later): (Vec<&Scope<'_>>, Vec<&Scope<'_>>) =
            round.iter().partition(|scope| !released(scope));
        let futures: Vec<_> = now
            .iter()
            .map(|scope| check_scope(ctx, scope, deadline, &latest, &last_state, shared))
            .collect();
        // The violations recorded where the round's scopes may have them
        // are read meanwhile: one round trip fewer before they are synced.
        let ahead = stored_keys(ctx, round);
        // Boxed: left as it is, the combinator's type makes the batch's
        // future non-`Send` (a rustc limitation with higher-ranked
        // lifetimes), and callers spawn batches on a multi-threaded runtime.
        type Results<'c> = Vec<(CheckStats, Vec<Checked<'c>>)>;
        let checking: std::pin::Pin<
            Box<dyn std::future::Future<Output = Results<'_>> + Send + '_>,
        > = Box::pin(
            futures::stream::iter(futures)
                .buffer_unordered(concurrency.max(1))
                .collect::<Vec<_>>(),
        );
        // The released values with a violation recorded are checked once
        // the read of the recorded ones answers, beside the other checks.
        type Stored = Result<HashMap<ItemKey, Item>, WriteError>;
        type Released<'c> =
            std::pin::Pin<Box<dyn std::future::Future<Output = (Stored, Results<'c>)> + Send + 'c>>;
        let released_checks: Released<'_> = Box::pin(async {
            if ahead.is_empty() {
                return (Ok(HashMap::new()), Vec::new());
            }
            ctx.count(|r| &mut r.check_reads);
            let stored = read_markers(ctx, ahead.iter().collect()).await;
            let Ok(found) = &stored else {
                return (stored, Vec::new());
            };
            let due: Vec<_> = later
                .iter()
                .filter(|scope| match scope {
                    Scope::Value {
                        invariant, value, ..
                    } => found.contains_key(&ItemKey {
                        pk: violation_pk(&spec.invariants[*invariant].name),
                        sk: Some(scope_prefix(value)),
                    }),
                    Scope::Partition { .. } => true,
                })
                .map(|scope| check_scope(ctx, scope, deadline, &latest, &last_state, shared))
                .collect();
            let results = futures::stream::iter(due)
                .buffer_unordered(concurrency.max(1))
                .collect::<Vec<_>>()
                .await;
            (stored, results)
        });
        let (mut results, (stored, more)) = tokio::join!(checking, released_checks);
        // A released value without a recorded violation counts as checked.
        total.scopes += later.len() - more.len();
        results.extend(more);
        let mut checked = Vec::new();
        for (stats, found) in results {
            total.add(&stats);
            checked.extend(found);
        }
        let (synced, unread) = match stored {
            Ok(stored) => (sync(ctx, &checked, &mut total, &ahead, stored).await, 0),
            // The released values went unchecked too.
            Err(error) => (Err(error), later.len()),
        };
        if let Err(error) = synced {
            total.unchecked += checked.len() + unread;
            metrics::counter!("projector_invariant_checks_skipped_total", "reason" => "error")
                .increment((checked.len() + unread) as u64);
            tracing::warn!(%error, "recording invariant violations failed; `audit` will find them");
        }
    }
    total
}

async fn check_scope<'a>(
    ctx: &Ctx<'_>,
    scope: &Scope<'a>,
    deadline: Option<tokio::time::Instant>,
    latest: &HashMap<(usize, String), ItemKey>,
    last_state: &HashMap<ItemKey, Option<&Image>>,
    shared: bool,
) -> (CheckStats, Vec<Checked<'a>>) {
    let mut stats = CheckStats {
        scopes: 1,
        ..CheckStats::default()
    };
    // Checked per scope too: a round may outlast the time that was left.
    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
        stats.unchecked = 1;
        metrics::counter!("projector_invariant_checks_skipped_total", "reason" => "deadline")
            .increment(1);
        return (stats, Vec::new());
    }
    let result = match scope {
        Scope::Partition {
            entity,
            pk,
            record,
            touched,
        } => {
            let read = PartitionRead { shared, latest };
            check_partition_scope(ctx, *entity, pk, record, touched, &mut stats, read).await
        }
        Scope::Value {
            invariant,
            value,
            record,
        } => check_value_scope(ctx, *invariant, value, record, last_state).await,
    };
    match result {
        Ok(checked) => (stats, checked),
        Err(error) => {
            stats.unchecked = 1;
            metrics::counter!("projector_invariant_checks_skipped_total", "reason" => "error")
                .increment(1);
            tracing::warn!(%error, "invariant check failed; `audit` will find what it missed");
            (stats, Vec::new())
        }
    }
}

/// How a partition check reads its partition, and what it repairs.
#[derive(Debug, Clone, Copy)]
struct PartitionRead<'l> {
    /// Once with the batch's recomputes ([`Ctx::read_shared`]), while
    /// they run; otherwise after them, reusing what they read.
    shared: bool,
    /// For keep-latest: the item that came to satisfy a count
    /// invariant's condition last, per (invariant, partition).
    latest: &'l HashMap<(usize, String), ItemKey>,
}

/// The query that reads an entity's items in a partition.
pub(crate) fn partition_query(spec: &crate::spec::Spec, entity: usize, pk: &str) -> SourceQuery {
    SourceQuery {
        pk: pk.to_string(),
        sk_prefix: spec.entities[entity]
            .sk
            .as_ref()
            .map(|sk| sk.literal_prefix().to_string())
            .filter(|p| !p.is_empty()),
    }
}

async fn check_partition_scope<'a>(
    ctx: &Ctx<'_>,
    entity: usize,
    pk: &str,
    record: &'a ChangeRecord,
    touched: &[ItemKey],
    stats: &mut CheckStats,
    read: PartitionRead<'_>,
) -> Result<Vec<Checked<'a>>, WriteError> {
    let spec = ctx.spec;
    let latest = read.latest;
    let query = partition_query(spec, entity, pk);
    // A recompute of this batch read the same items after the batch's
    // other writes: the same state this read would see, unless someone
    // else wrote since (whose stream record brings its own check). While
    // the recomputes run, the read is shared with them.
    let items = match (read.shared, ctx.partition_read(&query)) {
        (true, _) => ctx.read_shared(&query, |r| &mut r.check_reads).await?,
        (false, Some(items)) => items,
        (false, None) => {
            ctx.count(|r| &mut r.check_reads);
            read_sources(ctx, &query).await?
        }
    };
    let mut out = Vec::new();
    for (id, invariant) in spec.invariants.iter().enumerate() {
        if invariant.entity != entity || !invariant.is_partition_scoped() {
            continue;
        }
        let mut found = check_partition(spec, invariant, pk, &items);
        if let (Some(keep), Some(violation)) = (latest.get(&(id, pk.to_string())), found.first()) {
            if violation.keys.len() > 1 && violation.keys.contains(keep) {
                let writes = keep_latest(invariant, &violation.keys, keep);
                let mut all = !writes.is_empty();
                for write in &writes {
                    match repair(ctx, write).await {
                        Ok(true) => {
                            stats.repaired += 1;
                            metrics::counter!("projector_invariant_repairs_total", "invariant" => invariant.name.clone()).increment(1);
                            tracing::info!(invariant = %invariant.name, item = %write.key, kept = %keep, "repaired: the item no longer satisfies the invariant's condition");
                        }
                        Ok(false) => all = false,
                        Err(error) => {
                            all = false;
                            tracing::warn!(invariant = %invariant.name, item = %write.key, %error, "repair failed");
                        }
                    }
                }
                if all {
                    found.clear();
                }
            }
        }
        let prefix = scope_prefix(pk);
        let mut candidates = vec![prefix.clone()];
        if matches!(invariant.kind, InvariantKind::Implies { .. }) {
            let items_here = items
                .iter()
                .filter_map(|item| spec.table.item_key(item))
                .chain(touched.iter().cloned());
            for key in items_here {
                let sk = format!("{prefix}{}", key.sk.as_deref().unwrap_or(""));
                if !candidates.contains(&sk) {
                    candidates.push(sk);
                }
            }
        }
        out.push(Checked {
            invariant: id,
            scope: pk.to_string(),
            found,
            candidates,
            record,
        });
    }
    Ok(out)
}

/// The items the index `index` says hold `value` in `attribute`: the
/// keys alone (other attributes may hold types this build cannot read,
/// and the key is all a check needs). The index lags the table.
pub(crate) async fn value_holders(
    ctx: &Ctx<'_>,
    index: &str,
    attribute: &str,
    value: &str,
) -> Result<HashSet<ItemKey>, WriteError> {
    let spec = ctx.spec;
    let mut expr = Expr::default();
    let name = expr.name(attribute);
    let v = expr.value(Av::S(value.to_string()));
    let query = KeyQuery {
        what: "check_unique",
        index: Some(index),
        condition: format!("{name} = {v}"),
        expr,
        limit: Some(1000),
    };
    Ok(query_all(ctx, query)
        .await?
        .into_iter()
        .filter_map(|item| {
            spec.table
                .item_key(&Item::from(spec.table.key_attributes(&item)))
        })
        .collect())
}

async fn check_value_scope<'a>(
    ctx: &Ctx<'_>,
    id: usize,
    value: &str,
    record: &'a ChangeRecord,
    last_state: &HashMap<ItemKey, Option<&Image>>,
) -> Result<Vec<Checked<'a>>, WriteError> {
    let spec = ctx.spec;
    let invariant = &spec.invariants[id];
    let InvariantKind::Unique {
        index, attribute, ..
    } = &invariant.kind
    else {
        return Ok(Vec::new());
    };
    ctx.count(|r| &mut r.check_reads);
    let mut holders = value_holders(ctx, index, attribute, value).await?;
    // The GSI lags the table: add what the batch just made hold the value.
    for (key, state) in last_state {
        if state
            .and_then(|item| unique_value(spec, invariant, item))
            .as_deref()
            == Some(value)
        {
            holders.insert(key.clone());
        }
    }
    let owners: HashSet<&str> = holders.iter().map(|k| k.pk.as_str()).collect();
    let mut confirmed: Vec<ItemKey> = Vec::new();
    if owners.len() > 1 {
        // Confirm each holder with a consistent read before accusing it.
        ctx.count(|r| &mut r.check_reads);
        let items = read_markers(ctx, holders.iter().collect()).await?;
        for (key, item) in items {
            if unique_value(spec, invariant, &item).as_deref() == Some(value) {
                confirmed.push(key);
            }
        }
    }
    Ok(vec![Checked {
        invariant: id,
        scope: value.to_string(),
        found: check_unique(invariant, value, &confirmed)
            .into_iter()
            .collect(),
        candidates: vec![scope_prefix(value)],
        record,
    }])
}

/// Makes a repair write; `Ok(false)` when the item no longer needs it.
async fn repair(ctx: &Ctx<'_>, write: &RepairWrite) -> Result<bool, WriteError> {
    let mut expr = Expr::default();
    let attr = expr.name(&write.attribute);
    let update = match &write.value {
        Some(value) => {
            let v = expr.value(av(value));
            format!("SET {attr} = {v}")
        }
        None => format!("REMOVE {attr}"),
    };
    let condition = write
        .expect
        .0
        .iter()
        .map(|(name, value)| {
            let n = expr.name(name);
            let v = expr.value(av(value));
            format!("{n} = {v}")
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    let (names, values) = expr.values();
    let key = ctx.key(&write.key);
    ctx.count(|r| &mut r.updates);
    let result = with_retries(
        "invariant_repair",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
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
                    Ok(output) => Ok(Some(output)),
                    Err(error) => {
                        let (class, message) = sdk(error);
                        match class {
                            ErrorClass::Conditional => Ok(None),
                            other => Err((other, message)),
                        }
                    }
                }
            }
        },
    )
    .await?;
    ctx.sent();
    match result {
        Some(output) => {
            ctx.count_units(output.consumed_capacity(), true);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Brings the recorded violations of the checked scopes in step with what
/// was found: one consistent batch read of every key a violation of those
/// scopes may be recorded under, then puts and deletes.
/// The recorded violations a round's scopes can be known to have before
/// they are checked: each invariant's scope prefix, and for `implies` the
/// items the batch touched.
fn stored_keys(ctx: &Ctx<'_>, scopes: &[Scope<'_>]) -> Vec<ItemKey> {
    let spec = ctx.spec;
    let mut keys: Vec<ItemKey> = Vec::new();
    let mut seen: HashSet<ItemKey> = HashSet::new();
    let mut add = |invariant: &str, sk: String| {
        let key = ItemKey {
            pk: violation_pk(invariant),
            sk: Some(sk),
        };
        if seen.insert(key.clone()) {
            keys.push(key);
        }
    };
    for scope in scopes {
        match scope {
            Scope::Partition {
                entity,
                pk,
                touched,
                ..
            } => {
                for invariant in &spec.invariants {
                    if invariant.entity != *entity || !invariant.is_partition_scoped() {
                        continue;
                    }
                    let prefix = scope_prefix(pk);
                    add(&invariant.name, prefix.clone());
                    if matches!(invariant.kind, InvariantKind::Implies { .. }) {
                        // And the partition's other items, when a recompute
                        // of the batch read them already.
                        let read = ctx
                            .partition_read(&partition_query(spec, *entity, pk))
                            .unwrap_or_default();
                        let items = read.iter().filter_map(|item| spec.table.item_key(item));
                        for key in touched.iter().cloned().chain(items) {
                            add(
                                &invariant.name,
                                format!("{prefix}{}", key.sk.as_deref().unwrap_or("")),
                            );
                        }
                    }
                }
            }
            Scope::Value {
                invariant, value, ..
            } => add(&spec.invariants[*invariant].name, scope_prefix(value)),
        }
    }
    keys
}

async fn sync(
    ctx: &Ctx<'_>,
    checked: &[Checked<'_>],
    stats: &mut CheckStats,
    ahead: &[ItemKey],
    mut stored: HashMap<ItemKey, Item>,
) -> Result<(), WriteError> {
    let mut keys: Vec<ItemKey> = Vec::new();
    for c in checked {
        let pk = violation_pk(&ctx.spec.invariants[c.invariant].name);
        let sks = c
            .candidates
            .iter()
            .cloned()
            .chain(c.found.iter().map(Violation::record_sk));
        for sk in sks {
            let key = ItemKey {
                pk: pk.clone(),
                sk: Some(sk),
            };
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    // What was not read ahead: `implies` violations of items the batch did
    // not touch.
    let ahead: HashSet<&ItemKey> = ahead.iter().collect();
    keys.retain(|key| !ahead.contains(key));
    if !keys.is_empty() {
        ctx.count(|r| &mut r.check_reads);
        stored.extend(read_markers(ctx, keys.iter().collect()).await?);
    }
    // What to write, decided first; the writes then go out together.
    enum Sync<'v, 'r> {
        Put(&'v Violation, &'r ChangeRecord, &'v str, bool),
        Delete(&'v str, &'v str, String),
    }
    let mut writes: Vec<Sync<'_, '_>> = Vec::new();
    for c in checked {
        let invariant = ctx.spec.invariants[c.invariant].name.as_str();
        let pk = violation_pk(invariant);
        stats.violations += c.found.len();
        let stored_of = |sk: &str| {
            stored.get(&ItemKey {
                pk: pk.clone(),
                sk: Some(sk.to_string()),
            })
        };
        let mut wanted = HashSet::new();
        for violation in &c.found {
            let sk = violation.record_sk();
            wanted.insert(sk.clone());
            let existing = stored_of(&sk);
            if existing.is_some_and(|item| stored_matches(item, violation)) {
                continue;
            }
            writes.push(Sync::Put(violation, c.record, &c.scope, existing.is_none()));
        }
        for sk in &c.candidates {
            if wanted.contains(sk) || stored_of(sk).is_none() {
                continue;
            }
            writes.push(Sync::Delete(invariant, &c.scope, sk.clone()));
        }
    }
    let sent: Vec<_> = writes
        .iter()
        .map(|write| async move {
            match write {
                Sync::Put(violation, record, _, _) => {
                    put_violation(ctx, violation, Some(record)).await
                }
                Sync::Delete(invariant, _, sk) => delete_violation(ctx, invariant, sk).await,
            }
        })
        .collect();
    let results: Vec<Result<(), WriteError>> = futures::stream::iter(sent)
        .buffered(ctx.config.concurrency.max(1))
        .collect()
        .await;
    for (write, result) in writes.iter().zip(results) {
        result?;
        match write {
            Sync::Put(violation, record, scope, true) => {
                let invariant = violation.invariant.as_str();
                stats.recorded += 1;
                // Unlabelled, so the alarm on FunctionName alone matches it.
                metrics::counter!("projector_invariant_violations_total").increment(1);
                metrics::counter!("projector_invariant_violations_by_invariant_total", "invariant" => invariant.to_string()).increment(1);
                tracing::warn!(
                    invariant,
                    scope = %scope,
                    message = %violation.message,
                    event_id = %record.event_id,
                    "invariant violated"
                );
            }
            Sync::Put(..) => {}
            Sync::Delete(invariant, scope, _) => {
                stats.cleared += 1;
                metrics::counter!("projector_invariant_violations_cleared_total", "invariant" => invariant.to_string()).increment(1);
                tracing::info!(invariant, scope = %scope, "invariant violation resolved");
            }
        }
    }
    Ok(())
}

/// The keys of a violation as stored (`pk / sk`).
fn key_texts(violation: &Violation) -> Vec<String> {
    violation.keys.iter().map(ToString::to_string).collect()
}

/// Whether a stored violation item says what `violation` says (message and
/// the items involved), so it need not be written again. Comparing the
/// message alone misses a third item joining the same owners.
fn stored_matches(item: &Item, violation: &Violation) -> bool {
    let message = match item.get("message") {
        Some(AttributeValue::S(m)) => m.as_str(),
        _ => return false,
    };
    let keys: Vec<&str> = match item.get("keys") {
        Some(AttributeValue::L(keys)) => keys
            .iter()
            .filter_map(|k| match k {
                AttributeValue::S(k) => Some(k.as_str()),
                _ => None,
            })
            .collect(),
        _ => return false,
    };
    message == violation.message && keys == key_texts(violation)
}

/// Records (or refreshes) a violation; `since` keeps its first value.
pub(crate) async fn put_violation(
    ctx: &Ctx<'_>,
    violation: &Violation,
    record: Option<&ChangeRecord>,
) -> Result<(), WriteError> {
    let key = ctx.key(&ItemKey {
        pk: violation_pk(&violation.invariant),
        sk: Some(violation.record_sk()),
    });
    let mut expr = Expr::default();
    let mut sets = Vec::new();
    let mut set = |expr: &mut Expr, name: &str, value: Av| {
        let n = expr.name(name);
        let v = expr.value(value);
        sets.push(format!("{n} = {v}"));
    };
    set(&mut expr, "invariant", Av::S(violation.invariant.clone()));
    set(&mut expr, "kind", Av::S(violation.kind.to_string()));
    set(&mut expr, "scope", Av::S(violation.scope.clone()));
    set(&mut expr, "message", Av::S(violation.message.clone()));
    set(
        &mut expr,
        "keys",
        Av::L(
            violation
                .keys
                .iter()
                .map(|k| Av::S(k.to_string()))
                .collect(),
        ),
    );
    let at = now();
    set(&mut expr, "lastSeen", Av::S(at.clone()));
    if let Some(record) = record {
        let mut revealed = HashMap::new();
        revealed.insert("eventId".to_string(), Av::S(record.event_id.clone()));
        revealed.insert(
            "sequenceNumber".to_string(),
            Av::S(record.sequence_number.to_string()),
        );
        revealed.insert(
            "eventName".to_string(),
            Av::S(record.kind.as_str().to_string()),
        );
        if let Some(key) = ctx.spec.table.item_key(&record.keys) {
            revealed.insert("key".to_string(), Av::S(key.to_string()));
        }
        set(&mut expr, "revealedBy", Av::M(revealed));
    }
    let since = expr.name("since");
    let since_value = expr.value(Av::S(at));
    sets.push(format!("{since} = if_not_exists({since}, {since_value})"));
    let update = format!("SET {}", sets.join(", "));
    let (names, values) = expr.values();
    ctx.count(|r| &mut r.updates);
    let output = with_retries(
        "record_violation",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
            let request = ctx
                .client
                .update_item()
                .table_name(ctx.table)
                .set_key(Some(key.clone()))
                .update_expression(&update)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(values.clone())
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move { request.send().await.map_err(sdk) }
        },
    )
    .await?;
    ctx.sent();
    ctx.count_units(output.consumed_capacity(), true);
    Ok(())
}

/// Deletes a recorded violation.
pub(crate) async fn delete_violation(
    ctx: &Ctx<'_>,
    invariant: &str,
    sk: &str,
) -> Result<(), WriteError> {
    let key = ctx.key(&ItemKey {
        pk: violation_pk(invariant),
        sk: Some(sk.to_string()),
    });
    ctx.count(|r| &mut r.single_writes);
    let output = with_retries(
        "clear_violation",
        ctx.config.max_retry_time,
        &ctx.retries,
        || {
            let request = ctx
                .client
                .delete_item()
                .table_name(ctx.table)
                .set_key(Some(key.clone()))
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            async move { request.send().await.map_err(sdk) }
        },
    )
    .await?;
    ctx.sent();
    ctx.count_units(output.consumed_capacity(), true);
    Ok(())
}

/// A violation as recorded in the table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecordedViolation {
    /// The invariant's name.
    pub invariant: String,
    /// Its kind.
    pub kind: String,
    /// The partition key or unique value.
    pub scope: String,
    /// The items involved (`pk / sk`).
    pub keys: Vec<String>,
    /// What is wrong.
    pub message: String,
    /// When it was first recorded.
    pub since: String,
    /// When it was last confirmed.
    pub last_seen: String,
    /// The record that revealed it (event id, sequence number, event name, key).
    pub revealed_by: BTreeMap<String, String>,
    /// Its sort key in `_ddbp#violation#<invariant>`.
    #[serde(skip)]
    pub record_sk: String,
}

fn text(item: &HashMap<String, Av>, name: &str) -> String {
    match item.get(name) {
        Some(Av::S(s)) => s.clone(),
        _ => String::new(),
    }
}

/// Every recorded violation of every invariant of the spec.
pub(crate) async fn recorded(ctx: &Ctx<'_>) -> Result<Vec<RecordedViolation>, WriteError> {
    let mut out = Vec::new();
    let Some(sk_name) = ctx.spec.table.sort_key.clone() else {
        return Ok(out);
    };
    for invariant in &ctx.spec.invariants {
        let mut expr = Expr::default();
        let pk = expr.name(&ctx.spec.table.partition_key);
        let pk_value = expr.value(Av::S(violation_pk(&invariant.name)));
        let query = KeyQuery {
            what: "read_violations",
            index: None,
            condition: format!("{pk} = {pk_value}"),
            expr,
            limit: None,
        };
        for item in &query_all(ctx, query).await? {
            let revealed_by = match item.get("revealedBy") {
                Some(Av::M(map)) => map
                    .iter()
                    .filter_map(|(k, v)| match v {
                        Av::S(s) => Some((k.clone(), s.clone())),
                        _ => None,
                    })
                    .collect(),
                _ => BTreeMap::new(),
            };
            let keys = match item.get("keys") {
                Some(Av::L(list)) => list
                    .iter()
                    .filter_map(|v| match v {
                        Av::S(s) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            out.push(RecordedViolation {
                invariant: text(item, "invariant"),
                kind: text(item, "kind"),
                scope: text(item, "scope"),
                keys,
                message: text(item, "message"),
                since: text(item, "since"),
                last_seen: text(item, "lastSeen"),
                revealed_by,
                record_sk: text(item, &sk_name),
            });
        }
    }
    Ok(out)
}

/// Records each of `found` not recorded as it is; returns how many were
/// new.
pub(crate) async fn record_all(ctx: &Ctx<'_>, found: &[Violation]) -> Result<usize, WriteError> {
    let stored = recorded(ctx).await?;
    let mut recorded_n = 0;
    for violation in found {
        let existing = stored
            .iter()
            .find(|s| s.invariant == violation.invariant && s.record_sk == violation.record_sk());
        if existing
            .is_some_and(|s| s.message == violation.message && s.keys == key_texts(violation))
        {
            continue;
        }
        put_violation(ctx, violation, None).await?;
        if existing.is_none() {
            recorded_n += 1;
            metrics::counter!("projector_invariant_violations_total").increment(1);
            metrics::counter!("projector_invariant_violations_by_invariant_total", "invariant" => violation.invariant.clone()).increment(1);
        }
    }
    Ok(recorded_n)
}

/// Deletes every recorded violation but `wanted` ((invariant, recorded
/// key) pairs) that was last seen before `seen_before_ms` (when the audit
/// that found `wanted` began: one recorded or confirmed since is newer
/// than what the audit read); returns how many went.
pub(crate) async fn clear_except(
    ctx: &Ctx<'_>,
    wanted: &[(String, String)],
    seen_before_ms: u64,
) -> Result<usize, WriteError> {
    let wanted: HashSet<(&str, &str)> = wanted
        .iter()
        .map(|(i, k)| (i.as_str(), k.as_str()))
        .collect();
    let before = |last_seen: &str| {
        aws_smithy_types::DateTime::from_str(
            last_seen,
            aws_smithy_types::date_time::Format::DateTime,
        )
        .ok()
        .and_then(|at| at.to_millis().ok())
        .is_some_and(|at| (at as u64) < seen_before_ms)
    };
    let mut cleared = 0;
    for stale in recorded(ctx).await?.iter().filter(|s| {
        !wanted.contains(&(s.invariant.as_str(), s.record_sk.as_str())) && before(&s.last_seen)
    }) {
        delete_violation(ctx, &stale.invariant, &stale.record_sk).await?;
        cleared += 1;
    }
    Ok(cleared)
}
