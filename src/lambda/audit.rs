//! An audit on Step Functions: one scan segment per invocation, for as
//! long as the invocation allows, then one merge.
//!
//! The payload `{"audit": {"run": "nightly-1", "segment": 0, "totalSegments": 4}}`
//! audits that segment page by page ([`crate::audit::checkpoint`]),
//! continuing from the run's checkpoint in the table, and stops starting
//! pages once the invocation's time less the margin
//! (`PROJECTOR_DEADLINE_MARGIN_MS`) is used. Each page's findings are
//! stored in the table beside the checkpoint, so a slice holds one page,
//! whatever the segment's size, and a slice cut short, retried or repeated
//! checks at most one page again. The answer ([`AuditSliceResponse`]) says
//! whether the segment is `done`; the state machine (`infra/template.yaml`,
//! `AuditStateMachine`) invokes again until it is.
//!
//! Once every segment is done, `{"audit": {"run": ..., "totalSegments": 4,
//! "merge": true}}` combines them ([`crate::audit::merge`]): the findings,
//! and the counters, concluded from the summed sketches. Each finding goes
//! to the log (`"audit finding"`, with its projection, kind, key and
//! detail), `projector_audit_findings_total{projection,kind}` counts them
//! and `projector_audit_runs_total{outcome}` counts the run as `clean` or
//! `findings` (the stack alarms on the latter). The summary is stored as
//! the run's `merged` item and the segments' items are deleted: a merge
//! invoked again answers the stored summary and counts nothing twice.
//!
//! | field | meaning |
//! | --- | --- |
//! | `run` | the audit's name, the same in every slice and the merge (the state machine sends its execution name); 1 to 80 characters without spaces, `#` or `/`; a run merged once cannot be audited again |
//! | `segment` | the scan segment, from 0 (default 0) |
//! | `totalSegments` | how many segments the table is scanned in (default 1) |
//! | `repair` | write derived state back through the worker's guarded writes: each slice its page's findings, the merge the counters, and it clears the recorded violations no segment found |
//! | `maxRcu` | consumed read capacity per second this invocation stays under |
//! | `pageSize` | items per scan page (default 1,000) |
//! | `maxPages` | pages per invocation at most (default: as many as the time allows) |
//! | `merge` | merge the run's segments instead of auditing one |
//! | `pass` | the counting pass a slice counts, as the merge answered it (default 0: the audit's own pass) |
//!
//! The merge may need the table counted again: where the summed sketch
//! is not zero, and, with `repair`, for the shards to recount
//! ([`crate::audit::passes`]). It then answers `{"pass": 1, "purpose":
//! "locate", ...}` ([`AuditPassResponse`]): every segment is run in
//! slices again with `"pass": 1`, then the merge again, until it answers
//! the summary. So no invocation reads more than its slice's pages,
//! whatever the table's size.

use lambda_runtime::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::backfill::MAX_TOTAL_SEGMENTS;
use super::handler::{Handler, InvocationError};
use crate::apply::Applier;
use crate::audit::checkpoint::{self, CheckpointStore};
use crate::audit::passes::{self, Step};
use crate::audit::{AuditOptions, AuditReport};
use aws_sdk_dynamodb::types::AttributeValue as Av;

/// The `audit` object of an audit payload, as sent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditRequest {
    /// The audit's name, the same in every slice and the merge.
    pub run: String,
    /// The table (default: `PROJECTOR_TABLE`, else the table of the only
    /// spec; required when the function serves several tables).
    #[serde(default)]
    pub table: Option<String>,
    /// The scan segment, from 0.
    #[serde(default)]
    pub segment: u32,
    /// The number of scan segments.
    #[serde(default = "one")]
    pub total_segments: u32,
    /// Repair what is found.
    #[serde(default)]
    pub repair: Option<bool>,
    /// Consumed read capacity per second to stay under.
    #[serde(default)]
    pub max_rcu: Option<f64>,
    /// Items per scan page.
    #[serde(default)]
    pub page_size: Option<u32>,
    /// Pages per invocation at most.
    #[serde(default)]
    pub max_pages: Option<u64>,
    /// Merge the run's segments.
    #[serde(default)]
    pub merge: Option<bool>,
    /// The counting pass a slice belongs to (the merge plans them); 0 or
    /// absent: the audit's own pass.
    #[serde(default)]
    pub pass: Option<u32>,
}

fn one() -> u32 {
    1
}

