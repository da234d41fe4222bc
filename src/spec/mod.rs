//! Spec files: one per service, compiled once into a validated rule set.
//!
//! A spec goes from text to [`raw::RawSpec`] (serde, mirrors the file) to
//! [`Spec`] (templates parsed, names resolved, loops ruled out). Every
//! problem found is reported at once, each naming the file, the part of the
//! spec and what to change. See `projections/*.toml` for the format.

pub mod builder;
mod compile;
mod describe;
pub mod raw;
pub mod set;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

pub use crate::dynamo::names::{COUNTER_MARKER_PREFIX, RECORDS_ATTRIBUTE, RESERVED_PREFIX};
use crate::plan::CustomProjection;
use crate::record::ItemKey;
use crate::schema::fingerprint;
pub use crate::schema::{
    template, values_equal, Bindings, Condition, Entity, EntityId, Gsi, KeyPattern, ProjectionId,
    RenderError, SpecError, SpecErrors, TableSpec, Template, TemplateError,
};
pub use builder::SpecBuilder;
use raw::RawSpec;
pub use set::{Services, SpecSet};

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
    /// The kinds kept whole in their own folder (see [`crate::kinds`]).
    Recomputed(crate::kinds::Recomputed),
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

/// What the worker may do on its own when a count invariant is broken by
/// too many items satisfying its condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairPolicy {
    /// Keep the item that most recently came to satisfy the condition (by
    /// stream order) and make the others stop satisfying it.
    KeepLatest,
}

impl RepairPolicy {
    /// The policy as written in spec files.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairPolicy::KeepLatest => "keep-latest",
        }
    }
}

/// What an invariant requires.
#[derive(Debug, Clone)]
pub enum InvariantKind {
    /// Per partition: exactly one (`exactly`) or at most one item of the
    /// entity satisfies `when`. `exactly` only applies to partitions that
    /// hold items of the entity at all.
    Count {
        /// The counted condition.
        when: Condition,
        /// Exactly one (true) or at most one (false).
        exactly: bool,
        /// Declared repair policy, if any.
        repair: Option<RepairPolicy>,
    },
    /// Every item satisfying `premise` satisfies `then`.
    Implies {
        /// The premise.
        premise: Condition,
        /// The consequence.
        then: Condition,
    },
    /// The value of `attribute` (a GSI partition key derived by
    /// `projection`) is carried by items of one partition only.
    Unique {
        /// The GSI queried.
        index: String,
        /// The GSI's partition key attribute.
        attribute: String,
        /// The index-keys projection deriving it.
        projection: ProjectionId,
        /// Its template.
        template: Template,
    },
}

/// A compiled invariant over the items of one entity.
#[derive(Debug, Clone)]
pub struct Invariant {
    /// Unique name.
    pub name: String,
    /// The entity whose items it constrains.
    pub entity: EntityId,
    /// What it requires.
    pub kind: InvariantKind,
}

impl Invariant {
    /// The kind as written in spec files.
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            InvariantKind::Count { exactly: true, .. } => "exactly-one",
            InvariantKind::Count { exactly: false, .. } => "at-most-one",
            InvariantKind::Implies { .. } => "implies",
            InvariantKind::Unique { .. } => "unique",
        }
    }

    /// Whether it is checked per partition (count and implies) rather than
    /// per derived value (unique).
    pub fn is_partition_scoped(&self) -> bool {
        !matches!(self.kind, InvariantKind::Unique { .. })
    }
}

/// A compiled, validated spec: the rule set the planner runs.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Where it was loaded from (for messages).
    pub file: String,
    /// The owning service.
    pub service: String,
    /// The table.
    pub table: TableSpec,
    /// Entity types.
    pub entities: Vec<Entity>,
    /// Projections in planning order.
    pub projections: Vec<Projection>,
    /// Invariants, checked after each batch and by `audit`.
    pub invariants: Vec<Invariant>,
    /// For each entity, the projections that plan on its records.
    interested: Vec<Vec<ProjectionId>>,
    /// The spec as written (without projections written in Rust): the
    /// lifecycle registry keeps it, so that a retired projection can still
    /// be pruned once no spec file has it.
    pub raw: RawSpec,
    /// Counter storages readers read that no projection of this spec keeps
    /// current (a changed counter's old version that could not be kept,
    /// see `control::Registry::layout`): their records stay on the items
    /// as they are, and nothing moves their shards, until the switch.
    pub frozen: Vec<String>,
    /// The service (and file) that registered each projection and
    /// invariant: several when specs of one table were composed
    /// ([`SpecSet`]).
    pub services: Services,
}

