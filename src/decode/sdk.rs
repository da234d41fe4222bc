//! Items as the SDKs read them (`aws-sdk-dynamodb` for table reads,
//! `aws-sdk-dynamodbstreams` for stream records) into the record model.
//!
//! An SDK keeps a value of a DynamoDB type newer than itself as `Unknown`,
//! with nothing of the value, and `serde_dynamo` panics converting it. So
//! every SDK item is searched first, and such a value is an error naming
//! where it is: the record is dead-lettered, or the read reported, never a
//! panic.

use std::collections::HashMap;

use crate::record::{AttributeValue, Item};

/// A value of a DynamoDB type this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attribute `{path}` has a DynamoDB type this build does not know (the SDK read it as `Unknown`); upgrade ddb-projector to decode it")]
pub struct UnknownAttributeType {
    /// Where: `name`, `name.inner` or `name[2]`.
    pub path: String,
}

/// What both SDKs' `AttributeValue`s offer that the search needs.
pub(crate) trait SdkValue: Clone + Sized {
    fn as_map(&self) -> Option<&HashMap<String, Self>>;
    fn as_list(&self) -> Option<&[Self]>;
    fn is_unknown_type(&self) -> bool;
    /// The value in the record model; only for a value with no `Unknown`.
    fn to_known(&self) -> AttributeValue;
}

macro_rules! sdk_value {
    ($sdk:ty) => {
        impl SdkValue for $sdk {
            fn as_map(&self) -> Option<&HashMap<String, Self>> {
                self.as_m().ok()
            }
            fn as_list(&self) -> Option<&[Self]> {
                self.as_l().ok().map(Vec::as_slice)
            }
            fn is_unknown_type(&self) -> bool {
                self.is_unknown()
            }
            fn to_known(&self) -> AttributeValue {
                AttributeValue::from(self.clone())
            }
        }
    };
}

sdk_value!(aws_sdk_dynamodb::types::AttributeValue);
sdk_value!(aws_sdk_dynamodbstreams::types::AttributeValue);

/// Where in an item the first (by path) `Unknown` value is.
pub(crate) fn unknown_type_at<V: SdkValue>(map: &HashMap<String, V>) -> Option<String> {
    map.iter()
        .filter_map(|(name, value)| unknown_in(value).map(|rest| format!("{name}{rest}")))
        .min()
}

fn unknown_in<V: SdkValue>(value: &V) -> Option<String> {
    if let Some(map) = value.as_map() {
        return unknown_type_at(map).map(|path| format!(".{path}"));
    }
    if let Some(list) = value.as_list() {
        return list
            .iter()
            .enumerate()
            .find_map(|(i, value)| unknown_in(value).map(|rest| format!("[{i}]{rest}")));
    }
    value.is_unknown_type().then(String::new)
}

/// Converts an SDK item into the record model.
pub(crate) fn item_from_sdk<V: SdkValue>(
    map: HashMap<String, V>,
) -> Result<Item, UnknownAttributeType>
where
    AttributeValue: From<V>,
{
    if let Some(path) = unknown_type_at(&map) {
        return Err(UnknownAttributeType { path });
    }
    Ok(Item::from(map))
}

/// An SDK item as DynamoDB JSON, for dead letters and reports; a value the
/// SDK read as `Unknown` is written `{"UNKNOWN": null}`.
pub(crate) fn item_json<V: SdkValue>(map: &HashMap<String, V>) -> serde_json::Value {
    serde_json::Value::Object(
        map.iter()
            .map(|(name, value)| (name.clone(), value_json(value)))
            .collect(),
    )
}

fn value_json<V: SdkValue>(value: &V) -> serde_json::Value {
    if let Some(map) = value.as_map() {
        return serde_json::json!({ "M": item_json(map) });
    }
    if let Some(list) = value.as_list() {
        return serde_json::json!({ "L": list.iter().map(value_json).collect::<Vec<_>>() });
    }
    if value.is_unknown_type() {
        return serde_json::json!({ "UNKNOWN": null });
    }
    serde_json::to_value(value.to_known()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::AttributeValue as Av;

    use super::*;

    // `Unknown` cannot be built outside the SDK: the paths through it are
    // tested with real SDK deserialization (`tests/engine/fuzz_regressions.rs`
    // for streams, `tests/dynamo/backfill.rs` for table reads).
    #[test]
    fn known_values_convert_and_render_as_dynamodb_json() {
        let inner = HashMap::from([("ok".to_string(), Av::Bool(true))]);
        let map = HashMap::from([
            ("PK".to_string(), Av::S("USER#u1".into())),
            ("n".to_string(), Av::N("7".into())),
            (
                "tags".to_string(),
                Av::L(vec![Av::N("1".into()), Av::M(inner)]),
            ),
        ]);
        assert_eq!(unknown_type_at(&map), None);
        let item = item_from_sdk(map.clone()).unwrap();
        assert_eq!(item.get("n"), Some(&AttributeValue::N("7".into())));
        assert_eq!(
            item_json(&map),
            serde_json::json!({
                "PK": { "S": "USER#u1" },
                "n": { "N": "7" },
                "tags": { "L": [{ "N": "1" }, { "M": { "ok": { "BOOL": true } } }] },
            })
        );
    }
}
