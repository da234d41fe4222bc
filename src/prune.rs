//! Prune: delete what a retired projection (in the table, no longer in the
//! spec) derived, so that the table holds only what the spec computes.
//!
//! The retired definition comes from the lifecycle registry's copy of the
//! spec that last ran it (or a spec file given). One scan of the table, in
//! parallel segments, page by page (memory does not grow with the table),
//! decides for each item ([`actions`]):
//!
//! - a **counter**'s shard items (`COUNTER#<name>#…`) and own markers
//!   (`_ddbp#count#<name>#…`) are deleted, and its record is removed from
//!   the `_ddbp#c` map of any item (a reverse edge it rode on);
//! - an **inverse edge**'s reverse items are deleted, unless the current
//!   spec derives the same items (a renamed projection) or one carries
//!   records of a current counter;
//! - an **index-keys** or **denormalize** projection's attributes are
//!   removed from its items, except those the current spec derives there.
//!
//! Every write is conditional on what the scan read (an item deleted only
//! if its records are unchanged; attributes removed only from an item that
//! still exists), so a page redone after a crash changes nothing more. The
//! progress of each segment is checkpointed under the prune's run
//! (`_ddbp#prune`, sort key `<scope>#<run>#<segment>/<total>`, the scope
//! naming the projections and their retired definitions: [`scope`]),
//! so `prune --resume` (or `--run NAME` again) continues it; a prune
//! without them starts from the beginning, so one run after a writer of
//! the projection ran again scans everything again. When every segment is
//! done, the projection's dead letters and registry entries go too, unless
//! a writer of it ran meanwhile (then the prune says so and keeps them).

use std::collections::{BTreeSet, HashMap};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity, Select};
use serde::Serialize;

use crate::apply::ApplyError;
use crate::backfill::Pacer;
use crate::control::{Registry, WITHOUT};
use crate::dynamo::names::{
    CHANGES_ATTRIBUTE, COUNTER_MARKER_PREFIX, COUNT_ATTRIBUTE, PRUNE_PK, RECORDS_ATTRIBUTE,
};
use crate::dynamo::retry::{describe as retry_describe, Retrier, PRUNE_TRANSACTIONS};
use crate::dynamo::time::now_ms;
use crate::kinds::{Pruning, Writes};
use crate::record::ItemKey;
use crate::spec::Spec;

pub use crate::dynamo::names::PRUNE_PK as PROGRESS_PK;

/// The retired projections `names` to prune from `c`'s table, each with
/// the spec that defined it: `from` (a spec file given), else the
/// registry's copy of the spec that last ran it. Refuses (an error
/// saying what to do) a projection still in the spec `spec_source` names, an
/// old version readers still read, one another consumer runs, one a
/// writer still holds a lease on, and one the registry knows no
/// definition of.
pub async fn retired(
    c: &crate::control::Connection,
    spec_source: &str,
    names: &[String],
    from: Option<Arc<Spec>>,
) -> anyhow::Result<Vec<Retired>> {
    let registry = c.registry();
    let snapshot = registry.snapshot(&c.spec).await?;
    let retired_known: Vec<&str> = snapshot
        .records
        .iter()
        .filter(|(name, record)| {
            c.spec.projection_id(name).is_none()
                && record.definitions.iter().any(|d| d.fingerprint != WITHOUT)
        })
        .map(|(name, _)| name.as_str())
        .collect();
    let now = now_ms();
    let mut retired = Vec::new();
    for name in names {
        if let Some(id) = c.spec.projection_id(name) {
            if c.spec.is_old_version(id) {
                anyhow::bail!(
                    "`{name}` is what readers read while `{}` is rebuilt: it is pruned once that backfill completes and the workers have dropped it (`status` says when)",
                    crate::spec::old_version_of(name).map_or("", |(base, _)| base)
                );
            }
            anyhow::bail!(
                "`{name}` is in {}: prune removes what a retired projection derived; remove it from the spec and deploy first",
                spec_source
            );
        }
        if snapshot.owned_by_other(name, c.consumer.as_deref()) {
            anyhow::bail!(
                "`{name}` is run by consumer `{}`, not this one: it is that deployment's to retire and prune (with its spec and --consumer)",
                snapshot.owner(name).unwrap_or_default()
            );
        }
        let record = snapshot.record(name);
        if let Some(writer) = record
            .definitions
            .iter()
            .filter(|d| d.fingerprint != WITHOUT)
            .find(|d| d.writes_until >= now)
        {
            anyhow::bail!(
                "a writer of `{name}` (definition {}) holds a lease until {}: deploy a spec without it first (or wait for the old workers to stop), then prune",
                writer.fingerprint,
                crate::control::iso(writer.writes_until)
            );
        }
        let spec = match &from {
            Some(spec) => spec.clone(),
            None => {
                let latest = record
                    .definitions
                    .iter()
                    .filter(|d| d.fingerprint != WITHOUT)
                    .filter_map(|d| d.spec_key.as_ref().map(|key| (d.writes_until, key)))
                    .max();
                let Some((_, key)) = latest else {
                    anyhow::bail!(
                        "the lifecycle registry of {} knows no definition of `{name}` (retired projections it knows: {}); give the spec that had it with --from-spec",
                        c.table,
                        if retired_known.is_empty() { "none".to_string() } else { retired_known.join(", ") }
                    );
                };
                let Some(text) = registry.spec_text(key).await? else {
                    anyhow::bail!("the lifecycle registry lost the spec text `{key}` that defined `{name}`: give it with --from-spec");
                };
                let label = format!("the registry's copy of the spec that last ran `{name}`");
                match crate::spec::Spec::from_toml(&text, &label) {
                    Ok(spec) => std::sync::Arc::new(spec),
                    Err(errors) => anyhow::bail!("{errors}"),
                }
            }
        };
        retired.push(crate::prune::Retired::new(name, spec).map_err(anyhow::Error::msg)?);
    }
    Ok(retired)
}

