//! Property tests over generated *specs*, through a projection's life, on
//! DynamoDB Local.
//!
//! Each case draws a spec v1 (index keys, denormalized copies, inverse
//! edges onto two target entities, counters on either source entity, with
//! and without `when`, sharing source items), a spec v2 that keeps,
//! changes or drops each projection and adds new ones, and two phases of
//! writes (items created, changed and deleted, some of them poison for a
//! while). Phase 1 runs under v1 as Lambda delivers it (interleavings,
//! batch sizes, crashes and bisection, redelivery); its dead letters are
//! redriven. v1 and v2 reach the workers through `register` (stored in
//! the table's registry, read back and composed, which must serve the
//! spec the text compiles to), and v2's registration plan must name every
//! projection the test's own `needed` says must be backfilled as not live,
//! and every dropped one as retired. Then v2 is deployed while writers go on: the rest of the
//! stream is delivered to v2's worker, and at the same time a backfill of
//! what changed (and of random other projections) runs, crashing and
//! resuming; a replay of a random selection of projections over a tail of
//! the stream follows, then `dlq redrive`, by one projection first.
//!
//! The lifecycle goes along: the workers are stream consumers with short
//! leases, phase 1 ends with a claimed backfill of every v1 projection, and
//! phase 2's backfill covers what `status` says is not live once v2 is about
//! to be deployed, which must include every projection whose definition
//! changed (the test's own `needed`, not the fingerprints). After each
//! phase `status` must say every projection of the spec is live (and the
//! ones v2 dropped retired) exactly when the oracle agrees with the table.
//!
//! Every case must end with: the table equal to what `oracle.rs` (which
//! reads the spec's TOML, not `src/plan`) computes from the source items;
//! no dead letter left; `audit` clean; and a full replay followed by a
//! redrive changing nothing. Failing cases shrink and their seeds are kept
//! in `tests/dynamo/properties/specs.txt`. `SPEC_CASES` sets the number of
//! cases (CI runs a modest number).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, ApplyConfig, BatchOptions};
use ddb_projector::audit::{audit, AuditOptions};
use ddb_projector::backfill::{backfill, BackfillOptions};
use ddb_projector::control::{self, ClaimOutcome, Registry, State};
use ddb_projector::prune::{prune, PruneOptions, Retired};
use ddb_projector::spec::Spec;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use super::delivery::{apply_with, deliver_with, delivery, runtime, snapshot, Delivery, Writer};
use super::faults::Faults;
use super::model::{attrs, Attrs, History};
use super::oracle;
use super::support::{self, s};

/// Cases unless `SPEC_CASES` says otherwise.
const CASES: u32 = 24;

/// What the cases exercised, summed over a run (printed at its end).
struct Coverage {
    cases: AtomicUsize,
    counters_on_edges: AtomicUsize,
    counters_moved: AtomicUsize,
    changed_specs: AtomicUsize,
    backfilled: AtomicUsize,
    replays: AtomicUsize,
    records: AtomicUsize,
    letters_redriven: AtomicUsize,
    pruned: AtomicUsize,
    rebuilt_beside: AtomicUsize,
    rollups: AtomicUsize,
    rollups_rebuilt: AtomicUsize,
    aggregates: AtomicUsize,
    aggregates_grouped: AtomicUsize,
    readers_checked: AtomicUsize,
    planted: AtomicUsize,
    locate_passes: AtomicUsize,
    recount_passes: AtomicUsize,
    kinesis: AtomicUsize,
    audited_before_backfill: AtomicUsize,
    kills: AtomicUsize,
    cut: AtomicUsize,
    faults: AtomicUsize,
    lost_writes: AtomicUsize,
}

static COVERAGE: Coverage = Coverage {
    cases: AtomicUsize::new(0),
    counters_on_edges: AtomicUsize::new(0),
    counters_moved: AtomicUsize::new(0),
    changed_specs: AtomicUsize::new(0),
    backfilled: AtomicUsize::new(0),
    replays: AtomicUsize::new(0),
    records: AtomicUsize::new(0),
    letters_redriven: AtomicUsize::new(0),
    pruned: AtomicUsize::new(0),
    rebuilt_beside: AtomicUsize::new(0),
    rollups: AtomicUsize::new(0),
    rollups_rebuilt: AtomicUsize::new(0),
    aggregates: AtomicUsize::new(0),
    aggregates_grouped: AtomicUsize::new(0),
    readers_checked: AtomicUsize::new(0),
    planted: AtomicUsize::new(0),
    locate_passes: AtomicUsize::new(0),
    recount_passes: AtomicUsize::new(0),
    kinesis: AtomicUsize::new(0),
    audited_before_backfill: AtomicUsize::new(0),
    kills: AtomicUsize::new(0),
    cut: AtomicUsize::new(0),
    faults: AtomicUsize::new(0),
    lost_writes: AtomicUsize::new(0),
};

fn count(what: &AtomicUsize, n: usize) {
    what.fetch_add(n, Ordering::Relaxed);
}

/// Whether a spec has a counter riding on an inverse edge.
fn rides(spec: &Spec) -> bool {
    spec.projections.iter().any(|p| {
        matches!(&p.kind, ddb_projector::spec::ProjectionKind::Counter(c)
            if c.marker != ddb_projector::spec::Marker::Own)
    })
}

// ---------------------------------------------------------------- specs ---

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Source {
    Attr,
    Link,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum When {
    Always,
    Flag,
    KindP,
}

/// A projection's kind and parameters (its name comes from its id).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    IndexKeys {
        source: Source,
        variant: u8,
    },
    Denormalize {
        when: When,
        variant: u8,
    },
    Edge {
        source: Source,
        rev: bool,
        when: When,
        variant: u8,
    },
    Counter {
        source: Source,
        by_b: bool,
        when: When,
        shards: u32,
    },
    /// The total of counter `counter` (a projection id; [`UNRESOLVED`]
    /// until a counter of the spec is chosen) on the `tally` entity.
    Rollup {
        counter: u8,
        variant: u8,
    },
    /// Totals over a node's `attr` items, on the node, or (`group`) over
    /// the one `attr` item of each `group` item, whose key shares the
    /// partition and binds the `attr` items' sort-key variable.
    Aggregate {
        when: When,
        variant: u8,
        group: bool,
    },
}

/// A rollup whose counter is not chosen yet.
const UNRESOLVED: u8 = u8::MAX;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Projection {
    pub(super) id: u8,
    pub(super) kind: Kind,
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![Just(When::Always), Just(When::Flag), Just(When::KindP)]
}

fn source() -> impl Strategy<Value = Source> {
    prop_oneof![Just(Source::Attr), Just(Source::Link)]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        2 => (source(), 0u8..3).prop_map(|(source, variant)| Kind::IndexKeys { source, variant }),
        2 => (when(), 0u8..3).prop_map(|(when, variant)| Kind::Denormalize { when, variant }),
        3 => (prop_oneof![1 => Just(Source::Attr), 3 => Just(Source::Link)], any::<bool>(), when(), 0u8..3)
            .prop_map(|(source, rev, when, variant)| Kind::Edge { source, rev, when, variant }),
        4 => (source(), any::<bool>(), when(), prop::sample::select(vec![1u32, 2, 3, 8]))
            .prop_map(|(source, by_b, when, shards)| Kind::Counter { source, by_b, when, shards }),
        2 => (0u8..2).prop_map(|variant| Kind::Rollup { counter: UNRESOLVED, variant }),
        2 => (when(), 0u8..3, any::<bool>())
            .prop_map(|(when, variant, group)| Kind::Aggregate { when, variant, group }),
    ]
}

/// The same projection with changed parameters (a new definition).
fn changed(kind: &Kind, tweak: u8) -> Kind {
    let when = [When::Always, When::Flag, When::KindP][usize::from(tweak % 3)];
    match *kind {
        Kind::IndexKeys { source, variant } => Kind::IndexKeys {
            source,
            variant: (variant + 1 + tweak % 2) % 3,
        },
        Kind::Denormalize { variant, .. } => Kind::Denormalize {
            when,
            variant: (variant + tweak / 3) % 3,
        },
        Kind::Edge {
            source,
            rev,
            variant,
            ..
        } => Kind::Edge {
            // Now and then the edge is built from the other entity.
            source: match (tweak, source) {
                (8, Source::Attr) => Source::Link,
                (8, Source::Link) => Source::Attr,
                _ => source,
            },
            rev,
            when,
            variant: (variant + tweak / 3) % 3,
        },
        Kind::Counter {
            source,
            by_b,
            shards,
            ..
        } => Kind::Counter {
            source,
            by_b: if tweak >= 6 { !by_b } else { by_b },
            when,
            shards: if tweak.is_multiple_of(2) {
                shards
            } else {
                shards % 4 + 1
            },
        },
        Kind::Rollup { counter, variant } => Kind::Rollup {
            counter,
            variant: (variant + 1) % 2,
        },
        Kind::Aggregate { variant, group, .. } => Kind::Aggregate {
            when,
            variant: (variant + 1 + tweak % 2) % 3,
            // Now and then totalled onto the other target.
            group: group != (tweak == 7),
        },
    }
}

fn when_toml(when: When) -> &'static str {
    match when {
        When::Always => "",
        When::Flag => "when = { f = true }\n",
        When::KindP => "when = { k = \"p\" }\n",
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Attr => "attr",
        Source::Link => "link",
    }
}

