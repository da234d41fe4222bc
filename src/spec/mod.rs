//! Spec files: one per service, compiled once into a validated rule set.
//!
//! A spec goes from text to [`raw::RawSpec`] (serde, mirrors the file) to
//! [`Spec`] (templates parsed, names resolved, loops ruled out). Every
//! problem found is reported at once, each naming the file, the part of the
//! spec and what to change. See `projections/*.toml` for the format.

pub mod builder;
pub mod raw;
pub mod template;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::plan::CustomProjection;
use crate::record::{AttributeValue, Attributes, Item, ItemKey, ValueRef};
pub use builder::SpecBuilder;
use raw::{RawCondition, RawInvariant, RawProjection, RawSpec};
pub use template::{Bindings, KeyPattern, RenderError, Template, TemplateError};

/// Keys starting with this prefix belong to the projector itself (dead
/// letters, checkpoints, counter markers); they never match an entity.
pub const RESERVED_PREFIX: &str = "_ddbp#";

/// The largest shard count a counter may declare.
pub const MAX_SHARDS: u32 = 100;

/// Counter records: on the item that marks a source item's membership, the
/// map attribute `_ddbp#c` maps each counter that counts the source to the
/// partition key of the shard it is counted in.
pub const RECORDS_ATTRIBUTE: &str = "_ddbp#c";

/// The partition key prefix of counters' own marker items.
pub const COUNTER_MARKER_PREFIX: &str = "_ddbp#count#";

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

/// Index of an entity in [`Spec::entities`].
pub type EntityId = usize;
/// Index of a projection in [`Spec::projections`].
pub type ProjectionId = usize;

/// One problem in a spec; [`SpecErrors`] carries all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The file (or label) the spec came from.
    pub file: String,
    /// Which part: `table`, `entity `email``, `projection `followers``.
    pub context: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}: {}", self.file, self.problem)
        } else {
            write!(f, "{}: {}: {}", self.file, self.context, self.problem)
        }
    }
}

/// Every problem found while loading or compiling a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        if n > 1 {
            write!(f, "\n({n} problems)")?;
        }
        Ok(())
    }
}

/// The table a spec describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Default table name.
    pub name: String,
    /// Partition key attribute.
    pub partition_key: String,
    /// Sort key attribute, if the table has one.
    pub sort_key: Option<String>,
    /// TTL attribute, if any.
    pub ttl_attribute: Option<String>,
    /// Global secondary indexes.
    pub gsis: Vec<Gsi>,
}

/// A global secondary index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsi {
    /// Index name.
    pub name: String,
    /// Partition key attribute.
    pub partition_key: String,
    /// Sort key attribute.
    pub sort_key: Option<String>,
}

impl TableSpec {
    /// The DynamoDB key of `key` in this table, as an item.
    pub fn key_item(&self, key: &ItemKey) -> Item {
        let mut item = Item::default();
        item.insert(
            self.partition_key.clone(),
            AttributeValue::S(key.pk.clone()),
        );
        if let (Some(name), Some(sk)) = (&self.sort_key, &key.sk) {
            item.insert(name.clone(), AttributeValue::S(sk.clone()));
        }
        item
    }

    /// The string key of an item or key map, if its key attributes are strings.
    pub fn item_key<A: Attributes + ?Sized>(&self, item: &A) -> Option<ItemKey> {
        let pk = item.attribute(&self.partition_key)?.as_str()?.to_string();
        let sk = match &self.sort_key {
            Some(name) => Some(item.attribute(name)?.as_str()?.to_string()),
            None => None,
        };
        Some(ItemKey { pk, sk })
    }

    /// Whether `name` is one of the table's key attributes.
    pub fn is_key_attribute(&self, name: &str) -> bool {
        name == self.partition_key || self.sort_key.as_deref() == Some(name)
    }

