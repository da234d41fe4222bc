//! A simulated global table: two DynamoDB Local instances ("regions") and a
//! replicator that copies every change of one to the other, as DynamoDB
//! global tables (version 2019.11.21) do.
//!
//! The replicator tails each region's stream. A change made in a region
//! (by a writer or a projector) is stamped when it is read, and applied to
//! the other region after a random delay as a whole-item put or delete:
//! items replicate one by one, so a transaction made in one region is
//! seen partly applied in the other, and a region's stream carries the
//! replicated writes as DynamoDB's does. A conflict is settled per item,
//! last writer wins by stamp: a replicated write older than what the
//! target holds is dropped. `pause` cuts the regions apart (a partition,
//! or a region lost); `resume` delivers what waited (the region back).
//!
//! A replicated write is recognized on the target's stream (its echo) by
//! its image, in order. A put can replace a local write the replicator had
//! not read yet; that write's record then comes before the echo and, being
//! newer, is put back (DynamoDB would have kept it), so the regions still
//! agree on the newest write.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use aws_sdk_dynamodbstreams::types::{OperationType, ShardIteratorType};
use ddb_projector::spec::Spec;

use super::model::{Attrs, Rng};
use super::support;

/// The two regions' names.
pub const REGIONS: [&str; 2] = ["us-east-1", "eu-west-1"];

/// One region of the table.
#[derive(Debug, Clone)]
pub struct Region {
    /// The region's name.
    pub name: &'static str,
    /// Its DynamoDB Local.
    pub config: aws_config::SdkConfig,
    /// A client for it.
    pub client: aws_sdk_dynamodb::Client,
    /// The table there (the same name in both unless one server is shared
    /// through `AWS_ENDPOINT_URL`).
    pub table: String,
}

/// Two DynamoDB Local instances for the global table tests, started once.
/// With `AWS_ENDPOINT_URL` set both are that one server, and the regions'
/// tables get different names.
fn endpoints() -> &'static [String; 2] {
    static PAIR: OnceLock<[String; 2]> = OnceLock::new();
    PAIR.get_or_init(|| [support::dedicated_endpoint(), support::dedicated_endpoint()])
}

/// A replicated write waiting for its time.
#[derive(Debug, Clone)]
struct Delivery {
    due: Instant,
    to: usize,
    key: String,
    keys: Attrs,
    image: Option<Attrs>,
    stamp: u64,
    /// Put back a local write a delivery replaced.
    restore: bool,
}

/// What the replicator knows of one item in one region.
#[derive(Debug, Default, Clone)]
struct Copy {
    /// The newest state read from the region's stream and its stamp.
    seen: Option<(Option<Attrs>, u64)>,
    /// The newest stamp delivered there.
    delivered: u64,
    /// Deliveries whose records have not been read yet, in order.
    echoes: VecDeque<(Option<Attrs>, u64)>,
}

#[derive(Debug, Default)]
struct Counts {
    local: u64,
    applied: u64,
    dropped: u64,
    restored: u64,
}

#[derive(Debug)]
struct State {
    stamp: u64,
    items: HashMap<String, [Copy; 2]>,
    queue: Vec<Delivery>,
    rng: Rng,
    counts: Counts,
    /// Rounds ended.
    rounds: u64,
    /// Times both streams' shards were listed.
    listings: u64,
    /// Consecutive rounds in which nothing was read, delivered or waiting.
    quiet_rounds: u64,
}

struct Shared {
    state: Mutex<State>,
    paused: AtomicBool,
    max_delay_ms: AtomicU64,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
}

