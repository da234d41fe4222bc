//! `audit` and `violations list`.

use std::io::Write;
use std::process::ExitCode;

use super::{connect, OutputFormat, Target};
use crate::apply::{Applier, ApplyConfig};
use crate::audit::{audit as run_audit, AuditOptions};

/// `audit`: exit 0 when clean, 1 when anything was found, 2 on error.
pub async fn audit(
    target: Target,
    format: OutputFormat,
    repair: bool,
    segments: u32,
) -> anyhow::Result<ExitCode> {
    let c = match connect(&target).await {
        Ok(c) => c,
        // The spec's errors are printed already; any error is exit 2 here.
        Err(Ok(_)) => return Ok(ExitCode::from(2)),
        Err(Err(error)) => return Err(error),
    };
    crate::aws::describe_table(&c.dynamodb, &c.table).await?;
    let applier = Applier::new(
        c.dynamodb.clone(),
        c.spec.clone(),
        &c.table,
        ApplyConfig::default(),
    );
    let report = run_audit(
        &applier,
        &AuditOptions {
            segments: segments.max(1),
            repair,
            progress: true,
            page_size: None,
        },
    )
    .await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        OutputFormat::Text => write!(out, "{}", report.to_text(&c.spec))?,
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `violations list`: what the online check recorded. Exit 1 when any.
pub async fn violations_list(target: Target, format: OutputFormat) -> anyhow::Result<ExitCode> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    let applier = Applier::new(
        c.dynamodb.clone(),
        c.spec.clone(),
        &c.table,
        ApplyConfig::default(),
    );
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
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
