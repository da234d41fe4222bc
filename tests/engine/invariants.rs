//! Invariants: spec mistakes, and evaluation over items (pure).

use ddb_projector::invariant::{check_partition, check_unique, keep_latest, unique_value};
use ddb_projector::record::{AttributeValue, ItemKey};
use ddb_projector::spec::Spec;
use expect_test::{expect, Expect};
use serde_json::json;

use super::util::{inline_spec, item, user_service};

const BASE: &str = r#"
service = "user-service"

[table]
name = "UserServiceTable"

[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"

[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"

[[projections]]
name = "email-gsi1-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{lower(trim(email))}", GSI1SK = "USER#{userId}" }
"#;

fn check_with(more: &str, expect: Expect) {
    let text = format!("{BASE}\n{more}");
    let out = match Spec::from_toml(&text, "spec.toml") {
        Ok(spec) => format!("ok\n{}", spec.summary()),
        Err(errors) => format!("{errors}\n"),
    };
    expect.assert_eq(&out);
}

#[test]
fn every_invariant_mistake_is_named_with_its_fix() {
    check_with(
        r#"
[[invariants]]
name = "one-primary"
kind = "exactly-one"
entity = "emial"
when = { isPrimary = true }

[[invariants]]
name = "no-condition"
kind = "at-most-one"
entity = "email"
when = {}

[[invariants]]
name = "bad-policy"
kind = "exactly-one"
entity = "email"
when = { isPrimary = true }
repair = "keep-latset"

[[invariants]]
name = "half-implies"
kind = "implies"
entity = "email"
if = { isPrimary = true }
then = {}

[[invariants]]
name = "unknown-index"
kind = "unique"
entity = "email"
index = "GSI2"

[[invariants]]
name = "not-derived"
kind = "unique"
entity = "profile"
index = "GSI1"

[[invariants]]
name = "email-gsi1-keys"
kind = "unique"
entity = "email"
index = "GSI1"
"#,
        expect![[r#"
            spec.toml: invariant `one-primary`: unknown entity `emial` (did you mean `email`?)
            spec.toml: invariant `no-condition`: `when` is empty: name the condition that at most one item per partition may satisfy (`when = { isPrimary = true }`)
            spec.toml: invariant `bad-policy`: unknown repair policy `keep-latset` (did you mean `keep-latest`?)
            spec.toml: invariant `half-implies`: `if` and `then` must each name at least one attribute (`if = { isPrimary = true }`, `then = { isVerified = true }`)
            spec.toml: invariant `unknown-index`: unknown index `GSI2` (did you mean `GSI1`?)
            spec.toml: invariant `not-derived`: no index-keys projection of entity `profile` derives `GSI1PK`, the partition key of GSI1; uniqueness is checked through that derived key
            spec.toml: invariant `email-gsi1-keys`: duplicate name; invariant and projection names must be unique in a spec
            (7 problems)
        "#]],
    );
}

#[test]
fn an_unknown_invariant_kind_or_field_is_a_parse_error_naming_the_line() {
    let text = format!(
        "{BASE}\n[[invariants]]\nname = \"x\"\nkind = \"exactly-two\"\nentity = \"email\"\nwhen = {{ isPrimary = true }}\n"
    );
    let errors = Spec::from_toml(&text, "spec.toml").unwrap_err().to_string();
    assert!(
        errors.starts_with("spec.toml: invalid spec TOML"),
        "{errors}"
    );
    assert!(errors.contains("exactly-two"), "{errors}");
    let text = format!(
        "{BASE}\n[[invariants]]\nname = \"x\"\nkind = \"implies\"\nentity = \"email\"\nif = {{ a = 1 }}\nthen = {{ b = 1 }}\nwhen = {{ c = 1 }}\n"
    );
    let errors = Spec::from_toml(&text, "spec.toml").unwrap_err().to_string();
    assert!(errors.contains("unknown field `when`"), "{errors}");
}

#[test]
fn the_shipped_user_spec_declares_the_seed_rules() {
    let spec = user_service();
    let kinds: Vec<(&str, &str)> = spec
        .invariants
        .iter()
        .map(|i| (i.name.as_str(), i.kind_name()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("one-primary-email", "exactly-one"),
            ("primary-email-verified", "implies"),
            ("unique-email-address", "unique"),
        ]
    );
}

fn email(
    user: &str,
    id: &str,
    address: &str,
    primary: bool,
    verified: bool,
) -> ddb_projector::record::Item {
    item(&json!({
        "PK": format!("USER#{user}"), "SK": format!("EMAIL#{id}"),
        "email": address, "isPrimary": primary, "isVerified": verified,
    }))
}

fn profile(user: &str) -> ddb_projector::record::Item {
    item(&json!({ "PK": format!("USER#{user}"), "SK": "PROFILE", "email": "x" }))
}

fn key(pk: &str, sk: &str) -> ItemKey {
    ItemKey {
        pk: pk.to_string(),
        sk: Some(sk.to_string()),
    }
}

#[test]
fn exactly_one_counts_only_the_entity_and_only_partitions_that_have_it() {
    let spec = user_service();
    let one = &spec.invariants[0];
    // A profile alone: no email, nothing required.
    assert!(check_partition(spec, one, "USER#u", &[profile("u")]).is_empty());
    // One primary among several: fine.
    let fine = [
        profile("u"),
        email("u", "e1", "a@x", true, true),
        email("u", "e2", "b@x", false, true),
    ];
    assert!(check_partition(spec, one, "USER#u", &fine).is_empty());
    // None primary.
    let none = [
        email("u", "e1", "a@x", false, true),
        email("u", "e2", "b@x", false, true),
    ];
    let found = check_partition(spec, one, "USER#u", &none);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].message,
        "none of the 2 `email` items in USER#u has isPrimary = true"
    );
    assert_eq!(found[0].record_sk(), "USER#u|");
    // Two primaries name both.
    let two = [
        email("u", "e1", "a@x", true, true),
        email("u", "e2", "b@x", true, true),
    ];
    let found = check_partition(spec, one, "USER#u", &two);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].keys,
        [key("USER#u", "EMAIL#e1"), key("USER#u", "EMAIL#e2")]
    );
    assert_eq!(
        found[0].message,
        "2 `email` items in USER#u have isPrimary = true; exactly one is allowed"
    );
}

