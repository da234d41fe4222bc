//! DynamoDB access, the floor every module that talks to AWS stands on.
//!
//! - [`arn`]: the table of a stream ARN.
//! - [`client`]: SDK configuration, clients, and the table checks every
//!   online command starts with.
//! - [`names`]: the reserved names of the projector's own items and
//!   attributes, and what a consumer may be named.
//! - [`retry`]: the classification of SDK errors and every retry and
//!   backoff policy.
//! - [`time`]: the clock as the registry and the leases store it, and
//!   as messages print it.
//!
//! **Architecture Invariant:** `dynamo` imports nothing of the crate above
//! its floor (1 in ARCHITECTURE.md's module map; only `record` and
//! `logging` stand lower): every room above may use it, and it knows none
//! of them. Checked against the module map by
//! `engine::architecture::the_library_holds_to_the_module_map`
//! (`tests/engine/architecture.rs`).

pub mod arn;
pub mod client;
pub mod names;
pub mod retry;
pub mod time;
