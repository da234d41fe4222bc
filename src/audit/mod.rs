//! `audit`: check every derived item and counter of a table against its
//! source items, and every invariant, from a parallel scan that holds one
//! page per segment at a time.
//!
//! What it compares, per projection (each projection carries the implicit
//! `derived-consistent` invariant):
//!
//! - `index-keys`: every item of the entity carries the attributes the
//!   planner computes from it (missing or stale otherwise);
//! - `denormalize`, `rollup`, `aggregate`: every existing target holds
//!   what the kind computes from what its recompute reads;
//! - `inverse-edge`: a reverse item exists exactly for each source edge
//!   that satisfies `when`, equal to what the planner writes (missing,
//!   stale, orphaned);
//! - `counter`: the sum of the shards equals the number of counted source
//!   items (off by how much), each shard the number of records naming it,
//!   and a counter's own markers exist exactly for the counted items.
//!
//! A page's items are checked with the reads they need (`page`); the
//! counters, group-bys across the table, with a sketch that a second scan
//! follows up only where it is not zero ([`sketch`]). Memory is a page
//! per segment and what was found, whatever the table's size.
//!
//! `--repair` writes derived state back to what it should be through the
//! same applier the worker uses (conditional writes, guards on the source
//! state the scan saw), never source items; counters are set last, from a
//! consistent read of their shards, on condition that the shard read is
//! unchanged. The recorded violations are replaced by the ones found.
//!
//! **Architecture Invariant:** the audit's "expected" side is computed by
//! the planner's own functions from the scanned items and the reads the
//! worker itself makes, so audit and worker can never disagree about what
//! a projection means.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::apply::{Applier, ApplyError};
use crate::plan::Effect;
use crate::record::ItemKey;
use crate::spec::Spec;

pub mod checkpoint;
mod derive;
mod lifecycle;
mod page;
pub mod passes;
mod repair;
mod resume;
mod scan;
pub mod sketch;
pub mod wait;

pub use checkpoint::CheckpointStore;
use derive::{counters, Tally};
use lifecycle::Judged;
pub use lifecycle::NotLive;
pub use repair::repair;
pub use resume::{audit_run, forget_run, storage_run};
use scan::{classify, Pages, Progress};
use sketch::Sketch;

/// How to run an audit.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Parallel scan segments.
    pub segments: u32,
    /// Write derived state back to what it should be.
    pub repair: bool,
    /// Show a progress bar (terminal) or log lines.
    pub progress: bool,
    /// Items per scan page (`None`: DynamoDB's 1 MB pages). A page and
    /// what its checks read is what a segment holds: the default, 1,000,
    /// keeps that to a few MB whatever the items' size.
    pub page_size: Option<i32>,
    /// Audit only this segment of `segments` (another process, or another
    /// machine, audits the others): the report carries the counters'
    /// sketch, and [`merge`] concludes them.
    pub segment: Option<u32>,
    /// Read capacity units per second, averaged over the run.
    pub max_rcu: Option<f64>,
    /// With `segment`: where the segment's progress and findings are
    /// kept after every page, and resumed from (see [`checkpoint`]).
    pub checkpoint: Option<CheckpointStore>,
    /// With `checkpoint`: stop after this many pages (a slice), the
    /// report not `complete`.
    pub max_pages: Option<u64>,
    /// With `checkpoint`: start no page after this instant (a Lambda
    /// invocation's budget), the report not `complete`.
    pub deadline: Option<tokio::time::Instant>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            segments: 4,
            repair: false,
            progress: false,
            page_size: Some(1000),
            segment: None,
            max_rcu: None,
            checkpoint: None,
            max_pages: None,
            deadline: None,
        }
    }
}

/// What is wrong with one derived item, counter or invariant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Problem {
    /// A derived item or attribute that should exist does not.
    Missing,
    /// A derived item or attribute differs from what the spec computes.
    Stale,
    /// A derived item whose source does not exist (or no longer counts).
    Orphaned,
    /// A counter's shards do not add up to the number of counted items.
    CounterOff {
        /// The number of counted source items.
        expected: i64,
        /// The sum of the shards.
        actual: i64,
    },
    /// A counter shard does not hold the number of records that name it
    /// (its count was changed outside the projector, or records were
    /// deleted with the items carrying them).
    ShardOff {
        /// The shard's count.
        holds: i64,
        /// The records naming the shard.
        records: i64,
    },
    /// A source item the projection cannot compute from (dead-lettered by
    /// the worker too); fix the item.
    Underivable,
    /// An invariant does not hold; needs a human (or a repair policy).
    Violation,
}