impl Projection {
    pub(super) fn name(&self) -> String {
        let prefix = match self.kind {
            Kind::IndexKeys { .. } => "ik",
            Kind::Denormalize { .. } => "dn",
            Kind::Edge { .. } => "ie",
            Kind::Counter { .. } => "ct",
            Kind::Rollup { .. } => "ru",
            Kind::Aggregate { .. } => "ag",
        };
        format!("{prefix}{}", self.id)
    }

    fn toml(&self) -> String {
        let (id, name) = (self.id, self.name());
        let body = match &self.kind {
            Kind::IndexKeys { source, variant } => {
                let set = match variant {
                    0 => format!("{{ ik{id}p = \"X#{{lower(x)}}\", ik{id}s = \"{{a}}#{{b}}\" }}"),
                    1 => format!("{{ ik{id}p = \"K#{{k}}#{{a}}\" }}"),
                    _ => format!("{{ ik{id}p = \"U#{{upper(trim(x))}}\", ik{id}s = \"B#{{b}}\" }}"),
                };
                format!(
                    "kind = \"index-keys\"\nentity = \"{}\"\nset = {set}\n",
                    source_name(*source)
                )
            }
            Kind::Denormalize { when, variant } => {
                let copy = match variant {
                    0 => format!("{{ dn{id} = \"{{x}}\" }}"),
                    1 => format!("{{ dn{id} = \"{{x}}-{{b}}\" }}"),
                    _ => format!("{{ dn{id} = \"{{n}}\", dn{id}k = \"{{k}}\" }}"),
                };
                format!(
                    "kind = \"denormalize\"\nsource = \"attr\"\ntarget = \"node\"\n{}copy = {copy}\n",
                    when_toml(*when)
                )
            }
            Kind::Edge {
                source,
                rev,
                when,
                variant,
            } => {
                let copy = match variant {
                    0 => String::new(),
                    1 => format!("copy = {{ e{id}x = \"{{x}}\" }}\n"),
                    _ => format!("copy = {{ e{id}x = \"{{lower(x)}}#{{a}}\", e{id}n = \"{{n}}\" }}\n"),
                };
                format!(
                    "kind = \"inverse-edge\"\nsource = \"{}\"\ntarget = \"{}\"\n{}{copy}",
                    source_name(*source),
                    if *rev { "rev" } else { "back" },
                    when_toml(*when)
                )
            }
            Kind::Counter {
                source,
                by_b,
                when,
                shards,
            } => format!(
                "kind = \"counter\"\nsource = \"{}\"\nof = {{ u = \"{{{}}}\" }}\n{}shards = {shards}\n",
                source_name(*source),
                if *by_b { "b" } else { "a" },
                when_toml(*when)
            ),
            Kind::Rollup { counter, variant } => format!(
                "kind = \"rollup\"\ncounter = \"ct{counter}\"\ntarget = \"tally\"\nattribute = \"ru{id}{}\"\n",
                if *variant == 0 { "" } else { "t" }
            ),
            Kind::Aggregate {
                when,
                variant,
                group,
            } => {
                let set = match variant {
                    0 => format!("{{ ag{id}s = \"sum(n)\", ag{id}c = \"count()\" }}"),
                    1 => format!("{{ ag{id}m = \"max(b)\", ag{id}x = \"min(x)\" }}"),
                    _ => format!("{{ ag{id}n = \"min(n)\", ag{id}k = \"max(k)\", ag{id}c = \"count()\" }}"),
                };
                format!(
                    "kind = \"aggregate\"\nsource = \"attr\"\ntarget = \"{}\"\n{}set = {set}\n",
                    if *group { "group" } else { "node" },
                    when_toml(*when)
                )
            }
        };
        format!("[[projections]]\nname = \"{name}\"\n{body}\n")
    }
}

pub(super) fn spec_toml(projections: &[Projection]) -> String {
    let mut text = r#"
service = "generated"

[table]
name = "Generated"

[entities.node]
pk = "N#{a}"
sk = "META"

[entities.attr]
pk = "N#{a}"
sk = "A#{b}"

[entities.link]
pk = "N#{a}"
sk = "L#{b}"

[entities.back]
pk = "N#{b}"
sk = "B#{a}"

[entities.rev]
pk = "R#{b}"
sk = "R#{a}"

[entities.tally]
pk = "T#{u}"
sk = "TALLY"

[entities.group]
pk = "N#{a}"
sk = "G#{b}"

"#
    .to_string();
    for projection in projections {
        text.push_str(&projection.toml());
    }
    text
}

/// A spec and what changes between its two versions.
#[derive(Debug, Clone)]
pub(super) struct Specs {
    pub(super) v1: Vec<Projection>,
    pub(super) v2: Vec<Projection>,
}

pub(super) fn specs() -> impl Strategy<Value = Specs> {
    (
        prop::collection::vec(kind(), 1..5),
        prop::collection::vec(0u8..10, 5),
        prop::collection::vec(0u8..9, 5),
        prop::collection::vec(kind(), 0..3),
        prop::collection::vec(any::<bool>(), 5),
    )
        .prop_map(|(kinds, fates, tweaks, added, ride)| {
            let mut v1: Vec<Projection> = kinds
                .into_iter()
                .enumerate()
                .map(|(id, kind)| Projection { id: id as u8, kind })
                .collect();
            // Counters that ride on an edge (same source, same `when`) are
            // the paths that matter most: make them common.
            let edges: Vec<(Source, When)> = v1
                .iter()
                .filter_map(|p| match p.kind {
                    Kind::Edge { source, when, .. } => Some((source, when)),
                    _ => None,
                })
                .collect();
            for (i, projection) in v1.iter_mut().enumerate() {
                if let Kind::Counter { source, when, .. } = &mut projection.kind {
                    if let (true, Some((edge_source, edge_when))) = (ride[i], edges.first()) {
                        *source = *edge_source;
                        *when = *edge_when;
                    }
                }
            }
            let mut v2 = Vec::new();
            for (i, projection) in v1.iter().enumerate() {
                // A changed counter is rebuilt beside the version readers
                // read: counters change more often than the rest.
                let keep = if matches!(projection.kind, Kind::Counter { .. }) {
                    2
                } else {
                    5
                };
                match fates[i] {
                    f if f <= keep => v2.push(projection.clone()),
                    0..=7 => v2.push(Projection {
                        id: projection.id,
                        kind: changed(&projection.kind, tweaks[i]),
                    }),
                    _ => {}
                }
            }
            for (i, kind) in added.into_iter().enumerate() {
                v2.push(Projection {
                    id: (10 + i) as u8,
                    kind,
                });
            }
            resolve_rollups(&mut v1);
            resolve_rollups(&mut v2);
            Specs { v1, v2 }
        })
        .prop_filter("both versions compile and project something", |specs| {
            !specs.v2.is_empty()
                && Spec::from_toml(&spec_toml(&specs.v1), "v1.toml").is_ok()
                && Spec::from_toml(&spec_toml(&specs.v2), "v2.toml").is_ok()
        })
}

/// Gives each rollup a counter of its spec (an unresolved one the first,
/// by its position), and drops the rollups whose counter is gone.
fn resolve_rollups(projections: &mut Vec<Projection>) {
    let counters: Vec<u8> = projections
        .iter()
        .filter(|p| matches!(p.kind, Kind::Counter { .. }))
        .map(|p| p.id)
        .collect();
    for (i, projection) in projections.iter_mut().enumerate() {
        if let Kind::Rollup { counter, .. } = &mut projection.kind {
            if *counter == UNRESOLVED && !counters.is_empty() {
                *counter = counters[i % counters.len()];
            }
        }
    }
    projections.retain(|p| match p.kind {
        Kind::Rollup { counter, .. } => counters.contains(&counter),
        _ => true,
    });
}

impl Specs {
    /// What a team must backfill after deploying v2: every projection that
    /// is new or changed, and every counter whose records move: its home is
    /// the reverse item of the first edge by name over the same source with
    /// the same `when`, else a marker of its own.
    fn needed(&self) -> BTreeSet<String> {
        let before: BTreeMap<String, &Projection> = self.v1.iter().map(|p| (p.name(), p)).collect();
        let after: BTreeMap<String, &Projection> = self.v2.iter().map(|p| (p.name(), p)).collect();
        let mut needed: BTreeSet<String> = after
            .iter()
            .filter(|(name, p)| before.get(*name) != Some(*p))
            .map(|(name, _)| name.clone())
            .collect();
        let home = |projections: &[Projection], of: Source, by: When| -> Option<(String, bool)> {
            projections
                .iter()
                .filter_map(|p| match p.kind {
                    Kind::Edge {
                        source, rev, when, ..
                    } if source == of && when == by => Some((p.name(), rev)),
                    _ => None,
                })
                .min()
        };
        for projection in &self.v2 {
            if let Kind::Counter { source, when, .. } = projection.kind {
                if home(&self.v1, source, when) != home(&self.v2, source, when) {
                    needed.insert(projection.name());
                }
            }
        }
        // A rollup totals its counter's definition: rebuilt with it.
        for projection in &self.v2 {
            if let Kind::Rollup { counter, .. } = projection.kind {
                if needed.contains(&format!("ct{counter}")) {
                    needed.insert(projection.name());
                }
            }
        }
        needed
    }
}

// ------------------------------------------------------------- histories ---

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Entity {
    Node,
    Attr,
    Link,
    Tally,
    /// `N#{a}` / `G#{b}`: a target in the partition of the `attr` items
    /// it totals, keyed by their sort key's variable.
    Group,
}

