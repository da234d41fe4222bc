//! Tests against a real DynamoDB (DynamoDB Local).

pub mod support;

mod applier;
mod backfill;
mod lambda;
mod runner;
mod table;
