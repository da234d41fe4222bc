//! Applying planned effects to DynamoDB, exactly once in effect.
//!
//! A batch of decoded records goes through:
//!
//! 1. **plan** every record (pure, [`crate::plan`]);
//! 2. **hold** effects of (projection, item) pairs that sit behind a dead
//!    letter, so per-item order survives a poison record;
//! 3. **coalesce** effects by target: the last state of a derived item in
//!    stream order wins, recomputes of one target run once, counter deltas
//!    on one shard are summed into one `ADD`;
//! 4. **write**, independent targets concurrently (bounded), with retries
//!    for throttling, 5xx, timeouts and transaction conflicts;
//! 5. **report** a status per record: applied, skipped, dead-lettered, or
//!    failed (transient: it must be delivered again, and every later record
//!    of its shard with it).
//!
//! **Architecture Invariant:** a record is reported applied only when every
//! effect it contributed to has been written (or found already written);
//! dead letters are written before their records count as handled.

mod check;
mod coalesce;
mod control;
mod ctx;
mod current;
mod delivered;
mod dlq;
mod markers;
mod reader;
mod reads;
mod writes;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub use crate::dynamo::names::{CHANGES_ATTRIBUTE, COUNT_ATTRIBUTE};
pub use crate::dynamo::retry::{classify, describe as retry_describe, ErrorClass};
pub use check::{CheckStats, RecordedViolation};
pub use control::{clock_skew_ms, lease_length, Control, CounterVersion, DEFAULT_LEASE};
pub use ctx::Requests;
pub use current::CurrentStates;
use delivered::Treatment;
pub use delivered::{Delivered, Delivery, Earlier, ShardLedger, ShardStart};
pub use dlq::{
    problem_key, whole_record, DeadLetter, DeadLetterStore, Hold, RedriveSummary, WHOLE_RECORD,
};
pub(crate) use markers::{marker_change, records_of};

use crate::decode::DecodeProblem;
use crate::dynamo::retry::WriteError;
use crate::plan::{plan_complete, plan_guarded, plan_record};
use crate::record::{ChangeRecord, ItemKey, Origin};
use crate::spec::{ProjectionId, Spec};

/// How far past what a batch needs its lease must run: writes started just
/// before a deadline still finish.
const LEASE_MARGIN_MS: u64 = 5_000;

/// How the applier behaves.
#[derive(Debug, Clone)]
pub struct ApplyConfig {
    /// Independent requests in flight at once, per stage of a batch
    /// (`PROJECTOR_CONCURRENCY`, default 512). DynamoDB serves them in
    /// parallel, so this bounds how many round trips a batch waits for in
    /// sequence: a batch of 1,000 records sends a few hundred requests.
    pub concurrency: usize,
    /// How long one write may be retried before its records count as failed.
    pub max_retry_time: Duration,
    /// Whether poison records go to the dead-letter store (off: they fail).
    pub dead_letters: bool,
    /// Whether the spec's invariants are checked after each batch.
    pub check_invariants: bool,
    /// Whether this applier consumes the table's stream for the whole spec
    /// (the Lambda, the runner): its lifecycle leases then also say that
    /// it runs the definitions, and that it leaves the projections its
    /// spec lacks unprojected ([`crate::control`]).
    pub stream_consumer: bool,
    /// How long a lifecycle lease lasts past what a batch needs
    /// (`PROJECTOR_LEASE_SECONDS`, default 120 s). The first applier of a
    /// table and definition in a process sets it for all of them.
    pub lease: Duration,
    /// How far apart machines' clocks may be, for the lease comparisons a
    /// backfill makes when it completes (`PROJECTOR_CLOCK_SKEW_MS`,
    /// default 2 s).
    pub clock_skew: Duration,
    /// The stream consumer this applier works for (`--consumer`,
    /// `PROJECTOR_CONSUMER`; none: the unnamed one). Two deployments with
    /// different specs on one table each name theirs: each keeps its own
    /// checkpoints, its own letters and holds of records that could not be
    /// decoded (letters of a projection are its consumer's already), and
    /// leaves the other's projections to it ([`crate::control`]).
    pub consumer: Option<String>,
    /// How long the ledger of deliveries keeps a completed Lambda batch's
    /// entries (default 1 h): Lambda may send a batch again after it
    /// succeeded (a lane of a parallelized shard holding the checkpoint
    /// back, a restarted event source mapping).
    pub keep_deliveries: Duration,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        ApplyConfig {
            concurrency: concurrency(),
            max_retry_time: Duration::from_secs(20),
            dead_letters: true,
            check_invariants: true,
            stream_consumer: false,
            lease: lease_length(),
            clock_skew: Duration::from_millis(clock_skew_ms()),
            consumer: None,
            keep_deliveries: delivered::KEEP_COMPLETED,
        }
    }
}

