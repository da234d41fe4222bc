//! `audit --repair`: findings fixed through the guarded write path, and
//! counters recounted from their records.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};

use super::{AuditReport, Fix, Problem};
use crate::apply::{Applier, ApplyError, BatchStats};
use crate::dynamo::names::{CHANGES_ATTRIBUTE, COUNT_ATTRIBUTE, RECORDS_ATTRIBUTE};
use crate::plan::Effect;

/// Writes the fixes of an audit's findings: derived items, markers and
/// records through the applier (reading first, guarded by the source state
/// the scan saw, so nothing newer is undone), then counter shards that do
/// not hold the number of records naming them (see `recount`).
pub async fn repair(applier: &Applier, report: &mut AuditReport) -> Result<(), ApplyError> {
    repair_beside(applier, report, &[], true, None).await
}

/// What recounting shards gave: each shard's count, or why it was not
/// set.
pub type Recounted = HashMap<String, Result<i64, String>>;

/// As [`repair`] for one page of a segment: the shards its repairs move
/// are left for the merge to count again, once for the whole run
/// ([`super::Finding::shards`]).
pub(super) async fn repair_page(
    applier: &Applier,
    report: &mut AuditReport,
) -> Result<(), ApplyError> {
    repair_beside(applier, report, &[], false, None).await
}

/// As [`repair`], with the findings `beside` it (the segments' of a
/// merge, repaired or not by then); with `recount_moved`, the shards that
/// the repairs of either moved are counted again too. `recounted` is what
/// counting those shards gave when that was done apart (the sliced
/// merge's passes, [`super::passes`]); `None` recounts them here, with a
/// scan of the table.
pub(super) async fn repair_beside(
    applier: &Applier,
    report: &mut AuditReport,
    beside: &[super::Finding],
    recount_moved: bool,
    recounted: Option<&Recounted>,
) -> Result<(), ApplyError> {
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
    let shards = shards_to_recount(&report.findings, beside, recount_moved);
    if !shards.is_empty() {
        let outcome: Recounted = match recounted {
            Some(given) => shards
                .iter()
                .map(|shard| {
                    let result = given.get(shard).cloned().unwrap_or_else(|| {
                        Err(format!(
                            "shard {shard} was not recounted; run the audit again"
                        ))
                    });
                    (shard.clone(), result)
                })
                .collect(),
            None => recount(applier, &shards, &mut total).await?,
        };
        // A shard counted again only because a repair moved it answers
        // for itself.
        let claimed: HashSet<&String> = report
            .findings
            .iter()
            .filter_map(|f| match &f.fix {
                Some(Fix::Recount(list)) => Some(list),
                _ => None,
            })
            .flatten()
            .collect();
        let mut unclaimed: Vec<String> = shards
            .iter()
            .filter(|shard| !claimed.contains(shard))
            .filter_map(|shard| match outcome.get(shard) {
                Some(Err(error)) => Some(format!("{shard}: {error}")),
                _ => None,
            })
            .collect();
        report.repair_failures.append(&mut unclaimed);
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
            // The records a recount counts are the counter's members only
            // once every membership is in place: while one is left (its
            // repair failed, or was not asked for: `audit-merge --repair`
            // after segments audited without `--repair`), the counter is
            // not right yet.
            let counter = report.findings[index].rule.clone();
            let memberships_left =
                memberships_left(&report.findings, &counter) + memberships_left(beside, &counter);
            let short = match report.findings[index].problem {
                Problem::CounterOff { .. } if errors.is_empty() && memberships_left > 0 => Some(format!(
                    "{memberships_left} findings that change its members are not repaired, so the records the recount counted are not all its members: repair them, then audit again"
                )),
                _ => None,
            };
            if errors.is_empty() && short.is_none() {
                report.findings[index].repaired = true;
            }
            if let Some(short) = short {
                report.repair_failures.push(format!(
                    "{} {}: {short}",
                    report.findings[index].rule, report.findings[index].key
                ));
            }
            for error in errors {
                report.repair_failures.push(format!(
                    "{} {}: {error}",
                    report.findings[index].rule, report.findings[index].key
                ));
            }
        }
    }
    // What follows the shards recounted (rollups), from their new values.
    let following = crate::kinds::after_recount(applier.spec(), &shards);
    if !following.is_empty() {
        let (results, stats) = applier.apply_effects(following, true).await;
        total.add(&stats);
        for error in results.into_iter().filter_map(Result::err) {
            report
                .repair_failures
                .push(format!("after the recount: {error}"));
        }
    }
    report.repaired = report.findings.iter().filter(|f| f.repaired).count();
    report.write_units = total.write_units;
    report.read_units += total.read_units;
    metrics::counter!("projector_audit_repairs_total").increment(report.repaired as u64);
    Ok(())
}

/// The shards a repair counts again: those of the counters `findings`
/// found off and, with `recount_moved`, those the repairs of `findings`
/// and `beside` moved (repaired or not as stored: a slice cut short after
/// repairing a page keeps it marked unrepaired). A repaired membership
/// moved its shards by one, on purpose: a source counted without its
/// record is counted again with it, and the count is then set from the
/// records.
pub(super) fn shards_to_recount(
    findings: &[super::Finding],
    beside: &[super::Finding],
    recount_moved: bool,
) -> Vec<String> {
    let mut shards: Vec<String> = Vec::new();
    let mut add = |shard: &String| {
        if !shards.contains(shard) {
            shards.push(shard.clone());
        }
    };
    for finding in findings {
        if let Some(Fix::Recount(list)) = &finding.fix {
            list.iter().for_each(&mut add);
        }
    }
    if recount_moved {
        for finding in findings.iter().chain(beside) {
            finding.shards.iter().for_each(&mut add);
        }
    }
    shards
}

