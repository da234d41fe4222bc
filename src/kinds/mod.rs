//! Projection kinds, each in its own folder (`index_keys/`,
//! `denormalize/`, `inverse_edge/`, `counter/`, `rollup/`, `aggregate/`,
//! `custom/`), and their registration here: the raw section of a spec
//! file ([`RawProjection`]), what a compiled projection does
//! ([`ProjectionKind`], [`Projection`]), and the [`Rules`] every kind
//! plans, computes and describes against.
//!
//! Code outside `kinds/` never matches a kind: it asks the `Kind` trait
//! (through `ProjectionKind::dispatch`, the one match over every kind)
//! and runs the mechanism the answer names ([`Writes`], [`Expectation`],
//! [`Pruning`], `Recompute`). Adding a kind is a folder that implements
//! `Kind`, plus its registration here: a variant of [`RawProjection`]
//! and of [`ProjectionKind`], and their arms in the matches below.
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
#[cfg(test)]
mod toy;

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
    /// A kind for tests only (see `kinds/toy/`).
    #[cfg(test)]
    Toy(toy::RawToy),
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
            #[cfg(test)]
            RawProjection::Toy(p) => &p.name,
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
            RawProjection::Rollup(raw) => {
                rollup::compile(raw, cx, context, table, entities, all).map(ProjectionKind::Rollup)
            }
            RawProjection::Aggregate(raw) => {
                aggregate::compile(raw, cx, context, table, entities).map(ProjectionKind::Aggregate)
            }
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
            #[cfg(test)]
            RawProjection::Toy(raw) => {
                toy::compile(raw, cx, context, table, entities).map(ProjectionKind::Toy)
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
            #[cfg(test)]
            RawProjection::Toy(_) => "toy",
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
    /// See [`rollup::Rollup`].
    Rollup(rollup::Rollup),
    /// See [`aggregate::Aggregate`].
    Aggregate(aggregate::Aggregate),
    /// A projection written in Rust.
    Custom(Arc<dyn CustomProjection>),
    /// A kind for tests only (see `kinds/toy/`).
    #[cfg(test)]
    Toy(toy::Toy),
}

impl fmt::Debug for ProjectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProjectionKind::IndexKeys(p) => p.fmt(f),
            ProjectionKind::Denormalize(p) => p.fmt(f),
            ProjectionKind::InverseEdge(p) => p.fmt(f),
            ProjectionKind::Counter(p) => p.fmt(f),
            ProjectionKind::Rollup(p) => p.fmt(f),
            ProjectionKind::Aggregate(p) => p.fmt(f),
            ProjectionKind::Custom(p) => write!(f, "Custom({})", p.name()),
            #[cfg(test)]
            ProjectionKind::Toy(p) => p.fmt(f),
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
        self.kind.dispatch().kind_name()
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

/// What a projection is to the planner's driver: projection `id`, a
/// record of `entity` (its key and bindings in `subject`), in a run that
/// plans `selection`.
pub(crate) struct Planning<'a> {
    /// The rules planned against.
    pub rules: &'a Rules,
    /// The projection planned.
    pub id: ProjectionId,
    /// The entity of the record.
    pub entity: EntityId,
    /// The record, its key and its bindings.
    pub subject: &'a Subject<'a>,
    /// The projections this run plans (`None`: all).
    pub selection: Selection<'a>,
}

/// The one dispatch: every question the crate asks of a projection kind,
/// answered in the kind's folder. No question has a default, so a new
/// kind's folder is made to answer each one (the compiler lists them).
pub(crate) trait Kind {
    /// The kind as written in spec files (`kind = "..."`).
    fn kind_name(&self) -> &'static str;

    /// The entities whose records it plans on (of `entities`, the spec's),
    /// in order: what [`Rules::interested`] and the Lambda filters follow.
    fn planned_on(&self, entities: &[Entity]) -> Vec<EntityId>;

    /// What its fingerprint covers beyond its own text (the key patterns
    /// of the entities it reads and writes, each rendered by `pattern`;
    /// for a counter, the edge it rides on), `projections` as compiled.
    fn fingerprint_parts(
        &self,
        projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String>;

    /// Plans a record (see [`Planning`]).
    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem>;

    /// One line for `check`, `status` and `plan --describe`.
    fn describe(&self, rules: &Rules) -> String;

    /// What `filters` tells a person about the records of the projector's
    /// own writes that its filter lets through (`None`: none pass).
    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String>;

    /// What projection `name` of this kind writes, and onto whose items.
    fn writes(&self, name: &str) -> Writes;

    /// The entity whose changes it carries onto the items of another, for
    /// the loop check (`projections` as compiled so far).
    fn carries(&self, projections: &[Projection]) -> Option<(EntityId, EntityId)>;

    /// Its recompute, if it is a recomputed kind.
    fn recompute(&self) -> Option<&dyn Recompute>;

    /// What the audit checks of it.
    fn expectation(&self) -> Expectation;

    /// What `prune` deletes of projection `name` once it is retired.
    fn pruning(&self, name: &str) -> Pruning;

    /// Whether it writes in transactions (a global table's replication
    /// does not keep them whole across regions).
    fn transactional(&self) -> bool;
}

/// The recompute of a recomputed kind (`denormalize`, `rollup`,
/// `aggregate`): read the target and what it is computed from,
/// consistently, and write the result on condition that the target is
/// unchanged.
pub(crate) trait Recompute {
    /// The entity whose items it writes on.
    fn target(&self) -> EntityId;

    /// The entity whose items in the target's partition it reads with a
    /// query, if it reads with one.
    fn queried(&self) -> Option<EntityId>;