/// One writer's action. Small key spaces make actions collide.
#[derive(Debug, Clone)]
pub(super) enum Write {
    Put {
        entity: Entity,
        a: u8,
        b: u8,
        /// 0..3 an address; 3 a map no template renders (poison).
        x: u8,
        n: Option<u8>,
        f: Option<bool>,
        p: bool,
    },
    Delete {
        entity: Entity,
        a: u8,
        b: u8,
    },
}

fn entity() -> impl Strategy<Value = Entity> {
    prop_oneof![
        1 => Just(Entity::Node),
        3 => Just(Entity::Attr),
        4 => Just(Entity::Link),
        1 => Just(Entity::Tally),
        1 => Just(Entity::Group),
    ]
}

pub(super) fn write() -> impl Strategy<Value = Write> {
    prop_oneof![
        4 => (
            entity(),
            0u8..3,
            0u8..3,
            prop_oneof![12 => 0u8..3, 1 => Just(3u8)],
            prop::option::of(0u8..3),
            prop::option::of(any::<bool>()),
            any::<bool>(),
        )
            .prop_map(|(entity, a, b, x, n, f, p)| Write::Put { entity, a, b, x, n, f, p }),
        1 => (entity(), 0u8..3, 0u8..3).prop_map(|(entity, a, b)| Write::Delete { entity, a, b }),
    ]
}

fn key(entity: Entity, a: u8, b: u8) -> (String, String) {
    let pk = format!("N#v{a}");
    let sk = match entity {
        Entity::Node => "META".to_string(),
        Entity::Attr => format!("A#v{b}"),
        Entity::Link => format!("L#v{b}"),
        Entity::Tally => return (format!("T#v{a}"), "TALLY".to_string()),
        Entity::Group => format!("G#v{b}"),
    };
    (pk, sk)
}

pub(super) fn item(
    entity: Entity,
    a: u8,
    b: u8,
    x: u8,
    n: Option<u8>,
    f: Option<bool>,
    p: bool,
) -> Attrs {
    let (pk, sk) = key(entity, a, b);
    let mut item = attrs(&[("PK", s(&pk)), ("SK", s(&sk))]);
    if matches!(entity, Entity::Node | Entity::Tally | Entity::Group) {
        item.insert("title".into(), s(&format!("node {a}")));
        return item;
    }
    let x = match x {
        0 => s("Sam"),
        1 => s(" kim "),
        2 => s("LEE"),
        _ => Av::M([("not".to_string(), s("text"))].into()),
    };
    item.insert("x".into(), x);
    if let Some(n) = n {
        // Now and then a fraction: totals must stay exact.
        let n = if n == 2 {
            Av::N("0.25".into())
        } else {
            support::n(i64::from(n))
        };
        item.insert("n".into(), n);
    }
    if let Some(f) = f {
        item.insert("f".into(), Av::Bool(f));
    }
    item.insert("k".into(), s(if p { "p" } else { "q" }));
    item
}

/// Adds `writes` to the history; then every item left poison is fixed by
/// a later write, so that each phase ends with a state every projection
/// can derive.
pub(super) fn play(history: &mut History, writes: &[Write]) {
    for write in writes {
        match *write {
            Write::Put {
                entity,
                a,
                b,
                x,
                n,
                f,
                p,
            } => {
                // `History` takes a record's old image from the writer's
                // last write, without the copies the projector added: an
                // overwritten target would look unchanged where DynamoDB's
                // stream shows the copy going. Targets are only created.
                let (pk, sk) = key(entity, a, b);
                if matches!(entity, Entity::Node | Entity::Tally | Entity::Group)
                    && history.get(&pk, &sk).is_some()
                {
                    continue;
                }
                history.put(item(entity, a, b, x, n, f, p))
            }
            Write::Delete { entity, a, b } => {
                let (pk, sk) = key(entity, a, b);
                history.delete(&pk, &sk);
            }
        }
    }
    let poison: Vec<Attrs> = history
        .items
        .values()
        .filter(|item| matches!(item.get("x"), Some(Av::M(_))))
        .cloned()
        .collect();
    for mut item in poison {
        item.insert("x".into(), s("Fixed"));
        history.put(item);
    }
}

// ------------------------------------------------------------------ case ---

/// Everything random about one case besides the specs.
#[derive(Debug, Clone)]
struct Plan {
    phase1: Vec<Write>,
    phase2: Vec<Write>,
    delivery1: Delivery,
    delivery2: Delivery,
    /// Pages a backfill call reads before it "crashes" (resumed after).
    backfill_pages: u64,
    /// Projections of v2 backfilled besides the needed ones (indexes).
    extra_backfill: Vec<u8>,
    /// A replay of some projections over the stream's tail: (indexes of
    /// v2's projections, percent of the stream replayed).
    replay: Option<(Vec<u8>, u8)>,
    /// Redrive one projection's letters first (index into v2).
    redrive_first: Option<u8>,
    /// The share of the stream workers' calls that fault, in percent
    /// (throttling, 500s, timeouts, conflicts, answers lost after the
    /// write); the workers are also killed in the middle of batches.
    faults: u8,
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        prop::collection::vec(write(), 1..30),
        prop::collection::vec(write(), 1..30),
        delivery(),
        delivery(),
        1u64..4,
        prop::collection::vec(any::<u8>(), 0..3),
        prop::option::of((prop::collection::vec(any::<u8>(), 1..3), 0u8..=100)),
        prop::option::of(any::<u8>()),
        prop::sample::select(vec![5u8, 15, 25]),
    )
        .prop_map(
            |(
                phase1,
                phase2,
                delivery1,
                delivery2,
                backfill_pages,
                extra_backfill,
                replay,
                redrive_first,
                faults,
            )| Plan {
                phase1,
                phase2,
                delivery1,
                delivery2,
                backfill_pages,
                extra_backfill,
                replay,
                redrive_first,
                faults,
            },
        )
}

fn compile(projections: &[Projection], label: &str) -> (Arc<Spec>, String) {
    let text = spec_toml(projections);
    let spec = Spec::from_toml(&text, label).expect("filtered to compile");
    (Arc::new(spec), text)
}

/// Claims `selection` of `applier`'s spec for `run`, waiting out the
/// leases of another definition as `backfill` does.
pub(super) async fn claim(
    applier: &Applier,
    selection: &[usize],
    run: &str,
) -> Result<(), TestCaseError> {
    let registry = Registry::new(
        applier.client().clone(),
        applier.table(),
        &applier.spec().table,
    )
    .with_skew(applier.config().clock_skew.as_millis() as u64);
    for _ in 0..100 {
        match registry
            .claim(applier.spec(), selection, run)
            .await
            .map_err(|error| TestCaseError::fail(format!("claim: {error}")))?
        {
            ClaimOutcome::Claimed => return Ok(()),
            ClaimOutcome::Wait { until, .. } => {
                let left = until.saturating_sub(ddb_projector::dynamo::time::now_ms()) + 20;
                tokio::time::sleep(std::time::Duration::from_millis(left)).await;
            }
            other => return Err(TestCaseError::fail(format!("claim: {other:?}"))),
        }
    }
    Err(TestCaseError::fail("the claim kept waiting"))
}

/// Backfills `selection` of `applier`'s spec as run `run`, each call
/// reading at most `pages` pages and then stopping as a crash would; calls
/// again until every segment is done. The names the last call recorded as
/// backfilled.
async fn backfill_in_slices(
    applier: &Applier,
    selection: Vec<usize>,
    pages: u64,
    run: &str,
) -> Result<Vec<String>, TestCaseError> {
    for _ in 0..200 {
        let summary = backfill(
            applier,
            &BackfillOptions {
                projections: Some(selection.clone()),
                page_size: 7,
                max_pages: Some(pages),
                resume: true,
                progress: false,
                run: Some(run.to_string()),
                ..BackfillOptions::default()
            },
        )
        .await
        .map_err(|error| TestCaseError::fail(format!("backfill: {error}")))?;
        if summary.is_done() {
            prop_assert!(
                summary.not_backfilled.is_empty(),
                "run {run} not recorded: {:?}",
                summary.not_backfilled
            );
            return Ok(summary.backfilled);
        }
    }
    Err(TestCaseError::fail("the backfill never finished"))
}

/// `status` of `spec` on `table`: each projection's state by name.
async fn states(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
) -> BTreeMap<String, State> {
    let registry = Registry::new(client.clone(), table, &spec.table);
    let snapshot = registry.snapshot(spec).await.expect("the registry");
    control::states(
        spec,
        &snapshot,
        ddb_projector::dynamo::time::now_ms(),
        0,
        &std::collections::HashMap::new(),
        &control::Commands::default(),
    )
    .into_iter()
    .map(|row| (row.name, row.state))
    .collect()
}

/// Every projection of `spec` is live; the registry's other names retired.
async fn check_live(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    context: &str,
) -> Result<(), TestCaseError> {
    let states = states(client, table, spec).await;
    for (name, state) in &states {
        let want = match spec.projection_id(name) {
            Some(_) => State::Live,
            None => State::Retired,
        };
        prop_assert_eq!(
            *state,
            want,
            "{}: status of {}: {:?}",
            context,
            name,
            states
        );
    }
    Ok(())
}

