//! The spec file as written: a serde model that mirrors the TOML.
//!
//! Nothing here is validated beyond its shape; `super::compile` turns it
//! into a [`super::Spec`]. The same structs are what the Rust builder API
//! fills in, so code-registered and file-registered rules compile alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::kinds::RawProjection;
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
