//! `denormalize`: copy attributes from the source item that satisfies a
//! condition onto a target item.

use crate::schema::{Condition, EntityId, Template};

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
