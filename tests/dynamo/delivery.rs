//! The stream as Lambda and the runner deliver it, for the property tests:
//! records of many items interleaved (each item's kept in order), random
//! batch sizes, invocations that crash part way and are bisected, batches
//! delivered again, and writers that write the source items as the stream
//! goes (or all up front).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use std::sync::Arc;

use ddb_projector::apply::{Applier, BatchOptions, Delivered, Delivery as ApplyDelivery};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::faults::Faults;
use super::model::{delete_item, put_item, Attrs, History, Record};
use super::support::{self, text};

/// The runtime the property tests block on (two workers: the applier's
/// concurrent writes, and a backfill beside the live worker).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// What goes wrong around one batch.
#[derive(Debug, Clone)]
pub enum Mishap {
    None,
    /// The invocation applied the first `percent`% of the batch and then
    /// crashed (or timed out); Lambda bisects: the first half, then the
    /// second, each delivered again from its first failed record.
    CrashThenBisect {
        percent: u8,
    },
    /// The batch was applied but its checkpoint was lost: the last `back`
    /// delivered records come again, in order.
    Redeliver {
        back: u8,
    },
}

/// How the stream reaches the applier.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Priorities that interleave the items' records (per-item order kept).
    pub shuffle: Vec<u32>,
    /// Batch sizes, used in turn.
    pub sizes: Vec<usize>,
    /// One per batch, used in turn.
    pub mishaps: Vec<Mishap>,
    /// Source items are written as the stream goes (the table is at most
    /// `ahead` records ahead of the batch), or all up front.
    pub live: Option<u8>,
    /// As Kinesis Data Streams for DynamoDB delivers: one item's records
    /// in any order (not only interleaved with others'), each batch
    /// derived as its items are now, as the Kinesis source applies it.
    pub kinesis: bool,
}

pub fn delivery() -> impl Strategy<Value = Delivery> {
    let mishap = prop_oneof![
        5 => Just(Mishap::None),
        2 => (0u8..=100).prop_map(|percent| Mishap::CrashThenBisect { percent }),
        2 => (1u8..40).prop_map(|back| Mishap::Redeliver { back }),
    ];
    (
        prop::collection::vec(any::<u32>(), 1..64),
        prop::collection::vec(1usize..30, 1..6),
        prop::collection::vec(mishap, 1..8),
        prop::option::of(0u8..20),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(shuffle, sizes, mishaps, live, kinesis)| Delivery {
            shuffle,
            sizes,
            mishaps,
            live,
            kinesis,
        })
}

/// A random interleaving of the records that keeps each item's records in
/// stream order: shuffle the positions, then give each item's positions to
/// its records in order.
pub fn interleave(records: &[Record], shuffle: &[u32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| (shuffle[i % shuffle.len()].rotate_left(i as u32 % 31), i));
    let key = |i: usize| {
        let record = records[i].as_ref().expect("generated records decode");
        History::key(&record.keys.to_item().into())
    };
    let mut slots: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (slot, &i) in order.iter().enumerate() {
        slots.entry(key(i)).or_default().push(slot);
    }
    let mut by_item: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for i in 0..records.len() {
        by_item.entry(key(i)).or_default().push(i);
    }
    let mut out = vec![0; records.len()];
    for (item, indexes) in by_item {
        for (slot, i) in slots[&item].iter().zip(indexes) {
            out[*slot] = i;
        }
    }
    out
}

/// Applies `batch` as Lambda delivers it to the handler: recorded in the
/// ledger of deliveries, and again from the first record not handled (the
/// handler records where Lambda restarts), until all are.
pub async fn apply(applier: &Applier, batch: &[Record]) -> Result<(), TestCaseError> {
    let mut start = 0;
    for _ in 0..40 {
        if start >= batch.len() {
            return Ok(());
        }
        let delivery = lambda_delivery(applier, &batch[start..]);
        let options = BatchOptions {
            delivery: delivery.clone(),
            ..BatchOptions::default()
        };
        let outcome = applier
            .apply_batch(&batch[start..], &options)
            .await
            .map_err(|error| TestCaseError::fail(format!("the batch failed whole: {error}")))?;
        match outcome.first_failure() {
            Some(index) => {
                if let (Some(delivery), Ok(record)) = (&delivery, &batch[start + index]) {
                    if delivery.recorded() {
                        applier
                            .delivery_restarts_at(delivery, &record.event_id)
                            .await
                            .map_err(TestCaseError::fail)?;
                    }
                }
                start += index;
            }
            None => return Ok(()),
        }
    }
    Err(TestCaseError::fail(
        "a batch was not handled after 40 passes",
    ))
}

