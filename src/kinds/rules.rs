//! [`Rules`]: what the kinds plan, compute and describe against.

use super::{Kind, Projection};
use crate::dynamo::names::RESERVED_PREFIX;
use crate::schema::{fingerprint, Bindings, Entity, EntityId, ProjectionId, TableSpec};

/// The compiled rules of a spec: its table, entities and projections,
/// and what the kinds need to know of them. A [`crate::spec::Spec`] holds
/// them (with who registered what, the invariants and the spec as
/// written) and derefs to them.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The table.
    pub table: TableSpec,
    /// Entity types.
    pub entities: Vec<Entity>,
    /// Projections in planning order.
    pub projections: Vec<Projection>,
    /// For each entity, the projections that plan on its records.
    interested: Vec<Vec<ProjectionId>>,
    /// Counter storages readers read that no projection of this spec keeps
    /// current (a changed counter's old version that could not be kept,
    /// see `control::Registry::layout`): their records stay on the items
    /// as they are, and nothing moves their shards, until the switch.
    pub frozen: Vec<String>,
}

impl Rules {
    /// The rules of compiled `projections` over `entities` of `table`.
    pub fn new(table: TableSpec, entities: Vec<Entity>, projections: Vec<Projection>) -> Rules {
        let interested = interested(&projections, &entities);
        Rules {
            table,
            entities,
            projections,
            interested,
            frozen: Vec::new(),
        }
    }

    /// The entity with this name.
    pub fn entity_id(&self, name: &str) -> Option<EntityId> {
        self.entities.iter().position(|e| e.name == name)
    }

    /// The projection with this name.
    pub fn projection_id(&self, name: &str) -> Option<ProjectionId> {
        self.projections.iter().position(|p| p.name == name)
    }

    /// The projections that plan on records of `entity`.
    pub fn interested(&self, entity: EntityId) -> &[ProjectionId] {
        &self.interested[entity]
    }

    /// Finds the entity whose patterns match a key, binding its variables.
    ///
    /// Keys under [`RESERVED_PREFIX`] never match.
    pub fn match_entity<'a>(
        &'a self,
        pk: &'a str,
        sk: Option<&'a str>,
        out: &mut Bindings<'a>,
    ) -> Option<EntityId> {
        if pk.starts_with(RESERVED_PREFIX) {
            return None;
        }
        for (id, entity) in self.entities.iter().enumerate() {
            out.clear();
            if !entity.pk.match_into(pk, out) {
                continue;
            }
            let sk_ok = match (&entity.sk, sk) {
                (Some(pattern), Some(sk)) => pattern.match_into(sk, out),
                (None, None) => true,
                _ => false,
            };
            if sk_ok {
                return Some(id);
            }
        }
        out.clear();
        None
    }

    /// The name counter `id`'s shards, own markers and records carry (its
    /// projection name for any other kind).
    pub fn storage(&self, id: ProjectionId) -> &str {
        match self.counter(id) {
            Some(c) => &c.storage,
            None => &self.projections[id].name,
        }
    }

    /// What projection `id`'s kind answers (see [`Kind`]).
    pub(crate) fn kind(&self, id: ProjectionId) -> &dyn Kind {
        self.projections[id].kind.dispatch()
    }

    /// Every projection a backfill of the whole spec brings to its
    /// definition: all but counters' old versions.
    pub fn backfilled_projections(&self) -> Vec<ProjectionId> {
        (0..self.projections.len())
            .filter(|&id| !self.is_old_version(id))
            .collect()
    }

    /// A fingerprint of every projection's definition: two specs whose
    /// projections are alike have the same one.
    pub fn projections_fingerprint(&self) -> u64 {
        let all: Vec<String> = self
            .projections
            .iter()
            .enumerate()
            .map(|(id, p)| match self.counter(id) {
                Some(c) if c.storage != p.name => {
                    format!("{}={:016x}@{}", p.name, p.fingerprint, c.storage)
                }
                _ => format!("{}={:016x}", p.name, p.fingerprint),
            })
            .collect();
        fingerprint(&all.join(","))
    }
}

/// For each entity, the projections that plan on its records.
fn interested(projections: &[Projection], entities: &[Entity]) -> Vec<Vec<ProjectionId>> {
    let mut out = vec![Vec::new(); entities.len()];
    for (id, projection) in projections.iter().enumerate() {
        for entity in projection.kind.dispatch().planned_on(entities) {
            if !out[entity].contains(&id) {
                out[entity].push(id);
            }
        }
    }
    out
}
