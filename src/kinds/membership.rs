//! `inverse-edge` and `counter`: both keep a *marker* item in step with a
//! source item's membership in a set (edges that exist, items counted).
//!
//! A counter records its membership *per counter*: on the marker item, the
//! attribute `_ddbp#c#<counter>` holds the shard the source is counted in.
//! The marker is the reverse edge of an inverse edge over the same source
//! and condition (so counting costs no extra item), or the counter's own
//! marker item otherwise. The planner only says which state the marker and
//! its records must reach; the applier writes the transition it finds,
//! conditionally, with the shard moves in the same transaction, so each
//! shard always equals the number of records naming it.

use super::counter::{Counter, Marker};
use super::{ProjectionKind, Rules, Selection};
use crate::dynamo::names::RECORDS_ATTRIBUTE;
use crate::effect::{
    changed, CounterShard, Effect, MarkerState, Op, PlanProblem, SourceGuard, Subject,
};
use crate::record::{ChangeKind, ChangeRecord, Item, ItemKey, ValueRef};
use crate::schema::{Bindings, Condition, ProjectionId, RenderError};

/// The shard a source item counts in: FNV-1a of its key, stable across
/// versions and machines, so a removal always hits the shard its insert did.
pub fn shard_for(key: &ItemKey, shards: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(key.pk.as_bytes());
    feed(&[0]);
    if let Some(sk) = &key.sk {
        feed(sk.as_bytes());
    }
    (hash % u64::from(shards.max(1))) as u32
}

/// What a change means for one membership: the state the marker must
/// reach, and a guess of the state it was in.
pub(crate) struct Wanted {
    pub(crate) member: bool,
    pub(crate) was_member: bool,
}

/// The desired membership for a change, or `None` when the change cannot
/// move the source in or out of the set and changes nothing the marker
/// copies.
pub(crate) fn desired<'a>(
    subject: &Subject<'_>,
    when: &Condition,
    reads: impl IntoIterator<Item = &'a String>,
    needs_image: bool,
) -> Result<Option<Wanted>, PlanProblem> {
    let record = subject.record;
    // Without an old image, guess from the kind of change.
    let was_member = match &record.old_image {
        Some(old) => when.is_empty() || when.holds(Some(old)),
        None => record.kind == ChangeKind::Remove,
    };
    if record.kind == ChangeKind::Remove {
        return Ok(Some(Wanted {
            member: false,
            was_member,
        }));
    }
    if needs_image {
        subject.new_image(record.view_type)?;
    }
    let member = when.is_empty() || when.holds(record.new_image.as_ref());
    // A record that stands for its whole item may find a marker left
    // from what it does not show (an older spec, records skipped).
    let scanned = subject.complete;
    match record.kind {
        // A new item that is not a member needs nothing, unless a scan saw
        // it: then its marker may be left from an older spec.
        ChangeKind::Insert if !member && !scanned => Ok(None),
        ChangeKind::Modify if !changed(record, reads) => Ok(None),
        _ => Ok(Some(Wanted { member, was_member })),
    }
}

/// The shard of `counter` that `source` counts in.
pub(crate) fn shard_key(
    rules: &Rules,
    counter: &Counter,
    source: &ItemKey,
    vars: &[(&str, &str)],
) -> Result<ItemKey, RenderError> {
    let values = counter
        .of
        .iter()
        .map(|(_, template)| template.render(vars, None::<&Item>))
        .collect::<Result<Vec<String>, RenderError>>()?;
    let shard = shard_for(source, counter.shards);
    Ok(rules.counter_shard_key(&counter.storage, &values, shard))
}

/// The counters recording their membership on edge `edge`'s reverse
/// items, with the shard `source` counts in.
pub(crate) fn edge_counters(
    rules: &Rules,
    edge: ProjectionId,
    source: &ItemKey,
    vars: &[(&str, &str)],
) -> Result<Vec<CounterShard>, RenderError> {
    let mut counters = Vec::new();
    for (id, projection) in rules.projections.iter().enumerate() {
        if let ProjectionKind::Counter(counter) = &projection.kind {
            if counter.marker == Marker::Edge(edge) {
                counters.push(CounterShard {
                    counter: id,
                    key: shard_key(rules, counter, source, vars)?,
                });
            }
        }
    }
    Ok(counters)
}

/// The source state a guarded membership depends on (a scanned or current
/// state, or a record that may come after newer ones): the attributes it
/// read, as the record shows them; `seen: None` for a removal.
pub(crate) fn guard<'a>(
    subject: &Subject<'_>,
    reads: impl IntoIterator<Item = &'a String>,
) -> Option<SourceGuard> {
    if !subject.guarded {
        return None;
    }
    Some(SourceGuard {
        source: subject.key.clone(),
        seen: seen(subject.record, reads),
    })
}