/// Applies `batch` as the Kinesis source does (`StreamRunner::kinesis`,
/// the Lambda's Kinesis events): each item the records name derived as it
/// is now, guarded by the state read, invariants checked; again from the
/// first record not handled, until all are.
pub async fn apply_kinesis(applier: &Applier, batch: &[Record]) -> Result<(), TestCaseError> {
    let mut start = 0;
    for _ in 0..40 {
        if start >= batch.len() {
            return Ok(());
        }
        let states = applier
            .current_states(batch[start..].to_vec(), None)
            .await
            .map_err(|error| TestCaseError::fail(format!("current states: {error}")))?;
        let options = BatchOptions {
            read_markers_first: true,
            check_states: true,
            ..BatchOptions::default()
        };
        let outcome = applier
            .apply_batch(&states.records, &options)
            .await
            .map_err(|error| TestCaseError::fail(format!("the batch failed whole: {error}")))?;
        let n = batch.len() - start;
        match (0..n).position(|i| !outcome.statuses[states.stands_for[i]].is_handled()) {
            Some(index) => start += index,
            None => return Ok(()),
        }
    }
    Err(TestCaseError::fail(
        "a Kinesis batch was not handled after 40 passes",
    ))
}

/// `records` as one Lambda batch in the ledger of deliveries: keyed by its
/// first record, reaching its highest sequence number (the generated
/// stream interleaves items, keeping each item's records in order).
pub fn lambda_delivery(applier: &Applier, records: &[Record]) -> Option<Arc<ApplyDelivery>> {
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
    let first_id = records.first()?.as_ref().ok()?.event_id.clone();
    let first = delivered.iter().map(|d| d.sequence_number.clone()).min()?;
    let through = delivered.iter().map(|d| d.sequence_number.clone()).max()?;
    ApplyDelivery::new(
        &first_id,
        first,
        through,
        Box::new(move || delivered.clone()),
    )
    .map(Arc::new)
}

/// [`apply`] with options (a replay of some projections).
pub async fn apply_with(
    applier: &Applier,
    batch: &[Record],
    options: &BatchOptions,
) -> Result<(), TestCaseError> {
    let mut start = 0;
    for _ in 0..40 {
        if start >= batch.len() {
            return Ok(());
        }
        let outcome = applier
            .apply_batch(&batch[start..], options)
            .await
            .map_err(|error| TestCaseError::fail(format!("the batch failed whole: {error}")))?;
        match outcome.first_failure() {
            Some(index) => start += index,
            None => return Ok(()),
        }
    }
    Err(TestCaseError::fail(
        "a batch was not handled after 40 passes",
    ))
}

/// The writers' writes, in order, up to record `upto` (exclusive).
pub struct Writer<'a> {
    pub client: &'a aws_sdk_dynamodb::Client,
    pub table: &'a str,
    pub history: &'a History,
    /// How many of the history's records are written.
    pub written: usize,
}

impl Writer<'_> {
    /// Writes the history's records up to `upto` (exclusive).
    pub async fn write_until(&mut self, upto: usize) {
        while self.written < upto.min(self.history.records.len()) {
            let record = self.history.records[self.written]
                .as_ref()
                .expect("generated records decode");
            match &record.new_image {
                Some(image) => put_item(self.client, self.table, &image.to_item().into()).await,
                None => delete_item(self.client, self.table, record.keys.to_item().into()).await,
            }
            self.written += 1;
        }
    }
}

/// Delivers the history's records from `base` on, as `plan` says, the
/// writer writing each source item before its record is delivered.
pub async fn deliver(
    applier: &Applier,
    writer: &mut Writer<'_>,
    base: usize,
    plan: &Delivery,
) -> Result<(), TestCaseError> {
    deliver_with(applier, writer, base, plan, None).await
}

/// Applies `batch` with a kill armed to land after `after` writes are
/// answered: the invocation is dropped where the kill lands (between a
/// write and the writes after it, which never reach DynamoDB), and Lambda
/// delivers the batch again (whether or not the kill landed: a batch
/// delivered twice changes nothing).
async fn kill_then_redeliver(
    applier: &Applier,
    faults: &Faults,
    batch: &[Record],
    after: u64,
    kinesis: bool,
) -> Result<(), TestCaseError> {
    faults.arm_kill(after);
    let work = async {
        if kinesis {
            let _ = apply_kinesis(applier, batch).await;
        } else {
            let options = BatchOptions {
                delivery: lambda_delivery(applier, batch),
                ..BatchOptions::default()
            };
            let _ = applier.apply_batch(batch, &options).await;
        }
    };
    // A kill that lands as the work ends still lands first: the process
    // died before the invocation returned.
    let landed = tokio::select! {
        biased;
        () = faults.killed() => true,
        () = work => false,
    };
    faults.disarm(landed);
    if kinesis {
        apply_kinesis(applier, batch).await
    } else {
        apply(applier, batch).await
    }
}

