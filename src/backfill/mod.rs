//! Backfill: bring derived state up to date for items that existed before
//! a projection (or a GSI) did, by scanning the table.
//!
//! Each scanned item becomes a synthetic INSERT ([`decode_scanned_item`])
//! planned for the selected projections and written by the same applier as
//! live records, so the same guarantees hold:
//!
//! - **Safe beside the live worker.** Index keys are written on condition
//!   that the item still holds the values the scan read; denormalized
//!   targets are recomputed from consistent reads; memberships (inverse
//!   edges and counter markers) carry a guard checked in the same
//!   transaction: the source must still be what the scan saw. A change the
//!   live worker makes after the scan therefore always wins.
//! - **Counters are rebuilt from the items, not incremented blindly.** A
//!   counter equals the number of its markers; the backfill creates the
//!   marker of every counted item that lacks one, adding 1 to the shard in
//!   the same transaction, and nothing for items already counted. So the
//!   rebuilt counter equals the true count, and the live worker can keep
//!   counting meanwhile.
//! - **Idempotent.** A second run plans nothing for index keys already set
//!   and finds every marker in place (markers are read before writing), so
//!   it writes nothing.
//!
//! Progress of each segment (its last evaluated key) is checkpointed in the
//! table after each page is applied: `PK = _ddbp#backfill`,
//! `SK = <table>#<projections>#<fingerprint of the spec's projections>#<segment>/<total>`.
//! `--resume` continues from there, redoing at most one page; after a spec
//! change the fingerprint differs, so the backfill starts over.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity, Select};
use serde::Serialize;

use crate::apply::{Applier, ApplyError, BatchOptions, RecordStatus};
use crate::decode::decode_scanned_item;
use crate::dynamo::names::BACKFILL_PK;
use crate::dynamo::retry::{self, retry_request, Retrier, PROGRESS_WRITES, SCAN_PAGES};
use crate::record::Item;
use crate::spec::ProjectionId;

pub use crate::dynamo::names::BACKFILL_PK as PROGRESS_PK;

/// What to backfill and how fast.
#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Only these projections (`None`: all).
    pub projections: Option<Vec<ProjectionId>>,
    /// The segments this process scans.
    pub segments: Vec<u32>,
    /// The total number of scan segments.
    pub total_segments: u32,
    /// Consumed write capacity per second to stay under (`None`: no limit).
    pub max_wcu: Option<f64>,
    /// Consumed read capacity per second to stay under (`None`: no limit).
    pub max_rcu: Option<f64>,
    /// Continue from the checkpoints of an earlier run with the same scope.
    pub resume: bool,
    /// Plan and count, write nothing.
    pub dry_run: bool,
    /// Items per scan page.
    pub page_size: i32,
    /// Show progress bars (when stderr is a terminal) or log lines.
    pub progress: bool,
    /// Stop after this many pages per segment (for tests and Lambda slices).
    pub max_pages: Option<u64>,
    /// Stop starting new pages after this instant (a Lambda invocation's
    /// budget); progress is checkpointed, so the next call continues.
    pub deadline: Option<tokio::time::Instant>,
    /// The lifecycle run this backfill belongs to, claimed beforehand with
    /// [`crate::control::Registry::claim`]: its progress is its own, and
    /// once every segment of it is done (here or elsewhere) its projections
    /// are recorded as backfilled. `None`: not recorded in the lifecycle.
    pub run: Option<String>,
}

impl Default for BackfillOptions {
    fn default() -> Self {
        BackfillOptions {
            projections: None,
            segments: vec![0],
            total_segments: 1,
            max_wcu: None,
            max_rcu: None,
            resume: false,
            dry_run: false,
            page_size: 200,
            progress: true,
            max_pages: None,
            deadline: None,
            run: None,
        }
    }
}

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BackfillSummary {
    /// Items read by the scan.
    pub scanned: u64,
    /// Items for which at least one effect was planned (would change).
    pub planned: u64,
    /// Effects planned.
    pub effects: u64,
    /// Write requests sent.
    pub writes: u64,
    /// Write capacity units consumed.
    pub write_units: f64,
    /// Read capacity units consumed (scan and reads).
    pub read_units: f64,
    /// Records dead-lettered.
    pub dead_letters: u64,
    /// Segments finished (all pages read).
    pub segments_done: u32,
    /// Segments this run was given.
    pub segments: u32,
    /// Wall time.
    pub seconds: f64,
    /// Projections this run found complete (every segment of its run done)
    /// and recorded as backfilled in the lifecycle registry.
    pub backfilled: Vec<String>,
    /// Projections of a complete run it could not record, and why.
    pub not_backfilled: Vec<(String, String)>,
}

