//! A backfill slice: one scan segment, for as long as one invocation allows.
//!
//! The payload `{"backfill": {"segment": 0, "totalSegments": 4}}` runs
//! [`crate::backfill::backfill`] for that one segment, continuing from the
//! segment's checkpoint, and stops starting scan pages once the invocation's
//! time less the margin (`PROJECTOR_DEADLINE_MARGIN_MS`) is used. The answer
//! ([`BackfillResponse`]) says whether the segment is `done`; a Step
//! Functions loop (`infra/template.yaml`, `BackfillStateMachine`) invokes
//! again until it is. Each page is checkpointed once written, so a slice cut
//! short, retried or repeated redoes at most one page, and redoing it is
//! harmless (the backfill is idempotent).
//!
//! | field | meaning |
//! | --- | --- |
//! | `projections` | projection names (absent, `null` or `[]`: all) |
//! | `segment` | the scan segment, from 0 (default 0) |
//! | `totalSegments` | how many segments the table is scanned in (default 1) |
//! | `maxWcu`, `maxRcu` | consumed capacity per second this invocation stays under |
//! | `pageSize` | items per scan page (default 200) |
//! | `restart` | ignore the segment's checkpoint and scan it from the start |
//! | `run` | the backfill's name, the same in every slice (the state machine sends its execution name): the lifecycle registry records the projections backfilled once every segment of the run is done; without it the slice is not recorded |
//! | `claim` | with `run`: claim the projections for the run and scan nothing (the state machine's first step); fails with `Projector.OtherDefinitionRunning` while a writer of another definition holds a lease |
//!
//! A dry run is refused: it keeps no checkpoint, so it could not continue in
//! the next invocation (`ddb-projector backfill --dry-run` does it).

use lambda_runtime::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::handler::{Handler, InvocationError};
use crate::backfill::{BackfillOptions, BackfillSummary};
use crate::spec::Spec;

/// DynamoDB's limit on `TotalSegments`.
pub const MAX_TOTAL_SEGMENTS: u32 = 1_000_000;

/// The `backfill` object of a backfill payload, as sent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackfillRequest {
    /// The table (default: `PROJECTOR_TABLE`, else the table of the only
    /// spec; required when the function serves several tables).
    #[serde(default)]
    pub table: Option<String>,
    /// Projections by name (`None` or empty: all).
    #[serde(default)]
    pub projections: Option<Vec<String>>,
    /// The scan segment, from 0.
    #[serde(default)]
    pub segment: u32,
    /// The number of scan segments.
    #[serde(default = "one")]
    pub total_segments: u32,
    /// Consumed write capacity per second to stay under.
    #[serde(default)]
    pub max_wcu: Option<f64>,
    /// Consumed read capacity per second to stay under.
    #[serde(default)]
    pub max_rcu: Option<f64>,
    /// Items per scan page.
    #[serde(default)]
    pub page_size: Option<u32>,
    /// Start the segment over instead of continuing from its checkpoint.
    #[serde(default)]
    pub restart: Option<bool>,
    /// Refused (see the module documentation); accepted here so that the
    /// error says why instead of "unknown field".
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// The backfill run, the same in every slice.
    #[serde(default)]
    pub run: Option<String>,
    /// Claim the projections for `run` and scan nothing.
    #[serde(default)]
    pub claim: Option<bool>,
}

fn one() -> u32 {
    1
}

impl Default for BackfillRequest {
    fn default() -> Self {
        BackfillRequest {
            table: None,
            projections: None,
            segment: 0,
            total_segments: 1,
            max_wcu: None,
            max_rcu: None,
            page_size: None,
            restart: None,
            dry_run: None,
            run: None,
            claim: None,
        }
    }
}

