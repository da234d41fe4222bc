//! Time as the projector stores it in the table.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: how the registry and the leases
/// store instants.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
