//! Marker items and the counter records they carry.
//!
//! A marker item (a reverse edge, or a counter's own marker) exists while
//! its source item is in the set. Each counter that counts the source
//! keeps a *record* on it: in the map attribute `_ddbp#c`, the counter's
//! name maps to the partition key of the shard the source counts in. Every
//! write here goes from the state the marker is in to the state the plan
//! wants:
//!
//! - the write is conditional on what it starts from: existence, and the
//!   records it changes or deletes (pins; a delete pins the whole map, so
//!   no record of any counter, even one the spec has dropped, goes
//!   unnoticed);
//! - the shards move, in the same `TransactWriteItems`, by exactly the
//!   records the write adds (+1), moves (-1 old, +1 new) or removes (-1);
//! - so each shard always equals the number of records naming it, for
//!   every counter the table ever had, whatever is delivered twice,
//!   replayed, backfilled, repaired, or dropped from the spec and added back.
//!
//! The first write is a guess from the record's old image (a new follow
//! finds no edge; an unfollow finds the edge with its records). When the
//! guess is wrong, DynamoDB cancels the write and returns the marker as it
//! is (`ALL_OLD`); the exact transition from that state is written next,
//! again conditionally. A marker probably settled already (created and
//! removed within the batch), and every marker of a backfill, is read
//! first instead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue as Av, ConditionCheck, Delete, Put, ReturnConsumedCapacity,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use futures::stream::StreamExt;

use super::ctx::Ctx;
use super::writes::{av, Expr};
use crate::decode::item_from_sdk;
use crate::dynamo::names::{
    CHANGES_ATTRIBUTE, COUNTER_MARKER_PREFIX, COUNT_ATTRIBUTE, RECORDS_ATTRIBUTE,
};
use crate::dynamo::retry::{classify_code, policy, sdk, ErrorClass, Retrier, WriteError};
use crate::kinds::Writes;
use crate::plan::{CounterShard, Effect, MarkerState, Op, SourceGuard};
use crate::record::{AttributeValue, Item, ItemKey};
use crate::spec::{values_equal, Spec};

/// The most items one `TransactWriteItems` takes.
const MAX_TRANSACTION_ITEMS: usize = 100;

/// How many times one change is written again after finding its marker
/// other than it guessed (each time from the state DynamoDB returned).
const MAX_ROUNDS: usize = 8;

/// What one change wants of its item.
#[derive(Debug)]
pub(crate) enum Want<'e> {
    /// The marker reaches `state`; while present, each counter of
    /// `counters` records its shard on it.
    State {
        state: &'e MarkerState,
        counters: &'e [CounterShard],
        /// Names of `counters`, in the same order.
        names: Vec<String>,
        /// Attributes the projection copies (removed when not wanted).
        managed: Vec<String>,
        /// Attributes other projections write on the marker's entity:
        /// left as they are. Anything else the marker holds beyond its key,
        /// its copies and its records goes.
        keep: Vec<String>,
        /// Names of every counter of the spec. A record of one that is not
        /// in `counters` stays (a scan moves it, shard and all); a record
        /// of a counter the spec no longer has goes with its shard moved.
        known: Vec<String>,
        /// The guess of the marker's state before.
        was_present: bool,
    },
    /// Counter `name`'s record goes (the whole item, when it is that
    /// counter's own marker), moving its shard by -1.
    Drop {
        name: String,
        shard: &'e str,
        whole: bool,
    },
}

/// One marker change.
#[derive(Debug)]
pub(crate) struct MarkerChange<'e> {
    /// The item written.
    pub key: &'e ItemKey,
    pub want: Want<'e>,
    /// For snapshot-planned changes: the source state to check.
    pub guard: Option<&'e SourceGuard>,
}

/// A place in a marker item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Path {
    /// A top-level attribute (a copy, or the records map whole).
    Attribute(String),
    /// One counter's record in the records map.
    Record(String),
}

/// The request that brings an item from one state to another.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// Create it (on condition that it does not exist).
    Put(Item),
    /// Change these attributes (on condition that it exists, with the pins).
    Update {
        set: Vec<(Path, AttributeValue)>,
        remove: Vec<Path>,
    },
    /// Delete it (on condition that it exists, with the pins).
    Delete,
}

/// A write, what it assumes, and the shard moves it implies.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Transition {
    pub write: Write,
    /// Places and the value the write assumes there (`None`: absent).
    pub pins: Vec<(Path, Option<AttributeValue>)>,
    /// Shard partition keys and how far each moves.
    pub deltas: Vec<(String, i64)>,
}

/// The records an item carries: counter name to shard partition key.
pub(crate) fn records_of(item: &Item) -> BTreeMap<String, AttributeValue> {
    match item.get(RECORDS_ATTRIBUTE) {
        Some(AttributeValue::M(map)) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => BTreeMap::new(),
    }
}

fn records_value(records: &BTreeMap<String, AttributeValue>) -> AttributeValue {
    AttributeValue::M(
        records
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// The pin of the whole records map as `records` has it.
fn records_pin(old: Option<&AttributeValue>) -> (Path, Option<AttributeValue>) {
    (Path::Attribute(RECORDS_ATTRIBUTE.to_string()), old.cloned())
}

/// Names of every counter of the spec.
pub(crate) fn known_counters(spec: &Spec) -> Vec<String> {
    spec.counters()
        .map(|(_, _, c)| c.storage.clone())
        .chain(spec.frozen.iter().cloned())
        .collect()
}

/// Attributes other projections write on the items of the entity whose
/// markers `projection` keeps (index keys or copies onto reverse items).
pub(crate) fn foreign_attributes(
    spec: &Spec,
    projection: crate::spec::ProjectionId,
) -> Vec<String> {
    let Writes::Items { entity: target, .. } = spec
        .kind(projection)
        .writes(&spec.projections[projection].name)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for id in 0..spec.projections.len() {
        if id == projection {
            continue;
        }
        if let Some((entity, written)) = crate::kinds::written_attributes(spec, id) {
            if entity == target {
                out.extend(written);
            }
        }
    }
    out
}

/// What a membership or record effect wants of its marker item (`None`
/// for other effects).
pub(crate) fn marker_change<'e>(spec: &Spec, effect: &'e Effect) -> Option<MarkerChange<'e>> {
    Some(match &effect.op {
        Op::Membership {
            marker,
            state,
            counters,
            was_present,
            guard,
            ..
        } => {
            let managed = match spec
                .kind(effect.projection)
                .writes(&spec.projections[effect.projection].name)
            {
                Writes::Items { copy, .. } => copy,
                Writes::Attributes { .. } | Writes::Own | Writes::Anything => Vec::new(),
            };
            MarkerChange {
                key: marker,
                want: Want::State {
                    state,
                    counters,
                    names: counters
                        .iter()
                        .map(|c| spec.storage(c.counter).to_string())
                        .collect(),
                    managed,
                    keep: foreign_attributes(spec, effect.projection),
                    known: known_counters(spec),
                    was_present: *was_present,
                },
                guard: guard.as_ref(),
            }
        }
        Op::DropRecord {
            item,
            counter,
            shard,
        } => MarkerChange {
            key: item,
            want: Want::Drop {
                name: spec.storage(*counter).to_string(),
                shard,
                // A counter's own marker (of this counter, or one the
                // spec can no longer attribute) is nothing but records.
                whole: item.pk.starts_with(COUNTER_MARKER_PREFIX)
                    && spec
                        .parse_counter_marker(item)
                        .is_none_or(|(owner, _)| owner == *counter),
            },
            guard: None,
        },
        Op::SetAttributes { .. } | Op::Recompute { .. } | Op::Custom { .. } => return None,
    })
}

