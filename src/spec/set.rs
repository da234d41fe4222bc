//! A registry of specs: one file per service, many services per deployment.
//!
//! `--spec` and `PROJECTOR_SPEC` name a spec file or a directory of them.
//! The specs are grouped by the table they describe, and the specs of one
//! table compose into one [`Spec`]: one stream reader, one lifecycle, one
//! set of checks over every team's projections. Composing merges the files'
//! tables, entities, projections and invariants, and refuses what two files
//! would mean differently, naming both: a table described with other keys,
//! an entity name with other key patterns, a projection, counter or
//! invariant name defined twice. The compiler then checks the composite as
//! it checks any spec, so two specs deriving one attribute, entities of two
//! files matching the same keys, or a loop through projections of two files
//! are refused with each projection's and entity's file named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use super::raw::RawSpec;
use super::{Spec, SpecError, SpecErrors};
use crate::kinds::custom::CustomProjection;

/// The service that registered each projection and invariant of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Services {
    /// Service name and the file it came from, in file order.
    pub files: Vec<(String, String)>,
    /// Projection or invariant name to the index of its service in `files`.
    owners: BTreeMap<String, usize>,
}

impl Services {
    /// The service of one file owning everything in `raw`.
    pub fn single(raw: &RawSpec, file: &str) -> Services {
        let mut services = Services::default();
        services.add(raw, file);
        services
    }

    fn add(&mut self, raw: &RawSpec, file: &str) {
        let index = self.files.len();
        self.files.push((raw.service.clone(), file.to_string()));
        for projection in &raw.projections {
            self.owners.insert(projection.name().to_string(), index);
        }
        for invariant in &raw.invariants {
            self.owners.insert(invariant.name().to_string(), index);
        }
    }

    /// The service that registered projection or invariant `name` (a
    /// counter's old version `followers~0` is its counter's), if known.
    pub fn of(&self, name: &str) -> Option<&str> {
        self.owner(name).map(|(service, _)| service)
    }

    /// The file that registered `name`, if known.
    pub fn file_of(&self, name: &str) -> Option<&str> {
        self.owner(name).map(|(_, file)| file)
    }

    /// The service and file that registered `name`.
    fn owner(&self, name: &str) -> Option<(&str, &str)> {
        let base = super::old_version_of(name).map_or(name, |(base, _)| base);
        let &i = self.owners.get(name).or_else(|| self.owners.get(base))?;
        Some((self.files[i].0.as_str(), self.files[i].1.as_str()))
    }

    /// Whether more than one service registered the spec.
    pub fn is_composite(&self) -> bool {
        self.files.len() > 1
    }
}

/// The specs a deployment serves, one composed [`Spec`] per table.
#[derive(Debug, Clone)]
pub struct SpecSet {
    /// What was loaded (the file or directory), for messages.
    pub source: String,
    specs: Vec<Arc<Spec>>,
    /// A single spec file (not a directory): it serves whichever table
    /// `--table` or `PROJECTOR_TABLE` names, as it always did. A registry
    /// serves only the tables its specs name, so that a stream of a table
    /// no spec describes is never projected with another table's spec.
    any_table: bool,
}

