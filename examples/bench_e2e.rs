//! End-to-end benchmark: ddb-projector against a hand-written baseline
//! handler, on DynamoDB Local. Run it with `scripts/bench e2e [RECORDS]`,
//! which starts a fresh DynamoDB Local for every (contender, batch size)
//! run, then merges the runs into a table, `target/bench-e2e/results.json`
//! and the chart `docs/bench-e2e.svg`.
//!
//! One run (`bench_e2e run --contender C --batch B --records N --out FILE`,
//! `AWS_ENDPOINT_URL` set):
//!
//! 1. creates `SocialServiceTable` and `UserServiceTable` as
//!    `ddb-projector table create` does (streams on, `NEW_AND_OLD_IMAGES`);
//! 2. writes a seeded workload of at least N source writes as plain writers
//!    would: follows, unfollows and re-follows with one hot user receiving
//!    30% of new follows, achievements with tier and score changes,
//!    profiles with three emails each, primary-email switches, address
//!    changes, email removes and inserts;
//! 3. reads the records back with the Streams API and decodes them into the
//!    crate's `ChangeRecord`s (not timed);
//! 4. feeds them, in stream order and in batches of B (as Lambda would, one
//!    table's stream after the other), to the contender, timing only this:
//!    - `projector`: `Applier::apply_batch` with the default config
//!      (invariants checked online); `projector-nochecks` with the checks
//!      off;
//!    - `baseline`: a handler written the way a team writes one by hand:
//!      per record, sequential single-item SDK calls, plain counters;
//! 5. checks that the derived state is right (every inverse edge, counter,
//!    GSI key and copied email), so neither contender wins by being wrong.
//!
//! Write units are measured three ways by an SDK interceptor on the
//! contender's client:
//!
//! - **reported**: the `ConsumedCapacity` DynamoDB Local answers
//!   (`ReturnConsumedCapacity::Total` on every call). DynamoDB Local
//!   reports 2.0 for a whole `TransactWriteItems` whatever its size, nothing
//!   for a failed condition, and includes GSI writes for single writes;
//! - **billed (model)**: what DynamoDB would bill for the requests sent, base
//!   table only: 1 unit per KB per standard write (`PutItem`, `UpdateItem`,
//!   `DeleteItem`, each `BatchWriteItem` request), 2 per KB per item of a
//!   `TransactWriteItems`; a failed condition bills like a write (DynamoDB
//!   documents this for single-item writes), and a cancelled transaction
//!   is assumed billed as if it ran (shown separately);
//! - **minimum**: one 1-KB write per derived item that must change per
//!   source record, counted from the records themselves (inverse edge, each
//!   counter, a changed GSI key pair, a changed copied email), with no
//!   transactional surcharge.
//!
//! The same interceptor counts every call by operation (retries included),
//! for both contenders: `requests/record` in the table, a second table of
//! calls per record by operation, and `calls` in the results; for the
//! projector, `requests_by_purpose` adds what `BatchStats` counted (hold
//! reads, recompute reads, marker reads, invariant checks' reads, writes).
//!
//! GSI propagation is left out of the model and the minimum alike. Every
//! item of the workload stays under 1 KB (the generator checks), so each
//! item write is one unit (two in a transaction).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::http::{
    http_client_fn, HttpClient, HttpConnector, HttpConnectorFuture, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use clap::{Parser, Subcommand};
use ddb_projector::apply::{
    Applier, ApplyConfig, BatchOptions, BatchStats, Delivered, Delivery, RecordStatus,
};
use ddb_projector::control;
use ddb_projector::decode::{decode_stream_record, DecodeProblem};
use ddb_projector::record::{ChangeKind, ChangeRecord, Image, ValueRef};
use ddb_projector::spec::Spec;
use serde::{Deserialize, Serialize};

type Attrs = HashMap<String, Av>;
type Record = Result<ChangeRecord, DecodeProblem>;

/// The hot user every follower-count check starts with.
const STAR: &str = "star";

#[derive(Parser)]
#[command(about = "ddb-projector against a hand-written handler, on DynamoDB Local")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One contender at one batch size against the DynamoDB Local of
    /// `AWS_ENDPOINT_URL` (best fresh: it slows down after a large table).
    Run {
        /// `projector`, `projector-nochecks` or `baseline`.
        #[arg(long)]
        contender: String,
        /// Records per batch.
        #[arg(long)]
        batch: usize,
        /// Source writes (stream records) at least, over both tables.
        #[arg(long, default_value_t = 20_000)]
        records: usize,
        /// Seeds the workload.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Where the run's results go (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Simulated network latency added to every call of the contender
        /// (a what-if: DynamoDB Local answers from the same machine).
        #[arg(long, default_value_t = 0.0)]
        latency_ms: f64,
        /// Round-trip time of a TCP proxy on this machine that the
        /// contender's requests go through (0: none): each request reaches
        /// DynamoDB Local this much later, as across a network.
        #[arg(long, default_value_t = 0.0)]
        rtt_ms: f64,
    },
    /// Merges runs into the table (stdout), the JSON results and the chart.
    Report {
        /// The folder of run files.
        #[arg(long, default_value = "target/bench-e2e/runs")]
        runs: PathBuf,
        /// The merged results.
        #[arg(long, default_value = "target/bench-e2e/results.json")]
        json: PathBuf,
        /// The chart.
        #[arg(long, default_value = "docs/bench-e2e.svg")]
        svg: PathBuf,
    },
}

#[tokio::main]
async fn main() {
    match Cli::parse().command {
        Command::Run {
            contender,
            batch,
            records,
            seed,
            out,
            latency_ms,
            rtt_ms,
        } => {
            let result = run(&contender, batch.max(1), records, seed, latency_ms, rtt_ms).await;
            if let Some(dir) = out.parent() {
                std::fs::create_dir_all(dir).expect("create the output folder");
            }
            std::fs::write(
                &out,
                serde_json::to_string_pretty(&result).expect("serialize"),
            )
            .expect("write the run's results");
            eprintln!(
                "{contender} B={batch}: {} records in {:.1} s = {:.0} records/s; p50 {:.1} ms, p99 {:.1} ms; write units/record reported {:.2}, billed {:.2}, minimum {:.2}; peak RSS {:.1} MB; {} problems",
                result.records,
                result.seconds,
                result.records_per_s,
                result.p50_ms,
                result.p99_ms,
                result.reported_write_units / result.records as f64,
                result.billed_units / result.records as f64,
                result.minimum_units as f64 / result.records as f64,
                result.peak_rss_mb,
                result.problems.len()
            );
            if !result.problems.is_empty() {
                for problem in result.problems.iter().take(20) {
                    eprintln!("  {problem}");
                }
                std::process::exit(1);
            }
        }
        Command::Report { runs, json, svg } => report(&runs, &json, &svg),
    }
}

// ------------------------------------------------------------- workload ---

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One writer's write.
enum Op {
    Put(Attrs),
    Delete(Attrs),
}

/// The writes of one table, in order, and the items they leave.
#[derive(Default)]
struct History {
    ops: Vec<Op>,
    items: BTreeMap<(String, String), Attrs>,
}

impl History {
    fn key(item: &Attrs) -> (String, String) {
        (text(item, "PK").unwrap(), text(item, "SK").unwrap())
    }

    fn put(&mut self, item: Attrs) {
        assert!(
            item_size(&item) < 1024 - 200,
            "every item (with its derived keys) stays under 1 KB"
        );
        assert_ne!(
            self.items.get(&History::key(&item)),
            Some(&item),
            "a write that changes nothing makes no stream record"
        );
        self.items.insert(History::key(&item), item.clone());
        self.ops.push(Op::Put(item));
    }

    fn delete(&mut self, pk: &str, sk: &str) {
        let removed = self.items.remove(&(pk.to_string(), sk.to_string()));
        assert!(removed.is_some(), "a delete of nothing makes no record");
        self.ops
            .push(Op::Delete(attrs(&[("PK", s(pk)), ("SK", s(sk))])));
    }

    fn get(&self, pk: &str, sk: &str) -> Option<&Attrs> {
        self.items.get(&(pk.to_string(), sk.to_string()))
    }
}