impl BackfillSummary {
    /// Adds a later scan's summary (its segments are the same ones, read
    /// again): counts add up, segments done are the fewer.
    pub fn add(&mut self, later: BackfillSummary) {
        self.scanned += later.scanned;
        self.planned += later.planned;
        self.effects += later.effects;
        self.writes += later.writes;
        self.write_units += later.write_units;
        self.read_units += later.read_units;
        self.dead_letters += later.dead_letters;
        self.segments_done = self.segments_done.min(later.segments_done);
        self.seconds += later.seconds;
        self.backfilled.extend(later.backfilled);
        self.not_backfilled.extend(later.not_backfilled);
    }

    /// Whether every segment given was read to its end.
    pub fn is_done(&self) -> bool {
        self.segments_done >= self.segments
    }

    /// Items scanned per second.
    pub fn items_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.scanned as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Keeps consumed capacity per second under a limit, averaged over the run.
#[derive(Debug)]
pub(crate) struct Pacer {
    per_second: Option<f64>,
    start: Instant,
    consumed_micro: AtomicU64,
}

impl Pacer {
    pub(crate) fn new(per_second: Option<f64>) -> Pacer {
        Pacer {
            per_second: per_second.filter(|v| *v > 0.0),
            start: Instant::now(),
            consumed_micro: AtomicU64::new(0),
        }
    }

    /// Records consumption, then waits until the average is back under the limit.
    pub(crate) async fn consume(&self, units: f64) {
        let total = self
            .consumed_micro
            .fetch_add((units * 1e6) as u64, Ordering::Relaxed) as f64
            / 1e6
            + units;
        if let Some(limit) = self.per_second {
            let due = self.start + Duration::from_secs_f64(total / limit);
            tokio::time::sleep_until(due.into()).await;
        }
    }
}

/// A durable per-segment checkpoint.
#[derive(Debug, Clone, Default)]
struct Progress {
    last_key: Option<HashMap<String, Av>>,
    done: bool,
    scanned: u64,
}

struct Run<'a> {
    applier: &'a Applier,
    options: &'a BackfillOptions,
    scope: String,
    write_pacer: Pacer,
    read_pacer: Pacer,
    scanned: AtomicU64,
    planned: AtomicU64,
    effects: AtomicU64,
    writes: AtomicU64,
    write_micro: AtomicU64,
    read_micro: AtomicU64,
    dead_letters: AtomicU64,
    segments_done: AtomicU64,
}

