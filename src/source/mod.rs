//! Sources: where change records come from when the projector runs itself
//! (not under Lambda).
//!
//! - [`stream`]: the self-hosted DynamoDB Streams runner (`run`, `replay`):
//!   walks the shards parents first, reads them in order, applies each batch
//!   with [`crate::apply::Applier::apply_batch`] and checkpoints only past
//!   handled records.
//! - [`checkpoint`]: the durable per-shard checkpoints, kept in the table
//!   itself under the reserved prefix.
//!
//! **Architecture Invariant:** a checkpoint never moves past a record that
//! is not handled (applied, skipped or dead-lettered); a crash at any instant
//! only makes the runner read again records it already applied, which the
//! applier's idempotent effects make harmless.

pub mod checkpoint;
pub mod stream;

pub use checkpoint::{Checkpoint, CheckpointStore};
pub use stream::{RunError, RunErrorKind, RunOptions, StreamRunner, Summary};
