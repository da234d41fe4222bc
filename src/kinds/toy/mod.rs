//! `toy`: a kind that exists only in tests, to prove that a kind is one
//! folder plus its registration in `kinds/mod.rs`. It sets one attribute
//! on the changed item from a template.
//!
//! ```toml
//! [[projections]]
//! name = "profile-tag"
//! kind = "toy"
//! entity = "profile"
//! attribute = "tag"
//! value = "T#{name}"
//! ```

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Expectation, Kind, Planning, Projection, Pruning, Recompute, Rules, Writes};
use crate::effect::{Effect, Op, PlanProblem};
use crate::record::{AttributeValue, ChangeKind, ValueRef};
use crate::schema::{Compiler, Entity, EntityId, TableSpec, Template};

/// The `[[projections]]` section of `kind = "toy"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToy {
    /// Projection name.
    pub name: String,
    /// The entity whose items get the attribute.
    pub entity: String,
    /// The attribute set.
    pub attribute: String,
    /// Its value, a template over the item.
    pub value: String,
}

/// A compiled `toy`.
#[derive(Debug, Clone)]
pub struct Toy {
    /// The entity whose items get the attribute.
    pub entity: EntityId,
    /// The attribute set.
    pub attribute: String,
    /// Its value.
    pub value: Template,
    /// Item attributes (not key variables) the value reads.
    pub reads: Vec<String>,
}

/// Compiles a raw `toy`; problems go to `cx`.
pub(crate) fn compile(
    raw: &RawToy,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<Toy> {
    let entity = cx.entity(context, "", &raw.entity, entities)?;
    let set = BTreeMap::from([(raw.attribute.clone(), raw.value.clone())]);
    let (attribute, value) = cx.templates(context, "value", &set, table)?.pop()?;
    let key_vars: HashSet<&str> = entities[entity].vars().collect();
    let reads = value
        .names()
        .filter(|name| !key_vars.contains(name))
        .map(str::to_string)
        .collect();
    Some(Toy {
        entity,
        attribute,
        value,
        reads,
    })
}

impl Kind for Toy {
    fn kind_name(&self) -> &'static str {
        "toy"
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
        let subject = at.subject;
        if subject.record.kind == ChangeKind::Remove {
            return Ok(());
        }
        let image = subject.new_image(subject.record.view_type)?;
        let value = self.value.render(&subject.vars, Some(image))?;
        if matches!(image.get(&self.attribute), Some(ValueRef::S(have)) if have == value) {
            return Ok(());
        }
        let expect = self
            .reads
            .iter()
            .filter_map(|name| image.get(name).map(|v| (name.clone(), v.to_value())))
            .collect();
        effects.push(Effect {
            projection: at.id,
            op: Op::SetAttributes {
                key: subject.key.clone(),
                set: vec![(self.attribute.clone(), AttributeValue::S(value))],
                expect,
            },
        });
        Ok(())
    }

    fn describe(&self, rules: &Rules) -> String {
        format!(
            "{}: {} = {}",
            rules.entities[self.entity].name, self.attribute, self.value
        )
    }

    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String> {
        Some(format!(
            "toy `{name}`: its own writes come back as MODIFY records of `{}`, which pass and write nothing",
            rules.entities[self.entity].name
        ))
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Attributes {
            entity: self.entity,
            set: vec![self.attribute.clone()],
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
            attributes: vec![self.attribute.clone()],
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}
