//! What the applier needs of the control plane, which lives above it
//! ([`crate::control`]): the lease settings it reads from the environment.

use std::time::Duration;

/// How long a lease lasts past what a writer needs (and, for writers
/// without a deadline, how long it lasts).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(120);

/// How far apart two machines' clocks may be: a lease counts as reaching
/// past an instant when it ends less than this before it
/// (`PROJECTOR_CLOCK_SKEW_MS`, default 2000).
pub fn clock_skew_ms() -> u64 {
    std::env::var("PROJECTOR_CLOCK_SKEW_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

/// The lease length: `PROJECTOR_LEASE_SECONDS` or [`DEFAULT_LEASE`].
pub fn lease_length() -> Duration {
    std::env::var("PROJECTOR_LEASE_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map_or(DEFAULT_LEASE, Duration::from_secs_f64)
}