impl Problem {
    /// A short name for text output.
    pub fn label(&self) -> String {
        match self {
            Problem::Missing => "missing".to_string(),
            Problem::Stale => "stale".to_string(),
            Problem::Orphaned => "orphaned".to_string(),
            Problem::CounterOff { expected, actual } => {
                format!(
                    "off by {:+} (is {actual}, should be {expected})",
                    actual - expected
                )
            }
            Problem::ShardOff { holds, records } => {
                format!("holds {holds}, but {records} records name it")
            }
            Problem::Underivable => "underivable".to_string(),
            Problem::Violation => "violation".to_string(),
        }
    }

    /// How far a counter or shard is off (`None`: not a count).
    pub fn off_by(&self) -> Option<i64> {
        match self {
            Problem::CounterOff { expected, actual } => Some((expected - actual).abs()),
            Problem::ShardOff { holds, records } => Some((holds - records).abs()),
            _ => None,
        }
    }

    /// Its kind, for metrics (`missing`, `counter-off` ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Missing => "missing",
            Problem::Stale => "stale",
            Problem::Orphaned => "orphaned",
            Problem::CounterOff { .. } => "counter-off",
            Problem::ShardOff { .. } => "shard-off",
            Problem::Underivable => "underivable",
            Problem::Violation => "violation",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    /// The projection or invariant.
    pub rule: String,
    /// Its kind (`inverse-edge`, `exactly-one` ...).
    pub rule_kind: String,
    /// What is wrong.
    pub problem: Problem,
    /// The derived item (or counter, or the invariant's scope).
    pub key: String,
    /// The items involved (sources, or the violating items).
    pub items: Vec<String>,
    /// Details: expected and actual values, or the violation's message.
    pub detail: String,
    /// Whether `--repair` fixed it.
    pub repaired: bool,
    /// The counters whose members it changes (a reverse edge or marker
    /// missing or orphaned, a record missing or wrong): until it is
    /// repaired, recounting them cannot make them right.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<String>,
    /// The counter shards its repair moves (a record added or dropped with
    /// its shard's count): once repaired, they are counted again, whether
    /// or not the audit found them off (a segment repaired page by page
    /// changes what the rest of the scan reads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<String>,
    #[serde(skip, default)]
    fix: Option<Fix>,
}

#[derive(Debug, Clone)]
enum Fix {
    /// Apply a planned effect.
    Effect(Box<Effect>),
    /// Count the records naming these shards again and set each shard to
    /// its count, if no transaction moved it meanwhile.
    Recount(Vec<String>),
}

/// The result of an audit.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuditReport {
    /// The table audited.
    #[serde(default)]
    pub table: String,
    /// When the audit began (ms since the epoch): a violation recorded
    /// since is newer than what it read.
    #[serde(default)]
    pub started_ms: u64,
    /// The segment audited, when one was (of `total_segments`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<u32>,
    /// The scan's segments.
    #[serde(default)]
    pub total_segments: u32,
    /// Items scanned.
    pub scanned: u64,
    /// Everything found, grouped by rule in spec order.
    pub findings: Vec<Finding>,
    /// Findings fixed by `--repair`.
    pub repaired: usize,
    /// Repairs that failed, with the reason.
    pub repair_failures: Vec<String>,
    /// Violations newly recorded / cleared in the violation store (repair).
    pub violations_recorded: usize,
    /// Recorded violations deleted because they no longer hold.
    pub violations_cleared: usize,
    /// Read capacity units the scan consumed.
    pub read_units: f64,
    /// Write capacity units the repair consumed.
    pub write_units: f64,
    /// Wall time.
    pub seconds: f64,
    /// Whether the scan ended (a checkpointed slice may stop before).
    #[serde(default = "ended")]
    pub complete: bool,
    /// A segment's counter facts, until `merge` concludes them with the
    /// other segments' (see `sketch`). `None` once concluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<Sketch>,
    /// The violations found, as (invariant, recorded key): what `merge`
    /// keeps in the violation store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violation_keys: Vec<(String, String)>,
    /// Counters that looked off but moved while the audit counted them (a
    /// live write fell between reading their sources and their shards):
    /// not findings; the next audit checks them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved_while_counted: Vec<String>,
    /// The projections that are not live, with their backfill: a new one
    /// is judged, a changed or backfilling one is not (its data is not its
    /// definition's until the backfill; see `lifecycle`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_live: Vec<NotLive>,
}

