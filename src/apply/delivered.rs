//! The ledger of deliveries: which records a source may deliver again
//! after newer records of their items were applied.
//!
//! DynamoDB Streams keeps one item's records in order, so the live path
//! applies each record's images as they come: an image it applies is the
//! newest it has seen of its item. That holds until a source delivers
//! again what it delivered before, cut shorter: Lambda bisects a failed
//! batch and sends its first half alone, or retries from a reported
//! failure; a runner restarted from its checkpoint reads again, in other
//! pages, what its predecessor applied. Applied again from its images, an
//! old follow in such a piece puts back an edge that its unfollow, later
//! in the longer delivery and applied with it, had removed, until the
//! unfollow comes round again.
//!
//! So each delivery records, before anything of it is written, what it
//! holds: an entry keyed by its first record's event id (a runner's page:
//! by its shard), with the last sequence number it reached (`through`)
//! and, for each item with more than one record in it, the sequence number
//! of the item's last record (`last`). A delivery that finds an entry from
//! an earlier one knows which of its records that one may have applied
//! together with newer records of the same item: a record at or before
//! `through` whose item's `last` is later is superseded, and writes
//! nothing its images decide (markers, custom projections; index keys are
//! conditioned on the source and recomputes read it, so those write as
//! they always do). Every other record applies as it is: it is the newest
//! of its item that was ever delivered. Nothing is compared with the
//! table's state, so an item that went back to an earlier state (a follow,
//! an unfollow, the same follow again) is never taken for the newer one.
//!
//! Lambda may cut a re-delivery anywhere again, so a re-delivery records
//! at each of its records an entry pointing at the one it found; and an
//! invocation that reports a failure records one at the record Lambda
//! restarts from. A runner's pages start at its checkpoint, so its shard's
//! entry, replaced by each page that reaches further, covers what it read
//! past the checkpoint.
//!
//! The entry is one `UpdateItem` sent beside the batch's first reads (no
//! round trip on the batch's path), only for batches with writes images
//! decide. Entries of deliveries that completed are deleted a while later,
//! beside a later batch's first reads; the few a recycled process leaves
//! expire (`expires`, and the table's TTL attribute when the spec names
//! one).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeValue as Av, DeleteRequest, ReturnValue, ReturnValuesOnConditionCheckFailure,
    WriteRequest,
};
use aws_smithy_types::Blob;
use futures::stream::StreamExt;

use super::ctx::Ctx;
use crate::dynamo::names::DELIVERED_PK;
use crate::dynamo::retry::{sdk, with_retries, ErrorClass, WriteError};
use crate::record::{ItemKey, SequenceNumber};

/// How long an entry stays once its delivery completed: Lambda may still
/// send a batch twice shortly after it succeeded.
const KEEP_COMPLETED: Duration = Duration::from_secs(300);

/// How long an entry lives at most: a DynamoDB stream keeps records 24 h.
const EXPIRES_AFTER: Duration = Duration::from_secs(2 * 24 * 3600);

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

/// What an earlier delivery starting where this one starts held.
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    /// The last sequence number it reached.
    pub through: SequenceNumber,
    /// For each item with several records in it, the last one's.
    pub last: HashMap<u64, SequenceNumber>,
}

impl Earlier {
    /// Whether the record at `sequence_number` of `item` is superseded:
    /// the earlier delivery held it and a later record of its item.
    pub fn supersedes(&self, item: &ItemKey, sequence_number: &SequenceNumber) -> bool {
        *sequence_number <= self.through
            && self
                .last
                .get(&item_hash(item))
                .is_some_and(|last| last > sequence_number)
    }
}

/// One delivery of records by a source: a Lambda batch, or a runner's
/// page. It is recorded once, by the first batch of it the applier
/// writes, and the answer serves every later chunk of it.
pub struct Delivery {
    /// The entry's key: the first record's event id, or the shard's.
    key: String,
    /// The last sequence number of the delivery.
    through: SequenceNumber,
    /// Its records, read when it is recorded.
    records: Records,
    /// What an earlier delivery starting here held, if there was one.
    found: tokio::sync::OnceCell<Option<Earlier>>,
    /// The records' event ids, once read (a re-delivery's pointers).
    event_ids: Mutex<Vec<String>>,
    /// The entries at each record point at the one found (a re-delivery).
    spread: tokio::sync::OnceCell<()>,
    /// Whether a re-delivery points at its entry from each of its records
    /// (a Lambda batch, which Lambda may cut anywhere); a shard's entry
    /// covers every record read past the checkpoint already.
    spreads: bool,
    /// This delivery's mark on its entry: an answer lost after the write
    /// lands, and the write sent again finds its own mark, not an earlier
    /// delivery's.
    nonce: String,
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
    /// A Lambda batch: it starts at the record with event id `first` and
    /// ends at sequence number `through`; `records` gives its records when
    /// it is recorded. `None` when there is no first event id to key it by.
    pub fn new(first: &str, through: SequenceNumber, records: Records) -> Option<Delivery> {
        if first.is_empty() {
            return None;
        }
        Some(Delivery::keyed(first.to_string(), through, records, true))
    }

