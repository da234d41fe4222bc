//! `counter`: a write-sharded count of the source items per instance of
//! its `of` variables, each counted item's membership recorded on a
//! marker item (the reverse edge of an inverse edge over the same source
//! and condition, or a marker of its own), and the names of a counter's
//! generations while a changed counter is rebuilt beside the one readers
//! read.

use super::{ProjectionKind, Rules};
use crate::dynamo::names::COUNTER_MARKER_PREFIX;
use crate::record::ItemKey;
use crate::schema::{Condition, EntityId, ProjectionId, Template};

/// The largest shard count a counter may declare.
pub const MAX_SHARDS: u32 = 100;

/// Where generation `generation` of counter `name` keeps its shards,
/// own markers and records: `name` (generation 0), then `name~1`,
/// `name~2`... A changed counter is built in the generation after the
/// one readers read, so a generation is never written again once readers
/// left it: what prunes it never races what builds the next one.
pub fn counter_storage(name: &str, generation: u32) -> String {
    if generation == 0 {
        name.to_string()
    } else {
        format!("{name}~{generation}")
    }
}

/// The name of counter `name`'s old version of generation `generation`,
/// which the worker keeps current while the changed counter is rebuilt
/// beside it (`followers~0`); user names cannot contain `~`.
pub fn old_version_name(name: &str, generation: u32) -> String {
    format!("{name}~{generation}")
}

/// The counter and generation an old version's name stands for
/// (`followers~0`: `followers`, 0).
pub fn old_version_of(name: &str) -> Option<(&str, u32)> {
    let (base, generation) = name.rsplit_once('~')?;
    (!base.is_empty() && !base.contains('~') && generation.bytes().all(|b| b.is_ascii_digit()))
        .then(|| generation.parse().ok().map(|g| (base, g)))
        .flatten()
}

/// The generation a counter's storage name is (`followers~2`: 2), given
/// its projection name: a counter's any generation, an old version's only
/// its own.
pub fn storage_generation(name: &str, storage: &str) -> Option<u32> {
    if let Some((base, generation)) = old_version_of(name) {
        return (storage == counter_storage(base, generation)).then_some(generation);
    }
    if storage == name {
        return Some(0);
    }
    let generation = storage.strip_prefix(name)?.strip_prefix('~')?;
    if generation.starts_with('0') || !generation.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    generation.parse().ok()
}

/// How a counter knows whether a source item is already counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The reverse edge of this inverse-edge projection marks membership.
    Edge(ProjectionId),
    /// A marker item of its own under the reserved prefix.
    Own,
}

/// A write-sharded count of source items.
#[derive(Debug, Clone)]
pub struct Counter {
    /// Counted entity.
    pub source: EntityId,
    /// Counter variable to template over the source's key variables.
    pub of: Vec<(String, Template)>,
    /// Which source items count.
    pub when: Condition,
    /// Number of shards.
    pub shards: u32,
    /// How membership is recorded.
    pub marker: Marker,
    /// The name its shard keys, own markers and records carry: the
    /// projection's name, or `<name>~N` once a changed definition was
    /// rebuilt beside the one readers read ([`counter_storage`]).
    pub storage: String,
}

/// What the rules answer about counters: their shard and marker keys,
/// the versions of a counter rebuilt beside the one readers read.
impl Rules {
    /// The key of a counter shard item.
    pub fn counter_shard_key(&self, counter: &str, of_values: &[String], shard: u32) -> ItemKey {
        let mut pk = String::with_capacity(32);
        pk.push_str("COUNTER#");
        pk.push_str(counter);
        for value in of_values {
            pk.push('#');
            pk.push_str(value);
        }
        pk.push('#');
        pk.push_str(&shard.to_string());
        ItemKey {
            pk,
            sk: self.table.sort_key.as_ref().map(|_| "COUNTER".to_string()),
        }
    }

