//! The shared state of one batch's requests: the client and spec, the
//! capacity and requests counted, the partitions recomputes read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue as Av, ConsumedCapacity};

use super::{ApplyConfig, Control};
use crate::plan::SourceQuery;
use crate::record::{Item, ItemKey};
use crate::spec::{ProjectionId, Spec};

/// Shared state of one batch's writes.
pub(crate) struct Ctx<'a> {
    pub client: &'a aws_sdk_dynamodb::Client,
    pub table: &'a str,
    pub spec: &'a Spec,
    pub config: &'a ApplyConfig,
    /// The control plane the applier writes under (the counter version
    /// readers read).
    pub control: &'a dyn Control,
    /// Write units in millionths (atomics have no f64).
    pub write_micro_units: AtomicU64,
    pub read_micro_units: AtomicU64,
    pub writes: AtomicU64,
    pub retries: AtomicU64,
    /// Requests by purpose.
    pub requests: std::sync::Mutex<Requests>,
    /// Source partitions recomputes read (after every write of the
    /// batch's first phase), and the targets they wrote: the invariant
    /// check reuses a read no later write of the batch fell into.
    pub partitions: std::sync::Mutex<PartitionReads>,
    /// Recompute targets read ahead, at the start of the batch (`None`:
    /// absent then). A recompute's first attempt takes its target from
    /// here: reading the target earlier than its sources is what its
    /// conditional write needs, so an early read only risks a retry.
    /// Each projection recomputing a target takes it once: two rollups
    /// onto one profile each write on condition of their own token and
    /// attributes, which the other's write leaves as they were.
    pub targets: std::sync::Mutex<HashMap<ItemKey, Option<HashMap<String, Av>>>>,
    /// The (projection, target) pairs that took their target read ahead.
    pub targets_taken: std::sync::Mutex<std::collections::HashSet<(ProjectionId, ItemKey)>>,
    /// Markers (and the sources guarding them) read ahead, at the start of
    /// the batch beside the holds (`None`: absent then). The marker
    /// writes that read first take them from here: every marker write is
    /// conditional on the state it assumes, so an earlier read only risks
    /// another round of that write.
    pub markers: std::sync::Mutex<HashMap<ItemKey, Option<Item>>>,
    /// Source partitions read once after the batch's first phase, for
    /// whichever of a recompute (whose target was read ahead) and an
    /// invariant check of the partition asks first: the other waits for
    /// the same read.
    pub shared: std::sync::Mutex<HashMap<SourceQuery, SharedRead>>,
    /// The items recomputes compute from by key (a rollup's shards), read
    /// once after the batch's first phase for every recompute whose
    /// target was read ahead ([`Ctx::shared_items`]).
    pub items: ItemReads,
    /// Whether recomputes' reads are kept for the invariant check (a
    /// batch's are; an audit's, which never check from them, are not).
    pub keep_reads: bool,
}

/// The source items of a phase's recomputes, read together.
#[derive(Default)]
pub(crate) struct ItemReads {
    /// The keys the recomputes whose target was read ahead read.
    wanted: std::sync::Mutex<ItemsWanted>,
}

#[derive(Default)]
struct ItemsWanted {
    /// Every key named for the phase.
    all: std::collections::HashSet<ItemKey>,
    /// Those no read has covered yet.
    unread: std::collections::HashSet<ItemKey>,
    /// The latest read, while it is being answered (or not yet sent),
    /// and the keys it covers.
    current: Option<(
        std::sync::Arc<ItemsCell>,
        std::sync::Arc<std::collections::HashSet<ItemKey>>,
    )>,
}

type ItemsCell =
    tokio::sync::OnceCell<Result<HashMap<ItemKey, Item>, crate::dynamo::retry::WriteError>>;

/// A partition read once for whoever asks ([`Ctx::shared`]).
pub(crate) type SharedRead =
    std::sync::Arc<tokio::sync::OnceCell<Result<Vec<Item>, crate::dynamo::retry::WriteError>>>;

/// What recomputes read and wrote, for the invariant check.
#[derive(Debug, Default)]
pub(crate) struct PartitionReads {
    read: HashMap<SourceQuery, Vec<Item>>,
    written: Vec<ItemKey>,
}

/// Whether `key` is one of the items `query` reads.
pub(crate) fn within(query: &SourceQuery, key: &ItemKey) -> bool {
    key.pk == query.pk
        && query
            .sk_prefix
            .as_deref()
            .is_none_or(|prefix| key.sk.as_deref().is_some_and(|sk| sk.starts_with(prefix)))
}