/// Why an audit request cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuditRequestError {
    /// `run` is empty or has characters the checkpoint's keys use.
    #[error("audit: run `{0}` is not a name: use 1 to 80 characters without spaces, `#` or `/` (the state machine sends its execution name)")]
    BadRun(String),
    /// `totalSegments` is 0.
    #[error(
        "audit: totalSegments is 0: it must be at least 1 (the number of parallel scan segments)"
    )]
    NoSegments,
    /// `totalSegments` is over DynamoDB's limit.
    #[error("audit: totalSegments {0} is more than DynamoDB's limit of {MAX_TOTAL_SEGMENTS}")]
    TooManySegments(u32),
    /// `segment` is not below `totalSegments`.
    #[error("audit: segment {segment} is out of range for totalSegments {total} (segments count from 0 to {last})", last = total - 1)]
    SegmentOutOfRange {
        /// The segment sent.
        segment: u32,
        /// `totalSegments`.
        total: u32,
    },
    /// `maxRcu` is not a positive number.
    #[error("audit: maxRcu is {0}: it must be a positive number of capacity units per second (omit it for no limit)")]
    NotPositive(f64),
    /// `pageSize` or `maxPages` is 0.
    #[error("audit: {0} is 0: it must be at least 1")]
    Zero(&'static str),
    /// A merge of segments that have not all finished.
    #[error("{0}")]
    Incomplete(String),
    /// A slice of a run that was merged already.
    #[error("audit: run `{0}` was merged already: its conclusion stands; start a new execution (or send a new run) to audit again")]
    RunMerged(String),
    /// A merge of a run merged before with another number of segments.
    #[error("audit: run `{run}` was merged with {merged} segments, not {sent}: start a new execution (or send a new run) to audit again")]
    OtherTotal {
        /// The run.
        run: String,
        /// The segments it was merged with.
        merged: u32,
        /// The segments sent.
        sent: u32,
    },
}

impl AuditRequest {
    /// Checks the request; every check that fails is named.
    pub fn check(&self) -> Result<(), AuditRequestError> {
        // What a Step Functions execution name may hold; never `#` or `/`,
        // which the checkpoint's keys use.
        if crate::control::check_run_name(&self.run).is_err() {
            return Err(AuditRequestError::BadRun(self.run.clone()));
        }
        let total = self.total_segments;
        if total == 0 {
            return Err(AuditRequestError::NoSegments);
        }
        if total > MAX_TOTAL_SEGMENTS {
            return Err(AuditRequestError::TooManySegments(total));
        }
        if self.segment >= total {
            return Err(AuditRequestError::SegmentOutOfRange {
                segment: self.segment,
                total,
            });
        }
        if let Some(value) = self.max_rcu.filter(|v| !(*v > 0.0 && v.is_finite())) {
            return Err(AuditRequestError::NotPositive(value));
        }
        if self.page_size == Some(0) {
            return Err(AuditRequestError::Zero("pageSize"));
        }
        if self.max_pages == Some(0) {
            return Err(AuditRequestError::Zero("maxPages"));
        }
        Ok(())
    }

    fn options(&self, deadline: Instant) -> AuditOptions {
        AuditOptions {
            segments: self.total_segments,
            repair: self.repair == Some(true),
            progress: false,
            page_size: self
                .page_size
                .map_or(AuditOptions::default().page_size, |n| {
                    Some(n.min(i32::MAX as u32) as i32)
                }),
            segment: Some(self.segment),
            max_rcu: self.max_rcu,
            checkpoint: Some(CheckpointStore::Table {
                run: self.run.clone(),
            }),
            max_pages: self.max_pages,
            deadline: Some(deadline),
        }
    }
}

/// The answer to an audit slice: invoke again while `done` is false.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditSliceResponse {
    /// The run.
    pub run: String,
    /// The segment has been read to its end (by this or an earlier slice).
    pub done: bool,
    /// The segment.
    pub segment: u32,
    /// The number of segments.
    pub total_segments: u32,
    /// The table audited.
    pub table: String,
    /// Items of the segment scanned so far.
    pub scanned: u64,
    /// Findings of the segment so far (counters are concluded by the
    /// merge).
    pub findings: u64,
    /// Findings repaired so far.
    pub repaired: usize,
    /// Read capacity the segment consumed so far.
    pub read_units: f64,
    /// Write capacity its repairs consumed so far.
    pub write_units: f64,
}

