//! The Lambda bootstrap through the real Runtime API protocol.
//!
//! The built binary runs as Lambda runs it (no arguments,
//! `AWS_LAMBDA_RUNTIME_API` set) against a small Runtime API emulator on
//! loopback that serves `/invocation/next` with Lambda's headers and takes
//! `/response`, `/error` and `/init/error`. Events are what Lambda would
//! deliver: items written to DynamoDB Local, read back from its stream and
//! reshaped as Lambda reshapes them (see `tests/fixtures/README.md`). Each
//! test then checks the answer (`batchItemFailures` or the error) and the
//! table.
//!
//! A transient failure is made real with a proxy between the function and
//! DynamoDB Local that drops the connection of every request naming one
//! user, for as long as the test says.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};

use super::model::{email, profile};
use super::support::{self, s};

type Attrs = HashMap<String, Av>;

// ------------------------------------------------------------ HTTP/1.1 ---

/// One HTTP/1.1 message: the start line, the headers and the whole body.
#[derive(Debug, Clone)]
struct Message {
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The message with its body length stated (chunks joined).
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.start);
        for (name, value) in &self.headers {
            if name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
            {
                continue;
            }
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!("Content-Length: {}\r\n\r\n", self.body.len()));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Reads one message; `None` when the peer closed the connection first.
async fn read_message<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Option<Message>> {
    let mut start = String::new();
    if reader.read_line(&mut start).await? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let mut message = Message {
        start: start.trim_end().to_string(),
        headers,
        body: Vec::new(),
    };
    if message
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|e| std::io::Error::other(format!("bad chunk size: {e}")))?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await?;
            if size == 0 {
                break;
            }
            message.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = message.header("content-length") {
        let length: usize = length.parse().map_err(std::io::Error::other)?;
        message.body = vec![0; length];
        reader.read_exact(&mut message.body).await?;
    }
    Ok(Some(message))
}

async fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.flush().await;
}

// ------------------------------------------------- Runtime API emulator ---

/// What the function answered to one invocation.
#[derive(Debug)]
enum Outcome {
    /// `POST /invocation/{id}/response`.
    Response(Value),
    /// `POST /invocation/{id}/error`.
    Error {
        error_type: Option<String>,
        body: Value,
    },
}

struct Invocation {
    id: String,
    body: Vec<u8>,
    deadline_ms: u64,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct ApiState {
    pending: HashMap<String, oneshot::Sender<Outcome>>,
    first_next: Option<Instant>,
    nexts: u32,
    init_error: Option<(Option<String>, Value)>,
}

/// The Lambda Runtime API (`2018-06-01`) on 127.0.0.1.
struct RuntimeApi {
    address: String,
    queue: mpsc::UnboundedSender<Invocation>,
    state: Arc<Mutex<ApiState>>,
    changed: Arc<Notify>,
    ids: AtomicU64,
}

impl RuntimeApi {
    async fn start() -> RuntimeApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().unwrap().to_string();
        let (queue, incoming) = mpsc::unbounded_channel::<Invocation>();
        let incoming = Arc::new(tokio::sync::Mutex::new(incoming));
        let state = Arc::new(Mutex::new(ApiState::default()));
        let changed = Arc::new(Notify::new());
        let (st, ch) = (state.clone(), changed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(stream, incoming.clone(), st.clone(), ch.clone()));
            }
        });
        RuntimeApi {
            address,
            queue,
            state,
            changed,
            ids: AtomicU64::new(0),
        }
    }

    /// Delivers an event whose deadline is `budget` from now and waits for
    /// the function's answer.
    async fn invoke(&self, body: Vec<u8>, budget: Duration) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let deadline_ms = (SystemTime::now() + budget)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        self.queue
            .send(Invocation {
                id: format!("8476a536-e9f4-11e8-9739-2dfe598c{n:04}"),
                body,
                deadline_ms,
                reply,
            })
            .expect("the emulator runs");
        tokio::time::timeout(budget + Duration::from_secs(30), answer)
            .await
            .expect("the function answers within its deadline (and some)")
            .expect("an answer")
    }

    async fn invoke_event(&self, event: &Value, budget: Duration) -> Outcome {
        self.invoke(serde_json::to_vec(event).unwrap(), budget)
            .await
    }

    /// When the function first asked for an invocation.
    fn first_next(&self) -> Option<Instant> {
        self.state.lock().unwrap().first_next
    }

    fn init_error(&self) -> Option<(Option<String>, Value)> {
        self.state.lock().unwrap().init_error.clone()
    }

    /// Waits until the function asks for its first invocation.
    async fn ready(&self) {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let notified = self.changed.notified();
                if self.first_next().is_some() {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("the function asks for an invocation");
    }
}

async fn serve(
    stream: TcpStream,
    incoming: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Invocation>>>,
    state: Arc<Mutex<ApiState>>,
    changed: Arc<Notify>,
) {
    let mut stream = BufReader::new(stream);
    while let Ok(Some(request)) = read_message(&mut stream).await {
        let mut parts = request.start.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let accepted = json!({ "status": "OK" }).to_string();
        match (method, path.strip_prefix("/2018-06-01/runtime/")) {
            ("GET", Some("invocation/next")) => {
                {
                    let mut state = state.lock().unwrap();
                    state.first_next.get_or_insert_with(Instant::now);
                    state.nexts += 1;
                }
                changed.notify_waiters();
                let Some(invocation) = incoming.lock().await.recv().await else {
                    return;
                };
                state
                    .lock()
                    .unwrap()
                    .pending
                    .insert(invocation.id.clone(), invocation.reply);
                let headers = [
                    ("Content-Type", "application/json".to_string()),
                    ("Lambda-Runtime-Aws-Request-Id", invocation.id.clone()),
                    ("Lambda-Runtime-Deadline-Ms", invocation.deadline_ms.to_string()),
                    (
                        "Lambda-Runtime-Invoked-Function-Arn",
                        "arn:aws:lambda:us-east-1:123456789012:function:projector-test".to_string(),
                    ),
                    (
                        "Lambda-Runtime-Trace-Id",
                        "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1"
                            .to_string(),
                    ),
                ];
                respond(stream.get_mut(), "200 OK", &headers, &invocation.body).await;
            }
            ("POST", Some("init/error")) => {
                let body = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                let error_type = request
                    .header("Lambda-Runtime-Function-Error-Type")
                    .map(str::to_string);
                state.lock().unwrap().init_error = Some((error_type, body));
                changed.notify_waiters();
                respond(stream.get_mut(), "202 Accepted", &[], accepted.as_bytes()).await;
            }
            ("POST", Some(rest)) if rest.starts_with("invocation/") => {
                let rest = &rest["invocation/".len()..];
                let (id, what) = rest.split_once('/').unwrap_or((rest, ""));
                let body: Value = serde_json::from_slice(&request.body).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&request.body).into_owned())
                });
                let outcome = match what {
                    "response" => Outcome::Response(body),
                    "error" => Outcome::Error {
                        error_type: request
                            .header("Lambda-Runtime-Function-Error-Type")
                            .map(str::to_string),
                        body,
                    },
                    _ => {
                        respond(stream.get_mut(), "404 Not Found", &[], b"{}").await;
                        continue;
                    }
                };
                let reply = state.lock().unwrap().pending.remove(id);
                match reply {
                    Some(reply) => {
                        let _ = reply.send(outcome);
                        respond(stream.get_mut(), "202 Accepted", &[], accepted.as_bytes()).await;
                    }
                    None => {
                        let body = json!({ "errorMessage": "unknown request id", "errorType": "InvalidRequestID" });
                        respond(
                            stream.get_mut(),
                            "400 Bad Request",
                            &[],
                            body.to_string().as_bytes(),
                        )
                        .await;
                    }
                }
            }
            _ => respond(stream.get_mut(), "404 Not Found", &[], b"{}").await,
        }
    }
}

// ------------------------------------------------------------- the function ---

