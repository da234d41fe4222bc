//! One invocation: apply the decoded batch before the deadline, then report
//! the first record that is not handled; or run a backfill slice
//! ([`super::backfill`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use serde::Serialize;
use tokio::time::Instant;
use tracing::Instrument;

use super::backfill::{BackfillRequestError, BackfillResponse};
use super::event::{Payload, StreamsEvent};
use crate::apply::{ApplyConfig, ApplyError, BatchOptions, BatchStats, Delivery, RecordStatus};
use crate::decode::{DecodeProblem, Decoded};
use crate::dynamo::arn::table_from_stream_arn;
use crate::record::{ChangeRecord, SequenceNumber};
use crate::spec::{Spec, SpecSet};

/// Records planned, coalesced and written together. Larger chunks coalesce
/// more writes of one item; smaller ones hold less in memory. A Lambda batch
/// has at most 10,000 records.
pub const CHUNK_RECORDS: usize = 1000;

/// Keeps of records already written only what the response needs (event
/// id and sequence number): their images, keys and source ARN are most of
/// their size, and a batch holds up to 10,000 of them.
fn slim(records: &mut Decoded) {
    for record in records.iter_mut().flatten() {
        record.old_image = None;
        record.new_image = None;
        record.keys = Default::default();
        record.origin = crate::record::Origin::Synthetic;
    }
}

/// Why an invocation fails as a whole; Lambda then delivers the whole batch
/// again (and bisects it, when the mapping says so).
#[derive(Debug, thiserror::Error)]
pub enum InvocationError {
    /// No spec of the function describes the records' table.
    #[error("no spec registered with this function describes table `{table}` (its specs describe {tables}): add the table's spec to the spec directory, or remove the event source mapping of its stream; the batch is delivered again until the mapping's retries or record age run out, then goes to its on-failure queue (`ddb-projector recover` applies it once the spec is there)")]
    Unregistered {
        /// The records' table.
        table: String,
        /// The tables the specs describe.
        tables: String,
    },
    /// A backfill or audit payload on a function serving several tables
    /// names none.
    #[error("the function serves the tables {0}: name one in the request's `table`")]
    WhichTable(String),
    /// Neither `PROJECTOR_TABLE` nor the records say which table to write.
    #[error("cannot tell which table to write to: the records carry no eventSourceARN of a DynamoDB stream; set PROJECTOR_TABLE")]
    NoTable,
    /// The configuration is wrong (no table, no access), not the data.
    #[error("{0}")]
    Apply(#[from] ApplyError),
    /// A record that is not handled has no sequence number to report, and
    /// neither has any record before it.
    #[error("record {index} is not handled and neither it nor any record before it has a SequenceNumber to report; the whole batch will be delivered again")]
    NoIdentifier {
        /// The record's position in the batch.
        index: usize,
    },
    /// The specs registered for the table could not be read (and none
    /// were read before).
    #[error("reading the specs registered for table `{table}`: {message}")]
    Registry {
        /// The table.
        table: String,
        /// Why.
        message: String,
    },
    /// A backfill request that cannot run as sent.
    #[error("{0}")]
    Backfill(#[from] BackfillRequestError),
    /// A backfill invocation with less time left than the margin.
    #[error("backfill: the invocation has less time left than PROJECTOR_DEADLINE_MARGIN_MS ({margin_ms} ms), so no scan page can start; give the function a longer timeout")]
    BackfillNoTime {
        /// The margin.
        margin_ms: u64,
    },
    /// A backfill page was still being written when the invocation had to
    /// answer.
    #[error("backfill segment {segment} of {total}: the invocation's deadline came while a page was being written; that page is not checkpointed and the next invocation redoes it (harmless); if this repeats, give the function a longer timeout or send a smaller pageSize")]
    BackfillAbandoned {
        /// The segment.
        segment: u32,
        /// The number of segments.
        total: u32,
    },
    /// An audit request that cannot run as sent.
    #[error("{0}")]
    Audit(#[from] super::audit::AuditRequestError),
    /// An audit invocation with less time left than the margin.
    #[error("audit run `{run}`: the invocation has less time left than PROJECTOR_DEADLINE_MARGIN_MS ({margin_ms} ms), so no scan page can start; give the function a longer timeout")]
    AuditNoTime {
        /// The run.
        run: String,
        /// The margin.
        margin_ms: u64,
    },
    /// An audit page, or the merge, was still running when the invocation
    /// had to answer.
    #[error("audit: the invocation's deadline came during {what}; what it was doing is not checkpointed and the next invocation does it again (harmless); if this repeats, give the function a longer timeout or send a smaller pageSize")]
    AuditAbandoned {
        /// The segment, or the merge.
        what: String,
    },
    /// A backfill claim while a writer of another definition may write.
    #[error("backfill: a writer of another definition ({other}) of `{projection}` holds a lease until {until}: a backfill started now could be undone by it; try again after then (the state machine does), or deploy the spec first if the old definition is still running")]
    OtherDefinitionRunning {
        /// The projection.
        projection: String,
        /// The other definition's fingerprint.
        other: String,
        /// Its lease.
        until: String,
    },
    /// A global table without a usable home region.
    #[error("{0}")]
    Global(crate::global::GlobalError),
    /// A backfill or audit invoked outside a global table's home region.
    #[error("the table is a global table projected from its home region {home}: backfills and audits write derived state, so they run there only (start the state machine in {home})")]
    AwayFromHome {
        /// The home region.
        home: String,
    },
}

impl From<InvocationError> for Diagnostic {
    fn from(error: InvocationError) -> Diagnostic {
        let error_type = match &error {
            InvocationError::NoTable | InvocationError::WhichTable(_) => "Projector.NoTable",
            InvocationError::Unregistered { .. } => "Projector.UnregisteredTable",
            InvocationError::Registry { .. } => "Projector.Registry",
            InvocationError::Apply(_) => "Projector.CannotWrite",
            InvocationError::NoIdentifier { .. } => "Projector.NoItemIdentifier",
            InvocationError::Backfill(_) => "Projector.InvalidBackfillRequest",
            InvocationError::BackfillNoTime { .. } | InvocationError::BackfillAbandoned { .. } => {
                "Projector.BackfillTimeout"
            }
            InvocationError::OtherDefinitionRunning { .. } => "Projector.OtherDefinitionRunning",
            InvocationError::Audit(super::audit::AuditRequestError::Incomplete(_)) => {
                "Projector.AuditIncomplete"
            }
            InvocationError::Audit(
                super::audit::AuditRequestError::RunMerged(_)
                | super::audit::AuditRequestError::OtherTotal { .. },
            ) => "Projector.AuditRunDone",
            InvocationError::Audit(_) => "Projector.InvalidAuditRequest",
            InvocationError::AuditNoTime { .. } | InvocationError::AuditAbandoned { .. } => {
                "Projector.AuditTimeout"
            }
            InvocationError::AwayFromHome { .. } => "Projector.AwayFromHome",
            InvocationError::Global(_) => "Projector.GlobalTable",
        };
        Diagnostic {
            error_type: error_type.to_string(),
            error_message: error.to_string(),
        }
    }
}

/// When an invocation stops starting writes and when it gives up waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// No write starts after this instant (the Lambda deadline less the margin).
    pub stop_writes: Instant,
    /// Writes still running at this instant are abandoned and the whole batch
    /// is reported failed (a third of the margin before the Lambda deadline),
    /// leaving time to answer.
    pub abandon: Instant,
}

/// The invocation's deadline as `Lambda-Runtime-Deadline-Ms` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Milliseconds since the Unix epoch, as Lambda sends it.
    At(u64),
    /// A duration from the invocation's start, as cargo-lambda's emulator
    /// sends it (`600000`, its default timeout).
    Within(Duration),
}

impl Deadline {
    /// Reads the header. A deadline before the process started cannot be a
    /// real one: it is a duration (cargo-lambda sends the function's timeout
    /// there). Real deadlines are kept exact.
    pub fn read(deadline_ms: u64, process_started: SystemTime) -> Deadline {
        let started_ms = process_started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if deadline_ms < started_ms {
            // No invocation may run longer than Lambda's 15 minutes.
            Deadline::Within(Duration::from_millis(deadline_ms.min(MAX_TIMEOUT_MS)))
        } else {
            Deadline::At(deadline_ms)
        }
    }

