//! `inverse-edge` and `counter`: both keep a *marker* item in step with a
//! source item's membership in a set (edges that exist, items counted).
//!
//! The planner only says which state the marker must reach. The applier
//! writes it conditionally and moves the counter shards in the same
//! transaction only when the marker really appeared or disappeared, so the
//! counters always equal the number of markers, whatever is redelivered.

use super::SourceGuard;
use super::{
    changed, kind_is_removal, CounterShard, Effect, MarkerState, Op, PlanProblem, Selection,
    Subject,
};
use crate::record::{ChangeKind, Item, ItemKey, Origin};
use crate::spec::{
    Condition, Counter, InverseEdge, Marker, ProjectionId, ProjectionKind, RenderError, Spec,
    Template,
};

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

/// The desired marker state for a change, or `None` when the change cannot
/// move the source in or out of the set and changes no copied attribute.
fn desired<'a>(
    subject: &Subject<'_>,
    when: &Condition,
    reads: impl IntoIterator<Item = &'a String>,
    needs_image: bool,
) -> Result<Option<bool>, PlanProblem> {
    let record = subject.record;
    if kind_is_removal(record) {
        return Ok(Some(false));
    }
    if needs_image {
        subject.new_image(record.view_type)?;
    }
    let member = when.is_empty() || when.holds(record.new_image.as_ref());
    match record.kind {
        // A new item that is not a member needs nothing.
        ChangeKind::Insert => Ok(member.then_some(true)),
        ChangeKind::Modify if !changed(record, reads) => Ok(None),
        _ => Ok(Some(member)),
    }
}

fn render_copies(
    copy: &[(String, Template)],
    subject: &Subject<'_>,
    into: &mut Item,
) -> Result<(), PlanProblem> {
    let image = subject.record.new_image.as_ref();
    for (attr, template) in copy {
        match template.value(&subject.vars, image) {
            Ok(value) => {
                into.insert(attr.clone(), value);
            }
            // A plain copy of an absent attribute mirrors the absence.
            Err(RenderError::Missing(_)) if template.single_var().is_some() => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

fn shard_key(
    spec: &Spec,
    id: ProjectionId,
    counter: &Counter,
    subject: &Subject<'_>,
) -> Result<ItemKey, PlanProblem> {
    let values = counter
        .of
        .iter()
        .map(|(_, template)| template.render(&subject.vars, None::<&Item>))
        .collect::<Result<Vec<String>, RenderError>>()?;
    let shard = shard_for(&subject.key, counter.shards);
    Ok(spec.counter_shard_key(&spec.projections[id].name, &values, shard))
}

/// Whether a modify's old image shows its source was in the set already.
/// When the new image is in the set too (the caller knows), the marker only
/// needs its copied attributes refreshed and no counter moves (a
/// transaction that would create it would be cancelled).
fn stays_member(subject: &Subject<'_>, when: &Condition) -> bool {
    let record = subject.record;
    record.kind == ChangeKind::Modify
        && !record.ttl_expiry
        && record.old_image.is_some()
        && (when.is_empty() || when.holds(record.old_image.as_ref()))
}

/// A guard for memberships planned from a scan snapshot.
fn guard(subject: &Subject<'_>, member: bool, when: &Condition) -> Option<SourceGuard> {
    matches!(subject.record.origin, Origin::Scan { .. }).then(|| SourceGuard {
        source: subject.key.clone(),
        member,
        when: when.clone(),
    })
}

fn selected(selection: Selection<'_>, id: ProjectionId) -> bool {
    selection.is_none_or(|ids| ids.contains(&id))
}

pub(super) fn plan_edge(
    spec: &Spec,
    id: ProjectionId,
    edge: &InverseEdge,
    subject: &Subject<'_>,
    selection: Selection<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let needs_image = !edge.when.is_empty() || !edge.copy.is_empty();
    let Some(member) = desired(subject, &edge.when, &edge.reads, needs_image)? else {
        return Ok(());
    };
    let target = spec.entities[edge.target]
        .render_key(&subject.vars)
        .expect("inverse-edge variables are checked when the spec is compiled");
    let mut counters = Vec::new();
    for (counter_id, projection) in spec.projections.iter().enumerate() {
        if let ProjectionKind::Counter(counter) = &projection.kind {
            if counter.marker == Marker::Edge(id) && selected(selection, counter_id) {
                counters.push(CounterShard {
                    counter: counter_id,
                    key: shard_key(spec, counter_id, counter, subject)?,
                });
            }
        }
    }
    let stays = member && stays_member(subject, &edge.when);
    if stays && edge.copy.is_empty() {
        return Ok(());
    }
    let state = if member {
        let mut item = spec.table.key_item(&target);
        render_copies(&edge.copy, subject, &mut item)?;
        if stays {
            MarkerState::Refresh(item)
        } else {
            MarkerState::Present(item)
        }
    } else {
        MarkerState::Absent
    };
    effects.push(Effect {
        projection: id,
        op: Op::Membership {
            marker: target,
            state,
            counters,
            guard: guard(subject, member, &edge.when),
        },
    });
    Ok(())
}

pub(super) fn plan_counter(
    spec: &Spec,
    id: ProjectionId,
    counter: &Counter,
    subject: &Subject<'_>,
    selection: Selection<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    if let Marker::Edge(edge) = counter.marker {
        // The edge plans this counter's shard with its own marker. When only
        // the counter is selected, the edge is planned on its behalf.
        if selected(selection, edge) {
            return Ok(());
        }
        let first_selected =
            spec.projections
                .iter()
                .enumerate()
                .find_map(|(other, p)| match &p.kind {
                    ProjectionKind::Counter(c)
                        if c.marker == Marker::Edge(edge) && selected(selection, other) =>
                    {
                        Some(other)
                    }
                    _ => None,
                });
        if first_selected != Some(id) {
            return Ok(());
        }
        let ProjectionKind::InverseEdge(edge_projection) = &spec.projections[edge].kind else {
            unreachable!("markers point at inverse edges");
        };
        return plan_edge(spec, edge, edge_projection, subject, selection, effects);
    }
    let reads = counter.when.0.iter().map(|(name, _)| name);
    let Some(member) = desired(subject, &counter.when, reads, !counter.when.is_empty())? else {
        return Ok(());
    };
    if member && stays_member(subject, &counter.when) {
        // The marker has no attributes to refresh.
        return Ok(());
    }
    let marker = spec.counter_marker_key(&spec.projections[id].name, &subject.key);
    let state = if member {
        MarkerState::Present(spec.table.key_item(&marker))
    } else {
        MarkerState::Absent
    };
    effects.push(Effect {
        projection: id,
        op: Op::Membership {
            marker,
            state,
            counters: vec![CounterShard {
                counter: id,
                key: shard_key(spec, id, counter, subject)?,
            }],
            guard: guard(subject, member, &counter.when),
        },
    });
    Ok(())
}