/// A retired projection and the spec that defined it.
#[derive(Debug, Clone)]
pub struct Retired {
    /// The projection's name.
    pub name: String,
    /// A compiled spec that has it.
    pub spec: Arc<Spec>,
}

impl Retired {
    /// `name` as defined in `spec`; an error names what is missing.
    pub fn new(name: &str, spec: Arc<Spec>) -> Result<Retired, String> {
        let Some(id) = spec.projection_id(name) else {
            return Err(format!("{} has no projection `{name}`", spec.file));
        };
        if let Pruning::Refuse(why) = spec.kind(id).pruning(name) {
            return Err(why);
        }
        Ok(Retired {
            name: name.to_string(),
            spec,
        })
    }

    /// What pruning it does (see [`Pruning`]).
    fn pruning(&self) -> Pruning {
        let id = self.spec.projection_id(&self.name).expect("checked");
        self.spec.kind(id).pruning(&self.name)
    }
}

/// How to prune.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Count, write nothing.
    pub dry_run: bool,
    /// Consumed write capacity per second to stay under.
    pub max_wcu: Option<f64>,
    /// Consumed read capacity per second (its scan's) to stay under.
    pub max_rcu: Option<f64>,
    /// Scan segments in parallel.
    pub segments: u32,
    /// Items per scan page.
    pub page_size: i32,
    /// A progress bar (terminal) or a log line every 5 seconds.
    pub progress: bool,
    /// The run whose progress this prune keeps (`None`: one of its own,
    /// kept under no name).
    pub run: Option<String>,
    /// Continue from the progress stored under `run` (else start from
    /// the beginning).
    pub resume: bool,
    /// When the run first started (ms; `None`: now): a writer of a pruned
    /// projection that ran since, even while no process pruned, may have
    /// written into segments already done, so the projection is not
    /// forgotten.
    pub started_ms: Option<u64>,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            dry_run: false,
            max_wcu: None,
            max_rcu: None,
            segments: 4,
            page_size: 200,
            progress: true,
            run: None,
            resume: false,
            started_ms: None,
        }
    }
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneSummary {
    /// Items scanned.
    pub scanned: u64,
    /// Items deleted (shards, markers, reverse items).
    pub deleted_items: u64,
    /// Items whose derived attributes were removed.
    pub stripped_items: u64,
    /// Counter records removed from items that stay.
    pub removed_records: u64,
    /// Items left in place, and why (the first 20).
    pub kept: Vec<String>,
    /// How many were left in place.
    pub kept_count: u64,
    /// Dead letters of the pruned projections removed.
    pub dead_letters: u64,
    /// Write capacity consumed.
    pub write_units: f64,
    /// Projections the registry forgot (pruned completely).
    pub forgotten: Vec<String>,
    /// Wall time.
    pub seconds: f64,
}

/// One write a prune makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Delete the item, if its counter records are still `records`.
    Delete {
        /// The item.
        key: ItemKey,
        /// Its `_ddbp#c` map as read (`None`: it had none).
        records: Option<HashMap<String, Av>>,
    },
    /// Remove these attributes, if the item still exists.
    Strip {
        /// The item.
        key: ItemKey,
        /// The attributes.
        attributes: Vec<String>,
    },
    /// Remove one counter's record from the item's `_ddbp#c` map.
    RemoveRecord {
        /// The item.
        key: ItemKey,
        /// The counter.
        counter: String,
    },
    /// Leave the item; why.
    Keep(String),
}

fn text<'a>(item: &'a HashMap<String, Av>, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(Av::S(text)) => Some(text),
        _ => None,
    }
}