async fn redrive_all(applier: &Applier, first: Option<String>) -> Result<(), TestCaseError> {
    if let Some(name) = first {
        applier
            .redrive(Some(std::slice::from_ref(&name)))
            .await
            .map_err(|error| TestCaseError::fail(format!("redrive {name}: {error}")))?;
    }
    let summary = applier
        .redrive(None)
        .await
        .map_err(|error| TestCaseError::fail(format!("redrive: {error}")))?;
    count(
        &COVERAGE.letters_redriven,
        summary.redriven + summary.superseded,
    );
    let letters = applier.dead_letter_store().list().await.expect("list");
    prop_assert!(
        letters.is_empty(),
        "dead letters left after a redrive: {:#?}",
        letters
            .iter()
            .map(|l| (&l.projection, &l.source_key, &l.error))
            .collect::<Vec<_>>()
    );
    Ok(())
}

async fn check_oracle(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    toml: &str,
    context: &str,
) -> Result<(), TestCaseError> {
    let items = support::scan_all(client, table).await;
    let problems = oracle::differences(toml, &items);
    prop_assert!(
        problems.is_empty(),
        "{context}: the table differs from what the spec computes:\n  {}",
        problems.join("\n  ")
    );
    Ok(())
}

/// What is left in `items` of the `dropped` projections, judged from the
/// generator's own names (independent of `src/prune`): a counter's shards,
/// markers and records, an index or copy attribute (their names carry the
/// projection's id), an edge's reverse items unless `kept` has an edge onto
/// the same entity.
pub(super) fn leftovers(
    items: &[Attrs],
    dropped: &[&Projection],
    kept: &[Projection],
) -> Vec<String> {
    let mut out = Vec::new();
    let targets_kept = |rev: bool| {
        kept.iter()
            .any(|p| matches!(p.kind, Kind::Edge { rev: r, .. } if r == rev))
    };
    for item in items {
        let pk = support::text(item, "PK").unwrap_or_default();
        let sk = support::text(item, "SK").unwrap_or_default();
        for p in dropped {
            let (name, id) = (p.name(), p.id);
            let left = match p.kind {
                Kind::Counter { .. } => {
                    pk.starts_with(&format!("COUNTER#{name}#"))
                        || pk.starts_with(&format!("_ddbp#count#{name}#"))
                        || matches!(item.get("_ddbp#c"), Some(Av::M(m)) if m.contains_key(&name))
                }
                Kind::IndexKeys { .. } => {
                    item.contains_key(&format!("ik{id}p")) || item.contains_key(&format!("ik{id}s"))
                }
                Kind::Denormalize { .. } => {
                    item.contains_key(&format!("dn{id}")) || item.contains_key(&format!("dn{id}k"))
                }
                Kind::Rollup { .. } => {
                    item.contains_key(&format!("ru{id}"))
                        || item.contains_key(&format!("ru{id}t"))
                        || item.contains_key(&format!("_ddbp#v#{name}"))
                }
                Kind::Aggregate { .. } => {
                    item.keys().any(|attr| {
                        attr.starts_with(&format!("ag{id}"))
                            && attr.len() == format!("ag{id}").len() + 1
                    }) || item.contains_key(&format!("_ddbp#v#{name}"))
                }
                Kind::Edge { rev, .. } => {
                    let reverse = if rev {
                        pk.starts_with("R#")
                    } else {
                        sk.starts_with("B#")
                    };
                    (reverse && !targets_kept(rev))
                        || item.contains_key(&format!("e{id}x"))
                        || item.contains_key(&format!("e{id}n"))
                }
            };
            if left {
                out.push(format!("{name}: {pk} {sk}: {item:?}"));
            }
        }
    }
    out
}

/// FNV-1a: a stable choice from a case's own values (a field drawn for
/// it would change what every stored seed generates).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether a sort key is one a projection writes its attributes on.
type OnKeys = fn(&str) -> bool;

/// Corrupts one derived thing of `kept` (judged from the generator's own
/// names, not from `src/plan`), chosen by `seed`: a counter shard's count
/// moves by one, a reverse edge or counter marker goes, or a derived
/// attribute gets a wrong value. Returns what it did, `None` when the
/// table derives nothing.
async fn plant_drift(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    kept: &[Projection],
    seed: u64,
) -> Option<String> {
    let items = support::scan_all(client, table).await;
    // The attributes each kept projection writes, as `Projection::toml`
    // names them, and the sort keys of the items it writes them on (a v1
    // variant's leftovers are not v2's to audit: an aggregate moved onto
    // the other target leaves its old totals, same names, for `prune`).
    let written: Vec<(String, OnKeys)> = kept
        .iter()
        .flat_map(|p| {
            let id = p.id;
            let on: OnKeys = match p.kind {
                Kind::Aggregate { group: true, .. } => |sk| sk.starts_with("G#"),
                Kind::Aggregate { group: false, .. } => |sk| sk == "META",
                _ => |_| true,
            };
            let names: Vec<String> = match p.kind {
                Kind::IndexKeys { variant: 1, .. } => vec![format!("ik{id}p")],
                Kind::IndexKeys { .. } => vec![format!("ik{id}p"), format!("ik{id}s")],
                Kind::Denormalize { variant: 0 | 1, .. } => vec![format!("dn{id}")],
                Kind::Denormalize { .. } => vec![format!("dn{id}"), format!("dn{id}k")],
                Kind::Edge { variant: 0, .. } => vec![],
                Kind::Edge { variant: 1, .. } => vec![format!("e{id}x")],
                Kind::Edge { .. } => vec![format!("e{id}x"), format!("e{id}n")],
                Kind::Counter { .. } => vec![],
                Kind::Rollup { variant: 0, .. } => vec![format!("ru{id}")],
                Kind::Rollup { .. } => vec![format!("ru{id}t")],
                Kind::Aggregate { variant: 0, .. } => vec![format!("ag{id}s"), format!("ag{id}c")],
                Kind::Aggregate { variant: 1, .. } => vec![format!("ag{id}m"), format!("ag{id}x")],
                Kind::Aggregate { .. } => {
                    vec![format!("ag{id}n"), format!("ag{id}k"), format!("ag{id}c")]
                }
            };
            names.into_iter().map(move |name| (name, on))
        })
        .collect();
    let derived_attribute =
        |name: &str, sk: &str| written.iter().any(|(w, on)| w == name && on(sk));
    let edge_onto = |entity_pk: &str, sk: &str| {
        kept.iter().any(|p| match p.kind {
            Kind::Edge { rev, .. } => {
                if rev {
                    entity_pk.starts_with("R#") && sk.starts_with("R#")
                } else {
                    entity_pk.starts_with("N#") && sk.starts_with("B#")
                }
            }
            _ => false,
        })
    };
    let live_storage = |rest: &str| {
        rest.split('#')
            .next()
            .is_some_and(|storage| spec.counter_by_storage(storage).is_some())
    };
    // (pk, sk, what to do)
    let mut candidates: Vec<(String, String, Option<String>)> = Vec::new();
    for item in &items {
        let (Some(pk), Some(sk)) = (support::text(item, "PK"), support::text(item, "SK")) else {
            continue;
        };
        if let Some(rest) = pk.strip_prefix("COUNTER#") {
            if live_storage(rest) {
                candidates.push((pk, sk, Some("count".to_string())));
            }
            continue;
        }
        if let Some(rest) = pk.strip_prefix("_ddbp#count#") {
            if live_storage(rest) {
                candidates.push((pk, sk, None));
            }
            continue;
        }
        if pk.starts_with('_') {
            continue;
        }
        if edge_onto(&pk, &sk) {
            candidates.push((pk.clone(), sk.clone(), None));
        }
        let mut names: Vec<&String> = item.keys().filter(|n| derived_attribute(n, &sk)).collect();
        names.sort();
        for name in names {
            candidates.push((pk.clone(), sk.clone(), Some(name.clone())));
        }
    }
    if candidates.is_empty() {
        return None;
    }
    let (pk, sk, what) = candidates.swap_remove((seed % candidates.len() as u64) as usize);
    let key = [("PK", s(&pk)), ("SK", s(&sk))];
    let update = client.update_item().table_name(table).set_key(Some(
        key.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    ));
    match what.as_deref() {
        None => {
            support::delete(client, table, &pk, &sk).await;
            Some(format!("the deleted {pk} / {sk}"))
        }
        Some("count") => {
            update
                .update_expression("ADD #c :one")
                .expression_attribute_names("#c", "count")
                .expression_attribute_values(":one", Av::N("1".to_string()))
                .send()
                .await
                .expect("update the shard");
            Some(format!("the shard {pk} counting one more"))
        }
        Some(name) => {
            update
                .update_expression("SET #a = :v")
                .expression_attribute_names("#a", name)
                .expression_attribute_values(":v", s("drifted"))
                .send()
                .await
                .expect("update the attribute");
            Some(format!("{name} of {pk} / {sk} drifted"))
        }
    }
}