/// What to do first for a change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum First {
    /// Try this write.
    Write(Transition),
    /// Read the item first.
    Read,
}

fn shard_of(value: &AttributeValue) -> Option<&str> {
    match value {
        AttributeValue::S(shard) => Some(shard),
        _ => None,
    }
}

fn add_delta(deltas: &mut Vec<(String, i64)>, shard: &str, delta: i64) {
    match deltas.iter_mut().find(|(key, _)| key == shard) {
        Some((_, sum)) => *sum += delta,
        None => deltas.push((shard.to_string(), delta)),
    }
}

/// The write that takes the records map from `old` to `new`: the map set
/// whole (or removed) on condition that it still is `old`, and the shard
/// moves between them.
fn move_records(
    old: &BTreeMap<String, AttributeValue>,
    old_value: Option<&AttributeValue>,
    new: &BTreeMap<String, AttributeValue>,
    set: &mut Vec<(Path, AttributeValue)>,
    remove: &mut Vec<Path>,
    pins: &mut Vec<(Path, Option<AttributeValue>)>,
    deltas: &mut Vec<(String, i64)>,
) {
    if old == new {
        return;
    }
    for (name, value) in old {
        if new.get(name) != Some(value) {
            if let Some(shard) = shard_of(value) {
                add_delta(deltas, shard, -1);
            }
        }
    }
    for (name, value) in new {
        if old.get(name) != Some(value) {
            if let Some(shard) = shard_of(value) {
                add_delta(deltas, shard, 1);
            }
        }
    }
    pins.push(records_pin(old_value));
    if new.is_empty() {
        remove.push(Path::Attribute(RECORDS_ATTRIBUTE.to_string()));
    } else {
        set.push((
            Path::Attribute(RECORDS_ATTRIBUTE.to_string()),
            records_value(new),
        ));
    }
}

