//! A segment audited in slices: after each page, what the segment found
//! so far and where its scan stands are checkpointed, so that a run
//! stopped anywhere (a crash, a kill, a slice's page budget or deadline)
//! resumes at the next page. The repairs of a checkpointed segment are
//! made page by page, as its findings are stored without their fixes.
//!
//! A checkpoint is kept in one of two places ([`CheckpointStore`]):
//!
//! - a **file** (`audit --checkpoint FILE`), written whole after each page
//!   (a temporary file renamed over it);
//! - the **audited table** (the Lambda's audit slices, which have no
//!   durable disk), under `PK = _ddbp#audit` (tables without a sort key:
//!   `_ddbp#audit#<sort key>`), named by the audit's run:
//!
//!   | sort key | holds |
//!   | --- | --- |
//!   | `<run>#<segment>/<total>` | the segment's state: where the scan resumes, its counts, its counter sketch, how many pages it has stored |
//!   | `<run>#<segment>/<total>#p<page>#<part>` | one page's findings and violations (`parts` items when they are over [`PART_BYTES`]) |
//!   | `<run>#merged` | the merged summary ([`crate::lambda::audit`]) |
//!
//!   Only a page that found something is stored, under the next number;
//!   its items are written before the state that counts them. A slice cut
//!   short between the two redoes the page: what it finds then is written
//!   under the same number, or, if nothing, the number goes to the next
//!   page that finds something; the loader reads only the numbers and
//!   parts the state counts, so an item left by a slice cut short is
//!   overwritten or never read. So the findings are held by the table,
//!   not by the worker, and a segment of any size is audited in a page's
//!   memory.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use serde::{Deserialize, Serialize};

use super::scan::{Pages, Progress};
use super::sketch::Sketch;
use super::{page, AuditOptions, AuditReport, Finding};
use crate::apply::{Applier, ApplyError};
use crate::record::ItemKey;

pub use crate::dynamo::names::AUDIT_PK;

/// The most bytes of findings one page item holds (DynamoDB's limit is
/// 400 KB an item, names included).
pub const PART_BYTES: usize = 300_000;

/// The longest detail a stored finding keeps (a stale copy of a large
/// attribute would otherwise not fit an item); the rest is counted.
pub const MAX_DETAIL: usize = 8_000;

/// Cuts `text` to at most `max` bytes, on a character boundary, saying how
/// much was cut.
pub fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!("… ({cut} bytes more)"));
}

/// Where a checkpointed segment keeps its progress and findings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointStore {
    /// A JSON file.
    File(PathBuf),
    /// Items in the audited table, named by the audit's run (see the
    /// module documentation).
    Table {
        /// The run: the same for every segment and slice of one audit.
        run: String,
    },
}

/// What a checkpoint holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The report so far (`complete` once the segment's scan ended). In
    /// the table its findings, violations and repair failures are the
    /// page items', not the state's.
    pub report: AuditReport,
    /// Where the scan resumes (DynamoDB JSON of the last key read).
    #[serde(default)]
    pub resume_at: Option<BTreeMap<String, serde_json::Value>>,
    /// Pages that found something (in the table: the numbers of the page
    /// items stored).
    #[serde(default)]
    pub pages: u64,
    /// Findings so far, counted before merging.
    #[serde(default)]
    pub found: u64,
    /// Times the state was saved: in the table, each save is conditional
    /// on the count the saver last read or wrote.
    #[serde(default)]
    pub saves: u64,
    /// Which invocation stored each page: (first page, writer), a run of
    /// pages per slice. A page's items are keyed by their writer, so a
    /// duplicate slice that stored a page under the same number, and lost
    /// the race to save the state, is never read.
    #[serde(default)]
    pub writers: Vec<(u64, u64)>,
}

impl Checkpoint {
    /// The invocation that stored `page`.
    fn writer_of(&self, page: u64) -> u64 {
        self.writers
            .iter()
            .rev()
            .find(|&&(first, _)| first <= page)
            .map_or(0, |&(_, writer)| writer)
    }
}

/// What one page found, stored apart from the segment's state in the table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PageFindings {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    findings: Vec<Finding>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    violation_keys: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    repair_failures: Vec<String>,
}

impl PageFindings {
    fn is_empty(&self) -> bool {
        self.findings.is_empty()
            && self.violation_keys.is_empty()
            && self.repair_failures.is_empty()
    }

