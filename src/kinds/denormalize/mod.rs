//! `denormalize`: copy attributes from the source item that satisfies a
//! condition onto a target item.
//!
//! ```toml
//! [[projections]]
//! name = "profile-primary-email"
//! kind = "denormalize"
//! source = "email"               # USER#{userId} / EMAIL#{emailId}
//! target = "profile"             # USER#{userId} / PROFILE
//! when = { isPrimary = true }
//! copy = { email = "{email}" }
//! ```
//!
//! A recomputed kind: the planner plans a recompute of the target, never
//! a value, and the applier writes what [`compute_denormalized`] says
//! from a consistent read of the target's sources (`plan.rs`).

mod plan;

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{
    Expectation, Kind, Planning, Projection, Pruning, Recompute, Rules, TargetState, Writes,
};
use crate::effect::{Effect, Op, PlanProblem};
use crate::record::{Item, ItemKey};
use crate::schema::raw::RawCondition;
use crate::schema::{Compiler, Condition, Entity, EntityId, TableSpec, Template};
pub use plan::compute_denormalized;
pub(crate) use plan::plan;

/// The `[[projections]]` section of `kind = "denormalize"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDenormalize {
    /// Projection name.
    pub name: String,
    /// The entity copied from.
    pub source: String,
    /// The entity copied onto; its key variables come from the source's.
    pub target: String,
    /// The source item that counts (`{ isPrimary = true }`).
    #[serde(default)]
    pub when: RawCondition,
    /// Target attribute to template over the source item.
    pub copy: BTreeMap<String, String>,
}

/// Copy attributes from the source item that satisfies `when` onto a target.
#[derive(Debug, Clone)]
pub struct Denormalize {
    /// Source entity.
    pub source: EntityId,
    /// Target entity.
    pub target: EntityId,
    /// Which source item counts.
    pub when: Condition,
    /// Target attribute to template over the source item.
    pub copy: Vec<(String, Template)>,
    /// Source attributes that matter (condition and copies).
    pub reads: Vec<String>,
}

/// Compiles a raw `denormalize`; problems go to `cx`.
pub(crate) fn compile(
    raw: &RawDenormalize,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<Denormalize> {
    let (source, target) = cx.source_and_target(context, &raw.source, &raw.target, entities)?;
    if raw.copy.is_empty() {
        cx.error(
            context,
            "`copy` is empty: name at least one attribute to copy",
        );
        return None;
    }
    let bound = cx.bound_by_source(context, &entities[source], &entities[target]);
    let target_vars: HashSet<&str> = entities[target].vars().collect();
    let unqueryable: Vec<&String> = entities[source]
        .pk
        .vars()
        .iter()
        .filter(|v| !target_vars.contains(v.as_str()))
        .collect();
    if !unqueryable.is_empty() {
        cx.error(
            context,
            format!(
                "the source items must be found by a query on the target's variables, but the pk of `{}` (`{}`) needs {} which the target `{}` does not have",
                entities[source].name,
                entities[source].pk,
                unqueryable.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                entities[target].name
            ),
        );
    }
    let when = cx.condition(context, &raw.when);
    let copy = cx.templates(context, "copy", &raw.copy, table)?;
    if !bound || !unqueryable.is_empty() {
        return None;
    }
    let reads = super::reads_of(&when, &copy, &entities[source]);
    Some(Denormalize {
        source,
        target,
        when,
        copy,
        reads,
    })
}

/// One line for `check`, `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &Denormalize) -> String {
    format!(
        "{} -> {}{}: {}",
        rules.entities[p.source].name,
        rules.entities[p.target].name,
        super::when(&p.when),
        super::pairs(&p.copy)
    )
}

/// A denormalized copy is recomputed: its target reads its sources.
impl Kind for Denormalize {
    fn kind_name(&self) -> &'static str {
        "denormalize"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        vec![self.source, self.target]
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        vec![pattern(self.source), pattern(self.target)]
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.rules, at.id, self, at.entity, at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String> {
        Some(format!(
            "denormalize `{name}`: records of its target `{}` pass (its INSERTs and MODIFYs make the projector recompute the copied attributes, so a writer that overwrites them is corrected), including the MODIFY of the projector's own write, whose recompute reads the items again and writes nothing",
            rules.entities[self.target].name
        ))
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Attributes {
            entity: self.target,
            set: copied(self),
            own: Vec::new(),
        }
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        Some((self.source, self.target))
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        Some(self)
    }

    fn expectation(&self) -> Expectation {
        // A denormalized copy that is absent has always been called stale.
        Expectation::Recomputed {
            absent_is_missing: false,
        }
    }

    fn pruning(&self, _name: &str) -> Pruning {
        Pruning::Strip {
            entity: self.target,
            attributes: copied(self),
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}

/// The target reads the source items of its partition with a query.
impl Recompute for Denormalize {
    fn target(&self) -> EntityId {
        self.target
    }

    fn queried(&self) -> Option<EntityId> {
        Some(self.source)
    }

    fn compute(&self, rules: &Rules, reads: &[Item]) -> Result<TargetState, String> {
        compute_denormalized(rules, self, reads).map_err(|error| error.to_string())
    }

    fn op(&self, rules: &Rules, target: &ItemKey) -> Option<Op> {
        super::query_recompute(rules, self.source, self.target, target)
    }

    fn uses_token(&self) -> bool {
        false
    }
}

/// The attributes it copies onto its target.
fn copied(p: &Denormalize) -> Vec<String> {
    p.copy.iter().map(|(attr, _)| attr.clone()).collect()
}