    /// The key attributes of `item`, whatever its value type (an SDK
    /// item's key converts safely even when other attributes would not).
    pub fn key_attributes<V: Clone>(&self, item: &HashMap<String, V>) -> HashMap<String, V> {
        item.iter()
            .filter(|(name, _)| self.is_key_attribute(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

/// A named entity type, identified by its key patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// Entity name (`email`).
    pub name: String,
    /// Partition key pattern.
    pub pk: KeyPattern,
    /// Sort key pattern (tables with a sort key).
    pub sk: Option<KeyPattern>,
}

impl Entity {
    /// All key variables, partition key first.
    pub fn vars(&self) -> impl Iterator<Item = &str> {
        self.pk
            .vars()
            .iter()
            .chain(self.sk.iter().flat_map(|sk| sk.vars()))
            .map(String::as_str)
    }

    /// Renders this entity's key from bound variables.
    pub fn render_key(&self, bindings: &[(&str, &str)]) -> Option<ItemKey> {
        Some(ItemKey {
            pk: self.pk.render(bindings)?,
            sk: match &self.sk {
                Some(sk) => Some(sk.render(bindings)?),
                None => None,
            },
        })
    }
}

/// A condition: each attribute equals a value (all must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition(pub Vec<(String, AttributeValue)>);

impl Condition {
    /// Whether the item satisfies the condition (`None` never does).
    pub fn holds<A: Attributes + ?Sized>(&self, item: Option<&A>) -> bool {
        let Some(item) = item else { return false };
        self.0
            .iter()
            .all(|(name, want)| item.attribute(name).is_some_and(|have| have.equals(want)))
    }

    /// Whether the condition is empty (always holds for existing items).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Equality as DynamoDB sees it: numbers compare by value.
pub fn values_equal(a: &AttributeValue, b: &AttributeValue) -> bool {
    ValueRef::from(a).equals(b)
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
        match self.kind {
            ProjectionKind::IndexKeys(_) => "index-keys",
            ProjectionKind::Denormalize(_) => "denormalize",
            ProjectionKind::InverseEdge(_) => "inverse-edge",
            ProjectionKind::Counter(_) => "counter",
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
    /// see `lifecycle::Registry::layout`): their records stay on the items
    /// as they are, and nothing moves their shards, until the switch.
    pub frozen: Vec<String>,
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
        let mut spec = Compiler::new(label).compile(raw, custom)?;
        spec.raw = kept;
        Ok(spec)
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
            _ => &self.projections[id].name,
        }
    }

    /// Whether projection `id` is a counter's old version, which the worker
    /// keeps current while the changed counter is rebuilt: never claimed,
    /// backfilled or replayed on its own.
    pub fn is_old_version(&self, id: ProjectionId) -> bool {
        matches!(self.projections[id].kind, ProjectionKind::Counter(_))
            && old_version_of(&self.projections[id].name).is_some()
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

    /// A short multi-line summary for `check`.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let t = &self.table;
        out.push_str(&format!(
            "service {} - table {} (PK {}{})\n",
            self.service,
            t.name,
            t.partition_key,
            t.sort_key
                .as_ref()
                .map(|s| format!(", SK {s}"))
                .unwrap_or_default()
        ));
        for gsi in &t.gsis {
            out.push_str(&format!(
                "  index {} ({}{})\n",
                gsi.name,
                gsi.partition_key,
                gsi.sort_key
                    .as_ref()
                    .map(|s| format!(", {s}"))
                    .unwrap_or_default()
            ));
        }
        if let Some(ttl) = &t.ttl_attribute {
            out.push_str(&format!("  ttl attribute {ttl}\n"));
        }
        out.push_str(&format!("{} entities\n", self.entities.len()));
        for entity in &self.entities {
            out.push_str(&format!(
                "  {:<16} {} / {}\n",
                entity.name,
                entity.pk,
                entity.sk.as_ref().map(|s| s.as_str()).unwrap_or("-")
            ));
        }
        out.push_str(&format!("{} projections\n", self.projections.len()));
        for projection in &self.projections {
            out.push_str(&format!(
                "  {:<28} {:<13} {}\n",
                projection.name,
                projection.kind_name(),
                self.describe(projection)
            ));
        }
        if !self.invariants.is_empty() {
            out.push_str(&format!("{} invariants\n", self.invariants.len()));
            for invariant in &self.invariants {
                out.push_str(&format!(
                    "  {:<28} {:<13} {}\n",
                    invariant.name,
                    invariant.kind_name(),
                    self.describe_invariant(invariant)
                ));
            }
        }
        out
    }

    /// One line saying what an invariant requires.
    pub fn describe_invariant(&self, invariant: &Invariant) -> String {
        let entity = &self.entities[invariant.entity].name;
        let cond = |c: &Condition| {
            c.0.iter()
                .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        match &invariant.kind {
            InvariantKind::Count {
                when,
                exactly,
                repair,
            } => format!(
                "{} `{entity}` per partition with {}{}",
                if *exactly {
                    "exactly one"
                } else {
                    "at most one"
                },
                cond(when),
                repair
                    .map(|r| format!(" (repair: {})", r.as_str()))
                    .unwrap_or_default()
            ),
            InvariantKind::Implies { premise, then } => {
                format!("`{entity}` with {} has {}", cond(premise), cond(then))
            }
            InvariantKind::Unique {
                index,
                attribute,
                template,
                ..
            } => format!("`{entity}` {attribute} = {template} in {index} has one owner"),
        }
    }

    fn describe(&self, projection: &Projection) -> String {
        let entity = |id: EntityId| self.entities[id].name.as_str();
        let pairs = |list: &[(String, Template)]| {
            list.iter()
                .map(|(k, t)| format!("{k} = {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let when = |c: &Condition| {
            if c.is_empty() {
                String::new()
            } else {
                let parts: Vec<String> =
                    c.0.iter()
                        .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
                        .collect();
                format!(" when {}", parts.join(" and "))
            }
        };
        match &projection.kind {
            ProjectionKind::IndexKeys(p) => format!("{}: {}", entity(p.entity), pairs(&p.set)),
            ProjectionKind::Denormalize(p) => format!(
                "{} -> {}{}: {}",
                entity(p.source),
                entity(p.target),
                when(&p.when),
                pairs(&p.copy)
            ),
            ProjectionKind::InverseEdge(p) => format!(
                "{} -> {}{}{}",
                entity(p.source),
                entity(p.target),
                when(&p.when),
                if p.copy.is_empty() {
                    String::new()
                } else {
                    format!(": {}", pairs(&p.copy))
                }
            ),
            ProjectionKind::Counter(p) => format!(
                "count {}{} of {} in {} shards{}",
                entity(p.source),
                when(&p.when),
                pairs(&p.of),
                p.shards,
                match p.marker {
                    Marker::Edge(edge) => format!(", marked by {}", self.projections[edge].name),
                    Marker::Own => String::new(),
                }
            ),
            ProjectionKind::Custom(p) => {
                format!("{} (Rust)", entity_name_or(self, p.source_entity()))
            }
        }
    }
}

fn entity_name_or<'a>(spec: &'a Spec, name: &'a str) -> &'a str {
    spec.entity_id(name)
        .map(|id| spec.entities[id].name.as_str())
        .unwrap_or(name)
}

/// Each projection's fingerprint covers more than its own text: the key
/// patterns of the entities it reads and writes, the table's key names,
/// and, for a counter, the edge its records ride on (or none). Changing any
/// of these changes what the projection derives.
fn set_fingerprints(projections: &mut [Projection], entities: &[Entity], table: &TableSpec) {
    let pattern = |id: EntityId| {
        let entity = &entities[id];
        format!(
            "{}={}/{}",
            entity.name,
            entity.pk,
            entity.sk.as_ref().map(|sk| sk.as_str()).unwrap_or("")
        )
    };
    let names: Vec<String> = projections.iter().map(|p| p.name.clone()).collect();
    let extras: Vec<String> = projections
        .iter()
        .map(|projection| {
            let mut parts = vec![format!(
                "keys={}/{}",
                table.partition_key,
                table.sort_key.as_deref().unwrap_or("")
            )];
            match &projection.kind {
                ProjectionKind::IndexKeys(p) => parts.push(pattern(p.entity)),
                ProjectionKind::Denormalize(p) => {
                    parts.push(pattern(p.source));
                    parts.push(pattern(p.target));
                }
                ProjectionKind::InverseEdge(p) => {
                    parts.push(pattern(p.source));
                    parts.push(pattern(p.target));
                }
                ProjectionKind::Counter(p) => {
                    parts.push(pattern(p.source));
                    match p.marker {
                        Marker::Edge(edge) => {
                            parts.push(format!("rides on {}", names[edge]));
                            if let ProjectionKind::InverseEdge(e) = &projections[edge].kind {
                                parts.push(pattern(e.target));
                            }
                        }
                        Marker::Own => parts.push("own markers".to_string()),
                    }
                }
                ProjectionKind::Custom(_) => {}
            }
            parts.join(";")
        })
        .collect();
    for (projection, extra) in projections.iter_mut().zip(extras) {
        projection.fingerprint = fingerprint(&format!("{:016x};{extra}", projection.fingerprint));
    }
}

/// FNV-1a, 64 bits: stable across builds and machines.
fn fingerprint(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
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
                _ => format!("{}={:016x}", p.name, p.fingerprint),
            })
            .collect();
        fingerprint(&all.join(","))
    }
}

/// Suggests the closest known name, for "did you mean" hints.
fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    let known: Vec<&str> = known.collect();
    let best = known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .min()
        .filter(|(d, k)| *d <= 2.max(k.len() / 3));
    match best {
        Some((_, k)) => format!(" (did you mean `{k}`?)"),
        None if known.is_empty() => " (none are declared)".to_string(),
        None => format!(" (known: {})", known.join(", ")),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(row[j + 1])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

struct Compiler {
    file: String,
    errors: Vec<SpecError>,
}

impl Compiler {
    fn new(label: &str) -> Compiler {
        Compiler {
            file: label.to_string(),
            errors: Vec::new(),
        }
    }

    fn error(&mut self, context: impl Into<String>, problem: impl Into<String>) {
        self.errors.push(SpecError {
            file: self.file.clone(),
            context: context.into(),
            problem: problem.into(),
        });
    }

    fn compile(
        mut self,
        raw: RawSpec,
        custom: Vec<Arc<dyn CustomProjection>>,
    ) -> Result<Spec, SpecErrors> {
        if raw.service.trim().is_empty() {
            self.error("", "`service` must name the service that owns the table");
        }
        let table = self.table(&raw);
        let entities = self.entities(&raw, &table);
        let mut projections = Vec::new();
        let mut seen = HashSet::new();
        for raw_projection in &raw.projections {
            let name = raw_projection.name().to_string();
            let context = format!("projection `{name}`");
            if name.trim().is_empty() {
                self.error(
                    format!("{} projection", raw_projection.kind()),
                    "`name` must not be empty",
                );
                continue;
            }
            if !seen.insert(name.clone()) {
                self.error(
                    &context,
                    "duplicate projection name; names must be unique in a spec",
                );
                continue;
            }
            let old_version = matches!(
                raw_projection,
                RawProjection::Counter {
                    storage: Some(_),
                    ..
                }
            ) && old_version_of(&name).is_some();
            if name.contains('~') && !old_version {
                self.error(
                    &context,
                    "a projection's name must not contain `~`: the tool names a counter's versions with it",
                );
                continue;
            }
            if let Some(kind) = self.projection(raw_projection, &context, &table, &entities) {
                projections.push(Projection {
                    name,
                    kind,
                    // Set below, once every projection is known. Where a
                    // counter is stored is not part of its definition.
                    fingerprint: fingerprint(
                        &serde_json::to_string(&raw_projection.definition()).unwrap_or_default(),
                    ),
                });
            }
        }
        for projection in custom {
            let name = projection.name().to_string();
            let context = format!("projection `{name}`");
            if !seen.insert(name.clone()) {
                self.error(
                    &context,
                    "duplicate projection name; names must be unique in a spec",
                );
                continue;
            }
            if !entities
                .iter()
                .any(|e| e.name == projection.source_entity())
            {
                let hint = suggest(
                    projection.source_entity(),
                    entities.iter().map(|e| e.name.as_str()),
                );
                self.error(
                    &context,
                    format!("unknown entity `{}`{hint}", projection.source_entity()),
                );
                continue;
            }
            // A Rust projection's definition is its code: its name and
            // source stand for it.
            let fingerprint = fingerprint(&format!(
                "custom\u{1}{name}\u{1}{}\u{1}{}",
                projection.source_entity(),
                projection.version()
            ));
            projections.push(Projection {
                name,
                kind: ProjectionKind::Custom(projection),
                fingerprint,
            });
        }
        self.assign_markers(&mut projections, &table);
        set_fingerprints(&mut projections, &entities, &table);
        self.check_loops(&projections, &entities);
        self.check_attributes(&projections, &entities);
        self.check_derived_items(&projections, &entities, &table);
        let invariants = self.invariants(&raw, &projections, &entities, &table, &seen);
        if !self.errors.is_empty() {
            return Err(SpecErrors(self.errors));
        }
        let interested = interested(&projections, &entities);
        Ok(Spec {
            file: self.file,
            service: raw.service,
            table,
            entities,
            projections,
            invariants,
            interested,
            raw: RawSpec::default(),
            frozen: Vec::new(),
        })
    }

    fn invariants(
        &mut self,
        raw: &RawSpec,
        projections: &[Projection],
        entities: &[Entity],
        table: &TableSpec,
        projection_names: &HashSet<String>,
    ) -> Vec<Invariant> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for raw_invariant in &raw.invariants {
            let name = raw_invariant.name().to_string();
            let context = format!("invariant `{name}`");
            if name.trim().is_empty() {
                self.error(
                    format!("{} invariant", raw_invariant.kind()),
                    "`name` must not be empty",
                );
                continue;
            }
            if !seen.insert(name.clone()) || projection_names.contains(&name) {
                self.error(
                    &context,
                    "duplicate name; invariant and projection names must be unique in a spec",
                );
                continue;
            }
            if name.contains('|') {
                self.error(&context, "the name must not contain `|`");
                continue;
            }
            if let Some(invariant) =
                self.invariant(raw, raw_invariant, &context, projections, entities, table)
            {
                out.push(Invariant {
                    name,
                    entity: invariant.0,
                    kind: invariant.1,
                });
            }
        }
        out
    }

    fn invariant(
        &mut self,
        spec: &RawSpec,
        raw: &RawInvariant,
        context: &str,
        projections: &[Projection],
        entities: &[Entity],
        table: &TableSpec,
    ) -> Option<(EntityId, InvariantKind)> {
        match raw {
            RawInvariant::ExactlyOne {
                entity,
                when,
                repair,
                ..
            }
            | RawInvariant::AtMostOne {
                entity,
                when,
                repair,
                ..
            } => {
                let entity = self.entity(context, "", entity, entities)?;
                if when.is_empty() {
                    self.error(context, "`when` is empty: name the condition that at most one item per partition may satisfy (`when = { isPrimary = true }`)");
                    return None;
                }
                let when = self.condition(context, when);
                let repair = match repair.as_deref() {
                    None => None,
                    Some("keep-latest") => Some(RepairPolicy::KeepLatest),
                    Some(other) => {
                        self.error(
                            context,
                            format!(
                                "unknown repair policy `{other}`{}",
                                suggest(other, ["keep-latest"].into_iter())
                            ),
                        );
                        return None;
                    }
                };
                Some((
                    entity,
                    InvariantKind::Count {
                        when,
                        exactly: matches!(raw, RawInvariant::ExactlyOne { .. }),
                        repair,
                    },
                ))
            }
            RawInvariant::Implies {
                entity,
                premise,
                then,
                ..
            } => {
                let entity = self.entity(context, "", entity, entities)?;
                if premise.is_empty() || then.is_empty() {
                    self.error(context, "`if` and `then` must each name at least one attribute (`if = { isPrimary = true }`, `then = { isVerified = true }`)");
                    return None;
                }
                let premise = self.condition(context, premise);
                let then = self.condition(context, then);
                Some((entity, InvariantKind::Implies { premise, then }))
            }
            RawInvariant::Unique { entity, index, .. } => {
                let entity = self.entity(context, "", entity, entities)?;
                let Some(gsi) = table.gsis.iter().find(|g| &g.name == index) else {
                    let hint = suggest(index, table.gsis.iter().map(|g| g.name.as_str()));
                    self.error(context, format!("unknown index `{index}`{hint}"));
                    return None;
                };
                let derived = projections
                    .iter()
                    .enumerate()
                    .find_map(|(id, p)| match &p.kind {
                        ProjectionKind::IndexKeys(keys) if keys.entity == entity => keys
                            .set
                            .iter()
                            .find(|(attr, _)| *attr == gsi.partition_key)
                            .map(|(_, template)| (id, template.clone())),
                        _ => None,
                    });
                let Some((projection, template)) = derived else {
                    // A projection that would derive it but did not compile
                    // is reported already; do not pile on.
                    let entity_name = &entities[entity].name;
                    let broken = spec.projections.iter().any(|p| {
                        matches!(p, RawProjection::IndexKeys { entity: e, set, .. }
                            if e == entity_name && set.contains_key(&gsi.partition_key))
                    });
                    if broken {
                        return None;
                    }
                    self.error(
                        context,
                        format!(
                            "no index-keys projection of entity `{}` derives `{}`, the partition key of {index}; uniqueness is checked through that derived key",
                            entities[entity].name, gsi.partition_key
                        ),
                    );
                    return None;
                };
                Some((
                    entity,
                    InvariantKind::Unique {
                        index: index.clone(),
                        attribute: gsi.partition_key.clone(),
                        projection,
                        template,
                    },
                ))
            }
        }
    }

    fn table(&mut self, raw: &RawSpec) -> TableSpec {
        let t = &raw.table;
        if t.name.trim().is_empty() {
            self.error("table", "`name` must not be empty");
        }
        if t.partition_key.trim().is_empty() {
            self.error("table", "`partition_key` must not be empty");
        }
        let sort_key = Some(t.sort_key.clone()).filter(|s| !s.is_empty());
        let mut names = HashSet::new();
        for gsi in &t.gsis {
            let context = format!("table index `{}`", gsi.name);
            if !names.insert(gsi.name.clone()) {
                self.error(&context, "duplicate index name");
            }
            if gsi.partition_key == t.partition_key || Some(&gsi.partition_key) == sort_key.as_ref()
            {
                self.error(
                    &context,
                    "an index key must not be one of the table's own key attributes",
                );
            }
        }
        TableSpec {
            name: t.name.clone(),
            partition_key: t.partition_key.clone(),
            sort_key,
            ttl_attribute: t.ttl_attribute.clone(),
            gsis: t
                .gsis
                .iter()
                .map(|g| Gsi {
                    name: g.name.clone(),
                    partition_key: g.partition_key.clone(),
                    sort_key: g.sort_key.clone(),
                })
                .collect(),
        }
    }

    fn entities(&mut self, raw: &RawSpec, table: &TableSpec) -> Vec<Entity> {
        let mut entities = Vec::new();
        for (name, raw_entity) in &raw.entities {
            let context = format!("entity `{name}`");
            let pk = match KeyPattern::parse(&raw_entity.pk) {
                Ok(pk) => pk,
                Err(error) => {
                    self.error(&context, format!("pk `{}`: {error}", raw_entity.pk));
                    continue;
                }
            };
            let sk = match (&raw_entity.sk, &table.sort_key) {
                (Some(sk), Some(_)) => match KeyPattern::parse(sk) {
                    Ok(sk) => Some(sk),
                    Err(error) => {
                        self.error(&context, format!("sk `{sk}`: {error}"));
                        continue;
                    }
                },
                (None, Some(sort_key)) => {
                    self.error(
                        &context,
                        format!("`sk` is required: the table has the sort key `{sort_key}`"),
                    );
                    continue;
                }
                (Some(_), None) => {
                    self.error(&context, "`sk` given, but the table has no sort key");
                    continue;
                }
                (None, None) => None,
            };
            let entity = Entity {
                name: name.clone(),
                pk,
                sk,
            };
            let mut seen = HashSet::new();
            for var in entity.vars() {
                if !seen.insert(var) {
                    self.error(
                        &context,
                        format!("variable `{{{var}}}` appears in both pk and sk"),
                    );
                }
            }
            entities.push(entity);
        }
        for (i, a) in entities.iter().enumerate() {
            for b in &entities[i + 1..] {
                let sk_overlap = match (&a.sk, &b.sk) {
                    (Some(x), Some(y)) => x.could_overlap(y),
                    _ => true,
                };
                if a.pk.could_overlap(&b.pk) && sk_overlap {
                    self.error(
                        format!("entity `{}`", b.name),
                        format!(
                            "its key patterns can match the same keys as entity `{}`; give one of them a distinct literal prefix",
                            a.name
                        ),
                    );
                }
            }
        }
        entities
    }

    fn entity(
        &mut self,
        context: &str,
        role: &str,
        name: &str,
        entities: &[Entity],
    ) -> Option<EntityId> {
        let found = entities.iter().position(|e| e.name == name);
        if found.is_none() {
            let hint = suggest(name, entities.iter().map(|e| e.name.as_str()));
            let role = if role.is_empty() {
                String::new()
            } else {
                format!("{role} ")
            };
            self.error(context, format!("unknown {role}entity `{name}`{hint}"));
        }
        found
    }

    fn templates(
        &mut self,
        context: &str,
        what: &str,
        map: &BTreeMap<String, String>,
        table: &TableSpec,
    ) -> Option<Vec<(String, Template)>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (attr, text) in map {
            if table.is_key_attribute(attr) {
                self.error(context, format!("{what} `{attr}` is a table key attribute; a projection cannot change an item's key"));
                ok = false;
                continue;
            }
            if attr.starts_with(RESERVED_PREFIX) {
                self.error(context, format!("{what} `{attr}`: attribute names starting with `{RESERVED_PREFIX}` are the projector's own (counter records); choose another name"));
                ok = false;
                continue;
            }
            match Template::parse(text) {
                Ok(template) => out.push((attr.clone(), template)),
                Err(error) => {
                    self.error(context, format!("{what} `{attr}` = `{text}`: {error}"));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn condition(&mut self, context: &str, raw: &RawCondition) -> Condition {
        let mut out = Vec::new();
        for (name, value) in raw {
            let value = match value {
                toml::Value::Boolean(b) => AttributeValue::Bool(*b),
                toml::Value::String(s) => AttributeValue::S(s.clone()),
                toml::Value::Integer(i) => AttributeValue::N(i.to_string()),
                toml::Value::Float(f) => AttributeValue::N(f.to_string()),
                other => {
                    self.error(
                        context,
                        format!(
                            "`when.{name}` must be a string, number or boolean, not {}",
                            other.type_str()
                        ),
                    );
                    continue;
                }
            };
            out.push((name.clone(), value));
        }
        Condition(out)
    }

    /// Checks that a target's key variables all come from the source's key.
    fn bound_by_source(&mut self, context: &str, source: &Entity, target: &Entity) -> bool {
        let source_vars: HashSet<&str> = source.vars().collect();
        let unbound: Vec<&str> = target.vars().filter(|v| !source_vars.contains(v)).collect();
        if unbound.is_empty() {
            return true;
        }
        self.error(
            context,
            format!(
                "target entity `{}` has key variable(s) {} that the key of source entity `{}` does not bind (it binds: {}); name the variables alike in both patterns",
                target.name,
                unbound.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                source.name,
                source.vars().collect::<Vec<_>>().join(", ")
            ),
        );
        false
    }

    /// Checks that an inverse edge's target uses every key variable of its
    /// source, so each source item has a reverse item of its own (the
    /// reverse item marks that one source's membership).
    fn covers_source(&mut self, context: &str, source: &Entity, target: &Entity) -> bool {
        let target_vars: HashSet<&str> = target.vars().collect();
        let unused: Vec<&str> = source.vars().filter(|v| !target_vars.contains(v)).collect();
        if unused.is_empty() {
            return true;
        }
        self.error(
            context,
            format!(
                "target entity `{}` does not use the source key variable(s) {}: several `{}` items would share one reverse item; put every variable of the source key into the target's key",
                target.name,
                unused.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                source.name,
            ),
        );
        false
    }

    fn projection(
        &mut self,
        raw: &RawProjection,
        context: &str,
        table: &TableSpec,
        entities: &[Entity],
    ) -> Option<ProjectionKind> {
        match raw {
            RawProjection::IndexKeys { entity, set, .. } => {
                let entity = self.entity(context, "", entity, entities)?;
                if set.is_empty() {
                    self.error(
                        context,
                        "`set` is empty: name at least one attribute to derive",
                    );
                    return None;
                }
                let set = self.templates(context, "set", set, table)?;
                let key_vars: HashSet<&str> = entities[entity].vars().collect();
                let mut reads = Vec::new();
                for (attr, template) in &set {
                    for name in template.names() {
                        if set.iter().any(|(a, _)| a == name) {
                            self.error(
                                context,
                                format!("`{attr}` = `{template}` reads `{name}`, which this projection writes: every write would change its own input and loop"),
                            );
                        } else if !key_vars.contains(name) && !reads.iter().any(|r| r == name) {
                            reads.push(name.to_string());
                        }
                    }
                }
                Some(ProjectionKind::IndexKeys(IndexKeys { entity, set, reads }))
            }
            RawProjection::Denormalize {
                source,
                target,
                when,
                copy,
                ..
            } => {
                let source = self.entity(context, "source", source, entities);
                let target = self.entity(context, "target", target, entities);
                let (source, target) = (source?, target?);
                if source == target {
                    self.error(context, "source and target are the same entity: its output would match its own input and loop");
                    return None;
                }
                if copy.is_empty() {
                    self.error(
                        context,
                        "`copy` is empty: name at least one attribute to copy",
                    );
                    return None;
                }
                let bound = self.bound_by_source(context, &entities[source], &entities[target]);
                let target_vars: HashSet<&str> = entities[target].vars().collect();
                let unqueryable: Vec<&String> = entities[source]
                    .pk
                    .vars()
                    .iter()
                    .filter(|v| !target_vars.contains(v.as_str()))
                    .collect();
                if !unqueryable.is_empty() {
                    self.error(
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
                let when = self.condition(context, when);
                let copy = self.templates(context, "copy", copy, table)?;
                if !bound || !unqueryable.is_empty() {
                    return None;
                }
                let reads = reads_of(&when, &copy, &entities[source]);
                Some(ProjectionKind::Denormalize(Denormalize {
                    source,
                    target,
                    when,
                    copy,
                    reads,
                }))
            }
            RawProjection::InverseEdge {
                source,
                target,
                when,
                copy,
                ..
            } => {
                let source = self.entity(context, "source", source, entities);
                let target = self.entity(context, "target", target, entities);
                let (source, target) = (source?, target?);
                if source == target {
                    self.error(context, "source and target are the same entity: its output would match its own input and loop");
                    return None;
                }
                let bound = self.bound_by_source(context, &entities[source], &entities[target]);
                let one_to_one = self.covers_source(context, &entities[source], &entities[target]);
                let when = self.condition(context, when);
                let copy = self.templates(context, "copy", copy, table)?;
                if !bound || !one_to_one {
                    return None;
                }
                let reads = reads_of(&when, &copy, &entities[source]);
                Some(ProjectionKind::InverseEdge(InverseEdge {
                    source,
                    target,
                    when,
                    copy,
                    reads,
                }))
            }
            RawProjection::Counter {
                name,
                source,
                of,
                when,
                shards,
                storage,
            } => {
                let source = self.entity(context, "source", source, entities)?;
                if raw.name().contains('#') {
                    self.error(
                        context,
                        "a counter's name must not contain `#`: it separates the parts of its shard and marker keys",
                    );
                    return None;
                }
                let storage = storage.clone().unwrap_or_else(|| name.clone());
                if storage_generation(name, &storage).is_none() {
                    self.error(
                        context,
                        format!("`storage = \"{storage}\"` is not one of this counter's: the tool sets it (to `{name}` or `{name}~N`); remove it from the file"),
                    );
                    return None;
                }
                if !(1..=MAX_SHARDS).contains(shards) {
                    self.error(
                        context,
                        format!("shards = {shards} is out of range: use 1 to {MAX_SHARDS}"),
                    );
                }
                let when = self.condition(context, when);
                let of = self.templates(context, "of", of, table)?;
                let key_vars: HashSet<&str> = entities[source].vars().collect();
                for (name, template) in &of {
                    for read in template.names() {
                        if !key_vars.contains(read) {
                            self.error(
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
                if !(1..=MAX_SHARDS).contains(shards) {
                    return None;
                }
                Some(ProjectionKind::Counter(Counter {
                    source,
                    of,
                    when,
                    shards: *shards,
                    marker: Marker::Own,
                    storage,
                }))
            }
        }
    }

    /// A counter whose source has an inverse edge with the same condition
    /// uses that edge as its membership marker (one write less per change).
    fn assign_markers(&mut self, projections: &mut [Projection], table: &TableSpec) {
        let edges: Vec<(ProjectionId, String, EntityId, Condition)> = projections
            .iter()
            .enumerate()
            .filter_map(|(id, p)| match &p.kind {
                ProjectionKind::InverseEdge(edge) => {
                    Some((id, p.name.clone(), edge.source, edge.when.clone()))
                }
                _ => None,
            })
            .collect();
        for projection in projections.iter_mut() {
            if let ProjectionKind::Counter(counter) = &mut projection.kind {
                // Of several edges that would do, the one first by name:
                // the order of the file must not move a counter's records.
                if let Some((id, ..)) = edges
                    .iter()
                    .filter(|(_, _, source, when)| {
                        *source == counter.source && *when == counter.when
                    })
                    .min_by(|a, b| a.1.cmp(&b.1))
                {
                    counter.marker = Marker::Edge(*id);
                }
            }
        }
        // TTL deletes an item without the projector: reverse items that
        // carry counter records must never expire, whichever projection
        // would write the TTL attribute onto them.
        if let Some(ttl) = &table.ttl_attribute {
            for (id, projection) in projections.iter().enumerate() {
                let ProjectionKind::InverseEdge(edge) = &projection.kind else {
                    continue;
                };
                let counted: Vec<String> = projections
                    .iter()
                    .filter(|p| {
                        matches!(&p.kind, ProjectionKind::Counter(c) if c.marker == Marker::Edge(id))
                    })
                    .map(|p| format!("`{}`", p.name))
                    .collect();
                if counted.is_empty() {
                    continue;
                }
                for writer in projections.iter() {
                    let written = match &writer.kind {
                        ProjectionKind::InverseEdge(e) if e.target == edge.target => &e.copy,
                        ProjectionKind::Denormalize(d) if d.target == edge.target => &d.copy,
                        ProjectionKind::IndexKeys(k) if k.entity == edge.target => &k.set,
                        _ => continue,
                    };
                    if written.iter().any(|(attr, _)| attr == ttl) {
                        self.error(
                            format!("projection `{}`", writer.name),
                            format!(
                                "writes the table's TTL attribute `{ttl}` onto the reverse items of `{}`, which counter(s) {} record their membership on: TTL would delete them without moving the counters; do not write `{ttl}` there, or give the counters another `when`",
                                projection.name,
                                counted.join(", ")
                            ),
                        );
                    }
                }
            }
        }
    }

    /// Rules out projections whose writes feed back into their own inputs.
    fn check_loops(&mut self, projections: &[Projection], entities: &[Entity]) {
        // Edges source entity -> written entity, labelled by projection.
        let mut graph: HashMap<EntityId, Vec<(EntityId, &str)>> = HashMap::new();
        for projection in projections {
            let edge = match &projection.kind {
                ProjectionKind::Denormalize(p) => Some((p.source, p.target)),
                ProjectionKind::InverseEdge(p) => Some((p.source, p.target)),
                _ => None,
            };
            if let Some((from, to)) = edge {
                graph
                    .entry(from)
                    .or_default()
                    .push((to, projection.name.as_str()));
            }
        }
        // Inverse edges and denormalized targets may themselves be sources
        // of other projections; a cycle through them never settles.
        let mut reported = HashSet::new();
        for (start, start_entity) in entities.iter().enumerate() {
            let mut stack = vec![(start, vec![])];
            let mut visited = HashSet::new();
            while let Some((node, path)) = stack.pop() {
                for (next, name) in graph.get(&node).into_iter().flatten() {
                    let mut path: Vec<&str> = path.clone();
                    path.push(name);
                    if *next == start {
                        let mut key = path.clone();
                        key.sort();
                        if reported.insert(key) {
                            self.error(
                                format!("projection `{}`", path[0]),
                                format!(
                                    "projections {} form a loop through entity `{}`: each one's output is another's input, so writes would never stop",
                                    path.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(" -> "),
                                    start_entity.name
                                ),
                            );
                        }
                    } else if visited.insert(*next) {
                        stack.push((*next, path));
                    }
                }
            }
        }
    }

    /// Rules out projections that fight over one entity's attributes: two
    /// writers of an attribute undo each other's writes, and index keys that
    /// read each other's outputs rewrite each other, forever.
    fn check_attributes(&mut self, projections: &[Projection], entities: &[Entity]) {
        // One inverse edge per target entity: a reverse item marks one
        // edge's membership; two edges would create and delete it in turn.
        let mut reverse: BTreeMap<EntityId, Vec<&str>> = BTreeMap::new();
        for projection in projections {
            if let ProjectionKind::InverseEdge(edge) = &projection.kind {
                reverse
                    .entry(edge.target)
                    .or_default()
                    .push(projection.name.as_str());
            }
        }
        for (entity, names) in &reverse {
            if let [first, rest @ ..] = names.as_slice() {
                for name in rest {
                    self.error(
                        format!("projection `{name}`"),
                        format!(
                            "projections `{first}` and `{name}` both keep the reverse items of entity `{}`: each would delete the other's; give each inverse edge a target entity of its own",
                            entities[*entity].name
                        ),
                    );
                }
            }
        }
        let mut writers: BTreeMap<(EntityId, &str), Vec<&str>> = BTreeMap::new();
        for projection in projections {
            let (entity, written) = match &projection.kind {
                ProjectionKind::IndexKeys(p) => (p.entity, &p.set),
                ProjectionKind::Denormalize(p) => (p.target, &p.copy),
                ProjectionKind::InverseEdge(p) => (p.target, &p.copy),
                _ => continue,
            };
            for (attr, _) in written {
                writers
                    .entry((entity, attr.as_str()))
                    .or_default()
                    .push(projection.name.as_str());
            }
        }
        for ((entity, attr), names) in &writers {
            if let [first @ .., last] = names.as_slice() {
                if first.is_empty() {
                    continue;
                }
                let listed: Vec<String> = first.iter().map(|n| format!("`{n}`")).collect();
                self.error(
                    format!("projection `{last}`"),
                    format!(
                        "projections {} and `{last}` {} write `{attr}` on entity `{}`: each would overwrite the other's value forever; let one projection own the attribute",
                        listed.join(", "),
                        if first.len() == 1 { "both" } else { "all" },
                        entities[*entity].name
                    ),
                );
            }
        }
        // Index keys of one entity: `a -> b` when `a` writes what `b` reads.
        // A projection reading its own output is reported where it is compiled.
        let index_keys: Vec<(&str, &IndexKeys)> = projections
            .iter()
            .filter_map(|p| match &p.kind {
                ProjectionKind::IndexKeys(keys) => Some((p.name.as_str(), keys)),
                _ => None,
            })
            .collect();
        let feeds = |a: &IndexKeys, b: &IndexKeys| {
            a.entity == b.entity && a.set.iter().any(|(attr, _)| b.reads.contains(attr))
        };
        // Each projection on a loop reports the shortest loop through it,
        // found breadth first (once per set of projections). Enumerating
        // every path instead took factorial time when projections read each
        // other's outputs: nine such took 5 s to check, ten over 10 s (the
        // spec fuzz target's timeout), each one more multiplying it.
        let mut reported = HashSet::new();
        for (start, (_, first)) in index_keys.iter().enumerate() {
            let mut previous: Vec<Option<usize>> = vec![None; index_keys.len()];
            let mut queue = VecDeque::from([start]);
            let mut closing = None;
            'search: while let Some(node) = queue.pop_front() {
                for (next, (_, keys)) in index_keys.iter().enumerate() {
                    if next == node || !feeds(index_keys[node].1, keys) {
                        continue;
                    }
                    if next == start {
                        closing = Some(node);
                        break 'search;
                    }
                    if previous[next].is_none() {
                        previous[next] = Some(node);
                        queue.push_back(next);
                    }
                }
            }
            let Some(mut node) = closing else { continue };
            let mut path = vec![node];
            // Back to `start`, the one node reached without a predecessor.
            while let Some(before) = previous[node] {
                path.push(before);
                node = before;
            }
            path.reverse();
            let mut key = path.clone();
            key.sort_unstable();
            if reported.insert(key) {
                let names: Vec<String> = path
                    .iter()
                    .chain([&start])
                    .map(|&i| format!("`{}`", index_keys[i].0))
                    .collect();
                self.error(
                    format!("projection `{}`", index_keys[start].0),
                    format!(
                        "projections {} form a loop on entity `{}`: each writes an attribute the next one reads, so writes would never stop",
                        names.join(" -> "),
                        entities[first.entity].name
                    ),
                );
            }
        }
    }

    /// Counter shard items must never be mistaken for entities.
    fn check_derived_items(
        &mut self,
        projections: &[Projection],
        entities: &[Entity],
        table: &TableSpec,
    ) {
        for projection in projections {
            if let ProjectionKind::Counter(counter) = &projection.kind {
                let mut pattern = format!(
                    "COUNTER#{}#",
                    projection.name.replace('{', "{{").replace('}', "}}")
                );
                for (name, _) in &counter.of {
                    pattern.push_str(&format!("{{{name}}}#"));
                }
                pattern.push_str("{shard}");
                let Ok(pk) = KeyPattern::parse(&pattern) else {
                    continue;
                };
                let sk = KeyPattern::parse("COUNTER").expect("literal");
                for entity in entities {
                    let sk_overlap = match (&entity.sk, table.sort_key.is_some()) {
                        (Some(esk), true) => esk.could_overlap(&sk),
                        _ => true,
                    };
                    if entity.pk.could_overlap(&pk) && sk_overlap {
                        self.error(
                            format!("projection `{}`", projection.name),
                            format!(
                                "counter shard items (`{pattern}` / `COUNTER`) could be read as entity `{}`; give that entity a distinct literal prefix",
                                entity.name
                            ),
                        );
                    }
                }
            }
        }
    }
}

fn reads_of(when: &Condition, copy: &[(String, Template)], source: &Entity) -> Vec<String> {
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

fn interested(projections: &[Projection], entities: &[Entity]) -> Vec<Vec<ProjectionId>> {
    let mut out = vec![Vec::new(); entities.len()];
    for (id, projection) in projections.iter().enumerate() {
        let mut add = |entity: EntityId| {
            if !out[entity].contains(&id) {
                out[entity].push(id);
            }
        };
        match &projection.kind {
            ProjectionKind::IndexKeys(p) => add(p.entity),
            ProjectionKind::Denormalize(p) => {
                add(p.source);
                add(p.target);
            }
            ProjectionKind::InverseEdge(p) => add(p.source),
            ProjectionKind::Counter(p) => add(p.source),
            ProjectionKind::Custom(p) => {
                if let Some(entity) = entities.iter().position(|e| e.name == p.source_entity()) {
                    add(entity);
                }
            }
        }
    }
    out
}
