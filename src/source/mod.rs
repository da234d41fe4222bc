//! Sources: where change records come from when the projector runs itself
//! (not under Lambda).
//!
//! - [`stream`]: the self-hosted DynamoDB Streams runner (`run`, `replay`):
//!   walks the shards parents first, reads them in order, applies each batch
//!   with [`crate::apply::Applier::apply_batch`] and checkpoints only past
//!   handled records.
//! - [`recover`]: `recover`, the batches Lambda gave up on: reads their
//!   ranges again from the stream (named by the on-failure queue's
//!   messages) and applies them like any batch.
//! - [`checkpoint`]: the durable per-shard checkpoints, kept in the table
//!   itself under the reserved prefix.
//! - [`observe`]: the runner's `/metrics` and `/healthz` over HTTP
//!   (`run --metrics-addr`).
//!
//! **Architecture Invariant:** a checkpoint never moves past a record that
//! is not handled (applied, skipped or dead-lettered); a crash at any instant
//! only makes the runner read again records it already applied, which the
//! applier's idempotent effects make harmless. Checked by
//! `dynamo::runner::killing_the_runner_at_random_points_loses_and_double_counts_nothing`
//! and `dynamo::faults::the_stream_runner_drains_a_faulty_table_exactly_and_checkpoints_past_it`.

pub mod checkpoint;
pub mod observe;
pub mod recover;
pub mod stream;

pub use checkpoint::{Checkpoint, CheckpointStore};
pub use stream::{
    KinesisStream, OtherTables, RunError, RunErrorKind, RunOptions, StreamRunner, Summary,
};