/// What a guard expects of a record's item: absent after a removal;
/// otherwise present, with `reads` as its new image has them (a record
/// without a new image says only that the item exists).
pub(crate) fn seen<'a>(
    record: &ChangeRecord,
    reads: impl IntoIterator<Item = &'a String>,
) -> Option<Vec<(String, Option<crate::record::AttributeValue>)>> {
    if record.kind == ChangeKind::Remove {
        return None;
    }
    let Some(image) = record.new_image.as_ref() else {
        return Some(Vec::new());
    };
    Some(
        reads
            .into_iter()
            .map(|name| (name.clone(), image.get(name).map(|v| v.to_value())))
            .collect(),
    )
}

/// Whether projection `id` is planned under `selection`.
pub(crate) fn selected(selection: Selection<'_>, id: ProjectionId) -> bool {
    selection.is_none_or(|ids| ids.contains(&id))
}

/// Whether an edge is planned under `selection`: it is, or one of the
/// counters riding on it is.
fn edge_selected(rules: &Rules, selection: Selection<'_>, edge: ProjectionId) -> bool {
    selected(selection, edge)
        || rules.projections.iter().enumerate().any(|(id, p)| {
            matches!(&p.kind, ProjectionKind::Counter(c) if c.marker == Marker::Edge(edge))
                && selected(selection, id)
        })
}

/// For an item a scan read: what it means as a *derived* item. A reverse
/// edge or counter marker whose source does not exist is removed (on
/// condition that the source still does not exist), and a counter record
/// on an item that is no longer where that counter records its members
/// (the spec changed) is dropped with its shard moved back.
pub(crate) fn plan_scanned_marker(
    rules: &Rules,
    record: &ChangeRecord,
    key: &ItemKey,
    selection: Selection<'_>,
    effects: &mut Vec<Effect>,
) {
    let Some(image) = record.new_image.as_ref() else {
        return;
    };
    let mut vars: Bindings<'_> = Vec::new();
    let entity = rules.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
    let own = rules.parse_counter_marker(key);
    // Records of this spec's counters on the item, and whether the item is
    // where that counter keeps them.
    if let Some(ValueRef::Other(crate::record::AttributeValue::M(records))) =
        image.get(RECORDS_ATTRIBUTE)
    {
        for (name, value) in records.iter() {
            let Some(counter) = rules.counter_by_storage(name) else {
                continue;
            };
            let crate::record::AttributeValue::S(shard) = value else {
                continue;
            };
            if !selected(selection, counter) {
                continue;
            }
            let ProjectionKind::Counter(c) = &rules.projections[counter].kind else {
                continue;
            };
            let in_place = match (c.marker, &own, entity) {
                (Marker::Own, Some((marker_of, _)), _) => *marker_of == counter,
                (Marker::Edge(edge), None, Some(entity)) => {
                    matches!(&rules.projections[edge].kind, ProjectionKind::InverseEdge(e) if e.target == entity)
                }
                _ => false,
            };
            if !in_place {
                effects.push(Effect {
                    projection: counter,
                    op: Op::DropRecord {
                        item: key.clone(),
                        counter,
                        shard: shard.clone(),
                    },
                });
            }
        }
    }
    // A counter's own marker whose source may be gone.
    if let Some((counter, source)) = own {
        let ProjectionKind::Counter(c) = &rules.projections[counter].kind else {
            return;
        };
        if c.marker != Marker::Own || !selected(selection, counter) {
            return;
        }
        let mut source_vars: Bindings<'_> = Vec::new();
        if rules
            .match_entity(&source.pk, source.sk.as_deref(), &mut source_vars)
            .is_none()
        {
            return;
        }
        let Ok(shard) = shard_key(rules, c, &source, &source_vars) else {
            return;
        };
        effects.push(orphan_check(
            counter,
            key.clone(),
            source,
            vec![CounterShard {
                counter,
                key: shard,
            }],
        ));
        return;
    }
    // A reverse edge whose source may be gone.
    let Some(entity) = entity else { return };
    for (edge_id, projection) in rules.projections.iter().enumerate() {
        let ProjectionKind::InverseEdge(edge) = &projection.kind else {
            continue;
        };
        if edge.target != entity || !edge_selected(rules, selection, edge_id) {
            continue;
        }
        let Some(source) = rules.entities[edge.source].render_key(&vars) else {
            continue;
        };
        let Ok(counters) = edge_counters(rules, edge_id, &source, &vars) else {
            continue;
        };
        effects.push(orphan_check(edge_id, key.clone(), source, counters));
    }
}

/// Remove `marker` (and uncount what it records) if `source` does not
/// exist; if it does, its own record decides.
fn orphan_check(
    projection: ProjectionId,
    marker: ItemKey,
    source: ItemKey,
    counters: Vec<CounterShard>,
) -> Effect {
    Effect {
        projection,
        op: Op::Membership {
            marker,
            state: MarkerState::Absent,
            counters,
            was_present: true,
            guard: Some(SourceGuard { source, seen: None }),
        },
    }
}

/// Whether an attribute is the projector's counter records.
pub fn is_record_attribute(name: &str) -> bool {
    name == RECORDS_ATTRIBUTE
}
