//! The filters applied the way Lambda applies them, to the captured
//! fixtures and to a synthetic record of every entity and derived item.

use serde_json::{json, Value};

use super::*;
use crate::record::ItemKey;

/// The subset of Lambda's filter rules the patterns use: objects descend,
/// arrays are alternatives (OR) of exact strings and `{"prefix": ...}`,
/// and every field of a pattern must match (AND).
fn matches(pattern: &Value, record: &Value) -> bool {
    let Value::Object(fields) = pattern else {
        panic!("a pattern is an object: {pattern}")
    };
    fields.iter().all(|(name, rule)| {
        let Some(value) = record.get(name) else {
            return false;
        };
        match rule {
            Value::Object(_) => value.is_object() && matches(rule, value),
            Value::Array(alternatives) => alternatives.iter().any(|alt| match alt {
                Value::String(text) => value.as_str() == Some(text.as_str()),
                Value::Object(op) if op.len() == 1 && op.contains_key("prefix") => value
                    .as_str()
                    .zip(op["prefix"].as_str())
                    .is_some_and(|(v, p)| v.starts_with(p)),
                other => panic!("filter rule this test does not implement: {other}"),
            }),
            other => panic!("a rule is an object or an array: {other}"),
        }
    })
}

/// Whether Lambda would deliver the record (no filters: every record).
fn passes(criteria: &FilterCriteria, record: &Value) -> bool {
    criteria.patterns.is_empty()
        || criteria.patterns.iter().any(|text| {
            let pattern: Value = serde_json::from_str(text).expect("a pattern is JSON");
            matches(&pattern, record)
        })
}

/// A stream record as Lambda delivers it, for a key.
fn record(spec: &Spec, key: &ItemKey) -> Value {
    let mut keys = serde_json::Map::new();
    keys.insert(spec.table.partition_key.clone(), json!({ "S": key.pk }));
    if let (Some(name), Some(sk)) = (&spec.table.sort_key, &key.sk) {
        keys.insert(name.clone(), json!({ "S": sk }));
    }
    json!({
        "eventID": "1",
        "eventName": "MODIFY",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1795326360,
            "Keys": keys,
            "NewImage": keys,
            "SequenceNumber": "000000000000000000001",
            "SizeBytes": 40,
            "StreamViewType": "NEW_AND_OLD_IMAGES"
        },
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/T/stream/2026-01-01T00:00:00.000"
    })
}

fn shipped(name: &str) -> Spec {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("projections")
        .join(name);
    Spec::from_file(&path).expect("shipped spec compiles")
}

fn fixture(name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let event: Value = serde_json::from_slice(&std::fs::read(path).expect("fixture")).unwrap();
    event["Records"].as_array().expect("Records").clone()
}

/// A key of every entity (with variable values that look like keys too),
/// and whether some projection uses it.
fn entity_keys(spec: &Spec) -> Vec<(String, ItemKey, bool)> {
    let mut out = Vec::new();
    for (id, entity) in spec.entities.iter().enumerate() {
        for value in ["x1", "USER#9", "_ddbp#x"] {
            let bindings: Vec<(&str, &str)> = entity.vars().map(|v| (v, value)).collect();
            let key = entity.render_key(&bindings).expect("all variables bound");
            out.push((entity.name.clone(), key, !spec.interested(id).is_empty()));
        }
    }
    out
}

/// Keys of the items the projector itself writes that are not entities.
fn derived_keys(spec: &Spec) -> Vec<ItemKey> {
    let sk = |text: &str| spec.table.sort_key.as_ref().map(|_| text.to_string());
    let mut out = vec![
        ItemKey {
            pk: format!("{RESERVED_PREFIX}dlq"),
            sk: sk("USER#u1\u{1}EMAIL#e1\u{1}0000000000000000000000000000000000000001\u{1}p"),
        },
        ItemKey {
            pk: format!("{RESERVED_PREFIX}holds"),
            sk: sk("HOLDS"),
        },
        ItemKey {
            pk: format!("{RESERVED_PREFIX}checkpoint"),
            sk: sk("arn:aws:dynamodb:us-east-1:1:table/T/stream/L#shardId-1"),
        },
    ];
    for (id, entity) in spec.entities.iter().enumerate() {
        let bindings: Vec<(&str, &str)> = entity.vars().map(|v| (v, "x1")).collect();
        let source = entity.render_key(&bindings).expect("all variables bound");
        for (_, _, counter) in spec.counters().filter(|(_, _, c)| c.source == id) {
            out.push(spec.counter_marker_key(&counter.storage, &source));
            for shard in 0..counter.shards {
                out.push(spec.counter_shard_key(&counter.storage, &["x1".to_string()], shard));
            }
        }
    }
    out
}

