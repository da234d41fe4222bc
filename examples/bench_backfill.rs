//! Measures backfill throughput against DynamoDB Local with 1, 2 and 4
//! segments: `scripts/bench backfill` (or set `AWS_ENDPOINT_URL` and run
//! `cargo run --release --example bench_backfill -- [ITEMS]`).
//!
//! Each run loads ITEMS email items (default 20,000) into a fresh table
//! without GSI keys, then backfills `email-gsi1-keys` and reports items/s,
//! write units and write units per item.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue as Av, PutRequest, WriteRequest};
use ddb_projector::apply::ApplyConfig;
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control;
use ddb_projector::spec::Spec;
use futures::stream::StreamExt;

fn s(v: &str) -> Av {
    Av::S(v.to_string())
}

#[tokio::main]
async fn main() {
    let items: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let config = aws_config::load_from_env().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let spec = Arc::new(Spec::from_file("projections/user-service.toml".as_ref()).expect("spec"));
    let projection = spec.projection_id("email-gsi1-keys").expect("projection");
    println!("| segments | items | seconds | items/s | WCU | WCU/item |");
    println!("|---|---|---|---|---|---|");
    // `BENCH_SEGMENTS=4,2,1` runs other segment counts, in that order.
    let plan: Vec<u32> = std::env::var("BENCH_SEGMENTS")
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![1, 2, 4]);
    for segments in plan {
        let table = format!("bench-backfill-{segments}-{}", std::process::id());
        ddb_projector::table::create_table(&client, &spec, &table)
            .await
            .expect("create table");
        let chunks: Vec<Vec<HashMap<String, Av>>> = (0..items)
            .map(|i| {
                HashMap::from([
                    ("PK".to_string(), s(&format!("USER#u{i}"))),
                    ("SK".to_string(), s("EMAIL#e1")),
                    ("userId".to_string(), s(&format!("u{i}"))),
                    ("email".to_string(), s(&format!("User{i}@Example.org"))),
                    ("isPrimary".to_string(), Av::Bool(false)),
                ])
            })
            .collect::<Vec<_>>()
            .chunks(25)
            .map(<[_]>::to_vec)
            .collect();
        futures::stream::iter(chunks)
            .for_each_concurrent(8, |chunk| {
                let client = client.clone();
                let table = table.clone();
                async move {
                    let mut requests: Vec<WriteRequest> = chunk
                        .into_iter()
                        .map(|item| {
                            WriteRequest::builder()
                                .put_request(
                                    PutRequest::builder().set_item(Some(item)).build().unwrap(),
                                )
                                .build()
                        })
                        .collect();
                    while !requests.is_empty() {
                        let out = client
                            .batch_write_item()
                            .request_items(&table, requests.clone())
                            .send()
                            .await
                            .unwrap();
                        requests = out
                            .unprocessed_items()
                            .and_then(|u| u.get(&table))
                            .cloned()
                            .unwrap_or_default();
                    }
                }
            })
            .await;
        let applier =
            control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
        let summary = backfill(
            &applier,
            &BackfillOptions {
                projections: Some(vec![projection]),
                segments: (0..segments).collect(),
                total_segments: segments,
                progress: false,
                ..Default::default()
            },
        )
        .await
        .expect("backfill");
        println!(
            "| {segments} | {} | {:.1} | {:.0} | {:.0} | {:.2} |",
            summary.planned,
            summary.seconds,
            summary.planned as f64 / summary.seconds,
            summary.write_units,
            summary.write_units / summary.planned.max(1) as f64
        );
        client
            .delete_table()
            .table_name(&table)
            .send()
            .await
            .expect("delete table");
    }
}
