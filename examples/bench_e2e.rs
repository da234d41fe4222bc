//! End-to-end benchmark: ddb-projector against a hand-written baseline
//! handler, on DynamoDB Local. Run it with `scripts/bench e2e [RECORDS]`,
//! which starts a fresh DynamoDB Local for every (contender, batch size)
//! run, then merges the runs into a table, `target/bench-e2e/results.json`
//! and the chart `docs/bench-e2e.svg`.
//!
//! One run (`bench_e2e run --contender C --batch B --records N --out FILE
//! [--workloads social,user,ads]`, `AWS_ENDPOINT_URL` set) covers one
//! workload per shipped spec, each in its own table (`--records` split
//! social 40%, user 30%, ads 30% over the chosen ones):
//!
//! - **social** (`projections/social-service.toml`, whole): follows,
//!   unfollows and re-follows with one hot user receiving 30% of new
//!   follows, achievements with tier and score changes, and profiles
//!   (created before or after their users' first follows, rewritten,
//!   a few deleted and created again) carrying the rollups' totals;
//! - **user** (`projections/user-service.toml`): profiles with three
//!   emails each, primary-email switches, address changes, email removes
//!   and inserts;
//! - **ads** (`projections/ads-platform.toml`): advertisers, campaigns
//!   with status changes, ad groups, and mostly daily performance
//!   snapshots (written, corrected, a few deleted, some before their
//!   campaign exists) that drive the aggregate `campaign-totals`.
//!
//! The run:
//!
//! 1. creates each workload's table as `ddb-projector table create` does
//!    (streams on, `NEW_AND_OLD_IMAGES`);
//! 2. writes the seeded workloads as plain writers would;
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
//!    profile total, GSI key, copied email and campaign total), so neither
//!    contender wins by being wrong.
//!
//! Beside the whole run's figures, each workload (table) gets its own:
//! records/s over its processing time, sequential round trips per batch
//! (steady state, first batch, most), requests, billed and minimum write
//! units per record, and for the projector recomputes per batch and
//! requests by purpose (`workloads` in the run's results; the report's
//! per-workload table and `docs/bench-e2e-specs.svg`).
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
//!   counter, a changed GSI key pair, a changed copied email, each profile
//!   total item and campaign item moved; see [`minimum_writes`]), with no
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
        /// Source writes (stream records) at least, over all the tables.
        #[arg(long, default_value_t = 20_000)]
        records: usize,
        /// The workloads, one table each, processed in this order
        /// (`social`, `user`, `ads`, comma-separated).
        #[arg(long, default_value = "social,user,ads")]
        workloads: String,
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
        /// The per-workload chart (B=1000, records/s per round-trip time).
        #[arg(long, default_value = "docs/bench-e2e-specs.svg")]
        specs_svg: PathBuf,
    },
}

#[tokio::main]
async fn main() {
    match Cli::parse().command {
        Command::Run {
            contender,
            batch,
            records,
            workloads,
            seed,
            out,
            latency_ms,
            rtt_ms,
        } => {
            let workloads = Workload::parse_list(&workloads);
            let result = run(
                &contender,
                batch.max(1),
                records,
                &workloads,
                seed,
                latency_ms,
                rtt_ms,
            )
            .await;
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
            for w in &result.workloads {
                eprintln!(
                    "  {}: {} records in {} batches, {:.0} records/s; round trips per batch {:.1} (first {}, most {}); requests/record {:.2}; billed WU/record {:.2}, minimum {:.2}{}; {} problems",
                    w.workload,
                    w.records,
                    w.batches,
                    w.records_per_s,
                    w.round_trips_steady_mean,
                    w.round_trips_first,
                    w.round_trips_max,
                    w.requests_per_record,
                    w.billed_units_per_record,
                    w.minimum_units_per_record,
                    w.recomputes_per_batch
                        .map_or(String::new(), |r| format!("; recomputes/batch {r:.1}")),
                    w.problems
                );
            }
            if !result.problems.is_empty() {
                for problem in result.problems.iter().take(20) {
                    eprintln!("  {problem}");
                }
                std::process::exit(1);
            }
        }
        Command::Report {
            runs,
            json,
            svg,
            specs_svg,
        } => report(&runs, &json, &svg, &specs_svg),
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

/// The workloads, one per shipped spec, each in its own table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Social,
    User,
    Ads,
}

impl Workload {
    const ALL: [Workload; 3] = [Workload::Social, Workload::User, Workload::Ads];

    fn name(self) -> &'static str {
        match self {
            Workload::Social => "social",
            Workload::User => "user",
            Workload::Ads => "ads",
        }
    }

    fn spec_file(self) -> &'static str {
        match self {
            Workload::Social => "projections/social-service.toml",
            Workload::User => "projections/user-service.toml",
            Workload::Ads => "projections/ads-platform.toml",
        }
    }

    /// Its share of `--records`, against the other chosen workloads'.
    fn share(self) -> usize {
        match self {
            Workload::Social => 4,
            Workload::User | Workload::Ads => 3,
        }
    }

    /// `social,user,ads` (any of them, in the order to process them).
    fn parse_list(list: &str) -> Vec<Workload> {
        let mut out: Vec<Workload> = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let workload = Workload::ALL
                .into_iter()
                .find(|w| w.name() == name)
                .unwrap_or_else(|| panic!("unknown workload `{name}` (social, user, ads)"));
            if !out.contains(&workload) {
                out.push(workload);
            }
        }
        assert!(!out.is_empty(), "no workload chosen (social, user, ads)");
        out
    }

    /// The seeded writes of about `target` records.
    fn history(self, rng: &mut Rng, target: usize) -> History {
        match self {
            Workload::Social => social_history(rng, target),
            Workload::User => user_history(rng, target),
            Workload::Ads => ads_history(rng, target),
        }
    }
}

/// `records` split over `workloads` by their shares (the last takes the
/// rest), in their order.
fn split_records(records: usize, workloads: &[Workload]) -> Vec<usize> {
    let total: usize = workloads.iter().map(|w| w.share()).sum();
    let mut left = records;
    workloads
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let n = if i + 1 == workloads.len() {
                left
            } else {
                records * w.share() / total
            };
            left -= n;
            n
        })
        .collect()
}