/// [`deliver`] through a client whose `chaos` injects faults at its rate,
/// and kills the invocation in the middle of batches: every batch after
/// its first write answered until one kill has landed, then every third
/// after 1 to 3 writes.
pub async fn deliver_with(
    applier: &Applier,
    writer: &mut Writer<'_>,
    base: usize,
    plan: &Delivery,
    chaos: Option<&Faults>,
) -> Result<(), TestCaseError> {
    let records = &writer.history.records[base..];
    let order = if plan.kinesis {
        // Any order, even one item's.
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&i| {
            (
                plan.shuffle[i % plan.shuffle.len()].rotate_left(i as u32 % 31),
                i,
            )
        });
        order
    } else {
        interleave(records, &plan.shuffle)
    };
    let apply = |applier: &Applier, batch: &[Record]| {
        let batch = batch.to_vec();
        let applier = applier.clone();
        let kinesis = plan.kinesis;
        async move {
            if kinesis {
                apply_kinesis(&applier, &batch).await
            } else {
                apply(&applier, &batch).await
            }
        }
    };
    let mut delivered: Vec<usize> = Vec::new();
    let mut at = 0;
    let mut turn = 0;
    while at < order.len() {
        let size = plan.sizes[turn % plan.sizes.len()];
        let mishap = &plan.mishaps[turn % plan.mishaps.len()];
        turn += 1;
        let indexes = &order[at..(at + size).min(order.len())];
        at += indexes.len();
        // A record exists only once its write happened.
        let newest = indexes.iter().max().copied().unwrap_or(0) + 1;
        writer
            .write_until(base + newest + plan.live.map_or(records.len(), usize::from))
            .await;
        let batch: Vec<Record> = indexes.iter().map(|&i| records[i].clone()).collect();
        if let Some(faults) = chaos.filter(|f| f.kills_landed() == 0 || turn % 3 == 0) {
            // After the first write until one kill landed, then after 1 to 3.
            let after = if faults.kills_landed() == 0 {
                1
            } else {
                1 + turn as u64 % 3
            };
            kill_then_redeliver(applier, faults, &batch, after, plan.kinesis).await?;
            delivered.extend_from_slice(indexes);
            continue;
        }
        match *mishap {
            Mishap::None => apply(applier, &batch).await?,
            Mishap::CrashThenBisect { percent } => {
                let done = batch.len() * usize::from(percent) / 100;
                // What the crashed invocation got done is unknown to Lambda
                // (it had recorded the whole batch in the ledger first).
                if plan.kinesis {
                    let _ = apply_kinesis(applier, &batch[..done]).await;
                } else {
                    let options = BatchOptions {
                        delivery: lambda_delivery(applier, &batch),
                        ..BatchOptions::default()
                    };
                    let _ = applier.apply_batch(&batch[..done], &options).await;
                }
                let half = batch.len().div_ceil(2);
                apply(applier, &batch[..half]).await?;
                apply(applier, &batch[half..]).await?;
            }
            Mishap::Redeliver { back } => {
                apply(applier, &batch).await?;
                delivered.extend_from_slice(indexes);
                let from = delivered.len().saturating_sub(usize::from(back));
                let again: Vec<Record> = delivered[from..]
                    .iter()
                    .map(|&i| records[i].clone())
                    .collect();
                apply(applier, &again).await?;
                continue;
            }
        }
        delivered.extend_from_slice(indexes);
    }
    writer.write_until(base + records.len()).await;
    Ok(())
}

/// Every item but recorded violations (whose `lastSeen` moves when a check
/// confirms them).
pub async fn snapshot(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    let mut items: Vec<Attrs> = support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| !text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#violation#")))
        // The ledger of deliveries: each delivery records itself.
        .filter(|item| {
            !text(item, "PK")
                .is_some_and(|pk| pk.starts_with(ddb_projector::dynamo::names::DELIVERED_PK))
        })
        // The lifecycle registry: leases are renewed as time passes.
        .filter(|item| {
            !text(item, "PK")
                .is_some_and(|pk| ddb_projector::control::Registry::is_registry_key(&pk))
        })
        .collect();
    items.sort_by_key(History::key);
    items
}
