//! The lifecycle commands: `status`, and `backfill` (which claims what it
//! backfills in the lifecycle registry and records it once complete).

use super::Outcome;
use std::io::Write;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use super::{connect, OutputFormat, Target};
use crate::control::Commands;

/// How `status` writes the commands it suggests for this target.
pub(super) fn commands(target: &Target) -> Commands {
    let mut line = target.args();
    if let Some(consumer) = &target.consumer {
        line.push_str(&format!(" --consumer {consumer}"));
    }
    Commands {
        target: line,
        consumer: target.consumer.clone(),
        registered: target.spec.is_none(),
    }
}

/// `status`: exit 0 when every projection is live, 1 otherwise.
pub async fn status(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    let report = crate::control::status(&c, &commands(&target)).await?;
    let (rows, whole, by_invariant) = (
        &report.rows,
        report.whole_record_letters,
        &report.violations,
    );
    let live = report.live();
    let all_live = report.all_live();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        OutputFormat::Json => {
            let value = json!({
                "table": c.table,
                "spec": target.source(),
                "service": c.spec.service,
                "consumer": target.consumer,
                "projections": rows,
                "wholeRecordDeadLetters": whole,
                "violations": by_invariant,
                "allLive": all_live,
            });
            writeln!(out, "{value}")?;
        }
        OutputFormat::Text => {
            writeln!(
                out,
                "table {}, spec {} (service {}{})",
                c.table,
                target.source(),
                c.spec.service,
                target
                    .consumer
                    .as_deref()
                    .map(|name| format!(", consumer {name}"))
                    .unwrap_or_default()
            )?;
            let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(10);
            let service_width = rows
                .iter()
                .map(|r| r.service.len())
                .max()
                .unwrap_or(0)
                .max(7);
            writeln!(
                out,
                "  {:width$}  {:service_width$}  {:12}  {:11}  {:24}  {:>7}  {:24}  {:>8}  next",
                "projection",
                "service",
                "kind",
                "state",
                "since",
                "letters",
                "last change applied",
                "lag"
            )?;
            for row in rows {
                let (last, lag) = match row.applied {
                    Some(applied) => (
                        crate::control::iso(applied.change_ms.max(0) as u64),
                        format!("{:.1} s", applied.lag_ms() as f64 / 1000.0),
                    ),
                    None => ("-".to_string(), "-".to_string()),
                };
                writeln!(
                    out,
                    "  {:width$}  {:service_width$}  {:12}  {:11}  {:24}  {:>7}  {:24}  {:>8}  {}",
                    row.name,
                    if row.service.is_empty() {
                        "-"
                    } else {
                        &row.service
                    },
                    row.kind,
                    row.state.as_str(),
                    row.since.as_deref().unwrap_or("-"),
                    row.dead_letters,
                    last,
                    lag,
                    row.next.as_deref().unwrap_or("-"),
                )?;
                if let Some(note) = &row.note {
                    writeln!(out, "  {:width$}  {note}", "")?;
                }
            }
            if whole > 0 {
                writeln!(
                    out,
                    "  {whole} dead letters of whole records (undecodable): `ddb-projector dlq list`"
                )?;
            }
            for (invariant, n) in by_invariant {
                writeln!(out, "  invariant {invariant}: {n} recorded violations")?;
            }
            writeln!(
                out,
                "{live} of {} projections live{}",
                rows.len(),
                if all_live {
                    ""
                } else {
                    ": run what `next` says"
                }
            )?;
        }
    }
    Ok(if all_live {
        Outcome::Done
    } else {
        Outcome::Found
    })
}

