//! The dead-letter store: records that can never be applied, kept durably
//! in the table itself under the reserved prefix, with the full record, the
//! projection, the error and the attempt count.
//!
//! Layout (never matched by any entity, see [`crate::dynamo::names::RESERVED_PREFIX`]):
//!
//! - `PK = _ddbp#dlq`, `SK = <source PK>\x01<source SK>\x01<sequence number, 40 digits>\x01<projection>`:
//!   one item per dead record and projection, sorted by source item, then
//!   stream order, so a redrive replays each item's letters in order.
//! - `PK = _ddbp#holds`, `SK = <source PK>\x01<source SK>\x01<projection>`:
//!   one small item per (projection, item) pair with letters (`*`: every
//!   projection of the item, for a record that could not be decoded); later
//!   records of a held pair are dead-lettered behind the first one instead
//!   of being applied. A batch reads the holds with one `Query` while they
//!   fit in one page, and looks up its own pairs by key beyond that, so
//!   any number of held items costs one item each and never stops a batch.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use aws_smithy_types::date_time::Format;
use serde::Serialize;

use super::{Applier, ApplyError, BatchOptions, RecordStatus};
use crate::decode::decode_lambda_record;
use crate::dynamo::names::{DLQ_PK, HOLDS_PK, RESERVED_PREFIX};
use crate::dynamo::retry::{sdk, with_retries, Retrier, WriteError, UNPROCESSED_RETRIES};
use crate::record::{ChangeRecord, ItemKey};
use crate::spec::ProjectionId;

/// The projection name of a letter that concerns the whole record (of
/// the unnamed consumer; see [`whole_record`]).
pub const WHOLE_RECORD: &str = "*";

/// The projection name of consumer `consumer`'s letters that concern the
/// whole record: `*`, or `*@<consumer>`. Each consumer decodes the stream
/// itself, and redrives what it could not decode for its own projections.
pub fn whole_record(consumer: Option<&str>) -> String {
    match consumer {
        Some(name) => format!("{WHOLE_RECORD}@{name}"),
        None => WHOLE_RECORD.to_string(),
    }
}

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    /// The projection that could not apply the record (`*`: the whole record).
    pub projection: String,
    /// The source item, when the record's key could be read.
    #[serde(rename = "sourceKey", serialize_with = "ser_key")]
    pub source_key: Option<ItemKey>,
    /// The record's sequence number.
    #[serde(rename = "sequenceNumber")]
    pub sequence_number: Option<String>,
    /// The record's event id.
    #[serde(rename = "eventId")]
    pub event_id: Option<String>,
    /// Why it could not be applied.
    pub error: String,
    /// Whether it waits behind an earlier letter of the same item.
    pub held: bool,
    /// How many times it was dead-lettered.
    pub attempts: u64,
    /// When it was first dead-lettered.
    #[serde(rename = "firstFailedAt")]
    pub first_failed_at: String,
    /// When it was last dead-lettered.
    #[serde(rename = "lastFailedAt")]
    pub last_failed_at: String,
    /// The record: a decoded change record, or the raw stream record when
    /// it could not be decoded.
    pub record: serde_json::Value,
    /// Whether `record` is a decoded change record.
    pub decoded: bool,
    /// Set when the record was too big to store whole (an item near
    /// DynamoDB's 400 KB limit): its images were left out, and this is the
    /// size of the whole record in bytes. Redrive reads the item's current
    /// state instead.
    #[serde(rename = "imagesOmitted", skip_serializing_if = "Option::is_none")]
    pub images_omitted: Option<usize>,
    /// The service that registered the projection (the spec's service for
    /// a whole record), as stored with the letter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// The largest record stored in a dead letter whole: the letter must fit in
/// one 400 KB item with its other attributes.
pub const MAX_STORED_RECORD_BYTES: usize = 300 * 1024;

fn ser_key<S: serde::Serializer>(key: &Option<ItemKey>, serializer: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(key) => serde_json::json!({ "pk": key.pk, "sk": key.sk }).serialize(serializer),
        None => serializer.serialize_none(),
    }
}

impl DeadLetter {
    /// A letter for a decoded record.
    pub fn for_record(
        record: &ChangeRecord,
        source_key: Option<ItemKey>,
        projection: &str,
        error: String,
        held: bool,
    ) -> DeadLetter {
        DeadLetter {
            projection: projection.to_string(),
            source_key,
            sequence_number: Some(record.sequence_number.0.clone()),
            event_id: Some(record.event_id.clone()),
            error,
            held,
            attempts: 1,
            first_failed_at: String::new(),
            last_failed_at: String::new(),
            record: serde_json::to_value(record).unwrap_or_default(),
            decoded: true,
            images_omitted: None,
            service: None,
        }
    }

