//! The ledger of deliveries: which records a source may deliver again
//! after newer records of their items were applied.
//!
//! DynamoDB Streams keeps one item's records in order, so the live path
//! applies each record's images as they come: an image it applies is the
//! newest it has seen of its item. That holds until a source delivers
//! again what it delivered before, cut shorter: Lambda bisects a failed
//! batch and sends its halves alone, or retries from a reported failure;
//! a runner restarted from its checkpoint reads again, in other pages,
//! what its predecessor applied. Applied again from its images, an old
//! follow in such a piece puts back an edge that its unfollow, later in
//! the longer delivery and applied with it, had removed, until the
//! unfollow comes round again.
//!
//! So each delivery records, before anything of it is written, what it
//! holds (a *root* entry): the last sequence number it reached
//! (`through`), the hashes of its records' event ids (`ids`), and, for
//! each item with more than one record in it, the sequence number of the
//! last one (`last`). A Lambda batch keys it by its first record's event
//! id; a runner's page by its shard and the checkpoint it read from. A
//! delivery that finds an entry at its key is a re-delivery: it merges
//! what the earlier ones held with what it holds, stores the merged root
//! and points at it from every record it names (any piece Lambda cuts
//! from it starts at one), and plans each of its records by what the
//! merged root says of its item:
//!
//! - a record at or before the earlier deliveries' `through` whose item
//!   has a later record in the root is superseded: it writes nothing its
//!   images decide (markers, custom projections);
//! - the item's last record in the root is planned *complete*: as the
//!   item its new image shows, whatever the record changed
//!   ([`crate::plan::plan_complete`]), so that what the skipped records
//!   would have written is written from it (a later record that changes
//!   nothing a projection reads plans nothing on its own);
//! - every other record (the only one of its item, or never delivered
//!   before) applies as it is.
//!
//! Index keys are conditioned on the source and recomputes read it, so
//! those write as always. Nothing is compared with the table's state, so
//! an item that went back to an earlier state is never taken for a newer
//! one. The entry is one `PutItem` sent beside the batch's first reads (no
//! round trip on the batch's path); a re-delivery, a rare path, reads and
//! writes more before it writes. Entries of deliveries that completed go
//! an hour later, from a task of their own; those a process leaves behind
//! expire (`expires`, and the table's TTL attribute when the spec names
//! one) and are deleted by the hourly look for expired ones.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeValue as Av, PutRequest, ReturnValuesOnConditionCheckFailure, WriteRequest,
};
use aws_smithy_types::Blob;
use futures::stream::StreamExt;

use super::ctx::Ctx;
use crate::dynamo::names::DELIVERED_PK;
use crate::dynamo::retry::{sdk, with_retries, ErrorClass, WriteError};
use crate::record::{ItemKey, SequenceNumber};

/// How long an entry stays once its delivery completed, unless
/// [`super::ApplyConfig::keep_deliveries`] says otherwise: Lambda may
/// still send a batch again after it succeeded (a lane of a parallelized
/// shard holding the checkpoint back, a restarted event source mapping).
pub(crate) const KEEP_COMPLETED: Duration = Duration::from_secs(3600);

/// How long an entry lives at most: a DynamoDB stream keeps records 24 h.
const EXPIRES_AFTER: Duration = Duration::from_secs(2 * 24 * 3600);

/// How often a process looks for entries that expired, per table.
const EXPIRED_EVERY: Duration = Duration::from_secs(3600);

/// Partitions the ledger's entries spread over, by key.
const PARTITIONS: u64 = 16;

/// A root's stored size beyond which it is stored without its records
/// (an item holds 400 KB): its re-deliveries then apply them as they come.
const MAX_ROOT_BYTES: usize = 300 * 1024;

/// How many pointers a re-delivery follows to its root.
const MAX_HOPS: usize = 4;

/// One record of a delivery, as its entry needs it.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The record's event id.
    pub event_id: String,
    /// Its item, when its keys read.
    pub item: Option<ItemKey>,
    /// Its sequence number.
    pub sequence_number: SequenceNumber,
}

/// Gives a delivery's records, in order (read once, when it is recorded).
pub type Records = Box<dyn Fn() -> Vec<Delivered> + Send + Sync>;

/// What a root entry holds.
#[derive(Debug, Clone, Default, PartialEq)]
struct Root {
    /// The last sequence number any delivery it stands for reached.
    through: Option<SequenceNumber>,
    /// For each item with several records, the last one's.
    last: HashMap<ItemKey, SequenceNumber>,
    /// The hashes of the records' event ids.
    ids: BTreeSet<u64>,
}

/// Each item's records in a delivery: how many, and the last one's.
type Seen = HashMap<ItemKey, (usize, SequenceNumber)>;

fn count(seen: &mut Seen, item: &ItemKey, sequence_number: &SequenceNumber) {
    let entry = seen
        .entry(item.clone())
        .or_insert((0, sequence_number.clone()));
    entry.0 += 1;
    if *sequence_number > entry.1 {
        entry.1 = sequence_number.clone();
    }
}

fn repeated(seen: &Seen) -> HashMap<ItemKey, SequenceNumber> {
    seen.iter()
        .filter(|(_, (n, _))| *n > 1)
        .map(|(item, (_, last))| (item.clone(), last.clone()))
        .collect()
}

impl Root {
    fn of(records: &[Delivered]) -> Root {
        let mut seen = Seen::new();
        for record in records {
            if let Some(item) = &record.item {
                count(&mut seen, item, &record.sequence_number);
            }
        }
        Root {
            through: records.iter().map(|r| r.sequence_number.clone()).max(),
            last: repeated(&seen),
            ids: records
                .iter()
                .filter(|r| !r.event_id.is_empty())
                .map(|r| hash_text(&r.event_id))
                .collect(),
        }
    }

