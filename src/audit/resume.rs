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

use super::checkpoint::{self, CheckpointStore};
use super::passes::{self, Step};
use super::scan::Progress;
use super::{AuditOptions, AuditReport};
use crate::apply::{Applier, ApplyError};

/// Audits `applier`'s table under `run`, from where the run stands.
pub async fn audit_run(
    applier: &Applier,
    options: &AuditOptions,
    run: &str,
) -> Result<AuditReport, ApplyError> {
    let total = options.segments.max(1);
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
                // What the run kept is not needed once merged: a crash
                // before it is deleted merges again, to the same report.
                checkpoint::delete(applier, &stored).await?;
                passes::delete_rest(applier, run, total).await?;
                checkpoint::sweep(applier, run).await?;
                super::finished(applier.spec(), &report, 0);
                return Ok(*report);
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
                    message: why,
                })
            }
        }
    }
}

/// One segment of `run`, to its end; its report with the findings its
/// pages stored, then its items deleted (the report is the record now).
async fn audit_one(
    applier: &Applier,
    options: &AuditOptions,
    store: &CheckpointStore,
    run: &str,
    segment: u32,
    total: u32,
) -> Result<AuditReport, ApplyError> {
    let slice = checkpoint::audit_segment_from(applier, options, segment, store).await?;
    super::finished(applier.spec(), &slice.report, slice.scanned_now);
    if !slice.report.complete {
        return Ok(slice.report);
    }
    let report = checkpoint::load_segment(applier, run, segment, total)
        .await?
        .unwrap_or(slice.report);
    checkpoint::delete_segment(applier, store, run, segment, total).await?;
    Ok(report)
}
