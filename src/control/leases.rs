//! Leases: a process's right to write derived data of its definitions
//! until an instant, taken before its first write and renewed before a
//! batch that could outlast it; a stream consumer's leases also record
//! that it runs its spec, and the last change it applied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use futures::future::BoxFuture;

use super::layout::layout_is_stale;
use super::registry::{
    lease_names, number, parse_leases, Registry, APPLIED, HOLDER_PREFIX, LEASES, LEASES_VERSION,
};
use super::status::{hex, Applied, WITHOUT};
use crate::apply::{ApplyConfig, ApplyError, Control, CounterVersion};
use crate::dynamo::retry::{describe as retry_describe, is_condition_failure};
use crate::dynamo::time::{iso, now_ms};
use crate::spec::{ProjectionId, Spec};

/// How often a stream consumer records the last change it applied.
pub(super) const APPLIED_EVERY: Duration = Duration::from_secs(30);

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
    /// This process's id for these leases (`h#<holder>` items): who else
    /// may still write is what giving leases back asks.
    holder: String,
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
    /// A stream consumer's lease of its spec (`C#...`).
    consumer_until: u64,
}

type LeaseKey = (String, u64, bool, Option<String>);

/// The projection names a consumer of a spec without projections records
/// (`N#...` is a string set, never empty): no projection is named so.
const NO_PROJECTION: &str = "_ddbp#none";

/// Every set of leases this process holds, by table, definition and role.
fn all() -> &'static StdMutex<HashMap<LeaseKey, Arc<Leases>>> {
    static ALL: OnceLock<StdMutex<HashMap<LeaseKey, Arc<Leases>>>> = OnceLock::new();
    ALL.get_or_init(Default::default)
}