    /// This root and `other`: what both stand for. A delivery starting
    /// where an earlier one did holds all of it that comes after its start
    /// (records are contiguous), so an item with several records in the
    /// two has them in one of them.
    /// Whether the root fits its entry whole: its event ids (how later
    /// pieces find it) and its items' last records.
    fn fits(&self) -> bool {
        self.ids.len() * 8 + encode_last(&self.last).len() <= MAX_ROOT_BYTES
    }

    fn merge(mut self, other: &Root) -> Root {
        for (item, seq) in &other.last {
            let entry = self.last.entry(item.clone()).or_insert_with(|| seq.clone());
            if seq > entry {
                *entry = seq.clone();
            }
        }
        self.ids.extend(other.ids.iter().copied());
        self.through = self.through.max(other.through.clone());
        self
    }
}

/// How a record of a delivery is planned, by what the ledger says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// As it is.
    AsIs,
    /// An earlier delivery held a later record of its item: it writes
    /// nothing its images decide.
    Superseded,
    /// Its item's last record in the earlier deliveries: planned as the
    /// item its new image shows.
    Complete,
}

/// What earlier deliveries starting where this one starts held, merged
/// with what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    /// How far the earlier deliveries reached.
    through: SequenceNumber,
    /// Per item with several records in them and this delivery, the last
    /// one's.
    last: HashMap<ItemKey, SequenceNumber>,
}

impl Earlier {
    /// How the record at `sequence_number` of `item` is planned: one the
    /// earlier deliveries reached, with a later record of its item, is
    /// superseded; the item's last record, wherever it stands, is planned
    /// as its item (what the superseded ones would have written, it
    /// writes); any other applies as it is.
    pub fn treatment(&self, item: &ItemKey, sequence_number: &SequenceNumber) -> Treatment {
        match self.last.get(item) {
            Some(last) if last == sequence_number => Treatment::Complete,
            Some(last) if last > sequence_number && *sequence_number <= self.through => {
                Treatment::Superseded
            }
            _ => Treatment::AsIs,
        }
    }
}

/// One delivery of records by a source: a Lambda batch, or a runner's
/// page. It is recorded once, by the first batch of it the applier writes
/// (a Lambda batch over 1,000 records is applied a chunk at a time), and
/// the answer serves every later chunk of it.
pub struct Delivery {
    /// The entry's key.
    key: String,
    /// The first record's sequence number.
    first: SequenceNumber,
    /// The last sequence number of the delivery.
    through: SequenceNumber,
    /// Its records, read when it is recorded.
    records: Records,
    /// A Lambda batch, or a runner's page.
    kind: Kind,
    /// What earlier deliveries held, if there were any.
    found: tokio::sync::OnceCell<Option<Earlier>>,
    /// The pointers a re-delivery wrote at its records.
    pointers: Mutex<Vec<String>>,
    /// Where the root this delivery planned by lives, when that is not at
    /// its own key (a delivery too large to store its merge): restarts
    /// point there, so no chain of pointers grows.
    anchor: OnceLock<String>,
    /// This delivery's mark on its entry: an answer lost after the write
    /// lands, and the write sent again finds its own mark, not an earlier
    /// delivery's.
    nonce: String,
}

/// Where a delivery comes from.
enum Kind {
    /// A Lambda batch: it points at its root from each of its records
    /// (Lambda may cut a re-delivery anywhere).
    Batch,
    /// A runner's page, read after the checkpoint `from`: the runner keeps
    /// what its shard's pages held since that checkpoint in `ledger`.
    Page {
        ledger: std::sync::Arc<Mutex<ShardLedger>>,
        from: Option<SequenceNumber>,
    },
}

/// What a runner keeps of one shard in the ledger: what its pages held
/// since its durable checkpoint `base`, merged, as the shard's entry
/// holds it.
#[derive(Debug, Clone, Default)]
pub struct ShardLedger {
    shard_id: String,
    /// The checkpoint the pages counted were read after.
    base: Option<SequenceNumber>,
    /// How far they reached.
    through: Option<SequenceNumber>,
    /// Each item's records in them: how many, and the last one's.
    seen: Seen,
    /// What a runner before this one read past the same checkpoint.
    loaded: HashMap<ItemKey, SequenceNumber>,
}

impl ShardLedger {
    /// The checkpoint is now `from`: what came before it is not read
    /// again, what was read past it still may be.
    fn moved_to(&mut self, from: Option<&SequenceNumber>) {
        if self.base.as_ref() == from {
            return;
        }
        self.base = from.cloned();
        let Some(from) = from else { return };
        if self.through.as_ref().is_none_or(|through| through <= from) {
            self.through = None;
            self.seen.clear();
            self.loaded.clear();
        } else {
            self.seen.retain(|_, (_, last)| &*last > from);
            self.loaded.retain(|_, last| &*last > from);
        }
    }

    /// What the shard's entry holds.
    fn root(&self) -> Root {
        let mut last = repeated(&self.seen);
        for (item, seq) in &self.loaded {
            let entry = last.entry(item.clone()).or_insert_with(|| seq.clone());
            if seq > entry {
                *entry = seq.clone();
            }
        }
        Root {
            through: self.through.clone(),
            last,
            ids: BTreeSet::new(),
        }
    }
}

/// What the shard's entry says when a runner starts reading it.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardStart {
    /// Nothing was read past the checkpoint.
    Fresh,
    /// A runner read past the checkpoint (up to this sequence number)
    /// before it stopped: what it held is known, and a page read again
    /// writes nothing older than what it applied.
    Continue(SequenceNumber),
    /// The checkpoint is behind where the shard was already read and
    /// checkpointed (up to this sequence number: the checkpoints were
    /// deleted, or another consumer's were taken): what was applied
    /// between is not known, and records read again apply their items as
    /// they are now until the shard is caught up, as a replay does.
    Behind(SequenceNumber),
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("key", &self.key)
            .field("through", &self.through)
            .field("found", &self.found)
            .finish()
    }
}