    /// Split into parts of at most [`PART_BYTES`] of JSON each (one part at
    /// least; a single finding larger than that is a part of its own).
    fn parts(self) -> Vec<String> {
        let mut parts = Vec::new();
        let mut part = PageFindings::default();
        let mut bytes = 0;
        let mut push = |part: &mut PageFindings, bytes: &mut usize, size: usize| {
            if *bytes + size > PART_BYTES && !part.is_empty() {
                parts.push(serde_json::to_string(&std::mem::take(part)).unwrap_or_default());
                *bytes = 0;
            }
            *bytes += size;
        };
        for mut finding in self.findings {
            truncate(&mut finding.detail, MAX_DETAIL);
            let size = serde_json::to_string(&finding).map_or(0, |s| s.len());
            push(&mut part, &mut bytes, size);
            part.findings.push(finding);
        }
        for key in self.violation_keys {
            push(&mut part, &mut bytes, key.0.len() + key.1.len() + 8);
            part.violation_keys.push(key);
        }
        for mut failure in self.repair_failures {
            truncate(&mut failure, MAX_DETAIL);
            push(&mut part, &mut bytes, failure.len() + 4);
            part.repair_failures.push(failure);
        }
        parts.push(serde_json::to_string(&part).unwrap_or_default());
        parts
    }

    fn append_to(self, report: &mut AuditReport) {
        let PageFindings {
            mut findings,
            violation_keys,
            mut repair_failures,
        } = self;
        report.findings.append(&mut findings);
        report.violation_keys.extend(violation_keys);
        report.repair_failures.append(&mut repair_failures);
    }
}

pub(super) fn key_to_json(key: &HashMap<String, Av>) -> BTreeMap<String, serde_json::Value> {
    key.iter()
        .filter_map(|(name, value)| {
            let json = match value {
                Av::S(s) => serde_json::json!({ "S": s }),
                Av::N(n) => serde_json::json!({ "N": n }),
                Av::B(b) => {
                    serde_json::json!({ "B": aws_smithy_types::base64::encode(b.as_ref()) })
                }
                _ => return None,
            };
            Some((name.clone(), json))
        })
        .collect()
}

pub(super) fn key_from_json(
    key: &BTreeMap<String, serde_json::Value>,
) -> Option<HashMap<String, Av>> {
    key.iter()
        .map(|(name, value)| {
            let value = if let Some(s) = value.get("S").and_then(|v| v.as_str()) {
                Av::S(s.to_string())
            } else if let Some(n) = value.get("N").and_then(|v| v.as_str()) {
                Av::N(n.to_string())
            } else {
                let b = value.get("B").and_then(|v| v.as_str())?;
                Av::B(aws_smithy_types::Blob::new(
                    aws_smithy_types::base64::decode(b).ok()?,
                ))
            };
            Some((name.clone(), value))
        })
        .collect()
}

/// What one call of [`audit_segment_from`] answers.
#[derive(Debug)]
pub struct Slice {
    /// The segment's report so far (`complete` once its scan ended). From
    /// the table its findings stay there until [`load_run`] reads them.
    pub report: AuditReport,
    /// The segment's findings so far.
    pub found: u64,
    /// Items this call scanned.
    pub scanned_now: u64,
    /// Another invocation saved the segment ahead of this one (a duplicate
    /// or retried slice): this one stopped, and `report` is the other's.
    pub overtaken: bool,
}

/// Audits `segment` from its checkpoint in `store` (a fresh one when there
/// is none), saving it after every page; stops after `options.max_pages`
/// pages or at `options.deadline`, with `complete` false. In the table
/// every save is conditional on the state this call last read or wrote, so
/// two invocations of one segment never move it back: the one behind
/// stops and answers the other's state.
pub async fn audit_segment_from(
    applier: &Applier,
    options: &AuditOptions,
    segment: u32,
    store: &CheckpointStore,
) -> Result<Slice, ApplyError> {
    audit_segment_shown(applier, options, segment, store, None).await
}

