//! `inverse-edge`: the reverse item of a relationship, kept while the
//! edge exists (and its condition holds).

use crate::schema::{Condition, EntityId, Template};

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