    /// The key of a counter's own membership marker for a source item.
    pub fn counter_marker_key(&self, counter: &str, source: &ItemKey) -> ItemKey {
        ItemKey {
            pk: format!("{COUNTER_MARKER_PREFIX}{counter}#{}", source.pk),
            sk: source.sk.clone(),
        }
    }

    /// The counter whose own marker `key` is, and the source item it marks
    /// (a source key of the counter's entity).
    pub fn parse_counter_marker(&self, key: &ItemKey) -> Option<(ProjectionId, ItemKey)> {
        let rest = key.pk.strip_prefix(COUNTER_MARKER_PREFIX)?;
        self.projections
            .iter()
            .enumerate()
            .find_map(|(id, projection)| {
                let ProjectionKind::Counter(counter) = &projection.kind else {
                    return None;
                };
                let source_pk = rest
                    .strip_prefix(counter.storage.as_str())?
                    .strip_prefix('#')?;
                let mut vars = Vec::new();
                let entity = self.match_entity(source_pk, key.sk.as_deref(), &mut vars)?;
                (entity == counter.source).then(|| {
                    (
                        id,
                        ItemKey {
                            pk: source_pk.to_string(),
                            sk: key.sk.clone(),
                        },
                    )
                })
            })
    }

    /// Whether projection `id` is a counter's old version, which the worker
    /// keeps current while the changed counter is rebuilt: never claimed,
    /// backfilled or replayed on its own.
    pub fn is_old_version(&self, id: ProjectionId) -> bool {
        matches!(self.projections[id].kind, ProjectionKind::Counter(_))
            && old_version_of(&self.projections[id].name).is_some()
    }

    /// Whether counter `id` is rebuilt in this layout: readers read another
    /// version (kept current beside it, or frozen) until its backfill
    /// completes.
    pub fn rebuilding(&self, id: ProjectionId) -> bool {
        let name = &self.projections[id].name;
        self.old_version(id).is_some()
            || self
                .frozen
                .iter()
                .any(|storage| storage_generation(name, storage).is_some())
    }

    /// The old version of counter `id` kept beside it, if any.
    pub fn old_version(&self, id: ProjectionId) -> Option<ProjectionId> {
        let name = &self.projections[id].name;
        self.projections.iter().position(|p| {
            matches!(p.kind, ProjectionKind::Counter(_))
                && old_version_of(&p.name).is_some_and(|(base, _)| base == name)
        })
    }

    /// The counter whose records and shards carry `storage`.
    pub fn counter_by_storage(&self, storage: &str) -> Option<ProjectionId> {
        self.projections
            .iter()
            .position(|p| matches!(&p.kind, ProjectionKind::Counter(c) if c.storage == storage))
    }

    /// The counter projection named `name`, if the spec has one.
    pub fn counter_id(&self, name: &str) -> Option<ProjectionId> {
        self.projection_id(name)
            .filter(|&id| matches!(self.projections[id].kind, ProjectionKind::Counter(_)))
    }

    /// The item that records whether `source` (an item of the counter's
    /// entity, its key variables bound in `vars`) is counted in `counter`:
    /// the reverse edge the counter rides on, or its own marker.
    pub fn placement(
        &self,
        counter: ProjectionId,
        source: &ItemKey,
        vars: &[(&str, &str)],
    ) -> ItemKey {
        let ProjectionKind::Counter(c) = &self.projections[counter].kind else {
            panic!("placement of a projection that is not a counter");
        };
        match c.marker {
            Marker::Edge(edge) => {
                let ProjectionKind::InverseEdge(e) = &self.projections[edge].kind else {
                    unreachable!("counters ride on inverse edges only");
                };
                self.entities[e.target]
                    .render_key(vars)
                    .expect("inverse-edge variables are checked when the spec is compiled")
            }
            Marker::Own => self.counter_marker_key(&c.storage, source),
        }
    }

    /// The key of a counter shard item from its partition key.
    pub fn shard_item(&self, shard_pk: &str) -> ItemKey {
        ItemKey {
            pk: shard_pk.to_string(),
            sk: self.table.sort_key.as_ref().map(|_| "COUNTER".to_string()),
        }
    }
}
