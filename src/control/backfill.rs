//! The lifecycle backfill's choice: which projections a backfill brings to
//! the spec's definitions (those asked for, or every one `status` does not
//! show live), and the run it goes under, claimed in the registry (waiting
//! while a writer of another definition holds a lease). The scan itself
//! is the backfill job's ([`crate::backfill::backfill`]), which the caller
//! runs next.

use std::collections::HashMap;
use std::time::Duration;

use super::registry::{ClaimOutcome, Registry};
use super::status::{states, Commands, State};
use crate::apply::{Applier, ApplyError};
use crate::dynamo::time::{iso, now_ms};
use crate::spec::{ProjectionId, Spec};

/// Why a backfill cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    /// The registry could not be read or written.
    #[error(transparent)]
    Registry(#[from] ApplyError),
    /// The dead letters could not be read.
    #[error(transparent)]
    Letters(#[from] LettersError),
    /// The run's name claimed a projection once already.
    #[error("backfill `{run}` already claimed `{projection}` once (it completed, or a later backfill superseded it): give a new --run (or none) to backfill again")]
    RunUsed {
        /// The run.
        run: String,
        /// The projection.
        projection: String,
    },
    /// A writer of another definition holds a lease past the wait.
    #[error("a writer of another definition ({other}) of `{projection}` holds a lease until {}, past --wait: a backfill started before then could be undone by it. Deploy this spec (so that the old definition stops running) or wait, then backfill again", iso(*until))]
    Leased {
        /// The projection.
        projection: String,
        /// The other definition.
        other: String,
        /// Its lease (ms).
        until: u64,
    },
}

/// The dead letters of a table could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the dead letters of {table}: {message}")]
pub struct LettersError {
    /// The table.
    pub table: String,
    /// What the read said.
    pub message: String,
}

/// Which projections a backfill brings to the spec's definitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillChoice {
    /// Those asked for (by name, or every one).
    Asked(Vec<ProjectionId>),
    /// None was asked for: those `status` does not show live.
    NotLive(Vec<ProjectionId>),
    /// None was asked for, and every projection is live.
    AllLive,
}

/// Open dead letters of `applier`'s table by projection (its consumer's
/// letters of whole records under [`Applier::whole_record`]).
pub async fn open_letters(applier: &Applier) -> Result<HashMap<String, usize>, LettersError> {
    let letters = applier
        .dead_letter_store()
        .list()
        .await
        .map_err(|error| LettersError {
            table: applier.table().to_string(),
            message: format!("{error:?}"),
        })?;
    let mut by_projection: HashMap<String, usize> = HashMap::new();
    for letter in &letters {
        *by_projection.entry(letter.projection.clone()).or_default() += 1;
    }
    Ok(by_projection)
}

/// What a backfill of `applier`'s spec brings to its definitions: `asked`
/// (by name), every projection (`all`), or else what `status` says needs
/// it (`commands` spells its suggestions).
pub async fn choose_projections(
    registry: &Registry,
    applier: &Applier,
    commands: &Commands,
    asked: Option<Vec<ProjectionId>>,
    all: bool,
) -> Result<BackfillChoice, BackfillError> {
    let spec = applier.spec();
    // Counters' old versions are kept current by the worker, not backfilled.
    let every: Vec<ProjectionId> = spec.backfilled_projections();
    Ok(match asked {
        Some(ids) => BackfillChoice::Asked(ids),
        None if all => BackfillChoice::Asked(every),
        None => {
            // What `status` says needs it: every projection not live.
            let snapshot = registry.snapshot(spec).await?;
            let letters = open_letters(applier).await?;
            // Held projections need a redrive, not a backfill.
            let needed: Vec<ProjectionId> = states(
                spec,
                &snapshot,
                now_ms(),
                registry.skew_ms(),
                &letters,
                commands,
            )
            .into_iter()
            .filter(|row| !matches!(row.state, State::Live | State::Held | State::Serving))
            .filter_map(|row| spec.projection_id(&row.name))
            .collect();
            if needed.is_empty() {
                BackfillChoice::AllLive
            } else {
                BackfillChoice::NotLive(needed)
            }
        }
    })
}

/// A new run name: the time and the process, unique enough for a table.
fn new_run() -> String {
    format!("cli-{:x}-{:x}", now_ms(), std::process::id())
}

/// The run a backfill of `ids` goes under, claimed: `run` when given,
/// else (`resume`) the run that claimed exactly these, else a new one.
/// Waits at most `wait` while a writer of another definition holds a
/// lease; `note` hears what it resumes, starts and waits for.
pub async fn claim_run(
    registry: &Registry,
    spec: &Spec,
    ids: &[ProjectionId],
    run: Option<&str>,
    resume: bool,
    wait: Duration,
    note: &mut (dyn FnMut(&str) + Send),
) -> Result<String, BackfillError> {
    let run = match (run, resume) {
        (Some(run), _) => run.to_string(),
        (None, true) => match registry.claimed_run(spec, ids).await? {
            Some(run) => {
                note(&format!("resuming backfill `{run}`"));
                run
            }
            None => {
                let run = new_run();
                note(&format!("no backfill of exactly these projections is under way: starting `{run}` from the beginning"));
                run
            }
        },
        (None, false) => new_run(),
    };
    claim(registry, spec, ids, &run, wait, note).await?;
    Ok(run)
}

/// Claims `ids` for `run`, waiting while a writer of another definition
/// holds a lease (at most `wait`).
async fn claim(
    registry: &Registry,
    spec: &Spec,
    ids: &[ProjectionId],
    run: &str,
    wait: Duration,
    note: &mut (dyn FnMut(&str) + Send),
) -> Result<(), BackfillError> {
    let give_up = now_ms() + wait.as_millis() as u64;
    loop {
        match registry.claim(spec, ids, run).await? {
            ClaimOutcome::Claimed => return Ok(()),
            ClaimOutcome::RunUsed { projection } => {
                return Err(BackfillError::RunUsed {
                    run: run.to_string(),
                    projection,
                })
            }
            ClaimOutcome::Wait {
                projection,
                other,
                until,
            } => {
                if until > give_up {
                    return Err(BackfillError::Leased {
                        projection,
                        other,
                        until,
                    });
                }
                note(&format!(
                    "waiting until {} for the writers of another definition ({other}) of `{projection}` to stop",
                    iso(until)
                ));
                let left = until.saturating_sub(now_ms()) + 200;
                tokio::time::sleep(Duration::from_millis(left)).await;
            }
        }
    }
}
