//! `aggregate`: totals over the items of one entity in a partition,
//! written onto a target item.
//!
//! ```toml
//! [[projections]]
//! name = "campaign-totals"
//! kind = "aggregate"
//! source = "performance"         # CAMPAIGN#{campaignId} / PERF#{date}
//! target = "campaign"            # CAMPAIGN#{campaignId} / METADATA
//! set = { totalSpend = "sum(spend)", days = "count()", lastDate = "max(date)" }
//! ```
//!
//! Like `denormalize`, it plans a recompute, never a delta: the applier
//! reads the target and the partition's source items consistently and
//! writes what [`compute`] says. Sums are exact decimals ([`decimal`]);
//! `min` and `max` compare numbers by value and strings by their UTF-8
//! bytes, as DynamoDB does. Over no items `count()` is 0 and the others
//! are removed.

pub mod decimal;

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{
    bind, source_query, Expectation, Kind, Planning, Projection, Pruning, Recompute, Rules,
    TargetState, Writes,
};
use crate::dynamo::names::token_attribute;
use crate::effect::{changed, Effect, Op, PlanProblem, Sources, Subject};
use crate::record::{AttributeValue, Attributes, ChangeKind, Image, Item, ItemKey, ValueRef};
use crate::schema::raw::RawCondition;
use crate::schema::{Compiler, Condition, Entity, EntityId, ProjectionId, TableSpec};
use decimal::Decimal;

/// The `[[projections]]` section of `kind = "aggregate"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAggregate {
    /// Projection name.
    pub name: String,
    /// The entity whose items are totalled.
    pub source: String,
    /// The entity the totals are written on; its key variables come from
    /// the source's, and the source's partition key from its.
    pub target: String,
    /// Only source items for which this holds are totalled.
    #[serde(default)]
    pub when: RawCondition,
    /// Target attribute to function: `sum(ATTR)`, `count()`, `min(ATTR)`,
    /// `max(ATTR)`; `ATTR` an attribute or a key variable of the source.
    pub set: BTreeMap<String, String>,
}

/// A function over the source items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Function {
    /// The sum of a number attribute.
    Sum(String),
    /// The number of items.
    Count,
    /// The smallest value (numbers or strings).
    Min(String),
    /// The largest value (numbers or strings).
    Max(String),
}

impl Function {
    fn parse(text: &str) -> Result<Function, String> {
        let text = text.trim();
        let (name, rest) = text.split_once('(').ok_or_else(|| {
            format!(
                "`{text}` is not a function call: use sum(ATTR), count(), min(ATTR) or max(ATTR)"
            )
        })?;
        let arg = rest
            .strip_suffix(')')
            .ok_or_else(|| format!("`{text}` lacks its closing `)`"))?
            .trim();
        let valid = |arg: &str| {
            !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        match name.trim() {
            "count" if arg.is_empty() => Ok(Function::Count),
            "count" => Err(format!(
                "`{text}`: count() counts items and takes no attribute"
            )),
            "sum" | "min" | "max" if !valid(arg) => Err(format!(
                "`{text}`: name one attribute (letters, digits, `_`, `-`, `.`)"
            )),
            "sum" => Ok(Function::Sum(arg.to_string())),
            "min" => Ok(Function::Min(arg.to_string())),
            "max" => Ok(Function::Max(arg.to_string())),
            other => Err(format!(
                "`{text}`: unknown function `{other}` (use sum, count, min or max)"
            )),
        }
    }

    /// The attribute or key variable it reads.
    pub fn argument(&self) -> Option<&str> {
        match self {
            Function::Sum(a) | Function::Min(a) | Function::Max(a) => Some(a),
            Function::Count => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Function::Sum(_) => "sum",
            Function::Count => "count",
            Function::Min(_) => "min",
            Function::Max(_) => "max",
        }
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.argument().unwrap_or(""))
    }
}

/// A compiled `aggregate`.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// Totalled entity.
    pub source: EntityId,
    /// Entity written on.
    pub target: EntityId,
    /// Which source items count.
    pub when: Condition,
    /// Target attribute to function.
    pub set: Vec<(String, Function)>,
    /// Source attributes that matter (condition and arguments that are
    /// not key variables).
    pub reads: Vec<String>,
}