    /// The time left at `now`.
    pub fn remaining(self, now: SystemTime) -> Duration {
        match self {
            Deadline::At(deadline_ms) => {
                let now_ms = now
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                Duration::from_millis(deadline_ms.saturating_sub(now_ms))
            }
            Deadline::Within(left) => left,
        }
    }
}

/// Lambda's longest function timeout.
const MAX_TIMEOUT_MS: u64 = 900_000;

/// Warned once per process: a deadline read as a duration.
static DURATION_WARNED: AtomicBool = AtomicBool::new(false);

/// The deadlines of an invocation given `Lambda-Runtime-Deadline-Ms`
/// (`deadline_ms`), read at `now` / `now_instant` in a process that started
/// at `process_started` (see [`Deadline::read`]).
pub fn deadlines(
    deadline_ms: u64,
    process_started: SystemTime,
    now: SystemTime,
    now_instant: Instant,
    margin: Duration,
) -> Deadlines {
    let deadline = Deadline::read(deadline_ms, process_started);
    if let Deadline::Within(left) = deadline {
        if !DURATION_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                deadline_ms,
                "Lambda-Runtime-Deadline-Ms lies before this process started, so it is not a time: read as {} ms left (cargo-lambda's emulator sends the function timeout there; Lambda itself sends a time)",
                left.as_millis()
            );
        }
    }
    let remaining = deadline.remaining(now);
    Deadlines {
        stop_writes: now_instant + remaining.saturating_sub(margin),
        abandon: now_instant + remaining.saturating_sub(margin / 3),
    }
}

/// The answer Lambda reads: the first record (in stream order) that is not
/// handled, by sequence number. Lambda checkpoints before it and delivers it
/// and everything after it again; the applier's idempotency makes the
/// records after it that did apply harmless to apply again.
pub fn batch_response(
    records: &[Result<ChangeRecord, DecodeProblem>],
    statuses: &[RecordStatus],
) -> Result<DynamoDbEventResponse, InvocationError> {
    let mut response = DynamoDbEventResponse::default();
    let Some(index) = reported_index(records, statuses)? else {
        return Ok(response);
    };
    let mut failure = DynamoDbBatchItemFailure::default();
    failure.item_identifier = sequence_number(&records[index]);
    response.batch_item_failures.push(failure);
    Ok(response)
}

