//! The test harness for DynamoDB Local: one real server per test binary.
//!
//! Uses the server named by `AWS_ENDPOINT_URL` when it is set; otherwise
//! starts a few with `scripts/ddb-local`, each with a watchdog that stops it
//! when the test process exits. Every test makes its own tables, so tests
//! run in parallel.

// Not every test module uses every helper.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::control;
use ddb_projector::spec::Spec;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// How many DynamoDB Local instances the tests spread over. One instance
/// serializes on a single database lock and, under several heavy tests at
/// once, times requests out ("too long waiting for a lock"), which real
/// DynamoDB never does.
const POOL: usize = 3;

/// The endpoint of the DynamoDB Local this test uses.
///
/// `AWS_ENDPOINT_URL`, when set, names the one server every test uses.
/// Otherwise each test thread is given one of [`POOL`] instances, started
/// on first use, so a test always talks to one server.
pub fn endpoint() -> &'static str {
    if let Some(endpoint) = shared_from_env() {
        return endpoint;
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static SERVERS: [OnceLock<String>; POOL] = [const { OnceLock::new() }; POOL];
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % POOL;
    }
    let slot = SLOT.with(|slot| *slot);
    SERVERS[slot].get_or_init(start_server)
}

/// A DynamoDB Local of its own, for a test heavy enough to time out the
/// others' requests on a shared one (or `AWS_ENDPOINT_URL` when set). It
/// stops with the test process.
pub fn dedicated_endpoint() -> String {
    match shared_from_env() {
        Some(endpoint) => endpoint.to_string(),
        None => start_server(),
    }
}

fn shared_from_env() -> Option<&'static str> {
    static SHARED: OnceLock<Option<String>> = OnceLock::new();
    SHARED
        .get_or_init(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .as_deref()
}

fn start_server() -> String {
    // One start at a time: the script installs DynamoDB Local on first use.
    static STARTING: Mutex<()> = Mutex::new(());
    let _guard = STARTING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let output = std::process::Command::new(repo().join("scripts/ddb-local"))
        .arg("start")
        .output()
        .expect("run scripts/ddb-local start");
    assert!(
        output.status.success(),
        "scripts/ddb-local start failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = String::from_utf8(output.stdout).expect("utf-8");
    let endpoint = line
        .trim()
        .strip_prefix("AWS_ENDPOINT_URL=")
        .expect("start prints AWS_ENDPOINT_URL=...")
        .to_string();
    let port = endpoint.rsplit(':').next().expect("a port").to_string();
    // Stop the server when this test process is gone.
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; '{script}' stop --port {port} >/dev/null 2>&1",
        pid = std::process::id(),
        script = repo().join("scripts/ddb-local").display(),
    );
    // The watchdog outlives this process on purpose; nobody waits for it.
    #[allow(clippy::zombie_processes)]
    std::process::Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the watchdog");
    endpoint
}

/// Environment variables that point a child process at DynamoDB Local.
pub fn env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint().to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "local".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "local".to_string()),
    ]
}

/// An SDK configuration for DynamoDB Local.
pub async fn sdk_config() -> aws_config::SdkConfig {
    sdk_config_for(endpoint()).await
}

/// An SDK configuration for the DynamoDB Local at `endpoint`.
pub async fn sdk_config_for(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "local", "local", None, None, "tests",
        ))
        // DynamoDB Local answers 500 "too long waiting for a lock" under
        // load; a test's own setup writes ride that out.
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(10))
        .load()
        .await
}

/// A DynamoDB client for DynamoDB Local.
pub async fn client() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config().await)
}

/// A table name no other test uses.
pub fn unique_table(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Loads a shipped spec.
pub fn shipped_spec(name: &str) -> Arc<Spec> {
    Arc::new(
        Spec::from_file(&repo().join("projections").join(name)).expect("shipped spec compiles"),
    )
}

/// A fresh table shaped like `spec` (with a stream), named uniquely.
pub async fn fresh_table(client: &aws_sdk_dynamodb::Client, spec: &Spec, prefix: &str) -> String {
    let table = unique_table(prefix);
    ddb_projector::table::create_table(client, spec, &table)
        .await
        .expect("create table");
    table
}

/// A string attribute.
pub fn s(value: &str) -> Av {
    Av::S(value.to_string())
}

/// A number attribute from its decimal text (`12.34`).
pub fn n_text(value: &str) -> Av {
    Av::N(value.to_string())
}

/// A number attribute.
pub fn n(value: i64) -> Av {
    Av::N(value.to_string())
}

/// Builds an item from pairs.
pub fn item(pairs: &[(&str, Av)]) -> HashMap<String, Av> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Puts an item the way a simple writer would.
pub async fn put(client: &aws_sdk_dynamodb::Client, table: &str, pairs: &[(&str, Av)]) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item(pairs)))
        .send()
        .await
        .expect("put item");
}

/// Deletes an item by PK/SK.
pub async fn delete(client: &aws_sdk_dynamodb::Client, table: &str, pk: &str, sk: &str) {
    client
        .delete_item()
        .table_name(table)
        .set_key(Some(item(&[("PK", s(pk)), ("SK", s(sk))])))
        .send()
        .await
        .expect("delete item");
}

/// Reads an item consistently.
pub async fn get(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    pk: &str,
    sk: &str,
) -> Option<HashMap<String, Av>> {
    client
        .get_item()
        .table_name(table)
        .set_key(Some(item(&[("PK", s(pk)), ("SK", s(sk))])))
        .consistent_read(true)
        .send()
        .await
        .expect("get item")
        .item
}

