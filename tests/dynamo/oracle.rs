//! An oracle for any spec: what the derived attributes, reverse edges and
//! counters must be, computed from a spec's TOML and the items of a scan,
//! using nothing of the crate (a second, independent reading of what a
//! spec means). It reads what generated specs use: key patterns of
//! literals and variables (each variable followed by a literal or at the
//! end), templates of literals and `{var}`, `{lower(var)}`, `{upper(var)}`
//! and `{trim(var)}`, equality conditions, and the four projection kinds.
//!
//! What it checks, per projection of the spec:
//!
//! - `index-keys`: every item of the entity carries the rendered values;
//! - `denormalize`: every target carries the copies of the source with the
//!   smallest sort key among those that satisfy `when` (an attribute a
//!   plain copy finds absent is absent, and so is every copy when no
//!   source counts);
//! - `inverse-edge`: the items of the target entity are exactly the
//!   reverse items of the sources that satisfy `when`, each with its
//!   copies (attributes it does not copy are not its concern);
//! - `counter`: the shards `0..shards` of each target sum to the number of
//!   sources that satisfy `when`, in the version readers read (the
//!   registry's `readStorage` of the counter, else its name);
//! - `rollup`: every item of the target entity holds the number of sources
//!   its counter counts for the instance the target's key names (0 when
//!   none);
//! - `aggregate`: every item of the target entity holds the totals over the
//!   source items of its partition that satisfy `when`: `count()` always,
//!   `sum`, `min` and `max` when some item has the attribute (numbers as
//!   exact fixed point, strings by their bytes), absent otherwise.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::types::AttributeValue as Av;

use super::model::Attrs;

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Lit(String),
    Var(String),
    /// A variable with transforms applied inside out (`lower(trim(x))`).
    Call(Vec<String>, String),
}

fn parse_parts(text: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Lit(rest[..open].to_string()));
        }
        let close = rest[open..].find('}').expect("a closed brace") + open;
        let mut expr = rest[open + 1..close].trim();
        let mut calls = Vec::new();
        while let Some(paren) = expr.find('(') {
            calls.push(expr[..paren].trim().to_string());
            expr = expr[paren + 1..].trim_end_matches(')').trim();
        }
        parts.push(if calls.is_empty() {
            Part::Var(expr.to_string())
        } else {
            Part::Call(calls, expr.to_string())
        });
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest.to_string()));
    }
    parts
}

/// A key pattern: `N#{a}`, `META`.
#[derive(Debug, Clone)]
struct Pattern(Vec<Part>);

type Vars = BTreeMap<String, String>;

impl Pattern {
    fn matches(&self, value: &str) -> Option<Vars> {
        let mut vars = Vars::new();
        let mut rest = value;
        for (i, part) in self.0.iter().enumerate() {
            match part {
                Part::Lit(lit) => rest = rest.strip_prefix(lit.as_str())?,
                Part::Var(name) => {
                    let end = match self.0.get(i + 1) {
                        Some(Part::Lit(next)) => rest.find(next.as_str())?,
                        _ => rest.len(),
                    };
                    if end == 0 {
                        return None;
                    }
                    vars.insert(name.clone(), rest[..end].to_string());
                    rest = &rest[end..];
                }
                Part::Call(..) => panic!("no transforms in key patterns"),
            }
        }
        rest.is_empty().then_some(vars)
    }

    fn render(&self, vars: &Vars) -> String {
        self.0
            .iter()
            .map(|part| match part {
                Part::Lit(lit) => lit.clone(),
                Part::Var(name) => vars[name].clone(),
                Part::Call(..) => panic!("no transforms in key patterns"),
            })
            .collect()
    }
}

/// Why a template renders nothing.
#[derive(Debug, PartialEq)]
enum Unrendered {
    /// A plain copy of an absent attribute: the copy is absent too.
    Absent,
    /// Cannot render (the record is dead-lettered): the oracle says nothing.
    Unknown,
}

