//! Planning: a pure function from a change record to the effects it needs.
//!
//! **Architecture Invariant:** planning does no I/O and cannot fail as a
//! whole. For each record it returns the effects of every interested
//! projection, a [`Skip`] saying why nothing applies, or a [`PlanError`] per
//! projection that could not plan (the record goes to the dead letters for
//! that projection; other projections still apply).
//!
//! What an effect is, the vocabulary planning speaks, lives in
//! [`crate::effect`]; it is re-exported here.

use std::fmt;

use serde_json::json;

pub(crate) use crate::effect::{changed, Subject};
pub use crate::effect::{
    CounterShard, CustomOp, Effect, MarkerState, Op, PlanProblem, SourceGuard, SourceQuery, Sources,
};
pub use crate::kinds::custom::{CustomProjection, EntityChange};
pub use crate::kinds::denormalize::compute_denormalized;
pub use crate::kinds::membership::{is_record_attribute, shard_for};
use crate::kinds::Planning;
pub use crate::kinds::Selection;
use crate::record::{
    item_to_json, value_to_json, AttributeValue, ChangeRecord, ItemKey, Origin, ValueRef,
};
use crate::schema::ProjectionId;
use crate::spec::Spec;

/// Why a record planned nothing. Not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The key is under the projector's reserved prefix (its own items).
    Reserved,
    /// The key matches no entity of the spec.
    NoEntity,
    /// The entity has no projection (or none selected).
    NotProjected(String),
    /// The change touched nothing any projection reads.
    Unchanged(String),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Reserved => f.write_str("projector bookkeeping item"),
            Skip::NoEntity => f.write_str("key matches no entity of the spec"),
            Skip::NotProjected(entity) => write!(f, "no projection reads entity `{entity}`"),
            Skip::Unchanged(entity) => {
                write!(f, "change to `{entity}` touches nothing a projection reads")
            }
        }
    }
}

/// The key problem of a record whose key attribute `name` is missing or
/// not a string, with what the record has and what the spec expects.
fn bad_key(spec: &Spec, record: &ChangeRecord, name: &str) -> PlanProblem {
    let type_of = |value: ValueRef<'_>| match value {
        ValueRef::S(_) => "S",
        ValueRef::N(_) => "N",
        ValueRef::Bool(_) => "BOOL",
        ValueRef::Null(_) => "NULL",
        ValueRef::Other(value) => match value {
            serde_dynamo::AttributeValue::B(_) => "B",
            serde_dynamo::AttributeValue::L(_) => "L",
            serde_dynamo::AttributeValue::M(_) => "M",
            _ => "a set",
        },
    };
    let mut found: Vec<String> = record
        .keys
        .iter()
        .map(|(key, value)| format!("`{key}` ({})", type_of(value)))
        .collect();
    found.sort();
    let keys = match &spec.table.sort_key {
        Some(sk) => format!("{}, {sk}", spec.table.partition_key),
        None => spec.table.partition_key.clone(),
    };
    let source_table = match &record.origin {
        crate::record::Origin::Lambda {
            event_source_arn: Some(arn),
        } => crate::dynamo::arn::table_from_stream_arn(arn).map(str::to_string),
        _ => None,
    };
    PlanProblem::BadKey {
        name: name.to_string(),
        found,
        spec_table: format!("{} (keys {keys}, strings)", spec.table.name),
        source_table,
    }
}

/// A projection's failure to plan one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    /// The projection (`None` when the record fails before any projection).
    pub projection: Option<ProjectionId>,
    /// What went wrong.
    pub problem: PlanProblem,
}

/// Everything planned for one record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordPlan {
    /// Effects to apply.
    pub effects: Vec<Effect>,
    /// Projections that could not plan the record.
    pub errors: Vec<PlanError>,
    /// Why nothing was planned, when nothing was and nothing failed.
    pub skip: Option<Skip>,
    /// The entity the record belongs to.
    pub entity: Option<usize>,
}

/// Plans one record against a spec.
pub fn plan_record(spec: &Spec, record: &ChangeRecord, selection: Selection<'_>) -> RecordPlan {
    plan(spec, record, selection, false, false)
}

