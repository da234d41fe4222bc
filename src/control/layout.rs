//! Counter layout and generations: where each counter of a spec is
//! written, the version readers read kept current beside a changed
//! counter while it is rebuilt ([`Registry::layout`]), and the layout a
//! long-running process caches for a lease period ([`current_layout`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::registry::Registry;
use super::status::{hex, WITHOUT};
use crate::apply::{lease_length, ApplyError};
use crate::dynamo::retry::{Retrier, LAYOUT_READS};
use crate::spec::raw::{RawProjection, RawSpec};
use crate::spec::{counter_storage, old_version_name, Spec};

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
            .counters()
            .filter(|(id, _, _)| !spec.is_old_version(*id))
            .map(|(_, p, _)| p.name.as_str())
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
                            .find(|p| matches!(p, RawProjection::Counter(_)) && p.name() == name)
                            .cloned()
                    })
                }
                None => None,
            };
            let new_raw = raw.projections.iter().find(|p| p.name() == name).cloned();
            let source = |p: &RawProjection| match p {
                RawProjection::Counter(counter) => Some(counter.source.clone()),
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
                    if let RawProjection::Counter(counter) = &mut shadow {
                        counter.name = old_name.clone();
                        counter.storage = Some(counter_storage(name, read_gen));
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
                        spec.custom_projections(),
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
            spec.custom_projections(),
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
pub(super) async fn layout_is_stale(table: &str) {
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
    if spec.counters().next().is_none() {
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

/// Completes with `file_spec` laid out anew once its layout is no longer
/// `current`'s (a rebuilt counter's backfill completed or began): a
/// long-running runner then stops after its batches in flight and goes on
/// with the new layout. Read once per lease period, or at once when a
/// writer of this process was refused for a stale layout; a failed read
/// keeps `current`.
pub async fn relaid(registry: &Registry, file_spec: &Spec, current: &Spec) -> Spec {
    let mut refusals = layout_refusals();
    loop {
        let started = tokio::time::Instant::now();
        while started.elapsed() < lease_length() && layout_refusals() == refusals {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        refusals = layout_refusals();
        match registry.layout(file_spec).await {
            Ok((laid, _))
                if laid.projections_fingerprint() != current.projections_fingerprint() =>
            {
                return laid;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "reading the counters' layout failed: keeping this one");
            }
        }
    }
}

/// Sets counter `name`'s storage to generation `generation`'s.
fn set_storage(raw: &mut RawSpec, name: &str, generation: u32) {
    for p in &mut raw.projections {
        if let RawProjection::Counter(counter) = p {
            if counter.name == name {
                counter.storage = (generation != 0).then(|| counter_storage(name, generation));
            }
        }
    }
}