/// A finding, as the merge's answer shows the first few.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FindingLine {
    /// The projection or invariant.
    pub projection: String,
    /// The problem's kind (`missing`, `stale`, `orphaned`, `off`, ...).
    pub kind: String,
    /// The item or counter.
    pub key: String,
    /// What is wrong.
    pub detail: String,
    /// Repaired by this audit.
    pub repaired: bool,
}

/// Findings of one kind of one projection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FindingCount {
    /// The projection or invariant.
    pub projection: String,
    /// The problem's kind.
    pub kind: String,
    /// How many.
    pub count: usize,
}

/// The first findings the merge's answer lists (all are in the log).
pub const LISTED_FINDINGS: usize = 20;

/// The answer to a merge: the audit's conclusion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditMergeResponse {
    /// The run.
    pub run: String,
    /// The table audited.
    pub table: String,
    /// The number of segments.
    pub total_segments: u32,
    /// Items scanned.
    pub scanned: u64,
    /// No finding.
    pub clean: bool,
    /// Findings in all.
    pub findings: usize,
    /// Findings not repaired (all of them without `repair`).
    pub unrepaired: usize,
    /// Findings by projection and kind.
    pub counts: Vec<FindingCount>,
    /// The first [`LISTED_FINDINGS`] findings.
    pub first: Vec<FindingLine>,
    /// Findings repaired.
    pub repaired: usize,
    /// The first [`LISTED_FINDINGS`] repairs that failed, with the reason.
    pub repair_failures: Vec<String>,
    /// Repairs that failed in all.
    #[serde(default)]
    pub repair_failure_count: usize,
    /// Violations recorded in the violation store.
    pub violations_recorded: usize,
    /// Recorded violations cleared because no segment found them.
    pub violations_cleared: usize,
    /// Read capacity consumed by the slices and the merge.
    pub read_units: f64,
    /// Write capacity consumed by repairs.
    pub write_units: f64,
    /// Counters that looked off but moved while the audit counted them:
    /// not findings; the next audit checks them again (the first
    /// [`LISTED_FINDINGS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved_while_counted: Vec<String>,
    /// The answer was stored by an earlier invocation of this merge.
    #[serde(default)]
    pub already_merged: bool,
}

impl AuditMergeResponse {
    fn new(run: &str, report: &AuditReport) -> AuditMergeResponse {
        let mut counts: Vec<FindingCount> = Vec::new();
        for finding in &report.findings {
            let kind = finding.problem.kind();
            match counts
                .iter_mut()
                .find(|c| c.projection == finding.rule && c.kind == kind)
            {
                Some(count) => count.count += 1,
                None => counts.push(FindingCount {
                    projection: finding.rule.clone(),
                    kind: kind.to_string(),
                    count: 1,
                }),
            }
        }
        AuditMergeResponse {
            run: run.to_string(),
            table: report.table.clone(),
            total_segments: report.total_segments,
            scanned: report.scanned,
            clean: report.findings.is_empty(),
            findings: report.findings.len(),
            unrepaired: report.findings.iter().filter(|f| !f.repaired).count(),
            counts,
            first: report
                .findings
                .iter()
                .take(LISTED_FINDINGS)
                .map(line)
                .collect(),
            repaired: report.repaired,
            repair_failures: report
                .repair_failures
                .iter()
                .take(LISTED_FINDINGS)
                .map(|failure| short(failure.clone()))
                .collect(),
            repair_failure_count: report.repair_failures.len(),
            violations_recorded: report.violations_recorded,
            violations_cleared: report.violations_cleared,
            read_units: report.read_units,
            write_units: report.write_units,
            moved_while_counted: report
                .moved_while_counted
                .iter()
                .take(LISTED_FINDINGS)
                .map(|key| short(key.clone()))
                .collect(),
            already_merged: false,
        }
    }
}

/// The longest detail the merge's answer shows (all of it is in the log):
/// the answer is the execution's output, at most 256 KB.
const ANSWER_DETAIL: usize = 1_000;

fn short(mut text: String) -> String {
    checkpoint::truncate(&mut text, ANSWER_DETAIL);
    text
}

impl From<&crate::audit::Finding> for FindingLine {
    fn from(finding: &crate::audit::Finding) -> FindingLine {
        FindingLine {
            projection: finding.rule.clone(),
            kind: finding.problem.kind().to_string(),
            key: finding.key.clone(),
            detail: finding.detail.clone(),
            repaired: finding.repaired,
        }
    }
}

