//! `run` and `replay`: the self-hosted stream runner (see [`crate::source`]).
//!
//! `PROJECTOR_BATCH_LIMIT` (1 to 1000, default 1000) sets the records per
//! `GetRecords` call, so per batch and checkpoint: smaller batches
//! checkpoint more often but coalesce less.

use super::Outcome;

use anyhow::bail;

use super::{connect, Connection, OutputFormat, Target};
use crate::apply::ApplyConfig;
use crate::control::Registry;
use crate::source::recover::{RecoverOptions, Recovery};
use crate::source::stream::MAX_BATCH;
use crate::source::{RunOptions, StreamRunner, Summary};

/// `run`: tail the stream, applying projections, checkpointing per shard.
pub async fn run(target: Target, drain: bool) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    let options = if drain {
        RunOptions::drain()
    } else {
        RunOptions::follow()
    };
    let verb = if drain { "run --drain" } else { "run" };
    if let crate::global::Role::Away { home } =
        crate::global::region_role(&c, &target.deployment()).await?
    {
        // A worker deployed in every region idles outside the home one.
        tracing::warn!(
            table = c.table,
            home_region = home,
            "the table is a global table projected from its home region: this runner writes nothing here and stops"
        );
        eprintln!(
            "ddb-projector {verb}: table {} is projected from its home region {home}; nothing to do in this region",
            c.table
        );
        return Ok(Outcome::Done);
    }
    run_stream(&c, &target, options, verb).await
}

/// `replay`: process the retained stream again from its start.
pub async fn replay(target: Target, projections: Vec<String>) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    let mut selection = Vec::new();
    for name in &projections {
        match c.spec.projection_id(name) {
            Some(id) => selection.push(id),
            None => {
                let known: Vec<&str> = c.spec.projections.iter().map(|p| p.name.as_str()).collect();
                bail!(
                    "no projection `{name}` in {} (projections: {})",
                    c.spec.file,
                    known.join(", ")
                );
            }
        }
    }
    let selection = (!selection.is_empty()).then_some(selection);
    crate::global::require_home(&c, &target.deployment(), "replay").await?;
    run_stream(&c, &target, RunOptions::replay(selection), "replay").await
}

/// `failover --to REGION`: this region becomes the home region of a
/// global table (see `docs/global-tables.md`): its whole retained
/// stream replayed, then `audit --repair`, then the steps left to the
/// operator printed.
pub async fn failover(target: Target, to: String, segments: u32) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    let region = c.config.region().map(|r| r.to_string()).unwrap_or_default();
    if region != to {
        bail!(
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
        bail!(
            "table `{}` is not a global table (DescribeTable lists no replicas): there is no other \
             region to take over from; nothing done",
            c.table
        );
    }
    let target = Target {
        home_region: Some(to.clone()),
        ..target
    };
    // The same checks as any worker there (strong consistency, writes
    // onto writers' items), with `to` as the home whatever the table
    // records (an earlier failover's home, maybe gone).
    crate::global::role(
        &info,
        &c.spec,
        &region,
        Some(&to),
        target.deployment().writers,
    )?;
    // Recorded first: replicated back to the old home, it makes that
    // region's workers stand down.
    Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table)
        .record_home(&to)
        .await?;
    eprintln!(
        "ddb-projector failover: {to} becomes the home region of {}; 1/4: replaying {to}'s stream from its oldest record",
        c.table
    );
    let replayed = run_stream(&c, &target, RunOptions::replay(None), "failover (replay)").await?;
    if replayed != Outcome::Done {
        eprintln!("ddb-projector failover: the replay did not finish; run the command again");
        return Ok(replayed);
    }
    // Letters of both streams (the old home's, replicated, and the
    // replay's), each item ending at its current state.
    eprintln!("ddb-projector failover: 2/4: redriving the dead letters");
    let redriven = c.applier().redrive(None).await?;
    eprintln!(
        "ddb-projector failover: redriven {}, superseded {}, still failing {} (see `dlq list`)",
        redriven.redriven, redriven.superseded, redriven.still_failing
    );
    eprintln!("ddb-projector failover: 3/4: audit --repair (counters moved by transactions that replicated in part)");
    let options = crate::audit::AuditOptions {
        segments: segments.max(1),
        progress: true,
        ..crate::audit::AuditOptions::default()
    };
    // Exit 1 here means found and repaired.
    let repaired = super::audit::audit(
        target.clone(),
        OutputFormat::Text,
        crate::audit::AuditOptions {
            repair: true,
            ..options.clone()
        },
    )
    .await?;
    if repaired == Outcome::Failed {
        return Ok(repaired);
    }
    eprintln!("ddb-projector failover: 4/4: audit (exit 0: clean)");
    let audited = super::audit::audit(target, OutputFormat::Text, options).await?;
    eprintln!(
        "ddb-projector failover: {to}'s replica is repaired. Now:\n  \
         1. set HomeRegion={to} in the stack of every region (infra/deploy ... \
         --parameter-overrides HomeRegion={to}), or PROJECTOR_HOME_REGION={to} for runners; \
         the old home's stack before that region comes back;\n  \
         2. in {to}, the stream mapping (or `ddb-projector run`) starts projecting;\n  \
         3. `ddb-projector status` in {to} shows every projection live; this command's exit \
         code is the last audit's (0: clean; 1: findings left, run `audit --repair` again)."
    );
    Ok(audited)
}