/// [`audit_segment_from`], its progress shown by `shown` (segments audited
/// side by side share one) rather than by a display of its own.
pub(super) async fn audit_segment_shown(
    applier: &Applier,
    options: &AuditOptions,
    segment: u32,
    store: &CheckpointStore,
    shown: Option<&Progress>,
) -> Result<Slice, ApplyError> {
    let started = Instant::now();
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    let total = options.segments.max(1);
    let judged = super::Judged::read(applier).await?;
    let loaded = load(applier, store, segment, total).await?;
    let mut saved = loaded.as_ref().map(|state| state.saves);
    let mut state = match loaded {
        Some(state) => state,
        None => Checkpoint {
            report: AuditReport {
                table: applier.table().to_string(),
                started_ms: crate::dynamo::time::now_ms(),
                segment: Some(segment),
                total_segments: total,
                sketch: Some(Sketch::default()),
                complete: false,
                ..AuditReport::default()
            },
            resume_at: None,
            pages: 0,
            found: 0,
            saves: 0,
            writers: Vec::new(),
        },
    };
    {
        let report = &state.report;
        if report.table != applier.table()
            || report.segment != Some(segment)
            || report.total_segments != total
        {
            return Err(fatal(format!(
                "{} is the checkpoint of segment {} of {} of `{}`, not of segment {segment} of {total} of `{}`",
                store.describe(),
                report.segment.map_or("-".to_string(), |s| s.to_string()),
                report.total_segments,
                report.table,
                applier.table()
            )));
        }
        if report.complete {
            return Ok(Slice {
                found: state.found,
                report: finish(applier, options, state.report).await?,
                scanned_now: 0,
                overtaken: false,
            });
        }
    }
    let mut pages = Pages::new(segment, total, options.page_size);
    if let Some(key) = &state.resume_at {
        let key = key_from_json(key).ok_or_else(|| {
            fatal(format!(
                "{}: segment {segment}'s resume key is unreadable",
                store.describe()
            ))
        })?;
        pages.resume_at(key);
    }
    let read_micro = AtomicU64::new(0);
    let estimate = crate::backfill::estimate_items(applier)
        .await
        .map(|n| n / total as u64);
    let own;
    let progress = match shown {
        Some(shown) => shown,
        None => {
            own = Progress::new(options.progress, estimate);
            &own
        }
    };
    progress.advance(state.report.scanned);
    let pacer = crate::backfill::Pacer::new(options.max_rcu);
    let mut sketch = state.report.sketch.take().unwrap_or_default();
    let mut read = 0;
    let mut scanned_now = 0;
    let writer = writer_id();
    // Page items this invocation wrote that no saved state names yet.
    let mut unsaved: Vec<ItemKey> = Vec::new();
    let in_time = || {
        options
            .deadline
            .is_none_or(|deadline| tokio::time::Instant::now() < deadline)
    };
    while options.max_pages.is_none_or(|max| read < max) && in_time() {
        let Some(items) = pages.next(applier, &read_micro, progress).await? else {
            state.report.complete = true;
            break;
        };
        read += 1;
        scanned_now += items.len() as u64;
        let report = &mut state.report;
        report.scanned += items.len() as u64;
        let found = page::check(applier, items, &mut sketch, &judged).await?;
        pacer.consume(pages.last_units + found.read_units).await;
        report.read_units += pages.last_units + found.read_units;
        let mut part = AuditReport {
            findings: found.findings,
            ..AuditReport::default()
        };
        part.findings.extend(
            found
                .violations
                .iter()
                .map(|(id, v)| super::derive::violation(applier.spec(), *id, v)),
        );
        let violation_keys = found
            .violations
            .iter()
            .map(|(_, v)| (v.invariant.clone(), v.record_sk()))
            .collect();
        // Stored and saved before it is repaired: a slice cut short after
        // repairing a page does not redo it (the redo would find nothing
        // where the repair moved a shard, and the merge would not count
        // that shard again); its findings stay marked unrepaired, and the
        // merge counts every shard a stored finding names.
        let stored = PageFindings {
            findings: part.findings.clone(),
            violation_keys,
            repair_failures: Vec::new(),
        };
        state.found += stored.findings.len() as u64;
        let at = save_page(applier, store, &mut state, stored.clone(), writer).await?;
        if let (Some(page), CheckpointStore::Table { run }) = (at, store) {
            let parts = stored.clone().parts().len() as u32;
            unsaved.extend(
                (0..parts).map(|part| {
                    item_key(applier, page_sk(run, segment, total, page, writer, part))
                }),
            );
        }
        state.report.complete = pages.is_done();
        state.report.sketch = Some(sketch.clone());
        state.resume_at = pages.resume_key().map(key_to_json);
        if !save(applier, store, &mut state, saved).await? {
            // What this invocation stored since its last save is named by
            // no state: the other invocation's state names its own.
            delete(applier, &unsaved).await?;
            return overtaken(applier, options, store, segment, total, scanned_now).await;
        }
        unsaved.clear();
        if options.repair && !stored.is_empty() {
            super::repair::repair_page(applier, &mut part).await?;
            let report = &mut state.report;
            report.repaired += part.repaired;
            report.write_units += part.write_units;
            report.read_units += part.read_units;
            let violations: Vec<_> = found.violations.into_iter().map(|(_, v)| v).collect();
            report.violations_recorded += applier.record_violations(&violations).await?;
            let repaired = PageFindings {
                findings: part.findings,
                repair_failures: part.repair_failures,
                ..stored
            };
            if let Some(at) = at {
                restore_page(applier, store, &mut state, at, repaired).await?;
            }
        }
        saved = Some(state.saves);
        if state.report.complete {
            break;
        }
    }
    if shown.is_none() {
        progress.finish();
    }
    state.report.sketch = Some(sketch);
    state.report.seconds += started.elapsed().as_secs_f64();
    state.resume_at = pages.resume_key().map(key_to_json);
    if !save(applier, store, &mut state, saved).await? {
        return overtaken(applier, options, store, segment, total, scanned_now).await;
    }
    Ok(Slice {
        found: state.found,
        report: finish(applier, options, state.report).await?,
        scanned_now,
        overtaken: false,
    })
}