impl Delivery {
    /// A Lambda batch from the record with event id `first_id` (sequence
    /// number `first`) to sequence number `through`; `records` gives its
    /// records when it is recorded. `None` when there is no event id to
    /// key it by.
    pub fn new(
        first_id: &str,
        first: SequenceNumber,
        through: SequenceNumber,
        records: Records,
    ) -> Option<Delivery> {
        if first_id.is_empty() {
            return None;
        }
        Some(Delivery::keyed(
            id_key(hash_text(first_id)),
            first,
            through,
            records,
            Kind::Batch,
        ))
    }

    /// A page a runner read from a shard after its checkpoint `from`
    /// (`None`: from the shard's start), from sequence number `first` to
    /// `through`; `ledger` is what the runner keeps of the shard
    /// ([`super::Applier::shard_ledger`]). The shard's entry holds what
    /// every page read since the checkpoint held: a runner restarted there
    /// finds it, however its pages were cut.
    pub fn page(
        ledger: std::sync::Arc<Mutex<ShardLedger>>,
        from: Option<&SequenceNumber>,
        first: SequenceNumber,
        through: SequenceNumber,
        records: Records,
    ) -> Delivery {
        let key = shard_key(&ledger.lock().expect("not poisoned").shard_id);
        Delivery::keyed(
            key,
            first,
            through,
            records,
            Kind::Page {
                ledger,
                from: from.cloned(),
            },
        )
    }

    fn keyed(
        key: String,
        first: SequenceNumber,
        through: SequenceNumber,
        records: Records,
        kind: Kind,
    ) -> Delivery {
        Delivery {
            key,
            first,
            through,
            records,
            kind,
            found: tokio::sync::OnceCell::new(),
            pointers: Mutex::new(Vec::new()),
            anchor: OnceLock::new(),
            nonce: nonce(),
        }
    }

    /// The last sequence number of the delivery.
    pub fn through(&self) -> &SequenceNumber {
        &self.through
    }

    /// Whether the delivery is in the ledger (it had writes images decide).
    pub fn recorded(&self) -> bool {
        self.found.get().is_some()
    }

    /// Records this delivery, once, and returns what earlier deliveries
    /// that reached into it held, merged with it; `None` when none did.
    /// An error leaves it unrecorded (the caller fails the batch, to be
    /// delivered again).
    pub(crate) async fn record(&self, ctx: &Ctx<'_>) -> Result<Option<Earlier>, String> {
        self.found
            .get_or_try_init(|| async {
                let records = (self.records)();
                if let Kind::Page { ledger, from } = &self.kind {
                    return self.record_page(ctx, ledger, from.as_ref(), &records).await;
                }
                let own = Root::of(&records);
                let Some(held) = create(ctx, &self.key, &own, &self.nonce).await? else {
                    return Ok(None);
                };
                // A root gone (expired, or swept too soon) takes what it
                // held with it: this delivery's own records count as
                // delivered before, superseded by their items' later ones
                // in it.
                let (earlier, known, root_at) = match resolve(ctx, &self.key, held).await? {
                    Some((root, at)) => (root, true, Some(at)),
                    None => (Root::default(), false, None),
                };
                let reached = match &earlier.through {
                    Some(through) if known => through.clone(),
                    _ => self.through.clone(),
                };
                let held_last = earlier.last.clone();
                let merged = earlier.merge(&own);
                if !merged.fits() {
                    // Stored without its event ids, the merge could not be
                    // found from a later piece, which would apply an item's
                    // last record as it is after this one skipped the
                    // records before it. The entry stays as it was, and
                    // this delivery skips only what it says: the pieces
                    // find that too.
                    metrics::counter!("projector_deliveries_too_large_total").increment(1);
                    if let Some(at) = root_at.filter(|at| *at != self.key) {
                        let _ = self.anchor.set(at);
                    }
                    tracing::warn!(
                        delivery = %self.key,
                        records = records.len(),
                        "a delivery too large for its entry in the ledger of deliveries: its records are planned by what earlier deliveries held alone"
                    );
                    return Ok(Some(Earlier {
                        through: reached,
                        last: if known { held_last } else { HashMap::new() },
                    }));
                }
                store(ctx, &self.key, &merged, &self.nonce).await?;
                let pointers = point(ctx, &self.key, &merged, &self.nonce).await?;
                *self.pointers.lock().expect("not poisoned") = pointers;
                metrics::counter!("projector_redeliveries_total").increment(1);
                tracing::info!(
                    delivery = %self.key,
                    delivered_through = reached.as_str(),
                    known,
                    "records delivered again: those an earlier delivery held with a later record of their item write no marker, and their item's last record is planned as the item"
                );
                Ok(Some(Earlier {
                    through: reached,
                    last: merged.last,
                }))
            })
            .await
            .cloned()
    }

