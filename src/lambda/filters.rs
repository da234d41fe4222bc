//! Event source mapping filters: only records some projection can use
//! invoke the function.
//!
//! A record is useful when its key matches an entity that some projection
//! plans on ([`crate::kinds::Rules::interested`]). Lambda filters on the
//! record's `dynamodb.Keys`, so each interested entity becomes "partition
//! key starts with its literal prefix and sort key starts with (or equals)
//! its literal prefix". Entities are grouped into as few patterns as exactness
//! allows; when Lambda's limits ([`MAX_FILTERS`] patterns of at most
//! [`MAX_PATTERN_CHARS`] characters) are still exceeded, the patterns whose
//! union admits the fewest extra key shapes are merged, which lets a few
//! useless records through but never drops a useful one.
//!
//! The projector's own items (under [`RESERVED_PREFIX`]) and counter shards
//! match no entity and so never pass, unless an entity's literal prefix is
//! too short to tell them apart (then a note says so). An entity whose
//! partition key starts with a variable cannot be told apart by key at all:
//! then every record passes, and a note says so.
//!
//! **Architecture Invariant:** the filters are a pure function of the spec.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::dynamo::names::RESERVED_PREFIX;
use crate::spec::{KeyPattern, Spec};

/// Filters per event source mapping that Lambda accepts by default.
pub const MAX_FILTERS: usize = 5;

/// The longest pattern Lambda accepts, in characters.
pub const MAX_PATTERN_CHARS: usize = 4096;

/// The `FilterCriteria` of an event source mapping, with notes for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterCriteria {
    /// The patterns (JSON text, as Lambda takes them); empty: every record
    /// passes.
    pub patterns: Vec<String>,
    /// Whether exactly the useful records pass (no merge widened a pattern).
    pub exact: bool,
    /// What a person deploying this should know, one sentence each.
    pub notes: Vec<String>,
}

impl FilterCriteria {
    /// The JSON Lambda and CloudFormation take: `{"Filters": [{"Pattern": "..."}]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "Filters": self
                .patterns
                .iter()
                .map(|pattern| json!({ "Pattern": pattern }))
                .collect::<Vec<_>>()
        })
    }
}

/// How one key attribute's value is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Match {
    /// The value equals this text (a literal pattern such as `PROFILE`).
    Exact(String),
    /// The value starts with this text (a pattern's literal prefix).
    Prefix(String),
}

impl Match {
    /// The matcher of a key pattern; `None` when it starts with a variable.
    fn of(pattern: &KeyPattern) -> Option<Match> {
        let prefix = pattern.literal_prefix();
        if pattern.is_literal() {
            Some(Match::Exact(prefix.to_string()))
        } else if prefix.is_empty() {
            None
        } else {
            Some(Match::Prefix(prefix.to_string()))
        }
    }

    fn accepts(&self, value: &str) -> bool {
        match self {
            Match::Exact(text) => value == text,
            Match::Prefix(prefix) => value.starts_with(prefix.as_str()),
        }
    }

    /// Whether every value this matcher accepts, `other` accepts too.
    fn within(&self, other: &Match) -> bool {
        match (self, other) {
            (Match::Exact(a), _) => other.accepts(a),
            (Match::Prefix(a), Match::Prefix(b)) => a.starts_with(b.as_str()),
            (Match::Prefix(_), Match::Exact(_)) => false,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Match::Exact(text) => json!(text),
            Match::Prefix(prefix) => json!({ "prefix": prefix }),
        }
    }
}

/// Alternatives for one key attribute: any of these values.
type Alternatives = BTreeSet<Match>;

/// One pattern: the partition key matches one of `pk` and the sort key one
/// of `sk` (`None`: any sort key).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    pk: Alternatives,
    sk: Option<Alternatives>,
}

impl Rule {
    fn pattern(&self, spec: &Spec) -> String {
        let mut keys = serde_json::Map::new();
        let alternatives =
            |set: &Alternatives| Value::Array(set.iter().map(Match::to_json).collect());
        keys.insert(
            spec.table.partition_key.clone(),
            json!({ "S": alternatives(&self.pk) }),
        );
        if let (Some(name), Some(sk)) = (&spec.table.sort_key, &self.sk) {
            keys.insert(name.clone(), json!({ "S": alternatives(sk) }));
        }
        json!({ "dynamodb": { "Keys": keys } }).to_string()
    }