fn text_of(value: &Av) -> Option<String> {
    match value {
        Av::S(text) | Av::N(text) => Some(text.clone()),
        _ => None,
    }
}

/// Renders a template; a plain `{var}` keeps the attribute's type.
fn render(template: &str, vars: &Vars, item: &Attrs) -> Result<Av, Unrendered> {
    let parts = parse_parts(template);
    if let [Part::Var(name)] = parts.as_slice() {
        return match vars.get(name) {
            Some(value) => Ok(Av::S(value.clone())),
            None => item.get(name).cloned().ok_or(Unrendered::Absent),
        };
    }
    render_text(template, vars, item).map(Av::S)
}

/// Renders a template as text (index keys, counter targets).
fn render_text(template: &str, vars: &Vars, item: &Attrs) -> Result<String, Unrendered> {
    let mut out = String::new();
    for part in parse_parts(template) {
        let (calls, name) = match part {
            Part::Lit(lit) => {
                out.push_str(&lit);
                continue;
            }
            Part::Var(name) => (Vec::new(), name),
            Part::Call(calls, name) => (calls, name),
        };
        let mut value = match vars.get(&name) {
            Some(value) => value.clone(),
            None => item
                .get(&name)
                .and_then(text_of)
                .ok_or(Unrendered::Unknown)?,
        };
        for call in calls.iter().rev() {
            value = match call.as_str() {
                "lower" => value.to_lowercase(),
                "upper" => value.to_uppercase(),
                "trim" => value.trim().to_string(),
                other => panic!("the oracle does not read `{other}`"),
            };
        }
        out.push_str(&value);
    }
    Ok(out)
}

fn same(a: &Av, b: &Av) -> bool {
    match (a, b) {
        (Av::N(x), Av::N(y)) => match (fixed(x), fixed(y)) {
            (Some(x), Some(y)) => x == y,
            _ => x.parse::<f64>().ok() == y.parse::<f64>().ok(),
        },
        _ => a == b,
    }
}

fn condition(value: Option<&toml::Value>) -> Vec<(String, Av)> {
    let Some(toml::Value::Table(table)) = value else {
        return Vec::new();
    };
    table
        .iter()
        .map(|(name, value)| {
            let value = match value {
                toml::Value::Boolean(b) => Av::Bool(*b),
                toml::Value::String(s) => Av::S(s.clone()),
                toml::Value::Integer(i) => Av::N(i.to_string()),
                other => panic!("the oracle reads no condition value {other}"),
            };
            (name.clone(), value)
        })
        .collect()
}

fn holds(when: &[(String, Av)], item: &Attrs) -> bool {
    when.iter()
        .all(|(name, want)| item.get(name).is_some_and(|have| same(have, want)))
}

fn templates(value: Option<&toml::Value>) -> Vec<(String, String)> {
    let Some(toml::Value::Table(table)) = value else {
        return Vec::new();
    };
    table
        .iter()
        .map(|(name, value)| {
            (
                name.clone(),
                value.as_str().expect("a template").to_string(),
            )
        })
        .collect()
}

struct Entity {
    pk: Pattern,
    sk: Pattern,
}

/// The items of a scan, by entity, with their key variables.
struct Classified<'a> {
    by_entity: HashMap<String, Vec<(Vars, &'a Attrs)>>,
    by_key: HashMap<(String, String), &'a Attrs>,
    shards: HashMap<String, i64>,
    /// Where readers read each counter, as the lifecycle registry says
    /// (`_ddbp#lifecycle` / `p#<name>`: `readStorage`; absent: its name).
    read_storage: HashMap<String, String>,
}

fn key_of(item: &Attrs) -> (String, String) {
    let text = |name: &str| match item.get(name) {
        Some(Av::S(value)) => value.clone(),
        _ => String::new(),
    };
    (text("PK"), text("SK"))
}

