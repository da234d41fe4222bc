//! The engine core: spec compilation, decoding and planning (all pure),
//! and the offline commands built on them.

mod architecture;
mod bad_inputs;
mod cli;
mod decode;
mod fingerprints;
mod fuzz_regressions;
mod iam;
mod invariants;
mod planner;
mod public_api;
mod spec_errors;
mod util;