impl Spec {
    /// Loads and compiles a spec file.
    pub fn from_file(path: &Path) -> Result<Spec, SpecErrors> {
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| {
            SpecErrors(vec![SpecError {
                file: label.clone(),
                context: String::new(),
                problem: format!("cannot read the spec file: {error}"),
            }])
        })?;
        Spec::from_toml(&text, &label)
    }

    /// Parses and compiles spec text; `label` names it in errors.
    pub fn from_toml(text: &str, label: &str) -> Result<Spec, SpecErrors> {
        let raw: RawSpec = toml::from_str(text).map_err(|error| {
            SpecErrors(vec![SpecError {
                file: label.to_string(),
                context: String::new(),
                problem: format!("invalid spec TOML: {}", error.to_string().trim_end()),
            }])
        })?;
        Spec::compile(raw, label, Vec::new())
    }

    /// Compiles a raw spec plus projections written in Rust.
    pub fn compile(
        raw: RawSpec,
        label: &str,
        custom: Vec<Arc<dyn CustomProjection>>,
    ) -> Result<Spec, SpecErrors> {
        let kept = raw.clone();
        let mut spec = compile::compile(raw, label, custom, None)?;
        spec.raw = kept;
        Ok(spec)
    }

    /// Compiles a spec composed of several services' specs (see
    /// [`SpecSet`]), `services` saying who registered what.
    pub fn compile_composed(
        raw: RawSpec,
        label: &str,
        custom: Vec<Arc<dyn CustomProjection>>,
        services: Services,
    ) -> Result<Spec, SpecErrors> {
        if !services.is_composite() {
            return Spec::compile(raw, label, custom);
        }
        let kept = raw.clone();
        let mut spec = compile::compile(raw, label, custom, Some(services))?;
        spec.raw = kept;
        Ok(spec)
    }

    /// The service that registered projection or invariant `name`.
    pub fn service_of(&self, name: &str) -> &str {
        self.services.of(name).unwrap_or(&self.service)
    }

    /// The entity with this name.
    pub fn entity_id(&self, name: &str) -> Option<EntityId> {
        self.entities.iter().position(|e| e.name == name)
    }

    /// The projection with this name.
    pub fn projection_id(&self, name: &str) -> Option<ProjectionId> {
        self.projections.iter().position(|p| p.name == name)
    }

    /// The invariant with this name.
    pub fn invariant_id(&self, name: &str) -> Option<usize> {
        self.invariants.iter().position(|i| i.name == name)
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

    /// The name counter `id`'s shards, own markers and records carry (its
    /// projection name for any other kind).
    pub fn storage(&self, id: ProjectionId) -> &str {
        match &self.projections[id].kind {
            ProjectionKind::Counter(c) => &c.storage,
            ProjectionKind::IndexKeys(_)
            | ProjectionKind::Denormalize(_)
            | ProjectionKind::InverseEdge(_)
            | ProjectionKind::Recomputed(_)
            | ProjectionKind::Custom(_) => &self.projections[id].name,
        }
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

    /// Every projection a backfill of the whole spec brings to its
    /// definition: all but counters' old versions.
    pub fn backfilled_projections(&self) -> Vec<ProjectionId> {
        (0..self.projections.len())
            .filter(|&id| !self.is_old_version(id))
            .collect()
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

impl Spec {
    /// A fingerprint of every projection's definition: two specs whose
    /// projections are alike have the same one.
    pub fn projections_fingerprint(&self) -> u64 {
        let all: Vec<String> = self
            .projections
            .iter()
            .map(|p| match &p.kind {
                ProjectionKind::Counter(c) if c.storage != p.name => {
                    format!("{}={:016x}@{}", p.name, p.fingerprint, c.storage)
                }
                ProjectionKind::IndexKeys(_)
                | ProjectionKind::Denormalize(_)
                | ProjectionKind::InverseEdge(_)
                | ProjectionKind::Counter(_)
                | ProjectionKind::Recomputed(_)
                | ProjectionKind::Custom(_) => format!("{}={:016x}", p.name, p.fingerprint),
            })
            .collect();
        fingerprint(&all.join(","))
    }
}
