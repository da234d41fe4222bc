//! Projection kinds, each in its own folder (`index_keys/`,
//! `denormalize/`, `inverse_edge/`, `counter/`, `rollup/`, `aggregate/`,
//! `custom/`), and their registration here: the raw section of a spec
//! file ([`RawProjection`]), what a compiled projection does
//! ([`ProjectionKind`], [`Projection`]), and the [`Rules`] every kind
//! plans, computes and describes against.
//!
//! [`rollup`] and [`aggregate`] are *recomputed* kinds, like
//! `denormalize`: the planner never plans a value, only "read the target
//! and what it is computed from, consistently, and write the result on
//! condition that the target is unchanged". What is compared is a token
//! the projector keeps on the target ([`token_attribute`]), which only
//! grows between writer rewrites, so a stalled recompute can never land on
//! a target that moved on and came back to the value it read.

pub mod aggregate;
pub(crate) mod checks;
pub mod counter;
pub mod custom;
pub mod denormalize;
pub mod index_keys;
pub mod inverse_edge;
pub(crate) mod membership;
pub mod rollup;
mod rules;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::effect::{Effect, Op, PlanProblem, SourceQuery, Sources, Subject};
use crate::record::{AttributeValue, Item, ItemKey};
use crate::schema::{
    Bindings, Compiler, Condition, Entity, EntityId, ProjectionId, TableSpec, Template,
};
use counter::Counter;
use custom::CustomProjection;
use denormalize::Denormalize;
use index_keys::IndexKeys;
use inverse_edge::InverseEdge;
pub use rules::Rules;

/// One `[[projections]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RawProjection {
    /// Derive attributes (usually GSI keys) on the changed item itself.
    IndexKeys(index_keys::RawIndexKeys),
    /// Copy attributes from a source item onto a target item while a condition holds.
    Denormalize(denormalize::RawDenormalize),
    /// Maintain the reverse item of a relationship.
    InverseEdge(inverse_edge::RawInverseEdge),
    /// A write-sharded count of the source items per target.
    Counter(counter::RawCounter),
    /// A counter's total kept on an item (see [`crate::kinds::rollup`]).
    Rollup(rollup::RawRollup),
    /// Totals over a partition's items (see [`crate::kinds::aggregate`]).
    Aggregate(aggregate::RawAggregate),
}

impl RawProjection {
    /// The projection's name.
    pub fn name(&self) -> &str {
        match self {
            RawProjection::IndexKeys(p) => &p.name,
            RawProjection::Denormalize(p) => &p.name,
            RawProjection::InverseEdge(p) => &p.name,
            RawProjection::Counter(p) => &p.name,
            RawProjection::Rollup(p) => &p.name,
            RawProjection::Aggregate(p) => &p.name,
        }
    }

    /// Compiles it alone, problems to `cx`; `all` are the spec's raw
    /// projections (a rollup names its counter by its position there).
    /// What holds across projections is checked once all are compiled.
    pub(crate) fn compile(
        &self,
        cx: &mut Compiler,
        context: &str,
        table: &TableSpec,
        entities: &[Entity],
        all: &[RawProjection],
    ) -> Option<ProjectionKind> {
        match self {
            RawProjection::Rollup(raw) => rollup::compile(raw, cx, context, table, entities, all)
                .map(|p| ProjectionKind::Recomputed(Recomputed::Rollup(p))),
            RawProjection::Aggregate(raw) => aggregate::compile(raw, cx, context, table, entities)
                .map(|p| ProjectionKind::Recomputed(Recomputed::Aggregate(p))),
            RawProjection::IndexKeys(raw) => index_keys::compile(raw, cx, context, table, entities)
                .map(ProjectionKind::IndexKeys),
            RawProjection::Denormalize(raw) => {
                denormalize::compile(raw, cx, context, table, entities)
                    .map(ProjectionKind::Denormalize)
            }
            RawProjection::InverseEdge(raw) => {
                inverse_edge::compile(raw, cx, context, table, entities)
                    .map(ProjectionKind::InverseEdge)
            }
            RawProjection::Counter(raw) => {
                counter::compile(raw, cx, context, table, entities).map(ProjectionKind::Counter)
            }
        }
    }