    /// A runner's page: counted into what the shard's pages read since the
    /// checkpoint, stored as the shard's entry. A page reaching into what
    /// was read before is planned by it.
    async fn record_page(
        &self,
        ctx: &Ctx<'_>,
        ledger: &Mutex<ShardLedger>,
        from: Option<&SequenceNumber>,
        records: &[Delivered],
    ) -> Result<Option<Earlier>, String> {
        let (reached, stored) = {
            let mut ledger = ledger.lock().expect("not poisoned");
            ledger.moved_to(from);
            let reached = ledger.through.clone();
            for record in records {
                if let Some(item) = &record.item {
                    count(&mut ledger.seen, item, &record.sequence_number);
                }
            }
            ledger.through = ledger.through.clone().max(Some(self.through.clone()));
            (reached, ledger.root())
        };
        let mut fields = root_fields(&stored);
        fields.push((
            "base",
            Av::S(from.map_or_else(|| "start".to_string(), SequenceNumber::padded)),
        ));
        store_fields(ctx, &self.key, fields).await?;
        let Some(reached) = reached.filter(|reached| *reached >= self.first) else {
            return Ok(None);
        };
        metrics::counter!("projector_redeliveries_total").increment(1);
        tracing::info!(
            delivery = %self.key,
            delivered_through = reached.as_str(),
            "records read again past the checkpoint: those read before with a later record of their item write no marker, and their item's last record is planned as the item"
        );
        Ok(Some(Earlier {
            through: reached,
            last: stored.last,
        }))
    }

    /// The delivery completed: its entry may go once the source can no
    /// longer deliver it again (a runner's page: its shard's entry stays,
    /// replaced by the next page's).
    fn completed(&self, ctx: &Ctx<'_>) {
        if self.found.get().is_none() || matches!(self.kind, Kind::Page { .. }) {
            return;
        }
        let due = Instant::now() + ctx.config.keep_deliveries;
        let pointers = std::mem::take(&mut *self.pointers.lock().expect("not poisoned"));
        completed_list()
            .lock()
            .expect("not poisoned")
            .entry(ctx.table.to_string())
            .or_default()
            .extend(std::iter::once(self.key.clone()).chain(pointers).map(|at| {
                (
                    Due {
                        key: entry_key(ctx, &at),
                        unless: Unless::Rewritten(self.nonce.clone()),
                    },
                    due,
                )
            }));
    }
}

impl super::Applier {
    /// Records that Lambda will deliver again, from the record `event_id`,
    /// what `delivery` reached: it restarts at the first record an
    /// invocation reports failed, and the records after it that did apply
    /// come again.
    ///
    /// A restart at the delivery's own first record finds its entry where
    /// it is: a pointer written there would take the place of the root,
    /// pointing at itself, and the delivery after it would find nothing
    /// held before.
    pub async fn delivery_restarts_at(
        &self,
        delivery: &Delivery,
        event_id: &str,
    ) -> Result<(), String> {
        let at = id_key(hash_text(event_id));
        let root = delivery.anchor.get().unwrap_or(&delivery.key);
        if at == *root {
            return Ok(());
        }
        let ctx = self.ctx();
        put_pointer(&ctx, &at, root, &delivery.nonce).await
    }

    /// `delivery` was applied whole: its entry goes once the source can no
    /// longer deliver it again.
    pub fn delivery_completed(&self, delivery: &Delivery) {
        delivery.completed(&self.ctx());
    }

    /// What a runner starting to read shard `shard_id` from its checkpoint
    /// `from` keeps of the shard in the ledger, and what the shard's entry
    /// says of what was read past the checkpoint before.
    pub async fn shard_ledger(
        &self,
        shard_id: &str,
        from: Option<&SequenceNumber>,
    ) -> Result<(ShardLedger, ShardStart), String> {
        let ctx = self.ctx();
        let mut ledger = ShardLedger {
            shard_id: shard_id.to_string(),
            base: from.cloned(),
            ..ShardLedger::default()
        };
        let key = entry_key(&ctx, &shard_key(shard_id));
        ctx.count(|r| &mut r.deliveries);
        let retries = std::sync::atomic::AtomicU64::new(0);
        let item = with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
            let request = ctx
                .client
                .get_item()
                .table_name(ctx.table)
                .set_key(Some(key.clone()))
                .consistent_read(true);
            async move { request.send().await.map_err(sdk) }
        })
        .await
        .map_err(failed)?
        .item;
        let Some(item) = item else {
            return Ok((ledger, ShardStart::Fresh));
        };
        let base = match item.get("base") {
            Some(Av::S(base)) if base != "start" => Some(SequenceNumber(base.clone())),
            _ => None,
        };
        let Some(Held::Root(root)) = held(&item) else {
            return Ok((ledger, ShardStart::Fresh));
        };
        let Some(through) = root.through.clone() else {
            return Ok((ledger, ShardStart::Fresh));
        };
        let start = match (base.as_ref(), from) {
            (b, f) if b == f => {
                ledger.through = Some(through.clone());
                ledger.loaded = root.last;
                ShardStart::Continue(through)
            }
            (Some(_), None) => ShardStart::Behind(through),
            (Some(b), Some(f)) if b > f => ShardStart::Behind(through),
            _ => ShardStart::Fresh,
        };
        Ok((ledger, start))
    }
}

/// The key of a shard's entry.
fn shard_key(shard_id: &str) -> String {
    format!("shard#{shard_id}")
}

/// The key of the entry a record with event id hash `hash` points from.
fn id_key(hash: u64) -> String {
    format!("id#{hash:016x}")
}

/// FNV-1a, 64 bits.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

fn hash_text(text: &str) -> u64 {
    fnv(&[text.as_bytes()])
}

/// `last` as stored: per item, its partition key, a flag and its sort
/// key, and the sequence number's digits, each with its length.
fn encode_last(last: &HashMap<ItemKey, SequenceNumber>) -> Vec<u8> {
    let mut out = Vec::with_capacity(last.len() * 64);
    let mut put = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    for (item, seq) in last {
        put(item.pk.as_bytes());
        match &item.sk {
            Some(sk) => {
                put(b"1");
                put(sk.as_bytes());
            }
            None => put(b"0"),
        }
        put(seq.as_str().trim_start_matches('0').as_bytes());
    }
    out
}

