//! `audit` and `violations list`.

use super::Outcome;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use super::{connect, OutputFormat, Resume, Target};
use crate::apply::Applier;
use crate::audit::{audit as run_audit, merge as merge_reports, AuditOptions, AuditReport};
use crate::spec::Spec;

/// `audit`: exit 0 when clean, 1 when anything was found, 2 on error.
pub async fn audit(
    target: Target,
    format: OutputFormat,
    options: AuditOptions,
    resume: Resume,
) -> anyhow::Result<Outcome> {
    // An audit that keeps its progress writes to the table: in a global
    // table's home region only, as a repair.
    let writes = match (options.repair, resume.asked()) {
        (true, _) => Some("audit --repair"),
        (false, true) => Some("audit --run"),
        (false, false) => None,
    };
    let Some(applier) = applier(&target, writes).await? else {
        return Ok(Outcome::Failed);
    };
    if !resume.asked() {
        let report = run_audit(&applier, &options).await?;
        return print(&report, applier.spec(), format);
    }
    // Kept in the table: a run of its own per table and scan (and segment).
    let total = options.segments.max(1);
    if let Some(segment) = options.segment.filter(|&s| s >= total) {
        anyhow::bail!(
            "--segment {segment} is out of range for --total-segments {total} (segments count from 0)"
        );
    }
    let scope = match options.segment {
        Some(segment) => format!("{}#{segment}/{total}", applier.table()),
        None => format!("{}#all/{total}", applier.table()),
    };
    let run = resume
        .start(
            applier.client(),
            applier.table(),
            &applier.spec().table,
            crate::control::Job::Audit,
            scope,
        )
        .await?;
    let (report, finished) = crate::audit::audit_run(&applier, &options, &run.chosen.run).await?;
    // The report out first; then the run is done and its items go (a
    // failure now loses nothing: the report is printed).
    let outcome = print(&report, applier.spec(), format)?;
    if let Some(finished) = finished {
        if let Err(error) = run.finish().await {
            tracing::warn!(%error, run = run.chosen.run, "the audit's run could not be recorded as done: --resume would merge it again");
        }
        if let Err(error) = crate::audit::forget_run(&applier, finished).await {
            tracing::warn!(%error, run = run.chosen.run, "the audit's items in the table were not all deleted");
        }
    }
    Ok(outcome)
}

/// `audit-merge`: as `audit`, for the segments' reports together.
pub async fn merge(
    target: Target,
    format: OutputFormat,
    repair: bool,
    max_rcu: Option<f64>,
    paths: Vec<PathBuf>,
) -> anyhow::Result<Outcome> {
    let mut reports = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the report {}", path.display()))?;
        let report: AuditReport = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a segment report of `audit --format json`",
                path.display()
            )
        })?;
        reports.push(report);
    }
    let Some(applier) = applier(&target, repair.then_some("audit-merge --repair")).await? else {
        return Ok(Outcome::Failed);
    };
    let report = merge_reports(&applier, reports, repair, max_rcu).await?;
    print(&report, applier.spec(), format)
}

/// The applier of `target`'s spec and table; `None` when the spec has
/// errors (printed already). `writes`: the command, when it writes
/// derived state (it runs in a global table's home region only).
async fn applier(target: &Target, writes: Option<&str>) -> anyhow::Result<Option<Applier>> {
    let c = match connect(target).await {
        Ok(c) => c,
        // The spec's errors are printed already; any error is exit 2 here.
        Err(Ok(_)) => return Ok(None),
        Err(Err(error)) => return Err(error),
    };
    match writes {
        Some(verb) => crate::global::require_home(&c, &target.deployment(), verb).await?,
        None => {
            crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
        }
    }
    Ok(Some(c.applier()))
}

/// Prints an audit's report; clean is done, anything found is found.
pub(super) fn print(
    report: &AuditReport,
    spec: &Spec,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        OutputFormat::Text => write!(out, "{}", report.to_text(spec))?,
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(report)?)?,
    }
    Ok(if report.is_clean() {
        Outcome::Done
    } else {
        Outcome::Found
    })
}

/// `violations list`: what the online check recorded. Exit 1 when any.
pub async fn violations_list(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    let applier = c.applier();
    let violations = applier.recorded_violations().await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for v in &violations {
        match format {
            OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(v)?)?,
            OutputFormat::Text => {
                writeln!(
                    out,
                    "{} ({}) {}: {}",
                    v.invariant, v.kind, v.scope, v.message
                )?;
                writeln!(
                    out,
                    "  since {} (last seen {}), revealed by {}",
                    v.since,
                    v.last_seen,
                    if v.revealed_by.is_empty() {
                        "audit".to_string()
                    } else {
                        v.revealed_by
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    }
                )?;
            }
        }
    }
    eprintln!("{} recorded violations in {}", violations.len(), c.table);
    Ok(if violations.is_empty() {
        Outcome::Done
    } else {
        Outcome::Found
    })
}