    /// What its fingerprint covers: a counter's definition without where
    /// it is stored, and an old version (`followers~0`, kept current while
    /// the changed counter is rebuilt) as the counter it was.
    pub fn definition(&self) -> RawProjection {
        let mut copy = self.clone();
        if let RawProjection::Counter(counter) = &mut copy {
            if counter.storage.is_some() {
                if let Some((base, _)) = counter::old_version_of(&counter.name) {
                    counter.name = base.to_string();
                }
            }
            counter.storage = None;
        }
        copy
    }

    /// The kind as written in the file.
    pub fn kind(&self) -> &'static str {
        match self {
            RawProjection::IndexKeys(_) => "index-keys",
            RawProjection::Denormalize(_) => "denormalize",
            RawProjection::InverseEdge(_) => "inverse-edge",
            RawProjection::Counter(_) => "counter",
            RawProjection::Rollup(_) => "rollup",
            RawProjection::Aggregate(_) => "aggregate",
        }
    }
}

/// Which projections to plan (`None`: all). Used by backfill and redrive.
pub type Selection<'a> = Option<&'a [ProjectionId]>;

/// What a projection does.
#[derive(Clone)]
pub enum ProjectionKind {
    /// See [`IndexKeys`].
    IndexKeys(IndexKeys),
    /// See [`Denormalize`].
    Denormalize(Denormalize),
    /// See [`InverseEdge`].
    InverseEdge(InverseEdge),
    /// See [`Counter`].
    Counter(Counter),
    /// The recomputed kinds kept whole in their own folder ([`Recomputed`]).
    Recomputed(Recomputed),
    /// A projection written in Rust.
    Custom(Arc<dyn CustomProjection>),
}

impl fmt::Debug for ProjectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProjectionKind::IndexKeys(p) => p.fmt(f),
            ProjectionKind::Denormalize(p) => p.fmt(f),
            ProjectionKind::InverseEdge(p) => p.fmt(f),
            ProjectionKind::Counter(p) => p.fmt(f),
            ProjectionKind::Recomputed(p) => p.fmt(f),
            ProjectionKind::Custom(p) => write!(f, "Custom({})", p.name()),
        }
    }
}

/// A compiled projection.
#[derive(Debug, Clone)]
pub struct Projection {
    /// Unique name.
    pub name: String,
    /// What it does.
    pub kind: ProjectionKind,
    /// A stable hash of the definition (FNV-1a of its canonical JSON, the
    /// key patterns of the entities it uses, the table's keys, a counter's
    /// placement): another definition under the same name has another one.
    pub fingerprint: u64,
}

impl Projection {
    /// The kind as written in spec files.
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            ProjectionKind::IndexKeys(_) => "index-keys",
            ProjectionKind::Denormalize(_) => "denormalize",
            ProjectionKind::InverseEdge(_) => "inverse-edge",
            ProjectionKind::Counter(_) => "counter",
            ProjectionKind::Recomputed(p) => p.kind_name(),
            ProjectionKind::Custom(_) => "custom",
        }
    }
}

