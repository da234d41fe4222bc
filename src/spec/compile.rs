//! The compiler: from [`RawSpec`] to a validated [`Spec`], every problem
//! found at once, each naming the file, the part of the spec and what to
//! change; and the fingerprints that say when a definition changed.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::raw::{RawCondition, RawInvariant, RawProjection, RawSpec};
use super::{
    old_version_of, storage_generation, Condition, Counter, Denormalize, Entity, EntityId, Gsi,
    IndexKeys, Invariant, InvariantKind, InverseEdge, KeyPattern, Marker, Projection, ProjectionId,
    ProjectionKind, RepairPolicy, Services, Spec, SpecError, SpecErrors, TableSpec, Template,
    MAX_SHARDS,
};
use crate::dynamo::names::RESERVED_PREFIX;
use crate::kinds::Recomputed;
use crate::plan::CustomProjection;
use crate::record::AttributeValue;

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
    let names: Vec<String> = projections.iter().map(|p| p.name.clone()).collect();
    let extras: Vec<String> = projections
        .iter()
        .map(|projection| {
            let mut parts = vec![format!(
                "keys={}/{}",
                table.partition_key,
                table.sort_key.as_deref().unwrap_or("")
            )];
            match &projection.kind {
                ProjectionKind::IndexKeys(p) => parts.push(pattern(p.entity)),
                ProjectionKind::Denormalize(p) => {
                    parts.push(pattern(p.source));
                    parts.push(pattern(p.target));
                }
                ProjectionKind::InverseEdge(p) => {
                    parts.push(pattern(p.source));
                    parts.push(pattern(p.target));
                }
                ProjectionKind::Counter(p) => {
                    parts.push(pattern(p.source));
                    match p.marker {
                        Marker::Edge(edge) => {
                            parts.push(format!("rides on {}", names[edge]));
                            if let ProjectionKind::InverseEdge(e) = &projections[edge].kind {
                                parts.push(pattern(e.target));
                            }
                        }
                        Marker::Own => parts.push("own markers".to_string()),
                    }
                }
                ProjectionKind::Recomputed(p) => {
                    parts.extend(p.entities().into_iter().map(pattern));
                }
                ProjectionKind::Custom(_) => {}
            }
            parts.join(";")
        })
        .collect();
    for (projection, extra) in projections.iter_mut().zip(extras) {
        projection.fingerprint = fingerprint(&format!("{:016x};{extra}", projection.fingerprint));
    }
}

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
fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
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

pub(crate) struct Compiler {
    file: String,
    errors: Vec<SpecError>,
    /// Who registered each projection, when specs were composed: a
    /// counter rides on an edge of its own service only.
    services: Option<Services>,
}

impl Compiler {
    pub(super) fn new(label: &str) -> Compiler {
        Compiler {
            file: label.to_string(),
            errors: Vec::new(),
            services: None,
        }
    }

    /// A compiler of specs composed from several services' files.
    pub(super) fn composed(label: &str, services: Services) -> Compiler {
        Compiler {
            services: Some(services),
            ..Compiler::new(label)
        }
    }

    pub(crate) fn error(&mut self, context: impl Into<String>, problem: impl Into<String>) {
        self.errors.push(SpecError {
            file: self.file.clone(),
            context: context.into(),
            problem: problem.into(),
        });
    }