/// A finding as the answer lists it, its key and detail cut short.
fn line(finding: &crate::audit::Finding) -> FindingLine {
    let line = FindingLine::from(finding);
    FindingLine {
        key: short(line.key),
        detail: short(line.detail),
        ..line
    }
}

/// One `audit finding` log line.
fn log_finding(request_id: &str, run: &str, finding: &FindingLine) {
    tracing::warn!(
        request_id,
        run,
        projection = finding.projection,
        kind = finding.kind,
        key = finding.key,
        detail = finding.detail,
        repaired = finding.repaired,
        "audit finding"
    );
}

/// A merge's answer when the table must be counted again first: run
/// every segment's slices with this `pass`, then merge again.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditPassResponse {
    /// The run.
    pub run: String,
    /// The counting pass to run.
    pub pass: u32,
    /// What it counts: `locate` (the counters the sketch found wrong) or
    /// `recount` (the shards a repair sets).
    pub purpose: String,
    /// The number of segments.
    pub total_segments: u32,
}

/// What an audit invocation answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AuditResponse {
    /// A slice of a segment.
    Slice(AuditSliceResponse),
    /// The merge, once concluded.
    Merge(Box<AuditMergeResponse>),
    /// The merge, asking for a counting pass first.
    Pass(AuditPassResponse),
}