/// The bootstrap process.
struct Function {
    child: tokio::process::Child,
    started: Instant,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Function {
    /// Starts `binary` as Lambda does: no arguments, the Runtime API's
    /// address and the function's variables in the environment.
    fn start(binary: &Path, api: &RuntimeApi, env: &[(&str, String)]) -> Function {
        let mut command = tokio::process::Command::new(binary);
        command
            .env_remove("PROJECTOR_TABLE")
            .env_remove("PROJECTOR_SPEC")
            .env_remove("PROJECTOR_LOG_FORMAT")
            .env_remove("RUST_LOG")
            .env("AWS_LAMBDA_RUNTIME_API", &api.address)
            .env("AWS_LAMBDA_FUNCTION_NAME", "projector-test")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/projector-test")
            .env(
                "AWS_LAMBDA_LOG_STREAM_NAME",
                "2026/11/22/[$LATEST]0123456789abcdef",
            );
        for (name, value) in support::env() {
            command.env(name, value);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = command.spawn().expect("start the bootstrap");
        let collect = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
            let text = Arc::new(Mutex::new(String::new()));
            let sink = text.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe.expect("piped")).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut sink = sink.lock().unwrap();
                    sink.push_str(&line);
                    sink.push('\n');
                }
            });
            text
        };
        let stdout = collect(child.stdout.take().map(|p| Box::new(p) as _));
        let stderr = collect(child.stderr.take().map(|p| Box::new(p) as _));
        Function {
            child,
            started,
            stdout,
            stderr,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The process's peak resident memory so far, in KiB (`VmHWM`).
    fn peak_memory_kib(&self) -> Option<u64> {
        let pid = self.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The EMF documents printed so far.
    fn emf(&self) -> Vec<Value> {
        self.stdout()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|doc| doc.get("_aws").is_some())
            .collect()
    }
}

fn spec_path(name: &str) -> PathBuf {
    support::repo().join("projections").join(name)
}

fn function_env(spec: &str, table: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![("PROJECTOR_SPEC", spec_path(spec).display().to_string())];
    if let Some(table) = table {
        env.push(("PROJECTOR_TABLE", table.to_string()));
    }
    env
}

// ------------------------------------------------ events from the stream ---

/// Every record of the table's stream so far, as Lambda delivers them.
pub(super) async fn stream_records(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Value> {
    let described = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .expect("describe table");
    let arn = described
        .table()
        .and_then(|t| t.latest_stream_arn())
        .expect("the table has a stream")
        .to_string();
    let streams = aws_sdk_dynamodbstreams::Client::new(&support::sdk_config().await);
    let description = streams
        .describe_stream()
        .stream_arn(&arn)
        .send()
        .await
        .expect("describe stream");
    let shards: Vec<String> = description
        .stream_description()
        .map(|d| {
            d.shards()
                .iter()
                .filter_map(|s| s.shard_id())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut records = Vec::new();
    for shard in shards {
        let mut iterator = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(&shard)
            .shard_iterator_type(aws_sdk_dynamodbstreams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .expect("shard iterator")
            .shard_iterator
            .map(|s| s.to_string());
        while let Some(current) = iterator {
            let page = streams
                .get_records()
                .shard_iterator(current)
                .limit(1000)
                .send()
                .await
                .expect("get records");
            if page.records().is_empty() {
                break;
            }
            records.extend(page.records().iter().map(|r| lambda_record(r, &arn)));
            iterator = page.next_shard_iterator().map(str::to_string);
        }
    }
    records.sort_by_key(|r| seq(r).parse::<u128>().unwrap_or(0));
    records
}

/// A Streams API record reshaped as Lambda delivers it.
fn lambda_record(record: &aws_sdk_dynamodbstreams::types::Record, stream_arn: &str) -> Value {
    let change = record.dynamodb().expect("a stream record");
    let image = |map: Option<&HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>>| {
        map.filter(|m| !m.is_empty())
            .map(|m| serde_json::to_value(ddb_projector::record::Item::from(m.clone())).unwrap())
    };
    let mut dynamodb = json!({
        "ApproximateCreationDateTime": change.approximate_creation_date_time().map(|t| t.secs()),
        "Keys": image(change.keys()),
        "SequenceNumber": change.sequence_number(),
        "SizeBytes": change.size_bytes(),
        "StreamViewType": change.stream_view_type().map(|v| v.as_str()),
    });
    if let Some(new) = image(change.new_image()) {
        dynamodb["NewImage"] = new;
    }
    if let Some(old) = image(change.old_image()) {
        dynamodb["OldImage"] = old;
    }
    json!({
        "eventID": record.event_id(),
        "eventName": record.event_name().map(|n| n.as_str()),
        "eventVersion": record.event_version(),
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": dynamodb,
        "eventSourceARN": stream_arn.replacen("ddblocal:000000000000", "us-east-1:123456789012", 1),
    })
}

fn seq(record: &Value) -> &str {
    record["dynamodb"]["SequenceNumber"]
        .as_str()
        .expect("a sequence number")
}

fn event(records: &[Value]) -> Value {
    json!({ "Records": records })
}

/// The records from `from` (a reported sequence number) on: what Lambda
/// delivers again after a partial failure.
fn from_seq(records: &[Value], from: &str) -> Vec<Value> {
    let position = records
        .iter()
        .position(|r| seq(r) == from)
        .expect("the reported sequence number is in the batch");
    records[position..].to_vec()
}

fn failures(outcome: &Outcome) -> Vec<String> {
    match outcome {
        Outcome::Response(body) => body["batchItemFailures"]
            .as_array()
            .unwrap_or_else(|| panic!("a DynamoDbEventResponse: {body}"))
            .iter()
            .map(|f| {
                f["itemIdentifier"]
                    .as_str()
                    .expect("an identifier")
                    .to_string()
            })
            .collect(),
        Outcome::Error { error_type, body } => {
            panic!("the invocation failed: {error_type:?} {body}")
        }
    }
}

// ------------------------------------------------------ user-service data ---

async fn put(client: &aws_sdk_dynamodb::Client, table: &str, item: Attrs) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .send()
        .await
        .expect("put item");
}

/// Writes a profile and two emails (the first primary) for each user.
async fn write_users(client: &aws_sdk_dynamodb::Client, table: &str, users: &[&str]) {
    for user in users {
        put(client, table, profile(user)).await;
        put(
            client,
            table,
            email(user, "e1", &format!(" {user}@Example.com "), true),
        )
        .await;
        put(
            client,
            table,
            email(user, "e2", &format!("{user}.work@example.com"), false),
        )
        .await;
    }
}

/// What the projections should have made of one user's items, and what they did.
async fn check_user(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    user: &str,
) -> Result<(), String> {
    let pk = format!("USER#{user}");
    for (id, address) in [
        ("e1", format!("{user}@example.com")),
        ("e2", format!("{user}.work@example.com")),
    ] {
        let item = support::get(client, table, &pk, &format!("EMAIL#{id}"))
            .await
            .ok_or(format!("{pk} EMAIL#{id} is missing"))?;
        let want = (Some(format!("EMAIL#{address}")), Some(pk.clone()));
        let have = (
            support::text(&item, "GSI1PK"),
            support::text(&item, "GSI1SK"),
        );
        if have != want {
            return Err(format!("{pk} EMAIL#{id}: GSI keys {have:?}, want {want:?}"));
        }
    }
    let profile = support::get(client, table, &pk, "PROFILE")
        .await
        .ok_or(format!("{pk} PROFILE is missing"))?;
    let want = format!(" {user}@Example.com ");
    match support::text(&profile, "email") {
        Some(have) if have == want => Ok(()),
        have => Err(format!("{pk} PROFILE: email {have:?}, want {want:?}")),
    }
}

/// Whether nothing derived exists for a user (no GSI keys, no copied email).
async fn untouched(client: &aws_sdk_dynamodb::Client, table: &str, user: &str) -> bool {
    let pk = format!("USER#{user}");
    for sk in ["PROFILE", "EMAIL#e1", "EMAIL#e2"] {
        let item = support::get(client, table, &pk, sk)
            .await
            .expect("the source item");
        if item.contains_key("GSI1PK")
            || item.contains_key("GSI1SK")
            || (sk == "PROFILE" && item.contains_key("email"))
        {
            return false;
        }
    }
    true
}

pub(super) async fn dead_letters(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| support::text(item, "PK").as_deref() == Some("_ddbp#dlq"))
        .collect()
}

/// A user-service table with the given users' items, and its stream as a
/// Lambda batch.
async fn user_batch(
    prefix: &str,
    users: &[&str],
) -> (aws_sdk_dynamodb::Client, String, Vec<Value>) {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, prefix).await;
    write_users(&client, &table, users).await;
    let records = stream_records(&client, &table).await;
    assert_eq!(records.len(), 3 * users.len());
    (client, table, records)
}

const GENEROUS: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------ tests ---

#[tokio::test]
async fn lambda_applies_a_whole_batch_and_reports_no_failure() {
    let started = Instant::now();
    let (client, table, records) = user_batch("lambda-ok", &["u1", "u2", "u3"]).await;
    let api = RuntimeApi::start().await;
    // No PROJECTOR_TABLE: the table comes from the records' eventSourceARN.
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", None),
    );
    api.ready().await;

    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    for user in ["u1", "u2", "u3"] {
        check_user(&client, &table, user).await.unwrap();
    }

    // A warm invocation with the same batch again (Lambda retries, replays)
    // changes nothing.
    let before = support::scan_all(&client, &table).await;
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(failures(&outcome), Vec::<String>::new());
    assert_eq!(support::scan_all(&client, &table).await, before);

    // JSON logs on stderr, EMF metrics on stdout once per invocation.
    let stderr = function.stderr();
    let done: Vec<Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "batch done")
        .collect();
    assert_eq!(done.len(), 2, "{stderr}");
    assert_eq!(done[0]["records"], 9);
    assert_eq!(done[0]["table"], table.as_str());
    // Every line of an invocation carries the keys AWS Lambda Powertools
    // puts on each line; the first invocation is the cold start.
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap_or_else(|_| panic!("not JSON: {line}"))
        })
        .collect();
    let in_invocations: Vec<&Value> = lines
        .iter()
        .filter(|line| line.get("function_request_id").is_some())
        .collect();
    assert!(in_invocations.len() >= 2, "{stderr}");
    for line in &lines {
        assert_eq!(line["service"], "ddb-projector", "{line}");
        assert!(
            line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{line}"
        );
        assert!(
            line["level"].is_string() && line["message"].is_string(),
            "{line}"
        );
    }
    for line in &in_invocations {
        assert_eq!(
            line["xray_trace_id"],
            "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1",
            "{line}"
        );
        assert_eq!(line["function_name"], "projector-test", "{line}");
        assert_eq!(line["function_memory_size"], 128, "{line}");
        assert!(line["cold_start"].is_boolean(), "{line}");
    }
    assert_eq!(done[0]["cold_start"], true, "{stderr}");
    assert_eq!(done[1]["cold_start"], false, "{stderr}");
    assert_ne!(
        done[0]["function_request_id"],
        done[1]["function_request_id"]
    );
    // Lines outside an invocation (init's `ready`) are the only ones
    // without a request id.
    assert!(
        lines
            .iter()
            .filter(|line| line.get("function_request_id").is_none())
            .all(|line| line["message"] == "ready"),
        "{stderr}"
    );
    let emf = function.emf();
    let request_ids: std::collections::BTreeSet<&str> = emf
        .iter()
        .filter_map(|doc| doc["RequestId"].as_str())
        .collect();
    assert_eq!(request_ids.len(), 2, "one flush per invocation: {emf:#?}");
    let first = emf[0]["RequestId"].as_str().unwrap();
    let records_counted: u64 = emf
        .iter()
        .filter(|doc| doc["RequestId"] == first && doc.get("status").is_some())
        .filter_map(|doc| doc["projector_records_total"].as_u64())
        .sum();
    assert_eq!(records_counted, 9, "{emf:#?}");
    for doc in &emf {
        assert_eq!(doc["FunctionName"], "projector-test");
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "DdbProjector"
        );
    }
    assert!(
        emf.iter()
            .any(|doc| doc.get("projector_iterator_age_ms").is_some()),
        "{emf:#?}"
    );
    // The lag from each change to its effects, per projection.
    let lagged: std::collections::BTreeSet<&str> = emf
        .iter()
        .filter(|doc| doc["RequestId"] == first && doc.get("projector_lag_seconds").is_some())
        .filter_map(|doc| doc["projection"].as_str())
        .collect();
    assert!(
        lagged.contains("email-gsi1-keys") && lagged.contains("profile-primary-email"),
        "{lagged:?} {emf:#?}"
    );
    assert!(
        emf.iter().any(
            |doc| doc["RequestId"] == first && doc.get("projector_batch_lag_seconds").is_some()
        ),
        "{emf:#?}"
    );
    eprintln!("lambda_applies_a_whole_batch: {:?}", started.elapsed());
}

