//! One shard task: reads its shard strictly in order, applies each page
//! as a batch and moves the checkpoint past its handled prefix.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use super::api::{ApiError, Page};
use crate::apply::{ApplyError, BatchOptions, Delivered, Delivery, RecordStatus};
use crate::decode::{DecodeProblem, Decoded};
use crate::dynamo::retry::{sleep_or_stop, ErrorClass, UntilStopped, WriteError};
use crate::record::{ChangeRecord, Origin};
use crate::source::checkpoint::{Checkpoint, CheckpointError};

use super::{RunErrorKind, ShardExit, ShardRun, Shared, TaskResult, MAX_BATCH, TRIMMED};

pub(super) async fn walk_shard(
    shared: Arc<Shared>,
    mut run: ShardRun,
    mut stop: watch::Receiver<bool>,
) -> TaskResult {
    let result = walk(&shared, &mut run, &mut stop).await;
    metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone()).set(0.0);
    (run, result)
}

/// Reads one shard in order until it ends, catches up (drain) or is stopped.
async fn walk(
    shared: &Shared,
    run: &mut ShardRun,
    stop: &mut watch::Receiver<bool>,
) -> Result<ShardExit, RunErrorKind> {
    let options = &shared.options;
    let mut iterator: Option<String> = None;
    let mut empty_pages = 0u32;
    let mut failures = UntilStopped::new();
    let mut read_errors = UntilStopped::new();
    // The next page, read while the last one's checkpoint was written.
    let mut read_ahead: Option<(String, GetRecordsResult)> = None;
    loop {
        if *stop.borrow() {
            return Ok(ShardExit::Stopped);
        }
        let current = match iterator.take() {
            Some(current) => current,
            None => match shared.shard_iterator(run, stop).await? {
                Some(fresh) => fresh,
                None if *stop.borrow() => return Ok(ShardExit::Stopped),
                None => {
                    finish(shared, run).await?;
                    return Ok(ShardExit::Finished);
                }
            },
        };
        let read = match read_ahead.take() {
            Some((at, read)) if at == current => read,
            _ => get_records(shared, &run.shard_id, &current).await,
        };
        let page = match read {
            Ok(page) => {
                read_errors.reset();
                page
            }
            Err(ApiError::Expired) => {
                tracing::debug!(shard = %run.shard_id, "iterator expired; renewing from the checkpoint");
                continue;
            }
            Err(ApiError::Trimmed) => {
                if run.position.is_some() {
                    return Err(shared.records_lost(&run.shard_id, run.position.as_ref(), TRIMMED));
                }
                // The trim horizon moved while we started from it: start
                // from where it is now.
                if read_errors.wait_or_stop(stop, |_| {}).await {
                    return Ok(ShardExit::Stopped);
                }
                continue;
            }
            // Let GetShardIterator tell whether the shard is gone.
            Err(ApiError::NotFound(_)) => continue,
            Err(ApiError::Other(ErrorClass::Fatal(message), _)) => {
                return Err(shared.stream_error("GetRecords", message))
            }
            Err(error) => {
                let message = super::api_message(&error);
                let stopped = read_errors
                    .wait_or_stop(stop, |wait| {
                        tracing::warn!(shard = %run.shard_id, error = %message, wait_ms = wait.as_millis() as u64, "GetRecords failed; retrying");
                    })
                    .await;
                if stopped {
                    return Ok(ShardExit::Stopped);
                }
                // The iterator is still good unless it expired meanwhile.
                iterator = Some(current);
                continue;
            }
        };
        let next = page.next.clone();
        if page.records.is_empty() {
            let Some(next) = next else {
                finish(shared, run).await?;
                return Ok(ShardExit::Finished);
            };
            empty_pages += 1;
            // Caught up as a drain is (several empty pages in a row: one
            // may come before records), and past what was read before.
            let past = run
                .catching_up
                .as_ref()
                .is_some_and(|behind| run.position.as_ref().is_some_and(|at| at >= behind));
            if past && empty_pages >= options.empty_polls.max(1) {
                tracing::info!(shard = %run.shard_id, "caught up: records apply as they come again");
                run.catching_up = None;
            }
            metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone())
                .set(page.behind_ms.unwrap_or(0) as f64);
            // Kinesis may answer empty pages short of a shard's records:
            // caught up means at its tip too.
            let at_tip = page.behind_ms.is_none_or(|behind| behind == 0);
            if run.closed
                && at_tip
                && shared.streams.is_kinesis()
                && empty_pages >= options.empty_polls.max(1)
            {
                finish(shared, run).await?;
                return Ok(ShardExit::Finished);
            }
            if options.drain && empty_pages >= options.empty_polls.max(1) && at_tip {
                tracing::debug!(shard = %run.shard_id, empty_pages, "shard caught up");
                return Ok(ShardExit::CaughtUp);
            }
            if sleep_or_stop(stop, options.poll_interval).await {
                return Ok(ShardExit::Stopped);
            }
            iterator = Some(next);
            continue;
        }
        empty_pages = 0;
        let (handled_all, save_now) = apply_page(shared, run, page, next.is_none()).await?;
        if save_now {
            // The checkpoint and the next page go out together: one round
            // trip per batch fewer. The page is read again if the batch
            // was not all handled.
            match next.as_deref().filter(|_| handled_all) {
                Some(next) => {
                    let shard_id = run.shard_id.clone();
                    let (saved, page) = tokio::join!(
                        save(shared, run, false),
                        get_records(shared, &shard_id, next)
                    );
                    saved?;
                    read_ahead = Some((next.to_string(), page));
                }
                None => save(shared, run, handled_all && next.is_none()).await?,
            }
        }
        if !handled_all {
            let stopped = failures
                .wait_or_stop(stop, |_| {
                    shared.summary.lock().expect("summary lock").rereads += 1;
                    metrics::counter!("projector_stream_rereads_total").increment(1);
                })
                .await;
            if stopped {
                return Ok(ShardExit::Stopped);
            }
            // Read again from the checkpoint with a fresh iterator.
            continue;
        }
        failures.reset();
        match next {
            Some(next) => iterator = Some(next),
            None => {
                tracing::info!(shard = %run.shard_id, records = run.records, "shard read to its end");
                return Ok(ShardExit::Finished);
            }
        }
    }
}