/// The delivery a batch is: keyed by its first record's event id, reaching
/// its last record's sequence number (`None` when they are missing: the
/// batch is then applied guarded whole).
fn delivery_of(event: &Arc<StreamsEvent>, spec: &Arc<Spec>) -> Option<Delivery> {
    let (first_id, first) = event.identity(0);
    let (_, last) = event.identity(event.len().checked_sub(1)?);
    let (all, spec) = (event.clone(), spec.clone());
    Delivery::new(
        &first_id?,
        SequenceNumber(first?),
        SequenceNumber(last?),
        Box::new(move || all.delivered(&spec.table)),
    )
}

/// The record an invocation reports failed: the first not handled, or,
/// when that one has no sequence number, the last before it that has one
/// (delivering that one again is harmless). `None`: every record is
/// handled.
fn reported_index(
    records: &[Result<ChangeRecord, DecodeProblem>],
    statuses: &[RecordStatus],
) -> Result<Option<usize>, InvocationError> {
    let Some(first) = statuses.iter().position(|status| !status.is_handled()) else {
        return Ok(None);
    };
    (0..=first)
        .rev()
        .find(|&i| sequence_number(&records[i]).is_some())
        .map(Some)
        .ok_or(InvocationError::NoIdentifier { index: first })
}

fn sequence_number(record: &Result<ChangeRecord, DecodeProblem>) -> Option<String> {
    match record {
        Ok(record) => Some(record.sequence_number.0.clone()),
        Err(problem) => problem.sequence_number.clone(),
    }
    .filter(|seq| !seq.is_empty())
}

/// The answer to an invocation, by the payload's kind.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Response {
    /// To a stream event: the first record not handled, if any.
    Stream(DynamoDbEventResponse),
    /// To a backfill request: whether the segment is done, and what was done.
    Backfill(BackfillResponse),
    /// To an audit request: a slice's progress, or the merged conclusion.
    Audit(super::audit::AuditResponse),
}

/// What every invocation shares: built once at init.
pub struct Handler {
    /// The compiled specs, one per table the function serves.
    pub specs: SpecSet,
    /// DynamoDB.
    pub client: aws_sdk_dynamodb::Client,
    /// `PROJECTOR_TABLE`, when set.
    pub table: Option<String>,
    /// Time kept free before the Lambda deadline.
    pub margin: Duration,
    /// The applier's settings (retries are further bounded by the deadline).
    pub config: ApplyConfig,
    /// The EMF recorder, flushed after every invocation.
    pub metrics: Option<&'static metrics_cloudwatch_embedded::Collector>,
    /// When the execution environment started: a `Lambda-Runtime-Deadline-Ms`
    /// before it is a duration, not a time ([`Deadline::read`]).
    pub process_started: SystemTime,
    /// Which region projects each table it serves (see [`crate::global`]).
    pub regions: Regions,
    /// Without a spec file (`PROJECTOR_SPEC` unset): the specs registered
    /// for each table, read again every [`crate::control::registry_poll`].
    pub registered: Option<RegisteredSpecs>,
}

/// The specs registered for each table a function serves (see
/// [`crate::control::Registrations`]): composed, laid out by the batch,
/// and read again once [`crate::control::registry_poll`] has passed, so a
/// registration is served within seconds, never half-read.
#[derive(Debug, Default)]
pub struct RegisteredSpecs {
    tables: std::sync::Mutex<std::collections::HashMap<String, Served>>,
}

#[derive(Debug, Clone)]
struct Served {
    registrations: crate::control::Registrations,
    spec: Arc<Spec>,
    stamp: crate::control::Stamp,
    checked: Instant,
}

impl RegisteredSpecs {
    /// The spec registered for `table` now (at most one poll old).
    pub async fn spec(
        &self,
        client: &aws_sdk_dynamodb::Client,
        table: &str,
    ) -> Result<Arc<Spec>, String> {
        let cached = self
            .tables
            .lock()
            .expect("not poisoned")
            .get(table)
            .cloned();
        if let Some(served) = &cached {
            if served.checked.elapsed() < crate::control::registry_poll() {
                return Ok(served.spec.clone());
            }
        }
        let read = async {
            let registrations = match &cached {
                Some(served) => served.registrations.clone(),
                None => crate::control::Registrations::of_table(client, table)
                    .await
                    .map_err(|e| format!("{e:#}"))?,
            };
            let stamp = registrations.stamp().await.map_err(|e| e.to_string())?;
            if let Some(served) = cached.as_ref().filter(|s| s.stamp == stamp) {
                return Ok(Served {
                    checked: Instant::now(),
                    ..served.clone()
                });
            }
            let registered = registrations.read().await.map_err(|e| e.to_string())?;
            let spec = registered
                .spec(table, registrations.keys())
                .map_err(|errors| format!("the registered specs do not compose:\n{errors}"))?;
            let stamp = registered.stamp;
            tracing::info!(
                table,
                registry_version = stamp.version,
                projections = spec.projections.len(),
                services = %spec.service,
                "serving the specs registered for the table"
            );
            Ok::<_, String>(Served {
                registrations,
                spec: Arc::new(spec),
                stamp,
                checked: Instant::now(),
            })
        };
        match read.await {
            Ok(served) => {
                let spec = served.spec.clone();
                self.tables
                    .lock()
                    .expect("not poisoned")
                    .insert(table.to_string(), served);
                Ok(spec)
            }
            // The registration served so far stands while the registry
            // cannot be read (or a new one does not compose).
            Err(error) => match cached {
                Some(served) => {
                    tracing::warn!(table, %error, "reading the registered specs failed: serving the last ones read");
                    Ok(served.spec)
                }
                None => Err(error),
            },
        }
    }
}