/// A proxy to DynamoDB Local that drops the connection of every request
/// whose body contains `marker` while `blocking` is set.
struct DroppingProxy {
    endpoint: String,
    blocking: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
}

impl DroppingProxy {
    async fn start(marker: &'static str) -> DroppingProxy {
        let upstream = support::endpoint()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let blocking = Arc::new(AtomicBool::new(true));
        let dropped = Arc::new(AtomicU64::new(0));
        let (b, d) = (blocking.clone(), dropped.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, blocking, dropped) = (upstream.clone(), b.clone(), d.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client, mut server) = (BufReader::new(client), BufReader::new(server));
                    while let Ok(Some(request)) = read_message(&mut client).await {
                        let text = String::from_utf8_lossy(&request.body);
                        if blocking.load(Ordering::SeqCst) && text.contains(marker) {
                            dropped.fetch_add(1, Ordering::SeqCst);
                            return; // both connections close, no answer
                        }
                        if server
                            .get_mut()
                            .write_all(&request.to_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let Ok(Some(response)) = read_message(&mut server).await else {
                            return;
                        };
                        if client
                            .get_mut()
                            .write_all(&response.to_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        DroppingProxy {
            endpoint,
            blocking,
            dropped,
        }
    }
}

#[tokio::test]
async fn lambda_reports_a_transient_failure_at_its_sequence_number_and_a_redelivery_converges() {
    let started = Instant::now();
    let users = ["u1", "u2", "u3", "u4", "u5", "u6"];
    let (client, table, records) = user_batch("lambda-transient", &users).await;
    let proxy = DroppingProxy::start("USER#u4").await;
    let api = RuntimeApi::start().await;
    let mut env = function_env("user-service.toml", Some(&table));
    env.push(("AWS_ENDPOINT_URL", proxy.endpoint.clone()));
    let function = Function::start(support::binary(), &api, &env);
    api.ready().await;

    // Every request about u4 fails at the connection: its writes are retried
    // for a bounded time, then its records fail; the others apply.
    let outcome = api
        .invoke_event(&event(&records), Duration::from_secs(9))
        .await;
    let first_u4 = records
        .iter()
        .find(|r| r["dynamodb"]["Keys"]["PK"]["S"] == "USER#u4")
        .map(|r| seq(r).to_string())
        .unwrap();
    assert_eq!(
        failures(&outcome),
        std::slice::from_ref(&first_u4),
        "{}",
        function.stderr()
    );
    assert!(proxy.dropped.load(Ordering::SeqCst) > 1);
    for user in ["u1", "u2", "u3", "u5", "u6"] {
        check_user(&client, &table, user).await.unwrap();
    }
    assert!(check_user(&client, &table, "u4").await.is_err());
    assert!(dead_letters(&client, &table).await.is_empty());

    // The network heals; Lambda delivers the batch again from the reported
    // record: u4 converges, and applying u5 and u6 again changes nothing.
    proxy.blocking.store(false, Ordering::SeqCst);
    let rest = from_seq(&records, &first_u4);
    assert_eq!(rest.len(), 9);
    let outcome = api.invoke_event(&event(&rest), GENEROUS).await;
    assert_eq!(failures(&outcome), Vec::<String>::new());
    for user in users {
        check_user(&client, &table, user).await.unwrap();
    }
    assert!(dead_letters(&client, &table).await.is_empty());
    eprintln!(
        "lambda_reports_a_transient_failure: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn lambda_dead_letters_poison_records_and_the_batch_succeeds() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "lambda-poison").await;
    write_users(&client, &table, &["u1"]).await;
    // An email whose address is a map: its index key cannot be rendered.
    let mut poison = email("u2", "e1", "", false);
    poison.insert(
        "email".into(),
        Av::M(HashMap::from([("local".to_string(), s("x"))])),
    );
    put(&client, &table, poison).await;
    // A record that will not even decode (see below).
    put(&client, &table, profile("u9")).await;
    write_users(&client, &table, &["u3"]).await;
    let mut records = stream_records(&client, &table).await;
    assert_eq!(records.len(), 8);
    assert_eq!(records[4]["dynamodb"]["Keys"]["PK"]["S"], "USER#u9");
    records[4]["eventName"] = json!("TRUNCATE");

    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    check_user(&client, &table, "u1").await.unwrap();
    check_user(&client, &table, "u3").await.unwrap();
    let letters = dead_letters(&client, &table).await;
    assert_eq!(letters.len(), 2, "{letters:#?}");
    let errors: Vec<String> = letters
        .iter()
        .filter_map(|l| support::text(l, "error"))
        .collect();
    assert!(errors.iter().any(|e| e.contains("TRUNCATE")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("`email`")), "{errors:?}");
    eprintln!(
        "lambda_dead_letters_poison_records: {:?}",
        started.elapsed()
    );
}

/// A Kinesis Data Streams for DynamoDB change as Lambda delivers it from a
/// Kinesis stream: `data` base64, the Kinesis sequence number beside it.
fn kinesis_record(data: &[u8], n: usize) -> Value {
    let seq = format!(
        "4959033827149025660855969253836157109592157598913658{:04}",
        n
    );
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": format!("p{n}"),
            "sequenceNumber": seq,
            "data": aws_smithy_types::base64::encode(data),
            "approximateArrivalTimestamp": 1_764_000_000.5,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("shardId-000000000001:{seq}"),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/projector",
        "awsRegion": "us-east-1",
        "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/table-changes",
    })
}

/// The function fed a Kinesis stream's batch (through the Runtime API,
/// as Lambda's Kinesis event source mapping sends it): every change twice,
/// newest first then oldest first, with bad data and another table's
/// change among them. The table ends exact, nothing is reported failed,
/// and each bad record is a dead letter naming its problem.
#[tokio::test]
async fn lambda_applies_a_kinesis_batch_duplicated_and_reversed_and_letters_bad_data() {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "lambda-kinesis").await;
    write_users(&client, &table, &["u1", "u2"]).await;
    let changes: Vec<Value> = stream_records(&client, &table)
        .await
        .iter()
        .map(|record| super::kinesis::change_data(record, &table, false))
        .collect();
    let mut data: Vec<Vec<u8>> = changes
        .iter()
        .rev()
        .chain(changes.iter())
        .map(|change| change.to_string().into_bytes())
        .collect();
    let mut other = changes[0].clone();
    other["tableName"] = json!("orders-table");
    data.insert(3, other.to_string().into_bytes());
    data.insert(5, br#"{"hello": "world"}"#.to_vec());
    let mut records: Vec<Value> = data
        .iter()
        .enumerate()
        .map(|(n, data)| kinesis_record(data, n))
        .collect();
    // Truncated base64.
    let truncated = kinesis_record(changes[1].to_string().as_bytes(), data.len());
    let mut cut = truncated.clone();
    let text = truncated["kinesis"]["data"].as_str().unwrap();
    cut["kinesis"]["data"] = json!(&text[..text.len() - 3]);
    records.insert(7, cut);

    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    check_user(&client, &table, "u1").await.unwrap();
    check_user(&client, &table, "u2").await.unwrap();
    let letters = dead_letters(&client, &table).await;
    let errors: Vec<String> = letters
        .iter()
        .filter_map(|l| support::text(l, "error"))
        .collect();
    assert_eq!(letters.len(), 3, "{errors:#?}");
    for expected in ["`orders-table`", "no `dynamodb` object", "not valid base64"] {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "no letter says {expected}: {errors:#?}"
        );
    }
    // Each letter keeps its record whole.
    assert!(
        letters
            .iter()
            .all(|l| support::text(l, "record").is_some_and(|r| r.len() > 20)),
        "{letters:#?}"
    );
    // The same batch again (Lambda retries after a timeout) changes no
    // derived item.
    let before = support::scan_all(&client, &table).await;
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(failures(&outcome), Vec::<String>::new());
    let derived = |items: Vec<HashMap<String, Av>>| -> Vec<HashMap<String, Av>> {
        items
            .into_iter()
            .filter(|i| !support::text(i, "PK").is_some_and(|pk| pk.starts_with("_ddbp#")))
            .collect()
    };
    assert_eq!(
        derived(support::scan_all(&client, &table).await),
        derived(before)
    );
}

#[tokio::test]
async fn lambda_with_too_little_time_reports_the_batch_failed_and_writes_nothing() {
    let started = Instant::now();
    let (client, table, records) = user_batch("lambda-deadline", &["u1", "u2"]).await;
    let before = support::scan_all(&client, &table).await;
    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;

    // 1 s left, less than the 1.5 s margin: no write may start.
    let outcome = api
        .invoke_event(&event(&records), Duration::from_millis(1000))
        .await;
    assert_eq!(
        failures(&outcome),
        [seq(&records[0]).to_string()],
        "{}",
        function.stderr()
    );
    assert_eq!(support::scan_all(&client, &table).await, before);
    for user in ["u1", "u2"] {
        assert!(untouched(&client, &table, user).await);
    }

    // Delivered again with time to spare, it converges.
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(failures(&outcome), Vec::<String>::new());
    for user in ["u1", "u2"] {
        check_user(&client, &table, user).await.unwrap();
    }
    eprintln!("lambda_with_too_little_time: {:?}", started.elapsed());
}

#[tokio::test]
async fn lambda_refuses_a_body_that_is_not_a_streams_event_and_writes_nothing() {
    let started = Instant::now();
    let (client, table, records) = user_batch("lambda-malformed", &["u1"]).await;
    let before = support::scan_all(&client, &table).await;
    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;

    for (body, says) in [
        (
            br#"{"Items": [{"PK": "USER#u1"}]}"#.to_vec(),
            "no `Records` array",
        ),
        (b"[1, 2, 3]".to_vec(), "DynamoDB Streams event"),
        (b"not json at all".to_vec(), "expected"),
    ] {
        match api.invoke(body, GENEROUS).await {
            Outcome::Error { body, .. } => {
                let message = body["errorMessage"].as_str().unwrap_or_default();
                assert!(message.contains(says), "{message}");
            }
            other => panic!("expected an invocation error, got {other:?}"),
        }
        assert_eq!(support::scan_all(&client, &table).await, before);
    }
    // The environment survives and serves the next event.
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    check_user(&client, &table, "u1").await.unwrap();
    eprintln!("lambda_refuses_a_body: {:?}", started.elapsed());
}

#[tokio::test]
async fn lambda_init_fails_clearly_without_a_usable_spec() {
    let started = Instant::now();
    for (env, says, kind) in [
        // Without a spec file the function serves the registry, which a
        // named consumer does not.
        (
            vec![("PROJECTOR_CONSUMER", "ads".to_string())],
            "registrations are served by the table's unnamed consumer",
            "Projector.InvalidConfiguration",
        ),
        (
            vec![("PROJECTOR_SPEC", "/var/task/nope.toml".to_string())],
            "/var/task/nope.toml: cannot read the spec file",
            "Projector.InvalidSpec",
        ),
    ] {
        let api = RuntimeApi::start().await;
        let mut function = Function::start(support::binary(), &api, &env);
        let status = tokio::time::timeout(Duration::from_secs(30), function.child.wait())
            .await
            .expect("init fails fast")
            .expect("exit status");
        assert!(!status.success());
        let (error_type, body) = api.init_error().expect("an init error is posted");
        assert_eq!(error_type.as_deref(), Some(kind));
        assert_eq!(body["errorType"], kind);
        let message = body["errorMessage"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(api.first_next().is_none(), "no invocation is asked for");
        // The pipe may still be draining after the exit.
        for _ in 0..100 {
            if function.stderr().contains(says) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(function.stderr().contains(says), "{}", function.stderr());
    }
    eprintln!("lambda_init_fails_clearly: {:?}", started.elapsed());
}

// --------------------------------------------------------------- backfill ---

/// Users whose items were written before the function was deployed: no
/// stream record of them is ever delivered.
fn backfill_users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b{i:03}")).collect()
}

fn backfill_payload(segment: u32, total: u32) -> Value {
    json!({ "backfill": { "segment": segment, "totalSegments": total, "pageSize": 10 } })
}

/// The error type and message of an invocation error.
fn invocation_error(outcome: &Outcome) -> (String, String) {
    match outcome {
        Outcome::Error { body, .. } => (
            body["errorType"].as_str().unwrap_or_default().to_string(),
            body["errorMessage"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
        Outcome::Response(body) => panic!("expected an invocation error, got {body}"),
    }
}

/// The table without the projector's own items (backfill checkpoints).
async fn source_and_derived(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| !support::text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#")))
        .collect()
}

/// The state machine's way: a claim under the execution's name, then the
/// slices of every segment with that name; the slice that finds every
/// segment done records the projections as backfilled, and the name cannot
/// be claimed again.
#[tokio::test]
async fn lambda_claims_a_run_and_its_last_slice_records_the_backfill() {
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "lambda-claim").await;
    let users = backfill_users(20);
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    write_users(&client, &table, &names).await;
    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;
    let invoke = |request: Value| {
        let api = &api;
        async move {
            api.invoke_event(&json!({ "backfill": request }), GENEROUS)
                .await
        }
    };
    let Outcome::Response(body) = invoke(json!({
        "totalSegments": 2, "run": "exec-1", "claim": true,
    }))
    .await
    else {
        panic!("{}", function.stderr());
    };
    assert_eq!(body["claimed"], true, "{body}");
    assert_eq!(body["scanned"], 0, "{body}");
    let registry = ddb_projector::control::Registry::new(client.clone(), &table, &spec.table);
    let snapshot = registry.snapshot(&spec).await.unwrap();
    for projection in &spec.projections {
        let claim = snapshot.record(&projection.name).claim.expect("claimed");
        assert_eq!(claim.run, "exec-1");
    }
    let mut recorded = Vec::new();
    for segment in 0..2 {
        let Outcome::Response(body) = invoke(json!({
            "segment": segment, "totalSegments": 2, "run": "exec-1",
        }))
        .await
        else {
            panic!("{}", function.stderr());
        };
        assert_eq!(body["done"], true, "{body}");
        recorded.push(body["backfilled"].clone());
    }
    assert_eq!(
        recorded,
        vec![
            json!([]),
            json!(["email-gsi1-keys", "profile-primary-email"])
        ],
        "only the slice that finds every segment done records them"
    );
    let snapshot = registry.snapshot(&spec).await.unwrap();
    for projection in &spec.projections {
        let record = snapshot.record(&projection.name);
        let done = record.backfilled.expect("backfilled");
        assert_eq!(done.run, "exec-1");
        assert_eq!(
            done.fingerprint,
            ddb_projector::control::hex(projection.fingerprint)
        );
        assert!(record.claim.is_none());
    }
    // The finished run's name claims nothing: its checkpoints say done, so
    // a claim would record a backfill that scanned nothing.
    let outcome = invoke(json!({"totalSegments": 2, "run": "exec-1", "claim": true})).await;
    let (error_type, message) = invocation_error(&outcome);
    assert_eq!(error_type, "Projector.InvalidBackfillRequest", "{message}");
    assert!(
        message.contains("already claimed `email-gsi1-keys` once"),
        "{message}"
    );
}

#[tokio::test]
async fn lambda_backfills_each_segment_in_slices_until_done_and_stream_events_still_work() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "lambda-backfill").await;
    let users = backfill_users(100);
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    write_users(&client, &table, &names).await;
    for user in &users {
        assert!(untouched(&client, &table, user).await);
    }

    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;

    // 1.6 s per invocation against the default 1.5 s margin: writes may
    // start for 0.1 s only, so each invocation scans a page or a few of 10
    // items and answers "not done"; the segments are driven in turn, as a
    // state machine with two iterations would.
    const TOTAL: u32 = 2;
    let budget = Duration::from_millis(1600);
    let mut done = [false; TOTAL as usize];
    let mut invocations = [0u32; TOTAL as usize];
    let mut timeouts = 0u32;
    let mut scanned = 0u64;
    while done.contains(&false) {
        for segment in 0..TOTAL {
            if done[segment as usize] {
                continue;
            }
            invocations[segment as usize] += 1;
            assert!(
                invocations[segment as usize] <= 200,
                "segment {segment} is not done after 200 invocations:\n{}",
                function.stderr()
            );
            let outcome = api
                .invoke_event(&backfill_payload(segment, TOTAL), budget)
                .await;
            match &outcome {
                Outcome::Response(body) => {
                    assert_eq!(body["segment"], segment, "{body}");
                    assert_eq!(body["totalSegments"], TOTAL, "{body}");
                    assert_eq!(body["table"], table.as_str(), "{body}");
                    assert_eq!(body["deadLetters"], 0, "{body}");
                    assert_eq!(
                        body["projections"],
                        json!(["email-gsi1-keys", "profile-primary-email"])
                    );
                    scanned += body["scanned"].as_u64().expect("scanned");
                    done[segment as usize] = body["done"].as_bool().expect("done");
                }
                // A page still being written at the deadline: the state
                // machine retries that error, and so does this loop.
                Outcome::Error { .. } => {
                    let (error_type, message) = invocation_error(&outcome);
                    assert_eq!(error_type, "Projector.BackfillTimeout", "{message}");
                    timeouts += 1;
                }
            }
        }
    }
    eprintln!(
        "backfill: invocations per segment {invocations:?}, {timeouts} timed out, {scanned} items scanned"
    );
    assert!(
        invocations.iter().all(|&n| n > 1),
        "each segment took several slices: {invocations:?}"
    );
    // The checkpoints live in the table, so a segment may also scan the
    // other's; every source item is scanned at least once. An invocation
    // that timed out answers no count, though the pages it finished before
    // its deadline are checkpointed (a loaded machine times out more: 295
    // of 300 reported with timeouts); the items are checked below.
    if timeouts == 0 {
        assert!(scanned >= 300, "{scanned}");
    }
    for user in &users {
        check_user(&client, &table, user).await.unwrap();
    }
    let indexed = source_and_derived(&client, &table)
        .await
        .iter()
        .filter(|item| item.contains_key("GSI1PK"))
        .count();
    assert_eq!(indexed, 200, "exactly the emails carry index keys");
    assert!(dead_letters(&client, &table).await.is_empty());

    // A done segment answers done at once; started over, it finds
    // everything right and writes nothing.
    let before = source_and_derived(&client, &table).await;
    let mut rescanned = 0;
    for segment in 0..TOTAL {
        let Outcome::Response(body) = api
            .invoke_event(&backfill_payload(segment, TOTAL), GENEROUS)
            .await
        else {
            panic!("{}", function.stderr());
        };
        assert_eq!(body["done"], true, "{body}");
        assert_eq!(body["scanned"], 0, "{body}");
        let restart = json!({ "backfill": {
            "segment": segment, "totalSegments": TOTAL, "restart": true,
            "projections": ["email-gsi1-keys"],
        }});
        let Outcome::Response(body) = api.invoke_event(&restart, GENEROUS).await else {
            panic!("{}", function.stderr());
        };
        assert_eq!(body["done"], true, "{body}");
        rescanned += body["scanned"].as_u64().expect("scanned");
        assert_eq!(body["writes"], 0, "{body}");
        assert_eq!(body["projections"], json!(["email-gsi1-keys"]));
    }
    assert!(rescanned >= 300, "{rescanned}");
    assert_eq!(source_and_derived(&client, &table).await, before);

    // The same environment still serves stream events.
    write_users(&client, &table, &["s1"]).await;
    let records: Vec<Value> = stream_records(&client, &table)
        .await
        .into_iter()
        .filter(|r| r["dynamodb"]["Keys"]["PK"]["S"] == "USER#s1")
        .collect();
    assert_eq!(records.len(), 3);
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    check_user(&client, &table, "s1").await.unwrap();

    // Logs and metrics like the stream path's.
    let stderr = function.stderr();
    let slices = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "backfill slice done")
        .count();
    assert!(slices >= 4, "{stderr}");
    let emf = function.emf();
    assert!(
        emf.iter().any(|doc| doc["outcome"] == "done"
            && doc.get("projector_backfill_invocations_total").is_some()),
        "{emf:#?}"
    );
    assert!(
        emf.iter()
            .any(|doc| doc.get("projector_backfill_items_scanned_total").is_some()),
        "{emf:#?}"
    );
    eprintln!("lambda_backfills_each_segment: {:?}", started.elapsed());
}

