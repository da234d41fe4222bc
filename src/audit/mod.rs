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

use crate::apply::{Applier, ApplyError, BatchStats, COUNT_ATTRIBUTE};
use crate::decode::scanned_record;
use crate::invariant::{check_partition, check_unique, unique_value, Violation};
use crate::plan::{plan_record, Effect, MarkerState, Op, SourceGuard, SourceQuery};
use crate::record::{item_to_json, Item, ItemKey};
use crate::spec::{Marker, ProjectionId, ProjectionKind, Spec, RESERVED_PREFIX};

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
    Effect(Effect),
    /// Set counter `projection` for these values to `expected` in all.
    Counter {
        projection: ProjectionId,
        values: Vec<String>,
        expected: i64,
    },
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

/// What the scan keeps: items of spec entities, counter shards, markers.
#[derive(Default)]
struct Snapshot {
    /// Entity items: (entity, key) -> item.
    items: Vec<(usize, ItemKey, Item)>,
    /// Counter shard sums: (counter, values joined by `#`) -> (sum, shard keys seen).
    shards: HashMap<(ProjectionId, String), i64>,
    /// Counters' own markers: (counter, source key).
    markers: HashSet<(ProjectionId, ItemKey)>,
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

fn classify(spec: &Spec, item: Item, snapshot: &mut Snapshot) {
    let Some(key) = spec.table.item_key(&item) else {
        return;
    };
    if let Some(rest) = key.pk.strip_prefix(RESERVED_PREFIX) {
        if let Some(rest) = rest.strip_prefix("count#") {
            for (id, projection) in spec.projections.iter().enumerate() {
                if let Some(source_pk) = rest
                    .strip_prefix(projection.name.as_str())
                    .and_then(|r| r.strip_prefix('#'))
                {
                    if matches!(projection.kind, ProjectionKind::Counter(_)) {
                        snapshot.markers.insert((
                            id,
                            ItemKey {
                                pk: source_pk.to_string(),
                                sk: key.sk.clone(),
                            },
                        ));
                    }
                }
            }
        }
        return;
    }
    if let Some(rest) = key.pk.strip_prefix("COUNTER#") {
        if spec.table.sort_key.is_none() || key.sk.as_deref() == Some("COUNTER") {
            for (id, projection) in spec.projections.iter().enumerate() {
                if !matches!(projection.kind, ProjectionKind::Counter(_)) {
                    continue;
                }
                let Some(rest) = rest
                    .strip_prefix(projection.name.as_str())
                    .and_then(|r| r.strip_prefix('#'))
                else {
                    continue;
                };
                let Some((values, shard)) = rest.rsplit_once('#') else {
                    continue;
                };
                if shard.parse::<u32>().is_err() {
                    continue;
                }
                let count = match item.get(COUNT_ATTRIBUTE) {
                    Some(crate::record::AttributeValue::N(n)) => n.parse::<i64>().unwrap_or(0),
                    _ => 0,
                };
                *snapshot.shards.entry((id, values.to_string())).or_insert(0) += count;
                return;
            }
        }
    }
    let mut vars = Vec::new();
    if let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) {
        snapshot.items.push((entity, key, item));
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
    let by_key: HashMap<&ItemKey, &Item> = snapshot
        .items
        .iter()
        .map(|(_, key, item)| (key, item))
        .collect();
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
                        f.fix = Some(Fix::Effect(effect));
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
                    f.fix = Some(Fix::Effect(Effect {
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
                    }));
                    out.push(f);
                }
            }
            ProjectionKind::InverseEdge(p) => {
                let mut expected: HashSet<ItemKey> = HashSet::new();
                for (entity, key, item) in &snapshot.items {
                    if *entity != p.source {
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
                        let Op::Membership {
                            marker,
                            state: MarkerState::Present(want),
                            guard,
                            ..
                        } = effect.op
                        else {
                            continue;
                        };
                        expected.insert(marker.clone());
                        let have = by_key.get(&marker).copied();
                        if have == Some(&want) {
                            continue;
                        }
                        let mut f = finding(
                            spec,
                            id,
                            if have.is_some() {
                                Problem::Stale
                            } else {
                                Problem::Missing
                            },
                            &marker,
                        );
                        f.items = vec![key.to_string()];
                        f.detail = format!("is {}, should be {}", show(have), show(Some(&want)));
                        // Counters are rebuilt separately, from the sources.
                        f.fix = Some(Fix::Effect(Effect {
                            projection: id,
                            op: Op::Membership {
                                marker,
                                state: MarkerState::Present(want),
                                counters: Vec::new(),
                                guard,
                            },
                        }));
                        out.push(f);
                    }
                }
                let source = &spec.entities[p.source];
                for (entity, key, _) in &snapshot.items {
                    if *entity != p.target || expected.contains(key) {
                        continue;
                    }
                    let mut vars = Vec::new();
                    spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars);
                    let source_key = source.render_key(&vars);
                    let mut f = finding(spec, id, Problem::Orphaned, key);
                    f.detail = match &source_key {
                        Some(s) => format!(
                            "its source {s} {}",
                            if by_key.contains_key(s) {
                                "does not satisfy `when`"
                            } else {
                                "does not exist"
                            }
                        ),
                        None => "no source item can produce it".to_string(),
                    };
                    f.items = source_key.iter().map(|k| k.to_string()).collect();
                    f.fix = Some(Fix::Effect(Effect {
                        projection: id,
                        op: Op::Membership {
                            marker: key.clone(),
                            state: MarkerState::Absent,
                            counters: Vec::new(),
                            guard: source_key.map(|source| SourceGuard {
                                source,
                                member: false,
                                when: p.when.clone(),
                            }),
                        },
                    }));
                    out.push(f);
                }
            }
            ProjectionKind::Counter(counter) => {
                let mut expected: BTreeMap<String, (Vec<String>, i64)> = BTreeMap::new();
                let mut counted: HashSet<ItemKey> = HashSet::new();
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
                    let entry = expected
                        .entry(values.join("#"))
                        .or_insert_with(|| (values, 0));
                    entry.1 += 1;
                    counted.insert(key.clone());
                }
                let mut targets: BTreeMap<String, (Vec<String>, i64, i64)> = expected
                    .into_iter()
                    .map(|(joined, (values, n))| (joined, (values, n, 0)))
                    .collect();
                for ((counter_id, joined), sum) in &snapshot.shards {
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
                        .2 = *sum;
                }
                for (joined, (values, want, have)) in targets {
                    if want == have {
                        continue;
                    }
                    let mut f = Finding {
                        rule: projection.name.clone(),
                        rule_kind: projection.kind_name(),
                        problem: Problem::CounterOff {
                            expected: want,
                            actual: have,
                        },
                        key: format!("COUNTER#{}#{joined}", projection.name),
                        items: Vec::new(),
                        detail: counter
                            .of
                            .iter()
                            .zip(&values)
                            .map(|((name, _), value)| format!("{name}={value}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                        repaired: false,
                        fix: None,
                    };
                    f.fix = Some(Fix::Counter {
                        projection: id,
                        values,
                        expected: want,
                    });
                    out.push(f);
                }
                if counter.marker == Marker::Own {
                    for source in &counted {
                        if !snapshot.markers.contains(&(id, source.clone())) {
                            let marker = spec.counter_marker_key(&projection.name, source);
                            let mut f = finding(spec, id, Problem::Missing, &marker);
                            f.items = vec![source.to_string()];
                            f.detail = "the counter's marker for a counted item".to_string();
                            f.fix = Some(Fix::Effect(Effect {
                                projection: id,
                                op: Op::Membership {
                                    state: MarkerState::Present(spec.table.key_item(&marker)),
                                    marker,
                                    counters: Vec::new(),
                                    guard: Some(SourceGuard {
                                        source: source.clone(),
                                        member: true,
                                        when: counter.when.clone(),
                                    }),
                                },
                            }));
                            out.push(f);
                        }
                    }
                    for (counter_id, source) in &snapshot.markers {
                        if *counter_id != id || counted.contains(source) {
                            continue;
                        }
                        let marker = spec.counter_marker_key(&projection.name, source);
                        let mut f = finding(spec, id, Problem::Orphaned, &marker);
                        f.items = vec![source.to_string()];
                        f.detail = "a marker for an item that is not counted".to_string();
                        f.fix = Some(Fix::Effect(Effect {
                            projection: id,
                            op: Op::Membership {
                                marker,
                                state: MarkerState::Absent,
                                counters: Vec::new(),
                                guard: Some(SourceGuard {
                                    source: source.clone(),
                                    member: false,
                                    when: counter.when.clone(),
                                }),
                            },
                        }));
                        out.push(f);
                    }
                }
            }
            ProjectionKind::Custom(_) => {}
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

async fn repair(applier: &Applier, report: &mut AuditReport) -> Result<(), ApplyError> {
    let mut effects = Vec::new();
    let mut owners = Vec::new();
    for (index, finding) in report.findings.iter().enumerate() {
        if let Some(Fix::Effect(effect)) = &finding.fix {
            effects.push(effect.clone());
            owners.push(index);
        }
    }
    let (results, stats) = applier.apply_effects(effects).await;
    let mut total = BatchStats::default();
    total.add(&stats);
    for (index, result) in owners.into_iter().zip(results) {
        match result {
            Ok(()) => report.findings[index].repaired = true,
            Err(error) => report.repair_failures.push(format!(
                "{} {}: {error}",
                report.findings[index].rule, report.findings[index].key
            )),
        }
    }
    // Counters last: from a consistent read of their shards now.
    for index in 0..report.findings.len() {
        let Some(Fix::Counter {
            projection,
            values,
            expected,
        }) = report.findings[index].fix.clone()
        else {
            continue;
        };
        match set_counter(applier, projection, &values, expected, &mut total).await {
            Ok(()) => report.findings[index].repaired = true,
            Err(error) => report.repair_failures.push(format!(
                "{} {}: {error}",
                report.findings[index].rule, report.findings[index].key
            )),
        }
    }
    report.repaired = report.findings.iter().filter(|f| f.repaired).count();
    report.write_units = total.write_units;
    report.read_units += total.read_units;
    metrics::counter!("projector_audit_repairs_total").increment(report.repaired as u64);
    Ok(())
}

/// Makes a counter's shards add up to `expected`: reads them consistently
/// and moves shard 0 by the difference, on condition that it still holds
/// what was read (a concurrent change makes this fail; run audit again).
async fn set_counter(
    applier: &Applier,
    projection: ProjectionId,
    values: &[String],
    expected: i64,
    stats: &mut BatchStats,
) -> Result<(), String> {
    let spec = applier.spec();
    let name = &spec.projections[projection].name;
    let ProjectionKind::Counter(counter) = &spec.projections[projection].kind else {
        return Err("not a counter".to_string());
    };
    let vars: Vec<(String, String)> = counter
        .of
        .iter()
        .map(|(n, _)| n.clone())
        .zip(values.iter().cloned())
        .collect();
    let mut shard0: Option<i64> = None;
    let mut sum = 0;
    for shard in 0..counter.shards {
        let key = spec.counter_shard_key(name, values, shard);
        let output = applier
            .client()
            .get_item()
            .table_name(applier.table())
            .set_key(Some(spec.table.key_item(&key).into()))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| crate::apply::retry_describe(&e))?;
        if let Some(c) = output.consumed_capacity() {
            stats.read_units += c.capacity_units().unwrap_or(0.0);
        }
        let value = match output.item().and_then(|i| i.get(COUNT_ATTRIBUTE)) {
            Some(Av::N(n)) => Some(n.parse::<i64>().unwrap_or(0)),
            _ => None,
        };
        sum += value.unwrap_or(0);
        if shard == 0 {
            shard0 = value;
        }
    }
    let delta = expected - sum;
    if delta == 0 {
        return Ok(());
    }
    let key = spec.counter_shard_key(name, values, 0);
    let mut request = applier
        .client()
        .update_item()
        .table_name(applier.table())
        .set_key(Some(spec.table.key_item(&key).into()))
        .update_expression("ADD #c :d")
        .expression_attribute_names("#c", COUNT_ATTRIBUTE)
        .expression_attribute_values(":d", Av::N(delta.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    request = match shard0 {
        Some(v) => request
            .condition_expression("#c = :v")
            .expression_attribute_values(":v", Av::N(v.to_string())),
        None => request.condition_expression("attribute_not_exists(#c)"),
    };
    let output = request.send().await.map_err(|e| {
        format!(
            "counter {name} {:?} changed while repairing; run audit again ({})",
            vars,
            crate::apply::retry_describe(&e)
        )
    })?;
    if let Some(c) = output.consumed_capacity() {
        stats.write_units += c.capacity_units().unwrap_or(0.0);
    }
    Ok(())
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