/// Every item of a table, sorted by key, for whole-table comparisons.
pub async fn scan_all(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<HashMap<String, Av>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        items.extend(page.items().iter().cloned());
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => break,
        }
    }
    let key = |item: &HashMap<String, Av>| {
        let text = |name: &str| match item.get(name) {
            Some(Av::S(v)) => v.clone(),
            _ => String::new(),
        };
        (text("PK"), text("SK"))
    };
    items.sort_by_key(key);
    items
}

/// The string value of an attribute.
pub fn text(item: &HashMap<String, Av>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(Av::S(value)) => Some(value.clone()),
        Some(Av::N(value)) => Some(value.clone()),
        Some(Av::Bool(value)) => Some(value.to_string()),
        _ => None,
    }
}

/// Path of the built binary.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ddb-projector"))
}

/// An SDK interceptor standing in for DynamoDB: the calls of `operation`
/// whose request body contains `needle` still reach DynamoDB Local, but
/// their answer is replaced by a 200 with `body`, which the SDK's own
/// deserializer then reads (so a value of a type DynamoDB might add after
/// this build, `{"VECTOR": [1, 2]}`, arrives as `AttributeValue::Unknown`).
#[derive(Debug, Clone)]
pub struct Answer {
    /// `Scan`, `Query`...
    pub operation: &'static str,
    /// Text the request body must contain (`""`: every call).
    pub needle: &'static str,
    /// The answer's JSON body.
    pub body: serde_json::Value,
}

/// Marks the attempts whose answer [`Answer`] replaces.
#[derive(Debug, Clone)]
struct Replace;

impl aws_smithy_types::config_bag::Storable for Replace {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Replace>;
}

impl Answer {
    /// A client of the shared test server whose calls go through this.
    pub async fn client(self) -> aws_sdk_dynamodb::Client {
        let config = sdk_config().await;
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .interceptor(self)
                .build(),
        )
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for Answer {
    fn name(&self) -> &'static str {
        "Answer"
    }

    fn read_before_transmit(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let request = context.request();
        let target = format!("DynamoDB_20120810.{}", self.operation);
        let body = String::from_utf8_lossy(request.body().bytes().unwrap_or_default());
        if request.headers().get("x-amz-target") == Some(target.as_str())
            && body.contains(self.needle)
        {
            cfg.interceptor_state().store_put(Replace);
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        if cfg.load::<Replace>().is_none() {
            return Ok(());
        }
        let mut response = aws_smithy_runtime_api::client::orchestrator::HttpResponse::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(200).expect("200 is a status"),
            aws_smithy_types::body::SdkBody::from(self.body.to_string()),
        );
        response
            .headers_mut()
            .insert("content-type", "application/x-amz-json-1.0");
        *context.response_mut() = response;
        Ok(())
    }
}

/// A fresh table for a spec and an applier writing it.
pub struct Fixture {
    pub client: aws_sdk_dynamodb::Client,
    pub table: String,
    pub spec: Arc<Spec>,
    pub applier: ddb_projector::apply::Applier,
}

/// A fresh table (named after `prefix`) for `spec`, and an applier with
/// the default configuration.
pub async fn fixture(spec: Arc<Spec>, prefix: &str) -> Fixture {
    let client = client().await;
    let table = fresh_table(&client, &spec, prefix).await;
    let applier = control::applier(
        client.clone(),
        spec.clone(),
        &table,
        ddb_projector::apply::ApplyConfig::default(),
    );
    Fixture {
        client,
        table,
        spec,
        applier,
    }
}

// ------------------------------------------------------------------ moto ---

/// The moto server of this test process (started on first use; stopped
/// when the process exits). `MOTO_SERVER` names its program, else the one
/// `scripts/test` installs in `.venv-tools`.
pub fn moto() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        let program = std::env::var("MOTO_SERVER")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| repo().join(".venv-tools/bin/moto_server"));
        assert!(
            program.exists(),
            "{} is missing: the recover and Kinesis tests need moto's server mode (real SQS and Kinesis APIs). \
             `scripts/test` installs it; or `python3 -m venv .venv-tools && .venv-tools/bin/pip install 'moto[server]'`, \
             or set MOTO_SERVER to a moto_server program",
            program.display()
        );
        let port = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            socket.local_addr().expect("its address").port()
        };
        let child = Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        // Stop it when this test process is gone.
        let watchdog = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; kill {} 2>/dev/null",
            std::process::id(),
            child.id()
        );
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the watchdog");
        std::mem::forget(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        format!("http://127.0.0.1:{port}")
    })
}

/// Runs `action` before the first request whose body holds every needle
/// (on its own thread and runtime: an interceptor cannot await).
#[derive(Clone)]
pub struct BeforeRequest {
    pub operation: &'static str,
    pub needles: &'static [&'static str],
    pub action: std::sync::Arc<dyn Fn() + Send + Sync>,
    pub fired: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for BeforeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeRequest")
            .field("needles", &self.needles)
            .finish()
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for BeforeRequest {
    fn name(&self) -> &'static str {
        "BeforeRequest"
    }

    fn read_before_transmit(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let request = context.request();
        let body = String::from_utf8_lossy(request.body().bytes().unwrap_or_default());
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        if target.ends_with(self.operation)
            && self.needles.iter().all(|needle| body.contains(needle))
            && self.fired.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0
        {
            let action = self.action.clone();
            std::thread::spawn(move || action()).join().unwrap();
        }
        Ok(())
    }
}