/// The attributes `spec` derives on items of the entity this key matches.
fn derived_here(spec: &Spec, pk: &str, sk: Option<&str>) -> (BTreeSet<String>, bool) {
    let mut vars = Vec::new();
    let Some(entity) = spec.match_entity(pk, sk, &mut vars) else {
        return (BTreeSet::new(), false);
    };
    let mut names = BTreeSet::new();
    let mut reverse_item = false;
    for (id, projection) in spec.projections.iter().enumerate() {
        if let Writes::Items { entity: on, copy } = spec.kind(id).writes(&projection.name) {
            if on == entity {
                reverse_item = true;
                names.extend(copy);
            }
        }
        if let Some((on, written)) = crate::kinds::written_attributes(spec, id) {
            if on == entity {
                names.extend(written);
            }
        }
    }
    (names, reverse_item)
}

/// What pruning `retired` does to one scanned item of a table whose spec is
/// now `current` (pure).
pub fn actions(current: &Spec, retired: &[Retired], item: &HashMap<String, Av>) -> Vec<Action> {
    let table = &current.table;
    let Some(pk) = text(item, &table.partition_key) else {
        return Vec::new();
    };
    let sk = table.sort_key.as_ref().and_then(|name| text(item, name));
    let key = ItemKey {
        pk: pk.to_string(),
        sk: sk.map(str::to_string),
    };
    let records = match item.get(RECORDS_ATTRIBUTE) {
        Some(Av::M(map)) => Some(map.clone()),
        _ => None,
    };
    // Records carry a counter's storage name.
    let retired_names: BTreeSet<String> = retired
        .iter()
        .filter_map(|r| match r.pruning() {
            Pruning::Storage(storage) => Some(storage),
            Pruning::Strip { .. } | Pruning::DeleteItems { .. } | Pruning::Refuse(_) => None,
        })
        .collect();
    let (kept_names, derived_reverse) = derived_here(current, pk, sk);
    let mut out = Vec::new();
    let mut strip: BTreeSet<String> = BTreeSet::new();
    for r in retired {
        match r.pruning() {
            Pruning::Storage(storage) => {
                if pk.starts_with(&format!("COUNTER#{storage}#"))
                    || pk.starts_with(&format!("{COUNTER_MARKER_PREFIX}{storage}#"))
                {
                    return vec![Action::Delete {
                        key: key.clone(),
                        records: records.clone(),
                    }];
                }
                if records.as_ref().is_some_and(|m| m.contains_key(&storage)) {
                    out.push(Action::RemoveRecord {
                        key: key.clone(),
                        counter: storage,
                    });
                }
            }
            Pruning::DeleteItems { entity, copy } => {
                let mut vars = Vec::new();
                if r.spec.match_entity(pk, sk, &mut vars) != Some(entity) {
                    continue;
                }
                // The current spec derives this reverse item too (a renamed
                // edge, another edge onto the same entity): only the copies
                // it does not derive go.
                if derived_reverse {
                    strip.extend(copy.iter().cloned());
                    continue;
                }
                // Records of a storage no current counter writes (a
                // generation readers left, or one its old version could not
                // be kept current in) go with the item, their shards as
                // they are: nothing writes or will write them again.
                let others: Vec<&String> = records
                    .iter()
                    .flat_map(|m| m.keys())
                    .filter(|name| !retired_names.contains(*name))
                    .filter(|name| {
                        current.counter_by_storage(name).is_some() || current.frozen.contains(name)
                    })
                    .collect();
                if let Some(counter) = others.first() {
                    strip.extend(copy.iter().cloned());
                    out.push(Action::Keep(format!(
                        "{} {}: holds records of counter `{counter}` (backfill it first: its records then move to markers of its own)",
                        key.pk,
                        key.sk.as_deref().unwrap_or("")
                    )));
                    continue;
                }
                // The whole item goes: records removed before would make
                // its condition fail.
                return vec![Action::Delete {
                    key: key.clone(),
                    records: records.clone(),
                }];
            }
            Pruning::Strip { entity, attributes } => {
                let mut vars = Vec::new();
                if r.spec.match_entity(pk, sk, &mut vars) == Some(entity) {
                    strip.extend(attributes);
                }
            }
            Pruning::Refuse(_) => {}
        }
    }
    let attributes: Vec<String> = strip
        .into_iter()
        .filter(|name| item.contains_key(name) && !kept_names.contains(name))
        .filter(|name| !table.is_key_attribute(name))
        .collect();
    if !attributes.is_empty() {
        out.push(Action::Strip { key, attributes });
    }
    out
}

struct Run<'a> {
    client: &'a aws_sdk_dynamodb::Client,
    table: &'a str,
    current: &'a Spec,
    retired: &'a [Retired],
    options: &'a PruneOptions,
    scope: String,
    pacer: Pacer,
    /// Paces the scan's reads (`max_rcu`).
    read_pacer: Pacer,
    scanned: AtomicU64,
    deleted: AtomicU64,
    stripped: AtomicU64,
    records: AtomicU64,
    kept: std::sync::Mutex<(u64, Vec<String>)>,
    write_micro: AtomicU64,
}