/// Runs a backfill with `applier`'s spec and table.
///
/// A rollup whose counter is rebuilt in this layout totals the version
/// readers read, which switches when the counter's backfill completes: a
/// lifecycle run (`options.run`) backfills and completes the counter
/// first, then the rollup in a second scan of the segments this process
/// was given (resumable like the first). Segments scanned elsewhere (a
/// Step Functions Map) finish the first scan only: the rollup's run
/// completes in the process that completes the counter when it scans
/// every segment, else `status` asks for the rollup's backfill again.
pub async fn backfill(
    applier: &Applier,
    options: &BackfillOptions,
) -> Result<BackfillSummary, ApplyError> {
    let spec = applier.spec();
    let selected = match &options.projections {
        Some(ids) => crate::kinds::with_dependencies(spec, ids),
        None => spec.backfilled_projections(),
    };
    let later = crate::kinds::after_rebuilds(spec, &selected);
    let (Some(_), false, false) = (&options.run, options.dry_run, later.is_empty()) else {
        return backfill_once(applier, options).await;
    };
    let later_ids: Vec<ProjectionId> = later.iter().map(|&(id, _)| id).collect();
    let registry =
        crate::control::Registry::new(applier.client().clone(), applier.table(), &spec.table);
    // Readers read the rebuilt counters already: the first scan completed
    // (in an earlier call, or on another machine).
    let switched = || async {
        for &(_, counter) in &later {
            let Some(c) = spec.counter(counter) else {
                return Ok(false);
            };
            let read = registry
                .read_version(&spec.projections[counter].name)
                .await?;
            if read.is_none_or(|read| read.storage != c.storage) {
                return Ok(false);
            }
        }
        Ok::<bool, ApplyError>(true)
    };
    let mut first_summary = None;
    if !switched().await? {
        let first = BackfillOptions {
            projections: Some(
                selected
                    .iter()
                    .copied()
                    .filter(|id| !later_ids.contains(id))
                    .collect(),
            ),
            ..options.clone()
        };
        let mut summary = backfill_once(applier, &first).await?;
        let completed = !summary.backfilled.is_empty() || !summary.not_backfilled.is_empty();
        if !completed {
            // Not every segment is done yet: call again (or another
            // machine completes the run).
            return Ok(summary);
        }
        if !switched().await? {
            for &(id, counter) in &later {
                summary.not_backfilled.push((
                    spec.projections[id].name.clone(),
                    format!(
                        "its counter `{}` is rebuilt, and its backfill did not complete: backfill both again",
                        spec.projections[counter].name
                    ),
                ));
            }
            return Ok(summary);
        }
        first_summary = Some(summary);
    }
    tracing::info!(
        rollups = later_ids
            .iter()
            .map(|&id| spec.projections[id].name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        "the rebuilt counters are complete: backfilling their rollups"
    );
    let second = backfill_once(
        applier,
        &BackfillOptions {
            projections: Some(later_ids),
            ..options.clone()
        },
    )
    .await?;
    Ok(match first_summary {
        Some(mut summary) => {
            summary.add(second);
            summary
        }
        None => second,
    })
}

/// One scan of the table for `options.projections` (a rollup with its
/// counter), and its completion in the lifecycle registry.
async fn backfill_once(
    applier: &Applier,
    options: &BackfillOptions,
) -> Result<BackfillSummary, ApplyError> {
    let spec = applier.spec();
    let everything = options.projections.is_none();
    // Counters' old versions are kept by the worker while their counter is
    // rebuilt: a backfill of the whole spec leaves them alone.
    let whole = BackfillOptions {
        projections: Some(spec.backfilled_projections()),
        ..options.clone()
    };
    // A rollup goes with the counter it totals, unless that counter is
    // rebuilt (then `backfill` runs them one after the other).
    let paired = BackfillOptions {
        projections: options
            .projections
            .as_ref()
            .map(|ids| crate::kinds::completed_with(spec, ids)),
        ..options.clone()
    };
    let options = if options.projections.is_none()
        && (0..spec.projections.len()).any(|id| spec.is_old_version(id))
    {
        &whole
    } else if paired.projections != options.projections {
        &paired
    } else {
        options
    };
    let names: Vec<&str> = match &options.projections {
        Some(ids) if !everything => ids
            .iter()
            .map(|&id| spec.projections[id].name.as_str())
            .collect(),
        _ => vec!["*"],
    };
    // What the scan brings the selected projections to: their definitions
    // (not where a counter's versions are laid out, which may move while
    // a run's segments go on in other processes).
    let mut definitions: Vec<(&str, u64)> = options
        .projections
        .clone()
        .unwrap_or_else(|| spec.backfilled_projections())
        .into_iter()
        .map(|id| {
            (
                spec.projections[id].name.as_str(),
                spec.projections[id].fingerprint,
            )
        })
        .collect();
    definitions.sort_unstable();
    let definitions =
        definitions
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |hash, (name, fingerprint)| {
                name.bytes()
                    .map(u64::from)
                    .chain([0xff, *fingerprint])
                    .fold(hash, |h, x| (h ^ x).wrapping_mul(0x0000_0100_0000_01b3))
            });
    let run = Run {
        applier,
        options,
        // A backfill after the spec changed is another backfill: its
        // progress must not be taken for the last one's.
        // A run's progress is its own: another run (even of the same
        // scope) starts from the beginning.
        scope: format!(
            "{}#{}#{:016x}{}",
            applier.table(),
            names.join(","),
            definitions,
            options
                .run
                .as_deref()
                .map(|run| format!("#run={run}"))
                .unwrap_or_default()
        ),
        write_pacer: Pacer::new(options.max_wcu),
        read_pacer: Pacer::new(options.max_rcu),
        scanned: AtomicU64::new(0),
        planned: AtomicU64::new(0),
        effects: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        write_micro: AtomicU64::new(0),
        read_micro: AtomicU64::new(0),
        dead_letters: AtomicU64::new(0),
        segments_done: AtomicU64::new(0),
    };
    let started = Instant::now();
    let estimate = estimate_items(applier).await;
    let reporter = Reporter::new(options.progress, estimate);
    let run_ref = &run;
    let reporter_ref = &reporter;
    let segments = futures::future::join_all(
        options
            .segments
            .iter()
            .map(|&segment| async move { run_ref.segment(segment, reporter_ref).await }),
    );
    let ticker = async {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            reporter.log_line(&run, started);
        }
    };
    let results = tokio::select! {
        results = segments => results,
        _ = ticker => unreachable!("the ticker never ends"),
    };
    reporter.finish();
    for result in results {
        result?;
    }
    let summary = BackfillSummary {
        scanned: run.scanned.load(Ordering::Relaxed),
        planned: run.planned.load(Ordering::Relaxed),
        effects: run.effects.load(Ordering::Relaxed),
        writes: run.writes.load(Ordering::Relaxed),
        write_units: run.write_micro.load(Ordering::Relaxed) as f64 / 1e6,
        read_units: run.read_micro.load(Ordering::Relaxed) as f64 / 1e6,
        dead_letters: run.dead_letters.load(Ordering::Relaxed),
        segments_done: run.segments_done.load(Ordering::Relaxed) as u32,
        segments: options.segments.len() as u32,
        seconds: started.elapsed().as_secs_f64(),
        backfilled: Vec::new(),
        not_backfilled: Vec::new(),
    };
    let mut summary = summary;
    if let (Some(run), false) = (&options.run, options.dry_run) {
        // Every segment of the run done, here or on other machines: its
        // projections are backfilled to the spec's definitions.
        if summary.is_done() && run_ref.all_segments_done().await? {
            let ids: Vec<ProjectionId> = match &options.projections {
                Some(ids) => ids.clone(),
                None => (0..spec.projections.len()).collect(),
            };
            let registry = crate::control::Registry::new(
                applier.client().clone(),
                applier.table(),
                &spec.table,
            )
            .with_skew(applier.config().clock_skew.as_millis() as u64);
            let completion = registry.complete(spec, &ids, run).await?;
            summary.backfilled = completion.backfilled;
            summary.not_backfilled = completion.not;
        }
    }
    tracing::info!(
        scanned = summary.scanned,
        planned = summary.planned,
        writes = summary.writes,
        write_units = summary.write_units,
        seconds = summary.seconds,
        "backfill finished"
    );
    Ok(summary)
}

