//! A Kinesis stream's batch: the changes Kinesis Data Streams for
//! DynamoDB sends of one or more tables, each routed by its `tableName`.
//!
//! A Kinesis stream may hold one change twice and one item's changes in
//! any order, across batches and shards, so no record's image is applied:
//! each names an item that changed, and the item is derived as it is now
//! ([`crate::apply::Applier::current_states`]), every write guarded by the
//! state read. A duplicate or a late record then changes nothing, and the
//! last record of an item to be applied derives it from its latest state.
//! Records are reported by the Kinesis sequence number of the first one
//! not handled, as for a DynamoDB stream.

use std::collections::HashMap;
use std::sync::Arc;

use aws_lambda_events::event::streams::DynamoDbEventResponse;
use lambda_runtime::Context;
use tokio::time::Instant;

use super::event::StreamsEvent;
use super::handler::{batch_response, Handler, InvocationError, RoleError};
use crate::apply::{ApplyConfig, BatchOptions, BatchStats, RecordStatus};
use crate::decode::{DecodeProblem, Decoded};
use crate::record::Origin;
use crate::spec::Spec;

/// What a table of the batch is to this function.
enum Served {
    /// Applied under this spec.
    Spec(Arc<Spec>),
    /// Another region projects it: its records are handled.
    Away(String),
    /// Nothing serves it: its records are dead letters naming it.
    Unserved(String),
    /// Cannot be told now: its records fail, to be delivered again.
    Failed(String),
}

