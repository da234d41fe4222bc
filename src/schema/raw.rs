//! The schema's sections as written: serde models that mirror the TOML
//! of a spec's `[table]` and `[entities]` and the conditions kinds use.
//!
//! Nothing here is validated beyond its shape; the compile context
//! (`compile.rs`) turns them into a [`super::TableSpec`] and
//! [`super::Entity`]s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The `[table]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTable {
    /// The default table name (`--table` overrides it).
    pub name: String,
    /// Partition key attribute name.
    #[serde(default = "default_pk")]
    pub partition_key: String,
    /// Sort key attribute name; empty for a table without a sort key.
    #[serde(default = "default_sk")]
    pub sort_key: String,
    /// The attribute DynamoDB's TTL reads, if any.
    #[serde(default)]
    pub ttl_attribute: Option<String>,
    /// Global secondary indexes.
    #[serde(default, rename = "gsi")]
    pub gsis: Vec<RawGsi>,
}

fn default_pk() -> String {
    "PK".to_string()
}

fn default_sk() -> String {
    "SK".to_string()
}

/// One `[[table.gsi]]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGsi {
    /// Index name (`GSI1`).
    pub name: String,
    /// Its partition key attribute.
    pub partition_key: String,
    /// Its sort key attribute, if any.
    #[serde(default)]
    pub sort_key: Option<String>,
}

/// One `[entities.NAME]`: the key patterns that identify an entity type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEntity {
    /// Partition key pattern (`USER#{userId}`).
    pub pk: String,
    /// Sort key pattern (`EMAIL#{emailId}`); required when the table has a sort key.
    #[serde(default)]
    pub sk: Option<String>,
}

/// A condition: every attribute must equal the given value.
pub type RawCondition = BTreeMap<String, toml::Value>;
