//! The projection lifecycle: which definitions of each projection wrote the
//! derived data in the table, whether a backfill brought all of it to the
//! spec's definition, and what a deploy needs next.
//!
//! Everything is kept in the table, under the reserved partition
//! `_ddbp#lifecycle` (tables without a sort key: `_ddbp#lifecycle#<sk>`):
//!
//! - **Leases** (sort key `leases`, one item). Every process that writes
//!   derived data (the Lambda, the runner, `backfill`, `replay`, `dlq
//!   redrive`, `recover`) first takes a lease for each projection it writes
//!   and the fingerprint of the definition it writes it with:
//!   `w#<fingerprint>#<projection>` holds the time (ms) until which it may
//!   write. A stream consumer (the Lambda, the runner) also writes
//!   `c#…` (the same time), `s#…` (when one first ran it), and for its
//!   spec `C#<fp>`, `S#<fp>` and `N#<fp>` (its lease, first run and
//!   projection names; `<fp>@<consumer>` for a named consumer): a
//!   consumer without a projection leaves that projection's changes
//!   unprojected, which [`states`] reads as a definition `-` of it. A
//!   writer renews its lease before a batch that could
//!   outlast it, so a batch needs no request of its own
//!   ([`Leases::ensure`]); it never writes past its lease.
//! - **Projection records** (sort key `p#<projection>`): the backfill under
//!   way (`claimRun`, `claimFp`, `claimFromMs`) and the last complete one
//!   (`doneRun`, `doneFp`, `doneFromMs`, `doneAtMs`).
//! - **Spec texts** (sort key `spec#<fingerprint of the spec>`): the spec a
//!   lease's definition came from (`d#…` names it), so that `prune` can
//!   remove what a projection that no spec file has any more derived.
//!
//! **Architecture Invariant:** a projection is *live* only when a backfill
//! of its definition `f` completed, a stream consumer runs `f`, and no
//! lease of any other definition (nor of a consumer without it) lasted
//! past the instant the backfill started. Every item's derived data was
//! then written by `f`: the backfill brought each item to `f` after every
//! other writer had stopped, and only writers of `f` wrote since. `status`
//! computes this from the leases at every call ([`states`]), so a writer of
//! another definition that runs later (a rollback, a stale environment, a
//! redrive with an old spec file) turns the projection back from live at
//! once; nothing has to remember to clear a flag.

mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue as Av, KeysAndAttributes};
use serde::Serialize;

pub use crate::dynamo::names::LIFECYCLE_PK;
pub use crate::dynamo::retry::is_condition_failure;
pub use crate::dynamo::time::now_ms;
pub use status::{
    hex, iso, states, Applied, BackfillRun, Commands, ConsumerSpec, Definition, ProjectionStatus,
    ReadVersion, Record, Snapshot, State, WITHOUT,
};

use status::{add_without, onto_reverse_items, without_done_dependencies};

use crate::apply::{clock_skew_ms, lease_length, ApplyError};
use crate::dynamo::retry::{
    describe as retry_describe, wait_for_unprocessed, Retrier, LAYOUT_READS, REGISTRY_CONTENTION,
};
use crate::spec::raw::{RawProjection, RawSpec};
use crate::spec::{
    counter_storage, old_version_name, old_version_of, storage_generation, ProjectionId,
    ProjectionKind, Spec, TableSpec,
};

/// The leases item's attribute every lease taken anew (first, or after
/// it ran out) adds one to: a completion
/// is written on condition that it did not move since the snapshot that
/// vouched for it, so that no writer takes a lease unseen in between.
pub const LEASES_VERSION: &str = "ver";

/// How long a stream keeps its records: a consumer that ran nothing for
/// longer is gone, and no longer checked against.
const STREAM_RETENTION_MS: u64 = 24 * 3600 * 1000;

/// The registry's item of the home region a failover recorded.
const HOME: &str = "home";

/// The registry's item of the last change each projection applied: per
/// projection, `c#<name>` the change's time and `a#<name>` when it was
/// applied (ms), written by stream consumers at most every
/// [`APPLIED_EVERY`].
const APPLIED: &str = "applied";