/// `recover`: the batches Lambda gave up on, from its on-failure queue.
pub async fn recover(
    target: Target,
    queue_url: String,
    backfill_trimmed: bool,
    dry_run: bool,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    if !dry_run {
        crate::global::require_home(&c, &target.deployment(), "recover").await?;
    }
    let applier = c.applier();
    let recovery = Recovery::new(
        applier,
        crate::dynamo::client::streams(&c.config),
        aws_sdk_sqs::Client::new(&c.config),
        &queue_url,
    );
    let options = RecoverOptions {
        backfill_trimmed,
        dry_run,
        ..RecoverOptions::default()
    };
    let summary = recovery.run(&options).await?;
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string(&summary)?),
        OutputFormat::Text => {
            eprintln!(
                "ddb-projector recover on table {} from {queue_url}:\n{summary}",
                c.table
            );
            let trimmed = summary.messages.iter().any(|m| {
                matches!(
                    m.outcome,
                    crate::source::recover::Outcome::Trimmed {
                        backfilled: false,
                        ..
                    }
                )
            });
            if trimmed && !dry_run {
                let table = match &target.table {
                    Some(table) => format!(" --table {table}"),
                    None => String::new(),
                };
                let spec = target.spec.display();
                eprintln!(
                    "The stream no longer holds some ranges, and Lambda's failure messages do not carry \
                     the records' keys, so what they touched is unknown. Run \
                     `ddb-projector recover --spec {spec}{table} --queue-url {queue_url} --backfill-trimmed` \
                     (a guarded backfill of the whole table, then those messages are deleted), or \
                     `ddb-projector audit --spec {spec}{table} --repair` and delete the messages yourself."
                );
            }
        }
    }
    Ok(if summary.kept() == 0 {
        Outcome::Done
    } else {
        Outcome::Found
    })
}