    pub(super) fn compile(
        mut self,
        raw: RawSpec,
        custom: Vec<Arc<dyn CustomProjection>>,
    ) -> Result<Spec, SpecErrors> {
        if raw.service.trim().is_empty() {
            self.error("", "`service` must name the service that owns the table");
        }
        let table = self.table(&raw);
        let entities = self.entities(&raw, &table);
        let mut projections = Vec::new();
        let mut seen = HashSet::new();
        for raw_projection in &raw.projections {
            let name = raw_projection.name().to_string();
            let context = format!("projection `{name}`");
            if name.trim().is_empty() {
                self.error(
                    format!("{} projection", raw_projection.kind()),
                    "`name` must not be empty",
                );
                continue;
            }
            if !seen.insert(name.clone()) {
                self.error(
                    &context,
                    "duplicate projection name; names must be unique in a spec",
                );
                continue;
            }
            let old_version = matches!(
                raw_projection,
                RawProjection::Counter {
                    storage: Some(_),
                    ..
                }
            ) && old_version_of(&name).is_some();
            if name.contains('~') && !old_version {
                self.error(
                    &context,
                    "a projection's name must not contain `~`: the tool names a counter's versions with it",
                );
                continue;
            }
            if let Some(kind) = self.projection(
                raw_projection,
                &context,
                &table,
                &entities,
                &raw.projections,
            ) {
                projections.push(Projection {
                    name,
                    kind,
                    // Set below, once every projection is known. Where a
                    // counter is stored is not part of its definition.
                    fingerprint: fingerprint(
                        &serde_json::to_string(&raw_projection.definition()).unwrap_or_default(),
                    ),
                });
            }
        }
        for projection in custom {
            let name = projection.name().to_string();
            let context = format!("projection `{name}`");
            if !seen.insert(name.clone()) {
                self.error(
                    &context,
                    "duplicate projection name; names must be unique in a spec",
                );
                continue;
            }
            if !entities
                .iter()
                .any(|e| e.name == projection.source_entity())
            {
                let hint = suggest(
                    projection.source_entity(),
                    entities.iter().map(|e| e.name.as_str()),
                );
                self.error(
                    &context,
                    format!("unknown entity `{}`{hint}", projection.source_entity()),
                );
                continue;
            }
            // A Rust projection's definition is its code: its name and
            // source stand for it.
            let fingerprint = fingerprint(&format!(
                "custom\u{1}{name}\u{1}{}\u{1}{}",
                projection.source_entity(),
                projection.version()
            ));
            projections.push(Projection {
                name,
                kind: ProjectionKind::Custom(projection),
                fingerprint,
            });
        }
        self.assign_markers(&mut projections, &table);
        set_fingerprints(&mut projections, &entities, &table);
        crate::kinds::settle(&mut projections);
        self.check_loops(&projections, &entities);
        self.check_attributes(&projections, &entities);
        self.check_derived_items(&projections, &entities, &table);
        let invariants = self.invariants(&raw, &projections, &entities, &table, &seen);
        if !self.errors.is_empty() {
            return Err(SpecErrors(self.errors));
        }
        let interested = interested(&projections, &entities);
        let services = self
            .services
            .take()
            .unwrap_or_else(|| Services::single(&raw, &self.file));
        Ok(Spec {
            file: self.file,
            service: raw.service,
            table,
            entities,
            projections,
            invariants,
            interested,
            raw: RawSpec::default(),
            frozen: Vec::new(),
            services,
        })
    }