/// Follows (30% of new ones to the hot user), unfollows, re-follows with a
/// new `followedAt`, and achievements whose tier or score changes.
fn social_history(rng: &mut Rng, target: usize) -> History {
    let mut history = History::default();
    let users: Vec<String> = (0..(target / 8).max(50))
        .map(|i| format!("u{i:05}"))
        .collect();
    // The follows that exist, to pick unfollows and re-follows from.
    let mut follows: Vec<(String, String)> = Vec::new();
    let mut step = 0;
    while history.ops.len() < target {
        step += 1;
        let roll = rng.below(100);
        if roll < 20 {
            let user = &users[rng.below(users.len() as u64) as usize];
            let badge = format!("b{}", rng.below(5));
            let tier = ["gold", "silver", "bronze"][rng.below(3) as usize];
            let mut score = rng.below(10_000);
            let pk = format!("USER#{user}");
            let sk = format!("ACHIEVEMENT#{badge}");
            if let Some(old) = history.get(&pk, &sk) {
                if text(old, "tier").as_deref() == Some(tier)
                    && old.get("score") == Some(&Av::N(score.to_string()))
                {
                    score = (score + 1) % 10_000;
                }
            }
            history.put(attrs(&[
                ("PK", s(&pk)),
                ("SK", s(&sk)),
                ("userId", s(user)),
                ("badgeId", s(&badge)),
                ("tier", s(tier)),
                ("score", Av::N(score.to_string())),
            ]));
        } else if roll < 70 || follows.is_empty() {
            let a = &users[rng.below(users.len() as u64) as usize];
            let b = if rng.chance(30) {
                STAR.to_string()
            } else {
                users[rng.below(users.len() as u64) as usize].clone()
            };
            if &b == a
                || history
                    .get(&format!("USER#{a}"), &format!("FOLLOWS#{b}"))
                    .is_some()
            {
                continue;
            }
            history.put(follow(a, &b, &format!("t{step}")));
            follows.push((a.clone(), b));
        } else {
            let index = rng.below(follows.len() as u64) as usize;
            let (a, b) = follows[index].clone();
            if rng.chance(60) {
                history.delete(&format!("USER#{a}"), &format!("FOLLOWS#{b}"));
                follows.swap_remove(index);
            } else {
                history.put(follow(&a, &b, &format!("t{step}-again")));
            }
        }
    }
    history
}

/// Profiles with three emails each (the first primary); then primary
/// switches as two plain writes (the old one first), address changes,
/// non-primary emails removed and added again. Every user ends with
/// exactly one primary, verified, and every address is its user's own.
fn user_history(rng: &mut Rng, target: usize) -> History {
    let mut history = History::default();
    let users: Vec<String> = (0..(target / 8).max(20))
        .map(|i| format!("v{i:05}"))
        .collect();
    let address = |user: &str, id: usize, version: usize| {
        format!("  {}.E{id}.v{version}@Example.COM ", user.to_uppercase())
    };
    let mut primary: HashMap<String, usize> = HashMap::new();
    for user in &users {
        history.put(profile(user));
        for id in 0..3 {
            history.put(email(user, id, &address(user, id, 0), id == 0));
        }
        primary.insert(user.clone(), 0);
    }
    let mut step = 0;
    while history.ops.len() < target {
        step += 1;
        let user = &users[rng.below(users.len() as u64) as usize];
        let pk = format!("USER#{user}");
        let current = primary[user];
        let id = rng.below(3) as usize;
        let sk = format!("EMAIL#e{id}");
        match (rng.below(10), history.get(&pk, &sk).cloned()) {
            (0..=3, Some(mut new)) if id != current => {
                let mut old = history
                    .get(&pk, &format!("EMAIL#e{current}"))
                    .cloned()
                    .expect("the primary exists");
                old.insert("isPrimary".into(), Av::Bool(false));
                history.put(old);
                new.insert("isPrimary".into(), Av::Bool(true));
                history.put(new);
                primary.insert(user.clone(), id);
            }
            (4..=6, Some(mut item)) => {
                item.insert("email".into(), s(&address(user, id, step)));
                history.put(item);
            }
            (_, Some(_)) if id != current => history.delete(&pk, &sk),
            (_, None) => history.put(email(user, id, &address(user, id, step), false)),
            _ => {}
        }
    }
    history
}

fn follow(a: &str, b: &str, at: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{a}"))),
        ("SK", s(&format!("FOLLOWS#{b}"))),
        ("followerId", s(a)),
        ("followeeId", s(b)),
        ("followedAt", s(at)),
    ])
}

fn profile(user: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s("PROFILE")),
        ("userId", s(user)),
        ("firstName", s("Sam")),
    ])
}

fn email(user: &str, id: usize, address: &str, primary: bool) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s(&format!("EMAIL#e{id}"))),
        ("userId", s(user)),
        ("emailId", s(&format!("e{id}"))),
        ("email", s(address)),
        ("isPrimary", Av::Bool(primary)),
        ("isVerified", Av::Bool(true)),
    ])
}

fn attrs(pairs: &[(&str, Av)]) -> Attrs {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn s(value: &str) -> Av {
    Av::S(value.to_string())
}

fn text(item: &Attrs, name: &str) -> Option<String> {
    item.get(name).and_then(|v| v.as_s().ok()).cloned()
}

/// DynamoDB's item size: attribute names plus values (numbers roughly one
/// byte per two digits).
fn item_size(item: &Attrs) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    Av::S(v) => v.len(),
                    Av::N(v) => v.len() / 2 + 2,
                    _ => 1,
                }
        })
        .sum()
}

// ---------------------------------------------------------------- setup ---

/// Writes a history in order. Writes of one partition stay in order (a
/// primary switch is two writes of one user); partitions go in 8 lanes.
async fn write_history(client: &aws_sdk_dynamodb::Client, table: &str, history: &History) {
    const LANES: usize = 8;
    let mut lanes: Vec<Vec<&Op>> = (0..LANES).map(|_| Vec::new()).collect();
    for op in &history.ops {
        let (Op::Put(item) | Op::Delete(item)) = op;
        let pk = text(item, "PK").unwrap();
        let lane = pk
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
            .rem_euclid(LANES as u64) as usize;
        lanes[lane].push(op);
    }
    futures::future::join_all(lanes.into_iter().map(|ops| async move {
        for op in ops {
            for attempt in 1.. {
                let sent = match op {
                    Op::Put(item) => client
                        .put_item()
                        .table_name(table)
                        .set_item(Some(item.clone()))
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("{e:?}")),
                    Op::Delete(key) => client
                        .delete_item()
                        .table_name(table)
                        .set_key(Some(key.clone()))
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("{e:?}")),
                };
                match sent {
                    Ok(()) => break,
                    // DynamoDB Local's "too long waiting for a lock".
                    Err(error) if attempt < 6 => {
                        eprintln!("setup write failed ({error}); trying again");
                        tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                    }
                    Err(error) => panic!("setup write: {error}"),
                }
            }
        }
    }))
    .await;
}

/// Every record of the table's stream, decoded, in sequence order.
async fn read_stream(
    client: &aws_sdk_dynamodb::Client,
    streams: &aws_sdk_dynamodbstreams::Client,
    table: &str,
) -> Vec<Record> {
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
    let mut records: Vec<(u128, ChangeRecord)> = Vec::new();
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
            for raw in page.records() {
                let record = decode_stream_record(records.len(), &shard, raw)
                    .unwrap_or_else(|problem| panic!("undecodable stream record: {problem}"));
                let seq = record.sequence_number.as_str().parse().unwrap_or(0);
                records.push((seq, record));
            }
            iterator = page.next_shard_iterator().map(str::to_string);
        }
    }
    records.sort_by_key(|(seq, _)| *seq);
    records.into_iter().map(|(_, r)| Ok(r)).collect()
}

async fn scan_all(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
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
            _ => return items,
        }
    }
}

// -------------------------------------------------------------- latency ---