impl MarkerChange<'_> {
    /// The write from `old` (the item as it is; `None`: absent) to what is
    /// wanted, or `None` when it is there already.
    pub(crate) fn exact(
        &self,
        table: &crate::spec::TableSpec,
        old: Option<&Item>,
    ) -> Option<Transition> {
        match &self.want {
            Want::Drop { name, whole, .. } => {
                let old = old?;
                let records = records_of(old);
                records.get(name)?;
                let mut kept = records.clone();
                kept.remove(name);
                let (mut set, mut remove, mut pins, mut deltas) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                if *whole {
                    for value in records.values() {
                        if let Some(shard) = shard_of(value) {
                            add_delta(&mut deltas, shard, -1);
                        }
                    }
                    return Some(Transition {
                        write: Write::Delete,
                        pins: vec![records_pin(old.get(RECORDS_ATTRIBUTE))],
                        deltas,
                    });
                }
                move_records(
                    &records,
                    old.get(RECORDS_ATTRIBUTE),
                    &kept,
                    &mut set,
                    &mut remove,
                    &mut pins,
                    &mut deltas,
                );
                Some(Transition {
                    write: Write::Update { set, remove },
                    pins,
                    deltas,
                })
            }
            Want::State {
                state,
                counters,
                names,
                known,
                keep,
                ..
            } => match (state, old) {
                (MarkerState::Absent, None) => None,
                (MarkerState::Absent, Some(old)) => {
                    let mut deltas = Vec::new();
                    for value in records_of(old).values() {
                        if let Some(shard) = shard_of(value) {
                            add_delta(&mut deltas, shard, -1);
                        }
                    }
                    Some(Transition {
                        write: Write::Delete,
                        pins: vec![records_pin(old.get(RECORDS_ATTRIBUTE))],
                        deltas,
                    })
                }
                (MarkerState::Present(content), None) => {
                    let mut item = content.clone();
                    let mut records = BTreeMap::new();
                    let mut deltas = Vec::new();
                    for (counter, name) in counters.iter().zip(names) {
                        records.insert(name.clone(), AttributeValue::S(counter.key.pk.clone()));
                        add_delta(&mut deltas, &counter.key.pk, 1);
                    }
                    if !records.is_empty() {
                        item.insert(RECORDS_ATTRIBUTE.to_string(), records_value(&records));
                    }
                    Some(Transition {
                        write: Write::Put(item),
                        pins: Vec::new(),
                        deltas,
                    })
                }
                (MarkerState::Present(content), Some(old)) => {
                    let mut set = Vec::new();
                    let mut remove = Vec::new();
                    for (name, value) in content.iter() {
                        if table.is_key_attribute(name) {
                            continue;
                        }
                        if !old.get(name).is_some_and(|have| values_equal(have, value)) {
                            set.push((Path::Attribute(name.clone()), value.clone()));
                        }
                    }
                    // A copy no longer wanted, one an older definition made:
                    // not the marker's any more.
                    let mut stale: Vec<&String> = old
                        .keys()
                        .filter(|name| {
                            !table.is_key_attribute(name)
                                && *name != RECORDS_ATTRIBUTE
                                && !content.contains_key(*name)
                                && !keep.contains(name)
                        })
                        .collect();
                    stale.sort();
                    remove.extend(stale.into_iter().map(|name| Path::Attribute(name.clone())));
                    // Records: this change's counters at their shards; other
                    // counters of the spec as they are; counters the spec
                    // dropped go.
                    let records = records_of(old);
                    let mut wanted: BTreeMap<String, AttributeValue> = records
                        .iter()
                        .filter(|(name, _)| known.contains(name) && !names.contains(name))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    for (counter, name) in counters.iter().zip(names) {
                        wanted.insert(name.clone(), AttributeValue::S(counter.key.pk.clone()));
                    }
                    let (mut pins, mut deltas) = (Vec::new(), Vec::new());
                    move_records(
                        &records,
                        old.get(RECORDS_ATTRIBUTE),
                        &wanted,
                        &mut set,
                        &mut remove,
                        &mut pins,
                        &mut deltas,
                    );
                    if set.is_empty() && remove.is_empty() {
                        return None;
                    }
                    Some(Transition {
                        write: Write::Update { set, remove },
                        pins,
                        deltas,
                    })
                }
            },
        }
    }

    /// The first thing to try: a write guessed from the record, or a read
    /// when the guess is that nothing needs writing (or nothing can be
    /// guessed).
    pub(crate) fn first(&self, table: &crate::spec::TableSpec) -> First {
        match &self.want {
            Want::Drop { name, shard, whole } => {
                if *whole {
                    // Its own marker: only this record, by the guess.
                    let mut records = BTreeMap::new();
                    records.insert(name.clone(), AttributeValue::S(shard.to_string()));
                    return First::Write(Transition {
                        write: Write::Delete,
                        pins: vec![records_pin(Some(&records_value(&records)))],
                        deltas: vec![(shard.to_string(), -1)],
                    });
                }
                First::Write(Transition {
                    write: Write::Update {
                        set: Vec::new(),
                        remove: vec![Path::Record(name.clone())],
                    },
                    pins: vec![(
                        Path::Record(name.clone()),
                        Some(AttributeValue::S(shard.to_string())),
                    )],
                    deltas: vec![(shard.to_string(), -1)],
                })
            }
            Want::State {
                state,
                counters,
                names,
                managed,
                was_present,
                ..
            } => {
                if !was_present {
                    return match self.exact(table, None) {
                        Some(transition) => First::Write(transition),
                        None => First::Read,
                    };
                }
                match state {
                    // Present before with exactly this change's records.
                    MarkerState::Absent => {
                        let mut records = BTreeMap::new();
                        let mut deltas = Vec::new();
                        for (counter, name) in counters.iter().zip(names) {
                            records.insert(name.clone(), AttributeValue::S(counter.key.pk.clone()));
                            add_delta(&mut deltas, &counter.key.pk, -1);
                        }
                        let pinned = (!records.is_empty()).then(|| records_value(&records));
                        First::Write(Transition {
                            write: Write::Delete,
                            pins: vec![records_pin(pinned.as_ref())],
                            deltas,
                        })
                    }
                    MarkerState::Present(content) => {
                        let set: Vec<(Path, AttributeValue)> = content
                            .iter()
                            .filter(|(name, _)| !table.is_key_attribute(name))
                            .map(|(name, value)| (Path::Attribute(name.clone()), value.clone()))
                            .collect();
                        let remove: Vec<Path> = managed
                            .iter()
                            .filter(|name| !content.contains_key(*name))
                            .map(|name| Path::Attribute(name.clone()))
                            .collect();
                        if set.is_empty() && remove.is_empty() {
                            return First::Read;
                        }
                        // Its records in place: the update touches none.
                        let pins = counters
                            .iter()
                            .zip(names)
                            .map(|(c, name)| {
                                (
                                    Path::Record(name.clone()),
                                    Some(AttributeValue::S(c.key.pk.clone())),
                                )
                            })
                            .collect();
                        First::Write(Transition {
                            write: Write::Update { set, remove },
                            pins,
                            deltas: Vec::new(),
                        })
                    }
                }
            }
        }
    }

    /// Whether the marker is probably in its wanted state already.
    fn read_first(&self, table: &crate::spec::TableSpec) -> bool {
        self.first(table) == First::Read
    }
}