/// The default [`ApplyConfig::concurrency`]: `PROJECTOR_CONCURRENCY`, or 512.
pub fn concurrency() -> usize {
    std::env::var("PROJECTOR_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_CONCURRENCY)
}

const DEFAULT_CONCURRENCY: usize = 512;

/// Options for one batch.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// Only these projections (`None`: all).
    pub selection: Option<Vec<ProjectionId>>,
    /// Stop starting new writes after this instant; unfinished records fail.
    pub deadline: Option<tokio::time::Instant>,
    /// The records are dead letters being applied again: do not hold them.
    pub redrive: bool,
    /// Read markers before writing memberships and skip those already in
    /// their state (backfill: most are, and a read is cheaper than a
    /// cancelled transaction).
    pub read_markers_first: bool,
    /// Every record writes what its images say only while its item is
    /// still as it shows ([`crate::plan::plan_guarded`]): dead letters
    /// applied again.
    pub guarded: bool,
    /// The delivery the batch is (a part of), recorded in the ledger of
    /// deliveries: its records an earlier delivery held with a later
    /// record of their item write nothing their images decide
    /// ([`Delivery`]).
    pub delivery: Option<Arc<Delivery>>,
    /// Check the invariants on items derived as they are now
    /// ([`Applier::current_states`]): they stand for a live source's
    /// records (Kinesis). Otherwise such items are left to the audit, as a
    /// backfill's are.
    pub check_states: bool,
}

/// What happened to one record of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordStatus {
    /// Every effect is written (or nothing needed writing).
    Applied,
    /// Nothing applies to the record; the reason.
    Skipped(String),
    /// Some projections could not apply it; it is in the dead-letter store
    /// with these reasons and counts as handled. Its other effects applied.
    DeadLettered(Vec<String>),
    /// Not applied (transient). It and the records after it in its shard
    /// must be delivered again.
    Failed(String),
}

impl RecordStatus {
    /// Whether the record is handled (safe to checkpoint past).
    pub fn is_handled(&self) -> bool {
        !matches!(self, RecordStatus::Failed(_))
    }
}

/// Counts for one batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchStats {
    /// Records in the batch.
    pub records: usize,
    /// Effects planned (before coalescing).
    pub effects: usize,
    /// Write requests sent (after coalescing).
    pub writes: usize,
    /// Write capacity units DynamoDB reported.
    pub write_units: f64,
    /// Read capacity units DynamoDB reported.
    pub read_units: f64,
    /// Retried requests.
    pub retries: u64,
    /// Records dead-lettered.
    pub dead_letters: usize,
    /// What the invariant check after the batch did.
    pub checks: CheckStats,
    /// Requests sent, by purpose.
    pub requests: Requests,
}

impl BatchStats {
    /// Adds another batch's counts.
    pub fn add(&mut self, other: &BatchStats) {
        self.records += other.records;
        self.effects += other.effects;
        self.writes += other.writes;
        self.write_units += other.write_units;
        self.read_units += other.read_units;
        self.retries += other.retries;
        self.dead_letters += other.dead_letters;
        self.checks.add(&other.checks);
        self.requests.add(&other.requests);
    }
}

/// The result of applying a batch.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    /// One status per input record, in input order.
    pub statuses: Vec<RecordStatus>,
    /// Counts.
    pub stats: BatchStats,
    /// The dead letters stored, with the index of their record.
    pub letters: Vec<(usize, DeadLetter)>,
}

impl BatchOutcome {
    /// The first record (in input order) that was not handled.
    pub fn first_failure(&self) -> Option<usize> {
        self.statuses.iter().position(|s| !s.is_handled())
    }
}

/// A failure of the whole batch: the configuration is wrong, not the data.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The table does not exist, access is denied, credentials are missing...
    #[error("cannot write to table `{table}`: {message}")]
    Fatal {
        /// The table.
        table: String,
        /// What DynamoDB or the SDK said.
        message: String,
    },
}

/// Writes planned effects for one table.
#[derive(Debug, Clone)]
pub struct Applier {
    pub(crate) client: aws_sdk_dynamodb::Client,
    pub(crate) spec: Arc<Spec>,
    pub(crate) table: String,
    pub(crate) config: ApplyConfig,
    /// The control plane: the lifecycle leases every write is made under.
    pub(crate) control: Arc<dyn Control>,
}

/// Which records one coalesced write stands for, and its outcome.
struct Written {
    group: coalesce::Group,
    result: Result<(), WriteError>,
}

