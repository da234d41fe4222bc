//! The effect vocabulary: what planning says must happen to the table,
//! shared by the kinds that plan, the planner's driver and the applier.
//!
//! Effects are *states*, not deltas, wherever exactness depends on it: an
//! index key is "this attribute equals this value while the source still
//! reads so", a denormalized target is "recompute from a consistent read", a
//! reverse edge or counter membership is "this marker is present/absent"
//! and counters move only when the applier sees the marker actually change.
//! That is what makes applying any effect twice harmless.

use crate::record::{AttributeValue, ChangeRecord, Image, Item, ItemKey, ViewType};
use crate::schema::{Bindings, ProjectionId, RenderError};

/// A write a custom projection asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum CustomOp {
    /// Put the whole item (key attributes included).
    Put(Item),
    /// Delete the item with this key.
    Delete(ItemKey),
}

/// Where a denormalized target's source items are read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceQuery {
    /// The source items' partition key.
    pub pk: String,
    /// The literal sort key prefix of the source entity.
    pub sk_prefix: Option<String>,
}

/// What a recompute reads besides its target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sources {
    /// The source items one query finds (`denormalize`, `aggregate`).
    Query(SourceQuery),
    /// These items, read consistently (a counter's shards, for `rollup`).
    Items(Vec<ItemKey>),
    /// The shards of counter `counter`'s instance `values` in the version
    /// readers read, which the lifecycle registry names at apply time (a
    /// rollup's while its counter is rebuilt beside that version).
    Counter {
        /// The counter projection.
        counter: ProjectionId,
        /// Its `of` values.
        values: Vec<String>,
    },
}

/// The state a membership marker (reverse edge or counter marker) must reach.
#[derive(Debug, Clone, PartialEq)]
pub enum MarkerState {
    /// The marker exists with exactly these attributes (its key and copied
    /// attributes; the applier adds the counter records).
    Present(Item),
    /// The marker does not exist.
    Absent,
}

impl MarkerState {
    /// Whether the marker exists in this state.
    pub fn is_present(&self) -> bool {
        matches!(self, MarkerState::Present(_))
    }
}

/// For a write planned from a snapshot (a backfill's scan, an audit): the
/// state of the source item the plan was computed from, checked in the
/// same transaction as the write, so that a stale snapshot never undoes a
/// newer live change.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceGuard {
    /// The source item.
    pub source: ItemKey,
    /// `None`: the source did not exist. Otherwise every attribute the plan
    /// read and the value it saw (`None`: absent).
    pub seen: Option<Vec<(String, Option<AttributeValue>)>>,
}

impl SourceGuard {
    /// Whether `item` (the source as read now, `None`: absent) is still in
    /// the state the plan saw.
    pub fn holds(&self, item: Option<&Item>) -> bool {
        match (&self.seen, item) {
            (None, None) => true,
            (Some(seen), Some(item)) => {
                seen.iter()
                    .all(|(name, value)| match (item.get(name), value) {
                        (None, None) => true,
                        (Some(have), Some(want)) => crate::schema::values_equal(have, want),
                        _ => false,
                    })
            }
            _ => false,
        }
    }
}

/// A counter shard that moves when a marker changes: +1 when it appears, -1
/// when it goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterShard {
    /// The counter projection.
    pub counter: ProjectionId,
    /// The shard item.
    pub key: ItemKey,
}

/// One planned write (or read-then-write).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Set derived attributes on the source item itself, only while the
    /// item still holds `expect` (a later record carries newer values).
    SetAttributes {
        /// The source item.
        key: ItemKey,
        /// Derived attribute values.
        set: Vec<(String, AttributeValue)>,
        /// Attribute values the derivation read.
        expect: Vec<(String, AttributeValue)>,
    },
    /// Recompute a target (denormalized, a rollup, an aggregate) from a
    /// consistent read of what it is computed from.
    Recompute {
        /// The target item.
        target: ItemKey,
        /// What it is computed from.
        sources: Sources,
    },
    /// Bring a marker item (a reverse edge, or a counter's own marker) and
    /// the counter records it carries to a state; counter shards move by
    /// the records that actually appear, move or go.
    Membership {
        /// The marker item.
        marker: ItemKey,
        /// Present with attributes, or absent.
        state: MarkerState,
        /// Every counter that records its membership on this marker, and
        /// the shard the source counts in (recorded while present).
        counters: Vec<CounterShard>,
        /// A guess of the marker's state before the change (from the old
        /// image), which picks the first write to try; the condition on the
        /// write decides.
        was_present: bool,
        /// Set when planned from a snapshot: the source state to check.
        guard: Option<SourceGuard>,
    },
    /// Remove a counter's record from an item that no longer carries that
    /// counter's membership (planned by a scan), moving its shard by -1.
    DropRecord {
        /// The item carrying the record.
        item: ItemKey,
        /// The counter.
        counter: ProjectionId,
        /// The shard partition key the record holds.
        shard: String,
    },
    /// A custom projection's write; with a guard, only while the source
    /// is in the state the plan saw (a current state, or a record that may
    /// have been applied before with newer ones).
    Custom {
        /// The put or delete.
        op: CustomOp,
        /// The source state to check in the same transaction.
        guard: Option<SourceGuard>,
    },
}

