//! ddb-projector: a stream-driven projection and invariant worker for
//! DynamoDB single-table designs.
//!
//! # As a library
//!
//! The public face is small: a [`Projector`] is a spec (a file, a
//! directory of them, or the specs registered for a table) plus the
//! projections a team writes in Rust ([`CustomProjection`]).
//! [`serve_lambda`] serves it as an AWS Lambda function from a team's own
//! `main`, as the shipped bootstrap serves a spec; [`Projector::connect`]
//! gives a [`Connected`] projector whose methods are the runner
//! ([`Connected::run`]), [`Connected::backfill`], [`Connected::audit`]
//! and [`Connected::wait`], each through the CLI's own checks (a global
//! table's home region among them).
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! let orders = ddb_projector::Projector::new()
//!     .spec("projections/orders.toml")
//!     .connect()
//!     .await?;
//! let report = orders.audit(false).await?;
//! println!("clean: {}", report.is_clean());
//! # Ok(())
//! # }
//! ```
//!
//! The default `cli` feature builds the `ddb-projector` command line;
//! `default-features = false` builds the library alone.
//!
//! # Layout
//!
//! A change flows **decode → match → plan → apply → report**. The modules
//! stand on floors, as ARCHITECTURE.md's module map lists them: each uses
//! only its own floor and those below, never one above, never in a cycle.
//!
//! - floor 0, `record`: the one change-record model every stage
//!   shares; `logging`: the `tracing` set-up.
//! - floor 1, `dynamo`: DynamoDB access, the floor under every module
//!   that talks to AWS: client set-up, error classes and every retry
//!   policy, the reserved names (`_ddbp#...`), ARN and consumer-name
//!   parsing.
//! - floor 2, `schema`: what every spec describes and every kind
//!   compiles against: the table, entities and key patterns, templates,
//!   conditions, spec errors and the compile context.
//! - floor 3, `decode`: Lambda events, Streams API records and scanned
//!   items into records; `effect`: the vocabulary of what planning asks
//!   for (effects are states, not deltas), which the applier writes.
//! - floor 4, `kinds`: every projection kind in a folder of its own,
//!   their registration, the checks across projections, and the rules
//!   kinds plan against; matching a key to an entity lives here too.
//! - floor 5, `spec`: spec files (one per service), compiled into a
//!   validated rule set: the compile driver, invariants, composed specs,
//!   the builder.
//! - floor 6, `plan`: the pure planner's driver: each interested kind
//!   plans a record; `invariant`: the pure evaluation of a spec's
//!   invariants.
//! - floor 7, `apply`: writes planned effects exactly once in effect
//!   (holds, coalescing, retries, dead letters, online checks); it asks
//!   the control plane for leases through `apply::Control`.
//! - floors 8 to 11, `control`: the control plane above the applier,
//!   a floor per room: the lifecycle's pure states (`status`, 8), the
//!   registry's storage (`registry`, 9), leases and counter layout
//!   (`leases`, `layout`, 10), its face and the lifecycle backfill's
//!   choice (11).
//! - floor 12, `backfill`: parallel, resumable, paced scans through the
//!   same planner and applier; `counter`: counter reads; `table`:
//!   table creation.
//! - floor 13, `audit`: the audit, its repair and `wait`; `prune`:
//!   what retired projections derived, deleted; `source`: the
//!   self-hosted DynamoDB Streams runner (shard walker and durable
//!   checkpoints) behind `run` and `replay`, and `recover`.
//! - floor 14, `global`: on a global table, which region projects.
//! - floor 15, `lambda`: the AWS Lambda bootstrap (partial batch
//!   responses, deadline, EMF metrics) and the event source mapping
//!   filters the spec implies.
//! - floor 16, `cli` and `main.rs`: the `ddb-projector` command line,
//!   which parses, then calls; `embed`: the face for a team's own
//!   binary, a [`Projector`] (a spec plus projections written in Rust)
//!   and `serve_lambda`.
//!
//! **Architecture Invariant:** `record`, `schema`, `decode`, `effect`,
//! `kinds`, `spec`, `plan` and `invariant` send no request and await
//! nothing (`spec` reads spec files, nothing else); SDK types stop at
//! `decode` and never reach the planner. No test checks this yet (see
//! ARCHITECTURE.md, "Architecture invariants").

