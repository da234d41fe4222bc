//! The lifecycle's state machine, pure: what the registry records of each
//! projection (its definitions' leases, its backfills, a counter's version
//! readers read), and the state `status` computes from a snapshot of it
//! ([`states`]). No I/O and no SDK types: the registry reads and writes
//! these records ([`crate::control::Registry`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::dynamo::time::iso;
use crate::kinds::Writes;
use crate::spec::{old_version_of, ProjectionId, Spec};

/// The last change a projection applied, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// When the change was made (`ApproximateCreationDateTime`, ms).
    pub change_ms: i64,
    /// When its effects were applied (ms).
    pub applied_ms: u64,
}

impl Applied {
    /// From the change to its effects, in ms.
    pub fn lag_ms(&self) -> i64 {
        (self.applied_ms as i64 - self.change_ms).max(0)
    }
}

/// The fingerprint a stream consumer leases for a projection its spec
/// lacks.
pub const WITHOUT: &str = "-";

/// The hex form of a fingerprint, as stored.
pub fn hex(fingerprint: u64) -> String {
    format!("{fingerprint:016x}")
}

/// One definition of a projection, as the leases record it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Definition {
    /// Its fingerprint ([`WITHOUT`]: a stream consumer without the
    /// projection).
    pub fingerprint: String,
    /// Writers of it may write until then (ms).
    pub writes_until: u64,
    /// A stream consumer ran it until then (ms).
    pub consumed_until: Option<u64>,
    /// When a stream consumer first ran it (ms).
    pub consumed_since: Option<u64>,
    /// The stored spec text it comes from.
    pub spec_key: Option<String>,
}

/// A backfill under way or done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackfillRun {
    /// Its name (a Step Functions execution, or one the CLI made up).
    pub run: String,
    /// The definition it brings the items to.
    pub fingerprint: String,
    /// When it claimed the projection: it scanned every item after this.
    pub from_ms: u64,
    /// When it completed (done runs).
    pub done_ms: Option<u64>,
}

/// What the registry says of one projection name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The projection.
    pub name: String,
    /// Its kind, as the last writer's spec said.
    pub kind: Option<String>,
    /// Every definition that wrote it, oldest lease first.
    pub definitions: Vec<Definition>,
    /// The backfill under way.
    pub claim: Option<BackfillRun>,
    /// The last complete backfill.
    pub backfilled: Option<BackfillRun>,
    /// A counter's version readers read (recorded when a backfill of it
    /// completes).
    pub read: Option<ReadVersion>,
    /// A counter's first generation not used before: one pruned and
    /// forgotten starts there when it is added again, so that it never
    /// meets what an earlier life left in an older generation.
    pub floor: u32,
}

/// The version of a counter that readers read: the last one a backfill
/// completed. A changed counter is built in the next generation while
/// the worker keeps this one current, and readers switch when its
/// backfill completes ([`Registry::layout`](crate::control::Registry::layout)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadVersion {
    /// Its generation: 0 (storage `<name>`), then 1 (`<name>~1`)...
    pub generation: u32,
    /// The definition it holds.
    pub fingerprint: String,
    /// Its storage name: shards are `COUNTER#<storage>#<of values>#<n>`.
    pub storage: String,
    /// Its number of shards.
    pub shards: u32,
    /// Its variables (the names of its `of`, in shard key order).
    pub vars: Vec<String>,
}

impl Record {
    /// The counter version readers read: the recorded one, or (registries
    /// from before versions were recorded) the last backfilled definition,
    /// which wrote generation 0.
    pub fn read_version(&self) -> Option<(u32, String)> {
        match (&self.read, &self.backfilled) {
            (Some(read), _) => Some((read.generation, read.fingerprint.clone())),
            (None, Some(done)) => Some((0, done.fingerprint.clone())),
            (None, None) => None,
        }
    }
}

impl Record {
    /// The definition with this fingerprint.
    pub fn definition(&self, fingerprint: &str) -> Option<&Definition> {
        self.definitions
            .iter()
            .find(|d| d.fingerprint == fingerprint)
    }

    /// The latest lease of a writer of another definition than
    /// `fingerprint`: until when, and which.
    pub fn other_writes_until(&self, fingerprint: &str) -> Option<(u64, &str)> {
        self.definitions
            .iter()
            .filter(|d| d.fingerprint != fingerprint)
            .map(|d| (d.writes_until, d.fingerprint.as_str()))
            .max()
    }

