//! Measures the audit's peak memory against the table's size:
//! `scripts/bench audit [ITEMS...]` (default 20,000 and 200,000), or set
//! `AWS_ENDPOINT_URL` and run `cargo run --release --example bench_audit
//! -- [ITEMS...]`.
//!
//! Each size gets a fresh table of the social spec: users with a profile,
//! an achievement and three follows, whose derived items (reverse edges,
//! counter shards, totals, index keys) the projector's own backfill
//! writes. A child process then audits it with 4 segments and reports its
//! peak resident memory (`VmHWM`), so that the table's set-up is not
//! counted. The audit must be clean: a finding means the table or the
//! audit is wrong, and the figure would be meaningless.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use ddb_projector::apply::ApplyConfig;
use ddb_projector::audit::{audit, AuditOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;
use ddb_projector::spec::Spec;
use futures::stream::StreamExt;

/// Items per user, derived ones included (about: shards vary).
const ITEMS_PER_USER: usize = 14;
const FOLLOWS: usize = 3;

fn s(v: &str) -> Av {
    Av::S(v.to_string())
}

fn spec() -> Arc<Spec> {
    Arc::new(Spec::from_file("projections/social-service.toml".as_ref()).expect("spec"))
}

/// Peak resident memory of this process, in MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

async fn load(client: &aws_sdk_dynamodb::Client, table: &str, users: usize) {
    let items: Vec<HashMap<String, Av>> = (0..users)
        .flat_map(|u| {
            let user = format!("USER#u{u}");
            let mut out = vec![
                HashMap::from([
                    ("PK".to_string(), s(&user)),
                    ("SK".to_string(), s("PROFILE")),
                    ("userId".to_string(), s(&format!("u{u}"))),
                    ("name".to_string(), s(&format!("User {u}"))),
                ]),
                HashMap::from([
                    ("PK".to_string(), s(&user)),
                    ("SK".to_string(), s("ACHIEVEMENT#b1")),
                    ("userId".to_string(), s(&format!("u{u}"))),
                    ("badgeId".to_string(), s("b1")),
                    ("tier".to_string(), s(["gold", "silver"][u % 2])),
                    ("score".to_string(), Av::N((u % 1000).to_string())),
                ]),
            ];
            for f in 1..=FOLLOWS {
                let followee = (u * 7 + f * 131) % users;
                if followee == u {
                    continue;
                }
                out.push(HashMap::from([
                    ("PK".to_string(), s(&user)),
                    ("SK".to_string(), s(&format!("FOLLOWS#u{followee}"))),
                    ("followerId".to_string(), s(&format!("u{u}"))),
                    ("followeeId".to_string(), s(&format!("u{followee}"))),
                    ("followedAt".to_string(), s("2026-11-25")),
                ]));
            }
            out
        })
        .collect();
    let chunks: Vec<Vec<HashMap<String, Av>>> = items.chunks(25).map(<[_]>::to_vec).collect();
    futures::stream::iter(chunks)
        .for_each_concurrent(8, |chunk| async move {
            let mut requests: Vec<WriteRequest> = chunk
                .into_iter()
                .map(|item| {
                    WriteRequest::builder()
                        .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                        .build()
                })
                .collect();
            while !requests.is_empty() {
                let out = client
                    .batch_write_item()
                    .request_items(table, requests.clone())
                    .send()
                    .await
                    .unwrap();
                requests = out
                    .unprocessed_items()
                    .and_then(|u| u.get(table))
                    .cloned()
                    .unwrap_or_default();
            }
        })
        .await;
}

/// The child: audits `table` and prints one JSON line.
async fn child(client: aws_sdk_dynamodb::Client, table: &str) {
    let applier = control::applier(client, spec(), table, ApplyConfig::default());
    let report = audit(
        &applier,
        &AuditOptions {
            segments: 4,
            ..AuditOptions::default()
        },
    )
    .await
    .expect("audit");
    if !report.is_clean() {
        eprint!("{}", report.to_text(applier.spec()));
        std::process::exit(1);
    }
    println!(
        "{}",
        serde_json::json!({
            "scanned": report.scanned,
            "seconds": report.seconds,
            "read_units": report.read_units,
            "peak_rss_mb": peak_rss_mb(),
        })
    );
}

#[tokio::main]
async fn main() {
    let config = aws_config::load_from_env().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, table] = &args[..] {
        if flag == "--child" {
            return child(client, table).await;
        }
    }
    let sizes: Vec<usize> = if args.is_empty() {
        vec![20_000, 200_000]
    } else {
        args.iter().filter_map(|n| n.parse().ok()).collect()
    };
    println!("| items | audited | seconds | items/s | RCU per item | peak RSS (pages of 1,000) |");
    println!("|---|---|---|---|---|---|");
    let spec = spec();
    for size in sizes {
        let table = format!("bench-audit-{size}-{}", std::process::id());
        ddb_projector::table::create_table(&client, &spec, &table)
            .await
            .expect("create table");
        load(&client, &table, size / ITEMS_PER_USER).await;
        let applier =
            control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
        backfill(
            &applier,
            &BackfillOptions {
                segments: (0..4).collect(),
                total_segments: 4,
                progress: false,
                ..Default::default()
            },
        )
        .await
        .expect("backfill");
        let output = std::process::Command::new(std::env::current_exe().expect("this example"))
            .args(["--child", &table])
            .output()
            .expect("the audit child");
        if !output.status.success() {
            panic!(
                "the audit of {table} failed or found drift:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let result: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("the child's JSON");
        let scanned = result["scanned"].as_f64().unwrap_or(0.0);
        let seconds = result["seconds"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {size} | {scanned} | {seconds:.1} | {:.0} | {:.2} | {:.1} MB |",
            scanned / seconds,
            result["read_units"].as_f64().unwrap_or(0.0) / scanned.max(1.0),
            result["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
        );
        client
            .delete_table()
            .table_name(&table)
            .send()
            .await
            .expect("delete table");
    }
}