/// Every interested entity's records pass, no other entity's, and none of
/// the projector's own items.
fn check_exact(spec: &Spec, criteria: &FilterCriteria) {
    assert!(criteria.exact, "{criteria:?}");
    for (entity, key, interested) in entity_keys(spec) {
        assert_eq!(
            passes(criteria, &record(spec, &key)),
            interested,
            "entity `{entity}` key {key}"
        );
    }
    check_derived_never_pass(spec, criteria);
}

fn check_derived_never_pass(spec: &Spec, criteria: &FilterCriteria) {
    for key in derived_keys(spec) {
        assert!(!passes(criteria, &record(spec, &key)), "derived item {key}");
    }
}

fn check_limits(criteria: &FilterCriteria) {
    assert!(criteria.patterns.len() <= MAX_FILTERS, "{criteria:?}");
    for pattern in &criteria.patterns {
        assert!(pattern.chars().count() <= MAX_PATTERN_CHARS, "{pattern}");
    }
}

#[test]
fn user_service_lets_through_emails_and_profiles_only() {
    let spec = shipped("user-service.toml");
    let criteria = filter_criteria(&spec);
    assert_eq!(
        criteria.patterns,
        [
            r#"{"dynamodb":{"Keys":{"PK":{"S":[{"prefix":"USER#"}]},"SK":{"S":["PROFILE",{"prefix":"EMAIL#"}]}}}}"#
        ]
    );
    check_limits(&criteria);
    check_exact(&spec, &criteria);
    // The captured history is all emails and a profile: every record passes.
    for name in [
        "lambda-event.json",
        "lambda-event-ttl.json",
        "streams-get-records.json",
    ] {
        for record in fixture(name) {
            assert!(passes(&criteria, &record), "{name}: {record}");
        }
    }
    assert!(criteria
        .notes
        .iter()
        .any(|n| n.contains("target `profile` pass")));
}

#[test]
fn social_service_lets_through_follows_achievements_and_profiles_only() {
    let spec = shipped("social-service.toml");
    let criteria = filter_criteria(&spec);
    assert_eq!(
        criteria.patterns,
        [
            r#"{"dynamodb":{"Keys":{"PK":{"S":[{"prefix":"USER#"}]},"SK":{"S":["PROFILE",{"prefix":"ACHIEVEMENT#"},{"prefix":"FOLLOWS#"}]}}}}"#
        ]
    );
    check_limits(&criteria);
    check_exact(&spec, &criteria);
    // The reverse edges it writes (`followed_by`) never come back.
    let reverse = ItemKey::new("USER#b", "FOLLOWED_BY#a");
    assert!(!passes(&criteria, &record(&spec, &reverse)));
    // Of the user service's records, only a profile's pass: the same key
    // is the followers' totals' target here.
    for record in fixture("lambda-event.json") {
        let profile = record["dynamodb"]["Keys"]["SK"]["S"] == "PROFILE";
        assert_eq!(passes(&criteria, &record), profile, "{record}");
    }
}

#[test]
fn ads_platform_lets_through_campaign_metadata_and_performance_only() {
    let spec = shipped("ads-platform.toml");
    let criteria = filter_criteria(&spec);
    assert_eq!(
        criteria.patterns,
        [
            r#"{"dynamodb":{"Keys":{"PK":{"S":[{"prefix":"CAMPAIGN#"}]},"SK":{"S":["METADATA",{"prefix":"PERF#"}]}}}}"#
        ]
    );
    check_limits(&criteria);
    check_exact(&spec, &criteria);
    let ad_group = ItemKey::new("CAMPAIGN#c1", "ADGROUP#g1");
    assert!(!passes(&criteria, &record(&spec, &ad_group)));
    for record in fixture("lambda-event.json") {
        assert!(!passes(&criteria, &record), "{record}");
    }
}