impl Handler {
    /// Runs one audit slice, or the merge, before the invocation's deadline.
    pub(super) async fn audit(
        &self,
        request: AuditRequest,
        context: &Context,
    ) -> Result<AuditResponse, InvocationError> {
        let started = Instant::now();
        request.check()?;
        let (table, file_spec) = self.payload_table(request.table.as_deref()).await?;
        let spec = crate::control::current_layout(&self.client, &table, &file_spec).await?;
        let (deadlines, config) = self.budget(context, started);
        if deadlines.stop_writes <= started {
            return Err(InvocationError::AuditNoTime {
                run: request.run.clone(),
                margin_ms: self.margin.as_millis() as u64,
            });
        }
        let applier = crate::control::applier(self.client.clone(), spec, &table, config);
        if request.merge == Some(true) {
            let merge = self.merge_run(&applier, &request, context);
            return match tokio::time::timeout_at(deadlines.abandon, merge).await {
                Ok(result) => result,
                Err(_) => Err(InvocationError::AuditAbandoned {
                    what: format!("the merge of run `{}`", request.run),
                }),
            };
        }
        let (segment, total) = (request.segment, request.total_segments);
        if checkpoint::get(&applier, checkpoint::merged_sk(&request.run))
            .await?
            .is_some()
        {
            return Err(AuditRequestError::RunMerged(request.run.clone()).into());
        }
        if let Some(pass) = request.pass.filter(|&p| p > 0) {
            let options = request.options(deadlines.stop_writes);
            let slice =
                crate::audit::passes::count_slice(&applier, &request.run, pass, segment, &options);
            let counted = match tokio::time::timeout_at(deadlines.abandon, slice).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(InvocationError::AuditAbandoned {
                        what: format!(
                            "segment {segment} of {total} of run `{}`, pass {pass}",
                            request.run
                        ),
                    })
                }
            };
            tracing::info!(
                request_id = %context.request_id,
                table,
                run = request.run,
                pass,
                segment,
                total_segments = total,
                done = counted.done,
                scanned = counted.scanned,
                overtaken = counted.overtaken,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "audit counting slice done"
            );
            return Ok(AuditResponse::Slice(AuditSliceResponse {
                run: request.run.clone(),
                done: counted.done,
                segment,
                total_segments: total,
                table,
                scanned: counted.scanned,
                findings: 0,
                repaired: 0,
                read_units: counted.read_units,
                write_units: 0.0,
            }));
        }
        tracing::info!(
            request_id = %context.request_id,
            table,
            run = request.run,
            segment,
            total_segments = total,
            repair = request.repair == Some(true),
            "audit slice started"
        );
        let options = request.options(deadlines.stop_writes);
        let slice = checkpoint::audit_segment_from(&applier, &options, segment, {
            options
                .checkpoint
                .as_ref()
                .expect("an audit slice is checkpointed")
        });
        let checkpoint::Slice {
            report,
            found,
            scanned_now,
            overtaken,
        } = match tokio::time::timeout_at(deadlines.abandon, slice).await {
            Ok(result) => result?,
            Err(_) => {
                // The page in flight is not checkpointed; the next slice
                // checks it again.
                return Err(InvocationError::AuditAbandoned {
                    what: format!("segment {segment} of {total} of run `{}`", request.run),
                });
            }
        };
        crate::audit::finished(applier.spec(), &report, scanned_now);
        let response = AuditSliceResponse {
            run: request.run.clone(),
            done: report.complete,
            segment,
            total_segments: total,
            table: table.clone(),
            scanned: report.scanned,
            findings: found,
            repaired: report.repaired,
            read_units: report.read_units,
            write_units: report.write_units,
        };
        tracing::info!(
            request_id = %context.request_id,
            table,
            run = request.run,
            segment,
            total_segments = total,
            done = response.done,
            scanned = response.scanned,
            findings = response.findings,
            overtaken,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "audit slice done"
        );
        Ok(AuditResponse::Slice(response))
    }

    /// Merges the run's segments (or answers the merge stored before).
    async fn merge_run(
        &self,
        applier: &Applier,
        request: &AuditRequest,
        context: &Context,
    ) -> Result<AuditResponse, InvocationError> {
        let run = &request.run;
        let total = request.total_segments;
        if let Some((response, logged)) = stored_summary(applier, run, total).await? {
            // A merge retried after it stored its conclusion: what it had
            // not deleted yet goes now. If it was cut off before it logged
            // and counted, the summary is logged and counted now.
            if !logged {
                log_summary(applier, &response, context).await?;
            }
            checkpoint::delete_rest(applier, run, total).await?;
            passes::delete_rest(applier, run, total).await?;
            checkpoint::sweep(applier, run).await?;
            tracing::info!(request_id = %context.request_id, run, "audit merged before: answering its summary");
            return Ok(AuditResponse::Merge(Box::new(response)));
        }
        let repair = request.repair == Some(true);
        let (report, stored) = match passes::merge_step(applier, run, total, repair).await? {
            Step::Merged(report, stored) => (*report, stored),
            Step::Incomplete(why) => return Err(AuditRequestError::Incomplete(why).into()),
            Step::Pass { pass, purpose } => {
                tracing::info!(
                    request_id = %context.request_id,
                    run,
                    pass,
                    purpose,
                    total_segments = total,
                    "audit merge needs a counting pass over every segment first"
                );
                return Ok(AuditResponse::Pass(AuditPassResponse {
                    run: run.clone(),
                    pass,
                    purpose: purpose.to_string(),
                    total_segments: total,
                }));
            }
        };
        let response = AuditMergeResponse::new(run, &report);
        let summary = serde_json::to_string(&response).unwrap_or_default();
        // Stored before anything is logged or counted, and only once: a
        // merge running twice at once logs and counts in one of them.
        let first = checkpoint::put(
            applier,
            checkpoint::merged_sk(run),
            vec![
                ("summary", Av::S(summary)),
                ("totalSegments", Av::N(total.to_string())),
                ("logged", Av::Bool(false)),
            ],
            Some(None),
        )
        .await?;
        if !first {
            if let Some((response, _)) = stored_summary(applier, run, total).await? {
                return Ok(AuditResponse::Merge(Box::new(response)));
            }
        }
        crate::audit::finished(applier.spec(), &report, 0);
        for finding in &report.findings {
            log_finding(&context.request_id, run, &FindingLine::from(finding));
        }
        let outcome = if response.clean { "clean" } else { "findings" };
        metrics::counter!("projector_audit_runs_total", "outcome" => outcome).increment(1);
        checkpoint::set_logged(applier, run).await?;
        checkpoint::delete(applier, &stored).await?;
        let swept = checkpoint::sweep(applier, run).await?;
        tracing::info!(
            request_id = %context.request_id,
            table = applier.table(),
            run,
            total_segments = total,
            scanned = response.scanned,
            findings = response.findings,
            unrepaired = response.unrepaired,
            repaired = response.repaired,
            outcome,
            swept,
            moved_while_counted = report.moved_while_counted.len(),
            "audit merged"
        );
        Ok(AuditResponse::Merge(Box::new(response)))
    }
}