/// Which region projects each table a function serves, decided from the
/// table's description the first time the table is seen.
#[derive(Debug, Default)]
pub struct Regions {
    /// The function's region.
    pub region: String,
    /// `PROJECTOR_HOME_REGION`.
    pub home: Option<String>,
    /// `PROJECTOR_WRITERS_IN_HOME_REGION`.
    pub writers: crate::global::Writers,
    roles: std::sync::Mutex<std::collections::HashMap<String, (crate::global::Role, Instant)>>,
}

/// How long a table's role is trusted before it is described again (a
/// replica added, the home region moved).
const ROLE_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a table's role is not known.
#[derive(Debug)]
pub enum RoleError {
    /// A global table without a usable home region: a configuration error.
    Global(crate::global::GlobalError),
    /// `DescribeTable` failed (maybe for now).
    Describe(String),
}

impl Regions {
    /// For a function in `region` given `home`, whose writers write the
    /// items projections write onto where `writers` says.
    pub fn new(region: String, home: Option<String>, writers: crate::global::Writers) -> Regions {
        Regions {
            region,
            home,
            writers,
            roles: Default::default(),
        }
    }

    /// The role of this function for `table`.
    pub async fn role(
        &self,
        client: &aws_sdk_dynamodb::Client,
        table: &str,
        spec: &crate::spec::Spec,
    ) -> Result<crate::global::Role, RoleError> {
        let cached = self.roles.lock().expect("not poisoned").get(table).cloned();
        if let Some((role, at)) = &cached {
            if at.elapsed() < ROLE_TTL {
                return Ok(role.clone());
            }
        }
        // Unread, the role is not known: the one described a minute ago
        // still stands while DynamoDB does not answer; without one the
        // batch fails (a worker that went by its configured home could
        // project beside the recorded one).
        let standing = match crate::global::standing(
            client,
            table,
            spec,
            &self.region,
            self.home.as_deref(),
            self.writers,
        )
        .await
        {
            Ok(standing) => standing,
            Err(error) => {
                return match cached {
                    Some((role, _)) => Ok(role),
                    None => Err(RoleError::Describe(error)),
                }
            }
        };
        if let Some(warning) = &standing.warning {
            tracing::warn!(table, "{warning}");
            metrics::counter!("projector_home_replica_inactive_total", "table" => table.to_string())
                .increment(1);
        }
        let role = standing.role.map_err(RoleError::Global)?;
        let changed = cached.as_ref().map(|(r, _)| r) != Some(&role);
        if let (crate::global::Role::Away { home }, true) = (&role, changed) {
            tracing::warn!(
                table,
                home_region = home,
                "the table is a global table projected from its home region: this function leaves its records to it and writes nothing (its event source mapping should be disabled here)"
            );
        }
        self.roles
            .lock()
            .expect("not poisoned")
            .insert(table.to_string(), (role.clone(), Instant::now()));
        Ok(role)
    }
}

impl Handler {
    /// The table a stream batch writes: `PROJECTOR_TABLE`, else its
    /// stream's. Serving the registry, its stream's first: each table's
    /// records are applied under that table's registration.
    fn stream_table(&self, event: &StreamsEvent) -> Option<String> {
        let from_stream = || {
            event
                .event_source_arn
                .as_deref()
                .and_then(table_from_stream_arn)
                .map(str::to_string)
        };
        if self.registered.is_some() {
            return from_stream().or_else(|| self.table.clone());
        }
        match &self.table {
            Some(table) => Some(table.clone()),
            None => event
                .event_source_arn
                .as_deref()
                .and_then(table_from_stream_arn)
                .map(str::to_string),
        }
    }

    /// The spec `table` is served with: its spec file's, or what is
    /// registered for it. `Ok(None)`: no spec file describes it.
    pub(super) async fn spec_for(&self, table: &str) -> Result<Option<Arc<Spec>>, InvocationError> {
        match &self.registered {
            None => Ok(self.specs.for_table(table).cloned()),
            Some(registered) => registered
                .spec(&self.client, table)
                .await
                .map(Some)
                .map_err(|message| InvocationError::Registry {
                    table: table.to_string(),
                    message,
                }),
        }
    }

    /// The table a payload works on and its spec, when both are known.
    async fn payload_spec(&self, payload: &Payload) -> Option<(String, Arc<Spec>)> {
        match payload {
            Payload::Stream(event) if event.kinesis => None,
            Payload::Stream(event) => {
                let table = self.stream_table(event)?;
                let spec = self.spec_for(&table).await.ok()??;
                Some((table, spec))
            }
            Payload::Backfill(request) => self.payload_table(request.table.as_deref()).await.ok(),
            Payload::Audit(request) => self.payload_table(request.table.as_deref()).await.ok(),
        }
    }

