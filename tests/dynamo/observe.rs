//! The runner in the open: `run --metrics-addr` serves Prometheus text at
//! `/metrics` and the runner's health at `/healthz`, which turns
//! unhealthy when its leases run out and healthy again once renewed.

use std::io::Read;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::ApplyConfig;
use ddb_projector::control;
use ddb_projector::source::observe::{self, Health};
use ddb_projector::source::{RunOptions, StreamRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::faults::{Fault, Faults};
use super::runner::{cli, summary_value};
use super::support::{self, s};

/// `GET path` on `addr`: the status code and the body (`None` when
/// nothing answers).
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// A port nothing listens on now.
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("an address")
}

/// The value of the sample `name` (with exactly these `labels`, as
/// Prometheus renders them) in a `/metrics` text.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines().find_map(|line| {
        line.strip_prefix(&series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Polls `probe` every 100 ms until it gives `Some`, for at most `limit`.
async fn until<T, F>(limit: Duration, what: &str, mut probe: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `/healthz` when it answers `want`.
async fn health_is(addr: SocketAddr, want: u16) -> Option<(u16, String)> {
    get(addr, "/healthz")
        .await
        .filter(|(status, _)| *status == want)
}

#[tokio::test]
async fn the_runner_serves_its_metrics_and_health_while_it_runs() {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "observe").await;
    let spec_file = support::repo().join("projections/user-service.toml");
    let addr = free_addr();
    let mut child = cli(&[
        "run",
        "--spec",
        spec_file.to_str().unwrap(),
        "--table",
        &table,
        "--metrics-addr",
        &addr.to_string(),
        "--format",
        "json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the runner");

    // Healthy once it took its leases, before any record came.
    let health = until(Duration::from_secs(60), "/healthz to answer 200", || {
        health_is(addr, 200)
    })
    .await;
    let report: serde_json::Value = serde_json::from_str(&health.1).expect("JSON");
    assert_eq!(report["status"], "ok", "{report}");
    assert!(report["lease_ms_left"].as_u64().unwrap() > 0, "{report}");

    // Five users' primary emails: 5 records, each deriving GSI keys.
    for i in 0..5 {
        support::put(
            &client,
            &table,
            &[
                ("PK", s(&format!("USER#u{i}"))),
                ("SK", s("EMAIL#e1")),
                ("emailId", s("e1")),
                ("email", s(&format!("U{i}@Example.org"))),
                ("isPrimary", Av::Bool(true)),
            ],
        )
        .await;
    }
    // Exactly the 5 writes are applied; the index-keys' own writes come
    // back on the stream and are skipped; every record read is counted
    // once its batch is done (a scrape may fall inside a batch).
    let settled = |text: &str| {
        let applied = sample(text, "projector_records_total", "status=\"applied\"")?;
        let skipped = sample(text, "projector_records_total", "status=\"skipped\"").unwrap_or(0.0);
        let read = sample(text, "projector_stream_records_total", "")?;
        assert!(applied <= 5.0, "{text}");
        (applied == 5.0 && read == applied + skipped).then_some(())
    };
    let text = until(
        Duration::from_secs(60),
        "5 records applied in /metrics",
        || async {
            let (status, text) = get(addr, "/metrics").await?;
            assert_eq!(status, 200);
            settled(&text).map(|()| text)
        },
    )
    .await;
    // The iterator age of the shard it read, in ms: DynamoDB Local dates
    // records to the minute, so at most a minute and a bit.
    let age = text
        .lines()
        .find(|line| line.starts_with("projector_iterator_age_ms{shard=\""))
        .unwrap_or_else(|| panic!("no iterator age in:\n{text}"));
    let age: f64 = age.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((0.0..120_000.0).contains(&age), "{age}");
    assert!(sample(&text, "projector_stream_batches_total", "").unwrap() >= 1.0);
    // Another path is not found; only GET and HEAD are served.
    assert_eq!(get(addr, "/").await.map(|(status, _)| status), Some(404));

    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert!(status.success(), "{text}");
    assert!(
        text.contains(&format!("metrics at http://{addr}/metrics")),
        "{text}"
    );
    assert!(summary_value(&text, "records") >= 5.0, "{text}");
    // `--format json`: the same summary as one JSON object on stdout.
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(json["table"], table.as_str(), "{json}");
    assert_eq!(json["how"], "stopped", "{json}");
    assert_eq!(
        json["summary"]["records"].as_f64(),
        Some(summary_value(&text, "records")),
        "{json}"
    );
}

#[tokio::test]
async fn health_turns_unhealthy_when_the_leases_lapse_and_healthy_once_renewed() {
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&clean, &spec, "observe-lease").await;
    // Lease renewals are `UpdateItem`s of the registry; they fail while the
    // faults are on (as when DynamoDB is unreachable or the role lost its
    // rights), and nothing else of an idle runner writes.
    let faults = Faults::always(Fault::ServerError, &["UpdateItem"]);
    faults.set_enabled(false);
    let (arn, _) = ddb_projector::dynamo::client::require_stream(&clean, &table)
        .await
        .expect("a stream");
    let lease = Duration::from_secs(2);
    let runner = StreamRunner::new(
        control::stream_consumer(
            faults.dynamodb(&config, false),
            spec.clone(),
            &table,
            ApplyConfig {
                lease,
                max_retry_time: Duration::from_secs(1),
                ..ApplyConfig::default()
            },
        ),
        aws_sdk_dynamodbstreams::Client::new(&config),
        &arn,
    );
    let health = Health::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(observe::serve(listener, health.clone(), None));
    assert_eq!(
        get(addr, "/healthz").await.map(|(status, _)| status),
        Some(503),
        "not started"
    );

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = RunOptions {
        health: Some(health.clone()),
        ..RunOptions::follow()
    };
    let run = runner.run(options, async {
        let _ = stopped.await;
    });
    let probe = async {
        until(Duration::from_secs(30), "healthy", || health_is(addr, 200)).await;
        // A client that connects and says nothing holds up no probe (the
        // server gives a connection five seconds).
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let probe = tokio::time::timeout(Duration::from_secs(2), get(addr, "/healthz")).await;
        assert_eq!(probe.ok().flatten().map(|(code, _)| code), Some(200));
        // Healthy for longer than a lease: an idle runner renews.
        tokio::time::sleep(lease * 2).await;
        assert_eq!(get(addr, "/healthz").await.map(|(code, _)| code), Some(200));

        faults.set_enabled(true);
        let (_, body) = until(Duration::from_secs(30), "lease lost", || {
            health_is(addr, 503)
        })
        .await;
        let report: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(report["status"], "lease lost", "{report}");
        assert!(faults.injected(Fault::ServerError) > 0);

        faults.set_enabled(false);
        until(Duration::from_secs(30), "healthy again", || {
            health_is(addr, 200)
        })
        .await;
        stop.send(()).unwrap();
    };
    let (ran, ()) = tokio::join!(run, probe);
    ran.expect("the runner stops cleanly");
    let (code, body) = get(addr, "/healthz").await.unwrap();
    assert_eq!(code, 503);
    assert!(body.contains("\"stopped\""), "{body}");
}
