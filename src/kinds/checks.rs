//! The compile checks across projections, once each compiled alone:
//! which edge a counter rides on (and the TTL attribute its reverse items
//! must never get), the fingerprints that cover more than a projection's
//! own text, loops through projections, attributes two projections write,
//! and derived items that could be read as entities.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::counter::Marker;
use super::index_keys::IndexKeys;
use super::{settle, Projection, ProjectionKind, Writes};
use crate::schema::{
    fingerprint, Compiler, Condition, Entity, EntityId, KeyPattern, ProjectionId, TableSpec,
};

/// Runs every check across `projections`, problems to `cx`, and settles
/// their fingerprints.
pub(crate) fn check(
    cx: &mut Compiler,
    projections: &mut [Projection],
    entities: &[Entity],
    table: &TableSpec,
) {
    assign_markers(cx, projections, table);
    set_fingerprints(projections, entities, table);
    settle(projections);
    check_loops(cx, projections, entities);
    check_attributes(cx, projections, entities);
    check_derived_items(cx, projections, entities, table);
}

/// Each projection's fingerprint covers more than its own text: the key
/// patterns of the entities it reads and writes, the table's key names,
/// and, for a counter, the edge its records ride on (or none). Changing any
/// of these changes what the projection derives.
fn set_fingerprints(projections: &mut [Projection], entities: &[Entity], table: &TableSpec) {
    let pattern = |id: EntityId| {
        let entity = &entities[id];
        format!(
            "{}={}/{}",
            entity.name,
            entity.pk,
            entity.sk.as_ref().map(|sk| sk.as_str()).unwrap_or("")
        )
    };
    let extras: Vec<String> = projections
        .iter()
        .map(|projection| {
            let mut parts = vec![format!(
                "keys={}/{}",
                table.partition_key,
                table.sort_key.as_deref().unwrap_or("")
            )];
            parts.extend(
                projection
                    .kind
                    .dispatch()
                    .fingerprint_parts(projections, &pattern),
            );
            parts.join(";")
        })
        .collect();
    for (projection, extra) in projections.iter_mut().zip(extras) {
        projection.fingerprint = fingerprint(&format!("{:016x};{extra}", projection.fingerprint));
    }
}

