//! One resume model for the long jobs: a job's progress is stored in the
//! table under its run's name, and the table remembers the last run of
//! each job and scope, so `--resume` continues it and `--run NAME` names
//! one (the same name on a second attempt, or on another machine).
//!
//! `backfill` keeps its runs in the lifecycle registry ([`super::claim_run`]:
//! a run claims its projections); `audit`, `prune` and `replay` keep the
//! pointer here, one item per job and scope:
//!
//! | partition key | sort key | holds |
//! | --- | --- | --- |
//! | `_ddbp#runs` | `<job>#<scope>` | `run` (its name), `done` (it ran to its end), `startedAt`, `updatedAt` (ms) |
//!
//! Tables without a sort key: partition key `_ddbp#runs#<job>#<scope>`.
//! A scope is what the job works on (`audit`: the table and its segments;
//! `prune`: the projections; `replay`: the stream and the projections), so
//! `--resume` never continues a run of something else.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue as Av;

use crate::apply::ApplyError;
use crate::dynamo::names::RUNS_PK;
use crate::dynamo::retry::describe;
use crate::dynamo::time::{iso, now_ms};
use crate::schema::TableSpec;

/// A long job whose runs can be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// `audit --run` / `--resume`.
    Audit,
    /// `prune`.
    Prune,
    /// `replay --run` / `--resume`.
    Replay,
}

impl Job {
    /// The job's name, as keys and messages use it.
    pub fn as_str(self) -> &'static str {
        match self {
            Job::Audit => "audit",
            Job::Prune => "prune",
            Job::Replay => "replay",
        }
    }
}

/// The last run of a job and scope, as the table remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastRun {
    /// Its name.
    pub run: String,
    /// It ran to its end.
    pub done: bool,
    /// When it was started (ms).
    pub started_ms: u64,
}

/// The run a job goes under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// Its name.
    pub run: String,
    /// It continues from the progress stored under that name, if any
    /// (`false`: it starts from the beginning).
    pub resumed: bool,
    /// When the run was first started (ms): a resumed job judges what
    /// happened "during" it from then.
    pub started_ms: u64,
}

/// Checks a run's name: what a Step Functions execution name may hold,
/// never `#` or `/`, which the progress items' keys use.
pub fn check_run_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= 80
        && name
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '#' | '/'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a run name: use 1 to 80 characters without spaces, `#` or `/`"
        ))
    }
}

/// A new run's name: the job and the time, e.g. `audit-20261128T173000123Z`.
pub fn new_run(job: Job) -> String {
    let stamp: String = iso(now_ms())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    format!("{}-{stamp}", job.as_str())
}

/// The table's pointers to the last run of each job.
#[derive(Debug, Clone)]
pub struct Runs {
    client: aws_sdk_dynamodb::Client,
    table: String,
    pk: String,
    sk: Option<String>,
}

