//! `custom`: a projection written in Rust, registered with
//! [`crate::spec::SpecBuilder::custom`].

use std::fmt;

use crate::effect::CustomOp;
use crate::record::ChangeRecord;

/// A projection written in Rust, registered with
/// [`crate::spec::SpecBuilder::custom`].
///
/// It plans plain idempotent writes (put or delete a derived item) for
/// records of its source entity, and must be pure like the built-in kinds.
pub trait CustomProjection: Send + Sync + fmt::Debug {
    /// Unique projection name.
    fn name(&self) -> &str;
    /// The entity whose records it plans on.
    fn source_entity(&self) -> &str;
    /// Plans the writes for one change; an `Err` dead-letters the record.
    fn plan(&self, change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String>;
    /// The version of what it derives: change it whenever the code derives
    /// something else, so that the lifecycle registry sees a new definition
    /// (`status` then asks for a backfill). Its fingerprint covers only the
    /// name, the source entity and this.
    fn version(&self) -> u32 {
        0
    }
}

/// What a custom projection sees of a change.
#[derive(Debug)]
pub struct EntityChange<'a> {
    /// The record.
    pub record: &'a ChangeRecord,
    /// The key variables its entity pattern bound.
    pub vars: &'a [(&'a str, &'a str)],
}