impl SpecSet {
    /// Loads a spec file, or every `*.toml` file of a directory (one per
    /// service; hidden files and other extensions are skipped).
    pub fn load(path: &Path) -> Result<SpecSet, SpecErrors> {
        let label = path.display().to_string();
        let fail = |problem: String| {
            SpecErrors(vec![SpecError {
                file: label.clone(),
                context: String::new(),
                problem,
            }])
        };
        if !path.is_dir() {
            let spec = Spec::from_file(path)?;
            return Ok(SpecSet {
                source: label,
                specs: vec![Arc::new(spec)],
                any_table: true,
            });
        }
        let entries = std::fs::read_dir(path)
            .map_err(|error| fail(format!("cannot read the spec directory: {error}")))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|error| fail(format!("cannot read the spec directory: {error}")))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let file = entry.path();
            if name.starts_with('.') || file.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            files.push(file);
        }
        files.sort();
        if files.is_empty() {
            return Err(fail(
                "the directory holds no spec files: add one `<service>.toml` per service".into(),
            ));
        }
        let mut texts = Vec::new();
        let mut errors = Vec::new();
        for file in &files {
            match std::fs::read_to_string(file) {
                Ok(text) => texts.push((file.display().to_string(), text)),
                Err(error) => errors.push(SpecError {
                    file: file.display().to_string(),
                    context: String::new(),
                    problem: format!("cannot read the spec file: {error}"),
                }),
            }
        }
        let mut set = match SpecSet::from_texts(&texts) {
            Ok(set) => set,
            Err(SpecErrors(more)) => {
                errors.extend(more);
                return Err(SpecErrors(errors));
            }
        };
        if !errors.is_empty() {
            return Err(SpecErrors(errors));
        }
        set.source = label;
        Ok(set)
    }

    /// Parses and composes spec texts, each labelled with its file name.
    pub fn from_texts(texts: &[(String, String)]) -> Result<SpecSet, SpecErrors> {
        let mut raws = Vec::new();
        let mut errors = Vec::new();
        for (label, text) in texts {
            match toml::from_str::<RawSpec>(text) {
                Ok(raw) => raws.push((label.clone(), raw)),
                Err(error) => errors.push(SpecError {
                    file: label.clone(),
                    context: String::new(),
                    problem: format!("invalid spec TOML: {}", error.to_string().trim_end()),
                }),
            }
        }
        match SpecSet::compose(raws) {
            Ok(set) if errors.is_empty() => Ok(set),
            Ok(_) => Err(SpecErrors(errors)),
            Err(SpecErrors(more)) => {
                errors.extend(more);
                Err(SpecErrors(errors))
            }
        }
    }

    /// Composes raw specs (file label, spec): one compiled spec per table.
    pub fn compose(raws: Vec<(String, RawSpec)>) -> Result<SpecSet, SpecErrors> {
        let source = raws
            .iter()
            .map(|(label, _)| label.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let mut tables: BTreeMap<String, Vec<(String, RawSpec)>> = BTreeMap::new();
        for (label, raw) in raws {
            tables
                .entry(raw.table.name.clone())
                .or_default()
                .push((label, raw));
        }
        let mut specs = Vec::new();
        let mut errors = Vec::new();
        for (_, group) in tables {
            match compose_table(group) {
                Ok(spec) => specs.push(Arc::new(spec)),
                Err(SpecErrors(more)) => errors.extend(more),
            }
        }
        if !errors.is_empty() {
            return Err(SpecErrors(errors));
        }
        Ok(SpecSet {
            source,
            specs,
            any_table: false,
        })
    }

    /// Adds projections written in Rust: each to the spec of every table
    /// that describes its source entity (recompiled, so every check of a
    /// spec holds for them too). One whose source entity no spec
    /// describes is an error naming the entities there are.
    pub fn with_custom(
        mut self,
        custom: &[Arc<dyn CustomProjection>],
    ) -> Result<SpecSet, SpecErrors> {
        if custom.is_empty() {
            return Ok(self);
        }
        let mut errors = Vec::new();
        for projection in custom {
            let entity = projection.source_entity();
            if !self
                .specs
                .iter()
                .any(|spec| spec.raw.entities.contains_key(entity))
            {
                let known: Vec<&str> = self
                    .specs
                    .iter()
                    .flat_map(|spec| spec.raw.entities.keys().map(String::as_str))
                    .collect();
                errors.push(SpecError {
                    file: self.source.clone(),
                    context: format!("custom projection `{}`", projection.name()),
                    problem: format!(
                        "no spec describes its source entity `{entity}` (entities: {})",
                        known.join(", ")
                    ),
                });
            }
        }
        for spec in &mut self.specs {
            let mine: Vec<Arc<dyn CustomProjection>> = custom
                .iter()
                .filter(|p| spec.raw.entities.contains_key(p.source_entity()))
                .cloned()
                .collect();
            if mine.is_empty() {
                continue;
            }
            match Spec::compile_composed(spec.raw.clone(), &spec.file, mine, spec.services.clone())
            {
                Ok(compiled) => *spec = Arc::new(compiled),
                Err(SpecErrors(more)) => errors.extend(more),
            }
        }
        if !errors.is_empty() {
            return Err(SpecErrors(errors));
        }
        Ok(self)
    }

    /// One spec, as a set: it serves any table.
    pub fn of(spec: Spec) -> SpecSet {
        SpecSet::from(Arc::new(spec))
    }

    /// Renames the tables specs describe, for deployments whose tables are
    /// not named as the specs say (`UserServiceTable=UserServiceTable-prod,...`,
    /// `PROJECTOR_TABLE_NAMES`): each batch is then routed by the actual
    /// name. An entry naming no table of the set is an error.
    pub fn rename_tables(&mut self, map: &str) -> Result<(), String> {
        for entry in map.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((from, to)) = entry.split_once('=') else {
                return Err(format!(
                    "`{entry}` is not SPEC_TABLE=ACTUAL_TABLE (for example UserServiceTable=UserServiceTable-prod)"
                ));
            };
            let (from, to) = (from.trim(), to.trim());
            let Some(spec) = self.specs.iter_mut().find(|s| s.table.name == from) else {
                return Err(format!(
                    "`{from}` is no table of {}: its specs describe {}",
                    self.source,
                    self.tables()
                ));
            };
            if to.is_empty() {
                return Err(format!("`{entry}`: no table name after `=`"));
            }
            Arc::make_mut(spec).table.name = to.to_string();
        }
        Ok(())
    }

    /// The tables the specs describe, for messages: "`T` (service), ...".
    pub fn tables(&self) -> String {
        self.specs
            .iter()
            .map(|s| format!("`{}` ({})", s.table.name, s.service))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The composed specs, one per table, by table name.
    pub fn specs(&self) -> &[Arc<Spec>] {
        &self.specs
    }

    /// The spec that serves `table`: the one describing a table of that
    /// name; a single spec file serves any table (`--table` and
    /// `PROJECTOR_TABLE` name the table it describes).
    pub fn for_table(&self, table: &str) -> Option<&Arc<Spec>> {
        match self.specs.as_slice() {
            [only] if self.any_table => Some(only),
            specs => specs.iter().find(|spec| spec.table.name == table),
        }
    }

    /// The spec a command on `table` (none: the only one) uses; an error
    /// names the tables the set describes.
    pub fn select(&self, table: Option<&str>) -> Result<&Arc<Spec>, String> {
        match table {
            None if self.specs.len() == 1 => Ok(&self.specs[0]),
            None => Err(format!(
                "{} describes {} tables: {}; say which with --table",
                self.source,
                self.specs.len(),
                self.tables()
            )),
            Some(table) => self.for_table(table).ok_or_else(|| {
                format!(
                    "{} has no spec for table `{table}`; it describes {}",
                    self.source,
                    self.tables()
                )
            }),
        }
    }
}