/// Why a backfill request cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackfillRequestError {
    /// A projection name the spec does not have.
    #[error("backfill: no projection `{name}` in {file} (known: {known})")]
    UnknownProjection {
        /// The name sent.
        name: String,
        /// The spec file.
        file: String,
        /// The spec's projection names, comma-separated.
        known: String,
    },
    /// `totalSegments` is 0.
    #[error("backfill: totalSegments is 0: it must be at least 1 (the number of parallel scan segments)")]
    NoSegments,
    /// `totalSegments` is over DynamoDB's limit.
    #[error("backfill: totalSegments {0} is more than DynamoDB's limit of {MAX_TOTAL_SEGMENTS}")]
    TooManySegments(u32),
    /// `segment` is not below `totalSegments`.
    #[error("backfill: segment {segment} is out of range for totalSegments {total} (segments count from 0 to {last})", last = total - 1)]
    SegmentOutOfRange {
        /// The segment sent.
        segment: u32,
        /// `totalSegments`.
        total: u32,
    },
    /// A rate that is not a positive number.
    #[error("backfill: {field} is {value}: it must be a positive number of capacity units per second (omit it for no limit)")]
    NotPositive {
        /// `maxWcu` or `maxRcu`.
        field: &'static str,
        /// The value sent.
        value: f64,
    },
    /// `pageSize` is 0.
    #[error("backfill: pageSize is 0: it must be at least 1")]
    NoPageSize,
    /// `claim` without `run`.
    #[error("backfill: claim needs run: the name of the backfill every slice will send")]
    ClaimWithoutRun,
    /// `run` is empty.
    #[error(
        "backfill: run is empty: name the backfill (the state machine sends its execution name)"
    )]
    EmptyRun,
    /// A claim with the name of a run that already claimed once.
    #[error("backfill: run `{run}` already claimed `{projection}` once (it completed, or a later run superseded it): start a new execution (or send a new run) to backfill again")]
    RunDone {
        /// The run.
        run: String,
        /// The projection it completed.
        projection: String,
    },
    /// `dryRun` is true.
    #[error("backfill: dryRun is not supported in Lambda: a dry run keeps no checkpoint, so it cannot continue in the next invocation; run `ddb-projector backfill --dry-run` instead")]
    DryRun,
}

/// A validated request: the library's options and the projections by name.
#[derive(Debug, Clone)]
pub struct BackfillPlan {
    /// What [`crate::backfill::backfill`] is given (without the deadline).
    pub options: BackfillOptions,
    /// The projections backfilled, by name (every one when none was named).
    pub projections: Vec<String>,
}

impl BackfillRequest {
    /// Checks the request against `spec`; every check that fails is named.
    pub fn plan(&self, spec: &Spec) -> Result<BackfillPlan, BackfillRequestError> {
        if self.dry_run == Some(true) {
            return Err(BackfillRequestError::DryRun);
        }
        let total = self.total_segments;
        if total == 0 {
            return Err(BackfillRequestError::NoSegments);
        }
        if total > MAX_TOTAL_SEGMENTS {
            return Err(BackfillRequestError::TooManySegments(total));
        }
        if self.segment >= total {
            return Err(BackfillRequestError::SegmentOutOfRange {
                segment: self.segment,
                total,
            });
        }
        for (field, value) in [("maxWcu", self.max_wcu), ("maxRcu", self.max_rcu)] {
            if let Some(value) = value.filter(|v| !(*v > 0.0 && v.is_finite())) {
                return Err(BackfillRequestError::NotPositive { field, value });
            }
        }
        if self.page_size == Some(0) {
            return Err(BackfillRequestError::NoPageSize);
        }
        if self.run.as_deref() == Some("") {
            return Err(BackfillRequestError::EmptyRun);
        }
        if self.claim == Some(true) && self.run.is_none() {
            return Err(BackfillRequestError::ClaimWithoutRun);
        }
        let names = self.projections.as_deref().unwrap_or_default();
        let ids = if names.is_empty() {
            None
        } else {
            let mut ids = Vec::with_capacity(names.len());
            for name in names {
                // A counter's old version is kept current by the worker,
                // never backfilled on its own.
                let id = spec
                    .projection_id(name)
                    .filter(|&id| !spec.is_old_version(id))
                    .ok_or_else(|| BackfillRequestError::UnknownProjection {
                        name: name.clone(),
                        file: spec.file.clone(),
                        known: spec
                            .backfilled_projections()
                            .into_iter()
                            .map(|id| spec.projections[id].name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })?;
                ids.push(id);
            }
            Some(ids)
        };
        let projections = match &ids {
            Some(_) => names.to_vec(),
            None => spec
                .backfilled_projections()
                .into_iter()
                .map(|id| spec.projections[id].name.clone())
                .collect(),
        };
        let defaults = BackfillOptions::default();
        Ok(BackfillPlan {
            options: BackfillOptions {
                projections: ids,
                segments: vec![self.segment],
                total_segments: total,
                max_wcu: self.max_wcu,
                max_rcu: self.max_rcu,
                resume: self.restart != Some(true),
                dry_run: false,
                page_size: self
                    .page_size
                    .map_or(defaults.page_size, |n| n.min(i32::MAX as u32) as i32),
                progress: false,
                max_pages: None,
                deadline: None,
                run: self.run.clone(),
            },
            projections,
        })
    }
}

/// The answer to a backfill invocation: invoke again while `done` is false.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackfillResponse {
    /// The segment has been read to its end (by this or an earlier invocation).
    pub done: bool,
    /// The segment.
    pub segment: u32,
    /// The number of segments.
    pub total_segments: u32,
    /// The projections backfilled.
    pub projections: Vec<String>,
    /// The table scanned.
    pub table: String,
    /// Items scanned by this invocation.
    pub scanned: u64,
    /// Items of those for which something was planned.
    pub changed: u64,
    /// Effects planned.
    pub effects: u64,
    /// Write requests sent.
    pub writes: u64,
    /// Write capacity consumed.
    pub write_units: f64,
    /// Read capacity consumed.
    pub read_units: f64,
    /// Records dead-lettered.
    pub dead_letters: u64,
    /// Time this invocation spent.
    pub seconds: f64,
    /// The request was a claim: the projections are the run's.
    pub claimed: bool,
    /// Projections the lifecycle registry now records as backfilled (this
    /// slice found every segment of the run done).
    pub backfilled: Vec<String>,
    /// Projections of a complete run it could not record, and why.
    pub not_backfilled: Vec<(String, String)>,
}