    /// How many (partition, sort) shapes the rule admits, for merge costs;
    /// "any sort key" counts as many.
    fn shapes(&self) -> usize {
        self.pk.len() * self.sk.as_ref().map_or(1000, BTreeSet::len)
    }

    fn merged(&self, other: &Rule) -> Rule {
        Rule {
            pk: simplify(self.pk.union(&other.pk).cloned().collect()),
            sk: match (&self.sk, &other.sk) {
                (Some(a), Some(b)) => Some(simplify(a.union(b).cloned().collect())),
                _ => None,
            },
        }
    }
}

/// Drops the alternatives another one already accepts.
fn simplify(set: Alternatives) -> Alternatives {
    set.iter()
        .filter(|m| !set.iter().any(|other| other != *m && m.within(other)))
        .cloned()
        .collect()
}

/// The `FilterCriteria` of every table `specs` describe, by table name,
/// as `ddb-projector filters` prints them (and `infra/deploy` reads); each
/// note (a prefix that could match the projector's own items, ...) goes
/// to `note` with its table.
pub fn by_table(
    specs: &[std::sync::Arc<Spec>],
    note: &mut dyn FnMut(&str, &str),
) -> serde_json::Map<String, serde_json::Value> {
    let mut by_table = serde_json::Map::new();
    for spec in specs {
        let criteria = filter_criteria(spec);
        for line in &criteria.notes {
            note(&spec.table.name, line);
        }
        by_table.insert(spec.table.name.clone(), criteria.to_json());
    }
    by_table
}

/// What `filters` prints as JSON: one table's criteria, or (several) an
/// object of them by table name.
pub fn criteria_json(by_table: serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    if by_table.len() == 1 {
        by_table.into_iter().next().expect("one").1
    } else {
        serde_json::Value::Object(by_table)
    }
}