type GetRecordsResult = Result<Page, ApiError>;

/// One `GetRecords` call from `iterator` of `shard_id`, decoded.
async fn get_records(shared: &Shared, shard_id: &str, iterator: &str) -> GetRecordsResult {
    shared
        .streams
        .get_records(
            &shared.stream_arn,
            shard_id,
            iterator,
            shared.options.batch_limit.clamp(1, MAX_BATCH),
        )
        .await
}

/// Applies one page and moves the position past its handled prefix.
/// Returns whether every record was handled, and whether the checkpoint
/// is to be written now (the caller writes it).
async fn apply_page(
    shared: &Shared,
    run: &mut ShardRun,
    page: Page,
    last_page: bool,
) -> Result<(bool, bool), RunErrorKind> {
    let Page {
        records: batch,
        positions,
        behind_ms,
        ..
    } = page;
    let n = batch.len();
    let created: Vec<Option<i64>> = batch
        .iter()
        .map(|r| r.as_ref().ok().and_then(|r| r.approximate_creation_ms))
        .collect();
    // A Kinesis stream's changes of other tables leave the page: each is
    // left to the consumer that serves its table, or dead-lettered naming
    // it. `kept`: where each record stands in what is applied.
    let (batch, others, kept) = match shared.streams.is_kinesis() {
        true => route_tables(shared, batch).await,
        false => (batch, vec![None; n], (0..n).map(Some).collect()),
    };
    let applying = Instant::now();
    // Pages read from a checkpoint are recorded in the ledger of
    // deliveries, which says what was read past it before.
    let recorded = shared.checkpoints.is_some() && !shared.options.derive_current;
    if recorded && run.ledger.is_none() {
        let (ledger, start) = match shared
            .applier
            .shard_ledger(&run.shard_id, run.durable.as_ref())
            .await
        {
            Ok(read) => read,
            Err(message) => {
                tracing::warn!(shard = %run.shard_id, %message, "reading the shard's entry in the ledger of deliveries failed; reading again from the checkpoint after a pause");
                return Ok((false, false));
            }
        };
        if let crate::apply::ShardStart::Behind(through) = &start {
            tracing::warn!(
                shard = %run.shard_id,
                read_through = through.as_str(),
                checkpoint = run.durable.as_ref().map_or("none", |s| s.as_str()),
                "the checkpoint is behind where the shard was read before: its items are applied as they are now until the shard is caught up, as a replay does"
            );
            run.catching_up = Some(through.clone());
        }
        run.ledger = Some(Arc::new(std::sync::Mutex::new(ledger)));
    }
    // A replay applies what each item is now, in place of its records.
    let derive = shared.options.derive_current || run.catching_up.is_some();
    let (batch, stands_for, derived) = if derive {
        let selection = shared.batch_options.selection.as_deref();
        match shared.applier.current_states(batch, selection).await {
            Ok(states) => {
                let derived = (states.items_read as u64, states.read_units, states.retries);
                (states.records, states.stands_for, derived)
            }
            Err(WriteError::Transient(message)) => {
                tracing::warn!(
                    shard = %run.shard_id,
                    records = n,
                    %message,
                    "reading the current state of the page's items failed; reading again from the checkpoint after a pause"
                );
                return Ok((false, false));
            }
            Err(error) => {
                return Err(RunErrorKind::Apply(ApplyError::Fatal {
                    table: shared.applier.table().to_string(),
                    message: format!("reading the current state of the page's items: {error}"),
                }))
            }
        }
    } else {
        let applied = batch.len();
        (batch, (0..applied).collect(), (0, 0.0, 0))
    };
    // A page read again after a restart or a failure may hold records
    // applied before with newer ones: the shard's entry in the ledger of
    // deliveries says how far its pages reached (a replay applies current
    // states, guarded by what it read, instead).
    let first = positions.iter().find_map(Clone::clone);
    let last = positions.iter().rev().find_map(Clone::clone);
    let delivery = match (run.ledger.clone().filter(|_| !derive), first, last) {
        (Some(ledger), Some(first), Some(last)) => {
            let table = &shared.applier.spec().table;
            let delivered: Vec<Delivered> = batch
                .iter()
                .filter_map(|decoded| decoded.as_ref().ok())
                .map(|record| Delivered {
                    event_id: record.event_id.clone(),
                    item: table.item_key(&record.keys),
                    sequence_number: record.sequence_number.clone(),
                })
                .collect();
            Some(Arc::new(Delivery::page(
                ledger,
                run.durable.as_ref(),
                first,
                last,
                Box::new(move || delivered.clone()),
            )))
        }
        _ => None,
    };
    let options = BatchOptions {
        delivery: delivery.clone(),
        ..shared.batch_options.clone()
    };
    let outcome = shared.applier.apply_batch(&batch, &options).await?;
    if let (Some(delivery), None) = (&delivery, outcome.first_failure()) {
        shared.applier.delivery_completed(delivery);
    }
    let apply_ms = applying.elapsed().as_millis() as u64;
    // A record is handled when the record applied for it is (another
    // table's: when its table is told).
    let stand = |i: usize| kept[i].map(|k| stands_for[k]);
    let status_of = |i: usize| match (&others[i], stand(i)) {
        (Some(status), _) => status,
        (None, Some(at)) => &outcome.statuses[at],
        (None, None) => unreachable!("a record left out of the page has its status"),
    };
    let handled = (0..n).position(|i| !status_of(i).is_handled()).unwrap_or(n);
    let first_seq = positions[0].clone();
    let statuses: Vec<&RecordStatus> = (0..handled).map(status_of).collect();
    if handled > 0 {
        if let Some(seq) = positions[..handled].iter().rev().find_map(Clone::clone) {
            run.position = Some(seq);
        }
        run.records += handled as u64;
    }
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    // Kinesis says how far behind its tip the page is; DynamoDB Streams
    // tells only each record's time.
    let lag_ms = behind_ms.filter(|_| handled > 0).or_else(|| {
        created[..handled]
            .iter()
            .rev()
            .find_map(|created| *created)
            .map(|created| (now_ms - created).max(0))
    });
    // Letters stored: one per record applied, whichever records it stands for.
    let mut lettered: Vec<usize> = (0..handled)
        .filter_map(stand)
        .filter(|&at| matches!(outcome.statuses[at], RecordStatus::DeadLettered(_)))
        .collect();
    lettered.sort_unstable();
    lettered.dedup();
    let bookkeeping_only = statuses
        .iter()
        .all(|s| matches!(s, RecordStatus::Skipped(reason) if *reason == shared.bookkeeping));
    let finished = handled == n && last_page;
    {
        let mut summary = shared.summary.lock().expect("summary lock");
        let stats = &outcome.stats;
        summary.records += handled as u64;
        summary.effects += stats.effects as u64;
        summary.writes += stats.writes as u64;
        summary.write_units += stats.write_units;
        summary.min_billed_write_units += stats.requests.min_billed_write_units();
        summary.read_units += stats.read_units + derived.1;
        summary.items_read += derived.0;
        summary.retries += stats.retries + derived.2;
        summary.batches += 1;
        summary.dead_letters += lettered.len() as u64;
        summary.skipped += statuses
            .iter()
            .filter(|s| matches!(s, RecordStatus::Skipped(_)))
            .count() as u64;
        if let Some(lag) = lag_ms {
            summary.last_lag_ms = Some(lag);
            summary.max_lag_ms = Some(summary.max_lag_ms.map_or(lag, |max| max.max(lag)));
        }
    }
    metrics::counter!("projector_stream_records_total").increment(handled as u64);
    metrics::counter!("projector_stream_batches_total").increment(1);
    if let Some(lag) = lag_ms {
        metrics::gauge!("projector_iterator_age_ms", "shard" => run.shard_id.clone())
            .set(lag as f64);
    }
    tracing::debug!(
        shard = %run.shard_id,
        first_sequence_number = first_seq.as_ref().map_or("", |s| s.as_str()),
        last_sequence_number = run.position.as_ref().map_or("", |s| s.as_str()),
        records = n,
        handled,
        items_read = derived.0,
        effects = outcome.stats.effects,
        writes = outcome.stats.writes,
        write_units = outcome.stats.write_units,
        dead_letters = outcome.stats.dead_letters,
        apply_ms,
        "batch applied"
    );
    if handled < n {
        let reason = match status_of(handled) {
            RecordStatus::Failed(reason) => reason.as_str(),
            _ => "",
        };
        tracing::warn!(
            shard = %run.shard_id,
            sequence_number = positions[handled].as_ref().map_or("", |s| s.as_str()),
            failed = n - handled,
            %reason,
            "records failed; reading again from the checkpoint after a pause"
        );
    }
    if handled == n {
        if let Some(health) = &shared.options.health {
            health.progressed();
        }
    }
    // The runner's own checkpoint writes come back through the stream; a
    // batch of nothing else must not write another one, or it never ends.
    Ok((handled == n, (handled > 0 && !bookkeeping_only) || finished))
}