#![cfg_attr(not(feature = "internals"), warn(missing_docs))]
// Without `internals`, what only the tests reach is not dead code, and
// the rooms' re-exports for them are not unused (the build with it, which
// `cargo clippy --all-targets` makes, still finds both).
#![cfg_attr(not(feature = "internals"), allow(dead_code, unused_imports))]

// The rooms are the crate's own: only `embed` (and what the crate root
// re-exports) is its public face. The `internals` feature, which only
// this repository's tests, benches and examples turn on (a dev-dependency
// on itself), makes them public for those.
#[cfg(feature = "internals")]
pub mod apply;
#[cfg(not(feature = "internals"))]
pub(crate) mod apply;
#[cfg(feature = "internals")]
pub mod audit;
#[cfg(not(feature = "internals"))]
pub(crate) mod audit;
#[cfg(feature = "internals")]
pub mod backfill;
#[cfg(not(feature = "internals"))]
pub(crate) mod backfill;
#[cfg(all(feature = "cli", feature = "internals"))]
pub mod cli;
#[cfg(all(feature = "cli", not(feature = "internals")))]
pub(crate) mod cli;
#[cfg(feature = "internals")]
pub mod control;
#[cfg(not(feature = "internals"))]
pub(crate) mod control;
#[cfg(feature = "internals")]
pub mod counter;
#[cfg(not(feature = "internals"))]
pub(crate) mod counter;
#[cfg(feature = "internals")]
pub mod decode;
#[cfg(not(feature = "internals"))]
pub(crate) mod decode;
#[cfg(feature = "internals")]
pub mod dynamo;
#[cfg(not(feature = "internals"))]
pub(crate) mod dynamo;
#[cfg(feature = "internals")]
pub mod effect;
#[cfg(not(feature = "internals"))]
pub(crate) mod effect;
pub mod embed;
#[cfg(feature = "internals")]
pub mod global;
#[cfg(not(feature = "internals"))]
pub(crate) mod global;
#[cfg(feature = "internals")]
pub mod invariant;
#[cfg(not(feature = "internals"))]
pub(crate) mod invariant;
#[cfg(feature = "internals")]
pub mod kinds;
#[cfg(not(feature = "internals"))]
pub(crate) mod kinds;
#[cfg(feature = "internals")]
pub mod lambda;
#[cfg(not(feature = "internals"))]
pub(crate) mod lambda;
#[cfg(feature = "internals")]
pub mod logging;
#[cfg(not(feature = "internals"))]
pub(crate) mod logging;
#[cfg(feature = "internals")]
pub mod plan;
#[cfg(not(feature = "internals"))]
pub(crate) mod plan;
#[cfg(feature = "internals")]
pub mod prune;
#[cfg(not(feature = "internals"))]
pub(crate) mod prune;
#[cfg(feature = "internals")]
pub mod record;
#[cfg(not(feature = "internals"))]
pub(crate) mod record;
#[cfg(feature = "internals")]
pub mod schema;
#[cfg(not(feature = "internals"))]
pub(crate) mod schema;
#[cfg(feature = "internals")]
pub mod source;
#[cfg(not(feature = "internals"))]
pub(crate) mod source;
#[cfg(feature = "internals")]
pub mod spec;
#[cfg(not(feature = "internals"))]
pub(crate) mod spec;
#[cfg(feature = "internals")]
pub mod table;
#[cfg(not(feature = "internals"))]
pub(crate) mod table;

#[cfg(feature = "cli")]
pub use cli::main as cli_main;
pub use embed::{
    serve_lambda, AttributeValue, AuditReport, BackfillSummary, ChangeKind, ChangeRecord,
    Connected, CustomOp, CustomProjection, EntityChange, Image, Item, ItemKey, Pending, Projector,
    RunSummary, Spec, SpecError, SpecErrors, SpecSet, ValueRef, WaitStatus, Waited,
};