/// A counter whose source has an inverse edge with the same condition
/// uses that edge as its membership marker (one write less per change).
fn assign_markers(cx: &mut Compiler, projections: &mut [Projection], table: &TableSpec) {
    let edges: Vec<(ProjectionId, String, EntityId, Condition)> = projections
        .iter()
        .enumerate()
        .filter_map(|(id, p)| match &p.kind {
            ProjectionKind::InverseEdge(edge) => {
                Some((id, p.name.clone(), edge.source, edge.when.clone()))
            }
            _ => None,
        })
        .collect();
    // A counter rides on an edge of its own service only: another
    // team's spec joining the table must not move its records (nor
    // change its definition), and that team may retire the edge.
    let service = |name: &str| cx.service(name).map(str::to_string);
    for projection in projections.iter_mut() {
        let own = service(&projection.name);
        if let ProjectionKind::Counter(counter) = &mut projection.kind {
            // Of several edges that would do, the one first by name:
            // the order of the file must not move a counter's records.
            if let Some((id, ..)) = edges
                .iter()
                .filter(|(_, name, source, when)| {
                    *source == counter.source && *when == counter.when && service(name) == own
                })
                .min_by(|a, b| a.1.cmp(&b.1))
            {
                counter.marker = Marker::Edge(*id);
            }
        }
    }
    // TTL deletes an item without the projector: reverse items that
    // carry counter records must never expire, whichever projection
    // would write the TTL attribute onto them.
    if let Some(ttl) = &table.ttl_attribute {
        for (id, projection) in projections.iter().enumerate() {
            let ProjectionKind::InverseEdge(edge) = &projection.kind else {
                continue;
            };
            let counted: Vec<String> = projections
                .iter()
                .filter(|p| {
                    matches!(&p.kind, ProjectionKind::Counter(c) if c.marker == Marker::Edge(id))
                })
                .map(|p| format!("`{}`", p.name))
                .collect();
            if counted.is_empty() {
                continue;
            }
            for writer in projections.iter() {
                let Some((entity, written)) = sets(writer) else {
                    continue;
                };
                if entity != edge.target {
                    continue;
                }
                if written.iter().any(|attr| attr == ttl) {
                    cx.error(
                        format!("projection `{}`", writer.name),
                        format!(
                            "writes the table's TTL attribute `{ttl}` onto the reverse items of `{}`, which counter(s) {} record their membership on: TTL would delete them without moving the counters; do not write `{ttl}` there, or give the counters another `when`",
                            projection.name,
                            counted.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

/// The entity whose items `projection` sets attributes on, and those
/// attributes (what no other projection may write there): derived
/// attributes, or copies onto the reverse items it keeps.
fn sets(projection: &Projection) -> Option<(EntityId, Vec<String>)> {
    match projection.kind.dispatch().writes(&projection.name) {
        Writes::Attributes { entity, set, .. } => Some((entity, set)),
        Writes::Items { entity, copy } => Some((entity, copy)),
        Writes::Own | Writes::Anything => None,
    }
}

/// Rules out projections whose writes feed back into their own inputs.
fn check_loops(cx: &mut Compiler, projections: &[Projection], entities: &[Entity]) {
    // Edges source entity -> written entity, labelled by projection.
    let mut graph: HashMap<EntityId, Vec<(EntityId, &str)>> = HashMap::new();
    for projection in projections {
        if let Some((from, to)) = projection.kind.dispatch().carries(projections) {
            graph
                .entry(from)
                .or_default()
                .push((to, projection.name.as_str()));
        }
    }
    // Inverse edges and denormalized targets may themselves be sources
    // of other projections; a cycle through them never settles.
    let mut reported = HashSet::new();
    for (start, start_entity) in entities.iter().enumerate() {
        let mut stack = vec![(start, vec![])];
        let mut visited = HashSet::new();
        while let Some((node, path)) = stack.pop() {
            for (next, name) in graph.get(&node).into_iter().flatten() {
                let mut path: Vec<&str> = path.clone();
                path.push(name);
                if *next == start {
                    let mut key = path.clone();
                    key.sort();
                    if reported.insert(key) {
                        cx.error(
                            format!("projection `{}`", path[0]),
                            format!(
                                "projections {} form a loop through entity `{}`: each one's output is another's input, so writes would never stop",
                                path.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(" -> "),
                                start_entity.name
                            ),
                        );
                    }
                } else if visited.insert(*next) {
                    stack.push((*next, path));
                }
            }
        }
    }
}

/// Rules out projections that fight over one entity's attributes: two
/// writers of an attribute undo each other's writes, and index keys that
/// read each other's outputs rewrite each other, forever.
fn check_attributes(cx: &mut Compiler, projections: &[Projection], entities: &[Entity]) {
    // One inverse edge per target entity: a reverse item marks one
    // edge's membership; two edges would create and delete it in turn.
    let mut reverse: BTreeMap<EntityId, Vec<&str>> = BTreeMap::new();
    for projection in projections {
        if let Writes::Items { entity, .. } = projection.kind.dispatch().writes(&projection.name) {
            reverse
                .entry(entity)
                .or_default()
                .push(projection.name.as_str());
        }
    }
    for (entity, names) in &reverse {
        if let [first, rest @ ..] = names.as_slice() {
            for name in rest {
                cx.error(
                    format!("projection `{name}`"),
                    format!(
                        "projections `{first}` and `{name}` both keep the reverse items of entity `{}`: each would delete the other's; give each inverse edge a target entity of its own",
                        entities[*entity].name
                    ),
                );
            }
        }
    }
    let mut writers: BTreeMap<(EntityId, String), Vec<&str>> = BTreeMap::new();
    for projection in projections {
        let Some((entity, written)) = sets(projection) else {
            continue;
        };
        for attr in written {
            writers
                .entry((entity, attr))
                .or_default()
                .push(projection.name.as_str());
        }
    }
    for ((entity, attr), names) in &writers {
        if let [first @ .., last] = names.as_slice() {
            if first.is_empty() {
                continue;
            }
            let listed: Vec<String> = first.iter().map(|n| format!("`{n}`")).collect();
            cx.error(
                format!("projection `{last}`"),
                format!(
                    "projections {} and `{last}` {} write `{attr}` on entity `{}`: each would overwrite the other's value forever; let one projection own the attribute",
                    listed.join(", "),
                    if first.len() == 1 { "both" } else { "all" },
                    entities[*entity].name
                ),
            );
        }
    }
    // Index keys of one entity: `a -> b` when `a` writes what `b` reads.
    // A projection reading its own output is reported where it is compiled.
    let index_keys: Vec<(&str, &IndexKeys)> = projections
        .iter()
        .filter_map(|p| match &p.kind {
            ProjectionKind::IndexKeys(keys) => Some((p.name.as_str(), keys)),
            _ => None,
        })
        .collect();
    let feeds = |a: &IndexKeys, b: &IndexKeys| {
        a.entity == b.entity && a.set.iter().any(|(attr, _)| b.reads.contains(attr))
    };
    // Each projection on a loop reports the shortest loop through it,
    // found breadth first (once per set of projections). Enumerating
    // every path instead took factorial time when projections read each
    // other's outputs: nine such took 5 s to check, ten over 10 s (the
    // spec fuzz target's timeout), each one more multiplying it.
    let mut reported = HashSet::new();
    for (start, (_, first)) in index_keys.iter().enumerate() {
        let mut previous: Vec<Option<usize>> = vec![None; index_keys.len()];
        let mut queue = VecDeque::from([start]);
        let mut closing = None;
        'search: while let Some(node) = queue.pop_front() {
            for (next, (_, keys)) in index_keys.iter().enumerate() {
                if next == node || !feeds(index_keys[node].1, keys) {
                    continue;
                }
                if next == start {
                    closing = Some(node);
                    break 'search;
                }
                if previous[next].is_none() {
                    previous[next] = Some(node);
                    queue.push_back(next);
                }
            }
        }
        let Some(mut node) = closing else { continue };
        let mut path = vec![node];
        // Back to `start`, the one node reached without a predecessor.
        while let Some(before) = previous[node] {
            path.push(before);
            node = before;
        }
        path.reverse();
        let mut key = path.clone();
        key.sort_unstable();
        if reported.insert(key) {
            let names: Vec<String> = path
                .iter()
                .chain([&start])
                .map(|&i| format!("`{}`", index_keys[i].0))
                .collect();
            cx.error(
                format!("projection `{}`", index_keys[start].0),
                format!(
                    "projections {} form a loop on entity `{}`: each writes an attribute the next one reads, so writes would never stop",
                    names.join(" -> "),
                    entities[first.entity].name
                ),
            );
        }
    }
}

/// Counter shard items must never be mistaken for entities.
fn check_derived_items(
    cx: &mut Compiler,
    projections: &[Projection],
    entities: &[Entity],
    table: &TableSpec,
) {
    for projection in projections {
        if let ProjectionKind::Counter(counter) = &projection.kind {
            let mut pattern = format!(
                "COUNTER#{}#",
                projection.name.replace('{', "{{").replace('}', "}}")
            );
            for (name, _) in &counter.of {
                pattern.push_str(&format!("{{{name}}}#"));
            }
            pattern.push_str("{shard}");
            let Ok(pk) = KeyPattern::parse(&pattern) else {
                continue;
            };
            let sk = KeyPattern::parse("COUNTER").expect("literal");
            for entity in entities {
                let sk_overlap = match (&entity.sk, table.sort_key.is_some()) {
                    (Some(esk), true) => esk.could_overlap(&sk),
                    _ => true,
                };
                if entity.pk.could_overlap(&pk) && sk_overlap {
                    cx.error(
                        format!("projection `{}`", projection.name),
                        format!(
                            "counter shard items (`{pattern}` / `COUNTER`) could be read as entity `{}`; give that entity a distinct literal prefix",
                            entity.name
                        ),
                    );
                }
            }
        }
    }
}
