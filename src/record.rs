//! The one change-record model: "an item changed", whatever delivered it.
//!
//! Lambda events, DynamoDB Streams API records and table-scan items are all
//! decoded into [`ChangeRecord`] (see [`crate::decode`]); everything after
//! decoding sees only this type. SDK types never appear here.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};
pub use serde_dynamo::{AttributeValue, Item};

mod image;
pub use image::{Attributes, Image, ValueRef};

/// What happened to the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChangeKind {
    /// A new item was written.
    Insert,
    /// An existing item was changed.
    Modify,
    /// The item was deleted (by a writer or by TTL).
    Remove,
}

impl ChangeKind {
    /// Parses the stream's `eventName`.
    pub fn from_event_name(name: &str) -> Option<ChangeKind> {
        match name {
            "INSERT" => Some(ChangeKind::Insert),
            "MODIFY" => Some(ChangeKind::Modify),
            "REMOVE" => Some(ChangeKind::Remove),
            _ => None,
        }
    }

    /// The stream's `eventName` for this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Insert => "INSERT",
            ChangeKind::Modify => "MODIFY",
            ChangeKind::Remove => "REMOVE",
        }
    }
}

/// Which images the stream writes into each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ViewType {
    /// Only the key attributes.
    KeysOnly,
    /// The item after the change.
    NewImage,
    /// The item before the change.
    OldImage,
    /// Both images.
    NewAndOldImages,
}

impl ViewType {
    /// Parses the stream's `StreamViewType`.
    pub fn from_name(name: &str) -> Option<ViewType> {
        match name {
            "KEYS_ONLY" => Some(ViewType::KeysOnly),
            "NEW_IMAGE" => Some(ViewType::NewImage),
            "OLD_IMAGE" => Some(ViewType::OldImage),
            "NEW_AND_OLD_IMAGES" => Some(ViewType::NewAndOldImages),
            _ => None,
        }
    }

    /// Whether records carry the item after the change.
    pub fn has_new_image(self) -> bool {
        matches!(self, ViewType::NewImage | ViewType::NewAndOldImages)
    }

    /// Whether records carry the item before the change.
    pub fn has_old_image(self) -> bool {
        matches!(self, ViewType::OldImage | ViewType::NewAndOldImages)
    }

    /// The stream's name for this view type.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewType::KeysOnly => "KEYS_ONLY",
            ViewType::NewImage => "NEW_IMAGE",
            ViewType::OldImage => "OLD_IMAGE",
            ViewType::NewAndOldImages => "NEW_AND_OLD_IMAGES",
        }
    }
}

/// A stream sequence number.
///
/// DynamoDB sequence numbers are decimal strings of up to 40 digits; they
/// order records of one shard. They are compared as numbers, not as text.
///
/// Equality and hashing agree with that order: `"0042"` equals `"42"`
/// (DynamoDB Local pads with zeros, AWS does not).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SequenceNumber(pub String);

impl PartialEq for SequenceNumber {
    fn eq(&self, other: &Self) -> bool {
        self.digits() == other.digits()
    }
}

impl Eq for SequenceNumber {}

impl std::hash::Hash for SequenceNumber {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digits().hash(state);
    }
}

impl SequenceNumber {
    /// The sequence number as the stream wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Zero-padded to 48 digits, so that stored numbers sort as text.
    pub fn padded(&self) -> String {
        format!("{:0>48}", self.digits())
    }

    fn digits(&self) -> &str {
        let trimmed = self.0.trim_start_matches('0');
        if trimmed.is_empty() {
            "0"
        } else {
            trimmed
        }
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.digits(), other.digits());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a record came from; used in dead letters and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Origin {
    /// A Lambda DynamoDB Streams event.
    Lambda {
        /// The `eventSourceARN` of the record (the stream ARN).
        event_source_arn: Option<String>,
    },
    /// A record read with the DynamoDB Streams API.
    Stream {
        /// The shard the record was read from.
        shard_id: String,
    },
    /// A record of Kinesis Data Streams for DynamoDB (the Lambda's Kinesis
    /// events, `run --kinesis-stream`). Its sequence number is the Kinesis
    /// record's: it orders nothing of one item.
    Kinesis {
        /// The Kinesis stream's ARN, when known.
        stream_arn: Option<String>,
        /// The shard it was read from, when known.
        shard_id: Option<String>,
        /// The table whose change it is (`tableName`).
        table_name: String,
    },
    /// An item read by a table scan (backfill, audit).
    Scan {
        /// The scan segment that read it.
        segment: u32,
    },
    /// Built by hand (tests, the library API).
    Synthetic,
}

/// One change to one item: the unit the planner and the applier work on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// The stream's `eventID` (for scans: `scan:<segment>:<n>`).
    pub event_id: String,
    /// Insert, modify or remove.
    pub kind: ChangeKind,
    /// The table key attributes of the changed item.
    pub keys: Image,
    /// The item before the change, when the stream carries it.
    pub old_image: Option<Image>,
    /// The item after the change, when the stream carries it.
    pub new_image: Option<Image>,
    /// Orders the records of one item.
    pub sequence_number: SequenceNumber,
    /// When the change was made, in milliseconds since the Unix epoch.
    pub approximate_creation_ms: Option<i64>,
    /// Whether DynamoDB's TTL process deleted the item.
    pub ttl_expiry: bool,
    /// The stream view type, when the source says it.
    pub view_type: Option<ViewType>,
    /// The size of the stream record, when the source says it.
    pub size_bytes: Option<i64>,
    /// Where the record came from.
    pub origin: Origin,
}