    fn invariants(
        &mut self,
        raw: &RawSpec,
        projections: &[Projection],
        entities: &[Entity],
        table: &TableSpec,
        projection_names: &HashSet<String>,
    ) -> Vec<Invariant> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for raw_invariant in &raw.invariants {
            let name = raw_invariant.name().to_string();
            let context = format!("invariant `{name}`");
            if name.trim().is_empty() {
                self.error(
                    format!("{} invariant", raw_invariant.kind()),
                    "`name` must not be empty",
                );
                continue;
            }
            if !seen.insert(name.clone()) || projection_names.contains(&name) {
                self.error(
                    &context,
                    "duplicate name; invariant and projection names must be unique in a spec",
                );
                continue;
            }
            if name.contains('|') {
                self.error(&context, "the name must not contain `|`");
                continue;
            }
            if let Some(invariant) =
                self.invariant(raw, raw_invariant, &context, projections, entities, table)
            {
                out.push(Invariant {
                    name,
                    entity: invariant.0,
                    kind: invariant.1,
                });
            }
        }
        out
    }

    fn invariant(
        &mut self,
        spec: &RawSpec,
        raw: &RawInvariant,
        context: &str,
        projections: &[Projection],
        entities: &[Entity],
        table: &TableSpec,
    ) -> Option<(EntityId, InvariantKind)> {
        match raw {
            RawInvariant::ExactlyOne {
                entity,
                when,
                repair,
                ..
            }
            | RawInvariant::AtMostOne {
                entity,
                when,
                repair,
                ..
            } => {
                let entity = self.entity(context, "", entity, entities)?;
                if when.is_empty() {
                    self.error(context, "`when` is empty: name the condition that at most one item per partition may satisfy (`when = { isPrimary = true }`)");
                    return None;
                }
                let when = self.condition(context, when);
                let repair = match repair.as_deref() {
                    None => None,
                    Some("keep-latest") => Some(RepairPolicy::KeepLatest),
                    Some(other) => {
                        self.error(
                            context,
                            format!(
                                "unknown repair policy `{other}`{}",
                                suggest(other, ["keep-latest"].into_iter())
                            ),
                        );
                        return None;
                    }
                };
                Some((
                    entity,
                    InvariantKind::Count {
                        when,
                        exactly: matches!(raw, RawInvariant::ExactlyOne { .. }),
                        repair,
                    },
                ))
            }
            RawInvariant::Implies {
                entity,
                premise,
                then,
                ..
            } => {
                let entity = self.entity(context, "", entity, entities)?;
                if premise.is_empty() || then.is_empty() {
                    self.error(context, "`if` and `then` must each name at least one attribute (`if = { isPrimary = true }`, `then = { isVerified = true }`)");
                    return None;
                }
                let premise = self.condition(context, premise);
                let then = self.condition(context, then);
                Some((entity, InvariantKind::Implies { premise, then }))
            }
            RawInvariant::Unique { entity, index, .. } => {
                let entity = self.entity(context, "", entity, entities)?;
                let Some(gsi) = table.gsis.iter().find(|g| &g.name == index) else {
                    let hint = suggest(index, table.gsis.iter().map(|g| g.name.as_str()));
                    self.error(context, format!("unknown index `{index}`{hint}"));
                    return None;
                };
                let derived = projections
                    .iter()
                    .enumerate()
                    .find_map(|(id, p)| match &p.kind {
                        ProjectionKind::IndexKeys(keys) if keys.entity == entity => keys
                            .set
                            .iter()
                            .find(|(attr, _)| *attr == gsi.partition_key)
                            .map(|(_, template)| (id, template.clone())),
                        ProjectionKind::IndexKeys(_)
                        | ProjectionKind::Denormalize(_)
                        | ProjectionKind::InverseEdge(_)
                        | ProjectionKind::Counter(_)
                        | ProjectionKind::Recomputed(_)
                        | ProjectionKind::Custom(_) => None,
                    });
                let Some((projection, template)) = derived else {
                    // A projection that would derive it but did not compile
                    // is reported already; do not pile on.
                    let entity_name = &entities[entity].name;
                    let broken = spec.projections.iter().any(|p| {
                        matches!(p, RawProjection::IndexKeys { entity: e, set, .. }
                            if e == entity_name && set.contains_key(&gsi.partition_key))
                    });
                    if broken {
                        return None;
                    }
                    self.error(
                        context,
                        format!(
                            "no index-keys projection of entity `{}` derives `{}`, the partition key of {index}; uniqueness is checked through that derived key",
                            entities[entity].name, gsi.partition_key
                        ),
                    );
                    return None;
                };
                Some((
                    entity,
                    InvariantKind::Unique {
                        index: index.clone(),
                        attribute: gsi.partition_key.clone(),
                        projection,
                        template,
                    },
                ))
            }
        }
    }

    fn table(&mut self, raw: &RawSpec) -> TableSpec {
        let t = &raw.table;
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

    fn entities(&mut self, raw: &RawSpec, table: &TableSpec) -> Vec<Entity> {
        let mut entities = Vec::new();
        for (name, raw_entity) in &raw.entities {
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

    fn templates(
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
    fn covers_source(&mut self, context: &str, source: &Entity, target: &Entity) -> bool {
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

    fn projection(
        &mut self,
        raw: &RawProjection,
        context: &str,
        table: &TableSpec,
        entities: &[Entity],
        all: &[RawProjection],
    ) -> Option<ProjectionKind> {
        match raw {
            RawProjection::Rollup(raw) => {
                crate::kinds::rollup::compile(raw, self, context, table, entities, all)
                    .map(|p| ProjectionKind::Recomputed(Recomputed::Rollup(p)))
            }
            RawProjection::Aggregate(raw) => {
                crate::kinds::aggregate::compile(raw, self, context, table, entities)
                    .map(|p| ProjectionKind::Recomputed(Recomputed::Aggregate(p)))
            }
            RawProjection::IndexKeys { entity, set, .. } => {
                let entity = self.entity(context, "", entity, entities)?;
                if set.is_empty() {
                    self.error(
                        context,
                        "`set` is empty: name at least one attribute to derive",
                    );
                    return None;
                }
                let set = self.templates(context, "set", set, table)?;
                let key_vars: HashSet<&str> = entities[entity].vars().collect();
                let mut reads = Vec::new();
                for (attr, template) in &set {
                    for name in template.names() {
                        if set.iter().any(|(a, _)| a == name) {
                            self.error(
                                context,
                                format!("`{attr}` = `{template}` reads `{name}`, which this projection writes: every write would change its own input and loop"),
                            );
                        } else if !key_vars.contains(name) && !reads.iter().any(|r| r == name) {
                            reads.push(name.to_string());
                        }
                    }
                }
                Some(ProjectionKind::IndexKeys(IndexKeys { entity, set, reads }))
            }
            RawProjection::Denormalize {
                source,
                target,
                when,
                copy,
                ..
            } => {
                let source = self.entity(context, "source", source, entities);
                let target = self.entity(context, "target", target, entities);
                let (source, target) = (source?, target?);
                if source == target {
                    self.error(context, "source and target are the same entity: its output would match its own input and loop");
                    return None;
                }
                if copy.is_empty() {
                    self.error(
                        context,
                        "`copy` is empty: name at least one attribute to copy",
                    );
                    return None;
                }
                let bound = self.bound_by_source(context, &entities[source], &entities[target]);
                let target_vars: HashSet<&str> = entities[target].vars().collect();
                let unqueryable: Vec<&String> = entities[source]
                    .pk
                    .vars()
                    .iter()
                    .filter(|v| !target_vars.contains(v.as_str()))
                    .collect();
                if !unqueryable.is_empty() {
                    self.error(
                        context,
                        format!(
                            "the source items must be found by a query on the target's variables, but the pk of `{}` (`{}`) needs {} which the target `{}` does not have",
                            entities[source].name,
                            entities[source].pk,
                            unqueryable.iter().map(|v| format!("`{{{v}}}`")).collect::<Vec<_>>().join(", "),
                            entities[target].name
                        ),
                    );
                }
                let when = self.condition(context, when);
                let copy = self.templates(context, "copy", copy, table)?;
                if !bound || !unqueryable.is_empty() {
                    return None;
                }
                let reads = reads_of(&when, &copy, &entities[source]);
                Some(ProjectionKind::Denormalize(Denormalize {
                    source,
                    target,
                    when,
                    copy,
                    reads,
                }))
            }
            RawProjection::InverseEdge {
                source,
                target,
                when,
                copy,
                ..
            } => {
                let source = self.entity(context, "source", source, entities);
                let target = self.entity(context, "target", target, entities);
                let (source, target) = (source?, target?);
                if source == target {
                    self.error(context, "source and target are the same entity: its output would match its own input and loop");
                    return None;
                }
                let bound = self.bound_by_source(context, &entities[source], &entities[target]);
                let one_to_one = self.covers_source(context, &entities[source], &entities[target]);
                let when = self.condition(context, when);
                let copy = self.templates(context, "copy", copy, table)?;
                if !bound || !one_to_one {
                    return None;
                }
                let reads = reads_of(&when, &copy, &entities[source]);
                Some(ProjectionKind::InverseEdge(InverseEdge {
                    source,
                    target,
                    when,
                    copy,
                    reads,
                }))
            }
            RawProjection::Counter {
                name,
                source,
                of,
                when,
                shards,
                storage,
            } => {
                let source = self.entity(context, "source", source, entities)?;
                if raw.name().contains('#') {
                    self.error(
                        context,
                        "a counter's name must not contain `#`: it separates the parts of its shard and marker keys",
                    );
                    return None;
                }
                let storage = storage.clone().unwrap_or_else(|| name.clone());
                if storage_generation(name, &storage).is_none() {
                    self.error(
                        context,
                        format!("`storage = \"{storage}\"` is not one of this counter's: the tool sets it (to `{name}` or `{name}~N`); remove it from the file"),
                    );
                    return None;
                }
                if !(1..=MAX_SHARDS).contains(shards) {
                    self.error(
                        context,
                        format!("shards = {shards} is out of range: use 1 to {MAX_SHARDS}"),
                    );
                }
                let when = self.condition(context, when);
                let of = self.templates(context, "of", of, table)?;
                let key_vars: HashSet<&str> = entities[source].vars().collect();
                for (name, template) in &of {
                    for read in template.names() {
                        if !key_vars.contains(read) {
                            self.error(
                                context,
                                format!(
                                    "`of.{name}` = `{template}` reads `{read}`, which is not a key variable of `{}` (it has: {}); a counter's target must come from the source key so that removals find it",
                                    entities[source].name,
                                    entities[source].vars().collect::<Vec<_>>().join(", ")
                                ),
                            );
                        }
                    }
                }
                if !(1..=MAX_SHARDS).contains(shards) {
                    return None;
                }
                Some(ProjectionKind::Counter(Counter {
                    source,
                    of,
                    when,
                    shards: *shards,
                    marker: Marker::Own,
                    storage,
                }))
            }
        }
    }

    /// A counter whose source has an inverse edge with the same condition
    /// uses that edge as its membership marker (one write less per change).
    fn assign_markers(&mut self, projections: &mut [Projection], table: &TableSpec) {
        let edges: Vec<(ProjectionId, String, EntityId, Condition)> = projections
            .iter()
            .enumerate()
            .filter_map(|(id, p)| match &p.kind {
                ProjectionKind::InverseEdge(edge) => {
                    Some((id, p.name.clone(), edge.source, edge.when.clone()))
                }
                ProjectionKind::IndexKeys(_)
                | ProjectionKind::Denormalize(_)
                | ProjectionKind::Counter(_)
                | ProjectionKind::Recomputed(_)
                | ProjectionKind::Custom(_) => None,
            })
            .collect();
        // A counter rides on an edge of its own service only: another
        // team's spec joining the table must not move its records (nor
        // change its definition), and that team may retire the edge.
        let service = |name: &str| self.services.as_ref().and_then(|s| s.of(name));
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
                    let names = |set: &[(String, Template)]| -> Vec<String> {
                        set.iter().map(|(attr, _)| attr.clone()).collect()
                    };
                    let written = match &writer.kind {
                        ProjectionKind::InverseEdge(e) if e.target == edge.target => names(&e.copy),
                        ProjectionKind::Denormalize(d) if d.target == edge.target => names(&d.copy),
                        ProjectionKind::IndexKeys(k) if k.entity == edge.target => names(&k.set),
                        ProjectionKind::Recomputed(r) if r.target() == edge.target => {
                            r.attributes()
                        }
                        ProjectionKind::IndexKeys(_)
                        | ProjectionKind::Denormalize(_)
                        | ProjectionKind::InverseEdge(_)
                        | ProjectionKind::Counter(_)
                        | ProjectionKind::Recomputed(_)
                        | ProjectionKind::Custom(_) => continue,
                    };
                    if written.iter().any(|attr| attr == ttl) {
                        self.error(
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

    /// Rules out projections whose writes feed back into their own inputs.
    fn check_loops(&mut self, projections: &[Projection], entities: &[Entity]) {
        // Edges source entity -> written entity, labelled by projection.
        let mut graph: HashMap<EntityId, Vec<(EntityId, &str)>> = HashMap::new();
        for projection in projections {
            let edge = match &projection.kind {
                ProjectionKind::Denormalize(p) => Some((p.source, p.target)),
                ProjectionKind::InverseEdge(p) => Some((p.source, p.target)),
                ProjectionKind::Recomputed(p) => p.reads_from(projections).map(|s| (s, p.target())),
                ProjectionKind::IndexKeys(_)
                | ProjectionKind::Counter(_)
                | ProjectionKind::Custom(_) => None,
            };
            if let Some((from, to)) = edge {
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
                            self.error(
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
    fn check_attributes(&mut self, projections: &[Projection], entities: &[Entity]) {
        // One inverse edge per target entity: a reverse item marks one
        // edge's membership; two edges would create and delete it in turn.
        let mut reverse: BTreeMap<EntityId, Vec<&str>> = BTreeMap::new();
        for projection in projections {
            if let ProjectionKind::InverseEdge(edge) = &projection.kind {
                reverse
                    .entry(edge.target)
                    .or_default()
                    .push(projection.name.as_str());
            }
        }
        for (entity, names) in &reverse {
            if let [first, rest @ ..] = names.as_slice() {
                for name in rest {
                    self.error(
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
            let names = |set: &[(String, Template)]| -> Vec<String> {
                set.iter().map(|(attr, _)| attr.clone()).collect()
            };
            let (entity, written) = match &projection.kind {
                ProjectionKind::IndexKeys(p) => (p.entity, names(&p.set)),
                ProjectionKind::Denormalize(p) => (p.target, names(&p.copy)),
                ProjectionKind::InverseEdge(p) => (p.target, names(&p.copy)),
                ProjectionKind::Recomputed(p) => (p.target(), p.attributes()),
                ProjectionKind::Counter(_) | ProjectionKind::Custom(_) => continue,
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
                self.error(
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
                ProjectionKind::Denormalize(_)
                | ProjectionKind::InverseEdge(_)
                | ProjectionKind::Counter(_)
                | ProjectionKind::Recomputed(_)
                | ProjectionKind::Custom(_) => None,
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
                self.error(
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
        &mut self,
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
                        self.error(
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
}

fn reads_of(when: &Condition, copy: &[(String, Template)], source: &Entity) -> Vec<String> {
    let key_vars: HashSet<&str> = source.vars().collect();
    let mut reads: Vec<String> = when.0.iter().map(|(name, _)| name.clone()).collect();
    for (_, template) in copy {
        for name in template.names() {
            if !key_vars.contains(name) && !reads.iter().any(|r| r == name) {
                reads.push(name.to_string());
            }
        }
    }
    reads
}

fn interested(projections: &[Projection], entities: &[Entity]) -> Vec<Vec<ProjectionId>> {
    let mut out = vec![Vec::new(); entities.len()];
    for (id, projection) in projections.iter().enumerate() {
        let mut add = |entity: EntityId| {
            if !out[entity].contains(&id) {
                out[entity].push(id);
            }
        };
        match &projection.kind {
            ProjectionKind::IndexKeys(p) => add(p.entity),
            ProjectionKind::Denormalize(p) => {
                add(p.source);
                add(p.target);
            }
            ProjectionKind::InverseEdge(p) => add(p.source),
            ProjectionKind::Counter(p) => add(p.source),
            ProjectionKind::Recomputed(p) => p.entities().into_iter().for_each(&mut add),
            ProjectionKind::Custom(p) => {
                if let Some(entity) = entities.iter().position(|e| e.name == p.source_entity()) {
                    add(entity);
                }
            }
        }
    }
    out
}