impl Handler {
    /// Applies a Kinesis batch: groups its records by table, derives each
    /// group's items as they are now under the table's spec, and reports
    /// the first record not handled.
    pub(super) async fn process_kinesis(
        &self,
        event: StreamsEvent,
        context: &Context,
    ) -> Result<DynamoDbEventResponse, InvocationError> {
        let started = Instant::now();
        let n = event.len();
        if n == 0 {
            super::metrics::record_invocation(0, false);
            return Ok(DynamoDbEventResponse::default());
        }
        let (deadlines, config) = self.budget(context, started);
        let config = ApplyConfig {
            stream_consumer: true,
            ..config
        };
        let mut records = event.records();
        super::metrics::record_iterator_age(&records);
        // Each table's records, in the order the batch first names it.
        let mut order: Vec<String> = Vec::new();
        let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
        let mut undecoded: Vec<usize> = Vec::new();
        for (index, decoded) in records.iter().enumerate() {
            match decoded {
                Ok(record) => {
                    let table = match &record.origin {
                        Origin::Kinesis { table_name, .. } => table_name.clone(),
                        _ => self.table.clone().unwrap_or_default(),
                    };
                    if !groups.contains_key(&table) {
                        order.push(table.clone());
                    }
                    groups.entry(table).or_default().push(index);
                }
                Err(_) => undecoded.push(index),
            }
        }
        let mut served: HashMap<String, Served> = HashMap::new();
        for table in &order {
            served.insert(table.clone(), self.serve(table).await?);
        }
        // Dead letters of records no table can take (undecodable, or of a
        // table nothing serves) go to the function's table, else to the
        // first table of the batch it serves.
        let letters_table = self.table.clone().or_else(|| {
            self.specs
                .specs()
                .first()
                .filter(|_| self.specs.specs().len() == 1 && self.registered.is_none())
                .map(|spec| spec.table.name.clone())
                .or_else(|| {
                    order
                        .iter()
                        .find(|t| matches!(served.get(*t), Some(Served::Spec(_))))
                        .cloned()
                })
        });
        let mut statuses: Vec<Option<RecordStatus>> = vec![None; n];
        let mut letters: Vec<usize> = undecoded;
        for table in &order {
            let indexes = &groups[table];
            match &served[table] {
                Served::Spec(_) => {}
                Served::Away(home) => {
                    for &i in indexes {
                        statuses[i] = Some(RecordStatus::Skipped(format!(
                            "table `{table}` is projected from its home region {home}"
                        )));
                    }
                    metrics::counter!("projector_records_left_to_home_total")
                        .increment(indexes.len() as u64);
                }
                Served::Failed(reason) => {
                    for &i in indexes {
                        statuses[i] = Some(RecordStatus::Failed(reason.clone()));
                    }
                }
                Served::Unserved(reason) => {
                    for &i in indexes {
                        let record = records[i].as_ref().expect("grouped when decoded");
                        // Another deployment's own items (its checkpoints,
                        // letters, leases) are its bookkeeping: a letter of
                        // each would come back to it, and so on.
                        let reserved = record.keys.iter().any(|(_, value)| {
                            value.as_str().is_some_and(|v| {
                                v.starts_with(crate::dynamo::names::RESERVED_PREFIX)
                            })
                        });
                        if reserved {
                            statuses[i] = Some(RecordStatus::Skipped(
                                crate::plan::Skip::Reserved.to_string(),
                            ));
                            continue;
                        }
                        records[i] = Err(DecodeProblem {
                            index: i,
                            event_id: Some(record.event_id.clone()),
                            sequence_number: Some(record.sequence_number.0.clone()),
                            reason: reason.clone(),
                            raw: serde_json::to_value(record).unwrap_or_default(),
                        });
                    }
                    let lettered: Vec<usize> = indexes
                        .iter()
                        .copied()
                        .filter(|&i| statuses[i].is_none())
                        .collect();
                    metrics::counter!("projector_records_of_another_table_total")
                        .increment(lettered.len() as u64);
                    letters.extend(lettered);
                }
            }
        }
        letters.sort_unstable();
        let mut work: Vec<(String, Vec<usize>)> = order
            .iter()
            .filter(|t| matches!(served[*t], Served::Spec(_)))
            .map(|t| (t.clone(), groups[t].clone()))
            .collect();
        if !letters.is_empty() {
            match &letters_table {
                Some(table) => match work.iter_mut().find(|(t, _)| t == table) {
                    Some((_, indexes)) => {
                        indexes.extend(&letters);
                        indexes.sort_unstable();
                    }
                    None => work.push((table.clone(), letters.clone())),
                },
                None => {
                    return Err(InvocationError::Apply(crate::apply::ApplyError::Fatal {
                        table: String::new(),
                        message: format!(
                            "{} record(s) of the Kinesis batch cannot be applied (the first: {}) and the function has no table to keep their dead letters in: set PROJECTOR_TABLE",
                            letters.len(),
                            match &records[letters[0]] {
                                Err(problem) => problem.to_string(),
                                Ok(_) => "a record".to_string(),
                            }
                        ),
                    }))
                }
            }
        }
        let mut stats = BatchStats::default();
        let mut items_read = 0usize;
        let run = async {
            for (table, indexes) in &work {
                let spec = match served.get(table) {
                    Some(Served::Spec(spec)) => spec.clone(),
                    _ => match self.spec_for(table).await {
                        Ok(Some(spec)) => spec,
                        _ => {
                            for &i in indexes {
                                statuses[i] = Some(RecordStatus::Failed(format!(
                                    "no spec of table `{table}` to keep the dead letter in"
                                )));
                            }
                            continue;
                        }
                    },
                };
                let spec = match crate::control::current_layout(&self.client, table, &spec).await {
                    Ok(spec) => spec,
                    Err(error) => {
                        for &i in indexes {
                            statuses[i] = Some(RecordStatus::Failed(format!(
                                "reading the counters' layout of `{table}`: {error}"
                            )));
                        }
                        continue;
                    }
                };
                let applier =
                    crate::control::applier(self.client.clone(), spec, table, config.clone());
                let group: Decoded = indexes.iter().map(|&i| records[i].clone()).collect();
                let states = match applier.current_states(group, None).await {
                    Ok(states) => states,
                    Err(error) => {
                        for &i in indexes {
                            statuses[i] = Some(RecordStatus::Failed(format!(
                                "reading the current state of the batch's items of `{table}`: {error}"
                            )));
                        }
                        continue;
                    }
                };
                items_read += states.items_read;
                let options = BatchOptions {
                    deadline: Some(deadlines.stop_writes),
                    read_markers_first: true,
                    check_states: true,
                    ..BatchOptions::default()
                };
                let outcome = applier.apply_batch(&states.records, &options).await?;
                stats.add(&outcome.stats);
                for (k, &i) in indexes.iter().enumerate() {
                    statuses[i] = Some(outcome.statuses[states.stands_for[k]].clone());
                }
            }
            Ok::<(), crate::apply::ApplyError>(())
        };
        let abandoned = match tokio::time::timeout_at(deadlines.abandon, run).await {
            Ok(Ok(())) => 0,
            Ok(Err(error)) => {
                super::metrics::record_invocation(0, false);
                return Err(error.into());
            }
            Err(_) => {
                let unfinished = statuses.iter().filter(|s| s.is_none()).count();
                tracing::warn!(
                    request_id = %context.request_id,
                    records = n,
                    unfinished,
                    "the deadline came before the batch was written; reporting the unfinished records failed"
                );
                unfinished
            }
        };
        let statuses: Vec<RecordStatus> = statuses
            .into_iter()
            .map(|status| {
                status.unwrap_or_else(|| {
                    RecordStatus::Failed(
                        "the invocation's deadline came before its writes finished".to_string(),
                    )
                })
            })
            .collect();
        let response = batch_response(&records, &statuses)?;
        super::metrics::record_invocation(abandoned, !response.batch_item_failures.is_empty());
        let count = |f: fn(&RecordStatus) -> bool| statuses.iter().filter(|s| f(s)).count();
        tracing::info!(
            request_id = %context.request_id,
            source = "kinesis",
            tables = order.len(),
            records = n,
            items_read,
            applied = count(|s| matches!(s, RecordStatus::Applied)),
            skipped = count(|s| matches!(s, RecordStatus::Skipped(_))),
            dead_lettered = count(|s| matches!(s, RecordStatus::DeadLettered(_))),
            failed = count(|s| matches!(s, RecordStatus::Failed(_))),
            effects = stats.effects,
            writes = stats.writes,
            write_units = stats.write_units,
            retries = stats.retries,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "batch done"
        );
        if let Some(index) = statuses.iter().position(|s| !s.is_handled()) {
            let reason = match &statuses[index] {
                RecordStatus::Failed(reason) => reason.as_str(),
                _ => "",
            };
            tracing::warn!(
                request_id = %context.request_id,
                index,
                reason,
                "first record not handled; it and the records after it will be delivered again"
            );
        }
        Ok(response)
    }

