//! Planning `denormalize`, and what a recompute of its target writes.
//!
//! Copying deltas in event order does not converge when changes to
//! *different* source items are processed out of order (e2 becomes primary,
//! then e1's older "becomes primary" arrives). So the planner never plans a
//! value: it plans a [`Op::Recompute`] of the target, and the applier reads
//! the target and all its sources consistently and writes what
//! [`compute_denormalized`] says, whatever the order it gets triggers in.

use super::Denormalize;
use crate::effect::{changed, Effect, Op, PlanProblem, SourceQuery, Sources, Subject};
use crate::kinds::Rules;
use crate::record::{AttributeValue, ChangeKind, Image, Item};
use crate::schema::{EntityId, ProjectionId, RenderError};

/// Plans the recompute of the target a change of its source or of the
/// target itself may move.
pub(crate) fn plan(
    rules: &Rules,
    id: ProjectionId,
    projection: &Denormalize,
    entity: EntityId,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let record = subject.record;
    let relevant = if entity == projection.source {
        // Only a source that counts, before or after the change, can move
        // the target; a missing image might have counted.
        let counts =
            |image: Option<&Image>| image.is_none_or(|image| projection.when.holds(Some(image)));
        let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
        match record.kind {
            // A scanned item, or one derived from its current state (a
            // replay, `recover`), stands for changes whose states before are
            // unknown: it may have counted, so it recomputes either way.
            ChangeKind::Insert => counts(new) || subject.complete,
            ChangeKind::Modify => {
                changed(record, &projection.reads) && (counts(old) || counts(new))
            }
            ChangeKind::Remove => counts(old),
        }
    } else {
        // A change to the target: a writer may have overwritten the copied
        // attributes. The projector's own write also lands here once; its
        // recompute finds the value right and writes nothing.
        let copied = projection.copy.iter().map(|(attr, _)| attr);
        match record.kind {
            ChangeKind::Insert => true,
            ChangeKind::Modify => changed(record, copied),
            ChangeKind::Remove => false,
        }
    };
    if !relevant {
        return Ok(());
    }
    let target = &rules.entities[projection.target];
    let source = &rules.entities[projection.source];
    let (Some(target_key), Some(pk)) = (
        target.render_key(&subject.vars),
        source.pk.render(&subject.vars),
    ) else {
        // Compilation guarantees the variables are bound.
        unreachable!("denormalize variables are checked when the spec is compiled");
    };
    let sk_prefix = source
        .sk
        .as_ref()
        .map(|sk| sk.literal_prefix().to_string())
        .filter(|prefix| !prefix.is_empty());
    effects.push(Effect {
        projection: id,
        op: Op::Recompute {
            target: target_key,
            sources: Sources::Query(SourceQuery { pk, sk_prefix }),
        },
    });
    Ok(())
}

/// Computes the target's copied attributes from the source items read by a
/// [`SourceQuery`] (`None`: remove the attribute).
///
/// Items that are not of the source entity are ignored. When several
/// sources satisfy the condition (an invariant violation), the one with the
/// smallest sort key wins, so every worker picks the same one.
pub fn compute_denormalized(
    rules: &Rules,
    p: &Denormalize,
    sources: &[Item],
) -> Result<Vec<(String, Option<AttributeValue>)>, RenderError> {
    let entity = &rules.entities[p.source];
    let mut chosen: Option<(&str, &Item)> = None;
    for item in sources {
        let Some(AttributeValue::S(pk)) = item.get(&rules.table.partition_key) else {
            continue;
        };
        let sk = rules
            .table
            .sort_key
            .as_ref()
            .and_then(|name| match item.get(name) {
                Some(AttributeValue::S(sk)) => Some(sk.as_str()),
                _ => None,
            });
        let mut vars = Vec::new();
        if !entity.pk.match_into(pk, &mut vars) {
            continue;
        }
        if let (Some(pattern), Some(sk)) = (&entity.sk, sk) {
            if !pattern.match_into(sk, &mut vars) {
                continue;
            }
        }
        if !p.when.holds(Some(item)) {
            continue;
        }
        let order = sk.unwrap_or(pk);
        if chosen.is_none_or(|(best, _)| order < best) {
            chosen = Some((order, item));
        }
    }
    let Some((_, item)) = chosen else {
        return Ok(p
            .copy
            .iter()
            .map(|(attr, _)| (attr.clone(), None))
            .collect());
    };
    let key = rules.table.item_key(item).expect("matched above");
    let mut vars = Vec::new();
    entity.pk.match_into(&key.pk, &mut vars);
    if let (Some(pattern), Some(sk)) = (&entity.sk, key.sk.as_deref()) {
        pattern.match_into(sk, &mut vars);
    }
    p.copy
        .iter()
        .map(|(attr, template)| {
            match template.value(&vars, Some(item)) {
                Ok(value) => Ok((attr.clone(), Some(value))),
                // A plain copy of an absent attribute leaves it absent.
                Err(RenderError::Missing(_)) if template.single_var().is_some() => {
                    Ok((attr.clone(), None))
                }
                Err(error) => Err(error),
            }
        })
        .collect()
}