#[test]
fn the_json_is_what_lambda_takes() {
    let spec = shipped("ads-platform.toml");
    let json = filter_criteria(&spec).to_json();
    assert_eq!(
        json,
        json!({ "Filters": [{ "Pattern": r#"{"dynamodb":{"Keys":{"PK":{"S":[{"prefix":"CAMPAIGN#"}]},"SK":{"S":["METADATA",{"prefix":"PERF#"}]}}}}"# }] })
    );
}

/// A spec with `n` entities, each with its own prefixes and a projection.
fn many_entities(n: usize, prefix_len: usize) -> Spec {
    let mut text = String::from(
        "service = \"s\"\n[table]\nname = \"t\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n",
    );
    let pad = "P".repeat(prefix_len);
    for i in 0..n {
        text.push_str(&format!(
            "[entities.e{i}]\npk = \"T{i}{pad}#{{id}}\"\nsk = \"S{i}#{{x}}\"\n"
        ));
    }
    // Every third entity is left alone by the projections.
    for i in (0..n).filter(|i| i % 3 != 2) {
        text.push_str(&format!(
            "[[projections]]\nname = \"p{i}\"\nkind = \"index-keys\"\nentity = \"e{i}\"\nset = {{ A{i} = \"{{id}}\" }}\n"
        ));
    }
    Spec::from_toml(&text, "many.toml").expect("the synthetic spec compiles")
}

#[test]
fn many_entities_are_merged_into_five_patterns_that_lose_no_record() {
    let spec = many_entities(30, 0);
    let criteria = filter_criteria(&spec);
    check_limits(&criteria);
    assert_eq!(criteria.patterns.len(), MAX_FILTERS);
    assert!(!criteria.exact);
    assert!(criteria.notes.iter().any(|n| n.contains("merged")));
    for (entity, key, interested) in entity_keys(&spec) {
        if interested {
            assert!(passes(&criteria, &record(&spec, &key)), "{entity} {key}");
        }
    }
    check_derived_never_pass(&spec, &criteria);
}

#[test]
fn long_prefixes_are_split_to_fit_the_pattern_size() {
    let spec = many_entities(9, 600);
    let criteria = filter_criteria(&spec);
    check_limits(&criteria);
    assert!(criteria.patterns.len() > 1);
    for (entity, key, interested) in entity_keys(&spec) {
        if interested {
            assert!(passes(&criteria, &record(&spec, &key)), "{entity} {key}");
        }
    }
    check_derived_never_pass(&spec, &criteria);
}

#[test]
fn a_partition_key_starting_with_a_variable_lets_everything_through() {
    let text = r#"
service = "s"
[table]
name = "t"
[entities.thing]
pk = "{tenant}#THING#{id}"
sk = "META"
[[projections]]
name = "k"
kind = "index-keys"
entity = "thing"
set = { A = "{id}" }
"#;
    let spec = Spec::from_toml(text, "var.toml").unwrap();
    let criteria = filter_criteria(&spec);
    assert!(criteria.patterns.is_empty());
    assert_eq!(criteria.to_json(), json!({ "Filters": [] }));
    assert!(
        criteria.notes[0].contains("`{tenant}#THING#{id}`")
            && criteria.notes[0].contains("starts with a variable"),
        "{:?}",
        criteria.notes
    );
}

#[test]
fn a_sort_key_starting_with_a_variable_matches_any_sort_key() {
    let text = r#"
service = "s"
[table]
name = "t"
[entities.thing]
pk = "THING#{id}"
sk = "{version}"
[entities.other]
pk = "OTHER#{id}"
sk = "META"
[[projections]]
name = "k"
kind = "index-keys"
entity = "thing"
set = { A = "{id}" }
"#;
    let spec = Spec::from_toml(text, "sk.toml").unwrap();
    let criteria = filter_criteria(&spec);
    assert_eq!(
        criteria.patterns,
        [r#"{"dynamodb":{"Keys":{"PK":{"S":[{"prefix":"THING#"}]}}}}"#]
    );
    check_exact(&spec, &criteria);
}

#[test]
fn a_prefix_that_reaches_into_the_reserved_prefix_is_noted() {
    let text = r#"
service = "s"
[table]
name = "t"
[entities.thing]
pk = "_{id}"
sk = "META"
[[projections]]
name = "k"
kind = "index-keys"
entity = "thing"
set = { A = "{id}" }
"#;
    let spec = Spec::from_toml(text, "underscore.toml").unwrap();
    let criteria = filter_criteria(&spec);
    assert!(!criteria.exact);
    assert!(
        criteria.notes.iter().any(|n| n.contains("`_`")),
        "{:?}",
        criteria.notes
    );
}