    /// Whether the letter's record is an item's current state standing in
    /// the place of a stream record (it carries that record's event id),
    /// not a record as delivered or a backfill's scanned item.
    pub fn is_derived(&self) -> bool {
        let scanned = self
            .record
            .get("origin")
            .and_then(|origin| origin.get("type"))
            .is_some_and(|kind| kind == "scan");
        scanned
            && self.decoded
            && self
                .event_id
                .as_deref()
                .is_some_and(|id| !id.is_empty() && !id.starts_with("scan:"))
    }

    /// A letter for a record that could not be decoded (`source_key`: its
    /// item, when its keys could be read).
    pub fn for_problem(
        problem: &crate::decode::DecodeProblem,
        source_key: Option<ItemKey>,
        whole_record: &str,
    ) -> DeadLetter {
        DeadLetter {
            projection: whole_record.to_string(),
            source_key,
            sequence_number: problem.sequence_number.clone(),
            event_id: problem.event_id.clone(),
            error: problem.reason.clone(),
            held: false,
            attempts: 1,
            first_failed_at: String::new(),
            last_failed_at: String::new(),
            record: problem.raw.clone(),
            decoded: false,
            images_omitted: None,
            service: None,
        }
    }

    fn sort_key(&self) -> String {
        let seq = self.sequence_number.as_deref().unwrap_or("");
        match &self.source_key {
            Some(key) => format!(
                "{}\u{1}{}\u{1}{:0>40}\u{1}{}",
                key.pk,
                key.sk.as_deref().unwrap_or(""),
                seq,
                self.projection
            ),
            None => format!(
                "~\u{1}{}\u{1}{:0>40}\u{1}{}",
                self.event_id.as_deref().unwrap_or(""),
                seq,
                self.projection
            ),
        }
    }

    /// The (projection, item) pair this letter holds.
    fn hold(&self) -> Option<Hold> {
        Some((self.projection.clone(), self.source_key.clone()?))
    }
}

/// A held pair: a projection name (`*`: all) and a source item.
pub type Hold = (String, ItemKey);

/// The key of an undecodable record's item, when its `Keys` can be read
/// (both the Lambda and the Streams API shapes carry `dynamodb.Keys`).
pub fn problem_key(
    problem: &crate::decode::DecodeProblem,
    table: &crate::spec::TableSpec,
) -> Option<ItemKey> {
    let keys = problem.raw.get("dynamodb")?.get("Keys")?.clone();
    let item: crate::record::Item = serde_json::from_value(keys).ok()?;
    table.item_key(&item)
}

/// How many holds one `Query` page reads before a batch looks up its own
/// pairs by key instead.
const HOLDS_PAGE: i32 = 1000;

pub(crate) fn now() -> String {
    aws_smithy_types::DateTime::from(SystemTime::now())
        .fmt(Format::DateTime)
        .unwrap_or_default()
}

/// What `dlq redrive` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RedriveSummary {
    /// Letters applied and removed.
    pub redriven: usize,
    /// Letters that still fail but were removed because a later letter of
    /// the same item and projection applied (its state supersedes theirs).
    pub superseded: usize,
    /// Letters that still fail (kept, attempts counted).
    pub still_failing: usize,
    /// Letters skipped (their projection is no longer in the spec).
    pub skipped: usize,
}

/// Reads and writes dead letters of one table.
#[derive(Debug, Clone)]
pub struct DeadLetterStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
    pk: String,
    sk: Option<String>,
    /// Who registered each projection, stored with its letters.
    services: crate::spec::Services,
    /// The spec's service (several joined by `+` when composed).
    service: String,
}