/// `backfill`'s flags.
#[derive(clap::Args, Debug)]
pub struct BackfillArgs {
    /// Only these projections (repeatable; default: those `status` says
    /// are not live).
    #[arg(long = "projection")]
    pub projections: Vec<String>,
    /// Every projection of the spec, live ones too.
    #[arg(long, conflicts_with = "projections")]
    pub all: bool,
    /// Name this backfill: every machine running a segment of it passes
    /// the same name (default: a new name; with --resume, the backfill
    /// under way).
    #[arg(long)]
    pub run: Option<String>,
    /// How long to wait for writers of another definition to stop
    /// before claiming the projections (e.g. `20m`, `90s`).
    #[arg(long, default_value = "20m", value_parser = super::parse_duration)]
    pub wait: Duration,
    /// Scan segments to run in parallel in this process.
    #[arg(long, default_value_t = 4)]
    pub segments: u32,
    /// Run only this segment (of --total-segments), e.g. one per machine.
    #[arg(long, requires = "total_segments")]
    pub segment: Option<u32>,
    /// The total number of segments when --segment is given.
    #[arg(long)]
    pub total_segments: Option<u32>,
    /// Consumed write capacity units per second to stay under.
    #[arg(long)]
    pub max_wcu: Option<f64>,
    /// Consumed read capacity units per second to stay under.
    #[arg(long)]
    pub max_rcu: Option<f64>,
    /// Continue an interrupted run from its checkpoints.
    #[arg(long)]
    pub resume: bool,
    /// Count what would change without writing.
    #[arg(long)]
    pub dry_run: bool,
}

impl BackfillArgs {
    /// The request, built before any I/O: a segment out of range, or one
    /// without `--run`, is refused here.
    pub fn request(self) -> anyhow::Result<crate::backfill::Request> {
        let (segments, total_segments) = match (self.segment, self.total_segments) {
            (Some(segment), Some(total)) => {
                if segment >= total {
                    bail!("--segment {segment} is out of range for --total-segments {total} (segments count from 0)");
                }
                (vec![segment], total)
            }
            _ => {
                let n = self.segments.clamp(1, 1_000_000);
                ((0..n).collect(), n)
            }
        };
        if self.segment.is_some() && self.run.is_none() && !self.dry_run {
            bail!("--segment needs --run NAME: the same name on every machine, so that the segments make one backfill (its projections are recorded once every segment is done)");
        }
        Ok(crate::backfill::Request {
            projections: self.projections,
            all: self.all,
            run: self.run,
            wait: self.wait,
            segments,
            total_segments,
            max_wcu: self.max_wcu,
            max_rcu: self.max_rcu,
            resume: self.resume,
            dry_run: self.dry_run,
        })
    }
}

/// `backfill` (see [`crate::backfill::lifecycle`]).
pub async fn backfill(
    target: Target,
    args: crate::backfill::Request,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    if args.dry_run {
        crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    } else {
        crate::global::require_home(&c, &target.deployment(), "backfill").await?;
    }
    let done = crate::backfill::lifecycle(&c, &args, &commands(&target), &mut |note| {
        eprintln!("{note}")
    })
    .await?;
    let (summary, run) = match done {
        crate::backfill::Backfilled::AllLive => {
            eprintln!(
                "every projection of {} is live on {}: nothing to backfill (--all backfills them anyway)",
                target.source(),
                c.table
            );
            if format == OutputFormat::Json {
                println!(
                    "{}",
                    serde_json::to_string(&crate::backfill::BackfillSummary::default())?
                );
            }
            return Ok(Outcome::Done);
        }
        crate::backfill::Backfilled::Ran { summary, run } => (summary, run),
    };
    eprintln!(
        "{}backfill of {}: {} items scanned, {} {}, {} writes, {:.1} WCU, {:.1} RCU, {} dead letters, {:.1} s ({:.0} items/s)",
        if args.dry_run { "dry-run " } else { "" },
        c.table,
        summary.scanned,
        summary.planned,
        if args.dry_run { "would change" } else { "needed changes" },
        summary.writes,
        summary.write_units,
        summary.read_units,
        summary.dead_letters,
        summary.seconds,
        summary.items_per_second()
    );
    if !summary.backfilled.is_empty() {
        eprintln!(
            "backfilled (live once a worker runs them): {}",
            summary.backfilled.join(", ")
        );
    }
    for (name, why) in &summary.not_backfilled {
        eprintln!("{name}: not recorded as backfilled: {why}");
    }
    if let (Some(run), false) = (&run, summary.is_done()) {
        eprintln!("segments left: continue with --resume (or --run {run} on every machine)");
    }
    if format == OutputFormat::Json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(backfill_outcome(&summary))
}