impl AuditReport {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// Findings per rule, for summaries.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for finding in &self.findings {
            *out.entry(finding.rule.clone()).or_insert(0) += 1;
        }
        out
    }

    /// The report as text for people.
    pub fn to_text(&self, spec: &Spec) -> String {
        let mut out = String::new();
        let rules: Vec<(&str, &str)> = spec
            .projections
            .iter()
            .map(|p| (p.name.as_str(), p.kind_name()))
            .chain(
                spec.invariants
                    .iter()
                    .map(|i| (i.name.as_str(), i.kind_name())),
            )
            .collect();
        for (rule, kind) in rules {
            let not_live = self.not_live.iter().find(|n| n.projection == rule);
            let found_any = self.findings.iter().any(|f| f.rule == rule);
            if let Some(left) = not_live.filter(|n| !n.judged && !found_any) {
                out.push_str(&format!(
                    "{rule} ({kind}): not judged, {}: its data is not its definition's until its backfill completes{}\n",
                    left.state,
                    left.next
                        .as_ref()
                        .map(|next| format!(" (next: {next})"))
                        .unwrap_or_default()
                ));
                continue;
            }
            let found: Vec<&Finding> = self.findings.iter().filter(|f| f.rule == rule).collect();
            if found.is_empty() {
                out.push_str(&format!("{rule} ({kind}): ok\n"));
                continue;
            }
            out.push_str(&format!("{rule} ({kind}): {} found\n", found.len()));
            if let Some(new) = not_live {
                out.push_str(&format!(
                    "  ({}: not backfilled yet; what it finds on items written before it ran is what its backfill writes{})\n",
                    new.state,
                    new.next
                        .as_ref()
                        .map(|next| format!(": {next}"))
                        .unwrap_or_default()
                ));
            }
            for finding in found {
                out.push_str(&format!(
                    "  {:<10} {}{}\n",
                    finding.problem.label(),
                    finding.key,
                    if finding.repaired { "  [repaired]" } else { "" }
                ));
                if !finding.detail.is_empty() {
                    out.push_str(&format!("             {}\n", finding.detail));
                }
            }
        }
        if let (Some(segment), Some(_)) = (self.segment, &self.sketch) {
            out.push_str(&format!(
                "segment {segment} of {}: counters are concluded by `audit merge` with the other segments' reports (--format json)\n",
                self.total_segments
            ));
        }
        out.push_str(&format!(
            "{} items scanned in {:.1}s ({:.1} RCU), {} findings",
            self.scanned,
            self.seconds,
            self.read_units,
            self.findings.len()
        ));
        if self.repaired > 0 || !self.repair_failures.is_empty() {
            out.push_str(&format!(
                ", {} repaired ({:.1} WCU), {} repairs failed",
                self.repaired,
                self.write_units,
                self.repair_failures.len()
            ));
        }
        out.push('\n');
        for failure in &self.repair_failures {
            out.push_str(&format!("repair failed: {failure}\n"));
        }
        if !self.moved_while_counted.is_empty() {
            out.push_str(&format!(
                "{} counters moved while the audit counted them (not findings; the next audit checks them again): {}\n",
                self.moved_while_counted.len(),
                self.moved_while_counted.join(", ")
            ));
        }
        out
    }
}

/// What one segment found.
struct SegmentAudit {
    scanned: u64,
    findings: Vec<Finding>,
    violations: Vec<(usize, crate::invariant::Violation)>,
    sketch: Sketch,
}

/// What the segments of one audit share.
struct Shared<'a> {
    read_micro: &'a AtomicU64,
    progress: &'a Progress,
    pacer: &'a crate::backfill::Pacer,
    judged: &'a Judged,
}