    /// Whether a complete backfill of `fingerprint` holds: no writer of
    /// another definition could write after it started.
    pub fn backfill_holds(&self, fingerprint: &str, skew_ms: u64) -> bool {
        self.backfilled.as_ref().is_some_and(|done| {
            done.fingerprint == fingerprint
                && self
                    .other_writes_until(fingerprint)
                    .is_none_or(|(until, _)| until + skew_ms < done.from_ms)
        })
    }
}

/// The registry as read at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every projection name the registry knows, by name.
    pub records: BTreeMap<String, Record>,
    /// The specs stream consumers ran.
    pub consumers: Vec<ConsumerSpec>,
    /// How many leases were taken anew ([`LEASES_VERSION`](crate::control::LEASES_VERSION)).
    pub leases_version: u64,
}

impl Snapshot {
    /// The consumer that last ran projection `name` (empty: the unnamed
    /// one), if a consumer ran it.
    pub fn owner(&self, name: &str) -> Option<&str> {
        owner(&self.consumers, name)
    }

    /// Whether projection `name` is another consumer's than `consumer`
    /// (none: the unnamed one): a named consumer ran it last.
    pub fn owned_by_other(&self, name: &str, consumer: Option<&str>) -> bool {
        self.owner(name)
            .is_some_and(|owner| owner != consumer.unwrap_or(""))
    }

    /// The record of `name` (an empty one when the registry has none).
    pub fn record(&self, name: &str) -> Record {
        self.records.get(name).cloned().unwrap_or_else(|| Record {
            name: name.to_string(),
            ..Record::default()
        })
    }
}

/// Where a projection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Live changes projected (or about to be, once deployed); the history
    /// is not backfilled.
    New,
    /// A backfill of its definition is under way.
    Backfilling,
    /// Every item's derived data comes from its definition.
    Live,
    /// Live but for items held behind open dead letters.
    Held,
    /// Derived data of another definition may be in the table.
    Changed,
    /// In the table, not in the spec.
    Retired,
    /// A counter's old version (`<name>~<generation>`): what readers read while
    /// the changed counter is rebuilt, kept current by the worker.
    Serving,
}

impl State {
    /// The state as `status` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::New => "new",
            State::Backfilling => "backfilling",
            State::Live => "live",
            State::Held => "held",
            State::Changed => "changed",
            State::Retired => "retired",
            State::Serving => "serving",
        }
    }
}

/// One row of `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionStatus {
    /// The projection.
    pub name: String,
    /// Its kind.
    /// The service that registered it (empty: not known, a retired one).
    pub service: String,
    pub kind: String,
    /// Its state.
    pub state: State,
    /// Since when (RFC 3339), when known.
    pub since: Option<String>,
    /// The spec's definition (hex fingerprint; the last one for retired).
    pub fingerprint: String,
    /// Whether a stream consumer (the Lambda, the runner) runs this
    /// definition.
    pub deployed: bool,
    /// What to run next, if anything.
    pub next: Option<String>,
    /// Why the state is what it is, when that is not obvious.
    pub note: Option<String>,
    /// Open dead letters of the projection.
    pub dead_letters: usize,
    /// The last change a stream consumer applied, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied: Option<Applied>,
}

/// How `status` spells the commands it suggests.
#[derive(Debug, Clone, Default)]
pub struct Commands {
    /// `--spec FILE` and, when given, `--table NAME`.
    pub target: String,
    /// The consumer asking (`--consumer`): projections another named
    /// consumer runs are its own, not retired ones of this spec.
    pub consumer: Option<String>,
    /// The spec is what the table has registered (no spec file): its
    /// workers serve a registration by themselves, nothing is deployed.
    pub registered: bool,
}

impl Commands {
    /// What makes the table's workers run this spec.
    fn deploy(&self) -> &'static str {
        if self.registered {
            "wait for the table's workers to serve the registration (within seconds)"
        } else {
            "deploy this spec"
        }
    }

    fn backfill(&self, name: &str) -> String {
        format!("ddb-projector backfill {} --projection {name}", self.target)
    }

    fn prune(&self, name: &str) -> String {
        format!("ddb-projector prune {} --projection {name}", self.target)
    }
}

