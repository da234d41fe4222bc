//! Coalescing a batch's effects by target (pure).
//!
//! Effects on one target keep only the last one in stream order: every
//! effect is a state (or a recompute), so the last state is the one the
//! earlier ones would have been overwritten by. The records that
//! contributed are kept, because all of them are applied once it is.

use std::collections::HashMap;

use crate::plan::{CustomOp, Effect, Op};
use crate::record::ItemKey;
use crate::spec::ProjectionId;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Set(ProjectionId, ItemKey),
    Recompute(ProjectionId, ItemKey),
    Marker(ItemKey),
    Record(ProjectionId, ItemKey),
    Custom(ProjectionId, ItemKey),
}

fn target(effect: &Effect, table: &crate::spec::TableSpec) -> Target {
    match &effect.op {
        Op::SetAttributes { key, .. } => Target::Set(effect.projection, key.clone()),
        Op::Recompute { target, .. } => Target::Recompute(effect.projection, target.clone()),
        Op::Membership { marker, .. } => Target::Marker(marker.clone()),
        Op::DropRecord { item, counter, .. } => Target::Record(*counter, item.clone()),
        Op::Custom {
            op: CustomOp::Delete(key),
            ..
        } => Target::Custom(effect.projection, key.clone()),
        Op::Custom {
            op: CustomOp::Put(item),
            ..
        } => Target::Custom(
            effect.projection,
            table.item_key(item).unwrap_or(ItemKey {
                pk: String::new(),
                sk: None,
            }),
        ),
    }
}

/// One coalesced write and the records it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The effect to apply (the last one planned for the target).
    pub effect: Effect,
    /// Indexes of every record that planned an effect on the target.
    pub contributors: Vec<usize>,
}

impl Group {
    /// The record whose effect is applied (the last contributor).
    pub fn last(&self) -> usize {
        *self.contributors.last().expect("a group has a contributor")
    }
}

/// The effect that stands for `earlier` then `later` on one target: the
/// later state, with the earlier guess of what the target was before both
/// (the batch's first record saw the state before the batch).
fn merge(earlier: &Effect, later: Effect) -> Effect {
    if is_orphan_check(&later) && !is_orphan_check(earlier) {
        // A scan read the marker and its source apart: the source's own
        // state says more than a check that it is gone.
        return earlier.clone();
    }
    match (&earlier.op, later.op) {
        (
            Op::Membership {
                was_present: before,
                ..
            },
            Op::Membership {
                marker,
                state,
                counters,
                guard,
                ..
            },
        ) => Effect {
            projection: later.projection,
            op: Op::Membership {
                marker,
                state,
                counters,
                was_present: *before,
                guard,
            },
        },
        (_, op) => Effect {
            projection: later.projection,
            op,
        },
    }
}

/// A scan's check of a marker whose source may be gone: remove it only if
/// the source does not exist.
fn is_orphan_check(effect: &Effect) -> bool {
    matches!(
        &effect.op,
        Op::Membership {
            guard: Some(crate::plan::SourceGuard { seen: None, .. }),
            ..
        }
    )
}

