//! `custom`: a projection written in Rust, registered with
//! [`crate::spec::SpecBuilder::custom`].

use std::fmt;
use std::sync::Arc;

use super::{
    Expectation, Kind, Planning, Projection, ProjectionKind, Pruning, Recompute, Rules, Writes,
};
use crate::effect::{CustomOp, Effect, Op, PlanProblem, SourceGuard, Subject};
use crate::record::ChangeRecord;
use crate::schema::{fingerprint, suggest, Compiler, Entity, EntityId, ProjectionId};

/// A projection written in Rust, registered with
/// `crate::spec::SpecBuilder::custom`.
///
/// It plans plain idempotent writes (put or delete a derived item) for
/// records of its source entity, and must be pure like the built-in kinds.
pub trait CustomProjection: Send + Sync + fmt::Debug {
    /// Unique projection name.
    fn name(&self) -> &str;
    /// The entity whose records it plans on.
    fn source_entity(&self) -> &str;
    /// Plans the writes for one change; an `Err` dead-letters the record.
    fn plan(&self, change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String>;
    /// The version of what it derives: change it whenever the code derives
    /// something else, so that the lifecycle registry sees a new definition
    /// (`status` then asks for a backfill). Its fingerprint covers only the
    /// name, the source entity and this.
    fn version(&self) -> u32 {
        0
    }
}

/// What a custom projection sees of a change.
#[derive(Debug)]
pub struct EntityChange<'a> {
    /// The record.
    pub record: &'a ChangeRecord,
    /// The key variables its entity pattern bound.
    pub vars: &'a [(&'a str, &'a str)],
}

impl EntityChange<'_> {
    /// The value key variable `name` bound (`userId` of `USER#{userId}`).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// Compiles a projection written in Rust: its source entity must be one
/// of the spec's. Its definition is its code, so its name, source entity
/// and version stand for it in its fingerprint.
pub(crate) fn compile(
    projection: Arc<dyn CustomProjection>,
    cx: &mut Compiler,
    context: &str,
    entities: &[Entity],
) -> Option<Projection> {
    let name = projection.name().to_string();
    if !entities
        .iter()
        .any(|e| e.name == projection.source_entity())
    {
        let hint = suggest(
            projection.source_entity(),
            entities.iter().map(|e| e.name.as_str()),
        );
        cx.error(
            context,
            format!("unknown entity `{}`{hint}", projection.source_entity()),
        );
        return None;
    }
    let fingerprint = fingerprint(&format!(
        "custom\u{1}{name}\u{1}{}\u{1}{}",
        projection.source_entity(),
        projection.version()
    ));
    Some(Projection {
        name,
        kind: ProjectionKind::Custom(projection),
        fingerprint,
    })
}

/// Plans projection `id`'s writes for one change of its source entity.
pub(crate) fn plan(
    id: ProjectionId,
    projection: &dyn CustomProjection,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let change = EntityChange {
        record: subject.record,
        vars: &subject.vars,
    };
    let ops = projection.plan(&change).map_err(PlanProblem::Custom)?;
    let guard = subject.guarded.then(|| whole_state(subject)).flatten();
    effects.extend(ops.into_iter().map(|op| Effect {
        projection: id,
        op: Op::Custom {
            op,
            guard: guard.clone(),
        },
    }));
    Ok(())
}

/// The most attributes a custom projection's guard compares: a condition
/// expression holds at most 4 KB. A source item with more is written
/// unguarded (logged), as every custom write was before guards.
const MAX_GUARDED_ATTRIBUTES: usize = 100;

/// The guard of a custom projection's writes: the whole item as the record
/// shows it (what its code reads is its own), or its absence.
fn whole_state(subject: &Subject<'_>) -> Option<SourceGuard> {
    let seen = match subject.record.current_image() {
        None if subject.record.kind == crate::record::ChangeKind::Remove => None,
        // Without a new image, only that the item exists.
        None => Some(Vec::new()),
        Some(image) => {
            if image.len() > MAX_GUARDED_ATTRIBUTES {
                tracing::warn!(
                    item = %subject.key,
                    attributes = image.len(),
                    "a custom projection's source item has more attributes than a guard can compare: its writes go unguarded"
                );
                return None;
            }
            Some(
                image
                    .iter()
                    .map(|(name, value)| (name.to_string(), Some(value.to_value())))
                    .collect(),
            )
        }
    };
    Some(SourceGuard {
        source: subject.key.clone(),
        seen,
    })
}

/// One line for `check`, `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &dyn CustomProjection) -> String {
    format!("{} (Rust)", entity_name_or(rules, p.source_entity()))
}

fn entity_name_or<'a>(rules: &'a Rules, name: &'a str) -> &'a str {
    rules
        .entity_id(name)
        .map(|id| rules.entities[id].name.as_str())
        .unwrap_or(name)
}

/// A projection written in Rust answers through its code: it plans, and
/// what it writes is its own business.
impl Kind for Arc<dyn CustomProjection> {
    fn kind_name(&self) -> &'static str {
        "custom"
    }

    fn planned_on(&self, entities: &[Entity]) -> Vec<EntityId> {
        entities
            .iter()
            .position(|e| e.name == self.source_entity())
            .into_iter()
            .collect()
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        _pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        // Its name, source entity and version stand for it (`compile`).
        Vec::new()
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.id, self.as_ref(), at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self.as_ref())
    }

    fn filter_note(&self, _rules: &Rules, _name: &str) -> Option<String> {
        None
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Anything
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        None
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        None
    }

    fn expectation(&self) -> Expectation {
        Expectation::Nothing
    }

    fn pruning(&self, name: &str) -> Pruning {
        Pruning::Refuse(format!(
            "`{name}` is a projection written in Rust: what it derived is its code's to remove"
        ))
    }

    fn transactional(&self) -> bool {
        false
    }
}

/// The projections of the rules written in Rust (re-attached to a spec
/// laid out anew from its text).
impl Rules {
    /// Every projection written in Rust.
    pub fn custom_projections(&self) -> Vec<Arc<dyn CustomProjection>> {
        self.projections
            .iter()
            .filter_map(|p| match &p.kind {
                ProjectionKind::Custom(custom) => Some(custom.clone()),
                _ => None,
            })
            .collect()
    }
}