/// Each projection's state from a snapshot of the registry at `now` (ms).
/// Pure: `status` adds the dead letters.
pub fn states(
    spec: &Spec,
    snapshot: &Snapshot,
    now: u64,
    skew_ms: u64,
    letters: &HashMap<String, usize>,
    commands: &Commands,
) -> Vec<ProjectionStatus> {
    // This consumer's letters of undecodable records hold items of every
    // projection (another consumer's hold its own).
    let whole = letters
        .get(&crate::apply::whole_record(commands.consumer.as_deref()))
        .copied()
        .unwrap_or(0);
    let mut out = Vec::new();
    for (id, projection) in spec.projections.iter().enumerate() {
        let f = hex(projection.fingerprint);
        if spec.is_old_version(id) {
            let base = old_version_of(&projection.name).map_or("", |(base, _)| base);
            out.push(ProjectionStatus {
                name: projection.name.clone(),
                service: spec.service_of(&projection.name).to_string(),
                kind: projection.kind_name().to_string(),
                state: State::Serving,
                since: None,
                fingerprint: f,
                deployed: true,
                next: None,
                note: Some(format!(
                    "the version of `{base}` readers read, kept current while `{base}` is rebuilt beside it; they switch when its backfill completes, and this one is then pruned"
                )),
                dead_letters: 0,
                applied: None,
            });
            continue;
        }
        let record = snapshot.record(&projection.name);
        let mine = record.definition(&f);
        let deployed = mine.is_some_and(|d| d.consumed_until.is_some());
        let other = record.other_writes_until(&f);
        let other_consumer_running = record
            .definitions
            .iter()
            .filter(|d| d.fingerprint != f && d.fingerprint != WITHOUT)
            .filter_map(|d| d.consumed_until.map(|until| (until, d.fingerprint.clone())))
            .filter(|(until, _)| *until >= now)
            .max();
        let claim = record.claim.as_ref().filter(|c| c.fingerprint == f);
        let mut note = None;
        let held = letters.get(&projection.name).copied().unwrap_or(0) + whole;
        let (state, since) = if deployed && record.backfill_holds(&f, skew_ms) {
            let done = record.backfilled.as_ref().expect("holds");
            if held > 0 {
                note = Some(format!(
                    "{held} open dead letters hold items behind them: `ddb-projector dlq list`, fix, then `dlq redrive`"
                ));
                (State::Held, done.done_ms)
            } else {
                (State::Live, done.done_ms)
            }
        } else if let Some(claim) = claim {
            if let Some((until, g)) = other.filter(|(until, _)| *until + skew_ms >= claim.from_ms) {
                note = Some(format!(
                    "a writer of another definition ({g}) could write until {}, after backfill `{}` started: that backfill cannot make it live",
                    iso(until),
                    claim.run
                ));
            }
            (State::Backfilling, Some(claim.from_ms))
        } else {
            let other_wrote = record
                .definitions
                .iter()
                .any(|d| d.fingerprint != f && d.fingerprint != WITHOUT);
            let since = mine.and_then(|d| d.consumed_since);
            let other_backfilled = record
                .backfilled
                .as_ref()
                .is_some_and(|done| done.fingerprint != f);
            if other_wrote || other_backfilled {
                (State::Changed, since)
            } else {
                (State::New, since)
            }
        };
        if state == State::Live && !deployed {
            unreachable!("live needs a consumer");
        }
        if let (None, Some(old)) = (&note, spec.old_version(id)) {
            let old = &spec.projections[old].name;
            note = Some(format!(
                "rebuilt beside the version readers read (`{old}`), which they read until its backfill completes"
            ));
        }
        let next = if state == State::Live {
            None
        } else if state == State::Held {
            Some(format!("ddb-projector dlq redrive {}", commands.target))
        } else if !deployed {
            Some(format!(
                "{} (no Lambda or runner runs this definition yet), then {}",
                commands.deploy(),
                commands.backfill(&projection.name)
            ))
        } else if let Some((until, g)) = other_consumer_running {
            Some(format!(
                "wait until {}: a worker still runs another definition ({g}); then {}",
                iso(until),
                commands.backfill(&projection.name)
            ))
        } else if state == State::Backfilling && note.is_none() {
            Some(format!(
                "let backfill `{}` finish (or start over: {})",
                claim.map(|c| c.run.as_str()).unwrap_or_default(),
                commands.backfill(&projection.name)
            ))
        } else {
            Some(commands.backfill(&projection.name))
        };
        out.push(ProjectionStatus {
            name: projection.name.clone(),
            service: spec.service_of(&projection.name).to_string(),
            kind: projection.kind_name().to_string(),
            state,
            since: since.map(iso),
            fingerprint: f,
            deployed,
            next,
            note,
            dead_letters: 0,
            applied: None,
        });
    }
    for (name, record) in &snapshot.records {
        // Retired: something wrote it (a pruned one keeps only the leases
        // of consumers that did not have it).
        let wrote = record.definitions.iter().any(|d| d.fingerprint != WITHOUT);
        if spec.projection_id(name).is_some() || !wrote {
            continue;
        }
        if snapshot.owned_by_other(name, commands.consumer.as_deref()) {
            continue;
        }
        let last = record
            .definitions
            .iter()
            .filter(|d| d.fingerprint != WITHOUT)
            .max_by_key(|d| d.writes_until);
        let running = last
            .and_then(|d| d.consumed_until)
            .filter(|until| *until >= now);
        out.push(ProjectionStatus {
            name: name.clone(),
            service: String::new(),
            kind: record.kind.clone().unwrap_or_else(|| "?".to_string()),
            state: State::Retired,
            since: record
                .definition(WITHOUT)
                .and_then(|d| d.consumed_since)
                .map(iso),
            fingerprint: last.map(|d| d.fingerprint.clone()).unwrap_or_default(),
            deployed: running.is_some(),
            next: Some(match running {
                Some(until) => format!(
                    "{}: a worker still runs it (lease until {}); then {}",
                    commands.deploy(),
                    iso(until),
                    commands.prune(name)
                ),
                None => commands.prune(name),
            }),
            note: None,
            dead_letters: 0,
            applied: None,
        });
    }
    out
}

