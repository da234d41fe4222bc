//! The spec file as written: a serde model that mirrors the TOML.
//!
//! Nothing here is validated beyond its shape; [`super::compile`] turns it
//! into a [`super::Spec`]. The same structs are what the Rust builder API
//! fills in, so code-registered and file-registered rules compile alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::schema::raw::{RawCondition, RawEntity, RawGsi, RawTable};

/// A whole spec file: one service, one table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    /// The service that owns the table (`user-service`).
    pub service: String,
    /// The table and its indexes.
    pub table: RawTable,
    /// Entity key patterns by name.
    #[serde(default)]
    pub entities: BTreeMap<String, RawEntity>,
    /// The projections, in the order they are planned.
    #[serde(default, rename = "projections")]
    pub projections: Vec<RawProjection>,
    /// The invariants checked on every change and by `audit`.
    #[serde(default, rename = "invariants")]
    pub invariants: Vec<RawInvariant>,
}

/// One `[[projections]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RawProjection {
    /// Derive attributes (usually GSI keys) on the changed item itself.
    IndexKeys {
        /// Projection name, unique in the spec.
        name: String,
        /// The entity whose items get the attributes.
        entity: String,
        /// Attribute name to template.
        set: BTreeMap<String, String>,
    },
    /// Copy attributes from a source item onto a target item while a condition holds.
    Denormalize {
        /// Projection name.
        name: String,
        /// The entity copied from.
        source: String,
        /// The entity copied onto; its key variables come from the source's.
        target: String,
        /// The source item that counts (`{ isPrimary = true }`).
        #[serde(default)]
        when: RawCondition,
        /// Target attribute to template over the source item.
        copy: BTreeMap<String, String>,
    },
    /// Maintain the reverse item of a relationship.
    InverseEdge {
        /// Projection name.
        name: String,
        /// The edge entity (`follow`).
        source: String,
        /// The reverse edge entity (`followed_by`).
        target: String,
        /// Only edges for which this holds get a reverse item.
        #[serde(default)]
        when: RawCondition,
        /// Target attribute to template over the source item.
        #[serde(default)]
        copy: BTreeMap<String, String>,
    },
    /// A write-sharded count of the source items per target.
    Counter {
        /// Counter name (`followers`), used by `counter get`.
        name: String,
        /// The counted entity.
        source: String,
        /// The counter's own variables, from the source's key variables
        /// (`{ userId = "{followeeId}" }`).
        of: BTreeMap<String, String>,
        /// Only source items for which this holds are counted.
        #[serde(default)]
        when: RawCondition,
        /// Number of shards (1 to 100); hot targets want more.
        #[serde(default = "default_shards")]
        shards: u32,
        /// Where the counter's shards and records live: set by the tool,
        /// never by hand. A changed counter is rebuilt beside the version
        /// readers read, in the next generation `<name>~N` (see
        /// `control::Registry::layout`); absent means `<name>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        storage: Option<String>,
    },
    /// A counter's total kept on an item (see [`crate::kinds::rollup`]).
    Rollup(crate::kinds::rollup::RawRollup),
    /// Totals over a partition's items (see [`crate::kinds::aggregate`]).
    Aggregate(crate::kinds::aggregate::RawAggregate),
}

fn default_shards() -> u32 {
    4
}

impl RawProjection {
    /// The projection's name.
    pub fn name(&self) -> &str {
        match self {
            RawProjection::IndexKeys { name, .. }
            | RawProjection::Denormalize { name, .. }
            | RawProjection::InverseEdge { name, .. }
            | RawProjection::Counter { name, .. } => name,
            RawProjection::Rollup(p) => &p.name,
            RawProjection::Aggregate(p) => &p.name,
        }
    }

    /// What its fingerprint covers: a counter's definition without where
    /// it is stored, and an old version (`followers~0`, kept current while
    /// the changed counter is rebuilt) as the counter it was.
    pub fn definition(&self) -> RawProjection {
        let mut copy = self.clone();
        if let RawProjection::Counter { name, storage, .. } = &mut copy {
            if storage.is_some() {
                if let Some((base, _)) = super::old_version_of(name) {
                    *name = base.to_string();
                }
            }
            *storage = None;
        }
        copy
    }

    /// The kind as written in the file.
    pub fn kind(&self) -> &'static str {
        match self {
            RawProjection::IndexKeys { .. } => "index-keys",
            RawProjection::Denormalize { .. } => "denormalize",
            RawProjection::InverseEdge { .. } => "inverse-edge",
            RawProjection::Counter { .. } => "counter",
            RawProjection::Rollup(_) => "rollup",
            RawProjection::Aggregate(_) => "aggregate",
        }
    }
}

/// One `[[invariants]]` entry: a rule over source items that DynamoDB itself
/// cannot enforce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RawInvariant {
    /// In each partition that holds items of `entity`, exactly one of them
    /// satisfies `when`.
    ExactlyOne {
        /// Invariant name, unique in the spec.
        name: String,
        /// The entity whose items are counted.
        entity: String,
        /// The condition exactly one item must satisfy (`{ isPrimary = true }`).
        when: RawCondition,
        /// What the worker may do on its own when more than one item
        /// satisfies `when`: `keep-latest`. Without it, source items are
        /// never changed.
        #[serde(default)]
        repair: Option<String>,
    },
    /// In each partition, at most one item of `entity` satisfies `when`.
    AtMostOne {
        /// Invariant name.
        name: String,
        /// The entity whose items are counted.
        entity: String,
        /// The condition at most one item may satisfy.
        when: RawCondition,
        /// As for `exactly-one`.
        #[serde(default)]
        repair: Option<String>,
    },
    /// Every item of `entity` that satisfies `if` satisfies `then`.
    Implies {
        /// Invariant name.
        name: String,
        /// The entity checked.
        entity: String,
        /// The premise (`{ isPrimary = true }`).
        #[serde(rename = "if")]
        premise: RawCondition,
        /// What must then hold (`{ isVerified = true }`).
        then: RawCondition,
    },
    /// The partition key an `index-keys` projection derives for `entity` in
    /// `index` belongs to items of one partition (one owner) only.
    Unique {
        /// Invariant name.
        name: String,
        /// The entity checked.
        entity: String,
        /// The GSI whose derived partition key must be unique (`GSI1`).
        index: String,
    },
}

impl RawInvariant {
    /// The invariant's name.
    pub fn name(&self) -> &str {
        match self {
            RawInvariant::ExactlyOne { name, .. }
            | RawInvariant::AtMostOne { name, .. }
            | RawInvariant::Implies { name, .. }
            | RawInvariant::Unique { name, .. } => name,
        }
    }

    /// The kind as written in the file.
    pub fn kind(&self) -> &'static str {
        match self {
            RawInvariant::ExactlyOne { .. } => "exactly-one",
            RawInvariant::AtMostOne { .. } => "at-most-one",
            RawInvariant::Implies { .. } => "implies",
            RawInvariant::Unique { .. } => "unique",
        }
    }
}
