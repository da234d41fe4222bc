//! Tests against a real DynamoDB (DynamoDB Local).

pub mod support;

mod applier;
mod audit;
mod audit_lifecycle;
mod backfill;
mod delivery;
mod embed;
mod faults;
mod global;
mod holds;
mod kinds;
mod kinesis;
mod lambda;
mod lifecycle;
mod membership;
mod model;
mod observe;
mod oracle;
mod properties;
mod recover;
mod register;
mod registry;
mod replay;
mod replication;
mod runner;
mod specgen;
mod specgen_kills;
mod table;
mod wait;