fn classify<'a>(entities: &BTreeMap<String, Entity>, items: &'a [Attrs]) -> Classified<'a> {
    let mut by_entity: HashMap<String, Vec<(Vars, &Attrs)>> = HashMap::new();
    let mut by_key = HashMap::new();
    let mut shards = HashMap::new();
    let mut read_storage = HashMap::new();
    for item in items {
        let (pk, sk) = key_of(item);
        if pk == "_ddbp#lifecycle" {
            if let (Some(name), Some(Av::S(storage))) =
                (sk.strip_prefix("p#"), item.get("readStorage"))
            {
                read_storage.insert(name.to_string(), storage.clone());
            }
        }
        if pk.starts_with("_ddbp#") {
            continue;
        }
        if pk.starts_with("COUNTER#") && sk == "COUNTER" {
            let count = match item.get("count") {
                Some(Av::N(n)) => n.parse().expect("a count"),
                _ => 0,
            };
            shards.insert(pk, count);
            continue;
        }
        by_key.insert((pk.clone(), sk.clone()), item);
        let matches: Vec<(&String, Vars)> = entities
            .iter()
            .filter_map(|(name, entity)| {
                let mut vars = entity.pk.matches(&pk)?;
                vars.extend(entity.sk.matches(&sk)?);
                Some((name, vars))
            })
            .collect();
        assert!(matches.len() <= 1, "{pk}/{sk} matches several entities");
        if let Some((name, vars)) = matches.into_iter().next() {
            by_entity
                .entry(name.clone())
                .or_default()
                .push((vars, item));
        }
    }
    Classified {
        by_entity,
        by_key,
        shards,
        read_storage,
    }
}

fn show(value: Option<&Av>) -> String {
    match value {
        Some(value) => format!("{value:?}"),
        None => "(none)".to_string(),
    }
}