/// A spec a stream consumer ran, as its leases record it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerSpec {
    /// The spec's fingerprint (hex).
    pub fingerprint: String,
    /// A consumer ran it until then (ms).
    pub until: u64,
    /// When a consumer first ran it (ms).
    pub since: u64,
    /// Its projections.
    pub names: BTreeSet<String>,
    /// The consumer that ran it (`--consumer`; empty: the unnamed one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub consumer: String,
}

/// The consumer whose spec that ran projection `name` ran last (empty:
/// the unnamed consumer), if any ran it.
fn owner<'a>(consumers: &'a [ConsumerSpec], name: &str) -> Option<&'a str> {
    consumers
        .iter()
        .filter(|c| c.names.contains(name))
        .max_by_key(|c| c.until)
        .map(|c| c.consumer.as_str())
}

/// A consumer of a spec without a projection leaves that projection's
/// changes unprojected while it runs: each record gets a [`WITHOUT`]
/// definition covering the leases of the consumers whose spec lacks it.
/// (A consumer that is deployed but runs no batch takes no lease: with an
/// event filter, changes only the missing projection needed may then pass
/// unseen; `ARCHITECTURE.md` says what to do about it.)
///
/// Consumers are named when several deployments with different specs
/// share a table (`--consumer`): a spec lacking a projection covers it
/// only for the part of its run during which no other consumer ran the
/// projection (another team's consumer running it projected its changes);
/// a consumer that is renamed or takes a projection over later leaves the
/// gap before it on record.
pub(super) fn add_without(
    records: &mut BTreeMap<String, Record>,
    consumers: &[ConsumerSpec],
    now: u64,
) {
    for consumer in consumers {
        for (name, record) in records.iter_mut() {
            if consumer.names.contains(name) {
                continue;
            }
            // While another consumer ran the projection, this one's spec
            // lacking it left nothing unprojected.
            let others_names: BTreeSet<&str> = consumers
                .iter()
                .filter(|c| c.consumer != consumer.consumer)
                .map(|c| c.consumer.as_str())
                .collect();
            let others: Vec<(u64, u64)> = others_names
                .into_iter()
                .flat_map(|other| runs(consumers, other, name, now))
                .collect();
            let Some((since, until)) = uncovered((consumer.since, consumer.until), others) else {
                continue;
            };
            let index = match record
                .definitions
                .iter()
                .position(|d| d.fingerprint == WITHOUT)
            {
                Some(i) => i,
                None => {
                    record.definitions.push(Definition {
                        fingerprint: WITHOUT.to_string(),
                        ..Definition::default()
                    });
                    record.definitions.len() - 1
                }
            };
            let without = &mut record.definitions[index];
            without.writes_until = without.writes_until.max(until);
            without.consumed_until = Some(without.consumed_until.unwrap_or(0).max(until));
            without.consumed_since = Some(match without.consumed_since {
                Some(earlier) => earlier.min(since),
                None => since,
            });
        }
    }
    for record in records.values_mut() {
        record
            .definitions
            .sort_by_key(|d| (d.writes_until, d.fingerprint.clone()));
    }
}

