//! The self-hosted worker of a region: the stream runner, projecting while
//! its region is home, laying the spec out again as counters' versions
//! move.
//!
//! `PROJECTOR_BATCH_LIMIT` (1 to 1000, default 1000), read by the CLI's
//! `run`, `replay` and `failover`, sets the records per `GetRecords`
//! call, so per batch and checkpoint.

use std::sync::Arc;

use super::{region_role, stand_down, Deployment, GlobalError, Role, StandDown, ROLE_CHECK};
use crate::apply::ApplyConfig;
use crate::control::Connection;
use crate::source::{RunOptions, StreamRunner, Summary};

/// How a stream run ended, and what it did.
#[derive(Debug)]
pub struct Ran {
    /// What the runner did.
    pub summary: Summary,
    /// How it ended: `caught up`, `stopped`, `failed`, `stopped: ...`.
    pub how: String,
}

/// A stream run that could not run or did not finish.
#[derive(Debug)]
pub struct RunFailed {
    /// What it did before, when it had started.
    pub ran: Option<Ran>,
    /// Why.
    pub error: anyhow::Error,
}

impl From<anyhow::Error> for RunFailed {
    fn from(error: anyhow::Error) -> RunFailed {
        RunFailed { ran: None, error }
    }
}

/// What `run` did.
#[derive(Debug)]
pub enum Worked {
    /// This region is not the table's home region: a worker deployed in
    /// every region idles outside the home one.
    Idle {
        /// The home region.
        home: String,
    },
    /// It ran.
    Ran(Ran),
}

/// `run`: the worker of this region; idle outside a global table's home
/// region, else [`run_stream`].
pub async fn work(
    c: &Connection,
    deployment: &Deployment,
    options: RunOptions,
    verb: &str,
) -> Result<Worked, RunFailed> {
    if let Role::Away { home } = region_role(c, deployment).await? {
        tracing::warn!(
            table = c.table,
            home_region = home,
            "the table is a global table projected from its home region: this runner writes nothing here and stops"
        );
        return Ok(Worked::Idle { home });
    }
    Ok(Worked::Ran(run_stream(c, deployment, options, verb).await?))
}

