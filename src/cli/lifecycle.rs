//! The lifecycle commands: `status`, and `backfill` (which claims what it
//! backfills in the lifecycle registry and records it once complete).

use super::Outcome;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use super::online::{projection_ids, Segments};
use super::{connect, OutputFormat, Target};
use crate::control::{
    choose_projections, claim_run, iso, open_letters, states, BackfillChoice, Commands, Registry,
    State,
};
use crate::dynamo::time::now_ms;
use crate::spec::ProjectionId;

/// How `status` writes the commands it suggests for this target.
fn commands(target: &Target) -> Commands {
    let mut line = format!("--spec {}", target.spec.display());
    if let Some(table) = &target.table {
        line.push_str(&format!(" --table {table}"));
    }
    if let Some(consumer) = &target.consumer {
        line.push_str(&format!(" --consumer {consumer}"));
    }
    Commands {
        target: line,
        consumer: target.consumer.clone(),
    }
}

/// `status`: exit 0 when every projection is live, 1 otherwise.
pub async fn status(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    let registry = Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table);
    let snapshot = registry.snapshot(&c.spec).await?;
    let applier = c.applier();
    let by_projection = open_letters(&applier).await?;
    let mut rows = states(
        &c.spec,
        &snapshot,
        now_ms(),
        registry.skew_ms(),
        &by_projection,
        &commands(&target),
    );
    let applied = registry.applied().await?;
    for row in &mut rows {
        row.dead_letters = by_projection.get(&row.name).copied().unwrap_or(0);
        row.applied = applied.get(&row.name).copied();
    }
    let whole = by_projection
        .get(&applier.whole_record())
        .copied()
        .unwrap_or(0);
    let violations = applier.recorded_violations().await?;
    let mut by_invariant: BTreeMap<String, usize> = c
        .spec
        .invariants
        .iter()
        .map(|i| (i.name.clone(), 0))
        .collect();
    for v in &violations {
        *by_invariant.entry(v.invariant.clone()).or_default() += 1;
    }
    let live = rows.iter().filter(|r| r.state == State::Live).count();
    let all_live = live == rows.len();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        OutputFormat::Json => {
            let value = json!({
                "table": c.table,
                "spec": target.spec.display().to_string(),
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
                target.spec.display(),
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
            for row in &rows {
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
            for (invariant, n) in &by_invariant {
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

/// `backfill`'s arguments.
pub struct BackfillArgs {
    /// `--projection` (none: what is not live).
    pub projections: Vec<String>,
    /// `--all`.
    pub all: bool,
    /// `--run`.
    pub run: Option<String>,
    /// `--wait`.
    pub wait: Duration,
    /// `--segments`, `--segment`, `--total-segments`.
    pub segments: Segments,
    /// `--max-wcu`.
    pub max_wcu: Option<f64>,
    /// `--max-rcu`.
    pub max_rcu: Option<f64>,
    /// `--resume`.
    pub resume: bool,
    /// `--dry-run`.
    pub dry_run: bool,
}

/// `backfill`.
pub async fn backfill(target: Target, args: BackfillArgs) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(c) => c,
        Err(result) => return result,
    };
    if args.dry_run {
        crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    } else {
        crate::global::require_home(&c, &target.deployment(), "backfill").await?;
    }
    let registry = Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table);
    let applier = c.applier();
    let asked = projection_ids(&c.spec, &args.projections)?;
    let choice =
        choose_projections(&registry, &applier, &commands(&target), asked, args.all).await?;
    let ids: Vec<ProjectionId> = match choice {
        BackfillChoice::Asked(ids) => ids,
        BackfillChoice::AllLive => {
            eprintln!(
                "every projection of {} is live on {}: nothing to backfill (--all backfills them anyway)",
                target.spec.display(),
                c.table
            );
            println!(
                "{}",
                serde_json::to_string(&crate::backfill::BackfillSummary::default())?
            );
            return Ok(Outcome::Done);
        }
        BackfillChoice::NotLive(needed) => {
            let names: Vec<&str> = needed
                .iter()
                .map(|&id| c.spec.projections[id].name.as_str())
                .collect();
            eprintln!("backfilling what is not live: {}", names.join(", "));
            needed
        }
    };
    let (segment_list, total) = match (args.segments.segment, args.segments.total_segments) {
        (Some(segment), Some(total)) => {
            if segment >= total {
                bail!("--segment {segment} is out of range for --total-segments {total} (segments count from 0)");
            }
            (vec![segment], total)
        }
        _ => {
            let n = args.segments.segments.clamp(1, 1_000_000);
            ((0..n).collect(), n)
        }
    };
    if args.segments.segment.is_some() && args.run.is_none() && !args.dry_run {
        bail!("--segment needs --run NAME: the same name on every machine, so that the segments make one backfill (its projections are recorded once every segment is done)");
    }
    let run = if args.dry_run {
        None
    } else {
        let run = claim_run(
            &registry,
            &c.spec,
            &ids,
            args.run.as_deref(),
            args.resume,
            args.wait,
            &mut |note| eprintln!("{note}"),
        )
        .await?;
        Some(run)
    };
    let options = crate::backfill::BackfillOptions {
        projections: (ids.len() != c.spec.projections.len()).then_some(ids),
        segments: segment_list,
        total_segments: total,
        max_wcu: args.max_wcu,
        max_rcu: args.max_rcu,
        resume: args.resume || args.run.is_some(),
        dry_run: args.dry_run,
        run,
        ..Default::default()
    };
    let summary = crate::backfill::backfill(&applier, &options).await?;
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
    if let (Some(run), false) = (&options.run, summary.is_done()) {
        eprintln!("segments left: continue with --resume (or --run {run} on every machine)");
    }
    println!("{}", serde_json::to_string(&summary)?);
    Ok(Outcome::Done)
}

/// `prune`.
pub async fn prune(
    target: Target,
    names: Vec<String>,
    from_spec: Option<std::path::PathBuf>,
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
    let registry = Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table);
    let snapshot = registry.snapshot(&c.spec).await?;
    let retired_known: Vec<&str> = snapshot
        .records
        .iter()
        .filter(|(name, record)| {
            c.spec.projection_id(name).is_none()
                && record
                    .definitions
                    .iter()
                    .any(|d| d.fingerprint != crate::control::WITHOUT)
        })
        .map(|(name, _)| name.as_str())
        .collect();
    let from = match &from_spec {
        Some(path) => match super::load_spec(path, Some(&c.table)) {
            Ok(spec) => Some(std::sync::Arc::new(spec)),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    let now = now_ms();
    let mut retired = Vec::new();
    for name in &names {
        if let Some(id) = c.spec.projection_id(name) {
            if c.spec.is_old_version(id) {
                bail!(
                    "`{name}` is what readers read while `{}` is rebuilt: it is pruned once that backfill completes and the workers have dropped it (`status` says when)",
                    crate::spec::old_version_of(name).map_or("", |(base, _)| base)
                );
            }
            bail!(
                "`{name}` is in {}: prune removes what a retired projection derived; remove it from the spec and deploy first",
                target.spec.display()
            );
        }
        if snapshot.owned_by_other(name, target.consumer.as_deref()) {
            bail!(
                "`{name}` is run by consumer `{}`, not this one: it is that deployment's to retire and prune (with its spec and --consumer)",
                snapshot.owner(name).unwrap_or_default()
            );
        }
        let record = snapshot.record(name);
        if let Some(writer) = record
            .definitions
            .iter()
            .filter(|d| d.fingerprint != crate::control::WITHOUT)
            .find(|d| d.writes_until >= now)
        {
            bail!(
                "a writer of `{name}` (definition {}) holds a lease until {}: deploy a spec without it first (or wait for the old workers to stop), then prune",
                writer.fingerprint,
                iso(writer.writes_until)
            );
        }
        let spec = match &from {
            Some(spec) => spec.clone(),
            None => {
                let latest = record
                    .definitions
                    .iter()
                    .filter(|d| d.fingerprint != crate::control::WITHOUT)
                    .filter_map(|d| d.spec_key.as_ref().map(|key| (d.writes_until, key)))
                    .max();
                let Some((_, key)) = latest else {
                    bail!(
                        "the lifecycle registry of {} knows no definition of `{name}` (retired projections it knows: {}); give the spec that had it with --from-spec",
                        c.table,
                        if retired_known.is_empty() { "none".to_string() } else { retired_known.join(", ") }
                    );
                };
                let Some(text) = registry.spec_text(key).await? else {
                    bail!("the lifecycle registry lost the spec text `{key}` that defined `{name}`: give it with --from-spec");
                };
                let label = format!("the registry's copy of the spec that last ran `{name}`");
                match crate::spec::Spec::from_toml(&text, &label) {
                    Ok(spec) => std::sync::Arc::new(spec),
                    Err(errors) => bail!("{errors}"),
                }
            }
        };
        retired.push(crate::prune::Retired::new(name, spec).map_err(anyhow::Error::msg)?);
    }
    let summary = crate::prune::prune(&c.dynamodb, &c.table, &c.spec, &retired, &options).await?;
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
    println!("{}", serde_json::to_string(&summary)?);
    Ok(if options.dry_run || left.is_empty() {
        Outcome::Done
    } else {
        Outcome::Found
    })
}
