//! One scanned page, checked with the reads its items need: what the
//! audit holds is the page and what it read for it, never the table.
//!
//! - `index-keys`: on the item itself;
//! - memberships (reverse edges, counter markers and records): each item
//!   planned as a backfill plans it; the markers and guarded sources the
//!   plan names are read (`BatchGetItem`, consistent);
//! - recomputed targets: the recompute's own sources, read now;
//! - partition invariants: the partition, queried consistently, checked
//!   from the page holding its first item of the entity;
//! - `unique`: the value's holders (the index, confirmed by consistent
//!   reads), checked from the page holding the first of them, and from
//!   the page of any holder out of the index (merged by the audit);
//! - counters: facts added to the segment's sketch (see
//!   [`super::sketch`]).

use std::collections::{HashMap, HashSet};

use futures::stream::{self, StreamExt, TryStreamExt};

use super::derive::{check_marker, marker_reads, memberships, on_items, recomputes, target};
use super::scan::{classify, Scanned};
use super::sketch::Sketch;
use super::Finding;
use crate::apply::{Applier, ApplyError};
use crate::dynamo::retry::WriteError;
use crate::invariant::{check_partition, check_unique, unique_value, Violation};
use crate::plan::Op;
use crate::record::{Item, ItemKey};

/// What a page found.
#[derive(Default)]
pub(super) struct Found {
    pub findings: Vec<Finding>,
    /// Violations, by invariant, for the violation store.
    pub violations: Vec<(usize, Violation)>,
    /// Read units of the page's own reads (the scan's are counted apart).
    pub read_units: f64,
}

/// Checks one page (see the module docs).
pub(super) async fn check(
    applier: &Applier,
    items: Vec<Item>,
    sketch: &mut Sketch,
    judged: &super::Judged,
) -> Result<Found, ApplyError> {
    let spec = applier.spec();
    let fatal = |error: WriteError| ApplyError::Fatal {
        table: applier.table().to_string(),
        message: format!("an audit read failed: {error}"),
    };
    let mut entities: Vec<(usize, ItemKey, Item)> = Vec::new();
    let mut markers: Vec<(ItemKey, Item)> = Vec::new();
    for item in items {
        match classify(spec, item, &mut |fact| fact.add_to(sketch)) {
            Scanned::Entity(entity, key, item) => entities.push((entity, key, item)),
            Scanned::Marker(key, item) => markers.push((key, item)),
            Scanned::Other => {}
        }
    }
    let mut found = Found::default();
    on_items(spec, &entities, &mut found.findings);

    let reader = applier.reader();
    let concurrency = applier.config().concurrency.max(1);
    let scanned = || {
        entities
            .iter()
            .map(|(_, key, item)| (key, item))
            .chain(markers.iter().map(|(key, item)| (key, item)))
    };

    // Memberships: the markers and sources the plans name, read at once.
    let effects = memberships(spec, scanned(), &mut found.findings);
    let mut by_key: HashMap<&ItemKey, &Item> = scanned().collect();
    let wanted: Vec<ItemKey> = effects
        .iter()
        .flat_map(|effect| marker_reads(spec, effect))
        .filter(|key| !by_key.contains_key(key))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();

    // Recomputed targets: each read its sources.
    let targets: Vec<(usize, &ItemKey, &Item, crate::plan::Sources)> = entities
        .iter()
        .flat_map(|(entity, key, item)| {
            (0..spec.projections.len())
                .filter(|&id| recomputes(spec, id, *entity))
                .filter_map(move |id| match crate::kinds::recompute_op(spec, id, key) {
                    Some(Op::Recompute { sources, .. }) => Some((id, key, item, sources)),
                    _ => None,
                })
        })
        .collect();
    let recomputed = stream::iter(targets)
        .map(|(id, key, item, sources)| {
            let reader = &reader;
            async move {
                let read = reader.recompute_sources(id, key, &sources).await?;
                Ok::<_, WriteError>(target(spec, id, key, item, &read))
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<Option<Finding>>>();

    // Partition invariants: each partition once, from the page with its
    // first item of the entity.
    let partitions: HashSet<(usize, &str)> = entities
        .iter()
        .filter(|(entity, _, _)| {
            spec.invariants
                .iter()
                .any(|i| i.entity == *entity && i.is_partition_scoped())
        })
        .map(|(entity, key, _)| (*entity, key.pk.as_str()))
        .collect();
    let page_keys: HashSet<&ItemKey> = entities.iter().map(|(_, key, _)| key).collect();
    let partitioned = stream::iter(partitions)
        .map(|(entity, pk)| {
            let (reader, page_keys) = (&reader, &page_keys);
            async move {
                let items = reader.partition(entity, pk).await?;
                let first = items
                    .iter()
                    .filter_map(|item| spec.table.item_key(item))
                    .filter(|key| {
                        spec.match_entity(&key.pk, key.sk.as_deref(), &mut Vec::new())
                            == Some(entity)
                    })
                    .min();
                let mut out = Vec::new();
                if first.is_some_and(|first| page_keys.contains(&first)) {
                    for (id, invariant) in spec.invariants.iter().enumerate() {
                        if invariant.entity == entity && invariant.is_partition_scoped() {
                            out.extend(
                                check_partition(spec, invariant, pk, &items)
                                    .into_iter()
                                    .map(|v| (id, v)),
                            );
                        }
                    }
                }
                Ok::<_, WriteError>(out)
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<Vec<(usize, Violation)>>>();

    // `unique`: each value once, from the page with its first holder.
    let values: Vec<(usize, String, &ItemKey)> = entities
        .iter()
        .flat_map(|(entity, key, item)| {
            spec.invariants
                .iter()
                .enumerate()
                .filter(move |(_, i)| i.entity == *entity && !i.is_partition_scoped())
                .filter_map(move |(id, i)| unique_value(spec, i, item).map(|v| (id, v, key)))
        })
        .collect();
    let unique = stream::iter(values)
        .map(|(id, value, key)| {
            let reader = &reader;
            async move {
                // Reported from its first holder, which every holder's
                // page sees through the index; and from a holder the
                // index lost (its key drifted), which no other page sees.
                // The audit merges what several holders report.
                let (holders, indexed) = reader.unique_holders(id, &value, Some(key)).await?;
                let violation = (holders.first() == Some(key) || !indexed)
                    .then(|| check_unique(&spec.invariants[id], &value, &holders))
                    .flatten();
                Ok::<_, WriteError>(violation.map(|v| (id, v)))
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<Option<(usize, Violation)>>>();

    let (read, recomputed, partitioned, unique) = tokio::join!(
        reader.items(wanted.iter().collect()),
        recomputed,
        partitioned,
        unique
    );
    let read = read.map_err(fatal)?;
    by_key.extend(read.iter());
    for effect in effects {
        check_marker(spec, &by_key, effect, &mut found.findings);
    }
    found
        .findings
        .extend(recomputed.map_err(fatal)?.into_iter().flatten());
    found
        .violations
        .extend(partitioned.map_err(fatal)?.into_iter().flatten());
    found
        .violations
        .extend(unique.map_err(fatal)?.into_iter().flatten());
    found.read_units = reader.read_units();
    judged.retain(&mut found.findings);
    Ok(found)
}
