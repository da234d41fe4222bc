//! `index-keys`: derived attributes (usually GSI keys) on the changed item.
//!
//! ```toml
//! [[projections]]
//! name = "email-gsi1-keys"
//! kind = "index-keys"
//! entity = "email"
//! set = { GSI1PK = "EMAIL#{lower(trim(email))}", GSI1SK = "USER#{userId}" }
//! ```
//!
//! The planner plans the attributes' values, on condition that the item
//! still holds what they were derived from (`plan.rs`).

mod plan;

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Expectation, Kind, Planning, Projection, Pruning, Recompute, Rules, Writes};
use crate::effect::{Effect, PlanProblem};
use crate::schema::{Compiler, Entity, EntityId, TableSpec, Template};
pub(crate) use plan::plan;

/// The `[[projections]]` section of `kind = "index-keys"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIndexKeys {
    /// Projection name, unique in the spec.
    pub name: String,
    /// The entity whose items get the attributes.
    pub entity: String,
    /// Attribute name to template.
    pub set: BTreeMap<String, String>,
}

/// Derive attributes on the changed item itself (GSI keys).
#[derive(Debug, Clone)]
pub struct IndexKeys {
    /// The entity whose items get the attributes.
    pub entity: EntityId,
    /// Attribute to template.
    pub set: Vec<(String, Template)>,
    /// Item attributes (not key variables) the templates read.
    pub reads: Vec<String>,
}

/// Compiles a raw `index-keys`; problems go to `cx`.
pub(crate) fn compile(
    raw: &RawIndexKeys,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<IndexKeys> {
    let entity = cx.entity(context, "", &raw.entity, entities)?;
    if raw.set.is_empty() {
        cx.error(
            context,
            "`set` is empty: name at least one attribute to derive",
        );
        return None;
    }
    let set = cx.templates(context, "set", &raw.set, table)?;
    let key_vars: HashSet<&str> = entities[entity].vars().collect();
    let mut reads = Vec::new();
    for (attr, template) in &set {
        for name in template.names() {
            if set.iter().any(|(a, _)| a == name) {
                cx.error(
                    context,
                    format!("`{attr}` = `{template}` reads `{name}`, which this projection writes: every write would change its own input and loop"),
                );
            } else if !key_vars.contains(name) && !reads.iter().any(|r| r == name) {
                reads.push(name.to_string());
            }
        }
    }
    Some(IndexKeys { entity, set, reads })
}

/// One line for `check`, `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &IndexKeys) -> String {
    format!(
        "{}: {}",
        rules.entities[p.entity].name,
        super::pairs(&p.set)
    )
}

/// Index keys write attributes on the changed item itself.
impl Kind for IndexKeys {
    fn kind_name(&self) -> &'static str {
        "index-keys"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        vec![self.entity]
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        vec![pattern(self.entity)]
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.id, self, at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String> {
        Some(format!(
            "index-keys `{name}`: the projector's own writes of the derived attributes come back as MODIFY records of `{}`, which pass and write nothing",
            rules.entities[self.entity].name
        ))
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Attributes {
            entity: self.entity,
            set: self.set.iter().map(|(attr, _)| attr.clone()).collect(),
            own: Vec::new(),
        }
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        None
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        None
    }

    fn expectation(&self) -> Expectation {
        Expectation::OnChangedItem(self.entity)
    }

    fn pruning(&self, _name: &str) -> Pruning {
        Pruning::Strip {
            entity: self.entity,
            attributes: self.set.iter().map(|(attr, _)| attr.clone()).collect(),
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}