/// `attr = template, ...`, for descriptions.
pub(crate) fn pairs(list: &[(String, Template)]) -> String {
    list.iter()
        .map(|(k, t)| format!("{k} = {t}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// ` when attr = value and ...` (nothing for an empty condition), for
/// descriptions.
pub(crate) fn when(c: &Condition) -> String {
    if c.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> =
            c.0.iter()
                .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
                .collect();
        format!(" when {}", parts.join(" and "))
    }
}

/// The source attributes a copy over `source` reads (its condition's and
/// its templates' that are not key variables).
pub(crate) fn reads_of(
    when: &Condition,
    copy: &[(String, Template)],
    source: &Entity,
) -> Vec<String> {
    let key_vars: HashSet<&str> = source.vars().collect();
    let mut reads: Vec<String> = when.0.iter().map(|(name, _)| name.clone()).collect();
    for (_, template) in copy {
        for name in template.names() {
            if !key_vars.contains(name) && !reads.iter().any(|r| r == name) {
                reads.push(name.to_string());
            }
        }
    }
    reads
}

/// The recomputed kinds: one variant per kind, the line that registers
/// it. Code outside the folder matches `ProjectionKind::Recomputed` once
/// and calls the methods below, whose matches name every kind here, so a
/// new variant makes the compiler list exactly what it must answer, all
/// in this file.
#[derive(Debug, Clone)]
pub enum Recomputed {
    /// See [`rollup`].
    Rollup(rollup::Rollup),
    /// See [`aggregate`].
    Aggregate(aggregate::Aggregate),
}

impl Recomputed {
    /// The kind as written in spec files.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Recomputed::Rollup(_) => "rollup",
            Recomputed::Aggregate(_) => "aggregate",
        }
    }

    /// The entity whose items it writes on.
    pub fn target(&self) -> EntityId {
        match self {
            Recomputed::Rollup(p) => p.target,
            Recomputed::Aggregate(p) => p.target,
        }
    }

    /// The entities whose records it plans from (the ones its filters must
    /// let through and its fingerprint names the key patterns of).
    pub fn entities(&self) -> Vec<EntityId> {
        match self {
            // The counted items' records reach it through its counter.
            Recomputed::Rollup(p) => vec![p.target],
            Recomputed::Aggregate(p) => vec![p.source, p.target],
        }
    }

    /// The entity whose changes it carries onto its target, for the loop
    /// check (`projections` as compiled so far).
    pub fn reads_from(&self, projections: &[Projection]) -> Option<EntityId> {
        match self {
            Recomputed::Rollup(p) => match projections.get(p.counter).map(|c| &c.kind) {
                Some(ProjectionKind::Counter(c)) => Some(c.source),
                _ => None,
            },
            Recomputed::Aggregate(p) => Some(p.source),
        }
    }

    /// The entity whose items in the target's partition it reads with a
    /// query, if it reads with one.
    pub fn queried(&self) -> Option<EntityId> {
        match self {
            Recomputed::Rollup(_) => None,
            Recomputed::Aggregate(p) => Some(p.source),
        }
    }

    /// The attributes it sets on its target (the token aside).
    pub fn attributes(&self) -> Vec<String> {
        match self {
            Recomputed::Rollup(p) => vec![p.attribute.clone()],
            Recomputed::Aggregate(p) => p.set.iter().map(|(a, _)| a.clone()).collect(),
        }
    }

    /// The attributes it writes on its target, the token included.
    pub fn written(&self, name: &str) -> Vec<String> {
        match self {
            Recomputed::Rollup(p) => rollup::written(name, p),
            Recomputed::Aggregate(p) => aggregate::written(name, p),
        }
    }

    /// Plans projection `id` for a record of `entity`.
    pub(crate) fn plan(
        &self,
        rules: &Rules,
        id: ProjectionId,
        entity: EntityId,
        subject: &Subject<'_>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), PlanProblem> {
        match self {
            Recomputed::Rollup(p) => rollup::plan(rules, id, p, subject, effects),
            Recomputed::Aggregate(p) => aggregate::plan(rules, id, p, entity, subject, effects),
        }
    }

    /// What it computes for a target from what its recompute read.
    pub fn compute(&self, rules: &Rules, reads: &[Item]) -> Result<TargetState, String> {
        match self {
            Recomputed::Rollup(p) => rollup::compute(rules, p, reads),
            Recomputed::Aggregate(p) => aggregate::compute(rules, p, reads),
        }
    }

    /// The recompute of `target`, if it is an item of its target entity.
    pub fn recompute_op(&self, rules: &Rules, target: &ItemKey) -> Option<Op> {
        match self {
            Recomputed::Rollup(p) => rollup::recompute_op(rules, p, target),
            Recomputed::Aggregate(p) => query_recompute(rules, p.source, p.target, target),
        }
    }

    /// One line for `check`, `plan --describe` and `status`.
    pub(crate) fn describe(&self, rules: &Rules) -> String {
        match self {
            Recomputed::Rollup(p) => rollup::describe(rules, p),
            Recomputed::Aggregate(p) => aggregate::describe(rules, p),
        }
    }

    /// What `filters` tells a person about the records it makes pass.
    pub(crate) fn filter_note(&self, rules: &Rules, name: &str) -> String {
        match self {
            Recomputed::Rollup(p) => rollup::filter_note(rules, name, p),
            Recomputed::Aggregate(p) => aggregate::filter_note(rules, name, p),
        }
    }
}