/// Plans a record as the item it shows, whatever it changed: every
/// projection plans the state the item derives (an `INSERT` that derives
/// nothing removes a marker), as for a scanned item but without guards.
/// For the last record of an item that a re-delivery held after records
/// it skips ([`crate::apply::Delivery`]): what they would have written is
/// written from it. Give it the record as its item
/// ([`ChangeRecord::as_item`]).
pub fn plan_complete(spec: &Spec, record: &ChangeRecord, selection: Selection<'_>) -> RecordPlan {
    plan(spec, record, selection, false, true)
}

/// Plans one record whose writes must not land once its item has moved
/// past the state the record shows: every write planned from its images
/// (a membership's marker, a custom projection's put or delete) carries a
/// guard on that state, checked in the same transaction. For a record
/// that may be delivered again after newer ones of its item were applied
/// (a retried or bisected batch, a runner restarted from its checkpoint):
/// superseded, it changes nothing. Index keys are conditioned on the
/// source's values and recomputes read what is there, guarded or not.
pub fn plan_guarded(spec: &Spec, record: &ChangeRecord, selection: Selection<'_>) -> RecordPlan {
    plan(spec, record, selection, true, false)
}

fn plan(
    spec: &Spec,
    record: &ChangeRecord,
    selection: Selection<'_>,
    guarded: bool,
    complete: bool,
) -> RecordPlan {
    // A projection is planned with those it depends on, or that depend on
    // it (a rollup and its counter): a redrive or replay of one keeps the
    // other equal to it.
    let paired;
    let selection = match selection {
        Some(ids) => {
            paired = crate::kinds::with_dependencies(spec, ids);
            Some(&paired[..])
        }
        None => None,
    };
    let mut plan = plan_projections(spec, record, selection, guarded, complete);
    // Whatever may move a counter's shard, its rollups follow.
    crate::kinds::follow(spec, &mut plan.effects);
    plan
}

fn plan_projections(
    spec: &Spec,
    record: &ChangeRecord,
    selection: Selection<'_>,
    guarded: bool,
    complete: bool,
) -> RecordPlan {
    let mut plan = RecordPlan::default();
    let pk_name = &spec.table.partition_key;
    let pk = match record.keys.get(pk_name) {
        Some(ValueRef::S(pk)) => pk,
        _ => {
            plan.errors.push(PlanError {
                projection: None,
                problem: bad_key(spec, record, pk_name),
            });
            return plan;
        }
    };
    let sk = match &spec.table.sort_key {
        Some(name) => match record.keys.get(name) {
            Some(ValueRef::S(sk)) => Some(sk),
            _ => {
                plan.errors.push(PlanError {
                    projection: None,
                    problem: bad_key(spec, record, name),
                });
                return plan;
            }
        },
        None => None,
    };
    if matches!(record.origin, Origin::Scan { .. }) {
        // A scan also reads derived items: markers whose source is gone,
        // counter records left where a changed spec no longer keeps them.
        let key = ItemKey {
            pk: pk.to_string(),
            sk: sk.map(str::to_string),
        };
        crate::kinds::membership::plan_scanned_marker(
            spec,
            record,
            &key,
            selection,
            &mut plan.effects,
        );
    }
    if pk.starts_with(crate::dynamo::names::RESERVED_PREFIX) {
        if plan.effects.is_empty() {
            plan.skip = Some(Skip::Reserved);
        }
        return plan;
    }
    let mut vars = Vec::with_capacity(4);
    let Some(entity) = spec.match_entity(pk, sk, &mut vars) else {
        if plan.effects.is_empty() {
            plan.skip = Some(Skip::NoEntity);
        }
        return plan;
    };
    plan.entity = Some(entity);
    let subject = Subject {
        record,
        key: ItemKey {
            pk: pk.to_string(),
            sk: sk.map(str::to_string),
        },
        vars,
        guarded: guarded || matches!(record.origin, Origin::Scan { .. }),
        complete: complete || matches!(record.origin, Origin::Scan { .. }),
    };
    let mut any_selected = false;
    for &id in spec.interested(entity) {
        if selection.is_some_and(|selected| !selected.contains(&id)) {
            continue;
        }
        any_selected = true;
        let at = Planning {
            rules: spec,
            id,
            entity,
            subject: &subject,
            selection,
        };
        let result = spec.kind(id).plan(&at, &mut plan.effects);
        if let Err(problem) = result {
            plan.errors.push(PlanError {
                projection: Some(id),
                problem,
            });
        }
    }
    if plan.effects.is_empty() && plan.errors.is_empty() {
        let name = spec.entities[entity].name.clone();
        plan.skip = Some(if any_selected {
            Skip::Unchanged(name)
        } else {
            Skip::NotProjected(name)
        });
    }
    plan
}

