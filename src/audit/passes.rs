//! The merge of a sliced audit, in passes that are sliced too.
//!
//! Merging a run needs the table read again when its summed sketch is
//! not zero (the counters' wrong buckets are located by counting their
//! groups, [`super::sketch`]) and, with `repair`, when shards are to be
//! recounted (those of the counters found off, and those the segments'
//! repairs moved): a scan of the whole table each. Done in the merging
//! invocation, they would bound the table by what one invocation reads.
//! So [`merge_step`] plans them as **counting passes**, each over every
//! segment in slices ([`count_slice`]), as the audit's own pass is:
//!
//! 1. *locate*, when the sketch is not zero: each segment counts the
//!    groups in the sketch's wrong buckets (a `Tally`);
//! 2. *recount*, with `repair`, when there are shards to recount: their
//!    counts are read when the pass is planned, each segment counts the
//!    records naming them, and the merge reads the shards again and sets
//!    each that did not move meanwhile (`super::repair::settle`).
//!
//! A merge step answers the next pass to run, or the merged report once
//! the last pass is counted. The items, under the audit's partition:
//!
//! | sort key | holds |
//! | --- | --- |
//! | `<run>#plan` | the passes planned: the sketch, the shards to recount with their counts before ([`Plan`]); `saves` is the current pass |
//! | `<run>#c<pass>#<segment>/<total>` | a segment's progress in a pass: where its scan resumes, whether it is done, how many times it was saved |
//! | `<key>#t<saves>#<writer>#<part>` | a blob (the plan, a segment's tally) in parts, under the save and the invocation that wrote it |
//!
//! Each save writes the tally's parts under its writer first, then the
//! state, on condition that the save count is the one its invocation read:
//! a duplicate slice that lost the race never has its parts read. A slice
//! holds a page and its segment's tally, which keeps only the groups of
//! the wrong buckets (or the shards to recount).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use serde::{Deserialize, Serialize};

use super::checkpoint::{self, item_key};
use super::derive::{counters, Tally};
use super::repair::{self, Recounted};
use super::scan::{classify, Pages, Progress};
use super::sketch::Sketch;
use super::{AuditOptions, AuditReport};
use crate::apply::{Applier, ApplyError, BatchStats};
use crate::record::ItemKey;
use crate::spec::ProjectionId;

/// The passes a merge planned.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Plan {
    /// The pass to run now, from 1.
    pub pass: u32,
    /// The pass that locates the counters, if one was needed.
    #[serde(default)]
    pub locate: Option<u32>,
    /// The summed sketch of the run's segments (with `locate`).
    #[serde(default)]
    pub sketch: Option<Sketch>,
    /// The pass that recounts shards, if one was needed.
    #[serde(default)]
    pub recount: Option<u32>,
    /// The shards it recounts, with their (count, changes) when it was
    /// planned.
    #[serde(default)]
    pub before: Vec<(String, i64, Option<i64>)>,
    /// What settling the recount gave, once a merge did (a merge invoked
    /// again answers it rather than settling again).
    #[serde(default)]
    pub settled: Option<Vec<(String, Result<i64, String>)>>,
    /// The located counters set aside as moved while counted (decided
    /// once, by the merge that concluded the locate pass: the shards keep
    /// moving after).
    #[serde(default)]
    pub moved: Option<Vec<String>>,
    /// The invocation that wrote the plan's parts.
    #[serde(default)]
    pub writer: u64,
    /// How many parts it was stored in.
    #[serde(skip)]
    parts: u32,
}

/// What a segment counted in a pass (the JSON form of [`Tally`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Counted {
    #[serde(default)]
    counted: Vec<(ProjectionId, String, i64)>,
    #[serde(default)]
    shards: Vec<(String, ProjectionId, String, i64)>,
    #[serde(default)]
    records: Vec<(String, i64)>,
    #[serde(default)]
    changes: Vec<(String, Option<i64>)>,
}