/// How often a stream consumer records the last change it applied.
const APPLIED_EVERY: Duration = Duration::from_secs(30);

/// The sort key of the leases item.
const LEASES: &str = "leases";

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
    client: aws_sdk_dynamodb::Client,
    table: String,
    pk: String,
    sk: Option<String>,
    skew_ms: u64,
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

fn number(item: &HashMap<String, Av>, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(Av::N(n)) => n.parse().ok(),
        _ => None,
    }
}

/// The attributes of one projection's lease: writer, consumer, since,
/// spec, kind.
fn lease_names(fingerprint: &str, name: &str) -> [String; 4] {
    [
        format!("w#{fingerprint}#{name}"),
        format!("c#{fingerprint}#{name}"),
        format!("s#{fingerprint}#{name}"),
        format!("d#{fingerprint}#{name}"),
    ]
}

/// Parses the leases item into records (without claims) and the specs
/// consumers ran.
fn parse_leases(item: &HashMap<String, Av>) -> (BTreeMap<String, Record>, Vec<ConsumerSpec>) {
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

    fn fatal(&self, what: &str, error: impl std::error::Error + 'static) -> ApplyError {
        ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("{what} the lifecycle registry: {}", retry_describe(&error)),
        }
    }

    fn key(&self, sk: &str) -> HashMap<String, Av> {
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
            let read = match &projection.kind {
                ProjectionKind::Counter(counter) => {
                    storage_generation(&projection.name, &counter.storage).map(|generation| {
                        let vars = counter
                            .of
                            .iter()
                            .map(|(name, _)| Av::S(name.clone()))
                            .collect::<Vec<_>>();
                        (generation, counter.storage.clone(), counter.shards, vars)
                    })
                }
                ProjectionKind::IndexKeys(_)
                | ProjectionKind::Denormalize(_)
                | ProjectionKind::InverseEdge(_)
                | ProjectionKind::Recomputed(_)
                | ProjectionKind::Custom(_) => None,
            };
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
    async fn get(
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

/// Where a changed counter is built, and whether its old version is kept
/// current beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterLayout {
    /// The counter.
    pub name: String,
    /// The generation its definition writes.
    pub generation: u32,
    /// The version readers read, when it is another definition: kept
    /// current under `<name>~<its generation>` while this one is built, or (when it
    /// cannot be) rebuilt in place.
    pub old: Option<OldVersion>,
}

/// A counter's old version, as [`Registry::layout`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldVersion {
    /// Its generation.
    pub generation: u32,
    /// Its definition.
    pub fingerprint: String,
    /// `None`: kept current beside the new one; else why it cannot be.
    /// The new one is built in the next generation all the same (never
    /// in the one readers read, so no two definitions write one storage):
    /// readers then read the old version's last values, not kept current,
    /// until the backfill completes.
    pub not_kept: Option<String>,
}