    /// A page a runner read from shard `shard_id`, from its checkpoint on.
    /// Its entry is the shard's, replaced by each page that reaches
    /// further: what was read past the checkpoint.
    pub fn shard(shard_id: &str, through: SequenceNumber, records: Records) -> Delivery {
        Delivery::keyed(format!("shard#{shard_id}"), through, records, false)
    }

    fn keyed(key: String, through: SequenceNumber, records: Records, spreads: bool) -> Delivery {
        Delivery {
            key,
            through,
            records,
            found: tokio::sync::OnceCell::new(),
            event_ids: Mutex::new(Vec::new()),
            spread: tokio::sync::OnceCell::new(),
            spreads,
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

    /// Records this delivery, once, and returns what an earlier one that
    /// started where it starts held, if there was one. An error leaves it
    /// unrecorded (the caller fails the batch, to be delivered again).
    pub(crate) async fn record(&self, ctx: &Ctx<'_>) -> Result<Option<Earlier>, String> {
        self.found
            .get_or_try_init(|| async {
                let records = (self.records)();
                let last = last_of_repeated(&records);
                *self.event_ids.lock().expect("not poisoned") =
                    records.into_iter().map(|r| r.event_id).collect();
                let earlier = write_entry(
                    ctx,
                    &self.key,
                    &self.through,
                    Content::Items(&last),
                    &self.nonce,
                )
                .await?;
                if let Some(earlier) = &earlier {
                    metrics::counter!("projector_redeliveries_total").increment(1);
                    tracing::info!(
                        delivery = %self.key,
                        delivered_through = earlier.through.as_str(),
                        "a delivery starts where an earlier one did: its records that one held with a later record of their item write nothing their images decide"
                    );
                }
                Ok(earlier)
            })
            .await
            .cloned()
    }

    /// For a re-delivery: an entry at each of its records pointing at the
    /// one it found, before it writes, so that any shorter piece Lambda
    /// cuts from it is known as one too.
    pub(crate) async fn spread(&self, ctx: &Ctx<'_>, earlier: &Earlier) -> Result<(), String> {
        if !self.spreads {
            return Ok(());
        }
        self.spread
            .get_or_try_init(|| async {
                let through = earlier.through.clone().max(self.through.clone());
                let ids = self.event_ids.lock().expect("not poisoned").clone();
                let writes: Vec<_> = ids
                    .iter()
                    .filter(|id| !id.is_empty() && **id != self.key)
                    .map(|id| {
                        let through = through.clone();
                        async move {
                            write_entry(ctx, id, &through, Content::Root(&self.key), &self.nonce)
                                .await
                                .map(|_| ())
                        }
                    })
                    .collect();
                let results: Vec<Result<(), String>> = futures::stream::iter(writes)
                    .buffer_unordered(ctx.config.concurrency.max(1))
                    .collect()
                    .await;
                results.into_iter().collect::<Result<(), String>>()
            })
            .await
            .map(|_| ())
    }

    /// The delivery completed: its entry may go once the source can no
    /// longer deliver it again.
    fn completed(&self, ctx: &Ctx<'_>) {
        if self.found.get().is_none() {
            return;
        }
        let key = entry_key(ctx, &self.key);
        completed_list()
            .lock()
            .expect("not poisoned")
            .entry(ctx.table.to_string())
            .or_default()
            .push((key, Instant::now()));
    }
}

impl super::Applier {
    /// Records that the source will deliver again, from the record
    /// `event_id`, what `delivery` reached: Lambda restarts at the first
    /// record an invocation reports failed, and the records after it that
    /// did apply come again.
    pub async fn delivery_restarts_at(
        &self,
        delivery: &Delivery,
        event_id: &str,
    ) -> Result<(), String> {
        let ctx = self.ctx();
        write_entry(
            &ctx,
            event_id,
            &delivery.through,
            Content::Root(&delivery.key),
            &nonce(),
        )
        .await
        .map(|_| ())
    }

    /// `delivery` was applied whole: its entry goes once the source can no
    /// longer deliver it again.
    pub fn delivery_completed(&self, delivery: &Delivery) {
        delivery.completed(&self.ctx());
    }

    /// Shard `shard_id` was read to its end: its entry goes.
    pub fn shard_finished(&self, shard_id: &str) {
        let ctx = self.ctx();
        let key = entry_key(&ctx, &format!("shard#{shard_id}"));
        completed_list()
            .lock()
            .expect("not poisoned")
            .entry(ctx.table.to_string())
            .or_default()
            .push((key, Instant::now()));
    }
}

/// The item of a record as the ledger keys it: FNV-1a of its key, 64 bits.
fn item_hash(item: &ItemKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(item.pk.as_bytes());
    feed(&[0]);
    if let Some(sk) = &item.sk {
        feed(&[1]);
        feed(sk.as_bytes());
    }
    hash
}

/// For each item with more than one record in `records`, the last one's
/// sequence number: only such an item has a record a later one supersedes.
fn last_of_repeated(records: &[Delivered]) -> HashMap<u64, SequenceNumber> {
    let mut seen: HashMap<u64, (usize, SequenceNumber)> = HashMap::new();
    for record in records {
        let Some(item) = &record.item else { continue };
        let entry = seen
            .entry(item_hash(item))
            .or_insert((0, record.sequence_number.clone()));
        entry.0 += 1;
        if record.sequence_number > entry.1 {
            entry.1 = record.sequence_number.clone();
        }
    }
    seen.into_iter()
        .filter(|(_, (n, _))| *n > 1)
        .map(|(hash, (_, last))| (hash, last))
        .collect()
}

/// `last` as stored: per item, 8 bytes of hash, a byte of length, the
/// sequence number's digits.
fn encode(last: &HashMap<u64, SequenceNumber>) -> Vec<u8> {
    let mut out = Vec::with_capacity(last.len() * 34);
    for (hash, seq) in last {
        let digits = seq.as_str().trim_start_matches('0').as_bytes();
        let digits = &digits[..digits.len().min(255)];
        out.extend_from_slice(&hash.to_be_bytes());
        out.push(digits.len() as u8);
        out.extend_from_slice(digits);
    }
    out
}

fn decode(bytes: &[u8]) -> HashMap<u64, SequenceNumber> {
    let mut out = HashMap::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let hash = u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let len = bytes[at + 8] as usize;
        let Some(digits) = bytes.get(at + 9..at + 9 + len) else {
            break;
        };
        out.insert(
            hash,
            SequenceNumber(String::from_utf8_lossy(digits).into_owned()),
        );
        at += 9 + len;
    }
    out
}

/// Entries of completed deliveries, by table, and when they completed.
type Completed = HashMap<String, Vec<(HashMap<String, Av>, Instant)>>;

fn completed_list() -> &'static Mutex<Completed> {
    static LIST: OnceLock<Mutex<Completed>> = OnceLock::new();
    LIST.get_or_init(Default::default)
}

