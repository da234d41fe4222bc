//! The runner in the open: its metrics as Prometheus text at `/metrics`
//! and its health at `/healthz`, over plain HTTP (`run --metrics-addr`).
//!
//! The metrics are what the whole process counts through the `metrics`
//! crate, under the names the Lambda's EMF documents use
//! (`projector_records_total{status}`, `projector_stream_records_total`,
//! `projector_iterator_age_ms{shard}`, ...), rendered by
//! `metrics-exporter-prometheus`.
//!
//! [`Health`] is what the runner reports: healthy (200) while it runs,
//! holds its leases (the right every write of a stream consumer is made
//! under) and gets through its pages (a page read and wholly handled, or
//! an empty one, within [`STALL`]); unhealthy (503) before it took them,
//! once they ran out without being renewed (DynamoDB unreachable, the
//! role's rights taken away), when no page got through for [`STALL`]
//! (records failing again and again, the stream unreachable), and once
//! the runner stopped. An idle runner renews its leases and reads empty
//! pages, so a quiet table is not a sick runner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::dynamo::time::now_ms;

/// What a runner reports of itself; cheap to clone and share.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<State>);

#[derive(Debug, Default)]
struct State {
    running: AtomicBool,
    /// Until when (ms) the leases run; `u64::MAX` for a runner that needs
    /// none (`replay` writes under no consumer lease); 0 before the first.
    leased_until: AtomicU64,
    /// Why the last renewal failed, until one succeeds.
    problem: Mutex<Option<String>>,
    /// When (ms) a page last got through, or the runner started.
    progressed_at: AtomicU64,
}

/// How long a running runner may go without a page getting through
/// before it reports itself stalled.
pub const STALL: Duration = Duration::from_secs(120);

/// `/healthz`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    /// Whether the runner is healthy: running, with current leases.
    pub healthy: bool,
    /// `ok`, `starting`, `lease lost`, `stalled` or `stopped`.
    pub status: &'static str,
    /// How long the leases still run (ms), when they are held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms_left: Option<u64>,
    /// Why the last renewal failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl Health {
    /// A runner not started yet.
    pub fn new() -> Health {
        Health::default()
    }

    /// The runner started (`true`: it has no lease and no page yet) or
    /// stopped (`false`).
    pub(crate) fn set_running(&self, running: bool) {
        if running {
            self.0.leased_until.store(0, Ordering::SeqCst);
            *self.0.problem.lock().expect("health lock") = None;
            self.0.progressed_at.store(now_ms(), Ordering::SeqCst);
        }
        self.0.running.store(running, Ordering::SeqCst);
    }

    /// A page got through: read and wholly handled, or empty.
    pub(crate) fn progressed(&self) {
        self.0.progressed_at.fetch_max(now_ms(), Ordering::SeqCst);
    }

    /// The leases were taken or renewed: they run until `until` (ms), or
    /// none is needed (`None`).
    pub(crate) fn leased(&self, until: Option<u64>) {
        let until = until.unwrap_or(u64::MAX);
        self.0.leased_until.fetch_max(until, Ordering::SeqCst);
        *self.0.problem.lock().expect("health lock") = None;
    }

    /// Taking or renewing the leases failed: `problem` says why. The
    /// leases still run until they run out.
    pub(crate) fn lease_failed(&self, problem: String) {
        *self.0.problem.lock().expect("health lock") = Some(problem);
    }

    /// The runner's health now.
    pub fn report(&self) -> HealthReport {
        self.report_at(now_ms())
    }

    fn report_at(&self, now: u64) -> HealthReport {
        let until = self.0.leased_until.load(Ordering::SeqCst);
        let problem = self.0.problem.lock().expect("health lock").clone();
        let (healthy, status) = if !self.0.running.load(Ordering::SeqCst) {
            (false, if until == 0 { "starting" } else { "stopped" })
        } else if until == 0 {
            (false, "starting")
        } else if until <= now {
            (false, "lease lost")
        } else if now.saturating_sub(self.0.progressed_at.load(Ordering::SeqCst))
            > STALL.as_millis() as u64
        {
            (false, "stalled")
        } else {
            (true, "ok")
        };
        HealthReport {
            healthy,
            status,
            lease_ms_left: (until > now && until != u64::MAX).then(|| until - now),
            problem,
        }
    }
}