impl Counted {
    fn from_tally(tally: &Tally) -> Counted {
        Counted {
            counted: tally
                .counted
                .iter()
                .map(|((id, joined), n)| (*id, joined.clone(), *n))
                .collect(),
            shards: tally
                .shards
                .iter()
                .map(|(pk, (id, joined, n))| (pk.clone(), *id, joined.clone(), *n))
                .collect(),
            records: tally.records.iter().map(|(k, n)| (k.clone(), *n)).collect(),
            changes: tally.changes.iter().map(|(k, n)| (k.clone(), *n)).collect(),
        }
    }

    /// Adds it to `tally`.
    fn add_to(self, tally: &mut Tally) {
        for (id, joined, n) in self.counted {
            *tally.counted.entry((id, joined)).or_insert(0) += n;
        }
        for (pk, id, joined, n) in self.shards {
            tally.shards.insert(pk, (id, joined, n));
        }
        for (key, n) in self.records {
            *tally.records.entry(key).or_insert(0) += n;
        }
        tally.changes.extend(self.changes);
    }
}

/// A segment's progress in a pass, as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PassState {
    resume_at: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    done: bool,
    scanned: u64,
    read_units: f64,
    saves: u64,
    writer: u64,
    parts: u32,
}

fn plan_sk(run: &str) -> String {
    format!("{run}#plan")
}

fn pass_sk(run: &str, pass: u32, segment: u32, total: u32) -> String {
    format!("{run}#c{pass}#{segment}/{total}")
}

fn blob_sk(base: &str, saves: u64, writer: u64, part: u32) -> String {
    format!("{base}#t{saves:010}#{writer:016x}#{part:03}")
}

fn fatal(applier: &Applier, message: String) -> ApplyError {
    ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    }
}