impl BackfillResponse {
    fn new(plan: &BackfillPlan, table: &str, summary: &BackfillSummary) -> BackfillResponse {
        BackfillResponse {
            done: summary.is_done(),
            segment: plan.options.segments[0],
            total_segments: plan.options.total_segments,
            projections: plan.projections.clone(),
            table: table.to_string(),
            scanned: summary.scanned,
            changed: summary.planned,
            effects: summary.effects,
            writes: summary.writes,
            write_units: summary.write_units,
            read_units: summary.read_units,
            dead_letters: summary.dead_letters,
            seconds: summary.seconds,
            claimed: false,
            backfilled: summary.backfilled.clone(),
            not_backfilled: summary.not_backfilled.clone(),
        }
    }
}

impl Handler {
    /// Claims the projections of `plan` for `run` in the lifecycle registry.
    async fn claim(
        &self,
        spec: &Spec,
        plan: &BackfillPlan,
        table: &str,
        run: &str,
        started: Instant,
    ) -> Result<BackfillResponse, InvocationError> {
        let registry = crate::control::Registry::new(self.client.clone(), table, &spec.table);
        let ids: Vec<_> = match &plan.options.projections {
            Some(ids) => ids.clone(),
            None => spec.backfilled_projections(),
        };
        match registry.claim(spec, &ids, run).await? {
            crate::control::ClaimOutcome::Claimed => {
                let summary = BackfillSummary {
                    seconds: started.elapsed().as_secs_f64(),
                    ..BackfillSummary::default()
                };
                let mut response = BackfillResponse::new(plan, table, &summary);
                response.claimed = true;
                response.done = false;
                Ok(response)
            }
            crate::control::ClaimOutcome::RunUsed { projection } => {
                Err(InvocationError::Backfill(BackfillRequestError::RunDone {
                    run: run.to_string(),
                    projection,
                }))
            }
            crate::control::ClaimOutcome::Wait {
                projection,
                other,
                until,
            } => Err(InvocationError::OtherDefinitionRunning {
                projection,
                other,
                until: crate::control::iso(until),
            }),
        }
    }