/// The summary a merge of `run` stored, if one did, and whether it was
/// logged and counted; refused when it was merged with another number of
/// segments.
async fn stored_summary(
    applier: &Applier,
    run: &str,
    total: u32,
) -> Result<Option<(AuditMergeResponse, bool)>, InvocationError> {
    let Some(item) = checkpoint::get(applier, checkpoint::merged_sk(run)).await? else {
        return Ok(None);
    };
    let stored = item
        .get("summary")
        .and_then(|v| v.as_s().ok())
        .and_then(|text| serde_json::from_str::<AuditMergeResponse>(text).ok());
    let Some(mut response) = stored else {
        return Err(InvocationError::Apply(crate::apply::ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!(
                "the audit item `{}` holds no merge summary",
                checkpoint::merged_sk(run)
            ),
        }));
    };
    if response.total_segments != total {
        return Err(AuditRequestError::OtherTotal {
            run: run.to_string(),
            merged: response.total_segments,
            sent: total,
        }
        .into());
    }
    response.already_merged = true;
    // A summary stored before `logged` existed was logged.
    let logged = !matches!(item.get("logged"), Some(Av::Bool(false)));
    Ok(Some((response, logged)))
}

/// Logs and counts a stored summary whose merge was cut off before it
/// did: its counts by projection and kind, and the findings it lists (the
/// others were in the merge that was cut off).
async fn log_summary(
    applier: &Applier,
    response: &AuditMergeResponse,
    context: &Context,
) -> Result<(), InvocationError> {
    for count in &response.counts {
        metrics::counter!(
            "projector_audit_findings_total",
            "projection" => count.projection.clone(),
            "service" => applier.spec().service_of(&count.projection).to_string(),
            "kind" => count.kind.clone()
        )
        .increment(count.count as u64);
    }
    for finding in &response.first {
        log_finding(&context.request_id, &response.run, finding);
    }
    if response.findings > response.first.len() {
        tracing::warn!(
            request_id = %context.request_id,
            run = response.run,
            findings = response.findings,
            listed = response.first.len(),
            "audit findings: the merge that found them was cut off before it logged them; the summary lists the first, run the audit again to log them all"
        );
    }
    let outcome = if response.clean { "clean" } else { "findings" };
    metrics::counter!("projector_audit_runs_total", "outcome" => outcome).increment(1);
    checkpoint::set_logged(applier, &response.run).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: serde_json::Value) -> AuditRequest {
        serde_json::from_value(json).expect("an audit request")
    }

    #[test]
    fn defaults_are_one_whole_segment_at_pages_of_a_thousand() {
        let request = request(serde_json::json!({ "run": "r" }));
        request.check().unwrap();
        let options = request.options(Instant::now());
        assert_eq!((options.segment, options.segments), (Some(0), 1));
        assert_eq!(options.page_size, Some(1000));
        assert!(!options.repair);
        assert_eq!(
            options.checkpoint,
            Some(CheckpointStore::Table {
                run: "r".to_string()
            })
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let error = |json: serde_json::Value| request(json).check().unwrap_err().to_string();
        for run in ["", "a#b", "a/b", "has space", &"x".repeat(81)] {
            let message = error(serde_json::json!({ "run": run }));
            assert!(message.contains("is not a name"), "{run}: {message}");
        }
        let message = error(serde_json::json!({ "run": "r", "segment": 4, "totalSegments": 4 }));
        assert_eq!(
            message,
            "audit: segment 4 is out of range for totalSegments 4 (segments count from 0 to 3)"
        );
        let message = error(serde_json::json!({ "run": "r", "totalSegments": 0 }));
        assert!(message.contains("totalSegments is 0"), "{message}");
        let message = error(serde_json::json!({ "run": "r", "maxRcu": -1 }));
        assert!(message.contains("maxRcu is -1"), "{message}");
        let message = error(serde_json::json!({ "run": "r", "pageSize": 0 }));
        assert!(message.contains("pageSize is 0"), "{message}");
        let message = error(serde_json::json!({ "run": "r", "maxPages": 0 }));
        assert!(message.contains("maxPages is 0"), "{message}");
        let missing = serde_json::from_value::<AuditRequest>(serde_json::json!({ "segment": 1 }))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("missing field `run`"), "{missing}");
    }

    #[test]
    fn a_stored_summary_reads_back() {
        let report = AuditReport {
            table: "T".to_string(),
            total_segments: 2,
            scanned: 10,
            ..AuditReport::default()
        };
        let response = AuditMergeResponse::new("r", &report);
        assert!(response.clean);
        let text = serde_json::to_string(&response).unwrap();
        let back: AuditMergeResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(back, response);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["totalSegments"], 2);
        assert_eq!(value["alreadyMerged"], false);
    }
}
