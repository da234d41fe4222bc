//! The compile context every projection kind compiles its section in:
//! the file label and the problems found so far (all reported at once,
//! each naming the file, the part of the spec and what to change), the
//! checks kinds share (entities, templates, conditions, variables), the
//! table and entity compilation, and the fingerprint hash.

use std::collections::{BTreeMap, HashSet};

use super::raw::{RawCondition, RawEntity, RawTable};
use super::{
    Condition, Entity, EntityId, Gsi, KeyPattern, SpecError, SpecErrors, TableSpec, Template,
};
use crate::dynamo::names::RESERVED_PREFIX;
use crate::record::AttributeValue;

/// FNV-1a, 64 bits: stable across builds and machines.
pub(crate) fn fingerprint(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Suggests the closest known name, for "did you mean" hints.
pub(crate) fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    let known: Vec<&str> = known.collect();
    let best = known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .min()
        .filter(|(d, k)| *d <= 2.max(k.len() / 3));
    match best {
        Some((_, k)) => format!(" (did you mean `{k}`?)"),
        None if known.is_empty() => " (none are declared)".to_string(),
        None => format!(" (known: {})", known.join(", ")),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(row[j + 1])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// The compile context: where problems go, and who registered what.
pub(crate) struct Compiler {
    file: String,
    errors: Vec<SpecError>,
    /// The service that registered each projection, when specs were
    /// composed: a counter rides on an edge of its own service only.
    services: Option<BTreeMap<String, String>>,
}

impl Compiler {
    /// A context for the spec labelled `label` (its file, for messages).
    pub(crate) fn new(label: &str) -> Compiler {
        Compiler {
            file: label.to_string(),
            errors: Vec::new(),
            services: None,
        }
    }

    /// A context for specs composed from several services' files:
    /// `services` maps each projection's name to its service.
    pub(crate) fn composed(label: &str, services: BTreeMap<String, String>) -> Compiler {
        Compiler {
            services: Some(services),
            ..Compiler::new(label)
        }
    }

    /// The label of the spec compiled.
    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// The service that registered projection `name`, when specs were
    /// composed.
    pub(crate) fn service(&self, name: &str) -> Option<&str> {
        self.services
            .as_ref()
            .and_then(|services| services.get(name))
            .map(String::as_str)
    }

    /// Every problem found, if any.
    pub(crate) fn finish(self) -> Result<(), SpecErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(SpecErrors(self.errors))
        }
    }

    /// Records one problem of the part `context` of the spec.
    pub(crate) fn error(&mut self, context: impl Into<String>, problem: impl Into<String>) {
        self.errors.push(SpecError {
            file: self.file.clone(),
            context: context.into(),
            problem: problem.into(),
        });
    }

    /// The table, checked.
    pub(crate) fn table(&mut self, t: &RawTable) -> TableSpec {
        if t.name.trim().is_empty() {
            self.error("table", "`name` must not be empty");
        }
        if t.partition_key.trim().is_empty() {
            self.error("table", "`partition_key` must not be empty");
        }
        let sort_key = Some(t.sort_key.clone()).filter(|s| !s.is_empty());
        let mut names = HashSet::new();
        for gsi in &t.gsis {
            let context = format!("table index `{}`", gsi.name);
            if !names.insert(gsi.name.clone()) {
                self.error(&context, "duplicate index name");
            }
            if gsi.partition_key == t.partition_key || Some(&gsi.partition_key) == sort_key.as_ref()
            {
                self.error(
                    &context,
                    "an index key must not be one of the table's own key attributes",
                );
            }
        }
        TableSpec {
            name: t.name.clone(),
            partition_key: t.partition_key.clone(),
            sort_key,
            ttl_attribute: t.ttl_attribute.clone(),
            gsis: t
                .gsis
                .iter()
                .map(|g| Gsi {
                    name: g.name.clone(),
                    partition_key: g.partition_key.clone(),
                    sort_key: g.sort_key.clone(),
                })
                .collect(),
        }
    }

    /// The entities, checked each alone and against one another.
    pub(crate) fn entities(
        &mut self,
        raw: &BTreeMap<String, RawEntity>,
        table: &TableSpec,
    ) -> Vec<Entity> {
        let mut entities = Vec::new();
        for (name, raw_entity) in raw {
            let context = format!("entity `{name}`");
            let pk = match KeyPattern::parse(&raw_entity.pk) {
                Ok(pk) => pk,
                Err(error) => {
                    self.error(&context, format!("pk `{}`: {error}", raw_entity.pk));
                    continue;
                }
            };
            let sk = match (&raw_entity.sk, &table.sort_key) {
                (Some(sk), Some(_)) => match KeyPattern::parse(sk) {
                    Ok(sk) => Some(sk),
                    Err(error) => {
                        self.error(&context, format!("sk `{sk}`: {error}"));
                        continue;
                    }
                },
                (None, Some(sort_key)) => {
                    self.error(
                        &context,
                        format!("`sk` is required: the table has the sort key `{sort_key}`"),
                    );
                    continue;
                }
                (Some(_), None) => {
                    self.error(&context, "`sk` given, but the table has no sort key");
                    continue;
                }
                (None, None) => None,
            };
            let entity = Entity {
                name: name.clone(),
                pk,
                sk,
            };
            let mut seen = HashSet::new();
            for var in entity.vars() {
                if !seen.insert(var) {
                    self.error(
                        &context,
                        format!("variable `{{{var}}}` appears in both pk and sk"),
                    );
                }
            }
            entities.push(entity);
        }
        for (i, a) in entities.iter().enumerate() {
            for b in &entities[i + 1..] {
                let sk_overlap = match (&a.sk, &b.sk) {
                    (Some(x), Some(y)) => x.could_overlap(y),
                    _ => true,
                };
                if a.pk.could_overlap(&b.pk) && sk_overlap {
                    self.error(
                        format!("entity `{}`", b.name),
                        format!(
                            "its key patterns can match the same keys as entity `{}`; give one of them a distinct literal prefix",
                            a.name
                        ),
                    );
                }
            }
        }
        entities
    }

    /// The entity named `name`, or a problem naming the known ones.
    pub(crate) fn entity(
        &mut self,
        context: &str,
        role: &str,
        name: &str,
        entities: &[Entity],
    ) -> Option<EntityId> {
        let found = entities.iter().position(|e| e.name == name);
        if found.is_none() {
            let hint = suggest(name, entities.iter().map(|e| e.name.as_str()));
            let role = if role.is_empty() {
                String::new()
            } else {
                format!("{role} ")
            };
            self.error(context, format!("unknown {role}entity `{name}`{hint}"));
        }
        found
    }

    /// The `source` and `target` entities of a projection that writes
    /// onto another entity than it reads: both known, and not the same
    /// (its output would match its own input).
    pub(crate) fn source_and_target(
        &mut self,
        context: &str,
        source: &str,
        target: &str,
        entities: &[Entity],
    ) -> Option<(EntityId, EntityId)> {
        let source = self.entity(context, "source", source, entities);
        let target = self.entity(context, "target", target, entities);
        let (source, target) = (source?, target?);
        if source == target {
            self.error(
                context,
                "source and target are the same entity: its output would match its own input and loop",
            );
            return None;
        }
        Some((source, target))
    }

    /// Templates for attributes a projection writes, checked.
    pub(crate) fn templates(
        &mut self,
        context: &str,
        what: &str,
        map: &BTreeMap<String, String>,
        table: &TableSpec,
    ) -> Option<Vec<(String, Template)>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (attr, text) in map {
            if table.is_key_attribute(attr) {
                self.error(context, format!("{what} `{attr}` is a table key attribute; a projection cannot change an item's key"));
                ok = false;
                continue;
            }
            if attr.starts_with(RESERVED_PREFIX) {
                self.error(context, format!("{what} `{attr}`: attribute names starting with `{RESERVED_PREFIX}` are the projector's own (counter records); choose another name"));
                ok = false;
                continue;
            }
            match Template::parse(text) {
                Ok(template) => out.push((attr.clone(), template)),
                Err(error) => {
                    self.error(context, format!("{what} `{attr}` = `{text}`: {error}"));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    /// A condition, its values checked.
    pub(crate) fn condition(&mut self, context: &str, raw: &RawCondition) -> Condition {
        let mut out = Vec::new();
        for (name, value) in raw {
            let value = match value {
                toml::Value::Boolean(b) => AttributeValue::Bool(*b),
                toml::Value::String(s) => AttributeValue::S(s.clone()),
                toml::Value::Integer(i) => AttributeValue::N(i.to_string()),
                toml::Value::Float(f) => AttributeValue::N(f.to_string()),
                other => {
                    self.error(
                        context,
                        format!(
                            "`when.{name}` must be a string, number or boolean, not {}",
                            other.type_str()
                        ),
                    );
                    continue;
                }
            };
            out.push((name.clone(), value));
        }
        Condition(out)
    }

    /// Checks that a target's key variables all come from the source's key.
    pub(crate) fn bound_by_source(
        &mut self,
        context: &str,
        source: &Entity,
        target: &Entity,
    ) -> bool {
        let source_vars: HashSet<&str> = source.vars().collect();
        let unbound: Vec<&str> = target.vars().filter(|v| !source_vars.contains(v)).collect();
        if unbound.is_empty() {
            return true;
        }
        self.error(
            context,
            format!(
                "target entity `{}` has key variable(s) {} that the key of source entity `{}` does not bind (it binds: {}); name the variables alike in both patterns",
                target.name,
                unbound.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                source.name,
                source.vars().collect::<Vec<_>>().join(", ")
            ),
        );
        false
    }

    /// Checks that an attribute may be written by a projection: not a key
    /// attribute, not one of the projector's own.
    pub(crate) fn writable(
        &mut self,
        context: &str,
        what: &str,
        attr: &str,
        table: &TableSpec,
    ) -> bool {
        if attr.trim().is_empty() {
            self.error(
                context,
                format!("{what}: an attribute name must not be empty"),
            );
            false
        } else if table.is_key_attribute(attr) {
            self.error(context, format!("{what} `{attr}` is a table key attribute; a projection cannot change an item's key"));
            false
        } else if attr.starts_with(RESERVED_PREFIX) {
            self.error(context, format!("{what} `{attr}`: attribute names starting with `{RESERVED_PREFIX}` are the projector's own (counter records); choose another name"));
            false
        } else {
            true
        }
    }

    /// Checks that the source items of a target are found by one query:
    /// the source's partition key uses only the target's variables.
    pub(crate) fn queryable(&mut self, context: &str, source: &Entity, target: &Entity) -> bool {
        let target_vars: HashSet<&str> = target.vars().collect();
        let unqueryable: Vec<&String> = source
            .pk
            .vars()
            .iter()
            .filter(|v| !target_vars.contains(v.as_str()))
            .collect();
        if unqueryable.is_empty() {
            return true;
        }
        self.error(
            context,
            format!(
                "the source items must be found by a query on the target's variables, but the pk of `{}` (`{}`) needs {} which the target `{}` does not have",
                source.name,
                source.pk,
                unqueryable.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                target.name
            ),
        );
        false
    }

    /// Checks that an inverse edge's target uses every key variable of its
    /// source, so each source item has a reverse item of its own (the
    /// reverse item marks that one source's membership).
    pub(crate) fn covers_source(
        &mut self,
        context: &str,
        source: &Entity,
        target: &Entity,
    ) -> bool {
        let target_vars: HashSet<&str> = target.vars().collect();
        let unused: Vec<&str> = source.vars().filter(|v| !target_vars.contains(v)).collect();
        if unused.is_empty() {
            return true;
        }
        self.error(
            context,
            format!(
                "target entity `{}` does not use the source key variable(s) {}: several `{}` items would share one reverse item; put every variable of the source key into the target's key",
                target.name,
                unused.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                source.name,
            ),
        );
        false
    }
}