impl Applier {
    /// An applier writing to `table` with the rules of `spec`, under the
    /// leases of `control` (built for the same table, spec and
    /// [`ApplyConfig::stream_consumer`]; `crate::control::applier` builds
    /// both).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        spec: Arc<Spec>,
        table: &str,
        config: ApplyConfig,
        control: Arc<dyn Control>,
    ) -> Applier {
        Applier {
            client,
            spec,
            table: table.to_string(),
            config,
            control,
        }
    }

    /// Takes (or renews) this applier's lifecycle leases now, for every
    /// projection: what a stream consumer does when it starts, and while it
    /// is idle. Returns until when they run (ms), or `None` for an applier
    /// that is not a stream consumer and holds none.
    pub async fn take_leases(&self) -> Result<Option<u64>, String> {
        if !self.config.stream_consumer {
            return Ok(None);
        }
        let needed = crate::dynamo::time::now_ms() + self.leases_margin();
        self.control.lease(&[], needed).await.map(Some)
    }

    /// How far past a batch's end its lease must reach.
    fn lease_margin(&self) -> u64 {
        LEASE_MARGIN_MS.min(self.config.lease.as_millis() as u64)
    }

    /// How long a batch without a deadline may take: half the lease.
    fn leases_margin(&self) -> u64 {
        self.config.lease.as_millis() as u64 / 2
    }

    /// A batch's shared state, for requests made outside a batch.
    pub(crate) fn ctx(&self) -> ctx::Ctx<'_> {
        ctx::Ctx::new(
            &self.client,
            &self.table,
            &self.spec,
            &self.config,
            &*self.control,
        )
    }

    /// The spec this applier runs, shared.
    pub fn spec_arc(&self) -> &Arc<Spec> {
        &self.spec
    }

    /// The spec this applier runs.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The table written to.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    /// Its settings.
    pub fn config(&self) -> &ApplyConfig {
        &self.config
    }

    /// The projection name of its consumer's letters of records that
    /// could not be decoded ([`whole_record`]).
    pub fn whole_record(&self) -> String {
        whole_record(self.config.consumer.as_deref())
    }

    /// Applies a batch of records given in stream order (see the module docs).
    pub async fn apply_batch(
        &self,
        batch: &[Result<ChangeRecord, DecodeProblem>],
        options: &BatchOptions,
    ) -> Result<BatchOutcome, ApplyError> {
        let mut written = Vec::new();
        // On the heap: a batch's future is large, and callers poll it on
        // threads with small stacks.
        let outcome = Box::pin(self.apply_leased(batch, options, &mut written)).await?;
        // A batch that outlasted its lease (throttling, a paused process)
        // records how long it wrote, so that `status` and the next claim
        // see it; no request when the lease still runs.
        if !written.is_empty() {
            let now = crate::dynamo::time::now_ms();
            if let Err(message) = self.control.lease(&written, now + 1_000).await {
                tracing::warn!(%message, "could not extend the lifecycle lease after a long batch");
            }
        }
        Ok(outcome)
    }

    async fn apply_leased(
        &self,
        batch: &[Result<ChangeRecord, DecodeProblem>],
        options: &BatchOptions,
        written: &mut Vec<ProjectionId>,
    ) -> Result<BatchOutcome, ApplyError> {
        let spec = &*self.spec;
        let n = batch.len();
        let fatal = |message: String| ApplyError::Fatal {
            table: self.table.clone(),
            message,
        };
        let mut letters: Vec<(usize, DeadLetter)> = Vec::new();
        let mut failed: Vec<Option<String>> = vec![None; n];
        let mut skips: Vec<Option<String>> = vec![None; n];

        // 1. Plan.
        let selection = options.selection.as_deref();
        let guarded = options.guarded;
        let mut plans: Vec<Option<crate::plan::RecordPlan>> = batch
            .iter()
            .map(|decoded| {
                decoded.as_ref().ok().map(|record| {
                    if guarded {
                        plan_guarded(spec, record, selection)
                    } else {
                        plan_record(spec, record, selection)
                    }
                })
            })
            .collect();
        let n_effects: usize = plans.iter().flatten().map(|p| p.effects.len()).sum();
        // The projections each record has effects in, for its lag.
        let projected: Vec<Vec<ProjectionId>> = plans
            .iter()
            .map(|plan| {
                let mut ids: Vec<ProjectionId> = plan
                    .iter()
                    .flat_map(|p| p.effects.iter().flat_map(effect_projections))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        // The item of each record (for an undecodable one, if its keys read).
        let sources: Vec<Option<ItemKey>> = batch
            .iter()
            .map(|decoded| match decoded {
                Ok(record) => spec.table.item_key(&record.keys),
                Err(problem) => dlq::problem_key(problem, &spec.table),
            })
            .collect();

        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            spec,
            &self.config,
            &*self.control,
        );

        // Nothing is written without a lease of the definitions written
        // with, lasting past the batch ([`crate::control`]): a request
        // only when the lease would run out first. A stream consumer takes
        // it for any batch, so that `status` sees the deploy at once.
        // A batch past its deadline writes nothing, so it needs none.
        // The projections written are those of the planned effects: a
        // membership writes its counters too, whatever was selected.
        let mut ids: Vec<ProjectionId> = plans
            .iter()
            .flatten()
            .flat_map(|plan| plan.effects.iter().flat_map(effect_projections))
            .collect();
        // The delivery is recorded in the ledger meanwhile, and says whether
        // earlier ones reached into it: for a spec that keeps markers, and
        // any batch of its entities' records (one planning nothing may be
        // the last of its item, which the ledger plans as the item).
        let markers = markers_of(spec);
        let delivery = options.delivery.clone().filter(|_| {
            plans.iter().flatten().any(|plan| {
                plan.entity.is_some_and(|entity| {
                    spec.interested(entity)
                        .iter()
                        .any(|id| markers.contains(id))
                })
            }) && whole_images(batch)
        });
        let keeps_markers = !markers.is_empty();
        if delivery.is_some() {
            ids.extend(markers);
        }
        ids.sort_unstable();
        ids.dedup();
        // A consumer's own lease renewals come back on the stream: they do
        // not call for another.
        let consumed = self.config.stream_consumer
            && sources
                .iter()
                .flatten()
                .any(|key| !key.pk.starts_with(crate::dynamo::names::RESERVED_PREFIX));
        let past_deadline = options
            .deadline
            .is_some_and(|deadline| deadline <= tokio::time::Instant::now());
        // The lease is taken (when it must be) while the holds and the
        // recompute targets are read: reads need none.
        let lease_until = ((!ids.is_empty() || consumed) && !past_deadline).then(|| {
            let now = crate::dynamo::time::now_ms();
            (match options.deadline {
                Some(deadline) => {
                    now + deadline
                        .saturating_duration_since(tokio::time::Instant::now())
                        .as_millis() as u64
                }
                None => now + self.leases_margin(),
            }) + self.lease_margin()
        });
        let lease = async {
            match lease_until {
                Some(needed) => self.control.lease(&ids, needed).await.map(|_| ()),
                None => Ok(()),
            }
        };

        // 2. Hold what sits behind a dead letter. A redrive holds nothing:
        // it replays an item's letters in order, and a later state
        // supersedes an earlier failing one.
        let store = self.dead_letter_store();
        let holding = self.config.dead_letters && !options.redrive;
        let whole = self.whole_record();
        let mut held: HashSet<dlq::Hold> = HashSet::new();
        let mut candidates: HashSet<dlq::Hold> = HashSet::new();
        if holding && n_effects > 0 {
            for (plan, source) in plans.iter().zip(&sources) {
                let (Some(plan), Some(source)) = (plan, source) else {
                    continue;
                };
                if plan.effects.is_empty() {
                    continue;
                }
                candidates.insert((whole.clone(), source.clone()));
                for effect in &plan.effects {
                    for id in effect_projections(effect) {
                        candidates.insert((spec.projections[id].name.clone(), source.clone()));
                    }
                }
            }
        }
        // A record the ledger says to plan as its item may plan for any
        // projection of its entity, each of which may hold it.
        if holding && delivery.is_some() {
            for (plan, source) in plans.iter().zip(&sources) {
                if let (
                    Some(crate::plan::RecordPlan {
                        entity: Some(entity),
                        ..
                    }),
                    Some(source),
                ) = (plan, source)
                {
                    for &id in spec.interested(*entity) {
                        candidates.insert((spec.projections[id].name.clone(), source.clone()));
                    }
                    candidates.insert((whole.clone(), source.clone()));
                }
            }
        }
        // The targets of recomputes that write on condition of a token are
        // read meanwhile: one round trip fewer on the batch's critical
        // path. (A target read earlier only makes a retry likelier: any
        // recompute that lands in between moves the token. A `denormalize`
        // writes on condition of the values it copies, which can go from
        // A to B and back to A: read early, the target would let a write
        // of B pass over that return, if B's recompute landed anywhere in
        // the first phase. It is read right before its sources.)
        let mut targets: Vec<&ItemKey> = plans
            .iter()
            .flatten()
            .flat_map(|plan| &plan.effects)
            .filter_map(|effect| match &effect.op {
                crate::plan::Op::Recompute { target, .. }
                    if crate::kinds::uses_token(spec, effect.projection) =>
                {
                    Some(target)
                }
                _ => None,
            })
            .collect();
        targets.sort_unstable();
        targets.dedup();
        // The markers the writes will read first are read meanwhile too,
        // as the plans stand before the holds and the ledger (which rarely
        // change them: what they add is read when written).
        let marker_keys = if !keeps_markers {
            Vec::new()
        } else {
            let effects = plans.iter().enumerate().flat_map(|(i, plan)| {
                plan.iter()
                    .flat_map(|plan| &plan.effects)
                    .filter(|effect| {
                        matches!(
                            effect.op,
                            crate::plan::Op::Membership { .. } | crate::plan::Op::DropRecord { .. }
                        )
                    })
                    .map(move |effect| (i, effect.clone()))
            });
            let groups = coalesce::coalesce(effects, &spec.table);
            markers::keys_read_first(spec, &groups, options.read_markers_first)
        };
        let holds = async {
            if candidates.is_empty() {
                return None;
            }
            ctx.count(|r| &mut r.holds_reads);
            Some(store.held(&candidates, self.config.max_retry_time).await)
        };
        let ledger = async {
            match &delivery {
                Some(delivery) => {
                    delivered::sweep(&ctx);
                    Some(delivery.record(&ctx).await)
                }
                None => None,
            }
        };
        let (leased, holds, (), (), ledger) = tokio::join!(
            lease,
            holds,
            ctx.read_targets_ahead(targets),
            ctx.read_markers_ahead(marker_keys),
            ledger
        );
        if lease_until.is_some() {
            if let Err(message) = leased {
                return Ok(all_failed(message, n, n_effects, &ctx));
            }
            *written = ids.clone();
        }
        if let Some(holds) = holds {
            match holds {
                Ok(stored) => held = stored,
                // DynamoDB kept failing (throttling, 5xx): nothing is
                // written, and the whole batch is delivered again. Only a
                // wrong configuration fails the batch as a whole.
                Err(WriteError::Transient(message)) => {
                    let reason = format!("reading the holds failed: {message}");
                    return Ok(all_failed(reason, n, n_effects, &ctx));
                }
                Err(error) => return Err(fatal(error.to_string())),
            }
        }
        // Records earlier deliveries held: one with a later record of its
        // item writes nothing its images decide; the item's last is planned
        // as its item, for what the skipped ones would have written.
        match (&delivery, ledger) {
            (Some(_), Some(Ok(Some(earlier)))) => {
                let (mut superseded, mut complete) = (0, 0);
                for (plan, (decoded, source)) in plans.iter_mut().zip(batch.iter().zip(&sources)) {
                    let (Some(plan), Ok(record), Some(item)) = (plan, decoded, source) else {
                        continue;
                    };
                    if matches!(record.origin, Origin::Scan { .. }) {
                        continue;
                    }
                    match earlier.treatment(item, &record.sequence_number) {
                        Treatment::AsIs => {}
                        Treatment::Superseded => superseded += drop_markers(plan),
                        Treatment::Complete => {
                            complete += 1;
                            drop_markers(plan);
                            let whole = plan_complete(spec, &record.as_item(), selection);
                            plan.effects
                                .extend(whole.effects.into_iter().filter(is_marker));
                        }
                    }
                }
                metrics::counter!("projector_superseded_effects_total")
                    .increment(superseded as u64);
                metrics::counter!("projector_records_planned_complete_total")
                    .increment(complete as u64);
            }
            (Some(_), Some(Err(message))) => {
                return Ok(all_failed(message, n, n_effects, &ctx));
            }
            _ => {}
        }
        let is_held = |held: &HashSet<dlq::Hold>, name: &str, key: &ItemKey| {
            held.contains(&(whole.clone(), key.clone()))
                || held.contains(&(name.to_string(), key.clone()))
        };
        let mut effects = Vec::with_capacity(n_effects);
        for (i, plan) in plans.iter_mut().enumerate() {
            let source = &sources[i];
            let record = match &batch[i] {
                Ok(record) => record,
                Err(problem) => {
                    // A record that could not be decoded holds every later
                    // record of its item.
                    letters.push((i, DeadLetter::for_problem(problem, source.clone(), &whole)));
                    if let (true, Some(key)) = (holding, source) {
                        held.insert((whole.clone(), key.clone()));
                    }
                    continue;
                }
            };
            let Some(plan) = plan.as_mut() else { continue };
            for error in &plan.errors {
                let projection = error
                    .projection
                    .map_or(whole.as_str(), |id| spec.projections[id].name.as_str());
                // A record that fails behind an earlier letter of its pair is
                // also held: redrive must reach it only after that one.
                let behind = match source {
                    Some(key) if holding => {
                        let behind = is_held(&held, projection, key);
                        held.insert((projection.to_string(), key.clone()));
                        behind
                    }
                    _ => false,
                };
                letters.push((
                    i,
                    DeadLetter::for_record(
                        record,
                        source.clone(),
                        projection,
                        error.problem.to_string(),
                        behind,
                    ),
                ));
            }
            for effect in plan.effects.drain(..) {
                if let (true, Some(key)) = (holding, source) {
                    let held_for = effect_projections(&effect)
                        .into_iter()
                        .any(|id| is_held(&held, &spec.projections[id].name, key));
                    if held_for {
                        let name = &spec.projections[effect.projection].name;
                        if !letters
                            .iter()
                            .any(|(j, l)| *j == i && l.projection == *name)
                        {
                            letters.push((
                                i,
                                DeadLetter::for_record(
                                    record,
                                    source.clone(),
                                    name,
                                    "held behind an earlier dead letter of the same item and projection".to_string(),
                                    true,
                                ),
                            ));
                            held.insert((name.clone(), key.clone()));
                        }
                        continue;
                    }
                }
                effects.push((i, effect));
            }
            if let Some(skip) = &plan.skip {
                skips[i] = Some(skip.to_string());
            }
        }

        // 3. Coalesce.
        let groups = coalesce::coalesce(effects, &spec.table);

        // 4. Write: first what sources and markers need, then recomputes,
        // which read what the first phase wrote.
        let (recomputes, first): (Vec<_>, Vec<_>) = groups
            .into_iter()
            .partition(|g| matches!(g.effect.op, crate::plan::Op::Recompute { .. }));
        // What the recomputes cannot change is checked while they run
        // (`check::Part::Early`): values of `unique` invariants when no
        // recompute writes on their entity, partitions no target falls in.
        let checking = self.config.check_invariants && !spec.invariants.is_empty();
        let targets: Vec<ItemKey> = recomputes
            .iter()
            .filter_map(|group| match &group.effect.op {
                crate::plan::Op::Recompute { target, .. } => Some(target.clone()),
                _ => None,
            })
            .collect();
        // The partitions read by recomputes that read their target right
        // before (`denormalize`): their checks reuse that read after them.
        let fresh: Vec<crate::plan::SourceQuery> = recomputes
            .iter()
            .filter(|group| !crate::kinds::uses_token(spec, group.effect.projection))
            .filter_map(|group| match &group.effect.op {
                crate::plan::Op::Recompute {
                    sources: crate::plan::Sources::Query(query),
                    ..
                } => Some(query.clone()),
                _ => None,
            })
            .collect();
        let recomputing = check::Recomputed {
            targets: &targets,
            read: &fresh,
        };
        let mut written = self.write_before_deadline(&ctx, first, options).await;
        let (recomputed, early_checks) = tokio::join!(
            self.write_before_deadline(&ctx, recomputes, options),
            async {
                if checking {
                    let part = check::Part::Early(recomputing);
                    check::check_batch(&ctx, batch, options, self.config.concurrency, part).await
                } else {
                    CheckStats::default()
                }
            }
        );
        written.extend(recomputed);

        // 5. Map write results back to records.
        for Written { group, result } in written {
            match result {
                Ok(()) => {}
                Err(WriteError::Transient(message)) => {
                    for &i in &group.contributors {
                        failed[i].get_or_insert_with(|| message.clone());
                    }
                }
                Err(WriteError::Poison(message)) => {
                    // The write of the last state failed for good: the record
                    // that planned it is the poison one; earlier states were
                    // superseded by it.
                    let i = group.last();
                    if let Ok(record) = &batch[i] {
                        let name = spec.projections[group.effect.projection].name.as_str();
                        letters.push((
                            i,
                            DeadLetter::for_record(
                                record,
                                spec.table.item_key(&record.keys),
                                name,
                                message,
                                false,
                            ),
                        ));
                    }
                }
                Err(WriteError::Fatal(message)) => return Err(fatal(message)),
            }
        }

        // 6. Dead letters are durable before their records count as handled.
        if !letters.is_empty() {
            let stored = if self.config.dead_letters {
                let only: Vec<DeadLetter> = letters.iter().map(|(_, l)| l.clone()).collect();
                store.put(&only, self.config.max_retry_time).await
            } else {
                Err(WriteError::Transient(
                    "dead letters are disabled".to_string(),
                ))
            };
            if let Err(error) = stored {
                for (i, letter) in &letters {
                    failed[*i].get_or_insert_with(|| {
                        format!(
                            "{} (and storing the dead letter failed: {error})",
                            letter.error
                        )
                    });
                }
            }
        }
        let stored_letters: Vec<(usize, DeadLetter)> = letters
            .iter()
            .filter(|(i, _)| failed[*i].is_none())
            .cloned()
            .collect();

        // 7. Check the invariants whose scope the batch touched; never
        // changes a record's status.
        let checks = if checking {
            let part = check::Part::Late(recomputing);
            let mut checks =
                check::check_batch(&ctx, batch, options, self.config.concurrency, part).await;
            checks.add(&early_checks);
            checks
        } else {
            CheckStats::default()
        };

        // 8. Report.
        let mut reasons: Vec<Vec<String>> = vec![Vec::new(); n];
        for (i, letter) in &letters {
            reasons[*i].push(format!("{}: {}", letter.projection, letter.error));
        }
        let statuses: Vec<RecordStatus> = (0..n)
            .map(|i| {
                if let Some(message) = failed[i].take() {
                    RecordStatus::Failed(message)
                } else if !reasons[i].is_empty() {
                    RecordStatus::DeadLettered(std::mem::take(&mut reasons[i]))
                } else if let Some(skip) = skips[i].take() {
                    RecordStatus::Skipped(skip)
                } else {
                    RecordStatus::Applied
                }
            })
            .collect();
        let stats = BatchStats {
            records: n,
            effects: n_effects,
            writes: ctx.writes.load(std::sync::atomic::Ordering::Relaxed) as usize,
            write_units: ctx
                .write_micro_units
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6,
            read_units: ctx
                .read_micro_units
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6,
            retries: ctx.retries.load(std::sync::atomic::Ordering::Relaxed),
            dead_letters: statuses
                .iter()
                .filter(|s| matches!(s, RecordStatus::DeadLettered(_)))
                .count(),
            checks,
            requests: ctx.requests(),
        };
        record_metrics(&statuses, &stats);
        let applied = record_lag(spec, batch, &projected, &statuses);
        if let Err(error) = self.control.note_applied(&applied).await {
            tracing::warn!(%error, "could not record the last change applied (for `status`)");
        }
        Ok(BatchOutcome {
            statuses,
            stats,
            letters: stored_letters,
        })
    }

    /// Applies effects planned outside a stream batch (`audit --repair`),
    /// coalesced and written exactly as a batch's are. One result per
    /// effect, and the counts.
    pub async fn apply_effects(
        &self,
        effects: Vec<crate::plan::Effect>,
        read_first: bool,
    ) -> (Vec<Result<(), String>>, BatchStats) {
        let n = effects.len();
        let spec = &*self.spec;
        // The same lease as a batch's: a repair writes definitions too.
        let mut ids: Vec<ProjectionId> = effects.iter().flat_map(effect_projections).collect();
        ids.sort_unstable();
        ids.dedup();
        if !ids.is_empty() {
            let needed = crate::dynamo::time::now_ms() + self.leases_margin() + self.lease_margin();
            if let Err(message) = self.control.lease(&ids, needed).await {
                return (vec![Err(message); n], BatchStats::default());
            }
        }
        let groups = coalesce::coalesce(effects.into_iter().enumerate(), &spec.table);
        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            spec,
            &self.config,
            &*self.control,
        );
        let (recomputes, first): (Vec<_>, Vec<_>) = groups
            .into_iter()
            .partition(|g| matches!(g.effect.op, crate::plan::Op::Recompute { .. }));
        let mut results: Vec<Result<(), String>> = vec![Ok(()); n];
        for phase in [first, recomputes] {
            for Written { group, result } in self.write_phase(&ctx, phase, read_first).await {
                if let Err(error) = result {
                    for &i in &group.contributors {
                        results[i] = Err(error.to_string());
                    }
                }
            }
        }
        let stats = BatchStats {
            effects: n,
            writes: ctx.writes.load(std::sync::atomic::Ordering::Relaxed) as usize,
            write_units: ctx
                .write_micro_units
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6,
            read_units: ctx
                .read_micro_units
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6,
            retries: ctx.retries.load(std::sync::atomic::Ordering::Relaxed),
            requests: ctx.requests(),
            ..BatchStats::default()
        };
        (results, stats)
    }

    /// The violations the online check recorded, for every invariant of
    /// the spec.
    pub async fn recorded_violations(&self) -> Result<Vec<RecordedViolation>, ApplyError> {
        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            &self.spec,
            &self.config,
            &*self.control,
        );
        check::recorded(&ctx).await.map_err(|e| ApplyError::Fatal {
            table: self.table.clone(),
            message: e.to_string(),
        })
    }

    /// Records `found` in the violation store (what an audit found), the
    /// ones not recorded as they are; returns how many were new.
    pub async fn record_violations(
        &self,
        found: &[crate::invariant::Violation],
    ) -> Result<usize, ApplyError> {
        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            &self.spec,
            &self.config,
            &*self.control,
        );
        check::record_all(&ctx, found)
            .await
            .map_err(|e| ApplyError::Fatal {
                table: self.table.clone(),
                message: e.to_string(),
            })
    }

    /// Deletes the recorded violations not in `keep` ((invariant, recorded
    /// key) pairs: what every segment of an audit found) last seen before
    /// `seen_before_ms` (when the audit began); returns how many.
    pub async fn clear_violations_except(
        &self,
        keep: &[(String, String)],
        seen_before_ms: u64,
    ) -> Result<usize, ApplyError> {
        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            &self.spec,
            &self.config,
            &*self.control,
        );
        check::clear_except(&ctx, keep, seen_before_ms)
            .await
            .map_err(|e| ApplyError::Fatal {
                table: self.table.clone(),
                message: e.to_string(),
            })
    }

    /// Writes one phase's groups, or fails them all when the deadline
    /// has come.
    async fn write_before_deadline(
        &self,
        ctx: &ctx::Ctx<'_>,
        phase: Vec<coalesce::Group>,
        options: &BatchOptions,
    ) -> Vec<Written> {
        if phase.is_empty() {
            return Vec::new();
        }
        if options
            .deadline
            .is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            return phase
                .into_iter()
                .map(|group| Written {
                    group,
                    result: Err(WriteError::Transient(
                        "the invocation's deadline is near".to_string(),
                    )),
                })
                .collect();
        }
        self.write_phase(ctx, phase, options.read_markers_first)
            .await
    }

    async fn write_phase(
        &self,
        ctx: &ctx::Ctx<'_>,
        groups: Vec<coalesce::Group>,
        read_markers_first: bool,
    ) -> Vec<Written> {
        use crate::plan::{CustomOp, Op};
        use futures::stream::StreamExt;

        let mut members = Vec::new();
        let mut plain = Vec::new();
        let mut singles = Vec::new();
        for (index, group) in groups.iter().enumerate() {
            match &group.effect.op {
                // Markers are written conditionally, always: any of them
                // may carry counter records, even of a counter the spec no
                // longer has, and a record goes only with its shard moved.
                Op::Membership { .. } | Op::DropRecord { .. } => members.push(index),
                Op::Custom { guard: None, .. } => plain.push(index),
                Op::SetAttributes { .. } | Op::Recompute { .. } | Op::Custom { .. } => {
                    singles.push(index)
                }
            }
        }
        let mut results: Vec<Option<Result<(), WriteError>>> = vec![None; groups.len()];
        // The recomputes whose target was read ahead read their source
        // items (a rollup's shards) together, once, after the first phase
        // (`Ctx::shared_items`).
        ctx.want_items(
            singles
                .iter()
                .filter_map(|&index| match &groups[index].effect.op {
                    Op::Recompute {
                        target,
                        sources: crate::plan::Sources::Items(keys),
                    } if ctx.target_found_ahead(target) => Some(keys),
                    _ => None,
                })
                .flatten()
                .cloned()
                .collect(),
        );

        let member_writes = async {
            let changes: Vec<markers::MarkerChange<'_>> = members
                .iter()
                .filter_map(|&index| markers::marker_change(&self.spec, &groups[index].effect))
                .collect();
            markers::write_markers(ctx, &changes, read_markers_first).await
        };
        let plain_writes = async {
            // Unguarded custom writes need no condition: a put or delete
            // of a state is idempotent.
            let requests = plain
                .iter()
                .map(|&index| match &groups[index].effect.op {
                    Op::Custom {
                        op: CustomOp::Put(item),
                        ..
                    } => writes::put_request(item),
                    Op::Custom {
                        op: CustomOp::Delete(key),
                        ..
                    } => writes::delete_request(ctx, key),
                    _ => unreachable!("partitioned above"),
                })
                .collect();
            writes::batch_write(ctx, requests).await
        };
        // Collected first: a lazily mapped iterator here makes the whole
        // future non-`Send` (a rustc limitation with higher-ranked closures),
        // and callers spawn batches on a multi-threaded runtime.
        let single_futures: Vec<_> = singles
            .iter()
            .map(|&index| {
                let group = &groups[index];
                async move {
                    let result = match &group.effect.op {
                        Op::SetAttributes { key, set, expect } => {
                            writes::set_attributes(ctx, key, set, expect).await
                        }
                        Op::Recompute { target, sources } => {
                            writes::recompute(ctx, group.effect.projection, target, sources).await
                        }
                        Op::Custom {
                            op,
                            guard: Some(guard),
                        } => writes::guarded_custom(ctx, op, guard).await,
                        _ => unreachable!("partitioned above"),
                    };
                    (index, result)
                }
            })
            .collect();
        let single_writes = futures::stream::iter(single_futures)
            .buffer_unordered(self.config.concurrency.max(1))
            .collect::<Vec<_>>();
        let (member_results, plain_results, single_results) =
            tokio::join!(member_writes, plain_writes, single_writes);
        for (&index, result) in members.iter().zip(member_results) {
            results[index] = Some(result);
        }
        for (&index, result) in plain.iter().zip(plain_results) {
            results[index] = Some(result);
        }
        for (index, result) in single_results {
            results[index] = Some(result);
        }
        groups
            .into_iter()
            .zip(results)
            .map(|(group, result)| Written {
                group,
                result: result.expect("every group is written"),
            })
            .collect()
    }
}