    /// The table a backfill or audit payload works on and its spec: the
    /// one it names, `PROJECTOR_TABLE`, else the only spec's table.
    pub(super) async fn payload_table(
        &self,
        named: Option<&str>,
    ) -> Result<(String, Arc<Spec>), InvocationError> {
        let table = match (named, &self.table, self.specs.specs()) {
            (Some(table), _, _) => table.to_string(),
            (None, Some(table), _) => table.clone(),
            (None, None, [only]) if self.registered.is_none() => only.table.name.clone(),
            (None, None, _) if self.registered.is_some() => {
                return Err(InvocationError::WhichTable(
                    "registered for the table of each request".to_string(),
                ))
            }
            (None, None, _) => return Err(InvocationError::WhichTable(self.specs.tables())),
        };
        match self.spec_for(&table).await? {
            Some(spec) => Ok((table, spec)),
            None => Err(InvocationError::Unregistered {
                table,
                tables: self.specs.tables(),
            }),
        }
    }

    /// The invocation's deadlines, and the applier's settings under them:
    /// a write that keeps failing may retry for a third of the time left,
    /// so that the writes after it (recomputes, dead letters) still start
    /// before the deadline and only its own records fail.
    pub(super) fn budget(&self, context: &Context, started: Instant) -> (Deadlines, ApplyConfig) {
        let deadlines = deadlines(
            context.deadline,
            self.process_started,
            SystemTime::now(),
            started,
            self.margin,
        );
        let config = ApplyConfig {
            max_retry_time: self
                .config
                .max_retry_time
                .min(deadlines.stop_writes.saturating_duration_since(started) / 3),
            ..self.config.clone()
        };
        (deadlines, config)
    }

    /// Handles one invocation (a stream batch or a backfill slice) and
    /// flushes its metrics.
    pub async fn handle(&self, event: LambdaEvent<Payload>) -> Result<Response, InvocationError> {
        let span = invocation_span(&event.context);
        self.handle_in_span(event).instrument(span).await
    }

    async fn handle_in_span(
        &self,
        event: LambdaEvent<Payload>,
    ) -> Result<Response, InvocationError> {
        let LambdaEvent { payload, context } = event;
        if let Some(answer) = self.outside_home(&payload, &context).await {
            if let Some(collector) = self.metrics {
                super::metrics::flush(collector, &context.request_id);
            }
            return answer;
        }
        // Every log line of the invocation names the spec's service (a
        // composed spec's services joined by `+`) and table.
        let span = match self.payload_spec(&payload).await {
            Some((table, spec)) => {
                tracing::info_span!("spec", spec_service = %spec.service, table)
            }
            None => tracing::info_span!("spec"),
        };
        let result = async {
            match payload {
                Payload::Stream(event) => self.process(event, &context).await.map(Response::Stream),
                Payload::Backfill(request) => self
                    .backfill(request, &context)
                    .await
                    .map(Response::Backfill),
                Payload::Audit(request) => self.audit(request, &context).await.map(Response::Audit),
            }
        }
        .instrument(span)
        .await;
        if let Err(error) = &result {
            tracing::error!(request_id = %context.request_id, %error, "invocation failed");
        }
        if let Some(collector) = self.metrics {
            super::metrics::flush(collector, &context.request_id);
        }
        result
    }

    /// The answer to an invocation that must not write here: outside a
    /// global table's home region, a stream batch is answered handled (its
    /// records are the home region's to apply) and a backfill or audit is
    /// refused; on a global table without a home region, every invocation
    /// fails. A table that cannot be described yet has its batch delivered
    /// again. `None`: go on.
    async fn outside_home(
        &self,
        payload: &Payload,
        context: &Context,
    ) -> Option<Result<Response, InvocationError>> {
        // A Kinesis stream's batch asks each of its tables in turn.
        if matches!(payload, Payload::Stream(event) if event.kinesis) {
            return None;
        }
        // A table no spec is registered for fails further on.
        let (table, spec) = self.payload_spec(payload).await?;
        if matches!(payload, Payload::Stream(event) if event.is_empty()) {
            return None;
        }
        let role = match self.regions.role(&self.client, &table, &spec).await {
            Ok(role) => role,
            Err(RoleError::Global(error)) => {
                tracing::error!(request_id = %context.request_id, %error, "the table is a global table without a usable home region: nothing is written");
                return Some(Err(InvocationError::Global(error)));
            }
            Err(RoleError::Describe(error)) if error.contains("AccessDenied") => {
                return Some(Err(InvocationError::Apply(ApplyError::Fatal {
                    table,
                    message: format!("the function needs dynamodb:DescribeTable on the table (to tell whether it is a global table, and which region projects it): {error}"),
                })));
            }
            Err(RoleError::Describe(error)) => {
                return match payload {
                    Payload::Stream(event) => {
                        tracing::warn!(request_id = %context.request_id, %error, "describing the table failed: the batch is delivered again");
                        Some(
                            batch_response(&event.decode(0..1), &[RecordStatus::Failed(error)])
                                .map(Response::Stream),
                        )
                    }
                    _ => Some(Err(InvocationError::Apply(ApplyError::Fatal {
                        table,
                        message: error,
                    }))),
                };
            }
        };
        let crate::global::Role::Away { home } = role else {
            return None;
        };
        Some(match payload {
            Payload::Stream(event) => {
                tracing::info!(
                    request_id = %context.request_id,
                    records = event.len(),
                    home_region = home,
                    "batch left to the home region"
                );
                metrics::counter!("projector_records_left_to_home_total")
                    .increment(event.len() as u64);
                Ok(Response::Stream(DynamoDbEventResponse::default()))
            }
            Payload::Backfill(_) | Payload::Audit(_) => Err(InvocationError::AwayFromHome { home }),
        })
    }