/// The table's approximate item count (DescribeTable), for progress bars.
pub(crate) async fn estimate_items(applier: &Applier) -> Option<u64> {
    let output = applier
        .client()
        .describe_table()
        .table_name(applier.table())
        .send()
        .await
        .ok()?;
    output.table()?.item_count().map(|n| n.max(0) as u64)
}

impl Run<'_> {
    fn fatal(&self, message: String) -> ApplyError {
        ApplyError::Fatal {
            table: self.applier.table().to_string(),
            message,
        }
    }

    fn progress_key(&self, segment: u32) -> HashMap<String, Av> {
        let spec = self.applier.spec();
        let mut key = HashMap::new();
        let sk = format!("{}#{segment}/{}", self.scope, self.options.total_segments);
        match &spec.table.sort_key {
            Some(name) => {
                key.insert(
                    spec.table.partition_key.clone(),
                    Av::S(BACKFILL_PK.to_string()),
                );
                key.insert(name.clone(), Av::S(sk));
            }
            None => {
                key.insert(
                    spec.table.partition_key.clone(),
                    Av::S(format!("{BACKFILL_PK}#{sk}")),
                );
            }
        }
        key
    }

    async fn load_progress(&self, segment: u32) -> Result<Progress, ApplyError> {
        if !self.options.resume {
            return Ok(Progress::default());
        }
        self.read_progress(segment).await
    }

    /// Whether every segment of this backfill's scope is done, whichever
    /// process ran it.
    async fn all_segments_done(&self) -> Result<bool, ApplyError> {
        for segment in 0..self.options.total_segments {
            if !self.options.segments.contains(&segment) && !self.read_progress(segment).await?.done
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn read_progress(&self, segment: u32) -> Result<Progress, ApplyError> {
        let output = self
            .applier
            .client()
            .get_item()
            .table_name(self.applier.table())
            .set_key(Some(self.progress_key(segment)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                self.fatal(format!(
                    "reading backfill progress: {}",
                    crate::dynamo::retry::describe(&e)
                ))
            })?;
        let Some(item) = output.item() else {
            return Ok(Progress::default());
        };
        let last_key = match item.get("lastKey") {
            Some(Av::S(text)) => serde_json::from_str::<Item>(text).ok().map(HashMap::from),
            _ => None,
        };
        Ok(Progress {
            last_key,
            done: matches!(item.get("done"), Some(Av::Bool(true))),
            scanned: match item.get("scanned") {
                Some(Av::N(n)) => n.parse().unwrap_or(0),
                _ => 0,
            },
        })
    }

    async fn save_progress(&self, segment: u32, progress: &Progress) -> Result<(), ApplyError> {
        if self.options.dry_run {
            return Ok(());
        }
        let mut item = self.progress_key(segment);
        if let Some(key) = &progress.last_key {
            let text = serde_json::to_string(&Item::from(key.clone())).unwrap_or_default();
            item.insert("lastKey".to_string(), Av::S(text));
        }
        item.insert("done".to_string(), Av::Bool(progress.done));
        item.insert("scanned".to_string(), Av::N(progress.scanned.to_string()));
        item.insert(
            "updatedAt".to_string(),
            Av::S(
                aws_smithy_types::DateTime::from(std::time::SystemTime::now())
                    .fmt(aws_smithy_types::date_time::Format::DateTime)
                    .unwrap_or_default(),
            ),
        );
        let mut retrier = Retrier::scheduled(PROGRESS_WRITES);
        loop {
            let sent = self
                .applier
                .client()
                .put_item()
                .table_name(self.applier.table())
                .set_item(Some(item.clone()))
                .send()
                .await;
            let Err(error) = sent else {
                return Ok(());
            };
            let waited = retrier
                .wait(|_| {
                    tracing::debug!(error = %retry::describe(&error), "retrying a progress write");
                })
                .await;
            if !waited {
                return Err(self.fatal(format!(
                    "saving backfill progress: {}",
                    retry::describe(&error)
                )));
            }
        }
    }

    async fn segment(&self, segment: u32, reporter: &Reporter) -> Result<(), ApplyError> {
        let mut progress = self.load_progress(segment).await?;
        if progress.done {
            tracing::info!(segment, "segment already done (resumed)");
            self.segments_done.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if progress.last_key.is_some() {
            tracing::info!(segment, scanned = progress.scanned, "resuming segment");
        }
        let spec = self.applier.spec();
        let options = BatchOptions {
            selection: self.options.projections.clone(),
            read_markers_first: true,
            ..BatchOptions::default()
        };
        let mut pages = 0u64;
        let mut n = progress.scanned;
        loop {
            let mut scan = self
                .applier
                .client()
                .scan()
                .table_name(self.applier.table())
                .select(Select::AllAttributes)
                .limit(self.options.page_size)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .set_exclusive_start_key(progress.last_key.clone());
            if self.options.total_segments > 1 {
                scan = scan
                    .segment(segment as i32)
                    .total_segments(self.options.total_segments as i32);
            }
            let page = self.scan_page(scan).await?;
            let read = page
                .consumed_capacity()
                .and_then(|c| c.capacity_units())
                .unwrap_or(0.0);
            self.read_micro
                .fetch_add((read * 1e6) as u64, Ordering::Relaxed);
            let items = page.items().to_vec();
            let batch: Vec<_> = items
                .into_iter()
                .map(|item| {
                    n += 1;
                    decode_scanned_item(&spec.table, segment, n, item)
                })
                .collect();
            self.scanned
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let planned_here = batch
                .iter()
                .flatten()
                .map(|record| crate::plan::plan_record(spec, record, options.selection.as_deref()))
                .filter(|plan| !plan.effects.is_empty() || !plan.errors.is_empty())
                .map(|plan| plan.effects.len() as u64)
                .fold((0u64, 0u64), |(items, effects), e| (items + 1, effects + e));
            self.planned.fetch_add(planned_here.0, Ordering::Relaxed);
            self.effects.fetch_add(planned_here.1, Ordering::Relaxed);
            if !self.options.dry_run && planned_here.0 > 0 {
                let outcome = self.applier.apply_batch(&batch, &options).await?;
                if let Some(i) = outcome.first_failure() {
                    let RecordStatus::Failed(message) = &outcome.statuses[i] else {
                        unreachable!()
                    };
                    // The page is not checkpointed: a resume redoes it.
                    return Err(self.fatal(format!(
                        "segment {segment}: a write kept failing: {message}"
                    )));
                }
                self.writes
                    .fetch_add(outcome.stats.writes as u64, Ordering::Relaxed);
                self.write_micro
                    .fetch_add((outcome.stats.write_units * 1e6) as u64, Ordering::Relaxed);
                self.read_micro
                    .fetch_add((outcome.stats.read_units * 1e6) as u64, Ordering::Relaxed);
                self.dead_letters
                    .fetch_add(outcome.stats.dead_letters as u64, Ordering::Relaxed);
                self.write_pacer.consume(outcome.stats.write_units).await;
            }
            self.read_pacer.consume(read).await;
            metrics::counter!("projector_backfill_items_scanned_total")
                .increment(batch.len() as u64);
            progress.scanned = n;
            progress.last_key = page.last_evaluated_key().filter(|k| !k.is_empty()).cloned();
            progress.done = progress.last_key.is_none();
            self.save_progress(segment, &progress).await?;
            reporter.advance(self, batch.len() as u64);
            pages += 1;
            if progress.done {
                self.segments_done.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            if self.options.max_pages.is_some_and(|max| pages >= max)
                || self
                    .options
                    .deadline
                    .is_some_and(|d| tokio::time::Instant::now() >= d)
            {
                return Ok(());
            }
        }
    }

    async fn scan_page(
        &self,
        scan: aws_sdk_dynamodb::operation::scan::builders::ScanFluentBuilder,
    ) -> Result<aws_sdk_dynamodb::operation::scan::ScanOutput, ApplyError> {
        let mut retrier = Retrier::scheduled(SCAN_PAGES);
        retry_request(
            &mut retrier,
            || scan.clone().send(),
            |reason, _, _| {
                metrics::counter!("projector_retries_total", "operation" => "scan", "reason" => reason)
                    .increment(1);
            },
        )
        .await
        .map_err(|(_, error)| self.fatal(format!("scan failed: {}", retry::describe(&error))))
    }
}

/// Progress display: a bar on a terminal, periodic log lines otherwise.
struct Reporter {
    bar: indicatif::ProgressBar,
    terminal: bool,
    enabled: bool,
}

impl Reporter {
    fn new(enabled: bool, estimate: Option<u64>) -> Reporter {
        let terminal = enabled && std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(estimate.unwrap_or(0));
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/~{len} items ({per_sec}, eta {eta}) {msg}",
                )
                .expect("valid template"),
            );
            bar.set_prefix("backfill");
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Reporter {
            bar,
            terminal,
            enabled,
        }
    }

    fn advance(&self, run: &Run<'_>, scanned: u64) {
        self.bar.inc(scanned);
        if self.terminal {
            self.bar.set_message(format!(
                "{} changed, {:.0} WCU",
                run.planned.load(Ordering::Relaxed),
                run.write_micro.load(Ordering::Relaxed) as f64 / 1e6
            ));
        }
    }

    fn log_line(&self, run: &Run<'_>, started: Instant) {
        if !self.enabled || self.terminal {
            return;
        }
        let scanned = run.scanned.load(Ordering::Relaxed);
        let seconds = started.elapsed().as_secs_f64().max(0.001);
        tracing::info!(
            scanned,
            changed = run.planned.load(Ordering::Relaxed),
            items_per_second = (scanned as f64 / seconds).round(),
            write_units = run.write_micro.load(Ordering::Relaxed) as f64 / 1e6,
            segments_done = run.segments_done.load(Ordering::Relaxed),
            "backfill progress"
        );
    }

    fn finish(&self) {
        self.bar.finish();
    }
}

/// What `backfill` was asked, checked: which projections, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The projections named (none: what is not live).
    pub projections: Vec<String>,
    /// Every projection of the spec, live ones too.
    pub all: bool,
    /// The run's name (`--run`).
    pub run: Option<String>,
    /// How long to wait for writers of another definition to stop.
    pub wait: Duration,
    /// The segments this process scans.
    pub segments: Vec<u32>,
    /// The scan's total segments.
    pub total_segments: u32,
    /// Consumed write capacity units per second to stay under.
    pub max_wcu: Option<f64>,
    /// Consumed read capacity units per second to stay under.
    pub max_rcu: Option<f64>,
    /// Continue an interrupted run from its checkpoints.
    pub resume: bool,
    /// Count what would change without writing.
    pub dry_run: bool,
}

