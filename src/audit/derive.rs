//! What the spec says must be derived, checked against the snapshot:
//! derived items, markers, counters and invariants, each a finding.

use std::collections::{BTreeMap, HashMap};

use super::scan::parse_shard;
use super::{Finding, Fix, Problem, Snapshot};
use crate::decode::scanned_record;
use crate::invariant::{check_partition, check_unique, unique_value, Violation};
use crate::kinds::Expected;
use crate::plan::{plan_record, Effect, MarkerState, Op};
use crate::record::{item_to_json, Item, ItemKey};
use crate::spec::{ProjectionId, ProjectionKind, Spec};

pub(super) fn finding(spec: &Spec, id: ProjectionId, problem: Problem, key: &ItemKey) -> Finding {
    Finding {
        rule: spec.projections[id].name.clone(),
        rule_kind: spec.projections[id].kind_name(),
        problem,
        key: key.to_string(),
        items: Vec::new(),
        detail: String::new(),
        repaired: false,
        fix: None,
    }
}

pub(super) fn show(item: Option<&Item>) -> String {
    match item {
        Some(item) => item_to_json(item).to_string(),
        None => "(none)".to_string(),
    }
}

/// Derived state, per projection in spec order.
pub(super) fn derived(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    for (id, projection) in spec.projections.iter().enumerate() {
        let selection = [id];
        match &projection.kind {
            ProjectionKind::IndexKeys(keys) => {
                for (entity, key, item) in &snapshot.items {
                    if *entity != keys.entity {
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
                        let mut f = finding(
                            spec,
                            id,
                            if missing {
                                Problem::Missing
                            } else {
                                Problem::Stale
                            },
                            key,
                        );
                        f.detail = set
                            .iter()
                            .map(|(attr, want)| {
                                format!(
                                    "{attr}: is {}, should be {}",
                                    item.get(attr)
                                        .map(|v| crate::record::value_to_json(v).to_string())
                                        .unwrap_or_else(|| "(none)".to_string()),
                                    crate::record::value_to_json(want)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("; ");
                        f.fix = Some(Fix::Effect(Box::new(effect)));
                        out.push(f);
                    }
                }
            }
            ProjectionKind::Denormalize(_) | ProjectionKind::Recomputed(_) => {
                recomputed(spec, id, snapshot, out)
            }
            // Memberships and counters are checked across projections below.
            ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_) => {}
            ProjectionKind::Custom(_) => {}
        }
    }
}

/// Recomputed targets (`denormalize`, `rollup`, `aggregate`): every
/// existing target holds what the kind computes from the snapshot.
fn recomputed(spec: &Spec, id: ProjectionId, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    let (target_entity, expected): (usize, Expected) = match &spec.projections[id].kind {
        ProjectionKind::Denormalize(p) => {
            let mut grouped: HashMap<ItemKey, Vec<Item>> = HashMap::new();
            for (entity, key, item) in &snapshot.items {
                if *entity != p.source {
                    continue;
                }
                let mut vars = Vec::new();
                spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
                if let Some(target) = spec.entities[p.target].render_key(&vars) {
                    grouped.entry(target).or_default().push(item.clone());
                }
            }
            let expected = grouped
                .into_iter()
                .map(|(target, own)| {
                    let keys = own.iter().filter_map(|s| spec.table.item_key(s)).collect();
                    (target, (crate::kinds::compute(spec, id, &own), keys))
                })
                .collect();
            (p.target, expected)
        }
        ProjectionKind::Recomputed(p) => (p.target(), p.expected(spec, &snapshot.items)),
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => return,
    };
    // A target nothing computes into holds what nothing computes to.
    let nothing = crate::kinds::compute(spec, id, &[]);
    for (entity, key, item) in &snapshot.items {
        if *entity != target_entity {
            continue;
        }
        let (want, sources) = match expected.get(key) {
            Some((want, sources)) => (want.clone(), sources.clone()),
            None => (nothing.clone(), Vec::new()),
        };
        let want = match want {
            Ok(want) => want,
            Err(error) => {
                let mut f = finding(spec, id, Problem::Underivable, key);
                f.detail = error;
                f.items = sources.iter().map(|k| k.to_string()).collect();
                out.push(f);
                continue;
            }
        };
        let json = |v: Option<&crate::record::AttributeValue>| {
            v.map(|v| crate::record::value_to_json(v).to_string())
                .unwrap_or_else(|| "(none)".to_string())
        };
        let wrong: Vec<String> = want
            .iter()
            .filter(|(attr, want)| match (item.get(attr), want) {
                (None, None) => false,
                (Some(have), Some(want)) => !crate::spec::values_equal(have, want),
                _ => true,
            })
            .map(|(attr, want)| {
                format!(
                    "{attr}: is {}, should be {}",
                    json(item.get(attr)),
                    json(want.as_ref())
                )
            })
            .collect();
        if wrong.is_empty() {
            continue;
        }
        // A denormalized copy that is absent has always been called stale.
        let missing = !matches!(spec.projections[id].kind, ProjectionKind::Denormalize(_))
            && want
                .iter()
                .all(|(attr, want)| want.is_some() && !item.contains_key(attr));
        let mut f = finding(
            spec,
            id,
            if missing {
                Problem::Missing
            } else {
                Problem::Stale
            },
            key,
        );
        f.detail = wrong.join("; ");
        f.items = sources.iter().map(|k| k.to_string()).collect();
        f.fix = crate::kinds::recompute_op(spec, id, key)
            .map(|op| Fix::Effect(Box::new(Effect { projection: id, op })));
        out.push(f);
    }
}

/// Reverse edges, counter markers and counter records: every scanned item
/// is planned as a backfill would plan it, and each membership or record
/// effect is checked against the snapshot with the applier's own
/// transition (nothing to write: in place).
pub(super) fn markers(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    let mut by_key: HashMap<&ItemKey, &Item> = snapshot
        .items
        .iter()
        .map(|(_, key, item)| (key, item))
        .collect();
    by_key.extend(snapshot.markers.iter());
    let scanned = snapshot
        .items
        .iter()
        .map(|(_, key, item)| (key, item))
        .chain(snapshot.markers.iter());
    for (key, item) in scanned {
        let Ok(record) = scanned_record(&spec.table, 0, 0, item.clone()) else {
            continue;
        };
        let plan = plan_record(spec, &record, None);
        for error in &plan.errors {
            let Some(id) = error.projection else { continue };
            if matches!(
                spec.projections[id].kind,
                ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_)
            ) {
                let mut f = finding(spec, id, Problem::Underivable, key);
                f.detail = error.problem.to_string();
                out.push(f);
            }
        }
        for effect in plan.effects {
            check_marker(spec, &by_key, effect, out);
        }
    }
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
                .map(|(name, value)| {
                    format!(
                        "{name}: is {}, should be {}",
                        old.get(name)
                            .map(|v| crate::record::value_to_json(v).to_string())
                            .unwrap_or_else(|| "(none)".to_string()),
                        crate::record::value_to_json(value)
                    )
                })
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
    // One repair fixes them all: the first finding carries it.
    if let Some(first) = found.first_mut() {
        first.fix = Some(Fix::Effect(Box::new(effect)));
    }
    out.extend(found);
}

/// Counters: the sum of the shards against the number of counted source
/// items, and each shard against the number of records naming it.
pub(super) fn counters(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    for (id, projection) in spec.projections.iter().enumerate() {
        let ProjectionKind::Counter(counter) = &projection.kind else {
            continue;
        };
        let mut targets: BTreeMap<String, (Vec<String>, i64, i64)> = BTreeMap::new();
        for (entity, key, item) in &snapshot.items {
            if *entity != counter.source
                || !(counter.when.is_empty() || counter.when.holds(Some(item)))
            {
                continue;
            }
            let mut vars = Vec::new();
            spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
            let Ok(values) = counter
                .of
                .iter()
                .map(|(_, t)| t.render(&vars, None::<&Item>))
                .collect::<Result<Vec<String>, _>>()
            else {
                continue;
            };
            targets
                .entry(values.join("#"))
                .or_insert_with(|| (values, 0, 0))
                .1 += 1;
        }
        for (counter_id, joined, count) in snapshot.shards.values() {
            if *counter_id != id {
                continue;
            }
            let values = if counter.of.len() == 1 {
                vec![joined.clone()]
            } else {
                joined.split('#').map(str::to_string).collect()
            };
            targets
                .entry(joined.clone())
                .or_insert_with(|| (values, 0, 0))
                .2 += count;
        }
        for (joined, (values, want, have)) in targets {
            if want == have {
                continue;
            }
            let shards = (0..counter.shards)
                .map(|shard| spec.counter_shard_key(&counter.storage, &values, shard).pk)
                .collect();
            out.push(Finding {
                rule: projection.name.clone(),
                rule_kind: projection.kind_name(),
                problem: Problem::CounterOff {
                    expected: want,
                    actual: have,
                },
                key: format!("COUNTER#{}#{joined}", counter.storage),
                items: Vec::new(),
                detail: counter
                    .of
                    .iter()
                    .zip(&values)
                    .map(|((name, _), value)| format!("{name}={value}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                repaired: false,
                fix: Some(Fix::Recount(shards)),
            });
        }
        // Each shard against the records naming it.
        let mut shards: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (pk, (counter_id, _, count)) in &snapshot.shards {
            if *counter_id == id {
                shards.entry(pk).or_default().0 = *count;
            }
        }
        for (pk, n) in &snapshot.records {
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

/// Invariants over the snapshot; returns the violations for the store.
pub(super) fn invariants(
    spec: &Spec,
    snapshot: &Snapshot,
    out: &mut Vec<Finding>,
) -> Vec<Violation> {
    let mut all = Vec::new();
    for invariant in &spec.invariants {
        let mut found = Vec::new();
        if invariant.is_partition_scoped() {
            let mut partitions: BTreeMap<&str, Vec<Item>> = BTreeMap::new();
            for (entity, key, item) in &snapshot.items {
                if *entity == invariant.entity {
                    partitions
                        .entry(key.pk.as_str())
                        .or_default()
                        .push(item.clone());
                }
            }
            for (pk, items) in partitions {
                found.extend(check_partition(spec, invariant, pk, &items));
            }
        } else {
            let mut holders: BTreeMap<String, Vec<ItemKey>> = BTreeMap::new();
            for (entity, key, item) in &snapshot.items {
                if *entity != invariant.entity {
                    continue;
                }
                if let Some(value) = unique_value(spec, invariant, item) {
                    holders.entry(value).or_default().push(key.clone());
                }
            }
            for (value, keys) in holders {
                found.extend(check_unique(invariant, &value, &keys));
            }
        }
        for violation in &found {
            out.push(Finding {
                rule: invariant.name.clone(),
                rule_kind: invariant.kind_name(),
                problem: Problem::Violation,
                key: match &violation.item {
                    Some(sk) if !sk.is_empty() => format!("{} / {sk}", violation.scope),
                    _ => violation.scope.clone(),
                },
                items: violation.keys.iter().map(|k| k.to_string()).collect(),
                detail: violation.message.clone(),
                repaired: false,
                fix: None,
            });
        }
        all.extend(found);
    }
    all
}
