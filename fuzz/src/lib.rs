//! What the fuzz targets run, one function per target.
//!
//! `tests/engine/fuzz_regressions.rs` includes this file as a module, so
//! that plain `cargo test` (stable, no libFuzzer) replays every committed
//! corpus seed through exactly the same code. It therefore depends only on
//! crates the main crate depends on.
//!
//! Each function takes raw bytes and must return (never panic, never hang,
//! never allocate without bound) whatever they are; what it returns counts
//! what happened, so that tests can check a seed reaches the stage it was
//! written for.

use std::sync::OnceLock;

use aws_sdk_dynamodbstreams::operation::get_records::{GetRecords, GetRecordsOutput};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::runtime_plugin::RuntimePlugin;
use aws_smithy_runtime_api::client::ser_de::{DeserializeResponse, SharedResponseDeserializer};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::{ConfigBag, FrozenLayer};
use ddb_projector::apply::{problem_key, DeadLetter, RecordStatus};
use ddb_projector::decode::{decode_lambda_event, decode_stream_record, Decoded};
use ddb_projector::lambda::batch_response;
use ddb_projector::lambda::event::Payload;
use ddb_projector::lambda::filters::filter_criteria;
use ddb_projector::plan::{compute_denormalized, describe_error, plan_record};
use ddb_projector::record::{ChangeRecord, Image, Item};
use ddb_projector::spec::{ProjectionKind, Spec};

/// The shipped specs, as `(label, text)`: compiled into the harness so that
/// a target runs the same wherever it is started from.
pub const SHIPPED_SPECS: [(&str, &str); 3] = [
    (
        "projections/user-service.toml",
        include_str!("../../projections/user-service.toml"),
    ),
    (
        "projections/social-service.toml",
        include_str!("../../projections/social-service.toml"),
    ),
    (
        "projections/ads-platform.toml",
        include_str!("../../projections/ads-platform.toml"),
    ),
];

/// The shipped specs, compiled once.
pub fn shipped_specs() -> &'static [Spec] {
    static SPECS: OnceLock<Vec<Spec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        SHIPPED_SPECS
            .iter()
            .map(|(label, text)| {
                Spec::from_toml(text, label)
                    .unwrap_or_else(|errors| panic!("{label} does not compile:\n{errors}"))
            })
            .collect()
    })
}

/// What one input did, summed over its records and the specs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The input was refused as a whole (not an event, not a spec).
    pub refused: bool,
    /// Records decoded into change records.
    pub records: usize,
    /// Records that became decode problems (dead letters).
    pub problems: usize,
    /// Effects planned.
    pub effects: usize,
    /// Projections that could not plan a record.
    pub plan_errors: usize,
}

