//! The projection lifecycle: which definitions of each projection wrote the
//! derived data in the table, whether a backfill brought all of it to the
//! spec's definition, and what a deploy needs next.
//!
//! Everything is kept in the table, under the reserved partition
//! `_ddbp#lifecycle` (tables without a sort key: `_ddbp#lifecycle#<sk>`):
//!
//! - **Leases** (sort key `leases`, one item). Every process that writes
//!   derived data (the Lambda, the runner, `backfill`, `replay`, `dlq
//!   redrive`, `recover`) first takes a lease for each projection it writes
//!   and the fingerprint of the definition it writes it with:
//!   `w#<fingerprint>#<projection>` holds the time (ms) until which it may
//!   write. A stream consumer (the Lambda, the runner) also writes
//!   `c#…` (the same time), `s#…` (when one first ran it), and for its
//!   spec `C#<fp>`, `S#<fp>` and `N#<fp>` (its lease, first run and
//!   projection names; `<fp>@<consumer>` for a named consumer): a
//!   consumer without a projection leaves that projection's changes
//!   unprojected, which [`states`] reads as a definition `-` of it. A
//!   writer renews its lease before a batch that could
//!   outlast it, so a batch needs no request of its own
//!   ([`Leases::ensure`]); it never writes past its lease.
//! - **Projection records** (sort key `p#<projection>`): the backfill under
//!   way (`claimRun`, `claimFp`, `claimFromMs`) and the last complete one
//!   (`doneRun`, `doneFp`, `doneFromMs`, `doneAtMs`).
//! - **Spec texts** (sort key `spec#<fingerprint of the spec>`): the spec a
//!   lease's definition came from (`d#…` names it), so that `prune` can
//!   remove what a projection that no spec file has any more derived.
//!
//! **Architecture Invariant:** a projection is *live* only when a backfill
//! of its definition `f` completed, a stream consumer runs `f`, and no
//! lease of any other definition (nor of a consumer without it) lasted
//! past the instant the backfill started. Every item's derived data was
//! then written by `f`: the backfill brought each item to `f` after every
//! other writer had stopped, and only writers of `f` wrote since. `status`
//! computes this from the leases at every call ([`states`]), so a writer of
//! another definition that runs later (a rollback, a stale environment, a
//! redrive with an old spec file) turns the projection back from live at
//! once; nothing has to remember to clear a flag.

mod registry;
mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue as Av;

pub use crate::dynamo::names::LIFECYCLE_PK;
pub use crate::dynamo::retry::is_condition_failure;
pub use crate::dynamo::time::now_ms;
pub use registry::{ClaimOutcome, Completion, Registry, LEASES_VERSION};
pub use status::{
    hex, iso, states, Applied, BackfillRun, Commands, ConsumerSpec, Definition, ProjectionStatus,
    ReadVersion, Record, Snapshot, State, WITHOUT,
};

use registry::{lease_names, number, parse_leases, APPLIED, LEASES};

use crate::apply::{lease_length, ApplyError};
use crate::dynamo::retry::{describe as retry_describe, Retrier, LAYOUT_READS};
use crate::spec::raw::{RawProjection, RawSpec};
use crate::spec::{counter_storage, old_version_name, ProjectionId, ProjectionKind, Spec};

/// How often a stream consumer records the last change it applied.
const APPLIED_EVERY: Duration = Duration::from_secs(30);

/// Where a changed counter is built, and whether its old version is kept
/// current beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterLayout {
    /// The counter.
    pub name: String,
    /// The generation its definition writes.
    pub generation: u32,
    /// The version readers read, when it is another definition: kept
    /// current under `<name>~<its generation>` while this one is built, or (when it
    /// cannot be) rebuilt in place.
    pub old: Option<OldVersion>,
}

/// A counter's old version, as [`Registry::layout`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldVersion {
    /// Its generation.
    pub generation: u32,
    /// Its definition.
    pub fingerprint: String,
    /// `None`: kept current beside the new one; else why it cannot be.
    /// The new one is built in the next generation all the same (never
    /// in the one readers read, so no two definitions write one storage):
    /// readers then read the old version's last values, not kept current,
    /// until the backfill completes.
    pub not_kept: Option<String>,
}