    /// What it computes for a target from what its recompute read.
    fn compute(&self, rules: &Rules, reads: &[Item]) -> Result<TargetState, String>;

    /// The recompute of `target`, if it is an item of its target entity.
    fn op(&self, rules: &Rules, target: &ItemKey) -> Option<Op>;

    /// Whether its writes are ordered by a token kept on the target.
    fn uses_token(&self) -> bool;

    /// The version of what its recompute read, if what it reads carries
    /// one that only grows (a counter's shards count their moves): the
    /// token it writes, so that an equal result read from newer sources
    /// still moves the token, and a result computed from the very sources
    /// the target records is known current without a second read.
    fn version(&self, _rules: &Rules, _reads: &[Item]) -> Option<AttributeValue> {
        None
    }
}

/// What a projection writes, and onto whose items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writes {
    /// Attributes on items of `entity`, items writers write too: another
    /// projection keeping those items leaves them alone, `prune` strips
    /// them, and a global table refuses them without the writers in the
    /// home region.
    Attributes {
        /// The entity.
        entity: EntityId,
        /// The attributes it derives (no other projection may write them).
        set: Vec<String>,
        /// What it keeps there for itself besides (a recompute's token).
        own: Vec<String>,
    },
    /// Whole items of `entity` (reverse items), which only it keeps, with
    /// the attributes it copies onto them.
    Items {
        /// The entity.
        entity: EntityId,
        /// The copied attributes.
        copy: Vec<String>,
    },
    /// Items of its own, apart from every entity (a counter's shards).
    Own,
    /// Whatever its code chooses (a projection written in Rust).
    Anything,
}

/// What the audit checks of a projection: a mechanism the audit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// Every item of `entity` carries what planning it alone sets on it
    /// (`index-keys`): each `SetAttributes` such a plan still has is a
    /// finding, and its repair.
    OnChangedItem(EntityId),
    /// Every item of its recompute's target holds what the recompute
    /// computes from the sources it reads now; a wrong target absent of
    /// everything it computes is `missing` when `absent_is_missing`
    /// (else stale).
    Recomputed {
        /// How an absent value is reported.
        absent_is_missing: bool,
    },
    /// Memberships: each item planned as a backfill plans it, the markers
    /// and records the plan names checked against the table (reverse
    /// edges, counter markers and records); a plan error is a finding.
    Memberships,
    /// Nothing the audit can check (a projection written in Rust).
    Nothing,
}

/// What `prune` does with a retired projection: a mechanism prune runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pruning {
    /// Remove `attributes` from the items of `entity` (but those the
    /// current spec derives there).
    Strip {
        /// The entity.
        entity: EntityId,
        /// The attributes.
        attributes: Vec<String>,
    },
    /// Delete its items of `entity` (reverse items), or only strip `copy`
    /// from those the current spec keeps too.
    DeleteItems {
        /// The entity.
        entity: EntityId,
        /// The attributes copied onto them.
        copy: Vec<String>,
    },
    /// Delete what a counter stored under this name: its shards, own
    /// markers, and its records on other items.
    Storage(String),
    /// It cannot be pruned: why.
    Refuse(String),
}

impl ProjectionKind {
    /// The kind's answers: the one match over every kind, but for the
    /// registration's own.
    pub(crate) fn dispatch(&self) -> &dyn Kind {
        match self {
            ProjectionKind::IndexKeys(p) => p,
            ProjectionKind::Denormalize(p) => p,
            ProjectionKind::InverseEdge(p) => p,
            ProjectionKind::Counter(p) => p,
            ProjectionKind::Rollup(p) => p,
            ProjectionKind::Aggregate(p) => p,
            ProjectionKind::Custom(p) => p,
            #[cfg(test)]
            ProjectionKind::Toy(p) => p,
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
                .counters()
                .filter(move |(_, _, c)| shard.starts_with(&format!("COUNTER#{}#", c.storage)))
                .map(move |(id, _, _)| (id, shard.clone()))
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
    match rules.kind(id).recompute() {
        Some(recompute) => recompute.compute(rules, reads),
        None => Err(format!(
            "`{}` is a {}, which is not recomputed",
            rules.projections[id].name,
            rules.projections[id].kind_name()
        )),
    }
}

/// The version of the sources projection `id`'s recompute read, if its
/// kind keeps one as its token (see [`Recompute::version`]).
pub fn version(rules: &Rules, id: ProjectionId, reads: &[Item]) -> Option<AttributeValue> {
    rules.kind(id).recompute()?.version(rules, reads)
}

/// Whether projection `id`'s recomputes order their writes by a token.
pub fn uses_token(rules: &Rules, id: ProjectionId) -> bool {
    rules.kind(id).recompute().is_some_and(|r| r.uses_token())
}

/// The recompute of target `target` of projection `id`, if it is a
/// recomputed kind and `target` an item of its target entity.
pub fn recompute_op(rules: &Rules, id: ProjectionId, target: &ItemKey) -> Option<Op> {
    rules.kind(id).recompute()?.op(rules, target)
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
pub(crate) fn query_recompute(
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
    let Some(recompute) = rules.kind(id).recompute() else {
        return items;
    };
    let (Some(source), target_entity) = (recompute.queried(), recompute.target()) else {
        return items;
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
    match rules.kind(id).writes(&rules.projections[id].name) {
        Writes::Attributes { entity, set, own } => {
            Some((entity, set.into_iter().chain(own).collect()))
        }
        Writes::Items { .. } | Writes::Own | Writes::Anything => None,
    }
}