fn decode_last(bytes: &[u8]) -> HashMap<ItemKey, SequenceNumber> {
    let mut out = HashMap::new();
    let mut at = 0;
    let mut take = || -> Option<String> {
        let len = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        let text = String::from_utf8_lossy(bytes.get(at + 4..at + 4 + len)?).into_owned();
        at += 4 + len;
        Some(text)
    };
    while let Some(pk) = take() {
        let Some(flag) = take() else { break };
        let sk = if flag == "1" {
            match take() {
                Some(sk) => Some(sk),
                None => break,
            }
        } else {
            None
        };
        let Some(seq) = take() else { break };
        out.insert(ItemKey { pk, sk }, SequenceNumber(seq));
    }
    out
}

fn encode_ids(ids: &BTreeSet<u64>) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_be_bytes()).collect()
}

fn decode_ids(bytes: &[u8]) -> BTreeSet<u64> {
    bytes
        .chunks_exact(8)
        .map(|chunk| u64::from_be_bytes(chunk.try_into().expect("8 bytes")))
        .collect()
}

/// Entries of completed deliveries, by table, and when they fall due.
type Completed = HashMap<String, Vec<(Due, Instant)>>;

/// An entry to delete, and what keeps it.
#[derive(Debug, Clone)]
struct Due {
    key: HashMap<String, Av>,
    unless: Unless,
}

/// What makes the sweep leave an entry it found due.
#[derive(Debug, Clone)]
enum Unless {
    /// Another delivery wrote it since this one (its mark is no longer
    /// this one's): Lambda sent the records again after the delivery
    /// completed, and that delivery's pieces still need it.
    Rewritten(String),
    /// It was written again since it was found expired (at this second).
    Renewed(u64),
}

fn completed_list() -> &'static Mutex<Completed> {
    static LIST: OnceLock<Mutex<Completed>> = OnceLock::new();
    LIST.get_or_init(Default::default)
}

