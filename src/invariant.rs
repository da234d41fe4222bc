//! Invariants: pure evaluation of a spec's `[[invariants]]` over items.
//!
//! The online checker ([`crate::apply`]) feeds this the items of the
//! partitions a batch touched (read consistently) and the owners of the
//! unique values it touched; `audit` feeds it a whole table. Both get the
//! same [`Violation`]s, with the same storage identity, so a violation the
//! worker recorded is cleared by whichever of them sees it resolved.

use std::collections::BTreeSet;

use crate::record::{AttributeValue, Attributes, Item, ItemKey};
use crate::spec::{Condition, Invariant, InvariantKind, RepairPolicy, Spec};

pub use crate::dynamo::names::violation_pk;

/// One broken invariant in one scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: String,
    /// Its kind (`exactly-one` ...).
    pub kind: &'static str,
    /// The partition key (count, implies) or the unique value.
    pub scope: String,
    /// The offending item's sort key, for per-item kinds (`implies`).
    pub item: Option<String>,
    /// The items involved.
    pub keys: Vec<ItemKey>,
    /// What is wrong, for people.
    pub message: String,
}

impl Violation {
    /// The sort key it is recorded under in `violation_pk(invariant)`:
    /// `<scope>|` or `<scope>|<item sort key>`.
    pub fn record_sk(&self) -> String {
        scope_prefix(&self.scope) + self.item.as_deref().unwrap_or("")
    }
}

/// The sort key prefix of every violation recorded for a scope.
pub fn scope_prefix(scope: &str) -> String {
    format!("{scope}|")
}

/// The key of an item, if its key attributes are strings.
fn key_of(spec: &Spec, item: &Item) -> Option<ItemKey> {
    spec.table.item_key(item)
}

/// Items of the invariant's entity among `items`, with their keys.
fn entity_items<'a>(
    spec: &Spec,
    invariant: &Invariant,
    items: &'a [Item],
) -> Vec<(ItemKey, &'a Item)> {
    let mut out = Vec::new();
    for item in items {
        let Some(key) = key_of(spec, item) else {
            continue;
        };
        let mut vars = Vec::new();
        if spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) == Some(invariant.entity) {
            out.push((key, item));
        }
    }
    out
}

fn describe(condition: &Condition) -> String {
    condition
        .0
        .iter()
        .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Checks a partition-scoped invariant (count, implies) over all items of
/// partition `pk` (items of other entities are ignored).
pub fn check_partition(
    spec: &Spec,
    invariant: &Invariant,
    pk: &str,
    items: &[Item],
) -> Vec<Violation> {
    let members = entity_items(spec, invariant, items);
    let entity = &spec.entities[invariant.entity].name;
    let violation = |item: Option<String>, keys: Vec<ItemKey>, message: String| Violation {
        invariant: invariant.name.clone(),
        kind: invariant.kind_name(),
        scope: pk.to_string(),
        item,
        keys,
        message,
    };
    match &invariant.kind {
        InvariantKind::Count { when, exactly, .. } => {
            if members.is_empty() {
                return Vec::new();
            }
            let satisfying: Vec<ItemKey> = members
                .iter()
                .filter(|(_, item)| when.holds(Some(*item)))
                .map(|(key, _)| key.clone())
                .collect();
            match satisfying.len() {
                0 if *exactly => vec![violation(
                    None,
                    members.iter().map(|(key, _)| key.clone()).collect(),
                    format!(
                        "none of the {} `{entity}` items in {pk} has {}",
                        members.len(),
                        describe(when)
                    ),
                )],
                0 | 1 => Vec::new(),
                n => vec![violation(
                    None,
                    satisfying,
                    format!(
                        "{n} `{entity}` items in {pk} have {}; {} allowed",
                        describe(when),
                        if *exactly {
                            "exactly one is"
                        } else {
                            "at most one is"
                        }
                    ),
                )],
            }
        }
        InvariantKind::Implies { premise, then } => members
            .iter()
            .filter(|(_, item)| premise.holds(Some(*item)) && !then.holds(Some(*item)))
            .map(|(key, _)| {
                violation(
                    key.sk.clone().or_else(|| Some(String::new())),
                    vec![key.clone()],
                    format!(
                        "`{entity}` {} has {} but not {}",
                        key,
                        describe(premise),
                        describe(then)
                    ),
                )
            })
            .collect(),
        InvariantKind::Unique { .. } => Vec::new(),
    }
}

/// The unique value an item carries for a `unique` invariant: the derived
/// GSI partition key, rendered from the item as the index-keys projection
/// would. `None` when the item is not of the entity or lacks what the
/// template reads.
pub fn unique_value<A: Attributes + ?Sized>(
    spec: &Spec,
    invariant: &Invariant,
    item: &A,
) -> Option<String> {
    let InvariantKind::Unique { template, .. } = &invariant.kind else {
        return None;
    };
    let key = spec.table.item_key(item)?;
    let mut vars = Vec::new();
    if spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) != Some(invariant.entity) {
        return None;
    }
    template.render(&vars, Some(item)).ok()
}

/// Checks a `unique` invariant: the items carrying `value` must all be in
/// one partition.
pub fn check_unique(invariant: &Invariant, value: &str, holders: &[ItemKey]) -> Option<Violation> {
    let owners: BTreeSet<&str> = holders.iter().map(|k| k.pk.as_str()).collect();
    if owners.len() < 2 {
        return None;
    }
    let mut keys = holders.to_vec();
    keys.sort_by(|a, b| (&a.pk, &a.sk).cmp(&(&b.pk, &b.sk)));
    Some(Violation {
        invariant: invariant.name.clone(),
        kind: invariant.kind_name(),
        scope: value.to_string(),
        item: None,
        message: format!(
            "{value} belongs to {} owners: {}",
            owners.len(),
            owners.iter().copied().collect::<Vec<_>>().join(", ")
        ),
        keys,
    })
}

/// A write a repair policy makes to a source item: make it stop satisfying
/// the invariant's condition, on condition that it still does.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairWrite {
    /// The source item.
    pub key: ItemKey,
    /// The attribute changed.
    pub attribute: String,
    /// Its new value (`None`: remove it).
    pub value: Option<AttributeValue>,
    /// What the item must still hold for the write to go ahead.
    pub expect: Condition,
}

/// The writes the `keep-latest` policy makes when several items satisfy a
/// count invariant: every one but `keep` stops satisfying it. A boolean
/// condition attribute is flipped; any other is removed.
pub fn keep_latest(
    invariant: &Invariant,
    satisfying: &[ItemKey],
    keep: &ItemKey,
) -> Vec<RepairWrite> {
    let InvariantKind::Count {
        when,
        repair: Some(RepairPolicy::KeepLatest),
        ..
    } = &invariant.kind
    else {
        return Vec::new();
    };
    let Some((attribute, wanted)) = when.0.first() else {
        return Vec::new();
    };
    let value = match wanted {
        AttributeValue::Bool(b) => Some(AttributeValue::Bool(!b)),
        _ => None,
    };
    satisfying
        .iter()
        .filter(|key| *key != keep)
        .map(|key| RepairWrite {
            key: key.clone(),
            attribute: attribute.clone(),
            value: value.clone(),
            expect: when.clone(),
        })
        .collect()
}
