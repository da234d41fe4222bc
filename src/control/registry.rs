//! The registry's storage: the `_ddbp#lifecycle` items of one table (the
//! leases item, the projection records, the stored spec texts, the home
//! region and the last change applied), read into the records of
//! [`super::status`] and written by claims, completions and prunes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue as Av, KeysAndAttributes};
use serde::Serialize;

use super::status::{
    add_without, hex, onto_reverse_items, without_done_dependencies, Applied, BackfillRun,
    ConsumerSpec, Definition, ReadVersion, Record, Snapshot,
};
use crate::apply::{clock_skew_ms, ApplyError};
use crate::dynamo::names::LIFECYCLE_PK;
use crate::dynamo::retry::{
    describe as retry_describe, is_condition_failure, wait_for_unprocessed, Retrier,
    REGISTRY_CONTENTION,
};
use crate::dynamo::time::{iso, now_ms};
use crate::spec::raw::{RawProjection, RawSpec};
use crate::spec::{old_version_of, storage_generation, ProjectionId, Spec, TableSpec};

/// The leases item's attribute every lease taken anew (first, or after
/// it ran out) adds one to: a completion
/// is written on condition that it did not move since the snapshot that
/// vouched for it, so that no writer takes a lease unseen in between.
pub const LEASES_VERSION: &str = "ver";

/// The sort key prefix of a holder's item: `h#<holder>`, with `until`
/// (ms), the latest end of any lease the holder (one process's leases for
/// one spec and role) took.
pub(super) const HOLDER_PREFIX: &str = "h#";

/// How long a stream keeps its records: a consumer that ran nothing for
/// longer is gone, and no longer checked against.
const STREAM_RETENTION_MS: u64 = 24 * 3600 * 1000;

/// The registry's item of the home region a failover recorded.
const HOME: &str = "home";

/// The registry's item of the last change each projection applied: per
/// projection, `c#<name>` the change's time and `a#<name>` when it was
/// applied (ms), written by stream consumers at most every
/// [`APPLIED_EVERY`](super::leases::APPLIED_EVERY).
pub(super) const APPLIED: &str = "applied";

/// The sort key of the leases item.
pub(super) const LEASES: &str = "leases";

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The projections are the run's; it scans every item from now.
    Claimed,
    /// The run's name already claimed this projection once (it completed,
    /// or a later run superseded it): its progress would count for this
    /// claim although it was made before it. Name a new run.
    RunUsed {
        /// The projection.
        projection: String,
    },
    /// A writer of another definition may still write: a backfill started
    /// now could be undone by it. Try again after `until` (ms).
    Wait {
        /// The projection.
        projection: String,
        /// The other definition.
        other: String,
        /// Its lease.
        until: u64,
    },
}

/// What completing a run found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Completion {
    /// Projections now backfilled to the spec's definition.
    pub backfilled: Vec<String>,
    /// Projections the run could not vouch for, and why.
    pub not: Vec<(String, String)>,
}

/// Reads and writes the registry of one table.
#[derive(Debug, Clone)]
pub struct Registry {
    pub(super) client: aws_sdk_dynamodb::Client,
    pub(super) table: String,
    pk: String,
    sk: Option<String>,
    pub(super) skew_ms: u64,
}

fn text(item: &HashMap<String, Av>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(Av::S(text)) => Some(text.clone()),
        _ => None,
    }
}

/// A projection record's counter version readers read.
fn parse_read(item: &HashMap<String, Av>) -> Option<ReadVersion> {
    // Written with the rest in one update: a record without its variables
    // is not one this version wrote.
    let vars = match item.get("readVars")? {
        Av::L(list) => list.iter().filter_map(|v| v.as_s().ok().cloned()).collect(),
        _ => return None,
    };
    Some(ReadVersion {
        generation: number(item, "readGen")? as u32,
        fingerprint: text(item, "readFp")?,
        storage: text(item, "readStorage")?,
        shards: number(item, "readShards")? as u32,
        vars,
    })
}

pub(super) fn number(item: &HashMap<String, Av>, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(Av::N(n)) => n.parse().ok(),
        _ => None,
    }
}

/// The attributes of one projection's lease: writer, consumer, since,
/// spec, kind.
pub(super) fn lease_names(fingerprint: &str, name: &str) -> [String; 4] {
    [
        format!("w#{fingerprint}#{name}"),
        format!("c#{fingerprint}#{name}"),
        format!("s#{fingerprint}#{name}"),
        format!("d#{fingerprint}#{name}"),
    ]
}