/// Every difference between the table (`items`, a scan) and what the spec
/// (`spec_toml`) computes from its source items.
pub fn differences(spec_toml: &str, items: &[Attrs]) -> Vec<String> {
    let spec: toml::Value = toml::from_str(spec_toml).expect("the spec parses");
    let mut entities = BTreeMap::new();
    for (name, entity) in spec["entities"].as_table().expect("entities") {
        entities.insert(
            name.clone(),
            Entity {
                pk: Pattern(parse_parts(entity["pk"].as_str().expect("pk"))),
                sk: Pattern(parse_parts(entity["sk"].as_str().expect("sk"))),
            },
        );
    }
    let classified = classify(&entities, items);
    let of = |entity: &str| {
        classified
            .by_entity
            .get(entity)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    };
    let mut out = Vec::new();
    let projections = spec
        .get("projections")
        .and_then(|p| p.as_array())
        .cloned()
        .unwrap_or_default();
    for projection in &projections {
        let name = projection["name"].as_str().expect("a name");
        let when = condition(projection.get("when"));
        match projection["kind"].as_str().expect("a kind") {
            "index-keys" => {
                let set = templates(projection.get("set"));
                for (vars, item) in of(projection["entity"].as_str().unwrap()) {
                    for (attr, template) in &set {
                        let Ok(want) = render_text(template, vars, item) else {
                            continue;
                        };
                        if item.get(attr) != Some(&Av::S(want.clone())) {
                            out.push(format!(
                                "{name}: {:?} has {attr} = {}, should be {want:?}",
                                key_of(item),
                                show(item.get(attr))
                            ));
                        }
                    }
                }
            }
            "denormalize" => {
                let copy = templates(projection.get("copy"));
                let target = &entities[projection["target"].as_str().unwrap()];
                let mut chosen: HashMap<(String, String), (String, &Vars, &Attrs)> = HashMap::new();
                for (vars, item) in of(projection["source"].as_str().unwrap()) {
                    if !holds(&when, item) {
                        continue;
                    }
                    let target_key = (target.pk.render(vars), target.sk.render(vars));
                    let sk = key_of(item).1;
                    if chosen
                        .get(&target_key)
                        .is_none_or(|(best, _, _)| sk < *best)
                    {
                        chosen.insert(target_key, (sk, vars, item));
                    }
                }
                for (_, target_item) in of(projection["target"].as_str().unwrap()) {
                    let source = chosen.get(&key_of(target_item));
                    for (attr, template) in &copy {
                        let want = match source {
                            None => Ok(None),
                            Some((_, vars, item)) => match render(template, vars, item) {
                                Ok(value) => Ok(Some(value)),
                                Err(Unrendered::Absent) => Ok(None),
                                Err(Unrendered::Unknown) => Err(()),
                            },
                        };
                        let Ok(want) = want else { continue };
                        let have = target_item.get(attr);
                        let equal = match (have, &want) {
                            (None, None) => true,
                            (Some(have), Some(want)) => same(have, want),
                            _ => false,
                        };
                        if !equal {
                            out.push(format!(
                                "{name}: {:?} has {attr} = {}, should be {}",
                                key_of(target_item),
                                show(have),
                                show(want.as_ref())
                            ));
                        }
                    }
                }
            }
            "inverse-edge" => {
                let copy = templates(projection.get("copy"));
                let target_name = projection["target"].as_str().unwrap();
                let target = &entities[target_name];
                let mut expected = BTreeSet::new();
                for (vars, item) in of(projection["source"].as_str().unwrap()) {
                    if !holds(&when, item) {
                        continue;
                    }
                    let key = (target.pk.render(vars), target.sk.render(vars));
                    expected.insert(key.clone());
                    let Some(edge) = classified.by_key.get(&key) else {
                        out.push(format!(
                            "{name}: no reverse item {key:?} of {:?}",
                            key_of(item)
                        ));
                        continue;
                    };
                    for (attr, template) in &copy {
                        let want = match render(template, vars, item) {
                            Ok(value) => Some(value),
                            Err(Unrendered::Absent) => None,
                            Err(Unrendered::Unknown) => continue,
                        };
                        let have = edge.get(attr);
                        let equal = match (have, &want) {
                            (None, None) => true,
                            (Some(have), Some(want)) => same(have, want),
                            _ => false,
                        };
                        if !equal {
                            out.push(format!(
                                "{name}: {key:?} has {attr} = {}, should be {}",
                                show(have),
                                show(want.as_ref())
                            ));
                        }
                    }
                }
                for (_, item) in of(target_name) {
                    if !expected.contains(&key_of(item)) {
                        out.push(format!(
                            "{name}: reverse item {:?} has no source that counts",
                            key_of(item)
                        ));
                    }
                }
            }
            "counter" => {
                let of_templates = templates(projection.get("of"));
                let shards = projection
                    .get("shards")
                    .and_then(|s| s.as_integer())
                    .unwrap_or(4);
                let mut counts: BTreeMap<String, i64> = BTreeMap::new();
                for (vars, item) in of(projection["source"].as_str().unwrap()) {
                    if !holds(&when, item) {
                        continue;
                    }
                    let values: Vec<String> = of_templates
                        .iter()
                        .map(|(_, t)| render_text(t, vars, &Attrs::new()).expect("key variables"))
                        .collect();
                    *counts.entry(values.join("#")).or_insert(0) += 1;
                }
                let storage = classified
                    .read_storage
                    .get(name)
                    .map_or(name, String::as_str);
                let prefix = format!("COUNTER#{storage}#");
                let mut actual: BTreeMap<String, i64> = BTreeMap::new();
                for (pk, count) in &classified.shards {
                    let Some((values, shard)) = pk
                        .strip_prefix(&prefix)
                        .and_then(|rest| rest.rsplit_once('#'))
                    else {
                        continue;
                    };
                    if shard.parse::<i64>().is_ok_and(|shard| shard < shards) {
                        *actual.entry(values.to_string()).or_insert(0) += count;
                    }
                }
                let targets: BTreeSet<&String> = counts.keys().chain(actual.keys()).collect();
                for target in targets {
                    let want = counts.get(target).copied().unwrap_or(0);
                    let have = actual.get(target).copied().unwrap_or(0);
                    if want != have {
                        out.push(format!(
                            "{name}: counter {target} is {have}, should be {want}"
                        ));
                    }
                }
            }
            "rollup" => {
                let counter_name = projection["counter"].as_str().expect("a counter");
                let counter = projections
                    .iter()
                    .find(|p| p["name"].as_str() == Some(counter_name))
                    .expect("the rollup's counter is in the spec");
                let counter_when = condition(counter.get("when"));
                let of_templates = templates(counter.get("of"));
                let mut counts: BTreeMap<Vars, i64> = BTreeMap::new();
                for (vars, item) in of(counter["source"].as_str().unwrap()) {
                    if !holds(&counter_when, item) {
                        continue;
                    }
                    let instance: Vars = of_templates
                        .iter()
                        .map(|(name, t)| {
                            let value = render_text(t, vars, &Attrs::new()).expect("key variables");
                            (name.clone(), value)
                        })
                        .collect();
                    *counts.entry(instance).or_insert(0) += 1;
                }
                let attribute = projection["attribute"].as_str().expect("an attribute");
                for (vars, item) in of(projection["target"].as_str().unwrap()) {
                    let want = counts.get(vars).copied().unwrap_or(0);
                    let have = item.get(attribute);
                    if !have.is_some_and(|have| same(have, &Av::N(want.to_string()))) {
                        out.push(format!(
                            "{name}: {:?} has {attribute} = {}, should be {want}",
                            key_of(item),
                            show(have)
                        ));
                    }
                }
            }
            "aggregate" => {
                let set = templates(projection.get("set"));
                let target = &entities[projection["target"].as_str().unwrap()];
                let mut groups: HashMap<(String, String), Vec<(&Vars, &Attrs)>> = HashMap::new();
                for (vars, item) in of(projection["source"].as_str().unwrap()) {
                    if holds(&when, item) {
                        let key = (target.pk.render(vars), target.sk.render(vars));
                        groups.entry(key).or_default().push((vars, *item));
                    }
                }
                for (_, target_item) in of(projection["target"].as_str().unwrap()) {
                    let group = groups
                        .get(&key_of(target_item))
                        .map(Vec::as_slice)
                        .unwrap_or(&[]);
                    for (attr, call) in &set {
                        let Ok(want) = total(call, group) else {
                            continue;
                        };
                        let have = target_item.get(attr);
                        let equal = match (have, &want) {
                            (None, None) => true,
                            (Some(have), Some(want)) => same(have, want),
                            _ => false,
                        };
                        if !equal {
                            out.push(format!(
                                "{name}: {:?} has {attr} = {}, should be {}",
                                key_of(target_item),
                                show(have),
                                show(want.as_ref())
                            ));
                        }
                    }
                }
            }
            other => panic!("the oracle reads no kind `{other}`"),
        }
    }
    out
}