impl From<Arc<Spec>> for SpecSet {
    fn from(spec: Arc<Spec>) -> SpecSet {
        SpecSet {
            source: spec.file.clone(),
            specs: vec![spec],
            any_table: true,
        }
    }
}

/// Composes the specs of one table into one.
fn compose_table(mut group: Vec<(String, RawSpec)>) -> Result<Spec, SpecErrors> {
    if group.len() == 1 {
        let (label, raw) = group.pop().expect("one");
        return Spec::compile(raw, &label, Vec::new());
    }
    let mut errors = Vec::new();
    let mut error = |file: &str, context: String, problem: String| {
        errors.push(SpecError {
            file: file.to_string(),
            context,
            problem,
        })
    };
    let (first_label, first) = &group[0];
    let mut merged = RawSpec {
        service: String::new(),
        table: first.table.clone(),
        ..RawSpec::default()
    };
    let mut services = Services::default();
    let mut service_files: BTreeMap<&str, &str> = BTreeMap::new();
    // Every file that declares each entity.
    let mut entity_files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut gsi_files: BTreeMap<String, String> = BTreeMap::new();
    let mut ttl_file = first_label.clone();
    for gsi in &first.table.gsis {
        gsi_files.insert(gsi.name.clone(), first_label.clone());
    }
    for (label, raw) in &group {
        let table = &raw.table;
        if raw.service.trim().is_empty() {
            error(
                label,
                String::new(),
                "`service` must name the service that owns this file's projections".into(),
            );
        }
        if let Some(other) = service_files.insert(&raw.service, label) {
            error(
                label,
                "service".into(),
                format!(
                    "service `{}` is also registered by {other}: one file per service",
                    raw.service
                ),
            );
        }
        let keys =
            |t: &super::raw::RawTable| format!("PK `{}`, SK `{}`", t.partition_key, t.sort_key);
        if keys(table) != keys(&first.table) {
            error(
                label,
                "table".into(),
                format!(
                    "table `{}` is described with {} here, but with {} in {first_label}: specs of one table must agree on its keys",
                    table.name,
                    keys(table),
                    keys(&first.table)
                ),
            );
        }
        // A spec that leaves the TTL attribute out does not care which it
        // is; two that name one must name the same.
        match (&merged.table.ttl_attribute, &table.ttl_attribute) {
            (_, None) => {}
            (None, Some(ttl)) => {
                ttl_file = label.clone();
                merged.table.ttl_attribute = Some(ttl.clone());
            }
            (Some(known), Some(ttl)) if known == ttl => {}
            (Some(known), Some(ttl)) => error(
                label,
                "table".into(),
                format!(
                    "table `{}` has the TTL attribute `{ttl}` here, but `{known}` in {ttl_file}",
                    table.name
                ),
            ),
        }
        if !std::ptr::eq(raw, first) {
            for gsi in &table.gsis {
                match merged.table.gsis.iter().find(|g| g.name == gsi.name) {
                    None => {
                        gsi_files.insert(gsi.name.clone(), label.clone());
                        merged.table.gsis.push(gsi.clone());
                    }
                    Some(known) if known == gsi => {}
                    Some(known) => error(
                        label,
                        format!("index `{}`", gsi.name),
                        format!(
                            "keyed by `{}`/`{}` here, but by `{}`/`{}` in {}",
                            gsi.partition_key,
                            gsi.sort_key.as_deref().unwrap_or("-"),
                            known.partition_key,
                            known.sort_key.as_deref().unwrap_or("-"),
                            gsi_files[&gsi.name]
                        ),
                    ),
                }
            }
        }
        for (name, entity) in &raw.entities {
            match merged.entities.get(name) {
                None => {
                    entity_files.insert(name.clone(), vec![label.clone()]);
                    merged.entities.insert(name.clone(), entity.clone());
                }
                Some(known) if known == entity => {
                    entity_files.entry(name.clone()).or_default().push(label.clone())
                }
                Some(known) => error(
                    label,
                    format!("entity `{name}`"),
                    format!(
                        "means `{}` / `{}` here, but `{}` / `{}` in {}: an entity shared by specs of one table must have the same key patterns in each, variable names included",
                        entity.pk,
                        entity.sk.as_deref().unwrap_or("-"),
                        known.pk,
                        known.sk.as_deref().unwrap_or("-"),
                        entity_files[name].join(" and ")
                    ),
                ),
            }
        }
        let defined = raw
            .projections
            .iter()
            .map(|p| ("projection", p.name()))
            .chain(raw.invariants.iter().map(|i| ("invariant", i.name())));
        for (what, name) in defined {
            if let Some(other) = names.insert(name.to_string(), label.clone()) {
                if &other != label {
                    error(
                        label,
                        format!("{what} `{name}`"),
                        format!(
                            "the name `{name}` is also defined in {other}: projection, counter and invariant names must be unique across the specs of table `{}`",
                            table.name
                        ),
                    );
                }
            }
        }
        merged.projections.extend(raw.projections.iter().cloned());
        merged.invariants.extend(raw.invariants.iter().cloned());
        services.add(raw, label);
    }
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    merged.service = services
        .files
        .iter()
        .map(|(service, _)| service.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let label = services
        .files
        .iter()
        .map(|(_, file)| file.as_str())
        .collect::<Vec<_>>()
        .join(" + ");
    Spec::compile_composed(merged, &label, Vec::new(), services.clone()).map_err(
        |SpecErrors(errors)| {
            SpecErrors(
                errors
                    .into_iter()
                    .map(|error| attribute(error, &services, &entity_files))
                    .collect(),
            )
        },
    )
}

/// Names the files of the projections, invariants and entities a composed
/// spec's error mentions (in backquotes; an entity as "entity `NAME`"), so
/// that a conflict between two teams' specs names both.
fn attribute(
    mut error: SpecError,
    services: &Services,
    entity_files: &BTreeMap<String, Vec<String>>,
) -> SpecError {
    let text = format!("{} {}", error.context, error.problem);
    let pieces: Vec<&str> = text.split('`').collect();
    let mut files = BTreeSet::new();
    let mut named: Vec<(String, Vec<String>)> = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        if i % 2 == 0 || named.iter().any(|(n, _)| n == piece) {
            continue;
        }
        let of = if pieces[i - 1].ends_with("entity ") {
            entity_files.get(*piece).cloned()
        } else {
            services.file_of(piece).map(|file| vec![file.to_string()])
        };
        if let Some(of) = of {
            files.extend(of.iter().cloned());
            named.push((piece.to_string(), of));
        }
    }
    if let Some((_, of)) = named.first() {
        error.file = of[0].clone();
    }
    if files.len() > 1 {
        let list: Vec<String> = named
            .iter()
            .map(|(name, of)| format!("`{name}` in {}", of.join(" and ")))
            .collect();
        error.problem = format!("{} ({})", error.problem, list.join(", "));
    }
    error
}

#[cfg(test)]
mod tests;