/// Parses the leases item into records (without claims) and the specs
/// consumers ran.
pub(super) fn parse_leases(
    item: &HashMap<String, Av>,
) -> (BTreeMap<String, Record>, Vec<ConsumerSpec>) {
    let mut records: BTreeMap<String, Record> = BTreeMap::new();
    let mut consumers: BTreeMap<String, ConsumerSpec> = BTreeMap::new();
    let number = |value: &Av| match value {
        Av::N(n) => n.parse::<u64>().ok(),
        _ => None,
    };
    for (attribute, value) in item {
        let Some((tag, rest)) = attribute.split_once('#') else {
            continue;
        };
        if matches!(tag, "C" | "S" | "N") {
            let consumer = consumers.entry(rest.to_string()).or_default();
            let (fingerprint, name) = rest.split_once('@').unwrap_or((rest, ""));
            consumer.fingerprint = fingerprint.to_string();
            consumer.consumer = name.to_string();
            match (tag, value) {
                ("C", _) => consumer.until = number(value).unwrap_or(0),
                ("S", _) => consumer.since = number(value).unwrap_or(0),
                ("N", Av::Ss(names)) => consumer.names = names.iter().cloned().collect(),
                _ => {}
            }
            continue;
        }
        if tag == "k" {
            if let Av::S(kind) = value {
                let record = records.entry(rest.to_string()).or_default();
                record.name = rest.to_string();
                record.kind = Some(kind.clone());
            }
            continue;
        }
        let Some((fingerprint, name)) = rest.split_once('#') else {
            continue;
        };
        let record = records.entry(name.to_string()).or_default();
        record.name = name.to_string();
        let index = match record
            .definitions
            .iter()
            .position(|d| d.fingerprint == fingerprint)
        {
            Some(i) => i,
            None => {
                record.definitions.push(Definition {
                    fingerprint: fingerprint.to_string(),
                    ..Definition::default()
                });
                record.definitions.len() - 1
            }
        };
        let definition = &mut record.definitions[index];
        let n = number(value);
        match tag {
            "w" => definition.writes_until = n.unwrap_or(0),
            "c" => definition.consumed_until = n,
            "s" => definition.consumed_since = n,
            "d" => {
                if let Av::S(key) = value {
                    definition.spec_key = Some(key.clone());
                }
            }
            _ => {}
        }
    }
    for record in records.values_mut() {
        record
            .definitions
            .sort_by_key(|d| (d.writes_until, d.fingerprint.clone()));
    }
    let consumers: Vec<ConsumerSpec> = consumers
        .into_values()
        .filter(|c| c.until > 0 && !c.names.is_empty())
        .collect();
    (records, consumers)
}