/// Compiles a raw `aggregate`; problems go to `cx`.
pub(crate) fn compile(
    raw: &RawAggregate,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
) -> Option<Aggregate> {
    let (source, target) = cx.source_and_target(context, &raw.source, &raw.target, entities)?;
    if raw.set.is_empty() {
        cx.error(context, "`set` is empty: name at least one total to keep");
        return None;
    }
    let bound = cx.bound_by_source(context, &entities[source], &entities[target]);
    let queryable = cx.queryable(context, &entities[source], &entities[target]);
    let when = cx.condition(context, &raw.when);
    let key_vars: HashSet<&str> = entities[source].vars().collect();
    let mut set = Vec::new();
    let mut ok = bound && queryable;
    for (attr, text) in &raw.set {
        if !cx.writable(context, "set", attr, table) {
            ok = false;
            continue;
        }
        match Function::parse(text) {
            Ok(Function::Sum(arg)) if key_vars.contains(arg.as_str()) => {
                cx.error(
                    context,
                    format!("set `{attr}` = `{text}`: `{arg}` is a key variable of `{}`, a string; sum() needs a number attribute", entities[source].name),
                );
                ok = false;
            }
            Ok(function) => set.push((attr.clone(), function)),
            Err(problem) => {
                cx.error(context, format!("set `{attr}`: {problem}"));
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    let mut reads: Vec<String> = when.0.iter().map(|(name, _)| name.clone()).collect();
    for (_, function) in &set {
        if let Some(arg) = function.argument() {
            if !key_vars.contains(arg) && !reads.iter().any(|r| r == arg) {
                reads.push(arg.to_string());
            }
        }
    }
    Some(Aggregate {
        source,
        target,
        when,
        set,
        reads,
    })
}

/// The records that can move the totals: a source item that is totalled
/// before or after the change (and a change of what it reads), or a change
/// to the target (it appears, or a writer overwrote the totals).
pub(crate) fn plan(
    rules: &Rules,
    id: ProjectionId,
    p: &Aggregate,
    entity: EntityId,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let record = subject.record;
    let (old, new) = (record.old_image.as_ref(), record.new_image.as_ref());
    let relevant = if entity == p.source {
        let counts = |image: Option<&Image>| image.is_none_or(|image| p.when.holds(Some(image)));
        let relevant = match record.kind {
            // A scanned item, or one derived from its current state, may
            // have counted before: it recomputes either way.
            ChangeKind::Insert => counts(new) || subject.complete,
            ChangeKind::Modify => changed(record, &p.reads) && (counts(old) || counts(new)),
            ChangeKind::Remove => counts(old),
        };
        // A totalled item whose values cannot be totalled is named now,
        // in its own record's dead letter.
        if relevant && record.kind != ChangeKind::Remove {
            if let Some(image) = new.filter(|image| p.when.holds(Some(*image))) {
                for (_, function) in &p.set {
                    check_value(function, &subject.key, image, &subject.vars)
                        .map_err(PlanProblem::Custom)?;
                }
            }
        }
        relevant
    } else {
        let token = token_attribute(&rules.projections[id].name);
        super::target_needs_recompute(record, p.set.iter().map(|(attr, _)| attr), &token)
    };
    if !relevant {
        return Ok(());
    }
    let target = rules.entities[p.target]
        .render_key(&subject.vars)
        .expect("aggregate variables are checked when the spec is compiled");
    let query = source_query(&rules.entities[p.source], &subject.vars)
        .expect("aggregate variables are checked when the spec is compiled");
    effects.push(Effect {
        projection: id,
        op: Op::Recompute {
            target,
            sources: Sources::Query(query),
        },
    });
    Ok(())
}

/// What `function` reads from an item: a key variable's string, or the
/// attribute; checked against what the function accepts.
fn check_value<'a, A: Attributes + ?Sized>(
    function: &Function,
    key: &ItemKey,
    item: &'a A,
    vars: &'a [(&'a str, &'a str)],
) -> Result<Option<Value>, String> {
    let Some(arg) = function.argument() else {
        return Ok(None);
    };
    if let Some((_, value)) = vars.iter().find(|(name, _)| *name == arg) {
        return Ok(Some(Value::S(value.to_string())));
    }
    let wrong = |found: &str| {
        format!(
            "item {key}: attribute `{arg}` is {found}, but {function} needs {}",
            match function {
                Function::Sum(_) => "a number",
                _ => "a number or a string",
            }
        )
    };
    match item.attribute(arg) {
        None => Ok(None),
        Some(ValueRef::N(n)) => Decimal::parse(n)
            .map(|d| Some(Value::N(d)))
            .ok_or_else(|| wrong(&format!("the number {n:?}, which does not parse"))),
        Some(ValueRef::S(s)) if !matches!(function, Function::Sum(_)) => {
            Ok(Some(Value::S(s.to_string())))
        }
        Some(ValueRef::S(_)) => Err(wrong("a string (S)")),
        Some(ValueRef::Bool(_)) => Err(wrong("a boolean (BOOL)")),
        Some(ValueRef::Null(_)) => Err(wrong("null (NULL)")),
        Some(ValueRef::Other(value)) => Err(wrong(crate::schema::template::type_name(value))),
    }
}

#[derive(Debug, Clone)]
enum Value {
    N(Decimal),
    S(String),
}

/// The totals over `sources` (the items of a recompute's query; items of
/// other entities, and those `when` rejects, are left out).
pub fn compute(rules: &Rules, p: &Aggregate, sources: &[Item]) -> Result<TargetState, String> {
    let entity = &rules.entities[p.source];
    let mut totals: Vec<Option<Value>> = vec![None; p.set.len()];
    let mut count = 0u64;
    for item in sources {
        let Some(vars) = bind(rules, entity, item) else {
            continue;
        };
        if !p.when.holds(Some(item)) {
            continue;
        }
        count += 1;
        let key = rules.table.item_key(item).expect("bound above");
        for ((_, function), total) in p.set.iter().zip(totals.iter_mut()) {
            let Some(value) = check_value(function, &key, item, &vars)? else {
                continue;
            };
            *total = Some(match (total.take(), value) {
                (None, value) => value,
                (Some(Value::N(a)), Value::N(b)) => match function {
                    Function::Sum(_) => Value::N(a.add(&b)),
                    Function::Min(_) => Value::N(if b.compare(&a).is_lt() { b } else { a }),
                    _ => Value::N(if b.compare(&a).is_gt() { b } else { a }),
                },
                (Some(Value::S(a)), Value::S(b)) => match function {
                    Function::Min(_) => Value::S(a.min(b)),
                    _ => Value::S(a.max(b)),
                },
                (Some(previous), value) => {
                    let kind = |v: &Value| match v {
                        Value::N(_) => "number",
                        Value::S(_) => "string",
                    };
                    return Err(format!(
                        "item {key}: attribute `{}` is a {} here but a {} on other items: {function} compares numbers or strings, not both",
                        function.argument().unwrap_or_default(),
                        kind(&value),
                        kind(&previous),
                    ));
                }
            });
        }
    }
    p.set
        .iter()
        .zip(totals)
        .map(|((attr, function), total)| {
            let value = match (function, total) {
                (Function::Count, _) => Some(AttributeValue::N(count.to_string())),
                (_, None) => None,
                (_, Some(Value::S(s))) => Some(AttributeValue::S(s)),
                (_, Some(Value::N(d))) => {
                    if !d.storable() {
                        return Err(format!(
                            "{function} for `{attr}` is {d}, which DynamoDB cannot store (at most 38 significant digits)"
                        ));
                    }
                    Some(AttributeValue::N(d.to_string()))
                }
            };
            Ok((attr.clone(), value))
        })
        .collect()
}

/// One line for `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &Aggregate) -> String {
    let when = if p.when.is_empty() {
        String::new()
    } else {
        format!(
            " when {}",
            p.when
                .0
                .iter()
                .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
                .collect::<Vec<_>>()
                .join(" and ")
        )
    };
    format!(
        "{} -> {}{when}: {}",
        rules.entities[p.source].name,
        rules.entities[p.target].name,
        p.set
            .iter()
            .map(|(attr, function)| format!("{attr} = {function}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// What `filters` tells a person about the records this kind makes pass.
pub(crate) fn filter_note(rules: &Rules, name: &str, p: &Aggregate) -> String {
    format!(
        "aggregate `{name}`: records of its target `{}` pass (an INSERT brings the totals, a writer that overwrites them is corrected), including the MODIFY of the projector's own write, whose recompute reads the partition again and writes nothing",
        rules.entities[p.target].name
    )
}

/// The attributes it writes on its target entity, the token included.
pub(crate) fn written(name: &str, p: &Aggregate) -> Vec<String> {
    p.set
        .iter()
        .map(|(attr, _)| attr.clone())
        .chain([token_attribute(name)])
        .collect()
}

/// An aggregate is recomputed from the source items of its target's
/// partition.
impl Kind for Aggregate {
    fn kind_name(&self) -> &'static str {
        "aggregate"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        vec![self.source, self.target]
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        vec![pattern(self.source), pattern(self.target)]
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.rules, at.id, self, at.entity, at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String> {
        Some(filter_note(rules, name, self))
    }

    fn writes(&self, name: &str) -> Writes {
        Writes::Attributes {
            entity: self.target,
            set: self.set.iter().map(|(attr, _)| attr.clone()).collect(),
            own: vec![token_attribute(name)],
        }
    }

    fn carries(&self, _projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        Some((self.source, self.target))
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        Some(self)
    }

    fn expectation(&self) -> Expectation {
        Expectation::Recomputed {
            absent_is_missing: true,
        }
    }

    fn pruning(&self, name: &str) -> Pruning {
        Pruning::Strip {
            entity: self.target,
            attributes: written(name, self),
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}

/// The target reads the source items of its partition with a query.
impl Recompute for Aggregate {
    fn target(&self) -> EntityId {
        self.target
    }

    fn queried(&self) -> Option<EntityId> {
        Some(self.source)
    }

    fn compute(&self, rules: &Rules, reads: &[Item]) -> Result<TargetState, String> {
        compute(rules, self, reads)
    }

    fn op(&self, rules: &Rules, target: &ItemKey) -> Option<Op> {
        super::query_recompute(rules, self.source, self.target, target)
    }

    fn uses_token(&self) -> bool {
        true
    }
}