/// A number as fixed point with six decimals (what generated items hold).
fn fixed(text: &str) -> Option<i128> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 6 {
        return None;
    }
    let negative = whole.starts_with('-');
    let digits = format!("{}{fraction:0<6}", whole.trim_start_matches('-'));
    let value: i128 = digits.parse().ok()?;
    Some(if negative { -value } else { value })
}

fn unfixed(value: i128) -> String {
    let sign = if value < 0 { "-" } else { "" };
    let value = value.abs();
    let (whole, fraction) = (value / 1_000_000, value % 1_000_000);
    let fraction = format!("{fraction:06}");
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{fraction}")
    }
}

/// What `sum(a)`, `count()`, `min(a)` or `max(a)` is over `group`
/// (`Err`: an item the function cannot read, dead-lettered: no opinion).
fn total(call: &str, group: &[(&Vars, &Attrs)]) -> Result<Option<Av>, ()> {
    let (function, rest) = call.split_once('(').expect("a call");
    let arg = rest.trim_end_matches(')').trim();
    if function == "count" {
        return Ok(Some(Av::N(group.len().to_string())));
    }
    let mut numbers = Vec::new();
    let mut texts = Vec::new();
    for (vars, item) in group {
        match vars
            .get(arg)
            .map(|v| Av::S(v.clone()))
            .or_else(|| item.get(arg).cloned())
        {
            None => {}
            Some(Av::N(n)) => numbers.push(fixed(&n).ok_or(())?),
            Some(Av::S(text)) if function != "sum" => texts.push(text),
            Some(_) => return Err(()),
        }
    }
    if !numbers.is_empty() && !texts.is_empty() {
        return Err(());
    }
    Ok(match function {
        "sum" => (!numbers.is_empty()).then(|| Av::N(unfixed(numbers.iter().sum()))),
        "min" if texts.is_empty() => numbers.iter().min().map(|n| Av::N(unfixed(*n))),
        "max" if texts.is_empty() => numbers.iter().max().map(|n| Av::N(unfixed(*n))),
        "min" => texts
            .into_iter()
            .min_by(|a, b| a.as_bytes().cmp(b.as_bytes()))
            .map(Av::S),
        "max" => texts
            .into_iter()
            .max_by(|a, b| a.as_bytes().cmp(b.as_bytes()))
            .map(Av::S),
        other => panic!("the oracle reads no function `{other}`"),
    })
}

