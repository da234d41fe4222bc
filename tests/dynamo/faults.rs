//! Fault injection through the SDK: the projector converges exactly while
//! DynamoDB throttles, fails, times out, conflicts and loses answers.
//!
//! [`Faults`] is an SDK interceptor. At a seeded rate it makes a call fail
//! the way real DynamoDB fails, with DynamoDB's own error bodies, so the
//! SDK's deserializers and the projector's classification see what they
//! would see from AWS:
//!
//! - **not applied** (throttling, `InternalServerError`, a timeout, a
//!   transaction conflict): the request is rewritten into a harmless
//!   `DescribeLimits` before it is sent, and the answer replaced;
//! - **dropped after apply**, the worst case: the request reaches DynamoDB
//!   Local and is applied, then its answer is replaced with a 500 or a
//!   reset connection.
//!
//! The tests feed generated histories through the applier, the stream
//! runner and the Lambda handler with faulty clients, deliver again from
//! the first record not handled (as Lambda and the runner do), and compare
//! the table with what the spec computes from the final source items.
//!
//! The seed (`FAULT_SEED`, printed by each test) fixes the workload and the
//! sequence of fault decisions; which request meets which decision also
//! depends on the order concurrent requests are made in.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextMut,
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextMut,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::{HttpResponse, OrchestratorError};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use ddb_projector::apply::{Applier, ApplyConfig, BatchOptions, BatchStats, RecordStatus};
use ddb_projector::control;
use ddb_projector::source::{RunOptions, StreamRunner};
use ddb_projector::spec::Spec;

use super::model::*;
use super::support::{self, s};

// ------------------------------------------------------------ the faults ---

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 400 `ProvisionedThroughputExceededException` or `ThrottlingException`; not applied.
    Throttling,
    /// 500 `InternalServerError`; not applied.
    ServerError,
    /// The attempt timed out before an answer came; not applied.
    Timeout,
    /// `TransactionCanceledException` with a `TransactionConflict` reason
    /// (`TransactWriteItems`), `TransactionConflictException` (single-item
    /// writes); not applied.
    TransactionConflict,
    /// Applied, then the answer was lost: a 500 or a reset connection.
    DroppedAfterApply,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::Throttling,
        Fault::ServerError,
        Fault::Timeout,
        Fault::TransactionConflict,
        Fault::DroppedAfterApply,
    ];

    fn index(self) -> usize {
        Fault::ALL.iter().position(|f| *f == self).expect("listed")
    }
}

/// DynamoDB operations that write; only they meet transaction conflicts.
const WRITES: &[&str] = &["TransactWriteItems", "UpdateItem", "PutItem", "DeleteItem"];

/// The decision for one attempt, kept in the attempt's config bag from
/// `read_before_attempt` to the hooks that carry it out.
#[derive(Debug, Clone)]
struct Planned {
    fault: Fault,
    /// The operation (`TransactWriteItems`, `GetRecords`...).
    operation: String,
    /// Whether the request is a DynamoDB (not Streams) call.
    dynamodb: bool,
    /// Picks a variant: which throttling code, 500 or reset, which item conflicts.
    variant: u64,
    /// Items of a `TransactWriteItems`.
    items: usize,
}

impl Storable for Planned {
    type Storer = StoreReplace<Planned>;
}

/// The fault-injecting interceptor; clones share their state and counts.
#[derive(Debug, Clone)]
pub struct Faults(Arc<State>);

#[derive(Debug)]
struct State {
    /// Calls that fault, in millionths.
    per_million: u64,
    /// Only this fault, only on these operations (regression tests).
    only: Option<(Fault, &'static [&'static str])>,
    /// The transaction item that conflicts (else a random one).
    conflict_item: Option<usize>,
    rng: Mutex<Rng>,
    enabled: AtomicBool,
    calls: AtomicU64,
    injected: [AtomicU64; 5],
    /// Dropped answers of writes DynamoDB had applied successfully.
    lost_writes: AtomicU64,
    /// The process kill (see [`Faults::arm_kill`]).
    kill: Mutex<Kill>,
    /// Writes answered as applied, since the start.
    writes_answered: AtomicU64,
    /// Kills that landed while the batch still had requests to make.
    kills_landed: AtomicU64,
    /// Requests refused because the process was killed.
    cut: AtomicU64,
    /// Writes answered while a kill was armed.
    armed_writes: AtomicU64,
}

/// A kill armed to land once so many writes were answered.
#[derive(Debug, Default)]
struct Kill {
    /// Writes to answer before the kill; `None`: disarmed.
    after: Option<u64>,
    answered: u64,
    killed: bool,
    notify: Arc<tokio::sync::Notify>,
}

/// A request made after the process was killed: it never reaches
/// DynamoDB.
#[derive(Debug, Clone)]
struct Cut;