impl Registry {
    /// The spec a process runs: `spec` with each changed counter built in
    /// the generation after the one readers read, and the version they
    /// read kept current beside it as `<name>~<generation>` (unless it
    /// cannot be: see [`OldVersion::not_kept`]; its definition comes from the
    /// spec text the registry stored for it). A counter readers read
    /// already, or never read, is written where it is. A table without a
    /// registry gives `spec` as it is.
    pub async fn layout(&self, spec: &Spec) -> Result<(Spec, Vec<CounterLayout>), ApplyError> {
        let counters: Vec<&str> = spec
            .projections
            .iter()
            .enumerate()
            .filter(|(id, p)| {
                matches!(p.kind, ProjectionKind::Counter(_)) && !spec.is_old_version(*id)
            })
            .map(|(_, p)| p.name.as_str())
            .collect();
        if counters.is_empty() {
            return Ok((spec.clone(), Vec::new()));
        }
        let snapshot = match self.snapshot(spec).await {
            Ok(snapshot) => snapshot,
            Err(error) if error.to_string().contains("ResourceNotFound") => {
                return Ok((spec.clone(), Vec::new()))
            }
            Err(error) => return Err(error),
        };
        let mut old_texts: HashMap<String, Option<RawSpec>> = HashMap::new();
        let mut layouts = Vec::new();
        // The spec as written (a spec laid out already is laid out anew).
        let mut raw = spec.raw.clone();
        raw.projections
            .retain(|p| p.definition().name() == p.name());
        for p in &mut raw.projections {
            *p = p.definition();
        }
        let mut shadows = Vec::new();
        let mut frozen = Vec::new();
        for name in counters {
            let projection = &spec.projections[spec.projection_id(name).expect("listed")];
            let f = hex(projection.fingerprint);
            let record = snapshot.record(name);
            let Some((read_gen, read_fp)) = record.read_version() else {
                set_storage(&mut raw, name, record.floor);
                layouts.push(CounterLayout {
                    name: name.to_string(),
                    generation: record.floor,
                    old: None,
                });
                continue;
            };
            if read_fp == f {
                set_storage(&mut raw, name, read_gen);
                layouts.push(CounterLayout {
                    name: name.to_string(),
                    generation: read_gen,
                    old: None,
                });
                continue;
            }
            let build = read_gen + 1;
            let old_name = old_version_name(name, read_gen);
            let mut not_kept = None;
            // While the counter was out of the spec, nobody kept the
            // version readers read: there is nothing current to keep.
            let read_from = record.backfilled.as_ref().map_or(0, |done| done.from_ms);
            if record
                .definition(WITHOUT)
                .is_some_and(|without| without.writes_until + self.skew_ms >= read_from)
            {
                not_kept = Some(format!(
                    "a worker without `{name}` ran after the version readers read was built: that version missed its changes"
                ));
            }
            // The old definition, as the spec that ran it had it.
            let old_raw = match record.definition(&read_fp).and_then(|d| d.spec_key.clone()) {
                Some(key) => {
                    if !old_texts.contains_key(&key) {
                        let parsed = self
                            .spec_text(&key)
                            .await?
                            .and_then(|text| toml::from_str::<RawSpec>(&text).ok());
                        old_texts.insert(key.clone(), parsed);
                    }
                    old_texts[&key].as_ref().and_then(|old| {
                        old.projections
                            .iter()
                            .find(|p| {
                                matches!(p, RawProjection::Counter { .. }) && p.name() == name
                            })
                            .cloned()
                    })
                }
                None => None,
            };
            let new_raw = raw.projections.iter().find(|p| p.name() == name).cloned();
            let source = |p: &RawProjection| match p {
                RawProjection::Counter { source, .. } => Some(source.clone()),
                _ => None,
            };
            match (&old_raw, &new_raw) {
                _ if not_kept.is_some() => {}
                (None, _) => {
                    not_kept = Some(format!(
                        "the registry has no stored spec with definition {read_fp} of `{name}`"
                    ))
                }
                // Lambda's event filters pass the entities the new spec
                // uses: the old version would not see its source's changes.
                (Some(old), Some(new)) if source(old) != source(new) => {
                    not_kept = Some(
                        "the version readers read counts another entity than this definition"
                            .to_string(),
                    )
                }
                (Some(old), _) => {
                    let mut shadow = old.definition();
                    if let RawProjection::Counter {
                        name: shadow_name,
                        storage,
                        ..
                    } = &mut shadow
                    {
                        *shadow_name = old_name.clone();
                        *storage = Some(counter_storage(name, read_gen));
                    }
                    // The old definition must mean in this spec what it
                    // meant in its own: same fingerprint (entities,
                    // placement).
                    let mut trial = raw.clone();
                    set_storage(&mut trial, name, build);
                    trial.projections.push(shadow.clone());
                    match Spec::compile_composed(
                        trial,
                        &spec.file,
                        custom_projections(spec),
                        spec.services.clone(),
                    ) {
                        Ok(compiled) => {
                            let id = compiled.projection_id(&old_name).expect("added");
                            if hex(compiled.projections[id].fingerprint) == read_fp {
                                shadows.push(shadow);
                            } else {
                                not_kept = Some(format!(
                                    "definition {read_fp} of `{name}` would mean something else beside this spec (its entities or the edge it rides on changed)"
                                ));
                            }
                        }
                        Err(errors) => {
                            not_kept = Some(format!(
                                "definition {read_fp} of `{name}` does not compile beside this spec: {errors}"
                            ))
                        }
                    }
                }
            }
            let generation = build;
            set_storage(&mut raw, name, generation);
            if not_kept.is_some() {
                frozen.push(counter_storage(name, read_gen));
            }
            if let Some(why) = &not_kept {
                tracing::warn!(counter = %name, "the version readers read cannot be kept current while the changed counter is rebuilt: they read its last values until the rebuild's backfill completes: {why}");
            }
            layouts.push(CounterLayout {
                name: name.to_string(),
                generation,
                old: Some(OldVersion {
                    generation: read_gen,
                    fingerprint: read_fp,
                    not_kept,
                }),
            });
        }
        raw.projections.extend(shadows);
        let mut compiled = Spec::compile_composed(
            raw,
            &spec.file,
            custom_projections(spec),
            spec.services.clone(),
        )
        .map_err(|errors| ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("the counters' versions do not compile beside the spec: {errors}"),
        })?;
        compiled.frozen = frozen;
        Ok((compiled, layouts))
    }
}