#[test]
fn the_oracle_totals_exactly() {
    let vars = Vars::new();
    let items: Vec<Attrs> = ["0.1", "0.2", "12345678901234.5"]
        .iter()
        .map(|n| super::model::attrs(&[("n", Av::N(n.to_string())), ("k", Av::S(n.to_string()))]))
        .collect();
    let group: Vec<(&Vars, &Attrs)> = items.iter().map(|item| (&vars, item)).collect();
    assert_eq!(
        total("sum(n)", &group),
        Ok(Some(Av::N("12345678901234.8".into())))
    );
    assert_eq!(total("count()", &group), Ok(Some(Av::N("3".into()))));
    assert_eq!(
        total("max(n)", &group),
        Ok(Some(Av::N("12345678901234.5".into())))
    );
    assert_eq!(
        total("max(k)", &group),
        Ok(Some(Av::S("12345678901234.5".into())))
    );
    assert_eq!(total("min(k)", &group), Ok(Some(Av::S("0.1".into()))));
    assert_eq!(total("sum(missing)", &group), Ok(None));
}

#[test]
fn the_oracle_reads_patterns_and_templates_as_specs_mean_them() {
    let pattern = Pattern(parse_parts("N#{a}"));
    assert_eq!(pattern.matches("N#a1").unwrap()["a"], "a1");
    assert!(pattern.matches("M#a1").is_none());
    assert!(pattern.matches("N#").is_none());
    let two = Pattern(parse_parts("X#{a}#Y#{b}"));
    let vars = two.matches("X#1#Y#2").unwrap();
    assert_eq!((vars["a"].as_str(), vars["b"].as_str()), ("1", "2"));
    assert_eq!(two.render(&vars), "X#1#Y#2");
    let item: Attrs = [("x".to_string(), Av::S(" Sam ".into()))].into();
    assert_eq!(
        render_text("E#{lower(trim(x))}#{a}", &vars, &item),
        Ok("E#sam#1".to_string())
    );
    assert_eq!(render("{n}", &vars, &item), Err(Unrendered::Absent));
    assert_eq!(render("{x}", &vars, &item), Ok(Av::S(" Sam ".into())));
    assert_eq!(render_text("{n}-x", &vars, &item), Err(Unrendered::Unknown));
}