async fn run_stream(
    c: &Connection,
    target: &Target,
    mut options: RunOptions,
    verb: &str,
) -> anyhow::Result<Outcome> {
    if let Ok(text) = std::env::var("PROJECTOR_BATCH_LIMIT") {
        match text.parse::<i32>() {
            Ok(limit) if (1..=MAX_BATCH).contains(&limit) => options.batch_limit = limit,
            _ => bail!(
                "PROJECTOR_BATCH_LIMIT must be a whole number from 1 to {MAX_BATCH}, not `{text}`"
            ),
        }
    }
    let (stream_arn, _) = crate::dynamo::client::require_stream(&c.dynamodb, &c.table).await?;
    // `run` consumes the stream for the whole spec; `replay` does not.
    let consumer = options.checkpoints && options.selection.is_none();
    tracing::info!(table = %c.table, stream = %stream_arn, drain = options.drain, checkpoints = options.checkpoints, "starting");
    let done = if options.drain {
        "caught up"
    } else {
        "stopped"
    };
    let registry = Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table);
    if consumer {
        // Another consumer's spec that conflicts with this one: starting
        // would have each undo the other's writes.
        let conflicts = registry
            .consumer_conflicts(&c.spec, c.consumer.as_deref())
            .await?;
        if !conflicts.is_empty() {
            bail!("`{verb}` refused: {}", conflicts.join("\n"));
        }
    }
    let mut spec = c.spec.clone();
    loop {
        let applier = crate::control::applier(
            c.dynamodb.clone(),
            spec.clone(),
            &c.table,
            ApplyConfig {
                stream_consumer: consumer,
                ..c.apply_config()
            },
        );
        let runner = StreamRunner::new(
            applier,
            crate::dynamo::client::streams(&c.config),
            &stream_arn,
        );
        // Once per lease period, the counters' layout is read again: when
        // a rebuilt counter's backfill completes, the runner stops after
        // its batches in flight and goes on from its checkpoints with the
        // new layout (dropping the old version it kept current).
        let relaid = std::sync::Mutex::new(None);
        // A replay (no checkpoints) lays out again too: refused for a
        // stale layout, it starts over with the new one (replays change
        // nothing they already applied).
        let watch = async {
            let mut refusals = crate::control::layout_refusals();
            loop {
                // Once per lease period, or at once when a writer was
                // refused for a stale layout.
                let started = tokio::time::Instant::now();
                while started.elapsed() < crate::apply::lease_length()
                    && crate::control::layout_refusals() == refusals
                {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                refusals = crate::control::layout_refusals();
                match registry.layout(&c.file_spec).await {
                    Ok((laid, _))
                        if laid.projections_fingerprint() != spec.projections_fingerprint() =>
                    {
                        *relaid.lock().expect("layout lock") = Some(laid);
                        return;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "reading the counters' layout failed: keeping this one");
                    }
                }
            }
        };
        // Where this worker stands is asked again as the Lambda does: a
        // failover elsewhere, or a replica added, stops it.
        let stood_down = std::sync::Mutex::new(None);
        let roles = async {
            let why = crate::global::stand_down(crate::global::ROLE_CHECK, || async {
                match crate::global::region_role(c, &target.deployment()).await {
                    Ok(role) => Ok(Ok(role)),
                    Err(error) => match error.downcast::<crate::global::GlobalError>() {
                        Ok(refused) => Ok(Err(refused)),
                        Err(error) => Err(format!("{error:#}")),
                    },
                }
            })
            .await;
            *stood_down.lock().expect("role lock") = Some(why);
        };
        let stop = async {
            tokio::select! {
                _ = shutdown() => {}
                _ = watch => {}
                _ = roles => {}
            }
        };
        match runner.run(options.clone(), stop).await {
            Ok(summary) => {
                match stood_down.lock().expect("role lock").take() {
                    Some(crate::global::StandDown::Away { home }) => {
                        tracing::warn!(
                            table = c.table,
                            home_region = home,
                            "the table is now projected from another region: stopping"
                        );
                        let how = format!(
                            "stopped: the table is now projected from its home region {home}"
                        );
                        print_summary(verb, &c.table, &summary, &how);
                        // A worker idles where it does not project; a
                        // replay stopped half-way did not do its job.
                        if options.checkpoints {
                            return Ok(Outcome::Done);
                        }
                        bail!("{verb} {how}, before the end of the stream");
                    }
                    Some(crate::global::StandDown::Refused(refused)) => {
                        print_summary(verb, &c.table, &summary, "stopped");
                        return Err(refused.into());
                    }
                    None => {}
                }
                if let Some(laid) = relaid.lock().expect("layout lock").take() {
                    tracing::info!(
                        records = summary.records,
                        "a counter's versions changed (a rebuild completed or began): going on with the new layout"
                    );
                    spec = std::sync::Arc::new(laid);
                    continue;
                }
                print_summary(verb, &c.table, &summary, done);
                return Ok(Outcome::Done);
            }
            Err(error) => {
                print_summary(verb, &c.table, &error.summary, "failed");
                return Err(error.into());
            }
        }
    }
}

fn print_summary(verb: &str, table: &str, summary: &Summary, how: &str) {
    eprintln!("ddb-projector {verb} on table {table} {how}:\n{summary}");
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the runner");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
