//! Time as the projector stores it in the table, and prints it.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_smithy_types::date_time::Format;
use aws_smithy_types::DateTime;

/// Milliseconds since the Unix epoch: how the registry and the leases
/// store instants.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A time in ms as RFC 3339, as messages and `status` print it.
pub fn iso(ms: u64) -> String {
    DateTime::from_millis(ms as i64)
        .fmt(Format::DateTime)
        .unwrap_or_default()
}