impl Registry {
    /// The registry of `table`, with `keys`' key attributes.
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str, keys: &TableSpec) -> Registry {
        Registry {
            client,
            table: table.to_string(),
            pk: keys.partition_key.clone(),
            sk: keys.sort_key.clone(),
            skew_ms: clock_skew_ms(),
        }
    }

    /// The same registry, allowing for `skew_ms` between clocks.
    pub fn with_skew(mut self, skew_ms: u64) -> Registry {
        self.skew_ms = skew_ms;
        self
    }

    /// The clock skew it allows for.
    pub fn skew_ms(&self) -> u64 {
        self.skew_ms
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    pub(super) fn fatal(&self, what: &str, error: impl std::error::Error + 'static) -> ApplyError {
        ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("{what} the lifecycle registry: {}", retry_describe(&error)),
        }
    }

    pub(super) fn key(&self, sk: &str) -> HashMap<String, Av> {
        let mut key = HashMap::new();
        match &self.sk {
            Some(name) => {
                key.insert(self.pk.clone(), Av::S(LIFECYCLE_PK.to_string()));
                key.insert(name.clone(), Av::S(sk.to_string()));
            }
            None => {
                key.insert(self.pk.clone(), Av::S(format!("{LIFECYCLE_PK}#{sk}")));
            }
        }
        key
    }

    fn projection_key(&self, name: &str) -> HashMap<String, Av> {
        self.key(&format!("p#{name}"))
    }

    /// Whether an item's key is a registry item's.
    pub fn is_registry_key(pk: &str) -> bool {
        pk == LIFECYCLE_PK || pk.starts_with(&format!("{LIFECYCLE_PK}#"))
    }

    /// The registry, read consistently: the leases item, then the record
    /// of every projection it or `spec` names.
    pub async fn snapshot(&self, spec: &Spec) -> Result<Snapshot, ApplyError> {
        let leases = self.get(self.key(LEASES)).await?;
        let (mut records, consumers) = leases.as_ref().map(parse_leases).unwrap_or_default();
        let leases_version = leases
            .as_ref()
            .and_then(|item| number(item, LEASES_VERSION))
            .unwrap_or(0);
        for projection in &spec.projections {
            records
                .entry(projection.name.clone())
                .or_insert_with(|| Record {
                    name: projection.name.clone(),
                    ..Record::default()
                });
        }
        for consumer in &consumers {
            for name in &consumer.names {
                records.entry(name.clone()).or_insert_with(|| Record {
                    name: name.clone(),
                    ..Record::default()
                });
            }
        }
        add_without(&mut records, &consumers, now_ms());
        let names: Vec<String> = records.keys().cloned().collect();
        for chunk in names.chunks(100) {
            let mut keys: Vec<HashMap<String, Av>> =
                chunk.iter().map(|n| self.projection_key(n)).collect();
            while !keys.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut keys)))
                    .consistent_read(true)
                    .build()
                    .expect("keys are set");
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|e| self.fatal("reading", e))?;
                for item in output
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    let sk = match &self.sk {
                        Some(name) => text(item, name),
                        None => text(item, &self.pk)
                            .and_then(|pk| pk.strip_prefix(LIFECYCLE_PK).map(str::to_string))
                            .and_then(|rest| rest.strip_prefix('#').map(str::to_string)),
                    };
                    let Some(name) = sk.as_deref().and_then(|sk| sk.strip_prefix("p#")) else {
                        continue;
                    };
                    let Some(record) = records.get_mut(name) else {
                        continue;
                    };
                    if let (Some(run), Some(fingerprint), Some(from_ms)) = (
                        text(item, "claimRun"),
                        text(item, "claimFp"),
                        number(item, "claimFromMs"),
                    ) {
                        record.claim = Some(BackfillRun {
                            run,
                            fingerprint,
                            from_ms,
                            done_ms: None,
                        });
                    }
                    if let (Some(run), Some(fingerprint), Some(from_ms)) = (
                        text(item, "doneRun"),
                        text(item, "doneFp"),
                        number(item, "doneFromMs"),
                    ) {
                        record.backfilled = Some(BackfillRun {
                            run,
                            fingerprint,
                            from_ms,
                            done_ms: number(item, "doneAtMs"),
                        });
                    }
                    record.read = parse_read(item);
                    record.floor = number(item, "floorGen").unwrap_or(0) as u32;
                    if record.kind.is_none() {
                        record.kind = text(item, "kind");
                    }
                }
                if let Some(unprocessed) = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.table))
                    .map(|k| k.keys().to_vec())
                {
                    if !unprocessed.is_empty() {
                        wait_for_unprocessed().await;
                        keys = unprocessed;
                    }
                }
            }
        }
        Ok(Snapshot {
            records,
            consumers,
            leases_version,
        })
    }

    /// Claims `ids` for the backfill `run`: from now, its scan brings every
    /// item to the spec's definitions. Claiming again with the same run
    /// while it holds the claim keeps the first claim (segments on several
    /// machines, a retried claim); another run replaces it, and the
    /// replaced one can then no longer complete, nor claim again (a run's
    /// name claims a projection once: its progress would otherwise count
    /// for a claim made after it). Refused with [`ClaimOutcome::Wait`] while
    /// a writer of another definition holds a lease.
    pub async fn claim(
        &self,
        spec: &Spec,
        ids: &[ProjectionId],
        run: &str,
    ) -> Result<ClaimOutcome, ApplyError> {
        let snapshot = self.snapshot(spec).await?;
        let ids = &without_done_dependencies(
            spec,
            ids,
            crate::kinds::with_dependencies(spec, ids),
            &snapshot,
            run,
        )[..];
        let now = now_ms();
        for &id in ids {
            let projection = &spec.projections[id];
            let f = hex(projection.fingerprint);
            let record = snapshot.record(&projection.name);
            if let Some((until, other)) = record.other_writes_until(&f) {
                if until + self.skew_ms >= now {
                    return Ok(ClaimOutcome::Wait {
                        projection: projection.name.clone(),
                        other: other.to_string(),
                        until: until + self.skew_ms,
                    });
                }
            }
        }
        for &id in ids {
            let projection = &spec.projections[id];
            let sent = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.projection_key(&projection.name)))
                .update_expression(
                    "SET claimRun = :r, claimFp = :f, claimFromMs = :now, kind = :kind ADD runs :rs",
                )
                .condition_expression(
                    "(attribute_not_exists(claimRun) OR claimRun <> :r) AND NOT contains(runs, :r)",
                )
                .expression_attribute_values(":r", Av::S(run.to_string()))
                .expression_attribute_values(":rs", Av::Ss(vec![run.to_string()]))
                .expression_attribute_values(":f", Av::S(hex(projection.fingerprint)))
                .expression_attribute_values(":now", Av::N(now.to_string()))
                .expression_attribute_values(":kind", Av::S(projection.kind_name().to_string()))
                .return_values_on_condition_check_failure(
                    aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match sent {
                Ok(_) => {}
                Err(error) if is_condition_failure(&error) => {
                    let old = error
                        .as_service_error()
                        .and_then(|e| match e {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(e) => e.item().cloned(),
                            _ => None,
                        });
                    let holder = match old {
                        Some(item) => text(&item, "claimRun"),
                        None => self
                            .snapshot(spec)
                            .await?
                            .record(&projection.name)
                            .claim
                            .map(|c| c.run),
                    };
                    // Already this run's: the first claim stands.
                    if holder.as_deref() != Some(run) {
                        return Ok(ClaimOutcome::RunUsed {
                            projection: projection.name.clone(),
                        });
                    }
                }
                Err(error) => return Err(self.fatal("writing", error)),
            }
        }
        tracing::info!(run, projections = ?ids.iter().map(|&id| &spec.projections[id].name).collect::<Vec<_>>(), "lifecycle: backfill claimed");
        Ok(ClaimOutcome::Claimed)
    }

    /// The run that claimed every one of `ids` for the spec's definitions,
    /// if one did (what `backfill --resume` continues).
    pub async fn claimed_run(
        &self,
        spec: &Spec,
        ids: &[ProjectionId],
    ) -> Result<Option<String>, ApplyError> {
        let snapshot = self.snapshot(spec).await?;
        let runs: BTreeSet<Option<String>> = ids
            .iter()
            .map(|&id| {
                let projection = &spec.projections[id];
                snapshot
                    .record(&projection.name)
                    .claim
                    .filter(|c| c.fingerprint == hex(projection.fingerprint))
                    .map(|c| c.run)
            })
            .collect();
        Ok(match runs.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(run)] => Some(run.clone()),
            _ => None,
        })
    }

    /// Records that every segment of `run` is done: each of `ids` the run
    /// still holds the claim of is backfilled, unless a writer of another
    /// definition could write after the run started.
    pub async fn complete(
        &self,
        spec: &Spec,
        ids: &[ProjectionId],
        run: &str,
    ) -> Result<Completion, ApplyError> {
        let mut snapshot = self.snapshot(spec).await?;
        // What this run completed already (a rebuilt counter, before the
        // scan of its rollups) is not completed again.
        let ids = &without_done_dependencies(
            spec,
            &[],
            crate::kinds::completed_with(spec, ids),
            &snapshot,
            run,
        )[..];
        let now = now_ms();
        let mut completion = Completion::default();
        let mut contention = Retrier::scheduled(REGISTRY_CONTENTION);
        let mut index = 0;
        let mut last = usize::MAX;
        while index < ids.len() {
            let id = ids[index];
            if index != last {
                contention.reset();
                last = index;
            }
            index += 1;
            let projection = &spec.projections[id];
            let f = hex(projection.fingerprint);
            let record = snapshot.record(&projection.name);
            let Some(claim) = record
                .claim
                .clone()
                .filter(|c| c.run == run && c.fingerprint == f)
            else {
                let why = match &record.claim {
                    Some(other) => format!("backfill `{}` claimed it after this one", other.run),
                    None => "this backfill's claim is gone (another backfill completed it, or it never claimed)".to_string(),
                };
                completion.not.push((projection.name.clone(), why));
                continue;
            };
            if let Some((until, other)) = record
                .other_writes_until(&f)
                .filter(|(until, _)| *until + self.skew_ms >= claim.from_ms)
            {
                completion.not.push((
                    projection.name.clone(),
                    format!(
                        "a writer of another definition ({other}) could write until {}, after this backfill started at {}: backfill it again once only this definition runs",
                        iso(until),
                        iso(claim.from_ms)
                    ),
                ));
                // The claim can never complete: it goes, so that the next
                // backfill starts a run of its own.
                let sent = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(self.projection_key(&projection.name)))
                    .update_expression("REMOVE claimRun, claimFp, claimFromMs")
                    .condition_expression("claimRun = :r AND claimFromMs = :from")
                    .expression_attribute_values(":r", Av::S(run.to_string()))
                    .expression_attribute_values(":from", Av::N(claim.from_ms.to_string()))
                    .send()
                    .await;
                match sent {
                    Ok(_) => {}
                    Err(error) if is_condition_failure(&error) => {}
                    Err(error) => return Err(self.fatal("writing", error)),
                }
                continue;
            }
            // A counter's readers switch to the version just built.
            let read = spec.counter(id).and_then(|counter| {
                storage_generation(&projection.name, &counter.storage).map(|generation| {
                    let vars = counter
                        .of
                        .iter()
                        .map(|(name, _)| Av::S(name.clone()))
                        .collect::<Vec<_>>();
                    (generation, counter.storage.clone(), counter.shards, vars)
                })
            });
            let mut update = aws_sdk_dynamodb::types::Update::builder()
                .table_name(&self.table)
                .set_key(Some(self.projection_key(&projection.name)));
            let mut expression =
                "SET doneRun = :r, doneFp = :f, doneFromMs = :from, doneAtMs = :now".to_string();
            if let Some((generation, storage, shards, vars)) = read {
                expression.push_str(", readGen = :gen, readFp = :f, readStorage = :storage, readShards = :shards, readVars = :vars");
                update = update
                    .expression_attribute_values(":gen", Av::N(generation.to_string()))
                    .expression_attribute_values(":storage", Av::S(storage))
                    .expression_attribute_values(":shards", Av::N(shards.to_string()))
                    .expression_attribute_values(":vars", Av::L(vars));
            }
            expression.push_str(" REMOVE claimRun, claimFp, claimFromMs");
            let update = update
                .update_expression(expression)
                .condition_expression("claimRun = :r AND claimFp = :f")
                .expression_attribute_values(":r", Av::S(run.to_string()))
                .expression_attribute_values(":f", Av::S(f))
                .expression_attribute_values(":from", Av::N(claim.from_ms.to_string()))
                .expression_attribute_values(":now", Av::N(now.to_string()))
                .build()
                .expect("table, key and expression are set");
            // Fenced by the leases' version: a writer that took a lease
            // after the snapshot (say, of a definition laid out against
            // the version readers read until now) makes this try again on
            // a new snapshot, which sees it.
            let version = snapshot.leases_version;
            let fence = aws_sdk_dynamodb::types::ConditionCheck::builder()
                .table_name(&self.table)
                .set_key(Some(self.key(LEASES)))
                .condition_expression(if version == 0 {
                    "attribute_not_exists(#ver)"
                } else {
                    "#ver = :ver"
                })
                .expression_attribute_names("#ver", LEASES_VERSION)
                .set_expression_attribute_values(
                    (version != 0)
                        .then(|| HashMap::from([(":ver".to_string(), Av::N(version.to_string()))])),
                )
                .build()
                .expect("table, key and condition are set");
            let sent = self
                .client
                .transact_write_items()
                .transact_items(
                    aws_sdk_dynamodb::types::TransactWriteItem::builder()
                        .condition_check(fence)
                        .build(),
                )
                .transact_items(
                    aws_sdk_dynamodb::types::TransactWriteItem::builder()
                        .update(update)
                        .build(),
                )
                .send()
                .await;
            let failed = |error: &aws_sdk_dynamodb::error::SdkError<
                aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
                _,
            >| {
                let reasons = match error.as_service_error() {
                    Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(cancelled)) => cancelled.cancellation_reasons().to_vec(),
                    _ => return None,
                };
                let failed = |i: usize| {
                    reasons
                        .get(i)
                        .and_then(|r| r.code())
                        .is_some_and(|code| code == "ConditionalCheckFailed")
                };
                Some((failed(0), failed(1)))
            };
            match sent {
                Ok(_) => completion.backfilled.push(projection.name.clone()),
                Err(error) => match failed(&error) {
                    Some((_, true)) => completion.not.push((
                        projection.name.clone(),
                        "another backfill claimed it meanwhile".to_string(),
                    )),
                    // The fence failed (a lease was taken meanwhile), or a
                    // renewal conflicted with the transaction: look again.
                    Some(_) if !contention.is_spent() => {
                        contention.wait(|_| {}).await;
                        snapshot = self.snapshot(spec).await?;
                        index -= 1;
                    }
                    // Leases kept being taken: this one is not recorded
                    // (its claim stays), the others are; completing the
                    // run again finishes it.
                    Some(_) => completion.not.push((
                        projection.name.clone(),
                        "writers kept taking leases while the completion was written: run the completion again".to_string(),
                    )),
                    None => return Err(self.fatal("writing", error)),
                },
            }
        }
        for (name, why) in &completion.not {
            tracing::warn!(projection = %name, run, "backfill complete but not vouched for: {why}");
        }
        Ok(completion)
    }

    /// The version of counter `name` readers read, when a backfill of it
    /// completed (one consistent read).
    pub async fn read_version(&self, name: &str) -> Result<Option<ReadVersion>, ApplyError> {
        Ok(self
            .get(self.projection_key(name))
            .await?
            .as_ref()
            .and_then(parse_read))
    }

    /// The registry's item at `key`, read consistently.
    /// Whether writers record themselves as holders (`h#<holder>` items):
    /// a table with a sort key, whose registry partition can be queried.
    pub(super) fn keeps_holders(&self) -> bool {
        self.sk.is_some()
    }

    /// Every holder recorded: its id and until when (ms) it holds leases.
    pub(super) async fn holders(&self) -> Result<Vec<(String, u64)>, ApplyError> {
        let Some(sk) = &self.sk else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("#pk = :pk AND begins_with(#sk, :h)")
                .expression_attribute_names("#pk", &self.pk)
                .expression_attribute_names("#sk", sk)
                .expression_attribute_values(":pk", Av::S(LIFECYCLE_PK.to_string()))
                .expression_attribute_values(":h", Av::S(HOLDER_PREFIX.to_string()))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.fatal("reading the holders of", e))?;
            for item in page.items() {
                if let (Some(Av::S(key)), Some(until)) = (item.get(sk), number(item, "until")) {
                    if let Some(id) = key.strip_prefix(HOLDER_PREFIX) {
                        out.push((id.to_string(), until));
                    }
                }
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(out),
            }
        }
    }

    pub(super) async fn get(
        &self,
        key: HashMap<String, Av>,
    ) -> Result<Option<HashMap<String, Av>>, ApplyError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.fatal("reading", e))?;
        Ok(output.item)
    }

    /// The home region `ddb-projector failover` recorded for a global
    /// table, if any: it replicates to every region, and a worker projects
    /// only where it agrees with its configured home (see
    /// [`crate::global::role_with_record`]).
    pub async fn recorded_home(&self) -> Result<Option<String>, ApplyError> {
        Ok(self
            .get(self.key(HOME))
            .await?
            .and_then(|item| text(&item, "region")))
    }

    /// The last change each projection applied, by name, as stream
    /// consumers recorded it.
    pub async fn applied(&self) -> Result<HashMap<String, Applied>, ApplyError> {
        let Some(item) = self.get(self.key(APPLIED)).await? else {
            return Ok(HashMap::new());
        };
        Ok(item
            .iter()
            .filter_map(|(attr, value)| {
                let name = attr.strip_prefix("c#")?;
                let change_ms = value.as_n().ok()?.parse().ok()?;
                let applied_ms = number(&item, &format!("a#{name}"))?;
                Some((
                    name.to_string(),
                    Applied {
                        change_ms,
                        applied_ms,
                    },
                ))
            })
            .collect())
    }

    /// Records `region` as the global table's home region.
    pub async fn record_home(&self, region: &str) -> Result<(), ApplyError> {
        let mut item = self.key(HOME);
        item.insert("region".to_string(), Av::S(region.to_string()));
        item.insert("atMs".to_string(), Av::N(now_ms().to_string()));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| self.fatal("writing", e))?;
        Ok(())
    }

    /// The spec text stored under `key`.
    pub async fn spec_text(&self, key: &str) -> Result<Option<String>, ApplyError> {
        Ok(self
            .get(self.key(key))
            .await?
            .and_then(|item| text(&item, "text")))
    }

    /// What makes `spec`, run by consumer `consumer` (none: the unnamed
    /// one), unsafe beside the specs other consumers run on the table
    /// (their leases running): what composing them in one registry refuses
    /// (one attribute derived by both, a name defined twice with another
    /// definition, a loop through both), and one consumer writing onto
    /// the reverse items of another's inverse edge (which keeps only its
    /// own spec's attributes there). Projections both define alike are
    /// left out: a consumer renamed, or handing a projection over, runs
    /// beside its old self for a lease. One message per other consumer.
    pub async fn consumer_conflicts(
        &self,
        spec: &Spec,
        consumer: Option<&str>,
    ) -> Result<Vec<String>, ApplyError> {
        let Some(item) = self.get(self.key(LEASES)).await? else {
            return Ok(Vec::new());
        };
        let (_, consumers) = parse_leases(&item);
        let mine = consumer.unwrap_or("");
        let now = now_ms();
        let name = |n: &str| {
            if n.is_empty() {
                "(unnamed)".to_string()
            } else {
                format!("`{n}`")
            }
        };
        // Each other consumer's latest spec, idle or not, unless it ran
        // nothing for longer than a stream keeps its records (gone).
        let mut latest: BTreeMap<&str, &ConsumerSpec> = BTreeMap::new();
        for c in consumers.iter().filter(|c| c.consumer != mine) {
            let entry = latest.entry(c.consumer.as_str()).or_insert(c);
            if c.until > entry.until {
                *entry = c;
            }
        }
        let mut conflicts = Vec::new();
        for other in latest
            .into_values()
            .filter(|c| c.until + STREAM_RETENTION_MS >= now)
        {
            let text = self
                .spec_text(&format!("spec#{}", other.fingerprint))
                .await?;
            let theirs_raw = match text.map(|t| toml::from_str::<RawSpec>(&t)) {
                Some(Ok(raw)) => raw,
                Some(Err(error)) => {
                    conflicts.push(format!(
                        "the spec consumer {} runs cannot be read ({error}): it cannot be checked against this one",
                        name(&other.consumer)
                    ));
                    continue;
                }
                None => continue,
            };
            let mut ours = spec.raw.clone();
            let mut theirs = theirs_raw.clone();
            ours.table.name = self.table.clone();
            theirs.table.name = self.table.clone();
            // Alike as definitions: where a counter is stored, and the
            // old version kept beside a rebuilt one, are the layout's.
            let alike = |p: &RawProjection, all: &[RawProjection]| {
                all.iter().any(|q| q.definition() == p.definition())
            };
            theirs.projections.retain(|p| !alike(p, &ours.projections));
            theirs.invariants.retain(|i| !ours.invariants.contains(i));
            let differing: BTreeSet<String> = theirs
                .projections
                .iter()
                .map(|p| p.name().to_string())
                .collect();
            let ours_differing: BTreeSet<String> = ours
                .projections
                .iter()
                .filter(|p| !alike(p, &theirs_raw.projections))
                .map(|p| p.name().to_string())
                .collect();
            ours.service = format!("{} (consumer {})", ours.service, name(mine));
            theirs.service = format!("{} (consumer {})", theirs.service, name(&other.consumer));
            let mut problems = Vec::new();
            if let Err(errors) = crate::spec::SpecSet::compose(vec![
                (format!("consumer {} (this one)", name(mine)), ours),
                (format!("consumer {}", name(&other.consumer)), theirs),
            ]) {
                problems.push(errors.to_string());
            }
            if let Ok(theirs) = Spec::compile(theirs_raw, "theirs", Vec::new()) {
                problems.extend(onto_reverse_items(
                    spec,
                    &theirs,
                    &ours_differing,
                    &differing,
                    &name(&other.consumer),
                ));
            }
            if !problems.is_empty() {
                conflicts.push(format!(
                    "this consumer's spec conflicts with the spec consumer {} runs on table `{}` (lease until {}): each would undo the other's writes. Give each projection one owner, or serve both specs from one deployment (`check --spec DIR` checks them):\n{}",
                    name(&other.consumer),
                    self.table,
                    iso(other.until),
                    problems.join("\n")
                ));
            }
        }
        Ok(conflicts)
    }

    /// Removes everything the registry holds of `name` (after a prune).
    pub async fn forget(&self, name: &str, record: &Record) -> Result<(), ApplyError> {
        let mut names = Vec::new();
        for definition in &record.definitions {
            names.extend(lease_names(&definition.fingerprint, name));
        }
        names.push(format!("k#{name}"));
        for chunk in names.chunks(40) {
            let mut update = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.key(LEASES)));
            let mut parts = Vec::new();
            for (i, attribute) in chunk.iter().enumerate() {
                update = update.expression_attribute_names(format!("#a{i}"), attribute);
                parts.push(format!("#a{i}"));
            }
            update
                .update_expression(format!("REMOVE {}", parts.join(", ")))
                .send()
                .await
                .map_err(|e| self.fatal("writing", e))?;
        }
        // A counter keeps where its next life starts: past every
        // generation this one may have written (the one readers read, and
        // a rebuild beyond it that never completed).
        let is_counter =
            record.kind.as_deref() == Some("counter") && old_version_of(name).is_none();
        if is_counter {
            let floor = record
                .read
                .as_ref()
                .map_or(0, |read| read.generation + 2)
                .max(record.floor + 1);
            let mut item = self.projection_key(name);
            item.insert("floorGen".to_string(), Av::N(floor.to_string()));
            item.insert("kind".to_string(), Av::S("counter".to_string()));
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| self.fatal("writing", e))?;
            return Ok(());
        }
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.projection_key(name)))
            .send()
            .await
            .map_err(|e| self.fatal("writing", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::status::{add_without, WITHOUT};
    use super::*;

    #[test]
    fn a_consumer_renamed_back_to_an_old_spec_keeps_the_gap_before_it() {
        // The unnamed consumer ran s1 (with p) from 0, s2 (without) from
        // 100; from 200 the function runs s1 again, named `main`: its run
        // of s1 is its own, from 200, and p's gap from 100 stays.
        let mut item = HashMap::new();
        let n = |v: u64| Av::N(v.to_string());
        let names = |v: &[&str]| Av::Ss(v.iter().map(|s| s.to_string()).collect());
        item.insert("w#f1#p".to_string(), n(900));
        for (key, since, until, has) in [
            ("s1", 0, 100, &["p", "r"][..]),
            ("s2", 100, 200, &["r"][..]),
            ("s1@main", 200, 900, &["p", "r"][..]),
        ] {
            item.insert(format!("C#{key}"), n(until));
            item.insert(format!("S#{key}"), n(since));
            item.insert(format!("N#{key}"), names(has));
        }
        let (mut records, consumers) = parse_leases(&item);
        let main: Vec<&ConsumerSpec> = consumers.iter().filter(|c| c.consumer == "main").collect();
        assert_eq!(main.len(), 1);
        assert_eq!((main[0].fingerprint.as_str(), main[0].since), ("s1", 200));
        add_without(&mut records, &consumers, 10_000);
        let without = records["p"].definition(WITHOUT).expect("the gap");
        assert_eq!(
            (without.consumed_since, without.writes_until),
            (Some(100), 200)
        );
    }

    #[test]
    fn the_leases_item_parses_back_into_definitions() {
        let mut item = HashMap::new();
        item.insert("w#aa#x#y".to_string(), Av::N("10".to_string()));
        item.insert("c#aa#x#y".to_string(), Av::N("10".to_string()));
        item.insert("s#aa#x#y".to_string(), Av::N("3".to_string()));
        item.insert("d#aa#x#y".to_string(), Av::S("spec#1".to_string()));
        item.insert("k#x#y".to_string(), Av::S("counter".to_string()));
        item.insert("w#-#z".to_string(), Av::N("4".to_string()));
        let (records, _) = parse_leases(&item);
        let x = &records["x#y"];
        assert_eq!(x.kind.as_deref(), Some("counter"));
        assert_eq!(
            x.definitions,
            vec![Definition {
                fingerprint: "aa".to_string(),
                writes_until: 10,
                consumed_until: Some(10),
                consumed_since: Some(3),
                spec_key: Some("spec#1".to_string()),
            }]
        );
        assert_eq!(records["z"].definitions[0].fingerprint, WITHOUT);
    }
}
