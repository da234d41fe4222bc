//! Metrics as CloudWatch Embedded Metric Format (EMF) documents on stdout,
//! flushed once per invocation.
//!
//! Everything the projector counts through the `metrics` crate (the
//! applier's `projector_records_total{status}`, `projector_effects_total`,
//! `projector_write_units_total`, `projector_retries_total{operation,reason}`,
//! ...) lands in the namespace [`NAMESPACE`] (or `PROJECTOR_METRICS_NAMESPACE`)
//! with the dimension `FunctionName`, plus one dimension per label. CloudWatch
//! Logs turns each document into metrics; no API call is made. This module
//! adds what only the Lambda side knows: the iterator age, the batch item
//! failures reported and the backfill invocations by outcome.

use std::time::{SystemTime, UNIX_EPOCH};

use metrics_cloudwatch_embedded::Collector;

use crate::decode::Decoded;

/// The default CloudWatch namespace.
pub const NAMESPACE: &str = "DdbProjector";

/// Installs the EMF recorder as the global `metrics` recorder.
pub fn install(namespace: &str, function_name: &str) -> Result<&'static Collector, String> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_string())
        .with_dimension("FunctionName", function_name.to_string())
        .init()
        .map_err(|error| format!("cannot install the metrics recorder: {error}"))?;
    metrics::describe_histogram!(
        "projector_iterator_age_ms",
        metrics::Unit::Milliseconds,
        "age of the oldest record of a batch when its invocation started"
    );
    Ok(collector)
}

/// Records the age of the oldest record of the batch, from
/// `ApproximateCreationDateTime` (records without one are left out).
pub fn record_iterator_age(records: &Decoded) {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let oldest = records
        .iter()
        .filter_map(|r| r.as_ref().ok()?.approximate_creation_ms)
        .min();
    if let Some(created) = oldest {
        metrics::histogram!("projector_iterator_age_ms").record((now_ms - created).max(0) as f64);
    }
}

/// Counts what the applier did not count itself: records abandoned at the
/// deadline and the batch item failures reported.
pub fn record_invocation(abandoned: usize, reported_failure: bool) {
    if abandoned > 0 {
        metrics::counter!("projector_records_total", "status" => "failed")
            .increment(abandoned as u64);
    }
    metrics::counter!("projector_invocations_total").increment(1);
    if reported_failure {
        metrics::counter!("projector_batch_item_failures_total").increment(1);
    }
}

/// Counts a backfill invocation: `Some(done)` when it answered, `None` when
/// it failed.
pub fn record_backfill(done: Option<bool>) {
    let outcome = match done {
        Some(true) => "done",
        Some(false) => "continue",
        None => "failed",
    };
    metrics::counter!("projector_backfill_invocations_total", "outcome" => outcome).increment(1);
}

/// Writes this invocation's metrics as EMF lines on stdout.
pub fn flush(collector: &Collector, request_id: &str) {
    collector.set_property("RequestId", request_id.to_string());
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if let Err(error) = collector.flush(&mut out) {
        tracing::warn!(%error, "cannot write the metrics");
    }
}