/// Whether an effect brings a marker to a state its record's images
/// decide: what a record delivered after newer ones of its item could set
/// back. (Index keys are conditioned on the source, recomputes read it;
/// a custom projection's writes are its code's, applied as they come.)
fn is_marker(effect: &crate::plan::Effect) -> bool {
    matches!(effect.op, crate::plan::Op::Membership { .. })
}

/// Drops a superseded record's marker writes; returns how many.
fn drop_markers(plan: &mut crate::plan::RecordPlan) -> usize {
    let before = plan.effects.len();
    plan.effects.retain(|effect| !is_marker(effect));
    before - plan.effects.len()
}

/// The projections that keep markers, and the counters on them.
fn markers_of(spec: &Spec) -> Vec<ProjectionId> {
    (0..spec.projections.len())
        .filter(|&id| {
            matches!(
                spec.kind(id).writes(&spec.projections[id].name),
                crate::kinds::Writes::Items { .. } | crate::kinds::Writes::Own
            )
        })
        .collect()
}

/// Whether every record can be planned as its item: it carries its new
/// image, or removes it. A stream without new images (`KEYS_ONLY`,
/// `OLD_IMAGE`) cannot: its deliveries are applied as they come.
fn whole_images(batch: &[Result<ChangeRecord, DecodeProblem>]) -> bool {
    batch.iter().flatten().all(|record| {
        record.new_image.is_some() || record.kind == crate::record::ChangeKind::Remove
    })
}

