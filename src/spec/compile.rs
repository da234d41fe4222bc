//! The compile driver: from [`RawSpec`] to a validated [`Spec`], every
//! problem found at once, each naming the file, the part of the spec and
//! what to change. The table and entities compile in the schema's context
//! ([`crate::schema`]), each projection through its kind and the checks
//! across projections in [`crate::kinds`]; the invariants compile here.

use std::collections::HashSet;
use std::sync::Arc;

use super::raw::{RawInvariant, RawProjection, RawSpec};
use super::{
    old_version_of, Invariant, InvariantKind, Projection, ProjectionKind, RepairPolicy, Rules,
    Services, Spec,
};
use crate::kinds::custom::{self, CustomProjection};
use crate::schema::{fingerprint, suggest, Compiler, Entity, EntityId, SpecErrors, TableSpec};

/// Compiles `raw` (labelled `label` in messages) with projections
/// written in Rust; `services` says who registered what when specs were
/// composed.
pub(super) fn compile(
    raw: RawSpec,
    label: &str,
    custom: Vec<Arc<dyn CustomProjection>>,
    services: Option<Services>,
) -> Result<Spec, SpecErrors> {
    let mut compiler = match &services {
        // Each projection's service, looked up as `Services` does (a
        // counter's old version is its counter's).
        Some(services) => Compiler::composed(
            label,
            raw.projections
                .iter()
                .map(|p| p.name())
                .chain(custom.iter().map(|p| p.name()))
                .filter_map(|name| Some((name.to_string(), services.of(name)?.to_string())))
                .collect(),
        ),
        None => Compiler::new(label),
    };
    let cx = &mut compiler;
    if raw.service.trim().is_empty() {
        cx.error("", "`service` must name the service that owns the table");
    }
    let table = cx.table(&raw.table);
    let entities = cx.entities(&raw.entities, &table);
    let mut projections = Vec::new();
    let mut seen = HashSet::new();
    for raw_projection in &raw.projections {
        let name = raw_projection.name().to_string();
        let context = format!("projection `{name}`");
        if name.trim().is_empty() {
            cx.error(
                format!("{} projection", raw_projection.kind()),
                "`name` must not be empty",
            );
            continue;
        }
        if !seen.insert(name.clone()) {
            cx.error(
                &context,
                "duplicate projection name; names must be unique in a spec",
            );
            continue;
        }
        let old_version = matches!(raw_projection, RawProjection::Counter(c) if c.storage.is_some())
            && old_version_of(&name).is_some();
        if name.contains('~') && !old_version {
            cx.error(
                &context,
                "a projection's name must not contain `~`: the tool names a counter's versions with it",
            );
            continue;
        }
        if let Some(kind) =
            raw_projection.compile(cx, &context, &table, &entities, &raw.projections)
        {
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
            cx.error(
                &context,
                "duplicate projection name; names must be unique in a spec",
            );
            continue;
        }
        projections.extend(custom::compile(projection, cx, &context, &entities));
    }
    crate::kinds::checks::check(cx, &mut projections, &entities, &table);
    let invariants = invariants(cx, &raw, &projections, &entities, &table, &seen);
    let file = cx.file().to_string();
    compiler.finish()?;
    let services = services.unwrap_or_else(|| Services::single(&raw, &file));
    Ok(Spec {
        file,
        service: raw.service,
        rules: Rules::new(table, entities, projections),
        invariants,
        raw: RawSpec::default(),
        services,
    })
}

fn invariants(
    cx: &mut Compiler,
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
            cx.error(
                format!("{} invariant", raw_invariant.kind()),
                "`name` must not be empty",
            );
            continue;
        }
        if !seen.insert(name.clone()) || projection_names.contains(&name) {
            cx.error(
                &context,
                "duplicate name; invariant and projection names must be unique in a spec",
            );
            continue;
        }
        if name.contains('|') {
            cx.error(&context, "the name must not contain `|`");
            continue;
        }
        if let Some(invariant) = invariant(
            cx,
            raw,
            raw_invariant,
            &context,
            projections,
            entities,
            table,
        ) {
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
    cx: &mut Compiler,
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
            let entity = cx.entity(context, "", entity, entities)?;
            if when.is_empty() {
                cx.error(context, "`when` is empty: name the condition that at most one item per partition may satisfy (`when = { isPrimary = true }`)");
                return None;
            }
            let when = cx.condition(context, when);
            let repair = match repair.as_deref() {
                None => None,
                Some("keep-latest") => Some(RepairPolicy::KeepLatest),
                Some(other) => {
                    cx.error(
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
            let entity = cx.entity(context, "", entity, entities)?;
            if premise.is_empty() || then.is_empty() {
                cx.error(context, "`if` and `then` must each name at least one attribute (`if = { isPrimary = true }`, `then = { isVerified = true }`)");
                return None;
            }
            let premise = cx.condition(context, premise);
            let then = cx.condition(context, then);
            Some((entity, InvariantKind::Implies { premise, then }))
        }
        RawInvariant::Unique { entity, index, .. } => {
            let entity = cx.entity(context, "", entity, entities)?;
            let Some(gsi) = table.gsis.iter().find(|g| &g.name == index) else {
                let hint = suggest(index, table.gsis.iter().map(|g| g.name.as_str()));
                cx.error(context, format!("unknown index `{index}`{hint}"));
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
                    _ => None,
                });
            let Some((projection, template)) = derived else {
                // A projection that would derive it but did not compile
                // is reported already; do not pile on.
                let entity_name = &entities[entity].name;
                let broken = spec.projections.iter().any(|p| {
                    matches!(p, RawProjection::IndexKeys(keys)
                        if keys.entity == *entity_name && keys.set.contains_key(&gsi.partition_key))
                });
                if broken {
                    return None;
                }
                cx.error(
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