    /// A stream batch: its records of the first record's table applied
    /// under that table's spec. A batch that goes on with another table's
    /// records (Lambda's own mappings never send one; a hand-made pipeline
    /// can) is answered with the first of them failed: Lambda delivers it
    /// again from there, first, under its own table's spec.
    async fn process(
        &self,
        event: StreamsEvent,
        context: &Context,
    ) -> Result<DynamoDbEventResponse, InvocationError> {
        if event.kinesis {
            return self.process_kinesis(event, context).await;
        }
        let other = event
            .other_table()
            .map(|(index, arn)| (*index, arn.clone(), event.identity(*index).1));
        let first_stream = event.event_source_arn.clone().unwrap_or_default();
        let (event, _) = event.split_at_other_table();
        let mut response = self.process_table(event, context).await?;
        if let Some((index, arn, sequence_number)) = other {
            tracing::warn!(
                request_id = %context.request_id,
                index,
                stream = arn,
                first_stream,
                "the batch goes on with another table's records: they are delivered again, to be applied under their own table's spec"
            );
            metrics::counter!("projector_records_of_another_table_total").increment(1);
            if response.batch_item_failures.is_empty() {
                let Some(sequence_number) = sequence_number else {
                    return Err(InvocationError::NoIdentifier { index });
                };
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(sequence_number);
                response.batch_item_failures.push(failure);
            }
        }
        Ok(response)
    }