#[tokio::test]
async fn lambda_refuses_a_backfill_request_it_cannot_run_and_writes_nothing() {
    let started = Instant::now();
    let (client, table, records) = user_batch("lambda-backfill-bad", &["u1"]).await;
    let before = support::scan_all(&client, &table).await;
    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("user-service.toml", Some(&table)),
    );
    api.ready().await;

    let invalid = "Projector.InvalidBackfillRequest";
    for (backfill, error_type, says) in [
        (
            json!({ "projections": ["email-gsi1-keys", "emial-keys"], "totalSegments": 2 }),
            invalid,
            "no projection `emial-keys` in",
        ),
        (
            json!({ "segment": 2, "totalSegments": 2 }),
            invalid,
            "segment 2 is out of range for totalSegments 2",
        ),
        (json!({ "totalSegments": 0 }), invalid, "totalSegments is 0"),
        (
            json!({ "dryRun": true }),
            invalid,
            "dryRun is not supported",
        ),
        // Refused while the payload is read, before the handler runs.
        (json!({ "segement": 1 }), "", "unknown field `segement`"),
        (json!([0, 2]), "", "a `backfill` object"),
    ] {
        let outcome = api
            .invoke_event(&json!({ "backfill": backfill }), GENEROUS)
            .await;
        let (have_type, message) = invocation_error(&outcome);
        if !error_type.is_empty() {
            assert_eq!(have_type, error_type, "{message}");
        }
        assert!(message.contains(says), "{message}");
        assert_eq!(support::scan_all(&client, &table).await, before);
    }
    // Less time than the margin: no page could start, and "not done" would
    // be answered forever.
    let outcome = api
        .invoke_event(&backfill_payload(0, 1), Duration::from_millis(1000))
        .await;
    let (error_type, message) = invocation_error(&outcome);
    assert_eq!(error_type, "Projector.BackfillTimeout");
    assert!(message.contains("less time left"), "{message}");
    assert_eq!(support::scan_all(&client, &table).await, before);

    // The environment survives and serves the next event.
    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    check_user(&client, &table, "u1").await.unwrap();
    eprintln!("lambda_refuses_a_backfill_request: {:?}", started.elapsed());
}