impl Effect {
    /// The effect as one JSON object for `plan` output.
    pub fn to_json(&self, spec: &Spec) -> serde_json::Value {
        let projection = &spec.projections[self.projection].name;
        let key = |key: &ItemKey| item_to_json(&spec.table.key_item(key));
        let pairs = |list: &[(String, AttributeValue)]| {
            serde_json::Value::Object(
                list.iter()
                    .map(|(k, v)| (k.clone(), value_to_json(v)))
                    .collect(),
            )
        };
        match &self.op {
            Op::SetAttributes {
                key: k,
                set,
                expect,
            } => json!({
                "projection": projection, "op": "set", "key": key(k),
                "set": pairs(set), "if": pairs(expect),
            }),
            Op::Recompute {
                target,
                sources: Sources::Query(sources),
            } => json!({
                "projection": projection, "op": "recompute", "key": key(target),
                "reads": {
                    "target": key(target),
                    "query": {
                        "pk": sources.pk,
                        "sk_begins_with": sources.sk_prefix,
                        "consistent": true,
                    }
                },
            }),
            Op::Recompute {
                target,
                sources: Sources::Counter { counter, values },
            } => json!({
                "projection": projection, "op": "recompute", "key": key(target),
                "reads": {
                    "target": key(target),
                    "counter": spec.projections[*counter].name,
                    "of": values,
                    "version": "the one readers read",
                    "consistent": true,
                },
            }),
            Op::Recompute {
                target,
                sources: Sources::Items(items),
            } => json!({
                "projection": projection, "op": "recompute", "key": key(target),
                "reads": {
                    "target": key(target),
                    "items": items.iter().map(key).collect::<Vec<_>>(),
                    "consistent": true,
                },
            }),
            Op::Membership {
                marker,
                state,
                counters,
                ..
            } => {
                let counters: Vec<serde_json::Value> = counters
                    .iter()
                    .map(|c| json!({ "counter": spec.projections[c.counter].name, "key": key(&c.key) }))
                    .collect();
                match state {
                    MarkerState::Present(item) => json!({
                        "projection": projection, "op": "put-if-changed", "key": key(marker),
                        "item": item_to_json(item), "counted_in": counters,
                    }),
                    MarkerState::Absent => json!({
                        "projection": projection, "op": "delete-if-exists", "key": key(marker),
                        "uncounted_from": counters,
                    }),
                }
            }
            Op::DropRecord {
                item,
                counter,
                shard,
            } => json!({
                "projection": projection, "op": "drop-record", "key": key(item),
                "counter": spec.projections[*counter].name, "shard": shard,
            }),
            Op::Custom {
                op: CustomOp::Put(item),
                ..
            } => json!({
                "projection": projection, "op": "put",
                "key": spec.table.item_key(item).map(|k| key(&k)), "item": item_to_json(item),
            }),
            Op::Custom {
                op: CustomOp::Delete(k),
                ..
            } => json!({
                "projection": projection, "op": "delete", "key": key(k),
            }),
        }
    }
}

/// Renders a plan problem for output, naming the projection.
pub fn describe_error(spec: &Spec, error: &PlanError) -> String {
    match error.projection {
        Some(id) => format!(
            "projection `{}`: {}",
            spec.projections[id].name, error.problem
        ),
        None => error.problem.to_string(),
    }
}
