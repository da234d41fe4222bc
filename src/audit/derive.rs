//! What the spec says must be derived, checked against what a page and
//! its reads hold (or what the counters' second scan counted): derived
//! items, markers, counters and invariants, each a finding.

use std::collections::{BTreeMap, HashMap};

use super::scan::{parse_shard, Fact};
use super::sketch::{Group, Sketch};
use super::{Finding, Fix, Problem};
use crate::decode::scanned_record;
use crate::invariant::Violation;
use crate::kinds::Expectation;
use crate::plan::{plan_record, Effect, MarkerState, Op};
use crate::record::{item_to_json, Item, ItemKey};
use crate::spec::{ProjectionId, Spec};

pub(super) fn finding(spec: &Spec, id: ProjectionId, problem: Problem, key: &ItemKey) -> Finding {
    Finding {
        rule: spec.projections[id].name.clone(),
        rule_kind: spec.projections[id].kind_name().to_string(),
        problem,
        key: key.to_string(),
        items: Vec::new(),
        detail: String::new(),
        repaired: false,
        counters: Vec::new(),
        shards: Vec::new(),
        fix: None,
    }
}

/// `attr: is <have>, should be <want>`, each as JSON or `(none)`.
fn is_should(
    attr: &str,
    have: Option<&crate::record::AttributeValue>,
    want: Option<&crate::record::AttributeValue>,
) -> String {
    let json = |v: Option<&crate::record::AttributeValue>| {
        v.map(|v| crate::record::value_to_json(v).to_string())
            .unwrap_or_else(|| "(none)".to_string())
    };
    format!("{attr}: is {}, should be {}", json(have), json(want))
}

/// A derived value absent altogether, or there and wrong.
fn missing_or_stale(missing: bool) -> Problem {
    if missing {
        Problem::Missing
    } else {
        Problem::Stale
    }
}

pub(super) fn show(item: Option<&Item>) -> String {
    match item {
        Some(item) => item_to_json(item).to_string(),
        None => "(none)".to_string(),
    }
}

/// [`Expectation::OnChangedItem`] (`index-keys`): every item of the
/// entity carries the attributes the planner computes from it.
pub(super) fn on_items(spec: &Spec, items: &[(usize, ItemKey, Item)], out: &mut Vec<Finding>) {
    for id in 0..spec.projections.len() {
        let selection = [id];
        let Expectation::OnChangedItem(on) = spec.kind(id).expectation() else {
            continue;
        };
        for (entity, key, item) in items {
            if *entity != on {
                continue;
            }
            let Ok(record) = scanned_record(&spec.table, 0, 0, item.clone()) else {
                continue;
            };
            let plan = plan_record(spec, &record, Some(&selection));
            if let Some(error) = plan.errors.first() {
                let mut f = finding(spec, id, Problem::Underivable, key);
                f.detail = error.problem.to_string();
                out.push(f);
                continue;
            }
            for effect in plan.effects {
                let Op::SetAttributes { set, .. } = &effect.op else {
                    continue;
                };
                let missing = set.iter().all(|(attr, _)| !item.contains_key(attr));
                let mut f = finding(spec, id, missing_or_stale(missing), key);
                f.detail = set
                    .iter()
                    .map(|(attr, want)| is_should(attr, item.get(attr), Some(want)))
                    .collect::<Vec<_>>()
                    .join("; ");
                f.fix = Some(Fix::Effect(Box::new(effect)));
                out.push(f);
            }
        }
    }
}

/// Whether projection `id` recomputes items of `entity` (`denormalize`,
/// `rollup`, `aggregate`).
pub(super) fn recomputes(spec: &Spec, id: ProjectionId, entity: usize) -> bool {
    let kind = spec.kind(id);
    matches!(kind.expectation(), Expectation::Recomputed { .. })
        && kind.recompute().is_some_and(|r| r.target() == entity)
}