/// Reads shard `shard` (consistently).
async fn get_shard(
    applier: &Applier,
    shard: &str,
) -> Result<aws_sdk_dynamodb::operation::get_item::GetItemOutput, String> {
    let spec = applier.spec();
    applier
        .client()
        .get_item()
        .table_name(applier.table())
        .set_key(Some(spec.table.key_item(&spec.shard_item(shard)).into()))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| crate::dynamo::retry::describe(&e))
}

/// A shard's count and how many transactions moved it.
pub(super) async fn read_shards(
    applier: &Applier,
    shards: &[String],
    stats: &mut BatchStats,
) -> Result<HashMap<String, (i64, Option<i64>)>, String> {
    let mut out = HashMap::new();
    for shard in shards {
        let output = get_shard(applier, shard).await?;
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
pub(super) async fn recount(
    applier: &Applier,
    shards: &[String],
    stats: &mut BatchStats,
) -> Result<Recounted, ApplyError> {
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    let before = read_shards(applier, shards, stats).await.map_err(fatal)?;
    let wanted: HashSet<&str> = shards.iter().map(String::as_str).collect();
    let records = count_records(applier, &wanted, stats).await?;
    settle(applier, shards, &before, &records, stats, None).await
}

/// The end of a recount: reads `shards` again and sets each that did not
/// move since `before` to the number of `records` naming it, on condition
/// that it still has not moved.
pub(super) async fn settle(
    applier: &Applier,
    shards: &[String],
    before: &HashMap<String, (i64, Option<i64>)>,
    records: &HashMap<String, i64>,
    stats: &mut BatchStats,
    stamp: Option<&str>,
) -> Result<Recounted, ApplyError> {
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    let after = read_shards(applier, shards, stats).await.map_err(fatal)?;
    let spec = applier.spec();
    let mut outcome = HashMap::new();
    for shard in shards {
        let (count, changes) = after[shard];
        let named = records.get(shard.as_str()).copied().unwrap_or(0);
        if before.get(shard) != Some(&after[shard]) {
            // Set by this very recount, settled before (a merge retried
            // after it wrote, or two at once): one change, to the count,
            // under its stamp.
            let mine = match (stamp, before.get(shard)) {
                (Some(stamp), Some((_, seen))) => settled_by(applier, shard, named, *seen, stamp)
                    .await
                    .map_err(fatal)?,
                _ => false,
            };
            if mine {
                outcome.insert(shard.clone(), Ok(named));
                continue;
            }
            outcome.insert(
                shard.clone(),
                Err(format!(
                    "shard {shard} changed while its records were counted; run the audit again"
                )),
            );
            continue;
        }
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
            .expression_attribute_names("#c", COUNT_ATTRIBUTE)
            .expression_attribute_names("#n", CHANGES_ATTRIBUTE)
            .expression_attribute_values(":d", Av::N(delta.to_string()))
            .expression_attribute_values(":one", Av::N("1".to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        request = match stamp {
            Some(stamp) => request
                .update_expression("ADD #c :d, #n :one SET #by = :by")
                .expression_attribute_names("#by", RECOUNTED_BY)
                .expression_attribute_values(":by", Av::S(stamp.to_string())),
            None => request.update_expression("ADD #c :d, #n :one"),
        };
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
            // Another merge of this run settled it first.
            Err(_)
                if match stamp {
                    Some(stamp) => settled_by(applier, shard, named, changes, stamp)
                        .await
                        .map_err(fatal)?,
                    None => false,
                } =>
            {
                Ok(named)
            }
            Err(error) => Err(format!(
                "shard {shard} changed while repairing; run the audit again ({})",
                crate::dynamo::retry::describe(&error)
            )),
        };
        outcome.insert(shard.clone(), result);
    }
    Ok(outcome)
}

/// The attribute naming the recount that last set a shard (a sliced
/// merge's run and pass), so that settling it again knows its own write.
pub(super) const RECOUNTED_BY: &str = "recountedBy";

/// Whether `shard` holds what a recount under `stamp` set it to: `named`,
/// one change after `seen`, under its stamp (a merge retried after it
/// settled, or two merges of one run at once).
async fn settled_by(
    applier: &Applier,
    shard: &str,
    named: i64,
    seen: Option<i64>,
    stamp: &str,
) -> Result<bool, String> {
    let output = get_shard(applier, shard).await?;
    let item = output.item();
    let number = |name: &str| match item.and_then(|i| i.get(name)) {
        Some(Av::N(n)) => n.parse::<i64>().ok(),
        _ => None,
    };
    let by = match item.and_then(|i| i.get(RECOUNTED_BY)) {
        Some(Av::S(by)) => Some(by.as_str()),
        _ => None,
    };
    Ok(by == Some(stamp)
        && number(COUNT_ATTRIBUTE).unwrap_or(0) == named
        && number(CHANGES_ATTRIBUTE) == Some(seen.unwrap_or(0) + 1))
}

/// The records naming each of `shards`, from a full scan that keeps
/// nothing else.
pub(super) async fn count_records(
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
        let page = crate::dynamo::retry::with_retries(
            "audit_recount",
            std::time::Duration::from_secs(60),
            &retries,
            || {
                let request = request.clone();
                async move { request.send().await.map_err(crate::dynamo::retry::sdk) }
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
            if let Some(Av::M(records)) = item.get(RECORDS_ATTRIBUTE) {
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

/// Findings not repaired that change `counter`'s members (see
/// [`super::Finding::counters`]): while one is left, the records a recount
/// counts are not all the counter's members.
pub(super) fn memberships_left(findings: &[super::Finding], counter: &str) -> usize {
    findings
        .iter()
        .filter(|f| !f.repaired && f.counters.iter().any(|c| c == counter))
        .count()
}