pub use crate::dynamo::names::token_attribute;

/// Hooks a kind kept here may need beyond its own projection; each names
/// the kinds that use it.
///
/// Once every projection is compiled: fingerprints that depend on another
/// projection's definition (a rollup's on its counter's).
pub(crate) fn settle(projections: &mut [Projection]) {
    rollup::settle(projections);
}

/// After a record's effects are planned: the effects that follow from
/// other projections' effects (a rollup's recompute after its counter's
/// shards move).
pub(crate) fn follow(rules: &Rules, effects: &mut Vec<Effect>) {
    rollup::follow_counters(rules, effects);
}

/// The effects that follow counter shards (partition keys) set by hand
/// (`audit --repair`'s recount): their rollups' recomputes.
pub(crate) fn after_recount(rules: &Rules, shards: &[String]) -> Vec<Effect> {
    let moved: Vec<(ProjectionId, String)> = shards
        .iter()
        .flat_map(|shard| {
            rules
                .projections
                .iter()
                .enumerate()
                .filter(move |(_, p)| match &p.kind {
                    ProjectionKind::Counter(c) => {
                        shard.starts_with(&format!("COUNTER#{}#", c.storage))
                    }
                    _ => false,
                })
                .map(move |(id, _)| (id, shard.clone()))
        })
        .collect();
    rollup::following(rules, &moved)
}

/// `ids` with the projections that are claimed, backfilled and completed
/// together with them (a rollup and its counter).
pub fn with_dependencies(rules: &Rules, ids: &[ProjectionId]) -> Vec<ProjectionId> {
    rollup::with_counters(rules, ids, false)
}

/// `ids` with the projections completed together with them: as
/// [`with_dependencies`], but a projection whose dependency is rebuilt in
/// this layout completes after it, in a backfill of its own (a rollup
/// of a rebuilt counter).
pub fn completed_with(rules: &Rules, ids: &[ProjectionId]) -> Vec<ProjectionId> {
    rollup::with_counters(rules, ids, true)
}

/// Of `ids`, the projections a backfill brings only after another's
/// backfill completed, each with the one it waits for.
pub fn after_rebuilds(rules: &Rules, ids: &[ProjectionId]) -> Vec<(ProjectionId, ProjectionId)> {
    rollup::after_rebuilds(rules, ids)
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
            lost || crate::effect::changed(record, written.into_iter().chain([token]))
        }
        ChangeKind::Remove => false,
    }
}

/// Attributes to set (`Some`) or remove (`None`) on a target.
pub type TargetState = Vec<(String, Option<AttributeValue>)>;

/// What projection `id` computes for its target from what its recompute
/// read (`reads`: the source items of its query, or a counter's shards).
/// An `Err` is a dead letter's reason.
pub fn compute(rules: &Rules, id: ProjectionId, reads: &[Item]) -> Result<TargetState, String> {
    match &rules.projections[id].kind {
        ProjectionKind::Denormalize(p) => {
            denormalize::compute_denormalized(rules, p, reads).map_err(|error| error.to_string())
        }
        ProjectionKind::Recomputed(p) => p.compute(rules, reads),
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => Err(format!(
            "`{}` is a {}, which is not recomputed",
            rules.projections[id].name,
            rules.projections[id].kind_name()
        )),
    }
}

/// Whether projection `id`'s recomputes order their writes by a token.
pub fn uses_token(rules: &Rules, id: ProjectionId) -> bool {
    match &rules.projections[id].kind {
        ProjectionKind::Recomputed(_) => true,
        ProjectionKind::Denormalize(_)
        | ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => false,
    }
}

