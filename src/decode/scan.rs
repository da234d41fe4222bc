//! Items read by a table scan, as synthetic inserts (backfill, audit).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue as SdkValue;

use super::sdk::{item_json, unknown_type_at, UnknownAttributeType};
use super::DecodeProblem;
use crate::record::{ChangeKind, ChangeRecord, Item, Origin, SequenceNumber, ViewType};
use crate::schema::TableSpec;

/// Decodes a scanned item into an INSERT of its current state.
pub fn decode_scanned_item(
    table: &TableSpec,
    segment: u32,
    n: u64,
    item: HashMap<String, SdkValue>,
) -> Result<ChangeRecord, DecodeProblem> {
    if let Some(path) = unknown_type_at(&item) {
        return Err(DecodeProblem {
            index: n as usize,
            event_id: None,
            sequence_number: None,
            reason: format!("scanned item: {}", UnknownAttributeType { path }),
            raw: item_json(&item),
        });
    }
    scanned_record(table, segment, n, Item::from(item))
}

/// An item already in the record model (read by a scan) as an INSERT of
/// its current state.
pub fn scanned_record(
    table: &TableSpec,
    segment: u32,
    n: u64,
    item: Item,
) -> Result<ChangeRecord, DecodeProblem> {
    let mut keys = Item::default();
    for name in std::iter::once(&table.partition_key).chain(table.sort_key.iter()) {
        match item.get(name) {
            Some(value) => {
                keys.insert(name.clone(), value.clone());
            }
            None => {
                return Err(DecodeProblem {
                    index: n as usize,
                    event_id: None,
                    sequence_number: None,
                    reason: format!("scanned item has no key attribute `{name}`"),
                    raw: serde_json::to_value(&item).unwrap_or_default(),
                })
            }
        }
    }
    Ok(ChangeRecord {
        event_id: format!("scan:{segment}:{n}"),
        kind: ChangeKind::Insert,
        keys: keys.into(),
        old_image: None,
        new_image: Some(item.into()),
        sequence_number: SequenceNumber("0".to_string()),
        approximate_creation_ms: None,
        ttl_expiry: false,
        view_type: Some(ViewType::NewImage),
        size_bytes: None,
        origin: Origin::Scan { segment },
    })
}