/// What one attempt at a change came to.
enum Attempt {
    /// Written, or found in its state, or superseded.
    Done,
    /// The item was not as assumed: this is how it is.
    Found(Option<Item>),
    /// Send it again (after a pause when `Some`).
    Again(Option<&'static str>),
    /// Could not be applied.
    Failed(WriteError),
    /// Superseded by a newer change of the source, but the marker holds
    /// attributes no current definition writes: this write removes them.
    Cleanup(Transition),
}

/// Of a snapshot's planned write, the removals of attributes the current
/// definition does not manage (copies an older definition made). They are
/// stale whatever the source's state: the live worker's record of the
/// newer state writes a guess that only knows the current copies.
fn stale_removals(change: &MarkerChange<'_>, transition: &Transition) -> Vec<Path> {
    let (Want::State { managed, .. }, Write::Update { remove, .. }) =
        (&change.want, &transition.write)
    else {
        return Vec::new();
    };
    remove
        .iter()
        .filter(|path| matches!(path, Path::Attribute(name) if !managed.contains(name)))
        .cloned()
        .collect()
}

/// The write that removes `stale` attributes from a marker that exists.
fn cleanup(stale: Vec<Path>) -> Transition {
    Transition {
        write: Write::Update {
            set: Vec::new(),
            remove: stale,
        },
        pins: Vec::new(),
        deltas: Vec::new(),
    }
}

/// Writes a cleanup, best effort: what it leaves, the audit finds.
async fn clean(ctx: &Ctx<'_>, key: &ItemKey, transition: &Transition) {
    for _ in 0..3 {
        match write_single(ctx, key, transition).await {
            Attempt::Again(_) => continue,
            _ => break,
        }
    }
}

/// Brings every change to its wanted state. One result per change.
pub(crate) async fn write_markers(
    ctx: &Ctx<'_>,
    changes: &[MarkerChange<'_>],
    read_all_first: bool,
) -> Vec<Result<(), WriteError>> {
    let table = &ctx.spec.table;
    let mut results: Vec<Option<Result<(), WriteError>>> = vec![None; changes.len()];
    let mut pending: Vec<(usize, Transition)> = Vec::new();
    let mut to_read: Vec<usize> = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        if read_all_first || change.read_first(table) {
            to_read.push(i);
        } else if let First::Write(transition) = change.first(table) {
            pending.push((i, transition));
        }
    }
    if !to_read.is_empty() {
        match read(ctx, changes, &to_read).await {
            Ok(found) => {
                let mut cleanups = Vec::new();
                for i in to_read {
                    let change = &changes[i];
                    if let Some(guard) = change.guard {
                        if !guard.holds(found.get(&guard.source)) {
                            // The source moved on: its own record decides,
                            // all but the copies an older definition left.
                            if let Some(transition) = change.exact(table, found.get(change.key)) {
                                let stale = stale_removals(change, &transition);
                                if !stale.is_empty() {
                                    cleanups.push((i, cleanup(stale)));
                                }
                            }
                            results[i] = Some(Ok(()));
                            continue;
                        }
                    }
                    match change.exact(table, found.get(change.key)) {
                        Some(transition) => pending.push((i, transition)),
                        None => results[i] = Some(Ok(())),
                    }
                }
                for (i, transition) in cleanups {
                    clean(ctx, changes[i].key, &transition).await;
                }
            }
            Err(error) => {
                for i in to_read {
                    results[i] = Some(Err(error.clone()));
                }
            }
        }
    }

    let deadline = tokio::time::Instant::now() + ctx.config.max_retry_time;
    let mut retrier = Retrier::new(policy(ctx.config.max_retry_time)).until(deadline);
    let mut rounds = vec![0usize; changes.len()];
    // Changes whose transaction DynamoDB refused as a whole are sent alone
    // next, to find the one it refuses.
    let mut alone: HashSet<usize> = HashSet::new();
    while !pending.is_empty() {
        let mut next: Vec<(usize, Transition)> = Vec::new();
        let mut pause: Option<&'static str> = None;
        let (singles, transacted): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(i, t)| t.deltas.is_empty() && changes[*i].guard.is_none());
        let single_attempts: Vec<_> = singles
            .iter()
            .map(|(i, transition)| async move {
                (*i, write_single(ctx, changes[*i].key, transition).await)
            })
            .collect();
        let singles_written = futures::stream::iter(single_attempts)
            .buffer_unordered(ctx.config.concurrency.max(1))
            .collect::<Vec<_>>();
        let transactions_written = async {
            let mut attempts = Vec::new();
            let mut split = Vec::new();
            // The transactions of a wave share no item, so they run
            // together; waves run one after another, as a later one may
            // move a shard an earlier one moves too (concurrent
            // transactions on one item conflict).
            for wave in pack(changes, &transacted, &alone, ctx.config.concurrency) {
                let outcomes = futures::future::join_all(
                    wave.iter().map(|chunk| transact(ctx, changes, chunk)),
                )
                .await;
                for outcome in outcomes {
                    split.extend(outcome.split.into_iter().flatten());
                    attempts.extend(outcome.attempts);
                }
            }
            (attempts, split)
        };
        let (mut attempts, (transacted_attempts, split)) =
            tokio::join!(singles_written, transactions_written);
        alone.extend(split);
        attempts.extend(transacted_attempts);
        let by_index: HashMap<usize, Transition> = singles.into_iter().chain(transacted).collect();
        for (i, attempt) in attempts {
            match attempt {
                Attempt::Done => results[i] = Some(Ok(())),
                Attempt::Failed(error) => results[i] = Some(Err(error)),
                Attempt::Found(old) => {
                    rounds[i] += 1;
                    if rounds[i] > MAX_ROUNDS {
                        results[i] = Some(Err(WriteError::Transient(format!(
                            "marker {} kept changing while it was written",
                            changes[i].key
                        ))));
                        continue;
                    }
                    match changes[i].exact(table, old.as_ref()) {
                        Some(transition) => next.push((i, transition)),
                        None => results[i] = Some(Ok(())),
                    }
                }
                Attempt::Again(reason) => {
                    if reason.is_some() {
                        pause = reason;
                    }
                    next.push((i, by_index[&i].clone()));
                }
                Attempt::Cleanup(transition) => {
                    clean(ctx, changes[i].key, &transition).await;
                    results[i] = Some(Ok(()));
                }
            }
        }
        if let Some(reason) = pause {
            let waited = retrier
                .wait(|wait| {
                    ctx.retries.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("projector_retries_total", "operation" => "markers", "reason" => reason).increment(1);
                    tracing::debug!(
                        reason,
                        wait_ms = wait.as_millis() as u64,
                        "retrying marker writes"
                    );
                })
                .await;
            if !waited {
                for (i, _) in next.drain(..) {
                    results[i] = Some(Err(WriteError::Transient(format!(
                        "gave up after retries ({reason})"
                    ))));
                }
            }
        }
        pending = next;
    }
    results
        .into_iter()
        .map(|r| r.expect("every change gets a result"))
        .collect()
}