/// The answer of a slice another invocation overtook: the other's state.
async fn overtaken(
    applier: &Applier,
    options: &AuditOptions,
    store: &CheckpointStore,
    segment: u32,
    total: u32,
    scanned_now: u64,
) -> Result<Slice, ApplyError> {
    tracing::warn!(
        checkpoint = store.describe(),
        segment,
        total_segments = total,
        "another invocation saved this audit segment ahead of this one: this one stops"
    );
    let state = load(applier, store, segment, total)
        .await?
        .ok_or_else(|| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!(
                "{}: segment {segment} of {total} was saved by another invocation, then deleted",
                store.describe()
            ),
        })?;
    Ok(Slice {
        found: state.found,
        report: finish(applier, options, state.report).await?,
        scanned_now,
        overtaken: true,
    })
}

/// A number naming this invocation on the page items it writes, so that
/// the parts of one page written by two invocations at once are told
/// apart.
pub(super) fn writer_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// The report as a segment's: its findings one per key, in spec order.
/// A `unique` violation whose holders lay on several pages was recorded
/// page by page in parts: with `repair`, it is recorded whole.
async fn finish(
    applier: &Applier,
    options: &AuditOptions,
    mut report: AuditReport,
) -> Result<AuditReport, ApplyError> {
    let (findings, unique) = super::one_per_key(applier.spec(), report.findings);
    report.findings = findings;
    if options.repair && !unique.is_empty() {
        report.violations_recorded += applier.record_violations(&unique).await?;
    }
    super::sort_findings(applier.spec(), &mut report.findings);
    report.violation_keys.sort();
    report.violation_keys.dedup();
    report.not_live = super::Judged::read(applier).await?.not_live();
    Ok(report)
}

impl CheckpointStore {
    /// How an error names it.
    pub fn describe(&self) -> String {
        match self {
            CheckpointStore::File(path) => path.display().to_string(),
            CheckpointStore::Table { run } => format!("the audit checkpoint of run `{run}`"),
        }
    }
}

/// The sort key of the state of `segment` of `total` in `run`.
fn state_sk(run: &str, segment: u32, total: u32) -> String {
    format!("{run}#{segment}/{total}")
}

fn page_sk(run: &str, segment: u32, total: u32, page: u64, writer: u64, part: u32) -> String {
    format!(
        "{}#p{page:08}#{writer:016x}#{part:03}",
        state_sk(run, segment, total)
    )
}

/// The sort key of a run's merged summary.
pub(crate) fn merged_sk(run: &str) -> String {
    format!("{run}#merged")
}

/// The key of the audit item with sort key `sk`, in `applier`'s table.
pub(crate) fn item_key(applier: &Applier, sk: String) -> ItemKey {
    match applier.spec().table.sort_key {
        Some(_) => ItemKey {
            pk: AUDIT_PK.to_string(),
            sk: Some(sk),
        },
        None => ItemKey {
            pk: format!("{AUDIT_PK}#{sk}"),
            sk: None,
        },
    }
}

fn key_map(applier: &Applier, key: &ItemKey) -> HashMap<String, Av> {
    let table = &applier.spec().table;
    let mut map = HashMap::from([(table.partition_key.clone(), Av::S(key.pk.clone()))]);
    if let (Some(name), Some(sk)) = (&table.sort_key, &key.sk) {
        map.insert(name.clone(), Av::S(sk.clone()));
    }
    map
}

fn table_error(applier: &Applier, what: &str, error: impl std::fmt::Display) -> ApplyError {
    ApplyError::Fatal {
        table: applier.table().to_string(),
        message: format!("{what}: {error}"),
    }
}

/// Writes `attributes` under `sk` (a whole-item put: writing it again is
/// harmless). With `saves: Some(expected)`, only if the stored item was
/// saved `expected` times (`None`: only if there is none); returns false
/// when it was not.
pub(crate) async fn put(
    applier: &Applier,
    sk: String,
    attributes: Vec<(&str, Av)>,
    saves: Option<Option<u64>>,
) -> Result<bool, ApplyError> {
    let mut item = key_map(applier, &item_key(applier, sk.clone()));
    for (name, value) in attributes {
        item.insert(name.to_string(), value);
    }
    item.insert(
        "updatedAt".to_string(),
        Av::S(crate::control::iso(crate::dynamo::time::now_ms())),
    );
    let mut request = applier
        .client()
        .put_item()
        .table_name(applier.table())
        .set_item(Some(item));
    match saves {
        None => {}
        Some(None) => {
            request = request
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", &applier.spec().table.partition_key);
        }
        Some(Some(expected)) => {
            // A state saved before saves were counted has none: as 0.
            let condition = if expected == 0 {
                "attribute_not_exists(#saves) OR #saves = :saves"
            } else {
                "#saves = :saves"
            };
            request = request
                .condition_expression(condition)
                .expression_attribute_names("#saves", "saves")
                .expression_attribute_values(":saves", Av::N(expected.to_string()));
        }
    }
    match request.send().await {
        Ok(_) => Ok(true),
        Err(error)
            if error
                .as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
        {
            Ok(false)
        }
        Err(error) => Err(table_error(
            applier,
            &format!("writing the audit item `{sk}`"),
            crate::dynamo::retry::describe(&error),
        )),
    }
}

