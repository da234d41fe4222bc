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

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;

pub use crate::dynamo::names::{COUNTER_MARKER_PREFIX, RECORDS_ATTRIBUTE, RESERVED_PREFIX};
pub use crate::kinds::counter::{
    counter_storage, old_version_name, old_version_of, storage_generation, Counter, Marker,
    MAX_SHARDS,
};
use crate::kinds::custom::CustomProjection;
pub use crate::kinds::denormalize::Denormalize;
pub use crate::kinds::index_keys::IndexKeys;
pub use crate::kinds::inverse_edge::InverseEdge;
pub use crate::kinds::{Projection, ProjectionKind, Rules};
pub use crate::schema::{
    template, values_equal, Bindings, Condition, Entity, EntityId, Gsi, KeyPattern, ProjectionId,
    RenderError, SpecError, SpecErrors, TableSpec, Template, TemplateError,
};
pub use builder::SpecBuilder;
use raw::RawSpec;
pub use set::{Services, SpecSet};

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

/// A compiled, validated spec: the rule set the planner runs, with who
/// registered what and the spec as written. It derefs to its `Rules`
/// (`spec.projections`, `spec.match_entity(..)`), what the kinds plan,
/// compute and describe against.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Where it was loaded from (for messages).
    pub file: String,
    /// The owning service.
    pub service: String,
    /// The table, entities and projections.
    pub rules: Rules,
    /// Invariants, checked after each batch and by `audit`.
    pub invariants: Vec<Invariant>,
    /// The spec as written (without projections written in Rust): the
    /// lifecycle registry keeps it, so that a retired projection can still
    /// be pruned once no spec file has it.
    pub raw: RawSpec,
    /// The service (and file) that registered each projection and
    /// invariant: several when specs of one table were composed
    /// ([`SpecSet`]).
    pub services: Services,
}

impl Deref for Spec {
    type Target = Rules;

    fn deref(&self) -> &Rules {
        &self.rules
    }
}

impl DerefMut for Spec {
    fn deref_mut(&mut self) -> &mut Rules {
        &mut self.rules
    }
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

    /// The invariant with this name.
    pub fn invariant_id(&self, name: &str) -> Option<usize> {
        self.invariants.iter().position(|i| i.name == name)
    }
}