impl Default for Request {
    /// What `backfill` with no flags asks: what is not live, a new run,
    /// four segments, 20 minutes' wait for writers of another definition.
    fn default() -> Self {
        Request {
            projections: Vec::new(),
            all: false,
            run: None,
            wait: Duration::from_secs(20 * 60),
            segments: (0..4).collect(),
            total_segments: 4,
            max_wcu: None,
            max_rcu: None,
            resume: false,
            dry_run: false,
        }
    }
}

/// What the lifecycle backfill did.
#[derive(Debug)]
pub enum Backfilled {
    /// Nothing asked, and every projection is live: nothing done.
    AllLive,
    /// It ran (or counted, dry).
    Ran {
        /// What it did.
        summary: BackfillSummary,
        /// The run it worked for (none when dry).
        run: Option<String>,
    },
}

/// The lifecycle backfill of `c`'s table: chooses the projections
/// (those asked, else those not live; see [`crate::control::choose_projections`]),
/// claims them under a run (unless dry), and backfills them. `note`
/// hears what it decided as it goes.
pub async fn lifecycle(
    c: &crate::control::Connection,
    request: &Request,
    commands: &crate::control::Commands,
    note: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<Backfilled> {
    let registry = c.registry();
    let applier = c.applier();
    let asked = projection_ids(&c.spec, &request.projections)?;
    let choice =
        crate::control::choose_projections(&registry, &applier, commands, asked, request.all)
            .await?;
    let ids: Vec<ProjectionId> = match choice {
        crate::control::BackfillChoice::Asked(ids) => ids,
        crate::control::BackfillChoice::AllLive => return Ok(Backfilled::AllLive),
        crate::control::BackfillChoice::NotLive(needed) => {
            let names: Vec<&str> = needed
                .iter()
                .map(|&id| c.spec.projections[id].name.as_str())
                .collect();
            note(&format!(
                "backfilling what is not live: {}",
                names.join(", ")
            ));
            needed
        }
    };
    let run = if request.dry_run {
        None
    } else {
        let run = crate::control::claim_run(
            &registry,
            &c.spec,
            &ids,
            request.run.as_deref(),
            request.resume,
            request.wait,
            note,
        )
        .await?;
        Some(run)
    };
    let options = BackfillOptions {
        projections: (ids.len() != c.spec.projections.len()).then_some(ids),
        segments: request.segments.clone(),
        total_segments: request.total_segments,
        max_wcu: request.max_wcu,
        max_rcu: request.max_rcu,
        resume: request.resume || request.run.is_some(),
        dry_run: request.dry_run,
        run,
        ..Default::default()
    };
    let summary = backfill(&applier, &options).await?;
    Ok(Backfilled::Ran {
        summary,
        run: options.run,
    })
}

/// Resolves projection names, failing with the list of known ones.
fn projection_ids(
    spec: &crate::spec::Spec,
    names: &[String],
) -> anyhow::Result<Option<Vec<usize>>> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut ids = Vec::new();
    for name in names {
        match spec.projection_id(name) {
            Some(id) => ids.push(id),
            None => {
                let known: Vec<&str> = spec.projections.iter().map(|p| p.name.as_str()).collect();
                anyhow::bail!(
                    "no projection `{name}` in {} (known: {})",
                    spec.file,
                    known.join(", ")
                );
            }
        }
    }
    Ok(Some(ids))
}
