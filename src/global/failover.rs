//! `failover --to REGION`: this region becomes the home region of a
//! global table whose home was lost (see `docs/global-tables.md`): the
//! home recorded, its whole retained stream replayed, the dead letters
//! redriven, then `audit --repair` and an audit.

use super::{require_home, role, run_stream, Deployment, Ran, RunFailed};
use crate::apply::RedriveSummary;
use crate::audit::{AuditOptions, AuditReport};
use crate::control::Connection;
use crate::source::RunOptions;
use crate::spec::Spec;

/// A step of a failover, for the caller to show as it goes.
pub enum Step<'a> {
    /// A line of progress.
    Note(String),
    /// The replay ended (or failed: see [`Ran::how`]).
    Replayed(&'a Ran),
    /// An audit's report: the repair's, then the last audit's.
    Audited(&'a AuditReport, &'a Spec),
}

/// What a failover did.
#[derive(Debug)]
pub struct Failover {
    /// The dead letters redriven after the replay.
    pub redriven: RedriveSummary,
    /// The last audit's report: clean, or findings left (run `audit
    /// --repair` again).
    pub audit: AuditReport,
}

/// Makes `to`, the region `c` runs in, the home region of `c`'s global
/// table; `replay`: how to replay its stream (`RunOptions::replay`, with
/// the caller's batch limit); `segments`: the audits' parallel scan
/// segments. Refuses (an
/// error) another region, or a table of one region, before writing.
pub async fn failover(
    c: &Connection,
    deployment: &Deployment,
    to: &str,
    replay: RunOptions,
    segments: u32,
    step: &mut dyn FnMut(Step<'_>),
) -> anyhow::Result<Failover> {
    let region = c.region();
    if region != to {
        anyhow::bail!(
            "`failover --to {to}` runs in {to}, the new home region (this runs in {}): it replays \
             {to}'s stream and repairs {to}'s replica. Set AWS_REGION={to}",
            if region.is_empty() {
                "no region"
            } else {
                &region
            }
        );
    }
    let info = crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    if info.replicas.is_empty() {
        anyhow::bail!(
            "table `{}` is not a global table (DescribeTable lists no replicas): there is no other \
             region to take over from; nothing done",
            c.table
        );
    }
    let deployment = Deployment {
        home_region: Some(to.to_string()),
        ..deployment.clone()
    };
    // The same checks as any worker there (strong consistency, writes
    // onto writers' items), with `to` as the home whatever the table
    // records (an earlier failover's home, maybe gone).
    role(&info, &c.spec, &region, Some(to), deployment.writers)?;
    // Recorded first: replicated back to the old home, it makes that
    // region's workers stand down.
    c.registry().record_home(to).await?;
    step(Step::Note(format!(
        "{to} becomes the home region of {}; 1/4: replaying {to}'s stream from its oldest record",
        c.table
    )));
    match run_stream(c, &deployment, replay, "failover (replay)").await {
        Ok(ran) => step(Step::Replayed(&ran)),
        Err(RunFailed { ran, error }) => {
            if let Some(ran) = &ran {
                step(Step::Replayed(ran));
            }
            return Err(error);
        }
    }
    // Letters of both streams (the old home's, replicated, and the
    // replay's), each item ending at its current state.
    step(Step::Note("2/4: redriving the dead letters".to_string()));
    let redriven = c.applier().redrive(None).await?;
    step(Step::Note(format!(
        "redriven {}, superseded {}, still failing {} (see `dlq list`)",
        redriven.redriven, redriven.superseded, redriven.still_failing
    )));
    step(Step::Note(
        "3/4: audit --repair (counters moved by transactions that replicated in part)".to_string(),
    ));
    let options = AuditOptions {
        segments: segments.max(1),
        progress: true,
        ..AuditOptions::default()
    };
    // Findings here are found and repaired.
    let laid = c.laid_out_again().await?;
    require_home(&laid, &deployment, "audit --repair").await?;
    let repair = AuditOptions {
        repair: true,
        ..options.clone()
    };
    let applier = laid.applier();
    let repaired = crate::audit::audit(&applier, &repair).await?;
    step(Step::Audited(&repaired, applier.spec()));
    step(Step::Note("4/4: audit (exit 0: clean)".to_string()));
    let laid = c.laid_out_again().await?;
    crate::dynamo::client::describe_table(&laid.dynamodb, &laid.table).await?;
    let applier = laid.applier();
    let audit = crate::audit::audit(&applier, &options).await?;
    step(Step::Audited(&audit, applier.spec()));
    Ok(Failover { redriven, audit })
}