/// Coalesces `(record index, effect)` pairs given in stream order.
pub fn coalesce(
    effects: impl IntoIterator<Item = (usize, Effect)>,
    table: &crate::spec::TableSpec,
) -> Vec<Group> {
    let mut index: HashMap<Target, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (record, effect) in effects {
        match index.entry(target(&effect, table)) {
            std::collections::hash_map::Entry::Occupied(slot) => {
                let group = &mut groups[*slot.get()];
                group.effect = merge(&group.effect, effect);
                if group.contributors.last() != Some(&record) {
                    group.contributors.push(record);
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(groups.len());
                groups.push(Group {
                    effect,
                    contributors: vec![record],
                });
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MarkerState;
    use crate::record::{AttributeValue, Item};

    fn table() -> crate::spec::TableSpec {
        crate::spec::TableSpec {
            name: "t".into(),
            partition_key: "PK".into(),
            sort_key: Some("SK".into()),
            ttl_attribute: None,
            gsis: vec![],
        }
    }

    /// A membership of marker `pk` planned from a record that saw it
    /// `was_present`, wanting it `present` (with `at` copied).
    fn membership(pk: &str, was_present: bool, present: Option<&str>) -> Effect {
        Effect {
            projection: 0,
            op: Op::Membership {
                marker: ItemKey::new(pk, "M"),
                state: match present {
                    Some(at) => {
                        let mut item = Item::default();
                        item.insert("at".into(), AttributeValue::S(at.into()));
                        MarkerState::Present(item)
                    }
                    None => MarkerState::Absent,
                },
                counters: vec![],
                was_present,
                guard: None,
            },
        }
    }

    fn state(group: &Group) -> (&MarkerState, bool) {
        match &group.effect.op {
            Op::Membership {
                state, was_present, ..
            } => (state, *was_present),
            other => panic!("not a membership: {other:?}"),
        }
    }

    #[test]
    fn the_last_state_of_a_target_wins_and_keeps_all_contributors() {
        let groups = coalesce(
            vec![
                (0, membership("a", false, Some("t0"))),
                (1, membership("b", false, Some("t0"))),
                (2, membership("a", true, None)),
                (3, membership("a", false, Some("t3"))),
            ],
            &table(),
        );
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].contributors, vec![0, 2, 3]);
        assert!(matches!(state(&groups[0]).0, MarkerState::Present(item)
            if item.get("at") == Some(&AttributeValue::S("t3".into()))));
        assert_eq!(groups[0].last(), 3);
        assert_eq!(groups[1].contributors, vec![1]);
    }

    #[test]
    fn the_guess_of_the_state_before_comes_from_the_first_record() {
        // Created in the batch, then changed: still a creation.
        let groups = coalesce(
            vec![
                (0, membership("a", false, Some("t0"))),
                (1, membership("a", true, Some("t1"))),
            ],
            &table(),
        );
        assert!(matches!(
            state(&groups[0]),
            (MarkerState::Present(_), false)
        ));
        // Removed, then created again: it was there before the batch.
        let groups = coalesce(
            vec![
                (0, membership("a", true, None)),
                (1, membership("a", false, Some("t1"))),
            ],
            &table(),
        );
        assert!(matches!(state(&groups[0]), (MarkerState::Present(_), true)));
    }

    #[test]
    fn a_scans_orphan_check_never_replaces_the_sources_own_state() {
        let mut visit = membership("a", false, Some("t1"));
        let mut check = membership("a", true, None);
        let seen = |seen| {
            Some(crate::plan::SourceGuard {
                source: ItemKey::new("S", "a"),
                seen,
            })
        };
        if let Op::Membership { guard, .. } = &mut visit.op {
            *guard = seen(Some(vec![]));
        }
        if let Op::Membership { guard, .. } = &mut check.op {
            *guard = seen(None);
        }
        for effects in [
            vec![(0, visit.clone()), (1, check.clone())],
            vec![(0, check.clone()), (1, visit.clone())],
        ] {
            let groups = coalesce(effects, &table());
            assert!(matches!(state(&groups[0]).0, MarkerState::Present(_)));
        }
    }

    #[test]
    fn recomputes_of_one_target_run_once() {
        let recompute = |r| {
            (
                r,
                Effect {
                    projection: 1,
                    op: Op::Recompute {
                        target: ItemKey::new("USER#u", "PROFILE"),
                        sources: crate::plan::Sources::Query(crate::plan::SourceQuery {
                            pk: "USER#u".into(),
                            sk_prefix: Some("EMAIL#".into()),
                        }),
                    },
                },
            )
        };
        let groups = coalesce(vec![recompute(0), recompute(1), recompute(1)], &table());
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].contributors, vec![0, 1]);
    }
}
