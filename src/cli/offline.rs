//! Commands that need no AWS access: `check`, `plan` and `filters`.

use super::Outcome;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::{load_spec, load_specs};
use crate::decode::decode_lambda_event;
use crate::plan::{describe_error, plan_record};

/// `check`: exit 0 and a summary of each table's spec when the spec file,
/// or every spec of a directory and their composition, is valid.
pub fn check(path: &Path) -> Outcome {
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

/// `filters`: the `FilterCriteria` JSON on stdout and the notes on
/// stderr; for a directory describing several tables, an object of them
/// by table name (each table's specs merged into one filter).
pub fn filters(path: &Path) -> Outcome {
    let set = match load_specs(path) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let mut by_table = serde_json::Map::new();
    for spec in set.specs() {
        let criteria = crate::lambda::filters::filter_criteria(spec);
        for note in &criteria.notes {
            eprintln!("note: {}: {note}", spec.table.name);
        }
        by_table.insert(spec.table.name.clone(), criteria.to_json());
    }
    let json = match set.specs() {
        [_] => by_table.into_iter().next().expect("one").1,
        _ => serde_json::Value::Object(by_table),
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&json).expect("JSON values serialize")
    );
    Outcome::Done
}

/// `plan`: one JSON line per planned effect, per skipped record and per
/// record that cannot be planned.
pub fn plan(spec_path: &Path, event_path: &Path) -> anyhow::Result<Outcome> {
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
                writeln!(out, "{line}")?;
                continue;
            }
        };
        let record_ref = json!({ "eventID": record.event_id, "eventName": record.kind.as_str(), "sequenceNumber": record.sequence_number });
        let plan = plan_record(&spec, record, None);
        for effect in &plan.effects {
            n_effects += 1;
            let mut line = effect.to_json(&spec);
            line["record"] = record_ref.clone();
            writeln!(out, "{line}")?;
        }
        for error in &plan.errors {
            n_failed += 1;
            let line = json!({ "record": record_ref, "error": describe_error(&spec, error) });
            writeln!(out, "{line}")?;
        }
        if let Some(skip) = &plan.skip {
            n_skipped += 1;
            let line = json!({ "record": record_ref, "skipped": skip.to_string() });
            writeln!(out, "{line}")?;
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