/// Builds the filters for a spec (see the module docs).
pub fn filter_criteria(spec: &Spec) -> FilterCriteria {
    let mut notes = Vec::new();
    let everything = |mut notes: Vec<String>, why: String| {
        notes.push(format!(
            "{why}; every record of the stream will invoke the function (no filter)"
        ));
        FilterCriteria {
            patterns: Vec::new(),
            exact: false,
            notes,
        }
    };

    // Sort key alternatives by partition key matcher.
    let mut by_pk: BTreeMap<Match, Option<Alternatives>> = BTreeMap::new();
    for (id, entity) in spec.entities.iter().enumerate() {
        if spec.interested(id).is_empty() {
            continue;
        }
        let Some(pk) = Match::of(&entity.pk) else {
            return everything(
                notes,
                format!(
                    "entity `{}` has a partition key pattern (`{}`) that starts with a variable, so its records cannot be told apart by key",
                    entity.name,
                    entity.pk.as_str()
                ),
            );
        };
        let sk = entity.sk.as_ref().and_then(Match::of);
        let slot = by_pk.entry(pk).or_insert_with(|| Some(Alternatives::new()));
        match (slot.as_mut(), sk) {
            (Some(set), Some(sk)) => {
                set.insert(sk);
            }
            _ => *slot = None,
        }
    }
    if by_pk.is_empty() {
        notes.push(
            "no projection plans on any entity, so no record is of use; no filter is given (every record invokes the function and is skipped)".to_string(),
        );
        return FilterCriteria {
            patterns: Vec::new(),
            exact: false,
            notes,
        };
    }

    // Partition keys with the same sort key alternatives share a pattern.
    let mut by_sk: BTreeMap<Option<Vec<Match>>, Alternatives> = BTreeMap::new();
    for (pk, sk) in by_pk {
        let sk = sk.map(|set| simplify(set).into_iter().collect::<Vec<_>>());
        by_sk.entry(sk).or_default().insert(pk);
    }
    let mut rules: Vec<Rule> = by_sk
        .into_iter()
        .map(|(sk, pk)| Rule {
            pk: simplify(pk),
            sk: sk.map(|sk| sk.into_iter().collect()),
        })
        .collect();

    let mut exact = true;
    rules = split_long(rules, spec);
    while rules.len() > MAX_FILTERS {
        // Merge the pair whose union admits the fewest extra key shapes and
        // still fits in one pattern.
        let mut best: Option<(usize, usize, usize)> = None;
        for i in 0..rules.len() {
            for j in i + 1..rules.len() {
                let merged = rules[i].merged(&rules[j]);
                if merged.pattern(spec).chars().count() > MAX_PATTERN_CHARS {
                    continue;
                }
                let extra = merged
                    .shapes()
                    .saturating_sub(rules[i].shapes() + rules[j].shapes());
                if best.is_none_or(|(_, _, cost)| extra < cost) {
                    best = Some((i, j, extra));
                }
            }
        }
        let Some((i, j, _)) = best else {
            return everything(
                notes,
                format!(
                    "the interested entities' key prefixes do not fit in {MAX_FILTERS} patterns of {MAX_PATTERN_CHARS} characters"
                ),
            );
        };
        let merged = rules[i].merged(&rules[j]);
        rules.remove(j);
        rules[i] = merged;
        exact = false;
    }
    if rules
        .iter()
        .any(|rule| rule.pattern(spec).chars().count() > MAX_PATTERN_CHARS)
    {
        return everything(
            notes,
            format!("a single key prefix is too long for a {MAX_PATTERN_CHARS}-character pattern"),
        );
    }
    if !exact {
        notes.push(format!(
            "the patterns were merged to fit Lambda's limit of {MAX_FILTERS} filters: some records no projection uses still invoke the function (they are skipped)"
        ));
    }

    let reserved: Vec<String> = rules
        .iter()
        .flat_map(|rule| &rule.pk)
        .filter_map(|m| match m {
            Match::Prefix(prefix) if RESERVED_PREFIX.starts_with(prefix.as_str()) => {
                Some(prefix.clone())
            }
            _ => None,
        })
        .collect();
    if !reserved.is_empty() {
        exact = false;
        notes.push(format!(
            "the partition key prefix(es) {} also match the projector's own `{RESERVED_PREFIX}` items, so its bookkeeping writes invoke the function too (they are skipped); give those entities a longer literal prefix",
            reserved.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    notes.extend(echo_notes(spec));
    FilterCriteria {
        patterns: rules.iter().map(|rule| rule.pattern(spec)).collect(),
        exact,
        notes,
    }
}

/// Splits patterns longer than Lambda accepts, partition keys first.
fn split_long(rules: Vec<Rule>, spec: &Spec) -> Vec<Rule> {
    let mut out = Vec::new();
    let mut todo = rules;
    while let Some(rule) = todo.pop() {
        if rule.pattern(spec).chars().count() <= MAX_PATTERN_CHARS {
            out.push(rule);
            continue;
        }
        let halves = |set: &Alternatives| {
            let items: Vec<Match> = set.iter().cloned().collect();
            let (a, b) = items.split_at(items.len() / 2);
            (
                a.iter().cloned().collect::<Alternatives>(),
                b.iter().cloned().collect::<Alternatives>(),
            )
        };
        if rule.pk.len() > 1 {
            let (a, b) = halves(&rule.pk);
            todo.push(Rule {
                pk: a,
                sk: rule.sk.clone(),
            });
            todo.push(Rule { pk: b, sk: rule.sk });
        } else if rule.sk.as_ref().is_some_and(|sk| sk.len() > 1) {
            let (a, b) = halves(rule.sk.as_ref().expect("checked"));
            todo.push(Rule {
                pk: rule.pk.clone(),
                sk: Some(a),
            });
            todo.push(Rule {
                pk: rule.pk,
                sk: Some(b),
            });
        } else {
            // One prefix alone is too long; reported by the caller.
            out.push(rule);
        }
    }
    out.reverse();
    out
}

/// Records the projector itself causes that pass the filter.
fn echo_notes(spec: &Spec) -> Vec<String> {
    let mut notes = Vec::new();
    for projection in &spec.projections {
        notes.extend(
            projection
                .kind
                .dispatch()
                .filter_note(spec, &projection.name),
        );
    }
    notes
}

#[cfg(test)]
mod tests;
