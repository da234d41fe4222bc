//! `inverse-edge`: the reverse item of a relationship, kept while the
//! edge exists (and its condition holds).
//!
//! ```toml
//! [[projections]]
//! name = "followed-by"
//! kind = "inverse-edge"
//! source = "follow"              # USER#{followerId} / FOLLOWS#{followeeId}
//! target = "followed_by"         # USER#{followeeId} / FOLLOWED_BY#{followerId}
//! copy = { followedAt = "{followedAt}" }
//! ```
//!
//! The reverse item is a *marker* of the edge's membership: the planner
//! says which state it must reach (`plan.rs`, with what it shares with
//! counters in `kinds/membership.rs`), and counters over the same source
//! and condition record their members on it.

mod plan;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Expectation, Kind, Planning, Projection, Pruning, Recompute, Rules, Writes};
use crate::effect::{Effect, PlanProblem};
use crate::schema::raw::RawCondition;
use crate::schema::{Compiler, Condition, Entity, EntityId, TableSpec, Template};
pub(crate) use plan::plan;

/// The `[[projections]]` section of `kind = "inverse-edge"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInverseEdge {
    /// Projection name.
    pub name: String,
    /// The edge entity (`follow`).
    pub source: String,
    /// The reverse edge entity (`followed_by`).
    pub target: String,
    /// Only edges for which this holds get a reverse item.
    #[serde(default)]
    pub when: RawCondition,
    /// Target attribute to template over the source item.
    #[serde(default)]
    pub copy: BTreeMap<String, String>,
}

/// Maintain the reverse item of a relationship.
#[derive(Debug, Clone)]
pub struct InverseEdge {
    /// Edge entity.
    pub source: EntityId,
    /// Reverse edge entity.
    pub target: EntityId,
    /// Which edges get a reverse item.
    pub when: Condition,
    /// Target attribute to template over the source item.
    pub copy: Vec<(String, Template)>,
    /// Source attributes that matter (condition and copies).
    pub reads: Vec<String>,
}

/// Compiles a raw `inverse-edge`; problems go to `cx`.
pub(crate) fn compile(
    raw: &RawInverseEdge,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<InverseEdge> {
    let (source, target) = cx.source_and_target(context, &raw.source, &raw.target, entities)?;
    let bound = cx.bound_by_source(context, &entities[source], &entities[target]);
    let one_to_one = cx.covers_source(context, &entities[source], &entities[target]);
    let when = cx.condition(context, &raw.when);
    let copy = cx.templates(context, "copy", &raw.copy, table)?;
    if !bound || !one_to_one {
        return None;
    }
    let reads = super::reads_of(&when, &copy, &entities[source]);
    Some(InverseEdge {
        source,
        target,
        when,
        copy,
        reads,
    })
}

/// One line for `check`, `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &InverseEdge) -> String {
    format!(
        "{} -> {}{}{}",
        rules.entities[p.source].name,
        rules.entities[p.target].name,
        super::when(&p.when),
        if p.copy.is_empty() {
            String::new()
        } else {
            format!(": {}", super::pairs(&p.copy))
        }
    )
}

/// An inverse edge keeps whole items, its reverse items, whose
/// membership counters may record themselves on.
impl Kind for InverseEdge {
    fn kind_name(&self) -> &'static str {
        "inverse-edge"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        vec![self.source]
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        vec![pattern(self.source), pattern(self.target)]
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.rules, at.id, self, at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, _rules: &Rules, _name: &str) -> Option<String> {
        None
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Items {
            entity: self.target,
            copy: copied(self),
        }
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        Some((self.source, self.target))
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        None
    }

    fn expectation(&self) -> Expectation {
        Expectation::Memberships
    }

    fn pruning(&self, _name: &str) -> Pruning {
        Pruning::DeleteItems {
            entity: self.target,
            copy: copied(self),
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}

/// The attributes it copies onto its reverse items.
fn copied(p: &InverseEdge) -> Vec<String> {
    p.copy.iter().map(|(attr, _)| attr.clone()).collect()
}