impl Runs {
    /// The pointers of `table`, whose keys `keys` names.
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str, keys: &TableSpec) -> Runs {
        Runs {
            client,
            table: table.to_string(),
            pk: keys.partition_key.clone(),
            sk: keys.sort_key.clone(),
        }
    }

    fn key(&self, job: Job, scope: &str) -> HashMap<String, Av> {
        let member = format!("{}#{scope}", job.as_str());
        match &self.sk {
            Some(sk) => HashMap::from([
                (self.pk.clone(), Av::S(RUNS_PK.to_string())),
                (sk.clone(), Av::S(member)),
            ]),
            None => HashMap::from([(self.pk.clone(), Av::S(format!("{RUNS_PK}#{member}")))]),
        }
    }

    fn fatal(&self, what: &str, error: String) -> ApplyError {
        ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("{what}: {error}"),
        }
    }

    /// The last run of `job` over `scope`, if one was started.
    pub async fn last(&self, job: Job, scope: &str) -> Result<Option<LastRun>, ApplyError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.key(job, scope)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                self.fatal(
                    &format!("reading the last {} run", job.as_str()),
                    describe(&e),
                )
            })?;
        let Some(item) = output.item() else {
            return Ok(None);
        };
        let Some(Av::S(run)) = item.get("run") else {
            return Ok(None);
        };
        let started_ms = match item.get("startedAt") {
            Some(Av::N(n)) => n.parse().unwrap_or(0),
            _ => 0,
        };
        Ok(Some(LastRun {
            run: run.clone(),
            done: matches!(item.get("done"), Some(Av::Bool(true))),
            started_ms,
        }))
    }

    /// Writes the pointer; with `only_if`, only while it still names that
    /// run (a run finishing never overwrites a newer run's pointer).
    async fn put(
        &self,
        job: Job,
        scope: &str,
        run: &str,
        done: bool,
        started_ms: u64,
        only_if: Option<&str>,
    ) -> Result<(), ApplyError> {
        let mut item = self.key(job, scope);
        item.insert("run".to_string(), Av::S(run.to_string()));
        item.insert("done".to_string(), Av::Bool(done));
        item.insert("startedAt".to_string(), Av::N(started_ms.to_string()));
        item.insert("updatedAt".to_string(), Av::N(now_ms().to_string()));
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        if let Some(named) = only_if {
            put = put
                .condition_expression("#run = :run")
                .expression_attribute_names("#run", "run")
                .expression_attribute_values(":run", Av::S(named.to_string()));
        }
        match put.send().await {
            Ok(_) => Ok(()),
            Err(e)
                if only_if.is_some()
                    && e.as_service_error()
                        .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(self.fatal(
                &format!("recording the {} run `{run}`", job.as_str()),
                describe(&e),
            )),
        }
    }

    /// The run `job` over `scope` goes under, recorded as its last: `run`
    /// when named (resumed when it is the last run and did not finish);
    /// with `resume`, the last run if it did not finish, else a new one;
    /// else a new one. `note` hears which.
    pub async fn choose(
        &self,
        job: Job,
        scope: &str,
        run: Option<&str>,
        resume: bool,
        note: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Chosen, ApplyError> {
        let last = self.last(job, scope).await?;
        let name = job.as_str();
        let chosen = match (run, last) {
            (Some(run), Some(last)) if last.run == run && last.done => {
                note(&format!(
                    "{name} `{run}` ran to its end: starting it again from the beginning"
                ));
                Chosen {
                    run: run.to_string(),
                    resumed: false,
                    started_ms: now_ms(),
                }
            }
            (Some(run), Some(last)) if last.run == run => {
                note(&format!("resuming {name} `{run}`"));
                Chosen {
                    run: run.to_string(),
                    resumed: true,
                    started_ms: last.started_ms,
                }
            }
            (Some(run), _) => {
                check_run_name(run).map_err(|e| self.fatal(&format!("--run for {name}"), e))?;
                note(&format!(
                    "running {name} `{run}` (from its progress in the table, if it has any)"
                ));
                Chosen {
                    run: run.to_string(),
                    resumed: true,
                    started_ms: now_ms(),
                }
            }
            (None, Some(last)) if resume && !last.done => {
                note(&format!(
                    "resuming {name} `{}` (started {})",
                    last.run,
                    iso(last.started_ms)
                ));
                Chosen {
                    run: last.run,
                    resumed: true,
                    started_ms: last.started_ms,
                }
            }
            (None, last) => {
                let run = new_run(job);
                if resume {
                    match last {
                        Some(last) => note(&format!(
                            "the last {name}, `{}`, ran to its end: starting `{run}` from the beginning",
                            last.run
                        )),
                        None => note(&format!(
                            "no {name} of this scope was started: starting `{run}` from the beginning"
                        )),
                    }
                } else {
                    note(&format!(
                        "starting {name} `{run}` (if it stops, continue it with --resume or --run {run})"
                    ));
                }
                Chosen {
                    run,
                    resumed: false,
                    started_ms: now_ms(),
                }
            }
        };
        self.put(job, scope, &chosen.run, false, chosen.started_ms, None)
            .await?;
        Ok(chosen)
    }

    /// [`Runs::choose`], as a [`JobRun`] to finish once the job ran to its
    /// end.
    pub async fn start(
        self,
        job: Job,
        scope: String,
        run: Option<&str>,
        resume: bool,
        note: &mut (dyn FnMut(&str) + Send),
    ) -> Result<JobRun, ApplyError> {
        let chosen = self.choose(job, &scope, run, resume, note).await?;
        Ok(JobRun {
            runs: self,
            job,
            scope,
            chosen,
        })
    }

    /// Records that `run` of `job` over `scope` ran to its end: `--resume`
    /// starts a new one.
    pub async fn finish(&self, job: Job, scope: &str, run: &str) -> Result<(), ApplyError> {
        let Some(last) = self.last(job, scope).await?.filter(|last| last.run == run) else {
            // Another run is the last now: it is the one to resume.
            return Ok(());
        };
        self.put(job, scope, run, true, last.started_ms, Some(run))
            .await
    }
}

/// A job's run, chosen and recorded as its job's last.
#[derive(Debug, Clone)]
pub struct JobRun {
    runs: Runs,
    job: Job,
    scope: String,
    /// The run.
    pub chosen: Chosen,
}

impl JobRun {
    /// Records that the run ran to its end.
    pub async fn finish(&self) -> Result<(), ApplyError> {
        self.runs
            .finish(self.job, &self.scope, &self.chosen.run)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_name_is_a_valid_one_and_names_its_job() {
        let run = new_run(Job::Replay);
        assert!(run.starts_with("replay-2"), "{run}");
        check_run_name(&run).unwrap();
    }

    #[test]
    fn a_run_name_with_a_key_separator_is_refused() {
        for bad in ["", "a#b", "a/b", "a b", &"x".repeat(81)] {
            let error = check_run_name(bad).expect_err(bad);
            assert!(error.contains("is not a run name"), "{error}");
        }
        check_run_name("nightly-2026-11-28").unwrap();
    }
}