/// An HTTP client that waits `delay` before each request: what a network
/// round trip would add, which DynamoDB Local on the same machine does not.
fn delayed(inner: SharedHttpClient, delay: Duration) -> SharedHttpClient {
    http_client_fn(move |settings, components| {
        SharedHttpConnector::new(Delayed {
            connector: inner.http_connector(settings, components),
            delay,
        })
    })
}

#[derive(Debug)]
struct Delayed {
    connector: SharedHttpConnector,
    delay: Duration,
}

impl HttpConnector for Delayed {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let connector = self.connector.clone();
        let delay = self.delay;
        HttpConnectorFuture::new(async move {
            tokio::time::sleep(delay).await;
            connector.call(request).await
        })
    }
}

// ---------------------------------------------------------------- proxy ---

/// Starts a TCP proxy on 127.0.0.1 to `upstream` that holds every chunk
/// a client sends for `rtt` before passing it on: each request costs one
/// round trip more, as across a network, while concurrent requests
/// overlap as they would there. Answers leave in the order their requests
/// came in, as from a server that serves requests in parallel, each in
/// the same time: DynamoDB Local serves one request at a time and lets
/// some overtake the queue, and a client whose next request waits for a
/// free slot would otherwise chain behind the lucky ones, in a way no
/// real table makes it. Returns its address.
async fn start_proxy(upstream: std::net::SocketAddr, rtt: Duration) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let address = listener.local_addr().expect("the proxy's address");
    let order = Arc::new(AnswerOrder::default());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let order = Arc::clone(&order);
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (sender, mut held) =
                    tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
                // The tickets of this connection's requests awaiting their
                // answer (HTTP/1.1: one at a time).
                let (tickets, mut awaiting) = tokio::sync::mpsc::unbounded_channel::<u64>();
                let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let read = {
                    let order = Arc::clone(&order);
                    let waiting = Arc::clone(&waiting);
                    async move {
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            match from_client.read(&mut buffer).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    // The first chunk of a request takes a ticket.
                                    if !waiting.swap(true, Ordering::SeqCst) {
                                        let _ = tickets.send(order.ticket());
                                    }
                                    let due = tokio::time::Instant::now() + rtt;
                                    if sender.send((due, buffer[..n].to_vec())).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                    }
                };
                let forward = async move {
                    while let Some((due, chunk)) = held.recv().await {
                        tokio::time::sleep_until(due).await;
                        if to_server.write_all(&chunk).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                };
                let back = async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        match from_server.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                // The first chunk of an answer waits its turn.
                                if let Ok(ticket) = awaiting.try_recv() {
                                    order.wait_turn(ticket).await;
                                    waiting.store(false, Ordering::SeqCst);
                                    order.release(ticket);
                                }
                                if to_client.write_all(&buffer[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    // A request left unanswered must not hold up the others.
                    while let Ok(ticket) = awaiting.try_recv() {
                        order.release(ticket);
                    }
                    let _ = to_client.shutdown().await;
                };
                tokio::join!(read, forward, back);
            });
        }
    });
    address
}

/// The order requests reached the proxy in, for answering in it.
#[derive(Default)]
struct AnswerOrder {
    next: AtomicU64,
    /// Every ticket up to `.0` is answered; `.1` holds the answered
    /// tickets beyond it.
    answered: Mutex<(u64, std::collections::BTreeSet<u64>)>,
    changed: tokio::sync::Notify,
}

impl AnswerOrder {
    fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Waits until every earlier ticket is answered (at most 10 s: an
    /// earlier request that never gets an answer stops holding it up).
    async fn wait_turn(&self, ticket: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.answered.lock().expect("not poisoned").0 + 1 >= ticket {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let mut answered = self.answered.lock().expect("not poisoned");
                answered.0 = answered.0.max(ticket - 1);
                return;
            }
        }
    }

    fn release(&self, ticket: u64) {
        let mut answered = self.answered.lock().expect("not poisoned");
        let (upto, beyond) = &mut *answered;
        if ticket > *upto {
            beyond.insert(ticket);
        }
        while beyond.remove(&(*upto + 1)) {
            *upto += 1;
        }
        beyond.retain(|t| *t > *upto);
        drop(answered);
        self.changed.notify_waiters();
    }
}

/// One call: sent, answered, the operation.
type Span = (Instant, Instant, String);

/// The longest chain of `spans` (request sent, answer read) in which each
/// starts after the one before was answered: the sequential round trips
/// the work took, whatever ran beside them. With the chain's operations.
fn sequential_round_trips(spans: &mut [Span]) -> (usize, Vec<String>) {
    spans.sort_by_key(|span| span.0);
    let mut chain: Vec<(usize, Option<usize>)> = Vec::with_capacity(spans.len());
    for i in 0..spans.len() {
        let before = (0..i)
            .filter(|&j| spans[j].1 <= spans[i].0)
            .max_by_key(|&j| chain[j].0);
        chain.push((before.map_or(0, |j| chain[j].0) + 1, before));
    }
    let Some(mut at) = (0..chain.len()).max_by_key(|&i| chain[i].0) else {
        return (0, Vec::new());
    };
    let length = chain[at].0;
    let mut operations = vec![spans[at].2.clone()];
    while let Some(before) = chain[at].1 {
        operations.push(spans[before].2.clone());
        at = before;
    }
    operations.reverse();
    (length, operations)
}

// ---------------------------------------------------------------- meter ---

/// Counts, per call the contender's client makes, the write units DynamoDB
/// Local reports and the units the billing model says DynamoDB would bill.
#[derive(Debug, Clone, Default)]
struct Meter(Arc<MeterState>);

#[derive(Debug, Default)]
struct MeterState {
    /// Micro-units (atomics have no f64).
    reported_write: AtomicU64,
    reported_read: AtomicU64,
    billed_ok: AtomicU64,
    billed_failed_conditions: AtomicU64,
    billed_cancelled: AtomicU64,
    failed_conditions: AtomicU64,
    cancelled_transactions: AtomicU64,
    other_errors: AtomicU64,
    /// Per operation: calls, and the time from sending to the answer
    /// (concurrent calls overlap).
    calls: Mutex<BTreeMap<String, OperationStats>>,
    /// Every call's (sent, answered), for the sequential round trips.
    spans: Mutex<Vec<Span>>,
}

/// Calls of one operation and the time they took.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct OperationStats {
    calls: u64,
    total_ms: f64,
}

/// What the model says one attempt costs, from its request.
#[derive(Debug, Clone)]
struct Pending {
    operation: String,
    sent: Instant,
    billed: f64,
    write: bool,
}

impl Storable for Pending {
    type Storer = StoreReplace<Pending>;
}

/// Units of a standard write of `bytes` (1 per KB, at least 1).
fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// The size of a value in DynamoDB's JSON wire format.
fn json_value_size(value: &serde_json::Value) -> usize {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    let strings = |v: &serde_json::Value| -> Vec<usize> {
        v.as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str()).map(str::len).collect())
            .unwrap_or_default()
    };
    match kind.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(0, |n| n.len() / 2 + 2),
        "B" => inner.as_str().map_or(0, |b| b.len() * 3 / 4),
        "SS" | "NS" => strings(inner).iter().sum(),
        "BS" => strings(inner).iter().map(|n| n * 3 / 4).sum(),
        "M" => 3 + json_item_size(inner),
        "L" => {
            3 + inner
                .as_array()
                .map(|a| a.iter().map(|v| 1 + json_value_size(v)).sum())
                .unwrap_or(0)
        }
        _ => 1,
    }
}

fn json_item_size(item: &serde_json::Value) -> usize {
    item.as_object()
        .map(|o| o.iter().map(|(k, v)| k.len() + json_value_size(v)).sum())
        .unwrap_or(0)
}

