//! Coalescing a batch's effects by target (pure).
//!
//! Effects on one target keep only the last one in stream order: every
//! effect is a state (or a recompute), so the last state is the one the
//! earlier ones would have been overwritten by. The records that
//! contributed are kept, because all of them are applied once it is.

use std::collections::HashMap;

use crate::plan::{CustomOp, Effect, MarkerState, Op};
use crate::record::ItemKey;
use crate::spec::ProjectionId;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Set(ProjectionId, ItemKey),
    Recompute(ProjectionId, ItemKey),
    Marker(ItemKey),
    Custom(ProjectionId, ItemKey),
}

fn target(effect: &Effect, table: &crate::spec::TableSpec) -> Target {
    match &effect.op {
        Op::SetAttributes { key, .. } => Target::Set(effect.projection, key.clone()),
        Op::Recompute { target, .. } => Target::Recompute(effect.projection, target.clone()),
        Op::Membership { marker, .. } => Target::Marker(marker.clone()),
        Op::Custom(CustomOp::Delete(key)) => Target::Custom(effect.projection, key.clone()),
        Op::Custom(CustomOp::Put(item)) => Target::Custom(
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
    /// For a marker: whether the first record that planned it implies the
    /// marker existed before the batch (a removal or a refresh: yes; a
    /// creation: no). A hint only: a redelivered batch may find it otherwise.
    pub existed_before: Option<bool>,
}

impl Group {
    /// The record whose effect is applied (the last contributor).
    pub fn last(&self) -> usize {
        *self.contributors.last().expect("a group has a contributor")
    }

    /// Whether the marker is probably in its final state already: created
    /// and removed again within the batch, or removed and created again.
    /// Its conditional write would then most likely cancel the whole
    /// transaction it is in, so the applier reads it first.
    pub fn likely_settled(&self) -> bool {
        match (&self.effect.op, self.existed_before) {
            (
                Op::Membership {
                    state: MarkerState::Present(_),
                    ..
                },
                Some(existed),
            ) => existed,
            (
                Op::Membership {
                    state: MarkerState::Absent,
                    ..
                },
                Some(existed),
            ) => !existed,
            _ => false,
        }
    }
}

/// What the first effect on a marker implies about it before the batch.
fn existed_before(effect: &Effect) -> Option<bool> {
    match &effect.op {
        Op::Membership { state, .. } => Some(!matches!(state, MarkerState::Present(_))),
        _ => None,
    }
}

/// The effect that stands for `earlier` then `later` on one target: the
/// later one, except that a refresh of a marker does not undo the state an
/// earlier record gave it (a marker created in the batch is still created,
/// with the refreshed attributes; a deleted one stays deleted).
fn merge(earlier: &Effect, later: Effect) -> Effect {
    match (&earlier.op, later.op) {
        (
            Op::Membership {
                state: MarkerState::Present(_),
                ..
            },
            Op::Membership {
                marker,
                state: MarkerState::Refresh(item),
                counters,
                guard,
            },
        ) => Effect {
            projection: later.projection,
            op: Op::Membership {
                marker,
                state: MarkerState::Present(item),
                counters,
                guard,
            },
        },
        (
            Op::Membership {
                state: MarkerState::Absent,
                ..
            },
            Op::Membership {
                state: MarkerState::Refresh(_),
                ..
            },
        ) => earlier.clone(),
        (_, op) => Effect {
            projection: later.projection,
            op,
        },
    }
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
                    existed_before: existed_before(&effect),
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
    use crate::record::Item;

    fn table() -> crate::spec::TableSpec {
        crate::spec::TableSpec {
            name: "t".into(),
            partition_key: "PK".into(),
            sort_key: Some("SK".into()),
            ttl_attribute: None,
            gsis: vec![],
        }
    }

    fn membership(pk: &str, present: bool) -> Effect {
        Effect {
            projection: 0,
            op: Op::Membership {
                marker: ItemKey::new(pk, "M"),
                state: if present {
                    MarkerState::Present(Item::default())
                } else {
                    MarkerState::Absent
                },
                counters: vec![],
                guard: None,
            },
        }
    }

    #[test]
    fn the_last_state_of_a_target_wins_and_keeps_all_contributors() {
        let groups = coalesce(
            vec![
                (0, membership("a", true)),
                (1, membership("b", true)),
                (2, membership("a", false)),
                (3, membership("a", true)),
            ],
            &table(),
        );
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].contributors, vec![0, 2, 3]);
        assert!(matches!(
            &groups[0].effect.op,
            Op::Membership {
                state: MarkerState::Present(_),
                ..
            }
        ));
        assert_eq!(groups[0].last(), 3);
        assert_eq!(groups[1].contributors, vec![1]);
    }

    fn refresh(pk: &str, at: &str) -> Effect {
        let mut item = Item::default();
        item.insert("at".into(), crate::record::AttributeValue::S(at.into()));
        Effect {
            projection: 0,
            op: Op::Membership {
                marker: ItemKey::new(pk, "M"),
                state: MarkerState::Refresh(item),
                counters: vec![],
                guard: None,
            },
        }
    }

    fn state(group: &Group) -> &MarkerState {
        match &group.effect.op {
            Op::Membership { state, .. } => state,
            other => panic!("not a membership: {other:?}"),
        }
    }

    #[test]
    fn a_refresh_keeps_what_earlier_records_did_to_the_marker() {
        // Created in the batch, then refreshed: still created, with the
        // refreshed attributes (and its counters).
        let groups = coalesce(
            vec![(0, membership("a", true)), (1, refresh("a", "t1"))],
            &table(),
        );
        assert!(matches!(state(&groups[0]), MarkerState::Present(item) if item.contains_key("at")));
        // Deleted, then a stale refresh: stays deleted.
        let groups = coalesce(
            vec![(0, membership("a", false)), (1, refresh("a", "t1"))],
            &table(),
        );
        assert_eq!(state(&groups[0]), &MarkerState::Absent);
        // Refreshed, then deleted or created again: the later state wins.
        let groups = coalesce(
            vec![(0, refresh("a", "t1")), (1, membership("a", false))],
            &table(),
        );
        assert_eq!(state(&groups[0]), &MarkerState::Absent);
        let groups = coalesce(
            vec![(0, refresh("a", "t1")), (1, refresh("a", "t2"))],
            &table(),
        );
        assert!(matches!(state(&groups[0]), MarkerState::Refresh(item)
            if item.get("at") == Some(&crate::record::AttributeValue::S("t2".into()))));
        assert_eq!(groups[0].contributors, vec![0, 1]);
    }

    #[test]
    fn a_marker_created_and_removed_within_the_batch_is_likely_settled() {
        // Followed then unfollowed (the edge most likely never existed), or
        // unfollowed then followed again (it most likely still exists): the
        // marker is probably in its final state already.
        for states in [[true, false], [false, true]] {
            let groups = coalesce(
                vec![
                    (0, membership("a", states[0])),
                    (1, refresh("a", "t1")),
                    (2, membership("a", states[1])),
                ],
                &table(),
            );
            assert!(groups[0].likely_settled(), "{states:?}");
        }
        // A plain creation, removal, or removal then refresh moves the marker.
        for effects in [
            vec![(0, membership("a", true))],
            vec![(0, membership("a", false))],
            vec![(0, membership("a", true)), (1, refresh("a", "t1"))],
            vec![(0, refresh("a", "t1")), (1, membership("a", false))],
            vec![
                (0, membership("a", true)),
                (1, membership("a", false)),
                (2, membership("a", true)),
            ],
        ] {
            let groups = coalesce(effects.clone(), &table());
            assert!(!groups[0].likely_settled(), "{effects:?}");
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
                        sources: crate::plan::SourceQuery {
                            pk: "USER#u".into(),
                            sk_prefix: Some("EMAIL#".into()),
                        },
                    },
                },
            )
        };
        let groups = coalesce(vec![recompute(0), recompute(1), recompute(1)], &table());
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].contributors, vec![0, 1]);
    }
}