/// Writes of one consumer onto the reverse items another's inverse edge
/// keeps (the edge's writes keep only its own spec's attributes there),
/// either way; `*_differing`: the projections of each that the other
/// lacks as they are (what both run alike, both edges keep).
pub(super) fn onto_reverse_items(
    ours: &Spec,
    theirs: &Spec,
    ours_differing: &BTreeSet<String>,
    theirs_differing: &BTreeSet<String>,
    them: &str,
) -> Vec<String> {
    let targets = |spec: &Spec| -> Vec<(String, String)> {
        spec.projections
            .iter()
            .filter_map(|p| match p.kind.dispatch().writes(&p.name) {
                Writes::Items { entity, .. } => {
                    Some((p.name.clone(), spec.entities[entity].name.clone()))
                }
                Writes::Attributes { .. } | Writes::Own | Writes::Anything => None,
            })
            .collect()
    };
    let written = |spec: &Spec, only: Option<&BTreeSet<String>>| -> Vec<(String, String)> {
        spec.projections
            .iter()
            .filter(|p| only.is_none_or(|names| names.contains(&p.name)))
            .filter_map(|p| match p.kind.dispatch().writes(&p.name) {
                Writes::Attributes { entity, .. } => {
                    Some((p.name.clone(), spec.entities[entity].name.clone()))
                }
                Writes::Items { .. } | Writes::Own | Writes::Anything => None,
            })
            .collect()
    };
    let mut out = Vec::new();
    for (edge, target) in targets(ours) {
        for (writer, entity) in written(theirs, Some(theirs_differing)) {
            if entity == target {
                out.push(format!(
                    "consumer {them}'s projection `{writer}` writes onto entity `{target}`, the reverse items of this consumer's inverse edge `{edge}`, whose writes keep only this spec's attributes there"
                ));
            }
        }
    }
    for (edge, target) in targets(theirs) {
        for (writer, entity) in written(ours, Some(ours_differing)) {
            if entity == target {
                out.push(format!(
                    "this consumer's projection `{writer}` writes onto entity `{target}`, the reverse items of consumer {them}'s inverse edge `{edge}`, whose writes keep only its own spec's attributes there"
                ));
            }
        }
    }
    out
}

/// When consumer `consumer` ran projection `name`: its specs with it,
/// each from its first run to its lease's end, less the runs of its specs
/// without it (a spec's first run is kept once: one run again after
/// another spec spans that spec's). A lease still running runs on (its
/// end compared with another consumer's would invent a gap that has not
/// happened); one that ran out may be idle or gone (renamed, removed), and
/// counts as stopped: an idle consumer's projection can turn from live
/// while another consumer runs without it, never the other way round.
fn runs(consumers: &[ConsumerSpec], consumer: &str, name: &str, now: u64) -> Vec<(u64, u64)> {
    let specs: Vec<&ConsumerSpec> = consumers
        .iter()
        .filter(|c| c.consumer == consumer)
        .collect();
    let mut with: Vec<(u64, u64)> = specs
        .iter()
        .filter(|c| c.names.contains(name))
        .map(|c| (c.since, if c.until >= now { u64::MAX } else { c.until }))
        .collect();
    for without in specs.iter().filter(|c| !c.names.contains(name)) {
        let (cut_from, cut_to) = (without.since, without.until);
        with = with
            .into_iter()
            .flat_map(|(from, to)| {
                let before = (from < cut_from).then(|| (from, to.min(cut_from)));
                let after = (to > cut_to).then(|| (from.max(cut_to), to));
                before.into_iter().chain(after)
            })
            .filter(|(from, to)| from < to)
            .collect();
    }
    with
}

/// The part of `span` (ms, from..until) that no interval of `others`
/// covers, from its first uncovered instant to its last (`None`: all of
/// it is covered).
fn uncovered(span: (u64, u64), mut others: Vec<(u64, u64)>) -> Option<(u64, u64)> {
    let (start, end) = span;
    others.sort_unstable();
    let (mut first, mut last) = (None, None);
    let mut at = start;
    for (since, until) in others {
        if at >= end {
            break;
        }
        if until <= at {
            continue;
        }
        if since > at {
            first.get_or_insert(at);
            last = Some(since.min(end));
        }
        at = at.max(until);
    }
    if at < end || start >= end {
        first.get_or_insert(at.min(end));
        last = Some(end);
    }
    Some((first?, last?))
}