/// What DynamoDB would bill for one request (base table, no GSIs). Updates
/// and deletes bill the stored item's size, which the request does not
/// show: the key and the values it sets stand in for it (every item here
/// is under 1 KB, so each is one unit).
fn billed_units(operation: &str, body: &serde_json::Value) -> f64 {
    let single = |b: &serde_json::Value| {
        let key = json_item_size(&b["Key"]);
        let values = json_item_size(&b["ExpressionAttributeValues"]);
        write_units(key + values)
    };
    match operation {
        "PutItem" => write_units(json_item_size(&body["Item"])),
        "UpdateItem" | "DeleteItem" => single(body),
        "BatchWriteItem" => body["RequestItems"]
            .as_object()
            .into_iter()
            .flat_map(|tables| tables.values())
            .filter_map(|requests| requests.as_array())
            .flatten()
            .map(|request| match request.get("PutRequest") {
                Some(put) => write_units(json_item_size(&put["Item"])),
                None => write_units(json_item_size(&request["DeleteRequest"]["Key"])),
            })
            .sum(),
        "TransactWriteItems" => body["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                2.0 * match item.get("Put") {
                    Some(put) => write_units(json_item_size(&put["Item"])),
                    None => item
                        .as_object()
                        .and_then(|o| o.values().next())
                        .map_or(1.0, single),
                }
            })
            .sum(),
        _ => 0.0,
    }
}

const WRITE_OPERATIONS: &[&str] = &[
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "BatchWriteItem",
    "TransactWriteItems",
];

fn micro(units: f64) -> u64 {
    (units * 1e6).round() as u64
}

fn unmicro(counter: &AtomicU64) -> f64 {
    counter.load(Ordering::Relaxed) as f64 / 1e6
}