/// Registers `text` (a generated spec, for `table`) as a team's CI does,
/// and returns the spec the registry serves, which must be the one the
/// text compiles to, and the registration's plan.
async fn register(
    registrations: &control::Registrations,
    table: &str,
    text: &str,
    compiled: &Spec,
) -> Result<(Arc<Spec>, control::Planned), TestCaseError> {
    let text = text.replace("name = \"Generated\"", &format!("name = \"{table}\""));
    let planned = control::register(
        registrations,
        &control::Change {
            table: table.to_string(),
            text: Some(("generated.toml".to_string(), text)),
            service: None,
            by: "specgen".to_string(),
            dry_run: false,
        },
    )
    .await
    .map_err(|error| TestCaseError::fail(format!("register: {error:?}")))?;
    prop_assert!(
        planned.stored.is_some() || planned.unchanged,
        "{:?}",
        planned
    );
    let (served, _) = control::registered_spec(registrations.client(), table)
        .await
        .map_err(|error| TestCaseError::fail(format!("registered spec: {error:#}")))?;
    prop_assert_eq!(
        served.projections_fingerprint(),
        compiled.projections_fingerprint(),
        "the registry serves another spec than the text"
    );
    Ok((Arc::new(served), planned))
}

async fn case(specs: &Specs, plan: &Plan) -> Result<(), TestCaseError> {
    let (v1, toml1) = compile(&specs.v1, "v1.toml");
    let (v2, toml2) = compile(&specs.v2, "v2.toml");
    let client = support::client().await;
    let table = support::fresh_table(&client, &v2, "specgen").await;
    // Short leases, so that v2's backfill waits little for v1's worker.
    // One clock: no skew to allow for.
    let config = ApplyConfig {
        lease: std::time::Duration::from_millis(300),
        clock_skew: std::time::Duration::ZERO,
        ..ApplyConfig::default()
    };
    // The stream workers' calls go through the fault interceptor: faults
    // at the drawn rate while they deliver, and kills mid-batch.
    let faults = Faults::new(
        fnv(format!("{specs:?}{plan:?}").as_bytes()),
        f64::from(plan.faults) / 100.0,
    );
    faults.set_enabled(false);
    let faulty = faults.dynamodb(&support::sdk_config().await, true);
    let worker1 = control::stream_consumer(faulty.clone(), v1.clone(), &table, config.clone());
    let filler1 = control::applier(client.clone(), v1.clone(), &table, config.clone());
    let registry = Registry::new(client.clone(), &table, &v2.table);
    // v1 and v2 reach the workers as a service team's CI registers them:
    // stored in the table's registry, read back and composed.
    let registrations = control::Registrations::of_table(&client, &table)
        .await
        .map_err(|error| TestCaseError::fail(format!("registrations: {error:#}")))?;
    let (v1, _) = register(&registrations, &table, &toml1, &v1).await?;
    let mut history = History::default();
    play(&mut history, &plan.phase1);
    let phase1 = history.records.len();
    play(&mut history, &plan.phase2);
    count(&COVERAGE.cases, 1);
    let drawn =
        |f: fn(&Kind) -> bool| usize::from(specs.v1.iter().chain(&specs.v2).any(|p| f(&p.kind)));
    count(
        &COVERAGE.rollups,
        drawn(|k| matches!(k, Kind::Rollup { .. })),
    );
    count(
        &COVERAGE.aggregates,
        drawn(|k| matches!(k, Kind::Aggregate { .. })),
    );
    count(
        &COVERAGE.aggregates_grouped,
        drawn(|k| matches!(k, Kind::Aggregate { group: true, .. })),
    );
    count(&COVERAGE.records, history.records.len());
    count(
        &COVERAGE.kinesis,
        usize::from(plan.delivery1.kinesis || plan.delivery2.kinesis),
    );
    count(
        &COVERAGE.counters_on_edges,
        usize::from(rides(&v1) || rides(&v2)),
    );
    let placements = |spec: &Spec| -> BTreeMap<String, bool> {
        spec.projections
            .iter()
            .filter_map(|p| match &p.kind {
                ddb_projector::spec::ProjectionKind::Counter(c) => {
                    Some((p.name.clone(), c.marker == ddb_projector::spec::Marker::Own))
                }
                _ => None,
            })
            .collect()
    };
    let (before, after) = (placements(&v1), placements(&v2));
    count(
        &COVERAGE.counters_moved,
        usize::from(
            before
                .iter()
                .any(|(name, own)| after.get(name).is_some_and(|o| o != own)),
        ),
    );
    count(
        &COVERAGE.changed_specs,
        usize::from(!specs.needed().is_empty()),
    );
    let result = async {
        // Phase 1: v1 live.
        let mut writer = Writer {
            client: &client,
            table: &table,
            history: &history,
            written: 0,
        };
        let phase1_history = History {
            records: history.records[..phase1].to_vec(),
            items: BTreeMap::new(),
        };
        let mut writer1 = Writer {
            client: &client,
            table: &table,
            history: &phase1_history,
            written: 0,
        };
        // Deployed: the worker takes its leases when it starts.
        worker1.take_leases().await.map_err(TestCaseError::fail)?;
        faults.set_enabled(true);
        deliver_with(&worker1, &mut writer1, 0, &plan.delivery1, Some(&faults)).await?;
        faults.set_enabled(false);
        redrive_all(&worker1, None).await?;
        check_oracle(&client, &table, &toml1, "after phase 1 under v1").await?;
        // Projected from the first write on, but not backfilled: not live
        // until a backfill of every v1 projection.
        let all1: Vec<usize> = (0..v1.projections.len()).collect();
        let before = states(&client, &table, &v1).await;
        prop_assert!(
            before.values().all(|state| *state == State::New),
            "never backfilled: {:?}",
            before
        );
        claim(&filler1, &all1, "p1").await?;
        // Not what this case tests: one call, large pages.
        let done = backfill(
            &filler1,
            &BackfillOptions {
                projections: Some(all1),
                page_size: 500,
                resume: true,
                progress: false,
                run: Some("p1".to_string()),
                ..BackfillOptions::default()
            },
        )
        .await
        .map_err(|error| TestCaseError::fail(format!("backfill: {error}")))?
        .backfilled;
        prop_assert_eq!(done.len(), v1.projections.len());
        check_live(&client, &table, &v1, "after phase 1's backfill").await?;
        writer.written = phase1;

        // Phase 2: v2 registered, laid out as every process lays it out: a
        // changed counter is built beside the version readers read, which
        // the worker keeps current. Its worker takes the rest of the stream
        // while a backfill of what changed runs beside it. The
        // registration's plan names, as the lifecycle will, every
        // projection that must be backfilled as not live.
        let (v2, planned) = register(&registrations, &table, &toml2, &v2).await?;
        let needed: BTreeSet<String> = specs
            .needed()
            .into_iter()
            .filter(|name| v2.projection_id(name).is_some())
            .collect();
        for name in &needed {
            let row = planned.projections.iter().find(|p| &p.name == name);
            prop_assert!(
                row.is_some_and(|row| row.state != "live" && row.next.is_some()),
                "register's plan says nothing is needed of `{}`: {:?}",
                name,
                row
            );
        }
        for p in &specs.v1 {
            if v2.projection_id(&p.name()).is_none() {
                prop_assert!(
                    planned
                        .projections
                        .iter()
                        .any(|row| row.name == p.name() && row.change == "retired"),
                    "register's plan does not retire `{}`",
                    p.name()
                );
            }
        }
        let (laid2, layouts2) = registry
            .layout(&v2)
            .await
            .map_err(|error| TestCaseError::fail(format!("layout: {error}")))?;
        let laid2 = Arc::new(laid2);
        let beside: Vec<String> = layouts2
            .iter()
            .filter(|l| l.old.as_ref().is_some_and(|o| o.not_kept.is_none()))
            .map(|l| l.name.clone())
            .collect();
        count(&COVERAGE.rebuilt_beside, beside.len());
        count(
            &COVERAGE.rollups_rebuilt,
            specs
                .v2
                .iter()
                .filter(|p| matches!(p.kind, Kind::Rollup { counter, .. } if beside.contains(&format!("ct{counter}"))))
                .count(),
        );
        let id2 = |name: &str| laid2.projection_id(name).expect("laid out from v2");
        let worker2 = control::stream_consumer(faulty.clone(), laid2.clone(), &table, config.clone());
        let filler2 = control::applier(client.clone(), laid2.clone(), &table, config.clone());
        let not_live: BTreeSet<String> = states(&client, &table, &v2)
            .await
            .into_iter()
            .filter(|(name, state)| *state != State::Live && v2.projection_id(name).is_some())
            .map(|(name, _)| name)
            .collect();
        let needed: BTreeSet<String> = specs
            .needed()
            .into_iter()
            .filter(|name| v2.projection_id(name).is_some())
            .collect();
        prop_assert!(
            needed.is_subset(&not_live),
            "status says live what changed: needed {:?}, not live {:?}",
            needed,
            not_live
        );
        let mut selection: BTreeSet<usize> = not_live
            .iter()
            .filter(|name| v2.projection_id(name).is_some())
            .map(|name| id2(name))
            .collect();
        for extra in &plan.extra_backfill {
            selection.insert(id2(&v2.projections
                [usize::from(*extra) % v2.projections.len()]
            .name));
        }
        let selection: Vec<usize> = selection.into_iter().collect();
        // v2 deployed: its worker runs while the backfill waits out v1's
        // last leases, then claims and scans. In a third of the cases the
        // worker drains phase 2 first (two thirds when a counter is rebuilt
        // beside its old version): readers of such a counter then read
        // exactly what v1 computes from the current items.
        worker2.take_leases().await.map_err(TestCaseError::fail)?;
        let drain_first =
            plan.backfill_pages == 3 || (!beside.is_empty() && plan.backfill_pages == 2);
        if drain_first {
            faults.set_enabled(true);
            deliver_with(&worker2, &mut writer, phase1, &plan.delivery2, Some(&faults)).await?;
            faults.set_enabled(false);
            redrive_all(&worker2, None).await?;
            // With the rollups of those counters that v1 had as they are:
            // they total the version readers read.
            let old: Vec<Projection> = specs
                .v1
                .iter()
                .filter(|p| {
                    beside.contains(&p.name())
                        || matches!(p.kind, Kind::Rollup { counter, .. }
                            if beside.contains(&format!("ct{counter}")) && specs.v2.contains(p))
                })
                .cloned()
                .collect();
            if !old.is_empty() {
                count(&COVERAGE.readers_checked, 1);
                check_oracle(
                    &client,
                    &table,
                    &spec_toml(&old),
                    "readers of counters rebuilt beside, before the backfill",
                )
                .await?;
            }
            // The audit reads the lifecycle: before the backfill, it finds
            // nothing but on new projections (their history is not derived
            // yet), judges no changed one by its new definition, and its
            // repair leaves readers the version they read.
            let report = audit(
                &worker2,
                &AuditOptions {
                    repair: true,
                    progress: false,
                    ..AuditOptions::default()
                },
            )
            .await
            .map_err(|error| TestCaseError::fail(format!("audit --repair before the backfill: {error}")))?;
            count(&COVERAGE.audited_before_backfill, 1);
            for finding in &report.findings {
                prop_assert!(
                    report
                        .not_live
                        .iter()
                        .any(|n| n.projection == finding.rule && n.judged),
                    "before v2's backfill, the audit found on `{}`, which is not new: {:?}\nnot live: {:?}",
                    finding.rule,
                    finding,
                    report.not_live
                );
            }
            for name in &needed {
                prop_assert!(
                    report.not_live.iter().any(|n| &n.projection == name),
                    "the audit says nothing of `{}`, which needs its backfill: {:?}",
                    name,
                    report.not_live
                );
            }
            if !old.is_empty() {
                check_oracle(
                    &client,
                    &table,
                    &spec_toml(&old),
                    "readers of counters rebuilt beside, after `audit --repair` before the backfill",
                )
                .await?;
            }
        }
        let live = async {
            if drain_first {
                return Ok(());
            }
            faults.set_enabled(true);
            let delivered =
                deliver_with(&worker2, &mut writer, phase1, &plan.delivery2, Some(&faults)).await;
            faults.set_enabled(false);
            delivered
        };
        let filling = async {
            if selection.is_empty() {
                return Ok(Vec::new());
            }
            count(&COVERAGE.backfilled, 1);
            claim(&filler2, &selection, "p2").await?;
            backfill_in_slices(&filler2, selection.clone(), plan.backfill_pages, "p2").await
        };
        let (live, filling) = tokio::join!(live, filling);
        live?;
        filling?;
        // Within a lease period of the switch, the worker lays the spec out
        // again: it no longer keeps the old versions.
        let (laid3, layouts3) = registry
            .layout(&v2)
            .await
            .map_err(|error| TestCaseError::fail(format!("layout: {error}")))?;
        prop_assert!(
            layouts3.iter().all(|l| l.old.is_none()),
            "a complete backfill left old versions: {:?}",
            layouts3
        );
        let laid3 = Arc::new(laid3);
        let worker2 = control::stream_consumer(client.clone(), laid3.clone(), &table, config.clone());

        // A replay of some projections over the stream's tail.
        if let Some((chosen, percent)) = &plan.replay {
            count(&COVERAGE.replays, 1);
            let mut ids: Vec<usize> = chosen
                .iter()
                .map(|i| {
                    let name = &v2.projections[usize::from(*i) % v2.projections.len()].name;
                    laid3.projection_id(name).expect("laid out from v2")
                })
                .collect();
            ids.sort_unstable();
            ids.dedup();
            let from = history.records.len() * (100 - usize::from(*percent)) / 100;
            let options = BatchOptions {
                selection: Some(ids),
                ..BatchOptions::default()
            };
            apply_with(&worker2, &history.records[from..], &options).await?;
        }
        let first = plan.redrive_first.map(|i| {
            v2.projections[usize::from(i) % v2.projections.len()]
                .name
                .clone()
        });
        redrive_all(&worker2, first).await?;
        check_oracle(&client, &table, &toml2, "after phase 2 under v2").await?;
        check_live(&client, &table, &v2, "after phase 2").await?;

        // The audit finds nothing.
        let report = audit(
            &worker2,
            &AuditOptions {
                progress: false,
                ..AuditOptions::default()
            },
        )
        .await
        .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
        prop_assert!(
            report.is_clean(),
            "the audit found:\n{}",
            report.to_text(&v2)
        );

        // Drift planted in one derived item is found, and the repair
        // leaves the table exact again.
        let seed = fnv(format!("{specs:?}{plan:?}").as_bytes());
        if let Some(planted) = plant_drift(&client, &table, worker2.spec(), &specs.v2, seed).await
        {
            count(&COVERAGE.planted, 1);
            let options = AuditOptions {
                progress: false,
                page_size: Some(5),
                ..AuditOptions::default()
            };
            let found = audit(&worker2, &options)
                .await
                .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
            prop_assert!(!found.is_clean(), "the audit missed {planted}");
            // The Lambda's way, segments in slices checkpointed in the
            // table and merged, finds the same.
            let sliced = sliced_audit(&worker2, &format!("find-{seed:x}"), false).await?;
            prop_assert_eq!(
                super::audit::found(&sliced),
                super::audit::found(&found),
                "sliced and merged against one audit, {}",
                planted
            );
            // Half the cases repair the Lambda's way.
            let repaired = if seed.is_multiple_of(2) {
                sliced_audit(&worker2, &format!("repair-{seed:x}"), true).await?
            } else {
                audit(
                    &worker2,
                    &AuditOptions {
                        repair: true,
                        ..options.clone()
                    },
                )
                .await
                .map_err(|error| TestCaseError::fail(format!("audit --repair: {error}")))?
            };
            prop_assert!(
                repaired.repair_failures.is_empty(),
                "repairing {planted}: {:?}",
                repaired.repair_failures
            );
            check_oracle(&client, &table, &toml2, &format!("after repairing {planted}")).await?;
            let after = audit(&worker2, &options)
                .await
                .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
            prop_assert!(
                after.is_clean(),
                "after repairing {planted}, the audit found:\n{}",
                after.to_text(&v2)
            );
        }

        // A full replay (and a redrive of what it dead-letters again)
        // changes nothing the spec owns: counters that v2 dropped lose
        // records (shard and all) when their items are written again, and
        // a shard's `changes` stamp counts transactions, not state.
        let owned = |items: Vec<Attrs>| -> Vec<Attrs> {
            let current = |storage: &str| laid3.counter_by_storage(storage).is_some();
            items
                .into_iter()
                .filter(|item| {
                    support::text(item, "PK").is_none_or(|pk| !Registry::is_registry_key(&pk))
                })
                .filter(|item| {
                    support::text(item, "PK")
                        .and_then(|pk| pk.strip_prefix("COUNTER#").map(str::to_string))
                        .is_none_or(|rest| {
                            laid3.projections.iter().any(|p| match &p.kind {
                                ddb_projector::spec::ProjectionKind::Counter(c) => {
                                    rest.starts_with(&format!("{}#", c.storage))
                                }
                                _ => false,
                            })
                        })
                })
                .map(|mut item| {
                    item.remove("changes");
                    if let Some(Av::M(records)) = item.get_mut("_ddbp#c") {
                        records.retain(|name, _| current(name));
                        if records.is_empty() {
                            item.remove("_ddbp#c");
                        }
                    }
                    item
                })
                .collect()
        };
        let before = owned(snapshot(&client, &table).await);
        apply_with(&worker2, &history.records, &BatchOptions::default()).await?;
        redrive_all(&worker2, None).await?;
        let after = owned(snapshot(&client, &table).await);
        if before != after {
            let changed: Vec<String> = after
                .iter()
                .filter(|item| !before.contains(item))
                .map(|item| format!("{item:?}"))
                .collect();
            prop_assert!(false, "a full replay changed:\n  {}", changed.join("\n  "));
        }

        // What v2 retired is pruned, and the old versions of the counters it
        // rebuilt beside them once the worker's lease of them ended: nothing
        // of them is left, and what v2 derives is untouched.
        let dropped: Vec<&Projection> = specs
            .v1
            .iter()
            .filter(|p| v2.projection_id(&p.name()).is_none() || beside.contains(&p.name()))
            .collect();
        if !dropped.is_empty() {
            count(&COVERAGE.pruned, 1);
            tokio::time::sleep(config.lease + std::time::Duration::from_millis(100)).await;
            let before = states(&client, &table, &v2).await;
            let retired_name = |p: &Projection| {
                if beside.contains(&p.name()) {
                    format!("{}~0", p.name())
                } else {
                    p.name()
                }
            };
            for p in &dropped {
                prop_assert_eq!(
                    before.get(&retired_name(p)),
                    Some(&State::Retired),
                    "{:?}",
                    before
                );
            }
            let retired: Vec<Retired> = dropped
                .iter()
                .map(|p| {
                    if beside.contains(&p.name()) {
                        Retired::new(&retired_name(p), laid2.clone()).expect("laid out beside")
                    } else {
                        Retired::new(&p.name(), v1.clone()).expect("in v1")
                    }
                })
                .collect();
            let summary = prune(
                &client,
                &table,
                &laid3,
                &retired,
                &PruneOptions {
                    segments: 2,
                    page_size: 7,
                    progress: false,
                    ..PruneOptions::default()
                },
            )
            .await
            .map_err(|error| TestCaseError::fail(format!("prune: {error}")))?;
            prop_assert!(summary.kept.is_empty(), "prune kept: {:?}", summary.kept);
            let leftovers = leftovers(&snapshot(&client, &table).await, &dropped, &specs.v2);
            prop_assert!(
                leftovers.is_empty(),
                "left after the prune:\n  {}",
                leftovers.join("\n  ")
            );
            check_oracle(&client, &table, &toml2, "after the prune").await?;
            check_live(&client, &table, &v2, "after the prune").await?;
        }
        // The workers were killed in the middle of a batch, between a write
        // answered and the requests after it (which never reached DynamoDB),
        // as the interceptor saw it.
        prop_assert!(
            faults.kills_landed() > 0 || faults.armed_writes() == 0,
            "no kill landed inside a batch ({} writes answered while one was armed): {}",
            faults.armed_writes(),
            faults.report()
        );
        count(&COVERAGE.kills, faults.kills_landed() as usize);
        count(&COVERAGE.cut, faults.cut() as usize);
        count(&COVERAGE.faults, faults.injected_total() as usize);
        count(&COVERAGE.lost_writes, faults.lost_writes() as usize);
        Ok(())
    }
    .await;
    let _ = client.delete_table().table_name(&table).send().await;
    result
}

