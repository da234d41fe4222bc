//! `audit`: recompute every derived item and counter of a table from its
//! source items, and check every invariant, from one full parallel scan.
//!
//! What it compares, per projection (each projection carries the implicit
//! `derived-consistent` invariant):
//!
//! - `index-keys`: every item of the entity carries the attributes the
//!   planner computes from it (missing or stale otherwise);
//! - `denormalize`: every existing target carries what
//!   [`crate::plan::compute_denormalized`] computes from its sources;
//! - `inverse-edge`: a reverse item exists exactly for each source edge
//!   that satisfies `when`, equal to what the planner writes (missing,
//!   stale, orphaned);
//! - `counter`: the sum of the shards equals the number of counted source
//!   items (off by how much), and a counter's own markers exist exactly for
//!   the counted items.
//!
//! `--repair` writes derived state back to what it should be through the
//! same applier the worker uses (conditional writes, guards on the source
//! state the scan saw), never source items; counters are set last, from a
//! consistent read of their shards, on condition that the shard read is
//! unchanged. The recorded violations are replaced by the ones found.
//!
//! **Architecture Invariant:** the audit's "expected" side is computed by
//! the planner's own functions from the scanned items, so audit and worker
//! can never disagree about what a projection means.
//!
//! The scan keeps the items of spec entities (and counter items) in memory:
//! about the table's size in those entities. Tables beyond one machine's
//! memory want a segment-by-entity design; see ARCHITECTURE.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};
use serde::Serialize;

use crate::apply::{Applier, ApplyError, BatchStats, CHANGES_ATTRIBUTE, COUNT_ATTRIBUTE};
use crate::decode::scanned_record;
use crate::invariant::{check_partition, check_unique, unique_value, Violation};
use crate::plan::{plan_record, Effect, MarkerState, Op, SourceQuery};
use crate::record::{item_to_json, Item, ItemKey};
use crate::spec::{ProjectionId, ProjectionKind, Spec, RESERVED_PREFIX};

/// How to run an audit.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Parallel scan segments.
    pub segments: u32,
    /// Write derived state back to what it should be.
    pub repair: bool,
    /// Show a progress bar (terminal) or log lines.
    pub progress: bool,
    /// Items per scan page (`None`: DynamoDB's 1 MB pages).
    pub page_size: Option<i32>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            segments: 4,
            repair: false,
            progress: false,
            page_size: None,
        }
    }
}

/// What is wrong with one derived item, counter or invariant.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The projection or invariant.
    pub rule: String,
    /// Its kind (`inverse-edge`, `exactly-one` ...).
    pub rule_kind: &'static str,
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
    #[serde(skip)]
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
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
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
            let found: Vec<&Finding> = self.findings.iter().filter(|f| f.rule == rule).collect();
            if found.is_empty() {
                out.push_str(&format!("{rule} ({kind}): ok\n"));
                continue;
            }
            out.push_str(&format!("{rule} ({kind}): {} found\n", found.len()));
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
        out
    }
}

/// What the scan keeps: items of spec entities, counters' own markers,
/// counter shards, and how many records name each shard.
#[derive(Default)]
struct Snapshot {
    /// Entity items: (entity, key, item).
    items: Vec<(usize, ItemKey, Item)>,
    /// Counters' own marker items, and items of no entity that carry
    /// counter records.
    markers: HashMap<ItemKey, Item>,
    /// Counter shards by partition key: (counter, its values joined by `#`, count).
    shards: HashMap<String, (ProjectionId, String, i64)>,
    /// Records of this spec's counters, per shard partition key they name.
    records: HashMap<String, i64>,
    scanned: u64,
}

