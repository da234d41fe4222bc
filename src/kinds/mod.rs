//! Projection kinds whose whole definition lives in one folder: the raw
//! spec section, compilation and validation, planning, what the applier
//! computes for a target, what the audit expects, and the description.
//!
//! [`rollup`] and [`aggregate`] are kept here. Both are *recomputed*
//! kinds, like `denormalize`: the planner never plans a value, only "read
//! the target and what it is computed from, consistently, and write the
//! result on condition that the target is unchanged". What is compared is
//! a token the projector keeps on the target ([`token_attribute`]), which
//! only grows between writer rewrites, so a stalled recompute can never
//! land on a target that moved on and came back to the value it read.

pub mod aggregate;
pub mod rollup;

use crate::plan::{Op, SourceQuery, Sources};
use crate::record::{AttributeValue, Item, ItemKey};
use crate::spec::{Entity, ProjectionId, ProjectionKind, Spec, RESERVED_PREFIX};

/// The attribute a recomputed kind's target carries to order its writes:
/// a number that grows by one per write of projection `name`.
pub fn token_attribute(name: &str) -> String {
    format!("{RESERVED_PREFIX}v#{name}")
}

/// Whether a record of a recomputed kind's target asks for a recompute:
/// the target appeared, a writer changed what the kind writes, or the
/// target no longer carries the kind's `token` (a writer put the item
/// anew; that record's old image may not show what the put erased, for
/// one written before the projector's first write).
pub(crate) fn target_needs_recompute<'a>(
    record: &crate::record::ChangeRecord,
    written: impl IntoIterator<Item = &'a String>,
    token: &'a String,
) -> bool {
    use crate::record::ChangeKind;
    match record.kind {
        ChangeKind::Insert => true,
        ChangeKind::Modify => {
            let lost = record
                .new_image
                .as_ref()
                .is_some_and(|image| image.get(token).is_none());
            lost || crate::plan::changed(record, written.into_iter().chain([token]))
        }
        ChangeKind::Remove => false,
    }
}

/// Attributes to set (`Some`) or remove (`None`) on a target.
pub type TargetState = Vec<(String, Option<AttributeValue>)>;

/// For the audit: per target, what it must hold (or why it cannot be
/// computed) and the items it is computed from.
pub type Expected = std::collections::HashMap<ItemKey, (Result<TargetState, String>, Vec<ItemKey>)>;

/// What projection `id` computes for its target from what its recompute
/// read (`reads`: the source items of its query, or a counter's shards).
/// An `Err` is a dead letter's reason.
pub fn compute(spec: &Spec, id: ProjectionId, reads: &[Item]) -> Result<TargetState, String> {
    match &spec.projections[id].kind {
        ProjectionKind::Denormalize(p) => {
            crate::plan::compute_denormalized(spec, p, reads).map_err(|error| error.to_string())
        }
        ProjectionKind::Rollup(p) => rollup::compute(spec, p, reads),
        ProjectionKind::Aggregate(p) => aggregate::compute(spec, p, reads),
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => Err(format!(
            "`{}` is a {}, which is not recomputed",
            spec.projections[id].name,
            spec.projections[id].kind_name()
        )),
    }
}

/// Whether projection `id`'s recomputes order their writes by a token.
pub fn uses_token(spec: &Spec, id: ProjectionId) -> bool {
    match &spec.projections[id].kind {
        ProjectionKind::Rollup(_) | ProjectionKind::Aggregate(_) => true,
        ProjectionKind::Denormalize(_)
        | ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => false,
    }
}

/// The recompute of target `target` of projection `id`, if it is a
/// recomputed kind and `target` an item of its target entity.
pub fn recompute_op(spec: &Spec, id: ProjectionId, target: &ItemKey) -> Option<Op> {
    let (source, target_entity) = match &spec.projections[id].kind {
        ProjectionKind::Denormalize(p) => (p.source, p.target),
        ProjectionKind::Aggregate(p) => (p.source, p.target),
        ProjectionKind::Rollup(p) => return rollup::recompute_op(spec, p, target),
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => return None,
    };
    let mut vars = Vec::new();
    let entity = &spec.entities[target_entity];
    if !entity.pk.match_into(&target.pk, &mut vars) {
        return None;
    }
    if let (Some(pattern), Some(sk)) = (&entity.sk, target.sk.as_deref()) {
        if !pattern.match_into(sk, &mut vars) {
            return None;
        }
    }
    Some(Op::Recompute {
        target: target.clone(),
        sources: Sources::Query(source_query(&spec.entities[source], &vars)?),
    })
}

/// The query that reads every item of `source` in the partition the
/// bindings name.
pub(crate) fn source_query(source: &Entity, vars: &[(&str, &str)]) -> Option<SourceQuery> {
    Some(SourceQuery {
        pk: source.pk.render(vars)?,
        sk_prefix: source
            .sk
            .as_ref()
            .map(|sk| sk.literal_prefix().to_string())
            .filter(|prefix| !prefix.is_empty()),
    })
}

/// The key variables an item of `entity` binds, if it is one.
pub(crate) fn bind<'a>(
    spec: &'a Spec,
    entity: &'a Entity,
    item: &'a Item,
) -> Option<crate::spec::Bindings<'a>> {
    let Some(AttributeValue::S(pk)) = item.get(&spec.table.partition_key) else {
        return None;
    };
    let mut vars = Vec::new();
    if !entity.pk.match_into(pk, &mut vars) {
        return None;
    }
    let sk = match &spec.table.sort_key {
        Some(name) => match item.get(name) {
            Some(AttributeValue::S(sk)) => Some(sk.as_str()),
            _ => return None,
        },
        None => None,
    };
    match (&entity.sk, sk) {
        (Some(pattern), Some(sk)) => pattern.match_into(sk, &mut vars).then_some(vars),
        (None, None) => Some(vars),
        _ => None,
    }
}

/// The entity projection `id` writes attributes on (rather than whole
/// items), and those attributes: what another projection keeping those
/// items must leave alone, and what pruning it strips.
pub fn written_attributes(
    spec: &Spec,
    id: ProjectionId,
) -> Option<(crate::spec::EntityId, Vec<String>)> {
    let names =
        |set: &[(String, crate::spec::Template)]| set.iter().map(|(a, _)| a.clone()).collect();
    let name = &spec.projections[id].name;
    match &spec.projections[id].kind {
        ProjectionKind::IndexKeys(p) => Some((p.entity, names(&p.set))),
        ProjectionKind::Denormalize(p) => Some((p.target, names(&p.copy))),
        ProjectionKind::Rollup(p) => Some((p.target, rollup::written(name, p))),
        ProjectionKind::Aggregate(p) => Some((p.target, aggregate::written(name, p))),
        ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_) | ProjectionKind::Custom(_) => {
            None
        }
    }
}
