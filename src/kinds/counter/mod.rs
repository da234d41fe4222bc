//! `counter`: a write-sharded count of the source items per instance of
//! its `of` variables.
//!
//! ```toml
//! [[projections]]
//! name = "followers"
//! kind = "counter"
//! source = "follow"              # USER#{followerId} / FOLLOWS#{followeeId}
//! of = { userId = "{followeeId}" }
//! shards = 8
//! ```
//!
//! Each counted item's membership is recorded on a marker item: the
//! reverse edge of an inverse edge over the same source and condition, or
//! a marker of its own (`plan.rs`, with what it shares with inverse edges
//! in `kinds/membership.rs`). A changed counter is rebuilt beside the one
//! readers read, in the next generation of its storage names (below).

mod plan;

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{
    Expectation, Kind, Planning, Projection, ProjectionKind, Pruning, Recompute, Rules, Writes,
};
use crate::dynamo::names::COUNTER_MARKER_PREFIX;
use crate::effect::{Effect, PlanProblem};
use crate::record::ItemKey;
use crate::schema::raw::RawCondition;
use crate::schema::{Compiler, Condition, Entity, EntityId, ProjectionId, TableSpec, Template};
pub(crate) use plan::plan;

/// The `[[projections]]` section of `kind = "counter"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCounter {
    /// Counter name (`followers`), used by `counter get`.
    pub name: String,
    /// The counted entity.
    pub source: String,
    /// The counter's own variables, from the source's key variables
    /// (`{ userId = "{followeeId}" }`).
    pub of: BTreeMap<String, String>,
    /// Only source items for which this holds are counted.
    #[serde(default)]
    pub when: RawCondition,
    /// Number of shards (1 to 100); hot targets want more.
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// Where the counter's shards and records live: set by the tool,
    /// never by hand. A changed counter is rebuilt beside the version
    /// readers read, in the next generation `<name>~N` (see
    /// `control::Registry::layout`); absent means `<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
}

fn default_shards() -> u32 {
    4
}

/// The largest shard count a counter may declare.
pub const MAX_SHARDS: u32 = 100;

/// Where generation `generation` of counter `name` keeps its shards,
/// own markers and records: `name` (generation 0), then `name~1`,
/// `name~2`... A changed counter is built in the generation after the
/// one readers read, so a generation is never written again once readers
/// left it: what prunes it never races what builds the next one.
pub fn counter_storage(name: &str, generation: u32) -> String {
    if generation == 0 {
        name.to_string()
    } else {
        format!("{name}~{generation}")
    }
}

/// The name of counter `name`'s old version of generation `generation`,
/// which the worker keeps current while the changed counter is rebuilt
/// beside it (`followers~0`); user names cannot contain `~`.
pub fn old_version_name(name: &str, generation: u32) -> String {
    format!("{name}~{generation}")
}

/// The counter and generation an old version's name stands for
/// (`followers~0`: `followers`, 0).
pub fn old_version_of(name: &str) -> Option<(&str, u32)> {
    let (base, generation) = name.rsplit_once('~')?;
    (!base.is_empty() && !base.contains('~') && generation.bytes().all(|b| b.is_ascii_digit()))
        .then(|| generation.parse().ok().map(|g| (base, g)))
        .flatten()
}

/// The generation a counter's storage name is (`followers~2`: 2), given
/// its projection name: a counter's any generation, an old version's only
/// its own.
pub fn storage_generation(name: &str, storage: &str) -> Option<u32> {
    if let Some((base, generation)) = old_version_of(name) {
        return (storage == counter_storage(base, generation)).then_some(generation);
    }
    if storage == name {
        return Some(0);
    }
    let generation = storage.strip_prefix(name)?.strip_prefix('~')?;
    if generation.starts_with('0') || !generation.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    generation.parse().ok()
}

/// How a counter knows whether a source item is already counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The reverse edge of this inverse-edge projection marks membership.
    Edge(ProjectionId),
    /// A marker item of its own under the reserved prefix.
    Own,
}

/// A write-sharded count of source items.
#[derive(Debug, Clone)]
pub struct Counter {
    /// Counted entity.
    pub source: EntityId,
    /// Counter variable to template over the source's key variables.
    pub of: Vec<(String, Template)>,
    /// Which source items count.
    pub when: Condition,
    /// Number of shards.
    pub shards: u32,
    /// How membership is recorded.
    pub marker: Marker,
    /// The name its shard keys, own markers and records carry: the
    /// projection's name, or `<name>~N` once a changed definition was
    /// rebuilt beside the one readers read ([`counter_storage`]).
    pub storage: String,
}