    async fn process_table(
        &self,
        event: StreamsEvent,
        context: &Context,
    ) -> Result<DynamoDbEventResponse, InvocationError> {
        let started = Instant::now();
        let n_records = event.len();
        if n_records == 0 {
            super::metrics::record_invocation(0, false);
            tracing::info!(request_id = %context.request_id, records = 0, "empty batch");
            return Ok(DynamoDbEventResponse::default());
        }
        let table = self.stream_table(&event).ok_or(InvocationError::NoTable)?;
        let (deadlines, config) = self.budget(context, started);
        if deadlines.stop_writes <= started {
            tracing::warn!(
                request_id = %context.request_id,
                margin_ms = self.margin.as_millis() as u64,
                "the invocation has less time left than the margin: nothing will be written (a function timeout shorter than PROJECTOR_DEADLINE_MARGIN_MS fails every batch)"
            );
        }
        let config = ApplyConfig {
            stream_consumer: true,
            ..config
        };
        // Counters being rebuilt: the new version beside the old one. Until
        // the layout can be read, nothing can be written where it belongs:
        // the whole batch is delivered again.
        let file_spec = match self.spec_for(&table).await {
            Ok(Some(spec)) => spec,
            Ok(None) => {
                super::metrics::record_invocation(n_records, true);
                return Err(InvocationError::Unregistered {
                    table,
                    tables: self.specs.tables(),
                });
            }
            Err(error) => {
                tracing::warn!(request_id = %context.request_id, %error, "the batch is delivered again");
                super::metrics::record_invocation(n_records, true);
                return batch_response(
                    &event.decode(0..1),
                    &[RecordStatus::Failed(error.to_string())],
                );
            }
        };
        let spec = match crate::control::current_layout(&self.client, &table, &file_spec).await {
            Ok(spec) => spec,
            Err(error) => {
                tracing::warn!(request_id = %context.request_id, %error, "reading the counters' layout failed: the batch is delivered again");
                super::metrics::record_invocation(n_records, true);
                return batch_response(
                    &event.decode(0..1),
                    &[RecordStatus::Failed(error.to_string())],
                );
            }
        };
        let applier = crate::control::applier(self.client.clone(), spec, &table, config);
        let event = Arc::new(event);
        let delivery = delivery_of(&event, applier.spec_arc()).map(Arc::new);
        // A batch without an event id and sequence number to record it by
        // (one built by hand) is applied as it comes.
        let options = BatchOptions {
            deadline: Some(deadlines.stop_writes),
            delivery: delivery.clone(),
            ..BatchOptions::default()
        };

        // Chunks are decoded and applied one after the other, in stream
        // order, so that what decoding, planning and writing hold in memory
        // does not grow with the batch; a chunk's images are dropped once it
        // is written (its event id and sequence number stay for the response).
        let mut records: Decoded = Vec::with_capacity(n_records);
        let mut done: Vec<Option<RecordStatus>> = vec![None; n_records];
        let mut stats = BatchStats::default();
        let run = async {
            for start in (0..n_records).step_by(CHUNK_RECORDS) {
                let end = (start + CHUNK_RECORDS).min(n_records);
                let mut chunk = event.decode(start..end);
                if start == 0 {
                    // A batch comes from one shard, oldest record first.
                    super::metrics::record_iterator_age(&chunk);
                }
                let outcome = applier.apply_batch(&chunk, &options).await?;
                for (slot, status) in done[start..end].iter_mut().zip(outcome.statuses) {
                    *slot = Some(status);
                }
                stats.add(&outcome.stats);
                slim(&mut chunk);
                records.append(&mut chunk);
            }
            Ok::<(), ApplyError>(())
        };
        let abandoned = match tokio::time::timeout_at(deadlines.abandon, run).await {
            Ok(Ok(())) => 0,
            Ok(Err(error)) => {
                super::metrics::record_invocation(0, false);
                return Err(error.into());
            }
            Err(_) => {
                // Nothing is known of the writes in flight: the unfinished
                // records are delivered again, and applying them again is
                // harmless.
                let unfinished = done.iter().filter(|s| s.is_none()).count();
                tracing::warn!(
                    request_id = %context.request_id,
                    records = n_records,
                    unfinished,
                    "the deadline came before the batch was written; reporting the unfinished records failed"
                );
                unfinished
            }
        };
        // Records the deadline left undecoded still need their sequence
        // numbers for the response.
        let mut rest = event.decode(records.len()..n_records);
        slim(&mut rest);
        records.append(&mut rest);
        let statuses: Vec<RecordStatus> = done
            .into_iter()
            .map(|status| {
                status.unwrap_or_else(|| {
                    RecordStatus::Failed(
                        "the invocation's deadline came before its writes finished".to_string(),
                    )
                })
            })
            .collect();
        let mut response = batch_response(&records, &statuses)?;
        if let Some(delivery) = &delivery {
            match reported_index(&records, &statuses)? {
                None => applier.delivery_completed(delivery),
                // Lambda delivers again from the record reported, with
                // records after it that did apply: it starts a delivery
                // that reaches as far as this one.
                Some(index) if delivery.recorded() => {
                    let restart = match &records[index] {
                        Ok(record) => Some(record.event_id.clone()),
                        Err(problem) => problem.event_id.clone(),
                    };
                    // Bounded: the answer must reach Lambda before its
                    // deadline, or the whole batch comes again (harmless).
                    let left = deadlines
                        .abandon
                        .saturating_duration_since(Instant::now())
                        .max(self.margin / 6);
                    let noted = match restart {
                        Some(event_id) => tokio::time::timeout(
                            left,
                            applier.delivery_restarts_at(delivery, &event_id),
                        )
                        .await
                        .unwrap_or_else(|_| Err("no time left".to_string())),
                        None => Err("the record has no event id".to_string()),
                    };
                    if let Err(error) = noted {
                        // From the batch's first record, whose entry is
                        // there: every record it reached comes guarded.
                        tracing::warn!(%error, "could not record where Lambda delivers again: reporting the batch's first record instead");
                        response = batch_response(
                            &records,
                            &std::iter::once(RecordStatus::Failed(error))
                                .chain(statuses.iter().skip(1).cloned())
                                .collect::<Vec<_>>(),
                        )?;
                    }
                }
                Some(_) => {}
            }
        }
        super::metrics::record_invocation(abandoned, !response.batch_item_failures.is_empty());

        let count = |f: fn(&RecordStatus) -> bool| statuses.iter().filter(|s| f(s)).count();
        let first_failure = statuses.iter().position(|s| !s.is_handled());
        tracing::info!(
            request_id = %context.request_id,
            table,
            records = n_records,
            applied = count(|s| matches!(s, RecordStatus::Applied)),
            skipped = count(|s| matches!(s, RecordStatus::Skipped(_))),
            dead_lettered = count(|s| matches!(s, RecordStatus::DeadLettered(_))),
            failed = count(|s| matches!(s, RecordStatus::Failed(_))),
            effects = stats.effects,
            writes = stats.writes,
            write_units = stats.write_units,
            min_billed_write_units = stats.requests.min_billed_write_units(),
            retries = stats.retries,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "batch done"
        );
        if let Some(index) = first_failure {
            let reason = match &statuses[index] {
                RecordStatus::Failed(reason) => reason.as_str(),
                _ => "",
            };
            let reported = response
                .batch_item_failures
                .first()
                .and_then(|f| f.item_identifier.as_deref())
                .unwrap_or_default();
            tracing::warn!(
                request_id = %context.request_id,
                index,
                reported,
                reason,
                "first record not handled; it and the records after it will be delivered again"
            );
        }
        Ok(response)
    }
}

/// Whether no invocation has started in this execution environment yet.
static COLD: AtomicBool = AtomicBool::new(true);