/// A recomputed target (`denormalize`, `rollup`, `aggregate`) against
/// what the kind computes from `sources`, the items its recompute reads
/// now.
pub(super) fn target(
    spec: &Spec,
    id: ProjectionId,
    key: &ItemKey,
    item: &Item,
    sources: &[Item],
) -> Option<Finding> {
    let keys: Vec<String> = sources
        .iter()
        .filter_map(|s| spec.table.item_key(s))
        .map(|k| k.to_string())
        .collect();
    let want = match crate::kinds::compute(spec, id, sources) {
        Ok(want) => want,
        Err(error) => {
            let mut f = finding(spec, id, Problem::Underivable, key);
            f.detail = error;
            f.items = keys;
            return Some(f);
        }
    };
    let wrong: Vec<String> = want
        .iter()
        .filter(|(attr, want)| match (item.get(attr), want) {
            (None, None) => false,
            (Some(have), Some(want)) => !crate::spec::values_equal(have, want),
            _ => true,
        })
        .map(|(attr, want)| is_should(attr, item.get(attr), want.as_ref()))
        .collect();
    if wrong.is_empty() {
        return None;
    }
    let absent_is_missing = matches!(
        spec.kind(id).expectation(),
        Expectation::Recomputed {
            absent_is_missing: true
        }
    );
    let missing = absent_is_missing
        && want
            .iter()
            .all(|(attr, want)| want.is_some() && !item.contains_key(attr));
    let mut f = finding(spec, id, missing_or_stale(missing), key);
    f.detail = wrong.join("; ");
    f.items = keys;
    f.fix = crate::kinds::recompute_op(spec, id, key)
        .map(|op| Fix::Effect(Box::new(Effect { projection: id, op })));
    Some(f)
}

/// Reverse edges, counter markers and counter records: each scanned
/// item planned as a backfill would plan it. Each membership or record
/// effect is then checked with [`check_marker`] against the items it
/// reads, with the applier's own transition (nothing to write: in place).
pub(super) fn memberships<'i>(
    spec: &Spec,
    scanned: impl IntoIterator<Item = (&'i ItemKey, &'i Item)>,
    out: &mut Vec<Finding>,
) -> Vec<Effect> {
    let mut effects = Vec::new();
    for (key, item) in scanned {
        let Ok(record) = scanned_record(&spec.table, 0, 0, item.clone()) else {
            continue;
        };
        let plan = plan_record(spec, &record, None);
        for error in &plan.errors {
            let Some(id) = error.projection else { continue };
            if spec.kind(id).expectation() == Expectation::Memberships {
                let mut f = finding(spec, id, Problem::Underivable, key);
                f.detail = error.problem.to_string();
                out.push(f);
            }
        }
        effects.extend(
            plan.effects
                .into_iter()
                .filter(|effect| crate::apply::marker_change(spec, effect).is_some()),
        );
    }
    effects
}

/// The items [`check_marker`] reads for `effect`: its marker and the
/// source it is guarded on.
pub(super) fn marker_reads(spec: &Spec, effect: &Effect) -> Vec<ItemKey> {
    let Some(change) = crate::apply::marker_change(spec, effect) else {
        return Vec::new();
    };
    let mut keys = vec![change.key.clone()];
    if let Some(guard) = change.guard {
        keys.push(guard.source.clone());
    }
    keys
}

