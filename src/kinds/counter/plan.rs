//! Planning `counter`: the membership of the changed item, recorded on
//! the counter's own marker, or planned by the edge it rides on.

use super::{Counter, Marker};
use crate::effect::{CounterShard, Effect, MarkerState, Op, PlanProblem, Subject};
use crate::kinds::membership::{desired, guard, selected, shard_key};
use crate::kinds::{ProjectionKind, Rules, Selection};
use crate::record::ChangeKind;
use crate::schema::ProjectionId;

/// Plans counter `id`'s membership for a change of its source: on its
/// own marker, or through the edge it rides on.
pub(crate) fn plan(
    rules: &Rules,
    id: ProjectionId,
    counter: &Counter,
    subject: &Subject<'_>,
    selection: Selection<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    if let Marker::Edge(edge) = counter.marker {
        // The edge plans this counter's record with its own marker. When
        // only counters of the edge are selected, the first of them plans
        // the edge on their behalf.
        if selected(selection, edge) {
            return Ok(());
        }
        let first_selected = rules
            .counters()
            .map(|(other, _, c)| (other, c))
            .find(|(other, c)| c.marker == Marker::Edge(edge) && selected(selection, *other))
            .map(|(other, _)| other);
        if first_selected != Some(id) {
            return Ok(());
        }
        let ProjectionKind::InverseEdge(edge_projection) = &rules.projections[edge].kind else {
            unreachable!("markers point at inverse edges");
        };
        return crate::kinds::inverse_edge::plan(rules, edge, edge_projection, subject, effects);
    }
    let reads = || counter.when.0.iter().map(|(name, _)| name);
    let Some(wanted) = desired(subject, &counter.when, reads(), !counter.when.is_empty())? else {
        return Ok(());
    };
    if wanted.member && wanted.was_member && subject.record.kind == ChangeKind::Modify {
        // The marker has no attributes to refresh.
        return Ok(());
    }
    let marker = rules.counter_marker_key(rules.storage(id), &subject.key);
    let state = if wanted.member {
        MarkerState::Present(rules.table.key_item(&marker))
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
                key: shard_key(rules, counter, &subject.key, &subject.vars)?,
            }],
            was_present: wanted.was_member,
            guard: guard(subject, reads()),
        },
    });
    Ok(())
}