impl ChangeRecord {
    /// The image that describes the item now (`None` after a remove).
    pub fn current_image(&self) -> Option<&Image> {
        match self.kind {
            ChangeKind::Remove => None,
            _ => self.new_image.as_ref(),
        }
    }

    /// The record as its item: an `INSERT` of its new image (a `REMOVE`
    /// stays one), for planning the item whatever the record changed
    /// (`crate::plan::plan_complete`).
    pub fn as_item(&self) -> ChangeRecord {
        let mut item = self.clone();
        if item.kind != ChangeKind::Remove && item.new_image.is_some() {
            item.kind = ChangeKind::Insert;
            item.old_image = None;
        }
        item
    }

    /// A string key attribute of the record, if present.
    pub fn key_string(&self, name: &str) -> Option<&str> {
        self.keys.get(name).and_then(ValueRef::as_str)
    }
}

/// The key of an item in a table whose key attributes are strings.
///
/// Derived items always have string keys (they are rendered from
/// templates); the attribute names come from the spec's table section.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemKey {
    /// The partition key value.
    pub pk: String,
    /// The sort key value, for tables with a sort key.
    pub sk: Option<String>,
}

impl ItemKey {
    /// A key with a partition and a sort key.
    pub fn new(pk: impl Into<String>, sk: impl Into<String>) -> ItemKey {
        ItemKey {
            pk: pk.into(),
            sk: Some(sk.into()),
        }
    }
}

impl fmt::Display for ItemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.sk {
            Some(sk) => write!(f, "{} / {}", self.pk, sk),
            None => f.write_str(&self.pk),
        }
    }
}

/// Converts an attribute value to plain JSON for people to read
/// (`{"S": "x"}` becomes `"x"`, numbers become JSON numbers when exact).
pub fn value_to_json(value: &AttributeValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AttributeValue::S(s) => Value::String(s.clone()),
        AttributeValue::N(n) => number_to_json(n),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::B(bytes) => serde_json::json!({ "B": bytes.len().to_string() + " bytes" }),
        AttributeValue::M(map) => Value::Object(
            sorted(map.iter())
                .map(|(k, v)| (k.clone(), value_to_json(v)))
                .collect(),
        ),
        AttributeValue::L(list) => Value::Array(list.iter().map(value_to_json).collect()),
        AttributeValue::Ss(set) => serde_json::json!({ "SS": set }),
        AttributeValue::Ns(set) => serde_json::json!({ "NS": set }),
        AttributeValue::Bs(set) => serde_json::json!({ "BS": set.len() }),
    }
}

fn number_to_json(n: &str) -> serde_json::Value {
    if let Ok(int) = n.parse::<i64>() {
        return serde_json::Value::from(int);
    }
    match n.parse::<f64>() {
        Ok(float) if float.is_finite() && float.to_string() == n => serde_json::Value::from(float),
        _ => serde_json::json!({ "N": n }),
    }
}

/// Converts an item to plain JSON with sorted keys.
pub fn item_to_json(item: &Item) -> serde_json::Value {
    serde_json::Value::Object(
        sorted(item.iter())
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn sorted<'a, V: 'a>(
    entries: impl Iterator<Item = (&'a String, &'a V)>,
) -> impl Iterator<Item = (&'a String, &'a V)> {
    let mut entries: Vec<_> = entries.collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        let small = SequenceNumber("999".into());
        let large = SequenceNumber("1000".into());
        assert!(small < large);
        assert!(SequenceNumber("0042".into()) == SequenceNumber("0042".into()));
        // Equal exactly when the order says so (BTreeMap, sort, dedup rely on it).
        assert_eq!(SequenceNumber("0042".into()), SequenceNumber("42".into()));
        assert_eq!(SequenceNumber("000".into()), SequenceNumber("0".into()));
        assert_ne!(SequenceNumber("42".into()), SequenceNumber("420".into()));
        let set: std::collections::HashSet<_> =
            [SequenceNumber("0042".into()), SequenceNumber("42".into())].into();
        assert_eq!(set.len(), 1);
        assert_eq!(
            SequenceNumber("0042".into()).cmp(&SequenceNumber("42".into())),
            Ordering::Equal
        );
        let a = SequenceNumber("111100000000000000000000000000000001".into());
        let b = SequenceNumber("111100000000000000000000000000000002".into());
        assert!(a < b);
    }

    #[test]
    fn values_render_as_plain_json() {
        let mut item = Item::default();
        item.insert("n".into(), AttributeValue::N("850".into()));
        item.insert("f".into(), AttributeValue::N("1.5".into()));
        item.insert("big".into(), AttributeValue::N("1e400".into()));
        item.insert("s".into(), AttributeValue::S("x".into()));
        assert_eq!(
            item_to_json(&item).to_string(),
            r#"{"big":{"N":"1e400"},"f":1.5,"n":850,"s":"x"}"#
        );
    }
}