pub(super) fn check_marker(
    spec: &Spec,
    by_key: &HashMap<&ItemKey, &Item>,
    effect: Effect,
    out: &mut Vec<Finding>,
) {
    let Some(change) = crate::apply::marker_change(spec, &effect) else {
        return;
    };
    if let Some(guard) = change.guard {
        if !guard.holds(by_key.get(&guard.source).copied()) {
            return;
        }
    }
    let old = by_key.get(change.key).copied();
    if change.exact(&spec.table, old).is_none() {
        return;
    }
    // A scan plans every membership with a guard on its source.
    let source = change
        .guard
        .map(|guard| guard.source.clone())
        .unwrap_or_else(|| change.key.clone());
    let source = &source;
    let mut found: Vec<Finding> = Vec::new();
    match (&effect.op, old) {
        (
            Op::DropRecord {
                item,
                counter,
                shard,
            },
            _,
        ) => {
            let mut f = finding(spec, *counter, Problem::Orphaned, item);
            f.detail = format!(
                "a record of the counter in shard {shard}, on an item where the counter no longer keeps its members"
            );
            f.counters = vec![spec.projections[*counter].name.clone()];
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Absent,
                ..
            },
            Some(old),
        ) => {
            let mut f = finding(spec, effect.projection, Problem::Orphaned, marker);
            f.items = vec![source.to_string()];
            f.detail = format!(
                "its source {source} {}",
                if by_key.contains_key(source) {
                    "does not satisfy `when`"
                } else {
                    "does not exist"
                }
            );
            let records: Vec<String> = crate::apply::records_of(old)
                .iter()
                .map(|(name, value)| format!("{name} in {}", crate::record::value_to_json(value)))
                .collect();
            if !records.is_empty() {
                f.detail
                    .push_str(&format!("; it counts in {}", records.join(", ")));
            }
            f.counters = crate::apply::records_of(old)
                .keys()
                .filter_map(|storage| spec.counter_by_storage(storage))
                .map(|id| spec.projections[id].name.clone())
                .collect();
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Present(want),
                counters,
                ..
            },
            None,
        ) => {
            let mut f = finding(spec, effect.projection, Problem::Missing, marker);
            f.items = vec![source.to_string()];
            f.detail = format!("should be {}", show(Some(want)));
            if !counters.is_empty() {
                let names: Vec<&str> = counters
                    .iter()
                    .map(|c| spec.projections[c.counter].name.as_str())
                    .collect();
                f.detail
                    .push_str(&format!(", counted in {}", names.join(", ")));
            }
            f.counters = counters
                .iter()
                .map(|c| spec.projections[c.counter].name.clone())
                .collect();
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Present(want),
                counters,
                ..
            },
            Some(old),
        ) => {
            let copies: Vec<String> = want
                .iter()
                .filter(|(name, _)| !spec.table.is_key_attribute(name))
                .filter(|(name, value)| {
                    !old.get(*name)
                        .is_some_and(|have| crate::spec::values_equal(have, value))
                })
                .map(|(name, value)| is_should(name, old.get(name), Some(value)))
                .chain(
                    old.iter()
                        .filter(|(name, _)| {
                            !spec.table.is_key_attribute(name)
                                && !crate::plan::is_record_attribute(name)
                                && !want.contains_key(*name)
                        })
                        .map(|(name, _)| format!("{name}: should be absent")),
                )
                .collect();
            if !copies.is_empty() {
                let mut f = finding(spec, effect.projection, Problem::Stale, marker);
                f.items = vec![source.to_string()];
                f.detail = copies.join("; ");
                found.push(f);
            }
            let records = crate::apply::records_of(old);
            for counter in counters {
                let name = spec.storage(counter.counter);
                let have = records.get(name);
                if have == Some(&crate::record::AttributeValue::S(counter.key.pk.clone())) {
                    continue;
                }
                let mut f = finding(
                    spec,
                    counter.counter,
                    if have.is_some() {
                        Problem::Stale
                    } else {
                        Problem::Missing
                    },
                    marker,
                );
                f.items = vec![source.to_string()];
                f.counters = vec![spec.projections[counter.counter].name.clone()];
                f.detail = format!(
                    "the record of {source}: is {}, should be {:?}",
                    have.map(|v| crate::record::value_to_json(v).to_string())
                        .unwrap_or_else(|| "(none)".to_string()),
                    counter.key.pk
                );
                found.push(f);
            }
            // Otherwise only records of counters the spec no longer has
            // differ: retired data, not what this spec derives (a write of
            // the item drops them, shard and all; pruning removes them).
        }
        _ => {}
    }
    // One repair fixes them all: the first finding carries it, and the
    // shards it moves.
    if let Some(first) = found.first_mut() {
        first.shards = moved_shards(spec, &effect.op, old);
        first.fix = Some(Fix::Effect(Box::new(effect)));
    }
    out.extend(found);
}

/// What a second scan counted of the groups the sketch found wrong (see
/// [`super::sketch`]): only those are kept.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Counted source items per wrong counter instance.
    pub counted: HashMap<(ProjectionId, String), i64>,
    /// Shards of wrong instances, and wrong shards: (counter, values
    /// joined by `#`, count) by partition key.
    pub shards: HashMap<String, (ProjectionId, String, i64)>,
    /// Records naming each wrong shard.
    pub records: HashMap<String, i64>,
    /// How many times each shard in `shards` had moved when it was read.
    pub changes: HashMap<String, Option<i64>>,
}

impl Tally {
    /// Keeps what `fact` says of a group `sketch` found wrong.
    pub(super) fn keep(&mut self, sketch: &Sketch, fact: Fact) {
        match fact {
            Fact::Record(pk) => {
                if sketch.suspects(&Group::Shard(pk.clone())) {
                    *self.records.entry(pk).or_insert(0) += 1;
                }
            }
            Fact::Shard(pk, id, joined, count, changes) => {
                if sketch.suspects(&Group::Shard(pk.clone()))
                    || sketch.suspects(&Group::Instance(id, joined.clone()))
                {
                    self.changes.insert(pk.clone(), changes);
                    self.shards.insert(pk, (id, joined, count));
                }
            }
            Fact::Counted(id, joined) => {
                if sketch.suspects(&Group::Instance(id, joined.clone())) {
                    *self.counted.entry((id, joined)).or_insert(0) += 1;
                }
            }
        }
    }
}