/// Runs an audit (see the module docs).
pub async fn audit(applier: &Applier, options: &AuditOptions) -> Result<AuditReport, ApplyError> {
    let started = Instant::now();
    let spec = applier.spec();
    let read_micro = AtomicU64::new(0);
    let progress = Progress::new(
        options.progress,
        crate::backfill::estimate_items(applier).await,
    );
    let segments = options.segments.max(1);
    let scans = (0..segments).map(|segment| {
        scan_segment(
            applier,
            segment,
            segments,
            options.page_size,
            &read_micro,
            &progress,
        )
    });
    let pages = futures::future::try_join_all(scans).await?;
    progress.finish();
    let mut snapshot = Snapshot::default();
    for items in pages {
        for item in items {
            snapshot.scanned += 1;
            classify(spec, item, &mut snapshot);
        }
    }
    let mut report = AuditReport {
        scanned: snapshot.scanned,
        ..AuditReport::default()
    };
    let mut findings = Vec::new();
    derived(spec, &snapshot, &mut findings);
    markers(spec, &snapshot, &mut findings);
    counters(spec, &snapshot, &mut findings);
    let violations = invariants(spec, &snapshot, &mut findings);
    report.findings = findings;
    report.read_units = read_micro.load(Ordering::Relaxed) as f64 / 1e6;
    if options.repair {
        repair(applier, &mut report).await?;
        let (recorded, cleared) = applier.replace_violations(&violations).await?;
        report.violations_recorded = recorded;
        report.violations_cleared = cleared;
    }
    report.seconds = started.elapsed().as_secs_f64();
    metrics::counter!("projector_audit_items_scanned_total").increment(report.scanned);
    for (rule, n) in report.counts() {
        metrics::gauge!("projector_audit_findings", "rule" => rule).set(n as f64);
    }
    tracing::info!(
        scanned = report.scanned,
        findings = report.findings.len(),
        repaired = report.repaired,
        seconds = report.seconds,
        "audit finished"
    );
    Ok(report)
}

/// The counter a shard partition key belongs to, and its values joined by
/// `#` (`COUNTER#followers#b#3` -> followers, `b`).
fn parse_shard(spec: &Spec, pk: &str) -> Option<(ProjectionId, String)> {
    let rest = pk.strip_prefix("COUNTER#")?;
    spec.projections
        .iter()
        .enumerate()
        .find_map(|(id, projection)| {
            let ProjectionKind::Counter(counter) = &projection.kind else {
                return None;
            };
            let rest = rest
                .strip_prefix(counter.storage.as_str())?
                .strip_prefix('#')?;
            let (values, shard) = rest.rsplit_once('#')?;
            shard.parse::<u32>().ok()?;
            Some((id, values.to_string()))
        })
}

fn classify(spec: &Spec, item: Item, snapshot: &mut Snapshot) {
    let Some(key) = spec.table.item_key(&item) else {
        return;
    };
    for value in crate::apply::records_of(&item).values() {
        if let crate::record::AttributeValue::S(shard) = value {
            *snapshot.records.entry(shard.clone()).or_insert(0) += 1;
        }
    }
    if key.pk.starts_with(RESERVED_PREFIX) {
        // Counters' own markers, also of a counter this spec no longer
        // reads so (its source changed) while they still count.
        if spec.parse_counter_marker(&key).is_some()
            || key.pk.starts_with(crate::spec::COUNTER_MARKER_PREFIX)
                && item.contains_key(crate::spec::RECORDS_ATTRIBUTE)
        {
            snapshot.markers.insert(key, item);
        }
        return;
    }
    if spec.table.sort_key.is_none() || key.sk.as_deref() == Some("COUNTER") {
        if let Some((id, values)) = parse_shard(spec, &key.pk) {
            let count = match item.get(COUNT_ATTRIBUTE) {
                Some(crate::record::AttributeValue::N(n)) => n.parse::<i64>().unwrap_or(0),
                _ => 0,
            };
            snapshot.shards.insert(key.pk, (id, values, count));
            return;
        }
    }
    let mut vars = Vec::new();
    if let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) {
        snapshot.items.push((entity, key, item));
    } else if item.contains_key(crate::spec::RECORDS_ATTRIBUTE) {
        // An item of an entity the spec no longer has, still counted in.
        snapshot.markers.insert(key, item);
    }
}

fn finding(spec: &Spec, id: ProjectionId, problem: Problem, key: &ItemKey) -> Finding {
    Finding {
        rule: spec.projections[id].name.clone(),
        rule_kind: spec.projections[id].kind_name(),
        problem,
        key: key.to_string(),
        items: Vec::new(),
        detail: String::new(),
        repaired: false,
        fix: None,
    }
}

fn show(item: Option<&Item>) -> String {
    match item {
        Some(item) => item_to_json(item).to_string(),
        None => "(none)".to_string(),
    }
}

