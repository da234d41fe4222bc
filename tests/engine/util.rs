//! Small helpers shared by the engine tests: shipped specs, change records
//! from compact JSON, and plans rendered as text for snapshots.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use ddb_projector::plan::{describe_error, plan_record, Selection};
use ddb_projector::record::{
    AttributeValue, ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType,
};
use ddb_projector::spec::Spec;
use serde_json::Value;

/// A path inside the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn load(name: &str) -> Spec {
    let path = repo_path(&format!("projections/{name}.toml"));
    Spec::from_file(&path).unwrap_or_else(|errors| panic!("{name} does not compile:\n{errors}"))
}

static USER_SERVICE: LazyLock<Spec> = LazyLock::new(|| load("user-service"));
static SOCIAL_SERVICE: LazyLock<Spec> = LazyLock::new(|| load("social-service"));
static ADS_PLATFORM: LazyLock<Spec> = LazyLock::new(|| load("ads-platform"));

/// The shipped `projections/user-service.toml`.
pub fn user_service() -> &'static Spec {
    &USER_SERVICE
}

/// The shipped `projections/social-service.toml`.
pub fn social_service() -> &'static Spec {
    &SOCIAL_SERVICE
}

/// The shipped `projections/ads-platform.toml`.
pub fn ads_platform() -> &'static Spec {
    &ADS_PLATFORM
}

/// Compiles an inline spec, panicking with every problem if it is invalid.
pub fn inline_spec(text: &str) -> Spec {
    Spec::from_toml(text, "inline.toml").unwrap_or_else(|errors| panic!("{errors}"))
}

/// Converts plain JSON to an attribute value: strings are `S`, numbers
/// `N`, booleans `BOOL`, objects `M`, arrays `L` and `null` is `NULL`.
pub fn value(json: &Value) -> AttributeValue {
    match json {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Number(n) => AttributeValue::N(n.to_string()),
        Value::String(s) => AttributeValue::S(s.clone()),
        Value::Array(list) => AttributeValue::L(list.iter().map(value).collect()),
        Value::Object(map) => {
            AttributeValue::M(map.iter().map(|(k, v)| (k.clone(), value(v))).collect())
        }
    }
}

/// Converts a plain JSON object to an item.
pub fn item(json: &Value) -> Item {
    let Value::Object(map) = json else {
        panic!("an item is a JSON object, not {json}");
    };
    let mut item = Item::default();
    for (name, v) in map {
        item.insert(name.clone(), value(v));
    }
    item
}

/// Builds a change record from a compact description:
///
/// ```text
/// { "kind": "MODIFY", "pk": "USER#u", "sk": "EMAIL#e1",
///   "old": { ... }, "new": { ... },
///   "view": "KEYS_ONLY", "ttl": true, "keys": { "PK": 7 } }
/// ```
///
/// The key attributes are part of every image, as in a real stream. An
/// insert or modify always has a new image and a modify or remove an old
/// one; `view` (default `NEW_AND_OLD_IMAGES`) then drops what the stream
/// would not carry. `keys` replaces the `PK`/`SK` pair (odd key types).
pub fn record(desc: Value) -> ChangeRecord {
    let kind = ChangeKind::from_event_name(desc["kind"].as_str().expect("kind"))
        .expect("kind is INSERT, MODIFY or REMOVE");
    let keys = match desc.get("keys") {
        Some(keys) => item(keys),
        None => {
            let mut keys = Item::default();
            keys.insert(
                "PK".to_string(),
                AttributeValue::S(desc["pk"].as_str().expect("pk").to_string()),
            );
            if let Some(sk) = desc.get("sk") {
                keys.insert(
                    "SK".to_string(),
                    AttributeValue::S(sk.as_str().expect("sk is a string").to_string()),
                );
            }
            keys
        }
    };
    let image = |name: &str| {
        let mut image = keys.clone();
        if let Some(attributes) = desc.get(name) {
            for (k, v) in item(attributes).iter() {
                image.insert(k.clone(), v.clone());
            }
        }
        image
    };
    let view = desc
        .get("view")
        .map(|v| ViewType::from_name(v.as_str().expect("view")).expect("a view type"))
        .unwrap_or(ViewType::NewAndOldImages);
    let new_image = (kind != ChangeKind::Remove && view.has_new_image()).then(|| image("new"));
    let old_image = (kind != ChangeKind::Insert && view.has_old_image()).then(|| image("old"));
    ChangeRecord {
        event_id: "event-1".to_string(),
        kind,
        keys: keys.into(),
        old_image: old_image.map(Image::from),
        new_image: new_image.map(Image::from),
        sequence_number: SequenceNumber("100".to_string()),
        approximate_creation_ms: Some(1_700_000_000_000),
        ttl_expiry: desc.get("ttl").and_then(Value::as_bool).unwrap_or(false),
        view_type: Some(view),
        size_bytes: None,
        origin: Origin::Synthetic,
    }
}

/// Plans a record and renders the result one line each: an effect as its
/// `plan` JSON, an error as `error: ...`, a skip as `skip: ...`.
pub fn render_plan(spec: &Spec, record: &ChangeRecord, selection: Selection<'_>) -> String {
    let plan = plan_record(spec, record, selection);
    let mut out = String::new();
    for effect in &plan.effects {
        out.push_str(&effect.to_json(spec).to_string());
        out.push('\n');
    }
    for error in &plan.errors {
        out.push_str(&format!("error: {}\n", describe_error(spec, error)));
    }
    if let Some(skip) = &plan.skip {
        out.push_str(&format!("skip: {skip:?}: {skip}\n"));
    }
    out
}
