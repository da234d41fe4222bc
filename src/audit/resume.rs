//! `audit --run NAME` and `audit --resume`: an audit whose progress is
//! kept in the table (see [`super::checkpoint`]), so that one stopped
//! anywhere (a crash, a kill, Ctrl-C) continues at the next page of each
//! segment, redoing at most one.
//!
//! The whole table is audited here as the Step Functions audit runs it
//! ([`crate::lambda`]'s audit slices), in one process: every segment side
//! by side to its end, then the merge, which may ask for a counting pass
//! over every segment first, then the merge again. Its report is the one
//! [`super::audit`] answers. With `segment`, only that segment is audited
//! (another machine audits the others), and its report, findings read
//! back from the table, is what `audit-merge` takes.
//!
//! A run's items are deleted only by [`forget_run`], which the caller
//! calls once the report is out: a crash before leaves the run to be
//! merged again, to the same report, never a report lost with its
//! findings.
//!
//! The items of a run are stored under [`storage_run`]: the run's name
//! and the scan it is (the whole table in `N` segments, or segment `I` of
//! `N`), so one name used for two scans never mixes their items.

use super::checkpoint::{self, CheckpointStore};
use super::passes::{self, Step};
use super::scan::Progress;
use super::{AuditOptions, AuditReport};
use crate::apply::{Applier, ApplyError};

/// Where run `run` of the scan `options` asks for keeps its items.
pub fn storage_run(run: &str, options: &AuditOptions) -> String {
    let total = options.segments.max(1);
    match options.segment {
        Some(segment) => format!("{run}@{segment}of{total}"),
        None => format!("{run}@all{total}"),
    }
}

/// What a finished run leaves to delete once its report is out.
#[derive(Debug)]
pub struct Finished {
    run: String,
    segment: Option<u32>,
    total: u32,
    stored: Vec<crate::record::ItemKey>,
}

/// Deletes what `finished` names: the run's segments, pages and passes.
pub async fn forget_run(applier: &Applier, finished: Finished) -> Result<(), ApplyError> {
    let Finished {
        run,
        segment,
        total,
        stored,
    } = finished;
    match segment {
        Some(segment) => {
            let store = CheckpointStore::Table { run: run.clone() };
            checkpoint::delete_segment(applier, &store, &run, segment, total).await
        }
        None => {
            checkpoint::delete(applier, &stored).await?;
            passes::delete_rest(applier, &run, total).await?;
            checkpoint::sweep(applier, &run).await?;
            Ok(())
        }
    }
}

/// Audits `applier`'s table under `run`, from where the run stands: the
/// report, and (once complete) what to delete after it is out.
pub async fn audit_run(
    applier: &Applier,
    options: &AuditOptions,
    run: &str,
) -> Result<(AuditReport, Option<Finished>), ApplyError> {
    let run = &storage_run(run, options);
    let total = options.segments.max(1);
    if let Some(segment) = options.segment.filter(|&s| s >= total) {
        return Err(ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!(
                "segment {segment} is not one of the {total} segments (0 to {})",
                total - 1
            ),
        });
    }
    let store = CheckpointStore::Table {
        run: run.to_string(),
    };
    let options = AuditOptions {
        segments: total,
        checkpoint: Some(store.clone()),
        ..options.clone()
    };
    if let Some(segment) = options.segment {
        return audit_one(applier, &options, &store, run, segment, total).await;
    }
    let estimate = crate::backfill::estimate_items(applier).await;
    let mut pass = 0;
    loop {
        let progress = Progress::new(options.progress && pass == 0, estimate);
        let segments = (0..total).map(|segment| {
            let options = AuditOptions {
                segment: Some(segment),
                ..options.clone()
            };
            let (store, progress) = (&store, &progress);
            async move {
                if pass == 0 {
                    let slice = checkpoint::audit_segment_shown(
                        applier,
                        &options,
                        segment,
                        store,
                        Some(progress),
                    )
                    .await?;
                    super::finished(applier.spec(), &slice.report, slice.scanned_now);
                } else {
                    passes::count_slice(applier, run, pass, segment, &options).await?;
                }
                Ok::<(), ApplyError>(())
            }
        });
        let done = futures::future::try_join_all(segments).await;
        progress.finish();
        done?;
        match passes::merge_step(applier, run, total, options.repair).await? {
            Step::Merged(report, stored) => {
                super::finished(applier.spec(), &report, 0);
                let finished = Finished {
                    run: run.clone(),
                    segment: None,
                    total,
                    stored,
                };
                return Ok((*report, Some(finished)));
            }
            Step::Pass {
                pass: next,
                purpose,
            } => {
                tracing::info!(
                    run,
                    pass = next,
                    purpose,
                    "audit: the merge needs a counting pass over every segment"
                );
                pass = next;
            }
            Step::Incomplete(why) => {
                return Err(ApplyError::Fatal {
                    table: applier.table().to_string(),
                    message: format!(
                        "{why} (a segment another process audits under the same run saved ahead of this one: run the audit again once it stops)"
                    ),
                })
            }
        }
    }
}

/// One segment of `run`, to its end; its report with the findings its
/// pages stored, and its items to delete once the report is out.
async fn audit_one(
    applier: &Applier,
    options: &AuditOptions,
    store: &CheckpointStore,
    run: &str,
    segment: u32,
    total: u32,
) -> Result<(AuditReport, Option<Finished>), ApplyError> {
    let slice = checkpoint::audit_segment_from(applier, options, segment, store).await?;
    super::finished(applier.spec(), &slice.report, slice.scanned_now);
    if !slice.report.complete {
        // Another process saved the segment ahead of this one: its report
        // is not this one's to give.
        return Err(ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!(
                "segment {segment} of {total} is being audited by another process under the same run, ahead of this one: run this again once it stops"
            ),
        });
    }
    let report = checkpoint::load_segment(applier, run, segment, total)
        .await?
        .unwrap_or(slice.report);
    let finished = Finished {
        run: run.to_string(),
        segment: Some(segment),
        total,
        stored: Vec::new(),
    };
    Ok((report, Some(finished)))
}