#[test]
fn generated_specs_stay_exact_through_changes_backfills_replays_and_redrives() {
    let cases = std::env::var("SPEC_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/dynamo/properties/specs.txt",
        ))),
        // `SPEC_SHRINK=0` reports the first failing case as drawn.
        max_shrink_iters: std::env::var("SPEC_SHRINK")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(300),
        max_shrink_time: 600_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config.clone());
    let started = std::time::Instant::now();
    // A case is one large future, polled on this thread: debug builds lay
    // it out unoptimized, beyond a test thread's 2 MiB stack.
    let result = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            runner
                .run(&(specs(), plan()), |(specs, plan)| {
                    runtime().block_on(case(&specs, &plan))
                })
                .map_err(|error| error.to_string())?;
            top_up(&config)
        })
        .expect("a thread")
        .join()
        .expect("the property test thread");
    let c = &COVERAGE;
    let n = |what: &AtomicUsize| what.load(Ordering::Relaxed);
    eprintln!(
        "timing: generated specs: {cases} cases took {:.1} s; of {} runs (with shrinking): {} with counters riding on edges, {} moving a counter between an edge and markers of its own, {} changing what needs a backfill, {} backfilled beside the live worker, {} replaying some projections, {} pruning what v2 retired, {} counters rebuilt beside their old version, {} cases reading them before the backfill, {} with rollups ({} rebuilt with their counter), {} with aggregates ({} onto a target keyed by their sort key), {} with drift planted, found and repaired ({} sliced merges located counters in a pass, {} recounted in one); {} records, {} dead letters redriven; {} delivered as a Kinesis stream does (any order, derived as items are now); {} faults injected into the workers' calls ({} answers of applied writes lost), {} kills inside a batch ({} requests they cut off); {} audited with repair before the backfill",
        started.elapsed().as_secs_f64(),
        n(&c.cases),
        n(&c.counters_on_edges),
        n(&c.counters_moved),
        n(&c.changed_specs),
        n(&c.backfilled),
        n(&c.replays),
        n(&c.pruned),
        n(&c.rebuilt_beside),
        n(&c.readers_checked),
        n(&c.rollups),
        n(&c.rollups_rebuilt),
        n(&c.aggregates),
        n(&c.aggregates_grouped),
        n(&c.planted),
        n(&c.locate_passes),
        n(&c.recount_passes),
        n(&c.records),
        n(&c.letters_redriven),
        n(&c.kinesis),
        n(&c.faults),
        n(&c.lost_writes),
        n(&c.kills),
        n(&c.cut),
        n(&c.audited_before_backfill),
    );
    if let Err(error) = result {
        panic!("{error}");
    }
    // Whatever the number of cases (the random ones and the top-up's),
    // the paths that matter were reached: a change to the generator that
    // stopped reaching one fails here.
    for goal in GOALS {
        assert!((goal.reached)(), "no generated case {}", goal.what);
    }
}