/// Reads the markers (and guarded sources) of `indexes`, consistently.
async fn read(
    ctx: &Ctx<'_>,
    changes: &[MarkerChange<'_>],
    indexes: &[usize],
) -> Result<HashMap<ItemKey, Item>, WriteError> {
    let mut keys: Vec<&ItemKey> = Vec::new();
    let mut seen: HashSet<&ItemKey> = HashSet::new();
    for &i in indexes {
        let change = &changes[i];
        for key in std::iter::once(change.key).chain(change.guard.map(|g| &g.source)) {
            if seen.insert(key) {
                keys.push(key);
            }
        }
    }
    let (mut found, rest) = ctx.markers_read_ahead(keys);
    if !rest.is_empty() {
        ctx.count(|r| &mut r.marker_reads);
        found.extend(super::reads::read_markers(ctx, rest).await?);
    }
    Ok(found)
}

/// The markers (and guarding sources) writing `groups` will read first,
/// as [`write_markers`] decides it: what a batch reads ahead.
pub(crate) fn keys_read_first(
    spec: &Spec,
    groups: &[super::coalesce::Group],
    read_all_first: bool,
) -> Vec<ItemKey> {
    let mut keys: Vec<ItemKey> = Vec::new();
    let mut seen: HashSet<&ItemKey> = HashSet::new();
    for group in groups {
        let Some(change) = marker_change(spec, &group.effect) else {
            continue;
        };
        if !(read_all_first || change.read_first(&spec.table)) {
            continue;
        }
        for key in std::iter::once(change.key).chain(change.guard.map(|g| &g.source)) {
            if seen.insert(key) {
                keys.push(key.clone());
            }
        }
    }
    keys
}

/// The expressions of one write.
struct Expressions {
    /// The update expression (updates only).
    update: Option<String>,
    condition: String,
    names: HashMap<String, String>,
    values: Option<HashMap<String, Av>>,
}

/// The condition and expression of a write.
fn expression(ctx: &Ctx<'_>, transition: &Transition) -> Expressions {
    let mut expr = Expr::default();
    let pk = expr.name(&ctx.spec.table.partition_key);
    let path = |expr: &mut Expr, path: &Path| match path {
        Path::Attribute(name) => expr.name(name),
        Path::Record(counter) => {
            let map = expr.name(RECORDS_ATTRIBUTE);
            let entry = expr.name(counter);
            format!("{map}.{entry}")
        }
    };
    let mut condition = match transition.write {
        Write::Put(_) => vec![format!("attribute_not_exists({pk})")],
        _ => vec![format!("attribute_exists({pk})")],
    };
    for (place, value) in &transition.pins {
        let n = path(&mut expr, place);
        match value {
            Some(value) => {
                let v = expr.value(av(value));
                condition.push(format!("{n} = {v}"));
            }
            None => condition.push(format!("attribute_not_exists({n})")),
        }
    }
    let update = match &transition.write {
        Write::Update { set, remove } => {
            let mut text = String::new();
            let assignments: Vec<String> = set
                .iter()
                .map(|(place, value)| {
                    let n = path(&mut expr, place);
                    let v = expr.value(av(value));
                    format!("{n} = {v}")
                })
                .collect();
            if !assignments.is_empty() {
                text.push_str(&format!("SET {}", assignments.join(", ")));
            }
            let removed: Vec<String> = remove.iter().map(|place| path(&mut expr, place)).collect();
            if !removed.is_empty() {
                text.push_str(&format!(" REMOVE {}", removed.join(", ")));
            }
            Some(text.trim().to_string())
        }
        _ => None,
    };
    let (names, values) = expr.values();
    Expressions {
        update,
        condition: condition.join(" AND "),
        names,
        values,
    }
}

/// The item a write puts, with its key.
fn put_item(transition: &Transition) -> Option<&Item> {
    match &transition.write {
        Write::Put(item) => Some(item),
        _ => None,
    }
}

/// Reads the item a failed condition returned (`ALL_OLD`).
fn returned(item: Option<&HashMap<String, Av>>, key: &ItemKey) -> Attempt {
    match item.map(|item| item_from_sdk(item.clone())) {
        None => Attempt::Found(None),
        Some(Ok(item)) => Attempt::Found(Some(item)),
        Some(Err(error)) => Attempt::Failed(WriteError::Poison(format!(
            "the marker {key} holds a value this build cannot read: {error}"
        ))),
    }
}

/// A write that moves no shard and needs no guard: one request.
async fn write_single(ctx: &Ctx<'_>, key: &ItemKey, transition: &Transition) -> Attempt {
    let Expressions {
        update,
        condition,
        names,
        values,
    } = expression(ctx, transition);
    ctx.sent();
    ctx.count(|r| &mut r.single_writes);
    let outcome = match &transition.write {
        Write::Put(item) => ctx
            .client
            .put_item()
            .table_name(ctx.table)
            .set_item(Some(item.clone().into()))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|output| ctx.count_units(output.consumed_capacity(), true))
            .map_err(|error| {
                let old = match error.as_service_error() {
                    Some(aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(failed)) => {
                        Some(failed.item().cloned())
                    }
                    _ => None,
                };
                (sdk(error), old)
            }),
        Write::Update { .. } => ctx
            .client
            .update_item()
            .table_name(ctx.table)
            .set_key(Some(ctx.key(key)))
            .set_update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|output| ctx.count_units(output.consumed_capacity(), true))
            .map_err(|error| {
                let old = match error.as_service_error() {
                    Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed)) => {
                        Some(failed.item().cloned())
                    }
                    _ => None,
                };
                (sdk(error), old)
            }),
        Write::Delete => ctx
            .client
            .delete_item()
            .table_name(ctx.table)
            .set_key(Some(ctx.key(key)))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|output| ctx.count_units(output.consumed_capacity(), true))
            .map_err(|error| {
                let old = match error.as_service_error() {
                    Some(aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(failed)) => {
                        Some(failed.item().cloned())
                    }
                    _ => None,
                };
                (sdk(error), old)
            }),
    };
    match outcome {
        Ok(()) => Attempt::Done,
        Err(((ErrorClass::Conditional, _), old)) => returned(old.flatten().as_ref(), key),
        Err(((class, text), _)) => attempt_of(class, text),
    }
}

fn attempt_of(class: ErrorClass, text: String) -> Attempt {
    match class {
        ErrorClass::Retry(reason) => Attempt::Again(Some(reason)),
        ErrorClass::Poison(message) => Attempt::Failed(WriteError::Poison(message)),
        ErrorClass::Fatal(message) => Attempt::Failed(WriteError::Fatal(message)),
        ErrorClass::Conditional => Attempt::Failed(WriteError::Poison(format!(
            "unexpected condition failure: {text}"
        ))),
    }
}

/// An item a transaction writes or checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Touch {
    /// A marker, or a guarded source.
    Item(ItemKey),
    /// A counter shard, by its partition key.
    Shard(String),
}