/// Marks the merged summary of `run` logged and counted.
pub(crate) async fn set_logged(applier: &Applier, run: &str) -> Result<(), ApplyError> {
    let sk = merged_sk(run);
    applier
        .client()
        .update_item()
        .table_name(applier.table())
        .set_key(Some(key_map(applier, &item_key(applier, sk.clone()))))
        .update_expression("SET #logged = :logged")
        .expression_attribute_names("#logged", "logged")
        .expression_attribute_values(":logged", Av::Bool(true))
        .send()
        .await
        .map_err(|e| {
            table_error(
                applier,
                &format!("writing the audit item `{sk}`"),
                crate::dynamo::retry::describe(&e),
            )
        })?;
    Ok(())
}

/// Reads the audit item under `sk` (consistently).
pub(crate) async fn get(
    applier: &Applier,
    sk: String,
) -> Result<Option<HashMap<String, Av>>, ApplyError> {
    let output = applier
        .client()
        .get_item()
        .table_name(applier.table())
        .set_key(Some(key_map(applier, &item_key(applier, sk.clone()))))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| {
            table_error(
                applier,
                &format!("reading the audit item `{sk}`"),
                crate::dynamo::retry::describe(&e),
            )
        })?;
    Ok(output.item)
}

pub(super) fn text<'a>(item: &'a HashMap<String, Av>, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

pub(super) fn number(item: &HashMap<String, Av>, name: &str) -> Option<u64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

async fn load(
    applier: &Applier,
    store: &CheckpointStore,
    segment: u32,
    total: u32,
) -> Result<Option<Checkpoint>, ApplyError> {
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    match store {
        CheckpointStore::File(path) => match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str::<Checkpoint>(&text)
                .map(Some)
                .map_err(|error| {
                    fatal(format!(
                        "{} is not an audit checkpoint: {error}",
                        path.display()
                    ))
                }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(fatal(format!("cannot read {}: {error}", path.display()))),
        },
        CheckpointStore::Table { run } => {
            let sk = state_sk(run, segment, total);
            let Some(item) = get(applier, sk.clone()).await? else {
                return Ok(None);
            };
            let state = text(&item, "state").unwrap_or_default();
            serde_json::from_str::<Checkpoint>(state)
                .map(Some)
                .map_err(|error| {
                    fatal(format!(
                        "the audit item `{sk}` does not hold an audit checkpoint: {error}"
                    ))
                })
        }
    }
}

/// Keeps what one page found: in the file's report, or in the table as
/// the page's items, under the next number and `writer` (see
/// [`Checkpoint::writers`]). Returns the number, or `None` when the page
/// found nothing (it stores nothing and takes no number: the audit's own
/// items are scanned too, and pages of them that each stored one more
/// ahead of the scan would never end).
async fn save_page(
    applier: &Applier,
    store: &CheckpointStore,
    state: &mut Checkpoint,
    found: PageFindings,
    writer: u64,
) -> Result<Option<u64>, ApplyError> {
    if found.is_empty() {
        return Ok(None);
    }
    let page = state.pages;
    state.pages += 1;
    if state.writers.last().map(|&(_, w)| w) != Some(writer) {
        state.writers.push((page, writer));
    }
    match store {
        CheckpointStore::File(_) => found.append_to(&mut state.report),
        CheckpointStore::Table { run } => write_page(applier, run, state, page, found).await?,
    }
    Ok(Some(page))
}

/// Replaces what page `page` stored by `found` (its findings once
/// repaired); saved with the next save of the state.
async fn restore_page(
    applier: &Applier,
    store: &CheckpointStore,
    state: &mut Checkpoint,
    page: u64,
    found: PageFindings,
) -> Result<(), ApplyError> {
    match store {
        CheckpointStore::File(_) => {
            let report = &mut state.report;
            let kept = report.findings.len().saturating_sub(found.findings.len());
            report.findings.truncate(kept);
            found.append_to(report);
            Ok(())
        }
        CheckpointStore::Table { run } => write_page(applier, run, state, page, found).await,
    }
}

/// Writes page `page`'s items, under the writer the state names for it.
async fn write_page(
    applier: &Applier,
    run: &str,
    state: &Checkpoint,
    page: u64,
    found: PageFindings,
) -> Result<(), ApplyError> {
    let segment = state.report.segment.unwrap_or(0);
    let total = state.report.total_segments;
    let writer = state.writer_of(page);
    let parts = found.parts();
    let count = parts.len() as u32;
    for (part, json) in parts.into_iter().enumerate() {
        put(
            applier,
            page_sk(run, segment, total, page, writer, part as u32),
            vec![
                ("parts", Av::N(count.to_string())),
                ("findings", Av::S(json)),
            ],
            None,
        )
        .await?;
    }
    Ok(())
}

