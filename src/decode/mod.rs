//! Decoding: Lambda events, Streams API records and scanned items into
//! [`ChangeRecord`]s.
//!
//! **Architecture Invariant:** decoding never panics and never drops a
//! record silently. A record that does not fit the model becomes a
//! [`DecodeProblem`] in its place in the batch, carrying the raw record so
//! that it can be dead-lettered whole. Checked by the fuzz targets (their
//! seeds run in `engine::fuzz_regressions`),
//! `engine::decode::several_bad_records_keep_their_places` and
//! `dynamo::applier::undecodable_records_are_dead_lettered_whole`.

mod fast;
mod guarded;
mod kinesis;
mod lambda;
mod scan;
mod sdk;
mod streams;

pub use kinesis::{decode_kinesis_data, decode_kinesis_lambda_record, KinesisMeta};
pub use lambda::{
    decode_lambda_event, decode_lambda_record, decode_lambda_record_json, LambdaEventError,
};
pub use scan::{decode_scanned_item, scanned_record};
pub use sdk::UnknownAttributeType;
pub(crate) use sdk::{item_from_sdk, item_json};
pub use streams::decode_stream_record;

use crate::record::{ChangeKind, ChangeRecord};

/// A record that could not be decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeProblem {
    /// Position in the batch.
    pub index: usize,
    /// The record's `eventID`, when it has one.
    pub event_id: Option<String>,
    /// The record's sequence number, when it has one.
    pub sequence_number: Option<String>,
    /// What is wrong.
    pub reason: String,
    /// The record as received, for the dead-letter store.
    pub raw: serde_json::Value,
}

impl std::fmt::Display for DecodeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record {}", self.index)?;
        if let Some(id) = &self.event_id {
            write!(f, " (eventID {id})")?;
        }
        if let Some(seq) = &self.sequence_number {
            write!(f, " (sequence number {seq})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// One decoded batch, in stream order.
pub type Decoded = Vec<Result<ChangeRecord, DecodeProblem>>;

/// Checks what every record must have, whatever its source.
fn check(record: &ChangeRecord) -> Result<(), String> {
    if record.keys.is_empty() {
        return Err("the record has no Keys".to_string());
    }
    if record.sequence_number.0.is_empty() {
        return Err("the record has no SequenceNumber".to_string());
    }
    if !record.sequence_number.0.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "SequenceNumber `{}` is not a decimal number",
            record.sequence_number
        ));
    }
    match record.kind {
        ChangeKind::Insert if record.old_image.is_some() => {
            Err("an INSERT record carries an OldImage".to_string())
        }
        ChangeKind::Remove if record.new_image.is_some() => {
            Err("a REMOVE record carries a NewImage".to_string())
        }
        _ => Ok(()),
    }
}

fn unknown_event_name(name: &str) -> String {
    format!("unknown eventName `{name}`: this version knows INSERT, MODIFY and REMOVE")
}
