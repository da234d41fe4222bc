//! ddb-projector: a stream-driven projection and invariant worker for
//! DynamoDB single-table designs.
//!
//! # Layout
//!
//! A change flows **decode → match → plan → apply → report**:
//!
//! - [`record`]: the one change-record model every stage shares.
//! - [`decode`]: Lambda events, Streams API records and scanned items into records.
//! - [`schema`]: what every spec describes and every kind compiles
//!   against: the table, entities and key patterns, templates, conditions,
//!   spec errors and the compile context.
//! - [`effect`]: the vocabulary of what planning asks for (effects are
//!   states, not deltas), which the applier writes.
//! - [`kinds`]: every projection kind in a folder of its own (raw section,
//!   compilation, planning, description), their registration, the checks
//!   across projections, and the rules kinds plan against; matching a key
//!   to an entity lives here too.
//! - [`spec`]: spec files (one per service), compiled into a validated
//!   rule set: the compile driver, invariants, composed specs, the builder.
//! - [`plan`]: the pure planner's driver: each interested kind plans a
//!   record.
//! - [`apply`]: writes planned effects exactly once in effect (coalescing,
//!   retries, dead letters).
//! - [`source`]: the self-hosted DynamoDB Streams runner (shard walker and
//!   durable checkpoints) behind `run` and `replay`.
//! - [`lambda`]: the AWS Lambda bootstrap (partial batch responses, deadline,
//!   EMF metrics) and the event source mapping filters the spec implies.
//! - [`backfill`]: parallel, resumable, rate-limited scans through the same
//!   planner and applier.
//! - [`control`]: the control plane above the applier: the lifecycle's
//!   states, its registry, leases and counter layout.
//! - [`dynamo`]: DynamoDB access, the floor under every module that talks
//!   to AWS: client set-up, error classes and every retry policy, the
//!   reserved names (`_ddbp#...`), ARN and consumer-name parsing.
//! - [`table`], [`counter`]: table creation, counter reads.
//! - [`global`]: on a global table, which region projects.
//! - [`cli`] and `main.rs`: the `ddb-projector` command line.
//!
//! **Architecture Invariant:** `record`, `schema`, `decode`, `effect`,
//! `kinds`, `spec`, `plan` and `invariant` send no request and await
//! nothing (`spec` reads spec files, nothing else); SDK types stop at
//! `decode` and never reach the planner. No test checks this yet (see
//! ARCHITECTURE.md, "Architecture invariants").

pub mod apply;
pub mod audit;
pub mod backfill;
pub mod cli;
pub mod control;
pub mod counter;
pub mod decode;
pub mod dynamo;
pub mod effect;
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
