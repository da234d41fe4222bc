//! Structured logs: `tracing` output on stderr, as text or JSON lines.
//!
//! A JSON line is one flat object, as AWS Lambda Powertools writes them
//! and CloudWatch Logs Insights queries them: `timestamp` (RFC 3339, ms),
//! `level`, `message`, `service`, then the fields of every span the event
//! is in (outermost first, an inner span's field winning) and the event's
//! own fields. Inside Lambda, the invocation's span adds `cold_start`,
//! `function_request_id`, `function_name`, `function_arn`,
//! `function_memory_size` and `xray_trace_id` (when Lambda sends one), so
//! every line of an invocation carries them (see [`crate::lambda`]).
//!
//! `service` is `POWERTOOLS_SERVICE_NAME`, as Powertools reads it, or
//! `ddb-projector`.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The variable naming the service on every JSON line.
pub const SERVICE_VAR: &str = "POWERTOOLS_SERVICE_NAME";

/// Sets up `tracing` output on stderr (`RUST_LOG` filters, `info` by
/// default); a second call changes nothing.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::from_env())
            .try_init(),
    };
}

/// Formats an event as one flat JSON object (see the module's docs).
#[derive(Debug, Clone)]
pub struct FlatJson {
    service: String,
}

impl FlatJson {
    /// Names the service from `POWERTOOLS_SERVICE_NAME`, or `ddb-projector`.
    pub fn from_env() -> FlatJson {
        FlatJson::new(
            std::env::var(SERVICE_VAR)
                .ok()
                .filter(|name| !name.trim().is_empty())
                .unwrap_or_else(|| "ddb-projector".to_string()),
        )
    }

    /// Names the service `service`.
    pub fn new(service: String) -> FlatJson {
        FlatJson { service }
    }
}

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(timestamp()));
        line.insert(
            "level".into(),
            Value::String(event.metadata().level().as_str().to_string()),
        );
        line.insert("message".into(), Value::String(String::new()));
        line.insert("service".into(), Value::String(self.service.clone()));
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                // Span fields are kept as JSON text (`JsonFields`).
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut Fields {
            line: &mut line,
            message_seen: false,
        });
        line.insert(
            "target".into(),
            Value::String(event.metadata().target().to_string()),
        );
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Now as RFC 3339 with milliseconds, in UTC.
fn timestamp() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// Records an event's fields into the line. tracing records an event's
/// text first, as `message`; a field the event names `message` too
/// (`warn!(%message, "...")`) comes after it and goes to `message_field`,
/// so the text is never lost.
struct Fields<'a> {
    line: &'a mut Map<String, Value>,
    message_seen: bool,
}

impl Fields<'_> {
    fn put(&mut self, name: &str, value: Value) {
        let name = if name == "message" {
            if self.message_seen {
                "message_field"
            } else {
                self.message_seen = true;
                "message"
            }
        } else {
            name
        };
        self.line.insert(name.to_string(), value);
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number);
        self.put(field.name(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field.name(), Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field.name(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_flat_with_the_spans_fields_and_the_service() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::new("orders".into()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let outer =
                tracing::info_span!("invocation", function_request_id = "r-1", cold_start = true);
            let _outer = outer.enter();
            let inner = tracing::info_span!("spec", table = "Orders", cold_start = false);
            let _inner = inner.enter();
            tracing::warn!(records = 3_u64, ok = true, "applied");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "applied");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["service"], "orders");
        assert_eq!(line["function_request_id"], "r-1");
        assert_eq!(line["table"], "Orders");
        assert_eq!(line["cold_start"], false, "the inner span wins");
        assert_eq!(line["records"], 3);
        assert_eq!(line["ok"], true);
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn an_event_field_named_message_keeps_the_events_text() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::new("orders".into()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let message = "queue message 42";
            tracing::warn!(%message, "message kept in the queue");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "message kept in the queue", "{line}");
        assert_eq!(line["message_field"], "queue message 42", "{line}");
    }
}