/// A planned effect: which projection wants which operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The projection that planned it.
    pub projection: ProjectionId,
    /// The operation.
    pub op: Op,
}

/// Why a projection could not plan a record. The record is dead-lettered
/// for that projection: retrying cannot help until the data or spec changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanProblem {
    /// A template could not be rendered from the item.
    #[error("{0}")]
    Render(#[from] RenderError),
    /// The stream does not carry an image the projection needs.
    #[error("the record has no {needed} image (stream view type {view}); this projection needs NEW_AND_OLD_IMAGES or NEW_IMAGE")]
    MissingImage {
        /// `new` or `old`.
        needed: &'static str,
        /// The view type, if known.
        view: String,
    },
    /// A key attribute is missing or not a string: usually an event from
    /// another table.
    #[error("{}", bad_key_message(.name, .found, .spec_table, .source_table.as_deref()))]
    BadKey {
        /// The key attribute the spec's table has.
        name: String,
        /// The key attributes the record has, with their types (`Id (N)`).
        found: Vec<String>,
        /// The spec's table and its keys (`UserServiceTable (PK, SK)`).
        spec_table: String,
        /// The table the record's `eventSourceARN` names, when it has one.
        source_table: Option<String>,
    },
    /// A custom projection refused the record.
    #[error("{0}")]
    Custom(String),
}

fn bad_key_message(
    name: &str,
    found: &[String],
    spec_table: &str,
    source_table: Option<&str>,
) -> String {
    let found = if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    };
    let mut message = format!(
        "key attribute `{name}` is missing or not a string: the record's keys are {found}, the spec's table is {spec_table}"
    );
    if let Some(source) = source_table {
        let spec_name = spec_table.split(' ').next().unwrap_or(spec_table);
        if source != spec_name {
            message.push_str(&format!(
                "; the record comes from table {source} (its eventSourceARN): an event of another table, or a spec of another service?"
            ));
        }
    }
    message
}

/// The source item's key, bound variables and images, shared by the kinds.
pub(crate) struct Subject<'r> {
    pub record: &'r ChangeRecord,
    pub key: ItemKey,
    pub vars: Bindings<'r>,
    /// Whether what the record's images say may be written only while the
    /// item is still in the state the record shows: a scanned or current
    /// state, or a stream record that may be delivered after newer ones
    /// of its item were applied ([`crate::plan::plan_guarded`]).
    pub guarded: bool,
    /// Whether the record stands for its item as a whole (a scanned or
    /// current state, or the last record of an item a re-delivery plans
    /// as its item): every projection plans the state its image derives,
    /// not the change from its old image ([`crate::plan::plan_complete`]).
    pub complete: bool,
}

impl Subject<'_> {
    pub(crate) fn new_image(&self, view: Option<ViewType>) -> Result<&Image, PlanProblem> {
        self.record
            .new_image
            .as_ref()
            .ok_or_else(|| PlanProblem::MissingImage {
                needed: "new",
                view: view.map_or("unknown", ViewType::as_str).to_string(),
            })
    }
}

/// Whether any of `names` differs between the old and new image (true when
/// an image is missing: then the change must be assumed relevant).
pub(crate) fn changed<'a>(
    record: &ChangeRecord,
    names: impl IntoIterator<Item = &'a String>,
) -> bool {
    match (&record.old_image, &record.new_image) {
        (Some(old), Some(new)) => names.into_iter().any(|name| old.get(name) != new.get(name)),
        _ => true,
    }
}