/// What giving leases back did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GaveBack {
    /// The leases now end when they were given back.
    Ended {
        /// Lease attributes moved back to now.
        leases: usize,
    },
    /// Another process still holds leases on the table (or the table has
    /// no sort key to record holders under): this process's leases run to
    /// their end.
    Kept {
        /// Why.
        why: String,
    },
}

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
        let key = (
            table.to_string(),
            spec.projections_fingerprint(),
            consumer,
            name.map(str::to_string),
        );
        let mut all = all().lock().expect("leases lock");
        all.entry(key)
            .or_insert_with(|| {
                Arc::new(Leases {
                    registry: Registry::new(client.clone(), table, &spec.table),
                    spec: spec.clone(),
                    consumer,
                    name: name.map(str::to_string),
                    length,
                    holder: format!(
                        "{:016x}",
                        crate::schema::fingerprint(&format!(
                            "{}:{:?}:{}",
                            std::process::id(),
                            std::time::SystemTime::now(),
                            Arc::as_ptr(spec) as usize
                        ))
                    ),
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
    /// most every `APPLIED_EVERY` (for `status`). Only a consumer
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
        // A stream consumer of a spec without projections (a table nothing
        // is registered for) still leases its spec: it is a worker
        // *without* every projection the table had.
        let empty_consumer = self.consumer && ids.is_empty();
        let valid = |state: &LeaseState| {
            if empty_consumer {
                return state.consumer_until;
            }
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
            .any(|id| state.until.get(id).copied().unwrap_or(0) < now)
            || (empty_consumer && state.consumer_until < now);
        // The spec is stored while what runs is checked: one round trip.
        let store = async {
            match state.started {
                false => self.store_spec().await,
                true => Ok(()),
            }
        };
        let check = async {
            match (!state.started || lapsed, self.consumer) {
                (true, false) => self.check_deployed().await,
                (true, true) => self.check_consumers().await,
                (false, _) => Ok(()),
            }
        };
        let (stored, checked) = tokio::join!(store, check);
        stored?;
        checked?;
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
        if self.consumer {
            state.consumer_until = state.consumer_until.max(until);
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
        for (id, projection, mine) in self.spec.counters() {
            if self.spec.is_old_version(id) {
                continue;
            }
            let Some(wanted) = laid
                .projection_id(&projection.name)
                .and_then(|id| laid.counter(id))
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

    /// Records that this holder may write until `until` (ms).
    async fn hold(&self, until: u64) -> Result<(), String> {
        let mut item = self
            .registry
            .key(&format!("{HOLDER_PREFIX}{}", self.holder));
        item.insert("until".to_string(), Av::N(until.to_string()));
        item.insert("untilAt".to_string(), Av::S(iso(until)));
        // Read by the table's TTL, when the spec names `expires`-like
        // attributes it does not matter: holders are read by `until`.
        item.insert("pid".to_string(), Av::N(std::process::id().to_string()));
        self.registry
            .client
            .put_item()
            .table_name(&self.registry.table)
            .set_item(Some(item))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| format!("recording the lease holder: {}", retry_describe(&e)))
    }

    /// The lease attributes this holder has written (all of them for a
    /// stream consumer, the projections written for another writer).
    fn attributes(&self, until: &HashMap<ProjectionId, u64>) -> Vec<String> {
        let ids: Vec<ProjectionId> = if self.consumer {
            (0..self.spec.projections.len()).collect()
        } else {
            until.keys().copied().collect()
        };
        let mut out = Vec::new();
        for id in ids {
            let projection = &self.spec.projections[id];
            let [w, c, _, _] = lease_names(&hex(projection.fingerprint), &projection.name);
            out.push(w);
            if self.consumer {
                out.push(c);
            }
        }
        if self.consumer {
            out.push(format!("C#{}", self.consumer_fingerprint()));
        }
        out
    }

    fn consumer_fingerprint(&self) -> String {
        let mut fingerprint = hex(self.spec.projections_fingerprint());
        if let Some(name) = &self.name {
            fingerprint = format!("{fingerprint}@{name}");
        }
        fingerprint
    }

    /// Gives back every lease this process holds on `table`, except those
    /// a stream consumer of `keep` (the spec it goes on with) holds: their
    /// ends move back to now, so that a backfill waits for no writer that
    /// stopped. Only when no other process holds a lease on the table
    /// (its `h#` item runs past now, clock skew allowed) and none took one
    /// anew since they were read (the leases' version, which every lease
    /// taken anew moves, conditions the write); else they run to their
    /// end, as before. The process must have stopped writing with them:
    /// they are forgotten, and taken anew before any later write.
    pub async fn give_back(
        table: &str,
        keep: Option<(&Arc<Spec>, Option<&str>)>,
    ) -> Result<GaveBack, String> {
        let mine: Vec<Arc<Leases>> = all()
            .lock()
            .expect("leases lock")
            .iter()
            .filter(|(key, _)| key.0 == table)
            .map(|(_, leases)| leases.clone())
            .collect();
        let Some(first) = mine.first() else {
            return Ok(GaveBack::Ended { leases: 0 });
        };
        let registry = &first.registry;
        if !registry.keeps_holders() {
            return Ok(GaveBack::Kept {
                why: "a table without a sort key records no lease holders".to_string(),
            });
        }
        let kept: std::collections::HashSet<String> = match keep {
            Some((spec, name)) => {
                let keeper = Leases {
                    registry: registry.clone(),
                    spec: spec.clone(),
                    consumer: true,
                    name: name.map(str::to_string),
                    length: first.length,
                    holder: String::new(),
                    state: Default::default(),
                    applied: StdMutex::new((HashMap::new(), None)),
                };
                keeper.attributes(&HashMap::new()).into_iter().collect()
            }
            None => Default::default(),
        };
        let mut holders = std::collections::HashSet::new();
        let mut attributes = std::collections::BTreeSet::new();
        for leases in &mine {
            let state = leases.state.lock().await;
            holders.insert(leases.holder.clone());
            attributes.extend(
                leases
                    .attributes(&state.until)
                    .into_iter()
                    .filter(|a| !kept.contains(a)),
            );
        }
        let mut result = None;
        for _attempt in 0..4 {
            let item = registry
                .get(registry.key(LEASES))
                .await
                .map_err(|e| e.to_string())?
                .unwrap_or_default();
            let version = number(&item, LEASES_VERSION);
            let now = now_ms();
            let others = registry
                .holders()
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|(id, until)| {
                    !holders.contains(id) && until.saturating_add(registry.skew_ms) >= now
                })
                .count();
            // Holders long gone (a crashed runner, a Lambda environment
            // that was shut down) are forgotten.
            let gone = now.saturating_sub(registry.skew_ms + 3_600_000);
            let stale: Vec<String> = registry
                .holders()
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|(id, until)| !holders.contains(id) && *until < gone)
                .map(|(id, _)| id)
                .take(25)
                .collect();
            for id in stale {
                let _ = registry
                    .client
                    .delete_item()
                    .table_name(&registry.table)
                    .set_key(Some(registry.key(&format!("{HOLDER_PREFIX}{id}"))))
                    .condition_expression("#u < :gone")
                    .expression_attribute_names("#u", "until")
                    .expression_attribute_values(":gone", Av::N(gone.to_string()))
                    .send()
                    .await;
            }
            if others > 0 {
                result = Some(GaveBack::Kept {
                    why: format!("{others} other holder(s) of leases on the table"),
                });
                break;
            }
            let lower: Vec<&String> = attributes
                .iter()
                .filter(|a| number(&item, a).is_some_and(|until| until > now))
                .collect();
            if lower.is_empty() {
                result = Some(GaveBack::Ended { leases: 0 });
                break;
            }
            let mut update = registry
                .client
                .update_item()
                .table_name(&registry.table)
                .set_key(Some(registry.key(LEASES)))
                .expression_attribute_names("#ver", LEASES_VERSION)
                .expression_attribute_values(":now", Av::N(now.to_string()));
            let mut parts = Vec::new();
            for (i, name) in lower.iter().enumerate() {
                update = update.expression_attribute_names(format!("#a{i}"), name.as_str());
                parts.push(format!("#a{i} = :now"));
            }
            update = match version {
                Some(version) => update
                    .condition_expression("#ver = :ver")
                    .expression_attribute_values(":ver", Av::N(version.to_string())),
                None => update.condition_expression("attribute_not_exists(#ver)"),
            };
            match update
                .update_expression(format!("SET {}", parts.join(", ")))
                .send()
                .await
            {
                Ok(_) => {
                    result = Some(GaveBack::Ended {
                        leases: lower.len(),
                    });
                    break;
                }
                // A lease taken anew since: read again.
                Err(error) if is_condition_failure(&error) => continue,
                Err(error) => {
                    return Err(format!(
                        "giving the leases back: {}",
                        retry_describe(&error)
                    ))
                }
            }
        }
        // Forgotten: a later write takes its leases anew.
        for leases in &mine {
            let keep_this = keep.is_some_and(|(spec, name)| {
                leases.consumer
                    && leases.spec.projections_fingerprint() == spec.projections_fingerprint()
                    && leases.name.as_deref() == name
            });
            if keep_this {
                continue;
            }
            *leases.state.lock().await = LeaseState::default();
            let _ = registry
                .client
                .delete_item()
                .table_name(&registry.table)
                .set_key(Some(
                    registry.key(&format!("{HOLDER_PREFIX}{}", leases.holder)),
                ))
                .send()
                .await;
        }
        let result = result.unwrap_or(GaveBack::Kept {
            why: "the leases kept moving".to_string(),
        });
        metrics::counter!(
            "projector_leases_given_back_total",
            "outcome" => if matches!(result, GaveBack::Ended { .. }) { "ended" } else { "kept" }
        )
        .increment(1);
        Ok(result)
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
        if self.registry.keeps_holders() {
            // Before the lease: whoever gives leases back reads it, or
            // sees this renewal move the leases' version.
            self.hold(until).await?;
        }
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
        if self.consumer {
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
                            let mut names: Vec<String> = self
                                .spec
                                .projections
                                .iter()
                                .map(|p| p.name.clone())
                                .collect();
                            if names.is_empty() {
                                // A set is never empty: a name no
                                // projection can have.
                                names.push(NO_PROJECTION.to_string());
                            }
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

/// What an applier asks of the control plane ([`Control`]): the leases
/// its process holds for its table, spec and role, and the registry read
/// with the applier's own client.
#[derive(Debug)]
pub struct ApplierControl {
    leases: Arc<Leases>,
    registry: Registry,
}

impl ApplierControl {
    /// The control plane of an applier writing to `table` with `spec` and
    /// `config` (its role, consumer name and lease length).
    pub fn new(
        client: &aws_sdk_dynamodb::Client,
        table: &str,
        spec: &Arc<Spec>,
        config: &ApplyConfig,
    ) -> ApplierControl {
        ApplierControl {
            leases: Leases::shared(
                client,
                table,
                spec,
                config.stream_consumer,
                config.consumer.as_deref(),
                config.lease,
            ),
            registry: Registry::new(client.clone(), table, &spec.table),
        }
    }
}

impl Control for ApplierControl {
    fn lease<'a>(
        &'a self,
        written: &'a [ProjectionId],
        needed: u64,
    ) -> BoxFuture<'a, Result<u64, String>> {
        Box::pin(self.leases.ensure(written, needed))
    }

    fn note_applied<'a>(
        &'a self,
        changes: &'a [(ProjectionId, i64)],
    ) -> BoxFuture<'a, Result<(), ApplyError>> {
        Box::pin(self.leases.note_applied(changes))
    }

    fn readers_version<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<CounterVersion>, ApplyError>> {
        Box::pin(async move {
            Ok(self
                .registry
                .read_version(name)
                .await?
                .map(|read| CounterVersion {
                    generation: read.generation,
                    storage: read.storage,
                    shards: read.shards,
                    vars: read.vars,
                }))
        })
    }
}