/// Saves the segment's state: the whole file, or the state item, if the
/// stored one was saved `expected` times (`None`: there is none). Returns
/// false when another invocation saved it meanwhile.
async fn save(
    applier: &Applier,
    store: &CheckpointStore,
    state: &mut Checkpoint,
    expected: Option<u64>,
) -> Result<bool, ApplyError> {
    state.saves = expected.unwrap_or(0) + 1;
    let text = serde_json::to_string(state).map_err(|e| table_error(applier, "checkpoint", e))?;
    match store {
        CheckpointStore::File(path) => {
            save_file(path, &text)
                .map(|()| true)
                .map_err(|message| ApplyError::Fatal {
                    table: applier.table().to_string(),
                    message,
                })
        }
        CheckpointStore::Table { run } => {
            let segment = state.report.segment.unwrap_or(0);
            let sk = state_sk(run, segment, state.report.total_segments);
            put(
                applier,
                sk,
                vec![
                    ("state", Av::S(text)),
                    ("saves", Av::N(state.saves.to_string())),
                    ("pages", Av::N(state.pages.to_string())),
                    ("complete", Av::Bool(state.report.complete)),
                ],
                Some(expected),
            )
            .await
        }
    }
}

/// Writes `text` to `path` whole or not at all (a temporary file renamed
/// over it).
fn save_file(path: &Path, text: &str) -> Result<(), String> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|error| format!("cannot write the checkpoint {}: {error}", path.display()))
}

/// A run read from the table.
#[derive(Debug)]
pub enum LoadedRun {
    /// Every segment, with the findings its pages stored: the reports
    /// [`super::merge`] takes, and the keys of the items read.
    Ready(Vec<AuditReport>, Vec<ItemKey>),
    /// Segments have not started or not finished: why it cannot be merged.
    Incomplete(String),
}

/// Reads every segment of `run` (of `total`) from the table.
pub async fn load_run(applier: &Applier, run: &str, total: u32) -> Result<LoadedRun, ApplyError> {
    let store = CheckpointStore::Table {
        run: run.to_string(),
    };
    let mut states = Vec::with_capacity(total as usize);
    let mut missing = Vec::new();
    let mut unfinished = Vec::new();
    for segment in 0..total {
        match load(applier, &store, segment, total).await? {
            None => missing.push(segment),
            Some(state) if !state.report.complete => unfinished.push(segment),
            Some(state) => states.push(state),
        }
    }
    if !missing.is_empty() || !unfinished.is_empty() {
        let list = |segments: &[u32]| {
            segments
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if !missing.is_empty() {
            parts.push(format!("segments {} have not started", list(&missing)));
        }
        if !unfinished.is_empty() {
            parts.push(format!("segments {} have not finished", list(&unfinished)));
        }
        return Ok(LoadedRun::Incomplete(format!(
            "the audit run `{run}` of {total} segments cannot be merged: {}; run their slices until each answers done",
            parts.join(" and ")
        )));
    }
    let mut reports = Vec::with_capacity(states.len());
    let mut stored = Vec::new();
    for state in states {
        let segment = state.report.segment.unwrap_or(0);
        let pages = read_pages(applier, run, &state).await?;
        let mut report = state.report;
        let mut keys = Vec::with_capacity(pages.len() + 1);
        // The state first: deleted last (the list is reversed), a run half
        // deleted still names what is left.
        keys.push(item_key(applier, state_sk(run, segment, total)));
        for (key, item) in pages {
            let found: PageFindings = serde_json::from_str(text(&item, "findings").unwrap_or("{}"))
                .map_err(|error| {
                    table_error(
                        applier,
                        &format!(
                            "the audit run `{run}`: segment {segment}'s findings are unreadable"
                        ),
                        error,
                    )
                })?;
            found.append_to(&mut report);
            keys.push(key);
        }
        // A page's part 0, which counts its parts, after the others.
        stored.extend(keys.into_iter().rev());
        // Raw: `merge` makes the violations seen on several pages one.
        reports.push(report);
    }
    Ok(LoadedRun::Ready(reports, stored))
}

/// The page items `state` counts, in order: each page's part 0, then the
/// other parts it counts, under the writer the state names for the page.
async fn read_pages(
    applier: &Applier,
    run: &str,
    state: &Checkpoint,
) -> Result<Vec<(ItemKey, HashMap<String, Av>)>, ApplyError> {
    let segment = state.report.segment.unwrap_or(0);
    let total = state.report.total_segments;
    let pages = state.pages;
    let gone = |what: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message: format!(
            "the audit run `{run}`: segment {segment} stored {pages} pages, but {what} is gone"
        ),
    };
    let firsts = first_parts(applier, run, state);
    let mut found = read_items(applier, &firsts).await?;
    let mut keys = Vec::new();
    for (page, key) in firsts.into_iter().enumerate() {
        let item = found
            .get(&key)
            .ok_or_else(|| gone(format!("page {page}'s findings item")))?;
        let parts = number(item, "parts").unwrap_or(1).max(1) as u32;
        keys.push(key);
        let writer = state.writer_of(page as u64);
        for part in 1..parts {
            keys.push(item_key(
                applier,
                page_sk(run, segment, total, page as u64, writer, part),
            ));
        }
    }
    let more: Vec<ItemKey> = keys
        .iter()
        .filter(|key| !found.contains_key(*key))
        .cloned()
        .collect();
    found.extend(read_items(applier, &more).await?);
    keys.into_iter()
        .map(|key| match found.remove(&key) {
            Some(item) => Ok((key, item)),
            None => Err(gone(format!(
                "its findings item `{}`",
                key.sk.as_deref().unwrap_or(&key.pk)
            ))),
        })
        .collect()
}