impl Storable for Cut {
    type Storer = StoreReplace<Cut>;
}

/// The operation of an attempt, kept to count the writes answered.
#[derive(Debug, Clone)]
struct Operation(String);

impl Storable for Operation {
    type Storer = StoreReplace<Operation>;
}

impl Faults {
    /// Faults on a `rate` (0..1) of all calls, every kind.
    pub fn new(seed: u64, rate: f64) -> Faults {
        Faults::build(seed, rate, None)
    }

    /// `fault` on every call of `operations`.
    pub fn always(fault: Fault, operations: &'static [&'static str]) -> Faults {
        Faults::build(1, 1.0, Some((fault, operations)))
    }

    /// A conflict on item `item` of every `TransactWriteItems`.
    pub fn always_conflict_at(item: usize) -> Faults {
        let mut faults = Faults::always(Fault::TransactionConflict, &["TransactWriteItems"]);
        Arc::get_mut(&mut faults.0)
            .expect("not shared yet")
            .conflict_item = Some(item);
        faults
    }

    fn build(seed: u64, rate: f64, only: Option<(Fault, &'static [&'static str])>) -> Faults {
        Faults(Arc::new(State {
            per_million: (rate * 1e6) as u64,
            only,
            conflict_item: None,
            rng: Mutex::new(Rng::new(seed)),
            enabled: AtomicBool::new(true),
            calls: AtomicU64::new(0),
            injected: Default::default(),
            lost_writes: AtomicU64::new(0),
            kill: Mutex::new(Kill::default()),
            writes_answered: AtomicU64::new(0),
            kills_landed: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            armed_writes: AtomicU64::new(0),
        }))
    }

    /// Arms a kill of the process: once `after` more writes are answered
    /// as applied, no request of this client reaches DynamoDB any more
    /// (each fails as a reset connection) and [`Faults::killed`]
    /// completes, so that the caller drops what it was doing, as a SIGKILL
    /// would, between a write and the writes after it.
    pub fn arm_kill(&self, after: u64) {
        let mut kill = self.0.kill.lock().expect("not poisoned");
        *kill = Kill {
            after: Some(after.max(1)),
            ..Kill::default()
        };
    }

    /// Completes when the armed kill lands.
    pub async fn killed(&self) {
        let notify = self.0.kill.lock().expect("not poisoned").notify.clone();
        notify.notified().await;
    }

    /// Disarms the kill (the process restarts); `landed`: it landed while
    /// the work was not done, which the caller dropped.
    pub fn disarm(&self, landed: bool) {
        *self.0.kill.lock().expect("not poisoned") = Kill::default();
        if landed {
            self.0.kills_landed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Faults injected, of every kind.
    pub fn injected_total(&self) -> u64 {
        Fault::ALL.iter().map(|kind| self.injected(*kind)).sum()
    }

    /// Answers of applied writes lost.
    pub fn lost_writes(&self) -> u64 {
        self.0.lost_writes.load(Ordering::Relaxed)
    }

    /// Kills that landed in the middle of the work.
    pub fn kills_landed(&self) -> u64 {
        self.0.kills_landed.load(Ordering::Relaxed)
    }

    /// Writes answered while a kill was armed: with a kill armed after the
    /// first, any of them means a kill landed.
    pub fn armed_writes(&self) -> u64 {
        self.0.armed_writes.load(Ordering::Relaxed)
    }

    /// Requests a kill kept from DynamoDB.
    pub fn cut(&self) -> u64 {
        self.0.cut.load(Ordering::Relaxed)
    }

    fn is_killed(&self) -> bool {
        self.0.kill.lock().expect("not poisoned").killed
    }

    /// A write of `operation` was answered as applied: the armed kill
    /// counts it.
    fn answered(&self, operation: &str) {
        if !WRITES.contains(&operation) && operation != "BatchWriteItem" {
            return;
        }
        self.0.writes_answered.fetch_add(1, Ordering::Relaxed);
        let mut kill = self.0.kill.lock().expect("not poisoned");
        if let Some(after) = kill.after {
            self.0.armed_writes.fetch_add(1, Ordering::Relaxed);
            kill.answered += 1;
            if kill.answered >= after && !kill.killed {
                kill.killed = true;
                kill.notify.notify_one();
            }
        }
    }

    /// A DynamoDB client whose calls go through this interceptor. Without
    /// `sdk_retries` every fault reaches the projector's own retries; with
    /// them the SDK's standard mode (3 attempts, as in production) retries
    /// first, after 20 ms rather than up to a second so the test stays short.
    pub fn dynamodb(
        &self,
        config: &aws_config::SdkConfig,
        sdk_retries: bool,
    ) -> aws_sdk_dynamodb::Client {
        let retries = if sdk_retries {
            sdk_retry_config()
        } else {
            aws_sdk_dynamodb::config::retry::RetryConfig::disabled()
        };
        let builder = aws_sdk_dynamodb::config::Builder::from(config)
            .interceptor(self.clone())
            .retry_config(retries);
        aws_sdk_dynamodb::Client::from_conf(builder.build())
    }

    /// A DynamoDB Streams client whose calls go through this interceptor,
    /// with the SDK's standard retries (see [`Faults::dynamodb`]).
    pub fn streams(&self, config: &aws_config::SdkConfig) -> aws_sdk_dynamodbstreams::Client {
        let builder = aws_sdk_dynamodbstreams::config::Builder::from(config)
            .interceptor(self.clone())
            .retry_config(sdk_retry_config());
        aws_sdk_dynamodbstreams::Client::from_conf(builder.build())
    }

    /// Turns injection on or off.
    pub fn set_enabled(&self, enabled: bool) {
        self.0.enabled.store(enabled, Ordering::Relaxed);
    }

    /// How many faults of `kind` were injected.
    pub fn injected(&self, kind: Fault) -> u64 {
        self.0.injected[kind.index()].load(Ordering::Relaxed)
    }

    /// Calls seen, faults per kind, lost applied writes.
    pub fn report(&self) -> String {
        let kinds: Vec<String> = Fault::ALL
            .iter()
            .map(|kind| format!("{kind:?} {}", self.injected(*kind)))
            .collect();
        format!(
            "{} calls; injected: {}; answers of applied writes lost: {}",
            self.0.calls.load(Ordering::Relaxed),
            kinds.join(", "),
            self.0.lost_writes.load(Ordering::Relaxed)
        )
    }

    /// Every kind was injected at least once, and some applied write lost its answer.
    pub fn assert_every_kind(&self, seed: u64) {
        // Each kind is a fifth of the faults; with fewer than 10 of a kind
        // expected, none is likely enough (e^-10 at 10) not to be asserted.
        let calls = self.0.calls.load(Ordering::Relaxed) as f64;
        let per_kind = calls * self.0.per_million as f64 / 1e6 / 5.0;
        if per_kind < 10.0 {
            eprintln!(
                "not asserting every fault kind: {per_kind:.1} of each expected in {calls} calls at this rate ({})",
                self.report()
            );
            return;
        }
        for kind in Fault::ALL {
            assert!(
                self.injected(kind) > 0,
                "seed {seed}: no {kind:?} fault was injected ({})",
                self.report()
            );
        }
        assert!(
            self.0.lost_writes.load(Ordering::Relaxed) > 0,
            "seed {seed}: no applied write lost its answer ({})",
            self.report()
        );
    }

    fn count(&self, kind: Fault) {
        self.0.injected[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Decides whether this attempt faults, and how.
    fn plan(&self, target: &str, body: Option<&[u8]>) -> Option<Planned> {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        if !self.0.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let (service, operation) = target.split_once('.')?;
        let dynamodb = service.starts_with("DynamoDB_");
        let write = dynamodb && WRITES.contains(&operation);
        let mut rng = self.0.rng.lock().expect("not poisoned");
        let fault = match self.0.only {
            Some((fault, operations)) => {
                if !operations.contains(&operation) {
                    return None;
                }
                fault
            }
            None => {
                if rng.below(1_000_000) >= self.0.per_million {
                    return None;
                }
                // A lost answer of an applied write is the fault that
                // tests idempotence most, and only writes whose condition
                // held are applied: it gets twice the share among writes,
                // so every test run meets it (with one share, a full
                // parallel run once met none in a user history).
                let kinds: &[Fault] = if write {
                    &[
                        Fault::Throttling,
                        Fault::ServerError,
                        Fault::Timeout,
                        Fault::TransactionConflict,
                        Fault::DroppedAfterApply,
                        Fault::DroppedAfterApply,
                    ]
                } else {
                    &[
                        Fault::Throttling,
                        Fault::ServerError,
                        Fault::Timeout,
                        Fault::DroppedAfterApply,
                    ]
                };
                let drawn = kinds[rng.below(kinds.len() as u64) as usize];
                // Until one applied write has lost its answer, a faulted
                // write always loses its answer: with shares alone, a user
                // history whose writes mostly fail their conditions met
                // none in about one run of three.
                if write && self.0.lost_writes.load(Ordering::Relaxed) == 0 {
                    Fault::DroppedAfterApply
                } else {
                    drawn
                }
            }
        };
        let items = if operation == "TransactWriteItems" {
            body.and_then(|body| serde_json::from_slice::<serde_json::Value>(body).ok())
                .and_then(|json| json["TransactItems"].as_array().map(Vec::len))
                .unwrap_or(1)
        } else {
            0
        };
        Some(Planned {
            fault,
            operation: operation.to_string(),
            dynamodb,
            variant: rng.next(),
            items,
        })
    }
}

fn sdk_retry_config() -> aws_sdk_dynamodb::config::retry::RetryConfig {
    aws_sdk_dynamodb::config::retry::RetryConfig::standard()
        .with_initial_backoff(Duration::from_millis(20))
}

/// An answer as DynamoDB sends it.
fn answer(status: u16, body: String) -> HttpResponse {
    let mut response = HttpResponse::new(
        StatusCode::try_from(status).expect("a valid status"),
        SdkBody::from(body),
    );
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    response
}

fn error_body(type_name: &str, message: &str) -> String {
    serde_json::json!({ "__type": type_name, "message": message }).to_string()
}

fn server_error() -> HttpResponse {
    answer(
        500,
        error_body(
            "com.amazon.coral.service#InternalServerError",
            "Internal server error",
        ),
    )
}

/// What real DynamoDB answers when a transaction meets another one on one
/// of its items: every other item's reason is `None`.
fn transaction_conflict(items: usize, which: usize) -> String {
    let reasons: Vec<serde_json::Value> = (0..items.max(1))
        .map(|i| {
            if i == which % items.max(1) {
                serde_json::json!({ "Code": "TransactionConflict", "Message": "Transaction is ongoing for the item" })
            } else {
                serde_json::json!({ "Code": "None" })
            }
        })
        .collect();
    let codes: Vec<&str> = reasons
        .iter()
        .map(|r| r["Code"].as_str().unwrap_or("None"))
        .collect();
    serde_json::json!({
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "CancellationReasons": reasons,
        "Message": format!(
            "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
            codes.join(", ")
        ),
    })
    .to_string()
}

impl Intercept for Faults {
    fn name(&self) -> &'static str {
        "FaultInjection"
    }

    fn read_before_attempt(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().unset::<Planned>();
        cfg.interceptor_state().unset::<Cut>();
        let request = context.request();
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        cfg.interceptor_state().store_put(Operation(
            target.split_once('.').map_or("", |(_, op)| op).to_string(),
        ));
        if self.is_killed() {
            self.0.cut.fetch_add(1, Ordering::Relaxed);
            cfg.interceptor_state().store_put(Cut);
            return Ok(());
        }
        if let Some(planned) = self.plan(target, request.body().bytes()) {
            cfg.interceptor_state().store_put(planned);
        }
        Ok(())
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let cut = cfg.load::<Cut>().is_some();
        let rewrite = cut
            || cfg.load::<Planned>().is_some_and(|planned| {
                planned.fault != Fault::DroppedAfterApply && planned.dynamodb
            });
        // Streams calls only read: sending them changes nothing.
        if rewrite {
            let request = context.request_mut();
            request
                .headers_mut()
                .insert("x-amz-target", "DynamoDB_20120810.DescribeLimits");
            request.headers_mut().insert("content-length", "2");
            *request.body_mut() = SdkBody::from("{}");
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(planned) = cfg.load::<Planned>() else {
            return Ok(());
        };
        let replacement = match planned.fault {
            Fault::Throttling if planned.variant % 2 == 0 => answer(
                400,
                error_body(
                    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                    "The level of configured provisioned throughput for the table was exceeded. \
                     Consider increasing your provisioning level with the UpdateTable API.",
                ),
            ),
            Fault::Throttling => answer(
                400,
                error_body(
                    "com.amazon.coral.availability#ThrottlingException",
                    "Rate of requests exceeds the allowed throughput.",
                ),
            ),
            Fault::ServerError => server_error(),
            Fault::TransactionConflict if planned.operation == "TransactWriteItems" => answer(
                400,
                transaction_conflict(
                    planned.items,
                    self.0
                        .conflict_item
                        .unwrap_or((planned.variant >> 8) as usize),
                ),
            ),
            Fault::TransactionConflict => answer(
                400,
                error_body(
                    "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                    "Transaction is ongoing for the item",
                ),
            ),
            Fault::DroppedAfterApply if planned.variant % 2 == 0 => {
                self.note_lost_write(planned, context.response().status().is_success());
                server_error()
            }
            // Carried out in `modify_before_attempt_completion`.
            Fault::Timeout | Fault::DroppedAfterApply => return Ok(()),
        };
        *context.response_mut() = replacement;
        self.count(planned.fault);
        Ok(())
    }

    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<Cut>().is_some() {
            context
                .inner_mut()
                .set_output_or_error(Err(OrchestratorError::connector(ConnectorError::io(
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the process was killed (injected)",
                    )
                    .into(),
                ))));
            return Ok(());
        }
        let Some(planned) = cfg.load::<Planned>() else {
            let applied = context
                .response()
                .is_some_and(|response| response.status().is_success());
            if let (true, Some(Operation(operation))) = (applied, cfg.load::<Operation>()) {
                self.answered(operation);
            }
            return Ok(());
        };
        let error = match planned.fault {
            Fault::Timeout => {
                OrchestratorError::timeout("the attempt timed out (injected fault)".into())
            }
            Fault::DroppedAfterApply if planned.variant % 2 == 1 => {
                let applied = context
                    .response()
                    .is_some_and(|response| response.status().is_success());
                self.note_lost_write(planned, applied);
                OrchestratorError::connector(ConnectorError::io(
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "connection reset by peer (injected fault)",
                    )
                    .into(),
                ))
            }
            _ => return Ok(()),
        };
        context.inner_mut().set_output_or_error(Err(error));
        self.count(planned.fault);
        Ok(())
    }
}

