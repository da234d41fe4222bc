//! Commands that need no AWS access: `check`, `plan` and `filters`.

use super::Outcome;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::{load_spec, load_specs, OutputFormat};
use crate::decode::decode_lambda_event;
use crate::plan::{describe_error, plan_record};

/// `check`: exit 0 and a summary of each table's spec when the spec file,
/// or every spec of a directory and their composition, is valid; with
/// `--format json`, one object: the tables' services, entities,
/// projections (name and kind) and invariants, or every problem.
pub fn check(path: &Path, format: OutputFormat) -> Outcome {
    if format == OutputFormat::Json {
        return check_json(path);
    }
    match load_specs(path) {
        Ok(set) => {
            println!("{}: ok", path.display());
            for spec in set.specs() {
                print!("{}", spec.summary());
            }
            Outcome::Done
        }
        Err(code) => code,
    }
}

fn check_json(path: &Path) -> Outcome {
    let loaded = crate::spec::SpecSet::load(path).and_then(|mut set| {
        if let Ok(map) = std::env::var(crate::lambda::TABLE_NAMES_VAR) {
            set.rename_tables(&map).map_err(|problem| {
                crate::spec::SpecErrors(vec![crate::spec::SpecError {
                    file: crate::lambda::TABLE_NAMES_VAR.to_string(),
                    context: String::new(),
                    problem,
                }])
            })?;
        }
        Ok(set)
    });
    let (answer, outcome) = match loaded {
        Ok(set) => {
            let tables: Vec<serde_json::Value> = set
                .specs()
                .iter()
                .map(|spec| {
                    json!({
                        "table": spec.table.name,
                        "service": spec.service,
                        "entities": spec.entities.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
                        "projections": spec.projections.iter().map(|p| json!({
                            "name": p.name,
                            "kind": p.kind_name(),
                            "service": spec.service_of(&p.name),
                        })).collect::<Vec<_>>(),
                        "invariants": spec.invariants.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
                    })
                })
                .collect();
            (
                json!({ "source": path.display().to_string(), "ok": true, "tables": tables }),
                Outcome::Done,
            )
        }
        Err(errors) => {
            let problems: Vec<serde_json::Value> = errors
                .0
                .iter()
                .map(|e| json!({ "file": e.file, "context": e.context, "problem": e.problem }))
                .collect();
            (
                json!({ "source": path.display().to_string(), "ok": false, "problems": problems }),
                Outcome::Found,
            )
        }
    };
    println!("{answer}");
    outcome
}

/// One line of `plan`: the JSON object, or it told in a line of text
/// (`INSERT 000...1 email-gsi1-keys: set USER#u1 / EMAIL#e1 GSI1PK=...`).
fn emit(
    out: &mut impl Write,
    line: &serde_json::Value,
    format: OutputFormat,
) -> std::io::Result<()> {
    if format == OutputFormat::Json {
        return writeln!(out, "{line}");
    }
    let record = &line["record"];
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let at = match record.get("eventName") {
        Some(name) => format!("{} {}", text(name), text(&record["sequenceNumber"])),
        None => format!("record {}", record["index"]),
    };
    if let Some(error) = line.get("error") {
        return writeln!(out, "{at}: cannot be planned: {}", text(error));
    }
    if let Some(skipped) = line.get("skipped") {
        return writeln!(out, "{at}: skipped: {}", text(skipped));
    }
    let key = match (line["key"].get("PK"), line["key"].get("SK")) {
        (Some(pk), Some(sk)) => format!("{} / {}", text(pk), text(sk)),
        (Some(pk), None) => text(pk),
        _ => line["key"].to_string(),
    };
    let set = line
        .get("set")
        .and_then(|set| set.as_object())
        .map(|set| {
            set.iter()
                .map(|(name, value)| {
                    format!(
                        " {name}={}",
                        value
                            .as_str()
                            .map_or_else(|| value.to_string(), str::to_string)
                    )
                })
                .collect::<String>()
        })
        .unwrap_or_default();
    writeln!(
        out,
        "{at} {}: {} {key}{set}",
        text(&line["projection"]),
        text(&line["op"])
    )
}

/// `filters`: the `FilterCriteria` JSON on stdout and the notes on
/// stderr; for a directory describing several tables, an object of them
/// by table name (each table's specs merged into one filter).
pub fn filters(path: &Path, format: OutputFormat) -> Outcome {
    let set = match load_specs(path) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let by_table = crate::lambda::filters::by_table(set.specs(), &mut |table, note| {
        eprintln!("note: {table}: {note}")
    });
    if format == OutputFormat::Text {
        for (table, criteria) in &by_table {
            let filters = criteria["Filters"].as_array().cloned().unwrap_or_default();
            println!("{table}: {} filter patterns", filters.len());
            for filter in filters {
                println!("  {}", filter["Pattern"].as_str().unwrap_or_default());
            }
        }
        return Outcome::Done;
    }
    let json = crate::lambda::filters::criteria_json(by_table);
    println!(
        "{}",
        serde_json::to_string_pretty(&json).expect("JSON values serialize")
    );
    Outcome::Done
}

/// `plan`: one JSON line per planned effect, per skipped record and per
/// record that cannot be planned.
pub fn plan(spec_path: &Path, event_path: &Path, format: OutputFormat) -> anyhow::Result<Outcome> {
    let spec = match load_spec(spec_path, None) {
        Ok(spec) => spec,
        Err(code) => return Ok(code),
    };
    let mut bytes = Vec::new();
    if event_path == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading the event from stdin")?;
    } else {
        bytes = std::fs::read(event_path)
            .with_context(|| format!("cannot read the event file {}", event_path.display()))?;
    }
    let records =
        decode_lambda_event(&bytes).with_context(|| format!("{}", event_path.display()))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut n_effects, mut n_failed, mut n_skipped) = (0, 0, 0);
    for decoded in &records {
        let record = match decoded {
            Ok(record) => record,
            Err(problem) => {
                n_failed += 1;
                let line = json!({
                    "record": { "index": problem.index, "eventID": problem.event_id, "sequenceNumber": problem.sequence_number },
                    "error": problem.reason,
                });
                emit(&mut out, &line, format)?;
                continue;
            }
        };
        let record_ref = json!({ "eventID": record.event_id, "eventName": record.kind.as_str(), "sequenceNumber": record.sequence_number });
        let plan = plan_record(&spec, record, None);
        for effect in &plan.effects {
            n_effects += 1;
            let mut line = effect.to_json(&spec);
            line["record"] = record_ref.clone();
            emit(&mut out, &line, format)?;
        }
        for error in &plan.errors {
            n_failed += 1;
            let line = json!({ "record": record_ref, "error": describe_error(&spec, error) });
            emit(&mut out, &line, format)?;
        }
        if let Some(skip) = &plan.skip {
            n_skipped += 1;
            let line = json!({ "record": record_ref, "skipped": skip.to_string() });
            emit(&mut out, &line, format)?;
        }
    }
    eprintln!(
        "{} records: {n_effects} effects, {n_skipped} skipped, {n_failed} could not be planned",
        records.len()
    );
    Ok(if n_failed > 0 {
        Outcome::Found
    } else {
        Outcome::Done
    })
}