type LayoutCache = HashMap<(String, u64), (Arc<Spec>, std::time::Instant)>;
static LAYOUTS: OnceLock<tokio::sync::Mutex<LayoutCache>> = OnceLock::new();

/// How many times a writer of this process was refused for a stale
/// layout: a long-running process lays its spec out again when it moves.
static LAYOUT_REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a writer of this process was refused for a stale layout
/// (see [`current_layout`]; the runner lays out again when it moves).
pub fn layout_refusals() -> u64 {
    LAYOUT_REFUSALS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A writer on `table` was refused for a stale layout: the next
/// [`current_layout`] reads it again.
async fn layout_is_stale(table: &str) {
    LAYOUT_REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(cache) = LAYOUTS.get() {
        cache.lock().await.retain(|(t, _), _| t != table);
    }
}

/// The spec a long-running process (the Lambda) runs on `table`: `spec`
/// laid out by [`Registry::layout`], read again once per lease period, so
/// that a worker takes up a counter's new version, and drops its old one,
/// within a lease period of the backfill that completes it. A failed
/// read keeps the last layout; with none, it is the error.
pub async fn current_layout(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Arc<Spec>,
) -> Result<Arc<Spec>, ApplyError> {
    if !spec
        .projections
        .iter()
        .any(|p| matches!(p.kind, ProjectionKind::Counter(_)))
    {
        return Ok(spec.clone());
    }
    let key = (table.to_string(), spec.projections_fingerprint());
    let mut cache = LAYOUTS.get_or_init(Default::default).lock().await;
    if let Some((laid, at)) = cache.get(&key) {
        if at.elapsed() < lease_length() {
            return Ok(laid.clone());
        }
    }
    let registry = Registry::new(client.clone(), table, &spec.table);
    // Throttling and lost answers are tried again a few times, briefly
    // (the registry's reads are not classified).
    let mut retrier = Retrier::scheduled(LAYOUT_READS);
    let mut read = registry.layout(spec).await;
    while read.is_err() && retrier.wait(|_| {}).await {
        read = registry.layout(spec).await;
    }
    match read {
        Ok((laid, _)) => {
            let laid = Arc::new(laid);
            cache.insert(key, (laid.clone(), std::time::Instant::now()));
            Ok(laid)
        }
        Err(error) => match cache.get(&key) {
            Some((laid, _)) => {
                tracing::warn!(%error, "reading the counters' layout failed: keeping the last one");
                Ok(laid.clone())
            }
            None => Err(error),
        },
    }
}

/// Sets counter `name`'s storage to generation `generation`'s.
fn set_storage(raw: &mut RawSpec, name: &str, generation: u32) {
    for p in &mut raw.projections {
        if let RawProjection::Counter {
            name: n, storage, ..
        } = p
        {
            if n == name {
                *storage = (generation != 0).then(|| counter_storage(name, generation));
            }
        }
    }
}

/// The projections of `spec` written in Rust.
fn custom_projections(spec: &Spec) -> Vec<Arc<dyn crate::plan::CustomProjection>> {
    spec.projections
        .iter()
        .filter_map(|p| match &p.kind {
            ProjectionKind::Custom(custom) => Some(custom.clone()),
            ProjectionKind::IndexKeys(_)
            | ProjectionKind::Denormalize(_)
            | ProjectionKind::InverseEdge(_)
            | ProjectionKind::Counter(_)
            | ProjectionKind::Recomputed(_) => None,
        })
        .collect()
}

/// A process's leases on one table: taken before the first write of a
/// definition, renewed before a batch that could outlast them.
#[derive(Debug)]
pub struct Leases {
    registry: Registry,
    spec: Arc<Spec>,
    consumer: bool,
    /// The consumer's name (`--consumer`), recorded with its spec.
    name: Option<String>,
    length: Duration,
    state: tokio::sync::Mutex<LeaseState>,
    /// The last change each projection applied, and when it was last
    /// recorded.
    applied: StdMutex<(HashMap<ProjectionId, Applied>, Option<std::time::Instant>)>,
}

#[derive(Debug, Default)]
struct LeaseState {
    /// Until when each projection's lease runs (ms), as this process wrote it.
    until: HashMap<ProjectionId, u64>,
    /// The spec's text is stored, and (for a writer that is not a stream
    /// consumer) the deployed definitions were checked.
    started: bool,
}

type LeaseKey = (String, u64, bool, Option<String>);

/// One attribute a renewal sets.
enum Set {
    /// A lease end: only ever moved later.
    Until(String),
    /// Set once: the first time.
    Since(String),
    /// A plain value.
    Text(String, String),
    /// The spec's projection names.
    Names(String),
}

impl Leases {
    /// The leases this process holds on `table` for `spec`'s definitions
    /// (one set per table, definition and role, shared by every applier).
    pub fn shared(
        client: &aws_sdk_dynamodb::Client,
        table: &str,
        spec: &Arc<Spec>,
        consumer: bool,
        name: Option<&str>,
        length: Duration,
    ) -> Arc<Leases> {
        static ALL: OnceLock<StdMutex<HashMap<LeaseKey, Arc<Leases>>>> = OnceLock::new();
        let key = (
            table.to_string(),
            spec.projections_fingerprint(),
            consumer,
            name.map(str::to_string),
        );
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .expect("leases lock");
        all.entry(key)
            .or_insert_with(|| {
                Arc::new(Leases {
                    registry: Registry::new(client.clone(), table, &spec.table),
                    spec: spec.clone(),
                    consumer,
                    name: name.map(str::to_string),
                    length,
                    state: tokio::sync::Mutex::new(LeaseState::default()),
                    applied: StdMutex::new((HashMap::new(), None)),
                })
            })
            .clone()
    }

    fn spec_key(&self) -> String {
        format!("spec#{}", hex(self.spec.projections_fingerprint()))
    }

    /// Notes the changes a stream consumer applied (projection, change
    /// time in ms), and records the latest of each in the registry at
    /// most every [`APPLIED_EVERY`] (for `status`). Only a consumer
    /// records: a backfill or replay applies old changes.
    pub async fn note_applied(&self, changes: &[(ProjectionId, i64)]) -> Result<(), ApplyError> {
        if !self.consumer || changes.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let due: Vec<(ProjectionId, Applied)> = {
            let mut board = self.applied.lock().expect("applied lock");
            for &(id, change_ms) in changes {
                let entry = board.0.entry(id).or_insert(Applied {
                    change_ms,
                    applied_ms: now,
                });
                if change_ms >= entry.change_ms {
                    *entry = Applied {
                        change_ms,
                        applied_ms: now,
                    };
                }
            }
            if board.1.is_some_and(|at| at.elapsed() < APPLIED_EVERY) {
                return Ok(());
            }
            board.1 = Some(std::time::Instant::now());
            board.0.iter().map(|(id, a)| (*id, *a)).collect()
        };
        // 4 KB of expression: 20 projections a request.
        for chunk in due.chunks(20) {
            let mut update = self
                .registry
                .client
                .update_item()
                .table_name(&self.registry.table)
                .set_key(Some(self.registry.key(APPLIED)));
            let mut parts = Vec::new();
            for (i, (id, applied)) in chunk.iter().enumerate() {
                let name = &self.spec.projections[*id].name;
                update = update
                    .expression_attribute_names(format!("#c{i}"), format!("c#{name}"))
                    .expression_attribute_names(format!("#a{i}"), format!("a#{name}"))
                    .expression_attribute_values(
                        format!(":c{i}"),
                        Av::N(applied.change_ms.to_string()),
                    )
                    .expression_attribute_values(
                        format!(":a{i}"),
                        Av::N(applied.applied_ms.to_string()),
                    );
                parts.push(format!("#c{i} = :c{i}, #a{i} = :a{i}"));
            }
            update
                .update_expression(format!("SET {}", parts.join(", ")))
                .send()
                .await
                .map_err(|e| self.registry.fatal("writing", e))?;
        }
        Ok(())
    }

    /// Makes sure this process may write `written` (a stream consumer:
    /// every projection) until `needed` (ms): a request only when its
    /// leases run out before. Returns until when it may write them.
    pub async fn ensure(&self, written: &[ProjectionId], needed: u64) -> Result<u64, String> {
        let ids: Vec<ProjectionId> = if self.consumer {
            (0..self.spec.projections.len()).collect()
        } else {
            written.to_vec()
        };
        let mut state = self.state.lock().await;
        let valid = |state: &LeaseState| {
            ids.iter()
                .map(|id| state.until.get(id).copied().unwrap_or(0))
                .min()
                .unwrap_or(u64::MAX)
        };
        if valid(&state) >= needed {
            return Ok(valid(&state));
        }
        let now = now_ms();
        // A lease taken anew (first, or after it ran out: a long replay
        // that wrote nothing of a counter for a while) is checked again:
        // a backfill may have completed, or another definition deployed,
        // while this process held none.
        let lapsed = ids
            .iter()
            .any(|id| state.until.get(id).copied().unwrap_or(0) < now);
        if !state.started {
            self.store_spec().await?;
        }
        if (!state.started || lapsed) && !self.consumer {
            self.check_deployed().await?;
        }
        if (!state.started || lapsed) && self.consumer {
            self.check_consumers().await?;
        }
        let until = needed.max(now) + self.length.as_millis() as u64;
        self.renew(&ids, until, now, !state.started || lapsed)
            .await?;
        if !state.started || lapsed {
            // Checked once the lease is held: a backfill that completes
            // later sees it (`complete` is fenced by the leases' version),
            // one that completed before is read here.
            self.check_layout().await?;
            state.started = true;
        }
        for &id in &ids {
            let entry = state.until.entry(id).or_insert(0);
            *entry = (*entry).max(until);
        }
        Ok(valid(&state))
    }

    /// Warns (a logged error and `projector_consumer_conflicts_total`)
    /// when another consumer's spec running on the table conflicts with
    /// this one's ([`Registry::consumer_conflicts`]). The batch goes on:
    /// refusing it would send records to the mapping's failure queue, and
    /// which of two consumers a refusal hit would depend on which was idle
    /// last. `run` refuses to start, and `check --table` (which
    /// `infra/deploy` runs) refuses the deploy.
    async fn check_consumers(&self) -> Result<(), String> {
        let conflicts = self
            .registry
            .consumer_conflicts(&self.spec, self.name.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        for conflict in &conflicts {
            tracing::error!(consumer = self.name.as_deref().unwrap_or(""), "{conflict}");
            metrics::counter!(
                "projector_consumer_conflicts_total",
                "consumer" => self.name.clone().unwrap_or_default()
            )
            .increment(1);
        }
        Ok(())
    }

    /// A writer that is not the stream's consumer (a backfill, a redrive,
    /// a recovery) refuses to write a definition other than the one a
    /// consumer is running now: its spec file is not the deployed one, and
    /// it would undo what the worker writes.
    async fn check_deployed(&self) -> Result<(), String> {
        let leases = self.registry.get(self.registry.key(LEASES)).await;
        let Some(item) = leases.map_err(|e| format!("reading the lifecycle leases: {e}"))? else {
            return Ok(());
        };
        let (records, _) = parse_leases(&item);
        let now = now_ms();
        for projection in &self.spec.projections {
            let f = hex(projection.fingerprint);
            let Some(record) = records.get(&projection.name) else {
                continue;
            };
            let running = record
                .definitions
                .iter()
                .filter(|d| d.fingerprint != f && d.fingerprint != WITHOUT)
                .filter(|d| d.consumed_until.is_some_and(|until| until >= now))
                .max_by_key(|d| d.consumed_until);
            let mine = record
                .definition(&f)
                .and_then(|d| d.consumed_until)
                .unwrap_or(0);
            if let Some(other) = running.filter(|d| d.consumed_until.unwrap_or(0) > mine) {
                return Err(format!(
                    "the deployed worker runs another definition of `{}` ({}, lease until {}) than {} ({f}): writing this one would undo its work; use the deployed spec",
                    projection.name,
                    other.fingerprint,
                    iso(other.consumed_until.unwrap_or(0)),
                    self.spec.file
                ));
            }
        }
        Ok(())
    }

    /// A writer whose counters are not where the registry's layout puts
    /// them (a spec from its file, not from [`Registry::layout`]) would
    /// write a changed definition over the version readers read: refused.
    async fn check_layout(&self) -> Result<(), String> {
        let (laid, _) = self
            .registry
            .layout(&self.spec)
            .await
            .map_err(|error| format!("reading the counters' layout: {error}"))?;
        for (id, projection) in self.spec.projections.iter().enumerate() {
            let ProjectionKind::Counter(mine) = &projection.kind else {
                continue;
            };
            if self.spec.is_old_version(id) {
                continue;
            }
            let Some(ProjectionKind::Counter(wanted)) = laid
                .projection_id(&projection.name)
                .map(|id| &laid.projections[id].kind)
            else {
                continue;
            };
            if wanted.storage != mine.storage {
                layout_is_stale(&self.registry.table).await;
                return Err(format!(
                    "counter `{}` of {} would write under `{}`, but its versions are laid out for `{}` (a changed counter is built beside the version readers read): lay the spec out with `control::Registry::layout` (the CLI, the Lambda and the runner do)",
                    projection.name, self.spec.file, mine.storage, wanted.storage
                ));
            }
        }
        Ok(())
    }

    async fn store_spec(&self) -> Result<(), String> {
        let text = toml::to_string(&self.spec.raw)
            .map_err(|e| format!("cannot serialize the spec for the lifecycle registry: {e}"))?;
        let mut item = self.registry.key(&self.spec_key());
        item.insert("text".to_string(), Av::S(text));
        item.insert("file".to_string(), Av::S(self.spec.file.clone()));
        let sent = self
            .registry
            .client
            .put_item()
            .table_name(&self.registry.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#t)")
            .expression_attribute_names("#t", "text")
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(error) if is_condition_failure(&error) => Ok(()),
            Err(error) => Err(format!(
                "storing the spec in the lifecycle registry: {}",
                retry_describe(&error)
            )),
        }
    }

    /// Updates of the leases item; a lease end only ever moves later,
    /// whichever process of the same definition writes last.
    /// Moves the leases of `ids` to `until`; `anew` (a lease taken first
    /// or after it ran out, which a layout check follows) also moves the
    /// leases' version, which completions are fenced by.
    async fn renew(
        &self,
        ids: &[ProjectionId],
        until: u64,
        now: u64,
        anew: bool,
    ) -> Result<(), String> {
        let mut sets: Vec<Set> = Vec::new();
        let spec_key = self.spec_key();
        for &id in ids {
            let projection = &self.spec.projections[id];
            let [w, c, s, d] = lease_names(&hex(projection.fingerprint), &projection.name);
            sets.push(Set::Until(w));
            sets.push(Set::Text(d, spec_key.clone()));
            sets.push(Set::Text(
                format!("k#{}", projection.name),
                projection.kind_name().to_string(),
            ));
            if self.consumer {
                sets.push(Set::Until(c));
                sets.push(Set::Since(s));
            }
        }
        if self.consumer && !self.spec.projections.is_empty() {
            // A named consumer's run of a spec is its own (`<fp>@<name>`):
            // when it first ran it, and until when.
            let mut fingerprint = hex(self.spec.projections_fingerprint());
            if let Some(name) = &self.name {
                fingerprint = format!("{fingerprint}@{name}");
            }
            sets.push(Set::Until(format!("C#{fingerprint}")));
            sets.push(Set::Since(format!("S#{fingerprint}")));
            sets.push(Set::Names(format!("N#{fingerprint}")));
        }
        // Expressions are limited to 4 KB: 20 attributes per request.
        for chunk in sets.chunks(20) {
            let mut skip: Vec<bool> = vec![false; chunk.len()];
            for _attempt in 0..4 {
                let mut update = self
                    .registry
                    .client
                    .update_item()
                    .table_name(&self.registry.table)
                    .set_key(Some(self.registry.key(LEASES)))
                    .return_values_on_condition_check_failure(
                        aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
                    );
                let mut parts = Vec::new();
                let mut conditions = Vec::new();
                let (mut uses_until, mut uses_now) = (false, false);
                for (i, set) in chunk.iter().enumerate() {
                    if skip[i] {
                        continue;
                    }
                    let name = match set {
                        Set::Until(name) | Set::Since(name) | Set::Names(name) => name,
                        Set::Text(name, _) => name,
                    };
                    update = update.expression_attribute_names(format!("#a{i}"), name);
                    match set {
                        Set::Until(_) => {
                            uses_until = true;
                            parts.push(format!("#a{i} = :until"));
                            conditions
                                .push(format!("(attribute_not_exists(#a{i}) OR #a{i} < :until)"));
                        }
                        Set::Since(_) => {
                            uses_now = true;
                            parts.push(format!("#a{i} = if_not_exists(#a{i}, :now)"));
                        }
                        Set::Text(_, value) => {
                            update = update.expression_attribute_values(
                                format!(":v{i}"),
                                Av::S(value.clone()),
                            );
                            parts.push(format!("#a{i} = :v{i}"));
                        }
                        Set::Names(_) => {
                            let names: Vec<String> = self
                                .spec
                                .projections
                                .iter()
                                .map(|p| p.name.clone())
                                .collect();
                            update =
                                update.expression_attribute_values(format!(":v{i}"), Av::Ss(names));
                            parts.push(format!("#a{i} = :v{i}"));
                        }
                    }
                }
                if parts.is_empty() {
                    break;
                }
                if uses_until {
                    update = update.expression_attribute_values(":until", Av::N(until.to_string()));
                }
                if uses_now {
                    update = update.expression_attribute_values(":now", Av::N(now.to_string()));
                }
                if !conditions.is_empty() {
                    update = update.condition_expression(conditions.join(" AND "));
                }
                let update = if anew {
                    update
                        .update_expression(format!("SET {} ADD #ver :one", parts.join(", ")))
                        .expression_attribute_names("#ver", LEASES_VERSION)
                        .expression_attribute_values(":one", Av::N("1".to_string()))
                } else {
                    update.update_expression(format!("SET {}", parts.join(", ")))
                };
                match update.send().await {
                    Ok(_) => break,
                    Err(error) if is_condition_failure(&error) => {
                        // Another process of the same definition holds a
                        // later end for some of them: those stay.
                        let old = error.as_service_error().and_then(|e| match e {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(e) => e.item().cloned(),
                            _ => None,
                        });
                        let old = match old {
                            Some(item) => item,
                            None => self
                                .registry
                                .client
                                .get_item()
                                .table_name(&self.registry.table)
                                .set_key(Some(self.registry.key(LEASES)))
                                .consistent_read(true)
                                .send()
                                .await
                                .map_err(|e| {
                                    format!("reading the lifecycle leases: {}", retry_describe(&e))
                                })?
                                .item()
                                .cloned()
                                .unwrap_or_default(),
                        };
                        for (i, set) in chunk.iter().enumerate() {
                            if let Set::Until(name) = set {
                                if number(&old, name).is_some_and(|existing| existing >= until) {
                                    skip[i] = true;
                                }
                            }
                        }
                    }
                    Err(error) => {
                        return Err(format!(
                            "renewing the lifecycle lease on {}: {}",
                            self.registry.table,
                            retry_describe(&error)
                        ))
                    }
                }
            }
        }
        metrics::counter!("projector_lease_renewals_total").increment(1);
        Ok(())
    }
}