/// The recompute of target `target` of projection `id`, if it is a
/// recomputed kind and `target` an item of its target entity.
pub fn recompute_op(rules: &Rules, id: ProjectionId, target: &ItemKey) -> Option<Op> {
    match &rules.projections[id].kind {
        ProjectionKind::Denormalize(p) => query_recompute(rules, p.source, p.target, target),
        ProjectionKind::Recomputed(p) => p.recompute_op(rules, target),
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => None,
    }
}

/// The key variables `key` binds, if it is an item of `entity`.
pub(crate) fn key_vars<'a>(entity: &'a Entity, key: &'a ItemKey) -> Option<Bindings<'a>> {
    let mut vars = Vec::new();
    if !entity.pk.match_into(&key.pk, &mut vars) {
        return None;
    }
    if let (Some(pattern), Some(sk)) = (&entity.sk, key.sk.as_deref()) {
        if !pattern.match_into(sk, &mut vars) {
            return None;
        }
    }
    Some(vars)
}

/// The recompute of `target`, an item of `target_entity` computed from
/// the items of `source` in the partition its key names.
fn query_recompute(
    rules: &Rules,
    source: EntityId,
    target_entity: EntityId,
    target: &ItemKey,
) -> Option<Op> {
    let vars = key_vars(&rules.entities[target_entity], target)?;
    Some(Op::Recompute {
        target: target.clone(),
        sources: Sources::Query(source_query(&rules.entities[source], &vars)?),
    })
}

/// Of the items a recompute of `target` read with its query, those that
/// belong to it: a target whose key binds a variable of the source's sort
/// key (`PERF#{region}#{date}` totalled onto `REGION#{region}`) shares
/// its partition with other targets' sources.
pub(crate) fn of_target(
    rules: &Rules,
    id: ProjectionId,
    target: &ItemKey,
    items: Vec<Item>,
) -> Vec<Item> {
    let (source, target_entity) = match &rules.projections[id].kind {
        ProjectionKind::Denormalize(p) => (p.source, p.target),
        ProjectionKind::Recomputed(p) => match p.queried() {
            Some(source) => (source, p.target()),
            None => return items,
        },
        ProjectionKind::IndexKeys(_)
        | ProjectionKind::InverseEdge(_)
        | ProjectionKind::Counter(_)
        | ProjectionKind::Custom(_) => return items,
    };
    let Some(wanted) = key_vars(&rules.entities[target_entity], target) else {
        return items;
    };
    let agrees = |item: &Item| match bind(rules, &rules.entities[source], item) {
        Some(vars) => vars
            .iter()
            .all(|(name, value)| wanted.iter().all(|(n, v)| n != name || v == value)),
        // Not a source item: the kind leaves it out itself.
        None => true,
    };
    if items.iter().all(agrees) {
        return items;
    }
    items.into_iter().filter(|item| agrees(item)).collect()
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
    rules: &'a Rules,
    entity: &'a Entity,
    item: &'a Item,
) -> Option<Bindings<'a>> {
    let Some(AttributeValue::S(pk)) = item.get(&rules.table.partition_key) else {
        return None;
    };
    let mut vars = Vec::new();
    if !entity.pk.match_into(pk, &mut vars) {
        return None;
    }
    let sk = match &rules.table.sort_key {
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
pub fn written_attributes(rules: &Rules, id: ProjectionId) -> Option<(EntityId, Vec<String>)> {
    let names = |set: &[(String, Template)]| set.iter().map(|(a, _)| a.clone()).collect();
    let name = &rules.projections[id].name;
    match &rules.projections[id].kind {
        ProjectionKind::IndexKeys(p) => Some((p.entity, names(&p.set))),
        ProjectionKind::Denormalize(p) => Some((p.target, names(&p.copy))),
        ProjectionKind::Recomputed(p) => Some((p.target(), p.written(name))),
        ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_) | ProjectionKind::Custom(_) => {
            None
        }
    }
}