/// Requests a batch sent, by purpose. A retried request counts once (the
/// retries are counted apart); a transaction sent again after a
/// cancellation counts again.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Requests {
    /// Consistent `GetItem`s of the hold set (one per batch with effects).
    pub holds_reads: u64,
    /// Recomputes: consistent `GetItem`s of targets and `Query`s of sources.
    pub recompute_reads: u64,
    /// Consistent `BatchGetItem`s of markers before their transactions.
    pub marker_reads: u64,
    /// Invariant checks: partition and GSI `Query`s, `BatchGetItem`s
    /// confirming holders and reading recorded violations.
    pub check_reads: u64,
    /// `UpdateItem`s: index keys, recompute writes, invariant repairs and
    /// recorded violations.
    pub updates: u64,
    /// `PutItem`s refreshing markers that exist, and `DeleteItem`s of
    /// resolved violations.
    pub single_writes: u64,
    /// `BatchWriteItem`s of plain puts and deletes.
    pub batch_writes: u64,
    /// `TransactWriteItems` of markers and counter shards.
    pub transactions: u64,
    /// The ledger of deliveries: the `UpdateItem` recording a delivery,
    /// the entries a re-delivery spreads, deletes of completed ones.
    #[serde(default)]
    pub deliveries: u64,
    /// Of these, transactions DynamoDB cancelled.
    pub cancelled_transactions: u64,
    /// Items sent in `BatchWriteItem`s (not requests).
    pub batch_write_items: u64,
    /// Items sent in `TransactWriteItems`, condition checks included (not
    /// requests).
    pub transaction_items: u64,
    /// Recomputed targets (`denormalize`, `rollup`, `aggregate`), each
    /// counted once whatever its attempts (not requests).
    #[serde(default)]
    pub recomputes: u64,
}

impl Requests {
    /// Adds another batch's counts.
    pub fn add(&mut self, other: &Requests) {
        self.holds_reads += other.holds_reads;
        self.recompute_reads += other.recompute_reads;
        self.marker_reads += other.marker_reads;
        self.check_reads += other.check_reads;
        self.updates += other.updates;
        self.single_writes += other.single_writes;
        self.batch_writes += other.batch_writes;
        self.transactions += other.transactions;
        self.deliveries += other.deliveries;
        self.cancelled_transactions += other.cancelled_transactions;
        self.batch_write_items += other.batch_write_items;
        self.transaction_items += other.transaction_items;
        self.recomputes += other.recomputes;
    }

    /// The least DynamoDB bills for the writes sent, whatever the endpoint
    /// reports: 1 write unit per KB of each single or batched write (a
    /// failed condition included) and 2 per KB of each transaction item,
    /// counting every item as under 1 KB; the writes to GSIs come on top.
    /// DynamoDB Local reports 2.0 for a whole transaction, so its figure can
    /// be far lower.
    pub fn min_billed_write_units(&self) -> u64 {
        self.updates
            + self.single_writes
            + self.batch_write_items
            + 2 * self.transaction_items
            + self.deliveries
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.holds_reads
            + self.recompute_reads
            + self.marker_reads
            + self.check_reads
            + self.updates
            + self.single_writes
            + self.batch_writes
            + self.transactions
            + self.deliveries
    }
}

impl<'a> Ctx<'a> {
    pub fn new(
        client: &'a aws_sdk_dynamodb::Client,
        table: &'a str,
        spec: &'a Spec,
        config: &'a ApplyConfig,
        control: &'a dyn Control,
    ) -> Self {
        Ctx {
            client,
            table,
            spec,
            config,
            control,
            write_micro_units: AtomicU64::new(0),
            read_micro_units: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            requests: std::sync::Mutex::new(Requests::default()),
            partitions: std::sync::Mutex::new(PartitionReads::default()),
            targets: std::sync::Mutex::new(HashMap::new()),
            targets_taken: std::sync::Mutex::new(std::collections::HashSet::new()),
            markers: std::sync::Mutex::new(HashMap::new()),
            shared: std::sync::Mutex::new(HashMap::new()),
            items: ItemReads::default(),
            keep_reads: true,
        }
    }

    /// Reads the recompute targets `keys` ahead (see [`Ctx::targets`]).
    /// A failed read leaves them to be read when recomputed.
    pub(crate) async fn read_targets_ahead(&self, keys: Vec<&ItemKey>) {
        if keys.is_empty() {
            return;
        }
        let requests = keys.len().div_ceil(100);
        match super::reads::read_items(self, keys.clone(), "read_targets").await {
            Ok(mut found) => {
                self.count_n(|r| &mut r.recompute_reads, requests);
                let mut targets = self.targets.lock().expect("not poisoned");
                for key in keys {
                    targets.insert(key.clone(), found.remove(key));
                }
            }
            Err(error) => tracing::debug!(%error, "reading recompute targets ahead failed"),
        }
    }