#[test]
fn at_most_one_allows_none() {
    let spec = inline_spec(&format!(
        "{BASE}\n[[invariants]]\nname = \"m\"\nkind = \"at-most-one\"\nentity = \"email\"\nwhen = {{ isPrimary = true }}\n"
    ));
    let m = &spec.invariants[0];
    let none = [email("u", "e1", "a@x", false, true)];
    assert!(check_partition(&spec, m, "USER#u", &none).is_empty());
    let two = [
        email("u", "e1", "a@x", true, true),
        email("u", "e2", "b@x", true, true),
    ];
    assert_eq!(check_partition(&spec, m, "USER#u", &two).len(), 1);
}

#[test]
fn implies_reports_each_offending_item_under_its_own_key() {
    let spec = user_service();
    let verified = &spec.invariants[1];
    let items = [
        email("u", "e1", "a@x", true, false),
        email("u", "e2", "b@x", false, false),
        email("u", "e3", "c@x", true, true),
    ];
    let found = check_partition(spec, verified, "USER#u", &items);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].record_sk(), "USER#u|EMAIL#e1");
    assert_eq!(
        found[0].message,
        "`email` USER#u / EMAIL#e1 has isPrimary = true but not isVerified = true"
    );
    // A number given where a boolean is expected does not satisfy it.
    let wrong_type = [item(&json!({
        "PK": "USER#u", "SK": "EMAIL#e9", "email": "z@x", "isPrimary": true, "isVerified": "true",
    }))];
    assert_eq!(
        check_partition(spec, verified, "USER#u", &wrong_type).len(),
        1
    );
}

#[test]
fn unique_values_are_normalized_like_the_gsi_key_and_need_two_owners() {
    let spec = user_service();
    let unique = &spec.invariants[2];
    assert_eq!(
        unique_value(spec, unique, &email("u", "e1", "  Sam@X.org ", true, true)).as_deref(),
        Some("EMAIL#sam@x.org")
    );
    assert_eq!(unique_value(spec, unique, &profile("u")), None);
    // Two items of one owner are not a violation of "one user only".
    let same_owner = [key("USER#u", "EMAIL#e1"), key("USER#u", "EMAIL#e2")];
    assert!(check_unique(unique, "EMAIL#sam@x.org", &same_owner).is_none());
    let two = [key("USER#v", "EMAIL#e7"), key("USER#u", "EMAIL#e1")];
    let found = check_unique(unique, "EMAIL#sam@x.org", &two).expect("a violation");
    assert_eq!(
        found.message,
        "EMAIL#sam@x.org belongs to 2 owners: USER#u, USER#v"
    );
    assert_eq!(found.record_sk(), "EMAIL#sam@x.org|");
}

#[test]
fn keep_latest_clears_every_other_item_on_condition() {
    let spec = inline_spec(&format!(
        "{BASE}\n[[invariants]]\nname = \"one\"\nkind = \"exactly-one\"\nentity = \"email\"\nwhen = {{ isPrimary = true }}\nrepair = \"keep-latest\"\n"
    ));
    let one = &spec.invariants[0];
    let all = [
        key("USER#u", "EMAIL#e1"),
        key("USER#u", "EMAIL#e2"),
        key("USER#u", "EMAIL#e3"),
    ];
    let writes = keep_latest(one, &all, &all[1]);
    assert_eq!(writes.len(), 2);
    assert!(writes.iter().all(|w| w.key != all[1]));
    assert!(writes
        .iter()
        .all(|w| w.attribute == "isPrimary" && w.value == Some(AttributeValue::Bool(false))));
    // Without a declared policy nothing is ever written.
    assert!(keep_latest(&user_service().invariants[0], &all, &all[1]).is_empty());
}