/// `expanded` (`asked` with the projections that go with them) without
/// the ones added that run `run` backfilled already at this definition: a
/// rollup's backfill resumed after its rebuilt counter completed in the
/// same run (see [`crate::backfill::backfill`]).
pub(super) fn without_done_dependencies(
    spec: &Spec,
    asked: &[ProjectionId],
    expanded: Vec<ProjectionId>,
    snapshot: &Snapshot,
    run: &str,
) -> Vec<ProjectionId> {
    expanded
        .into_iter()
        .filter(|id| {
            asked.contains(id) || {
                let projection = &spec.projections[*id];
                !snapshot
                    .record(&projection.name)
                    .backfilled
                    .is_some_and(|done| {
                        done.run == run && done.fingerprint == hex(projection.fingerprint)
                    })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/projections/social-service.toml"
        )))
        .expect("the shipped spec compiles")
    }

    fn definition(fingerprint: &str, until: u64, consumer: bool) -> Definition {
        Definition {
            fingerprint: fingerprint.to_string(),
            writes_until: until,
            consumed_until: consumer.then_some(until),
            consumed_since: consumer.then_some(1),
            spec_key: None,
        }
    }

    fn done(fingerprint: &str, from_ms: u64) -> Option<BackfillRun> {
        Some(BackfillRun {
            run: "r".to_string(),
            fingerprint: fingerprint.to_string(),
            from_ms,
            done_ms: Some(from_ms + 10),
        })
    }

    fn row<'a>(rows: &'a [ProjectionStatus], name: &str) -> &'a ProjectionStatus {
        rows.iter().find(|r| r.name == name).expect("a row")
    }

    #[test]
    fn live_needs_a_backfill_after_every_other_writer_stopped() {
        let spec = spec();
        let name = spec.projections[0].name.clone();
        let f = hex(spec.projections[0].fingerprint);
        let commands = Commands {
            target: "--spec s.toml".to_string(),
            consumer: None,
            registered: false,
        };
        let with = |record: Record| Snapshot {
            records: [(name.clone(), record)].into_iter().collect(),
            ..Snapshot::default()
        };
        // Never seen: new, and the spec must be deployed first.
        let rows = states(
            &spec,
            &Snapshot::default(),
            1_000,
            0,
            &HashMap::new(),
            &commands,
        );
        assert_eq!(row(&rows, &name).state, State::New);
        assert!(row(&rows, &name)
            .next
            .as_deref()
            .unwrap()
            .starts_with("deploy"));
        // Deployed and backfilled after the old definition's last lease.
        let mut record = Record {
            name: name.clone(),
            definitions: vec![definition("old", 500, true), definition(&f, 2_000, true)],
            backfilled: done(&f, 600),
            ..Record::default()
        };
        let rows = states(
            &spec,
            &with(record.clone()),
            1_000,
            0,
            &HashMap::new(),
            &commands,
        );
        assert_eq!(row(&rows, &name).state, State::Live);
        assert_eq!(row(&rows, &name).next, None);
        // The old definition's lease reached past the backfill's start: a
        // stale worker could have undone it.
        record.definitions[0].writes_until = 600;
        let rows = states(
            &spec,
            &with(record.clone()),
            1_000,
            0,
            &HashMap::new(),
            &commands,
        );
        assert_eq!(row(&rows, &name).state, State::Changed);
        // A consumer without the projection ran after the backfill (it was
        // retired and added back): not live either, but nothing of another
        // definition was written, so it is new.
        record.definitions[0] = definition(WITHOUT, 700, true);
        record.backfilled = None;
        let rows = states(
            &spec,
            &with(record.clone()),
            1_000,
            0,
            &HashMap::new(),
            &commands,
        );
        assert_eq!(row(&rows, &name).state, State::New);
        // Backfilled but no consumer runs the definition: not live.
        let record = Record {
            name: name.clone(),
            definitions: vec![definition(&f, 2_000, false)],
            backfilled: done(&f, 600),
            ..Record::default()
        };
        let rows = states(&spec, &with(record), 1_000, 0, &HashMap::new(), &commands);
        assert_ne!(row(&rows, &name).state, State::Live);
    }

    #[test]
    fn a_backfill_under_way_says_when_it_cannot_make_it_live() {
        let spec = spec();
        let name = spec.projections[0].name.clone();
        let f = hex(spec.projections[0].fingerprint);
        let record = Record {
            name: name.clone(),
            definitions: vec![definition("old", 900, true), definition(&f, 2_000, true)],
            claim: Some(BackfillRun {
                run: "r1".to_string(),
                fingerprint: f.clone(),
                from_ms: 800,
                done_ms: None,
            }),
            ..Record::default()
        };
        let snapshot = Snapshot {
            records: [(name.clone(), record)].into_iter().collect(),
            ..Snapshot::default()
        };
        let rows = states(
            &spec,
            &snapshot,
            1_000,
            0,
            &HashMap::new(),
            &Commands::default(),
        );
        let r = row(&rows, &name);
        assert_eq!(r.state, State::Backfilling);
        assert!(r.note.as_deref().unwrap().contains("cannot make it live"));
    }

    #[test]
    fn a_name_not_in_the_spec_is_retired_until_pruned() {
        let spec = spec();
        let record = Record {
            name: "gone".to_string(),
            kind: Some("counter".to_string()),
            definitions: vec![definition("aa", 5_000, true)],
            ..Record::default()
        };
        let snapshot = Snapshot {
            records: [("gone".to_string(), record)].into_iter().collect(),
            ..Snapshot::default()
        };
        let commands = Commands {
            target: "--spec s.toml".to_string(),
            consumer: None,
            registered: false,
        };
        let rows = states(&spec, &snapshot, 1_000, 0, &HashMap::new(), &commands);
        let r = row(&rows, "gone");
        assert_eq!(r.state, State::Retired);
        assert!(r.next.as_deref().unwrap().starts_with("deploy this spec"));
        let rows = states(&spec, &snapshot, 9_000, 0, &HashMap::new(), &commands);
        assert_eq!(
            row(&rows, "gone").next.as_deref(),
            Some("ddb-projector prune --spec s.toml --projection gone")
        );
    }

    #[test]
    fn open_dead_letters_keep_a_backfilled_projection_from_live() {
        let spec = spec();
        let name = spec.projections[0].name.clone();
        let f = hex(spec.projections[0].fingerprint);
        let record = Record {
            name: name.clone(),
            definitions: vec![definition(&f, 2_000, true)],
            backfilled: done(&f, 600),
            ..Record::default()
        };
        let snapshot = Snapshot {
            records: [(name.clone(), record)].into_iter().collect(),
            ..Snapshot::default()
        };
        let commands = Commands {
            target: "--spec s.toml".to_string(),
            consumer: None,
            registered: false,
        };
        for letters in [
            HashMap::from([(name.clone(), 2)]),
            HashMap::from([(crate::apply::WHOLE_RECORD.to_string(), 1)]),
        ] {
            let rows = states(&spec, &snapshot, 1_000, 0, &letters, &commands);
            let r = row(&rows, &name);
            assert_eq!(r.state, State::Held, "{letters:?}");
            assert_eq!(
                r.next.as_deref(),
                Some("ddb-projector dlq redrive --spec s.toml")
            );
        }
        let rows = states(&spec, &snapshot, 1_000, 0, &HashMap::new(), &commands);
        assert_eq!(row(&rows, &name).state, State::Live);
        // A lease ending within the clock skew of the backfill's start
        // could have reached past it.
        let mut late = snapshot.clone();
        late.records
            .get_mut(&name)
            .unwrap()
            .definitions
            .push(definition("old", 590, true));
        let rows = states(&spec, &late, 1_000, 0, &HashMap::new(), &commands);
        assert_eq!(row(&rows, &name).state, State::Live);
        let rows = states(&spec, &late, 1_000, 20, &HashMap::new(), &commands);
        assert_eq!(row(&rows, &name).state, State::Changed);
    }

    /// Consumer `name`'s spec `fingerprint`, first run at `since`, its
    /// lease until `until`, with projections `names`.
    fn consumer_spec(
        name: &str,
        fingerprint: &str,
        since: u64,
        until: u64,
        names: &[&str],
    ) -> ConsumerSpec {
        ConsumerSpec {
            fingerprint: fingerprint.to_string(),
            since,
            until,
            names: names.iter().map(|n| n.to_string()).collect(),
            consumer: name.to_string(),
        }
    }

    /// Empty registry records of `names`.
    fn records_of(names: &[&str]) -> BTreeMap<String, Record> {
        names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Record {
                        name: n.to_string(),
                        ..Record::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_consumer_without_a_projection_covers_it_while_it_runs() {
        let consumer = |fingerprint: &str, since: u64, until: u64, names: &[&str]| {
            consumer_spec("", fingerprint, since, until, names)
        };
        let mut records = records_of(&["p", "q"]);
        // v1 had p and q; v2 lacked q (two consumers of it); v3 has both.
        add_without(
            &mut records,
            &[
                consumer("v1", 0, 9, &["p", "q"]),
                consumer("v2", 10, 15, &["p"]),
                consumer("v2b", 12, 40, &["p"]),
                consumer("v3", 100, 120, &["p", "q"]),
            ],
            10_000,
        );
        assert!(records["p"].definitions.is_empty());
        let without = records["q"].definition(WITHOUT).expect("covered");
        assert_eq!(
            without.writes_until, 40,
            "the last lease of a spec without q"
        );
        assert_eq!(without.consumed_since, Some(10));
    }

    #[test]
    fn a_named_consumer_without_another_consumers_projection_leaves_it_alone() {
        let consumer = |name: &str, fingerprint: &str, until: u64, names: &[&str]| {
            consumer_spec(name, fingerprint, 0, until, names)
        };
        let mut records = records_of(&["a1", "b1", "b2"]);
        // Team a's consumer runs a1; team b's ran b1 and b2, and its new
        // spec dropped b2 while the old one still runs.
        add_without(
            &mut records,
            &[
                consumer("team-a", "fa", 100, &["a1"]),
                consumer("team-b", "fb1", 30, &["b1", "b2"]),
                consumer("team-b", "fb2", 100, &["b1"]),
            ],
            10_000,
        );
        assert!(records["a1"].definitions.is_empty());
        assert!(
            records["b1"].definitions.is_empty(),
            "team a's spec lacking b1 leaves it to team b: {:?}",
            records["b1"].definitions
        );
        let without = records["b2"].definition(WITHOUT).expect("covered");
        assert_eq!(without.writes_until, 100, "nobody ran b2 after 30");
    }

    #[test]
    fn a_gap_without_a_projection_counts_whoever_runs_it_next() {
        let consumer = consumer_spec;
        let records = || records_of(&["p"]);
        // The unnamed consumer ran p, then a spec without it from 100 to
        // 200; from 200 the same function runs p again, now named `main`.
        // Nobody projected p from 100 to 200: that gap stays on record.
        let mut renamed = records();
        add_without(
            &mut renamed,
            &[
                consumer("", "s1", 0, 100, &["p"]),
                consumer("", "s2", 100, 200, &[]),
                consumer("main", "s3", 200, 900, &["p"]),
            ],
            10_000,
        );
        let without = renamed["p"].definition(WITHOUT).expect("the gap is kept");
        assert_eq!(without.writes_until, 200);
        assert_eq!(without.consumed_since, Some(100));
        // Team a's consumer runs without p from 50; team b's runs p from
        // 300 on: until 300 nobody projected p, after it team a's lack of
        // p is team b's business.
        let mut joined = records();
        add_without(
            &mut joined,
            &[
                consumer("team-a", "fa", 50, 900, &[]),
                consumer("team-b", "fb", 300, 900, &["p"]),
            ],
            10_000,
        );
        let without = joined["p"].definition(WITHOUT).expect("before team b");
        assert_eq!(without.writes_until, 300);
        assert_eq!(without.consumed_since, Some(50));
        // Team b's lease ended before team a's: idle or gone, it counts
        // as stopped (p turns from live, never the other way round).
        let mut idle = records();
        add_without(
            &mut idle,
            &[
                consumer("team-a", "fa", 50, 1_500, &[]),
                consumer("team-b", "fb", 40, 1_200, &["p"]),
            ],
            10_000,
        );
        let mut running = records();
        add_without(
            &mut running,
            &[
                consumer("team-a", "fa", 50, 1_500, &[]),
                consumer("team-b", "fb", 40, 1_200, &["p"]),
            ],
            1_000,
        );
        assert!(
            running["p"].definitions.is_empty(),
            "team b's lease runs: p runs"
        );
        let without = idle["p"].definition(WITHOUT).expect("after team b's lease");
        assert_eq!(
            (without.consumed_since, without.writes_until),
            (Some(1_200), 1_500)
        );
        // The unnamed consumer ran p until 100 and was renamed `main`,
        // which ran a spec without p until 300, then p again.
        let mut renamed = records();
        add_without(
            &mut renamed,
            &[
                consumer("", "s1", 0, 100, &["p"]),
                consumer("main", "s2", 100, 300, &[]),
                consumer("main", "s3", 300, 900, &["p"]),
            ],
            10_000,
        );
        let without = renamed["p"]
            .definition(WITHOUT)
            .expect("the gap after the rename");
        assert_eq!(
            (without.consumed_since, without.writes_until),
            (Some(100), 300)
        );
        let mut dropped = records();
        add_without(
            &mut dropped,
            &[
                consumer("team-a", "fa", 50, 1_500, &[]),
                consumer("team-b", "fb", 40, 1_200, &["p"]),
                consumer("team-b", "fb2", 1_100, 1_500, &[]),
            ],
            10_000,
        );
        let without = dropped["p"].definition(WITHOUT).expect("team b dropped p");
        assert_eq!(without.writes_until, 1_500);
        assert_eq!(without.consumed_since, Some(1_100));
        // Team b dropped p from 100 to 200, then went back to its first
        // spec (whose first run stays at 0): the gap is 100 to 200, and
        // from 200 team b runs p again.
        let mut back = records();
        add_without(
            &mut back,
            &[
                consumer("team-a", "fa", 50, 900, &[]),
                consumer("team-b", "fb1", 0, 900, &["p"]),
                consumer("team-b", "fb2", 100, 200, &[]),
            ],
            10_000,
        );
        let without = back["p"].definition(WITHOUT).expect("the gap");
        assert_eq!(
            (without.consumed_since, without.writes_until),
            (Some(100), 200)
        );
    }
}