/// A path the generated cases must reach in every run.
struct Goal {
    what: &'static str,
    /// Whether the cases so far reached it.
    reached: fn() -> bool,
    /// Cases likely to reach it.
    likely: fn(&Specs, &Plan) -> bool,
}

fn reached(what: &AtomicUsize) -> bool {
    what.load(Ordering::Relaxed) > 0
}

/// Whether some counter of v1 is changed in v2 over the same source: it is
/// rebuilt beside the version readers read.
fn rebuilds_a_counter(specs: &Specs) -> Option<u8> {
    specs.v1.iter().find_map(|old| {
        let Kind::Counter { source, .. } = old.kind else {
            return None;
        };
        specs.v2.iter().find_map(|new| match new.kind {
            Kind::Counter { source: s2, .. }
                if new.id == old.id && new.kind != old.kind && s2 == source =>
            {
                Some(old.id)
            }
            _ => None,
        })
    })
}

/// The phase 2 worker drains before the backfill when a counter is rebuilt
/// beside (see `case`).
fn drains_first(plan: &Plan) -> bool {
    plan.backfill_pages >= 2
}

const GOALS: &[Goal] = &[
    Goal {
        what: "met an injected fault, and lost the answer of an applied write",
        reached: || reached(&COVERAGE.faults) && reached(&COVERAGE.lost_writes),
        likely: |_, plan| plan.faults == 25,
    },
    Goal {
        what: "rebuilt a counter beside its old version, read it, and audited before the backfill",
        reached: || {
            reached(&COVERAGE.rebuilt_beside)
                && reached(&COVERAGE.readers_checked)
                && reached(&COVERAGE.audited_before_backfill)
        },
        likely: |specs, plan| rebuilds_a_counter(specs).is_some() && drains_first(plan),
    },
    Goal {
        what: "rebuilt a rollup with its counter",
        reached: || reached(&COVERAGE.rollups_rebuilt),
        likely: |specs, _| {
            rebuilds_a_counter(specs).is_some_and(|id| {
                specs
                    .v2
                    .iter()
                    .any(|p| matches!(p.kind, Kind::Rollup { counter, .. } if counter == id))
            })
        },
    },
    Goal {
        what: "drew an aggregate onto a group",
        reached: || reached(&COVERAGE.aggregates_grouped),
        likely: |specs, _| {
            specs
                .v2
                .iter()
                .any(|p| matches!(p.kind, Kind::Aggregate { group: true, .. }))
        },
    },
    Goal {
        what: "had a sliced merge locate counters and recount shards in passes",
        reached: || reached(&COVERAGE.locate_passes) && reached(&COVERAGE.recount_passes),
        // Drift is planted on a counter when v2 derives nothing else.
        likely: |specs, _| {
            specs
                .v2
                .iter()
                .all(|p| matches!(p.kind, Kind::Counter { .. }))
        },
    },
];

/// Cases drawn for each goal the random cases missed, at most this many.
const TOP_UP: u32 = 8;

/// Draws cases likely to reach each goal the run has not reached, one at a
/// time, until it is reached (or `TOP_UP` cases did not reach it: the
/// assertion after the run says which).
fn top_up(config: &Config) -> Result<(), String> {
    for goal in GOALS {
        let mut drawn = 0;
        while !(goal.reached)() && drawn < TOP_UP {
            drawn += 1;
            eprintln!(
                "generated specs: no case {} yet: drawing one likely to ({drawn} of at most {TOP_UP})",
                goal.what
            );
            let likely = goal.likely;
            let mut runner = TestRunner::new(Config {
                cases: 1,
                ..config.clone()
            });
            runner
                .run(
                    &(specs(), plan())
                        .prop_filter(goal.what, move |(specs, plan)| likely(specs, plan)),
                    |(specs, plan)| runtime().block_on(case(&specs, &plan)),
                )
                .map_err(|error| error.to_string())?;
        }
    }
    Ok(())
}