impl Faults {
    fn note_lost_write(&self, planned: &Planned, applied: bool) {
        if applied && planned.dynamodb && WRITES.contains(&planned.operation.as_str()) {
            self.0.lost_writes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ----------------------------------------------------------- the workload ---

/// The seed: `FAULT_SEED`, or a fixed default.
fn seed() -> u64 {
    seed_from_env("FAULT_SEED", || 0x5eed_f417)
}

/// The share of calls that fault.
const RATE: f64 = 0.25;

/// The share of calls that fault: `FAULT_RATE` (0.1 to 0.3 is the range
/// the tests are meant for), or [`RATE`].
fn rate() -> f64 {
    let rate = std::env::var("FAULT_RATE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(RATE);
    eprintln!("fault rate {rate} (set FAULT_RATE to change it)");
    rate
}

/// Short, so that some writes give up and their records are delivered
/// again: the path a long outage takes.
const MAX_RETRY: Duration = Duration::from_millis(800);

/// Passes over one batch before the test calls the retries unbounded.
const MAX_PASSES: usize = 200;

/// Records per delivered batch.
const BATCH: usize = 100;

fn apply_config() -> ApplyConfig {
    ApplyConfig {
        max_retry_time: MAX_RETRY,
        // DynamoDB Local serves one request at a time: under the whole
        // suite's load, 256 requests sent at once queue past MAX_RETRY on
        // their own, faults or not, and the same pass times out again and
        // again. 16 in flight keeps what this test measures to the faults.
        concurrency: 16,
        ..ApplyConfig::default()
    }
}

// ------------------------------------------------------------ the driver ---

/// What delivering a history took.
#[derive(Debug, Default)]
struct Delivery {
    batches: usize,
    passes: usize,
    /// The most passes one batch took.
    most_passes: usize,
    /// The most passes in a row that failed on the same record.
    most_stalled: usize,
    stats: BatchStats,
}

/// Delivers `records` in batches; a batch with a record not handled is
/// delivered again from that record, as Lambda and the runner do.
async fn deliver(applier: &Applier, records: &[Record], seed: u64) -> Delivery {
    let mut delivery = Delivery::default();
    for batch in records.chunks(BATCH) {
        delivery.batches += 1;
        let mut start = 0;
        let mut last_failure = String::new();
        let mut stalled = 0;
        for pass in 1.. {
            assert!(
                pass <= MAX_PASSES,
                "seed {seed}: a batch was still not handled after {MAX_PASSES} passes; \
                 the last failed on: {last_failure}"
            );
            delivery.passes += 1;
            let outcome = applier
                .apply_batch(&batch[start..], &BatchOptions::default())
                .await
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: the batch failed as a whole: {error}")
                });
            delivery.stats.add(&outcome.stats);
            delivery.most_passes = delivery.most_passes.max(pass);
            match outcome.first_failure() {
                Some(index) => {
                    stalled = if index == 0 { stalled + 1 } else { 1 };
                    delivery.most_stalled = delivery.most_stalled.max(stalled);
                    last_failure = format!("{:?}", outcome.statuses[index]);
                    start += index;
                }
                None => break,
            }
        }
    }
    delivery
}

// ----------------------------------------------------------- the checker ---

// ----------------------------------------------------------------- tests ---

/// A faulty applier and a clean one (for setup and checks) over a fresh table.
async fn setup(
    spec_file: &str,
    prefix: &str,
    faults: &Faults,
) -> (Applier, Applier, Arc<Spec>, String) {
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec(spec_file);
    let table = support::fresh_table(&clean, &spec, prefix).await;
    let faulty = control::applier(
        faults.dynamodb(&config, false),
        spec.clone(),
        &table,
        apply_config(),
    );
    let clean = control::applier(clean, spec.clone(), &table, ApplyConfig::default());
    (faulty, clean, spec, table)
}

/// What a faulty delivery of `history` must leave: derived state exact,
/// sources untouched, no dead letters, retries that happened and every
/// kind of fault injected.
#[allow(clippy::too_many_arguments)]
async fn assert_delivered_exactly(
    faults: &Faults,
    clean: &Applier,
    spec: &Spec,
    table: &str,
    history: &History,
    counted_users: &[String],
    delivery: &Delivery,
    seed: u64,
) {
    assert_converged(clean.client(), table, spec, counted_users, seed).await;
    assert_sources_untouched(
        history,
        &support::scan_all(clean.client(), table).await,
        seed,
    );
    assert_no_dead_letters(clean, seed).await;
    assert!(delivery.stats.retries > 0, "seed {seed}: {delivery:?}");
    faults.assert_every_kind(seed);
}

#[tokio::test]
async fn the_applier_converges_on_a_social_history_under_every_fault() {
    let started = Instant::now();
    let seed = seed();
    let faults = Faults::new(seed, rate());
    let (applier, clean, spec, table) = setup("social-service.toml", "fault-social", &faults).await;
    let users = social_users(20);
    let mut history = History::default();
    social_history(&mut history, &mut Rng::new(seed), &users, 700);
    assert!(
        history.items.keys().any(|(_, sk)| sk == "PROFILE"),
        "seed {seed}: no profile for the rollups to keep totals on"
    );
    history.write_final(clean.client(), &table).await;
    let delivery = deliver(&applier, &history.records, seed).await;
    eprintln!(
        "social: {} records, {delivery:?}; {}",
        history.records.len(),
        faults.report()
    );

    assert_delivered_exactly(
        &faults, &clean, &spec, &table, &history, &users, &delivery, seed,
    )
    .await;
    eprintln!(
        "timing: social fault test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn the_applier_converges_on_a_user_history_under_every_fault() {
    let started = Instant::now();
    let seed = seed();
    let faults = Faults::new(seed ^ 0x0ddb, rate());
    let (applier, clean, spec, table) = setup("user-service.toml", "fault-user", &faults).await;
    let mut history = History::default();
    user_history(&mut history, &mut Rng::new(seed), 12, 250);
    history.write_final(clean.client(), &table).await;

    let delivery = deliver(&applier, &history.records, seed).await;
    eprintln!(
        "user: {} records, {delivery:?}; {}",
        history.records.len(),
        faults.report()
    );

    assert_delivered_exactly(
        &faults,
        &clean,
        &spec,
        &table,
        &history,
        &[],
        &delivery,
        seed,
    )
    .await;
    eprintln!(
        "timing: user fault test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The aggregate's recompute (read the target and its partition, write
/// on condition of a token) under every fault, answers lost after the
/// write included: campaign totals exact to the cent.
#[tokio::test]
async fn the_applier_converges_on_an_ads_history_under_every_fault() {
    let started = Instant::now();
    let seed = seed();
    let faults = Faults::new(seed ^ 0xad5, rate());
    let (applier, clean, spec, table) = setup("ads-platform.toml", "fault-ads", &faults).await;
    let mut history = History::default();
    ads_history(&mut history, &mut Rng::new(seed), 8, 1500);
    history.write_final(clean.client(), &table).await;
    let delivery = deliver(&applier, &history.records, seed).await;
    eprintln!(
        "ads: {} records, {delivery:?}; {}",
        history.records.len(),
        faults.report()
    );
    let stats = &delivery.stats;
    assert!(
        stats.requests.recompute_reads > 0,
        "seed {seed}: no aggregate was recomputed: {delivery:?}"
    );
    assert_delivered_exactly(
        &faults,
        &clean,
        &spec,
        &table,
        &history,
        &[],
        &delivery,
        seed,
    )
    .await;
    eprintln!(
        "timing: ads fault test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn under_faults_only_the_poison_record_is_dead_lettered() {
    let seed = seed();
    let faults = Faults::new(seed ^ 0xbad, rate());
    let (applier, clean, spec, table) = setup("social-service.toml", "fault-poison", &faults).await;
    let users = social_users(12);
    let mut rng = Rng::new(seed);
    let mut history = History::default();
    social_history(&mut history, &mut rng, &users, 200);
    // A score `pad(score, 4)` cannot render: this record can never apply.
    history.put(achievement("u3", "poison", "gold", s("high")));
    let poison_seq = format!("{:021}", history.records.len());
    social_history(&mut history, &mut rng, &users, 200);
    history.write_final(clean.client(), &table).await;

    let delivery = deliver(&applier, &history.records, seed).await;
    eprintln!("poison: {delivery:?}; {}", faults.report());

    assert_converged(clean.client(), &table, &spec, &users, seed).await;
    let letters = clean.dead_letter_store().list().await.expect("list");
    assert_eq!(letters.len(), 1, "seed {seed}: {letters:#?}");
    let letter = &letters[0];
    assert_eq!(letter.projection, "achievement-leaderboard-keys");
    assert_eq!(letter.sequence_number.as_deref(), Some(poison_seq.as_str()));
    assert!(letter.error.contains("`high`"), "{}", letter.error);
    assert!(
        !letter.held,
        "seed {seed}: the poison record is held behind nothing: {letter:#?}"
    );
    assert!(delivery.stats.dead_letters >= 1, "{delivery:?}");
}

#[tokio::test]
async fn the_stream_runner_drains_a_faulty_table_exactly_and_checkpoints_past_it() {
    let started = Instant::now();
    let seed = seed();
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = Arc::new(Spec::from_toml(COMBINED_SPEC, "fault-test.toml").expect("spec"));
    let table = support::fresh_table(&clean, &spec, "fault-run").await;
    let users = social_users(12);
    let mut rng = Rng::new(seed);
    let mut history = History::default();
    social_history(&mut history, &mut rng, &users, 350);
    user_history(&mut history, &mut rng, 6, 80);
    write_history(&clean, &table, &history).await;

    // The production retry settings of the SDK on DynamoDB, faults on both
    // DynamoDB and DynamoDB Streams.
    let faults = Faults::new(seed ^ 0x5757, rate());
    let (arn, _) = ddb_projector::dynamo::client::require_stream(&clean, &table)
        .await
        .expect("the table has a stream");
    let runner = StreamRunner::new(
        control::applier(
            faults.dynamodb(&config, true),
            spec.clone(),
            &table,
            apply_config(),
        ),
        faults.streams(&config),
        &arn,
    );
    let summary = runner
        .run(RunOptions::drain(), std::future::pending())
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: drain failed: {error}"));
    eprintln!("{summary}\n{}", faults.report());

    assert_converged(&clean, &table, &spec, &users, seed).await;
    let clean_applier =
        control::applier(clean.clone(), spec.clone(), &table, ApplyConfig::default());
    assert_no_dead_letters(&clean_applier, seed).await;
    assert!(
        summary.records >= history.records.len() as u64,
        "seed {seed}: {summary:?}"
    );
    faults.assert_every_kind(seed);

    // Checkpoints are past every record: a second drain, faults still on,
    // finds only the runner's own writes and writes nothing.
    let again = runner
        .run(RunOptions::drain(), std::future::pending())
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: second drain failed: {error}"));
    assert_eq!(again.effects, 0, "seed {seed}: {again:?}");
    assert_eq!(again.checkpoints, 0, "seed {seed}: {again:?}");
    assert_converged(&clean, &table, &spec, &users, seed).await;
    eprintln!(
        "timing: runner fault test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn the_lambda_handler_converges_under_every_fault() {
    use ddb_projector::lambda::event::{Payload, StreamsEvent};
    use ddb_projector::lambda::{Handler, Response};

    let seed = seed();
    let faults = Faults::new(seed ^ 0x1a4b, rate());
    let (_, clean, spec, table) = setup("social-service.toml", "fault-lambda", &faults).await;
    let config = support::sdk_config().await;
    let handler = Handler {
        specs: spec.clone().into(),
        client: faults.dynamodb(&config, false),
        table: Some(table.clone()),
        margin: Duration::from_millis(1500),
        config: apply_config(),
        metrics: None,
        process_started: std::time::SystemTime::now(),
        registered: None,
        regions: Default::default(),
    };
    let users = social_users(16);
    let mut history = History::default();
    social_history(&mut history, &mut Rng::new(seed), &users, 400);
    history.write_final(clean.client(), &table).await;

    // Lambda: a batch is delivered again from the record the answer names.
    let mut invocations = 0;
    for batch in history.records.chunks(BATCH) {
        let mut start = 0;
        for attempt in 1.. {
            assert!(
                attempt <= MAX_PASSES,
                "seed {seed}: {MAX_PASSES} invocations"
            );
            invocations += 1;
            let mut context = lambda_runtime::Context::default();
            context.request_id = format!("r{invocations}");
            context.deadline = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 60_000;
            let payload =
                Payload::Stream(StreamsEvent::from_records(batch[start..].to_vec(), None));
            let response = handler
                .handle(lambda_runtime::LambdaEvent::new(payload, context))
                .await
                .unwrap_or_else(|error| panic!("seed {seed}: the invocation failed: {error}"));
            let Response::Stream(response) = response else {
                panic!("a stream answer");
            };
            let Some(failure) = response.batch_item_failures.first() else {
                break;
            };
            let reported = failure.item_identifier.clone().expect("an identifier");
            start += batch[start..]
                .iter()
                .position(|r| r.as_ref().is_ok_and(|r| r.sequence_number.0 == reported))
                .expect("the reported record is in the batch");
        }
    }
    eprintln!(
        "lambda: {} records, {invocations} invocations; {}",
        history.records.len(),
        faults.report()
    );
    assert_converged(clean.client(), &table, &spec, &users, seed).await;
    assert_no_dead_letters(&clean, seed).await;
    faults.assert_every_kind(seed);
}

// ---------------------------------------------------- regression tests ---

/// Reading the hold set is the first thing a batch with effects does; when
/// it keeps failing (throttled, 500s), the records must be delivered again,
/// not the table declared unusable (which stops the runner).
#[tokio::test]
async fn a_holds_read_that_keeps_failing_fails_the_records_not_the_batch() {
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&clean, &spec, "fault-holds").await;
    let faults = Faults::always(Fault::ServerError, &["Query"]);
    let applier = control::applier(
        faults.dynamodb(&config, false),
        spec.clone(),
        &table,
        ApplyConfig {
            max_retry_time: Duration::from_millis(200),
            ..ApplyConfig::default()
        },
    );
    let mut history = History::default();
    history.put(follow("a", "b", "t1"));
    history.write_final(&clean, &table).await;
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .expect("a transient failure is not a batch failure");
    assert!(
        matches!(&outcome.statuses[..], [RecordStatus::Failed(reason)] if reason.contains("InternalServerError")),
        "{outcome:?}"
    );
    assert!(faults.injected(Fault::ServerError) > 0);
    // Delivered again once DynamoDB recovers, it applies.
    faults.set_enabled(false);
    let outcome = applier
        .apply_batch(&history.records, &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    assert!(support::get(&clean, &table, "USER#b", "FOLLOWED_BY#a")
        .await
        .is_some());
}

/// A poison record delivered again (its batch was retried from an earlier
/// record) finds its own hold: its letter must not become "held".
#[tokio::test]
async fn a_poison_record_delivered_again_is_not_held_behind_its_own_letter() {
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&clean, &spec, "fault-again").await;
    let applier = control::applier(clean.clone(), spec, &table, ApplyConfig::default());
    let mut history = History::default();
    history.put(achievement("u1", "b1", "gold", s("high")));
    // A record with effects after it: a batch with effects reads the holds.
    history.put(follow("a", "b", "t1"));
    history.write_final(&clean, &table).await;
    for _ in 0..2 {
        let outcome = applier
            .apply_batch(&history.records, &BatchOptions::default())
            .await
            .unwrap();
        assert!(
            matches!(
                &outcome.statuses[..],
                [RecordStatus::DeadLettered(_), RecordStatus::Applied]
            ),
            "{outcome:?}"
        );
    }
    let letters = applier.dead_letter_store().list().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert!(!letters[0].held, "{letters:#?}");
    assert_eq!(letters[0].attempts, 2);
}

/// Memberships planned from a scan (backfill) carry a guard, a
/// `ConditionCheck` after the markers. A conflict reported on the guard
/// must be retried with backoff and within the retry time, like one on any
/// other item, not sent again at once for as long as the conflict lasts.
#[tokio::test]
async fn a_transaction_conflict_on_a_scan_guard_backs_off_and_gives_up_in_time() {
    let config = support::sdk_config().await;
    let clean = aws_sdk_dynamodb::Client::new(&config);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&clean, &spec, "fault-guard").await;
    let item = follow("a", "b", "t1");
    put_item(&clean, &table, &item).await;
    let record = ddb_projector::decode::decode_scanned_item(&spec.table, 0, 1, item.clone());
    // The transaction: the edge (0), its guard (1), two counter shards.
    let faults = Faults::always_conflict_at(1);
    let applier = control::applier(
        faults.dynamodb(&config, false),
        spec.clone(),
        &table,
        ApplyConfig {
            max_retry_time: Duration::from_secs(2),
            ..ApplyConfig::default()
        },
    );
    let options = BatchOptions {
        read_markers_first: true,
        ..BatchOptions::default()
    };
    let batch = [record];
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        applier.apply_batch(&batch, &options),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "still retrying after 20 s with a 2 s retry time ({})",
            faults.report()
        )
    })
    .unwrap();
    assert!(
        matches!(&outcome.statuses[..], [RecordStatus::Failed(reason)] if reason.contains("conflict")),
        "{outcome:?}"
    );
    assert!(outcome.stats.retries > 0, "{outcome:?}");
    let conflicts = faults.injected(Fault::TransactionConflict);
    assert!((2..100).contains(&conflicts), "{}", faults.report());
    // Once the conflict is gone, the membership applies.
    faults.set_enabled(false);
    let outcome = applier.apply_batch(&batch, &options).await.unwrap();
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied]);
    assert!(support::get(&clean, &table, "USER#b", "FOLLOWED_BY#a")
        .await
        .is_some());
}