/// Derived state, per projection in spec order.
fn derived(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    for (id, projection) in spec.projections.iter().enumerate() {
        let selection = [id];
        match &projection.kind {
            ProjectionKind::IndexKeys(keys) => {
                for (entity, key, item) in &snapshot.items {
                    if *entity != keys.entity {
                        continue;
                    }
                    let Ok(record) = scanned_record(&spec.table, 0, 0, item.clone()) else {
                        continue;
                    };
                    let plan = plan_record(spec, &record, Some(&selection));
                    if let Some(error) = plan.errors.first() {
                        let mut f = finding(spec, id, Problem::Underivable, key);
                        f.detail = error.problem.to_string();
                        out.push(f);
                        continue;
                    }
                    for effect in plan.effects {
                        let Op::SetAttributes { set, .. } = &effect.op else {
                            continue;
                        };
                        let missing = set.iter().all(|(attr, _)| !item.contains_key(attr));
                        let mut f = finding(
                            spec,
                            id,
                            if missing {
                                Problem::Missing
                            } else {
                                Problem::Stale
                            },
                            key,
                        );
                        f.detail = set
                            .iter()
                            .map(|(attr, want)| {
                                format!(
                                    "{attr}: is {}, should be {}",
                                    item.get(attr)
                                        .map(|v| crate::record::value_to_json(v).to_string())
                                        .unwrap_or_else(|| "(none)".to_string()),
                                    crate::record::value_to_json(want)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("; ");
                        f.fix = Some(Fix::Effect(Box::new(effect)));
                        out.push(f);
                    }
                }
            }
            ProjectionKind::Denormalize(p) => {
                let source = &spec.entities[p.source];
                let target = &spec.entities[p.target];
                let mut sources: HashMap<ItemKey, Vec<Item>> = HashMap::new();
                for (entity, key, item) in &snapshot.items {
                    if *entity != p.source {
                        continue;
                    }
                    let mut vars = Vec::new();
                    spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
                    if let Some(target_key) = target.render_key(&vars) {
                        sources.entry(target_key).or_default().push(item.clone());
                    }
                }
                for (entity, key, item) in &snapshot.items {
                    if *entity != p.target {
                        continue;
                    }
                    let own = sources.get(key).map(Vec::as_slice).unwrap_or(&[]);
                    let expected = match crate::plan::compute_denormalized(spec, id, own) {
                        Ok(expected) => expected,
                        Err(error) => {
                            let mut f = finding(spec, id, Problem::Underivable, key);
                            f.detail = error.to_string();
                            out.push(f);
                            continue;
                        }
                    };
                    let wrong: Vec<String> = expected
                        .iter()
                        .filter(|(attr, want)| match (item.get(attr), want) {
                            (None, None) => false,
                            (Some(have), Some(want)) => !crate::spec::values_equal(have, want),
                            _ => true,
                        })
                        .map(|(attr, want)| {
                            format!(
                                "{attr}: is {}, should be {}",
                                item.get(attr)
                                    .map(|v| crate::record::value_to_json(v).to_string())
                                    .unwrap_or_else(|| "(none)".to_string()),
                                want.as_ref()
                                    .map(|v| crate::record::value_to_json(v).to_string())
                                    .unwrap_or_else(|| "(none)".to_string())
                            )
                        })
                        .collect();
                    if wrong.is_empty() {
                        continue;
                    }
                    let mut vars = Vec::new();
                    spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
                    let Some(pk) = source.pk.render(&vars) else {
                        continue;
                    };
                    let mut f = finding(spec, id, Problem::Stale, key);
                    f.detail = wrong.join("; ");
                    f.items = own
                        .iter()
                        .filter_map(|s| spec.table.item_key(s))
                        .map(|k| k.to_string())
                        .collect();
                    f.fix = Some(Fix::Effect(Box::new(Effect {
                        projection: id,
                        op: Op::Recompute {
                            target: key.clone(),
                            sources: SourceQuery {
                                pk,
                                sk_prefix: source
                                    .sk
                                    .as_ref()
                                    .map(|sk| sk.literal_prefix().to_string())
                                    .filter(|p| !p.is_empty()),
                            },
                        },
                    })));
                    out.push(f);
                }
            }
            // Memberships and counters are checked across projections below.
            ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_) => {}
            ProjectionKind::Custom(_) => {}
        }
    }
}

/// Reverse edges, counter markers and counter records: every scanned item
/// is planned as a backfill would plan it, and each membership or record
/// effect is checked against the snapshot with the applier's own
/// transition (nothing to write: in place).
fn markers(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    let mut by_key: HashMap<&ItemKey, &Item> = snapshot
        .items
        .iter()
        .map(|(_, key, item)| (key, item))
        .collect();
    by_key.extend(snapshot.markers.iter());
    let scanned = snapshot
        .items
        .iter()
        .map(|(_, key, item)| (key, item))
        .chain(snapshot.markers.iter());
    for (key, item) in scanned {
        let Ok(record) = scanned_record(&spec.table, 0, 0, item.clone()) else {
            continue;
        };
        let plan = plan_record(spec, &record, None);
        for error in &plan.errors {
            let Some(id) = error.projection else { continue };
            if matches!(
                spec.projections[id].kind,
                ProjectionKind::InverseEdge(_) | ProjectionKind::Counter(_)
            ) {
                let mut f = finding(spec, id, Problem::Underivable, key);
                f.detail = error.problem.to_string();
                out.push(f);
            }
        }
        for effect in plan.effects {
            check_marker(spec, &by_key, effect, out);
        }
    }
}

fn check_marker(
    spec: &Spec,
    by_key: &HashMap<&ItemKey, &Item>,
    effect: Effect,
    out: &mut Vec<Finding>,
) {
    let Some(change) = crate::apply::marker_change(spec, &effect) else {
        return;
    };
    if let Some(guard) = change.guard {
        if !guard.holds(by_key.get(&guard.source).copied()) {
            return;
        }
    }
    let old = by_key.get(change.key).copied();
    if change.exact(&spec.table, old).is_none() {
        return;
    }
    // A scan plans every membership with a guard on its source.
    let source = change
        .guard
        .map(|guard| guard.source.clone())
        .unwrap_or_else(|| change.key.clone());
    let source = &source;
    let mut found: Vec<Finding> = Vec::new();
    match (&effect.op, old) {
        (
            Op::DropRecord {
                item,
                counter,
                shard,
            },
            _,
        ) => {
            let mut f = finding(spec, *counter, Problem::Orphaned, item);
            f.detail = format!(
                "a record of the counter in shard {shard}, on an item where the counter no longer keeps its members"
            );
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Absent,
                ..
            },
            Some(old),
        ) => {
            let mut f = finding(spec, effect.projection, Problem::Orphaned, marker);
            f.items = vec![source.to_string()];
            f.detail = format!(
                "its source {source} {}",
                if by_key.contains_key(source) {
                    "does not satisfy `when`"
                } else {
                    "does not exist"
                }
            );
            let records: Vec<String> = crate::apply::records_of(old)
                .iter()
                .map(|(name, value)| format!("{name} in {}", crate::record::value_to_json(value)))
                .collect();
            if !records.is_empty() {
                f.detail
                    .push_str(&format!("; it counts in {}", records.join(", ")));
            }
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Present(want),
                counters,
                ..
            },
            None,
        ) => {
            let mut f = finding(spec, effect.projection, Problem::Missing, marker);
            f.items = vec![source.to_string()];
            f.detail = format!("should be {}", show(Some(want)));
            if !counters.is_empty() {
                let names: Vec<&str> = counters
                    .iter()
                    .map(|c| spec.projections[c.counter].name.as_str())
                    .collect();
                f.detail
                    .push_str(&format!(", counted in {}", names.join(", ")));
            }
            found.push(f);
        }
        (
            Op::Membership {
                marker,
                state: MarkerState::Present(want),
                counters,
                ..
            },
            Some(old),
        ) => {
            let copies: Vec<String> = want
                .iter()
                .filter(|(name, _)| !spec.table.is_key_attribute(name))
                .filter(|(name, value)| {
                    !old.get(*name)
                        .is_some_and(|have| crate::spec::values_equal(have, value))
                })
                .map(|(name, value)| {
                    format!(
                        "{name}: is {}, should be {}",
                        old.get(name)
                            .map(|v| crate::record::value_to_json(v).to_string())
                            .unwrap_or_else(|| "(none)".to_string()),
                        crate::record::value_to_json(value)
                    )
                })
                .chain(
                    old.iter()
                        .filter(|(name, _)| {
                            !spec.table.is_key_attribute(name)
                                && !crate::plan::is_record_attribute(name)
                                && !want.contains_key(*name)
                        })
                        .map(|(name, _)| format!("{name}: should be absent")),
                )
                .collect();
            if !copies.is_empty() {
                let mut f = finding(spec, effect.projection, Problem::Stale, marker);
                f.items = vec![source.to_string()];
                f.detail = copies.join("; ");
                found.push(f);
            }
            let records = crate::apply::records_of(old);
            for counter in counters {
                let name = spec.storage(counter.counter);
                let have = records.get(name);
                if have == Some(&crate::record::AttributeValue::S(counter.key.pk.clone())) {
                    continue;
                }
                let mut f = finding(
                    spec,
                    counter.counter,
                    if have.is_some() {
                        Problem::Stale
                    } else {
                        Problem::Missing
                    },
                    marker,
                );
                f.items = vec![source.to_string()];
                f.detail = format!(
                    "the record of {source}: is {}, should be {:?}",
                    have.map(|v| crate::record::value_to_json(v).to_string())
                        .unwrap_or_else(|| "(none)".to_string()),
                    counter.key.pk
                );
                found.push(f);
            }
            // Otherwise only records of counters the spec no longer has
            // differ: retired data, not what this spec derives (a write of
            // the item drops them, shard and all; pruning removes them).
        }
        _ => {}
    }
    // One repair fixes them all: the first finding carries it.
    if let Some(first) = found.first_mut() {
        first.fix = Some(Fix::Effect(Box::new(effect)));
    }
    out.extend(found);
}