/// Starts deleting, off the batch's path, the entries of this table's
/// deliveries that completed an hour ago and, once an hour, those that
/// expired (best effort: what is left is found next time, or by the
/// table's TTL).
pub(crate) fn sweep(ctx: &Ctx<'_>) {
    let mut due = completed_due(ctx);
    let look = expired_due(ctx);
    if due.is_empty() && !look {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let client = ctx.client.clone();
    let table = ctx.table.to_string();
    let spec_table = ctx.spec.table.clone();
    let pks: Vec<String> = (0..PARTITIONS)
        .map(|n| partition(ctx.config.consumer.as_deref(), n))
        .collect();
    runtime.spawn(async move {
        if look {
            due.extend(expired(&client, &table, &spec_table, &pks).await);
        }
        delete_entries(&client, &table, due).await;
    });
}

/// Whether this process should look for expired entries of the table now.
fn expired_due(ctx: &Ctx<'_>) -> bool {
    static LAST: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    let mut last = LAST
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned");
    match last.get(ctx.table) {
        Some(at) if at.elapsed() < EXPIRED_EVERY => false,
        _ => {
            last.insert(ctx.table.to_string(), Instant::now());
            true
        }
    }
}

/// The keys of expired entries of the table, a page of each partition at
/// most (the rest are found next time). The partitions are read at once:
/// one round trip, not one per partition.
async fn expired(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &crate::spec::TableSpec,
    pks: &[String],
) -> Vec<Due> {
    let Some(sk) = &spec.sort_key else {
        // Entries are partitions of their own: the TTL attribute, or
        // `expires`, is all there is.
        return Vec::new();
    };
    let now = crate::dynamo::time::now_ms() / 1000;
    let pages = futures::future::join_all(pks.iter().map(|pk| {
        client
            .query()
            .table_name(table)
            .key_condition_expression("#pk = :pk")
            .filter_expression("#e < :now")
            .expression_attribute_names("#pk", &spec.partition_key)
            .expression_attribute_names("#e", "expires")
            .expression_attribute_names("#sk", sk)
            .expression_attribute_values(":pk", Av::S(pk.clone()))
            .expression_attribute_values(":now", Av::N(now.to_string()))
            .projection_expression("#pk, #sk")
            .send()
    }))
    .await;
    let mut found = Vec::new();
    for page in pages {
        match page {
            Ok(page) => found.extend(page.items().iter().map(|key| Due {
                key: key.clone(),
                unless: Unless::Renewed(now),
            })),
            Err(error) => {
                tracing::debug!(error = %crate::dynamo::retry::describe(&error), "looking for expired entries of the ledger of deliveries failed");
            }
        }
    }
    found
}

/// The entries of completed deliveries whose time has come.
fn completed_due(ctx: &Ctx<'_>) -> Vec<Due> {
    let mut list = completed_list().lock().expect("not poisoned");
    let Some(entries) = list.get_mut(ctx.table) else {
        return Vec::new();
    };
    let (due, keep): (Vec<_>, Vec<_>) = entries
        .drain(..)
        .partition(|(_, due)| *due <= Instant::now());
    *entries = keep;
    due.into_iter().map(|(key, _)| key).collect()
}

/// Deletes entries, best effort, each on condition that it is still as
/// it was when it fell due: a delivery's entries are the ones it wrote
/// (its mark), an expired one was not written again since it was found.
/// A delete per entry, as a batch of deletes takes no condition; the
/// sweep is off every batch's path.
async fn delete_entries(client: &aws_sdk_dynamodb::Client, table: &str, due: Vec<Due>) {
    let deletes = due.into_iter().map(|due| {
        let request = client
            .delete_item()
            .table_name(table)
            .set_key(Some(due.key));
        let request = match due.unless {
            Unless::Rewritten(by) => request
                .condition_expression("#by = :by")
                .expression_attribute_names("#by", "by")
                .expression_attribute_values(":by", Av::S(by)),
            Unless::Renewed(now) => request
                .condition_expression("#e < :now")
                .expression_attribute_names("#e", "expires")
                .expression_attribute_values(":now", Av::N(now.to_string())),
        };
        async move {
            if let Err(error) = request.send().await {
                if !matches!(sdk(error).0, ErrorClass::Conditional) {
                    return 1u64;
                }
            }
            0
        }
    });
    let failed: u64 = futures::stream::iter(deletes)
        .buffer_unordered(8)
        .collect::<Vec<u64>>()
        .await
        .into_iter()
        .sum();
    if failed > 0 {
        tracing::debug!(
            failed,
            "deleting entries of the ledger of deliveries failed; they expire"
        );
    }
}

/// A mark no other delivery's write carries.
/// Lambda's sandboxes often share a process id, so the process's random
/// hash keys (`RandomState`) tell them apart.
fn nonce() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PROCESS: OnceLock<u64> = OnceLock::new();
    let process =
        *PROCESS.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u8));
    format!(
        "{}-{process:016x}-{}-{}",
        std::process::id(),
        crate::dynamo::time::now_ms(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The ledger's partition `n` (of [`PARTITIONS`]), for a consumer.
fn partition(consumer: Option<&str>, n: u64) -> String {
    match consumer {
        Some(name) => format!("{DELIVERED_PK}@{name}#{n:x}"),
        None => format!("{DELIVERED_PK}#{n:x}"),
    }
}

/// The key of the entry at `at`.
fn entry_key(ctx: &Ctx<'_>, at: &str) -> HashMap<String, Av> {
    let table = &ctx.spec.table;
    let pk = partition(ctx.config.consumer.as_deref(), hash_text(at) % PARTITIONS);
    let mut key = HashMap::new();
    match &table.sort_key {
        Some(sk) => {
            key.insert(table.partition_key.clone(), Av::S(pk));
            key.insert(sk.clone(), Av::S(at.to_string()));
        }
        None => {
            key.insert(table.partition_key.clone(), Av::S(format!("{pk}#{at}")));
        }
    }
    key
}

/// An entry's item: its key, when it expires (and the table's TTL
/// attribute, unless that names one of the entry's own), and `fields`.
fn entry_item(ctx: &Ctx<'_>, at: &str, fields: Vec<(&str, Av)>) -> HashMap<String, Av> {
    let mut item = entry_key(ctx, at);
    let expires = (crate::dynamo::time::now_ms() / 1000) + EXPIRES_AFTER.as_secs();
    item.insert("expires".to_string(), Av::N(expires.to_string()));
    for (name, value) in fields {
        item.insert(name.to_string(), value);
    }
    if let Some(ttl) = &ctx.spec.table.ttl_attribute {
        if !item.contains_key(ttl) {
            item.insert(ttl.clone(), Av::N(expires.to_string()));
        }
    }
    item
}

/// What an entry holds, as read.
enum Held {
    Root(Root),
    Pointer(String),
}

/// What a Lambda delivery's entry holds. A root an earlier build stored
/// without its event ids (too large) but with its items' last records is
/// read without them: its pieces other than the first cannot find it, so
/// nothing may be skipped by it.
fn delivery_held(item: &HashMap<String, Av>) -> Option<Held> {
    match held(item)? {
        Held::Root(mut root) if !item.contains_key("ids") => {
            root.last.clear();
            Some(Held::Root(root))
        }
        other => Some(other),
    }
}

fn held(item: &HashMap<String, Av>) -> Option<Held> {
    if let Some(Av::S(root)) = item.get("root") {
        return Some(Held::Pointer(root.clone()));
    }
    let through = match item.get("through") {
        Some(Av::S(through)) => Some(SequenceNumber(through.clone())),
        _ => return None,
    };
    Some(Held::Root(Root {
        through,
        last: match item.get("last") {
            Some(Av::B(bytes)) => decode_last(bytes.as_ref()),
            _ => HashMap::new(),
        },
        ids: match item.get("ids") {
            Some(Av::B(bytes)) => decode_ids(bytes.as_ref()),
            _ => BTreeSet::new(),
        },
    }))
}

fn root_fields(root: &Root) -> Vec<(&'static str, Av)> {
    let mut fields = vec![(
        "through",
        Av::S(
            root.through
                .as_ref()
                .map_or_else(String::new, SequenceNumber::padded),
        ),
    )];
    // A Lambda delivery's root holds both or neither: the items' last
    // records without the ids would let a piece found from the first
    // record skip records whose item's last one is in a piece that finds
    // nothing. A runner's shard entry holds no ids (its pages find it by
    // the shard).
    if root.ids.is_empty() || root.fits() {
        fields.push(("last", Av::B(Blob::new(encode_last(&root.last)))));
    }
    if root.ids.is_empty() {
        return fields;
    }
    if root.fits() {
        fields.push(("ids", Av::B(Blob::new(encode_ids(&root.ids)))));
    } else {
        tracing::warn!(
            records = root.ids.len(),
            "a delivery too large for its entry in the ledger of deliveries: stored without its records, its re-deliveries apply them as they come"
        );
    }
    fields
}

fn failed(error: WriteError) -> String {
    match error {
        WriteError::Transient(message) | WriteError::Poison(message) => {
            format!("the ledger of deliveries: {message}")
        }
        WriteError::Fatal(message) => message,
    }
}

/// Creates the root entry at `at` unless one is there; returns what was
/// there (`None` also when it is this delivery's own, written before an
/// answer was lost).
async fn create(ctx: &Ctx<'_>, at: &str, own: &Root, nonce: &str) -> Result<Option<Held>, String> {
    let mut fields = root_fields(own);
    fields.push(("by", Av::S(nonce.to_string())));
    let item = entry_item(ctx, at, fields);
    let pk = ctx.spec.table.partition_key.clone();
    ctx.count(|r| &mut r.deliveries);
    let retries = std::sync::atomic::AtomicU64::new(0);
    let result = with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
        let request = ctx
            .client
            .put_item()
            .table_name(ctx.table)
            .set_item(Some(item.clone()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", &pk)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        async move {
            match request.send().await {
                Ok(_) => Ok(None),
                Err(error) => {
                    use aws_sdk_dynamodb::operation::put_item::PutItemError;
                    let returned = match error.as_service_error() {
                        Some(PutItemError::ConditionalCheckFailedException(c)) => c.item().cloned(),
                        _ => None,
                    };
                    let (class, text) = sdk(error);
                    match (class, returned) {
                        (ErrorClass::Conditional, Some(old)) => Ok(Some(old)),
                        (class, _) => Err((class, text)),
                    }
                }
            }
        }
    })
    .await;
    ctx.retries.fetch_add(
        retries.load(std::sync::atomic::Ordering::Relaxed),
        std::sync::atomic::Ordering::Relaxed,
    );
    let Some(old) = result.map_err(failed)? else {
        return Ok(None);
    };
    if matches!(old.get("by"), Some(Av::S(by)) if by == nonce) {
        return Ok(None);
    }
    Ok(delivery_held(&old))
}

/// The root `held` (found at `at`) stands for, following pointers, and
/// the key it lives at; `None` when it is gone (or more than
/// [`MAX_HOPS`] pointers away).
async fn resolve(
    ctx: &Ctx<'_>,
    at: &str,
    mut held: Held,
) -> Result<Option<(Root, String)>, String> {
    let mut at = at.to_string();
    for hop in 0..=MAX_HOPS {
        match held {
            Held::Root(root) => return Ok(Some((root, at))),
            Held::Pointer(_) if hop == MAX_HOPS => break,
            Held::Pointer(next) => match read(ctx, &next).await? {
                Some(found) => {
                    held = found;
                    at = next;
                }
                None => return Ok(None),
            },
        }
    }
    Ok(None)
}

/// The entry at `at`, read consistently.
async fn read(ctx: &Ctx<'_>, at: &str) -> Result<Option<Held>, String> {
    let key = entry_key(ctx, at);
    ctx.count(|r| &mut r.deliveries);
    let retries = std::sync::atomic::AtomicU64::new(0);
    let item = with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
        let request = ctx
            .client
            .get_item()
            .table_name(ctx.table)
            .set_key(Some(key.clone()))
            .consistent_read(true);
        async move { request.send().await.map_err(sdk) }
    })
    .await
    .map_err(failed)?
    .item;
    Ok(item.as_ref().and_then(delivery_held))
}