/// Audits segment `segment` of `total`, page by page.
async fn audit_segment(
    applier: &Applier,
    segment: u32,
    total: u32,
    page_size: Option<i32>,
    shared: &Shared<'_>,
) -> Result<SegmentAudit, ApplyError> {
    let Shared {
        read_micro,
        progress,
        pacer,
        judged,
    } = *shared;
    let mut pages = Pages::new(segment, total, page_size);
    let mut out = SegmentAudit {
        scanned: 0,
        findings: Vec::new(),
        violations: Vec::new(),
        sketch: Sketch::default(),
    };
    while let Some(items) = pages.next(applier, read_micro, progress).await? {
        out.scanned += items.len() as u64;
        let found = page::check(applier, items, &mut out.sketch, judged).await?;
        read_micro.fetch_add((found.read_units * 1e6) as u64, Ordering::Relaxed);
        pacer.consume(pages.last_units + found.read_units).await;
        out.findings.extend(found.findings);
        out.violations.extend(found.violations);
    }
    Ok(out)
}

/// The counters of the groups `sketch` found wrong, counted exactly by a
/// second scan that keeps only those (see [`sketch`]).
async fn locate_counters(
    applier: &Applier,
    sketch: &Sketch,
    segments: u32,
    page_size: Option<i32>,
    read_micro: &AtomicU64,
    pacer: &crate::backfill::Pacer,
    set_aside: bool,
) -> Result<(Vec<Finding>, Vec<String>), ApplyError> {
    let spec = applier.spec();
    let quiet = Progress::new(false, None);
    let tallies = (0..segments).map(|segment| {
        let quiet = &quiet;
        async move {
            let mut pages = Pages::new(segment, segments, page_size);
            let mut tally = Tally::default();
            while let Some(items) = pages.next(applier, read_micro, quiet).await? {
                for item in items {
                    classify(spec, item, &mut |fact| tally.keep(sketch, fact));
                }
                pacer.consume(pages.last_units).await;
            }
            Ok::<_, ApplyError>(tally)
        }
    });
    let mut all = Tally::default();
    for tally in futures::future::try_join_all(tallies).await? {
        for (group, n) in tally.counted {
            *all.counted.entry(group).or_insert(0) += n;
        }
        all.shards.extend(tally.shards);
        all.changes.extend(tally.changes);
        for (pk, n) in tally.records {
            *all.records.entry(pk).or_insert(0) += n;
        }
    }
    let mut findings = Vec::new();
    counters(spec, sketch, &all, &mut findings);
    let moved = if set_aside {
        set_aside_moved(applier, &all, &mut findings).await?
    } else {
        Vec::new()
    };
    Ok((findings, moved))
}