    /// Runs one backfill slice before the invocation's deadline.
    pub(super) async fn backfill(
        &self,
        request: BackfillRequest,
        context: &Context,
    ) -> Result<BackfillResponse, InvocationError> {
        let started = Instant::now();
        // A backfill payload names no stream: the table is the request's,
        // PROJECTOR_TABLE, else the only spec's.
        let (table, file_spec) = self.payload_table(request.table.as_deref()).await?;
        // A changed counter is built beside the version readers read.
        let spec = crate::control::current_layout(&self.client, &table, &file_spec).await?;
        let plan = request.plan(&spec)?;
        let segment = request.segment;
        let total = request.total_segments;
        let (deadlines, config) = self.budget(context, started);
        if deadlines.stop_writes <= started {
            // A slice that cannot start a page would answer "not done"
            // forever; failing says what to fix.
            return Err(InvocationError::BackfillNoTime {
                margin_ms: self.margin.as_millis() as u64,
            });
        }
        if let (Some(true), Some(run)) = (request.claim, &request.run) {
            return self.claim(&spec, &plan, &table, run, started).await;
        }
        let applier = crate::control::applier(self.client.clone(), spec.clone(), &table, config);
        let options = BackfillOptions {
            deadline: Some(deadlines.stop_writes),
            ..plan.options.clone()
        };
        tracing::info!(
            request_id = %context.request_id,
            table,
            segment,
            total_segments = total,
            projections = plan.projections.join(","),
            resume = options.resume,
            "backfill slice started"
        );
        let run = crate::backfill::backfill(&applier, &options);
        let summary = match tokio::time::timeout_at(deadlines.abandon, run).await {
            Ok(Ok(summary)) => summary,
            Ok(Err(error)) => {
                super::metrics::record_backfill(None);
                return Err(error.into());
            }
            Err(_) => {
                // The page in flight is not checkpointed; the next
                // invocation redoes it.
                super::metrics::record_backfill(None);
                return Err(InvocationError::BackfillAbandoned { segment, total });
            }
        };
        let response = BackfillResponse::new(&plan, &table, &summary);
        super::metrics::record_backfill(Some(response.done));
        tracing::info!(
            request_id = %context.request_id,
            table,
            segment,
            total_segments = total,
            done = response.done,
            scanned = response.scanned,
            changed = response.changed,
            writes = response.writes,
            write_units = response.write_units,
            dead_letters = response.dead_letters,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "backfill slice done"
        );
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("projections/user-service.toml"),
        )
        .expect("the shipped spec compiles")
    }

    fn request(json: serde_json::Value) -> BackfillRequest {
        serde_json::from_value(json).expect("a backfill request")
    }

    #[test]
    fn defaults_are_one_whole_segment_of_every_projection_resumed() {
        let spec = spec();
        let plan = request(serde_json::json!({})).plan(&spec).unwrap();
        assert_eq!(plan.options.segments, [0]);
        assert_eq!(plan.options.total_segments, 1);
        assert_eq!(plan.options.projections, None);
        assert!(plan.options.resume);
        assert!(!plan.options.progress);
        assert!(!plan.options.dry_run);
        let all: Vec<String> = spec.projections.iter().map(|p| p.name.clone()).collect();
        assert_eq!(plan.projections, all);
        // null and [] mean all too (what a state machine passes when no
        // projection was named).
        for projections in [serde_json::Value::Null, serde_json::json!([])] {
            let plan = request(serde_json::json!({ "projections": projections }))
                .plan(&spec)
                .unwrap();
            assert_eq!(plan.options.projections, None);
        }
    }

    #[test]
    fn a_full_request_maps_onto_the_library_options() {
        let spec = spec();
        let plan = request(serde_json::json!({
            "projections": ["email-gsi1-keys"],
            "segment": 2,
            "totalSegments": 3,
            "maxWcu": 50.5,
            "maxRcu": null,
            "pageSize": 25,
            "restart": true,
            "dryRun": false,
        }))
        .plan(&spec)
        .unwrap();
        assert_eq!(
            plan.options.projections,
            Some(vec![spec.projection_id("email-gsi1-keys").unwrap()])
        );
        assert_eq!(plan.options.segments, [2]);
        assert_eq!(plan.options.total_segments, 3);
        assert_eq!(plan.options.max_wcu, Some(50.5));
        assert_eq!(plan.options.max_rcu, None);
        assert_eq!(plan.options.page_size, 25);
        assert!(!plan.options.resume);
        assert_eq!(plan.projections, ["email-gsi1-keys"]);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let spec = spec();
        let error = |json: serde_json::Value| request(json).plan(&spec).unwrap_err().to_string();
        let message =
            error(serde_json::json!({ "projections": ["email-gsi1-keys", "emial-keys"] }));
        assert!(message.contains("no projection `emial-keys`"), "{message}");
        assert!(message.contains("user-service.toml"), "{message}");
        assert!(message.contains("email-gsi1-keys"), "{message}");
        let message = error(serde_json::json!({ "segment": 4, "totalSegments": 4 }));
        assert_eq!(
            message,
            "backfill: segment 4 is out of range for totalSegments 4 (segments count from 0 to 3)"
        );
        let message = error(serde_json::json!({ "totalSegments": 0 }));
        assert!(message.contains("totalSegments is 0"), "{message}");
        let message = error(serde_json::json!({ "totalSegments": 1_000_001 }));
        assert!(message.contains("limit of 1000000"), "{message}");
        let message = error(serde_json::json!({ "maxWcu": 0 }));
        assert!(message.contains("maxWcu is 0"), "{message}");
        let message = error(serde_json::json!({ "maxRcu": -3.5 }));
        assert!(message.contains("maxRcu is -3.5"), "{message}");
        let message = error(serde_json::json!({ "pageSize": 0 }));
        assert!(message.contains("pageSize is 0"), "{message}");
        let message = error(serde_json::json!({ "dryRun": true }));
        assert!(message.contains("dryRun is not supported"), "{message}");
        let message = error(serde_json::json!({ "claim": true }));
        assert!(message.contains("claim needs run"), "{message}");
        let message = error(serde_json::json!({ "run": "" }));
        assert!(message.contains("run is empty"), "{message}");
    }

    #[test]
    fn a_counters_old_version_is_never_backfilled_on_its_own() {
        // The social spec laid out with `followers` rebuilt beside its
        // old version (storage `followers`, generation 0).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("projections/social-service.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut raw: crate::spec::raw::RawSpec = toml::from_str(&text).unwrap();
        let mut old = raw
            .projections
            .iter()
            .find(|p| p.name() == "followers")
            .unwrap()
            .clone();
        if let crate::spec::raw::RawProjection::Counter(counter) = &mut old {
            counter.name = "followers~0".to_string();
            counter.storage = Some("followers".to_string());
        }
        for p in &mut raw.projections {
            if let crate::spec::raw::RawProjection::Counter(counter) = p {
                if counter.name == "followers" {
                    counter.storage = Some("followers~1".to_string());
                }
            }
        }
        raw.projections.push(old);
        let spec = Spec::compile(raw, "social-service.toml", Vec::new()).unwrap();
        let message = request(serde_json::json!({ "projections": ["followers~0"] }))
            .plan(&spec)
            .unwrap_err()
            .to_string();
        assert!(message.contains("no projection `followers~0`"), "{message}");
        assert!(!message.contains("followers~0,"), "{message}");
        let plan = request(serde_json::json!({})).plan(&spec).unwrap();
        assert!(plan.projections.contains(&"followers".to_string()));
        assert!(!plan.projections.contains(&"followers~0".to_string()));
    }

    #[test]
    fn fields_are_checked_when_read() {
        let unknown =
            serde_json::from_value::<BackfillRequest>(serde_json::json!({ "segement": 1 }))
                .unwrap_err()
                .to_string();
        assert!(unknown.contains("unknown field `segement`"), "{unknown}");
        let negative =
            serde_json::from_value::<BackfillRequest>(serde_json::json!({ "segment": -1 }))
                .unwrap_err()
                .to_string();
        assert!(negative.contains("-1"), "{negative}");
    }

    #[test]
    fn the_response_is_camel_case_json() {
        let plan = request(serde_json::json!({ "segment": 1, "totalSegments": 2 }))
            .plan(&spec())
            .unwrap();
        let summary = BackfillSummary {
            scanned: 10,
            planned: 4,
            effects: 5,
            writes: 4,
            write_units: 8.0,
            read_units: 1.5,
            dead_letters: 1,
            segments_done: 0,
            segments: 1,
            seconds: 0.25,
            ..BackfillSummary::default()
        };
        let value = serde_json::to_value(BackfillResponse::new(&plan, "T", &summary)).unwrap();
        assert_eq!(value["done"], false);
        assert_eq!(value["segment"], 1);
        assert_eq!(value["totalSegments"], 2);
        assert_eq!(value["table"], "T");
        assert_eq!(value["scanned"], 10);
        assert_eq!(value["changed"], 4);
        assert_eq!(value["writes"], 4);
        assert_eq!(value["writeUnits"], 8.0);
        assert_eq!(value["readUnits"], 1.5);
        assert_eq!(value["deadLetters"], 1);
        assert_eq!(
            value["projections"],
            serde_json::json!(["email-gsi1-keys", "profile-primary-email"])
        );
    }
}