/// Counters: the sum of the shards against the number of counted source
/// items, and each shard against the number of records naming it.
fn counters(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) {
    for (id, projection) in spec.projections.iter().enumerate() {
        let ProjectionKind::Counter(counter) = &projection.kind else {
            continue;
        };
        let mut targets: BTreeMap<String, (Vec<String>, i64, i64)> = BTreeMap::new();
        for (entity, key, item) in &snapshot.items {
            if *entity != counter.source
                || !(counter.when.is_empty() || counter.when.holds(Some(item)))
            {
                continue;
            }
            let mut vars = Vec::new();
            spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
            let Ok(values) = counter
                .of
                .iter()
                .map(|(_, t)| t.render(&vars, None::<&Item>))
                .collect::<Result<Vec<String>, _>>()
            else {
                continue;
            };
            targets
                .entry(values.join("#"))
                .or_insert_with(|| (values, 0, 0))
                .1 += 1;
        }
        for (counter_id, joined, count) in snapshot.shards.values() {
            if *counter_id != id {
                continue;
            }
            let values = if counter.of.len() == 1 {
                vec![joined.clone()]
            } else {
                joined.split('#').map(str::to_string).collect()
            };
            targets
                .entry(joined.clone())
                .or_insert_with(|| (values, 0, 0))
                .2 += count;
        }
        for (joined, (values, want, have)) in targets {
            if want == have {
                continue;
            }
            let shards = (0..counter.shards)
                .map(|shard| spec.counter_shard_key(&counter.storage, &values, shard).pk)
                .collect();
            out.push(Finding {
                rule: projection.name.clone(),
                rule_kind: projection.kind_name(),
                problem: Problem::CounterOff {
                    expected: want,
                    actual: have,
                },
                key: format!("COUNTER#{}#{joined}", counter.storage),
                items: Vec::new(),
                detail: counter
                    .of
                    .iter()
                    .zip(&values)
                    .map(|((name, _), value)| format!("{name}={value}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                repaired: false,
                fix: Some(Fix::Recount(shards)),
            });
        }
        // Each shard against the records naming it.
        let mut shards: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (pk, (counter_id, _, count)) in &snapshot.shards {
            if *counter_id == id {
                shards.entry(pk).or_default().0 = *count;
            }
        }
        for (pk, n) in &snapshot.records {
            if parse_shard(spec, pk).is_some_and(|(counter_id, _)| counter_id == id) {
                shards.entry(pk).or_default().1 = *n;
            }
        }
        for (pk, (holds, records)) in shards {
            if holds == records {
                continue;
            }
            let shard = spec.shard_item(pk);
            let mut f = finding(spec, id, Problem::ShardOff { holds, records }, &shard);
            f.fix = Some(Fix::Recount(vec![pk.to_string()]));
            out.push(f);
        }
    }
}

/// Invariants over the snapshot; returns the violations for the store.
fn invariants(spec: &Spec, snapshot: &Snapshot, out: &mut Vec<Finding>) -> Vec<Violation> {
    let mut all = Vec::new();
    for invariant in &spec.invariants {
        let mut found = Vec::new();
        if invariant.is_partition_scoped() {
            let mut partitions: BTreeMap<&str, Vec<Item>> = BTreeMap::new();
            for (entity, key, item) in &snapshot.items {
                if *entity == invariant.entity {
                    partitions
                        .entry(key.pk.as_str())
                        .or_default()
                        .push(item.clone());
                }
            }
            for (pk, items) in partitions {
                found.extend(check_partition(spec, invariant, pk, &items));
            }
        } else {
            let mut holders: BTreeMap<String, Vec<ItemKey>> = BTreeMap::new();
            for (entity, key, item) in &snapshot.items {
                if *entity != invariant.entity {
                    continue;
                }
                if let Some(value) = unique_value(spec, invariant, item) {
                    holders.entry(value).or_default().push(key.clone());
                }
            }
            for (value, keys) in holders {
                found.extend(check_unique(invariant, &value, &keys));
            }
        }
        for violation in &found {
            out.push(Finding {
                rule: invariant.name.clone(),
                rule_kind: invariant.kind_name(),
                problem: Problem::Violation,
                key: match &violation.item {
                    Some(sk) if !sk.is_empty() => format!("{} / {sk}", violation.scope),
                    _ => violation.scope.clone(),
                },
                items: violation.keys.iter().map(|k| k.to_string()).collect(),
                detail: violation.message.clone(),
                repaired: false,
                fix: None,
            });
        }
        all.extend(found);
    }
    all
}

/// Writes the fixes of an audit's findings: derived items, markers and
/// records through the applier (reading first, guarded by the source state
/// the scan saw, so nothing newer is undone), then counter shards that do
/// not hold the number of records naming them (see [`recount`]).
pub async fn repair(applier: &Applier, report: &mut AuditReport) -> Result<(), ApplyError> {
    let mut effects: Vec<Effect> = Vec::new();
    let mut owners: Vec<Vec<usize>> = Vec::new();
    for (index, finding) in report.findings.iter().enumerate() {
        if let Some(Fix::Effect(effect)) = &finding.fix {
            match effects.iter().position(|e| e == effect.as_ref()) {
                Some(at) => owners[at].push(index),
                None => {
                    effects.push(effect.as_ref().clone());
                    owners.push(vec![index]);
                }
            }
        }
    }
    let (results, stats) = applier.apply_effects(effects, true).await;
    let mut total = BatchStats::default();
    total.add(&stats);
    for (indexes, result) in owners.into_iter().zip(results) {
        for index in indexes {
            match &result {
                Ok(()) => report.findings[index].repaired = true,
                Err(error) => report.repair_failures.push(format!(
                    "{} {}: {error}",
                    report.findings[index].rule, report.findings[index].key
                )),
            }
        }
    }
    // Findings that share a repaired effect's marker are repaired with it.
    let fixed: HashSet<String> = report
        .findings
        .iter()
        .filter(|f| f.repaired)
        .map(|f| f.key.clone())
        .collect();
    for finding in &mut report.findings {
        if finding.fix.is_none() && fixed.contains(&finding.key) {
            finding.repaired = true;
        }
    }
    // Counters last, after the records are in place.
    let mut shards: Vec<String> = Vec::new();
    for finding in &report.findings {
        if let Some(Fix::Recount(list)) = &finding.fix {
            for shard in list {
                if !shards.contains(shard) {
                    shards.push(shard.clone());
                }
            }
        }
    }
    if !shards.is_empty() {
        let outcome = recount(applier, &shards, &mut total).await?;
        for index in 0..report.findings.len() {
            let Some(Fix::Recount(list)) = &report.findings[index].fix else {
                continue;
            };
            let errors: Vec<String> = list
                .iter()
                .filter_map(|shard| match outcome.get(shard) {
                    Some(Err(error)) => Some(error.clone()),
                    _ => None,
                })
                .collect();
            if errors.is_empty() {
                report.findings[index].repaired = true;
            }
            for error in errors {
                report.repair_failures.push(format!(
                    "{} {}: {error}",
                    report.findings[index].rule, report.findings[index].key
                ));
            }
        }
    }
    report.repaired = report.findings.iter().filter(|f| f.repaired).count();
    report.write_units = total.write_units;
    report.read_units += total.read_units;
    metrics::counter!("projector_audit_repairs_total").increment(report.repaired as u64);
    Ok(())
}

/// A shard's count and how many transactions moved it.
async fn read_shards(
    applier: &Applier,
    shards: &[String],
    stats: &mut BatchStats,
) -> Result<HashMap<String, (i64, Option<i64>)>, String> {
    let spec = applier.spec();
    let mut out = HashMap::new();
    for shard in shards {
        let output = applier
            .client()
            .get_item()
            .table_name(applier.table())
            .set_key(Some(spec.table.key_item(&spec.shard_item(shard)).into()))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| crate::apply::retry_describe(&e))?;
        if let Some(c) = output.consumed_capacity() {
            stats.read_units += c.capacity_units().unwrap_or(0.0);
        }
        let number = |name: &str| match output.item().and_then(|i| i.get(name)) {
            Some(Av::N(n)) => n.parse::<i64>().ok(),
            _ => None,
        };
        out.insert(
            shard.clone(),
            (
                number(COUNT_ATTRIBUTE).unwrap_or(0),
                number(CHANGES_ATTRIBUTE),
            ),
        );
    }
    Ok(out)
}

/// Sets each shard to the number of records naming it, without racing
/// the live worker: every transaction that adds, moves or removes a record
/// also bumps the shard's `changes`. The shards are read, the table is
/// scanned for their records, the shards are read again; a shard no
/// transaction moved meanwhile had exactly the records counted, and is
/// corrected on condition that it still has not moved. One that did is
/// reported ("run the audit again").
async fn recount(
    applier: &Applier,
    shards: &[String],
    stats: &mut BatchStats,
) -> Result<HashMap<String, Result<i64, String>>, ApplyError> {
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    let before = read_shards(applier, shards, stats).await.map_err(fatal)?;
    let wanted: HashSet<&str> = shards.iter().map(String::as_str).collect();
    let records = count_records(applier, &wanted, stats).await?;
    let after = read_shards(applier, shards, stats).await.map_err(fatal)?;
    let spec = applier.spec();
    let mut outcome = HashMap::new();
    for shard in shards {
        let (count, changes) = after[shard];
        if before[shard] != after[shard] {
            outcome.insert(
                shard.clone(),
                Err(format!(
                    "shard {shard} changed while its records were counted; run the audit again"
                )),
            );
            continue;
        }
        let named = records.get(shard.as_str()).copied().unwrap_or(0);
        let delta = named - count;
        if delta == 0 {
            outcome.insert(shard.clone(), Ok(named));
            continue;
        }
        let mut request = applier
            .client()
            .update_item()
            .table_name(applier.table())
            .set_key(Some(spec.table.key_item(&spec.shard_item(shard)).into()))
            .update_expression("ADD #c :d, #n :one")
            .expression_attribute_names("#c", COUNT_ATTRIBUTE)
            .expression_attribute_names("#n", CHANGES_ATTRIBUTE)
            .expression_attribute_values(":d", Av::N(delta.to_string()))
            .expression_attribute_values(":one", Av::N("1".to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        request = match changes {
            Some(changes) => request
                .condition_expression("#n = :seen")
                .expression_attribute_values(":seen", Av::N(changes.to_string())),
            None => request.condition_expression("attribute_not_exists(#n)"),
        };
        let result = match request.send().await {
            Ok(output) => {
                if let Some(c) = output.consumed_capacity() {
                    stats.write_units += c.capacity_units().unwrap_or(0.0);
                }
                Ok(named)
            }
            Err(error) => Err(format!(
                "shard {shard} changed while repairing; run the audit again ({})",
                crate::apply::retry_describe(&error)
            )),
        };
        outcome.insert(shard.clone(), result);
    }
    Ok(outcome)
}

/// The records naming each of `shards`, from a full scan that keeps
/// nothing else.
async fn count_records(
    applier: &Applier,
    shards: &HashSet<&str>,
    stats: &mut BatchStats,
) -> Result<HashMap<String, i64>, ApplyError> {
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut start: Option<HashMap<String, Av>> = None;
    loop {
        let request = applier
            .client()
            .scan()
            .table_name(applier.table())
            .consistent_read(true)
            .set_exclusive_start_key(start.clone())
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let retries = AtomicU64::new(0);
        let page = crate::apply::with_retries(
            "audit_recount",
            std::time::Duration::from_secs(60),
            &retries,
            || {
                let request = request.clone();
                async move { request.send().await.map_err(crate::apply::sdk) }
            },
        )
        .await
        .map_err(|e| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!("the recount's scan failed: {e}"),
        })?;
        if let Some(c) = page.consumed_capacity() {
            stats.read_units += c.capacity_units().unwrap_or(0.0);
        }
        for item in page.items() {
            if let Some(Av::M(records)) = item.get(crate::spec::RECORDS_ATTRIBUTE) {
                for value in records.values() {
                    if let Av::S(shard) = value {
                        if shards.contains(shard.as_str()) {
                            *counts.entry(shard.clone()).or_insert(0) += 1;
                        }
                    }
                }
            }
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return Ok(counts),
        }
    }
}

async fn scan_segment(
    applier: &Applier,
    segment: u32,
    total: u32,
    page_size: Option<i32>,
    read_micro: &AtomicU64,
    progress: &Progress,
) -> Result<Vec<Item>, ApplyError> {
    let mut items = Vec::new();
    let mut start: Option<HashMap<String, Av>> = None;
    loop {
        let request = applier
            .client()
            .scan()
            .table_name(applier.table())
            .segment(segment as i32)
            .total_segments(total as i32)
            .consistent_read(true)
            .set_limit(page_size)
            .set_exclusive_start_key(start.clone())
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let retries = AtomicU64::new(0);
        let page = crate::apply::with_retries(
            "audit_scan",
            std::time::Duration::from_secs(60),
            &retries,
            || {
                let request = request.clone();
                async move { request.send().await.map_err(crate::apply::sdk) }
            },
        )
        .await
        .map_err(|e| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!("scan of segment {segment} failed: {e}"),
        })?;
        if let Some(c) = page.consumed_capacity() {
            read_micro.fetch_add(
                (c.capacity_units().unwrap_or(0.0) * 1e6) as u64,
                Ordering::Relaxed,
            );
        }
        progress.advance(page.items().len() as u64);
        for raw in page.items() {
            let item = crate::decode::item_from_sdk(raw.clone()).map_err(|error| {
                let key = applier.spec().table.key_attributes(raw);
                ApplyError::Fatal {
                    table: applier.table().to_string(),
                    message: format!(
                        "cannot audit the item {}: {error}",
                        crate::decode::item_json(&key)
                    ),
                }
            })?;
            items.push(item);
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return Ok(items),
        }
    }
}

/// A bar on a terminal, log lines every few seconds otherwise.
struct Progress {
    bar: indicatif::ProgressBar,
    enabled: bool,
    terminal: bool,
    scanned: AtomicU64,
    last_log: std::sync::Mutex<Instant>,
}

impl Progress {
    fn new(enabled: bool, estimate: Option<u64>) -> Progress {
        let terminal = enabled && std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(estimate.unwrap_or(0));
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/~{len} items ({per_sec}, eta {eta})",
                )
                .expect("valid template"),
            );
            bar.set_prefix("audit");
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress {
            bar,
            enabled,
            terminal,
            scanned: AtomicU64::new(0),
            last_log: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn advance(&self, n: u64) {
        self.bar.inc(n);
        let scanned = self.scanned.fetch_add(n, Ordering::Relaxed) + n;
        if self.enabled && !self.terminal {
            let mut last = self.last_log.lock().expect("not poisoned");
            if last.elapsed().as_secs() >= 5 {
                *last = Instant::now();
                tracing::info!(scanned, "audit progress");
            }
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