impl Intercept for Meter {
    fn name(&self) -> &'static str {
        "CapacityMeter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let operation = target.split_once('.').map_or(target, |(_, op)| op);
        let body: serde_json::Value = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        cfg.interceptor_state().store_put(Pending {
            operation: operation.to_string(),
            sent: Instant::now(),
            billed: billed_units(operation, &body),
            write: WRITE_OPERATIONS.contains(&operation),
        });
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(pending) = cfg.load::<Pending>().cloned() else {
            return Ok(());
        };
        {
            let mut calls = self.0.calls.lock().expect("not poisoned");
            let entry = calls.entry(pending.operation.clone()).or_default();
            entry.calls += 1;
            entry.total_ms += pending.sent.elapsed().as_secs_f64() * 1e3;
        }
        self.0.spans.lock().expect("not poisoned").push((
            pending.sent,
            Instant::now(),
            pending.operation.clone(),
        ));
        let response = context.response();
        let body: serde_json::Value = response
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        let state = &self.0;
        if response.status().is_success() {
            state
                .billed_ok
                .fetch_add(micro(pending.billed), Ordering::Relaxed);
            let consumed = match &body["ConsumedCapacity"] {
                serde_json::Value::Array(list) => list.clone(),
                serde_json::Value::Null => Vec::new(),
                one => vec![one.clone()],
            };
            for capacity in consumed {
                let field = if pending.write {
                    "WriteCapacityUnits"
                } else {
                    "ReadCapacityUnits"
                };
                let units = capacity[field]
                    .as_f64()
                    .or(capacity["CapacityUnits"].as_f64())
                    .unwrap_or(0.0);
                let counter = if pending.write {
                    &state.reported_write
                } else {
                    &state.reported_read
                };
                counter.fetch_add(micro(units), Ordering::Relaxed);
            }
        } else {
            let kind = body["__type"].as_str().unwrap_or_default();
            if kind.ends_with("ConditionalCheckFailedException") {
                state.failed_conditions.fetch_add(1, Ordering::Relaxed);
                state
                    .billed_failed_conditions
                    .fetch_add(micro(pending.billed), Ordering::Relaxed);
            } else if kind.ends_with("TransactionCanceledException") {
                state.cancelled_transactions.fetch_add(1, Ordering::Relaxed);
                state
                    .billed_cancelled
                    .fetch_add(micro(pending.billed), Ordering::Relaxed);
            } else {
                state.other_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- minimum ---

/// The writes the projections need per source record, by kind: for each
/// record in stream order, the derived items whose value it changes.
fn minimum_writes(social: &[Record], user: &[Record]) -> BTreeMap<String, u64> {
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |kind: &str, n: u64| *kinds.entry(kind.to_string()).or_default() += n;
    let string = |item: Option<&Image>, name: &str| -> Option<String> {
        match item?.get(name)? {
            ValueRef::S(v) | ValueRef::N(v) => Some(v.to_string()),
            _ => None,
        }
    };
    for record in social.iter().flatten() {
        let sk = string(Some(&record.keys), "SK").unwrap_or_default();
        let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
        if sk.starts_with("FOLLOWS#") {
            match record.kind {
                ChangeKind::Insert | ChangeKind::Remove => {
                    add("inverse edge", 1);
                    add("counters", 2);
                }
                ChangeKind::Modify => {
                    if string(old, "followedAt") != string(new, "followedAt") {
                        add("inverse edge", 1);
                    }
                }
            }
        } else if sk.starts_with("ACHIEVEMENT#") {
            let keys = |item: Option<&Image>| {
                Some((
                    string(item, "tier")?,
                    format!("{:0>4}", string(item, "score")?),
                ))
            };
            if new.is_some() && keys(new) != keys(old) {
                add("achievement GSI keys", 1);
            }
        }
    }
    // user -> email id -> (address, primary); profiles that exist.
    let mut emails: HashMap<String, BTreeMap<String, (String, bool)>> = HashMap::new();
    let mut profiles: HashSet<String> = HashSet::new();
    let primary = |emails: &HashMap<String, BTreeMap<String, (String, bool)>>, user: &str| {
        emails
            .get(user)
            .and_then(|m| m.values().find(|(_, p)| *p).map(|(a, _)| a.clone()))
    };
    for record in user.iter().flatten() {
        let pk = string(Some(&record.keys), "PK").unwrap_or_default();
        let sk = string(Some(&record.keys), "SK").unwrap_or_default();
        let user = pk.trim_start_matches("USER#").to_string();
        let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
        let before = profiles.contains(&user).then(|| primary(&emails, &user));
        if sk == "PROFILE" {
            match new {
                Some(_) => profiles.insert(user.clone()),
                None => profiles.remove(&user),
            };
        } else if let Some(id) = sk.strip_prefix("EMAIL#") {
            let index_keys =
                |item: Option<&Image>| string(item, "email").map(|e| e.trim().to_lowercase());
            if new.is_some() && index_keys(new) != index_keys(old) {
                add("email GSI keys", 1);
            }
            let entry = emails.entry(user.clone()).or_default();
            match new {
                Some(item) => {
                    let is_primary = matches!(item.get("isPrimary"), Some(ValueRef::Bool(true)));
                    entry.insert(
                        id.to_string(),
                        (string(new, "email").unwrap_or_default(), is_primary),
                    );
                }
                None => {
                    entry.remove(id);
                }
            }
        }
        let after = profiles.contains(&user).then(|| primary(&emails, &user));
        if let Some(after) = after {
            // A new profile needs a write only when there is a value to copy.
            if before.map_or(after.is_some(), |b| b != after) {
                add("profile email", 1);
            }
        }
    }
    kinds
}

// ------------------------------------------------------------ contenders ---

/// What processing the records took.
#[derive(Default)]
struct Processing {
    latencies_ms: Vec<f64>,
    /// Each batch's start and end.
    windows: Vec<(Instant, Instant)>,
    batches: usize,
    stats: BatchStats,
    passes: usize,
    failed_deliveries: usize,
    /// Processing time per table (social, user).
    table_seconds: Vec<f64>,
}

/// ddb-projector: each table's records in batches through `apply_batch`;
/// a batch with a record not handled is delivered again from it, as Lambda
/// does with `batchItemFailures`. With `ledger`, each delivery is recorded
/// in the ledger of deliveries, as the Lambda handler and the runner do.
async fn run_projector(
    appliers: &[(Applier, &[Record])],
    batch: usize,
    ledger: bool,
) -> Processing {
    let mut processing = Processing::default();
    for (applier, records) in appliers {
        let table_started = Instant::now();
        for chunk in records.chunks(batch) {
            let started = Instant::now();
            processing.batches += 1;
            let mut start = 0;
            for pass in 1.. {
                assert!(pass <= 10, "a batch was still not handled after 10 passes");
                processing.passes += 1;
                let options = BatchOptions {
                    delivery: ledger.then(|| delivery(applier, &chunk[start..])).flatten(),
                    ..BatchOptions::default()
                };
                let outcome = applier
                    .apply_batch(&chunk[start..], &options)
                    .await
                    .unwrap_or_else(|error| panic!("the batch failed as a whole: {error}"));
                processing.stats.add(&outcome.stats);
                for status in &outcome.statuses {
                    if let RecordStatus::DeadLettered(reasons) = status {
                        panic!("a record was dead-lettered: {reasons:?}");
                    }
                }
                match outcome.first_failure() {
                    Some(index) => {
                        processing.failed_deliveries += 1;
                        start += index;
                    }
                    None => break,
                }
            }
            processing
                .latencies_ms
                .push(started.elapsed().as_secs_f64() * 1e3);
            processing.windows.push((started, Instant::now()));
        }
        processing
            .table_seconds
            .push(table_started.elapsed().as_secs_f64());
    }
    processing
}

/// The delivery `records` are, as the Lambda handler records it.
fn delivery(applier: &Applier, records: &[Record]) -> Option<Arc<Delivery>> {
    let table = &applier.spec().table;
    let delivered: Vec<Delivered> = records
        .iter()
        .flatten()
        .map(|record| Delivered {
            event_id: record.event_id.clone(),
            item: table.item_key(&record.keys),
            sequence_number: record.sequence_number.clone(),
        })
        .collect();
    let first_id = delivered.first()?.event_id.clone();
    let first = delivered.first()?.sequence_number.clone();
    let last = delivered.last()?.sequence_number.clone();
    Delivery::new(&first_id, first, last, Box::new(move || delivered.clone())).map(Arc::new)
}

/// The baseline: a stream handler as a team writes it by hand. For each
/// record in order, decide by key pattern and make sequential single-item
/// calls. Counters are plain `ADD`s on one item per user (not sharded, not
/// idempotent: a redelivered record counts twice).
struct Baseline {
    client: aws_sdk_dynamodb::Client,
    social_table: String,
    user_table: String,
}

/// The baseline's counters: `USER#{id} / COUNTS`, `followers`, `following`.
const BASELINE_COUNTS: &str = "COUNTS";

impl Baseline {
    fn image(record: &ChangeRecord, new: bool) -> Option<Attrs> {
        let image = if new {
            &record.new_image
        } else {
            &record.old_image
        };
        image.as_ref().map(|image| image.to_item().into())
    }

    fn key(record: &ChangeRecord) -> (String, String) {
        let keys: Attrs = record.keys.to_item().into();
        (text(&keys, "PK").unwrap(), text(&keys, "SK").unwrap())
    }

    async fn handle_social(&self, record: &ChangeRecord) {
        let (pk, sk) = Baseline::key(record);
        let table = &self.social_table;
        if let Some(followee) = sk.strip_prefix("FOLLOWS#") {
            let follower = pk.trim_start_matches("USER#");
            let inverse = attrs(&[
                ("PK", s(&format!("USER#{followee}"))),
                ("SK", s(&format!("FOLLOWED_BY#{follower}"))),
            ]);
            let delta = match record.kind {
                ChangeKind::Insert | ChangeKind::Modify => {
                    let new = Baseline::image(record, true).expect("a new image");
                    let mut item = inverse.clone();
                    item.insert("followerId".into(), s(follower));
                    item.insert("followeeId".into(), s(followee));
                    if let Some(at) = new.get("followedAt") {
                        item.insert("followedAt".into(), at.clone());
                    }
                    self.client
                        .put_item()
                        .table_name(table)
                        .set_item(Some(item))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await
                        .expect("put inverse edge");
                    if record.kind == ChangeKind::Modify {
                        return;
                    }
                    1
                }
                ChangeKind::Remove => {
                    self.client
                        .delete_item()
                        .table_name(table)
                        .set_key(Some(inverse))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await
                        .expect("delete inverse edge");
                    -1
                }
            };
            for (user, counter) in [(followee, "followers"), (follower, "following")] {
                self.client
                    .update_item()
                    .table_name(table)
                    .key("PK", s(&format!("USER#{user}")))
                    .key("SK", s(BASELINE_COUNTS))
                    .update_expression("ADD #c :d")
                    .expression_attribute_names("#c", counter)
                    .expression_attribute_values(":d", Av::N(delta.to_string()))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .expect("count");
            }
        } else if sk.starts_with("ACHIEVEMENT#") {
            let Some(new) = Baseline::image(record, true) else {
                return;
            };
            let score = new
                .get("score")
                .and_then(|v| v.as_n().ok())
                .cloned()
                .unwrap_or_default();
            self.set_gsi_keys(
                table,
                &pk,
                &sk,
                &format!("TIER#{}", text(&new, "tier").unwrap_or_default()),
                &format!("SCORE#{score:0>4}"),
            )
            .await;
        }
    }

    async fn handle_user(&self, record: &ChangeRecord) {
        let (pk, sk) = Baseline::key(record);
        if !sk.starts_with("EMAIL#") {
            return;
        }
        let table = &self.user_table;
        let user = pk.trim_start_matches("USER#");
        let primary = |image: &Option<Attrs>| {
            image
                .as_ref()
                .is_some_and(|i| i.get("isPrimary") == Some(&Av::Bool(true)))
        };
        let (old, new) = (
            Baseline::image(record, false),
            Baseline::image(record, true),
        );
        if let Some(item) = &new {
            let address = text(item, "email").unwrap_or_default();
            self.set_gsi_keys(
                table,
                &pk,
                &sk,
                &format!("EMAIL#{}", address.trim().to_lowercase()),
                &format!("USER#{user}"),
            )
            .await;
            if primary(&new) {
                self.set_profile_email(&pk, Some(address)).await;
                return;
            }
        }
        if primary(&old) {
            // It stopped being primary (or went): find the primary now.
            let emails = self
                .client
                .query()
                .table_name(table)
                .key_condition_expression("PK = :pk AND begins_with(SK, :e)")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":e", s("EMAIL#"))
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .expect("query emails");
            let address = emails
                .items()
                .iter()
                .find(|e| e.get("isPrimary") == Some(&Av::Bool(true)))
                .and_then(|e| text(e, "email"));
            self.set_profile_email(&pk, address).await;
        }
    }

    /// `SET GSI1PK, GSI1SK` while the item exists (an unconditional update
    /// of an item deleted since would bring it back as a ghost).
    async fn set_gsi_keys(&self, table: &str, pk: &str, sk: &str, gsi_pk: &str, gsi_sk: &str) {
        let sent = self
            .client
            .update_item()
            .table_name(table)
            .key("PK", s(pk))
            .key("SK", s(sk))
            .update_expression("SET GSI1PK = :p, GSI1SK = :s")
            .condition_expression("attribute_exists(PK)")
            .expression_attribute_values(":p", s(gsi_pk))
            .expression_attribute_values(":s", s(gsi_sk))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        if let Err(error) = sent {
            let deleted = error
                .as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception());
            assert!(deleted, "set GSI keys: {error:?}");
        }
    }

    async fn set_profile_email(&self, pk: &str, address: Option<String>) {
        let request = self
            .client
            .update_item()
            .table_name(&self.user_table)
            .key("PK", s(pk))
            .key("SK", s("PROFILE"))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let request = match address {
            Some(address) => request
                .update_expression("SET email = :e")
                .expression_attribute_values(":e", s(&address)),
            None => request.update_expression("REMOVE email"),
        };
        request.send().await.expect("update profile");
    }
}

async fn run_baseline(
    baseline: &Baseline,
    social: &[Record],
    user: &[Record],
    batch: usize,
) -> Processing {
    let mut processing = Processing::default();
    for (records, social_table) in [(social, true), (user, false)] {
        let table_started = Instant::now();
        for chunk in records.chunks(batch) {
            let started = Instant::now();
            processing.batches += 1;
            processing.passes += 1;
            for record in chunk.iter().flatten() {
                if social_table {
                    baseline.handle_social(record).await;
                } else {
                    baseline.handle_user(record).await;
                }
            }
            processing
                .latencies_ms
                .push(started.elapsed().as_secs_f64() * 1e3);
            processing.windows.push((started, Instant::now()));
        }
        processing
            .table_seconds
            .push(table_started.elapsed().as_secs_f64());
    }
    processing
}

// ----------------------------------------------------------------- check ---

/// Every difference between the derived state and what the final source
/// items imply; `projector` says where the counters live.
async fn check_state(
    client: &aws_sdk_dynamodb::Client,
    social_table: &str,
    user_table: &str,
    social: &History,
    user: &History,
    projector: bool,
) -> (Vec<String>, (i64, i64)) {
    let mut problems = Vec::new();
    let items = scan_all(client, social_table).await;
    let by_key: HashMap<(String, String), &Attrs> = items
        .iter()
        .map(|item| (History::key(item), item))
        .collect();
    let mut want: BTreeMap<(String, &str), i64> = BTreeMap::new();
    let mut edges = 0;
    for ((pk, sk), item) in &social.items {
        if let Some(b) = sk.strip_prefix("FOLLOWS#") {
            let a = pk.trim_start_matches("USER#");
            *want.entry((b.to_string(), "followers")).or_default() += 1;
            *want.entry((a.to_string(), "following")).or_default() += 1;
            match by_key.get(&(format!("USER#{b}"), format!("FOLLOWED_BY#{a}"))) {
                None => problems.push(format!("{pk}/{sk}: no inverse edge")),
                Some(edge) if edge.get("followedAt") != item.get("followedAt") => {
                    problems.push(format!("{pk}/{sk}: the inverse edge's followedAt differs"))
                }
                Some(_) => {}
            }
        } else if sk.starts_with("ACHIEVEMENT#") {
            let found = by_key.get(&(pk.clone(), sk.clone()));
            let score = item.get("score").and_then(|v| v.as_n().ok()).unwrap();
            let expected = (
                Some(format!("TIER#{}", text(item, "tier").unwrap())),
                Some(format!("SCORE#{score:0>4}")),
            );
            let have = found.map(|f| (text(f, "GSI1PK"), text(f, "GSI1SK")));
            if have != Some(expected.clone()) {
                problems.push(format!(
                    "{pk}/{sk}: GSI1 keys {have:?}, expected {expected:?}"
                ));
            }
        }
    }
    let mut have: BTreeMap<(String, &str), i64> = BTreeMap::new();
    for item in &items {
        let (pk, sk) = History::key(item);
        if sk.starts_with("FOLLOWED_BY#") {
            edges += 1;
        }
        let count = |name: &str| {
            item.get(name)
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0)
        };
        if projector {
            for counter in ["followers", "following"] {
                let prefix = format!("COUNTER#{counter}#");
                if let Some((user, _shard)) = pk
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.rsplit_once('#'))
                {
                    *have.entry((user.to_string(), counter)).or_default() +=
                        count(ddb_projector::dynamo::names::COUNT_ATTRIBUTE);
                }
            }
        } else if sk == BASELINE_COUNTS {
            let user = pk.trim_start_matches("USER#").to_string();
            for counter in ["followers", "following"] {
                *have.entry((user.clone(), counter)).or_default() += count(counter);
            }
        }
    }
    let follows = social
        .items
        .keys()
        .filter(|(_, sk)| sk.starts_with("FOLLOWS#"))
        .count();
    if edges != follows {
        problems.push(format!("{edges} inverse edges for {follows} follows"));
    }
    have.retain(|_, v| *v != 0);
    if have != want {
        let wrong: Vec<String> = want
            .iter()
            .filter(|(k, v)| have.get(k) != Some(v))
            .map(|((user, counter), v)| {
                format!(
                    "{user}: {counter} = {:?}, expected {v}",
                    have.get(&(user.clone(), *counter))
                )
            })
            .chain(
                have.iter()
                    .filter(|(k, _)| !want.contains_key(k))
                    .map(|((user, counter), v)| format!("{user}: {counter} = {v}, expected 0")),
            )
            .collect();
        problems.extend(wrong);
    }
    let star = (
        want.get(&(STAR.to_string(), "followers"))
            .copied()
            .unwrap_or(0),
        have.get(&(STAR.to_string(), "followers"))
            .copied()
            .unwrap_or(0),
    );

    let items = scan_all(client, user_table).await;
    let by_key: HashMap<(String, String), &Attrs> = items
        .iter()
        .map(|item| (History::key(item), item))
        .collect();
    let mut primaries: HashMap<String, String> = HashMap::new();
    for ((pk, sk), item) in &user.items {
        if sk.starts_with("EMAIL#") {
            let address = text(item, "email").unwrap();
            let expected = (
                Some(format!("EMAIL#{}", address.trim().to_lowercase())),
                Some(pk.clone()),
            );
            let have = by_key
                .get(&(pk.clone(), sk.clone()))
                .map(|f| (text(f, "GSI1PK"), text(f, "GSI1SK")));
            if have != Some(expected.clone()) {
                problems.push(format!(
                    "{pk}/{sk}: GSI1 keys {have:?}, expected {expected:?}"
                ));
            }
            if item.get("isPrimary") == Some(&Av::Bool(true)) {
                primaries.insert(pk.clone(), address);
            }
        }
    }
    for ((pk, sk), _) in user.items.iter().filter(|((_, sk), _)| sk == "PROFILE") {
        let have = by_key
            .get(&(pk.clone(), sk.clone()))
            .and_then(|p| text(p, "email"));
        if have.as_ref() != primaries.get(pk) {
            problems.push(format!(
                "{pk}/PROFILE: email {have:?}, expected {:?}",
                primaries.get(pk)
            ));
        }
    }
    for item in &items {
        let key = History::key(item);
        if !key.0.starts_with("_ddbp#") && !user.items.contains_key(&key) {
            problems.push(format!("{}/{}: an item no writer wrote", key.0, key.1));
        }
    }
    (problems, star)
}