/// Packs changes in order into transactions of at most 100 items, none
/// naming one item twice (DynamoDB refuses that), and the transactions
/// into waves of at most `width` that share no item: a wave's
/// transactions can run at once without conflicting. A change joins the
/// first wave where it touches at most one transaction and that one has
/// room (a shard it shares is one item for both), or touches none and a
/// transaction can start; a change sent `alone` gets a transaction of its
/// own.
fn pack(
    changes: &[MarkerChange<'_>],
    transacted: &[(usize, Transition)],
    alone: &HashSet<usize>,
    width: usize,
) -> Vec<Vec<Vec<(usize, Transition)>>> {
    struct Chunk {
        members: Vec<(usize, Transition)>,
        items: usize,
        alone: bool,
    }
    #[derive(Default)]
    struct Wave {
        chunks: Vec<Chunk>,
        /// Which transaction of the wave touches an item.
        owner: HashMap<Touch, usize>,
    }
    // Transactions start apart only while they average 20 changes or
    // more: enough to spread the shards, without a request per change.
    let width = width.min(transacted.len().div_ceil(20)).max(1);
    let mut waves: Vec<Wave> = Vec::new();
    for (i, transition) in transacted {
        let change = &changes[*i];
        let mut keys = vec![Touch::Item(change.key.clone())];
        if let Some(guard) = change.guard {
            keys.push(Touch::Item(guard.source.clone()));
        }
        let mut touches = keys.clone();
        for (shard, _) in &transition.deltas {
            let touch = Touch::Shard(shard.clone());
            if !touches.contains(&touch) {
                touches.push(touch);
            }
        }
        let lone = alone.contains(i);
        // Where the change goes in a wave: an existing transaction, a new
        // one, or not in this wave.
        let place = |wave: &Wave| -> Option<Option<usize>> {
            let mut owners: Vec<usize> = touches
                .iter()
                .filter_map(|touch| wave.owner.get(touch).copied())
                .collect();
            owners.sort_unstable();
            owners.dedup();
            let room = |c: usize| {
                let chunk = &wave.chunks[c];
                let new = touches
                    .iter()
                    .filter(|touch| wave.owner.get(*touch) != Some(&c))
                    .count();
                !chunk.alone
                    && !lone
                    && keys.iter().all(|key| wave.owner.get(key) != Some(&c))
                    && chunk.items + new <= MAX_TRANSACTION_ITEMS
            };
            match owners.as_slice() {
                // A change that shares nothing starts a transaction of its
                // own while the wave has room for one: joining another
                // would tie that one's shards to its own.
                [] if wave.chunks.len() < width => Some(None),
                [] => (0..wave.chunks.len()).find(|&c| room(c)).map(Some),
                [c] if room(*c) => Some(Some(*c)),
                _ => None,
            }
        };
        let (w, place) = match waves
            .iter()
            .enumerate()
            .find_map(|(w, wave)| place(wave).map(|p| (w, p)))
        {
            Some(found) => found,
            None => {
                waves.push(Wave::default());
                (waves.len() - 1, None)
            }
        };
        let wave = &mut waves[w];
        let c = place.unwrap_or_else(|| {
            wave.chunks.push(Chunk {
                members: Vec::new(),
                items: 0,
                alone: lone,
            });
            wave.chunks.len() - 1
        });
        for touch in touches {
            if wave.owner.insert(touch, c).is_none() {
                wave.chunks[c].items += 1;
            }
        }
        wave.chunks[c].members.push((*i, transition.clone()));
    }
    waves
        .into_iter()
        .map(|wave| wave.chunks.into_iter().map(|chunk| chunk.members).collect())
        .collect()
}

/// What one transaction came to.
struct TransactOutcome {
    attempts: Vec<(usize, Attempt)>,
    /// Refused as a whole (not cancelled): send these alone next.
    split: Option<Vec<usize>>,
}

/// The condition check of a guarded change: the source must still be as
/// the snapshot or record the change was planned from shows it.
pub(crate) fn guard_check(ctx: &Ctx<'_>, guard: &SourceGuard) -> TransactWriteItem {
    let mut expr = Expr::default();
    let pk = expr.name(&ctx.spec.table.partition_key);
    let condition = match &guard.seen {
        None => format!("attribute_not_exists({pk})"),
        Some(seen) => {
            let mut parts = vec![format!("attribute_exists({pk})")];
            for (name, value) in seen {
                let n = expr.name(name);
                match value {
                    Some(value) => {
                        let v = expr.value(av(value));
                        parts.push(format!("{n} = {v}"));
                    }
                    None => parts.push(format!("attribute_not_exists({n})")),
                }
            }
            parts.join(" AND ")
        }
    };
    let (names, values) = expr.values();
    let check = ConditionCheck::builder()
        .table_name(ctx.table)
        .set_key(Some(ctx.key(&guard.source)))
        .condition_expression(condition)
        .set_expression_attribute_names(Some(names).filter(|n| !n.is_empty()))
        .set_expression_attribute_values(values)
        .build()
        .expect("table, key and condition are set");
    TransactWriteItem::builder().condition_check(check).build()
}

fn marker_item(ctx: &Ctx<'_>, key: &ItemKey, transition: &Transition) -> TransactWriteItem {
    let Expressions {
        update,
        condition,
        names,
        values,
    } = expression(ctx, transition);
    let all_old = ReturnValuesOnConditionCheckFailure::AllOld;
    match &transition.write {
        Write::Put(_) => {
            let item = put_item(transition).expect("a put").clone();
            let put = Put::builder()
                .table_name(ctx.table)
                .set_item(Some(item.into()))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(all_old)
                .build()
                .expect("table and item are set");
            TransactWriteItem::builder().put(put).build()
        }
        Write::Update { .. } => {
            let update = Update::builder()
                .table_name(ctx.table)
                .set_key(Some(ctx.key(key)))
                .set_update_expression(update)
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(all_old)
                .build()
                .expect("table, key and expression are set");
            TransactWriteItem::builder().update(update).build()
        }
        Write::Delete => {
            let delete = Delete::builder()
                .table_name(ctx.table)
                .set_key(Some(ctx.key(key)))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(all_old)
                .build()
                .expect("table and key are set");
            TransactWriteItem::builder().delete(delete).build()
        }
    }
}

/// One `TransactWriteItems`: the changes' writes and guards, then one
/// update per shard they move (also when the moves cancel out, so that its
/// change count moves).
async fn transact(
    ctx: &Ctx<'_>,
    changes: &[MarkerChange<'_>],
    chunk: &[(usize, Transition)],
) -> TransactOutcome {
    let mut items = Vec::new();
    // Per member: its write's position, and its guard's.
    let mut positions: Vec<(usize, Option<usize>)> = Vec::new();
    let mut shards: Vec<(String, i64)> = Vec::new();
    for (i, transition) in chunk {
        let change = &changes[*i];
        let write = items.len();
        items.push(marker_item(ctx, change.key, transition));
        let guard = change.guard.map(|guard| {
            items.push(guard_check(ctx, guard));
            items.len() - 1
        });
        positions.push((write, guard));
        for (shard, delta) in &transition.deltas {
            add_delta(&mut shards, shard, *delta);
        }
    }
    let first_shard = items.len();
    for (shard, delta) in &shards {
        let update = Update::builder()
            .table_name(ctx.table)
            .set_key(Some(ctx.key(&ctx.spec.shard_item(shard))))
            .update_expression("ADD #c :d, #n :one")
            .expression_attribute_names("#c", COUNT_ATTRIBUTE)
            .expression_attribute_names("#n", CHANGES_ATTRIBUTE)
            .expression_attribute_values(":d", Av::N(delta.to_string()))
            .expression_attribute_values(":one", Av::N("1".to_string()))
            .build()
            .expect("table, key and expression are set");
        items.push(TransactWriteItem::builder().update(update).build());
    }
    ctx.sent();
    ctx.count(|r| &mut r.transactions);
    let n_items = items.len();
    let sent = ctx
        .client
        .transact_write_items()
        .set_transact_items(Some(items))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    let error = match sent {
        Ok(output) => {
            ctx.count_units(output.consumed_capacity(), true);
            // Billed: only a transaction that ran is counted, so the
            // figure stays a floor.
            ctx.count_n(|r| &mut r.transaction_items, n_items);
            return TransactOutcome {
                attempts: chunk.iter().map(|(i, _)| (*i, Attempt::Done)).collect(),
                split: None,
            };
        }
        Err(error) => error,
    };
    let reasons = match error.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
            cancelled.cancellation_reasons().to_vec()
        }
        _ => Vec::new(),
    };
    if reasons.is_empty() {
        let (class, text) = sdk(error);
        return match class {
            ErrorClass::Poison(_) | ErrorClass::Conditional if chunk.len() > 1 => TransactOutcome {
                attempts: chunk
                    .iter()
                    .map(|(i, _)| (*i, Attempt::Again(None)))
                    .collect(),
                split: Some(chunk.iter().map(|(i, _)| *i).collect()),
            },
            class => TransactOutcome {
                attempts: chunk
                    .iter()
                    .map(|(i, _)| (*i, attempt_of(class.clone(), text.clone())))
                    .collect(),
                split: None,
            },
        };
    }
    ctx.count(|r| &mut r.cancelled_transactions);
    let class_at = |position: usize| {
        reasons
            .get(position)
            .and_then(|reason| match reason.code() {
                None | Some("None") => None,
                code => Some(classify_code(code, reason.message())),
            })
    };
    // A shard DynamoDB refuses stops every change of the transaction; one
    // it throttles or that conflicts delays them.
    let mut shard_problem: Option<Attempt> = None;
    for position in first_shard..first_shard + shards.len() {
        match class_at(position) {
            Some(ErrorClass::Retry(reason)) => shard_problem = Some(Attempt::Again(Some(reason))),
            Some(ErrorClass::Poison(message)) => {
                shard_problem = Some(Attempt::Failed(WriteError::Poison(format!(
                    "counter shard rejected: {message}"
                ))));
                break;
            }
            _ => {}
        }
    }
    let attempts = chunk
        .iter()
        .zip(&positions)
        .map(|((i, transition), (write, guard))| {
            let change = &changes[*i];
            if let Some(guard) = guard {
                match class_at(*guard) {
                    // The source changed since the snapshot: the live
                    // worker's record of that change decides, all but the
                    // copies an older definition left.
                    Some(ErrorClass::Conditional) => {
                        let stale = stale_removals(change, transition);
                        if stale.is_empty() {
                            return (*i, Attempt::Done);
                        }
                        return (*i, Attempt::Cleanup(cleanup(stale)));
                    }
                    Some(ErrorClass::Retry(reason)) => return (*i, Attempt::Again(Some(reason))),
                    _ => {}
                }
            }
            let attempt = match class_at(*write) {
                Some(ErrorClass::Conditional) => returned(reasons[*write].item(), change.key),
                Some(class) => attempt_of(class, "a marker write".to_string()),
                None => match &shard_problem {
                    Some(Attempt::Again(reason)) => Attempt::Again(*reason),
                    Some(Attempt::Failed(error)) => Attempt::Failed(error.clone()),
                    // Not applied because another item failed: again.
                    _ => Attempt::Again(None),
                },
            };
            (*i, attempt)
        })
        .collect();
    TransactOutcome {
        attempts,
        split: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AttributeValue as V;

    fn table() -> crate::spec::TableSpec {
        crate::spec::TableSpec {
            name: "t".into(),
            partition_key: "PK".into(),
            sort_key: Some("SK".into()),
            ttl_attribute: None,
            gsis: vec![],
        }
    }

    fn edge_item(pairs: &[(&str, &str)], records: &[(&str, &str)]) -> Item {
        let mut item = Item::default();
        item.insert("PK".into(), V::S("USER#b".into()));
        item.insert("SK".into(), V::S("FOLLOWED_BY#a".into()));
        for (name, value) in pairs {
            item.insert(name.to_string(), V::S(value.to_string()));
        }
        if !records.is_empty() {
            item.insert(RECORDS_ATTRIBUTE.into(), map(records));
        }
        item
    }

    fn map(records: &[(&str, &str)]) -> V {
        V::M(
            records
                .iter()
                .map(|(k, v)| (k.to_string(), V::S(v.to_string())))
                .collect(),
        )
    }

    fn present(at: &str) -> MarkerState {
        let mut item = edge_item(&[("at", at)], &[]);
        item.remove(RECORDS_ATTRIBUTE);
        MarkerState::Present(item)
    }

    fn shards() -> Vec<CounterShard> {
        vec![
            CounterShard {
                counter: 1,
                key: ItemKey::new("COUNTER#followers#b#3", "COUNTER"),
            },
            CounterShard {
                counter: 2,
                key: ItemKey::new("COUNTER#following#a#0", "COUNTER"),
            },
        ]
    }

    fn change<'e>(
        key: &'e ItemKey,
        state: &'e MarkerState,
        counters: &'e [CounterShard],
        was_present: bool,
    ) -> MarkerChange<'e> {
        MarkerChange {
            key,
            want: Want::State {
                state,
                counters,
                names: vec!["followers".into(), "following".into()],
                managed: vec!["at".into()],
                keep: vec![],
                known: vec!["followers".into(), "following".into(), "other".into()],
                was_present,
            },
            guard: None,
        }
    }

    fn key() -> ItemKey {
        ItemKey::new("USER#b", "FOLLOWED_BY#a")
    }

    fn records_path() -> Path {
        Path::Attribute(RECORDS_ATTRIBUTE.into())
    }

    #[test]
    fn a_new_edge_is_created_with_a_record_per_counter() {
        let (key, state, counters) = (key(), present("t1"), shards());
        let First::Write(t) = change(&key, &state, &counters, false).first(&table()) else {
            panic!("a guess")
        };
        let Write::Put(put) = &t.write else {
            panic!("{t:?}")
        };
        assert_eq!(
            put.get(RECORDS_ATTRIBUTE),
            Some(&map(&[
                ("followers", "COUNTER#followers#b#3"),
                ("following", "COUNTER#following#a#0")
            ]))
        );
        assert_eq!(
            t.deltas,
            vec![
                ("COUNTER#followers#b#3".to_string(), 1),
                ("COUNTER#following#a#0".to_string(), 1)
            ]
        );
    }

    #[test]
    fn an_edge_found_without_a_counters_record_gains_it_and_counts_once() {
        let (key, state, counters) = (key(), present("t2"), shards());
        let change = change(&key, &state, &counters, false);
        // The edge exists from before `following` was added.
        let old = edge_item(&[("at", "t1")], &[("followers", "COUNTER#followers#b#3")]);
        let t = change.exact(&table(), Some(&old)).expect("a write");
        assert_eq!(t.deltas, vec![("COUNTER#following#a#0".to_string(), 1)]);
        assert_eq!(
            t.pins,
            vec![(
                records_path(),
                Some(map(&[("followers", "COUNTER#followers#b#3")]))
            )]
        );
        let Write::Update { set, remove } = &t.write else {
            panic!("{t:?}")
        };
        assert!(remove.is_empty());
        assert_eq!(set[0], (Path::Attribute("at".into()), V::S("t2".into())));
        // With both records and the same copy: nothing to do.
        let full = edge_item(
            &[("at", "t2")],
            &[
                ("followers", "COUNTER#followers#b#3"),
                ("following", "COUNTER#following#a#0"),
            ],
        );
        assert_eq!(change.exact(&table(), Some(&full)), None);
    }

    #[test]
    fn a_record_in_another_shard_moves_to_the_wanted_one() {
        let (key, state, counters) = (key(), present("t1"), shards());
        let change = change(&key, &state, &counters, true);
        let old = edge_item(
            &[("at", "t1")],
            &[
                ("followers", "COUNTER#followers#b#7"),
                ("following", "COUNTER#following#a#0"),
            ],
        );
        let t = change.exact(&table(), Some(&old)).expect("a write");
        assert_eq!(
            t.deltas,
            vec![
                ("COUNTER#followers#b#7".to_string(), -1),
                ("COUNTER#followers#b#3".to_string(), 1)
            ]
        );
    }

    #[test]
    fn a_record_of_a_counter_the_spec_dropped_goes_with_its_shard_moved() {
        let (key, state, counters) = (key(), present("t1"), shards());
        let change = change(&key, &state, &counters, true);
        let old = edge_item(
            &[("at", "t1")],
            &[
                ("followers", "COUNTER#followers#b#3"),
                ("following", "COUNTER#following#a#0"),
                ("retired", "COUNTER#retired#b#1"),
                ("other", "COUNTER#other#a#2"),
            ],
        );
        let t = change.exact(&table(), Some(&old)).expect("a write");
        // `other` is a counter of the spec whose record sits here: a scan
        // moves it; `retired` is not: it goes now, shard and all.
        assert_eq!(t.deltas, vec![("COUNTER#retired#b#1".to_string(), -1)]);
    }

    #[test]
    fn deleting_a_marker_uncounts_every_record_it_carries() {
        let (key, counters) = (key(), shards());
        let state = MarkerState::Absent;
        let change = change(&key, &state, &counters, true);
        // The guess: the edge with exactly this change's records, pinned
        // whole, so any other record fails the condition.
        let First::Write(guess) = change.first(&table()) else {
            panic!("a guess")
        };
        assert_eq!(guess.write, Write::Delete);
        assert_eq!(guess.deltas.len(), 2);
        assert_eq!(
            guess.pins,
            vec![(
                records_path(),
                Some(map(&[
                    ("followers", "COUNTER#followers#b#3"),
                    ("following", "COUNTER#following#a#0")
                ]))
            )]
        );
        let old = edge_item(
            &[],
            &[
                ("followers", "COUNTER#followers#b#3"),
                ("retired", "COUNTER#retired#a#1"),
            ],
        );
        let t = change.exact(&table(), Some(&old)).expect("a write");
        assert_eq!(
            t.deltas,
            vec![
                ("COUNTER#followers#b#3".to_string(), -1),
                ("COUNTER#retired#a#1".to_string(), -1)
            ]
        );
        assert_eq!(change.exact(&table(), None), None);
    }

    #[test]
    fn a_marker_probably_absent_is_read_first() {
        let (key, counters) = (key(), shards());
        let state = MarkerState::Absent;
        assert_eq!(
            change(&key, &state, &counters, false).first(&table()),
            First::Read
        );
    }

    /// Every item each transaction of a packing touches.
    fn touched(changes: &[MarkerChange<'_>], chunk: &[(usize, Transition)]) -> Vec<Touch> {
        let mut touches = Vec::new();
        for (i, transition) in chunk {
            touches.push(Touch::Item(changes[*i].key.clone()));
            for (shard, _) in &transition.deltas {
                touches.push(Touch::Shard(shard.clone()));
            }
        }
        touches.sort_by_key(|t| format!("{t:?}"));
        touches.dedup();
        touches
    }

    #[test]
    fn transactions_of_a_wave_share_no_item_and_a_hot_shard_spreads_over_few_waves() {
        // 600 follows of one hot user (its counter on 4 shards) and 300
        // of others, each change moving two shards.
        let keys: Vec<ItemKey> = (0..900)
            .map(|i| {
                ItemKey::new(
                    format!("USER#{}", if i < 600 { 0 } else { i }),
                    format!("FOLLOWED_BY#{i}"),
                )
            })
            .collect();
        let state = present("t");
        let changes: Vec<MarkerChange<'_>> = keys
            .iter()
            .map(|key| change(key, &state, &[], false))
            .collect();
        let transacted: Vec<(usize, Transition)> = (0..keys.len())
            .map(|i| {
                let hot = if i < 600 {
                    format!("C#hot#{}", i % 4)
                } else {
                    format!("C#u{i}#0")
                };
                (
                    i,
                    Transition {
                        write: Write::Delete,
                        pins: vec![],
                        deltas: vec![(hot, 1), (format!("C#following#{}", i % 7), 1)],
                    },
                )
            })
            .collect();
        let waves = pack(&changes, &transacted, &HashSet::new(), 16);
        let mut seen = HashSet::new();
        for wave in &waves {
            assert!(wave.len() <= 16, "a wave wider than asked");
            let mut in_wave: HashSet<Touch> = HashSet::new();
            for chunk in wave {
                let touches = touched(&changes, chunk);
                let items = touches.len();
                assert!(
                    items <= MAX_TRANSACTION_ITEMS,
                    "{items} items in one transaction"
                );
                for touch in touches {
                    assert!(
                        in_wave.insert(touch.clone()),
                        "two transactions of a wave touch {touch:?}"
                    );
                }
                for (i, _) in chunk {
                    assert!(seen.insert(*i), "change {i} packed twice");
                }
            }
        }
        assert_eq!(seen.len(), 900, "every change is packed");
        // Each hot shard is in one transaction per wave, so a wave takes at
        // most 4 x ~90 hot changes: 600 need 2 waves at least. Filling one
        // transaction with every shard it could hold made this 14.
        assert!(waves.len() <= 4, "{} waves", waves.len());

        // A change sent alone gets a transaction of its own.
        let alone: HashSet<usize> = [3].into();
        let waves = pack(&changes, &transacted, &alone, 16);
        let lone = waves
            .iter()
            .flatten()
            .find(|chunk| chunk.iter().any(|(i, _)| *i == 3))
            .expect("packed");
        assert_eq!(lone.len(), 1);
    }
}