/// The key of part 0 of every page `state` counts.
fn first_parts(applier: &Applier, run: &str, state: &Checkpoint) -> Vec<ItemKey> {
    let segment = state.report.segment.unwrap_or(0);
    let total = state.report.total_segments;
    (0..state.pages)
        .map(|page| {
            item_key(
                applier,
                page_sk(run, segment, total, page, state.writer_of(page), 0),
            )
        })
        .collect()
}

/// Deletes what is left of the segments of `run` (of `total`): the pages
/// each remaining state counts, then the state. A merge whose deletes
/// were cut short finishes them when invoked again.
pub async fn delete_rest(applier: &Applier, run: &str, total: u32) -> Result<(), ApplyError> {
    let store = CheckpointStore::Table {
        run: run.to_string(),
    };
    for segment in 0..total {
        delete_segment(applier, &store, run, segment, total).await?;
    }
    Ok(())
}

/// Deletes what is left of `segment` (of `total`) of `run`: the pages its
/// state counts, then the state.
pub async fn delete_segment(
    applier: &Applier,
    store: &CheckpointStore,
    run: &str,
    segment: u32,
    total: u32,
) -> Result<(), ApplyError> {
    {
        let Some(state) = load(applier, store, segment, total).await? else {
            return Ok(());
        };
        let firsts = first_parts(applier, run, &state);
        let found = read_items(applier, &firsts).await?;
        let mut keys = Vec::new();
        for (page, first) in firsts.into_iter().enumerate() {
            // A page deleted already is gone with its parts.
            let parts = found
                .get(&first)
                .and_then(|item| number(item, "parts"))
                .unwrap_or(1) as u32;
            let writer = state.writer_of(page as u64);
            keys.extend((1..parts).map(|part| {
                item_key(
                    applier,
                    page_sk(run, segment, total, page as u64, writer, part),
                )
            }));
            keys.push(first);
        }
        keys.push(item_key(applier, state_sk(run, segment, total)));
        delete(applier, &keys).await?;
    }
    Ok(())
}

/// The report of `segment` (of `total`) of `run` as it stands in the
/// table, with the findings its pages stored, as `audit-merge` takes it
/// (`None`: the segment has not started).
pub async fn load_segment(
    applier: &Applier,
    run: &str,
    segment: u32,
    total: u32,
) -> Result<Option<AuditReport>, ApplyError> {
    let store = CheckpointStore::Table {
        run: run.to_string(),
    };
    let Some(state) = load(applier, &store, segment, total).await? else {
        return Ok(None);
    };
    let pages = read_pages(applier, run, &state).await?;
    let mut report = state.report;
    for (_, item) in pages {
        let found: PageFindings = serde_json::from_str(text(&item, "findings").unwrap_or("{}"))
            .map_err(|error| {
                table_error(
                    applier,
                    &format!("the audit run `{run}`: segment {segment}'s findings are unreadable"),
                    error,
                )
            })?;
        found.append_to(&mut report);
    }
    let (findings, _) = super::one_per_key(applier.spec(), report.findings);
    report.findings = findings;
    super::sort_findings(applier.spec(), &mut report.findings);
    report.violation_keys.sort();
    report.violation_keys.dedup();
    Ok(Some(report))
}