/// Takes out of `located` the counter findings that the live worker's
/// moves since the locate scan can explain, and returns their keys. A
/// counter's sources and shards lie in different partitions, read at
/// different times, so a counter may look off only because writes fell
/// in between; each transaction that moves a record moves the count by
/// one and its shard's `changes` by one. A counter off by more than its
/// shards moved since the scan read them is off whatever the live writes
/// did, and stays a finding; so does one whose scan kept no `changes`
/// (a tally saved by an older version). Only a report that repairs
/// nothing sets counters aside: a repair recounts them, guarded against
/// the same moves. The next audit judges a counter set aside again.
async fn set_aside_moved(
    applier: &Applier,
    tally: &Tally,
    located: &mut Vec<Finding>,
) -> Result<Vec<String>, ApplyError> {
    let spec = applier.spec();
    let mut keys: Vec<ItemKey> = Vec::new();
    for finding in located.iter() {
        if let Some(Fix::Recount(list)) = &finding.fix {
            for shard in list {
                let key = spec.shard_item(shard);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let now = applier
        .reader()
        .items(keys.iter().collect())
        .await
        .map_err(|error| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!("reading the counters the audit found off: {error}"),
        })?;
    let changes_now = |shard: &str| {
        now.get(&spec.shard_item(shard))
            .and_then(
                |item| match item.get(crate::dynamo::names::CHANGES_ATTRIBUTE) {
                    Some(crate::record::AttributeValue::N(n)) => n.parse::<i64>().ok(),
                    _ => None,
                },
            )
            .unwrap_or(0)
    };
    // How many times the shards moved since the scan; `None`: unknown.
    let moves = |list: &[String]| {
        let mut moves = 0;
        for shard in list {
            let seen = if tally.shards.contains_key(shard) {
                tally.changes.get(shard)?.unwrap_or(0)
            } else {
                // Not there when scanned.
                0
            };
            moves += (changes_now(shard) - seen).max(0);
        }
        Some(moves)
    };
    let mut moved = Vec::new();
    located.retain(|finding| {
        let (Some(Fix::Recount(list)), Some(off)) = (&finding.fix, finding.problem.off_by()) else {
            return true;
        };
        let explained = moves(list).is_some_and(|moves| off <= moves);
        if explained {
            moved.push(finding.key.clone());
        }
        !explained
    });
    moved.sort();
    moved.dedup();
    if !moved.is_empty() {
        metrics::counter!("projector_audit_counters_moved_total").increment(moved.len() as u64);
        tracing::info!(
            counters = moved.len(),
            "counters moved while the audit counted them, by as much as they looked off: left for the next audit"
        );
    }
    Ok(moved)
}

/// Runs an audit (see the module docs): every segment of
/// `options.segments` in this process, or only `options.segment`.
pub async fn audit(applier: &Applier, options: &AuditOptions) -> Result<AuditReport, ApplyError> {
    let segments = options.segments.max(1);
    if let Some(segment) = options.segment.filter(|&s| s >= segments) {
        return Err(ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!(
                "segment {segment} is not one of the {segments} segments (0 to {})",
                segments - 1
            ),
        });
    }
    if let (Some(segment), Some(store)) = (options.segment, &options.checkpoint) {
        let slice = checkpoint::audit_segment_from(applier, options, segment, store).await?;
        finished(applier.spec(), &slice.report, slice.scanned_now);
        return Ok(slice.report);
    }
    let started = Instant::now();
    let started_ms = crate::dynamo::time::now_ms();
    let spec = applier.spec();
    let judged = Judged::read(applier).await?;
    let read_micro = AtomicU64::new(0);
    let mine: Vec<u32> = match options.segment {
        Some(segment) => vec![segment],
        None => (0..segments).collect(),
    };
    let estimate = crate::backfill::estimate_items(applier)
        .await
        .map(|n| n * mine.len() as u64 / segments as u64);
    let progress = Progress::new(options.progress, estimate);
    let pacer = crate::backfill::Pacer::new(options.max_rcu);
    let shared = Shared {
        read_micro: &read_micro,
        progress: &progress,
        pacer: &pacer,
        judged: &judged,
    };
    let scans = mine
        .iter()
        .map(|&segment| audit_segment(applier, segment, segments, options.page_size, &shared));
    let parts = futures::future::try_join_all(scans).await?;
    progress.finish();
    let mut report = AuditReport {
        table: applier.table().to_string(),
        started_ms,
        complete: true,
        segment: options.segment,
        total_segments: segments,
        not_live: judged.not_live(),
        ..AuditReport::default()
    };
    let mut sketch = Sketch::default();
    let mut violations = Vec::new();
    for part in parts {
        report.scanned += part.scanned;
        report.findings.extend(part.findings);
        violations.extend(part.violations);
        sketch.merge(&part.sketch);
    }
    if options.segment.is_some() {
        report.sketch = Some(sketch);
    } else if !sketch.is_zero() {
        let (located, moved) = locate_counters(
            applier,
            &sketch,
            segments,
            options.page_size,
            &read_micro,
            &pacer,
            !options.repair,
        )
        .await?;
        let mut located = located;
        judged.retain(&mut located);
        report.findings.extend(located);
        report.moved_while_counted = moved;
    }
    let violations = one_per_scope(spec, violations);
    report.findings.extend(
        violations
            .iter()
            .map(|(id, v)| derive::violation(spec, *id, v)),
    );
    sort_findings(spec, &mut report.findings);
    let violations: Vec<crate::invariant::Violation> =
        violations.into_iter().map(|(_, v)| v).collect();
    report.violation_keys = violations
        .iter()
        .map(|v| (v.invariant.clone(), v.record_sk()))
        .collect();
    report.read_units = read_micro.load(Ordering::Relaxed) as f64 / 1e6;
    if options.repair {
        repair(applier, &mut report).await?;
        report.violations_recorded = applier.record_violations(&violations).await?;
        // A segment does not know the others' violations: clearing is
        // left to `merge --repair`.
        if options.segment.is_none() {
            report.violations_cleared =
                clear_resolved(applier, &report.violation_keys, started_ms).await?;
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    finished(applier.spec(), &report, report.scanned);
    Ok(report)
}

/// Combines the reports of every segment of one audit (each segment
/// once): their findings, and the counters, concluded from the summed
/// sketches (a second scan of the whole table follows up the wrong
/// buckets, keeping only those). With `repair`, recounts the counters
/// found off (the segments repaired the rest) and clears the recorded
/// violations no segment found. The second scan reads at most `max_rcu`
/// units per second.
pub async fn merge(
    applier: &Applier,
    reports: Vec<AuditReport>,
    repair_counters: bool,
    max_rcu: Option<f64>,
) -> Result<AuditReport, ApplyError> {
    let report = merge_uncounted(applier, reports, repair_counters, max_rcu).await?;
    finished(applier.spec(), &report, 0);
    Ok(report)
}

/// [`merge`] without counting its findings in the metrics: for a caller
/// that counts them once it has stored the conclusion.
pub async fn merge_uncounted(
    applier: &Applier,
    reports: Vec<AuditReport>,
    repair_counters: bool,
    max_rcu: Option<f64>,
) -> Result<AuditReport, ApplyError> {
    let started = Instant::now();
    let (mut report, sketch) = combine(applier, reports)?;
    let mut counted = Vec::new();
    if !sketch.is_zero() {
        let read_micro = AtomicU64::new(0);
        let pacer = crate::backfill::Pacer::new(max_rcu);
        let total = report.total_segments;
        let moved;
        (counted, moved) = locate_counters(
            applier,
            &sketch,
            total,
            None,
            &read_micro,
            &pacer,
            !repair_counters,
        )
        .await?;
        report.moved_while_counted = moved;
        report.read_units += read_micro.load(Ordering::Relaxed) as f64 / 1e6;
    }
    let mut report = conclude(applier, report, counted, repair_counters, None).await?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The reports of every segment of one audit (each once) as one, its
/// counters not concluded yet, and their summed sketch.
pub(crate) fn combine(
    applier: &Applier,
    reports: Vec<AuditReport>,
) -> Result<(AuditReport, Sketch), ApplyError> {
    let total = covered(&reports, applier.table()).map_err(|message| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    })?;
    let mut report = AuditReport {
        table: applier.table().to_string(),
        complete: true,
        started_ms: reports.iter().map(|r| r.started_ms).min().unwrap_or(0),
        total_segments: total,
        ..AuditReport::default()
    };
    let mut sketch = Sketch::default();
    for part in reports {
        report.scanned += part.scanned;
        report.findings.extend(part.findings);
        report.repaired += part.repaired;
        report.repair_failures.extend(part.repair_failures);
        report.violations_recorded += part.violations_recorded;
        report.read_units += part.read_units;
        report.write_units += part.write_units;
        report.violation_keys.extend(part.violation_keys);
        sketch.merge(&part.sketch.unwrap_or_default());
    }
    Ok((report, sketch))
}

/// The end of a merge, once the counters the sketch found wrong are
/// located (`counted`, their findings): with `repair_counters`, recounts
/// those counters and the shards the segments' repairs moved (from
/// `recounted` when they were counted apart, else with a scan of the
/// table), and clears the recorded violations no segment found; then the
/// findings one per key, in spec order.
pub(crate) async fn conclude(
    applier: &Applier,
    mut report: AuditReport,
    counted: Vec<Finding>,
    repair_counters: bool,
    recounted: Option<&repair::Recounted>,
) -> Result<AuditReport, ApplyError> {
    let judged = Judged::read(applier).await?;
    let mut counted = counted;
    judged.retain(&mut counted);
    report.not_live = judged.not_live();
    let mut counted = AuditReport {
        findings: counted,
        ..AuditReport::default()
    };
    if repair_counters {
        // What is repaired here is what this merge found, the counters:
        // the segments repaired the rest, and their findings carry no fix.
        repair::repair_beside(applier, &mut counted, &report.findings, true, recounted).await?;
        report.repair_failures.extend(counted.repair_failures);
        report.repaired += counted.repaired;
        report.write_units += counted.write_units;
        report.read_units += counted.read_units;
        report.violations_cleared =
            clear_resolved(applier, &report.violation_keys, report.started_ms).await?;
    }
    let spec = applier.spec();
    let (findings, unique) = one_per_key(spec, std::mem::take(&mut report.findings));
    report.findings = findings;
    report.violation_keys.sort();
    report.violation_keys.dedup();
    if repair_counters {
        // Each segment recorded the holders it saw: the store gets them all.
        report.violations_recorded += applier.record_violations(&unique).await?;
    }
    report.findings.extend(counted.findings);
    sort_findings(spec, &mut report.findings);
    Ok(report)
}

/// Deletes the recorded violations the audit that began at `started_ms`
/// did not find (`found`: (invariant, recorded key) pairs), unless one
/// holds again now, re-checked with consistent reads as the online check
/// reads it, or was recorded since the audit began (less the clock skew
/// allowed between machines): a scope can break again after the audit
/// read it, and the worker, finding its record as it is, writes nothing.
/// Returns how many went.
async fn clear_resolved(
    applier: &Applier,
    found: &[(String, String)],
    started_ms: u64,
) -> Result<usize, ApplyError> {
    let spec = applier.spec();
    let reader = applier.reader();
    let fatal = |error: crate::dynamo::retry::WriteError| ApplyError::Fatal {
        table: applier.table().to_string(),
        message: format!("re-checking a recorded violation failed: {error}"),
    };
    let mut keep = found.to_vec();
    for stored in applier.recorded_violations().await? {
        let pair = (stored.invariant.clone(), stored.record_sk.clone());
        if found.contains(&pair) {
            continue;
        }
        let Some(id) = spec
            .invariants
            .iter()
            .position(|i| i.name == stored.invariant)
        else {
            continue;
        };
        let invariant = &spec.invariants[id];
        let now: Vec<crate::invariant::Violation> = if invariant.is_partition_scoped() {
            let items = reader
                .partition(invariant.entity, &stored.scope)
                .await
                .map_err(fatal)?;
            crate::invariant::check_partition(spec, invariant, &stored.scope, &items)
        } else {
            let (holders, _) = reader
                .unique_holders(id, &stored.scope, None)
                .await
                .map_err(fatal)?;
            crate::invariant::check_unique(invariant, &stored.scope, &holders)
                .into_iter()
                .collect()
        };
        if now.iter().any(|v| v.record_sk() == stored.record_sk) {
            keep.push(pair);
        }
    }
    let skew = applier.config().clock_skew.as_millis() as u64;
    applier
        .clear_violations_except(&keep, started_ms.saturating_sub(skew))
        .await
}

/// Violations of one scope several pages reported (a `unique` value seen
/// from holders its index lost) as one, naming every item any of them
/// named; in spec order, by scope.
fn one_per_scope(
    spec: &Spec,
    violations: Vec<(usize, crate::invariant::Violation)>,
) -> Vec<(usize, crate::invariant::Violation)> {
    let mut by_scope: BTreeMap<(usize, String), crate::invariant::Violation> = BTreeMap::new();
    for (id, violation) in violations {
        match by_scope.entry((id, violation.record_sk())) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(violation);
            }
            std::collections::btree_map::Entry::Occupied(mut slot) => {
                let kept = slot.get_mut();
                let mut keys = std::mem::take(&mut kept.keys);
                keys.extend(violation.keys);
                keys.sort();
                keys.dedup();
                let invariant = &spec.invariants[id];
                match invariant.is_partition_scoped() {
                    false => match crate::invariant::check_unique(invariant, &kept.scope, &keys) {
                        Some(merged) => *kept = merged,
                        None => kept.keys = keys,
                    },
                    true => kept.keys = keys,
                }
            }
        }
    }
    by_scope
        .into_iter()
        .map(|((id, _), violation)| (id, violation))
        .collect()
}

/// The violations of one scope that several segments reported (a
/// `unique` value seen from holders its index lost) as one finding naming
/// every item any of them named, its message made again from them; and
/// those `unique` violations, for the violation store.
fn one_per_key(
    spec: &Spec,
    findings: Vec<Finding>,
) -> (Vec<Finding>, Vec<crate::invariant::Violation>) {
    let mut out: Vec<Finding> = Vec::with_capacity(findings.len());
    let mut at: HashMap<(String, String), usize> = HashMap::new();
    let mut merged: Vec<usize> = Vec::new();
    for finding in findings {
        if finding.problem != Problem::Violation {
            out.push(finding);
            continue;
        }
        let id = (finding.rule.clone(), finding.key.clone());
        match at.get(&id) {
            Some(&i) => {
                let kept = &mut out[i];
                kept.items.extend(finding.items);
                kept.items.sort();
                kept.items.dedup();
                kept.repaired |= finding.repaired;
                if !merged.contains(&i) {
                    merged.push(i);
                }
            }
            None => {
                at.insert(id, out.len());
                out.push(finding);
            }
        }
    }
    let mut unique = Vec::new();
    for i in merged {
        let finding = &mut out[i];
        let Some(invariant) = spec
            .invariants
            .iter()
            .find(|i| i.name == finding.rule && !i.is_partition_scoped())
        else {
            continue;
        };
        let keys: Vec<ItemKey> = finding
            .items
            .iter()
            .map(|text| match text.split_once(" / ") {
                Some((pk, sk)) => ItemKey {
                    pk: pk.to_string(),
                    sk: Some(sk.to_string()),
                },
                None => ItemKey {
                    pk: text.clone(),
                    sk: None,
                },
            })
            .collect();
        if let Some(violation) = crate::invariant::check_unique(invariant, &finding.key, &keys) {
            finding.detail = violation.message.clone();
            unique.push(violation);
        }
    }
    (out, unique)
}

/// The number of segments `reports` cover, when they are every segment of
/// one scan exactly once.
fn covered(reports: &[AuditReport], table: &str) -> Result<u32, String> {
    let Some(first) = reports.first() else {
        return Err("no segment reports to merge".to_string());
    };
    let total = first.total_segments;
    let mut seen = vec![false; total as usize];
    for report in reports {
        let Some(segment) = report.segment else {
            return Err("a report of a whole audit (not one segment) cannot be merged".to_string());
        };
        if report.table != table {
            return Err(format!(
                "the report of segment {segment} is of the table `{}`, not `{table}`",
                report.table
            ));
        }
        if report.total_segments != total {
            return Err(format!(
                "the reports are of different scans: {} and {total} segments",
                report.total_segments
            ));
        }
        if report.sketch.is_none() {
            return Err(format!(
                "the report of segment {segment} has no counter sketch"
            ));
        }
        if !report.complete {
            return Err(format!(
                "the audit of segment {segment} did not finish: resume it from its checkpoint"
            ));
        }
        match seen.get_mut(segment as usize) {
            Some(true) => return Err(format!("segment {segment} is given twice")),
            Some(slot) => *slot = true,
            None => return Err(format!("segment {segment} is not below {total}")),
        }
    }
    let missing: Vec<String> = (0..total)
        .filter(|&s| !seen[s as usize])
        .map(|s| s.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "segments {} of {total} are missing",
            missing.join(", ")
        ));
    }
    Ok(total)
}