/// The projections an effect writes for: its own, and for a marker the
/// counters whose records ride on it.
fn effect_projections(effect: &crate::plan::Effect) -> Vec<ProjectionId> {
    let mut ids = vec![effect.projection];
    if let crate::plan::Op::Membership { counters, .. } = &effect.op {
        ids.extend(counters.iter().map(|c| c.counter));
    }
    ids
}

/// A batch none of whose `n` records could be applied (its lease was
/// refused, its holds could not be read): every record fails, to be
/// delivered again, and nothing was written.
fn all_failed(reason: String, n: usize, effects: usize, ctx: &ctx::Ctx<'_>) -> BatchOutcome {
    let statuses = vec![RecordStatus::Failed(reason); n];
    let stats = BatchStats {
        records: n,
        effects,
        requests: ctx.requests(),
        ..BatchStats::default()
    };
    record_metrics(&statuses, &stats);
    BatchOutcome {
        statuses,
        stats,
        letters: Vec::new(),
    }
}

/// `projector_lag_seconds{projection}`: for each record applied, the time
/// from its change (`ApproximateCreationDateTime`) to now, once per
/// projection it had effects in; and the batch's largest,
/// `projector_batch_lag_seconds`. Records without a creation time (scans,
/// redrives of letters without one) are left out. Returns each
/// projection's latest change applied.
fn record_lag(
    spec: &crate::spec::Spec,
    batch: &[Result<ChangeRecord, DecodeProblem>],
    projected: &[Vec<ProjectionId>],
    statuses: &[RecordStatus],
) -> Vec<(ProjectionId, i64)> {
    let now_ms = crate::dynamo::time::now_ms() as i64;
    let mut most: Option<f64> = None;
    let mut latest: HashMap<ProjectionId, i64> = HashMap::new();
    // One histogram handle per projection a batch, not a label per record.
    let mut lags: HashMap<ProjectionId, metrics::Histogram> = HashMap::new();
    for ((record, ids), status) in batch.iter().zip(projected).zip(statuses) {
        let (Ok(record), RecordStatus::Applied) = (record, status) else {
            continue;
        };
        let Some(created_ms) = record.approximate_creation_ms else {
            continue;
        };
        let lag = (now_ms - created_ms).max(0) as f64 / 1000.0;
        if !ids.is_empty() {
            most = Some(most.map_or(lag, |m: f64| m.max(lag)));
        }
        for &id in ids {
            lags.entry(id)
                .or_insert_with(|| {
                    let name = &spec.projections[id].name;
                    metrics::histogram!(
                        "projector_lag_seconds",
                        "projection" => name.clone(),
                        "service" => spec.service_of(name).to_string()
                    )
                })
                .record(lag);
            let entry = latest.entry(id).or_insert(created_ms);
            *entry = (*entry).max(created_ms);
        }
    }
    // The batch's largest, one dimension: what the stack alarms on.
    if let Some(most) = most {
        metrics::histogram!("projector_batch_lag_seconds").record(most);
    }
    latest.into_iter().collect()
}

fn record_metrics(statuses: &[RecordStatus], stats: &BatchStats) {
    for status in statuses {
        let label = match status {
            RecordStatus::Applied => "applied",
            RecordStatus::Skipped(_) => "skipped",
            RecordStatus::DeadLettered(_) => "dead_lettered",
            RecordStatus::Failed(_) => "failed",
        };
        metrics::counter!("projector_records_total", "status" => label).increment(1);
    }
    metrics::counter!("projector_effects_total").increment(stats.effects as u64);
    metrics::counter!("projector_writes_total").increment(stats.writes as u64);
    metrics::counter!("projector_write_units_total").increment(stats.write_units.round() as u64);
    if stats.records > 0 {
        metrics::histogram!("projector_write_units_per_record")
            .record(stats.write_units / stats.records as f64);
    }
}

#[cfg(test)]
mod send_tests {
    use super::*;

    fn assert_send<T: Send>(_: T) {}

    #[allow(dead_code, clippy::diverging_sub_expression, unreachable_code)]
    fn apply_batch_is_send(applier: &Applier) {
        // Compiles only if the future can move between threads.
        assert_send(applier.apply_batch(&[], &BatchOptions::default()));
    }
}