/// Cold start and peak memory of the release build on a 10,000-record batch
/// (`cargo build --release`, then
/// `cargo test --test tests lambda_cold_start -- --ignored --nocapture`).
/// Prints the numbers; nothing is timed in an assertion.
#[tokio::test]
#[ignore = "a measurement: needs the release build"]
async fn lambda_cold_start_and_peak_memory_on_10000_records() {
    let binary = std::env::var_os("PROJECTOR_RELEASE_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::repo().join("target/release/ddb-projector"));
    assert!(
        binary.exists(),
        "build it first: cargo build --release ({})",
        binary.display()
    );
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "lambda-bench").await;

    // 5,000 users with a profile and an email each, written 25 at a time.
    let mut items = Vec::new();
    for i in 0..5000 {
        let user = format!("u{i:05}");
        items.push(profile(&user));
        items.push(email(&user, "e1", &format!("{user}@example.com"), true));
    }
    for chunk in items.chunks(25) {
        let requests = chunk
            .iter()
            .map(|item| {
                aws_sdk_dynamodb::types::WriteRequest::builder()
                    .put_request(
                        aws_sdk_dynamodb::types::PutRequest::builder()
                            .set_item(Some(item.clone()))
                            .build()
                            .unwrap(),
                    )
                    .build()
            })
            .collect();
        let output = client
            .batch_write_item()
            .request_items(&table, requests)
            .send()
            .await
            .expect("batch write");
        assert!(output.unprocessed_items().is_none_or(|u| u.is_empty()));
    }
    let records = stream_records(&client, &table).await;
    assert_eq!(records.len(), 10_000);
    let body = serde_json::to_vec(&event(&records)).unwrap();
    if let Some(path) = std::env::var_os("PROJECTOR_BENCH_EVENT_OUT") {
        // For profiling by hand: the event and the table it belongs to.
        std::fs::write(&path, &body).expect("write the event");
        eprintln!(
            "event written to {}; table {table}",
            PathBuf::from(path).display()
        );
    }

    // Cold starts: a fresh process each time, to its first request for an
    // invocation; the median of several (the machine is shared).
    let env = function_env("user-service.toml", Some(&table));
    let mut inits = Vec::new();
    for _ in 0..9 {
        let api = RuntimeApi::start().await;
        let function = Function::start(&binary, &api, &env);
        api.ready().await;
        inits.push(api.first_next().unwrap() - function.started);
    }
    inits.sort();
    let init = inits[inits.len() / 2];

    let api = RuntimeApi::start().await;
    let function = Function::start(&binary, &api, &env);
    api.ready().await;
    let invoked = Instant::now();
    let outcome = api.invoke(body.clone(), Duration::from_secs(900)).await;
    let elapsed = invoked.elapsed();
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    let peak = function.peak_memory_kib().expect("/proc/<pid>/status");
    check_user_bench(&client, &table).await;
    println!(
        "cold start (process start to the first /next, median of {}): {:.1} ms (fastest {:.1} ms); 10,000-record batch ({:.1} MB event): {:.2} s; peak memory (VmHWM): {:.1} MB",
        inits.len(),
        init.as_secs_f64() * 1000.0,
        inits[0].as_secs_f64() * 1000.0,
        body.len() as f64 / 1e6,
        elapsed.as_secs_f64(),
        peak as f64 / 1024.0
    );
}