/// Runs the stream of `c`'s table with `options` (`verb` names the command
/// in errors) until it is caught up (drain), stopped (SIGINT, SIGTERM),
/// or another region becomes home; going on with a new layout when a
/// counter's versions move.
pub async fn run_stream(
    c: &Connection,
    deployment: &Deployment,
    options: RunOptions,
    verb: &str,
) -> Result<Ran, RunFailed> {
    let stream_arn = match &options.kinesis {
        Some(kinesis) => kinesis.arn.clone(),
        None => {
            crate::dynamo::client::require_stream(&c.dynamodb, &c.table)
                .await?
                .0
        }
    };
    // `run` consumes the stream for the whole spec; `replay` does not.
    let consumer = options.checkpoints && options.selection.is_none();
    tracing::info!(table = %c.table, stream = %stream_arn, drain = options.drain, checkpoints = options.checkpoints, "starting");
    let options_drain = options.drain;
    let done = if options.drain {
        "caught up"
    } else {
        "stopped"
    };
    let registry = c.registry();
    if consumer {
        // Another consumer's spec that conflicts with this one: starting
        // would have each undo the other's writes.
        let conflicts = registry
            .consumer_conflicts(&c.spec, c.consumer.as_deref())
            .await
            .map_err(anyhow::Error::from)?;
        if !conflicts.is_empty() {
            return Err(anyhow::anyhow!("`{verb}` refused: {}", conflicts.join("\n")).into());
        }
    }
    let mut spec = c.spec.clone();
    let mut file_spec = c.file_spec.clone();
    let mut registered = c.registered.clone();
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
        let runner = match &options.kinesis {
            Some(kinesis) => StreamRunner::kinesis(
                applier,
                aws_sdk_kinesis::Client::new(&c.config),
                &stream_arn,
                crate::source::OtherTables::new(
                    kinesis
                        .described
                        .iter()
                        .filter(|table| **table != c.table)
                        .cloned(),
                    Some(c.dynamodb.clone()),
                ),
            ),
            None => StreamRunner::new(
                applier,
                crate::dynamo::client::streams(&c.config),
                &stream_arn,
            ),
        };
        // The counters' layout is read again (see `control::relaid`); a
        // replay (no checkpoints) lays out again too: refused for a stale
        // layout, it starts over with the new one (replays change nothing
        // they already applied).
        let relaid = std::sync::Mutex::new(None);
        let laid_again = async {
            let laid = crate::control::relaid(&registry, &file_spec, &spec).await;
            *relaid.lock().expect("layout lock") = Some((laid, None));
        };
        // Serving the registry: a registration is served from the batch
        // after it is read whole.
        let reregistered = async {
            match &registered {
                Some(stamp) => {
                    let next =
                        crate::control::next_registration(&c.dynamodb, &c.table, stamp).await;
                    *relaid.lock().expect("layout lock") = Some(next);
                }
                None => std::future::pending().await,
            }
        };
        let watch = async {
            tokio::select! {
                _ = laid_again => {}
                _ = reregistered => {}
            }
        };
        // Where this worker stands is asked again as the Lambda does: a
        // failover elsewhere, or a replica added, stops it.
        let stood_down = std::sync::Mutex::new(None);
        let roles = async {
            let why = stand_down(ROLE_CHECK, || async {
                match region_role(c, deployment).await {
                    Ok(role) => Ok(Ok(role)),
                    Err(error) => match error.downcast::<GlobalError>() {
                        Ok(refused) => Ok(Err(refused)),
                        Err(error) => Err(format!("{error:#}")),
                    },
                }
            })
            .await;
            *stood_down.lock().expect("role lock") = Some(why);
        };
        let asked = options.stop.clone();
        let stop = async {
            tokio::select! {
                _ = shutdown() => {}
                _ = asked_to_stop(asked) => {}
                _ = watch => {}
                _ = roles => {}
            }
        };
        match Box::pin(runner.run(options.clone(), stop)).await {
            Ok(summary) => {
                match stood_down.lock().expect("role lock").take() {
                    Some(StandDown::Away { home }) => {
                        tracing::warn!(
                            table = c.table,
                            home_region = home,
                            "the table is now projected from another region: stopping"
                        );
                        let how = format!(
                            "stopped: the table is now projected from its home region {home}"
                        );
                        // A worker idles where it does not project; a
                        // replay stopped half-way did not do its job.
                        let error = anyhow::anyhow!("{verb} {how}, before the end of the stream");
                        let ran = Ran { summary, how };
                        if options.checkpoints {
                            return Ok(ran);
                        }
                        return Err(RunFailed {
                            ran: Some(ran),
                            error,
                        });
                    }
                    Some(StandDown::Refused(refused)) => {
                        return Err(RunFailed {
                            ran: Some(Ran {
                                summary,
                                how: "stopped".to_string(),
                            }),
                            error: refused.into(),
                        });
                    }
                    None => {}
                }
                let next = relaid.lock().expect("layout lock").take();
                // Stopped cleanly: what it no longer writes is given back,
                // so a backfill waits for no writer that stopped.
                let keep = next.as_ref().map(|(laid, _)| Arc::new(laid.clone()));
                give_back(c, keep.as_ref()).await;
                if let Some((laid, from)) = next {
                    match from {
                        Some((stamp, composed)) => {
                            tracing::info!(
                                records = summary.records,
                                registry_version = stamp.version,
                                projections = laid.projections.len(),
                                "a registration changed what the table's workers serve: going on with it"
                            );
                            metrics::counter!("projector_registrations_served_total").increment(1);
                            registered = Some(stamp);
                            file_spec = Arc::new(composed);
                        }
                        None => tracing::info!(
                            records = summary.records,
                            "a counter's versions changed (a rebuild completed or began): going on with the new layout"
                        ),
                    }
                    spec = Arc::new(laid);
                    continue;
                }
                let how = if options_drain && !summary.caught_up {
                    "stopped"
                } else {
                    done
                };
                return Ok(Ran {
                    summary,
                    how: how.to_string(),
                });
            }
            Err(error) => {
                return Err(RunFailed {
                    ran: Some(Ran {
                        summary: error.summary.clone(),
                        how: "failed".to_string(),
                    }),
                    error: error.into(),
                });
            }
        }
    }
}

/// Gives back the leases this process holds on `c`'s table but those of a
/// stream consumer of `keep` (see [`crate::control::Leases::give_back`]).
async fn give_back(c: &Connection, keep: Option<&Arc<crate::spec::Spec>>) {
    match crate::control::Leases::give_back(
        &c.table,
        keep.map(|spec| (spec, c.consumer.as_deref())),
    )
    .await
    {
        Ok(crate::control::GaveBack::Ended { leases }) => {
            tracing::info!(table = c.table, leases, "leases given back")
        }
        Ok(crate::control::GaveBack::Kept { why }) => {
            tracing::info!(table = c.table, why, "leases run to their end")
        }
        Err(error) => {
            tracing::warn!(table = c.table, %error, "giving the leases back failed: they run to their end")
        }
    }
}

/// Completes once `stop` says `true` or its sender is gone; never without
/// one.
async fn asked_to_stop(stop: Option<tokio::sync::watch::Receiver<bool>>) {
    let Some(mut stop) = stop else {
        return std::future::pending().await;
    };
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
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
