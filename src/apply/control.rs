//! What the applier needs of the control plane, which lives above it
//! ([`crate::control`]): the [`Control`] its caller passes in, and the
//! lease settings it reads from the environment.

use std::time::Duration;

use futures::future::BoxFuture;

use super::ApplyError;
use crate::spec::ProjectionId;

/// What an applier asks of the control plane: the lifecycle leases every
/// write is made under, the last change a stream consumer applied, and
/// the counter version readers read. The control plane imports the
/// applier, not the other way round: the caller builds this and passes it
/// to [`super::Applier::new`] (`crate::control::applier` does both).
pub trait Control: std::fmt::Debug + Send + Sync {
    /// Makes sure the applier may write `written` (a stream consumer: every
    /// projection) until `needed` (ms), taking or extending its leases (a
    /// request only when they run out before). Returns until when it may
    /// write them.
    fn lease<'a>(
        &'a self,
        written: &'a [ProjectionId],
        needed: u64,
    ) -> BoxFuture<'a, Result<u64, String>>;

    /// Notes the changes a stream consumer applied (projection, change
    /// time in ms), for `status`.
    fn note_applied<'a>(
        &'a self,
        changes: &'a [(ProjectionId, i64)],
    ) -> BoxFuture<'a, Result<(), ApplyError>>;

    /// The version of counter `name` readers read, when a backfill of it
    /// completed (one consistent read of the registry).
    fn readers_version<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<CounterVersion>, ApplyError>>;
}

/// The version of a counter readers read, as the registry records it:
/// where a recompute of a rollup reads its shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterVersion {
    /// Its generation: 0 (storage `<name>`), then 1 (`<name>~1`)...
    pub generation: u32,
    /// Its storage name: shards are `COUNTER#<storage>#<of values>#<n>`.
    pub storage: String,
    /// Its number of shards.
    pub shards: u32,
    /// Its variables (the names of its `of`, in shard key order).
    pub vars: Vec<String>,
}

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
