//! Registering projections from Rust instead of a TOML file.
//!
//! The builder fills in the same [`RawSpec`] a file deserializes into, so
//! both paths go through one compiler and report the same errors.
//!
//! ```
//! use ddb_projector::spec::SpecBuilder;
//!
//! let spec = SpecBuilder::new("user-service", "UserServiceTable")
//!     .gsi("GSI1", "GSI1PK", Some("GSI1SK"))
//!     .entity("email", "USER#{userId}", Some("EMAIL#{emailId}"))
//!     .index_keys("email-gsi1", "email", [("GSI1PK", "EMAIL#{lower(trim(email))}")])
//!     .build()
//!     .unwrap();
//! assert_eq!(spec.projections.len(), 1);
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use super::raw::{RawEntity, RawGsi, RawInvariant, RawProjection, RawSpec, RawTable};
use super::{Spec, SpecErrors};
use crate::kinds::custom::CustomProjection;
use crate::kinds::index_keys;

/// Builds a [`Spec`] in code.
#[derive(Debug, Default)]
pub struct SpecBuilder {
    raw: RawSpec,
    custom: Vec<Arc<dyn CustomProjection>>,
    label: String,
}

fn map<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl SpecBuilder {
    /// A spec for `service` over `table` with the key attributes `PK` and `SK`.
    pub fn new(service: &str, table: &str) -> SpecBuilder {
        SpecBuilder {
            raw: RawSpec {
                service: service.to_string(),
                table: RawTable {
                    name: table.to_string(),
                    partition_key: "PK".to_string(),
                    sort_key: "SK".to_string(),
                    ttl_attribute: None,
                    gsis: Vec::new(),
                },
                ..RawSpec::default()
            },
            custom: Vec::new(),
            label: format!("<spec {service} built in code>"),
        }
    }

    /// Sets the table's key attribute names (`sort_key` `None`: no sort key).
    pub fn keys(mut self, partition_key: &str, sort_key: Option<&str>) -> Self {
        self.raw.table.partition_key = partition_key.to_string();
        self.raw.table.sort_key = sort_key.unwrap_or_default().to_string();
        self
    }

    /// Names the TTL attribute.
    pub fn ttl_attribute(mut self, name: &str) -> Self {
        self.raw.table.ttl_attribute = Some(name.to_string());
        self
    }

    /// Adds a global secondary index.
    pub fn gsi(mut self, name: &str, partition_key: &str, sort_key: Option<&str>) -> Self {
        self.raw.table.gsis.push(RawGsi {
            name: name.to_string(),
            partition_key: partition_key.to_string(),
            sort_key: sort_key.map(str::to_string),
        });
        self
    }

    /// Declares an entity by its key patterns.
    pub fn entity(mut self, name: &str, pk: &str, sk: Option<&str>) -> Self {
        self.raw.entities.insert(
            name.to_string(),
            RawEntity {
                pk: pk.to_string(),
                sk: sk.map(str::to_string),
            },
        );
        self
    }

    /// Adds an `index-keys` projection.
    pub fn index_keys<'a>(
        mut self,
        name: &str,
        entity: &str,
        set: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        self.raw
            .projections
            .push(RawProjection::IndexKeys(index_keys::RawIndexKeys {
                name: name.to_string(),
                entity: entity.to_string(),
                set: map(set),
            }));
        self
    }

    /// Adds any raw projection (denormalize, inverse-edge, counter ...).
    pub fn projection(mut self, projection: RawProjection) -> Self {
        self.raw.projections.push(projection);
        self
    }

    /// Adds an invariant (exactly-one, at-most-one, implies, unique).
    pub fn invariant(mut self, invariant: RawInvariant) -> Self {
        self.raw.invariants.push(invariant);
        self
    }

    /// Adds a projection written in Rust.
    pub fn custom(mut self, projection: Arc<dyn CustomProjection>) -> Self {
        self.custom.push(projection);
        self
    }

    /// Validates and compiles the spec.
    pub fn build(self) -> Result<Spec, SpecErrors> {
        Spec::compile(self.raw, &self.label, self.custom)
    }
}