impl DeadLetterStore {
    /// The store in `table`, whose key attributes the spec names.
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: &str,
        spec: &crate::spec::Spec,
    ) -> DeadLetterStore {
        debug_assert!(DLQ_PK.starts_with(RESERVED_PREFIX) && HOLDS_PK.starts_with(RESERVED_PREFIX));
        DeadLetterStore {
            client,
            table: table.to_string(),
            pk: spec.table.partition_key.clone(),
            sk: spec.table.sort_key.clone(),
            services: spec.services.clone(),
            service: spec.service.clone(),
        }
    }

    /// The service of a letter of `projection`.
    fn service_of(&self, projection: &str) -> &str {
        self.services.of(projection).unwrap_or(&self.service)
    }

    fn key(&self, pk: &str, sk: &str) -> HashMap<String, Av> {
        let mut key = HashMap::new();
        key.insert(self.pk.clone(), Av::S(pk.to_string()));
        if let Some(name) = &self.sk {
            key.insert(name.clone(), Av::S(sk.to_string()));
        }
        key
    }

    /// The key of a letter's item. A table without a sort key gives each
    /// letter a partition key of its own.
    fn letter_key(&self, letter: &DeadLetter) -> HashMap<String, Av> {
        match &self.sk {
            Some(_) => self.key(DLQ_PK, &letter.sort_key()),
            None => self.key(&format!("{DLQ_PK}#{}", letter.sort_key()), ""),
        }
    }

    /// Stores letters (idempotently: the same record and projection land on
    /// the same item, counting one more attempt) and their holds.
    pub async fn put(
        &self,
        letters: &[DeadLetter],
        max_retry: std::time::Duration,
    ) -> Result<(), WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        let at = now();
        for letter in letters {
            let key = self.letter_key(letter);
            let (record, omitted) = stored_record(letter);
            let mut values = HashMap::from([
                (":projection".to_string(), Av::S(letter.projection.clone())),
                (
                    ":service".to_string(),
                    Av::S(self.service_of(&letter.projection).to_string()),
                ),
                (":error".to_string(), Av::S(letter.error.clone())),
                (":held".to_string(), Av::Bool(letter.held)),
                (":record".to_string(), Av::S(record)),
                (":decoded".to_string(), Av::Bool(letter.decoded)),
                (":at".to_string(), Av::S(at.clone())),
                (":one".to_string(), Av::N("1".to_string())),
                (
                    ":seq".to_string(),
                    Av::S(letter.sequence_number.clone().unwrap_or_default()),
                ),
                (
                    ":event".to_string(),
                    Av::S(letter.event_id.clone().unwrap_or_default()),
                ),
            ]);
            if let Some(bytes) = omitted {
                values.insert(":omitted".to_string(), Av::N(bytes.to_string()));
                tracing::warn!(
                    bytes,
                    event_id = letter.event_id.as_deref().unwrap_or(""),
                    "record too big for a dead letter: stored without its images; redrive reads the item"
                );
            }
            let mut sets: Vec<(&str, &str)> = vec![
                ("projection", ":projection"),
                ("service", ":service"),
                ("lastFailedAt", ":at"),
                ("lastError", ":error"),
                ("sequenceNumber", ":seq"),
                ("eventId", ":event"),
            ];
            // An item's current state stands in the place of its record
            // (replay, recover, redrive) with its sequence number: failing
            // too, it leaves the letter of that record its record and
            // reason, and says its own in `lastError`.
            let kept: &[(&str, &str)] = &[
                ("error", ":error"),
                ("record", ":record"),
                ("decoded", ":decoded"),
            ];
            let derived = letter.is_derived();
            if !derived {
                sets.extend_from_slice(kept);
            }
            if omitted.is_some() {
                sets.push(("imagesOmitted", ":omitted"));
            }
            if let Some(source) = &letter.source_key {
                values.insert(":spk".to_string(), Av::S(source.pk.clone()));
                values.insert(
                    ":ssk".to_string(),
                    Av::S(source.sk.clone().unwrap_or_default()),
                );
                sets.push(("sourcePk", ":spk"));
                sets.push(("sourceSk", ":ssk"));
            }
            // Every name goes through a placeholder: several are reserved words.
            let mut names: HashMap<String, String> = HashMap::new();
            let mut parts = Vec::new();
            for (i, (name, value)) in sets.iter().enumerate() {
                names.insert(format!("#a{i}"), name.to_string());
                parts.push(format!("#a{i} = {value}"));
            }
            if derived {
                for (i, (name, value)) in kept.iter().enumerate() {
                    names.insert(format!("#k{i}"), name.to_string());
                    parts.push(format!("#k{i} = if_not_exists(#k{i}, {value})"));
                }
            }
            names.insert("#first".to_string(), "firstFailedAt".to_string());
            names.insert("#attempts".to_string(), "attempts".to_string());
            parts.push("#first = if_not_exists(#first, :at)".to_string());
            // Whether a record waits behind an earlier letter is decided when
            // it is first dead-lettered; delivered again, it finds its own
            // hold and would seem to wait behind itself.
            names.insert("#held".to_string(), "held".to_string());
            parts.push("#held = if_not_exists(#held, :held)".to_string());
            let update = format!("SET {} ADD #attempts :one", parts.join(", "));
            with_retries("dead_letter", max_retry, &retries, || {
                let request = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .update_expression(&update)
                    .set_expression_attribute_names(Some(names.clone()))
                    .set_expression_attribute_values(Some(values.clone()));
                async move { request.send().await.map(|_| ()).map_err(sdk) }
            })
            .await?;
            let service = self.service_of(&letter.projection).to_string();
            metrics::counter!(
                "projector_dead_letters_total",
                "projection" => letter.projection.clone(),
                "service" => service.clone()
            )
            .increment(1);
            tracing::warn!(
                projection = %letter.projection,
                service,
                event_id = letter.event_id.as_deref().unwrap_or(""),
                sequence_number = letter.sequence_number.as_deref().unwrap_or(""),
                source = %letter.source_key.as_ref().map(|k| k.to_string()).unwrap_or_default(),
                held = letter.held,
                error = %letter.error,
                "dead-lettered"
            );
        }
        let holds: HashSet<Hold> = letters.iter().filter_map(DeadLetter::hold).collect();
        self.add_holds(holds, max_retry).await
    }

    /// The key of a hold item.
    fn hold_key(&self, (projection, key): &Hold) -> HashMap<String, Av> {
        let member = format!(
            "{}\u{1}{}\u{1}{projection}",
            key.pk,
            key.sk.as_deref().unwrap_or("")
        );
        match &self.sk {
            Some(_) => self.key(HOLDS_PK, &member),
            None => self.key(&format!("{HOLDS_PK}#{member}"), ""),
        }
    }

    fn hold_of(item: &HashMap<String, Av>) -> Option<Hold> {
        let s = |name: &str| match item.get(name) {
            Some(Av::S(value)) => Some(value.clone()),
            _ => None,
        };
        Some((
            s("projection")?,
            ItemKey {
                pk: s("sourcePk")?,
                sk: s("sourceSk").filter(|sk| !sk.is_empty()),
            },
        ))
    }

    /// Writes hold items, each bumping its `version`: a release compares
    /// it, so a letter stored while a redrive runs keeps its hold.
    async fn add_holds(
        &self,
        holds: HashSet<Hold>,
        max_retry: std::time::Duration,
    ) -> Result<(), WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        for hold in &holds {
            let key = self.hold_key(hold);
            with_retries("holds", max_retry, &retries, || {
                let request = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .update_expression("SET #p = :p, #spk = :spk, #ssk = :ssk ADD #v :one")
                    .expression_attribute_names("#p", "projection")
                    .expression_attribute_names("#spk", "sourcePk")
                    .expression_attribute_names("#ssk", "sourceSk")
                    .expression_attribute_names("#v", "version")
                    .expression_attribute_values(":p", Av::S(hold.0.clone()))
                    .expression_attribute_values(":spk", Av::S(hold.1.pk.clone()))
                    .expression_attribute_values(
                        ":ssk",
                        Av::S(hold.1.sk.clone().unwrap_or_default()),
                    )
                    .expression_attribute_values(":one", Av::N("1".to_string()));
                async move { request.send().await.map(|_| ()).map_err(sdk) }
            })
            .await?;
        }
        Ok(())
    }

    /// Releases the holds among `candidates` that no letter needs any
    /// more. A hold's version is read first, then every letter is listed
    /// again, and a hold none of them names is deleted only if its version
    /// has not moved: a letter stored after the listing bumped it.
    async fn release_holds(&self, candidates: HashSet<Hold>) -> Result<(), WriteError> {
        if candidates.is_empty() {
            return Ok(());
        }
        let max_retry = std::time::Duration::from_secs(20);
        let retries = std::sync::atomic::AtomicU64::new(0);
        let mut versions: Vec<(Hold, Option<Av>)> = Vec::new();
        for hold in candidates {
            let key = self.hold_key(&hold);
            let output = with_retries("holds", max_retry, &retries, || {
                let request = self
                    .client
                    .get_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .consistent_read(true);
                async move { request.send().await.map_err(sdk) }
            })
            .await?;
            if let Some(item) = output.item() {
                versions.push((hold, item.get("version").cloned()));
            }
        }
        let needed: HashSet<Hold> = self
            .list()
            .await?
            .iter()
            .filter_map(DeadLetter::hold)
            .collect();
        for (hold, version) in versions {
            if needed.contains(&hold) {
                continue;
            }
            let key = self.hold_key(&hold);
            let released = with_retries("holds", max_retry, &retries, || {
                let request = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .expression_attribute_names("#v", "version");
                let request = match &version {
                    Some(version) => request
                        .condition_expression("#v = :v")
                        .expression_attribute_values(":v", version.clone()),
                    None => request.condition_expression("attribute_not_exists(#v)"),
                };
                async move {
                    match request.send().await {
                        Ok(_) => Ok(true),
                        Err(error) => match sdk(error) {
                            (crate::dynamo::retry::ErrorClass::Conditional, _) => Ok(false),
                            other => Err(other),
                        },
                    }
                }
            })
            .await?;
            if !released {
                tracing::info!(projection = %hold.0, item = %hold.1, "a letter was stored during the redrive: its hold stays");
            }
        }
        Ok(())
    }

    /// Which of `candidates` are held. One consistent `Query` reads every
    /// hold while they fit in a page; beyond that, the candidates are
    /// looked up by key.
    pub async fn held(
        &self,
        candidates: &HashSet<Hold>,
        max_retry: std::time::Duration,
    ) -> Result<HashSet<Hold>, WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        if self.sk.is_some() {
            let page = with_retries("holds", max_retry, &retries, || {
                let request = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .consistent_read(true)
                    .key_condition_expression("#pk = :pk")
                    .expression_attribute_names("#pk", &self.pk)
                    .expression_attribute_values(":pk", Av::S(HOLDS_PK.to_string()))
                    .limit(HOLDS_PAGE);
                async move { request.send().await.map_err(sdk) }
            })
            .await?;
            if page.last_evaluated_key().is_none_or(|key| key.is_empty()) {
                return Ok(page
                    .items()
                    .iter()
                    .filter_map(Self::hold_of)
                    .filter(|hold| candidates.contains(hold))
                    .collect());
            }
        }
        // Many holds: look up this batch's pairs, 100 keys a request.
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let mut found = HashSet::new();
        let keys: Vec<HashMap<String, Av>> = candidates.iter().map(|h| self.hold_key(h)).collect();
        for chunk in keys.chunks(100) {
            let mut pending = chunk.to_vec();
            let mut leftovers = Retrier::scheduled(UNPROCESSED_RETRIES);
            while !pending.is_empty() {
                let output = with_retries("holds", max_retry, &retries, || {
                    let request = self.client.batch_get_item().request_items(
                        &self.table,
                        KeysAndAttributes::builder()
                            .set_keys(Some(pending.clone()))
                            .consistent_read(true)
                            .build()
                            .expect("keys are set"),
                    );
                    async move { request.send().await.map_err(sdk) }
                })
                .await?;
                found.extend(
                    output
                        .responses()
                        .and_then(|r| r.get(&self.table))
                        .into_iter()
                        .flatten()
                        .filter_map(Self::hold_of),
                );
                pending = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
                if !pending.is_empty() && !leftovers.wait(|_| {}).await {
                    return Err(WriteError::Transient(
                        "DynamoDB kept leaving holds unread".to_string(),
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Every letter, sorted by source item and stream order.
    pub async fn list(&self) -> Result<Vec<DeadLetter>, WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        let mut letters = Vec::new();
        let mut start: Option<HashMap<String, Av>> = None;
        loop {
            let page = with_retries(
                "list_dead_letters",
                std::time::Duration::from_secs(20),
                &retries,
                || {
                    let request = match &self.sk {
                        Some(_) => self
                            .client
                            .query()
                            .table_name(&self.table)
                            .consistent_read(true)
                            .key_condition_expression("#pk = :pk")
                            .expression_attribute_names("#pk", &self.pk)
                            .expression_attribute_values(":pk", Av::S(DLQ_PK.to_string()))
                            .set_exclusive_start_key(start.clone())
                            .send(),
                        // Without a sort key, letters are items of their own:
                        // found by a scan (listing letters is rare).
                        None => {
                            let scan = self
                                .client
                                .scan()
                                .table_name(&self.table)
                                .consistent_read(true)
                                .filter_expression("begins_with(#pk, :prefix)")
                                .expression_attribute_names("#pk", &self.pk)
                                .expression_attribute_values(":prefix", Av::S(format!("{DLQ_PK}#")))
                                .set_exclusive_start_key(start.clone());
                            return futures::future::Either::Right(async move {
                                scan.send()
                                    .await
                                    .map(|page| {
                                        (page.items().to_vec(), page.last_evaluated_key().cloned())
                                    })
                                    .map_err(sdk)
                            });
                        }
                    };
                    futures::future::Either::Left(async move {
                        request
                            .await
                            .map(|page| (page.items().to_vec(), page.last_evaluated_key().cloned()))
                            .map_err(sdk)
                    })
                },
            )
            .await?;
            let (items, last) = page;
            for item in &items {
                letters.push(from_item(item));
            }
            match last {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => {
                    // By source item, then stream order (a query's order).
                    letters.sort_by_key(DeadLetter::sort_key);
                    return Ok(letters);
                }
            }
        }
    }

    /// Removes letters that were applied, and their holds when no letter
    /// of the pair is left.
    pub async fn remove(
        &self,
        applied: &[DeadLetter],
        remaining: &[DeadLetter],
    ) -> Result<(), WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        for letter in applied {
            let key = self.letter_key(letter);
            with_retries(
                "remove_dead_letter",
                std::time::Duration::from_secs(20),
                &retries,
                || {
                    let request = self
                        .client
                        .delete_item()
                        .table_name(&self.table)
                        .set_key(Some(key.clone()));
                    async move { request.send().await.map(|_| ()).map_err(sdk) }
                },
            )
            .await?;
        }
        let still: HashSet<Hold> = remaining.iter().filter_map(DeadLetter::hold).collect();
        let released: HashSet<Hold> = applied
            .iter()
            .filter_map(DeadLetter::hold)
            .filter(|hold| !still.contains(hold))
            .collect();
        self.release_holds(released).await
    }
}

fn from_item(item: &HashMap<String, Av>) -> DeadLetter {
    let s = |name: &str| match item.get(name) {
        Some(Av::S(value)) => Some(value.clone()),
        _ => None,
    };
    let b = |name: &str| matches!(item.get(name), Some(Av::Bool(true)));
    let source_key = s("sourcePk").map(|pk| ItemKey {
        pk,
        sk: s("sourceSk").filter(|sk| !sk.is_empty()),
    });
    DeadLetter {
        projection: s("projection").unwrap_or_default(),
        source_key,
        sequence_number: s("sequenceNumber").filter(|v| !v.is_empty()),
        event_id: s("eventId").filter(|v| !v.is_empty()),
        error: s("error").unwrap_or_default(),
        held: b("held"),
        attempts: match item.get("attempts") {
            Some(Av::N(n)) => n.parse().unwrap_or(0),
            _ => 0,
        },
        first_failed_at: s("firstFailedAt").unwrap_or_default(),
        last_failed_at: s("lastFailedAt").unwrap_or_default(),
        record: s("record")
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        decoded: b("decoded"),
        service: s("service"),
        images_omitted: match item.get("imagesOmitted") {
            Some(Av::N(n)) => n.parse().ok(),
            _ => None,
        },
    }
}

/// The record text a letter stores, and the whole record's size when it
/// had to be slimmed: a decoded record keeps everything but its images; a
/// raw one keeps its first bytes as a string.
fn stored_record(letter: &DeadLetter) -> (String, Option<usize>) {
    let whole = serde_json::to_string(&letter.record).unwrap_or_default();
    if whole.len() <= MAX_STORED_RECORD_BYTES {
        return (whole, None);
    }
    let mut slim = letter.record.clone();
    if let Some(map) = slim.as_object_mut() {
        if letter.decoded {
            map.remove("old_image");
            map.remove("new_image");
        }
    }
    let text = serde_json::to_string(&slim).unwrap_or_default();
    if text.len() <= MAX_STORED_RECORD_BYTES {
        return (text, Some(whole.len()));
    }
    let mut cut = MAX_STORED_RECORD_BYTES;
    while !whole.is_char_boundary(cut) {
        cut -= 1;
    }
    (
        serde_json::to_string(&serde_json::Value::String(whole[..cut].to_string()))
            .unwrap_or_default(),
        Some(whole.len()),
    )
}

impl Applier {
    /// The item's current state, read consistently, as a record to apply
    /// in place of `letter` (effects are states, so the current state
    /// supersedes the one the letter was about). It keeps the letter's
    /// event id and sequence number: if it fails too, its letter is that
    /// letter again, not a new one.
    async fn current_state(
        &self,
        index: usize,
        letter: &DeadLetter,
        key: &ItemKey,
    ) -> Result<Result<ChangeRecord, crate::decode::DecodeProblem>, WriteError> {
        self.current_state_record(
            index,
            letter.event_id.as_deref(),
            letter.sequence_number.as_deref(),
            &letter.record,
            key,
        )
        .await
    }

    /// The dead-letter store of this applier's table.
    pub fn dead_letter_store(&self) -> DeadLetterStore {
        DeadLetterStore::new(self.client.clone(), &self.table, &self.spec)
    }

    /// This applier writing no dead letter: what applies an item's
    /// current state during a redrive fails without one (the item's
    /// letters keep their records).
    fn without_letters(&self) -> Applier {
        Applier {
            config: super::ApplyConfig {
                dead_letters: false,
                ..self.config.clone()
            },
            ..self.clone()
        }
    }

    /// Applies dead letters again (after a fix), item by item in stream
    /// order, and removes those that succeed. An item's letters go in one
    /// batch, whatever their projections (each record once, for the
    /// projections it has letters for), so every projection of the item is
    /// brought forward in stream order. A letter that still fails keeps
    /// its place, with every later letter of the item. `only_projections`:
    /// only the letters of these projections (`*` names the letters of
    /// records that could not be decoded).
    pub async fn redrive(
        &self,
        only_projections: Option<&[String]>,
    ) -> Result<RedriveSummary, ApplyError> {
        let fatal = |error: WriteError| ApplyError::Fatal {
            table: self.table.clone(),
            message: error.to_string(),
        };
        let store = self.dead_letter_store();
        let letters = store.list().await.map_err(fatal)?;
        let whole = self.whole_record();
        let mut summary = RedriveSummary::default();
        let mut remaining: Vec<DeadLetter> = Vec::new();
        let mut applied: Vec<DeadLetter> = Vec::new();
        // Letters come sorted by source item, then stream order.
        let mut groups: Vec<Vec<DeadLetter>> = Vec::new();
        for letter in letters {
            if only_projections.is_some_and(|only| !only.contains(&letter.projection)) {
                remaining.push(letter);
                continue;
            }
            // Another consumer's projections and undecodable records are
            // its own to redrive.
            if letter.projection != whole && self.spec.projection_id(&letter.projection).is_none() {
                tracing::warn!(projection = %letter.projection, "dead letters of a projection the spec no longer has: kept");
                summary.skipped += 1;
                remaining.push(letter);
                continue;
            }
            match groups.last_mut() {
                Some(group)
                    if letter.source_key.is_some() && group[0].source_key == letter.source_key =>
                {
                    group.push(letter)
                }
                _ => groups.push(vec![letter]),
            }
        }
        for group in groups {
            // One record per sequence number; the projections it has
            // letters for (`*`: all).
            let mut records: Vec<(Option<String>, Vec<usize>)> = Vec::new();
            for (i, letter) in group.iter().enumerate() {
                match records.last_mut() {
                    Some((seq, members)) if seq.is_some() && *seq == letter.sequence_number => {
                        members.push(i)
                    }
                    _ => records.push((letter.sequence_number.clone(), vec![i])),
                }
            }
            let selection = if group.iter().any(|l| l.projection == whole) {
                None
            } else {
                let mut ids: Vec<ProjectionId> = group
                    .iter()
                    .filter_map(|l| self.spec.projection_id(&l.projection))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                Some(ids)
            };
            let mut batch = Vec::with_capacity(records.len());
            for (index, (_, members)) in records.iter().enumerate() {
                let letter = &group[members[0]];
                // A letter without its images, or of a scan (which meant
                // "derive the item as it is"), applies the item's current
                // state: effects are states, and the current one supersedes.
                let scanned = letter
                    .record
                    .get("origin")
                    .and_then(|origin| origin.get("type"))
                    .is_some_and(|kind| kind == "scan");
                if let (true, true, Some(key)) = (
                    letter.images_omitted.is_some() || scanned,
                    letter.decoded,
                    &letter.source_key,
                ) {
                    batch.push(
                        self.current_state(index, letter, key)
                            .await
                            .map_err(fatal)?,
                    );
                    continue;
                }
                batch.push(if letter.decoded {
                    serde_json::from_value::<ChangeRecord>(letter.record.clone()).map_err(|error| {
                        crate::decode::DecodeProblem {
                            index,
                            event_id: letter.event_id.clone(),
                            sequence_number: letter.sequence_number.clone(),
                            reason: format!("stored record is unreadable: {error}"),
                            raw: letter.record.clone(),
                        }
                    })
                } else if letter.record.get("eventSource").and_then(|s| s.as_str())
                    == Some("aws:kinesis")
                {
                    // A change of another table on a shared stream is not
                    // this table's to apply.
                    match crate::decode::decode_kinesis_lambda_record(index, &letter.record) {
                        Ok(crate::record::ChangeRecord {
                            origin: crate::record::Origin::Kinesis { table_name, .. },
                            event_id,
                            sequence_number,
                            ..
                        }) if table_name != self.table => Err(crate::decode::DecodeProblem {
                            index,
                            event_id: Some(event_id),
                            sequence_number: Some(sequence_number.0),
                            reason: format!(
                                "the change is of table `{table_name}`, not `{}`: it is not this table's to apply",
                                self.table
                            ),
                            raw: letter.record.clone(),
                        }),
                        decoded => decoded,
                    }
                } else {
                    decode_lambda_record(index, &letter.record)
                });
            }
            // A letter's record is older than what may have applied of
            // its item since (another projection's records, a later state
            // the probe below applies): it writes only while its item is
            // as it shows.
            let options = BatchOptions {
                selection,
                redrive: true,
                guarded: true,
                ..BatchOptions::default()
            };
            let outcome = self.apply_batch(&batch, &options).await?;
            // Once a later record of the item applies, the item's derived
            // state is that record's, and earlier letters that still fail
            // (a stale image that can never render, a record no build can
            // decode) are superseded. Letters after the last record that
            // applied stay.
            let handled =
                |s: &RecordStatus| matches!(s, RecordStatus::Applied | RecordStatus::Skipped(_));
            let mut cut = outcome
                .statuses
                .iter()
                .rposition(handled)
                .map_or(0, |i| i + 1);
            // Then the item as it is now: effects are states, so once it
            // applies, every letter of the item is superseded, even one
            // whose later records planned nothing to hold (a poison item
            // deleted since). It is a probe: a batch of its own, and it
            // writes no letter when it fails (the item's letters keep
            // their records). It runs even when every letter applied:
            // letters sort by sequence number, which orders one stream
            // only, and a global table's failover leaves letters of two
            // (the old home's, replicated, and the new home's replay), so
            // the letter applied last may not be the item's last change.
            if let Some(key) = &group[0].source_key {
                let last = &group[group.len() - 1];
                let now = self.current_state(0, last, key).await.map_err(fatal)?;
                let outcome = self.without_letters().apply_batch(&[now], &options).await?;
                if outcome.statuses.first().is_some_and(handled) {
                    cut = records.len();
                }
            }
            // A letter of a counter written before the counter was rebuilt
            // beside its old version missed that version too (the one
            // readers read until the rebuild completes), which holds
            // nothing behind the counter's letters and may have applied
            // later records of the item since: it gets the item as it is
            // now, guarded by what was read, never a letter's older image.
            let olds: Vec<ProjectionId> = options
                .selection
                .iter()
                .flatten()
                .filter_map(|&id| self.spec.old_version(id))
                .filter(|id| !options.selection.iter().flatten().any(|s| s == id))
                .collect();
            if let (false, Some(key)) = (olds.is_empty(), &group[0].source_key) {
                let last = &group[group.len() - 1];
                let now = self.current_state(0, last, key).await.map_err(fatal)?;
                let outcome = self
                    .without_letters()
                    .apply_batch(
                        &[now],
                        &BatchOptions {
                            selection: Some(olds),
                            ..options.clone()
                        },
                    )
                    .await?;
                if let Some(RecordStatus::Failed(why)) = outcome.statuses.first() {
                    tracing::warn!(%why, "bringing a rebuilt counter's old version to the item's current state failed: it is corrected when the item changes again, and replaced when the rebuild completes");
                }
            }
            // Letters the redrive itself stored for records now superseded
            // (a projection of the selection that had no letter at that
            // record and failed there) go too.
            for (index, letter) in &outcome.letters {
                if *index < cut
                    && !records[*index]
                        .1
                        .iter()
                        .any(|&i| group[i].projection == letter.projection)
                {
                    applied.push(letter.clone());
                }
            }
            for (index, (_, members)) in records.into_iter().enumerate() {
                let n = members.len();
                if index >= cut {
                    summary.still_failing += n;
                } else if handled(&outcome.statuses[index]) {
                    summary.redriven += n;
                } else {
                    summary.superseded += n;
                }
                for i in members {
                    if index < cut {
                        applied.push(group[i].clone());
                    } else {
                        remaining.push(group[i].clone());
                    }
                }
            }
        }
        store.remove(&applied, &remaining).await.map_err(fatal)?;
        Ok(summary)
    }
}