/// An audit as the Lambda runs it: two segments, each in slices of one
/// page of 5 items checkpointed in the table under `run`, then merged
/// from what the table holds.
async fn sliced_audit(
    applier: &Applier,
    run: &str,
    repair: bool,
) -> Result<ddb_projector::audit::AuditReport, TestCaseError> {
    use ddb_projector::audit::passes::{count_slice, merge_step, Step};
    use ddb_projector::audit::CheckpointStore;
    const TOTAL: u32 = 2;
    let fail = |what: &str, error: ddb_projector::apply::ApplyError| {
        TestCaseError::fail(format!("sliced audit {run}: {what}: {error}"))
    };
    for segment in 0..TOTAL {
        let options = AuditOptions {
            segments: TOTAL,
            segment: Some(segment),
            repair,
            progress: false,
            page_size: Some(5),
            checkpoint: Some(CheckpointStore::Table {
                run: run.to_string(),
            }),
            max_pages: Some(1),
            ..AuditOptions::default()
        };
        let mut slices = 0;
        while !audit(applier, &options)
            .await
            .map_err(|e| fail("a slice", e))?
            .complete
        {
            slices += 1;
            prop_assert!(slices < 10_000, "segment {} never ends", segment);
        }
    }
    // The merge as the state machine runs it: each counting pass it asks
    // for, over every segment in slices of one page, then merge again.
    for merges in 1.. {
        prop_assert!(merges <= 4, "run {} merged {} times", run, merges);
        match merge_step(applier, run, TOTAL, repair)
            .await
            .map_err(|e| fail("merge", e))?
        {
            Step::Merged(report, _) => return Ok(*report),
            Step::Incomplete(why) => return Err(TestCaseError::fail(why)),
            Step::Pass { pass, purpose } => {
                match purpose {
                    "locate" => count(&COVERAGE.locate_passes, 1),
                    _ => count(&COVERAGE.recount_passes, 1),
                }
                for segment in 0..TOTAL {
                    let options = AuditOptions {
                        segments: TOTAL,
                        page_size: Some(5),
                        max_pages: Some(1),
                        ..AuditOptions::default()
                    };
                    for slices in 1.. {
                        prop_assert!(slices < 10_000, "pass {} never ends", pass);
                        let counted = count_slice(applier, run, pass, segment, &options)
                            .await
                            .map_err(|e| fail("a counting slice", e))?;
                        if counted.done {
                            break;
                        }
                    }
                }
            }
        }
    }
    unreachable!("the loop returns")
}

/// The case a full run drew on 2026-11-29 (at `14de43c`), and CI drew
/// again, whose audit found counter `ct0` one short before v2's backfill:
/// `CounterOff { expected: 3, actual: 2 }` on `COUNTER#ct0#v1`. Timing
/// decides it: it failed about 1 run in 20 under CPU load. The cause: the
/// second half of a bisected batch failed at its first record (its lease
/// renewal met an injected transaction conflict), and the restart pointer
/// written at the half's own key replaced its root; the retry applied the
/// item's last record as it was, while the first half had skipped the
/// record that counts it. `applier::a_piece_failing_at_its_first_record_
/// keeps_what_earlier_deliveries_held` now shows it every run; this case
/// stays, to be run in a loop under load.
#[test]
#[ignore = "timing decides it: run it in a loop under CPU load"]
fn the_case_that_lost_a_count_of_ct0() {
    use super::delivery::Mishap;
    let (specs, plan) = (
        Specs {
            v1: vec![
                Projection {
                    id: 0,
                    kind: Kind::Counter {
                        source: Source::Attr,
                        by_b: true,
                        when: When::Always,
                        shards: 1,
                    },
                },
                Projection {
                    id: 1,
                    kind: Kind::Counter {
                        source: Source::Attr,
                        by_b: true,
                        when: When::Flag,
                        shards: 2,
                    },
                },
                Projection {
                    id: 2,
                    kind: Kind::Denormalize {
                        when: When::Flag,
                        variant: 0,
                    },
                },
                Projection {
                    id: 3,
                    kind: Kind::Counter {
                        source: Source::Attr,
                        by_b: false,
                        when: When::KindP,
                        shards: 3,
                    },
                },
            ],
            v2: vec![
                Projection {
                    id: 0,
                    kind: Kind::Counter {
                        source: Source::Attr,
                        by_b: true,
                        when: When::Always,
                        shards: 1,
                    },
                },
                Projection {
                    id: 2,
                    kind: Kind::Denormalize {
                        when: When::KindP,
                        variant: 1,
                    },
                },
                Projection {
                    id: 3,
                    kind: Kind::Counter {
                        source: Source::Attr,
                        by_b: true,
                        when: When::Always,
                        shards: 3,
                    },
                },
                Projection {
                    id: 10,
                    kind: Kind::Edge {
                        source: Source::Attr,
                        rev: true,
                        when: When::KindP,
                        variant: 2,
                    },
                },
            ],
        },
        Plan {
            phase1: vec![
                Write::Delete {
                    entity: Entity::Link,
                    a: 1,
                    b: 0,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 2,
                    b: 0,
                    x: 2,
                    n: None,
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Tally,
                    a: 1,
                    b: 1,
                    x: 1,
                    n: Some(0),
                    f: Some(true),
                    p: false,
                },
                Write::Delete {
                    entity: Entity::Attr,
                    a: 1,
                    b: 2,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 0,
                    b: 0,
                    x: 0,
                    n: Some(0),
                    f: Some(false),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 1,
                    b: 0,
                    x: 0,
                    n: None,
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 2,
                    b: 0,
                    x: 0,
                    n: None,
                    f: None,
                    p: true,
                },
            ],
            phase2: vec![
                Write::Delete {
                    entity: Entity::Node,
                    a: 0,
                    b: 1,
                },
                Write::Delete {
                    entity: Entity::Link,
                    a: 1,
                    b: 2,
                },
                Write::Delete {
                    entity: Entity::Node,
                    a: 2,
                    b: 1,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 1,
                    b: 0,
                    x: 3,
                    n: None,
                    f: None,
                    p: true,
                },
                Write::Delete {
                    entity: Entity::Link,
                    a: 0,
                    b: 2,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 2,
                    b: 2,
                    x: 2,
                    n: Some(2),
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Group,
                    a: 2,
                    b: 0,
                    x: 0,
                    n: Some(2),
                    f: Some(false),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Tally,
                    a: 1,
                    b: 2,
                    x: 1,
                    n: None,
                    f: None,
                    p: false,
                },
                Write::Delete {
                    entity: Entity::Attr,
                    a: 1,
                    b: 1,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 2,
                    b: 0,
                    x: 1,
                    n: None,
                    f: Some(false),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 2,
                    b: 1,
                    x: 3,
                    n: None,
                    f: None,
                    p: true,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 2,
                    b: 2,
                    x: 2,
                    n: None,
                    f: None,
                    p: true,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 1,
                    b: 0,
                    x: 0,
                    n: None,
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 0,
                    b: 1,
                    x: 0,
                    n: Some(2),
                    f: Some(true),
                    p: true,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 1,
                    b: 2,
                    x: 2,
                    n: None,
                    f: Some(true),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Tally,
                    a: 2,
                    b: 0,
                    x: 1,
                    n: Some(0),
                    f: Some(false),
                    p: true,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 0,
                    b: 0,
                    x: 0,
                    n: Some(1),
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 1,
                    b: 1,
                    x: 1,
                    n: Some(1),
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Group,
                    a: 1,
                    b: 1,
                    x: 1,
                    n: None,
                    f: Some(false),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 0,
                    b: 2,
                    x: 0,
                    n: Some(0),
                    f: Some(false),
                    p: true,
                },
                Write::Put {
                    entity: Entity::Link,
                    a: 1,
                    b: 0,
                    x: 1,
                    n: None,
                    f: None,
                    p: true,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 0,
                    b: 1,
                    x: 1,
                    n: None,
                    f: Some(true),
                    p: true,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 2,
                    b: 1,
                    x: 2,
                    n: None,
                    f: None,
                    p: true,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 1,
                    b: 0,
                    x: 1,
                    n: Some(1),
                    f: None,
                    p: false,
                },
                Write::Put {
                    entity: Entity::Attr,
                    a: 1,
                    b: 1,
                    x: 0,
                    n: None,
                    f: Some(true),
                    p: true,
                },
                Write::Put {
                    entity: Entity::Node,
                    a: 2,
                    b: 0,
                    x: 2,
                    n: Some(1),
                    f: Some(true),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Tally,
                    a: 2,
                    b: 0,
                    x: 2,
                    n: Some(0),
                    f: Some(true),
                    p: false,
                },
                Write::Put {
                    entity: Entity::Tally,
                    a: 1,
                    b: 2,
                    x: 0,
                    n: Some(0),
                    f: Some(false),
                    p: true,
                },
            ],
            delivery1: Delivery {
                shuffle: vec![
                    1097654374, 710238051, 4157602700, 2228121215, 3257984523, 3943866134,
                    1688037587, 2955016251, 4065851607, 3309472489, 3126804391,
                ],
                sizes: vec![8, 16, 13],
                mishaps: vec![Mishap::CrashThenBisect { percent: 80 }],
                live: None,
                kinesis: true,
            },
            delivery2: Delivery {
                shuffle: vec![
                    118559245, 2253436000, 1870160752, 3120798919, 512330610, 2852275080,
                    2870679622, 2801943586, 2923149911, 1760658054, 629378202, 4201793665,
                    4013332910, 1574850184, 4235945443, 2116310848, 2375282578, 4178085924,
                    3641143204, 2724076194, 1191335842, 827911174, 2766383383, 3274211705,
                    3283860050, 390274166, 2673607272, 1751674088, 4049694353, 3900455633,
                    3699341890, 4236103145, 3471219850, 443716923, 3611519338, 3006062712,
                    494166678, 1194907437, 4177777546, 2702661085, 2866844100,
                ],
                sizes: vec![26, 9],
                mishaps: vec![
                    Mishap::CrashThenBisect { percent: 23 },
                    Mishap::None,
                    Mishap::Redeliver { back: 23 },
                    Mishap::None,
                ],
                live: Some(17),
                kinesis: false,
            },
            backfill_pages: 3,
            extra_backfill: vec![64],
            replay: None,
            redrive_first: None,
            faults: 25,
        },
    );
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            runtime()
                .block_on(case(&specs, &plan))
                .map_err(|e| e.to_string())
        })
        .expect("a thread")
        .join()
        .expect("the case thread")
        .unwrap();
}