impl Registry {
    /// The spec a process runs: `spec` with each changed counter built in
    /// the generation after the one readers read, and the version they
    /// read kept current beside it as `<name>~<generation>` (unless it
    /// cannot be: see [`OldVersion::not_kept`]; its definition comes from the
    /// spec text the registry stored for it). A counter readers read
    /// already, or never read, is written where it is. A table without a
    /// registry gives `spec` as it is.
    pub async fn layout(&self, spec: &Spec) -> Result<(Spec, Vec<CounterLayout>), ApplyError> {
        let counters: Vec<&str> = spec
            .projections
            .iter()
            .enumerate()
            .filter(|(id, p)| {
                matches!(p.kind, ProjectionKind::Counter(_)) && !spec.is_old_version(*id)
            })
            .map(|(_, p)| p.name.as_str())
            .collect();
        if counters.is_empty() {
            return Ok((spec.clone(), Vec::new()));
        }
        let snapshot = match self.snapshot(spec).await {
            Ok(snapshot) => snapshot,
            Err(error) if error.to_string().contains("ResourceNotFound") => {
                return Ok((spec.clone(), Vec::new()))
            }
            Err(error) => return Err(error),
        };
        let mut old_texts: HashMap<String, Option<RawSpec>> = HashMap::new();
        let mut layouts = Vec::new();
        // The spec as written (a spec laid out already is laid out anew).
        let mut raw = spec.raw.clone();
        raw.projections
            .retain(|p| p.definition().name() == p.name());
        for p in &mut raw.projections {
            *p = p.definition();
        }
        let mut shadows = Vec::new();
        let mut frozen = Vec::new();
        for name in counters {
            let projection = &spec.projections[spec.projection_id(name).expect("listed")];
            let f = hex(projection.fingerprint);
            let record = snapshot.record(name);
            let Some((read_gen, read_fp)) = record.read_version() else {
                set_storage(&mut raw, name, record.floor);
                layouts.push(CounterLayout {
                    name: name.to_string(),
                    generation: record.floor,
                    old: None,
                });
                continue;
            };
            if read_fp == f {
                set_storage(&mut raw, name, read_gen);
                layouts.push(CounterLayout {
                    name: name.to_string(),
                    generation: read_gen,
                    old: None,
                });
                continue;
            }
            let build = read_gen + 1;
            let old_name = old_version_name(name, read_gen);
            let mut not_kept = None;
            // While the counter was out of the spec, nobody kept the
            // version readers read: there is nothing current to keep.
            let read_from = record.backfilled.as_ref().map_or(0, |done| done.from_ms);
            if record
                .definition(WITHOUT)
                .is_some_and(|without| without.writes_until + self.skew_ms >= read_from)
            {
                not_kept = Some(format!(
                    "a worker without `{name}` ran after the version readers read was built: that version missed its changes"
                ));
            }
            // The old definition, as the spec that ran it had it.
            let old_raw = match record.definition(&read_fp).and_then(|d| d.spec_key.clone()) {
                Some(key) => {
                    if !old_texts.contains_key(&key) {
                        let parsed = self
                            .spec_text(&key)
                            .await?
                            .and_then(|text| toml::from_str::<RawSpec>(&text).ok());
                        old_texts.insert(key.clone(), parsed);
                    }
                    old_texts[&key].as_ref().and_then(|old| {
                        old.projections
                            .iter()
                            .find(|p| {
                                matches!(p, RawProjection::Counter { .. }) && p.name() == name
                            })
                            .cloned()
                    })
                }
                None => None,
            };
            let new_raw = raw.projections.iter().find(|p| p.name() == name).cloned();
            let source = |p: &RawProjection| match p {
                RawProjection::Counter { source, .. } => Some(source.clone()),
                _ => None,
            };
            match (&old_raw, &new_raw) {
                _ if not_kept.is_some() => {}
                (None, _) => {
                    not_kept = Some(format!(
                        "the registry has no stored spec with definition {read_fp} of `{name}`"
                    ))
                }
                // Lambda's event filters pass the entities the new spec
                // uses: the old version would not see its source's changes.
                (Some(old), Some(new)) if source(old) != source(new) => {
                    not_kept = Some(
                        "the version readers read counts another entity than this definition"
                            .to_string(),
                    )
                }
                (Some(old), _) => {
                    let mut shadow = old.definition();
                    if let RawProjection::Counter {
                        name: shadow_name,
                        storage,
                        ..
                    } = &mut shadow
                    {
                        *shadow_name = old_name.clone();
                        *storage = Some(counter_storage(name, read_gen));
                    }
                    // The old definition must mean in this spec what it
                    // meant in its own: same fingerprint (entities,
                    // placement).
                    let mut trial = raw.clone();
                    set_storage(&mut trial, name, build);
                    trial.projections.push(shadow.clone());
                    match Spec::compile_composed(
                        trial,
                        &spec.file,
                        custom_projections(spec),
                        spec.services.clone(),
                    ) {
                        Ok(compiled) => {
                            let id = compiled.projection_id(&old_name).expect("added");
                            if hex(compiled.projections[id].fingerprint) == read_fp {
                                shadows.push(shadow);
                            } else {
                                not_kept = Some(format!(
                                    "definition {read_fp} of `{name}` would mean something else beside this spec (its entities or the edge it rides on changed)"
                                ));
                            }
                        }
                        Err(errors) => {
                            not_kept = Some(format!(
                                "definition {read_fp} of `{name}` does not compile beside this spec: {errors}"
                            ))
                        }
                    }
                }
            }
            let generation = build;
            set_storage(&mut raw, name, generation);
            if not_kept.is_some() {
                frozen.push(counter_storage(name, read_gen));
            }
            if let Some(why) = &not_kept {
                tracing::warn!(counter = %name, "the version readers read cannot be kept current while the changed counter is rebuilt: they read its last values until the rebuild's backfill completes: {why}");
            }
            layouts.push(CounterLayout {
                name: name.to_string(),
                generation,
                old: Some(OldVersion {
                    generation: read_gen,
                    fingerprint: read_fp,
                    not_kept,
                }),
            });
        }
        raw.projections.extend(shadows);
        let mut compiled = Spec::compile_composed(
            raw,
            &spec.file,
            custom_projections(spec),
            spec.services.clone(),
        )
        .map_err(|errors| ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("the counters' versions do not compile beside the spec: {errors}"),
        })?;
        compiled.frozen = frozen;
        Ok((compiled, layouts))
    }
}