/// Counters, for the groups `sketch` found wrong: the sum of an
/// instance's shards against its counted source items, and each shard
/// against the records naming it.
pub(super) fn counters(spec: &Spec, sketch: &Sketch, tally: &Tally, out: &mut Vec<Finding>) {
    for (id, projection, counter) in spec.counters() {
        let mut targets: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for ((counter_id, joined), n) in &tally.counted {
            if *counter_id == id {
                targets.entry(joined.clone()).or_default().0 += n;
            }
        }
        for (counter_id, joined, count) in tally.shards.values() {
            if *counter_id == id && sketch.suspects(&Group::Instance(id, joined.clone())) {
                targets.entry(joined.clone()).or_default().1 += count;
            }
        }
        for (joined, (want, have)) in targets {
            if want == have {
                continue;
            }
            let values: Vec<String> = match counter.of.len() {
                0 => Vec::new(),
                1 => vec![joined.clone()],
                _ => joined.split('#').map(str::to_string).collect(),
            };
            let shards = (0..counter.shards)
                .map(|shard| spec.counter_shard_key(&counter.storage, &values, shard).pk)
                .collect();
            out.push(Finding {
                rule: projection.name.clone(),
                rule_kind: projection.kind_name().to_string(),
                problem: Problem::CounterOff {
                    expected: want,
                    actual: have,
                },
                key: if values.is_empty() {
                    format!("COUNTER#{}", counter.storage)
                } else {
                    format!("COUNTER#{}#{joined}", counter.storage)
                },
                items: Vec::new(),
                detail: counter
                    .of
                    .iter()
                    .zip(&values)
                    .map(|((name, _), value)| format!("{name}={value}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                repaired: false,
                counters: Vec::new(),
                shards: Vec::new(),
                fix: Some(Fix::Recount(shards)),
            });
        }
        // Each shard against the records naming it.
        let mut shards: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (pk, (counter_id, _, count)) in &tally.shards {
            if *counter_id == id && sketch.suspects(&Group::Shard(pk.clone())) {
                shards.entry(pk).or_default().0 = *count;
            }
        }
        for (pk, n) in &tally.records {
            if parse_shard(spec, pk).is_some_and(|(counter_id, _)| counter_id == id) {
                shards.entry(pk).or_default().1 = *n;
            }
        }
        for (pk, (holds, records)) in shards {
            if holds == records {
                continue;
            }
            let shard = spec.shard_item(pk);
            let mut f = finding(spec, id, Problem::ShardOff { holds, records }, &shard);
            f.fix = Some(Fix::Recount(vec![pk.to_string()]));
            out.push(f);
        }
    }
}

/// A violation of an invariant, as a finding.
pub(super) fn violation(spec: &Spec, invariant: usize, violation: &Violation) -> Finding {
    let invariant = &spec.invariants[invariant];
    Finding {
        rule: invariant.name.clone(),
        rule_kind: invariant.kind_name().to_string(),
        problem: Problem::Violation,
        key: match &violation.item {
            Some(sk) if !sk.is_empty() => format!("{} / {sk}", violation.scope),
            _ => violation.scope.clone(),
        },
        items: violation.keys.iter().map(|k| k.to_string()).collect(),
        detail: violation.message.clone(),
        repaired: false,
        counters: Vec::new(),
        shards: Vec::new(),
        fix: None,
    }
}

/// The shards a membership repair moves: those it records the source in,
/// and those the marker recorded it in before.
fn moved_shards(spec: &Spec, op: &Op, old: Option<&Item>) -> Vec<String> {
    let mut shards: Vec<String> = match op {
        Op::DropRecord { shard, .. } => vec![shard.clone()],
        Op::Membership { counters, .. } => counters.iter().map(|c| c.key.pk.clone()).collect(),
        _ => Vec::new(),
    };
    if let Some(old) = old {
        shards.extend(
            crate::apply::records_of(old)
                .iter()
                .filter(|(storage, _)| spec.counter_by_storage(storage).is_some())
                .filter_map(|(_, value)| match value {
                    crate::record::AttributeValue::S(shard) => Some(shard.clone()),
                    _ => None,
                }),
        );
    }
    shards.sort();
    shards.dedup();
    shards
}