/// Writes `text` in parts under `base`, save `saves`, writer `writer`;
/// returns how many.
async fn write_blob(
    applier: &Applier,
    base: &str,
    saves: u64,
    writer: u64,
    text: &str,
) -> Result<u32, ApplyError> {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() || parts.is_empty() {
        let mut end = rest.len().min(checkpoint::PART_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        parts.push(&rest[..end]);
        rest = &rest[end..];
    }
    for (part, chunk) in parts.iter().enumerate() {
        checkpoint::put(
            applier,
            blob_sk(base, saves, writer, part as u32),
            vec![("blob", Av::S(chunk.to_string()))],
            None,
        )
        .await?;
    }
    Ok(parts.len() as u32)
}

fn blob_keys(applier: &Applier, base: &str, saves: u64, writer: u64, parts: u32) -> Vec<ItemKey> {
    (0..parts)
        .map(|part| item_key(applier, blob_sk(base, saves, writer, part)))
        .collect()
}

async fn read_blob(
    applier: &Applier,
    base: &str,
    saves: u64,
    writer: u64,
    parts: u32,
) -> Result<String, ApplyError> {
    read_blob_if_there(applier, base, saves, writer, parts)
        .await?
        .map_err(|gone| {
            fatal(
                applier,
                format!(
                    "the audit item `{gone}` is gone: the run cannot be merged; start a new one"
                ),
            )
        })
}

/// The blob, or the sort key of a part that is gone (a newer save
/// deleted it since its state was read).
async fn read_blob_if_there(
    applier: &Applier,
    base: &str,
    saves: u64,
    writer: u64,
    parts: u32,
) -> Result<Result<String, String>, ApplyError> {
    let keys = blob_keys(applier, base, saves, writer, parts);
    let mut found = checkpoint::read_items(applier, &keys).await?;
    let mut text = String::new();
    for key in keys {
        let Some(item) = found.remove(&key) else {
            return Ok(Err(key.sk.unwrap_or(key.pk)));
        };
        text.push_str(checkpoint::text(&item, "blob").unwrap_or_default());
    }
    Ok(Ok(text))
}

/// The run's plan, if a merge made one.
pub async fn load_plan(applier: &Applier, run: &str) -> Result<Option<Plan>, ApplyError> {
    let sk = plan_sk(run);
    // A merge replacing the plan deletes the parts of the one read here:
    // read it again.
    for _ in 0..10 {
        let Some(item) = checkpoint::get(applier, sk.clone()).await? else {
            return Ok(None);
        };
        let pass = checkpoint::number(&item, "saves").unwrap_or(0);
        let writer = checkpoint::number(&item, "writer").unwrap_or(0);
        let parts = checkpoint::number(&item, "parts").unwrap_or(1) as u32;
        let Ok(text) = read_blob_if_there(applier, &sk, pass, writer, parts).await? else {
            continue;
        };
        let mut plan: Plan = serde_json::from_str(&text).map_err(|error| {
            fatal(
                applier,
                format!("the audit item `{sk}` is unreadable: {error}"),
            )
        })?;
        plan.writer = writer;
        plan.parts = parts;
        return Ok(Some(plan));
    }
    Err(fatal(
        applier,
        format!("the audit item `{sk}` keeps changing while it is read"),
    ))
}

/// Stores `plan`, if the stored one is at pass `expected` (`None`: there
/// is none). Returns false when another merge stored one first.
async fn store_plan(
    applier: &Applier,
    run: &str,
    plan: &mut Plan,
    expected: Option<u32>,
) -> Result<bool, ApplyError> {
    let sk = plan_sk(run);
    plan.writer = checkpoint::writer_id();
    let text = serde_json::to_string(plan).map_err(|e| fatal(applier, e.to_string()))?;
    let saves = plan.pass as u64;
    let parts = write_blob(applier, &sk, saves, plan.writer, &text).await?;
    let stored = checkpoint::put(
        applier,
        sk.clone(),
        vec![
            ("saves", Av::N(saves.to_string())),
            ("writer", Av::N(plan.writer.to_string())),
            ("parts", Av::N(parts.to_string())),
        ],
        Some(expected.map(u64::from)),
    )
    .await?;
    if !stored {
        checkpoint::delete(applier, &blob_keys(applier, &sk, saves, plan.writer, parts)).await?;
    }
    Ok(stored)
}

/// Records what settling the recount gave in the stored plan (at its
/// current pass, whose parts it rewrites under the same writer).
async fn store_settled(applier: &Applier, run: &str, plan: &Plan) -> Result<(), ApplyError> {
    let sk = plan_sk(run);
    let text = serde_json::to_string(plan).map_err(|e| fatal(applier, e.to_string()))?;
    let writer = checkpoint::writer_id();
    let saves = plan.pass as u64;
    let parts = write_blob(applier, &sk, saves, writer, &text).await?;
    // Same pass, another writer: only the item that names it is read.
    let stored = checkpoint::put(
        applier,
        sk.clone(),
        vec![
            ("saves", Av::N(saves.to_string())),
            ("writer", Av::N(writer.to_string())),
            ("parts", Av::N(parts.to_string())),
        ],
        Some(Some(saves)),
    )
    .await?;
    // The parts no item names: the old ones once replaced, or these.
    let unnamed = if stored {
        blob_keys(applier, &sk, saves, plan.writer, plan.parts)
    } else {
        blob_keys(applier, &sk, saves, writer, parts)
    };
    checkpoint::delete(applier, &unnamed).await?;
    Ok(())
}

async fn load_state(
    applier: &Applier,
    run: &str,
    pass: u32,
    segment: u32,
    total: u32,
) -> Result<Option<PassState>, ApplyError> {
    let sk = pass_sk(run, pass, segment, total);
    let Some(item) = checkpoint::get(applier, sk.clone()).await? else {
        return Ok(None);
    };
    serde_json::from_str(checkpoint::text(&item, "state").unwrap_or_default())
        .map(Some)
        .map_err(|error| {
            fatal(
                applier,
                format!("the audit item `{sk}` is unreadable: {error}"),
            )
        })
}

/// What one slice of a counting pass did.
#[derive(Debug, Clone, PartialEq)]
pub struct PassSlice {
    /// The segment has been counted to its end in this pass.
    pub done: bool,
    /// Items of the segment counted so far in this pass.
    pub scanned: u64,
    /// Read capacity the segment's pass consumed so far.
    pub read_units: f64,
    /// Another invocation saved the segment ahead of this one.
    pub overtaken: bool,
}

/// Counts `segment` in pass `pass` of `run`, from where it stands, until
/// `options.deadline` or `options.max_pages`, saving once at the end. A
/// slice of a pass that is over (a retry of a slice answered before)
/// answers done.
pub async fn count_slice(
    applier: &Applier,
    run: &str,
    pass: u32,
    segment: u32,
    options: &AuditOptions,
) -> Result<PassSlice, ApplyError> {
    let total = options.segments.max(1);
    let plan = load_plan(applier, run).await?.ok_or_else(|| {
        fatal(
            applier,
            format!("the audit run `{run}` has no counting pass {pass}: its merge plans the passes; merge first"),
        )
    })?;
    if pass > plan.pass {
        return Err(fatal(
            applier,
            format!(
                "the audit run `{run}` is at counting pass {}, not {pass}: merge it for the next",
                plan.pass
            ),
        ));
    }
    let sk = pass_sk(run, pass, segment, total);
    let mut tally = Tally::default();
    // A duplicate slice saving meanwhile deletes the tally of the state
    // read here: read the state again.
    let mut attempts = 0;
    let loaded = loop {
        attempts += 1;
        let loaded = load_state(applier, run, pass, segment, total).await?;
        let Some(state) = loaded.as_ref().filter(|s| s.parts > 0 && !s.done) else {
            break loaded;
        };
        match read_blob_if_there(applier, &sk, state.saves, state.writer, state.parts).await? {
            Ok(text) => {
                let counted: Counted = serde_json::from_str(&text).map_err(|error| {
                    fatal(applier, format!("the audit item `{sk}`'s tally is unreadable: {error}"))
                })?;
                counted.add_to(&mut tally);
                break loaded;
            }
            Err(gone) if attempts >= 10 => {
                return Err(fatal(
                    applier,
                    format!("the audit item `{gone}` is gone: the segment's tally keeps moving under this slice"),
                ))
            }
            Err(_) => continue,
        }
    };
    if pass < plan.pass || loaded.as_ref().is_some_and(|s| s.done) {
        let state = loaded.unwrap_or_default();
        return Ok(PassSlice {
            done: true,
            scanned: state.scanned,
            read_units: state.read_units,
            overtaken: false,
        });
    }
    let expected = loaded.as_ref().map(|s| s.saves);
    let mut state = loaded.unwrap_or_default();
    let mut pages = Pages::new(segment, total, options.page_size);
    if let Some(key) = &state.resume_at {
        let key = checkpoint::key_from_json(key).ok_or_else(|| {
            fatal(
                applier,
                format!("the audit item `{sk}`: the resume key is unreadable"),
            )
        })?;
        pages.resume_at(key);
    }
    let wanted: HashSet<&str> = if plan.recount == Some(pass) {
        plan.before
            .iter()
            .map(|(shard, _, _)| shard.as_str())
            .collect()
    } else {
        HashSet::new()
    };
    let sketch = plan.sketch.clone().unwrap_or_default();
    let locating = plan.locate == Some(pass);
    let spec = applier.spec();
    let read_micro = AtomicU64::new(0);
    let quiet = Progress::new(false, None);
    let pacer = crate::backfill::Pacer::new(options.max_rcu);
    let mut read = 0;
    let in_time = || {
        options
            .deadline
            .is_none_or(|deadline| tokio::time::Instant::now() < deadline)
    };
    while options.max_pages.is_none_or(|max| read < max) && in_time() {
        let Some(items) = pages.next(applier, &read_micro, &quiet).await? else {
            break;
        };
        read += 1;
        state.scanned += items.len() as u64;
        state.read_units += pages.last_units;
        for item in items {
            if locating {
                classify(spec, item, &mut |fact| tally.keep(&sketch, fact));
            } else {
                count_records_of(&item, &wanted, &mut tally.records);
            }
        }
        pacer.consume(pages.last_units).await;
        if pages.is_done() {
            break;
        }
    }
    state.done = pages.is_done();
    state.resume_at = pages.resume_key().map(checkpoint::key_to_json);
    let old = (state.saves, state.writer, state.parts);
    state.saves = expected.unwrap_or(0) + 1;
    state.writer = checkpoint::writer_id();
    let text = serde_json::to_string(&Counted::from_tally(&tally))
        .map_err(|e| fatal(applier, e.to_string()))?;
    state.parts = write_blob(applier, &sk, state.saves, state.writer, &text).await?;
    let state_text = serde_json::to_string(&state).map_err(|e| fatal(applier, e.to_string()))?;
    let saved = checkpoint::put(
        applier,
        sk.clone(),
        vec![
            ("state", Av::S(state_text)),
            ("saves", Av::N(state.saves.to_string())),
        ],
        Some(expected),
    )
    .await?;
    let mine = blob_keys(applier, &sk, state.saves, state.writer, state.parts);
    if !saved {
        tracing::warn!(
            run,
            pass,
            segment,
            total_segments = total,
            "another invocation saved this audit pass's segment ahead of this one: this one stops"
        );
        checkpoint::delete(applier, &mine).await?;
        let other = load_state(applier, run, pass, segment, total)
            .await?
            .unwrap_or_default();
        return Ok(PassSlice {
            done: other.done,
            scanned: other.scanned,
            read_units: other.read_units,
            overtaken: true,
        });
    }
    if old.2 > 0 {
        checkpoint::delete(applier, &blob_keys(applier, &sk, old.0, old.1, old.2)).await?;
    }
    if expected.is_none() && checkpoint::get(applier, plan_sk(run)).await?.is_none() {
        // The run was merged and its items deleted since this slice read
        // its plan: what it just saved would be left behind.
        let mut keys = mine;
        keys.push(item_key(applier, sk.clone()));
        checkpoint::delete(applier, &keys).await?;
    }
    Ok(PassSlice {
        done: state.done,
        scanned: state.scanned,
        read_units: state.read_units,
        overtaken: false,
    })
}

/// Adds to `counts` the records of `item` naming one of `wanted`.
fn count_records_of(
    item: &crate::record::Item,
    wanted: &HashSet<&str>,
    counts: &mut HashMap<String, i64>,
) {
    for value in crate::apply::records_of(item).values() {
        if let crate::record::AttributeValue::S(shard) = value {
            if wanted.contains(shard.as_str()) {
                *counts.entry(shard.clone()).or_insert(0) += 1;
            }
        }
    }
}

/// The tallies of every segment in `pass`, summed, or which segments
/// are not done.
async fn load_pass(
    applier: &Applier,
    run: &str,
    pass: u32,
    total: u32,
) -> Result<Result<Tally, String>, ApplyError> {
    let mut tally = Tally::default();
    let mut left = Vec::new();
    for segment in 0..total {
        match load_state(applier, run, pass, segment, total).await? {
            Some(state) if state.done => {
                let sk = pass_sk(run, pass, segment, total);
                let text = read_blob(applier, &sk, state.saves, state.writer, state.parts).await?;
                let counted: Counted = serde_json::from_str(&text).map_err(|error| {
                    fatal(
                        applier,
                        format!("the audit item `{sk}`'s tally is unreadable: {error}"),
                    )
                })?;
                counted.add_to(&mut tally);
            }
            _ => left.push(segment.to_string()),
        }
    }
    if left.is_empty() {
        Ok(Ok(tally))
    } else {
        Ok(Err(format!(
            "the audit run `{run}` of {total} segments cannot be merged: segments {} have not finished counting pass {pass}; run their slices with \"pass\": {pass} until each answers done",
            left.join(", ")
        )))
    }
}

/// What a merge step concluded.
#[derive(Debug)]
pub enum Step {
    /// Run counting pass `pass` over every segment, then merge again.
    Pass {
        /// The pass.
        pass: u32,
        /// What it counts: `locate` or `recount`.
        purpose: &'static str,
    },
    /// The run is merged: its report (its findings not counted in the
    /// metrics yet), and the run's items, to delete once it is stored.
    Merged(Box<AuditReport>, Vec<ItemKey>),
    /// Segments have not finished a pass: why.
    Incomplete(String),
}

/// One step of the merge of `run` (see the module docs): plans the next
/// counting pass, or concludes from the passes counted.
pub async fn merge_step(
    applier: &Applier,
    run: &str,
    total: u32,
    repair: bool,
) -> Result<Step, ApplyError> {
    let (reports, mut items) = match checkpoint::load_run(applier, run, total).await? {
        checkpoint::LoadedRun::Ready(reports, items) => (reports, items),
        checkpoint::LoadedRun::Incomplete(why) => return Ok(Step::Incomplete(why)),
    };
    let started = std::time::Instant::now();
    let (report, sketch) = super::combine(applier, reports)?;
    let stored = load_plan(applier, run).await?;
    let mut plan = stored.clone().unwrap_or_default();
    // Locate the counters the sketch found wrong.
    let mut located = Vec::new();
    let mut moved = Vec::new();
    if !sketch.is_zero() {
        let Some(pass) = plan.locate else {
            plan.pass = 1;
            plan.locate = Some(1);
            plan.sketch = Some(sketch);
            return next(applier, run, plan, None, "locate").await;
        };
        let tally = match load_pass(applier, run, pass, total).await? {
            Ok(tally) => tally,
            Err(why) => return Ok(again(&plan, pass, "locate", why)),
        };
        counters(applier.spec(), &sketch, &tally, &mut located);
        // What the merge does not judge, it neither reports nor recounts.
        super::Judged::read(applier).await?.retain(&mut located);
        moved = match &plan.moved {
            Some(moved) => {
                located.retain(|finding| !moved.contains(&finding.key));
                moved.clone()
            }
            None if repair => Vec::new(),
            None => super::set_aside_moved(applier, &tally, &mut located).await?,
        };
        plan.moved = Some(moved.clone());
    }
    // Recount the shards to recount.
    let mut recounted: Option<Recounted> = None;
    let mut stats = BatchStats::default();
    if repair {
        let shards = repair::shards_to_recount(&located, &report.findings, true);
        if !shards.is_empty() {
            let Some(pass) = plan.recount else {
                let before = repair::read_shards(applier, &shards, &mut stats)
                    .await
                    .map_err(|e| fatal(applier, e))?;
                let expected = stored.as_ref().map(|p| p.pass);
                plan.pass = expected.unwrap_or(0) + 1;
                plan.recount = Some(plan.pass);
                plan.before = shards
                    .iter()
                    .map(|shard| {
                        let (count, changes) = before[shard];
                        (shard.clone(), count, changes)
                    })
                    .collect();
                return next(applier, run, plan, stored.as_ref(), "recount").await;
            };
            recounted = Some(match &plan.settled {
                Some(settled) => settled.iter().cloned().collect(),
                None => {
                    let tally = match load_pass(applier, run, pass, total).await? {
                        Ok(tally) => tally,
                        Err(why) => return Ok(again(&plan, pass, "recount", why)),
                    };
                    let before: HashMap<String, (i64, Option<i64>)> = plan
                        .before
                        .iter()
                        .map(|(shard, count, changes)| (shard.clone(), (*count, *changes)))
                        .collect();
                    let listed: Vec<String> = before.keys().cloned().collect();
                    let stamp = format!("{run}#c{pass}");
                    let outcome = repair::settle(
                        applier,
                        &listed,
                        &before,
                        &tally.records,
                        &mut stats,
                        Some(&stamp),
                    )
                    .await?;
                    // A merge of the run that settled first (at once with
                    // this one) answers for both: its outcome stands.
                    let first = load_plan(applier, run).await?.and_then(|p| p.settled);
                    match first {
                        Some(first) => first.into_iter().collect(),
                        None => {
                            plan.settled = Some(outcome.clone().into_iter().collect());
                            store_settled(applier, run, &plan).await?;
                            outcome
                        }
                    }
                }
            });
        }
    }
    let mut report = super::conclude(
        applier,
        super::AuditReport {
            moved_while_counted: moved,
            ..report
        },
        located,
        repair,
        Some(recounted.as_ref().unwrap_or(&Recounted::new())),
    )
    .await?;
    report.read_units += stats.read_units;
    report.write_units += stats.write_units;
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(plan) = &stored {
        items.extend(pass_items(applier, run, plan, total).await?);
    }
    Ok(Step::Merged(Box::new(report), items))
}

/// A merge of a pass not counted yet: the pass again if it is the plan's
/// current one (a merge retried after its answer was lost, or a run
/// started again under its name, goes on with it), else why not.
fn again(plan: &Plan, pass: u32, purpose: &'static str, why: String) -> Step {
    if pass == plan.pass {
        Step::Pass { pass, purpose }
    } else {
        Step::Incomplete(why)
    }
}

/// Stores `plan` and answers its pass (deleting the parts of the plan
/// it replaces, `old`); if another merge planned first, answers the
/// pass it planned.
async fn next(
    applier: &Applier,
    run: &str,
    mut plan: Plan,
    old: Option<&Plan>,
    purpose: &'static str,
) -> Result<Step, ApplyError> {
    let expected = old.map(|p| p.pass);
    if store_plan(applier, run, &mut plan, expected).await? {
        if let Some(old) = old.filter(|p| p.parts > 0) {
            let sk = plan_sk(run);
            let keys = blob_keys(applier, &sk, old.pass as u64, old.writer, old.parts);
            checkpoint::delete(applier, &keys).await?;
        }
        tracing::info!(
            run,
            pass = plan.pass,
            purpose,
            "audit merge planned a counting pass"
        );
        return Ok(Step::Pass {
            pass: plan.pass,
            purpose,
        });
    }
    let other = load_plan(applier, run).await?.unwrap_or_default();
    let purpose = if other.recount == Some(other.pass) {
        "recount"
    } else {
        "locate"
    };
    Ok(Step::Pass {
        pass: other.pass,
        purpose,
    })
}

/// The items of `plan`'s passes and the plan's own, state items after
/// their parts and the plan last.
async fn pass_items(
    applier: &Applier,
    run: &str,
    plan: &Plan,
    total: u32,
) -> Result<Vec<ItemKey>, ApplyError> {
    let mut keys = Vec::new();
    for pass in 1..=plan.pass {
        for segment in 0..total {
            let sk = pass_sk(run, pass, segment, total);
            if let Some(state) = load_state(applier, run, pass, segment, total).await? {
                keys.extend(blob_keys(
                    applier,
                    &sk,
                    state.saves,
                    state.writer,
                    state.parts,
                ));
                keys.push(item_key(applier, sk));
            }
        }
    }
    let sk = plan_sk(run);
    if let Some(item) = checkpoint::get(applier, sk.clone()).await? {
        let saves = checkpoint::number(&item, "saves").unwrap_or(0);
        let writer = checkpoint::number(&item, "writer").unwrap_or(0);
        let parts = checkpoint::number(&item, "parts").unwrap_or(1) as u32;
        keys.extend(blob_keys(applier, &sk, saves, writer, parts));
    }
    keys.push(item_key(applier, sk));
    Ok(keys)
}

/// Deletes what is left of the passes of `run` (a merge whose deletes
/// were cut short).
pub async fn delete_rest(applier: &Applier, run: &str, total: u32) -> Result<(), ApplyError> {
    let Some(item) = checkpoint::get(applier, plan_sk(run)).await? else {
        return Ok(());
    };
    let pass = checkpoint::number(&item, "saves").unwrap_or(0) as u32;
    let plan = Plan {
        pass,
        ..Plan::default()
    };
    let keys = pass_items(applier, run, &plan, total).await?;
    checkpoint::delete(applier, &keys).await
}