type LayoutCache = HashMap<(String, u64), (Arc<Spec>, std::time::Instant)>;
static LAYOUTS: OnceLock<tokio::sync::Mutex<LayoutCache>> = OnceLock::new();

/// How many times a writer of this process was refused for a stale
/// layout: a long-running process lays its spec out again when it moves.
static LAYOUT_REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a writer of this process was refused for a stale layout
/// (see [`current_layout`]; the runner lays out again when it moves).
pub fn layout_refusals() -> u64 {
    LAYOUT_REFUSALS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A writer on `table` was refused for a stale layout: the next
/// [`current_layout`] reads it again.
async fn layout_is_stale(table: &str) {
    LAYOUT_REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(cache) = LAYOUTS.get() {
        cache.lock().await.retain(|(t, _), _| t != table);
    }
}

/// The spec a long-running process (the Lambda) runs on `table`: `spec`
/// laid out by [`Registry::layout`], read again once per lease period, so
/// that a worker takes up a counter's new version, and drops its old one,
/// within a lease period of the backfill that completes it. A failed
/// read keeps the last layout; with none, it is the error.
pub async fn current_layout(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Arc<Spec>,
) -> Result<Arc<Spec>, ApplyError> {
    if !spec
        .projections
        .iter()
        .any(|p| matches!(p.kind, ProjectionKind::Counter(_)))
    {
        return Ok(spec.clone());
    }
    let key = (table.to_string(), spec.projections_fingerprint());
    let mut cache = LAYOUTS.get_or_init(Default::default).lock().await;
    if let Some((laid, at)) = cache.get(&key) {
        if at.elapsed() < lease_length() {
            return Ok(laid.clone());
        }
    }
    let registry = Registry::new(client.clone(), table, &spec.table);
    // Throttling and lost answers are tried again a few times, briefly
    // (the registry's reads are not classified).
    let mut retrier = Retrier::scheduled(LAYOUT_READS);
    let mut read = registry.layout(spec).await;
    while read.is_err() && retrier.wait(|_| {}).await {
        read = registry.layout(spec).await;
    }
    match read {
        Ok((laid, _)) => {
            let laid = Arc::new(laid);
            cache.insert(key, (laid.clone(), std::time::Instant::now()));
            Ok(laid)
        }
        Err(error) => match cache.get(&key) {
            Some((laid, _)) => {
                tracing::warn!(%error, "reading the counters' layout failed: keeping the last one");
                Ok(laid.clone())
            }
            None => Err(error),
        },
    }
}

/// Sets counter `name`'s storage to generation `generation`'s.
fn set_storage(raw: &mut RawSpec, name: &str, generation: u32) {
    for p in &mut raw.projections {
        if let RawProjection::Counter {
            name: n, storage, ..
        } = p
        {
            if n == name {
                *storage = (generation != 0).then(|| counter_storage(name, generation));
            }
        }
    }
}

/// The projections of `spec` written in Rust.
fn custom_projections(spec: &Spec) -> Vec<Arc<dyn crate::plan::CustomProjection>> {
    spec.projections
        .iter()
        .filter_map(|p| match &p.kind {
            ProjectionKind::Custom(custom) => Some(custom.clone()),
            ProjectionKind::IndexKeys(_)
            | ProjectionKind::Denormalize(_)
            | ProjectionKind::InverseEdge(_)
            | ProjectionKind::Counter(_)
            | ProjectionKind::Recomputed(_) => None,
        })
        .collect()
}

/// A process's leases on one table: taken before the first write of a
/// definition, renewed before a batch that could outlast them.
#[derive(Debug)]
pub struct Leases {
    registry: Registry,
    spec: Arc<Spec>,
    consumer: bool,
    /// The consumer's name (`--consumer`), recorded with its spec.
    name: Option<String>,
    length: Duration,
    state: tokio::sync::Mutex<LeaseState>,
    /// The last change each projection applied, and when it was last
    /// recorded.
    applied: StdMutex<(HashMap<ProjectionId, Applied>, Option<std::time::Instant>)>,
}

#[derive(Debug, Default)]
struct LeaseState {
    /// Until when each projection's lease runs (ms), as this process wrote it.
    until: HashMap<ProjectionId, u64>,
    /// The spec's text is stored, and (for a writer that is not a stream
    /// consumer) the deployed definitions were checked.
    started: bool,
}

type LeaseKey = (String, u64, bool, Option<String>);

/// One attribute a renewal sets.
enum Set {
    /// A lease end: only ever moved later.
    Until(String),
    /// Set once: the first time.
    Since(String),
    /// A plain value.
    Text(String, String),
    /// The spec's projection names.
    Names(String),
}

impl Leases {
    /// The leases this process holds on `table` for `spec`'s definitions
    /// (one set per table, definition and role, shared by every applier).
    pub fn shared(
        client: &aws_sdk_dynamodb::Client,
        table: &str,
        spec: &Arc<Spec>,
        consumer: bool,
        name: Option<&str>,
        length: Duration,
    ) -> Arc<Leases> {
        static ALL: OnceLock<StdMutex<HashMap<LeaseKey, Arc<Leases>>>> = OnceLock::new();
        let key = (
            table.to_string(),
            spec.projections_fingerprint(),
            consumer,
            name.map(str::to_string),
        );
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .expect("leases lock");
        all.entry(key)
            .or_insert_with(|| {
                Arc::new(Leases {
                    registry: Registry::new(client.clone(), table, &spec.table),
                    spec: spec.clone(),
                    consumer,
                    name: name.map(str::to_string),
                    length,
                    state: tokio::sync::Mutex::new(LeaseState::default()),
                    applied: StdMutex::new((HashMap::new(), None)),
                })
            })
            .clone()
    }

    fn spec_key(&self) -> String {
        format!("spec#{}", hex(self.spec.projections_fingerprint()))
    }

    /// Notes the changes a stream consumer applied (projection, change
    /// time in ms), and records the latest of each in the registry at
    /// most every [`APPLIED_EVERY`] (for `status`). Only a consumer
    /// records: a backfill or replay applies old changes.
    pub async fn note_applied(&self, changes: &[(ProjectionId, i64)]) -> Result<(), ApplyError> {
        if !self.consumer || changes.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let due: Vec<(ProjectionId, Applied)> = {
            let mut board = self.applied.lock().expect("applied lock");
            for &(id, change_ms) in changes {
                let entry = board.0.entry(id).or_insert(Applied {
                    change_ms,
                    applied_ms: now,
                });
                if change_ms >= entry.change_ms {
                    *entry = Applied {
                        change_ms,
                        applied_ms: now,
                    };
                }
            }
            if board.1.is_some_and(|at| at.elapsed() < APPLIED_EVERY) {
                return Ok(());
            }
            board.1 = Some(std::time::Instant::now());
            board.0.iter().map(|(id, a)| (*id, *a)).collect()
        };
        // 4 KB of expression: 20 projections a request.
        for chunk in due.chunks(20) {
            let mut update = self
                .registry
                .client
                .update_item()
                .table_name(&self.registry.table)
                .set_key(Some(self.registry.key(APPLIED)));
            let mut parts = Vec::new();
            for (i, (id, applied)) in chunk.iter().enumerate() {
                let name = &self.spec.projections[*id].name;
                update = update
                    .expression_attribute_names(format!("#c{i}"), format!("c#{name}"))
                    .expression_attribute_names(format!("#a{i}"), format!("a#{name}"))
                    .expression_attribute_values(
                        format!(":c{i}"),
                        Av::N(applied.change_ms.to_string()),
                    )
                    .expression_attribute_values(
                        format!(":a{i}"),
                        Av::N(applied.applied_ms.to_string()),
                    );
                parts.push(format!("#c{i} = :c{i}, #a{i} = :a{i}"));
            }
            update
                .update_expression(format!("SET {}", parts.join(", ")))
                .send()
                .await
                .map_err(|e| self.registry.fatal("writing", e))?;
        }
        Ok(())
    }

    /// Makes sure this process may write `written` (a stream consumer:
    /// every projection) until `needed` (ms): a request only when its
    /// leases run out before. Returns until when it may write them.
    pub async fn ensure(&self, written: &[ProjectionId], needed: u64) -> Result<u64, String> {
        let ids: Vec<ProjectionId> = if self.consumer {
            (0..self.spec.projections.len()).collect()
        } else {
            written.to_vec()
        };
        let mut state = self.state.lock().await;
        let valid = |state: &LeaseState| {
            ids.iter()
                .map(|id| state.until.get(id).copied().unwrap_or(0))
                .min()
                .unwrap_or(u64::MAX)
        };
        if valid(&state) >= needed {
            return Ok(valid(&state));
        }
        let now = now_ms();
        // A lease taken anew (first, or after it ran out: a long replay
        // that wrote nothing of a counter for a while) is checked again:
        // a backfill may have completed, or another definition deployed,
        // while this process held none.
        let lapsed = ids
            .iter()
            .any(|id| state.until.get(id).copied().unwrap_or(0) < now);
        if !state.started {
            self.store_spec().await?;
        }
        if (!state.started || lapsed) && !self.consumer {
            self.check_deployed().await?;
        }
        if (!state.started || lapsed) && self.consumer {
            self.check_consumers().await?;
        }
        let until = needed.max(now) + self.length.as_millis() as u64;
        self.renew(&ids, until, now, !state.started || lapsed)
            .await?;
        if !state.started || lapsed {
            // Checked once the lease is held: a backfill that completes
            // later sees it (`complete` is fenced by the leases' version),
            // one that completed before is read here.
            self.check_layout().await?;
            state.started = true;
        }
        for &id in &ids {
            let entry = state.until.entry(id).or_insert(0);
            *entry = (*entry).max(until);
        }
        Ok(valid(&state))
    }

    /// Warns (a logged error and `projector_consumer_conflicts_total`)
    /// when another consumer's spec running on the table conflicts with
    /// this one's ([`Registry::consumer_conflicts`]). The batch goes on:
    /// refusing it would send records to the mapping's failure queue, and
    /// which of two consumers a refusal hit would depend on which was idle
    /// last. `run` refuses to start, and `check --table` (which
    /// `infra/deploy` runs) refuses the deploy.
    async fn check_consumers(&self) -> Result<(), String> {
        let conflicts = self
            .registry
            .consumer_conflicts(&self.spec, self.name.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        for conflict in &conflicts {
            tracing::error!(consumer = self.name.as_deref().unwrap_or(""), "{conflict}");
            metrics::counter!(
                "projector_consumer_conflicts_total",
                "consumer" => self.name.clone().unwrap_or_default()
            )
            .increment(1);
        }
        Ok(())
    }

    /// A writer that is not the stream's consumer (a backfill, a redrive,
    /// a recovery) refuses to write a definition other than the one a
    /// consumer is running now: its spec file is not the deployed one, and
    /// it would undo what the worker writes.
    async fn check_deployed(&self) -> Result<(), String> {
        let leases = self.registry.get(self.registry.key(LEASES)).await;
        let Some(item) = leases.map_err(|e| format!("reading the lifecycle leases: {e}"))? else {
            return Ok(());
        };
        let (records, _) = parse_leases(&item);
        let now = now_ms();
        for projection in &self.spec.projections {
            let f = hex(projection.fingerprint);
            let Some(record) = records.get(&projection.name) else {
                continue;
            };
            let running = record
                .definitions
                .iter()
                .filter(|d| d.fingerprint != f && d.fingerprint != WITHOUT)
                .filter(|d| d.consumed_until.is_some_and(|until| until >= now))
                .max_by_key(|d| d.consumed_until);
            let mine = record
                .definition(&f)
                .and_then(|d| d.consumed_until)
                .unwrap_or(0);
            if let Some(other) = running.filter(|d| d.consumed_until.unwrap_or(0) > mine) {
                return Err(format!(
                    "the deployed worker runs another definition of `{}` ({}, lease until {}) than {} ({f}): writing this one would undo its work; use the deployed spec",
                    projection.name,
                    other.fingerprint,
                    iso(other.consumed_until.unwrap_or(0)),
                    self.spec.file
                ));
            }
        }
        Ok(())
    }

    /// A writer whose counters are not where the registry's layout puts
    /// them (a spec from its file, not from [`Registry::layout`]) would
    /// write a changed definition over the version readers read: refused.
    async fn check_layout(&self) -> Result<(), String> {
        let (laid, _) = self
            .registry
            .layout(&self.spec)
            .await
            .map_err(|error| format!("reading the counters' layout: {error}"))?;
        for (id, projection) in self.spec.projections.iter().enumerate() {
            let ProjectionKind::Counter(mine) = &projection.kind else {
                continue;
            };
            if self.spec.is_old_version(id) {
                continue;
            }
            let Some(ProjectionKind::Counter(wanted)) = laid
                .projection_id(&projection.name)
                .map(|id| &laid.projections[id].kind)
            else {
                continue;
            };
            if wanted.storage != mine.storage {
                layout_is_stale(&self.registry.table).await;
                return Err(format!(
                    "counter `{}` of {} would write under `{}`, but its versions are laid out for `{}` (a changed counter is built beside the version readers read): lay the spec out with `control::Registry::layout` (the CLI, the Lambda and the runner do)",
                    projection.name, self.spec.file, mine.storage, wanted.storage
                ));
            }
        }
        Ok(())
    }

    async fn store_spec(&self) -> Result<(), String> {
        let text = toml::to_string(&self.spec.raw)
            .map_err(|e| format!("cannot serialize the spec for the lifecycle registry: {e}"))?;
        let mut item = self.registry.key(&self.spec_key());
        item.insert("text".to_string(), Av::S(text));
        item.insert("file".to_string(), Av::S(self.spec.file.clone()));
        let sent = self
            .registry
            .client
            .put_item()
            .table_name(&self.registry.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#t)")
            .expression_attribute_names("#t", "text")
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(error) if is_condition_failure(&error) => Ok(()),
            Err(error) => Err(format!(
                "storing the spec in the lifecycle registry: {}",
                retry_describe(&error)
            )),
        }
    }

    /// Updates of the leases item; a lease end only ever moves later,
    /// whichever process of the same definition writes last.
    /// Moves the leases of `ids` to `until`; `anew` (a lease taken first
    /// or after it ran out, which a layout check follows) also moves the
    /// leases' version, which completions are fenced by.
    async fn renew(
        &self,
        ids: &[ProjectionId],
        until: u64,
        now: u64,
        anew: bool,
    ) -> Result<(), String> {
        let mut sets: Vec<Set> = Vec::new();
        let spec_key = self.spec_key();
        for &id in ids {
            let projection = &self.spec.projections[id];
            let [w, c, s, d] = lease_names(&hex(projection.fingerprint), &projection.name);
            sets.push(Set::Until(w));
            sets.push(Set::Text(d, spec_key.clone()));
            sets.push(Set::Text(
                format!("k#{}", projection.name),
                projection.kind_name().to_string(),
            ));
            if self.consumer {
                sets.push(Set::Until(c));
                sets.push(Set::Since(s));
            }
        }
        if self.consumer && !self.spec.projections.is_empty() {
            // A named consumer's run of a spec is its own (`<fp>@<name>`):
            // when it first ran it, and until when.
            let mut fingerprint = hex(self.spec.projections_fingerprint());
            if let Some(name) = &self.name {
                fingerprint = format!("{fingerprint}@{name}");
            }
            sets.push(Set::Until(format!("C#{fingerprint}")));
            sets.push(Set::Since(format!("S#{fingerprint}")));
            sets.push(Set::Names(format!("N#{fingerprint}")));
        }
        // Expressions are limited to 4 KB: 20 attributes per request.
        for chunk in sets.chunks(20) {
            let mut skip: Vec<bool> = vec![false; chunk.len()];
            for _attempt in 0..4 {
                let mut update = self
                    .registry
                    .client
                    .update_item()
                    .table_name(&self.registry.table)
                    .set_key(Some(self.registry.key(LEASES)))
                    .return_values_on_condition_check_failure(
                        aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
                    );
                let mut parts = Vec::new();
                let mut conditions = Vec::new();
                let (mut uses_until, mut uses_now) = (false, false);
                for (i, set) in chunk.iter().enumerate() {
                    if skip[i] {
                        continue;
                    }
                    let name = match set {
                        Set::Until(name) | Set::Since(name) | Set::Names(name) => name,
                        Set::Text(name, _) => name,
                    };
                    update = update.expression_attribute_names(format!("#a{i}"), name);
                    match set {
                        Set::Until(_) => {
                            uses_until = true;
                            parts.push(format!("#a{i} = :until"));
                            conditions
                                .push(format!("(attribute_not_exists(#a{i}) OR #a{i} < :until)"));
                        }
                        Set::Since(_) => {
                            uses_now = true;
                            parts.push(format!("#a{i} = if_not_exists(#a{i}, :now)"));
                        }
                        Set::Text(_, value) => {
                            update = update.expression_attribute_values(
                                format!(":v{i}"),
                                Av::S(value.clone()),
                            );
                            parts.push(format!("#a{i} = :v{i}"));
                        }
                        Set::Names(_) => {
                            let names: Vec<String> = self
                                .spec
                                .projections
                                .iter()
                                .map(|p| p.name.clone())
                                .collect();
                            update =
                                update.expression_attribute_values(format!(":v{i}"), Av::Ss(names));
                            parts.push(format!("#a{i} = :v{i}"));
                        }
                    }
                }
                if parts.is_empty() {
                    break;
                }
                if uses_until {
                    update = update.expression_attribute_values(":until", Av::N(until.to_string()));
                }
                if uses_now {
                    update = update.expression_attribute_values(":now", Av::N(now.to_string()));
                }
                if !conditions.is_empty() {
                    update = update.condition_expression(conditions.join(" AND "));
                }
                let update = if anew {
                    update
                        .update_expression(format!("SET {} ADD #ver :one", parts.join(", ")))
                        .expression_attribute_names("#ver", LEASES_VERSION)
                        .expression_attribute_values(":one", Av::N("1".to_string()))
                } else {
                    update.update_expression(format!("SET {}", parts.join(", ")))
                };
                match update.send().await {
                    Ok(_) => break,
                    Err(error) if is_condition_failure(&error) => {
                        // Another process of the same definition holds a
                        // later end for some of them: those stay.
                        let old = error.as_service_error().and_then(|e| match e {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(e) => e.item().cloned(),
                            _ => None,
                        });
                        let old = match old {
                            Some(item) => item,
                            None => self
                                .registry
                                .client
                                .get_item()
                                .table_name(&self.registry.table)
                                .set_key(Some(self.registry.key(LEASES)))
                                .consistent_read(true)
                                .send()
                                .await
                                .map_err(|e| {
                                    format!("reading the lifecycle leases: {}", retry_describe(&e))
                                })?
                                .item()
                                .cloned()
                                .unwrap_or_default(),
                        };
                        for (i, set) in chunk.iter().enumerate() {
                            if let Set::Until(name) = set {
                                if number(&old, name).is_some_and(|existing| existing >= until) {
                                    skip[i] = true;
                                }
                            }
                        }
                    }
                    Err(error) => {
                        return Err(format!(
                            "renewing the lifecycle lease on {}: {}",
                            self.registry.table,
                            retry_describe(&error)
                        ))
                    }
                }
            }
        }
        metrics::counter!("projector_lease_renewals_total").increment(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::status::add_without;
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