/// Follows (30% of new ones to the hot user), unfollows, re-follows with a
/// new `followedAt`, achievements whose tier or score changes, and (15%
/// of the steps) profiles `USER#{u} / PROFILE`, the rollups' targets:
/// about 85% of the users (the hot user first) get one at some point of
/// the history, so some before and some after their first follows; the
/// others' steps rewrite a profile with a new `displayName` (a plain Put
/// replacing the item, which wipes the totals) or, one in ten, delete it;
/// a deleted profile picked again is created again.
fn social_history(rng: &mut Rng, target: usize) -> History {
    let mut history = History::default();
    let users: Vec<String> = (0..(target / 8).max(50))
        .map(|i| format!("u{i:05}"))
        .collect();
    // The users still to get a profile, in a seeded order, the hot user
    // (popped from the end) first.
    let mut pending: Vec<String> = users.iter().filter(|_| rng.chance(85)).cloned().collect();
    for i in (1..pending.len()).rev() {
        pending.swap(i, rng.below(i as u64 + 1) as usize);
    }
    pending.push(STAR.to_string());
    // The users that have had a profile.
    let mut profiled: Vec<String> = Vec::new();
    // The follows that exist, to pick unfollows and re-follows from.
    let mut follows: Vec<(String, String)> = Vec::new();
    let mut step = 0;
    while history.ops.len() < target {
        step += 1;
        if rng.chance(15) {
            if !pending.is_empty() && (profiled.is_empty() || rng.chance(75)) {
                let user = pending.pop().expect("not empty");
                history.put(social_profile(&user, 0));
                profiled.push(user);
            } else {
                let user = profiled[rng.below(profiled.len() as u64) as usize].clone();
                let pk = format!("USER#{user}");
                if history.get(&pk, "PROFILE").is_some() && rng.chance(10) {
                    history.delete(&pk, "PROFILE");
                } else {
                    // A new display name, or the profile created again.
                    history.put(social_profile(&user, step));
                }
            }
            continue;
        }
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

/// The ads platform: advertisers (`PROFILE#{p} / METADATA`), campaigns
/// created along the history (3% of the steps: `PROFILE#{p} /
/// CAMPAIGN#{c}`, `CAMPAIGN#{c} / METADATA` with status ENABLED, one or
/// two ad groups), campaign rewrites (7%: a plain Put replacing the item,
/// most with a new status, which moves its GSI1 keys, the others with a
/// new name), new ad groups (2%), and the rest daily performance
/// snapshots `CAMPAIGN#{c} / PERF#{date}` (about 80% of the writes: a
/// campaign's next day, a correction of a day it has, or one in twenty a
/// delete); one snapshot in ten goes to one of the next campaigns, whose
/// METADATA is not written yet.
fn ads_history(rng: &mut Rng, target: usize) -> History {
    const STATUSES: [&str; 3] = ["ENABLED", "PAUSED", "ARCHIVED"];
    let mut history = History::default();
    let advertisers = (target / 300).max(3);
    let campaigns = (target / 40).max(10);
    let campaign = |i: usize| format!("c{i:05}");
    // Per campaign: its advertiser, its next day, the days it has.
    let owner: Vec<usize> = (0..campaigns)
        .map(|_| rng.below(advertisers as u64) as usize)
        .collect();
    let mut next_day = vec![0u32; campaigns];
    let mut days: Vec<Vec<u32>> = vec![Vec::new(); campaigns];
    let mut ad_groups = vec![0usize; campaigns];
    // Campaigns `..created` exist.
    let mut created = 0;
    let mut step = 0;
    while history.ops.len() < target {
        step += 1;
        let roll = rng.below(100);
        if created < campaigns && (created == 0 || roll < 3) {
            let (c, p) = (campaign(created), format!("p{:04}", owner[created]));
            if history.get(&format!("PROFILE#{p}"), "METADATA").is_none() {
                history.put(attrs(&[
                    ("PK", s(&format!("PROFILE#{p}"))),
                    ("SK", s("METADATA")),
                    ("profileId", s(&p)),
                    ("name", s(&format!("Advertiser {p}"))),
                ]));
            }
            history.put(attrs(&[
                ("PK", s(&format!("PROFILE#{p}"))),
                ("SK", s(&format!("CAMPAIGN#{c}"))),
                ("profileId", s(&p)),
                ("campaignId", s(&c)),
            ]));
            history.put(campaign_item(&c, &p, "ENABLED", 0));
            for _ in 0..=rng.below(2) {
                history.put(ad_group(&c, ad_groups[created]));
                ad_groups[created] += 1;
            }
            created += 1;
        } else if roll < 10 {
            let i = rng.below(created as u64) as usize;
            let c = campaign(i);
            let old = history
                .get(&format!("CAMPAIGN#{c}"), "METADATA")
                .cloned()
                .expect("a created campaign");
            let p = text(&old, "profileId").expect("profileId");
            let status = text(&old, "status").expect("status");
            if rng.chance(70) {
                let others: Vec<&str> = STATUSES.into_iter().filter(|x| *x != status).collect();
                let new = others[rng.below(others.len() as u64) as usize];
                history.put(campaign_item(&c, &p, new, step));
            } else {
                history.put(campaign_item(&c, &p, &status, step));
            }
        } else if roll < 12 {
            let i = rng.below(created as u64) as usize;
            history.put(ad_group(&campaign(i), ad_groups[i]));
            ad_groups[i] += 1;
        } else {
            let i = if created < campaigns && rng.chance(10) {
                created + rng.below((campaigns - created).min(3) as u64) as usize
            } else {
                rng.below(created as u64) as usize
            };
            let c = campaign(i);
            let pick = rng.below(100);
            if days[i].is_empty() || pick < 70 {
                let day = next_day[i];
                next_day[i] += 1;
                days[i].push(day);
                history.put(performance(&c, day, rng));
            } else if pick < 95 {
                let day = days[i][rng.below(days[i].len() as u64) as usize];
                let old = history
                    .get(&format!("CAMPAIGN#{c}"), &format!("PERF#{}", date(day)))
                    .cloned()
                    .expect("a snapshot it has");
                let mut new = performance(&c, day, rng);
                if new.get("spend") == old.get("spend") {
                    new.insert("spend".into(), Av::N("0.01".into()));
                    if new.get("spend") == old.get("spend") {
                        new.insert("spend".into(), Av::N("0.02".into()));
                    }
                }
                history.put(new);
            } else {
                let at = rng.below(days[i].len() as u64) as usize;
                let day = days[i].swap_remove(at);
                history.delete(&format!("CAMPAIGN#{c}"), &format!("PERF#{}", date(day)));
            }
        }
    }
    history
}

/// A campaign's METADATA item; `version` names its name.
fn campaign_item(c: &str, p: &str, status: &str, version: usize) -> Attrs {
    attrs(&[
        ("PK", s(&format!("CAMPAIGN#{c}"))),
        ("SK", s("METADATA")),
        ("profileId", s(p)),
        ("campaignId", s(c)),
        ("status", s(status)),
        ("name", s(&format!("Campaign {c} v{version}"))),
    ])
}

fn ad_group(c: &str, n: usize) -> Attrs {
    attrs(&[
        ("PK", s(&format!("CAMPAIGN#{c}"))),
        ("SK", s(&format!("ADGROUP#g{n}"))),
        ("campaignId", s(c)),
        ("adGroupId", s(&format!("g{n}"))),
        ("name", s(&format!("Ad group {n}"))),
    ])
}

/// A daily snapshot with seeded figures: spend in cents as a decimal
/// (`"123.45"`), clicks and impressions integers.
fn performance(c: &str, day: u32, rng: &mut Rng) -> Attrs {
    let spend = rng.below(50_000);
    let clicks = rng.below(2_000);
    let impressions = clicks * 20 + rng.below(10_000);
    let date = date(day);
    attrs(&[
        ("PK", s(&format!("CAMPAIGN#{c}"))),
        ("SK", s(&format!("PERF#{date}"))),
        ("campaignId", s(c)),
        ("date", s(&date)),
        (
            "spend",
            Av::N(format!("{}.{:02}", spend / 100, spend % 100)),
        ),
        ("clicks", Av::N(clicks.to_string())),
        ("impressions", Av::N(impressions.to_string())),
    ])
}

/// The date `day` days after 2026-01-01, as `2026-03-07`.
fn date(day: u32) -> String {
    let (mut year, mut left) = (2026u32, day);
    loop {
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let lengths = [
            31,
            if leap { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        for (month, length) in lengths.into_iter().enumerate() {
            if left < length {
                return format!("{year}-{:02}-{:02}", month + 1, left + 1);
            }
            left -= length;
        }
        year += 1;
    }
}

/// A DynamoDB number in hundredths (cents), exactly: `"12.3"` is 1230,
/// `"1.5E+3"` 150000; `None` when it is not a whole number of cents.
fn cents(number: &str) -> Option<i128> {
    let number = number.trim();
    let (negative, rest) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i32>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = format!("{whole}{fraction}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    let mut scale = exponent - fraction.len() as i32 + 2;
    let mut digits = digits.to_string();
    while scale < 0 {
        if !digits.ends_with('0') && !digits.is_empty() {
            return None;
        }
        digits.pop();
        scale += 1;
    }
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    for _ in 0..scale {
        value = value.checked_mul(10)?;
    }
    Some(if negative { -value } else { value })
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

/// A social profile; `version` names its display name.
fn social_profile(user: &str, version: usize) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s("PROFILE")),
        ("userId", s(user)),
        ("displayName", s(&format!("User {user} v{version}"))),
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

/// One call: sent, answered, the operation, the write units the billing
/// model bills for it (as counted in `billed_units`: a success, a failed
/// condition or a cancelled transaction; 0 for other errors and reads).
/// A call: sent, answered, operation, billed units, and what it named
/// (`BENCH_TRACE_CHAIN` only: the key's prefixes, the index, the items).
type Span = (Instant, Instant, String, f64, String);

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
    let start = spans[0].0;
    let label = |k: usize| {
        let span = &spans[k];
        if span.4.is_empty() {
            return span.2.clone();
        }
        format!(
            "{}[{}]@{:.0}-{:.0}ms",
            span.2,
            span.4,
            (span.0 - start).as_secs_f64() * 1e3,
            (span.1 - start).as_secs_f64() * 1e3
        )
    };
    let mut operations = vec![label(at)];
    while let Some(before) = chain[at].1 {
        operations.push(label(before));
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
    /// What the call named, for the chain's trace.
    detail: String,
}

/// What a request names, shortly: a key's prefixes (`USER#/PROFILE`), a
/// query's index and values, a transaction's or batch's item count.
fn call_detail(body: &serde_json::Value) -> String {
    let prefix = |value: &serde_json::Value| -> String {
        let text = value
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|x| x.as_str())
            .unwrap_or("");
        text.chars()
            .take_while(|c| !c.is_ascii_digit())
            .take(16)
            .collect()
    };
    if let Some(key) = body.get("Key").or(body.get("Item")) {
        return format!("{}/{}", prefix(&key["PK"]), prefix(&key["SK"]));
    }
    if body.get("KeyConditionExpression").is_some() {
        let values: Vec<String> = body["ExpressionAttributeValues"]
            .as_object()
            .map(|o| o.values().map(prefix).collect())
            .unwrap_or_default();
        let index = body["IndexName"].as_str().unwrap_or("");
        return format!("{index}:{}", values.join(","));
    }
    if let Some(items) = body["TransactItems"].as_array() {
        return items.len().to_string();
    }
    if let Some(tables) = body["RequestItems"].as_object() {
        let n: usize = tables
            .values()
            .map(|v| match v {
                serde_json::Value::Array(writes) => writes.len(),
                other => other["Keys"].as_array().map_or(0, Vec::len),
            })
            .sum();
        return n.to_string();
    }
    String::new()
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
        let detail = match std::env::var_os("BENCH_TRACE_CHAIN") {
            Some(_) => call_detail(&body),
            None => String::new(),
        };
        cfg.interceptor_state().store_put(Pending {
            operation: operation.to_string(),
            sent: Instant::now(),
            billed: billed_units(operation, &body),
            write: WRITE_OPERATIONS.contains(&operation),
            detail,
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
        let answered = Instant::now();
        let response = context.response();
        let body: serde_json::Value = response
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        let state = &self.0;
        let mut billed = 0.0;
        if response.status().is_success() {
            billed = pending.billed;
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
                billed = pending.billed;
                state
                    .billed_failed_conditions
                    .fetch_add(micro(pending.billed), Ordering::Relaxed);
            } else if kind.ends_with("TransactionCanceledException") {
                state.cancelled_transactions.fetch_add(1, Ordering::Relaxed);
                billed = pending.billed;
                state
                    .billed_cancelled
                    .fetch_add(micro(pending.billed), Ordering::Relaxed);
            } else {
                state.other_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        state.spans.lock().expect("not poisoned").push((
            pending.sent,
            answered,
            pending.operation.clone(),
            billed,
            pending.detail.clone(),
        ));
        Ok(())
    }
}

// ---------------------------------------------------------------- minimum ---

/// The writes the projections need per source record of `workload`, by
/// kind: for each record in stream order, the derived items whose value
/// it changes, one write per item.
///
/// - social: the inverse edge (a follow inserted or removed, or its
///   `followedAt` changed); both counters (a follow inserted or removed);
///   an achievement's GSI key pair when it moves; profile totals: a follow
///   inserted or removed moves the followee's `followersCount` and the
///   follower's `followingCount`, one write per such profile that exists
///   at that point of the stream, and a profile written (an INSERT, or a
///   MODIFY: a writer's Put replaces the item, totals included) needs its
///   totals written, one write, even when both are 0 (the rollup writes
///   0, not nothing);
/// - user: an email's GSI key pair when it moves; the profile's copied
///   email when it changes (or appears with the profile);
/// - ads: a campaign's METADATA written needs one write of that item:
///   `campaign GSI keys` when the keys move (an INSERT, a status change;
///   the write carries the totals too), else `campaign totals` (a Put that
///   keeps the keys still replaced the totals); a snapshot inserted,
///   removed or whose figures changed moves its campaign's totals, one
///   write when the campaign's METADATA exists at that point.
fn minimum_writes(workload: Workload, records: &[Record]) -> BTreeMap<String, u64> {
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |kind: &str, n: u64| *kinds.entry(kind.to_string()).or_default() += n;
    let string = |item: Option<&Image>, name: &str| -> Option<String> {
        match item?.get(name)? {
            ValueRef::S(v) | ValueRef::N(v) => Some(v.to_string()),
            _ => None,
        }
    };
    match workload {
        Workload::Social => {
            // Users whose profile exists.
            let mut profiles: HashSet<String> = HashSet::new();
            for record in records.iter().flatten() {
                let pk = string(Some(&record.keys), "PK").unwrap_or_default();
                let sk = string(Some(&record.keys), "SK").unwrap_or_default();
                let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
                if let Some(followee) = sk.strip_prefix("FOLLOWS#") {
                    let follower = pk.trim_start_matches("USER#");
                    match record.kind {
                        ChangeKind::Insert | ChangeKind::Remove => {
                            add("inverse edge", 1);
                            add("counters", 2);
                            let totals = [followee, follower]
                                .iter()
                                .filter(|u| profiles.contains(**u))
                                .count();
                            add("profile totals", totals as u64);
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
                } else if sk == "PROFILE" {
                    let user = pk.trim_start_matches("USER#").to_string();
                    if new.is_some() {
                        add("profile totals", 1);
                        profiles.insert(user);
                    } else {
                        profiles.remove(&user);
                    }
                }
            }
        }
        Workload::User => minimum_user_writes(records, &mut add),
        Workload::Ads => {
            // Campaigns whose METADATA exists.
            let mut campaigns: HashSet<String> = HashSet::new();
            for record in records.iter().flatten() {
                let pk = string(Some(&record.keys), "PK").unwrap_or_default();
                let sk = string(Some(&record.keys), "SK").unwrap_or_default();
                let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
                let Some(campaign) = pk.strip_prefix("CAMPAIGN#") else {
                    continue;
                };
                if sk == "METADATA" {
                    let keys = |item: Option<&Image>| {
                        Some((string(item, "profileId")?, string(item, "status")?))
                    };
                    if new.is_none() {
                        campaigns.remove(campaign);
                        continue;
                    }
                    campaigns.insert(campaign.to_string());
                    if keys(new) != keys(old) {
                        add("campaign GSI keys", 1);
                    } else {
                        add("campaign totals", 1);
                    }
                } else if sk.starts_with("PERF#") {
                    let figures = |item: Option<&Image>| {
                        ["spend", "clicks", "impressions"].map(|name| string(item, name))
                    };
                    let moved = match record.kind {
                        ChangeKind::Insert | ChangeKind::Remove => true,
                        ChangeKind::Modify => figures(old) != figures(new),
                    };
                    if moved && campaigns.contains(campaign) {
                        add("campaign totals", 1);
                    }
                }
            }
        }
    }
    kinds
}

/// The user workload's minimum (see [`minimum_writes`]).
fn minimum_user_writes(user: &[Record], add: &mut impl FnMut(&str, u64)) {
    let string = |item: Option<&Image>, name: &str| -> Option<String> {
        match item?.get(name)? {
            ValueRef::S(v) | ValueRef::N(v) => Some(v.to_string()),
            _ => None,
        }
    };
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
}

// ------------------------------------------------------------ contenders ---

/// What processing the records took.
#[derive(Default)]
struct Processing {
    latencies_ms: Vec<f64>,
    /// Each batch's workload (its position in the run's list), start and
    /// end.
    windows: Vec<(usize, Instant, Instant)>,
    batches: usize,
    stats: BatchStats,
    passes: usize,
    failed_deliveries: usize,
    /// Processing time per table, in the run's workload order.
    table_seconds: Vec<f64>,
    /// Per table, in the same order.
    tables: Vec<TableProcessing>,
}

/// One table's processing: the tables go one after the other, so its
/// window holds its calls only.
struct TableProcessing {
    started: Instant,
    ended: Instant,
    batches: usize,
    /// What `BatchStats` counted (the projector only).
    stats: BatchStats,
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
    for (table, (applier, records)) in appliers.iter().enumerate() {
        let table_started = Instant::now();
        let mut table_stats = BatchStats::default();
        let mut table_batches = 0;
        for chunk in records.chunks(batch) {
            let started = Instant::now();
            processing.batches += 1;
            table_batches += 1;
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
                table_stats.add(&outcome.stats);
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
            processing.windows.push((table, started, Instant::now()));
        }
        processing
            .table_seconds
            .push(table_started.elapsed().as_secs_f64());
        processing.tables.push(TableProcessing {
            started: table_started,
            ended: Instant::now(),
            batches: table_batches,
            stats: table_stats,
        });
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
/// idempotent: a redelivered record counts twice), and so are the profile
/// totals beside them; a profile written gets both totals set from the
/// counts; a campaign's totals are recomputed from a Query of its
/// snapshots whenever it or one of them is written.
struct Baseline {
    client: aws_sdk_dynamodb::Client,
    social_table: String,
    user_table: String,
    ads_table: String,
}

/// A campaign's totals over its PERF# items, as `campaign-totals` defines
/// them: sums exact (in hundredths, never floats), `days` counted, the
/// dates compared as strings; over no snapshots `days` is 0 and the others
/// are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CampaignTotals {
    days: i128,
    /// In hundredths.
    spend: Option<i128>,
    clicks: Option<i128>,
    impressions: Option<i128>,
    first_date: Option<String>,
    last_date: Option<String>,
}

impl CampaignTotals {
    /// Over the snapshots `items` (other items are left out); the date is
    /// the sort key's, the entity's key variable.
    fn of<'a>(items: impl IntoIterator<Item = &'a Attrs>) -> CampaignTotals {
        let mut totals = CampaignTotals::default();
        let sum = |total: &mut Option<i128>, item: &Attrs, name: &str| {
            if let Some(n) = item.get(name).and_then(|v| v.as_n().ok()) {
                let n = cents(n).unwrap_or_else(|| panic!("{name} = {n}: not in cents"));
                *total = Some(total.unwrap_or(0) + n);
            }
        };
        for item in items {
            let Some(date) =
                text(item, "SK").and_then(|sk| sk.strip_prefix("PERF#").map(str::to_string))
            else {
                continue;
            };
            totals.days += 1;
            sum(&mut totals.spend, item, "spend");
            sum(&mut totals.clicks, item, "clicks");
            sum(&mut totals.impressions, item, "impressions");
            if totals.first_date.as_ref().is_none_or(|d| date < *d) {
                totals.first_date = Some(date.clone());
            }
            if totals.last_date.as_ref().is_none_or(|d| date > *d) {
                totals.last_date = Some(date);
            }
        }
        totals
    }

    /// Each total attribute and its value (`None`: absent).
    fn attributes(&self) -> [(&'static str, Option<Av>); 6] {
        let number = |hundredths: Option<i128>| hundredths.map(|h| Av::N(hundredths_text(h)));
        [
            ("totalSpend", number(self.spend)),
            ("totalClicks", number(self.clicks)),
            ("totalImpressions", number(self.impressions)),
            ("days", Some(Av::N(self.days.to_string()))),
            ("firstDate", self.first_date.clone().map(Av::S)),
            ("lastDate", self.last_date.clone().map(Av::S)),
        ]
    }

    /// The totals an item holds (numbers read by value).
    fn on(item: &Attrs) -> Result<CampaignTotals, String> {
        let number = |name: &str| -> Result<Option<i128>, String> {
            match item.get(name) {
                None => Ok(None),
                Some(Av::N(n)) => cents(n)
                    .map(Some)
                    .ok_or_else(|| format!("{name} = {n}, not a whole number of cents")),
                Some(other) => Err(format!("{name} = {other:?}, not a number")),
            }
        };
        Ok(CampaignTotals {
            // -1: absent (the aggregate always writes `days`).
            days: number("days")?.map_or(-1, |d| d / 100),
            spend: number("totalSpend")?,
            clicks: number("totalClicks")?,
            impressions: number("totalImpressions")?,
            first_date: text(item, "firstDate"),
            last_date: text(item, "lastDate"),
        })
    }
}

/// Hundredths as a DynamoDB number: `1234` is `12.34`, `1200` is `12`.
fn hundredths_text(h: i128) -> String {
    let sign = if h < 0 { "-" } else { "" };
    let h = h.abs();
    if h % 100 == 0 {
        format!("{sign}{}", h / 100)
    } else {
        format!("{sign}{}.{:02}", h / 100, h % 100)
    }
}

/// A conditional update (`attribute_exists(PK)`) whose item is absent is
/// fine: there is nothing to write on; any other error is not.
fn absent_is_fine<T, R: std::fmt::Debug>(
    sent: Result<
        T,
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
            R,
        >,
    >,
    what: &str,
) {
    if let Err(error) = sent {
        let absent = error
            .as_service_error()
            .is_some_and(|e| e.is_conditional_check_failed_exception());
        assert!(absent, "{what}: {error:?}");
    }
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
            // The totals on the profiles, where they exist.
            for (user, total) in [(followee, "followersCount"), (follower, "followingCount")] {
                let sent = self
                    .client
                    .update_item()
                    .table_name(table)
                    .key("PK", s(&format!("USER#{user}")))
                    .key("SK", s("PROFILE"))
                    .update_expression("ADD #t :d")
                    .condition_expression("attribute_exists(PK)")
                    .expression_attribute_names("#t", total)
                    .expression_attribute_values(":d", Av::N(delta.to_string()))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                absent_is_fine(sent, "add to a profile total");
            }
        } else if sk == "PROFILE" {
            // A writer's Put (a new profile, or one rewritten) leaves no
            // totals: set both from the counts (0 when there are none, as
            // the rollups write).
            if record.kind == ChangeKind::Remove {
                return;
            }
            let counts = self
                .client
                .get_item()
                .table_name(table)
                .key("PK", s(&pk))
                .key("SK", s(BASELINE_COUNTS))
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .expect("get counts");
            let count = |name: &str| {
                counts
                    .item()
                    .and_then(|item| item.get(name))
                    .cloned()
                    .unwrap_or_else(|| Av::N("0".into()))
            };
            let sent = self
                .client
                .update_item()
                .table_name(table)
                .key("PK", s(&pk))
                .key("SK", s("PROFILE"))
                .update_expression("SET followersCount = :a, followingCount = :b")
                .condition_expression("attribute_exists(PK)")
                .expression_attribute_values(":a", count("followers"))
                .expression_attribute_values(":b", count("following"))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            absent_is_fine(sent, "set profile totals");
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
        absent_is_fine(sent, "set GSI keys");
    }

    /// A campaign's METADATA written: its GSI1 keys and its totals, from a
    /// Query of its snapshots, in one update while it exists. A snapshot
    /// written or deleted: the totals again, on the campaign if it exists.
    async fn handle_ads(&self, record: &ChangeRecord) {
        let (pk, sk) = Baseline::key(record);
        let Some(campaign) = pk.strip_prefix("CAMPAIGN#") else {
            return;
        };
        let keys = if sk == "METADATA" {
            let Some(new) = Baseline::image(record, true) else {
                return;
            };
            Some((
                format!("PROFILE#{}", text(&new, "profileId").unwrap_or_default()),
                format!(
                    "STATUS#{}#CAMPAIGN#{campaign}",
                    text(&new, "status").unwrap_or_default()
                ),
            ))
        } else if sk.starts_with("PERF#") {
            None
        } else {
            return;
        };
        let totals = self.campaign_totals(&pk).await;
        let mut request = self
            .client
            .update_item()
            .table_name(&self.ads_table)
            .key("PK", s(&pk))
            .key("SK", s("METADATA"))
            .condition_expression("attribute_exists(PK)")
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let (mut set, mut remove) = (Vec::new(), Vec::new());
        if let Some((gsi_pk, gsi_sk)) = keys {
            set.push("GSI1PK = :gp, GSI1SK = :gs".to_string());
            request = request
                .expression_attribute_values(":gp", s(&gsi_pk))
                .expression_attribute_values(":gs", s(&gsi_sk));
        }
        for (i, (name, value)) in totals.attributes().into_iter().enumerate() {
            request = request.expression_attribute_names(format!("#t{i}"), name);
            match value {
                Some(value) => {
                    set.push(format!("#t{i} = :t{i}"));
                    request = request.expression_attribute_values(format!(":t{i}"), value);
                }
                None => remove.push(format!("#t{i}")),
            }
        }
        let mut expression = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        let sent = request.update_expression(expression).send().await;
        absent_is_fine(sent, "set campaign totals");
    }

    /// The totals over the campaign's snapshots: a consistent Query.
    async fn campaign_totals(&self, pk: &str) -> CampaignTotals {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.ads_table)
                .key_condition_expression("PK = :pk AND begins_with(SK, :p)")
                .expression_attribute_values(":pk", s(pk))
                .expression_attribute_values(":p", s("PERF#"))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .expect("query snapshots");
            items.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return CampaignTotals::of(&items),
            }
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
    tables: &[(Workload, &[Record])],
    batch: usize,
) -> Processing {
    let mut processing = Processing::default();
    for (table, (workload, records)) in tables.iter().enumerate() {
        let table_started = Instant::now();
        let mut table_batches = 0;
        for chunk in records.chunks(batch) {
            let started = Instant::now();
            processing.batches += 1;
            table_batches += 1;
            processing.passes += 1;
            for record in chunk.iter().flatten() {
                match workload {
                    Workload::Social => baseline.handle_social(record).await,
                    Workload::User => baseline.handle_user(record).await,
                    Workload::Ads => baseline.handle_ads(record).await,
                }
            }
            processing
                .latencies_ms
                .push(started.elapsed().as_secs_f64() * 1e3);
            processing.windows.push((table, started, Instant::now()));
        }
        processing
            .table_seconds
            .push(table_started.elapsed().as_secs_f64());
        processing.tables.push(TableProcessing {
            started: table_started,
            ended: Instant::now(),
            batches: table_batches,
            stats: BatchStats::default(),
        });
    }
    processing
}

// ----------------------------------------------------------------- check ---

/// Every difference between the derived state of `workload`'s table and
/// what the final source items imply; `projector` says where the social
/// counters live. With the hot user's followers (expected, found) for the
/// social workload.
async fn check_state(
    client: &aws_sdk_dynamodb::Client,
    workload: Workload,
    table: &str,
    history: &History,
    projector: bool,
) -> (Vec<String>, (i64, i64)) {
    match workload {
        Workload::Social => check_social(client, table, history, projector).await,
        Workload::User => (check_user(client, table, history).await, (0, 0)),
        Workload::Ads => (check_ads(client, table, history).await, (0, 0)),
    }
}

/// Inverse edges, counters, achievements' GSI keys, and for every profile
/// that exists its totals, equal to its final follows (0 written).
async fn check_social(
    client: &aws_sdk_dynamodb::Client,
    social_table: &str,
    social: &History,
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
    // The rollups' totals: on every profile that exists, its final follows
    // (0 too: a rollup writes 0, not nothing); no profile brought back.
    for ((pk, sk), _) in social.items.iter().filter(|((_, sk), _)| sk == "PROFILE") {
        let user = pk.trim_start_matches("USER#").to_string();
        let found = by_key.get(&(pk.clone(), sk.clone()));
        for (attribute, counter) in [
            ("followersCount", "followers"),
            ("followingCount", "following"),
        ] {
            let expected = want.get(&(user.clone(), counter)).copied().unwrap_or(0);
            let have = found.and_then(|p| p.get(attribute)).cloned();
            let value = have
                .as_ref()
                .and_then(|v| v.as_n().ok())
                .and_then(|n| cents(n));
            if value != Some(i128::from(expected) * 100) {
                problems.push(format!(
                    "{pk}/PROFILE: {attribute} {have:?}, expected {expected}"
                ));
            }
        }
    }
    for item in &items {
        let key = History::key(item);
        if key.1 == "PROFILE" && !social.items.contains_key(&key) {
            problems.push(format!("{}/{}: a profile no writer wrote", key.0, key.1));
        }
    }
    (problems, star)
}

/// Emails' GSI keys and each profile's copied primary email; nothing
/// written beside the writers' items (but the projector's own).
async fn check_user(
    client: &aws_sdk_dynamodb::Client,
    user_table: &str,
    user: &History,
) -> Vec<String> {
    let mut problems = Vec::new();
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
    problems
}

/// Every campaign's GSI1 keys and totals over its final snapshots
/// (numbers by value); nothing written beside the writers' items (but
/// the projector's own).
async fn check_ads(
    client: &aws_sdk_dynamodb::Client,
    ads_table: &str,
    ads: &History,
) -> Vec<String> {
    let mut problems = Vec::new();
    let items = scan_all(client, ads_table).await;
    let by_key: HashMap<(String, String), &Attrs> = items
        .iter()
        .map(|item| (History::key(item), item))
        .collect();
    for ((pk, sk), item) in ads
        .items
        .iter()
        .filter(|((pk, sk), _)| pk.starts_with("CAMPAIGN#") && sk == "METADATA")
    {
        let campaign = pk.trim_start_matches("CAMPAIGN#");
        let Some(found) = by_key.get(&(pk.clone(), sk.clone())) else {
            problems.push(format!("{pk}/{sk}: gone"));
            continue;
        };
        let expected = (
            Some(format!("PROFILE#{}", text(item, "profileId").unwrap())),
            Some(format!(
                "STATUS#{}#CAMPAIGN#{campaign}",
                text(item, "status").unwrap()
            )),
        );
        let have = (text(found, "GSI1PK"), text(found, "GSI1SK"));
        if have != expected {
            problems.push(format!(
                "{pk}/{sk}: GSI1 keys {have:?}, expected {expected:?}"
            ));
        }
        let snapshots = ads
            .items
            .range((pk.clone(), "PERF#".to_string())..)
            .take_while(|((p, s), _)| p == pk && s.starts_with("PERF#"))
            .map(|(_, item)| item);
        let expected = CampaignTotals::of(snapshots);
        match CampaignTotals::on(found) {
            Ok(have) if have == expected => {}
            Ok(have) => problems.push(format!(
                "{pk}/{sk}: totals {have:?}, expected {expected:?} (sums in hundredths; days -1: absent)"
            )),
            Err(problem) => problems.push(format!("{pk}/{sk}: {problem}")),
        }
    }
    for item in &items {
        let key = History::key(item);
        if !key.0.starts_with("_ddbp#") && !ads.items.contains_key(&key) {
            problems.push(format!("{}/{}: an item no writer wrote", key.0, key.1));
        }
    }
    problems
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
    #[serde(default)]
    ads_records: usize,
    batches: usize,
    passes: usize,
    failed_deliveries: usize,
    setup_seconds: f64,
    seconds: f64,
    /// Processing time of each table's records, in the order of
    /// `workloads` (social then user in runs from before it).
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
    /// Per workload (table), in the order processed (empty in runs from
    /// before it).
    #[serde(default)]
    workloads: Vec<WorkloadResult>,
}

/// One workload's (table's) figures within a run. The tables are
/// processed one after the other: the calls sent within a table's
/// processing window are its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkloadResult {
    /// `social`, `user` or `ads`.
    workload: String,
    table: String,
    records: usize,
    batches: usize,
    /// Its processing time, and its records per second of it.
    seconds: f64,
    records_per_s: f64,
    /// Sequential round trips per batch: the mean over the steady-state
    /// batches (all but the table's first; the first's when it has one
    /// batch only), the first batch's, and the most.
    round_trips_steady_mean: f64,
    round_trips_first: usize,
    round_trips_max: usize,
    /// Calls sent in its processing window (retries included), by
    /// operation, and per record.
    requests: u64,
    calls: BTreeMap<String, u64>,
    requests_per_record: f64,
    /// What the billing model bills for those calls.
    billed_units: f64,
    billed_units_per_record: f64,
    minimum_units: u64,
    minimum_units_per_record: f64,
    minimum_by_kind: BTreeMap<String, u64>,
    /// Recomputed targets per batch and the requests by purpose, as
    /// `BatchStats` counted them (the projector only).
    recomputes_per_batch: Option<f64>,
    requests_by_purpose: Option<ddb_projector::apply::Requests>,
    /// Problems the check found in its table.
    problems: usize,
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
    workloads: &[Workload],
    seed: u64,
    latency_ms: f64,
    rtt_ms: f64,
) -> RunResult {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let specs: Vec<Arc<Spec>> = workloads
        .iter()
        .map(|w| {
            Arc::new(
                Spec::from_file(&root.join(w.spec_file()))
                    .unwrap_or_else(|e| panic!("{}: {e}", w.spec_file())),
            )
        })
        .collect();
    let config = aws_config::load_from_env().await;
    let plain = aws_sdk_dynamodb::Client::new(&config);
    let streams = aws_sdk_dynamodbstreams::Client::new(&config);
    let tables: Vec<String> = specs.iter().map(|spec| spec.table.name.clone()).collect();

    let setup = Instant::now();
    for (spec, table) in specs.iter().zip(&tables) {
        ddb_projector::table::create_table(&plain, spec, table)
            .await
            .expect("create table");
    }
    let mut rng = Rng(seed.max(1));
    let histories: Vec<History> = workloads
        .iter()
        .zip(split_records(records, workloads))
        .map(|(workload, target)| workload.history(&mut rng, target))
        .collect();
    futures::future::join_all(
        tables
            .iter()
            .zip(&histories)
            .map(|(table, history)| write_history(&plain, table, history)),
    )
    .await;
    let mut streamed: Vec<Vec<Record>> = Vec::new();
    for ((workload, table), history) in workloads.iter().zip(&tables).zip(&histories) {
        let records = read_stream(&plain, &streams, table).await;
        assert_eq!(
            records.len(),
            history.ops.len(),
            "{} stream records",
            workload.name()
        );
        streamed.push(records);
    }
    let setup_seconds = setup.elapsed().as_secs_f64();
    let minimums: Vec<BTreeMap<String, u64>> = workloads
        .iter()
        .zip(&streamed)
        .map(|(workload, records)| minimum_writes(*workload, records))
        .collect();
    let mut minimum: BTreeMap<String, u64> = BTreeMap::new();
    for (kind, n) in minimums.iter().flatten() {
        *minimum.entry(kind.clone()).or_default() += n;
    }

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
            let appliers: Vec<(Applier, &[Record])> = specs
                .iter()
                .zip(&tables)
                .zip(&streamed)
                .map(|((spec, table), records)| {
                    (
                        control::applier(client.clone(), spec.clone(), table, apply.clone()),
                        records.as_slice(),
                    )
                })
                .collect();
            let ledger = contender != "projector-noledger";
            (run_projector(&appliers, batch, ledger).await, true)
        }
        "baseline" => {
            let table_of = |wanted: Workload| {
                workloads
                    .iter()
                    .position(|w| *w == wanted)
                    .map_or(String::new(), |i| tables[i].clone())
            };
            let baseline = Baseline {
                client: client.clone(),
                social_table: table_of(Workload::Social),
                user_table: table_of(Workload::User),
                ads_table: table_of(Workload::Ads),
            };
            let inputs: Vec<(Workload, &[Record])> = workloads
                .iter()
                .copied()
                .zip(streamed.iter().map(Vec::as_slice))
                .collect();
            (run_baseline(&baseline, &inputs, batch).await, false)
        }
        other => panic!(
            "unknown contender `{other}` (projector, projector-nochecks, projector-noledger, baseline)"
        ),
    };
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_mb = status_kib("VmHWM:") / 1024.0;

    let mut problems = Vec::new();
    let mut table_problems = Vec::new();
    let (mut hot_user_followers, mut hot_user_followers_found) = (0, 0);
    for ((workload, table), history) in workloads.iter().zip(&tables).zip(&histories) {
        let (found, star) = check_state(&plain, *workload, table, history, is_projector).await;
        if *workload == Workload::Social {
            (hot_user_followers, hot_user_followers_found) = star;
        }
        table_problems.push(found.len());
        problems.extend(
            found
                .into_iter()
                .map(|problem| format!("{}: {problem}", workload.name())),
        );
    }
    let n: usize = streamed.iter().map(Vec::len).sum();
    let records_of = |wanted: Workload| {
        workloads
            .iter()
            .position(|w| *w == wanted)
            .map_or(0, |i| streamed[i].len())
    };
    let mut latencies = processing.latencies_ms.clone();
    latencies.sort_by(f64::total_cmp);
    let state = &meter.0;
    let calls = state.calls.lock().expect("not poisoned").clone();
    let spans = state.spans.lock().expect("not poisoned").clone();
    let trace = std::env::var_os("BENCH_TRACE_CHAIN").is_some();
    // Per batch: its table and its sequential round trips.
    let trips: Vec<(usize, usize)> = processing
        .windows
        .iter()
        .map(|&(table, start, end)| {
            let mut within: Vec<Span> = spans
                .iter()
                .filter(|span| span.0 >= start && span.0 <= end)
                .cloned()
                .collect();
            let (length, operations) = sequential_round_trips(&mut within);
            if trace {
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
                    "[{}] {length} round trips in {:.0} ms, {most} in flight at most: {} (calls: {counts:?})",
                    workloads[table].name(),
                    (end - start).as_secs_f64() * 1e3,
                    operations.join(" > ")
                );
            }
            (table, length)
        })
        .collect();
    let per_workload: Vec<WorkloadResult> = workloads
        .iter()
        .enumerate()
        .map(|(i, workload)| {
            let table = &processing.tables[i];
            let records = streamed[i].len();
            let per = |x: f64| x / records.max(1) as f64;
            let own: Vec<usize> = trips
                .iter()
                .filter(|(t, _)| *t == i)
                .map(|(_, length)| *length)
                .collect();
            let first = own.first().copied().unwrap_or(0);
            let steady = if own.len() > 1 {
                own[1..].iter().sum::<usize>() as f64 / (own.len() - 1) as f64
            } else {
                first as f64
            };
            let mut by_operation: BTreeMap<String, u64> = BTreeMap::new();
            let mut billed = 0.0;
            for span in spans
                .iter()
                .filter(|span| span.0 >= table.started && span.0 <= table.ended)
            {
                *by_operation.entry(span.2.clone()).or_default() += 1;
                billed += span.3;
            }
            let requests: u64 = by_operation.values().sum();
            let seconds = table.ended.duration_since(table.started).as_secs_f64();
            let minimum_units: u64 = minimums[i].values().sum();
            WorkloadResult {
                workload: workload.name().to_string(),
                table: tables[i].clone(),
                records,
                batches: table.batches,
                seconds,
                records_per_s: records as f64 / seconds.max(1e-9),
                round_trips_steady_mean: steady,
                round_trips_first: first,
                round_trips_max: own.iter().copied().max().unwrap_or(0),
                requests,
                calls: by_operation,
                requests_per_record: per(requests as f64),
                billed_units: billed,
                billed_units_per_record: per(billed),
                minimum_units,
                minimum_units_per_record: per(minimum_units as f64),
                minimum_by_kind: minimums[i].clone(),
                recomputes_per_batch: is_projector
                    .then(|| table.stats.requests.recomputes as f64 / table.batches.max(1) as f64),
                requests_by_purpose: is_projector.then(|| table.stats.requests.clone()),
                problems: table_problems[i],
            }
        })
        .collect();
    let trips: Vec<usize> = trips.into_iter().map(|(_, length)| length).collect();
    RunResult {
        contender: contender.to_string(),
        batch,
        latency_ms,
        rtt_ms,
        round_trips_mean: trips.iter().sum::<usize>() as f64 / trips.len().max(1) as f64,
        round_trips_max: trips.iter().copied().max().unwrap_or(0),
        seed,
        records: n,
        social_records: records_of(Workload::Social),
        user_records: records_of(Workload::User),
        ads_records: records_of(Workload::Ads),
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
        workloads: per_workload,
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

fn report(runs_dir: &Path, json: &Path, svg: &Path, specs_svg: &Path) {
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
    let workload_ratios = workload_table(&runs);
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
        "records_per_s_ratio_per_workload": workload_ratios,
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
    specs_chart(&runs, specs_svg).expect("draw the per-workload chart");
    eprintln!(
        "wrote {}, {} and {}",
        json.display(),
        svg.display(),
        specs_svg.display()
    );
}

/// Prints the per-workload table, then the projector ÷ baseline records/s
/// of each (workload, batch, conditions) both ran; returns those ratios
/// by `workload@batch[@N ms-rtt|@N ms]`.
fn workload_table(runs: &[RunResult]) -> BTreeMap<String, f64> {
    println!();
    println!("| contender | workload | batch | round trip (ms) | records | records/s | round trips per batch (steady mean / first / most) | recomputes per batch | requests/record | billed WU/record (model) | minimum WU/record |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        for w in &r.workloads {
            println!(
                "| {}{} | {} | {} | {} | {} | {:.0} | {:.1} / {} / {} | {} | {:.2} | {:.2} | {:.2} |",
                label(&r.contender),
                if r.latency_ms > 0.0 {
                    format!(", +{} ms simulated latency", r.latency_ms)
                } else {
                    String::new()
                },
                w.workload,
                r.batch,
                r.rtt_ms,
                w.records,
                w.records_per_s,
                w.round_trips_steady_mean,
                w.round_trips_first,
                w.round_trips_max,
                w.recomputes_per_batch
                    .map_or("-".to_string(), |x| format!("{x:.1}")),
                w.requests_per_record,
                w.billed_units_per_record,
                w.minimum_units_per_record
            );
        }
    }
    let mut ratios = BTreeMap::new();
    let mut lines = Vec::new();
    for p in runs.iter().filter(|r| r.contender == "projector") {
        let Some(b) = runs.iter().find(|r| {
            r.contender == "baseline"
                && r.batch == p.batch
                && r.latency_ms == p.latency_ms
                && r.rtt_ms == p.rtt_ms
        }) else {
            continue;
        };
        for pw in &p.workloads {
            let Some(bw) = b.workloads.iter().find(|w| w.workload == pw.workload) else {
                continue;
            };
            let ratio = pw.records_per_s / bw.records_per_s;
            let mut key = format!("{}@{}", pw.workload, p.batch);
            if p.rtt_ms > 0.0 {
                key.push_str(&format!("@{}ms-rtt", p.rtt_ms));
            } else if p.latency_ms > 0.0 {
                key.push_str(&format!("@{}ms", p.latency_ms));
            }
            ratios.insert(key, ratio);
            lines.push(format!(
                "| {} | {} | {}{} | {:.0} | {:.0} | {ratio:.2}x |",
                pw.workload,
                p.batch,
                p.rtt_ms,
                if p.latency_ms > 0.0 {
                    format!(" (+{} ms simulated latency)", p.latency_ms)
                } else {
                    String::new()
                },
                pw.records_per_s,
                bw.records_per_s
            ));
        }
    }
    if !lines.is_empty() {
        println!();
        println!("| workload | batch | round trip (ms) | ddb-projector records/s | baseline records/s | ddb-projector ÷ baseline |");
        println!("|---|---|---|---|---|---|");
        for line in lines {
            println!("{line}");
        }
    }
    ratios
}

/// Per workload, the records/s of ddb-projector and the baseline at
/// B=1000 at each round-trip time the runs have (no simulated latency):
/// one panel per workload, a pair of bars per round-trip time, log scale.
fn specs_chart(runs: &[RunResult], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    const BATCH: usize = 1000;
    let contenders = [
        ("projector", RGBColor(31, 119, 180)),
        ("baseline", RGBColor(214, 39, 40)),
    ];
    let runs: Vec<&RunResult> = runs
        .iter()
        .filter(|r| r.batch == BATCH && r.latency_ms == 0.0)
        .filter(|r| contenders.iter().any(|(c, _)| *c == r.contender))
        .collect();
    let mut workloads: Vec<String> = Vec::new();
    let mut rtts: Vec<f64> = Vec::new();
    for r in &runs {
        if !rtts.contains(&r.rtt_ms) {
            rtts.push(r.rtt_ms);
        }
        for w in &r.workloads {
            if !workloads.contains(&w.workload) {
                workloads.push(w.workload.clone());
            }
        }
    }
    rtts.sort_by(f64::total_cmp);
    let order = |w: &String| {
        Workload::ALL
            .iter()
            .position(|x| x.name() == w)
            .unwrap_or(usize::MAX)
    };
    workloads.sort_by_key(order);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let value = |contender: &str, workload: &str, rtt: f64| {
        runs.iter()
            .find(|r| r.contender == contender && r.rtt_ms == rtt)
            .and_then(|r| r.workloads.iter().find(|w| w.workload == workload))
            .map(|w| w.records_per_s)
    };
    let values: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.workloads.iter().map(|w| w.records_per_s))
        .filter(|v| *v > 0.0)
        .collect();
    let width = 300 * workloads.len().max(1) as u32 + 80;
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    if workloads.is_empty() || rtts.is_empty() {
        root.titled(
            &format!("no B={BATCH} run with per-workload figures"),
            ("sans-serif", 20),
        )?;
        root.present()?;
        return Ok(());
    }
    let max = values.iter().copied().fold(1.0, f64::max);
    let min = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(max);
    let y_range = 10f64.powf((min / 1.5).max(1.0).log10().floor())..max * 3.0;
    let root = root.titled(
        &format!("records/s per shipped spec at B={BATCH}, against the round-trip time (DynamoDB Local, 2 shared cores)"),
        ("sans-serif", 18),
    )?;
    let (legend_area, panels_area) = root.split_vertically(36);
    let panels = panels_area.split_evenly((1, workloads.len()));
    for (workload, panel) in workloads.iter().zip(&panels) {
        let spec = Workload::ALL
            .iter()
            .find(|w| w.name() == workload)
            .map_or(String::new(), |w| {
                format!(" ({})", w.spec_file().trim_start_matches("projections/"))
            });
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{workload}{spec}"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..rtts.len() as f64, y_range.clone().log_scale())?;
        let labels = rtts.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rtts.len() * 2 + 1)
            .x_label_formatter(&move |x| {
                let slot = x.floor();
                if (x - slot - 0.5).abs() < 1e-6 && (slot as usize) < labels.len() {
                    format!("{} ms", labels[slot as usize])
                } else {
                    String::new()
                }
            })
            .x_desc("round trip (proxy)")
            .y_desc("records/s (log scale)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (slot, rtt) in rtts.iter().enumerate() {
            for (j, (contender, color)) in contenders.iter().enumerate() {
                let Some(v) = value(contender, workload, *rtt) else {
                    continue;
                };
                let left = slot as f64 + 0.12 + 0.38 * j as f64;
                let right = left + 0.36;
                chart.draw_series([Rectangle::new(
                    [(left, y_range.start), (right, v)],
                    color.filled(),
                )])?;
                chart.draw_series([Text::new(
                    format!("{v:.0}"),
                    // Above the bar (the text hangs from its anchor).
                    (left, v * 1.5),
                    ("sans-serif", 11),
                )])?;
            }
        }
    }
    // The legend: a swatch and a name per contender.
    for (j, (contender, color)) in contenders.iter().enumerate() {
        let x = 80 + 260 * j as i32;
        legend_area.draw(&Rectangle::new([(x, 10), (x + 18, 26)], color.filled()))?;
        legend_area.draw(&Text::new(
            format!("{} (B={BATCH})", label(contender)),
            (x + 26, 12),
            ("sans-serif", 14),
        ))?;
    }
    root.present()?;
    Ok(())
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