/// Target `lambda_event`: the bytes as a Lambda invocation payload.
///
/// Both decoders run: the handler's (`Payload`, record by record while
/// reading; a backfill request is checked against each shipped spec) and
/// `plan --event`'s ([`decode_lambda_event`]). Decoded records are planned
/// against every shipped spec, problems become dead letters, and the batch
/// response is computed as if every record had failed.
pub fn lambda_event(bytes: &[u8]) -> Outcome {
    let mut outcome = Outcome::default();
    let whole = decode_lambda_event(bytes);
    match &whole {
        Ok(decoded) => {
            fast_decodes_as_slow(bytes, decoded);
            plan_batch(decoded, &mut outcome)
        }
        Err(error) => {
            let _ = error.to_string();
            outcome.refused = true;
        }
    }
    match serde_json::from_slice::<Payload>(bytes) {
        Ok(Payload::Stream(event)) => {
            // Counted once, above; here only that nothing panics, and that
            // the bootstrap's record-by-record decoding agrees with it.
            let records = event.records();
            if let Ok(decoded) = &whole {
                by_record_as_whole(decoded, &records);
            }
            plan_batch(&records, &mut Outcome::default());
            ddb_projector::lambda::metrics::record_iterator_age(&records);
            let failed = vec![RecordStatus::Failed("fuzz".to_string()); records.len()];
            let _ = batch_response(&records, &failed).map_err(|error| error.to_string());
        }
        Ok(Payload::Backfill(request)) => {
            for spec in shipped_specs() {
                let _ = request.plan(spec).map_err(|error| error.to_string());
            }
        }
        Ok(Payload::Audit(request)) => {
            let _ = request.check().map_err(|error| error.to_string());
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
    outcome
}

/// The fast Lambda decoder's invariant (`src/decode/fast.rs`): a record it
/// decodes is the record the slow way (`serde_json`, `EventRecord`) gives
/// from the same JSON, and an event it decodes is one `serde_json` reads.
///
/// # Panics
///
/// When the two disagree: a fuzzing finding.
fn fast_decodes_as_slow(bytes: &[u8], decoded: &Decoded) {
    let value = match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(value) => value,
        Err(error) => {
            assert!(
                decoded.iter().all(Result::is_err),
                "the fast way decoded an event serde_json refuses ({error})"
            );
            return;
        }
    };
    let Some(records) = value.get("Records").and_then(|r| r.as_array()) else {
        assert!(
            decoded.iter().all(Result::is_err),
            "records without `Records`"
        );
        return;
    };
    assert_eq!(records.len(), decoded.len(), "one result per record");
    for (index, (raw, result)) in records.iter().zip(decoded).enumerate() {
        if let Ok(record) = result {
            let slow = ddb_projector::decode::decode_lambda_record(index, raw);
            assert_eq!(
                slow.as_ref(),
                Ok(record),
                "record {index} decodes differently"
            );
        }
    }
}

/// The Lambda bootstrap decodes each record's JSON on its own
/// (`decode_lambda_record_json`, the fast way first); `plan --event` and
/// the bench decode the whole event. Both must give each record the same
/// way.
///
/// # Panics
///
/// When they disagree on a record: a fuzzing finding.
fn by_record_as_whole(whole: &Decoded, by_record: &Decoded) {
    assert_eq!(whole.len(), by_record.len(), "one result per record");
    for (index, (whole, by_record)) in whole.iter().zip(by_record).enumerate() {
        assert_eq!(
            whole.as_ref().ok(),
            by_record.as_ref().ok(),
            "record {index} decodes differently on its own"
        );
    }
}

thread_local! {
    /// The `GetRecords` operation's config: it holds the SDK's own
    /// deserializer of the response.
    static GET_RECORDS: FrozenLayer = GetRecords::new()
        .config()
        .expect("GetRecords has an operation config");
}

/// Reads `bytes` as a `GetRecords` response body (HTTP 200) with the SDK's
/// own deserializer, as `run` receives it; `None` when the SDK refuses it.
/// (The SDK bounds nesting itself, at 128 levels.)
pub fn get_records_output(bytes: &[u8]) -> Option<GetRecordsOutput> {
    let response = HttpResponse::new(
        StatusCode::try_from(200).expect("200 is a status"),
        SdkBody::from(bytes.to_vec()),
    );
    let output = GET_RECORDS
        .with(|layer| {
            layer
                .load::<SharedResponseDeserializer>()
                .expect("GetRecords registers a response deserializer")
                .deserialize_nonstreaming_with_config(&response, &ConfigBag::base())
        })
        .ok()?;
    output.downcast::<GetRecordsOutput>().ok()
}

/// Target `streams_record`: the bytes as a DynamoDB Streams `GetRecords`
/// response body (the shape of `tests/fixtures/streams-get-records.json`),
/// deserialized by the SDK into `aws_sdk_dynamodbstreams::types::Record`s,
/// each decoded as the stream runner does ([`decode_stream_record`]) and
/// planned against every shipped spec.
pub fn streams_record(bytes: &[u8]) -> Outcome {
    let Some(output) = get_records_output(bytes) else {
        return Outcome {
            refused: true,
            ..Outcome::default()
        };
    };
    let decoded: Decoded = output
        .records()
        .iter()
        .enumerate()
        .map(|(index, record)| decode_stream_record(index, "shardId-fuzz", record))
        .collect();
    let mut outcome = Outcome::default();
    plan_batch(&decoded, &mut outcome);
    outcome
}

/// Target `spec`: the bytes as a spec file, through parsing and compilation
/// as `ddb-projector check --spec` does, then what `check` and `filters`
/// print; a spec that compiles also plans the shipped Lambda fixture.
pub fn spec(bytes: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(bytes);
    match Spec::from_toml(&text, "fuzz.toml") {
        Ok(spec) => {
            let _ = spec.summary();
            for invariant in &spec.invariants {
                let _ = spec.describe_invariant(invariant);
            }
            let _ = filter_criteria(&spec).to_json();
            let mut outcome = Outcome::default();
            for record in fixture_records() {
                plan_one(&spec, record, &mut outcome);
            }
            recompute(&spec, fixture_records());
            outcome
        }
        Err(errors) => {
            let _ = errors.to_string();
            Outcome {
                refused: true,
                ..Outcome::default()
            }
        }
    }
}

/// The records of `tests/fixtures/lambda-event.json`, decoded once.
fn fixture_records() -> &'static [ChangeRecord] {
    static RECORDS: OnceLock<Vec<ChangeRecord>> = OnceLock::new();
    RECORDS.get_or_init(|| {
        decode_lambda_event(include_bytes!("../../tests/fixtures/lambda-event.json"))
            .expect("the fixture is an event")
            .into_iter()
            .map(|record| record.expect("the fixture's records decode"))
            .collect()
    })
}

/// Plans every decoded record against every shipped spec; problems become
/// dead letters, as the applier stores them.
fn plan_batch(decoded: &Decoded, outcome: &mut Outcome) {
    let mut records = Vec::new();
    for result in decoded {
        match result {
            Ok(record) => {
                outcome.records += 1;
                records.push(record.clone());
            }
            Err(problem) => {
                outcome.problems += 1;
                let _ = problem.to_string();
                // The key of an undecodable record is read from what arrived.
                let key = problem_key(problem, &shipped_specs()[0].table);
                let _ = serde_json::to_string(&DeadLetter::for_problem(problem, key, "*"));
            }
        }
    }
    for spec in shipped_specs() {
        for record in &records {
            plan_one(spec, record, outcome);
        }
        recompute(spec, &records);
    }
}

fn plan_one(spec: &Spec, record: &ChangeRecord, outcome: &mut Outcome) {
    let plan = plan_record(spec, record, None);
    outcome.effects += plan.effects.len();
    outcome.plan_errors += plan.errors.len();
    for effect in &plan.effects {
        let _ = effect.to_json(spec).to_string();
    }
    for error in &plan.errors {
        let message = describe_error(spec, error);
        let letter = DeadLetter::for_record(record, None, "fuzz", message, false);
        let _ = serde_json::to_string(&letter);
    }
}

/// Runs every denormalize projection's recompute over the records' new
/// images, as if the applier had read them back from the table (an item
/// read from the table always has its key attributes, so images without
/// them are left out).
fn recompute(spec: &Spec, records: &[ChangeRecord]) {
    let items: Vec<Item> = records
        .iter()
        .filter_map(|record| record.new_image.as_ref().map(Image::to_item))
        .filter(|item| spec.table.item_key(item).is_some())
        .collect();
    for projection in &spec.projections {
        if let ProjectionKind::Denormalize(p) = &projection.kind {
            let _ = compute_denormalized(spec, p, &items).map_err(|error| error.to_string());
        }
    }
}