/// How often a process looks for entries that expired (left by processes
/// that ended before deleting theirs), per table.
const EXPIRED_EVERY: Duration = Duration::from_secs(3600);

/// Deletes the entries of this table's deliveries that completed long
/// enough ago and, once an hour, up to 100 entries that expired (best
/// effort: what is left is found next time, or by the table's TTL).
pub(crate) async fn sweep(ctx: &Ctx<'_>) {
    let mut due = completed_due(ctx);
    if expired_due(ctx) {
        due.extend(expired(ctx).await);
    }
    delete_entries(ctx, due).await;
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

/// Up to 100 keys of entries of the table that expired.
async fn expired(ctx: &Ctx<'_>) -> Vec<HashMap<String, Av>> {
    let table = &ctx.spec.table;
    let Some(sk) = &table.sort_key else {
        // Entries are partitions of their own: the TTL attribute, or
        // `expires`, is all there is.
        return Vec::new();
    };
    let pk = entry_key(ctx, "")
        .remove(&table.partition_key)
        .expect("the key has a partition key");
    let now = crate::dynamo::time::now_ms() / 1000;
    ctx.count(|r| &mut r.deliveries);
    let page = ctx
        .client
        .query()
        .table_name(ctx.table)
        .key_condition_expression("#pk = :pk")
        .filter_expression("#e < :now")
        .expression_attribute_names("#pk", &table.partition_key)
        .expression_attribute_names("#e", "expires")
        .expression_attribute_values(":pk", pk)
        .expression_attribute_values(":now", Av::N(now.to_string()))
        .projection_expression("#pk, #sk")
        .expression_attribute_names("#sk", sk)
        .limit(100)
        .send()
        .await;
    match page {
        Ok(page) => page.items().to_vec(),
        Err(error) => {
            tracing::debug!(error = %crate::dynamo::retry::describe(&error), "looking for expired entries of the ledger of deliveries failed");
            Vec::new()
        }
    }
}

/// The entries of completed deliveries whose time has come.
fn completed_due(ctx: &Ctx<'_>) -> Vec<HashMap<String, Av>> {
    let mut list = completed_list().lock().expect("not poisoned");
    let Some(entries) = list.get_mut(ctx.table) else {
        return Vec::new();
    };
    let (due, keep): (Vec<_>, Vec<_>) = entries
        .drain(..)
        .partition(|(_, at)| at.elapsed() >= KEEP_COMPLETED);
    *entries = keep;
    due.into_iter().map(|(key, _)| key).collect()
}

/// Deletes entries, 25 to a request, best effort.
async fn delete_entries(ctx: &Ctx<'_>, due: Vec<HashMap<String, Av>>) {
    for chunk in due.chunks(25) {
        let requests: Vec<WriteRequest> = chunk
            .iter()
            .map(|key| {
                WriteRequest::builder()
                    .delete_request(
                        DeleteRequest::builder()
                            .set_key(Some(key.clone()))
                            .build()
                            .expect("key is set"),
                    )
                    .build()
            })
            .collect();
        ctx.count(|r| &mut r.deliveries);
        let sent = ctx
            .client
            .batch_write_item()
            .request_items(ctx.table, requests)
            .send()
            .await;
        if let Err(error) = sent {
            tracing::debug!(error = %crate::dynamo::retry::describe(&error), "deleting entries of completed deliveries failed; they expire");
        }
    }
}

/// A mark no other delivery's write carries.
fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        crate::dynamo::time::now_ms(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The key of the entry at `at` (an event id, or `shard#<id>`).
fn entry_key(ctx: &Ctx<'_>, at: &str) -> HashMap<String, Av> {
    let table = &ctx.spec.table;
    let pk = match &ctx.config.consumer {
        Some(name) => format!("{DELIVERED_PK}@{name}"),
        None => DELIVERED_PK.to_string(),
    };
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

/// What an entry holds besides how far it reached.
enum Content<'a> {
    /// The delivery's items with several records.
    Items(&'a HashMap<u64, SequenceNumber>),
    /// The entry (its key) of the delivery this one is a piece of.
    Root(&'a str),
}

/// What an entry held before a write, when another delivery wrote it.
enum Held {
    Items(SequenceNumber, HashMap<u64, SequenceNumber>),
    Root(SequenceNumber, String),
}

/// Writes the entry at `at` to reach `through` with `content`, unless it
/// reaches as far already; returns what an earlier delivery left there
/// (following a piece's pointer to its root).
async fn write_entry(
    ctx: &Ctx<'_>,
    at: &str,
    through: &SequenceNumber,
    content: Content<'_>,
    nonce: &str,
) -> Result<Option<Earlier>, String> {
    let key = entry_key(ctx, at);
    let expires = (crate::dynamo::time::now_ms() / 1000) + EXPIRES_AFTER.as_secs();
    let mut update = "SET #t = :t, #e = :e, #b = :b".to_string();
    let mut names = HashMap::from([
        ("#t".to_string(), "through".to_string()),
        ("#e".to_string(), "expires".to_string()),
        ("#b".to_string(), "by".to_string()),
    ]);
    let mut values = HashMap::from([
        (":t".to_string(), Av::S(through.padded())),
        (":e".to_string(), Av::N(expires.to_string())),
        (":b".to_string(), Av::S(nonce.to_string())),
    ]);
    match content {
        Content::Items(last) => {
            update.push_str(", #l = :l REMOVE #r");
            names.insert("#l".to_string(), "last".to_string());
            names.insert("#r".to_string(), "root".to_string());
            values.insert(":l".to_string(), Av::B(Blob::new(encode(last))));
        }
        Content::Root(root) => {
            update.push_str(", #r = :r REMOVE #l");
            names.insert("#l".to_string(), "last".to_string());
            names.insert("#r".to_string(), "root".to_string());
            values.insert(":r".to_string(), Av::S(root.to_string()));
        }
    }
    if let Some(ttl) = &ctx.spec.table.ttl_attribute {
        let at = update.find(" REMOVE").unwrap_or(update.len());
        update.insert_str(at, ", #ttl = :e");
        names.insert("#ttl".to_string(), ttl.clone());
    }
    ctx.count(|r| &mut r.deliveries);
    let retries = std::sync::atomic::AtomicU64::new(0);
    let old = with_retries("deliveries", ctx.config.max_retry_time, &retries, || {
        let request = ctx
            .client
            .update_item()
            .table_name(ctx.table)
            .set_key(Some(key.clone()))
            .update_expression(&update)
            .condition_expression("attribute_not_exists(#t) OR #t < :t")
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values.clone()))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        async move {
            match request.send().await {
                Ok(output) => Ok(held(output.attributes(), nonce)),
                Err(error) => {
                    use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
                    let returned = match error.as_service_error() {
                        Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                            c.item().map(|item| held(Some(item), nonce))
                        }
                        _ => None,
                    };
                    let (class, text) = sdk(error);
                    match (class, returned) {
                        // It reaches as far already.
                        (ErrorClass::Conditional, Some(old)) => Ok(old),
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
    let old = old.map_err(|error| match error {
        WriteError::Transient(message) | WriteError::Poison(message) => {
            format!("recording the delivery in the ledger failed: {message}")
        }
        WriteError::Fatal(message) => message,
    })?;
    match old {
        None => Ok(None),
        Some(Held::Items(through, last)) => Ok(Some(Earlier { through, last })),
        Some(Held::Root(through, root)) => {
            // A piece of a longer delivery: that one's items.
            let root = read_root(ctx, &root).await?;
            Ok(Some(Earlier {
                through,
                last: root.map(|r| r.last).unwrap_or_default(),
            }))
        }
    }
}

/// What the entry `item` (as it was) says an earlier delivery held; `None`
/// when there was none, or the entry is this delivery's own (its write
/// landed and was sent again).
fn held(item: Option<&HashMap<String, Av>>, nonce: &str) -> Option<Held> {
    let item = item?;
    if matches!(item.get("by"), Some(Av::S(by)) if by == nonce) {
        return None;
    }
    let through = match item.get("through") {
        Some(Av::S(through)) => SequenceNumber(through.clone()),
        _ => return None,
    };
    Some(match (item.get("root"), item.get("last")) {
        (Some(Av::S(root)), _) => Held::Root(through, root.clone()),
        (_, Some(Av::B(last))) => Held::Items(through, decode(last.as_ref())),
        _ => Held::Items(through, HashMap::new()),
    })
}

/// The root entry `at`, read consistently.
async fn read_root(ctx: &Ctx<'_>, at: &str) -> Result<Option<Earlier>, String> {
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
    .map_err(|error| format!("reading the ledger of deliveries failed: {error}"))?
    .item;
    Ok(match held(item.as_ref(), "") {
        Some(Held::Items(through, last)) => Some(Earlier { through, last }),
        _ => None,
    })
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

    #[test]
    fn only_items_with_several_records_are_kept_with_their_last() {
        let records = [
            delivered("a", 1),
            delivered("b", 2),
            delivered("a", 3),
            delivered("c", 4),
            delivered("a", 5),
        ];
        let last = last_of_repeated(&records);
        assert_eq!(last.len(), 1);
        assert_eq!(last[&item_hash(&ItemKey::new("a", "X"))], seq(5));
        let round = decode(&encode(&last));
        assert_eq!(round, last);
    }

    #[test]
    fn a_record_is_superseded_only_by_a_later_one_of_its_item_that_was_held() {
        let records = [delivered("a", 1), delivered("b", 2), delivered("a", 3)];
        let earlier = Earlier {
            through: seq(3),
            last: last_of_repeated(&records),
        };
        let a = ItemKey::new("a", "X");
        let b = ItemKey::new("b", "X");
        assert!(earlier.supersedes(&a, &seq(1)));
        assert!(!earlier.supersedes(&a, &seq(3)), "the item's last applies");
        assert!(!earlier.supersedes(&b, &seq(2)), "a lone record applies");
        assert!(!earlier.supersedes(&a, &seq(4)), "never delivered");
    }

    #[test]
    fn stored_sequence_numbers_compare_as_numbers() {
        let mut last = HashMap::new();
        last.insert(7, SequenceNumber("000000000000000000100".into()));
        let back = decode(&encode(&last));
        assert_eq!(back[&7], SequenceNumber("100".into()));
        assert!(back[&7] > SequenceNumber("99".into()));
    }
}