    /// Reads the markers `keys` ahead (see [`Ctx::markers`]). A failed
    /// read leaves them to be read when written.
    pub(crate) async fn read_markers_ahead(&self, keys: Vec<ItemKey>) {
        if keys.is_empty() {
            return;
        }
        self.count(|r| &mut r.marker_reads);
        match super::reads::read_markers(self, keys.iter().collect()).await {
            Ok(mut found) => {
                let mut markers = self.markers.lock().expect("not poisoned");
                for key in keys {
                    let item = found.remove(&key);
                    markers.insert(key, item);
                }
            }
            Err(error) => tracing::debug!(%error, "reading markers ahead failed"),
        }
    }

    /// Of `keys`, the markers read ahead (each taken once: `Some(None)`
    /// when absent then), and the keys still to read.
    pub(crate) fn markers_read_ahead<'k>(
        &self,
        keys: Vec<&'k ItemKey>,
    ) -> (HashMap<ItemKey, Item>, Vec<&'k ItemKey>) {
        let mut markers = self.markers.lock().expect("not poisoned");
        let (mut found, mut rest) = (HashMap::new(), Vec::new());
        for key in keys {
            match markers.remove(key) {
                Some(Some(item)) => {
                    found.insert(key.clone(), item);
                }
                Some(None) => {}
                None => rest.push(key),
            }
        }
        (found, rest)
    }

    /// The items of `query`, read once after the batch's first phase for
    /// every caller (see [`Ctx::shared`]); the read counts for `purpose`.
    pub(crate) async fn read_shared(
        &self,
        query: &SourceQuery,
        purpose: fn(&mut Requests) -> &mut u64,
    ) -> Result<Vec<Item>, crate::dynamo::retry::WriteError> {
        let cell = self
            .shared
            .lock()
            .expect("not poisoned")
            .entry(query.clone())
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            self.count(purpose);
            super::reads::read_sources(self, query).await
        })
        .await
        .clone()
    }

    /// Whether `key` was read ahead, and found.
    pub(crate) fn target_found_ahead(&self, key: &ItemKey) -> bool {
        matches!(
            self.targets.lock().expect("not poisoned").get(key),
            Some(Some(_))
        )
    }

    /// Names the source items [`Ctx::shared_items`] reads together:
    /// those of the recomputes whose target was read ahead.
    pub(crate) fn want_items(&self, wanted: std::collections::HashSet<ItemKey>) {
        *self.items.wanted.lock().expect("not poisoned") = ItemsWanted {
            unread: wanted.clone(),
            all: wanted,
            current: None,
        };
    }

    /// The items of `keys` (those that exist), read with the other items
    /// [`Ctx::want_items`] named: `BatchGetItem`s of 100 keys sent
    /// together, one round trip for all the recomputes that ask while it
    /// is answered. A recompute that asks once it was answered starts the
    /// next read, of the keys not read yet (and its own): no recompute
    /// writes from a read older than its own start, however long it
    /// waited for a slot. `None` (read them alone): not all named, or a
    /// key DynamoDB refuses failed the read together (one bad key fails no
    /// other recompute); a read throttled past the retry time fails.
    pub(crate) async fn shared_items(
        &self,
        keys: &[ItemKey],
    ) -> Result<Option<Vec<Item>>, crate::dynamo::retry::WriteError> {
        let (cell, covered) = {
            let mut wanted = self.items.wanted.lock().expect("not poisoned");
            if !keys.iter().all(|key| wanted.all.contains(key)) {
                return Ok(None);
            }
            let joinable = wanted.current.as_ref().is_some_and(|(cell, covered)| {
                !cell.initialized() && keys.iter().all(|key| covered.contains(key))
            });
            if !joinable {
                let mut covered = std::mem::take(&mut wanted.unread);
                covered.extend(keys.iter().cloned());
                wanted.current = Some((Default::default(), std::sync::Arc::new(covered)));
            }
            wanted.current.clone().expect("set above")
        };
        let read = cell
            .get_or_init(|| async {
                self.count_n(|r| &mut r.recompute_reads, covered.len().div_ceil(100));
                super::reads::read_markers(self, covered.iter().collect()).await
            })
            .await;
        match read {
            Ok(found) => Ok(Some(
                keys.iter()
                    .filter_map(|key| found.get(key).cloned())
                    .collect(),
            )),
            // A key DynamoDB refuses fails the read of every key with it.
            Err(crate::dynamo::retry::WriteError::Poison(error)) => {
                tracing::debug!(%error, "reading recompute sources together failed");
                Ok(None)
            }
            // Throttled past the retry time: reading each alone would only
            // add requests to a table that is shedding them.
            Err(error) => Err(error.clone()),
        }
    }

    /// The target read ahead for `key`, once for `projection`.
    pub(crate) fn target_read_ahead(
        &self,
        projection: ProjectionId,
        key: &ItemKey,
    ) -> Option<Option<HashMap<String, Av>>> {
        let read = self
            .targets
            .lock()
            .expect("not poisoned")
            .get(key)
            .cloned()?;
        let first = self
            .targets_taken
            .lock()
            .expect("not poisoned")
            .insert((projection, key.clone()));
        first.then_some(read)
    }

    pub(crate) fn remember_read(&self, query: &SourceQuery, items: &[Item]) {
        if !self.keep_reads {
            return;
        }
        let mut partitions = self.partitions.lock().expect("not poisoned");
        partitions.read.insert(query.clone(), items.to_vec());
    }

    pub(crate) fn remember_written(&self, target: &ItemKey) {
        let mut partitions = self.partitions.lock().expect("not poisoned");
        partitions.written.push(target.clone());
    }

    /// The items of `query` a recompute of this batch read, if no write of
    /// the batch's recomputes fell among them (in whatever order the two
    /// happened). Earlier writes of the batch all came before that read.
    pub(crate) fn partition_read(&self, query: &SourceQuery) -> Option<Vec<Item>> {
        let partitions = self.partitions.lock().expect("not poisoned");
        if partitions.written.iter().any(|key| within(query, key)) {
            return None;
        }
        partitions.read.get(query).cloned()
    }

    /// Counts a request by purpose.
    pub(crate) fn count(&self, purpose: impl FnOnce(&mut Requests) -> &mut u64) {
        self.count_n(purpose, 1);
    }

    /// Adds `n` to a count.
    pub(crate) fn count_n(&self, purpose: impl FnOnce(&mut Requests) -> &mut u64, n: usize) {
        *purpose(&mut self.requests.lock().expect("not poisoned")) += n as u64;
    }

    /// The requests counted so far.
    pub(crate) fn requests(&self) -> Requests {
        self.requests.lock().expect("not poisoned").clone()
    }

    pub(crate) fn key(&self, key: &ItemKey) -> HashMap<String, Av> {
        self.spec.table.key_item(key).into()
    }

    pub(crate) fn count_units<'c>(
        &self,
        consumed: impl IntoIterator<Item = &'c ConsumedCapacity>,
        write: bool,
    ) {
        for capacity in consumed {
            let units = if write {
                capacity
                    .write_capacity_units()
                    .or(capacity.capacity_units())
            } else {
                capacity.read_capacity_units().or(capacity.capacity_units())
            };
            let micro = (units.unwrap_or(0.0) * 1e6) as u64;
            if write {
                self.write_micro_units.fetch_add(micro, Ordering::Relaxed);
            } else {
                self.read_micro_units.fetch_add(micro, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn sent(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn pk_name(&self) -> &str {
        &self.spec.table.partition_key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ItemKey;

    /// A control plane the test never asks.
    #[derive(Debug)]
    struct Unused;

    impl Control for Unused {
        fn lease<'a>(
            &'a self,
            _: &'a [crate::spec::ProjectionId],
            _: u64,
        ) -> futures::future::BoxFuture<'a, Result<u64, String>> {
            unreachable!("no lease is taken")
        }

        fn note_applied<'a>(
            &'a self,
            _: &'a [(crate::spec::ProjectionId, i64)],
        ) -> futures::future::BoxFuture<'a, Result<(), crate::apply::ApplyError>> {
            unreachable!("nothing is applied")
        }

        fn readers_version<'a>(
            &'a self,
            _: &'a str,
        ) -> futures::future::BoxFuture<
            'a,
            Result<Option<crate::apply::CounterVersion>, crate::apply::ApplyError>,
        > {
            unreachable!("no counter is read")
        }
    }

    #[test]
    fn a_partition_read_is_reused_only_if_no_recompute_wrote_among_its_items() {
        let spec = crate::spec::Spec::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("projections/user-service.toml"),
        )
        .expect("the shipped spec");
        let config = ApplyConfig::default();
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let ctx = Ctx::new(&client, "t", &spec, &config, &Unused);
        let emails = SourceQuery {
            pk: "USER#u".into(),
            sk_prefix: Some("EMAIL#".into()),
        };
        assert_eq!(ctx.partition_read(&emails), None);
        ctx.remember_read(&emails, &[Item::default()]);
        // The profile is not among the emails.
        ctx.remember_written(&ItemKey::new("USER#u", "PROFILE"));
        assert_eq!(ctx.partition_read(&emails).map(|i| i.len()), Some(1));
        ctx.remember_written(&ItemKey::new("USER#u", "EMAIL#e1"));
        assert_eq!(ctx.partition_read(&emails), None);
        let whole = SourceQuery {
            pk: "USER#v".into(),
            sk_prefix: None,
        };
        assert!(within(&whole, &ItemKey::new("USER#v", "PROFILE")));
        assert!(!within(&whole, &ItemKey::new("USER#u", "PROFILE")));
    }
}
