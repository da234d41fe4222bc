//! A segment audited in slices: after each page, what the segment found
//! so far and where its scan stands go to a checkpoint file, so that a
//! run stopped anywhere (a crash, a kill, a slice's page budget) resumes
//! at the next page. The repairs of a checkpointed segment are made page
//! by page, as its findings are stored without their fixes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use serde::{Deserialize, Serialize};

use super::scan::{Pages, Progress};
use super::sketch::Sketch;
use super::{page, repair, AuditOptions, AuditReport};
use crate::apply::{Applier, ApplyError};

/// What a checkpoint file holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The report so far (`complete` once the segment's scan ended).
    pub report: AuditReport,
    /// Where the scan resumes (DynamoDB JSON of the last key read).
    #[serde(default)]
    pub resume_at: Option<BTreeMap<String, serde_json::Value>>,
}

fn key_to_json(key: &HashMap<String, Av>) -> BTreeMap<String, serde_json::Value> {
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

fn key_from_json(key: &BTreeMap<String, serde_json::Value>) -> Option<HashMap<String, Av>> {
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

/// Audits `segment` from `path`'s checkpoint (a fresh one when the file
/// does not exist), writing it after every page; stops after
/// `options.max_pages` pages, with `complete` false.
pub(super) async fn audit_segment_from(
    applier: &Applier,
    options: &AuditOptions,
    segment: u32,
    path: &Path,
) -> Result<AuditReport, ApplyError> {
    let started = Instant::now();
    let fatal = |message: String| ApplyError::Fatal {
        table: applier.table().to_string(),
        message,
    };
    let total = options.segments.max(1);
    let mut state = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str::<Checkpoint>(&text).map_err(|error| {
            fatal(format!(
                "{} is not an audit checkpoint: {error}",
                path.display()
            ))
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Checkpoint {
            report: AuditReport {
                table: applier.table().to_string(),
                started_ms: crate::lifecycle::now_ms(),
                segment: Some(segment),
                total_segments: total,
                sketch: Some(Sketch::default()),
                complete: false,
                ..AuditReport::default()
            },
            resume_at: None,
        },
        Err(error) => return Err(fatal(format!("cannot read {}: {error}", path.display()))),
    };
    {
        let report = &state.report;
        if report.table != applier.table()
            || report.segment != Some(segment)
            || report.total_segments != total
        {
            return Err(fatal(format!(
                "{} is the checkpoint of segment {} of {} of `{}`, not of segment {segment} of {total} of `{}`",
                path.display(),
                report.segment.map_or("-".to_string(), |s| s.to_string()),
                report.total_segments,
                report.table,
                applier.table()
            )));
        }
        if report.complete {
            return Ok(state.report);
        }
    }
    let mut pages = Pages::new(segment, total, options.page_size);
    if let Some(key) = &state.resume_at {
        let key = key_from_json(key)
            .ok_or_else(|| fatal(format!("{}: a resume key is unreadable", path.display())))?;
        pages.resume_at(key);
    }
    let read_micro = AtomicU64::new(0);
    let estimate = crate::backfill::estimate_items(applier)
        .await
        .map(|n| n / total as u64);
    let progress = Progress::new(options.progress, estimate);
    progress.advance(state.report.scanned);
    let pacer = crate::backfill::Pacer::new(options.max_rcu);
    let mut sketch = state.report.sketch.take().unwrap_or_default();
    let mut read = 0;
    while options.max_pages.is_none_or(|max| read < max) {
        let Some(items) = pages.next(applier, &read_micro, &progress).await? else {
            state.report.complete = true;
            break;
        };
        read += 1;
        let report = &mut state.report;
        report.scanned += items.len() as u64;
        let found = page::check(applier, items, &mut sketch).await?;
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
        report.violation_keys.extend(
            found
                .violations
                .iter()
                .map(|(_, v)| (v.invariant.clone(), v.record_sk())),
        );
        if options.repair {
            repair(applier, &mut part).await?;
            report.repaired += part.repaired;
            report.repair_failures.append(&mut part.repair_failures);
            report.write_units += part.write_units;
            report.read_units += part.read_units;
            let violations: Vec<_> = found.violations.into_iter().map(|(_, v)| v).collect();
            report.violations_recorded += applier.record_violations(&violations).await?;
        }
        report.findings.append(&mut part.findings);
        report.complete = pages.is_done();
        report.sketch = Some(sketch.clone());
        state.resume_at = pages.resume_key().map(key_to_json);
        save(path, &state).map_err(fatal)?;
        if state.report.complete {
            break;
        }
    }
    progress.finish();
    state.report.sketch = Some(sketch);
    state.report.seconds += started.elapsed().as_secs_f64();
    state.resume_at = pages.resume_key().map(key_to_json);
    save(path, &state).map_err(fatal)?;
    let mut report = state.report;
    let (findings, _) = super::one_per_key(applier.spec(), report.findings);
    report.findings = findings;
    super::sort_findings(applier.spec(), &mut report.findings);
    report.violation_keys.sort();
    report.violation_keys.dedup();
    Ok(report)
}

/// Writes `state` to `path` whole or not at all (a temporary file renamed
/// over it).
fn save(path: &Path, state: &Checkpoint) -> Result<(), String> {
    let text = serde_json::to_string(state).map_err(|e| e.to_string())?;
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|error| format!("cannot write the checkpoint {}: {error}", path.display()))
}
