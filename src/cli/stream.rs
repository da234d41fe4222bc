//! `run` and `replay`: the self-hosted stream runner (see [`crate::source`]).
//!
//! `PROJECTOR_BATCH_LIMIT` (1 to 1000, default 1000; read by `run`,
//! `replay` and `failover`'s replay) sets the records per
//! `GetRecords` call, so per batch and checkpoint: smaller batches
//! checkpoint more often but coalesce less.

use super::Outcome;

use std::net::SocketAddr;

use anyhow::{bail, Context};

use super::{connect, KinesisSource, OutputFormat, Target};
use crate::global::{Ran, RunFailed, Step, Worked};
use crate::source::observe::{self, Health};
use crate::source::recover::RecoverOptions;
use crate::source::stream::MAX_BATCH;
use crate::source::RunOptions;

/// `run`: tail the stream, applying projections, checkpointing per shard;
/// with `metrics_addr`, serving `/metrics` and `/healthz` there.
pub async fn run(
    target: Target,
    drain: bool,
    source: KinesisSource,
    metrics_addr: Option<SocketAddr>,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let mut options = from_kinesis(
        batch_limit(if drain {
            RunOptions::drain()
        } else {
            RunOptions::follow()
        })?,
        &target,
        source,
    );
    if let Some(addr) = metrics_addr {
        options.health = Some(observe(addr).await?);
    }
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    let verb = if drain { "run --drain" } else { "run" };
    match crate::global::work(&c, &target.deployment(), options, verb).await {
        Ok(Worked::Idle { home }) => {
            eprintln!(
                "ddb-projector {verb}: table {} is projected from its home region {home}; nothing to do in this region",
                c.table
            );
            Ok(Outcome::Done)
        }
        Ok(Worked::Ran(ran)) => {
            print_ran(verb, &c.table, &ran, format);
            Ok(Outcome::Done)
        }
        Err(failed) => Err(print_failed(verb, &c.table, failed, format)),
    }
}

/// `replay`: process the retained stream again from its start.
pub async fn replay(
    target: Target,
    projections: Vec<String>,
    source: KinesisSource,
    resume: super::Resume,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let stream = source
        .kinesis_stream
        .clone()
        .unwrap_or_else(|| "stream".to_string());
    let mut options = from_kinesis(batch_limit(RunOptions::replay(None))?, &target, source);
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
    options.selection = (!selection.is_empty()).then_some(selection);
    let deployment = target.deployment();
    crate::global::require_home(&c, &deployment, "replay").await?;
    not_rebuilt(&c, &target, &projections).await;
    let mut names = projections.clone();
    names.sort();
    names.dedup();
    let scope = format!(
        "{}#{stream}#{}",
        c.table,
        if names.is_empty() {
            "*".to_string()
        } else {
            names.join(",")
        }
    );
    let run = match resume.asked() {
        true => Some(
            resume
                .start(
                    &c.dynamodb,
                    &c.table,
                    &c.spec.table,
                    crate::control::Job::Replay,
                    scope,
                )
                .await?,
        ),
        false => None,
    };
    options.replay_run = run.as_ref().map(|r| r.chosen.run.clone());
    match crate::global::run_stream(&c, &deployment, options, "replay").await {
        Ok(ran) => {
            print_ran("replay", &c.table, &ran, format);
            match &run {
                Some(run) if ran.summary.caught_up => run.finish().await?,
                Some(run) => eprintln!(
                    "replay `{0}` stopped before it caught up: continue it with --resume (or --run {0})",
                    run.chosen.run
                ),
                None => {}
            }
            Ok(Outcome::Done)
        }
        Err(failed) => Err(print_failed("replay", &c.table, failed, format)),
    }
}

/// Says which projections of the replay (`chosen`; none: all) a replay
/// does not make live: a changed, new or backfilling one is rebuilt by
/// its backfill, not by the stream's retained records, and readers of a
/// changed counter read its old version until that backfill completes.
async fn not_rebuilt(c: &crate::control::Connection, target: &Target, chosen: &[String]) {
    let report = match crate::control::status(c, &super::lifecycle::commands(target)).await {
        Ok(report) => report,
        Err(error) => {
            tracing::warn!(%error, "reading the projections' lifecycle failed");
            return;
        }
    };
    use crate::control::State;
    for row in &report.rows {
        let pending = matches!(row.state, State::New | State::Changed | State::Backfilling);
        if !pending || !(chosen.is_empty() || chosen.contains(&row.name)) {
            continue;
        }
        let readers = if row.kind == "counter" && row.state == State::Changed {
            ": readers read its old version until its backfill completes"
        } else {
            ""
        };
        eprintln!(
            "replay does not rebuild `{}` ({}): it applies the stream's retained records, not the history before them{readers}; run {}",
            row.name,
            row.state.as_str(),
            row.next.as_deref().unwrap_or("its backfill")
        );
    }
}