/// Installs the Prometheus recorder as the process's `metrics` recorder
/// (once; a second call is refused) and returns its handle.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    // A gauge not set for 15 minutes is dropped: each shard's iterator
    // age is a series, and DynamoDB rotates shards every few hours.
    PrometheusBuilder::new()
        .idle_timeout(
            metrics_util::MetricKindMask::GAUGE,
            Some(Duration::from_secs(15 * 60)),
        )
        .install_recorder()
        .map_err(|error| format!("cannot install the Prometheus recorder: {error}"))
}

/// Serves `/metrics` (when `metrics` is given) and `/healthz` on
/// `listener` until the future is dropped: each connection in a task of
/// its own, given five seconds.
pub async fn serve(listener: TcpListener, health: Health, metrics: Option<PrometheusHandle>) {
    // Histograms and idle entries are folded on a timer, as the exporter's
    // own listener does.
    let upkeep = metrics.clone();
    let _upkeep = tokio::spawn(async move {
        if let Some(handle) = upkeep {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                handle.run_upkeep();
            }
        }
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // A task per connection: a client that connects and says nothing
        // holds up no other (a probe times out in a second).
        let (health, metrics) = (health.clone(), metrics.clone());
        tokio::spawn(async move {
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                answer(stream, &health, metrics.as_ref()),
            )
            .await;
            if let Ok(Err(error)) = answered {
                tracing::debug!(%error, "a metrics or health request failed");
            }
        });
    }
}

/// Reads one request and answers it.
async fn answer(
    mut stream: TcpStream,
    health: &Health,
    metrics: Option<&PrometheusHandle>,
) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    // The request line and headers; a body is never expected.
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buffer[..n]);
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/healthz") => {
            let report = health.report();
            let status = if report.healthy {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let body = serde_json::to_string(&report).unwrap_or_default() + "\n";
            (status, "application/json", body)
        }
        ("GET" | "HEAD", "/metrics") => match metrics {
            Some(handle) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                handle.render(),
            ),
            None => (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "no metrics here\n".to_string(),
            ),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "try /metrics or /healthz\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET /metrics or /healthz\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_runner_and_its_leases() {
        let health = Health::new();
        assert_eq!(health.report_at(1_000).status, "starting");
        health.set_running(true);
        assert!(!health.report_at(1_000).healthy, "no lease yet");
        health.leased(Some(5_000));
        let ok = health.report_at(1_000);
        assert!(ok.healthy);
        assert_eq!(ok.lease_ms_left, Some(4_000));
        health.lease_failed("UpdateItem: InternalServerError".into());
        let failing = health.report_at(2_000);
        assert!(failing.healthy, "the lease still runs");
        assert_eq!(
            failing.problem.as_deref(),
            Some("UpdateItem: InternalServerError")
        );
        let lost = health.report_at(5_000);
        assert_eq!((lost.healthy, lost.status), (false, "lease lost"));
        // A renewal that comes back later makes it healthy again, and an
        // older answer arriving late never shortens the lease.
        health.leased(Some(9_000));
        health.leased(Some(7_000));
        let back = health.report_at(6_000);
        assert_eq!(
            (back.healthy, back.lease_ms_left, back.problem),
            (true, Some(3_000), None)
        );
        health.set_running(false);
        assert_eq!(health.report_at(6_000).status, "stopped");
    }

    #[test]
    fn a_runner_whose_pages_do_not_get_through_is_stalled() {
        let health = Health::new();
        health.set_running(true);
        health.leased(None);
        let started = health.0.progressed_at.load(Ordering::SeqCst);
        let stalled_at = started + STALL.as_millis() as u64 + 1;
        let report = health.report_at(stalled_at);
        assert_eq!((report.healthy, report.status), (false, "stalled"));
        health
            .0
            .progressed_at
            .store(stalled_at - 1_000, Ordering::SeqCst);
        assert!(health.report_at(stalled_at).healthy);
        // A restart starts over: no lease, no problem, fresh progress.
        health.lease_failed("denied".into());
        health.set_running(true);
        let restarted = health.report();
        assert_eq!((restarted.status, restarted.problem), ("starting", None));
    }

    #[test]
    fn a_runner_without_leases_is_healthy_while_it_runs() {
        let health = Health::new();
        health.set_running(true);
        health.leased(None);
        let report = health.report();
        assert_eq!((report.healthy, report.lease_ms_left), (true, None));
    }
}