/// The simulated global table and its replicator.
pub struct GlobalTable {
    /// The two regions.
    pub regions: [Region; 2],
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl GlobalTable {
    /// A table shaped like `spec` in both regions, replicated with delays
    /// up to `max_delay`; `seed` draws them.
    pub async fn new(spec: &Spec, prefix: &str, max_delay: Duration, seed: u64) -> GlobalTable {
        let shared_server = endpoints()[0] == endpoints()[1];
        let name = support::unique_table(prefix);
        let mut regions = Vec::new();
        for (i, region) in REGIONS.iter().enumerate() {
            let config = support::sdk_config_for(&endpoints()[i]).await;
            let client = aws_sdk_dynamodb::Client::new(&config);
            let table = if shared_server {
                format!("{name}-{region}")
            } else {
                name.clone()
            };
            ddb_projector::table::create_table(&client, spec, &table)
                .await
                .expect("create table");
            regions.push(Region {
                name: region,
                config,
                client,
                table,
            });
        }
        let regions: [Region; 2] = regions.try_into().expect("two regions");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stamp: 0,
                items: HashMap::new(),
                queue: Vec::new(),
                rng: Rng::new(seed),
                counts: Counts::default(),
                rounds: 0,
                listings: 0,
                quiet_rounds: 0,
            }),
            paused: AtomicBool::new(false),
            max_delay_ms: AtomicU64::new(max_delay.as_millis() as u64),
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let task = tokio::spawn(replicate(regions.clone(), shared.clone()));
        GlobalTable {
            regions,
            shared,
            task: Some(task),
        }
    }

    /// Cuts the regions apart: replicated writes wait.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }

    /// Delivers what waited, and replicates again.
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }

    /// Replicated writes made so far, and how many were dropped as older
    /// than the target's (last writer wins) or put back.
    pub fn counts(&self) -> (u64, u64, u64, u64) {
        let state = self.shared.state.lock().unwrap();
        let c = &state.counts;
        (c.local, c.applied, c.dropped, c.restored)
    }

    fn check(&self) {
        if let Some(failure) = self.shared.failure.lock().unwrap().clone() {
            panic!("the replicator failed: {failure}");
        }
    }

    /// Waits until every change made before the call is replicated:
    /// three rounds that began after it read nothing, delivered nothing,
    /// and left nothing waiting (no delivery, no unread echo). Panics
    /// after `limit`.
    pub async fn settle(&self, limit: Duration) {
        assert!(
            !self.shared.paused.load(Ordering::SeqCst),
            "settle a replicated table, not a paused one"
        );
        let started = Instant::now();
        let (first, listed) = {
            let state = self.shared.state.lock().unwrap();
            (state.rounds + 1, state.listings + 1)
        };
        loop {
            self.check();
            {
                let state = self.shared.state.lock().unwrap();
                // And the shards listed since the call: a new shard's
                // records are read only once it is listed.
                if state.quiet_rounds >= 3 && state.rounds >= first + 3 && state.listings > listed {
                    return;
                }
                assert!(
                    started.elapsed() < limit,
                    "replication did not settle in {limit:?}: {:?}, {} waiting",
                    state.counts,
                    state.queue.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every item of region `i`, sorted by key.
    pub async fn items(&self, i: usize) -> Vec<Attrs> {
        let region = &self.regions[i];
        let mut items = support::scan_all(&region.client, &region.table).await;
        items.sort_by_key(key_text);
        items
    }
}

impl Drop for GlobalTable {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// An item's key as text: its key attributes, sorted.
fn key_text(item: &Attrs) -> String {
    let mut parts: Vec<String> = ["PK", "SK"]
        .iter()
        .filter_map(|k| item.get(*k).map(|v| format!("{k}={v:?}")))
        .collect();
    parts.sort();
    parts.join(",")
}

fn convert(
    image: Option<&HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>>,
) -> Option<Attrs> {
    image.map(|map| {
        map.iter()
            .map(|(k, v)| {
                let value = serde_dynamo::AttributeValue::from(v.clone());
                (k.clone(), Av::from(value))
            })
            .collect()
    })
}

/// A shard being read.
struct Reader {
    iterator: Option<String>,
    /// The last record read.
    last: Option<String>,
}

/// The replicator's loop: read both streams, deliver what is due.
async fn replicate(regions: [Region; 2], shared: Arc<Shared>) {
    if let Err(error) = replicate_until_stopped(&regions, &shared).await {
        *shared.failure.lock().unwrap() = Some(error);
    }
}

async fn replicate_until_stopped(regions: &[Region; 2], shared: &Shared) -> Result<(), String> {
    let streams: Vec<aws_sdk_dynamodbstreams::Client> = regions
        .iter()
        .map(|r| aws_sdk_dynamodbstreams::Client::new(&r.config))
        .collect();
    let mut arns = Vec::new();
    for region in regions {
        let (arn, _) = ddb_projector::dynamo::client::require_stream(&region.client, &region.table)
            .await
            .map_err(|e| format!("{}: {e:#}", region.name))?;
        arns.push(arn);
    }
    let mut readers: [HashMap<String, Reader>; 2] = [HashMap::new(), HashMap::new()];
    let mut listed = [Instant::now() - Duration::from_secs(10); 2];
    while !shared.stop.load(Ordering::SeqCst) {
        let mut busy = false;
        for r in 0..2 {
            if listed[r].elapsed() > Duration::from_millis(100) {
                list_shards(&streams[r], &arns[r], &mut readers[r]).await?;
                listed[r] = Instant::now();
                if r == 1 {
                    shared.state.lock().unwrap().listings += 1;
                }
            }
            let mut ids: Vec<String> = readers[r].keys().cloned().collect();
            ids.sort();
            for id in ids {
                let reader = readers[r].get_mut(&id).expect("listed");
                let Some(iterator) = reader.iterator.clone() else {
                    continue;
                };
                let page = match streams[r]
                    .get_records()
                    .shard_iterator(iterator)
                    .limit(1000)
                    .send()
                    .await
                {
                    Ok(page) => page,
                    // DynamoDB Local answers an iterator taken on an empty
                    // shard this way once records arrive: a fresh one
                    // starts after the last record read.
                    Err(error)
                        if error.as_service_error().is_some_and(|e| {
                            e.is_trimmed_data_access_exception()
                                || e.is_expired_iterator_exception()
                        }) =>
                    {
                        reader.iterator = Some(
                            iterator_at(&streams[r], &arns[r], &id, reader.last.as_deref()).await?,
                        );
                        continue;
                    }
                    Err(error) => {
                        return Err(format!("{}: get records: {error:?}", regions[r].name))
                    }
                };
                reader.iterator = page.next_shard_iterator().map(str::to_string);
                for record in page.records() {
                    busy = true;
                    reader.last = record
                        .dynamodb()
                        .and_then(|c| c.sequence_number())
                        .map(str::to_string);
                    let Some(change) = record.dynamodb() else {
                        continue;
                    };
                    let keys = convert(change.keys()).unwrap_or_default();
                    let image = match record.event_name() {
                        Some(OperationType::Remove) => None,
                        _ => convert(change.new_image()),
                    };
                    read_change(shared, r, keys, image);
                }
            }
        }
        busy |= deliver_due(regions, shared).await?;
        {
            let mut state = shared.state.lock().unwrap();
            let waiting = !state.queue.is_empty()
                || state
                    .items
                    .values()
                    .any(|copies| copies.iter().any(|c| !c.echoes.is_empty()));
            if busy || waiting {
                state.quiet_rounds = 0;
            } else {
                state.quiet_rounds += 1;
            }
            state.rounds += 1;
        }
        tokio::time::sleep(Duration::from_millis(if busy { 1 } else { 10 })).await;
    }
    Ok(())
}

async fn list_shards(
    streams: &aws_sdk_dynamodbstreams::Client,
    arn: &str,
    readers: &mut HashMap<String, Reader>,
) -> Result<(), String> {
    let mut shards = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let described = streams
            .describe_stream()
            .stream_arn(arn)
            .set_exclusive_start_shard_id(after.clone())
            .send()
            .await
            .map_err(|e| format!("describe stream: {e:?}"))?;
        let description = described.stream_description();
        shards.extend(description.map(|d| d.shards().to_vec()).unwrap_or_default());
        after = description
            .and_then(|d| d.last_evaluated_shard_id())
            .map(str::to_string);
        if after.is_none() {
            break;
        }
    }
    for shard in shards {
        let Some(id) = shard.shard_id() else {
            continue;
        };
        if readers.contains_key(id) {
            continue;
        }
        // A child after its parent: an item's records move to the child.
        if let Some(parent) = shard.parent_shard_id() {
            if readers
                .get(parent)
                .is_some_and(|reader| reader.iterator.is_some())
            {
                continue;
            }
        }
        let iterator = iterator_at(streams, arn, id, None).await?;
        readers.insert(
            id.to_string(),
            Reader {
                iterator: Some(iterator),
                last: None,
            },
        );
    }
    Ok(())
}

/// An iterator after `last`, or at the shard's start.
async fn iterator_at(
    streams: &aws_sdk_dynamodbstreams::Client,
    arn: &str,
    shard: &str,
    last: Option<&str>,
) -> Result<String, String> {
    let request = streams.get_shard_iterator().stream_arn(arn).shard_id(shard);
    let request = match last {
        Some(sequence) => request
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(sequence),
        None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    request
        .send()
        .await
        .map_err(|e| format!("shard iterator: {e:?}"))?
        .shard_iterator
        .ok_or_else(|| "no shard iterator".to_string())
}

/// A record read from region `r`'s stream: an echo of a delivery, or a
/// local write to replicate.
fn read_change(shared: &Shared, r: usize, keys: Attrs, image: Option<Attrs>) {
    let key = key_text(&keys);
    let mut state = shared.state.lock().unwrap();
    let state = &mut *state;
    let copies = state.items.entry(key.clone()).or_default();
    let copy = &mut copies[r];
    if copy.echoes.front().is_some_and(|(echo, _)| *echo == image) {
        let (image, stamp) = copy.echoes.pop_front().expect("a front");
        match &copy.seen {
            // A local write read before this echo was made before the
            // delivery, which replaced it: it is newer, so put it back.
            Some((newer, seen)) if *seen > stamp => {
                state.counts.restored += 1;
                state.queue.push(Delivery {
                    due: Instant::now(),
                    to: r,
                    key,
                    keys,
                    image: newer.clone(),
                    stamp: *seen,
                    restore: true,
                });
            }
            _ => copy.seen = Some((image, stamp)),
        }
        return;
    }
    state.stamp += 1;
    let stamp = state.stamp;
    copy.seen = Some((image.clone(), stamp));
    state.counts.local += 1;
    let max = shared.max_delay_ms.load(Ordering::SeqCst);
    let delay = if max == 0 {
        0
    } else {
        state.rng.below(max + 1)
    };
    state.queue.push(Delivery {
        due: Instant::now() + Duration::from_millis(delay),
        to: 1 - r,
        key,
        keys,
        image,
        stamp,
        restore: false,
    });
}

/// Applies the deliveries that are due (none while paused); whether any
/// was.
async fn deliver_due(regions: &[Region; 2], shared: &Shared) -> Result<bool, String> {
    if shared.paused.load(Ordering::SeqCst) {
        return Ok(false);
    }
    let due: Vec<Delivery> = {
        let mut state = shared.state.lock().unwrap();
        let now = Instant::now();
        let (due, waiting) = state.queue.drain(..).partition(|d| d.due <= now);
        state.queue = waiting;
        due
    };
    let any = !due.is_empty();
    for delivery in due {
        {
            let mut state = shared.state.lock().unwrap();
            let state = &mut *state;
            let copy = &mut state.items.get_mut(&delivery.key).expect("read")[delivery.to];
            let newest = copy
                .delivered
                .max(copy.seen.as_ref().map_or(0, |(_, s)| *s));
            if !delivery.restore && delivery.stamp <= newest {
                state.counts.dropped += 1;
                continue;
            }
        }
        let region = &regions[delivery.to];
        let old = match &delivery.image {
            Some(image) => {
                region
                    .client
                    .put_item()
                    .table_name(&region.table)
                    .set_item(Some(image.clone()))
                    .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
                    .send()
                    .await
                    .map_err(|e| format!("{}: put: {e:?}", region.name))?
                    .attributes
            }
            None => {
                region
                    .client
                    .delete_item()
                    .table_name(&region.table)
                    .set_key(Some(delivery.keys.clone()))
                    .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
                    .send()
                    .await
                    .map_err(|e| format!("{}: delete: {e:?}", region.name))?
                    .attributes
            }
        };
        let mut state = shared.state.lock().unwrap();
        state.counts.applied += 1;
        let copy = &mut state.items.get_mut(&delivery.key).expect("read")[delivery.to];
        copy.delivered = copy.delivered.max(delivery.stamp);
        // A write that changes nothing leaves no stream record.
        if old != delivery.image {
            copy.echoes.push_back((delivery.image, delivery.stamp));
        } else {
            copy.seen = Some((delivery.image, delivery.stamp));
        }
    }
    Ok(any)
}