/// The span every log line of an invocation is in: the keys AWS Lambda
/// Powertools puts on each line (`cold_start`, `function_request_id`,
/// `function_name`, `function_arn`, `function_memory_size`, and
/// `xray_trace_id` when Lambda traces the invocation).
fn invocation_span(context: &Context) -> tracing::Span {
    let cold_start = COLD.swap(false, Ordering::SeqCst);
    // At ERROR level, so that it is enabled whatever RUST_LOG lets
    // through: a WARN line under `RUST_LOG=warn` keeps its request id.
    let span = tracing::error_span!(
        "invocation",
        cold_start,
        function_request_id = %context.request_id,
        function_name = %context.env_config.function_name,
        function_arn = %context.invoked_function_arn,
        function_memory_size = context.env_config.memory,
        xray_trace_id = tracing::field::Empty,
    );
    if let Some(trace) = context.xray_trace_id.as_deref().filter(|t| !t.is_empty()) {
        span.record("xray_trace_id", trace);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ChangeKind, Origin, SequenceNumber};

    fn record(seq: &str) -> Result<ChangeRecord, DecodeProblem> {
        Ok(ChangeRecord {
            event_id: format!("e{seq}"),
            kind: ChangeKind::Insert,
            keys: Default::default(),
            old_image: None,
            new_image: None,
            sequence_number: SequenceNumber(seq.to_string()),
            approximate_creation_ms: None,
            ttl_expiry: false,
            view_type: None,
            size_bytes: None,
            origin: Origin::Synthetic,
        })
    }

    fn problem(index: usize, seq: Option<&str>) -> Result<ChangeRecord, DecodeProblem> {
        Err(DecodeProblem {
            index,
            event_id: None,
            sequence_number: seq.map(str::to_string),
            reason: "bad".to_string(),
            raw: serde_json::Value::Null,
        })
    }

    fn reported(response: &DynamoDbEventResponse) -> Vec<&str> {
        response
            .batch_item_failures
            .iter()
            .filter_map(|f| f.item_identifier.as_deref())
            .collect()
    }

    fn failed() -> RecordStatus {
        RecordStatus::Failed("throttled".to_string())
    }

    #[test]
    fn all_handled_reports_nothing() {
        let records = [record("1"), record("2"), record("3")];
        let statuses = [
            RecordStatus::Applied,
            RecordStatus::Skipped("no entity".into()),
            RecordStatus::DeadLettered(vec!["p: bad".into()]),
        ];
        let response = batch_response(&records, &statuses).unwrap();
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({ "batchItemFailures": [] })
        );
    }

    #[test]
    fn the_first_failure_in_stream_order_is_reported_alone() {
        let records = [record("10"), record("11"), record("12"), record("13")];
        let statuses = [
            RecordStatus::Applied,
            failed(),
            RecordStatus::Applied,
            failed(),
        ];
        let response = batch_response(&records, &statuses).unwrap();
        assert_eq!(reported(&response), ["11"]);
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({ "batchItemFailures": [{ "itemIdentifier": "11" }] })
        );
    }

    #[test]
    fn a_failure_without_a_sequence_number_reports_the_record_before_it() {
        let records = [record("10"), problem(1, None), record("12")];
        let statuses = [RecordStatus::Applied, failed(), RecordStatus::Applied];
        assert_eq!(
            reported(&batch_response(&records, &statuses).unwrap()),
            ["10"]
        );

        let records = [problem(0, Some("7")), record("8")];
        let statuses = [failed(), RecordStatus::Applied];
        assert_eq!(
            reported(&batch_response(&records, &statuses).unwrap()),
            ["7"]
        );

        let records = [problem(0, None), record("8")];
        let statuses = [failed(), RecordStatus::Applied];
        assert!(matches!(
            batch_response(&records, &statuses),
            Err(InvocationError::NoIdentifier { index: 0 })
        ));
    }

    #[test]
    fn deadlines_keep_the_margin_free() {
        let started = UNIX_EPOCH + Duration::from_millis(900_000);
        let now = UNIX_EPOCH + Duration::from_millis(1_000_000);
        let at = Instant::now();
        let margin = Duration::from_millis(1500);
        let d = deadlines(1_010_000, started, now, at, margin);
        assert_eq!(d.stop_writes, at + Duration::from_millis(8_500));
        assert_eq!(d.abandon, at + Duration::from_millis(9_500));
        // Already too late (but after the process started): nothing may start.
        let d = deadlines(1_000_500, started, now, at, margin);
        assert_eq!(d.stop_writes, at);
        assert_eq!(d.abandon, at);
        let d = deadlines(950_000, started, now, at, margin);
        assert_eq!(d.stop_writes, at);
    }

    #[test]
    fn a_deadline_before_the_process_started_is_a_duration() {
        // cargo-lambda's emulator: `Lambda-Runtime-Deadline-Ms: 600000`.
        let started = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let now = started + Duration::from_secs(30);
        let at = Instant::now();
        let margin = Duration::from_millis(1500);
        assert_eq!(
            Deadline::read(600_000, started),
            Deadline::Within(Duration::from_secs(600))
        );
        let d = deadlines(600_000, started, now, at, margin);
        assert_eq!(d.stop_writes, at + Duration::from_millis(598_500));
        assert_eq!(d.abandon, at + Duration::from_millis(599_500));
        // Never more than Lambda's 15 minutes.
        assert_eq!(
            Deadline::read(1_700_000_000, started),
            Deadline::Within(Duration::from_secs(900))
        );
        // A real deadline stays exact to the millisecond.
        let real = 1_795_000_030_000 + 2_345;
        assert_eq!(Deadline::read(real, started), Deadline::At(real));
        let d = deadlines(real, started, now, at, margin);
        assert_eq!(d.stop_writes, at + Duration::from_millis(845));
    }
}