/// Compiles a raw `counter`; problems go to `cx`. Its marker is its own
/// until the cross-projection checks find an edge it rides on.
pub(crate) fn compile(
    raw: &RawCounter,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<Counter> {
    let source = cx.entity(context, "source", &raw.source, entities)?;
    if raw.name.contains('#') {
        cx.error(
            context,
            "a counter's name must not contain `#`: it separates the parts of its shard and marker keys",
        );
        return None;
    }
    let name = &raw.name;
    let storage = raw.storage.clone().unwrap_or_else(|| name.clone());
    if storage_generation(name, &storage).is_none() {
        cx.error(
            context,
            format!("`storage = \"{storage}\"` is not one of this counter's: the tool sets it (to `{name}` or `{name}~N`); remove it from the file"),
        );
        return None;
    }
    if !(1..=MAX_SHARDS).contains(&raw.shards) {
        cx.error(
            context,
            format!(
                "shards = {} is out of range: use 1 to {MAX_SHARDS}",
                raw.shards
            ),
        );
    }
    let when = cx.condition(context, &raw.when);
    let of = cx.templates(context, "of", &raw.of, table)?;
    let key_vars: HashSet<&str> = entities[source].vars().collect();
    for (name, template) in &of {
        for read in template.names() {
            if !key_vars.contains(read) {
                cx.error(
                    context,
                    format!(
                        "`of.{name}` = `{template}` reads `{read}`, which is not a key variable of `{}` (it has: {}); a counter's target must come from the source key so that removals find it",
                        entities[source].name,
                        entities[source].vars().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
    }
    if !(1..=MAX_SHARDS).contains(&raw.shards) {
        return None;
    }
    Some(Counter {
        source,
        of,
        when,
        shards: raw.shards,
        marker: Marker::Own,
        storage,
    })
}

/// One line for `check`, `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &Counter) -> String {
    format!(
        "count {}{} of {} in {} shards{}",
        rules.entities[p.source].name,
        super::when(&p.when),
        super::pairs(&p.of),
        p.shards,
        match p.marker {
            Marker::Edge(edge) => format!(", marked by {}", rules.projections[edge].name),
            Marker::Own => String::new(),
        }
    )
}

/// A counter writes its own items: shards apart from every entity, and
/// its records on the reverse items of the edge it rides on (or on
/// markers of its own), in transactions.
impl Kind for Counter {
    fn kind_name(&self) -> &'static str {
        "counter"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        vec![self.source]
    }

    fn fingerprint_parts(
        &self,
        projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        let mut parts = vec![pattern(self.source)];
        match self.marker {
            Marker::Edge(edge) => {
                parts.push(format!("rides on {}", projections[edge].name));
                if let ProjectionKind::InverseEdge(e) = &projections[edge].kind {
                    parts.push(pattern(e.target));
                }
            }
            Marker::Own => parts.push("own markers".to_string()),
        }
        parts
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.rules, at.id, self, at.subject, at.selection, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, _rules: &Rules, _name: &str) -> Option<String> {
        None
    }

    fn writes(&self, _name: &str) -> Writes {
        Writes::Own
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        None
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        None
    }

    fn expectation(&self) -> Expectation {
        Expectation::Memberships
    }

    fn pruning(&self, _name: &str) -> Pruning {
        Pruning::Storage(self.storage.clone())
    }

    fn transactional(&self) -> bool {
        true
    }
}

/// What the rules answer about counters: their shard and marker keys,
/// the versions of a counter rebuilt beside the one readers read.
impl Rules {
    /// Projection `id`, if it is a counter.
    pub fn counter(&self, id: ProjectionId) -> Option<&Counter> {
        match &self.projections[id].kind {
            ProjectionKind::Counter(counter) => Some(counter),
            _ => None,
        }
    }

    /// Every counter: its id, projection and definition.
    pub fn counters(&self) -> impl Iterator<Item = (ProjectionId, &Projection, &Counter)> {
        self.projections
            .iter()
            .enumerate()
            .filter_map(|(id, p)| match &p.kind {
                ProjectionKind::Counter(counter) => Some((id, p, counter)),
                _ => None,
            })
    }

    /// The key of a counter shard item.
    pub fn counter_shard_key(&self, counter: &str, of_values: &[String], shard: u32) -> ItemKey {
        let mut pk = String::with_capacity(32);
        pk.push_str("COUNTER#");
        pk.push_str(counter);
        for value in of_values {
            pk.push('#');
            pk.push_str(value);
        }
        pk.push('#');
        pk.push_str(&shard.to_string());
        ItemKey {
            pk,
            sk: self.table.sort_key.as_ref().map(|_| "COUNTER".to_string()),
        }
    }

    /// The key of a counter's own membership marker for a source item.
    pub fn counter_marker_key(&self, counter: &str, source: &ItemKey) -> ItemKey {
        ItemKey {
            pk: format!("{COUNTER_MARKER_PREFIX}{counter}#{}", source.pk),
            sk: source.sk.clone(),
        }
    }

    /// The counter whose own marker `key` is, and the source item it marks
    /// (a source key of the counter's entity).
    pub fn parse_counter_marker(&self, key: &ItemKey) -> Option<(ProjectionId, ItemKey)> {
        let rest = key.pk.strip_prefix(COUNTER_MARKER_PREFIX)?;
        self.projections
            .iter()
            .enumerate()
            .find_map(|(id, projection)| {
                let ProjectionKind::Counter(counter) = &projection.kind else {
                    return None;
                };
                let source_pk = rest
                    .strip_prefix(counter.storage.as_str())?
                    .strip_prefix('#')?;
                let mut vars = Vec::new();
                let entity = self.match_entity(source_pk, key.sk.as_deref(), &mut vars)?;
                (entity == counter.source).then(|| {
                    (
                        id,
                        ItemKey {
                            pk: source_pk.to_string(),
                            sk: key.sk.clone(),
                        },
                    )
                })
            })
    }

    /// Whether projection `id` is a counter's old version, which the worker
    /// keeps current while the changed counter is rebuilt: never claimed,
    /// backfilled or replayed on its own.
    pub fn is_old_version(&self, id: ProjectionId) -> bool {
        matches!(self.projections[id].kind, ProjectionKind::Counter(_))
            && old_version_of(&self.projections[id].name).is_some()
    }

    /// Whether counter `id` is rebuilt in this layout: readers read another
    /// version (kept current beside it, or frozen) until its backfill
    /// completes.
    pub fn rebuilding(&self, id: ProjectionId) -> bool {
        let name = &self.projections[id].name;
        self.old_version(id).is_some()
            || self
                .frozen
                .iter()
                .any(|storage| storage_generation(name, storage).is_some())
    }

    /// The old version of counter `id` kept beside it, if any.
    pub fn old_version(&self, id: ProjectionId) -> Option<ProjectionId> {
        let name = &self.projections[id].name;
        self.projections.iter().position(|p| {
            matches!(p.kind, ProjectionKind::Counter(_))
                && old_version_of(&p.name).is_some_and(|(base, _)| base == name)
        })
    }

    /// The counter whose records and shards carry `storage`.
    pub fn counter_by_storage(&self, storage: &str) -> Option<ProjectionId> {
        self.projections
            .iter()
            .position(|p| matches!(&p.kind, ProjectionKind::Counter(c) if c.storage == storage))
    }

    /// The counter projection named `name`, if the spec has one.
    pub fn counter_id(&self, name: &str) -> Option<ProjectionId> {
        self.projection_id(name)
            .filter(|&id| matches!(self.projections[id].kind, ProjectionKind::Counter(_)))
    }

    /// The item that records whether `source` (an item of the counter's
    /// entity, its key variables bound in `vars`) is counted in `counter`:
    /// the reverse edge the counter rides on, or its own marker.
    pub fn placement(
        &self,
        counter: ProjectionId,
        source: &ItemKey,
        vars: &[(&str, &str)],
    ) -> ItemKey {
        let ProjectionKind::Counter(c) = &self.projections[counter].kind else {
            panic!("placement of a projection that is not a counter");
        };
        match c.marker {
            Marker::Edge(edge) => {
                let ProjectionKind::InverseEdge(e) = &self.projections[edge].kind else {
                    unreachable!("counters ride on inverse edges only");
                };
                self.entities[e.target]
                    .render_key(vars)
                    .expect("inverse-edge variables are checked when the spec is compiled")
            }
            Marker::Own => self.counter_marker_key(&c.storage, source),
        }
    }

    /// The key of a counter shard item from its partition key.
    pub fn shard_item(&self, shard_pk: &str) -> ItemKey {
        ItemKey {
            pk: shard_pk.to_string(),
            sk: self.table.sort_key.as_ref().map(|_| "COUNTER".to_string()),
        }
    }
}