    /// What `table` is to this function: its spec, another region's, or
    /// nothing it serves.
    async fn serve(&self, table: &str) -> Result<Served, InvocationError> {
        // A spec file that fits any table serves `PROJECTOR_TABLE` alone
        // when it is set: another table's changes are not its.
        let named = match (&self.registered, &self.table) {
            (None, Some(own)) if own != table => Ok(self
                .specs
                .specs()
                .iter()
                .find(|spec| spec.table.name == table)
                .cloned()),
            _ => self.spec_for(table).await,
        };
        let spec = match named {
            Ok(Some(spec)) => spec,
            Ok(None) => {
                return Ok(Served::Unserved(format!(
                    "the change is of table `{table}`, which no spec of this function describes (its specs describe {}): add its spec, or stop sending its changes to this Kinesis stream",
                    self.specs.tables()
                )))
            }
            Err(error) => {
                let text = error.to_string();
                if text.contains("ResourceNotFound") || text.contains("does not exist") {
                    return Ok(Served::Unserved(format!(
                        "the change is of table `{table}`, which this function cannot find in its region ({text})"
                    )));
                }
                return Ok(Served::Failed(text));
            }
        };
        match self.regions.role(&self.client, table, &spec).await {
            Ok(crate::global::Role::Away { home }) => Ok(Served::Away(home)),
            Ok(_) => Ok(Served::Spec(spec)),
            Err(RoleError::Global(error)) => Err(InvocationError::Global(error)),
            Err(RoleError::Describe(error)) if error.contains("does not exist") => {
                Ok(Served::Unserved(format!(
                    "the change is of table `{table}`, which does not exist in this function's region ({error})"
                )))
            }
            Err(RoleError::Describe(error)) => Ok(Served::Failed(format!(
                "describing table `{table}`: {error}"
            ))),
        }
    }
}
