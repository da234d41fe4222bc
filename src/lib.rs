//! ddb-projector: a stream-driven projection and invariant worker for
//! DynamoDB single-table designs.
//!
//! # Layout
//!
//! A change flows **decode → match → plan → apply → report**. The modules
//! stand on floors, as ARCHITECTURE.md's module map lists them: each uses
//! only its own floor and those below, never one above, never in a cycle.
//!
//! - floor 0, [`record`]: the one change-record model every stage
//!   shares; [`logging`]: the `tracing` set-up.
//! - floor 1, [`dynamo`]: DynamoDB access, the floor under every module
//!   that talks to AWS: client set-up, error classes and every retry
//!   policy, the reserved names (`_ddbp#...`), ARN and consumer-name
//!   parsing.
//! - floor 2, [`schema`]: what every spec describes and every kind
//!   compiles against: the table, entities and key patterns, templates,
//!   conditions, spec errors and the compile context.
//! - floor 3, [`decode`]: Lambda events, Streams API records and scanned
//!   items into records; [`effect`]: the vocabulary of what planning asks
//!   for (effects are states, not deltas), which the applier writes.
//! - floor 4, [`kinds`]: every projection kind in a folder of its own,
//!   their registration, the checks across projections, and the rules
//!   kinds plan against; matching a key to an entity lives here too.
//! - floor 5, [`spec`]: spec files (one per service), compiled into a
//!   validated rule set: the compile driver, invariants, composed specs,
//!   the builder.
//! - floor 6, [`plan`]: the pure planner's driver: each interested kind
//!   plans a record; [`invariant`]: the pure evaluation of a spec's
//!   invariants.
//! - floor 7, [`apply`]: writes planned effects exactly once in effect
//!   (holds, coalescing, retries, dead letters, online checks); it asks
//!   the control plane for leases through [`apply::Control`].
//! - floors 8 to 11, [`control`]: the control plane above the applier,
//!   a floor per room: the lifecycle's pure states (`status`, 8), the
//!   registry's storage (`registry`, 9), leases and counter layout
//!   (`leases`, `layout`, 10), its face and the lifecycle backfill's
//!   choice (11).
//! - floor 12, [`backfill`]: parallel, resumable, paced scans through the
//!   same planner and applier; [`counter`]: counter reads; [`table`]:
//!   table creation.
//! - floor 13, [`audit`]: the audit, its repair and `wait`; [`prune`]:
//!   what retired projections derived, deleted; [`source`]: the
//!   self-hosted DynamoDB Streams runner (shard walker and durable
//!   checkpoints) behind `run` and `replay`, and `recover`.
//! - floor 14, [`global`]: on a global table, which region projects.
//! - floor 15, [`lambda`]: the AWS Lambda bootstrap (partial batch
//!   responses, deadline, EMF metrics) and the event source mapping
//!   filters the spec implies.
//! - floor 16, [`cli`] and `main.rs`: the `ddb-projector` command line,
//!   which parses, then calls; [`embed`]: the face for a team's own
//!   binary, a [`Projector`] (a spec plus projections written in Rust)
//!   and [`serve_lambda`].
//!
//! **Architecture Invariant:** `record`, `schema`, `decode`, `effect`,
//! `kinds`, `spec`, `plan` and `invariant` send no request and await
//! nothing (`spec` reads spec files, nothing else); SDK types stop at
//! `decode` and never reach the planner. No test checks this yet (see
//! ARCHITECTURE.md, "Architecture invariants").

pub mod apply;
pub mod audit;
pub mod backfill;
#[cfg(feature = "cli")]
pub mod cli;
pub mod control;
pub mod counter;
pub mod decode;
pub mod dynamo;
pub mod effect;
pub mod embed;
pub mod global;
pub mod invariant;
pub mod kinds;
pub mod lambda;
pub mod logging;
pub mod plan;
pub mod prune;
pub mod record;
pub mod schema;
pub mod source;
pub mod spec;
pub mod table;

pub use embed::{
    serve_lambda, AttributeValue, ChangeKind, ChangeRecord, CustomOp, CustomProjection,
    EntityChange, Image, Item, ItemKey, Projector,
};
