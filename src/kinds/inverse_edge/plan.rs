//! Planning `inverse-edge`: the state its reverse item must reach, with
//! the records of the counters that ride on it.

use super::InverseEdge;
use crate::effect::{Effect, MarkerState, Op, PlanProblem, Subject};
use crate::kinds::membership::{desired, edge_counters, guard};
use crate::kinds::Rules;
use crate::record::{ChangeKind, Item};
use crate::schema::{ProjectionId, RenderError, Template};

/// Puts the copied attributes, rendered from the source's new image, into
/// the reverse item.
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

/// Plans the reverse item of edge `id` for a change of its source.
pub(crate) fn plan(
    rules: &Rules,
    id: ProjectionId,
    edge: &InverseEdge,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let needs_image = !edge.when.is_empty() || !edge.copy.is_empty();
    let Some(wanted) = desired(subject, &edge.when, &edge.reads, needs_image)? else {
        return Ok(());
    };
    if wanted.member
        && wanted.was_member
        && edge.copy.is_empty()
        && subject.record.kind == ChangeKind::Modify
    {
        // Stays in the set, nothing copied: the marker is already right.
        return Ok(());
    }
    let counters = edge_counters(rules, id, &subject.key, &subject.vars)?;
    let target = rules.entities[edge.target]
        .render_key(&subject.vars)
        .expect("inverse-edge variables are checked when the spec is compiled");
    let state = if wanted.member {
        let mut item = rules.table.key_item(&target);
        render_copies(&edge.copy, subject, &mut item)?;
        MarkerState::Present(item)
    } else {
        MarkerState::Absent
    };
    effects.push(Effect {
        projection: id,
        op: Op::Membership {
            marker: target,
            state,
            counters,
            was_present: wanted.was_member,
            guard: guard(subject, &edge.reads),
        },
    });
    Ok(())
}