/// Metrics and the closing log line of an audit or a merge.
/// Counts what an audit concluded, and `scanned_now`, the items scanned
/// by this call (a resumed slice or a merge counts only its own).
pub(crate) fn finished(spec: &Spec, report: &AuditReport, scanned_now: u64) {
    metrics::counter!("projector_audit_items_scanned_total").increment(scanned_now);
    for (rule, n) in report.counts() {
        metrics::gauge!("projector_audit_findings", "rule" => rule).set(n as f64);
    }
    // Concluded findings only: a segment's are counted by its merge.
    for finding in report.findings.iter().filter(|_| report.segment.is_none()) {
        metrics::counter!(
            "projector_audit_findings_total",
            "projection" => finding.rule.clone(),
            "service" => spec.service_of(&finding.rule).to_string(),
            "kind" => finding.problem.kind()
        )
        .increment(1);
    }
    tracing::info!(
        segment = report.segment,
        scanned = report.scanned,
        findings = report.findings.len(),
        repaired = report.repaired,
        seconds = report.seconds,
        "audit finished"
    );
}

fn ended() -> bool {
    true
}

/// Findings in spec order (projections, then invariants), by key within
/// a rule: segments and pages finish in any order.
fn sort_findings(spec: &Spec, findings: &mut [Finding]) {
    let rank: HashMap<&str, usize> = spec
        .projections
        .iter()
        .map(|p| p.name.as_str())
        .chain(spec.invariants.iter().map(|i| i.name.as_str()))
        .enumerate()
        .map(|(i, name)| (name, i))
        .collect();
    findings.sort_by(|a, b| {
        let order = |f: &Finding| rank.get(f.rule.as_str()).copied().unwrap_or(usize::MAX);
        (order(a), &a.key, a.problem.label()).cmp(&(order(b), &b.key, b.problem.label()))
    });
}