async fn check_user_bench(client: &aws_sdk_dynamodb::Client, table: &str) {
    for user in ["u00000", "u02500", "u04999"] {
        let item = support::get(client, table, &format!("USER#{user}"), "EMAIL#e1")
            .await
            .unwrap();
        assert_eq!(
            support::text(&item, "GSI1PK"),
            Some(format!("EMAIL#{user}@example.com"))
        );
        let profile = support::get(client, table, &format!("USER#{user}"), "PROFILE")
            .await
            .unwrap();
        assert_eq!(
            support::text(&profile, "email"),
            Some(format!("{user}@example.com"))
        );
    }
}

// ------------------------------------------------------------------ audit ---

fn audit_payload(run: &str, segment: u32, total: u32, extra: Value) -> Value {
    let mut request = json!({
        "run": run, "segment": segment, "totalSegments": total,
        "pageSize": 2, "maxPages": 1,
    });
    if let (Some(request), Some(extra)) = (request.as_object_mut(), extra.as_object()) {
        request.extend(extra.clone());
    }
    json!({ "audit": request })
}

/// The `audit finding` lines the function has logged.
fn logged_findings(function: &Function) -> usize {
    function
        .stderr()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "audit finding")
        .count()
}

/// The EMF documents counting an audit run with `outcome`.
fn audit_runs(function: &Function, outcome: &str) -> usize {
    function
        .emf()
        .iter()
        .filter(|doc| doc["outcome"] == outcome && doc.get("projector_audit_runs_total").is_some())
        .count()
}