/// Marks a shard finished in its checkpoint.
async fn finish(shared: &Shared, run: &mut ShardRun) -> Result<(), RunErrorKind> {
    tracing::info!(shard = %run.shard_id, records = run.records, "shard read to its end");
    save(shared, run, true).await
}

/// Writes the shard's checkpoint at its position. A write that keeps
/// failing transiently is left for the next batch: the position is only
/// ever behind, never ahead.
async fn save(shared: &Shared, run: &mut ShardRun, finished: bool) -> Result<(), RunErrorKind> {
    let Some(store) = shared.positions() else {
        return Ok(());
    };
    let checkpoint = Checkpoint {
        shard_id: run.shard_id.clone(),
        parent_shard_id: run.parent.clone(),
        sequence_number: run.position.clone(),
        finished,
        records: run.records,
        updated_at: String::new(),
    };
    match store
        .save(run.durable.as_ref(), &run.unconfirmed, &checkpoint)
        .await
    {
        Ok(()) => {
            run.durable = run.position.clone();
            run.unconfirmed.clear();
            shared.summary.lock().expect("summary lock").checkpoints += 1;
            metrics::counter!("projector_checkpoints_total").increment(1);
            tracing::debug!(shard = %run.shard_id, sequence_number = run.position.as_ref().map_or("", |s| s.as_str()), finished, "checkpoint written");
            Ok(())
        }
        Err(CheckpointError::Transient { operation, message }) => {
            tracing::warn!(shard = %run.shard_id, operation, %message, "checkpoint not written; trying again after the next batch");
            if let Some(position) = &run.position {
                run.unconfirmed.push(position.clone());
            }
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// Splits a Kinesis page: the records of the runner's table (and those
/// that could not be decoded) stay to be applied; another table's change
/// leaves the page, skipped when it is the projector's own item (a
/// checkpoint, a letter: bookkeeping, whichever table) or its table is
/// served by another consumer, failed when that cannot be told now, and
/// replaced by a problem naming the table (to be dead-lettered) when
/// nothing serves it. Returns what is applied, each record's status when
/// it left the page, and where each record stands in what is applied.
async fn route_tables(
    shared: &Shared,
    batch: Decoded,
) -> (Decoded, Vec<Option<RecordStatus>>, Vec<Option<usize>>) {
    let table = shared.applier.table().to_string();
    let n = batch.len();
    let mut statuses = vec![None; n];
    let mut kept = vec![None; n];
    let mut routed = Vec::with_capacity(n);
    for (index, decoded) in batch.into_iter().enumerate() {
        let other = match &decoded {
            Ok(ChangeRecord {
                origin: Origin::Kinesis { table_name, .. },
                keys,
                ..
            }) if *table_name != table => {
                let reserved = keys.iter().any(|(_, value)| {
                    value
                        .as_str()
                        .is_some_and(|v| v.starts_with(crate::dynamo::names::RESERVED_PREFIX))
                });
                if reserved {
                    statuses[index] = Some(RecordStatus::Skipped(shared.bookkeeping.clone()));
                    continue;
                }
                table_name.clone()
            }
            _ => {
                kept[index] = Some(routed.len());
                routed.push(decoded);
                continue;
            }
        };
        // A replay repairs its own table; the live consumer dead-lettered
        // what nothing serves.
        let served = match shared.checkpoints {
            None => Ok(true),
            Some(_) => shared.others.served(&other).await,
        };
        match served {
            Ok(true) => {
                metrics::counter!("projector_records_of_another_table_total").increment(1);
                statuses[index] = Some(RecordStatus::Skipped(format!(
                    "a change of table `{other}`, which another consumer serves"
                )));
            }
            Ok(false) => {
                let record = decoded.expect("matched above");
                kept[index] = Some(routed.len());
                routed.push(Err(DecodeProblem {
                    index,
                    event_id: Some(record.event_id.clone()),
                    sequence_number: Some(record.sequence_number.0.clone()),
                    reason: format!(
                        "the change is of table `{other}`, which no spec this runner was given describes \
                         and nothing is registered in: this runner serves `{table}` (give it a spec of \
                         `{other}` with --spec, or register one, so that another runner or function serves it)"
                    ),
                    raw: serde_json::to_value(&record).unwrap_or_default(),
                }));
            }
            Err(message) => statuses[index] = Some(RecordStatus::Failed(message)),
        }
    }
    (routed, statuses, kept)
}
