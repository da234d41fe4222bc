//! `index-keys`: derived attributes (usually GSI keys) on the changed item.

use crate::schema::{EntityId, Template};

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