/// Deletes every item of `run` but its merged summary, found by their
/// sort key (what a slice cut off between writing its parts and its
/// state, or a duplicate that ran after the merge, left). A table without
/// a sort key keeps each audit item in a partition of its own, which no
/// query lists: there only the items a state names are deleted.
pub(crate) async fn sweep(applier: &Applier, run: &str) -> Result<usize, ApplyError> {
    let table = &applier.spec().table;
    let Some(sort_key) = &table.sort_key else {
        return Ok(0);
    };
    let merged = merged_sk(run);
    let mut start = None;
    let mut swept = 0;
    loop {
        let page = applier
            .client()
            .query()
            .table_name(applier.table())
            .key_condition_expression("#pk = :pk AND begins_with(#sk, :run)")
            .expression_attribute_names("#pk", &table.partition_key)
            .expression_attribute_names("#sk", sort_key)
            .expression_attribute_values(":pk", Av::S(AUDIT_PK.to_string()))
            .expression_attribute_values(":run", Av::S(format!("{run}#")))
            .projection_expression("#pk, #sk")
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| {
                table_error(
                    applier,
                    &format!("listing the items of the audit run `{run}`"),
                    crate::dynamo::retry::describe(&e),
                )
            })?;
        let keys: Vec<ItemKey> = page
            .items()
            .iter()
            .filter_map(|item| match item.get(sort_key) {
                Some(Av::S(sk)) if *sk != merged => Some(item_key(applier, sk.clone())),
                _ => None,
            })
            .collect();
        swept += keys.len();
        delete(applier, &keys).await?;
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return Ok(swept),
        }
    }
}

pub(super) async fn read_items(
    applier: &Applier,
    keys: &[ItemKey],
) -> Result<HashMap<ItemKey, HashMap<String, Av>>, ApplyError> {
    let found = applier
        .reader()
        .items(keys.iter().collect())
        .await
        .map_err(|error| table_error(applier, "reading the audit's items", error))?;
    Ok(found
        .into_iter()
        .map(|(key, item)| (key, HashMap::from(item)))
        .collect())
}

/// Deletes the items of `keys` (a run's, once merged).
pub(crate) async fn delete(applier: &Applier, keys: &[ItemKey]) -> Result<(), ApplyError> {
    use aws_sdk_dynamodb::types::{DeleteRequest, WriteRequest};
    for chunk in keys.chunks(25) {
        let mut pending: Vec<WriteRequest> = chunk
            .iter()
            .map(|key| {
                WriteRequest::builder()
                    .delete_request(
                        DeleteRequest::builder()
                            .set_key(Some(key_map(applier, key)))
                            .build()
                            .expect("the key is set"),
                    )
                    .build()
            })
            .collect();
        while !pending.is_empty() {
            let output = applier
                .client()
                .batch_write_item()
                .request_items(applier.table(), std::mem::take(&mut pending))
                .send()
                .await
                .map_err(|e| {
                    table_error(
                        applier,
                        "deleting the audit's items",
                        crate::dynamo::retry::describe(&e),
                    )
                })?;
            if let Some(left) = output
                .unprocessed_items()
                .and_then(|u| u.get(applier.table()))
            {
                pending = left.clone();
                crate::dynamo::retry::wait_for_unprocessed().await;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Problem;

    fn finding(i: usize, detail_bytes: usize) -> Finding {
        Finding {
            rule: "followers".to_string(),
            rule_kind: "counter".to_string(),
            problem: Problem::Missing,
            key: format!("USER#{i}"),
            items: Vec::new(),
            detail: "x".repeat(detail_bytes),
            repaired: false,
            counters: Vec::new(),
            shards: Vec::new(),
            fix: None,
        }
    }

    #[test]
    fn a_page_with_nothing_found_is_still_one_part() {
        let parts = PageFindings::default().parts();
        assert_eq!(parts.len(), 1);
        let back: PageFindings = serde_json::from_str(&parts[0]).unwrap();
        assert!(back.is_empty());
    }

    #[test]
    fn a_page_over_the_item_limit_is_split_into_parts_that_fit_and_lose_nothing() {
        let page = PageFindings {
            // A stale copy of a large attribute: the detail is cut.
            findings: (0..100).map(|i| finding(i, 400_000)).collect(),
            violation_keys: vec![("unique-email".to_string(), "EMAIL#a".to_string())],
            repair_failures: vec!["USER#3: condition failed".to_string()],
        };
        let parts = page.clone().parts();
        assert!(parts.len() >= 3, "{} parts", parts.len());
        let mut report = AuditReport::default();
        for part in &parts {
            assert!(part.len() <= PART_BYTES + 1_000, "{} bytes", part.len());
            let found: PageFindings = serde_json::from_str(part).unwrap();
            found.append_to(&mut report);
        }
        let keys: Vec<&str> = report.findings.iter().map(|f| f.key.as_str()).collect();
        let sent: Vec<&str> = page.findings.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, sent);
        assert!(
            report
                .findings
                .iter()
                .all(|f| f.detail.len() < MAX_DETAIL + 40
                    && f.detail.ends_with("(392000 bytes more)"))
        );
        assert_eq!(report.violation_keys, page.violation_keys);
        assert_eq!(report.repair_failures, page.repair_failures);
    }
}