// ------------------------------------------------------------------- run ---

/// One run's results, as `report` reads them back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunResult {
    contender: String,
    batch: usize,
    /// Simulated latency added to each call (0: none).
    #[serde(default)]
    latency_ms: f64,
    /// Round-trip time of the TCP proxy the calls went through (0: none).
    #[serde(default)]
    rtt_ms: f64,
    /// Sequential round trips per batch: the longest chain of calls each
    /// sent after the one before was answered (mean and most).
    #[serde(default)]
    round_trips_mean: f64,
    #[serde(default)]
    round_trips_max: usize,
    seed: u64,
    records: usize,
    social_records: usize,
    user_records: usize,
    batches: usize,
    passes: usize,
    failed_deliveries: usize,
    setup_seconds: f64,
    seconds: f64,
    /// Processing time of the social table's records, then the user table's.
    table_seconds: Vec<f64>,
    records_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    reported_write_units: f64,
    reported_read_units: f64,
    /// The billing model: everything sent, failures included.
    billed_units: f64,
    billed_failed_conditions: f64,
    billed_cancelled_transactions: f64,
    failed_conditions: u64,
    cancelled_transactions: u64,
    other_errors: u64,
    minimum_units: u64,
    minimum_by_kind: BTreeMap<String, u64>,
    calls: BTreeMap<String, OperationStats>,
    /// Every call the contender made (all operations, retries included),
    /// per record.
    #[serde(default)]
    requests_per_record: f64,
    /// The requests `BatchStats` counted by purpose (the projector only).
    #[serde(default)]
    requests_by_purpose: Option<ddb_projector::apply::Requests>,
    /// What `BatchStats` counted (the projector only).
    applier_write_units: Option<f64>,
    applier_read_units: Option<f64>,
    applier_writes: Option<usize>,
    retries: Option<u64>,
    /// Invariant scopes checked and violations found (the projector only).
    check_scopes: Option<usize>,
    violations: Option<usize>,
    rss_before_mb: f64,
    peak_rss_mb: f64,
    hot_user_followers: i64,
    hot_user_followers_found: i64,
    problems: Vec<String>,
}

fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn run(
    contender: &str,
    batch: usize,
    records: usize,
    seed: u64,
    latency_ms: f64,
    rtt_ms: f64,
) -> RunResult {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Without the rollups (the counters' totals on the profile): the
    // hand-written handler does not keep them, and the series compares
    // the same work since before they were shipped.
    let text =
        std::fs::read_to_string(root.join("projections/social-service.toml")).expect("social spec");
    let (start, end) = (
        text.find("# The counters' totals on the profile")
            .expect("the rollups' comment"),
        text.find("# Leaderboard by tier")
            .expect("the leaderboard's comment"),
    );
    let social_spec = Arc::new(
        Spec::from_toml(
            &format!("{}{}", &text[..start], &text[end..]),
            "social-service.toml",
        )
        .expect("social spec"),
    );
    let user_spec =
        Arc::new(Spec::from_file(&root.join("projections/user-service.toml")).expect("user spec"));
    let config = aws_config::load_from_env().await;
    let plain = aws_sdk_dynamodb::Client::new(&config);
    let streams = aws_sdk_dynamodbstreams::Client::new(&config);
    let social_table = social_spec.table.name.clone();
    let user_table = user_spec.table.name.clone();

    let setup = Instant::now();
    for (spec, table) in [(&social_spec, &social_table), (&user_spec, &user_table)] {
        ddb_projector::table::create_table(&plain, spec, table)
            .await
            .expect("create table");
    }
    let mut rng = Rng(seed.max(1));
    let social_target = records * 2 / 3;
    let social_history = social_history(&mut rng, social_target);
    let user_history = user_history(&mut rng, records - social_target);
    tokio::join!(
        write_history(&plain, &social_table, &social_history),
        write_history(&plain, &user_table, &user_history)
    );
    let social = read_stream(&plain, &streams, &social_table).await;
    let user = read_stream(&plain, &streams, &user_table).await;
    assert_eq!(
        social.len(),
        social_history.ops.len(),
        "social stream records"
    );
    assert_eq!(user.len(), user_history.ops.len(), "user stream records");
    let setup_seconds = setup.elapsed().as_secs_f64();
    let minimum = minimum_writes(&social, &user);

    let meter = Meter::default();
    let mut builder = aws_sdk_dynamodb::config::Builder::from(&config).interceptor(meter.clone());
    if latency_ms > 0.0 {
        let inner = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .build_https();
        builder = builder.http_client(delayed(inner, Duration::from_secs_f64(latency_ms / 1e3)));
    }
    if rtt_ms > 0.0 {
        let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
        let upstream = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .replace("localhost", "127.0.0.1")
            .parse()
            .unwrap_or_else(|e| panic!("{endpoint}: not host:port: {e}"));
        let proxy = start_proxy(upstream, Duration::from_secs_f64(rtt_ms / 1e3)).await;
        builder = builder.endpoint_url(format!("http://{proxy}"));
    }
    let client = aws_sdk_dynamodb::Client::from_conf(builder.build());
    let rss_before_mb = status_kib("VmRSS:") / 1024.0;
    // Resets VmHWM to the current RSS: the peak is the processing's own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let started = Instant::now();
    let (processing, is_projector) = match contender {
        "projector" | "projector-nochecks" | "projector-noledger" => {
            let apply = ApplyConfig {
                check_invariants: contender != "projector-nochecks",
                ..ApplyConfig::default()
            };
            let appliers = [
                (
                    control::applier(
                        client.clone(),
                        social_spec.clone(),
                        &social_table,
                        apply.clone(),
                    ),
                    social.as_slice(),
                ),
                (
                    control::applier(client.clone(), user_spec.clone(), &user_table, apply),
                    user.as_slice(),
                ),
            ];
            let ledger = contender != "projector-noledger";
            (run_projector(&appliers, batch, ledger).await, true)
        }
        "baseline" => {
            let baseline = Baseline {
                client: client.clone(),
                social_table: social_table.clone(),
                user_table: user_table.clone(),
            };
            (run_baseline(&baseline, &social, &user, batch).await, false)
        }
        other => panic!(
            "unknown contender `{other}` (projector, projector-nochecks, projector-noledger, baseline)"
        ),
    };
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_mb = status_kib("VmHWM:") / 1024.0;

    let (problems, (hot_user_followers, hot_user_followers_found)) = check_state(
        &plain,
        &social_table,
        &user_table,
        &social_history,
        &user_history,
        is_projector,
    )
    .await;
    let n = social.len() + user.len();
    let mut latencies = processing.latencies_ms.clone();
    latencies.sort_by(f64::total_cmp);
    let state = &meter.0;
    let calls = state.calls.lock().expect("not poisoned").clone();
    let spans = state.spans.lock().expect("not poisoned").clone();
    let trips: Vec<usize> = processing
        .windows
        .iter()
        .map(|&(start, end)| {
            let mut within: Vec<Span> = spans
                .iter()
                .filter(|span| span.0 >= start && span.0 <= end)
                .cloned()
                .collect();
            let (length, operations) = sequential_round_trips(&mut within);
            if std::env::var_os("BENCH_TRACE_CHAIN").is_some() {
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for span in &within {
                    *counts.entry(span.2.as_str()).or_default() += 1;
                }
                let mut edges: Vec<(Instant, i32)> = within
                    .iter()
                    .flat_map(|span| [(span.0, 1), (span.1, -1)])
                    .collect();
                edges.sort();
                let (mut in_flight, mut most) = (0, 0);
                for (_, step) in edges {
                    in_flight += step;
                    most = most.max(in_flight);
                }
                eprintln!(
                    "{length} round trips in {:.0} ms, {most} in flight at most: {} (calls: {counts:?})",
                    (end - start).as_secs_f64() * 1e3,
                    operations.join(" > ")
                );
            }
            length
        })
        .collect();
    RunResult {
        contender: contender.to_string(),
        batch,
        latency_ms,
        rtt_ms,
        round_trips_mean: trips.iter().sum::<usize>() as f64 / trips.len().max(1) as f64,
        round_trips_max: trips.iter().copied().max().unwrap_or(0),
        seed,
        records: n,
        social_records: social.len(),
        user_records: user.len(),
        batches: processing.batches,
        passes: processing.passes,
        failed_deliveries: processing.failed_deliveries,
        setup_seconds,
        seconds,
        table_seconds: processing.table_seconds.clone(),
        records_per_s: n as f64 / seconds,
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        reported_write_units: unmicro(&state.reported_write),
        reported_read_units: unmicro(&state.reported_read),
        billed_units: unmicro(&state.billed_ok)
            + unmicro(&state.billed_failed_conditions)
            + unmicro(&state.billed_cancelled),
        billed_failed_conditions: unmicro(&state.billed_failed_conditions),
        billed_cancelled_transactions: unmicro(&state.billed_cancelled),
        failed_conditions: state.failed_conditions.load(Ordering::Relaxed),
        cancelled_transactions: state.cancelled_transactions.load(Ordering::Relaxed),
        other_errors: state.other_errors.load(Ordering::Relaxed),
        minimum_units: minimum.values().sum(),
        minimum_by_kind: minimum,
        requests_per_record: calls.values().map(|c| c.calls).sum::<u64>() as f64 / n as f64,
        requests_by_purpose: is_projector.then(|| processing.stats.requests.clone()),
        calls,
        applier_write_units: is_projector.then_some(processing.stats.write_units),
        applier_read_units: is_projector.then_some(processing.stats.read_units),
        applier_writes: is_projector.then_some(processing.stats.writes),
        retries: is_projector.then_some(processing.stats.retries),
        check_scopes: is_projector.then_some(processing.stats.checks.scopes),
        violations: is_projector.then_some(processing.stats.checks.violations),
        rss_before_mb,
        peak_rss_mb,
        hot_user_followers,
        hot_user_followers_found,
        problems,
    }
}

// ---------------------------------------------------------------- report ---

fn label(contender: &str) -> &str {
    match contender {
        "projector" => "ddb-projector",
        "projector-nochecks" => "ddb-projector, checks off",
        "projector-noledger" => "ddb-projector, no ledger of deliveries",
        "baseline" => "hand-written baseline",
        other => other,
    }
}

/// What a run's calls went through, for its label.
fn conditions(r: &RunResult) -> String {
    if r.rtt_ms > 0.0 {
        format!(", {} ms round trip (proxy)", r.rtt_ms)
    } else if r.latency_ms > 0.0 {
        format!(", +{} ms simulated latency per call", r.latency_ms)
    } else {
        String::new()
    }
}

fn report(runs_dir: &Path, json: &Path, svg: &Path) {
    let mut runs: Vec<RunResult> = std::fs::read_dir(runs_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", runs_dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).expect("read a run");
            serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()))
        })
        .collect();
    let order = |c: &str| match c {
        "projector" => 0,
        "projector-nochecks" => 1,
        "projector-noledger" => 2,
        _ => 3,
    };
    runs.sort_by_key(|r| {
        (
            (r.latency_ms * 1e3) as u64,
            (r.rtt_ms * 1e3) as u64,
            order(&r.contender),
            r.batch,
        )
    });
    println!("| contender | batch | records | records/s | batch p50 / p99 (ms) | sequential round trips per batch (mean / most) | requests/record | reported WU/record | billed WU/record (model) | of which cancelled transactions | minimum WU/record | billed ÷ minimum (without cancelled) | peak RSS, MB (before processing) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
        let per = |units: f64| units / r.records as f64;
        let minimum = r.minimum_units.max(1) as f64;
        println!(
            "| {}{} | {} | {} | {:.0} | {:.0} / {:.0} | {:.1} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x ({:.2}x) | {:.1} ({:.1}) |",
            label(&r.contender),
            conditions(r),
            r.batch,
            r.records,
            r.records_per_s,
            r.p50_ms,
            r.p99_ms,
            r.round_trips_mean,
            r.round_trips_max,
            r.requests_per_record,
            per(r.reported_write_units),
            per(r.billed_units),
            per(r.billed_cancelled_transactions),
            per(r.minimum_units as f64),
            r.billed_units / minimum,
            (r.billed_units - r.billed_cancelled_transactions) / minimum,
            r.peak_rss_mb,
            r.rss_before_mb
        );
    }
    // Calls per record by operation, and the cancelled transactions.
    let operations = [
        "GetItem",
        "Query",
        "BatchGetItem",
        "UpdateItem",
        "PutItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactWriteItems",
    ];
    println!();
    println!(
        "| contender | batch | {} | of which cancelled | all requests |",
        operations.join(" | ")
    );
    println!("|---|---|{}---|---|", "---|".repeat(operations.len()));
    for r in &runs {
        let per = |calls: u64| calls as f64 / r.records as f64;
        let cells: Vec<String> = operations
            .iter()
            .map(|op| format!("{:.3}", per(r.calls.get(*op).map_or(0, |c| c.calls))))
            .collect();
        println!(
            "| {}{} | {} | {} | {} | {:.3} |",
            label(&r.contender),
            conditions(r),
            r.batch,
            cells.join(" | "),
            r.cancelled_transactions,
            r.requests_per_record
        );
    }
    let find = |contender: &str, batch: usize| {
        runs.iter().find(|r| {
            r.contender == contender && r.batch == batch && r.latency_ms == 0.0 && r.rtt_ms == 0.0
        })
    };
    let mut ratios = BTreeMap::new();
    println!();
    for batch in [1, 10, 100, 1000] {
        if let (Some(p), Some(b)) = (find("projector", batch), find("baseline", batch)) {
            let ratio = p.records_per_s / b.records_per_s;
            ratios.insert(batch.to_string(), ratio);
            println!("B={batch}: ddb-projector / baseline records/s = {ratio:.2}x");
        }
    }
    let mut simulated = BTreeMap::new();
    for p in runs
        .iter()
        .filter(|r| r.contender == "projector" && (r.latency_ms > 0.0 || r.rtt_ms > 0.0))
    {
        let baseline = runs.iter().find(|r| {
            r.contender == "baseline"
                && r.batch == p.batch
                && r.latency_ms == p.latency_ms
                && r.rtt_ms == p.rtt_ms
        });
        if let Some(b) = baseline {
            let ratio = p.records_per_s / b.records_per_s;
            if p.rtt_ms > 0.0 {
                simulated.insert(format!("{}@{}ms-rtt", p.batch, p.rtt_ms), ratio);
                println!(
                    "B={} through a {} ms round-trip proxy: ddb-projector / baseline records/s = {ratio:.2}x; sequential round trips per batch {:.1} (most {}) against {:.1}",
                    p.batch, p.rtt_ms, p.round_trips_mean, p.round_trips_max, b.round_trips_mean
                );
            } else {
                simulated.insert(format!("{}@{}ms", p.batch, p.latency_ms), ratio);
                println!(
                    "B={} with +{} ms simulated latency per call: ddb-projector / baseline records/s = {ratio:.2}x (a what-if, not a measurement of DynamoDB)",
                    p.batch, p.latency_ms
                );
            }
        }
    }
    let headline = find("projector", 100);
    let speed_target = ratios.get("100").map(|r| *r >= 5.0);
    let units_ratio = headline.map(|p| p.billed_units / p.minimum_units.max(1) as f64);
    let units_ratio_uncancelled = headline.map(|p| {
        (p.billed_units - p.billed_cancelled_transactions) / p.minimum_units.max(1) as f64
    });
    let units_target = units_ratio.map(|r| r <= 1.2);
    let units_target_uncancelled = units_ratio_uncancelled.map(|r| r <= 1.2);
    let say = |met: Option<bool>| match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    println!(
        "targets at B=100: >= 5x the baseline's records/s: {} ({}); billed write units within 1.2x of the minimum: {} ({}; {} if cancelled transactions are free: {})",
        say(speed_target),
        ratios.get("100").map_or("-".to_string(), |r| format!("{r:.2}x")),
        say(units_target),
        units_ratio.map_or("-".to_string(), |r| format!("{r:.2}x")),
        say(units_target_uncancelled),
        units_ratio_uncancelled.map_or("-".to_string(), |r| format!("{r:.2}x"))
    );
    let merged = serde_json::json!({
        "runs": runs,
        "records_per_s_ratio_projector_over_baseline": ratios,
        "records_per_s_ratio_with_simulated_latency": simulated,
        "targets": {
            "records_per_s_at_least_5x_baseline_at_batch_100": speed_target,
            "billed_units_within_1_2x_minimum_at_batch_100": units_target,
            "billed_over_minimum_at_batch_100": units_ratio,
            "billed_without_cancelled_transactions_over_minimum_at_batch_100": units_ratio_uncancelled,
            "billed_units_within_1_2x_minimum_if_cancelled_transactions_are_free": units_target_uncancelled,
        },
    });
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir).expect("create the results folder");
    }
    std::fs::write(json, serde_json::to_string_pretty(&merged).expect("json"))
        .expect("write results");
    chart(&runs, svg).expect("draw the chart");
    eprintln!("wrote {} and {}", json.display(), svg.display());
}

fn chart(runs: &[RunResult], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let runs: Vec<&RunResult> = runs
        .iter()
        .filter(|r| r.latency_ms == 0.0 && r.rtt_ms == 0.0)
        .collect();
    let max = runs.iter().map(|r| r.records_per_s).fold(1.0, f64::max);
    let min = runs
        .iter()
        .map(|r| r.records_per_s)
        .fold(f64::INFINITY, f64::min)
        .min(max);
    let root = SVGBackend::new(path, (760, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "records/s against batch size (DynamoDB Local, 2 shared cores)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (0.7f64..1500f64).log_scale(),
            // From a power of ten, so the axis always has labelled points.
            (10f64.powf((min / 1.5).max(1.0).log10().floor())..max * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("batch size (records per batch, log scale)")
        .y_desc("records/s (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let series = [
        ("projector", RGBColor(31, 119, 180)),
        ("projector-nochecks", RGBColor(44, 160, 44)),
        ("baseline", RGBColor(214, 39, 40)),
    ];
    for (contender, color) in series {
        let points: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.contender == contender)
            .map(|r| (r.batch as f64, r.records_per_s))
            .collect();
        if points.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label(contender))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