/// `failover --to REGION` (see [`crate::global::failover`]): its steps
/// as they go, then what is left to the operator.
pub async fn failover(
    target: Target,
    to: String,
    segments: u32,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let replay = batch_limit(RunOptions::replay(None))?;
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(result) => return result,
    };
    let mut replayed = None;
    let mut step = |step: Step<'_>| match step {
        Step::Note(note) => eprintln!("ddb-projector failover: {note}"),
        Step::Replayed(ran) => {
            print_ran("failover (replay)", &c.table, ran, OutputFormat::Text);
            replayed = Some(ran.summary.clone());
        }
        Step::Audited(report, spec) => {
            // Text goes to stdout; the JSON object comes once, at the end.
            if format == OutputFormat::Text {
                if let Err(error) = super::audit::print(report, spec, OutputFormat::Text) {
                    tracing::warn!(%error, "cannot print the audit's report");
                }
            }
        }
    };
    let done =
        crate::global::failover(&c, &target.deployment(), &to, replay, segments, &mut step).await?;
    if format == OutputFormat::Json {
        let line = serde_json::json!({
            "table": c.table,
            "to": to,
            "replayed": replayed,
            "redriven": done.redriven,
            "audit": done.audit,
        });
        println!("{line}");
    }
    eprintln!(
        "ddb-projector failover: {to}'s replica is repaired. Now:\n  \
         1. set HomeRegion={to} in the stack of every region (infra/deploy ... \
         --parameter-overrides HomeRegion={to}), or PROJECTOR_HOME_REGION={to} for runners; \
         the old home's stack before that region comes back;\n  \
         2. in {to}, the stream mapping (or `ddb-projector run`) starts projecting;\n  \
         3. `ddb-projector status` in {to} shows every projection live; this command's exit \
         code is the last audit's (0: clean; 1: findings left, run `audit --repair` again)."
    );
    Ok(Outcome::done_if(done.audit.is_clean()))
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
    let options = RecoverOptions {
        backfill_trimmed,
        dry_run,
        ..RecoverOptions::default()
    };
    let summary = crate::source::recover::recover(&c, &queue_url, &options).await?;
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string(&summary)?),
        OutputFormat::Text => {
            eprintln!(
                "ddb-projector recover on table {} from {queue_url}:\n{summary}",
                c.table
            );
            let trimmed = summary.trimmed_left();
            if trimmed && !dry_run {
                let args = target.args();
                eprintln!(
                    "The stream no longer holds some ranges, and Lambda's failure messages do not carry \
                     the records' keys, so what they touched is unknown. Run \
                     `ddb-projector recover {args} --queue-url {queue_url} --backfill-trimmed` \
                     (a guarded backfill of the whole table, then those messages are deleted), or \
                     `ddb-projector audit {args} --repair` and delete the messages yourself."
                );
            }
        }
    }
    Ok(Outcome::done_if(summary.kept() == 0))
}

/// Installs the Prometheus recorder and serves `/metrics` and `/healthz`
/// on `addr` for as long as the process runs: the health the runner
/// reports to.
async fn observe(addr: SocketAddr) -> anyhow::Result<Health> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--metrics-addr)"))?;
    let handle = observe::install_prometheus().map_err(anyhow::Error::msg)?;
    let bound = listener.local_addr()?;
    eprintln!(
        "ddb-projector run: metrics at http://{bound}/metrics, health at http://{bound}/healthz"
    );
    tracing::info!(%bound, "serving metrics and health");
    let health = Health::new();
    tokio::spawn(observe::serve(listener, health.clone(), Some(handle)));
    Ok(health)
}

/// `PROJECTOR_BATCH_LIMIT` (1 to [`MAX_BATCH`]) into `options`.
fn batch_limit(mut options: RunOptions) -> anyhow::Result<RunOptions> {
    if let Ok(text) = std::env::var("PROJECTOR_BATCH_LIMIT") {
        match text.parse::<i32>() {
            Ok(limit) if (1..=MAX_BATCH).contains(&limit) => options.batch_limit = limit,
            _ => bail!(
                "PROJECTOR_BATCH_LIMIT must be a whole number from 1 to {MAX_BATCH}, not `{text}`"
            ),
        }
    }
    Ok(options)
}

/// The run's summary as text on stderr; with `--format json`, also as
/// one JSON object on stdout (`{"how": ..., "summary": {...}}`).
fn print_ran(verb: &str, table: &str, ran: &Ran, format: OutputFormat) {
    eprintln!(
        "ddb-projector {verb} on table {table} {}:\n{}",
        ran.how, ran.summary
    );
    if format == OutputFormat::Json {
        let line = serde_json::json!({ "table": table, "how": ran.how, "summary": ran.summary });
        println!("{line}");
    }
}

/// Prints what a failed run did, if it started; its error.
fn print_failed(verb: &str, table: &str, failed: RunFailed, format: OutputFormat) -> anyhow::Error {
    if let Some(ran) = &failed.ran {
        print_ran(verb, table, ran, format);
    }
    failed.error
}

/// `options` reading the Kinesis stream `source` names, if any: the tables
/// the spec files describe besides the command's are another consumer's.
fn from_kinesis(mut options: RunOptions, target: &Target, source: KinesisSource) -> RunOptions {
    if let Some(arn) = source.kinesis_stream {
        let described = target
            .spec
            .as_deref()
            .and_then(|path| crate::spec::SpecSet::load(path).ok())
            .map(|set| {
                set.specs()
                    .iter()
                    .map(|spec| spec.table.name.clone())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        options.kinesis = Some(crate::source::KinesisStream { arn, described });
        options.from_ms = source.from;
    }
    options
}