/// The state machine's way: every segment in slices until done, then one
/// merge; answers what it found. Each segment takes several slices.
/// Runs every segment of `pass` of `run` in slices until each is done;
/// returns how many slices each took.
async fn audit_pass(
    api: &RuntimeApi,
    function: &Function,
    run: &str,
    pass: u64,
    extra: &Value,
) -> Vec<usize> {
    let mut taken = Vec::new();
    for segment in 0..AUDIT_SEGMENTS {
        let mut slices = 0;
        loop {
            slices += 1;
            assert!(slices <= 100, "segment {segment} not done after 100 slices");
            let mut payload = audit_payload(run, segment, AUDIT_SEGMENTS, extra.clone());
            if pass > 0 {
                payload["audit"]["pass"] = json!(pass);
            }
            let outcome = api.invoke_event(&payload, GENEROUS).await;
            let Outcome::Response(body) = outcome else {
                panic!("{:?}\n{}", invocation_error(&outcome), function.stderr());
            };
            assert_eq!(body["segment"], segment, "{body}");
            assert_eq!(body["run"], run, "{body}");
            if body["done"] == true {
                break;
            }
        }
        taken.push(slices);
        if segment == 0 && pass == 0 {
            // Merging before every segment is done is refused, naming it.
            let merge =
                json!({ "audit": { "run": run, "totalSegments": AUDIT_SEGMENTS, "merge": true } });
            let outcome = api.invoke_event(&merge, GENEROUS).await;
            let (error_type, message) = invocation_error(&outcome);
            assert_eq!(error_type, "Projector.AuditIncomplete", "{message}");
            assert!(message.contains("segments 1 have not started"), "{message}");
        }
    }
    taken
}

const AUDIT_SEGMENTS: u32 = 2;

/// An audit run as the state machine runs it: every segment in slices,
/// then the merge, and each counting pass it answers with, then the merge
/// again. Returns the summary and the passes' purposes.
async fn audit_run_passes(
    api: &RuntimeApi,
    function: &Function,
    run: &str,
    extra: Value,
) -> (Value, Vec<String>) {
    let taken = audit_pass(api, function, run, 0, &extra).await;
    assert!(
        taken.iter().all(|&n| n > 2),
        "slices per segment: {taken:?}"
    );
    let mut merge = json!({ "run": run, "totalSegments": AUDIT_SEGMENTS, "merge": true });
    if let (Some(request), Some(extra)) = (merge.as_object_mut(), extra.as_object()) {
        request.extend(extra.clone());
    }
    let mut purposes = Vec::new();
    loop {
        assert!(
            purposes.len() <= 2,
            "more than two counting passes: {purposes:?}"
        );
        let Outcome::Response(body) = api.invoke_event(&json!({ "audit": merge }), GENEROUS).await
        else {
            panic!("{}", function.stderr());
        };
        let Some(pass) = body["pass"].as_u64() else {
            return (body, purposes);
        };
        assert_eq!(pass as usize, purposes.len() + 1, "{body}");
        purposes.push(body["purpose"].as_str().unwrap_or_default().to_string());
        // A merge before the pass is counted (retried after its answer
        // was lost) answers the same pass.
        let Outcome::Response(again) = api.invoke_event(&json!({ "audit": merge }), GENEROUS).await
        else {
            panic!("{}", function.stderr());
        };
        assert_eq!(again, body);
        audit_pass(api, function, run, pass, &extra).await;
    }
}