/// Stores `root` at `at`, whatever was there (it holds all of that).
async fn store(ctx: &Ctx<'_>, at: &str, root: &Root, by: &str) -> Result<(), String> {
    let mut fields = root_fields(root);
    fields.push(("by", Av::S(by.to_string())));
    store_fields(ctx, at, fields).await
}

/// Stores an entry of `fields` at `at`, whatever was there.
async fn store_fields(ctx: &Ctx<'_>, at: &str, fields: Vec<(&str, Av)>) -> Result<(), String> {
    let item = entry_item(ctx, at, fields);
    ctx.count(|r| &mut r.deliveries);
    let retries = std::sync::atomic::AtomicU64::new(0);
    with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
        let request = ctx
            .client
            .put_item()
            .table_name(ctx.table)
            .set_item(Some(item.clone()));
        async move { request.send().await.map(|_| ()).map_err(sdk) }
    })
    .await
    .map_err(failed)
}

/// A pointer from `at` to the root at `root`.
async fn put_pointer(ctx: &Ctx<'_>, at: &str, root: &str, by: &str) -> Result<(), String> {
    let item = entry_item(
        ctx,
        at,
        vec![
            ("root", Av::S(root.to_string())),
            ("by", Av::S(by.to_string())),
        ],
    );
    ctx.count(|r| &mut r.deliveries);
    let retries = std::sync::atomic::AtomicU64::new(0);
    with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
        let request = ctx
            .client
            .put_item()
            .table_name(ctx.table)
            .set_item(Some(item.clone()));
        async move { request.send().await.map(|_| ()).map_err(sdk) }
    })
    .await
    .map_err(failed)
}