/// A backfill is done (exit 0) when each projection it completed was
/// recorded as backfilled, or its segments here are done and others are
/// left to other machines; one it could not record (a writer of another
/// definition could write meanwhile: backfill it again) is work pending,
/// exit 1.
fn backfill_outcome(summary: &crate::backfill::BackfillSummary) -> Outcome {
    Outcome::done_if(summary.not_backfilled.is_empty())
}

/// `prune`.
pub async fn prune(
    target: Target,
    names: Vec<String>,
    from_spec: Option<std::path::PathBuf>,
    format: OutputFormat,
    options: crate::prune::PruneOptions,
) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    if options.dry_run {
        crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    } else {
        crate::global::require_home(&c, &target.deployment(), "prune").await?;
    }
    let from = match &from_spec {
        Some(path) => match super::load_spec(path, Some(&c.table)) {
            Ok(spec) => Some(std::sync::Arc::new(spec)),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    let retired = crate::prune::retired(&c, &target.source(), &names, from).await?;
    crate::prune::refusal(&c.table, &c.spec, &retired)?;
    let mut options = options;
    // Its progress goes under a run: the one named, the last one
    // (--resume), or a new one.
    let run = if options.dry_run {
        None
    } else {
        let resume = super::Resume {
            run: options.run.take(),
            resume: options.resume,
        };
        let run = resume
            .start(
                &c.dynamodb,
                &c.table,
                &c.spec.table,
                crate::control::Job::Prune,
                crate::prune::scope(&c.table, &retired),
            )
            .await?;
        options.run = Some(run.chosen.run.clone());
        options.resume = run.chosen.resumed;
        options.started_ms = Some(run.chosen.started_ms);
        Some(run)
    };
    let summary = crate::prune::prune(&c.dynamodb, &c.table, &c.spec, &retired, &options).await?;
    if let Some(run) = &run {
        run.finish().await?;
    }
    eprintln!(
        "{}prune of {} from {}: {} items scanned, {} deleted, {} stripped of derived attributes, {} counter records removed, {} kept, {} dead letters removed, {:.1} WCU, {:.1} s",
        if options.dry_run { "dry-run " } else { "" },
        names.join(", "),
        c.table,
        summary.scanned,
        summary.deleted_items,
        summary.stripped_items,
        summary.removed_records,
        summary.kept_count,
        summary.dead_letters,
        summary.write_units,
        summary.seconds,
    );
    for why in &summary.kept {
        eprintln!("  kept: {why}");
    }
    let left: Vec<&String> = names
        .iter()
        .filter(|n| !summary.forgotten.contains(n))
        .collect();
    if !options.dry_run && !left.is_empty() {
        eprintln!(
            "not forgotten (a writer ran during the prune; run it again once none does): {}",
            left.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if format == OutputFormat::Json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(if options.dry_run || left.is_empty() {
        Outcome::Done
    } else {
        Outcome::Found
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backfill::BackfillSummary;

    #[test]
    fn a_backfill_with_no_flags_asks_what_the_library_asks() {
        #[derive(clap::Parser)]
        struct Parsed {
            #[command(flatten)]
            args: BackfillArgs,
        }
        let parsed = <Parsed as clap::Parser>::try_parse_from(["backfill"]).unwrap();
        assert_eq!(
            parsed.args.request().unwrap(),
            crate::backfill::Request::default()
        );
    }

    #[test]
    fn a_backfill_that_could_not_record_a_projection_exits_1() {
        let done = BackfillSummary {
            backfilled: vec!["followers".to_string()],
            ..BackfillSummary::default()
        };
        assert_eq!(backfill_outcome(&done), Outcome::Done);
        // This machine's segments done, others' left: its part is done.
        assert_eq!(backfill_outcome(&BackfillSummary::default()), Outcome::Done);
        let not = BackfillSummary {
            not_backfilled: vec![(
                "followers".to_string(),
                "a writer of another definition could write".to_string(),
            )],
            ..BackfillSummary::default()
        };
        assert_eq!(backfill_outcome(&not), Outcome::Found);
    }
}