/// The audit on Step Functions, driven as its state machine drives it:
/// the findings merged from sliced segments are the CLI audit's, each is
/// logged, the run is counted for the alarm, a merge invoked again counts
/// nothing twice, the run's items are cleaned up, and a repairing run
/// leaves the table clean.
#[tokio::test]
async fn lambda_audits_segments_in_slices_and_merges_them_once() {
    let started = Instant::now();
    let (_spec, fixture) = super::audit::drifted_social("lambda-audit").await;
    let (client, table, applier) = (&fixture.client, &fixture.table, &fixture.applier);
    let whole =
        ddb_projector::audit::audit(applier, &ddb_projector::audit::AuditOptions::default())
            .await
            .expect("audit");
    assert!(whole.findings.len() >= 3, "{:?}", whole.findings);
    let api = RuntimeApi::start().await;
    let function = Function::start(
        support::binary(),
        &api,
        &function_env("social-service.toml", Some(table)),
    );
    api.ready().await;

    for (audit, error_type, says) in [
        (
            json!({ "run": "a#b" }),
            "Projector.InvalidAuditRequest",
            "is not a name",
        ),
        (
            json!({ "run": "r", "segment": 2, "totalSegments": 2 }),
            "Projector.InvalidAuditRequest",
            "out of range",
        ),
        (json!({ "segment": 0 }), "", "missing field `run`"),
    ] {
        let outcome = api.invoke_event(&json!({ "audit": audit }), GENEROUS).await;
        let (found_type, message) = invocation_error(&outcome);
        if !error_type.is_empty() {
            assert_eq!(found_type, error_type, "{message}");
        }
        assert!(message.contains(says), "{message}");
    }

    // The planted counter drift leaves the summed sketch not zero: the
    // merge asks for a pass that locates the counters first.
    let (body, purposes) = audit_run_passes(&api, &function, "nightly-1", json!({})).await;
    assert_eq!(purposes, ["locate"], "{body}");
    assert_eq!(body["clean"], false, "{body}");
    assert_eq!(body["findings"], whole.findings.len(), "{body}");
    assert_eq!(body["unrepaired"], whole.findings.len(), "{body}");
    assert_eq!(body["scanned"], whole.scanned, "{body}");
    let mut listed: Vec<(String, String)> = body["first"]
        .as_array()
        .expect("first")
        .iter()
        .map(|f| {
            (
                f["projection"].as_str().unwrap().to_string(),
                f["key"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String)> = whole
        .findings
        .iter()
        .map(|f| (f.rule.clone(), f.key.clone()))
        .collect();
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    let counted: u64 = body["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, whole.findings.len() as u64, "{body}");

    // Invoked again (a retried merge), it answers what it stored.
    let again = json!({ "audit": { "run": "nightly-1", "totalSegments": 2, "merge": true } });
    let Outcome::Response(stored) = api.invoke_event(&again, GENEROUS).await else {
        panic!("{}", function.stderr());
    };
    assert_eq!(stored["alreadyMerged"], true, "{stored}");
    assert_eq!(stored["findings"], body["findings"]);
    // A run merged once is done: reused, it is refused, never answered
    // with the old conclusion.
    for reused in [
        audit_payload("nightly-1", 0, 2, json!({})),
        json!({ "audit": { "run": "nightly-1", "totalSegments": 3, "merge": true } }),
    ] {
        let outcome = api.invoke_event(&reused, GENEROUS).await;
        let (error_type, message) = invocation_error(&outcome);
        assert_eq!(error_type, "Projector.AuditRunDone", "{message}");
        assert!(message.contains("run `nightly-1` was merged"), "{message}");
    }
    let audit_items = super::audit::audit_items(client, table, "").await;
    assert_eq!(audit_items, ["nightly-1#merged"]);
    assert_eq!(
        logged_findings(&function),
        whole.findings.len(),
        "{}",
        function.stderr()
    );
    assert_eq!(audit_runs(&function, "findings"), 1);

    // A merge cut off after it stored its summary, before it logged and
    // counted: invoked again, it logs and counts from the summary, once.
    client
        .update_item()
        .table_name(table)
        .key("PK", s("_ddbp#audit"))
        .key("SK", s("nightly-1#merged"))
        .update_expression("SET logged = :f")
        .expression_attribute_values(":f", Av::Bool(false))
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        let Outcome::Response(stored) = api.invoke_event(&again, GENEROUS).await else {
            panic!("{}", function.stderr());
        };
        assert_eq!(stored["alreadyMerged"], true, "{stored}");
    }
    assert_eq!(
        logged_findings(&function),
        2 * whole.findings.len(),
        "{}",
        function.stderr()
    );
    assert_eq!(audit_runs(&function, "findings"), 2);
    let emf = function.emf();
    assert!(
        emf.iter()
            .any(|doc| doc.get("projector_audit_findings_total").is_some()
                && doc["kind"].is_string()
                && doc["projection"].is_string()),
        "{emf:#?}"
    );

    // A repairing run fixes what it finds; the next run is clean.
    // Repairing, it recounts the shards in a pass of its own too.
    let (repaired, purposes) =
        audit_run_passes(&api, &function, "nightly-2", json!({ "repair": true })).await;
    assert_eq!(purposes, ["locate", "recount"], "{repaired}");
    assert_eq!(repaired["unrepaired"], 0, "{repaired}");
    assert_eq!(repaired["repairFailures"], json!([]), "{repaired}");
    let (clean, purposes) = audit_run_passes(&api, &function, "nightly-3", json!({})).await;
    assert_eq!(purposes, Vec::<String>::new(), "{clean}");
    // Each run leaves its summary only.
    let audit_items = super::audit::audit_items(client, table, "").await;
    assert_eq!(
        audit_items,
        ["nightly-1#merged", "nightly-2#merged", "nightly-3#merged"]
    );
    assert_eq!(clean["clean"], true, "{clean}");
    assert!(audit_runs(&function, "clean") >= 1, "{:#?}", function.emf());
    eprintln!("lambda_audits_segments_in_slices: {:?}", started.elapsed());
}

/// `register --spec` of a shipped spec, its `[table] name` set to `table`
/// (`edit` changes the text first).
fn register_shipped(name: &str, table: &str, edit: impl Fn(String) -> String) {
    let text = std::fs::read_to_string(spec_path(name)).unwrap();
    let spec_table = text
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap()
        .to_string();
    let text = edit(text.replace(
        &format!("name = \"{spec_table}\""),
        &format!("name = \"{table}\""),
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let output = std::process::Command::new(support::binary())
        .args([
            "register",
            "--spec",
            path.to_str().unwrap(),
            "--table",
            table,
        ])
        .envs(support::env())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "register: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn lambda_without_a_spec_serves_each_tables_registration_and_routes_each_record() {
    let started = Instant::now();
    let client = support::client().await;
    let users = support::fresh_table(
        &client,
        &support::shipped_spec("user-service.toml"),
        "lambda-reg-u",
    )
    .await;
    let social = support::fresh_table(
        &client,
        &support::shipped_spec("social-service.toml"),
        "lambda-reg-s",
    )
    .await;
    register_shipped("user-service.toml", &users, |t| t);
    register_shipped("social-service.toml", &social, |t| t);
    write_users(&client, &users, &["u1"]).await;
    put(
        &client,
        &social,
        support::item(&[
            ("PK", s("USER#a")),
            ("SK", s("FOLLOWS#b")),
            ("followedAt", s("2026-11-28")),
        ]),
    )
    .await;
    let user_records = stream_records(&client, &users).await;
    let social_records = stream_records(&client, &social).await;
    let api = RuntimeApi::start().await;
    // No PROJECTOR_SPEC: each table's registration. PROJECTOR_TABLE (the
    // stack sets it, for backfill and audit requests) does not route
    // stream records: each goes to its own stream's table.
    let function = Function::start(
        support::binary(),
        &api,
        &[
            ("PROJECTOR_REGISTRY_POLL_SECONDS", "0.2".to_string()),
            ("PROJECTOR_LEASE_SECONDS", "1".to_string()),
            ("PROJECTOR_TABLE", users.clone()),
        ],
    );
    api.ready().await;

    // A hand-made pipeline's batch: a social follow, then a user's items.
    let mixed: Vec<Value> = social_records
        .iter()
        .chain(&user_records)
        .cloned()
        .collect();
    let outcome = api.invoke_event(&event(&mixed), GENEROUS).await;
    let failed = failures(&outcome);
    assert_eq!(
        failed,
        vec![seq(&user_records[0]).to_string()],
        "the other table's first record is reported, to come again"
    );
    assert!(
        support::get(&client, &social, "USER#b", "FOLLOWED_BY#a")
            .await
            .is_some(),
        "the follow is applied under the social registration"
    );
    assert!(untouched(&client, &users, "u1").await, "nothing of u1 yet");
    let again = api
        .invoke_event(&event(&from_seq(&mixed, &failed[0])), GENEROUS)
        .await;
    assert!(failures(&again).is_empty());
    check_user(&client, &users, "u1").await.unwrap();

    // A new registration is served without a restart or a redeploy.
    register_shipped("user-service.toml", &users, |t| {
        t.replace("GSI1SK = \"USER#{userId}\"", "GSI1SK = \"U#{userId}\"")
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = user_records.len();
    write_users(&client, &users, &["u2"]).await;
    let fresh: Vec<Value> = stream_records(&client, &users).await[seen..].to_vec();
    let outcome = api.invoke_event(&event(&fresh), GENEROUS).await;
    assert!(failures(&outcome).is_empty());
    let item = support::get(&client, &users, "USER#u2", "EMAIL#e1")
        .await
        .unwrap();
    assert_eq!(
        support::text(&item, "GSI1SK").as_deref(),
        Some("U#u2"),
        "the second registration's definition"
    );
    drop(function);
    eprintln!(
        "timing: lambda registry took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

// ------------------------------------------- a team's own Lambda binary ---

/// An example's binary (`cargo test` builds the examples beside the tests).
fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let binary = dir.join("examples").join(name);
    assert!(
        binary.is_file(),
        "{} is not built: `cargo test` builds the examples, or run `cargo build --example {name}`",
        binary.display()
    );
    binary
}

/// The `email-domains` items of the example's projection in `domain`'s
/// partition: (sort key, address, user).
async fn domain_items(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    domain: &str,
) -> Vec<(String, String, String)> {
    let pk = format!("DOMAIN#{domain}");
    let mut items: Vec<_> = support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| support::text(item, "PK").as_deref() == Some(pk.as_str()))
        .map(|item| {
            let text = |name| support::text(&item, name).unwrap_or_default();
            (text("SK"), text("address"), text("userId"))
        })
        .collect();
    items.sort();
    items
}

#[tokio::test]
async fn a_teams_own_lambda_serves_its_rust_projection_beside_the_spec() {
    let started = Instant::now();
    let (client, table, records) = user_batch("lambda-custom", &["u1", "u2"]).await;
    let api = RuntimeApi::start().await;
    let function = Function::start(
        &example_binary("custom_projection"),
        &api,
        &function_env("user-service.toml", None),
    );
    api.ready().await;

    let outcome = api.invoke_event(&event(&records), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    // The spec's projections, as the shipped bootstrap applies them.
    for user in ["u1", "u2"] {
        check_user(&client, &table, user).await.unwrap();
    }
    // The Rust projection: each address in its domain's partition.
    let want = |rows: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        rows.iter()
            .map(|(sk, address, user)| (sk.to_string(), address.to_string(), user.to_string()))
            .collect()
    };
    assert_eq!(
        domain_items(&client, &table, "example.com").await,
        want(&[
            ("USER#u1#EMAIL#e1", "u1@Example.com", "u1"),
            ("USER#u1#EMAIL#e2", "u1.work@example.com", "u1"),
            ("USER#u2#EMAIL#e1", "u2@Example.com", "u2"),
            ("USER#u2#EMAIL#e2", "u2.work@example.com", "u2"),
        ]),
        "{}",
        function.stderr()
    );

    // u1's work address moves to another domain; u2's first email goes.
    put(&client, &table, email("u1", "e2", "u1@other.org", false)).await;
    support::delete(&client, &table, "USER#u2", "EMAIL#e1").await;
    let all = stream_records(&client, &table).await;
    let later = all[records.len()..].to_vec();
    let outcome = api.invoke_event(&event(&later), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    assert_eq!(
        domain_items(&client, &table, "example.com").await,
        want(&[
            ("USER#u1#EMAIL#e1", "u1@Example.com", "u1"),
            ("USER#u2#EMAIL#e2", "u2.work@example.com", "u2"),
        ])
    );
    assert_eq!(
        domain_items(&client, &table, "other.org").await,
        want(&[("USER#u1#EMAIL#e2", "u1@other.org", "u1")])
    );

    // Every record again, as a Lambda retry or a replay delivers them:
    // nothing changes.
    let before = support::scan_all(&client, &table).await;
    let outcome = api.invoke_event(&event(&all), GENEROUS).await;
    assert_eq!(
        failures(&outcome),
        Vec::<String>::new(),
        "{}",
        function.stderr()
    );
    assert_eq!(support::scan_all(&client, &table).await, before);
    eprintln!(
        "timing: a_teams_own_lambda_serves_its_rust_projection_beside_the_spec took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