/// Points at the root at `at` from every record it names but its own
/// first, 25 to a `BatchWriteItem`, as many in flight as the applier's
/// concurrency allows.
async fn point(ctx: &Ctx<'_>, at: &str, root: &Root, by: &str) -> Result<Vec<String>, String> {
    let keys: Vec<String> = root
        .ids
        .iter()
        .map(|hash| id_key(*hash))
        .filter(|key| key != at)
        .collect();
    let pointers: Vec<WriteRequest> = keys
        .iter()
        .map(|key| {
            let item = entry_item(
                ctx,
                key,
                vec![
                    ("root", Av::S(at.to_string())),
                    ("by", Av::S(by.to_string())),
                ],
            );
            WriteRequest::builder()
                .put_request(
                    PutRequest::builder()
                        .set_item(Some(item))
                        .build()
                        .expect("item is set"),
                )
                .build()
        })
        .collect();
    let requests: Vec<Vec<WriteRequest>> = pointers.chunks(25).map(<[_]>::to_vec).collect();
    let writes = requests.into_iter().map(|chunk| async move {
        super::writes::batch_write(ctx, chunk)
            .await
            .into_iter()
            .collect::<Result<(), WriteError>>()
    });
    let results: Vec<Result<(), WriteError>> = futures::stream::iter(writes)
        .buffer_unordered(ctx.config.concurrency.max(1))
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<(), _>>()
        .map_err(failed)?;
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: u64) -> SequenceNumber {
        SequenceNumber(format!("{n:021}"))
    }

    fn delivered(item: &str, n: u64) -> Delivered {
        Delivered {
            event_id: format!("e{n}"),
            item: Some(ItemKey::new(item, "X")),
            sequence_number: seq(n),
        }
    }

    fn key(item: &str) -> ItemKey {
        ItemKey::new(item, "X")
    }

    #[test]
    fn only_items_with_several_records_are_kept_with_their_last() {
        let records = [
            delivered("a", 1),
            delivered("b", 2),
            delivered("a", 3),
            delivered("c", 4),
            delivered("a", 5),
        ];
        let root = Root::of(&records);
        assert_eq!(root.last.len(), 1);
        assert_eq!(root.last[&key("a")], seq(5));
        assert_eq!(root.through, Some(seq(5)));
        assert_eq!(root.ids.len(), 5);
        assert_eq!(decode_last(&encode_last(&root.last)), root.last);
        assert_eq!(decode_ids(&encode_ids(&root.ids)), root.ids);
        let mut no_sort_key = HashMap::new();
        no_sort_key.insert(
            ItemKey {
                pk: "P".into(),
                sk: None,
            },
            seq(7),
        );
        assert_eq!(decode_last(&encode_last(&no_sort_key)), no_sort_key);
    }

    #[test]
    fn superseded_records_skip_and_each_items_last_is_planned_as_the_item() {
        // Delivered before: a1 b2 a3; now again, with a later a6.
        let earlier = Earlier {
            through: seq(3),
            last: Root::of(&[
                delivered("a", 1),
                delivered("b", 2),
                delivered("a", 3),
                delivered("a", 6),
            ])
            .last,
        };
        assert_eq!(earlier.treatment(&key("a"), &seq(1)), Treatment::Superseded);
        assert_eq!(earlier.treatment(&key("a"), &seq(3)), Treatment::Superseded);
        assert_eq!(
            earlier.treatment(&key("a"), &seq(6)),
            Treatment::Complete,
            "the item's last, past what was delivered before, writes what a1 and a3 would have"
        );
        assert_eq!(earlier.treatment(&key("b"), &seq(2)), Treatment::AsIs);
        assert_eq!(earlier.treatment(&key("c"), &seq(9)), Treatment::AsIs);
    }

    #[test]
    fn a_merged_root_holds_both_deliveries() {
        let first = Root::of(&[delivered("a", 1), delivered("a", 3), delivered("b", 4)]);
        let longer = Root::of(&[delivered("a", 3), delivered("b", 4), delivered("b", 9)]);
        let merged = first.clone().merge(&longer);
        assert_eq!(merged.through, Some(seq(9)));
        assert_eq!(merged.last[&key("a")], seq(3));
        assert_eq!(merged.last[&key("b")], seq(9));
        assert_eq!(merged.ids.len(), 4);
        assert_eq!(longer.merge(&first), merged);
    }

    #[test]
    fn a_shard_ledger_counts_an_items_records_across_pages_until_the_checkpoint_passes_them() {
        let mut ledger = ShardLedger::default();
        for (item, n) in [("a", 1), ("b", 2)] {
            count(&mut ledger.seen, &key(item), &seq(n));
        }
        ledger.through = Some(seq(2));
        // The next page, the checkpoint's save having failed.
        count(&mut ledger.seen, &key("a"), &seq(3));
        ledger.through = Some(seq(3));
        assert_eq!(ledger.root().last[&key("a")], seq(3), "a once in each page");
        // The checkpoint moves to 2: a's last record is still ahead.
        ledger.moved_to(Some(&seq(2)));
        assert_eq!(ledger.root().last[&key("a")], seq(3));
        assert!(!ledger.seen.contains_key(&key("b")));
        // Past everything read: nothing is kept.
        ledger.moved_to(Some(&seq(3)));
        assert!(ledger.root().last.is_empty());
        assert_eq!(ledger.through, None);
    }

    #[test]
    fn a_root_too_large_for_its_entry_is_stored_with_neither_ids_nor_last() {
        let item = |k: usize| ItemKey {
            pk: format!("USER#{}", "a".repeat(480)),
            sk: Some(format!("FOLLOWS#{}{k:03}", "b".repeat(480))),
        };
        let root = |n: usize, ids: bool| Root {
            through: Some(seq(2 * n as u64)),
            last: (0..n).map(|k| (item(k), seq((n + k) as u64))).collect(),
            ids: if ids {
                (0..2 * n as u64).collect()
            } else {
                BTreeSet::new()
            },
        };
        let names = |root: &Root| -> Vec<&str> {
            root_fields(root)
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        assert_eq!(names(&root(100, true)), ["through", "last", "ids"]);
        assert!(!root(320, true).fits());
        assert_eq!(names(&root(320, true)), ["through"]);
        // A runner's shard entry holds no ids: its last records stay.
        assert_eq!(names(&root(320, false)), ["through", "last"]);
    }

    #[test]
    fn a_root_an_earlier_build_stored_without_its_ids_skips_nothing() {
        let root = Root {
            through: Some(seq(9)),
            last: [(
                ItemKey {
                    pk: "USER#a".into(),
                    sk: Some("FOLLOWS#b".into()),
                },
                seq(7),
            )]
            .into_iter()
            .collect(),
            ids: [1, 2].into_iter().collect(),
        };
        let mut item: HashMap<String, Av> = root_fields(&root)
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect();
        let last = |item: &HashMap<String, Av>| match delivery_held(item) {
            Some(Held::Root(root)) => root.last.len(),
            _ => panic!("a root"),
        };
        assert_eq!(last(&item), 1);
        item.remove("ids");
        assert_eq!(last(&item), 0);
    }
}