/// What a prune of `retired` from `table` works on, as its progress and
/// its run's pointer name it: the table, the projections (sorted) and a
/// hash of their retired definitions, so that a prune of another
/// definition (`--from-spec`) never continues this one's progress.
pub fn scope(table: &str, retired: &[Retired]) -> String {
    let mut definitions: Vec<(&str, u64)> = retired
        .iter()
        .map(|r| {
            let id = r.spec.projection_id(&r.name).expect("checked");
            (r.name.as_str(), r.spec.projections[id].fingerprint)
        })
        .collect();
    definitions.sort_unstable();
    let hash = definitions
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, (name, fingerprint)| {
            name.bytes()
                .map(u64::from)
                .chain([0xff, *fingerprint])
                .fold(hash, |h, x| (h ^ x).wrapping_mul(0x0000_0100_0000_01b3))
        });
    let names: Vec<&str> = definitions.iter().map(|(name, _)| *name).collect();
    format!("{table}#{}#{hash:016x}", names.join(","))
}

/// Why pruning `retired` from `table`, whose spec is now `current`, is
/// refused before anything is written, if it is.
pub fn refusal(table: &str, current: &Spec, retired: &[Retired]) -> Result<(), ApplyError> {
    // A counter's old version whose storage a current counter writes (the
    // counter was rolled back to it, or rebuilt there since) is that
    // counter's data now: nothing of it is retired.
    for r in retired {
        if let Pruning::Storage(storage) = r.pruning() {
            if let Some(id) = current.counter_by_storage(&storage) {
                return Err(ApplyError::Fatal {
                    table: table.to_string(),
                    message: format!(
                        "`{}` kept its shards and records under `{}`, where `{}` of the current spec keeps its own now: pruning it would delete them; there is nothing of `{}` to prune",
                        r.name, storage, current.projections[id].name, r.name
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Prunes `retired` from `table`, whose spec is now `current`.
pub async fn prune(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    current: &Spec,
    retired: &[Retired],
    options: &PruneOptions,
) -> Result<PruneSummary, ApplyError> {
    refusal(table, current, retired)?;
    let started = Instant::now();
    let started_ms = options.started_ms.unwrap_or_else(now_ms);
    let names: Vec<&str> = retired.iter().map(|r| r.name.as_str()).collect();

    let run = Run {
        client,
        table,
        current,
        retired,
        options,
        scope: match &options.run {
            Some(run) => format!("{}#{run}", scope(table, retired)),
            None => scope(table, retired),
        },
        pacer: Pacer::new(options.max_wcu),
        read_pacer: Pacer::new(options.max_rcu),
        scanned: AtomicU64::new(0),
        deleted: AtomicU64::new(0),
        stripped: AtomicU64::new(0),
        records: AtomicU64::new(0),
        kept: std::sync::Mutex::new((0, Vec::new())),
        write_micro: AtomicU64::new(0),
    };
    let total = options.segments.max(1);
    let bar = (options.progress && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} prune {msg} [{elapsed_precise}] {pos} items scanned ({per_sec})",
            )
            .expect("a valid template"),
        );
        bar.set_message(names.join(", "));
        bar
    });
    let run_ref = &run;
    let bar_ref = bar.as_ref();
    let segments = futures::future::join_all(
        (0..total).map(|segment| async move { run_ref.segment(segment, total, bar_ref).await }),
    );
    let ticker = async {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if bar.is_none() && options.progress {
                tracing::info!(
                    scanned = run.scanned.load(Ordering::Relaxed),
                    deleted = run.deleted.load(Ordering::Relaxed),
                    stripped = run.stripped.load(Ordering::Relaxed),
                    "prune progress"
                );
            }
        }
    };
    let results = tokio::select! {
        results = segments => results,
        _ = ticker => unreachable!("the ticker never ends"),
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    for result in results {
        result?;
    }
    let (kept_count, kept) = run.kept.lock().expect("kept lock").clone();
    let mut summary = PruneSummary {
        scanned: run.scanned.load(Ordering::Relaxed),
        deleted_items: run.deleted.load(Ordering::Relaxed),
        stripped_items: run.stripped.load(Ordering::Relaxed),
        removed_records: run.records.load(Ordering::Relaxed),
        kept,
        kept_count,
        write_units: run.write_micro.load(Ordering::Relaxed) as f64 / 1e6,
        ..PruneSummary::default()
    };
    if !options.dry_run {
        summary.dead_letters = run.remove_dead_letters().await?;
        // Every segment is done: forget the projections, unless a writer of
        // one ran while the scan did (its items may be back).
        let registry = Registry::new(client.clone(), table, &current.table);
        let snapshot = registry.snapshot(current).await?;
        for r in retired {
            let record = snapshot.record(&r.name);
            let late = record
                .definitions
                .iter()
                .filter(|d| d.fingerprint != WITHOUT)
                .find(|d| d.writes_until >= started_ms);
            match late {
                Some(d) => tracing::warn!(
                    projection = %r.name,
                    definition = %d.fingerprint,
                    "a writer of the projection ran during the prune: what it wrote may be back; deploy a spec without it and prune again"
                ),
                None => {
                    registry.forget(&r.name, &record).await?;
                    summary.forgotten.push(r.name.clone());
                }
            }
        }
        // Every segment is done: the run's progress is not needed (a
        // prune run again, after a late writer, scans from the beginning).
        run.clear_progress().await?;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        scanned = summary.scanned,
        deleted = summary.deleted_items,
        stripped = summary.stripped_items,
        records = summary.removed_records,
        kept = summary.kept_count,
        "prune finished"
    );
    Ok(summary)
}

impl Run<'_> {
    fn fatal(&self, what: &str, error: impl std::error::Error + 'static) -> ApplyError {
        ApplyError::Fatal {
            table: self.table.to_string(),
            message: format!("prune: {what}: {}", retry_describe(&error)),
        }
    }

    fn progress_key(&self, segment: u32, total: u32) -> HashMap<String, Av> {
        let table = &self.current.table;
        let sk = format!("{}#{segment}/{total}", self.scope);
        let mut key = HashMap::new();
        match &table.sort_key {
            Some(name) => {
                key.insert(table.partition_key.clone(), Av::S(PRUNE_PK.to_string()));
                key.insert(name.clone(), Av::S(sk));
            }
            None => {
                key.insert(
                    table.partition_key.clone(),
                    Av::S(format!("{PRUNE_PK}#{sk}")),
                );
            }
        }
        key
    }

    /// The segment's checkpoint: `None` when done, else where to start.
    async fn checkpoint(
        &self,
        segment: u32,
        total: u32,
    ) -> Result<Option<Option<HashMap<String, Av>>>, ApplyError> {
        if self.options.dry_run || !self.options.resume {
            return Ok(Some(None));
        }
        let output = self
            .client
            .get_item()
            .table_name(self.table)
            .set_key(Some(self.progress_key(segment, total)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.fatal("reading its progress", e))?;
        let Some(item) = output.item() else {
            return Ok(Some(None));
        };
        if matches!(item.get("done"), Some(Av::Bool(true))) {
            return Ok(None);
        }
        Ok(Some(match item.get("lastKey") {
            Some(Av::M(key)) => Some(key.clone()),
            _ => None,
        }))
    }

    async fn save(
        &self,
        segment: u32,
        total: u32,
        last_key: Option<&HashMap<String, Av>>,
    ) -> Result<(), ApplyError> {
        if self.options.dry_run {
            return Ok(());
        }
        let mut item = self.progress_key(segment, total);
        item.insert("done".to_string(), Av::Bool(last_key.is_none()));
        if let Some(key) = last_key {
            item.insert("lastKey".to_string(), Av::M(key.clone()));
        }
        self.client
            .put_item()
            .table_name(self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| self.fatal("saving its progress", e))?;
        Ok(())
    }

    /// Deletes the run's progress: every segment's, whatever number of
    /// segments an earlier attempt of the run scanned in (on a table
    /// without a sort key, only this attempt's, which a query cannot
    /// list).
    async fn clear_progress(&self) -> Result<(), ApplyError> {
        if let Some(sk) = &self.current.table.sort_key {
            let pk = &self.current.table.partition_key;
            let mut start = None;
            loop {
                let page = self
                    .client
                    .query()
                    .table_name(self.table)
                    .key_condition_expression("#pk = :pk AND begins_with(#sk, :scope)")
                    .expression_attribute_names("#pk", pk)
                    .expression_attribute_names("#sk", sk)
                    .expression_attribute_values(":pk", Av::S(PRUNE_PK.to_string()))
                    .expression_attribute_values(":scope", Av::S(format!("{}#", self.scope)))
                    .projection_expression("#pk, #sk")
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| self.fatal("listing its progress", e))?;
                for key in page.items() {
                    self.client
                        .delete_item()
                        .table_name(self.table)
                        .set_key(Some(key.clone()))
                        .send()
                        .await
                        .map_err(|e| self.fatal("clearing its progress", e))?;
                }
                match page.last_evaluated_key() {
                    Some(key) if !key.is_empty() => start = Some(key.clone()),
                    _ => return Ok(()),
                }
            }
        }
        let total = self.options.segments.max(1);
        for segment in 0..total {
            self.client
                .delete_item()
                .table_name(self.table)
                .set_key(Some(self.progress_key(segment, total)))
                .send()
                .await
                .map_err(|e| self.fatal("clearing its progress", e))?;
        }
        Ok(())
    }

    async fn segment(
        &self,
        segment: u32,
        total: u32,
        bar: Option<&indicatif::ProgressBar>,
    ) -> Result<(), ApplyError> {
        let Some(mut start) = self.checkpoint(segment, total).await? else {
            return Ok(());
        };
        loop {
            let mut scan = self
                .client
                .scan()
                .table_name(self.table)
                .select(Select::AllAttributes)
                .limit(self.options.page_size)
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .set_exclusive_start_key(start.take());
            if total > 1 {
                scan = scan.segment(segment as i32).total_segments(total as i32);
            }
            let page = scan.send().await.map_err(|e| self.fatal("scanning", e))?;
            let read = page
                .consumed_capacity()
                .and_then(|c| c.capacity_units())
                .unwrap_or(0.0);
            self.read_pacer.consume(read).await;
            let items = page.items();
            self.scanned
                .fetch_add(items.len() as u64, Ordering::Relaxed);
            if let Some(bar) = bar {
                bar.inc(items.len() as u64);
            }
            for item in items {
                for action in actions(self.current, self.retired, item) {
                    self.apply(action).await?;
                }
            }
            let next = page.last_evaluated_key().filter(|k| !k.is_empty());
            self.save(segment, total, next).await?;
            match next {
                Some(key) => start = Some(key.clone()),
                None => return Ok(()),
            }
        }
    }

    fn keep(&self, why: String) {
        let mut kept = self.kept.lock().expect("kept lock");
        kept.0 += 1;
        if kept.1.len() < 20 {
            kept.1.push(why);
        }
    }

    fn key_map(&self, key: &ItemKey) -> HashMap<String, Av> {
        let table = &self.current.table;
        let mut map = HashMap::new();
        map.insert(table.partition_key.clone(), Av::S(key.pk.clone()));
        if let (Some(name), Some(sk)) = (&table.sort_key, &key.sk) {
            map.insert(name.clone(), Av::S(sk.clone()));
        }
        map
    }

    /// The shards of the records in `map` whose storage neither a current
    /// counter nor a retired one has.
    fn dead_records<'m>(
        &'m self,
        map: &'m HashMap<String, Av>,
    ) -> impl Iterator<Item = &'m str> + 'm {
        map.iter()
            .filter(|(name, _)| {
                self.current.counter_by_storage(name).is_none()
                    && !self.current.frozen.contains(name)
                    && !self
                        .retired
                        .iter()
                        .any(|r| matches!(r.pruning(), Pruning::Storage(s) if &s == *name))
            })
            .filter_map(|(_, shard)| match shard {
                Av::S(shard) => Some(shard.as_str()),
                _ => None,
            })
    }

    async fn apply(&self, action: Action) -> Result<(), ApplyError> {
        let counter = match &action {
            Action::Delete { .. } => &self.deleted,
            Action::Strip { .. } => &self.stripped,
            Action::RemoveRecord { .. } => &self.records,
            Action::Keep(why) => {
                self.keep(why.clone());
                return Ok(());
            }
        };
        if self.options.dry_run {
            counter.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let pk = &self.current.table.partition_key;
        let sent = match action {
            Action::Delete {
                key,
                records: Some(map),
            } if self.dead_records(&map).next().is_some() => {
                // Records of a generation no counter of either spec writes
                // (one readers left, or a rebuild rolled back) go with
                // their counts, as a worker drops them: an abandoned
                // rebuild's generation is written again by the next one.
                use aws_sdk_dynamodb::types::{Delete, TransactWriteItem, Update};
                let mut items = vec![TransactWriteItem::builder()
                    .delete(
                        Delete::builder()
                            .table_name(self.table)
                            .set_key(Some(self.key_map(&key)))
                            .condition_expression("#c = :c")
                            .expression_attribute_names("#c", RECORDS_ATTRIBUTE)
                            .expression_attribute_values(":c", Av::M(map.clone()))
                            .build()
                            .expect("table, key and condition are set"),
                    )
                    .build()];
                let mut shards: Vec<&str> = self.dead_records(&map).collect();
                shards.sort_unstable();
                let mut counted: Vec<(&str, i64)> = Vec::new();
                for shard in shards {
                    match counted.last_mut() {
                        Some((last, n)) if *last == shard => *n -= 1,
                        _ => counted.push((shard, -1)),
                    }
                }
                for (shard, delta) in counted {
                    items.push(
                        TransactWriteItem::builder()
                            .update(
                                Update::builder()
                                    .table_name(self.table)
                                    .set_key(Some(self.key_map(&self.current.shard_item(shard))))
                                    .update_expression("ADD #n :d, #m :one")
                                    .expression_attribute_names("#n", COUNT_ATTRIBUTE)
                                    .expression_attribute_names("#m", CHANGES_ATTRIBUTE)
                                    .expression_attribute_values(":d", Av::N(delta.to_string()))
                                    .expression_attribute_values(":one", Av::N("1".to_string()))
                                    .build()
                                    .expect("table, key and expression are set"),
                            )
                            .build(),
                    );
                }
                // Only the item's own condition failing means it changed;
                // a conflict with a worker moving the same shards, or
                // throttling, is tried again.
                let mut retrier = Retrier::scheduled(PRUNE_TRANSACTIONS);
                loop {
                    let sent = self
                        .client
                        .transact_write_items()
                        .set_transact_items(Some(items.clone()))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await;
                    let error = match sent {
                        Ok(o) => {
                            break Ok(Some(
                                o.consumed_capacity()
                                    .iter()
                                    .filter_map(|c| c.capacity_units())
                                    .sum::<f64>(),
                            ))
                        }
                        Err(error) => error,
                    };
                    let reasons = match error.as_service_error() {
                        Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) => c.cancellation_reasons().to_vec(),
                        _ => Vec::new(),
                    };
                    if reasons
                        .first()
                        .and_then(|r| r.code())
                        .is_some_and(|code| code == "ConditionalCheckFailed")
                    {
                        break Err((true, self.fatal("deleting", error)));
                    }
                    if reasons.is_empty() || !retrier.wait(|_| {}).await {
                        break Err((false, self.fatal("deleting", error)));
                    }
                }
            }
            Action::Delete { key, records } => {
                let request = self
                    .client
                    .delete_item()
                    .table_name(self.table)
                    .set_key(Some(self.key_map(&key)))
                    .expression_attribute_names("#c", RECORDS_ATTRIBUTE)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                let request = match records {
                    Some(map) => request
                        .condition_expression("#c = :c")
                        .expression_attribute_values(":c", Av::M(map)),
                    None => request.condition_expression("attribute_not_exists(#c)"),
                };
                request
                    .send()
                    .await
                    .map(|o| o.consumed_capacity().and_then(|c| c.capacity_units()))
                    .map_err(|e| {
                        let condition = crate::dynamo::retry::is_condition_failure(&e);
                        (condition, self.fatal("deleting", e))
                    })
            }
            Action::Strip { key, attributes } => {
                let mut request = self
                    .client
                    .update_item()
                    .table_name(self.table)
                    .set_key(Some(self.key_map(&key)))
                    .condition_expression("attribute_exists(#pk)")
                    .expression_attribute_names("#pk", pk)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                let mut parts = Vec::new();
                for (i, name) in attributes.iter().enumerate() {
                    request = request.expression_attribute_names(format!("#a{i}"), name);
                    parts.push(format!("#a{i}"));
                }
                request
                    .update_expression(format!("REMOVE {}", parts.join(", ")))
                    .send()
                    .await
                    .map(|o| o.consumed_capacity().and_then(|c| c.capacity_units()))
                    .map_err(|e| {
                        let condition = crate::dynamo::retry::is_condition_failure(&e);
                        (condition, self.fatal("removing attributes", e))
                    })
            }
            Action::RemoveRecord { key, counter } => self
                .client
                .update_item()
                .table_name(self.table)
                .set_key(Some(self.key_map(&key)))
                .update_expression("REMOVE #c.#n")
                .condition_expression("attribute_exists(#c.#n)")
                .expression_attribute_names("#c", RECORDS_ATTRIBUTE)
                .expression_attribute_names("#n", counter)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map(|o| o.consumed_capacity().and_then(|c| c.capacity_units()))
                .map_err(|e| {
                    let condition = crate::dynamo::retry::is_condition_failure(&e);
                    (condition, self.fatal("removing a counter record", e))
                }),
            Action::Keep(_) => unreachable!("handled above"),
        };
        match sent {
            Ok(units) => {
                counter.fetch_add(1, Ordering::Relaxed);
                let units = units.unwrap_or(1.0);
                self.write_micro
                    .fetch_add((units * 1e6) as u64, Ordering::Relaxed);
                self.pacer.consume(units).await;
                Ok(())
            }
            // The item changed since the scan (gone, or its records moved):
            // nothing of the retired projection is left to remove there.
            Err((true, _)) => Ok(()),
            Err((false, error)) => Err(error),
        }
    }

    async fn remove_dead_letters(&self) -> Result<u64, ApplyError> {
        let store =
            crate::apply::DeadLetterStore::new(self.client.clone(), self.table, self.current);
        let letters = store.list().await.map_err(|e| ApplyError::Fatal {
            table: self.table.to_string(),
            message: format!("prune: listing dead letters: {e:?}"),
        })?;
        let (mine, others): (Vec<_>, Vec<_>) = letters
            .into_iter()
            .partition(|l| self.retired.iter().any(|r| r.name == l.projection));
        let n = mine.len() as u64;
        if n > 0 {
            store
                .remove(&mine, &others)
                .await
                .map_err(|e| ApplyError::Fatal {
                    table: self.table.to_string(),
                    message: format!("prune: removing dead letters: {e:?}"),
                })?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn social(edit: impl Fn(String) -> String) -> Arc<Spec> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/projections/social-service.toml"
        ))
        .unwrap();
        Arc::new(Spec::from_toml(&edit(text), "social").expect("compiles"))
    }

    fn item(pairs: &[(&str, Av)]) -> HashMap<String, Av> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn s(text: &str) -> Av {
        Av::S(text.to_string())
    }

    #[test]
    fn what_the_current_spec_still_derives_stays() {
        let old = social(|t| t);
        let reverse = item(&[
            ("PK", s("USER#b")),
            ("SK", s("FOLLOWED_BY#a")),
            ("followedAt", s("t")),
        ]);
        // The edge renamed: its reverse items are the new one's.
        let renamed = social(|t| t.replace("name = \"followed-by\"", "name = \"followers-of\""));
        let retired = [Retired::new("followed-by", old.clone()).unwrap()];
        assert!(actions(&renamed, &retired, &reverse).is_empty());
        let copied = social(|t| {
            t.replace("name = \"followed-by\"", "name = \"followers-of\"")
                .replace("copy = { followedAt = \"{followedAt}\" }", "")
        });
        assert!(matches!(
            actions(&copied, &retired, &reverse).as_slice(),
            [Action::Strip { attributes, .. }] if attributes == &["followedAt".to_string()]
        ));
        // The edge gone: its reverse items go, unless one holds records of
        // a counter still in the spec.
        let gone = social(|t| {
            let start = t.find("[[projections]]\nname = \"followed-by\"").unwrap();
            let end = start + t[start..].find("copy = ").unwrap();
            let end = end + t[end..].find('\n').unwrap();
            format!("{}{}", &t[..start], &t[end..])
        });
        assert!(matches!(
            actions(&gone, &retired, &reverse).as_slice(),
            [Action::Delete { records: None, .. }]
        ));
        let mut counted = reverse.clone();
        counted.insert(
            RECORDS_ATTRIBUTE.to_string(),
            Av::M(HashMap::from([(
                "followers".to_string(),
                s("COUNTER#followers#b#3"),
            )])),
        );
        // (Its copies go all the same.)
        assert!(matches!(
            actions(&gone, &retired, &counted).as_slice(),
            [Action::Keep(why), Action::Strip { attributes, .. }]
                if why.contains("counter `followers`") && attributes == &["followedAt".to_string()]
        ));
        // A counter retired with the edge it rides on: the item goes whole
        // (removing the record first would fail the delete's condition).
        let both_retired = [
            Retired::new("followers", old.clone()).unwrap(),
            Retired::new("followed-by", old.clone()).unwrap(),
        ];
        let no_followers = social(|t| {
            let t = t
                .replace("name = \"followers\"", "name = \"followers2\"")
                .replace("counter = \"followers\"", "counter = \"followers2\"");
            let start = t.find("[[projections]]\nname = \"followed-by\"").unwrap();
            let end = start + t[start..].find("copy = ").unwrap();
            let end = end + t[end..].find('\n').unwrap();
            format!("{}{}", &t[..start], &t[end..])
        });
        let mut ridden = reverse.clone();
        ridden.insert(
            RECORDS_ATTRIBUTE.to_string(),
            Av::M(HashMap::from([(
                "followers".to_string(),
                s("COUNTER#followers#b#3"),
            )])),
        );
        assert!(matches!(
            actions(&no_followers, &both_retired, &ridden).as_slice(),
            [Action::Delete {
                records: Some(_),
                ..
            }]
        ));
        // Index keys another projection now derives stay on the item.
        let achievement = item(&[
            ("PK", s("USER#a")),
            ("SK", s("ACHIEVEMENT#b1")),
            ("userId", s("a")),
            ("badgeId", s("b1")),
            ("tier", s("gold")),
            ("score", Av::N("7".to_string())),
            ("GSI1PK", s("TIER#gold")),
            ("GSI1SK", s("SCORE#0007")),
        ]);
        let retired = [Retired::new("achievement-leaderboard-keys", old.clone()).unwrap()];
        let moved = social(|t| {
            t.replace(
                "name = \"achievement-leaderboard-keys\"",
                "name = \"leaderboard\"",
            )
        });
        assert!(actions(&moved, &retired, &achievement).is_empty());
        let dropped = social(|t| t[..t.find("# Leaderboard by tier").unwrap()].to_string());
        assert_eq!(
            actions(&dropped, &retired, &achievement),
            vec![Action::Strip {
                key: ItemKey {
                    pk: "USER#a".to_string(),
                    sk: Some("ACHIEVEMENT#b1".to_string()),
                },
                attributes: vec!["GSI1PK".to_string(), "GSI1SK".to_string()],
            }]
        );
        // A counter's shards and own markers go; its record leaves an item
        // that stays.
        let retired = [Retired::new("following", old.clone()).unwrap()];
        let shard = item(&[("PK", s("COUNTER#following#a#2")), ("SK", s("COUNTER"))]);
        assert!(matches!(
            actions(&dropped, &retired, &shard).as_slice(),
            [Action::Delete { .. }]
        ));
        let mut both = reverse.clone();
        both.insert(
            RECORDS_ATTRIBUTE.to_string(),
            Av::M(HashMap::from([
                ("followers".to_string(), s("COUNTER#followers#b#3")),
                ("following".to_string(), s("COUNTER#following#a#1")),
            ])),
        );
        assert_eq!(
            actions(&dropped, &retired, &both),
            vec![Action::RemoveRecord {
                key: ItemKey {
                    pk: "USER#b".to_string(),
                    sk: Some("FOLLOWED_BY#a".to_string()),
                },
                counter: "following".to_string(),
            }]
        );
    }
}
